/* test_stale_temps.c: loom_remove_stale_temporaries removes what an interrupted atomic write
 * of one target left (`<name>.tmp.XXXXXX`, regular files) and nothing else: not another
 * target's temporaries, not near-miss names, not a symlink or a folder of the pattern. */
#include "lt.h"
#include "io_test.h"

static void touch(const char *dir, const char *name) {
  char p[256];
  iot_path(p, sizeof p, dir, name);
  iot_write(p, "x", 1);
}

static bool exists(const char *dir, const char *name) {
  char p[256];
  struct stat st;
  iot_path(p, sizeof p, dir, name);
  return lstat(p, &st) == 0;
}

LT_TEST(stale_temporaries_of_one_target_only) {
  char dir[64], path[128], p[256];
  iot_mkdtemp(dir, sizeof dir);
  iot_path(path, sizeof path, dir, "ck.safetensors");
  const char *gone[] = {"ck.safetensors.tmp.Ab3xY9", "ck.safetensors.tmp.ZZZZZZ"};
  const char *kept[] = {"ck.safetensors",           "ck.safetensors.tmp.Ab3xY",
                        "ck.safetensors.tmp.Ab3xY90", "ck.safetensors.tmp.Ab-xY9",
                        "model.safetensors.tmp.Ab3xY9", "xck.safetensors.tmp.Ab3xY9",
                        "ck.safetensors.tmpAb3xY9"};
  for (size_t i = 0; i < 2; i++) touch(dir, gone[i]);
  for (size_t i = 0; i < sizeof kept / sizeof kept[0]; i++) touch(dir, kept[i]);
  iot_path(p, sizeof p, dir, "ck.safetensors.tmp.Dir123");
  LT_EQ(mkdir(p, 0700), 0);
  iot_path(p, sizeof p, dir, "ck.safetensors.tmp.Lnk123");
  LT_EQ(symlink("ck.safetensors", p), 0);
  size_t removed = 99;
  LT_OK(loom_remove_stale_temporaries(path, &removed));
  LT_EQ(removed, 2);
  for (size_t i = 0; i < 2; i++) LT_TRUE(!exists(dir, gone[i]));
  for (size_t i = 0; i < sizeof kept / sizeof kept[0]; i++) LT_TRUE(exists(dir, kept[i]));
  LT_TRUE(exists(dir, "ck.safetensors.tmp.Dir123") && exists(dir, "ck.safetensors.tmp.Lnk123"));
  /* nothing left to do; a missing folder is an error */
  LT_OK(loom_remove_stale_temporaries(path, &removed));
  LT_EQ(removed, 0);
  LT_ERR(loom_remove_stale_temporaries("/nonexistent/x/ck", NULL), LOOM_ENOTFOUND,
         "cannot read folder '/nonexistent/x'");
  LT_ERR(loom_remove_stale_temporaries("", NULL), LOOM_EINVAL, "empty path");
  iot_path(p, sizeof p, dir, "ck.safetensors.tmp.Dir123");
  rmdir(p);
  iot_rmdir(dir);
}
