/* loom/io.h: files in and out: safetensors (read, write), IDX (the MNIST family, gzip'd or
 * not), the Fashion-MNIST dataset with seeded shuffling and batching, checkpoints, and one JSON
 * object at a time (the records of a JSON Lines file).
 *
 * Files are untrusted: every size, offset and name is checked before it is used, each fault
 * gets a status (LOOM_EFORMAT for a malformed file, LOOM_EIO for the operating system's
 * errors, LOOM_ENOTFOUND for a missing tensor or file) and a message naming the file and the
 * fault; nothing is read outside the file. Files are written atomically: to a temporary name in
 * the same folder, fsync, rename, fsync of the folder; on failure no file and no temporary is
 * left, and an existing file of that name is untouched.
 *
 * Ownership: open/read/create calls hand back objects the caller frees (NULL ok); names,
 * metadata strings and info structs they return are borrowed and live as long as the object.
 * Tensors they return are new references (loom/tensor.h).
 *
 * Threads: an open file or dataset may be read by many threads at once (nothing mutates it);
 * a loader is used by one thread at a time. */
#ifndef LOOM_IO_H
#define LOOM_IO_H

#include "loom/tensor.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- safetensors ---------------------------------------------------------------------- */
/* The format (huggingface/safetensors): an 8-byte little-endian u64 N, N bytes of UTF-8 JSON
 * {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...,
 *  "__metadata__": {"key": "value"}} (optionally padded with spaces), then the data:
 * little-endian, row-major, offsets relative to the first byte after the header. loom checks
 * that the header is at most 100,000,000 bytes, starts with '{', is strict JSON, holds at most
 * 100,000 tensors and 100,000 metadata keys, names and keys are unique (checked in
 * O(n log n)) and non-empty, dtypes known, shapes non-negative without overflow, and that the
 * tensors' byte ranges are numel * dtype size, in order, without gaps, overlaps or duplicate
 * entries, and cover the data exactly. Unknown fields in a tensor entry are rejected. Only
 * regular files are opened, and opening never blocks (a FIFO or a device is refused). */

#define LOOM_SAFETENSORS_MAX_HEADER 100000000u
#define LOOM_SAFETENSORS_MAX_TENSORS 100000u
#define LOOM_SAFETENSORS_MAX_META 100000u

/* Open flags. */
#define LOOM_SAFETENSORS_MMAP 1u /* map the file (counted in LOOM_POOL_FILE) instead of reading
                                  * it into memory (LOOM_POOL_META) */

typedef struct loom_safetensors loom_safetensors;

/* A tensor's entry. dtype_name is the file's ("F32", "U8", ...); `dtype` is the loom dtype
 * when there is one (has_loom_dtype), which loom_safetensors_get needs. */
typedef struct loom_safetensors_info {
  const char *name;
  const char *dtype_name;
  bool has_loom_dtype;
  loom_dtype dtype;
  int ndim;              /* any rank the file has (loom tensors take up to LOOM_MAX_DIMS) */
  const int64_t *shape;  /* ndim entries */
  size_t numel;
  size_t nbytes;
  const void *data;      /* the bytes in the file (little-endian), borrowed */
} loom_safetensors_info;

/* Open and validate a file. LOOM_EIO if it cannot be read, LOOM_EFORMAT (with the fault) if
 * it is not a valid safetensors file. */
int loom_safetensors_open(const char *path, unsigned flags, loom_safetensors **out);
/* The same over a copy of `size` bytes in memory (`label` names it in messages). */
int loom_safetensors_open_memory(const void *buf, size_t size, const char *label,
                                 loom_safetensors **out);
void loom_safetensors_free(loom_safetensors *f);

/* Tensors, in the order of their data in the file. */
size_t loom_safetensors_count(const loom_safetensors *f);
/* Entry i (0 <= i < count), or by name (LOOM_ENOTFOUND naming the file and the tensor). */
int loom_safetensors_info_at(const loom_safetensors *f, size_t i, loom_safetensors_info *out);
int loom_safetensors_find(const loom_safetensors *f, const char *name,
                          loom_safetensors_info *out);
