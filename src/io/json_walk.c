/* json_walk.c: one JSON object (a line of a JSON Lines file, such as `loom train --metrics`)
 * read strictly with the safetensors reader's pieces (json.c) and handed to a callback member by
 * member: scalars with the dotted path of the objects around them ("mem.compute.peak_bytes");
 * arrays are checked and skipped. No value tree: nothing is kept after the callback. */
#include "io/io_int.h"

#include "loom/io.h"

#include <string.h>

#define WALK_DEPTH 16  /* objects and arrays inside each other */
#define WALK_PATH 256  /* bytes of a dotted path */

typedef struct walker {
  loom__json j;
  loom__vec key; /* char: the current key, decoded */
  char path[WALK_PATH];
  loom_json_member_fn fn;
  void *ctx;
} walker;

static int value(walker *w, size_t path_len, int depth, bool report);

static int object(walker *w, size_t path_len, int depth, bool report) {
  int rc = loom__json_expect(&w->j, '{');
  if (rc) return rc;
  if (loom__json_peek(&w->j, '}')) return LOOM_OK;
  do {
    w->key.len = 0;
    size_t len = 0;
    if ((rc = loom__json_string(&w->j, &w->key, &len))) return rc;
    if (strlen(w->key.p) != len) return loom__json_fail(&w->j, "NUL character in a key");
    size_t at = path_len + (path_len ? 1 : 0);
    if (at + len >= WALK_PATH)
      return loom__json_fail(&w->j, "a key path longer than %d bytes", WALK_PATH - 1);
    if (path_len) w->path[path_len] = '.';
    memcpy(w->path + at, w->key.p, len + 1);
    if ((rc = loom__json_expect(&w->j, ':')) || (rc = value(w, at + len, depth, report)))
      return rc;
    w->path[path_len] = '\0';
  } while (loom__json_peek(&w->j, ','));
  return loom__json_expect(&w->j, '}');
}

static int array(walker *w, int depth) {
  int rc = loom__json_expect(&w->j, '[');
  if (rc || loom__json_peek(&w->j, ']')) return rc;
  do
    if ((rc = value(w, strlen(w->path), depth, false))) return rc;
  while (loom__json_peek(&w->j, ','));
  return loom__json_expect(&w->j, ']');
}

static bool word(loom__json *j, const char *s) {
  size_t n = strlen(s);
  if (j->n - j->pos < n || memcmp(j->s + j->pos, s, n) != 0) return false;
  j->pos += n;
  return true;
}

static int value(walker *w, size_t path_len, int depth, bool report) {
  loom__json_ws(&w->j);
  if (w->j.pos >= w->j.n) return loom__json_fail(&w->j, "expected a value, found the end");
  unsigned char c = w->j.s[w->j.pos];
  if ((c == '{' || c == '[') && depth == WALK_DEPTH)
    return loom__json_fail(&w->j, "nested deeper than %d levels", WALK_DEPTH);
  if (c == '{') return object(w, path_len, depth + 1, report);
  if (c == '[') return array(w, depth + 1);
  loom_json_member m = {.key = w->path};
  int rc = LOOM_OK;
  if (c == '"') {
    w->key.len = 0;
    size_t len = 0;
    if ((rc = loom__json_string(&w->j, &w->key, &len))) return rc;
    m.kind = LOOM_JSON_STRING;
    m.string = w->key.p;
  } else if (word(&w->j, "true") || word(&w->j, "false")) {
    m.kind = LOOM_JSON_BOOL;
    m.boolean = w->j.s[w->j.pos - 1] == 'e' && w->j.s[w->j.pos - 2] == 'u';
  } else if (word(&w->j, "null")) {
    m.kind = LOOM_JSON_NULL;
  } else {
    m.kind = LOOM_JSON_NUMBER;
    if ((rc = loom__json_number(&w->j, &m.number))) return rc;
  }
  return report ? w->fn(&m, w->ctx) : LOOM_OK;
}

int loom_json_object_walk(const char *text, size_t n, const char *label, loom_json_member_fn fn,
                          void *ctx) {
  if (!text || !fn)
    return loom__fail(LOOM_EINVAL, "loom_json_object_walk: %s is NULL", text ? "fn" : "text");
  walker w = {.j = {"loom_json_object_walk", label ? label : "JSON", (const unsigned char *)text,
                    n, 0, "byte"},
              .key = {.elem = 1}, .fn = fn, .ctx = ctx};
  int rc = object(&w, 0, 1, true);
  if (!rc) {
    loom__json_ws(&w.j);
    if (w.j.pos < w.j.n) rc = loom__json_fail(&w.j, "more after the object");
  }
  loom__vec_free(&w.key);
  return rc;
}
