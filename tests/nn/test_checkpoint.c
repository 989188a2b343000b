/* test_checkpoint.c: activation checkpointing (loom_module_set_checkpoint, loom_gpt_set_checkpoint,
 * loom_autograd_checkpoint): gradients bit-identical to the run without it (GPT with every
 * block checkpointed, f32 and bf16 autocast; an MLP; dropout inside), hooks firing once,
 * retain_graph, no-grad and eval, loom_autograd_grad refused, bad arguments, the dry run, and
 * the activation peak going down. DDP and FSDP: tests/fsdp/test_fsdp_checkpoint.c. */
#include "lt.h"
#include "lt_oom.h"
#include "lt_gpt.h"
#include "nn/nn_int.h" /* the model's children, to checkpoint wte alone */

#include <stdlib.h>
#include <string.h>

static loom_gpt_cfg tiny(int64_t layers) {
  loom_gpt_cfg c = {.vocab = 128, .context = 8, .layers = layers, .heads = 2, .dim = 16};
  return c;
}

/* The f32 gradient arena of m after `steps` backwards (accumulated) of rows 0..3 at T 8. */
static int count_hook(loom_tensor *grad, void *ctx) {
  (void)grad;
  ++*(int *)ctx;
  return LOOM_OK;
}

enum { CK_NONE = 0, CK_BLOCKS = 1, CK_NESTED = 2, CK_WTE = 3 }; /* what is checkpointed */

static float *gpt_grads(int64_t layers, int ckpt, loom_autocast_mode amp, int steps,
                        size_t *n) {
  loom_gpt_cfg c = tiny(layers);
  loom_module *m = NULL;
  LT_OK(loom_nn_gpt_create(&c, 7, &m));
  LT_OK(loom_gpt_set_checkpoint(m, ckpt == CK_BLOCKS || ckpt == CK_NESTED));
  if (ckpt == CK_NESTED) LT_OK(loom_module_set_checkpoint(m, true)); /* the whole model too */
  if (ckpt == CK_WTE) LT_OK(loom_module_set_checkpoint(m->children[0], true));
  loom_param wte;
  int fired = 0;
  LT_OK(loom_module_param_by_name(m, "wte.weight", &wte));
  LT_OK(loom_tensor_register_hook(wte.value, count_hook, &fired, NULL));
  LT_OK(loom_module_zero_grad(m));
  for (int s = 0; s < steps; s++) LT_OK(lt_gpt_backward(m, 4 * s, 4, 8, amp, 1.0f, NULL));
  LT_EQ(fired, steps); /* the tied weight's gradient completes once a backward */
  loom_tensor *g = NULL;
  LT_OK(loom_module_arena(m, LOOM_F32, NULL, &g, n));
  float *out = malloc(*n * sizeof *out);
  memcpy(out, loom_tensor_data(g), *n * sizeof *out);
  loom_module_free(m);
  return out;
}

static void same_bits(const float *a, const float *b, size_t n, const char *what) {
  size_t diff = 0, first = n;
  for (size_t i = 0; i < n; i++)
    if (memcmp(&a[i], &b[i], sizeof *a)) diff++, first = first < n ? first : i;
  if (diff)
    lt_fail_at(__FILE__, __LINE__, "%s: %zu of %zu gradient elements differ (first %zu: %.9g vs "
               "%.9g)", what, diff, n, first, a[first], b[first]);
  double sum = 0;
  for (size_t i = 0; i < n; i++) sum += a[i] < 0 ? -a[i] : a[i];
  LT_TRUE(sum > 0); /* the comparison is of something */
}

LT_TEST(checkpoint_gpt_every_block_bit_identical_f32_and_bf16) {
  loom_autocast_mode modes[2] = {LOOM_AUTOCAST_OFF, LOOM_AUTOCAST_BF16};
  for (int k = 0; k < 2; k++) {
    size_t n1 = 0, n2 = 0;
    float *plain = gpt_grads(3, CK_NONE, modes[k], 2, &n1);
    float *ckpt = gpt_grads(3, CK_BLOCKS, modes[k], 2, &n2);
    LT_EQ(n1, n2);
    same_bits(plain, ckpt, n1, k ? "GPT bf16 autocast" : "GPT f32");
    free(plain);
    free(ckpt);
  }
}

