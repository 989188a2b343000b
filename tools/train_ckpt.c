/* train_ckpt.c: checkpoints of `loom train`. DIR/checkpoint.safetensors holds the model
 * ("model.<name>"), the optimizer state ("optim.<param>.exp_avg", ...), the scaler
 * ("amp.scaler", loom_scaler_state_pack) and, as metadata, the step (with its epoch and batch
 * index, the steps per epoch and the optimizer step count), every option that shapes the
 * trajectory, and the command line (train_resume.c: "cli.<option>", what --resume alone runs); DIR/model.safetensors the parameters alone under their PyTorch names, with the
 * step and epoch as metadata. Both are written atomically (loom_safetensors_write, then
 * loom_checkpoint_save: the model file first, so the checkpoint is never ahead of it; a kill
 * between the two renames leaves the model one save ahead, which resume reports), after the
 * temporaries an interrupted save left are removed. On resume every restored value is checked:
 * the CRC covers the whole file, the counters must fit this run and each other, the weights
 * and moments must be finite (exp_avg_sq >= 0). Nothing else is needed to resume bit for bit:
 * the data order is a function of (seed, epoch, batch index) and the learning rate of the step
 * index. */
#include "cli.h"
#include "train_api.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define KEY_MAX 160

/* The options a resumed run must share with the run that wrote the checkpoint. */
enum { NFP = 16 };
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
  FP("min_lr", "%.17g", o->min_lr);
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

/* The checkpoint's counters, in this order (the model file has the first two). */
enum { NCOUNT = 5 };
static const char *const counter_keys[NCOUNT] = {"step", "epoch", "batch_index",
                                                 "steps_per_epoch", "optim_steps"};

/* The option name behind a fingerprint key, for messages. */
static const char *option_of(const char *key) {
  const char *k = key + strlen("train.");
  if (strcmp(k, "weight_decay") == 0) return "weight-decay";
  if (strcmp(k, "min_lr") == 0) return "min-lr";
  if (strcmp(k, "model") == 0) return "model (and its sizes)";
  return k;
}

/* A fingerprint value as a user writes the option: numbers in their shortest form that reads
 * back the same (the file keeps 17 digits), shuffle as the flag it comes from. */
static const char *shown(const char *key, const char *value, char *buf, size_t n) {
  if (strcmp(key, "train.shuffle") == 0)
    return strcmp(value, "no") == 0 ? "--no-shuffle" : "shuffled batches (no --no-shuffle)";
  char *end;
  double v = strtod(value, &end);
  if (end == value || *end) return value;
  cli_number_text(v, buf, n);
  return buf;
}

