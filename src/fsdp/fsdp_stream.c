/* fsdp_stream.c: passes over every unit's shards chunk by chunk, for work that touches all of a
 * rank's training state at once while it lives in the offload tier: the optimizer step
 * (loom_fsdp_optim_step), the overflow check's unscale, clipping's norm and scale. Kinds in the
 * compute pool are used in place; offloaded ones stream through a ring of chunk buffers: with
 * prefetch on, three sets, so chunk k+1 is read and chunk k-1 written while chunk k is worked on
 * (the worker does one transfer at a time, in order); with it off, one set, synchronously. The
 * compute pool never holds more than the ring of any offloaded kind.
 *
 * On the host tier the pass works on the tier's own buffers where they are, with no copy: the
 * optimizer step runs on the host, as ZeRO-Offload's CPU Adam does (in a device build the step
 * would run on the CPU there too); only what is not stored yet (a gradient no backward has
 * made) goes through a chunk buffer.
 *
 * On the disk tier a pass that writes parameters or optimizer state writes them to the unit's
 * other slot set and switches only once every chunk has succeeded: a read that fails half-way
 * (a file changed behind loom's back) leaves the tier's weights and state as they were.
 *
 * A pass that writes parameters with a low-precision copy on (fsdp_lowp.c) also casts each
 * chunk, once final, to the forward dtype and writes it to the copy's slots (a ring buffer of
 * its own on the disk tier, in place on the host tier). */
#include "fsdp/fsdp_int.h"
#include "fsdp/offload_store.h"

#include <string.h>

#define RING 3

typedef struct ring_set {
  float *buf[OFF_KINDS];
  uint64_t get[OFF_KINDS], put[OFF_KINDS];
  void *low;        /* disk tier: the chunk cast to the forward dtype on its way out */
  uint64_t low_put;
} ring_set;

typedef struct stream {
  loom_fsdp *f;
  loom_optim *opt;
  unsigned read, write;
  bool low;         /* the pass rewrites the parameters: their low-precision copy too */
  size_t u0, u1;    /* the units passed over: [u0, u1) */
  float *grad;      /* one unit's gradient where it was reduced (optimizer in backward), or
                       NULL: the gradient shard */
  size_t nsets;
  ring_set set[RING];
  size_t *unit_of, *chunk_of; /* items: (unit, chunk) in order */
  size_t nitems;
} stream;

static bool kind_offloaded(const stream *s, const fsdp_unit *u, int kind) {
  if (!s->f->store) return false;
  if (kind >= OFF_STATE)
    return s->opt && loom_optim_state_released(s->opt, u->index);
  return u->off.k[kind].offloaded;
}

/* The host tier's bytes of a stored kind, worked on where they are (no copy); NULL otherwise. */
static float *in_host(const stream *s, const fsdp_unit *u, int kind, size_t c) {
  if (!u->off.k[kind].stored) return NULL;
  return loom__ostore_host_buffer(s->f->store, loom__fsdp_slot(u, kind, u->off.k[kind].gen, c),
                                  loom__fsdp_chunk_len(u, c) * sizeof(float));
}

static unsigned write_gen(const stream *s, const fsdp_unit *u, int kind) {
  bool shadow = loom__ostore_tier(s->f->store) == LOOM__OTIER_DISK && kind != OFF_GRAD;
  return u->off.k[kind].gen ^ (shadow ? 1u : 0u);
}

static int wait_one(stream *s, uint64_t *job, int rc) {
  double w = 0;
  int rc2 = loom__ostore_wait(s->f->store, *job, &w);
  *job = 0;
  s->f->off_wait_s += w;
  return rc ? rc : rc2;
}

static int wait_set(stream *s, ring_set *r, bool gets, bool puts) {
  int rc = LOOM_OK;
  for (int k = 0; k < OFF_KINDS; k++) {
    if (gets && r->get[k]) rc = wait_one(s, &r->get[k], rc);
    if (puts && r->put[k]) rc = wait_one(s, &r->put[k], rc);
  }
  if (puts && r->low_put) rc = wait_one(s, &r->low_put, rc);
  return rc;
}

static float *resident(stream *s, fsdp_unit *u, int kind) {
  if (kind == OFF_PARAM) return u->param_shard;
  if (kind == OFF_GRAD) return s->grad ? s->grad : u->grad_shard;
  return loom__fsdp_state_buf(s->opt, u->index, kind - OFF_STATE);
}

