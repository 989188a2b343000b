/* test_autocast.c: the autocast layer. Op kinds, policies and modes by name (and the kinds'
 * alignment with loom/ops.h); the f16 and bf16 presets against PyTorch's autocast lists
 * (written out here independently, by name); the lookup's semantics for each policy; regions:
 * nesting, restore on exit, out-of-order and foreign-thread exits, generations and the exit
 * hook; thread-locality (two threads in different modes at once); run-time policy changes on
 * created and default registries, with the errors of each. */
#include "lt.h"
#include "autocast/autocast_int.h"

#include <pthread.h>
#include <stdatomic.h>

LT_TEST(autocast_names_and_parsing) {
  loom_amp_op op;
  for (int k = 0; k < LOOM_AMP_OP_COUNT; k++) {
    LT_OK(loom_amp_op_parse(loom_amp_op_name((loom_amp_op)k), &op));
    LT_EQ(op, k);
  }
  LT_STREQ(loom_amp_op_name(LOOM_AMP_OP_MATMUL), "matmul");
  LT_STREQ(loom_amp_op_name(LOOM_AMP_OP_COUNT), "?");
  LT_ERR(loom_amp_op_parse("softmx", &op), LOOM_ENOTFOUND, "no op kind \"softmx\"");
  LT_ERR(loom_amp_op_parse(NULL, &op), LOOM_EINVAL, "name is NULL");
  loom_amp_policy p;
  LT_OK(loom_amp_policy_parse("promote", &p));
  LT_EQ(p, LOOM_AMP_PROMOTE);
  LT_STREQ(loom_amp_policy_name(LOOM_AMP_FP32), "fp32");
  LT_STREQ(loom_amp_policy_name((loom_amp_policy)9), "?");
  LT_ERR(loom_amp_policy_parse("fp64", &p), LOOM_ENOTFOUND, "no policy \"fp64\"");
  loom_autocast_mode m;
  LT_OK(loom_autocast_mode_parse("bfloat16", &m));
  LT_EQ(m, LOOM_AUTOCAST_BF16);
  LT_OK(loom_autocast_mode_parse("fp16", &m));
  LT_EQ(m, LOOM_AUTOCAST_F16);
  LT_OK(loom_autocast_mode_parse("off", &m));
  LT_EQ(m, LOOM_AUTOCAST_OFF);
  LT_ERR(loom_autocast_mode_parse("int8", &m), LOOM_ENOTFOUND, "no autocast mode \"int8\"");
  LT_STREQ(loom_autocast_mode_name(LOOM_AUTOCAST_BF16), "bf16");
  LT_EQ(loom_autocast_mode_dtype(LOOM_AUTOCAST_F16), LOOM_F16);
  LT_EQ(loom_autocast_mode_dtype(LOOM_AUTOCAST_BF16), LOOM_BF16);
  LT_EQ(loom_autocast_mode_dtype(LOOM_AUTOCAST_OFF), LOOM_F32);
}

LT_TEST(autocast_kinds_align_with_the_ops_layer) {
  /* every loom_op_kind of loom/ops.h is the loom_amp_op of the same value and name */
  for (int k = 0; k < LOOM_OPK_COUNT; k++)
    LT_STREQ(loom_op_kind_name((loom_op_kind)k), loom_amp_op_name((loom_amp_op)k));
  LT_TRUE((int)LOOM_AMP_OP_COUNT >= (int)LOOM_OPK_COUNT);
}

/* PyTorch's lists (aten/src/ATen/autocast_mode.cpp), by loom kind. */
/* + attention: no such op in 1.13; PyTorch 2.x lists it lower_precision_fp on CPU and CUDA */
static const char *lower_both[] = {"matmul", "linear", "conv2d", "bmm", "addmm", "baddbmm",
                                   "scaled_dot_product_attention"};
