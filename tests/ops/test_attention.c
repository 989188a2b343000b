/* test_attention.c: loom_scaled_dot_product_attention (fused, attention.c). Gradients of q, k
 * and v by finite differences, and f16 / bf16 against f32 (gradcheck.h); the fused forward and
 * backward against the unfused reference (loom__sdpa_unfused: matmul, softmax, matmul on the
 * tape) for several shapes, T below, at and past the key block (64) and ragged head dims;
 * every CPU level's inner loops against scalar, and the whole op under each level; autocast;
 * bad inputs (status and a message naming the problem). */
#include "gradcheck.h"
#include "lt_oom.h"
#include "ops/attn_int.h"
#include "ops/ops_int.h"

#include <math.h>
#include <stdlib.h>

G1(op_causal, loom_scaled_dot_product_attention(in[0], in[1], in[2], true, out))
G1(op_full, loom_scaled_dot_product_attention(in[0], in[1], in[2], false, out))

/* f32: |num - ana| <= 1e-2 (1 + |ana|) with central differences of step 1e-2 on values in
 * [-1, 1] (the loss is smooth; its third derivatives are O(1), so the truncation error is
 * ~1e-4). f16 / bf16 (lp_tol 3e-2 of the largest f32 value, bf16's 8 mantissa bits through
 * two products and a softmax): the gradcheck defaults. */
LT_TEST(grad_sdpa) {
  gc_input a[] = {S(4, 1, 2, 5, 3), S(4, 1, 2, 5, 3), S(4, 1, 2, 5, 3)};
  gc_run("sdpa causal", op_causal, NULL, 3, a, NULL);
  gc_run("sdpa full", op_full, NULL, 3, a, NULL);
  /* T past one key block (64): the online softmax's rescaling is on the gradient path */
  gc_input b[] = {S(4, 1, 1, 70, 2), S(4, 1, 1, 70, 2), S(4, 1, 1, 70, 2)};
  gc_opts o = {.f32_only = true};
  gc_run("sdpa causal T=70", op_causal, NULL, 3, b, &o);
  /* larger logits (values in [-3, 3], scores up to 9 * D / sqrt(D)) */
  gc_input c[] = {SR(4, -3, 3, 2, 1, 6, 4), SR(4, -3, 3, 2, 1, 6, 4), S(4, 2, 1, 6, 4)};
  gc_opts o2 = {.eps = 1e-3, .f32_only = true};
  gc_run("sdpa causal wide logits", op_causal, NULL, 3, c, &o2);
}

static uint64_t seed = 7;

static loom_tensor *leaf(int64_t B, int64_t H, int64_t T, int64_t D, float amp) {
  int64_t sh[4] = {B, H, T, D};
  loom_tensor *t = gc_rand(4, sh, -amp, amp, &seed);
  loom_tensor_set_requires_grad(t, true);
  return t;
}

static double rel_diff(loom_tensor *a, loom_tensor *b) { return gc_rel_diff(a, b, 1e-30); }

typedef int (*attn_fn)(loom_tensor *, loom_tensor *, loom_tensor *, bool, loom_tensor **);

/* out and the gradients of q, k, v for L = sum(out * w). */
static void run(attn_fn f, loom_tensor *const qkv[3], bool causal, loom_tensor *w,
                loom_tensor **out, loom_tensor *grads[3]) {
  loom_tensor *y = NULL, *yw = NULL, *l = NULL;
  for (int i = 0; i < 3; i++) LT_OK(loom_tensor_set_grad(qkv[i], NULL)); /* a fresh buffer */
  LT_OK(f(qkv[0], qkv[1], qkv[2], causal, &y));
  loom_tensor *wc = NULL; /* w in y's dtype */
  LT_OK(loom_cast(w, loom_tensor_dtype(y), &wc));
  LT_OK(loom_mul(y, wc, &yw));
  loom_tensor_free(wc);
  LT_OK(loom_sum(yw, NULL, 0, false, &l));
  LT_OK(loom_backward(l, NULL, false));
  for (int i = 0; i < 3; i++) {
    grads[i] = loom_tensor_retain(loom_tensor_grad(qkv[i]));
    LT_TRUE(grads[i] != NULL);
  }
  *out = y;
  loom_tensor_free(yw);
  loom_tensor_free(l);
}

/* Two runs' outputs and gradients within tol of run 1's (relative to its largest value); both
 * runs' tensors are freed. */
