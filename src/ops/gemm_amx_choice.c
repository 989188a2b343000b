/* gemm_amx_choice.c: the parts of loom's AMX bf16 GEMM that run on every CPU: whether the CPU
 * and the process may run it, the choice of it over oneDNN per call (the rule is described in
 * gemm_amx.c's header comment, beside the kernel it chooses), and loom__gemm_bf16_amx's checks.
 * They live apart from gemm_amx.c because that file is compiled for AVX-512 and AMX: there the
 * compiler may use those instructions anywhere in a function, before any check (an ASan build
 * poisons the stack frame with AVX-512 stores in the prologue: SIGILL on a Zen 3), so nothing
 * there may run before loom__gemm_amx_available has said yes. */
#include "ops/gemm_int.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* ---- the choice ---------------------------------------------------------------------- */

/* The CPU, the kernel's tile-state permission and the level: loom__cpu_amx_bf16 (dispatch.c),
 * the one place that asks. */
bool loom__gemm_amx_available(void) { return loom__cpu_amx_bf16(); }

static _Atomic int mode_set = -1; /* loom__gemm_amx_mode; -1: from the environment (read once) */

void loom__gemm_amx_set_mode(loom__gemm_amx_mode m) { atomic_store(&mode_set, (int)m); }

static loom__gemm_amx_mode mode(void) {
  int m = atomic_load(&mode_set);
  if (m < 0) {
    const char *e = getenv("LOOM_GEMM_BF16");
    int unset = -1;
    m = e && !strcmp(e, "onednn") ? LOOM__GEMM_AMX_NEVER
        : e && !strcmp(e, "amx") ? LOOM__GEMM_AMX_ALWAYS
                                  : LOOM__GEMM_AMX_AUTO;
    if (!atomic_compare_exchange_strong(&mode_set, &unset, m)) m = unset;
  }
  return (loom__gemm_amx_mode)m;
}

bool loom__gemm_prefer_amx(const loom__gemm_args *g) {
  loom__gemm_amx_mode m = mode();
  if (m == LOOM__GEMM_AMX_NEVER || g->ab_dtype != LOOM_BF16) return false;
  if (!loom__gemm_amx_available()) return false;
  if (m == LOOM__GEMM_AMX_ALWAYS) return true;
  if (loom__gemm_threads() != 1) return false; /* measured on one thread only */
  return g->M >= 256 && g->N >= 512 && g->K >= 256 && (double)g->M * g->N * g->K >= 0x1p27 &&
         (!g->trans_a || g->K <= 1024);
}

int loom__gemm_bf16_amx(const loom__gemm_args *g) {
  static const char who[] = "loom__gemm_bf16_amx";
  int rc = loom__gemm_check(g, who);
  if (rc != LOOM_OK) return rc;
  if (g->ab_dtype != LOOM_BF16 || (g->c_dtype != LOOM_F32 && g->c_dtype != LOOM_BF16))
    return loom__fail(LOOM_EDTYPE, "%s: takes bf16 A and B and an f32 or bf16 C, got %s x %s -> %s",
                      who, loom_dtype_name(g->ab_dtype), loom_dtype_name(g->ab_dtype),
                      loom_dtype_name(g->c_dtype));
  if (!loom__gemm_amx_available())
    return loom__fail(LOOM_ENOSYS, "%s: this CPU (or its active level, or the kernel) runs no AMX",
                      who);
  return loom__gemm_bf16_amx_run(g);
}