/* A new contiguous tensor (compute pool) holding a copy. LOOM_EDTYPE for a dtype loom does not
 * have, LOOM_ESHAPE for a rank above LOOM_MAX_DIMS. */
int loom_safetensors_get(const loom_safetensors *f, const char *name, loom_tensor **out);
/* A tensor over the file's bytes, no copy: valid only while f is open (it does not keep f
 * alive). Writing to it changes this process's copy, never the file. LOOM_EFORMAT if the
 * bytes are not aligned for the dtype (files loom and safetensors write always are). */
int loom_safetensors_view(const loom_safetensors *f, const char *name, loom_tensor **out);
/* Copy tensor `name` into a caller buffer after checking it has exactly dtype dt and the
 * given shape (LOOM_EDTYPE / LOOM_ESHAPE with both sides in the message). */
int loom_safetensors_read(const loom_safetensors *f, const char *name, loom_dtype dt, int ndim,
                          const int64_t *shape, void *dst);

/* Checks of a tensor's values (bits of flags). Float dtypes (F64, F32, F16, BF16) only: other
 * dtypes always pass. */
#define LOOM_CHECK_FINITE 1u /* no NaN and no infinity */
#define LOOM_CHECK_NONNEG 2u /* nothing below zero (-0 is not; NaN is FINITE's business) */
/* LOOM_EFORMAT naming the file, the tensor, the first bad element's index and its value if
 * tensor `name` fails a check; LOOM_ENOTFOUND if there is no such tensor. */
int loom_safetensors_check_values(const loom_safetensors *f, const char *name, unsigned checks);

/* Metadata ("__metadata__"), in file order. loom_safetensors_meta returns NULL if absent. */
size_t loom_safetensors_meta_count(const loom_safetensors *f);
int loom_safetensors_meta_at(const loom_safetensors *f, size_t i, const char **key,
                             const char **value);
const char *loom_safetensors_meta(const loom_safetensors *f, const char *key);
/* A metadata value parsed as a whole decimal integer / a double ("%.17g" round-trips).
 * LOOM_ENOTFOUND if absent, LOOM_EFORMAT if it is not such a number. */
int loom_safetensors_meta_i64(const loom_safetensors *f, const char *key, int64_t *out);
int loom_safetensors_meta_f64(const loom_safetensors *f, const char *key, double *out);

/* One tensor to write: either `tensor` (any strides; written contiguous) or, if tensor is
 * NULL, a raw contiguous buffer described by dtype, ndim, shape and data. */
typedef struct loom_safetensors_entry {
  const char *name;
  const loom_tensor *tensor;
  loom_dtype dtype;
  int ndim;
  const int64_t *shape;
  const void *data;
} loom_safetensors_entry;

typedef struct loom_safetensors_meta_kv {
  const char *key;
  const char *value;
} loom_safetensors_meta_kv;

/* Write a file atomically. Names must be non-empty, valid UTF-8, unique and not
 * "__metadata__"; metadata keys unique. The layout is the reference implementation's: the
 * tensors sorted by dtype (widest first) then name, each aligned to its element size, the
 * header padded with spaces to a multiple of 8. LOOM_EIO (with the OS error) if the file
 * cannot be written. */
int loom_safetensors_write(const char *path, const loom_safetensors_entry *tensors, size_t n,
                           const loom_safetensors_meta_kv *meta, size_t nmeta);

