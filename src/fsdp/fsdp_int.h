/* fsdp_int.h: the FSDP wrapper's structs, shared by the fsdp files (private to loom):
 * fsdp.c (create, free, configuration, peers, segments, statistics), fsdp_units.c (wrap
 * policies and flat layouts), fsdp_gather.c (gather, reshard, the parameters' views),
 * fsdp_share.c (gathered buffers shared by ranks in one process), fsdp_hooks.c (forward and
 * backward hooks, reduce-scatter, finish, no_sync), fsdp_amp.c (the specification's
 * integration: overflow, loss scale), fsdp_state.c (full state dict), fsdp_ckpt.c (sharded
 * checkpoints), and the offloader's fsdp_offload.c, fsdp_stream.c and fsdp_lowp.c. */
#ifndef LOOM_FSDP_INT_H
#define LOOM_FSDP_INT_H

#include "autograd/autograd_int.h"
#include "core/tensor_int.h"
#include "loom/autograd.h"
#include "loom/fsdp.h"
#include "nn/nn_int.h"
#include "optim/optim_int.h"

typedef enum unit_state { UNIT_RESHARDED = 0, UNIT_GATHERING = 1, UNIT_GATHERED = 2 } unit_state;

typedef struct fsdp_unit fsdp_unit;
typedef struct loom__fsdp_share loom__fsdp_share;
typedef struct loom__fsdp_astep loom__fsdp_astep;

/* Offload: the kinds of a unit's bytes that move (the optimizer state has one kind per state
 * buffer: Adam's exp_avg and exp_avg_sq, SGD's momentum). */
enum { OFF_PARAM = 0, OFF_GRAD = 1, OFF_STATE = 2, OFF_KINDS = 4 };

typedef struct off_kind {
  bool offloaded;     /* the bytes live in the tier; the compute pool has none (or they are
                         arriving: `arriving`) */
  bool stored;        /* the tier holds the current bytes (in slot set `gen`) */
  bool arriving;      /* gets are in flight into the compute buffer */
  bool leaving;       /* puts are in flight from the compute buffer, which goes when they end */
  uint8_t gen;        /* disk tier, parameters and state: the slot set holding the current
                         bytes (the optimizer step writes the other set, then switches) */
  uint64_t *jobs;     /* nchunks ids of the transfer in flight (0: none) */
} off_kind;

/* The low-precision copy of the parameter shard (fsdp_lowp.c): not a kind of k[] (it has no
 * compute-pool buffer and one slot set), named by this pseudo-kind where a kind is asked. */
enum { OFF_LOW = OFF_KINDS };

typedef struct off_unit {
  loom_tensor *grad_src; /* the local gradient whose slice (reduced in place) is on its way out */
  size_t nchunks;     /* chunks of the shard */
  size_t slot0;       /* first store slot: slot = slot0 + (gen * OFF_KINDS + kind) * nchunks + c;
                         the low-precision copy's after them: slot0 + 2 * OFF_KINDS * nchunks + c */
  bool low_ok;        /* the tier's low-precision copy holds the current f32 shard, cast */
  off_kind k[OFF_KINDS];
} off_unit;

/* A parameter of a unit: the module's parameter and where it sits in the unit's flat layout. */
typedef struct fsdp_param {
  loom__param *p;    /* the module's parameter (value retained by the fsdp) */
  size_t offset;     /* element offset in the unit's flat parameter (core/layout.h) */
  size_t numel;
  size_t index;      /* position in the module's parameter list */
  fsdp_unit *unit;
  int hook_id;
  bool ready;        /* its gradient is complete in this backward */
} fsdp_param;

