/* loom/autocast.h: autocast: the thread's mixed-precision region and the op-precision registry.
 *
 * Every op has a kind (loom_amp_op). Inside an autocast region the registry's policy for the
 * kind decides the dtype the op's floating inputs are cast to before it runs:
 *   LOOM_AMP_LOWER    the region's low dtype (f16 or bf16): matmul, linear, conv
 *   LOOM_AMP_FP32     f32: numerically sensitive ops (losses; and for f16 softmax, norms, exp...)
 *   LOOM_AMP_PROMOTE  the widest input dtype (f32 if they differ): ops that need one dtype
 *   LOOM_AMP_NONE     leave the inputs as they are
 * This layer is data and a lookup (no tensor math); the ops layer consults it at dispatch and
 * puts the casts on the tape.
 *
 * Presets (the registry's starting tables) follow PyTorch's autocast lists
 * (aten/src/ATen/autocast_mode.cpp): f16 the CUDA lists (lower_precision_fp, fp32,
 * fp32_set_opt_dtype, promote), bf16 the CPU lists (checked against PyTorch 1.13's
 * torch.autocast("cpu", torch.bfloat16) op by op). Elementwise add/sub/mul/div and cat/stack
 * are PROMOTE in both: PyTorch promotes their mixed inputs natively, loom's ops need one dtype.
 * Kinds absent from PyTorch's lists are NONE (PyTorch's fallthrough).
 *
 * Regions. loom_autocast_enter/exit bracket a region on the calling thread; regions nest (an
 * inner region may change the mode, or turn autocast off with LOOM_AUTOCAST_OFF) and must exit
 * innermost first, each with the token its enter filled. State is per thread: a region on one
 * thread never affects another. Casts of f32 leaf parameters are cached by the ops layer for
 * the life of the outermost region: loom_autocast_generation() identifies that region (a
 * process-unique number, 0 outside any region) and changes only when a new outermost region
 * is entered.
 *
 * Registries are opaque, made by loom_amp_registry_create (a preset) and released by
 * loom_amp_registry_free. loom_amp_registry_default(mode) is the process-wide registry a region
 * uses when given NULL: borrowed, never freed, changeable at run time like any other.
 * Threads: policies may be read and changed from any threads at once (each entry is atomic);
 * a registry must outlive every region that uses it.
 *
 * Errors: fallible calls return a status with a message naming the function and the bad
 * argument (an unknown kind, policy, mode or name; a token exited out of order or on another
 * thread: LOOM_EMISUSE). */
#ifndef LOOM_AUTOCAST_H
#define LOOM_AUTOCAST_H

#include "loom/dtype.h"

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- op kinds ------------------------------------------------------------------------------ */

/* Every op kind, with its name: the one list of kinds. loom/ops.h's loom_op_kind is generated
 * from it (so (loom_amp_op)kind is the same kind); the last ones are kinds PyTorch's lists
 * name that loom's ops may add (bmm, addmm, ...). */