static const char *promote_both[] = {"add", "sub", "mul", "div", "cat", "stack"};
/* CUDA fp32 + fp32_set_opt_dtype (+ cross_entropy, composed of log_softmax and nll_loss) */
static const char *fp32_f16[] = {"exp",     "log",      "pow",   "softmax",         "log_softmax",
                                 "layer_norm", "group_norm", "sum", "cumsum",      "norm",
                                 "logsumexp", "cross_entropy", "mse", "nll_loss", "l1_loss",
                                 "bce_with_logits", "prod"};
/* CPU fp32 (checked with torch 1.13: softmax, layer_norm, exp, sum... keep a bf16 input bf16) */
static const char *fp32_bf16[] = {"cross_entropy", "mse", "nll_loss", "l1_loss",
                                  "bce_with_logits", "prod"};

static loom_amp_policy expected(const char *name, bool f16) {
#define IN(list)                                                                              \
  for (size_t i = 0; i < sizeof list / sizeof list[0]; i++)                                   \
    if (strcmp(list[i], name) == 0)
  IN(lower_both) return LOOM_AMP_LOWER;
  IN(promote_both) return LOOM_AMP_PROMOTE;
  if (f16) {
    IN(fp32_f16) return LOOM_AMP_FP32;
  } else {
    IN(fp32_bf16) return LOOM_AMP_FP32;
  }
#undef IN
  return LOOM_AMP_NONE;
}

LT_TEST(autocast_presets_follow_pytorch_lists) {
  loom_autocast_mode modes[2] = {LOOM_AUTOCAST_F16, LOOM_AUTOCAST_BF16};
  for (int m = 0; m < 2; m++) {
    loom_amp_registry *r = NULL;
    LT_OK(loom_amp_registry_create(modes[m], &r));
    LT_EQ(loom_amp_registry_preset(r), modes[m]);
    for (int k = 0; k < LOOM_AMP_OP_COUNT; k++) {
      const char *name = loom_amp_op_name((loom_amp_op)k);
      loom_amp_policy want = expected(name, m == 0), got;
      LT_OK(loom_amp_registry_get(r, (loom_amp_op)k, &got));
      if (got != want || loom_amp_preset_policy(modes[m], (loom_amp_op)k) != want)
        lt_fail_at(__FILE__, __LINE__, "%s preset: %s is %s, PyTorch's list says %s",
                   loom_autocast_mode_name(modes[m]), name, loom_amp_policy_name(got),
                   loom_amp_policy_name(want));
      LT_OK(loom_amp_registry_get(loom_amp_registry_default(modes[m]), (loom_amp_op)k, &got));
      LT_EQ(got, want);
    }
    loom_amp_registry_free(r);
  }
  LT_EQ(loom_amp_preset_policy(LOOM_AUTOCAST_OFF, LOOM_AMP_OP_MATMUL), LOOM_AMP_NONE);
  LT_TRUE(loom_amp_registry_default(LOOM_AUTOCAST_OFF) == NULL);
}