struct fsdp_unit {
  loom_fsdp *f;
  size_t index;
  loom_module *module;   /* borrowed */
  char *name;            /* dotted module name ("" for the root; messages show loom__fsdp_unit_shown) */
  fsdp_param *params;
  size_t nparams;
  size_t numel, padded, shard; /* flat elements, padded to the world size, per rank */
  float *param_shard;    /* shard elements, this rank's part (compute pool) */
  float *grad_shard;
  /* gathering */
  unit_state state;
  loom_dtype gathered_dtype;
  loom_tensor *gathered; /* padded elements of gathered_dtype, while gathered */
  loom_work *gather_work;
  double gather_issued;
  bool reads_tier;       /* the gather's first step reads this rank's part out of the tier */
  double read_begin, read_end; /* when it did (written by the thread that ran it) */
  uint64_t share_gen;    /* shared gathers of this unit issued (fsdp_share.c) */
  size_t share_counted;  /* bytes of `gathered` (a shared buffer) this rank's account counts */
  struct loom__fsdp_share_slot *share_slot; /* the slot of that buffer, while the share's
                                               limit counts this rank as holding it */
  loom_tensor *resident; /* shared f32 gathers: the unit's one buffer whose slice param_shard is,
                          * gathered without a copy (fsdp_share.c); NULL otherwise */
  /* backward */
  bool in_backward;      /* its pre-backward ran in this backward */
  bool reduced;          /* its reduce-scatter was issued (or, with sync off, the gradient kept) */
  size_t pending;        /* parameters whose gradient is not complete yet */
  loom_tensor *full_grad; /* padded f32: the local gradient, while it exists */
  loom_work *rs_work;    /* the reduce-scatter's (hybrid sharding: the replica all-reduce's) */
  float *rs_recv;        /* where it reduces into (loom__fsdp_grad_target's answer) */
  loom_work *rs_shard;   /* hybrid sharding: the reduce-scatter, waited by the all-reduce's
                            first step on the replica group's thread (or by the reap) */
  double rs_issued;
  loom_autocast_token autocast; /* the unit's own autocast region in forward (mixed precision) */
  bool autocast_on;
  off_unit off;          /* offload (cfg.offload.enabled) */
};

/* A unit's name as messages show it: the dotted module name, or "(root)" for the root unit,
 * whose name is "" (the name the API and the checkpoints keep: loom_fsdp_unit_info). */
static inline const char *loom__fsdp_unit_shown(const char *name) {
  return name && *name ? name : "(root)";
}

/* "s" after a count of units that is not 1 ("1 unit", "3 units"). */
static inline const char *loom__fsdp_plural(size_t n) { return n == 1 ? "" : "s"; }

struct loom_fsdp {
  loom_pg *pg;
  int rank, world;
  loom_module *root;
  loom_fsdp_cfg cfg;
  char **unit_names;     /* cfg.unit_names copied */
  fsdp_unit *units;
  size_t nunits;
  fsdp_param **by_index; /* the module's parameter i -> its fsdp_param */
  size_t nparams;
  loom_param_seg *segs;
  char **seg_names;
  loom_fsdp_mp *mp;      /* NULL without mixed precision */
  loom_dtype fwd_dtype;  /* the dtype units are gathered in for forward and backward */
  size_t *order;         /* units in the order they finished forward (backward runs it back) */
  size_t n_order;
  bool order_closed;     /* a backward began since: the next forward records afresh */
  size_t cache_reserved; /* bytes this wrapper added to the allocator cache's limit */
  /* offload */
  struct loom__ostore *store; /* NULL without offload */
  char *offload_dir;          /* cfg.offload.dir copied */
  size_t chunk;               /* elements per chunk */
  double off_wait_s;          /* exposed transfer wait */
  bool grad_overlap;          /* LOOM_FSDP_GRAD_OVERLAP=1: a unit's gradient leaves while the
                                 next unit's backward runs (faster; about one slice more
                                 resident at the backward's peak); default: written before
                                 that backward starts */
  bool grad_first;            /* a backward's gradient puts go ahead of queued gathers' reads
                                 (LOOM_FSDP_GRAD_FIRST=0: in submission order) */
  size_t grad_leaving;        /* the unit whose gradient left last in backward, or SIZE_MAX */
  loom_optim *state_opt;      /* the optimizer whose state was last sent for (a prefetch) */
  bool async_step;            /* cfg.offload.async_step (LOOM_FSDP_ASYNC_STEP=0/1 overrides) */
  loom__fsdp_astep *astep;    /* the optimizer's pass running behind the next forward
                                 (fsdp_async.c), or NULL */
  bool sync;
  bool in_step;
  int step_status;
  loom_optim *step_opt;  /* cfg.optim_in_backward: loom_fsdp_set_optim's (borrowed) */
  bool oib_open;         /* this backward stepped a unit */
  int64_t oib_step0;     /* step_opt's step count before it did */
  bool oib_stepped;      /* the last backward stepped every unit: loom_fsdp_optim_step has
                            nothing left to step */
  loom_fsdp_stats stats;
  loom__fsdp_share *share; /* the ranks' shared gathered buffers (fsdp_share.c); NULL: each
                            rank gathers into its own */
  loom_pg *replica;      /* hybrid sharding: cfg.replica_pg (NULL: plain FSDP) */
  int replica_rank;      /* this rank's place in it (0 without) */
};

