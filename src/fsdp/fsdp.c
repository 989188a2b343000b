/* fsdp.c: the FSDP wrapper's life: configuration, create (units, the check that every rank
 * wraps the same model, rank 0's values or a deferred model's initialisers, this rank's shards,
 * hooks, giving the module's arenas back), free, and the per-shard services the optimizer step needs (segments, a flag over
 * ranks, global gradient-norm clipping, statistics). */
#include "fsdp/fsdp_int.h"
#include "core/layout.h"
#include "dist/peers.h"
#include "fsdp/offload_store.h"

#include <math.h>
#include <string.h>

#define MAX_PREFETCH 8

loom_fsdp_cfg loom_fsdp_cfg_default(void) {
  loom_fsdp_cfg cfg = {.wrap = LOOM_FSDP_WRAP_CHILDREN,
                       .min_unit_numel = 100000000,
                       .reshard_after_forward = true,
                       .forward_prefetch = 1,
                       .backward_prefetch = 1,
                       .broadcast_params = true,
                       .limit_reduce_scatters = true,
                       .mp = loom_fsdp_mp_cfg_default(),
                       .offload = loom_fsdp_offload_cfg_default()};
  cfg.mp.enabled = false;
  cfg.offload.enabled = false;
  return cfg;
}

int loom_fsdp_cfg_validate(const loom_fsdp_cfg *cfg) {
  if (!cfg) return loom__fail(LOOM_EINVAL, "fsdp cfg: NULL");
  if ((unsigned)cfg->wrap > LOOM_FSDP_WRAP_LIST)
    return loom__fail(LOOM_EINVAL, "fsdp cfg: wrap %d is not a policy (children, size, list)",
                      (int)cfg->wrap);
  if (cfg->wrap == LOOM_FSDP_WRAP_SIZE && cfg->min_unit_numel == 0)
    return loom__fail(LOOM_EINVAL, "fsdp cfg: min_unit_numel must be > 0 for the size policy");
  if (cfg->wrap == LOOM_FSDP_WRAP_LIST) {
    if (!cfg->unit_names || cfg->n_unit_names == 0)
      return loom__fail(LOOM_EINVAL, "fsdp cfg: the list policy needs unit_names");
    for (size_t i = 0; i < cfg->n_unit_names; i++)
      if (!cfg->unit_names[i] || !*cfg->unit_names[i])
        return loom__fail(LOOM_EINVAL, "fsdp cfg: unit_names[%zu] is empty", i);
  }
  if (cfg->forward_prefetch < 0 || cfg->forward_prefetch > MAX_PREFETCH)
    return loom__fail(LOOM_EINVAL, "fsdp cfg: forward_prefetch %d must be within 0..%d",
                      cfg->forward_prefetch, MAX_PREFETCH);
  if (cfg->backward_prefetch < 0 || cfg->backward_prefetch > MAX_PREFETCH)
    return loom__fail(LOOM_EINVAL, "fsdp cfg: backward_prefetch %d must be within 0..%d",
                      cfg->backward_prefetch, MAX_PREFETCH);
  int rc = cfg->mp.enabled ? loom_fsdp_mp_cfg_validate(&cfg->mp) : LOOM_OK;
  if (!rc && cfg->optim_in_backward && cfg->mp.enabled && cfg->mp.use_loss_scaling)
    rc = loom__fail(LOOM_EINVAL, "fsdp cfg: optim_in_backward with dynamic loss scaling "
                    "(mp.use_loss_scaling): a step may not run before every gradient is checked "
                    "for inf and NaN; turn one of them off");
  return rc ? rc : loom_fsdp_offload_cfg_validate(&cfg->offload);
}

/* ---- create --------------------------------------------------------------------------------- */

/* A deferred model's values come from its initialisers on each rank, not from rank 0: every
 * rank must be deferred alike and hold the same initialisers (the same seed). */
