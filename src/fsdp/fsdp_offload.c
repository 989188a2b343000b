/* fsdp_offload.c: the offloader of FSDP (the specification fsdp-cpu-offload's FSDPCpuOffloader and
 * FSDPPrefetchManager): its configuration, the store it keeps for the wrapper (offload_store.c:
 * the host or disk tier and the worker thread), and moving each unit's parameter shard, gradient
 * shard and optimizer state between the compute pool and that store, chunk by chunk, with the
 * is-offloaded state per unit and kind. The hooks (fsdp_gather.c, fsdp_hooks.c) call the
 * loom__fsdp_param_* / _grad_* entry points (the gradients' are fsdp_offload_grad.c's); the
 * optimizer step streams (fsdp_stream.c). The
 * configuration's default and rules are fsdp_offload_cfg.c's, reading the bytes where they are
 * (checkpoints) fsdp_offload_read.c's. */
#include "fsdp/fsdp_int.h"
#include "fsdp/offload_store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the unit's bytes of one kind ------------------------------------------------------- */

bool loom__fsdp_offloading(const loom_fsdp *f, int kind) {
  const loom_fsdp_offload_cfg *c = &f->cfg.offload;
  if (!f->store) return false;
  return kind == OFF_PARAM ? c->offload_parameters
         : kind == OFF_GRAD ? c->offload_gradients
                            : c->offload_optimizer_states;
}

size_t loom__fsdp_chunk_len(const fsdp_unit *u, size_t c) {
  size_t at = c * u->f->chunk;
  return u->shard - at < u->f->chunk ? u->shard - at : u->f->chunk;
}

size_t loom__fsdp_slot(const fsdp_unit *u, int kind, unsigned gen, size_t c) {
  return u->off.slot0 + ((size_t)gen * OFF_KINDS + (size_t)kind) * u->off.nchunks + c;
}

float *loom__fsdp_state_buf(loom_optim *opt, size_t unit, int k) {
  loom_optim_state st = {0};
  (void)loom_optim_state_at(opt, unit * loom_optim_state_per_segment(opt) + (size_t)k, &st);
  return st.data;
}

/* Copy the kind's buffer into the tier (current slot set), synchronously. */
static int put_all(fsdp_unit *u, int kind, const float *buf) {
  loom_fsdp *f = u->f;
  off_kind *k = &u->off.k[kind];
  int rc = LOOM_OK;
  for (size_t c = 0; c < u->off.nchunks && !rc; c++)
    rc = loom__ostore_put(f->store, loom__fsdp_slot(u, kind, k->gen, c), buf + c * f->chunk,
                          loom__fsdp_chunk_len(u, c) * sizeof(float));
  k->stored = rc == LOOM_OK;
  return rc;
}

#define READ_BATCH 32 /* chunks of one read_all in flight at once, at most */

/* Chunk c of a kind (OFF_LOW: the low-precision parameter copy): its slot, and the bytes of
 * the kind's elements. */
static size_t read_slot(const fsdp_unit *u, int kind, size_t c) {
  return kind == OFF_LOW ? loom__fsdp_low_slot(u, c)
                         : loom__fsdp_slot(u, kind, u->off.k[kind].gen, c);
}

static size_t elem_bytes(const fsdp_unit *u, int kind) {
  return kind == OFF_LOW ? loom_dtype_size(u->f->fwd_dtype) : sizeof(float);
}

/* Copy the kind's bytes (OFF_LOW too) from the tier into buf, synchronously, on any thread:
 * nothing of the wrapper is written (the store's calls lock). On the disk tier the chunks are
 * read by the store's workers, several at once (as many as it has), and this thread waits for
 * them all; a chunk whose job the rank's thread dropped meanwhile (loom_fsdp_prefetch_clear
 * while a gather reads on the progress thread) is read synchronously instead. */
