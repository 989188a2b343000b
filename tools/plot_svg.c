/* plot_svg.c: the SVG of `loom plot`, written by loom itself (no plotting library): one panel
 * per series, the runs overlaid, each in its own colour and dash pattern (so runs that coincide
 * stay visible): loss (each step, faint, and smoothed: an exponential moving average over about
 * 2% of the steps), test accuracy (a mark per evaluation), learning rate, loss scale (log axis;
 * the steps skipped for an overflow marked), samples/s (faint and smoothed, as the loss) and the
 * compute pool in MiB; x by step or by samples trained. Each panel has its axes, ticks and
 * labels; an axis's tick labels share one format. Every coordinate written is finite (the
 * inputs are range-checked by plot_read.c, the tick loops count their ticks, and a point that
 * would still land outside the finite is left out). */
#include "plot.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define W 960.0
#define PANEL_H 190.0
#define LEFT 90.0
#define RIGHT 24.0
#define TOP 34.0
#define BOTTOM 34.0
#define MAX_TICKS 64 /* per axis, whatever the range */
#define MAX_STYLES 8

static const char *const colours[MAX_STYLES] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd",
                                                "#ff7f0e", "#8c564b", "#e377c2", "#17becf"};
/* stroke-dasharray of each run's bold lines: the first solid */
static const char *const dashes[MAX_STYLES] = {"none", "8 4", "2 3", "10 3 2 3",
                                               "5 5", "1 4", "14 4", "6 2 2 2"};

typedef enum { S_LOSS, S_ACC, S_LR, S_SCALE, S_RATE, S_MEM, S_COUNT } series_kind;
static const char *const titles[S_COUNT] = {
    "loss (faint: each step; bold: smoothed)", "test accuracy (%, after each evaluation)",
    "learning rate", "loss scale (log axis; x: step skipped, overflow)",
    "samples/s (faint: each step; bold: smoothed)", "compute pool (MiB)"};

