/* test_train_hsdp.c: `loom train --strategy hsdp --shard-size N` (ranks as threads). At 4
 * ranks with shard groups of 2, HSDP, FSDP and DDP reduce the same per-rank gradients (HSDP
 * averaging within each pair, then across the pairs) and step AdamW on the same values: their
 * model files agree to f32 summation order (test_train_fsdp.c's 1e-4). Its checkpoint is an
 * FSDP set of 2 ranks: a run interrupted and resumed under HSDP writes the same model file,
 * byte for byte, as an uninterrupted one, and one resumed under FSDP at another rank count (the
 * global batch kept) ends where the uninterrupted run ends. Its options are checked, and
 * `loom plan` plans it. */
#include "lt.h"
#include "train_test.h"

#include <stdlib.h>
#include <string.h>

static const char *common = "--hidden 48,32 --limit 1024 --epochs 2 --threads 1 --seed 7 "
                            "--quiet";

LT_TEST(train_hsdp_matches_fsdp_and_ddp_at_4_ranks) {
  const char *d = tt_tempdir();
  tt_run ddp = tt_train("%s --batch 32 --ranks 4 --strategy ddp --save %s/ddp", common, d);
  tt_run fsdp = tt_train("%s --batch 32 --ranks 4 --strategy fsdp --save %s/fsdp", common, d);
  tt_run hsdp = tt_train("%s --batch 32 --ranks 4 --strategy hsdp --shard-size 2 --save %s/hsdp "
                         "--metrics %s/m.jsonl", common, d, d);
  LT_EQ(ddp.rc, 0);
  LT_EQ(fsdp.rc, 0);
  LT_EQ(hsdp.rc, 0);
  if (hsdp.rc) fprintf(stderr, "%s", hsdp.err);
  char a[512], b[512], c[512];
  snprintf(a, sizeof a, "%s/ddp/model.safetensors", d);
  snprintf(b, sizeof b, "%s/fsdp/model.safetensors", d);
  snprintf(c, sizeof c, "%s/hsdp/model.safetensors", d);
  double dh = tt_model_diff(c, b), dd = tt_model_diff(c, a);
  if (!(dh <= 1e-4 && dd <= 1e-4))
    lt_fail_at(__FILE__, __LINE__, "hsdp vs fsdp %g, vs ddp %g", dh, dd);
  const char *acc_h = strstr(hsdp.out, "test accuracy"), *acc_f = strstr(fsdp.out, "test accuracy");
  LT_TRUE(acc_h && acc_f && strncmp(acc_h, acc_f, 22) == 0);
  /* each rank reduce-scatters within its pair and all-reduces its shard with its replica */
  snprintf(a, sizeof a, "%s/m.jsonl", d);
  size_t mn = 0;
  char *m = tt_read_file(a, &mn);
  LT_TRUE(m && strstr(m, "\"hsdp_replica_reduces\": ") && strstr(m, "\"hsdp_replica_bytes\": "));
  free(m);
  /* the set on disk is replica 0's: 2 rank files */
  size_t n = 0;
  char *bytes = NULL;
  for (int g = 1; g < 8 && !bytes; g++) {
    snprintf(a, sizeof a, "%s/hsdp/fsdp/gen-%d/rank-1-of-2.safetensors", d, g);
    bytes = tt_read_file(a, &n);
  }
  LT_TRUE(bytes != NULL);
  free(bytes);
  tt_run_free(&ddp);
  tt_run_free(&fsdp);
  tt_run_free(&hsdp);
  tt_cleanup();
}

