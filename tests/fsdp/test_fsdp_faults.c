/* test_fsdp_faults.c: FSDP where things go wrong, on the threads backend. Cast-then-gather
 * against gather-then-cast for bf16 and f16, bit for bit, on weights chosen to round
 * differently (ties to even, values past f16's range, subnormals, NaN); one rank's local
 * infinity making every rank skip the step and back the loss scale off identically; API misuse
 * (each configuration rule, NULL arguments, wrapping twice, a child or a bf16 model, a missing
 * unit name, mixed precision or gradients at the wrong time, a parameter used outside its
 * unit, unit indexes out of range); ranks wrapping different models (a named error on every
 * rank, never a hang); a rank that dies before or after forward (its peer fails fast naming
 * it, and nothing leaks); and allocation failures injected at every allocation of create, a
 * forward + backward, an optimizer step + overflow check, a sharded save and a sharded load,
 * each failing cleanly with nothing leaked.
 *
 * Tolerance: none. Every comparison here is exact (bits, status codes, byte counts): the casts
 * are elementwise round-to-nearest-even whatever the rank or the moment they run, a flag
 * combined with MAX is the same on every rank, and the loss scale's update is a product by a
 * power of two. The one time bound (a dead rank seen in < 10 s with a 2 s timeout) is loose
 * on purpose: the failure is reported as soon as the rank returns, the timeout is the backstop. */
#include "lt.h"
#include "fsdp_model.h"

#include <dirent.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { MAXW = 4, MSG = 600 };

static size_t model_numel(void) {
  return (size_t)FM_IN * FM_H1 + FM_H1 + (size_t)FM_H1 * FM_H2 + FM_H2 + (size_t)FM_H2 * FM_OUT +
         FM_OUT;
}

static float from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}

static size_t pool_bytes(loom_pool p) {
  loom_pool_stats s;
  loom_mem_stats(p, &s);
  return s.current_bytes;
}

static uint64_t alloc_failures(void) {
  uint64_t n = 0;
  for (int p = 0; p < LOOM_POOL_COUNT; p++) {
    loom_pool_stats s;
    loom_mem_stats((loom_pool)p, &s);
    n += s.failures;
  }
  return n;
}

/* ---- 6. cast-then-gather is gather-then-cast ---------------------------------------------- */

/* Element k of the model's weights (in parameter order): every third a value whose rounding to
 * f16 or bf16 is a corner case, the rest seeded values over 50 binades. */
static float crafted(size_t k) {
  static const uint32_t special[] = {
      0x3f801000u, /* 1 + 2^-11: f16 tie, to even (1) */
      0x3f803000u, /* 1 + 3 x 2^-11: f16 tie, to even (1 + 2^-9) */
      0xbf801000u, /* the negative tie */
      0x3f808000u, /* 1 + 2^-8: bf16 tie, to even (1) */
      0x3f818000u, /* 1 + 3 x 2^-8: bf16 tie, to even (1 + 2^-6) */
      0x477fe000u, /* 65504: f16's largest */
      0x477fefffu, /* just under the tie above it: 65504 */
      0x477ff000u, /* 65520: the tie, to infinity in f16 */
      0x47886800u, /* 70000: infinity in f16, finite in bf16 */
      0xc9742400u, /* -1e6: -infinity in f16 */
      0x7f7fffffu, /* FLT_MAX: infinity in bf16 too */
      0x7f7f7fffu, /* just under bf16's tie at its top: bf16's largest */
      0x33000000u, /* 2^-25: tie between 0 and f16's smallest subnormal, to 0 */
      0x33c00000u, /* 3 x 2^-25: tie, to 2^-23 */
      0x387fc000u, /* just under f16's smallest normal: a subnormal rounding up */
      0x00000001u, /* f32's smallest subnormal: 0 in both */
      0x80000000u, /* -0 */
      0x7f800000u, /* +inf */
      0x7fc00000u, /* NaN */
  };
  size_t ns = sizeof special / sizeof *special;
  if (k % 3 == 0) return from_bits(special[(k / 3) % ns]);
  uint64_t h = mix(k + 12345);
  float mant = 1.0f + (float)(h & 0xffffff) / 16777216.0f;
  int e = (int)((h >> 24) % 50) - 30;
  return ((h >> 40) & 1 ? -1.0f : 1.0f) * ldexpf(mant, e);
}

typedef struct cast_job {
  loom_dtype dt;
  size_t mismatch_paths[MAXW]; /* elements where the two paths differ */
  size_t mismatch_ref[MAXW];   /* elements where a path differs from loom_convert of the f32 */
  size_t mismatch_f32[MAXW];   /* elements of the f32 gather that differ from what was loaded */
  size_t checked[MAXW];
  int dtype_bad[MAXW];
} cast_job;

