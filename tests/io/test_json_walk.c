/* test_json_walk.c: loom_json_object_walk, the JSON reader of `loom plot` (one object a line):
 * members handed over in order with their dotted key paths and decoded values (escapes,
 * surrogate pairs, numbers in every JSON form and Python's NaN/Infinity), arrays checked and
 * skipped; malformed text refused with LOOM_EFORMAT naming the label and the byte; a callback's
 * status stops the walk. */
#include "lt.h"

#include <loom/loom.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

typedef struct seen {
  char text[1024];
  size_t len;
  int stop_at; /* stop with LOOM_ECANCELED at this member (0: never) */
  int n;
} seen;

static int collect(const loom_json_member *m, void *ctx) {
  seen *s = ctx;
  s->n++;
  char v[128];
  switch (m->kind) {
  case LOOM_JSON_NUMBER: snprintf(v, sizeof v, "%.17g", m->number); break;
  case LOOM_JSON_BOOL: snprintf(v, sizeof v, "%s", m->boolean ? "true" : "false"); break;
  case LOOM_JSON_STRING: snprintf(v, sizeof v, "'%s'", m->string); break;
  case LOOM_JSON_NULL: snprintf(v, sizeof v, "null"); break;
  }
  s->len += (size_t)snprintf(s->text + s->len, sizeof s->text - s->len, "%s=%s;", m->key, v);
  return s->n == s->stop_at ? LOOM_EINVAL : LOOM_OK;
}

static int walk(const char *text, seen *s) {
  memset(s, 0, sizeof *s);
  return loom_json_object_walk(text, strlen(text), "line 7", collect, s);
}

LT_TEST(json_walk_hands_over_members_with_their_paths) {
  seen s;
  LT_EQ(walk(" {\"step\": 12, \"loss\": -1.5e-3, \"ok\": true, \"no\": false, \"gap\": null,"
             " \"name\": \"a\\\"b\\u00e9\\ud83d\\ude00\", \"arr\": [1, {\"x\": 2}, [3]],"
             " \"mem\": {\"compute\": {\"current_bytes\": 1048576}, \"host\": {}},"
             " \"n\": NaN, \"big\": 1e999, \"minf\": -Infinity, \"zero\": -0.0} \n", &s),
        LOOM_OK);
  LT_TRUE(strcmp(s.text, "step=12;loss=-0.0015;ok=true;no=false;gap=null;"
                         "name='a\"b\xc3\xa9\xf0\x9f\x98\x80';"
                         "mem.compute.current_bytes=1048576;n=nan;big=inf;minf=-inf;zero=-0;") == 0);
  LT_EQ(s.n, 11);
  LT_EQ(walk("{}", &s), LOOM_OK);
  LT_EQ(s.n, 0);
  /* a callback's status stops the walk */
  memset(&s, 0, sizeof s);
  s.stop_at = 2;
  LT_EQ(loom_json_object_walk("{\"a\": 1, \"b\": 2, \"c\": 3}", 24, "x", collect, &s), LOOM_EINVAL);
  LT_EQ(s.n, 2);
}

LT_TEST(json_walk_refuses_what_is_not_one_json_object) {
  static const struct {
    const char *text, *why;
  } bad[] = {
      {"", "expected '{'"},
      {"[1]", "expected '{'"},
      {"{\"a\": 01}", "leading zero"},
      {"{\"a\": 1.}", "decimal point"},
      {"{\"a\": 1e}", "exponent"},
      {"{\"a\": +1}", "expected a number"},
      {"{\"a\": .5}", "expected a number"},
      {"{\"a\": 1,}", "expected '\"'"},
      {"{\"a\" 1}", "expected ':'"},
      {"{\"a\": 1} {\"b\": 2}", "more after the object"},
      {"{\"a\": \"\\x\"}", "bad escape"},
      {"{\"a\": \"\\ud800\"}", "high surrogate"},
      {"{\"a\": \"\x01\"}", "control character"},
      {"{\"a\": \"\xff\"}", "invalid UTF-8"},
      {"{\"a\": tru}", "expected a number"},
      {"{\"a\": 1", "expected '}'"},
      {"{\"a\":[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]}", "nested deeper than 16"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    seen s;
    int rc = walk(bad[i].text, &s);
    LT_EQ(rc, LOOM_EFORMAT);
    const char *msg = loom_last_error();
    if (!strstr(msg, bad[i].why) || !strstr(msg, "line 7: byte "))
      fprintf(stderr, "case %zu: %s\n", i, msg);
    LT_TRUE(strstr(msg, bad[i].why) && strstr(msg, "line 7: byte "));
  }
  /* a key path past 255 bytes */
  char deep[600] = "{";
  for (int i = 0; i < 12; i++) strcat(deep, "\"abcdefghijklmnopqrstuvwxyz\": {");
  strcat(deep, "\"k\": 1");
  for (int i = 0; i < 12; i++) strcat(deep, "}");
  strcat(deep, "}");
  seen s;
  LT_EQ(walk(deep, &s), LOOM_EFORMAT);
  LT_TRUE(strstr(loom_last_error(), "longer than 255 bytes") != NULL);
  LT_EQ(loom_json_object_walk(NULL, 0, "x", collect, &s), LOOM_EINVAL);
}
