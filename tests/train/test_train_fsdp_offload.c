/* test_train_fsdp_offload.c: `loom train --strategy fsdp --offload ...` (ranks as threads).
 * Offload moves bytes and nothing else, so every run here ends with the model file, byte for
 * byte, of the same run without offload: host and disk tiers, prefetch 0, 1 and 10, 1 and 16
 * I/O threads (--offload-io-threads), all kinds of bytes or some, f32 and f16 mixed
 * precision; a run interrupted (--max-steps) without offload and resumed with it, or the reverse, ends as the uninterrupted run (the offload options are
 * not part of the resume fingerprint). The disk tier leaves
 * no file in --offload-dir; the summary and the metrics report the offload figures; the
 * offload options are checked, each error naming the option (or the folder). */
#include "lt.h"
#include "train_test.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define RUN "--hidden 48,32 --limit 768 --epochs 1 --threads 1 --seed 5 --quiet --batch 32 " \
            "--ranks 2 --strategy fsdp"

/* Entries of a folder other than . and .. (-1 if it cannot be read). */
static int files_in(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return -1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) n++;
  closedir(d);
  return n;
}

/* RUN with `amp` and `extra` saved to d/name; its model file against d/base's. */
static void expect_same_model(const char *d, const char *amp, const char *name, const char *extra) {
  tt_run r = tt_train(RUN " --amp %s --save %s/%s %s", amp, d, name, extra);
  if (r.rc) fprintf(stderr, "%s (--amp %s): rc %d: %s", name, amp, r.rc, r.err);
  LT_EQ(r.rc, 0);
  /* it did offload: bytes went to the tier and back */
  LT_TRUE(strstr(r.out, "loom train: offload: ") && !strstr(r.out, ", 0 B moved"));
  char a[512], b[512];
  snprintf(a, sizeof a, "%s/base/model.safetensors", d);
  snprintf(b, sizeof b, "%s/%s/model.safetensors", d, name);
  if (!tt_same_file(a, b))
    lt_fail_at(__FILE__, __LINE__, "%s (--amp %s): the model differs from the run without offload",
               name, amp);
  tt_run_free(&r);
}

/* A fresh folder d with d/tier (into tier, cap bytes) and d/base, the run without offload. */
static const char *base_run(const char *amp, char *tier, size_t cap) {
  const char *d = tt_tempdir();
  snprintf(tier, cap, "%s/tier", d);
  LT_EQ(mkdir(tier, 0700), 0);
  tt_run base = tt_train(RUN " --amp %s --save %s/base", amp, d);
  LT_EQ(base.rc, 0);
  tt_run_free(&base);
  return d;
}

LT_TEST(train_fsdp_offload_is_bitwise) {
  const char *amps[] = {"off", "f16"};
  for (int i = 0; i < 2; i++) {
    char tier[512], extra[700];
    const char *d = base_run(amps[i], tier, sizeof tier);
    expect_same_model(d, amps[i], "host", "--offload all");
    expect_same_model(d, amps[i], "host0", "--offload all --prefetch 0");
    expect_same_model(d, amps[i], "some", "--offload params,optim --prefetch 10");
    snprintf(extra, sizeof extra, "--offload all --offload-tier disk --offload-dir %s", tier);
    expect_same_model(d, amps[i], "disk", extra);
    LT_EQ(files_in(tier), 0); /* the disk tier's files are gone */
    snprintf(extra, sizeof extra, "--offload all --offload-tier disk --offload-dir %s --prefetch 0",
             tier);
    expect_same_model(d, amps[i], "disk0", extra);
    LT_EQ(files_in(tier), 0);
    /* the I/O threads change when bytes move, never which: one, and the most */
    snprintf(extra, sizeof extra, "--offload all --offload-tier disk --offload-dir %s "
             "--offload-io-threads 1", tier);
    expect_same_model(d, amps[i], "disk-io1", extra);
    snprintf(extra, sizeof extra, "--offload all --offload-tier disk --offload-dir %s "
             "--offload-io-threads 16 --prefetch 10", tier);
    expect_same_model(d, amps[i], "disk-io16", extra);
    LT_EQ(files_in(tier), 0);
    expect_same_model(d, amps[i], "host-io16", "--offload all --offload-io-threads 16");
    tt_cleanup();
  }
}