static int cast_rank(loom_pg *pg, void *arg) {
  cast_job *j = arg;
  int rank = loom_pg_rank(pg);
  loom_fsdp_cfg cfg = loom_fsdp_cfg_default();
  cfg.mp = loom_fsdp_mp_cfg_for(j->dt);
  loom_module *m = NULL;
  loom_fsdp *f = NULL;
  int rc = fm_create(1 + (uint64_t)rank, &m);
  if (!rc) rc = loom_fsdp_create(pg, m, &cfg, &f);
  size_t np = model_numel(), nparams = rc ? 0 : loom_module_param_count(m);
  float *w = malloc(np * sizeof(float));
  for (size_t k = 0; k < np; k++) w[k] = crafted(k);
  /* the crafted weights, loaded as a full state */
  loom_named_tensor st[8] = {{0}};
  size_t at = 0;
  for (size_t i = 0; i < nparams && !rc; i++) {
    loom_param p;
    rc = loom_module_param(m, i, &p);
    if (!rc) rc = loom_tensor_from_data(LOOM_F32, loom_tensor_ndim(p.value), loom_tensor_shape(p.value),
                                        w + at, &st[i].tensor);
    st[i].name = p.name;
    at += p.numel;
  }
  if (!rc) rc = loom_fsdp_load_full_state(f, st, nparams);
  size_t es = loom_dtype_size(j->dt);
  unsigned char *a = malloc(np * es), *b = malloc(np * es), *ref = malloc(np * es);
  if (!rc) rc = loom_convert(w, LOOM_F32, ref, j->dt, np);
  for (size_t u = 0; u < loom_fsdp_unit_count(f) && !rc; u++) {
    loom_fsdp_unit_info in;
    rc = loom_fsdp_unit_info_get(f, u, &in);
    size_t base = 0; /* the unit's first element in w */
    for (size_t i = 0; i < in.first_param && !rc; i++) {
      loom_param p;
      rc = loom_module_param(m, i, &p);
      base += p.numel;
    }
    /* gather in f32, then ApplyMixedPrecision */
    if (!rc) rc = loom_fsdp_gather_unit(f, u, LOOM_F32);
    size_t n = 0;
    for (size_t k = 0; k < in.nparams && !rc; k++) {
      loom_param p;
      rc = loom_module_param(m, in.first_param + k, &p);
      if (!rc && loom_tensor_dtype(p.value) != LOOM_F32) j->dtype_bad[rank]++;
      const uint32_t *v = loom_tensor_data(p.value);
      for (size_t e = 0; !rc && e < p.numel; e++) {
        uint32_t want;
        memcpy(&want, &w[base + n + e], 4);
        j->mismatch_f32[rank] += v[e] != want;
      }
      n += p.numel;
    }
    if (!rc) rc = loom_fsdp_apply_mixed_precision(f, u);
    if (!rc) rc = loom_fsdp_unit_info_get(f, u, &in);
    if (!rc && (!in.gathered || in.gathered_dtype != j->dt)) j->dtype_bad[rank]++;
    n = 0;
    for (size_t k = 0; k < in.nparams && !rc; k++) {
      loom_param p;
      rc = loom_module_param(m, in.first_param + k, &p);
      if (!rc && loom_tensor_dtype(p.value) != j->dt) j->dtype_bad[rank]++;
      if (!rc) memcpy(a + n * es, loom_tensor_data(p.value), p.numel * es);
      n += p.numel;
    }
    if (!rc) rc = loom_fsdp_reshard_unit(f, u);
    /* gathered in the low precision directly (the shard cast first) */
    if (!rc) rc = loom_fsdp_gather_unit(f, u, j->dt);
    n = 0;
    for (size_t k = 0; k < in.nparams && !rc; k++) {
      loom_param p;
      rc = loom_module_param(m, in.first_param + k, &p);
      if (!rc && loom_tensor_dtype(p.value) != j->dt) j->dtype_bad[rank]++;
      if (!rc) memcpy(b + n * es, loom_tensor_data(p.value), p.numel * es);
      n += p.numel;
    }
    if (!rc) rc = loom_fsdp_reshard_unit(f, u);
    for (size_t e = 0; e < n && !rc; e++) {
      j->mismatch_paths[rank] += memcmp(a + e * es, b + e * es, es) != 0;
      j->mismatch_ref[rank] += memcmp(b + e * es, ref + (base + e) * es, es) != 0;
    }
    j->checked[rank] += n;
  }
  for (size_t i = 0; i < nparams; i++) loom_tensor_free(st[i].tensor);
  free(w), free(a), free(b), free(ref);
  loom_fsdp_free(f);
  loom_module_free(m);
  return rc;
}

LT_TEST(fsdp_cast_then_gather_is_gather_then_cast_bf16_f16) {
  loom_dtype dts[2] = {LOOM_BF16, LOOM_F16};
  for (int d = 0; d < 2; d++) {
    cast_job j = {.dt = dts[d]};
    LT_OK(loom_threads_run(3, NULL, cast_rank, &j));
    for (int r = 0; r < 3; r++) {
      LT_EQ(j.checked[r], model_numel());
      LT_EQ(j.dtype_bad[r], 0);
      LT_EQ(j.mismatch_f32[r], 0);
      if (j.mismatch_paths[r] || j.mismatch_ref[r])
        lt_fail_at(__FILE__, __LINE__, "%s, rank %d: %zu elements differ between the paths, "
                   "%zu from loom_convert", loom_dtype_name(dts[d]), r, j.mismatch_paths[r],
                   j.mismatch_ref[r]);
    }
  }
}

/* ---- 7. one rank's infinity makes every rank skip ----------------------------------------- */

enum { OV_STEPS = 4 };

typedef struct overflow_job {
  bool overflow[OV_STEPS][MAXW];
  float scale[OV_STEPS][MAXW];
  bool moved[OV_STEPS][MAXW]; /* the shards changed in that step */
} overflow_job;

