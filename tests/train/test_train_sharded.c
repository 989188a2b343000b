/* test_train_sharded.c: sharded construction through `loom train` (ranks as threads). With
 * --lr 0 a step changes no weight (AdamW's update and decay are both x lr), so the model file a
 * run saves is its initial model: one process, DDP on 2 ranks and FSDP on 2 and 3 ranks (the
 * MLP and the CNN) write the same bytes. --init under FSDP fills each rank's shards from the
 * file, which the saved model then equals, and a bad file is refused naming the tensor. The
 * build peak per rank is at most the step peak, in the plan (its JSON) and as the run measures
 * it (the summary's "peak memory X per rank (Y while building)"). */
#include "lt.h"
#include "train_test.h"

#include <stdlib.h>
#include <string.h>

static const char *common = "--limit 384 --batch 64 --max-steps 1 --lr 0 --threads 1 --quiet";

/* Whether every tensor of a and b has the same name, dtype, shape and bytes. */
static int same_tensors(const char *a, const char *b) {
  loom_safetensors *fa = NULL, *fb = NULL;
  int same = !loom_safetensors_open(a, 0, &fa) && !loom_safetensors_open(b, 0, &fb) &&
             loom_safetensors_count(fa) == loom_safetensors_count(fb);
  for (size_t i = 0; same && i < loom_safetensors_count(fa); i++) {
    loom_safetensors_info ia, ib;
    same = !loom_safetensors_info_at(fa, i, &ia) && !loom_safetensors_find(fb, ia.name, &ib) &&
           ia.nbytes == ib.nbytes && !strcmp(ia.dtype_name, ib.dtype_name) &&
           !memcmp(ia.data, ib.data, ia.nbytes);
  }
  loom_safetensors_free(fa);
  loom_safetensors_free(fb);
  return same;
}

static void check_start(const char *model) {
  const char *d = tt_tempdir();
  static const char *const how[] = {"", "--strategy ddp --ranks 2", "--strategy fsdp --ranks 2",
                                     "--strategy fsdp --ranks 3"};
  char ref[512], path[512];
  for (int k = 0; k < 4; k++) {
    tt_run r = tt_train("%s %s %s --save %s/r%d", model, common, how[k], d, k);
    if (r.rc) fprintf(stderr, "%s %s: %s", model, how[k], r.err);
    LT_EQ(r.rc, 0);
    tt_run_free(&r);
    snprintf(path, sizeof path, "%s/r%d/model.safetensors", d, k);
    if (k == 0) snprintf(ref, sizeof ref, "%s", path);
    else if (!same_tensors(ref, path))
      lt_fail_at(__FILE__, __LINE__, "%s %s: the initial model differs from one process's", model,
                 how[k]);
  }
  tt_cleanup();
}

LT_TEST(train_one_process_ddp_and_fsdp_start_from_the_same_bits_mlp) {
  check_start("--hidden 48,32");
}
LT_TEST(train_one_process_ddp_and_fsdp_start_from_the_same_bits_cnn) {
  check_start("--model cnn --channels 4,8 --fc 16");
}

LT_TEST(train_fsdp_init_fills_the_shards_from_the_file) {
  const char *d = tt_tempdir();
  tt_run a = tt_train("--hidden 48,32 %s --seed 9 --save %s/a", common, d);
  LT_EQ(a.rc, 0);
  tt_run b = tt_train("--hidden 48,32 %s --strategy fsdp --ranks 3 --init %s/a/model.safetensors "
                      "--save %s/b", common, d, d);
  if (b.rc) fprintf(stderr, "%s", b.err);
  LT_EQ(b.rc, 0);
  char pa[512], pb[512];
  snprintf(pa, sizeof pa, "%s/a/model.safetensors", d);
  snprintf(pb, sizeof pb, "%s/b/model.safetensors", d);
  LT_TRUE(same_tensors(pa, pb));
  /* another model's file: refused, naming the tensor, before any step */
  tt_run c = tt_train("--hidden 48,16 %s --strategy fsdp --ranks 2 --init %s", common, pa);
  LT_TRUE(tt_ended(&c, 1, "\"layers.2.weight\" has shape [32, 48], expected [16, 48]",
                   "--init of another shape"));
  LT_TRUE(strstr(c.out, "test accuracy") == NULL);
  tt_run_free(&a);
  tt_run_free(&b);
  tt_run_free(&c);
  tt_cleanup();
}

/* The number after the first `"key": ` in s at or after `from`, -1 if absent. */
static double json_after(const char *s, const char *from, const char *key) {
  const char *p = s ? strstr(s, from) : NULL;
  char pat[64];
  snprintf(pat, sizeof pat, "\"%s\": ", key);
  p = p ? strstr(p, pat) : NULL;
  return p ? strtod(p + strlen(pat), NULL) : -1;
}

/* A size the summary prints ("4.0 MiB", "218091 B") in bytes. */
static double summary_bytes(const char *p) {
  double v = -1;
  char unit[4] = "";
  if (!p || sscanf(p, "%lf %3s", &v, unit) != 2) return -1;
  return v * (!strcmp(unit, "GiB") ? 1073741824.0 : !strcmp(unit, "MiB") ? 1048576.0
              : !strcmp(unit, "KiB") ? 1024.0 : 1.0);
}

static void check_peaks(const char *opts) {
  tt_run p = tt_plan("%s %s --json", opts, common);
  LT_EQ(p.rc, 0);
  double build = json_after(p.out, "\"build\"", "peak_bytes");
  double train = json_after(p.out, "\"train\"", "peak_bytes");
  tt_run_free(&p);
  tt_run r = tt_train("%s %s", opts, common);
  LT_EQ(r.rc, 0);
  const char *s = strstr(r.out, "peak memory ");
  double step = summary_bytes(s ? s + strlen("peak memory ") : NULL);
  const char *b = s ? strstr(s, "per rank (") : NULL;
  double built = summary_bytes(b ? b + strlen("per rank (") : NULL);
  tt_run_free(&r);
  fprintf(stderr, "  %-50s plan: build %.0f <= step %.0f; run: build %.0f <= peak %.0f\n", opts,
          build, train, built, step);
  LT_TRUE(build > 0 && train > 0 && build <= train);
  LT_TRUE(built > 0 && step > 0 && built <= step);
}

LT_TEST(train_fsdp_build_peak_is_at_most_the_step_peak) {
  check_peaks("--strategy fsdp --ranks 2 --hidden 512,512");
  check_peaks("--strategy fsdp --ranks 3 --hidden 1024,1024 --amp bf16");
  check_peaks("--strategy fsdp --ranks 2 --model cnn");
  check_peaks("--strategy fsdp --ranks 2 --model gpt --batch 4");
}
