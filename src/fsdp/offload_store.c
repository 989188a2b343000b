/* offload_store.c: the offload store of offload_store.h. Owns the slot table, the host tier's
 * buffers, the synchronous put/get, the job queue with its pool of worker threads, and the
 * statistics; the disk tier's file (space, pread/pwrite or O_DIRECT, CRC-32C) is
 * offload_disk.c's, the layout both share offload_store_int.h.
 *
 * Locking: `mu` guards the slot table, the queue, the job records' states, the statistics and
 * the free bounce blocks; nobody holds it while bytes move, so the caller can submit and wait
 * while the workers copy. `space_mu` guards the disk file's used length, the one thing a
 * synchronous first put and the workers may change at once (each giving a different slot its
 * range). Bytes of a slot are only ever moved by one party at a time: a worker takes a job only
 * when no other is moving its slot, in submission order, and a synchronous call on a slot first
 * waits until no job of that slot is queued or running. */
#include "fsdp/offload_store_int.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static void clear_queue(loom__ostore *s, bool all);

static const char *tier_name(loom__otier t) { return t == LOOM__OTIER_DISK ? "disk" : "host"; }

/* ---- the slot table (under mu) -------------------------------------------------------- */

/* The slot's entry, growing the table if `grow` (NULL if out of range and not growing, or out
 * of memory: LOOM_ENOMEM set in *rc). */
static oslot *slot_at(loom__ostore *s, size_t slot, bool grow, int *rc) {
  *rc = LOOM_OK;
  if (slot < s->nslots) return &s->slots[slot];
  if (!grow) return NULL;
  if (slot >= SIZE_MAX / sizeof(oslot) / 4) {
    *rc = loom__fail(LOOM_EINVAL, "loom__ostore: slot number %zu is out of range", slot);
    return NULL;
  }
  size_t cap = s->nslots ? s->nslots : 16;
  while (cap <= slot) cap *= 2;
  oslot *t = loom__calloc(LOOM_POOL_META, cap, sizeof *t);
  if (!t) {
    *rc = loom__fail(LOOM_ENOMEM, "loom__ostore: out of memory for a table of %zu slots", cap);
    return NULL;
  }
  if (s->nslots) memcpy(t, s->slots, s->nslots * sizeof *t);
  loom__free(s->slots);
  s->slots = t;
  s->nslots = cap;
  return &s->slots[slot];
}

/* A slot whose first put failed (or was dropped) and that nothing else is pending on goes back
 * to having no size at all. */
static void slot_settle(oslot *o) {
  if (!o->space && !o->data && o->pending == 0) {
    o->declared = false;
    o->bytes = 0;
  }
}

/* Wait (mu held) until no job of `slot` is queued or running; the time counts as exposed. */
static void slot_wait_idle(loom__ostore *s, size_t slot) {
  if (slot >= s->nslots || s->slots[slot].pending == 0) return;
  double t0 = loom__now();
  while (slot < s->nslots && s->slots[slot].pending) pthread_cond_wait(&s->cv_done, &s->mu);
  s->st.wait_s += loom__now() - t0;
}

/* ---- put and get, shared by the synchronous calls and the worker ------------------------ */

