/* test_step.c: the one training-step recipe (loom/step.h). One rank function runs the same
 * calls with no strategy, under DDP and under FSDP; only the object the step is made over
 * differs. In f32, 2 ranks with half the batch each end where one process with the whole batch
 * does (the three differ only by f32 summation order), with and without clipping, and report
 * the same gradient norm; with f16 loss scaling, an overflow on one rank makes every rank skip
 * that same step and back its scale off; an optimizer that does not read the step's gradients
 * is refused, naming the segment; loom_step_scaler is the scaler the loss is scaled with
 * (FSDP's mixed-precision one), whose scale apply reports. */
#include "lt.h"
#include "loom/loom.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define TRY(call)                                                                             \
  do {                                                                                        \
    rc = (call);                                                                              \
    if (rc) goto done;                                                                        \
  } while (0)

enum { STEPS = 6, BAD_STEP = 3, ROWS = 16, IN = 12, CLASSES = 4, MAXR = 2 };
static const int64_t SIZES[] = {IN, 32, 16, CLASSES};

typedef enum strategy { NONE, DDP, FSDP } strategy;

typedef struct run {
  strategy strat;
  int ranks;
  bool f16;      /* f16 autocast with loss scaling */
  bool clip;
  bool bad_step; /* rank ranks-1's loss overflows at BAD_STEP */
  bool for_module; /* the optimizer and DDP made by loom_adam_create_for_module and
                      loom_ddp_create_for_module instead of by hand */
  float *weights; /* rank 0: the full model after training, in parameter order */
  size_t nweights;
  bool skipped[MAXR][STEPS];
  float scale[MAXR][STEPS];
  double norm[STEPS]; /* rank 0 */
  bool own_scaler[MAXR]; /* loom_step_scaler: the scaler the loss is scaled with, or NULL */
} run;

/* Global batch of step s (ROWS rows); this rank takes rows [rank * per, (rank + 1) * per). */
static int batch(const run *r, int rank, int s, loom_tensor **x, loom_tensor **y) {
  int64_t per = ROWS / r->ranks, xs[2] = {per, IN}, ys[1] = {per};
  int rc = loom_tensor_empty(LOOM_F32, 2, xs, x);
  if (!rc) rc = loom_tensor_empty(LOOM_I64, 1, ys, y);
  if (rc) return rc;
  float *xd = loom_tensor_data(*x);
  int64_t *yd = loom_tensor_data(*y);
  for (int64_t i = 0; i < per; i++) {
    int64_t row = (int64_t)s * ROWS + rank * per + i;
    yd[i] = row % CLASSES;
    for (int j = 0; j < IN; j++)
      xd[i * IN + j] = (float)sin(0.29 * (double)row + 0.77 * j) + (j == (int)yd[i] ? 1.0f : 0.0f);
  }
  return LOOM_OK;
}

/* The full model's values into r->weights (rank 0), from the module or FSDP's full state. */
static int collect(run *r, int rank, loom_module *m, loom_fsdp *f) {
  loom_named_tensor *state = NULL;
  size_t n = 0;
  int rc = LOOM_OK;
  if (f) TRY(loom_fsdp_full_state(f, &state, &n));
  if (rank != 0) goto done;
  size_t np = loom_module_param_count(m), at = 0;
  r->nweights = loom_module_numel(m);
  r->weights = malloc(r->nweights * sizeof(float));
  if (!r->weights) TRY(LOOM_ENOMEM);
  for (size_t i = 0; i < np; i++) {
    loom_param p;
    TRY(loom_module_param(m, i, &p));
    const loom_tensor *t = f ? state[i].tensor : p.value;
    memcpy(r->weights + at, loom_tensor_data((loom_tensor *)t), p.numel * sizeof(float));
    at += p.numel;
  }
done:
  loom_fsdp_state_free(state, n);
  return rc;
}

