/* test_attention_qkv.c: loom_sdpa_qkv (attention over packed heads, attention.c) against
 * what it replaces: qkv [B, T, 3C] sliced into q, k, v, each viewed as [B, H, T, D],
 * loom_scaled_dot_product_attention (itself checked by finite differences and against the
 * unfused reference in test_attention.c) and the heads merged back. Bit for bit in f32 (the
 * same kernels in the same order), forward and the gradient of qkv, at every CPU level, causal
 * and not, for shapes below, at and past a key block; bf16 inputs; finite differences on a
 * small case; 16-bit qkv (staged a batch element at a time) bit for bit the split path at every
 * level; the dry run's peak equal to the real run's; bad inputs. */
#include "gradcheck.h"
#include "ops/attn_int.h"
#include "ops/gemm.h"
#include "ops/ops_int.h"

#include <stdlib.h>
#include <string.h>

G1(qkv_causal, loom_sdpa_qkv(in[0], 2, true, out))

/* f32 finite differences (gradcheck's defaults), and bf16 against f32 */
LT_TEST(grad_sdpa_qkv) {
  gc_input a[] = {S(3, 2, 5, 12)}; /* 2 heads of 2 columns */
  gc_run("sdpa_qkv causal", qkv_causal, NULL, 1, a, NULL);
}

static uint64_t seed = 11;

/* The reference: slice, view, transpose, SDPA, transpose back, reshape. */
static int split_path(loom_tensor *qkv, int64_t H, bool causal, loom_tensor **out) {
  int64_t B = loom_tensor_dim(qkv, 0), T = loom_tensor_dim(qkv, 1),
          C = loom_tensor_dim(qkv, 2) / 3, sh[4] = {B, T, H, C / H}, osh[3] = {B, T, C};
  loom_tensor *cols[3] = {0}, *split[3] = {0}, *heads[3] = {0}, *y = NULL, *yt = NULL;
  int rc = LOOM_OK;
  for (int p = 0; p < 3 && !rc; p++) {
    rc = loom_slice(qkv, 2, p * C, (p + 1) * C, 1, &cols[p]);
    if (!rc) rc = loom_reshape(cols[p], 4, sh, &split[p]);
    if (!rc) rc = loom_transpose(split[p], 1, 2, &heads[p]);
  }
  if (!rc) rc = loom_scaled_dot_product_attention(heads[0], heads[1], heads[2], causal, &y);
  if (!rc) rc = loom_transpose(y, 1, 2, &yt);
  if (!rc) rc = loom_reshape(yt, 3, osh, out);
  for (int p = 0; p < 3; p++) {
    loom_tensor_free(cols[p]);
    loom_tensor_free(split[p]);
    loom_tensor_free(heads[p]);
  }
  loom_tensor_free(y);
  loom_tensor_free(yt);
  return rc;
}

typedef int (*packed_fn)(loom_tensor *, int64_t, bool, loom_tensor **);

/* y (contiguous f32 copy) and the gradient of qkv for L = sum(y * w). */
static void run(packed_fn f, loom_tensor *qkv, int64_t H, bool causal, loom_tensor *w,
                loom_tensor **yc, loom_tensor **g) {
  loom_tensor *y = NULL, *yw = NULL, *l = NULL, *wc = NULL;
  LT_OK(loom_tensor_set_grad(qkv, NULL));
  LT_OK(f(qkv, H, causal, &y));
  LT_OK(loom_cast(w, loom_tensor_dtype(y), &wc));
  LT_OK(loom_mul(y, wc, &yw));
  LT_OK(loom_sum(yw, NULL, 0, false, &l));
  LT_OK(loom_backward(l, NULL, false));
  LT_OK(loom_cast(y, LOOM_F32, yc)); /* contiguous f32 */
  *g = loom_tensor_retain(loom_tensor_grad(qkv));
  LT_TRUE(*g != NULL);
  loom_tensor_free(y);
  loom_tensor_free(yw);
  loom_tensor_free(l);
  loom_tensor_free(wc);
}

