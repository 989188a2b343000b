/* ddp.c: the DDP wrapper: checks that every rank has the same parameters, broadcasts rank 0's
 * values, lays the buckets over the gradients (one storage: ddp_int.h), and launches each bucket's
 * all-reduce from the gradient hooks as soon as the bucket is complete, in bucket order; the
 * end of backward waits for the last one. */
#include "ddp/ddp_int.h"
#include "dist/peers.h"
#include "core/tensor_int.h"
#include "loom/autograd.h"

#include <stdio.h>
#include <string.h>

typedef struct param_slot {
  loom_ddp *d;
  size_t index;
} param_slot;

struct loom_ddp {
  loom_pg *pg;
  size_t n;
  loom_tensor **params; /* retained */
  char **names;
  loom_ddp_cfg cfg;
  loom_bucket_manager *m;
  param_slot *slots;
  int *hook_ids;
  size_t *pending; /* per bucket: gradients not ready yet in this step */
  bool *ready;     /* per parameter: gradient complete in this step */
  size_t next_launch;
  bool sync, in_step;
  int step_status;
  double t_first_launch;
  uint64_t control_collectives;
  loom_ddp_stats stats;
  loom_param_seg *segs; /* loom_ddp_segments, made at the first call */
  char (*seg_names)[32];
};

loom_ddp_cfg loom_ddp_cfg_default(void) {
  return (loom_ddp_cfg){.buckets = loom_bucket_cfg_default(),
                        .overlap = true,
                        .broadcast_params = true,
                        .wire_dtype = LOOM_F32};
}

int loom_ddp_cfg_validate(const loom_ddp_cfg *cfg) {
  if (!cfg) return loom__fail(LOOM_EINVAL, "ddp cfg: NULL");
  int rc = loom_bucket_cfg_validate(&cfg->buckets);
  if (rc) return rc;
  if (cfg->wire_dtype_set && !loom_dtype_is_float(cfg->wire_dtype))
    return loom__fail(LOOM_EINVAL, "ddp cfg: wire_dtype must be f32, f16 or bf16 (got %s)",
                      loom_dtype_name(cfg->wire_dtype));
  return LOOM_OK;
}

/* Every rank must have the same parameters: count, then per parameter dtype, shape and name. */
static int check_peers(loom_ddp *d) {
  uint64_t n = 0;
  int rc = loom__pg_check_same_tensors(d->pg, d->params, (const char *const *)d->names, d->n,
                                       "ddp", &n);
  d->control_collectives += n;
  return rc;
}

static int broadcast_params(loom_ddp *d) {
  loom_work **w = loom__calloc(LOOM_POOL_META, d->n ? d->n : 1, sizeof *w);
  if (!w) return loom__fail(LOOM_ENOMEM, "ddp: out of memory broadcasting parameters");
  int rc = LOOM_OK;
  for (size_t i = 0; i < d->n && !rc; i++) {
    loom_tensor *p = d->params[i];
    void *data = loom_tensor_data(p);
    rc = loom_pg_broadcast(d->pg, data, data, loom_tensor_numel(p), loom_tensor_dtype(p), 0, &w[i]);
    if (!rc) d->control_collectives++;
  }
  int rc2 = loom_work_wait_all(w, d->n);
  loom__free(w);
  return rc ? rc : rc2;
}

/* Start every complete bucket from next_launch on, in order. */
static int launch_ready(loom_ddp *d) {
  size_t nb = loom_bucket_manager_count(d->m);
  float inv = 1.0f / (float)loom_pg_size(d->pg);
  while (d->next_launch < nb && d->pending[d->next_launch] == 0) {
    size_t b = d->next_launch++;
    if (!d->t_first_launch) d->t_first_launch = loom__ddp_now();
    /* Average. The anchors divide before summing so that f16 sums cannot overflow; loom's
     * groups sum f16/bf16 in f32 and divide that sum before rounding it once (LOOM_AVG, in the
     * reduction's cache-resident block: no pass of its own), which cannot overflow either.
     * Only a wire dtype with less range (f32 sent as f16/bf16, bf16 sent as f16) needs the
     * division first, so that the cast to the wire keeps the anchors' range. */
    loom_redop op = LOOM_AVG;
    if (inv != 1.0f && loom__bucket_wire_narrows(d->m, b)) {
      loom__bucket_scale(d->m, b, inv);
      op = LOOM_SUM;
    }
    int rc = loom_bucket_prepare(d->m, b); /* copies only gradients its buffer does not view */
    if (!rc) rc = loom_bucket_reduce_async(d->m, b, op);
    if (rc) return rc;
  }
  return LOOM_OK;
}

