/* test_init.c: parameters' initial values (loom/nn.h) and deferred initialisation. Each value
 * against the scalar formula over loom_rng_at_uniform / _normal (Linear, Conv2d's bias,
 * Embedding, LayerNorm, GPT); the init distribution's figures (mean, standard deviation, bound)
 * over a large Linear and Embedding; a deferred build costs no parameter memory, refuses to
 * run, and materialises to the bits of a build without deferral (MLP, Sequential, GPT, f16
 * parameters); loom_module_init_values' slices equal the slice of the whole, and its errors. */
#include "lt.h"

#include <stdlib.h>
#include <string.h>

static size_t compute_bytes(void) {
  loom_pool_stats s;
  loom_mem_stats(LOOM_POOL_COMPUTE, &s);
  return s.current_bytes;
}

static const float *data_of(loom_module *m, const char *name) {
  loom_param p;
  if (loom_module_param_by_name(m, name, &p)) return NULL;
  return loom_tensor_data(p.value);
}

LT_TEST(nn_init_values_are_the_counter_based_formula) {
  loom_module *lin = NULL, *emb = NULL, *ln = NULL, *conv = NULL;
  LT_OK(loom_nn_linear_create(30, 11, true, LOOM_F32, 77, &lin));
  const float *w = data_of(lin, "weight"), *b = data_of(lin, "bias");
  double bound = 1.0 / sqrt(30.0);
  for (uint64_t j = 0; j < 330; j++)
    LT_TRUE(w[j] == (float)(-bound + 2 * bound * loom_rng_at_uniform(77, 0, j)));
  for (uint64_t j = 0; j < 11; j++)
    LT_TRUE(b[j] == (float)(-bound + 2 * bound * loom_rng_at_uniform(77, 1, j)));
  LT_OK(loom_nn_embedding_create(13, 5, LOOM_F32, 8, &emb));
  const float *e = data_of(emb, "weight");
  for (uint64_t j = 0; j < 65; j++) LT_TRUE(e[j] == (float)loom_rng_at_normal(8, 0, j));
  const int64_t shape[1] = {6}, k[2] = {3, 3}, one[2] = {1, 1}, zero[2] = {0, 0};
  LT_OK(loom_nn_layer_norm_create(1, shape, 1e-5, true, LOOM_F32, &ln));
  for (int j = 0; j < 6; j++) {
    LT_TRUE(data_of(ln, "weight")[j] == 1.0f);
    LT_TRUE(data_of(ln, "bias")[j] == 0.0f);
  }
  LT_OK(loom_nn_conv2d_create(2, 4, k, one, zero, true, LOOM_F32, 3, &conv));
  double cb = 1.0 / sqrt(18.0);
  for (uint64_t j = 0; j < 4; j++)
    LT_TRUE(data_of(conv, "bias")[j] == (float)(-cb + 2 * cb * loom_rng_at_uniform(3, 1, j)));
  loom_module_free(lin);
  loom_module_free(emb);
  loom_module_free(ln);
  loom_module_free(conv);
}

LT_TEST(nn_init_distribution_figures) {
  loom_module *lin = NULL, *emb = NULL;
  LT_OK(loom_nn_linear_create(400, 500, false, LOOM_F32, 1, &lin)); /* 200000 weights */
  LT_OK(loom_nn_embedding_create(500, 400, LOOM_F32, 2, &emb));
  const float *w = data_of(lin, "weight"), *e = data_of(emb, "weight");
  double bound = 1.0 / 20.0, s = 0, ss = 0, mx = 0, es = 0, ess = 0;
  const double n = 200000;
  for (size_t i = 0; i < 200000; i++) {
    s += w[i], ss += (double)w[i] * w[i], mx = fmax(mx, fabs(w[i]));
    es += e[i], ess += (double)e[i] * e[i];
  }
  /* U(-b, b): mean 0, sd b / sqrt(3); N(0, 1): mean 0, sd 1 (5 standard errors) */
  LT_NEAR(s / n, 0.0, 5 * bound / sqrt(3.0) / sqrt(n));
  LT_NEAR(sqrt(ss / n - (s / n) * (s / n)), bound / sqrt(3.0), 5 * bound / sqrt(3.0) * 0.9 / sqrt(n));
  LT_TRUE(mx <= bound && mx > 0.999 * bound);
  LT_NEAR(es / n, 0.0, 5.0 / sqrt(n));
  LT_NEAR(sqrt(ess / n - (es / n) * (es / n)), 1.0, 5 * 0.71 / sqrt(n));
  loom_module_free(lin);
  loom_module_free(emb);
}

/* A deferred MLP: no parameter memory, no arena, parameters refused by ops; materialised, the
 * arena is the one of the same MLP built at once, byte for byte. */
