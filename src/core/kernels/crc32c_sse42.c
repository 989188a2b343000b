/* crc32c_sse42.c: CRC-32C with SSE4.2's CRC32 instruction. The instruction takes 3 cycles and
 * a new one can start every cycle, so one chain of it runs at a third of the core's rate:
 * buffers of at least 3 x 256 bytes are cut into three streams computed at once, each from a
 * zero register, then joined by shifting the earlier streams' CRCs over the later ones' lengths
 * (multiplying by x^(8 len) modulo the polynomial, applied through four 256-entry tables made
 * once per length; Mark Adler's construction, as in his public crc32c.c). The same value as
 * loom__crc32c_scalar (the reference, tests/core/test_crc32c.c). Built with -msse4.2;
 * dispatch.c uses it only on CPUs that have SSE4.2 (every CPU of the avx2 level does). */
#include "core/kernels/kernels.h"

#include <nmmintrin.h>
#include <pthread.h>
#include <string.h>

#define POLY 0x82F63B78u
#define LONG_BYTES ((size_t)8192) /* one stream of the long blocks (3 x 8 KiB stay in L1/L2) */
#define SHORT_BYTES ((size_t)256) /* one stream of the short blocks (the tail under 24 KiB) */

static uint32_t shift_long[4][256], shift_short[4][256];
static pthread_once_t once = PTHREAD_ONCE_INIT;

/* A 32x32 matrix over GF(2) (column n: the image of bit n) times a vector. */
static uint32_t gf2_times(const uint32_t *mat, uint32_t vec) {
  uint32_t sum = 0;
  for (; vec; vec >>= 1, mat++)
    if (vec & 1) sum ^= *mat;
  return sum;
}

static void gf2_square(uint32_t *square, const uint32_t *mat) {
  for (int n = 0; n < 32; n++) square[n] = gf2_times(mat, mat[n]);
}

/* The operator that appends `len` zero bytes (len a power of two) to a CRC register. */
static void zeros_op(uint32_t *even, size_t len) {
  uint32_t odd[32];
  odd[0] = POLY; /* one zero bit */
  for (int n = 1; n < 32; n++) odd[n] = 1u << (n - 1);
  gf2_square(even, odd); /* 2 bits */
  gf2_square(odd, even); /* 4 bits */
  for (;;) {
    gf2_square(even, odd); /* 8 bits = 1 byte, then 4, 16, ... bytes */
    len >>= 1;
    if (!len) return;
    gf2_square(odd, even); /* 2, 8, 32, ... bytes */
    len >>= 1;
    if (!len) break;
  }
  memcpy(even, odd, sizeof odd);
}

static void make_shift(uint32_t t[4][256], size_t len) {
  uint32_t op[32];
  zeros_op(op, len);
  for (uint32_t n = 0; n < 256; n++)
    for (int k = 0; k < 4; k++) t[k][n] = gf2_times(op, n << (8 * k));
}

static void make_tables(void) {
  make_shift(shift_long, LONG_BYTES);
  make_shift(shift_short, SHORT_BYTES);
}

static inline uint64_t shift(uint32_t t[4][256], uint64_t crc) {
  return t[0][crc & 0xFF] ^ t[1][(crc >> 8) & 0xFF] ^ t[2][(crc >> 16) & 0xFF] ^
         t[3][(crc >> 24) & 0xFF];
}

static inline uint64_t load64(const unsigned char *p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return v;
}

/* Three streams of `stream` bytes each at p, joined into c0 (which holds the CRC before p). */
static inline uint64_t three(uint64_t c0, const unsigned char *p, size_t stream,
                             uint32_t t[4][256]) {
  uint64_t c1 = 0, c2 = 0;
  for (size_t i = 0; i < stream; i += 8) {
    c0 = _mm_crc32_u64(c0, load64(p + i));
    c1 = _mm_crc32_u64(c1, load64(p + stream + i));
    c2 = _mm_crc32_u64(c2, load64(p + 2 * stream + i));
  }
  c0 = shift(t, c0) ^ c1;
  return shift(t, c0) ^ c2;
}

uint32_t loom__crc32c_sse42(uint32_t crc, const void *data, size_t n) {
  const unsigned char *p = data;
  uint64_t c = ~crc;
  for (; n && ((uintptr_t)p & 7); n--) c = _mm_crc32_u8((uint32_t)c, *p++);
  if (n >= 3 * SHORT_BYTES) pthread_once(&once, make_tables);
  for (; n >= 3 * LONG_BYTES; n -= 3 * LONG_BYTES, p += 3 * LONG_BYTES)
    c = three(c, p, LONG_BYTES, shift_long);
  for (; n >= 3 * SHORT_BYTES; n -= 3 * SHORT_BYTES, p += 3 * SHORT_BYTES)
    c = three(c, p, SHORT_BYTES, shift_short);
  for (; n >= 8; n -= 8, p += 8) c = _mm_crc32_u64(c, load64(p));
  for (; n; n--) c = _mm_crc32_u8((uint32_t)c, *p++);
  return ~(uint32_t)c;
}
