/* text.c: byte-level text for language models (loom/io.h, "text"): a file's bytes, or Debian's
 * fortunes folder concatenated; the fixed split (the last tenth is validation); and windows of
 * context + 1 bytes as i64 inputs and next-token targets, training rows keyed by
 * (seed, step, row) and validation windows spread over the split. Every failure names the
 * file. */
#include "io/io_int.h"
#include "loom/rng.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct loom_text {
  uint8_t *bytes;
  size_t n, ntrain; /* bytes [0, ntrain) train, [ntrain, n) validation */
  char *source;
};

static const char *who = "loom_text_load";

void loom_text_free(loom_text *t) {
  if (!t) return;
  loom__free(t->bytes);
  loom__free(t->source);
  loom__free(t);
}

static int make(const char *source, loom_text **out) {
  loom_text *t = loom__calloc(LOOM_POOL_META, 1, sizeof *t);
  if (t) t->source = loom__strdup(LOOM_POOL_META, source);
  if (!t || !t->source) {
    loom_text_free(t);
    return loom__fail(LOOM_ENOMEM, "%s: %s: out of memory", who, source);
  }
  *out = t;
  return LOOM_OK;
}

/* The split of n bytes, once they are all in; an empty text is refused. */
static int finish(loom_text *t) {
  if (t->n == 0) return loom__fail(LOOM_EFORMAT, "%s: '%s' is empty: no text to train on", who,
                                   t->source);
  t->ntrain = t->n - t->n / 10;
  return LOOM_OK;
}

/* Append file `path` (size checked against what the text may still take) to t->bytes. */
static int append_file(loom_text *t, const char *path, size_t *cap) {
  int fd = -1;
  size_t size = 0;
  int rc = loom__file_open_read(who, path, &fd, &size);
  if (rc) return rc;
  if (size > LOOM_TEXT_MAX_BYTES - t->n) {
    close(fd);
    return loom__fail(LOOM_EFORMAT, "%s: '%s' is too large: %zu bytes, above the %zu-byte "
                      "limit of a text%s", who, path, size, LOOM_TEXT_MAX_BYTES,
                      t->n ? " (with the files before it)" : "");
  }
  if (t->n + size > *cap) {
    size_t want = *cap ? *cap : 1 << 16;
    while (want < t->n + size) want *= 2;
    uint8_t *b = loom__malloc(LOOM_POOL_META, want);
    if (!b) {
      close(fd);
      return loom__fail(LOOM_ENOMEM, "%s: '%s': out of memory for %zu bytes", who, path, want);
    }
    if (t->n) memcpy(b, t->bytes, t->n);
    loom__free(t->bytes);
    t->bytes = b;
    *cap = want;
  }
  if (size) rc = loom__file_pread(who, path, fd, t->bytes + t->n, size, 0);
  close(fd);
  if (!rc) t->n += size;
  return rc;
}

/* strfile text: each line holding "%" alone (a fortune's end) becomes an empty line. */
static void strip_separators(loom_text *t, size_t from) {
  size_t w = from;
  for (size_t r = from; r < t->n; r++) {
    bool line_start = r == from || t->bytes[r - 1] == '\n';
    if (line_start && t->bytes[r] == '%' && (r + 1 == t->n || t->bytes[r + 1] == '\n')) continue;
    t->bytes[w++] = t->bytes[r];
  }
  t->n = w;
}

