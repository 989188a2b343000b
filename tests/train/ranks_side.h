/* ranks_side.h: one rank's side of the ranks' fingerprint tests (issue 24), shared by the
 * threads test (test_train_ranks.c) and the MPI program (mpi/test_train_mpi_ranks.c): a base
 * command line parsed with cli_parse, the fingerprint it gives, and for each option of the table
 * a value other than its current one, so the tests walk the table itself, never a hand list. */
#ifndef LOOM_TESTS_TRAIN_RANKS_SIDE_H
#define LOOM_TESTS_TRAIN_RANKS_SIDE_H

#include "train_api.h"
#include "train_opts.h"

#include <stdbool.h>
#include <stddef.h>

/* One rank's side: a command line parsed (cli_parse only) and its fingerprint. Large: make
 * it static. */
typedef struct ranks_side {
  train_opts o;
  train_cmdline c;
  double timeout;
  bool timeout_seen;
  cli_option table[TRAIN_CLI_MAX + 1];
  train_fp_entry fp[TRAIN_CLI_MAX + 1];
} ranks_side;

/* Parse the base line (valid for two ranks: DDP, a tiny MLP, 64 samples; the refusal comes
 * before the data) + extra[0..nextra), with the entry `more` appended to the table if not
 * NULL, into s, and fill its fingerprint; 0 on success, -1 if cli_parse refused. */
int ranks_side_parse(ranks_side *s, const char *const *extra, int nextra, const cli_option *more);

/* The base line parsed and checked (train_opts_check: folders normalised, scaler filled), the
 * options both ranks run with (each then given its own fingerprint); 0 on success. */
int ranks_side_base(ranks_side *s);

/* The case of option t: the arguments rank 1 adds (--NAME and a value other than the
 * current one: none for a flag, `file` for a string, the next choice, or a number moved within
 * the option's bounds) and the start of the refusal every rank must give ("the ranks disagree:
 * rank 1 has --NAME ", ", " after a flag's name). */
typedef struct ranks_case {
  char flag[64], value[600], want[128];
  const char *extra[2]; /* flag, value: rank 1's extra arguments */
  int nextra;           /* 1 for a flag, 2 otherwise */
} ranks_case;
void ranks_side_case(const cli_option *t, const char *file, ranks_case *c);

#endif
