/* bench_args.h: the positional arguments of a benchmark, declared as a table and checked
 * before anything runs (the benchmarks take minutes): --help (or -h) prints the usage and ends
 * with 0; a number out of its range, a word not among its choices, an unknown option or one
 * argument too many is refused with a message naming the argument, ending with 2. Header-only,
 * for the benchmarks that `loom bench` runs and their standalone programs alike. */
#ifndef LOOM_BENCH_ARGS_H
#define LOOM_BENCH_ARGS_H

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct bench_arg {
  const char *name;    /* "ELEMENTS" */
  const char *help;    /* what it sets, with its default */
  const char *choices; /* "all|threads|mpi"; NULL: an integer in [min, max] */
  long long min, max;
} bench_arg;

/* The program as a user typed it: "loom bench convert" in the tool, "bench_convert" alone. */
#ifdef LOOM_TOOL
#define BENCH_PROG(name) "loom bench " name
#else
#define BENCH_PROG(name) "bench_" name
#endif

static inline int bench_arg_bad(const char *prog, const bench_arg *a, const char *v) {
  if (a->choices)
    fprintf(stderr, "%s: %s: expected one of %s, got '%s'\n", prog, a->name, a->choices, v);
  else
    fprintf(stderr, "%s: %s: expected an integer from %lld to %lld, got '%s'\n", prog, a->name,
            a->min, a->max, v);
  return 2;
}

/* One argument against its declaration: 0 or 2 after the message. */
static inline int bench_arg_check(const char *prog, const bench_arg *a, const char *v) {
  if (a->choices) {
    size_t n = strlen(v);
    for (const char *p = a->choices; *p;) {
      size_t len = strcspn(p, "|");
      if (len == n && strncmp(p, v, n) == 0) return 0;
      p += len + (p[len] == '|');
    }
    return bench_arg_bad(prog, a, v);
  }
  char *end = NULL;
  errno = 0;
  long long x = strtoll(v, &end, 10);
  if (end == v || *end || errno == ERANGE || x < a->min || x > a->max)
    return bench_arg_bad(prog, a, v);
  return 0;
}

/* Check argv[1..argc) against args (ending with a zeroed entry), about saying what the
 * benchmark measures. -1: go on; otherwise the exit code (0 after the help, 2 after a message). */
static inline int bench_args(const char *prog, const char *about, const bench_arg *args,
                             int argc, char **argv) {
  int n = 0;
  while (args[n].name) n++;
  for (int i = 1; i < argc; i++)
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      printf("usage: %s", prog);
      for (int k = 0; k < n; k++) printf(" [%s", args[k].name);
      for (int k = 0; k < n; k++) printf("]");
      printf("\n\n%s\n\narguments (each needs the ones before it):\n", about);
      for (int k = 0; k < n; k++) {
        char range[64];
        if (args[k].choices) snprintf(range, sizeof range, "%s", args[k].choices);
        else snprintf(range, sizeof range, "%lld to %lld", args[k].min, args[k].max);
        printf("  %-12s %s; %s\n", args[k].name, args[k].help, range);
      }
      return 0;
    }
  for (int i = 1; i < argc; i++) {
    if (strncmp(argv[i], "--", 2) == 0) {
      fprintf(stderr, "%s: unknown option %s (see %s --help)\n", prog, argv[i], prog);
      return 2;
    }
    if (i > n) {
      fprintf(stderr, "%s: unexpected argument '%s': it takes at most %d (see %s --help)\n",
              prog, argv[i], n, prog);
      return 2;
    }
    if (bench_arg_check(prog, &args[i - 1], argv[i])) return 2;
  }
  return -1;
}

#endif
