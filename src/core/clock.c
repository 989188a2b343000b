/* clock.c: the library's one monotonic clock (loom__now), for every layer's timings. */
#include "core/core_int.h"

#include <time.h>

double loom__now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
