/* dist_test.c: the dist tests' shared helpers (see dist_test.h). Also a test of the
 * reference itself against hand-worked values. */
#include "dist_test.h"

_Atomic int dt_failures;

static uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

double dt_value(int r, size_t i, unsigned seed, loom_dtype dt, loom_redop op) {
  uint64_t h = mix(((uint64_t)seed << 40) ^ ((uint64_t)r << 32) ^ (uint64_t)i);
  if (!loom_dtype_is_float(dt)) {
    if (op == LOOM_PROD) return (double)((int)(h % 7) - 3);
    return (double)((int64_t)(h % 2001) - 1000);
  }
  if (op == LOOM_PROD) return 0.5 + (double)(h % 1024) / 1024.0 * 1.5;
  return ((double)(h % 65536) - 32768.0) / 4096.0;
}

void dt_fill(void *buf, loom_dtype dt, size_t n, int r, size_t first, unsigned seed,
             loom_redop op) {
  for (size_t i = 0; i < n; i++) loom__store_f64(buf, dt, i, dt_value(r, first + i, seed, dt, op));
}

static float fold_f(float a, float b, loom_redop op) {
  switch (op) {
  case LOOM_SUM:
  case LOOM_AVG: return a + b;
  case LOOM_MIN: return a < b ? a : b;
  case LOOM_MAX: return a > b ? a : b;
  default: return a * b;
  }
}

static uint64_t fold_u(uint64_t a, uint64_t b, loom_redop op, int bits) {
  int64_t x = bits == 32 ? (int32_t)a : (int64_t)a, y = bits == 32 ? (int32_t)b : (int64_t)b;
  uint64_t r;
  switch (op) {
  case LOOM_SUM:
  case LOOM_AVG: r = a + b; break;
  case LOOM_MIN: r = (uint64_t)(x < y ? x : y); break;
  case LOOM_MAX: r = (uint64_t)(x > y ? x : y); break;
  default: r = a * b; break;
  }
  return bits == 32 ? (uint32_t)r : r;
}

void dt_reduce_ref(void *ref, loom_dtype dt, loom_redop op, int nranks, size_t count,
                   size_t first, unsigned seed) {
  size_t es = loom_dtype_size(dt);
  unsigned char one[8];
  for (size_t i = 0; i < count; i++) {
    if (loom_dtype_is_float(dt)) {
      float acc = 0;
      for (int r = 0; r < nranks; r++) {
        loom__store_f64(one, dt, 0, dt_value(r, first + i, seed, dt, op));
        float v = (float)loom__load_f64(one, dt, 0); /* the value as stored in dt */
        acc = r ? fold_f(acc, v, op) : v;
      }
      if (op == LOOM_AVG) acc /= (float)nranks;
      loom__store_f64(ref, dt, i, (double)acc);
    } else {
      int bits = dt == LOOM_I32 ? 32 : 64;
      uint64_t acc = 0;
      for (int r = 0; r < nranks; r++) {
        int64_t v = (int64_t)dt_value(r, first + i, seed, dt, op);
        uint64_t u = bits == 32 ? (uint32_t)(int32_t)v : (uint64_t)v;
        acc = r ? fold_u(acc, u, op, bits) : u;
      }
      if (bits == 32) {
        int32_t s = (int32_t)(uint32_t)acc;
        if (op == LOOM_AVG) s /= nranks;
        memcpy((char *)ref + i * es, &s, 4);
      } else {
        int64_t s = (int64_t)acc;
        if (op == LOOM_AVG) s /= nranks;
        memcpy((char *)ref + i * es, &s, 8);
      }
    }
  }
}

LT_TEST(dist_reference_by_hand) {
  /* three ranks, one element: check the reference against values computed here */
  for (int op = 0; op < LOOM_REDOP_COUNT; op++) {
    double v[3];
    for (int r = 0; r < 3; r++) v[r] = dt_value(r, 5, 9, LOOM_I64, (loom_redop)op);
    int64_t want = (int64_t)v[0];
    for (int r = 1; r < 3; r++) {
      int64_t x = (int64_t)v[r];
      if (op == LOOM_SUM || op == LOOM_AVG) want += x;
      if (op == LOOM_MIN) want = x < want ? x : want;
      if (op == LOOM_MAX) want = x > want ? x : want;
      if (op == LOOM_PROD) want *= x;
    }
    if (op == LOOM_AVG) want /= 3;
    int64_t got;
    dt_reduce_ref(&got, LOOM_I64, (loom_redop)op, 3, 1, 5, 9);
    LT_EQ(got, want);
  }
}