static int check_peers_init(loom_fsdp *f) {
  bool d = f->root->deferred;
  const int64_t v[2] = {d, d ? (int64_t)loom__module_init_hash(f->root) : 0};
  size_t n = 2, first = n;
  int rc = loom__pg_agree_i64(f->pg, v, n, &first);
  if (!rc && first == 0)
    rc = loom__fail(LOOM_EMISUSE, "fsdp: the model is built %s here and not on another rank: "
                    "build it with deferred initialisation on every rank or on none",
                    f->root->deferred ? "deferred" : "with values");
  else if (!rc && first < n)
    rc = loom__fail(LOOM_EMISUSE, "fsdp: the deferred model's initialisers differ between "
                    "ranks: build it with the same seed on every rank");
  return rc;
}

/* Every rank wraps the same model: parameters (count, names, dtypes, shapes, order), then the
 * same units (a wrap policy that differs), then the same way of getting values. */
static int check_peers(loom_fsdp *f) {
  size_t n = f->nparams;
  loom_tensor **ts = loom__calloc(LOOM_POOL_META, n ? n : 1, sizeof *ts);
  const char **names = loom__calloc(LOOM_POOL_META, n ? n : 1, sizeof *names);
  int rc = !ts || !names ? loom__fail(LOOM_ENOMEM, "fsdp: out of memory checking peers") : 0;
  for (size_t i = 0; i < n && !rc; i++) {
    ts[i] = f->root->flat[i]->value;
    names[i] = f->root->flat[i]->full;
  }
  if (!rc) rc = loom__pg_check_same_tensors(f->pg, ts, names, n, "fsdp", NULL);
  loom__free(ts);
  loom__free(names);
  if (rc) return rc;
  int64_t count = (int64_t)f->nunits;
  size_t first = 1;
  if ((rc = loom__pg_agree_i64(f->pg, &count, 1, &first))) return rc;
  if (first == 0)
    return loom__fail(LOOM_EMISUSE, "fsdp: ranks disagree on the number of units (%zu here): "
                      "is the wrap policy the same on every rank?", f->nunits);
  int64_t *v = loom__calloc(LOOM_POOL_META, 2 * (f->nunits ? f->nunits : 1), sizeof *v);
  if (!v) return loom__fail(LOOM_ENOMEM, "fsdp: out of memory checking peers");
  for (size_t u = 0; u < f->nunits; u++) {
    v[2 * u] = (int64_t)f->units[u].numel;
    v[2 * u + 1] = f->units[u].nparams ? (int64_t)f->units[u].params[0].index : -1;
  }
  first = 2 * f->nunits;
  rc = loom__pg_agree_i64(f->pg, v, 2 * f->nunits, &first);
  loom__free(v);
  if (!rc && first < 2 * f->nunits)
    rc = loom__fail(LOOM_EMISUSE, "fsdp: ranks disagree on unit %zu ('%s' here, %zu elements): "
                    "is the wrap policy the same on every rank?", first / 2,
                    loom__fsdp_unit_shown(f->units[first / 2].name), f->units[first / 2].numel);
  return rc ? rc : check_peers_init(f);
}

/* This rank's part of unit u's flat layout, from the module's parameter values, or, for a
 * deferred model, from their initialisers: only this part is ever made. */
static int make_shards(fsdp_unit *u, int rank) {
  int rc = loom__fsdp_share_resident(u); /* ranks in one process: a slice of one buffer */
  if (rc) return rc;
  if (!u->resident)
    u->param_shard = loom__calloc(LOOM_POOL_COMPUTE, u->shard ? u->shard : 1, sizeof(float));
  if (!loom__fsdp_offloading(u->f, OFF_GRAD)) /* offloaded: made by the first reduce-scatter */
    u->grad_shard = loom__calloc(LOOM_POOL_COMPUTE, u->shard ? u->shard : 1, sizeof(float));
  if (!u->param_shard || (!u->grad_shard && !loom__fsdp_offloading(u->f, OFF_GRAD)))
    return loom__fail(LOOM_ENOMEM, "fsdp: out of memory for the shards of unit '%s' (%zu "
                      "elements)", loom__fsdp_unit_shown(u->name), u->shard);
  size_t lo = (size_t)rank * u->shard, hi = lo + u->shard;
  for (size_t i = 0; i < u->nparams; i++) {
    const fsdp_param *fp = &u->params[i];
    size_t a, b;
    if (!loom__layout_slice(fp->offset, fp->numel, lo, hi, &a, &b) || loom__dry()) continue;
    if (u->f->root->deferred) {
      rc = loom__param_init_into(fp->p, a - fp->offset, b - fp->offset,
                                 u->param_shard + (a - lo), LOOM_F32);
      if (rc) return rc;
      continue;
    }
    const float *src = loom_tensor_data(fp->p->value);
    memcpy(u->param_shard + (a - lo), src + (a - fp->offset), (b - a) * sizeof(float));
  }
  return LOOM_OK;
}

