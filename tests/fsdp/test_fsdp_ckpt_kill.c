/* test_fsdp_ckpt_kill.c: kill -9 during sharded saves, then resume (the probe's 100 kills, made
 * a regression test). A child process trains 2 ranks (threads) and saves a sharded set after
 * every step into one folder, the step in the index's metadata; it is killed with SIGKILL after
 * a delay drawn from a seeded generator (up to 250 ms), 8 times into the same folder, so later
 * children save over the dead generations and temporaries of earlier ones. After each kill the
 * set must load at 2 ranks and at 1, at the step the index names (the optimizer's step count
 * too), with exactly the state a run of that many steps has: the committed set, nothing torn.
 * Each child is bounded (it stops by itself after MAXS steps); the whole test takes ~3 s. */
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
    char step[32];
    snprintf(step, sizeof step, "%d", k + 1);
    loom_safetensors_meta_kv meta[] = {{"step", step}};
    if (!rc) rc = loom_fsdp_save_sharded(f, s->dir, opt, meta, 1);
  }
  loom_optim_free(opt);
  loom_fsdp_free(f);
  loom_module_free(m);
  return rc;
}

/* A child saving into dir, killed after `us` microseconds (or reaped if it ended). */
static void save_and_kill(const char *dir, long us) {
  fflush(NULL);
  pid_t pid = fork();
  LT_TRUE(pid >= 0);
  if (pid == 0) {
    saver s = {dir};
    _exit(loom_threads_run(2, NULL, saver_rank, &s) ? 1 : 0);
  }
  struct timespec t = {us / 1000000, (us % 1000000) * 1000};
  nanosleep(&t, NULL);
  kill(pid, SIGKILL);
  int status = 0;
  LT_EQ(waitpid(pid, &status, 0), pid);
  if (WIFEXITED(status)) /* it finished before the kill: it must have succeeded */
    LT_EQ(WEXITSTATUS(status), 0);
}

LT_TEST(fsdp_ckpt_kill_9_during_saves_resumes_at_the_committed_step) {
  char dir[64], scratch[64];
  ck_tmp_dir(dir, sizeof dir);
  ck_tmp_dir(scratch, sizeof scratch);
  uint64_t x = 0x9e3779b97f4a7c15ull; /* xorshift: the same delays every run */
  int committed = 0;
  for (int k = 0; k < KILLS; k++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    save_and_kill(dir, 2000 + (long)(x % 248000));
    char step[32] = "";
    if (loom_fsdp_sharded_meta(dir, "step", step, sizeof step) != LOOM_OK) continue; /* none yet */
    int s = atoi(step);
    LT_TRUE(s >= 1 && s <= MAXS);
    char fstep[32];
    LT_OK(loom_fsdp_sharded_meta(dir, "fsdp.step", fstep, sizeof fstep));
    LT_EQ(atoi(fstep), s);
    committed++;
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
  if (committed < KILLS / 2)
    lt_fail_at(__FILE__, __LINE__, "only %d of %d children committed a set", committed, KILLS);
  fm_rm_tree(dir);
  fm_rm_tree(scratch);
}