LT_TEST(train_fsdp_offload_reports_its_figures) {
  const char *d = tt_tempdir();
  char tier[512];
  snprintf(tier, sizeof tier, "%s/tier", d);
  LT_EQ(mkdir(tier, 0700), 0);
  tt_run r = tt_train(RUN " --offload all --offload-tier disk --offload-dir %s "
                      "--metrics %s/m.jsonl", tier, d);
  LT_EQ(r.rc, 0);
  LT_TRUE(strstr(r.out, "loom train: offload: disk tier, ") != NULL);
  LT_TRUE(strstr(r.out, " moved, exposed wait ") != NULL);
  LT_TRUE(strstr(r.out, "; peak RSS ") != NULL);
  char path[600];
  snprintf(path, sizeof path, "%s/m.jsonl", d);
  size_t n = 0;
  char *m = tt_read_file(path, &n);
  const char *keys[] = {"\"rank_compute_peak_bytes\": ", "\"rank_host_bytes\": ",
                        "\"rank_host_peak_bytes\": ", "\"rank_file_bytes\": ",
                        "\"rank_file_peak_bytes\": ", "\"peak_rss_bytes\": ",
                        "\"fsdp_offload_bytes\": ", "\"fsdp_offload_to_bytes\": ",
                        "\"fsdp_offload_from_bytes\": ", "\"fsdp_offload_transfer_s\": ",
                        "\"fsdp_offload_wait_s\": "};
  for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
    if (!m || !strstr(m, keys[i])) lt_fail_at(__FILE__, __LINE__, "the metrics lack %s", keys[i]);
  /* bytes went to the disk tier and came back, through this rank's file pool */
  const char *to = m ? strstr(m, "\"fsdp_offload_to_bytes\": ") : NULL;
  const char *file = m ? strstr(m, "\"rank_file_peak_bytes\": ") : NULL;
  LT_TRUE(to && strtoull(to + strlen("\"fsdp_offload_to_bytes\": "), NULL, 10) > 0);
  LT_TRUE(file && strtoull(file + strlen("\"rank_file_peak_bytes\": "), NULL, 10) > 0);
  free(m);
  tt_run_free(&r);
  /* without offload: no offload line, no offload members */
  r = tt_train(RUN " --metrics %s/plain.jsonl", d);
  LT_EQ(r.rc, 0);
  LT_TRUE(strstr(r.out, "offload") == NULL);
  snprintf(path, sizeof path, "%s/plain.jsonl", d);
  m = tt_read_file(path, &n);
  LT_TRUE(m && strstr(m, "fsdp_units") && !strstr(m, "offload") && !strstr(m, "peak_rss"));
  free(m);
  tt_run_free(&r);
  tt_cleanup();
}

/* The number after the last `"key": ` in s, -1 if absent. */
static double last_number(const char *s, const char *key) {
  char pat[96];
  snprintf(pat, sizeof pat, "\"%s\": ", key);
  const char *p = NULL, *q = s;
  while (q && (q = strstr(q, pat))) p = q++;
  return p ? strtod(p + strlen(pat), NULL) : -1;
}

/* Every record of a metrics file has the host pool (the offload figure) at exactly 0. */
static void expect_host_pool_zero(const char *path) {
  size_t n = 0;
  char *m = tt_read_file(path, &n);
  LT_TRUE(m != NULL);
  const char *zero = "\"host\": {\"current_bytes\": 0, \"peak_bytes\": 0}";
  int records = 0;
  for (const char *line = m; line && *line; records++) {
    const char *end = strchr(line, '\n'), *h = strstr(line, "\"host\": {");
    if (!h || (end && h > end) || strncmp(h, zero, strlen(zero)) != 0) {
      lt_fail_at(__FILE__, __LINE__, "%s, record %d: the host pool is not 0: %.80s", path,
                 records + 1, h ? h : line);
      break;
    }
    line = end ? end + 1 : NULL;
  }
  LT_TRUE(records > 0);
  free(m);
}

