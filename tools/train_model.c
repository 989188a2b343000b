/* train_model.c: the models of `loom train` with PyTorch's parameter names and initialisation:
 * the MLP (loom_nn_mlp_create: "layers.0.weight", ...) and a small CNN, PyTorch's
 *   nn.Sequential(Conv2d(1,C1,3,padding=1), ReLU(), MaxPool2d(2), Conv2d(C1,C2,3,padding=1),
 *                 ReLU(), MaxPool2d(2), Flatten(), Linear(C2*7*7,F), ReLU(), Linear(F,10))
 * module for module, so its parameters are "0.weight", "3.weight", "7.weight", "9.weight" (and
 * biases) and one forward of the root runs it (FSDP's hooks on the root see it). Also loading
 * (--init: into the model, or into FSDP's shards, each rank reading its slice) and saving
 * parameters; a model file's metadata read back (loom eval, loom generate), the model it
 * describes refused when the file's tensors hold fewer values than its parameters. */
#include "train_api.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#define CLASSES 10
#define SIDE 28

static int make_cnn(const train_opts *o, train_model *m) {
  const int64_t k3[2] = {3, 3}, s1[2] = {1, 1}, p1[2] = {1, 1}, k2[2] = {2, 2};
  const uint64_t seed = (uint64_t)o->seed;
  loom_module *ch[10] = {0};
  int rc = loom_nn_conv2d_create(1, o->channels[0], k3, s1, p1, true, LOOM_F32, seed, &ch[0]);
  if (!rc) rc = loom_nn_activation_create(LOOM_ACT_RELU, &ch[1]);
  if (!rc) rc = loom_nn_max_pool2d_create(k2, NULL, NULL, &ch[2]);
  if (!rc)
    rc = loom_nn_conv2d_create(o->channels[0], o->channels[1], k3, s1, p1, true, LOOM_F32,
                               seed + 1, &ch[3]);
  if (!rc) rc = loom_nn_activation_create(LOOM_ACT_RELU, &ch[4]);
  if (!rc) rc = loom_nn_max_pool2d_create(k2, NULL, NULL, &ch[5]);
  if (!rc) rc = loom_nn_flatten_create(1, -1, &ch[6]);
  if (!rc)
    rc = loom_nn_linear_create(o->channels[1] * (SIDE / 4) * (SIDE / 4), o->fc, true, LOOM_F32,
                               seed + 2, &ch[7]);
  if (!rc) rc = loom_nn_activation_create(LOOM_ACT_RELU, &ch[8]);
  if (!rc) rc = loom_nn_linear_create(o->fc, CLASSES, true, LOOM_F32, seed + 3, &ch[9]);
  if (rc) {
    for (int i = 0; i < 10; i++) loom_module_free(ch[i]);
    return rc;
  }
  return loom_nn_sequential_create(ch, 10, &m->root); /* takes the children, also on failure */
}

/* The MLP's layer sizes, input to classes, into sizes[0..n); returns n. */
static int mlp_sizes(const train_opts *o, int64_t sizes[TRAIN_MAX_HIDDEN + 2]) {
  int n = 0;
  sizes[n++] = SIDE * SIDE;
  for (int i = 0; i < o->nhidden; i++) sizes[n++] = o->hidden[i];
  sizes[n++] = CLASSES;
  return n;
}

uint64_t train_model_numel(const train_opts *o) {
  if (strcmp(o->model, "gpt") == 0) {
    loom_gpt_cfg c = {.vocab = LOOM_TEXT_VOCAB, .context = o->context, .layers = o->layers,
                      .heads = o->heads, .dim = o->dim};
    return loom_gpt_numel(&c);
  }
  if (strcmp(o->model, "cnn") == 0) { /* make_cnn's four layers, each with its bias */
    uint64_t c1 = (uint64_t)o->channels[0], c2 = (uint64_t)o->channels[1], fc = (uint64_t)o->fc;
    return c1 * 9 + c1 + c2 * c1 * 9 + c2 + c2 * (SIDE / 4) * (SIDE / 4) * fc + fc +
           fc * CLASSES + CLASSES;
  }
  int64_t sizes[TRAIN_MAX_HIDDEN + 2];
  int n = mlp_sizes(o, sizes);
  uint64_t numel = 0;
  for (int i = 0; i + 1 < n; i++)
    numel += (uint64_t)sizes[i] * (uint64_t)sizes[i + 1] + (uint64_t)sizes[i + 1];
  return numel;
}