typedef struct mlp_out {
  float *grads; /* the gradient arena */
  size_t n;
  float xgrad[30]; /* the input's gradient at the second step */
  int fired;       /* hook calls on 0.weight */
} mlp_out;

/* A checkpoint inside a checkpoint (the whole model, and each block again: the blocks' run in
 * the model's recomputation, a reentrant backward inside a reentrant backward), and the tied
 * wte checkpointed alone (its embedding inside the checkpoint, the head outside: the leaf is
 * complete once, after both). */
LT_TEST(checkpoint_gpt_nested_and_tied_weight_bit_identical) {
  size_t n0 = 0, n1 = 0, n2 = 0;
  float *plain = gpt_grads(2, CK_NONE, LOOM_AUTOCAST_OFF, 2, &n0);
  float *nested = gpt_grads(2, CK_NESTED, LOOM_AUTOCAST_OFF, 2, &n1);
  float *wte = gpt_grads(2, CK_WTE, LOOM_AUTOCAST_OFF, 2, &n2);
  LT_EQ(n0, n1);
  LT_EQ(n0, n2);
  same_bits(plain, nested, n0, "GPT, model and blocks checkpointed");
  same_bits(plain, wte, n0, "GPT, wte checkpointed");
  free(plain);
  free(nested);
  free(wte);
}

/* An MLP with dropout inside (Linear, Dropout, ReLU, Linear), input requiring grad, two
 * forward/backward steps (the second draws other masks): the root checkpointed or not. */
static void mlp_run(bool ckpt, loom_autocast_mode amp, mlp_out *o) {
  loom_module *kids[4] = {NULL};
  LT_OK(loom_nn_linear_create(6, 10, true, LOOM_F32, 1, &kids[0]));
  LT_OK(loom_nn_dropout_create(0.3, 99, &kids[1]));
  LT_OK(loom_nn_activation_create(LOOM_ACT_RELU, &kids[2]));
  LT_OK(loom_nn_linear_create(10, 3, true, LOOM_F32, 2, &kids[3]));
  loom_module *m = NULL;
  LT_OK(loom_nn_sequential_create(kids, 4, &m));
  LT_OK(loom_module_set_checkpoint(m, ckpt));
  LT_EQ(loom_module_checkpoint(m), ckpt);
  loom_param w;
  LT_OK(loom_module_param_by_name(m, "0.weight", &w));
  o->fired = 0;
  LT_OK(loom_tensor_register_hook(w.value, count_hook, &o->fired, NULL));
  int64_t shape[2] = {5, 6};
  for (int step = 0; step < 2; step++) {
    loom_tensor *x = NULL, *y = NULL, *l = NULL;
    LT_OK(loom_tensor_empty(LOOM_F32, 2, shape, &x));
    float *xd = loom_tensor_data(x);
    for (int i = 0; i < 30; i++) xd[i] = (float)((i * 7 + step * 3) % 11) / 5.0f - 1.0f;
    LT_OK(loom_tensor_set_requires_grad(x, true));
    loom_autocast_token tok;
    LT_OK(loom_autocast_enter(amp, NULL, &tok));
    LT_OK(loom_module_forward(m, x, &y));
    LT_OK(loom_autocast_exit(&tok));
    if (ckpt) LT_STREQ(loom_tensor_grad_fn_name(y), "Sequential");
    LT_OK(loom_sum(y, NULL, 0, false, &l));
    LT_OK(loom_backward(l, NULL, false));
    if (step == 1) memcpy(o->xgrad, loom_tensor_data(loom_tensor_grad(x)), sizeof o->xgrad);
    loom_tensor_free(x);
    loom_tensor_free(y);
    loom_tensor_free(l);
  }
  loom_tensor *g = NULL;
  LT_OK(loom_module_arena(m, LOOM_F32, NULL, &g, &o->n));
  o->grads = malloc(o->n * sizeof *o->grads);
  memcpy(o->grads, loom_tensor_data(g), o->n * sizeof *o->grads);
  loom_module_free(m);
}

