/* dtype.c: the dtype table (names, sizes), the public conversion entry points, which call the
 * dispatched kernels, the general any-to-any element conversion (long float ones over the
 * caller's OpenMP team), and the private widen / narrow / round-via helpers (one
 * widen-apply-narrow loop for every layer). */
#include "core/kernels/kernels.h"

#include <math.h>
#include <string.h>

typedef struct dtype_info {
  const char *name;
  size_t size;
  bool is_float;
} dtype_info;

static const dtype_info infos[LOOM_DTYPE_COUNT] = {
#define INFO(name, str, size, is_float) {str, size, is_float},
    LOOM_DTYPE_MAP(INFO)
#undef INFO
};

bool loom_dtype_valid(loom_dtype dt) { return (unsigned)dt < LOOM_DTYPE_COUNT; }
size_t loom_dtype_size(loom_dtype dt) { return loom_dtype_valid(dt) ? infos[dt].size : 0; }
const char *loom_dtype_name(loom_dtype dt) { return loom_dtype_valid(dt) ? infos[dt].name : "?"; }
bool loom_dtype_is_float(loom_dtype dt) { return loom_dtype_valid(dt) && infos[dt].is_float; }

int loom_dtype_parse(const char *name, loom_dtype *out) {
  static const struct {
    const char *alias;
    loom_dtype dt;
  } aliases[] = {{"float32", LOOM_F32}, {"float16", LOOM_F16}, {"half", LOOM_F16},
                 {"bfloat16", LOOM_BF16}, {"int32", LOOM_I32}, {"int64", LOOM_I64}};
  if (!name || !out) return loom__fail(LOOM_EINVAL, "loom_dtype_parse: NULL argument");
  for (int d = 0; d < LOOM_DTYPE_COUNT; d++)
    if (strcmp(name, infos[d].name) == 0) {
      *out = (loom_dtype)d;
      return LOOM_OK;
    }
  for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++)
    if (strcmp(name, aliases[i].alias) == 0) {
      *out = aliases[i].dt;
      return LOOM_OK;
    }
  return loom__fail(LOOM_EINVAL, "unknown dtype '%s' (expected f32, f16, bf16, i32 or i64)", name);
}

void loom_cvt_f32_to_bf16(const float *src, uint16_t *dst, size_t n) {
  loom__k()->cvt_f32_to_bf16(src, dst, n);
}
void loom_cvt_bf16_to_f32(const uint16_t *src, float *dst, size_t n) {
  loom__k()->cvt_bf16_to_f32(src, dst, n);
}
void loom_cvt_f32_to_f16(const float *src, uint16_t *dst, size_t n) {
  loom__k()->cvt_f32_to_f16(src, dst, n);
}
void loom_cvt_f16_to_f32(const uint16_t *src, float *dst, size_t n) {
  loom__k()->cvt_f16_to_f32(src, dst, n);
}

void loom__widen(loom_dtype dt, const void *src, float *dst, size_t n) {
  if (loom__dry()) return;
  if (dt == LOOM_F16) loom_cvt_f16_to_f32(src, dst, n);
  else loom_cvt_bf16_to_f32(src, dst, n);
}

void loom__narrow(loom_dtype dt, const float *src, void *dst, size_t n) {
  if (loom__dry()) return;
  if (dt == LOOM_F16) loom_cvt_f32_to_f16(src, dst, n);
  else loom_cvt_f32_to_bf16(src, dst, n);
}

void loom__f32_begin(loom__f32_iter *it, void *x, loom_dtype dt, size_t n) {
  it->x = x;
  it->dt = dt;
  it->n = n;
  it->off = it->k = 0;
  it->p = dt == LOOM_F32 ? x : it->buf;
}

