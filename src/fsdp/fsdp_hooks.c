/* fsdp_hooks.c: what FSDP does while the model runs.
 *
 * Forward (module hooks on each unit's module): gather the unit (issued earlier if it was
 * prefetched), issue the gathers of the next forward_prefetch units, run under autocast in the
 * forward dtype when mixed precision is on and no autocast region is open, then reshard
 * (unless the unit is kept for backward: reshard_after_forward off, the last unit, the root).
 * With gradients on, a hook goes on the unit's output.
 *
 * Backward: that output hook runs when the gradient reaches the unit. It reshards the units
 * whose backward is over, gathers this one (prefetching the units backward reaches next: the
 * reverse of the order the units finished forward), and gives each parameter a gradient view
 * into one f32 local-gradient buffer of the unit's padded length. Each parameter's gradient hook
 * counts the unit down; the last one reduce-scatters the buffer (averaged) into the rank's
 * gradient shard, asynchronously; once that completes the optimizer steps the unit there and
 * then with cfg.optim_in_backward (loom__fsdp_step_unit), or the shard leaves for the offload
 * tier. Hybrid sharding adds the shard's all-reduce over the replicas, issued at once on the
 * replica group and started there as the reduce-scatter ends; the next unit's backward waits
 * only for the reduce-scatter (its local gradient then goes), so the all-reduce crosses the
 * link while backward goes on. The end of backward (a queued callback) reduces what is left,
 * waits, frees every local gradient and reshards every unit. With sync off the local gradients
 * stay and accumulate. */
#include "fsdp/fsdp_int.h"
#include "dist/prepared.h"

#include <string.h>

static int pre_backward(loom_tensor *grad, void *ctx);

/* ---- forward ------------------------------------------------------------------------------ */

static void note_forward_order(loom_fsdp *f, fsdp_unit *u) {
  if (f->order_closed) {
    f->n_order = 0;
    f->order_closed = false;
  }
  for (size_t i = 0; i < f->n_order; i++)
    if (f->order[i] == u->index) return;
  if (f->n_order < f->nunits) f->order[f->n_order++] = u->index;
}

static int fwd_pre(loom_module *m, void *ctx) {
  (void)m;
  fsdp_unit *u = ctx;
  loom_fsdp *f = u->f;
  if (f->order_closed) { /* a new forward: the order is recorded afresh at each unit's end */
    f->n_order = 0;
    f->order_closed = false;
  }
  int rc = loom__fsdp_issue_gather(u, f->fwd_dtype);
  for (int k = 1; k <= f->cfg.forward_prefetch && !rc; k++) {
    size_t j = u->index + (size_t)k;
    if (j >= f->nunits) break;
    /* not while the last optimizer step's pass still steps it (fsdp_async.c): this unit
     * computes meanwhile, and the gather is issued when its unit comes */
    if (!loom__fsdp_step_done(&f->units[j])) break;
    if (f->units[j].state == UNIT_RESHARDED) rc = loom__fsdp_issue_gather(&f->units[j], f->fwd_dtype);
  }
  for (int k = 1; k <= f->cfg.offload.prefetch_steps && f->store && !rc; k++) {
    size_t j = u->index + (size_t)f->cfg.forward_prefetch + (size_t)k;
    if (j >= f->nunits || !loom__fsdp_step_done(&f->units[j])) break;
    rc = loom__fsdp_param_ahead(&f->units[j]);
  }
  if (!rc) rc = loom__fsdp_wait_gather(u);
  if (!rc && f->mp && !loom_autocast_enabled()) {
    loom_autocast_mode mode = f->fwd_dtype == LOOM_BF16 ? LOOM_AUTOCAST_BF16 : LOOM_AUTOCAST_F16;
    rc = loom_autocast_enter(mode, NULL, &u->autocast);
    u->autocast_on = rc == LOOM_OK;
  }
  return rc;
}

