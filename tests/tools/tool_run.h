/* tool_run.h: running the real `loom` binary (LOOM_BIN, set by tests/tools/CMakeLists.txt) as
 * a child process, for what only a process shows: its exit status or signal, its environment
 * read at start-up, and a standard output that fails. */
#ifndef LOOM_TESTS_TOOL_RUN_H
#define LOOM_TESTS_TOOL_RUN_H

typedef struct tool_run {
  int code;        /* exit code, or 128 + the signal that ended it */
  char *out, *err; /* what it printed (malloc'd, NUL-terminated; out is "" if redirected) */
} tool_run;

/* Run `loom args...` (args NULL-terminated) with the variables of env ("K=V", NULL-terminated,
 * NULL for none) added to this process's environment; its standard output goes to stdout_path
 * if given (such as "/dev/full"), else it is captured. */
tool_run tool_loom(const char *const *args, const char *const *env, const char *stdout_path);
/* The same, and once the file `when_exists` exists, send the child signal `sig`. */
tool_run tool_loom_signal(const char *const *args, const char *const *env,
                          const char *stdout_path, const char *when_exists, int sig);
/* Every run is bounded: a child still running TOOL_RUN_LIMIT_S seconds after its start (or
 * TOOL_RUN_AFTER_SIGNAL_S after the signal) is killed (SIGKILL: code 137) and says so in err,
 * so a run that hangs fails its test instead of stalling CI. */
#define TOOL_RUN_LIMIT_S 240
#define TOOL_RUN_AFTER_SIGNAL_S 30
void tool_run_free(tool_run *r);

#endif
