/* loom.c: the `loom` command: finds the subcommand and runs it. */
#include "commands.h"

#include <loom/loom.h>
#include <stdio.h>
#include <string.h>

static const struct {
  const char *name, *summary;
  int (*fn)(int, char **);
} commands[] = {
    {"train", "train a classifier on Fashion-MNIST (loom train --help)", cmd_train},
    {"bench", "run a benchmark (loom bench --help lists them)", cmd_bench},
};

static void usage(FILE *f) {
  fprintf(f, "usage: loom COMMAND [OPTIONS]\n\ncommands:\n");
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    fprintf(f, "  %-8s %s\n", commands[i].name, commands[i].summary);
  fprintf(f, "\n`loom COMMAND --help` describes a command's options.\n");
}

int main(int argc, char **argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
    usage(stdout);
    return 0;
  }
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    if (strcmp(argv[1], commands[i].name) == 0) return commands[i].fn(argc - 2, argv + 2);
  fprintf(stderr, "loom: unknown command '%s'\n", argv[1]);
  usage(stderr);
  return 2;
}
