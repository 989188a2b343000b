/* bench_bf16_layout.c: what keeping a bf16 weight in oneDNN's own blocked layout would gain
 * (issue 27, item 2). loom's GEMM passes B to oneDNN in plain (strided) layout, and oneDNN 2.6's
 * AMX matmul then repacks it on every call; with B's layout left to oneDNN (format_tag any) and
 * B reordered into it once, a call skips that repacking, but the reorder itself is a pass over
 * B. This times, for one matmul shape, the three interleaved in each round on oneDNN directly
 * (the same calls loom's gemm_dnnl.c makes, 1 thread pinned, thread CPU time, medians):
 *   plain    - C = A B, B plain (what loom runs today);
 *   reorder  - B plain -> blocked (what a weight cache would pay once per weight update);
 *   blocked  - C = A B with B already blocked;
 * and says whether the blocked product equals the plain one bit for bit, and if not, the
 * largest difference relative to the largest |C| (summation order changes with the layout).
 * "uses per update to break even" = reorder / (plain - blocked): a weight must be reused that
 * many times between writes for a cache of reordered weights to pay.
 * Usage: bench_bf16_layout [M [N [K [ROUNDS [t]]]]], default 1024 1024 1024 15; a fifth
 * argument `t` stores B transposed ([N, K], as loom_linear's weight is in the forward). Prints "skipped"
 * and exits 0 where oneDNN has no bf16 matmul (AVX2-only CPUs, ONEDNN_MAX_CPU_ISA=AVX2). */
#define _GNU_SOURCE
#include "bench_util.h"

#include <dnnl.h>
#include <math.h>
#include <sched.h>
#include <stdint.h>

#define DN(call)                                                                                   \
  do {                                                                                             \
    dnnl_status_t s_ = (call);                                                                     \
    if (s_ != dnnl_success) {                                                                      \
      fprintf(stderr, "bench_bf16_layout: %s failed: status %d\n", #call, (int)s_);                \
      exit(1);                                                                                     \
    }                                                                                              \
  } while (0)

static dnnl_primitive_t matmul(dnnl_engine_t eng, const dnnl_memory_desc_t *a,
                               const dnnl_memory_desc_t *b, const dnnl_memory_desc_t *c,
                               dnnl_memory_desc_t *b_chosen, const char **impl) {
  dnnl_matmul_desc_t d;
  dnnl_primitive_desc_t pd;
  dnnl_primitive_t p;
  DN(dnnl_matmul_desc_init(&d, a, b, NULL, c));
  dnnl_status_t st = dnnl_primitive_desc_create(&pd, &d, NULL, eng, NULL);
  if (st == dnnl_unimplemented) return NULL; /* no bf16 matmul on this CPU (AVX2 and below) */
  DN(st);
  *b_chosen = *dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
  DN(dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, impl));
  DN(dnnl_primitive_create(&p, pd));
  DN(dnnl_primitive_desc_destroy(pd));
  return p;
}

static double run(dnnl_primitive_t p, dnnl_stream_t st, int n, dnnl_exec_arg_t *args) {
  double t0 = bench_cpu_now();
  DN(dnnl_primitive_execute(p, st, n, args));
  DN(dnnl_stream_wait(st));
  return bench_cpu_now() - t0;
}

