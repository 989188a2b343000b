/* crc32c_scalar.c: CRC-32C (Castagnoli, the polynomial of iSCSI, ext4 and NVMe: reflected
 * 0x82F63B78, initial and final value inverted), portable: slicing-by-8 over tables made once.
 * It is the reference the hardware kernel (crc32c_sse42.c) is tested against, and the kernel
 * of the scalar level. */
#include "core/kernels/kernels.h"

#include <pthread.h>
#include <string.h>

static uint32_t table[8][256];
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void make_tables(void) {
  for (uint32_t i = 0; i < 256; i++) {
    uint32_t c = i;
    for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    table[0][i] = c;
  }
  for (uint32_t i = 0; i < 256; i++)
    for (int t = 1; t < 8; t++)
      table[t][i] = (table[t - 1][i] >> 8) ^ table[0][table[t - 1][i] & 0xFF];
}

uint32_t loom__crc32c_scalar(uint32_t crc, const void *data, size_t n) {
  pthread_once(&once, make_tables);
  const unsigned char *p = data;
  uint32_t c = ~crc;
  for (; n && ((uintptr_t)p & 7); n--) c = (c >> 8) ^ table[0][(c ^ *p++) & 0xFF];
  for (; n >= 8; n -= 8, p += 8) {
    uint32_t lo, hi;
    memcpy(&lo, p, 4);
    memcpy(&hi, p + 4, 4);
    lo ^= c; /* little-endian: the byte order the tables assume */
    c = table[7][lo & 0xFF] ^ table[6][(lo >> 8) & 0xFF] ^ table[5][(lo >> 16) & 0xFF] ^
        table[4][lo >> 24] ^ table[3][hi & 0xFF] ^ table[2][(hi >> 8) & 0xFF] ^
        table[1][(hi >> 16) & 0xFF] ^ table[0][hi >> 24];
  }
  for (; n; n--) c = (c >> 8) ^ table[0][(c ^ *p++) & 0xFF];
  return ~c;
}
