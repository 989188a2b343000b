/* fuzz_safetensors.c: the safetensors header and its JSON (loom_safetensors_open_memory), then
 * every accessor over whatever it accepted: each tensor's entry, its view and copy, the
 * metadata. A valid file must be consistent (offsets inside the data, sizes as declared). */
#include "fuzz_util.h"
#include "loom/loom.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  loom_safetensors *f = NULL;
  if (loom_safetensors_open_memory(data, size, "fuzz", &f)) return 0;
  size_t n = loom_safetensors_count(f);
  for (size_t i = 0; i < n; i++) {
    loom_safetensors_info info;
    if (loom_safetensors_info_at(f, i, &info)) abort(); /* listed, so it must be there */
    loom_safetensors_info again;
    if (loom_safetensors_find(f, info.name, &again) || again.data != info.data) abort();
    if (info.nbytes > size) abort(); /* the data lies inside the input */
    if (info.numel <= FUZZ_MAX_ELEMS) {
      loom_tensor *t = NULL;
      if (!loom_safetensors_get(f, info.name, &t)) {
        if (info.nbytes && memcmp(loom_tensor_data(t), info.data, info.nbytes)) abort();
        loom_tensor_free(t);
      }
      if (!loom_safetensors_view(f, info.name, &t)) loom_tensor_free(t);
    }
  }
  for (size_t i = 0; i < loom_safetensors_meta_count(f); i++) {
    const char *k = NULL, *v = NULL;
    if (loom_safetensors_meta_at(f, i, &k, &v) || !k || !v) abort();
    if (loom_safetensors_meta(f, k) == NULL) abort();
    int64_t x;
    double d;
    (void)loom_safetensors_meta_i64(f, k, &x);
    (void)loom_safetensors_meta_f64(f, k, &d);
  }
  loom_safetensors_free(f);
  return 0;
}
