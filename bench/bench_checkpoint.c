/* bench_checkpoint.c: activation checkpointing (loom_gpt_set_checkpoint: every block
 * recomputed in backward) on a 12-layer GPT of small width (vocab 256, context 256, 4 heads,
 * dim 128, batch 8), f32 and bf16 autocast: a training step (zero_grad, forward, loss, backward,
 * AdamW) with and without it, the two models' steps interleaved. For each: the median wall and
 * process-CPU time (1 thread: the CPU time leaves out what other processes took of the core)
 * of RUNS steps after WARM, and the
 * compute pool's peak during a step above what was allocated before it (parameters, gradients
 * and AdamW's state are allocated before: the rest is the step's activations, their gradients
 * and workspace), the "activation peak". Before timing, the gradients of one step are
 * compared bit for bit. Lines:
 *   ckpt <off|on> <f32|bf16> layers=12 runs ms/step ms-cpu/step peak_MiB
 *   ckpt_ratio <f32|bf16> peak_cut=<%> time=<x> cpu_time=<x>
 * Usage: bench_checkpoint [threads] [layers] (loom_set_num_threads, default 1; default 12). */
#include "bench_util.h"

#include <string.h>

#define RUNS 7
#define WARM 1
enum { BATCH = 8, CTX = 256, VOCAB = 256, HEADS = 4, DIM = 128 };

typedef struct model {
  loom_module *m;
  loom_optim *opt;
  loom_tensor *x, *y; /* one batch of tokens, i64 [BATCH, CTX] */
} model;

static void make(model *md, int64_t layers, bool ckpt) {
  loom_gpt_cfg c = {.vocab = VOCAB, .context = CTX, .layers = layers, .heads = HEADS,
                    .dim = DIM};
  BENCH_CHECK(loom_nn_gpt_create(&c, 1, &md->m));
  BENCH_CHECK(loom_gpt_set_checkpoint(md->m, ckpt));
  loom_tensor *values = NULL, *grads = NULL;
  size_t numel = 0;
  BENCH_CHECK(loom_module_arena(md->m, LOOM_F32, &values, &grads, &numel));
  loom_param_seg seg = {"all", loom_tensor_data(values), loom_tensor_data(grads), numel, 0};
  loom_adam_cfg ac = loom_adamw_cfg_default();
  BENCH_CHECK(loom_optim_create_adamw(&seg, 1, &ac, &md->opt));
  int64_t shape[2] = {BATCH, CTX};
  BENCH_CHECK(loom_tensor_empty(LOOM_I64, 2, shape, &md->x));
  BENCH_CHECK(loom_tensor_empty(LOOM_I64, 2, shape, &md->y));
  int64_t *x = loom_tensor_data(md->x), *y = loom_tensor_data(md->y);
  srand(5);
  for (int i = 0; i < BATCH * CTX; i++) x[i] = rand() % VOCAB, y[i] = rand() % VOCAB;
}

static void drop(model *md) {
  loom_optim_free(md->opt);
  loom_module_free(md->m);
  loom_tensor_free(md->x);
  loom_tensor_free(md->y);
}

/* One step; with optim false, no AdamW (the gradients stay to be compared). */
static void step(model *md, loom_autocast_mode amp, bool optim) {
  loom_tensor *logits = NULL, *loss = NULL;
  loom_autocast_token tok;
  BENCH_CHECK(loom_module_zero_grad(md->m));
  BENCH_CHECK(loom_autocast_enter(amp, NULL, &tok));
  BENCH_CHECK(loom_module_forward(md->m, md->x, &logits));
  BENCH_CHECK(loom_gpt_loss(logits, md->y, &loss));
  BENCH_CHECK(loom_autocast_exit(&tok));
  loom_tensor_free(logits);
  BENCH_CHECK(loom_backward(loss, NULL, false));
  loom_tensor_free(loss);
  if (optim) BENCH_CHECK(loom_optim_step(md->opt));
}

