/* cmd_plot.c: `loom plot RUN.jsonl... -o OUT.svg`: the metrics of one or more `loom train
 * --metrics` runs drawn as one SVG, written by loom itself (no plotting library), one panel per
 * series, the runs overlaid in different colours: loss (each step, faint, and smoothed: an
 * exponential moving average over about 2% of the steps), learning rate, loss scale (log axis;
 * the steps skipped for an overflow marked), samples/s, and the compute pool's bytes. Each panel
 * has its axes, ticks and labels. Every coordinate written is finite (the inputs are
 * range-checked by plot_read.c, the tick loops count their ticks, and a point that would still
 * land outside the finite is left out). The file is written atomically (a temporary, then
 * rename) where loom_output_path allows: never over a device, FIFO, socket or folder; through a
 * symlink to a regular file; `-o -` writes to standard output. */
#include "commands.h"
#include "plot.h"

#include "loom/io.h"
#include "loom/status.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_RUNS 8
#define W 960.0
#define PANEL_H 190.0
#define LEFT 90.0
#define RIGHT 24.0
#define TOP 34.0
#define BOTTOM 34.0
#define MAX_TICKS 64 /* per axis, whatever the range */

static const char *const colours[MAX_RUNS] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd",
                                              "#ff7f0e", "#8c564b", "#e377c2", "#17becf"};

typedef enum { S_LOSS, S_LR, S_SCALE, S_RATE, S_MEM, S_COUNT } series_kind;
static const char *const titles[S_COUNT] = {"loss (faint: each step; bold: smoothed)",
                                            "learning rate", "loss scale (log axis; x: step skipped, overflow)",
                                            "samples/s", "compute pool (MB)"};

static double *series_of(const plot_run *r, series_kind k) {
  switch (k) {
  case S_LOSS: return r->loss;
  case S_LR: return r->lr;
  case S_SCALE: return r->scale;
  case S_RATE: return r->samples_per_s;
  case S_MEM: return r->mem_mb;
  default: return NULL;
  }
}

/* XML text: & < > " ' escaped. */
static void put_text(FILE *f, const char *s) {
  for (; *s; s++) switch (*s) {
    case '&': fputs("&amp;", f); break;
    case '<': fputs("&lt;", f); break;
    case '>': fputs("&gt;", f); break;
    case '"': fputs("&quot;", f); break;
    case '\'': fputs("&apos;", f); break;
    default: fputc(*s, f);
    }
}

/* A "nice" tick spacing (1, 2 or 5 x 10^k) for about `want` ticks over span. */
static double nice_step(double span, int want) {
  double raw = span / want, p = pow(10, floor(log10(raw))), m = raw / p;
  return (m < 1.5 ? 1 : m < 3 ? 2 : m < 7 ? 5 : 10) * p;
}

static void fmt_num(char *buf, size_t cap, double v) {
  double a = fabs(v);
  if (v == 0) snprintf(buf, cap, "0");
  else if (a < 1e9 && v == floor(v)) snprintf(buf, cap, "%.0f", v); /* 65536, 2350 */
  else if (a >= 1e6 || a < 1e-3) snprintf(buf, cap, "%.0e", v);
  else snprintf(buf, cap, "%.4g", v);
}

typedef struct frame {
  double x0, x1, y0, y1; /* data ranges */
  double top;            /* the panel's top in the SVG */
  bool log_y;
} frame;

static double px(const frame *fr, double x) {
  return LEFT + (x - fr->x0) / (fr->x1 - fr->x0 > 0 ? fr->x1 - fr->x0 : 1) * (W - LEFT - RIGHT);
}

static double py(const frame *fr, double y) {
  double a = fr->log_y ? log2(y) : y, lo = fr->log_y ? log2(fr->y0) : fr->y0,
         hi = fr->log_y ? log2(fr->y1) : fr->y1;
  double h = PANEL_H - TOP - BOTTOM;
  return fr->top + TOP + h - (a - lo) / (hi - lo > 0 ? hi - lo : 1) * h;
}

