/* test_train_gpt.c: `loom train --model gpt` and `loom generate`, in process, on a tiny GPT
 * (2 layers, 2 heads, 32 wide, context 32) and a small text written here: an interrupted run
 * resumed equals the uninterrupted one byte for byte (f32, and bf16 under FSDP); DDP and FSDP
 * on 2 ranks with batch b match one process with batch 2b (same windows: rows keyed by
 * (seed, step, row)) within the rounding of averaging the gradient over ranks; the validation
 * loss is reported and recorded; the loss falls in a short run on the fortunes; generate gives
 * the requested length, the same text for a seed and another for another seed; bad input gets
 * a message naming it (exit 2 for usage, 1 at run time). */
#include "lt.h"
#include "train_test.h"

#include <loom/loom.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define TINY "--model gpt --layers 2 --heads 2 --dim 32 --context 32 --threads 1 --quiet"

/* A text of about 40 KB: sentences from a small grammar, seeded. */
static const char *text_file(void) {
  static char path[512];
  static const char *const subj[] = {"the cat", "a dog", "my friend", "the old man", "she"};
  static const char *const verb[] = {"sees", "likes", "finds", "keeps", "reads"};
  static const char *const obj[] = {"the moon.", "a red book.", "the sea.", "some bread.",
                                    "his hat."};
  const char *d = tt_tempdir();
  snprintf(path, sizeof path, "%s/text.txt", d);
  char *buf = malloc(50000);
  size_t n = 0;
  for (uint64_t i = 0; n < 40000; i++) {
    uint64_t h = loom_rng_hash(9, i);
    n += (size_t)snprintf(buf + n, 50000 - n, "%s %s %s%s", subj[h % 5], verb[(h >> 8) % 5],
                          obj[(h >> 16) % 5], (h >> 24) % 4 == 0 ? "\n" : " ");
  }
  tt_write_file(path, buf, n);
  free(buf);
  return path;
}

static int ran(tt_run r, const char *what) {
  int ok = r.rc == 0;
  if (!ok) fprintf(stderr, "%s: exit %d: %s%s\n", what, r.rc, r.out, r.err);
  tt_run_free(&r);
  return ok;
}

/* The largest difference between the tensors of two model files (same names and shapes), or
 * -1 if they cannot be compared. */
static double max_diff(const char *dir_a, const char *dir_b) {
  char pa[512], pb[512];
  snprintf(pa, sizeof pa, "%s/model.safetensors", dir_a);
  snprintf(pb, sizeof pb, "%s/model.safetensors", dir_b);
  loom_safetensors *a = NULL, *b = NULL;
  if (loom_safetensors_open(pa, 0, &a) || loom_safetensors_open(pb, 0, &b)) {
    loom_safetensors_free(a);
    return -1;
  }
  double most = loom_safetensors_count(a) == loom_safetensors_count(b) ? 0 : -1;
  for (size_t i = 0; i < loom_safetensors_count(a) && most >= 0; i++) {
    loom_safetensors_info info;
    loom_safetensors_info_at(a, i, &info);
    loom_tensor *ta = NULL, *tb = NULL;
    if (loom_safetensors_get(a, info.name, &ta) || loom_safetensors_get(b, info.name, &tb) ||
        loom_tensor_numel(ta) != loom_tensor_numel(tb)) {
      most = -1;
    } else {
      const float *x = loom_tensor_data(ta), *y = loom_tensor_data(tb);
      for (size_t k = 0; k < loom_tensor_numel(ta); k++)
        if (fabs((double)x[k] - y[k]) > most) most = fabs((double)x[k] - y[k]);
    }
    loom_tensor_free(ta);
    loom_tensor_free(tb);
  }
  loom_safetensors_free(a);
  loom_safetensors_free(b);
  return most;
}

static int same_model(const char *a, const char *b) {
  char pa[512], pb[512];
  snprintf(pa, sizeof pa, "%s/model.safetensors", a);
  snprintf(pb, sizeof pb, "%s/model.safetensors", b);
  return tt_same_file(pa, pb);
}

