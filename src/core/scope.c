/* scope.c: loom_scope (loom/scope.h), a per-step owner of tensors: the variables it tracks and
 * the references it adopted, released together. */
#include "core/core_int.h"
#include "loom/scope.h"

#include <stdarg.h>
#include <string.h>

struct loom_scope {
  loom_tensor ***vars; /* tracked variables (the caller's) */
  size_t nvars, capvars;
  loom_tensor **adopted; /* references the scope owns */
  size_t nadopted, capadopted;
};

int loom_scope_create(loom_scope **out) {
  if (!out) return loom__fail(LOOM_EINVAL, "loom_scope_create: out is NULL");
  *out = loom__calloc(LOOM_POOL_META, 1, sizeof **out);
  return *out ? LOOM_OK : loom__fail(LOOM_ENOMEM, "loom_scope_create: out of memory");
}

/* Make room for one more pointer in a list of `elem`-byte entries. */
static int grow(void **list, size_t n, size_t *cap, size_t elem) {
  if (n < *cap) return LOOM_OK;
  size_t ncap = *cap ? *cap * 2 : 16;
  void *p = loom__malloc(LOOM_POOL_META, ncap * elem);
  if (!p) return loom__fail(LOOM_ENOMEM, "loom_scope: out of memory growing to %zu entries", ncap);
  if (n) memcpy(p, *list, n * elem);
  loom__free(*list);
  *list = p;
  *cap = ncap;
  return LOOM_OK;
}

int loom_scope_track_list(loom_scope *s, ...) {
  if (!s) return loom__fail(LOOM_EINVAL, "loom_scope_track: scope is NULL");
  va_list ap;
  va_start(ap, s);
  int rc = LOOM_OK;
  for (loom_tensor **v; (v = va_arg(ap, loom_tensor **)) != NULL;) {
    bool seen = false;
    for (size_t i = 0; i < s->nvars && !seen; i++) seen = s->vars[i] == v;
    if (seen) continue;
    rc = grow((void **)&s->vars, s->nvars, &s->capvars, sizeof *s->vars);
    if (rc) break;
    s->vars[s->nvars++] = v;
  }
  va_end(ap);
  return rc;
}

int loom_scope_adopt(loom_scope *s, loom_tensor *t) {
  if (!t) return LOOM_OK;
  if (!s) {
    loom_tensor_free(t);
    return loom__fail(LOOM_EINVAL, "loom_scope_adopt: scope is NULL (the tensor was freed)");
  }
  int rc = grow((void **)&s->adopted, s->nadopted, &s->capadopted, sizeof *s->adopted);
  if (rc) {
    loom_tensor_free(t);
    return rc;
  }
  s->adopted[s->nadopted++] = t;
  return LOOM_OK;
}

void loom_scope_release(loom_scope *s) {
  if (!s) return;
  for (size_t i = s->nadopted; i-- > 0;) loom_tensor_free(s->adopted[i]);
  s->nadopted = 0;
  for (size_t i = s->nvars; i-- > 0;) {
    loom_tensor_free(*s->vars[i]);
    *s->vars[i] = NULL;
  }
}

size_t loom_scope_count(const loom_scope *s) {
  if (!s) return 0;
  size_t n = s->nadopted;
  for (size_t i = 0; i < s->nvars; i++) n += *s->vars[i] != NULL;
  return n;
}

void loom_scope_free(loom_scope *s) {
  if (!s) return;
  loom_scope_release(s);
  loom__free(s->vars);
  loom__free(s->adopted);
  loom__free(s);
}
