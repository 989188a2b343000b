/* loom.c: the `loom` command: checks loom's environment variables, finds the subcommand and
 * runs it, and fails (exit 1) if what it printed could not be written (a full disk, a closed
 * pipe: `loom train >/dev/full` must not exit 0). */
#include "commands.h"
#include "train_plan.h"

#include <loom/loom.h>

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct {
  const char *name, *summary;
  int (*fn)(int, char **);
} commands[] = {
    {"train", "train a classifier on Fashion-MNIST, or a GPT on text (loom train --help)", cmd_train},
    {"eval", "the test accuracy of a model loom train saved (loom eval --help)", cmd_eval},
    {"generate", "continue a text with a GPT loom train saved (loom generate --help)", cmd_generate},
    {"plan", "the memory a loom train run will need, per rank and for the process (loom plan --help)", cmd_plan},
    {"bench", "run a benchmark (loom bench --help lists them)", cmd_bench},
    {"plot", "draw the metrics of loom train runs as an SVG (loom plot --help)", cmd_plot},
};

static void usage(FILE *f) {
  fprintf(f, "usage: loom COMMAND [OPTIONS]\n\ncommands:\n");
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    fprintf(f, "  %-8s %s\n", commands[i].name, commands[i].summary);
  fprintf(f, "\n`loom COMMAND --help` describes a command's options; `loom --version` prints\n"
             "the version of the tool and of the library it runs with.\n");
}

/* The library ignores a value of LOOM_CPU or LOOM_ALLOC_CACHE_MB it cannot use (loom/cpu.h,
 * loom/alloc.h); the command refuses it instead, naming the variable. Unset or empty: the
 * default. 0, or 2 after the message. */
static int check_environment(void) {
  const char *cpu = getenv("LOOM_CPU");
  bool known = !cpu || !*cpu;
  for (int l = 0; l < LOOM_CPU_LEVEL_COUNT && !known; l++)
    known = strcmp(cpu, loom_cpu_level_name((loom_cpu_level)l)) == 0;
  if (!known) {
    fprintf(stderr, "loom: LOOM_CPU: expected scalar, avx2 or avx512 (a cap on the kernels' CPU "
            "level), got '%s'\n", cpu);
    return 2;
  }
  const char *mb = getenv("LOOM_ALLOC_CACHE_MB");
  if (mb && *mb) {
    char *end = NULL;
    errno = 0;
    unsigned long long v = mb[0] >= '0' && mb[0] <= '9' ? strtoull(mb, &end, 10) : 0;
    if (end == NULL || *end || errno || v > (SIZE_MAX >> 20)) {
      fprintf(stderr, "loom: LOOM_ALLOC_CACHE_MB: expected a whole number of MiB (0 turns the "
              "allocation cache off, at most %zu), got '%s'\n", SIZE_MAX >> 20, mb);
      return 2;
    }
  }
  return 0;
}

/* rc, or 1 if standard output could not take everything printed to it. */
static int flushed(int rc) {
  errno = 0;
  if (fflush(stdout) == 0 && !ferror(stdout)) return rc;
  fprintf(stderr, "loom: cannot write to standard output%s%s\n", errno ? ": " : "",
          errno ? strerror(errno) : "");
  return rc ? rc : 1;
}

int main(int argc, char **argv) {
  train_plan_note_base(); /* the runtime's base, before any of loom runs (loom plan) */
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
    usage(stdout);
    return flushed(0);
  }
  if (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "version") == 0) {
    /* the tool's own version (compiled in) and the library's (run time: a shared libloom may
     * be another build) */
    printf("loom %s (library %s)\n", LOOM_VERSION_STRING, loom_version());
    return flushed(0);
  }
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    if (strcmp(argv[1], commands[i].name) == 0) {
      int rc = check_environment();
      return flushed(rc ? rc : commands[i].fn(argc - 2, argv + 2));
    }
  fprintf(stderr, "loom: unknown command '%s'\n", argv[1]);
  usage(stderr);
  return 2;
}