/* The same recipe under every strategy. */
static int rank_fn(loom_pg *pg, void *arg) {
  run *r = arg;
  int rank = pg ? loom_pg_rank(pg) : 0, rc = LOOM_OK;
  loom_module *m = NULL;
  loom_ddp *ddp = NULL;
  loom_fsdp *fsdp = NULL;
  loom_optim *opt = NULL;
  loom_scaler *scaler = NULL;
  loom_step *st = NULL;
  TRY(loom_nn_mlp_create(SIZES, 4, LOOM_ACT_RELU, LOOM_F32, 11, &m));
  loom_step_cfg sc = loom_step_cfg_default();
  sc.module = m;
  sc.clip = r->clip;
  sc.max_norm = 0.05; /* below every step's norm here (0.1-0.2): clipping acts */
  loom_adam_cfg ac = loom_adam_cfg_default();
  ac.lr = 0.01;
  if (r->strat == FSDP) {
    loom_fsdp_cfg fc = loom_fsdp_cfg_default();
    fc.mp = loom_fsdp_mp_cfg_for(r->f16 ? LOOM_F16 : LOOM_F32);
    fc.mp.initial_loss_scale = 1024;
    fc.mp.max_loss_scale = 65536;
    TRY(loom_fsdp_create(pg, m, &fc, &fsdp));
    const loom_param_seg *segs = NULL;
    size_t nseg = 0;
    TRY(loom_fsdp_segments(fsdp, &segs, &nseg));
    if (r->for_module) TRY(loom_adam_create_for_module(m, &ac, &opt)); /* finds the shards */
    else TRY(loom_optim_create_adam(segs, nseg, &ac, &opt));
    sc.fsdp = fsdp;
  } else {
    if (r->for_module) {
      TRY(loom_adam_create_for_module(m, &ac, &opt));
    } else {
      loom_tensor *w = NULL, *g = NULL;
      size_t numel = 0;
      TRY(loom_module_arena(m, LOOM_F32, &w, &g, &numel));
      loom_param_seg seg = {"mlp", loom_tensor_data(w), loom_tensor_data(g), numel, 0};
      TRY(loom_optim_create_adam(&seg, 1, &ac, &opt));
    }
    if (r->f16) {
      loom_dynamic_scaler_cfg dc = loom_dynamic_scaler_cfg_default();
      dc.initial_scale = 1024;
      TRY(loom_scaler_create_dynamic(&dc, &scaler));
      sc.scaler = scaler;
    }
    if (r->strat == DDP && r->for_module) {
      TRY(loom_ddp_create_for_module(pg, m, NULL, &ddp));
      sc.ddp = ddp;
    } else if (r->strat == DDP) {
      loom_tensor *params[8];
      size_t np = loom_module_param_count(m);
      for (size_t i = 0; i < np; i++) {
        loom_param p;
        TRY(loom_module_param(m, i, &p));
        params[i] = p.value;
      }
      TRY(loom_ddp_create(pg, params, NULL, np, NULL, &ddp));
      sc.ddp = ddp;
    }
  }
  sc.optim = opt;
  TRY(loom_step_create(&sc, &st));
  loom_scaler *want = fsdp ? loom_fsdp_mp_scaler(loom_fsdp_mp_manager(fsdp)) : scaler;
  r->own_scaler[rank] = loom_step_scaler(st) == want && (want != NULL) == r->f16 &&
                        loom_step_scaler(NULL) == NULL;
  for (int s = 0; s < STEPS; s++) {
    loom_tensor *x = NULL, *y = NULL, *logits = NULL, *loss = NULL, *big = NULL;
    loom_autocast_token tok = {0};
    loom_step_result res;
    rc = batch(r, rank, s, &x, &y);
    if (!rc) rc = loom_step_zero_grad(st);
    if (!rc && r->f16) rc = loom_autocast_enter(LOOM_AUTOCAST_F16, NULL, &tok);
    if (!rc) rc = loom_module_forward(m, x, &logits);
    if (!rc) rc = loom_cross_entropy(logits, y, LOOM_REDUCTION_MEAN, -100, &loss);
    if (tok.owner) {
      int rc2 = loom_autocast_exit(&tok);
      if (!rc) rc = rc2;
    }
    bool bad = r->bad_step && s == BAD_STEP && rank == r->ranks - 1;
    if (!rc && bad) rc = loom_mul_scalar(loss, 1e38, &big); /* x scale: inf on this rank */
    if (!rc) rc = loom_step_backward(st, big ? big : loss);
    if (!rc) rc = loom_step_apply(st, &res);
    if (!rc) {
      r->skipped[rank][s] = res.skipped;
      r->scale[rank][s] = res.scale;
      if (want && res.scale != loom_scaler_get_scale(want)) r->own_scaler[rank] = false;
      if (rank == 0) r->norm[s] = res.grad_norm;
    }
    loom_tensor_free(x), loom_tensor_free(y), loom_tensor_free(logits);
    loom_tensor_free(loss), loom_tensor_free(big);
    if (rc) goto done;
  }
  TRY(collect(r, rank, m, fsdp));
done:
  loom_step_free(st);
  loom_optim_free(opt);
  loom_scaler_free(scaler);
  loom_ddp_free(ddp);
  loom_fsdp_free(fsdp);
  loom_module_free(m);
  return rc;
}

