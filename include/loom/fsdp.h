/* loom/fsdp.h: fully sharded data parallelism (FSDP / ZeRO-3) with mixed precision.
 *
 * Every rank builds the same model (whole, or deferred: only its shards are then ever made,
 * see loom_fsdp_create); loom_fsdp_create cuts it into sharding units and keeps, on each rank,
 * only a contiguous 1/N of each unit's parameters, gradients and optimizer state:
 *   - a unit is a module of the tree (by default each child of the model's first Sequential
 *     that holds parameters: PyTorch's per-layer auto-wrap; or a size policy, or a list of
 *     module names). Its parameters, laid out as in the module's arena (PyTorch order, 64-byte
 *     aligned), form one flat f32 parameter, padded with zeros to a multiple of the world size;
 *     rank r keeps elements [r*S, (r+1)*S) of it, S = padded / N (the shard);
 *   - before a unit runs forward, its shard is cast to the forward dtype (f32, or the mixed
 *     precision forward dtype: cast first, so half the bytes travel) and all-gathered into a
 *     buffer the unit's parameters then view (their dtype is the forward dtype while gathered);
 *     after the unit, the buffer is freed (reshard after forward, the default) and the
 *     parameters hold no data: an op given one fails with LOOM_EMISUSE naming it, never reads
 *     freed memory. The next unit's gather is issued before the current unit computes
 *     (forward_prefetch gathers in flight);
 *   - backward runs the units in reverse: a hook on the unit's output gathers it again (and
 *     prefetches the unit before it), the unit's gradients accumulate in f32 into a full
 *     gradient buffer (loom's autograd delivers f32 gradients, so a low-precision forward
 *     loses nothing here), and when the unit's last gradient is complete that buffer is
 *     reduce-scattered, averaged over ranks, into this rank's f32 gradient shard,
 *     asynchronously: unit k's reduce-scatter overlaps unit k-1's backward. The end of
 *     backward waits for the last one (or call loom_fsdp_finish);
 *   - the optimizer runs on the shards only: loom_fsdp_segments gives one loom_param_seg per
 *     unit (shard values, shard gradient), for loom_optim_create_*.
 * The forward order of the units must be the order they were wrapped in (a Sequential's);
 * a parameter belongs to one unit and is used by that unit only.
 *
 * Mixed precision follows the specification fsdp-mixed-precision (FSDPMixedPrecisionConfig,
 * FSDPMixedPrecisionManager, FSDPAmpIntegration); each of its members has a C name here:
 *   FSDPMixedPrecisionConfig            loom_fsdp_mp_cfg, _default, _validate
 *   FSDPMixedPrecisionManager           loom_fsdp_mp (create, free)
 *     ConvertToMixedPrecision           loom_fsdp_mp_convert_to_mixed_precision
 *     ConvertGradientToFP32             loom_fsdp_mp_convert_gradient_to_fp32
 *     ScaleLoss                         loom_fsdp_mp_scale_loss
 *     CheckOverflow                     loom_fsdp_mp_check_overflow
 *     CurrentLossScale                  loom_fsdp_mp_current_loss_scale
 *     ResetLossScale                    loom_fsdp_mp_reset_loss_scale
 *   FSDPAmpIntegration                  the loom_fsdp object itself (cfg.mp)
 *     ApplyMixedPrecision               loom_fsdp_apply_mixed_precision
 *     ApplyGradientFP32                 loom_fsdp_apply_gradient_fp32
 *     ScaleLoss                         loom_fsdp_scale_loss
 *     CheckOverflow                     loom_fsdp_check_overflow (global over ranks)
 *     Manager                           loom_fsdp_mp_manager
 * The loss scale is loom's dynamic scaler (loom/amp.h) configured with the specification's
 * values; there is no second copy of its rule.
 *
 * Ownership: loom_fsdp borrows the module and the process group, which must outlive it (and so
 * must the autograd graphs of its forwards); loom_fsdp_free gives the parameters back without data
 * (call loom_fsdp_full_state first to keep the values). Errors: status codes with a message
 * (loom_last_error). Threads: one loom_fsdp is used by the thread of its rank; its
 * collectives go through the process group in issue order. */
#ifndef LOOM_FSDP_H
#define LOOM_FSDP_H

#include "loom/amp.h"
#include "loom/dist.h"
#include "loom/io.h"
#include "loom/nn.h"
#include "loom/optim.h"
#include "loom/tensor.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- mixed precision: the specification's configuration ---------------------------------- */

typedef struct loom_fsdp_mp_cfg {
  bool enabled;                     /* Enabled; default true */
  loom_dtype forward_dtype;         /* ForwardDType: LOOM_F16 (default) or LOOM_BF16 */
  loom_dtype backward_dtype;        /* BackwardDType: must be LOOM_F32 (default) */
  bool use_loss_scaling;            /* UseLossScaling; default true */
  float initial_loss_scale;         /* InitialLossScale; default 2 */
  float min_loss_scale;             /* MinLossScale; default 1 */
  float max_loss_scale;             /* MaxLossScale; default 65536 */
  float loss_scale_growth_factor;   /* LossScaleGrowthFactor; default 2 */
  float loss_scale_backoff_factor;  /* LossScaleBackoffFactor; default 0.5 */
  int64_t loss_scale_steps;         /* LossScaleSteps: clean steps before growth; default 2000 */
} loom_fsdp_mp_cfg;

