/* test_train_plan.c: `loom plan` (a dry run of the same options) against what `loom train`
 * measures. Each configuration trains
 * for two steps with --metrics (the `loom` tool, run as a process), and the plan of the same
 * options must be within 10% of the compute-pool peak the run measured (per rank:
 * rank_compute_peak_bytes with ranks, which counts from the end of building; the process's
 * peak with one rank, which includes building). Configurations: one rank; DDP on 2 and 3 ranks;
 * bf16 and f16 autocast; a wide MLP with SGD; SGD without momentum; the CNN in f32 and bf16;
 * the GPT (f32, bf16, DDP, FSDP, and the 6/6/384/256 under FSDP with offload);
 * FSDP in f32 and bf16, the size policy, no prefetch, 3 ranks without resharding, the CNN with
 * either policy, and
 * offload of everything or some (host tier) and of everything to the disk tier (also in bf16,
 * with the tier's low-precision parameter copy, and with the optimizer step in backward). Also the
 * --fit-memory search (its answer fits and one more does not, and it never proposes a batch
 * larger than an epoch), the process peak (loom's blocks in use and in the allocation cache,
 * the data, the runtime) against the run's resident set (within 15%; shown, not held, under a
 * sanitizer, whose shadow memory is resident), the JSON form, bad
 * --fit-memory values, and what being a dry run means (no memory, no file, the run's errors). */
#include "lt.h"
#include "train_opts.h"
#include "train_plan.h"
#include "train_test.h"

#include <dirent.h>
#include <math.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The number after `"key": ` in s (the last occurrence), -1 if absent. */
static double json_number(const char *s, const char *key) {
  char pat[96];
  snprintf(pat, sizeof pat, "\"%s\": ", key);
  const char *p = NULL, *q = s;
  while ((q = strstr(q, pat))) p = q++;
  return p ? strtod(p + strlen(pat), NULL) : -1;
}

/* The number after the first `"key": ` in s, -1 if absent. */
/* Each of bad[0..n) after `base` is refused: exit 2, a message naming `needle`. */
static void refused_each(const char *base, const char *const *bad, size_t n, const char *needle) {
  for (size_t i = 0; i < n; i++) {
    tt_run b = tt_plan("%s %s", base, bad[i]);
    LT_EQ(b.rc, 2);
    LT_TRUE(strstr(b.err, needle) != NULL);
    tt_run_free(&b);
  }
}

static double json_first(const char *s, const char *key) {
  char pat[96];
  snprintf(pat, sizeof pat, "\"%s\": ", key);
  const char *p = s ? strstr(s, pat) : NULL;
  return p ? strtod(p + strlen(pat), NULL) : -1;
}

/* The measured peak of the metrics file's last record (see the header). */
static double measured_peak(const char *path) {
  size_t n = 0;
  char *text = tt_read_file(path, &n);
  if (!text) return -1;
  double v = json_number(text, "rank_compute_peak_bytes");
  if (v < 0) { /* one process: mem.compute.peak_bytes, the first peak_bytes of the record */
    const char *last = text, *nl;
    while ((nl = strchr(last, '\n')) && nl[1]) last = nl + 1;
    v = json_first(strstr(last, "\"compute\": "), "peak_bytes");
  }
  free(text);
  return v;
}

/* The value of option `name` in opts ("--ranks 2"), or def. */
static long opt_value(const char *opts, const char *name, long def) {
  const char *p = strstr(opts, name);
  return p ? strtol(p + strlen(name), NULL, 10) : def;
}

/* opts with what both the run and its plan take here: two steps' worth of samples (so the
 * run's epoch and the plan's evaluation batch agree) and a 100-sample evaluation batch. */
static void run_opts(const char *opts, char *buf, size_t cap) {
  long ranks = opt_value(opts, "--ranks ", 1), batch = opt_value(opts, "--batch ", 256);
  snprintf(buf, cap, "%s --limit %ld --eval-batch 100", opts, 2 * batch * ranks);
}

/* Run the shell command cmd (its last command exec'd by the shell); its exit status. */
static int run_status(const char *cmd) {
  char line[2200];
  snprintf(line, sizeof line, "exec %s", cmd);
  pid_t pid = fork();
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", line, (char *)NULL);
    _exit(127);
  }
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid) return -1;
  return status;
}

/* The process peak `loom plan` gives for opts, run as the tool itself (the runtime's base is
 * the resident set of the `loom` process at its start). */
static double plan_process_peak(const char *opts) {
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "%s plan %s --json", LOOM_TOOL_BIN, opts);
  FILE *p = popen(cmd, "r");
  char out[8192] = "";
  size_t n = p ? fread(out, 1, sizeof out - 1, p) : 0;
  out[n] = '\0';
  if (p) pclose(p);
  return json_first(out, "process_peak_bytes");
}

/* Train `opts` (run_opts) for two steps as the `loom` tool in a process of its own, as a user
 * runs it (in this process, earlier runs would leave state, such as oneDNN's primitive caches,
 * that changes what a run allocates). Returns the step's measured peak (see the header), sets
 * *summary_peak to the summary line's and *rss to the run's largest resident set (its last
 * record's mem.resident_peak_bytes: the process image's own, VmHWM; the ru_maxrss that wait4
 * gives a forked child also keeps the image it was forked from, this test process's resident
 * set, which grows to 150 MB over the tests before this one), or -1 on failure. */
