/* autocast.c: the thread's autocast region (AutoCast): mode and registry in force, nesting
 * with saved-state tokens, the outermost region's generation (what keys the ops layer's cast
 * cache) and the hook that ends that cache; and the dispatch lookup with the thread's state.
 * Part of the autocast layer: includes only core. */
#include "autocast/autocast_int.h"
#include "core/core_int.h"

#include <stdatomic.h>

typedef struct region_state {
  loom_autocast_mode mode;
  const loom_amp_registry *registry;
  int depth;
  uint64_t generation;
} region_state;

static _Thread_local region_state tls; /* zero: off, outside every region */
static _Atomic uint64_t next_generation = 1;
static _Atomic(loom__autocast_exit_fn) exit_hook = NULL;

void loom__autocast_set_exit_hook(loom__autocast_exit_fn fn) {
  atomic_store_explicit(&exit_hook, fn, memory_order_relaxed);
}

int loom_autocast_enter(loom_autocast_mode mode, const loom_amp_registry *reg,
                        loom_autocast_token *tok) {
  static const char *who = "loom_autocast_enter";
  if (!tok) return loom__fail(LOOM_EINVAL, "%s: token is NULL", who);
  if ((unsigned)mode >= LOOM_AUTOCAST_MODE_COUNT)
    return loom__fail(LOOM_EINVAL, "%s: mode %d is not an autocast mode (off, f16, bf16)", who,
                      (int)mode);
  if (reg) {
    int rc = loom__amp_registry_check(reg, who);
    if (rc) return rc;
  } else {
    reg = loom_amp_registry_default(mode);
  }
  if (mode == LOOM_AUTOCAST_OFF) reg = NULL;
  *tok = (loom_autocast_token){tls.depth + 1, tls.mode, tls.registry, &tls};
  if (tls.depth == 0)
    tls.generation = atomic_fetch_add_explicit(&next_generation, 1, memory_order_relaxed);
  tls.depth++;
  tls.mode = mode;
  tls.registry = reg;
  return LOOM_OK;
}

int loom_autocast_exit(loom_autocast_token *tok) {
  static const char *who = "loom_autocast_exit";
  if (!tok) return loom__fail(LOOM_EINVAL, "%s: token is NULL", who);
  if (tok->owner != &tls)
    return loom__fail(LOOM_EMISUSE, "%s: the token was not filled by loom_autocast_enter on "
                      "this thread", who);
  if (tok->depth != tls.depth)
    return loom__fail(LOOM_EMISUSE, "%s: regions must exit innermost first (token of depth %d, "
                      "current depth %d)", who, tok->depth, tls.depth);
  tls.mode = tok->prev_mode;
  tls.registry = tok->prev_registry;
  tls.depth--;
  tok->owner = NULL; /* a second exit with this token is refused */
  if (tls.depth == 0) {
    uint64_t gen = tls.generation;
    tls.generation = 0;
    loom__autocast_exit_fn fn = atomic_load_explicit(&exit_hook, memory_order_relaxed);
    if (fn) fn(gen);
  }
  return LOOM_OK;
}

loom_autocast_mode loom_autocast_get_mode(void) { return tls.mode; }
bool loom_autocast_enabled(void) { return tls.mode != LOOM_AUTOCAST_OFF; }
const loom_amp_registry *loom_autocast_get_registry(void) { return tls.registry; }
int loom_autocast_depth(void) { return tls.depth; }
uint64_t loom_autocast_generation(void) { return tls.generation; }

bool loom_autocast_dtype_for(loom_amp_op op, const loom_dtype *in, size_t n, loom_dtype *out) {
  if (tls.mode == LOOM_AUTOCAST_OFF) return false;
  return loom_amp_registry_dtype_for(tls.registry, tls.mode, op, in, n, out);
}
