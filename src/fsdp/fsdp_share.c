/* fsdp_share.c: one gathered buffer for every rank of a group whose ranks share an address
 * space (the threads backend). Each rank used to all-gather a unit into its own buffer: every
 * rank copied every rank's shard, n x the unit's bytes per gather for n ranks, on the cores the
 * ranks compute on (issue 27: FSDP's step 1.26x DDP's on a 2-core Xeon, all of it those copies).
 * With a shared buffer each rank copies only its own shard into it (the threads all-gather
 * copies only the caller's part when every rank passes the same recv: threads_coll.c), 1/n of
 * the bytes, and every rank's parameters view the same bytes, which nobody writes while the unit
 * is gathered (the gathered parameters are read-only: fsdp.h).
 *
 * Rank 0 (the leader) allocates each shared buffer and publishes it in the unit's slot for that
 * gather, holding one reference for each other rank; the others take theirs from the slot when
 * they issue the same gather. Every rank frees its reference when it reshards, and the last one
 * frees the buffer. Memory: the process's compute pool counts the buffer once; the block itself
 * is on account 0 (the process's, no rank's), and each rank's account counts its 1/n share
 * (its shard's bytes) from taking its reference to freeing it (loom__mem_account_only), so a
 * rank's figures never hold a unit only a slower peer still uses. Gathers of one unit alternate between two slots
 * by their count: the leader rewrites a slot only at its next-but-one gather of the unit, after
 * it waited for the next one, which every rank had issued (so taken its buffer of this one)
 * before that collective could complete.
 *
 * The f32 gathers go further: each unit has one resident buffer, made by rank 0 at create,
 * whose slice at rank r x shard IS rank r's parameter shard (u->param_shard points into it; the
 * optimizer updates it there). A gather then copies nothing: the threads all-gather sees send
 * == its place in recv and only synchronises, which orders every rank's shard writes before
 * any rank's reads (fsdp.h: shards are written after loom_fsdp_finish, so reads end before).
 * The bytes each rank copied per gather before (its shard, 214 MB a step per rank in
 * bench_fsdp) and the gathered buffers' allocations and page faults are gone; each rank's
 * account counts its shard for the wrapper's life, as a shard of its own.
 *
 * Not with cfg.optim_in_backward: a rank steps its shard of a unit once the unit's
 * reduce-scatter completes, which every rank joins once the unit's parameters have their
 * gradients but before backward has computed the unit's input gradient from them (fsdp_hooks.c),
 * so a peer may still read the slice being stepped (tests/fsdp/test_fsdp_share_write.c saw the
 * weights 3e-2 off). Those wrappers keep their shards apart and share only the gathered buffers
 * of the two slots above (rank 0's configuration decides; a rank configured otherwise does not
 * share at all).
 *
 * Not with offload either: the shards live in the tier, not in a resident buffer. Those
 * wrappers too share only the gathered buffers of the two slots: each rank reads its part
 * straight out of its tier into its slice of the shared buffer (fsdp_gather.c: the all-gather's
 * first step), and the threads all-gather then only synchronises, so a process holds one
 * gathered unit (and one gathered ahead) for all its ranks instead of one per rank (issue 29:
 * the disk tier's resident memory, and half the fresh pages of the gathers).
 *
 * The limit (PyTorch's limit_all_gathers, for a process's shared buffers): rank 0 makes each
 * buffer, and a rank running ahead of the others would make the next unit's buffer while a
 * slower rank still holds the unit before, three or four gathered units in the process instead
 * of the running one and the one prefetched (tests/fsdp/test_fsdp_offload_resident.c: three
 * with a slower rank computing on 32 times the rows, four with wider units and more rows).
 * So rank 0 makes no new buffer while one it has let go of is still held by another rank
 * ("stale"): it waits, with the group's health checks (a failed wait fails the group), until
 * that rank lets go at its own reshard; a rank lets go once its reference is freed, so the old
 * block is gone before the new one is made. It does not wait while another rank waits for it
 * to publish a buffer (that rank may be the one holding the stale one: with the optimizer step
 * behind the forward, a rank whose pass was further along prefetches a unit rank 0 gathers only
 * when it comes), and never longer than a second: the limit saves memory, it must not stop a
 * run. The disk tier's process RSS: 303-312 MB without the wait, 297 MB with it, three runs
 * each (issue 29: 35% of the training state). LOOM_FSDP_SHARE_LIMIT=0 in the environment
 * turns it off (the A/B).
 *
 * Only f32 gathers without mixed precision share (the cast paths fill their own part in a
 * buffer of the forward's dtype); the decision is the same on every rank, made from the
 * configuration every rank holds alike. LOOM_FSDP_SHARE_GATHERS=0 in the environment turns it
 * off (each rank gathers into its own buffer, as before: bench_fsdp compares the two). */
