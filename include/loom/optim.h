/* loom/optim.h: optimizers over flat f32 buffers, gradient clipping, learning-rate schedules
 * and f32 master weights for low-precision parameters.
 *
 * Parameters and gradients live in flat f32 arenas (llm.c): an optimizer works on a list of
 * segments, each a (param, grad, n) pair of buffers of the same layout. A module's whole arena
 * is one segment, a DDP bucket is one, an FSDP shard is just a shorter one; nothing here knows
 * about modules or ranks.
 *
 * Formulas are PyTorch's (torch.optim.SGD, Adam, AdamW of PyTorch 1.13, single-tensor path),
 * computed in f32 with the hyper-parameters rounded to f32 as PyTorch does, and the per-step
 * scalars (bias corrections, step size) in double. Every CPU level (loom/cpu.h) gives the same
 * bits as the scalar reference, so a run is reproducible across machines.
 *
 * Ownership: an optimizer keeps (does not copy) the param and grad pointers of its segments;
 * they must stay valid until loom_optim_free or loom_optim_rebind. It owns its state buffers
 * (moments, momentum), one per segment and kind, allocated zeroed in the pool its config
 * names, unless a segment's state is released to the caller (loom_optim_release_state, for
 * offload). Segment names are copied.
 *
 * Errors: every fallible call returns a status with a message naming the function and the
 * fault; config validation names the bad field ("loom_adam_cfg: beta1 = 1 is outside [0, 1)").
 *
 * Threads: an optimizer is not thread-safe; one thread steps it. Different optimizers may be
 * stepped by different threads at once. The pure functions (schedules, clipping helpers on
 * disjoint buffers) are thread-safe. */
#ifndef LOOM_OPTIM_H
#define LOOM_OPTIM_H

#include "loom/alloc.h"
#include "loom/dtype.h"
#include "loom/tensor.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- segments ------------------------------------------------------------------------- */

/* Segment flags. */
#define LOOM_SEG_NO_DECAY 1u /* no weight decay on this segment (biases, norms) */
#define LOOM_SEG_STREAMED 2u /* its param / grad buffers live elsewhere (FSDP offload) and are
                              * given chunk by chunk (loom_optim_step_chunk): either may be NULL,
                              * and loom_optim_step / _scaled refuse the segment (LOOM_EMISUSE) */

/* One flat buffer of parameters and its gradient (same length, same layout). */
typedef struct loom_param_seg {
  const char *name;   /* names the segment's state ("<name>.exp_avg"); NULL: its index */
  float *param;       /* n parameters, updated in place by step */
  const float *grad;  /* n gradients, read by step (never written) */
  size_t n;           /* may be 0 */
  unsigned flags;     /* LOOM_SEG_* */
} loom_param_seg;

/* ---- configuration -------------------------------------------------------------------- */

/* torch.optim.SGD: d = g (+ wd*p); buf = momentum*buf + (1-dampening)*d (buf = d on the first
 * step); d = nesterov ? d + momentum*buf : buf; p -= lr*d. */
typedef struct loom_sgd_cfg {
  double lr;           /* >= 0; default 0.01 (PyTorch has no default) */
  double momentum;     /* >= 0; default 0 */
  double dampening;    /* default 0 */
  double weight_decay; /* >= 0, L2 added to the gradient; default 0 */
  bool nesterov;       /* needs momentum > 0 and dampening == 0; default false */
  bool maximize;       /* ascend instead of descend; default false */
  loom_pool state_pool; /* where the momentum buffer lives; default LOOM_POOL_COMPUTE */
} loom_sgd_cfg;

/* torch.optim.Adam / AdamW: m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g*g;
 * p -= (lr/bc1) * m / (sqrt(v)/sqrt(bc2) + eps), with bc_i = 1 - b_i^step. Adam adds
 * weight_decay*p to the gradient (L2); AdamW first multiplies p by 1 - lr*weight_decay. */
typedef struct loom_adam_cfg {
  double lr;           /* >= 0; default 1e-3 */
  double beta1;        /* in [0, 1); default 0.9 */
  double beta2;        /* in [0, 1); default 0.999 */
  double eps;          /* > 0; default 1e-8 */
  double weight_decay; /* >= 0; default 0 (Adam), 0.01 (AdamW) */
  bool maximize;       /* default false */
  loom_pool state_pool; /* where exp_avg and exp_avg_sq live; default LOOM_POOL_COMPUTE */
} loom_adam_cfg;