bool loom__f32_next(loom__f32_iter *it) {
  bool f32 = it->dt == LOOM_F32;
  if (it->k) { /* the block just applied: round it back, step past it */
    if (!f32) loom__narrow(it->dt, it->buf, (uint16_t *)it->x + it->off, it->k);
    it->off += it->k;
  }
  if (it->off >= it->n) {
    it->k = 0;
    return false;
  }
  size_t left = it->n - it->off;
  it->k = f32 ? left : left < LOOM__F32_BLOCK ? left : LOOM__F32_BLOCK;
  if (!f32) loom__widen(it->dt, (const uint16_t *)it->x + it->off, it->buf, it->k);
  return true;
}

static float bits_to_f32(uint32_t b) {
  float f;
  memcpy(&f, &b, 4);
  return f;
}
static uint32_t f32_to_bits(float f) {
  uint32_t b;
  memcpy(&b, &f, 4);
  return b;
}
uint16_t loom_f32_to_bf16(float x) { return loom__ref_f32_to_bf16(f32_to_bits(x)); }
float loom_bf16_to_f32(uint16_t h) { return bits_to_f32(loom__ref_bf16_to_f32(h)); }
uint16_t loom_f32_to_f16(float x) { return loom__ref_f32_to_f16(f32_to_bits(x)); }
float loom_f16_to_f32(uint16_t h) { return bits_to_f32(loom__ref_f16_to_f32(h)); }

double loom__load_f64(const void *p, loom_dtype dt, size_t i) {
  switch (dt) {
  case LOOM_F32: return ((const float *)p)[i];
  case LOOM_F16: return loom_f16_to_f32(((const uint16_t *)p)[i]);
  case LOOM_BF16: return loom_bf16_to_f32(((const uint16_t *)p)[i]);
  case LOOM_I32: return ((const int32_t *)p)[i];
  case LOOM_I64: return (double)((const int64_t *)p)[i];
  default: return 0;
  }
}

static int64_t saturate(double v, double lo, double hi) {
  if (isnan(v)) return 0;
  if (v <= lo) return (int64_t)lo;
  if (v >= hi) return (int64_t)hi;
  return (int64_t)v;
}

void loom__store_f64(void *p, loom_dtype dt, size_t i, double v) {
  switch (dt) {
  case LOOM_F32: ((float *)p)[i] = (float)v; break;
  case LOOM_F16: ((uint16_t *)p)[i] = loom_f32_to_f16((float)v); break;
  case LOOM_BF16: ((uint16_t *)p)[i] = loom_f32_to_bf16((float)v); break;
  case LOOM_I32: ((int32_t *)p)[i] = (int32_t)saturate(v, INT32_MIN, INT32_MAX); break;
  case LOOM_I64: ((int64_t *)p)[i] = saturate(v, -9223372036854775808.0, 9223372036854774784.0); break;
  default: break;
  }
}

/* Long float conversions (a step's casts of activations and gradients) run in chunks over the
 * calling thread's OpenMP team (the compute ops' thread count, loom_set_num_threads); each
 * element's value is the same whatever the split. Chunks are whole 64-byte lines of either
 * side, so each one's kernel sees the alignment the whole conversion would. */
enum { CVT_PAR_MIN = 1 << 17, CVT_CHUNK = 1 << 15 };

typedef enum { CV_F32_BF16, CV_BF16_F32, CV_F32_F16, CV_F16_F32 } cvt_kind;

static void cvt_one(cvt_kind k, const void *src, void *dst, size_t at, size_t n) {
  switch (k) {
  case CV_F32_BF16: loom_cvt_f32_to_bf16((const float *)src + at, (uint16_t *)dst + at, n); break;
  case CV_BF16_F32: loom_cvt_bf16_to_f32((const uint16_t *)src + at, (float *)dst + at, n); break;
  case CV_F32_F16: loom_cvt_f32_to_f16((const float *)src + at, (uint16_t *)dst + at, n); break;
  case CV_F16_F32: loom_cvt_f16_to_f32((const uint16_t *)src + at, (float *)dst + at, n); break;
  }
}

