/* fsdp_gather.c: a unit's parameters in and out of existence. Gathering casts this rank's f32
 * shard to the wanted dtype (so a low-precision forward moves half the bytes), all-gathers it
 * asynchronously into one buffer of the unit's padded length, and, once that completes, points
 * every parameter of the unit at its offset in the buffer (on the threads backend one buffer
 * shared by the ranks, each copying only its part: fsdp_share.c). With the shard offloaded, this
 * rank's part is read (or cast) straight out of the tier, with prefetch as the all-gather's
 * first step on the group's progress thread. Resharding points them at nothing and frees the
 * buffer. */
#include "fsdp/fsdp_int.h"
#include "dist/prepared.h"

#include <string.h>

int loom__fsdp_bind_params(fsdp_unit *u) {
  for (size_t i = 0; i < u->nparams; i++)
    loom__tensor_rebind(u->params[i].p->value, u->gathered, u->params[i].offset, LOOM_F32);
  return LOOM_OK;
}

static void unbind_params(fsdp_unit *u) {
  for (size_t i = 0; i < u->nparams; i++)
    loom__tensor_rebind(u->params[i].p->value, NULL, 0, LOOM_F32);
}

static void drop_buffers(fsdp_unit *u) {
  loom__fsdp_free_gathered(u);
  u->state = UNIT_RESHARDED;
}

static void *own_part(const fsdp_unit *u, loom_dtype dt) {
  size_t at = (size_t)u->f->rank * u->shard * loom_dtype_size(dt);
  return (char *)loom_tensor_data(u->gathered) + at;
}

/* The all-gather's first step when this rank's part comes straight out of the offload tier: run
 * on the group's progress thread, so the read overlaps the rank's compute until it waits for
 * the unit (loom__fsdp_wait_gather counts only the part of the read it waited for as exposed). */
static int read_own_part(void *ctx) {
  fsdp_unit *u = ctx;
  u->read_begin = loom__now();
  int rc = loom__fsdp_param_into(u, own_part(u, u->gathered_dtype), u->gathered_dtype);
  u->read_end = loom__now();
  return rc;
}

/* This rank's part of the gathered buffer, written in place (the all-gather then sends from
 * it): cast into it under mixed precision, or copied (cast) into it from a prefetched shard;
 * NULL for plain f32 without offload, which sends the shard itself. Either way the parameter
 * shard need not outlive the issue (offload: it leaves at once). A part read straight from the
 * offload tier is read now, by the rank, with prefetch off, and with it on is left to the
 * all-gather's first step (read_own_part). */
static int fill_own_part(fsdp_unit *u, loom_dtype dt, void **own) {
  loom_fsdp *f = u->f;
  const loom_fsdp_offload_cfg *c = &f->cfg.offload;
  *own = own_part(u, dt);
  u->reads_tier = false;
  /* the last optimizer step's pass may still be writing the unit (fsdp_async.c): the gather
   * reads its new bytes, and a pass that failed fails it here, before any collective */
  int rc = loom__fsdp_step_ready(u, true);
  if (rc) return rc;
  bool deferred = loom__fsdp_param_readable(u, dt) && c->prefetch_parameters && c->prefetch_steps > 0;
  if (dt == LOOM_F32 && !loom__fsdp_offloading(f, OFF_PARAM)) {
    *own = NULL;
    return loom__fsdp_param_need(u);
  }
  u->read_begin = u->read_end = 0;
  if (deferred) {
    u->reads_tier = true;
    return LOOM_OK;
  }
  if (loom__fsdp_param_readable(u, dt)) {
    double t0 = loom__now(); /* no prefetch: read now, by the rank, all of it exposed */
    rc = loom__fsdp_param_into(u, *own, dt);
    f->off_wait_s += loom__now() - t0;
    return rc;
  }
  rc = loom__fsdp_param_need(u);
  if (rc) return rc;
  if (loom__dry()) { /* nothing to copy */
  } else if (dt == LOOM_F32) memcpy(*own, u->param_shard, u->shard * sizeof(float));
  else if ((rc = loom_convert(u->param_shard, LOOM_F32, *own, dt, u->shard))) return rc;
  return loom__fsdp_param_done(u);
}

int loom__fsdp_issue_gather(fsdp_unit *u, loom_dtype dt) {
  loom_fsdp *f = u->f;
  if (u->state != UNIT_RESHARDED) {
    if (u->gathered_dtype == dt) return LOOM_OK;
    int rc = loom__fsdp_reshard(u);
    if (rc) return rc;
  }
  int64_t len = (int64_t)u->padded;
  int rc = loom__fsdp_shares(u, dt) ? loom__fsdp_share_buffer(u, dt, &u->gathered)
                                    : loom_tensor_empty(dt, 1, &len, &u->gathered);
  if (rc) return rc;
  void *own = NULL;
  if ((rc = fill_own_part(u, dt, &own))) {
    drop_buffers(u);
    return loom__fsdp_step_failed(f, rc);
  }
  u->gathered_dtype = dt;
  u->gather_issued = loom__now();
  rc = loom__pg_allgather_prepared(f->pg, own ? own : u->param_shard,
                                   loom_tensor_data(u->gathered), u->shard, dt,
                                   u->reads_tier ? read_own_part : NULL, u, &u->gather_work);
  if (rc) {
    drop_buffers(u);
    return rc;
  }
  u->state = UNIT_GATHERING;
  if (u->reads_tier) f->stats.offload_gathers_overlapped++;
  f->stats.gathers++;
  f->stats.gather_bytes += (uint64_t)(u->padded * loom_dtype_size(dt));
  return LOOM_OK;
}

