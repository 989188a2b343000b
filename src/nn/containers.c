/* containers.c: Sequential (children "0", "1", ... run in order) and MLP (Linear layers with an
 * activation between them, in a Sequential named "layers"). */
#include "nn/nn_int.h"

#include <limits.h>

static int seq_forward(loom_module *m, loom_tensor *x, loom_tensor **out) {
  loom_tensor *cur = loom_tensor_retain(x);
  for (int i = 0; i < m->n_children; i++) {
    loom_tensor *next = NULL;
    int rc = loom__module_run(m->children[i], cur, &next);
    loom_tensor_free(cur);
    if (rc) return rc;
    cur = next;
  }
  *out = cur;
  return LOOM_OK;
}

int loom__sequential_bare(loom_module **children, size_t n, loom_module **out) {
  return loom__module_compose("Sequential", seq_forward, children, n, NULL, out);
}

int loom_nn_sequential_create(loom_module **children, size_t n, loom_module **out) {
  static const char *who = "loom_nn_sequential_create";
  int rc = LOOM_OK;
  if (out) *out = NULL;
  bool ok = out && n >= 1 && n <= INT_MAX && children;
  for (size_t i = 0; ok && i < n; i++) ok = children[i] && !children[i]->parent;
  if (!ok) {
    for (size_t i = 0; children && i < n; i++)
      if (children[i] && !children[i]->parent) loom_module_free(children[i]);
    return loom__fail(LOOM_EINVAL,
                      "%s: needs out and n >= 1 children (at most INT_MAX), each non-NULL and not already in "
                      "another module",
                      who);
  }
  loom_module *m = NULL;
  if ((rc = loom__sequential_bare(children, n, &m))) return rc;
  if ((rc = loom__module_pack(m))) {
    loom_module_free(m);
    return rc;
  }
  *out = m;
  return LOOM_OK;
}

static int mlp_forward(loom_module *m, loom_tensor *x, loom_tensor **out) {
  return seq_forward(m, x, out);
}

int loom_nn_mlp_create(const int64_t *sizes, size_t n, loom_activation act, loom_dtype dt,
                       uint64_t seed, loom_module **out) {
  static const char *who = "loom_nn_mlp_create";
  if (out) *out = NULL;
  if (!out || !sizes || n < 2)
    return loom__fail(LOOM_EINVAL, "%s: needs out and at least 2 sizes", who);
  if (n > INT_MAX / 2) return loom__fail(LOOM_EINVAL, "%s: %zu sizes is too many", who, n);
  size_t nl = 2 * (n - 1) - 1, k = 0;
  int rc = LOOM_OK;
  loom_module **layers = loom__calloc(LOOM_POOL_COMPUTE, nl, sizeof *layers);
  if (!layers) return loom__fail(LOOM_ENOMEM, "%s: out of memory", who);
  loom_module *seq = NULL, *m = NULL;
  for (size_t i = 0; i < n - 1; i++) {
    LOOM_TRY(loom_nn_linear_create(sizes[i], sizes[i + 1], true, dt, seed + (uint64_t)i,
                                   &layers[k++]));
    if (i < n - 2) LOOM_TRY(loom_nn_activation_create(act, &layers[k++]));
  }
  rc = loom_nn_sequential_create(layers, nl, &seq); /* takes the layers, even on failure */
  k = 0;
  if (rc) goto done;
  LOOM_TRY(loom__module_new("MLP", mlp_forward, &m));
  const char *names[] = {"layers"};
  rc = loom__module_adopt(m, &seq, 1, names);
  seq = NULL;
  if (!rc) rc = loom__module_pack(m);
  if (rc) goto done;
  *out = m;
  m = NULL;
done:
  for (size_t i = 0; i < k; i++) loom_module_free(layers[i]);
  loom__free(layers);
  loom_module_free(seq);
  loom_module_free(m);
  return rc;
}
