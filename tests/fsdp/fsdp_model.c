/* fsdp_model.c: the FSDP tests' model, data and step (see fsdp_model.h). */
#include "fsdp_model.h"
#include "lt_tree.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static float hash_unit(uint64_t x) { /* a value in [-1, 1) from an integer */
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return (float)((double)(x >> 11) / (double)(1ull << 52)) - 1.0f;
}

int fm_create(uint64_t seed, loom_module **out) {
  const int64_t sizes[4] = {FM_IN, FM_H1, FM_H2, FM_OUT};
  return loom_nn_mlp_create(sizes, 4, LOOM_ACT_RELU, LOOM_F32, seed, out);
}

int fm_batch_of(int64_t row0, int64_t rows, int width, int classes, loom_tensor **x,
                loom_tensor **y) {
  int64_t xs[2] = {rows, width};
  int rc = loom_tensor_empty(LOOM_F32, 2, xs, x);
  if (!rc) rc = loom_tensor_empty(LOOM_I64, 1, &rows, y);
  if (rc) return rc;
  float *xd = loom_tensor_data(*x);
  int64_t *yd = loom_tensor_data(*y);
  for (int64_t r = 0; r < rows; r++) {
    uint64_t row = (uint64_t)(row0 + r);
    for (int k = 0; k < width; k++)
      xd[r * width + k] = 2.0f * hash_unit(7777u + row * 131u + (uint64_t)k);
    yd[r] = (int64_t)((hash_unit(4242u + row * 17u) + 1.0f) * 0.5f * (float)classes) % classes;
  }
  return LOOM_OK;
}

int fm_batch(int64_t row0, int64_t rows, loom_tensor **x, loom_tensor **y) {
  return fm_batch_of(row0, rows, FM_IN, FM_OUT, x, y);
}

int fm_backward_of(loom_module *m, int64_t row0, int64_t rows, int width, int classes,
                   loom_autocast_mode amp, float scale, double *loss_value) {
  loom_tensor *x = NULL, *y = NULL, *logits = NULL, *loss = NULL, *scaled = NULL;
  loom_autocast_token tok = {0};
  int rc = fm_batch_of(row0, rows, width, classes, &x, &y);
  if (!rc) rc = loom_autocast_enter(amp, NULL, &tok);
  if (!rc) {
    rc = loom_module_forward(m, x, &logits);
    if (!rc) rc = loom_cross_entropy(logits, y, LOOM_REDUCTION_MEAN, -100, &loss);
    int rc2 = loom_autocast_exit(&tok);
    if (!rc) rc = rc2;
  }
  if (!rc && loss_value) rc = loom_tensor_item(loss, loss_value);
  if (!rc) rc = loom_mul_scalar(loss, scale, &scaled);
  if (!rc) rc = loom_backward(scaled, NULL, false);
  loom_tensor_free(x);
  loom_tensor_free(y);
  loom_tensor_free(logits);
  loom_tensor_free(loss);
  loom_tensor_free(scaled);
  return rc;
}

int fm_backward(loom_module *m, int64_t row0, int64_t rows, loom_autocast_mode amp, float scale,
                double *loss_value) {
  return fm_backward_of(m, row0, rows, FM_IN, FM_OUT, amp, scale, loss_value);
}

loom_adam_cfg fm_adam(void) {
  loom_adam_cfg c = loom_adamw_cfg_default();
  c.lr = 1e-2;
  c.eps = 1e-4;
  return c;
}

int fm_wrap(loom_pg *pg, loom_module *m, const loom_fsdp_cfg *cfg, loom_pool state_pool,
            loom_fsdp **f, loom_optim **opt) {
  const loom_param_seg *segs = NULL;
  size_t nseg = 0;
  loom_adam_cfg ac = fm_adam();
  ac.state_pool = state_pool;
  int rc = loom_fsdp_create(pg, m, cfg, f);
  if (!rc) rc = loom_fsdp_segments(*f, &segs, &nseg);
  if (!rc) rc = loom_optim_create_adamw(segs, nseg, &ac, opt);
  return rc;
}

int fm_setup(loom_pg *pg, uint64_t seed, const loom_fsdp_cfg *cfg, loom_pool state_pool,
             loom_module **m, loom_fsdp **f, loom_optim **opt) {
  int rc = fm_create(seed, m);
  return rc ? rc : fm_wrap(pg, *m, cfg, state_pool, f, opt);
}