static int fwd_post(loom_module *m, loom_tensor *out, int rc_fwd, void *ctx) {
  (void)m;
  fsdp_unit *u = ctx;
  loom_fsdp *f = u->f;
  int rc = LOOM_OK;
  if (u->autocast_on) {
    rc = loom_autocast_exit(&u->autocast);
    u->autocast_on = false;
  }
  if (rc_fwd || rc) return rc; /* a failed forward leaves the unit gathered: resharded later */
  note_forward_order(f, u);
  bool grad = loom_grad_enabled() && out && loom_tensor_requires_grad(out);
  if (grad && (rc = loom_tensor_register_hook(out, pre_backward, u, NULL))) return rc;
  bool keep = grad && (!f->cfg.reshard_after_forward || u->module == f->root ||
                       u->index == f->nunits - 1);
  return keep ? LOOM_OK : loom__fsdp_reshard(u);
}

/* ---- backward ----------------------------------------------------------------------------- */

static int finish_cb(void *ctx) { return loom_fsdp_finish(ctx); }

static int begin_step(loom_fsdp *f) {
  if (f->cfg.optim_in_backward && f->sync && !f->step_opt)
    return loom__fail(LOOM_EMISUSE, "fsdp: optim_in_backward is on and no optimizer was given "
                      "(loom_fsdp_set_optim): backward has nothing to step with");
  int rc = loom__fsdp_step_join(f); /* the last optimizer step's pass: it reads the gradients */
  if (rc) return rc;
  f->oib_stepped = false;
  f->in_step = true;
  f->step_status = LOOM_OK;
  f->order_closed = true;
  for (size_t i = 0; i < f->nunits; i++) {
    fsdp_unit *u = &f->units[i];
    u->in_backward = false;
    u->reduced = false;
    u->pending = u->nparams;
    for (size_t k = 0; k < u->nparams; k++) u->params[k].ready = false;
  }
  return loom_backward_queue_callback(finish_cb, f);
}

/* The unit's local gradient: a padded f32 buffer whose gaps and tail are zero, each parameter's
 * gradient a view of it, logically zero until backward writes it. */
static int make_local_grad(fsdp_unit *u) {
  int64_t len = (int64_t)u->padded;
  int rc = loom_tensor_empty(LOOM_F32, 1, &len, &u->full_grad);
  if (rc) return rc;
  float *g = loom_tensor_data(u->full_grad);
  size_t at = 0;
  for (size_t i = 0; i < u->nparams && !rc; i++) {
    fsdp_param *fp = &u->params[i];
    if (fp->offset > at) memset(g + at, 0, (fp->offset - at) * sizeof *g);
    at = fp->offset + fp->numel;
    loom_tensor *v = fp->p->value, *view = NULL;
    rc = loom__tensor_view(u->full_grad, loom_tensor_ndim(v), loom_tensor_shape(v),
                           loom_tensor_strides(v), fp->offset, &view);
    if (!rc) rc = loom__tensor_set_grad_f32(v, view);
    loom_tensor_free(view);
    if (!rc) rc = loom_tensor_zero_grad_lazy(v);
  }
  if (u->padded > at) memset(g + at, 0, (u->padded - at) * sizeof *g);
  return rc;
}

static void unbind_local_grad(fsdp_unit *u) {
  for (size_t i = 0; i < u->nparams; i++) (void)loom__tensor_set_grad_f32(u->params[i].p->value, NULL);
}

static void drop_local_grad(fsdp_unit *u) {
  unbind_local_grad(u);
  loom_tensor_free(u->full_grad);
  u->full_grad = NULL;
}

/* The unit's gradient is reduced: the optimizer steps the unit now (cfg.optim_in_backward),
 * or it leaves for the offload tier (which takes the local gradient when it was reduced in
 * place). */
static int gradient_ready(fsdp_unit *u) {
  loom_fsdp *f = u->f;
  if (f->cfg.optim_in_backward && f->sync) return loom__fsdp_step_unit(u, u->rs_recv);
  return loom__fsdp_grad_done(u);
}

/* The unit's reduce-scatter has completed (status rc): gradient_ready, and the local gradient
 * goes. */