static bool same_bits(loom_tensor *a, loom_tensor *b) {
  loom_tensor *ac = NULL, *bc = NULL;
  LT_OK(loom_tensor_contiguous(a, &ac));
  LT_OK(loom_tensor_contiguous(b, &bc));
  size_t n = loom_tensor_numel(ac) * loom_dtype_size(loom_tensor_dtype(ac));
  bool same = loom_tensor_numel(ac) == loom_tensor_numel(bc) &&
              memcmp(loom_tensor_data(ac), loom_tensor_data(bc), n) == 0;
  loom_tensor_free(ac);
  loom_tensor_free(bc);
  return same;
}

static void against_split(loom_dtype dt, int64_t B, int64_t T, int64_t H, int64_t D,
                          bool causal) {
  int64_t sh[3] = {B, T, 3 * H * D}, osh[3] = {B, T, H * D};
  loom_tensor *x = gc_rand(3, sh, -2, 2, &seed), *qkv = NULL, *w = gc_rand(3, osh, -1, 1, &seed);
  LT_OK(loom_cast(x, dt, &qkv));
  LT_OK(loom_tensor_set_requires_grad(qkv, true));
  loom_tensor *y[2], *g[2];
  run(loom_sdpa_qkv, qkv, H, causal, w, &y[0], &g[0]);
  run(split_path, qkv, H, causal, w, &y[1], &g[1]);
  if (!same_bits(y[0], y[1]) || !same_bits(g[0], g[1]))
    lt_fail_at(__FILE__, __LINE__, "%s [%lld, %lld, %lld x %lld]%s: packed != split",
               loom_dtype_name(dt), (long long)B, (long long)T, (long long)H, (long long)D,
               causal ? " causal" : "");
  for (int i = 0; i < 2; i++) {
    loom_tensor_free(y[i]);
    loom_tensor_free(g[i]);
  }
  loom_tensor_free(x);
  loom_tensor_free(qkv);
  loom_tensor_free(w);
}

/* Bit for bit the split path's output and gradient, at every CPU level. */
LT_TEST(sdpa_qkv_equals_the_split_heads_bit_for_bit) {
  static const int64_t shapes[][4] = {{1, 1, 1, 1}, {2, 17, 3, 8}, {1, 64, 2, 16},
                                      {2, 70, 6, 64}, {1, 130, 3, 5}, {2, 33, 1, 19}};
  loom_cpu_level top = loom_cpu_level_active();
  for (int lv = 0; lv <= (int)top; lv++) {
    LT_OK(loom_set_cpu_level((loom_cpu_level)lv));
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
      for (int causal = 0; causal < 2; causal++)
        against_split(LOOM_F32, shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3], causal);
  }
  LT_OK(loom_set_cpu_level(top));
}

/* 16-bit qkv (without AMX) is widened a batch element at a time into per-thread areas, where
 * the split path stages each of q, k and v whole: the same kernels in the same order, so the
 * same bits, at every CPU level, for several batch elements and ragged shapes (and on more
 * threads than batch elements, and fewer). */
LT_TEST(sdpa_qkv_16bit_staged_per_batch_equals_the_split_heads_bit_for_bit) {
  static const int64_t shapes[][4] = {{1, 1, 1, 1}, {2, 70, 3, 16}, {3, 33, 2, 8},
                                      {5, 65, 6, 64}, {1, 130, 3, 5}};
  loom_cpu_level top = loom_cpu_level_active();
  loom__attn_set_amx(false);
  for (int lv = 0; lv <= (int)top; lv++) {
    LT_OK(loom_set_cpu_level((loom_cpu_level)lv));
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
      for (int dt = 0; dt < 2; dt++)
        against_split(dt ? LOOM_F16 : LOOM_BF16, shapes[s][0], shapes[s][1], shapes[s][2],
                      shapes[s][3], s % 2 == 0);
  }
  LT_OK(loom_set_cpu_level(top));
  int nt = loom__gemm_threads();
  LT_OK(loom_set_num_threads(4));
  against_split(LOOM_BF16, 3, 40, 2, 16, true);
  LT_OK(loom_set_num_threads(nt));
  loom__attn_set_amx(true);
}

