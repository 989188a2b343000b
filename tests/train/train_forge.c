/* train_forge.c: the forgeries of train_forge.h, made through the library: every tensor and
 * metadata value is read, one is changed, and the file is written again with
 * loom_checkpoint_save (a checkpoint: loom.* keys dropped, so the CRC is recomputed) or
 * loom_safetensors_write (a plain file). */
#include "train_forge.h"

#include <loom/loom.h>

#include <stdlib.h>
#include <string.h>

typedef struct edit {
  const char *key, *value;  /* metadata */
  const char *tensor;       /* or a tensor element */
  size_t index;
  float f;
  int64_t i;
} edit;

static int rewrite(const char *path, const edit *ed) {
  loom_safetensors *f = NULL;
  if (loom_safetensors_open(path, 0, &f)) return -1;
  bool checkpoint = loom_safetensors_meta(f, "loom.format") != NULL;
  size_t n = loom_safetensors_count(f), nm = loom_safetensors_meta_count(f), k = 0;
  loom_checkpoint_entry *ce = calloc(n + 1, sizeof *ce);
  loom_safetensors_entry *se = calloc(n + 1, sizeof *se);
  loom_safetensors_meta_kv *kv = calloc(nm + 2, sizeof *kv);
  void **copies = calloc(n + 1, sizeof *copies);
  int rc = !ce || !se || !kv || !copies ? -1 : 0;
  for (size_t i = 0; i < n && !rc; i++) {
    loom_safetensors_info in;
    rc = loom_safetensors_info_at(f, i, &in);
    copies[i] = malloc(in.nbytes + 1);
    if (rc || !copies[i]) break;
    memcpy(copies[i], in.data, in.nbytes);
    if (ed->tensor && strcmp(ed->tensor, in.name) == 0) {
      if (in.dtype == LOOM_F32 && ed->index < in.numel) memcpy((float *)copies[i] + ed->index, &ed->f, 4);
      else if (in.dtype == LOOM_I64 && ed->index < in.numel) ((int64_t *)copies[i])[ed->index] = ed->i;
      else rc = -1;
    }
    ce[i] = (loom_checkpoint_entry){.name = in.name, .dtype = in.dtype, .ndim = in.ndim,
                                    .data = copies[i]};
    memcpy(ce[i].shape, in.shape, (size_t)in.ndim * sizeof *in.shape);
    se[i] = (loom_safetensors_entry){.name = in.name, .dtype = in.dtype, .ndim = in.ndim,
                                     .shape = in.shape, .data = copies[i]};
  }
  bool set = false;
  for (size_t i = 0; i < nm && !rc; i++) {
    const char *key, *value;
    loom_safetensors_meta_at(f, i, &key, &value);
    if (checkpoint && strncmp(key, "loom.", 5) == 0) continue;
    if (ed->key && strcmp(key, ed->key) == 0) value = ed->value, set = true;
    kv[k++] = (loom_safetensors_meta_kv){key, value};
  }
  if (ed->key && !set) kv[k++] = (loom_safetensors_meta_kv){ed->key, ed->value};
  if (!rc) rc = checkpoint ? loom_checkpoint_save(path, ce, n, kv, k)
                           : loom_safetensors_write(path, se, n, kv, k);
  for (size_t i = 0; copies && i < n; i++) free(copies[i]);
  free(copies), free(ce), free(se), free(kv);
  loom_safetensors_free(f);
  return rc ? -1 : 0;
}

int tf_set_meta(const char *path, const char *key, const char *value) {
  return rewrite(path, &(edit){.key = key, .value = value});
}

int tf_set_f32(const char *path, const char *name, size_t index, float v) {
  return rewrite(path, &(edit){.tensor = name, .index = index, .f = v});
}

int tf_set_i64(const char *path, const char *name, size_t index, int64_t v) {
  return rewrite(path, &(edit){.tensor = name, .index = index, .i = v});
}
