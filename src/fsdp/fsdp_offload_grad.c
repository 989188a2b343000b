/* fsdp_offload_grad.c: the offloader's gradients (fsdp_offload.c has the other kinds): where a
 * unit's reduce-scatter reduces into, the gradient shard leaving for the tier once reduced (from
 * the local gradient itself with the in-place reduce-scatter, ahead of queued reads; without the
 * allocator cache the pages of the peers' slices given back at once, its own as each chunk
 * lands), and the waits that settle those writes, recovering a shard whose write failed. */
#include "fsdp/fsdp_int.h"
#include "fsdp/offload_store.h"

#include <string.h>

/* ---- gradients -------------------------------------------------------------------------- */

int loom__fsdp_grad_target(fsdp_unit *u, float **recv) {
  loom_fsdp *f = u->f;
  off_kind *k = &u->off.k[OFF_GRAD];
  *recv = u->grad_shard;
  if (!loom__fsdp_offloading(f, OFF_GRAD)) return LOOM_OK;
  int rc = LOOM_OK;
  if (k->leaving || k->arriving) rc = loom__fsdp_grad_settle_unit(u);
  k->arriving = k->leaving = false;
  k->offloaded = false;
  k->stored = false;
  if (rc) return rc;
  if (u->full_grad) { /* in place: this rank's slice of the local gradient */
    loom__fsdp_free_buffer(u, OFF_GRAD);
    *recv = (float *)loom_tensor_data(u->full_grad) + (size_t)f->rank * u->shard;
    return LOOM_OK;
  }
  if (!u->grad_shard && !(u->grad_shard = loom__fsdp_alloc_shard(u, "gradient"))) return LOOM_ENOMEM;
  *recv = u->grad_shard;
  return LOOM_OK;
}

int loom__fsdp_grad_done(fsdp_unit *u) {
  loom_fsdp *f = u->f;
  off_kind *k = &u->off.k[OFF_GRAD];
  if (!loom__fsdp_offloading(f, OFF_GRAD) || k->offloaded) return LOOM_OK;
  const float *src = u->grad_shard;
  if (u->full_grad) { /* reduced in place: the offloader keeps the local gradient until out */
    u->off.grad_src = u->full_grad;
    u->full_grad = NULL;
    src = (const float *)loom_tensor_data(u->off.grad_src) + (size_t)f->rank * u->shard;
  }
  if (!src) return LOOM_OK;
  int rc = LOOM_OK;
  /* the peers' slices are reduced: dead bytes, given back now rather than when the write is
   * settled (with two ranks in a process, 2 x half a unit less at the backward's peak while
   * the write goes on: issue 29, 37% -> 35% of the training state in f32), unless the
   * allocator cache is on: it keeps the block whole for the next local gradient, whose pages
   * would then be faulted in again */
  bool release = f->grad_overlap || loom_mem_cache_limit() == 0;
  if (u->off.grad_src && release) {
    float *g = loom_tensor_data(u->off.grad_src);
    loom__mem_release(g, (size_t)f->rank * u->shard * sizeof(float));
    loom__mem_release(g + (size_t)(f->rank + 1) * u->shard,
                      (u->padded - (size_t)(f->rank + 1) * u->shard) * sizeof(float));
  }
  for (size_t c = 0; c < u->off.nchunks && !rc; c++) {
    float *at = (float *)src + c * f->chunk;
    size_t bytes = loom__fsdp_chunk_len(u, c) * sizeof(float);
    size_t slot = loom__fsdp_slot(u, OFF_GRAD, 0, c);
    /* ahead of the gathers' reads queued for later units (the backward waits for this write
     * before the next unit's local gradient exists); each chunk's pages go as soon as it is on
     * the tier (settle reads it back on failure) */
    unsigned flags = (release ? LOOM__OJOB_RELEASE : 0) | (f->grad_first ? LOOM__OJOB_FIRST : 0);
    rc = loom__ostore_submit_put_ex(f->store, slot, at, bytes, flags, &k->jobs[c]);
  }
  f->grad_leaving = u->index;
  k->leaving = true;
  k->offloaded = true; /* its bytes are on their way: nobody reads the buffer any more */
  if (rc) {
    loom__fsdp_err e;
    loom__fsdp_err_save(&e, rc);
    loom__ostore_clear(f->store);
    (void)loom__fsdp_grad_settle_unit(u); /* keeps the bytes in a gradient shard */
    return loom__fsdp_err_restore(&e);
  }
  return rc;
}