static int overflow_rank(loom_pg *pg, void *arg) {
  overflow_job *j = arg;
  int rank = loom_pg_rank(pg);
  loom_fsdp_cfg cfg = loom_fsdp_cfg_default();
  cfg.mp = loom_fsdp_mp_cfg_for(LOOM_F16);
  loom_module *m = NULL;
  loom_fsdp *f = NULL;
  loom_optim *opt = NULL;
  const loom_param_seg *segs = NULL;
  size_t nseg = 0;
  loom_adam_cfg ac = fm_adam();
  int rc = fm_create(1, &m);
  if (!rc) rc = loom_fsdp_create(pg, m, &cfg, &f);
  if (!rc) rc = loom_fsdp_segments(f, &segs, &nseg);
  if (!rc) rc = loom_optim_create_adamw(segs, nseg, &ac, &opt);
  float *before = rc ? NULL : malloc(segs[0].n * sizeof(float));
  /* step 0: +inf on rank 1; 1: clean; 2: NaN on rank 0 (the scale is at its minimum); 3: clean */
  for (int s = 0; s < OV_STEPS && !rc; s++) {
    loom_fsdp_mp *mp = loom_fsdp_mp_manager(f);
    rc = fm_backward(m, (int64_t)s * 12 + rank * 6, 6, LOOM_AUTOCAST_F16,
                     loom_fsdp_mp_current_loss_scale(mp), NULL);
    if (!rc) rc = loom_fsdp_finish(f);
    if (!rc && s == 0 && rank == 1) ((float *)segs[0].grad)[segs[0].n / 2] = INFINITY;
    if (!rc && s == 2 && rank == 0) ((float *)segs[nseg - 1].grad)[0] = NAN;
    bool ov = false;
    memcpy(before, segs[0].param, segs[0].n * sizeof(float));
    if (!rc) rc = loom_fsdp_check_overflow(f, &ov);
    if (!rc && !ov) rc = loom_optim_step(opt);
    j->overflow[s][rank] = ov;
    j->scale[s][rank] = loom_fsdp_mp_current_loss_scale(mp);
    j->moved[s][rank] = memcmp(before, segs[0].param, segs[0].n * sizeof(float)) != 0;
  }
  free(before);
  loom_optim_free(opt);
  loom_fsdp_free(f);
  loom_module_free(m);
  return rc;
}

LT_TEST(fsdp_one_ranks_local_inf_makes_every_rank_skip) {
  overflow_job j;
  memset(&j, 0, sizeof j);
  LT_OK(loom_threads_run(2, NULL, overflow_rank, &j));
  static const bool want_ov[OV_STEPS] = {true, false, true, false};
  static const float want_scale[OV_STEPS] = {1.0f, 1.0f, 1.0f, 1.0f}; /* 2 x 0.5, min 1 */
  for (int s = 0; s < OV_STEPS; s++)
    for (int r = 0; r < 2; r++) {
      if (j.overflow[s][r] != want_ov[s] || j.scale[s][r] != want_scale[s] ||
          j.moved[s][r] == want_ov[s])
        lt_fail_at(__FILE__, __LINE__, "step %d, rank %d: overflow %d (want %d), scale %g "
                   "(want %g), weights %s", s, r, j.overflow[s][r], want_ov[s],
                   (double)j.scale[s][r], (double)want_scale[s],
                   j.moved[s][r] ? "moved" : "kept");
    }
}

/* ---- 8. API misuse ------------------------------------------------------------------------ */

static void expect_cfg(const loom_fsdp_cfg *c, const char *field, int line) {
  loom_clear_error();
  int rc = loom_fsdp_cfg_validate(c);
  if (rc != LOOM_EINVAL || !strstr(loom_last_error(), field))
    lt_fail_at(__FILE__, line, "cfg_validate: %s \"%s\", expected EINVAL naming %s",
               loom_status_name(rc), loom_last_error(), field);
}

LT_TEST(fsdp_cfg_validate_names_each_bad_field) {
  loom_fsdp_cfg c = loom_fsdp_cfg_default();
  LT_OK(loom_fsdp_cfg_validate(&c));
  LT_ERR(loom_fsdp_cfg_validate(NULL), LOOM_EINVAL, "NULL");
  c.wrap = (loom_fsdp_wrap)7;
  expect_cfg(&c, "wrap", __LINE__);
  c.wrap = (loom_fsdp_wrap)-1;
  expect_cfg(&c, "wrap", __LINE__);
  c = loom_fsdp_cfg_default();
  c.wrap = LOOM_FSDP_WRAP_SIZE;
  c.min_unit_numel = 0;
  expect_cfg(&c, "min_unit_numel", __LINE__);
  c = loom_fsdp_cfg_default();
  c.wrap = LOOM_FSDP_WRAP_LIST;
  expect_cfg(&c, "unit_names", __LINE__);
  static const char *const names[] = {"layers.0", ""};
  c.unit_names = names;
  c.n_unit_names = 0;
  expect_cfg(&c, "unit_names", __LINE__);
  c.n_unit_names = 2;
  expect_cfg(&c, "unit_names[1]", __LINE__);
  static const char *const null_name[] = {NULL};
  c.unit_names = null_name;
  c.n_unit_names = 1;
  expect_cfg(&c, "unit_names[0]", __LINE__);
  c.n_unit_names = 0; /* only the list policy reads them */
  c.wrap = LOOM_FSDP_WRAP_CHILDREN;
  LT_OK(loom_fsdp_cfg_validate(&c));
  c = loom_fsdp_cfg_default();
  c.forward_prefetch = -1;
  expect_cfg(&c, "forward_prefetch", __LINE__);
  c.forward_prefetch = 9;
  expect_cfg(&c, "forward_prefetch", __LINE__);
  c.forward_prefetch = 8;
  LT_OK(loom_fsdp_cfg_validate(&c));
  c.backward_prefetch = -1;
  expect_cfg(&c, "backward_prefetch", __LINE__);
  c.backward_prefetch = 9;
  expect_cfg(&c, "backward_prefetch", __LINE__);
  c.backward_prefetch = 0;
  LT_OK(loom_fsdp_cfg_validate(&c));
  c = loom_fsdp_cfg_default();
  c.mp.forward_dtype = LOOM_F32; /* mixed precision off: its fields do not matter */
  LT_OK(loom_fsdp_cfg_validate(&c));
  c.mp.enabled = true;
  expect_cfg(&c, "forward_dtype", __LINE__);
  c.mp = loom_fsdp_mp_cfg_for(LOOM_BF16);
  c.mp.backward_dtype = LOOM_BF16;
  expect_cfg(&c, "backward_dtype", __LINE__);
  c.mp = loom_fsdp_mp_cfg_for(LOOM_F16);
  c.mp.loss_scale_backoff_factor = 1.5f;
  expect_cfg(&c, "loss_scale_backoff_factor", __LINE__);
}

