/* ranks_side.c: one rank's side of the ranks' fingerprint tests (ranks_side.h). */
#include "ranks_side.h"

#include <stdio.h>
#include <string.h>

/* The base command line: valid for two ranks (the refusal comes before the data). */
static const char *const base[] = {"--strategy", "ddp", "--ranks", "2", "--hidden", "8",
                                   "--limit", "64", "--batch", "8", "--epochs", "1",
                                   "--threads", "1", "--quiet"};
enum { NBASE = sizeof base / sizeof *base };

int ranks_side_parse(ranks_side *s, const char *const *extra, int nextra, const cli_option *more) {
  train_cli_defaults(&s->o, &s->c);
  s->timeout = 300;
  s->timeout_seen = false;
  size_t n = train_cli_table(&s->o, &s->c, &s->timeout, &s->timeout_seen, s->table, TRAIN_CLI_MAX);
  if (more) s->table[n++] = *more, s->table[n] = (cli_option){0};
  char *argv[NBASE + 4];
  int argc = 0;
  for (int i = 0; i < NBASE; i++) argv[argc++] = (char *)base[i];
  for (int i = 0; i < nextra && i < 4; i++) argv[argc++] = (char *)extra[i];
  if (cli_parse("loom train", s->table, argc, argv, NULL, 0, NULL) != 0) return -1;
  s->o.nranks_fp = train_cli_fingerprint(s->table, s->fp, TRAIN_CLI_MAX + 1);
  s->o.ranks_fp = s->fp;
  return 0;
}

int ranks_side_base(ranks_side *s) {
  if (ranks_side_parse(s, NULL, 0, NULL)) return -1;
  return train_opts_check(&s->o, &s->c) ? -1 : 0;
}

/* A value of option t other than its current one, as text ("" for a flag: it is given). */
static void other_value(const cli_option *t, const char *file, char *buf, size_t cap) {
  double x;
  long v;
  switch (t->kind) {
  case CLI_FLAG: buf[0] = '\0'; return;
  case CLI_INT:
  case CLI_POS_INT:
    v = *(long *)t->value;
    snprintf(buf, cap, "%ld", t->min < t->max && v + 1 > t->max ? v - 1 : v + 1);
    return;
  case CLI_DOUBLE:
  case CLI_POS_DOUBLE:
  case CLI_F32:
    x = *(double *)t->value;
    x = x == 0 ? 1 : t->min < t->max && 2 * x > t->max ? x / 2 : 2 * x;
    snprintf(buf, cap, "%.17g", x);
    return;
  case CLI_CHOICE: {
    const char *cur = *(const char **)t->value, *p = t->choices;
    for (;;) { /* the first choice that is not the current one */
      size_t len = strcspn(p, "|");
      snprintf(buf, cap, "%.*s", (int)len, p);
      if (!cur || strcmp(buf, cur) != 0 || !p[len]) return;
      p += len + 1;
    }
  }
  case CLI_STRING: snprintf(buf, cap, "%s", file); return;
  }
  buf[0] = '\0';
}

void ranks_side_case(const cli_option *t, const char *file, ranks_case *c) {
  snprintf(c->flag, sizeof c->flag, "--%s", t->name);
  other_value(t, file, c->value, sizeof c->value);
  snprintf(c->want, sizeof c->want, "the ranks disagree: rank 1 has --%s%s", t->name,
           t->kind == CLI_FLAG ? "," : " ");
  c->extra[0] = c->flag, c->extra[1] = c->value;
  c->nextra = t->kind == CLI_FLAG ? 1 : 2;
}