loom_sgd_cfg loom_sgd_cfg_default(void);
loom_adam_cfg loom_adam_cfg_default(void);  /* Adam: weight_decay 0 */
loom_adam_cfg loom_adamw_cfg_default(void); /* AdamW: weight_decay 0.01 */
/* LOOM_EINVAL with a message naming the first bad field (NaN included), else LOOM_OK. */
int loom_sgd_cfg_validate(const loom_sgd_cfg *cfg);
int loom_adam_cfg_validate(const loom_adam_cfg *cfg);

/* ---- optimizers ----------------------------------------------------------------------- */

typedef struct loom_optim loom_optim;

/* Create an optimizer over nseg segments (nseg may be 0; segs may be NULL then). (Over a
 * whole model: loom_adamw_create_for_module and its siblings in loom/step.h.) Every
 * segment with n > 0 needs non-NULL param and grad; names must be unique. State starts at
 * zero, step count 0. Retains the param/grad pointers (see above). */
int loom_optim_create_sgd(const loom_param_seg *segs, size_t nseg, const loom_sgd_cfg *cfg,
                          loom_optim **out);
int loom_optim_create_adam(const loom_param_seg *segs, size_t nseg, const loom_adam_cfg *cfg,
                           loom_optim **out);
int loom_optim_create_adamw(const loom_param_seg *segs, size_t nseg, const loom_adam_cfg *cfg,
                            loom_optim **out);
/* NULL ok. The optimizer is unusable from here on; a step of it still running inside loom
 * (an offloaded FSDP step behind the next forward, loom/fsdp.h) keeps its memory until that
 * step is waited for. */
void loom_optim_free(loom_optim *o);

/* One update of every segment from its gradient; the step count goes up by one first (so the
 * first step uses step = 1 in the bias corrections, as PyTorch). LOOM_EMISUSE, changing
 * nothing, if a segment's state is released or a chunked step is open (see below). */
int loom_optim_step(loom_optim *o);
/* The same with every gradient multiplied by grad_scale as the kernels load it, in f32 before
 * anything else (maximize, weight decay): the deferred unscale of loom/amp.h (grad_scale =
 * 1/loss scale, possibly times a clip coefficient) without a pass that writes the gradients.
 * The gradients are only read. The result is bit for bit that of multiplying every gradient by
 * grad_scale in f32 (as loom_grad_scale and loom_scaler_unscale do) and then loom_optim_step, on
 * every CPU level; loom_optim_step is grad_scale 1. LOOM_EINVAL if grad_scale is NaN,
 * infinite or negative (0 is allowed: what clipping an infinite norm scales by). */
int loom_optim_step_scaled(loom_optim *o, float grad_scale);

/* ---- chunked steps and caller-held state (offload) ------------------------------------ */

/* A step can be applied piece by piece, so that the optimizer state (and the parameters and
 * gradients) of a segment need never be in memory at once: an offloader streams them from host
 * memory or disk in chunks of a few MB, steps each chunk, and writes it back.
 *   loom_optim_step_begin(o, gs);
 *   for each segment s, for each chunk [off, off + n) of it (any split):
 *     copy in param, grad and state of the chunk;
 *     loom_optim_step_chunk(o, s, off, n, param, grad, state);  copy param and state out
 *   loom_optim_step_end(o, true);
 * gives bit for bit the params and state of loom_optim_step_scaled(o, gs), on every CPU level,
 * provided every element of every segment is stepped exactly once. */

/* State buffers per segment: 2 (Adam, AdamW: exp_avg, exp_avg_sq), 1 (SGD with momentum:
 * momentum_buffer) or 0 (plain SGD; NULL optimizer). The order is that of state_at. */
size_t loom_optim_state_per_segment(const loom_optim *o);

/* Free segment seg's state buffers: from then on the caller holds that segment's state (saved
 * before, with loom_optim_state_at, if it is to be kept). While released, loom_optim_step and
 * loom_optim_step_scaled refuse (LOOM_EMISUSE naming the segment; nothing changes, the step
 * count included), loom_optim_step_chunk needs the caller's state buffers, and state_at /
 * state_find give data == NULL (n as before). A no-op for an optimizer without state and for a
 * segment already released. LOOM_EINVAL for seg out of range, LOOM_EMISUSE while a chunked
 * step is open. */
int loom_optim_release_state(loom_optim *o, size_t seg);
/* Give segment seg state buffers of its own again, zeroed (copy the state back in through
 * loom_optim_state_at). A no-op if it is not released. LOOM_ENOMEM with a message if they
 * cannot be allocated (the segment stays released); LOOM_EINVAL for seg out of range;
 * LOOM_EMISUSE while a chunked step is open. */
