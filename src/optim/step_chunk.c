/* step_chunk.c: the chunked step (loom_optim_step_begin / _chunk / _end), which applies one
 * step piece by piece over caller-held buffers, as an offloader streams the optimizer state
 * through memory, and handing a segment's state to the caller (release / restore). The
 * scalars and the per-element update are sgd.c / adam.c's, the same the whole step uses, so a
 * step in chunks gives the whole step's bits. */
#include "optim/optim_int.h"

/* A segment index check shared by the calls below. */
static int check_seg(const loom_optim *o, size_t seg, const char *who) {
  if (seg >= o->nseg)
    return loom__fail(LOOM_EINVAL, "%s: segment %zu out of range (%zu segments)", who, seg,
                      o->nseg);
  return LOOM_OK;
}

static int check_closed(const loom_optim *o, const char *who) {
  if (o->chunk_open)
    return loom__fail(LOOM_EMISUSE, "%s: a chunked step is open (loom_optim_step_begin); end "
                      "it first", who);
  return LOOM_OK;
}

size_t loom_optim_state_per_segment(const loom_optim *o) {
  return o ? (size_t)o->nstate : 0;
}

/* A live optimizer, no chunked step open, seg in range: what a per-segment call needs. */
static int check_seg_op(const loom_optim *o, size_t seg, const char *who) {
  int rc = loom__optim_check(o, who);
  if (!rc) rc = check_closed(o, who);
  return rc ? rc : check_seg(o, seg, who);
}

bool loom_optim_state_released(const loom_optim *o, size_t seg) {
  if (!o || o->magic != LOOM__OPTIM_MAGIC || seg >= o->nseg) return false;
  return loom__seg_released(o, &o->seg[seg]);
}

int loom_optim_release_state(loom_optim *o, size_t seg) {
  const char *who = "loom_optim_release_state";
  int rc = check_seg_op(o, seg, who);
  if (rc) return rc;
  loom__seg_state_free(o, &o->seg[seg]); /* no state, or already released: nothing to free */
  return LOOM_OK;
}

int loom_optim_restore_state(loom_optim *o, size_t seg) {
  const char *who = "loom_optim_restore_state";
  int rc = check_seg_op(o, seg, who);
  if (rc) return rc;
  if (!loom__seg_released(o, &o->seg[seg])) return LOOM_OK;
  return loom__seg_state_alloc(o, &o->seg[seg], who); /* all or nothing: released on failure */
}

int loom_optim_step_begin(loom_optim *o, float grad_scale) {
  const char *who = "loom_optim_step_begin";
  int rc = loom__optim_check(o, who);
  if (!rc && o->chunk_open)
    rc = loom__fail(LOOM_EMISUSE, "%s: a chunked step is already open (step %lld)", who,
                    (long long)o->step);
  if (!rc) rc = loom__check_grad_scale(grad_scale, who);
  if (!rc && o->step == INT64_MAX)
    rc = loom__fail(LOOM_EOVERFLOW, "%s: step count overflows", who);
  if (rc) return rc;
  o->step++;
  loom__step_args_make(o, grad_scale, &o->chunk_args);
  o->chunk_open = true;
  return LOOM_OK;
}

int loom_optim_step_chunk(loom_optim *o, size_t seg, size_t offset, size_t n, float *param,
                          const float *grad, float *const *state) {
  const char *who = "loom_optim_step_chunk";
  int rc = loom__optim_check(o, who);
  if (rc) return rc;
  if (!o->chunk_open)
    return loom__fail(LOOM_EMISUSE, "%s: no chunked step is open (call loom_optim_step_begin "
                      "first)", who);
  if ((rc = check_seg(o, seg, who))) return rc;
  const loom__seg *s = &o->seg[seg];
  if (offset > s->n || n > s->n - offset) /* offset + n <= s->n without overflow */
    return loom__fail(LOOM_EINVAL, "%s: elements [%zu, %zu + %zu) are beyond segment %zu (%s) "
                      "of %zu elements", who, offset, offset, n, seg, s->name, s->n);
  if (n && (!param || !grad))
    return loom__fail(LOOM_EINVAL, "%s: segment %zu: NULL %s buffer for %zu elements", who, seg,
                      param ? "grad" : "param", n);
  float *own[LOOM__MAX_STATE] = {NULL};
  if (!state) {
    if (loom__seg_released(o, s))
      return loom__fail(LOOM_EMISUSE, "%s: segment %zu (%s) has its state released to the "
                        "caller; pass the state buffers", who, seg, s->name);
    for (int k = 0; k < o->nstate; k++) own[k] = s->state[k] + offset;
    state = own;
  } else if (n) {
    for (int k = 0; k < o->nstate; k++)
      if (!state[k])
        return loom__fail(LOOM_EINVAL, "%s: segment %zu: state[%d] (%s) is NULL", who, seg, k,
                          o->state_kind[k]);
  }
  loom__step_update(o, &o->chunk_args, s->flags, param, grad, state, n);
  return LOOM_OK;
}

int loom_optim_step_end(loom_optim *o, bool completed) {
  const char *who = "loom_optim_step_end";
  int rc = loom__optim_check(o, who);
  if (rc) return rc;
  if (!o->chunk_open)
    return loom__fail(LOOM_EMISUSE, "%s: no chunked step is open", who);
  o->chunk_open = false;
  if (!completed) o->step--; /* the caller restores the values it had updated */
  return LOOM_OK;
}
