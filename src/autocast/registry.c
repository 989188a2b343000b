/* registry.c: the op-precision registry (AmpRegistry): op kinds and policies by name, the f16
 * and bf16 presets as data (PyTorch's autocast lists), registries whose policies change at run
 * time (one atomic byte per kind), the two process-wide default registries, and the lookup that
 * turns (policy, mode, input dtypes) into a target dtype. Part of the autocast layer: includes
 * only core. */
#include "autocast/autocast_int.h"
#include "core/core_int.h"

#include <stdatomic.h>
#include <string.h>

/* ---- names --------------------------------------------------------------------------------- */

static const char *op_names[LOOM_AMP_OP_COUNT] = {
#define LOOM__AMP_OP_NAME(name, str) str,
    LOOM_AMP_OP_MAP(LOOM__AMP_OP_NAME)
#undef LOOM__AMP_OP_NAME
};

static const char *policy_names[LOOM_AMP_POLICY_COUNT] = {"none", "lower", "fp32", "promote"};
static const char *mode_names[LOOM_AUTOCAST_MODE_COUNT] = {"off", "f16", "bf16"};

const char *loom_amp_op_name(loom_amp_op op) {
  return (unsigned)op < LOOM_AMP_OP_COUNT ? op_names[op] : "?";
}

const char *loom_amp_policy_name(loom_amp_policy p) {
  return (unsigned)p < LOOM_AMP_POLICY_COUNT ? policy_names[p] : "?";
}

const char *loom_autocast_mode_name(loom_autocast_mode m) {
  return (unsigned)m < LOOM_AUTOCAST_MODE_COUNT ? mode_names[m] : "?";
}

/* Index of `name` in names[0..n) or -1. */
static int find(const char *const *names, int n, const char *name) {
  for (int i = 0; i < n; i++)
    if (strcmp(names[i], name) == 0) return i;
  return -1;
}

int loom_amp_op_parse(const char *name, loom_amp_op *out) {
  if (!name || !out)
    return loom__fail(LOOM_EINVAL, "loom_amp_op_parse: %s is NULL", !name ? "name" : "out");
  int i = find(op_names, LOOM_AMP_OP_COUNT, name);
  if (i < 0) return loom__fail(LOOM_ENOTFOUND, "loom_amp_op_parse: no op kind \"%s\"", name);
  *out = (loom_amp_op)i;
  return LOOM_OK;
}

int loom_amp_policy_parse(const char *name, loom_amp_policy *out) {
  if (!name || !out)
    return loom__fail(LOOM_EINVAL, "loom_amp_policy_parse: %s is NULL", !name ? "name" : "out");
  int i = find(policy_names, LOOM_AMP_POLICY_COUNT, name);
  if (i < 0)
    return loom__fail(LOOM_ENOTFOUND, "loom_amp_policy_parse: no policy \"%s\" (none, lower, "
                      "fp32, promote)", name);
  *out = (loom_amp_policy)i;
  return LOOM_OK;
}

int loom_autocast_mode_parse(const char *name, loom_autocast_mode *out) {
  static const char *alias[] = {"none", "fp16", "float16", "bfloat16"};
  static const loom_autocast_mode alias_mode[] = {LOOM_AUTOCAST_OFF, LOOM_AUTOCAST_F16,
                                                  LOOM_AUTOCAST_F16, LOOM_AUTOCAST_BF16};
  if (!name || !out)
    return loom__fail(LOOM_EINVAL, "loom_autocast_mode_parse: %s is NULL", !name ? "name" : "out");
  int i = find(mode_names, LOOM_AUTOCAST_MODE_COUNT, name);
  if (i >= 0) {
    *out = (loom_autocast_mode)i;
    return LOOM_OK;
  }
  if ((i = find(alias, 4, name)) >= 0) {
    *out = alias_mode[i];
    return LOOM_OK;
  }
  return loom__fail(LOOM_ENOTFOUND, "loom_autocast_mode_parse: no autocast mode \"%s\" (off, "
                    "f16, bf16)", name);
}

loom_dtype loom_autocast_mode_dtype(loom_autocast_mode m) {
  return m == LOOM_AUTOCAST_F16 ? LOOM_F16 : m == LOOM_AUTOCAST_BF16 ? LOOM_BF16 : LOOM_F32;
}

/* ---- presets (data) ------------------------------------------------------------------------ */

#define P(op, policy) [LOOM_AMP_OP_##op] = LOOM_AMP_##policy
/* Both presets: the GEMM-like ops in the low dtype; ops that need one input dtype promote.
 * Attention (sdpa): PyTorch 1.13 has no scaled_dot_product_attention; from 2.0 on its CPU and
 * CUDA lists both have it lower_precision_fp, and so does loom (which also gives q, k and v one
 * dtype). */
