/* hash.c: the library's one non-cryptographic byte hash, 64-bit FNV-1a (loom__fnv1a). */
#include "core/core_int.h"

uint64_t loom__fnv1a(uint64_t h, const void *p, size_t n) {
  const unsigned char *c = p;
  for (size_t i = 0; i < n; i++) h = (h ^ c[i]) * 1099511628211ull;
  return h;
}
