/* bucket_plan.c: which gradient goes in which bucket, at which offset, under the two
 * assignment policies (reverse parameter order with a small first bucket, as PyTorch; or the
 * specification's largest-first greedy fill), each bucket laid out in core's flat layout. Pure
 * arithmetic on sizes: no buffers here. */
#include "ddp/ddp_int.h"
#include "core/layout.h"

#include <stdlib.h>
#include <string.h>

loom_bucket_cfg loom_bucket_cfg_default(void) {
  return (loom_bucket_cfg){.bucket_bytes = (size_t)25 << 20,
                           .first_bucket_bytes = (size_t)1 << 20,
                           .policy = LOOM_BUCKET_REVERSE_ORDER};
}

int loom_bucket_cfg_validate(const loom_bucket_cfg *cfg) {
  if (!cfg) return loom__fail(LOOM_EINVAL, "bucket cfg: NULL");
  if (cfg->bucket_bytes == 0) return loom__fail(LOOM_EINVAL, "bucket cfg: bucket_bytes must be > 0");
  if (cfg->policy == LOOM_BUCKET_REVERSE_ORDER && cfg->first_bucket_bytes == 0)
    return loom__fail(LOOM_EINVAL, "bucket cfg: first_bucket_bytes must be > 0");
  if (cfg->policy != LOOM_BUCKET_REVERSE_ORDER && cfg->policy != LOOM_BUCKET_LARGEST_FIRST)
    return loom__fail(LOOM_EINVAL, "bucket cfg: policy %d is not a bucket policy", (int)cfg->policy);
  return LOOM_OK;
}

void loom__bucket_plan_free(loom__bucket_plan *p) {
  if (!p) return;
  loom__free(p->bucket_of);
  loom__free(p->offset);
  loom__free(p->order);
  loom__free(p->order_offset);
  loom__free(p->first);
  loom__free(p->count);
  loom__free(p->numel);
  loom__free(p->bytes);
  loom__free(p->dtype);
  memset(p, 0, sizeof *p);
}

/* Sort key for the largest-first policy: bytes descending, then index (stable). */
typedef struct by_size {
  size_t bytes, index;
} by_size;

static int cmp_by_size(const void *a, const void *b) {
  const by_size *x = a, *y = b;
  if (x->bytes != y->bytes) return x->bytes > y->bytes ? -1 : 1;
  return (x->index > y->index) - (x->index < y->index);
}