static int read_all(fsdp_unit *u, int kind, void *buf) {
  loom_fsdp *f = u->f;
  size_t es = elem_bytes(u, kind);
  char *at = buf;
  int rc = LOOM_OK;
  if (loom__ostore_tier(f->store) != LOOM__OTIER_DISK) {
    for (size_t c = 0; c < u->off.nchunks && !rc; c++)
      rc = loom__ostore_get(f->store, read_slot(u, kind, c), at + c * f->chunk * es,
                            loom__fsdp_chunk_len(u, c) * es);
    return rc;
  }
  for (size_t c0 = 0; c0 < u->off.nchunks && !rc; c0 += READ_BATCH) {
    loom__ojob jobs[READ_BATCH] = {0};
    size_t n = u->off.nchunks - c0 < READ_BATCH ? u->off.nchunks - c0 : READ_BATCH;
    for (size_t c = c0; c < c0 + n && !rc; c++)
      rc = loom__ostore_submit_get(f->store, read_slot(u, kind, c), at + c * f->chunk * es,
                                   loom__fsdp_chunk_len(u, c) * es, &jobs[c - c0]);
    loom__fsdp_err e; /* the first failure, whichever job it was */
    loom__fsdp_err_save(&e, rc);
    for (size_t i = 0; i < n; i++) { /* every job submitted is waited for: buf is on loan */
      int rc2 = loom__ostore_wait(f->store, jobs[i], NULL);
      if (rc2 == LOOM_EABORTED && !e.rc) { /* dropped by the rank's clear: read it here */
        size_t c = c0 + i;
        rc2 = loom__ostore_get(f->store, read_slot(u, kind, c), at + c * f->chunk * es,
                               loom__fsdp_chunk_len(u, c) * es);
      }
      if (!e.rc && rc2) loom__fsdp_err_save(&e, rc2);
    }
    rc = loom__fsdp_err_restore(&e);
  }
  return rc;
}

/* read_all by the rank, the time counting as exposed. */
static int get_all(fsdp_unit *u, int kind, float *buf) {
  double t0 = loom__now();
  int rc = read_all(u, kind, buf);
  u->f->off_wait_s += loom__now() - t0;
  return rc;
}

/* Start the gets of every chunk into buf, on the worker. */
static int submit_gets(fsdp_unit *u, int kind, float *buf) {
  loom_fsdp *f = u->f;
  off_kind *k = &u->off.k[kind];
  int rc = LOOM_OK;
  for (size_t c = 0; c < u->off.nchunks && !rc; c++)
    rc = loom__ostore_submit_get(f->store, loom__fsdp_slot(u, kind, k->gen, c), buf + c * f->chunk,
                                 loom__fsdp_chunk_len(u, c) * sizeof(float), &k->jobs[c]);
  k->arriving = true;
  return rc;
}

/* Wait for the transfer in flight (gets or puts); the first failure, the time blocked counted
 * as exposed. */
static int wait_jobs(fsdp_unit *u, int kind) {
  loom_fsdp *f = u->f;
  off_kind *k = &u->off.k[kind];
  int rc = LOOM_OK;
  for (size_t c = 0; c < u->off.nchunks; c++) {
    double w = 0;
    int rc2 = loom__ostore_wait(f->store, k->jobs[c], &w);
    k->jobs[c] = 0;
    f->off_wait_s += w;
    if (!rc) rc = rc2;
  }
  k->arriving = k->leaving = false;
  return rc;
}

void loom__fsdp_free_buffer(fsdp_unit *u, int kind) {
  if (kind == OFF_PARAM) {
    loom__free(u->param_shard);
    u->param_shard = NULL;
  } else if (kind == OFF_GRAD) {
    loom__free(u->grad_shard);
    u->grad_shard = NULL;
  } else if (u->f->state_opt) { /* both state kinds go together */
    (void)loom_optim_release_state(u->f->state_opt, u->index);
  }
}

/* The gets in flight for a kind have ended: its bytes are in the compute pool (LOOM_OK), or
 * the buffer is gone again and the kind stays offloaded (the failure, naming it). */
int loom__fsdp_arrive(fsdp_unit *u, int kind) {
  off_kind *k = &u->off.k[kind];
  if (!k->arriving) return LOOM_OK;
  int rc = wait_jobs(u, kind);
  if (rc) {
    loom__fsdp_err e;
    loom__fsdp_err_save(&e, rc);
    if (kind >= OFF_STATE) /* the other state kind's gets were into the same buffers */
      for (int s = OFF_STATE; s < OFF_KINDS; s++) {
        (void)wait_jobs(u, s);
        u->off.k[s].offloaded = true;
      }
    loom__fsdp_free_buffer(u, kind);
    k->offloaded = true;
    return loom__fsdp_err_restore(&e);
  }
  k->offloaded = false;
  return LOOM_OK;
}