LT_TEST(train_hsdp_resumes_under_hsdp_bitwise_and_under_fsdp_resharded) {
  const char *d = tt_tempdir();
  const char *h = "--batch 32 --ranks 4 --strategy hsdp --shard-size 2";
  tt_run runs[5] = {
      tt_train("%s %s --save %s/whole", common, h, d),
      tt_train("%s %s --save %s/part --max-steps 5", common, h, d),
      tt_train("%s %s --resume %s/part --save %s/part", common, h, d, d),
      tt_train("%s %s --save %s/f --max-steps 5", common, h, d),
      tt_train("%s --batch 64 --ranks 2 --strategy fsdp --resume %s/f --save %s/f", common, d, d)};
  for (int i = 0; i < 5; i++) {
    LT_EQ(runs[i].rc, 0);
    if (runs[i].rc) fprintf(stderr, "%s", runs[i].err);
  }
  char a[512], b[512];
  snprintf(a, sizeof a, "%s/whole/model.safetensors", d);
  snprintf(b, sizeof b, "%s/part/model.safetensors", d);
  LT_TRUE(tt_same_file(a, b));
  snprintf(b, sizeof b, "%s/f/model.safetensors", d);
  double diff = tt_model_diff(a, b);
  if (!(diff <= 1e-4)) lt_fail_at(__FILE__, __LINE__, "resumed under fsdp: %g", diff);
  for (int i = 0; i < 5; i++) tt_run_free(&runs[i]);
  tt_cleanup();
}

LT_TEST(train_hsdp_options) {
  const char *run = "--hidden 32 --limit 512 --batch 32 --epochs 1 --threads 1 --quiet";
  static const struct {
    const char *args, *err;
  } bad[] = {
      {"--ranks 4 --strategy hsdp", "--strategy hsdp: give --shard-size N"},
      {"--ranks 4 --strategy fsdp --shard-size 2", "--shard-size: the shard group of --strategy "
                                                   "hsdp; this run has --strategy fsdp"},
      {"--ranks 4 --strategy hsdp --shard-size 3", "--shard-size 3: it must divide --ranks 4"},
      {"--ranks 4 --strategy hsdp --shard-size 0", "--shard-size"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    tt_run r = tt_train("%s %s", run, bad[i].args);
    LT_EQ(r.rc, 2);
    if (!strstr(r.err, bad[i].err)) fprintf(stderr, "%s: %s", bad[i].args, r.err);
    LT_TRUE(strstr(r.err, bad[i].err) != NULL);
    tt_run_free(&r);
  }
  /* FSDP's own options apply, and shard groups of 1 (replicas only) and of all ranks work */
  tt_run ok1 = tt_train("%s --ranks 2 --strategy hsdp --shard-size 1 --amp bf16 --offload all",
                        run);
  tt_run ok2 = tt_train("%s --ranks 2 --strategy hsdp --shard-size 2 --wrap size --unit-min 1000",
                        run);
  LT_EQ(ok1.rc, 0);
  LT_EQ(ok2.rc, 0);
  tt_run_free(&ok1);
  tt_run_free(&ok2);
  /* loom plan runs the HSDP step dry: a shard of half the model's per rank */
  tt_run p = tt_plan("--hidden 256,256 --ranks 4 --strategy hsdp --shard-size 2 --json");
  tt_run q = tt_plan("--hidden 256,256 --ranks 2 --strategy fsdp --json");
  const char *pp = strstr(p.out, "\"peak_bytes\": "), *qp = strstr(q.out, "\"peak_bytes\": ");
  LT_TRUE(p.rc == 0 && q.rc == 0 && pp && qp && strstr(p.out, "\"strategy\": \"hsdp\""));
  if (pp && qp) LT_EQ(strtoull(pp + 14, NULL, 10), strtoull(qp + 14, NULL, 10));
  tt_run_free(&p);
  tt_run_free(&q);
  /* built sharded as FSDP is: a model whose whole build would pass the step's peak (at 4 ranks,
   * 89 MiB built whole against 61 MiB) plans the same peak as FSDP over the same group */
  p = tt_plan("--hidden 2048,2048 --batch 8 --ranks 4 --strategy hsdp --shard-size 4 --json");
  q = tt_plan("--hidden 2048,2048 --batch 8 --ranks 4 --strategy fsdp --json");
  pp = strstr(p.out, "\"peak_bytes\": "), qp = strstr(q.out, "\"peak_bytes\": ");
  LT_TRUE(p.rc == 0 && q.rc == 0 && pp && qp);
  if (pp && qp) LT_EQ(strtoull(pp + 14, NULL, 10), strtoull(qp + 14, NULL, 10));
  tt_run_free(&p);
  tt_run_free(&q);
}
