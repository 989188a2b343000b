/* ddp_model.c: the DDP tests' MLP (see ddp_model.h). */
#include "ddp_model.h"

#include <string.h>

const char *const model_names[MODEL_NPARAMS] = {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"};
static const int64_t shapes[MODEL_NPARAMS][2] = {
    {MODEL_HIDDEN, MODEL_IN}, {MODEL_HIDDEN, 0}, {MODEL_OUT, MODEL_HIDDEN}, {MODEL_OUT, 0}};

static float hash_unit(uint64_t x) { /* a value in [-1, 1) from an integer */
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return (float)((double)(x >> 11) / (double)(1ull << 52)) - 1.0f;
}

int model_init(model *m, uint64_t seed) {
  memset(m, 0, sizeof *m);
  for (int i = 0; i < MODEL_NPARAMS; i++) {
    int nd = shapes[i][1] ? 2 : 1;
    int rc = loom_tensor_empty(LOOM_F32, nd, shapes[i], &m->p[i]);
    if (rc) return rc;
    float *d = loom_tensor_data(m->p[i]);
    for (size_t k = 0; k < loom_tensor_numel(m->p[i]); k++)
      d[k] = 0.3f * hash_unit(seed * 1000003u + (uint64_t)i * 65537u + k);
    if ((rc = loom_tensor_set_requires_grad(m->p[i], true))) return rc;
  }
  return LOOM_OK;
}

void model_free(model *m) {
  for (int i = 0; i < MODEL_NPARAMS; i++) loom_tensor_free(m->p[i]);
  memset(m, 0, sizeof *m);
}

int model_backward(model *m, int64_t row0, int64_t rows, float loss_scale) {
  return model_backward_amp(m, row0, rows, loss_scale, LOOM_AUTOCAST_OFF);
}

int model_backward_amp(model *m, int64_t row0, int64_t rows, float loss_scale,
                       loom_autocast_mode mode) {
  int rc;
  loom_autocast_token tok = {0};
  int64_t xs[2] = {rows, MODEL_IN}, ys[2] = {rows, MODEL_OUT};
  loom_tensor *x = NULL, *y = NULL, *h = NULL, *a = NULL, *o = NULL, *loss = NULL, *scaled = NULL;
  if ((rc = loom_tensor_empty(LOOM_F32, 2, xs, &x)) || (rc = loom_tensor_empty(LOOM_F32, 2, ys, &y)))
    goto done;
  float *xd = loom_tensor_data(x), *yd = loom_tensor_data(y);
  for (int64_t r = 0; r < rows; r++) {
    for (int k = 0; k < MODEL_IN; k++) xd[r * MODEL_IN + k] = hash_unit(7777u + (uint64_t)(row0 + r) * 131u + k);
    for (int k = 0; k < MODEL_OUT; k++) yd[r * MODEL_OUT + k] = hash_unit(9999u + (uint64_t)(row0 + r) * 17u + k);
  }
  if ((rc = loom_autocast_enter(mode, NULL, &tok))) goto done;
  if ((rc = loom_linear(x, m->p[0], m->p[1], &h)) || (rc = loom_tanh(h, &a)) ||
      (rc = loom_linear(a, m->p[2], m->p[3], &o)) || (rc = loom_mse(o, y, LOOM_REDUCTION_MEAN, &loss)))
    goto done;
  if ((rc = loom_autocast_exit(&tok))) goto done;
  if (loss_scale != 1.0f) {
    if ((rc = loom_mul_scalar(loss, loss_scale, &scaled))) goto done;
    rc = loom_backward(scaled, NULL, false);
  } else {
    rc = loom_backward(loss, NULL, false);
  }
done:
  if (tok.owner) loom_autocast_exit(&tok);
  loom_tensor_free(x);
  loom_tensor_free(y);
  loom_tensor_free(h);
  loom_tensor_free(a);
  loom_tensor_free(o);
  loom_tensor_free(loss);
  loom_tensor_free(scaled);
  return rc;
}

void model_sgd(model *m, float lr) {
  for (int i = 0; i < MODEL_NPARAMS; i++) {
    loom_tensor *g = loom_tensor_grad(m->p[i]);
    if (!g) continue;
    float *p = loom_tensor_data(m->p[i]), *gd = loom_tensor_data(g);
    for (size_t k = 0; k < loom_tensor_numel(m->p[i]); k++) p[k] -= lr * gd[k];
    loom_tensor_zero_grad(m->p[i]);
  }
}

size_t model_numel(void) {
  return MODEL_HIDDEN * MODEL_IN + MODEL_HIDDEN + MODEL_OUT * MODEL_HIDDEN + MODEL_OUT;
}

void model_flatten(const model *m, float *out, bool grads) {
  size_t off = 0;
  for (int i = 0; i < MODEL_NPARAMS; i++) {
    size_t n = loom_tensor_numel(m->p[i]);
    loom_tensor *t = grads ? loom_tensor_grad(m->p[i]) : m->p[i];
    if (t) memcpy(out + off, loom_tensor_data(t), n * sizeof(float));
    else memset(out + off, 0, n * sizeof(float));
    off += n;
  }
}