static int make_segments(loom_fsdp *f) {
  f->segs = loom__calloc(LOOM_POOL_META, f->nunits ? f->nunits : 1, sizeof *f->segs);
  f->seg_names = loom__calloc(LOOM_POOL_META, f->nunits ? f->nunits : 1, sizeof *f->seg_names);
  if (!f->segs || !f->seg_names) return loom__fail(LOOM_ENOMEM, "fsdp: out of memory");
  for (size_t i = 0; i < f->nunits; i++) {
    fsdp_unit *u = &f->units[i];
    size_t len = strlen(u->name) + sizeof ".flat_param";
    f->seg_names[i] = loom__malloc(LOOM_POOL_META, len);
    if (!f->seg_names[i]) return loom__fail(LOOM_ENOMEM, "fsdp: out of memory");
    snprintf(f->seg_names[i], len, "%s%sflat_param", u->name, *u->name ? "." : "");
    /* buffers in the offload tier are given to the optimizer chunk by chunk */
    bool streamed = !u->param_shard || !u->grad_shard;
    f->segs[i] = (loom_param_seg){f->seg_names[i], u->param_shard, u->grad_shard, u->shard,
                                  streamed ? LOOM_SEG_STREAMED : 0u};
  }
  return LOOM_OK;
}

static int check_module(loom_module *m) {
  if (m->parent)
    return loom__fail(LOOM_EMISUSE, "loom_fsdp_create: the module is a child of another; wrap "
                      "the root");
  for (int d = 0; d < LOOM_DTYPE_COUNT; d++)
    if (d != LOOM_F32 && m->arena[d])
      return loom__fail(LOOM_EDTYPE, "loom_fsdp_create: every parameter must be f32 (master "
                        "weights; mixed precision is cfg.mp), the model has %s ones",
                        loom_dtype_name((loom_dtype)d));
  for (size_t i = 0; i < m->n_flat && !m->deferred; i++)
    if (loom__tensor_released(m->flat[i]->value))
      return loom__fail(LOOM_EMISUSE, "loom_fsdp_create: the module is wrapped already "
                        "(parameter %s holds no data)", m->flat[i]->full);
  return LOOM_OK;
}

/* A step frees and takes again the same large buffers (each gather, its cast shard, each local
 * gradient: up to a unit's whole flat length); the allocator's cache keeps freed blocks for the
 * next allocation of that size, which saves faulting in and clearing fresh pages (a sixth of an
 * f32 step of the 4096-wide MLP here). Its default limit (256 MiB for the process) cannot hold
 * one step's in-flight set of large units for every rank, so each wrapper adds that set to the
 * limit while it lives (nothing if the cache is off). Cached blocks are not counted in the
 * memory pools: the compute pool's figures stay what is in use, as PyTorch's
 * memory_allocated beside memory_reserved. Not with the disk tier of offload, whose point is
 * the process's resident memory. */
static void reserve_cache(loom_fsdp *f) {
  /* the disk tier is there to cut the process's memory: cached blocks are resident */
  if (f->cfg.offload.enabled && f->cfg.offload.tier == LOOM_FSDP_TIER_DISK) return;
  size_t largest = 0;
  for (size_t u = 0; u < f->nunits; u++)
    if (f->units[u].padded > largest) largest = f->units[u].padded;
  int ahead = f->cfg.forward_prefetch > f->cfg.backward_prefetch ? f->cfg.forward_prefetch
                                                                 : f->cfg.backward_prefetch;
  size_t gathers = (size_t)ahead + 2, grads = f->cfg.limit_reduce_scatters ? 1 : 2;
  size_t el = loom_dtype_size(f->fwd_dtype);
  f->cache_reserved = gathers * (largest * el + (el != 4 ? largest / (size_t)f->world * el : 0)) +
                      grads * largest * sizeof(float);
  loom__mem_cache_reserve((ptrdiff_t)f->cache_reserved);
}

