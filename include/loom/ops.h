/* loom/ops.h: tensor operations, each with a forward and a backward (loom/autograd.h).
 *
 * Every op takes input tensors of any strides and gives back a new contiguous tensor (or, for
 * reshape / transpose / slice / flatten, a view sharing the input's storage) through `out`,
 * a new reference the caller releases. Floating ops work on f32, f16 and bf16 storage and
 * compute in f32 (accumulation always f32); the output has the inputs' dtype (binary ops
 * need both inputs of one dtype; autocast, when on, casts them first). Integer tensors are
 * accepted only where documented (labels, indices).
 *
 * When grad mode is on and an input requires grad, the op records a node and the output
 * requires grad. Every op goes through one dispatch point that consults the autocast policy
 * for its kind (loom_op_kind) before running.
 *
 * Errors: a NULL or freed tensor (LOOM_EINVAL / LOOM_EMISUSE), a dtype the op does not take
 * or inputs of different dtypes (LOOM_EDTYPE), shapes that do not fit or do not broadcast
 * (LOOM_ESHAPE), a bad dim or parameter (LOOM_EINVAL), with a message that names the op
 * ("add: shapes [2, 3] and [4] do not broadcast"). On failure *out is NULL.
 *
 * Threads: ops on different tensors may run on any threads at once. */
#ifndef LOOM_OPS_H
#define LOOM_OPS_H

#include "loom/autocast.h"
#include "loom/tensor.h"

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Every op has a kind; autocast policies are looked up by it. The kinds are autocast's
 * (loom/autocast.h, LOOM_AMP_OP_MAP, the one list), so (loom_amp_op)kind is the same kind;
 * some (bmm, addmm, ...) name ops PyTorch's autocast lists have and loom does not yet. */
typedef enum loom_op_kind {
#define LOOM__OPK_ENUM(name, str) LOOM_OPK_##name,
  LOOM_AMP_OP_MAP(LOOM__OPK_ENUM)
#undef LOOM__OPK_ENUM
  LOOM_OPK_COUNT
} loom_op_kind;

/* "matmul", ...; "?" for a value out of range. */
const char *loom_op_kind_name(loom_op_kind kind);

/* How a loss is reduced over its elements. */
typedef enum loom_reduction {
  LOOM_REDUCTION_MEAN = 0,
  LOOM_REDUCTION_SUM = 1,
  LOOM_REDUCTION_NONE = 2
} loom_reduction;

/* ---- casts -------------------------------------------------------------------------- */

/* x converted to dtype dt (f32, f16, bf16), on the tape: backward converts the gradient
 * back, so a leaf's gradient keeps the leaf's dtype. A copy even if dt is x's dtype. When x is
 * an f32 leaf (a master weight under autocast) and no hook is registered on the cast's
 * output, linear and matmul backward add their gradient for the cast straight into x's f32
 * gradient buffer, without first rounding it to dt (PyTorch rounds it to dt): the f32
 * gradient is at least as exact, and no temporary is made. */
int loom_cast(loom_tensor *x, loom_dtype dt, loom_tensor **out);

/* ---- elementwise (NumPy broadcasting for binary ops) -------------------------------- */

int loom_add(loom_tensor *a, loom_tensor *b, loom_tensor **out);
int loom_sub(loom_tensor *a, loom_tensor *b, loom_tensor **out);
int loom_mul(loom_tensor *a, loom_tensor *b, loom_tensor **out);
int loom_div(loom_tensor *a, loom_tensor *b, loom_tensor **out);
/* a + s, a - s, a * s, a / s (s computed in f32). */
int loom_add_scalar(loom_tensor *a, double s, loom_tensor **out);
int loom_sub_scalar(loom_tensor *a, double s, loom_tensor **out);
int loom_mul_scalar(loom_tensor *a, double s, loom_tensor **out);
int loom_div_scalar(loom_tensor *a, double s, loom_tensor **out);
int loom_neg(loom_tensor *x, loom_tensor **out);
int loom_relu(loom_tensor *x, loom_tensor **out);
/* GELU: exact (x * Phi(x), erf) or the tanh approximation (PyTorch approximate="tanh"). */
typedef enum loom_gelu_mode { LOOM_GELU_EXACT = 0, LOOM_GELU_TANH = 1 } loom_gelu_mode;
int loom_gelu(loom_tensor *x, loom_gelu_mode mode, loom_tensor **out);
int loom_tanh(loom_tensor *x, loom_tensor **out);
int loom_sigmoid(loom_tensor *x, loom_tensor **out);
int loom_exp(loom_tensor *x, loom_tensor **out);
int loom_log(loom_tensor *x, loom_tensor **out);
int loom_sqrt(loom_tensor *x, loom_tensor **out);
/* x ** p for a scalar exponent p. */
int loom_pow(loom_tensor *x, double p, loom_tensor **out);

