/* bucket_manager.c: the specification's GradientBucket and GradientBucketManager: one flat
 * buffer per bucket, prepare (flatten), asynchronous all-reduce, is-reduced, wait, copy back,
 * and the all-buckets forms. Gradients that are views of their bucket at their offset (DDP's
 * layout) skip the prepare and copy-back copies. */
#include "ddp/ddp_int.h"
#include "core/layout.h"
#include "core/tensor_int.h"
#include "loom/autograd.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

double loom__ddp_now(void) {
  return loom__now();
}

void loom_bucket_manager_free(loom_bucket_manager *m) {
  if (!m) return;
  for (size_t b = 0; b < m->plan.nbuckets; b++) {
    if (m->b) {
      loom_work_wait(&m->b[b].work); /* never leave a collective writing into freed memory */
      loom_tensor_free(m->b[b].buffer);
      loom__free(m->b[b].wire);
    }
  }
  for (size_t i = 0; m->grads && i < m->n; i++) loom_tensor_free(m->grads[i]);
  loom__free(m->grads);
  loom__free(m->b);
  loom__bucket_plan_free(&m->plan);
  loom__free(m);
}

/* Allocate the manager and its plan for gradients of these sizes and dtypes; no buffers yet. */
static int alloc_manager(loom_pg *pg, const size_t *numel, const loom_dtype *dtype, size_t n,
                         const loom_bucket_cfg *cfg, bool wire_set, loom_dtype wire,
                         loom_bucket_manager **out) {
  int rc = LOOM_OK;
  loom_bucket_cfg defaults;
  if (!cfg) {
    defaults = loom_bucket_cfg_default();
    cfg = &defaults;
  }
  loom_bucket_manager *m = loom__calloc(LOOM_POOL_META, 1, sizeof *m);
  LOOM_TRY_ALLOC(m, "the bucket manager");
  m->pg = pg;
  m->n = n;
  m->wire_set = wire_set;
  m->wire = wire;
  m->grads = loom__calloc(LOOM_POOL_META, n ? n : 1, sizeof *m->grads);
  LOOM_TRY_ALLOC(m->grads, "the gradient list");
  LOOM_TRY(loom__bucket_plan_make(numel, dtype, n, cfg, &m->plan));
  m->b = loom__calloc(LOOM_POOL_META, m->plan.nbuckets ? m->plan.nbuckets : 1, sizeof *m->b);
  LOOM_TRY_ALLOC(m->b, "the buckets");
  *out = m;
  return LOOM_OK;
done:
  loom_bucket_manager_free(m);
  return rc;
}

/* A buffer of its own for every bucket that is not a view yet, and the wire buffers. */
static int make_buffers(loom_bucket_manager *m) {
  int rc = LOOM_OK;
  for (size_t b = 0; b < m->plan.nbuckets; b++) {
    int64_t len = (int64_t)m->plan.numel[b];
    if (!m->b[b].buffer) LOOM_TRY(loom_tensor_zeros(m->plan.dtype[b], 1, &len, &m->b[b].buffer));
    if (m->wire_set && m->wire != m->plan.dtype[b]) {
      m->b[b].wire = loom__malloc(LOOM_POOL_COMPUTE, m->plan.numel[b] * loom_dtype_size(m->wire) + 1);
      LOOM_TRY_ALLOC(m->b[b].wire, "a bucket's wire buffer");
    }
  }
done:
  return rc;
}

