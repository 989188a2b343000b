/* fsdp_amp.c: the specification's FSDPAmpIntegration on the FSDP object: local gradients in
 * f32 before they are reduce-scattered, the scaled loss, and the overflow check, which in FSDP
 * must be global (each rank sees only its shard: one all-reduce of the flag, then every rank
 * makes the same scale update, as PyTorch's ShardedGradScaler). ApplyMixedPrecision is in
 * fsdp_gather.c, next to the gathered buffers it converts. */
#include "fsdp/fsdp_int.h"
#include "amp/amp_int.h"

loom_fsdp_mp *loom_fsdp_mp_manager(loom_fsdp *f) { return f ? f->mp : NULL; }

int loom_fsdp_apply_gradient_fp32(loom_fsdp *f, size_t unit) {
  static const char *who = "loom_fsdp_apply_gradient_fp32";
  if (!f) return loom__fail(LOOM_EINVAL, "%s: fsdp is NULL", who);
  if (unit >= f->nunits)
    return loom__fail(LOOM_EINVAL, "%s: unit %zu out of range (%zu unit%s)", who, unit, f->nunits,
                      loom__fsdp_plural(f->nunits));
  fsdp_unit *u = &f->units[unit];
  if (!u->full_grad)
    return loom__fail(LOOM_EMISUSE, "%s: unit %zu ('%s') has no local gradient: gradients not "
                      "computed yet", who, unit, loom__fsdp_unit_shown(u->name));
  if (loom_tensor_dtype(u->full_grad) == LOOM_F32) return LOOM_OK; /* autograd's own dtype */
  loom_tensor *g32 = NULL;
  int rc = f->mp ? loom_fsdp_mp_convert_gradient_to_fp32(f->mp, u->full_grad, &g32)
                 : loom_tensor_cast(u->full_grad, LOOM_F32, &g32);
  if (rc) return rc;
  loom_tensor_free(u->full_grad);
  u->full_grad = g32;
  return LOOM_OK;
}

int loom_fsdp_scale_loss(loom_fsdp *f, loom_tensor *loss, loom_tensor **out) {
  if (!f || !loss || !out)
    return loom__fail(LOOM_EINVAL, "loom_fsdp_scale_loss: fsdp, loss and out must not be NULL");
  if (!f->mp) {
    *out = loom_tensor_retain(loss);
    return LOOM_OK;
  }
  return loom_fsdp_mp_scale_loss(f->mp, loss, out);
}

typedef struct unscale_ctx {
  double inv;
  bool bad;
} unscale_ctx;

static int unscale_chunk(void *ctx, fsdp_unit *u, size_t at, size_t n, float *k[OFF_KINDS]) {
  (void)u;
  (void)at;
  unscale_ctx *c = ctx;
  bool bad = false;
  int rc = c->inv != 1.0 ? loom__amp_unscale(k[OFF_GRAD], LOOM_F32, n, c->inv, &bad)
                         : loom__amp_has_nonfinite(k[OFF_GRAD], LOOM_F32, n, &bad);
  c->bad = c->bad || bad;
  return rc;
}

int loom_fsdp_check_overflow(loom_fsdp *f, bool *overflow) {
  if (!f || !overflow)
    return loom__fail(LOOM_EINVAL, "loom_fsdp_check_overflow: fsdp or overflow is NULL");
  *overflow = false;
  if (f->in_step)
    return loom__fail(LOOM_EMISUSE, "loom_fsdp_check_overflow: backward has not finished "
                      "(call loom_fsdp_finish first)");
  unscale_ctx c = {f->mp ? 1.0 / (double)loom_fsdp_mp_current_loss_scale(f->mp) : 1.0, false};
  unsigned g = 1u << OFF_GRAD;
  int rc = loom__fsdp_each(f, g, c.inv != 1.0 ? g : 0, unscale_chunk, &c);
  if (!rc) rc = loom_fsdp_any(f, c.bad, overflow);
  if (!rc && f->mp) rc = loom_fsdp_mp_update(f->mp, *overflow);
  return rc;
}