/* A transfer failed half-way through being queued (status rc): drop what is queued, wait for
 * what had started, free the kind's compute buffer (the state's: both kinds), and return rc
 * with its own message (the dropped jobs' waits set others). */
static int abandon(fsdp_unit *u, int kind, int rc) {
  loom__fsdp_err e;
  loom__fsdp_err_save(&e, rc);
  loom__ostore_clear(u->f->store);
  if (kind >= OFF_STATE)
    for (int s = OFF_STATE; s < OFF_KINDS; s++) (void)wait_jobs(u, s);
  else
    (void)wait_jobs(u, kind);
  loom__fsdp_free_buffer(u, kind);
  return loom__fsdp_err_restore(&e);
}

float *loom__fsdp_alloc_shard(fsdp_unit *u, const char *what) {
  float *p = loom__malloc(LOOM_POOL_COMPUTE, (u->shard ? u->shard : 1) * sizeof(float));
  if (!p)
    loom__fail(LOOM_ENOMEM, "fsdp offload: out of memory bringing back the %s shard of unit '%s' "
               "(%zu elements)", what, loom__fsdp_unit_shown(u->name), u->shard);
  return p;
}

/* ---- parameters ------------------------------------------------------------------------- */

int loom__fsdp_param_prefetch(fsdp_unit *u) {
  loom_fsdp *f = u->f;
  off_kind *k = &u->off.k[OFF_PARAM];
  if (!f->store || !k->offloaded || k->arriving || !f->cfg.offload.prefetch_parameters ||
      f->cfg.offload.prefetch_steps == 0)
    return LOOM_OK;
  int rc = loom__fsdp_step_ready(u, true); /* the last step's new bytes, once written */
  if (rc) return loom__fsdp_step_failed(f, rc);
  if (!(u->param_shard = loom__fsdp_alloc_shard(u, "parameter"))) return LOOM_ENOMEM;
  rc = submit_gets(u, OFF_PARAM, u->param_shard);
  return rc ? abandon(u, OFF_PARAM, rc) : LOOM_OK;
}

/* The tier's bytes are host memory the ranks can read where they are. */
static bool host_tier(const loom_fsdp *f) {
  return f->store && loom__ostore_tier(f->store) == LOOM__OTIER_HOST;
}

int loom__fsdp_param_ahead(fsdp_unit *u) {
  /* a gather that reads its part straight out of the tier (f32, the low-precision copy, the
   * host tier's buffers) needs no shard brought back ahead of it: that shard would be one more
   * in the compute pool, resident, and one more copy */
  if (loom__fsdp_param_readable(u, u->f->fwd_dtype)) return LOOM_OK;
  return loom__fsdp_param_prefetch(u);
}

int loom__fsdp_param_need(fsdp_unit *u) {
  loom_fsdp *f = u->f;
  off_kind *k = &u->off.k[OFF_PARAM];
  if (!f->store || !k->offloaded) return LOOM_OK;
  if (!k->arriving) {
    if (!(u->param_shard = loom__fsdp_alloc_shard(u, "parameter"))) return LOOM_ENOMEM;
    int rc = get_all(u, OFF_PARAM, u->param_shard);
    if (rc) {
      loom__fsdp_free_buffer(u, OFF_PARAM);
      return rc;
    }
    k->offloaded = false;
    return LOOM_OK;
  }
  return loom__fsdp_arrive(u, OFF_PARAM);
}

/* Cast the host tier's own buffers of the parameter shard into dst (dt), chunk by chunk, with
 * no copy in between: what a gather without offload casts from the shard. */
static int cast_from_host(fsdp_unit *u, void *dst, loom_dtype dt) {
  loom_fsdp *f = u->f;
  int rc = LOOM_OK;
  for (size_t c = 0; c < u->off.nchunks && !rc; c++) {
    size_t n = loom__fsdp_chunk_len(u, c);
    const float *src = loom__ostore_host_buffer(
        f->store, loom__fsdp_slot(u, OFF_PARAM, u->off.k[OFF_PARAM].gen, c), n * sizeof(float));
    if (!src)
      return loom__fail(LOOM_EINVAL, "fsdp offload: unit '%s' has no parameter chunk %zu in the "
                        "host tier", loom__fsdp_unit_shown(u->name), c);
    rc = loom_convert(src, LOOM_F32, (char *)dst + c * f->chunk * loom_dtype_size(dt), dt, n);
  }
  return rc;
}