/* 12 steps straight, or 5 then a resume: the same model file and checkpoint, byte for byte. */
static void check_resume(const char *opts) {
  const char *text = text_file(), *a = tt_tempdir(), *b = tt_tempdir();
  LT_TRUE(ran(tt_train(TINY " %s --text %s --max-steps 12 --save %s", opts, text, a), "straight"));
  LT_TRUE(ran(tt_train(TINY " %s --text %s --max-steps 5 --save %s", opts, text, b), "cut"));
  LT_TRUE(!same_model(a, b));
  tt_run r = tt_train(TINY " %s --text %s --max-steps 12 --resume %s --save %s", opts, text, b, b);
  LT_TRUE(r.rc == 0 && strstr(r.out, "after 12 steps"));
  LT_TRUE(ran(r, "resumed"));
  LT_TRUE(same_model(a, b));
  char pa[512], pb[512];
  snprintf(pa, sizeof pa, "%s/checkpoint.safetensors", a);
  snprintf(pb, sizeof pb, "%s/checkpoint.safetensors", b);
  if (!strstr(opts, "fsdp")) LT_TRUE(tt_same_file(pa, pb)); /* moments, step */
  tt_cleanup();
}

LT_TEST(train_gpt_resume_is_exact) { check_resume("--batch 4 --eval-every 4"); }

LT_TEST(train_gpt_resume_is_exact_fsdp_bf16) {
  check_resume("--batch 2 --ranks 2 --strategy fsdp --amp bf16");
}

/* One process with batch 8 against 2 ranks with batch 4: the same 8 windows a step (rows 0-3
 * on rank 0, 4-7 on rank 1). The gradients differ only in how the mean over the batch is
 * summed (one mean of 8 rows against the average of two means of 4), a few f32 roundings; over
 * 8 AdamW steps at lr 1e-3 that moves a weight by far less than 1e-4 (observed: 2.8e-6). */
LT_TEST(train_gpt_ddp_and_fsdp_match_one_process) {
  const char *text = text_file(), *one = tt_tempdir(), *ddp = tt_tempdir(),
             *fsdp = tt_tempdir();
  LT_TRUE(ran(tt_train(TINY " --text %s --batch 8 --max-steps 8 --save %s", text, one), "one"));
  LT_TRUE(ran(tt_train(TINY " --text %s --batch 4 --ranks 2 --strategy ddp --max-steps 8 "
                       "--save %s", text, ddp), "ddp"));
  LT_TRUE(ran(tt_train(TINY " --text %s --batch 4 --ranks 2 --strategy fsdp --max-steps 8 "
                       "--save %s", text, fsdp), "fsdp"));
  double d_ddp = max_diff(one, ddp), d_fsdp = max_diff(one, fsdp);
  fprintf(stderr, "  max |one - ddp| %.3g, max |one - fsdp| %.3g\n", d_ddp, d_fsdp);
  LT_TRUE(d_ddp >= 0 && d_ddp < 1e-4);
  LT_TRUE(d_fsdp >= 0 && d_fsdp < 1e-4);
  tt_cleanup();
}

/* The compute-pool peak of a run's summary line ("peak memory 1.2 MiB"), bytes; -1 if absent. */
static double summary_peak(const char *out) {
  const char *p = out ? strstr(out, "peak memory ") : NULL;
  double v = -1;
  char unit[4] = "";
  if (!p || sscanf(p, "peak memory %lf %3s", &v, unit) != 2) return -1;
  return v * (strcmp(unit, "GiB") == 0 ? 1073741824.0 : strcmp(unit, "MiB") == 0 ? 1048576.0
              : strcmp(unit, "KiB") == 0 ? 1024.0 : 1.0);
}

/* --checkpoint-activations recomputes each block in backward: the same model byte for byte,
 * alone and under FSDP, with a lower peak (6 blocks: the saved activations are most of it). */
