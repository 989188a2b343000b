/* op_common.c: the single dispatch point every op goes through (input checks and the
 * autocast hook), argument checks with messages, f32 staging of inputs and outputs, NumPy
 * broadcasting and the strided iteration the elementwise and reduction ops share. */
#include "autocast/autocast_int.h"
#include "loom/autocast.h"
#include "ops/ops_int.h"

#include <string.h>

_Atomic(loom__autocast_fn) loom__autocast_hook = NULL;

_Static_assert((int)LOOM_OPK_COUNT == (int)LOOM_AMP_OP_COUNT,
               "loom_op_kind is generated from autocast's list of kinds");

/* ---- the cast cache ------------------------------------------------------------------------
 * Casts of f32 leaves that require grad, made by autocast, are kept for the life of the
 * thread's outermost autocast region (DESIGN "Autocast"): a parameter used by several ops is
 * cast once, and its cast node gathers all their gradients. An entry retains its source, so
 * the pointer cannot be reused while cached; the autocast layer's exit hook drops them all. */
typedef struct cast_entry {
  loom_tensor *src, *cast;
  loom_dtype dt;
  uint64_t gen;
} cast_entry;

static _Thread_local cast_entry *cache;
static _Thread_local int cache_n, cache_cap;

static void cache_drop(uint64_t gen) {
  (void)gen;
  for (int i = 0; i < cache_n; i++) {
    loom_tensor_free(cache[i].src);
    loom_tensor_free(cache[i].cast);
  }
  loom__free(cache);
  cache = NULL;
  cache_n = cache_cap = 0;
}

__attribute__((constructor)) static void install_exit_hook(void) {
  loom__autocast_set_exit_hook(cache_drop);
}

/* Only casts made with grad mode on are cached (and used): a cast made under no-grad (a
 * checkpointed forward, loom_autograd_checkpoint) has no node, and handing it to the
 * recomputation in backward would cut the parameter off its gradient. */
static bool cacheable(const loom_tensor *t) {
  return t->dtype == LOOM_F32 && loom_tensor_requires_grad(t) && loom_tensor_is_leaf(t) &&
         loom_autocast_depth() > 0 && loom_grad_enabled();
}

/* A cached cast of t to dt for this region (a new reference), or NULL. */
static loom_tensor *cache_get(const loom_tensor *t, loom_dtype dt) {
  uint64_t gen = loom_autocast_generation();
  for (int i = 0; i < cache_n; i++) {
    cast_entry *e = &cache[i];
    if (e->src != t || e->dt != dt || e->gen != gen) continue;
    const loom__meta *m = e->cast->autograd;
    if (m && m->grad_fn && m->grad_fn->released) return NULL; /* spent by a backward */
    return loom_tensor_retain(e->cast);
  }
  return NULL;
}

static void cache_put(loom_tensor *t, loom_dtype dt, loom_tensor *cast) {
  uint64_t gen = loom_autocast_generation();
  if (cache_n && cache[0].gen != gen) cache_drop(gen); /* left over from an older region */
  for (int i = 0; i < cache_n; i++) /* replace a spent entry */
    if (cache[i].src == t && cache[i].dt == dt) {
      loom_tensor_free(cache[i].cast);
      cache[i].cast = loom_tensor_retain(cast);
      return;
    }
  if (cache_n == cache_cap) {
    int cap = cache_cap ? 2 * cache_cap : 16;
    cast_entry *v = loom__malloc(LOOM_POOL_COMPUTE, (size_t)cap * sizeof *v);
    if (!v) return; /* no cache: still correct, only slower */
    if (cache_n) memcpy(v, cache, (size_t)cache_n * sizeof *v);
    loom__free(cache);
    cache = v;
    cache_cap = cap;
  }
  cache[cache_n++] = (cast_entry){loom_tensor_retain(t), loom_tensor_retain(cast), dt, gen};
}

/* The policy for this op: the installed hook if any, else this thread's autocast state. */
static bool autocast_want(loom_op_kind kind, const loom_dtype *dts, int n, loom_dtype *want) {
  loom__autocast_fn hook = atomic_load_explicit(&loom__autocast_hook, memory_order_relaxed);
  if (hook) return hook(kind, dts, n, want);
  return loom_autocast_dtype_for((loom_amp_op)kind, dts, n, want);
}

const char *loom_op_kind_name(loom_op_kind kind) { return loom_amp_op_name((loom_amp_op)kind); }

/* ---- checks --------------------------------------------------------------------------- */

