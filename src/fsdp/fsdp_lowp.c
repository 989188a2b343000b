/* fsdp_lowp.c: the low-precision copy of each parameter shard in the offload tier
 * (cfg.offload.low_precision_params). With a f16 / bf16 forward every gather casts the f32
 * shard to the forward dtype, twice a step (forward and backward); the tier then moves the f32
 * shard out twice and the cast runs twice. Instead, the pass that rewrites the f32 shard (the
 * optimizer step, a load: fsdp_stream.c) also writes the shard cast to the forward dtype, chunk
 * by chunk, into slots of its own, and the gathers read those (fsdp_offload.c,
 * loom__fsdp_param_into): half the bytes, cast once per step, the same bits (the cast is the
 * one the gather would make of the same f32 values). The copy has one slot set: a pass that
 * rewrites it marks every unit's copy stale first and current only once every chunk has
 * succeeded, so a failed pass leaves the gathers on the f32 shard (the optimizer's pass behind
 * the next forward, fsdp_async.c, marks it current at once, a gather of a unit reading it only
 * once the unit is stepped, and stale again if the pass fails). Anything else that rewrites
 * the f32 shard (loom__fsdp_offload_all with `changed`) drops the copy the same way. */
#include "fsdp/fsdp_int.h"
#include "fsdp/offload_store.h"

bool loom__fsdp_low_on(const loom_fsdp *f) {
  return f->mp && f->fwd_dtype != LOOM_F32 && f->cfg.offload.low_precision_params &&
         loom__fsdp_offloading(f, OFF_PARAM);
}

bool loom__fsdp_low_readable(const fsdp_unit *u, loom_dtype dt) {
  return u->off.low_ok && dt == u->f->fwd_dtype && loom__fsdp_low_on(u->f);
}

size_t loom__fsdp_low_slot(const fsdp_unit *u, size_t c) {
  return u->off.slot0 + 2 * (size_t)OFF_KINDS * u->off.nchunks + c;
}

int loom__fsdp_low_put(fsdp_unit *u, size_t c, const float *src, size_t n, void *scratch,
                       unsigned flags, uint64_t *job) {
  loom_fsdp *f = u->f;
  loom_dtype dt = f->fwd_dtype;
  size_t bytes = n * loom_dtype_size(dt), slot = loom__fsdp_low_slot(u, c);
  *job = 0;
  void *host = loom__ostore_host_buffer(f->store, slot, bytes);
  if (host) return loom_convert(src, LOOM_F32, host, dt, n); /* where it lives: no copy */
  if (scratch) {
    int rc = loom_convert(src, LOOM_F32, scratch, dt, n);
    return rc ? rc : loom__ostore_submit_put_ex(f->store, slot, scratch, bytes, flags, job);
  }
  /* the host tier's first put of the slot: through a buffer of its own, once */
  void *tmp = loom__malloc(LOOM_POOL_COMPUTE, bytes ? bytes : 1);
  if (!tmp)
    return loom__fail(LOOM_ENOMEM, "fsdp offload: out of memory for a %zu-byte low-precision "
                      "parameter chunk", bytes);
  int rc = loom_convert(src, LOOM_F32, tmp, dt, n);
  if (!rc) rc = loom__ostore_put(f->store, slot, tmp, bytes);
  loom__free(tmp);
  return rc;
}

void loom__fsdp_low_drop(loom_fsdp *f) {
  for (size_t i = 0; i < f->nunits; i++) f->units[i].off.low_ok = false;
}
