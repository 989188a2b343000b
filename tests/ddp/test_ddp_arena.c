/* test_ddp_arena.c: one gradient storage under DDP. A module's optimizer built over its flat
 * arena (loom_module_arena, the recipe nn.h recommends) trains under DDP, and ends with the
 * same bits as one built over per-parameter segments, under both bucket policies: with the
 * default policy each bucket is a view of the module's gradient arena (no second buffer),
 * with largest-first the gradients stay where they are and are copied in and out; and as one
 * built over loom_ddp_segments (a segment per bucket). A failed
 * bucket reduction is reported by every later test and wait of the bucket. */
#include "lt.h"
#include "loom/ddp.h"
#include "loom/loom.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define TRY(call)                                                                             \
  do {                                                                                        \
    rc = (call);                                                                              \
    if (rc) goto done;                                                                        \
  } while (0)

enum { RANKS = 2, ROWS = 8, STEPS = 12, IN = 12, CLASSES = 4 };
static const int64_t SIZES[] = {IN, 24, 16, CLASSES};

typedef enum opt_over { OVER_ARENA, OVER_PARAMS, OVER_BUCKETS } opt_over;

typedef struct run {
  opt_over over;
  loom_bucket_policy policy;
  float *weights[RANKS]; /* the arena's values after training */
  size_t nweights;
  double loss_first, loss_last; /* rank 0 */
  bool buckets_in_arena;        /* rank 0: every bucket's buffer lies inside the gradient arena */
  int segments_rc;              /* OVER_BUCKETS: what loom_ddp_segments said */
} run;

/* This rank's batch of step s: a deterministic pattern, different on each rank. */
static int make_batch(int rank, int s, loom_tensor **x, loom_tensor **y) {
  int64_t xs[2] = {ROWS, IN}, ys[1] = {ROWS};
  int rc = loom_tensor_empty(LOOM_F32, 2, xs, x);
  if (!rc) rc = loom_tensor_empty(LOOM_I64, 1, ys, y);
  if (rc) return rc;
  float *xd = loom_tensor_data(*x);
  int64_t *yd = loom_tensor_data(*y);
  for (int i = 0; i < ROWS; i++) {
    int row = (s * RANKS + rank) * ROWS + i;
    yd[i] = row % CLASSES;
    for (int j = 0; j < IN; j++)
      xd[i * IN + j] = (float)sin(0.37 * row + 0.91 * j) + (j == (int)yd[i] ? 1.0f : 0.0f);
  }
  return LOOM_OK;
}