/* What a dry run allocates (`loom plan`) is what a real one does. */
static size_t step_peak(loom_tensor *qkv) {
  loom_pool_stats s0, s1;
  LT_OK(loom_mem_stats(LOOM_POOL_COMPUTE, &s0));
  loom_mem_reset_peak(LOOM_POOL_COMPUTE);
  loom_tensor *y = NULL, *l = NULL;
  LT_OK(loom_sdpa_qkv(qkv, 4, true, &y));
  LT_OK(loom_sum(y, NULL, 0, false, &l));
  LT_OK(loom_backward(l, NULL, false));
  LT_OK(loom_mem_stats(LOOM_POOL_COMPUTE, &s1));
  LT_OK(loom_tensor_set_grad(qkv, NULL));
  loom_tensor_free(y);
  loom_tensor_free(l);
  return s1.peak_bytes - s0.current_bytes;
}

LT_TEST(sdpa_qkv_dry_run_allocates_as_a_real_run) {
  int64_t sh[3] = {2, 100, 3 * 64};
  loom_tensor *x = gc_rand(3, sh, -1, 1, &seed);
  loom__attn_set_amx(false); /* bf16: the per-thread staging areas */
  for (int dt = 0; dt < 2; dt++) {
    loom_tensor *qkv = NULL;
    LT_OK(loom_cast(x, dt ? LOOM_BF16 : LOOM_F32, &qkv));
    LT_OK(loom_tensor_set_requires_grad(qkv, true));
    size_t real = step_peak(qkv);
    loom_mem_set_dry_run(true);
    size_t dry = step_peak(qkv);
    loom_mem_set_dry_run(false);
    LT_TRUE(real > 0);
    LT_EQ(dry, real);
    loom_tensor_free(qkv);
  }
  loom__attn_set_amx(true);
  loom_tensor_free(x);
}

LT_TEST(sdpa_qkv_bad_inputs) {
  int64_t s3[3] = {1, 4, 12}, s4[4] = {1, 2, 4, 12}, s3b[3] = {1, 4, 10};
  loom_tensor *x = NULL, *x4 = NULL, *xb = NULL, *xi = NULL, *y = NULL;
  LT_OK(loom_tensor_zeros(LOOM_F32, 3, s3, &x));
  LT_OK(loom_tensor_zeros(LOOM_F32, 4, s4, &x4));
  LT_OK(loom_tensor_zeros(LOOM_F32, 3, s3b, &xb));
  LT_OK(loom_tensor_zeros(LOOM_I32, 3, s3, &xi));
  LT_ERR(loom_sdpa_qkv(NULL, 2, true, &y), LOOM_EINVAL, "qkv is NULL");
  LT_ERR(loom_sdpa_qkv(x, 2, true, NULL), LOOM_EINVAL, "out");
  LT_ERR(loom_sdpa_qkv(x4, 2, true, &y), LOOM_ESHAPE,
         "qkv has shape [1, 2, 4, 12] (rank 4), expected [B, T, 3C]");
  LT_ERR(loom_sdpa_qkv(xb, 2, true, &y), LOOM_ESHAPE, "last dim 10 is not 3 x heads (2)");
  LT_ERR(loom_sdpa_qkv(x, 3, true, &y), LOOM_ESHAPE, "last dim 12 is not 3 x heads (3)");
  LT_ERR(loom_sdpa_qkv(x, 0, true, &y), LOOM_ESHAPE, "heads (0)");
  LT_ERR(loom_sdpa_qkv(xi, 2, true, &y), LOOM_EDTYPE, "qkv must be f32, f16 or bf16, not i32");
  LT_TRUE(y == NULL);
  loom_tensor_free(x);
  loom_tensor_free(x4);
  loom_tensor_free(xb);
  loom_tensor_free(xi);
}
