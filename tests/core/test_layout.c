/* test_layout.c: the one flat layout (loom/layout.h, core/layout.h) against its definition:
 * each tensor at the first 64-byte boundary after the previous one, the buffer padded to a
 * multiple of world x the alignment, every shard the same aligned length, a shard's slice of a
 * tensor; overflow and bad arguments refused with a message. */
#include "lt.h"
#include "core/layout.h"
#include "loom/loom.h"

#include <stdint.h>

LT_TEST(layout_places_each_tensor_at_the_next_aligned_offset) {
  const loom_dtype dts[] = {LOOM_F32, LOOM_F16, LOOM_BF16};
  const size_t numel[] = {1, 17, 0, 64, 3, 100};
  const size_t n = sizeof numel / sizeof *numel;
  for (size_t d = 0; d < 3; d++) {
    size_t align = 64 / loom_dtype_size(dts[d]);
    for (size_t world = 1; world <= 5; world++) {
      size_t off[6];
      loom_layout_info li;
      LT_OK(loom_layout_plan(dts[d], numel, n, world, off, &li));
      LT_EQ(li.align, align);
      size_t end = 0; /* the definition, written out */
      for (size_t i = 0; i < n; i++) {
        size_t want = (end + align - 1) / align * align;
        LT_EQ(off[i], want);
        end = want + numel[i];
      }
      LT_EQ(li.numel, end);
      LT_TRUE(li.padded >= li.numel && li.padded < li.numel + world * align);
      LT_EQ(li.padded % (world * align), 0);
      LT_EQ(li.shard * world, li.padded);
      LT_EQ(li.shard % align, 0);
    }
  }
  loom_layout_info none;
  LT_OK(loom_layout_plan(LOOM_F32, NULL, 0, 3, NULL, &none));
  LT_TRUE(none.numel == 0 && none.padded == 0 && none.shard == 0);
}

LT_TEST(layout_shard_slices_cover_every_tensor_once) {
  const size_t numel[] = {40, 7, 33, 16};
  size_t off[4];
  loom_layout_info li;
  LT_OK(loom_layout_plan(LOOM_F32, numel, 4, 3, off, &li));
  for (size_t t = 0; t < 4; t++) {
    size_t covered = 0;
    for (size_t r = 0; r < 3; r++) {
      size_t lo = r * li.shard, hi = lo + li.shard, a, b;
      if (!loom__layout_slice(off[t], numel[t], lo, hi, &a, &b)) continue;
      LT_TRUE(a >= lo && b <= hi && a >= off[t] && b <= off[t] + numel[t]);
      covered += b - a;
    }
    LT_EQ(covered, numel[t]);
  }
  size_t a, b;
  LT_TRUE(!loom__layout_slice(100, 10, 0, 100, &a, &b)); /* ends where the tensor starts */
}

LT_TEST(layout_refuses_overflow_and_bad_arguments) {
  loom_layout_info li;
  size_t huge[] = {SIZE_MAX - 10, 100};
  LT_ERR(loom_layout_plan(LOOM_F32, huge, 2, 1, NULL, &li), LOOM_EOVERFLOW, "overflow");
  size_t one = 5;
  LT_ERR(loom_layout_plan(LOOM_F32, &one, 1, SIZE_MAX / 2, NULL, &li), LOOM_EOVERFLOW, "overflow");
  LT_ERR(loom_layout_plan(LOOM_F32, &one, 1, 0, NULL, &li), LOOM_EINVAL, "world must be >= 1");
  LT_ERR(loom_layout_plan(LOOM_I64, &one, 1, 1, NULL, &li), LOOM_EDTYPE, "not i64");
  LT_ERR(loom_layout_plan(LOOM_F32, NULL, 1, 1, NULL, &li), LOOM_EINVAL, "numel is NULL");
  LT_ERR(loom_layout_plan(LOOM_F32, &one, 1, 1, NULL, NULL), LOOM_EINVAL, "out is NULL");
}