static int put_impl(loom__ostore *s, size_t slot, const void *src, size_t bytes,
                    const char *who, bool sync) {
  int rc = LOOM_OK;
  pthread_mutex_lock(&s->mu);
  if (sync) slot_wait_idle(s, slot);
  oslot *o = slot_at(s, slot, sync, &rc); /* a worker's slot was declared at submit */
  if (!o && !rc) rc = loom__fail(LOOM_EINVAL, "%s: slot %zu was never declared", who, slot);
  if (!rc && o->declared && o->bytes != bytes)
    rc = loom__fail(LOOM_EINVAL, "%s: slot %zu holds %zu bytes, not %zu", who, slot, o->bytes,
                    bytes);
  if (rc) {
    pthread_mutex_unlock(&s->mu);
    return rc;
  }
  o->declared = true;
  o->bytes = bytes;
  bool had_space = o->space;
  void *buf = o->buf;
  size_t off = o->off;
  pthread_mutex_unlock(&s->mu);

  double t0 = loom__now();
  uint32_t crc = 0;
  if (!had_space) { /* the slot's first put: give it its space */
    if (s->tier == LOOM__OTIER_HOST) {
      buf = bytes ? loom__malloc(LOOM_POOL_HOST, bytes) : NULL;
      if (bytes && !buf)
        rc = loom__fail(LOOM_ENOMEM, "%s: out of memory for slot %zu's %zu-byte host buffer", who,
                        slot, bytes);
    } else {
      rc = loom__odisk_reserve(s, who, slot, bytes, &off);
    }
  }
  bool reserved = !had_space && !rc;
  if (!rc) {
    if (s->tier == LOOM__OTIER_HOST) {
      if (bytes && !s->dry) memcpy(buf, src, bytes);
    } else {
      rc = loom__odisk_write(s, who, slot, off, src, bytes, &crc);
    }
  }
  if (rc && reserved) { /* a failed first put leaves the slot as it was: no space */
    if (s->tier == LOOM__OTIER_HOST) loom__free(buf);
    else loom__odisk_unreserve(s, off, bytes);
  }
  double dt = loom__now() - t0;

  pthread_mutex_lock(&s->mu);
  o = &s->slots[slot]; /* the table may have moved */
  if (!rc) {
    if (!had_space) {
      o->space = true;
      o->buf = buf;
      o->off = off;
      s->held += bytes;
    }
    o->data = true;
    o->crc = crc;
    s->st.bytes_written += bytes;
    s->st.puts++;
  } else if (had_space) {
    o->data = false; /* its old bytes may be partly overwritten */
  }
  s->st.transfer_s += dt;
  slot_settle(o);
  pthread_mutex_unlock(&s->mu);
  return rc;
}

static int get_impl(loom__ostore *s, size_t slot, void *dst, size_t bytes, const char *who,
                    bool sync) {
  int rc = LOOM_OK;
  pthread_mutex_lock(&s->mu);
  if (sync) slot_wait_idle(s, slot);
  oslot *o = slot < s->nslots ? &s->slots[slot] : NULL;
  if (!o || !o->data)
    rc = loom__fail(LOOM_EINVAL, "%s: slot %zu holds no data%s", who, slot,
                    o && o->space ? " (its last put failed)" : "");
  else if (o->bytes != bytes)
    rc = loom__fail(LOOM_EINVAL, "%s: slot %zu holds %zu bytes, not %zu", who, slot, o->bytes,
                    bytes);
  void *buf = o ? o->buf : NULL;
  size_t off = o ? o->off : 0;
  uint32_t crc = o ? o->crc : 0;
  pthread_mutex_unlock(&s->mu);
  if (rc) return rc;

  double t0 = loom__now();
  if (s->tier == LOOM__OTIER_HOST) {
    if (bytes && !s->dry) memcpy(dst, buf, bytes);
  } else {
    rc = loom__odisk_read(s, who, slot, off, dst, bytes, crc);
  }
  double dt = loom__now() - t0;

  pthread_mutex_lock(&s->mu);
  if (!rc) {
    s->st.bytes_read += bytes;
    s->st.gets++;
  }
  s->st.transfer_s += dt;
  pthread_mutex_unlock(&s->mu);
  return rc;
}

/* ---- the public calls ------------------------------------------------------------------ */

