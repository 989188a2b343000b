/* loom/gpt.h: a GPT-2-style decoder-only transformer as a loom module (loom/nn.h).
 *
 * The model is GPT-2's (HF transformers' GPT2LMHeadModel, nanoGPT's GPT): token and position
 * embeddings added, `layers` pre-norm blocks
 *     x = x + attn(ln_1(x));   x = x + mlp(ln_2(x))
 * where attn is causal multi-head self-attention (one Linear c_attn to q, k, v; `heads` heads of
 * dim / heads; softmax(q k^T / sqrt(dim / heads)) with the future masked; Linear c_proj) and mlp
 * is Linear c_fc to 4 x dim, GELU in its tanh form, Linear c_proj back; then a final LayerNorm
 * ln_f and the language-model head tied to the token embedding: logits = x @ wte.weight^T (no
 * parameter of its own, as GPT-2). LayerNorm eps is 1e-5. There is no dropout (nanoGPT's
 * default, dropout = 0).
 *
 * Parameters, with PyTorch's names, in named_parameters() order (V vocab, T context, C dim):
 *     wte.weight [V, C]                       wpe.weight [T, C]
 *     h.{i}.ln_1.weight, .bias [C]            h.{i}.attn.c_attn.weight [3C, C], .bias [3C]
 *     h.{i}.attn.c_proj.weight [C, C], .bias  h.{i}.ln_2.weight, .bias [C]
 *     h.{i}.mlp.c_fc.weight [4C, C], .bias    h.{i}.mlp.c_proj.weight [C, 4C], .bias [C]
 *     ln_f.weight, ln_f.bias [C]
 * The Linears use nn.Linear's layout [out, in] (loom_linear). HF's GPT-2 checkpoints store them
 * with Conv1D, whose weight is the transpose, [in, out]: transpose c_attn, c_proj and c_fc's
 * weights when loading those. c_attn's output is q, k, v in that order, each C wide, head h
 * using columns [h * C/heads, (h + 1) * C/heads) of each. The count is
 *     V C + T C + layers (12 C^2 + 13 C) + 2 C
 * (124,439,808 for GPT-2 small: V 50257, T 1024, 12 layers, 12 heads, C 768).
 *
 * Initialisation (GPT-2 / nanoGPT): every Linear and Embedding weight N(0, 0.02), except the
 * c_proj weights (the ones that write into the residual stream) N(0, 0.02 / sqrt(2 layers));
 * biases 0; LayerNorm weights 1, biases 0. All f32. Element j of parameter i (named_parameters
 * order) is loom_rng_at_normal(seed, i, j) scaled, so a parameter's values depend only on the
 * seed, its index and its shape, and any slice of it (an FSDP shard) is made alone. Deferred
 * initialisation (loom_nn_set_deferred_init, loom/nn.h) applies: a deferred GPT holds no
 * parameter memory until materialised or wrapped by FSDP.
 *
 * Forward (loom_module_forward): token indices [B, T] (i32 or i64, each in [0, vocab), T in
 * 1..context) to logits [B, T, vocab] (f32; under autocast the head's matmul runs in the low
 * dtype and the logits have that dtype, as PyTorch's). Module tree: the root "GPT2" has the
 * children wte ("Embedding"), wpe ("Embedding"), h ("Sequential" of "GPT2Block"s, each with
 * ln_1, attn ("GPT2Attention": c_attn, c_proj), ln_2, mlp ("GPT2MLP": c_fc, c_proj)), ln_f; each
 * runs through its module so per-module hooks (FSDP's) fire.
 *
 * FSDP: wte is used by the embedding and by the head, and a parameter must belong to one unit,
 * so wte (with wpe and ln_f) stays in the root's unit, whose forward spans the whole model. One
 * unit per block is FSDP's default policy (LOOM_FSDP_WRAP_CHILDREN: each child of h, the first
 * Sequential) or LOOM_FSDP_WRAP_LIST with unit_names "h.0" .. "h.{layers-1}"; either gives
 * layers + 1 units, the root's first. Under FSDP's mixed precision the gathered parameters are
 * in the forward dtype, so the embeddings, and with them the residual stream, are too (as
 * PyTorch FSDP's param_dtype); autocast over f32 parameters keeps the residual stream in f32.
 *
 * Ownership and threads: as every module (loom/nn.h): the caller frees the model with
 * loom_module_free; one thread at a time. Errors: LOOM_EINVAL naming the field for a bad
 * configuration (loom_gpt_cfg_validate), and in forward LOOM_EDTYPE for indices that are not
 * i32 / i64, LOOM_ESHAPE for indices that are not [B, T] or a T beyond the context, LOOM_EINVAL
 * for an index out of range (the embedding's check); LOOM_ENOMEM. */
#ifndef LOOM_GPT_H
#define LOOM_GPT_H

#include "loom/nn.h"
#include "loom/tensor.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct loom_gpt_cfg {
  int64_t vocab;   /* V, tokens: default 50257 (GPT-2's) */
  int64_t context; /* T, the longest sequence (wpe's rows): default 1024 */
  int64_t layers;  /* blocks: default 12 */
  int64_t heads;   /* attention heads, dividing dim: default 12 */
  int64_t dim;     /* C, the width: default 768 */
} loom_gpt_cfg;

/* GPT-2 small (124M parameters): the defaults above. */
loom_gpt_cfg loom_gpt_cfg_default(void);
/* LOOM_OK, or LOOM_EINVAL with a message naming the field: each size >= 1, heads dividing dim,
 * and sizes whose parameter count fits (vocab and context at most 2^31, dim at most 2^20, layers
 * at most 2^16, heads at most dim). cfg NULL is LOOM_EINVAL. */
int loom_gpt_cfg_validate(const loom_gpt_cfg *cfg);
/* The number of parameter elements a model of cfg has (the formula above), without building it;
 * 0 for a configuration that does not validate (the reason in loom_last_error). */
size_t loom_gpt_numel(const loom_gpt_cfg *cfg);

/* A new GPT-2 model of cfg (validated first; copied), initialised from seed as above. On
 * failure *out is NULL. */
int loom_nn_gpt_create(const loom_gpt_cfg *cfg, uint64_t seed, loom_module **out);

/* Activation checkpointing of every block h.{i} (loom_module_set_checkpoint, which has the
 * semantics): what `loom train --checkpoint-activations` turns on. The embeddings, ln_f and the
 * head stay recorded. LOOM_EINVAL for NULL, LOOM_EMISUSE for a module that is not a GPT2 model
 * from loom_nn_gpt_create. */
int loom_gpt_set_checkpoint(loom_module *gpt, bool on);

/* The language-model loss: mean cross entropy of logits [B, T, V] against targets [B, T]
 * (i32 or i64 in [0, V)), over all B x T positions, computed in f32 (loom_cross_entropy); a new
 * scalar tensor on the tape. LOOM_ESHAPE if the shapes do not fit. */
int loom_gpt_loss(loom_tensor *logits, loom_tensor *targets, loom_tensor **out);

#ifdef __cplusplus
}
#endif
#endif