/* ---- reductions --------------------------------------------------------------------- */

/* Sum / mean / max over `dims` (n_dims entries, negative counts from the end; n_dims == 0
 * means all dims). keepdim keeps reduced dims as size 1. max's gradient goes to the maximal
 * elements, split evenly between ties (torch.amax). */
int loom_sum(loom_tensor *x, const int *dims, int n_dims, bool keepdim, loom_tensor **out);
int loom_mean(loom_tensor *x, const int *dims, int n_dims, bool keepdim, loom_tensor **out);
int loom_max(loom_tensor *x, const int *dims, int n_dims, bool keepdim, loom_tensor **out);

/* ---- softmax and losses ------------------------------------------------------------- */

int loom_softmax(loom_tensor *x, int dim, loom_tensor **out);
int loom_log_softmax(loom_tensor *x, int dim, loom_tensor **out);
/* Cross entropy of logits [N, C] against class labels [N] (i32 or i64, in [0, C) or equal to
 * ignore_index, whose rows contribute nothing). MEAN divides by the number of rows not
 * ignored; NONE gives [N]. Computed in f32; the output has the logits' dtype. */
int loom_cross_entropy(loom_tensor *logits, loom_tensor *labels, loom_reduction reduction,
                       int64_t ignore_index, loom_tensor **out);
/* Mean squared error (a - b)^2, same shapes; NONE gives a's shape. */
int loom_mse(loom_tensor *a, loom_tensor *b, loom_reduction reduction, loom_tensor **out);

/* ---- layers ------------------------------------------------------------------------- */

/* C = A @ B with torch.matmul's rules for 2-D and batched operands: A [..., M, K],
 * B [..., K, N] (or [K, N], shared by every batch); batch dims must match (or one side
 * has none). 1-D operands are not accepted. */
int loom_matmul(loom_tensor *a, loom_tensor *b, loom_tensor **out);
/* y = x W^T + b with x [..., in], W [out, in] (PyTorch layout), b [out] or NULL. */
int loom_linear(loom_tensor *x, loom_tensor *w, loom_tensor *b, loom_tensor **out);
/* 2-D convolution of x [N, C, H, W] with w [O, C, KH, KW], bias b [O] or NULL, strides and
 * zero paddings (h, w). */
int loom_conv2d(loom_tensor *x, loom_tensor *w, loom_tensor *b, const int64_t stride[2],
                const int64_t padding[2], loom_tensor **out);
/* True if matmul, linear and conv2d run operands of `dt` natively on this CPU: f32 always,
 * bf16 where oneDNN has bf16 kernels (CPUs with AVX-512) that are faster than f32 (AMX, or a
 * CPU other than Intel's; LOOM_BF16_KERNELS=native|widen overrides), f16 never. Otherwise they
 * widen the operands to f32 (exact), compute in f32 and round the output once: the same
 * numbers, at f32 speed. Asked of oneDNN once per process. */
bool loom_ops_native_dtype(loom_dtype dt);
/* Pooling of x [N, C, H, W] with window kernel[2], stride[2], zero padding[2]. max_pool pads
 * with -inf; avg_pool counts padding in the divisor (PyTorch's count_include_pad=True). */
int loom_max_pool2d(loom_tensor *x, const int64_t kernel[2], const int64_t stride[2],
                    const int64_t padding[2], loom_tensor **out);
int loom_avg_pool2d(loom_tensor *x, const int64_t kernel[2], const int64_t stride[2],
                    const int64_t padding[2], loom_tensor **out);
/* Layer normalisation over the last `normalized_ndim` dims of x; w and b (NULL for none)
 * have the shape of those dims. */
int loom_layer_norm(loom_tensor *x, int normalized_ndim, loom_tensor *w, loom_tensor *b,
                    double eps, loom_tensor **out);
