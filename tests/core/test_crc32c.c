/* test_crc32c.c: CRC-32C, the checksum of the offload store's disk tier. The scalar reference
 * against the published check values (the catalogue's "123456789", RFC 3720's 32-byte
 * vectors); the SSE4.2 kernel and every dispatch level against the reference at every
 * alignment and ragged length, at the edges of its three-stream blocks, and on a buffer of a
 * few MiB; continuing a CRC over pieces
 * gives the CRC of the whole; and a flipped bit anywhere changes it. */
#include "lt.h"
#include "core/kernels/kernels.h"

#include <stdlib.h>
#include <string.h>

LT_TEST(crc32c_reference_check_values) {
  LT_EQ_HEX(loom__crc32c_scalar(0, "123456789", 9), 0xE3069283u);
  unsigned char b[32];
  memset(b, 0, sizeof b);
  LT_EQ_HEX(loom__crc32c_scalar(0, b, 32), 0x8A9136AAu);
  memset(b, 0xFF, sizeof b);
  LT_EQ_HEX(loom__crc32c_scalar(0, b, 32), 0x62A8AB43u);
  for (int i = 0; i < 32; i++) b[i] = (unsigned char)i;
  LT_EQ_HEX(loom__crc32c_scalar(0, b, 32), 0x46DD794Eu);
  for (int i = 0; i < 32; i++) b[i] = (unsigned char)(31 - i);
  LT_EQ_HEX(loom__crc32c_scalar(0, b, 32), 0x113FDB5Cu);
  LT_EQ_HEX(loom__crc32c_scalar(0, b, 0), 0u);
}

static unsigned char *random_bytes(size_t n, unsigned seed) {
  unsigned char *p = malloc(n);
  srand(seed);
  for (size_t i = 0; i < n; i++) p[i] = (unsigned char)rand();
  return p;
}

LT_TEST(crc32c_every_level_matches_the_reference) {
  size_t big = (3u << 20) + 13;
  unsigned char *buf = random_bytes(big + 16, 7);
  uint32_t (*kernels[LOOM_CPU_LEVEL_COUNT + 1])(uint32_t, const void *, size_t);
  int nk = 0;
  if (__builtin_cpu_supports("sse4.2")) kernels[nk++] = loom__crc32c_sse42;
  loom_cpu_level was = loom_cpu_level_active();
  for (int l = 0; l < LOOM_CPU_LEVEL_COUNT; l++)
    if (loom_cpu_supports((loom_cpu_level)l)) {
      LT_OK(loom_set_cpu_level((loom_cpu_level)l));
      kernels[nk++] = loom__k()->crc32c;
    }
  LT_OK(loom_set_cpu_level(was));
  for (int k = 0; k < nk; k++) {
    for (size_t at = 0; at < 16; at++)
      for (size_t n = 0; n < 80; n++)
        LT_EQ_HEX(kernels[k](0, buf + at, n), loom__crc32c_scalar(0, buf + at, n));
    /* the hardware kernel's three streams: around the short (3 x 256) and long (3 x 8192)
     * blocks, and each kind of block followed by the other's and by the 8-byte tail */
    static const size_t edges[] = {767, 768, 769, 775, 776, 777, 1535, 1536, 1544, 2311,
                                   24575, 24576, 24577, 24583, 24576 + 768, 24576 + 775,
                                   2 * 24576 + 2 * 768 + 7, 3 * 24576 - 1};
    for (size_t e = 0; e < sizeof edges / sizeof *edges; e++)
      for (size_t at = 0; at < 9; at++)
        LT_EQ_HEX(kernels[k](0xA5A5A5A5u, buf + at, edges[e]),
                  loom__crc32c_scalar(0xA5A5A5A5u, buf + at, edges[e]));
    LT_EQ_HEX(kernels[k](0x12345678u, buf + 3, big),
              loom__crc32c_scalar(0x12345678u, buf + 3, big));
  }
  free(buf);
}

LT_TEST(crc32c_continues_over_pieces_and_sees_every_bit) {
  size_t n = 4099;
  unsigned char *buf = random_bytes(n, 11);
  uint32_t whole = loom__k()->crc32c(0, buf, n);
  for (size_t cut = 0; cut <= n; cut += 97)
    LT_EQ_HEX(loom__k()->crc32c(loom__k()->crc32c(0, buf, cut), buf + cut, n - cut), whole);
  for (size_t bit = 0; bit < 8 * n; bit += 61) {
    buf[bit / 8] ^= (unsigned char)(1u << (bit % 8));
    LT_TRUE(loom__k()->crc32c(0, buf, n) != whole);
    buf[bit / 8] ^= (unsigned char)(1u << (bit % 8));
  }
  free(buf);
}