LT_TEST(autocast_lookup_semantics) {
  loom_dtype f32 = LOOM_F32, f16 = LOOM_F16, bf16 = LOOM_BF16, i64 = LOOM_I64;
  loom_dtype out = LOOM_I32;
  const loom_autocast_mode F = LOOM_AUTOCAST_F16, B = LOOM_AUTOCAST_BF16;
  /* lower: f32 inputs go to the mode's dtype */
  LT_TRUE(loom_amp_registry_dtype_for(NULL, F, LOOM_AMP_OP_MATMUL, (loom_dtype[]){f32, f32}, 2, &out));
  LT_EQ(out, LOOM_F16);
  LT_TRUE(loom_amp_registry_dtype_for(NULL, B, LOOM_AMP_OP_LINEAR, (loom_dtype[]){bf16, f32, f32}, 3, &out));
  LT_EQ(out, LOOM_BF16);
  LT_TRUE(loom_amp_registry_dtype_for(NULL, B, LOOM_AMP_OP_MATMUL, (loom_dtype[]){f16, f16}, 2, &out));
  LT_EQ(out, LOOM_BF16);
  out = LOOM_I32; /* already the target: nothing to cast, target still reported */
  LT_TRUE(!loom_amp_registry_dtype_for(NULL, F, LOOM_AMP_OP_MATMUL, (loom_dtype[]){f16, f16}, 2, &out));
  LT_EQ(out, LOOM_F16);
  /* fp32 */
  LT_TRUE(loom_amp_registry_dtype_for(NULL, F, LOOM_AMP_OP_SOFTMAX, &f16, 1, &out));
  LT_EQ(out, LOOM_F32);
  LT_TRUE(!loom_amp_registry_dtype_for(NULL, B, LOOM_AMP_OP_SOFTMAX, &bf16, 1, &out)); /* none */
  /* integer inputs (labels) are ignored */
  LT_TRUE(loom_amp_registry_dtype_for(NULL, B, LOOM_AMP_OP_CROSS_ENTROPY, (loom_dtype[]){bf16, i64}, 2, &out));
  LT_EQ(out, LOOM_F32);
  LT_TRUE(!loom_amp_registry_dtype_for(NULL, B, LOOM_AMP_OP_CROSS_ENTROPY, (loom_dtype[]){f32, i64}, 2, &out));
  /* promote: the one dtype, or f32 when they differ (f16 with bf16 too) */
  out = LOOM_I32;
  LT_TRUE(!loom_amp_registry_dtype_for(NULL, F, LOOM_AMP_OP_ADD, (loom_dtype[]){bf16, bf16}, 2, &out));
  LT_EQ(out, LOOM_BF16);
  LT_TRUE(loom_amp_registry_dtype_for(NULL, F, LOOM_AMP_OP_ADD, (loom_dtype[]){bf16, f32}, 2, &out));
  LT_EQ(out, LOOM_F32);
  out = LOOM_I32;
  LT_TRUE(loom_amp_registry_dtype_for(NULL, B, LOOM_AMP_OP_CAT, (loom_dtype[]){f16, bf16, f16}, 3, &out));
  LT_EQ(out, LOOM_F32);
  LT_TRUE(!loom_amp_registry_dtype_for(NULL, B, LOOM_AMP_OP_CAT, &i64, 1, &out));
  /* none, off, nothing to look at, out of range: no cast, *out untouched */
  out = LOOM_I32;
  LT_TRUE(!loom_amp_registry_dtype_for(NULL, F, LOOM_AMP_OP_RELU, &f32, 1, &out));
  LT_TRUE(!loom_amp_registry_dtype_for(NULL, LOOM_AUTOCAST_OFF, LOOM_AMP_OP_MATMUL, &f32, 1, &out));
  LT_TRUE(!loom_amp_registry_dtype_for(NULL, F, LOOM_AMP_OP_MATMUL, &f32, 0, &out));
  LT_TRUE(!loom_amp_registry_dtype_for(NULL, F, LOOM_AMP_OP_COUNT, &f32, 1, &out));
  LT_TRUE(!loom_amp_registry_dtype_for(NULL, (loom_autocast_mode)7, LOOM_AMP_OP_MATMUL, &f32, 1, &out));
  LT_EQ(out, LOOM_I32);
}

static _Atomic int hook_calls;
static _Atomic uint64_t hook_gen;
static void on_exit_hook(uint64_t gen) {
  atomic_fetch_add(&hook_calls, 1);
  atomic_store(&hook_gen, gen);
}