/* Start reading item i into its ring set (after the writes that last used the set). */
static int issue_reads(stream *s, size_t i) {
  ring_set *r = &s->set[i % s->nsets];
  int rc = wait_set(s, r, false, true);
  fsdp_unit *u = &s->f->units[s->unit_of[i]];
  size_t c = s->chunk_of[i], n = loom__fsdp_chunk_len(u, c);
  for (int k = 0; k < OFF_KINDS && !rc; k++) {
    if (!(s->read & (1u << k)) || !kind_offloaded(s, u, k) || in_host(s, u, k, c)) continue;
    if (!u->off.k[k].stored) { /* a gradient no backward has made yet; zero state */
      if (!loom__dry()) memset(r->buf[k], 0, n * sizeof(float));
      continue;
    }
    rc = loom__ostore_submit_get(s->f->store, loom__fsdp_slot(u, k, u->off.k[k].gen, c), r->buf[k],
                                 n * sizeof(float), &r->get[k]);
  }
  return rc;
}

static int work_on(stream *s, size_t i, loom__fsdp_chunk_fn fn, void *ctx) {
  ring_set *r = &s->set[i % s->nsets];
  int rc = wait_set(s, r, true, false);
  if (rc) return rc;
  fsdp_unit *u = &s->f->units[s->unit_of[i]];
  size_t c = s->chunk_of[i], at = c * s->f->chunk, n = loom__fsdp_chunk_len(u, c);
  float *k_ptr[OFF_KINDS] = {0};
  for (int k = 0; k < OFF_KINDS; k++) {
    if (!((s->read | s->write) & (1u << k))) continue;
    if (k >= OFF_STATE && (!s->opt || (size_t)(k - OFF_STATE) >= loom_optim_state_per_segment(s->opt)))
      continue;
    float *host = kind_offloaded(s, u, k) ? in_host(s, u, k, c) : NULL;
    k_ptr[k] = host ? host : kind_offloaded(s, u, k) ? r->buf[k] : resident(s, u, k) + at;
  }
  if ((rc = fn(ctx, u, at, n, k_ptr))) return rc;
  if (s->low && k_ptr[OFF_PARAM]) /* after the f32 values are final: cast once, out */
    rc = loom__fsdp_low_put(u, c, k_ptr[OFF_PARAM], n, r->low, &r->low_put);
  for (int k = 0; k < OFF_KINDS && !rc; k++) {
    if (!(s->write & (1u << k)) || !k_ptr[k] || !kind_offloaded(s, u, k) || k_ptr[k] != r->buf[k])
      continue;
    rc = loom__ostore_submit_put(s->f->store, loom__fsdp_slot(u, k, write_gen(s, u, k), c), r->buf[k],
                                 n * sizeof(float), &r->put[k]);
  }
  if (!rc && s->nsets == 1) rc = wait_set(s, r, false, true);
  return rc;
}

static void stream_free(stream *s) {
  loom__ostore_clear(s->f->store);
  for (size_t i = 0; i < s->nsets; i++) {
    (void)wait_set(s, &s->set[i], true, true);
    for (int k = 0; k < OFF_KINDS; k++) loom__free(s->set[i].buf[k]);
    loom__free(s->set[i].low);
  }
  loom__free(s->unit_of);
  loom__free(s->chunk_of);
}

/* The pass over units [u0, u1) (every unit, or the one a backward steps: its gather is done,
 * and the other units' gathers read nothing of its slots). */
