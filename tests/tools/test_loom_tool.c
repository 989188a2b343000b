/* test_loom_tool.c: the `loom` binary as a process: a thread count far above the machine is
 * refused before any thread starts (it crashed inside libgomp), an environment variable loom
 * cannot use is refused by name, output that cannot be written fails the command, and SIGINT /
 * SIGTERM stop a run cleanly. */
#include "lt.h"

#include <dirent.h>
#include <signal.h>
#include <stdbool.h>
#include <stdlib.h>
#include <unistd.h>
#include "tool_run.h"

/* Run and check the exit code and a piece of stderr; print both if they differ. */
static void expect(const char *const *args, const char *const *env, const char *out_path,
                   int code, const char *want) {
  tool_run r = tool_loom(args, env, out_path);
  if (r.code != code || !strstr(r.err, want))
    fprintf(stderr, "loom %s ...: exit %d (want %d), stderr \"%s\" (want \"%s\")\n", args[0],
            r.code, code, r.err, want);
  LT_EQ(r.code, code);
  LT_TRUE(strstr(r.err, want) != NULL);
  tool_run_free(&r);
}

LT_TEST(tool_threads_above_the_bound_are_refused) {
  const char *a1[] = {"train", "--threads", "100000", "--hidden", "8", "--limit", "64",
                      "--batch", "32", NULL};
  expect(a1, NULL, NULL, 2, "--threads: expected at most ");
  char big[32];
  snprintf(big, sizeof big, "%d", loom_max_num_threads() + 1);
  const char *a2[] = {"train", "--threads", big, "--hidden", "8", "--limit", "64", "--batch",
                      "32", NULL};
  expect(a2, NULL, NULL, 2, "(4 per online CPU");
}

/* OMP_NUM_THREADS far above the bound: the GEMMs use at most loom_max_num_threads() (libgomp
 * crashed creating 100000 threads) and the run ends normally. */
LT_TEST(tool_omp_num_threads_above_the_bound_is_capped) {
  const char *args[] = {"train", "--hidden", "8", "--limit", "64", "--batch", "32", "--epochs",
                        "1", "--quiet", NULL};
  const char *env[] = {"OMP_NUM_THREADS=100000", NULL};
  tool_run r = tool_loom(args, env, NULL);
  LT_EQ(r.code, 0);
  LT_TRUE(strstr(r.out, "test accuracy") != NULL);
  tool_run_free(&r);
}

LT_TEST(tool_stdout_that_cannot_be_written_fails) {
  const char *help[] = {"train", "--help", NULL};
  expect(help, NULL, "/dev/full", 1, "loom: cannot write to standard output");
  const char *run[] = {"train", "--hidden", "8", "--limit", "64", "--batch", "32", "--epochs",
                       "1", "--threads", "1", NULL};
  expect(run, NULL, "/dev/full", 1, "loom: cannot write to standard output");
  const char *top[] = {"--help", NULL};
  expect(top, NULL, "/dev/full", 1, "cannot write to standard output");
  tool_run r = tool_loom(help, NULL, "/dev/null"); /* a sink that takes it all: 0 */
  LT_EQ(r.code, 0);
  tool_run_free(&r);
}

LT_TEST(tool_bad_environment_is_refused) {
  const char *help[] = {"train", "--help", NULL};
  const char *cpu[] = {"LOOM_CPU=avx3", NULL};
  expect(help, cpu, NULL, 2, "loom: LOOM_CPU: expected scalar, avx2 or avx512");
  const char *bad[] = {"-1", "12MB", "1.5", " 4", "+4", "99999999999999999999999", NULL};
  for (int i = 0; bad[i]; i++) {
    char var[64];
    snprintf(var, sizeof var, "LOOM_ALLOC_CACHE_MB=%s", bad[i]);
    const char *env[] = {var, NULL};
    expect(help, env, NULL, 2, "loom: LOOM_ALLOC_CACHE_MB: expected a whole number of MiB");
  }
  const char *good[] = {"LOOM_CPU=scalar", "LOOM_ALLOC_CACHE_MB=0", NULL};
  tool_run r = tool_loom(help, good, NULL);
  LT_EQ(r.code, 0);
  LT_TRUE(strstr(r.out, "--threads") != NULL);
  tool_run_free(&r);
  const char *empty[] = {"LOOM_CPU=", "LOOM_ALLOC_CACHE_MB=", NULL}; /* empty: the default */
  r = tool_loom(help, empty, NULL);
  LT_EQ(r.code, 0);
  tool_run_free(&r);
}

