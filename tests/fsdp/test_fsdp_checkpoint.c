/* test_fsdp_checkpoint.c: activation checkpointing (loom_gpt_set_checkpoint: every block) under
 * FSDP (one unit per block, each resharded after forward, so the recomputation runs inside the
 * unit's pre-backward gather) and under DDP, 2 ranks on the threads backend: the weights after
 * several AdamW steps are bit-identical to the same run without checkpointing (f32, FSDP's
 * bf16 mixed precision, DDP under bf16 autocast), and FSDP's gathers show the recomputation. */
#include "lt.h"
#include "lt_gpt.h"
#include "fsdp_model.h"

#include <stdlib.h>
#include <string.h>

enum { STEPS = 3, B = 2, T = 8, RANKS = 2 };

static loom_gpt_cfg gcfg(void) {
  loom_gpt_cfg c = {.vocab = 128, .context = T, .layers = 3, .heads = 2, .dim = 16};
  return c;
}

typedef struct crun {
  bool ckpt, ddp;
  loom_autocast_mode amp;
  loom_fsdp_cfg cfg;
  float *params; /* rank 0's weights at the end */
  uint64_t gathers;
} crun;

static int fsdp_rank(loom_pg *pg, void *arg) {
  crun *r = arg;
  int rank = loom_pg_rank(pg);
  loom_gpt_cfg c = gcfg();
  loom_module *m = NULL;
  loom_fsdp *f = NULL;
  loom_optim *opt = NULL;
  int rc = loom_nn_gpt_create(&c, 1, &m);
  if (!rc) rc = loom_gpt_set_checkpoint(m, r->ckpt);
  if (!rc) rc = fm_wrap(pg, m, &r->cfg, LOOM_POOL_COMPUTE, &f, &opt);
  for (int s = 0; s < STEPS && !rc; s++) {
    bool overflow = false;
    rc = lt_gpt_backward(m, (s * RANKS + rank) * B, B, T, r->amp, 1.0f, NULL);
    if (!rc) rc = loom_fsdp_finish(f);
    if (!rc) rc = loom_fsdp_check_overflow(f, &overflow);
    if (!rc && !overflow) rc = loom_fsdp_optim_step(f, opt, 1.0f);
  }
  if (!rc) rc = fm_full_state_flat(f, r->params);
  loom_fsdp_stats st;
  if (!rc && rank == 0 && !(rc = loom_fsdp_stats_get(f, &st))) r->gathers = st.gathers;
  loom_optim_free(opt);
  loom_fsdp_free(f);
  loom_module_free(m);
  return rc;
}

static int ddp_rank(loom_pg *pg, void *arg) {
  crun *r = arg;
  int rank = loom_pg_rank(pg);
  loom_gpt_cfg c = gcfg();
  loom_module *m = NULL;
  loom_ddp *d = NULL;
  loom_optim *opt = NULL;
  int rc = loom_nn_gpt_create(&c, 1, &m);
  if (!rc) rc = loom_gpt_set_checkpoint(m, r->ckpt);
  if (!rc) rc = fm_ddp_wrap(pg, m, &d, &opt);
  for (int s = 0; s < STEPS && !rc; s++) {
    rc = loom_module_zero_grad(m);
    if (!rc) rc = lt_gpt_backward(m, (s * RANKS + rank) * B, B, T, r->amp, 1.0f, NULL);
    if (!rc) rc = loom_ddp_finish(d);
    if (!rc) rc = loom_optim_step(opt);
  }
  if (!rc && rank == 0) fm_flatten_module(m, r->params);
  loom_optim_free(opt);
  loom_ddp_free(d);
  loom_module_free(m);
  return rc;
}

/* Run r without and with checkpointing; the weights must have the same bits. */
static void compare(crun r, const char *what, uint64_t *gathers) {
  loom_gpt_cfg c = gcfg();
  size_t n = loom_gpt_numel(&c);
  float *w[2];
  for (int ck = 0; ck < 2; ck++) {
    r.ckpt = ck;
    r.params = calloc(n, sizeof(float));
    LT_OK(loom_threads_run(RANKS, NULL, r.ddp ? ddp_rank : fsdp_rank, &r));
    w[ck] = r.params;
    if (gathers) gathers[ck] = r.gathers;
  }
  size_t diff = 0;
  for (size_t i = 0; i < n; i++) diff += memcmp(&w[0][i], &w[1][i], sizeof(float)) != 0;
  if (diff)
    lt_fail_at(__FILE__, __LINE__, "%s: %zu of %zu weights differ with checkpointing", what, diff,
               n);
  loom_module *m0 = NULL; /* training moved the weights: the comparison means something */
  LT_OK(loom_nn_gpt_create(&c, 1, &m0));
  float *init = calloc(n, sizeof(float));
  fm_flatten_module(m0, init);
  LT_TRUE(memcmp(init, w[0], n * sizeof(float)) != 0);
  free(init);
  loom_module_free(m0);
  free(w[0]);
  free(w[1]);
}

LT_TEST(fsdp_checkpoint_gpt_bit_identical_f32_and_bf16_mixed_precision) {
  crun r = {.cfg = loom_fsdp_cfg_default()}; /* one unit per block, resharded after forward */
  uint64_t g[2];
  compare(r, "FSDP f32", g);
  LT_TRUE(g[1] == g[0]); /* the recomputation runs inside the pre-backward gather: no extra */
  r.cfg.mp = loom_fsdp_mp_cfg_for(LOOM_BF16);
  r.amp = LOOM_AUTOCAST_BF16;
  compare(r, "FSDP bf16 mixed precision", NULL);
}

LT_TEST(ddp_checkpoint_gpt_bit_identical_f32_and_bf16_autocast) {
  crun r = {.ddp = true};
  compare(r, "DDP f32", NULL);
  r.amp = LOOM_AUTOCAST_BF16;
  compare(r, "DDP bf16 autocast", NULL);
}