/* The sizes and dtypes of tensors, checked to be usable as gradients. */
static int describe(const char *who, loom_tensor *const *ts, size_t n, size_t **numel,
                    loom_dtype **dtype) {
  int rc = LOOM_OK;
  *numel = loom__calloc(LOOM_POOL_META, n ? n : 1, sizeof **numel);
  *dtype = loom__calloc(LOOM_POOL_META, n ? n : 1, sizeof **dtype);
  if (!*numel || !*dtype) return loom__fail(LOOM_ENOMEM, "%s: out of memory", who);
  for (size_t i = 0; i < n; i++) {
    if ((rc = loom_tensor_check(ts[i], who))) return rc;
    if (!loom_dtype_is_float(loom_tensor_dtype(ts[i])))
      return loom__fail(LOOM_EDTYPE, "%s: tensor %zu is %s, not floating point", who, i,
                        loom_dtype_name(loom_tensor_dtype(ts[i])));
    for (size_t j = 0; j < i; j++)
      if (ts[j] == ts[i]) return loom__fail(LOOM_EINVAL, "%s: tensor %zu appears twice", who, i);
    (*numel)[i] = loom_tensor_numel(ts[i]);
    (*dtype)[i] = loom_tensor_dtype(ts[i]);
  }
  return LOOM_OK;
}

int loom_bucket_manager_create(loom_pg *pg, loom_tensor *const *grads, size_t n,
                               const loom_bucket_cfg *cfg, loom_bucket_manager **out) {
  static const char *who = "loom_bucket_manager_create";
  if (!out) return loom__fail(LOOM_EINVAL, "%s: out is NULL", who);
  *out = NULL;
  if (!pg) return loom__fail(LOOM_EINVAL, "%s: process group is NULL", who);
  if (n && !grads) return loom__fail(LOOM_EINVAL, "%s: grads is NULL", who);
  if (cfg) {
    int rc = loom_bucket_cfg_validate(cfg);
    if (rc) return rc;
  }
  size_t *numel = NULL;
  loom_dtype *dtype = NULL;
  int rc = describe(who, grads, n, &numel, &dtype);
  if (!rc) {
    for (size_t i = 0; i < n && !rc; i++)
      if (!loom_tensor_is_contiguous(grads[i]))
        rc = loom__fail(LOOM_EINVAL, "%s: gradient %zu is not contiguous", who, i);
  }
  if (!rc) rc = alloc_manager(pg, numel, dtype, n, cfg, false, LOOM_F32, out);
  if (!rc && (rc = make_buffers(*out))) {
    loom_bucket_manager_free(*out);
    *out = NULL;
  }
  if (!rc)
    for (size_t i = 0; i < n; i++) (*out)->grads[i] = loom_tensor_retain(grads[i]);
  loom__free(numel);
  loom__free(dtype);
  return rc;
}

/* Member k of a bucket and where its gradient lies in its storage, for sorting by place. */
typedef struct member {
  size_t k, offset;
} member;

static int cmp_member(const void *a, const void *b) {
  const member *x = a, *y = b;
  return (x->offset > y->offset) - (x->offset < y->offset);
}

/* If bucket b's current gradients (cur, by gradient index) lie one after another in one
 * storage, in core's flat layout, make the bucket a view of that run (*view) and move the
 * plan's offsets there; otherwise *view stays NULL. */
static int arena_run(loom_bucket_manager *m, size_t b, loom_tensor *const *cur, loom_tensor **view) {
  loom__bucket_plan *p = &m->plan;
  const size_t k0 = p->first[b], count = p->count[b];
  *view = NULL;
  const loom_tensor *t0 = cur[p->order[k0]];
  for (size_t k = 0; k < count; k++) {
    const loom_tensor *t = cur[p->order[k0 + k]];
    if (!t || !t0 || t->storage != t0->storage || t->dtype != p->dtype[b] ||
        !loom_tensor_is_contiguous(t))
      return LOOM_OK;
  }
  int rc = LOOM_OK;
  member *mem = loom__calloc(LOOM_POOL_META, count, sizeof *mem);
  size_t *offset = loom__calloc(LOOM_POOL_META, count, sizeof *offset);
  LOOM_TRY_ALLOC(mem && offset ? mem : NULL, "a bucket's gradient places");
  for (size_t k = 0; k < count; k++) mem[k] = (member){k, cur[p->order[k0 + k]]->offset};
  qsort(mem, count, sizeof *mem, cmp_member);
  loom__layout lay;
  loom__layout_init(&lay, p->dtype[b]);
  const size_t start = mem[0].offset;
  bool run = start % lay.align == 0;
  lay.end = start;
  for (size_t k = 0; k < count && run; k++) {
    size_t numel = loom_tensor_numel(cur[p->order[k0 + mem[k].k]]);
    run = loom__layout_add(&lay, numel) == mem[k].offset && !lay.overflow;
    offset[mem[k].k] = mem[k].offset - start;
  }
  if (run) {
    int64_t len = (int64_t)(lay.end - start), stride = 1;
    LOOM_TRY(loom__tensor_view(t0, 1, &len, &stride, start, view));
    loom__bucket_plan_move(p, b, offset, lay.end - start);
  }
done:
  loom__free(mem);
  loom__free(offset);
  return rc;
}

