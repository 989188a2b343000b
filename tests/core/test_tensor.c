/* test_tensor.c: tensor creation, views sharing storage, copy/cast across dtypes and strides,
 * fill, get/set, printing, and a clear error for each kind of bad call. */
#include "lt.h"
#include "core/tensor_int.h"

#include <stdlib.h>

static loom_tensor *arange(loom_dtype dt, int ndim, const int64_t *shape) {
  loom_tensor *t = NULL;
  loom_tensor_empty(dt, ndim, shape, &t);
  size_t n = loom_tensor_numel(t);
  for (size_t i = 0; i < n; i++) loom__store_f64(loom_tensor_data(t), dt, i, (double)i);
  return t;
}

static double at(const loom_tensor *t, int64_t a, int64_t b, int64_t c) {
  int64_t idx[3] = {a, b, c};
  double v = -1;
  loom_tensor_get(t, idx, &v);
  return v;
}

LT_TEST(tensor_create_and_properties) {
  int64_t shape[] = {2, 3, 4};
  loom_tensor *t = NULL;
  LT_OK(loom_tensor_zeros(LOOM_F32, 3, shape, &t));
  LT_EQ(loom_tensor_ndim(t), 3);
  LT_EQ(loom_tensor_numel(t), 24);
  LT_EQ(loom_tensor_nbytes(t), 96);
  LT_EQ(loom_tensor_dim(t, -1), 4);
  LT_EQ(loom_tensor_dim(t, 3), -1);
  LT_EQ(loom_tensor_strides(t)[0], 12);
  LT_EQ(loom_tensor_strides(t)[2], 1);
  LT_TRUE(loom_tensor_is_contiguous(t));
  LT_EQ(at(t, 1, 2, 3), 0);
  loom_tensor_free(t);

  loom_tensor *s = NULL; /* a rank-0 scalar */
  LT_OK(loom_tensor_empty(LOOM_I64, 0, NULL, &s));
  LT_OK(loom_tensor_fill(s, 7));
  double v;
  LT_OK(loom_tensor_item(s, &v));
  LT_EQ(v, 7);
  loom_tensor_free(s);

  int64_t empty_shape[] = {3, 0};
  LT_OK(loom_tensor_empty(LOOM_F16, 2, empty_shape, &t));
  LT_EQ(loom_tensor_numel(t), 0);
  loom_tensor_free(t);
}