static int reduced(fsdp_unit *u, int rc) {
  if (u->rs_shard) { /* the replica all-reduce's first step waited for it, keeping it */
    int rc2 = loom_work_wait(&u->rs_shard);
    if (!rc) rc = rc2;
  }
  unbind_local_grad(u);
  if (!rc) rc = gradient_ready(u);
  drop_local_grad(u); /* NULL if the offloader took it */
  return rc;
}

int loom__fsdp_reap(fsdp_unit *u) {
  if (!u->rs_work) return LOOM_OK;
  loom_fsdp *f = u->f;
  double t0 = loom__now();
  int rc = loom_work_wait(&u->rs_work);
  double t1 = loom__now();
  f->stats.exposed_s += t1 - t0;
  f->stats.comm_s += t1 - u->rs_issued;
  return reduced(u, rc);
}

/* Reap the reduce-scatters that have completed, without waiting. */
static int reap_done(loom_fsdp *f) {
  int rc = LOOM_OK;
  for (size_t i = 0; i < f->nunits && !rc; i++) {
    fsdp_unit *u = &f->units[i];
    if (!u->rs_work) continue;
    int done = 0;
    rc = loom_work_test(&u->rs_work, &done);
    if (done) {
      f->stats.comm_s += loom__now() - u->rs_issued;
      rc = reduced(u, rc);
    }
  }
  return rc;
}

/* Hybrid sharding: the replica all-reduce's first step, on the replica group's thread: the
 * shard group's reduce-scatter that fills its buffer (kept: release_local may wait for it too;
 * reduced() frees it). */
static int wait_shard(void *ctx) {
  fsdp_unit *u = ctx;
  return loom__work_wait_keep(u->rs_shard);
}

/* Hybrid sharding: the unit's local gradient is needed only until the shard group's
 * reduce-scatter has read it, unless that reduced in place into it (the offload tier's
 * target): then wait for that alone, free the local gradient, and leave the replica all-reduce
 * running over the link while backward goes on. It is reaped once done (reap_done) or at the
 * end of backward, before the optimizer step, as PyTorch's HYBRID_SHARD waits for it.
 * local_only: whether the unit's chain may go on so (false: reap it whole). */
static bool local_only(const fsdp_unit *u) {
  if (!u->f->replica || !u->rs_shard) return false;
  if (!u->full_grad) return true; /* released already */
  const float *g = loom_tensor_data(u->full_grad);
  return u->rs_recv < g || u->rs_recv >= g + u->padded;
}

static int release_local(fsdp_unit *u) {
  loom_fsdp *f = u->f;
  double t0 = loom__now();
  int rc = loom__work_wait_keep(u->rs_shard);
  f->stats.exposed_s += loom__now() - t0;
  if (rc) return loom__fsdp_reap(u); /* the chain fails with it: reap the whole */
  drop_local_grad(u);
  return LOOM_OK;
}

/* The unit's gradients are complete: reduce-scatter them (or keep them, with sync off). */
static int post_backward(fsdp_unit *u) {
  loom_fsdp *f = u->f;
  u->reduced = true;
  int rc = loom_fsdp_apply_gradient_fp32(f, u->index);
  if (rc || !f->sync) return rc;
  /* earlier units' reduce-scatters that have completed are reaped first; this unit's is reaped
   * at the next unit's pre-backward (or a later reap), never at once: its local gradient then
   * lives while the unit's input gradient is computed whatever the peers' timing, so the peak
   * is the same in every run (loom plan's figure) */
  if ((rc = reap_done(f))) return rc;
  float *recv = NULL;
  if ((rc = loom__fsdp_grad_target(u, &recv))) return rc;
  u->rs_recv = recv;
  u->rs_issued = loom__now();
  rc = loom_pg_reduce_scatter(f->pg, loom_tensor_data(u->full_grad), recv, u->shard, LOOM_F32,
                              LOOM_AVG, f->replica ? &u->rs_shard : &u->rs_work);
  if (rc) return rc;
  f->stats.reduce_scatters++;
  f->stats.reduce_bytes += (uint64_t)(u->padded * sizeof(float));
  if (!f->replica) return LOOM_OK;
  /* hybrid sharding: the shard, averaged within the shard group, averaged over the replicas */
  rc = loom__pg_allreduce_prepared(f->replica, recv, recv, u->shard, LOOM_F32, LOOM_AVG,
                                   wait_shard, u, &u->rs_work);
  if (rc) {
    (void)loom_work_wait(&u->rs_shard);
    return rc;
  }
  f->stats.replica_reduces++;
  f->stats.replica_bytes += (uint64_t)(u->shard * sizeof(float));
  return LOOM_OK;
}