typedef struct misuse_job {
  int fails; /* checks that failed on the rank (reported by the test) */
  char first[MSG];
} misuse_job;

/* A check on a rank thread: record the first failure (LT_ macros cannot stop a rank). */
#define EXPECT(j, call, code, substr)                                                          \
  do {                                                                                         \
    loom_clear_error();                                                                        \
    int e_rc = (call);                                                                         \
    if (e_rc != (code) || !strstr(loom_last_error(), (substr))) {                              \
      if (!(j)->fails++)                                                                       \
        snprintf((j)->first, MSG, "line %d: %s gave %s \"%s\", expected %s with \"%s\"",       \
                 __LINE__, #call, loom_status_name(e_rc), loom_last_error(),                   \
                 loom_status_name(code), (substr));                                            \
    }                                                                                          \
  } while (0)

#define CHECK_ON_RANK(j, cond)                                                                 \
  do {                                                                                         \
    if (!(cond) && !(j)->fails++)                                                              \
      snprintf((j)->first, MSG, "line %d: expected %s", __LINE__, #cond);                      \
  } while (0)

static int misuse_rank(loom_pg *pg, void *arg) {
  misuse_job *j = arg;
  loom_module *m = NULL, *bf = NULL, *seq = NULL;
  loom_fsdp *f = NULL, *g = (loom_fsdp *)1;
  loom_fsdp_cfg cfg = loom_fsdp_cfg_default();
  cfg.mp = loom_fsdp_mp_cfg_for(LOOM_F16);
  int rc = fm_create(1, &m);
  if (rc) return rc;
  /* NULL arguments */
  EXPECT(j, loom_fsdp_create(NULL, m, NULL, &g), LOOM_EINVAL, "NULL");
  CHECK_ON_RANK(j, g == NULL);
  EXPECT(j, loom_fsdp_create(pg, NULL, NULL, &g), LOOM_EINVAL, "NULL");
  EXPECT(j, loom_fsdp_create(pg, m, NULL, NULL), LOOM_EINVAL, "NULL");
  /* create validates the configuration */
  loom_fsdp_cfg bad = loom_fsdp_cfg_default();
  bad.forward_prefetch = 9;
  EXPECT(j, loom_fsdp_create(pg, m, &bad, &g), LOOM_EINVAL, "forward_prefetch");
  CHECK_ON_RANK(j, g == NULL);
  /* a list policy naming a module the model does not have */
  static const char *const missing[] = {"layers.0", "layers.9"};
  loom_fsdp_cfg lc = loom_fsdp_cfg_default();
  lc.wrap = LOOM_FSDP_WRAP_LIST;
  lc.unit_names = missing;
  lc.n_unit_names = 2;
  EXPECT(j, loom_fsdp_create(pg, m, &lc, &g), LOOM_EINVAL, "'layers.9'");
  /* a bf16 model (master weights must be f32) */
  const int64_t sizes[4] = {FM_IN, FM_H1, FM_H2, FM_OUT};
  rc = loom_nn_mlp_create(sizes, 4, LOOM_ACT_RELU, LOOM_BF16, 1, &bf);
  if (!rc) EXPECT(j, loom_fsdp_create(pg, bf, NULL, &g), LOOM_EDTYPE, "f32");
  /* a child of another module */
  loom_module *lin = NULL;
  if (!rc) rc = loom_nn_linear_create(4, 3, true, LOOM_F32, 1, &lin);
  if (!rc) rc = loom_nn_sequential_create(&lin, 1, &seq);
  if (!rc) EXPECT(j, loom_fsdp_create(pg, lin, NULL, &g), LOOM_EMISUSE, "child");
  /* the model itself, wrapped; then wrapped again */
  if (!rc) rc = loom_fsdp_create(pg, m, &cfg, &f);
  if (rc) goto out;
  EXPECT(j, loom_fsdp_create(pg, m, &cfg, &g), LOOM_EMISUSE, "wrapped already");
  size_t nu = loom_fsdp_unit_count(f);
  /* the module's parameters hold no data outside their unit's forward */
  loom_param p;
  rc = loom_module_param(m, 0, &p);
  if (rc) goto out;
  CHECK_ON_RANK(j, loom_tensor_data(p.value) == NULL);
  float buf[FM_IN * FM_H1];
  EXPECT(j, loom_tensor_read(p.value, LOOM_F32, buf, sizeof buf), LOOM_EMISUSE, "holds no data");
  loom_tensor *x = NULL, *out = NULL;
  int64_t xs[2] = {2, FM_IN};
  rc = loom_tensor_zeros(LOOM_F32, 2, xs, &x);
  loom_param bias;
  if (!rc) rc = loom_module_param(m, 1, &bias);
  if (!rc) EXPECT(j, loom_linear(x, p.value, bias.value, &out), LOOM_EMISUSE, "holds no data");
  loom_tensor_free(out);
  out = NULL;
  loom_tensor *values = NULL, *grads = NULL;
  size_t an = 0;
  if (!rc) rc = loom_module_arena(m, LOOM_F32, &values, &grads, &an);
  CHECK_ON_RANK(j, rc || (!values && an == 0)); /* given back to the shards */
  /* gathered, the parameter is usable; resharded, refused again */
  if (!rc) rc = loom_fsdp_gather_unit(f, 0, LOOM_F32);
  if (!rc) rc = loom_linear(x, p.value, bias.value, &out);
  loom_tensor_free(out);
  out = NULL;
  if (!rc) rc = loom_fsdp_reshard_unit(f, 0);
  if (!rc) EXPECT(j, loom_tensor_read(p.value, LOOM_F32, buf, sizeof buf), LOOM_EMISUSE, "holds no data");
  /* ApplyMixedPrecision needs the unit gathered; ApplyGradientFP32 needs a gradient */
  EXPECT(j, loom_fsdp_apply_mixed_precision(f, 1), LOOM_EMISUSE, "must be gathered first");
  EXPECT(j, loom_fsdp_apply_gradient_fp32(f, 1), LOOM_EMISUSE, "no local gradient");
  /* unit indexes out of range */
  loom_fsdp_unit_info in;
  EXPECT(j, loom_fsdp_gather_unit(f, nu, LOOM_F32), LOOM_EINVAL, "out of range");
  EXPECT(j, loom_fsdp_reshard_unit(f, nu), LOOM_EINVAL, "out of range");
  EXPECT(j, loom_fsdp_apply_mixed_precision(f, nu), LOOM_EINVAL, "out of range");
  EXPECT(j, loom_fsdp_apply_gradient_fp32(f, (size_t)-1), LOOM_EINVAL, "out of range");
  EXPECT(j, loom_fsdp_unit_info_get(f, nu, &in), LOOM_EINVAL, "out of range");
  EXPECT(j, loom_fsdp_gather_unit(f, 0, LOOM_I32), LOOM_EDTYPE, "i32");
  /* NULLs on the other calls */
  const loom_param_seg *segs = NULL;
  size_t nseg = 0;
  bool flag = false;
  EXPECT(j, loom_fsdp_segments(f, NULL, &nseg), LOOM_EINVAL, "NULL");
  EXPECT(j, loom_fsdp_segments(NULL, &segs, &nseg), LOOM_EINVAL, "NULL");
  EXPECT(j, loom_fsdp_finish(NULL), LOOM_EINVAL, "NULL");
  EXPECT(j, loom_fsdp_set_sync(NULL, true), LOOM_EINVAL, "NULL");
  EXPECT(j, loom_fsdp_check_overflow(f, NULL), LOOM_EINVAL, "NULL");
  EXPECT(j, loom_fsdp_check_overflow(NULL, &flag), LOOM_EINVAL, "NULL");
  EXPECT(j, loom_fsdp_scale_loss(f, NULL, &out), LOOM_EINVAL, "NULL");
  EXPECT(j, loom_fsdp_full_state(NULL, NULL, NULL), LOOM_EINVAL, "NULL");
  EXPECT(j, loom_fsdp_load_full_state(NULL, NULL, 0), LOOM_EINVAL, "NULL");
  EXPECT(j, loom_fsdp_save_sharded(f, NULL, NULL, NULL, 0), LOOM_EINVAL, "NULL");
  EXPECT(j, loom_fsdp_load_sharded(f, NULL, NULL), LOOM_EINVAL, "NULL");
  EXPECT(j, loom_fsdp_clip_grad_norm(f, -1.0, false, NULL), LOOM_EINVAL, "max_norm");
  EXPECT(j, loom_fsdp_stats_get(f, NULL), LOOM_EINVAL, "NULL");
  CHECK_ON_RANK(j, loom_fsdp_mp_manager(NULL) == NULL && loom_fsdp_unit_count(NULL) == 0);
  CHECK_ON_RANK(j, loom_fsdp_mp_manager(f) != NULL);
  /* after a forward + backward the model still works (nothing above broke the fsdp) */
  rc = fm_backward(m, 0, 4, LOOM_AUTOCAST_F16, 2.0f, NULL);
  if (!rc) rc = loom_fsdp_finish(f);
  if (!rc) EXPECT(j, loom_fsdp_apply_gradient_fp32(f, 0), LOOM_EMISUSE, "no local gradient");
  loom_tensor_free(x);
out:
  loom_fsdp_free(f);
  loom_fsdp_free(NULL);
  loom_module_free(m);
  loom_module_free(bf);
  loom_module_free(seq);
  return rc;
}

LT_TEST(fsdp_api_misuse_is_refused_with_named_errors) {
  misuse_job j = {0};
  LT_OK(loom_threads_run(1, NULL, misuse_rank, &j));
  if (j.fails) lt_fail_at(__FILE__, __LINE__, "%d checks failed; first: %s", j.fails, j.first);
}

/* ---- 9. ranks that wrap different models -------------------------------------------------- */

typedef struct differ_job {
  int kind; /* 0: rank 1's hidden size differs; 1: its wrap policy gives fewer units;
               2: as many units, other ones; 3: mixed precision on rank 1 only */
  int rc[MAXW];
  char msg[MAXW][MSG];
} differ_job;

static int differ_rank(loom_pg *pg, void *arg) {
  differ_job *j = arg;
  int rank = loom_pg_rank(pg);
  int64_t sizes[4] = {FM_IN, FM_H1, FM_H2, FM_OUT};
  if (j->kind == 0 && rank == 1) sizes[1] = FM_H1 + 1;
  loom_fsdp_cfg cfg = loom_fsdp_cfg_default();
  static const char *const one[] = {"layers.4"}, *const two[] = {"layers.0", "layers.2"};
  if (rank == 1 && (j->kind == 1 || j->kind == 2)) {
    cfg.wrap = LOOM_FSDP_WRAP_LIST;
    cfg.unit_names = j->kind == 1 ? one : two;
    cfg.n_unit_names = j->kind == 1 ? 1 : 2;
  }
  if (rank == 1 && j->kind == 3) cfg.mp = loom_fsdp_mp_cfg_for(LOOM_BF16);
  loom_module *m = NULL;
  loom_fsdp *f = NULL;
  int rc = loom_nn_mlp_create(sizes, 4, LOOM_ACT_RELU, LOOM_F32, 1, &m);
  loom_clear_error();
  if (!rc) rc = loom_fsdp_create(pg, m, &cfg, &f);
  if (!rc && j->kind == 3) /* the forward's gathers disagree on the dtype */
    rc = fm_backward(m, rank * 4, 4, LOOM_AUTOCAST_OFF, 1.0f, NULL);
  if (!rc) rc = loom_fsdp_finish(f);
  j->rc[rank] = rc;
  snprintf(j->msg[rank], MSG, "%s", loom_last_error());
  loom_fsdp_free(f);
  loom_module_free(m);
  return rc;
}

LT_TEST(fsdp_ranks_wrapping_different_models_fail_named_on_every_rank) {
  loom_pg_cfg pc = loom_pg_cfg_default();
  pc.timeout_s = 20; /* a hang would show as a timeout, far beyond what the test takes */
  static const int want[] = {LOOM_ESHAPE, LOOM_EMISUSE, LOOM_EMISUSE};
  static const char *const needle[] = {"layers.0.weight", "number of units", "unit 0"};
  for (int kind = 0; kind < 3; kind++) {
    differ_job j = {.kind = kind};
    double t0 = lt_now_s();
    int rc = loom_threads_run(2, &pc, differ_rank, &j);
    LT_EQ(rc, want[kind]);
    LT_TRUE(lt_now_s() - t0 < 10);
    for (int r = 0; r < 2; r++)
      if (j.rc[r] != want[kind] || !strstr(j.msg[r], needle[kind]))
        lt_fail_at(__FILE__, __LINE__, "kind %d, rank %d: %s \"%s\", expected %s with \"%s\"",
                   kind, r, loom_status_name(j.rc[r]), j.msg[r], loom_status_name(want[kind]),
                   needle[kind]);
    if (kind > 0)
      for (int r = 0; r < 2; r++) LT_TRUE(strstr(j.msg[r], "wrap policy") != NULL);
  }
  /* mixed precision on one rank only: create does not compare it, but the first gather does
   * (bf16 here, f32 there): a dtype mismatch naming the all-gather on both ranks, never a hang
   * or a gather of the wrong bytes */
  differ_job j = {.kind = 3};
  double t0 = lt_now_s();
  int rc = loom_threads_run(2, &pc, differ_rank, &j);
  LT_EQ(rc, LOOM_EDTYPE);
  LT_TRUE(lt_now_s() - t0 < 10);
  for (int r = 0; r < 2; r++)
    if (j.rc[r] != LOOM_EDTYPE || !strstr(j.msg[r], "all-gather"))
      lt_fail_at(__FILE__, __LINE__, "rank %d: %s \"%s\"", r, loom_status_name(j.rc[r]), j.msg[r]);
}

/* ---- 10. a rank that dies --------------------------------------------------------------- */

typedef struct dead_job {
  bool after_forward; /* rank 1 dies after its forward (else right after create) */
  int rc0;
  char msg0[MSG];
  double took; /* rank 0's forward + backward */
} dead_job;

static int dead_rank(loom_pg *pg, void *arg) {
  dead_job *j = arg;
  int rank = loom_pg_rank(pg);
  loom_module *m = NULL;
  loom_fsdp *f = NULL;
  int rc = fm_create(1, &m);
  if (!rc) rc = loom_fsdp_create(pg, m, NULL, &f);
  if (rc) goto out;
  if (rank == 1) {
    if (j->after_forward) { /* forward with the graph kept, then gone before backward */
      loom_tensor *x = NULL, *y = NULL, *logits = NULL;
      rc = fm_batch(6, 6, &x, &y);
      if (!rc) rc = loom_module_forward(m, x, &logits);
      loom_tensor_free(x);
      loom_tensor_free(y);
      loom_tensor_free(logits);
    }
    rc = LOOM_EIO; /* "died" */
    goto out;
  }
  double t0 = lt_now_s();
  loom_clear_error();
  rc = fm_backward(m, 0, 6, LOOM_AUTOCAST_OFF, 1.0f, NULL);
  if (!rc) rc = loom_fsdp_finish(f);
  j->took = lt_now_s() - t0;
  j->rc0 = rc;
  snprintf(j->msg0, MSG, "%s", loom_last_error());
  /* everything else that talks to the group fails too, at once */
  loom_named_tensor *st = NULL;
  size_t n = 0;
  if (loom_fsdp_full_state(f, &st, &n) == LOOM_OK) rc = LOOM_EINVAL;
  loom_fsdp_state_free(st, n);
out:
  loom_fsdp_free(f);
  loom_module_free(m);
  return rc;
}

LT_TEST(fsdp_dead_rank_fails_its_peer_fast_naming_it) {
  loom_pg_cfg pc = loom_pg_cfg_default();
  pc.timeout_s = 2;
  for (int after = 0; after <= 1; after++) {
    size_t c0 = pool_bytes(LOOM_POOL_COMPUTE), h0 = pool_bytes(LOOM_POOL_HOST);
    size_t m0 = pool_bytes(LOOM_POOL_META);
    dead_job j = {.after_forward = after};
    double t0 = lt_now_s();
    int rc = loom_threads_run(2, &pc, dead_rank, &j);
    double took = lt_now_s() - t0;
    LT_EQ(rc, LOOM_EIO); /* the root cause: rank 1's own status */
    LT_TRUE(strstr(loom_last_error(), "rank 1") != NULL);
    if (j.rc0 != LOOM_EREMOTE && j.rc0 != LOOM_ETIMEDOUT)
      lt_fail_at(__FILE__, __LINE__, "rank 0: %s \"%s\"", loom_status_name(j.rc0), j.msg0);
    if (!strstr(j.msg0, "rank 1"))
      lt_fail_at(__FILE__, __LINE__, "rank 0's message \"%s\" does not name rank 1", j.msg0);
    if (!(took < 10))
      lt_fail_at(__FILE__, __LINE__, "took %.1f s (rank 0's step %.1f s)", took, j.took);
    LT_EQ(pool_bytes(LOOM_POOL_COMPUTE), c0);
    LT_EQ(pool_bytes(LOOM_POOL_HOST), h0);
    LT_EQ(pool_bytes(LOOM_POOL_META), m0); /* the wrapper's and the groups' bookkeeping */
  }
}

/* ---- 11. allocation failures -------------------------------------------------------------- */

typedef struct sweep_job {
  int which; /* 0 create, 1 forward + backward + finish, 2 step + overflow check, 3 sharded
                save, 4 sharded load, 5 full state, 6 loading a full state */
  bool f16;
  const char *dir;
  int offload; /* 0: none; 1: everything offloaded to the host tier; 2: to the disk tier */
  uint64_t nth;
  int rc;
  bool fired;
  bool rc_setup;
} sweep_job;

static int sweep_rank(loom_pg *pg, void *arg) {
  sweep_job *j = arg;
  loom_fsdp_cfg cfg = loom_fsdp_cfg_default();
  if (j->f16) cfg.mp = loom_fsdp_mp_cfg_for(LOOM_F16);
  if (j->offload) { /* 64-byte chunks: many transfers, each a place to fail */
    cfg.offload = loom_fsdp_offload_cfg_default();
    cfg.offload.chunk_bytes = 64;
    cfg.offload.tier = j->offload == 2 ? LOOM_FSDP_TIER_DISK : LOOM_FSDP_TIER_HOST;
    cfg.offload.dir = "/tmp";
  }
  loom_module *m = NULL;
  loom_fsdp *f = NULL;
  loom_optim *opt = NULL;
  const loom_param_seg *segs = NULL;
  size_t nseg = 0;
  loom_adam_cfg ac = fm_adam();
  float scale = j->f16 ? 2.0f : 1.0f;
  loom_autocast_mode amp = j->f16 ? LOOM_AUTOCAST_F16 : LOOM_AUTOCAST_OFF;
  loom_module *plain = NULL;
  loom_named_tensor pst[8], *st = NULL;
  size_t np = 0;
  int rc = fm_create(1, &m);
  uint64_t fails0 = 0;
  bool ov = false;
  if (!rc && j->which == 0) {
    fails0 = alloc_failures();
    loom_alloc_fail_nth(j->nth);
    rc = loom_fsdp_create(pg, m, &cfg, &f);
    loom_alloc_fail_nth(0);
    j->fired = alloc_failures() != fails0;
    if (rc && f) rc = LOOM_EINVAL; /* a failed create hands nothing back */
    j->rc = rc;
    goto out;
  }
  if (!rc) rc = loom_fsdp_create(pg, m, &cfg, &f);
  if (!rc) rc = loom_fsdp_segments(f, &segs, &nseg);
  if (!rc) rc = loom_optim_create_adamw(segs, nseg, &ac, &opt);
  if (!rc && j->which >= 2) rc = fm_backward(m, 0, 6, amp, scale, NULL);
  if (!rc && j->which >= 2) rc = loom_fsdp_finish(f);
  if (!rc && j->which == 6) rc = fm_create(5, &plain);
  for (size_t i = 0; plain && i < loom_module_param_count(plain) && i < 8; i++) {
    loom_param q;
    loom_module_param(plain, i, &q);
    pst[np++] = (loom_named_tensor){q.name, q.value};
  }
  if (rc) {
    j->rc_setup = true;
    goto out;
  }
  fails0 = alloc_failures();
  loom_alloc_fail_nth(j->nth);
  if (j->which == 1) {
    rc = fm_backward(m, 0, 6, amp, scale, NULL);
    int rc2 = loom_fsdp_finish(f);
    if (!rc) rc = rc2;
  } else if (j->which == 2) {
    rc = loom_fsdp_check_overflow(f, &ov);
    if (!rc && !ov) rc = loom_fsdp_optim_step(f, opt, 1.0f);
    if (!rc) rc = loom_fsdp_optim_wait(f); /* the disk tier's pass runs behind the call */
  } else if (j->which == 3) {
    rc = loom_fsdp_save_sharded(f, j->dir, opt, NULL, 0);
  } else if (j->which == 4) {
    rc = loom_fsdp_load_sharded(f, j->dir, opt);
  } else if (j->which == 5) {
    size_t n = 0;
    rc = loom_fsdp_full_state(f, &st, &n);
    if (rc && st) rc = LOOM_EINVAL; /* a failed call hands nothing back */
    loom_fsdp_state_free(st, n);
  } else {
    rc = loom_fsdp_load_full_state(f, pst, np);
  }
  loom_alloc_fail_nth(0);
  j->fired = alloc_failures() != fails0;
  j->rc = rc;
out:
  loom_module_free(plain);
  loom_optim_free(opt);
  loom_fsdp_free(f);
  loom_module_free(m);
  return LOOM_OK; /* the status is the job's; the group may be broken by the failure */
}

/* Injected failure at allocation n = 1, 2, ... of the call until it succeeds untouched: each
 * failing call returns an error and, everything freed, the pools hold what they held before.
 * The iterations run on one rank thread (a new thread per iteration would cost far more than
 * the call); should a failure break the group, the sweep goes on in a new one. */
typedef struct sweep_state {
  int which;
  bool f16;
  const char *dir;
  int offload;
  uint64_t n;   /* the next n to try */
  int failures; /* calls that failed as they should */
  bool done;    /* a call succeeded without an injected failure */
  bool bad;     /* a check failed (reported) */
} sweep_state;

static int sweep_loop(loom_pg *pg, void *arg) {
  sweep_state *w = arg;
  for (; w->n < 5000 && !w->done && !w->bad; w->n++) {
    size_t c0 = pool_bytes(LOOM_POOL_COMPUTE), h0 = pool_bytes(LOOM_POOL_HOST);
    size_t m0 = pool_bytes(LOOM_POOL_META);
    sweep_job j = {.which = w->which, .f16 = w->f16, .dir = w->dir, .offload = w->offload,
                   .nth = w->n};
    sweep_rank(pg, &j);
    size_t c1 = pool_bytes(LOOM_POOL_COMPUTE), h1 = pool_bytes(LOOM_POOL_HOST);
    size_t m1 = pool_bytes(LOOM_POOL_META);
    const char *what = w->f16 ? "f16" : "f32";
    if (j.rc_setup) {
      if (loom_pg_async_error(pg) != LOOM_OK) return LOOM_EREMOTE; /* a new group, please */
      lt_fail_at(__FILE__, __LINE__, "call %d (%s): the setup failed: %s", w->which, what,
                 loom_last_error());
      w->bad = true;
    } else if (c1 != c0 || h1 != h0 || m1 != m0) {
      lt_fail_at(__FILE__, __LINE__, "call %d (%s), failure at allocation %llu (%s): compute "
                 "%zu -> %zu bytes, host %zu -> %zu, meta %zu -> %zu", w->which, what,
                 (unsigned long long)w->n, loom_status_name(j.rc), c0, c1, h0, h1, m0, m1);
      w->bad = true;
    } else if (!j.fired) {
      if (j.rc != LOOM_OK) {
        lt_fail_at(__FILE__, __LINE__, "call %d (%s): %s without an injected failure",
                   w->which, what, loom_status_name(j.rc));
        w->bad = true;
      }
      w->done = true;
    } else if (j.rc == LOOM_OK) {
      lt_fail_at(__FILE__, __LINE__, "call %d (%s): the failure at allocation %llu was "
                 "swallowed (LOOM_OK)", w->which, what, (unsigned long long)w->n);
      w->bad = true;
    } else {
      w->failures++;
    }
    if (w->done || w->bad) break;
  }
  return LOOM_OK;
}

static void sweep_offload(int which, bool f16, const char *dir, int offload) {
  sweep_state w = {.which = which, .f16 = f16, .dir = dir, .offload = offload, .n = 1};
  loom_pg_cfg pc = loom_pg_cfg_default();
  pc.cores = 1; /* one compute thread: hundreds of tiny steps, cheap on a busy machine too */
  for (int groups = 0; groups < 100 && !w.done && !w.bad && w.n < 5000; groups++) {
    int rc = loom_threads_run(1, &pc, sweep_loop, &w);
    if (rc == LOOM_EREMOTE) w.n++; /* that n broke the group: go on from the next */
    else LT_OK(rc);
  }
  LT_TRUE(!w.bad);
  LT_TRUE(w.done);
  /* a step allocates nothing at 1 rank, loading a full state one index */
  int at_least = which == 2 ? (offload ? 1 : 0) : which == 6 ? 1 : 3;
  if (w.failures < at_least)
    lt_fail_at(__FILE__, __LINE__, "call %d: %d failures injected, expected %d or more", which,
               w.failures, at_least);
}

static void sweep(int which, bool f16, const char *dir) { sweep_offload(which, f16, dir, 0); }

LT_TEST(fsdp_alloc_failures_in_create) {
  sweep(0, false, NULL);
  sweep(0, true, NULL);
}

LT_TEST(fsdp_alloc_failures_in_forward_backward_and_step) {
  sweep(1, false, NULL);
  sweep(1, true, NULL);
  sweep(2, false, NULL);
  sweep(2, true, NULL);
}

LT_TEST(fsdp_alloc_failures_in_checkpoints) {
  /* on a tmpfs when there is one: every save fsyncs its files and folders, ~40 times here */
  char dir[64];
  snprintf(dir, sizeof dir, "/dev/shm/loom_fsdp_oom_XXXXXX");
  if (!mkdtemp(dir)) {
    snprintf(dir, sizeof dir, "/tmp/loom_fsdp_oom_XXXXXX");
    LT_TRUE(mkdtemp(dir) != NULL);
  }
  sweep(3, true, dir);
  sweep(4, true, dir); /* loads what the last save wrote */
  sweep(5, false, NULL);
  sweep(6, false, NULL);
  fm_rm_tree(dir);
}

/* With offload: every allocation of the offloader, the store's jobs and the streamed step. */
LT_TEST(fsdp_alloc_failures_with_offload) {
  char dir[64];
  snprintf(dir, sizeof dir, "/dev/shm/loom_fsdp_oom_XXXXXX");
  if (!mkdtemp(dir)) {
    snprintf(dir, sizeof dir, "/tmp/loom_fsdp_oom_XXXXXX");
    LT_TRUE(mkdtemp(dir) != NULL);
  }
  for (int tier = 1; tier <= 2; tier++) {
    sweep_offload(0, false, NULL, tier);
    sweep_offload(1, true, NULL, tier);
    sweep_offload(2, true, NULL, tier);
  }
  sweep_offload(3, true, dir, 1);
  sweep_offload(4, true, dir, 1);
  sweep_offload(4, true, dir, 2); /* the disk tier's load writes the other slot set */
  sweep_offload(6, false, NULL, 1);
  fm_rm_tree(dir);
}