static int stream_units(loom_fsdp *f, loom_optim *opt, size_t u0, size_t u1, float *grad,
                        unsigned read, unsigned write, loom__fsdp_chunk_fn fn, void *ctx) {
  stream s = {.f = f, .opt = opt, .read = read, .write = write, .u0 = u0, .u1 = u1, .grad = grad};
  const loom_fsdp_offload_cfg *c = &f->cfg.offload;
  if (!f->store) return loom__fail(LOOM_EMISUSE, "fsdp: a streamed pass without offload");
  s.nsets = c->prefetch_gradients && c->prefetch_steps > 0 ? RING : 1;
  int rc = LOOM_OK;
  /* gathers still reading their part out of the tier, and kinds still arriving from a
   * prefetch: let them land first (the pass may rewrite those bytes) */
  if (u0 == 0 && u1 == f->nunits) rc = loom__fsdp_settle_tier_reads(f);
  for (size_t i = u0; i < u1 && !rc; i++)
    for (int k = 0; k < OFF_KINDS && !rc; k++)
      if ((read | write) & (1u << k)) rc = loom__fsdp_arrive(&f->units[i], k);
  if (!rc) rc = loom__fsdp_grad_settle(f);
  if (rc) return rc;
  s.low = (write & (1u << OFF_PARAM)) && loom__fsdp_low_on(f);
  for (size_t i = u0; i < u1; i++) { /* a copy is current again once every chunk went through */
    fsdp_unit *u = &f->units[i];
    if (s.low) u->off.low_ok = false;
    s.nitems += u->off.nchunks;
  }
  s.unit_of = loom__calloc(LOOM_POOL_META, s.nitems ? s.nitems : 1, sizeof(size_t));
  s.chunk_of = loom__calloc(LOOM_POOL_META, s.nitems ? s.nitems : 1, sizeof(size_t));
  if (!s.unit_of || !s.chunk_of) rc = loom__fail(LOOM_ENOMEM, "fsdp: out of memory for a pass");
  size_t item = 0;
  unsigned streamed = 0; /* the kinds that go through chunk buffers */
  for (size_t i = u0; i < u1 && !rc; i++) {
    fsdp_unit *u = &f->units[i];
    for (size_t ch = 0; ch < u->off.nchunks; ch++, item++) {
      s.unit_of[item] = i;
      s.chunk_of[item] = ch;
    }
    for (int k = 0; k < OFF_KINDS; k++)
      if (((read | write) & (1u << k)) && kind_offloaded(&s, u, k) &&
          (loom__ostore_tier(f->store) == LOOM__OTIER_DISK || !u->off.k[k].stored))
        streamed |= 1u << k; /* the host tier's stored bytes are worked on in place */
  }
  size_t ring_n = 0; /* a chunk, or the largest shard when that is smaller */
  for (size_t i = 0; i < f->nunits; i++) ring_n = f->units[i].shard > ring_n ? f->units[i].shard : ring_n;
  if (ring_n > f->chunk) ring_n = f->chunk;
  for (size_t i = 0; i < s.nsets && !rc; i++)
    for (int k = 0; k < OFF_KINDS && !rc; k++) {
      if (!(streamed & (1u << k))) continue;
      if (!(s.set[i].buf[k] = loom__malloc(LOOM_POOL_COMPUTE, (ring_n ? ring_n : 1) * sizeof(float))))
        rc = loom__fail(LOOM_ENOMEM, "fsdp offload: out of memory for a %zu-byte chunk buffer",
                        ring_n * sizeof(float));
    }
  bool disk = loom__ostore_tier(f->store) == LOOM__OTIER_DISK;
  size_t low_bytes = (ring_n ? ring_n : 1) * loom_dtype_size(f->fwd_dtype);
  for (size_t i = 0; i < s.nsets && s.low && disk && !rc; i++)
    if (!(s.set[i].low = loom__malloc(LOOM_POOL_COMPUTE, low_bytes)))
      rc = loom__fail(LOOM_ENOMEM, "fsdp offload: out of memory for a %zu-byte chunk buffer",
                      low_bytes);
  if (!rc && s.nitems) rc = issue_reads(&s, 0);
  for (size_t i = 0; i < s.nitems && !rc; i++) {
    if (s.nsets > 1 && i + 1 < s.nitems) rc = issue_reads(&s, i + 1);
    if (!rc) rc = work_on(&s, i, fn, ctx);
    if (!rc && s.nsets == 1 && i + 1 < s.nitems) rc = issue_reads(&s, i + 1);
  }
  for (size_t i = 0; i < s.nsets && !rc; i++) rc = wait_set(&s, &s.set[i], true, true);
  loom__fsdp_err e;
  loom__fsdp_err_save(&e, rc);
  stream_free(&s); /* waits for the dropped jobs: their messages are not the failure */
  if (rc) return loom__fsdp_err_restore(&e);
  /* every chunk went through: the tier's copies written now are the current ones */
  for (size_t i = u0; i < u1; i++) {
    fsdp_unit *u = &f->units[i];
    if (s.low) u->off.low_ok = true;
    for (int k = 0; k < OFF_KINDS; k++) {
      if (!(write & (1u << k))) continue;
      if (k >= OFF_STATE && (!opt || (size_t)(k - OFF_STATE) >= loom_optim_state_per_segment(opt)))
        continue;
      if (kind_offloaded(&s, u, k)) {
        if (u->off.nchunks) {
          u->off.k[k].gen = (uint8_t)write_gen(&s, u, k);
          u->off.k[k].stored = true;
        }
      } else {
        u->off.k[k].stored = false;
      }
    }
  }
  return LOOM_OK;
}

