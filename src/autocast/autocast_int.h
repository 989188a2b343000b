/* autocast_int.h: what the autocast layer shares with the ops layer (private to loom): the
 * hook that tells the ops layer an outermost region has ended on this thread, so it can drop
 * the casts it cached for that region at once rather than at the next region; and the
 * registry handle check the region code uses. */
#ifndef LOOM_AUTOCAST_INT_H
#define LOOM_AUTOCAST_INT_H

#include "loom/autocast.h"

#include <stdint.h>

/* Called on the exiting thread, after its outermost region (generation `gen`) has ended.
 * Install it once before threads start (a relaxed atomic pointer); NULL uninstalls. */
typedef void (*loom__autocast_exit_fn)(uint64_t gen);
void loom__autocast_set_exit_hook(loom__autocast_exit_fn fn);

/* LOOM_EINVAL (NULL) or LOOM_EMISUSE (freed) with a message naming `who`; LOOM_OK if live. */
int loom__amp_registry_check(const loom_amp_registry *reg, const char *who);

#endif
