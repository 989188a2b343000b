/* test_plot.c: `loom plot` as a process. The SVG it writes from two metrics files (one with
 * overflow steps) is well-formed XML (a checker below: every tag closed in order, attributes
 * quoted, only the five entities XML knows), has its six panels, one polyline per run for each
 * series (two for the loss and samples/s: raw and smoothed) whose points are the records, one
 * mark per skipped step, and the runs' names escaped in the legend. Two runs with test accuracy
 * get an accuracy panel with a mark per evaluation, distinct labels (files of one name by their
 * paths, or --label), distinct dash patterns, one tick format per axis, the top tick of a scale
 * reaching 131072, and an x axis by samples; the records are parsed as JSON (a key inside a
 * string is not a member; malformed JSON is refused naming the line). Bad input fails with the file and line named,
 * and writes no output file. Extreme inputs (issue 24: steps of 1e16, scales of 1e308, 0 and
 * negative, nan and inf, a 10 MB line, an empty file, a folder, a FIFO with no writer, a file
 * past the size limit, more records than the limit) end promptly, and every SVG this file makes
 * has only finite coordinates (svg_coords_problem); `-o` never replaces what is not a regular
 * file (a FIFO, /dev/null, a symlink to a FIFO, a folder), writes through a symlink to a regular
 * file, and `-o -` writes to standard output. */
#include "lt.h"
#include "svg_coords.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "tool_run.h"

/* Well-formed XML, enough for an SVG: a prolog, elements properly nested and closed,
 * attribute values quoted, & only in &amp; &lt; &gt; &quot; &apos;, no < in text. NULL if it
 * is, else what is wrong. */
static const char *xml_problem(const char *s) {
  static char why[160];
  const char *stack[64];
  size_t depth = 0, lens[64];
  int roots = 0;
  if (!strncmp(s, "<?xml", 5)) {
    s = strstr(s, "?>");
    if (!s) return "unterminated prolog";
    s += 2;
  }
  while (*s) {
    if (*s == '&') {
      static const char *const ents[] = {"&amp;", "&lt;", "&gt;", "&quot;", "&apos;"};
      bool ok = false;
      for (int i = 0; i < 5 && !ok; i++) ok = !strncmp(s, ents[i], strlen(ents[i]));
      if (!ok) return "a bare & in text";
      s++;
      continue;
    }
    if (*s != '<') {
      s++;
      continue;
    }
    if (s[1] == '/') { /* closing tag */
      const char *name = s + 2;
      size_t n = strcspn(name, " >");
      if (!depth || n != lens[depth - 1] || strncmp(name, stack[depth - 1], n)) {
        snprintf(why, sizeof why, "</%.*s> does not close the open element", (int)n, name);
        return why;
      }
      depth--;
      s = strchr(s, '>');
      if (!s) return "unterminated closing tag";
      s++;
      continue;
    }
    const char *name = s + 1;
    size_t n = strcspn(name, " />\n");
    if (!n) return "an empty tag name";
    const char *p = name + n;
    for (;;) { /* attributes */
      while (*p == ' ' || *p == '\n') p++;
      if (*p == '>' || (*p == '/' && p[1] == '>')) break;
      size_t an = strcspn(p, "= >");
      if (!an || p[an] != '=' || p[an + 1] != '"') {
        snprintf(why, sizeof why, "an attribute of <%.*s> is not name=\"value\"", (int)n, name);
        return why;
      }
      const char *v = p + an + 2, *e = strchr(v, '"');
      if (!e) return "an unterminated attribute value";
      for (const char *c = v; c < e; c++)
        if (*c == '<') return "a < inside an attribute value";
      p = e + 1;
    }
    bool empty = *p == '/';
    if (!empty) {
      if (depth == 64) return "nesting too deep";
      if (depth == 0) roots++;
      stack[depth] = name, lens[depth++] = n;
    } else if (depth == 0) {
      roots++;
    }
    s = p + (empty ? 2 : 1);
  }
  if (depth) return "an element left open";
  if (roots != 1) return "not exactly one root element";
  return NULL;
}


static size_t count(const char *s, const char *what) {
  size_t n = 0;
  for (const char *p = s; (p = strstr(p, what)); p++) n++;
  return n;
}

static char *slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *b = malloc((size_t)n + 1);
  if (b && fread(b, 1, (size_t)n, f) != (size_t)n) n = 0;
  if (b) b[n] = 0;
  fclose(f);
  return b;
}

