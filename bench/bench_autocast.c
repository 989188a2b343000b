/* bench_autocast.c: the bookkeeping cost of autocast (dispatch decisions, the cast cache, cast
 * nodes on the tape; not the casts' arithmetic) against autograd time. Tiny graphs (1x1
 * tensors, so arithmetic is negligible) give the cost per op of each piece: forward + backward
 * of linear -> sum with autocast off; with bf16 autocast on and inputs already bf16 (decisions
 * only); with autocast on and f32 inputs (decisions + a cast node per input, the weight's from
 * the cache after the first use in the region). Then the real thing: an MLP 784-1024-1024-10,
 * batch 256, forward + backward under bf16 autocast; its bookkeeping is estimated as (ops x
 * decision cost + casts x cast bookkeeping cost), counted from its graph, over its autograd
 * time. Usage: bench_autocast [iterations (default 20000)]. */
#include "bench_args.h"
#include "bench_util.h"

#include <loom/loom.h>

#include <stdio.h>
#include <stdlib.h>
#include <time.h>


/* forward + backward of sum(linear(x, w, b)) under `mode`, n times; seconds per iteration */
static int tiny(loom_autocast_mode mode, loom_dtype dt, int n, double *out) {
  loom_tensor *x = NULL, *w = NULL, *b = NULL, *y = NULL, *s = NULL;
  int64_t one[2] = {1, 1};
  int rc = loom_tensor_zeros(dt, 2, one, &x);
  if (!rc) rc = loom_tensor_zeros(dt, 2, one, &w);
  if (!rc) rc = loom_tensor_zeros(dt, 1, one, &b);
  if (!rc) rc = loom_tensor_set_requires_grad(w, true);
  if (!rc) rc = loom_tensor_set_requires_grad(b, true);
  loom_autocast_token tok;
  if (!rc) rc = loom_autocast_enter(mode, NULL, &tok); /* one region: the cache lives across */
  double t0 = bench_now();
  for (int i = 0; i < n && !rc; i++) {
    rc = loom_linear(x, w, b, &y);
    if (!rc) rc = loom_sum(y, NULL, 0, false, &s);
    if (!rc) rc = loom_backward(s, NULL, false);
    loom_tensor_free(y), loom_tensor_free(s);
    y = s = NULL;
  }
  *out = (bench_now() - t0) / n;
  if (!rc) rc = loom_autocast_exit(&tok);
  loom_tensor_free(x), loom_tensor_free(w), loom_tensor_free(b);
  return rc;
}

static int mlp_autograd(int runs, double *out) {
  static const int64_t shp[6][2] = {{1024, 784}, {1024, 0}, {1024, 1024}, {1024, 0}, {10, 1024},
                                    {10, 0}};
  loom_tensor *p[6] = {0}, *x = NULL, *y = NULL;
  int rc = 0;
  for (int i = 0; i < 6 && !rc; i++) {
    rc = loom_tensor_zeros(LOOM_F32, shp[i][1] ? 2 : 1, shp[i], &p[i]);
    if (!rc) rc = loom_tensor_fill(p[i], 1e-3);
    if (!rc) rc = loom_tensor_set_requires_grad(p[i], true);
  }
  int64_t yv[256] = {0};
  if (!rc) rc = loom_tensor_zeros(LOOM_F32, 2, (int64_t[]){256, 784}, &x);
  if (!rc) rc = loom_tensor_from_data(LOOM_I64, 1, (int64_t[]){256}, yv, &y);
  double *t = calloc((size_t)runs, sizeof *t);
  for (int r = -1; r < runs && !rc; r++) {
    loom_tensor *h = NULL, *a = NULL, *h2 = NULL, *a2 = NULL, *lg = NULL, *l = NULL;
    loom_autocast_token tok;
    double t0 = bench_now();
    rc = loom_autocast_enter(LOOM_AUTOCAST_BF16, NULL, &tok);
    if (!rc) rc = loom_linear(x, p[0], p[1], &h);
    if (!rc) rc = loom_relu(h, &a);
    if (!rc) rc = loom_linear(a, p[2], p[3], &h2);
    if (!rc) rc = loom_relu(h2, &a2);
    if (!rc) rc = loom_linear(a2, p[4], p[5], &lg);
    if (!rc) rc = loom_cross_entropy(lg, y, LOOM_REDUCTION_MEAN, -100, &l);
    if (!rc) rc = loom_autocast_exit(&tok);
    if (!rc) rc = loom_backward(l, NULL, false);
    if (r >= 0) t[r] = bench_now() - t0;
    loom_tensor_free(h), loom_tensor_free(a), loom_tensor_free(h2), loom_tensor_free(a2);
    loom_tensor_free(lg), loom_tensor_free(l);
  }
  qsort(t, (size_t)runs, sizeof *t, bench_cmp);
  *out = t[runs / 2];
  free(t);
  for (int i = 0; i < 6; i++) loom_tensor_free(p[i]);
  loom_tensor_free(x), loom_tensor_free(y);
  return rc;
}