static void compare_runs(const char *what, loom_tensor *y[2], loom_tensor *g[2][3], double tol) {
  static const char *names[4] = {"out", "dq", "dk", "dv"};
  for (int i = 0; i < 4; i++) {
    loom_tensor *a = i ? g[0][i - 1] : y[0], *b = i ? g[1][i - 1] : y[1];
    double e = rel_diff(a, b);
    if (!(e <= tol)) lt_fail_at(__FILE__, __LINE__, "%s: %s differs by %g", what, names[i], e);
    loom_tensor_free(a);
    loom_tensor_free(b);
  }
}

/* fused against unfused: forward and the three gradients within tol (relative to the largest
 * reference value). */
static void against_reference(int64_t B, int64_t H, int64_t T, int64_t D, bool causal,
                              double tol) {
  loom_tensor *qkv[3] = {leaf(B, H, T, D, 2), leaf(B, H, T, D, 2), leaf(B, H, T, D, 1)};
  loom_tensor *w = leaf(B, H, T, D, 1), *y[2], *g[2][3];
  run(loom_scaled_dot_product_attention, qkv, causal, w, &y[0], g[0]);
  run(loom__sdpa_unfused, qkv, causal, w, &y[1], g[1]);
  char what[96];
  snprintf(what, sizeof what, "[%lld, %lld, %lld, %lld]%s", (long long)B, (long long)H,
           (long long)T, (long long)D, causal ? " causal" : "");
  compare_runs(what, y, g, tol);
  for (int i = 0; i < 3; i++) loom_tensor_free(qkv[i]);
  loom_tensor_free(w);
}

/* f32 through different summation orders (blocks, SIMD lanes): 1e-5 of the largest value. */
LT_TEST(sdpa_fused_matches_unfused) {
  static const int64_t shapes[][4] = {{1, 1, 1, 1},  {2, 3, 17, 8},  {1, 2, 64, 16},
                                      {1, 1, 65, 64}, {2, 2, 100, 32}, {1, 3, 130, 5},
                                      {1, 1, 200, 64}, {2, 1, 33, 19}};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
    for (int causal = 0; causal < 2; causal++)
      against_reference(shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3], causal, 1e-5);
}

/* A low-precision op against the f32 op on the same (rounded) values, larger T than
 * grad_sdpa's: outputs and gradients within 2e-2 (bf16) / 5e-3 (f16) of the largest f32 value
 * (the output is rounded once; gradients stay f32 from rounded inputs and output). */
LT_TEST(sdpa_low_precision_against_f32) {
  loom_dtype dts[2] = {LOOM_BF16, LOOM_F16};
  double tols[2] = {2e-2, 5e-3};
  for (int d = 0; d < 2; d++) {
    loom_tensor *qkv[3], *low[3], *w = leaf(2, 2, 80, 16, 1), *y[2], *g[2][3];
    for (int i = 0; i < 3; i++) {
      int64_t sh[4] = {2, 2, 80, 16};
      loom_tensor *x = gc_rand(4, sh, -1, 1, &seed);
      LT_OK(loom_cast(x, dts[d], &low[i]));
      LT_OK(loom_cast(low[i], LOOM_F32, &qkv[i])); /* the low-precision values exactly */
      loom_tensor_free(x);
      LT_OK(loom_tensor_set_requires_grad(low[i], true));
      LT_OK(loom_tensor_set_requires_grad(qkv[i], true));
    }
    run(loom_scaled_dot_product_attention, qkv, true, w, &y[0], g[0]);
    run(loom_scaled_dot_product_attention, low, true, w, &y[1], g[1]);
    LT_EQ(loom_tensor_dtype(y[1]), dts[d]);
    for (int i = 0; i < 3; i++) LT_EQ(loom_tensor_dtype(g[1][i]), dts[d]);
    loom_tensor *y2[2] = {y[1], y[0]}, *g2[2][3] = {{g[1][0], g[1][1], g[1][2]},
                                                    {g[0][0], g[0][1], g[0][2]}};
    compare_runs(loom_dtype_name(dts[d]), y2, g2, tols[d]);
    for (int i = 0; i < 3; i++) {
      loom_tensor_free(qkv[i]);
      loom_tensor_free(low[i]);
    }
    loom_tensor_free(w);
  }
}