static run train_with(strategy strat, bool f16, bool clip, bool bad_step, bool for_module) {
  run r = {.strat = strat, .ranks = strat == NONE ? 1 : 2, .f16 = f16, .clip = clip,
           .bad_step = bad_step, .for_module = for_module};
  LT_OK(loom_threads_run(r.ranks, NULL, rank_fn, &r));
  return r;
}

static run train(strategy strat, bool f16, bool clip, bool bad_step) {
  return train_with(strat, f16, clip, bad_step, false);
}

/* Two runs ended at the same weights, to f32 summation order. */
static void expect_close(const run *a, const run *b, const char *what) {
  LT_TRUE(a->weights && b->weights && a->nweights == b->nweights);
  if (!a->weights || !b->weights || a->nweights != b->nweights) return;
  double worst = 0;
  for (size_t i = 0; i < a->nweights; i++) {
    double e = fabs((double)a->weights[i] - b->weights[i]);
    if (e > worst) worst = e;
  }
  if (!(worst <= 2e-5))
    lt_fail_at(__FILE__, __LINE__, "%s: weights differ by up to %g", what, worst);
}

LT_TEST(step_recipe_is_the_same_under_none_ddp_and_fsdp) {
  for (int clip = 0; clip < 2; clip++) {
    run none = train(NONE, false, clip, false);
    run ddp = train(DDP, false, clip, false);
    run fsdp = train(FSDP, false, clip, false);
    expect_close(&none, &ddp, clip ? "DDP with clipping" : "DDP");
    expect_close(&none, &fsdp, clip ? "FSDP with clipping" : "FSDP");
    LT_TRUE(none.own_scaler[0] && ddp.own_scaler[1] && fsdp.own_scaler[1]); /* NULL: f32 */
    for (int s = 0; s < STEPS; s++) {
      LT_TRUE(!none.skipped[0][s] && !ddp.skipped[1][s] && !fsdp.skipped[1][s]);
      if (!clip) {
        LT_TRUE(isnan(none.norm[s]) && isnan(fsdp.norm[s]));
        continue;
      }
      /* the global norm, whichever way it was summed */
      if (!(none.norm[s] > 0.05)) lt_fail_at(__FILE__, __LINE__, "step %d: norm %g", s, none.norm[s]);
      LT_NEAR(ddp.norm[s], none.norm[s], 1e-4 * none.norm[s]);
      LT_NEAR(fsdp.norm[s], none.norm[s], 1e-4 * none.norm[s]);
    }
    free(none.weights), free(ddp.weights), free(fsdp.weights);
  }
}

LT_TEST(step_recipe_overflow_on_one_rank_skips_that_step_on_every_rank) {
  for (int strat = NONE; strat <= FSDP; strat++) {
    run r = train((strategy)strat, true, true, true);
    for (int k = 0; k < r.ranks; k++) LT_TRUE(r.own_scaler[k]); /* FSDP: its mp scaler */
    for (int k = 0; k < r.ranks; k++)
      for (int s = 0; s < STEPS; s++) {
        LT_EQ(r.skipped[k][s], s == BAD_STEP);
        LT_EQ(r.scale[k][s], s < BAD_STEP ? 1024.0f : 512.0f); /* backed off once, no growth */
      }
    LT_TRUE(isnan(r.norm[BAD_STEP]) && isfinite(r.norm[0]));
    LT_TRUE(r.weights != NULL);
    for (size_t i = 0; r.weights && i < r.nweights; i++)
      if (!isfinite(r.weights[i])) {
        lt_fail_at(__FILE__, __LINE__, "strategy %d: weight %zu is %g", strat, i, r.weights[i]);
        break;
      }
    free(r.weights);
  }
}

LT_TEST(step_refuses_an_optimizer_that_does_not_read_its_gradients) {
  loom_module *m = NULL;
  LT_OK(loom_nn_mlp_create(SIZES, 4, LOOM_ACT_RELU, LOOM_F32, 11, &m));
  size_t n = loom_module_numel(m);
  float *w = calloc(n, sizeof(float)), *g = calloc(n, sizeof(float));
  loom_param_seg seg = {"elsewhere", w, g, n, 0};
  loom_optim *opt = NULL;
  loom_sgd_cfg sgd = loom_sgd_cfg_default();
  LT_OK(loom_optim_create_sgd(&seg, 1, &sgd, &opt));
  loom_step_cfg c = loom_step_cfg_default();
  c.module = m;
  c.optim = opt;
  loom_step *st = (loom_step *)1;
  LT_ERR(loom_step_create(&c, &st), LOOM_EMISUSE, "segment 0 (elsewhere) does not read");
  LT_TRUE(st == NULL);
  c.optim = NULL;
  LT_ERR(loom_step_create(&c, &st), LOOM_EINVAL, "optim is NULL");
  c.optim = opt;
  c.clip = true;
  c.max_norm = NAN;
  LT_ERR(loom_step_create(&c, &st), LOOM_EINVAL, "max_norm");
  c.clip = false;
  c.module = NULL;
  LT_ERR(loom_step_create(&c, &st), LOOM_EINVAL, "module is NULL");
  loom_param_seg got;
  LT_OK(loom_optim_segment(opt, 0, &got));
  LT_TRUE(got.grad == g && got.n == n && !strcmp(got.name, "elsewhere"));
  LT_ERR(loom_optim_segment(opt, 1, &got), LOOM_EINVAL, "segment 1 out of range (1 segments)");
  LT_ERR(loom_optim_segment(opt, 0, NULL), LOOM_EINVAL, "out is NULL");
  LT_ERR(loom_step_apply(NULL, NULL), LOOM_EINVAL, "step is NULL");
  loom_optim_free(opt);
  loom_module_free(m);
  free(w);
  free(g);
}

