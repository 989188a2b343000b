/* peers.c: do all ranks hold the same thing? Values are compared by one all-reduce of the
 * values and their negations under MAX (a rank that differs shows up as max != -min); tensors
 * by their dtype and FNV-1a hashes of their shape and name. */
#include "dist/peers.h"
#include "core/core_int.h"
#include "core/tensor_int.h"

#include <stdio.h>
#include <string.h>

int loom__pg_agree_i64(loom_pg *pg, const int64_t *v, size_t n, size_t *first) {
  *first = n;
  int64_t *w = loom__calloc(LOOM_POOL_META, 2 * (n ? n : 1), sizeof *w);
  if (!w) return loom__fail(LOOM_ENOMEM, "out of memory comparing ranks");
  for (size_t i = 0; i < n; i++) w[i] = v[i], w[n + i] = -v[i];
  int rc = loom_pg_allreduce(pg, w, w, 2 * n, LOOM_I64, LOOM_MAX, NULL);
  for (size_t i = 0; i < n && !rc; i++)
    if (w[i] != -w[n + i]) {
      *first = i;
      break;
    }
  loom__free(w);
  return rc;
}

static const char *param_name(const char *const *names, size_t i, char *buf, size_t cap) {
  if (names && names[i]) snprintf(buf, cap, "%zu (%s)", i, names[i]);
  else snprintf(buf, cap, "%zu", i);
  return buf;
}

int loom__pg_check_same_tensors(loom_pg *pg, loom_tensor *const *ts, const char *const *names,
                                size_t n, const char *who, uint64_t *collectives) {
  if (collectives) *collectives = 0;
  int64_t count[2] = {(int64_t)n, -(int64_t)n};
  int rc = loom_pg_allreduce(pg, count, count, 2, LOOM_I64, LOOM_MAX, NULL);
  if (rc) return rc;
  if (collectives) *collectives = 1;
  if (count[0] != -count[1])
    return loom__fail(LOOM_EMISUSE,
                      "%s: ranks disagree on the parameter count (this rank %zu, others from "
                      "%lld to %lld)", who, n, (long long)-count[1], (long long)count[0]);
  int64_t *v = loom__calloc(LOOM_POOL_META, 3 * (n ? n : 1), sizeof *v);
  if (!v) return loom__fail(LOOM_ENOMEM, "%s: out of memory checking parameters", who);
  for (size_t i = 0; i < n; i++) {
    const loom_tensor *p = ts[i];
    int nd = loom_tensor_ndim(p);
    uint64_t shape =
        loom__fnv1a(LOOM__FNV1A_BASIS, loom_tensor_shape(p), (size_t)nd * sizeof(int64_t));
    shape = loom__fnv1a(shape, &nd, sizeof nd);
    uint64_t name =
        names && names[i] ? loom__fnv1a(LOOM__FNV1A_BASIS, names[i], strlen(names[i])) : 0;
    v[3 * i] = loom_tensor_dtype(p); /* per parameter: dtype, shape, name */
    v[3 * i + 1] = (int64_t)(shape >> 1);
    v[3 * i + 2] = (int64_t)(name >> 1);
  }
  size_t first = 3 * n;
  rc = loom__pg_agree_i64(pg, v, 3 * n, &first);
  if (!rc && collectives) *collectives = 2;
  char nm[160], sh[160];
  if (!rc && first < 3 * n) {
    size_t bad = first / 3;
    const loom_tensor *p = ts[bad];
    if (first % 3 == 0)
      rc = loom__fail(LOOM_EDTYPE, "%s: ranks disagree on the dtype of parameter %s (%s here)",
                      who, param_name(names, bad, nm, sizeof nm),
                      loom_dtype_name(loom_tensor_dtype(p)));
    else if (first % 3 == 1)
      rc = loom__fail(LOOM_ESHAPE, "%s: ranks disagree on the shape of parameter %s (%s here)",
                      who, param_name(names, bad, nm, sizeof nm),
                      loom__shape_str(loom_tensor_ndim(p), loom_tensor_shape(p), sh, sizeof sh));
    else
      rc = loom__fail(LOOM_EMISUSE,
                      "%s: ranks disagree on the order of parameters: position %s differs", who,
                      param_name(names, bad, nm, sizeof nm));
  }
  loom__free(v);
  return rc;
}