int loom__check_in(const char *op, const loom_tensor *t, const char *arg) {
  if (!t) return loom__fail(LOOM_EINVAL, "%s: %s is NULL", op, arg);
  if (t->magic != LOOM__TENSOR_MAGIC)
    return loom__fail(LOOM_EMISUSE, "%s: %s is not a live tensor (freed?)", op, arg);
  return LOOM_OK;
}

int loom__check_float(const char *op, const loom_tensor *t, const char *arg) {
  int rc = loom__check_in(op, t, arg);
  if (rc) return rc;
  if (!loom_dtype_is_float(t->dtype))
    return loom__fail(LOOM_EDTYPE, "%s: %s must be f32, f16 or bf16, not %s", op, arg,
                      loom_dtype_name(t->dtype));
  return LOOM_OK;
}

int loom__check_same_dtype(const char *op, const loom_tensor *a, const loom_tensor *b) {
  if (a->dtype != b->dtype)
    return loom__fail(LOOM_EDTYPE, "%s: inputs have different dtypes %s and %s", op,
                      loom_dtype_name(a->dtype), loom_dtype_name(b->dtype));
  return LOOM_OK;
}

int loom__check_out(const char *op, loom_tensor **out) {
  if (!out) return loom__fail(LOOM_EINVAL, "%s: out is NULL", op);
  *out = NULL;
  return LOOM_OK;
}

int loom__norm_dim(const char *op, int dim, int ndim, int *out) {
  int d = dim < 0 ? dim + ndim : dim;
  if (d < 0 || d >= ndim)
    return loom__fail(LOOM_EINVAL, "%s: dim %d out of range for a tensor of rank %d", op, dim,
                      ndim);
  *out = d;
  return LOOM_OK;
}

/* ---- dispatch ------------------------------------------------------------------------- */

int loom__op_begin(loom__op *c, loom_op_kind kind, loom_tensor *const *in, int n) {
  memset(c, 0, sizeof *c);
  c->kind = kind;
  c->name = loom_op_kind_name(kind);
  c->n = n;
  c->in = c->in_small;
  c->cast = c->cast_small;
  loom_dtype dts_small[LOOM__OP_MAX_IN], *dts = dts_small;
  if (n > LOOM__OP_MAX_IN) {
    c->in = loom__calloc(LOOM_POOL_COMPUTE, (size_t)n, sizeof *c->in);
    c->cast = loom__calloc(LOOM_POOL_COMPUTE, (size_t)n, sizeof *c->cast);
    dts = loom__calloc(LOOM_POOL_COMPUTE, (size_t)n, sizeof *dts);
    if (!c->in || !c->cast || !dts) {
      if (dts != dts_small) loom__free(dts);
      loom__op_end(c);
      return loom__fail(LOOM_ENOMEM, "%s: out of memory for %d inputs", c->name, n);
    }
  }
  int rc = LOOM_OK, nf = 0;
  for (int i = 0; i < n; i++) {
    c->in[i] = in[i];
    if (in[i] && in[i]->magic != LOOM__TENSOR_MAGIC) {
      rc = loom__fail(LOOM_EMISUSE, "%s: input %d is not a live tensor (freed?)", c->name, i);
      goto done;
    }
    if (in[i] && loom__tensor_released(in[i])) {
      rc = loom__fail(LOOM_EMISUSE, "%s: input %d holds no data (a sharded FSDP parameter "
                      "outside its unit's forward and backward?)", c->name, i);
      goto done;
    }
    if (in[i] && loom_dtype_is_float(in[i]->dtype)) dts[nf++] = in[i]->dtype;
  }
  loom_dtype want;
  if (kind == LOOM_OPK_CAST || nf == 0 || !autocast_want(kind, dts, nf, &want)) goto done;
  for (int i = 0; i < n; i++) {
    if (!in[i] || !loom_dtype_is_float(in[i]->dtype) || in[i]->dtype == want) continue;
    bool cache_it = cacheable(in[i]);
    if (cache_it) c->cast[i] = cache_get(in[i], want);
    if (!c->cast[i]) {
      LOOM_TRY(loom_cast(in[i], want, &c->cast[i]));
      if (cache_it) cache_put(in[i], want, c->cast[i]);
    }
    c->in[i] = c->cast[i];
  }
done:
  if (dts != dts_small) loom__free(dts);
  if (rc) loom__op_end(c);
  return rc;
}

