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

/* The range and buffer checks of a chunk of segment seg. */
static int check_chunk(const loom_optim *o, size_t seg, size_t offset, size_t n,
                       const float *param, const float *grad, const char *who) {
  int rc = check_seg(o, seg, who);
  if (rc) return rc;
  const loom__seg *s = &o->seg[seg];
  if (offset > s->n || n > s->n - offset) /* offset + n <= s->n without overflow */
    return loom__fail(LOOM_EINVAL, "%s: elements [%zu, %zu + %zu) are beyond segment %zu (%s) "
                      "of %zu elements", who, offset, offset, n, seg, s->name, s->n);
  if (n && (!param || !grad))
    return loom__fail(LOOM_EINVAL, "%s: segment %zu: NULL %s buffer for %zu elements", who, seg,
                      param ? "grad" : "param", n);
  return LOOM_OK;
}

static int check_state(const loom_optim *o, size_t seg, size_t n, float *const *state,
                       const char *who) {
  for (int k = 0; n && k < o->nstate; k++)
    if (!state[k])
      return loom__fail(LOOM_EINVAL, "%s: segment %zu: state[%d] (%s) is NULL", who, seg, k,
                        o->state_kind[k]);
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
  if ((rc = check_chunk(o, seg, offset, n, param, grad, who))) return rc;
  const loom__seg *s = &o->seg[seg];
  float *own[LOOM__MAX_STATE] = {NULL};
  if (!state) {
    if (loom__seg_released(o, s))
      return loom__fail(LOOM_EMISUSE, "%s: segment %zu (%s) has its state released to the "
                        "caller; pass the state buffers", who, seg, s->name);
    for (int k = 0; k < o->nstate; k++) own[k] = s->state[k] + offset;
    state = own;
  } else if ((rc = check_state(o, seg, n, state, who))) {
    return rc;
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

/* ---- a chunked step detached from its optimizer ------------------------------------------ */

struct loom__optim_snap {
  loom_optim o; /* a copy: kind, configuration, the step's scalars; seg: its own table of
                   each segment's flags and length (no name, buffers or state) */
};

int loom__optim_snap_take(const loom_optim *o, loom__optim_snap **out) {
  const char *who = "loom__optim_snap_take";
  *out = NULL;
  int rc = loom__optim_check(o, who);
  if (rc) return rc;
  if (!o->chunk_open) return loom__fail(LOOM_EMISUSE, "%s: no chunked step is open", who);
  loom__optim_snap *s = loom__calloc(LOOM_POOL_META, 1, sizeof *s);
  loom__seg *seg = loom__calloc(LOOM_POOL_META, o->nseg ? o->nseg : 1, sizeof *seg);
  if (!s || !seg) {
    loom__free(s);
    loom__free(seg);
    return loom__fail(LOOM_ENOMEM, "%s: out of memory", who);
  }
  s->o = *o;
  static char unnamed[] = "its name left with the optimizer";
  for (size_t i = 0; i < o->nseg; i++)
    seg[i] = (loom__seg){.name = unnamed, .n = o->seg[i].n, .flags = o->seg[i].flags};
  s->o.seg = seg;
  s->o.state_name = NULL;
  *out = s;
  return LOOM_OK;
}

int loom__optim_snap_chunk(const loom__optim_snap *s, size_t seg, size_t offset, size_t n,
                           float *param, const float *grad, float *const *state) {
  const char *who = "loom_optim_step_chunk (a detached step)";
  const loom_optim *o = &s->o;
  int rc = check_chunk(o, seg, offset, n, param, grad, who);
  if (!rc && o->nstate && !state)
    rc = loom__fail(LOOM_EINVAL, "%s: segment %zu: no state buffers given", who, seg);
  if (!rc && o->nstate) rc = check_state(o, seg, n, state, who);
  if (rc) return rc;
  loom__step_update(o, &o->chunk_args, o->seg[seg].flags, param, grad, state, n);
  return LOOM_OK;
}

void loom__optim_snap_free(loom__optim_snap *s) {
  if (!s) return;
  loom__free(s->o.seg);
  loom__free(s);
}