int loom__bucket_manager_create_ddp(loom_pg *pg, loom_tensor *const *params, size_t n,
                                    const loom_bucket_cfg *cfg, bool wire_set, loom_dtype wire,
                                    loom_bucket_manager **out) {
  static const char *who = "ddp buckets";
  *out = NULL;
  size_t *numel = NULL;
  loom_dtype *dtype = NULL;
  loom_bucket_manager *m = NULL;
  loom_tensor **cur = loom__calloc(LOOM_POOL_META, n ? n : 1, sizeof *cur);
  int rc = cur ? describe(who, params, n, &numel, &dtype)
               : loom__fail(LOOM_ENOMEM, "%s: out of memory", who);
  for (size_t i = 0; !rc && i < n; i++) { /* a gradient that exists is reduced in its dtype */
    cur[i] = loom_tensor_grad(params[i]);
    if (cur[i]) dtype[i] = loom_tensor_dtype(cur[i]);
  }
  if (!rc) rc = alloc_manager(pg, numel, dtype, n, cfg, wire_set, wire, &m);
  for (size_t b = 0; !rc && m && b < m->plan.nbuckets; b++) rc = arena_run(m, b, cur, &m->b[b].buffer);
  if (!rc) rc = make_buffers(m);
  for (size_t i = 0; !rc && i < n; i++) {
    if (cur[i]) { /* viewed by its bucket, or copied in and out: never re-pointed */
      m->grads[i] = loom_tensor_retain(cur[i]);
      continue;
    }
    size_t b = m->plan.bucket_of[i];
    loom_tensor *flat = NULL;
    rc = loom_tensor_narrow(m->b[b].buffer, 0, (int64_t)m->plan.offset[i], (int64_t)numel[i], &flat);
    if (!rc)
      rc = loom_tensor_reshape(flat, loom_tensor_ndim(params[i]), loom_tensor_shape(params[i]),
                               &m->grads[i]);
    loom_tensor_free(flat);
  }
  loom__free(cur);
  loom__free(numel);
  loom__free(dtype);
  if (rc) {
    loom_bucket_manager_free(m);
    return rc;
  }
  *out = m;
  return LOOM_OK;
}

size_t loom_bucket_manager_count(const loom_bucket_manager *m) { return m ? m->plan.nbuckets : 0; }

static int check_bucket(const loom_bucket_manager *m, size_t bucket, const char *who) {
  if (!m) return loom__fail(LOOM_EINVAL, "%s: manager is NULL", who);
  if (bucket >= m->plan.nbuckets)
    return loom__fail(LOOM_EINVAL, "%s: bucket %zu out of range (%zu buckets)", who, bucket,
                      m->plan.nbuckets);
  return LOOM_OK;
}

int loom_bucket_manager_info(const loom_bucket_manager *m, size_t bucket, loom_bucket_info *out) {
  int rc = check_bucket(m, bucket, "loom_bucket_manager_info");
  if (rc) return rc;
  if (!out) return loom__fail(LOOM_EINVAL, "loom_bucket_manager_info: out is NULL");
  const loom__bucket_plan *p = &m->plan;
  out->index = bucket;
  out->size_bytes = p->bytes[bucket];
  out->count = p->count[bucket];
  out->dtype = p->dtype[bucket];
  out->grads = p->order + p->first[bucket];
  out->offsets = p->order_offset + p->first[bucket];
  out->buffer = m->b[bucket].buffer;
  return LOOM_OK;
}

