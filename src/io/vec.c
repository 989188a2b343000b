/* vec.c: growable arrays in the host pool, for the io layer's parsers and writers. */
#include "io/io_int.h"

#include <string.h>

static int grow(loom__vec *v, size_t need, const char *who) {
  if (need <= v->cap) return LOOM_OK;
  size_t cap = v->cap ? v->cap : 64;
  while (cap < need) {
    if (cap > SIZE_MAX / 2 / v->elem) return loom__fail(LOOM_EOVERFLOW, "%s: array too large", who);
    cap *= 2;
  }
  void *p = loom__malloc(LOOM_POOL_META, cap * v->elem);
  if (!p) return loom__fail(LOOM_ENOMEM, "%s: out of memory growing an array to %zu", who, cap);
  if (v->len) memcpy(p, v->p, v->len * v->elem);
  loom__free(v->p);
  v->p = p;
  v->cap = cap;
  return LOOM_OK;
}

int loom__vec_push(loom__vec *v, const void *x, const char *who) {
  int rc = grow(v, v->len + 1, who);
  if (rc) return rc;
  memcpy((char *)v->p + v->len * v->elem, x, v->elem);
  v->len++;
  return LOOM_OK;
}

int loom__vec_append(loom__vec *v, const void *x, size_t n, const char *who) {
  if (n > SIZE_MAX - v->len) return loom__fail(LOOM_EOVERFLOW, "%s: array too large", who);
  int rc = grow(v, v->len + n, who);
  if (rc) return rc;
  if (n) memcpy((char *)v->p + v->len, x, n);
  v->len += n;
  return LOOM_OK;
}

void loom__vec_free(loom__vec *v) {
  loom__free(v->p);
  v->p = NULL;
  v->len = v->cap = 0;
}