bool loom__fsdp_param_readable(const fsdp_unit *u, loom_dtype dt) {
  const off_kind *k = &u->off.k[OFF_PARAM];
  if (!u->f->store || !k->offloaded || k->arriving) return false;
  return dt == LOOM_F32 || host_tier(u->f) || loom__fsdp_low_readable(u, dt);
}

int loom__fsdp_param_into(fsdp_unit *u, void *dst, loom_dtype dt) {
  if (dt != LOOM_F32 && loom__fsdp_low_readable(u, dt)) return read_all(u, OFF_LOW, dst);
  return dt == LOOM_F32 ? read_all(u, OFF_PARAM, dst) : cast_from_host(u, dst, dt);
}

int loom__fsdp_param_out(fsdp_unit *u) {
  off_kind *k = &u->off.k[OFF_PARAM];
  if (k->offloaded) return LOOM_OK;
  double t0 = loom__now();
  int rc = k->stored ? LOOM_OK : put_all(u, OFF_PARAM, u->param_shard);
  u->f->off_wait_s += loom__now() - t0;
  if (rc) return rc;
  loom__free(u->param_shard);
  u->param_shard = NULL;
  k->offloaded = true;
  return LOOM_OK;
}

int loom__fsdp_param_done(fsdp_unit *u) {
  return loom__fsdp_offloading(u->f, OFF_PARAM) ? loom__fsdp_param_out(u) : LOOM_OK;
}

/* ---- optimizer state -------------------------------------------------------------------- */

int loom__fsdp_check_optim(const loom_fsdp *f, const loom_optim *opt, const char *who) {
  if (!opt) return loom__fail(LOOM_EINVAL, "%s: optimizer is NULL", who);
  if (loom_optim_segments(opt) != f->nunits)
    return loom__fail(LOOM_EINVAL, "%s: the optimizer has %zu segments, this FSDP %zu unit%s: make "
                      "it from loom_fsdp_segments", who, loom_optim_segments(opt), f->nunits,
                      loom__fsdp_plural(f->nunits));
  size_t per = loom_optim_state_per_segment(opt);
  for (size_t u = 0; u < f->nunits && per; u++) {
    loom_optim_state st;
    int rc = loom_optim_state_at(opt, u * per, &st);
    if (rc) return rc;
    if (st.n != f->units[u].shard)
      return loom__fail(LOOM_EINVAL, "%s: optimizer segment %zu has %zu elements, unit '%s' %zu: "
                        "make it from loom_fsdp_segments", who, u, st.n,
                        loom__fsdp_unit_shown(f->units[u].name),
                        f->units[u].shard);
  }
  return LOOM_OK;
}

int loom__fsdp_state_out(fsdp_unit *u, loom_optim *opt) {
  size_t per = loom_optim_state_per_segment(opt);
  if (!per || loom_optim_state_released(opt, u->index)) return LOOM_OK;
  double t0 = loom__now();
  int rc = LOOM_OK;
  for (size_t s = 0; s < per && !rc; s++) {
    off_kind *k = &u->off.k[OFF_STATE + (int)s];
    if (!k->stored) rc = put_all(u, OFF_STATE + (int)s, loom__fsdp_state_buf(opt, u->index, (int)s));
  }
  u->f->off_wait_s += loom__now() - t0;
  if (rc) return rc;
  if ((rc = loom_optim_release_state(opt, u->index))) return rc;
  for (size_t s = 0; s < per; s++) u->off.k[OFF_STATE + (int)s].offloaded = true;
  return LOOM_OK;
}

/* Back into the optimizer's own buffers: asynchronously (then wait with state_wait) or now. */
static int state_in(fsdp_unit *u, loom_optim *opt, bool async) {
  size_t per = loom_optim_state_per_segment(opt);
  if (!per || !loom_optim_state_released(opt, u->index)) return LOOM_OK;
  int rc = loom_optim_restore_state(opt, u->index);
  if (rc) return rc;
  for (size_t s = 0; s < per && !rc; s++) {
    int kind = OFF_STATE + (int)s;
    float *buf = loom__fsdp_state_buf(opt, u->index, (int)s);
    if (!u->off.k[kind].stored) continue; /* never put: the restored zeros are its value */
    rc = async ? submit_gets(u, kind, buf) : get_all(u, kind, buf);
  }
  if (rc) {
    u->f->state_opt = opt;
    return abandon(u, OFF_STATE, rc);
  }
  if (async) u->f->state_opt = opt;
  for (size_t s = 0; s < per; s++) {
    off_kind *k = &u->off.k[OFF_STATE + (int)s];
    if (!k->arriving) k->offloaded = false;
  }
  return LOOM_OK;
}

