/* test_threads_pin.c: loom_pg_cfg.pin: with as many CPUs as ranks, each rank thread runs on its
 * own non-empty slice of the process's CPUs (slices disjoint, covering them all), and a thread
 * it starts inherits its slice; pin false (or a cores setting) leaves every rank the whole set. */
#define _GNU_SOURCE
#include "lt.h"
#include "loom/dist.h"

#include <pthread.h>
#include <sched.h>
#include <string.h>

enum { MAXR = 4 };

typedef struct seen {
  cpu_set_t rank[MAXR], child[MAXR];
} seen;

static void *child_main(void *p) {
  sched_getaffinity(0, sizeof(cpu_set_t), p);
  return NULL;
}

static int record(loom_pg *pg, void *arg) {
  seen *s = arg;
  int r = loom_pg_rank(pg);
  pthread_getaffinity_np(pthread_self(), sizeof s->rank[r], &s->rank[r]);
  pthread_t t;
  if (pthread_create(&t, NULL, child_main, &s->child[r]) != 0) return LOOM_EBACKEND;
  pthread_join(t, NULL);
  return LOOM_OK;
}

LT_TEST(threads_pin_gives_each_rank_its_own_cpus) {
  cpu_set_t all;
  LT_TRUE(sched_getaffinity(0, sizeof all, &all) == 0);
  int ncpu = CPU_COUNT(&all);
  for (int n = 2; n <= MAXR; n++) {
    seen s;
    memset(&s, 0, sizeof s);
    LT_OK(loom_threads_run(n, NULL, record, &s)); /* the defaults pin */
    cpu_set_t un;
    CPU_ZERO(&un);
    for (int r = 0; r < n; r++) {
      if (ncpu >= n) {
        LT_TRUE(CPU_COUNT(&s.rank[r]) >= 1);
        for (int q = 0; q < r; q++) {
          cpu_set_t both;
          CPU_AND(&both, &s.rank[r], &s.rank[q]);
          LT_EQ(CPU_COUNT(&both), 0);
        }
      } else {
        LT_TRUE(CPU_EQUAL(&s.rank[r], &all)); /* more ranks than CPUs: left alone */
      }
      LT_TRUE(CPU_EQUAL(&s.child[r], &s.rank[r]));
      CPU_OR(&un, &un, &s.rank[r]);
    }
    LT_TRUE(CPU_EQUAL(&un, &all));
  }
  loom_pg_cfg cfg = loom_pg_cfg_default();
  LT_TRUE(cfg.pin);
  for (int k = 0; k < 2; k++) {
    cfg = loom_pg_cfg_default();
    if (k == 0) cfg.pin = false;
    else cfg.cores = 1; /* a cores setting: the caller shares the CPUs out itself */
    seen s;
    memset(&s, 0, sizeof s);
    LT_OK(loom_threads_run(2, &cfg, record, &s));
    LT_TRUE(CPU_EQUAL(&s.rank[0], &all) && CPU_EQUAL(&s.rank[1], &all));
  }
}
