/* io_int.h: what the io layer's files share: growable buffers, opening and reading untrusted
 * files (never blocking on a FIFO), the atomic file writer and its temporary names, finding a
 * repeated string, the strict JSON pieces safetensors needs, and the safetensors dtype table. */
#ifndef LOOM_IO_INT_H
#define LOOM_IO_INT_H

#include "core/core_int.h"
#include "loom/io.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "loom's io layer writes the host's bytes as little-endian");

/* ---- growable arrays (host pool) ------------------------------------------------------ */

typedef struct loom__vec {
  void *p;
  size_t len; /* elements */
  size_t cap;
  size_t elem;
} loom__vec;

/* Append one element (copied). LOOM_ENOMEM with a message naming `who`. */
int loom__vec_push(loom__vec *v, const void *x, const char *who);
/* Append n bytes to a byte vector (elem 1). */
int loom__vec_append(loom__vec *v, const void *x, size_t n, const char *who);
void loom__vec_free(loom__vec *v);

/* ---- files ---------------------------------------------------------------------------- */

/* The size of an open regular file (LOOM_EIO for a non-regular file, naming `path`). */
int loom__file_size(const char *who, const char *path, int fd, size_t *size);
/* Open an untrusted file for reading without ever blocking in open(): O_NONBLOCK (a FIFO with
 * no writer, a device), then fstat, refusing anything but a regular file (LOOM_EIO naming
 * `path`; LOOM_ENOTFOUND if it does not exist), then blocking reads again. *fd and *size on
 * success; the caller closes *fd. */
int loom__file_open_read(const char *who, const char *path, int *fd, size_t *size);
/* The folder part of path ("." if none) into dir (LOOM_EIO if longer than cap). */
int loom__folder_of(const char *who, const char *path, char *dir, size_t cap);
/* Read exactly n bytes at `offset` (LOOM_EFORMAT "truncated" if the file ends first). */
int loom__file_pread(const char *who, const char *path, int fd, void *buf, size_t n,
                     size_t offset);

/* The atomic writer: a temporary file next to `path`, renamed over it by commit. The
 * temporary is `path` + LOOM__AFILE_SUFFIX + six characters of mkstemp's [A-Za-z0-9]. */
#define LOOM__AFILE_SUFFIX ".tmp."
#define LOOM__AFILE_RANDOM 6
typedef struct loom__afile {
  int fd;
  char *path;
  char *tmp;
  size_t written, flushed; /* bytes written; bytes already written back and dropped */
} loom__afile;

#define LOOM__AFILE_INIT {.fd = -1, .path = NULL, .tmp = NULL, .written = 0, .flushed = 0}

/* loom_output_path with `who` for the message. */
int loom__output_path(const char *who, const char *path, char *resolved, size_t cap);
/* Refuses a path that is not a regular file (loom__output_path); through a symlink to one. */
int loom__afile_open(const char *who, const char *path, loom__afile *a);
/* Append; every 64 MiB the bytes so far are written back and dropped from the page cache (the
 * file is synced at commit anyway): a large checkpoint does not fill a memory limit with dirty
 * pages. */
int loom__afile_write(const char *who, loom__afile *a, const void *buf, size_t n);
/* fsync, close, rename over path, fsync the folder. On failure the temporary is removed. */
int loom__afile_commit(const char *who, loom__afile *a);
/* Close and remove the temporary (after a failure). Safe on LOOM__AFILE_INIT or a finished
 * afile. */
void loom__afile_abort(loom__afile *a);

/* ---- repeated strings ----------------------------------------------------------------- */

/* Sort s[0..n) (strcmp order) and return a string that occurs twice, or NULL: O(n log n). */
const char *loom__sort_find_repeat(const char **s, size_t n);

/* ---- strict JSON (the subset safetensors headers use) --------------------------------- */

typedef struct loom__json {
  const char *who;   /* the calling function, for messages */
  const char *label; /* the file, for messages */
  const unsigned char *s;
  size_t n;
  size_t pos;
  const char *unit; /* what pos counts in messages; NULL: "header byte" */
} loom__json;

/* Fail with LOOM_EFORMAT: "<who>: <label>: header byte <pos>: <what>" (unit for "header
 * byte" when set). */
int loom__json_fail(const loom__json *j, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void loom__json_ws(loom__json *j);
/* Skip whitespace and require character c. */
int loom__json_expect(loom__json *j, char c);
/* Skip whitespace; true (and consume) if the next character is c. */
bool loom__json_peek(loom__json *j, char c);
/* A string, decoded (escapes, \u surrogate pairs) into `out` (appended, NUL-terminated);
 * rejects control characters, invalid UTF-8 and lone surrogates. *len gets the length. */
int loom__json_string(loom__json *j, loom__vec *out, size_t *len);
/* A non-negative integer that fits in 63 bits (no sign, fraction or exponent). */
int loom__json_uint(loom__json *j, uint64_t *out);
/* A number: RFC 8259's grammar (no leading zeros, no '+', no bare '.'), and, as Python's json
 * module writes them, NaN, Infinity and -Infinity (and nan, inf, -inf); a literal beyond the
 * double range is +-inf. */
int loom__json_number(loom__json *j, double *out);
/* Append s as a JSON string (quoted, escaped) to a byte vector. */
int loom__json_put_string(loom__vec *out, const char *s, const char *who);
/* True if s[0..n) is valid UTF-8 (no overlongs, surrogates or code points above U+10FFFF). */
bool loom__utf8_valid(const unsigned char *s, size_t n);

/* ---- safetensors dtypes --------------------------------------------------------------- */

typedef struct loom__st_dtype {
  const char *name;  /* "F32" */
  size_t size;       /* bytes per element */
  int rank;          /* the reference implementation's order (writer sorts widest first) */
  int loom;          /* loom_dtype, or -1 */
} loom__st_dtype;

/* The entry for a name of len bytes, or NULL. */
const loom__st_dtype *loom__st_dtype_find(const char *name, size_t len);
/* The entry for a loom dtype. */
const loom__st_dtype *loom__st_dtype_of(loom_dtype dt);

/* Tensors that are not in memory (FSDP's offloaded shards) are saved through a reader: copy
 * bytes [offset, offset + bytes) of the tensor into dst and return LOOM_OK, or a status (with its
 * message) that fails the save. The writer asks for the pieces in order, each at most 1 MiB,
 * from 0 to the end, twice (the checkpoint's CRC, then the write); the bytes must not change. */
typedef int (*loom__tensor_reader)(void *ctx, size_t offset, void *dst, size_t bytes);
typedef struct loom__reader {
  loom__tensor_reader read; /* NULL: the entry's data is in memory */
  void *ctx;
} loom__reader;

/* loom_checkpoint_save with readers[i] giving the bytes of entry i whose data is NULL
 * (readers may be NULL: every entry in memory). */
int loom__checkpoint_save_read(const char *path, const loom_checkpoint_entry *e,
                               const loom__reader *readers, size_t n,
                               const loom_safetensors_meta_kv *meta, size_t nmeta);

/* loom_checkpoint_open with loom_safetensors_open's flags (LOOM_SAFETENSORS_MMAP: verify a
 * large file through the page cache, not a buffer of its size). */
int loom__checkpoint_open_flags(const char *path, unsigned flags, loom_safetensors **out);

#endif