#include "fsdp/fsdp_int.h"
#include "dist/prepared.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct loom__fsdp_share_slot {
  loom_tensor *_Atomic t;   /* the buffer of the gather numbered gen */
  _Atomic uint64_t gen;     /* 1-based gather count of the unit; 0: never published */
  _Atomic int untaken;      /* references not taken yet by the other ranks */
  int holders;              /* under mu: ranks that have not let go of it yet (limit on) */
  bool stale;               /* under mu: rank 0 let go of it, another rank has not */
} share_slot;

struct loom__fsdp_share {
  _Atomic int refs; /* the ranks' wrappers holding it */
  pthread_mutex_t mu; /* publications: the others sleep on cv until theirs is there */
  pthread_cond_t cv;
  int world;
  size_t nunits;
  share_slot *slots; /* nunits x 2 */
  share_slot *resident; /* nunits: each unit's one buffer holding every rank's shard (gen 1) */
  bool no_resident; /* rank 0's cfg.optim_in_backward or offload: no resident buffers (see the
                     * top) */
  bool limit;       /* rank 0 waits for stale buffers before it makes another (see the top) */
  int stale;        /* under mu: buffers rank 0 let go of that another rank still holds */
  int waiting;      /* under mu: ranks waiting for rank 0 to publish a buffer */
};

static void share_release(loom__fsdp_share *s) {
  if (!s || atomic_fetch_sub(&s->refs, 1) != 1) return;
  for (size_t i = 0; i < 3 * s->nunits; i++) { /* references a failed rank never took */
    share_slot *x = i < 2 * s->nunits ? &s->slots[i] : &s->resident[i - 2 * s->nunits];
    loom_tensor *t = atomic_load(&x->t);
    for (int k = atomic_load(&x->untaken); t && k > 0; k--) loom_tensor_free(t);
  }
  pthread_cond_destroy(&s->cv);
  pthread_mutex_destroy(&s->mu);
  loom__free(s->slots);
  loom__free(s->resident);
  loom__free(s);
}

static bool sharing_wanted(void) {
  const char *e = getenv("LOOM_FSDP_SHARE_GATHERS");
  return !(e && !strcmp(e, "0"));
}

static bool limit_wanted(void) {
  const char *e = getenv("LOOM_FSDP_SHARE_LIMIT");
  return !(e && !strcmp(e, "0"));
}

