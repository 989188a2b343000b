/* test_attention_amx.c: fused attention with bf16 inputs on AMX tiles (attn_amx.c) against
 * the same op on the f32 path: the products' operands p, ds and dO are rounded to bf16 there
 * (f32 sums), where the f32 path keeps them f32. For T below, at and past the blocks (16, 32,
 * 64), D 32, 64 and 96 (a 32-column tail), causal and not, both ops (split heads and packed qkv): output and
 * gradients within 2e-2 of the largest f32 value (or of 1e-2: rel_diff; bf16's 8 mantissa bits
 * through two products and a softmax, as test_attention.c's bf16-against-f32 test allows), of
 *  - the f32 op on the bf16 values exactly (f32 inputs: what the answer should be), and
 *  - the bf16 op with AMX turned off (loom__attn_set_amx(false): inputs staged to f32);
 * and the AMX path is taken at all where this CPU has AMX (its output differs in the last bits
 * from the staged path's: the check that the branch runs). Skipped where AMX is missing or the
 * level is capped below avx512 (LOOM_CPU=avx2: the f32 path, tested elsewhere). */
#include "gradcheck.h"
#include "ops/attn_int.h"
#include "ops/ops_int.h"

#include <math.h>
#include <stdlib.h>

static uint64_t seed = 23;

/* Relative to the reference's largest value, or to 1e-2 where that is smaller: a gradient that
 * is zero in exact arithmetic (T = 1's dq and dk) is rounding noise on both sides. */
static double rel_diff(loom_tensor *a, loom_tensor *b) { return gc_rel_diff(a, b, 1e-2); }

/* y and the gradients of the n inputs for L = sum(y * w); packed: loom_sdpa_qkv(in[0], H). */
static void run(loom_tensor *const *in, int n, int64_t H, bool causal, loom_tensor *w,
                loom_tensor **y, loom_tensor **g) {
  loom_tensor *yw = NULL, *l = NULL, *wc = NULL;
  for (int i = 0; i < n; i++) LT_OK(loom_tensor_set_grad(in[i], NULL));
  if (n == 1)
    LT_OK(loom_sdpa_qkv(in[0], H, causal, y));
  else
    LT_OK(loom_scaled_dot_product_attention(in[0], in[1], in[2], causal, y));
  LT_OK(loom_cast(w, loom_tensor_dtype(*y), &wc));
  LT_OK(loom_mul(*y, wc, &yw));
  LT_OK(loom_sum(yw, NULL, 0, false, &l));
  LT_OK(loom_backward(l, NULL, false));
  for (int i = 0; i < n; i++) {
    g[i] = loom_tensor_retain(loom_tensor_grad(in[i]));
    LT_TRUE(g[i] != NULL);
  }
  loom_tensor_free(yw);
  loom_tensor_free(l);
  loom_tensor_free(wc);
}

/* One shape: n inputs of shape sh (n 3: q, k, v [B, H, T, D]; n 1: qkv [B, T, 3C]). */
static void check(int n, int ndim, const int64_t *sh, int64_t H, bool causal, int *differs) {
  enum { AMX, STAGED, F32, RUNS };
  loom_tensor *lo[3], *hi[3], *y[RUNS], *g[RUNS][3], *w;
  int64_t ysh[4] = {0};
  for (int d = 0; d < ndim; d++) ysh[d] = sh[d];
  if (n == 1) ysh[2] = sh[2] / 3;
  for (int i = 0; i < n; i++) {
    loom_tensor *x = gc_rand(ndim, sh, -2, 2, &seed);
    LT_OK(loom_cast(x, LOOM_BF16, &lo[i]));
    LT_OK(loom_cast(lo[i], LOOM_F32, &hi[i])); /* the bf16 values exactly */
    loom_tensor_free(x);
    LT_OK(loom_tensor_set_requires_grad(lo[i], true));
    LT_OK(loom_tensor_set_requires_grad(hi[i], true));
  }
  w = gc_rand(ndim, ysh, -1, 1, &seed);
  run(lo, n, H, causal, w, &y[AMX], g[AMX]);
  loom__attn_set_amx(false);
  run(lo, n, H, causal, w, &y[STAGED], g[STAGED]);
  loom__attn_set_amx(true);
  run(hi, n, H, causal, w, &y[F32], g[F32]);
  char what[128];
  snprintf(what, sizeof what, "%s [%lld, %lld, %lld%s%lld]%s", n == 1 ? "sdpa_qkv" : "sdpa",
           (long long)sh[0], (long long)sh[1], (long long)sh[2], ndim == 4 ? ", " : "",
           ndim == 4 ? (long long)sh[3] : 0LL, causal ? " causal" : "");
  static const char *names[4] = {"out", "grad 0", "grad 1", "grad 2"};
  for (int ref = STAGED; ref <= F32; ref++)
    for (int i = 0; i <= n; i++) {
      loom_tensor *a = i ? g[AMX][i - 1] : y[AMX], *b = i ? g[ref][i - 1] : y[ref];
      double e = rel_diff(a, b);
      if (!(e <= 2e-2))
        lt_fail_at(__FILE__, __LINE__, "%s: %s differs from the %s path by %g", what, names[i],
                   ref == F32 ? "f32" : "staged bf16", e);
      if (ref == STAGED && e > 0) *differs = 1;
    }
  for (int r = 0; r < RUNS; r++) {
    loom_tensor_free(y[r]);
    for (int i = 0; i < n; i++) loom_tensor_free(g[r][i]);
  }
  for (int i = 0; i < n; i++) {
    loom_tensor_free(lo[i]);
    loom_tensor_free(hi[i]);
  }
  loom_tensor_free(w);
}

LT_TEST(sdpa_bf16_amx_against_f32) {
  if (!loom__attn_amx_fits(64)) {
    lt_skip("no AMX-BF16 here (or the level is capped below avx512)");
    return;
  }
  static const int64_t Ts[] = {1, 17, 32, 64, 65, 100, 130, 256};
  static const int64_t Ds[] = {32, 64, 96};
  int differs = 0;
  for (size_t t = 0; t < sizeof Ts / sizeof Ts[0]; t++)
    for (size_t d = 0; d < 3; d++)
      for (int causal = 0; causal < 2; causal++) {
        if (Ds[d] != 64 && Ts[t] > 100) continue; /* time */
        int64_t sh[4] = {2, 2, Ts[t], Ds[d]};
        check(3, 4, sh, 2, causal, &differs);
      }
  LT_TRUE(differs); /* the AMX branch ran */
}

LT_TEST(sdpa_qkv_bf16_amx_against_f32) {
  if (!loom__attn_amx_fits(64)) {
    lt_skip("no AMX-BF16 here (or the level is capped below avx512)");
    return;
  }
  static const int64_t Ts[] = {5, 64, 97, 256};
  int differs = 0;
  for (size_t t = 0; t < sizeof Ts / sizeof Ts[0]; t++)
    for (int causal = 0; causal < 2; causal++) {
      int64_t sh[3] = {2, Ts[t], 3 * 3 * 64}; /* 3 heads of 64 */
      check(1, 3, sh, 3, causal, &differs);
    }
  LT_TRUE(differs);
}