/* A metrics file of `steps` records; every 7th step an overflow (scale halved). */
static void write_run(const char *path, int steps, bool overflows) {
  FILE *f = fopen(path, "w");
  double scale = 65536;
  for (int s = 1; s <= steps; s++) {
    bool ov = overflows && s % 7 == 0;
    if (ov) scale /= 2;
    fprintf(f, "{\"step\": %d, \"epoch\": 0, \"loss\": %.6f, \"lr\": %g, \"scale\": %g, "
            "\"overflow\": %s, \"samples_per_s\": %.1f, \"mem\": {\"compute\": {\"current_bytes\": "
            "%d, \"peak_bytes\": 0}}}\n", s, 2.3 / (1 + 0.05 * s), 0.001 * (1 - s / 100.0), scale,
            ov ? "true" : "false", 1000.0 + s, 1000000 + 1000 * s);
  }
  fclose(f);
}

LT_TEST(plot_writes_well_formed_svg_with_every_panel_and_the_skipped_steps) {
  char dir[] = "/tmp/loom_plot_XXXXXX";
  LT_TRUE(mkdtemp(dir) != NULL);
  char a[96], b[96], out[96];
  snprintf(a, sizeof a, "%s/f16 <run>&a.jsonl", dir); /* a name that needs escaping */
  snprintf(b, sizeof b, "%s/b.jsonl", dir);
  snprintf(out, sizeof out, "%s/run.svg", dir);
  write_run(a, 40, true);
  write_run(b, 25, false);
  const char *args[] = {"plot", a, b, "-o", out, NULL};
  tool_run r = tool_loom(args, NULL, NULL);
  if (r.code) fprintf(stderr, "%s", r.err);
  LT_EQ(r.code, 0);
  tool_run_free(&r);
  char *svg = slurp(out);
  LT_TRUE(svg != NULL);
  const char *bad = xml_problem(svg);
  if (bad) lt_fail_at(__FILE__, __LINE__, "the SVG is not well-formed XML: %s", bad);
  bad = svg_coords_problem(svg);
  if (bad) lt_fail_at(__FILE__, __LINE__, "the SVG has a bad coordinate: %s", bad);
  LT_TRUE(strstr(svg, "<svg xmlns=\"http://www.w3.org/2000/svg\"") != NULL);
  LT_EQ(count(svg, "class=\"panel\""), 6);
  LT_TRUE(strstr(svg, "loss scale") && strstr(svg, "learning rate") && strstr(svg, "samples/s"));
  LT_TRUE(strstr(svg, "test accuracy") && strstr(svg, "compute pool (MiB)"));
  /* 2 runs: loss and samples/s twice (raw, smoothed), lr, scale, memory; no accuracy here */
  LT_EQ(count(svg, "<polyline"), 2 * 7);
  LT_EQ(count(svg, "class=\"overflow\""), 40 / 7); /* one mark per skipped step */
  LT_TRUE(strstr(svg, "f16 &lt;run&gt;&amp;a.jsonl (40 steps, 5 skipped)") != NULL);
  LT_TRUE(strstr(svg, "b.jsonl (25 steps, 0 skipped)") != NULL);
  /* the first polyline (run a's raw loss) has one point per record */
  const char *pts = strstr(strstr(svg, "<polyline"), "points=\"") + 8;
  size_t n = 0;
  for (const char *c = pts; *c != '"'; c++) n += *c == ',';
  LT_EQ(n, 40);
  free(svg);
  unlink(a), unlink(b), unlink(out), rmdir(dir);
}

