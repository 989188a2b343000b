/* test_clip.c: gradient-norm clipping, its one rule (loom/optim.h) and its one implementation.
 * The matrix: the same gradients (finite, with +-inf, with NaN; max_norm that clips, that does
 * not, 0 and +inf; error_if_nonfinite off and on) clipped with no strategy (segments), under
 * DDP (2 ranks on the threads backend: the gradients come out of a real backward, averaged by
 * DDP, then loom_clip_grad_norm_tensors on every rank) and under FSDP (2 ranks: each rank's
 * gradient shards, loom_fsdp_clip_grad_norm) give the status, the norm and the gradients of a
 * scalar reference written here (float64 sum of squares, PyTorch's f32 coefficient, f32
 * products), bit for bit (a NaN matches any NaN: IEEE leaves payloads open). The gradient
 * values are multiples of 1/64 below 2, so every double sum of squares is exact whatever its
 * order: the strategies may then differ in nothing. Also the pieces: f16 / bf16 buffers against
 * their f32 widening, lanes carried across chunks (FSDP's streamed shards), the coefficient's
 * cases, the tensor entry and the errors. */
#include "lt.h"
#include "loom/ddp.h"
#include "loom/fsdp.h"
#include "optim/optim_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { NR = 2, MAXU = 8, MAXLEN = 2048 };

/* ---- the gradient set: one vector per FSDP unit of the test model (its padded flat) -------- */

typedef enum gkind { G_FINITE, G_INF, G_NAN } gkind;

typedef struct clip_case {
  const char *name;
  gkind kind;
  double max_norm;
} clip_case;

static const clip_case cases[] = {
    {"finite, clipping", G_FINITE, 1.0},
    {"finite, below max_norm", G_FINITE, 1e4},
    {"finite, max_norm 0", G_FINITE, 0.0},
    {"finite, max_norm inf", G_FINITE, INFINITY},
    {"+-inf", G_INF, 1.0},
    {"nan", G_NAN, 1.0},
    {"nan, max_norm 0", G_NAN, 0.0},
};
enum { NCASES = sizeof cases / sizeof cases[0] };

/* Vector lengths: the units' padded flat sizes, learned from the FSDP run (rank 0). */
typedef struct gset {
  size_t n;
  size_t len[MAXU];
} gset;

/* Element i of vector u (of length len): k/64 with k in [-128, 127], and in the non-finite
 * kinds +inf and -inf, or one NaN, at fixed places (both ranks' shards get one). */
static float value(gkind kind, size_t u, size_t i, size_t len) {
  uint32_t h = (uint32_t)(u * 7919u + i) * 2654435761u;
  float v = (float)((int)(h >> 24) - 128) / 64.0f;
  if (kind == G_INF && u == 1 && i == 5) v = INFINITY;
  if (kind == G_INF && u == 0 && i == len - 3) v = -INFINITY;
  if (kind == G_NAN && u == 1 && i == len - 2) v = NAN;
  return v;
}

typedef struct result {
  int rc;
  double norm;
  char msg[256];
  float g[MAXU][MAXLEN];
} result;

static void fill_set(const gset *s, gkind kind, result *r) {
  for (size_t u = 0; u < s->n; u++)
    for (size_t i = 0; i < s->len[u]; i++) r->g[u][i] = value(kind, u, i, s->len[u]);
}

/* The scalar reference: the rule written out plainly. */
static void reference(const gset *s, const clip_case *c, bool eif, result *r) {
  fill_set(s, c->kind, r);
  double sum = 0;
  for (size_t u = 0; u < s->n; u++)
    for (size_t i = 0; i < s->len[u]; i++) sum += (double)r->g[u][i] * (double)r->g[u][i];
  r->norm = sqrt(sum);
  r->rc = LOOM_OK;
  if (!isfinite(r->norm) && eif) {
    r->rc = LOOM_EINVAL;
    return;
  }
  float coef = (1.0f / ((float)r->norm + 1e-6f)) * (float)c->max_norm;
  if (coef > 1.0f) coef = 1.0f;
  for (size_t u = 0; u < s->n; u++)
    for (size_t i = 0; i < s->len[u]; i++) r->g[u][i] = r->g[u][i] * coef;
}

static bool same_f(float a, float b) { return isnan(a) ? isnan(b) : !memcmp(&a, &b, sizeof a); }
static bool same_d(double a, double b) { return isnan(a) ? isnan(b) : !memcmp(&a, &b, sizeof a); }

