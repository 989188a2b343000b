/* threads.c: the public thread-count setting of the compute ops (loom_set_num_threads), a thin
 * front of the GEMM layer's per-thread setting, and its bound (loom_max_num_threads): a team
 * far larger than the machine only slows every call (10,000 threads made a short run take 95 s) and
 * OpenMP runtimes crash on huge ones (100,000: SIGSEGV inside libgomp). */
#include "loom/ops.h"
#include "ops/gemm.h"

#include <unistd.h>

enum { PER_CPU = 4, MOST = 1024 };

static long online_cpus(void) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n < 1 ? 1 : n;
}

int loom_max_num_threads(void) {
  long cpus = online_cpus();
  return cpus >= MOST / PER_CPU ? MOST : (int)(PER_CPU * cpus);
}

int loom_set_num_threads(int n) {
  int most = loom_max_num_threads();
  if (n > most)
    return loom__fail(LOOM_EINVAL, "loom_set_num_threads: %d threads is more than %d (%d per "
                      "online CPU, this machine has %ld, and %d in all); the count is unchanged",
                      n, most, PER_CPU, online_cpus(), MOST);
  loom__gemm_set_threads(n);
  return LOOM_OK;
}
