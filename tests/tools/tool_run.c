/* tool_run.c: tool_loom (tool_run.h): posix_spawn of the binary with its output in temporary
 * files, so nothing here runs between fork and exec; every wait for the child is bounded. */
#include "tool_run.h"
#include "lt.h"

#include <fcntl.h>
#include <stdbool.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

static char *slurp(FILE *f) {
  long n = f ? ftell(f) : 0;
  char *s = malloc((size_t)(n > 0 ? n : 0) + 1);
  size_t got = 0;
  if (f && n > 0) {
    rewind(f);
    got = fread(s, 1, (size_t)n, f);
  }
  s[got] = '\0';
  if (f) fclose(f);
  return s;
}

/* Waits up to 60 s for `path` to exist (a sign the child got that far), then sends `sig`;
 * false if the child ended first. */
static bool signal_when(pid_t pid, const char *path, int sig) {
  for (int i = 0; i < 6000 && access(path, F_OK) != 0; i++) {
    siginfo_t si;
    si.si_pid = 0;
    if (waitid(P_PID, (id_t)pid, &si, WEXITED | WNOHANG | WNOWAIT) != 0 || si.si_pid)
      return false; /* it ended (or failed) first: leave its status to the caller's waitpid */
    usleep(10000);
  }
  kill(pid, sig);
  return true;
}

/* waitpid, for at most limit_s seconds; then SIGKILL (and *killed). */
static int wait_bounded(pid_t pid, double limit_s, int *status, bool *killed) {
  *killed = false;
  for (long i = 0; i < (long)(limit_s * 100); i++) {
    pid_t w = waitpid(pid, status, WNOHANG);
    if (w != 0) return w;
    usleep(10000);
  }
  kill(pid, SIGKILL);
  *killed = true;
  return waitpid(pid, status, 0);
}

tool_run tool_loom(const char *const *args, const char *const *env, const char *stdout_path) {
  return tool_loom_signal(args, env, stdout_path, NULL, 0);
}

tool_run tool_loom_signal(const char *const *args, const char *const *env,
                          const char *stdout_path, const char *when_exists, int sig) {
  tool_run r = {.code = -1};
  size_t nargs = 0, nenv = 0, nown = 0;
  while (args[nargs]) nargs++;
  while (env && env[nenv]) nenv++;
  while (environ[nown]) nown++;
  char **argv = calloc(nargs + 2, sizeof *argv), **envp = calloc(nenv + nown + 1, sizeof *envp);
  argv[0] = (char *)LOOM_BIN;
  memcpy(argv + 1, args, nargs * sizeof *argv);
  if (nenv) memcpy(envp, env, nenv * sizeof *envp); /* first: getenv finds them first */
  memcpy(envp + nenv, environ, nown * sizeof *envp);
  FILE *out = stdout_path ? NULL : tmpfile(), *err = tmpfile();
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  if (out) posix_spawn_file_actions_adddup2(&fa, fileno(out), 1);
  else posix_spawn_file_actions_addopen(&fa, 1, stdout_path, O_WRONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, fileno(err), 2);
  pid_t pid;
  int status = 0;
  fflush(NULL);
  bool killed = false;
  if (posix_spawn(&pid, LOOM_BIN, &fa, NULL, argv, envp) == 0) {
    double start = lt_now_s(), limit = TOOL_RUN_LIMIT_S;
    if (when_exists && signal_when(pid, when_exists, sig))
      limit = lt_now_s() - start + TOOL_RUN_AFTER_SIGNAL_S;
    if (wait_bounded(pid, limit - (lt_now_s() - start), &status, &killed) == pid)
      r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  posix_spawn_file_actions_destroy(&fa);
  if (out) fseek(out, 0, SEEK_END);
  fseek(err, 0, SEEK_END);
  r.out = slurp(out);
  r.err = slurp(err);
  if (killed) {
    char note[160];
    int n = snprintf(note, sizeof note, "\n[tool_run: still running after %s: killed]\n",
                     when_exists ? "its signal" : "its time limit");
    char *e = realloc(r.err, strlen(r.err) + (size_t)n + 1);
    if (e) strcat(r.err = e, note);
  }
  free(argv);
  free(envp);
  return r;
}

void tool_run_free(tool_run *r) {
  free(r->out);
  free(r->err);
  r->out = r->err = NULL;
}