int loom_optim_restore_state(loom_optim *o, size_t seg);
/* True if segment seg's state is released (false for a NULL optimizer or seg out of range). */
bool loom_optim_state_released(const loom_optim *o, size_t seg);

/* Open a chunked step: checks grad_scale as loom_optim_step_scaled does (LOOM_EINVAL unless
 * finite and >= 0), counts the step (+1) and fixes the step's scalars (learning rate, bias
 * corrections, grad_scale): a loom_optim_set_lr before loom_optim_step_end applies to the next
 * step. LOOM_EMISUSE if a chunked step is already open. While one is open, loom_optim_step,
 * loom_optim_step_scaled, loom_optim_set_step_count, loom_optim_release_state and
 * loom_optim_restore_state refuse with LOOM_EMISUSE. */
int loom_optim_step_begin(loom_optim *o, float grad_scale);
/* Update elements [offset, offset + n) of segment seg for the open step. param and grad point
 * at those n elements (the caller's buffers: the segment's own pointers are not used; grad is
 * only read). state is an array of loom_optim_state_per_segment(o) pointers, in state_at's
 * order, each at those n elements of that state buffer (read and written); state == NULL
 * steps the optimizer's own state buffers at offset. Segment seg's LOOM_SEG_NO_DECAY applies.
 * Stepping an element twice in one step, or not at all, is the caller's error (not detected).
 * n == 0 is a no-op (NULL buffers allowed then). Errors, each with a message and changing
 * nothing: LOOM_EMISUSE if no chunked step is open, or state == NULL for a segment whose state
 * is released; LOOM_EINVAL for seg out of range, offset + n beyond the segment, NULL param or
 * grad, or a NULL entry in state (with n > 0). */
int loom_optim_step_chunk(loom_optim *o, size_t seg, size_t offset, size_t n, float *param,
                          const float *grad, float *const *state);
/* Close the chunked step. completed == false takes the step back off the count (the caller
 * failed mid-way and restores the values it had updated itself; this call does not).
 * LOOM_EMISUSE if no chunked step is open. */
int loom_optim_step_end(loom_optim *o, bool completed);

/* "sgd", "adam", "adamw". */
const char *loom_optim_name(const loom_optim *o);
size_t loom_optim_segments(const loom_optim *o);
/* Segment i as the optimizer holds it (name borrowed from the optimizer). LOOM_EINVAL for i out
 * of range or out NULL. */
int loom_optim_segment(const loom_optim *o, size_t i, loom_param_seg *out);
/* Point segment i at other buffers of the same length (an FSDP shard moved, an offloaded
 * buffer brought back). LOOM_EINVAL for i out of range or NULL buffers. */
int loom_optim_rebind(loom_optim *o, size_t i, float *param, const float *grad);

/* The learning rate of the next step (schedules set it each step). LOOM_EINVAL if lr < 0 or
 * not finite. */
int loom_optim_set_lr(loom_optim *o, double lr);
double loom_optim_lr(const loom_optim *o);

/* Completed steps (PyTorch's state["step"]). set_step is for restoring a checkpoint; a
 * negative count is LOOM_EINVAL. */
int64_t loom_optim_step_count(const loom_optim *o);
int loom_optim_set_step_count(loom_optim *o, int64_t step);

/* ---- state, for checkpoints ----------------------------------------------------------- */

/* One state buffer: "<segment>.exp_avg", "<segment>.exp_avg_sq" (Adam, AdamW) or
 * "<segment>.momentum_buffer" (SGD with momentum). `data` is the optimizer's own buffer:
 * read it to save, write it to restore (with loom_optim_set_step_count); NULL while the
 * segment's state is released (loom_optim_release_state). SGD's momentum buffer is taken as
 * uninitialised while the step count is 0, as PyTorch's is None. */
typedef struct loom_optim_state {
  const char *name; /* borrowed, lives as long as the optimizer */
  float *data;      /* n floats (valid until the segment's state is released); or NULL */
  size_t n;
} loom_optim_state;

/* Number of state buffers (segments x buffers per segment; 0 for plain SGD). */
size_t loom_optim_state_count(const loom_optim *o);
/* State buffer i (0 <= i < count). LOOM_EINVAL if out of range. */
int loom_optim_state_at(const loom_optim *o, size_t i, loom_optim_state *out);
/* State buffer by name; LOOM_ENOTFOUND if there is none. */
int loom_optim_state_find(const loom_optim *o, const char *name, loom_optim_state *out);