/* The specification's defaults (above). */
loom_fsdp_mp_cfg loom_fsdp_mp_cfg_default(void);
/* The defaults for a forward dtype: f16 as above; bf16 without loss scaling (bf16 has f32's
 * range: nothing underflows that f32 would keep). Any other dtype: enabled = false. */
loom_fsdp_mp_cfg loom_fsdp_mp_cfg_for(loom_dtype forward_dtype);
/* LOOM_OK, or LOOM_EINVAL naming the field: the specification's rules (forward dtype f16 or
 * bf16; backward dtype f32; initial scale within [min, max]) and, with loss scaling on, the
 * dynamic scaler's (every value finite, min > 0, growth > 1, backoff in (0, 1), steps >= 1).
 * A disabled configuration is valid whatever its other fields hold. */
int loom_fsdp_mp_cfg_validate(const loom_fsdp_mp_cfg *cfg);

/* ---- mixed precision: the manager --------------------------------------------------------- */

typedef struct loom_fsdp_mp loom_fsdp_mp;

/* Validates cfg (copied) and starts the loss scale at initial_loss_scale. */
int loom_fsdp_mp_create(const loom_fsdp_mp_cfg *cfg, loom_fsdp_mp **out);
void loom_fsdp_mp_free(loom_fsdp_mp *m);
const loom_fsdp_mp_cfg *loom_fsdp_mp_config(const loom_fsdp_mp *m);

/* *out = t in the forward dtype (a new tensor, rounded to nearest even), or t itself retained
 * when it already has that dtype or mixed precision is disabled. LOOM_EINVAL for NULL. */
int loom_fsdp_mp_convert_to_mixed_precision(const loom_fsdp_mp *m, loom_tensor *t,
                                            loom_tensor **out);
/* *out = grad in f32 (exact), or grad retained when it is f32 already. */
int loom_fsdp_mp_convert_gradient_to_fp32(const loom_fsdp_mp *m, loom_tensor *grad,
                                          loom_tensor **out);
/* *out = loss x the current scale (a new tensor on the tape), or loss retained without loss
 * scaling. */
int loom_fsdp_mp_scale_loss(loom_fsdp_mp *m, loom_tensor *loss, loom_tensor **out);
/* The specification's CheckOverflow: *overflow = some element of grads[0..n) (NULL entries
 * skipped) is NaN or infinite; then the scale backs off (times backoff, not below min) or,
 * after loss_scale_steps clean steps, grows (times growth, not above max). Without loss
 * scaling: *overflow = false and nothing changes. */
int loom_fsdp_mp_check_overflow(loom_fsdp_mp *m, loom_tensor *const *grads, size_t n,
                                bool *overflow);
/* Record a decision already made (a flag combined over ranks): the same update as above. */
int loom_fsdp_mp_update(loom_fsdp_mp *m, bool overflow);
/* The scale (1 without loss scaling). */
float loom_fsdp_mp_current_loss_scale(const loom_fsdp_mp *m);
/* Back to the initial scale with the clean-step count at zero. */
int loom_fsdp_mp_reset_loss_scale(loom_fsdp_mp *m);
/* The dynamic scaler behind the scale (borrowed; NULL without loss scaling): statistics,
 * checkpoint state (loom_scaler_save / _restore). */
loom_scaler *loom_fsdp_mp_scaler(loom_fsdp_mp *m);

/* ---- offload: the specification's configuration (fsdp-cpu-offload) --------------------- */

/* Offload moves a unit's shards out of the compute pool (what kernels touch; a device build's
 * memory) to a lower tier while the unit is not in use, and back before it is. Each member of
 * the specification has a C name:
 *   FSDPCpuOffloadConfig                loom_fsdp_offload_cfg, _default, _validate
 *   FSDPCpuOffloader                    the loom_fsdp object itself (cfg.offload)
 *     OffloadParameter, PrefetchParameter       loom_fsdp_offload_parameter, _prefetch_parameter
 *     OffloadGradient, PrefetchGradient         loom_fsdp_offload_gradient, _prefetch_gradient
 *     OffloadOptimizerState, PrefetchOptimizerState
 *                                       loom_fsdp_offload_optimizer_state, _prefetch_...
 *     State.IsOffloaded                 loom_fsdp_is_offloaded (one flag per kind of bytes)
 *     CpuOffloadBuffer                  the store's slots, made on first use and reused
 *   FSDPPrefetchManager                 a worker thread with a queue, one per wrapper
 *     SchedulePrefetch                  loom_fsdp_schedule_prefetch
 *     ExecutePrefetchAsync              nothing to call: a transfer starts as soon as it is
 *                                       scheduled and the worker is free (not after 10 ms);
 *                                       loom_fsdp_prefetch_wait waits for what is scheduled
 *     Clear                             loom_fsdp_prefetch_clear
 * Tiers: LOOM_FSDP_TIER_HOST keeps the bytes in host-pool buffers (a copy; on a CPU-only
 * machine the process's memory stays the same, the compute pool's peak drops);
 * LOOM_FSDP_TIER_DISK (beyond the specification: DeepSpeed ZeRO-Infinity's NVMe tier) keeps
 * them in one file per rank in `dir`, which really cuts the process's memory.
 * Bytes move in chunks of chunk_bytes, each with its size and (disk) CRC-32C. */
