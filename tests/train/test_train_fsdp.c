/* test_train_fsdp.c: `loom train --strategy fsdp` (ranks as threads). In f32, FSDP and DDP on
 * the same ranks reduce the same per-rank gradients and step AdamW on the same values, shard by
 * shard: their model files agree to f32 summation order (1e-4 after 8 steps of ~lr = 1e-3,
 * as for DDP against one process). A run interrupted by --max-steps and resumed from its
 * sharded checkpoint writes the same model file, byte for byte, as an uninterrupted one (f16
 * mixed precision: the loss scale is restored too). The metrics carry per-rank memory and the
 * FSDP statistics; FSDP's options are checked. */
#include "lt.h"
#include "train_test.h"

#include <loom/io.h>
#include <stdlib.h>
#include <string.h>

/* f32 on the threads backend: the ranks' shards are slices of one buffer per unit
 * (fsdp_share.c) unless the step runs in backward or LOOM_FSDP_SHARE_GATHERS=0. A run resumed
 * from its sharded checkpoint (each rank loading its slice) writes the model of the whole run,
 * byte for byte, shared or not, with the step after or in backward. */
LT_TEST(train_fsdp_resume_shared_shards_is_bitwise_f32) {
  const char *d = tt_tempdir();
  const char *common = "--hidden 40 --limit 768 --epochs 2 --threads 1 --seed 3 --quiet "
                       "--batch 32 --ranks 2 --strategy fsdp";
  char want[512], got[512];
  snprintf(want, sizeof want, "%s/whole/model.safetensors", d);
  setenv("LOOM_FSDP_SHARE_GATHERS", "0", 1);
  tt_run whole = tt_train("%s --save %s/whole", common, d);
  unsetenv("LOOM_FSDP_SHARE_GATHERS");
  LT_EQ(whole.rc, 0);
  tt_run_free(&whole);
  for (int v = 0; v < 4; v++) {
    const char *oib = v & 1 ? "--optim-in-backward" : "";
    if (v & 2) setenv("LOOM_FSDP_SHARE_GATHERS", "0", 1);
    tt_run part = tt_train("%s %s --save %s/p%d --max-steps 17", common, oib, d, v);
    tt_run rest = tt_train("%s %s --resume %s/p%d --save %s/p%d", common, oib, d, v, d, v);
    unsetenv("LOOM_FSDP_SHARE_GATHERS");
    LT_EQ(part.rc, 0);
    LT_EQ(rest.rc, 0);
    if (rest.rc) fprintf(stderr, "%s", rest.err);
    snprintf(got, sizeof got, "%s/p%d/model.safetensors", d, v);
    if (!tt_same_file(want, got))
      lt_fail_at(__FILE__, __LINE__, "resumed, %s, shared %d: not the whole run's model",
                 v & 1 ? "step in backward" : "step after backward", !(v & 2));
    tt_run_free(&part);
    tt_run_free(&rest);
  }
  tt_cleanup();
}

LT_TEST(train_fsdp_matches_ddp_on_the_same_ranks) {
  const char *d = tt_tempdir();
  const char *common = "--hidden 48,32 --limit 1024 --epochs 2 --threads 1 --seed 7 --quiet "
                       "--batch 64 --ranks 2";
  tt_run ddp = tt_train("%s --strategy ddp --save %s/ddp", common, d);
  tt_run fsdp = tt_train("%s --strategy fsdp --save %s/fsdp --metrics %s/m.jsonl", common, d, d);
  LT_EQ(ddp.rc, 0);
  LT_EQ(fsdp.rc, 0);
  if (fsdp.rc) fprintf(stderr, "%s", fsdp.err);
  char a[512], b[512];
  snprintf(a, sizeof a, "%s/ddp/model.safetensors", d);
  snprintf(b, sizeof b, "%s/fsdp/model.safetensors", d);
  double diff = tt_model_diff(a, b);
  if (!(diff <= 1e-4)) lt_fail_at(__FILE__, __LINE__, "parameters differ by %g", diff);
  /* the same summary: the same accuracy */
  const char *acc_d = strstr(ddp.out, "test accuracy"), *acc_f = strstr(fsdp.out, "test accuracy");
  LT_TRUE(acc_d && acc_f && strncmp(acc_d, acc_f, 22) == 0);
  LT_TRUE(strstr(fsdp.out, "per rank") != NULL);
  snprintf(a, sizeof a, "%s/m.jsonl", d);
  size_t mn = 0;
  char *m = tt_read_file(a, &mn);
  LT_TRUE(m && strstr(m, "\"fsdp_units\": 3,") && strstr(m, "\"fsdp_exposed_s\": ") &&
          strstr(m, "\"rank_compute_peak_bytes\": "));
  free(m);
  tt_run_free(&ddp);
  tt_run_free(&fsdp);
  tt_cleanup();
}