LT_TEST(sdpa_kernels_every_level_matches_scalar) {
  const loom__attn_kernels *ref = loom__attn_kernels_for(LOOM_CPU_SCALAR);
  enum { N = 70, DM = 80, LD = 83 };
  static float q[DM], kv[N * LD], a[N], s0[N], s1[N], o0[DM], o1[DM];
  uint64_t st = 11;
  for (int i = 0; i < DM; i++) q[i] = gc_uniform(&st, -1, 1);
  for (int i = 0; i < N * LD; i++) kv[i] = gc_uniform(&st, -1, 1);
  for (int i = 0; i < N; i++) a[i] = gc_uniform(&st, -1, 1);
  int levels = 0;
  for (int lv = LOOM_CPU_AVX2; lv < LOOM_CPU_LEVEL_COUNT; lv++) {
    if (!loom_cpu_supports((loom_cpu_level)lv)) continue;
    levels++;
    const loom__attn_kernels *k = loom__attn_kernels_for((loom_cpu_level)lv);
    const char *ln = loom_cpu_level_name((loom_cpu_level)lv);
    size_t Ds[] = {1, 3, 7, 8, 15, 16, 17, 31, 32, 33, 63, 64, 65, 80};
    for (size_t di = 0; di < sizeof Ds / sizeof Ds[0]; di++)
      for (size_t n = 1; n <= N; n += n < 9 ? 1 : 13) {
        size_t D = Ds[di];
        float d0 = ref->dot(q, kv + n, D), d1 = k->dot(q, kv + n, D);
        if (!(fabsf(d0 - d1) <= 1e-5f * (1 + fabsf(d0))))
          lt_fail_at(__FILE__, __LINE__, "%s dot D=%zu: %g vs scalar %g", ln, D, d1, d0);
        for (size_t d = 0; d < D; d++) o0[d] = o1[d] = q[d];
        ref->accum(o0, a, kv, LD, n, D);
        k->accum(o1, a, kv, LD, n, D);
        for (size_t d = 0; d < D; d++)
          if (!(fabsf(o0[d] - o1[d]) <= 1e-5f * (1 + fabsf(o0[d]))))
            lt_fail_at(__FILE__, __LINE__, "%s accum D=%zu n=%zu [%zu]: %g vs scalar %g", ln, D,
                       n, d, o1[d], o0[d]);
        LT_NEAR(k->max(kv + n, n, -2.0f), ref->max(kv + n, n, -2.0f), 0); /* exact */
        LT_NEAR(k->max(kv, n, 5.0f), 5.0f, 0);                               /* m itself */
        float u0[DM], u1[DM], w0[DM], w1[DM], b[N];
        for (size_t j = 0; j < n; j++) b[j] = a[n - 1 - j];
        for (size_t d = 0; d < D; d++) u0[d] = u1[d] = q[d], w0[d] = w1[d] = -q[d];
        ref->accum2(u0, w0, a, b, kv, LD, n, D);
        k->accum2(u1, w1, a, b, kv, LD, n, D);
        for (size_t d = 0; d < D; d++)
          if (!(fabsf(u0[d] - u1[d]) <= 1e-5f * (1 + fabsf(u0[d])) &&
                fabsf(w0[d] - w1[d]) <= 1e-5f * (1 + fabsf(w0[d]))))
            lt_fail_at(__FILE__, __LINE__, "%s accum2 D=%zu n=%zu [%zu]: %g, %g vs scalar %g, %g",
                       ln, D, n, d, u1[d], w1[d], u0[d], w0[d]);
        { /* transpose: n rows of D into D rows of n, scaled (exact: one product each) */
          enum { LT = N + 3 };
          static float tr0[DM * LT], tr1[DM * LT];
          for (size_t i = 0; i < DM * LT; i++) tr0[i] = tr1[i] = 7.0f; /* outside: untouched */
          ref->transpose(tr0, LT, kv + 1, LD, n, D, 0.125f);
          k->transpose(tr1, LT, kv + 1, LD, n, D, 0.125f);
          for (size_t i = 0; i < DM * LT; i++)
            if (tr0[i] != tr1[i])
              lt_fail_at(__FILE__, __LINE__, "%s transpose n=%zu D=%zu [%zu]: %g vs scalar %g",
                         ln, n, D, i, tr1[i], tr0[i]);
        }
        { /* accum4: four rows of different weights and starting values */
          float t0[4][DM], t1[4][DM], c4[4][N], c4s[4][3 * N]; /* c4s: c4 with stride 3 */
          float *o4r[4] = {t0[0], t0[1], t0[2], t0[3]}, *o4k[4] = {t1[0], t1[1], t1[2], t1[3]};
          const float *p4[4] = {c4[0], c4[1], c4[2], c4[3]},
                      *p4s[4] = {c4s[0], c4s[1], c4s[2], c4s[3]};
          for (size_t ps = 1; ps <= 3; ps += 2) { /* weights in a row, then in a column */
            for (int r = 0; r < 4; r++) {
              for (size_t j = 0; j < 3 * n; j++) c4s[r][j] = 1e30f; /* read: a wrong result */
              for (size_t j = 0; j < n; j++)
                c4s[r][j * 3] = c4[r][j] = a[(j * (size_t)(r + 1) + (size_t)r) % n];
              for (size_t d = 0; d < D; d++) t0[r][d] = t1[r][d] = (float)(r - 1) * q[d];
            }
            ref->accum4(o4r, p4, 1, kv, LD, n, D);
            k->accum4(o4k, ps == 1 ? p4 : p4s, ps, kv, LD, n, D);
            for (int r = 0; r < 4; r++)
              for (size_t d = 0; d < D; d++)
                if (!(fabsf(t0[r][d] - t1[r][d]) <= 1e-5f * (1 + fabsf(t0[r][d]))))
                  lt_fail_at(__FILE__, __LINE__,
                             "%s accum4 D=%zu n=%zu ps=%zu row %d [%zu]: %g vs scalar %g", ln, D,
                             n, ps, r, d, t1[r][d], t0[r][d]);
          }
        }
        for (size_t j = 0; j < n; j++) s0[j] = s1[j] = -30.0f * a[j] * a[j]; /* exp's range */
        float sum0 = ref->expsum(s0, s0, n, 0.25f), sum1 = k->expsum(s1, s1, n, 0.25f);
        for (size_t j = 0; j < n; j++)
          if (!(fabsf(s0[j] - s1[j]) <= 1e-6f * s0[j]))
            lt_fail_at(__FILE__, __LINE__, "%s expsum n=%zu [%zu]: %g vs scalar %g", ln, n, j,
                       s1[j], s0[j]);
        if (!(fabsf(sum0 - sum1) <= 1e-6f * sum0))
          lt_fail_at(__FILE__, __LINE__, "%s expsum n=%zu: sum %g vs scalar %g", ln, n, sum1, sum0);
      }
  }
  if (!levels) lt_skip("no SIMD level on this CPU");
}

