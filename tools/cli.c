/* cli.c: table-driven option parsing for the `loom` subcommands, with messages that name the
 * offending option (and the bound it breaks) and a --help generated from the same table. */
#include "cli.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const cli_option *find(const cli_option *opts, const char *name, size_t len) {
  for (const cli_option *o = opts; o->name; o++)
    if (strlen(o->name) == len && strncmp(o->name, name, len) == 0) return o;
  return NULL;
}

/* Edits (insert, delete, substitute, swap two neighbours) between a and b[0..blen), capped at
 * 3: the distance at which an unknown option is taken for a typo of a known one. */
static int edits(const char *a, const char *b, size_t blen) {
  size_t alen = strlen(a);
  if (alen > 63 || blen > 63) return 3;
  int d[64][64];
  for (size_t i = 0; i <= alen; i++) d[i][0] = (int)i;
  for (size_t j = 0; j <= blen; j++) d[0][j] = (int)j;
  for (size_t i = 1; i <= alen; i++)
    for (size_t j = 1; j <= blen; j++) {
      int best = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
      if (d[i - 1][j] + 1 < best) best = d[i - 1][j] + 1;
      if (d[i][j - 1] + 1 < best) best = d[i][j - 1] + 1;
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && d[i - 2][j - 2] + 1 < best)
        best = d[i - 2][j - 2] + 1;
      d[i][j] = best;
    }
  return d[alen][blen] < 3 ? d[alen][blen] : 3;
}

/* The known option an unknown name most likely meant: the nearest within 2 edits (1 for a
 * name of 4 letters or fewer), or the only option the name begins. NULL if none is. */
static const cli_option *nearest(const cli_option *opts, const char *name, size_t len) {
  const cli_option *best = NULL, *prefixed = NULL;
  int best_d = len <= 4 ? 2 : 3, nprefixed = 0;
  for (const cli_option *o = opts; o->name; o++) {
    int d = edits(o->name, name, len);
    if (d < best_d) best = o, best_d = d;
    if (len >= 3 && strncmp(o->name, name, len) == 0) prefixed = o, nprefixed++;
  }
  return best ? best : nprefixed == 1 ? prefixed : NULL;
}

static bool in_choices(const char *choices, const char *v) {
  size_t n = strlen(v);
  for (const char *p = choices; *p;) {
    const char *bar = strchr(p, '|');
    size_t len = bar ? (size_t)(bar - p) : strlen(p);
    if (len == n && strncmp(p, v, n) == 0) return true;
    if (!bar) break;
    p = bar + 1;
  }
  return false;
}

static int bad(const char *cmd, const cli_option *o, const char *want, const char *v) {
  fprintf(stderr, "%s: --%s: expected %s, got '%s'\n", cmd, o->name, want, v);
  return -1;
}

/* x against the table's range (if any); the message names the bound. */
static int in_range(const char *cmd, const cli_option *o, double x, const char *v) {
  if (!(o->min < o->max)) return 0;
  bool integer = o->kind == CLI_INT || o->kind == CLI_POS_INT;
  char want[96];
  if (x < o->min) {
    if (o->kind == CLI_POS_INT && o->min <= 1) return bad(cmd, o, "a positive integer", v);
    snprintf(want, sizeof want, integer ? "an integer >= %.0f" : "a number >= %g", o->min);
    return bad(cmd, o, want, v);
  }
  if (x > o->max) {
    snprintf(want, sizeof want, integer ? "at most %.0f" : "at most %g", o->max);
    return bad(cmd, o, want, v);
  }
  return 0;
}

static int set_integer(const char *cmd, const cli_option *o, const char *v) {
  bool pos = o->kind == CLI_POS_INT;
  const char *what = pos ? "a positive integer" : "an integer";
  char *end = NULL;
  errno = 0;
  long x = strtol(v, &end, 10);
  if (end == v || *end) return bad(cmd, o, what, v);
  if (errno == ERANGE && !(o->min < o->max)) { /* beyond long: say long's bound */
    char want[64];
    snprintf(want, sizeof want, x > 0 ? "at most %ld" : "an integer >= %ld", x);
    return bad(cmd, o, want, v);
  }
  if (pos && x <= 0) return bad(cmd, o, what, v);
  if (in_range(cmd, o, (double)x, v)) return -1;
  *(long *)o->value = x;
  return 0;
}

