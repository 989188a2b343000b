/* bench_mlp.c: one training step (zero grads, forward, cross-entropy, backward) of an MLP
 * 784-1024-1024-10 at batch 256 through loom's public ops and autograd, in f32 and under
 * bf16 autocast (f32 master weights), and the share of the step that is not GEMM.
 *
 * The GEMM time is the time of the step's 8 products (3 forward, 5 backward: the input
 * gradient of the first layer is not needed) run alone through loom_matmul on contiguous
 * operands of the same shapes and dtype; non-GEMM share = 1 - GEMM time / step time.
 * PyTorch's step (torch.nn.Linear x3, ReLU, F.cross_entropy, backward, zero_grad; bf16 under
 * torch.autocast("cpu")) is timed in the same run through /usr/bin/python3 when torch is
 * installed, capped to the same thread count in both its pools (bench_torch_cmd; the line
 * reports the counts it ran with); ratio = PyTorch's step time / loom's. After 20 warm-up steps
 * (the first steps are slower while the allocator settles), step and GEMMs alone are timed
 * interleaved, median of 31 runs each; threads as bench_matmul (loom_set_num_threads, default
 * 1). Each is timed twice (PyTorch's step too): wall clock, and the process's CPU time, which
 * on a shared machine does not count the time other processes held the core (the "cpu"
 * figures; with more than one thread they include OpenMP's spinning workers).
 * Usage: bench_mlp [threads]. */
#include "bench_util.h"

#include <loom/loom.h>

#include <math.h>
#include <stdio.h>

#define BATCH 256
#define RUNS 31
#define WARM 20

static const int64_t dims[4] = {784, 1024, 1024, 10};

typedef struct mlp {
  loom_tensor *w[3], *b[3], *x, *labels;
} mlp;

/* One step; returns the loss. */
static double step(mlp *m, bool bf16) {
  loom_autocast_token tok;
  if (bf16) BENCH_CHECK(loom_autocast_enter(LOOM_AUTOCAST_BF16, NULL, &tok));
  for (int l = 0; l < 3; l++) {
    BENCH_CHECK(loom_tensor_zero_grad(m->w[l]));
    BENCH_CHECK(loom_tensor_zero_grad(m->b[l]));
  }
  loom_tensor *h = loom_tensor_retain(m->x), *loss;
  for (int l = 0; l < 3; l++) {
    loom_tensor *y, *r;
    BENCH_CHECK(loom_linear(h, m->w[l], m->b[l], &y));
    loom_tensor_free(h);
    if (l < 2) {
      BENCH_CHECK(loom_relu(y, &r));
      loom_tensor_free(y);
      h = r;
    } else {
      h = y;
    }
  }
  BENCH_CHECK(loom_cross_entropy(h, m->labels, LOOM_REDUCTION_MEAN, -100, &loss));
  loom_tensor_free(h);
  if (bf16) BENCH_CHECK(loom_autocast_exit(&tok));
  BENCH_CHECK(loom_backward(loss, NULL, false));
  double v;
  BENCH_CHECK(loom_tensor_item(loss, &v));
  loom_tensor_free(loss);
  return v;
}

/* The step's 8 GEMMs alone, as [M,K] x [K,N] products in dtype dt. */
typedef struct gemms {
  loom_tensor *a[8], *b[8];
} gemms;

static void gemms_init(gemms *g, loom_dtype dt) {
  const int64_t B = BATCH, d0 = dims[0], d1 = dims[1], d2 = dims[2], d3 = dims[3];
  const int64_t mnk[8][3] = {
      {B, d1, d0}, {B, d2, d1}, {B, d3, d2}, /* forward: x W1^T, h1 W2^T, h2 W3^T */
      {d3, d2, B}, {B, d2, d3},              /* layer 3: dW3 = g3^T h2, dh2 = g3 W3 */
      {d2, d1, B}, {B, d1, d2},              /* layer 2: dW2 = g2^T h1, dh1 = g2 W2 */
      {d1, d0, B},                           /* layer 1: dW1 = g1^T x */
  };
  for (int i = 0; i < 8; i++) {
    g->a[i] = bench_rand_tensor(2, (int64_t[]){mnk[i][0], mnk[i][2]}, dt, 1.0f);
    g->b[i] = bench_rand_tensor(2, (int64_t[]){mnk[i][2], mnk[i][1]}, dt, 1.0f);
  }
}

static void gemms_run(gemms *g) {
  for (int i = 0; i < 8; i++) {
    loom_tensor *c;
    BENCH_CHECK(loom_matmul(g->a[i], g->b[i], &c));
    loom_tensor_free(c);
  }
}

static void gemms_free(gemms *g) {
  for (int i = 0; i < 8; i++) loom_tensor_free(g->a[i]), loom_tensor_free(g->b[i]);
}

/* PyTorch's median step seconds, wall clock and process CPU time (out[mode][0] and [1], mode 0
 * f32, 1 bf16 autocast), or -1 without torch, and the thread counts it ran with (torch,
 * OpenBLAS). */
