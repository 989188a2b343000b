/* lt.h: loom's small test harness. A test is `LT_TEST(name) { ... }` in any file of a test
 * binary; it registers itself. A failed check (the LT_ macros) prints both values and
 * loom_last_error(), marks the test failed and stops it: on the thread that runs the test it
 * returns from the test at once (longjmp back to the runner), so the test never goes on with
 * the NULL a failed call left; the suite reports it and goes on to the next test. On another
 * thread (a rank of loom_threads_run, a hook) the check only marks the failure, since that
 * thread cannot leave the test; the test then stops at its next check on its own thread.
 * lt_fail_at alone (for loops that count bad elements) marks without stopping. lt_main.c runs
 * the tests whose names contain argv[1] (all without an argument) and ends with
 * "N passed, N failed". */
#ifndef LOOM_LT_H
#define LOOM_LT_H

#include "loom/loom.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

typedef void (*lt_fn)(void);
void lt_register(const char *name, const char *file, lt_fn fn);
void lt_fail_at(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Stops the running test if called on the thread that runs it and a check has failed
 * (the LT_ macros call it after a failure); elsewhere it returns. */
void lt_stop_if_failed(void);
/* Mark the running test skipped, with a reason (for example a CPU level the machine lacks). */
void lt_skip(const char *why);
/* Number of failed checks in the running test so far. */
int lt_failures(void);
/* Seconds on the monotonic clock (for a test's own bound on how long something took). */
double lt_now_s(void);

#define LT_TEST(name)                                                                         \
  static void lt_test_##name(void);                                                           \
  __attribute__((constructor)) static void lt_reg_##name(void) {                              \
    lt_register(#name, __FILE__, lt_test_##name);                                             \
  }                                                                                           \
  static void lt_test_##name(void)

#define LT_TRUE(cond)                                                                         \
  do {                                                                                        \
    if (!(cond)) {                                                                            \
      lt_fail_at(__FILE__, __LINE__, "expected %s (last error: %s)", #cond, loom_last_error()); \
      lt_stop_if_failed();                                                                    \
    }                                                                                         \
  } while (0)

#define LT_EQ(a, b)                                                                           \
  do {                                                                                        \
    long long lt_a = (long long)(a), lt_b = (long long)(b);                                   \
    if (lt_a != lt_b) {                                                                       \
      lt_fail_at(__FILE__, __LINE__, "%s == %s: %lld vs %lld", #a, #b, lt_a, lt_b);           \
      lt_stop_if_failed();                                                                    \
    }                                                                                         \
  } while (0)

#define LT_EQ_HEX(a, b)                                                                       \
  do {                                                                                        \
    unsigned long long lt_a = (unsigned long long)(a), lt_b = (unsigned long long)(b);        \
    if (lt_a != lt_b) {                                                                       \
      lt_fail_at(__FILE__, __LINE__, "%s == %s: 0x%llx vs 0x%llx", #a, #b, lt_a, lt_b);       \
      lt_stop_if_failed();                                                                    \
    }                                                                                         \
  } while (0)

#define LT_NEAR(a, b, tol)                                                                    \
  do {                                                                                        \
    double lt_a = (double)(a), lt_b = (double)(b), lt_t = (double)(tol);                     \
    if (!(fabs(lt_a - lt_b) <= lt_t)) {                                                       \
      lt_fail_at(__FILE__, __LINE__, "%s ~= %s: %.9g vs %.9g (tol %g)", #a, #b, lt_a, lt_b,   \
                 lt_t);                                                                       \
      lt_stop_if_failed();                                                                    \
    }                                                                                         \
  } while (0)

#define LT_STREQ(a, b)                                                                        \
  do {                                                                                        \
    const char *lt_a = (a), *lt_b = (b);                                                      \
    if (!lt_a || !lt_b || strcmp(lt_a, lt_b) != 0) {                                          \
      lt_fail_at(__FILE__, __LINE__, "%s == %s: \"%s\" vs \"%s\"", #a, #b,                    \
                 lt_a ? lt_a : "(null)", lt_b ? lt_b : "(null)");                             \
      lt_stop_if_failed();                                                                    \
    }                                                                                         \
  } while (0)

/* The call must succeed. */
#define LT_OK(call)                                                                           \
  do {                                                                                        \
    int lt_rc = (call);                                                                       \
    if (lt_rc != LOOM_OK) {                                                                   \
      lt_fail_at(__FILE__, __LINE__, "%s returned %s: %s", #call, loom_status_name(lt_rc),    \
                 loom_last_error());                                                          \
      lt_stop_if_failed();                                                                    \
    }                                                                                         \
  } while (0)

/* The call must fail with `code`, and leave a message containing `substr`. */
#define LT_ERR(call, code, substr)                                                            \
  do {                                                                                        \
    loom_clear_error();                                                                       \
    int lt_rc = (call);                                                                       \
    if (lt_rc != (code))                                                                      \
      lt_fail_at(__FILE__, __LINE__, "%s returned %s, expected %s (%s)", #call,               \
                 loom_status_name(lt_rc), loom_status_name(code), loom_last_error());         \
    else if (!strstr(loom_last_error(), (substr)))                                            \
      lt_fail_at(__FILE__, __LINE__, "%s: message \"%s\" lacks \"%s\"", #call,                \
                 loom_last_error(), (substr));                                                \
    lt_stop_if_failed();                                                                      \
  } while (0)

/* Every pool's counters on the calling thread's memory account (loom/alloc.h), at once. */
typedef struct lt_pools {
  loom_pool_stats pool[LOOM_POOL_COUNT];
} lt_pools;
static inline lt_pools lt_pools_now(void) {
  lt_pools p = {0};
  for (int k = 0; k < LOOM_POOL_COUNT; k++)
    loom_mem_account_stats(loom_mem_account(), (loom_pool)k, &p.pool[k]);
  return p;
}

#endif
