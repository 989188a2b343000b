/* test_tool_metrics_signals.c: `loom train` as a process, for what must never wait on anyone:
 * --metrics to a FIFO with no reader is refused at once (it used to wait for a reader), a
 * FIFO whose reader never reads neither slows the run nor holds up SIGTERM (it used to block
 * in its write and ignore SIGINT / SIGTERM), and SIGHUP stops an FSDP run with disk offload as
 * SIGTERM does: a message, exit 129, a checkpoint the next run resumes from, no offload file
 * and no temporary left (it used to die with no message, leaving both). A reader that goes
 * away ends the records, not the run (no SIGPIPE). Every run is bounded (tool_run.h). */
#define _GNU_SOURCE /* F_SETPIPE_SZ */
#include "lt.h"
#include "lt_tree.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include "tool_run.h"

/* A new folder under /tmp, and the path of a FIFO in it (made unless fifo is NULL). */
static void scratch(char *dir, size_t cap, char *fifo, size_t fcap) {
  snprintf(dir, cap, "/tmp/loom-metrics-sig-XXXXXX");
  LT_TRUE(mkdtemp(dir) != NULL);
  if (!fifo) return;
  snprintf(fifo, fcap, "%s/m.fifo", dir);
  LT_EQ(mkfifo(fifo, 0600), 0);
}

/* A reader of the FIFO that reads nothing yet, its pipe shrunk to one page (the smallest: full
 * after a few records). */