/* ---- gradient clipping (torch.nn.utils.clip_grad_norm_, L2) ---------------------------- */

/* One rule, whatever holds the gradients (segments, tensors, an FSDP wrapper's shards:
 * loom_fsdp_clip_grad_norm) and whatever the strategy (none, DDP, FSDP):
 *   total = sqrt(sum of the squares of every gradient), the squares summed in double (exact
 *           for f32, f16 and bf16 values), reported as a double;
 *   coef  = min(max_norm / (total + 1e-6), 1), computed as PyTorch computes it on an f32 norm:
 *           (1 / ((float)total + 1e-6f)) * (float)max_norm, then clamped to 1 (NaN stays NaN);
 *   every gradient is multiplied by coef in f32 (nothing is written when coef is 1).
 * So, as PyTorch:
 *   - max_norm == 0 zeroes the gradients (coef 0); max_norm = +inf clips nothing and only
 *     reports the norm (coef 1), unless the norm is not finite (below);
 *   - a NaN or infinite total poisons: coef is NaN (NaN total) or 0 (infinite total), so every
 *     gradient becomes NaN, or the finite ones +-0 and the infinite ones NaN. LOOM_OK;
 *   - with error_if_nonfinite, a NaN or infinite total is an error instead: LOOM_EINVAL with
 *     "total norm is nan" / "total norm is inf" in the message, no gradient changed (the norm
 *     is still reported);
 *   - max_norm NaN or negative: LOOM_EINVAL, nothing read or changed.
 * The result is the same bits on every CPU level. Strategies: under DDP the gradients are
 * averaged and identical on every rank after loom_ddp_finish, so each rank calls
 * loom_clip_grad_norm (or _tensors) on them; under FSDP each rank sums its shards' squares,
 * the sums are added over ranks in rank order and the same coefficient and scaling follow.
 * Summation order is the only difference between strategies: the same gradients give the same
 * bits whenever the double sums are exact, and the norm agrees to a double's rounding otherwise.
 * Threads: the functions below are thread-safe on disjoint gradients. */

/* A flat buffer of gradients: n values of dtype, contiguous. */
typedef struct loom_grad_buf {
  void *data;       /* may be NULL when n == 0; written by scaling */
  size_t n;
  loom_dtype dtype; /* LOOM_F32, LOOM_F16 or LOOM_BF16 */
} loom_grad_buf;

/* The pieces, for a caller that holds gradients its own way (a sharded one all-reduces the sum
 * between the first two):
 * the local sum of squares of bufs[0..nbuf): each buffer's element i goes into double lane
 * i % 16, the 16 lanes are folded pairwise (8, 4, 2, 1), the buffers are added in order; an
 * f16 or bf16 buffer gives the bits of its f32 widening. LOOM_EINVAL for NULL bufs or out, or
 * a NULL data with n > 0; LOOM_EDTYPE for a dtype that is not f32, f16 or bf16. */
int loom_grad_sumsq(const loom_grad_buf *bufs, size_t nbuf, double *out);
/* The coefficient from a total norm (the rule above): LOOM_EINVAL for a bad max_norm, and with
 * error_if_nonfinite for a NaN or infinite total; else *coef. */
int loom_clip_coef(double total_norm, double max_norm, bool error_if_nonfinite, float *coef);
/* Multiply every gradient of bufs in place by coef, in f32 (f16 / bf16: widened, multiplied,
 * rounded back to nearest even). Errors as loom_grad_sumsq; checks every buffer first, so a
 * failure writes nothing. */
int loom_grad_scale(const loom_grad_buf *bufs, size_t nbuf, float coef);

/* Clip the f32 gradients of segments (an optimizer's: a module's arena, per-parameter
 * segments, DDP gradients) by the rule above; the segments are summed in order. *total_norm
 * (may be NULL) gets the norm before clipping. The gradients are written through the segments'
 * grad pointers (cast away const: clipping owns the gradients). LOOM_EINVAL for segs NULL with
 * nseg > 0 or a segment with n > 0 and a NULL grad, besides the rule's errors. */
int loom_clip_grad_norm(const loom_param_seg *segs, size_t nseg, double max_norm,
                        bool error_if_nonfinite, double *total_norm);

