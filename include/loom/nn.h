/* loom/nn.h: modules with named parameters (Linear, MLP, Conv2d, LayerNorm, Embedding,
 * Dropout, activations, Sequential).
 *
 * Parameters follow PyTorch's names and layouts, so a state dict written by PyTorch loads by
 * name: Linear.weight is [out, in], Conv2d.weight is [out, in, kh, kw]; names nest with dots
 * ("0.weight" in a Sequential, "layers.2.bias" in an MLP). Initialisers are PyTorch's
 * defaults, from a seed: Linear and Conv2d weight and bias U(-1/sqrt(fan_in), 1/sqrt(fan_in))
 * (kaiming_uniform with a = sqrt(5)); LayerNorm weight 1, bias 0; Embedding N(0, 1). The values
 * come from the counter-based generator (loom/rng.h, Philox4x32-10): element j of a Linear or
 * Conv2d made with `seed` is loom_rng_at_uniform(seed, 0, j) for the weight (stream 1 for the
 * bias) scaled to the bound, an Embedding's loom_rng_at_normal(seed, 0, j); so any slice of a
 * parameter is computed without the rest, and a model built whole, built deferred and then
 * materialised, or sharded by FSDP from a deferred build has the same bits (the same figures
 * in distribution as PyTorch's, not PyTorch's values: load a state dict for those).
 *
 * Deferred initialisation (PyTorch's meta device + reset_parameters, DeepSpeed's zero.Init).
 * With loom_nn_set_deferred_init(true) on a thread, the modules it creates record each
 * parameter's initialiser instead of running it: their parameters have names, shapes and dtypes
 * but no memory (loom_tensor_data is NULL; an op given one fails with LOOM_EMISUSE), and the root
 * has no arenas (loom_module_deferred). Such a model costs a few headers whatever its size. It
 * gets its values either from loom_module_materialize (the whole model, for one process or DDP)
 * or from loom_fsdp_create, which makes on each rank only that rank's shard of each unit
 * (loom/fsdp.h), so no rank ever holds the whole model.
 *
 * Flat arenas (llm.c). A root module (one not inside another) holds all its parameters in one
 * flat buffer per dtype, and their gradients in a second buffer with the same offsets: each
 * parameter is a view at its offset (loom's flat layout, loom/layout.h: 64-byte aligned), a
 * leaf with requires_grad whose gradient (loom_tensor_grad) is the matching view of the
 * gradient arena. Backward writes straight into the gradient arena; an optimizer can run over
 * the whole arena at once, and still can under DDP: DDP's buckets are views of this arena
 * (loom/ddp.h), so the gradients it averages are the arena's.
 *
 * Ownership: loom_nn_*_create gives a module the caller frees with loom_module_free (NULL ok).
 * loom_nn_sequential_create takes ownership of its children (also on failure) and re-packs
 * their parameters into its own arenas: parameter tensors obtained from a child before that
 * are no longer the module's. Getters return borrowed pointers valid while the module lives.
 *
 * Threads: a module may be used by one thread at a time; separate modules on separate
 * threads are independent (ranks as threads each build their own replica). */
#ifndef LOOM_NN_H
#define LOOM_NN_H

#include "loom/ops.h"
#include "loom/tensor.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct loom_module loom_module;

typedef enum loom_activation {
  LOOM_ACT_RELU = 0,
  LOOM_ACT_GELU = 1,      /* exact */
  LOOM_ACT_GELU_TANH = 2, /* approximate="tanh" */
  LOOM_ACT_TANH = 3,
  LOOM_ACT_SIGMOID = 4
} loom_activation;

/* ---- modules ---------------------------------------------------------------------------- */

/* Linear: y = x W^T + b; weight [out, in], bias [out] (bias optional). */
int loom_nn_linear_create(int64_t in, int64_t out, bool bias, loom_dtype dt, uint64_t seed,
                          loom_module **m);
/* Conv2d: weight [out_ch, in_ch, k[0], k[1]], bias [out_ch]; stride and padding (h, w). */
int loom_nn_conv2d_create(int64_t in_ch, int64_t out_ch, const int64_t kernel[2],
                          const int64_t stride[2], const int64_t padding[2], bool bias,
                          loom_dtype dt, uint64_t seed, loom_module **m);
