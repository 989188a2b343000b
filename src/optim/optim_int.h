/* optim_int.h: the optimizer struct (segments with their own state buffers), the per-step
 * scalar arguments of the update kernels and the optim layer's kernel table (one per CPU
 * level, every level bit-identical to scalar). */
#ifndef LOOM_OPTIM_INT_H
#define LOOM_OPTIM_INT_H

#include "core/core_int.h"
#include "loom/optim.h"

/* Adam / AdamW scalars of one step, each rounded to f32 as PyTorch passes them to its
 * kernels. Per element, in this order and without fused multiply-add:
 *   if (scaled) g = g*grad_scale;   g = maximize ? -g : g;   if (l2) g = g + wd*p;   if (decoupled) p = p*decay;
 *   m = m*beta1;  m = m + omb1*g;   v = v*beta2;  v = v + (omb2*g)*g;
 *   d = sqrt(v)/bc2_sqrt + eps;   p = p + (neg_step*m)/d */
typedef struct loom__adam_args {
  float beta1, omb1;  /* beta1, 1 - beta1 */
  float beta2, omb2;  /* beta2, 1 - beta2 */
  float wd;           /* L2 coefficient (Adam) */
  float decay;        /* 1 - lr*weight_decay (AdamW) */
  float bc2_sqrt;     /* sqrt(1 - beta2^step) */
  float eps;
  float neg_step;     /* -lr / (1 - beta1^step) */
  float grad_scale;   /* the factor of loom_optim_step_scaled (read when `scaled`) */
  bool l2, decoupled, maximize, scaled;
} loom__adam_args;

/* SGD scalars of one step. Per element:
 *   if (scaled) g = g*grad_scale;   d = maximize ? -g : g;   if (wd != 0) d = d + wd*p;
 *   if (has_momentum) { b = first ? d : b*momentum + omd*d;  d = nesterov ? d + momentum*b : b; }
 *   p = p + neg_lr*d */
typedef struct loom__sgd_args {
  float wd, momentum, omd, neg_lr; /* omd: 1 - dampening */
  float grad_scale;                /* the factor of loom_optim_step_scaled (when `scaled`) */
  bool has_wd, has_momentum, first, nesterov, maximize, scaled;
} loom__sgd_args;

typedef struct loom__optim_kernels {
  void (*adam)(const loom__adam_args *a, float *p, const float *g, float *m, float *v, size_t n);
  void (*sgd)(const loom__sgd_args *a, float *p, const float *g, float *buf, size_t n);
  /* Adds x[i]^2 (in double: exact) into lane[i % 16], i < n; the lanes carry on from earlier
   * calls (loom__sumsq_add, folded by loom__sumsq_fold). */
  void (*sumsq)(double lane[16], const float *x, size_t n);
  void (*scale)(float *x, float s, size_t n);
} loom__optim_kernels;

/* The tables (every one full), the table of a given level (tests compare levels) and the
 * active level's (core_int.h's kernel-table pattern). */
LOOM__KERNEL_TABLES(loom__optim_kernels, loom__optim_kernels, loom__optim_k_level, loom__optim_k);

/* Scalar kernels, also used by the SIMD kernels for their ragged tails. */
void loom__adam_scalar(const loom__adam_args *a, float *p, const float *g, float *m, float *v,
                       size_t n);
void loom__sgd_scalar(const loom__sgd_args *a, float *p, const float *g, float *buf, size_t n);
void loom__scale_scalar(float *x, float s, size_t n);
/* Adds x[i]^2 into lane[(start + i) % 16] for i < n. */
void loom__sumsq_lanes(double lane[16], const float *x, size_t n, size_t start);
/* The fixed reduction of 16 lanes: pairwise halves (8, 4, 2, 1). */
double loom__sumsq_fold(double lane[16]);
/* Adds x[i]^2 into lane[(start + i) % 16] for i < n, on the active CPU level (a scalar head up
 * to a lane-0 boundary, then the kernel): summing a buffer chunk by chunk, each chunk with its
 * offset as start, then folding, gives the bits of loom_grad_sumsq over the whole buffer. */
void loom__sumsq_add(double lane[16], const float *x, size_t n, size_t start);

/* ---- gradient clipping: the one rule (clip.c, documented in loom/optim.h) ---------------- */

/* LOOM_EINVAL, naming `who`, for a max_norm that is NaN or negative. */
int loom__clip_check(const char *who, double max_norm);
/* The coefficient from a total norm: LOOM_EINVAL for a bad max_norm, and with
 * error_if_nonfinite for a NaN or infinite total ("total norm is nan"); else *coef. */
int loom__clip_coef(const char *who, double total_norm, double max_norm, bool error_if_nonfinite,
                    float *coef);
/* loom_grad_sumsq / loom_grad_scale with `who` in their messages. */
int loom__grad_sumsq(const char *who, const loom_grad_buf *bufs, size_t nbuf, double *out);
int loom__grad_scale(const char *who, const loom_grad_buf *bufs, size_t nbuf, float coef);

/* ---- the optimizer object ------------------------------------------------------------- */

typedef enum loom__optim_kind { LOOM__SGD, LOOM__ADAM, LOOM__ADAMW } loom__optim_kind;