/* The axes, ticks and labels of a panel. */
static void axes(FILE *f, const frame *fr, const char *title) {
  double h = PANEL_H - TOP - BOTTOM, top = fr->top + TOP;
  fprintf(f, "<g class=\"panel\">\n<text x=\"%.1f\" y=\"%.1f\" font-size=\"14\" "
          "font-weight=\"bold\">", LEFT, fr->top + 20);
  put_text(f, title);
  fprintf(f, "</text>\n<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" "
          "stroke=\"#444\"/>\n", LEFT, top, W - LEFT - RIGHT, h);
  char lab[32];
  double xs = nice_step(fr->x1 - fr->x0 > 0 ? fr->x1 - fr->x0 : 1, 6);
  double x_first = ceil(fr->x0 / xs) * xs;
  for (int t = 0; t < MAX_TICKS; t++) {
    double x = x_first + t * xs; /* counted: x += xs stands still where xs is below x's ulp */
    if (x > fr->x1 + 1e-9 || !isfinite(px(fr, x))) break;
    fmt_num(lab, sizeof lab, x);
    fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>"
            "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" text-anchor=\"middle\">%s</text>\n",
            px(fr, x), top, px(fr, x), top + h, px(fr, x), top + h + 14, lab);
  }
  fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" text-anchor=\"end\">step</text>\n",
          W - RIGHT, top + h + 28);
  if (fr->log_y) {
    double e0 = floor(log2(fr->y0)), de = fmax(1, floor((log2(fr->y1) - log2(fr->y0)) / 4));
    for (int t = 0; t < MAX_TICKS; t++) {
      double e = e0 + t * de, y = exp2(e);
      if (!(e <= ceil(log2(fr->y1)))) break;
      if (y < fr->y0 * 0.999 || y > fr->y1 * 1.001 || !isfinite(py(fr, y))) continue;
      fmt_num(lab, sizeof lab, y);
      fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>"
              "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" text-anchor=\"end\">%s</text>\n",
              LEFT, py(fr, y), W - RIGHT, py(fr, y), LEFT - 6, py(fr, y) + 4, lab);
    }
  } else {
    double ys = nice_step(fr->y1 - fr->y0 > 0 ? fr->y1 - fr->y0 : 1, 4);
    double y_first = ceil(fr->y0 / ys) * ys;
    for (int t = 0; t < MAX_TICKS; t++) {
      double y = y_first + t * ys;
      if (!(y <= fr->y1 + ys * 1e-9) || !isfinite(py(fr, y))) break;
      fmt_num(lab, sizeof lab, y);
      fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>"
              "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" text-anchor=\"end\">%s</text>\n",
              LEFT, py(fr, y), W - RIGHT, py(fr, y), LEFT - 6, py(fr, y) + 4, lab);
    }
  }
}

/* One line through the finite points of v (a new polyline after each gap). */
static void line(FILE *f, const frame *fr, const plot_run *r, const double *v, const char *colour,
                 double width, double opacity) {
  bool open = false;
  for (size_t i = 0; i < r->n; i++) {
    bool ok = isfinite(v[i]) && isfinite(r->step[i]) && (!fr->log_y || v[i] > 0) &&
              isfinite(px(fr, r->step[i])) && isfinite(py(fr, v[i]));
    if (ok && !open) {
      fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"%.1f\" "
              "stroke-opacity=\"%.2f\" points=\"", colour, width, opacity);
      open = true;
    }
    if (ok) fprintf(f, "%.1f,%.1f ", px(fr, r->step[i]), py(fr, v[i]));
    if (!ok && open) {
      fputs("\"/>\n", f);
      open = false;
    }
  }
  if (open) fputs("\"/>\n", f);
}