static void begin_step(loom_ddp *d) {
  d->in_step = true;
  d->step_status = LOOM_OK;
  d->next_launch = 0;
  d->t_first_launch = 0;
  const loom__bucket_plan *p = &d->m->plan;
  for (size_t b = 0; b < p->nbuckets; b++) d->pending[b] = p->count[b];
  memset(d->ready, 0, d->n * sizeof *d->ready);
}

static int finish_cb(void *ctx) { return loom_ddp_finish(ctx); }

static int on_grad_ready(loom_tensor *grad, void *ctx) {
  (void)grad;
  param_slot *s = ctx;
  loom_ddp *d = s->d;
  if (!d->sync) return LOOM_OK;
  if (!d->in_step) {
    begin_step(d);
    int rc = loom_backward_queue_callback(finish_cb, d);
    if (rc) return rc;
  }
  if (d->ready[s->index]) return LOOM_OK;
  d->ready[s->index] = true;
  d->pending[d->m->plan.bucket_of[s->index]]--;
  return d->cfg.overlap ? launch_ready(d) : LOOM_OK;
}

int loom_ddp_finish(loom_ddp *d) {
  if (!d) return loom__fail(LOOM_EINVAL, "loom_ddp_finish: ddp is NULL");
  if (!d->sync) return LOOM_OK; /* no_sync: gradients stay local, nothing was reduced */
  if (!d->in_step) return d->step_status; /* finished already (backward's queued callback) */
  double t_end = loom__ddp_now();
  size_t nb = loom_bucket_manager_count(d->m);
  size_t unused = d->n;
  int rc = LOOM_OK;
  for (size_t i = 0; i < d->n; i++) {
    if (d->ready[i]) continue;
    if (unused == d->n) unused = i;
    int zrc = loom_tensor_settle_grad(d->params[i]); /* a lazily zeroed gradient is sent as zeros */
    if (!rc) rc = zrc;
  }
  /* Launch what is left (all of it on the eager path; with an unused parameter, its bucket and
   * those after it, so that every rank still issues the same collectives). */
  for (size_t b = d->next_launch; b < nb; b++) d->pending[b] = 0;
  int rc_launch = launch_ready(d);
  if (!rc) rc = rc_launch;
  int rc2 = loom_bucket_manager_wait_all(d->m);
  if (!rc2) rc2 = loom_bucket_manager_copy_back_all(d->m); /* gradients its buffers do not view */
  double t_done = loom__ddp_now();
  if (!rc) rc = rc2;
  d->stats.steps++;
  /* exposed: everything after backward's compute, the launches (and their averaging) too */
  d->stats.last_exposed_s = t_done - t_end;
  d->stats.exposed_s += d->stats.last_exposed_s;
  d->stats.first_launch_lead_s = d->t_first_launch ? t_end - d->t_first_launch : 0;
  d->in_step = false;
  if (!rc && unused < d->n) {
    rc = loom__fail(LOOM_EMISUSE,
                    "ddp: parameter %zu%s%s%s got no gradient in this backward; every parameter "
                    "must take part in the loss on every rank", unused,
                    d->names && d->names[unused] ? " (" : "",
                    d->names && d->names[unused] ? d->names[unused] : "",
                    d->names && d->names[unused] ? ")" : "");
  }
  d->step_status = rc;
  return rc;
}

int loom_ddp_set_sync(loom_ddp *d, bool sync) {
  if (!d) return loom__fail(LOOM_EINVAL, "loom_ddp_set_sync: ddp is NULL");
  if (d->in_step)
    return loom__fail(LOOM_EMISUSE, "loom_ddp_set_sync: a synchronised backward is running");
  d->sync = sync;
  return LOOM_OK;
}

int loom_ddp_any(loom_ddp *d, bool local, bool *global) {
  if (!d || !global) return loom__fail(LOOM_EINVAL, "loom_ddp_any: NULL argument");
  int32_t flag = local ? 1 : 0;
  int rc = loom_pg_allreduce(d->pg, &flag, &flag, 1, LOOM_I32, LOOM_MAX, NULL);
  if (rc) return rc;
  d->control_collectives++;
  *global = flag != 0;
  return LOOM_OK;
}