/* ---- checkpoints ---------------------------------------------------------------------- */
/* A checkpoint is a safetensors file of named buffers (model parameters, optimizer state,
 * scaler and RNG state, ...) and metadata (step, epoch, scale, ...), plus two metadata keys
 * loom adds and checks: "loom.format" = "checkpoint/2" and "loom.crc32", which protects every
 * byte of the file, header included, so a flipped, changed or truncated byte anywhere (a step
 * counter in the metadata as much as a weight) is caught on load:
 *   - "loom.crc32" is the last key of "__metadata__"; its value is written as exactly 8
 *     lowercase hex digits between quotes (no escapes), e.g. "loom.crc32":"1a2b3c4d";
 *   - the value is the CRC-32 (zlib's crc32, IEEE polynomial) of the whole file, from the
 *     8-byte header length through the header (with its padding) and the data section to the
 *     last byte, computed with those 8 digits replaced by eight ASCII '0' characters.
 * In Python: i = the offset of the digits; zlib.crc32(b[:i] + b"00000000" + b[i + 8:]). The
 * file stays a plain safetensors file (safetensors.torch.load_file reads it). A file of the
 * older format "checkpoint/1" (a CRC of the data section only) is refused: its header cannot
 * be verified. */

typedef struct loom_checkpoint_entry {
  const char *name;
  loom_dtype dtype;
  int ndim;
  int64_t shape[LOOM_MAX_DIMS];
  void *data;      /* save: read from; load: written to */
  unsigned checks; /* load: LOOM_CHECK_* flags its values must pass (0: none) */
} loom_checkpoint_entry;

/* Save entries and metadata atomically (keys starting "loom." are reserved: LOOM_EINVAL). */
int loom_checkpoint_save(const char *path, const loom_checkpoint_entry *e, size_t n,
                         const loom_safetensors_meta_kv *meta, size_t nmeta);
/* Open a checkpoint and verify it (format, CRC of the whole file): LOOM_EFORMAT "(corrupt
 * file)" if any byte differs from what was written. The caller frees *out. */
int loom_checkpoint_open(const char *path, loom_safetensors **out);
/* Copy every listed entry of an open checkpoint into its buffer: each must exist
 * (LOOM_ENOTFOUND) with the same dtype and shape (LOOM_EDTYPE, LOOM_ESHAPE) and pass its
 * `checks` (LOOM_EFORMAT naming the tensor and element). Nothing is written to any buffer
 * unless all of them do. */
int loom_checkpoint_read(const loom_safetensors *f, const loom_checkpoint_entry *e, size_t n);
/* open + read. If `file` is not NULL it receives the open file (for metadata and other
 * tensors), which the caller frees. */
int loom_checkpoint_load(const char *path, const loom_checkpoint_entry *e, size_t n,
                         loom_safetensors **file);

/* Remove what interrupted atomic writes of `path` (a kill between the temporary's creation
 * and the rename) left in its folder: the regular files named `<name>.tmp.XXXXXX`, where
 * <name> is path's last component and XXXXXX six characters of [A-Za-z0-9], exactly the
 * writer's pattern. Nothing else is touched (other names, symlinks, folders). Call it before
 * a save when no other process is writing `path`. *removed (NULL ok) gets the count. */
int loom_remove_stale_temporaries(const char *path, size_t *removed);

/* Where an atomic write of `path` may go. A path that does not exist, or is a regular file,
 * is written as is (resolved = path). A symlink to a regular file is written through: resolved
 * gets the link's target (realpath), so the target is replaced atomically and the link kept
 * (rename over the link itself would turn it into a file). Anything else is refused with
 * LOOM_EIO (as reading one is) and a message naming the path and what it is ("'/dev/null' is a
 * character device, not a regular file"): a device, FIFO, socket, folder, a symlink to one of
 * those or to nothing; rename would replace it (as root, a device). LOOM_EINVAL if the path is
 * empty or resolved[cap] too short. Every loom atomic write (safetensors, checkpoints, `loom
 * plot -o`) goes through it; the check and the rename are not one atomic step. */
int loom_output_path(const char *path, char *resolved, size_t cap);