LT_TEST(checkpoint_mlp_with_dropout_bit_identical_hooks_once) {
  loom_autocast_mode modes[2] = {LOOM_AUTOCAST_OFF, LOOM_AUTOCAST_BF16};
  for (int k = 0; k < 2; k++) {
    mlp_out a = {0}, b = {0};
    mlp_run(false, modes[k], &a);
    mlp_run(true, modes[k], &b);
    LT_EQ(a.n, b.n);
    same_bits(a.grads, b.grads, a.n, k ? "MLP bf16 parameters" : "MLP f32 parameters");
    same_bits(a.xgrad, b.xgrad, 30, k ? "MLP bf16 input" : "MLP f32 input");
    LT_EQ(a.fired, 2); /* once a backward */
    LT_EQ(b.fired, 2);
    free(a.grads);
    free(b.grads);
  }
}

/* An MLP whose input needs no gradient: the parameters still get theirs (the parameters are
 * the node's edges; PyTorch's reentrant checkpoint would give none here). */
LT_TEST(checkpoint_mlp_input_without_grad_params_still_get_gradients) {
  int64_t sizes[3] = {4, 8, 2}, shape[2] = {3, 4};
  float *ga[2];
  size_t n = 0;
  for (int ck = 0; ck < 2; ck++) {
    loom_module *m = NULL;
    LT_OK(loom_nn_mlp_create(sizes, 3, LOOM_ACT_GELU, LOOM_F32, 5, &m));
    LT_OK(loom_module_set_checkpoint(m, ck));
    loom_tensor *x = NULL, *y = NULL, *l = NULL, *g = NULL;
    LT_OK(loom_tensor_empty(LOOM_F32, 2, shape, &x));
    float *xd = loom_tensor_data(x);
    for (int i = 0; i < 12; i++) xd[i] = (float)i / 7.0f - 0.8f;
    LT_OK(loom_module_forward(m, x, &y));
    LT_OK(loom_mean(y, NULL, 0, false, &l));
    LT_OK(loom_backward(l, NULL, false));
    LT_OK(loom_module_arena(m, LOOM_F32, NULL, &g, &n));
    ga[ck] = malloc(n * sizeof(float));
    memcpy(ga[ck], loom_tensor_data(g), n * sizeof(float));
    loom_tensor_free(x);
    loom_tensor_free(y);
    loom_tensor_free(l);
    loom_module_free(m);
  }
  same_bits(ga[0], ga[1], n, "MLP, input without grad");
  free(ga[0]);
  free(ga[1]);
}

LT_TEST(checkpoint_retain_graph_recomputes_again) {
  float *ga[2];
  size_t n = 0;
  loom_gpt_cfg c = tiny(2);
  for (int ck = 0; ck < 2; ck++) {
    loom_module *m = NULL;
    loom_tensor *x = NULL, *y = NULL, *logits = NULL, *l = NULL, *g = NULL;
    LT_OK(loom_nn_gpt_create(&c, 3, &m));
    LT_OK(loom_gpt_set_checkpoint(m, ck));
    LT_OK(lt_gpt_batch(0, 2, 8, &x, &y));
    LT_OK(loom_module_forward(m, x, &logits));
    LT_OK(loom_gpt_loss(logits, y, &l));
    LT_OK(loom_backward(l, NULL, true));
    LT_OK(loom_backward(l, NULL, false)); /* twice the gradient */
    LT_ERR(loom_backward(l, NULL, false), LOOM_EMISUSE, "spent");
    LT_OK(loom_module_arena(m, LOOM_F32, NULL, &g, &n));
    ga[ck] = malloc(n * sizeof(float));
    memcpy(ga[ck], loom_tensor_data(g), n * sizeof(float));
    loom_tensor_free(x);
    loom_tensor_free(y);
    loom_tensor_free(logits);
    loom_tensor_free(l);
    loom_module_free(m);
  }
  same_bits(ga[0], ga[1], n, "retain_graph");
  free(ga[0]);
  free(ga[1]);
}

