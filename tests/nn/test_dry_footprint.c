/* test_dry_footprint.c: loom_mem_dry_footprint_peak (loom/alloc.h), the resident memory a real
 * run would owe to loom's blocks: a module's gradient arena (zeros nothing writes before the
 * step) counts only from loom_mem_dry_mark_written on, and the accounts (ranks) are followed
 * each on its own, so the footprint does not depend on how their threads interleave. */
#include "lt.h"

#include <loom/loom.h>
#include <pthread.h>

/* The bytes of every parameter of m. */
static size_t param_bytes(loom_module *m) { return loom_module_numel(m) * sizeof(float); }

/* Without an address sanitizer (which maps nothing itself and caches nothing): a fresh
 * mapping's untouched zeros are not resident. */
static bool maps_large_blocks(void) {
#if defined(__SANITIZE_ADDRESS__)
  return false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
  return false;
#else
  return true;
#endif
#else
  return true;
#endif
}

LT_TEST(dry_footprint_counts_gradients_from_the_step_on) {
  if (!maps_large_blocks()) {
    lt_skip("an address sanitizer build maps no block itself: every block is resident");
    return;
  }
  loom_mem_set_dry_run(true);
  int64_t sizes[4] = {1024, 1024, 1024, 16};
  loom_module *m = NULL;
  LT_OK(loom_nn_mlp_create(sizes, 4, LOOM_ACT_RELU, LOOM_F32, 1, &m));
  size_t p = param_bytes(m), built = loom_mem_dry_footprint_peak();
  /* the values (each layer's arena, then the containers' packed copies, the earlier ones
   * kept by the cache: three copies here), none of the gradient arenas (as many, fresh zeros
   * nobody wrote: counting them would make it six) */
  LT_TRUE(built >= p);
  LT_TRUE(built < 3 * p + ((size_t)1 << 20));
  loom_mem_dry_mark_written(); /* the step writes the root's gradients */
  size_t stepped = loom_mem_dry_footprint_peak();
  LT_TRUE(stepped + (64 << 10) >= built + p); /* small blocks of the build may be gone */
  LT_TRUE(stepped < built + p + ((size_t)1 << 20));
  loom_module_free(m);
  /* a gradient arena freed before the mark never counts, even if the cache keeps it */
  loom_mem_set_dry_run(true);
  LT_OK(loom_nn_mlp_create(sizes, 4, LOOM_ACT_RELU, LOOM_F32, 1, &m));
  built = loom_mem_dry_footprint_peak();
  loom_module_free(m);
  loom_mem_dry_mark_written();
  LT_EQ(loom_mem_dry_footprint_peak(), built);
  loom_mem_set_dry_run(false);
}

typedef struct rank_arg {
  int account;
  pthread_barrier_t *go;
  int rc;
} rank_arg;

/* A rank's dry step: 8 MiB made and freed, then made again (the cache hands it back). */
static void *rank_main(void *p) {
  rank_arg *a = p;
  a->rc = loom_mem_set_account(a->account);
  pthread_barrier_wait(a->go);
  for (int k = 0; k < 2 && !a->rc; k++) {
    int64_t n = 2 << 20;
    loom_tensor *t = NULL;
    a->rc = loom_tensor_empty(LOOM_F32, 1, &n, &t);
    loom_tensor_free(t);
  }
  return NULL;
}

/* The footprint of `ranks` threads, each under its own account, running rank_main at once,
 * or one after the other (serial). */
static size_t ranks_footprint(int ranks, bool serial) {
  loom_mem_set_dry_run(true);
  pthread_barrier_t go;
  pthread_barrier_init(&go, NULL, serial ? 1 : (unsigned)ranks);
  pthread_t th[4];
  rank_arg a[4];
  for (int r = 0; r < ranks; r++) {
    a[r] = (rank_arg){r + 1, &go, 0};
    pthread_create(&th[r], NULL, rank_main, &a[r]);
    if (serial) pthread_join(th[r], NULL);
  }
  for (int r = 0; r < ranks && !serial; r++) pthread_join(th[r], NULL);
  for (int r = 0; r < ranks; r++) LT_OK(a[r].rc);
  pthread_barrier_destroy(&go);
  size_t v = loom_mem_dry_footprint_peak();
  loom_mem_set_dry_run(false);
  return v;
}

LT_TEST(dry_footprint_follows_each_rank_alone) {
  size_t one = ranks_footprint(1, false);
  LT_TRUE(one >= ((size_t)8 << 20) && one < ((size_t)9 << 20));
  /* ranks in lockstep hold their blocks at once: the sum of their peaks, however their
   * threads ran (serially, a shared cache would hand rank 2 rank 1's block) */
  LT_EQ(ranks_footprint(3, false), 3 * one);
  LT_EQ(ranks_footprint(3, true), 3 * one);
}
