/* test_train_run.c: a short real training run (the loss falls, the test accuracy is far above
 * chance, every step has a metrics record with its fields), --init from a safetensors file
 * written here (values land in the parameters exactly; a missing name, wrong shape, wrong dtype
 * or extra tensor is refused naming it), and --help documenting every option. */
#include "lt.h"
#include "train_test.h"

#include <stdlib.h>

/* The mean of `key` over records [from, to) of a JSONL text. */
static double mean_of(const char *jsonl, const char *key, int from, int to, int *nlines) {
  char pat[64];
  snprintf(pat, sizeof pat, "\"%s\": ", key);
  double sum = 0;
  int i = 0, n = 0;
  for (const char *line = jsonl; *line; i++) {
    const char *end = strchr(line, '\n');
    if (i >= from && i < to) {
      const char *v = strstr(line, pat);
      if (v && (!end || v < end)) sum += strtod(v + strlen(pat), NULL), n++;
    }
    if (!end) break;
    line = end + 1;
  }
  *nlines = i;
  return n ? sum / n : NAN;
}

LT_TEST(train_short_run_loss_falls) {
  const char *d = tt_tempdir();
  tt_run r = tt_train("--hidden 64 --limit 2048 --epochs 3 --threads 1 --metrics %s/m.jsonl", d);
  LT_EQ(r.rc, 0);
  if (r.rc) fprintf(stderr, "%s", r.err);
  /* 2048 / 256 = 8 steps per epoch: 24 records */
  char p[512];
  snprintf(p, sizeof p, "%s/m.jsonl", d);
  size_t n = 0;
  char *m = tt_read_file(p, &n);
  LT_TRUE(m != NULL);
  if (m) {
    int lines = 0;
    double first = mean_of(m, "loss", 0, 4, &lines), last = mean_of(m, "loss", 20, 24, &lines);
    LT_EQ(lines, 24);
    LT_TRUE(first > 1.0);        /* near ln 10 = 2.3 at the start */
    LT_TRUE(last < 0.6 * first); /* and well down after three epochs */
    for (const char *k = "\"step\": 1, \"epoch\": 0, \"loss\": "; k; k = NULL)
      LT_TRUE(strncmp(m, "{", 1) == 0 && strstr(m, k));
    const char *fields[] = {"\"lr\": ", "\"scale\": 1", "\"overflow\": false",
                            "\"samples_per_s\": ", "\"compute\": {\"current_bytes\": ",
                            "\"peak_bytes\": ", "\"host\": ", "\"file\": "};
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) LT_TRUE(strstr(m, fields[i]));
    LT_TRUE(strstr(m, "{\"step\": 24, \"epoch\": 2,"));
    free(m);
  }
  /* per-epoch lines and the summary */
  LT_TRUE(strstr(r.out, "epoch 3/3"));
  const char *acc = strstr(r.out, "test accuracy ");
  LT_TRUE(acc != NULL);
  const char *sum = strstr(r.out, "loom train: mlp 784-64-10, adamw, amp off: test accuracy ");
  LT_TRUE(sum != NULL);
  if (sum) LT_TRUE(strtod(sum + strlen("loom train: mlp 784-64-10, adamw, amp off: test accuracy "), NULL) > 60.0);
  LT_TRUE(strstr(r.out, "samples/s, wall ") && strstr(r.out, "peak memory "));
  tt_run_free(&r);
  tt_cleanup();
}

/* Parameters of the MLP 784-8-10, as a safetensors file: each element a distinct value. */
static int write_init(const char *path, const char *rename_first, loom_dtype first_dtype,
                      int64_t first_rows, bool extra) {
  static float w0[9 * 784], b0[8], w1[10 * 8], b1[10], e[3];
  for (size_t i = 0; i < sizeof w0 / sizeof *w0; i++) w0[i] = (float)i / 8192.0f - 0.3f;
  for (int i = 0; i < 8; i++) b0[i] = 0.01f * (float)i;
  for (int i = 0; i < 80; i++) w1[i] = -0.02f * (float)i;
  for (int i = 0; i < 10; i++) b1[i] = 0.5f - 0.1f * (float)i;
  static uint16_t w0h[9 * 784];
  for (size_t i = 0; i < sizeof w0 / sizeof *w0; i++) w0h[i] = loom_f32_to_f16(w0[i]);
  int64_t s0[2] = {first_rows, 784}, sb0[1] = {8}, s1[2] = {10, 8}, sb1[1] = {10}, se[1] = {3};
  loom_safetensors_entry ents[5] = {
      {rename_first ? rename_first : "layers.0.weight", NULL, first_dtype, 2, s0,
       first_dtype == LOOM_F16 ? (const void *)w0h : (const void *)w0},
      {"layers.0.bias", NULL, LOOM_F32, 1, sb0, b0},
      {"layers.2.weight", NULL, LOOM_F32, 2, s1, w1},
      {"layers.2.bias", NULL, LOOM_F32, 1, sb1, b1},
      {"classifier.extra", NULL, LOOM_F32, 1, se, e}};
  return loom_safetensors_write(path, ents, extra ? 5 : 4, NULL, 0);
}

