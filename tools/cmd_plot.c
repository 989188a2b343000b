/* cmd_plot.c: `loom plot RUN.jsonl... -o OUT.svg`: the command: its options (-o, --label,
 * --x), the runs read (plot_read.c) within one record budget, their legend labels (--label, or
 * the file names, whole paths where two files share a name), and the SVG (plot_svg.c) written
 * atomically (a temporary, then rename) where loom_output_path allows: never over a device,
 * FIFO, socket or folder; through a symlink to a regular file; `-o -` writes to standard
 * output. */
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

static void usage(FILE *f) {
  fprintf(f, "usage: loom plot RUN.jsonl [RUN.jsonl...] -o OUT.svg [--label NAME...] [--x step|samples]\n\n"
          "Draws the metrics `loom train --metrics FILE` wrote (up to %d runs, overlaid, each in\n"
          "its own colour and dash pattern): loss, test accuracy, learning rate, loss scale with\n"
          "the skipped steps, samples/s and memory (MiB), as an SVG.\n\n"
          "  -o, --output OUT.svg  where to write it, atomically; `-o -` writes to standard output.\n"
          "                        A device, FIFO, socket or folder is refused; a symlink to a\n"
          "                        regular file is written through (its target replaced).\n"
          "  --label NAME          the legend's name of the next run (in the order of the files;\n"
          "                        default: the file's name, or its path where two share a name)\n"
          "  --x step|samples      the x axis: steps (default) or samples trained\n\n"
          "Limits: each input a regular file of at most %zu MB, lines of at most %zu KB, %zu\n"
          "records in all. A record whose step is not in [0, 1e15] is skipped; a value that is not\n"
          "finite or exceeds 1e30 in magnitude (a loss scale <= 0 too) is left out; both counted.\n",
          MAX_RUNS, PLOT_MAX_FILE_BYTES >> 20, PLOT_MAX_LINE_BYTES >> 10, (size_t)PLOT_MAX_RECORDS);
}

/* The legend's default labels: each file's name, or its whole path when another file of the
 * runs has the same name. */
static void default_labels(const char **files, int n, const char **labels) {
  for (int i = 0; i < n; i++) {
    if (labels[i]) continue;
    const char *slash = strrchr(files[i], '/'), *base = slash ? slash + 1 : files[i];
    bool shared = false;
    for (int j = 0; j < n && !shared; j++) {
      const char *s = strrchr(files[j], '/');
      shared = j != i && strcmp(s ? s + 1 : files[j], base) == 0;
    }
    labels[i] = shared ? files[i] : base;
  }
}

/* The options; 0, 1 (--help printed) or 2 after the message. */
static int parse(int argc, char **argv, const char **out, const char **files, int *nfiles,
                 const char **labels, int *nlabels, bool *by_samples) {
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      usage(stdout);
      return 1;
    }
    bool takes = !strcmp(a, "-o") || !strcmp(a, "--output") || !strcmp(a, "--label") ||
                 !strcmp(a, "--x");
    if (takes && i + 1 >= argc) {
      fprintf(stderr, "loom plot: %s needs a value\n", a);
      return 2;
    }
    if (!strcmp(a, "-o") || !strcmp(a, "--output")) {
      *out = argv[++i];
    } else if (!strcmp(a, "--label")) {
      if (*nlabels == MAX_RUNS) {
        fprintf(stderr, "loom plot: --label: more labels than the %d runs it draws\n", MAX_RUNS);
        return 2;
      }
      labels[(*nlabels)++] = argv[++i];
    } else if (!strcmp(a, "--x")) {
      const char *v = argv[++i];
      if (strcmp(v, "step") != 0 && strcmp(v, "samples") != 0) {
        fprintf(stderr, "loom plot: --x: expected step or samples, got '%s'\n", v);
        return 2;
      }
      *by_samples = strcmp(v, "samples") == 0;
    } else if (a[0] == '-' && a[1]) {
      fprintf(stderr, "loom plot: unknown option '%s' (it takes -o/--output, --label and --x; "
              "see loom plot --help)\n", a);
      return 2;
    } else if (*nfiles == MAX_RUNS) {
      fprintf(stderr, "loom plot: at most %d runs at once\n", MAX_RUNS);
      return 2;
    } else {
      files[(*nfiles)++] = a;
    }
  }
  if (!*out || !*nfiles) {
    fprintf(stderr, "loom plot: %s (see loom plot --help)\n",
            !*nfiles ? "no run given: name the files loom train --metrics wrote, then -o OUT.svg"
                     : "no output file: give -o OUT.svg (or -o - for standard output)");
    return 2;
  }
  if (*nlabels > *nfiles) {
    fprintf(stderr, "loom plot: --label: %d labels for %d run%s\n", *nlabels, *nfiles,
            *nfiles > 1 ? "s" : "");
    return 2;
  }
  return 0;
}

/* Whether a run's records say how many samples were trained (for --x samples). */
static bool has_samples(const plot_run *r) {
  for (size_t i = 0; i < r->n; i++)
    if (isfinite(r->samples[i])) return true;
  return false;
}

int cmd_plot(int argc, char **argv) {
  const char *out = NULL, *files[MAX_RUNS], *labels[MAX_RUNS] = {0};
  int nfiles = 0, nlabels = 0;
  bool by_samples = false;
  int prc = parse(argc, argv, &out, files, &nfiles, labels, &nlabels, &by_samples);
  if (prc) return prc == 1 ? 0 : prc;
  default_labels(files, nfiles, labels);
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
    runs[nread].name = labels[nread];
    budget -= runs[nread].n;
    if (runs[nread].skipped_records || runs[nread].dropped_values)
      fprintf(stderr, "loom plot: %s: out of range, left out: %zu records (step not in [0, 1e15]), "
              "%zu values (not finite, beyond 1e30, or a loss scale <= 0)\n", files[nread],
              runs[nread].skipped_records, runs[nread].dropped_values);
    if (by_samples && !has_samples(&runs[nread])) {
      fprintf(stderr, "loom plot: %s: --x samples: its records have no \"samples\" (a loom "
              "train older than this one wrote it); plot it by step\n", files[nread]);
      rc = 1;
      nread++;
      break;
    }
  }
  char tmp[4096 + 32];
  if (!rc && to_stdout) {
    rc = plot_write_svg(stdout, runs, nfiles, by_samples);
    if (fflush(stdout) != 0) rc = 1;
    if (rc) fprintf(stderr, "loom plot: cannot write standard output: %s\n", strerror(errno));
  } else if (!rc) {
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", target, (int)getpid());
    FILE *f = fopen(tmp, "wx");
    if (!f) {
      fprintf(stderr, "loom plot: cannot write %s: %s\n", out, strerror(errno));
      rc = 1;
    } else {
      rc = plot_write_svg(f, runs, nfiles, by_samples);
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