static double *series_of(const plot_run *r, series_kind k) {
  switch (k) {
  case S_LOSS: return r->loss;
  case S_ACC: return r->accuracy;
  case S_LR: return r->lr;
  case S_SCALE: return r->scale;
  case S_RATE: return r->samples_per_s;
  case S_MEM: return r->mem_mib;
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

/* A tick label in its axis's one format, from the spacing and the largest magnitude: whole
 * numbers ("65536"), fixed decimals as the spacing needs ("0.0002", "0.0010"), or, for
 * spacings below 1e-4 or magnitudes of 1e7 and more, one exponent form ("2.0e-05"). */
static void tick_text(char *buf, size_t cap, double v, double step, double most) {
  if (fabs(v) < step * 1e-9) { /* no "-0", "0.0000" or "1e-17" at zero */
    snprintf(buf, cap, "0");
    return;
  }
  if (step < 1e-4 || most >= 1e7) {
    int digits = (int)fmax(0, fmin(6, floor(log10(most)) - floor(log10(step))));
    snprintf(buf, cap, "%.*e", digits, v);
  } else {
    int decimals = step >= 1 ? 0 : (int)fmin(10, ceil(-log10(step) - 1e-9));
    snprintf(buf, cap, "%.*f", decimals, v);
  }
}

typedef struct frame {
  double x0, x1, y0, y1; /* data ranges */
  double top;            /* the panel's top in the SVG */
  bool log_y;
  const char *x_name;    /* "step" or "samples" */
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

static void y_tick(FILE *f, const frame *fr, double y, const char *lab) {
  fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>"
          "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" text-anchor=\"end\">%s</text>\n",
          LEFT, py(fr, y), W - RIGHT, py(fr, y), LEFT - 6, py(fr, y) + 4, lab);
}

/* The axes, ticks and labels of a panel. */
static void axes(FILE *f, const frame *fr, const char *title) {
  double h = PANEL_H - TOP - BOTTOM, top = fr->top + TOP;
  fprintf(f, "<g class=\"panel\">\n<text x=\"%.1f\" y=\"%.1f\" font-size=\"14\" "
          "font-weight=\"bold\">", LEFT, fr->top + 20);
  put_text(f, title);
  fprintf(f, "</text>\n<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" "
          "stroke=\"#444\"/>\n", LEFT, top, W - LEFT - RIGHT, h);
  char lab[48];
  double xs = nice_step(fr->x1 - fr->x0 > 0 ? fr->x1 - fr->x0 : 1, 6);
  double x_first = ceil(fr->x0 / xs) * xs, x_most = fmax(fabs(fr->x0), fabs(fr->x1));
  for (int t = 0; t < MAX_TICKS; t++) {
    double x = x_first + t * xs; /* counted: x += xs stands still where xs is below x's ulp */
    if (x > fr->x1 + xs * 1e-9 || !isfinite(px(fr, x))) break;
    tick_text(lab, sizeof lab, x, xs, x_most);
    fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>"
            "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" text-anchor=\"middle\">%s</text>\n",
            px(fr, x), top, px(fr, x), top + h, px(fr, x), top + h + 14, lab);
  }
  fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" text-anchor=\"end\">%s</text>\n",
          W - RIGHT, top + h + 28, fr->x_name);
  if (fr->log_y) { /* powers of 2 down from the top one, so the largest scale has its tick */
    double lo = log2(fr->y0), hi = log2(fr->y1), e_top = floor(hi + 1e-9);
    double de = fmax(1, floor((hi - lo) / 4));
    for (int t = 0; t < MAX_TICKS; t++) {
      double e = e_top - t * de, y = exp2(e);
      if (!(e >= lo - 1e-9)) break;
      if (!isfinite(py(fr, y))) continue;
      if (y >= 1) snprintf(lab, sizeof lab, "%.0f", y);
      else snprintf(lab, sizeof lab, "2^%.0f", e);
      y_tick(f, fr, y, lab);
    }
  } else {
    double ys = nice_step(fr->y1 - fr->y0 > 0 ? fr->y1 - fr->y0 : 1, 4);
    double y_first = ceil(fr->y0 / ys) * ys, y_most = fmax(fabs(fr->y0), fabs(fr->y1));
    for (int t = 0; t < MAX_TICKS; t++) {
      double y = y_first + t * ys;
      if (!(y <= fr->y1 + ys * 1e-9) || !isfinite(py(fr, y))) break;
      tick_text(lab, sizeof lab, y, ys, y_most);
      y_tick(f, fr, y, lab);
    }
  }
}

/* A point the panel can show: finite, positive on a log scale, and projected within a panel's
 * height of its own (a point the frame does not hold, as an average's rounding or a value the
 * frame left out could make, would otherwise land millions of pixels away: a gap instead). */
static bool drawable(const frame *fr, double x, double y) {
  if (!isfinite(y) || !isfinite(x) || (fr->log_y && !(y > 0))) return false;
  double X = px(fr, x), Y = py(fr, y);
  return X >= -W && X <= 2 * W && Y >= fr->top - PANEL_H && Y <= fr->top + 2 * PANEL_H;
}

/* One line through the drawable points of (x, v): a new polyline after each gap, or, with
 * across_gaps (a series recorded only now and then, as the evaluations), one line through them. */
static void line(FILE *f, const frame *fr, const plot_run *r, const double *x, const double *v,
                 int style, double width, double opacity, bool across_gaps) {
  bool open = false;
  for (size_t i = 0; i < r->n; i++) {
    bool ok = drawable(fr, x[i], v[i]);
    if (ok && !open) {
      fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"%.1f\" "
              "stroke-opacity=\"%.2f\" stroke-dasharray=\"%s\" points=\"", colours[style], width,
              opacity, opacity < 1 ? "none" : dashes[style]);
      open = true;
    }
    if (ok) fprintf(f, "%.1f,%.1f ", px(fr, x[i]), py(fr, v[i]));
    if (!ok && open && !across_gaps) {
      fputs("\"/>\n", f);
      open = false;
    }
  }
  if (open) fputs("\"/>\n", f);
}

