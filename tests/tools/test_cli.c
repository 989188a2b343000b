/* test_cli.c: the `loom` command's option parser: values of each kind, defaults, and a message
 * naming the option for every kind of bad input. */
#include "lt.h"
#include "cli.h"

#include <stdbool.h>
#include <stdio.h>

typedef struct opts {
  long epochs, seed;
  double lr;
  const char *amp, *save;
  bool no_shuffle;
} opts;

static opts o;
static const cli_option table[] = {
    {"epochs", CLI_POS_INT, &o.epochs, "N", "epochs to train", NULL},
    {"seed", CLI_INT, &o.seed, "N", "random seed", NULL},
    {"lr", CLI_POS_DOUBLE, &o.lr, "X", "learning rate", NULL},
    {"amp", CLI_CHOICE, &o.amp, NULL, "autocast dtype", "off|bf16|f16"},
    {"save", CLI_STRING, &o.save, "DIR", "checkpoint folder", NULL},
    {"no-shuffle", CLI_FLAG, &o.no_shuffle, NULL, "batches in file order", NULL},
    {0}};

static int parse(int argc, char **argv, const char *expect_in_stderr) {
  o = (opts){10, 0, 1e-3, "off", NULL, false};
  FILE *saved = stderr;
  char buf[512] = {0};
  FILE *mem = fmemopen(buf, sizeof buf - 1, "w");
  stderr = mem;
  int rc = cli_parse("loom train", table, argc, argv, NULL, 0, NULL);
  fclose(mem);
  stderr = saved;
  if (expect_in_stderr && !strstr(buf, expect_in_stderr))
    lt_fail_at(__FILE__, __LINE__, "stderr \"%s\" lacks \"%s\"", buf, expect_in_stderr);
  return rc;
}

LT_TEST(cli_parses_each_kind) {
  char *argv[] = {"--epochs", "3", "--lr=0.01", "--amp", "bf16", "--no-shuffle", "--seed", "-4",
                  "--save", "/tmp/x"};
  LT_EQ(parse(10, argv, NULL), 0);
  LT_EQ(o.epochs, 3);
  LT_NEAR(o.lr, 0.01, 1e-12);
  LT_STREQ(o.amp, "bf16");
  LT_TRUE(o.no_shuffle);
  LT_EQ(o.seed, -4);
  LT_STREQ(o.save, "/tmp/x");
  char *none[] = {NULL};
  LT_EQ(parse(0, none, NULL), 0);
  LT_EQ(o.epochs, 10); /* defaults stay */
  char *help[] = {"--help"};
  LT_EQ(parse(1, help, NULL), 1);
}

LT_TEST(cli_bad_options_are_named) {
  char *a1[] = {"--epochs", "zero"};
  LT_EQ(parse(2, a1, "--epochs: expected a positive integer, got 'zero'"), -1);
  char *a2[] = {"--epochs", "0"};
  LT_EQ(parse(2, a2, "--epochs: expected a positive integer"), -1);
  char *a3[] = {"--lr", "-1"};
  LT_EQ(parse(2, a3, "--lr: expected a positive number, got '-1'"), -1);
  char *a4[] = {"--amp", "fp8"};
  LT_EQ(parse(2, a4, "--amp: expected one of off|bf16|f16, got 'fp8'"), -1);
  char *a5[] = {"--bogus"};
  LT_EQ(parse(1, a5, "unknown option --bogus"), -1);
  char *a6[] = {"--epochs"};
  LT_EQ(parse(1, a6, "--epochs needs a value"), -1);
  char *a7[] = {"--no-shuffle=yes"};
  LT_EQ(parse(1, a7, "--no-shuffle takes no value"), -1);
  char *a8[] = {"stray"};
  LT_EQ(parse(1, a8, "unexpected argument 'stray'"), -1);
  char *a9[] = {"--lr", "nan"};
  LT_EQ(parse(2, a9, "--lr: expected a positive number"), -1);
}

LT_TEST(cli_help_lists_options_with_defaults) {
  o = (opts){10, 0, 1e-3, "off", NULL, false};
  char buf[2048] = {0};
  FILE *mem = fmemopen(buf, sizeof buf - 1, "w");
  cli_help(mem, "loom train", "[OPTIONS]", table);
  fclose(mem);
  LT_TRUE(strstr(buf, "--epochs N") != NULL);
  LT_TRUE(strstr(buf, "(default 10)") != NULL);
  LT_TRUE(strstr(buf, "--amp off|bf16|f16") != NULL);
  LT_TRUE(strstr(buf, "--help") != NULL);
}