static int on_param_grad(loom_tensor *grad, void *ctx) {
  (void)grad;
  fsdp_param *fp = ctx;
  fsdp_unit *u = fp->unit;
  loom_fsdp *f = u->f;
  int rc = LOOM_OK;
  if (!f->in_step && (rc = begin_step(f))) return rc;
  if (fp->ready) return LOOM_OK;
  fp->ready = true;
  return --u->pending == 0 ? post_backward(u) : LOOM_OK;
}

static size_t order_pos(const loom_fsdp *f, size_t unit) {
  for (size_t i = 0; i < f->n_order; i++)
    if (f->order[i] == unit) return i;
  return SIZE_MAX;
}

static int pre_backward(loom_tensor *grad, void *ctx) {
  (void)grad;
  fsdp_unit *u = ctx;
  loom_fsdp *f = u->f;
  int rc = LOOM_OK;
  if (!f->in_step && (rc = begin_step(f))) return rc;
  if (u->in_backward) return LOOM_OK;
  u->in_backward = true;
  /* units whose gradients are complete have finished their ops (this gradient came out of
   * them): their parameters can go */
  for (size_t i = 0; i < f->nunits && !rc; i++) {
    fsdp_unit *o = &f->units[i];
    if (o != u && o->reduced && o->state != UNIT_RESHARDED) rc = loom__fsdp_reshard(o);
  }
  if (!rc) rc = loom__fsdp_issue_gather(u, f->fwd_dtype);
  size_t pos = order_pos(f, u->index);
  for (int k = 1; k <= f->cfg.backward_prefetch && pos != SIZE_MAX && !rc; k++) {
    if (pos < (size_t)k) break;
    fsdp_unit *o = &f->units[f->order[pos - (size_t)k]];
    if (o->state == UNIT_RESHARDED && !o->in_backward) rc = loom__fsdp_issue_gather(o, f->fwd_dtype);
  }
  for (int k = 1; k <= f->cfg.offload.prefetch_steps && f->store && pos != SIZE_MAX && !rc; k++) {
    size_t back = (size_t)f->cfg.backward_prefetch + (size_t)k;
    if (pos < back) break;
    fsdp_unit *o = &f->units[f->order[pos - back]];
    if (!o->in_backward) rc = loom__fsdp_param_ahead(o);
  }
  if (!rc) rc = loom__fsdp_wait_gather(u);
  /* one local gradient at a time: the previous unit's reduce-scatter (which ran while that
   * unit computed its input's gradient) must be done before this unit's buffer exists; under
   * hybrid sharding its replica all-reduce goes on (release_local) */
  for (size_t i = 0; i < f->nunits && !rc && f->cfg.limit_reduce_scatters; i++) {
    fsdp_unit *o = &f->units[i];
    if (!o->rs_work) continue;
    if (!local_only(o)) rc = loom__fsdp_reap(o);
    else if (o->full_grad) rc = release_local(o);
  }
  /* gradient shards that left: their buffers go; the last one's write goes on while this unit
   * computes (its pages are given back chunk by chunk as they reach the tier) */
  if (!rc) rc = loom__fsdp_grad_settle_older(f);
  if (!rc && !u->full_grad) rc = make_local_grad(u);
  return rc;
}

