/* fsdp_async.c: the offloaded optimizer step behind the next forward (the disk tier,
 * cfg.offload.async_step). loom_fsdp_optim_step validates and decides everything on the rank's
 * thread (fsdp_stream.c: the checks, the state that was never offloaded put to the tier, the
 * transfers in flight settled, loom_optim_step_begin: the skip, grad_scale, learning rate and
 * step count are fixed then and copied out of the optimizer, loom__optim_snap), switches every
 * unit's slot sets at once (the tier's current parameters and state are the ones the pass is
 * writing), and hands the chunked pass over the units to a thread of its own here, which steps
 * them in unit order (the forward's order: pre-order) and publishes each once its bytes are on
 * the tier. The next forward's gather of unit u waits only for unit u (loom__fsdp_step_ready,
 * on the rank's thread as the gather is issued, so that a failed pass fails the gather before
 * its collective starts: the group stays usable);
 * everything else that touches parameters, gradients or optimizer state waits for the whole
 * pass first (loom__fsdp_step_join), and the first call that does gets the pass's failure.
 *
 * A failed pass changes nothing: it wrote only the other slot set, so the join switches every
 * unit back (the weights and state are the ones before the step), marks the low-precision copy
 * stale (it has one slot set) and sets the optimizer's step count back (the optimizer is held
 * until then: its user may free it right after the call); a gather that had read a stepped
 * unit belongs to a forward that fails with the same error. */
#include "fsdp/fsdp_int.h"
#include "fsdp/offload_store.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct loom__fsdp_astep {
  loom_fsdp *f;
  pthread_t thread;
  bool threaded;        /* the thread was started (else the pass ran on the rank's thread) */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  size_t done;          /* units [0, done) are stepped: their gathers may read them */
  bool ended;           /* the pass is over (every unit stepped, or it failed) */
  loom__fsdp_err err;   /* its failure, with its message (rc 0: none) */
  loom__fsdp_detached d;
  uint8_t *flipped;     /* per unit: the kinds whose slot set the call switched */
  loom_optim *opt;      /* held (loom__optim_hold) only to set its step count back if the pass
                           fails: its user may free it meanwhile */
  int64_t step_before;
  int account;          /* the rank's memory account: the pass's chunk ring is the rank's */
};

bool loom__fsdp_async_wanted(const loom_fsdp *f, size_t per) {
  return f->async_step && f->store && loom__ostore_tier(f->store) == LOOM__OTIER_DISK &&
         (per == 0 || loom__fsdp_offloading(f, OFF_STATE));
}

static void published(void *ctx, size_t units) {
  loom__fsdp_astep *a = ctx;
  pthread_mutex_lock(&a->mu);
  if (units > a->done) a->done = units;
  pthread_cond_broadcast(&a->cv);
  pthread_mutex_unlock(&a->mu);
}

static void *pass_main(void *arg) {
  loom__fsdp_astep *a = arg;
  loom_mem_set_account(a->account);
  int rc = loom__fsdp_pass_run(a->f, &a->d);
  pthread_mutex_lock(&a->mu);
  loom__fsdp_err_save(&a->err, rc);
  a->ended = true;
  pthread_cond_broadcast(&a->cv);
  pthread_mutex_unlock(&a->mu);
  return NULL;
}

/* A dry run's pass: its ring goes now (the forward reached the last unit, or the pass is
 * waited for), as a real pass's goes when it has stepped the last unit. */
static void ring_go(loom__fsdp_astep *a) {
  for (size_t i = 0; i < a->d.nring; i++) loom__free(a->d.ring[i]);
  a->d.nring = 0;
}

static void astep_free(loom__fsdp_astep *a) {
  ring_go(a);
  loom__optim_snap_free(a->d.snap);
  loom__free(a->flipped);
  pthread_cond_destroy(&a->cv);
  pthread_mutex_destroy(&a->mu);
  loom__free(a);
}