/* ---- IDX (MNIST family) --------------------------------------------------------------- */
/* Magic 0x00 0x00 <type> <ndim>, ndim big-endian u32 dims, then the data big-endian. Types:
 * 0x08 u8, 0x09 i8, 0x0B i16, 0x0C i32, 0x0D f32, 0x0E f64. A file that starts with the gzip
 * magic is decompressed (zlib). The data must be exactly prod(dims) elements. */

typedef struct loom_idx loom_idx;

typedef struct loom_idx_info {
  int type;            /* the type byte */
  size_t elem_size;    /* 1, 2, 4 or 8 */
  int ndim;
  const uint32_t *dims;
  size_t numel;
  const void *data;    /* numel elements in host byte order, borrowed */
} loom_idx_info;

int loom_idx_read(const char *path, loom_idx **out);
/* The bytes of an IDX file's data (prod(dims) x element size), from its header alone (the
 * data is not read); the header is checked as loom_idx_read checks it. */
int loom_idx_data_bytes(const char *path, size_t *bytes);
void loom_idx_free(loom_idx *x);
void loom_idx_get_info(const loom_idx *x, loom_idx_info *out);

/* ---- datasets and loaders ------------------------------------------------------------- */

/* Where Debian's dataset-fashion-mnist package puts the files. */
#define LOOM_FASHION_MNIST_DIR "/usr/share/datasets/fashion-mnist"
#define LOOM_FASHION_MNIST_MEAN 0.2860f
#define LOOM_FASHION_MNIST_STD 0.3530f

typedef enum loom_split { LOOM_SPLIT_TRAIN = 0, LOOM_SPLIT_TEST = 1 } loom_split;

/* Images (u8, N x rows x cols) with one u8 label each. */
typedef struct loom_dataset loom_dataset;

/* The MNIST family's classes and image side (what loom_dataset_check is given for it). */
#define LOOM_MNIST_CLASSES 10
#define LOOM_MNIST_SIDE 28

/* An MNIST-family dataset from `dir` (NULL: LOOM_FASHION_MNIST_DIR): the files
 * train-images-idx3-ubyte / train-labels-idx1-ubyte (t10k-* for the test split), each with
 * or without .gz. LOOM_ENOTFOUND naming the directory if neither form exists. Any image size
 * and label values are taken: loom_dataset_check what a model needs. */
int loom_mnist_load(const char *dir, loom_split split, loom_dataset **out);
/* What loom_mnist_load(dir, split) would hold, from the files' headers alone: *count
 * samples, *bytes of images and labels (the LOOM_POOL_META bytes of the loaded dataset). The
 * errors of loom_mnist_load for a missing or malformed header. */
int loom_mnist_bytes(const char *dir, loom_split split, size_t *count, size_t *bytes);
/* From two IDX files: images (u8, 3 dims, at least one image of at least 1x1) and labels
 * (u8, 1 dim, the same count). LOOM_EFORMAT naming the file otherwise. */
int loom_dataset_from_idx(const char *images_path, const char *labels_path, loom_dataset **out);
/* Check a dataset against what a model needs: every label below `classes` and images of
 * rows x cols (a 0 skips that check). LOOM_EFORMAT naming the file, and for a label its
 * index and value. */
int loom_dataset_check(const loom_dataset *d, size_t classes, size_t rows, size_t cols);
void loom_dataset_free(loom_dataset *d);
size_t loom_dataset_size(const loom_dataset *d);
size_t loom_dataset_rows(const loom_dataset *d);
size_t loom_dataset_cols(const loom_dataset *d);
const uint8_t *loom_dataset_images(const loom_dataset *d); /* size * rows * cols */
const uint8_t *loom_dataset_labels(const loom_dataset *d); /* size */

typedef enum loom_norm {
  LOOM_NORM_UNIT = 0,     /* x / 255 (torchvision ToTensor) */
  LOOM_NORM_STANDARD = 1, /* (x / 255 - mean) / std (then Normalize) */
} loom_norm;

