/* train_ckpt.c: checkpoints of `loom train`. DIR/checkpoint.safetensors holds the model
 * ("model.<name>"), the optimizer state ("optim.<param>.exp_avg", ...), the scaler
 * ("amp.scaler", loom_scaler_state_pack) and, as metadata, the step, epoch, optimizer step
 * count and every option that shapes the trajectory; DIR/model.safetensors the parameters
 * alone under their PyTorch names. Both are written atomically (loom_checkpoint_save,
 * loom_safetensors_write). Nothing else is needed to resume bit for bit: the data order is a
 * function of (seed, epoch, batch index) and the learning rate of the step index. */
#include "train_api.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define KEY_MAX 160

/* The options a resumed run must share with the run that wrote the checkpoint. */
enum { NFP = 15 };
typedef struct fingerprint {
  const char *key[NFP];
  char value[NFP][96];
} fingerprint;

static void make_fingerprint(const train_opts *o, const train_model *m, fingerprint *fp) {
  int i = 0;
#define FP(k, ...) (fp->key[i] = "train." k, snprintf(fp->value[i], sizeof fp->value[i], __VA_ARGS__), i++)
  char desc[96];
  train_model_describe(m, o, desc, sizeof desc);
  FP("model", "%s", desc);
  FP("optim", "%s", o->optim);
  FP("lr", "%.17g", o->lr);
  FP("weight_decay", "%.17g", o->weight_decay);
  FP("momentum", "%.17g", o->momentum);
  FP("schedule", "%s", o->schedule);
  FP("warmup", "%ld", o->warmup);
  FP("epochs", "%ld", o->epochs);
  FP("amp", "%s", o->amp);
  FP("scaler", "%s", o->scaler);
  FP("batch", "%ld", o->batch);
  FP("seed", "%ld", o->seed);
  FP("shuffle", "%s", o->shuffle ? "yes" : "no");
  FP("limit", "%ld", o->limit);
  FP("ranks", "%ld", o->ranks);
#undef FP
}

/* The option name behind a fingerprint key, for messages. */
static const char *option_of(const char *key) {
  const char *k = key + strlen("train.");
  if (strcmp(k, "shuffle") == 0) return "no-shuffle";
  if (strcmp(k, "weight_decay") == 0) return "weight-decay";
  if (strcmp(k, "model") == 0) return "model (and its sizes)";
  return k;
}

/* The entries of a checkpoint: names in one block of KEY_MAX-byte slots. */
typedef struct entries {
  loom_checkpoint_entry *e;
  char *names;
  size_t n;
  int64_t scaler_words[LOOM_SCALER_STATE_WORDS];
} entries;

static int make_entries(const train_model *m, const loom_optim *opt, bool with_scaler,
                        entries *es) {
  size_t nstate = loom_optim_state_count(opt), cap = m->nparams + nstate + 1;
  es->e = calloc(cap, sizeof *es->e);
  es->names = calloc(cap, KEY_MAX);
  es->n = 0;
  if (!es->e || !es->names) return train_fail(LOOM_ENOMEM, "checkpoint: out of memory");
  for (size_t i = 0; i < m->nparams; i++) {
    const loom_param *p = &m->params[i];
    loom_checkpoint_entry *e = &es->e[es->n];
    char *name = es->names + es->n++ * KEY_MAX;
    snprintf(name, KEY_MAX, "model.%s", p->name);
    *e = (loom_checkpoint_entry){.name = name, .dtype = LOOM_F32,
                                 .ndim = loom_tensor_ndim(p->value),
                                 .data = loom_tensor_data(p->value)};
    memcpy(e->shape, loom_tensor_shape(p->value), sizeof(int64_t) * (size_t)e->ndim);
  }
  for (size_t i = 0; i < nstate; i++) {
    loom_optim_state s;
    loom_optim_state_at(opt, i, &s);
    loom_checkpoint_entry *e = &es->e[es->n];
    char *name = es->names + es->n++ * KEY_MAX;
    snprintf(name, KEY_MAX, "optim.%s", s.name);
    *e = (loom_checkpoint_entry){.name = name, .dtype = LOOM_F32, .ndim = 1,
                                 .shape = {(int64_t)s.n}, .data = s.data};
  }
  if (with_scaler)
    es->e[es->n++] = (loom_checkpoint_entry){.name = "amp.scaler", .dtype = LOOM_I64, .ndim = 1,
                                             .shape = {LOOM_SCALER_STATE_WORDS},
                                             .data = es->scaler_words};
  return LOOM_OK;
}

static void free_entries(entries *es) {
  free(es->e);
  free(es->names);
}