/* The faint raw series and its exponential moving average over ~2% of the records, bold. */
static void smoothed(FILE *f, const frame *fr, const plot_run *run, const double *x,
                     const double *v, int style) {
  line(f, fr, run, x, v, style, 0.8, 0.3, false);
  double *ema = malloc((run->n ? run->n : 1) * sizeof(double)), a = 2.0 / (run->n / 50.0 + 2);
  if (!ema) return;
  double m = NAN;
  /* over the values the frame drew (on a log scale the positive ones): an average taking in a
   * zero or a negative one could fall to 1e-300, far below the panel */
  for (size_t i = 0; i < run->n; i++)
    ema[i] = isfinite(v[i]) && (!fr->log_y || v[i] > 0)
                 ? (m = isfinite(m) ? m + a * (v[i] - m) : v[i])
                 : NAN;
  line(f, fr, run, x, ema, style, 2.2, 1.0, false);
  free(ema);
}

static void panel(FILE *f, series_kind k, const plot_run *runs, int nruns, double top,
                  bool by_samples) {
  frame fr = {INFINITY, -INFINITY, INFINITY, -INFINITY, top, k == S_SCALE,
              by_samples ? "samples" : "step"};
  for (int r = 0; r < nruns; r++) {
    const double *v = series_of(&runs[r], k), *x = by_samples ? runs[r].samples : runs[r].step;
    for (size_t i = 0; i < runs[r].n; i++) {
      if (!isfinite(x[i])) continue;
      fr.x0 = fmin(fr.x0, x[i]);
      fr.x1 = fmax(fr.x1, x[i]);
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
    const double *v = series_of(run, k), *x = by_samples ? run->samples : run->step;
    int style = r % MAX_STYLES;
    if (k == S_LOSS || k == S_RATE) smoothed(f, &fr, run, x, v, style);
    else line(f, &fr, run, x, v, style, 1.6, 1.0, k == S_ACC);
    for (size_t i = 0; i < run->n; i++) {
      if (!drawable(&fr, x[i], v[i])) continue;
      if (k == S_ACC) /* each evaluation */
        fprintf(f, "<rect class=\"eval\" x=\"%.1f\" y=\"%.1f\" width=\"5\" height=\"5\" "
                "fill=\"%s\"/>\n", px(&fr, x[i]) - 2.5, py(&fr, v[i]) - 2.5, colours[style]);
      if (k == S_SCALE && run->overflow[i]) /* skipped steps: where the scale backed off */
        fprintf(f, "<path class=\"overflow\" d=\"M%.1f %.1fl6 6m-6 0l6 -6\" stroke=\"%s\" "
                "stroke-width=\"1.5\" transform=\"translate(-3 -3)\"/>\n",
                px(&fr, x[i]), py(&fr, v[i]), colours[style]);
    }
  }
  fputs("</g>\n", f);
}

int plot_write_svg(FILE *f, const plot_run *runs, int nruns, bool by_samples) {
  double legend = 24.0 + 18.0 * nruns, height = legend + S_COUNT * PANEL_H;
  fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" "
          "width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" font-family=\"sans-serif\">\n"
          "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n", W, height, W, height);
  for (int r = 0; r < nruns; r++) {
    size_t skipped = 0;
    for (size_t i = 0; i < runs[r].n; i++) skipped += runs[r].overflow[i];
    int style = r % MAX_STYLES;
    fprintf(f, "<g class=\"legend\"><line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" "
            "stroke=\"%s\" stroke-width=\"2.2\" stroke-dasharray=\"%s\"/><text x=\"%.1f\" "
            "y=\"%.1f\" font-size=\"13\">", LEFT, 17.0 + 18 * r, LEFT + 30, 17.0 + 18 * r,
            colours[style], dashes[style], LEFT + 36, 21.0 + 18 * r);
    put_text(f, runs[r].name);
    fprintf(f, " (%zu steps, %zu skipped", runs[r].n, skipped);
    if (runs[r].skipped_records || runs[r].dropped_values)
      fprintf(f, "; out of range: %zu records, %zu values", runs[r].skipped_records,
              runs[r].dropped_values);
    fputs(")</text></g>\n", f);
  }
  for (int k = 0; k < S_COUNT; k++)
    panel(f, (series_kind)k, runs, nruns, legend + k * PANEL_H, by_samples);
  fputs("</svg>\n", f);
  return ferror(f) ? 1 : 0;
}
