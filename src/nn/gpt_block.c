/* gpt_block.c: GPT-2's transformer block as modules: the block ("GPT2Block": pre-norm,
 * x + attn(ln_1(x)), then + mlp(ln_2(x))), its causal self-attention ("GPT2Attention": c_attn
 * to q, k, v, the heads, c_proj) and its MLP ("GPT2MLP": c_fc, GELU tanh, c_proj). The
 * parameters are made by bare leaf modules (Linear, LayerNorm: zeros) and set by gpt.c's
 * initialiser once the model is packed. */
#include "nn/nn_int.h"

enum { ATTN_HEADS = 0 }; /* GPT2Attention's cfg slot */

/* ---- attention ------------------------------------------------------------------------- */

/* Causal self-attention over c_attn's output qkv [B, T, 3C] (q, k, v side by side, the heads
 * side by side in each) to [B, T, C]: the fused op reading the heads in place
 * (loom_sdpa_qkv: the flash-attention recurrence, never the [T, T] scores, bit for bit
 * loom_scaled_dot_product_attention over the heads split apart), in the low dtype under
 * autocast as PyTorch 2's lists have it. */
static int causal_attention(loom_tensor *qkv, int64_t H, loom_tensor **out) {
  return loom_sdpa_qkv(qkv, H, true, out);
}

static int attn_forward(loom_module *m, loom_tensor *x, loom_tensor **out) {
  int64_t H = m->cfg[ATTN_HEADS];
  const loom_tensor *w = m->children[0]->params[0].value; /* c_attn.weight [3C, C] */
  int64_t C = loom_tensor_dim(w, 1);
  if (loom_tensor_ndim(x) != 3 || loom_tensor_dim(x, 2) != C)
    return loom__fail(LOOM_ESHAPE, "GPT2Attention: input must be [B, T, %lld], not %d-D with "
                      "last dim %lld", (long long)C, loom_tensor_ndim(x),
                      (long long)loom_tensor_dim(x, -1));
  int rc = LOOM_OK;
  loom_tensor *qkv = NULL, *y = NULL;
  LOOM_TRY(loom__module_run(m->children[0], x, &qkv));
  LOOM_TRY(causal_attention(qkv, H, &y));
  LOOM_TRY(loom__module_run(m->children[1], y, out));
done:
  loom_tensor_free(qkv);
  loom_tensor_free(y);
  return rc;
}

/* ---- MLP and block --------------------------------------------------------------------- */

static int mlp_forward(loom_module *m, loom_tensor *x, loom_tensor **out) {
  loom_tensor *h = NULL, *g = NULL;
  int rc = loom__module_run(m->children[0], x, &h);
  if (!rc) rc = loom_gelu(h, LOOM_GELU_TANH, &g);
  if (!rc) rc = loom__module_run(m->children[1], g, out);
  loom_tensor_free(h);
  loom_tensor_free(g);
  return rc;
}

/* x + f(norm(x)), with norm and f children of m. */
static int residual(loom_module *norm, loom_module *f, loom_tensor *x, loom_tensor **out) {
  loom_tensor *n = NULL, *y = NULL;
  int rc = loom__module_run(norm, x, &n);
  if (!rc) rc = loom__module_run(f, n, &y);
  if (!rc) rc = loom_add(x, y, out);
  loom_tensor_free(n);
  loom_tensor_free(y);
  return rc;
}

static int block_forward(loom_module *m, loom_tensor *x, loom_tensor **out) {
  loom_tensor *x1 = NULL;
  int rc = residual(m->children[0], m->children[1], x, &x1);
  if (!rc) rc = residual(m->children[2], m->children[3], x1, out);
  loom_tensor_free(x1);
  return rc;
}

/* ---- creation -------------------------------------------------------------------------- */

/* A module of `type` whose children are kids[0..n) named names (taken, even on failure; NULL
 * entries mean an earlier create failed with rc, which is returned). Not packed: a block is
 * packed with the model that holds it. */
static int assemble(const char *type, int (*fwd)(loom_module *, loom_tensor *, loom_tensor **),
                    int rc, loom_module **kids, size_t n, const char *const *names,
                    loom_module **out) {
  if (!rc) return loom__module_compose(type, fwd, kids, n, names, out);
  for (size_t i = 0; i < n; i++) loom_module_free(kids[i]);
  return rc;
}

/* A module with two Linears: `first` dim -> first_out, then c_proj proj_in -> dim. */
static int linear_pair(const char *type, int (*fwd)(loom_module *, loom_tensor *, loom_tensor **),
                       const char *first, int64_t dim, int64_t first_out, int64_t proj_in,
                       loom_module **out) {
  loom_module *kids[2] = {NULL, NULL};
  int rc = loom__linear_bare(dim, first_out, &kids[0]);
  if (!rc) rc = loom__linear_bare(proj_in, dim, &kids[1]);
  const char *names[2] = {first, "c_proj"};
  return assemble(type, fwd, rc, kids, 2, names, out);
}

int loom__gpt_block_create(int64_t dim, int64_t heads, loom_module **out) {
  *out = NULL;
  loom_module *kids[4] = {NULL, NULL, NULL, NULL};
  int rc = loom__layer_norm_bare(dim, 1e-5, &kids[0]);
  if (!rc) rc = linear_pair("GPT2Attention", attn_forward, "c_attn", dim, 3 * dim, dim, &kids[1]);
  if (!rc) kids[1]->cfg[ATTN_HEADS] = heads;
  if (!rc) rc = loom__layer_norm_bare(dim, 1e-5, &kids[2]);
  if (!rc) rc = linear_pair("GPT2MLP", mlp_forward, "c_fc", dim, 4 * dim, 4 * dim, &kids[3]);
  static const char *const names[4] = {"ln_1", "attn", "ln_2", "mlp"};
  return assemble("GPT2Block", block_forward, rc, kids, 4, names, out);
}
