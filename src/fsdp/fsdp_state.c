/* fsdp_state.c: the full (unsharded) state dict of an FSDP model: gathered unit by unit in f32
 * and copied out on rank 0 with the module's PyTorch names (what model.safetensors holds), and
 * the way back: each rank takes its shard's part of every parameter from a full state. */
#include "fsdp/fsdp_int.h"
#include "core/layout.h"

#include <string.h>

void loom_fsdp_state_free(loom_named_tensor *state, size_t n) {
  if (!state) return;
  for (size_t i = 0; i < n; i++) loom_tensor_free(state[i].tensor);
  loom__free(state);
}

int loom_fsdp_full_state(loom_fsdp *f, loom_named_tensor **out, size_t *n) {
  if (out) *out = NULL;
  if (n) *n = 0;
  if (!f || !out || !n)
    return loom__fail(LOOM_EINVAL, "loom_fsdp_full_state: fsdp, out and n must not be NULL");
  if (f->in_step)
    return loom__fail(LOOM_EMISUSE, "loom_fsdp_full_state: a backward is running");
  int rc = loom__fsdp_step_join(f); /* the last optimizer step, whole */
  if (rc) return rc;
  if (f->replica_rank != 0) return LOOM_OK; /* hybrid sharding: replica 0 gathers alone */
  loom_named_tensor *st = NULL;
  if (f->rank == 0) {
    st = loom__calloc(LOOM_POOL_META, f->nparams ? f->nparams : 1, sizeof *st);
    if (!st) rc = loom__fail(LOOM_ENOMEM, "loom_fsdp_full_state: out of memory");
  }
  /* every rank takes part in every gather, even after a failure on rank 0 alone, so that the
   * collectives stay matched */
  for (size_t u = 0; u < f->nunits; u++) {
    fsdp_unit *un = &f->units[u];
    int rc2 = loom__fsdp_reshard(un);
    if (!rc2) rc2 = loom__fsdp_issue_gather(un, LOOM_F32);
    if (!rc2) rc2 = loom__fsdp_wait_gather(un);
    for (size_t k = 0; k < un->nparams && st && !rc && !rc2; k++) {
      fsdp_param *fp = &un->params[k];
      rc2 = loom_tensor_clone(fp->p->value, &st[fp->index].tensor);
      st[fp->index].name = fp->p->full;
    }
    int rc3 = loom__fsdp_reshard(un);
    if (!rc) rc = rc2 ? rc2 : rc3;
    if (rc2 && loom_pg_async_error(f->pg)) break; /* the group is broken: nothing more runs */
  }
  /* with resident shared buffers (fsdp_share.c) rank 0 may still be copying a peer's slice of
   * the last unit when the peer returns; a load may come next, writing that slice (fsdp.h) */
  int rc_fence = loom__fsdp_share_fence(f);
  if (!rc) rc = rc_fence;
  if (rc) {
    loom_fsdp_state_free(st, f->nparams);
    return rc;
  }
  if (st) {
    *out = st;
    *n = f->nparams;
  }
  return LOOM_OK;
}

int loom_fsdp_load_full_state(loom_fsdp *f, const loom_named_tensor *state, size_t n) {
  static const char *who = "loom_fsdp_load_full_state";
  if (!f || (!state && n)) return loom__fail(LOOM_EINVAL, "%s: fsdp or state is NULL", who);
  if (n != f->nparams)
    return loom__fail(LOOM_EINVAL, "%s: %zu tensors given, the model has %zu parameters", who,
                      n, f->nparams);
  int rc0 = loom__fsdp_step_join(f); /* the last optimizer step's pass writes the shards */
  if (rc0) return rc0;
  /* check everything first: nothing changes unless all of it fits */
  const loom_named_tensor **by_param = loom__calloc(LOOM_POOL_META, n ? n : 1, sizeof *by_param);
  if (!by_param) return loom__fail(LOOM_ENOMEM, "%s: out of memory", who);
  int rc = LOOM_OK;
  for (size_t i = 0; i < n && !rc; i++) {
    const loom__param *p = f->root->flat[i];
    for (size_t k = 0; k < n && !by_param[i]; k++)
      if (state[k].name && strcmp(state[k].name, p->full) == 0) by_param[i] = &state[k];
    const loom_named_tensor *e = by_param[i];
    if (!e || !e->tensor)
      rc = loom__fail(LOOM_ENOTFOUND, "%s: no tensor for parameter %s", who, p->full);
    else if ((rc = loom__tensor_check_data(e->tensor, who)))
      ;
    else if (!loom_tensor_same_shape(e->tensor, p->value) ||
             loom_tensor_numel(e->tensor) != f->by_index[i]->numel) {
      char a[96], b[96];
      rc = loom__fail(LOOM_ESHAPE, "%s: %s is %s, the parameter %s", who, p->full,
                      loom__shape_str(loom_tensor_ndim(e->tensor), loom_tensor_shape(e->tensor), a, sizeof a),
                      loom__shape_str(loom_tensor_ndim(p->value), loom_tensor_shape(p->value), b, sizeof b));
    }
  }
  if (!rc) rc = loom__fsdp_onload_all(f, NULL);
  bool changed = rc == LOOM_OK;
  for (size_t i = 0; i < n && !rc; i++) {
    fsdp_param *fp = f->by_index[i];
    fsdp_unit *u = fp->unit;
    size_t lo = (size_t)f->rank * u->shard, hi = lo + u->shard;
    size_t a, b;
    if (!loom__layout_slice(fp->offset, fp->numel, lo, hi, &a, &b)) continue;
    loom_tensor *src = by_param[i]->tensor, *c = NULL;
    rc = loom_tensor_contiguous(src, &c);
    if (!rc) rc = loom_convert((const char *)loom_tensor_data(c) + (a - fp->offset) * loom_dtype_size(loom_tensor_dtype(c)),
                               loom_tensor_dtype(c), u->param_shard + (a - lo), LOOM_F32, b - a);
    loom_tensor_free(c);
  }
  int rc_off = loom__fsdp_offload_all(f, NULL, changed);
  if (!rc) rc = rc_off;
  loom__free(by_param);
  return rc;
}
