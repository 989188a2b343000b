/* test_train_mpi_ranks.c: the ranks' fingerprint of `loom train` through the mpi backend
 * (issue 24), under mpiexec -n 2. Walks the option table itself, as the threads test does
 * (../test_train_ranks.c): for every option not marked rank-local, rank 1 gives it another value
 * and rank 0 does not, and both ranks must be refused at start, naming it, through MPI's own
 * collectives. A test-only option appended to the table is walked too, so a new option is
 * covered with no other change. Prints "mpi ranks: N options compared, F failed"; the exit status
 * is non-zero on the rank that saw a failure. */
#include "ranks_side.h"

#include <loom/dist.h>
#include <loom/dist_mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static long test_only_value; /* the test-only option's value (parsed, then fingerprinted) */
static const cli_option test_only = {"test-only", CLI_INT, &test_only_value, "N",
                                     "an option of this test", NULL, 0, 0, NULL, CLI_RANKS_SAME};

/* A file rank 1 names for a string option (rank 0's path, the same machine or not: only rank
 * 1 names it, and only its contents' digest travels). */
static int make_file(char *path, size_t cap) {
  const char *tmp = getenv("TMPDIR");
  snprintf(path, cap, "%s/loom-mpi-ranks-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  int fd = mkstemp(path);
  if (fd < 0) return -1;
  int ok = write(fd, "x", 1) == 1;
  close(fd);
  return ok ? 0 : -1;
}

int main(void) {
  loom_pg_cfg cfg = loom_pg_cfg_default();
  cfg.timeout_s = 60; /* a rank that trained instead of refusing fails its peer, not hangs it */
  loom_pg *pg = NULL;
  int rc = loom_mpi_pg_create(NULL, &cfg, &pg);
  if (rc) {
    fprintf(stderr, "FAIL: loom_mpi_pg_create: %s\n", loom_status_name(rc));
    return 1;
  }
  int rank = loom_pg_rank(pg), size = loom_pg_size(pg);
  char file[512];
  static ranks_side ok, base, mine;
  long failed = 0, compared = 0, local = 0;
  if (size != 2) {
    fprintf(stderr, "FAIL: run with 2 ranks (mpiexec -n 2), not %d\n", size);
    failed++;
  } else if (make_file(file, sizeof file)) {
    fprintf(stderr, "FAIL: rank %d: cannot write a file under TMPDIR\n", rank);
    failed++;
  } else if (ranks_side_base(&ok) || ranks_side_parse(&base, NULL, 0, &test_only)) {
    fprintf(stderr, "FAIL: the base line was refused\n");
    failed++;
  }
  bool walked_test_only = false;
  for (int i = 0; !failed && base.table[i].name; i++) {
    const cli_option *t = &base.table[i];
    if (t->ranks == CLI_RANKS_LOCAL) {
      local++;
      continue;
    }
    ranks_case c;
    ranks_side_case(t, file, &c);
    if (ranks_side_parse(&mine, c.extra, rank == 1 ? c.nextra : 0, &test_only)) {
      fprintf(stderr, "FAIL: rank %d: %s %s refused by the parser\n", rank, c.flag, c.value);
      failed++;
      break;
    }
    train_opts o = ok.o; /* both ranks run the checked base line, each with its fingerprint */
    o.ranks = size;
    o.ranks_fp = mine.fp;
    o.nranks_fp = mine.o.nranks_fp;
    rc = train_run(&o, pg);
    if (!rc || !strstr(train_last_error(), c.want)) {
      fprintf(stderr, "FAIL: rank %d: with %s %s on rank 1 only: %s (want '%s')\n", rank, c.flag,
              c.value, rc ? train_last_error() : "trained", c.want);
      failed++;
      break; /* the ranks may now be out of step: stop walking */
    }
    compared++;
    walked_test_only |= strcmp(t->name, "test-only") == 0;
  }
  if (!failed && !walked_test_only) {
    fprintf(stderr, "FAIL: the test-only option was not compared\n");
    failed++;
  }
  if (!failed && (local != 5 || compared < 36)) { /* --quiet, --metrics, --offload-dir,
                                                   * --offload-io-threads, --progress */
    fprintf(stderr, "FAIL: %ld rank-local options (want 5), %ld compared\n", local, compared);
    failed++;
  }
  printf("mpi ranks: rank %d: %ld options compared, %ld failed\n", rank, compared, failed);
  unlink(file);
  if (failed) { /* a peer may wait in a collective: end the job */
    fflush(NULL);
    loom_mpi_abort(1);
  }
  loom_pg_free(pg);
  loom_mpi_finalize();
  return 0;
}
