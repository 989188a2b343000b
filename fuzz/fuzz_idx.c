/* fuzz_idx.c: the IDX reader (loom_idx_read: magic, big-endian dimensions, data; plain or gzip,
 * zlib tells them apart), through a file as the data set loader has it. With FUZZ_IDX_GZIP
 * the input is gzip-compressed first (fuzz_idx_gz), so mutations of the IDX content reach the
 * parser through a valid gzip stream as well as through a corrupt one. */
#include "fuzz_util.h"
#include "loom/loom.h"

#include <stdlib.h>
#include <zlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const uint8_t *bytes = data;
  size_t n = size;
  uint8_t *packed = NULL;
#ifdef FUZZ_IDX_GZIP
  z_stream z = {0};
  if (deflateInit2(&z, 1, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) return 0;
  uLong cap = deflateBound(&z, (uLong)size) + 32;
  packed = malloc(cap);
  if (!packed) {
    deflateEnd(&z);
    return 0;
  }
  z.next_in = (Bytef *)data;
  z.avail_in = (uInt)size;
  z.next_out = packed;
  z.avail_out = (uInt)cap;
  if (deflate(&z, Z_FINISH) != Z_STREAM_END) {
    deflateEnd(&z);
    free(packed);
    return 0;
  }
  n = z.total_out;
  deflateEnd(&z);
  bytes = packed;
#endif
  char path[64];
  int fd = fuzz_as_file(bytes, n, path, sizeof path);
  if (fd >= 0) {
    loom_idx *x = NULL;
    if (!loom_idx_read(path, &x)) {
      loom_idx_info info;
      loom_idx_get_info(x, &info);
      size_t numel = 1;
      for (int d = 0; d < info.ndim; d++) numel *= info.dims[d];
      if (numel != info.numel) abort(); /* what it accepted is what it says */
      loom_idx_free(x);
    }
    close(fd);
  }
  free(packed);
  return 0;
}
