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
  size_t per;       /* the optimizer's state buffers per segment (0 without one) */
  /* the optimizer's pass on a thread of its own (fsdp_async.c): every kind's place was fixed
   * and the disk tier's slot sets switched before it started (it reads the old set, writes the
   * new one), it settles nothing of the wrapper's, its jobs survive other threads' clears, its
   * waits are its own (not exposed), and it publishes each unit once stepped */
  loom__fsdp_detached *detached;
  double *wait_s;   /* where waits for transfers count */
  unsigned job_flags;
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
    return s->detached || (s->opt && loom_optim_state_released(s->opt, u->index));
  return u->off.k[kind].offloaded;
}

/* The disk tier keeps two slot sets of parameters and state: a pass writes the other one. */
static bool shadowed(const loom_fsdp *f, int kind) {
  return loom__ostore_tier(f->store) == LOOM__OTIER_DISK && kind != OFF_GRAD;
}

/* The slot set the pass reads a kind from, and the one it writes (a detached pass runs after
 * the switch: it reads the set that was current, writes the one that is now). */
static unsigned read_gen(const stream *s, const fsdp_unit *u, int kind) {
  return u->off.k[kind].gen ^ (s->detached && shadowed(s->f, kind) ? 1u : 0u);
}

static unsigned write_gen(const stream *s, const fsdp_unit *u, int kind) {
  return u->off.k[kind].gen ^ (!s->detached && shadowed(s->f, kind) ? 1u : 0u);
}

/* The host tier's bytes of a stored kind, worked on where they are (no copy); NULL otherwise. */
static float *in_host(const stream *s, const fsdp_unit *u, int kind, size_t c) {
  if (!u->off.k[kind].stored) return NULL;
  return loom__ostore_host_buffer(s->f->store, loom__fsdp_slot(u, kind, read_gen(s, u, kind), c),
                                  loom__fsdp_chunk_len(u, c) * sizeof(float));
}

static int wait_one(stream *s, uint64_t *job, int rc) {
  double w = 0;
  int rc2 = loom__ostore_wait(s->f->store, *job, &w);
  *job = 0;
  *s->wait_s += w;
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
    rc = loom__ostore_submit_get_ex(s->f->store, loom__fsdp_slot(u, k, read_gen(s, u, k), c),
                                    r->buf[k], n * sizeof(float), s->job_flags, &r->get[k]);
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
    if (k >= OFF_STATE && (size_t)(k - OFF_STATE) >= s->per) continue;
    float *host = kind_offloaded(s, u, k) ? in_host(s, u, k, c) : NULL;
    k_ptr[k] = host ? host : kind_offloaded(s, u, k) ? r->buf[k] : resident(s, u, k) + at;
  }
  if ((rc = fn(ctx, u, at, n, k_ptr))) return rc;
  if (s->low && k_ptr[OFF_PARAM]) /* after the f32 values are final: cast once, out */
    rc = loom__fsdp_low_put(u, c, k_ptr[OFF_PARAM], n, r->low, s->job_flags, &r->low_put);
  for (int k = 0; k < OFF_KINDS && !rc; k++) {
    if (!(s->write & (1u << k)) || !k_ptr[k] || !kind_offloaded(s, u, k) || k_ptr[k] != r->buf[k])
      continue;
    rc = loom__ostore_submit_put_ex(s->f->store, loom__fsdp_slot(u, k, write_gen(s, u, k), c),
                                    r->buf[k], n * sizeof(float), s->job_flags, &r->put[k]);
  }
  if (!rc && s->nsets == 1) rc = wait_set(s, r, false, true);
  return rc;
}

/* Free a chunk buffer, or hand it to a dry run's detached pass (loom__fsdp_detached.ring). */
static void ring_free(stream *s, void *p) {
  loom__fsdp_detached *d = s->detached;
  if (p && d && d->keep_ring && d->nring < sizeof d->ring / sizeof d->ring[0]) d->ring[d->nring++] = p;
  else loom__free(p);
}

static void stream_free(stream *s) {
  if (!s->detached) loom__ostore_clear(s->f->store); /* a detached pass's jobs are all its own */
  for (size_t i = 0; i < s->nsets; i++) {
    (void)wait_set(s, &s->set[i], true, true);
    for (int k = 0; k < OFF_KINDS; k++) ring_free(s, s->set[i].buf[k]);
    ring_free(s, s->set[i].low);
  }
  loom__free(s->unit_of);
  loom__free(s->chunk_of);
}

