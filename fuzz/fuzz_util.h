/* fuzz_util.h: what the libFuzzer harnesses share: the input as a file (an in-memory file,
 * memfd, named by /proc/self/fd/N, for the readers that take a path), and a bound on what a
 * harness allocates for a tensor the input declares. Header-only. */
#ifndef LOOM_FUZZ_UTIL_H
#define LOOM_FUZZ_UTIL_H

#define _GNU_SOURCE
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

#define FUZZ_MAX_ELEMS ((size_t)1 << 20) /* a harness reads tensors up to 4 MiB as f32 */

/* The bytes as a file: *fd (close it after) and its path in path[cap]; false on failure. */
static inline int fuzz_as_file(const uint8_t *data, size_t size, char *path, size_t cap) {
  int fd = memfd_create("loom-fuzz", 0);
  if (fd < 0) return -1;
  for (size_t done = 0; done < size;) {
    ssize_t w = write(fd, data + done, size - done);
    if (w <= 0) {
      close(fd);
      return -1;
    }
    done += (size_t)w;
  }
  snprintf(path, cap, "/proc/self/fd/%d", fd);
  return fd;
}

#endif