int loom_fsdp_create(loom_pg *pg, loom_module *module, const loom_fsdp_cfg *cfg,
                     loom_fsdp **out) {
  static const char *who = "loom_fsdp_create";
  if (out) *out = NULL;
  if (!pg || !module || !out)
    return loom__fail(LOOM_EINVAL, "%s: pg, module and out must not be NULL", who);
  loom_fsdp_cfg def;
  if (!cfg) {
    def = loom_fsdp_cfg_default();
    cfg = &def;
  }
  int rc = loom_fsdp_cfg_validate(cfg);
  if (rc || (rc = check_module(module))) return rc;
  loom_fsdp *f = loom__calloc(LOOM_POOL_META, 1, sizeof *f);
  if (!f) return loom__fail(LOOM_ENOMEM, "%s: out of memory", who);
  f->pg = pg;
  f->rank = loom_pg_rank(pg);
  f->world = loom_pg_size(pg);
  f->root = module;
  f->cfg = *cfg;
  f->sync = true;
  f->fwd_dtype = LOOM_F32;
  f->replica = cfg->replica_pg;
  f->replica_rank = f->replica ? loom_pg_rank(f->replica) : 0;
  if (cfg->wrap == LOOM_FSDP_WRAP_LIST) {
    f->unit_names = loom__calloc(LOOM_POOL_META, cfg->n_unit_names, sizeof *f->unit_names);
    if (!f->unit_names) rc = loom__fail(LOOM_ENOMEM, "%s: out of memory", who);
    for (size_t i = 0; i < cfg->n_unit_names && !rc; i++)
      if (!(f->unit_names[i] = loom__strdup(LOOM_POOL_META, cfg->unit_names[i])))
        rc = loom__fail(LOOM_ENOMEM, "%s: out of memory", who);
    f->cfg.unit_names = (const char *const *)f->unit_names;
  }
  if (!rc && cfg->mp.enabled && !(rc = loom_fsdp_mp_create(&cfg->mp, &f->mp)))
    f->fwd_dtype = cfg->mp.forward_dtype;
  if (!rc) rc = loom__fsdp_make_units(f);
  if (!rc) {
    f->order = loom__calloc(LOOM_POOL_META, f->nunits ? f->nunits : 1, sizeof *f->order);
    if (!f->order) rc = loom__fail(LOOM_ENOMEM, "%s: out of memory", who);
  }
  if (!rc) rc = check_peers(f);
  if (!rc && cfg->broadcast_params && module->arena[LOOM_F32]) {
    loom_tensor *a = module->arena[LOOM_F32];
    void *data = loom_tensor_data(a);
    rc = loom_pg_broadcast(pg, data, data, loom_tensor_numel(a), LOOM_F32, 0, NULL);
    if (!rc && f->replica) /* every copy from world rank 0's values */
      rc = loom_pg_broadcast(f->replica, data, data, loom_tensor_numel(a), LOOM_F32, 0, NULL);
  }
  if (!rc) rc = loom__fsdp_offload_init(f);
  if (!rc) rc = loom__fsdp_share_init(f); /* before the shards, which may live in its buffers */
  /* unit by unit, each parameter shard to the offload tier before the next is made: they never
   * all exist at once in the compute pool */
  for (size_t u = 0; u < f->nunits && !rc; u++)
    if (!(rc = make_shards(&f->units[u], f->rank))) rc = loom__fsdp_param_done(&f->units[u]);
  if (!rc) rc = make_segments(f);
  if (!rc) rc = loom__fsdp_install_hooks(f);
  if (rc) {
    loom_fsdp_free(f);
    return rc;
  }
  loom__module_release_arenas(module); /* from here on, the shards hold the model */
  module->deferred = false;
  module->sharded_by = f;               /* loom_adamw_create_for_module finds the shards */
  reserve_cache(f);
  for (size_t u = 0; u < f->nunits; u++) f->stats.shard_numel += f->units[u].shard;
  f->stats.units = f->nunits;
  *out = f;
  return LOOM_OK;
}