int bench_autocast_main(int argc, char **argv) {
  static const bench_arg args[] = {
      {"ITERATIONS", "tiny ops timed per figure (default 20000)", NULL, 10, 100000000}, {0}};
  int done = bench_args(BENCH_PROG("autocast"), "The cost of autocast's dispatch on tiny ops and "
                        "on an MLP's autograd step.", args, argc, argv);
  if (done >= 0) return done;
  int n = argc > 1 ? atoi(argv[1]) : 20000;
  double off[3], pre[3], cast[3];
  int rc = 0;
  for (int r = 0; r < 3 && !rc; r++) { /* interleaved, median of 3 */
    rc = tiny(LOOM_AUTOCAST_OFF, LOOM_F32, n, &off[r]);
    if (!rc) rc = tiny(LOOM_AUTOCAST_BF16, LOOM_BF16, n, &pre[r]);
    if (!rc) rc = tiny(LOOM_AUTOCAST_BF16, LOOM_F32, n, &cast[r]);
  }
  double mlp = 0;
  if (!rc) rc = mlp_autograd(7, &mlp);
  if (rc) {
    fprintf(stderr, "bench_autocast: %s\n", loom_last_error());
    return 1;
  }
  qsort(off, 3, sizeof *off, bench_cmp), qsort(pre, 3, sizeof *pre, bench_cmp), qsort(cast, 3, sizeof *cast, bench_cmp);
  /* per iteration: 2 ops dispatched (linear, sum); with f32 inputs 3 casts (x, w, b) */
  double decision = (pre[1] - off[1]) / 2, per_cast = (cast[1] - pre[1]) / 3;
  if (decision < 0) decision = 0;
  /* the MLP step under autocast: 6 ops dispatched, 8 casts (x, 3 weights, 3 biases, logits) */
  double book = 6 * decision + 8 * per_cast;
  printf("autocast bookkeeping, tiny graphs (1x1, %d iterations, median of 3):\n"
         "  linear+sum fwd+bwd: autocast off %.2f us | on, inputs bf16 %.2f us | on, f32 inputs "
         "(3 cast nodes, weight cached) %.2f us\n"
         "  per op: dispatch decision %.3f us; per cast: node + cache %.3f us\n"
         "MLP 784-1024-1024-10, batch 256, bf16 autocast, forward + backward: %.2f ms\n"
         "  bookkeeping estimate (6 decisions + 8 casts' bookkeeping): %.1f us = %.3f%% of "
         "autograd time (target <= 2%%: %s)\n",
         n, off[1] * 1e6, pre[1] * 1e6, cast[1] * 1e6, decision * 1e6, per_cast * 1e6,
         mlp * 1e3, book * 1e6, book / mlp * 100, book / mlp <= 0.02 ? "met" : "NOT met");
  return 0;
}

#ifndef LOOM_TOOL
int main(int argc, char **argv) { return bench_autocast_main(argc, argv); }
#endif