typedef enum loom_fsdp_tier { LOOM_FSDP_TIER_HOST = 0, LOOM_FSDP_TIER_DISK = 1 } loom_fsdp_tier;

typedef struct loom_fsdp_offload_cfg {
  bool enabled;                  /* Enabled; default true */
  bool offload_optimizer_states; /* OffloadOptimizerStates; default true */
  bool offload_gradients;        /* OffloadGradients: each gradient shard leaves once it is
                                    reduce-scattered, its write queued ahead of the gathers'
                                    reads for later units (LOOM_FSDP_GRAD_FIRST=0: in order);
                                    written before the next unit's backward starts, or with
                                    LOOM_FSDP_GRAD_OVERLAP=1 while it computes (faster, about
                                    one shard more resident). With the allocator cache off
                                    (LOOM_ALLOC_CACHE_MB=0) or that overlap, the local
                                    gradient's pages are given back as it leaves: the peers'
                                    slices at once, its own as its chunks land; default true */
  bool offload_parameters;       /* OffloadParameters: each parameter shard leaves once its
                                    gather is done; default true */
  bool prefetch_parameters;      /* PrefetchParameters: read each gather's part out of the
                                    tier as the all-gather's first step, beside the compute of
                                    the unit before (and, under mixed precision on the disk tier
                                    without a current low-precision copy, bring the f32 shard
                                    back prefetch_steps units ahead to be cast); false: when
                                    needed, waiting; default true */
  bool prefetch_gradients;       /* PrefetchGradients: stream gradients and optimizer state
                                    into the step ahead of it (double buffered); default true */
  int prefetch_steps;            /* PrefetchSteps: units ahead, 0..10 (0: no prefetch at all);
                                    default 1 */
  loom_fsdp_tier tier;           /* default LOOM_FSDP_TIER_HOST */
  const char *dir;               /* the disk tier's folder (borrowed; copied by create) */
  size_t chunk_bytes;            /* transfer unit: a multiple of 64 (16 floats: clipping's norm
                                    keeps its summation lanes); default 4 MiB */
  int io_threads;                /* transfers in flight at once per rank, each on an I/O
                                    thread of its own, 0..16; 0 (default): 4 on the disk tier,
                                    1 on the host tier */
  bool low_precision_params;     /* with mixed precision (a f16 / bf16 forward) and parameters
                                    offloaded: keep a copy of each parameter shard in the
                                    forward dtype in the tier, cast once per step as the
                                    optimizer step writes the f32 shard, and let the gathers
                                    read it instead of the f32 shard (half the bytes, no cast;
                                    the same bits: a gather casts to that dtype anyway). Costs
                                    half the parameter shard's bytes more in the tier. Ignored
                                    without mixed precision. Default true */
  bool async_step;               /* the disk tier: loom_fsdp_optim_step decides the step and
                                    returns, its chunked pass runs on a thread of its own
                                    behind the next forward, unit by unit in the forward's
                                    order (see loom_fsdp_optim_step); false: the pass runs
                                    within the call. LOOM_FSDP_ASYNC_STEP=0 or 1 in the
                                    environment overrides it. Ignored on the host tier (its
                                    pass works on the tier's buffers in place) and with the
                                    optimizer's state not offloaded. Default false: under
                                    the loads measured so far it was not faster (BENCHMARKS.md,
                                    "The disk tier's optimizer step behind the next forward") */
} loom_fsdp_offload_cfg;

/* The specification's defaults (above). */
loom_fsdp_offload_cfg loom_fsdp_offload_cfg_default(void);
/* LOOM_EINVAL naming the field: prefetch_steps within 0..10 (the specification's rule), a tier,
 * a folder for the disk tier, chunk_bytes, io_threads. A disabled configuration is valid whatever it holds. */
int loom_fsdp_offload_cfg_validate(const loom_fsdp_offload_cfg *cfg);

/* ---- FSDP configuration ---------------------------------------------------------------- */

typedef enum loom_fsdp_wrap {
  LOOM_FSDP_WRAP_CHILDREN = 0, /* each child of the first Sequential that holds parameters */
  LOOM_FSDP_WRAP_SIZE = 1,     /* modules in order; a unit closes at min_unit_numel elements */
  LOOM_FSDP_WRAP_LIST = 2,     /* the modules named in unit_names, in their order */
} loom_fsdp_wrap;