#define COMMON_POLICIES                                                                       \
  P(MATMUL, LOWER), P(LINEAR, LOWER), P(CONV2D, LOWER), P(BMM, LOWER), P(ADDMM, LOWER),       \
      P(BADDBMM, LOWER), P(SDPA, LOWER), P(ADD, PROMOTE), P(SUB, PROMOTE), P(MUL, PROMOTE),    \
      P(DIV, PROMOTE), P(CAT, PROMOTE), P(STACK, PROMOTE), P(CROSS_ENTROPY, FP32),              \
      P(MSE, FP32), P(NLL_LOSS, FP32), P(L1_LOSS, FP32), P(BCE_WITH_LOGITS, FP32), P(PROD, FP32)
/* f16 (PyTorch's CUDA lists): also fp32 for exp/log/pow, softmax, norms, sums, logsumexp.
 * cross_entropy is composite there (log_softmax + nll_loss, both fp32). */
#define F16_POLICIES                                                                          \
  COMMON_POLICIES, P(EXP, FP32), P(LOG, FP32), P(POW, FP32), P(SOFTMAX, FP32),                \
      P(LOG_SOFTMAX, FP32), P(LAYER_NORM, FP32), P(GROUP_NORM, FP32), P(SUM, FP32),            \
      P(CUMSUM, FP32), P(NORM, FP32), P(LOGSUMEXP, FP32)
/* bf16 (PyTorch's CPU lists): the losses and prod in fp32, everything else falls through. */
#define BF16_POLICIES COMMON_POLICIES

static const unsigned char preset_f16[LOOM_AMP_OP_COUNT] = {F16_POLICIES};
static const unsigned char preset_bf16[LOOM_AMP_OP_COUNT] = {BF16_POLICIES};

static const unsigned char *preset_table(loom_autocast_mode m) {
  return m == LOOM_AUTOCAST_F16 ? preset_f16 : m == LOOM_AUTOCAST_BF16 ? preset_bf16 : NULL;
}

loom_amp_policy loom_amp_preset_policy(loom_autocast_mode preset, loom_amp_op op) {
  const unsigned char *t = preset_table(preset);
  return t && (unsigned)op < LOOM_AMP_OP_COUNT ? (loom_amp_policy)t[op] : LOOM_AMP_NONE;
}

/* ---- registries ---------------------------------------------------------------------------- */

#define REGISTRY_MAGIC 0x52454759u /* "REGY" */

struct loom_amp_registry {
  uint32_t magic;
  loom_autocast_mode preset;
  bool is_default;
  _Atomic unsigned char policy[LOOM_AMP_OP_COUNT];
};

static loom_amp_registry default_f16 = {REGISTRY_MAGIC, LOOM_AUTOCAST_F16, true, {F16_POLICIES}};
static loom_amp_registry default_bf16 = {REGISTRY_MAGIC, LOOM_AUTOCAST_BF16, true,
                                         {BF16_POLICIES}};
#undef P

loom_amp_registry *loom_amp_registry_default(loom_autocast_mode mode) {
  return mode == LOOM_AUTOCAST_F16 ? &default_f16 : mode == LOOM_AUTOCAST_BF16 ? &default_bf16 : NULL;
}

static void load_preset(loom_amp_registry *r) {
  const unsigned char *t = preset_table(r->preset);
  for (int i = 0; i < LOOM_AMP_OP_COUNT; i++)
    atomic_store_explicit(&r->policy[i], t[i], memory_order_relaxed);
}

int loom_amp_registry_create(loom_autocast_mode preset, loom_amp_registry **out) {
  if (!out) return loom__fail(LOOM_EINVAL, "loom_amp_registry_create: out is NULL");
  *out = NULL;
  if (!preset_table(preset))
    return loom__fail(LOOM_EINVAL, "loom_amp_registry_create: preset %d is not f16 or bf16",
                      (int)preset);
  loom_amp_registry *r = loom__calloc(LOOM_POOL_META, 1, sizeof *r);
  if (!r) return loom__fail(LOOM_ENOMEM, "loom_amp_registry_create: out of memory");
  r->magic = REGISTRY_MAGIC;
  r->preset = preset;
  load_preset(r);
  *out = r;
  return LOOM_OK;
}

void loom_amp_registry_free(loom_amp_registry *reg) {
  if (!reg || reg->magic != REGISTRY_MAGIC || reg->is_default) return;
  reg->magic = 0;
  loom__free(reg);
}

