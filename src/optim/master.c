/* master.c: f32 master weights for a bf16 / f16 parameter buffer: the widened copy the
 * optimizer steps, an f32 gradient buffer, and the round-to-nearest-even copy back through
 * the core conversion kernels. */
#include "optim/optim_int.h"

struct loom_master {
  loom_dtype dt;
  void *model; /* retained: n elements of dt */
  float *param;
  float *grad;
  size_t n;
};

void loom_master_free(loom_master *m) {
  if (!m) return;
  loom__free(m->param);
  loom__free(m->grad);
  loom__free(m);
}

int loom_master_create(loom_dtype dt, void *params, size_t n, loom_pool pool,
                       loom_master **out) {
  if (!out) return loom__fail(LOOM_EINVAL, "loom_master_create: out is NULL");
  *out = NULL;
  if (dt != LOOM_BF16 && dt != LOOM_F16)
    return loom__fail(LOOM_EDTYPE, "loom_master_create: dtype %s is not bf16 or f16",
                      loom_dtype_name(dt));
  if (n && !params) return loom__fail(LOOM_EINVAL, "loom_master_create: params is NULL");
  if ((unsigned)pool >= LOOM_POOL_COUNT)
    return loom__fail(LOOM_EINVAL, "loom_master_create: pool %d out of range", (int)pool);
  if (n > SIZE_MAX / sizeof(float))
    return loom__fail(LOOM_EOVERFLOW, "loom_master_create: %zu elements overflow", n);
  int rc = LOOM_OK;
  loom_master *m = loom__calloc(LOOM_POOL_META, 1, sizeof *m);
  LOOM_TRY_ALLOC(m, "the master header");
  m->dt = dt;
  m->model = params;
  m->n = n;
  m->param = loom__malloc(pool, (n ? n : 1) * sizeof(float));
  LOOM_TRY_ALLOC(m->param, "the f32 master weights");
  m->grad = loom__calloc(pool, n ? n : 1, sizeof(float));
  LOOM_TRY_ALLOC(m->grad, "the f32 gradients");
  LOOM_TRY(loom_convert(params, dt, m->param, LOOM_F32, n));
  *out = m;
  return LOOM_OK;
done:
  loom_master_free(m);
  return rc;
}

int loom_master_load_grads(loom_master *m, const void *grads) {
  if (!m || (m->n && !grads)) return loom__fail(LOOM_EINVAL, "loom_master_load_grads: NULL argument");
  return loom_convert(grads, m->dt, m->grad, LOOM_F32, m->n);
}

int loom_master_sync(loom_master *m) {
  if (!m) return loom__fail(LOOM_EINVAL, "loom_master_sync: master is NULL");
  return loom_convert(m->param, LOOM_F32, m->model, m->dt, m->n);
}

loom_param_seg loom_master_segment(const loom_master *m, const char *name) {
  loom_param_seg s = {.name = name};
  if (m) {
    s.param = m->param;
    s.grad = m->grad;
    s.n = m->n;
  }
  return s;
}

float *loom_master_params(const loom_master *m) { return m ? m->param : NULL; }
float *loom_master_grads(const loom_master *m) { return m ? m->grad : NULL; }
size_t loom_master_numel(const loom_master *m) { return m ? m->n : 0; }