#define LOOM__MAX_STATE 2

typedef struct loom__seg {
  char *name;
  float *param;
  const float *grad;
  size_t n;
  unsigned flags;
  /* nstate zeroed buffers of n floats (at least one, so that a live buffer is never NULL),
   * in the optimizer's state pool; all NULL while the state is released to the caller
   * (loom_optim_release_state). */
  float *state[LOOM__MAX_STATE];
} loom__seg;

/* The scalars of one step, fixed when the step starts (the whole step, or step_begin). */
typedef struct loom__step_args {
  loom__adam_args adam; /* Adam, AdamW */
  loom__sgd_args sgd;   /* SGD */
} loom__step_args;

struct loom_optim {
  uint32_t magic;
  loom__optim_kind kind;
  loom_sgd_cfg sgd;
  loom_adam_cfg adam;
  double lr;
  int64_t step;
  loom__seg *seg;
  size_t nseg;
  int nstate;                        /* state buffers per segment */
  loom_pool state_pool;              /* where the state buffers live */
  const char *state_kind[LOOM__MAX_STATE];
  char **state_name;                 /* nseg * nstate names "<seg>.<kind>" */
  bool chunk_open;                   /* between loom_optim_step_begin and _end */
  int holds;                         /* loom__optim_hold's not yet let go */
  bool free_asked;                   /* loom_optim_free came while held: freed at the last let go */
  loom__step_args chunk_args;        /* the open chunked step's scalars */
};

#define LOOM__OPTIM_MAGIC 0x4f50544du /* "OPTM" */

/* Build the common part: copy segments and names, allocate each segment's nstate zeroed state
 * buffers. `who` names the caller in messages. */
int loom__optim_create(const char *who, loom__optim_kind kind, const loom_param_seg *segs,
                       size_t nseg, int nstate, const char *const *state_kind, loom_pool pool,
                       loom_optim **out);
/* LOOM_EINVAL / LOOM_EMISUSE for a NULL or freed optimizer. */
int loom__optim_check(const loom_optim *o, const char *who);
/* True if segment s's state is held by the caller (never for an optimizer without state). */
static inline bool loom__seg_released(const loom_optim *o, const loom__seg *s) {
  return o->nstate > 0 && !s->state[0];
}
/* Allocate (zeroed) / free the state buffers of segment s; allocation failure leaves them all
 * NULL and returns LOOM_ENOMEM with a message naming `who`. */
int loom__seg_state_alloc(const loom_optim *o, loom__seg *s, const char *who);
void loom__seg_state_free(const loom_optim *o, loom__seg *s);

/* The scalars of step o->step (already counted) with gradients scaled by grad_scale, the one
 * place each kind computes them (sgd.c, adam.c), and the update of n elements of a segment with
 * flags `flags` (LOOM_SEG_*): p, g and state[0..nstate) point at those elements. */
void loom__sgd_args_make(const loom_optim *o, float grad_scale, loom__sgd_args *a);
void loom__adam_args_make(const loom_optim *o, float grad_scale, loom__adam_args *a);
void loom__sgd_update(const loom_optim *o, const loom__sgd_args *a, unsigned flags, float *p,
                      const float *g, float *const *state, size_t n);
void loom__adam_update(const loom_optim *o, const loom__adam_args *a, unsigned flags, float *p,
                       const float *g, float *const *state, size_t n);
/* The same for o's kind (optim.c). */
void loom__step_args_make(const loom_optim *o, float grad_scale, loom__step_args *a);
void loom__step_update(const loom_optim *o, const loom__step_args *a, unsigned flags, float *p,
                       const float *g, float *const *state, size_t n);
/* Hold the optimizer alive past a loom_optim_free by its user (on the same thread), for a
 * caller that must still touch it later (FSDP's optimizer pass behind the next forward sets
 * its step count back if the pass fails): loom_optim_free while held only marks it, and the
 * last loom__optim_let_go frees it. */
void loom__optim_hold(loom_optim *o);
void loom__optim_let_go(loom_optim *o);

/* A chunked step detached from its optimizer (step_chunk.c): the open step's scalars and what
 * the update reads of the optimizer (its kind and configuration, each segment's flags and
 * length), copied, so the step can go on over caller-held buffers (every segment's state
 * released) on another thread while the optimizer itself is used, changed (a learning rate set
 * for the next step) or freed. loom__optim_snap_take needs an open chunked step
 * (LOOM_EMISUSE otherwise; LOOM_ENOMEM); loom__optim_snap_chunk is loom_optim_step_chunk's
 * update with its checks (state must be given); loom__optim_snap_free(NULL) is a no-op. */
typedef struct loom__optim_snap loom__optim_snap;
int loom__optim_snap_take(const loom_optim *o, loom__optim_snap **out);
int loom__optim_snap_chunk(const loom__optim_snap *s, size_t seg, size_t offset, size_t n,
                           float *param, const float *grad, float *const *state);
void loom__optim_snap_free(loom__optim_snap *s);

/* LOOM_EINVAL unless grad_scale is finite and >= 0 (the check of loom_optim_step_scaled). */
int loom__check_grad_scale(float grad_scale, const char *who);

#endif