static int set_number(const char *cmd, const cli_option *o, const char *v) {
  const char *what = o->kind == CLI_POS_DOUBLE ? "a positive number" : "a number";
  char *end = NULL;
  errno = 0;
  double x = strtod(v, &end);
  if (end == v || *end || isnan(x)) return bad(cmd, o, what, v);
  if (o->kind == CLI_F32) {
    char want[96];
    snprintf(want, sizeof want, "a finite number within the f32 range (magnitude at most %.9g)",
             (double)FLT_MAX);
    if (fabs(x) > FLT_MAX) return bad(cmd, o, want, v);
    if (x != 0 && (float)x == 0) {
      fprintf(stderr, "%s: --%s: '%s' is too small for an f32: it would round to 0 (the "
              "smallest positive f32 is %.9g); give 0 if 0 is meant\n", cmd, o->name, v,
              (double)FLT_TRUE_MIN);
      return -1;
    }
  } else if (isinf(x) || (errno == ERANGE && x == 0)) {
    return bad(cmd, o, "a finite number within the double range", v);
  }
  if (o->kind == CLI_POS_DOUBLE && !(x > 0)) return bad(cmd, o, what, v);
  if (in_range(cmd, o, x, v)) return -1;
  *(double *)o->value = x;
  return 0;
}

static int set_value(const char *cmd, const cli_option *o, const char *v) {
  switch (o->kind) {
  case CLI_INT:
  case CLI_POS_INT: return set_integer(cmd, o, v);
  case CLI_DOUBLE:
  case CLI_POS_DOUBLE:
  case CLI_F32: return set_number(cmd, o, v);
  case CLI_CHOICE:
    if (!in_choices(o->choices, v)) {
      fprintf(stderr, "%s: --%s: expected one of %s, got '%s'\n", cmd, o->name, o->choices, v);
      return -1;
    }
    *(const char **)o->value = v;
    return 0;
  case CLI_STRING:
    if (!*v) {
      fprintf(stderr, "%s: --%s: expected a value, got an empty string\n", cmd, o->name);
      return -1;
    }
    *(const char **)o->value = v;
    return 0;
  case CLI_FLAG: break;
  }
  return -1;
}

int cli_parse(const char *cmd, const cli_option *opts, int argc, char **argv,
              const char **positional, int max_positional, int *npositional) {
  int npos = 0;
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) return 1;
    if (strncmp(a, "--", 2) != 0 || a[2] == '\0') {
      if (npos >= max_positional) {
        fprintf(stderr, "%s: unexpected argument '%s' (see %s --help)\n", cmd, a, cmd);
        return -1;
      }
      positional[npos++] = a;
      continue;
    }
    const char *name = a + 2, *eq = strchr(name, '=');
    size_t len = eq ? (size_t)(eq - name) : strlen(name);
    const cli_option *o = find(opts, name, len);
    if (!o) {
      const cli_option *near = nearest(opts, name, len);
      if (near)
        fprintf(stderr, "%s: unknown option --%.*s: did you mean --%s? (see %s --help)\n", cmd,
                (int)len, name, near->name, cmd);
      else
        fprintf(stderr, "%s: unknown option --%.*s (see %s --help)\n", cmd, (int)len, name, cmd);
      return -1;
    }
    if (o->kind == CLI_FLAG) {
      if (eq) {
        fprintf(stderr, "%s: --%s takes no value\n", cmd, o->name);
        return -1;
      }
      *(bool *)o->value = true;
      if (o->seen) *o->seen = true;
      continue;
    }
    const char *v = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
    if (!v) {
      fprintf(stderr, "%s: --%s needs a value (%s)\n", cmd, o->name, o->arg ? o->arg : "VALUE");
      return -1;
    }
    /* "--lr --epochs 1": the value was forgotten; a number or a choice never starts with "--"
     * (a file name may: strings take it as written) */
    if (!eq && o->kind != CLI_STRING && strncmp(v, "--", 2) == 0 && v[2] &&
        find(opts, v + 2, strcspn(v + 2, "="))) {
      fprintf(stderr, "%s: --%s needs a value (%s), but is followed by the option %s\n", cmd,
              o->name, o->kind == CLI_CHOICE ? o->choices : o->arg ? o->arg : "VALUE", v);
      return -1;
    }
    if (set_value(cmd, o, v)) return -1;
    if (o->seen) *o->seen = true;
  }
  if (npositional) *npositional = npos;
  return 0;
}

