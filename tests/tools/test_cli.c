/* test_cli.c: the `loom` command's option parser: values of each kind, defaults, and a message
 * naming the option for every kind of bad input (and the bound, for a number out of range). */
#include "lt.h"
#include "cli.h"

#include <stdbool.h>
#include <stdio.h>

typedef struct opts {
  long epochs, seed, limit;
  double lr, wd;
  const char *amp, *save;
  bool no_shuffle, seen_lr, seen_save;
} opts;

static opts o;
static const cli_option table[] = {
    {"epochs", CLI_POS_INT, &o.epochs, "N", "epochs to train", NULL, 0, 0, NULL, CLI_RANKS_SAME},
    {"seed", CLI_INT, &o.seed, "N", "random seed", NULL, 0, 0, NULL, CLI_RANKS_SAME},
    {"lr", CLI_POS_DOUBLE, &o.lr, "X", "learning rate", NULL, 0, 0, &o.seen_lr, CLI_RANKS_SAME},
    {"amp", CLI_CHOICE, &o.amp, NULL, "autocast dtype", "off|bf16|f16", 0, 0, NULL, CLI_RANKS_SAME},
    {"save", CLI_STRING, &o.save, "DIR", "checkpoint folder", NULL, 0, 0, &o.seen_save, CLI_RANKS_SAME},
    {"no-shuffle", CLI_FLAG, &o.no_shuffle, NULL, "batches in file order", NULL, 0, 0, NULL, CLI_RANKS_SAME},
    {"limit", CLI_INT, &o.limit, "N", "samples", NULL, 0, 1000, NULL, CLI_RANKS_SAME},
    {"wd", CLI_F32, &o.wd, "X", "weight decay", NULL, 0, 10, NULL, CLI_RANKS_SAME},
    {0}};