LT_TEST(tensor_bad_calls_name_the_problem) {
  loom_tensor *t = (loom_tensor *)1;
  int64_t neg[] = {2, -3};
  LT_ERR(loom_tensor_empty(LOOM_F32, 2, neg, &t), LOOM_EINVAL, "dim 1 has negative size -3");
  LT_TRUE(t == NULL);
  int64_t nine[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
  LT_ERR(loom_tensor_empty(LOOM_F32, 9, nine, &t), LOOM_EINVAL, "rank 9 out of range");
  int64_t huge[] = {INT64_MAX / 2, 4};
  LT_ERR(loom_tensor_empty(LOOM_F32, 2, huge, &t), LOOM_EOVERFLOW, "overflow");
  int64_t ok[] = {2};
  LT_ERR(loom_tensor_empty((loom_dtype)42, 1, ok, &t), LOOM_EDTYPE, "invalid dtype 42");
  LT_ERR(loom_tensor_empty(LOOM_F32, 1, NULL, &t), LOOM_EINVAL, "shape is NULL");
  LT_ERR(loom_tensor_empty(LOOM_F32, 1, ok, NULL), LOOM_EINVAL, "out is NULL");
  LT_ERR(loom_tensor_wrap(LOOM_F32, 1, ok, NULL, &t), LOOM_EINVAL, "data is NULL");
  LT_ERR(loom_tensor_transpose(NULL, 0, 1, &t), LOOM_EINVAL, "tensor is NULL");

  loom_tensor *a = NULL, *b = NULL;
  int64_t s23[] = {2, 3}, s32[] = {3, 2};
  LT_OK(loom_tensor_zeros(LOOM_F32, 2, s23, &a));
  LT_OK(loom_tensor_zeros(LOOM_F32, 2, s32, &b));
  LT_ERR(loom_tensor_copy(a, b), LOOM_ESHAPE, "[2, 3] and source [3, 2]");
  LT_ERR(loom_tensor_transpose(a, 0, 2, &t), LOOM_EINVAL, "dim 2 out of range");
  int64_t bad5[] = {5};
  LT_ERR(loom_tensor_reshape(a, 1, bad5, &t), LOOM_ESHAPE, "has 5 elements");
  int64_t two_infer[] = {-1, -1};
  LT_ERR(loom_tensor_reshape(a, 2, two_infer, &t), LOOM_EINVAL, "more than one dim is -1");
  int64_t inf4[] = {4, -1};
  LT_ERR(loom_tensor_reshape(a, 2, inf4, &t), LOOM_ESHAPE, "cannot infer");
  int perm_dup[] = {0, 0};
  LT_ERR(loom_tensor_permute(a, perm_dup, &t), LOOM_EINVAL, "appears twice");
  LT_ERR(loom_tensor_narrow(a, 1, 2, 2, &t), LOOM_EINVAL, "out of bounds");
  LT_ERR(loom_tensor_slice(a, 1, 0, 3, 0, &t), LOOM_EINVAL, "step 0");
  int64_t idx[] = {2, 0};
  double v;
  LT_ERR(loom_tensor_get(a, idx, &v), LOOM_EINVAL, "index 2 out of range for dim 0");
  LT_ERR(loom_tensor_item(a, &v), LOOM_ESHAPE, "6 elements");
  char small[8];
  LT_ERR(loom_tensor_read(a, LOOM_F32, small, sizeof small), LOOM_EINVAL, "smaller than the 24");
  loom_tensor_free(a);
  loom_tensor_free(b);
}

/* A freed tensor is detected when its memory has not been reused: an allocator that never
 * returns memory makes that certain (and keeps ASan from calling it a use after free). */
static void *keep_alloc(void *ctx, size_t size, size_t align) {
  (void)ctx;
  return aligned_alloc(align, (size + align - 1) / align * align);
}
static void *kept[64];
static int nkept;
static void keep_free(void *ctx, void *p) {
  (void)ctx;
  if (nkept < 64) kept[nkept++] = p;
  else free(p);
}

LT_TEST(tensor_use_after_free_is_misuse) {
  loom_allocator a = {keep_alloc, keep_free, NULL};
  LT_OK(loom_set_allocator(&a));
  int64_t shape[] = {4};
  loom_tensor *t = NULL, *v = NULL;
  LT_OK(loom_tensor_zeros(LOOM_F32, 1, shape, &t));
  loom_tensor_free(t);
  LT_ERR(loom_tensor_fill(t, 1.0), LOOM_EMISUSE, "freed");
  LT_ERR(loom_tensor_narrow(t, 0, 0, 1, &v), LOOM_EMISUSE, "freed");
  loom_tensor_free(t); /* a second free is ignored, not a crash */
  LT_OK(loom_set_allocator(NULL));
  for (int i = 0; i < nkept; i++) free(kept[i]);
  nkept = 0;
}

LT_TEST(views_share_storage_and_outlive_their_base) {
  int64_t shape[] = {2, 3, 4};
  loom_tensor *t = arange(LOOM_F32, 3, shape);
  loom_tensor *tr = NULL, *perm = NULL, *nar = NULL, *sl = NULL, *flat = NULL;
  LT_OK(loom_tensor_transpose(t, 0, 2, &tr)); /* [4, 3, 2] */
  LT_EQ(loom_tensor_dim(tr, 0), 4);
  LT_TRUE(!loom_tensor_is_contiguous(tr));
  LT_TRUE(loom_tensor_shares_storage(t, tr));
  LT_EQ(at(tr, 3, 2, 1), at(t, 1, 2, 3));
  int p[] = {1, 2, 0};
  LT_OK(loom_tensor_permute(t, p, &perm)); /* [3, 4, 2] */
  LT_EQ(at(perm, 2, 1, 1), at(t, 1, 2, 1));
  LT_OK(loom_tensor_narrow(t, 2, 1, 2, &nar)); /* [2, 3, 2] holding columns 1..2 */
  LT_EQ(at(nar, 1, 1, 0), 1 * 12 + 1 * 4 + 1);
  LT_OK(loom_tensor_slice(t, -1, -3, 100, 2, &sl)); /* columns 1 and 3 */
  LT_EQ(loom_tensor_dim(sl, 2), 2);
  LT_EQ(at(sl, 1, 2, 1), 12 + 8 + 3);
  int64_t f[] = {-1};
  LT_OK(loom_tensor_reshape(t, 1, f, &flat)); /* contiguous: a view */
  LT_TRUE(loom_tensor_shares_storage(t, flat));
  /* writing through a view is seen by the base */
  int64_t i0[] = {0, 0, 1};
  LT_OK(loom_tensor_set(nar, i0, 100.0));
  LT_EQ(at(t, 0, 0, 2), 100);
  loom_tensor_free(t); /* views keep the storage alive */
  LT_EQ(at(tr, 2, 0, 0), 100);
  loom_tensor *flat_tr = NULL; /* a transposed tensor cannot be flattened as a view: copy */
  LT_OK(loom_tensor_reshape(tr, 1, f, &flat_tr));
  LT_TRUE(!loom_tensor_shares_storage(tr, flat_tr));
  int64_t k[] = {1};
  double v;
  LT_OK(loom_tensor_get(flat_tr, k, &v));
  LT_EQ(v, 12); /* tr[0,0,1] = t[1,0,0] */
  loom_tensor_free(tr);
  loom_tensor_free(perm);
  loom_tensor_free(nar);
  loom_tensor_free(sl);
  loom_tensor_free(flat);
  loom_tensor_free(flat_tr);
}

LT_TEST(reshape_views_of_strided_tensors) {
  /* narrow the last dim of a [4, 6] to [4, 3] then reshape [4,3] -> [2,2,3]: still a view */
  int64_t shape[] = {4, 6};
  loom_tensor *t = arange(LOOM_F32, 2, shape), *n = NULL, *r = NULL, *c = NULL;
  LT_OK(loom_tensor_narrow(t, 1, 0, 3, &n));
  int64_t s[] = {2, 2, 3};
  LT_OK(loom_tensor_reshape(n, 3, s, &r));
  LT_TRUE(loom_tensor_shares_storage(t, r));
  LT_EQ(at(r, 1, 1, 2), 3 * 6 + 2);
  LT_OK(loom_tensor_contiguous(r, &c));
  LT_TRUE(loom_tensor_is_contiguous(c));
  LT_EQ(at(c, 1, 0, 1), 2 * 6 + 1);
  loom_tensor_free(t);
  loom_tensor_free(n);
  loom_tensor_free(r);
  loom_tensor_free(c);
}

LT_TEST(copy_and_cast_across_dtypes_and_strides) {
  int64_t shape[] = {3, 5, 7};
  loom_dtype dts[] = {LOOM_F32, LOOM_F16, LOOM_BF16, LOOM_I32, LOOM_I64};
  for (int a = 0; a < 5; a++)
    for (int b = 0; b < 5; b++) {
      loom_tensor *src = arange(dts[a], 3, shape), *tr = NULL, *dst = NULL, *back = NULL;
      LT_OK(loom_tensor_transpose(src, 0, 2, &tr));
      LT_OK(loom_tensor_cast(tr, dts[b], &dst)); /* strided source -> contiguous dst */
      LT_TRUE(loom_tensor_is_contiguous(dst));
      for (int64_t i = 0; i < 7; i += 3)
        for (int64_t k = 0; k < 3; k++) LT_EQ(at(dst, i, 4, k), k * 35 + 4 * 7 + i);
      /* and back into a strided destination */
      int64_t zs[] = {7, 5, 3};
      loom_tensor *z = NULL;
      LT_OK(loom_tensor_zeros(dts[a], 3, shape, &back));
      LT_OK(loom_tensor_transpose(back, 0, 2, &z));
      LT_EQ(loom_tensor_dim(z, 0), zs[0]);
      LT_OK(loom_tensor_copy(z, dst));
      LT_EQ(at(back, 2, 3, 6), 2 * 35 + 3 * 7 + 6);
      loom_tensor_free(src);
      loom_tensor_free(tr);
      loom_tensor_free(dst);
      loom_tensor_free(back);
      loom_tensor_free(z);
    }
}

LT_TEST(fill_wrap_read_and_rounding) {
  float buf[6] = {0};
  int64_t shape[] = {2, 3};
  loom_tensor *w = NULL, *h = NULL;
  LT_OK(loom_tensor_wrap(LOOM_F32, 2, shape, buf, &w));
  LT_OK(loom_tensor_fill(w, 1.0 / 3.0));
  LT_NEAR(buf[5], 1.0 / 3.0, 1e-7);
  LT_OK(loom_tensor_cast(w, LOOM_BF16, &h));
  uint16_t hb[6];
  LT_OK(loom_tensor_read(h, LOOM_BF16, hb, sizeof hb));
  LT_EQ_HEX(hb[0], 0x3eab); /* 1/3 in bf16, rounded to nearest even */
  float back[6];
  LT_OK(loom_tensor_read(h, LOOM_F32, back, sizeof back));
  LT_EQ(back[3], 0.333984375f);
  loom_tensor_free(w);
  loom_tensor_free(h);
  loom_tensor *i = NULL;
  LT_OK(loom_tensor_empty(LOOM_I32, 2, shape, &i));
  LT_OK(loom_tensor_fill(i, 1e20)); /* saturates, not UB */
  int64_t idx[] = {1, 1};
  double v;
  LT_OK(loom_tensor_get(i, idx, &v));
  LT_EQ(v, INT32_MAX);
  loom_tensor_free(i);
}

LT_TEST(print_is_readable) {
  int64_t shape[] = {2, 10};
  loom_tensor *t = arange(LOOM_F32, 2, shape), *tr = NULL;
  char buf[1024];
  LT_OK(loom_tensor_format(t, buf, sizeof buf));
  LT_TRUE(strstr(buf, "tensor(f32, shape=[2, 10])") != NULL);
  LT_TRUE(strstr(buf, "[[0, 1, 2, ..., 7, 8, 9],") != NULL);
  LT_TRUE(strstr(buf, "[10, 11, 12, ..., 17, 18, 19]]") != NULL);
  LT_OK(loom_tensor_transpose(t, 0, 1, &tr));
  LT_OK(loom_tensor_format(tr, buf, sizeof buf));
  LT_TRUE(strstr(buf, "strides=[1, 10]") != NULL);
  char tiny[16];
  LT_OK(loom_tensor_format(t, tiny, sizeof tiny)); /* truncated, still terminated */
  LT_EQ(strlen(tiny), 15);
  FILE *devnull = fopen("/dev/null", "w");
  LT_OK(loom_tensor_print(t, devnull));
  fclose(devnull);
  loom_tensor_free(t);
  loom_tensor_free(tr);
}