static int state_wait(fsdp_unit *u) {
  int rc = LOOM_OK;
  for (int kind = OFF_STATE; kind < OFF_KINDS && !rc; kind++) rc = loom__fsdp_arrive(u, kind);
  return rc;
}

/* ---- create, free, everything in and out ------------------------------------------------ */

/* The store and each unit's chunk layout (before the shards exist). */
int loom__fsdp_offload_init(loom_fsdp *f) {
  const loom_fsdp_offload_cfg *c = &f->cfg.offload;
  if (!c->enabled) return LOOM_OK;
  f->chunk = c->chunk_bytes / sizeof(float);
  const char *ov = getenv("LOOM_FSDP_GRAD_OVERLAP"), *gf = getenv("LOOM_FSDP_GRAD_FIRST");
  f->grad_overlap = ov && !strcmp(ov, "1");
  f->grad_first = !(gf && !strcmp(gf, "0"));
  const char *as = getenv("LOOM_FSDP_ASYNC_STEP");
  f->async_step = as && (!strcmp(as, "0") || !strcmp(as, "1")) ? !strcmp(as, "1") : c->async_step;
  f->grad_leaving = SIZE_MAX;
  if (c->dir && !(f->offload_dir = loom__strdup(LOOM_POOL_META, c->dir)))
    return loom__fail(LOOM_ENOMEM, "fsdp offload: out of memory");
  f->cfg.offload.dir = f->offload_dir;
  int rc = loom__ostore_create(c->tier == LOOM_FSDP_TIER_DISK ? LOOM__OTIER_DISK : LOOM__OTIER_HOST,
                               f->offload_dir, f->rank, &f->store);
  if (!rc && c->io_threads) rc = loom__ostore_set_workers(f->store, c->io_threads);
  if (rc) return rc;
  size_t slot = 0;
  for (size_t i = 0; i < f->nunits; i++) {
    fsdp_unit *u = &f->units[i];
    u->off.nchunks = (u->shard + f->chunk - 1) / f->chunk;
    u->off.slot0 = slot;
    slot += (2 * OFF_KINDS + 1) * u->off.nchunks; /* and the low-precision copy's */
    for (int k = 0; k < OFF_KINDS; k++) {
      u->off.k[k].jobs = loom__calloc(LOOM_POOL_META, u->off.nchunks ? u->off.nchunks : 1,
                                      sizeof(uint64_t));
      if (!u->off.k[k].jobs) return loom__fail(LOOM_ENOMEM, "fsdp offload: out of memory");
    }
  }
  /* no gradient yet: nothing to keep (create makes no gradient shard when they are offloaded;
   * it offloads each parameter shard as it makes it) */
  for (size_t i = 0; i < f->nunits && c->offload_gradients; i++)
    f->units[i].off.k[OFF_GRAD].offloaded = true;
  return rc;
}

void loom__fsdp_offload_free(loom_fsdp *f) {
  if (f->store) {
    loom__ostore_clear(f->store);
    for (size_t i = 0; i < f->nunits; i++)
      for (int k = 0; k < OFF_KINDS; k++)
        if (f->units[i].off.k[k].jobs) (void)wait_jobs(&f->units[i], k);
    loom__ostore_free(f->store);
    f->store = NULL;
  }
  for (size_t i = 0; f->units && i < f->nunits; i++) {
    loom_tensor_free(f->units[i].off.grad_src);
    f->units[i].off.grad_src = NULL;
  }
  for (size_t i = 0; f->units && i < f->nunits; i++)
    for (int k = 0; k < OFF_KINDS; k++) {
      loom__free(f->units[i].off.k[k].jobs);
      f->units[i].off.k[k].jobs = NULL;
    }
  loom__free(f->offload_dir);
  f->offload_dir = NULL;
}