typedef struct loom_fsdp_cfg {
  loom_fsdp_wrap wrap;          /* default LOOM_FSDP_WRAP_CHILDREN */
  size_t min_unit_numel;        /* WRAP_SIZE: default 100000000 (PyTorch's size policy) */
  const char *const *unit_names; /* WRAP_LIST: module names ("layers.0"), borrowed */
  size_t n_unit_names;
  bool reshard_after_forward;   /* default true (FULL_SHARD); false keeps each unit gathered
                                   from its forward to its backward (SHARD_GRAD_OP, ZeRO-2) */
  int forward_prefetch;         /* gathers issued ahead of the running unit in forward, 0..8;
                                   default 1 */
  int backward_prefetch;        /* the same in backward; default 1 */
  bool broadcast_params;        /* start from rank 0's values (sync_module_states); default
                                   true. Nothing to broadcast for a deferred model: every rank
                                   makes its shard from the same initialisers */
  bool limit_reduce_scatters;   /* a unit's local gradient is made only once the previous
                                   unit's reduce-scatter has completed (it runs while that unit
                                   computes its input's gradient): one local gradient at a
                                   time. Default true (memory is FSDP's measure); false lets
                                   reduce-scatters queue up behind backward */
  loom_fsdp_mp_cfg mp;          /* the specification's defaults with enabled = false: FSDP
                                   runs in f32 unless asked (PyTorch's mixed_precision=None) */
  loom_fsdp_offload_cfg offload; /* the specification's defaults with enabled = false (PyTorch's
                                   cpu_offload=None) */
  /* Hybrid sharding (PyTorch's HYBRID_SHARD, ZeRO++'s hpZ): NULL (default) is plain FSDP over
   * the group given to loom_fsdp_create. Otherwise that group is the shard group (the ranks
   * that share one copy of the model, e.g. one machine's) and replica_pg, borrowed, the ranks
   * that hold the same shard in the other copies (every shard group has the same size, and
   * shard rank s of each copy forms one replica group: loom_pg_split of the world with colors
   * rank / shard_size and rank % shard_size). Each unit's gradient is reduce-scattered (averaged)
   * within the shard group, then its shard all-reduced (averaged) over the replica group, so
   * each shard holds the average over all ranks (the shard group's bytes over the fast links,
   * 1/shard_size of them over the slow ones); the all-reduce starts as soon as the
   * reduce-scatter completes, on the replica group's progress thread, and overlaps backward as
   * the reduce-scatter does. With broadcast_params, every copy starts from world rank 0's
   * values (shard rank 0, replica rank 0). loom_fsdp_any and the overflow check combine over
   * both groups; clipping needs the shard group only (replicas hold the same shards). The full
   * state comes to shard rank 0 of replica 0 only; a sharded checkpoint is written by replica
   * 0's shard group alone (an FSDP checkpoint of shard_size ranks, which FSDP or HSDP at any
   * rank count resume: loom_fsdp_load_sharded reshards), its outcome shared with every rank. */
  loom_pg *replica_pg;
  /* The optimizer step inside backward (PyTorch's optimizer-in-backward): each unit's shard is
   * stepped by the optimizer given to loom_fsdp_set_optim right after its gradient is
   * reduce-scattered, so a gradient never waits for the others (and with offload never goes to
   * the tier and back); loom_fsdp_optim_step after such a backward only checks and prefetches.
   * The same bits as the step after backward, with a learning rate set before backward. Only
   * where nothing needs the whole gradient first: refused (LOOM_EINVAL) with dynamic loss
   * scaling (mp.use_loss_scaling), and loom_fsdp_clip_grad_norm refuses after such a backward
   * (LOOM_EMISUSE). A unit's reduce-scatter starts as soon as its parameters have their
   * gradients, before backward has computed the unit's input gradient from them, so a peer may
   * still read a unit a rank steps: on the threads backend such a wrapper's shards are not the
   * slices of the unit's shared gathered buffer (loom_fsdp_gather_unit), each gather copies the
   * rank's shard in. Default false. */
  bool optim_in_backward;
} loom_fsdp_cfg;

loom_fsdp_cfg loom_fsdp_cfg_default(void);
/* LOOM_EINVAL naming the field (the mixed precision rules included when mp.enabled). */
int loom_fsdp_cfg_validate(const loom_fsdp_cfg *cfg);

/* ---- the wrapper ------------------------------------------------------------------------- */

typedef struct loom_fsdp loom_fsdp;

/* Wrap `module` (a root module whose parameters are all f32) for this rank of pg. All ranks
 * compare what they wrap (unit count, then each parameter's name, dtype and shape in order:
 * LOOM_EMISUSE / LOOM_EDTYPE / LOOM_ESHAPE naming the first difference, on every rank), take
 * rank 0's values (cfg.broadcast_params), keep their shard and give the module's arenas back:
 * from here on the module's parameters hold data only while their unit is gathered, and
 * loom_module_arena has none. cfg NULL: the defaults.
 *
 * Sharded construction: a module built with deferred initialisation (loom_nn_set_deferred_init,
 * loom/nn.h; PyTorch's meta-device module given to FSDP, DeepSpeed's zero.Init) holds no
 * parameter memory; each rank then makes only its shard of each unit, from the parameters'
 * initialisers (counter-based: the shard's values are the same slice of the model built whole,
 * bit for bit), so no rank ever holds the whole model and building costs no more than the
 * shards. Every rank must build the model deferred, with the same seed: LOOM_EMISUSE on every
 * rank if one is deferred and another is not, or if their initialisers differ. The module is no
 * longer deferred once wrapped (loom_module_deferred false). Load other values afterwards with
 * loom_fsdp_load_full_state (each rank copies its slice only). */
