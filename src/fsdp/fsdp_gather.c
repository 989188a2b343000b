/* fsdp_gather.c: a unit's parameters in and out of existence. Gathering casts this rank's f32
 * shard to the wanted dtype (so a low-precision forward moves half the bytes), all-gathers it
 * asynchronously into one buffer of the unit's padded length, and, once that completes, points
 * every parameter of the unit at its offset in the buffer. Resharding points them at nothing
 * and frees the buffer. */
#include "fsdp/fsdp_int.h"

#include <string.h>
#include <time.h>

double loom__fsdp_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

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
  loom_tensor_free(u->gathered);
  u->gathered = NULL;
  u->state = UNIT_RESHARDED;
}

/* This rank's part of the gathered buffer, written in place (the all-gather then sends from
 * it): cast into it under mixed precision, read (or cast) into it from the offload tier, or
 * copied (cast) into it from a prefetched shard; NULL for plain f32 without offload, which sends
 * the shard itself. Either way the parameter shard need not outlive the issue (offload: it
 * leaves at once). */
static int fill_own_part(fsdp_unit *u, loom_dtype dt, void **own) {
  loom_fsdp *f = u->f;
  *own = (char *)loom_tensor_data(u->gathered) + (size_t)f->rank * u->shard * loom_dtype_size(dt);
  bool offloading = loom__fsdp_offloading(f, OFF_PARAM);
  if (dt == LOOM_F32 && !offloading) {
    *own = NULL;
    return loom__fsdp_param_need(u);
  }
  bool read = false;
  int rc = loom__fsdp_param_into(u, *own, dt, &read);
  if (rc || read) return rc;
  if ((rc = loom__fsdp_param_need(u))) return rc;
  if (dt == LOOM_F32) memcpy(*own, u->param_shard, u->shard * sizeof(float));
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
  int rc = loom_tensor_empty(dt, 1, &len, &u->gathered);
  if (rc) return rc;
  void *own = NULL;
  if ((rc = fill_own_part(u, dt, &own))) {
    drop_buffers(u);
    return rc;
  }
  u->gather_issued = loom__fsdp_now();
  rc = loom_pg_allgather(f->pg, own ? own : u->param_shard, loom_tensor_data(u->gathered),
                         u->shard, dt, &u->gather_work);
  if (rc) {
    drop_buffers(u);
    return rc;
  }
  u->state = UNIT_GATHERING;
  u->gathered_dtype = dt;
  f->stats.gathers++;
  f->stats.gather_bytes += (uint64_t)(u->padded * loom_dtype_size(dt));
  return LOOM_OK;
}

int loom__fsdp_wait_gather(fsdp_unit *u) {
  if (u->state != UNIT_GATHERING) return u->state == UNIT_GATHERED ? LOOM_OK : LOOM_EMISUSE;
  loom_fsdp *f = u->f;
  double t0 = loom__fsdp_now();
  int rc = loom_work_wait(&u->gather_work);
  double t1 = loom__fsdp_now();
  f->stats.exposed_s += t1 - t0;
  f->stats.comm_s += t1 - u->gather_issued;
  if (rc) {
    drop_buffers(u);
    return rc;
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

/* ---- the public calls ------------------------------------------------------------------- */

static int unit_arg(const loom_fsdp *f, size_t unit, const char *who) {
  if (!f) return loom__fail(LOOM_EINVAL, "%s: fsdp is NULL", who);
  if (unit >= f->nunits)
    return loom__fail(LOOM_EINVAL, "%s: unit %zu out of range (%zu units)", who, unit, f->nunits);
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
                      u->name);
  if (!f->mp) return LOOM_OK;
  loom_tensor *low = NULL;
  if ((rc = loom_fsdp_mp_convert_to_mixed_precision(f->mp, u->gathered, &low))) return rc;
  loom_tensor_free(u->gathered);
  u->gathered = low;
  u->gathered_dtype = loom_tensor_dtype(low);
  return loom__fsdp_bind_params(u);
}
