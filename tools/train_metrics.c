/* train_metrics.c: the --metrics FILE.jsonl of `loom train`: one JSON object per step on one
 * line (step, epoch, loss, lr, scale, overflow, samples_per_s, the caller's extra members, and
 * current and peak bytes of every memory pool), flushed as it goes so a crashed run keeps its
 * records. Non-finite numbers (a NaN loss) are written as null, since JSON has no NaN. */
#include "train_api.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

struct train_metrics {
  FILE *f;
  char *path;
  int rc;
};

int train_metrics_open(const char *path, bool append, train_metrics **out) {
  *out = NULL;
  train_metrics *mt = calloc(1, sizeof *mt);
  if (!mt) return train_fail(LOOM_ENOMEM, "--metrics: out of memory");
  mt->path = strdup(path);
  mt->f = fopen(path, append ? "a" : "w");
  if (!mt->f || !mt->path) {
    int rc = train_fail(LOOM_EIO, "--metrics %s: cannot open for writing: %s", path,
                        strerror(errno));
    train_metrics_close(mt);
    return rc;
  }
  *out = mt;
  return LOOM_OK;
}

static void number(FILE *f, const char *key, double v) {
  if (isfinite(v))
    fprintf(f, "\"%s\": %.9g, ", key, v);
  else
    fprintf(f, "\"%s\": null, ", key);
}

int train_metrics_write(train_metrics *mt, const train_record *r) {
  FILE *f = mt->f;
  fprintf(f, "{\"step\": %lld, \"epoch\": %lld, ", (long long)r->step, (long long)r->epoch);
  number(f, "loss", r->loss);
  number(f, "lr", r->lr);
  number(f, "scale", r->scale);
  fprintf(f, "\"overflow\": %s, ", r->overflow ? "true" : "false");
  number(f, "samples_per_s", r->samples_per_s);
  if (r->extra && *r->extra) fprintf(f, "%s, ", r->extra);
  fprintf(f, "\"mem\": {");
  for (int p = 0; p < LOOM_POOL_COUNT; p++) {
    loom_pool_stats s = {0};
    loom_mem_stats((loom_pool)p, &s);
    fprintf(f, "%s\"%s\": {\"current_bytes\": %zu, \"peak_bytes\": %zu}", p ? ", " : "",
            loom_pool_name((loom_pool)p), s.current_bytes, s.peak_bytes);
  }
  fprintf(f, "}}\n");
  if (fflush(f) != 0 || ferror(f))
    return mt->rc = train_fail(LOOM_EIO, "--metrics %s: write failed: %s", mt->path,
                               strerror(errno));
  return LOOM_OK;
}

int train_metrics_close(train_metrics *mt) {
  if (!mt) return LOOM_OK;
  int rc = mt->rc;
  if (mt->f && fclose(mt->f) != 0 && !rc)
    rc = train_fail(LOOM_EIO, "--metrics %s: close failed: %s", mt->path, strerror(errno));
  free(mt->path);
  free(mt);
  return rc;
}
