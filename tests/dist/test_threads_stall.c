/* test_threads_stall.c: a stalled rank on the threads backend (issue 13): the ranks waiting for
 * it fail with LOOM_ETIMEDOUT naming it within the timeout plus a margin, say on stderr whom
 * they wait for once the wait is long, and sleep rather than spin meanwhile (the process's CPU
 * time stays well below the wall time); and the timeout's default from LOOM_TIMEOUT. */
#include "dist_test.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#define STALL_TIMEOUT 1.5 /* the notice comes after 1 s (loom__wait_notice_after) */

typedef struct stall {
  int rc[3];
  char msg[3][512];
  double secs[3];
} stall;

static double cpu_seconds(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 +
         (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;
}

static void sleep_s(double s) {
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

/* Rank 1 sleeps in its function past the others' timeout, then finds the group broken. */
static int stalls(loom_pg *pg, void *arg) {
  stall *s = arg;
  int r = loom_pg_rank(pg);
  float x = 1;
  double t0 = dt_now();
  if (r == 1) {
    sleep_s(STALL_TIMEOUT + 0.5);
    s->rc[r] = loom_pg_allreduce(pg, &x, &x, 1, LOOM_F32, LOOM_SUM, NULL);
    return LOOM_OK;
  }
  s->rc[r] = loom_pg_allreduce(pg, &x, &x, 1, LOOM_F32, LOOM_SUM, NULL);
  s->secs[r] = dt_now() - t0;
  snprintf(s->msg[r], sizeof s->msg[r], "%s", loom_last_error());
  return s->rc[r];
}

LT_TEST(threads_stalled_rank_named_without_spinning) {
  loom_pg_cfg cfg = loom_pg_cfg_default();
  cfg.timeout_s = STALL_TIMEOUT;
  stall s = {0};
  /* stderr into a file for the notice */
  char path[] = "/tmp/loom_stall_XXXXXX";
  int fd = mkstemp(path), saved = dup(2);
  LT_TRUE(fd >= 0 && saved >= 0);
  fflush(stderr);
  dup2(fd, 2);
  double cpu0 = cpu_seconds(), t0 = dt_now();
  int rc = loom_threads_run(3, &cfg, stalls, &s);
  double wall = dt_now() - t0, cpu = cpu_seconds() - cpu0;
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  char err[4096] = "";
  ssize_t n = pread(fd, err, sizeof err - 1, 0);
  err[n > 0 ? n : 0] = '\0';
  close(fd);
  unlink(path);
  LT_TRUE(rc == LOOM_ETIMEDOUT || rc == LOOM_EREMOTE);
  int timedout = 0;
  for (int r = 0; r < 3; r += 2) {
    LT_TRUE(s.rc[r] == LOOM_ETIMEDOUT || s.rc[r] == LOOM_EREMOTE);
    timedout += s.rc[r] == LOOM_ETIMEDOUT;
    if (!strstr(s.msg[r], "waiting for rank 1"))
      lt_fail_at(__FILE__, __LINE__, "rank %d's message does not name rank 1: %s", r, s.msg[r]);
    if (!(s.secs[r] >= STALL_TIMEOUT * 0.9 && s.secs[r] < STALL_TIMEOUT + 2.0))
      lt_fail_at(__FILE__, __LINE__, "rank %d failed after %g s (timeout %g s)", r, s.secs[r],
                 STALL_TIMEOUT);
  }
  LT_TRUE(timedout >= 1);
  LT_TRUE(s.rc[1] != LOOM_OK); /* the stalled rank finds the group broken */
  if (!strstr(err, "waiting for rank 1 in all-reduce #1 for 1") || !strstr(err, "(timeout 1.5 s)"))
    lt_fail_at(__FILE__, __LINE__, "no notice naming rank 1 on stderr: '%s'", err);
  /* two ranks waiting ~1.5 s: spinning would cost about 3 s of CPU (or the whole wall time on
   * a loaded machine), sleeping a few ms */
  if (!(cpu < 0.25 * wall))
    lt_fail_at(__FILE__, __LINE__, "%.3f s of CPU in %.3f s of waiting: spinning?", cpu, wall);
}

/* Rank 1 never joins (it just returns late): the default timeout is LOOM_TIMEOUT's. */
static int one_waits(loom_pg *pg, void *arg) {
  (void)arg;
  float x = 1;
  if (loom_pg_rank(pg) == 1) {
    while (loom_pg_async_error(pg) == LOOM_OK) sleep_s(0.005);
    return LOOM_OK;
  }
  return loom_pg_allreduce(pg, &x, &x, 1, LOOM_F32, LOOM_SUM, NULL);
}

/* Checks that do not stop the test, so that LOOM_TIMEOUT is always restored. */
#define CHECK(cond)                                                                           \
  do {                                                                                        \
    if (!(cond)) lt_fail_at(__FILE__, __LINE__, "%s (last error: %s)", #cond, loom_last_error()); \
  } while (0)

LT_TEST(threads_timeout_default_from_LOOM_TIMEOUT) {
  const char *prev = getenv("LOOM_TIMEOUT");
  char saved[64] = "";
  if (prev) snprintf(saved, sizeof saved, "%s", prev);
  unsetenv("LOOM_TIMEOUT");
  CHECK(loom_pg_cfg_default().timeout_s == 300.0);
  setenv("LOOM_TIMEOUT", "0.25", 1);
  loom_pg_cfg cfg = loom_pg_cfg_default();
  CHECK(cfg.timeout_s == 0.25);
  double t0 = dt_now();
  CHECK(loom_threads_run(2, NULL, one_waits, NULL) == LOOM_ETIMEDOUT);
  CHECK(strstr(loom_last_error(), "timed out after 0.25 s waiting for rank 1") != NULL);
  CHECK(dt_now() - t0 < 2.25);
  const char *bad[] = {"abc", "0", "-1", "inf", "nan", "1e400", "5s", " "};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    setenv("LOOM_TIMEOUT", bad[i], 1);
    cfg = loom_pg_cfg_default();
    CHECK(loom_pg_cfg_validate(&cfg) == LOOM_EINVAL);
    CHECK(strstr(loom_last_error(), "LOOM_TIMEOUT=") && strstr(loom_last_error(), bad[i]));
    CHECK(loom_threads_run(2, NULL, one_waits, NULL) == LOOM_EINVAL);
    CHECK(strstr(loom_last_error(), "LOOM_TIMEOUT=") != NULL);
    cfg.timeout_s = 30; /* set by the caller: the environment no longer matters */
    CHECK(loom_pg_cfg_validate(&cfg) == LOOM_OK);
  }
  setenv("LOOM_TIMEOUT", "", 1); /* empty: as if unset */
  CHECK(loom_pg_cfg_default().timeout_s == 300.0);
  if (prev) setenv("LOOM_TIMEOUT", saved, 1);
  else unsetenv("LOOM_TIMEOUT");
}
