/* sweep_avx2.h: how the AVX2 kernels walk a buffer (the core conversions, the AMP unscale):
 * in whole steps, and a buffer too large for the cache as LOOM__SWEEP_STREAMS interleaved
 * streams, each prefetched LOOM__SWEEP_PREFETCH bytes ahead. One core's hardware prefetcher
 * restarts at every 4 KB page; with several streams in flight one core reads near the
 * memory's rate (glibc's memcpy interleaves pages the same way): on a Zen 3 core, 1.3x one
 * stream. Include only from files built with -mavx2. */
#ifndef LOOM_CORE_SWEEP_AVX2_H
#define LOOM_CORE_SWEEP_AVX2_H

#include <immintrin.h>
#include <stdbool.h>
#include <stddef.h>

#define LOOM__SWEEP_STREAMS 4
#define LOOM__SWEEP_PREFETCH 2048

/* One step of a kernel: `step` elements from element i on (ctx: the kernel's buffers). */
typedef void loom__sweep_fn(void *ctx, size_t i);

/* Calls fn(ctx, i) for every whole step of [i, n), `step` elements each; with `streams`,
 * interleaving LOOM__SWEEP_STREAMS equal parts and prefetching from `read` (the buffer read,
 * es bytes an element). Returns the first element not covered (the caller's ragged end).
 * Stream starts are whole steps apart, so a step's alignment is the same in every stream. */
static inline __attribute__((always_inline)) size_t
loom__sweep_avx2(size_t i, size_t n, size_t step, bool streams, const void *read, size_t es,
                 loom__sweep_fn *fn, void *ctx) {
  if (streams && n > i) {
    size_t len = (n - i) / (LOOM__SWEEP_STREAMS * step) * step; /* elements per stream */
    for (size_t j = 0; j < len; j += step)
      for (size_t k = 0; k < LOOM__SWEEP_STREAMS; k++) {
        size_t at = i + k * len + j;
        const char *p = (const char *)read + at * es + LOOM__SWEEP_PREFETCH;
        for (size_t b = 0; b < step * es; b += 64) _mm_prefetch(p + b, _MM_HINT_T0);
        fn(ctx, at);
      }
    i += LOOM__SWEEP_STREAMS * len;
  }
  for (; i + step <= n; i += step) fn(ctx, i);
  return i;
}

#endif