int loom__fsdp_stream(loom_fsdp *f, loom_optim *opt, unsigned read, unsigned write,
                      loom__fsdp_chunk_fn fn, void *ctx) {
  return stream_units(f, opt, 0, f->nunits, NULL, read, write, fn, ctx);
}

int loom__fsdp_each(loom_fsdp *f, unsigned read, unsigned write, loom__fsdp_chunk_fn fn,
                    void *ctx) {
  if (f->store) return loom__fsdp_stream(f, NULL, read, write, fn, ctx);
  int rc = LOOM_OK;
  for (size_t i = 0; i < f->nunits && !rc; i++) {
    fsdp_unit *u = &f->units[i];
    float *k[OFF_KINDS] = {u->param_shard, u->grad_shard, NULL, NULL};
    rc = fn(ctx, u, 0, u->shard, k);
  }
  return rc;
}

/* ---- the optimizer step ------------------------------------------------------------------ */

typedef struct step_ctx {
  loom_optim *opt;
  size_t per;
} step_ctx;

static int step_chunk(void *ctx, fsdp_unit *u, size_t at, size_t n, float *k[OFF_KINDS]) {
  step_ctx *c = ctx;
  float *state[OFF_KINDS - OFF_STATE] = {k[OFF_STATE], k[OFF_STATE + 1]};
  return loom_optim_step_chunk(c->opt, u->index, at, n, k[OFF_PARAM], k[OFF_GRAD],
                               c->per ? state : NULL);
}

/* The units the next forward gathers first: their parameters start coming back now (from the
 * disk tier; the host tier's gathers read its buffers: loom__fsdp_param_ahead). */
static int prefetch_next_forward(loom_fsdp *f) {
  if (!loom__fsdp_offloading(f, OFF_PARAM)) return LOOM_OK;
  size_t ahead = (size_t)f->cfg.forward_prefetch + (size_t)f->cfg.offload.prefetch_steps;
  int rc = LOOM_OK;
  for (size_t i = 0; i < ahead && i < f->nunits && !rc; i++)
    rc = loom__fsdp_param_ahead(&f->units[f->n_order == f->nunits ? f->order[i] : i]);
  return rc;
}

/* The masks of the optimizer's pass: parameters, gradients and state read; parameters and
 * state written. */
static void step_masks(size_t per, unsigned *read, unsigned *write) {
  unsigned state = per == 2 ? (3u << OFF_STATE) : per == 1 ? (1u << OFF_STATE) : 0;
  *read = (1u << OFF_PARAM) | (1u << OFF_GRAD) | state;
  *write = (1u << OFF_PARAM) | state;
}

/* Each unit's step is a chunked step of its own (the state moves to and from the tier between
 * them, which an open step forbids), every one with the step count of the backward's first:
 * the same scalars (learning rate, bias corrections), so the same bits as one step over all. */
int loom__fsdp_step_unit(fsdp_unit *u, float *grad) {
  loom_fsdp *f = u->f;
  loom_optim *opt = f->step_opt;
  int rc = LOOM_OK;
  step_ctx c = {opt, loom_optim_state_per_segment(opt)};
  /* state never offloaded goes to the tier first, whole (as loom_fsdp_optim_step's) */
  if (f->store && loom__fsdp_offloading(f, OFF_STATE)) rc = loom__fsdp_state_out(u, opt);
  if (rc) return rc;
  if (!f->oib_open) {
    f->oib_step0 = loom_optim_step_count(opt);
    f->oib_open = true;
  } else if ((rc = loom_optim_set_step_count(opt, f->oib_step0))) {
    return rc;
  }
  if ((rc = loom_optim_step_begin(opt, 1.0f))) return rc;
  if (!f->store) {
    float *k[OFF_KINDS] = {u->param_shard, grad, NULL, NULL};
    for (size_t s = 0; s < c.per; s++) k[OFF_STATE + s] = loom__fsdp_state_buf(opt, u->index, (int)s);
    rc = step_chunk(&c, u, 0, u->shard, k);
    int rc2 = loom_optim_step_end(opt, true); /* a failed unit fails the backward */
    return rc ? rc : rc2;
  }
  unsigned read, write;
  step_masks(c.per, &read, &write);
  rc = stream_units(f, opt, u->index, u->index + 1, grad, read, write, step_chunk, &c);
  int rc2 = loom_optim_step_end(opt, true);
  if (!rc) rc = rc2;
  if (!rc && loom__fsdp_offloading(f, OFF_PARAM)) rc = loom__fsdp_param_out(u);
  if (!rc && loom__fsdp_offloading(f, OFF_STATE)) rc = loom__fsdp_state_out(u, opt);
  if (!rc && loom__fsdp_offloading(f, OFF_GRAD)) { /* consumed: nothing to keep */
    loom__free(u->grad_shard);
    u->grad_shard = NULL;
    u->off.k[OFF_GRAD].offloaded = true;
    u->off.k[OFF_GRAD].stored = false;
  }
  return rc;
}