LT_TEST(nn_deferred_mlp_costs_nothing_and_materialises_to_the_same_bits) {
  const int64_t sizes[] = {300, 200, 100, 10};
  loom_module *ref = NULL, *m = NULL;
  LT_OK(loom_nn_mlp_create(sizes, 4, LOOM_ACT_RELU, LOOM_F32, 5, &ref));
  LT_TRUE(!loom_nn_deferred_init());
  LT_TRUE(!loom_module_deferred(ref));
  size_t before = compute_bytes(), numel = loom_module_numel(ref);
  LT_TRUE(!loom_nn_set_deferred_init(true));
  int rc = loom_nn_mlp_create(sizes, 4, LOOM_ACT_RELU, LOOM_F32, 5, &m);
  LT_TRUE(loom_nn_set_deferred_init(false));
  LT_OK(rc);
  LT_TRUE(loom_module_deferred(m));
  LT_TRUE(compute_bytes() - before < numel * sizeof(float) / 20); /* headers only */
  loom_tensor *arena = NULL;
  LT_OK(loom_module_arena(m, LOOM_F32, &arena, NULL, NULL));
  LT_TRUE(arena == NULL);
  LT_EQ(loom_module_numel(m), numel);
  loom_param p;
  LT_OK(loom_module_param_by_name(m, "layers.2.weight", &p));
  LT_TRUE(loom_tensor_data(p.value) == NULL);
  LT_EQ(loom_tensor_dim(p.value, 0), 100);
  int64_t xs[2] = {2, 300};
  loom_tensor *x = NULL, *y = NULL;
  LT_OK(loom_tensor_zeros(LOOM_F32, 2, xs, &x));
  LT_ERR(loom_module_forward(m, x, &y), LOOM_EMISUSE, "");
  LT_OK(loom_module_materialize(m));
  LT_TRUE(!loom_module_deferred(m));
  LT_OK(loom_module_materialize(m)); /* nothing to do */
  loom_tensor *ra = NULL;
  size_t n = 0, rn = 0;
  LT_OK(loom_module_arena(m, LOOM_F32, &arena, NULL, &n));
  LT_OK(loom_module_arena(ref, LOOM_F32, &ra, NULL, &rn));
  LT_EQ(n, rn);
  LT_TRUE(memcmp(loom_tensor_data(arena), loom_tensor_data(ra), n * sizeof(float)) == 0);
  LT_OK(loom_module_forward(m, x, &y));
  loom_tensor_free(y);
  loom_tensor_free(x);
  loom_module_free(m);
  loom_module_free(ref);
}

/* A Sequential of deferred children is deferred; one child built with values makes the whole
 * Sequential materialise (the deferred children from their recipes), the same bits either way. */
LT_TEST(nn_deferred_sequential_and_mixed_children) {
  loom_module *a[2] = {NULL, NULL}, *b[2] = {NULL, NULL}, *sa = NULL, *sb = NULL;
  LT_OK(loom_nn_linear_create(8, 6, true, LOOM_F16, 1, &a[0]));
  LT_OK(loom_nn_linear_create(6, 3, true, LOOM_F16, 2, &a[1]));
  LT_OK(loom_nn_sequential_create(a, 2, &sa));
  bool was = loom_nn_set_deferred_init(true);
  int rc = loom_nn_linear_create(8, 6, true, LOOM_F16, 1, &b[0]);
  loom_nn_set_deferred_init(was);
  LT_OK(rc);
  LT_OK(loom_nn_linear_create(6, 3, true, LOOM_F16, 2, &b[1])); /* with values */
  LT_TRUE(loom_module_deferred(b[0]));
  LT_OK(loom_nn_sequential_create(b, 2, &sb));
  LT_TRUE(!loom_module_deferred(sb));
  loom_tensor *x = NULL, *y = NULL;
  size_t n = 0, m = 0;
  LT_OK(loom_module_arena(sa, LOOM_F16, &x, NULL, &n));
  LT_OK(loom_module_arena(sb, LOOM_F16, &y, NULL, &m));
  LT_EQ(n, m);
  LT_TRUE(memcmp(loom_tensor_data(x), loom_tensor_data(y), n * 2) == 0); /* f16 from the recipe */
  loom_module_free(sa);
  loom_module_free(sb);
}

LT_TEST(nn_deferred_gpt_materialises_to_the_same_bits) {
  loom_gpt_cfg cfg = {.vocab = 50, .context = 8, .layers = 2, .heads = 2, .dim = 16};
  loom_module *ref = NULL, *m = NULL;
  LT_OK(loom_nn_gpt_create(&cfg, 11, &ref));
  bool was = loom_nn_set_deferred_init(true);
  int rc = loom_nn_gpt_create(&cfg, 11, &m);
  loom_nn_set_deferred_init(was);
  LT_OK(rc);
  LT_TRUE(loom_module_deferred(m));
  LT_OK(loom_module_materialize(m));
  loom_tensor *a = NULL, *b = NULL;
  size_t n = 0, k = 0;
  LT_OK(loom_module_arena(m, LOOM_F32, &a, NULL, &n));
  LT_OK(loom_module_arena(ref, LOOM_F32, &b, NULL, &k));
  LT_EQ(n, k);
  LT_TRUE(memcmp(loom_tensor_data(a), loom_tensor_data(b), n * sizeof(float)) == 0);
  /* GPT-2's recipe: parameter i, element j = 0.02 x loom_rng_at_normal(seed, i, j) (wte is 0) */
  loom_param wte;
  LT_OK(loom_module_param(ref, 0, &wte));
  const float *v = loom_tensor_data(wte.value);
  for (uint64_t j = 0; j < 100; j++)
    LT_TRUE(v[j] == (float)(0.0 + 0.02 * loom_rng_at_normal(11, 0, j)));
  loom_module_free(m);
  loom_module_free(ref);
}