/* The same over gradient tensors (loom_tensor_grad of the parameters: after
 * loom_amp_prepare_gradients, or under DDP), f32, f16 or bf16, each contiguous; NULL entries
 * are skipped. The tensors are borrowed. LOOM_EINVAL for a non-contiguous tensor or one without
 * data, LOOM_EDTYPE for an integer one, each naming its index. */
int loom_clip_grad_norm_tensors(loom_tensor *const *grads, size_t n, double max_norm,
                                bool error_if_nonfinite, double *total_norm);

/* Clipping folded into a deferred unscale: the segments' gradients are still multiplied by a
 * loss scale (1/inv_scale). The total is inv_scale x the norm of the stored gradients (the
 * norm of the unscaled ones) into *total_norm (may be NULL), the rule's coefficient from it,
 * and *grad_scale = inv_scale x coef (in f32) for loom_optim_step_scaled; writes no gradient.
 *   float gs;  loom_clip_grad_norm_scaled(segs, n, max_norm, inv, false, NULL, &gs);
 *   loom_optim_step_scaled(o, gs);
 * equals unscaling by inv, loom_clip_grad_norm, loom_optim_step bit for bit when inv_scale is
 * a power of two (every scale of loom's scaler presets: products by it are exact) and no
 * unscaled gradient or norm is subnormal; for other scales they differ by rounding. Errors as
 * loom_clip_grad_norm, plus LOOM_EINVAL for inv_scale not finite and > 0 or grad_scale NULL;
 * a nonfinite norm without error_if_nonfinite gives *grad_scale NaN or 0 as PyTorch would
 * scale by. */
int loom_clip_grad_norm_scaled(const loom_param_seg *segs, size_t nseg, double max_norm,
                               float inv_scale, bool error_if_nonfinite, double *total_norm,
                               float *grad_scale);

/* ---- learning-rate schedules ---------------------------------------------------------- */

typedef enum loom_lr_kind {
  LOOM_LR_CONSTANT = 0, /* lr */
  LOOM_LR_WARMUP = 1,   /* lr * (t+1)/warmup for t < warmup, then lr */
  LOOM_LR_COSINE = 2,   /* warmup as above, then min_lr + (lr-min_lr)(1+cos(pi*p))/2 with
                         * p = (t-warmup)/(total-warmup), and min_lr for t >= total */
} loom_lr_kind;

/* A schedule is a value: lr(t) depends only on the step index t (0-based: the lr of the
 * t-th optimizer step), so a resumed run gets the same rates. */
typedef struct loom_lr_schedule {
  loom_lr_kind kind;    /* default LOOM_LR_CONSTANT */
  double lr;            /* peak rate, >= 0; default 1e-3 */
  double min_lr;        /* cosine floor, in [0, lr]; default 0 */
  int64_t warmup_steps; /* >= 0; default 0 */
  int64_t total_steps;  /* cosine: > warmup_steps; default 0 (unused by the others) */
} loom_lr_schedule;

loom_lr_schedule loom_lr_schedule_default(void);
/* LOOM_EINVAL with a message naming the bad field. */
int loom_lr_schedule_validate(const loom_lr_schedule *s);
/* The rate of step t (t < 0 is taken as 0). s must be valid. */
double loom_lr_at(const loom_lr_schedule *s, int64_t t);

/* ---- f32 master weights for low-precision parameters ---------------------------------- */

/* Keeps an f32 master copy of a bf16 or f16 parameter buffer and an f32 gradient buffer. The
 * optimizer steps the masters (loom_master_segment); loom_master_sync writes them back to the
 * model's buffer rounded to nearest even (the core conversion kernels). Retains the model
 * buffer pointer; owns the f32 buffers (in `pool`). */
typedef struct loom_master loom_master;

/* dt is LOOM_BF16 or LOOM_F16 (LOOM_EDTYPE otherwise); the masters start as the exact
 * widening of `params` (n elements), the gradients at zero. */
int loom_master_create(loom_dtype dt, void *params, size_t n, loom_pool pool,
                       loom_master **out);
void loom_master_free(loom_master *m);
/* Widen n low-precision gradients (the model's dtype) into the f32 gradient buffer. */
int loom_master_load_grads(loom_master *m, const void *grads);
/* Round the masters into the model's buffer. */
int loom_master_sync(loom_master *m);
/* A segment over the masters and f32 gradients, for an optimizer (name borrowed). */
loom_param_seg loom_master_segment(const loom_master *m, const char *name);
float *loom_master_params(const loom_master *m);
float *loom_master_grads(const loom_master *m);
size_t loom_master_numel(const loom_master *m);

#ifdef __cplusplus
}
#endif
#endif
