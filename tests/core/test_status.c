/* test_status.c: the status table, names and the thread-local last-error message. */
#include "lt.h"
#include "core/core_int.h"

#include <pthread.h>

LT_TEST(status_names_and_text) {
  LT_STREQ(loom_status_name(LOOM_OK), "LOOM_OK");
  LT_STREQ(loom_status_name(LOOM_ESHAPE), "LOOM_ESHAPE");
  LT_STREQ(loom_status_name(LOOM_ETIMEDOUT), "LOOM_ETIMEDOUT");
  LT_STREQ(loom_strerror(LOOM_ENOMEM), "out of memory");
  LT_STREQ(loom_status_name(12345), "LOOM_UNKNOWN");
  LT_STREQ(loom_strerror(-999), "unknown status");
  /* every code in the table has a distinct negative value and a name */
  int codes[] = {
#define CODE(n, v, s) LOOM_##n,
      LOOM_STATUS_MAP(CODE)
#undef CODE
  };
  for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++) {
    LT_TRUE(codes[i] < 0);
    LT_TRUE(strncmp(loom_status_name(codes[i]), "LOOM_E", 6) == 0);
    for (size_t j = 0; j < i; j++) LT_TRUE(codes[i] != codes[j]);
  }
}

static void *other_thread(void *arg) {
  (void)arg;
  loom__fail(LOOM_EIO, "thread two failed");
  return NULL;
}

LT_TEST(last_error_is_per_thread) {
  loom_clear_error();
  LT_STREQ(loom_last_error(), "");
  LT_EQ(loom__fail(LOOM_ESHAPE, "matmul: shapes [%d,%d] and [%d,%d]", 4, 3, 5, 2), LOOM_ESHAPE);
  LT_STREQ(loom_last_error(), "matmul: shapes [4,3] and [5,2]");
  pthread_t t;
  pthread_create(&t, NULL, other_thread, NULL);
  pthread_join(t, NULL);
  LT_STREQ(loom_last_error(), "matmul: shapes [4,3] and [5,2]");
}

LT_TEST(dtype_table) {
  LT_EQ(loom_dtype_size(LOOM_F32), 4);
  LT_EQ(loom_dtype_size(LOOM_BF16), 2);
  LT_EQ(loom_dtype_size(LOOM_I64), 8);
  LT_EQ(loom_dtype_size((loom_dtype)99), 0);
  LT_STREQ(loom_dtype_name(LOOM_BF16), "bf16");
  LT_TRUE(loom_dtype_is_float(LOOM_F16));
  LT_TRUE(!loom_dtype_is_float(LOOM_I32));
  loom_dtype dt;
  LT_OK(loom_dtype_parse("bfloat16", &dt));
  LT_EQ(dt, LOOM_BF16);
  LT_OK(loom_dtype_parse("i64", &dt));
  LT_EQ(dt, LOOM_I64);
  LT_ERR(loom_dtype_parse("f8", &dt), LOOM_EINVAL, "unknown dtype 'f8'");
}

LT_TEST(cpu_levels) {
  LT_TRUE(loom_cpu_supports(LOOM_CPU_SCALAR));
  LT_TRUE(loom_cpu_supports(loom_cpu_level_best()));
  LT_TRUE(loom_cpu_level_active() <= loom_cpu_level_best());
  LT_ERR(loom_set_cpu_level((loom_cpu_level)7), LOOM_EINVAL, "out of range");
  loom_cpu_level before = loom_cpu_level_active();
  LT_OK(loom_set_cpu_level(LOOM_CPU_SCALAR));
  LT_EQ(loom_cpu_level_active(), LOOM_CPU_SCALAR);
  LT_OK(loom_set_cpu_level(before));
  LT_STREQ(loom_cpu_level_name(LOOM_CPU_AVX512), "avx512");
}
