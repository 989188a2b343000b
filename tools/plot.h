/* plot.h: `loom plot`: the metrics a `loom train --metrics FILE` run wrote (JSON Lines, one
 * record per step) read back (plot_read.c) and drawn as an SVG (plot_svg.c; the command:
 * cmd_plot.c), within limits:
 * what it reads and what it draws are bounded whatever the input (the libFuzzer harness
 * fuzz/fuzz_plot.c checks that no coordinate it writes is non-finite). */
#ifndef LOOM_TOOLS_PLOT_H
#define LOOM_TOOLS_PLOT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

/* The limits (README, `loom plot --help`): an input larger than PLOT_MAX_FILE_BYTES or with a
 * line longer than PLOT_MAX_LINE_BYTES is refused, and so are more than PLOT_MAX_RECORDS
 * records in all the runs together (memory stays under 100 MB). A record whose step is not a
 * number in [0, PLOT_MAX_STEP] is skipped; a value that is not finite or is larger than
 * PLOT_MAX_ABS in magnitude (and a loss scale that is not positive) is dropped (a gap); both
 * counted and reported. */
#define PLOT_MAX_FILE_BYTES ((size_t)64 << 20)
#define PLOT_MAX_LINE_BYTES ((size_t)64 << 10)
#define PLOT_MAX_RECORDS ((size_t)1 << 20)
#define PLOT_MAX_STEP 1e15
#define PLOT_MAX_ABS 1e30

/* The series of a run, one entry per record; NAN where a record lacks the field. */
typedef struct plot_run {
  const char *name; /* the legend's label: the file's name (borrowed), or --label's */
  size_t n;
  double *step, *loss, *lr, *scale, *samples_per_s, *mem_mib;
  double *samples;  /* global samples trained up to the step */
  double *accuracy; /* test accuracy, %, on the records after an evaluation */
  bool *overflow;
  size_t skipped_records, dropped_values; /* out of range (see above) */
} plot_run;

/* Read `path`: a regular file only (a folder, FIFO, device or socket is refused before it is
 * opened for reading, so a FIFO never blocks). Every non-empty line must be a JSON object with
 * a numeric "step" and "loss" (what loom train writes); anything else is an error naming the
 * file and the line. At most max_records records. 0, or 1 with the message printed to stderr. */
int plot_read(const char *path, plot_run *out, size_t max_records);
/* The same from an open stream (`path` names it in messages). */
int plot_read_stream(FILE *f, const char *path, plot_run *out, size_t max_records);
void plot_run_free(plot_run *r);

/* The SVG of nruns runs into f (plot_svg.c), x by step or (by_samples) by samples trained:
 * 0, or 1 if f has an error. */
int plot_write_svg(FILE *f, const plot_run *runs, int nruns, bool by_samples);

#endif