/* The seconds of [t0, t1] the rank spent waiting while its part was being read from the tier. */
static double read_waited(const fsdp_unit *u, double t0, double t1) {
  if (!u->reads_tier) return 0;
  double a = t0 > u->read_begin ? t0 : u->read_begin, b = t1 < u->read_end ? t1 : u->read_end;
  return b > a ? b - a : 0;
}

int loom__fsdp_wait_gather(fsdp_unit *u) {
  if (u->state != UNIT_GATHERING) return u->state == UNIT_GATHERED ? LOOM_OK : LOOM_EMISUSE;
  loom_fsdp *f = u->f;
  double t0 = loom__now();
  int rc = loom_work_wait(&u->gather_work);
  double t1 = loom__now();
  f->stats.exposed_s += t1 - t0;
  f->stats.exposed_gather_s += t1 - t0;
  f->stats.comm_s += t1 - u->gather_issued;
  f->off_wait_s += read_waited(u, t0, t1);
  if (rc) {
    drop_buffers(u);
    return loom__fsdp_step_failed(f, rc);
  }
  u->state = UNIT_GATHERED;
  if ((rc = loom__fsdp_param_done(u))) return rc;
  return loom__fsdp_bind_params(u);
}

int loom__fsdp_reshard(fsdp_unit *u) {
  int rc = LOOM_OK;
  if (u->state == UNIT_GATHERING) {
    rc = loom_work_wait(&u->gather_work);
    u->state = UNIT_RESHARDED; /* the all-gather has let go of the shard */
    int rc2 = loom__fsdp_param_done(u);
    if (!rc) rc = rc2;
  }
  if (u->state == UNIT_GATHERED) unbind_params(u);
  drop_buffers(u);
  return rc;
}

int loom__fsdp_settle_tier_reads(loom_fsdp *f) {
  int rc = LOOM_OK;
  for (size_t i = 0; i < f->nunits; i++) {
    fsdp_unit *u = &f->units[i];
    if (u->state != UNIT_GATHERING || !u->reads_tier) continue;
    int rc2 = loom__fsdp_reshard(u);
    if (!rc) rc = rc2;
  }
  return rc;
}

/* ---- the public calls ------------------------------------------------------------------- */

static int unit_arg(const loom_fsdp *f, size_t unit, const char *who) {
  if (!f) return loom__fail(LOOM_EINVAL, "%s: fsdp is NULL", who);
  if (unit >= f->nunits)
    return loom__fail(LOOM_EINVAL, "%s: unit %zu out of range (%zu unit%s)", who, unit, f->nunits,
                      loom__fsdp_plural(f->nunits));
  return LOOM_OK;
}

int loom_fsdp_gather_unit(loom_fsdp *f, size_t unit, loom_dtype dt) {
  int rc = unit_arg(f, unit, "loom_fsdp_gather_unit");
  if (rc) return rc;
  if (!loom_dtype_is_float(dt))
    return loom__fail(LOOM_EDTYPE, "loom_fsdp_gather_unit: dtype must be f32, f16 or bf16, not %s",
                      loom_dtype_name(dt));
  fsdp_unit *u = &f->units[unit];
  if ((rc = loom__fsdp_issue_gather(u, dt))) return rc;
  return loom__fsdp_wait_gather(u);
}

int loom_fsdp_reshard_unit(loom_fsdp *f, size_t unit) {
  int rc = unit_arg(f, unit, "loom_fsdp_reshard_unit");
  return rc ? rc : loom__fsdp_reshard(&f->units[unit]);
}

int loom_fsdp_apply_mixed_precision(loom_fsdp *f, size_t unit) {
  static const char *who = "loom_fsdp_apply_mixed_precision";
  int rc = unit_arg(f, unit, who);
  if (rc) return rc;
  fsdp_unit *u = &f->units[unit];
  if (u->state == UNIT_GATHERING && (rc = loom__fsdp_wait_gather(u))) return rc;
  if (u->state != UNIT_GATHERED)
    return loom__fail(LOOM_EMISUSE, "%s: unit %zu ('%s') must be gathered first", who, unit,
                      loom__fsdp_unit_shown(u->name));
  if (!f->mp) return LOOM_OK;
  loom_tensor *low = NULL;
  if ((rc = loom_fsdp_mp_convert_to_mixed_precision(f->mp, u->gathered, &low))) return rc;
  loom_tensor_free(u->gathered);
  u->gathered = low;
  u->gathered_dtype = loom_tensor_dtype(low);
  return loom__fsdp_bind_params(u);
}