static void panel(FILE *f, series_kind k, const plot_run *runs, int nruns, double top) {
  frame fr = {INFINITY, -INFINITY, INFINITY, -INFINITY, top, k == S_SCALE};
  for (int r = 0; r < nruns; r++) {
    const double *v = series_of(&runs[r], k);
    for (size_t i = 0; i < runs[r].n; i++) {
      if (!isfinite(runs[r].step[i])) continue;
      fr.x0 = fmin(fr.x0, runs[r].step[i]);
      fr.x1 = fmax(fr.x1, runs[r].step[i]);
      if (!isfinite(v[i]) || (fr.log_y && v[i] <= 0)) continue;
      fr.y0 = fmin(fr.y0, v[i]);
      fr.y1 = fmax(fr.y1, v[i]);
    }
  }
  bool empty = !(fr.y0 <= fr.y1);
  if (empty) fr.y0 = 0, fr.y1 = 1;
  if (!(fr.x0 <= fr.x1)) fr.x0 = 0, fr.x1 = 1;
  if (fr.y0 == fr.y1) { /* a flat series: a band around it */
    fr.y0 = fr.log_y ? fr.y0 / 2 : fr.y0 - (fabs(fr.y0) > 0 ? fabs(fr.y0) * 0.1 : 1);
    fr.y1 = fr.log_y ? fr.y1 * 2 : fr.y1 + (fabs(fr.y1) > 0 ? fabs(fr.y1) * 0.1 : 1);
  } else if (!fr.log_y) {
    double pad = (fr.y1 - fr.y0) * 0.05;
    fr.y0 = fr.y0 >= 0 && fr.y0 - pad < 0 ? 0 : fr.y0 - pad, fr.y1 += pad;
  }
  axes(f, &fr, titles[k]);
  if (empty)
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"12\" fill=\"#888\">no data in these "
            "runs</text>\n", LEFT + 10, top + PANEL_H / 2);
  for (int r = 0; r < nruns && !empty; r++) {
    const plot_run *run = &runs[r];
    const double *v = series_of(run, k);
    if (k != S_LOSS) {
      line(f, &fr, run, v, colours[r], 1.6, 1.0);
    } else { /* raw and an exponential moving average over ~2% of the steps */
      line(f, &fr, run, v, colours[r], 0.8, 0.3);
      double *ema = malloc((run->n ? run->n : 1) * sizeof(double)), a = 2.0 / (run->n / 50.0 + 2);
      if (!ema) continue;
      double m = NAN;
      for (size_t i = 0; i < run->n; i++) ema[i] = isfinite(v[i]) ? (m = isfinite(m) ? m + a * (v[i] - m) : v[i]) : NAN;
      line(f, &fr, run, ema, colours[r], 2.2, 1.0);
      free(ema);
    }
    if (k == S_SCALE) /* skipped steps: where the scale backed off */
      for (size_t i = 0; i < run->n; i++)
        if (run->overflow[i] && isfinite(v[i]) && v[i] > 0 && isfinite(px(&fr, run->step[i])) &&
            isfinite(py(&fr, v[i])))
          fprintf(f, "<path class=\"overflow\" d=\"M%.1f %.1fl6 6m-6 0l6 -6\" stroke=\"%s\" "
                  "stroke-width=\"1.5\" transform=\"translate(-3 -3)\"/>\n",
                  px(&fr, run->step[i]), py(&fr, v[i]), colours[r]);
  }
  fputs("</g>\n", f);
}

int plot_write_svg(FILE *f, const plot_run *runs, int nruns) {
  double legend = 24.0 + 18.0 * nruns, height = legend + S_COUNT * PANEL_H;
  fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" "
          "width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" font-family=\"sans-serif\">\n"
          "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n", W, height, W, height);
  for (int r = 0; r < nruns; r++) {
    size_t skipped = 0;
    for (size_t i = 0; i < runs[r].n; i++) skipped += runs[r].overflow[i];
    fprintf(f, "<g class=\"legend\"><rect x=\"%.1f\" y=\"%.1f\" width=\"14\" height=\"4\" "
            "fill=\"%s\"/><text x=\"%.1f\" y=\"%.1f\" font-size=\"13\">", LEFT, 16.0 + 18 * r,
            colours[r], LEFT + 20, 21.0 + 18 * r);
    put_text(f, runs[r].name);
    fprintf(f, " (%zu steps, %zu skipped", runs[r].n, skipped);
    if (runs[r].skipped_records || runs[r].dropped_values)
      fprintf(f, "; out of range: %zu records, %zu values", runs[r].skipped_records,
              runs[r].dropped_values);
    fputs(")</text></g>\n", f);
  }
  for (int k = 0; k < S_COUNT; k++) panel(f, (series_kind)k, runs, nruns, legend + k * PANEL_H);
  fputs("</svg>\n", f);
  return ferror(f) ? 1 : 0;
}