void loom_fsdp_free(loom_fsdp *f) {
  if (!f) return;
  (void)loom__fsdp_step_join(f); /* the optimizer's pass ends before what it uses goes */
  if (f->root && f->root->sharded_by == f) f->root->sharded_by = NULL;
  for (size_t u = 0; f->units && u < f->nunits; u++) {
    fsdp_unit *un = &f->units[u];
    (void)loom__fsdp_reap(un);
    if (un->full_grad) {
      for (size_t k = 0; k < un->nparams; k++)
        (void)loom__tensor_set_grad_f32(un->params[k].p->value, NULL);
      loom_tensor_free(un->full_grad);
    }
    (void)loom__fsdp_reshard(un);
    if (un->autocast_on) (void)loom_autocast_exit(&un->autocast);
  }
  loom__fsdp_offload_free(f); /* its transfers end before the buffers they use go */
  for (size_t u = 0; f->units && u < f->nunits; u++) {
    loom__fsdp_share_resident_free(&f->units[u]); /* NULLs param_shard if it was a slice */
    loom__free(f->units[u].param_shard);
    loom__free(f->units[u].grad_shard);
  }
  loom__fsdp_share_free(f); /* after every unit let go of its shared buffers */
  if (f->units) loom__fsdp_remove_hooks(f);
  if (f->cache_reserved) loom__mem_cache_reserve(-(ptrdiff_t)f->cache_reserved);
  for (size_t i = 0; f->seg_names && i < f->nunits; i++) loom__free(f->seg_names[i]);
  loom__free(f->seg_names);
  loom__free(f->segs);
  for (size_t i = 0; f->unit_names && i < f->cfg.n_unit_names; i++) loom__free(f->unit_names[i]);
  loom__free(f->unit_names);
  loom__free(f->order);
  loom_fsdp_mp_free(f->mp);
  loom__fsdp_free_units(f);
  loom__free(f);
}

/* ---- queries ------------------------------------------------------------------------------ */

size_t loom_fsdp_unit_count(const loom_fsdp *f) { return f ? f->nunits : 0; }

int loom_fsdp_unit_info_get(const loom_fsdp *f, size_t unit, loom_fsdp_unit_info *out) {
  if (!f || !out) return loom__fail(LOOM_EINVAL, "loom_fsdp_unit_info_get: fsdp or out is NULL");
  if (unit >= f->nunits)
    return loom__fail(LOOM_EINVAL, "loom_fsdp_unit_info_get: unit %zu out of range (%zu unit%s)",
                      unit, f->nunits, loom__fsdp_plural(f->nunits));
  const fsdp_unit *u = &f->units[unit];
  *out = (loom_fsdp_unit_info){u->name, u->nparams ? u->params[0].index : 0, u->nparams, u->numel,
                               u->padded, u->shard, (size_t)f->rank * u->shard,
                               u->state == UNIT_GATHERED, u->gathered_dtype};
  return LOOM_OK;
}

int loom_fsdp_segments(const loom_fsdp *f, const loom_param_seg **segs, size_t *n) {
  if (!f || !segs || !n) return loom__fail(LOOM_EINVAL, "loom_fsdp_segments: NULL argument");
  *segs = f->segs;
  *n = f->nunits;
  return LOOM_OK;
}

int loom_fsdp_any(loom_fsdp *f, bool local, bool *global) {
  if (!f || !global) return loom__fail(LOOM_EINVAL, "loom_fsdp_any: fsdp or global is NULL");
  int32_t v = local;
  int rc = loom_pg_allreduce(f->pg, &v, &v, 1, LOOM_I32, LOOM_MAX, NULL);
  if (!rc && f->replica) rc = loom_pg_allreduce(f->replica, &v, &v, 1, LOOM_I32, LOOM_MAX, NULL);
  *global = v != 0;
  return rc;
}