/* Every chunk of units [u0, u1) went through: the tier's copies written now are the current
 * ones (the disk tier's other slot set). A detached pass's caller does it before the pass
 * starts (loom__fsdp_pass_switch), and undoes it if the pass fails (loom__fsdp_pass_unswitch). */
static void switch_sets(const stream *s, size_t u0, size_t u1) {
  for (size_t i = u0; i < u1; i++) {
    fsdp_unit *u = &s->f->units[i];
    if (s->low) u->off.low_ok = true;
    for (int k = 0; k < OFF_KINDS; k++) {
      if (!(s->write & (1u << k))) continue;
      if (k >= OFF_STATE && (size_t)(k - OFF_STATE) >= s->per) continue;
      if (kind_offloaded(s, u, k)) {
        if (u->off.nchunks) {
          u->off.k[k].gen = (uint8_t)write_gen(s, u, k);
          u->off.k[k].stored = true;
        }
      } else {
        u->off.k[k].stored = false;
      }
    }
  }
}

/* Gathers still reading their part out of the tier, kinds still arriving from a prefetch, and
 * gradients on their way out: let them land first (a pass over units [u0, u1) may rewrite or
 * read those bytes). */
static int settle_for_pass(loom_fsdp *f, size_t u0, size_t u1, unsigned read, unsigned write) {
  int rc = LOOM_OK;
  if (u0 == 0 && u1 == f->nunits) rc = loom__fsdp_settle_tier_reads(f);
  for (size_t i = u0; i < u1 && !rc; i++)
    for (int k = 0; k < OFF_KINDS && !rc; k++)
      if ((read | write) & (1u << k)) rc = loom__fsdp_arrive(&f->units[i], k);
  return rc ? rc : loom__fsdp_grad_settle(f);
}

/* Units [0, n) are stepped (a detached pass): the next forward may read them. */
static void publish(stream *s, size_t n) {
  if (s->detached) s->detached->published(s->detached->ctx, n);
}

/* The pass over units [u0, u1) (every unit, or the one a backward steps: its gather is done,
 * and the other units' gathers read nothing of its slots). */
