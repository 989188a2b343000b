/* cast.c: the cast op, on the tape: forward converts to the target dtype, backward hands the
 * f32 gradient back (the engine accumulates it into a leaf in the leaf's own dtype), so a
 * parameter's gradient keeps the parameter's dtype under autocast. A cast node is
 * pass-through for gradient sinks (autograd_int.h): an op consuming the cast of an f32 leaf
 * may write its gradient straight into the leaf's f32 buffer, skipping the rounding. */
#include "ops/ops_int.h"

static int cast_backward(loom__node *n, loom_tensor *g, loom_tensor **gin) {
  /* Round through the output dtype first, as the gradient of a tensor of that dtype is: in one
   * pass (loom__round_via), in place when nobody else holds g. */
  if (n->out_dtype == LOOM_F32) return loom_tensor_clone(g, &gin[0]);
  if (g->dtype == LOOM_F32 && loom_tensor_is_contiguous(g)) {
    if (loom__grad_exclusive(g)) gin[0] = loom_tensor_retain(g);
    else {
      int rc = loom__grad_new(n->in[0].ndim, n->in[0].shape, false, &gin[0]);
      if (rc) return rc;
    }
    loom__round_via(n->out_dtype, loom__f(g), loom__f(gin[0]), loom_tensor_numel(g));
    return LOOM_OK;
  }
  loom_tensor *r = NULL; /* a gradient of another dtype or layout: the two casts */
  int rc = loom_tensor_cast(g, n->out_dtype, &r);
  if (!rc) rc = loom_tensor_cast(r, LOOM_F32, &gin[0]);
  loom_tensor_free(r);
  return rc;
}

int loom_cast(loom_tensor *x, loom_dtype dt, loom_tensor **out) {
  static const char *name = "cast";
  int rc = loom__check_out(name, out);
  if (rc) return rc;
  if ((rc = loom__check_float(name, x, "x"))) return rc;
  if (!loom_dtype_is_float(dt))
    return loom__fail(LOOM_EDTYPE, "%s: target dtype must be f32, f16 or bf16, not %s", name,
                      loom_dtype_name(dt));
  loom__op c;
  loom_tensor *y = NULL;
  loom__node *nd = NULL;
  if ((rc = loom__op_begin(&c, LOOM_OPK_CAST, &x, 1))) return rc;
  LOOM_TRY(loom_tensor_cast(c.in[0], dt, &y));
  LOOM_TRY(loom__op_record(&c, y, cast_backward, &nd));
  if (nd) nd->passthrough = true; /* sinks may write into x's gradient past the rounding */
done:
  return loom__op_finish(&c, rc, y, out);
}