LT_TEST(nn_init_values_slices_equal_the_whole_and_errors) {
  const int64_t sizes[] = {37, 29, 5};
  loom_module *m = NULL;
  LT_OK(loom_nn_mlp_create(sizes, 3, LOOM_ACT_RELU, LOOM_F32, 4, &m));
  for (size_t i = 0; i < loom_module_param_count(m); i++) {
    loom_param p;
    LT_OK(loom_module_param(m, i, &p));
    float part[37 * 29];
    const float *whole = loom_tensor_data(p.value);
    size_t lo = p.numel / 3, hi = p.numel - p.numel / 5;
    LT_OK(loom_module_init_values(m, i, lo, hi, part));
    LT_TRUE(memcmp(part, whole + lo, (hi - lo) * sizeof(float)) == 0);
  }
  float dst[4];
  LT_ERR(loom_module_init_values(m, 9, 0, 1, dst), LOOM_EINVAL, "out of range");
  LT_ERR(loom_module_init_values(m, 1, 3, 30, dst), LOOM_EINVAL, "layers.0.bias");
  LT_ERR(loom_module_init_values(NULL, 0, 0, 1, dst), LOOM_EINVAL, "NULL");
  LT_ERR(loom_module_materialize(NULL), LOOM_EINVAL, "NULL");
  loom_module_free(m);
}

/* Allocation n of materialising fails, for n = 1, 2, ...: LOOM_ENOMEM with the module still
 * deferred (and a later materialise giving the right bits), until one succeeds. */
LT_TEST(nn_materialize_out_of_memory_leaves_the_module_deferred) {
  const int64_t sizes[] = {20, 16, 4};
  loom_module *ref = NULL;
  LT_OK(loom_nn_mlp_create(sizes, 3, LOOM_ACT_RELU, LOOM_F32, 3, &ref));
  loom_tensor *ra = NULL;
  size_t rn = 0;
  LT_OK(loom_module_arena(ref, LOOM_F32, &ra, NULL, &rn));
  bool ok = false;
  for (uint64_t n = 1; n < 200 && !ok; n++) {
    loom_module *m = NULL;
    bool was = loom_nn_set_deferred_init(true);
    int rc = loom_nn_mlp_create(sizes, 3, LOOM_ACT_RELU, LOOM_F32, 3, &m);
    loom_nn_set_deferred_init(was);
    LT_OK(rc);
    loom_alloc_fail_nth(n);
    rc = loom_module_materialize(m);
    loom_alloc_fail_nth(0);
    if (rc) {
      LT_EQ(rc, LOOM_ENOMEM);
      if (!loom_module_deferred(m))
        lt_fail_at(__FILE__, __LINE__, "allocation %llu failing: the module is no longer "
                   "deferred", (unsigned long long)n);
      LT_OK(loom_module_materialize(m));
    }
    ok = rc == LOOM_OK;
    loom_tensor *a = NULL;
    size_t k = 0;
    LT_OK(loom_module_arena(m, LOOM_F32, &a, NULL, &k));
    LT_EQ(k, rn);
    LT_TRUE(a && memcmp(loom_tensor_data(a), loom_tensor_data(ra), k * sizeof(float)) == 0);
    loom_module_free(m);
  }
  LT_TRUE(ok);
  loom_module_free(ref);
}

LT_TEST(nn_deferred_parameters_are_refused_by_what_reads_data) {
  const int64_t sizes[] = {6, 5, 2};
  loom_module *m = NULL;
  bool was = loom_nn_set_deferred_init(true);
  int rc = loom_nn_mlp_create(sizes, 3, LOOM_ACT_RELU, LOOM_F32, 3, &m);
  loom_nn_set_deferred_init(was);
  LT_OK(rc);
  loom_param p;
  LT_OK(loom_module_param(m, 0, &p));
  /* a parameter of a deferred module is refused by what reads data */
  loom_tensor *y = NULL;
  LT_ERR(loom_tensor_cast(p.value, LOOM_F16, &y), LOOM_EMISUSE, "holds no data");
  loom_optim *opt = NULL;
  LT_ERR(loom_adamw_create_for_module(m, NULL, &opt), LOOM_EMISUSE, "built deferred");
  LT_OK(loom_module_materialize(m));
  LT_OK(loom_adamw_create_for_module(m, NULL, &opt));
  loom_optim_free(opt);
  LT_TRUE(!loom_module_deferred(NULL));
  loom_module_free(m);
}