/* No *.tmp.* file left in dir. */
static bool no_temporaries(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return false;
  bool clean = true;
  for (struct dirent *e; (e = readdir(d));)
    if (strstr(e->d_name, ".tmp.")) clean = false;
  closedir(d);
  return clean;
}

/* SIGINT, then SIGTERM on the resumed run: each stops at a step boundary with exit 130 / 143,
 * says so, leaves no temporary and a checkpoint the next run resumes from. */
LT_TEST(tool_sigint_and_sigterm_stop_cleanly) {
  char dir[] = "/tmp/loom-signal-XXXXXX", ck[64];
  LT_TRUE(mkdtemp(dir) != NULL);
  snprintf(ck, sizeof ck, "%s/checkpoint.safetensors", dir);
  const char *first[] = {"train", "--hidden", "32", "--limit", "512", "--batch", "32",
                         "--epochs", "100000", "--threads", "1", "--save", dir, NULL};
  tool_run r = tool_loom_signal(first, NULL, NULL, ck, SIGINT);
  LT_EQ(r.code, 130);
  LT_TRUE(strstr(r.err, "interrupted before step") && strstr(r.err, "checkpoint written is intact"));
  tool_run_free(&r);
  LT_TRUE(no_temporaries(dir));
  char started[96], model[96]; /* the metrics file appears after the resumed run's first step */
  snprintf(started, sizeof started, "%s/metrics.jsonl", dir);
  snprintf(model, sizeof model, "%s/model.safetensors", dir);
  const char *again[] = {"train", "--hidden", "32", "--limit", "512", "--batch", "32",
                         "--epochs", "100000", "--threads", "1", "--resume", dir, "--save", dir,
                         "--metrics", started, NULL};
  r = tool_loom_signal(again, NULL, NULL, started, SIGTERM);
  LT_EQ(r.code, 143);
  LT_TRUE(strstr(r.out, "resuming at step") != NULL);
  tool_run_free(&r);
  LT_TRUE(no_temporaries(dir));
  remove(ck);
  remove(model);
  remove(started);
  rmdir(dir);
}

/* Every benchmark of `loom bench` (the names its help lists) checks its arguments before it
 * runs: --help prints its usage and ends with 0, an unknown option, a size that is negative,
 * zero or absurd, a word not among its choices and one argument too many end with 2 and a
 * message naming the argument. Each call returns at once (a benchmark takes minutes). */
LT_TEST(tool_bench_checks_its_arguments_first) {
  const char *list[] = {"bench", "--help", NULL};
  tool_run l = tool_loom(list, NULL, NULL);
  LT_EQ(l.code, 0);
  int seen = 0;
  for (char *line = strtok(l.out, "\n"); line; line = strtok(NULL, "\n")) {
    if (strncmp(line, "  ", 2) != 0) continue;
    char name[64], want[128];
    snprintf(name, sizeof name, "%s", line + 2);
    seen++;
    const char *help[] = {"bench", name, "--help", NULL};
    tool_run r = tool_loom(help, NULL, NULL);
    snprintf(want, sizeof want, "usage: loom bench %s", name);
    if (r.code != 0 || !strstr(r.out, want))
      fprintf(stderr, "bench %s --help: exit %d, \"%s\"\n", name, r.code, r.out);
    LT_EQ(r.code, 0);
    LT_TRUE(strstr(r.out, want) != NULL);
    tool_run_free(&r);
    const char *nope[] = {"bench", name, "--nope", NULL};
    snprintf(want, sizeof want, "loom bench %s: unknown option --nope", name);
    expect(nope, NULL, NULL, 2, want);
  }
  LT_TRUE(seen >= 6);
  tool_run_free(&l);
  const char *neg[] = {"bench", "convert", "-1", NULL};
  expect(neg, NULL, NULL, 2, "loom bench convert: ELEMENTS: expected an integer from 1 to "
                             "1073741824, got '-1'");
  const char *zero[] = {"bench", "convert", "0", NULL};
  expect(zero, NULL, NULL, 2, "ELEMENTS: expected an integer from 1 to 1073741824, got '0'");
  const char *huge[] = {"bench", "unscale", "18446744073709551615", NULL};
  expect(huge, NULL, NULL, 2, "loom bench unscale: ELEMENTS: expected an integer");
  const char *part[] = {"bench", "fsdp", "3", "fast", NULL};
  expect(part, NULL, NULL, 2,
         "loom bench fsdp: PART: expected one of all|speed|mem4|bf16, got 'fast'");
  const char *extra[] = {"bench", "convert", "1000", "x", NULL};
  expect(extra, NULL, NULL, 2, "loom bench convert: unexpected argument 'x'");
}

