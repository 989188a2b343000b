/* optim.c: the optimizer object common to every kind: segments (copied descriptors, retained
 * buffers) with their zeroed state buffers and names, learning rate, step count, rebind, state
 * listing and the whole step, which runs sgd.c / adam.c's update over every segment. The
 * chunked step and releasing state to the caller are step_chunk.c's. */
#include "optim/optim_int.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

int loom__optim_check(const loom_optim *o, const char *who) {
  if (!o) return loom__fail(LOOM_EINVAL, "%s: optimizer is NULL", who);
  if (o->magic != LOOM__OPTIM_MAGIC)
    return loom__fail(LOOM_EMISUSE, "%s: optimizer %p is freed or not an optimizer", who,
                      (const void *)o);
  return LOOM_OK;
}

static void optim_release(loom_optim *o) {
  for (size_t i = 0; i < o->nseg; i++) loom__free(o->seg[i].name);
  if (o->state_name)
    for (size_t i = 0; i < o->nseg * (size_t)o->nstate; i++) loom__free(o->state_name[i]);
  for (size_t i = 0; i < o->nseg; i++) loom__seg_state_free(o, &o->seg[i]);
  loom__free(o->state_name);
  loom__free(o->seg);
  o->magic = 0;
  loom__free(o);
}

void loom_optim_free(loom_optim *o) {
  if (!o) return;
  if (o->holds > 0) { /* still needed by its holder: freed when it lets go */
    o->free_asked = true;
    return;
  }
  optim_release(o);
}

void loom__optim_hold(loom_optim *o) { o->holds++; }

void loom__optim_let_go(loom_optim *o) {
  if (--o->holds == 0 && o->free_asked) optim_release(o);
}

/* Checks the segments: buffers present, lengths summing without overflow, names unique. */
static int check_segments(const char *who, const loom_param_seg *segs, size_t nseg,
                          size_t *total) {
  if (nseg && !segs) return loom__fail(LOOM_EINVAL, "%s: segs is NULL with nseg = %zu", who, nseg);
  size_t sum = 0;
  for (size_t i = 0; i < nseg; i++) {
    const loom_param_seg *s = &segs[i];
    if (s->n && (!s->param || !s->grad) && !(s->flags & LOOM_SEG_STREAMED))
      return loom__fail(LOOM_EINVAL, "%s: segment %zu has n = %zu but a NULL %s buffer", who, i,
                        s->n, s->param ? "grad" : "param");
    if (s->name && !s->name[0])
      return loom__fail(LOOM_EINVAL, "%s: segment %zu has an empty name", who, i);
    if (__builtin_add_overflow(sum, s->n, &sum) || sum > SIZE_MAX / (2 * sizeof(float)))
      return loom__fail(LOOM_EOVERFLOW, "%s: segment lengths overflow at segment %zu", who, i);
    for (size_t j = 0; j < i && s->name; j++)
      if (segs[j].name && strcmp(segs[j].name, s->name) == 0)
        return loom__fail(LOOM_EINVAL, "%s: segments %zu and %zu are both named \"%s\"", who, j,
                          i, s->name);
  }
  *total = sum;
  return LOOM_OK;
}

static char *format_name(const char *who, const char *a, const char *b) {
  size_t len = strlen(a) + (b ? strlen(b) + 1 : 0) + 1;
  char *s = loom__malloc(LOOM_POOL_META, len);
  if (!s) {
    loom__fail(LOOM_ENOMEM, "%s: out of memory for a state name", who);
    return NULL;
  }
  snprintf(s, len, b ? "%s.%s" : "%s", a, b);
  return s;
}

int loom__optim_create(const char *who, loom__optim_kind kind, const loom_param_seg *segs,
                       size_t nseg, int nstate, const char *const *state_kind, loom_pool pool,
                       loom_optim **out) {
  if (!out) return loom__fail(LOOM_EINVAL, "%s: out is NULL", who);
  *out = NULL;
  size_t total = 0;
  int rc = check_segments(who, segs, nseg, &total);
  if (rc) return rc;
  loom_optim *o = loom__calloc(LOOM_POOL_META, 1, sizeof *o);
  if (!o) return loom__fail(LOOM_ENOMEM, "%s: out of memory for the optimizer", who);
  o->magic = LOOM__OPTIM_MAGIC;
  o->kind = kind;
  o->nstate = nstate;
  o->state_pool = pool;
  for (int k = 0; k < nstate; k++) o->state_kind[k] = state_kind[k];
  if (nseg) {
    o->seg = loom__calloc(LOOM_POOL_META, nseg, sizeof *o->seg);
    LOOM_TRY_ALLOC(o->seg, "the segment table");
  }
  for (size_t i = 0; i < nseg; i++, o->nseg++) {
    char idx[32];
    snprintf(idx, sizeof idx, "%zu", i);
    o->seg[i].name = format_name(who, segs[i].name ? segs[i].name : idx, NULL);
    if (!o->seg[i].name) {
      rc = LOOM_ENOMEM;
      goto done;
    }
    o->seg[i].param = segs[i].param;
    o->seg[i].grad = segs[i].grad;
    o->seg[i].n = segs[i].n;
    o->seg[i].flags = segs[i].flags;
  }
  if (nstate && nseg) {
    o->state_name = loom__calloc(LOOM_POOL_META, nseg * (size_t)nstate, sizeof(char *));
    LOOM_TRY_ALLOC(o->state_name, "the state names");
    for (size_t i = 0; i < nseg; i++)
      for (int k = 0; k < nstate; k++) {
        char *s = format_name(who, o->seg[i].name, state_kind[k]);
        if (!s) {
          rc = LOOM_ENOMEM;
          goto done;
        }
        o->state_name[i * (size_t)nstate + (size_t)k] = s;
      }
  }
  for (size_t i = 0; i < nseg; i++)
    if ((rc = loom__seg_state_alloc(o, &o->seg[i], who))) goto done;
  *out = o;
  return LOOM_OK;
done:
  loom_optim_free(o);
  return rc;
}

