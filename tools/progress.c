/* progress.c: the progress display (progress.h): a line redrawn in place on a terminal, as wide
 * as the terminal allows (the bar shrinks, then goes, then the figures are cut), or plain lines
 * every few seconds elsewhere; with the ETA of the run from its pace so far. */
#include "progress.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

double progress_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int progress_columns(FILE *f) {
  struct winsize ws;
  int cols = 0;
  if (ioctl(fileno(f), TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) cols = ws.ws_col;
  const char *env = getenv("COLUMNS");
  if (!cols && env) cols = atoi(env);
  if (cols <= 0) cols = 80;
  return cols < 20 ? 20 : cols > 4096 ? 4096 : cols;
}

bool progress_under_launcher(void) {
  static const char *const vars[] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
    if (getenv(vars[i])) return true;
  return false;
}

void progress_begin(progress *p, FILE *f, const char *label, long total, progress_mode mode) {
  memset(p, 0, sizeof *p);
  p->f = f;
  p->tty = mode == PROGRESS_BAR ||
           (mode == PROGRESS_AUTO && isatty(fileno(f)) && !progress_under_launcher());
  p->width = p->tty ? progress_columns(f) : 0;
  snprintf(p->label, sizeof p->label, "%s", label);
  p->total = total > 0 ? total : 1;
  p->t_start = p->t_last = progress_now();
  p->interval_s = 5.0;
}

void progress_set_run(progress *p, long before, long total) {
  p->run_before = before;
  p->run_total = total;
}

void progress_duration(char *buf, size_t cap, double s) {
  if (!(s >= 0) || s > 1e8) snprintf(buf, cap, "?");
  else if (s < 60) snprintf(buf, cap, "%.0fs", s);
  else if (s < 3600) snprintf(buf, cap, "%dm%02ds", (int)(s / 60), (int)fmod(s, 60));
  else snprintf(buf, cap, "%dh%02dm", (int)(s / 3600), (int)fmod(s / 60, 60));
}

/* "eta 3m07s" from the pace of this phase's done steps, for the rest of the run (or phase). */
static void eta(const progress *p, long done, double elapsed, char *buf, size_t cap) {
  long left = p->run_total > 0 ? p->run_total - p->run_before - done : p->total - done;
  if (done <= 0 || left < 0) {
    buf[0] = '\0';
    return;
  }
  char d[24];
  progress_duration(d, sizeof d, elapsed / (double)done * (double)left);
  snprintf(buf, cap, "  eta %s", d);
}

static void draw(progress *p, long done, const char *figures, bool final) {
  double elapsed = progress_now() - p->t_start;
  char when[40], line[1024];
  if (!p->tty) {
    snprintf(line, sizeof line, "%s %ld/%ld (%.1fs)", p->label, done, p->total, elapsed);
    fprintf(p->f, "%s  %s\n", line, figures);
    fflush(p->f);
    return;
  }
  if (final) snprintf(when, sizeof when, "  %.1fs", elapsed);
  else eta(p, done, elapsed, when, sizeof when);
  char counts[64];
  snprintf(counts, sizeof counts, " %3ld%% %ld/%ld", 100 * done / p->total, done, p->total);
  /* the line without the bar, then the bar in what is left of the width (it shrinks to 10
   * cells, then goes); the figures are cut at the width */
  int fixed = (int)(strlen(p->label) + strlen(counts) + strlen(when) + 2 + strlen(figures));
  int room = p->width - 1 - fixed - 3, cells = room > 24 ? 24 : room;
  char bar[32] = "";
  if (cells >= 10) {
    int filled = (int)((long)cells * done / p->total);
    bar[0] = ' ', bar[1] = '[';
    for (int i = 0; i < cells; i++) bar[2 + i] = i < filled ? '#' : '.';
    bar[2 + cells] = ']', bar[3 + cells] = '\0';
  }
  int n = snprintf(line, sizeof line, "%s%s%s%s  %s", p->label, bar, counts, when, figures);
  if (n > p->width - 1) n = p->width - 1;
  if (n < 0) n = 0;
  fprintf(p->f, "\r\033[K%.*s", n, line);
  if (final) fputc('\n', p->f);
  fflush(p->f);
}

void progress_update(progress *p, long done, const char *figures) {
  double t = progress_now();
  double every = p->tty ? 0.1 : p->interval_s;
  if (t - p->t_last < every) return;
  p->t_last = t;
  draw(p, done, figures, false);
}

void progress_end(progress *p, long done, const char *figures) { draw(p, done, figures, true); }

void progress_bytes(char *buf, size_t cap, size_t b) {
  if (b >= (size_t)1 << 30)
    snprintf(buf, cap, "%.2f GiB", (double)b / (1 << 30));
  else if (b >= (size_t)1 << 20)
    snprintf(buf, cap, "%.1f MiB", (double)b / (1 << 20));
  else
    snprintf(buf, cap, "%zu B", b);
}
