/* loom/ddp.h: data-parallel training: gradient buckets and the DDP wrapper.
 *
 * Every rank holds the whole model. After backward, each gradient must be the average over
 * ranks. Gradients are grouped into buckets (one flat buffer each, per dtype) so that a few
 * large all-reduces replace one per parameter, and a bucket is all-reduced asynchronously as
 * soon as all its gradients are complete, while backward goes on computing the rest.
 *
 * Two layers:
 *   - the bucket manager (the specification's GradientBucket / GradientBucketManager): buckets
 *     over a list of gradient tensors, with prepare (flatten into the bucket buffer),
 *     asynchronous reduce, is-reduced, copy back, reduce-all, wait-all and copy-back-all;
 *   - loom_ddp: parameters + process group + options. One gradient storage: where the
 *     parameters' gradients already lie in a flat buffer (a module's gradient arena,
 *     loom_module_arena), each bucket is a view of its run of that buffer (PyTorch's
 *     gradient_as_bucket_view, llm.c's grads_memory), so backward writes into the bucket and
 *     an optimizer over the arena, over per-parameter buffers or over anything else pointing at
 *     the gradients reads the averaged values; a parameter with no gradient yet gets a view of
 *     its bucket as its gradient; a gradient elsewhere is never re-pointed, only copied into
 *     its bucket and back (the one case that costs a copy: the largest-first policy over an
 *     arena). It registers a gradient hook on each parameter, launches each bucket in
 *     bucket-index order the moment it is complete, and waits for the last one when backward
 *     ends.
 *
 * Bucket assignment, two policies:
 *   - LOOM_BUCKET_REVERSE_ORDER (default, as PyTorch): parameters in reverse order (the order
 *     backward produces gradients); a bucket closes once it reaches its limit: first_bucket_bytes
 *     (1 MiB) for the first bucket of each dtype, bucket_bytes (25 MiB) after it.
 *   - LOOM_BUCKET_LARGEST_FIRST (the specification's): largest parameter first, greedily; a
 *     parameter that would take a non-empty bucket past bucket_bytes starts a new one (so a
 *     parameter larger than the limit has a bucket of its own).
 * Buckets never mix dtypes; empty buckets do not exist; all gradients that fit in one bucket
 * give one all-reduce.
 *
 * Ownership: the manager and loom_ddp retain the tensors they are given and release them in
 * _free. Errors: status codes with a message (loom_last_error). Threads: one manager or ddp is
 * used by the thread of its rank. */
#ifndef LOOM_DDP_H
#define LOOM_DDP_H

#include "loom/dist.h"
#include "loom/nn.h"
#include "loom/optim.h"
#include "loom/tensor.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum loom_bucket_policy {
  LOOM_BUCKET_REVERSE_ORDER = 0,
  LOOM_BUCKET_LARGEST_FIRST = 1,
} loom_bucket_policy;

typedef struct loom_bucket_cfg {
  size_t bucket_bytes;       /* limit of a bucket (default 25 MiB); > 0 */
  size_t first_bucket_bytes; /* limit of the first bucket, reverse order only (default 1 MiB) */
  loom_bucket_policy policy; /* default LOOM_BUCKET_REVERSE_ORDER */
} loom_bucket_cfg;

loom_bucket_cfg loom_bucket_cfg_default(void);
/* LOOM_EINVAL with a message naming the field. */
int loom_bucket_cfg_validate(const loom_bucket_cfg *cfg);

/* ---- the bucket manager (the specification's API) ----------------------------------------- */

typedef struct loom_bucket_manager loom_bucket_manager;

typedef struct loom_bucket_info {
  size_t index;        /* bucket index */
  size_t size_bytes;   /* bytes of gradients in the bucket */
  size_t count;        /* number of gradients */
  loom_dtype dtype;    /* all its gradients' dtype */
  const size_t *grads; /* count indices into the manager's gradient list, in bucket order */
  const size_t *offsets; /* element offset of each of those gradients in the bucket buffer */
  loom_tensor *buffer; /* the flat bucket tensor (borrowed) */
} loom_bucket_info;

/* Buckets over grads[0..n) (retained; contiguous, floating; distinct tensors). Each bucket gets
 * a flat buffer with each gradient at its offset in loom's flat layout (loom/layout.h: aligned
 * to 64 bytes, so a bucket's numel counts the padding between gradients; the padding stays
 * zero). cfg NULL: the defaults. */
int loom_bucket_manager_create(loom_pg *pg, loom_tensor *const *grads, size_t n,
                               const loom_bucket_cfg *cfg, loom_bucket_manager **out);
void loom_bucket_manager_free(loom_bucket_manager *m);

size_t loom_bucket_manager_count(const loom_bucket_manager *m);
int loom_bucket_manager_info(const loom_bucket_manager *m, size_t bucket, loom_bucket_info *out);
/* The bucket holding gradient tensor `grad` (one of those given to create). LOOM_ENOTFOUND
 * otherwise. */
int loom_bucket_manager_index_of(const loom_bucket_manager *m, const loom_tensor *grad,
                                 size_t *out);

/* Copy the bucket's gradients into its buffer (skipped for gradients that already are views
 * of the buffer at their offset). */
int loom_bucket_prepare(loom_bucket_manager *m, size_t bucket);
/* Start the all-reduce of the bucket's buffer (op over ranks). LOOM_EBUSY if it is running. */
int loom_bucket_reduce_async(loom_bucket_manager *m, size_t bucket, loom_redop op);
/* Tests the bucket's reduction without blocking: *reduced = true once the last reduction has
 * completed (or none was started). A failed reduction is returned as its status, with its
 * message, by this and every later test or wait of the bucket until a new reduction starts
 * (*reduced stays false). LOOM_EINVAL for a NULL argument or a bucket out of range. */