#define LOOM_AMP_OP_MAP(XX)                                                                   \
  XX(CAST, "cast")                                                                            \
  XX(ADD, "add")                                                                              \
  XX(SUB, "sub")                                                                              \
  XX(MUL, "mul")                                                                              \
  XX(DIV, "div")                                                                              \
  XX(ADD_SCALAR, "add_scalar")                                                                \
  XX(MUL_SCALAR, "mul_scalar")                                                                \
  XX(NEG, "neg")                                                                              \
  XX(RELU, "relu")                                                                            \
  XX(GELU, "gelu")                                                                            \
  XX(TANH, "tanh")                                                                            \
  XX(SIGMOID, "sigmoid")                                                                      \
  XX(EXP, "exp")                                                                              \
  XX(LOG, "log")                                                                              \
  XX(SQRT, "sqrt")                                                                            \
  XX(POW, "pow")                                                                              \
  XX(SUM, "sum")                                                                              \
  XX(MEAN, "mean")                                                                            \
  XX(MAX, "max")                                                                              \
  XX(SOFTMAX, "softmax")                                                                      \
  XX(LOG_SOFTMAX, "log_softmax")                                                              \
  XX(CROSS_ENTROPY, "cross_entropy")                                                          \
  XX(MSE, "mse")                                                                              \
  XX(LAYER_NORM, "layer_norm")                                                                \
  XX(EMBEDDING, "embedding")                                                                  \
  XX(DROPOUT, "dropout")                                                                      \
  XX(MATMUL, "matmul")                                                                        \
  XX(LINEAR, "linear")                                                                        \
  XX(CONV2D, "conv2d")                                                                        \
  XX(MAX_POOL2D, "max_pool2d")                                                                \
  XX(AVG_POOL2D, "avg_pool2d")                                                                \
  XX(RESHAPE, "reshape")                                                                      \
  XX(TRANSPOSE, "transpose")                                                                  \
  XX(SLICE, "slice")                                                                          \
  XX(CAT, "cat")                                                                              \
  XX(STACK, "stack")                                                                          \
  XX(SDPA, "scaled_dot_product_attention")                                                    \
  XX(CUSTOM, "custom")                                                                        \
  XX(BMM, "bmm")                                                                              \
  XX(ADDMM, "addmm")                                                                          \
  XX(BADDBMM, "baddbmm")                                                                      \
  XX(NLL_LOSS, "nll_loss")                                                                    \
  XX(L1_LOSS, "l1_loss")                                                                      \
  XX(BCE_WITH_LOGITS, "bce_with_logits")                                                      \
  XX(GROUP_NORM, "group_norm")                                                                \
  XX(CUMSUM, "cumsum")                                                                        \
  XX(PROD, "prod")                                                                            \
  XX(NORM, "norm")                                                                            \
  XX(LOGSUMEXP, "logsumexp")

typedef enum loom_amp_op {
#define LOOM__AMP_OP_ENUM(name, str) LOOM_AMP_OP_##name,
  LOOM_AMP_OP_MAP(LOOM__AMP_OP_ENUM)
#undef LOOM__AMP_OP_ENUM
  LOOM_AMP_OP_COUNT
} loom_amp_op;

/* "matmul", ...; "?" for a value that is not a kind. */
const char *loom_amp_op_name(loom_amp_op op);
/* The kind of a name as loom_amp_op_name prints it. LOOM_ENOTFOUND with a message for an
 * unknown name, LOOM_EINVAL for NULL arguments. */
int loom_amp_op_parse(const char *name, loom_amp_op *out);

/* ---- policies and modes -------------------------------------------------------------------- */

typedef enum loom_amp_policy {
  LOOM_AMP_NONE = 0,
  LOOM_AMP_LOWER = 1,
  LOOM_AMP_FP32 = 2,
  LOOM_AMP_PROMOTE = 3,
  LOOM_AMP_POLICY_COUNT = 4
} loom_amp_policy;

/* "none", "lower", "fp32", "promote"; "?" otherwise. */
const char *loom_amp_policy_name(loom_amp_policy p);
/* LOOM_ENOTFOUND with a message for an unknown name. */
int loom_amp_policy_parse(const char *name, loom_amp_policy *out);

typedef enum loom_autocast_mode {
  LOOM_AUTOCAST_OFF = 0,
  LOOM_AUTOCAST_F16 = 1,
  LOOM_AUTOCAST_BF16 = 2,
  LOOM_AUTOCAST_MODE_COUNT = 3
} loom_autocast_mode;

/* "off", "f16", "bf16"; "?" otherwise. */
const char *loom_autocast_mode_name(loom_autocast_mode m);
/* Also "fp16", "float16", "bfloat16", "none". LOOM_ENOTFOUND for an unknown name. */
int loom_autocast_mode_parse(const char *name, loom_autocast_mode *out);
/* The low dtype of a mode: f16, bf16; f32 for off (or a value that is not a mode). */
loom_dtype loom_autocast_mode_dtype(loom_autocast_mode m);

/* ---- the registry (AmpRegistry; its presets are AmpConfig) -------------------------------- */

typedef struct loom_amp_registry loom_amp_registry;