/* The fingerprint for others (train_par.c compares it across ranks). */
_Static_assert(NFP <= TRAIN_FP_MAX, "TRAIN_FP_MAX is too small for the fingerprint");
int train_ckpt_fingerprint(const train_opts *o, const train_model *m, train_fp_entry *out) {
  fingerprint fp;
  make_fingerprint(o, m, &fp);
  for (int i = 0; i < NFP; i++) {
    char buf[40];
    const char *v = shown(fp.key[i], fp.value[i], buf, sizeof buf);
    snprintf(out[i].value, sizeof out[i].value, "%s", fp.value[i]);
    if (strcmp(fp.key[i], "train.shuffle") == 0) /* shown as the flag itself */
      snprintf(out[i].shown, sizeof out[i].shown, "%s", v);
    else
      snprintf(out[i].shown, sizeof out[i].shown, "--%s %s", option_of(fp.key[i]), v);
  }
  return NFP;
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
                                 .data = loom_tensor_data(p->value), .checks = LOOM_CHECK_FINITE};
    memcpy(e->shape, loom_tensor_shape(p->value), sizeof(int64_t) * (size_t)e->ndim);
  }
  for (size_t i = 0; i < nstate; i++) {
    loom_optim_state s;
    loom_optim_state_at(opt, i, &s);
    loom_checkpoint_entry *e = &es->e[es->n];
    char *name = es->names + es->n++ * KEY_MAX;
    snprintf(name, KEY_MAX, "optim.%s", s.name);
    size_t len = strlen(s.name);
    bool sq = len >= 11 && strcmp(s.name + len - 11, ".exp_avg_sq") == 0; /* a mean of squares */
    *e = (loom_checkpoint_entry){.name = name, .dtype = LOOM_F32, .ndim = 1,
                                 .shape = {(int64_t)s.n}, .data = s.data,
                                 .checks = LOOM_CHECK_FINITE | (sq ? LOOM_CHECK_NONNEG : 0)};
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

/* A checkpoint's metadata: the counters (counter_keys), then the fingerprint. */
typedef struct ckpt_meta {
  fingerprint fp;
  char num[NCOUNT][32];
  loom_safetensors_meta_kv kv[NCOUNT + NFP + TRAIN_CLI_KV_MAX]; /* and the command line */
  size_t nkv;
  train_model_meta mm;
  loom_safetensors_meta_kv model_kv[2 + TRAIN_MODEL_META]; /* the model file's: step, epoch */
  size_t nmodel;                                           /* and the model's shape */
} ckpt_meta;

static void make_meta(const train_opts *o, const train_model *m, const loom_optim *opt,
                      const train_state *st, ckpt_meta *cm) {
  make_fingerprint(o, m, &cm->fp);
  const int64_t count[NCOUNT] = {st->step, st->step / st->steps_per_epoch,
                                 st->step % st->steps_per_epoch, st->steps_per_epoch,
                                 loom_optim_step_count(opt)};
  for (int i = 0; i < NCOUNT; i++) {
    snprintf(cm->num[i], sizeof cm->num[i], "%lld", (long long)count[i]);
    cm->kv[i] = (loom_safetensors_meta_kv){counter_keys[i], cm->num[i]};
  }
  for (int i = 0; i < NFP; i++)
    cm->kv[NCOUNT + i] = (loom_safetensors_meta_kv){cm->fp.key[i], cm->fp.value[i]};
  cm->nkv = NCOUNT + NFP;
  for (int i = 0; i < o->ncli_kv && i < TRAIN_CLI_KV_MAX; i++) cm->kv[cm->nkv++] = o->cli_kv[i];
  train_model_meta_make(m, o, &cm->mm);
  cm->nmodel = 0;
  for (int i = 0; i < 2; i++) cm->model_kv[cm->nmodel++] = cm->kv[i];
  for (size_t i = 0; i < cm->mm.n; i++) cm->model_kv[cm->nmodel++] = cm->mm.kv[i];
}

static void path_in(char *buf, size_t cap, const char *dir, const char *file) {
  snprintf(buf, cap, "%s/%s", dir, file);
}

/* Remove the temporaries an interrupted save of DIR/file left (a kill between create and
 * rename): only `file.tmp.XXXXXX`, the writer's own pattern. */
static int clean(const char *path) {
  int rc = loom_remove_stale_temporaries(path, NULL);
  return rc ? train_fail_loom(rc, "--save") : LOOM_OK;
}

int train_ckpt_save(const char *dir, const train_opts *o, const train_model *m,
                    const loom_optim *opt, const loom_scaler *scaler, const train_state *st) {
  if (mkdir(dir, 0777) != 0 && errno != EEXIST)
    return train_fail(LOOM_EIO, "--save %s: cannot create the folder: %s", dir, strerror(errno));
  char ck[4096], model[4096];
  path_in(ck, sizeof ck, dir, "checkpoint.safetensors");
  path_in(model, sizeof model, dir, "model.safetensors");
  int rc = clean(ck);
  if (!rc) rc = clean(model);
  if (rc) return rc;
  entries es;
  rc = make_entries(m, opt, scaler != NULL, &es);
  if (!rc && scaler) {
    loom_scaler_state ss;
    rc = loom_scaler_save(scaler, &ss);
    if (!rc) rc = loom_scaler_state_pack(&ss, es.scaler_words);
    if (rc) train_fail_loom(rc, "checkpoint: the scaler");
  }
  ckpt_meta cm;
  make_meta(o, m, opt, st, &cm);
  const loom_safetensors_meta_kv *meta = cm.kv;
  if (!rc) rc = train_model_save(m, model, cm.model_kv, cm.nmodel);
  if (!rc) {
    rc = loom_checkpoint_save(ck, es.e, es.n, meta, cm.nkv);
    if (rc) train_fail_loom(rc, "--save");
  }
  free_entries(&es);
  return rc;
}

/* A fingerprint value that is a whole number of at least 1, or -1. */
static long long positive(const char *v) {
  char *end;
  long long n = v && *v >= '0' && *v <= '9' ? strtoll(v, &end, 10) : -1;
  return n >= 1 && *end == '\0' ? n : -1;
}

/* Every fingerprint value of the file must be this run's, but --epochs (a run may be extended
 * or cut short: check_counters keeps it past the checkpoint's step), the rank count and the
 * batch per rank: another rank count is well defined when the global batch (ranks x --batch) is the same
 * (the same steps per epoch, data order and learning rates: the run continues as the one that
 * wrote the checkpoint would have, up to the order of the sums over ranks); the first time
 * otherwise. Sets st->from_ranks and from_batch to the checkpoint's on another rank count. */
static int check_fingerprint(const loom_safetensors *f, const char *dir, const train_opts *o,
                             const train_model *m, train_state *st) {
  fingerprint fp;
  make_fingerprint(o, m, &fp);
  st->from_ranks = st->from_batch = 0;
  long long ranks0 = positive(loom_safetensors_meta(f, "train.ranks"));
  long long batch0 = positive(loom_safetensors_meta(f, "train.batch"));
  if (ranks0 > 0 && batch0 > 0 && ranks0 != o->ranks) {
    long long g;
    if (__builtin_mul_overflow(ranks0, batch0, &g))
      return train_fail(LOOM_EFORMAT, "--resume %s: the checkpoint's ranks %lld x batch %lld "
                        "overflow", dir, ranks0, batch0);
    if (g != o->batch * o->ranks) {
      if (g % o->ranks)
        return train_fail(LOOM_EINVAL, "--resume %s: the checkpoint was written by %lld rank%s "
                          "x --batch %lld (a global batch of %lld), which %ld ranks cannot "
                          "share evenly (a resumed run keeps the global batch)", dir, ranks0,
                          ranks0 > 1 ? "s" : "", batch0, g, o->ranks);
      return train_fail(LOOM_EINVAL, "--resume %s: the checkpoint was written by %lld rank%s x "
                        "--batch %lld (a global batch of %lld), this run has %ld rank%s x "
                        "--batch %ld: give --batch %lld to keep the global batch (a resumed "
                        "run keeps it)", dir, ranks0, ranks0 > 1 ? "s" : "", batch0, g,
                        o->ranks, o->ranks > 1 ? "s" : "", o->batch, g / o->ranks);
    }
    st->from_ranks = ranks0;
    st->from_batch = batch0;
  }
  for (int i = 0; i < NFP; i++) {
    const char *v = loom_safetensors_meta(f, fp.key[i]);
    if (!v && strcmp(fp.key[i], "train.min_lr") == 0) v = "0"; /* written before --min-lr */
    if (!v)
      return train_fail(LOOM_EFORMAT, "--resume %s: the checkpoint lacks '%s'", dir, fp.key[i]);
    if (st->from_ranks &&
        (strcmp(fp.key[i], "train.ranks") == 0 || strcmp(fp.key[i], "train.batch") == 0))
      continue;
    if (strcmp(fp.key[i], "train.epochs") == 0) continue; /* may grow: check_counters */
    if (strcmp(v, fp.value[i]) != 0) {
      char was[40], now[40];
      if (strcmp(fp.key[i], "train.shuffle") == 0)
        return train_fail(LOOM_EINVAL,
                          "--resume %s: the checkpoint was written with %s, this run has %s "
                          "(a resumed run must use the same options)",
                          dir, shown(fp.key[i], v, was, sizeof was),
                          shown(fp.key[i], fp.value[i], now, sizeof now));
      return train_fail(LOOM_EINVAL,
                        "--resume %s: the checkpoint was written with --%s %s, this run has %s "
                        "(a resumed run must use the same options)",
                        dir, option_of(fp.key[i]), shown(fp.key[i], v, was, sizeof was),
                        shown(fp.key[i], fp.value[i], now, sizeof now));
    }
  }
  return LOOM_OK;
}

/* The checkpoint's counters (counter_keys), each a whole number that fits this run: the same
 * steps per epoch, a step within --epochs, its epoch and batch index, an optimizer step count
 * no larger than the step. */
static int check_counters(const loom_safetensors *f, const char *dir, const train_opts *o,
                          const train_state *st, int64_t c[NCOUNT]) {
  for (int i = 0; i < NCOUNT; i++)
    if (loom_safetensors_meta_i64(f, counter_keys[i], &c[i]) || c[i] < 0)
      return train_fail(LOOM_EFORMAT, "--resume %s: the checkpoint's '%s' is missing or not a "
                        "whole number", dir, counter_keys[i]);
  int64_t step = c[0], spe = st->steps_per_epoch, total;
  if (c[3] != spe)
    return train_fail(LOOM_EINVAL, "--resume %s: the checkpoint has %lld steps per epoch, this "
                      "run %lld (other data?)", dir, (long long)c[3], (long long)spe);
  if (__builtin_mul_overflow((int64_t)o->epochs, spe, &total)) total = INT64_MAX;
  if (step > total)
    return train_fail(LOOM_EFORMAT, "--resume %s: the checkpoint's step %lld is past this run's "
                      "%lld steps (--epochs %ld x %lld)", dir, (long long)step, (long long)total,
                      o->epochs, (long long)spe);
  if (c[1] != step / spe || c[2] != step % spe)
    return train_fail(LOOM_EFORMAT, "--resume %s: the checkpoint's epoch %lld and batch %lld "
                      "do not match its step %lld (%lld steps per epoch)", dir, (long long)c[1],
                      (long long)c[2], (long long)step, (long long)spe);
  if (c[4] > step)
    return train_fail(LOOM_EFORMAT, "--resume %s: the checkpoint's optimizer step count %lld "
                      "is above its step %lld", dir, (long long)c[4], (long long)step);
  return LOOM_OK;
}

/* Every step ran one scaler update, and one optimizer step unless it overflowed. */
static int check_scaler_counts(const char *dir, const loom_scaler *scaler, int64_t step,
                               int64_t optim_steps) {
  int64_t skipped = 0;
  if (scaler && loom_scaler_enabled(scaler)) {
    loom_scaler_stats ss;
    int rc = loom_scaler_stats_get(scaler, &ss);
    if (rc) return train_fail_loom(rc, "--resume: the scaler");
    if (ss.total_overflows + ss.total_successful_iterations != step)
      return train_fail(LOOM_EFORMAT, "--resume %s: the scaler counted %lld overflows and %lld "
                        "successful steps, but the checkpoint is at step %lld", dir,
                        (long long)ss.total_overflows, (long long)ss.total_successful_iterations,
                        (long long)step);
    skipped = ss.total_overflows;
  }
  if (optim_steps != step - skipped)
    return train_fail(LOOM_EFORMAT, "--resume %s: the checkpoint's optimizer step count %lld is "
                      "not its step %lld less the %lld skipped (overflow) steps", dir,
                      (long long)optim_steps, (long long)step, (long long)skipped);
  return LOOM_OK;
}

/* The step DIR/model.safetensors records, or -1 (absent, unreadable, no step). */
static int64_t model_step(const char *dir) {
  char path[4096];
  path_in(path, sizeof path, dir, "model.safetensors");
  loom_safetensors *f = NULL;
  int64_t step = -1;
  if (loom_safetensors_open(path, 0, &f) == LOOM_OK && loom_safetensors_meta_i64(f, "step", &step))
    step = -1;
  loom_safetensors_free(f);
  return step;
}

int train_ckpt_load(const char *dir, const train_opts *o, train_model *m, loom_optim *opt,
                    loom_scaler *scaler, train_state *st) {
  char path[4096];
  path_in(path, sizeof path, dir, "checkpoint.safetensors");
  loom_safetensors *f = NULL;
  int rc = loom_checkpoint_open(path, &f);
  if (rc) return train_fail_loom(rc, "--resume");
  int64_t c[NCOUNT] = {0};
  rc = check_fingerprint(f, dir, o, m, st);
  if (!rc) rc = check_counters(f, dir, o, st, c);
  entries es = {0};
  if (!rc) rc = make_entries(m, opt, scaler != NULL, &es);
  if (!rc) {
    rc = loom_checkpoint_read(f, es.e, es.n);
    if (rc) train_fail_loom(rc, "--resume");
  }
  loom_safetensors_free(f);
  if (!rc && scaler) {
    loom_scaler_state ss;
    rc = loom_scaler_state_unpack(es.scaler_words, &ss);
    if (!rc) rc = loom_scaler_restore(scaler, &ss);
    if (rc) train_fail_loom(rc, "--resume: the scaler (amp.scaler)");
  }
  free_entries(&es);
  if (!rc) rc = check_scaler_counts(dir, scaler, c[0], c[4]);
  if (!rc) rc = loom_optim_set_step_count(opt, c[4]);
  if (!rc) st->step = c[0];
  st->model_step = rc ? -1 : model_step(dir);
  return rc;
}

/* ---- FSDP: the full model on rank 0, the rest sharded ------------------------------------- */

static void fsdp_set_path(const char *dir, char *buf, size_t cap) { path_in(buf, cap, dir, "fsdp"); }

int train_ckpt_save_fsdp(const char *dir, const train_opts *o, const train_model *m,
                         loom_fsdp *fsdp, const loom_optim *opt, const train_state *st) {
  if (mkdir(dir, 0777) != 0 && errno != EEXIST)
    return train_fail(LOOM_EIO, "--save %s: cannot create the folder: %s", dir, strerror(errno));
  ckpt_meta cm;
  make_meta(o, m, opt, st, &cm);
  const loom_safetensors_meta_kv *meta = cm.kv;
  /* the model file first (rank 0), so that the sharded set is never ahead of it; every rank
   * takes part in the gathers and in the sharded save whatever rank 0's file did, so that the
   * collectives stay matched */
  loom_named_tensor *state = NULL;
  size_t n = 0;
  int rc = loom_fsdp_full_state(fsdp, &state, &n);
  if (rc) return train_fail_loom(rc, "--save: gathering the model");
  int rc_model = LOOM_OK;
  if (state) {
    char model[4096];
    path_in(model, sizeof model, dir, "model.safetensors");
    rc_model = clean(model);
    loom_safetensors_entry *e = calloc(n ? n : 1, sizeof *e);
    if (!rc_model && !e) rc_model = train_fail(LOOM_ENOMEM, "--save: out of memory");
    for (size_t i = 0; !rc_model && i < n; i++)
      e[i] = (loom_safetensors_entry){.name = state[i].name, .tensor = state[i].tensor};
    if (!rc_model && (rc_model = loom_safetensors_write(model, e, n, cm.model_kv, cm.nmodel)))
      train_fail_loom(rc_model, "saving the model");
    free(e);
    loom_fsdp_state_free(state, n);
  }
  char set[4096];
  fsdp_set_path(dir, set, sizeof set);
  rc = loom_fsdp_save_sharded(fsdp, set, opt, meta, cm.nkv);
  if (rc && !rc_model) return train_fail_loom(rc, "--save");
  return rc_model ? rc_model : rc;
}

int train_ckpt_load_fsdp(const char *dir, const train_opts *o, const train_model *m,
                         loom_fsdp *fsdp, loom_optim *opt, train_state *st) {
  char set[4096], index[4200];
  fsdp_set_path(dir, set, sizeof set);
  snprintf(index, sizeof index, "%s/fsdp-index.safetensors", set);
  struct stat sb;
  if (stat(index, &sb) != 0)
    return train_fail(LOOM_ENOTFOUND, "--resume %s: no FSDP checkpoint (%s): a run without "
                      "--strategy fsdp writes DIR/checkpoint.safetensors instead", dir, index);
  loom_safetensors *f = NULL;
  int rc = loom_checkpoint_open(index, &f);
  if (rc) return train_fail_loom(rc, "--resume");
  int64_t c[NCOUNT] = {0};
  rc = check_fingerprint(f, dir, o, m, st);
  if (!rc) rc = check_counters(f, dir, o, st, c);
  loom_safetensors_free(f);
  if (!rc && (rc = loom_fsdp_load_sharded(fsdp, set, opt))) train_fail_loom(rc, "--resume");
  loom_fsdp_mp *mp = loom_fsdp_mp_manager(fsdp);
  if (!rc) rc = check_scaler_counts(dir, mp ? loom_fsdp_mp_scaler(mp) : NULL, c[0], c[4]);
  if (!rc && loom_optim_step_count(opt) != c[4])
    rc = train_fail(LOOM_EFORMAT, "--resume %s: the shards' optimizer step count %lld is not "
                    "the index's %lld", dir, (long long)loom_optim_step_count(opt), (long long)c[4]);
  if (!rc) st->step = c[0];
  st->model_step = rc ? -1 : model_step(dir);
  return rc;
}
