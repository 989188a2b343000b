/* loom/alloc.h: memory pools, byte accounting, the allocator hook and failure injection.
 *
 * Every byte loom allocates goes through one hook and is counted against a pool: compute
 * (tensors, activations, gradients, optimizer state, work buffers), host (FSDP's CPU offload:
 * the host tier's copies of shards, gradients and optimizer state, and optimizer state made
 * with state_pool LOOM_POOL_HOST; nothing else, so a run without offload keeps it at 0), file
 * (the disk tier) and meta (loom's own bookkeeping and I/O staging). Each pool has current and
 * peak byte counts that any thread may read at any time, process-wide and per account (per
 * rank of the threads backend). Tests swap the hook or make the Nth allocation fail to prove
 * that every create path cleans up when memory runs out. */
#ifndef LOOM_ALLOC_H
#define LOOM_ALLOC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum loom_pool {
  LOOM_POOL_COMPUTE = 0, /* tensors and work buffers in use by compute */
  LOOM_POOL_HOST = 1,    /* host-side copies: CPU offload of shards, gradients and optimizer
                            state, and nothing else (the offload figure) */
  LOOM_POOL_FILE = 2,    /* disk-backed memory (mapped files, the disk tier) */
  LOOM_POOL_META = 3,    /* bookkeeping (plans, lists, names, handles, object structs) and
                            host staging of I/O and collectives (a file or a dataset read into
                            memory, a write's pieces, a collective's scratch) */
  LOOM_POOL_COUNT = 4
} loom_pool;

typedef struct loom_pool_stats {
  size_t current_bytes; /* bytes allocated and not yet freed */
  size_t peak_bytes;    /* highest current_bytes since start or loom_mem_reset_peak */
  uint64_t allocs;      /* successful allocations */
  uint64_t frees;       /* frees */
  uint64_t failures;    /* allocations that failed (out of memory or injected) */
} loom_pool_stats;

/* Read one pool's counters. LOOM_EINVAL for a pool out of range or out == NULL. */
int loom_mem_stats(loom_pool pool, loom_pool_stats *out);

/* Set a pool's peak to its current value (to measure the peak of one phase). */
void loom_mem_reset_peak(loom_pool pool);

/* Accounts: who the bytes are for. Every allocation is also counted against an account, a
 * small integer that each thread carries (thread-local, 0 until the thread sets it), so that
 * the ranks of the threads backend, which share one process, each have their own figure.
 * Account 0 is "no rank / the process"; account r + 1 is rank r. loom_threads_run sets it on
 * each rank thread (ranks past 63 stay on 0), and a group's progress thread takes its rank's
 * account (for a group made outside loom_threads_run, that of the thread that made it).
 * A block's account is recorded with it, so a block freed by another thread (or account) is
 * still credited back to the account that allocated it. Each account has the counters of
 * loom_mem_stats for each pool (its peak since start or loom_mem_account_reset_peak); the
 * process-wide counters count every account. */
#define LOOM_MEM_ACCOUNTS 65 /* accounts 0..64: the process, and ranks 0..63 */

/* Set the calling thread's account (later allocations of this thread count against it).
 * LOOM_EINVAL, account unchanged, if it is not in 0..LOOM_MEM_ACCOUNTS-1. */
int loom_mem_set_account(int account);
/* The calling thread's account. */
int loom_mem_account(void);
/* Read one pool's counters for one account: the same fields as loom_mem_stats, counting only
 * blocks (and mapped files) allocated while `account` was the allocating thread's account.
 * LOOM_EINVAL for an account or pool out of range or out == NULL. */
int loom_mem_account_stats(int account, loom_pool pool, loom_pool_stats *out);
/* Set one account's peak for a pool to its current value (a no-op out of range). */
void loom_mem_account_reset_peak(int account, loom_pool pool);

/* Tags: what the bytes are for, in the program's own words (a phase of its step, say). Each
 * thread carries a tag, 0..LOOM_MEM_TAGS-1 (thread-local, 0 until set), recorded with every
 * block it allocates; each account keeps, per pool, the bytes live by tag and a copy of them
 * taken whenever its peak rises, so a program can tell what was live at the peak (`loom plan`
 * prints it). Mapped files and other bytes counted without a block count as tag 0. */
#define LOOM_MEM_TAGS 8
/* Set the calling thread's tag. LOOM_EINVAL, tag unchanged, if out of range. */
int loom_mem_set_tag(int tag);
int loom_mem_tag(void);
/* The bytes of each tag that were live at `account`'s peak of `pool` (since start or its last
 * loom_mem_account_reset_peak). LOOM_EINVAL for an account or pool out of range or NULL. */
int loom_mem_account_tags(int account, loom_pool pool, size_t at_peak[LOOM_MEM_TAGS]);