int loom_ddp_stats_get(const loom_ddp *d, loom_ddp_stats *out) {
  if (!d || !out) return loom__fail(LOOM_EINVAL, "loom_ddp_stats_get: NULL argument");
  *out = d->stats;
  out->collectives = d->m->collectives + d->control_collectives;
  out->bytes = d->m->bytes;
  out->buckets = loom_bucket_manager_count(d->m);
  out->comm_s = d->m->comm_s;
  return LOOM_OK;
}

loom_bucket_manager *loom_ddp_buckets(loom_ddp *d) { return d ? d->m : NULL; }

/* Bucket b as a segment: its gradients, and the parameters that sit at the same offsets. */
static int bucket_segment(loom_ddp *d, size_t b, loom_param_seg *out) {
  static const char *who = "loom_ddp_segments";
  loom_bucket_info info;
  int rc = loom_bucket_manager_info(d->m, b, &info);
  if (rc) return rc;
  if (info.dtype != LOOM_F32)
    return loom__fail(LOOM_ENOSYS, "%s: bucket %zu holds %s gradients; optimizers step f32", who,
                      b, loom_dtype_name(info.dtype));
  float *grad = loom_tensor_data(info.buffer), *param = NULL;
  for (size_t k = 0; k < info.count; k++) {
    size_t g = info.grads[k], off = info.offsets[k];
    float *p = (float *)loom_tensor_data(d->params[g]) - off;
    if ((k && p != param) || (float *)loom_tensor_data(d->m->grads[g]) != grad + off)
      return loom__fail(LOOM_ENOSYS, "%s: bucket %zu: parameter %zu%s%s%s does not sit at its "
                        "gradient's offset in one parameter buffer; build the optimizer over "
                        "loom_module_arena or the parameters", who, b, g,
                        d->names[g] ? " (" : "", d->names[g] ? d->names[g] : "",
                        d->names[g] ? ")" : "");
    param = p;
  }
  snprintf(d->seg_names[b], sizeof d->seg_names[b], "bucket.%zu", b);
  *out = (loom_param_seg){d->seg_names[b], param, grad, loom_tensor_numel(info.buffer), 0};
  return LOOM_OK;
}

int loom_ddp_segments(loom_ddp *d, const loom_param_seg **segs, size_t *n) {
  if (!d || !segs || !n) return loom__fail(LOOM_EINVAL, "loom_ddp_segments: NULL argument");
  size_t nb = loom_bucket_manager_count(d->m);
  int rc = LOOM_OK;
  if (!d->segs) {
    loom_param_seg *v = loom__calloc(LOOM_POOL_HOST, nb ? nb : 1, sizeof *v);
    d->seg_names = loom__calloc(LOOM_POOL_HOST, nb ? nb : 1, sizeof *d->seg_names);
    if (!v || !d->seg_names) rc = loom__fail(LOOM_ENOMEM, "loom_ddp_segments: out of memory");
    for (size_t b = 0; b < nb && !rc; b++) rc = bucket_segment(d, b, &v[b]);
    if (rc) {
      loom__free(v);
      loom__free(d->seg_names);
      d->seg_names = NULL;
      return rc;
    }
    d->segs = v;
  }
  *segs = d->segs;
  *n = nb;
  return LOOM_OK;
}

void loom_ddp_free(loom_ddp *d) {
  if (!d) return;
  if (d->m) loom_bucket_manager_wait_all(d->m);
  for (size_t i = 0; i < d->n; i++) {
    if (d->params && d->params[i]) {
      if (d->hook_ids && d->hook_ids[i] >= 0) loom_tensor_remove_hook(d->params[i], d->hook_ids[i]);
      loom_tensor_free(d->params[i]);
    }
    if (d->names) loom__free(d->names[i]);
  }
  loom__free(d->params);
  loom__free(d->names);
  loom__free(d->slots);
  loom__free(d->hook_ids);
  loom__free(d->pending);
  loom__free(d->ready);
  loom__free(d->segs);
  loom__free(d->seg_names);
  loom_bucket_manager_free(d->m);
  loom__free(d);
}