/* loom_adam_create_for_module (and loom_ddp_create_for_module) train exactly as the four-line
 * form: the same segments over the same gradients, so the same bits, under every strategy. */
LT_TEST(step_optimizer_for_module_trains_as_the_four_line_form) {
  for (strategy st = NONE; st <= FSDP; st++) {
    run hand = train_with(st, st != DDP, true, false, false);
    run mod = train_with(st, st != DDP, true, false, true);
    LT_TRUE(hand.weights && mod.weights && hand.nweights == mod.nweights);
    if (hand.weights && mod.weights && hand.nweights == mod.nweights &&
        memcmp(hand.weights, mod.weights, hand.nweights * sizeof(float)) != 0)
      lt_fail_at(__FILE__, __LINE__, "strategy %d: the weights differ", (int)st);
    for (int s = 0; s < STEPS; s++) LT_TRUE(hand.norm[s] == mod.norm[s]);
    free(hand.weights), free(mod.weights);
  }
}

LT_TEST(step_optimizer_for_module_refuses_what_it_cannot_step) {
  loom_optim *opt = NULL;
  LT_EQ(loom_adamw_create_for_module(NULL, NULL, &opt), LOOM_EINVAL);
  LT_TRUE(opt == NULL);
  loom_module *m = NULL, *kids[2] = {NULL, NULL}, *seq = NULL, *half = NULL;
  LT_OK(loom_nn_mlp_create(SIZES, 4, LOOM_ACT_RELU, LOOM_F32, 11, &m));
  LT_EQ(loom_adamw_create_for_module(m, NULL, NULL), LOOM_EINVAL);
  LT_OK(loom_nn_linear_create(4, 3, true, LOOM_F32, 1, &kids[0]));
  LT_OK(loom_nn_linear_create(3, 2, true, LOOM_F32, 2, &kids[1]));
  loom_module *child = kids[0];
  LT_OK(loom_nn_sequential_create(kids, 2, &seq)); /* owns the children now */
  LT_EQ(loom_sgd_create_for_module(child, NULL, &opt), LOOM_EMISUSE); /* not the root */
  LT_OK(loom_nn_linear_create(4, 3, true, LOOM_BF16, 1, &half));
  LT_EQ(loom_adamw_create_for_module(half, NULL, &opt), LOOM_EDTYPE);
  LT_TRUE(strstr(loom_last_error(), "no f32 parameters") != NULL);
  loom_ddp *ddp = NULL;
  LT_EQ(loom_ddp_create_for_module(NULL, NULL, NULL, &ddp), LOOM_EINVAL); /* no module */
  LT_TRUE(strstr(loom_last_error(), "module is NULL") != NULL);
  LT_EQ(loom_ddp_create_for_module(NULL, m, NULL, &ddp), LOOM_EINVAL);   /* no group */
  LT_EQ(loom_ddp_create_for_module(NULL, m, NULL, NULL), LOOM_EINVAL);
  LT_TRUE(ddp == NULL);
  loom_adam_cfg bad = loom_adamw_cfg_default();
  bad.lr = -1;
  LT_EQ(loom_adamw_create_for_module(m, &bad, &opt), LOOM_EINVAL);
  LT_OK(loom_sgd_create_for_module(m, NULL, &opt)); /* defaults: one segment, the arena */
  LT_EQ(loom_optim_segments(opt), 1);
  loom_param_seg seg;
  LT_OK(loom_optim_segment(opt, 0, &seg));
  LT_EQ(seg.n >= loom_module_numel(m), true);
  loom_optim_free(opt);
  loom_module_free(half);
  loom_module_free(seq);
  loom_module_free(m);
}
