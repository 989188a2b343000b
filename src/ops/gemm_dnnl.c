/* gemm_dnnl.c: loom__gemm on oneDNN's matmul primitive.
 *
 * f32 goes straight to oneDNN; so does bf16 (bf16 x bf16 with f32 accumulation, C in f32 or
 * bf16) where oneDNN has a bf16 kernel for this CPU (AVX-512: avx512_core, AVX512-BF16's dot
 * products where present) that is faster than f32 (loom__bf16_kernel_fast: AMX, or a CPU
 * other than Intel's), asked once per process. Elsewhere (AVX2-only CPUs, Intel without AMX) bf16 operands
 * are widened to f32 like f16 ones below, which gives the same numbers. Transposes and leading dimensions are memory
 * strides, a batch is a 3-D matmul whose broadcast operand has batch dimension 1, alpha is an
 * output scale, a bias oneDNN's f32 bias (a [1, N] row) and beta = 1 a sum post-op. oneDNN 2.6 has no f16 x f16 matmul on CPUs
 * without AVX512-FP16, so f16 operands are widened to packed f32 copies, multiplied in f32 and
 * (for an f16 C) rounded back. */
#include "ops/gemm_avx2.h"
#include "ops/gemm_avx512.h"
#include "ops/gemm_int.h"

#include <stdatomic.h>
#include <string.h>

enum { KEY_MATMUL = 1 };
enum {
  K_TA,
  K_TB,
  K_BATCH,
  K_M,
  K_N,
  K_K,
  K_LDA,
  K_LDB,
  K_LDC,
  K_SA,
  K_SB,
  K_SC,
  K_ABDT,
  K_CDT,
  K_ALPHA,
  K_BETA,
  K_BIAS
};

static dnnl_data_type_t dnnl_dt(loom_dtype dt) {
  return dt == LOOM_BF16 ? dnnl_bf16 : dt == LOOM_F16 ? dnnl_f16 : dnnl_f32;
}

/* The memory descriptor of an operand: rows x cols (logical), stored with row stride ld, or
 * transposed (stored cols x rows with row stride ld); batched: 3-D with batch stride `stride`
 * (0: one matrix broadcast over the batch, batch dimension 1). */
static dnnl_status_t operand_md(dnnl_memory_desc_t *md, int64_t batch, int64_t rows, int64_t cols,
                                int64_t ld, bool trans, int64_t stride, dnnl_data_type_t dt) {
  int64_t rs = trans ? 1 : ld, cs = trans ? ld : 1;
  if (batch == 1)
    return dnnl_memory_desc_init_by_strides(md, 2, (dnnl_dims_t){rows, cols}, dt,
                                            (dnnl_dims_t){rs, cs});
  int64_t b = stride ? batch : 1;
  int64_t bs = stride ? stride : (trans ? cols * ld : rows * ld);
  return dnnl_memory_desc_init_by_strides(md, 3, (dnnl_dims_t){b, rows, cols}, dt,
                                          (dnnl_dims_t){bs, rs, cs});
}

