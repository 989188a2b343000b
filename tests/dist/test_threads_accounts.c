/* test_threads_accounts.c: per-rank memory accounts of the threads backend: rank r's thread
 * (and its group's progress thread) allocate on account r + 1, so while three ranks hold
 * different amounts of compute tensors each account shows its own rank's bytes and no other's,
 * and every account is back where it was once the ranks have freed them. */
#include "dist_test.h"
#include "dist/dist_int.h"

#define MIB ((size_t)1 << 20)
enum { NRANKS = 3 };

typedef struct seen {
  int account[NRANKS];              /* loom_mem_account() on each rank thread */
  int group_account[NRANKS];        /* the account its group's progress thread takes */
  size_t current[NRANKS][NRANKS];   /* [r][k]: account k + 1's current compute bytes, seen by r */
} seen;

/* Rank r holds r + 1 compute tensors of 1 MiB while every rank reads the accounts. */
static int hold_and_read(loom_pg *pg, void *arg) {
  seen *s = arg;
  int r = loom_pg_rank(pg);
  s->account[r] = loom_mem_account();
  s->group_account[r] = pg->mem_account;
  loom_tensor *t[NRANKS] = {NULL};
  int64_t shape[] = {(int64_t)(MIB / sizeof(float))};
  int rc = LOOM_OK;
  for (int i = 0; i <= r && rc == LOOM_OK; i++) rc = loom_tensor_empty(LOOM_F32, 1, shape, &t[i]);
  DT_CHECK(rc == LOOM_OK, "rank %d: tensors", r);
  /* every rank holds its tensors from here to the second barrier */
  if (rc == LOOM_OK) rc = loom_pg_barrier(pg, NULL);
  for (int k = 0; k < NRANKS && rc == LOOM_OK; k++) {
    loom_pool_stats st;
    rc = loom_mem_account_stats(k + 1, LOOM_POOL_COMPUTE, &st);
    s->current[r][k] = st.current_bytes;
  }
  if (rc == LOOM_OK) rc = loom_pg_barrier(pg, NULL);
  for (int i = 0; i < NRANKS; i++) loom_tensor_free(t[i]);
  return rc;
}

LT_TEST(threads_ranks_allocate_on_their_own_accounts) {
  size_t before[NRANKS];
  for (int k = 0; k < NRANKS; k++) {
    loom_pool_stats st;
    LT_OK(loom_mem_account_stats(k + 1, LOOM_POOL_COMPUTE, &st));
    before[k] = st.current_bytes;
  }
  int caller = loom_mem_account();
  seen s;
  memset(&s, 0, sizeof s);
  atomic_store(&dt_failures, 0);
  LT_OK(loom_threads_run(NRANKS, NULL, hold_and_read, &s));
  LT_EQ(atomic_load(&dt_failures), 0);
  LT_EQ(loom_mem_account(), caller); /* the caller's own account is left alone */
  for (int r = 0; r < NRANKS; r++) {
    LT_EQ(s.account[r], r + 1);
    LT_EQ(s.group_account[r], r + 1);
    /* every rank sees each account holding that account's rank's bytes only: rank k's
     * (k + 1) MiB and its tensors' small headers, not another rank's MiB */
    for (int k = 0; k < NRANKS; k++) {
      size_t want = (size_t)(k + 1) * MIB;
      LT_TRUE(s.current[r][k] >= want);
      LT_TRUE(s.current[r][k] < want + MIB);
    }
  }
  for (int k = 0; k < NRANKS; k++) {
    loom_pool_stats st;
    LT_OK(loom_mem_account_stats(k + 1, LOOM_POOL_COMPUTE, &st));
    LT_EQ(st.current_bytes, before[k]);
    LT_TRUE(st.peak_bytes >= (size_t)(k + 1) * MIB);
  }
}