void loom__op_end(loom__op *c) {
  for (int i = 0; c->cast && i < c->n; i++) {
    loom_tensor_free(c->cast[i]);
    c->cast[i] = NULL;
  }
  if (c->in != c->in_small) loom__free(c->in);
  if (c->cast != c->cast_small) loom__free(c->cast);
  c->in = c->in_small;
  c->cast = c->cast_small;
  c->n = 0;
}

int loom__op_finish(loom__op *c, int rc, loom_tensor *y, loom_tensor **out) {
  if (rc) loom_tensor_free(y);
  else *out = y;
  loom__op_end(c);
  return rc;
}

int loom__op_record(loom__op *c, loom_tensor *out, loom__backward_fn bwd, loom__node **node) {
  *node = NULL;
  if (!loom__ag_needs(c->in, c->n)) return LOOM_OK;
  loom__node *nd = NULL;
  int rc = loom__node_new(c->kind, c->name, c->in, c->n, bwd, &nd);
  if (!rc) rc = loom__node_attach(nd, out);
  if (!rc) *node = nd;
  return rc;
}

/* ---- f32 staging ---------------------------------------------------------------------- */

int loom__f32_in(const loom_tensor *t, loom__fbuf *b) {
  b->tmp = NULL;
  if (t->dtype == LOOM_F32 && loom_tensor_is_contiguous(t)) {
    b->p = loom_tensor_data(t);
    return LOOM_OK;
  }
  size_t n = loom_tensor_numel(t);
  b->tmp = loom__malloc(LOOM_POOL_COMPUTE, (n ? n : 1) * sizeof(float));
  if (!b->tmp) return loom__fail(LOOM_ENOMEM, "ops: out of memory staging %zu values", n);
  b->p = b->tmp;
  return loom_tensor_read(t, LOOM_F32, b->tmp, n * sizeof(float));
}

int loom__f32_out(loom_dtype dt, int ndim, const int64_t *shape, loom_tensor **t,
                  loom__fbuf *b) {
  b->tmp = NULL;
  b->p = NULL;
  int rc = loom_tensor_empty(dt, ndim, shape, t);
  if (rc) return rc;
  if (dt == LOOM_F32) {
    b->p = loom_tensor_data(*t);
    return LOOM_OK;
  }
  size_t n = loom_tensor_numel(*t);
  b->tmp = loom__malloc(LOOM_POOL_COMPUTE, (n ? n : 1) * sizeof(float));
  if (!b->tmp) {
    loom_tensor_free(*t);
    *t = NULL;
    return loom__fail(LOOM_ENOMEM, "ops: out of memory staging %zu values", n);
  }
  b->p = b->tmp;
  return LOOM_OK;
}

void loom__f32_out_commit(loom_tensor *t, loom__fbuf *b) {
  if (b->tmp) {
    loom_convert(b->tmp, LOOM_F32, loom_tensor_data(t), t->dtype, loom_tensor_numel(t));
    loom__free(b->tmp);
    b->tmp = NULL;
  }
}

void loom__fbuf_free(loom__fbuf *b) {
  loom__free(b->tmp);
  b->tmp = NULL;
}

int loom__grad_new(int ndim, const int64_t *shape, bool zero, loom_tensor **out) {
  return zero ? loom_tensor_zeros(LOOM_F32, ndim, shape, out)
              : loom_tensor_empty(LOOM_F32, ndim, shape, out);
}

int loom__grad_dst_sink(loom__node *n, int i, loom_tensor **gin, float **p, float *beta,
                        loom__sink *s) {
  *p = NULL;
  *beta = 0.0f;
  if (loom__grad_sink(n, i, s)) {
    *p = s->p;
    *beta = s->beta;
    return LOOM_OK;
  }
  int rc = loom__grad_new(n->in[i].ndim, n->in[i].shape, false, &gin[i]);
  if (!rc) *p = loom__f(gin[i]);
  return rc;
}

int loom__grad_dst(loom__node *n, int i, loom_tensor **gin, float **p, float *beta) {
  loom__sink s;
  return loom__grad_dst_sink(n, i, gin, p, beta, &s);
}

/* ---- broadcasting --------------------------------------------------------------------- */

int loom__broadcast_shape(const char *op, int na, const int64_t *sa, int nb, const int64_t *sb,
                          int *nout, int64_t *sout) {
  int n = na > nb ? na : nb;
  for (int i = 0; i < n; i++) {
    int ia = na - n + i, ib = nb - n + i;
    int64_t da = ia >= 0 ? sa[ia] : 1, db = ib >= 0 ? sb[ib] : 1;
    if (da != db && da != 1 && db != 1) {
      char x[96], y[96];
      return loom__fail(LOOM_ESHAPE, "%s: shapes %s and %s do not broadcast (dim %d: %lld vs %lld)",
                        op, loom__shape_str(na, sa, x, sizeof x),
                        loom__shape_str(nb, sb, y, sizeof y), i, (long long)da, (long long)db);
    }
    sout[i] = da == 1 ? db : da;
  }
  *nout = n;
  return LOOM_OK;
}