int train_model_create(const train_opts *o, train_model *m) {
  memset(m, 0, sizeof *m);
  int rc;
  if (strcmp(o->model, "gpt") == 0) {
    m->gpt = true;
    m->gpt_cfg = (loom_gpt_cfg){.vocab = LOOM_TEXT_VOCAB, .context = o->context,
                                .layers = o->layers, .heads = o->heads, .dim = o->dim};
    rc = loom_nn_gpt_create(&m->gpt_cfg, (uint64_t)o->seed, &m->root);
    if (!rc && o->checkpoint_activations) rc = loom_gpt_set_checkpoint(m->root, true);
  } else if (strcmp(o->model, "cnn") == 0) {
    m->cnn = true;
    rc = make_cnn(o, m);
  } else {
    int64_t sizes[TRAIN_MAX_HIDDEN + 2];
    int n = mlp_sizes(o, sizes);
    rc = loom_nn_mlp_create(sizes, n, LOOM_ACT_RELU, LOOM_F32, (uint64_t)o->seed, &m->root);
  }
  if (rc) return train_fail_loom(rc, "building the model");
  m->nparams = loom_module_param_count(m->root);
  m->params = calloc(m->nparams ? m->nparams : 1, sizeof *m->params);
  if (!m->params) {
    train_model_free(m);
    return train_fail(LOOM_ENOMEM, "building the model: out of memory");
  }
  for (size_t i = 0; i < m->nparams; i++) loom_module_param(m->root, i, &m->params[i]);
  return LOOM_OK;
}

void train_model_free(train_model *m) {
  loom_module_free(m->root);
  free(m->params);
  memset(m, 0, sizeof *m);
}

bool train_model_flat_input(const train_model *m) { return !m->cnn && !m->gpt; }

int train_model_forward(train_model *m, loom_tensor *x, loom_tensor **logits) {
  return loom_module_forward(m->root, x, logits);
}

int train_model_loss(const train_model *m, loom_tensor *logits, loom_tensor *y,
                     loom_tensor **out) {
  if (m->gpt) return loom_gpt_loss(logits, y, out);
  return loom_cross_entropy(logits, y, LOOM_REDUCTION_MEAN, -100, out);
}

#define GPT_KEYS 5
static const char *const gpt_keys[GPT_KEYS] = {"gpt.vocab", "gpt.context", "gpt.layers",
                                               "gpt.heads", "gpt.dim"};

