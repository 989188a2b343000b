/* checkpoint.c: checkpoints as safetensors files of named buffers plus metadata, with a
 * format marker and a CRC-32 of the whole file (header and data, the CRC's own digits read
 * as a placeholder: safetensors_int.h) that open verifies before anything is read, and
 * entries whose values are checked (finite, >= 0) before any is copied into the caller's
 * buffers. */
#include "io/safetensors_int.h"
#include "core/tensor_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FORMAT "checkpoint/2"
#define FORMAT_V1 "checkpoint/1" /* its CRC covered the data only */

int loom_checkpoint_save(const char *path, const loom_checkpoint_entry *e, size_t n,
                         const loom_safetensors_meta_kv *meta, size_t nmeta) {
  return loom__checkpoint_save_read(path, e, NULL, n, meta, nmeta);
}

int loom__checkpoint_save_read(const char *path, const loom_checkpoint_entry *e,
                               const loom__reader *readers, size_t n,
                               const loom_safetensors_meta_kv *meta, size_t nmeta) {
  const char *who = "loom_checkpoint_save";
  if (n && !e) return loom__fail(LOOM_EINVAL, "%s: entries is NULL", who);
  if (nmeta && !meta) return loom__fail(LOOM_EINVAL, "%s: meta is NULL", who);
  for (size_t i = 0; i < nmeta; i++)
    if (meta[i].key && strncmp(meta[i].key, "loom.", 5) == 0)
      return loom__fail(LOOM_EINVAL, "%s: metadata key \"%s\": the prefix \"loom.\" is reserved",
                        who, meta[i].key);
  int rc = LOOM_OK;
  loom_safetensors_entry *st = loom__calloc(LOOM_POOL_META, n ? n : 1, sizeof *st);
  loom_safetensors_meta_kv *kv = loom__calloc(LOOM_POOL_META, nmeta + 1, sizeof *kv);
  if (!st || !kv) {
    rc = loom__fail(LOOM_ENOMEM, "%s: out of memory", who);
    goto done;
  }
  for (size_t i = 0; i < n; i++)
    st[i] = (loom_safetensors_entry){.name = e[i].name, .dtype = e[i].dtype, .ndim = e[i].ndim,
                                     .shape = e[i].shape, .data = e[i].data};
  kv[0] = (loom_safetensors_meta_kv){"loom.format", FORMAT};
  if (nmeta) memcpy(kv + 1, meta, nmeta * sizeof *kv);
  rc = loom__st_write_read(who, path, st, readers, n, kv, nmeta + 1, true);
done:
  loom__free(st);
  loom__free(kv);
  return rc;
}

static bool lower_hex(const unsigned char *s, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return false;
  return true;
}

static int verify(const loom_safetensors *f, const char *who) {
  const char *fmt = loom_safetensors_meta(f, "loom.format");
  if (fmt && strcmp(fmt, FORMAT_V1) == 0)
    return loom__fail(LOOM_EFORMAT, "%s: %s was written by an older loom (%s, whose CRC leaves "
                      "the header unchecked); it cannot be verified", who, f->label, FORMAT_V1);
  if (!fmt || strcmp(fmt, FORMAT) != 0)
    return loom__fail(LOOM_EFORMAT, "%s: %s is not a loom checkpoint (loom.format is %s%s%s)",
                      who, f->label, fmt ? "\"" : "", fmt ? fmt : "missing", fmt ? "\"" : "");
  const loom__st_meta *m = NULL;
  for (size_t i = 0; i < f->meta.len && !m; i++)
    if (strcmp(loom__st_str(f, ((const loom__st_meta *)f->meta.p)[i].key), "loom.crc32") == 0)
      m = (const loom__st_meta *)f->meta.p + i;
  /* the value as written: '"', 8 lowercase hex digits, '"' (no escapes) */
  size_t at = m ? m->value_at + 1 : 0;
  if (!m || at + 9 > f->data_start || f->buf[at + 8] != '"' || !lower_hex(f->buf + at, 8))
    return loom__fail(LOOM_EFORMAT, "%s: %s: \"loom.crc32\" is %s (corrupt file)", who, f->label,
                      m ? "not 8 lowercase hex digits" : "missing");
  uint32_t crc = loom__crc32(0, f->buf, at);
  crc = loom__crc32(crc, LOOM__CRC_PLACEHOLDER, 8);
  crc = loom__crc32(crc, f->buf + at + 8, f->size - at - 8);
  char have[16];
  snprintf(have, sizeof have, "%08x", crc);
  if (memcmp(have, f->buf + at, 8) != 0)
    return loom__fail(LOOM_EFORMAT, "%s: %s: CRC-32 of the file is %s, its header says %.8s "
                      "(corrupt file)", who, f->label, have, (const char *)f->buf + at);
  return LOOM_OK;
}

int loom_checkpoint_open(const char *path, loom_safetensors **out) {
  return loom__checkpoint_open_flags(path, 0, out);
}

int loom__checkpoint_open_flags(const char *path, unsigned flags, loom_safetensors **out) {
  const char *who = "loom_checkpoint_open";
  if (!out) return loom__fail(LOOM_EINVAL, "%s: out is NULL", who);
  *out = NULL;
  loom_safetensors *f = NULL;
  int rc = loom_safetensors_open(path, flags, &f);
  if (!rc) rc = verify(f, who);
  if (rc) loom_safetensors_free(f);
  else *out = f;
  return rc;
}

int loom_checkpoint_read(const loom_safetensors *f, const loom_checkpoint_entry *e, size_t n) {
  const char *who = "loom_checkpoint_read";
  if (!f) return loom__fail(LOOM_EINVAL, "%s: file is NULL", who);
  if (n && !e) return loom__fail(LOOM_EINVAL, "%s: entries is NULL", who);
  /* check every entry first, so a mismatch leaves all buffers untouched */
  for (size_t i = 0; i < n; i++) {
    loom_safetensors_info in;
    if (!e[i].name) return loom__fail(LOOM_EINVAL, "%s: entry %zu has no name", who, i);
    int rc = loom__st_check(f, who, e[i].name, e[i].dtype, e[i].ndim, e[i].shape, &in);
    if (!rc) rc = loom_safetensors_check_values(f, e[i].name, e[i].checks);
    if (rc) return rc;
    if (in.nbytes && !e[i].data)
      return loom__fail(LOOM_EINVAL, "%s: entry \"%s\" has NULL data", who, e[i].name);
  }
  for (size_t i = 0; i < n; i++) {
    loom_safetensors_info in;
    int rc = loom_safetensors_find(f, e[i].name, &in);
    if (rc) return rc;
    if (in.nbytes) memcpy(e[i].data, in.data, in.nbytes);
  }
  return LOOM_OK;
}

int loom_checkpoint_load(const char *path, const loom_checkpoint_entry *e, size_t n,
                         loom_safetensors **file) {
  if (file) *file = NULL;
  if (n && !e) return loom__fail(LOOM_EINVAL, "loom_checkpoint_load: entries is NULL");
  loom_safetensors *f = NULL;
  int rc = loom_checkpoint_open(path, &f);
  if (!rc) rc = loom_checkpoint_read(f, e, n);
  if (rc == LOOM_OK && file) *file = f;
  else loom_safetensors_free(f);
  return rc;
}