/* The host pool counts offloaded bytes and nothing else (loom/alloc.h): 0 in every record of
 * a run without offload (FSDP, DDP, one process); with everything offloaded to the host tier,
 * each rank's host pool after the run holds exactly the tier's bytes, which are the plan's
 * "offloaded per rank" figure, and the summary says so. */
LT_TEST(train_host_pool_is_the_offload_figure) {
  const char *d = tt_tempdir();
  const char *plain[] = {RUN, "--hidden 48,32 --limit 768 --epochs 1 --threads 1 --seed 5 "
                              "--quiet --batch 32 --ranks 2 --strategy ddp",
                         "--hidden 48,32 --limit 256 --epochs 1 --threads 1 --seed 5 --quiet "
                         "--batch 32"};
  char path[600];
  for (int i = 0; i < 3; i++) {
    snprintf(path, sizeof path, "%s/plain%d.jsonl", d, i);
    tt_run r = tt_train("%s --metrics %s", plain[i], path);
    LT_EQ(r.rc, 0);
    tt_run_free(&r);
    expect_host_pool_zero(path);
  }
  snprintf(path, sizeof path, "%s/host.jsonl", d);
  tt_run r = tt_train(RUN " --offload all --metrics %s", path);
  LT_EQ(r.rc, 0);
  size_t n = 0;
  char *m = tt_read_file(path, &n);
  double held = m ? last_number(m, "rank_host_bytes") : -1;
  LT_TRUE(held > 0);
  LT_EQ(held, last_number(m, "fsdp_offload_bytes"));
  tt_run p = tt_plan(RUN " --offload all --json");
  LT_EQ(p.rc, 0);
  LT_EQ(held, last_number(p.out, "host_bytes"));
  char said[64];
  snprintf(said, sizeof said, "loom train: offload: host tier, %.0f B offloaded, ", held);
  if (held < 1024 * 1024) LT_TRUE(strstr(r.out, said) != NULL);
  free(m);
  tt_run_free(&p);
  tt_run_free(&r);
  tt_cleanup();
}

/* Interrupted without offload, resumed with it (and the reverse, and with other I/O threads):
 * the uninterrupted run's model. */
LT_TEST(train_fsdp_resume_with_offload_is_bitwise_f16) {
  const char *d = tt_tempdir();
  const char *common = "--hidden 40 --limit 768 --epochs 2 --threads 1 --seed 3 --quiet "
                       "--batch 32 --ranks 2 --strategy fsdp --amp f16";
  char tier[512];
  snprintf(tier, sizeof tier, "%s/tier", d);
  LT_EQ(mkdir(tier, 0700), 0);
  tt_run whole = tt_train("%s --save %s/whole", common, d);
  tt_run part = tt_train("%s --save %s/part --max-steps 17", common, d);
  tt_run rest = tt_train("%s --resume %s/part --save %s/part --offload all --offload-tier disk "
                         "--offload-dir %s", common, d, d, tier);
  tt_run part2 = tt_train("%s --save %s/part2 --max-steps 9 --offload all", common, d);
  tt_run rest2 = tt_train("%s --resume %s/part2 --save %s/part2", common, d, d);
  /* the I/O threads are not recorded either: 1 before the interruption, 16 after */
  tt_run part3 = tt_train("%s --save %s/part3 --max-steps 9 --offload all --offload-io-threads 1",
                          common, d);
  tt_run rest3 = tt_train("%s --resume %s/part3 --save %s/part3 --offload all --offload-tier disk "
                          "--offload-dir %s --offload-io-threads 16", common, d, d, tier);
  LT_EQ(whole.rc, 0);
  LT_EQ(part.rc, 0);
  LT_EQ(rest.rc, 0);
  if (rest.rc) fprintf(stderr, "%s", rest.err);
  LT_EQ(part2.rc, 0);
  LT_EQ(rest2.rc, 0);
  LT_EQ(part3.rc, 0);
  LT_EQ(rest3.rc, 0);
  if (rest3.rc) fprintf(stderr, "%s", rest3.err);
  LT_TRUE(strstr(rest.out, "resumed") || strstr(rest.out, "after 24 steps"));
  char a[512], b[512];
  snprintf(a, sizeof a, "%s/whole/model.safetensors", d);
  snprintf(b, sizeof b, "%s/part/model.safetensors", d);
  LT_TRUE(tt_same_file(a, b));
  snprintf(b, sizeof b, "%s/part2/model.safetensors", d);
  LT_TRUE(tt_same_file(a, b));
  snprintf(b, sizeof b, "%s/part3/model.safetensors", d);
  LT_TRUE(tt_same_file(a, b));
  LT_EQ(files_in(tier), 0);
  tt_run_free(&whole);
  tt_run_free(&part);
  tt_run_free(&rest);
  tt_run_free(&part2);
  tt_run_free(&rest2);
  tt_run_free(&part3);
  tt_run_free(&rest3);
  tt_cleanup();
}

