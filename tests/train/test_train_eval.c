/* test_train_eval.c: a model file stands alone. DIR/model.safetensors records the architecture
 * and the input normalisation as metadata, and `loom eval --from DIR` prints the test accuracy
 * the run printed (MLP under bf16 autocast, CNN in f32), with per-class figures that add up to
 * it; a model file of another kind, or none, is refused naming it, and so is one whose
 * metadata describes a larger model than its tensors hold (before a model of that size is made);
 * train_model_numel is the built model's parameter count. */
#include "lt.h"
#include "train_opts.h"
#include "train_test.h"

#include <loom/loom.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DATA "--limit 384 --batch 64 --threads 1 --epochs 1"

/* The "test accuracy X%" a run or eval printed last ("" if none). */
static void last_accuracy(const char *out, char *buf, size_t cap) {
  const char *p = out, *hit = NULL;
  while ((p = strstr(p, "test accuracy "))) hit = p++;
  buf[0] = '\0';
  if (hit) snprintf(buf, cap, "%.*s", (int)strcspn(hit, "%") + 1, hit);
}

static void check_eval(const char *opts, const char *meta_key, const char *meta_value) {
  const char *d = tt_tempdir();
  tt_run r = tt_train("%s " DATA " --save %s", opts, d);
  LT_TRUE(tt_ended(&r, 0, "", opts));
  char run[64], ev[64];
  last_accuracy(r.out, run, sizeof run);
  tt_run_free(&r);
  LT_TRUE(run[0] != '\0');
  /* the metadata: the architecture and the normalisation */
  char path[512];
  snprintf(path, sizeof path, "%s/model.safetensors", d);
  loom_safetensors *f = NULL;
  LT_EQ(loom_safetensors_open(path, 0, &f), LOOM_OK);
  const char *v = f ? loom_safetensors_meta(f, meta_key) : NULL;
  LT_TRUE(v && strcmp(v, meta_value) == 0);
  v = f ? loom_safetensors_meta(f, "input.mean") : NULL;
  LT_TRUE(v && strtof(v, NULL) == LOOM_FASHION_MNIST_MEAN);
  v = f ? loom_safetensors_meta(f, "input.std") : NULL;
  LT_TRUE(v && strtof(v, NULL) == LOOM_FASHION_MNIST_STD);
  loom_safetensors_free(f);
  /* eval on the run's test images: the run's accuracy, and per-class counts adding up */
  r = tt_eval("--from %s --limit 384 --threads 1", d);
  LT_TRUE(tt_ended(&r, 0, "", "eval"));
  last_accuracy(r.out, ev, sizeof ev);
  LT_TRUE(strcmp(run, ev) == 0);
  if (strcmp(run, ev)) fprintf(stderr, "run: %s, eval: %s\n%s", run, ev, r.out);
  size_t hit_sum = 0, seen_sum = 0, hit, seen;
  for (const char *p = r.out; (p = strstr(p, "%  (")); p++)
    if (sscanf(p, "%%  (%zu of %zu)", &hit, &seen) == 2) hit_sum += hit, seen_sum += seen;
  LT_EQ(seen_sum, 384);
  char total[64];
  snprintf(total, sizeof total, "(%zu of 384 test images)", hit_sum);
  LT_TRUE(strstr(r.out, total) != NULL);
  tt_run_free(&r);
  /* the file itself names the model too */
  r = tt_eval("--from %s --limit 384 --threads 1", path);
  last_accuracy(r.out, ev, sizeof ev);
  LT_TRUE(r.rc == 0 && strcmp(run, ev) == 0);
  tt_run_free(&r);
  tt_cleanup();
}

LT_TEST(train_eval_mlp_bf16_gives_the_runs_accuracy) {
  check_eval("--hidden 32,16 --amp bf16", "mlp.sizes", "784,32,16,10");
}

LT_TEST(train_eval_cnn_gives_the_runs_accuracy) {
  check_eval("--model cnn --channels 4,8 --fc 16", "cnn.channels", "4,8");
}

LT_TEST(train_eval_refuses_what_is_not_a_classifier) {
  tt_run r = tt_eval("--limit 3");
  LT_TRUE(tt_ended(&r, 2, "--from DIR is needed", "no --from"));
  tt_run_free(&r);
  const char *d = tt_tempdir();
  r = tt_eval("--from %s", d);
  LT_TRUE(tt_ended(&r, 1, "model.safetensors", "an empty folder"));
  tt_run_free(&r);
  /* a safetensors file without the record: named, with what writes one */
  char path[512];
  snprintf(path, sizeof path, "%s/bare.safetensors", d);
  LT_EQ(tt_write_model_file(path, "w", NULL, 0), 0);
  r = tt_eval("--from %s", path);
  LT_TRUE(tt_ended(&r, 1, "not an image classifier's model file", "a bare file"));
  tt_run_free(&r);
  tt_cleanup();
}

/* A few hundred bytes whose metadata claims an MLP of 2.1e9 parameters: refused at once, naming
 * both counts (before, eval made and initialised the 8.6 GB model, then found no tensor). */
LT_TEST(train_eval_refuses_metadata_larger_than_its_tensors) {
  const char *d = tt_tempdir();
  char path[512], want[160];
  snprintf(path, sizeof path, "%s/model.safetensors", d);
  const char *const kv[] = {"model", "mlp", "mlp.sizes", "784,32768,32768,32768,10",
                            "input.mean", "0.2860", "input.std", "0.3530", "amp", "off"};
  LT_EQ(tt_write_model_file(path, "layers.0.weight", kv, 5), 0);
  unsigned long long numel = 784ull * 32768 + 32768 + 2 * (32768ull * 32768 + 32768) +
                             32768ull * 10 + 10;
  snprintf(want, sizeof want, "its metadata describes a model of %llu parameters, but its "
           "tensors hold 4 values", numel);
  tt_run r = tt_eval("--from %s", d);
  LT_TRUE(tt_ended(&r, 1, want, "an MLP larger than the file"));
  tt_run_free(&r);
  const char *const cnn[] = {"model", "cnn", "cnn.channels", "4096,4096", "cnn.fc", "4096",
                             "input.mean", "0.2860", "input.std", "0.3530"};
  LT_EQ(tt_write_model_file(path, "0.weight", cnn, 5), 0);
  r = tt_eval("--from %s", d);
  LT_TRUE(tt_ended(&r, 1, "its metadata describes a model of", "a CNN larger than the file"));
  tt_run_free(&r);
  tt_cleanup();
}

static uint64_t built_numel(const train_opts *o) {
  train_model m;
  LT_EQ(train_model_create(o, &m), LOOM_OK);
  uint64_t n = 0;
  for (size_t i = 0; i < m.nparams; i++) n += (uint64_t)loom_tensor_numel(m.params[i].value);
  train_model_free(&m);
  return n;
}

LT_TEST(train_model_numel_is_the_built_models) {
  train_opts o;
  train_cmdline c;
  train_cli_defaults(&o, &c);
  o.model = "mlp";
  o.nhidden = 2, o.hidden[0] = 32, o.hidden[1] = 16;
  LT_EQ(train_model_numel(&o), built_numel(&o));
  o.nhidden = 0;
  LT_EQ(train_model_numel(&o), built_numel(&o));
  o.model = "cnn";
  o.channels[0] = 4, o.channels[1] = 8, o.fc = 16;
  LT_EQ(train_model_numel(&o), built_numel(&o));
  o.model = "gpt";
  o.layers = 2, o.heads = 2, o.dim = 32, o.context = 16;
  LT_EQ(train_model_numel(&o), built_numel(&o));
}