int loom__ostore_create(loom__otier tier, const char *dir, int rank, loom__ostore **out) {
  const char *who = "loom__ostore_create";
  if (!out) return loom__fail(LOOM_EINVAL, "%s: out is NULL", who);
  *out = NULL;
  if (tier != LOOM__OTIER_HOST && tier != LOOM__OTIER_DISK)
    return loom__fail(LOOM_EINVAL, "%s: tier %d is neither host (0) nor disk (1)", who, (int)tier);
  if (tier == LOOM__OTIER_DISK && (!dir || !dir[0]))
    return loom__fail(LOOM_EINVAL, "%s: the disk tier needs a folder", who);
  loom__ostore *s = loom__calloc(LOOM_POOL_META, 1, sizeof *s);
  if (!s) return loom__fail(LOOM_ENOMEM, "%s: out of memory for the %s store", who, tier_name(tier));
  s->tier = tier;
  s->rank = rank;
  s->account = loom_mem_account();
  s->fd = -1;
  s->dry = loom__dry();
  s->max_workers = tier == LOOM__OTIER_DISK ? LOOM__OSTORE_DISK_WORKERS : 1;
  int made = 0; /* how many of the four synchronisation objects exist */
  if (pthread_mutex_init(&s->mu, NULL) == 0 && ++made && pthread_mutex_init(&s->space_mu, NULL) == 0 &&
      ++made && pthread_cond_init(&s->cv_work, NULL) == 0 && ++made &&
      pthread_cond_init(&s->cv_done, NULL) == 0)
    ++made;
  int rc = made == 4 ? LOOM_OK
                     : loom__fail(LOOM_EBACKEND, "%s: cannot make the store's locks", who);
  if (!rc && tier == LOOM__OTIER_DISK) rc = s->dry ? loom__odisk_check(dir) : loom__odisk_open(s, dir);
  if (!rc && tier == LOOM__OTIER_DISK && !s->dry && loom__odisk_direct_wanted()) rc = loom__odisk_direct_try(s);
  if (rc) {
    if (s->fd >= 0) close(s->fd);
    if (s->path) unlink(s->path);
    loom__free(s->path);
    if (made > 3) pthread_cond_destroy(&s->cv_done);
    if (made > 2) pthread_cond_destroy(&s->cv_work);
    if (made > 1) pthread_mutex_destroy(&s->space_mu);
    if (made > 0) pthread_mutex_destroy(&s->mu);
    loom__free(s);
    return rc;
  }
  *out = s;
  return LOOM_OK;
}

void loom__ostore_free(loom__ostore *s) {
  if (!s) return;
  clear_queue(s, true); /* what has not started never will */
  pthread_mutex_lock(&s->mu);
  s->stop = true;
  pthread_cond_broadcast(&s->cv_work);
  pthread_mutex_unlock(&s->mu);
  for (int i = 0; i < s->nthreads; i++) pthread_join(s->threads[i], NULL); /* after the running jobs */
  for (ojob *j = s->live_head, *n; j; j = n) {
    n = j->next;
    loom__free(j);
  }
  for (ojob *j = s->free_jobs, *n; j; j = n) {
    n = j->next;
    loom__free(j);
  }
  for (size_t i = 0; i < s->nslots; i++) {
    oslot *o = &s->slots[i];
    if (!o->space) continue;
    if (s->tier == LOOM__OTIER_HOST) loom__free(o->buf);
    else loom__mem_account_to(LOOM_POOL_FILE, s->account, -(ptrdiff_t)o->bytes);
  }
  for (void *raw = s->bounce, *next; raw; raw = next) {
    next = *(void **)raw;
    loom__free(raw);
  }
  if (s->fd >= 0) close(s->fd);
  if (s->path) unlink(s->path);
  loom__free(s->path);
  loom__free(s->slots);
  pthread_cond_destroy(&s->cv_done);
  pthread_cond_destroy(&s->cv_work);
  pthread_mutex_destroy(&s->space_mu);
  pthread_mutex_destroy(&s->mu);
  loom__free(s);
}

int loom__ostore_put(loom__ostore *s, size_t slot, const void *src, size_t bytes) {
  if (!s) return loom__fail(LOOM_EINVAL, "loom__ostore_put: store is NULL");
  if (!src && bytes) return loom__fail(LOOM_EINVAL, "loom__ostore_put: src is NULL");
  return put_impl(s, slot, src, bytes, "loom__ostore_put", true);
}

int loom__ostore_get(loom__ostore *s, size_t slot, void *dst, size_t bytes) {
  if (!s) return loom__fail(LOOM_EINVAL, "loom__ostore_get: store is NULL");
  if (!dst && bytes) return loom__fail(LOOM_EINVAL, "loom__ostore_get: dst is NULL");
  return get_impl(s, slot, dst, bytes, "loom__ostore_get", true);
}