/* fsdp_units.c: cut the module into units by cfg's policy and lay out each unit's flat
 * parameter; fills f->units, f->nunits, f->by_index, f->nparams. */
int loom__fsdp_make_units(loom_fsdp *f);
void loom__fsdp_free_units(loom_fsdp *f);

/* fsdp_gather.c */
int loom__fsdp_issue_gather(fsdp_unit *u, loom_dtype dt);
int loom__fsdp_wait_gather(fsdp_unit *u);
int loom__fsdp_reshard(fsdp_unit *u);
/* Reshard every unit whose gather is still reading its part out of the offload tier on the
 * progress thread (loom__fsdp_param_into), before anything rewrites the tier's parameter
 * bytes: the optimizer's pass, a load. The first failure. */
int loom__fsdp_settle_tier_reads(loom_fsdp *f);
/* The unit's parameters as views of the gathered buffer. */
int loom__fsdp_bind_params(fsdp_unit *u);

/* fsdp_share.c: one gathered buffer for all ranks of a group in one address space. At create
 * (collective; f->share stays NULL where ranks do not share); at free (not a collective). */
int loom__fsdp_share_init(loom_fsdp *f);
void loom__fsdp_share_free(loom_fsdp *f);
/* Whether the unit's gather in dt goes into a shared buffer (the same answer on every rank). */
bool loom__fsdp_shares(const fsdp_unit *u, loom_dtype dt);
/* The shared buffer of the unit's next gather (padded elements of dt), a reference of this
 * rank's: rank 0 makes it, the others wait for it. */
int loom__fsdp_share_buffer(fsdp_unit *u, loom_dtype dt, loom_tensor **out);
/* Free u->gathered (NULL after): this rank's account stops counting its share of a shared
 * buffer, and once the reference is gone, the share's limit counts the rank as no longer
 * holding it (so rank 0 never makes the next buffer before this one is freed). */
void loom__fsdp_free_gathered(fsdp_unit *u);
/* With f->share, at create (collective): the unit's resident buffer (padded f32, zeroed), rank 0
 * making it; sets u->resident and points u->param_shard at this rank's slice of it (nothing
 * without sharing: u->resident stays NULL). At free: this rank's reference. */
int loom__fsdp_share_resident(fsdp_unit *u);
void loom__fsdp_share_resident_free(fsdp_unit *u);
/* Where some unit's shards are slices of a resident buffer (and not in a dry run): a barrier,
 * so that no rank writes its slice (optimizer step, a load) while a peer may still read the
 * unit (a backward's input gradient after its reduce-scatter, rank 0 copying a full state).
 * LOOM_OK with nothing to do otherwise; the barrier's error else. */
int loom__fsdp_share_fence(loom_fsdp *f);

/* fsdp_hooks.c */
int loom__fsdp_install_hooks(loom_fsdp *f);
void loom__fsdp_remove_hooks(loom_fsdp *f);
/* Wait for the unit's reduce-scatter and drop its local gradient. */
int loom__fsdp_reap(fsdp_unit *u);

/* A failure kept across clean-up that sets the thread's message (waiting for dropped jobs). */
typedef struct loom__fsdp_err {
  int rc;
  char msg[1024];
} loom__fsdp_err;
void loom__fsdp_err_save(loom__fsdp_err *e, int rc);
int loom__fsdp_err_restore(const loom__fsdp_err *e);