LT_TEST(autocast_regions_nest_and_restore) {
  loom_dtype f32 = LOOM_F32, out;
  LT_EQ(loom_autocast_get_mode(), LOOM_AUTOCAST_OFF);
  LT_TRUE(!loom_autocast_enabled());
  LT_EQ(loom_autocast_depth(), 0);
  LT_EQ(loom_autocast_generation(), 0);
  LT_TRUE(!loom_autocast_dtype_for(LOOM_AMP_OP_MATMUL, &f32, 1, &out));
  loom__autocast_set_exit_hook(on_exit_hook);
  atomic_store(&hook_calls, 0);
  loom_autocast_token outer, mid, inner;
  LT_OK(loom_autocast_enter(LOOM_AUTOCAST_F16, NULL, &outer));
  uint64_t gen = loom_autocast_generation();
  LT_TRUE(gen != 0);
  LT_TRUE(loom_autocast_get_registry() == loom_amp_registry_default(LOOM_AUTOCAST_F16));
  LT_TRUE(loom_autocast_dtype_for(LOOM_AMP_OP_MATMUL, &f32, 1, &out));
  LT_EQ(out, LOOM_F16);
  LT_OK(loom_autocast_enter(LOOM_AUTOCAST_BF16, NULL, &mid));
  LT_EQ(loom_autocast_depth(), 2);
  LT_EQ(loom_autocast_generation(), gen); /* the outermost region's, for the cast cache */
  LT_TRUE(loom_autocast_dtype_for(LOOM_AMP_OP_MATMUL, &f32, 1, &out));
  LT_EQ(out, LOOM_BF16);
  LT_OK(loom_autocast_enter(LOOM_AUTOCAST_OFF, NULL, &inner)); /* autocast(enabled=False) */
  LT_TRUE(!loom_autocast_enabled());
  LT_TRUE(loom_autocast_get_registry() == NULL);
  LT_TRUE(!loom_autocast_dtype_for(LOOM_AMP_OP_MATMUL, &f32, 1, &out));
  LT_ERR(loom_autocast_exit(&mid), LOOM_EMISUSE, "innermost first (token of depth 2, current "
                                                 "depth 3)");
  LT_OK(loom_autocast_exit(&inner));
  LT_EQ(loom_autocast_get_mode(), LOOM_AUTOCAST_BF16);
  LT_ERR(loom_autocast_exit(&inner), LOOM_EMISUSE, "not filled by loom_autocast_enter");
  LT_OK(loom_autocast_exit(&mid));
  LT_EQ(loom_autocast_get_mode(), LOOM_AUTOCAST_F16);
  LT_EQ(atomic_load(&hook_calls), 0);
  LT_OK(loom_autocast_exit(&outer));
  LT_EQ(atomic_load(&hook_calls), 1); /* the cast cache ends with the outermost region */
  LT_EQ(atomic_load(&hook_gen), gen);
  LT_EQ(loom_autocast_depth(), 0);
  LT_EQ(loom_autocast_generation(), 0);
  LT_EQ(loom_autocast_get_mode(), LOOM_AUTOCAST_OFF);
  LT_OK(loom_autocast_enter(LOOM_AUTOCAST_BF16, NULL, &outer));
  LT_TRUE(loom_autocast_generation() != gen); /* a new outermost region, a new cache */
  LT_OK(loom_autocast_exit(&outer));
  loom__autocast_set_exit_hook(NULL);
  LT_ERR(loom_autocast_enter((loom_autocast_mode)5, NULL, &outer), LOOM_EINVAL,
         "mode 5 is not an autocast mode");
  LT_ERR(loom_autocast_enter(LOOM_AUTOCAST_F16, NULL, NULL), LOOM_EINVAL, "token is NULL");
  LT_ERR(loom_autocast_exit(NULL), LOOM_EINVAL, "token is NULL");
  LT_EQ(loom_autocast_depth(), 0);
}

/* ---- threads ---------------------------------------------------------------------------- */

typedef struct thread_job {
  loom_autocast_mode mode;
  pthread_barrier_t *bar;
  loom_autocast_token *foreign; /* a token of the main thread's region, to misuse */
  int wrong;                    /* lookups that saw another thread's state */
  int exit_rc;
} thread_job;