int loom_fsdp_create(loom_pg *pg, loom_module *module, const loom_fsdp_cfg *cfg,
                     loom_fsdp **out);
void loom_fsdp_free(loom_fsdp *f);

size_t loom_fsdp_unit_count(const loom_fsdp *f);

typedef struct loom_fsdp_unit_info {
  const char *name;      /* the unit's module name ("layers.0"; "" for the root), borrowed */
  size_t first_param;    /* its parameters: loom_module_param(module, first_param + k) */
  size_t nparams;
  size_t numel;          /* elements of the flat parameter (alignment gaps included) */
  size_t padded_numel;   /* numel rounded up to a multiple of the world size */
  size_t shard_numel;    /* padded_numel / world size */
  size_t shard_offset;   /* this rank's first element of the flat parameter */
  bool gathered;         /* its parameters hold data now */
  loom_dtype gathered_dtype;
} loom_fsdp_unit_info;

int loom_fsdp_unit_info_get(const loom_fsdp *f, size_t unit, loom_fsdp_unit_info *out);

/* One segment per unit: this rank's f32 shard of the flat parameter and of its averaged
 * gradient ("<unit>.flat_param"; "flat_param" for a root unit). *segs is borrowed, valid
 * while f lives. Give them to loom_optim_create_* : the optimizer state is sharded too. With
 * offload, the buffers that live in the tier are NULL and the segment is LOOM_SEG_STREAMED:
 * step with loom_fsdp_optim_step (which works for every wrapper). */
int loom_fsdp_segments(const loom_fsdp *f, const loom_param_seg **segs, size_t *n);

/* Gather unit's parameters on every rank in dtype dt (LOOM_F32, or a forward dtype: the shard
 * is cast first) and point the parameters at them; LOOM_OK at once if already gathered in dt.
 * A collective: every rank calls it. Gathered parameters are read-only: on the threads backend
 * the ranks' f32 parameters (without mixed precision or offload) view one buffer per unit
 * whose slices are the ranks' parameter shards themselves, so a gather copies nothing (it
 * waits for every rank to issue it) and costs no memory beyond the shards
 * (LOOM_FSDP_SHARE_GATHERS=0 in the environment: one buffer per rank, each gather a copy).
 * There a rank's shard (the optimizer step, loading state) is written while its peers may
 * still read the unit unless a collective separates the two: as in every training step, write
 * the shards after loom_fsdp_finish (which, with sync on and shared shards, ends with a barrier:
 * a peer may still compute an input gradient from a unit it already reduced), never between a
 * forward and the next finish (loom_fsdp_full_state ends with a barrier, so a load may follow
 * it). Not with cfg.optim_in_backward, which steps each
 * unit before finish: its shards are the rank's own and a gather copies them. With offload
 * (f32, no mixed precision) the ranks share the gathered buffers too, each reading its part
 * out of its tier straight into its slice: one gathered unit per process, not per rank. */
int loom_fsdp_gather_unit(loom_fsdp *f, size_t unit, loom_dtype dt);
/* Free the gathered parameters (the parameters hold no data again). Not a collective. */
int loom_fsdp_reshard_unit(loom_fsdp *f, size_t unit);

/* Gradient accumulation (PyTorch's no_sync): while sync is off, backward keeps each unit's
 * full f32 gradient on this rank and adds to it, with no communication; the next backward
 * with sync on adds its gradients and reduce-scatters the sum. */
int loom_fsdp_set_sync(loom_fsdp *f, bool sync);

/* Wait until every unit's gradient shard holds this backward's averaged gradient (backward
 * calls it when it ends; calling it again returns that status). LOOM_EMISUSE names a unit
 * whose gradients were not all produced on a rank. */
int loom_fsdp_finish(loom_fsdp *f);

/* A flag true on any rank (one all-reduce, MAX; a second over cfg.replica_pg with hybrid
 * sharding). */
int loom_fsdp_any(loom_fsdp *f, bool local, bool *global);

/* Global gradient-norm clipping over the shards (PyTorch's FSDP.clip_grad_norm_), with
 * loom_clip_grad_norm's rule (loom/optim.h: the norm, the coefficient, NaN / inf / max_norm 0,
 * error_if_nonfinite): each rank sums its shards' squares (streamed chunk by chunk when
 * offloaded, the same bits), one collective adds the sums over the ranks (in rank order, so
 * every rank gets the same bits and the same status), then the same coefficient and scaling.
 * *total_norm (may be NULL) gets the norm before clipping. A collective: every rank calls it
 * with the same max_norm and error_if_nonfinite. */