/* The local sum of squares of the gradient shards, as loom_grad_sumsq over one buffer per
 * unit: each unit in its own 16 double lanes, chunk by chunk when streamed (a chunk starts at
 * its offset's lane), folded at the unit's end; the units added in order. */
typedef struct sumsq_ctx {
  double lane[16];
  double sq;
} sumsq_ctx;

static int sumsq_chunk(void *ctx, fsdp_unit *u, size_t at, size_t n, float *k[OFF_KINDS]) {
  sumsq_ctx *c = ctx;
  loom__sumsq_add(c->lane, k[OFF_GRAD], n, at);
  if (at + n == u->shard) {
    c->sq += loom__sumsq_fold(c->lane);
    memset(c->lane, 0, sizeof c->lane);
  }
  return LOOM_OK;
}

static int scale_chunk(void *ctx, fsdp_unit *u, size_t at, size_t n, float *k[OFF_KINDS]) {
  (void)u;
  (void)at;
  loom_grad_buf b = {k[OFF_GRAD], n, LOOM_F32};
  return loom__grad_scale("loom_fsdp_clip_grad_norm", &b, 1, *(const float *)ctx);
}

/* The sum of every rank's `local`, the same bits on every rank: one all-gather of the doubles
 * (the process group reduces no f64), added in rank order. */
static int sum_over_ranks(loom_pg *pg, double local, double *sum) {
  int n = loom_pg_size(pg);
  double small[64], *all = small;
  if (n > 64) all = loom__malloc(LOOM_POOL_COMPUTE, (size_t)n * sizeof *all);
  if (!all) return loom__fail(LOOM_ENOMEM, "loom_fsdp_clip_grad_norm: out of memory");
  int rc = loom_pg_allgather(pg, &local, all, 1, LOOM_I64, NULL); /* 8 bytes, moved as bits */
  double s = 0.0;
  for (int r = 0; r < n && !rc; r++) s += all[r];
  if (all != small) loom__free(all);
  if (!rc) *sum = s;
  return rc;
}

int loom_fsdp_clip_grad_norm(loom_fsdp *f, double max_norm, bool error_if_nonfinite,
                             double *total_norm) {
  static const char *who = "loom_fsdp_clip_grad_norm";
  if (!f) return loom__fail(LOOM_EINVAL, "%s: fsdp is NULL", who);
  if (f->cfg.optim_in_backward)
    return loom__fail(LOOM_EMISUSE, "%s: optim_in_backward is on: backward steps each unit as "
                      "its gradient is reduced, before a norm of the whole gradient exists to "
                      "clip with; turn one of them off", who);
  int rc = loom__clip_check(who, max_norm);
  if (rc) return rc;
  sumsq_ctx c = {{0}, 0};
  unsigned g = 1u << OFF_GRAD;
  if ((rc = loom__fsdp_each(f, g, 0, sumsq_chunk, &c))) return rc;
  double sum = 0.0;
  if ((rc = sum_over_ranks(f->pg, c.sq, &sum))) return rc;
  double total = sqrt(sum);
  if (total_norm) *total_norm = total;
  float coef;
  if ((rc = loom__clip_coef(who, total, max_norm, error_if_nonfinite, &coef))) return rc;
  if (coef == 1.0f) return LOOM_OK; /* x 1 changes no value */
  return loom__fsdp_each(f, g, g, scale_chunk, &coef);
}

int loom_fsdp_stats_get(const loom_fsdp *f, loom_fsdp_stats *out) {
  if (!f || !out) return loom__fail(LOOM_EINVAL, "loom_fsdp_stats_get: fsdp or out is NULL");
  *out = f->stats;
  if (f->store) {
    loom__ostore_stats st;
    loom__ostore_get_stats(f->store, &st);
    out->offload_bytes = loom__ostore_bytes(f->store);
    out->offload_to_bytes = st.bytes_written;
    out->offload_from_bytes = st.bytes_read;
    out->offload_transfer_s = st.transfer_s;
    out->offload_wait_s = f->off_wait_s;
  }
  return LOOM_OK;
}