void loom__bcast_strides(int nout, const int64_t *sout, int nd, const int64_t *shape,
                         int64_t *strides) {
  int64_t s = 1;
  for (int i = nout - 1; i >= 0; i--) {
    int j = nd - nout + i;
    if (j < 0 || (shape[j] == 1 && sout[i] != 1)) {
      strides[i] = 0;
    } else {
      strides[i] = s;
      s *= shape[j];
    }
  }
}

void loom__iter3(int ndim, const int64_t *shape, float *p0, const int64_t *st0, const float *p1,
                 const int64_t *st1, const float *p2, const int64_t *st2, loom__run_fn fn,
                 void *ctx) {
  static const int64_t zeros[LOOM_MAX_DIMS] = {0};
  if (loom__dry()) return;
  int64_t sh[LOOM_MAX_DIMS], s[3][LOOM_MAX_DIMS];
  const int64_t *in[3] = {st0, st1 ? st1 : zeros, st2 ? st2 : zeros};
  int nd = 0;
  /* drop size-1 dims, merge dim i into the previous one where contiguous for all operands */
  for (int i = 0; i < ndim; i++) {
    if (shape[i] == 0) return;
    if (shape[i] == 1) continue;
    if (nd > 0 && in[0][i] * shape[i] == s[0][nd - 1] && in[1][i] * shape[i] == s[1][nd - 1] &&
        in[2][i] * shape[i] == s[2][nd - 1]) {
      sh[nd - 1] *= shape[i];
      for (int k = 0; k < 3; k++) s[k][nd - 1] = in[k][i];
      continue;
    }
    sh[nd] = shape[i];
    for (int k = 0; k < 3; k++) s[k][nd] = in[k][i];
    nd++;
  }
  if (nd == 0) {
    fn(1, p0, p1, p2, 0, 0, 0, ctx);
    return;
  }
  int64_t idx[LOOM_MAX_DIMS] = {0}, inner = sh[nd - 1];
  int64_t o0 = 0, o1 = 0, o2 = 0;
  for (;;) {
    fn(inner, p0 + o0, p1 ? p1 + o1 : NULL, p2 ? p2 + o2 : NULL, s[0][nd - 1], s[1][nd - 1],
       s[2][nd - 1], ctx);
    int d = nd - 2;
    for (; d >= 0; d--) {
      o0 += s[0][d];
      o1 += s[1][d];
      o2 += s[2][d];
      if (++idx[d] < sh[d]) break;
      o0 -= s[0][d] * sh[d];
      o1 -= s[1][d] * sh[d];
      o2 -= s[2][d] * sh[d];
      idx[d] = 0;
    }
    if (d < 0) return;
  }
}

static void run_accum(int64_t n, float *d, const float *g, const float *unused, int64_t sd,
                      int64_t sg, int64_t s2, void *ctx) {
  if (sd == 0) {
    float acc = 0;
    for (int64_t i = 0; i < n; i++) acc += g[i * sg];
    d[0] += acc;
  } else if (sd == 1 && sg == 1) {
    for (int64_t i = 0; i < n; i++) d[i] += g[i];
  } else {
    for (int64_t i = 0; i < n; i++) d[i * sd] += g[i * sg];
  }
}

void loom__reduce_to(const float *g, int nout, const int64_t *sout, float *dst, int nd,
                     const int64_t *shape) {
  int64_t sd[LOOM_MAX_DIMS], sg[LOOM_MAX_DIMS];
  if (loom__dry()) return;
  size_t n = 1;
  bool same = nd == nout;
  for (int i = 0; i < nd; i++) {
    n *= (size_t)shape[i];
    same = same && shape[i] == sout[i];
  }
  if (same) { /* nothing to reduce: the gradient passes through as it is */
    memcpy(dst, g, n * sizeof *dst);
    return;
  }
  memset(dst, 0, n * sizeof *dst);
  loom__bcast_strides(nout, sout, nd, shape, sd);
  loom__bcast_strides(nout, sout, nout, sout, sg);
  loom__iter3(nout, sout, dst, sd, g, sg, NULL, NULL, run_accum, NULL);
}