/* LayerNorm over the last normalized_ndim dims of shape normalized_shape. */
int loom_nn_layer_norm_create(int normalized_ndim, const int64_t *normalized_shape, double eps,
                              bool affine, loom_dtype dt, loom_module **m);
/* Embedding: weight [num, dim]; forward takes i32/i64 indices. */
int loom_nn_embedding_create(int64_t num, int64_t dim, loom_dtype dt, uint64_t seed,
                             loom_module **m);
/* Dropout with probability p; forward k uses seed + k, so masks differ between steps and
 * are the same from run to run. Identity when not training. */
int loom_nn_dropout_create(double p, uint64_t seed, loom_module **m);
/* A parameterless activation. */
int loom_nn_activation_create(loom_activation act, loom_module **m);
/* MaxPool2d over NCHW input (loom_max_pool2d): window kernel (h, w); stride NULL means the
 * window (PyTorch's default); padding NULL means 0. LOOM_EINVAL for a window or stride < 1 or a
 * padding outside 0..kernel/2 (PyTorch's rule), naming the dim. No parameters. */
int loom_nn_max_pool2d_create(const int64_t kernel[2], const int64_t stride[2],
                              const int64_t padding[2], loom_module **m);
/* Flatten dims start_dim..end_dim (negative: from the end) into one (loom_flatten; a view when
 * the input is contiguous). PyTorch's nn.Flatten is (1, -1). No parameters. */
int loom_nn_flatten_create(int start_dim, int end_dim, loom_module **m);
/* Sequential: children run in order, named "0", "1", ... Takes ownership of the n children.
 * Children with values (made without deferral) keep them; with every child deferred, and
 * deferral on for this thread, the Sequential is deferred too. */
int loom_nn_sequential_create(loom_module **children, size_t n, loom_module **m);
/* MLP sizes[0] -> sizes[1] -> ... -> sizes[n-1]: Linear layers with `act` between them (none
 * after the last), held in a Sequential named "layers": "layers.0.weight", "layers.2.weight".
 * Layer i is seeded with seed + i. */
int loom_nn_mlp_create(const int64_t *sizes, size_t n, loom_activation act, loom_dtype dt,
                       uint64_t seed, loom_module **m);

void loom_module_free(loom_module *m);

/* ---- deferred initialisation -------------------------------------------------------------- */

/* Turn deferred initialisation on or off for the calling thread (each rank's thread sets its
 * own); returns the previous setting. Off by default. While on, loom_nn_*_create and
 * loom_nn_gpt_create make deferred modules (above); modules made before keep their values. */
bool loom_nn_set_deferred_init(bool on);
bool loom_nn_deferred_init(void);
/* True if m's root was built deferred and has not been given memory (false for NULL, and once
 * materialised or wrapped by FSDP). */
bool loom_module_deferred(const loom_module *m);
/* Give a deferred root its arenas and every parameter its initial values (bit for bit those of
 * the same model built without deferral). Parameter tensors obtained from the module before
 * are no longer the module's: look them up again (loom_module_param). LOOM_OK doing nothing for
 * a module that is not deferred; LOOM_EMISUSE for a child (materialise the root); LOOM_ENOMEM
 * when the arenas cannot be had, the module still deferred. DDP refuses a deferred module's
 * parameters (LOOM_EMISUSE, "holds no data"): materialise it first. */
int loom_module_materialize(loom_module *m);
/* Elements [lo, hi) of root parameter i's initial values (as f32, into dst[0, hi - lo)), from
 * its initialiser, whatever the parameter holds now: what materialising or FSDP puts there.
 * LOOM_EINVAL for an index or range out of bounds, naming the parameter; LOOM_EMISUSE for a
 * child module. */
int loom_module_init_values(const loom_module *m, size_t i, size_t lo, size_t hi, float *dst);

/* ---- running ---------------------------------------------------------------------------- */

