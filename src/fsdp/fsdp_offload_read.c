/* fsdp_offload_read.c: reading the offloaded bytes where they are, for checkpoints: every
 * transfer settled (loom__fsdp_settle_all), a kind's compute-pool buffer when it has one
 * (loom__fsdp_resident), and a reader of a kind's bytes out of the tier through one shared chunk
 * buffer (loom__fsdp_read_bytes). The offloader is fsdp_offload.c. */
#include "fsdp/fsdp_int.h"
#include "fsdp/offload_store.h"

#include <string.h>

/* ---- reading the bytes where they are (checkpoints) ------------------------------------ */

int loom__fsdp_settle_all(loom_fsdp *f) {
  int rc = f->store ? loom__fsdp_grad_settle(f) : LOOM_OK;
  for (size_t i = 0; f->store && i < f->nunits; i++)
    for (int k = 0; k < OFF_KINDS; k++) {
      int rc2 = loom__fsdp_arrive(&f->units[i], k);
      if (!rc) rc = rc2;
    }
  return rc;
}

float *loom__fsdp_resident(fsdp_unit *u, int kind, loom_optim *opt) {
  if (kind == OFF_PARAM) return u->off.k[OFF_PARAM].offloaded && u->f->store ? NULL : u->param_shard;
  if (kind == OFF_GRAD) return u->off.k[OFF_GRAD].offloaded && u->f->store ? NULL : u->grad_shard;
  return opt ? loom__fsdp_state_buf(opt, u->index, kind - OFF_STATE) : NULL;
}

int loom__fsdp_read_bytes(void *ctx, size_t offset, void *dst, size_t bytes) {
  loom__fsdp_reader *r = ctx;
  fsdp_unit *u = r->u;
  loom_fsdp *f = u->f;
  size_t at = offset / sizeof(float), n = bytes / sizeof(float);
  float *out = dst;
  while (n) {
    size_t c = at / f->chunk, in = at - c * f->chunk, len = loom__fsdp_chunk_len(u, c);
    size_t take = len - in < n ? len - in : n;
    if (r->shared->unit != u->index || r->shared->kind != r->kind || r->shared->chunk != c) {
      int rc = loom__ostore_get(f->store, loom__fsdp_slot(u, r->kind, u->off.k[r->kind].gen, c),
                                r->shared->buf, len * sizeof(float));
      r->shared->unit = SIZE_MAX; /* nothing cached unless the get succeeded */
      if (rc) return rc;
      r->shared->unit = u->index, r->shared->kind = r->kind, r->shared->chunk = c;
    }
    if (!loom__dry()) memcpy(out, r->shared->buf + in, take * sizeof(float));
    out += take, at += take, n -= take;
  }
  return LOOM_OK;
}