void cli_given(const cli_option *opts, int argc, char **argv, const char **text) {
  size_t n = 0;
  while (opts[n].name) text[n++] = NULL;
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i];
    if (strncmp(a, "--", 2) != 0 || a[2] == '\0') continue; /* a positional argument */
    const char *name = a + 2, *eq = strchr(name, '=');
    const cli_option *o = find(opts, name, eq ? (size_t)(eq - name) : strlen(name));
    if (!o) continue;
    const char *v = o->kind == CLI_FLAG ? "" : eq ? eq + 1 : i + 1 < argc ? argv[++i] : NULL;
    if (v) text[o - opts] = v;
  }
}

void cli_number_text(double x, char *buf, size_t cap) {
  for (int pass = 0; pass < 2; pass++) /* without an exponent if it can, else with one */
    for (int digits = 1; digits <= 17; digits++) {
      snprintf(buf, cap, "%.*g", digits, x);
      if (strtod(buf, NULL) == x && (pass || !strchr(buf, 'e'))) return;
    }
}

void cli_value_text(const cli_option *o, char *buf, size_t cap) {
  const char *s;
  switch (o->kind) {
  case CLI_FLAG: snprintf(buf, cap, "%s", *(bool *)o->value ? "yes" : "no"); return;
  case CLI_INT:
  case CLI_POS_INT: snprintf(buf, cap, "%ld", *(long *)o->value); return;
  case CLI_DOUBLE:
  case CLI_POS_DOUBLE:
  case CLI_F32: cli_number_text(*(double *)o->value, buf, cap); return;
  case CLI_CHOICE:
  case CLI_STRING:
    s = *(const char **)o->value;
    snprintf(buf, cap, "%s", s ? s : "");
    return;
  }
}

static bool listed(const char *const *only, const char *name) {
  if (!only) return true;
  for (; *only; only++)
    if (strcmp(*only, name) == 0) return true;
  return false;
}

void cli_help(FILE *f, const char *cmd, const char *usage, const cli_option *opts) {
  cli_help_only(f, cmd, usage, opts, NULL);
}

void cli_help_only(FILE *f, const char *cmd, const char *usage, const cli_option *opts,
                   const char *const *only) {
  fprintf(f, "usage: %s %s\n\noptions:\n", cmd, usage);
  for (const cli_option *o = opts; o->name; o++) {
    if (!listed(only, o->name)) continue;
    char left[64];
    const char *arg = o->kind == CLI_FLAG ? "" : (o->kind == CLI_CHOICE ? o->choices : o->arg);
    snprintf(left, sizeof left, "--%s%s%s", o->name, *arg ? " " : "", arg ? arg : "");
    char def[128] = "";
    bool ranged = o->min < o->max;
    switch (o->kind) {
    case CLI_INT:
    case CLI_POS_INT: {
      long v = *(long *)o->value;
      if (!(ranged && (v < o->min || v > o->max)) && !(o->kind == CLI_POS_INT && v <= 0))
        snprintf(def, sizeof def, "%ld", v);
      break;
    }
    case CLI_DOUBLE:
    case CLI_POS_DOUBLE:
    case CLI_F32: {
      double v = *(double *)o->value;
      if (!(ranged && (v < o->min || v > o->max))) snprintf(def, sizeof def, "%g", v);
      break;
    }
    case CLI_CHOICE:
    case CLI_STRING:
      if (*(const char **)o->value) snprintf(def, sizeof def, "%s", *(const char **)o->value);
      break;
    case CLI_FLAG: break;
    }
    const char *at = strstr(o->help, "{default}");
    if (at)
      fprintf(f, "  %-26s %.*s%s%s", left, (int)(at - o->help), o->help, def, at + 9);
    else
      fprintf(f, "  %-26s %s%s%s%s", left, o->help, *def ? " (default " : "", def, *def ? ")" : "");
    fputc('\n', f);
  }
  fprintf(f, "  %-26s %s\n", "--help", "show this help");
}
