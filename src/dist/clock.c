/* clock.c: the dist layer's monotonic clock and its bulk copy. (A core clock helper would
 * serve other layers too; until core has one, it lives here.) */
#include "dist/dist_int.h"

#include <string.h>
#include <time.h>

double loom__now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void loom__copy(void *dst, const void *src, size_t n) {
  if (n) memcpy(dst, src, n);
}