int loom_fsdp_clip_grad_norm(loom_fsdp *f, double max_norm, bool error_if_nonfinite,
                             double *total_norm);

/* ---- mixed precision integration (the specification's FSDPAmpIntegration) ---------------- */

/* The manager made from cfg.mp (borrowed; NULL when mixed precision is disabled). */
loom_fsdp_mp *loom_fsdp_mp_manager(loom_fsdp *f);
/* ApplyMixedPrecision: convert the unit's gathered parameters to the forward dtype (a no-op
 * when gathered in it already). LOOM_EMISUSE if the unit is not gathered. */
int loom_fsdp_apply_mixed_precision(loom_fsdp *f, size_t unit);
/* ApplyGradientFP32: make the unit's local (full, unreduced) gradient f32 before it is
 * reduce-scattered. loom's autograd already accumulates it in f32, so this checks that it is
 * and converts otherwise. LOOM_EMISUSE if the unit has no local gradient (outside its
 * backward, unless gradients are being accumulated with sync off). */
int loom_fsdp_apply_gradient_fp32(loom_fsdp *f, size_t unit);
/* ScaleLoss: loss x the current scale (loss retained when there is no loss scaling). */
int loom_fsdp_scale_loss(loom_fsdp *f, loom_tensor *loss, loom_tensor **out);
/* CheckOverflow, after loom_fsdp_finish: unscale this rank's gradient shards (x 1/scale,
 * exactly: the scale is a power of two), check them for NaN / inf, combine the flag over the
 * ranks (one all-reduce, MAX: every rank skips the same step) and update the scale. Without
 * loss scaling the shards are still checked and the flag combined (an optimizer step on a
 * non-finite gradient is never wanted). */
int loom_fsdp_check_overflow(loom_fsdp *f, bool *overflow);

/* ---- offload (cfg.offload) ------------------------------------------------------------- */

/* With offload on, the step's bytes live in the tier between uses:
 *   - parameter shards are put there by create and each gather reads its own part straight
 *     out of the tier into the gathered buffer (the disk tier's I/O threads, the host tier's
 *     buffers, cast there under mixed precision; or the low-precision copy, cfg.offload.
 *     low_precision_params), with no shard brought back first (on a CPU that would be a second
 *     copy, taking its cycles from the computation, and a shard in the compute pool); only
 *     under mixed precision on the disk tier without a current copy does the f32 shard come
 *     back, prefetch_steps units ahead, to be cast;
 *   - gradient shards leave (asynchronously) as each reduce-scatter completes;
 *   - the optimizer's state never needs to be whole in the compute pool: the optimizer step
 *     (loom_fsdp_optim_step) streams every unit's parameters, gradients and state through a
 *     few chunk buffers, reading chunk k+1 and writing chunk k-1 while chunk k steps; on the
 *     disk tier it does so on a thread of its own behind the next forward (async_step).
 * Offload moves bytes and nothing else: every result is bit-identical to the same run without
 * it. A run with offload steps through loom_fsdp_optim_step (the optimizer made from
 * loom_fsdp_segments, whose offloaded buffers are marked LOOM_SEG_STREAMED: loom_optim_step
 * refuses them); give the optimizer state_pool LOOM_POOL_HOST so its state never passes through
 * the compute pool on its way to the tier. Checkpoints and the full state bring one rank's
 * shards back for their duration. Errors of the tier (a folder missing, read-only or full, a
 * file changed behind loom's back) name the path; a transfer that fails in the background comes
 * back to the call that needed it. The disk tier's files are removed by loom_fsdp_free. */

typedef enum loom_fsdp_offload_kind {
  LOOM_FSDP_OFFLOAD_PARAMS = 0,
  LOOM_FSDP_OFFLOAD_GRADS = 1,
  LOOM_FSDP_OFFLOAD_OPTIM = 2,
} loom_fsdp_offload_kind;

/* The specification's offloader. Each returns LOOM_OK doing nothing in its no-op cases:
 * offload disabled (cfg.offload.enabled false, or that kind's offload_* flag false; for the
 * prefetches, that kind's prefetch_* flag false or prefetch_steps 0), already offloaded (an
 * offload) or not offloaded (a prefetch), nothing to move (a gradient no backward has made yet;
 * an optimizer with no state). An offload copies the unit's bytes to the tier (unless the
 * tier's copy is current) and frees them in the compute pool; a prefetch starts bringing them
 * back on the worker and returns: whoever uses them next waits for them. LOOM_EINVAL for a unit
 * out of range, LOOM_EMISUSE during a backward; an optimizer that is not over this wrapper's
 * segments (loom_fsdp_segments) is LOOM_EINVAL. */