int loom__fsdp_step_launch(loom_fsdp *f, loom_optim *opt, float grad_scale) {
  static const char *who = "loom_fsdp_optim_step";
  int rc = loom__fsdp_pass_settle(f, opt);
  if (rc) return rc;
  loom__fsdp_astep *a = loom__calloc(LOOM_POOL_META, 1, sizeof *a);
  if (!a) return loom__fail(LOOM_ENOMEM, "%s: out of memory", who);
  if (pthread_mutex_init(&a->mu, NULL)) {
    loom__free(a);
    return loom__fail(LOOM_EBACKEND, "%s: cannot make the step thread's lock", who);
  }
  if (pthread_cond_init(&a->cv, NULL)) {
    pthread_mutex_destroy(&a->mu);
    loom__free(a);
    return loom__fail(LOOM_EBACKEND, "%s: cannot make the step thread's condition", who);
  }
  a->f = f;
  a->opt = opt;
  if (!(a->flipped = loom__calloc(LOOM_POOL_META, f->nunits ? f->nunits : 1, 1))) {
    astep_free(a);
    return loom__fail(LOOM_ENOMEM, "%s: out of memory", who);
  }
  a->account = loom_mem_account();
  a->step_before = loom_optim_step_count(opt);
  a->d = (loom__fsdp_detached){.per = loom_optim_state_per_segment(opt), .published = published,
                               .ctx = a};
  /* the step's scalars are fixed now: a learning rate set after this call is the next step's */
  if ((rc = loom_optim_step_begin(opt, grad_scale))) {
    astep_free(a);
    return rc;
  }
  rc = loom__optim_snap_take(opt, &a->d.snap);
  int rc2 = loom_optim_step_end(opt, rc == LOOM_OK); /* counted; set back if the pass fails */
  if (rc || rc2) {
    astep_free(a);
    return rc ? rc : rc2;
  }
  loom__fsdp_pass_switch(f, opt, a->flipped);
  loom__optim_hold(opt);
  f->astep = a;
  if (loom__dry()) { /* loom plan: the pass within the call (no bytes move), its ring kept */
    a->d.keep_ring = true;
    pass_main(a);
    return a->err.rc ? loom__fsdp_step_join(f) : LOOM_OK;
  }
  a->threaded = pthread_create(&a->thread, NULL, pass_main, a) == 0;
  if (a->threaded) return LOOM_OK;
  pass_main(a); /* no thread to be had: the pass runs here, as the synchronous step does */
  return loom__fsdp_step_join(f);
}

int loom__fsdp_step_ready(fsdp_unit *u, bool exposed) {
  loom_fsdp *f = u->f;
  loom__fsdp_astep *a = f->astep;
  if (!a) return LOOM_OK;
  if (!a->threaded && u->index + 1 == f->nunits) ring_go(a); /* a dry run's (see ring_go) */
  double t0 = loom__now();
  pthread_mutex_lock(&a->mu);
  while (!a->ended && a->done <= u->index) pthread_cond_wait(&a->cv, &a->mu);
  bool ok = a->done > u->index;
  loom__fsdp_err e = a->err;
  pthread_mutex_unlock(&a->mu);
  if (exposed) f->off_wait_s += loom__now() - t0;
  if (ok) return LOOM_OK;
  return e.rc ? loom__fsdp_err_restore(&e)
              : loom__fail(LOOM_EBACKEND, "fsdp: the optimizer's pass ended without stepping "
                           "unit '%s'", loom__fsdp_unit_shown(u->name));
}

bool loom__fsdp_step_done(const fsdp_unit *u) {
  loom__fsdp_astep *a = u->f->astep;
  if (!a) return true;
  pthread_mutex_lock(&a->mu);
  bool done = a->ended || a->done > u->index;
  pthread_mutex_unlock(&a->mu);
  return done;
}

int loom__fsdp_step_join(loom_fsdp *f) {
  loom__fsdp_astep *a = f ? f->astep : NULL;
  if (!a) return LOOM_OK;
  double t0 = loom__now();
  if (a->threaded) pthread_join(a->thread, NULL);
  f->off_wait_s += loom__now() - t0;
  loom__fsdp_err e = a->err;
  f->astep = NULL;
  if (e.rc) { /* nothing of the step stays: the slot sets as they were, the step not counted */
    loom__fsdp_pass_unswitch(f, a->flipped);
    (void)loom_optim_set_step_count(a->opt, a->step_before);
  }
  loom__optim_let_go(a->opt);
  astep_free(a);
  return loom__fsdp_err_restore(&e);
}

int loom__fsdp_step_failed(loom_fsdp *f, int rc) {
  if (!rc || !f->astep) return rc;
  loom__fsdp_err e;
  loom__fsdp_err_save(&e, rc);
  int rc2 = loom__fsdp_step_join(f);
  return rc2 ? rc2 : loom__fsdp_err_restore(&e);
}

int loom_fsdp_optim_wait(loom_fsdp *f) {
  if (!f) return loom__fail(LOOM_EINVAL, "loom_fsdp_optim_wait: fsdp is NULL");
  return loom__fsdp_step_join(f);
}
