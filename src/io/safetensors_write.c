/* safetensors_write.c: writes named tensors and metadata as a safetensors file, in the
 * reference implementation's layout (tensors sorted widest dtype first, then by name; header
 * padded with spaces to a multiple of 8, so every tensor is aligned), atomically. */
#include "io/safetensors_int.h"
#include "core/tensor_int.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

typedef struct item {
  const char *name;
  const loom__st_dtype *dt;
  int ndim;
  int64_t shape[LOOM_MAX_DIMS];
  const void *data;
  loom__tensor_reader read; /* when data is NULL */
  void *read_ctx;
  size_t nbytes;
  loom_tensor *contig; /* a contiguous copy we own, if the tensor was strided */
} item;

#define PIECE ((size_t)1 << 20) /* what a reader is asked for at a time */

static int by_dtype_then_name(const void *a, const void *b) {
  const item *x = a, *y = b;
  if (x->dt->rank != y->dt->rank) return y->dt->rank - x->dt->rank;
  return strcmp(x->name, y->name);
}

uint32_t loom__crc32(uint32_t crc, const void *p, size_t n) {
  const unsigned char *s = p;
  uLong c = crc;
  while (n) {
    uInt chunk = n > (1u << 30) ? (1u << 30) : (uInt)n;
    c = crc32(c, s, chunk);
    s += chunk;
    n -= chunk;
  }
  return (uint32_t)c;
}

static int check_name(const char *who, const char *what, const char *s, size_t i) {
  if (!s) return loom__fail(LOOM_EINVAL, "%s: %s %zu is NULL", who, what, i);
  if (!loom__utf8_valid((const unsigned char *)s, strlen(s)))
    return loom__fail(LOOM_EINVAL, "%s: %s %zu is not valid UTF-8", who, what, i);
  return LOOM_OK;
}

static int prepare(const char *who, const loom_safetensors_entry *e, const loom__reader *rd,
                   size_t n, item *it) {
  for (size_t i = 0; i < n; i++) {
    int rc = check_name(who, "tensor name", e[i].name, i);
    if (rc) return rc;
    if (!e[i].name[0]) return loom__fail(LOOM_EINVAL, "%s: tensor %zu has an empty name", who, i);
    if (strcmp(e[i].name, "__metadata__") == 0)
      return loom__fail(LOOM_EINVAL, "%s: \"__metadata__\" is reserved, not a tensor name", who);
    it[i].name = e[i].name;
    size_t numel;
    loom_dtype dt;
    if (e[i].tensor) {
      loom_tensor *t = (loom_tensor *)e[i].tensor;
      if ((rc = loom_tensor_check(t, who))) return rc;
      if ((rc = loom_tensor_contiguous(t, &it[i].contig))) return rc;
      dt = loom_tensor_dtype(t);
      it[i].ndim = loom_tensor_ndim(t);
      memcpy(it[i].shape, loom_tensor_shape(t), (size_t)it[i].ndim * sizeof(int64_t));
      it[i].data = loom_tensor_data(it[i].contig);
      numel = loom_tensor_numel(t);
    } else {
      char label[64];
      snprintf(label, sizeof label, "%s: tensor \"%.32s\"", who, e[i].name);
      if ((rc = loom__check_shape(label, e[i].dtype, e[i].ndim, e[i].shape, &numel))) return rc;
      dt = e[i].dtype;
      it[i].ndim = e[i].ndim;
      if (e[i].ndim) memcpy(it[i].shape, e[i].shape, (size_t)e[i].ndim * sizeof(int64_t));
      it[i].data = e[i].data;
      it[i].read = e[i].data || !rd ? NULL : rd[i].read;
      it[i].read_ctx = rd ? rd[i].ctx : NULL;
      if (numel && !e[i].data && !it[i].read)
        return loom__fail(LOOM_EINVAL, "%s: tensor \"%s\" has NULL data", who, e[i].name);
    }
    it[i].dt = loom__st_dtype_of(dt);
    it[i].nbytes = numel * loom_dtype_size(dt);
  }
  qsort(it, n, sizeof *it, by_dtype_then_name);
  return LOOM_OK;
}

