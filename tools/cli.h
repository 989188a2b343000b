/* cli.h: the option parser of the `loom` command. A subcommand declares its options as a table
 * (name, kind, where to store, help, for numbers the accepted range, and how the ranks of a
 * run compare it); cli_parse fills them from argv, cli_help prints the table and
 * cli_value_text gives an option's value as text. A bad option gets a message that names it
 * ("loom train: --epochs: expected a positive integer, got 'x'"; "--epochs: expected at most
 * 1000000, got '4611686018427387904'"), never an exit from inside the parser. */
#ifndef LOOM_TOOLS_CLI_H
#define LOOM_TOOLS_CLI_H

#include <stdbool.h>
#include <stdio.h>

typedef enum cli_kind {
  CLI_FLAG,    /* bool, no value */
  CLI_INT,     /* long, --x N */
  CLI_POS_INT, /* long > 0 */
  CLI_DOUBLE,  /* double: finite (no NaN, inf or out-of-range literal) */
  CLI_POS_DOUBLE,
  CLI_F32,     /* double that is used as an f32: finite in f32, and not a nonzero value that
                * rounds to 0 in f32 ("1e-320"); "inf", "1e39" are refused by name */
  CLI_STRING,  /* const char * (points into argv) */
  CLI_CHOICE,  /* const char *, one of `choices` ("a|b|c") */
} cli_kind;

typedef struct cli_option {
  const char *name; /* without the dashes: "epochs" */
  cli_kind kind;
  void *value;
  const char *arg;     /* placeholder in the help: "N", "FILE" */
  const char *help;
  const char *choices; /* CLI_CHOICE: "off|bf16|f16" */
  /* Numeric kinds: the accepted range [min, max], used when min < max (integers exact up to
   * 2^53). Both 0: only the kind's own range. */
  double min, max;
  bool *seen; /* optional: set to true when the option is given */
  /* How the ranks of a multi-rank run compare this option (train_cli_fingerprint): by value
   * (the default, so a new option is compared), by presence alone, by the contents of the file
   * it names, or not at all (rank-local). */
  enum { CLI_RANKS_SAME, CLI_RANKS_PRESENCE, CLI_RANKS_CONTENTS, CLI_RANKS_LOCAL } ranks;
} cli_option;

/* Parse argv[0..argc) (argv[0] is the first option, not the program). Positional arguments
 * are stored in positional[] (up to max_positional; *npositional set). Returns 0, 1 if --help
 * was given (help printed to stdout), or -1 after printing an error naming the option to stderr. */
int cli_parse(const char *cmd, const cli_option *opts, int argc, char **argv,
              const char **positional, int max_positional, int *npositional);

/* After a successful cli_parse of the same argv: for each option of opts (in table order) the
 * value as argv wrote it into text[i] ("1e-3"; "" for a flag), NULL when argv does not give it;
 * the last occurrence wins. text holds one entry per option of opts. */
void cli_given(const cli_option *opts, int argc, char **argv, const char **text);

/* A number in the shortest form that reads back the same, without an exponent when one is
 * not needed ("300", "0.001", "1e-07"). */
void cli_number_text(double x, char *buf, size_t cap);

/* The option's current value as a user writes it ("0.001", "adamw", "yes" or "no" for a flag;
 * numbers in their shortest form that reads back the same), "" for an unset string. */
void cli_value_text(const cli_option *o, char *buf, size_t cap);

/* Print "usage" and the options table, with each option's default taken from its value: after
 * the help, or where the help says "{default}" ("(default {default}; gpt: 8)", for an option
 * whose default another option changes). A number outside the option's own range (0 for
 * --shard-size, which takes 1 and up) is no default and is not printed. */
void cli_help(FILE *f, const char *cmd, const char *usage, const cli_option *opts);
/* The same for the options named in only[] (NULL-terminated) alone: the others are accepted
 * but not listed (loom plan: the options of loom train that change nothing in a plan). */
void cli_help_only(FILE *f, const char *cmd, const char *usage, const cli_option *opts,
                   const char *const *only);

#endif
