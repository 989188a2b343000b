/* fuzz_loader.c: the tensor loader `loom train --init` uses (tools/train_model.c): open, then
 * each tensor read as f32 with its own shape (converting f16 / bf16 / f64 / integers) and its
 * values checked (finite, non-negative); and a read with the default MLP's first shape, which
 * a mismatched file must refuse. */
#include "fuzz_util.h"
#include "loom/loom.h"

#include <stdbool.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  loom_safetensors *f = NULL;
  if (loom_safetensors_open_memory(data, size, "fuzz-init", &f)) return 0;
  for (size_t i = 0; i < loom_safetensors_count(f); i++) {
    loom_safetensors_info info;
    if (loom_safetensors_info_at(f, i, &info)) abort();
    if (info.numel > FUZZ_MAX_ELEMS) continue;
    float *buf = malloc((info.numel ? info.numel : 1) * sizeof(float));
    if (!buf) continue;
    (void)loom_safetensors_read(f, info.name, LOOM_F32, info.ndim, info.shape, buf);
    (void)loom_safetensors_check_values(f, info.name, LOOM_CHECK_FINITE | LOOM_CHECK_NONNEG);
    int64_t mlp[2] = {1024, 784};
    bool fits = info.numel == 1024 * 784; /* only then may the read write into buf */
    if (!loom_safetensors_read(f, info.name, LOOM_F32, 2, mlp, fits ? buf : NULL) && !fits)
      abort(); /* a shape that is not the file's must be refused */
    free(buf);
  }
  loom_safetensors_free(f);
  return 0;
}
