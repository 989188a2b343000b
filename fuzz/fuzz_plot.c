/* fuzz_plot.c: `loom plot`'s reader (tools/plot_read.c, on loom's JSON reader) on any bytes as a
 * metrics file, then its SVG writer (tools/plot_svg.c) on what it read, drawn as two overlaid
 * runs, x by step and by samples. The harness
 * checks the property the reader's range checks exist for: every coordinate attribute of the
 * SVG (x y x1 y1 x2 y2 width height points d transform) is a finite number of a sane size;
 * "nan" or "inf" anywhere in the SVG aborts. A hang (a tick loop that stands still) is caught
 * by libFuzzer's -timeout. */
#define _GNU_SOURCE
#include "plot.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "svg_coords.h"

static void check_svg(const char *s) {
  if (strcasestr(s, "nan") || strcasestr(s, "inf")) {
    fprintf(stderr, "fuzz_plot: a non-finite number in the SVG\n");
    abort();
  }
  const char *bad = svg_coords_problem(s);
  if (bad) {
    fprintf(stderr, "fuzz_plot: %s\n", bad);
    abort();
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size == 0) return 0; /* fmemopen needs a byte; the empty file is a unit test */
  FILE *in = fmemopen((void *)data, size, "r");
  if (!in) return 0;
  plot_run runs[2];
  int rc = plot_read_stream(in, "fuzz.jsonl", &runs[0], PLOT_MAX_RECORDS);
  fclose(in);
  if (rc) return 0;
  runs[1] = runs[0]; /* the same run twice: the overlay */
  runs[1].name = "second";
  for (int by_samples = 0; by_samples < 2; by_samples++) { /* x by step, then by samples */
    char *svg = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&svg, &len);
    if (!out) abort();
    if (plot_write_svg(out, runs, 2, by_samples)) abort();
    fclose(out);
    check_svg(svg);
    free(svg);
  }
  plot_run_free(&runs[0]);
  return 0;
}
