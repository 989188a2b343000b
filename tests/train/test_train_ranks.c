/* test_train_ranks.c: the ranks' fingerprint of a run (issue 24): every option of `loom
 * train`'s table that is not marked rank-local is compared across the ranks before the first
 * step, generated from the table (not listed here): two ranks (threads) whose command lines
 * differ in that one option are both refused at start, naming it and both values. A test-only
 * option added to the table is compared with no other change. --init is compared by the
 * file's contents (different files refused, one rank only refused, one file under two paths
 * accepted), --save by its presence. (The same walk through the mpi backend:
 * mpi/test_train_mpi_ranks.c; through the real binary under mpiexec: tests/tools/mpi_ranks.sh.) */
#include "lt.h"
#include "ranks_side.h"
#include "train_test.h"

#include <loom/dist.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Two ranks as threads, rank r with options o[r]: each one's status and message. */
typedef struct two {
  const train_opts *o[2];
  int rc[2];
  char msg[2][1024];
} two;

static int rank_main(loom_pg *pg, void *arg) {
  two *t = arg;
  int r = loom_pg_rank(pg);
  t->rc[r] = train_run(t->o[r], pg);
  if (t->rc[r]) snprintf(t->msg[r], sizeof t->msg[r], "%s", train_last_error());
  return t->rc[r];
}

/* Run rank 0 with the checked options of the base line and a's fingerprint, rank 1 with the
 * same options and b's fingerprint (and --init init1 if given); true when both ranks are
 * refused with a message holding want. */
static bool refused(const ranks_side *a, const ranks_side *b, const char *init0, const char *init1,
                    const char *want) {
  static ranks_side ok; /* the base line, checked (the folders normalised, the scaler filled) */
  if (ranks_side_base(&ok)) return false;
  train_opts o[2] = {ok.o, ok.o};
  o[0].ranks_fp = a->fp, o[0].nranks_fp = a->o.nranks_fp, o[0].init = init0;
  o[1].ranks_fp = b->fp, o[1].nranks_fp = b->o.nranks_fp, o[1].init = init1;
  two t = {.o = {&o[0], &o[1]}};
  loom_pg_cfg cfg = loom_pg_cfg_default();
  int rc = loom_threads_run(2, &cfg, rank_main, &t);
  bool ok_both = rc && t.rc[0] && t.rc[1] && strstr(t.msg[0], want) && strstr(t.msg[1], want);
  if (!ok_both)
    fprintf(stderr, "want '%s'\n  rank 0: %d %s\n  rank 1: %d %s\n", want, t.rc[0], t.msg[0],
            t.rc[1], t.msg[1]);
  return ok_both;
}

/* Every non-rank-local option of the table, one at a time: rank 1 gives it another value
 * (a flag: gives it; a string: names an existing file), rank 0 does not. */
LT_TEST(train_ranks_differing_in_any_option_of_the_table_are_refused_naming_it) {
  const char *d = tt_tempdir();
  char file[512];
  snprintf(file, sizeof file, "%s/some-file", d);
  LT_EQ(tt_write_file(file, "x", 1), 0);
  static ranks_side a, b;
  LT_EQ(ranks_side_parse(&a, NULL, 0, NULL), 0);
  int compared = 0, local = 0;
  for (int i = 0; a.table[i].name; i++) {
    const cli_option *t = &a.table[i];
    if (t->ranks == CLI_RANKS_LOCAL) {
      local++;
      continue;
    }
    ranks_case c;
    ranks_side_case(t, file, &c);
    LT_EQ(ranks_side_parse(&b, c.extra, c.nextra, NULL), 0);
    if (!refused(&a, &b, NULL, NULL, c.want))
      lt_fail_at(__FILE__, __LINE__, "%s %s on rank 1 only was not refused naming it", c.flag,
                 c.value);
    compared++;
  }
  LT_EQ(local, 5); /* --quiet, --progress, --metrics, --offload-dir, --offload-io-threads */
  LT_TRUE(compared >= 35);
  tt_cleanup();
}