LT_TEST(plot_bad_input_names_the_file_and_writes_nothing) {
  char dir[] = "/tmp/loom_plot_XXXXXX";
  LT_TRUE(mkdtemp(dir) != NULL);
  char a[96], out[96];
  snprintf(a, sizeof a, "%s/a.jsonl", dir);
  snprintf(out, sizeof out, "%s/out.svg", dir);
  FILE *f = fopen(a, "w");
  fprintf(f, "{\"step\": 1, \"loss\": 2.0}\n\nnot json at all\n");
  fclose(f);
  const char *bad_line[] = {"plot", a, "-o", out, NULL};
  tool_run r = tool_loom(bad_line, NULL, NULL);
  LT_EQ(r.code, 1);
  LT_TRUE(strstr(r.err, "a.jsonl:3: not a loom train metrics record") != NULL);
  tool_run_free(&r);
  LT_TRUE(access(out, F_OK) != 0);
  const char *missing[] = {"plot", "/nonexistent/run.jsonl", "-o", out, NULL};
  r = tool_loom(missing, NULL, NULL);
  LT_EQ(r.code, 1);
  LT_TRUE(strstr(r.err, "/nonexistent/run.jsonl") != NULL);
  tool_run_free(&r);
  const char *no_out[] = {"plot", a, NULL};
  r = tool_loom(no_out, NULL, NULL);
  LT_EQ(r.code, 2);
  LT_TRUE(strstr(r.err, "-o OUT.svg") != NULL);
  tool_run_free(&r);
  const char *bad_opt[] = {"plot", a, "--frobnicate", "-o", out, NULL};
  r = tool_loom(bad_opt, NULL, NULL);
  LT_EQ(r.code, 2);
  tool_run_free(&r);
  f = fopen(a, "w"); /* empty file */
  fclose(f);
  r = tool_loom(bad_line, NULL, NULL);
  LT_EQ(r.code, 1);
  LT_TRUE(strstr(r.err, "no records") != NULL);
  tool_run_free(&r);
  LT_TRUE(access(out, F_OK) != 0);
  unlink(a), rmdir(dir);
}

static void write_text(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  fputs(text, f);
  fclose(f);
}

/* Run `loom plot in -o out`: its exit code; the SVG (if any) checked for XML and coordinates. */
static int plot_checked(const char *in, const char *out, const char *want_err, const char *label) {
  const char *args[] = {"plot", in, "-o", out, NULL};
  tool_run r = tool_loom(args, NULL, NULL);
  int code = r.code;
  if (want_err && !strstr(r.err, want_err))
    lt_fail_at(__FILE__, __LINE__, "%s: stderr \"%s\" lacks \"%s\"", label, r.err, want_err);
  tool_run_free(&r);
  char *svg = code == 0 ? slurp(out) : NULL;
  if (code == 0 && !svg) lt_fail_at(__FILE__, __LINE__, "%s: exit 0 but no SVG", label);
  if (svg) {
    const char *bad = xml_problem(svg);
    if (bad) lt_fail_at(__FILE__, __LINE__, "%s: not well-formed XML: %s", label, bad);
    bad = svg_coords_problem(svg);
    if (bad) lt_fail_at(__FILE__, __LINE__, "%s: %s", label, bad);
    free(svg);
  }
  return code;
}

LT_TEST(plot_extreme_inputs_end_promptly_with_finite_coordinates) {
  char dir[] = "/tmp/loom_plot_XXXXXX";
  LT_TRUE(mkdtemp(dir) != NULL);
  char in[96], out[96];
  snprintf(in, sizeof in, "%s/run.jsonl", dir);
  snprintf(out, sizeof out, "%s/out.svg", dir);
  static const struct {
    const char *text;
    int code;
    const char *err;
  } cases[] = {
      {"{\"step\": 1e16, \"loss\": 1}\n", 1, "no records with a step in range"},
      {"{\"step\": 1e16, \"loss\": 1}\n{\"step\": 2, \"loss\": 1}\n", 0, "1 records"},
      {"{\"step\": 1, \"loss\": 1, \"scale\": 1e308}\n", 0, "1 values"},
      {"{\"step\": 1, \"loss\": 1, \"scale\": 1e308}\n{\"step\": 2, \"loss\": 1, \"scale\": 1}\n", 0, NULL},
      {"{\"step\": 1, \"loss\": 1, \"scale\": 0}\n{\"step\": 2, \"loss\": 1, \"scale\": -5}\n", 0, "2 values"},
      {"{\"step\": -3, \"loss\": -1e300}\n{\"step\": 2, \"loss\": 1e300, \"lr\": -1e308}\n", 0, NULL},
      {"{\"step\": 1, \"loss\": 1e308, \"samples_per_s\": -1e308}\n{\"step\": 2, \"loss\": -1e308}\n", 0, NULL},
      {"{\"step\": nan, \"loss\": 1}\n{\"step\": inf, \"loss\": 1}\n{\"step\": 3, \"loss\": nan}\n"
       "{\"step\": 4, \"loss\": inf, \"scale\": inf}\n{\"step\": 5, \"loss\": -inf, \"scale\": nan, "
       "\"lr\": inf, \"samples_per_s\": nan}\n", 0, "2 records"},
      {"{\"step\": 1e15, \"loss\": 1e30, \"scale\": 1e-30}\n{\"step\": 0, \"loss\": -1e30, \"scale\": 1e30}\n", 0, NULL},
      {"{\"step\": 5, \"loss\": 2}\n", 0, NULL},
      {"{\"step\": 1e-320, \"loss\": 1e-320, \"scale\": 1e-320, \"rank_compute_bytes\": 1e308}\n", 0, NULL},
      {"", 1, "no records"},
  };
  for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
    write_text(in, cases[c].text);
    char label[64];
    snprintf(label, sizeof label, "case %zu", c);
    LT_EQ(plot_checked(in, out, cases[c].err, label), cases[c].code);
  }
  /* a 10 MB single line: refused at the line limit */
  FILE *f = fopen(in, "w");
  fputs("{\"step\": 1, \"loss\": 1, \"pad\": \"", f);
  for (int i = 0; i < 10 << 20; i++) fputc('x', f);
  fputs("\"}\n", f);
  fclose(f);
  LT_EQ(plot_checked(in, out, "longer than 65536 bytes", "10 MB line"), 1);
  /* past the size limit (sparse): refused from its size, nothing read */
  f = fopen(in, "w");
  fputs("{\"step\": 1, \"loss\": 1}\n", f);
  fclose(f);
  LT_EQ(truncate(in, (off_t)(65 << 20)), 0);
  LT_EQ(plot_checked(in, out, "larger than 64 MB", "65 MB file"), 1);
  /* a folder, a FIFO with no writer (refused before open: it would block), a device */
  LT_EQ(plot_checked(dir, out, "is a folder", "folder"), 1);
  char fifo[96];
  snprintf(fifo, sizeof fifo, "%s/fifo", dir);
  LT_EQ(mkfifo(fifo, 0600), 0);
  LT_EQ(plot_checked(fifo, out, "is a FIFO", "FIFO"), 1);
  LT_EQ(plot_checked("/dev/zero", out, "is a character device", "/dev/zero"), 1);
  unlink(fifo), unlink(in), unlink(out), rmdir(dir);
}