int loom_fsdp_offload_parameter(loom_fsdp *f, size_t unit);
int loom_fsdp_prefetch_parameter(loom_fsdp *f, size_t unit);
int loom_fsdp_offload_gradient(loom_fsdp *f, size_t unit);
int loom_fsdp_prefetch_gradient(loom_fsdp *f, size_t unit);
int loom_fsdp_offload_optimizer_state(loom_fsdp *f, loom_optim *opt, size_t unit);
int loom_fsdp_prefetch_optimizer_state(loom_fsdp *f, loom_optim *opt, size_t unit);
/* The unit's bytes of that kind are in the tier, not in the compute pool (false without
 * offload, for a unit out of range, and for optimizer state before it was first offloaded). */
bool loom_fsdp_is_offloaded(const loom_fsdp *f, size_t unit, loom_fsdp_offload_kind kind);

/* The prefetch manager: schedule the parameters (forward true) or the gradients (forward false)
 * of units[0..n) to come back, in that order. A no-op with prefetch_steps 0 (the
 * specification's rule). The hooks and loom_fsdp_optim_step schedule by themselves (parameters
 * on the disk tier only: the host tier's gathers read the tier's buffers); this is for callers
 * that drive units by hand. */
int loom_fsdp_schedule_prefetch(loom_fsdp *f, const size_t *units, size_t n, bool forward);
/* Wait until everything scheduled has arrived: the first failure of a transfer, naming it. */
int loom_fsdp_prefetch_wait(loom_fsdp *f);
/* Drop the scheduled transfers that have not started (their units stay offloaded). */
void loom_fsdp_prefetch_clear(loom_fsdp *f);

/* The optimizer step over the shards, with every gradient multiplied by grad_scale as it is
 * loaded (1: plain; see loom_optim_step_scaled). Without offload it is
 * loom_optim_step_scaled(opt, grad_scale). With it, parameters, gradients and state stream
 * through the compute pool in chunks; bit-identical to the step without offload. Fails before
 * any parameter changes if a chunk cannot be read; opt must be over this wrapper's segments.
 *
 * On the disk tier with cfg.offload.async_step (the optimizer's state offloaded)
 * the call checks and decides the step (grad_scale, the learning rate and the step count are
 * fixed here: the optimizer may be given the next step's learning rate at once) and returns;
 * the chunked pass runs on a thread of its own, unit by unit in the forward's order, behind
 * the next forward: that forward's gather of a unit waits only until the unit is stepped, so
 * the step's disk traffic overlaps the forward's compute. Every other call of this wrapper
 * that touches parameters, gradients or optimizer state (the next backward, clipping, the
 * overflow check, checkpoints and the full state, the offload and prefetch calls, another
 * loom_fsdp_optim_step, loom_fsdp_free) first waits for the whole pass, and so does
 * loom_fsdp_optim_wait. A pass that fails (a file changed behind loom's back, a disk that
 * fills) changes nothing: the pass writes the tier's other slot set only, so the weights and
 * state stay as they were before the step, and the optimizer's step count is set back; its
 * error, naming the problem, is returned once, by the first call that waits (a forward then
 * fails at the first unit the pass did not step, or at the backward). opt may be freed right
 * after the call (the pass has its own copy of the step's scalars; the wrapper holds opt until
 * the pass is waited for, only to set its step count back if it fails). */
int loom_fsdp_optim_step(loom_fsdp *f, loom_optim *opt, float grad_scale);

/* Wait until the pass of the last loom_fsdp_optim_step has ended (LOOM_OK at once when none is
 * running: no offload, the host tier, async_step off): its failure if it failed, with its
 * message. The wrapper's other calls wait by themselves; this is for code that reads the
 * optimizer or the tier directly, or times a step. */
int loom_fsdp_optim_wait(loom_fsdp *f);

/* The optimizer that steps each unit inside backward (cfg.optim_in_backward), borrowed: it must
 * outlive its use or be replaced (NULL: none). Any wrapper takes one (it is used only with
 * optim_in_backward); LOOM_EINVAL if it is not over this wrapper's segments, LOOM_EMISUSE
 * during a backward. A backward with optim_in_backward and no optimizer fails with
 * LOOM_EMISUSE at its first hook. */
int loom_fsdp_set_optim(loom_fsdp *f, loom_optim *opt);
/* cfg.optim_in_backward of the wrapper (false for NULL). */
bool loom_fsdp_optim_in_backward(const loom_fsdp *f);

/* ---- checkpoints ------------------------------------------------------------------------ */

/* The full state dict: every unit gathered in f32 in turn and copied to rank 0 (a collective;
 * every rank calls it). On rank 0, *out is a new f32 tensor per parameter with its PyTorch
 * name (the names are the module's, borrowed), n = the module's parameter count; the caller
 * frees the tensors and the array with loom_fsdp_state_free. Other ranks get *out = NULL.
 * Hybrid sharding (cfg.replica_pg): only replica 0's shard group gathers; rank 0 is its shard
 * rank 0. */
int loom_fsdp_full_state(loom_fsdp *f, loom_named_tensor **out, size_t *n);
void loom_fsdp_state_free(loom_named_tensor *state, size_t n);
/* Set every parameter from a full state (on every rank; by name, shapes checked): each rank
 * copies its shard's part. */