int loom_bucket_manager_index_of(const loom_bucket_manager *m, const loom_tensor *grad,
                                 size_t *out) {
  if (!m || !grad || !out) return loom__fail(LOOM_EINVAL, "loom_bucket_manager_index_of: NULL argument");
  for (size_t i = 0; i < m->n; i++)
    if (m->grads[i] == grad) {
      *out = m->plan.bucket_of[i];
      return LOOM_OK;
    }
  return loom__fail(LOOM_ENOTFOUND, "loom_bucket_manager_index_of: tensor is not one of the manager's gradients");
}

/* Where gradient g lives in its bucket's buffer. */
static void *slot(loom_bucket_manager *m, size_t g) {
  size_t b = m->plan.bucket_of[g];
  return (char *)loom_tensor_data(m->b[b].buffer) +
         m->plan.offset[g] * loom_dtype_size(m->plan.dtype[b]);
}

int loom_bucket_prepare(loom_bucket_manager *m, size_t bucket) {
  int rc = check_bucket(m, bucket, "loom_bucket_prepare");
  if (rc) return rc;
  if (m->b[bucket].work)
    return loom__fail(LOOM_EBUSY, "loom_bucket_prepare: bucket %zu is being reduced", bucket);
  const loom__bucket_plan *p = &m->plan;
  for (size_t k = 0; k < p->count[bucket]; k++) {
    size_t g = p->order[p->first[bucket] + k];
    void *dst = slot(m, g), *src = loom_tensor_data(m->grads[g]);
    if (dst != src && !loom__dry()) memcpy(dst, src, loom_tensor_nbytes(m->grads[g]));
  }
  return LOOM_OK;
}

bool loom__bucket_wire_narrows(const loom_bucket_manager *m, size_t bucket) {
  loom_dtype own = m->plan.dtype[bucket];
  /* fewer bytes, or f16's smaller range (a bf16 bucket sent as f16) */
  return m->b[bucket].wire && (loom_dtype_size(m->wire) < loom_dtype_size(own) ||
                               (m->wire == LOOM_F16 && own != LOOM_F16));
}

void loom__bucket_scale(loom_bucket_manager *m, size_t bucket, float factor) {
  loom__f32_iter it; /* f16 / bf16: in f32 blocks, rounded once */
  loom__f32_begin(&it, loom_tensor_data(m->b[bucket].buffer), m->plan.dtype[bucket],
                  m->plan.numel[bucket]);
  while (loom__f32_next(&it))
    for (size_t j = 0; j < it.k; j++) it.p[j] *= factor;
}

int loom_bucket_reduce_async(loom_bucket_manager *m, size_t bucket, loom_redop op) {
  int rc = check_bucket(m, bucket, "loom_bucket_reduce_async");
  if (rc) return rc;
  loom__bucket *b = &m->b[bucket];
  if (b->work)
    return loom__fail(LOOM_EBUSY, "loom_bucket_reduce_async: bucket %zu is already being reduced",
                      bucket);
  size_t n = m->plan.numel[bucket];
  loom_dtype dt = m->plan.dtype[bucket];
  void *data = loom_tensor_data(b->buffer);
  if (b->wire) { /* send in the wire dtype; the group sums in f32 */
    loom_convert(data, dt, b->wire, m->wire, n);
    data = b->wire;
    dt = m->wire;
  }
  b->status = LOOM_OK;
  b->t_launch = loom__ddp_now();
  rc = loom_pg_allreduce(m->pg, data, data, n, dt, op, &b->work);
  if (rc) return rc;
  m->collectives++;
  m->bytes += n * loom_dtype_size(dt);
  return LOOM_OK;
}

/* The reduction of bucket b has ended with status rc: bring a wire buffer back, and keep a
 * failure (with its message) for every later test or wait of the bucket. */