static double measure(const char *opts, double *summary_peak, double *rss) {
  const char *d = tt_tempdir();
  char cmd[2048], path[512];
  snprintf(cmd, sizeof cmd, "%s train %s --max-steps 2 --epochs 1 --quiet --metrics %s/m.jsonl "
           "> %s/out.txt 2>&1", LOOM_TOOL_BIN, opts, d, d);
  int status = run_status(cmd);
  if (status != 0) fprintf(stderr, "%s: exit status %d\n", cmd, status);
  snprintf(path, sizeof path, "%s/out.txt", d);
  size_t out_n = 0;
  char *out = tt_read_file(path, &out_n);
  const char *pm = out ? strstr(out, "peak memory ") : NULL;
  double v = -1;
  char unit[4] = "";
  *summary_peak = -1;
  if (pm && sscanf(pm, "peak memory %lf %3s", &v, unit) == 2)
    *summary_peak = v * (strcmp(unit, "GiB") == 0 ? 1073741824.0
                         : strcmp(unit, "MiB") == 0 ? 1048576.0 : 1.0);
  free(out);
  snprintf(path, sizeof path, "%s/m.jsonl", d);
  size_t n = 0;
  char *records = status == 0 ? tt_read_file(path, &n) : NULL;
  *rss = records ? json_number(records, "resident_peak_bytes") : -1;
  free(records);
  return status == 0 ? measured_peak(path) : -1;
}

/* Whether planned is within `tolerance` of measured (failing the test, with both, if not). */
static void within(const char *opts, const char *what, double planned, double measured,
                   double tolerance) {
  double err = fabs(planned - measured) / measured;
  fprintf(stderr, "  %-60s %s: measured %9.0f planned %9.0f (%+.1f%%)\n", opts, what, measured,
          planned, 100.0 * (planned - measured) / measured);
  if (tolerance <= 0) return; /* shown, not held */
  if (!(measured > 0) || !(err <= tolerance))
    lt_fail_at(__FILE__, __LINE__, "%s: %s: planned %.0f bytes, measured %.0f (%.1f%% off)", opts,
               what, planned, measured, 100.0 * err);
}

/* The plan of `opts` against the measured peaks: the training step's (see the header), and the
 * whole run's as the summary prints it (with ranks, each rank's from the end of building, so
 * the step's or the evaluation's; with one rank, the process's, building included). A unit's
 * local gradient lives until the next unit's backward starts, whatever the peers' timing
 * (fsdp_hooks.c), so every run of a configuration has the same peak. */
static void check_plan(const char *given) {
  char opts[1024];
  run_opts(given, opts, sizeof opts);
  int ranks = (int)opt_value(given, "--ranks ", 1);
  tt_run p = tt_plan("%s --json", opts);
  LT_EQ(p.rc, 0);
  double train = json_first(strstr(p.out, "\"train\""), "peak_bytes");
  double build = json_first(strstr(p.out, "\"build\""), "peak_bytes");
  double eval = json_first(strstr(p.out, "\"eval\""), "peak_bytes");
  double planned = ranks > 1 || build < train ? train : build;
  /* the run evaluates inside its last step (--max-steps 2 ends the epoch), before that step's
   * record: the record's peak is the step's or the evaluation's */
  if (eval > planned) planned = eval;
  double overall = ranks > 1 ? (train > eval ? train : eval) : json_first(p.out, "peak_bytes");
  tt_run_free(&p);
  double summary = -1, rss = -1, measured = measure(opts, &summary, &rss);
  LT_TRUE(measured > 0);
  double process = plan_process_peak(opts); /* before tt_cleanup: --offload-dir must exist */
  tt_cleanup();
  within(opts, "step", planned, measured, 0.10);
  within(opts, "run", overall, summary, 0.10);
  /* the process: loom's blocks in use and cached, the data, the runtime, against the resident
   * set, held to 15%. The dry run counts a gradient arena only from the step on (before it is
   * a fresh mapping's untouched zeros: the wide SGD model planned 27% high when it counted the
   * arenas its containers' packing replaced) and follows each rank's blocks and cache alone
   * (one cache shared by unsynchronised dry ranks made a plan of 2 ranks vary by 15% from one
   * plan to the next). Every configuration measured within -7.1% and +9.3% (BENCHMARKS.md);
   * what is left is mostly the code of oneDNN that the CNN's convolutions page in (7% under),
   * which the dry run, running no kernel, cannot see, and the ranks' caches counted full at
   * once (DDP and FSDP of the GPT, 9% over). Under a sanitizer the resident set also holds its shadow memory and its allocator's
   * quarantine, which no plan of loom's blocks counts: shown, not held. */
#ifdef LOOM_SANITIZED
  within(opts, "process (sanitizer: its shadow memory is resident, not held)", process, rss, 0);
#else
  /* With ranks as threads the process holds every rank's blocks and caches, and whether the
   * ranks' peaks coincide depends on how the scheduler interleaves them: on a loaded 2-core
   * machine the DDP GPT measured -15% and +18.7% in two runs, 4% quiet. One rank: 15%. */
  within(opts, "process", process, rss, ranks > 1 ? 0.25 : 0.15);
#endif
}

LT_TEST(plan_matches_the_measured_peak_mlp) {
  check_plan("--batch 256");
  check_plan("--batch 128 --ranks 2 --strategy ddp");
  check_plan("--batch 256 --amp bf16");
  check_plan("--batch 256 --amp f16");
  check_plan("--batch 64 --hidden 2048,2048,2048 --optim sgd");
  check_plan("--batch 64 --ranks 3 --strategy ddp --amp f16");
  check_plan("--batch 64 --optim sgd --momentum 0 --amp bf16");
}

LT_TEST(plan_matches_the_measured_peak_cnn) {
  check_plan("--model cnn --batch 128");
  check_plan("--model cnn --batch 128 --amp bf16");
}