LT_TEST(checkpoint_no_grad_and_eval_simply_run) {
  loom_gpt_cfg c = tiny(2);
  loom_module *m = NULL;
  loom_tensor *x = NULL, *y = NULL, *a = NULL, *b = NULL, *e = NULL;
  LT_OK(loom_nn_gpt_create(&c, 3, &m));
  LT_OK(lt_gpt_batch(0, 2, 8, &x, &y));
  LT_OK(loom_module_forward(m, x, &a)); /* not checkpointed */
  LT_OK(loom_gpt_set_checkpoint(m, true));
  loom_no_grad_enter();
  LT_OK(loom_module_forward(m, x, &b));
  LT_OK(loom_no_grad_exit());
  LT_TRUE(!loom_tensor_requires_grad(b));
  loom_module_set_training(m, false);
  LT_OK(loom_module_forward(m, x, &e));
  LT_STREQ(loom_tensor_grad_fn_name(e), "linear"); /* recorded as usual: no checkpoint node */
  size_t n = loom_tensor_numel(a);
  LT_TRUE(!memcmp(loom_tensor_data(a), loom_tensor_data(b), n * sizeof(float)));
  LT_TRUE(!memcmp(loom_tensor_data(a), loom_tensor_data(e), n * sizeof(float)));
  loom_tensor_free(x);
  loom_tensor_free(y);
  loom_tensor_free(a);
  loom_tensor_free(b);
  loom_tensor_free(e);
  loom_module_free(m);
}

LT_TEST(checkpoint_under_autograd_grad_is_misuse) {
  loom_gpt_cfg c = tiny(1);
  loom_module *m = NULL;
  loom_tensor *x = NULL, *y = NULL, *logits = NULL, *l = NULL, *gr = NULL;
  LT_OK(loom_nn_gpt_create(&c, 3, &m));
  LT_OK(loom_gpt_set_checkpoint(m, true));
  LT_OK(lt_gpt_batch(0, 2, 8, &x, &y));
  LT_OK(loom_module_forward(m, x, &logits));
  LT_OK(loom_gpt_loss(logits, y, &l));
  loom_param p;
  LT_OK(loom_module_param_by_name(m, "wpe.weight", &p));
  LT_ERR(loom_autograd_grad(l, NULL, &p.value, 1, false, &gr), LOOM_EMISUSE,
         "loom_autograd_grad");
  LT_TRUE(gr == NULL);
  loom_tensor_free(x);
  loom_tensor_free(y);
  loom_tensor_free(logits);
  loom_tensor_free(l);
  loom_module_free(m);
}

static int identity_fn(void *ctx, loom_tensor *const *in, int n, loom_tensor **out) {
  (void)ctx, (void)n;
  *out = loom_tensor_retain(in[0]);
  return LOOM_OK;
}

static int grow_fn(void *ctx, loom_tensor *const *in, int n, loom_tensor **out) {
  (void)n;
  int *calls = ctx; /* a function that is not the same twice: another shape the second time */
  int64_t len = ++*calls == 1 ? 3 : 4;
  (void)in;
  return loom_tensor_zeros(LOOM_F32, 1, &len, out);
}

LT_TEST(checkpoint_bad_arguments) {
  LT_ERR(loom_module_set_checkpoint(NULL, true), LOOM_EINVAL, "NULL");
  LT_TRUE(!loom_module_checkpoint(NULL));
  LT_ERR(loom_gpt_set_checkpoint(NULL, true), LOOM_EINVAL, "NULL");
  int64_t sizes[2] = {2, 2};
  loom_module *mlp = NULL;
  LT_OK(loom_nn_mlp_create(sizes, 2, LOOM_ACT_RELU, LOOM_F32, 1, &mlp));
  LT_ERR(loom_gpt_set_checkpoint(mlp, true), LOOM_EMISUSE, "not a GPT2");
  loom_module_free(mlp);
  int64_t len = 3;
  loom_tensor *x = NULL, *y = NULL, *l = NULL;
  LT_OK(loom_tensor_zeros(LOOM_F32, 1, &len, &x));
  LT_ERR(loom_autograd_checkpoint("f", NULL, NULL, NULL, &x, 1, NULL, 0, &y), LOOM_EINVAL, "fn");
  LT_ERR(loom_autograd_checkpoint("f", identity_fn, NULL, NULL, &x, 0, NULL, 0, &y), LOOM_EINVAL,
         "input");
  LT_ERR(loom_autograd_checkpoint("f", identity_fn, NULL, NULL, &x, 1, NULL, 2, &y), LOOM_EINVAL,
         "params");
  /* a function returning its input: a fresh output on the tape all the same */
  LT_OK(loom_tensor_set_requires_grad(x, true));
  LT_OK(loom_autograd_checkpoint("f", identity_fn, NULL, NULL, &x, 1, NULL, 0, &y));
  LT_TRUE(y != x);
  LT_STREQ(loom_tensor_grad_fn_name(y), "f");
  LT_OK(loom_sum(y, NULL, 0, false, &l));
  LT_OK(loom_backward(l, NULL, false));
  float *g = loom_tensor_data(loom_tensor_grad(x));
  LT_EQ(g[0], 1.0f);
  LT_EQ(g[2], 1.0f);
  loom_tensor_free(y);
  loom_tensor_free(l);
  /* a recomputation of another shape */
  int calls = 0;
  LT_OK(loom_autograd_checkpoint("grow", grow_fn, &calls, NULL, &x, 1, NULL, 0, &y));
  LT_OK(loom_sum(y, NULL, 0, false, &l));
  LT_ERR(loom_backward(l, NULL, false), LOOM_EMISUSE, "recomputation");
  loom_tensor_free(y);
  loom_tensor_free(l);
  loom_tensor_free(x);
}

