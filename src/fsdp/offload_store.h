/* offload_store.h: the storage layer under FSDP offload (private to loom). A store holds
 * numbered slots of bytes in one tier, host memory or a scratch file on disk, and moves bytes in
 * and out of them either synchronously or on the store's own worker threads (the issue's
 * prefetch manager: a real thread with a queue, not a timer). It knows nothing of units,
 * shards or optimizers: the caller numbers the slots (unit * 3 + kind, say) and owns the
 * compute-side buffers. Implemented in offload_store.c (slots, the host tier, statistics, the
 * job queue and the worker threads) and offload_disk.c (the disk tier's file and its I/O).
 *
 * Ownership. loom__ostore_create makes the store, loom__ostore_free releases everything it
 * holds: host buffers (LOOM_POOL_HOST), the file (closed and unlinked), the worker threads and
 * the job records (LOOM_POOL_META, with the store and its slot table). Buffers passed to put/get belong to the caller; those passed to
 * loom__ostore_submit_* are on loan to the store until the job is waited for (or the store is
 * freed): the caller must neither free nor touch them (nor read a get's destination) before.
 *
 * Slots. Slot numbers are the caller's (0, 1, 2, ...; sparse is fine, the table grows to the
 * highest one used). A slot's size is fixed by its first put (or submit_put) and a slot gets
 * its space when that put runs: on the host tier a buffer of that size, on the disk tier the
 * next 4096-aligned range of the file, reserved with posix_fallocate so that a later put of
 * the slot never needs new space. Every later put and every get of the slot must give the
 * same size (LOOM_EINVAL otherwise). A slot holds data (loom__ostore_has) once a put of it has
 * completed; a get of a slot without data is LOOM_EINVAL.
 *
 * Bytes and accounting. Host buffers count in LOOM_POOL_HOST, on the account of the thread
 * that made the store (the worker takes that account too); the disk tier counts
 * each slot's bytes in LOOM_POOL_FILE on the creator's account. The host pool holds the slots'
 * bytes and nothing else: the store's own records are in LOOM_POOL_META. Every counter is back where it
 * started once the store is freed. The disk tier asks the kernel (posix_fadvise DONTNEED)
 * to drop the file's pages from its cache after each transfer: the page cache is not the
 * process's RSS, but it is memory a cgroup limit counts, and keeping a second copy of bytes
 * the caller holds (or chose to put away) defeats the tier.
 *
 * Integrity (disk tier). Each slot's size and CRC-32C are kept in memory at put (CRC-32C:
 * the SSE4.2 instruction where the CPU has it, 2.7 times zlib's CRC-32 here); a get
 * recomputes the CRC of what it read and fails with LOOM_EFORMAT naming the file and the slot
 * ("... changed behind loom's back") if the bytes differ or the file was truncated. On any
 * failed get the destination's content is unspecified: use none of it.
 *
 * Errors. Every fallible function returns a status with a message (loom_last_error()).
 *  - A put that fails leaves the caller's source untouched, and the caller must keep it: it is
 *    then the only good copy. A first put of a slot that fails (full disk, out of memory, an
 *    I/O error) leaves the slot exactly as it was: no size, no space, no data. A later put
 *    can only fail in the transfer itself (an I/O error; full only on a copy-on-write
 *    filesystem, since the slot's space is reserved): the slot keeps its size and space but
 *    holds no data any more (has() false) since its old bytes may be partly overwritten.
 *  - A full disk (ENOSPC, EDQUOT, EFBIG past RLIMIT_FSIZE, or a write that makes no progress)
 *    is LOOM_EIO naming the file and saying "full". (Past RLIMIT_FSIZE the kernel also sends
 *    SIGXFSZ, which kills a process that has not ignored it before any status comes back.)
 *  - Out of memory (host buffers, the slot table, job records) is LOOM_ENOMEM.
 *  - A job's failure inside the worker is returned by loom__ostore_wait for that job, with the
 *    worker's message, on the waiting thread.
 *
 * Threads. Every call but free locks the store: the rank's thread, the group's progress thread
 * (a gather's read) and FSDP's optimizer-step thread may submit and wait at once, each waiting
 * for its own jobs (free: the rank's thread, once the others are done), while the workers run
 * the queued jobs. A worker takes the
 * first queued job whose slot no other worker is moving: the jobs of one slot run one at a
 * time in submission order, jobs of different slots may run at once on different workers (in
 * submission order with one worker, the host tier's default; see loom__ostore_set_workers).
 * A synchronous put or get of a slot first waits until no queued or
 * running job touches that slot, so it sees (and is seen by) the jobs submitted before it in
 * order; jobs on other slots keep running meanwhile. has() and bytes() reflect the jobs that
 * have completed.
 *
 * Page cache (disk tier). The file is opened with O_DIRECT where the filesystem takes it (a
 * 4096-byte write and read at create must go through; LOOM_OFFLOAD_DIRECT=0 in the environment
 * turns it off): bytes go between the device and a 4096-aligned bounce block of 1 MiB per
 * transfer running at once (LOOM_POOL_META), with no page cache at all, and a slot's range in
 * the file extends to the next 4096 (its last block is written whole). Elsewhere (tmpfs before
 * Linux 6.6) the file is buffered, read with POSIX_FADV_RANDOM: a get reads its slot's range
 * and nothing past it (a disk's readahead would read the next slot too, and it would be dropped
 * unused). Either way the bytes read from storage are the gets' bytes. */