LT_TEST(train_fsdp_resume_is_bitwise_f16) {
  const char *d = tt_tempdir();
  const char *common = "--hidden 40 --limit 768 --epochs 2 --threads 1 --seed 3 --quiet "
                       "--batch 32 --ranks 2 --strategy fsdp --amp f16";
  tt_run whole = tt_train("%s --save %s/whole", common, d);
  tt_run part = tt_train("%s --save %s/part --max-steps 17", common, d);
  tt_run rest = tt_train("%s --resume %s/part --save %s/part", common, d, d);
  LT_EQ(whole.rc, 0);
  LT_EQ(part.rc, 0);
  LT_EQ(rest.rc, 0);
  if (rest.rc) fprintf(stderr, "%s", rest.err);
  char a[512], b[512];
  snprintf(a, sizeof a, "%s/whole/model.safetensors", d);
  snprintf(b, sizeof b, "%s/part/model.safetensors", d);
  LT_TRUE(tt_same_file(a, b));
  /* a DDP checkpoint folder is not an FSDP one */
  tt_run ddp = tt_train("--hidden 40 --limit 768 --epochs 1 --threads 1 --quiet --batch 32 "
                        "--ranks 2 --strategy ddp --save %s/ddp", d);
  tt_run wrong = tt_train("--hidden 40 --limit 768 --epochs 1 --threads 1 --quiet --batch 32 "
                          "--ranks 2 --strategy fsdp --resume %s/ddp", d);
  LT_EQ(ddp.rc, 0);
  LT_TRUE(tt_ended(&wrong, 2, "--strategy fsdp: the run in ", "fsdp from ddp"));
  LT_TRUE(strstr(wrong.err, "trained with --strategy ddp") != NULL);
  tt_run_free(&whole);
  tt_run_free(&part);
  tt_run_free(&rest);
  tt_run_free(&ddp);
  tt_run_free(&wrong);
  tt_cleanup();
}

LT_TEST(train_fsdp_options) {
  const char *run = "--hidden 32 --limit 512 --batch 32 --epochs 1 --threads 1 --quiet";
  tt_run r = tt_train("%s --ranks 3 --strategy fsdp --amp bf16 --wrap size --unit-min 1000 "
                      "--reshard-after-forward no --gather-prefetch 2", run);
  LT_EQ(r.rc, 0);
  if (r.rc) fprintf(stderr, "%s", r.err);
  tt_run_free(&r);
  r = tt_train("%s --ranks 2 --strategy fsdp --amp bf16", run);
  LT_EQ(r.rc, 0);
  LT_TRUE(strstr(r.out, "overflow steps skipped") == NULL); /* bf16: no loss scaling */
  tt_run_free(&r);
  r = tt_train("%s --wrap size", run);
  LT_EQ(r.rc, 2);
  LT_TRUE(strstr(r.err, "--wrap: an FSDP option; it needs --strategy fsdp") != NULL);
  tt_run_free(&r);
  r = tt_train("%s --strategy fsdp --unit-min 10", run);
  LT_EQ(r.rc, 2);
  LT_TRUE(strstr(r.err, "--unit-min") != NULL);
  tt_run_free(&r);
  r = tt_train("%s --strategy fsdp --gather-prefetch 9", run);
  LT_EQ(r.rc, 2);
  tt_run_free(&r);
  r = tt_train("%s --strategy fsdp --amp f16 --scaler static", run);
  LT_EQ(r.rc, 2);
  LT_TRUE(strstr(r.err, "--scaler static") != NULL);
  tt_run_free(&r);
}

/* The CNN is one Sequential of modules (pooling and flattening too), so FSDP's size policy,
 * which puts every parameter in the root's unit, sees its forward: it trains, as the
 * per-layer units do, to the same model as DDP. */
LT_TEST(train_fsdp_cnn_with_either_wrap_policy_matches_ddp) {
  const char *d = tt_tempdir();
  const char *common = "--model cnn --channels 4,8 --fc 16 --limit 256 --epochs 1 --threads 1 "
                       "--seed 3 --quiet --batch 32 --ranks 2";
  const char *runs[3][2] = {{"ddp", "--strategy ddp"},
                            {"size", "--strategy fsdp --wrap size"},
                            {"children", "--strategy fsdp --wrap children"}};
  char model[3][512];
  for (int i = 0; i < 3; i++) {
    tt_run r = tt_train("%s %s --save %s/%s", common, runs[i][1], d, runs[i][0]);
    if (r.rc) fprintf(stderr, "%s: %s", runs[i][1], r.err);
    LT_EQ(r.rc, 0);
    tt_run_free(&r);
    snprintf(model[i], sizeof model[i], "%s/%s/model.safetensors", d, runs[i][0]);
  }
  for (int i = 1; i < 3; i++) {
    double diff = tt_model_diff(model[0], model[i]);
    if (!(diff <= 1e-4))
      lt_fail_at(__FILE__, __LINE__, "%s: parameters differ from DDP's by %g", runs[i][1], diff);
  }
  tt_cleanup();
}