/* A user's plausible mistakes get a message that names the problem, before any training: a
 * folder to resume that is missing, a file, or holds no checkpoint (exit 1, as a checkpoint
 * that cannot be loaded); a typo'd option, an option whose value was forgotten (exit 2); a
 * folder without the model to generate from or evaluate. */
LT_TEST(tool_user_mistakes_are_named) {
  char dir[] = "/tmp/loom-mistakes-XXXXXX", missing[64];
  LT_TRUE(mkdtemp(dir) != NULL); /* an empty folder */
  snprintf(missing, sizeof missing, "%s/none", dir);
  const char *a1[] = {"train", "--resume", dir, NULL};
  expect(a1, NULL, NULL, 1, "no checkpoint in this folder (neither ");
  expect(a1, NULL, NULL, 1, "/fsdp/fsdp-index.safetensors; a run writes them with --save DIR)");
  const char *a2[] = {"train", "--resume", missing, NULL};
  expect(a2, NULL, NULL, 1, "/none: No such file or directory, so no ");
  const char *a3[] = {"train", "--resume", "/etc/passwd", NULL}; /* a file */
  expect(a3, NULL, NULL, 1, "--resume /etc/passwd: not a folder");
  const char *a4[] = {"train", "--epoch", "1", NULL};
  expect(a4, NULL, NULL, 2, "loom train: unknown option --epoch: did you mean --epochs?");
  const char *a5[] = {"plan", "--stratgy", "fsdp", NULL};
  expect(a5, NULL, NULL, 2, "loom plan: unknown option --stratgy: did you mean --strategy?");
  const char *a6[] = {"train", "--lr", "--epochs", "1", NULL};
  expect(a6, NULL, NULL, 2, "--lr needs a value (X), but is followed by the option --epochs");
  const char *a7[] = {"train", "--amp", "fp16", NULL};
  expect(a7, NULL, NULL, 2, "--amp: expected one of off|bf16|f16, got 'fp16'");
  const char *a8[] = {"generate", "--from", dir, NULL};
  expect(a8, NULL, NULL, 1, "/model.safetensors (`loom train --model gpt --save DIR` writes one)");
  const char *a11[] = {"eval", "--from", missing, NULL};
  expect(a11, NULL, NULL, 1, "/none: no such file or folder (give the folder `loom train --save DIR` wrote)");
  const char *a12[] = {"eval", "--from", dir, NULL};
  expect(a12, NULL, NULL, 1, "/model.safetensors (`loom train --save DIR` writes one)");
  const char *a9[] = {"plot", "run.jsonl", NULL}; /* the message, not the whole usage */
  tool_run r = tool_loom(a9, NULL, NULL);
  LT_EQ(r.code, 2);
  LT_TRUE(strstr(r.err, "loom plot: no output file: give -o OUT.svg (or -o - for standard output)") != NULL);
  LT_TRUE(strstr(r.err, "usage:") == NULL);
  tool_run_free(&r);
  const char *a10[] = {"plot", "run.jsonl", "--out", "x.svg", NULL};
  expect(a10, NULL, NULL, 2, "unknown option '--out' (it takes -o/--output, --label and --x");
  rmdir(dir);
}

/* A run stopped inside an epoch (--max-steps) ends the epoch's line at the step it reached,
 * not at the epoch's end. */
LT_TEST(tool_max_steps_ends_the_line_at_its_step) {
  const char *args[] = {"train", "--hidden", "8", "--limit", "512", "--batch", "64", "--epochs",
                        "1", "--max-steps", "3", "--threads", "1", "--progress", "lines", NULL};
  tool_run r = tool_loom(args, NULL, NULL);
  LT_EQ(r.code, 0);
  if (!strstr(r.out, "epoch 1/1 3/8 (")) fprintf(stderr, "stdout: %s\n", r.out);
  LT_TRUE(strstr(r.out, "epoch 1/1 3/8 (") != NULL);
  LT_TRUE(strstr(r.out, "8/8") == NULL);
  LT_TRUE(strstr(r.out, "after 3 steps") != NULL);
  tool_run_free(&r);
}
