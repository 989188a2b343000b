/* sweep_avx2.h: how the AVX2 and AVX-512 kernels walk a buffer (the core conversions, the AMP
 * unscale): in whole steps, and a buffer too large for the cache as LOOM__SWEEP_STREAMS interleaved
 * streams, each prefetched LOOM__SWEEP_PREFETCH bytes ahead. One core's hardware prefetcher
 * restarts at every 4 KB page; with several streams in flight one core reads near the
 * memory's rate (glibc's memcpy interleaves pages the same way): on a Zen 3 core, 1.3x one
 * stream. Also the conversions' walk over their buffers (loom__cvt_*). Include only from files
 * built with -mavx2 (or an AVX-512 level, which implies it). */
#ifndef LOOM_CORE_SWEEP_AVX2_H
#define LOOM_CORE_SWEEP_AVX2_H

#include <immintrin.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

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

/* The conversions' walk (cvt_avx2.c, cvt_avx512.c) over buffers whose steps read
 * src + i * (its element size) and write dst + i * (its). */
typedef struct loom__cvt_ctx {
  const char *src;
  char *dst;
  bool stream; /* non-temporal stores */
} loom__cvt_ctx;

/* Elements to convert one by one before dst reaches a cache line: every step then writes
 * whole lines (a non-temporal store that leaves a line partly written costs a read of it);
 * all n when dst is not element-aligned (no vector path). */
static inline size_t loom__cvt_head(const void *dst, size_t elem, size_t n) {
  size_t mis = (uintptr_t)dst & 63u;
  if (!mis) return 0;
  if ((64u - mis) % elem) return n;
  size_t h = (64u - mis) / elem;
  return h < n ? h : n;
}

/* The vector middle of a conversion from es-byte to ed-byte elements, `step_n` a step: [i, n)
 * in whole steps (dst + i * ed on a cache line), non-temporal and as interleaved streams past
 * LOOM__STREAM_BYTES of output; returns where it stopped. */
static inline __attribute__((always_inline)) size_t
loom__cvt_body(const void *src, size_t es, void *dst, size_t ed, size_t i, size_t n,
               size_t step_n, loom__sweep_fn *step) {
  loom__cvt_ctx c = {src, dst, n * ed >= LOOM__STREAM_BYTES};
  i = loom__sweep_avx2(i, n, step_n, c.stream, src, es, step, &c);
  if (c.stream) _mm_sfence();
  return i;
}

#endif