/* got == want bit for bit: status (and its message), norm, every gradient. */
static void expect_same(const char *who, const clip_case *c, bool eif, const gset *s,
                        const result *want, const result *got) {
  if (got->rc != want->rc || !same_d(got->norm, want->norm)) {
    lt_fail_at(__FILE__, __LINE__, "%s, %s, error_if_nonfinite %d: rc %d norm %.17g, want %d %.17g",
               who, c->name, (int)eif, got->rc, got->norm, want->rc, want->norm);
    return;
  }
  if (want->rc) {
    const char *what = isnan(want->norm) ? "total norm is nan" : "total norm is inf";
    if (!strstr(got->msg, what))
      lt_fail_at(__FILE__, __LINE__, "%s, %s: message \"%s\" lacks \"%s\"", who, c->name,
                 got->msg, what);
  }
  size_t bad = 0;
  for (size_t u = 0; u < s->n; u++)
    for (size_t i = 0; i < s->len[u]; i++)
      if (!same_f(got->g[u][i], want->g[u][i]) && bad++ < 3)
        lt_fail_at(__FILE__, __LINE__, "%s, %s, error_if_nonfinite %d: g[%zu][%zu] = %.9g, "
                   "want %.9g", who, c->name, (int)eif, u, i, (double)got->g[u][i],
                   (double)want->g[u][i]);
}

static void record(result *r, int rc, double norm) {
  r->rc = rc;
  r->norm = norm;
  snprintf(r->msg, sizeof r->msg, "%s", rc ? loom_last_error() : "");
}

/* ---- the three strategies ------------------------------------------------------------------ */

typedef struct job {
  const clip_case *c;
  bool eif;
  gset *set;
  result *res[NR]; /* FSDP: res[0] gets the status of rank 0, res[1] of rank 1, both the
                      gradients (each rank its shard); DDP: each rank its own */
} job;

/* FSDP: the test model (an MLP 12-40-24-5, 3 units), a real backward, then this case's
 * gradients in the shards (rank r holds elements [r*S, (r+1)*S) of each unit's flat). */
static int fsdp_rank(loom_pg *pg, void *arg) {
  job *j = arg;
  int rank = loom_pg_rank(pg);
  const int64_t sizes[4] = {12, 40, 24, 5};
  loom_module *m = NULL;
  loom_fsdp *f = NULL;
  loom_tensor *x = NULL, *y = NULL, *loss = NULL;
  int rc = loom_nn_mlp_create(sizes, 4, LOOM_ACT_RELU, LOOM_F32, 3, &m);
  if (!rc) rc = loom_fsdp_create(pg, m, NULL, &f);
  if (!rc) rc = loom_tensor_zeros(LOOM_F32, 2, (int64_t[]){3, 12}, &x);
  if (!rc) {
    float *xd = loom_tensor_data(x);
    for (int i = 0; i < 36; i++) xd[i] = (float)(i % 7 + rank) / 8;
    rc = loom_module_forward(m, x, &y);
  }
  if (!rc) rc = loom_sum(y, NULL, 0, false, &loss);
  if (!rc) rc = loom_backward(loss, NULL, false);
  if (!rc) rc = loom_fsdp_finish(f);
  const loom_param_seg *segs = NULL;
  size_t nseg = 0;
  if (!rc) rc = loom_fsdp_segments(f, &segs, &nseg);
  if (!rc && (nseg < 2 || nseg > MAXU)) rc = loom__fail(LOOM_EINVAL, "%zu units", nseg);
  loom_fsdp_unit_info info[MAXU];
  for (size_t u = 0; u < nseg && !rc; u++) {
    rc = loom_fsdp_unit_info_get(f, u, &info[u]);
    if (!rc && info[u].padded_numel > MAXLEN) rc = loom__fail(LOOM_EINVAL, "unit too large");
    if (rc) break;
    if (rank == 0) j->set->len[u] = info[u].padded_numel;
    float *g = (float *)segs[u].grad;
    for (size_t i = 0; i < info[u].shard_numel; i++)
      g[i] = value(j->c->kind, u, info[u].shard_offset + i, info[u].padded_numel);
  }
  if (rank == 0) j->set->n = nseg;
  if (!rc) {
    double norm = -1;
    int crc = loom_fsdp_clip_grad_norm(f, j->c->max_norm, j->eif, &norm);
    record(j->res[rank], crc, norm);
    for (size_t u = 0; u < nseg; u++)
      memcpy(j->res[0]->g[u] + info[u].shard_offset, segs[u].grad,
             info[u].shard_numel * sizeof(float));
  }
  loom_tensor_free(loss);
  loom_tensor_free(y);
  loom_tensor_free(x);
  loom_fsdp_free(f);
  loom_module_free(m);
  return rc;
}

