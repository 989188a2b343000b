/* test_ddp.c: DDP on the threads backend against a single process. N ranks with per-rank batch
 * B end with the same parameters as one rank with batch N*B (N = 2, 3, 4; overlapped and
 * eager; bf16 wire), no_sync accumulation equals one large batch, rank 0's parameters are
 * broadcast, statistics count one collective per bucket, and ranks that disagree on their
 * parameters get an error, not a hang.
 *
 * Tolerance: ranks average the per-rank mean losses' gradients, the single process takes the
 * mean over all rows; the two differ only by f32 summation order (relative ~1e-7 per step),
 * so after 4 SGD steps parameters agree to 2e-6 absolute. The bf16 wire rounds each averaged
 * gradient to 8 bits of mantissa (relative 2^-9), so there the bound is 2e-3.
 * Under bf16 autocast both sides round the same activations and weights to bf16 and
 * accumulate in f32; they differ by f32 summation order in the weight gradients, which can
 * flip the bf16 rounding of a weight in a later step (one bf16 ulp, 2^-8 relative, of one
 * weight feeding many outputs), so the bound there is 5e-4 (measured: 0.7-1.1e-4 for 2-4
 * ranks); an error in the averaging (a factor of N) moves parameters by ~1e-2 per step. */
#include "lt.h"
#include "ddp_model.h"
#include "loom/ddp.h"

#include <stdlib.h>

enum { STEPS = 4, B = 6, MAXR = 4 };
static const float LR = 0.1f;

typedef struct run {
  int nranks;
  loom_autocast_mode amp;
  loom_ddp_cfg cfg;
  bool accumulate; /* two micro-batches per step, the first under no_sync */
  float *params[MAXR];
  loom_ddp_stats stats[MAXR];
  size_t bucket_numel[MAXR]; /* the buckets' elements: the gradients and the layout's padding */
} run;

static int rank_fn(loom_pg *pg, void *arg) {
  run *r = arg;
  int rank = loom_pg_rank(pg), n = loom_pg_size(pg);
  model m;
  int rc = model_init(&m, 1 + (uint64_t)rank); /* different on each rank: rank 0's wins */
  loom_ddp *d = NULL;
  if (!rc) rc = loom_ddp_create(pg, m.p, model_names, MODEL_NPARAMS, &r->cfg, &d);
  for (int s = 0; s < STEPS && !rc; s++) {
    int micro = r->accumulate ? 2 : 1;
    for (int k = 0; k < micro && !rc; k++) {
      rc = loom_ddp_set_sync(d, k == micro - 1);
      int64_t row0 = ((int64_t)s * micro + k) * n * B + (int64_t)rank * B;
      if (!rc) rc = model_backward_amp(&m, row0, B, 1.0f, r->amp);
    }
    if (!rc) rc = loom_ddp_finish(d);
    if (!rc) model_sgd(&m, LR);
  }
  if (!rc) {
    model_flatten(&m, r->params[rank], false);
    rc = loom_ddp_stats_get(d, &r->stats[rank]);
    loom_bucket_manager *bm = loom_ddp_buckets(d);
    for (size_t b = 0; !rc && b < loom_bucket_manager_count(bm); b++) {
      loom_bucket_info info;
      rc = loom_bucket_manager_info(bm, b, &info);
      if (!rc) r->bucket_numel[rank] += loom_tensor_numel(info.buffer);
    }
  }
  loom_ddp_free(d);
  model_free(&m);
  return rc;
}

/* The same training in one process, batch n*B, parameters from rank 0's seed. */
static void reference(int n, bool accumulate, loom_autocast_mode amp, float *out) {
  model m;
  LT_OK(model_init(&m, 1));
  int micro = accumulate ? 2 : 1;
  for (int s = 0; s < STEPS; s++) {
    for (int k = 0; k < micro; k++)
      LT_OK(model_backward_amp(&m, ((int64_t)s * micro + k) * n * B, (int64_t)n * B, 1.0f, amp));
    model_sgd(&m, LR);
  }
  model_flatten(&m, out, false);
  model_free(&m);
}