/* The accessors lock a const store's mutex: the lock is not part of its value. */
static pthread_mutex_t *mu_of(const loom__ostore *s) { return (pthread_mutex_t *)&s->mu; }

void *loom__ostore_host_buffer(loom__ostore *s, size_t slot, size_t bytes) {
  if (!s || s->tier != LOOM__OTIER_HOST) return NULL;
  pthread_mutex_lock(&s->mu);
  slot_wait_idle(s, slot);
  oslot *o = slot < s->nslots ? &s->slots[slot] : NULL;
  void *p = o && o->data && o->bytes == bytes ? o->buf : NULL;
  pthread_mutex_unlock(&s->mu);
  return p;
}

bool loom__ostore_has(const loom__ostore *s, size_t slot) {
  if (!s) return false;
  pthread_mutex_lock(mu_of(s));
  bool has = slot < s->nslots && s->slots[slot].data;
  pthread_mutex_unlock(mu_of(s));
  return has;
}

size_t loom__ostore_bytes(const loom__ostore *s) {
  if (!s) return 0;
  pthread_mutex_lock(mu_of(s));
  size_t held = s->held;
  pthread_mutex_unlock(mu_of(s));
  return held;
}

const char *loom__ostore_path(const loom__ostore *s) { return s ? s->path : NULL; }

bool loom__ostore_direct(const loom__ostore *s) { return s && s->direct; }

int loom__ostore_set_workers(loom__ostore *s, int n) {
  if (!s) return loom__fail(LOOM_EINVAL, "loom__ostore_set_workers: store is NULL");
  if (n < 1 || n > LOOM__OSTORE_MAX_WORKERS)
    return loom__fail(LOOM_EINVAL, "loom__ostore_set_workers: %d workers: must be 1..%d", n,
                      LOOM__OSTORE_MAX_WORKERS);
  pthread_mutex_lock(&s->mu);
  bool started = s->nthreads > 0;
  if (!started) s->max_workers = n;
  pthread_mutex_unlock(&s->mu);
  return started ? loom__fail(LOOM_EMISUSE, "loom__ostore_set_workers: the workers have started "
                              "(a job was submitted)")
                 : LOOM_OK;
}

loom__otier loom__ostore_tier(const loom__ostore *s) { return s ? s->tier : LOOM__OTIER_HOST; }

void loom__ostore_get_stats(const loom__ostore *s, loom__ostore_stats *out) {
  if (!out) return;
  memset(out, 0, sizeof *out);
  if (!s) return;
  pthread_mutex_lock(mu_of(s));
  *out = s->st;
  pthread_mutex_unlock(mu_of(s));
}

/* ---- the worker ------------------------------------------------------------------------ */

/* The first queued job whose slot no worker is moving now (under mu), taken off the queue;
 * NULL if none. Jobs of one slot thus run one at a time in submission order, and with one
 * worker every job does. */
static ojob *take_job(loom__ostore *s) {
  for (ojob *j = s->q_head, *prev = NULL; j; prev = j, j = j->qnext) {
    if (s->slots[j->slot].running) continue;
    if (prev) prev->qnext = j->qnext;
    else s->q_head = j->qnext;
    if (s->q_tail == j) s->q_tail = prev;
    j->qnext = NULL;
    return j;
  }
  return NULL;
}

