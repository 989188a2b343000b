/* layout.c: the one flat layout of loom (loom/layout.h): aligned offsets one after another,
 * padded so that every rank's shard is equal and aligned. nn's arenas, DDP's buckets, FSDP's
 * units and `loom plan` (through loom_layout_plan) all place tensors here. */
#include "core/layout.h"
#include "core/core_int.h"

#include <stdint.h>

void loom__layout_init(loom__layout *l, loom_dtype dt) {
  size_t es = loom_dtype_size(dt);
  *l = (loom__layout){.align = es && es <= LOOM_LAYOUT_ALIGN_BYTES ? LOOM_LAYOUT_ALIGN_BYTES / es : 1};
}

/* x rounded up to a multiple of m (m > 0); false on overflow. */
static bool round_up(size_t x, size_t m, size_t *out) {
  size_t r = x % m;
  if (r && x > SIZE_MAX - (m - r)) return false;
  *out = r ? x + (m - r) : x;
  return true;
}

size_t loom__layout_add(loom__layout *l, size_t numel) {
  size_t off;
  if (!round_up(l->end, l->align, &off) || numel > SIZE_MAX - off) {
    l->overflow = true;
    return 0;
  }
  l->end = off + numel;
  return off;
}

size_t loom__layout_padded(loom__layout *l, size_t world) {
  size_t padded;
  if (world == 0 || l->align > SIZE_MAX / world || !round_up(l->end, world * l->align, &padded)) {
    l->overflow = true;
    return SIZE_MAX;
  }
  return padded;
}

bool loom__layout_slice(size_t offset, size_t numel, size_t lo, size_t hi, size_t *a, size_t *b) {
  *a = offset > lo ? offset : lo;
  *b = offset + numel < hi ? offset + numel : hi;
  return *a < *b;
}

int loom_layout_plan(loom_dtype dt, const size_t *numel, size_t n, size_t world, size_t *offsets,
                     loom_layout_info *out) {
  static const char *who = "loom_layout_plan";
  if (!out) return loom__fail(LOOM_EINVAL, "%s: out is NULL", who);
  if (n && !numel) return loom__fail(LOOM_EINVAL, "%s: numel is NULL for %zu tensors", who, n);
  if (world < 1) return loom__fail(LOOM_EINVAL, "%s: world must be >= 1 (got %zu)", who, world);
  if (!loom_dtype_is_float(dt))
    return loom__fail(LOOM_EDTYPE, "%s: a flat layout holds f32, f16 or bf16, not %s", who,
                      loom_dtype_valid(dt) ? loom_dtype_name(dt) : "an invalid dtype");
  loom__layout l;
  loom__layout_init(&l, dt);
  for (size_t i = 0; i < n; i++) {
    size_t off = loom__layout_add(&l, numel[i]);
    if (offsets) offsets[i] = off;
  }
  size_t padded = loom__layout_padded(&l, world);
  if (l.overflow)
    return loom__fail(LOOM_EOVERFLOW, "%s: %zu tensors over %zu ranks overflow a flat buffer", who,
                      n, world);
  *out = (loom_layout_info){.align = l.align, .numel = l.end, .padded = padded,
                            .shard = padded / world};
  return LOOM_OK;
}
