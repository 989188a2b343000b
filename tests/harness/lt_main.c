/* lt_main.c: runs the registered tests (those whose name contains argv[1], or all), each with
 * its pass/fail line, and closes with "N passed, N failed, N skipped". Exit status 1 if any
 * failed. A failed check stops its test (lt_stop_if_failed: a longjmp back here from the
 * test's own thread); the next test then runs as usual. */
#include "lt.h"

#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#define LT_MAX 1024
static struct {
  const char *name, *file;
  lt_fn fn;
} tests[LT_MAX];
static int ntests, cur_skipped;
static _Atomic int cur_failures;
static char skip_reason[256];
static pthread_t runner;   /* the thread that runs the tests */
static jmp_buf stop_point; /* where a stopped test returns to */
static bool running;       /* a test is running (stop_point is valid) */

void lt_register(const char *name, const char *file, lt_fn fn) {
  if (ntests < LT_MAX) tests[ntests++] = (typeof(tests[0])){name, file, fn};
}

void lt_fail_at(const char *file, int line, const char *fmt, ...) {
  if (atomic_fetch_add(&cur_failures, 1) >= 20) return; /* enough to see the pattern */
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "  %s:%d: ", file, line);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}

void lt_stop_if_failed(void) {
  if (running && atomic_load(&cur_failures) && pthread_equal(pthread_self(), runner))
    longjmp(stop_point, 1);
}

void lt_skip(const char *why) {
  cur_skipped = 1;
  snprintf(skip_reason, sizeof skip_reason, "%s", why);
}

int lt_failures(void) { return cur_failures; }

static int by_name(const void *a, const void *b) {
  return strcmp(((const typeof(tests[0]) *)a)->name, ((const typeof(tests[0]) *)b)->name);
}

double lt_now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(int argc, char **argv) {
  const char *filter = argc > 1 ? argv[1] : "";
  qsort(tests, (size_t)ntests, sizeof tests[0], by_name);
  int passed = 0, failed = 0, skipped = 0;
  for (int i = 0; i < ntests; i++) {
    if (!strstr(tests[i].name, filter)) continue;
    atomic_store(&cur_failures, 0);
    cur_skipped = 0;
    double t0 = lt_now_s();
    runner = pthread_self();
    volatile bool stopped = false; /* set after the longjmp back to setjmp */
    if (setjmp(stop_point) == 0) {
      running = true;
      tests[i].fn();
    } else {
      stopped = true;
    }
    running = false;
    double ms = (lt_now_s() - t0) * 1e3;
    if (cur_failures) {
      failed++;
      printf("FAIL %s (%d checks failed%s)\n", tests[i].name, atomic_load(&cur_failures),
             stopped ? ", stopped at the first on its thread" : "");
    } else if (cur_skipped) {
      skipped++;
      printf("skip %s: %s\n", tests[i].name, skip_reason);
    } else {
      passed++;
      printf("ok   %s (%.0f ms)\n", tests[i].name, ms);
    }
    fflush(stdout);
  }
  printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
  return failed ? 1 : (passed + skipped ? 0 : 1);
}
