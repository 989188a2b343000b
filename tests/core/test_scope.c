/* test_scope.c: loom_scope (loom/scope.h) frees what it owns and nothing else, measured by
 * loom's own allocation counters; LOOM_CHECK (loom/check.h) reports and jumps; loom_version
 * agrees with loom/version.h and the build's version. */
#include "lt.h"
#include "loom/loom.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

static size_t pool_bytes(loom_pool p) {
  loom_pool_stats st;
  loom_mem_stats(p, &st);
  return st.current_bytes;
}

LT_TEST(scope_release_returns_the_pools_to_their_baseline) {
  loom_scope *s = NULL;
  LT_OK(loom_scope_create(&s));
  loom_tensor *a = NULL, *b = NULL, *sum = NULL, *kept = NULL, *view = NULL;
  LT_OK(loom_scope_track(s, &a, &b, &sum, &view));
  LT_OK(loom_scope_track(s, &a)); /* twice: still released once */
  size_t compute0 = pool_bytes(LOOM_POOL_COMPUTE), meta0 = 0;
  for (int step = 0; step < 3; step++) {
    int64_t shape[2] = {64, 32};
    LT_OK(loom_tensor_zeros(LOOM_F32, 2, shape, &a));
    LT_OK(loom_tensor_zeros(LOOM_F32, 2, shape, &b));
    LT_OK(loom_add(a, b, &sum));
    LT_OK(loom_tensor_narrow(sum, 0, 1, 8, &view));
    loom_tensor *unnamed = NULL;
    LT_OK(loom_mul_scalar(a, 2.0, &unnamed));
    LT_OK(loom_scope_adopt(s, unnamed));
    if (step == 1) kept = loom_tensor_retain(sum); /* a second owner: survives the release */
    LT_EQ(loom_scope_count(s), 5);
    LT_TRUE(pool_bytes(LOOM_POOL_COMPUTE) > compute0);
    loom_scope_release(s);
    LT_TRUE(a == NULL && b == NULL && sum == NULL && view == NULL);
    LT_EQ(loom_scope_count(s), 0);
    if (step == 0) LT_EQ(pool_bytes(LOOM_POOL_COMPUTE), compute0);
    if (step == 0) meta0 = pool_bytes(LOOM_POOL_META); /* the adopted list, grown once */
  }
  /* the retained tensor lives on, readable, until its owner frees it */
  LT_TRUE(kept != NULL && loom_tensor_numel(kept) == 64 * 32);
  LT_TRUE(pool_bytes(LOOM_POOL_COMPUTE) > compute0);
  loom_tensor_free(kept);
  LT_EQ(pool_bytes(LOOM_POOL_COMPUTE), compute0);
  LT_EQ(pool_bytes(LOOM_POOL_META), meta0); /* the scope's lists did not grow per step */
  loom_scope_free(s);
  loom_scope_free(NULL);
  loom_scope_release(NULL);
}

LT_TEST(scope_free_releases_what_a_failed_step_left) {
  size_t compute0 = pool_bytes(LOOM_POOL_COMPUTE), meta0 = pool_bytes(LOOM_POOL_META);
  loom_scope *s = NULL;
  LT_OK(loom_scope_create(&s));
  loom_tensor *x = NULL, *y = NULL;
  LT_OK(loom_scope_track(s, &x, &y));
  int64_t shape[1] = {1000};
  LT_OK(loom_tensor_zeros(LOOM_F32, 1, shape, &x));
  int64_t bad[1] = {-1};
  LT_EQ(loom_tensor_zeros(LOOM_F32, 1, bad, &y), LOOM_EINVAL); /* y stays NULL */
  loom_scope_free(s); /* frees x */
  LT_EQ(pool_bytes(LOOM_POOL_COMPUTE), compute0);
  LT_EQ(pool_bytes(LOOM_POOL_META), meta0);
  LT_TRUE(x == NULL);
}