int loom_fsdp_load_full_state(loom_fsdp *f, const loom_named_tensor *state, size_t n);

/* A sharded checkpoint in folder dir (a collective). Each rank writes
 * dir/gen-G/rank-R-of-N.safetensors with its parameter shards ("<unit>.flat_param"), the
 * optimizer's state for its segments (opt may be NULL), the optimizer's step count, the loss
 * scale and its rank, world size and generation; rank 0 then writes dir/fsdp-index.safetensors
 * (world size, generation, optimizer step, the units' names and lengths, every rank file's size
 * and CRC-32, and meta[0..nmeta), keys not starting
 * "fsdp.") and removes older generations. Every file is a loom checkpoint (CRC over all its
 * bytes, written atomically), and the index is the commit point: a save that dies before it
 * leaves the previous complete set in place, and the next save removes what it left (the
 * index's temporaries, `fsdp-index.safetensors.tmp.XXXXXX`, and every generation the index does
 * not name, with the rank files and temporaries in it), so one process group at a time may
 * save into dir. A failure on any rank fails the save on every rank (LOOM_EIO naming the rank
 * or the path). */
int loom_fsdp_save_sharded(loom_fsdp *f, const char *dir, const loom_optim *opt,
                           const loom_safetensors_meta_kv *meta, size_t nmeta);
/* Restore parameters, optimizer state and step count (opt may be NULL) and the loss scale from
 * a sharded checkpoint written with any number of ranks: each rank reads the parts of the old
 * shards its new shard covers (resharding). Units must match by name and length (LOOM_EINVAL
 * naming the unit); no index is LOOM_ENOTFOUND, a missing, truncated or changed file
 * LOOM_EFORMAT / LOOM_EIO naming it; so is a rank file of another rank, world, generation or
 * optimizer step than the index says (naming both values), or without a unit's shard of the
 * index's length; numbers in the metadata are read strictly (digits, no sign or leading zero, in
 * range); values that are not finite (or negative second moments) are refused. Nothing changes unless everything reads: every value is checked first, then read
 * straight to where it lives, with no copy of the rank's state (the files are mapped; offloaded
 * kinds go chunk by chunk into their tier, the disk tier's into its other slot set, switched
 * once all are in), so a run whose state is larger than its memory resumes under that memory.
 * With offloaded optimizer state, opt must be over loom_fsdp_segments (LOOM_EINVAL). A full
 * offload disk is LOOM_EIO naming its file, with nothing changed. Not a collective: a rank may
 * fail where others succeed (a corrupt file only some ranks read), so combine the outcome over
 * the ranks (loom_fsdp_any) before training on. */
int loom_fsdp_load_sharded(loom_fsdp *f, const char *dir, loom_optim *opt);
/* The metadata value `key` of dir/fsdp-index.safetensors into buf (LOOM_ENOTFOUND if absent,
 * LOOM_EINVAL if it does not fit in cap bytes). */
int loom_fsdp_sharded_meta(const char *dir, const char *key, char *buf, size_t cap);

/* ---- statistics ------------------------------------------------------------------------ */

typedef struct loom_fsdp_stats {
  size_t units;
  size_t shard_numel;       /* elements of this rank's shards, all units */
  uint64_t gathers;         /* all-gathers issued */
  uint64_t reduce_scatters; /* reduce-scatters issued */
  uint64_t gather_bytes;    /* bytes this rank received from all-gathers */
  uint64_t reduce_bytes;    /* bytes this rank sent into reduce-scatters */
  double comm_s;            /* issue-to-completion time of every collective, summed */
  double exposed_s;         /* time the compute waited for a gather or a reduce-scatter */
  uint64_t steps;           /* synchronised backward passes */
  /* offload (zero without it) */
  size_t offload_bytes;      /* bytes held in the tier now */
  uint64_t offload_to_bytes; /* bytes moved to the tier */
  uint64_t offload_from_bytes; /* bytes moved back */
  double offload_transfer_s; /* seconds the worker and synchronous transfers spent moving bytes */
  double offload_wait_s;     /* exposed: seconds the compute waited for a transfer */
  uint64_t offload_gathers_overlapped; /* gathers whose part was read out of the tier as the
                                        * all-gather's first step, on the group's progress
                                        * thread (prefetch on), beside the rank's compute */
  /* hybrid sharding (zero without cfg.replica_pg) */
  uint64_t replica_reduces; /* all-reduces of gradient shards over the replica group */
  uint64_t replica_bytes;   /* bytes this rank sent into them (its shards) */
  /* where exposed_s was spent: waiting for an all-gather (forward or backward), and at the end
   * of backward (loom_fsdp_finish) for the reduce-scatters and replica all-reduces still
   * running; the rest is the waits before a unit's backward for the previous unit's
   * reduce-scatter (limit_reduce_scatters) */
  double exposed_gather_s;
  double exposed_end_s;
} loom_fsdp_stats;

int loom_fsdp_stats_get(const loom_fsdp *f, loom_fsdp_stats *out);

#ifdef __cplusplus
}
#endif
#endif