/* fsdp_offload.c: the offloader (no-ops without offload) */
bool loom__fsdp_offloading(const loom_fsdp *f, int kind);
int loom__fsdp_offload_init(loom_fsdp *f);   /* at create: the store and the chunk layout */
void loom__fsdp_offload_free(loom_fsdp *f);
/* the unit's parameter shard in the compute pool (waiting for it, or reading it now) */
int loom__fsdp_param_need(fsdp_unit *u);
/* With parameters offloaded and not on their way back, a gather reads them straight into its
 * own part of the gathered buffer (loom__fsdp_param_into): true for f32 from either tier, for
 * the forward dtype from the tier's low-precision copy while it is current (fsdp_lowp.c), and
 * for f16 / bf16 from the host tier, cast from its buffers where they are (otherwise the disk
 * tier's come into the shard first). */
bool loom__fsdp_param_readable(const fsdp_unit *u, loom_dtype dt);
/* Read (or cast) them into dst, of dtype dt, when loom__fsdp_param_readable. Safe on another
 * thread (the group's progress thread, as the all-gather's first step) while the rank computes:
 * it writes nothing of the wrapper, and nothing changes the unit's parameter kind while its
 * gather is in flight. */
int loom__fsdp_param_into(fsdp_unit *u, void *dst, loom_dtype dt);
/* the gather has its bytes: the parameter shard may leave */
int loom__fsdp_param_done(fsdp_unit *u);
/* start bringing the parameter shard back (with prefetch on) */
int loom__fsdp_param_prefetch(fsdp_unit *u);
/* The hooks' prefetch ahead of a gather: nothing where the gather can read its part straight
 * out of the tier (loom__fsdp_param_readable in the forward dtype: f32 from either tier, the
 * low-precision copy, the host tier's buffers cast), loom__fsdp_param_prefetch otherwise (the
 * disk tier under mixed precision with no current copy: the f32 shard comes back to be cast).
 * A readable part is read into the gathered buffer in one pass, as the all-gather's first step
 * on the progress thread (on the disk tier by its I/O threads), while the unit before computes;
 * bringing the shard back first would add a second copy, whose cycles on a CPU come out of the
 * ranks' GEMMs, and a shard in the compute pool, resident (issue 29, item 4). The shard stays
 * offloaded throughout (loom_fsdp_is_offloaded true). */
int loom__fsdp_param_ahead(fsdp_unit *u);
/* Where to reduce-scatter the unit's gradient (its old bytes are not needed): the gradient
 * shard, or, with gradients offloaded, this rank's slice of the local gradient itself (in
 * place: no shard buffer exists at all) */
int loom__fsdp_grad_target(fsdp_unit *u, float **recv);
/* The reduce-scatter has completed: the gradient leaves for the tier. With the in-place
 * reduce-scatter the offloader takes the local gradient u->full_grad (its views already
 * unbound from the parameters) and frees it once its slice is out; its puts go ahead of
 * queued reads (f->grad_first); with the allocator cache off (or f->grad_overlap) the pages of
 * the peers' slices go at once and each chunk's once it is on the tier. */
int loom__fsdp_grad_done(fsdp_unit *u);
/* wait for gradient shards on their way out and free them (one unit, or all) */
int loom__fsdp_grad_settle_unit(fsdp_unit *u);
int loom__fsdp_grad_settle(loom_fsdp *f);
/* loom__fsdp_grad_settle but for the unit whose gradient left last (f->grad_leaving): a
 * backward lets that write go on while the next unit computes (each chunk's pages given back
 * as it lands, the peers' slices of the local gradient at once) */
int loom__fsdp_grad_settle_older(loom_fsdp *f);
/* every unit's parameter shard and optimizer state (opt may be NULL) back in the compute pool
 * (checkpoints), and every offloaded kind out again (`changed`: the parameters and state in
 * the compute pool were written, the tier's copies are stale) */
int loom__fsdp_onload_all(loom_fsdp *f, loom_optim *opt);
int loom__fsdp_offload_all(loom_fsdp *f, loom_optim *opt, bool changed);
/* Checkpoints read offloaded bytes where they are: a reader per (unit, kind), sharing one chunk
 * buffer (the last chunk read stays in it). loom__fsdp_read_bytes is an io reader
 * (loom__tensor_reader) over ctx = a loom__fsdp_reader. */