/* DDP: one 1-D parameter per vector; loss = sum over k of sum(w_k * c_k), whose gradient is
 * c_k; rank 0's c_k is the value plus d, rank 1's the value minus d (a non-finite value: it,
 * and 1 on rank 1), so DDP's average is the value, exactly. */
static int ddp_rank(loom_pg *pg, void *arg) {
  job *j = arg;
  int rank = loom_pg_rank(pg);
  const gset *s = j->set;
  loom_tensor *w[MAXU] = {0}, *cst[MAXU] = {0}, *loss = NULL;
  loom_ddp *d = NULL;
  static _Thread_local float buf[MAXLEN];
  int rc = LOOM_OK;
  for (size_t k = 0; k < s->n && !rc; k++) {
    int64_t len = (int64_t)s->len[k];
    for (size_t i = 0; i < s->len[k]; i++) buf[i] = (float)((i * 37 + k) % 11) / 16 - 0.3f;
    rc = loom_tensor_from_data(LOOM_F32, 1, &len, buf, &w[k]);
    if (!rc) rc = loom_tensor_set_requires_grad(w[k], true);
    for (size_t i = 0; i < s->len[k]; i++) {
      float v = value(j->c->kind, k, i, s->len[k]), dv = (float)(i % 5) / 4;
      buf[i] = !isfinite(v) ? (rank ? 1.0f : v) : rank ? v - dv : v + dv;
    }
    if (!rc) rc = loom_tensor_from_data(LOOM_F32, 1, &len, buf, &cst[k]);
  }
  if (!rc) rc = loom_ddp_create(pg, w, NULL, s->n, NULL, &d);
  for (size_t k = 0; k < s->n && !rc; k++) {
    loom_tensor *p = NULL, *t = NULL, *sum = NULL;
    rc = loom_mul(w[k], cst[k], &p);
    if (!rc) rc = loom_sum(p, NULL, 0, false, &t);
    if (!rc && loss) rc = loom_add(loss, t, &sum);
    loom_tensor_free(p);
    if (!rc && loss) {
      loom_tensor_free(loss);
      loom_tensor_free(t);
      loss = sum;
    } else if (!rc) {
      loss = t;
    } else {
      loom_tensor_free(t);
    }
  }
  if (!rc) rc = loom_backward(loss, NULL, false);
  if (!rc) rc = loom_ddp_finish(d);
  loom_tensor *grads[MAXU];
  for (size_t k = 0; k < s->n && !rc; k++) {
    grads[k] = loom_tensor_grad(w[k]);
    const float *g = loom_tensor_data(grads[k]);
    for (size_t i = 0; i < s->len[k]; i++) /* DDP averaged to the values, exactly */
      if (!same_f(g[i], value(j->c->kind, k, i, s->len[k])))
        rc = loom__fail(LOOM_EINVAL, "DDP gradient %zu[%zu] = %g", k, i, (double)g[i]);
  }
  if (!rc) {
    double norm = -1;
    int crc = loom_clip_grad_norm_tensors(grads, s->n, j->c->max_norm, j->eif, &norm);
    record(j->res[rank], crc, norm);
    for (size_t k = 0; k < s->n; k++)
      memcpy(j->res[rank]->g[k], loom_tensor_data(grads[k]), s->len[k] * sizeof(float));
  }
  loom_tensor_free(loss);
  loom_ddp_free(d);
  for (size_t k = 0; k < s->n; k++) loom_tensor_free(w[k]), loom_tensor_free(cst[k]);
  return rc;
}

/* No strategy: the vectors as segments. */
static void single(const gset *s, const clip_case *c, bool eif, result *r) {
  fill_set(s, c->kind, r);
  loom_param_seg seg[MAXU];
  for (size_t u = 0; u < s->n; u++) seg[u] = (loom_param_seg){.grad = r->g[u], .n = s->len[u]};
  double norm = -1;
  int rc = loom_clip_grad_norm(seg, s->n, c->max_norm, eif, &norm);
  record(r, rc, norm);
}

