/* test_progress.c: `loom train`'s progress in a real terminal: under a pseudo-terminal of 60
 * and of 80 columns (forkpty, TIOCGWINSZ) no progress line is longer than the width less one
 * (so a redraw never wraps and stacks), the line is redrawn in place (\r ESC[K) with an ETA,
 * and a bf16 run without a scaler shows no "scale"; a log (a pipe) holds no escape sequence,
 * nor does the pseudo-terminal of a process an MPI launcher started (OMPI_COMM_WORLD_RANK) unless
 * --progress bar asks for the redraws. */
#define _GNU_SOURCE
#include "lt.h"
#include "tool_run.h"

#include <errno.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* A run of about a second at one thread: enough steps for several redraws. */
#define RUN "train", "--limit", "3000", "--batch", "50", "--epochs", "2", "--threads", "1"

/* Run `loom args` on a pseudo-terminal of `cols` columns (with env_kv added to its
 * environment, NULL for none); everything it wrote (malloc'd), and its exit code. */
static char *run_in_pty(int cols, const char *const *args, const char *env_kv, int *code) {
  const char *argv[32] = {LOOM_BIN};
  for (int i = 0; args[i] && i < 30; i++) argv[i + 1] = args[i];
  struct winsize ws = {.ws_row = 24, .ws_col = (unsigned short)cols};
  int master = -1;
  pid_t pid = forkpty(&master, NULL, NULL, &ws);
  if (pid < 0) return NULL;
  if (pid == 0) {
    if (env_kv) putenv((char *)env_kv);
    execv(LOOM_BIN, (char *const *)argv);
    _exit(127);
  }
  size_t cap = 1 << 16, len = 0;
  char *out = malloc(cap);
  for (;;) {
    struct pollfd pf = {.fd = master, .events = POLLIN};
    int ready = poll(&pf, 1, 120000);
    if (ready <= 0) break; /* a hang: the checks below fail */
    if (len + 4096 > cap) out = realloc(out, cap *= 2);
    ssize_t got = read(master, out + len, 4096);
    if (got <= 0 && errno == EINTR) continue;
    if (got <= 0) break; /* EIO: the terminal's other side closed */
    len += (size_t)got;
  }
  out[len] = '\0';
  close(master);
  int status = 0;
  if (waitpid(pid, &status, WNOHANG) == 0) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
  }
  *code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return out;
}

/* The longest progress segment ("epoch ..." between \r and \n, ESC[K removed) and how many
 * segments there were. */
static size_t longest_progress(const char *out, int *segments) {
  size_t most = 0;
  *segments = 0;
  for (const char *p = out; *p;) {
    size_t n = strcspn(p, "\r\n");
    const char *s = p;
    if (n >= 3 && !strncmp(s, "\033[K", 3)) s += 3, n -= 3;
    if (n >= 6 && !strncmp(s, "epoch ", 6)) {
      ++*segments;
      if (n > most) most = n;
    }
    p += (s - p) + n;
    while (*p == '\r' || *p == '\n') p++;
  }
  return most;
}

static void check_width(int cols) {
  const char *const args[] = {RUN, "--amp", "bf16", NULL};
  int code = -1, segments = 0;
  char *out = run_in_pty(cols, args, NULL, &code);
  LT_TRUE(out != NULL);
  if (!out) return;
  size_t most = longest_progress(out, &segments);
  if (code || most > (size_t)cols - 1 || segments < 3) fprintf(stderr, "%d columns:\n%s\n", cols, out);
  LT_EQ(code, 0);
  LT_TRUE(segments >= 3);           /* redraws, and each epoch's last line */
  LT_TRUE(most <= (size_t)cols - 1); /* never wraps */
  LT_TRUE(strstr(out, "\r\033[Kepoch 1/2") != NULL); /* redrawn in place */
  LT_TRUE(strstr(out, "eta ") != NULL);
  LT_TRUE(strstr(out, "test accuracy") != NULL); /* the result comes first in the last line */
  LT_TRUE(strstr(out, "scale") == NULL);         /* bf16 without a scaler scales nothing */
  free(out);
}

LT_TEST(progress_fits_a_terminal_of_60_columns) { check_width(60); }
LT_TEST(progress_fits_a_terminal_of_80_columns) { check_width(80); }

LT_TEST(progress_in_a_log_or_under_mpirun_has_no_escape_sequence) {
  const char *const args[] = {"train", "--limit", "600", "--batch", "50", "--epochs", "1",
                              "--threads", "1", "--amp", "f16", NULL};
  tool_run r = tool_loom(args, NULL, NULL); /* standard output a pipe: a log */
  LT_EQ(r.code, 0);
  LT_TRUE(strchr(r.out, '\033') == NULL && strchr(r.out, '\r') == NULL);
  LT_TRUE(strstr(r.out, "epoch 1/1 12/12") != NULL);
  tool_run_free(&r);
  int code = -1;
  char *out = run_in_pty(80, args, "OMPI_COMM_WORLD_RANK=0", &code); /* a launcher's pty */
  LT_TRUE(out && code == 0 && strchr(out, '\033') == NULL && strstr(out, "epoch 1/1 12/12"));
  free(out);
  const char *const bar[] = {"train", "--limit", "600", "--batch", "50", "--epochs", "1",
                             "--threads", "1", "--progress", "bar", NULL};
  out = run_in_pty(80, bar, "OMPI_COMM_WORLD_RANK=0", &code); /* asked for */
  LT_TRUE(out && code == 0 && strstr(out, "\r\033[Kepoch 1/1") != NULL);
  free(out);
}