typedef struct loom__fsdp_chunk_cache {
  float *buf;   /* f->chunk elements */
  size_t unit, chunk;
  int kind;
} loom__fsdp_chunk_cache;
typedef struct loom__fsdp_reader {
  fsdp_unit *u;
  int kind;
  loom__fsdp_chunk_cache *shared;
} loom__fsdp_reader;
int loom__fsdp_read_bytes(void *ctx, size_t offset, void *dst, size_t bytes);
/* The kind's buffer in the compute pool (the optimizer's, for state), NULL while offloaded. */
float *loom__fsdp_resident(fsdp_unit *u, int kind, loom_optim *opt);
/* Every transfer in flight finished (arrivals landed, gradients out). */
int loom__fsdp_settle_all(loom_fsdp *f);
/* transfers of one kind of one unit (fsdp_offload.c), used by the stream */
size_t loom__fsdp_chunk_len(const fsdp_unit *u, size_t c);
/* wait for a kind's gets in flight: in the compute pool, or offloaded still (the failure) */
int loom__fsdp_arrive(fsdp_unit *u, int kind);
/* a shard-sized buffer in the compute pool (NULL and the failure named after `what`), and
 * freeing a kind's buffer (the optimizer's state released, for a state kind) */
float *loom__fsdp_alloc_shard(fsdp_unit *u, const char *what);
void loom__fsdp_free_buffer(fsdp_unit *u, int kind);
/* parameter shard / optimizer state to the tier and out of the compute pool (a put unless the
 * tier's copy is current) */
int loom__fsdp_param_out(fsdp_unit *u);
int loom__fsdp_state_out(fsdp_unit *u, loom_optim *opt);
size_t loom__fsdp_slot(const fsdp_unit *u, int kind, unsigned gen, size_t c);
int loom__fsdp_check_optim(const loom_fsdp *f, const loom_optim *opt, const char *who);
/* The optimizer's state buffer k of unit's segment (NULL while released). */
float *loom__fsdp_state_buf(loom_optim *opt, size_t unit, int k);

/* fsdp_lowp.c: the low-precision parameter copy in the tier (cfg.offload.low_precision_params).
 * loom__fsdp_low_on: the wrapper keeps one (mixed precision, parameters offloaded, asked for).
 * loom__fsdp_low_readable: a gather in dt may read the unit's copy (current, and dt the
 * forward dtype). loom__fsdp_low_slot: chunk c's slot. loom__fsdp_low_put: write chunk c of
 * the copy from n f32 values (cast): in place on the host tier; on the disk tier cast into
 * `scratch` (n elements of the forward dtype, on loan until *job is waited for) and submitted
 * as a put with the store's `flags` (*job; 0 when it was written synchronously). loom__fsdp_low_drop: every unit's
 * copy is stale (the f32 shards were rewritten). */
bool loom__fsdp_low_on(const loom_fsdp *f);
bool loom__fsdp_low_readable(const fsdp_unit *u, loom_dtype dt);
size_t loom__fsdp_low_slot(const fsdp_unit *u, size_t c);
int loom__fsdp_low_put(fsdp_unit *u, size_t c, const float *src, size_t n, void *scratch,
                       unsigned flags, uint64_t *job);
void loom__fsdp_low_drop(loom_fsdp *f);

/* fsdp_stream.c: the optimizer step of one unit inside backward (cfg.optim_in_backward), its
 * gradient at `grad` (reduced), at the step count the backward's first unit took; its gradient
 * then goes nowhere (with gradients offloaded, the unit holds none). And the end of that
 * backward's steps (`ok`: every unit stepped, loom_fsdp_optim_step has nothing to do). */
int loom__fsdp_step_unit(fsdp_unit *u, float *grad);
int loom__fsdp_step_close(loom_fsdp *f, bool ok);

/* fsdp_stream.c: the optimizer's pass detached from the rank's thread, for fsdp_async.c.
 * loom__fsdp_pass_settle: the transfers in flight that the pass reads or rewrites, landed (on
 * the rank's thread, before the step begins). loom__fsdp_pass_switch: every unit's written
 * kinds switch to the slot set the pass writes (and the low-precision copy counts as current)
 * at once, on the rank's thread, each unit's switched kinds recorded in flipped[unit] (a mask
 * of 1 << OFF_*); loom__fsdp_pass_unswitch undoes exactly that (a failed pass).
 * loom__fsdp_pass_run: the pass itself, on any thread, with the step's scalars in d->snap: it
 * reads the old slot sets, writes the new ones, touches no flag of the wrapper, and calls
 * d->published(d->ctx, n) as units [0, n) have their new bytes on the tier; its transfer waits
 * add up in d->wait_s. */