LT_TEST(clip_matrix_same_bits_single_ddp_fsdp_and_reference) {
  static result want, one, fsdp[NR], ddp[NR];
  for (int ci = 0; ci < NCASES; ci++)
    for (int eif = 0; eif < 2; eif++) {
      const clip_case *c = &cases[ci];
      gset set = {0};
      job jf = {c, eif, &set, {&fsdp[0], &fsdp[1]}};
      memset(fsdp, 0, sizeof fsdp);
      LT_OK(loom_threads_run(NR, NULL, fsdp_rank, &jf));
      LT_TRUE(set.n >= 2);
      memcpy(fsdp[1].g, fsdp[0].g, sizeof fsdp[0].g); /* both ranks' shards */
      reference(&set, c, eif, &want);
      single(&set, c, eif, &one);
      job jd = {c, eif, &set, {&ddp[0], &ddp[1]}};
      LT_OK(loom_threads_run(NR, NULL, ddp_rank, &jd));
      expect_same("no strategy", c, eif, &set, &want, &one);
      expect_same("DDP rank 0", c, eif, &set, &want, &ddp[0]);
      expect_same("DDP rank 1", c, eif, &set, &want, &ddp[1]);
      expect_same("FSDP rank 0", c, eif, &set, &want, &fsdp[0]);
      expect_same("FSDP rank 1", c, eif, &set, &want, &fsdp[1]);
      /* the reference itself does what the case says */
      float v0 = value(c->kind, 0, 0, set.len[0]);
      if (c->kind == G_FINITE && c->max_norm == 1.0)
        LT_TRUE(want.norm > 10 && fabsf(want.g[0][0]) < fabsf(v0)); /* clipped */
      if (c->kind == G_FINITE && c->max_norm >= 1e4) LT_TRUE(same_f(want.g[0][0], v0));
      if (c->max_norm == 0 && c->kind == G_FINITE) LT_TRUE(want.g[0][0] == 0 && v0 != 0);
      if (c->kind == G_INF) LT_TRUE(isinf(want.norm));
      if (c->kind == G_NAN) LT_TRUE(isnan(want.norm));
      if (c->kind != G_FINITE && !eif) LT_TRUE(isnan(want.g[1][5])); /* poisoned */
      if (c->kind == G_INF && !eif) LT_TRUE(want.g[0][0] == 0); /* coef 0 */
      if (c->kind != G_FINITE && eif) LT_TRUE(same_f(want.g[0][0], v0)); /* untouched */
      if (lt_failures()) return;
    }
}

/* ---- the pieces ----------------------------------------------------------------------------- */

static uint32_t rng = 1;
static float frand(void) { /* about N(0, 1)-sized, some tiny, some large */
  rng = rng * 1664525u + 1013904223u;
  float u = (float)(rng >> 8) / 16777216.0f - 0.5f;
  return u * (float)(1 << (rng % 13)) / 64;
}

/* f16 and bf16 buffers: the sum of squares is that of their f32 widening, bit for bit (lanes
 * carried across the 512-element blocks), scaling rounds widen x coef to nearest even. */
LT_TEST(clip_half_buffers_match_their_f32_widening) {
  enum { N = 1337 };
  static float f[N], w[N], back[N];
  static uint16_t h[N];
  for (int dt = LOOM_F16; dt <= LOOM_BF16; dt++) {
    for (int i = 0; i < N; i++) f[i] = frand();
    LT_OK(loom_convert(f, LOOM_F32, h, (loom_dtype)dt, N));
    LT_OK(loom_convert(h, (loom_dtype)dt, w, LOOM_F32, N));
    loom_grad_buf hb = {h, N, (loom_dtype)dt}, wb = {w, N, LOOM_F32};
    double sh = -1, sw = -2, plain = 0;
    LT_OK(loom_grad_sumsq(&hb, 1, &sh));
    LT_OK(loom_grad_sumsq(&wb, 1, &sw));
    LT_TRUE(same_d(sh, sw));
    for (int i = 0; i < N; i++) plain += (double)w[i] * w[i];
    LT_NEAR(sh, plain, 1e-14 * plain);
    LT_OK(loom_grad_scale(&hb, 1, 0.37f));
    LT_OK(loom_convert(h, (loom_dtype)dt, back, LOOM_F32, N));
    for (int i = 0; i < N; i++) {
      uint16_t want;
      float prod = w[i] * 0.37f;
      LT_OK(loom_convert(&prod, LOOM_F32, &want, (loom_dtype)dt, 1));
      if (want != h[i]) {
        lt_fail_at(__FILE__, __LINE__, "%s [%d]: 0x%04x, want 0x%04x", loom_dtype_name(dt), i,
                   h[i], want);
        break;
      }
    }
  }
}