static const float *grads_of(model *md, size_t *n) {
  loom_tensor *g = NULL;
  BENCH_CHECK(loom_module_arena(md->m, LOOM_F32, NULL, &g, n));
  return loom_tensor_data(g);
}

/* The two runs' gradients of one step have the same bits. */
static void validate(int64_t layers, loom_autocast_mode amp) {
  model a = {0}, b = {0};
  make(&a, layers, false);
  make(&b, layers, true);
  step(&a, amp, false);
  step(&b, amp, false);
  size_t na = 0, nb = 0;
  const float *ga = grads_of(&a, &na), *gb = grads_of(&b, &nb);
  if (na != nb || memcmp(ga, gb, na * sizeof *ga)) {
    fprintf(stderr, "bench_checkpoint: gradients differ with checkpointing (%s)\n",
            loom_autocast_mode_name(amp));
    exit(1);
  }
  drop(&a);
  drop(&b);
}

/* The step's compute-pool peak above what was allocated before it, in MiB (deterministic). */
static double step_peak(model *md, loom_autocast_mode amp) {
  loom_pool_stats st;
  BENCH_CHECK(loom_mem_stats(LOOM_POOL_COMPUTE, &st));
  size_t base = st.current_bytes;
  loom_mem_reset_peak(LOOM_POOL_COMPUTE);
  step(md, amp, true);
  BENCH_CHECK(loom_mem_stats(LOOM_POOL_COMPUTE, &st));
  return (double)(st.peak_bytes - base) / (1 << 20);
}

/* Both models built, their steps interleaved (off, on, off, on, ...) so that load from other
 * processes falls on both alike: median wall and process-CPU ms a step, and each step's peak. */
static void measure(int64_t layers, loom_autocast_mode amp, double ms[2], double cpu[2],
                    double mib[2]) {
  model md[2] = {{0}, {0}};
  double t[2][RUNS], c[2][RUNS];
  for (int k = 0; k < 2; k++) {
    make(&md[k], layers, k == 1);
    for (int i = 0; i < WARM; i++) step(&md[k], amp, true);
    mib[k] = step_peak(&md[k], amp);
  }
  for (int i = 0; i < RUNS; i++)
    for (int k = 0; k < 2; k++) {
      double t0 = bench_now(), c0 = bench_process_cpu_now();
      step(&md[k], amp, true);
      c[k][i] = (bench_process_cpu_now() - c0) * 1e3;
      t[k][i] = (bench_now() - t0) * 1e3;
    }
  for (int k = 0; k < 2; k++) {
    ms[k] = bench_median(t[k], RUNS);
    cpu[k] = bench_median(c[k], RUNS);
    drop(&md[k]);
  }
}

int main(int argc, char **argv) {
  int threads = bench_threads(argc, argv);
  int64_t layers = argc > 2 ? atoi(argv[2]) : 12;
  if (layers < 1) layers = 12;
  printf("# bench_checkpoint: GPT layers=%lld heads=%d dim=%d context=%d vocab=%d batch=%d, "
         "%d thread(s), median of %d steps\n",
         (long long)layers, HEADS, DIM, CTX, VOCAB, BATCH, threads, RUNS);
  loom_autocast_mode modes[2] = {LOOM_AUTOCAST_OFF, LOOM_AUTOCAST_BF16};
  for (int k = 0; k < 2; k++) {
    const char *name = k ? "bf16" : "f32";
    validate(layers, modes[k]);
    double ms[2], cpu[2], mib[2];
    measure(layers, modes[k], ms, cpu, mib);
    for (int ck = 0; ck < 2; ck++)
      printf("ckpt %s %s layers=%lld runs=%d %.1f ms/step %.1f ms-cpu/step peak %.1f MiB\n",
             ck ? "on " : "off", name, (long long)layers, RUNS, ms[ck], cpu[ck], mib[ck]);
    printf("ckpt_ratio %s peak_cut=%.1f%% time=%.3fx cpu_time=%.3fx\n", name,
           100.0 * (1 - mib[1] / mib[0]), ms[1] / ms[0], cpu[1] / cpu[0]);
    fflush(stdout);
  }
  return 0;
}