static void *worker_main(void *arg) {
  loom__ostore *s = arg;
  loom_mem_set_account(s->account); /* host buffers it makes are the creator's (the rank's) */
  pthread_mutex_lock(&s->mu);
  for (;;) {
    ojob *j;
    while (!(j = take_job(s)) && !s->stop) {
      s->idle++;
      pthread_cond_wait(&s->cv_work, &s->mu);
      s->idle--;
    }
    if (!j) break; /* stopping, and free dropped what was queued */
    j->state = JOB_RUNNING;
    s->slots[j->slot].running = true;
    pthread_mutex_unlock(&s->mu);

    char who[96];
    snprintf(who, sizeof who, "loom__ostore worker (job %llu, %s)", (unsigned long long)j->id,
             j->kind == JOB_PUT ? "put" : "get");
    int rc = j->kind == JOB_PUT ? put_impl(s, j->slot, j->buf, j->bytes, who, false)
                                : get_impl(s, j->slot, j->buf, j->bytes, who, false);
    if (rc) snprintf(j->msg, sizeof j->msg, "%s", loom_last_error());
    else if (j->release) loom__mem_release(j->buf, j->bytes);

    pthread_mutex_lock(&s->mu);
    j->status = rc;
    j->state = JOB_DONE;
    oslot *o = &s->slots[j->slot];
    o->running = false;
    o->pending--;
    slot_settle(o);
    pthread_cond_broadcast(&s->cv_done);
    if (s->q_head && s->idle) pthread_cond_broadcast(&s->cv_work); /* its slot's next job */
  }
  pthread_mutex_unlock(&s->mu);
  return NULL;
}

static int submit(loom__ostore *s, int kind, size_t slot, void *buf, size_t bytes,
                  loom__ojob *job, unsigned flags) {
  const char *who = kind == JOB_PUT ? "loom__ostore_submit_put" : "loom__ostore_submit_get";
  if (job) *job = 0;
  if (!s || !job) return loom__fail(LOOM_EINVAL, "%s: %s is NULL", who, s ? "job" : "store");
  if (!buf && bytes)
    return loom__fail(LOOM_EINVAL, "%s: %s is NULL", who, kind == JOB_PUT ? "src" : "dst");
  int rc = LOOM_OK;
  pthread_mutex_lock(&s->mu);
  oslot *o = slot_at(s, slot, kind == JOB_PUT, &rc);
  ojob *j = NULL;
  if (rc) goto done;
  if (kind == JOB_GET && (!o || !o->declared)) {
    rc = loom__fail(LOOM_EINVAL, "%s: slot %zu was never put (nor has a put queued)", who, slot);
    goto done;
  }
  if (o->declared && o->bytes != bytes) {
    rc = loom__fail(LOOM_EINVAL, "%s: slot %zu holds %zu bytes, not %zu", who, slot, o->bytes,
                    bytes);
    goto done;
  }
  j = s->free_jobs;
  if (j) s->free_jobs = j->next;
  else j = loom__malloc(LOOM_POOL_META, sizeof *j);
  if (!j) {
    rc = loom__fail(LOOM_ENOMEM, "%s: out of memory for a job record", who);
    goto done;
  }
  if (s->idle == 0 && s->nthreads < s->max_workers) { /* every worker busy: one more */
    int e = pthread_create(&s->threads[s->nthreads], NULL, worker_main, s);
    if (e && s->nthreads == 0) {
      j->next = s->free_jobs;
      s->free_jobs = j;
      rc = loom__fail(LOOM_EBACKEND, "%s: cannot start the offload worker thread: %s", who,
                      strerror(e));
      goto done;
    }
    if (!e) s->nthreads++; /* else the workers there are do the job */
  }
  o->declared = true; /* a put's size holds from now on, for the jobs and calls after it */
  o->bytes = bytes;
  bool first = (flags & LOOM__OJOB_FIRST) && o->pending == 0; /* its slot's order holds */
  o->pending++;
  *j = (ojob){.id = ++s->last_id, .kind = kind, .state = JOB_QUEUED, .slot = slot,
              .bytes = bytes, .buf = buf, .prev = s->live_tail,
              .release = (flags & LOOM__OJOB_RELEASE) != 0, .first = first,
              .keep = (flags & LOOM__OJOB_KEEP) != 0};
  if (s->live_tail) s->live_tail->next = j;
  else s->live_head = j;
  s->live_tail = j;
  ojob *after = NULL; /* a FIRST job: after the last FIRST one queued (NULL: at the head) */
  for (ojob *q = s->q_head; first && q && q->first; q = q->qnext) after = q;
  if (!first || (after ? after == s->q_tail : !s->q_head)) { /* at the end */
    if (s->q_tail) s->q_tail->qnext = j;
    else s->q_head = j;
    s->q_tail = j;
  } else if (after) {
    j->qnext = after->qnext;
    after->qnext = j;
  } else {
    j->qnext = s->q_head;
    s->q_head = j;
  }
  s->st.jobs++;
  *job = j->id;
  pthread_cond_signal(&s->cv_work);
done:
  pthread_mutex_unlock(&s->mu);
  return rc;
}