int loom_fsdp_finish(loom_fsdp *f) {
  if (!f) return loom__fail(LOOM_EINVAL, "loom_fsdp_finish: fsdp is NULL");
  if (!f->in_step) return f->step_status;
  int rc = LOOM_OK;
  /* units some of whose parameters got no gradient: the rest are zeros; units that took no
   * part: a zero gradient shard, nothing to send */
  for (size_t i = f->nunits; i-- > 0 && !rc;) {
    fsdp_unit *u = &f->units[i];
    if (u->reduced) continue;
    if (u->full_grad) {
      for (size_t k = 0; k < u->nparams && !rc; k++) rc = loom_tensor_settle_grad(u->params[k].p->value);
      if (!rc) rc = post_backward(u);
    } else if (f->sync) {
      float *zero = NULL; /* no local gradient: a zero shard */
      if (!(rc = loom__fsdp_grad_target(u, &zero))) {
        if (!loom__dry()) memset(zero, 0, u->shard * sizeof(float));
        u->rs_recv = zero;
        rc = gradient_ready(u);
      }
    }
  }
  double exposed0 = f->stats.exposed_s;
  for (size_t i = f->nunits; i-- > 0;) {
    int rc2 = loom__fsdp_reap(&f->units[i]);
    if (!rc) rc = rc2;
  }
  f->stats.exposed_end_s += f->stats.exposed_s - exposed0;
  int rc_settle = loom__fsdp_grad_settle(f);
  if (!rc) rc = rc_settle;
  int rc_close = loom__fsdp_step_close(f, rc == LOOM_OK);
  if (!rc) rc = rc_close;
  for (size_t i = 0; i < f->nunits; i++) {
    int rc2 = loom__fsdp_reshard(&f->units[i]);
    if (!rc) rc = rc2;
  }
  /* a peer may still compute an input gradient from a unit it already reduced; the optimizer
   * step that comes next writes the shards (fsdp_share.c) */
  if (f->sync) {
    int rc_fence = loom__fsdp_share_fence(f);
    if (!rc) rc = rc_fence;
    f->stats.steps++;
  }
  f->in_step = false;
  f->step_status = rc;
  return rc;
}

int loom_fsdp_set_sync(loom_fsdp *f, bool sync) {
  if (!f) return loom__fail(LOOM_EINVAL, "loom_fsdp_set_sync: fsdp is NULL");
  if (f->in_step)
    return loom__fail(LOOM_EMISUSE, "loom_fsdp_set_sync: a backward is running");
  f->sync = sync;
  return LOOM_OK;
}

/* ---- installing ----------------------------------------------------------------------------- */

static const loom__module_hooks unit_hooks = {fwd_pre, fwd_post};

int loom__fsdp_install_hooks(loom_fsdp *f) {
  for (size_t i = 0; i < f->nunits; i++) {
    fsdp_unit *u = &f->units[i];
    if (u->module->hooks)
      return loom__fail(LOOM_EMISUSE, "fsdp: module '%s' is wrapped already", loom__fsdp_unit_shown(u->name));
  }
  for (size_t i = 0; i < f->nunits; i++) {
    fsdp_unit *u = &f->units[i];
    loom__module_set_hooks(u->module, &unit_hooks, u);
    for (size_t k = 0; k < u->nparams; k++) {
      fsdp_param *fp = &u->params[k];
      fp->hook_id = -1;
      int rc = loom_tensor_register_hook_phase(fp->p->value, LOOM_HOOK_REDUCE, on_param_grad, fp,
                                               &fp->hook_id);
      if (rc) return rc;
    }
  }
  return LOOM_OK;
}

void loom__fsdp_remove_hooks(loom_fsdp *f) {
  for (size_t i = 0; i < f->nunits; i++) {
    fsdp_unit *u = &f->units[i];
    if (u->module->hooks == &unit_hooks && u->module->hooks_ctx == u)
      loom__module_set_hooks(u->module, NULL, NULL);
    for (size_t k = 0; k < u->nparams; k++)
      if (u->params[k].hook_id >= 0) {
        (void)loom_tensor_remove_hook(u->params[k].p->value, u->params[k].hook_id);
        u->params[k].hook_id = -1;
      }
  }
}