LT_TEST(train_gpt_checkpoint_activations_is_exact_and_smaller) {
  const char *text = text_file();
  const char *run = "--model gpt --layers 6 --heads 2 --dim 32 --context 64 --threads 1 --quiet "
                    "--batch 8 --max-steps 3";
  const char *modes[] = {"", "--ranks 2 --strategy fsdp --amp bf16"};
  for (int k = 0; k < 2; k++) {
    const char *a = tt_tempdir(), *b = tt_tempdir();
    tt_run plain = tt_train("%s %s --text %s --save %s", run, modes[k], text, a);
    tt_run ckpt = tt_train("%s %s --text %s --checkpoint-activations --save %s", run, modes[k],
                           text, b);
    double p0 = summary_peak(plain.out), p1 = summary_peak(ckpt.out);
    LT_TRUE(ran(plain, "plain") & ran(ckpt, "checkpointed")); /* both freed */
    LT_TRUE(same_model(a, b));
    fprintf(stderr, "  %s: peak %.0f without, %.0f with --checkpoint-activations\n",
            modes[k][0] ? modes[k] : "one process", p0, p1);
    if (!k) LT_TRUE(p0 > 0 && p1 > 0 && p1 < 0.8 * p0); /* FSDP's gathers dominate there */
  }
  tt_run bad = tt_train("--checkpoint-activations --max-steps 1");
  LT_EQ(bad.rc, 2);
  LT_TRUE(strstr(bad.err, "--checkpoint-activations: a GPT option") != NULL);
  tt_run_free(&bad);
  tt_cleanup();
}

/* The amp modes and offload finish, the f16 run with its scaler. */
LT_TEST(train_gpt_amp_and_offload_finish) {
  const char *text = text_file();
  tt_run r = tt_train(TINY " --text %s --batch 4 --max-steps 3 --amp f16", text);
  LT_TRUE(r.rc == 0 && strstr(r.out, "amp f16: val loss ") && strstr(r.out, "overflow steps"));
  LT_TRUE(ran(r, "f16"));
  LT_TRUE(ran(tt_train(TINY " --text %s --batch 4 --max-steps 3 --amp bf16", text), "bf16"));
  LT_TRUE(ran(tt_train(TINY " --text %s --batch 2 --ranks 2 --strategy fsdp --offload all "
                       "--max-steps 3 --amp bf16", text), "fsdp offload"));
  tt_cleanup();
}

/* The mean of "val_loss" over the records of metrics file path whose step is in [lo, hi], and
 * of "loss" if key says so. */
static double mean_of(const char *path, const char *key, int lo, int hi) {
  size_t n = 0;
  char *s = tt_read_file(path, &n);
  double sum = 0;
  int count = 0;
  char pat[64];
  snprintf(pat, sizeof pat, "\"%s\": ", key);
  for (char *line = s; line && *line;) {
    char *nl = strchr(line, '\n');
    if (nl) *nl = 0;
    long step = strtol(line + strlen("{\"step\": "), NULL, 10);
    const char *p = strstr(line, pat);
    if (p && step >= lo && step <= hi) sum += strtod(p + strlen(pat), NULL), count++;
    line = nl ? nl + 1 : NULL;
  }
  free(s);
  return count ? sum / count : NAN;
}

/* The GPT's default schedule (no --warmup, --min-lr): linear warmup over a tenth of the run's
 * steps when that is under 100 (here 40 windows / batch 2 = 20 steps: 2 steps), then cosine
 * down to a tenth of --lr; an explicit --warmup and --min-lr replace them, and a resumed run
 * takes the same rates (train_gpt_resume_is_exact runs this default). */