int loom__fsdp_onload_all(loom_fsdp *f, loom_optim *opt) {
  int rc = loom__fsdp_step_join(f);
  if (!rc && f->store) rc = loom__fsdp_settle_tier_reads(f);
  if (!rc && f->store) rc = loom__fsdp_grad_settle(f);
  for (size_t i = 0; f->store && i < f->nunits && !rc; i++) {
    fsdp_unit *u = &f->units[i];
    rc = loom__fsdp_param_need(u);
    if (!rc && opt && (rc = state_wait(u)) == LOOM_OK) rc = state_in(u, opt, false);
  }
  return rc;
}

int loom__fsdp_offload_all(loom_fsdp *f, loom_optim *opt, bool changed) {
  int rc = loom__fsdp_step_join(f);
  if (!rc && f->store) rc = loom__fsdp_settle_tier_reads(f);
  if (changed && f->store) loom__fsdp_low_drop(f); /* the f32 shards are new */
  for (size_t i = 0; f->store && i < f->nunits && !rc; i++) {
    fsdp_unit *u = &f->units[i];
    for (int k = 0; changed && k < OFF_KINDS; k++)
      if (k != OFF_GRAD && !u->off.k[k].offloaded) u->off.k[k].stored = false;
    if (loom__fsdp_offloading(f, OFF_PARAM)) rc = loom__fsdp_param_out(u);
    off_kind *g = &u->off.k[OFF_GRAD];
    if (!rc && loom__fsdp_offloading(f, OFF_GRAD) && !g->offloaded && u->grad_shard) {
      double t0 = loom__now();
      if (!g->stored) rc = put_all(u, OFF_GRAD, u->grad_shard);
      f->off_wait_s += loom__now() - t0;
      if (!rc) {
        loom__free(u->grad_shard);
        u->grad_shard = NULL;
        g->offloaded = true;
      }
    }
    if (!rc && opt && loom__fsdp_offloading(f, OFF_STATE)) rc = loom__fsdp_state_out(u, opt);
  }
  return rc;
}

/* ---- the public calls ------------------------------------------------------------------- */

static int unit_call(loom_fsdp *f, size_t unit, const char *who) {
  if (!f) return loom__fail(LOOM_EINVAL, "%s: fsdp is NULL", who);
  if (unit >= f->nunits)
    return loom__fail(LOOM_EINVAL, "%s: unit %zu out of range (%zu unit%s)", who, unit, f->nunits,
                      loom__fsdp_plural(f->nunits));
  if (f->in_step)
    return loom__fail(LOOM_EMISUSE, "%s: a backward is running (its hooks move the shards)", who);
  return loom__fsdp_step_join(f); /* the last optimizer step's pass may be moving them */
}

int loom_fsdp_offload_parameter(loom_fsdp *f, size_t unit) {
  int rc = unit_call(f, unit, "loom_fsdp_offload_parameter");
  if (rc || !loom__fsdp_offloading(f, OFF_PARAM)) return rc;
  fsdp_unit *u = &f->units[unit];
  if (u->state != UNIT_RESHARDED)
    return loom__fail(LOOM_EMISUSE, "loom_fsdp_offload_parameter: unit %zu ('%s') is gathered: "
                      "reshard it first", unit, loom__fsdp_unit_shown(u->name));
  if (u->off.k[OFF_PARAM].arriving && (rc = loom__fsdp_param_need(u))) return rc;
  return loom__fsdp_param_out(u);
}

int loom_fsdp_prefetch_parameter(loom_fsdp *f, size_t unit) {
  int rc = unit_call(f, unit, "loom_fsdp_prefetch_parameter");
  return rc ? rc : loom__fsdp_param_prefetch(&f->units[unit]);
}

int loom_fsdp_offload_gradient(loom_fsdp *f, size_t unit) {
  int rc = unit_call(f, unit, "loom_fsdp_offload_gradient");
  if (rc || !loom__fsdp_offloading(f, OFF_GRAD)) return rc;
  fsdp_unit *u = &f->units[unit];
  off_kind *k = &u->off.k[OFF_GRAD];
  if ((rc = loom__fsdp_arrive(u, OFF_GRAD))) return rc;
  if (k->offloaded || !u->grad_shard) return loom__fsdp_grad_settle(f);
  if (!k->stored && (rc = put_all(u, OFF_GRAD, u->grad_shard))) return rc;
  loom__free(u->grad_shard);
  u->grad_shard = NULL;
  k->offloaded = true;
  return LOOM_OK;
}

