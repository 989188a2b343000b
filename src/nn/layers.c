/* layers.c: the leaf modules: Linear, Conv2d, LayerNorm, Embedding, Dropout and the
 * activations, with PyTorch's parameter names, layouts and default initialisers. */
#include "nn/nn_int.h"

#include <math.h>
#include <string.h>

static loom_tensor *param(const loom_module *m, int i) { return m->params[i].value; }

/* Finish a create: pack the new root's arena, or free it all. */
static int finish(loom_module *m, int rc, loom_module **out) {
  if (!rc) rc = loom__module_pack(m);
  if (rc) {
    loom_module_free(m);
    return rc;
  }
  *out = m;
  return LOOM_OK;
}

static int check_out(const char *who, loom_module **out) {
  if (!out) return loom__fail(LOOM_EINVAL, "%s: out is NULL", who);
  *out = NULL;
  return LOOM_OK;
}

/* PyTorch's default for Linear and Conv2d: U[-bound, bound), stream 0 the weight, 1 the bias. */
static loom__init uniform(double bound, uint64_t seed, uint64_t stream) {
  return (loom__init){.kind = LOOM__INIT_UNIFORM, .a = bound, .seed = seed, .stream = stream};
}

static int check_float(const char *who, loom_dtype dt) {
  if (!loom_dtype_is_float(dt))
    return loom__fail(LOOM_EDTYPE, "%s: parameters must be f32, f16 or bf16, not %s", who,
                      loom_dtype_name(dt));
  return LOOM_OK;
}

/* ---- Linear ----------------------------------------------------------------------------- */

static int linear_forward(loom_module *m, loom_tensor *x, loom_tensor **out) {
  return loom_linear(x, param(m, 0), m->n_params > 1 ? param(m, 1) : NULL, out);
}

int loom_nn_linear_create(int64_t in, int64_t out_f, bool bias, loom_dtype dt, uint64_t seed,
                          loom_module **out) {
  static const char *who = "loom_nn_linear_create";
  int rc = check_out(who, out);
  if (!rc) rc = check_float(who, dt);
  if (rc) return rc;
  if (in < 1 || out_f < 1)
    return loom__fail(LOOM_EINVAL, "%s: in (%lld) and out (%lld) must be >= 1", who,
                      (long long)in, (long long)out_f);
  loom_module *m = NULL;
  if ((rc = loom__module_new("Linear", linear_forward, &m))) return rc;
  m->cfg[0] = in;
  m->cfg[1] = out_f;
  double bound = 1.0 / sqrt((double)in); /* kaiming_uniform(a = sqrt(5)) and bias alike */
  int64_t ws[2] = {out_f, in};
  rc = loom__module_add_init(m, "weight", dt, 2, ws, uniform(bound, seed, 0));
  if (!rc && bias) rc = loom__module_add_init(m, "bias", dt, 1, &out_f, uniform(bound, seed, 1));
  return finish(m, rc, out);
}

/* ---- Conv2d ----------------------------------------------------------------------------- */

static int conv_forward(loom_module *m, loom_tensor *x, loom_tensor **out) {
  return loom_conv2d(x, param(m, 0), m->n_params > 1 ? param(m, 1) : NULL, &m->cfg[0],
                     &m->cfg[2], out);
}

int loom_nn_conv2d_create(int64_t in_ch, int64_t out_ch, const int64_t kernel[2],
                          const int64_t stride[2], const int64_t padding[2], bool bias,
                          loom_dtype dt, uint64_t seed, loom_module **out) {
  static const char *who = "loom_nn_conv2d_create";
  int rc = check_out(who, out);
  if (!rc) rc = check_float(who, dt);
  if (rc) return rc;
  if (!kernel || !stride || !padding)
    return loom__fail(LOOM_EINVAL, "%s: kernel, stride or padding is NULL", who);
  if (in_ch < 1 || out_ch < 1 || kernel[0] < 1 || kernel[1] < 1 || stride[0] < 1 ||
      stride[1] < 1 || padding[0] < 0 || padding[1] < 0)
    return loom__fail(LOOM_EINVAL,
                      "%s: channels, kernel and stride must be >= 1 and padding >= 0", who);
  loom_module *m = NULL;
  if ((rc = loom__module_new("Conv2d", conv_forward, &m))) return rc;
  m->cfg[0] = stride[0];
  m->cfg[1] = stride[1];
  m->cfg[2] = padding[0];
  m->cfg[3] = padding[1];
  double bound = 1.0 / sqrt((double)(in_ch * kernel[0] * kernel[1]));
  int64_t ws[4] = {out_ch, in_ch, kernel[0], kernel[1]};
  rc = loom__module_add_init(m, "weight", dt, 4, ws, uniform(bound, seed, 0));
  if (!rc && bias) rc = loom__module_add_init(m, "bias", dt, 1, &out_ch, uniform(bound, seed, 1));
  return finish(m, rc, out);
}

/* ---- LayerNorm -------------------------------------------------------------------------- */

