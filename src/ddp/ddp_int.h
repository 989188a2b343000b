/* ddp_int.h: what the DDP files share: the bucket plan (which gradient goes in which bucket, at
 * which offset) and the bucket manager's internals. */
#ifndef LOOM_DDP_INT_H
#define LOOM_DDP_INT_H

#include "core/core_int.h"
#include "loom/ddp.h"

typedef struct loom__bucket_plan {
  size_t n, nbuckets;
  size_t *bucket_of; /* [n] bucket of each gradient */
  size_t *offset;    /* [n] element offset in its bucket */
  size_t *order;     /* [n] gradient indices grouped by bucket, bucket 0 first */
  size_t *order_offset; /* [n] offset of order[k] in its bucket */
  size_t *first;     /* [nbuckets] start of each bucket's run in `order` */
  size_t *count;     /* [nbuckets] gradients in each bucket */
  size_t *numel;     /* [nbuckets] elements in each bucket */
  size_t *bytes;     /* [nbuckets] bytes in each bucket */
  loom_dtype *dtype; /* [nbuckets] */
} loom__bucket_plan;

/* Assign n gradients (numel and dtype of each) to buckets under cfg. */
int loom__bucket_plan_make(const size_t *numel, const loom_dtype *dtype, size_t n,
                           const loom_bucket_cfg *cfg, loom__bucket_plan *out);
void loom__bucket_plan_free(loom__bucket_plan *p);
/* Give bucket `bucket` new offsets (offset[k] for its k-th gradient in `order`) and length:
 * DDP's buckets that are views of a module's gradient arena take the arena's offsets. */
void loom__bucket_plan_move(loom__bucket_plan *p, size_t bucket, const size_t *offset, size_t numel);

typedef struct loom__bucket {
  loom_tensor *buffer; /* flat [numel] of the bucket's dtype */
  void *wire;          /* scratch in the wire dtype (NULL when the wire is the bucket's dtype) */
  loom_work *work;     /* running reduction, or NULL */
  int status;          /* how the last reduction ended (LOOM_OK before any) */
  char error[256];     /* its message, when it failed */
  double t_launch;     /* when the running reduction started */
} loom__bucket;

struct loom_bucket_manager {
  loom_pg *pg;
  size_t n;
  loom_tensor **grads; /* [n] retained */
  loom__bucket_plan plan;
  loom__bucket *b;     /* [plan.nbuckets] */
  bool wire_set;
  loom_dtype wire;
  uint64_t collectives, bytes;
  double comm_s;
};

/* DDP's manager over the gradients of params[0..n): one gradient storage, never two.
 *   - A bucket whose parameters' gradients already lie one after another in one buffer, in
 *     core's flat layout (a module's gradient arena: llm.c's grads_memory), is a view of that
 *     run of the buffer (PyTorch's gradient_as_bucket_view): backward writes straight into the
 *     bucket, and an optimizer over the arena sees the reduced gradients.
 *   - Otherwise the bucket has a buffer of its own. A parameter without a gradient gets a view
 *     of it as its gradient; a gradient that exists elsewhere is never re-pointed (whoever holds
 *     its buffer, an optimizer segment, would go on reading a dead copy): it is copied into the
 *     bucket before the reduction and back after it. */
int loom__bucket_manager_create_ddp(loom_pg *pg, loom_tensor *const *params, size_t n,
                                      const loom_bucket_cfg *cfg, bool wire_set, loom_dtype wire,
                                      loom_bucket_manager **out);
/* True if bucket b goes on the wire in a narrower dtype than its own (f32 sent as f16/bf16, or
 * bf16 sent as f16: same bytes, smaller range). */
bool loom__bucket_wire_narrows(const loom_bucket_manager *m, size_t bucket);
/* Multiply a bucket's buffer by `factor` (f32 math, rounded back for f16/bf16). */
void loom__bucket_scale(loom_bucket_manager *m, size_t bucket, float factor);
/* Monotonic seconds. */
double loom__ddp_now(void);

#endif
