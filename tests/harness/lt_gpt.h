/* lt_gpt.h: what the GPT-2 tests share (tests/nn/test_gpt.c, tests/fsdp/test_fsdp_gpt.c): a
 * small byte-level text, batches of its windows, and one forward + loss + backward. */
#ifndef LT_GPT_H
#define LT_GPT_H

#include "loom/loom.h"

#include <string.h>

static const char lt_gpt_text[] =
    "the quick brown fox jumps over the lazy dog. pack my box with five dozen liquor jugs. ";

/* rows windows of t + 1 bytes of the text (row r starts at byte 7 * (row0 + r), wrapping):
 * inputs the first t bytes, targets the next t, as i64 [rows, t]. */
static inline int lt_gpt_batch(int64_t row0, int64_t rows, int64_t t, loom_tensor **x,
                               loom_tensor **y) {
  int64_t shape[2] = {rows, t};
  *x = *y = NULL;
  int rc = loom_tensor_empty(LOOM_I64, 2, shape, x);
  if (!rc) rc = loom_tensor_empty(LOOM_I64, 2, shape, y);
  if (rc) return rc;
  int64_t *xd = loom_tensor_data(*x), *yd = loom_tensor_data(*y);
  const int64_t n = (int64_t)strlen(lt_gpt_text);
  for (int64_t r = 0; r < rows; r++)
    for (int64_t i = 0; i < t; i++) {
      int64_t at = 7 * (row0 + r) + i;
      xd[r * t + i] = (unsigned char)lt_gpt_text[at % n];
      yd[r * t + i] = (unsigned char)lt_gpt_text[(at + 1) % n];
    }
  return LOOM_OK;
}

/* Forward rows [row0, row0 + rows) of windows of t bytes under autocast `amp`, the mean loss
 * into *loss (may be NULL), and backward of loss x scale. */
static inline int lt_gpt_backward(loom_module *m, int64_t row0, int64_t rows, int64_t t,
                                  loom_autocast_mode amp, float scale, double *loss) {
  loom_tensor *x = NULL, *y = NULL, *logits = NULL, *l = NULL, *scaled = NULL;
  loom_autocast_token tok = {0};
  int rc = lt_gpt_batch(row0, rows, t, &x, &y);
  if (!rc) rc = loom_autocast_enter(amp, NULL, &tok);
  if (!rc) {
    rc = loom_module_forward(m, x, &logits);
    if (!rc) rc = loom_gpt_loss(logits, y, &l);
    int rc2 = loom_autocast_exit(&tok);
    if (!rc) rc = rc2;
  }
  if (!rc && loss) rc = loom_tensor_item(l, loss);
  if (!rc) rc = loom_mul_scalar(l, scale, &scaled);
  if (!rc) rc = loom_backward(scaled, NULL, false);
  loom_tensor_free(x);
  loom_tensor_free(y);
  loom_tensor_free(logits);
  loom_tensor_free(l);
  loom_tensor_free(scaled);
  return rc;
}

#endif