LT_TEST(plan_matches_the_measured_peak_fsdp) {
  check_plan("--batch 128 --ranks 2 --strategy fsdp");
  check_plan("--batch 128 --ranks 2 --strategy fsdp --amp bf16");
  check_plan("--batch 64 --hidden 2048,2048 --ranks 2 --strategy fsdp --gather-prefetch 0");
  check_plan("--batch 128 --ranks 2 --strategy fsdp --offload all");
  check_plan("--batch 64 --ranks 2 --strategy fsdp --wrap size --unit-min 1000000");
  check_plan("--batch 64 --ranks 3 --strategy fsdp --reshard-after-forward no");
  check_plan("--batch 64 --ranks 2 --strategy fsdp --model cnn --amp bf16");
  check_plan("--batch 64 --ranks 2 --strategy fsdp --model cnn --wrap size");
  check_plan("--batch 64 --ranks 2 --strategy fsdp --offload grads,optim --prefetch 0");
  check_plan("--batch 8 --hidden 1024,2048,2048 --ranks 2 --strategy fsdp --wrap size "
             "--unit-min 2900000");
}

LT_TEST(plan_matches_the_measured_peak_gpt) {
  check_plan("--model gpt --batch 8");
  check_plan("--model gpt --batch 8 --amp bf16");
  check_plan("--model gpt --batch 4 --ranks 2 --strategy ddp");
  check_plan("--model gpt --batch 4 --ranks 2 --strategy fsdp");
  check_plan("--model gpt --batch 8 --layers 6 --checkpoint-activations");
  check_plan("--model gpt --batch 4 --ranks 2 --strategy fsdp --checkpoint-activations");
  check_plan("--model gpt --batch 4 --layers 6 --heads 6 --dim 384 --context 256 --ranks 2 "
             "--strategy fsdp --offload all");
}

LT_TEST(plan_matches_the_measured_peak_fsdp_disk_tier) {
  const char *d = tt_tempdir();
  char opts[700];
  snprintf(opts, sizeof opts, "--batch 64 --ranks 2 --strategy fsdp --offload all "
           "--offload-tier disk --offload-dir %s", d);
  check_plan(opts);
  d = tt_tempdir(); /* check_plan cleaned up: a new folder */
  snprintf(opts, sizeof opts, "--batch 8 --hidden 1024,1024,1024,1024 --ranks 2 --strategy fsdp "
           "--offload params --offload-tier disk --offload-dir %s --prefetch 4", d);
  check_plan(opts);
  /* bf16: the tier's low-precision parameter copy; and the optimizer step inside backward */
  d = tt_tempdir();
  snprintf(opts, sizeof opts, "--batch 64 --ranks 2 --strategy fsdp --amp bf16 --offload all "
           "--offload-tier disk --offload-dir %s", d);
  check_plan(opts);
  d = tt_tempdir();
  snprintf(opts, sizeof opts, "--batch 64 --ranks 2 --strategy fsdp --amp bf16 --offload all "
           "--offload-tier disk --offload-dir %s --optim-in-backward", d);
  check_plan(opts);
}

LT_TEST(plan_fit_memory_finds_the_largest_batch) {
  tt_run p = tt_plan("--model cnn --fit-memory 256MiB --json");
  LT_EQ(p.rc, 0);
  double best = json_number(p.out, "largest"), peak = json_first(p.out, "peak_bytes");
  LT_TRUE(best > 1);
  LT_TRUE(peak > 0 && peak <= 256.0 * 1048576);
  tt_run_free(&p);
  tt_run a = tt_plan("--model cnn --batch %.0f --json", best);
  tt_run b = tt_plan("--model cnn --batch %.0f --json", best + 1);
  LT_EQ(a.rc, 0);
  LT_EQ(b.rc, 0);
  LT_TRUE(json_first(a.out, "peak_bytes") <= 256.0 * 1048576);
  LT_TRUE(json_first(b.out, "peak_bytes") > 256.0 * 1048576);
  tt_run_free(&a);
  tt_run_free(&b);
  /* the hidden width: the answer fits, and 1 GiB fits a wider one than 256 MiB */
  tt_run h1 = tt_plan("--hidden 100,100 --fit-memory 256MiB --fit hidden --json");
  tt_run h2 = tt_plan("--hidden 100,100 --fit-memory 1GiB --fit hidden --json");
  LT_EQ(h1.rc, 0);
  LT_EQ(h2.rc, 0);
  LT_TRUE(json_number(h2.out, "largest") > json_number(h1.out, "largest"));
  LT_TRUE(json_first(h1.out, "peak_bytes") <= 256.0 * 1048576);
  double w = json_number(h1.out, "largest");
  tt_run wider = tt_plan("--hidden %.0f,%.0f --json", w + 1, w + 1);
  LT_TRUE(json_first(wider.out, "peak_bytes") > 256.0 * 1048576);
  tt_run_free(&wider);
  /* --limit caps the batch: an epoch must hold one */
  tt_run capped = tt_plan("--limit 1000 --ranks 2 --strategy ddp --fit-memory 8GiB --json");
  LT_EQ(capped.rc, 0);
  LT_EQ(json_number(capped.out, "largest"), 500);
  tt_run_free(&capped);
  tt_run_free(&h1);
  tt_run_free(&h2);
  /* without --limit, the data's epoch caps it: 60000 Fashion-MNIST images over 2 ranks */
  tt_run epoch = tt_plan("--ranks 2 --strategy ddp --fit-memory 8GiB --json");
  LT_EQ(epoch.rc, 0);
  LT_EQ(json_number(epoch.out, "largest"), 30000);
  tt_run_free(&epoch);
  epoch = tt_plan("--fit-memory 8GiB");
  LT_TRUE(strstr(epoch.out, "60000") && strstr(epoch.out, "more than an epoch"));
  tt_run_free(&epoch);
  /* nothing fits: exit 1 with a message */
  tt_run none = tt_plan("--hidden 4096 --fit-memory 1MiB");
  LT_EQ(none.rc, 1);
  LT_TRUE(strstr(none.out, "nothing fits") != NULL);
  tt_run_free(&none);
}

