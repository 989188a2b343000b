/* amp_function.c: AMP autograd functions (AmpAutogradFunction / AmpCustomFunction<TContext>):
 * a forward and a backward callback with a user context, run in dtypes chosen by the registry
 * (automatic) or by the caller (manual), recorded on the tape through
 * loom_autograd_record_custom. Forward and backward run with grad off and autocast off (as
 * PyTorch's custom_fwd(cast_inputs=...) / custom_bwd): the callbacks see exactly the dtypes
 * chosen. */
#include "amp/amp_int.h"
#include "loom/autograd.h"

#include <string.h>

#define FN_MAGIC 0x414d5046u /* "AMPF" */

struct loom_amp_function {
  uint32_t magic;
  loom_amp_function_def def;
  const loom_amp_registry *reg;
};

/* What a recorded node keeps: the definition (so the function may be freed first) and the
 * call. */
typedef struct fn_node {
  loom_amp_function_def def;
  loom_amp_call call;
} fn_node;

static loom_autocast_mode mode_of(loom_dtype dt) { /* MapDataTypeToMode */
  return dt == LOOM_F16 ? LOOM_AUTOCAST_F16 : dt == LOOM_BF16 ? LOOM_AUTOCAST_BF16
                                                              : LOOM_AUTOCAST_OFF;
}

static void call_clear(loom_amp_call *c) {
  for (int i = 0; i < LOOM_AMP_CALL_SAVED; i++) {
    loom_tensor_free(c->saved[i]);
    c->saved[i] = NULL;
  }
  if (c->state_free) c->state_free(c->state);
  c->state = NULL;
  c->state_free = NULL;
}

static void node_free(void *p) {
  fn_node *n = p;
  call_clear(&n->call);
  loom__free(n);
}

int loom_amp_function_create(const loom_amp_function_def *def, const loom_amp_registry *reg,
                             loom_amp_function **out) {
  static const char *who = "loom_amp_function_create";
  if (!out) return loom__fail(LOOM_EINVAL, "%s: out is NULL", who);
  *out = NULL;
  if (!def) return loom__fail(LOOM_EINVAL, "%s: def is NULL", who);
  if (!def->name) return loom__fail(LOOM_EINVAL, "%s: def.name is NULL", who);
  if (!def->forward || !def->backward)
    return loom__fail(LOOM_EINVAL, "%s: %s: def.%s is NULL", who, def->name,
                      def->forward ? "backward" : "forward");
  if (def->n_in < 1 || def->n_in > LOOM_AMP_FUNCTION_MAX_IN)
    return loom__fail(LOOM_EINVAL, "%s: %s: def.n_in = %d is outside [1, %d]", who, def->name,
                      def->n_in, LOOM_AMP_FUNCTION_MAX_IN);
  if ((unsigned)def->op >= LOOM_AMP_OP_COUNT)
    return loom__fail(LOOM_EINVAL, "%s: %s: def.op = %d is not an op kind", who, def->name,
                      (int)def->op);
  loom_amp_function *f = loom__calloc(LOOM_POOL_COMPUTE, 1, sizeof *f);
  if (!f) return loom__fail(LOOM_ENOMEM, "%s: out of memory", who);
  f->magic = FN_MAGIC;
  f->def = *def;
  f->reg = reg;
  *out = f;
  return LOOM_OK;
}

void loom_amp_function_free(loom_amp_function *f) {
  if (!f || f->magic != FN_MAGIC) return;
  f->magic = 0;
  loom__free(f);
}

static int check_fn(const loom_amp_function *f, const char *who) {
  if (!f) return loom__fail(LOOM_EINVAL, "%s: function is NULL", who);
  if (f->magic != FN_MAGIC) return loom__fail(LOOM_EMISUSE, "%s: function was freed", who);
  return LOOM_OK;
}

loom_dtype loom_amp_function_forward_dtype(const loom_amp_function *f, loom_autocast_mode mode,
                                           loom_dtype in) {
  loom_dtype out = in;
  if (!f || f->magic != FN_MAGIC || !loom_dtype_is_float(in)) return in;
  loom_amp_registry_dtype_for(f->reg, mode, f->def.op, &in, 1, &out);
  return out;
}

