/* fuzz_text.c: the byte-level text reader of `loom train --model gpt --text FILE` (loom_text,
 * src/io/text.c) on any bytes: the first two bytes choose the context (1..256) and the rows, the
 * rest is the text. When loom_text_check accepts the context, a training batch and validation
 * windows at the start, middle and end of the set are cut, and the harness checks them against
 * the rule of loom/io.h: each row is the context + 1 bytes of its split at the offset the rule
 * gives (the targets the inputs shifted by one), inside the split; a set or rows past the
 * split are refused. A violation aborts. */
#include "loom/loom.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Row r of x / y is split[starts[r] .. starts[r] + context] (inputs, then the targets shifted
 * by one), and inside the split's n bytes; abort if not. */
static void check_rows(const loom_tensor *x, const loom_tensor *y, const uint8_t *split, size_t n,
                       size_t rows, size_t context, const size_t *starts) {
  const int64_t *xi = loom_tensor_data(x), *yi = loom_tensor_data(y);
  if (loom_tensor_dim(x, 0) != (int64_t)rows || loom_tensor_dim(x, 1) != (int64_t)context ||
      loom_tensor_dim(y, 0) != (int64_t)rows || loom_tensor_dim(y, 1) != (int64_t)context)
    abort();
  for (size_t r = 0; r < rows; r++) {
    const int64_t *xr = xi + r * context, *yr = yi + r * context;
    if (starts[r] + context >= n) abort();
    for (size_t c = 0; c < context; c++)
      if (xr[c] != split[starts[r] + c] || yr[c] != split[starts[r] + c + 1]) abort();
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 2) return 0;
  size_t context = (size_t)data[0] + 1, rows = (size_t)(data[1] % 8) + 1;
  loom_text *t = NULL;
  if (loom_text_from_bytes(data + 2, size - 2, "fuzz-text", &t)) return 0;
  size_t ntrain = loom_text_size(t, LOOM_SPLIT_TRAIN), nval = loom_text_size(t, LOOM_SPLIT_TEST);
  if (ntrain + nval != size - 2 || nval != (size - 2) / 10) abort();
  if (memcmp(loom_text_bytes(t, LOOM_SPLIT_TRAIN), data + 2, size - 2) != 0) abort();
  loom_tensor *x = NULL, *y = NULL;
  int ok = loom_text_check(t, context) == LOOM_OK;
  if (ok != (ntrain > context && nval > context)) abort();
  uint64_t seed = data[1], step = size;
  size_t starts[8], row0 = 3;
  int rc = loom_text_batch(t, seed, step, row0, rows, context, &x, &y);
  if ((rc == LOOM_OK) != ok) abort();
  for (size_t r = 0; !rc && r < rows; r++) /* the rule of loom/io.h */
    starts[r] = loom_rng_hash(loom_rng_hash(seed, step), row0 + r) % (ntrain - context);
  if (!rc) check_rows(x, y, loom_text_bytes(t, LOOM_SPLIT_TRAIN), ntrain, rows, context, starts);
  loom_tensor_free(x);
  loom_tensor_free(y);
  size_t w = loom_text_val_windows(t, context);
  if (ok && (w == 0 || w * context + 1 > nval)) abort();
  size_t firsts[3] = {0, w / 2, w > rows ? w - rows : 0}; /* the start, middle and end */
  for (int i = 0; ok && i < 3; i++) {
    size_t first = firsts[i], n = w - first < rows ? w - first : rows;
    x = y = NULL;
    if (loom_text_val_batch(t, w, first, n, context, &x, &y)) abort();
    for (size_t r = 0; r < n; r++) starts[r] = (first + r) * context; /* count W: window k */
    check_rows(x, y, loom_text_bytes(t, LOOM_SPLIT_TEST), nval, n, context, starts);
    loom_tensor_free(x);
    loom_tensor_free(y);
  }
  /* a set larger than the split holds, or rows past its end, must be refused */
  x = y = NULL;
  if (ok && loom_text_val_batch(t, w + 1, 0, 1, context, &x, &y) == LOOM_OK) abort();
  if (ok && loom_text_val_batch(t, w, w, 1, context, &x, &y) == LOOM_OK) abort();
  loom_text_free(t);
  return 0;
}