static void usage(FILE *f) {
  fprintf(f, "usage: loom plot RUN.jsonl [RUN.jsonl...] -o OUT.svg\n\n"
          "Draws the metrics `loom train --metrics FILE` wrote (up to %d runs, overlaid): loss,\n"
          "learning rate, loss scale with the skipped steps, samples/s and memory, as an SVG.\n\n"
          "  -o, --output OUT.svg  where to write it, atomically; `-o -` writes to standard output.\n"
          "                        A device, FIFO, socket or folder is refused; a symlink to a\n"
          "                        regular file is written through (its target replaced).\n\n"
          "Limits: each input a regular file of at most %zu MB, lines of at most %zu KB, %zu\n"
          "records in all. A record whose step is not in [0, 1e15] is skipped; a value that is not\n"
          "finite or exceeds 1e30 in magnitude (a loss scale <= 0 too) is left out; both counted.\n",
          MAX_RUNS, PLOT_MAX_FILE_BYTES >> 20, PLOT_MAX_LINE_BYTES >> 10, (size_t)PLOT_MAX_RECORDS);
}

int cmd_plot(int argc, char **argv) {
  const char *out = NULL, *files[MAX_RUNS];
  int nfiles = 0;
  for (int i = 0; i < argc; i++) {
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      usage(stdout);
      return 0;
    }
    if (!strcmp(argv[i], "-o") || !strcmp(argv[i], "--output")) {
      if (i + 1 >= argc) {
        fprintf(stderr, "loom plot: %s needs a file name\n", argv[i]);
        return 2;
      }
      out = argv[++i];
    } else if (argv[i][0] == '-' && argv[i][1]) {
      fprintf(stderr, "loom plot: unknown option '%s'\n", argv[i]);
      usage(stderr);
      return 2;
    } else if (nfiles == MAX_RUNS) {
      fprintf(stderr, "loom plot: at most %d runs at once\n", MAX_RUNS);
      return 2;
    } else {
      files[nfiles++] = argv[i];
    }
  }
  if (!out || !nfiles) {
    fprintf(stderr, "loom plot: %s\n", !nfiles ? "no run given" : "no output file (-o OUT.svg)");
    usage(stderr);
    return 2;
  }
  bool to_stdout = !strcmp(out, "-");
  char target[4096];
  if (!to_stdout && loom_output_path(out, target, sizeof target) != LOOM_OK) {
    const char *why = loom_last_error(), *colon = strstr(why, ": "); /* drop "loom_output_path: " */
    fprintf(stderr, "loom plot: cannot write -o %s\n", colon ? colon + 2 : why);
    return 2; /* before reading anything: a usage error */
  }
  plot_run runs[MAX_RUNS];
  int rc = 0, nread = 0;
  size_t budget = PLOT_MAX_RECORDS;
  for (; nread < nfiles && !rc; nread++) {
    rc = plot_read(files[nread], &runs[nread], budget);
    if (rc) break;
    budget -= runs[nread].n;
    if (runs[nread].skipped_records || runs[nread].dropped_values)
      fprintf(stderr, "loom plot: %s: out of range, left out: %zu records (step not in [0, 1e15]), "
              "%zu values (not finite, beyond 1e30, or a loss scale <= 0)\n", files[nread],
              runs[nread].skipped_records, runs[nread].dropped_values);
  }
  char tmp[4096 + 32];
  if (!rc && to_stdout) {
    rc = plot_write_svg(stdout, runs, nfiles);
    if (fflush(stdout) != 0) rc = 1;
    if (rc) fprintf(stderr, "loom plot: cannot write standard output: %s\n", strerror(errno));
  } else if (!rc) {
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", target, (int)getpid());
    FILE *f = fopen(tmp, "wx");
    if (!f) {
      fprintf(stderr, "loom plot: cannot write %s: %s\n", out, strerror(errno));
      rc = 1;
    } else {
      rc = plot_write_svg(f, runs, nfiles);
      if (fflush(f) != 0 || fsync(fileno(f)) != 0) rc = 1;
      if (fclose(f) != 0) rc = 1;
      if (!rc && rename(tmp, target) != 0) rc = 1;
      if (rc) {
        fprintf(stderr, "loom plot: cannot write %s: %s\n", out, strerror(errno));
        unlink(tmp);
      }
    }
  }
  for (int r = 0; r < nread; r++) plot_run_free(&runs[r]);
  if (!rc && !to_stdout) printf("loom plot: %s (%d run%s)\n", out, nfiles, nfiles > 1 ? "s" : "");
  return rc;
}
