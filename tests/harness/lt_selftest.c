/* lt_selftest.c: the harness itself, broken on purpose. A call fails (a shape with a negative
 * dimension), its check fails, and the test goes on to dereference the NULL the call left:
 * the harness must stop the test at the failed check, report it, and run the next tests.
 * Run by the ctest `lt_selftest` (tests/CMakeLists.txt), which expects exactly this output:
 * "FAIL broken_call_stops_its_test", "ok   next_test_still_runs", "1 passed, 1 failed". */
#include "lt.h"

LT_TEST(broken_call_stops_its_test) {
  loom_tensor *t = NULL;
  const int64_t shape[1] = {-1};
  LT_OK(loom_tensor_zeros(LOOM_F32, 1, shape, &t)); /* fails: t stays NULL */
  float *p = loom_tensor_data(t);                   /* never reached */
  p[0] = 1.0f;
  loom_tensor_free(t);
}

LT_TEST(next_test_still_runs) {
  loom_tensor *t = NULL;
  const int64_t shape[1] = {4};
  LT_OK(loom_tensor_zeros(LOOM_F32, 1, shape, &t));
  LT_EQ(loom_tensor_numel(t), 4);
  loom_tensor_free(t);
}