static int stream_units(loom_fsdp *f, loom_optim *opt, size_t u0, size_t u1, float *grad,
                        unsigned read, unsigned write, loom__fsdp_chunk_fn fn, void *ctx,
                        loom__fsdp_detached *detached) {
  stream s = {.f = f, .opt = opt, .read = read, .write = write, .u0 = u0, .u1 = u1, .grad = grad,
              .per = detached ? detached->per : loom_optim_state_per_segment(opt),
              .detached = detached, .wait_s = detached ? &detached->wait_s : &f->off_wait_s,
              .job_flags = detached ? LOOM__OJOB_KEEP : 0};
  const loom_fsdp_offload_cfg *c = &f->cfg.offload;
  if (!f->store) return loom__fail(LOOM_EMISUSE, "fsdp: a streamed pass without offload");
  s.nsets = c->prefetch_gradients && c->prefetch_steps > 0 ? RING : 1;
  int rc = detached ? LOOM_OK : settle_for_pass(f, u0, u1, read, write);
  if (rc) return rc;
  s.low = (write & (1u << OFF_PARAM)) && loom__fsdp_low_on(f);
  for (size_t i = u0; i < u1; i++) { /* a copy is current again once every chunk went through */
    fsdp_unit *u = &f->units[i];
    if (s.low && !detached) u->off.low_ok = false;
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
  if (!rc && s.nitems) publish(&s, s.unit_of[0]); /* units without a chunk before the first */
  for (size_t i = 0; i < s.nitems && !rc; i++) {
    if (s.nsets > 1 && i + 1 < s.nitems) rc = issue_reads(&s, i + 1);
    if (!rc && detached && i > 0 && s.unit_of[i] != s.unit_of[i - 1]) {
      /* the last unit's chunks are all worked on: once their writes are on the tier (the
       * sets hold no later ones), its gather may read them; the next two chunks' reads are
       * in flight meanwhile */
      for (size_t k = 0; k < s.nsets && !rc; k++) rc = wait_set(&s, &s.set[k], false, true);
      if (!rc) publish(&s, s.unit_of[i]); /* and the units without a chunk before this one */
    }
    if (!rc) rc = work_on(&s, i, fn, ctx);
    if (!rc && s.nsets == 1 && i + 1 < s.nitems) rc = issue_reads(&s, i + 1);
  }
  for (size_t i = 0; i < s.nsets && !rc; i++) rc = wait_set(&s, &s.set[i], true, true);
  loom__fsdp_err e;
  loom__fsdp_err_save(&e, rc);
  stream_free(&s); /* waits for the dropped jobs: their messages are not the failure */
  if (rc) return loom__fsdp_err_restore(&e);
  if (detached) publish(&s, u1);
  else switch_sets(&s, u0, u1);
  return LOOM_OK;
}

int loom__fsdp_stream(loom_fsdp *f, loom_optim *opt, unsigned read, unsigned write,
                      loom__fsdp_chunk_fn fn, void *ctx) {
  int rc = loom__fsdp_step_join(f); /* the last step's pass first: it may be writing them */
  return rc ? rc : stream_units(f, opt, 0, f->nunits, NULL, read, write, fn, ctx, NULL);
}

int loom__fsdp_each(loom_fsdp *f, unsigned read, unsigned write, loom__fsdp_chunk_fn fn,
                    void *ctx) {
  if (f->store) return loom__fsdp_stream(f, NULL, read, write, fn, ctx);
  int rc = loom__fsdp_step_join(f);
  if (rc) return rc;
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

/* ---- the optimizer's pass detached (fsdp_async.c runs it behind the next forward) -------- */

int loom__fsdp_pass_settle(loom_fsdp *f, loom_optim *opt) {
  unsigned read, write;
  step_masks(loom_optim_state_per_segment(opt), &read, &write);
  return settle_for_pass(f, 0, f->nunits, read, write);
}

void loom__fsdp_pass_switch(loom_fsdp *f, loom_optim *opt, uint8_t *flipped) {
  stream s = {.f = f, .opt = opt, .per = loom_optim_state_per_segment(opt)};
  step_masks(s.per, &s.read, &s.write);
  s.low = loom__fsdp_low_on(f);
  for (size_t i = 0; i < f->nunits; i++) {
    fsdp_unit *u = &f->units[i];
    flipped[i] = 0;
    for (int k = 0; k < OFF_KINDS; k++) {
      bool mine = (s.write & (1u << k)) && (k < OFF_STATE || (size_t)(k - OFF_STATE) < s.per);
      if (mine && shadowed(f, k) && kind_offloaded(&s, u, k) && u->off.nchunks)
        flipped[i] |= (uint8_t)(1u << k);
    }
  }
  switch_sets(&s, 0, f->nunits);
}

void loom__fsdp_pass_unswitch(loom_fsdp *f, const uint8_t *flipped) {
  for (size_t i = 0; i < f->nunits; i++) {
    fsdp_unit *u = &f->units[i];
    u->off.low_ok = false; /* one slot set, partly rewritten */
    for (int k = 0; k < OFF_KINDS; k++)
      if (flipped[i] & (1u << k)) u->off.k[k].gen ^= 1u;
  }
}

static int detached_chunk(void *ctx, fsdp_unit *u, size_t at, size_t n, float *k[OFF_KINDS]) {
  loom__fsdp_detached *d = ctx;
  float *state[OFF_KINDS - OFF_STATE] = {k[OFF_STATE], k[OFF_STATE + 1]};
  return loom__optim_snap_chunk(d->snap, u->index, at, n, k[OFF_PARAM], k[OFF_GRAD],
                                d->per ? state : NULL);
}

int loom__fsdp_pass_run(loom_fsdp *f, loom__fsdp_detached *d) {
  unsigned read, write;
  step_masks(d->per, &read, &write);
  return stream_units(f, NULL, 0, f->nunits, NULL, read, write, detached_chunk, d, d);
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
  rc = stream_units(f, opt, u->index, u->index + 1, grad, read, write, step_chunk, &c, NULL);
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
  int rc = loom__fsdp_step_join(f); /* the last step's pass, if it still runs: its failure */
  if (!rc) rc = loom__fsdp_check_optim(f, opt, who);
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
  /* the disk tier: the pass runs on a thread of its own behind the next forward (fsdp_async.c);
   * its units are back in the tier as it ends, and the forward's gathers read them there */
  if (loom__fsdp_async_wanted(f, c.per)) return loom__fsdp_step_launch(f, opt, grad_scale);
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