#ifndef LOOM_FSDP_OFFLOAD_STORE_H
#define LOOM_FSDP_OFFLOAD_STORE_H

#include "core/core_int.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum loom__otier { LOOM__OTIER_HOST = 0, LOOM__OTIER_DISK = 1 } loom__otier;

/* Worker threads: at most this many per store; by default 1 on the host tier (a memcpy gains
 * nothing from company) and LOOM__OSTORE_DISK_WORKERS on the disk tier (requests in flight at
 * once keep a disk's queue full; see BENCHMARKS.md "disk tier"). */
#define LOOM__OSTORE_MAX_WORKERS 16
#define LOOM__OSTORE_DISK_WORKERS 4

typedef struct loom__ostore loom__ostore;

/* Make a store on `tier`. The host tier ignores dir (may be NULL). The disk tier creates one
 * file, dir/loom-offload-<host>-<pid>-<rank>-<n>.bin (n counts the stores of this process), with
 * O_EXCL and mode 0600, and keeps it open read-write until loom__ostore_free unlinks it.
 * First it removes such files that a process of this host and user left when it died without
 * cleaning up (its pid no longer exists: a SIGKILL, the OOM killer), which can be as large as
 * a rank's training state.
 * Errors: LOOM_EINVAL for a tier out of range, out == NULL, or the disk tier without a
 * folder; LOOM_EIO naming the folder if it does not exist, is not a folder, or cannot be
 * written (read-only filesystem, permissions); LOOM_ENOMEM. On failure *out is NULL and
 * nothing is left behind (no file, no bytes counted). */
int loom__ostore_create(loom__otier tier, const char *dir, int rank, loom__ostore **out);

/* Release the store: drop the jobs that have not started (their buffers are no longer on loan),
 * let running ones finish, stop the workers, close and unlink the file, free every buffer.
 * NULL is a no-op. */
void loom__ostore_free(loom__ostore *s);

/* Copy `bytes` bytes from src into `slot` (synchronous; see "Slots" and "Errors" above). src
 * may be NULL only if bytes is 0. */
int loom__ostore_put(loom__ostore *s, size_t slot, const void *src, size_t bytes);

/* Copy `slot`'s bytes into dst (synchronous); bytes must be the slot's size. Disk tier:
 * LOOM_EFORMAT if the file no longer holds what was put (flipped bytes, truncation). */
int loom__ostore_get(loom__ostore *s, size_t slot, void *dst, size_t bytes);

/* The host tier's own buffer of `slot` (after any job on the slot has finished), for work done
 * where the bytes live (the optimizer step on the host, as ZeRO-Offload's CPU Adam): reads and
 * writes through it are the slot's bytes. NULL for the disk tier, a slot without data, or a
 * size that is not the slot's. Valid until the store is freed; the caller must not use it while
 * a job of the slot is queued. */
void *loom__ostore_host_buffer(loom__ostore *s, size_t slot, size_t bytes);

/* True if `slot` holds data (a put of it has completed and no later put of it failed). */
bool loom__ostore_has(const loom__ostore *s, size_t slot);

/* Bytes held in the tier: the sum of the sizes of the slots that have space. */
size_t loom__ostore_bytes(const loom__ostore *s);

/* Run at most n (1..LOOM__OSTORE_MAX_WORKERS) jobs at once, each on a worker thread of its
 * own. Only before the first submit: LOOM_EMISUSE after; LOOM_EINVAL for n out of range. */
int loom__ostore_set_workers(loom__ostore *s, int n);

/* True if the disk tier's file is read and written with O_DIRECT (see "Page cache"). */
bool loom__ostore_direct(const loom__ostore *s);

/* Tests only (tests/fsdp/test_offload_io.c): while `refuse` is true, the O_DIRECT check of
 * the disk stores created meanwhile fails after its write went through, as on a filesystem
 * that takes the flag and refuses the transfers, so the store runs buffered (the fallback a
 * filesystem without O_DIRECT gets: tmpfs here takes it). Process-wide; false by default. */
void loom__ostore_refuse_direct_for_test(bool refuse);