int loom_ddp_create(loom_pg *pg, loom_tensor *const *params, const char *const *names, size_t n,
                    const loom_ddp_cfg *cfg, loom_ddp **out) {
  static const char *who = "loom_ddp_create";
  if (!out) return loom__fail(LOOM_EINVAL, "%s: out is NULL", who);
  *out = NULL;
  if (!pg) return loom__fail(LOOM_EINVAL, "%s: process group is NULL", who);
  if (n && !params) return loom__fail(LOOM_EINVAL, "%s: params is NULL", who);
  loom_ddp_cfg defaults;
  if (!cfg) {
    defaults = loom_ddp_cfg_default();
    cfg = &defaults;
  }
  int rc = loom_ddp_cfg_validate(cfg);
  if (rc) return rc;
  for (size_t i = 0; i < n; i++) {
    if ((rc = loom__tensor_check_data(params[i], who))) return rc; /* deferred: none */
    if (!loom_tensor_is_leaf(params[i]) || !loom_tensor_requires_grad(params[i]))
      return loom__fail(LOOM_EINVAL, "%s: parameter %zu is not a leaf that requires grad", who, i);
    if (!loom_tensor_is_contiguous(params[i]))
      return loom__fail(LOOM_EINVAL, "%s: parameter %zu is not contiguous", who, i);
  }
  loom_ddp *d = loom__calloc(LOOM_POOL_META, 1, sizeof *d);
  LOOM_TRY_ALLOC(d, "the ddp object");
  d->pg = pg;
  d->n = n;
  d->cfg = *cfg;
  d->sync = true;
  size_t cap = n ? n : 1;
  d->params = loom__calloc(LOOM_POOL_META, cap, sizeof *d->params);
  d->names = loom__calloc(LOOM_POOL_META, cap, sizeof *d->names);
  d->slots = loom__calloc(LOOM_POOL_META, cap, sizeof *d->slots);
  d->hook_ids = loom__calloc(LOOM_POOL_META, cap, sizeof *d->hook_ids);
  d->ready = loom__calloc(LOOM_POOL_META, cap, sizeof *d->ready);
  LOOM_TRY_ALLOC(d->params && d->names && d->slots && d->hook_ids && d->ready ? d : NULL,
                 "the parameter tables");
  for (size_t i = 0; i < n; i++) {
    d->params[i] = loom_tensor_retain(params[i]);
    d->hook_ids[i] = -1;
    if (names && names[i]) {
      d->names[i] = loom__strdup(LOOM_POOL_META, names[i]);
      LOOM_TRY_ALLOC(d->names[i], "a parameter name");
    }
  }
  LOOM_TRY(check_peers(d));
  if (cfg->broadcast_params) LOOM_TRY(broadcast_params(d));
  LOOM_TRY(loom__bucket_manager_create_ddp(pg, params, n, &cfg->buckets, cfg->wire_dtype_set,
                                           cfg->wire_dtype, &d->m));
  d->pending = loom__calloc(LOOM_POOL_META, loom_bucket_manager_count(d->m) + 1, sizeof *d->pending);
  LOOM_TRY_ALLOC(d->pending, "the bucket counters");
  for (size_t i = 0; i < n; i++) {
    if (loom_tensor_grad(params[i]) != d->m->grads[i]) /* it had none: its bucket's view */
      LOOM_TRY(loom_tensor_set_grad(params[i], d->m->grads[i]));
    d->slots[i] = (param_slot){d, i};
    LOOM_TRY(loom_tensor_register_hook_phase(params[i], LOOM_HOOK_REDUCE, on_grad_ready, &d->slots[i],
                                             &d->hook_ids[i]));
  }
  *out = d;
  return LOOM_OK;
done:
  loom_ddp_free(d);
  return rc;
}

int loom_ddp_create_for_module(loom_pg *pg, loom_module *m, const loom_ddp_cfg *cfg,
                               loom_ddp **out) {
  static const char *who = "loom_ddp_create_for_module";
  if (!out) return loom__fail(LOOM_EINVAL, "%s: out is NULL", who);
  *out = NULL;
  if (!m) return loom__fail(LOOM_EINVAL, "%s: module is NULL", who);
  size_t n = loom_module_param_count(m);
  if (n == 0) return loom__fail(LOOM_EINVAL, "%s: the module has no parameters", who);
  loom_tensor **params = loom__calloc(LOOM_POOL_META, n, sizeof *params);
  const char **names = loom__calloc(LOOM_POOL_META, n, sizeof *names);
  int rc = params && names ? LOOM_OK : loom__fail(LOOM_ENOMEM, "%s: out of memory", who);
  for (size_t i = 0; i < n && !rc; i++) {
    loom_param p;
    if (!(rc = loom_module_param(m, i, &p))) params[i] = p.value, names[i] = p.name;
  }
  if (!rc) rc = loom_ddp_create(pg, params, names, n, cfg, out);
  loom__free(params);
  loom__free(names);
  return rc;
}
