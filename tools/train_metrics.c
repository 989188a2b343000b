/* train_metrics.c: the --metrics FILE.jsonl of `loom train`: one JSON object per step on one
 * line (step, epoch, loss, lr, scale, overflow, samples_per_s, the caller's extra members, and
 * current and peak bytes of every memory pool), written as it goes so a crashed run keeps its
 * records. Non-finite numbers (a NaN loss) are written as null, since JSON has no NaN.
 *
 * Metrics never hold up training or a signal (SIGINT / SIGTERM / SIGHUP stop a run the same
 * way with or without them; train_signal.c):
 *   - a regular file (or a new one) is written as a log file is (llm.c, PyTorch's loggers);
 *   - a FIFO, pipe or terminal (`--metrics /dev/stdout`, a FIFO a dashboard reads) is written
 *     through without ever waiting: it is opened non-blocking, so a FIFO with no reader is
 *     refused at start (start the reader first) instead of waiting for one; a record the reader
 *     has no room for is dropped, never waited on, and the drops are counted on standard error
 *     at the end; a reader that goes away ends the records (no SIGPIPE, the run goes on);
 *   - a block device, socket or folder is refused.
 * A record of up to PIPE_BUF (4 KiB) bytes goes into a pipe whole or not at all; a longer one a
 * full pipe cut short is finished before the next one is written (one still cut when the run
 * ends is counted as dropped). */
#include "train_api.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

struct train_metrics {
  int fd;
  char *path;
  bool stream;      /* a FIFO, pipe, terminal or character device: never waited on */
  bool gone;        /* the reader closed its end: later records are dropped */
  int rc;           /* the first write error */
  char *tail;       /* the unwritten end of a record a full pipe cut */
  size_t ntail;
  int64_t records, dropped;
};

/* What a path is, for a refusal. */
static const char *kind_of(mode_t m) {
  return S_ISDIR(m) ? "a folder" : S_ISBLK(m) ? "a block device" : S_ISSOCK(m) ? "a socket"
       : "not a file loom can write records to";
}

int train_metrics_open(const char *path, bool append, train_metrics **out) {
  *out = NULL;
  train_metrics *mt = calloc(1, sizeof *mt);
  if (!mt || !(mt->path = strdup(path))) {
    free(mt);
    return train_fail(LOOM_ENOMEM, "--metrics: out of memory");
  }
  /* O_NONBLOCK: open never waits for a FIFO's reader (ENXIO instead), writes never wait for a
   * full pipe; O_TRUNC only ever truncates a regular file */
  mt->fd = open(path, O_WRONLY | O_CREAT | O_NONBLOCK | O_CLOEXEC | O_NOCTTY |
                          (append ? O_APPEND : O_TRUNC), 0666);
  int rc = LOOM_OK;
  struct stat st;
  if (mt->fd < 0) {
    int e = errno;
    if (e == ENXIO && stat(path, &st) == 0 && S_ISFIFO(st.st_mode))
      rc = train_fail(LOOM_EIO, "--metrics %s: a FIFO with no reader: start the reader first "
                      "(loom never waits for one)", path);
    else
      rc = train_fail(LOOM_EIO, "--metrics %s: cannot open for writing: %s", path, strerror(e));
  } else if (fstat(mt->fd, &st) != 0) {
    rc = train_fail(LOOM_EIO, "--metrics %s: cannot stat: %s", path, strerror(errno));
  } else if (!S_ISREG(st.st_mode) && !S_ISFIFO(st.st_mode) && !S_ISCHR(st.st_mode)) {
    rc = train_fail(LOOM_EIO, "--metrics %s is %s, not a file, FIFO or terminal", path,
                    kind_of(st.st_mode));
  }
  if (rc) {
    train_metrics_close(mt);
    return rc;
  }
  mt->stream = !S_ISREG(st.st_mode);
  *out = mt;
  return LOOM_OK;
}

/* write(2) with SIGPIPE held back: a reader that went away is EPIPE here, not the end of the
 * process (the signal is raised in this thread, blocked, and taken back unless it was already
 * pending). */
static ssize_t write_quiet(int fd, const char *p, size_t n) {
  sigset_t pipe_set, old, was;
  sigemptyset(&pipe_set);
  sigaddset(&pipe_set, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe_set, &old);
  sigpending(&was);
  ssize_t w = write(fd, p, n);
  int e = errno;
  if (w < 0 && e == EPIPE && !sigismember(&was, SIGPIPE)) {
    const struct timespec zero = {0, 0};
    while (sigtimedwait(&pipe_set, NULL, &zero) < 0 && errno == EINTR) {}
  }
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  errno = e;
  return w;
}

enum { PUT_DONE, PUT_FULL, PUT_GONE, PUT_ERROR };

