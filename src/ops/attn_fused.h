/* attn_fused.h: the fused attention recurrence (attn_fused.c) as the ops of attention.c call
 * it: the dims of one call (attn_dims: where each (batch, head) slice's rows are), the f32
 * forward and backward over every slice on the caller's OpenMP team, their per-slice parts
 * (for callers that stage a batch element at a time), and the bf16 runs on AMX tiles. Every
 * pointer is borrowed; nothing here allocates except loom__attn_amx_work_new (a tensor the
 * caller frees) or fails. */
#ifndef LOOM_OPS_ATTN_FUSED_H
#define LOOM_OPS_ATTN_FUSED_H

#include "ops/attn_int.h"
#include "loom/tensor.h"

#include <stdbool.h>
#include <stdint.h>


typedef struct attn_dims {
  int64_t BH, T, D;
  int64_t ldt; /* row length of k and v transposed ([D, T] per slice): T padded, so that rows
                  a power of two apart in bytes do not all map to the same cache sets */
  bool causal;
  float scale;
  /* Where the rows are: slice bh = (b, h) of q, k, v and their gradients starts at
   * b * T * ldi + h * D and its rows are ldi floats apart; of the output and its gradient at
   * b * T * ldo + h * D, ldo apart. [B, H, T, D] contiguous: H 1 (b = bh), ldi = ldo = D;
   * packed ([B, T, 3C] in, [B, T, C] out, loom_sdpa_qkv): H heads, ldi 3C, ldo C. */
  int64_t H, ldi, ldo;
} attn_dims;

/* o ([BH slices, T, D] where a says) and each row's logsumexp lse ([BH, T]) from q, k, v (f32);
 * kt: scratch for k transposed, [BH, D, ldt] f32. */
void loom__attn_fwd(const attn_dims *a, const float *q, float *kt, const float *k,
                    const float *v, float *o, float *lse);

/* Rows [r0, r1) of one slice's forward: q, v (rows ldi apart), o (ldo apart) its [T, D] rows,
 * kt its scaled [D, ldt] keys, lse its [T]. */
void loom__attn_fwd_rows(const loom__attn_kernels *kk, const attn_dims *a, const float *q,
                         const float *kt, const float *v, float *o, float *lse, int64_t r0,
                         int64_t r1);

/* dq, dk, dv (f32, zeroed) from q, k, v, the output o, lse and the output's gradient go; kt, vt:
 * scratch for k and v transposed, [BH, D, ldt] f32 each. */
void loom__attn_bwd(const attn_dims *a, const float *q, const float *k, const float *v,
                    float *kt, float *vt, const float *o, const float *lse, const float *go,
                    float *dq, float *dk, float *dv);

/* One slice's backward: kt (scaled) and vt its k and v transposed; dq, dk, dv zeroed. */
void loom__attn_bwd_slice(const loom__attn_kernels *kk, const attn_dims *a, const float *q,
                          const float *k, const float *kt, const float *vt, const float *o,
                          const float *lse, const float *go, float *dq, float *dk, float *dv);

/* Whether a call's products run on AMX: bf16 inputs and a head width that fits. */
bool loom__attn_use_amx(const attn_dims *a, loom_dtype dt);

/* A work tensor for AMX: the forward's packed k and v, or one backward work area per thread. */
int loom__attn_amx_work_new(const attn_dims *a, bool backward, loom_tensor **out);

/* Forward on AMX: q, k, v bf16 slices as a says; w: the forward's work tensor's data; o f32. */
void loom__attn_amx_run_fwd(const attn_dims *a, const uint16_t *q, const uint16_t *k,
                            const uint16_t *v, uint16_t *w, float *o, float *lse);

/* Backward on AMX: q, k, v, o bf16; go, lse, dq, dk, dv f32; work: the backward's work tensor. */
void loom__attn_amx_run_bwd(const attn_dims *a, const uint16_t *q, const uint16_t *k,
                            const uint16_t *v, const uint16_t *o, const float *go,
                            const float *lse, float *dq, float *dk, float *dv, loom_tensor *work);

/* A 16-bit tensor's data. */
static inline const uint16_t *loom__attn_h16(const loom_tensor *t) { return loom_tensor_data(t); }

#endif