typedef struct offload_case {
  const char *args, *want;
  int rc;
} offload_case;

LT_TEST(train_fsdp_offload_options) {
  const char *d = tt_tempdir();
  char missing[512], file[512], args[2][700];
  snprintf(missing, sizeof missing, "%s/no-such-folder", d);
  snprintf(file, sizeof file, "%s/a-file", d);
  LT_EQ(tt_write_file(file, "x", 1), 0);
  snprintf(args[0], sizeof args[0], "--strategy fsdp --offload all --offload-tier disk "
           "--offload-dir %s", missing);
  snprintf(args[1], sizeof args[1], "--strategy fsdp --offload all --offload-tier disk "
           "--offload-dir %s", file);
  char want[2][700];
  snprintf(want[0], sizeof want[0], "--offload-dir %s: cannot use the folder", missing);
  snprintf(want[1], sizeof want[1], "--offload-dir %s: not a folder", file);
  const offload_case cases[] = {
      {"--strategy fsdp --offload bogus",
       "--offload: expected all, none or a comma list of params,grads,optim, got 'bogus'", 2},
      {"--strategy fsdp --offload params,,optim", "got 'params,,optim': an item is missing", 2},
      {"--strategy fsdp --offload grads,grads", "got 'grads,grads': grads is named twice", 2},
      {"--strategy fsdp --offload all --offload-tier disk",
       "--offload-tier disk: the disk tier needs --offload-dir DIR", 2},
      {"--strategy fsdp --offload all --offload-tier ssd",
       "--offload-tier: expected one of host|disk, got 'ssd'", 2},
      {"--strategy fsdp --offload all --offload-dir /tmp", "--offload-dir: only for --offload-tier disk", 2},
      {"--strategy fsdp --offload all --offload-tier host --offload-dir /tmp",
       "--offload-dir: only for --offload-tier disk", 2},
      {"--strategy fsdp --offload all --prefetch 11", "--prefetch: expected at most 10, got '11'", 2},
      {"--strategy fsdp --offload all --prefetch -1", "--prefetch: expected an integer >= 0, got '-1'", 2},
      {"--strategy fsdp --prefetch 2", "--prefetch: offload is off in this run (--offload none)", 2},
      {"--strategy fsdp --offload none --offload-tier host", "--offload-tier: offload is off", 2},
      {"--offload all", "--offload: an FSDP option; it needs --strategy fsdp", 2},
      {"--strategy ddp --offload-tier disk", "--offload-tier: an FSDP option; it needs --strategy fsdp", 2},
      {"--offload-dir /tmp", "--offload-dir: an FSDP option; it needs --strategy fsdp", 2},
      {"--prefetch 1", "--prefetch: an FSDP option; it needs --strategy fsdp", 2},
      {"--strategy fsdp --offload all --offload-io-threads 17",
       "--offload-io-threads: expected at most 16, got '17'", 2},
      {"--strategy fsdp --offload all --offload-io-threads -1",
       "--offload-io-threads: expected an integer >= 0, got '-1'", 2},
      {"--strategy fsdp --offload all --offload-io-threads two",
       "--offload-io-threads: expected an integer, got 'two'", 2},
      {"--strategy fsdp --offload-io-threads 2",
       "--offload-io-threads: offload is off in this run (--offload none)", 2},
      {"--offload-io-threads 2", "--offload-io-threads: an FSDP option; it needs --strategy fsdp", 2},
      {args[0], want[0], 1},
      {args[1], want[1], 1},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    tt_run r = tt_train("--hidden 16 --limit 128 --batch 32 --epochs 1 --threads 1 --quiet "
                        "--ranks 2 %s", cases[i].args);
    if (r.rc != cases[i].rc || !strstr(r.err, cases[i].want))
      fprintf(stderr, "case '%s': rc %d, stderr \"%s\" (want %d, \"%s\")\n", cases[i].args, r.rc,
              r.err, cases[i].rc, cases[i].want);
    LT_EQ(r.rc, cases[i].rc);
    LT_TRUE(strstr(r.err, cases[i].want) != NULL);
    LT_TRUE(strstr(r.out, "test accuracy") == NULL); /* refused before training */
    tt_run_free(&r);
  }
  tt_cleanup();
}