/* O_DIRECT moves a buffer that starts on an aligned address straight between the device and
 * it (its whole 4096-byte blocks; the ragged tail, and all of an unaligned buffer, through a
 * bounce block). loom__ostore_straight_bytes: the bytes moved straight so far, process-wide.
 * Tests only: while loom__ostore_bounce_only_for_test(true), every transfer bounces (the path
 * an unaligned buffer takes), to compare the two. */
uint64_t loom__ostore_straight_bytes(void);
void loom__ostore_bounce_only_for_test(bool on);

/* The disk tier's file (borrowed, valid until free); NULL for the host tier. */
const char *loom__ostore_path(const loom__ostore *s);

loom__otier loom__ostore_tier(const loom__ostore *s);

/* ---- the worker ----------------------------------------------------------------------- */

/* A job's id: 1, 2, 3, ... in submission order; 0 is never a job. */
typedef uint64_t loom__ojob;

/* Queue a get (or put) for the store's workers (started as jobs come, up to the limit) and
 * return at once with the job's id in *job. The slot and size are checked now (LOOM_EINVAL:
 * a get of a slot that neither holds data nor has a put queued, or a size that is not the
 * slot's); everything else (full disk, a changed file) is the job's status, returned by
 * loom__ostore_wait. dst/src are on loan until the job is waited for. LOOM_ENOMEM if the job
 * record cannot be allocated, LOOM_EBACKEND if the worker thread cannot be started; on any
 * failure nothing was queued and *job is 0. */
int loom__ostore_submit_get(loom__ostore *s, size_t slot, void *dst, size_t bytes,
                            loom__ojob *job);
int loom__ostore_submit_put(loom__ostore *s, size_t slot, const void *src, size_t bytes,
                            loom__ojob *job);
/* loom__ostore_submit_put with flags:
 * LOOM__OJOB_RELEASE: src's whole pages go back to the system (loom__mem_release) as soon as
 *   the put has succeeded, on the worker: src's bytes are dead once on the tier (they read as
 *   zero afterwards); a failed put leaves them as they were. src must be memory whose value
 *   nobody needs after the put (loom__malloc's).
 * LOOM__OJOB_FIRST: the job goes ahead of every queued job that is not FIRST (after the FIRST
 *   ones, in submission order), unless a job of its slot is queued or running (then at the
 *   end, as any job): a write someone waits for soon passes reads queued ahead for later.
 * LOOM__OJOB_KEEP: loom__ostore_clear leaves the job queued (only loom__ostore_free drops it):
 *   the jobs of a pass running on a thread of its own (FSDP's optimizer step behind the next
 *   forward), which another thread's clear must not fail. */
enum { LOOM__OJOB_RELEASE = 1, LOOM__OJOB_FIRST = 2, LOOM__OJOB_KEEP = 4 };
int loom__ostore_submit_put_ex(loom__ostore *s, size_t slot, void *src, size_t bytes,
                               unsigned flags, loom__ojob *job);
/* loom__ostore_submit_get with flags (LOOM__OJOB_KEEP; the others are for puts). */
int loom__ostore_submit_get_ex(loom__ostore *s, size_t slot, void *dst, size_t bytes,
                               unsigned flags, loom__ojob *job);

/* Block until `job` is done and forget it; return its status, with its message (from the
 * worker) as this thread's loom_last_error(). *waited (may be NULL) gets the seconds this call
 * was blocked (0 if the job had already finished). A job that was cleared before it started
 * returns LOOM_EABORTED. An id that is not pending (0, never submitted, or already waited
 * for): LOOM_OK at once. Jobs may be waited for in any order. */
int loom__ostore_wait(loom__ostore *s, loom__ojob job, double *waited);

/* Drop every queued job that has not started (but those submitted with LOOM__OJOB_KEEP):
 * their waits return LOOM_EABORTED and their
 * buffers are no longer used (still on loan until waited for, by the letter of the rule, but
 * never touched again). A running job completes normally. */
void loom__ostore_clear(loom__ostore *s);

/* Jobs submitted that have not started yet (queued behind the running one, if any). */
size_t loom__ostore_queued(const loom__ostore *s);

/* Transfer statistics, since create. */
typedef struct loom__ostore_stats {
  uint64_t bytes_written;  /* by completed puts, synchronous and on the worker */
  uint64_t bytes_read;     /* by completed gets */
  uint64_t puts, gets;     /* completed (successful) puts and gets */
  uint64_t jobs;           /* jobs submitted */
  uint64_t jobs_cleared;   /* jobs dropped by clear or free before they started */
  double transfer_s;       /* seconds spent moving bytes (and checking them): the workers' and
                            * the synchronous calls' summed (more than the wall time when
                            * several workers move bytes at once) */
  double wait_s;           /* exposed wait: seconds the caller was blocked in wait, or in a
                            * synchronous call behind a job on the same slot */
  uint64_t waits_blocked;  /* waits that had to block */
} loom__ostore_stats;

void loom__ostore_get_stats(const loom__ostore *s, loom__ostore_stats *out);

#endif
