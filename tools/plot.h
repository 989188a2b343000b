/* plot.h: `loom plot`: the metrics a `loom train --metrics FILE` run wrote (JSON Lines, one
 * record per step) read back (plot_read.c) and drawn as an SVG (cmd_plot.c). */
#ifndef LOOM_TOOLS_PLOT_H
#define LOOM_TOOLS_PLOT_H

#include <stdbool.h>
#include <stddef.h>

/* The series of a run, one entry per record; NAN where a record lacks the field. */
typedef struct plot_run {
  const char *name; /* the file's name, borrowed */
  size_t n;
  double *step, *loss, *lr, *scale, *samples_per_s, *mem_mb;
  bool *overflow;
} plot_run;

/* Read `path`. Every non-empty line must be a JSON object with a numeric "step" and "loss"
 * (what loom train writes); anything else is an error naming the file and the line. 0, or
 * 1 with the message printed to stderr. */
int plot_read(const char *path, plot_run *out);
void plot_run_free(plot_run *r);

#endif