static int rank_fn(loom_pg *pg, void *arg) {
  run *r = arg;
  int rank = loom_pg_rank(pg), rc = LOOM_OK;
  loom_module *m = NULL;
  loom_ddp *ddp = NULL;
  loom_optim *opt = NULL;
  loom_tensor *params[8] = {0};
  loom_param_seg segs[8];
  size_t nseg = 0;
  TRY(loom_nn_mlp_create(SIZES, 4, LOOM_ACT_RELU, LOOM_F32, 7, &m));
  size_t np = loom_module_param_count(m);
  loom_tensor *wa = NULL, *ga = NULL;
  size_t numel = 0;
  TRY(loom_module_arena(m, LOOM_F32, &wa, &ga, &numel));
  if (r->over == OVER_ARENA) { /* the optimizer is made first, as a user would */
    segs[nseg++] = (loom_param_seg){"arena", loom_tensor_data(wa), loom_tensor_data(ga), numel, 0};
  }
  for (size_t i = 0; i < np; i++) {
    loom_param p;
    TRY(loom_module_param(m, i, &p));
    params[i] = p.value;
    if (r->over == OVER_PARAMS)
      segs[nseg++] = (loom_param_seg){p.name, loom_tensor_data(p.value), loom_tensor_data(p.grad),
                                      p.numel, 0};
  }
  loom_adam_cfg ac = loom_adam_cfg_default();
  ac.lr = 0.01;
  if (r->over != OVER_BUCKETS) TRY(loom_optim_create_adam(segs, nseg, &ac, &opt));
  loom_ddp_cfg dc = loom_ddp_cfg_default();
  dc.buckets.policy = r->policy;
  dc.buckets.first_bucket_bytes = 512; /* several buckets for this small model */
  dc.buckets.bucket_bytes = 1024;
  TRY(loom_ddp_create(pg, params, NULL, np, &dc, &ddp));
  if (r->over == OVER_BUCKETS) { /* one segment per bucket, as FSDP gives one per unit */
    const loom_param_seg *bsegs = NULL;
    size_t nb = 0;
    rc = loom_ddp_segments(ddp, &bsegs, &nb);
    if (rank == 0) r->segments_rc = rc;
    TRY(rc);
    TRY(loom_optim_create_adam(bsegs, nb, &ac, &opt));
  }
  if (rank == 0) { /* where the buckets live */
    loom_bucket_manager *bm = loom_ddp_buckets(ddp);
    const char *lo = loom_tensor_data(ga), *hi = lo + numel * sizeof(float);
    r->buckets_in_arena = loom_bucket_manager_count(bm) > 1;
    for (size_t b = 0; b < loom_bucket_manager_count(bm); b++) {
      loom_bucket_info info;
      TRY(loom_bucket_manager_info(bm, b, &info));
      const char *d = loom_tensor_data(info.buffer);
      if (d < lo || d + loom_tensor_nbytes(info.buffer) > hi) r->buckets_in_arena = false;
    }
  }
  for (int s = 0; s < STEPS; s++) {
    loom_tensor *x = NULL, *y = NULL, *logits = NULL, *loss = NULL;
    double v = 0;
    rc = make_batch(rank, s, &x, &y);
    if (!rc) rc = loom_module_zero_grad(m);
    if (!rc) rc = loom_module_forward(m, x, &logits);
    if (!rc) rc = loom_cross_entropy(logits, y, LOOM_REDUCTION_MEAN, -100, &loss);
    if (!rc) rc = loom_backward(loss, NULL, false);
    if (!rc) rc = loom_ddp_finish(ddp);
    if (!rc) rc = loom_optim_step(opt);
    if (!rc && rank == 0) rc = loom_tensor_item(loss, &v);
    if (!rc && rank == 0 && s == 0) r->loss_first = v;
    if (!rc && rank == 0) r->loss_last = v;
    loom_tensor_free(x), loom_tensor_free(y), loom_tensor_free(logits), loom_tensor_free(loss);
    if (rc) goto done;
  }
  if (rank == 0) r->nweights = numel; /* one writer: the ranks are threads */
  r->weights[rank] = malloc(numel * sizeof(float));
  if (!r->weights[rank]) TRY(LOOM_ENOMEM);
  memcpy(r->weights[rank], loom_tensor_data(wa), numel * sizeof(float));
done:
  loom_optim_free(opt);
  loom_ddp_free(ddp);
  loom_module_free(m);
  return rc;
}

static run train(opt_over over, loom_bucket_policy policy) {
  run r = {.over = over, .policy = policy};
  LT_OK(loom_threads_run(RANKS, NULL, rank_fn, &r));
  return r;
}

/* Largest-first buckets over an arena are buffers of their own (gradients copied in and out):
 * no bucket segments, and a message that says what to use instead. */
LT_TEST(ddp_segments_refused_where_buckets_are_not_views_of_the_arena) {
  run r = {.over = OVER_BUCKETS, .policy = LOOM_BUCKET_LARGEST_FIRST};
  LT_ERR(loom_threads_run(RANKS, NULL, rank_fn, &r), LOOM_ENOSYS, "loom_module_arena");
  LT_EQ(r.segments_rc, LOOM_ENOSYS);
  for (int k = 0; k < RANKS; k++) free(r.weights[k]);
}

static void run_free(run *r) {
  for (int k = 0; k < RANKS; k++) free(r->weights[k]);
}

