/* test_cpu_caps.c: oneDNN's ISA cap (ONEDNN_MAX_CPU_ISA / DNNL_MAX_CPU_ISA) read by loom's own
 * AMX code (dispatch.c's loom__onednn_caps_amx): levels without AMX rule it out, AMX levels,
 * "ALL" and no cap leave it on, ONEDNN_ wins over DNNL_; and in this process loom__cpu_amx_bf16
 * is false whenever the environment's cap (or LOOM_CPU) rules AMX out. */
#include "lt.h"
#include "core/core_int.h"

#include <stdlib.h>
#include <string.h>

LT_TEST(amx_off_under_onednn_cap) {
  LT_TRUE(!loom__onednn_caps_amx(NULL, NULL));
  LT_TRUE(!loom__onednn_caps_amx("", NULL));
  LT_TRUE(!loom__onednn_caps_amx("ALL", NULL));
  LT_TRUE(!loom__onednn_caps_amx("all", NULL));
  LT_TRUE(!loom__onednn_caps_amx("AVX512_CORE_AMX", NULL));
  LT_TRUE(!loom__onednn_caps_amx("avx512_core_amx_fp16", NULL));
  LT_TRUE(loom__onednn_caps_amx("AVX512_CORE_BF16", NULL));
  LT_TRUE(loom__onednn_caps_amx("AVX2", NULL));
  LT_TRUE(loom__onednn_caps_amx("avx512_core_fp16", NULL));
  LT_TRUE(loom__onednn_caps_amx(NULL, "AVX512_CORE"));
  LT_TRUE(!loom__onednn_caps_amx(NULL, "AVX512_CORE_AMX"));
  LT_TRUE(loom__onednn_caps_amx("AVX2", "AVX512_CORE_AMX")); /* oneDNN's own name first */
  LT_TRUE(!loom__onednn_caps_amx("ALL", "AVX2"));
  const char *l = getenv("LOOM_CPU");
  if (loom__onednn_caps_amx(getenv("ONEDNN_MAX_CPU_ISA"), getenv("DNNL_MAX_CPU_ISA")) ||
      (l && (!strcmp(l, "avx2") || !strcmp(l, "scalar"))) || !loom_cpu_has_avx512bf16())
    LT_TRUE(!loom__cpu_amx_bf16());
}
