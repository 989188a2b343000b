/* loom/layout.h: the one flat layout of parameters and gradients.
 *
 * A module's parameter arena, a DDP bucket and an FSDP unit's flat parameter are the same
 * thing: tensors of one dtype placed one after another in one flat buffer, each at an offset
 * aligned to LOOM_LAYOUT_ALIGN_BYTES bytes (64: a cache line, and whole vectors for every
 * kernel level), the whole padded to a multiple of world x the alignment so that each of
 * `world` ranks holds an equal, aligned shard (PyTorch FSDP's _get_aligned_numel and flat
 * parameter padding). This call is how a program, or `loom plan`, gets the library's answer
 * without copying its rule.
 *
 * Errors: LOOM_EINVAL (NULL numel with n > 0, NULL out, world < 1), LOOM_EDTYPE (not a floating
 * dtype), LOOM_EOVERFLOW (the total overflows size_t). Pure arithmetic: no allocation, no state. */
#ifndef LOOM_LAYOUT_H
#define LOOM_LAYOUT_H

#include "loom/dtype.h"

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define LOOM_LAYOUT_ALIGN_BYTES 64

typedef struct loom_layout_info {
  size_t align;  /* elements per aligned step (64 bytes / the dtype's size) */
  size_t numel;  /* end of the last tensor: offsets[n-1] + numel[n-1] (0 for none) */
  size_t padded; /* numel rounded up to a multiple of world x align: the buffer's length */
  size_t shard;  /* padded / world: each rank's part, a multiple of align */
} loom_layout_info;

/* Lay out n tensors of numel[i] elements of dtype dt for `world` ranks. offsets (may be NULL)
 * receives each tensor's element offset. */
int loom_layout_plan(loom_dtype dt, const size_t *numel, size_t n, size_t world, size_t *offsets,
                     loom_layout_info *out);

#ifdef __cplusplus
}
#endif
#endif