LT_TEST(ddp_optimizer_over_the_arena_trains_and_matches_per_parameter_segments) {
  run ref = train(OVER_PARAMS, LOOM_BUCKET_REVERSE_ORDER);
  LT_TRUE(ref.weights[0] && ref.weights[1]);
  if (!ref.weights[0] || !ref.weights[1]) return;
  if (ref.loss_last >= ref.loss_first * 0.9) /* it trains */
    lt_fail_at(__FILE__, __LINE__, "loss %.4f -> %.4f", ref.loss_first, ref.loss_last);
  LT_TRUE(memcmp(ref.weights[0], ref.weights[1], ref.nweights * sizeof(float)) == 0);
  LT_TRUE(ref.buckets_in_arena); /* the default policy: buckets are views of the arena */
  struct {
    opt_over over;
    loom_bucket_policy policy;
  } cases[] = {{OVER_ARENA, LOOM_BUCKET_REVERSE_ORDER},
               {OVER_BUCKETS, LOOM_BUCKET_REVERSE_ORDER},
               {OVER_ARENA, LOOM_BUCKET_LARGEST_FIRST},
               {OVER_PARAMS, LOOM_BUCKET_LARGEST_FIRST}};
  for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
    run r = train(cases[c].over, cases[c].policy);
    LT_EQ(r.nweights, ref.nweights);
    for (int k = 0; k < RANKS && r.nweights == ref.nweights; k++) {
      LT_TRUE(r.weights[k] != NULL);
      if (!r.weights[k]) continue;
      size_t diff = 0;
      for (size_t i = 0; i < r.nweights; i++)
        diff += memcmp(&r.weights[k][i], &ref.weights[0][i], sizeof(float)) != 0;
      if (diff)
        lt_fail_at(__FILE__, __LINE__, "case %zu rank %d: %zu of %zu weights differ from the "
                   "per-parameter run", c, k, diff, r.nweights);
    }
    LT_TRUE(r.loss_first == ref.loss_first && r.loss_last == ref.loss_last);
    if (cases[c].policy == LOOM_BUCKET_REVERSE_ORDER) LT_TRUE(r.buckets_in_arena);
    run_free(&r);
  }
  run_free(&ref);
}

/* ---- a failed reduction stays failed ------------------------------------------------------- */

typedef struct fail_run {
  atomic_int started; /* rank 0 has started its reduction */
  int first, second, wait; /* rank 0's test, test again, wait */
  bool reduced;
  char message[256];
} fail_run;

static int fail_fn(loom_pg *pg, void *arg) {
  fail_run *f = arg;
  int rank = loom_pg_rank(pg);
  if (rank == 1) { /* never joins: aborts once rank 0's reduction is under way */
    while (!atomic_load(&f->started)) nanosleep(&(struct timespec){0, 1000000}, NULL);
    return loom_pg_abort(pg);
  }
  int64_t len = 64;
  loom_tensor *g = NULL;
  loom_bucket_manager *m = NULL;
  int rc = loom_tensor_zeros(LOOM_F32, 1, &len, &g);
  if (!rc) rc = loom_bucket_manager_create(pg, &g, 1, NULL, &m);
  if (!rc) rc = loom_bucket_reduce_async(m, 0, LOOM_SUM);
  atomic_store(&f->started, 1);
  if (!rc) {
    do { /* until the abort reaches the reduction */
      f->reduced = true;
      f->first = loom_bucket_test(m, 0, &f->reduced);
    } while (f->first == LOOM_OK && !f->reduced);
    snprintf(f->message, sizeof f->message, "%s", loom_last_error());
    f->reduced = true;
    f->second = loom_bucket_test(m, 0, &f->reduced);
    f->wait = loom_bucket_wait(m, 0);
  }
  loom_bucket_manager_free(m);
  loom_tensor_free(g);
  return rc;
}

LT_TEST(bucket_failed_reduction_is_reported_by_every_later_call) {
  fail_run f = {0};
  (void)loom_threads_run(RANKS, NULL, fail_fn, &f); /* the group fails: that is the point */
  LT_TRUE(f.first != LOOM_OK);
  LT_EQ(f.second, f.first);
  LT_EQ(f.wait, f.first);
  LT_TRUE(!f.reduced);
  LT_TRUE(strstr(f.message, "bucket 0") != NULL);
}