static int small_reader(const char *fifo) {
  int fd = open(fifo, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  LT_TRUE(fd >= 0);
  fcntl(fd, F_SETPIPE_SZ, 4096);
  return fd;
}

/* Print a run that did not go as wanted. */
static void show(const char *what, const tool_run *r) {
  fprintf(stderr, "%s: exit %d\nstdout: %.2000s\nstderr: %s\n", what, r->code, r->out, r->err);
}

/* A run of args that resumes (its checkpoint loads: CRC, counters, values) and ends at once
 * (--max-steps 1 is behind any checkpoint). */
static void resumes(const char *const *args) {
  tool_run r = tool_loom(args, NULL, NULL);
  if (r.code != 0) show("resume", &r);
  LT_EQ(r.code, 0);
  LT_TRUE(strstr(r.out, "resuming at step") != NULL);
  tool_run_free(&r);
}

/* Run args, send sig once `when` exists, and check the clean stop: exit 128 + sig, the
 * message, the checkpoint intact. The caller frees the run. */
static tool_run stops_cleanly(const char *const *args, const char *when, int sig) {
  tool_run r = tool_loom_signal(args, NULL, NULL, when, sig);
  bool clean = r.code == 128 + sig && strstr(r.err, "interrupted before step") &&
               strstr(r.err, "the last checkpoint written is intact");
  if (!clean) show("signalled run", &r);
  LT_EQ(r.code, 128 + sig);
  LT_TRUE(clean);
  return r;
}

LT_TEST(tool_metrics_fifo_without_reader_is_refused_at_once) {
  char dir[64], fifo[96];
  scratch(dir, sizeof dir, fifo, sizeof fifo);
  const char *args[] = {"train", "--hidden", "8", "--limit", "64", "--batch", "32", "--epochs",
                        "1", "--threads", "1", "--metrics", fifo, NULL};
  tool_run r = tool_loom(args, NULL, NULL);
  if (r.code != 1 || !strstr(r.err, "a FIFO with no reader")) show("no reader", &r);
  LT_EQ(r.code, 1);
  LT_TRUE(strstr(r.err, "a FIFO with no reader: start the reader first") != NULL);
  tool_run_free(&r);
  lt_tree_walk(dir, NULL, true);
}

/* A reader that opens the FIFO and never reads (its pipe shrunk to one page, full after a few
 * records): the run goes on at full speed, SIGTERM stops it as without --metrics (exit 143, the
 * message, the checkpoint resumes), and the dropped records are counted. */
LT_TEST(tool_metrics_slow_reader_never_blocks_a_signal) {
  char dir[64], fifo[96], ck[96], saved[128];
  scratch(dir, sizeof dir, fifo, sizeof fifo);
  int reader = small_reader(fifo);
  snprintf(ck, sizeof ck, "%s/ck", dir);
  snprintf(saved, sizeof saved, "%s/checkpoint.safetensors", ck);
  const char *args[] = {"train", "--hidden", "8", "--limit", "512", "--batch", "32", "--epochs",
                        "100000", "--threads", "1", "--metrics", fifo, "--save", ck, NULL};
  tool_run r = stops_cleanly(args, saved, SIGTERM);
  LT_TRUE(strstr(r.err, "records dropped: the reader did not keep up") != NULL);
  close(reader);
  const char *again[] = {"train", "--hidden", "8", "--limit", "512", "--batch", "32",
                         "--epochs", "100000", "--threads", "1", "--resume", ck, "--max-steps",
                         "1", NULL};
  tool_run_free(&r);
  resumes(again);
  LT_EQ(lt_tree_walk(dir, ".tmp.", false), 0);
  lt_tree_walk(dir, NULL, true);
}

/* A reader that takes the first bytes and closes its end (bounded: 60 s at most). */
static void *read_then_leave(void *arg) {
  int fd = *(int *)arg;
  struct pollfd p = {.fd = fd, .events = POLLIN};
  char buf[64];
  if (poll(&p, 1, 60000) == 1) (void)!read(fd, buf, sizeof buf);
  close(fd);
  return NULL;
}

LT_TEST(tool_metrics_reader_that_goes_away_ends_the_records_not_the_run) {
  char dir[64], fifo[96];
  scratch(dir, sizeof dir, fifo, sizeof fifo);
  int reader = small_reader(fifo); /* full after a few records, had it not left */
  pthread_t t;
  LT_EQ(pthread_create(&t, NULL, read_then_leave, &reader), 0);
  const char *args[] = {"train", "--hidden", "8", "--limit", "512", "--batch", "32", "--epochs",
                        "5", "--threads", "1", "--metrics", fifo, NULL};
  tool_run r = tool_loom(args, NULL, NULL);
  pthread_join(t, NULL);
  if (r.code != 0 || !strstr(r.err, "the reader went away")) show("reader gone", &r);
  LT_EQ(r.code, 0);
  LT_TRUE(strstr(r.out, "test accuracy") != NULL);
  LT_TRUE(strstr(r.err, "the reader went away: the records from step") != NULL);
  tool_run_free(&r);
  lt_tree_walk(dir, NULL, true);
}

/* SIGHUP (a closed terminal) during an FSDP run over 2 ranks with every kind of state offloaded
 * to disk: SIGTERM's clean stop. */
LT_TEST(tool_sighup_stops_an_fsdp_run_cleanly) {
  char dir[64], off[96], ck[96], index[160];
  scratch(dir, sizeof dir, NULL, 0);
  snprintf(off, sizeof off, "%s/offload", dir);
  LT_EQ(mkdir(off, 0700), 0);
  snprintf(ck, sizeof ck, "%s/ck", dir); /* the index: the end of the first sharded save */
  snprintf(index, sizeof index, "%s/fsdp/fsdp-index.safetensors", ck);
  const char *args[] = {"train", "--hidden", "32", "--limit", "512", "--batch", "32",
                        "--epochs", "100000", "--threads", "1", "--ranks", "2", "--strategy",
                        "fsdp", "--offload", "all", "--offload-tier", "disk", "--offload-dir",
                        off, "--save", ck, NULL};
  tool_run r = stops_cleanly(args, index, SIGHUP);
  tool_run_free(&r);
  LT_EQ(lt_tree_walk(off, "loom-offload-", false), 0);
  LT_EQ(lt_tree_walk(ck, ".tmp.", false), 0);
  const char *again[] = {"train", "--hidden", "32", "--limit", "512", "--batch", "32",
                         "--epochs", "100000", "--threads", "1", "--ranks", "2", "--strategy",
                         "fsdp", "--resume", ck, "--max-steps", "1", NULL};
  resumes(again);
  lt_tree_walk(dir, NULL, true);
}