/* The gradient's bytes back in the compute pool after some of its puts failed: a chunk whose
 * put succeeded (ok[c]; its source pages may be released) is read back from the tier, the
 * others copied from src (never released). dst may be src. */
static int grad_recover(fsdp_unit *u, const uint64_t *ok, const float *src, float *dst) {
  loom_fsdp *f = u->f;
  int rc = LOOM_OK;
  for (size_t c = 0; c < u->off.nchunks && !loom__dry(); c++) {
    size_t n = loom__fsdp_chunk_len(u, c);
    int rc2 = LOOM_EIO;
    if (ok[c]) rc2 = loom__ostore_get(f->store, loom__fsdp_slot(u, OFF_GRAD, 0, c),
                                      dst + c * f->chunk, n * sizeof(float));
    if (rc2 && ok[c] && !rc) rc = rc2; /* on the tier, and unreadable: lost */
    if (!ok[c] && dst != src) memcpy(dst + c * f->chunk, src + c * f->chunk, n * sizeof(float));
  }
  return rc;
}

int loom__fsdp_grad_settle_unit(fsdp_unit *u) {
  off_kind *k = &u->off.k[OFF_GRAD];
  if (!k->leaving) return LOOM_OK;
  if (u->f->grad_leaving == u->index) u->f->grad_leaving = SIZE_MAX;
  int rc = LOOM_OK;
  for (size_t c = 0; c < u->off.nchunks; c++) { /* k->jobs[c] becomes: did the put succeed */
    double w = 0;
    int rc2 = loom__ostore_wait(u->f->store, k->jobs[c], &w);
    u->f->off_wait_s += w;
    k->jobs[c] = rc2 == LOOM_OK;
    if (!rc) rc = rc2;
  }
  k->arriving = k->leaving = false;
  if (rc) { /* the tier lost (some of) it: the compute pool's copy is the one left */
    k->offloaded = false;
    loom__fsdp_err e;
    loom__fsdp_err_save(&e, rc);
    int rc3 = LOOM_OK;
    if (u->off.grad_src) { /* out of the local gradient into a shard of its own */
      if ((u->grad_shard = loom__fsdp_alloc_shard(u, "gradient")))
        rc3 = grad_recover(u, k->jobs,
                           (const float *)loom_tensor_data(u->off.grad_src) +
                               (size_t)u->f->rank * u->shard,
                           u->grad_shard);
    } else if (u->grad_shard) {
      rc3 = grad_recover(u, k->jobs, u->grad_shard, u->grad_shard);
    }
    for (size_t c = 0; c < u->off.nchunks; c++) k->jobs[c] = 0;
    rc = loom__fsdp_err_restore(&e);
    (void)rc3; /* the put's failure is the one reported */
  } else {
    k->stored = true;
    loom__fsdp_free_buffer(u, OFF_GRAD);
  }
  loom_tensor_free(u->off.grad_src);
  u->off.grad_src = NULL;
  return rc;
}

int loom__fsdp_grad_settle_older(loom_fsdp *f) {
  int rc = LOOM_OK;
  for (size_t i = 0; f->store && i < f->nunits; i++) {
    if (f->grad_overlap && i == f->grad_leaving) continue;
    int rc2 = loom__fsdp_grad_settle_unit(&f->units[i]);
    if (!rc) rc = rc2;
  }
  return rc;
}

int loom__fsdp_grad_settle(loom_fsdp *f) {
  int rc = LOOM_OK;
  for (size_t i = 0; f->store && i < f->nunits; i++) {
    int rc2 = loom__fsdp_grad_settle_unit(&f->units[i]);
    if (!rc) rc = rc2;
  }
  return rc;
}