/* The pool's name: "compute", "host", "file", "meta"; "?" if out of range. */
const char *loom_pool_name(loom_pool pool);

/* The hook every allocation goes through. alloc returns `size` bytes aligned to `align` (a
 * power of two, at most 4096) or NULL; free releases what alloc returned. */
typedef struct loom_allocator {
  void *(*alloc)(void *ctx, size_t size, size_t align);
  void (*free)(void *ctx, void *ptr);
  void *ctx;
} loom_allocator;

/* Replace the allocator (NULL restores the default, aligned_alloc/free). Returns LOOM_EBUSY
 * if any pool still holds bytes, since those must be freed by the allocator that made them;
 * LOOM_EINVAL if a function pointer is NULL. Not thread-safe with concurrent allocation. */
int loom_set_allocator(const loom_allocator *a);

/* The default allocator's cache of large blocks. A block of 256 KiB or more that loom frees
 * is kept, up to a limit, and given to the next allocation of the same size, instead of going
 * back to the C library, which would return its pages to the kernel and fault them in again on
 * the next training step. The limit is by default automatic (LOOM_MEM_CACHE_AUTO): large
 * blocks in use plus cached stay within the most ever in use at once plus 256 MiB (a training
 * step's whole working set comes back the next step; the process holds no more than it could
 * with a fixed 256 MiB limit); a new block first drops cached ones to stay within it.
 * LOOM_ALLOC_CACHE_MB from the environment (a whole number of MiB; any other value is ignored
 * here, and refused by the `loom` command) sets a fixed limit on the cached bytes instead, as
 * loom_mem_set_cache_limit does; address-sanitizer builds start with the cache off (0).
 * Cached bytes are not counted in any pool's current_bytes.
 * A custom allocator (loom_set_allocator) bypasses the cache. All four are thread-safe. */
#define LOOM_MEM_CACHE_AUTO SIZE_MAX
/* A fixed limit on cached bytes (0 turns the cache off), or LOOM_MEM_CACHE_AUTO; shrinks the
 * cache to the new limit. */
void loom_mem_set_cache_limit(size_t bytes);
/* The limit in force (a fixed one plus what FSDP reserves), or LOOM_MEM_CACHE_AUTO. */
size_t loom_mem_cache_limit(void);
size_t loom_mem_cached_bytes(void);          /* bytes held in the cache now */
void loom_mem_release_cache(void);           /* give every cached block back to the C library */

/* Dry runs: what a step needs without running it (PyTorch's meta tensors, for a whole step).
 * While on, every allocation and free happens as it would, in the same order and with the
 * same sizes, so every pool's and account's counters (and their peaks) are exact; but no
 * kernel runs and no data moves: GEMMs and convolutions, elementwise and reduction kernels,
 * conversions, initialisers, optimizer updates, collectives' payloads and the disk tier's
 * reads and writes are skipped (each after the allocations it makes). Blocks are zero-filled
 * address space that reserves no memory, so a step of a model larger than this machine can be
 * planned, and values read as zero (a loss of 0, no overflow). Values computed in a dry run
 * mean nothing. Turn it on before building what the dry step uses (a block made in a real run
 * holds real memory) and off once it is freed; `loom plan` is built on it. Process-wide; set it
 * while no other thread uses loom. Turning it on empties the allocator cache. */
void loom_mem_set_dry_run(bool on);
bool loom_mem_dry_run(void);
/* The peak, since the dry run was last turned on, of the bytes a real run of the same
 * allocations would hold in loom's blocks: every block in use (any pool, headers and rounding
 * included) plus the blocks the default allocator's cache would keep then (its exact-size
 * policy, limit and slots, followed by size). That is the resident memory a real run owes to
 * loom's blocks, what the pools' peaks leave out; the C library's own overheads aside. A large
 * block of zeros that nothing writes before a training step (a module's gradient arena) is a
 * fresh mapping whose pages are not resident: it counts from loom_mem_dry_mark_written on,
 * and not at all if it is freed (or cached) before. */
size_t loom_mem_dry_footprint_peak(void);
/* In a dry run: the step starts writing what was made so far (gradients, optimizer state), so
 * every block in use counts as resident from now on. Call it where the real run's first step
 * starts (after building the model, its strategy and optimizer). Process-wide. */
void loom_mem_dry_mark_written(void);

/* Failure injection for tests: make the nth allocation from now fail (n = 1: the next one),
 * once; n = 0 turns injection off. Counts allocations of every thread. */
void loom_alloc_fail_nth(uint64_t n);

/* Number of allocation attempts since start (tests use it to size failure sweeps). */
uint64_t loom_alloc_attempts(void);

#ifdef __cplusplus
}
#endif
#endif