int loom__seg_state_alloc(const loom_optim *o, loom__seg *s, const char *who) {
  for (int k = 0; k < o->nstate; k++) {
    /* at least one float, so that a live buffer is never NULL (NULL means released) */
    s->state[k] = loom__calloc(o->state_pool, s->n ? s->n : 1, sizeof(float));
    if (!s->state[k]) {
      loom__seg_state_free(o, s);
      return loom__fail(LOOM_ENOMEM, "%s: out of memory for %zu floats of %s.%s (%s pool)", who,
                        s->n, s->name, o->state_kind[k], loom_pool_name(o->state_pool));
    }
  }
  return LOOM_OK;
}

void loom__seg_state_free(const loom_optim *o, loom__seg *s) {
  for (int k = 0; k < LOOM__MAX_STATE; k++) {
    loom__free(s->state[k]);
    s->state[k] = NULL;
  }
}

int loom__check_grad_scale(float grad_scale, const char *who) {
  if (!isfinite(grad_scale) || !(grad_scale >= 0))
    return loom__fail(LOOM_EINVAL, "%s: grad_scale = %g must be finite and >= 0", who,
                      (double)grad_scale);
  return LOOM_OK;
}

void loom__step_args_make(const loom_optim *o, float grad_scale, loom__step_args *a) {
  *a = (loom__step_args){0};
  if (o->kind == LOOM__SGD)
    loom__sgd_args_make(o, grad_scale, &a->sgd);
  else
    loom__adam_args_make(o, grad_scale, &a->adam);
}

void loom__step_update(const loom_optim *o, const loom__step_args *a, unsigned flags, float *p,
                       const float *g, float *const *state, size_t n) {
  if (o->kind == LOOM__SGD)
    loom__sgd_update(o, &a->sgd, flags, p, g, state, n);
  else
    loom__adam_update(o, &a->adam, flags, p, g, state, n);
}

/* A segment's update; a long one in chunks over the caller's OpenMP team (the compute ops'
 * thread count, loom_set_num_threads): elementwise, so the split changes no value. */
static void update_on_team(const loom_optim *o, const loom__step_args *a, const loom__seg *s) {
  enum { PAR_MIN = 1 << 17, CHUNK = 1 << 15 };
  if (s->n < PAR_MIN) {
    loom__step_update(o, a, s->flags, s->param, s->grad, s->state, s->n);
    return;
  }
  int64_t chunks = (int64_t)((s->n + CHUNK - 1) / CHUNK);
#pragma omp parallel for if (LOOM__OMP_TEAM)
  for (int64_t c = 0; c < chunks; c++) {
    size_t at = (size_t)c * CHUNK, m = s->n - at < CHUNK ? s->n - at : CHUNK;
    float *st[LOOM__MAX_STATE];
    for (int k = 0; k < LOOM__MAX_STATE; k++) st[k] = s->state[k] ? s->state[k] + at : NULL;
    loom__step_update(o, a, s->flags, s->param + at, s->grad + at, st, m);
  }
}

static int step_scaled(loom_optim *o, float grad_scale, const char *who) {
  int rc = loom__optim_check(o, who);
  if (rc) return rc;
  if (o->chunk_open)
    return loom__fail(LOOM_EMISUSE, "%s: a chunked step is open (loom_optim_step_begin); end "
                      "it first", who);
  if ((rc = loom__check_grad_scale(grad_scale, who))) return rc;
  for (size_t i = 0; i < o->nseg; i++) /* all checked before anything changes */
    if (o->seg[i].flags & LOOM_SEG_STREAMED)
      return loom__fail(LOOM_EMISUSE, "%s: segment %zu (%s) is streamed (its buffers live "
                        "elsewhere, e.g. FSDP offload): step it with loom_optim_step_chunk "
                        "(loom_fsdp_optim_step)", who, i, o->seg[i].name);
    else if (loom__seg_released(o, &o->seg[i]))
      return loom__fail(LOOM_EMISUSE, "%s: segment %zu (%s) has its state released to the "
                        "caller; step it with loom_optim_step_chunk or restore it first", who, i,
                        o->seg[i].name);
  if (o->step == INT64_MAX) return loom__fail(LOOM_EOVERFLOW, "%s: step count overflows", who);
  o->step++;
  loom__step_args a;
  loom__step_args_make(o, grad_scale, &a);
  for (size_t i = 0; i < o->nseg; i++) {
    loom__seg *s = &o->seg[i];
    update_on_team(o, &a, s);
  }
  return LOOM_OK;
}