/* The preset policy of a kind for a mode (LOOM_AUTOCAST_F16 or _BF16): the tables as data.
 * LOOM_AMP_NONE for a mode or kind out of range. */
loom_amp_policy loom_amp_preset_policy(loom_autocast_mode preset, loom_amp_op op);

/* A new registry holding the preset of `preset` (F16 or BF16; LOOM_EINVAL otherwise). */
int loom_amp_registry_create(loom_autocast_mode preset, loom_amp_registry **out);
/* NULL ok; a default registry is never freed (the call does nothing). */
void loom_amp_registry_free(loom_amp_registry *reg);
/* The process-wide registry for F16 or BF16 (NULL for another mode): borrowed, mutable. */
loom_amp_registry *loom_amp_registry_default(loom_autocast_mode mode);
/* The preset the registry started from (and returns to on reset). */
loom_autocast_mode loom_amp_registry_preset(const loom_amp_registry *reg);

/* Change one kind's policy at run time. LOOM_EINVAL naming the kind or policy if out of range. */
int loom_amp_registry_set(loom_amp_registry *reg, loom_amp_op op, loom_amp_policy policy);
/* The same by names ("softmax", "fp32"): LOOM_ENOTFOUND naming the unknown kind or policy. */
int loom_amp_registry_set_by_name(loom_amp_registry *reg, const char *op, const char *policy);
int loom_amp_registry_get(const loom_amp_registry *reg, loom_amp_op op, loom_amp_policy *out);
/* Every kind back to the registry's preset. */
int loom_amp_registry_reset(loom_amp_registry *reg);

/* The target dtype of an op with the given floating input dtypes (n of them) under `mode` and
 * `reg` (NULL: the default registry of mode). Returns true and sets *out when a cast is needed
 * (some input differs from the target); false when there is nothing to cast (mode off, policy
 * none, every input already the target, n == 0, or an argument out of range), in which case
 * *out is set to the target if the policy gives one and left alone otherwise. Non-floating
 * dtypes in `in` are ignored. Never fails; no allocation. */
bool loom_amp_registry_dtype_for(const loom_amp_registry *reg, loom_autocast_mode mode,
                                 loom_amp_op op, const loom_dtype *in, size_t n, loom_dtype *out);

/* ---- the thread's region (AutoCast) -------------------------------------------------------- */

/* What loom_autocast_enter saved, for the matching exit. Treat as opaque. */
typedef struct loom_autocast_token {
  int depth;                              /* depth of this region (1: outermost) */
  loom_autocast_mode prev_mode;           /* restored on exit */
  const loom_amp_registry *prev_registry; /* restored on exit */
  const void *owner;                      /* the thread that entered */
} loom_autocast_token;

/* Enter a region on this thread with `mode` (OFF: autocast off inside) and `reg` (NULL: the
 * default registry of mode). LOOM_EINVAL for a mode out of range or a NULL token. */
int loom_autocast_enter(loom_autocast_mode mode, const loom_amp_registry *reg,
                        loom_autocast_token *tok);
/* Leave the region `tok` opened, restoring the enclosing region's mode and registry.
 * LOOM_EMISUSE if tok is not this thread's innermost region (already exited, out of order, or
 * from another thread). Leaving the outermost region ends its cast cache. */
int loom_autocast_exit(loom_autocast_token *tok);

/* This thread's state: the mode in force (OFF outside regions), whether it is on, the registry
 * in force (NULL when off), the nesting depth and the outermost region's generation. */
loom_autocast_mode loom_autocast_get_mode(void);
bool loom_autocast_enabled(void);
const loom_amp_registry *loom_autocast_get_registry(void);
int loom_autocast_depth(void);
uint64_t loom_autocast_generation(void);

/* loom_amp_registry_dtype_for with this thread's mode and registry: what an op dispatching on
 * this thread must cast its floating inputs to. Lock-free; the ops layer's dispatch hook. */
bool loom_autocast_dtype_for(loom_amp_op op, const loom_dtype *in, size_t n, loom_dtype *out);

#ifdef __cplusplus
}
#endif
#endif