LT_TEST(plan_table_and_bad_options) {
  tt_run t = tt_plan("--ranks 2 --strategy ddp --amp bf16");
  LT_EQ(t.rc, 0);
  LT_TRUE(strstr(t.out, "model and strategy") && strstr(t.out, "forward") &&
          strstr(t.out, "peak per rank"));
  tt_run_free(&t);
  const char *bad[] = {"--fit-memory 0",    "--fit-memory lots", "--fit-memory 8XB",
                       "--fit width",       "--fit-memory inf",  "--fit-memory nan",
                       "--fit-memory 1e300TiB", "--fit hidden"};
  refused_each("", bad, 8, "loom plan: --fit");
  tt_run o = tt_plan("--hidden 0");
  LT_EQ(o.rc, 2);
  LT_TRUE(strstr(o.err, "loom plan: --hidden") != NULL);
  tt_run_free(&o);
  /* under mpirun, --ranks N plans each of the N processes as a thread rank */
  tt_run m = tt_plan("--backend mpi --ranks 3 --strategy fsdp --json");
  tt_run th = tt_plan("--ranks 3 --strategy fsdp --json");
  LT_EQ(m.rc, 0);
  LT_EQ(th.rc, 0);
  /* the same plan, but the process figures (the dry run's simulated cache follows how the rank
   * threads interleave) */
  const char *pm = strstr(m.out, "\"process_peak_bytes\""), *pt = strstr(th.out, "\"process_peak_bytes\"");
  const char *em = strstr(m.out, "\"epoch_samples\""), *et = strstr(th.out, "\"epoch_samples\"");
  LT_TRUE(pm && pt && em && et);
  if (pm && pt && em && et) {
    LT_TRUE(pm - m.out == pt - th.out && strncmp(m.out, th.out, (size_t)(pm - m.out)) == 0);
    LT_TRUE(strcmp(em, et) == 0);
  }
  tt_run_free(&m);
  tt_run_free(&th);
}

/* Largest resident set of this process so far, bytes. */
static double max_rss_bytes(void) {
  struct rusage u;
  getrusage(RUSAGE_SELF, &u);
  return (double)u.ru_maxrss * 1024.0;
}

/* The plan is a dry run: a step far larger than this machine (a CNN's batch, a GPT's context)
 * is planned in a moment without its memory, the disk tier makes no file, and a run that would fail fails the plan with the
 * run's own message. */
LT_TEST(plan_is_a_dry_run) {
  double rss0 = max_rss_bytes();
  tt_run big = tt_plan("--model cnn --batch 1000000 --json");
  LT_EQ(big.rc, 0);
  LT_TRUE(json_first(big.out, "peak_bytes") > 100.0 * 1073741824.0);
  LT_TRUE(max_rss_bytes() < rss0 + 512.0 * 1048576.0);
  tt_run_free(&big);
  /* a GPT's long context: its embedding, residual adds and gradient sums write nothing either
   * (they did: 4.2 GB resident and 43 s for this plan; 67 GB for --context 1048576) */
  rss0 = max_rss_bytes();
  big = tt_plan("--model gpt --context 65536 --json");
  LT_EQ(big.rc, 0);
  LT_TRUE(json_first(big.out, "peak_bytes") > 4.0 * 1073741824.0);
  LT_TRUE(max_rss_bytes() < rss0 + 512.0 * 1048576.0);
  tt_run_free(&big);
  const char *d = tt_tempdir();
  tt_run disk = tt_plan("--ranks 2 --strategy fsdp --offload all --offload-tier disk "
                        "--offload-dir %s --json", d);
  LT_EQ(disk.rc, 0);
  LT_TRUE(json_first(disk.out, "file_bytes") > 1e6);
  DIR *dir = opendir(d);
  int files = 0;
  for (struct dirent *e; dir && (e = readdir(dir));) files += e->d_name[0] != '.';
  if (dir) closedir(dir);
  LT_EQ(files, 0);
  tt_run_free(&disk);
  tt_run missing = tt_plan("--ranks 2 --strategy fsdp --offload all --offload-tier disk "
                           "--offload-dir %s/none", d);
  LT_EQ(missing.rc, 1);
  LT_TRUE(strstr(missing.err, "loom plan: rank 0: ") && strstr(missing.err, "/none"));
  tt_run_free(&missing);
  tt_run warm = tt_plan("--epochs 1 --warmup 100000");
  LT_EQ(warm.rc, 1);
  LT_TRUE(strstr(warm.err, "--warmup 100000 is more than the") != NULL);
  tt_run_free(&warm);
  tt_cleanup();
}

/* The options only a run uses are refused by name, not ignored: --init even for a file that
 * does not exist (plan reads no weights), and the help says so. */