int loom__fsdp_share_init(loom_fsdp *f) {
  f->share = NULL;
  /* the exchange below runs on every rank of a group in one process (the backend and the
   * environment are the process's; a dry run shares too, so that `loom plan` counts what the
   * run will); whether to share is then agreed: every rank
   * must want it (the configuration may differ between ranks, which a later collective
   * reports) */
  if (f->world < 2 || !loom__pg_one_address_space(f->pg)) return LOOM_OK;
  bool want = !f->mp && sharing_wanted();
  bool no_resident = f->cfg.optim_in_backward || f->cfg.offload.enabled;
  loom__fsdp_share *mine = NULL;
  if (f->rank == 0 && want) {
    /* on account 0, as the buffers: the last rank to let go frees it, whichever that is */
    int account = loom_mem_account();
    loom_mem_set_account(0);
    mine = loom__calloc(LOOM_POOL_META, 1, sizeof *mine);
    size_t nu = f->nunits ? f->nunits : 1;
    if (mine) mine->slots = loom__calloc(LOOM_POOL_META, 2 * nu, sizeof *mine->slots);
    if (mine) mine->resident = loom__calloc(LOOM_POOL_META, nu, sizeof *mine->resident);
    loom_mem_set_account(account);
    if (mine && mine->slots && mine->resident && pthread_mutex_init(&mine->mu, NULL) == 0) {
      if (pthread_cond_init(&mine->cv, NULL) != 0) {
        pthread_mutex_destroy(&mine->mu);
        loom__free(mine->slots);
        loom__free(mine->resident);
        loom__free(mine);
        mine = NULL;
      }
    } else if (mine) {
      loom__free(mine->slots);
      loom__free(mine->resident);
      loom__free(mine);
      mine = NULL;
    }
    if (mine) {
      mine->no_resident = no_resident;
      mine->limit = limit_wanted();
      atomic_init(&mine->refs, f->world);
      mine->world = f->world;
      mine->nunits = f->nunits;
    }
  }
  /* each rank sends its object (rank 0; 0 for the others, or nobody shares) and whether it
   * wants to share (0: no; 1: yes; 2: yes, with no resident buffers: the step in backward, or
   * offload). Nobody reads rank 0's object before agreeing: rank 0 frees it when they do not
   * agree (a rank that read its mode there raced with that free). */
  int64_t send[2] = {f->rank == 0 ? (int64_t)(intptr_t)mine : 0, !want ? 0 : no_resident ? 2 : 1};
  int64_t *all = loom__calloc(LOOM_POOL_META, 2 * (size_t)f->world, sizeof *all);
  int rc = LOOM_OK;
  if (!all) {
    rc = loom__fail(LOOM_ENOMEM, "fsdp: out of memory sharing gathers");
    loom__pg_fail_group(f->pg, rc, loom_last_error()); /* the others must not wait for us */
  }
  /* bytes that move in a dry run too: `loom plan` shares as the run will */
  if (!rc) rc = loom__pg_allgather_always(f->pg, send, all, 2, LOOM_I64);
  bool every = !rc && all[0] != 0 && all[1] != 0;
  for (int r = 1; r < f->world && every; r++) every = all[2 * r + 1] == all[1];
  if (every) f->share = (loom__fsdp_share *)(intptr_t)all[0];
  loom__free(all);
  if (!f->share && mine) {
    atomic_store(&mine->refs, 1);
    share_release(mine);
  }
  return rc;
}

void loom__fsdp_share_free(loom_fsdp *f) {
  share_release(f->share);
  f->share = NULL;
}

static ptrdiff_t share_bytes(const fsdp_unit *u, loom_dtype dt) {
  return (ptrdiff_t)(u->shard * loom_dtype_size(dt));
}

/* This rank lets go of the shared buffer in slot s (the limit's count, under mu): rank 0's
 * leaves it stale while another rank holds it, the last one's makes it no longer stale. */
static void let_go(loom_fsdp *f, share_slot *s) {
  loom__fsdp_share *sh = f->share;
  pthread_mutex_lock(&sh->mu);
  int left = --s->holders;
  if (f->rank == 0 && left > 0) {
    s->stale = true;
    sh->stale++;
  } else if (left == 0 && s->stale) {
    s->stale = false;
    sh->stale--;
    pthread_cond_broadcast(&sh->cv);
  }
  pthread_mutex_unlock(&sh->mu);
}

void loom__fsdp_free_gathered(fsdp_unit *u) {
  if (u->share_counted)
    loom__mem_account_only(LOOM_POOL_COMPUTE, loom_mem_account(), -(ptrdiff_t)u->share_counted);
  u->share_counted = 0;
  loom_tensor_free(u->gathered); /* the last rank's frees the block, before rank 0 may go on */
  u->gathered = NULL;
  if (u->share_slot) let_go(u->f, u->share_slot);
  u->share_slot = NULL;
}

bool loom__fsdp_shares(const fsdp_unit *u, loom_dtype dt) {
  return u->f->share && dt == LOOM_F32;
}

/* With sh->mu held: whether the calling rank may go on (1), must wait (0), or fails (an error
 * status, its message set). */
typedef int (*share_ready_fn)(fsdp_unit *u, share_slot *s, uint64_t gen);

/* Sleep until ready() says go on, waking every 20 ms to check the group's health and timeout
 * (a failed rank fails the group: loom__pg_fail_group); `what` names the wait. After
 * give_up_s seconds (if > 0) it goes on anyway. */
