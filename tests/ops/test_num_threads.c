/* test_num_threads.c: loom_set_num_threads refuses a count above loom_max_num_threads (4 per
 * online CPU, 1024 in all) with LOOM_EINVAL and a message naming the bound, and leaves the
 * count as it was: 100,000 threads crashed inside libgomp. */
#include "lt.h"
#include "ops/gemm_int.h"

#include <unistd.h>

LT_TEST(num_threads_above_the_bound_are_refused) {
  int most = loom_max_num_threads();
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  LT_EQ(most, cpus >= 256 ? 1024 : 4 * (cpus < 1 ? 1 : cpus));
  int before = loom__gemm_threads();
  LT_OK(loom_set_num_threads(1));
  LT_EQ(loom_set_num_threads(most + 1), LOOM_EINVAL);
  char want[64];
  snprintf(want, sizeof want, "is more than %d", most);
  LT_TRUE(strstr(loom_last_error(), want) != NULL);
  LT_EQ(loom__gemm_threads(), 1); /* unchanged */
  LT_EQ(loom_set_num_threads(100000), LOOM_EINVAL);
  LT_EQ(loom_set_num_threads(1 << 30), LOOM_EINVAL);
  LT_EQ(loom__gemm_threads(), 1);
  LT_OK(loom_set_num_threads(0)); /* n < 1 counts as 1 */
  LT_OK(loom_set_num_threads(before));
}
