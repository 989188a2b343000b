/* plot_read.c: reading back `loom train --metrics` files for `loom plot`: one JSON object a
 * line, parsed by loom's JSON reader (loom_json_object_walk, the safetensors header's strict
 * pieces), the members plotted taken by key path ("mem.compute.current_bytes" is the memory
 * series when rank_compute_bytes is absent; null is a gap). Bounded: only
 * regular files (checked before opening), lines, size and records within plot.h's limits, every
 * value range-checked (out-of-range steps skip their record, other values become gaps; counted). */
#include "plot.h"

#include "loom/io.h"
#include "loom/status.h"

#include <fcntl.h>
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* One record as the JSON reader hands it over (loom_json_object_walk): the members plotted. */
typedef struct record {
  double step, loss, lr, scale, rate, samples, accuracy, rank_mem, pool_mem;
  bool has_step, has_loss, overflow;
} record;

static int member(const loom_json_member *m, void *ctx) {
  record *r = ctx;
  static const struct {
    const char *key;
    size_t at;
  } nums[] = {{"step", offsetof(record, step)},           {"loss", offsetof(record, loss)},
              {"lr", offsetof(record, lr)},               {"scale", offsetof(record, scale)},
              {"samples_per_s", offsetof(record, rate)},  {"samples", offsetof(record, samples)},
              {"test_accuracy", offsetof(record, accuracy)},
              {"rank_compute_bytes", offsetof(record, rank_mem)},
              {"mem.compute.current_bytes", offsetof(record, pool_mem)}};
  if (m->kind == LOOM_JSON_BOOL && strcmp(m->key, "overflow") == 0) r->overflow = m->boolean;
  bool num = m->kind == LOOM_JSON_NUMBER, null = m->kind == LOOM_JSON_NULL;
  if (!num && !null) return 0;
  for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++)
    if (strcmp(m->key, nums[i].key) == 0) {
      *(double *)((char *)r + nums[i].at) = num ? m->number : NAN; /* null: a gap */
      if (i == 0) r->has_step = num;
      if (i == 1) r->has_loss = true;
    }
  return 0;
}

/* The record of line[0..len): 0, or 1 when it is not JSON (why: loom's message). */
static int parse_record(const char *line, size_t len, record *r, const char **why) {
  *r = (record){NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, false, false, false};
  if (loom_json_object_walk(line, len, "record", member, r) == LOOM_OK) return 0;
  *why = loom_last_error();
  return 1;
}

static int grow(plot_run *r, size_t cap) {
  double **series[] = {&r->step,          &r->loss,    &r->lr,       &r->scale,
                       &r->samples_per_s, &r->mem_mib, &r->samples, &r->accuracy};
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
    record rec;
    const char *why = NULL;
    if (nul || parse_record(line, len, &rec, &why) || !rec.has_step || !rec.has_loss) {
      const char *colon = why ? strstr(why, "record: ") : NULL; /* loom's "where: what" */
      fprintf(stderr, "loom plot: %s:%ld: not a loom train metrics record (a JSON object with "
              "\"step\" and \"loss\")%s%s\n", path, lineno, colon ? ": " : "",
              colon ? colon + 8 : nul ? ": a NUL byte" : "");
      rc = 1;
      break;
    }
    double step = rec.step;
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
    out->loss[k] = checked(rec.loss, false, d);
    out->lr[k] = checked(rec.lr, false, d);
    out->scale[k] = checked(rec.scale, true, d);
    out->samples_per_s[k] = checked(rec.rate, false, d);
    out->samples[k] = checked(rec.samples, false, d);
    out->accuracy[k] = checked(rec.accuracy, false, d);
    double mem = isnan(rec.rank_mem) ? rec.pool_mem : rec.rank_mem; /* this rank's, else the pool's */
    out->mem_mib[k] = checked(mem / 1048576.0, false, d);
    out->overflow[k] = rec.overflow;
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
  free(r->mem_mib);
  free(r->samples);
  free(r->accuracy);
  free(r->overflow);
  memset(r, 0, sizeof *r);
}