static void cvt_par(cvt_kind k, const void *src, void *dst, size_t n) {
  int64_t chunks = (int64_t)((n + CVT_CHUNK - 1) / CVT_CHUNK);
#pragma omp parallel for if (LOOM__OMP_TEAM && n >= CVT_PAR_MIN)
  for (int64_t c = 0; c < chunks; c++) {
    size_t at = (size_t)c * CVT_CHUNK;
    cvt_one(k, src, dst, at, n - at < CVT_CHUNK ? n - at : CVT_CHUNK);
  }
}

void loom__round_via(loom_dtype dt, const float *src, float *dst, size_t n) {
  enum { PIECE = 2048 };
  if (loom__dry()) return;
  if (dt == LOOM_F32) {
    if (src != dst) memcpy(dst, src, n * sizeof *dst);
    return;
  }
  int64_t chunks = (int64_t)((n + CVT_CHUNK - 1) / CVT_CHUNK);
#pragma omp parallel for if (LOOM__OMP_TEAM && n >= CVT_PAR_MIN)
  for (int64_t c = 0; c < chunks; c++) {
    uint16_t h[PIECE];
    size_t end = (size_t)(c + 1) * CVT_CHUNK < n ? (size_t)(c + 1) * CVT_CHUNK : n;
    for (size_t i = (size_t)c * CVT_CHUNK; i < end; i += PIECE) {
      size_t m = end - i < PIECE ? end - i : PIECE;
      loom__narrow(dt, src + i, h, m);
      loom__widen(dt, h, dst + i, m);
    }
  }
}

int loom_convert(const void *src, loom_dtype src_dt, void *dst, loom_dtype dst_dt, size_t n) {
  if (!loom_dtype_valid(src_dt) || !loom_dtype_valid(dst_dt))
    return loom__fail(LOOM_EDTYPE, "loom_convert: invalid dtype (%d -> %d)", (int)src_dt,
                      (int)dst_dt);
  if (n && (!src || !dst)) return loom__fail(LOOM_EINVAL, "loom_convert: NULL buffer");
  if (loom__dry()) return LOOM_OK;
  if (src_dt == dst_dt) {
    size_t es = loom_dtype_size(src_dt);
    int64_t chunks = (int64_t)((n + CVT_CHUNK - 1) / CVT_CHUNK);
#pragma omp parallel for if (LOOM__OMP_TEAM && src != dst && n >= CVT_PAR_MIN)
    for (int64_t c = 0; c < chunks; c++) {
      size_t at = (size_t)c * CVT_CHUNK, m = n - at < CVT_CHUNK ? n - at : CVT_CHUNK;
      if (src != dst) memcpy((char *)dst + at * es, (const char *)src + at * es, m * es);
    }
    return LOOM_OK;
  }
  if (src_dt == LOOM_F32 && dst_dt == LOOM_BF16) cvt_par(CV_F32_BF16, src, dst, n);
  else if (src_dt == LOOM_BF16 && dst_dt == LOOM_F32) cvt_par(CV_BF16_F32, src, dst, n);
  else if (src_dt == LOOM_F32 && dst_dt == LOOM_F16) cvt_par(CV_F32_F16, src, dst, n);
  else if (src_dt == LOOM_F16 && dst_dt == LOOM_F32) cvt_par(CV_F16_F32, src, dst, n);
  else if (src_dt == LOOM_I64 && dst_dt == LOOM_I32)
    for (size_t i = 0; i < n; i++) ((int32_t *)dst)[i] = (int32_t)((const int64_t *)src)[i];
  else if (src_dt == LOOM_I32 && dst_dt == LOOM_I64)
    for (size_t i = 0; i < n; i++) ((int64_t *)dst)[i] = ((const int32_t *)src)[i];
  else
    for (size_t i = 0; i < n; i++) loom__store_f64(dst, dst_dt, i, loom__load_f64(src, src_dt, i));
  return LOOM_OK;
}