/* LOOM_EINVAL for NULL, LOOM_EMISUSE for a freed registry. */
static int check_reg(const loom_amp_registry *reg, const char *who) {
  if (!reg) return loom__fail(LOOM_EINVAL, "%s: registry is NULL", who);
  if (reg->magic != REGISTRY_MAGIC)
    return loom__fail(LOOM_EMISUSE, "%s: registry is not live (freed or not a registry)", who);
  return LOOM_OK;
}

int loom__amp_registry_check(const loom_amp_registry *reg, const char *who) {
  return check_reg(reg, who);
}

loom_autocast_mode loom_amp_registry_preset(const loom_amp_registry *reg) {
  return reg && reg->magic == REGISTRY_MAGIC ? reg->preset : LOOM_AUTOCAST_OFF;
}

int loom_amp_registry_set(loom_amp_registry *reg, loom_amp_op op, loom_amp_policy policy) {
  static const char *who = "loom_amp_registry_set";
  int rc = check_reg(reg, who);
  if (rc) return rc;
  if ((unsigned)op >= LOOM_AMP_OP_COUNT)
    return loom__fail(LOOM_EINVAL, "%s: op kind %d is not a kind (0..%d)", who, (int)op,
                      LOOM_AMP_OP_COUNT - 1);
  if ((unsigned)policy >= LOOM_AMP_POLICY_COUNT)
    return loom__fail(LOOM_EINVAL, "%s: policy %d for %s is not a policy (none, lower, fp32, "
                      "promote)", who, (int)policy, op_names[op]);
  atomic_store_explicit(&reg->policy[op], (unsigned char)policy, memory_order_relaxed);
  return LOOM_OK;
}

int loom_amp_registry_set_by_name(loom_amp_registry *reg, const char *op, const char *policy) {
  loom_amp_op k;
  loom_amp_policy p;
  int rc;
  if ((rc = check_reg(reg, "loom_amp_registry_set_by_name")) || (rc = loom_amp_op_parse(op, &k)) ||
      (rc = loom_amp_policy_parse(policy, &p)))
    return rc;
  return loom_amp_registry_set(reg, k, p);
}

int loom_amp_registry_get(const loom_amp_registry *reg, loom_amp_op op, loom_amp_policy *out) {
  static const char *who = "loom_amp_registry_get";
  int rc = check_reg(reg, who);
  if (rc) return rc;
  if (!out) return loom__fail(LOOM_EINVAL, "%s: out is NULL", who);
  if ((unsigned)op >= LOOM_AMP_OP_COUNT)
    return loom__fail(LOOM_EINVAL, "%s: op kind %d is not a kind (0..%d)", who, (int)op,
                      LOOM_AMP_OP_COUNT - 1);
  *out = (loom_amp_policy)atomic_load_explicit(&reg->policy[op], memory_order_relaxed);
  return LOOM_OK;
}

int loom_amp_registry_reset(loom_amp_registry *reg) {
  int rc = check_reg(reg, "loom_amp_registry_reset");
  if (rc) return rc;
  load_preset(reg);
  return LOOM_OK;
}

/* ---- the lookup ---------------------------------------------------------------------------- */

bool loom_amp_registry_dtype_for(const loom_amp_registry *reg, loom_autocast_mode mode,
                                 loom_amp_op op, const loom_dtype *in, size_t n, loom_dtype *out) {
  if (mode != LOOM_AUTOCAST_F16 && mode != LOOM_AUTOCAST_BF16) return false;
  if ((unsigned)op >= LOOM_AMP_OP_COUNT || !in || n == 0) return false;
  if (!reg) reg = loom_amp_registry_default(mode);
  loom_dtype target;
  switch (atomic_load_explicit(&reg->policy[op], memory_order_relaxed)) {
  case LOOM_AMP_LOWER: target = loom_autocast_mode_dtype(mode); break;
  case LOOM_AMP_FP32: target = LOOM_F32; break;
  case LOOM_AMP_PROMOTE: { /* the one floating dtype, or f32 when they differ */
    size_t first = n;
    for (size_t i = 0; i < n && first == n; i++)
      if (loom_dtype_is_float(in[i])) first = i;
    if (first == n) return false;
    target = in[first];
    for (size_t i = first + 1; i < n; i++)
      if (loom_dtype_is_float(in[i]) && in[i] != target) target = LOOM_F32;
    break;
  }
  default: return false;
  }
  if (out) *out = target;
  for (size_t i = 0; i < n; i++)
    if (loom_dtype_is_float(in[i]) && in[i] != target) return true;
  return false;
}