int loom_bucket_test(loom_bucket_manager *m, size_t bucket, bool *reduced);
/* Wait for the bucket's reduction; the status of the last one (LOOM_OK if none ran). */
int loom_bucket_wait(loom_bucket_manager *m, size_t bucket);
/* Copy the reduced buffer back into the gradients (skipped for views). Waits first. */
int loom_bucket_copy_back(loom_bucket_manager *m, size_t bucket);

/* Prepare and start the reduction of every bucket, in index order. */
int loom_bucket_manager_reduce_all(loom_bucket_manager *m, loom_redop op);
/* Wait for every running reduction; the first failure's status. */
int loom_bucket_manager_wait_all(loom_bucket_manager *m);
int loom_bucket_manager_copy_back_all(loom_bucket_manager *m);

/* ---- DDP ------------------------------------------------------------------------------------ */

typedef struct loom_ddp loom_ddp;

typedef struct loom_ddp_cfg {
  loom_bucket_cfg buckets;
  /* Reduce buckets while backward runs (default true). False: the specification's eager path,
   * every bucket reduced after backward ends (loom_ddp_finish). */
  bool overlap;
  /* Broadcast rank 0's parameters to every rank at create (default true). */
  bool broadcast_params;
  /* Dtype on the wire: LOOM_F32 (or the gradient's dtype, the default: wire_dtype_set false),
   * or LOOM_BF16 / LOOM_F16 to halve the bytes moved (summed in f32 by the process group). */
  bool wire_dtype_set;
  loom_dtype wire_dtype;
} loom_ddp_cfg;

loom_ddp_cfg loom_ddp_cfg_default(void);
int loom_ddp_cfg_validate(const loom_ddp_cfg *cfg);

typedef struct loom_ddp_stats {
  uint64_t steps;           /* synchronised backward passes */
  uint64_t collectives;     /* all-reduces issued (buckets + control) */
  uint64_t bytes;           /* bytes all-reduced (payload, per rank) */
  size_t buckets;           /* number of buckets */
  double comm_s;            /* time from each bucket's launch to its completion, summed */
  double exposed_s;         /* time from the end of backward's compute to the last bucket
                               reduced (launching what is left, and waiting), summed */
  double last_exposed_s;    /* the same, for the last step */
  double first_launch_lead_s; /* last step: how long before backward ended the first bucket was
                                 launched (> 0 means communication started during backward) */
} loom_ddp_stats;

/* Wrap params[0..n) (leaf tensors requiring grad, retained) of this rank's model replica.
 * Checks with the peers that every rank has the same parameter count, shapes and dtypes in the
 * same order (LOOM_ESHAPE / LOOM_EDTYPE / LOOM_EMISUSE naming the first difference), broadcasts
 * rank 0's values (cfg.broadcast_params), and lays out the buckets over the gradients as the
 * top of this header says (a parameter without a gradient gets one: loom_tensor_set_grad; an
 * existing gradient keeps its buffer and its values). names may be NULL (used in messages).
 * cfg NULL: defaults. */
int loom_ddp_create(loom_pg *pg, loom_tensor *const *params, const char *const *names, size_t n,
                    const loom_ddp_cfg *cfg, loom_ddp **out);
/* loom_ddp_create over every parameter of module m (loom_module_param order, with their
 * names): the usual way to wrap a model. m must be a root module (its gradient arena is then the
 * bucket storage). Borrows m, which must outlive the wrapper. Errors: loom_ddp_create's, and
 * LOOM_EINVAL for a NULL module or one without parameters. */
int loom_ddp_create_for_module(loom_pg *pg, loom_module *m, const loom_ddp_cfg *cfg,
                               loom_ddp **out);
void loom_ddp_free(loom_ddp *d);

/* Gradient accumulation: while sync is off (PyTorch's no_sync), backward only accumulates into
 * the local gradients; the next backward with sync on reduces the accumulated sum. */
int loom_ddp_set_sync(loom_ddp *d, bool sync);

/* Call after loom_backward and before the optimizer step: waits for the last bucket (or, with
 * overlap off, reduces every bucket now and waits). Gradients are then averaged over ranks.
 * LOOM_EMISUSE if some parameter's gradient was not produced by this backward on a rank where
 * others were (an unused parameter). A failed collective leaves the process group broken. */
int loom_ddp_finish(loom_ddp *d);

/* Combine a per-rank flag across ranks (true if any rank's is true): the AMP overflow check, so
 * that every rank skips the same steps and keeps the same loss scale. */
int loom_ddp_any(loom_ddp *d, bool local, bool *global);

int loom_ddp_stats_get(const loom_ddp *d, loom_ddp_stats *out);
/* The bucket manager DDP runs on (borrowed). */
loom_bucket_manager *loom_ddp_buckets(loom_ddp *d);

/* One optimizer segment per bucket, as loom_fsdp_segments gives one per unit: the bucket's
 * gradient buffer and the run of the parameters that matches it ("bucket.<i>"; *segs borrowed,
 * valid while d lives). They exist when every bucket is f32 and its parameters lie at the same
 * offsets as its gradients (a module's arenas under the default bucket policy: the buckets are
 * views of the gradient arena); the alignment padding inside them is zero in both and stays
 * zero. LOOM_ENOSYS otherwise (build the optimizer over loom_module_arena or the parameters),
 * naming the first bucket that does not fit. */
int loom_ddp_segments(loom_ddp *d, const loom_param_seg **segs, size_t *n);

#ifdef __cplusplus
}
#endif
#endif