LT_TEST(plot_record_limit_keeps_memory_bounded) {
  char dir[] = "/tmp/loom_plot_XXXXXX";
  LT_TRUE(mkdtemp(dir) != NULL);
  char in[96], out[96];
  snprintf(in, sizeof in, "%s/run.jsonl", dir);
  snprintf(out, sizeof out, "%s/out.svg", dir);
  FILE *f = fopen(in, "w");
  for (long s = 0; s <= (1l << 20); s++) fprintf(f, "{\"step\":%ld,\"loss\":1}\n", s);
  fclose(f);
  struct rusage before, after; /* the largest RSS of the children waited for so far */
  LT_EQ(getrusage(RUSAGE_CHILDREN, &before), 0);
  LT_EQ(plot_checked(in, out, "more than 1048576 records", "records"), 1);
  LT_EQ(getrusage(RUSAGE_CHILDREN, &after), 0);
  /* if the figure rose, it is this child's peak (an earlier child's may be larger) */
  if (!getenv("LOOM_SANITIZED") && after.ru_maxrss > before.ru_maxrss &&
      after.ru_maxrss > 100 * 1024)
    lt_fail_at(__FILE__, __LINE__, "loom plot reached %ld KB RSS", after.ru_maxrss);
  unlink(in), rmdir(dir);
}