typedef struct loom_loader_cfg {
  size_t batch;          /* > 0; default 256 */
  bool shuffle;          /* default true; false: file order */
  uint64_t seed;         /* default 0 */
  bool drop_last;        /* drop a last partial batch; default false (kept) */
  loom_norm norm;        /* default LOOM_NORM_UNIT */
  float mean, std;       /* for LOOM_NORM_STANDARD; default Fashion-MNIST's; std > 0 */
  bool flatten;          /* images [B, rows*cols] instead of [B, 1, rows, cols]; default false */
  loom_dtype label_dtype; /* LOOM_I64 (default, as PyTorch) or LOOM_I32 */
} loom_loader_cfg;

loom_loader_cfg loom_loader_cfg_default(void);
int loom_loader_cfg_validate(const loom_loader_cfg *cfg);

/* Batches of a dataset. The order of epoch e is a pure function of (seed, e): the identity
 * without shuffle, else a Fisher-Yates shuffle (i from N-1 down to 1, swap i with j uniform in
 * [0, i] by rejection sampling: draw r until r >= 2^64 mod (i+1), j = r mod (i+1)) driven by
 * SplitMix64 started at seed ^ (e * 0x9E3779B97F4A7C15). So a run resumed at (epoch, batch)
 * sees the same batches, on any machine. Retains `d` (borrowed: it must outlive the loader). */
typedef struct loom_loader loom_loader;

int loom_loader_create(const loom_dataset *d, const loom_loader_cfg *cfg, loom_loader **out);
void loom_loader_free(loom_loader *l);
/* Batches per epoch (a last partial batch counts unless drop_last). */
size_t loom_loader_batches(const loom_loader *l);
/* Batch `index` of epoch `epoch`: new tensors x (f32 [B,1,rows,cols] or [B,rows*cols]) and y
 * (labels, [B]). LOOM_EINVAL for an index out of range. */
int loom_loader_batch(loom_loader *l, uint64_t epoch, size_t index, loom_tensor **x,
                      loom_tensor **y);
/* The dataset indices of epoch `epoch` in batch order (size entries). */
int loom_loader_order(loom_loader *l, uint64_t epoch, const uint32_t **order);

/* ---- JSON objects (a line of JSON Lines: `loom train --metrics` records) ---------------- */

/* One member of a JSON object as loom_json_object_walk hands it over: the dotted path of its
 * key through the objects around it ("step", "mem.compute.peak_bytes") and its value. The
 * strings are borrowed for the call. */
typedef enum loom_json_kind {
  LOOM_JSON_NUMBER, /* number: a double (+-inf beyond the range; NaN for NaN) */
  LOOM_JSON_BOOL,   /* boolean */
  LOOM_JSON_STRING, /* string: decoded, NUL-terminated (a NUL inside ends it early) */
  LOOM_JSON_NULL,
} loom_json_kind;
typedef struct loom_json_member {
  const char *key;
  loom_json_kind kind;
  double number;
  bool boolean;
  const char *string;
} loom_json_member;
/* Return LOOM_OK to go on; any other status stops the walk and is returned. */
typedef int (*loom_json_member_fn)(const loom_json_member *m, void *ctx);

/* Read text[0..n) as exactly one JSON object (whitespace around it allowed) and call fn for each
 * scalar member in order, inside nested objects too (arrays are checked, not reported). The
 * grammar is RFC 8259's, strict as the safetensors reader (every escape, UTF-8 validated, lone
 * surrogates refused), with one extension: NaN, Infinity and -Infinity (as Python's json module
 * writes them) and nan, inf, -inf are numbers. Keys' paths are at most 255 bytes and nesting at
 * most 16 levels. LOOM_EFORMAT naming label and the byte offset of the fault; LOOM_EINVAL for
 * a NULL text or fn. */
int loom_json_object_walk(const char *text, size_t n, const char *label, loom_json_member_fn fn,
                          void *ctx);

/* ---- text: byte-level tokens for language models --------------------------------------- */