static void meta_put(train_model_meta *out, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void meta_put(train_model_meta *out, const char *key, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(out->value[out->n], sizeof out->value[out->n], fmt, ap);
  va_end(ap);
  out->kv[out->n] = (loom_safetensors_meta_kv){key, out->value[out->n]};
  out->n++;
}

/* "a,b,c" of n sizes into buf. */
static void size_list(const int64_t *v, int n, char *buf, size_t cap) {
  size_t len = 0;
  buf[0] = '\0';
  for (int i = 0; i < n && len < cap; i++)
    len += (size_t)snprintf(buf + len, cap - len, "%s%lld", i ? "," : "", (long long)v[i]);
}

void train_model_meta_make(const train_model *m, const train_opts *o, train_model_meta *out) {
  out->n = 0;
  if (m->gpt) {
    const loom_gpt_cfg *c = &m->gpt_cfg;
    const int64_t v[GPT_KEYS] = {c->vocab, c->context, c->layers, c->heads, c->dim};
    meta_put(out, "model", "gpt");
    for (int i = 0; i < GPT_KEYS; i++) meta_put(out, gpt_keys[i], "%lld", (long long)v[i]);
    return;
  }
  char list[128];
  if (m->cnn) {
    meta_put(out, "model", "cnn");
    size_list(o->channels, 2, list, sizeof list);
    meta_put(out, "cnn.channels", "%s", list);
    meta_put(out, "cnn.fc", "%lld", (long long)o->fc);
  } else {
    int64_t sizes[TRAIN_MAX_HIDDEN + 2];
    int n = mlp_sizes(o, sizes);
    meta_put(out, "model", "mlp");
    size_list(sizes, n, list, sizeof list);
    meta_put(out, "mlp.sizes", "%s", list);
  }
  meta_put(out, "classes", "%d", CLASSES);
  meta_put(out, "input.shape", m->cnn ? "1,%d,%d" : "%d", SIDE * (m->cnn ? 1 : SIDE), SIDE);
  meta_put(out, "input.mean", "%g", (double)LOOM_FASHION_MNIST_MEAN);
  meta_put(out, "input.std", "%g", (double)LOOM_FASHION_MNIST_STD);
  meta_put(out, "input", "%s grey images of %dx%d pixels of 0..255: a pixel x is fed as "
           "(x / 255 - input.mean) / input.std", m->cnn ? "[N,1,28,28]" : "[N,784] row-major",
           SIDE, SIDE);
  meta_put(out, "amp", "%s", o->amp);
}

/* A metadata number (a float of the file's text), or LOOM_EFORMAT naming the key. */
static int meta_float(const loom_safetensors *f, const char *path, const char *key, float *out) {
  const char *v = loom_safetensors_meta(f, key);
  char *end = NULL;
  double x = v ? strtod(v, &end) : 0;
  if (!v || end == v || *end || !isfinite(x))
    return train_fail(LOOM_EFORMAT, "%s: the metadata entry \"%s\" is %s", path, key,
                      v ? "not a finite number" : "missing");
  *out = (float)x;
  return LOOM_OK;
}

/* "a,b,..." of positive sizes up to TRAIN_MAX_WIDTH into v[0..*n), at most max. */
static int meta_sizes(const loom_safetensors *f, const char *path, const char *key, int64_t *v,
                      int max, int *n) {
  const char *s = loom_safetensors_meta(f, key);
  *n = 0;
  for (const char *p = s; p && *n < max;) {
    char *end = NULL;
    long long x = *p >= '0' && *p <= '9' ? strtoll(p, &end, 10) : 0;
    if (!end || x < 1 || x > (1LL << 20) || (*end && *end != ',')) break;
    v[(*n)++] = x;
    if (!*end) return LOOM_OK;
    p = end + 1;
  }
  return train_fail(LOOM_EFORMAT, "%s: the metadata entry \"%s\" is %s", path, key,
                    s ? "not a list of at most 10 positive sizes" : "missing");
}

/* LOOM_EFORMAT unless the file's tensors hold at least the `numel` values of the model its
 * metadata describes: a few hundred bytes whose metadata claims billions of parameters are
 * refused here, before a model of that size is made (and initialised) to load them into. */
static int file_holds(const loom_safetensors *f, const char *path, uint64_t numel) {
  uint64_t held = 0;
  for (size_t i = 0; i < loom_safetensors_count(f); i++) {
    loom_safetensors_info info;
    if (loom_safetensors_info_at(f, i, &info) == LOOM_OK) held += info.numel;
  }
  if (held >= numel) return LOOM_OK;
  return train_fail(LOOM_EFORMAT, "%s: its metadata describes a model of %llu parameters, but "
                    "its tensors hold %llu values (a damaged file, or not the model's)", path,
                    (unsigned long long)numel, (unsigned long long)held);
}

int train_model_meta_image(const loom_safetensors *f, const char *path, train_opts *o,
                           float *mean, float *std) {
  const char *model = loom_safetensors_meta(f, "model");
  if (!model || (strcmp(model, "mlp") != 0 && strcmp(model, "cnn") != 0))
    return train_fail(LOOM_EINVAL, "%s: not an image classifier's model file (its metadata has "
                      "%s%.40s; `loom train --save DIR` writes one, with --model mlp or cnn)",
                      path, model ? "model = " : "no \"model\" entry (an older file?)",
                      model ? model : "");
  int64_t v[TRAIN_MAX_HIDDEN + 2];
  int n = 0, rc;
  if (strcmp(model, "mlp") == 0) {
    o->model = "mlp";
    if ((rc = meta_sizes(f, path, "mlp.sizes", v, TRAIN_MAX_HIDDEN + 2, &n))) return rc;
    if (n < 2 || v[0] != SIDE * SIDE || v[n - 1] != CLASSES)
      return train_fail(LOOM_EFORMAT, "%s: \"mlp.sizes\" must run from %d to %d", path,
                        SIDE * SIDE, CLASSES);
    o->nhidden = n - 2;
    for (int i = 0; i < n - 2; i++) o->hidden[i] = v[i + 1];
  } else {
    o->model = "cnn";
    if ((rc = meta_sizes(f, path, "cnn.channels", o->channels, 2, &n))) return rc;
    if (n != 2) return train_fail(LOOM_EFORMAT, "%s: \"cnn.channels\" must be two sizes", path);
    if ((rc = meta_sizes(f, path, "cnn.fc", &o->fc, 1, &n))) return rc;
  }
  if ((rc = meta_float(f, path, "input.mean", mean)) || (rc = meta_float(f, path, "input.std", std)))
    return rc;
  if (!(*std > 0)) return train_fail(LOOM_EFORMAT, "%s: \"input.std\" must be positive", path);
  const char *amp = loom_safetensors_meta(f, "amp");
  o->amp = amp && strcmp(amp, "bf16") == 0 ? "bf16" : amp && strcmp(amp, "f16") == 0 ? "f16" : "off";
  return file_holds(f, path, train_model_numel(o));
}

int train_model_meta_gpt(const loom_safetensors *f, const char *path, loom_gpt_cfg *cfg) {
  const char *model = loom_safetensors_meta(f, "model");
  if (!model || strcmp(model, "gpt") != 0)
    return train_fail(LOOM_EINVAL, "%s: not a GPT's model file (its metadata has %s%.40s; "
                      "`loom train --model gpt --save DIR` writes one)", path,
                      model ? "model = " : "no \"model\" entry", model ? model : "");
  int64_t v[GPT_KEYS];
  for (int i = 0; i < GPT_KEYS; i++)
    if (loom_safetensors_meta_i64(f, gpt_keys[i], &v[i]) || v[i] <= 0)
      return train_fail(LOOM_EFORMAT, "%s: the metadata entry \"%s\" is %s", path, gpt_keys[i],
                        loom_safetensors_meta(f, gpt_keys[i]) ? "not a positive size"
                                                              : "missing");
  *cfg = (loom_gpt_cfg){.vocab = v[0], .context = v[1], .layers = v[2], .heads = v[3],
                        .dim = v[4]};
  int rc = loom_gpt_cfg_validate(cfg);
  if (rc) return train_fail(LOOM_EFORMAT, "%s: the metadata's GPT sizes: %s", path,
                            loom_last_error());
  return file_holds(f, path, loom_gpt_numel(cfg));
}

/* LOOM_EINVAL naming the tensor and its first value whose magnitude is above the largest
 * finite value of the forward dtype (f16, bf16; f32 holds every value the file may have). */
static int check_forward_range(const char *name, const float *x, size_t n, const char *path,
                               loom_dtype forward) {
  double most = forward == LOOM_F16 ? 65504.0 : forward == LOOM_BF16 ? 3.3895313892515355e38 : 0;
  if (most == 0) return LOOM_OK;
  for (size_t i = 0; i < n; i++)
    if (fabs((double)x[i]) > most)
      return train_fail(LOOM_EINVAL, "--init %s: tensor '%s' element %zu is %.9g, above the "
                        "largest finite %s value %.9g: the --amp %s forward would make it inf",
                        path, name, i, (double)x[i], loom_dtype_name(forward), most,
                        loom_dtype_name(forward));
  return LOOM_OK;
}

/* The file's tensor for parameter p, checked (F32, p's shape: loom_safetensors_read's checks and
 * messages, given no buffer, so that nothing is copied; it then says only that dst is NULL),
 * as a view over the mapped file's bytes. */
static int file_view(loom_safetensors *f, const loom_param *p, const char *opt,
                     loom_tensor **out) {
  int rc = loom_safetensors_read(f, p->name, LOOM_F32, loom_tensor_ndim(p->value),
                                 loom_tensor_shape(p->value), NULL);
  if (rc == LOOM_EINVAL) rc = LOOM_OK; /* the checks passed; there was no buffer to fill */
  if (!rc) rc = loom_safetensors_check_values(f, p->name, LOOM_CHECK_FINITE);
  if (!rc) rc = loom_safetensors_view(f, p->name, out);
  return rc ? train_fail_loom(rc, opt) : LOOM_OK;
}

/* --init into FSDP's shards: the file mapped, each rank copying only its slice of each
 * parameter (loom_fsdp_load_full_state), so no rank holds the whole model. */
static int load_sharded(train_model *m, loom_safetensors *f, const char *path, loom_dtype forward,
                        const char *opt, loom_fsdp *fsdp) {
  loom_named_tensor *st = calloc(m->nparams ? m->nparams : 1, sizeof *st);
  int rc = st ? LOOM_OK : train_fail(LOOM_ENOMEM, "%s: out of memory", opt);
  for (size_t i = 0; i < m->nparams && !rc; i++) {
    st[i].name = m->params[i].name;
    rc = file_view(f, &m->params[i], opt, &st[i].tensor);
    if (!rc)
      rc = check_forward_range(st[i].name, loom_tensor_data(st[i].tensor),
                               loom_tensor_numel(st[i].tensor), path, forward);
  }
  if (!rc && (rc = loom_fsdp_load_full_state(fsdp, st, m->nparams))) train_fail_loom(rc, opt);
  for (size_t i = 0; st && i < m->nparams; i++) loom_tensor_free(st[i].tensor);
  free(st);
  return rc;
}

int train_model_load(train_model *m, const char *path, loom_dtype forward, const char *opt,
                     loom_fsdp *fsdp) {
  loom_safetensors *f = NULL;
  int rc = loom_safetensors_open(path, fsdp ? LOOM_SAFETENSORS_MMAP : 0, &f);
  if (rc) return train_fail_loom(rc, opt);
  if (fsdp) rc = load_sharded(m, f, path, forward, opt, fsdp);
  for (size_t i = 0; i < m->nparams && !rc && !fsdp; i++) {
    const loom_param *p = &m->params[i];
    rc = loom_safetensors_read(f, p->name, LOOM_F32, loom_tensor_ndim(p->value),
                               loom_tensor_shape(p->value), loom_tensor_data(p->value));
    if (!rc) rc = loom_safetensors_check_values(f, p->name, LOOM_CHECK_FINITE);
    if (rc) train_fail_loom(rc, opt);
    else rc = check_forward_range(p->name, loom_tensor_data(p->value),
                                  loom_tensor_numel(p->value), path, forward);
  }
  for (size_t i = 0; i < loom_safetensors_count(f) && !rc; i++) {
    loom_safetensors_info info;
    loom_safetensors_info_at(f, i, &info);
    loom_param p;
    if (loom_module_param_by_name(m->root, info.name, &p))
      rc = train_fail(LOOM_EINVAL, "%s: %s: tensor '%s' is not a parameter of the model",
                      opt, path, info.name);
  }
  loom_safetensors_free(f);
  return rc;
}

int train_model_save(const train_model *m, const char *path, const loom_safetensors_meta_kv *meta,
                     size_t nmeta) {
  loom_safetensors_entry *e = calloc(m->nparams ? m->nparams : 1, sizeof *e);
  if (!e) return train_fail(LOOM_ENOMEM, "saving %s: out of memory", path);
  for (size_t i = 0; i < m->nparams; i++)
    e[i] = (loom_safetensors_entry){.name = m->params[i].name, .tensor = m->params[i].value};
  int rc = loom_safetensors_write(path, e, m->nparams, meta, nmeta);
  free(e);
  return rc ? train_fail_loom(rc, "saving the model") : LOOM_OK;
}

void train_model_describe(const train_model *m, const train_opts *o, char *buf, size_t cap) {
  if (m->gpt) {
    const loom_gpt_cfg *c = &m->gpt_cfg;
    snprintf(buf, cap, "gpt %lld layers, %lld heads, %lld wide, context %lld, vocab %lld",
             (long long)c->layers, (long long)c->heads, (long long)c->dim,
             (long long)c->context, (long long)c->vocab);
    return;
  }
  if (m->cnn) {
    snprintf(buf, cap, "cnn conv 1-%lld-%lld, fc %lld-%lld-%d", (long long)o->channels[0],
             (long long)o->channels[1], (long long)(o->channels[1] * 49), (long long)o->fc,
             CLASSES);
    return;
  }
  int n = snprintf(buf, cap, "mlp %d", SIDE * SIDE);
  for (int i = 0; i < o->nhidden && n > 0 && (size_t)n < cap; i++)
    n += snprintf(buf + n, cap - (size_t)n, "-%lld", (long long)o->hidden[i]);
  if (n > 0 && (size_t)n < cap) snprintf(buf + n, cap - (size_t)n, "-%d", CLASSES);
}
