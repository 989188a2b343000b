/* loom/cpu.h: CPU feature dispatch.
 *
 * loom picks its kernels once, on first use, from the CPU's features: AVX-512 (with
 * AVX512-BF16 where it helps), else AVX2 with F16C and FMA, else portable scalar code. The
 * environment variable LOOM_CPU=scalar|avx2|avx512 caps the level (tests use it to run each
 * level); a level the CPU lacks falls back to the best one it has. Any other value is ignored
 * (the `loom` command refuses it). */
#ifndef LOOM_CPU_H
#define LOOM_CPU_H

#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum loom_cpu_level {
  LOOM_CPU_SCALAR = 0,
  LOOM_CPU_AVX2 = 1,   /* AVX2 + FMA + F16C */
  LOOM_CPU_AVX512 = 2, /* AVX-512 F/BW/VL (+ BF16 if present) */
  LOOM_CPU_LEVEL_COUNT = 3
} loom_cpu_level;

/* The level the kernels in use were chosen for. */
loom_cpu_level loom_cpu_level_active(void);
/* The best level this CPU supports. */
loom_cpu_level loom_cpu_level_best(void);
/* True if this CPU can run `level`. */
bool loom_cpu_supports(loom_cpu_level level);
/* True if this CPU has AVX512-BF16 (used by the avx512 level where exact). */
bool loom_cpu_has_avx512bf16(void);
/* "scalar", "avx2", "avx512". */
const char *loom_cpu_level_name(loom_cpu_level level);
/* Switch the kernels to `level`. LOOM_ENOSYS if the CPU lacks it, LOOM_EINVAL if out of range.
 * Not safe while other threads are running kernels: call it between phases (tests, start-up). */
int loom_set_cpu_level(loom_cpu_level level);

#ifdef __cplusplus
}
#endif
#endif
