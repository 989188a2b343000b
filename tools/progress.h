/* progress.h: the training progress display of the `loom` command: a redrawn bar with the
 * caller's figures when the stream is a terminal, plain periodic lines otherwise (logs, CI). */
#ifndef LOOM_TOOLS_PROGRESS_H
#define LOOM_TOOLS_PROGRESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

typedef struct progress {
  FILE *f;
  bool tty;
  char label[48];
  long total;
  double t_start, t_last;
  double interval_s; /* plain mode: seconds between lines */
} progress;

/* Start a phase of `total` steps (label such as "epoch 1/10"). */
void progress_begin(progress *p, FILE *f, const char *label, long total);
/* Steps `done` of total are finished; `figures` is a short line such as
 * "loss 0.4312  scale 65536  24.1k samples/s". Redraws (terminal) or prints a line when
 * interval_s has passed (plain). */
void progress_update(progress *p, long done, const char *figures);
/* End the phase with its final figures (always printed). */
void progress_end(progress *p, const char *figures);
/* Monotonic seconds. */
double progress_now(void);
/* Bytes for a person: "512 B", "12.3 MiB", "1.20 GiB". */
void progress_bytes(char *buf, size_t cap, size_t bytes);

#endif
