/* dispatch.c: picks the core kernel table once from the CPU's features and LOOM_CPU. The only
 * file (with its SIMD kernels) that knows which instruction sets exist. */
#include <cpuid.h>
#include "core/kernels/kernels.h"

#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static loom__core_kernels tables[LOOM_CPU_LEVEL_COUNT];
static bool supported[LOOM_CPU_LEVEL_COUNT];
static bool has_bf16;
static _Atomic int active = LOOM_CPU_SCALAR;
static pthread_once_t once = PTHREAD_ONCE_INIT;

/* Fill the NULL entries of `t` from scalar. */
static loom__core_kernels merged(const loom__core_kernels *t) {
  loom__core_kernels m = *t;
  const loom__core_kernels *s = &loom__core_kernels_scalar;
  if (!m.cvt_f32_to_bf16) m.cvt_f32_to_bf16 = s->cvt_f32_to_bf16;
  if (!m.cvt_bf16_to_f32) m.cvt_bf16_to_f32 = s->cvt_bf16_to_f32;
  if (!m.cvt_f32_to_f16) m.cvt_f32_to_f16 = s->cvt_f32_to_f16;
  if (!m.cvt_f16_to_f32) m.cvt_f16_to_f32 = s->cvt_f16_to_f32;
  if (!m.crc32c) m.crc32c = s->crc32c;
  return m;
}

/* F16C from CPUID directly: clang's __builtin_cpu_supports does not know "f16c". */
static bool has_f16c(void) {
  unsigned a, b, c, d;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}

static void init(void) {
  __builtin_cpu_init();
  supported[LOOM_CPU_SCALAR] = true;
  supported[LOOM_CPU_AVX2] = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                             has_f16c();
  supported[LOOM_CPU_AVX512] = supported[LOOM_CPU_AVX2] && __builtin_cpu_supports("avx512f") &&
                               __builtin_cpu_supports("avx512bw") &&
                               __builtin_cpu_supports("avx512vl");
  has_bf16 = supported[LOOM_CPU_AVX512] && __builtin_cpu_supports("avx512bf16");
  tables[LOOM_CPU_SCALAR] = merged(&loom__core_kernels_scalar);
  tables[LOOM_CPU_AVX2] = merged(&loom__core_kernels_avx2);
  tables[LOOM_CPU_AVX512] = merged(&loom__core_kernels_avx512);
  if (has_bf16) tables[LOOM_CPU_AVX512].cvt_f32_to_bf16 = loom__cvt_f32_to_bf16_avx512bf16;
  if (__builtin_cpu_supports("sse4.2")) /* x86-64-v2 and up: every CPU of the avx2 level */
    for (int l = LOOM_CPU_AVX2; l < LOOM_CPU_LEVEL_COUNT; l++)
      tables[l].crc32c = loom__crc32c_sse42;

  int level = LOOM_CPU_SCALAR;
  for (int l = LOOM_CPU_LEVEL_COUNT - 1; l >= 0; l--)
    if (supported[l]) {
      level = l;
      break;
    }
  const char *env = getenv("LOOM_CPU");
  if (env) { /* a cap: never above what the CPU has */
    for (int l = 0; l < LOOM_CPU_LEVEL_COUNT; l++)
      if (strcmp(env, loom_cpu_level_name((loom_cpu_level)l)) == 0 && l < level) level = l;
  }
  atomic_store(&active, level);
}

const loom__core_kernels *loom__k(void) {
  pthread_once(&once, init);
  return &tables[atomic_load_explicit(&active, memory_order_relaxed)];
}

loom_cpu_level loom_cpu_level_active(void) {
  pthread_once(&once, init);
  return (loom_cpu_level)atomic_load(&active);
}

loom_cpu_level loom_cpu_level_best(void) {
  pthread_once(&once, init);
  for (int l = LOOM_CPU_LEVEL_COUNT - 1; l > 0; l--)
    if (supported[l]) return (loom_cpu_level)l;
  return LOOM_CPU_SCALAR;
}

bool loom_cpu_supports(loom_cpu_level level) {
  pthread_once(&once, init);
  return (unsigned)level < LOOM_CPU_LEVEL_COUNT && supported[level];
}

loom_cpu_level loom__kernel_level(loom_cpu_level level) {
  return loom_cpu_supports(level) ? level : LOOM_CPU_SCALAR;
}

bool loom_cpu_has_avx512bf16(void) {
  pthread_once(&once, init);
  return has_bf16;
}

const char *loom_cpu_level_name(loom_cpu_level level) {
  static const char *names[LOOM_CPU_LEVEL_COUNT] = {"scalar", "avx2", "avx512"};
  return (unsigned)level < LOOM_CPU_LEVEL_COUNT ? names[level] : "?";
}

int loom_set_cpu_level(loom_cpu_level level) {
  pthread_once(&once, init);
  if ((unsigned)level >= LOOM_CPU_LEVEL_COUNT)
    return loom__fail(LOOM_EINVAL, "loom_set_cpu_level: level %d out of range", (int)level);
  if (!supported[level])
    return loom__fail(LOOM_ENOSYS, "loom_set_cpu_level: this CPU cannot run the %s level",
                      loom_cpu_level_name(level));
  atomic_store(&active, (int)level);
  return LOOM_OK;
}

bool loom__cpu_intel(void) {
  __builtin_cpu_init();
  return __builtin_cpu_is("intel");
}

bool loom__onednn_caps_amx(const char *onednn, const char *dnnl) {
  const char *e = onednn ? onednn : dnnl;
  if (!e || !*e || !strcasecmp(e, "ALL")) return false;
  for (const char *p = e; p[0] && p[1] && p[2]; p++)
    if (!strncasecmp(p, "AMX", 3)) return false;
  return true;
}

/* AVX512-BF16, AMX-TILE and AMX-BF16 from CPUID (leaf 7: EDX bits 24 and 22), and the kernel's
 * leave to use the tile data state (arch_prctl ARCH_REQ_XCOMP_PERM for XTILEDATA, feature 18,
 * process-wide; oneDNN asks the same): asked once, false where either is missing or oneDNN's
 * ISA cap rules AMX out (loom__onednn_caps_amx). The one place that asks: loom's AMX GEMM
 * (ops/gemm_amx.c) and fused attention (ops/attn_amx.c). */
static bool amx_ok;
static pthread_once_t amx_once = PTHREAD_ONCE_INIT;
static void amx_init(void) {
  unsigned a, b, c, d;
  if (loom__onednn_caps_amx(getenv("ONEDNN_MAX_CPU_ISA"), getenv("DNNL_MAX_CPU_ISA"))) return;
  if (!loom_cpu_has_avx512bf16() || !__get_cpuid_count(7, 0, &a, &b, &c, &d) ||
      !(d & (1u << 24)) || !(d & (1u << 22)))
    return;
#ifdef SYS_arch_prctl
  amx_ok = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18) == 0;
#endif
}

bool loom__cpu_amx_bf16(void) {
  pthread_once(&amx_once, amx_init);
  return amx_ok && loom_cpu_level_active() == LOOM_CPU_AVX512;
}