static float key_float(int64_t v) {
  uint32_t u = (uint32_t)v;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static int build_matmul(const loom__prim_key *key, const_dnnl_primitive_attr_t attr_in,
                        dnnl_engine_t eng, const char *who, dnnl_primitive_desc_t *out) {
  int rc = LOOM_OK;
  const int64_t *v = key->v;
  dnnl_memory_desc_t a, b, c;
  dnnl_matmul_desc_t desc;
  dnnl_primitive_attr_t attr = NULL;
  dnnl_post_ops_t po = NULL;
  dnnl_data_type_t abt = dnnl_dt((loom_dtype)v[K_ABDT]), ct = dnnl_dt((loom_dtype)v[K_CDT]);
  LOOM_TRY(
      loom__dnnl_check(operand_md(&a, v[K_BATCH], v[K_M], v[K_K], v[K_LDA], v[K_TA], v[K_SA], abt),
                       who, "memory descriptor of A"));
  LOOM_TRY(
      loom__dnnl_check(operand_md(&b, v[K_BATCH], v[K_K], v[K_N], v[K_LDB], v[K_TB], v[K_SB], abt),
                       who, "memory descriptor of B"));
  LOOM_TRY(
      loom__dnnl_check(operand_md(&c, v[K_BATCH], v[K_M], v[K_N], v[K_LDC], false, v[K_SC], ct),
                       who, "memory descriptor of C"));
  dnnl_memory_desc_t bias;
  if (v[K_BIAS]) {
    bool b3 = v[K_BATCH] > 1;
    dnnl_dims_t dims = {1, 1, 1};
    dims[b3 ? 2 : 1] = v[K_N];
    LOOM_TRY(loom__dnnl_check(dnnl_memory_desc_init_by_tag(&bias, b3 ? 3 : 2, dims, dnnl_f32,
                                                           b3 ? dnnl_abc : dnnl_ab),
                              who, "memory descriptor of the bias"));
  }
  LOOM_TRY(loom__dnnl_check(dnnl_matmul_desc_init(&desc, &a, &b, v[K_BIAS] ? &bias : NULL, &c),
                            who, "matmul descriptor"));
  LOOM_TRY(loom__dnnl_check(dnnl_primitive_attr_clone(&attr, attr_in), who, "attribute clone"));
  float alpha = key_float(v[K_ALPHA]), beta = key_float(v[K_BETA]);
  if (alpha != 1.0f)
    LOOM_TRY(loom__dnnl_check(dnnl_primitive_attr_set_output_scales(attr, 1, 0, &alpha), who,
                              "output scale (alpha)"));
  if (beta != 0.0f) {
    LOOM_TRY(loom__dnnl_check(dnnl_post_ops_create(&po), who, "post-op creation"));
    LOOM_TRY(loom__dnnl_check(dnnl_post_ops_append_sum(po, beta), who, "sum post-op (beta)"));
    LOOM_TRY(loom__dnnl_check(dnnl_primitive_attr_set_post_ops(attr, po), who, "post-ops"));
  }
  LOOM_TRY(loom__dnnl_check(dnnl_primitive_desc_create(out, &desc, attr, eng, NULL), who,
                            "matmul primitive descriptor"));
done:
  if (po) dnnl_post_ops_destroy(po);
  if (attr) dnnl_primitive_attr_destroy(attr);
  return rc;
}

static int64_t float_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

/* f32 or bf16 operands, already checked. f32 goes to OpenBLAS where gemm_blas.c's rule says it
 * is faster (CPUs without AVX-512, one thread). */
static int gemm_native(const loom__gemm_args *g) {
  if (loom__gemm_prefer_blas(g)) return loom__gemm_f32_blas(g);
  loom__prim_key key = loom__prim_key_make(KEY_MATMUL, loom__gemm_threads());
  int64_t *v = key.v;
  bool batched = g->batch > 1;
  v[K_TA] = g->trans_a, v[K_TB] = g->trans_b, v[K_BATCH] = g->batch;
  v[K_M] = g->M, v[K_N] = g->N, v[K_K] = g->K;
  v[K_LDA] = g->lda, v[K_LDB] = g->ldb, v[K_LDC] = g->ldc;
  v[K_SA] = batched ? g->stride_a : 0, v[K_SB] = batched ? g->stride_b : 0;
  v[K_SC] = batched ? g->stride_c : 0;
  v[K_ABDT] = g->ab_dtype, v[K_CDT] = g->c_dtype;
  v[K_ALPHA] = float_bits(g->alpha), v[K_BETA] = float_bits(g->beta);
  v[K_BIAS] = g->bias != NULL;
  loom__prim p;
  int rc = loom__prim_get(&key, build_matmul, "loom__gemm", &p);
  if (rc != LOOM_OK) return rc;
  loom__dnnl_buf bufs[] = {{DNNL_ARG_SRC, (void *)g->A},
                           {DNNL_ARG_WEIGHTS, (void *)g->B},
                           {DNNL_ARG_DST, g->C},
                           {DNNL_ARG_BIAS, (void *)g->bias}};
  rc = loom__prim_run(&p, "loom__gemm", g->bias ? 4 : 3, bufs);
  loom__prim_release(&p);
  return rc;
}

/* bf16 x bf16 runs on a oneDNN kernel on this CPU: asked of oneDNN once per process (2.6 has
 * one with AVX-512, avx512_core and up; none on AVX2-only CPUs), and only where that kernel is
 * faster than widening to f32 (loom__bf16_kernel_fast). */
bool loom__gemm_native(loom_dtype ab_dtype) {
  if (ab_dtype != LOOM_BF16) return ab_dtype == LOOM_F32;
  static _Atomic int answer;
  loom__prim_key key = loom__prim_key_make(KEY_MATMUL, 1);
  int64_t *v = key.v;
  v[K_BATCH] = 1, v[K_M] = v[K_N] = v[K_K] = 16;
  v[K_LDA] = v[K_LDB] = v[K_LDC] = 16;
  v[K_ABDT] = LOOM_BF16, v[K_CDT] = LOOM_F32, v[K_ALPHA] = float_bits(1.0f);
  return loom__prim_probe_bf16(&answer, &key, build_matmul);
}

/* Copies `nmat` matrices of rows x cols (row stride ld, `stride` apart) between a strided
 * f16/bf16 layout and a packed f32 one (exact when widening; narrowing rounds once). */
static void widen(const void *src, loom_dtype dt, int64_t ld, int64_t stride, float *dst,
                  int64_t nmat, int64_t rows, int64_t cols) {
  const uint16_t *s = src;
  for (int64_t m = 0; m < nmat; m++)
    for (int64_t r = 0; r < rows; r++)
      loom_convert(s + m * stride + r * ld, dt, dst + (m * rows + r) * cols, LOOM_F32,
                   (size_t)cols);
}
static void narrow(const float *src, void *dst, loom_dtype dt, int64_t ld, int64_t stride,
                   int64_t nmat, int64_t rows, int64_t cols) {
  uint16_t *d = dst;
  for (int64_t m = 0; m < nmat; m++)
    for (int64_t r = 0; r < rows; r++)
      loom_convert(src + (m * rows + r) * cols, LOOM_F32, d + m * stride + r * ld, dt,
                   (size_t)cols);
}

/* f16 operands (and bf16 ones where oneDNN has no bf16 kernel): widened to packed f32 (exact),
 * multiplied in f32 with f32 accumulation; a 16-bit C goes through f32 and is rounded once. */
static int gemm_widened(const loom__gemm_args *g) {
  int rc = LOOM_OK;
  loom__gemm_args f = *g;
  float *a = NULL, *b = NULL, *c = NULL;
  int64_t ar = g->trans_a ? g->K : g->M, ac = g->trans_a ? g->M : g->K;
  int64_t br = g->trans_b ? g->N : g->K, bc = g->trans_b ? g->K : g->N;
  int64_t na = g->batch > 1 && g->stride_a ? g->batch : 1;
  int64_t nb = g->batch > 1 && g->stride_b ? g->batch : 1;
  size_t sa, sb, sc;
  if (!loom__mul_ok((size_t)(na * ar), (size_t)ac * sizeof(float), &sa) ||
      !loom__mul_ok((size_t)(nb * br), (size_t)bc * sizeof(float), &sb) ||
      !loom__mul_ok((size_t)(g->batch * g->M), (size_t)g->N * sizeof(float), &sc))
    return loom__fail(LOOM_EOVERFLOW, "loom__gemm: f32 copies of the %s operands overflow size_t",
                      loom_dtype_name(g->ab_dtype));
  LOOM__GEMM_ALLOC(a, sa, "loom__gemm", "the f32 copy of A");
  LOOM__GEMM_ALLOC(b, sb, "loom__gemm", "the f32 copy of B");
  widen(g->A, g->ab_dtype, g->lda, g->stride_a, a, na, ar, ac);
  widen(g->B, g->ab_dtype, g->ldb, g->stride_b, b, nb, br, bc);
  f.ab_dtype = LOOM_F32;
  f.A = a, f.lda = ac, f.stride_a = na > 1 ? ar * ac : 0;
  f.B = b, f.ldb = bc, f.stride_b = nb > 1 ? br * bc : 0;
  if (g->c_dtype != LOOM_F32) {
    LOOM__GEMM_ALLOC(c, sc, "loom__gemm", "the f32 copy of C");
    if (g->beta != 0.0f) widen(g->C, g->c_dtype, g->ldc, g->stride_c, c, g->batch, g->M, g->N);
    f.c_dtype = LOOM_F32;
    f.C = c, f.ldc = g->N, f.stride_c = g->M * g->N;
  }
  LOOM_TRY(gemm_native(&f));
  if (c) narrow(c, g->C, g->c_dtype, g->ldc, g->stride_c, g->batch, g->M, g->N);
done:
  loom__free(a);
  loom__free(b);
  loom__free(c);
  return rc;
}

/* Native bf16 (never where it is widened: LOOM_BF16_KERNELS=widen, oneDNN capped below AMX)
 * goes to loom's AMX GEMM where gemm_amx.c's rule picks it; widened 16-bit operands to loom's
 * AVX2 or AVX-512 GEMM (widened as packed) where gemm_avx2_pick.c's rules pick one, else to f32
 * copies. */
static int gemm_checked(const loom__gemm_args *g) {
  if (loom__gemm_native(g->ab_dtype))
    return loom__gemm_prefer_amx(g) ? loom__gemm_bf16_amx(g) : gemm_native(g);
  if (loom__gemm_avx2_wanted(g)) return loom__gemm_avx2(g);
  return loom__gemm_avx512_wanted(g) ? loom__gemm_avx512(g) : gemm_widened(g);
}

int loom__gemm(const loom__gemm_args *g) {
  int rc = loom__gemm_check(g, "loom__gemm");
  if (rc != LOOM_OK) return rc;
  if (g->batch == 1 || g->stride_a || g->stride_b) return gemm_checked(g);
  /* both operands broadcast (oneDNN needs a real batch in one of them): one product per
   * batch of C, each with its own beta */
  loom__gemm_args one = *g;
  one.batch = 1;
  size_t csize = loom_dtype_size(g->c_dtype);
  for (int64_t p = 0; p < g->batch && rc == LOOM_OK; p++) {
    one.C = (char *)g->C + (size_t)(p * g->stride_c) * csize;
    rc = gemm_checked(&one);
  }
  return rc;
}
