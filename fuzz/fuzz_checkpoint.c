/* fuzz_checkpoint.c: the checkpoint loader (loom_checkpoint_open: format marker and the CRC of
 * the whole file, through a file as every caller has it) and loom_checkpoint_read of every
 * tensor it lists, with the finite and non-negative checks an optimizer's state gets. */
#include "fuzz_util.h"
#include "loom/loom.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char path[64];
  int fd = fuzz_as_file(data, size, path, sizeof path);
  if (fd < 0) return 0;
  loom_safetensors *f = NULL;
  if (!loom_checkpoint_open(path, &f)) {
    size_t n = loom_safetensors_count(f);
    loom_checkpoint_entry *e = calloc(n ? n : 1, sizeof *e);
    size_t k = 0;
    for (size_t i = 0; e && i < n; i++) {
      loom_safetensors_info info;
      if (loom_safetensors_info_at(f, i, &info)) abort();
      if (info.numel > FUZZ_MAX_ELEMS || info.ndim > LOOM_MAX_DIMS || !info.has_loom_dtype)
        continue;
      e[k] = (loom_checkpoint_entry){info.name, info.dtype, info.ndim, {0}, NULL,
                                     LOOM_CHECK_FINITE | (i % 2 ? LOOM_CHECK_NONNEG : 0)};
      memcpy(e[k].shape, info.shape, (size_t)info.ndim * sizeof(int64_t));
      e[k].data = malloc(info.nbytes ? info.nbytes : 1);
      if (e[k].data) k++;
    }
    (void)loom_checkpoint_read(f, e, k);
    for (size_t i = 0; i < k; i++) free(e[i].data);
    free(e);
    loom_safetensors_free(f);
  }
  close(fd);
  return 0;
}
