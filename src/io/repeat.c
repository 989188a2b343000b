/* repeat.c: finding a repeated string (a tensor name or metadata key given twice) by sorting,
 * O(n log n), so a header with many keys costs no more than reading it. */
#include "io/io_int.h"

#include <stdlib.h>
#include <string.h>

static int by_string(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

const char *loom__sort_find_repeat(const char **s, size_t n) {
  if (n < 2) return NULL;
  qsort(s, n, sizeof *s, by_string);
  for (size_t i = 1; i < n; i++)
    if (strcmp(s[i - 1], s[i]) == 0) return s[i];
  return NULL;
}
