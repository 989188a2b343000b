/* io_test.h: helpers shared by the io tests: a private temporary folder, whole-file read and
 * write, and counting what a folder holds (to prove no temporary file is left behind). */
#ifndef LOOM_IO_TEST_H
#define LOOM_IO_TEST_H

#include "loom/loom.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A new empty folder under /tmp (static buffer per call site is the caller's). */
static inline void iot_mkdtemp(char *dir, size_t cap) {
  snprintf(dir, cap, "/tmp/loom_io_XXXXXX");
  if (!mkdtemp(dir)) dir[0] = 0;
}

static inline void iot_path(char *out, size_t cap, const char *dir, const char *name) {
  snprintf(out, cap, "%s/%s", dir, name);
}

static inline int iot_write(const char *path, const void *buf, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f) return -1;
  size_t w = n ? fwrite(buf, 1, n, f) : 0;
  fclose(f);
  return w == n ? 0 : -1;
}

/* The whole file, malloc'd (caller frees); NULL if it cannot be read. */
static inline unsigned char *iot_read(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *b = malloc((size_t)len + 1);
  *n = fread(b, 1, (size_t)len, f);
  fclose(f);
  return b;
}

/* Number of entries in a folder other than . and .. */
static inline int iot_count(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return -1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
  closedir(d);
  return n;
}

/* Remove the folder and the files in it. */
static inline void iot_rmdir(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  char p[512];
  while ((e = readdir(d)))
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
      snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
      unlink(p);
    }
  closedir(d);
  rmdir(dir);
}

/* Bytes held by every loom pool (OOM sweeps check that a failed call frees what it took). */
static inline size_t iot_pool_bytes(void) {
  size_t sum = 0;
  for (int p = 0; p < LOOM_POOL_COUNT; p++) {
    loom_pool_stats s;
    loom_mem_stats((loom_pool)p, &s);
    sum += s.current_bytes;
  }
  return sum;
}

#endif
