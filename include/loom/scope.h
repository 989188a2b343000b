/* loom/scope.h: a per-step owner of tensors, so a training loop frees its step's tensors in
 * one call.
 *
 * As a ggml context owns the tensors made in it and frees them all at once, a scope owns the
 * tensors handed to it and releases them all in loom_scope_release. A tensor is handed over
 * explicitly, so what owns what stays readable in the code (and every other header's rule
 * stands: a call that returns a tensor returns a new reference its caller owns):
 *   - loom_scope_track(s, &x, &y, ...): the scope owns whatever reference these variables hold
 *     when it is released; release frees each non-NULL one and sets the variable to NULL.
 *     Track a step's variables once, before the loop; each call that fills one then hands its
 *     new reference to the scope:
 *
 *       loom_tensor *x = NULL, *y = NULL, *logits = NULL, *loss = NULL;
 *       LOOM_CHECK(loom_scope_create(&step_scope));
 *       LOOM_CHECK(loom_scope_track(step_scope, &x, &y, &logits, &loss));
 *       for (each batch) {
 *         ... calls that fill x, y, logits, loss ...
 *         loom_scope_release(step_scope);         (frees the four, sets them to NULL)
 *       }
 *       loom_scope_free(step_scope);               (after a failure too: it releases first)
 *
 *   - loom_scope_adopt(s, t): the scope takes over the reference t (a tensor with no variable
 *     of its own, such as one in an array).
 * The scope releases one reference per tensor: one retained elsewhere (loom_tensor_retain, the
 * autograd tape, an optimizer) lives on until its other owners release it. Do not free a
 * tracked variable's tensor yourself without setting the variable to NULL (it would be freed
 * twice); an adopted tensor is the scope's alone.
 *
 * A scope lives in the meta pool; release frees the tensors' memory to their pools (the
 * allocation counters of loom/alloc.h show it). Not thread-safe: one thread uses a scope at a
 * time. Errors: LOOM_EINVAL for a NULL scope or variable, LOOM_ENOMEM (the list could not
 * grow: an adopted tensor is then released at once, so nothing leaks). */
#ifndef LOOM_SCOPE_H
#define LOOM_SCOPE_H

#include "loom/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct loom_scope loom_scope;

int loom_scope_create(loom_scope **out);
/* Release, then free the scope. NULL is a no-op. */
void loom_scope_free(loom_scope *s);

/* Track each listed variable (loom_tensor **), up to the NULL that the macro appends. A
 * variable tracked twice is released once. */
int loom_scope_track_list(loom_scope *s, ...);
#define loom_scope_track(s, ...) loom_scope_track_list((s), __VA_ARGS__, (loom_tensor **)0)

/* The scope takes over the reference t (NULL is a no-op). On LOOM_ENOMEM t is freed at once. */
int loom_scope_adopt(loom_scope *s, loom_tensor *t);

/* Free every adopted tensor and every tracked variable's tensor (setting the variable to
 * NULL). The variables stay tracked for the next step. NULL is a no-op. */
void loom_scope_release(loom_scope *s);

/* How many tensors a release would free now (tests and diagnostics). */
size_t loom_scope_count(const loom_scope *s);

#ifdef __cplusplus
}
#endif
#endif
