/* core/layout.h: the flat layout (loom/layout.h) as a cursor, for the layers that place
 * tensors one at a time (nn's per-dtype arenas, DDP's buckets, FSDP's units). Every offset in
 * loom comes from loom__layout_add; loom_layout_plan is a loop over it. */
#ifndef LOOM_CORE_LAYOUT_H
#define LOOM_CORE_LAYOUT_H

#include "loom/layout.h"

#include <stdbool.h>

typedef struct loom__layout {
  size_t align; /* elements per LOOM_LAYOUT_ALIGN_BYTES */
  size_t end;   /* end of the last tensor placed */
  bool overflow; /* a placement did not fit in size_t */
} loom__layout;

/* An empty layout for dtype dt (a valid dtype; f32/f16/bf16 in practice). */
void loom__layout_init(loom__layout *l, loom_dtype dt);
/* Place a tensor of numel elements after the last one, at the next aligned offset; returns
 * that offset. Sets l->overflow (and returns 0) if it does not fit. */
size_t loom__layout_add(loom__layout *l, size_t numel);
/* The buffer length for `world` (>= 1) ranks: end rounded up to world x align (SIZE_MAX and
 * l->overflow on overflow). */
size_t loom__layout_padded(loom__layout *l, size_t world);

/* Rank r's shard of a layout of `padded` elements is [r * shard, (r + 1) * shard). The part of a
 * tensor placed at [offset, offset + numel) that falls in the shard [lo, hi): true with
 * [*a, *b) its range in the layout (elements *a - offset of the tensor sit at *a - lo of the
 * shard), false if the shard holds none of it. */
bool loom__layout_slice(size_t offset, size_t numel, size_t lo, size_t hi, size_t *a, size_t *b);

#endif