static void *thread_run(void *p) {
  thread_job *j = p;
  loom_dtype f32 = LOOM_F32, out;
  loom_autocast_token tok;
  int wrong = 0;
  if (loom_autocast_get_mode() != LOOM_AUTOCAST_OFF) wrong++; /* a new thread starts off */
  if (loom_autocast_enter(j->mode, NULL, &tok) != LOOM_OK) wrong++;
  pthread_barrier_wait(j->bar); /* both threads inside their regions from here */
  for (int i = 0; i < 20000; i++) {
    bool cast = loom_autocast_dtype_for(LOOM_AMP_OP_MATMUL, &f32, 1, &out);
    if (!cast || out != loom_autocast_mode_dtype(j->mode) || loom_autocast_get_mode() != j->mode)
      wrong++;
  }
  j->exit_rc = loom_autocast_exit(j->foreign);
  pthread_barrier_wait(j->bar);
  if (loom_autocast_exit(&tok) != LOOM_OK) wrong++;
  j->wrong = wrong;
  return NULL;
}

LT_TEST(autocast_state_is_per_thread) {
  pthread_barrier_t bar;
  pthread_barrier_init(&bar, NULL, 3);
  loom_autocast_token mine;
  LT_OK(loom_autocast_enter(LOOM_AUTOCAST_OFF, NULL, &mine));
  thread_job jobs[2] = {{LOOM_AUTOCAST_F16, &bar, &mine, 0, 0},
                        {LOOM_AUTOCAST_BF16, &bar, &mine, 0, 0}};
  pthread_t t[2];
  for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, thread_run, &jobs[i]);
  pthread_barrier_wait(&bar);
  LT_EQ(loom_autocast_get_mode(), LOOM_AUTOCAST_OFF); /* the main thread is unaffected */
  pthread_barrier_wait(&bar);
  for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
  pthread_barrier_destroy(&bar);
  for (int i = 0; i < 2; i++) {
    LT_EQ(jobs[i].wrong, 0);
    LT_EQ(jobs[i].exit_rc, LOOM_EMISUSE); /* another thread's token */
  }
  LT_OK(loom_autocast_exit(&mine));
}

/* ---- run-time changes --------------------------------------------------------------------- */