/* The strings that are the first member (a const char *) of n elements of `stride` bytes at
 * `base` must differ: O(n log n). */
static int unique(const char *who, const char *what, const void *base, size_t stride, size_t n) {
  const char **s = loom__malloc(LOOM_POOL_META, (n ? n : 1) * sizeof *s);
  if (!s) return loom__fail(LOOM_ENOMEM, "%s: out of memory", who);
  for (size_t i = 0; i < n; i++) memcpy(&s[i], (const char *)base + i * stride, sizeof *s);
  const char *twice = loom__sort_find_repeat(s, n);
  int rc = twice ? loom__fail(LOOM_EINVAL, "%s: %s \"%s\" given twice", who, what, twice) : LOOM_OK;
  loom__free(s);
  return rc;
}

static int put(loom__vec *h, const char *who, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int put(loom__vec *h, const char *who, const char *fmt, ...) {
  char buf[64];
  va_list ap;
  va_start(ap, fmt);
  int len = vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return loom__vec_append(h, buf, (size_t)len, who);
}

/* The header; with crc_at, metadata "loom.crc32" ends it, holding LOOM__CRC_PLACEHOLDER at
 * byte *crc_at of h. */
static int header(const char *who, const item *it, size_t n, const loom_safetensors_meta_kv *meta,
                  size_t nmeta, size_t *crc_at, loom__vec *h) {
  bool crc = crc_at != NULL;
  int rc = put(h, who, "{");
  if (!rc && (nmeta || crc)) {
    rc = put(h, who, "\"__metadata__\":{");
    for (size_t i = 0; i < nmeta && !rc; i++) {
      if (i) rc = put(h, who, ",");
      if (!rc) rc = loom__json_put_string(h, meta[i].key, who);
      if (!rc) rc = put(h, who, ":");
      if (!rc) rc = loom__json_put_string(h, meta[i].value, who);
    }
    if (!rc && crc) rc = put(h, who, "%s\"loom.crc32\":\"", nmeta ? "," : "");
    if (!rc && crc) *crc_at = h->len;
    if (!rc && crc) rc = put(h, who, LOOM__CRC_PLACEHOLDER "\"");
    if (!rc) rc = put(h, who, "}");
  }
  size_t off = 0;
  for (size_t i = 0; i < n && !rc; i++) {
    if (i || nmeta || crc) rc = put(h, who, ",");
    if (!rc) rc = loom__json_put_string(h, it[i].name, who);
    if (!rc) rc = put(h, who, ":{\"dtype\":\"%s\",\"shape\":[", it[i].dt->name);
    for (int d = 0; d < it[i].ndim && !rc; d++)
      rc = put(h, who, "%s%lld", d ? "," : "", (long long)it[i].shape[d]);
    if (!rc) rc = put(h, who, "],\"data_offsets\":[%zu,%zu]}", off, off + it[i].nbytes);
    off += it[i].nbytes;
  }
  if (!rc) rc = put(h, who, "}");
  while (!rc && h->len % 8) rc = put(h, who, " ");
  return rc;
}

static int check_meta(const char *who, const loom_safetensors_meta_kv *meta, size_t nmeta) {
  if (nmeta && !meta) return loom__fail(LOOM_EINVAL, "%s: meta is NULL", who);
  for (size_t i = 0; i < nmeta; i++) {
    int rc = check_name(who, "metadata key", meta[i].key, i);
    if (!rc) rc = check_name(who, "metadata value", meta[i].value, i);
    if (rc) return rc;
  }
  return unique(who, "metadata key", meta, sizeof *meta, nmeta);
}

/* An item's bytes into the CRC c (a NULL: the file a), from its data, or piece by piece from its
 * reader through buf (PIECE bytes). */
static int feed(const char *who, const item *t, uint32_t *c, loom__afile *a, unsigned char *buf) {
  if (!t->read) {
    if (!a) *c = loom__crc32(*c, t->data, t->nbytes);
    return a ? loom__afile_write(who, a, t->data, t->nbytes) : LOOM_OK;
  }
  for (size_t at = 0; at < t->nbytes; at += PIECE) {
    size_t n = t->nbytes - at < PIECE ? t->nbytes - at : PIECE;
    int rc = t->read(t->read_ctx, at, buf, n);
    if (rc) return rc;
    if (a) {
      if ((rc = loom__afile_write(who, a, buf, n))) return rc;
    } else {
      *c = loom__crc32(*c, buf, n);
    }
  }
  return LOOM_OK;
}

int loom__st_write(const char *who, const char *path, const loom_safetensors_entry *tensors,
                   size_t n, const loom_safetensors_meta_kv *meta, size_t nmeta, bool add_crc) {
  return loom__st_write_read(who, path, tensors, NULL, n, meta, nmeta, add_crc);
}

int loom__st_write_read(const char *who, const char *path, const loom_safetensors_entry *tensors,
                        const loom__reader *readers, size_t n, const loom_safetensors_meta_kv *meta,
                        size_t nmeta, bool add_crc) {
  if (!path) return loom__fail(LOOM_EINVAL, "%s: path is NULL", who);
  if (n && !tensors) return loom__fail(LOOM_EINVAL, "%s: tensors is NULL", who);
  int rc = check_meta(who, meta, nmeta);
  if (rc) return rc;
  loom__vec h = {.elem = 1};
  loom__afile a = LOOM__AFILE_INIT;
  unsigned char *piece = NULL;
  item *it = loom__calloc(LOOM_POOL_META, n ? n : 1, sizeof *it);
  LOOM_TRY_ALLOC(it, "the tensor list");
  LOOM_TRY(prepare(who, tensors, readers, n, it));
  LOOM_TRY(unique(who, "tensor name", it, sizeof *it, n));
  size_t crc_at = 0;
  LOOM_TRY(header(who, it, n, meta, nmeta, add_crc ? &crc_at : NULL, &h));
  for (size_t i = 0; i < n && !piece; i++)
    if (it[i].read) {
      piece = loom__malloc(LOOM_POOL_META, PIECE);
      LOOM_TRY_ALLOC(piece, "a staging buffer");
    }
  uint64_t len = h.len;
  if (add_crc) { /* the whole file, the digits read as the placeholder (safetensors_int.h) */
    uint32_t c = loom__crc32(loom__crc32(0, &len, 8), h.p, h.len);
    for (size_t i = 0; i < n; i++) LOOM_TRY(feed(who, &it[i], &c, NULL, piece));
    char digits[16];
    snprintf(digits, sizeof digits, "%08x", c);
    memcpy((char *)h.p + crc_at, digits, 8);
  }
  LOOM_TRY(loom__afile_open(who, path, &a));
  LOOM_TRY(loom__afile_write(who, &a, &len, 8));
  LOOM_TRY(loom__afile_write(who, &a, h.p, h.len));
  for (size_t i = 0; i < n; i++) LOOM_TRY(feed(who, &it[i], NULL, &a, piece));
  rc = loom__afile_commit(who, &a);
done:
  loom__afile_abort(&a);
  loom__free(piece);
  for (size_t i = 0; it && i < n; i++) loom_tensor_free(it[i].contig);
  loom__free(it);
  loom__vec_free(&h);
  return rc;
}

int loom_safetensors_write(const char *path, const loom_safetensors_entry *tensors, size_t n,
                           const loom_safetensors_meta_kv *meta, size_t nmeta) {
  return loom__st_write("loom_safetensors_write", path, tensors, n, meta, nmeta, false);
}