/* Run the module on x; *out is a new reference. Records on the tape like any op. */
int loom_module_forward(loom_module *m, loom_tensor *x, loom_tensor **out);
/* Training mode (the default) or evaluation mode, for this module and its children. */
void loom_module_set_training(loom_module *m, bool training);
/* Activation checkpointing for m (PyTorch's checkpoint_wrapper(m), torch.utils.checkpoint in
 * its reentrant form; off by default). While on, a forward of m in training mode with grad
 * mode on runs without recording m's inner graph: m's intermediate activations are freed as
 * soon as they are used, and one node (named by m's type) stands for m, keeping only m's input
 * (a view: its storage stays alive until backward), the autocast mode and registry in force,
 * and m's subtree's forward counters (dropout's masks are seed + count: the recomputation
 * draws the masks the forward drew). Its backward runs m's forward again from that input with
 * grad on, under that autocast state, and backpropagates the incoming gradient through the
 * recomputed graph: the input gets its gradient and m's parameters accumulate theirs, their
 * hooks firing as in any backward. Gradients are bit-identical to those without
 * checkpointing (f32 and under autocast) when m's input feeds only m; the saving is m's
 * activations, the cost one more forward of m in backward (loom_autograd_checkpoint has the
 * details). In evaluation mode or under no-grad, m simply runs.
 *
 * Where: checkpoint modules whose activations are large and whose input is small, the blocks
 * of a transformer (loom_gpt_set_checkpoint: each h.{i}). m's own forward hooks (FSDP's unit
 * boundary) are not run again by the recomputation; its children's are.
 *
 * DDP: the parameters' gradient hooks fire in backward as usual (inside the recomputation's
 * backward), so buckets fill and all-reduce as without checkpointing. FSDP: checkpoint the
 * unit's module (or modules inside a unit): FSDP gathers the unit before the forward, and in
 * backward the unit's output-gradient hook gathers it again before the recomputation runs (the
 * recomputation happens inside the unit's pre-backward gather, as PyTorch's
 * FSDP(checkpoint_wrapper(block))), and under FSDP's mixed precision the recomputation runs
 * in the forward dtype (the autocast state saved). A dry run (loom_mem_set_dry_run) recomputes
 * shapes only, as it computes them.
 *
 * The module (and the parameters it reads) must outlive the graph, and must not change between
 * forward and backward (a recomputation that gives another shape fails with LOOM_EMISUSE).
 * retain_graph, loom_autograd_grad and double backward: as loom_autograd_checkpoint says (a
 * retained graph recomputes again; loom_autograd_grad through it is LOOM_EMISUSE). Sets m
 * alone, not its children. LOOM_EINVAL for a NULL module. */
int loom_module_set_checkpoint(loom_module *m, bool on);
/* True if m is checkpointed (false for NULL). */
bool loom_module_checkpoint(const loom_module *m);
/* "Linear", "Sequential", ... */
const char *loom_module_type(const loom_module *m);

/* ---- parameters ------------------------------------------------------------------------- */

typedef struct loom_param {
  const char *name;   /* full dotted name ("layers.0.weight"), borrowed */
  loom_tensor *value; /* the parameter (a view into the arena), borrowed */
  loom_tensor *grad;  /* its gradient (a view into the gradient arena), borrowed */
  loom_dtype dtype;
  size_t offset; /* elements from the start of the dtype's arena */
  size_t numel;
} loom_param;

/* Number of parameters of the module and its children (in registration order: a module's own
 * parameters first, then its children's, depth first; the order PyTorch's
 * named_parameters() gives). */
size_t loom_module_param_count(const loom_module *m);
/* Parameter i; LOOM_EINVAL if i is out of range. */
int loom_module_param(const loom_module *m, size_t i, loom_param *out);
/* The parameter named `name`; LOOM_ENOTFOUND naming it if there is none. */
int loom_module_param_by_name(const loom_module *m, const char *name, loom_param *out);
/* The flat arenas of dtype dt (borrowed, 1-D, of *numel elements including alignment
 * padding): values and gradients, NULL if the module has no parameters of that dtype.
 * LOOM_EMISUSE for a module that is a child of another (the root holds the arena). */
int loom_module_arena(const loom_module *m, loom_dtype dt, loom_tensor **values,
                      loom_tensor **grads, size_t *numel);
/* Total number of parameter elements (no padding). */
size_t loom_module_numel(const loom_module *m);
/* Zero every parameter's gradient as loom_tensor_zero_grad does (its gradient bound too) and
 * its region of the gradient arena (the whole arena: the padding is never written). */
int loom_module_zero_grad(loom_module *m);

#ifdef __cplusplus
}
#endif
#endif