int loom__ostore_submit_get(loom__ostore *s, size_t slot, void *dst, size_t bytes,
                            loom__ojob *job) {
  return submit(s, JOB_GET, slot, dst, bytes, job, 0);
}

int loom__ostore_submit_get_ex(loom__ostore *s, size_t slot, void *dst, size_t bytes,
                               unsigned flags, loom__ojob *job) {
  return submit(s, JOB_GET, slot, dst, bytes, job, flags & LOOM__OJOB_KEEP);
}

int loom__ostore_submit_put(loom__ostore *s, size_t slot, const void *src, size_t bytes,
                            loom__ojob *job) {
  return submit(s, JOB_PUT, slot, (void *)src, bytes, job, 0); /* never written through */
}

int loom__ostore_submit_put_ex(loom__ostore *s, size_t slot, void *src, size_t bytes,
                               unsigned flags, loom__ojob *job) {
  return submit(s, JOB_PUT, slot, src, bytes, job, flags);
}

int loom__ostore_wait(loom__ostore *s, loom__ojob job, double *waited) {
  if (waited) *waited = 0;
  if (!s) return loom__fail(LOOM_EINVAL, "loom__ostore_wait: store is NULL");
  pthread_mutex_lock(&s->mu);
  ojob *j = s->live_head;
  while (j && j->id != job) j = j->next;
  if (!j) { /* 0, never submitted, or already waited for */
    pthread_mutex_unlock(&s->mu);
    return LOOM_OK;
  }
  if (j->state != JOB_DONE) {
    double t0 = loom__now();
    while (j->state != JOB_DONE) pthread_cond_wait(&s->cv_done, &s->mu);
    double dt = loom__now() - t0;
    s->st.wait_s += dt;
    s->st.waits_blocked++;
    if (waited) *waited = dt;
  }
  int rc = j->status;
  if (rc) loom__fail(rc, "%s", j->msg); /* the worker's message, now this thread's */
  if (j->prev) j->prev->next = j->next;
  else s->live_head = j->next;
  if (j->next) j->next->prev = j->prev;
  else s->live_tail = j->prev;
  j->next = s->free_jobs;
  s->free_jobs = j;
  pthread_mutex_unlock(&s->mu);
  return rc;
}

size_t loom__ostore_queued(const loom__ostore *s) {
  if (!s) return 0;
  pthread_mutex_lock(mu_of(s));
  size_t n = 0;
  for (const ojob *j = s->q_head; j; j = j->qnext) n++;
  pthread_mutex_unlock(mu_of(s));
  return n;
}

/* Drop the queued jobs (all of them, or all but the LOOM__OJOB_KEEP ones). */
static void clear_queue(loom__ostore *s, bool all) {
  pthread_mutex_lock(&s->mu);
  ojob *kept = NULL, *kept_tail = NULL;
  for (ojob *j = s->q_head, *next; j; j = next) {
    next = j->qnext;
    j->qnext = NULL;
    if (j->keep && !all) { /* stays queued, in order */
      if (kept_tail) kept_tail->qnext = j;
      else kept = j;
      kept_tail = j;
      continue;
    }
    j->state = JOB_DONE;
    j->status = LOOM_EABORTED;
    snprintf(j->msg, sizeof j->msg, "loom__ostore_clear: job %llu (%s of slot %zu) was dropped "
             "before it started", (unsigned long long)j->id, j->kind == JOB_PUT ? "put" : "get",
             j->slot);
    oslot *o = &s->slots[j->slot];
    o->pending--;
    slot_settle(o);
    s->st.jobs_cleared++;
  }
  s->q_head = kept;
  s->q_tail = kept_tail;
  pthread_cond_broadcast(&s->cv_done);
  pthread_mutex_unlock(&s->mu);
}

void loom__ostore_clear(loom__ostore *s) {
  if (s) clear_queue(s, false);
}
