/* gpt.c: the GPT-2 model (loom/gpt.h): its configuration, the root module "GPT2" (token and
 * position embeddings, the blocks of gpt_block.c in a Sequential "h", ln_f, the head tied to
 * wte), GPT-2's initialiser and the language-model loss. */
#include "loom/gpt.h"
#include "nn/nn_int.h"

#include <math.h>
#include <string.h>

enum { GPT_WTE = 0, GPT_WPE = 1, GPT_H = 2, GPT_LN_F = 3 };        /* children */
enum { CFG_VOCAB = 0, CFG_CONTEXT = 1, CFG_LAYERS = 2, CFG_HEADS = 3, CFG_DIM = 4 }; /* m->cfg */

loom_gpt_cfg loom_gpt_cfg_default(void) {
  return (loom_gpt_cfg){.vocab = 50257, .context = 1024, .layers = 12, .heads = 12, .dim = 768};
}

static int check_size(const char *field, int64_t v, int64_t max) {
  if (v < 1 || v > max)
    return loom__fail(LOOM_EINVAL, "loom_gpt_cfg: %s is %lld; it must be within 1..%lld", field,
                      (long long)v, (long long)max);
  return LOOM_OK;
}

int loom_gpt_cfg_validate(const loom_gpt_cfg *cfg) {
  if (!cfg) return loom__fail(LOOM_EINVAL, "loom_gpt_cfg_validate: cfg is NULL");
  int rc = check_size("vocab", cfg->vocab, INT64_C(1) << 31);
  if (!rc) rc = check_size("context", cfg->context, INT64_C(1) << 31);
  if (!rc) rc = check_size("layers", cfg->layers, INT64_C(1) << 16);
  if (!rc) rc = check_size("dim", cfg->dim, INT64_C(1) << 20);
  if (!rc) rc = check_size("heads", cfg->heads, cfg->dim);
  if (!rc && cfg->dim % cfg->heads)
    rc = loom__fail(LOOM_EINVAL, "loom_gpt_cfg: heads (%lld) must divide dim (%lld)",
                    (long long)cfg->heads, (long long)cfg->dim);
  return rc;
}

size_t loom_gpt_numel(const loom_gpt_cfg *cfg) {
  if (loom_gpt_cfg_validate(cfg)) return 0;
  uint64_t C = (uint64_t)cfg->dim;
  return (size_t)((uint64_t)cfg->vocab * C + (uint64_t)cfg->context * C +
                  (uint64_t)cfg->layers * (12 * C * C + 13 * C) + 2 * C);
}

/* ---- forward ----------------------------------------------------------------------------- */

static int gpt_forward(loom_module *m, loom_tensor *idx, loom_tensor **out) {
  loom_dtype dt = loom_tensor_dtype(idx);
  if (dt != LOOM_I32 && dt != LOOM_I64)
    return loom__fail(LOOM_EDTYPE, "GPT2: token indices must be i32 or i64, not %s",
                      loom_dtype_name(dt));
  int64_t B = loom_tensor_dim(idx, 0), T = loom_tensor_dim(idx, 1);
  if (loom_tensor_ndim(idx) != 2 || B < 1 || T < 1 || T > m->cfg[CFG_CONTEXT])
    return loom__fail(LOOM_ESHAPE, "GPT2: token indices must be [B, T] with B >= 1 and T within "
                      "1..%lld (the context), not %d-D [%lld, %lld, ...]",
                      (long long)m->cfg[CFG_CONTEXT], loom_tensor_ndim(idx), (long long)B,
                      (long long)T);
  int rc = LOOM_OK;
  loom_tensor *pos = NULL, *tok = NULL, *pe = NULL, *x = NULL, *hx = NULL, *nx = NULL;
  LOOM_TRY(loom_tensor_empty(LOOM_I64, 1, &T, &pos));
  int64_t *pp = loom_tensor_data(pos);
  for (int64_t t = 0; t < T && !loom__dry(); t++) pp[t] = t;
  LOOM_TRY(loom__module_run(m->children[GPT_WTE], idx, &tok)); /* [B, T, C] */
  LOOM_TRY(loom__module_run(m->children[GPT_WPE], pos, &pe));  /* [T, C], broadcast over B */
  LOOM_TRY(loom_add(tok, pe, &x));
  LOOM_TRY(loom__module_run(m->children[GPT_H], x, &hx));
  LOOM_TRY(loom__module_run(m->children[GPT_LN_F], hx, &nx));
  /* the head, tied: logits = x wte^T (wte is [V, C], Linear's [out, in]) */
  LOOM_TRY(loom_linear(nx, m->children[GPT_WTE]->params[0].value, NULL, out));
done:
  loom_tensor_free(pos);
  loom_tensor_free(tok);
  loom_tensor_free(pe);
  loom_tensor_free(x);
  loom_tensor_free(hx);
  loom_tensor_free(nx);
  return rc;
}

/* ---- initialisation ----------------------------------------------------------------------- */

typedef struct init_state {
  uint64_t seed;
  size_t index; /* the next parameter's, in named_parameters order: its stream */
  double proj_std;
} init_state;

/* p's initialiser: every element `mean`, or N(mean, std^2) from stream `index` under the seed
 * (loom_rng_at_normal: one Box-Muller pair per element, its cosine). */
static void set_init(loom__param *p, double mean, double std, init_state *s) {
  p->init = std ? (loom__init){.kind = LOOM__INIT_NORMAL, .a = mean, .b = std, .seed = s->seed,
                               .stream = s->index}
                : (loom__init){.kind = LOOM__INIT_FILL, .a = mean};
  s->index++;
}

