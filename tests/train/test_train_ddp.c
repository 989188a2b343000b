/* test_train_ddp.c: `loom train --ranks N --strategy ddp` (ranks as threads). Two ranks with
 * --batch B end with the parameters of one process with --batch 2B (within f32 summation
 * order: 1e-4 after 16 AdamW steps for all but a few elements, whose updates are ~lr = 1e-3
 * each, so a wrong average would show), the metrics carry the DDP statistics, f16 autocast with dynamic scaling runs
 * under DDP, and the data-parallel options (--timeout, LOOM_TIMEOUT) are checked. (Ranks that
 * disagree: test_train_ranks.c, and as MPI processes, with ranks that stall,
 * tests/tools/mpi_ranks.sh.) */
#include "lt.h"
#include "train_test.h"

#include <loom/io.h>
#include <stdlib.h>

/* The largest difference between same-named tensors of two safetensors files, and (over) how
 * many elements differ by more than `tol`. */
static double max_diff(const char *a, const char *b, double tol, size_t *over) {
  loom_safetensors *fa = NULL, *fb = NULL;
  double worst = INFINITY;
  if (loom_safetensors_open(a, 0, &fa) || loom_safetensors_open(b, 0, &fb)) goto done;
  if (loom_safetensors_count(fa) != loom_safetensors_count(fb)) goto done;
  worst = 0;
  for (size_t i = 0; i < loom_safetensors_count(fa); i++) {
    loom_safetensors_info info;
    loom_tensor *ta = NULL, *tb = NULL;
    if (loom_safetensors_info_at(fa, i, &info) || loom_safetensors_get(fa, info.name, &ta) ||
        loom_safetensors_get(fb, info.name, &tb) || !loom_tensor_same_shape(ta, tb)) {
      worst = INFINITY;
    } else {
      const float *x = loom_tensor_data(ta), *y = loom_tensor_data(tb);
      for (size_t k = 0; k < loom_tensor_numel(ta); k++) {
        if (fabs(x[k] - y[k]) > worst) worst = fabs(x[k] - y[k]);
        *over += fabs(x[k] - y[k]) > tol;
      }
    }
    loom_tensor_free(ta);
    loom_tensor_free(tb);
  }
done:
  loom_safetensors_free(fa);
  loom_safetensors_free(fb);
  return worst;
}

LT_TEST(train_ddp_two_ranks_match_one_process_with_twice_the_batch) {
  const char *d = tt_tempdir();
  const char *common = "--hidden 48 --limit 1024 --epochs 2 --threads 1 --seed 7 --quiet";
  tt_run one = tt_train("%s --batch 128 --save %s/one", common, d);
  tt_run two = tt_train("%s --batch 64 --ranks 2 --strategy ddp --save %s/two --metrics %s/m.jsonl",
                        common, d, d);
  LT_EQ(one.rc, 0);
  LT_EQ(two.rc, 0);
  if (two.rc) fprintf(stderr, "%s", two.err);
  char a[512], b[512];
  snprintf(a, sizeof a, "%s/one/model.safetensors", d);
  snprintf(b, sizeof b, "%s/two/model.safetensors", d);
  /* AdamW divides by sqrt(v) + eps: a gradient component near zero (a first-layer weight of a
   * pixel that is almost always 0) whose value depends on the summation order can move its
   * weight by up to lr = 1e-3 a step. So all but a few of the 38,000 elements agree within
   * 1e-4 and none differs by more than one lr (seed 7: one element by 1.6e-4, the next 3e-7). */
  size_t over = 0;
  double diff = max_diff(a, b, 1e-4, &over);
  if (!(diff <= 1e-3) || over > 3)
    lt_fail_at(__FILE__, __LINE__, "parameters differ by %g, %zu elements by more than 1e-4",
               diff, over);
  snprintf(a, sizeof a, "%s/m.jsonl", d);
  size_t mn = 0;
  char *m = tt_read_file(a, &mn);
  LT_TRUE(m && strstr(m, "\"ddp_buckets\": 1,") && strstr(m, "\"ddp_exposed_s\": "));
  free(m);
  tt_run_free(&one);
  tt_run_free(&two);
  tt_cleanup();
}

LT_TEST(train_ddp_f16_dynamic_scaling) {
  tt_run r = tt_train("--hidden 32 --limit 512 --epochs 1 --threads 1 --ranks 3 --strategy ddp "
                      "--batch 32 --amp f16");
  LT_EQ(r.rc, 0);
  if (r.rc) fprintf(stderr, "%s", r.err);
  LT_TRUE(strstr(r.out, "batch 32 x 3 ranks") != NULL);
  LT_TRUE(strstr(r.out, "overflow steps skipped") != NULL);
  tt_run_free(&r);
}

LT_TEST(train_ddp_option_checks) {
  tt_run r = tt_train("--ranks 2");
  LT_EQ(r.rc, 2);
  LT_TRUE(strstr(r.err, "--ranks: more than one rank needs --strategy ddp") != NULL);
  tt_run_free(&r);
  r = tt_train("--backend mpi --strategy ddp --ranks 2");
  LT_EQ(r.rc, 2);
  LT_TRUE(strstr(r.err, "mpirun -n N") != NULL);
  tt_run_free(&r);
  r = tt_train("--ranks 65 --strategy ddp");
  LT_EQ(r.rc, 2);
  LT_TRUE(strstr(r.err, "--ranks: expected at most 64") != NULL);
  tt_run_free(&r);
}

/* --timeout SECONDS (and LOOM_TIMEOUT, the default it overrides) for the ranks' waits. */
LT_TEST(train_ddp_timeout_option) {
  const char *run = "--hidden 16 --limit 512 --batch 64 --epochs 1 --threads 1 --quiet --ranks 2 "
                    "--strategy ddp";
  tt_run r = tt_train("%s --timeout 2.5", run);
  LT_EQ(r.rc, 0);
  tt_run_free(&r);
  r = tt_train("--timeout 5 --hidden 16 --limit 512 --batch 64 --epochs 1");
  LT_EQ(r.rc, 2);
  LT_TRUE(strstr(r.err, "--timeout: only for ranks that wait for each other") != NULL);
  tt_run_free(&r);
  r = tt_train("%s --timeout 0", run);
  LT_EQ(r.rc, 2);
  LT_TRUE(strstr(r.err, "--timeout") != NULL);
  tt_run_free(&r);
  const char *prev = getenv("LOOM_TIMEOUT");
  char saved[64] = "";
  if (prev) snprintf(saved, sizeof saved, "%s", prev);
  setenv("LOOM_TIMEOUT", "soon", 1);
  tt_run bad = tt_train("%s", run), over = tt_train("%s --timeout 30", run);
  if (prev) setenv("LOOM_TIMEOUT", saved, 1);
  else unsetenv("LOOM_TIMEOUT");
  LT_EQ(bad.rc, 2);
  LT_TRUE(strstr(bad.err, "LOOM_TIMEOUT=soon") != NULL);
  LT_EQ(over.rc, 0); /* --timeout wins over the environment */
  tt_run_free(&bad);
  tt_run_free(&over);
}