/* exp's edges on every level, in the vector part (the first 32 lanes) and the scalar tail:
 * underflow to 0 (or within 1e-37 of expf), -inf to 0, NaN kept, 0 to 1. */
LT_TEST(sdpa_exp_edges_every_level) {
  static const float edge[] = {-INFINITY, -1e30f, -200, -104, -87.5f, -87.2f, -50, -1e-8f,
                               0,         NAN,    -3,   -0.5f, -87.33f, -88,  -1,  -20};
  enum { NE = sizeof edge / sizeof edge[0], N = 2 * NE + 5 };
  float s[N], p0[N], p1[N];
  for (int i = 0; i < N; i++) s[i] = edge[i % NE];
  const loom__attn_kernels *ref = loom__attn_kernels_for(LOOM_CPU_SCALAR);
  ref->expsum(p0, s, N, 0);
  for (int lv = 0; lv < LOOM_CPU_LEVEL_COUNT; lv++) {
    if (!loom_cpu_supports((loom_cpu_level)lv)) continue;
    loom__attn_kernels_for((loom_cpu_level)lv)->expsum(p1, s, N, 0);
    for (int i = 0; i < N; i++)
      if (isnan(p0[i]) ? !isnan(p1[i]) : !(fabsf(p1[i] - p0[i]) <= 1e-37f + 1e-6f * p0[i]))
        lt_fail_at(__FILE__, __LINE__, "%s exp(%g) = %g, expf gives %g",
                   loom_cpu_level_name((loom_cpu_level)lv), s[i], p1[i], p0[i]);
  }
}

