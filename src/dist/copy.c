/* copy.c: the dist layer's bulk copy (the clock is core's loom__now). */
#include "dist/dist_int.h"

#include <string.h>

void loom__copy(void *dst, const void *src, size_t n) {
  if (n && !loom__dry()) memcpy(dst, src, n);
}