LT_TEST(plan_refuses_the_options_only_a_run_uses) {
  static const struct {
    const char *args, *want;
  } cases[] = {
      {"--save /tmp/loom-plan-ck", "loom plan: --save: plan writes no checkpoint"},
      {"--save /tmp/loom-plan-ck --overwrite", "loom plan: --save: plan writes no checkpoint"},
      {"--resume /tmp/loom-plan-ck", "loom plan: --resume: plan reads no checkpoint"},
      {"--metrics /tmp/loom-plan-m.jsonl", "loom plan: --metrics: plan's steps are dry"},
      {"--init /no/such/file.safetensors", "loom plan: --init: plan reads no weights"},
      {"--ranks 2 --strategy ddp --timeout 5", "loom plan: --timeout: plan's ranks run dry"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    tt_run r = tt_plan("%s", cases[i].args);
    LT_TRUE(tt_ended(&r, 2, cases[i].want, cases[i].args));
    LT_TRUE(strstr(r.err, "drop it here") != NULL);
    LT_TRUE(r.out[0] == '\0'); /* no plan printed */
    tt_run_free(&r);
  }
  tt_run h = tt_plan("--help");
  LT_EQ(h.rc, 0);
  LT_TRUE(strstr(h.out, "only a run uses, which are refused") != NULL);
  /* only the options that change a plan, with train's defaults */
  static const char *const shown[] = {"  --batch N ", "  --amp ", "  --strategy ", "  --offload ",
                                      "  --fit-memory ", "  --eval-batch N "};
  static const char *const hidden[] = {"  --lr ", "  --save ", "  --metrics ", "  --seed ",
                                       "  --timeout ", "  --epochs ", "  --progress "};
  for (size_t i = 0; i < sizeof shown / sizeof shown[0]; i++) LT_TRUE(strstr(h.out, shown[i]) != NULL);
  for (size_t i = 0; i < sizeof hidden / sizeof hidden[0]; i++)
    LT_TRUE(strstr(h.out, hidden[i]) == NULL);
  tt_run_free(&h);
  /* the others are accepted as in a train command line, and change nothing */
  tt_run a = tt_plan("--json"), b = tt_plan("--lr 0.01 --epochs 3 --seed 9 --json");
  LT_TRUE(a.rc == 0 && b.rc == 0);
  LT_EQ(json_first(a.out, "peak_bytes"), json_first(b.out, "peak_bytes"));
  tt_run_free(&a);
  tt_run_free(&b);
}

/* Past 64 ranks (ranks 64 and up share the process's memory account): 80 dry thread ranks
 * plan the peak per rank of ranks 0-63, near the 64-rank plan's (it was the process's, 6x),
 * and FSDP's one ring of 80 ranks sends 79/80 of its gathers and reduce-scatters across. */
LT_TEST(plan_hosts_past_64_ranks) {
  const char *m = "--hidden 256,128 --batch 8 --strategy fsdp --ranks-per-host 8 --json";
  tt_run a = tt_plan("%s --hosts 8", m), b = tt_plan("%s --hosts 10", m);
  LT_TRUE(a.rc == 0 && b.rc == 0);
  double pa = json_number(a.out, "peak_bytes"), pb = json_number(b.out, "peak_bytes");
  LT_TRUE(pa > 0 && pb <= pa * 1.1 && pb >= pa * 0.5);
  double g = json_number(b.out, "step_gather_bytes"), rs = json_number(b.out, "step_reduce_scatter_bytes");
  LT_TRUE(g > 0 && fabs(json_number(b.out, "link_bytes") - 79.0 / 80 * (g + rs)) <= 1);
  tt_run_free(&a), tt_run_free(&b);
}

/* --hosts H --ranks-per-host R --link GBPS: each step's bytes through a host's link from the
 * step's own collectives (rings in rank order): at 2 hosts x 2 ranks FSDP sends 3/4 of its
 * gathers and reduce-scatters across, HSDP with a shard group per host only its two replica
 * rings' all-reduces (2 x (1/2) x 2 shards: the reduce-scatter's bytes), DDP 2 x 3/4 of its
 * all-reduce; the time is the bytes at the link's rate. */
LT_TEST(plan_hosts_link_bytes_and_time) {
  const char *m = "--hidden 256,128 --amp bf16 --batch 8 --hosts 2 --ranks-per-host 2 --link 2 "
                  "--json";
  tt_run f = tt_plan("%s --strategy fsdp", m);
  tt_run h = tt_plan("%s --strategy hsdp --shard-size 2", m);
  tt_run d = tt_plan("%s --strategy ddp", m);
  LT_TRUE(f.rc == 0 && h.rc == 0 && d.rc == 0);
  double g = json_number(f.out, "step_gather_bytes"), rs = json_number(f.out, "step_reduce_scatter_bytes");
  double fl = json_number(f.out, "link_bytes"), hl = json_number(h.out, "link_bytes");
  LT_TRUE(g > 0 && rs > 0);
  LT_TRUE(fabs(fl - 0.75 * (g + rs)) <= 1);
  LT_TRUE(json_number(h.out, "step_replica_allreduce_bytes") * 2 ==
          json_number(h.out, "step_reduce_scatter_bytes"));
  LT_TRUE(fabs(hl - json_number(h.out, "step_replica_allreduce_bytes") * 2) <= 1);
  LT_TRUE(fabs(json_number(d.out, "link_bytes") - 1.5 * json_number(d.out, "step_allreduce_bytes")) <= 1);
  LT_TRUE(fabs(json_number(h.out, "link_seconds") - hl / 2.5e8) <= 1e-6);
  /* the exposed time (plan_hosts_exposed_time): the compute's rate measured without --gflops;
   * none for DDP */
  LT_TRUE(json_number(h.out, "gflops") > 0);
  LT_TRUE(strstr(h.out, "\"gflops_measured\": true") != NULL);
  LT_TRUE(json_number(h.out, "exposed_seconds") <= json_number(h.out, "comm_seconds"));
  LT_TRUE(json_number(h.out, "intra_link_gbps") > 0);
  LT_TRUE(strstr(h.out, "\"intra_link_measured\": true") != NULL);
  LT_TRUE(strstr(d.out, "exposed_seconds") == NULL);
  tt_run_free(&f), tt_run_free(&h), tt_run_free(&d);
  /* one host: nothing crosses; and the options that go together */
  tt_run one = tt_plan("--hidden 64 --strategy fsdp --hosts 1 --ranks-per-host 2 --json");
  LT_TRUE(one.rc == 0 && json_number(one.out, "link_bytes") == 0);
  tt_run_free(&one);
  static const char *bad[] = {"--strategy fsdp --hosts 2", "--strategy fsdp --link 1",
                              "--strategy fsdp --ranks 3 --hosts 2 --ranks-per-host 2",
                              "--strategy fsdp --hosts 129 --ranks-per-host 8",
                              "--strategy fsdp --gflops 10", /* --gflops without --link */
                              "--strategy fsdp --hosts 2 --ranks-per-host 1 --gflops 10",
                              "--strategy fsdp --hosts 2 --ranks-per-host 1 --link 1 --gflops 0",
                              "--strategy fsdp --intra-link 10", /* --intra-link without --link */
                              "--strategy fsdp --hosts 2 --ranks-per-host 2 --intra-link 10",
                              "--strategy fsdp --hosts 2 --ranks-per-host 2 --link 1 --intra-link 0"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    tt_run b = tt_plan("--hidden 64 %s", bad[i]);
    LT_EQ(b.rc, 2);
    tt_run_free(&b);
  }
}

/* The step's timeline (plan_step_timeline) on numbers worked by hand, in ms. FSDP, 2 units,
 * prefetch 1, the last kept for backward: forward G0 [0,10] and G1 [10,16] (issued at 0),
 * waits 10 + 2, compute to 21; backward prefetches G0 [21,31], unit 1's weight gradient to 26,
 * its reduce-scatter [31,39] behind G0 on the link, its input's gradient to 31; unit 0 waits 8
 * for that reduce-scatter (39), computes to 43, its reduce-scatter [43,63] waited for at the
 * end: 20. The link busy 54, the compute 23, exposed 10 + 2 + 8 + 20 = 40, the step 63. */
LT_TEST(plan_timeline_worked_example) {
  plan_unit_time u[2] = {{10, 20, 0, 4, false, true, false, false}, {6, 8, 0, 5, true, true, false, false}};
  plan_timeline t;
  plan_step_timeline(u, 2, 1, &t);
  LT_NEAR(t.comm_s, 54, 1e-9);
  LT_NEAR(t.compute_s, 23, 1e-9);
  LT_NEAR(t.exposed_s, 40, 1e-9);
  /* no prefetch: forward waits 10 and 6 (G1 [14,20]), backward's G0 [38,48] after unit 1's
   * reduce-scatter [30,38] waits 13, the last reduce-scatter [52,72] 20: 49 */
  plan_step_timeline(u, 2, 0, &t);
  LT_NEAR(t.comm_s, 54, 1e-9);
  LT_NEAR(t.exposed_s, 49, 1e-9);
  /* HSDP, a shard group per host: only the replica all-reduces cross. Unit 1's [14,17] is
   * hidden behind its input's gradient (to 19); unit 0's [23,35] is the last: 12 exposed */
  plan_unit_time h[2] = {{0, 0, 12, 4, false, false, true, false}, {0, 0, 3, 5, true, false, true, false}};
  plan_step_timeline(h, 2, 1, &t);
  LT_NEAR(t.comm_s, 15, 1e-9);
  LT_NEAR(t.exposed_s, 12, 1e-9);
  /* a unit whose compute hides nothing (0 s) exposes every collective */
  plan_unit_time z[2] = {{10, 20, 0, 0, false, true, false, false}, {6, 8, 0, 0, true, true, false, false}};
  plan_step_timeline(z, 2, 1, &t);
  LT_NEAR(t.exposed_s, t.comm_s, 1e-9);
}

/* HSDP with its collectives inside a host timed (--intra-link), in ms. A shard group per host:
 * the gathers and reduce-scatters on the group's clock, off the link; each replica all-reduce
 * on the replica group's, through the link, issued as its unit's reduce-scatter ends. Prefetch
 * 1: forward G0 [0,2] and G1 [2,3], waits 2, compute to 11; backward G0 [11,13], unit 1's
 * weight gradient to 16, its reduce-scatter [16,18] then its replica all-reduce [18,21], its
 * input's gradient to 21 (nothing to wait for); unit 0 computes to 25, its reduce-scatter
 * [25,29] and replica all-reduce [29,41] in series, waited for at the end: 16. Exposed 18,
 * where the same step with the local collectives free (the previous test's HSDP) exposes only
 * the last replica all-reduce (12). Collectives 2 + 1 + 2 + 2 + 3 + 4 + 12 = 26. */
LT_TEST(plan_timeline_hsdp_local_in_series) {
  plan_unit_time u[2] = {{.gather_s = 2, .reduce_s = 4, .replica_s = 12, .forward_s = 4,
                          .replica_link = true},
                         {.gather_s = 1, .reduce_s = 2, .replica_s = 3, .forward_s = 5,
                          .kept = true, .replica_link = true}};
  plan_timeline t;
  plan_step_timeline(u, 2, 1, &t);
  LT_NEAR(t.comm_s, 26, 1e-9);
  LT_NEAR(t.compute_s, 23, 1e-9);
  LT_NEAR(t.exposed_s, 18, 1e-9);
  /* The replica group runs beside the group: no prefetch, forward G0 [0,2] waits 2, compute to
   * 6, G1 [6,7] waits 1, compute to 12; backward unit 1 to 17, its reduce-scatter [17,18], its
   * replica all-reduce [18,24], its input's gradient to 22; unit 0's gather, issued at 22,
   * runs [22,24] beside that all-reduce (waits 2), unit 0 computes to 28, [28,29] and [29,35]
   * waited for at the end: 7. Exposed 2 + 1 + 2 + 7 = 12. */
  plan_unit_time v[2] = {{.gather_s = 2, .reduce_s = 1, .replica_s = 6, .forward_s = 4,
                          .replica_link = true},
                         {.gather_s = 1, .reduce_s = 1, .replica_s = 6, .forward_s = 5,
                          .kept = true, .replica_link = true}};
  plan_step_timeline(v, 2, 0, &t);
  LT_NEAR(t.comm_s, 19, 1e-9);
  LT_NEAR(t.compute_s, 23, 1e-9);
  LT_NEAR(t.exposed_s, 12, 1e-9);
  /* A shard group across hosts (its gathers through the link too): unit 0's gather waits for
   * the link until unit 1's replica all-reduce leaves it (24), runs [24,26] (waits 4), unit 0
   * computes to 30, then [30,31] and [31,37]: 7. Exposed 2 + 1 + 4 + 7 = 14. */
  v[0].group_link = v[1].group_link = true;
  plan_step_timeline(v, 2, 0, &t);
  LT_NEAR(t.comm_s, 19, 1e-9);
  LT_NEAR(t.exposed_s, 14, 1e-9);
}

/* HSDP's replica all-reduce is waited for at the end of backward, not before the next unit's:
 * the next unit waits only for the reduce-scatter that reads its local gradient (fsdp_hooks.c,
 * release_local). Prefetch 1; forward G0 [0,2] and G1 [2,3], waits 2, compute to 11; backward
 * G0 [11,13], unit 1's weight gradient to 16, its reduce-scatter [16,18] and replica
 * all-reduce [18,28], its input's gradient to 21; unit 0 waits for the reduce-scatter (18:
 * nothing), computes to 25, its reduce-scatter [25,29], its replica all-reduce after unit 1's
 * on the replica group [29,41], waited for at the end: 16. Exposed 2 + 16 = 18. With the
 * shard reduced in place into the local gradient (offloaded gradients) unit 0 waits for unit
 * 1's replica all-reduce too (to 28: 7), computes to 32, [32,36] and [36,48]: 16 at the end.
 * Exposed 2 + 7 + 16 = 25. Collectives 2 + 1 + 2 (gathers) + 2 + 4 + 10 + 12 = 33. */
LT_TEST(plan_timeline_hsdp_replica_overlaps_backward) {
  plan_unit_time u[2] = {{2, 4, 12, 4, false, false, true, false},
                         {1, 2, 10, 5, true, false, true, false}};
  for (int held = 0; held < 2; held++) {
    u[0].replica_holds_local = u[1].replica_holds_local = held;
    plan_timeline t;
    plan_step_timeline(u, 2, 1, &t);
    LT_NEAR(t.comm_s, 33, 1e-9);
    LT_NEAR(t.compute_s, 23, 1e-9);
    LT_NEAR(t.exposed_s, held ? 25 : 18, 1e-9);
  }
}

/* --intra-link: a hop between two ranks of one host at that rate. HSDP with a shard group per
 * host: the collectives' time is the link's (the replica all-reduces) plus the local rings'
 * (2 ranks: half of each gathered and reduce-scattered buffer a hop) at the intra rate.
 * FSDP's ring in rank order (0 -> 1 inside host 0, 1 -> 2 across, ...) goes at its slowest
 * hop's pace: the link's time when the hosts' insides are faster, 3/4 of the bytes at the
 * intra rate when they are slower. With compute far faster than both (--gflops 1e9), FSDP
 * hides nothing. */
LT_TEST(plan_hosts_intra_link) {
  const char *m = "--hidden 256,128 --amp bf16 --batch 8 --hosts 2 --ranks-per-host 2 --link 2 "
                  "--gflops 1e9 --json";
  tt_run h = tt_plan("%s --strategy hsdp --shard-size 2 --intra-link 0.5", m);
  LT_EQ(h.rc, 0);
  double g = json_number(h.out, "step_gather_bytes"), rs = json_number(h.out, "step_reduce_scatter_bytes");
  double local = 0.5 * (g + rs) / (0.5e9 / 8);
  LT_TRUE(g > 0 && rs > 0);
  LT_NEAR(json_number(h.out, "comm_seconds"), json_number(h.out, "link_seconds") + local, 1e-5);
  LT_TRUE(json_number(h.out, "exposed_seconds") <= json_number(h.out, "comm_seconds") + 1e-6);
  LT_TRUE(json_number(h.out, "exposed_seconds") > local);
  LT_NEAR(json_number(h.out, "intra_link_gbps"), 0.5, 1e-9);
  LT_TRUE(strstr(h.out, "\"intra_link_measured\": false") != NULL);
  tt_run_free(&h);
  /* FSDP: the hosts' insides faster than the link, then slower */
  tt_run fast = tt_plan("%s --strategy fsdp --intra-link 100", m);
  LT_EQ(fast.rc, 0);
  double fl = json_number(fast.out, "link_seconds");
  LT_NEAR(json_number(fast.out, "comm_seconds"), fl, 1e-5);
  LT_NEAR(json_number(fast.out, "exposed_seconds"), fl, 1e-5);
  tt_run_free(&fast);
  tt_run slow = tt_plan("%s --strategy fsdp --intra-link 0.5", m);
  LT_EQ(slow.rc, 0);
  double ring = 0.75 * (json_number(slow.out, "step_gather_bytes") +
                        json_number(slow.out, "step_reduce_scatter_bytes")) / (0.5e9 / 8);
  LT_NEAR(json_number(slow.out, "comm_seconds"), ring, 1e-5);
  LT_NEAR(json_number(slow.out, "exposed_seconds"), ring, 1e-5);
  LT_NEAR(json_number(slow.out, "link_seconds"), fl, 1e-9); /* the link's figure stays */
  tt_run_free(&slow);
  tt_run text = tt_plan("--hidden 64 --strategy hsdp --shard-size 2 --hosts 2 --ranks-per-host 2 "
                        "--link 1 --gflops 10 --intra-link 40");
  LT_TRUE(text.rc == 0 && strstr(text.out, "a hop inside a host at 40 Gbit/s, --intra-link") != NULL);
  tt_run_free(&text);
}

/* --link-latency-us L: each collective whose ring crosses the link waits L for each exchange
 * in turn besides its bytes: its header exchange, then its ring steps (an alpha-beta model).
 * At 2 hosts x 2 ranks, worked by hand: HSDP with a shard group per host has 3 units, each
 * with one replica all-reduce across the link (2 ranks: 1 + 2 x 1 exchanges), so 9 L; its
 * gathers and reduce-scatters stay inside the hosts and pay nothing. FSDP's ring of 4 crosses
 * the link in every collective (1 + 3 exchanges): 5 gathers (3 forward, 2 again in backward:
 * the last unit is kept) and 3 reduce-scatters, 32 L. With compute and the hosts' insides far
 * faster than the link, all of it is exposed; the link's busy time (its bytes) stays. */
LT_TEST(plan_hosts_link_latency) {
  const char *m = "--hidden 256,128 --amp bf16 --batch 8 --hosts 2 --ranks-per-host 2 --link 2 "
                  "--gflops 1e9 --intra-link 1e6 --json";
  static const char *s[2] = {"hsdp --shard-size 2", "fsdp"};
  static const double exchanges[2] = {9, 32};
  for (int k = 0; k < 2; k++) {
    tt_run a = tt_plan("%s --strategy %s", m, s[k]);
    tt_run b = tt_plan("%s --strategy %s --link-latency-us 1000", m, s[k]);
    LT_TRUE(a.rc == 0 && b.rc == 0);
    LT_NEAR(json_number(a.out, "link_latency_us"), 0, 0);
    LT_NEAR(json_number(b.out, "link_latency_us"), 1000, 0);
    LT_NEAR(json_number(b.out, "comm_seconds") - json_number(a.out, "comm_seconds"),
            exchanges[k] * 1e-3, 1e-7);
    LT_NEAR(json_number(b.out, "exposed_seconds") - json_number(a.out, "exposed_seconds"),
            exchanges[k] * 1e-3, 1e-5);
    LT_NEAR(json_number(b.out, "link_seconds"), json_number(a.out, "link_seconds"), 0);
    tt_run_free(&a), tt_run_free(&b);
  }
  tt_run text = tt_plan("--hidden 64 --strategy hsdp --shard-size 2 --hosts 2 --ranks-per-host 2 "
                        "--link 1 --gflops 10 --link-latency-us 250");
  LT_TRUE(text.rc == 0 &&
          strstr(text.out, "250 us an exchange across the link, --link-latency-us") != NULL);
  tt_run_free(&text);
  /* refused: negative, not a number, too large, and without --link */
  static const char *bad[] = {"--hosts 2 --ranks-per-host 2 --link 1 --link-latency-us -1",
                              "--hosts 2 --ranks-per-host 2 --link 1 --link-latency-us x",
                              "--hosts 2 --ranks-per-host 2 --link 1 --link-latency-us 1e8",
                              "--hosts 2 --ranks-per-host 2 --link-latency-us 10",
                              "--link-latency-us 10"};
  refused_each("--hidden 64 --strategy fsdp", bad, sizeof bad / sizeof *bad, "--link-latency-us");
}

/* The plan's units are the run's: their gathers (each unit twice but the kept last one, in
 * bf16) and reduce-scatters (f32) add up to the dry run's own counters. */
LT_TEST(plan_units_add_up_to_the_step_bytes) {
  train_opts o;
  static train_cmdline c;
  train_cli_defaults(&o, &c);
  o.nhidden = 2, o.hidden[0] = 256, o.hidden[1] = 128;
  o.amp = "bf16", o.strategy = "fsdp", o.ranks = 4, o.batch = 8;
  c.cmd = "loom plan";
  LT_EQ(train_opts_check(&o, &c), 0);
  plan_result *r = calloc(1, sizeof *r);
  LT_TRUE(r != NULL);
  LT_OK(train_plan(&o, r));
  LT_EQ(r->nunits, 3);
  double g = 0, rs = 0;
  for (size_t i = 0; i < r->nunits; i++) {
    g += (double)r->unit[i].padded * 2 * (r->unit[i].kept ? 1 : 2);
    rs += (double)r->unit[i].padded * 4;
    LT_EQ(r->unit[i].shard * 4, r->unit[i].padded);
  }
  LT_TRUE(r->unit[2].kept && !r->unit[0].kept && !r->unit[1].kept);
  LT_NEAR(g, (double)r->gather_bytes, 0);
  LT_NEAR(rs, (double)r->reduce_scatter_bytes, 0);
  free(r);
}

/* `loom plan --link --gflops`: the exposed time is at most the link's; with compute far faster
 * than the link (1e9 GFLOP/s) nothing hides, so it is all of it; slower compute hides more.
 * (Without --gflops the rate is measured, DDP has no timeline, and --gflops without --link or
 * not positive is refused: plan_hosts_link_bytes_and_time.) */
LT_TEST(plan_hosts_exposed_time) {
  const char *m = "--hidden 256,128 --amp bf16 --batch 8 --hosts 2 --ranks-per-host 2 --link 1 "
                  "--json";
  tt_run fast = tt_plan("%s --strategy fsdp --gflops 1e9", m);
  tt_run slow = tt_plan("%s --strategy fsdp --gflops 0.05", m);
  LT_TRUE(fast.rc == 0 && slow.rc == 0);
  double link = json_number(fast.out, "link_seconds");
  LT_NEAR(json_number(fast.out, "exposed_seconds"), link, link * 1e-3);
  double e = json_number(slow.out, "exposed_seconds");
  LT_TRUE(e > 0 && e < 0.8 * link);
  LT_TRUE(json_number(slow.out, "compute_seconds") > 0.05);
  LT_TRUE(strstr(slow.out, "\"gflops_measured\": false") != NULL);
  tt_run_free(&fast), tt_run_free(&slow);
  tt_run text = tt_plan("--hidden 64 --strategy fsdp --hosts 2 --ranks-per-host 1 --link 1 "
                        "--gflops 10");
  LT_TRUE(text.rc == 0 && strstr(text.out, "exposed communication per step: ") != NULL);
  tt_run_free(&text);
}