/* Where Debian's fortunes package puts its English fortunes (strfile text files, each fortune
 * ended by a line holding "%", next to .dat / .u8 index files). */
#define LOOM_FORTUNES_DIR "/usr/share/games/fortunes"
/* Tokens are bytes: a vocabulary of 256. */
#define LOOM_TEXT_VOCAB 256
/* The largest text loom_text_load takes, bytes (1 GiB). */
#define LOOM_TEXT_MAX_BYTES ((size_t)1 << 30)

/* A text as byte tokens, split into training and validation text by a fixed rule: the last
 * tenth (floor(size / 10) bytes) is the validation split (LOOM_SPLIT_TEST), the rest the
 * training split (LOOM_SPLIT_TRAIN).
 *
 * Training windows (loom_text_batch): row r of the global batch of step s takes the
 * context + 1 bytes at training offset loom_rng_hash(loom_rng_hash(seed, s), r) mod
 * (train_size - context): its first context bytes are the inputs, its last context the
 * next-token targets. A row depends on (seed, step, row) alone, so a resumed run takes the
 * windows an uninterrupted one would, and rank k of N with b rows each takes rows
 * [k b, (k + 1) b) of the global batch one process with N b rows takes.
 *
 * Validation windows (loom_text_val_batch): the validation split holds
 * W = (val_size - 1) / context whole windows side by side (window w at offset w context); a
 * validation set of `count` windows (1 <= count <= W) takes window floor(k W / count) for
 * k = 0 .. count-1, spread over the split, the same in every run.
 *
 * Threads: a loaded text is read-only; any thread may use it. */
typedef struct loom_text loom_text;

/* Load a text file's bytes. path NULL: the fortunes (every regular file of LOOM_FORTUNES_DIR
 * whose name has no '.', so not the .dat / .u8 index files, in strcmp order of their names,
 * concatenated, each "%" line (a fortune's end) read as an empty line). Errors, naming the
 * file: LOOM_ENOTFOUND (missing), LOOM_EIO (not a regular file, unreadable), LOOM_EFORMAT
 * (empty; above LOOM_TEXT_MAX_BYTES), LOOM_ENOMEM. */
int loom_text_load(const char *path, loom_text **out);
/* The same from bytes in memory (copied); label names them in messages. */
int loom_text_from_bytes(const void *bytes, size_t n, const char *label, loom_text **out);
void loom_text_free(loom_text *t);
/* What was loaded: the path (or the fortunes folder, or the label). */
const char *loom_text_source(const loom_text *t);
/* The bytes of a split and their count. */
const uint8_t *loom_text_bytes(const loom_text *t, loom_split split);
size_t loom_text_size(const loom_text *t, loom_split split);
/* LOOM_OK if each split holds at least one window of context + 1 bytes, else LOOM_EFORMAT
 * naming the text, the split, its size and the window (LOOM_EINVAL for context 0). */
int loom_text_check(const loom_text *t, size_t context);
/* Validation windows of `context` the split holds (W above; 0 if none). */
size_t loom_text_val_windows(const loom_text *t, size_t context);
/* Rows [row0, row0 + rows) of step `step`'s training batch (see above): new tensors x and y,
 * i64 [rows, context]. LOOM_EINVAL for rows 0 or a context loom_text_check refuses. */
int loom_text_batch(const loom_text *t, uint64_t seed, uint64_t step, size_t row0, size_t rows,
                    size_t context, loom_tensor **x, loom_tensor **y);
/* Windows [first, first + rows) of the validation set of `count` windows (see above): new
 * tensors x and y, i64 [rows, context]. LOOM_EINVAL if count is 0 or above W, or the rows
 * pass its end. */
int loom_text_val_batch(const loom_text *t, size_t count, size_t first, size_t rows,
                        size_t context, loom_tensor **x, loom_tensor **y);

#ifdef __cplusplus
}
#endif
#endif
