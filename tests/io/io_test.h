/* io_test.h: helpers shared by the io tests: a private temporary folder, whole-file read and
 * write, counting what a folder holds (to prove no temporary file is left behind), building
 * safetensors and IDX images byte by byte, and running a call that might hang in a child
 * process with a time limit. */
#ifndef LOOM_IO_TEST_H
#define LOOM_IO_TEST_H

#include "loom/loom.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
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

/* A safetensors image: 8-byte little-endian length + json + data, malloc'd. */
static inline unsigned char *iot_st_build(const char *json, const void *data, size_t dlen,
                                          size_t *size) {
  uint64_t n = strlen(json);
  *size = 8 + n + dlen;
  unsigned char *b = malloc(*size + 1);
  memcpy(b, &n, 8);
  memcpy(b + 8, json, n);
  if (dlen) memcpy(b + 8 + n, data, dlen);
  return b;
}

static inline void iot_be32(unsigned char *p, uint32_t v) {
  p[0] = (unsigned char)(v >> 24), p[1] = (unsigned char)(v >> 16), p[2] = (unsigned char)(v >> 8),
  p[3] = (unsigned char)v;
}

/* An IDX image: magic, dims, then `data` (already big-endian). */
static inline size_t iot_make_idx(unsigned char *out, int type, int ndim, const uint32_t *dims,
                                  const void *data, size_t dlen) {
  out[0] = out[1] = 0, out[2] = (unsigned char)type, out[3] = (unsigned char)ndim;
  for (int i = 0; i < ndim; i++) iot_be32(out + 4 + 4 * i, dims[i]);
  if (dlen) memcpy(out + 4 + 4 * ndim, data, dlen);
  return 4 + 4 * (size_t)ndim + dlen;
}

static inline double iot_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Run fn(arg) in a child process: its return value (0-255) as the child's exit code, or -1 if
 * it had not finished after `seconds` (the child is then killed) or died of a signal. So a
 * call that blocks forever fails the test instead of hanging the suite. */
static inline int iot_run_limited(int (*fn)(void *), void *arg, double seconds) {
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) _exit(fn(arg) & 0xff);
  double end = iot_now() + seconds;
  int status = 0;
  for (;;) {
    pid_t w = waitpid(pid, &status, WNOHANG);
    if (w == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    if (w < 0 || iot_now() > end) break;
    usleep(10000);
  }
  kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  return -1;
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