static void torch_seconds(int threads, double out[2][2], int tthr[2]) {
  out[0][0] = out[1][0] = out[0][1] = out[1][1] = -1;
  tthr[0] = tthr[1] = -1;
  char py[96], cmd[2048];
  bench_torch_cmd(py, sizeof py, threads);
  snprintf(cmd, sizeof cmd,
           "%s -c \"" BENCH_TORCH_CAP
           "import time\n"
           "import torch.nn.functional as F\n"
           "m=torch.nn.Sequential(torch.nn.Linear(784,1024), torch.nn.ReLU(), "
           "torch.nn.Linear(1024,1024),"
           " torch.nn.ReLU(), torch.nn.Linear(1024,10))\n"
           "x=torch.rand(%d,784); y=torch.randint(0,10,(%d,))\n"
           "for bf in (False, True):\n"
           "  ts=[]; cs=[]\n"
           "  for r in range(%d):\n"
           "    t0=time.perf_counter(); c0=time.process_time(); m.zero_grad()\n"
           "    with torch.autocast('cpu', dtype=torch.bfloat16, enabled=bf):\n"
           "      loss=F.cross_entropy(m(x), y)\n"
           "    loss.backward()\n"
           "    ts.append(time.perf_counter()-t0); cs.append(time.process_time()-c0)\n"
           "  ts=sorted(ts[%d:]); cs=sorted(cs[%d:]); print(ts[len(ts)//2], cs[len(cs)//2])\n"
           "\" 2>/dev/null",
           py, threads, BATCH, BATCH, RUNS + WARM, WARM, WARM);
  FILE *p = popen(cmd, "r");
  if (!p) return;
  char line[256];
  for (int i = 0; i < 2 && fgets(line, sizeof line, p);)
    if (!bench_torch_threads(line, tthr) && sscanf(line, "%lf %lf", &out[i][0], &out[i][1]) == 2)
      i++;
  pclose(p);
}

int main(int argc, char **argv) {
  int threads = bench_threads(argc, argv);

  srand(1);
  mlp m;
  for (int l = 0; l < 3; l++) {
    float bound = 1.0f / sqrtf((float)dims[l]);
    m.w[l] = bench_rand_tensor(2, (int64_t[]){dims[l + 1], dims[l]}, LOOM_F32, bound);
    m.b[l] = bench_rand_tensor(1, (int64_t[]){dims[l + 1]}, LOOM_F32, bound);
    BENCH_CHECK(loom_tensor_set_requires_grad(m.w[l], true));
    BENCH_CHECK(loom_tensor_set_requires_grad(m.b[l], true));
  }
  m.x = bench_rand_tensor(2, (int64_t[]){BATCH, dims[0]}, LOOM_F32, 1.0f);
  BENCH_CHECK(loom_tensor_empty(LOOM_I64, 1, (int64_t[]){BATCH}, &m.labels));
  int64_t *lab = loom_tensor_data(m.labels);
  for (int i = 0; i < BATCH; i++) lab[i] = rand() % 10;

  double torch[2][2];
  int tthr[2];
  torch_seconds(threads, torch, tthr);
  for (int bf = 0; bf < 2; bf++) {
    double loss = 0, t[RUNS], tg[RUNS], c[RUNS], cg[RUNS];
    gemms g;
    gemms_init(&g, bf ? LOOM_BF16 : LOOM_F32);
    for (int r = 0; r < WARM; r++) loss = step(&m, bf), gemms_run(&g); /* primitives, buffers */
    for (int r = 0; r < RUNS; r++) { /* interleaved, so both see the same machine load */
      double t0 = bench_now(), c0 = bench_process_cpu_now();
      step(&m, bf);
      double t1 = bench_now(), c1 = bench_process_cpu_now();
      gemms_run(&g);
      t[r] = t1 - t0, tg[r] = bench_now() - t1;
      c[r] = c1 - c0, cg[r] = bench_process_cpu_now() - c1;
    }
    gemms_free(&g);
    double s = bench_median(t, RUNS), gs = bench_median(tg, RUNS);
    double cs = bench_median(c, RUNS), cgs = bench_median(cg, RUNS);
    printf(
        "mlp %s 784-1024-1024-10 batch %d threads %d runs %d loss %.4f step %.2f ms gemm %.2f ms "
        "non-gemm %.1f%% (cpu: step %.2f ms gemm %.2f ms non-gemm %.1f%%)",
        bf ? "bf16-autocast" : "f32", BATCH, threads, RUNS, loss, s * 1e3, gs * 1e3,
        100.0 * (1.0 - gs / s), cs * 1e3, cgs * 1e3, 100.0 * (1.0 - cgs / cs));
    if (torch[bf][0] > 0)
      printf(" torch step %.2f ms ratio %.2f (cpu: step %.2f ms ratio %.2f; torch threads %d "
             "openblas %d)\n",
             torch[bf][0] * 1e3, torch[bf][0] / s, torch[bf][1] * 1e3, torch[bf][1] / cs, tthr[0],
             tthr[1]);
    else
      printf(" torch n/a\n");
    fflush(stdout);
  }
  for (int l = 0; l < 3; l++) loom_tensor_free(m.w[l]), loom_tensor_free(m.b[l]);
  loom_tensor_free(m.x);
  loom_tensor_free(m.labels);
  return 0;
}