LT_TEST(plot_output_never_replaces_what_is_not_a_regular_file) {
  char dir[] = "/tmp/loom_plot_XXXXXX";
  LT_TRUE(mkdtemp(dir) != NULL);
  char in[96], fifo[96], link[96], reg[96], reglink[96];
  snprintf(in, sizeof in, "%s/run.jsonl", dir);
  snprintf(fifo, sizeof fifo, "%s/fifo", dir);
  snprintf(link, sizeof link, "%s/to-fifo", dir);
  snprintf(reg, sizeof reg, "%s/real.svg", dir);
  snprintf(reglink, sizeof reglink, "%s/to-real.svg", dir);
  write_run(in, 10, false);
  LT_EQ(mkfifo(fifo, 0600), 0);
  LT_EQ(symlink("fifo", link), 0);
  static const char *const what[] = {"is a FIFO", "is a character device",
                                     "is a symlink to a FIFO", "is a folder"};
  const char *outs[] = {fifo, "/dev/null", link, dir};
  for (int i = 0; i < 4; i++) {
    const char *args[] = {"plot", in, "-o", outs[i], NULL};
    tool_run r = tool_loom(args, NULL, NULL);
    LT_EQ(r.code, 2);
    if (!strstr(r.err, what[i]) || !strstr(r.err, outs[i]))
      lt_fail_at(__FILE__, __LINE__, "-o %s: \"%s\" lacks \"%s\"", outs[i], r.err, what[i]);
    tool_run_free(&r);
  }
  struct stat st;
  LT_TRUE(stat("/dev/null", &st) == 0 && S_ISCHR(st.st_mode));
  LT_TRUE(lstat(fifo, &st) == 0 && S_ISFIFO(st.st_mode));
  LT_TRUE(lstat(link, &st) == 0 && S_ISLNK(st.st_mode));
  LT_TRUE(stat(dir, &st) == 0 && S_ISDIR(st.st_mode));
  /* a symlink to a regular file: written through, the link kept */
  write_text(reg, "old\n");
  LT_EQ(symlink("real.svg", reglink), 0);
  LT_EQ(plot_checked(in, reglink, NULL, "symlink to a file"), 0);
  LT_TRUE(lstat(reglink, &st) == 0 && S_ISLNK(st.st_mode));
  char *svg = slurp(reg);
  LT_TRUE(svg && !strncmp(svg, "<?xml", 5));
  free(svg);
  /* -o -: standard output */
  const char *args[] = {"plot", in, "-o", "-", NULL};
  tool_run r = tool_loom(args, NULL, NULL);
  LT_EQ(r.code, 0);
  LT_TRUE(!strncmp(r.out, "<?xml", 5) && strstr(r.out, "</svg>\n"));
  LT_TRUE(xml_problem(r.out) == NULL && svg_coords_problem(r.out) == NULL);
  tool_run_free(&r);
  unlink(reglink), unlink(reg), unlink(link), unlink(fifo), unlink(in), rmdir(dir);
}

/* A run with evaluations: every 10th record carries test_accuracy; samples = step x 64; the
 * scale doubles up to 131072; lr from 1e-3 down to near 0 (ticks across 0.001 and 0.0008). */
static void write_eval_run(const char *path, int steps, double acc0) {
  FILE *f = fopen(path, "w");
  for (int s = 1; s <= steps; s++) {
    double scale = s < 17 ? 65536 * (s / 16.0 >= 1 ? 2 : 1) : 131072;
    fprintf(f, "{\"step\": %d, \"epoch\": %d, \"loss\": %.6f, \"lr\": %g, \"scale\": %g, "
            "\"overflow\": false, \"samples_per_s\": %.1f, \"samples\": %d, ", s, (s - 1) / 10,
            2.3 / (1 + 0.05 * s), 0.001 * (1 - s / (double)(steps + 1)), scale,
            1000.0 + (s % 3) * 200, 64 * s);
    if (s % 10 == 0) fprintf(f, "\"test_loss\": 0.5, \"test_accuracy\": %.2f, \"epochs\": %d, ", acc0 + s / 10.0, s / 10);
    fprintf(f, "\"mem\": {\"host\": {\"current_bytes\": 5}, \"compute\": {\"current_bytes\": "
            "%d, \"peak_bytes\": 0}}}\n", 3 << 20);
  }
  fclose(f);
}

/* The tick labels (text-anchor end) of the panel whose title starts with title. */
static void panel_ticks(const char *svg, const char *title, char *out, size_t cap) {
  out[0] = '\0';
  const char *p = strstr(svg, title), *end = p ? strstr(p, "</g>") : NULL;
  size_t len = 0;
  for (const char *t = p; t && (t = strstr(t, "text-anchor=\"end\">")) && t < end; t++) {
    t += strlen("text-anchor=\"end\">");
    size_t n = strcspn(t, "<");
    if (len + n + 2 < cap) len += (size_t)snprintf(out + len, cap - len, "%.*s|", (int)n, t);
  }
}