LT_TEST(autocast_registry_changes_at_run_time) {
  loom_amp_registry *r = NULL;
  LT_OK(loom_amp_registry_create(LOOM_AUTOCAST_BF16, &r));
  loom_dtype f32 = LOOM_F32, out;
  loom_autocast_token tok;
  LT_OK(loom_autocast_enter(LOOM_AUTOCAST_BF16, r, &tok));
  LT_TRUE(loom_autocast_get_registry() == r);
  LT_TRUE(!loom_autocast_dtype_for(LOOM_AMP_OP_SOFTMAX, &f32, 1, &out));
  LT_OK(loom_amp_registry_set(r, LOOM_AMP_OP_SOFTMAX, LOOM_AMP_LOWER)); /* inside the region */
  LT_TRUE(loom_autocast_dtype_for(LOOM_AMP_OP_SOFTMAX, &f32, 1, &out));
  LT_EQ(out, LOOM_BF16);
  LT_OK(loom_amp_registry_set_by_name(r, "matmul", "none"));
  LT_TRUE(!loom_autocast_dtype_for(LOOM_AMP_OP_MATMUL, &f32, 1, &out));
  loom_amp_policy p;
  LT_OK(loom_amp_registry_get(r, LOOM_AMP_OP_MATMUL, &p));
  LT_EQ(p, LOOM_AMP_NONE);
  LT_OK(loom_amp_registry_reset(r));
  LT_TRUE(!loom_autocast_dtype_for(LOOM_AMP_OP_SOFTMAX, &f32, 1, &out));
  LT_TRUE(loom_autocast_dtype_for(LOOM_AMP_OP_MATMUL, &f32, 1, &out));
  LT_OK(loom_autocast_exit(&tok));
  /* the default registry is changeable too, and regions given NULL see it */
  loom_amp_registry *d = loom_amp_registry_default(LOOM_AUTOCAST_F16);
  LT_OK(loom_amp_registry_set(d, LOOM_AMP_OP_RELU, LOOM_AMP_FP32));
  LT_OK(loom_autocast_enter(LOOM_AUTOCAST_F16, NULL, &tok));
  loom_dtype f16 = LOOM_F16;
  LT_TRUE(loom_autocast_dtype_for(LOOM_AMP_OP_RELU, &f16, 1, &out));
  LT_EQ(out, LOOM_F32);
  LT_OK(loom_autocast_exit(&tok));
  LT_OK(loom_amp_registry_reset(d));
  LT_OK(loom_amp_registry_get(d, LOOM_AMP_OP_RELU, &p));
  LT_EQ(p, LOOM_AMP_NONE);
  loom_amp_registry_free(d); /* a default registry is never freed */
  LT_OK(loom_amp_registry_get(d, LOOM_AMP_OP_RELU, &p));
  /* errors */
  LT_ERR(loom_amp_registry_set(r, LOOM_AMP_OP_COUNT, LOOM_AMP_FP32), LOOM_EINVAL,
         "is not a kind");
  LT_ERR(loom_amp_registry_set(r, LOOM_AMP_OP_EXP, (loom_amp_policy)4), LOOM_EINVAL,
         "policy 4 for exp is not a policy");
  LT_ERR(loom_amp_registry_set_by_name(r, "softmx", "fp32"), LOOM_ENOTFOUND,
         "no op kind \"softmx\"");
  LT_ERR(loom_amp_registry_set_by_name(r, "softmax", "half"), LOOM_ENOTFOUND,
         "no policy \"half\"");
  LT_ERR(loom_amp_registry_set(NULL, LOOM_AMP_OP_EXP, LOOM_AMP_FP32), LOOM_EINVAL,
         "registry is NULL");
  LT_ERR(loom_amp_registry_get(r, LOOM_AMP_OP_EXP, NULL), LOOM_EINVAL, "out is NULL");
  LT_ERR(loom_amp_registry_get(r, (loom_amp_op)-1, &p), LOOM_EINVAL, "is not a kind");
  loom_amp_registry *bad = (loom_amp_registry *)&bad;
  LT_ERR(loom_amp_registry_create(LOOM_AUTOCAST_OFF, &bad), LOOM_EINVAL,
         "preset 0 is not f16 or bf16");
  LT_TRUE(bad == NULL);
  loom_alloc_fail_nth(1);
  LT_ERR(loom_amp_registry_create(LOOM_AUTOCAST_F16, &bad), LOOM_ENOMEM, "out of memory");
  loom_alloc_fail_nth(0);
  LT_TRUE(bad == NULL);
  loom_amp_registry_free(r);
  loom_amp_registry_free(NULL);
}

/* Policies changed on one thread while another looks them up: each lookup sees either the old
 * or the new policy, never anything else (and TSan sees no race). */
typedef struct flip_job {
  loom_amp_registry *r;
  _Atomic int stop;
  int bad;
} flip_job;

static void *lookup_run(void *p) {
  flip_job *j = p;
  loom_dtype f32 = LOOM_F32, out;
  while (!atomic_load(&j->stop)) {
    out = LOOM_I32;
    bool cast = loom_amp_registry_dtype_for(j->r, LOOM_AUTOCAST_BF16, LOOM_AMP_OP_SOFTMAX, &f32,
                                            1, &out);
    if (cast ? out != LOOM_BF16 : out != LOOM_I32 && out != LOOM_F32) j->bad++;
  }
  return NULL;
}

LT_TEST(autocast_registry_changes_race_free) {
  flip_job j = {NULL, 0, 0};
  LT_OK(loom_amp_registry_create(LOOM_AUTOCAST_BF16, &j.r));
  pthread_t t;
  pthread_create(&t, NULL, lookup_run, &j);
  for (int i = 0; i < 20000; i++)
    LT_OK(loom_amp_registry_set(j.r, LOOM_AMP_OP_SOFTMAX, i % 2 ? LOOM_AMP_LOWER : LOOM_AMP_FP32));
  atomic_store(&j.stop, 1);
  pthread_join(t, NULL);
  LT_EQ(j.bad, 0);
  loom_amp_registry_free(j.r);
}