static int finish(loom_bucket_manager *m, size_t bucket, int rc) {
  loom__bucket *b = &m->b[bucket];
  m->comm_s += loom__ddp_now() - b->t_launch;
  b->status = rc;
  if (rc) {
    snprintf(b->error, sizeof b->error, "%s", loom_last_error());
    return rc;
  }
  if (b->wire)
    loom_convert(b->wire, m->wire, loom_tensor_data(b->buffer), m->plan.dtype[bucket],
                 m->plan.numel[bucket]);
  return LOOM_OK;
}

/* The kept failure of the bucket's last reduction, raised again with its message. */
static int last_status(const loom_bucket_manager *m, size_t bucket, const char *who) {
  const loom__bucket *b = &m->b[bucket];
  if (!b->status) return LOOM_OK;
  return loom__fail(b->status, "%s: bucket %zu's reduction failed: %s", who, bucket, b->error);
}

int loom_bucket_test(loom_bucket_manager *m, size_t bucket, bool *reduced) {
  static const char *who = "loom_bucket_test";
  int rc = check_bucket(m, bucket, who);
  if (rc) return rc;
  if (!reduced) return loom__fail(LOOM_EINVAL, "%s: reduced is NULL", who);
  *reduced = false;
  loom__bucket *b = &m->b[bucket];
  if (b->work) {
    int done = 0;
    rc = loom_work_test(&b->work, &done);
    if (!done) return rc;
    finish(m, bucket, rc);
  }
  if ((rc = last_status(m, bucket, who))) return rc;
  *reduced = true;
  return LOOM_OK;
}

int loom_bucket_wait(loom_bucket_manager *m, size_t bucket) {
  int rc = check_bucket(m, bucket, "loom_bucket_wait");
  if (rc) return rc;
  if (m->b[bucket].work) finish(m, bucket, loom_work_wait(&m->b[bucket].work));
  return last_status(m, bucket, "loom_bucket_wait");
}

int loom_bucket_copy_back(loom_bucket_manager *m, size_t bucket) {
  int rc = loom_bucket_wait(m, bucket);
  if (rc) return rc;
  const loom__bucket_plan *p = &m->plan;
  for (size_t k = 0; k < p->count[bucket]; k++) {
    size_t g = p->order[p->first[bucket] + k];
    void *src = slot(m, g), *dst = loom_tensor_data(m->grads[g]);
    if (dst != src && !loom__dry()) memcpy(dst, src, loom_tensor_nbytes(m->grads[g]));
  }
  return LOOM_OK;
}

int loom_bucket_manager_reduce_all(loom_bucket_manager *m, loom_redop op) {
  if (!m) return loom__fail(LOOM_EINVAL, "loom_bucket_manager_reduce_all: manager is NULL");
  for (size_t b = 0; b < m->plan.nbuckets; b++) {
    int rc = loom_bucket_prepare(m, b);
    if (!rc) rc = loom_bucket_reduce_async(m, b, op);
    if (rc) return rc;
  }
  return LOOM_OK;
}

int loom_bucket_manager_wait_all(loom_bucket_manager *m) {
  if (!m) return loom__fail(LOOM_EINVAL, "loom_bucket_manager_wait_all: manager is NULL");
  int first = LOOM_OK;
  char msg[512] = "";
  for (size_t b = 0; b < m->plan.nbuckets; b++) {
    int rc = loom_bucket_wait(m, b);
    if (rc && !first) {
      first = rc;
      snprintf(msg, sizeof msg, "%s", loom_last_error());
    }
  }
  return first ? loom__fail(first, "%s", msg) : LOOM_OK;
}

int loom_bucket_manager_copy_back_all(loom_bucket_manager *m) {
  if (!m) return loom__fail(LOOM_EINVAL, "loom_bucket_manager_copy_back_all: manager is NULL");
  for (size_t b = 0; b < m->plan.nbuckets; b++) {
    int rc = loom_bucket_copy_back(m, b);
    if (rc) return rc;
  }
  return LOOM_OK;
}