LT_TEST(plot_two_runs_with_accuracy_labels_dashes_and_consistent_ticks) {
  char dir[] = "/tmp/loom_plot_XXXXXX";
  LT_TRUE(mkdtemp(dir) != NULL);
  char da[96], db[96], a[128], b[128], out[96];
  snprintf(da, sizeof da, "%s/a", dir);
  snprintf(db, sizeof db, "%s/b", dir);
  LT_EQ(mkdir(da, 0700), 0);
  LT_EQ(mkdir(db, 0700), 0);
  snprintf(a, sizeof a, "%s/metrics.jsonl", da);
  snprintf(b, sizeof b, "%s/metrics.jsonl", db);
  snprintf(out, sizeof out, "%s/run.svg", dir);
  write_eval_run(a, 40, 70);
  write_eval_run(b, 40, 70); /* the same series: told apart by the dash pattern */
  const char *args[] = {"plot", a, b, "-o", out, NULL};
  tool_run r = tool_loom(args, NULL, NULL);
  LT_EQ(r.code, 0);
  tool_run_free(&r);
  char *svg = slurp(out);
  LT_TRUE(svg && !xml_problem(svg) && !svg_coords_problem(svg));
  if (svg) {
    /* one file name, two folders: the labels are the paths */
    char want[160];
    snprintf(want, sizeof want, ">%s (40 steps", a);
    LT_TRUE(strstr(svg, want) != NULL);
    snprintf(want, sizeof want, ">%s (40 steps", b);
    LT_TRUE(strstr(svg, want) != NULL);
    LT_EQ(count(svg, "class=\"eval\""), 2 * 4); /* a mark per evaluation */
    LT_TRUE(count(svg, "stroke-dasharray=\"none\"") > 0 && count(svg, "stroke-dasharray=\"8 4\"") > 0);
    char ticks[512];
    panel_ticks(svg, "learning rate", ticks, sizeof ticks);
    if (!strstr(ticks, "|0.0010|") || strstr(ticks, "e-")) fprintf(stderr, "lr ticks: %s\n", ticks);
    LT_TRUE(strstr(ticks, "|0.0002|") && strstr(ticks, "|0.0010|") && !strstr(ticks, "e-"));
    panel_ticks(svg, "loss scale", ticks, sizeof ticks);
    if (!strstr(ticks, "131072|")) fprintf(stderr, "scale ticks: %s\n", ticks);
    LT_TRUE(strstr(ticks, "131072|") != NULL); /* the top tick */
    panel_ticks(svg, "compute pool (MiB)", ticks, sizeof ticks);
    if (!strstr(ticks, "|3.0|")) fprintf(stderr, "mem ticks: %s\n", ticks);
    LT_TRUE(strstr(ticks, "|3.0|") != NULL); /* 3 MiB: the compute pool's bytes, not the host's */
  }
  free(svg);
  /* --label names the runs; --x samples puts samples on the x axis */
  const char *labelled[] = {"plot", a, b, "--label", "f16 run", "--label", "bf16", "--x", "samples", "-o", out, NULL};
  r = tool_loom(labelled, NULL, NULL);
  LT_EQ(r.code, 0);
  tool_run_free(&r);
  svg = slurp(out);
  LT_TRUE(svg && strstr(svg, ">f16 run (40 steps") && strstr(svg, ">bf16 (40 steps"));
  LT_TRUE(svg && strstr(svg, ">samples</text>") != NULL);
  free(svg);
  const char *too_many[] = {"plot", a, "--label", "x", "--label", "y", "-o", out, NULL};
  r = tool_loom(too_many, NULL, NULL);
  LT_TRUE(r.code == 2 && strstr(r.err, "--label: 2 labels for 1 run"));
  tool_run_free(&r);
  /* parsed as JSON: "loss" inside a string is not a member; broken JSON names the line */
  static const char *const broken[][2] = {
      {"{\"step\": 1, \"note\": \"\\\"loss\\\": 5\"}\n", "run.jsonl:1: not a loom train metrics record"},
      {"{\"step\": 1, \"loss\": 2}\n{\"step\": 2, \"loss\": 2,}\n", "run.jsonl:2: not a loom train metrics record"},
      {"{\"step\": 1, \"loss\": 02}\n", "leading zero"},
      {"{\"step\": 1, \"loss\": 2} trailing\n", "more after the object"}};
  char in[128];
  snprintf(in, sizeof in, "%s/run.jsonl", dir);
  for (size_t i = 0; i < sizeof broken / sizeof broken[0]; i++) {
    write_text(in, broken[i][0]);
    const char *one[] = {"plot", in, "-o", out, NULL};
    r = tool_loom(one, NULL, NULL);
    LT_EQ(r.code, 1);
    LT_TRUE(strstr(r.err, broken[i][1]) != NULL);
    if (!strstr(r.err, broken[i][1])) fprintf(stderr, "case %zu: %s", i, r.err);
    tool_run_free(&r);
  }
  unlink(in), unlink(a), unlink(b), unlink(out), rmdir(da), rmdir(db), rmdir(dir);
}