int main(int argc, char **argv) {
  int64_t M = argc > 1 ? atoll(argv[1]) : 1024, N = argc > 2 ? atoll(argv[2]) : 1024;
  int64_t K = argc > 3 ? atoll(argv[3]) : 1024;
  int rounds = argc > 4 ? atoi(argv[4]) : 15;
  bool trans = argc > 5 && strcmp(argv[5], "t") == 0;
  if (M < 1 || N < 1 || K < 1 || M > 16384 || N > 16384 || K > 16384 || rounds < 1 ||
      rounds > 1000) {
    fprintf(stderr, "usage: bench_bf16_layout [M [N [K [ROUNDS [t]]]]] (sizes 1..16384, rounds "
                    "1..1000)\n");
    return 2;
  }
  loom_set_num_threads(1);
  int cpu = bench_pin();
  dnnl_engine_t eng;
  dnnl_stream_t st;
  DN(dnnl_engine_create(&eng, dnnl_cpu, 0));
  DN(dnnl_stream_create(&st, eng, dnnl_stream_default_flags));
  dnnl_memory_desc_t a, b, bany, c, b_plain_chosen, b_blk;
  DN(dnnl_memory_desc_init_by_tag(&a, 2, (dnnl_dims_t){M, K}, dnnl_bf16, dnnl_ab));
  DN(dnnl_memory_desc_init_by_tag(&b, 2, (dnnl_dims_t){K, N}, dnnl_bf16, trans ? dnnl_ba : dnnl_ab));
  DN(dnnl_memory_desc_init_by_tag(&bany, 2, (dnnl_dims_t){K, N}, dnnl_bf16,
                                  dnnl_format_tag_any));
  DN(dnnl_memory_desc_init_by_tag(&c, 2, (dnnl_dims_t){M, N}, dnnl_f32, dnnl_ab));
  const char *impl_plain, *impl_blk;
  dnnl_primitive_t mp = matmul(eng, &a, &b, &c, &b_plain_chosen, &impl_plain);
  dnnl_primitive_t mb = matmul(eng, &a, &bany, &c, &b_blk, &impl_blk);
  if (!mp || !mb) {
    printf("bench_bf16_layout: skipped: oneDNN has no bf16 matmul on this CPU (or under its ISA "
           "cap)\n");
    return 0;
  }
  dnnl_primitive_desc_t rpd;
  dnnl_primitive_t ro;
  DN(dnnl_reorder_primitive_desc_create(&rpd, &b, eng, &b_blk, eng, NULL));
  DN(dnnl_primitive_create(&ro, rpd));
  DN(dnnl_primitive_desc_destroy(rpd));

  int64_t shape_a[2] = {M, K}, shape_b[2] = {trans ? N : K, trans ? K : N};
  loom_tensor *ta = bench_rand_tensor(2, shape_a, LOOM_BF16, 1);
  loom_tensor *tb = bench_rand_tensor(2, shape_b, LOOM_BF16, 2);
  float *c1 = malloc((size_t)(M * N) * sizeof *c1), *c2 = malloc((size_t)(M * N) * sizeof *c2);
  if (!c1 || !c2) return 1;
  dnnl_memory_t ma, mbp, mbb, mc1, mc2;
  DN(dnnl_memory_create(&ma, &a, eng, loom_tensor_data(ta)));
  DN(dnnl_memory_create(&mbp, &b, eng, loom_tensor_data(tb)));
  DN(dnnl_memory_create(&mbb, &b_blk, eng, DNNL_MEMORY_ALLOCATE));
  DN(dnnl_memory_create(&mc1, &c, eng, c1));
  DN(dnnl_memory_create(&mc2, &c, eng, c2));
  dnnl_exec_arg_t xp[] = {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mbp}, {DNNL_ARG_DST, mc1}};
  dnnl_exec_arg_t xr[] = {{DNNL_ARG_FROM, mbp}, {DNNL_ARG_TO, mbb}};
  dnnl_exec_arg_t xb[] = {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mbb}, {DNNL_ARG_DST, mc2}};
  run(mp, st, 3, xp), run(ro, st, 2, xr), run(mb, st, 3, xb); /* kernels generated, caches warm */

  static double tp[1000], tr[1000], tbk[1000];
  for (int r = 0; r < rounds; r++) {
    tp[r] = run(mp, st, 3, xp);
    tr[r] = run(ro, st, 2, xr);
    tbk[r] = run(mb, st, 3, xb);
  }
  double flop = 2.0 * (double)M * (double)N * (double)K;
  double p = bench_median(tp, rounds), ro_t = bench_median(tr, rounds);
  double bk = bench_median(tbk, rounds);
  double cmax = 0, dmax = 0;
  for (int64_t i = 0; i < M * N; i++) {
    cmax = fmax(cmax, fabs(c1[i]));
    dmax = fmax(dmax, fabs((double)c1[i] - c2[i]));
  }
  printf("# bf16 matmul %lldx%lldx%lld, B plain%s vs oneDNN's blocked layout, 1 thread (CPU %d), "
         "median of %d interleaved rounds, thread CPU time\n",
         (long long)M, (long long)N, (long long)K, trans ? " (stored transposed)" : "", cpu,
         rounds);
  printf("plain   (%s): %.3f ms  %.1f GFLOP/s\n", impl_plain, p * 1e3, flop / p / 1e9);
  printf("blocked (%s): %.3f ms  %.1f GFLOP/s  (%.2fx plain)\n", impl_blk, bk * 1e3,
         flop / bk / 1e9, p / bk);
  printf("reorder of B into the blocked layout: %.3f ms (%.2f of a plain call)\n", ro_t * 1e3,
         ro_t / p);
  if (p > bk)
    printf("uses per update to break even: %.2f\n", ro_t / (p - bk));
  else
    printf("uses per update to break even: never (blocked is not faster)\n");
  printf("blocked == plain bit for bit: %s (max |diff| / max |C| = %.2e)\n",
         dmax == 0 ? "yes" : "no", cmax > 0 ? dmax / cmax : 0.0);
  free(c1), free(c2);
  loom_tensor_free(ta), loom_tensor_free(tb);
  dnnl_memory_destroy(ma), dnnl_memory_destroy(mbp), dnnl_memory_destroy(mbb);
  dnnl_memory_destroy(mc1), dnnl_memory_destroy(mc2);
  dnnl_primitive_destroy(mp), dnnl_primitive_destroy(mb), dnnl_primitive_destroy(ro);
  dnnl_stream_destroy(st), dnnl_engine_destroy(eng);
  return 0;
}