LT_TEST(train_init_from_safetensors) {
  const char *d = tt_tempdir();
  char init[512], saved[512];
  snprintf(init, sizeof init, "%s/init.safetensors", d);
  snprintf(saved, sizeof saved, "%s/model.safetensors", d);
  LT_OK(write_init(init, NULL, LOOM_F32, 8, false));
  /* lr 0: one step leaves the parameters as loaded, so the saved model is the init file */
  tt_run r = tt_train("--hidden 8 --limit 256 --epochs 1 --lr 0 --threads 1 --quiet --init %s "
                      "--save %s", init, d);
  LT_EQ(r.rc, 0);
  if (r.rc) fprintf(stderr, "%s", r.err);
  tt_run_free(&r);
  loom_safetensors *a = NULL, *b = NULL;
  LT_OK(loom_safetensors_open(init, 0, &a));
  LT_OK(loom_safetensors_open(saved, 0, &b));
  if (a && b) {
    LT_EQ(loom_safetensors_count(b), 4);
    for (size_t i = 0; i < loom_safetensors_count(a); i++) {
      loom_safetensors_info x, y;
      LT_OK(loom_safetensors_info_at(a, i, &x));
      LT_OK(loom_safetensors_find(b, x.name, &y));
      LT_EQ(x.nbytes, y.nbytes);
      LT_TRUE(memcmp(x.data, y.data, x.nbytes) == 0);
    }
  }
  loom_safetensors_free(a);
  loom_safetensors_free(b);

  /* each fault, named */
  struct { const char *rename; loom_dtype dt; int64_t rows; bool extra; const char *want; } bad[] = {
      {"layers.1.weight", LOOM_F32, 8, false, "layers.0.weight"},  /* missing */
      {NULL, LOOM_F32, 9, false, "layers.0.weight"},               /* shape */
      {NULL, LOOM_F16, 8, false, "layers.0.weight"},               /* dtype */
      {NULL, LOOM_F32, 8, true, "'classifier.extra' is not a parameter"}};
  const char *detail[] = {"", "[9, 784]", "is F16, expected f32", ""};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    LT_OK(write_init(init, bad[i].rename, bad[i].dt, bad[i].rows, bad[i].extra));
    r = tt_train("--hidden 8 --limit 256 --epochs 1 --threads 1 --quiet --init %s", init);
    LT_EQ(r.rc, 1);
    LT_TRUE(strstr(r.err, "--init") && strstr(r.err, bad[i].want) && strstr(r.err, detail[i]));
    if (!strstr(r.err, bad[i].want) || !strstr(r.err, detail[i])) fprintf(stderr, "case %zu: %s", i, r.err);
    tt_run_free(&r);
  }
  r = tt_train("--hidden 8 --init %s/none.safetensors", d);
  LT_EQ(r.rc, 1);
  LT_TRUE(strstr(r.err, "--init") && strstr(r.err, "none.safetensors"));
  tt_run_free(&r);
  tt_cleanup();
}

LT_TEST(train_help_documents_every_option) {
  tt_run r = tt_train("--help");
  LT_EQ(r.rc, 0);
  const char *opts[] = {"--model mlp|cnn", "--hidden", "--channels", "--fc", "--epochs",
                        "--batch", "--lr", "--optim sgd|adam|adamw", "--amp off|bf16|f16",
                        "--scaler dynamic|static|off", "--seed", "--init FILE", "--no-shuffle",
                        "--metrics FILE", "--save DIR", "--resume DIR", "--threads N",
                        "--data DIR", "--limit N", "--max-steps N", "--schedule",
                        "--weight-decay", "--loss-scale", "--ranks", "--help"};
  for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++) {
    LT_TRUE(strstr(r.out, opts[i]) != NULL);
    if (!strstr(r.out, opts[i])) fprintf(stderr, "help lacks %s\n", opts[i]);
  }
  tt_run_free(&r);
}