static void check_run(run *r, float tol) {
  size_t np = model_numel();
  float *ref = malloc(np * sizeof *ref);
  for (int k = 0; k < r->nranks; k++) r->params[k] = calloc(np, sizeof(float));
  int rc = loom_threads_run(r->nranks, NULL, rank_fn, r);
  LT_OK(rc);
  reference(r->nranks, r->accumulate, r->amp, ref);
  for (int k = 0; k < r->nranks && rc == LOOM_OK; k++) {
    double worst = 0;
    for (size_t i = 0; i < np; i++) {
      double e = fabs(r->params[k][i] - ref[i]);
      if (e > worst) worst = e;
      if (k && r->params[k][i] != r->params[0][i]) {
        lt_fail_at(__FILE__, __LINE__, "ranks 0 and %d differ at %zu", k, i);
        break;
      }
    }
    if (worst > tol)
      lt_fail_at(__FILE__, __LINE__, "%d ranks: rank %d is %g from the single process (tol %g)",
                 r->nranks, k, worst, tol);
  }
  for (int k = 0; k < r->nranks; k++) free(r->params[k]);
  free(ref);
}

LT_TEST(ddp_matches_single_process_2_3_4_ranks) {
  for (int n = 2; n <= 4; n++) {
    run r = {.nranks = n};
    r.cfg = loom_ddp_cfg_default();
    r.cfg.buckets.first_bucket_bytes = 16; /* three buckets even for this small model */
    r.cfg.buckets.bucket_bytes = 700;
    check_run(&r, 2e-6f);
    LT_TRUE(r.stats[0].buckets >= 3);
    LT_EQ(r.stats[0].steps, STEPS);
  }
}

LT_TEST(ddp_matches_single_process_under_bf16_autocast) {
  for (int n = 2; n <= 4; n++) {
    run r = {.nranks = n, .amp = LOOM_AUTOCAST_BF16};
    r.cfg = loom_ddp_cfg_default();
    r.cfg.buckets.first_bucket_bytes = 16;
    r.cfg.buckets.bucket_bytes = 700;
    check_run(&r, 5e-4f);
  }
}

LT_TEST(ddp_eager_path_matches_too) {
  run r = {.nranks = 3};
  r.cfg = loom_ddp_cfg_default();
  r.cfg.overlap = false;
  r.cfg.buckets.policy = LOOM_BUCKET_LARGEST_FIRST;
  r.cfg.buckets.bucket_bytes = 1024;
  check_run(&r, 2e-6f);
}

LT_TEST(ddp_no_sync_accumulation_equals_one_large_batch) {
  run r = {.nranks = 2, .accumulate = true};
  r.cfg = loom_ddp_cfg_default();
  check_run(&r, 2e-6f);
  /* one bucket: one all-reduce per synchronised step, none for the no_sync micro-batches */
  LT_EQ(r.stats[0].buckets, 1);
  LT_EQ(r.stats[0].steps, STEPS);
}

LT_TEST(ddp_bf16_wire) {
  run r = {.nranks = 2};
  r.cfg = loom_ddp_cfg_default();
  r.cfg.wire_dtype_set = true;
  r.cfg.wire_dtype = LOOM_BF16;
  check_run(&r, 2e-3f);
  LT_EQ(r.stats[0].bytes, (uint64_t)STEPS * r.bucket_numel[0] * 2); /* half the bytes of f32 */
}

LT_TEST(ddp_stats_count_one_collective_per_bucket) {
  run r = {.nranks = 2};
  r.cfg = loom_ddp_cfg_default();
  r.cfg.buckets.first_bucket_bytes = 16;
  r.cfg.buckets.bucket_bytes = 700;
  check_run(&r, 2e-6f);
  uint64_t control = 2 + MODEL_NPARAMS; /* parameter check (2) + broadcasts */
  LT_EQ(r.stats[0].collectives, control + STEPS * r.stats[0].buckets);
  LT_EQ(r.stats[0].bytes, (uint64_t)STEPS * r.bucket_numel[0] * 4);
  /* the buckets hold the gradients and at most an alignment's padding after each */
  LT_TRUE(r.bucket_numel[0] >= model_numel());
  LT_TRUE(r.bucket_numel[0] < model_numel() + MODEL_NPARAMS * (LOOM_LAYOUT_ALIGN_BYTES / 4));
  LT_TRUE(r.stats[0].buckets < MODEL_NPARAMS + 1);
}

