/* dist_test.c: the dist tests' shared helpers (see dist_test.h), also linked into the MPI
 * test program. */
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

/* ---- every collective x dtype x op x in-place, checked against the reference ---- */

static const size_t counts[] = {0, 1, 5, 1001, 9001, 70001};
#define NCOUNTS (sizeof counts / sizeof counts[0])

static void *xalloc(size_t bytes) { return calloc(1, bytes ? bytes : 1); }

static void case_allreduce(loom_pg *pg, loom_dtype dt, loom_redop op, bool inplace, size_t n,
                           unsigned seed) {
  int r = loom_pg_rank(pg), size = loom_pg_size(pg);
  size_t es = loom_dtype_size(dt);
  unsigned char *send = xalloc(n * es), *recv = inplace ? send : xalloc(n * es),
                *ref = xalloc(n * es);
  dt_fill(send, dt, n, r, 0, seed, op);
  dt_reduce_ref(ref, dt, op, size, n, 0, seed);
  int rc = loom_pg_allreduce(pg, send, recv, n, dt, op, NULL);
  DT_CHECK(rc == LOOM_OK, "all-reduce rc %d", rc);
  DT_CHECK(memcmp(recv, ref, n * es) == 0, "all-reduce %s %s inplace %d count %zu ranks %d rank %d",
           loom_dtype_name(dt), loom_redop_name(op), inplace, n, size, r);
  free(send);
  if (!inplace) free(recv);
  free(ref);
}

static void case_reduce_scatter(loom_pg *pg, loom_dtype dt, loom_redop op, bool inplace,
                                size_t n, unsigned seed) {
  int r = loom_pg_rank(pg), size = loom_pg_size(pg);
  size_t es = loom_dtype_size(dt);
  unsigned char *send = xalloc((size_t)size * n * es), *ref = xalloc(n * es);
  unsigned char *recv = inplace ? send + (size_t)r * n * es : xalloc(n * es);
  dt_fill(send, dt, (size_t)size * n, r, 0, seed, op);
  dt_reduce_ref(ref, dt, op, size, n, (size_t)r * n, seed);
  int rc = loom_pg_reduce_scatter(pg, send, recv, n, dt, op, NULL);
  DT_CHECK(rc == LOOM_OK, "reduce-scatter rc %d", rc);
  DT_CHECK(memcmp(recv, ref, n * es) == 0,
           "reduce-scatter %s %s inplace %d count %zu ranks %d rank %d", loom_dtype_name(dt),
           loom_redop_name(op), inplace, n, size, r);
  free(send);
  if (!inplace) free(recv);
  free(ref);
}

static void case_broadcast(loom_pg *pg, loom_dtype dt, int root, bool inplace, size_t n,
                           unsigned seed) {
  int r = loom_pg_rank(pg), size = loom_pg_size(pg);
  size_t es = loom_dtype_size(dt);
  unsigned char *recv = xalloc(n * es), *ref = xalloc(n * es);
  unsigned char *send = r == root ? (inplace ? recv : xalloc(n * es)) : NULL;
  dt_fill(ref, dt, n, root, 0, seed, LOOM_SUM);
  if (send) memcpy(send, ref, n * es);
  if (r != root) memset(recv, 0x5a, n * es);
  int rc = loom_pg_broadcast(pg, send, recv, n, dt, root, NULL);
  DT_CHECK(rc == LOOM_OK, "broadcast rc %d", rc);
  DT_CHECK(memcmp(recv, ref, n * es) == 0, "broadcast %s root %d inplace %d count %zu ranks %d rank %d",
           loom_dtype_name(dt), root, inplace, n, size, r);
  if (send && send != recv) free(send);
  free(recv);
  free(ref);
}

static void case_allgather(loom_pg *pg, loom_dtype dt, bool inplace, size_t n, unsigned seed) {
  int r = loom_pg_rank(pg), size = loom_pg_size(pg);
  size_t es = loom_dtype_size(dt), blk = n * es;
  unsigned char *recv = xalloc((size_t)size * blk), *ref = xalloc((size_t)size * blk);
  unsigned char *send = inplace ? recv + (size_t)r * blk : xalloc(blk);
  for (int j = 0; j < size; j++) dt_fill(ref + (size_t)j * blk, dt, n, j, 0, seed, LOOM_SUM);
  if (!inplace) memset(recv, 0x5a, (size_t)size * blk);
  memcpy(send, ref + (size_t)r * blk, blk);
  int rc = loom_pg_allgather(pg, send, recv, n, dt, NULL);
  DT_CHECK(rc == LOOM_OK, "all-gather rc %d", rc);
  DT_CHECK(memcmp(recv, ref, (size_t)size * blk) == 0,
           "all-gather %s inplace %d count %zu ranks %d rank %d", loom_dtype_name(dt), inplace,
           n, size, r);
  if (!inplace) free(send);
  free(recv);
  free(ref);
}

int dt_all_cases(loom_pg *pg, void *arg) {
  (void)arg;
  unsigned seed = 1;
  /* sanitizer builds run the largest count with two ops only (every op at every other count) */
  bool sanitized = getenv("LOOM_SANITIZED") != NULL;
  DT_CHECK(loom_pg_compute_threads(pg) >= 1, "compute threads");
  for (size_t ci = 0; ci < NCOUNTS; ci++)
    for (int dt = 0; dt < LOOM_DTYPE_COUNT; dt++)
      for (int inplace = 0; inplace < 2; inplace++) {
        for (int op = 0; op < LOOM_REDOP_COUNT; op++) {
          if (sanitized && ci == NCOUNTS - 1 && op != LOOM_SUM && op != LOOM_MAX) continue;
          case_allreduce(pg, (loom_dtype)dt, (loom_redop)op, inplace, counts[ci], seed++);
          case_reduce_scatter(pg, (loom_dtype)dt, (loom_redop)op, inplace, counts[ci], seed++);
        }
        for (int root = 0; root < loom_pg_size(pg); root++)
          case_broadcast(pg, (loom_dtype)dt, root, inplace, counts[ci], seed++);
        case_allgather(pg, (loom_dtype)dt, inplace, counts[ci], seed++);
        DT_CHECK(loom_pg_barrier(pg, NULL) == LOOM_OK, "barrier");
      }
  return LOOM_OK;
}

void dt_large_reduce_scatters(loom_pg *pg) {
  static const loom_dtype dts[] = {LOOM_F32, LOOM_F16, LOOM_BF16, LOOM_I32};
  static const loom_redop ops[] = {LOOM_SUM, LOOM_AVG};
  unsigned seed = 9000;
  for (int d = 0; d < 4; d++)
    for (int o = 0; o < 2; o++)
      for (int inplace = 0; inplace < 2; inplace++)
        case_reduce_scatter(pg, dts[d], ops[o], inplace, ((size_t)2 << 20) + 7, seed++);
}

