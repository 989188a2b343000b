/* test_fsdp_ckpt_kill.c: kill -9 during sharded saves, then resume (the probe's 100 kills, made
 * a regression test). A child process trains 2 ranks (threads) and saves a sharded set after
 * every step into one folder, the step and the child's number in the index's metadata; once its
 * first set is committed, it is killed with SIGKILL after a delay drawn from a seeded generator
 * (up to 250 ms), 8 times into the same folder, so later children save over the dead
 * generations and temporaries of earlier ones. After each kill the set must load at 2 ranks and
 * at 1, at the step the index names (the optimizer's step count too), with exactly the state a
 * run of that many steps has: the committed set, nothing torn. Each child is bounded (it stops
 * by itself after MAXS steps; a child that commits nothing in 60 s is killed and the test
 * fails); the whole test takes ~3 s. */
#include "lt.h"
#include "fsdp_ckpt_sets.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { MAXS = 2000, KILLS = 8 };

typedef struct saver {
  const char *dir;
  int trial;
} saver;

/* Train and save after every step until MAXS (the parent kills it long before). */
static int saver_rank(loom_pg *pg, void *arg) {
  saver *s = arg;
  int rank = loom_pg_rank(pg), world = loom_pg_size(pg);
  loom_fsdp_cfg cfg = loom_fsdp_cfg_default();
  loom_module *m = NULL;
  loom_fsdp *f = NULL;
  loom_optim *opt = NULL;
  int rc = fm_setup(pg, 1 + (uint64_t)rank, &cfg, fm_adam().state_pool, &m, &f, &opt);
  for (int k = 0; k < MAXS && !rc; k++) {
    rc = ck_train_step(m, f, opt, k, rank, world);
    char step[32], trial[32];
    snprintf(step, sizeof step, "%d", k + 1);
    snprintf(trial, sizeof trial, "%d", s->trial);
    loom_safetensors_meta_kv meta[] = {{"step", step}, {"trial", trial}};
    if (!rc) rc = loom_fsdp_save_sharded(f, s->dir, opt, meta, 2);
  }
  loom_optim_free(opt);
  loom_fsdp_free(f);
  loom_module_free(m);
  return rc;
}

/* Whether dir's index is of child `trial`. */
static bool committed_by(const char *dir, int trial) {
  char v[32];
  return loom_fsdp_sharded_meta(dir, "trial", v, sizeof v) == LOOM_OK && atoi(v) == trial;
}

/* Child `trial` saving into dir, killed `us` microseconds after its first commit (or reaped if
 * it ended). */
static void save_and_kill(const char *dir, int trial, long us) {
  fflush(NULL);
  pid_t pid = fork();
  LT_TRUE(pid >= 0);
  if (pid == 0) {
    saver s = {dir, trial};
    _exit(loom_threads_run(2, NULL, saver_rank, &s) ? 1 : 0);
  }
  struct timespec poll = {0, 1000000}, t = {us / 1000000, (us % 1000000) * 1000};
  int status = 0;
  pid_t ended = 0;
  for (int i = 0; i < 60000 && !committed_by(dir, trial) && !ended; i++) {
    nanosleep(&poll, NULL);
    ended = waitpid(pid, &status, WNOHANG);
  }
  if (!ended) {
    nanosleep(&t, NULL);
    kill(pid, SIGKILL);
    LT_EQ(waitpid(pid, &status, 0), pid);
  }
  if (WIFEXITED(status)) /* it finished before the kill: it must have succeeded */
    LT_EQ(WEXITSTATUS(status), 0);
}

LT_TEST(fsdp_ckpt_kill_9_during_saves_resumes_at_the_committed_step) {
  char dir[64], scratch[64];
  ck_tmp_dir(dir, sizeof dir);
  ck_tmp_dir(scratch, sizeof scratch);
  uint64_t x = 0x9e3779b97f4a7c15ull; /* xorshift: the same delays every run */
  for (int k = 0; k < KILLS; k++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    save_and_kill(dir, k, (long)(x % 250000));
    if (!committed_by(dir, k)) lt_fail_at(__FILE__, __LINE__, "child %d committed no set", k);
    char step[32] = "";
    LT_OK(loom_fsdp_sharded_meta(dir, "step", step, sizeof step));
    int s = atoi(step);
    LT_TRUE(s >= 1 && s <= MAXS);
    char fstep[32];
    LT_OK(loom_fsdp_sharded_meta(dir, "fsdp.step", fstep, sizeof fstep));
    LT_EQ(atoi(fstep), s);
    /* the state of a run of s steps */
    float *want = ck_fbuf();
    ck_job ref = {.world = 2, .seed = 1, .pre_steps = s, .save_dir = scratch, .mid = want};
    LT_OK(loom_threads_run(2, NULL, ck_job_rank, &ref));
    for (int w = 2; w >= 1; w--) {
      ck_job got = {.world = w, .seed = 50, .load_dir = dir, .mid = ck_fbuf()};
      int rc = loom_threads_run(w, NULL, ck_job_rank, &got);
      if (rc) lt_fail_at(__FILE__, __LINE__, "kill %d, step %d, %d ranks: %s", k, s, w,
                         loom_last_error());
      LT_EQ(got.step_count, s);
      LT_TRUE(memcmp(got.mid, want, ck_numel() * sizeof(float)) == 0);
      free(got.mid);
    }
    free(want);
  }
  fm_rm_tree(dir);
  fm_rm_tree(scratch);
}