int loom__bucket_plan_make(const size_t *numel, const loom_dtype *dtype, size_t n,
                           const loom_bucket_cfg *cfg, loom__bucket_plan *out) {
  int rc = LOOM_OK;
  memset(out, 0, sizeof *out);
  if ((rc = loom_bucket_cfg_validate(cfg))) return rc;
  by_size *seq = NULL;
  size_t *open = NULL; /* per dtype: the open bucket index + 1, 0 if none */
  size_t *fill = NULL; /* per bucket: gradients placed in `order` so far (nbuckets <= n) */
  loom__layout *lay = NULL; /* per bucket: its flat layout so far */
  out->n = n;
  size_t cap = n ? n : 1;
  out->bucket_of = loom__calloc(LOOM_POOL_META, cap, sizeof(size_t));
  out->offset = loom__calloc(LOOM_POOL_META, cap, sizeof(size_t));
  out->order = loom__calloc(LOOM_POOL_META, cap, sizeof(size_t));
  out->order_offset = loom__calloc(LOOM_POOL_META, cap, sizeof(size_t));
  out->first = loom__calloc(LOOM_POOL_META, cap, sizeof(size_t));
  out->count = loom__calloc(LOOM_POOL_META, cap, sizeof(size_t));
  out->numel = loom__calloc(LOOM_POOL_META, cap, sizeof(size_t));
  out->bytes = loom__calloc(LOOM_POOL_META, cap, sizeof(size_t));
  out->dtype = loom__calloc(LOOM_POOL_META, cap, sizeof(loom_dtype));
  seq = loom__calloc(LOOM_POOL_META, cap, sizeof *seq);
  open = loom__calloc(LOOM_POOL_META, LOOM_DTYPE_COUNT, sizeof *open);
  fill = loom__calloc(LOOM_POOL_META, cap, sizeof *fill);
  lay = loom__calloc(LOOM_POOL_META, cap, sizeof *lay);
  if (!lay || !out->bucket_of || !out->offset || !out->order || !out->order_offset || !out->first || !out->count ||
      !out->numel || !out->bytes || !out->dtype || !seq || !open || !fill) {
    rc = loom__fail(LOOM_ENOMEM, "bucket plan: out of memory for %zu gradients", n);
    goto done;
  }
  /* The order gradients are considered in. */
  for (size_t i = 0; i < n; i++) {
    if (!loom_dtype_valid(dtype[i])) {
      rc = loom__fail(LOOM_EDTYPE, "bucket plan: gradient %zu has an invalid dtype", i);
      goto done;
    }
    size_t idx = cfg->policy == LOOM_BUCKET_REVERSE_ORDER ? n - 1 - i : i;
    seq[i] = (by_size){numel[idx] * loom_dtype_size(dtype[idx]), idx};
  }
  if (cfg->policy == LOOM_BUCKET_LARGEST_FIRST) qsort(seq, n, sizeof *seq, cmp_by_size);

  /* Fill: one open bucket per dtype. Buckets are numbered in the order they are opened. */
  size_t nb = 0, closed_for_dtype[LOOM_DTYPE_COUNT] = {0};
  for (size_t i = 0; i < n; i++) {
    size_t g = seq[i].index, bytes = seq[i].bytes;
    loom_dtype dt = dtype[g];
    if (cfg->policy == LOOM_BUCKET_LARGEST_FIRST && open[dt] &&
        out->bytes[open[dt] - 1] + bytes > cfg->bucket_bytes)
      open[dt] = 0; /* would overflow a non-empty bucket: start a new one */
    if (!open[dt]) {
      out->dtype[nb] = dt;
      loom__layout_init(&lay[nb], dt);
      open[dt] = ++nb;
    }
    size_t b = open[dt] - 1;
    out->bucket_of[g] = b;
    out->offset[g] = loom__layout_add(&lay[b], numel[g]);
    out->numel[b] = lay[b].end;
    out->bytes[b] += bytes;
    out->count[b]++;
    if (cfg->policy == LOOM_BUCKET_REVERSE_ORDER) {
      size_t limit = closed_for_dtype[dt] ? cfg->bucket_bytes : cfg->first_bucket_bytes;
      if (out->bytes[b] >= limit) { /* full: close it (as PyTorch, a bucket may pass its limit) */
        open[dt] = 0;
        closed_for_dtype[dt]++;
      }
    }
  }
  out->nbuckets = nb;
  /* order: gradients grouped by bucket, in the order they were placed */
  for (size_t b = 1; b < nb; b++) out->first[b] = out->first[b - 1] + out->count[b - 1];
  for (size_t i = 0; i < n; i++) {
    size_t g = seq[i].index, b = out->bucket_of[g];
    out->order_offset[out->first[b] + fill[b]] = out->offset[g];
    out->order[out->first[b] + fill[b]++] = g;
  }
done:
  loom__free(seq);
  loom__free(open);
  loom__free(fill);
  loom__free(lay);
  if (rc) loom__bucket_plan_free(out);
  return rc;
}

void loom__bucket_plan_move(loom__bucket_plan *p, size_t bucket, const size_t *offset, size_t numel) {
  for (size_t k = p->first[bucket]; k < p->first[bucket] + p->count[bucket]; k++) {
    p->offset[p->order[k]] = offset[k - p->first[bucket]];
    p->order_offset[k] = offset[k - p->first[bucket]];
  }
  p->numel[bucket] = numel;
}