/* ---- ranks that disagree ---------------------------------------------------------------- */

typedef struct bad {
  int kind; /* 0 count, 1 shape, 2 dtype, 3 order */
} bad;

static int bad_rank_fn(loom_pg *pg, void *arg) {
  bad *b = arg;
  int rank = loom_pg_rank(pg);
  loom_tensor *p[3] = {0};
  const char *names[3] = {"a", "b", "c"};
  int64_t s1[] = {4}, s2[] = {3, 2};
  size_t n = (b->kind == 0 && rank == 1) ? 3 : 2;
  int rc = loom_tensor_zeros(b->kind == 2 && rank == 1 ? LOOM_BF16 : LOOM_F32, 1, s1, &p[0]);
  if (!rc) rc = loom_tensor_zeros(LOOM_F32, b->kind == 1 && rank == 1 ? 1 : 2, b->kind == 1 && rank == 1 ? s1 : s2, &p[1]);
  if (!rc) rc = loom_tensor_zeros(LOOM_F32, 1, s1, &p[2]);
  for (int i = 0; !rc && i < 3; i++) rc = loom_tensor_set_requires_grad(p[i], true);
  if (b->kind == 3 && rank == 1) {
    names[0] = "b";
    names[1] = "a";
  }
  loom_ddp *d = NULL;
  if (!rc) rc = loom_ddp_create(pg, p, names, n, NULL, &d);
  loom_ddp_free(d);
  for (int i = 0; i < 3; i++) loom_tensor_free(p[i]);
  return rc;
}

LT_TEST(ddp_ranks_that_disagree_get_an_error) {
  loom_pg_cfg cfg = loom_pg_cfg_default();
  cfg.timeout_s = 20;
  bad b = {0};
  LT_ERR(loom_threads_run(2, &cfg, bad_rank_fn, &b), LOOM_EMISUSE, "parameter count");
  b.kind = 1;
  LT_ERR(loom_threads_run(2, &cfg, bad_rank_fn, &b), LOOM_ESHAPE, "shape of parameter 1 (b)");
  b.kind = 2;
  LT_ERR(loom_threads_run(2, &cfg, bad_rank_fn, &b), LOOM_EDTYPE, "dtype of parameter 0 (a)");
  b.kind = 3;
  LT_ERR(loom_threads_run(2, &cfg, bad_rank_fn, &b), LOOM_EMISUSE, "order of parameters");
}

/* A parameter that gets no gradient on one rank: an error naming it, and no hang. */
static int unused_fn(loom_pg *pg, void *arg) {
  (void)arg;
  model m;
  int rc = model_init(&m, 1);
  loom_ddp *d = NULL;
  if (!rc) rc = loom_ddp_create(pg, m.p, model_names, MODEL_NPARAMS, NULL, &d);
  if (!rc && loom_pg_rank(pg) == 1) { /* only a loss of fc1: fc2 gets nothing */
    loom_tensor *h = NULL, *s = NULL;
    int64_t xs[2] = {2, MODEL_IN};
    loom_tensor *x = NULL;
    rc = loom_tensor_zeros(LOOM_F32, 2, xs, &x);
    if (!rc) rc = loom_linear(x, m.p[0], m.p[1], &h);
    if (!rc) rc = loom_sum(h, NULL, 0, false, &s);
    if (!rc) rc = loom_backward(s, NULL, false);
    loom_tensor_free(x);
    loom_tensor_free(h);
    loom_tensor_free(s);
  } else if (!rc) {
    rc = model_backward(&m, 0, 2, 1.0f);
  }
  int fin = loom_ddp_finish(d);
  if (!rc) rc = fin;
  loom_ddp_free(d);
  model_free(&m);
  return rc;
}