LT_TEST(train_gpt_default_schedule_warms_up_and_decays_to_a_tenth) {
  const char *text = text_file(), *d = tt_tempdir();
  char m[512];
  snprintf(m, sizeof m, "%s/m.jsonl", d);
  LT_TRUE(ran(tt_train(TINY " --text %s --batch 2 --limit 40 --lr 0.002 --metrics %s", text, m),
              "default schedule"));
  double lr1 = mean_of(m, "lr", 1, 1), lr2 = mean_of(m, "lr", 2, 2), lr20 = mean_of(m, "lr", 20, 20);
  LT_NEAR(lr1, 0.001, 1e-12);                /* 0.002 x 1/2 */
  LT_NEAR(lr2, 0.002, 1e-12);                /* the peak */
  double p = 17.0 / 18.0;                    /* step 20 is t = 19: (19 - 2) / (20 - 2) */
  LT_NEAR(lr20, 0.0002 + 0.0018 * 0.5 * (1 + cos(M_PI * p)), 1e-9);
  LT_TRUE(lr20 < 0.00022); /* near the floor */
  remove(m);
  LT_TRUE(ran(tt_train(TINY " --text %s --batch 2 --limit 40 --lr 0.002 --warmup 4 --min-lr 0 "
                       "--metrics %s", text, m), "explicit schedule"));
  LT_NEAR(mean_of(m, "lr", 1, 1), 0.0005, 1e-12);
  LT_NEAR(mean_of(m, "lr", 20, 20), 0.002 * 0.5 * (1 + cos(M_PI * 15.0 / 16.0)), 1e-9);
  remove(m);
  LT_TRUE(ran(tt_train(TINY " --text %s --batch 2 --limit 40 --schedule constant --metrics %s",
                       text, m), "constant"));
  LT_NEAR(mean_of(m, "lr", 1, 1), 0.001, 1e-12);
  LT_NEAR(mean_of(m, "lr", 20, 20), 0.001, 1e-12);
  tt_cleanup();
}

/* 60 steps on the fortunes: the training loss of the last ten steps well below the first ten's
 * and below ln 256 (a uniform guess), the validation loss recorded every 20 steps and falling. */
LT_TEST(train_gpt_loss_falls_on_the_fortunes) {
  if (access(LOOM_FORTUNES_DIR "/fortunes", R_OK) != 0) {
    fprintf(stderr, "skipped: %s not installed\n", LOOM_FORTUNES_DIR);
    return;
  }
  const char *d = tt_tempdir();
  char m[512];
  snprintf(m, sizeof m, "%s/m.jsonl", d);
  tt_run r = tt_train(TINY " --batch 8 --lr 0.003 --max-steps 60 --eval-every 20 --metrics %s",
                      m);
  LT_TRUE(r.rc == 0 && strstr(r.out, "val loss"));
  LT_TRUE(ran(r, "fortunes"));
  double first = mean_of(m, "loss", 1, 10), last = mean_of(m, "loss", 51, 60);
  double v20 = mean_of(m, "val_loss", 20, 20), v60 = mean_of(m, "val_loss", 60, 60);
  fprintf(stderr, "  loss %.3f -> %.3f, val loss %.3f -> %.3f\n", first, last, v20, v60);
  LT_TRUE(last < first - 0.5 && last < log(256.0) - 1.0);
  LT_TRUE(v60 < v20);
  LT_TRUE(isnan(mean_of(m, "val_loss", 21, 39))); /* only where evaluated */
  tt_cleanup();
}

LT_TEST(generate_is_deterministic_for_a_seed) {
  const char *text = text_file(), *d = tt_tempdir();
  LT_TRUE(ran(tt_train(TINY " --text %s --batch 8 --max-steps 20 --save %s", text, d), "train"));
  tt_run a = tt_generate("--from %s --prompt the --tokens 50 --seed 1 --top-k 5 --threads 1", d);
  tt_run b = tt_generate("--from %s --prompt the --tokens 50 --seed 1 --top-k 5 --threads 1", d);
  tt_run c = tt_generate("--from %s --prompt the --tokens 50 --seed 2 --top-k 5 --threads 1", d);
  LT_EQ(a.rc, 0);
  LT_EQ(strlen(a.out), 3 + 50 + 1); /* the prompt, 50 bytes, a new line */
  LT_TRUE(strncmp(a.out, "the", 3) == 0);
  LT_STREQ(a.out, b.out);
  LT_TRUE(strcmp(a.out, c.out) != 0);
  tt_run_free(&a);
  tt_run_free(&b);
  tt_run_free(&c);
  /* a prompt longer than the context: its last 32 bytes are used, and said so */
  tt_run l = tt_generate("--from %s --prompt %s --tokens 5", d,
                         "the_cat_sees_the_moon_and_the_dog_finds_the_sea");
  LT_TRUE(l.rc == 0 && strstr(l.err, "the model sees its last 32"));
  tt_run_free(&l);
  tt_cleanup();
}

