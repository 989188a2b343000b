/* offload_store_int.h: the offload store's own layout, shared by its two files (private to
 * offload_store.c, which owns the slots, the job queue, the workers and the public calls, and
 * offload_disk.c, which owns the disk tier's file: its space, pread/pwrite and O_DIRECT, the
 * CRC-32C check, finding and sweeping the files). Nothing else includes it. */
#ifndef LOOM_FSDP_OFFLOAD_STORE_INT_H
#define LOOM_FSDP_OFFLOAD_STORE_INT_H

#include "fsdp/offload_store.h"

#include <pthread.h>
#include <stdatomic.h>

#define SLOT_ALIGN ((size_t)4096) /* each slot's range in the file starts on a page */
#define IO_CHUNK ((size_t)1 << 20) /* CRC and pwrite one cache-warm MiB at a time */
#define READ_BLOCK ((size_t)4 << 20) /* pread up to 4 MiB at once: with no readahead (the file is
                                      * POSIX_FADV_RANDOM), one request is all the disk sees */
#define WRITEBACK_BYTES ((size_t)64 << 20) /* dirty bytes of the file at most */
#define DIRECT_ALIGN ((size_t)4096)  /* O_DIRECT: buffer address, offset and length */
#define DIRECT_BLOCK ((size_t)1 << 20) /* O_DIRECT: the bounce block of one transfer */

static inline size_t round_up(size_t n, size_t a) { return (n + a - 1) & ~(a - 1); }

typedef struct oslot {
  size_t bytes;     /* the slot's size, fixed by its first put (meaningful if declared) */
  size_t off;       /* disk: where its range starts (if space) */
  void *buf;        /* host: its buffer (if space and bytes > 0) */
  uint32_t crc;     /* disk: CRC-32C of what the last put wrote (if data) */
  uint32_t pending; /* queued or running jobs on this slot */
  bool running;     /* a worker is moving its bytes now */
  bool declared;    /* it has a size: it has space, or a job of it is pending */
  bool space;       /* it has its buffer / file range */
  bool data;        /* a put completed and no later put failed */
} oslot;

enum { JOB_GET = 0, JOB_PUT = 1 };
enum { JOB_QUEUED = 0, JOB_RUNNING = 1, JOB_DONE = 2 };

typedef struct ojob {
  struct ojob *next, *prev; /* live list (submitted, not yet waited for); next: free list */
  struct ojob *qnext;       /* queue of jobs not yet started */
  loom__ojob id;
  int kind, state, status;
  bool release; /* a put: src's pages go back to the system once it succeeded */
  bool first;   /* queued ahead of the jobs that are not (LOOM__OJOB_FIRST) */
  bool keep;    /* left queued by loom__ostore_clear (LOOM__OJOB_KEEP) */
  size_t slot, bytes;
  void *buf; /* dst of a get, src of a put (on loan) */
  char msg[512];
} ojob;

struct loom__ostore {
  loom__otier tier;
  int rank;
  int account; /* the creator's memory account: the worker's too, and the file bytes' */
  char *path;  /* disk tier */
  int fd;
  bool dry; /* made in a dry run (loom_mem_set_dry_run): no file, no bytes moved */

  pthread_mutex_t mu;
  pthread_cond_t cv_work; /* the worker: a job was queued, or stop */
  pthread_cond_t cv_done; /* waiters: a job finished (or was dropped) */
  oslot *slots;
  size_t nslots; /* table length (slots beyond are undeclared) */
  size_t held;   /* sum of the sizes of the slots with space */
  ojob *live_head, *live_tail, *q_head, *q_tail, *free_jobs;
  loom__ojob last_id;
  pthread_t threads[LOOM__OSTORE_MAX_WORKERS];
  int nthreads, max_workers, idle; /* started, allowed, waiting for work */
  bool stop;
  loom__ostore_stats st;

  pthread_mutex_t space_mu;
  size_t end; /* disk: the file's used length (under space_mu) */
  _Atomic size_t unsynced; /* disk: bytes written since the last wait for writeback */
  bool direct;             /* disk: the file is open with O_DIRECT (no page cache at all) */
  void *bounce;            /* O_DIRECT: free bounce blocks (raw, linked through their start;
                            * under mu), one per transfer running at once */
};

/* ---- the disk tier's file (offload_disk.c) ---------------------------------------------- */

/* Create the store's file in dir (removing files that dead processes of this host left), or,
 * in a dry run, only check that dir could take one; errors name the folder. */
int loom__odisk_open(loom__ostore *s, const char *dir);
int loom__odisk_check(const char *dir);
/* O_DIRECT unless LOOM_OFFLOAD_DIRECT=0; try it on the open file (stays buffered where the
 * filesystem refuses it); LOOM_ENOMEM only. */
bool loom__odisk_direct_wanted(void);
int loom__odisk_direct_try(loom__ostore *s);
/* The next aligned range of the file for `slot`, reserved (posix_fallocate); give it back. */
int loom__odisk_reserve(loom__ostore *s, const char *who, size_t slot, size_t bytes, size_t *off);
void loom__odisk_unreserve(loom__ostore *s, size_t off, size_t bytes);
/* Move a slot's bytes, with its CRC-32C (written: *crc_out; read: checked against want). */
int loom__odisk_write(loom__ostore *s, const char *who, size_t slot, size_t off,
                      const void *src, size_t bytes, uint32_t *crc_out);
int loom__odisk_read(loom__ostore *s, const char *who, size_t slot, size_t off, void *dst,
                     size_t bytes, uint32_t want);

#endif