/* A buffer summed chunk by chunk (FSDP's streamed shards), every chunk with its offset, folds
 * to the whole buffer's bits, on every CPU level; and the sum is close to a plain double one. */
LT_TEST(clip_sumsq_lanes_carry_across_chunks) {
  enum { N = 1000 };
  static float g[N];
  for (int i = 0; i < N; i++) g[i] = frand();
  loom_grad_buf b = {g, N, LOOM_F32};
  double whole = 0, plain = 0;
  LT_OK(loom_grad_sumsq(&b, 1, &whole));
  for (int i = 0; i < N; i++) plain += (double)g[i] * g[i];
  LT_NEAR(whole, plain, 1e-14 * plain);
  const size_t cuts[][4] = {{0, 16, 64, 1000}, {0, 3, 517, 1000}, {0, 999, 1000, 1000}};
  loom_cpu_level was = loom_cpu_level_active();
  for (int level = 0; level < LOOM_CPU_LEVEL_COUNT; level++) {
    if (!loom_cpu_supports((loom_cpu_level)level)) continue;
    LT_OK(loom_set_cpu_level((loom_cpu_level)level));
    for (size_t c = 0; c < sizeof cuts / sizeof cuts[0]; c++) {
      double lane[16] = {0};
      for (int k = 0; k < 3; k++)
        loom__sumsq_add(lane, g + cuts[c][k], cuts[c][k + 1] - cuts[c][k], cuts[c][k]);
      double s = loom__sumsq_fold(lane);
      LT_TRUE(same_d(s, whole));
    }
  }
  LT_OK(loom_set_cpu_level(was));
}

LT_TEST(clip_coef_cases_and_errors) {
  float c = -1;
  LT_OK(loom_clip_coef(4.0, 1.0, false, &c));
  LT_TRUE(c == (1.0f / (4.0f + 1e-6f)) * 1.0f && c < 0.25f);
  LT_OK(loom_clip_coef(0.5, 1.0, false, &c));
  LT_TRUE(c == 1.0f); /* clamped */
  LT_OK(loom_clip_coef(0.5, 0.0, false, &c));
  LT_TRUE(c == 0.0f); /* max_norm 0 zeroes */
  LT_OK(loom_clip_coef(3.0, INFINITY, false, &c));
  LT_TRUE(c == 1.0f); /* the norm only */
  LT_OK(loom_clip_coef(INFINITY, 1.0, false, &c));
  LT_TRUE(c == 0.0f);
  LT_OK(loom_clip_coef(NAN, 1.0, false, &c));
  LT_TRUE(isnan(c));
  LT_OK(loom_clip_coef(INFINITY, INFINITY, false, &c));
  LT_TRUE(isnan(c)); /* inf / inf, as PyTorch */
  c = 7;
  LT_ERR(loom_clip_coef(NAN, 1.0, true, &c), LOOM_EINVAL, "total norm is nan");
  LT_ERR(loom_clip_coef(INFINITY, 1.0, true, &c), LOOM_EINVAL, "total norm is inf");
  LT_ERR(loom_clip_coef(1.0, -1.0, false, &c), LOOM_EINVAL, "max_norm = -1");
  LT_ERR(loom_clip_coef(1.0, NAN, false, &c), LOOM_EINVAL, "loom_clip_coef: max_norm = nan");
  LT_TRUE(c == 7); /* not written on error */
  LT_ERR(loom_clip_coef(1.0, 1.0, false, NULL), LOOM_EINVAL, "coef is NULL");
}

/* The entries: tensors (f32 as segments, bf16 as its widening), what they refuse, and that a
 * refused call changes nothing. */
