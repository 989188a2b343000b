/* test_dry_run.c: loom's dry run (loom_mem_set_dry_run) on a training step: the same
 * allocations, in the same sizes, as a real step (the compute pool's peak and live bytes
 * equal), and no kernel run (outputs stay zero though the inputs are not). */
#include "lt.h"

#include <loom/loom.h>
#include <string.h>

/* A step of a two-layer MLP (x [64, 256] -> 512 -> 10 under autocast dt), sum of the output as
 * the loss, backward, and an Adam step; the compute pool's peak over it, and the output's first
 * value in *first. The weights are made before the dry run starts when `w` is given. */
static size_t step_peak(loom_tensor *const w[2], loom_dtype dt, float *first) {
  loom_pool_stats s0, s1;
  loom_mem_stats(LOOM_POOL_COMPUTE, &s0);
  loom_mem_reset_peak(LOOM_POOL_COMPUTE);
  int64_t xs[2] = {64, 256};
  loom_tensor *x = NULL, *h = NULL, *a = NULL, *y = NULL, *loss = NULL;
  LT_OK(loom_tensor_empty(LOOM_F32, 2, xs, &x));
  LT_OK(loom_tensor_fill(x, 0.5));
  loom_autocast_token tok;
  LT_OK(loom_autocast_enter(dt == LOOM_F32 ? LOOM_AUTOCAST_OFF
                            : dt == LOOM_BF16 ? LOOM_AUTOCAST_BF16 : LOOM_AUTOCAST_F16,
                            NULL, &tok));
  LT_OK(loom_matmul(x, w[0], &h));
  LT_OK(loom_relu(h, &a));
  LT_OK(loom_matmul(a, w[1], &y));
  LT_OK(loom_sum(y, NULL, 0, false, &loss));
  LT_OK(loom_autocast_exit(&tok));
  float out[640] = {0};
  loom_tensor *y32 = NULL;
  LT_OK(loom_tensor_cast(y, LOOM_F32, &y32));
  LT_OK(loom_tensor_read(y32, LOOM_F32, out, sizeof out));
  *first = out[0];
  LT_OK(loom_backward(loss, NULL, false));
  loom_param_seg seg[2];
  for (int i = 0; i < 2; i++)
    seg[i] = (loom_param_seg){i ? "w1" : "w0", loom_tensor_data(w[i]),
                              loom_tensor_data(loom_tensor_grad(w[i])),
                              loom_tensor_numel(w[i]), 0};
  loom_adam_cfg c = loom_adam_cfg_default();
  loom_optim *opt = NULL;
  LT_OK(loom_optim_create_adam(seg, 2, &c, &opt));
  LT_OK(loom_optim_step(opt));
  loom_mem_stats(LOOM_POOL_COMPUTE, &s1);
  loom_optim_free(opt);
  loom_tensor *all[] = {x, h, a, y, y32, loss};
  for (int i = 0; i < 6; i++) loom_tensor_free(all[i]);
  return s1.peak_bytes - s0.current_bytes;
}

static void make_weights(loom_tensor *w[2]) {
  int64_t s0[2] = {256, 512}, s1[2] = {512, 10};
  LT_OK(loom_tensor_empty(LOOM_F32, 2, s0, &w[0]));
  LT_OK(loom_tensor_empty(LOOM_F32, 2, s1, &w[1]));
  for (int i = 0; i < 2; i++) {
    LT_OK(loom_tensor_fill(w[i], 0.25));
    LT_OK(loom_tensor_set_requires_grad(w[i], true));
  }
}

LT_TEST(a_dry_step_allocates_what_a_real_step_does_and_computes_nothing) {
  const loom_dtype dts[] = {LOOM_F32, LOOM_BF16, LOOM_F16};
  for (int d = 0; d < 3; d++) {
    loom_tensor *w[2];
    float real_first = 0, dry_first = -1;
    make_weights(w);
    size_t real = step_peak(w, dts[d], &real_first);
    for (int i = 0; i < 2; i++) loom_tensor_free(w[i]);
    make_weights(w); /* real weights of 0.25, a dry step over them */
    loom_mem_set_dry_run(true);
    size_t dry = step_peak(w, dts[d], &dry_first);
    loom_mem_set_dry_run(false);
    for (int i = 0; i < 2; i++) loom_tensor_free(w[i]);
    LT_TRUE(real > 0);
    LT_EQ(dry, real);
    LT_TRUE(real_first > 1.0f); /* 512 x relu(256 x 0.5 x 0.25) x 0.25 */
    LT_EQ(dry_first, 0.0f);     /* no GEMM ran: the dry block's zeros */
  }
}