static int by_name(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The fortunes folder: its plain text files (no '.' in the name), sorted. */
static int load_fortunes(loom_text *t) {
  const char *dir = LOOM_FORTUNES_DIR;
  DIR *d = opendir(dir);
  if (!d)
    return loom__fail(LOOM_ENOTFOUND, "%s: cannot open the fortunes folder '%s' (Debian's "
                      "fortunes package: apt-get install fortunes)", who, dir);
  char **names = NULL;
  size_t n = 0, cap = 0, bytes_cap = 0;
  int rc = LOOM_OK;
  for (struct dirent *e; (e = readdir(d)) && !rc;) {
    if (e->d_name[0] == '.' || strchr(e->d_name, '.')) continue;
    char path[4096];
    struct stat st;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    if (lstat(path, &st) != 0 || !S_ISREG(st.st_mode)) continue;
    if (n == cap) {
      char **nn = loom__calloc(LOOM_POOL_META, cap ? 2 * cap : 64, sizeof *nn);
      if (nn && n) memcpy(nn, names, n * sizeof *nn);
      loom__free(names);
      names = nn;
      cap = cap ? 2 * cap : 64;
      if (!nn) rc = loom__fail(LOOM_ENOMEM, "%s: out of memory listing '%s'", who, dir);
    }
    if (!rc && !(names[n++] = loom__strdup(LOOM_POOL_META, e->d_name)))
      rc = loom__fail(LOOM_ENOMEM, "%s: out of memory listing '%s'", who, dir);
  }
  closedir(d);
  if (!rc) qsort(names, n, sizeof *names, by_name);
  for (size_t i = 0; i < n && !rc; i++) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, names[i]);
    size_t from = t->n;
    rc = append_file(t, path, &bytes_cap);
    if (!rc) strip_separators(t, from);
  }
  for (size_t i = 0; names && i < n; i++) loom__free(names[i]);
  loom__free(names);
  if (!rc && n == 0)
    return loom__fail(LOOM_ENOTFOUND, "%s: the fortunes folder '%s' holds no text files "
                      "(Debian's fortunes package: apt-get install fortunes)", who, dir);
  return rc;
}

int loom_text_load(const char *path, loom_text **out) {
  if (!out) return loom__fail(LOOM_EINVAL, "%s: out is NULL", who);
  *out = NULL;
  if (path && !path[0]) return loom__fail(LOOM_EINVAL, "%s: empty path", who);
  loom_text *t = NULL;
  int rc = make(path ? path : LOOM_FORTUNES_DIR, &t);
  if (rc) return rc;
  size_t cap = 0;
  rc = path ? append_file(t, path, &cap) : load_fortunes(t);
  if (!rc) rc = finish(t);
  if (rc) {
    loom_text_free(t);
    return rc;
  }
  *out = t;
  return LOOM_OK;
}

int loom_text_from_bytes(const void *bytes, size_t n, const char *label, loom_text **out) {
  if (!out) return loom__fail(LOOM_EINVAL, "loom_text_from_bytes: out is NULL");
  *out = NULL;
  if (!bytes && n) return loom__fail(LOOM_EINVAL, "loom_text_from_bytes: bytes is NULL");
  if (n > LOOM_TEXT_MAX_BYTES)
    return loom__fail(LOOM_EFORMAT, "loom_text_from_bytes: '%s' is too large: %zu bytes, above "
                      "the %zu-byte limit of a text", label ? label : "(memory)", n,
                      LOOM_TEXT_MAX_BYTES);
  loom_text *t = NULL;
  int rc = make(label ? label : "(memory)", &t);
  if (rc) return rc;
  t->bytes = loom__malloc(LOOM_POOL_META, n ? n : 1);
  if (!t->bytes) rc = loom__fail(LOOM_ENOMEM, "loom_text_from_bytes: out of memory");
  if (!rc && n) memcpy(t->bytes, bytes, n);
  t->n = rc ? 0 : n;
  if (!rc) rc = finish(t);
  if (rc) {
    loom_text_free(t);
    return rc;
  }
  *out = t;
  return LOOM_OK;
}

const char *loom_text_source(const loom_text *t) { return t ? t->source : ""; }

const uint8_t *loom_text_bytes(const loom_text *t, loom_split split) {
  if (!t) return NULL;
  return split == LOOM_SPLIT_TRAIN ? t->bytes : t->bytes + t->ntrain;
}

size_t loom_text_size(const loom_text *t, loom_split split) {
  if (!t) return 0;
  return split == LOOM_SPLIT_TRAIN ? t->ntrain : t->n - t->ntrain;
}

int loom_text_check(const loom_text *t, size_t context) {
  if (!t) return loom__fail(LOOM_EINVAL, "loom_text_check: text is NULL");
  if (context == 0) return loom__fail(LOOM_EINVAL, "loom_text_check: context is 0");
  for (int s = 0; s < 2; s++) {
    size_t n = loom_text_size(t, (loom_split)s);
    if (n < context + 1)
      return loom__fail(LOOM_EFORMAT, "'%s' is too short: its %s split (%s) has %zu bytes, "
                        "fewer than one window of context %zu + 1 (%zu bytes of text in all; "
                        "a shorter context, or a longer text)", t->source,
                        s ? "validation" : "training", s ? "the last tenth" : "the first nine "
                        "tenths", n, context, t->n);
  }
  return LOOM_OK;
}

