/* idx.c: the IDX reader (MNIST family): magic, big-endian dims and data, gzip'd or plain
 * through zlib (gzdopen reads both). Everything is checked before it is trusted: the magic and
 * type byte, the element count and byte size against overflow, the size the dims claim against
 * what the file can hold, a short or corrupt stream, and data left over after the elements. */
#include "io/io_int.h"

#include <errno.h>
#include <limits.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

struct loom_idx {
  int type;
  size_t esize;
  int ndim;
  uint32_t dims[255];
  size_t numel;
  void *data;
};

static size_t type_size(int type) {
  switch (type) {
  case 0x08: case 0x09: return 1;
  case 0x0B: return 2;
  case 0x0C: case 0x0D: return 4;
  case 0x0E: return 8;
  default: return 0;
  }
}

void loom_idx_free(loom_idx *x) {
  if (!x) return;
  loom__free(x->data);
  loom__free(x);
}

void loom_idx_get_info(const loom_idx *x, loom_idx_info *out) {
  if (!out) return;
  memset(out, 0, sizeof *out);
  if (!x) return;
  out->type = x->type;
  out->elem_size = x->esize;
  out->ndim = x->ndim;
  out->dims = x->dims;
  out->numel = x->numel;
  out->data = x->data;
}

/* Read exactly n bytes; *got the count read. A negative gzread or a gz error is corruption. */
static int gz_read(const char *who, const char *path, gzFile g, void *buf, size_t n,
                   const char *what) {
  size_t done = 0;
  while (done < n) {
    size_t want = n - done > (size_t)INT_MAX ? (size_t)INT_MAX : n - done;
    int r = gzread(g, (char *)buf + done, (unsigned)want);
    if (r < 0) {
      int err;
      const char *m = gzerror(g, &err);
      return loom__fail(LOOM_EFORMAT, "%s: '%s': corrupt data reading the %s: %s", who, path, what,
                        err == Z_ERRNO ? strerror(errno) : m);
    }
    if (r == 0) {
      int err;
      const char *m = gzerror(g, &err);
      return loom__fail(LOOM_EFORMAT, "%s: '%s' is truncated: %zu of %zu bytes of the %s%s%s", who,
                        path, done, n, what, err ? ": " : "", err ? m : "");
    }
    done += (size_t)r;
  }
  return LOOM_OK;
}

static void swap_bytes(unsigned char *p, size_t numel, size_t esize) {
  for (size_t i = 0; i < numel; i++, p += esize)
    for (size_t a = 0, b = esize - 1; a < b; a++, b--) {
      unsigned char t = p[a];
      p[a] = p[b], p[b] = t;
    }
}

/* Read path's IDX header and, unless head_only, its data into *out; *data_bytes (NULL ok) the
 * bytes of its data. */
static int idx_read(const char *who, const char *path, bool head_only, loom_idx **out,
                    size_t *data_bytes) {
  int fd = -1;
  size_t fsize;
  int rc = loom__file_open_read(who, path, &fd, &fsize);
  if (rc) return rc;
  gzFile g = gzdopen(fd, "rb");
  if (!g) {
    close(fd);
    return loom__fail(LOOM_ENOMEM, "%s: '%s': zlib could not start", who, path);
  }
  loom_idx *x = loom__calloc(LOOM_POOL_META, 1, sizeof *x);
  LOOM_TRY_ALLOC(x, "the IDX header");
  unsigned char magic[4];
  LOOM_TRY(gz_read(who, path, g, magic, 4, "magic number"));
  x->type = magic[2];
  x->esize = type_size(magic[2]);
  x->ndim = magic[3];
  if (magic[0] || magic[1] || !x->esize || !x->ndim) {
    rc = loom__fail(LOOM_EFORMAT,
                    "%s: '%s' is not an IDX file: magic %02x %02x %02x %02x (want 00 00, a type of "
                    "08 09 0b 0c 0d 0e, and 1 or more dims)",
                    who, path, magic[0], magic[1], magic[2], magic[3]);
    goto done;
  }
  unsigned char be[4 * 255];
  LOOM_TRY(gz_read(who, path, g, be, 4 * (size_t)x->ndim, "dimensions"));
  size_t numel = 1, bytes;
  for (int i = 0; i < x->ndim; i++) {
    x->dims[i] = (uint32_t)be[4 * i] << 24 | (uint32_t)be[4 * i + 1] << 16 |
                 (uint32_t)be[4 * i + 2] << 8 | be[4 * i + 3];
    if (!loom__mul_ok(numel, x->dims[i], &numel)) {
      rc = loom__fail(LOOM_EFORMAT, "%s: '%s': the dimensions overflow the element count", who, path);
      goto done;
    }
  }
  if (!loom__mul_ok(numel, x->esize, &bytes) || bytes > SIZE_MAX / 2) {
    rc = loom__fail(LOOM_EFORMAT, "%s: '%s': the dimensions overflow the byte size", who, path);
    goto done;
  }
  x->numel = numel;
  size_t head = 4 + 4 * (size_t)x->ndim;
  bool plain = gzdirect(g);
  /* deflate expands at most about 1032:1, so a gzip file of fsize bytes holds less than this */
  if ((plain && bytes != fsize - head) || (!plain && bytes / 1100 > fsize)) {
    rc = loom__fail(LOOM_EFORMAT,
                    "%s: '%s': the dimensions need %zu bytes of data but the %sfile has %s%zu", who,
                    path, bytes, plain ? "" : "gzip ", plain ? "" : "only ", plain ? fsize - head : fsize);
    goto done;
  }
  if (data_bytes) *data_bytes = bytes;
  if (head_only) goto done; /* rc is LOOM_OK */
  x->data = loom__malloc(LOOM_POOL_META, bytes ? bytes : 1);
  LOOM_TRY_ALLOC(x->data, "the IDX data");
  LOOM_TRY(gz_read(who, path, g, x->data, bytes, "data"));
  unsigned char extra;
  int r = gzread(g, &extra, 1);
  if (r != 0) {
    int err;
    const char *m = gzerror(g, &err);
    rc = r > 0 ? loom__fail(LOOM_EFORMAT, "%s: '%s' has data after the %zu elements its dimensions "
                            "describe", who, path, numel)
               : loom__fail(LOOM_EFORMAT, "%s: '%s': corrupt data at the end: %s", who, path, m);
    goto done;
  }
  if (x->esize > 1) swap_bytes(x->data, numel, x->esize);
  gzclose(g);
  *out = x;
  return LOOM_OK;
done:
  gzclose(g);
  loom_idx_free(x);
  return rc;
}

int loom_idx_read(const char *path, loom_idx **out) {
  const char *who = "loom_idx_read";
  if (!out) return loom__fail(LOOM_EINVAL, "%s: out is NULL", who);
  *out = NULL;
  if (!path) return loom__fail(LOOM_EINVAL, "%s: path is NULL", who);
  return idx_read(who, path, false, out, NULL);
}

int loom_idx_data_bytes(const char *path, size_t *bytes) {
  const char *who = "loom_idx_data_bytes";
  if (!path || !bytes) return loom__fail(LOOM_EINVAL, "%s: %s is NULL", who, path ? "bytes" : "path");
  loom_idx *x = NULL;
  return idx_read(who, path, true, &x, bytes);
}