LT_TEST(sdpa_op_agrees_across_levels) {
  loom_tensor *qkv[3] = {leaf(1, 2, 90, 24, 2), leaf(1, 2, 90, 24, 2), leaf(1, 2, 90, 24, 1)};
  loom_tensor *w = leaf(1, 2, 90, 24, 1), *y[LOOM_CPU_LEVEL_COUNT] = {0},
              *g[LOOM_CPU_LEVEL_COUNT][3] = {{0}};
  loom_cpu_level keep = loom_cpu_level_active();
  for (int lv = 0; lv < LOOM_CPU_LEVEL_COUNT; lv++) {
    if (!loom_cpu_supports((loom_cpu_level)lv)) continue;
    LT_OK(loom_set_cpu_level((loom_cpu_level)lv));
    run(loom_scaled_dot_product_attention, qkv, true, w, &y[lv], g[lv]);
  }
  loom_set_cpu_level(keep);
  for (int lv = 1; lv < LOOM_CPU_LEVEL_COUNT; lv++) {
    if (!y[lv]) continue;
    double e = rel_diff(y[lv], y[0]);
    if (!(e <= 1e-5))
      lt_fail_at(__FILE__, __LINE__, "level %s: out differs from scalar by %g",
                 loom_cpu_level_name((loom_cpu_level)lv), e);
    for (int i = 0; i < 3; i++) {
      e = rel_diff(g[lv][i], g[0][i]);
      if (!(e <= 1e-5))
        lt_fail_at(__FILE__, __LINE__, "level %s: grad %d differs from scalar by %g",
                   loom_cpu_level_name((loom_cpu_level)lv), i, e);
    }
  }
  for (int lv = 0; lv < LOOM_CPU_LEVEL_COUNT; lv++) {
    loom_tensor_free(y[lv]);
    for (int i = 0; i < 3; i++) loom_tensor_free(g[lv][i]);
  }
  for (int i = 0; i < 3; i++) loom_tensor_free(qkv[i]);
  loom_tensor_free(w);
}

LT_TEST(sdpa_under_autocast_runs_in_the_low_dtype) {
  loom_tensor *q = leaf(1, 1, 5, 4, 1), *y = NULL;
  loom_autocast_token tok;
  LT_OK(loom_autocast_enter(LOOM_AUTOCAST_BF16, NULL, &tok));
  LT_OK(loom_scaled_dot_product_attention(q, q, q, true, &y));
  LT_OK(loom_autocast_exit(&tok));
  LT_EQ(loom_tensor_dtype(y), LOOM_BF16);
  loom_amp_policy p;
  LT_OK(loom_amp_registry_get(loom_amp_registry_default(LOOM_AUTOCAST_F16), LOOM_AMP_OP_SDPA, &p));
  LT_EQ(p, LOOM_AMP_LOWER);
  LT_STREQ(loom_op_kind_name(LOOM_OPK_SDPA), "scaled_dot_product_attention");
  loom_tensor_free(y);
  loom_tensor_free(q);
}

/* The sweep's run and reset (lt_oom.h): ctx is q, k, v. */
static int attn_run(void *ctx, loom_tensor **y, loom_tensor **l) {
  loom_tensor **qkv = ctx;
  int rc = loom_scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], true, y);
  return rc ? rc : loom_sum(*y, NULL, 0, false, l);
}
static void attn_reset(void *ctx) {
  for (int i = 0; i < 3; i++) LT_OK(loom_tensor_set_grad(((loom_tensor **)ctx)[i], NULL));
}

/* Out of memory at each allocation of a bf16 forward + backward in turn: ENOMEM (never a
 * crash), and nothing left allocated once the caller has freed what it holds. */
LT_TEST(sdpa_out_of_memory_sweep) {
  int64_t sh[4] = {1, 2, 70, 8};
  loom_tensor *qkv[3], *x = NULL;
  for (int i = 0; i < 3; i++) {
    x = gc_rand(4, sh, -1, 1, &seed);
    LT_OK(loom_cast(x, LOOM_BF16, &qkv[i]));
    LT_OK(loom_tensor_set_requires_grad(qkv[i], true));
    loom_tensor_free(x);
  }
  int ok = 0, nomem = lt_oom_sweep(200, attn_run, attn_reset, qkv, &ok);
  LT_TRUE(ok); /* the sweep reached a run with no failure */
  LT_TRUE(nomem >= 10); /* staging, output, logsumexp, scratch, gradients: each failed once */
  for (int i = 0; i < 3; i++) loom_tensor_free(qkv[i]);
}

/* A dry run (loom_mem_set_dry_run, what `loom plan` runs) of an f32 forward + backward over
 * real inputs: the same compute-pool peak as the real run, nothing computed (the output reads
 * zero, where the real run gives 0.5). */