/* --offload-dir /proc: a folder that exists but takes no regular files is said to be one (with
 * the errno text), before training, not "does not exist" from the first offload. */
LT_TEST(train_offload_dir_that_takes_no_files) {
  struct stat st;
  if (stat("/proc", &st) != 0 || !S_ISDIR(st.st_mode)) {
    lt_skip("no /proc");
    return;
  }
  tt_run r = tt_train("--hidden 16 --limit 128 --batch 32 --epochs 1 --threads 1 --quiet "
                      "--ranks 2 --strategy fsdp --offload all --offload-tier disk "
                      "--offload-dir /proc");
  LT_TRUE(tt_ended(&r, 1, "--offload-dir /proc: the folder takes no regular files", "/proc"));
  LT_TRUE(strstr(r.err, "No such file or directory") != NULL);
  LT_TRUE(strstr(r.err, "does not exist") == NULL);
  LT_TRUE(strstr(r.out, "test accuracy") == NULL);
  tt_run_free(&r);
}

/* SGD without momentum keeps no optimizer state: optim named in --offload is refused (it would
 * move 0 B), and --offload all says in its header that optim has nothing to move. */
LT_TEST(train_offload_optim_without_optimizer_state) {
  const char *run = "--hidden 16 --limit 128 --batch 32 --epochs 1 --threads 1 --ranks 2 "
                    "--strategy fsdp --optim sgd --momentum 0";
  const char *lists[] = {"optim", "grads,optim"};
  for (int i = 0; i < 2; i++) {
    tt_run r = tt_train("%s --offload %s", run, lists[i]);
    char want[160];
    snprintf(want, sizeof want, "--offload %s: --optim sgd with --momentum 0 keeps no optimizer "
             "state, so optim would offload nothing", lists[i]);
    LT_TRUE(tt_ended(&r, 2, want, lists[i]));
    tt_run_free(&r);
  }
  tt_run a = tt_train("%s --offload all", run);
  LT_EQ(a.rc, 0);
  LT_TRUE(strstr(a.out, "offload params,grads,optim (none: SGD without momentum keeps no "
                        "state) to the host tier") != NULL);
  tt_run_free(&a);
  tt_run m = tt_train("%s --momentum 0.9 --offload optim --quiet", run); /* state: accepted */
  LT_EQ(m.rc, 0);
  tt_run_free(&m);
}

/* The number after `"key": ` in the record-th line (1-based) of a metrics file's text, -1. */
static double record_number(const char *text, int record, const char *key) {
  const char *line = text;
  for (int i = 1; i < record && line; i++) {
    line = strchr(line, '\n');
    if (line) line++;
  }
  if (!line || !*line) return -1;
  const char *end = strchr(line, '\n');
  char pat[96];
  snprintf(pat, sizeof pat, "\"%s\": ", key);
  const char *p = strstr(line, pat);
  return p && (!end || p < end) ? strtod(p + strlen(pat), NULL) : -1;
}

/* `loom plan`'s offload traffic per step and rank (the dry run's second step) is the bytes a
 * real run's second step moves (its metrics' counters, record 2 less record 1), exactly: with
 * the low-precision parameter copy (bf16, disk and host tiers: the gathers read the copy, the
 * step writes it), without it (f32), and with the optimizer step inside backward. */