int loom__fsdp_step_close(loom_fsdp *f, bool ok) {
  if (!f->oib_open) return LOOM_OK;
  f->oib_open = false;
  f->oib_stepped = ok;
  return LOOM_OK;
}

int loom_fsdp_set_optim(loom_fsdp *f, loom_optim *opt) {
  static const char *who = "loom_fsdp_set_optim";
  if (!f) return loom__fail(LOOM_EINVAL, "%s: fsdp is NULL", who);
  if (f->in_step) return loom__fail(LOOM_EMISUSE, "%s: a backward is running", who);
  int rc = opt ? loom__fsdp_check_optim(f, opt, who) : LOOM_OK;
  if (rc) return rc;
  f->step_opt = opt;
  f->oib_stepped = false;
  return LOOM_OK;
}

bool loom_fsdp_optim_in_backward(const loom_fsdp *f) { return f && f->cfg.optim_in_backward; }

int loom_fsdp_optim_step(loom_fsdp *f, loom_optim *opt, float grad_scale) {
  static const char *who = "loom_fsdp_optim_step";
  if (!f) return loom__fail(LOOM_EINVAL, "%s: fsdp is NULL", who);
  int rc = loom__fsdp_check_optim(f, opt, who);
  if (rc) return rc;
  if (f->in_step)
    return loom__fail(LOOM_EMISUSE, "%s: backward has not finished (call loom_fsdp_finish)", who);
  if (f->oib_stepped) { /* backward stepped every unit already */
    if (opt != f->step_opt)
      return loom__fail(LOOM_EINVAL, "%s: backward stepped with the optimizer given to "
                        "loom_fsdp_set_optim, not this one", who);
    if (grad_scale != 1.0f)
      return loom__fail(LOOM_EINVAL, "%s: grad_scale %g after a backward that stepped with 1 "
                        "(optim_in_backward)", who, (double)grad_scale);
    f->oib_stepped = false;
    return prefetch_next_forward(f);
  }
  if (!f->store) return loom_optim_step_scaled(opt, grad_scale);
  /* state that has never been offloaded goes to the tier first, whole: the pass then only
   * rewrites slots that exist (a first put could fail half-way) */
  for (size_t i = 0; i < f->nunits && !rc; i++)
    if (loom__fsdp_offloading(f, OFF_STATE)) rc = loom__fsdp_state_out(&f->units[i], opt);
  if (rc) return rc;
  step_ctx c = {opt, loom_optim_state_per_segment(opt)};
  unsigned read, write;
  step_masks(c.per, &read, &write);
  if ((rc = loom_optim_step_begin(opt, grad_scale))) return rc;
  rc = loom__fsdp_stream(f, opt, read, write, step_chunk, &c);
  int rc2 = loom_optim_step_end(opt, rc == LOOM_OK);
  if (rc) return rc;
  if (rc2) return rc2;
  /* parameters or state the pass found in the compute pool go back out */
  for (size_t i = 0; i < f->nunits && !rc; i++) {
    if (loom__fsdp_offloading(f, OFF_PARAM)) rc = loom__fsdp_param_out(&f->units[i]);
    if (!rc && loom__fsdp_offloading(f, OFF_STATE)) rc = loom__fsdp_state_out(&f->units[i], opt);
  }
  return rc ? rc : prefetch_next_forward(f);
}
