/* plot_read.c: reading back `loom train --metrics` files for `loom plot`: one JSON object a
 * line, the fields found by key (the records are flat but for the nested "mem" object, whose
 * compute-pool bytes are the memory series when rank_compute_bytes is absent). */
#include "plot.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The number after "key": in line, or NAN. */
static double field(const char *line, const char *key) {
  char pat[80];
  snprintf(pat, sizeof pat, "\"%s\":", key);
  const char *p = strstr(line, pat);
  if (!p) return NAN;
  p += strlen(pat);
  while (*p == ' ') p++;
  char *end = NULL;
  errno = 0;
  double v = strtod(p, &end);
  return end == p || errno ? NAN : v;
}

static int grow(plot_run *r, size_t cap) {
  double **series[] = {&r->step, &r->loss, &r->lr, &r->scale, &r->samples_per_s, &r->mem_mb};
  for (size_t i = 0; i < sizeof series / sizeof *series; i++) {
    double *p = realloc(*series[i], cap * sizeof(double));
    if (!p) return 1;
    *series[i] = p;
  }
  bool *o = realloc(r->overflow, cap * sizeof(bool));
  if (!o) return 1;
  r->overflow = o;
  return 0;
}

int plot_read(const char *path, plot_run *out) {
  memset(out, 0, sizeof *out);
  const char *slash = strrchr(path, '/');
  out->name = slash ? slash + 1 : path;
  FILE *f = fopen(path, "r");
  if (!f) {
    fprintf(stderr, "loom plot: %s: %s\n", path, strerror(errno));
    return 1;
  }
  char *line = NULL;
  size_t cap = 0, have = 0;
  long lineno = 0;
  int rc = 0;
  for (ssize_t len; !rc && (len = getline(&line, &cap, f)) >= 0;) {
    lineno++;
    size_t i = 0;
    while (line[i] == ' ' || line[i] == '\t' || line[i] == '\n' || line[i] == '\r') i++;
    if (!line[i]) continue;
    double step = field(line, "step"), loss = field(line, "loss");
    if (line[i] != '{' || isnan(step) || (isnan(loss) && !strstr(line, "\"loss\": nan"))) {
      fprintf(stderr, "loom plot: %s:%ld: not a loom train metrics record (a JSON object with "
              "\"step\" and \"loss\")\n", path, lineno);
      rc = 1;
      break;
    }
    if (out->n == have && (rc = grow(out, have = have ? 2 * have : 256))) {
      fprintf(stderr, "loom plot: %s: out of memory\n", path);
      break;
    }
    size_t k = out->n++;
    out->step[k] = step;
    out->loss[k] = loss;
    out->lr[k] = field(line, "lr");
    out->scale[k] = field(line, "scale");
    out->samples_per_s[k] = field(line, "samples_per_s");
    double mem = field(line, "rank_compute_bytes");
    if (isnan(mem)) mem = field(line, "current_bytes"); /* "mem": {"compute": {...}} first */
    out->mem_mb[k] = mem / 1e6;
    out->overflow[k] = strstr(line, "\"overflow\": true") != NULL;
  }
  if (!rc && ferror(f)) {
    fprintf(stderr, "loom plot: %s: read error\n", path);
    rc = 1;
  }
  if (!rc && out->n == 0) {
    fprintf(stderr, "loom plot: %s: no records\n", path);
    rc = 1;
  }
  free(line);
  fclose(f);
  if (rc) plot_run_free(out);
  return rc;
}

void plot_run_free(plot_run *r) {
  free(r->step);
  free(r->loss);
  free(r->lr);
  free(r->scale);
  free(r->samples_per_s);
  free(r->mem_mb);
  free(r->overflow);
  memset(r, 0, sizeof *r);
}
