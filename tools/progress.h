/* progress.h: the training progress display of the `loom` command: one line redrawn in place
 * (a bar, the counts, an ETA and the caller's figures, cut to the terminal's width) when the
 * stream is a terminal a person watches, plain periodic lines otherwise (logs, CI, and the
 * ranks of mpirun, whose pseudo-terminal is a launcher's: plain unless asked). */
#ifndef LOOM_TOOLS_PROGRESS_H
#define LOOM_TOOLS_PROGRESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

/* How progress is shown: redrawn where the stream is a terminal not under a launcher (auto),
 * always redrawn (bar; a terminal under mpirun, say), or plain lines (lines). */
typedef enum progress_mode { PROGRESS_AUTO, PROGRESS_BAR, PROGRESS_LINES } progress_mode;

typedef struct progress {
  FILE *f;
  bool tty;   /* redrawn in place */
  int width;  /* the terminal's columns: no line is longer than width - 1 */
  char label[48];
  long total;
  long run_before, run_total; /* the run's steps before this phase and in all (for the ETA) */
  double t_start, t_last;
  double interval_s; /* plain mode: seconds between lines */
} progress;

/* Start a phase of `total` steps (label such as "epoch 1/10"), shown as mode says. */
void progress_begin(progress *p, FILE *f, const char *label, long total, progress_mode mode);
/* The run this phase belongs to: `before` steps done before it, `total` in all; the ETA is the
 * run's (else the phase's). */
void progress_set_run(progress *p, long before, long total);
/* Steps `done` of total are finished; `figures` is a short line such as
 * "loss 0.4312  24.1k samples/s". Redraws (terminal, at most 10 times a second) or prints a
 * line when interval_s has passed (plain). */
void progress_update(progress *p, long done, const char *figures);
/* End the phase after `done` of its steps (total, or fewer when the run stops inside it:
 * --max-steps, a signal) with its final figures (always printed, a line of its own). */
void progress_end(progress *p, long done, const char *figures);
/* The columns of the terminal f is (TIOCGWINSZ), else $COLUMNS, else 80; at least 20. */
int progress_columns(FILE *f);
/* Whether this process is one a launcher started (mpirun / mpiexec: OMPI_COMM_WORLD_RANK,
 * PMI_RANK, PMIX_RANK): its standard output is the launcher's, even as a pseudo-terminal. */
bool progress_under_launcher(void);
/* Monotonic seconds. */
double progress_now(void);
/* Bytes for a person: "512 B", "12.3 MiB", "1.20 GiB". */
void progress_bytes(char *buf, size_t cap, size_t bytes);
/* A duration for a person: "42s", "3m07s", "2h05m". */
void progress_duration(char *buf, size_t cap, double seconds);

#endif