/* A new option in the table is compared with no other change. */
LT_TEST(train_ranks_compare_an_option_added_to_the_table) {
  static long dummy_a, dummy_b; /* each side's value */
  cli_option more = {"test-only", CLI_INT, &dummy_a, "N", "an option of this test", NULL, 0, 0,
                     NULL, CLI_RANKS_SAME};
  static ranks_side a, b;
  const char *extra[2] = {"--test-only", "7"};
  LT_EQ(ranks_side_parse(&a, NULL, 0, &more), 0);
  more.value = &dummy_b;
  LT_EQ(ranks_side_parse(&b, extra, 2, &more), 0);
  LT_TRUE(refused(&a, &b, NULL, NULL,
                  "the ranks disagree: rank 1 has --test-only 7, rank 0 has --test-only 0 "
                  "(every rank must be started with the same options)"));
}

/* --init by contents: two models (seeds 1 and 2) refused, one rank only refused, the same file
 * under two paths the same entry; --save on one rank only refused. */
LT_TEST(train_ranks_compare_init_by_contents_and_save_by_presence) {
  const char *d = tt_tempdir();
  const char *common = "--hidden 8 --limit 64 --batch 8 --epochs 1 --threads 1 --quiet";
  tt_run r1 = tt_train("%s --seed 1 --save %s/s1", common, d);
  tt_run r2 = tt_train("%s --seed 2 --save %s/s2", common, d);
  LT_EQ(r1.rc, 0);
  LT_EQ(r2.rc, 0);
  tt_run_free(&r1);
  tt_run_free(&r2);
  char f1[512], f2[512], copy[512], save[512];
  snprintf(f1, sizeof f1, "%s/s1/model.safetensors", d);
  snprintf(f2, sizeof f2, "%s/s2/model.safetensors", d);
  snprintf(copy, sizeof copy, "%s/copy.safetensors", d);
  snprintf(save, sizeof save, "%s/ck", d);
  LT_EQ(tt_copy_file(f1, copy), 0);
  static ranks_side a, b, c, none, s;
  const char *x1[2] = {"--init", f1}, *x2[2] = {"--init", f2}, *xc[2] = {"--init", copy};
  const char *xs[2] = {"--save", save};
  LT_EQ(ranks_side_parse(&a, x1, 2, NULL), 0);
  LT_EQ(ranks_side_parse(&b, x2, 2, NULL), 0);
  LT_EQ(ranks_side_parse(&c, xc, 2, NULL), 0);
  LT_EQ(ranks_side_parse(&none, NULL, 0, NULL), 0);
  LT_EQ(ranks_side_parse(&s, xs, 2, NULL), 0);
  char want[1200];
  snprintf(want, sizeof want, "the ranks disagree: rank 1 has --init %s (bytes", f2);
  LT_TRUE(refused(&a, &b, f1, f2, want));
  snprintf(want, sizeof want, "the ranks disagree: rank 1 has --init %s (bytes", f1);
  LT_TRUE(refused(&none, &a, NULL, f1, want));
  LT_TRUE(refused(&a, &none, f1, NULL, ", rank 0 has --init "));
  /* the same bytes under another path: the same compared value */
  int k = 0;
  while (k < a.o.nranks_fp && strcmp(a.fp[k].shown, "") && strncmp(a.fp[k].shown, "--init ", 7))
    k++;
  LT_TRUE(k < a.o.nranks_fp);
  LT_STREQ(a.fp[k].value, c.fp[k].value);
  LT_TRUE(strcmp(a.fp[k].value, b.fp[k].value) != 0);
  snprintf(want, sizeof want, "the ranks disagree: rank 1 has --save %s, rank 0 has no --save",
           save);
  LT_TRUE(refused(&none, &s, NULL, NULL, want));
  tt_cleanup();
}
