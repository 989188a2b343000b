/* init.c: parameters' initial values. Each parameter carries its initialiser (a recipe:
 * constant, uniform or normal, keyed by seed and stream) and its values are made from it only
 * when it is given memory: by packing (the whole parameter, into the module's arena) or by FSDP
 * (this rank's slice only). Values come from the counter-based Philox generator
 * (loom_rng_at_uniform / _normal), so a slice equals the same slice of the whole, bit for bit.
 * Also deferred initialisation (PyTorch's meta device; DeepSpeed's zero.Init): the thread's
 * switch, materialising a deferred module, and the recipes' hash that ranks compare. */
#include "nn/nn_int.h"

#include <string.h>

static _Thread_local bool deferred_on;

bool loom_nn_set_deferred_init(bool on) {
  bool was = deferred_on;
  deferred_on = on;
  return was;
}

bool loom_nn_deferred_init(void) { return deferred_on; }

void loom__init_values(const loom__init *in, size_t lo, size_t hi, float *dst) {
  const double a = in->a, b = in->b;
  switch (in->kind) {
  case LOOM__INIT_UNIFORM:
    loom_rng_at_fill_uniform(in->seed, in->stream, lo, hi, -a, a, dst);
    break;
  case LOOM__INIT_NORMAL:
    loom_rng_at_fill_normal(in->seed, in->stream, lo, hi, a, b, dst);
    break;
  default:
    for (size_t i = lo; i < hi; i++) dst[i - lo] = (float)a;
    break;
  }
}

int loom__param_init_into(const loom__param *p, size_t lo, size_t hi, void *dst, loom_dtype dt) {
  if (loom__dry() || lo >= hi) return LOOM_OK;
  if (dt == LOOM_F32) {
    loom__init_values(&p->init, lo, hi, dst);
    return LOOM_OK;
  }
  float buf[1024]; /* f32 first, then rounded to the parameter's dtype a block at a time */
  size_t el = loom_dtype_size(dt);
  for (size_t at = lo; at < hi; at += 1024) {
    size_t n = hi - at < 1024 ? hi - at : 1024;
    loom__init_values(&p->init, at, at + n, buf);
    int rc = loom_convert(buf, LOOM_F32, (char *)dst + (at - lo) * el, dt, n);
    if (rc) return rc;
  }
  return LOOM_OK;
}

int loom__module_add_init(loom_module *m, const char *name, loom_dtype dt, int ndim,
                          const int64_t *shape, loom__init init) {
  loom_tensor *t = NULL;
  int rc = loom__tensor_shell(dt, ndim, shape, &t);
  if (rc) return rc;
  loom__module_add_param(m, name, t);
  m->params[m->n_params - 1].init = init;
  return LOOM_OK;
}

uint64_t loom__module_init_hash(const loom_module *root) {
  uint64_t h = LOOM__FNV1A_BASIS;
  for (size_t i = 0; i < root->n_flat; i++) {
    const loom__param *p = root->flat[i];
    const loom__init *in = &p->init;
    int32_t kind = (int32_t)in->kind;
    h = loom__fnv1a(h, &kind, sizeof kind);
    h = loom__fnv1a(h, &in->a, sizeof in->a);
    h = loom__fnv1a(h, &in->b, sizeof in->b);
    h = loom__fnv1a(h, &in->seed, sizeof in->seed);
    h = loom__fnv1a(h, &in->stream, sizeof in->stream);
  }
  return h;
}

/* ---- the public side (loom/nn.h) ------------------------------------------------------------ */

bool loom_module_deferred(const loom_module *m) {
  while (m && m->parent) m = m->parent;
  return m && m->deferred;
}

int loom_module_materialize(loom_module *m) {
  if (!m) return loom__fail(LOOM_EINVAL, "loom_module_materialize: module is NULL");
  if (m->parent)
    return loom__fail(LOOM_EMISUSE, "loom_module_materialize: the module is inside another %s; "
                      "materialise the root", m->parent->type);
  if (!m->deferred) return LOOM_OK;
  int rc = loom__module_pack_as(m, false);
  /* the arenas are made before any parameter changes: without them, deferred as before */
  if (rc && loom__module_pack_as(m, true)) return rc;
  return rc;
}

int loom_module_init_values(const loom_module *m, size_t i, size_t lo, size_t hi, float *dst) {
  static const char *who = "loom_module_init_values";
  if (!m || (!dst && hi > lo)) return loom__fail(LOOM_EINVAL, "%s: module or dst is NULL", who);
  if (m->parent)
    return loom__fail(LOOM_EMISUSE, "%s: the module is inside another %s; ask the root", who,
                      m->parent->type);
  if (i >= m->n_flat)
    return loom__fail(LOOM_EINVAL, "%s: index %zu out of range (%zu parameters)", who, i,
                      m->n_flat);
  const loom__param *p = m->flat[i];
  size_t n = loom_tensor_numel(p->value);
  if (lo > hi || hi > n)
    return loom__fail(LOOM_EINVAL, "%s: elements [%zu, %zu) are not within %s's %zu", who, lo,
                      hi, p->full, n);
  if (!loom__dry()) loom__init_values(&p->init, lo, hi, dst);
  return LOOM_OK;
}
