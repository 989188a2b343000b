/* demo.c: the README's demo until `loom train` exists: tensors, views, and the dispatched
 * f32 <-> bf16/f16 conversions, with the memory pools' byte counts. */
#include <loom/loom.h>

#include <stdio.h>

int main(void) {
  printf("loom demo: CPU level %s (best %s, AVX512-BF16 %s)\n",
         loom_cpu_level_name(loom_cpu_level_active()), loom_cpu_level_name(loom_cpu_level_best()),
         loom_cpu_has_avx512bf16() ? "yes" : "no");
  int64_t shape[] = {3, 4};
  float values[12];
  for (int i = 0; i < 12; i++) values[i] = 1.0f + (float)i / 3.0f;
  loom_tensor *x = NULL, *xt = NULL, *xb = NULL, *xh = NULL;
  int rc = LOOM_OK; /* LOOM_CHECK (loom/check.h): a failure prints, sets rc, jumps to done */
  LOOM_CHECK(loom_tensor_from_data(LOOM_F32, 2, shape, values, &x));
  LOOM_CHECK(loom_tensor_transpose(x, 0, 1, &xt));
  LOOM_CHECK(loom_tensor_cast(xt, LOOM_BF16, &xb));
  LOOM_CHECK(loom_tensor_cast(xt, LOOM_F16, &xh));
  printf("x:\n");
  loom_tensor_print(x, stdout);
  printf("x transposed (a view):\n");
  loom_tensor_print(xt, stdout);
  printf("as bf16:\n");
  loom_tensor_print(xb, stdout);
  printf("as f16:\n");
  loom_tensor_print(xh, stdout);
  loom_pool_stats s;
  loom_mem_stats(LOOM_POOL_COMPUTE, &s);
  printf("compute pool: %zu bytes in use, peak %zu\n", s.current_bytes, s.peak_bytes);
  int64_t bad[] = {-1, 4};
  loom_tensor *none = NULL;
  int status = loom_tensor_empty(LOOM_F32, 2, bad, &none);
  printf("a bad call gives a status and a message: %s: %s\n", loom_status_name(status),
         loom_last_error());
done:
  loom_tensor_free(x);
  loom_tensor_free(xt);
  loom_tensor_free(xb);
  loom_tensor_free(xh);
  return rc ? 1 : 0;
}