static void path_in(char *buf, size_t cap, const char *dir, const char *file) {
  snprintf(buf, cap, "%s/%s", dir, file);
}

int train_ckpt_save(const char *dir, const train_opts *o, const train_model *m,
                    const loom_optim *opt, const loom_scaler *scaler, const train_state *st) {
  if (mkdir(dir, 0777) != 0 && errno != EEXIST)
    return train_fail(LOOM_EIO, "--save %s: cannot create the folder: %s", dir, strerror(errno));
  entries es;
  int rc = make_entries(m, opt, scaler != NULL, &es);
  if (!rc && scaler) {
    loom_scaler_state ss;
    rc = loom_scaler_save(scaler, &ss);
    if (!rc) rc = loom_scaler_state_pack(&ss, es.scaler_words);
    if (rc) train_fail_loom(rc, "checkpoint: the scaler");
  }
  fingerprint fp;
  make_fingerprint(o, m, &fp);
  loom_safetensors_meta_kv meta[NFP + 3];
  char num[3][32];
  snprintf(num[0], sizeof num[0], "%lld", (long long)st->step);
  snprintf(num[1], sizeof num[1], "%lld", (long long)(st->step / st->steps_per_epoch));
  snprintf(num[2], sizeof num[2], "%lld", (long long)loom_optim_step_count(opt));
  meta[0] = (loom_safetensors_meta_kv){"step", num[0]};
  meta[1] = (loom_safetensors_meta_kv){"epoch", num[1]};
  meta[2] = (loom_safetensors_meta_kv){"optim_steps", num[2]};
  for (int i = 0; i < NFP; i++) meta[3 + i] = (loom_safetensors_meta_kv){fp.key[i], fp.value[i]};
  char path[4096];
  path_in(path, sizeof path, dir, "checkpoint.safetensors");
  if (!rc) {
    rc = loom_checkpoint_save(path, es.e, es.n, meta, NFP + 3);
    if (rc) train_fail_loom(rc, "--save");
  }
  free_entries(&es);
  path_in(path, sizeof path, dir, "model.safetensors");
  if (!rc) rc = train_model_save(m, path);
  return rc;
}

/* Every fingerprint value of the file must be this run's. */
static int check_fingerprint(const loom_safetensors *f, const char *dir, const train_opts *o,
                             const train_model *m) {
  fingerprint fp;
  make_fingerprint(o, m, &fp);
  for (int i = 0; i < NFP; i++) {
    const char *v = loom_safetensors_meta(f, fp.key[i]);
    if (!v)
      return train_fail(LOOM_EFORMAT, "--resume %s: the checkpoint lacks '%s'", dir, fp.key[i]);
    if (strcmp(v, fp.value[i]) != 0)
      return train_fail(LOOM_EINVAL,
                        "--resume %s: the checkpoint was written with --%s %s, this run has %s "
                        "(a resumed run must use the same options)",
                        dir, option_of(fp.key[i]), v, fp.value[i]);
  }
  return LOOM_OK;
}

int train_ckpt_load(const char *dir, const train_opts *o, train_model *m, loom_optim *opt,
                    loom_scaler *scaler, train_state *st) {
  char path[4096];
  path_in(path, sizeof path, dir, "checkpoint.safetensors");
  loom_safetensors *f = NULL;
  int rc = loom_safetensors_open(path, 0, &f);
  if (rc) return train_fail_loom(rc, "--resume");
  rc = check_fingerprint(f, dir, o, m);
  int64_t step = 0, optim_steps = 0;
  if (!rc && (loom_safetensors_meta_i64(f, "step", &step) ||
              loom_safetensors_meta_i64(f, "optim_steps", &optim_steps) || step < 0 ||
              optim_steps < 0 || optim_steps > step))
    rc = train_fail(LOOM_EFORMAT, "--resume %s: bad step counts in the checkpoint", dir);
  loom_safetensors_free(f);
  if (rc) return rc;

  entries es;
  rc = make_entries(m, opt, scaler != NULL, &es);
  if (!rc) {
    rc = loom_checkpoint_load(path, es.e, es.n, NULL);
    if (rc) train_fail_loom(rc, "--resume");
  }
  if (!rc && scaler) {
    loom_scaler_state ss;
    rc = loom_scaler_state_unpack(es.scaler_words, &ss);
    if (!rc) rc = loom_scaler_restore(scaler, &ss);
    if (rc) train_fail_loom(rc, "--resume: the scaler");
  }
  free_entries(&es);
  if (!rc) rc = loom_optim_set_step_count(opt, optim_steps);
  if (!rc) st->step = step;
  return rc;
}