int loom_fsdp_prefetch_gradient(loom_fsdp *f, size_t unit) {
  int rc = unit_call(f, unit, "loom_fsdp_prefetch_gradient");
  if (rc || !f->store) return rc;
  fsdp_unit *u = &f->units[unit];
  off_kind *k = &u->off.k[OFF_GRAD];
  if (!f->cfg.offload.prefetch_gradients || f->cfg.offload.prefetch_steps == 0) return LOOM_OK;
  if ((rc = loom__fsdp_grad_settle(f))) return rc;
  if (!k->offloaded || k->arriving || !k->stored) return LOOM_OK; /* here, coming, or none yet */
  if (!(u->grad_shard = loom__fsdp_alloc_shard(u, "gradient"))) return LOOM_ENOMEM;
  rc = submit_gets(u, OFF_GRAD, u->grad_shard);
  return rc ? abandon(u, OFF_GRAD, rc) : LOOM_OK;
}

int loom_fsdp_offload_optimizer_state(loom_fsdp *f, loom_optim *opt, size_t unit) {
  static const char *who = "loom_fsdp_offload_optimizer_state";
  int rc = unit_call(f, unit, who);
  if (rc || !loom__fsdp_offloading(f, OFF_STATE)) return rc;
  if ((rc = loom__fsdp_check_optim(f, opt, who))) return rc;
  if ((rc = state_wait(&f->units[unit]))) return rc;
  return loom__fsdp_state_out(&f->units[unit], opt);
}

int loom_fsdp_prefetch_optimizer_state(loom_fsdp *f, loom_optim *opt, size_t unit) {
  static const char *who = "loom_fsdp_prefetch_optimizer_state";
  int rc = unit_call(f, unit, who);
  if (rc || !f->store) return rc;
  if ((rc = loom__fsdp_check_optim(f, opt, who))) return rc;
  if (!f->cfg.offload.prefetch_gradients || f->cfg.offload.prefetch_steps == 0) return LOOM_OK;
  return state_in(&f->units[unit], opt, true);
}

bool loom_fsdp_is_offloaded(const loom_fsdp *f, size_t unit, loom_fsdp_offload_kind kind) {
  if (!f || !f->store || unit >= f->nunits) return false;
  const off_unit *o = &f->units[unit].off;
  switch (kind) {
  case LOOM_FSDP_OFFLOAD_PARAMS: return o->k[OFF_PARAM].offloaded;
  case LOOM_FSDP_OFFLOAD_GRADS: return o->k[OFF_GRAD].offloaded;
  case LOOM_FSDP_OFFLOAD_OPTIM: return o->k[OFF_STATE].offloaded;
  }
  return false;
}

int loom_fsdp_schedule_prefetch(loom_fsdp *f, const size_t *units, size_t n, bool forward) {
  static const char *who = "loom_fsdp_schedule_prefetch";
  if (!f || (n && !units)) return loom__fail(LOOM_EINVAL, "%s: NULL argument", who);
  int rc = LOOM_OK;
  for (size_t i = 0; i < n && !rc; i++)
    rc = forward ? loom_fsdp_prefetch_parameter(f, units[i]) : loom_fsdp_prefetch_gradient(f, units[i]);
  return rc;
}

int loom_fsdp_prefetch_wait(loom_fsdp *f) {
  if (!f) return loom__fail(LOOM_EINVAL, "loom_fsdp_prefetch_wait: fsdp is NULL");
  int rc = loom__fsdp_step_join(f);
  for (size_t i = 0; f->store && i < f->nunits; i++) {
    fsdp_unit *u = &f->units[i];
    for (int k = 0; k < OFF_KINDS; k++) {
      int rc2 = loom__fsdp_arrive(u, k);
      if (!rc) rc = rc2;
    }
  }
  return rc;
}

void loom_fsdp_prefetch_clear(loom_fsdp *f) {
  if (!f || !f->store) return;
  loom__ostore_clear(f->store);
  /* what was cleared did not arrive (its wait says LOOM_EABORTED): those units stay offloaded;
   * what had arrived already stays */
  for (size_t i = 0; i < f->nunits; i++)
    for (int k = 0; k < OFF_KINDS; k++) (void)loom__fsdp_arrive(&f->units[i], k);
}