LT_TEST(train_gpt_bad_input) {
  const char *text = text_file(), *d = tt_tempdir();
  char p[512];
  tt_run r = tt_train(TINY " --text %s/none.txt --max-steps 1", d);
  LT_TRUE(tt_ended(&r, 1, "none.txt", "missing text"));
  tt_run_free(&r);
  snprintf(p, sizeof p, "%s/short.txt", d);
  tt_write_file(p, "too short a text for a window\n", 30);
  r = tt_train(TINY " --text %s --max-steps 1", p);
  LT_TRUE(tt_ended(&r, 1, "short.txt' is too short", "short text"));
  tt_run_free(&r);
  r = tt_train(TINY " --text %s --max-steps 1", d);
  LT_TRUE(tt_ended(&r, 1, "is not a regular file", "folder as text"));
  tt_run_free(&r);
  r = tt_train("--model gpt --heads 3 --dim 32");
  LT_TRUE(tt_ended(&r, 2, "--heads 3: the heads must divide --dim 32", "heads"));
  tt_run_free(&r);
  r = tt_train("--layers 2");
  LT_TRUE(tt_ended(&r, 2, "--layers: a GPT option; it needs --model gpt", "layers on mlp"));
  tt_run_free(&r);
  r = tt_train("--model gpt --hidden 32");
  LT_TRUE(tt_ended(&r, 2, "--hidden: an option of the Fashion-MNIST models", "hidden on gpt"));
  tt_run_free(&r);
  (void)text;
  tt_cleanup();
}

LT_TEST(generate_bad_input) {
  const char *text = text_file(), *d = tt_tempdir(), *mlp = tt_tempdir();
  tt_run r = tt_generate("--from %s/nothing", d);
  LT_TRUE(tt_ended(&r, 1, "nothing/model.safetensors", "missing checkpoint"));
  tt_run_free(&r);
  r = tt_generate("--prompt hi");
  LT_TRUE(tt_ended(&r, 2, "--from DIR is needed", "no --from"));
  tt_run_free(&r);
  LT_TRUE(ran(tt_train("--hidden 8 --limit 256 --epochs 1 --threads 1 --quiet --save %s", mlp),
              "mlp"));
  r = tt_generate("--from %s", mlp);
  LT_TRUE(tt_ended(&r, 1, "not a GPT's model file", "an MLP's checkpoint"));
  tt_run_free(&r);
  LT_TRUE(ran(tt_train(TINY " --text %s --batch 4 --max-steps 1 --save %s", text, d), "train"));
  r = tt_generate("--from %s --temperature 0", d);
  LT_TRUE(tt_ended(&r, 2, "--temperature", "temperature 0"));
  tt_run_free(&r);
  r = tt_generate("--from %s --top-k 257", d);
  LT_TRUE(tt_ended(&r, 2, "--top-k", "top-k 257"));
  tt_run_free(&r);
  char p[512];
  size_t n = 0;
  snprintf(p, sizeof p, "%s/model.safetensors", d);
  char *bytes = tt_read_file(p, &n);
  tt_write_file(p, bytes, n / 2); /* truncated */
  free(bytes);
  r = tt_generate("--from %s", d);
  LT_TRUE(tt_ended(&r, 1, "model.safetensors", "truncated checkpoint"));
  tt_run_free(&r);
  /* metadata of a GPT of 2.0e9 parameters over one small tensor: refused before the model is
   * made (before, generate made and initialised 8 GB of it, then found no tensor) */
  const char *const kv[] = {"model", "gpt", "gpt.vocab", "256", "gpt.context", "1024",
                            "gpt.layers", "40", "gpt.heads", "16", "gpt.dim", "2048"};
  LT_EQ(tt_write_model_file(p, "transformer.wte.weight", kv, 6), 0);
  loom_gpt_cfg cfg = {.vocab = 256, .context = 1024, .layers = 40, .heads = 16, .dim = 2048};
  char want[160];
  snprintf(want, sizeof want, "its metadata describes a model of %zu parameters, but its "
           "tensors hold 4 values", loom_gpt_numel(&cfg));
  r = tt_generate("--from %s", d);
  LT_TRUE(tt_ended(&r, 1, want, "metadata of a GPT larger than the file"));
  tt_run_free(&r);
  tt_cleanup();
}