/* The units are named in the header, a root unit (the parameters in no wrapped module: all of
 * them under --wrap size with a large --unit-min) as "(root)", with "1 unit" for one; a
 * checkpoint of other units names them so too, never as ''. */
LT_TEST(train_fsdp_units_are_named) {
  const char *d = tt_tempdir();
  const char *common = "--strategy fsdp --ranks 2 --hidden 16 --limit 256 --batch 32 "
                       "--epochs 2 --threads 1";
  tt_run s = tt_train("%s --wrap size --max-steps 2 --save %s", common, d);
  LT_EQ(s.rc, 0);
  if (!strstr(s.out, "fsdp: 1 unit (--wrap size: (root)),")) fprintf(stderr, "%s", s.out);
  LT_TRUE(strstr(s.out, "fsdp: 1 unit (--wrap size: (root)),") != NULL);
  tt_run c = tt_train("%s --max-steps 1", common);
  LT_EQ(c.rc, 0);
  LT_TRUE(strstr(c.out, "fsdp: 2 units (--wrap children: layers.0, layers.2),") != NULL);
  /* the checkpoint records --wrap size: another wrap is refused naming it (the units of a
   * sharded checkpoint are checked once loaded too, naming the first that differs) */
  tt_run r = tt_train("%s --wrap children --resume %s --save %s --quiet", common, d, d);
  LT_TRUE(tt_ended(&r, 2, "--wrap children: the run in ", "--wrap children"));
  LT_TRUE(strstr(r.err, "trained with --wrap size") != NULL);
  tt_run_free(&s);
  tt_run_free(&c);
  tt_run_free(&r);
  tt_cleanup();
}

/* A sharded checkpoint resumes at another rank count when the global batch (ranks x --batch)
 * is kept: 2 ranks x 32, interrupted, go on as 4 x 16 and then 1 x 64, resharded, and end with
 * the parameters of the uninterrupted run to f32 summation order; the run says what changed. A
 * rank count that changes the global batch is refused, naming the --batch that keeps it, and
 * one that cannot share it evenly is refused as such. */
LT_TEST(train_fsdp_resumes_at_another_rank_count) {
  const char *d = tt_tempdir();
  const char *common = "--strategy fsdp --hidden 48,32 --limit 512 --epochs 3 --threads 1 "
                       "--seed 5";
  tt_run runs[4] = {
      tt_train("%s --ranks 2 --batch 32 --save %s/u", common, d), /* uninterrupted */
      tt_train("%s --ranks 2 --batch 32 --max-steps 8 --save %s/r", common, d),
      tt_train("%s --ranks 4 --batch 16 --max-steps 12 --resume %s/r --save %s/r", common, d, d),
      tt_train("%s --ranks 1 --batch 64 --resume %s/r --save %s/r", common, d, d)};
  for (int i = 0; i < 4; i++) {
    LT_EQ(runs[i].rc, 0);
    if (runs[i].rc) fprintf(stderr, "%s", runs[i].err);
  }
  const tt_run b = runs[2], c = runs[3];
  LT_TRUE(strstr(b.out, "the checkpoint was written by 2 ranks x batch 32; this run has 4 ranks "
                        "x batch 16, the same global batch of 64") != NULL);
  LT_TRUE(strstr(c.out, "written by 4 ranks x batch 16; this run has 1 rank x batch 64") != NULL);
  char x[512], y[512];
  snprintf(x, sizeof x, "%s/u/model.safetensors", d);
  snprintf(y, sizeof y, "%s/r/model.safetensors", d);
  double diff = tt_model_diff(x, y);
  if (!(diff <= 1e-4)) lt_fail_at(__FILE__, __LINE__, "parameters differ by %g", diff);
  tt_run e = tt_train("%s --ranks 2 --batch 16 --resume %s/r", common, d);
  LT_EQ(e.rc, 1);
  if (!strstr(e.err, "give --batch 32 to keep")) fprintf(stderr, "%s", e.err);
  LT_TRUE(strstr(e.err, "the checkpoint was written by 1 rank x --batch 64 (a global batch of "
                        "64), this run has 2 ranks x --batch 16: give --batch 32 to keep the "
                        "global batch") != NULL);
  tt_run f = tt_train("%s --ranks 3 --batch 16 --resume %s/r", common, d);
  LT_EQ(f.rc, 1);
  LT_TRUE(strstr(f.err, "which 3 ranks cannot share evenly") != NULL);
  for (int i = 0; i < 4; i++) tt_run_free(&runs[i]);
  tt_run_free(&e);
  tt_run_free(&f);
  tt_cleanup();
}