static int ln_forward(loom_module *m, loom_tensor *x, loom_tensor **out) {
  return loom_layer_norm(x, (int)m->cfg[0], m->n_params ? param(m, 0) : NULL,
                         m->n_params ? param(m, 1) : NULL, m->fcfg[0], out);
}

int loom_nn_layer_norm_create(int normalized_ndim, const int64_t *normalized_shape, double eps,
                              bool affine, loom_dtype dt, loom_module **out) {
  static const char *who = "loom_nn_layer_norm_create";
  int rc = check_out(who, out);
  if (!rc) rc = check_float(who, dt);
  if (rc) return rc;
  if (normalized_ndim < 1 || normalized_ndim > LOOM_MAX_DIMS || !normalized_shape)
    return loom__fail(LOOM_EINVAL, "%s: normalized_ndim %d out of range or shape NULL", who,
                      normalized_ndim);
  for (int i = 0; i < normalized_ndim; i++)
    if (normalized_shape[i] < 1)
      return loom__fail(LOOM_EINVAL, "%s: normalized dim %d is %lld", who, i,
                        (long long)normalized_shape[i]);
  if (!(eps >= 0)) return loom__fail(LOOM_EINVAL, "%s: eps %g must be >= 0", who, eps);
  loom_module *m = NULL;
  if ((rc = loom__module_new("LayerNorm", ln_forward, &m))) return rc;
  m->cfg[0] = normalized_ndim;
  m->fcfg[0] = eps;
  if (affine) {
    const loom__init one = {.kind = LOOM__INIT_FILL, .a = 1.0}, zero = {.kind = LOOM__INIT_FILL};
    rc = loom__module_add_init(m, "weight", dt, normalized_ndim, normalized_shape, one);
    if (!rc) rc = loom__module_add_init(m, "bias", dt, normalized_ndim, normalized_shape, zero);
  }
  return finish(m, rc, out);
}

/* ---- Embedding -------------------------------------------------------------------------- */

static int emb_forward(loom_module *m, loom_tensor *x, loom_tensor **out) {
  return loom_embedding(param(m, 0), x, out);
}

int loom_nn_embedding_create(int64_t num, int64_t dim, loom_dtype dt, uint64_t seed,
                             loom_module **out) {
  static const char *who = "loom_nn_embedding_create";
  int rc = check_out(who, out);
  if (!rc) rc = check_float(who, dt);
  if (rc) return rc;
  if (num < 1 || dim < 1)
    return loom__fail(LOOM_EINVAL, "%s: num (%lld) and dim (%lld) must be >= 1", who,
                      (long long)num, (long long)dim);
  loom_module *m = NULL;
  if ((rc = loom__module_new("Embedding", emb_forward, &m))) return rc;
  int64_t ws[2] = {num, dim};
  const loom__init normal = {.kind = LOOM__INIT_NORMAL, .a = 0.0, .b = 1.0, .seed = seed};
  rc = loom__module_add_init(m, "weight", dt, 2, ws, normal);
  return finish(m, rc, out);
}

/* ---- bare leaves: parameters of zeros, not packed (a model's root initialises and packs) -- */

/* A new module of `type` with n f32 parameters (names[i], shapes[i] of ndims[i]) whose
 * initialisers say zeros until the model sets them. */
static int bare(const char *type, int (*fwd)(loom_module *, loom_tensor *, loom_tensor **),
                int n, const char *const *names, const int *ndims, const int64_t (*shapes)[2],
                loom_module **out) {
  loom_module *m = NULL;
  int rc = loom__module_new(type, fwd, &m);
  for (int i = 0; i < n && !rc; i++)
    rc = loom__module_add_init(m, names[i], LOOM_F32, ndims[i], shapes[i], (loom__init){0});
  if (rc) {
    loom_module_free(m);
    return rc;
  }
  *out = m;
  return LOOM_OK;
}

static const char *const weight_bias[2] = {"weight", "bias"};

int loom__linear_bare(int64_t in, int64_t out_f, loom_module **out) {
  const int nd[2] = {2, 1};
  const int64_t shapes[2][2] = {{out_f, in}, {out_f, 0}};
  int rc = bare("Linear", linear_forward, 2, weight_bias, nd, shapes, out);
  if (!rc) (*out)->cfg[0] = in, (*out)->cfg[1] = out_f;
  return rc;
}

int loom__layer_norm_bare(int64_t dim, double eps, loom_module **out) {
  const int nd[2] = {1, 1};
  const int64_t shapes[2][2] = {{dim, 0}, {dim, 0}};
  int rc = bare("LayerNorm", ln_forward, 2, weight_bias, nd, shapes, out);
  if (!rc) (*out)->cfg[0] = 1, (*out)->fcfg[0] = eps;
  return rc;
}

int loom__embedding_bare(int64_t num, int64_t dim, loom_module **out) {
  const int nd[1] = {2};
  const int64_t shapes[1][2] = {{num, dim}};
  return bare("Embedding", emb_forward, 1, weight_bias, nd, shapes, out);
}

