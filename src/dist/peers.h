/* peers.h: checks that every rank of a group holds the same thing (DDP's and FSDP's "all
 * ranks wrap the same model"), as an error naming the first difference on every rank, never a
 * hang or a mismatched collective later. For the parallel layers (src/ddp, src/fsdp). */
#ifndef LOOM_DIST_PEERS_H
#define LOOM_DIST_PEERS_H

#include "loom/dist.h"
#include "loom/tensor.h"

#include <stddef.h>
#include <stdint.h>

/* One all-reduce (MAX of v and -v): *first = the first index where some rank's v differs, n if
 * every rank holds the same v[0..n). Every rank must call it with the same n. */
int loom__pg_agree_i64(loom_pg *pg, const int64_t *v, size_t n, size_t *first);

/* Every rank holds n tensors with the same dtypes, shapes and names (names may be NULL) in the
 * same order: LOOM_EMISUSE (count, order), LOOM_EDTYPE or LOOM_ESHAPE with a message that
 * starts with `who` ("ddp") and names the first parameter that differs. Two all-reduces
 * (*collectives, may be NULL, gets 2). */
int loom__pg_check_same_tensors(loom_pg *pg, loom_tensor *const *ts, const char *const *names,
                                size_t n, const char *who, uint64_t *collectives);

#endif