loom_dtype loom_amp_function_backward_dtype(const loom_amp_function *f, loom_autocast_mode mode,
                                            loom_dtype in) {
  return loom_amp_function_forward_dtype(f, mode, in);
}

/* ---- backward ---------------------------------------------------------------------------- */

static int node_backward(void *p, loom_tensor *grad_out, int n_in, const bool *needs,
                         loom_tensor **grad_in) {
  fn_node *nd = p;
  loom_amp_call *call = &nd->call;
  loom_tensor *g = NULL, *tmp[LOOM_AMP_FUNCTION_MAX_IN] = {0};
  int rc = LOOM_OK;
  if (call->backward_dtype != LOOM_F32 &&
      (rc = loom_tensor_cast(grad_out, call->backward_dtype, &g)))
    return rc;
  loom_autocast_token tok;
  call->ctx.mode = mode_of(call->backward_dtype);
  if ((rc = loom_autocast_enter(LOOM_AUTOCAST_OFF, NULL, &tok))) goto done;
  rc = nd->def.backward(nd->def.user, call, g ? g : grad_out, n_in, needs, tmp);
  int xrc = loom_autocast_exit(&tok);
  if (!rc) rc = xrc;
  for (int i = 0; i < n_in && !rc; i++) { /* the engine takes f32 contiguous gradients */
    if (!tmp[i]) continue;
    if (!needs[i]) {
      loom_tensor_free(tmp[i]);
      tmp[i] = NULL;
    } else if ((rc = loom_tensor_check(tmp[i], nd->def.name))) {
      tmp[i] = NULL; /* not ours to free */
    } else if (!loom_dtype_is_float(loom_tensor_dtype(tmp[i]))) {
      rc = loom__fail(LOOM_EDTYPE, "%s: backward gave gradient %d of dtype %s", nd->def.name, i,
                      loom_dtype_name(loom_tensor_dtype(tmp[i])));
    } else if (loom_tensor_dtype(tmp[i]) != LOOM_F32 || !loom_tensor_is_contiguous(tmp[i])) {
      loom_tensor *c = NULL;
      rc = loom_tensor_cast(tmp[i], LOOM_F32, &c);
      loom_tensor_free(tmp[i]);
      tmp[i] = c;
    }
  }
  for (int i = 0; i < n_in; i++) {
    if (rc) loom_tensor_free(tmp[i]);
    else grad_in[i] = tmp[i];
  }
done:
  loom_tensor_free(g);
  return rc;
}

/* ---- forward ----------------------------------------------------------------------------- */

static int check_inputs(const loom_amp_function *f, loom_tensor *const *in, int n,
                        loom_tensor **out, const char *who) {
  int rc = check_fn(f, who);
  if (rc) return rc;
  if (!out) return loom__fail(LOOM_EINVAL, "%s: %s: out is NULL", who, f->def.name);
  *out = NULL;
  if (n != f->def.n_in || !in)
    return loom__fail(LOOM_EINVAL, "%s: %s takes %d inputs, got %d", who, f->def.name,
                      f->def.n_in, in ? n : 0);
  for (int i = 0; i < n; i++)
    if ((rc = loom_tensor_check(in[i], who))) return rc;
  return LOOM_OK;
}

/* Cast floating inputs to fdt (cast false: leave them), run forward without grad or autocast,
 * record the output with backward dtype bdt. */
