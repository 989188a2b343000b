/* alloc_cache.h: the default allocator's cache of large blocks (alloc_cache.c), used only by
 * alloc.c, and only while the default allocator is installed. Blocks are raw blocks of the
 * default allocator (aligned_alloc), identified by their rounded byte size. */
#ifndef LOOM_CORE_ALLOC_CACHE_H
#define LOOM_CORE_ALLOC_CACHE_H

#include "loom/alloc.h"

#include <stdbool.h>
#include <stddef.h>

/* Raw blocks of the default allocator of at least this many (rounded) bytes are mapped from
 * the kernel (mmap) rather than taken from malloc: a fresh one is zero pages not yet resident,
 * so a zeroed allocation need not write them (loom__calloc), and a freed one goes back to the
 * kernel at once. (Not in address-sanitizer builds: there every block goes through malloc.) */
#define LOOM__MAP_MIN_BYTES ((size_t)1 << 20)

/* A raw block of `bytes` (a rounded size) from the system, 64-byte aligned; *fresh_zero says
 * it is newly mapped (all zero, untouched). NULL if out of memory. */
void *loom__raw_alloc(size_t bytes, bool *fresh_zero);
/* loom__raw_alloc maps a block of `bytes` (page-aligned) rather than taking it from malloc. */
bool loom__raw_mapped(size_t bytes);
/* Give a raw block of `bytes` back to the system. */
void loom__raw_free(void *raw, size_t bytes);

/* Smallest block the cache keeps. */
#define LOOM__CACHE_MIN_BYTES ((size_t)256 << 10)

/* The size a raw block of `bytes` is allocated with (cacheable sizes round up to 4 KiB, so
 * that nearby sizes share blocks); other sizes unchanged. */
size_t loom__cache_round(size_t bytes);
/* A cached raw block of exactly `bytes` (a rounded size), taken out of the cache (and counted
 * in use); NULL if none, after dropping what the limit says to drop before a new block of
 * `bytes` is mapped. */
void *loom__cache_take(size_t bytes);
/* A new raw block of `bytes` (a rounded size) is in use: counted towards the high-water mark
 * of the automatic limit. */
void loom__cache_track(size_t bytes);
/* A raw block of `bytes` (a rounded size) is no longer in use: keep it for reuse; false if it
 * does not fit (the caller frees it). */
bool loom__cache_put(void *raw, size_t bytes);

/* A dry run's cache, by size alone (no memory): a dry block of `bytes` (a rounded size) made
 * or freed as the default allocator would (cacheable: the default allocator is installed), by
 * the account that made it (each account is followed on its own, alloc_cache.c), so
 * that loom_mem_dry_footprint_peak follows a real run's blocks in use and cached. Reset when a
 * dry run is turned on. */
void loom__cache_dry_reset(void);
/* untouched: the block is zeros nothing writes before the step (loom__calloc_untouched); the
 * answer is its generation if the dry run counts it as not resident (a fresh mapping, not
 * one the cache would hand out), else 0; loom__cache_dry_free takes that answer back. */
unsigned loom__cache_dry_alloc(int account, size_t bytes, bool cacheable, bool untouched);
void loom__cache_dry_free(int account, size_t bytes, bool cacheable, unsigned gen);

#endif