LT_TEST(ddp_unused_parameter_is_an_error_not_a_hang) {
  loom_pg_cfg cfg = loom_pg_cfg_default();
  cfg.timeout_s = 20;
  LT_ERR(loom_threads_run(2, &cfg, unused_fn, NULL), LOOM_EMISUSE, "got no gradient");
}

LT_TEST(ddp_bad_arguments) {
  loom_ddp *d = (loom_ddp *)1;
  LT_ERR(loom_ddp_create(NULL, NULL, NULL, 0, NULL, &d), LOOM_EINVAL, "process group is NULL");
  LT_TRUE(d == NULL);
  LT_ERR(loom_ddp_finish(NULL), LOOM_EINVAL, "ddp is NULL");
  loom_ddp_free(NULL);
}

/* ---- an f16 wire keeps the anchors' divide-first range ------------------------------------ */

/* Rank 0's gradients are 70000 (past f16's 65504), rank 1's -60000: the average, 5000, fits in
 * f16 only if each rank divides before casting to the wire. An f32 and a bf16 parameter, both
 * sent as f16. out[rank * 2 + k]: parameter k's first gradient element after averaging. */
static int wire_range_fn(loom_pg *pg, void *arg) {
  float *out = arg;
  int rank = loom_pg_rank(pg);
  int64_t shape[1] = {4};
  loom_tensor *p[2] = {0}, *c[2] = {0};
  loom_dtype dts[2] = {LOOM_F32, LOOM_BF16};
  int rc = LOOM_OK;
  for (int k = 0; k < 2 && !rc; k++) {
    rc = loom_tensor_zeros(dts[k], 1, shape, &p[k]);
    if (!rc) rc = loom_tensor_set_requires_grad(p[k], true);
    if (!rc) rc = loom_tensor_zeros(dts[k], 1, shape, &c[k]);
    if (!rc) rc = loom_tensor_fill(c[k], rank == 0 ? 70000.0 : -60000.0);
  }
  loom_ddp_cfg cfg = loom_ddp_cfg_default();
  cfg.wire_dtype_set = true;
  cfg.wire_dtype = LOOM_F16;
  loom_ddp *d = NULL;
  if (!rc) rc = loom_ddp_create(pg, p, NULL, 2, &cfg, &d);
  loom_tensor *m[2] = {0}, *s[2] = {0}, *f = NULL, *loss = NULL;
  for (int k = 0; k < 2 && !rc; k++) {
    rc = loom_mul(p[k], c[k], &m[k]);
    if (!rc) rc = loom_sum(m[k], NULL, 0, false, &s[k]);
  }
  if (!rc) rc = loom_cast(s[1], LOOM_F32, &f);
  if (!rc) rc = loom_add(s[0], f, &loss);
  if (!rc) rc = loom_backward(loss, NULL, false);
  for (int k = 0; k < 2 && !rc; k++) {
    double v = 0;
    rc = loom_tensor_get(loom_tensor_grad(p[k]), (int64_t[]){0}, &v);
    out[rank * 2 + k] = (float)v;
  }
  loom_ddp_free(d);
  for (int k = 0; k < 2; k++) {
    loom_tensor_free(p[k]), loom_tensor_free(c[k]), loom_tensor_free(m[k]);
    loom_tensor_free(s[k]);
  }
  loom_tensor_free(f);
  loom_tensor_free(loss);
  return rc;
}

LT_TEST(ddp_f16_wire_divides_before_the_cast) {
  float out[4] = {0};
  LT_OK(loom_threads_run(2, NULL, wire_range_fn, out));
  /* f32: (70000 - 60000) / 2; bf16 holds 70144 and -59904: 5120 (each within f16 rounding) */
  for (int rank = 0; rank < 2; rank++) {
    LT_NEAR(out[rank * 2], 5000.0f, 5000.0f * 2e-3f);
    LT_NEAR(out[rank * 2 + 1], 5120.0f, 5120.0f * 2e-3f);
  }
}
