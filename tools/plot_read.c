/* plot_read.c: reading back `loom train --metrics` files for `loom plot`: one JSON object a
 * line, the fields found by key (the records are flat but for the nested "mem" object, whose
 * compute-pool bytes are the memory series when rank_compute_bytes is absent). Bounded: only
 * regular files (checked before opening), lines, size and records within plot.h's limits, every
 * value range-checked (out-of-range steps skip their record, other values become gaps; counted). */
#include "plot.h"

#include <fcntl.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The number after "key": in line (strtod's: "nan" and "inf" too), or NAN; *found (NULL ok)
 * says whether there was a number. */
static double field_found(const char *line, const char *key, bool *found) {
  if (found) *found = false;
  char pat[80];
  snprintf(pat, sizeof pat, "\"%s\":", key);
  const char *p = strstr(line, pat);
  if (!p) return NAN;
  p += strlen(pat);
  while (*p == ' ') p++;
  char *end = NULL;
  double v = strtod(p, &end);
  if (end == p) return NAN;
  if (found) *found = true;
  return v; /* overflow gives +-HUGE_VAL, out of range; underflow a tiny value, in range */
}

static double field(const char *line, const char *key) { return field_found(line, key, NULL); }

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

/* A value within the limits, else NAN and counted. */
static double checked(double v, bool positive, size_t *dropped) {
  if (isnan(v)) return v; /* absent, or "nan": a gap either way */
  if (!isfinite(v) || fabs(v) > PLOT_MAX_ABS || (positive && !(v > 0))) {
    ++*dropped;
    return NAN;
  }
  return v;
}

int plot_read_stream(FILE *f, const char *path, plot_run *out, size_t max_records) {
  memset(out, 0, sizeof *out);
  const char *slash = strrchr(path, '/');
  out->name = slash ? slash + 1 : path;
  char *line = malloc(PLOT_MAX_LINE_BYTES + 1);
  if (!line) {
    fprintf(stderr, "loom plot: %s: out of memory\n", path);
    return 1;
  }
  size_t have = 0, total = 0;
  long lineno = 0;
  int rc = 0;
  for (bool eof = false; !rc && !eof;) {
    size_t len = 0;
    bool nul = false;
    int c;
    while ((c = getc(f)) != EOF && c != '\n') {
      if (len == PLOT_MAX_LINE_BYTES) break;
      nul |= c == 0;
      line[len++] = (char)c;
    }
    total += len + (c == '\n');
    if (c == EOF) eof = true;
    if (eof && len == 0) break;
    lineno++;
    if (len == PLOT_MAX_LINE_BYTES && c != '\n' && c != EOF) {
      fprintf(stderr, "loom plot: %s:%ld: line longer than %zu bytes (the limit)\n", path, lineno,
              PLOT_MAX_LINE_BYTES);
      rc = 1;
      break;
    }
    if (total > PLOT_MAX_FILE_BYTES) {
      fprintf(stderr, "loom plot: %s: larger than %zu MB (the limit)\n", path,
              PLOT_MAX_FILE_BYTES >> 20);
      rc = 1;
      break;
    }
    line[len] = 0;
    size_t i = 0;
    while (line[i] == ' ' || line[i] == '\t' || line[i] == '\r') i++;
    if (!line[i] && !nul) continue;
    bool has_step, has_loss;
    double step = field_found(line, "step", &has_step), loss = field_found(line, "loss", &has_loss);
    if (nul || line[i] != '{' || !has_step || !has_loss) {
      fprintf(stderr, "loom plot: %s:%ld: not a loom train metrics record (a JSON object with "
              "\"step\" and \"loss\")\n", path, lineno);
      rc = 1;
      break;
    }
    if (!(step >= 0 && step <= PLOT_MAX_STEP)) { /* nan, inf, negative, absurd */
      out->skipped_records++;
      continue;
    }
    if (out->n == max_records) {
      fprintf(stderr, "loom plot: %s: more than %zu records in all (the limit)\n", path,
              (size_t)PLOT_MAX_RECORDS);
      rc = 1;
      break;
    }
    if (out->n == have && (rc = grow(out, have = have ? 2 * have : 256))) {
      fprintf(stderr, "loom plot: %s: out of memory\n", path);
      break;
    }
    size_t k = out->n++, *d = &out->dropped_values;
    out->step[k] = step;
    out->loss[k] = checked(loss, false, d);
    out->lr[k] = checked(field(line, "lr"), false, d);
    out->scale[k] = checked(field(line, "scale"), true, d);
    out->samples_per_s[k] = checked(field(line, "samples_per_s"), false, d);
    double mem = field(line, "rank_compute_bytes");
    if (isnan(mem)) mem = field(line, "current_bytes"); /* "mem": {"compute": {...}} first */
    out->mem_mb[k] = checked(mem / 1e6, false, d);
    out->overflow[k] = strstr(line, "\"overflow\": true") != NULL;
  }
  if (!rc && ferror(f)) {
    fprintf(stderr, "loom plot: %s: read error: %s\n", path, strerror(errno));
    rc = 1;
  }
  if (!rc && out->n == 0) {
    fprintf(stderr, "loom plot: %s: no records%s\n", path,
            out->skipped_records ? " with a step in range" : "");
    rc = 1;
  }
  free(line);
  if (rc) plot_run_free(out);
  return rc;
}

static const char *kind_of(mode_t m) {
  return S_ISDIR(m) ? "a folder" : S_ISCHR(m) ? "a character device" : S_ISBLK(m) ? "a block device"
       : S_ISFIFO(m) ? "a FIFO" : S_ISSOCK(m) ? "a socket" : "not a regular file";
}

int plot_read(const char *path, plot_run *out, size_t max_records) {
  memset(out, 0, sizeof *out);
  struct stat st;
  /* refused before open(): opening a FIFO for reading blocks until a writer comes */
  if (stat(path, &st) != 0) {
    fprintf(stderr, "loom plot: %s: %s\n", path, strerror(errno));
    return 1;
  }
  int fd = S_ISREG(st.st_mode) ? open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC) : -1;
  if (fd >= 0 && fstat(fd, &st) != 0) st.st_mode = 0; /* replaced since: check again */
  if (!S_ISREG(st.st_mode)) {
    fprintf(stderr, "loom plot: %s: is %s, not a metrics file\n", path, kind_of(st.st_mode));
    if (fd >= 0) close(fd);
    return 1;
  }
  if (fd < 0) {
    fprintf(stderr, "loom plot: %s: %s\n", path, strerror(errno));
    return 1;
  }
  if ((size_t)st.st_size > PLOT_MAX_FILE_BYTES) {
    fprintf(stderr, "loom plot: %s: %lld bytes, larger than %zu MB (the limit)\n", path,
            (long long)st.st_size, PLOT_MAX_FILE_BYTES >> 20);
    close(fd);
    return 1;
  }
  int flags = fcntl(fd, F_GETFL);
  if (flags >= 0) fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  FILE *f = fdopen(fd, "r");
  if (!f) {
    fprintf(stderr, "loom plot: %s: %s\n", path, strerror(errno));
    close(fd);
    return 1;
  }
  int rc = plot_read_stream(f, path, out, max_records);
  fclose(f);
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