static int parse(int argc, char **argv, const char *expect_in_stderr) {
  o = (opts){.epochs = 10, .lr = 1e-3, .amp = "off"};
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

/* A typo gets the option it most likely meant; a name near none gets no guess. */
LT_TEST(cli_unknown_options_suggest_the_nearest) {
  char *a1[] = {"--epoch", "1"}; /* a letter missing */
  LT_EQ(parse(2, a1, "unknown option --epoch: did you mean --epochs?"), -1);
  char *a2[] = {"--no-shufle"};
  LT_EQ(parse(1, a2, "unknown option --no-shufle: did you mean --no-shuffle?"), -1);
  char *a3[] = {"--aMp", "bf16"}; /* a wrong letter */
  LT_EQ(parse(2, a3, "did you mean --amp?"), -1);
  char *a4[] = {"--sede=3"}; /* two neighbours swapped */
  LT_EQ(parse(1, a4, "unknown option --sede: did you mean --seed?"), -1);
  char *a5[] = {"--no-sh"}; /* the start of one option alone */
  LT_EQ(parse(1, a5, "did you mean --no-shuffle?"), -1);
  char *a6[] = {"--ranks", "2"}; /* near none of the table */
  LT_EQ(parse(2, a6, "unknown option --ranks (see loom train --help)"), -1);
  char *a7[] = {"--x"};
  LT_EQ(parse(1, a7, "unknown option --x (see"), -1);
}

/* "--lr --epochs 3": the value is missing, and the message says so rather than that
 * "--epochs" is not a number; a string option takes a value that starts with "--". */
LT_TEST(cli_a_forgotten_value_is_named) {
  char *a1[] = {"--lr", "--epochs", "3"};
  LT_EQ(parse(3, a1, "--lr needs a value (X), but is followed by the option --epochs"), -1);
  char *a2[] = {"--amp", "--no-shuffle"};
  LT_EQ(parse(2, a2, "--amp needs a value (off|bf16|f16), but is followed by the option --no-shuffle"), -1);
  char *a3[] = {"--save", "--epochs"}; /* a folder may be called so */
  LT_EQ(parse(2, a3, NULL), 0);
  LT_STREQ(o.save, "--epochs");
  char *a4[] = {"--lr", "--bogus"}; /* not an option either: the value's own message */
  LT_EQ(parse(2, a4, "--lr: expected a positive number, got '--bogus'"), -1);
}

LT_TEST(cli_help_lists_options_with_defaults) {
  o = (opts){.epochs = 10, .lr = 1e-3, .amp = "off"};
  char buf[2048] = {0};
  FILE *mem = fmemopen(buf, sizeof buf - 1, "w");
  cli_help(mem, "loom train", "[OPTIONS]", table);
  fclose(mem);
  LT_TRUE(strstr(buf, "--epochs N") != NULL);
  LT_TRUE(strstr(buf, "(default 10)") != NULL);
  LT_TRUE(strstr(buf, "--amp off|bf16|f16") != NULL);
  LT_TRUE(strstr(buf, "--help") != NULL);
}

LT_TEST(cli_ranges_name_the_bound) {
  char *a1[] = {"--limit", "1001"};
  LT_EQ(parse(2, a1, "--limit: expected at most 1000, got '1001'"), -1);
  char *a2[] = {"--limit", "-1"};
  LT_EQ(parse(2, a2, "--limit: expected an integer >= 0, got '-1'"), -1);
  char *a3[] = {"--limit", "99999999999999999999"}; /* beyond long: still the table's bound */
  LT_EQ(parse(2, a3, "--limit: expected at most 1000, got '99999999999999999999'"), -1);
  char *a4[] = {"--seed", "99999999999999999999"}; /* no range: long's own */
  LT_EQ(parse(2, a4, "--seed: expected at most 9223372036854775807"), -1);
  char *a5[] = {"--limit", "1000", "--wd", "10"};
  LT_EQ(parse(4, a5, NULL), 0);
  LT_EQ(o.limit, 1000);
  char *a6[] = {"--wd", "10.5"};
  LT_EQ(parse(2, a6, "--wd: expected at most 10, got '10.5'"), -1);
  char *a7[] = {"--wd", "-0.5"};
  LT_EQ(parse(2, a7, "--wd: expected a number >= 0, got '-0.5'"), -1);
}

LT_TEST(cli_f32_values_must_fit_an_f32) {
  char *a1[] = {"--wd", "inf"};
  LT_EQ(parse(2, a1, "--wd: expected a finite number within the f32 range"), -1);
  char *a2[] = {"--wd", "1e39"}; /* finite as a double, inf as an f32 */
  LT_EQ(parse(2, a2, "magnitude at most 3.40282347e+38), got '1e39'"), -1);
  char *a3[] = {"--wd", "1e-320"}; /* a double subnormal, 0 as an f32 */
  LT_EQ(parse(2, a3, "--wd: '1e-320' is too small for an f32: it would round to 0"), -1);
  char *a4[] = {"--wd", "1e-45"}; /* an f32 subnormal: kept */
  LT_EQ(parse(2, a4, NULL), 0);
  LT_TRUE(o.wd > 0 && (float)o.wd > 0);
  char *a5[] = {"--wd", "0"};
  LT_EQ(parse(2, a5, NULL), 0);
  char *a6[] = {"--lr", "1e400"}; /* a plain double: out of range is refused too */
  LT_EQ(parse(2, a6, "--lr: expected a finite number within the double range, got '1e400'"), -1);
}

LT_TEST(cli_seen_marks_given_options) {
  char *a1[] = {"--lr", "0.001"}; /* the default's value, given: seen all the same */
  LT_EQ(parse(2, a1, NULL), 0);
  LT_TRUE(o.seen_lr);
  LT_TRUE(!o.seen_save);
  char *a2[] = {"--save=/tmp/x"};
  LT_EQ(parse(1, a2, NULL), 0);
  LT_TRUE(o.seen_save && !o.seen_lr);
}

/* An option whose default another option changes says both ("(default 256; gpt: 8)", the
 * value from the table); a number outside the option's own range is no default and is not
 * printed (--shard-size's 0: it takes 1 and up). */
LT_TEST(cli_help_places_the_default_and_hides_an_unset_one) {
  long batch = 256, shard = 0;
  const cli_option t[] = {
      {"batch", CLI_POS_INT, &batch, "N", "samples per step (default {default}; gpt: 8)", NULL, 1, 1000, NULL, CLI_RANKS_SAME},
      {"shard-size", CLI_POS_INT, &shard, "N", "ranks per copy", NULL, 1, 64, NULL, CLI_RANKS_SAME},
      {0}};
  char buf[1024] = {0};
  FILE *mem = fmemopen(buf, sizeof buf - 1, "w");
  cli_help(mem, "loom train", "[OPTIONS]", t);
  fclose(mem);
  LT_TRUE(strstr(buf, "samples per step (default 256; gpt: 8)\n") != NULL);
  LT_TRUE(strstr(buf, "(default 256; gpt: 8) (default") == NULL); /* once */
  LT_TRUE(strstr(buf, "ranks per copy\n") != NULL);                 /* no "(default 0)" */
}
