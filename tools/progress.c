/* progress.c: a terminal progress bar, or plain lines every few seconds when not a terminal. */
#include "progress.h"

#include <string.h>
#include <time.h>
#include <unistd.h>

double progress_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

void progress_begin(progress *p, FILE *f, const char *label, long total) {
  memset(p, 0, sizeof *p);
  p->f = f;
  p->tty = isatty(fileno(f));
  snprintf(p->label, sizeof p->label, "%s", label);
  p->total = total > 0 ? total : 1;
  p->t_start = p->t_last = progress_now();
  p->interval_s = 5.0;
}

static void draw(progress *p, long done, const char *figures, bool final) {
  if (p->tty) {
    enum { WIDTH = 24 };
    int filled = (int)(WIDTH * done / p->total);
    char bar[WIDTH + 1];
    for (int i = 0; i < WIDTH; i++) bar[i] = i < filled ? '#' : '.';
    bar[WIDTH] = '\0';
    fprintf(p->f, "\r\033[K%s [%s] %3ld%% %ld/%ld  %s", p->label, bar, 100 * done / p->total, done,
            p->total, figures);
    if (final) fputc('\n', p->f);
  } else {
    fprintf(p->f, "%s %ld/%ld (%.1fs)  %s\n", p->label, done, p->total,
            progress_now() - p->t_start, figures);
  }
  fflush(p->f);
}

void progress_update(progress *p, long done, const char *figures) {
  double t = progress_now();
  double every = p->tty ? 0.1 : p->interval_s;
  if (t - p->t_last < every) return;
  p->t_last = t;
  draw(p, done, figures, false);
}

void progress_end(progress *p, const char *figures) { draw(p, p->total, figures, true); }

void progress_bytes(char *buf, size_t cap, size_t b) {
  if (b >= (size_t)1 << 30)
    snprintf(buf, cap, "%.2f GiB", (double)b / (1 << 30));
  else if (b >= (size_t)1 << 20)
    snprintf(buf, cap, "%.1f MiB", (double)b / (1 << 20));
  else
    snprintf(buf, cap, "%zu B", b);
}