int fm_ddp_wrap(loom_pg *pg, loom_module *m, loom_ddp **d, loom_optim **opt) {
  size_t np = loom_module_param_count(m);
  loom_tensor **ps = calloc(np + 1, sizeof *ps);
  const char **names = calloc(np + 1, sizeof *names);
  int rc = ps && names ? LOOM_OK : LOOM_ENOMEM;
  for (size_t i = 0; i < np && !rc; i++) {
    loom_param p;
    rc = loom_module_param(m, i, &p);
    ps[i] = p.value, names[i] = p.name;
  }
  if (!rc) rc = loom_ddp_create(pg, ps, names, np, NULL, d);
  free(ps);
  free(names);
  return rc ? rc : fm_arena_adamw(m, opt);
}

int fm_ddp_run(loom_pg *pg, uint64_t seed, int steps, int64_t rows, loom_autocast_mode amp,
               float *out) {
  int rank = loom_pg_rank(pg), n = loom_pg_size(pg);
  loom_module *m = NULL;
  loom_ddp *d = NULL;
  loom_optim *opt = NULL;
  int rc = fm_create(seed, &m);
  if (!rc) rc = fm_ddp_wrap(pg, m, &d, &opt);
  for (int s = 0; s < steps && !rc; s++) {
    rc = loom_module_zero_grad(m);
    if (!rc) rc = fm_backward(m, ((int64_t)s * n + rank) * rows, rows, amp, 1.0f, NULL);
    if (!rc) rc = loom_ddp_finish(d);
    if (!rc) rc = loom_optim_step(opt);
  }
  if (!rc && rank == 0) fm_flatten_module(m, out);
  loom_optim_free(opt);
  loom_ddp_free(d);
  loom_module_free(m);
  return rc;
}

int fm_arena_adamw(loom_module *m, loom_optim **opt) {
  loom_tensor *values = NULL, *grads = NULL;
  size_t numel = 0;
  int rc = loom_module_arena(m, LOOM_F32, &values, &grads, &numel);
  if (rc) return rc;
  loom_param_seg seg = {"all", loom_tensor_data(values), loom_tensor_data(grads), numel, 0};
  loom_adam_cfg ac = fm_adam();
  return loom_optim_create_adamw(&seg, 1, &ac, opt);
}

void fm_flatten_module(loom_module *m, float *out) {
  size_t at = 0;
  for (size_t i = 0, n = loom_module_param_count(m); i < n; i++) {
    loom_param p;
    loom_module_param(m, i, &p);
    memcpy(out + at, loom_tensor_data(p.value), p.numel * sizeof(float));
    at += p.numel;
  }
}

void fm_flatten_state(const loom_named_tensor *st, size_t n, float *out) {
  size_t at = 0;
  for (size_t i = 0; i < n; i++) {
    size_t k = loom_tensor_numel(st[i].tensor);
    memcpy(out + at, loom_tensor_data(st[i].tensor), k * sizeof(float));
    at += k;
  }
}

int fm_full_state_flat(loom_fsdp *f, float *out) {
  loom_named_tensor *st = NULL;
  size_t nst = 0;
  int rc = loom_fsdp_full_state(f, &st, &nst);
  if (!rc && st) fm_flatten_state(st, nst, out);
  loom_fsdp_state_free(st, nst);
  return rc;
}

bool fm_same_file(const char *a, const char *b) {
  FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
  bool same = fa && fb;
  while (same) {
    int ca = fgetc(fa), cb = fgetc(fb);
    if (ca != cb) same = false;
    if (ca == EOF || cb == EOF) break;
  }
  if (fa) fclose(fa);
  if (fb) fclose(fb);
  return same;
}

void fm_rm_tree(const char *dir) {
  if (dir && *dir) lt_tree_walk(dir, NULL, true);
}

int fm_load_module(loom_fsdp *f, loom_module *src) {
  size_t n = loom_module_param_count(src);
  loom_named_tensor *st = calloc(n ? n : 1, sizeof *st);
  if (!st) return LOOM_ENOMEM;
  int rc = LOOM_OK;
  for (size_t i = 0; i < n && !rc; i++) {
    loom_param p;
    rc = loom_module_param(src, i, &p);
    st[i].name = p.name;
    st[i].tensor = p.value;
  }
  if (!rc) rc = loom_fsdp_load_full_state(f, st, n);
  free(st);
  return rc;
}

double fm_max_diff(const float *a, const float *b, size_t n) {
  double w = 0;
  for (size_t i = 0; i < n; i++) {
    double e = fabs((double)a[i] - (double)b[i]);
    if (!(e <= w)) w = e == e ? e : INFINITY; /* NaN counts as worst */
  }
  return w;
}