LT_TEST(train_plan_offload_traffic_is_the_runs) {
  const char *d = tt_tempdir();
  char tier[512];
  snprintf(tier, sizeof tier, "%s/tier", d);
  LT_EQ(mkdir(tier, 0700), 0);
  char disk[700];
  snprintf(disk, sizeof disk, "--offload all --offload-tier disk --offload-dir %s", tier);
  char disk_oib[760];
  snprintf(disk_oib, sizeof disk_oib, "%s --optim-in-backward", disk);
  const char *cases[][2] = {{"bf16", disk}, {"bf16", "--offload all"}, {"off", disk},
                            {"bf16", "--offload params --prefetch 0"}, {"bf16", disk_oib},
                            {"off", "--offload all --optim-in-backward"}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char path[600];
    snprintf(path, sizeof path, "%s/m%zu.jsonl", d, i);
    tt_run r = tt_train(RUN " --amp %s %s --max-steps 3 --metrics %s", cases[i][0], cases[i][1],
                        path);
    LT_EQ(r.rc, 0);
    tt_run p = tt_plan(RUN " --amp %s %s --json", cases[i][0], cases[i][1]);
    LT_EQ(p.rc, 0);
    size_t n = 0;
    char *m = tt_read_file(path, &n);
    LT_TRUE(m != NULL);
    double rd = record_number(m, 2, "fsdp_offload_from_bytes") -
                record_number(m, 1, "fsdp_offload_from_bytes");
    double wr = record_number(m, 2, "fsdp_offload_to_bytes") -
                record_number(m, 1, "fsdp_offload_to_bytes");
    double prd = last_number(p.out, "step_offload_read_bytes");
    double pwr = last_number(p.out, "step_offload_write_bytes");
    if (!(rd > 0 && rd == prd && wr == pwr))
      lt_fail_at(__FILE__, __LINE__, "--amp %s %s: the run's second step read %.0f and wrote %.0f "
                 "bytes, the plan says %.0f and %.0f", cases[i][0], cases[i][1], rd, wr, prd, pwr);
    free(m);
    tt_run_free(&p);
    tt_run_free(&r);
  }
  LT_EQ(files_in(tier), 0);
  tt_cleanup();
}

/* --optim-in-backward: the model of the run without it, byte for byte (f32 and bf16, without
 * offload and with everything offloaded to either tier); refused with a message with dynamic
 * loss scaling (--amp f16's default) and without FSDP. */
LT_TEST(train_fsdp_optim_in_backward_is_bitwise) {
  const char *amps[] = {"off", "bf16"};
  for (int i = 0; i < 2; i++) {
    char tier[512], extra[700];
    const char *d = base_run(amps[i], tier, sizeof tier);
    tt_run plain = tt_train(RUN " --amp %s --save %s/plain --optim-in-backward", amps[i], d);
    LT_EQ(plain.rc, 0);
    char a[512], b[512];
    snprintf(a, sizeof a, "%s/base/model.safetensors", d);
    snprintf(b, sizeof b, "%s/plain/model.safetensors", d);
    LT_TRUE(tt_same_file(a, b));
    tt_run_free(&plain);
    expect_same_model(d, amps[i], "host-oib", "--offload all --optim-in-backward");
    snprintf(extra, sizeof extra, "--offload all --offload-tier disk --offload-dir %s "
             "--optim-in-backward", tier);
    expect_same_model(d, amps[i], "disk-oib", extra);
    LT_EQ(files_in(tier), 0);
    tt_cleanup();
  }
  tt_run f16 = tt_train(RUN " --amp f16 --optim-in-backward");
  LT_EQ(f16.rc, 2);
  LT_TRUE(strstr(f16.err, "--optim-in-backward") && strstr(f16.err, "--scaler dynamic"));
  tt_run_free(&f16);
  tt_run ddp = tt_train("--hidden 48 --limit 256 --ranks 2 --strategy ddp --optim-in-backward");
  LT_EQ(ddp.rc, 2);
  LT_TRUE(strstr(ddp.err, "--optim-in-backward: an FSDP option") != NULL);
  tt_run_free(&ddp);
}