static int wait_ready(fsdp_unit *u, share_slot *s, uint64_t gen, share_ready_fn ready,
                      double give_up_s, const char *what) {
  loom_fsdp *f = u->f;
  loom__fsdp_share *sh = f->share;
  double t0 = loom__now(), timeout = loom_pg_timeout(f->pg);
  int rc = LOOM_OK;
  pthread_mutex_lock(&sh->mu);
  for (;;) {
    int go = ready(u, s, gen);
    if (go < 0) rc = go;
    if (go != 0) break;
    if ((rc = loom_pg_async_error(f->pg))) break;
    if (give_up_s > 0 && loom__now() - t0 > give_up_s) break;
    if (loom__now() - t0 > timeout) {
      rc = loom__fail(LOOM_ETIMEDOUT, "fsdp: rank %d waited %.0f s for %s (unit '%s')", f->rank,
                      timeout, what, loom__fsdp_unit_shown(u->name));
      break;
    }
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_nsec += 20000000;
    if (until.tv_nsec >= 1000000000) {
      until.tv_sec++;
      until.tv_nsec -= 1000000000;
    }
    pthread_cond_timedwait(&sh->cv, &sh->mu, &until);
  }
  pthread_mutex_unlock(&sh->mu);
  return rc;
}

static int published(fsdp_unit *u, share_slot *s, uint64_t gen) {
  uint64_t g = atomic_load_explicit(&s->gen, memory_order_acquire);
  if (g == gen) return 1;
  if (g < gen) return 0;
  return loom__fail(LOOM_EMISUSE, "fsdp: rank %d is behind rank 0 in gathers of unit '%s' "
                    "(its gather %llu, rank 0's %llu): do the ranks run the same steps?",
                    u->f->rank, loom__fsdp_unit_shown(u->name), (unsigned long long)gen,
                    (unsigned long long)g);
}

/* Sleep until the leader publishes gather gen of the unit; counted in sh->waiting meanwhile
 * (rank 0 does not wait for a stale buffer while a rank waits for it: that rank may be the
 * one holding the buffer, as when its prefetch goes ahead of rank 0's, whose optimizer step
 * behind the forward had not yet reached the unit). */
static int wait_published(fsdp_unit *u, share_slot *s, uint64_t gen) {
  loom__fsdp_share *sh = u->f->share;
  pthread_mutex_lock(&sh->mu);
  sh->waiting++;
  pthread_cond_broadcast(&sh->cv);
  pthread_mutex_unlock(&sh->mu);
  int rc = wait_ready(u, s, gen, published, 0, "rank 0 to gather it");
  pthread_mutex_lock(&sh->mu);
  sh->waiting--;
  pthread_mutex_unlock(&sh->mu);
  return rc;
}

static int nothing_stale(fsdp_unit *u, share_slot *s, uint64_t gen) {
  (void)s, (void)gen;
  return u->f->share->stale == 0 || u->f->share->waiting > 0;
}

/* The most rank 0 waits for a stale buffer: the limit saves memory and must never stop a run
 * (a program that holds a unit across its own barrier, say). */
#define STALE_WAIT_MAX_S 1.0

/* Rank 0's new buffer of `len` elements of dt on account 0 (no rank's), zeroed if asked; a
 * failure fails the group, since the others wait for it. */
static int leader_alloc(loom_fsdp *f, loom_dtype dt, int64_t len, bool zero, loom_tensor **t) {
  int account = loom_mem_account();
  loom_mem_set_account(0); /* the block is no rank's: each counts its share (see the top) */
  int rc = loom_tensor_empty(dt, 1, &len, t);
  loom_mem_set_account(account);
  if (rc) {
    char msg[512];
    snprintf(msg, sizeof msg, "%s", loom_last_error());
    loom__pg_fail_group(f->pg, rc, msg); /* the others wait for this buffer: let them go */
    return loom__fail(rc, "%s", msg);
  }
  if (zero && !loom__dry()) memset(loom_tensor_data(*t), 0, (size_t)len * loom_dtype_size(dt));
  return LOOM_OK;
}

/* With sh->mu not held: slot s holds t (gen), with a reference for each other rank to take. */
static void publish(loom__fsdp_share *sh, share_slot *s, loom_tensor *t, uint64_t gen) {
  for (int k = 1; k < sh->world; k++) loom_tensor_retain(t);
  atomic_store_explicit(&s->t, t, memory_order_relaxed);
  atomic_store_explicit(&s->untaken, sh->world - 1, memory_order_relaxed);
  pthread_mutex_lock(&sh->mu);
  s->holders = sh->world; /* the slot's last buffer is let go by all (nothing was stale) */
  s->stale = false;
  atomic_store_explicit(&s->gen, gen, memory_order_release);
  pthread_cond_broadcast(&sh->cv);
  pthread_mutex_unlock(&sh->mu);
}