LT_TEST(scope_refuses_null_and_frees_what_it_cannot_keep) {
  size_t compute0 = pool_bytes(LOOM_POOL_COMPUTE);
  LT_EQ(loom_scope_create(NULL), LOOM_EINVAL);
  LT_EQ(loom_scope_track(NULL, (loom_tensor **)NULL), LOOM_EINVAL);
  int64_t shape[1] = {100};
  loom_tensor *t = NULL;
  LT_OK(loom_tensor_zeros(LOOM_F32, 1, shape, &t));
  LT_EQ(loom_scope_adopt(NULL, t), LOOM_EINVAL); /* freed: nothing leaks */
  LT_EQ(pool_bytes(LOOM_POOL_COMPUTE), compute0);
  loom_scope *s = NULL;
  LT_OK(loom_scope_create(&s));
  LT_OK(loom_scope_adopt(s, NULL));
  LT_EQ(loom_scope_count(s), 0);
  loom_scope_free(s);
}

/* LOOM_CHECK: the status into rc, the jump to done, nothing after the failure run. */
static int checked(int fail_at, int *reached) {
  int rc = LOOM_OK;
  int64_t good[1] = {4}, bad[1] = {-4};
  loom_tensor *a = NULL, *b = NULL;
  LOOM_CHECK(loom_tensor_zeros(LOOM_F32, 1, fail_at == 0 ? bad : good, &a));
  *reached = 1;
  LOOM_CHECK(loom_tensor_zeros(LOOM_F32, 1, fail_at == 1 ? bad : good, &b));
  *reached = 2;
done:
  loom_tensor_free(a);
  loom_tensor_free(b);
  return rc;
}

static int checked_goto(void) {
  int status = LOOM_OK;
  LOOM_CHECK_GOTO(loom_tensor_narrow(NULL, 0, 0, 1, NULL), status, out);
  status = 42;
out:
  return status;
}

static int checked_return(void) {
  LOOM_CHECK_RETURN(loom_tensor_narrow(NULL, 0, 0, 1, NULL));
  return 42;
}

LT_TEST(check_macro_stores_the_status_and_jumps) {
  int reached = 0;
  LT_EQ(checked(0, &reached), LOOM_EINVAL);
  LT_EQ(reached, 0);
  LT_EQ(checked(1, &reached), LOOM_EINVAL);
  LT_EQ(reached, 1);
  LT_EQ(checked(2, &reached), LOOM_OK);
  LT_EQ(reached, 2);
  LT_EQ(checked_return(), LOOM_EINVAL);
  LT_EQ(checked_goto(), LOOM_EINVAL);
  LT_EQ(loom_check_report("f.c", 1, "x", LOOM_OK), LOOM_OK);
}

/* What LOOM_CHECK prints: file, line, the call, the status name and loom's message. */
LT_TEST(check_report_names_the_call_the_status_and_the_message) {
  fflush(stderr);
  FILE *saved = tmpfile();
  LT_TRUE(saved != NULL);
  if (!saved) return;
  int fd_copy = dup(fileno(stderr));
  dup2(fileno(saved), fileno(stderr));
  int64_t bad[1] = {-1};
  loom_tensor *t = NULL;
  int rc = loom_tensor_zeros(LOOM_F32, 1, bad, &t);
  loom_check_report("prog.c", 17, "loom_tensor_zeros(...)", rc);
  fflush(stderr);
  dup2(fd_copy, fileno(stderr));
  close(fd_copy);
  char line[1024] = "";
  rewind(saved);
  if (!fgets(line, sizeof line, saved)) line[0] = '\0';
  fclose(saved);
  char want[700];
  snprintf(want, sizeof want, "prog.c:17: loom_tensor_zeros(...): LOOM_EINVAL: %s\n",
           loom_last_error());
  LT_STREQ(line, want);
}

LT_TEST(version_matches_the_header_and_the_build) {
  LT_STREQ(loom_version(), LOOM_VERSION_STRING);
  LT_EQ(loom_version_number(), LOOM_VERSION_NUMBER);
  char want[64];
  snprintf(want, sizeof want, "%d.%d.%d", LOOM_VERSION_MAJOR, LOOM_VERSION_MINOR,
           LOOM_VERSION_PATCH);
  LT_STREQ(loom_version(), want);
#ifdef LOOM_BUILD_VERSION
  LT_STREQ(loom_version(), LOOM_BUILD_VERSION); /* CMake's project version */
#endif
}