/* The compute pool's peak over forward + backward of a GPT, checkpointed or not (dry run or
 * real). */
static size_t step_peak(int64_t layers, bool ckpt, bool dry) {
  loom_gpt_cfg c = {.vocab = 128, .context = 64, .layers = layers, .heads = 2, .dim = 32};
  if (dry) loom_mem_set_dry_run(true);
  loom_module *m = NULL;
  loom_tensor *x = NULL, *y = NULL, *logits = NULL, *l = NULL;
  loom_pool_stats st;
  LT_OK(loom_nn_gpt_create(&c, 3, &m));
  LT_OK(loom_gpt_set_checkpoint(m, ckpt));
  LT_OK(loom_module_zero_grad(m));
  LT_OK(lt_gpt_batch(0, 4, 64, &x, &y));
  loom_mem_reset_peak(LOOM_POOL_COMPUTE);
  LT_OK(loom_mem_stats(LOOM_POOL_COMPUTE, &st));
  size_t base = st.current_bytes;
  LT_OK(loom_module_forward(m, x, &logits));
  LT_OK(loom_gpt_loss(logits, y, &l));
  LT_OK(loom_backward(l, NULL, false));
  LT_OK(loom_mem_stats(LOOM_POOL_COMPUTE, &st));
  loom_tensor_free(x);
  loom_tensor_free(y);
  loom_tensor_free(logits);
  loom_tensor_free(l);
  loom_module_free(m);
  if (dry) loom_mem_set_dry_run(false);
  return st.peak_bytes - base;
}

LT_TEST(checkpoint_lowers_the_peak_and_plans_under_dry_run) {
  size_t plain = step_peak(6, false, false), ckpt = step_peak(6, true, false);
  LT_TRUE(ckpt < plain * 3 / 4);
  size_t dplain = step_peak(6, false, true), dckpt = step_peak(6, true, true);
  LT_EQ(dplain, plain); /* the dry run's plan is the real peak, with and without */
  LT_EQ(dckpt, ckpt);
}

/* The sweep's run and reset (lt_oom.h): ctx is {the module, its input}. */
static int ckpt_run(void *ctx, loom_tensor **y, loom_tensor **l) {
  void **c = ctx;
  int rc = loom_module_forward(c[0], c[1], y);
  return rc ? rc : loom_sum(*y, NULL, 0, false, l);
}
static void ckpt_reset(void *ctx) { LT_OK(loom_tensor_set_grad(((void **)ctx)[1], NULL)); }

/* Out of memory at each allocation of a checkpointed MLP's forward + backward in turn (the
 * checkpoint's node and saved input, the recomputation, the reentrant backward): ENOMEM, never
 * a crash, and nothing left allocated once the caller has freed what it holds. */
LT_TEST(checkpoint_out_of_memory_sweep) {
  int64_t sizes[3] = {4, 8, 2}, shape[2] = {3, 4};
  loom_module *m = NULL;
  loom_tensor *x = NULL;
  LT_OK(loom_nn_mlp_create(sizes, 3, LOOM_ACT_GELU, LOOM_F32, 5, &m));
  LT_OK(loom_module_set_checkpoint(m, true));
  LT_OK(loom_tensor_zeros(LOOM_F32, 2, shape, &x));
  LT_OK(loom_tensor_set_requires_grad(x, true));
  void *ctx[2] = {m, x};
  int ok = 0, nomem = lt_oom_sweep(400, ckpt_run, ckpt_reset, ctx, &ok);
  LT_TRUE(ok);
  LT_TRUE(nomem >= 20);
  loom_tensor_free(x);
  loom_module_free(m);
}
