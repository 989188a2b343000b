/* optim_int.h: the optimizer struct, the per-step scalar arguments of the update kernels and
 * the optim layer's kernel table (one per CPU level, every level bit-identical to scalar). */
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
  /* Sum of squares into 16 double lanes (element i into lane i % 16, then loom__sumsq_fold). */
  double (*sumsq)(const float *x, size_t n);
  void (*scale)(float *x, float s, size_t n);
} loom__optim_kernels;

extern const loom__optim_kernels loom__optim_kernels_scalar;
extern const loom__optim_kernels loom__optim_kernels_avx2;
extern const loom__optim_kernels loom__optim_kernels_avx512;

/* The table of the active CPU level (loom_cpu_level_active), NULL entries filled from scalar. */
const loom__optim_kernels *loom__optim_k(void);
/* The table of a given level (tests compare levels); scalar for a level out of range. */
const loom__optim_kernels *loom__optim_k_level(loom_cpu_level level);

/* Scalar kernels, also used by the SIMD kernels for their ragged tails. */
void loom__adam_scalar(const loom__adam_args *a, float *p, const float *g, float *m, float *v,
                       size_t n);
void loom__sgd_scalar(const loom__sgd_args *a, float *p, const float *g, float *buf, size_t n);
void loom__scale_scalar(float *x, float s, size_t n);
/* Adds x[i]^2 into lane[(start + i) % 16] for i < n. */
void loom__sumsq_lanes(double lane[16], const float *x, size_t n, size_t start);
/* The fixed reduction of 16 lanes: pairwise halves (8, 4, 2, 1). */
double loom__sumsq_fold(double lane[16]);

/* ---- the optimizer object ------------------------------------------------------------- */

typedef enum loom__optim_kind { LOOM__SGD, LOOM__ADAM, LOOM__ADAMW } loom__optim_kind;

typedef struct loom__seg {
  char *name;
  float *param;
  const float *grad;
  size_t n;
  size_t off; /* offset into the state arenas */
  unsigned flags;
} loom__seg;

#define LOOM__MAX_STATE 2

struct loom_optim {
  uint32_t magic;
  loom__optim_kind kind;
  loom_sgd_cfg sgd;
  loom_adam_cfg adam;
  double lr;
  int64_t step;
  loom__seg *seg;
  size_t nseg;
  size_t total;                      /* sum of segment lengths */
  int nstate;                        /* state buffers per segment */
  const char *state_kind[LOOM__MAX_STATE];
  float *arena[LOOM__MAX_STATE];     /* one arena per state kind, `total` floats */
  char **state_name;                 /* nseg * nstate names "<seg>.<kind>" */
};

#define LOOM__OPTIM_MAGIC 0x4f50544du /* "OPTM" */

/* Build the common part: copy segments and names, allocate nstate zeroed arenas.
 * `who` names the caller in messages. */
int loom__optim_create(const char *who, loom__optim_kind kind, const loom_param_seg *segs,
                       size_t nseg, int nstate, const char *const *state_kind, loom_pool pool,
                       loom_optim **out);
/* LOOM_EINVAL / LOOM_EMISUSE for a NULL or freed optimizer. */
int loom__optim_check(const loom_optim *o, const char *who);

/* Per-kind step (sgd.c, adam.c), called by loom_optim_step_scaled after step++; grad_scale
 * multiplies every gradient as it is loaded (1: not at all). */
int loom__sgd_step(loom_optim *o, float grad_scale);
int loom__adam_step(loom_optim *o, float grad_scale);

#endif