/* Write p[0..n) without waiting; *done gets the bytes that went out. */
static int put(train_metrics *mt, const char *p, size_t n, size_t *done) {
  *done = 0;
  while (*done < n) {
    ssize_t w = mt->stream ? write_quiet(mt->fd, p + *done, n - *done)
                           : write(mt->fd, p + *done, n - *done);
    if (w > 0) {
      *done += (size_t)w;
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return PUT_FULL;
    if (w < 0 && errno == EPIPE) return PUT_GONE;
    if (w == 0) errno = EIO;
    return PUT_ERROR;
  }
  return PUT_DONE;
}

/* Keep p[0..n) to finish later (a record cut short). */
static int keep_tail(train_metrics *mt, const char *p, size_t n) {
  char *t = malloc(n ? n : 1);
  if (!t) return mt->rc = train_fail(LOOM_ENOMEM, "--metrics: out of memory");
  memcpy(t, p, n);
  free(mt->tail);
  mt->tail = t;
  mt->ntail = n;
  return LOOM_OK;
}

/* Finish a record a full pipe cut: PUT_DONE once it is all out. */
static int put_tail(train_metrics *mt) {
  if (!mt->ntail) return PUT_DONE;
  size_t done = 0;
  int r = put(mt, mt->tail, mt->ntail, &done);
  memmove(mt->tail, mt->tail + done, mt->ntail - done);
  mt->ntail -= done;
  return r;
}

/* What a failed put means: the reader gone (noted once, records dropped from now on) or a
 * write error (the run fails, as with a full disk). */
static int put_failed(train_metrics *mt, int r, int64_t step) {
  if (r == PUT_GONE) {
    mt->gone = true;
    mt->dropped++; /* this record */
    fprintf(stderr, "loom train: note: --metrics %s: the reader went away: the records from "
            "step %lld on are dropped\n", mt->path, (long long)step);
    return LOOM_OK;
  }
  return mt->rc = train_fail(LOOM_EIO, "--metrics %s: write failed: %s", mt->path,
                             strerror(errno));
}

static void number(FILE *f, const char *key, double v) {
  if (isfinite(v))
    fprintf(f, "\"%s\": %.9g, ", key, v);
  else
    fprintf(f, "\"%s\": null, ", key);
}

static void format_record(FILE *f, const train_record *r) {
  fprintf(f, "{\"step\": %lld, \"epoch\": %lld, ", (long long)r->step, (long long)r->epoch);
  number(f, "loss", r->loss);
  number(f, "lr", r->lr);
  number(f, "scale", r->scale);
  fprintf(f, "\"overflow\": %s, ", r->overflow ? "true" : "false");
  number(f, "samples_per_s", r->samples_per_s);
  fprintf(f, "\"samples\": %lld, ", (long long)r->samples);
  if (r->has_val && r->classifier) {
    number(f, "test_loss", r->val_loss);
    number(f, "test_accuracy", r->test_accuracy);
  } else if (r->has_val) {
    number(f, "val_loss", r->val_loss);
  }
  if (r->has_val) number(f, "epochs", r->epochs);
  if (r->extra && *r->extra) fprintf(f, "%s, ", r->extra);
  fprintf(f, "\"mem\": {");
  for (int p = 0; p < LOOM_POOL_COUNT; p++) {
    loom_pool_stats s = {0};
    loom_mem_stats((loom_pool)p, &s);
    fprintf(f, "%s\"%s\": {\"current_bytes\": %zu, \"peak_bytes\": %zu}", p ? ", " : "",
            loom_pool_name((loom_pool)p), s.current_bytes, s.peak_bytes);
  }
  fprintf(f, ", \"resident_peak_bytes\": %zu}}\n", train_peak_rss()); /* the process's */
}

int train_metrics_write(train_metrics *mt, const train_record *r) {
  if (mt->rc) return mt->rc;
  mt->records++;
  if (mt->gone) {
    mt->dropped++;
    return LOOM_OK;
  }
  char *line = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&line, &len);
  if (!f) return mt->rc = train_fail(LOOM_ENOMEM, "--metrics: out of memory");
  format_record(f, r);
  if (fclose(f) != 0 || !line) {
    free(line);
    return mt->rc = train_fail(LOOM_ENOMEM, "--metrics: out of memory");
  }
  size_t done = 0;
  int put_rc = put_tail(mt);
  if (put_rc == PUT_DONE) put_rc = put(mt, line, len, &done);
  else if (put_rc == PUT_FULL) done = 0; /* still no room for the last one: drop this one */
  int rc = LOOM_OK;
  if (put_rc == PUT_FULL && done == 0) mt->dropped++;
  else if (put_rc == PUT_FULL) rc = keep_tail(mt, line + done, len - done);
  else if (put_rc != PUT_DONE) rc = put_failed(mt, put_rc, r->step);
  free(line);
  return rc;
}

int train_metrics_close(train_metrics *mt) {
  if (!mt) return LOOM_OK;
  int rc = mt->rc;
  if (mt->fd >= 0 && !mt->gone && put_tail(mt) != PUT_DONE && mt->ntail) mt->dropped++;
  if (mt->dropped)
    fprintf(stderr, "loom train: note: --metrics %s: %lld of %lld records dropped%s (loom never "
            "waits for a reader)\n", mt->path, (long long)mt->dropped, (long long)mt->records,
            mt->gone ? "" : ": the reader did not keep up");
  if (mt->fd >= 0 && close(mt->fd) != 0 && !rc && !mt->stream)
    rc = train_fail(LOOM_EIO, "--metrics %s: close failed: %s", mt->path, strerror(errno));
  free(mt->tail);
  free(mt->path);
  free(mt);
  return rc;
}