size_t loom_text_val_windows(const loom_text *t, size_t context) {
  size_t n = loom_text_size(t, LOOM_SPLIT_TEST);
  return context && n > 0 ? (n - 1) / context : 0;
}

/* New x and y [rows, context] i64: row r the window of base at starts[r]. */
static int windows(const uint8_t *base, size_t rows, size_t context, const size_t *starts,
                   loom_tensor **x, loom_tensor **y) {
  int64_t shape[2] = {(int64_t)rows, (int64_t)context};
  int rc = loom_tensor_empty(LOOM_I64, 2, shape, x);
  if (!rc) rc = loom_tensor_empty(LOOM_I64, 2, shape, y);
  if (rc) {
    loom_tensor_free(*x);
    *x = NULL;
    return rc;
  }
  int64_t *xi = loom_tensor_data(*x), *yi = loom_tensor_data(*y);
  for (size_t r = 0; r < rows; r++) {
    const uint8_t *w = base + starts[r];
    for (size_t c = 0; c < context; c++) {
      xi[r * context + c] = w[c];
      yi[r * context + c] = w[c + 1];
    }
  }
  return LOOM_OK;
}

static int batch_args(const char *fn, const loom_text *t, size_t rows, size_t context,
                      loom_tensor **x, loom_tensor **y) {
  if (!x || !y) return loom__fail(LOOM_EINVAL, "%s: x or y is NULL", fn);
  *x = *y = NULL;
  if (!t) return loom__fail(LOOM_EINVAL, "%s: text is NULL", fn);
  if (rows == 0) return loom__fail(LOOM_EINVAL, "%s: rows is 0", fn);
  if (rows > ((size_t)1 << 40) / (context ? context : 1))
    return loom__fail(LOOM_EINVAL, "%s: %zu rows of %zu tokens is too many", fn, rows, context);
  return loom_text_check(t, context);
}

int loom_text_batch(const loom_text *t, uint64_t seed, uint64_t step, size_t row0, size_t rows,
                    size_t context, loom_tensor **x, loom_tensor **y) {
  int rc = batch_args("loom_text_batch", t, rows, context, x, y);
  if (rc) return rc;
  size_t *starts = loom__malloc(LOOM_POOL_META, rows * sizeof *starts), span = t->ntrain - context;
  if (!starts) return loom__fail(LOOM_ENOMEM, "loom_text_batch: out of memory");
  uint64_t key = loom_rng_hash(seed, step);
  for (size_t r = 0; r < rows; r++) starts[r] = loom_rng_hash(key, row0 + r) % span;
  rc = windows(t->bytes, rows, context, starts, x, y);
  loom__free(starts);
  return rc;
}

int loom_text_val_batch(const loom_text *t, size_t count, size_t first, size_t rows,
                        size_t context, loom_tensor **x, loom_tensor **y) {
  const char *fn = "loom_text_val_batch";
  int rc = batch_args(fn, t, rows, context, x, y);
  if (rc) return rc;
  size_t w = loom_text_val_windows(t, context);
  if (count == 0 || count > w)
    return loom__fail(LOOM_EINVAL, "%s: %zu validation windows asked of '%s', whose validation "
                      "split holds %zu of context %zu", fn, count, t->source, w, context);
  if (first > count || rows > count - first)
    return loom__fail(LOOM_EINVAL, "%s: windows [%zu, %zu) pass the %zu of the set", fn, first,
                      first + rows, count);
  size_t *starts = loom__malloc(LOOM_POOL_META, rows * sizeof *starts);
  if (!starts) return loom__fail(LOOM_ENOMEM, "%s: out of memory", fn);
  for (size_t r = 0; r < rows; r++) {
    size_t k = first + r;
    starts[r] = (size_t)((unsigned __int128)k * w / count) * context;
  }
  rc = windows(t->bytes + t->ntrain, rows, context, starts, x, y);
  loom__free(starts);
  return rc;
}
