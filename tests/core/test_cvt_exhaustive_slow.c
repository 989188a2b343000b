/* test_cvt_exhaustive_slow.c: every one of the 2^32 f32 inputs through each dispatch level's
 * f32 -> f16 and f32 -> bf16 kernel, compared bit for bit with the scalar reference (NaN
 * inputs too: every level makes the same quiet NaN). Two threads split the range. The
 * ThreadSanitizer build checks every 64th block, which keeps CI's time bounded. */
#include "lt.h"
#include "core/kernels/kernels.h"

#include <pthread.h>
#include <stdlib.h>

#define BLOCK (1u << 20)

typedef void (*narrow_fn)(const float *, uint16_t *, size_t);

typedef struct job {
  narrow_fn fast, slow;
  uint32_t first_block, block_step;
  uint64_t mismatches;
  uint32_t first_bad;
} job;

static void *run(void *p) {
  job *j = p;
  uint32_t *src = malloc(BLOCK * 4);
  uint16_t *ref = malloc(BLOCK * 2), *got = malloc(BLOCK * 2);
  for (uint64_t b = j->first_block; b < (1ull << 32) / BLOCK; b += j->block_step) {
    uint32_t base = (uint32_t)(b * BLOCK);
    for (uint32_t i = 0; i < BLOCK; i++) src[i] = base + i;
    j->slow((const float *)src, ref, BLOCK);
    j->fast((const float *)src, got, BLOCK);
    if (memcmp(ref, got, BLOCK * 2))
      for (uint32_t i = 0; i < BLOCK; i++)
        if (ref[i] != got[i] && j->mismatches++ == 0) j->first_bad = base + i;
  }
  free(src);
  free(ref);
  free(got);
  return NULL;
}

static void exhaustive(const char *level, const char *what, narrow_fn fast, narrow_fn slow) {
#ifdef __SANITIZE_THREAD__
  uint32_t stride = 64; /* ThreadSanitizer is here for the two threads, not the arithmetic */
#else
  uint32_t stride = 1;
#endif
  job jobs[2] = {{fast, slow, 0, 2 * stride, 0, 0}, {fast, slow, stride, 2 * stride, 0, 0}};
  pthread_t t[2];
  for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, run, &jobs[i]);
  for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
  for (int i = 0; i < 2; i++)
    if (jobs[i].mismatches)
      lt_fail_at(__FILE__, __LINE__, "%s %s: %llu mismatches, first at input 0x%08x", level, what,
                 (unsigned long long)jobs[i].mismatches, jobs[i].first_bad);
}

LT_TEST(exhaustive_avx2) {
  if (!loom_cpu_supports(LOOM_CPU_AVX2)) {
    lt_skip("this CPU has no AVX2/F16C");
    return;
  }
  exhaustive("avx2", "f32_to_f16", loom__core_kernels_avx2.cvt_f32_to_f16,
             loom__core_kernels_scalar.cvt_f32_to_f16);
  exhaustive("avx2", "f32_to_bf16", loom__core_kernels_avx2.cvt_f32_to_bf16,
             loom__core_kernels_scalar.cvt_f32_to_bf16);
}

LT_TEST(exhaustive_avx512) {
  if (!loom_cpu_supports(LOOM_CPU_AVX512)) {
    lt_skip("this CPU has no AVX-512");
    return;
  }
  exhaustive("avx512", "f32_to_f16", loom__core_kernels_avx512.cvt_f32_to_f16,
             loom__core_kernels_scalar.cvt_f32_to_f16);
  exhaustive("avx512", "f32_to_bf16", loom__core_kernels_avx512.cvt_f32_to_bf16,
             loom__core_kernels_scalar.cvt_f32_to_bf16);
}

LT_TEST(exhaustive_avx512bf16) {
  if (!loom_cpu_has_avx512bf16()) {
    lt_skip("this CPU has no AVX512-BF16");
    return;
  }
  exhaustive("avx512bf16", "f32_to_bf16", loom__cvt_f32_to_bf16_avx512bf16,
             loom__core_kernels_scalar.cvt_f32_to_bf16);
}
