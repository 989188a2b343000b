/* safetensors_int.h: the open-file struct shared by the safetensors reader's files (header
 * parsing and validation, opening, tensor access) and the writer entry the checkpoint uses. */
#ifndef LOOM_SAFETENSORS_INT_H
#define LOOM_SAFETENSORS_INT_H

#include "io/io_int.h"

typedef struct loom__st_tensor {
  size_t name;   /* offset into strings */
  const loom__st_dtype *dt;
  int ndim;
  size_t shape;  /* index into shapes */
  uint64_t begin, end;
  size_t numel;
} loom__st_tensor;

typedef struct loom__st_meta {
  size_t key, value; /* offsets into strings */
  size_t value_at;   /* file offset of the value's opening quote, as written (checkpoint CRC) */
} loom__st_meta;

#define LOOM__ST_MAGIC 0x53414654u /* "SAFT" */

struct loom_safetensors {
  uint32_t magic;
  char *label;          /* the path, for messages */
  unsigned char *buf;   /* the whole file */
  size_t size;
  bool mapped;
  int account;          /* memory account the mapping was counted on (freed on any thread) */
  size_t data_start;    /* 8 + header length */
  loom__vec strings;    /* char: every name, key and value, NUL-terminated */
  loom__vec shapes;     /* int64_t */
  loom__vec tensors;    /* loom__st_tensor, in data order */
  loom__vec meta;       /* loom__st_meta, in file order */
  size_t *by_name;      /* tensor indices sorted by name */
};

/* Parse and validate the header of f->buf (f->size bytes), filling the vectors. */
int loom__st_parse(loom_safetensors *f, const char *who);

static inline const char *loom__st_str(const loom_safetensors *f, size_t off) {
  return (const char *)f->strings.p + off;
}

/* Find tensor `name` and check it has dtype dt and the given shape (the checks of
 * loom_safetensors_read), filling *in. */
int loom__st_check(const loom_safetensors *f, const char *who, const char *name, loom_dtype dt,
                   int ndim, const int64_t *shape, loom_safetensors_info *in);

/* loom_safetensors_write, optionally adding metadata "loom.crc32" (the last key of
 * "__metadata__", written as exactly 8 lowercase hex digits between quotes): the CRC-32 of the
 * whole file (length, header, data) computed with those 8 digits read as the placeholder. */
#define LOOM__CRC_PLACEHOLDER "00000000"

int loom__st_write(const char *who, const char *path, const loom_safetensors_entry *tensors,
                   size_t n, const loom_safetensors_meta_kv *meta, size_t nmeta, bool add_crc);
/* The same with readers (io_int.h; NULL: none) for the entries whose data is NULL. */
int loom__st_write_read(const char *who, const char *path, const loom_safetensors_entry *tensors,
                        const loom__reader *readers, size_t n, const loom_safetensors_meta_kv *meta,
                        size_t nmeta, bool add_crc);

/* CRC-32 (zlib's) of n bytes, continuing from crc (start with 0). */
uint32_t loom__crc32(uint32_t crc, const void *p, size_t n);

#endif