/* ---- Pooling and flattening --------------------------------------------------------------- */

static int max_pool_forward(loom_module *m, loom_tensor *x, loom_tensor **out) {
  const int64_t *c = m->cfg;
  const int64_t k[2] = {c[0], c[1]}, s[2] = {c[2], c[3]}, p[2] = {c[4], c[5]};
  return loom_max_pool2d(x, k, s, p, out);
}

int loom_nn_max_pool2d_create(const int64_t kernel[2], const int64_t stride[2],
                              const int64_t padding[2], loom_module **out) {
  static const char *who = "loom_nn_max_pool2d_create";
  int rc = check_out(who, out);
  if (rc) return rc;
  if (!kernel) return loom__fail(LOOM_EINVAL, "%s: kernel is NULL", who);
  const int64_t *st = stride ? stride : kernel; /* PyTorch: stride defaults to the window */
  for (int i = 0; i < 2; i++) {
    int64_t pd = padding ? padding[i] : 0;
    if (kernel[i] < 1 || st[i] < 1 || pd < 0 || 2 * pd > kernel[i])
      return loom__fail(LOOM_EINVAL, "%s: kernel %lld, stride %lld, padding %lld (dim %d): the "
                        "window and stride must be >= 1 and the padding within 0..kernel/2", who,
                        (long long)kernel[i], (long long)st[i], (long long)pd, i);
  }
  loom_module *m = NULL;
  if ((rc = loom__module_new("MaxPool2d", max_pool_forward, &m))) return rc;
  for (int i = 0; i < 2; i++) {
    m->cfg[i] = kernel[i];
    m->cfg[2 + i] = st[i];
    m->cfg[4 + i] = padding ? padding[i] : 0;
  }
  return finish(m, LOOM_OK, out);
}

static int flatten_forward(loom_module *m, loom_tensor *x, loom_tensor **out) {
  return loom_flatten(x, (int)m->cfg[0], (int)m->cfg[1], out);
}

int loom_nn_flatten_create(int start_dim, int end_dim, loom_module **out) {
  static const char *who = "loom_nn_flatten_create";
  int rc = check_out(who, out);
  if (rc) return rc;
  if (start_dim < -LOOM_MAX_DIMS || start_dim >= LOOM_MAX_DIMS || end_dim < -LOOM_MAX_DIMS ||
      end_dim >= LOOM_MAX_DIMS)
    return loom__fail(LOOM_EINVAL, "%s: dims %d..%d out of range (at most %d dims)", who,
                      start_dim, end_dim, LOOM_MAX_DIMS);
  loom_module *m = NULL;
  if ((rc = loom__module_new("Flatten", flatten_forward, &m))) return rc;
  m->cfg[0] = start_dim;
  m->cfg[1] = end_dim;
  return finish(m, LOOM_OK, out);
}

/* ---- Dropout and activations ------------------------------------------------------------ */

static int dropout_forward(loom_module *m, loom_tensor *x, loom_tensor **out) {
  return loom_dropout(x, m->fcfg[0], m->seed + m->calls++, m->training, out);
}

int loom_nn_dropout_create(double p, uint64_t seed, loom_module **out) {
  static const char *who = "loom_nn_dropout_create";
  int rc = check_out(who, out);
  if (rc) return rc;
  if (!(p >= 0 && p < 1)) return loom__fail(LOOM_EINVAL, "%s: p = %g is outside [0, 1)", who, p);
  loom_module *m = NULL;
  if ((rc = loom__module_new("Dropout", dropout_forward, &m))) return rc;
  m->fcfg[0] = p;
  m->seed = seed;
  return finish(m, LOOM_OK, out);
}

static int act_forward(loom_module *m, loom_tensor *x, loom_tensor **out) {
  switch ((loom_activation)m->cfg[0]) {
  case LOOM_ACT_RELU: return loom_relu(x, out);
  case LOOM_ACT_GELU: return loom_gelu(x, LOOM_GELU_EXACT, out);
  case LOOM_ACT_GELU_TANH: return loom_gelu(x, LOOM_GELU_TANH, out);
  case LOOM_ACT_TANH: return loom_tanh(x, out);
  default: return loom_sigmoid(x, out);
  }
}

int loom_nn_activation_create(loom_activation act, loom_module **out) {
  static const char *who = "loom_nn_activation_create";
  static const char *const names[] = {"ReLU", "GELU", "GELU", "Tanh", "Sigmoid"};
  int rc = check_out(who, out);
  if (rc) return rc;
  if ((unsigned)act > LOOM_ACT_SIGMOID)
    return loom__fail(LOOM_EINVAL, "%s: unknown activation %d", who, (int)act);
  loom_module *m = NULL;
  if ((rc = loom__module_new(names[act], act_forward, &m))) return rc;
  m->cfg[0] = act;
  return finish(m, LOOM_OK, out);
}