int loom_optim_step(loom_optim *o) { return step_scaled(o, 1.0f, "loom_optim_step"); }

int loom_optim_step_scaled(loom_optim *o, float grad_scale) {
  return step_scaled(o, grad_scale, "loom_optim_step_scaled");
}

const char *loom_optim_name(const loom_optim *o) {
  if (!o) return "?";
  switch (o->kind) {
  case LOOM__SGD: return "sgd";
  case LOOM__ADAM: return "adam";
  case LOOM__ADAMW: return "adamw";
  }
  return "?";
}

size_t loom_optim_segments(const loom_optim *o) { return o ? o->nseg : 0; }

int loom_optim_segment(const loom_optim *o, size_t i, loom_param_seg *out) {
  int rc = loom__optim_check(o, "loom_optim_segment");
  if (rc) return rc;
  if (!out) return loom__fail(LOOM_EINVAL, "loom_optim_segment: out is NULL");
  if (i >= o->nseg)
    return loom__fail(LOOM_EINVAL, "loom_optim_segment: segment %zu out of range (%zu segments)",
                      i, o->nseg);
  const loom__seg *g = &o->seg[i];
  *out = (loom_param_seg){g->name, g->param, g->grad, g->n, g->flags};
  return LOOM_OK;
}

int loom_optim_rebind(loom_optim *o, size_t i, float *param, const float *grad) {
  int rc = loom__optim_check(o, "loom_optim_rebind");
  if (rc) return rc;
  if (i >= o->nseg)
    return loom__fail(LOOM_EINVAL, "loom_optim_rebind: segment %zu out of range (%zu segments)",
                      i, o->nseg);
  if (o->seg[i].n && (!param || !grad))
    return loom__fail(LOOM_EINVAL, "loom_optim_rebind: segment %zu: NULL %s buffer", i,
                      param ? "grad" : "param");
  o->seg[i].param = param;
  o->seg[i].grad = grad;
  return LOOM_OK;
}

int loom_optim_set_lr(loom_optim *o, double lr) {
  int rc = loom__optim_check(o, "loom_optim_set_lr");
  if (rc) return rc;
  if (!(lr >= 0) || !isfinite(lr))
    return loom__fail(LOOM_EINVAL, "loom_optim_set_lr: lr = %g must be finite and >= 0", lr);
  o->lr = lr;
  return LOOM_OK;
}

double loom_optim_lr(const loom_optim *o) { return o ? o->lr : 0.0; }

int64_t loom_optim_step_count(const loom_optim *o) { return o ? o->step : 0; }

int loom_optim_set_step_count(loom_optim *o, int64_t step) {
  int rc = loom__optim_check(o, "loom_optim_set_step_count");
  if (rc) return rc;
  if (step < 0)
    return loom__fail(LOOM_EINVAL, "loom_optim_set_step_count: step %lld is negative",
                      (long long)step);
  if (o->chunk_open)
    return loom__fail(LOOM_EMISUSE, "loom_optim_set_step_count: a chunked step is open "
                      "(loom_optim_step_begin); end it first");
  o->step = step;
  return LOOM_OK;
}

size_t loom_optim_state_count(const loom_optim *o) {
  return o ? o->nseg * (size_t)o->nstate : 0;
}

int loom_optim_state_at(const loom_optim *o, size_t i, loom_optim_state *out) {
  int rc = loom__optim_check(o, "loom_optim_state_at");
  if (rc) return rc;
  if (!out) return loom__fail(LOOM_EINVAL, "loom_optim_state_at: out is NULL");
  size_t count = loom_optim_state_count(o);
  if (i >= count)
    return loom__fail(LOOM_EINVAL, "loom_optim_state_at: index %zu out of range (%zu buffers)",
                      i, count);
  const loom__seg *s = &o->seg[i / (size_t)o->nstate];
  out->name = o->state_name[i];
  out->data = s->state[i % (size_t)o->nstate]; /* NULL while released */
  out->n = s->n;
  return LOOM_OK;
}

int loom_optim_state_find(const loom_optim *o, const char *name, loom_optim_state *out) {
  int rc = loom__optim_check(o, "loom_optim_state_find");
  if (rc) return rc;
  if (!name || !out) return loom__fail(LOOM_EINVAL, "loom_optim_state_find: NULL argument");
  for (size_t i = 0; i < loom_optim_state_count(o); i++)
    if (strcmp(o->state_name[i], name) == 0) return loom_optim_state_at(o, i, out);
  return loom__fail(LOOM_ENOTFOUND, "loom_optim_state_find: %s has no state \"%s\"",
                    loom_optim_name(o), name);
}