LT_TEST(clip_entries_tensors_segments_and_errors) {
  float a[6] = {3, -4, 1, 0.5f, 2, -2}, a2[6];
  memcpy(a2, a, sizeof a);
  loom_tensor *ta = NULL, *th = NULL, *tt = NULL, *ti = NULL;
  LT_OK(loom_tensor_wrap(LOOM_F32, 2, (int64_t[]){2, 3}, a, &ta));
  loom_param_seg seg = {.grad = a2, .n = 6};
  double n1 = 0, n2 = 0;
  loom_tensor *list[3] = {NULL, ta, NULL}; /* NULL entries are skipped */
  LT_OK(loom_clip_grad_norm_tensors(list, 3, 2.0, false, &n1));
  LT_OK(loom_clip_grad_norm(&seg, 1, 2.0, false, &n2));
  LT_TRUE(n1 == n2 && n1 == sqrt(9 + 16 + 1 + 0.25 + 4 + 4));
  LT_TRUE(!memcmp(a, a2, sizeof a) && a[0] < 3);
  /* bf16: the norm of its widening; refused non-contiguous and integer tensors */
  uint16_t hb[6];
  LT_OK(loom_convert(a, LOOM_F32, hb, LOOM_BF16, 6));
  LT_OK(loom_tensor_from_data(LOOM_BF16, 2, (int64_t[]){2, 3}, hb, &th));
  float wide[6];
  LT_OK(loom_convert(hb, LOOM_BF16, wide, LOOM_F32, 6));
  loom_param_seg ws = {.grad = wide, .n = 6};
  LT_OK(loom_clip_grad_norm_tensors(&th, 1, 1e9, false, &n1));
  LT_OK(loom_clip_grad_norm(&ws, 1, 1e9, false, &n2));
  LT_TRUE(n1 == n2 && n1 > 0);
  LT_OK(loom_tensor_transpose(th, 0, 1, &tt));
  loom_tensor *two[2] = {ta, tt};
  memcpy(a2, a, sizeof a);
  LT_ERR(loom_clip_grad_norm_tensors(two, 2, 0.0, false, NULL), LOOM_EINVAL,
         "gradient 1 is not contiguous");
  LT_TRUE(!memcmp(a, a2, sizeof a)); /* nothing written */
  LT_OK(loom_tensor_zeros(LOOM_I32, 1, (int64_t[]){2}, &ti));
  LT_ERR(loom_clip_grad_norm_tensors(&ti, 1, 1, false, NULL), LOOM_EDTYPE, "i32");
  LT_ERR(loom_clip_grad_norm_tensors(NULL, 1, 1, false, NULL), LOOM_EINVAL, "grads is NULL");
  /* segments */
  LT_ERR(loom_clip_grad_norm(&seg, 1, -1.0, false, NULL), LOOM_EINVAL, "max_norm = -1");
  LT_ERR(loom_clip_grad_norm(&seg, 1, NAN, false, NULL), LOOM_EINVAL, "max_norm = nan");
  LT_ERR(loom_clip_grad_norm(NULL, 1, 1.0, false, NULL), LOOM_EINVAL, "segs is NULL");
  loom_param_seg nog = {.n = 3};
  LT_ERR(loom_clip_grad_norm(&nog, 1, 1.0, false, NULL), LOOM_EINVAL, "segment 0 has a NULL grad");
  LT_OK(loom_clip_grad_norm(NULL, 0, 1.0, false, &n1)); /* nothing: norm 0 */
  LT_TRUE(n1 == 0);
  /* error_if_nonfinite: the norm is reported, no gradient changes */
  a2[4] = NAN;
  float keep[6];
  memcpy(keep, a2, sizeof keep);
  LT_ERR(loom_clip_grad_norm(&seg, 1, 1.0, true, &n2), LOOM_EINVAL,
         "loom_clip_grad_norm: total norm is nan");
  LT_TRUE(isnan(n2) && !memcmp(keep, a2, 4 * sizeof(float)));
  /* the pieces' argument checks */
  loom_grad_buf bad = {NULL, 2, LOOM_F32}, bi = {a, 2, LOOM_I64};
  double s;
  LT_ERR(loom_grad_sumsq(&bad, 1, &s), LOOM_EINVAL, "gradient 0 has no data");
  LT_ERR(loom_grad_sumsq(&bi, 1, &s), LOOM_EDTYPE, "i64");
  LT_ERR(loom_grad_scale(&bi, 1, 0.5f), LOOM_EDTYPE, "i64");
  LT_ERR(loom_grad_sumsq(NULL, 1, &s), LOOM_EINVAL, "bufs is NULL");
  LT_ERR(loom_grad_sumsq(&bad, 0, NULL), LOOM_EINVAL, "out is NULL");
  loom_tensor_free(ti);
  loom_tensor_free(tt);
  loom_tensor_free(th);
  loom_tensor_free(ta);
}