/* Scaled dot-product attention, PyTorch's F.scaled_dot_product_attention(q, k, v,
 * is_causal=is_causal) without mask or dropout: q, k, v [B, H, T, D] (one shape, one floating
 * dtype), out [B, H, T, D] = softmax(q k^T / sqrt(D) + mask) v, where with is_causal query t
 * attends to keys 0..t only. Fused (the flash-attention recurrence): the [T, T] score matrix is
 * never formed, only a block of it per thread at a time (64 keys of one row in forward, 32 rows
 * by 64 keys in backward); forward keeps the output and a [B, H, T] f32 logsumexp for backward,
 * which recomputes the scores. Memory is linear in T: besides those, k (and in backward v)
 * transposed, as scratch.
 * Computed in f32 (f16 / bf16 inputs widened, the output rounded once to their dtype), on the
 * calling thread's loom_set_num_threads team. Retains nothing but what autograd saves (q, k,
 * v, the output, the logsumexp) while the output requires grad. Errors: a NULL or freed input
 * (LOOM_EINVAL / LOOM_EMISUSE), a non-floating or mixed dtype (LOOM_EDTYPE), q not of rank 4
 * or k / v not of q's shape (LOOM_ESHAPE); each message names the input. Autocast kind
 * LOOM_OPK_SDPA ("scaled_dot_product_attention"), in the low dtype like matmul. */
int loom_scaled_dot_product_attention(loom_tensor *q, loom_tensor *k, loom_tensor *v,
                                      bool is_causal, loom_tensor **out);
/* Attention over packed heads: qkv [B, T, 3C] holds q, k and v side by side (C columns each,
 * `heads` heads of C / heads columns side by side in each: GPT-2's c_attn output), out
 * [B, T, C] the heads side by side (what c_proj takes). Equal to splitting qkv into q, k, v,
 * viewing each as [B, heads, T, D], loom_scaled_dot_product_attention and merging the heads
 * back, with the same kernels and so bit for bit, but with no copies of the heads apart or
 * together, and its gradient is one [B, T, 3C] tensor rather than three sliced into zeros.
 * Saves qkv, the output and the logsumexp. Errors: those of
 * loom_scaled_dot_product_attention, and LOOM_ESHAPE unless qkv is of rank 3 with its last dim
 * 3 x heads x D (heads >= 1). Autocast kind LOOM_OPK_SDPA. */
int loom_sdpa_qkv(loom_tensor *qkv, int64_t heads, bool is_causal, loom_tensor **out);
/* Rows of weight [V, D] picked by idx (i32 or i64, any shape, each in [0, V)): out is
 * idx.shape + [D]. */
int loom_embedding(loom_tensor *weight, loom_tensor *idx, loom_tensor **out);
/* Inverted dropout: with train, each element is zeroed with probability p and the rest scaled
 * by 1/(1-p); the mask depends only on (seed, element index). Without train (or p == 0) the
 * output is a copy of x. 0 <= p < 1. */
int loom_dropout(loom_tensor *x, double p, uint64_t seed, bool train, loom_tensor **out);

/* ---- shapes (reshape, transpose, slice, flatten give views when they can) ------------ */

int loom_reshape(loom_tensor *x, int ndim, const int64_t *shape, loom_tensor **out);
int loom_transpose(loom_tensor *x, int dim0, int dim1, loom_tensor **out);
/* Elements start, start+step, ... < end of dim (Python semantics, step >= 1). */
int loom_slice(loom_tensor *x, int dim, int64_t start, int64_t end, int64_t step,
               loom_tensor **out);
/* Dims start_dim..end_dim (inclusive, negative from the end) merged into one. */
int loom_flatten(loom_tensor *x, int start_dim, int end_dim, loom_tensor **out);
/* n tensors joined along existing dim (cat) or a new dim (stack); same dtype, and the same
 * shape apart from dim for cat. */
int loom_cat(loom_tensor *const *xs, size_t n, int dim, loom_tensor **out);
int loom_stack(loom_tensor *const *xs, size_t n, int dim, loom_tensor **out);

/* ---- threads ----------------------------------------------------------------------- */

/* Threads the calling thread's matmul / linear / conv2d calls may use (n < 1 counts as 1).
 * Per calling thread: ranks that are threads each set their own. Without a call, the count is
 * OpenMP's default (OMP_NUM_THREADS, else the machine's cores). LOOM_EINVAL, with a message
 * naming the bound, if n > loom_max_num_threads(); the count is then unchanged. */
int loom_set_num_threads(int n);
/* The most threads loom_set_num_threads accepts: 4 per online CPU, and 1024 in all (more only
 * slows every call down; OpenMP runtimes fail on very large teams). */
int loom_max_num_threads(void);

#ifdef __cplusplus
}
#endif
#endif
