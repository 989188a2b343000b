/* fsdp_ckpt_int.h: what saving (fsdp_ckpt.c) and loading (fsdp_ckpt_load.c) a sharded
 * checkpoint share (fsdp layer, private): the set's file names and format marker, and the
 * strict reading of its metadata numbers and of a file with its CRC. The format itself is
 * described at the top of fsdp_ckpt.c. */
#ifndef LOOM_FSDP_CKPT_INT_H
#define LOOM_FSDP_CKPT_INT_H

#include "fsdp/fsdp_int.h"

#define FSDP_CKPT_INDEX "fsdp-index.safetensors"
#define FSDP_CKPT_FORMAT "fsdp-sharded/1"
/* a step or generation: exact in a double, never overflows */
#define FSDP_CKPT_MAX_COUNT ((int64_t)1 << 53)

/* Metadata `key` of fl (the file at path) as a count in [0, max]: decimal digits only, no sign
 * or leading zero, so a value is written one way. Absent: LOOM_ENOTFOUND, with no message if
 * !need (the caller has a default). */
int loom__fsdp_ckpt_count(const loom_safetensors *fl, const char *path, const char *key,
                          int64_t max, bool need, int64_t *out);
/* dir's index file; generation gen's file of rank `rank` of `world`. */
void loom__fsdp_ckpt_index_path(const char *dir, char *buf, size_t cap);
void loom__fsdp_ckpt_rank_path(const char *dir, int64_t gen, int rank, int world, char *buf,
                               size_t cap);
/* Open path through the page cache (mapped: the file may be larger than the memory a run has,
 * with offload) and verify its CRC over every byte; *size and *crc are the file's. The caller
 * frees *out. */
int loom__fsdp_ckpt_open(const char *path, loom_safetensors **out, int64_t *size, int64_t *crc);

#endif
