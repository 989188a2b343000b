/* checkpoint.c: checkpoints as safetensors files of named buffers plus metadata, with a
 * format marker and a CRC-32 of the data section that load verifies before it copies
 * anything into the caller's buffers. */
#include "io/safetensors_int.h"
#include "core/tensor_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FORMAT "checkpoint/1"

int loom_checkpoint_save(const char *path, const loom_checkpoint_entry *e, size_t n,
                         const loom_safetensors_meta_kv *meta, size_t nmeta) {
  const char *who = "loom_checkpoint_save";
  if (n && !e) return loom__fail(LOOM_EINVAL, "%s: entries is NULL", who);
  if (nmeta && !meta) return loom__fail(LOOM_EINVAL, "%s: meta is NULL", who);
  for (size_t i = 0; i < nmeta; i++)
    if (meta[i].key && strncmp(meta[i].key, "loom.", 5) == 0)
      return loom__fail(LOOM_EINVAL, "%s: metadata key \"%s\": the prefix \"loom.\" is reserved",
                        who, meta[i].key);
  int rc = LOOM_OK;
  loom_safetensors_entry *st = loom__calloc(LOOM_POOL_HOST, n ? n : 1, sizeof *st);
  loom_safetensors_meta_kv *kv = loom__calloc(LOOM_POOL_HOST, nmeta + 1, sizeof *kv);
  if (!st || !kv) {
    rc = loom__fail(LOOM_ENOMEM, "%s: out of memory", who);
    goto done;
  }
  for (size_t i = 0; i < n; i++)
    st[i] = (loom_safetensors_entry){.name = e[i].name, .dtype = e[i].dtype, .ndim = e[i].ndim,
                                     .shape = e[i].shape, .data = e[i].data};
  kv[0] = (loom_safetensors_meta_kv){"loom.format", FORMAT};
  if (nmeta) memcpy(kv + 1, meta, nmeta * sizeof *kv);
  rc = loom__st_write(who, path, st, n, kv, nmeta + 1, true);
done:
  loom__free(st);
  loom__free(kv);
  return rc;
}

static int verify(const loom_safetensors *f, const char *who) {
  const char *fmt = loom_safetensors_meta(f, "loom.format");
  if (!fmt || strcmp(fmt, FORMAT) != 0)
    return loom__fail(LOOM_EFORMAT, "%s: %s is not a loom checkpoint (loom.format is %s%s%s)",
                      who, f->label, fmt ? "\"" : "", fmt ? fmt : "missing", fmt ? "\"" : "");
  const char *want = loom_safetensors_meta(f, "loom.crc32");
  char have[16];
  snprintf(have, sizeof have, "%08x",
           loom__crc32(0, f->buf + f->data_start, f->size - f->data_start));
  if (!want || strcmp(want, have) != 0)
    return loom__fail(LOOM_EFORMAT, "%s: %s: data CRC-32 is %s, the header says %s (corrupt file)",
                      who, f->label, have, want ? want : "nothing");
  return LOOM_OK;
}

int loom_checkpoint_load(const char *path, const loom_checkpoint_entry *e, size_t n,
                         loom_safetensors **file) {
  const char *who = "loom_checkpoint_load";
  if (file) *file = NULL;
  if (n && !e) return loom__fail(LOOM_EINVAL, "%s: entries is NULL", who);
  loom_safetensors *f = NULL;
  int rc = LOOM_OK;
  LOOM_TRY(loom_safetensors_open(path, 0, &f));
  LOOM_TRY(verify(f, who));
  /* check every entry first, so a mismatch leaves all buffers untouched */
  for (size_t i = 0; i < n; i++) {
    loom_safetensors_info in;
    if (!e[i].name) {
      rc = loom__fail(LOOM_EINVAL, "%s: entry %zu has no name", who, i);
      goto done;
    }
    LOOM_TRY(loom__st_check(f, who, e[i].name, e[i].dtype, e[i].ndim, e[i].shape, &in));
    if (in.nbytes && !e[i].data) {
      rc = loom__fail(LOOM_EINVAL, "%s: entry \"%s\" has NULL data", who, e[i].name);
      goto done;
    }
  }
  for (size_t i = 0; i < n; i++) {
    loom_safetensors_info in;
    LOOM_TRY(loom_safetensors_find(f, e[i].name, &in));
    if (in.nbytes) memcpy(e[i].data, in.data, in.nbytes);
  }
done:
  if (rc == LOOM_OK && file) *file = f;
  else loom_safetensors_free(f);
  return rc;
}