/* GPT-2's initialiser over m's subtree, in the order packing lays parameters out (a module's
 * own, then its children's, depth first): LayerNorm weight 1; every other weight N(0, 0.02),
 * N(0, proj_std) under a child named c_proj; every bias 0. Recipes only: packing (or FSDP, for
 * its shards) makes the values. */
static void init_tree(loom_module *m, bool proj, init_state *s) {
  bool ln = !strcmp(m->type, "LayerNorm");
  for (int i = 0; i < m->n_params; i++) {
    bool weight = !strcmp(m->params[i].name, "weight");
    if (!weight) set_init(&m->params[i], 0, 0, s);
    else if (ln) set_init(&m->params[i], 1, 0, s);
    else set_init(&m->params[i], 0, proj ? s->proj_std : 0.02, s);
  }
  for (int c = 0; c < m->n_children; c++)
    init_tree(m->children[c], !strcmp(m->child_names[c], "c_proj"), s);
}

/* ---- creation ----------------------------------------------------------------------------- */

int loom_nn_gpt_create(const loom_gpt_cfg *cfg, uint64_t seed, loom_module **out) {
  if (!out) return loom__fail(LOOM_EINVAL, "loom_nn_gpt_create: out is NULL");
  *out = NULL;
  int rc = loom_gpt_cfg_validate(cfg);
  if (rc) return rc;
  const int64_t C = cfg->dim, L = cfg->layers;
  loom_module *kids[4] = {NULL, NULL, NULL, NULL}, *m = NULL;
  loom_module **blocks = loom__calloc(LOOM_POOL_COMPUTE, (size_t)L, sizeof *blocks);
  if (!blocks) return loom__fail(LOOM_ENOMEM, "loom_nn_gpt_create: out of memory");
  LOOM_TRY(loom__embedding_bare(cfg->vocab, C, &kids[GPT_WTE]));
  LOOM_TRY(loom__embedding_bare(cfg->context, C, &kids[GPT_WPE]));
  for (int64_t i = 0; i < L; i++) LOOM_TRY(loom__gpt_block_create(C, cfg->heads, &blocks[i]));
  rc = loom__sequential_bare(blocks, (size_t)L, &kids[GPT_H]); /* takes the blocks */
  memset(blocks, 0, (size_t)L * sizeof *blocks);
  if (rc) goto done;
  LOOM_TRY(loom__layer_norm_bare(C, 1e-5, &kids[GPT_LN_F]));
  LOOM_TRY(loom__module_new("GPT2", gpt_forward, &m));
  m->cfg[CFG_VOCAB] = cfg->vocab;
  m->cfg[CFG_CONTEXT] = cfg->context;
  m->cfg[CFG_LAYERS] = L;
  m->cfg[CFG_HEADS] = cfg->heads;
  m->cfg[CFG_DIM] = C;
  static const char *const names[4] = {"wte", "wpe", "h", "ln_f"};
  rc = loom__module_adopt(m, kids, 4, names); /* takes the children */
  memset(kids, 0, sizeof kids);
  if (rc) goto done;
  init_state s = {.seed = seed, .proj_std = 0.02 / sqrt(2.0 * (double)L)};
  init_tree(m, false, &s);
  LOOM_TRY(loom__module_pack(m)); /* the one arena, filled from the recipes (or deferred) */
  *out = m;
  m = NULL;
done:
  for (int64_t i = 0; i < L; i++) loom_module_free(blocks[i]);
  loom__free(blocks);
  for (int i = 0; i < 4; i++) loom_module_free(kids[i]);
  loom_module_free(m);
  return rc;
}

int loom_gpt_set_checkpoint(loom_module *gpt, bool on) {
  if (!gpt) return loom__fail(LOOM_EINVAL, "loom_gpt_set_checkpoint: model is NULL");
  if (strcmp(gpt->type, "GPT2") || gpt->n_children != 4)
    return loom__fail(LOOM_EMISUSE, "loom_gpt_set_checkpoint: the module is a %s, not a GPT2 "
                      "model", gpt->type);
  loom_module *h = gpt->children[GPT_H];
  for (int i = 0; i < h->n_children; i++) h->children[i]->checkpoint = on;
  return LOOM_OK;
}

/* ---- loss --------------------------------------------------------------------------------- */

int loom_gpt_loss(loom_tensor *logits, loom_tensor *targets, loom_tensor **out) {
  static const char *who = "loom_gpt_loss";
  if (out) *out = NULL;
  if (!out) return loom__fail(LOOM_EINVAL, "%s: out is NULL", who);
  int rc = loom_tensor_check(logits, who);
  if (!rc) rc = loom_tensor_check(targets, who);
  if (rc) return rc;
  if (loom_tensor_ndim(logits) != 3 || loom_tensor_ndim(targets) != 2 ||
      loom_tensor_dim(logits, 0) != loom_tensor_dim(targets, 0) ||
      loom_tensor_dim(logits, 1) != loom_tensor_dim(targets, 1))
    return loom__fail(LOOM_ESHAPE, "%s: logits must be [B, T, V] and targets [B, T]; got %d-D "
                      "and %d-D tensors whose first dims differ or are not these", who,
                      loom_tensor_ndim(logits), loom_tensor_ndim(targets));
  int64_t rows = loom_tensor_dim(logits, 0) * loom_tensor_dim(logits, 1);
  int64_t ls[2] = {rows, loom_tensor_dim(logits, 2)};
  loom_tensor *l2 = NULL, *t1 = NULL;
  rc = loom_reshape(logits, 2, ls, &l2);
  if (!rc) rc = loom_reshape(targets, 1, &rows, &t1);
  if (!rc) rc = loom_cross_entropy(l2, t1, LOOM_REDUCTION_MEAN, -100, out);
  loom_tensor_free(l2);
  loom_tensor_free(t1);
  return rc;
}