/* A rank other than 0: its reference to what rank 0 published in s as gen. */
static int take(fsdp_unit *u, share_slot *s, uint64_t gen, loom_tensor **out) {
  int rc = wait_published(u, s, gen);
  if (rc) return rc;
  *out = atomic_load_explicit(&s->t, memory_order_relaxed); /* our reference, held for us */
  atomic_fetch_sub(&s->untaken, 1);
  return LOOM_OK;
}

int loom__fsdp_share_resident(fsdp_unit *u) {
  loom_fsdp *f = u->f;
  loom__fsdp_share *sh = f->share;
  u->resident = NULL;
  if (!sh || !u->shard || sh->no_resident) return LOOM_OK;
  share_slot *s = &sh->resident[u->index];
  loom_tensor *t = NULL;
  int rc = f->rank == 0 ? leader_alloc(f, LOOM_F32, (int64_t)u->padded, true, &t)
                        : take(u, s, 1, &t);
  if (rc) return rc;
  if (f->rank == 0) publish(sh, s, t, 1);
  u->resident = t;
  u->param_shard = (float *)loom_tensor_data(t) + (size_t)f->rank * u->shard;
  loom__mem_account_only(LOOM_POOL_COMPUTE, loom_mem_account(), share_bytes(u, LOOM_F32));
  return LOOM_OK;
}

void loom__fsdp_share_resident_free(fsdp_unit *u) {
  if (!u->resident) return;
  loom__mem_account_only(LOOM_POOL_COMPUTE, loom_mem_account(), -share_bytes(u, LOOM_F32));
  loom_tensor_free(u->resident);
  u->resident = NULL;
  u->param_shard = NULL;
}

int loom__fsdp_share_buffer(fsdp_unit *u, loom_dtype dt, loom_tensor **out) {
  loom_fsdp *f = u->f;
  loom__fsdp_share *sh = f->share;
  if (u->resident && dt == LOOM_F32) { /* the shards are the unit: nothing to make or count */
    loom_tensor_retain(u->resident);
    *out = u->resident;
    return LOOM_OK;
  }
  uint64_t gen = ++u->share_gen;
  share_slot *s = &sh->slots[2 * u->index + (gen & 1)];
  loom_tensor *t = NULL;
  int rc = LOOM_OK;
  if (f->rank == 0 && sh->limit) { /* no third gathered unit while a slower rank holds one */
    rc = wait_ready(u, s, gen, nothing_stale, STALE_WAIT_MAX_S,
                    "the other ranks to let go of a gathered unit");
    if (rc) { /* the others wait for this buffer: let them go */
      char msg[512];
      snprintf(msg, sizeof msg, "%s", loom_last_error());
      loom__pg_fail_group(f->pg, rc, msg);
      return loom__fail(rc, "%s", msg);
    }
  }
  rc = f->rank == 0 ? leader_alloc(f, dt, (int64_t)u->padded, false, &t) : take(u, s, gen, &t);
  if (rc) return rc;
  if (sh->limit) u->share_slot = s;
  if (f->rank == 0) {
    /* the slot's previous buffer (gather gen - 2) was taken by every rank (see the top) */
    loom_tensor *old = atomic_load_explicit(&s->t, memory_order_relaxed);
    for (int k = atomic_load(&s->untaken); old && k > 0; k--) loom_tensor_free(old);
    publish(sh, s, t, gen);
  }
  u->share_counted = (size_t)share_bytes(u, dt);
  loom__mem_account_only(LOOM_POOL_COMPUTE, loom_mem_account(), share_bytes(u, dt));
  *out = t;
  return LOOM_OK;
}

int loom__fsdp_share_fence(loom_fsdp *f) {
  bool resident = false;
  for (size_t u = 0; u < f->nunits; u++) resident = resident || f->units[u].resident;
  return resident && !loom__dry() ? loom_pg_barrier(f->pg, NULL) : LOOM_OK;
}