typedef struct loom__fsdp_detached {
  loom__optim_snap *snap;
  size_t per;          /* the optimizer's state buffers per segment */
  double wait_s;
  void (*published)(void *ctx, size_t units);
  void *ctx;
  /* a dry run (loom plan): the pass runs within the call, its chunk ring handed over here
   * instead of freed (ring[0..nring)), so the plan's peak holds it beside the forward as a
   * real run's does; fsdp_async.c frees it when the forward reaches the last unit */
  bool keep_ring;
  void *ring[4 * OFF_KINDS];
  size_t nring;
} loom__fsdp_detached;
int loom__fsdp_pass_settle(loom_fsdp *f, loom_optim *opt);
void loom__fsdp_pass_switch(loom_fsdp *f, loom_optim *opt, uint8_t *flipped);
void loom__fsdp_pass_unswitch(loom_fsdp *f, const uint8_t *flipped);
int loom__fsdp_pass_run(loom_fsdp *f, loom__fsdp_detached *d);

/* fsdp_async.c: the offloaded optimizer step behind the next forward.
 * loom__fsdp_async_wanted: loom_fsdp_optim_step runs its pass so (cfg.offload.async_step, the
 * disk tier, the optimizer's state offloaded or none, not a dry run).
 * loom__fsdp_step_launch: decide the step now (settle, loom_optim_step_begin, the scalars
 * copied, the slot sets switched) and start the pass on its thread; its errors are the call's.
 * loom__fsdp_step_ready: wait until unit u is stepped (LOOM_OK at once with no pass pending),
 * on any thread, changing nothing; the pass's failure if it failed before reaching u (its
 * message); `exposed`: the time counts as the rank's exposed transfer wait.
 * loom__fsdp_step_done: whether step_ready would return at once (no pass pending, the unit
 * stepped, or the pass over): the forward's prefetches are issued only then, so the rank
 * computes the unit it has while the pass steps the next one.
 * loom__fsdp_step_join: wait for the whole pass (rank's thread): LOOM_OK with none pending, its
 * failure once (the slot sets switched back, the optimizer's step count set back), then none.
 * Every entry point that touches parameters, gradients or state other than a gather calls it.
 * loom__fsdp_step_failed: after a call failed with rc (a gather that read a unit the pass
 * failed to step), join so the pass's failure is reported once: its status, else rc. */
bool loom__fsdp_async_wanted(const loom_fsdp *f, size_t per);
int loom__fsdp_step_launch(loom_fsdp *f, loom_optim *opt, float grad_scale);
int loom__fsdp_step_ready(fsdp_unit *u, bool exposed);
bool loom__fsdp_step_done(const fsdp_unit *u);
int loom__fsdp_step_join(loom_fsdp *f);
int loom__fsdp_step_failed(loom_fsdp *f, int rc);

/* fsdp_stream.c: a pass over every unit's shards chunk by chunk. `read` and `write` are masks
 * of (1 << OFF_*); kinds in the compute pool are used in place, offloaded ones stream through
 * chunk buffers (double buffered with prefetch on). fn gets pointers to n elements of each
 * kind in `read` (NULL for the others) at element `at` of unit u's shard. */
typedef int (*loom__fsdp_chunk_fn)(void *ctx, fsdp_unit *u, size_t at, size_t n, float *k[OFF_KINDS]);
int loom__fsdp_stream(loom_fsdp *f, loom_optim *opt, unsigned read, unsigned write,
                      loom__fsdp_chunk_fn fn, void *ctx);
/* The same over parameters and gradients, with or without offload (without: one call per unit
 * over its whole shard). */
int loom__fsdp_each(loom_fsdp *f, unsigned read, unsigned write, loom__fsdp_chunk_fn fn,
                    void *ctx);

#endif