static size_t sdpa_step_peak(loom_tensor *const qkv[3], float *first) {
  loom_pool_stats s0, s1;
  LT_OK(loom_mem_stats(LOOM_POOL_COMPUTE, &s0));
  loom_mem_reset_peak(LOOM_POOL_COMPUTE);
  loom_tensor *y = NULL, *l = NULL;
  LT_OK(loom_scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], true, &y));
  *first = ((const float *)loom_tensor_data(y))[0]; /* f32, contiguous */
  LT_OK(loom_sum(y, NULL, 0, false, &l));
  LT_OK(loom_backward(l, NULL, false));
  LT_OK(loom_mem_stats(LOOM_POOL_COMPUTE, &s1));
  for (int i = 0; i < 3; i++) LT_OK(loom_tensor_set_grad(qkv[i], NULL));
  loom_tensor_free(y);
  loom_tensor_free(l);
  return s1.peak_bytes - s0.current_bytes;
}

LT_TEST(sdpa_dry_run_allocates_as_a_real_run_and_computes_nothing) {
  int64_t sh[4] = {2, 3, 100, 16};
  loom_tensor *qkv[3];
  for (int i = 0; i < 3; i++) {
    LT_OK(loom_tensor_empty(LOOM_F32, 4, sh, &qkv[i]));
    LT_OK(loom_tensor_fill(qkv[i], 0.5));
    LT_OK(loom_tensor_set_requires_grad(qkv[i], true));
  }
  float real_first = 0, dry_first = -1;
  size_t real = sdpa_step_peak(qkv, &real_first);
  loom_mem_set_dry_run(true);
  size_t dry = sdpa_step_peak(qkv, &dry_first);
  loom_mem_set_dry_run(false);
  LT_TRUE(real > 0);
  LT_EQ(dry, real);
  LT_NEAR(real_first, 0.5, 0);  /* a softmax-weighted mean of values all 0.5 */
  LT_NEAR(dry_first, 0.0, 0);   /* nothing ran: the dry block's zeros */
  for (int i = 0; i < 3; i++) loom_tensor_free(qkv[i]);
}

LT_TEST(sdpa_bad_inputs) {
  int64_t s4[4] = {1, 2, 3, 4}, s4b[4] = {1, 2, 5, 4}, s3[3] = {2, 3, 4};
  loom_tensor *q = NULL, *kb = NULL, *q3 = NULL, *qi = NULL, *qh = NULL, *y = NULL;
  LT_OK(loom_tensor_zeros(LOOM_F32, 4, s4, &q));
  LT_OK(loom_tensor_zeros(LOOM_F32, 4, s4b, &kb));
  LT_OK(loom_tensor_zeros(LOOM_F32, 3, s3, &q3));
  LT_OK(loom_tensor_zeros(LOOM_I32, 4, s4, &qi));
  LT_OK(loom_tensor_zeros(LOOM_F16, 4, s4, &qh));
  LT_ERR(loom_scaled_dot_product_attention(NULL, q, q, true, &y), LOOM_EINVAL, "q is NULL");
  LT_TRUE(y == NULL);
  LT_ERR(loom_scaled_dot_product_attention(q, NULL, q, true, &y), LOOM_EINVAL, "k is NULL");
  LT_ERR(loom_scaled_dot_product_attention(q, q, NULL, true, &y), LOOM_EINVAL, "v is NULL");
  LT_ERR(loom_scaled_dot_product_attention(q, q, q, true, NULL), LOOM_EINVAL, "out");
  LT_ERR(loom_scaled_dot_product_attention(q3, q3, q3, true, &y), LOOM_ESHAPE,
         "q has shape [2, 3, 4] (rank 3), expected [B, H, T, D]");
  LT_ERR(loom_scaled_dot_product_attention(q, kb, q, true, &y), LOOM_ESHAPE,
         "k has shape [1, 2, 5, 4], q has [1, 2, 3, 4]");
  LT_ERR(loom_scaled_dot_product_attention(q, q, kb, false, &y), LOOM_ESHAPE, "v has shape");
  LT_ERR(loom_scaled_dot_product_attention(qi, q, q, true, &y), LOOM_EDTYPE,
         "q must be f32, f16 or bf16, not i32");
  LT_ERR(loom_scaled_dot_product_attention(q, q, qi, true, &y), LOOM_EDTYPE, "v must be");
  LT_ERR(loom_scaled_dot_product_attention(q, qh, q, true, &y), LOOM_EDTYPE,
         "different dtypes f32 and f16");
  LT_TRUE(y == NULL);
  loom_tensor_free(q);
  loom_tensor_free(kb);
  loom_tensor_free(q3);
  loom_tensor_free(qi);
  loom_tensor_free(qh);
}