static int run(loom_amp_function *f, loom_tensor *const *in, int n, bool cast, loom_dtype fdt,
               loom_dtype bdt, loom_tensor **out, const char *who) {
  loom_tensor *x[LOOM_AMP_FUNCTION_MAX_IN] = {0}, *y = NULL;
  fn_node *nd = loom__calloc(LOOM_POOL_COMPUTE, 1, sizeof *nd);
  if (!nd) return loom__fail(LOOM_ENOMEM, "%s: out of memory", who);
  nd->def = f->def;
  loom_amp_call *call = &nd->call;
  loom_autocast_mode thread_mode = loom_autocast_get_mode();
  call->ctx = (loom_amp_context){.mode = thread_mode,
                                 .registry = f->reg ? f->reg : loom_autocast_get_registry()};
  call->forward_dtype = fdt;
  call->backward_dtype = bdt;
  int rc = LOOM_OK;
  for (int i = 0; i < n && !rc; i++)
    if (cast && loom_dtype_is_float(loom_tensor_dtype(in[i])) && loom_tensor_dtype(in[i]) != fdt)
      rc = loom_tensor_cast(in[i], fdt, &x[i]);
    else
      x[i] = loom_tensor_retain(in[i]);
  if (!rc && f->def.create_context) rc = f->def.create_context(f->def.user, in, n, call);
  if (!rc) {
    loom_autocast_token tok;
    call->ctx.mode = mode_of(fdt);
    loom_no_grad_enter();
    if (!(rc = loom_autocast_enter(LOOM_AUTOCAST_OFF, NULL, &tok))) {
      rc = f->def.forward(f->def.user, call, x, n, &y);
      int xrc = loom_autocast_exit(&tok);
      if (!rc) rc = xrc;
    }
    loom_no_grad_exit();
    if (!rc && !y) rc = loom__fail(LOOM_EINVAL, "%s: %s: forward gave no output", who, f->def.name);
    else if (!rc) rc = loom_tensor_check(y, f->def.name);
  }
  for (int i = 0; i < n; i++) loom_tensor_free(x[i]);
  if (rc) {
    loom_tensor_free(y);
    node_free(nd);
    return rc;
  }
  if ((rc = loom_autograd_record_custom(f->def.name, (loom_tensor **)in, n, y, node_backward, nd,
                                        node_free))) {
    loom_tensor_free(y);
    return rc;
  }
  *out = y;
  return LOOM_OK;
}

int loom_amp_function_forward(loom_amp_function *f, loom_tensor *const *inputs, int n_in,
                              loom_tensor **out) {
  static const char *who = "loom_amp_function_forward";
  int rc = check_inputs(f, inputs, n_in, out, who);
  if (rc) return rc;
  loom_dtype dts[LOOM_AMP_FUNCTION_MAX_IN], widest = LOOM_F32;
  int nf = 0;
  for (int i = 0; i < n_in; i++)
    if (loom_dtype_is_float(loom_tensor_dtype(inputs[i]))) dts[nf++] = loom_tensor_dtype(inputs[i]);
  if (nf) widest = dts[0]; /* one dtype, or f32 when they differ (promote) */
  for (int i = 1; i < nf; i++)
    if (dts[i] != widest) widest = LOOM_F32;
  loom_dtype target = widest;
  const loom_amp_registry *reg = f->reg ? f->reg : loom_autocast_get_registry();
  bool cast = loom_amp_registry_dtype_for(reg, loom_autocast_get_mode(), f->def.op, dts, nf,
                                          &target);
  return run(f, inputs, n_in, cast, target, target, out, who);
}

int loom_amp_function_forward_manual(loom_amp_function *f, loom_tensor *const *inputs, int n_in,
                                     loom_dtype forward_dtype, loom_dtype backward_dtype,
                                     loom_tensor **out) {
  static const char *who = "loom_amp_function_forward_manual";
  int rc = check_inputs(f, inputs, n_in, out, who);
  if (rc) return rc;
  if (!loom_dtype_is_float(forward_dtype) || !loom_dtype_is_float(backward_dtype))
    return loom__fail(LOOM_EDTYPE, "%s: %s: %s dtype %s is not f32, f16 or bf16", who,
                      f->def.name, loom_dtype_is_float(forward_dtype) ? "backward" : "forward",
                      loom_dtype_name(loom_dtype_is_float(forward_dtype) ? backward_dtype
                                                                          : forward_dtype));
  return run(f, inputs, n_in, true, forward_dtype, backward_dtype, out, who);
}
