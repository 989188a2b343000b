/* safetensors_header.c: parses a safetensors header with the strict JSON pieces of json.c
 * against the format's schema, then validates it: at most LOOM_SAFETENSORS_MAX_TENSORS
 * tensors and LOOM_SAFETENSORS_MAX_META metadata keys, unique non-empty names and keys (found
 * by sorting: O(n log n)), known dtypes, shapes without overflow, byte ranges of numel * dtype
 * size that tile the data section exactly (in order, no gap, no overlap or duplicate entry,
 * nothing past the end). Each fault has its message. */
#include "io/safetensors_int.h"
#include "core/tensor_int.h"

#include <stdlib.h>
#include <string.h>

typedef struct parser {
  loom_safetensors *f;
  loom__json j;
  loom__vec scratch; /* char: field names and dtype strings */
} parser;

static int field_name(parser *p, const char **out) {
  p->scratch.len = 0;
  size_t len;
  int rc = loom__json_string(&p->j, &p->scratch, &len);
  if (rc) return rc;
  if (strlen(p->scratch.p) != len) return loom__json_fail(&p->j, "NUL character in a field name");
  *out = p->scratch.p;
  return LOOM_OK;
}

/* A string into f->strings; *off its offset. */
static int string(parser *p, size_t *off, const char *what) {
  *off = p->f->strings.len;
  size_t len;
  int rc = loom__json_string(&p->j, &p->f->strings, &len);
  if (rc) return rc;
  if (strlen(loom__st_str(p->f, *off)) != len)
    return loom__json_fail(&p->j, "NUL character in a %s", what);
  return LOOM_OK;
}

static int parse_meta(parser *p) {
  int rc = loom__json_expect(&p->j, '{');
  if (rc || loom__json_peek(&p->j, '}')) return rc;
  for (;;) {
    loom__st_meta m;
    if ((rc = string(p, &m.key, "metadata key")) || (rc = loom__json_expect(&p->j, ':')))
      return rc;
    loom__json_ws(&p->j);
    if (p->j.pos >= p->j.n || p->j.s[p->j.pos] != '"')
      return loom__json_fail(&p->j, "metadata value of \"%s\" is not a string",
                             loom__st_str(p->f, m.key));
    if (p->f->meta.len == LOOM_SAFETENSORS_MAX_META)
      return loom__json_fail(&p->j, "more than %u metadata keys (loom's limit)",
                             LOOM_SAFETENSORS_MAX_META);
    m.value_at = 8 + p->j.pos;
    if ((rc = string(p, &m.value, "metadata value")) ||
        (rc = loom__vec_push(&p->f->meta, &m, p->j.who)))
      return rc;
    if (loom__json_peek(&p->j, ',')) continue;
    return loom__json_expect(&p->j, '}');
  }
}

static int parse_shape(parser *p, loom__st_tensor *t) {
  int rc = loom__json_expect(&p->j, '[');
  t->shape = p->f->shapes.len;
  t->ndim = 0;
  if (rc || loom__json_peek(&p->j, ']')) return rc;
  for (;;) {
    uint64_t d;
    if ((rc = loom__json_uint(&p->j, &d))) return rc;
    int64_t v = (int64_t)d;
    if ((rc = loom__vec_push(&p->f->shapes, &v, p->j.who))) return rc;
    t->ndim++;
    if (loom__json_peek(&p->j, ',')) continue;
    return loom__json_expect(&p->j, ']');
  }
}

static int parse_tensor(parser *p, size_t name) {
  const char *tn = loom__st_str(p->f, name);
  loom__st_tensor t = {.name = name};
  unsigned seen = 0;
  int rc = loom__json_expect(&p->j, '{');
  if (rc) return rc;
  if (loom__json_peek(&p->j, '}'))
    return loom__json_fail(&p->j, "tensor \"%s\" has no dtype, shape or data_offsets", tn);
  for (;;) {
    const char *key = NULL;
    if ((rc = field_name(p, &key)) || (rc = loom__json_expect(&p->j, ':'))) return rc;
    unsigned bit = strcmp(key, "dtype") == 0 ? 1u : strcmp(key, "shape") == 0 ? 2u
                   : strcmp(key, "data_offsets") == 0 ? 4u : 0u;
    if (!bit) return loom__json_fail(&p->j, "tensor \"%s\": unknown field \"%s\"", tn, key);
    if (seen & bit) return loom__json_fail(&p->j, "tensor \"%s\": field \"%s\" given twice", tn, key);
    seen |= bit;
    if (bit == 1) {
      p->scratch.len = 0;
      size_t len;
      if ((rc = loom__json_string(&p->j, &p->scratch, &len))) return rc;
      t.dt = loom__st_dtype_find(p->scratch.p, len);
      if (!t.dt)
        return loom__json_fail(&p->j, "tensor \"%s\": unknown dtype \"%s\"", tn,
                               (const char *)p->scratch.p);
    } else if (bit == 2) {
      if ((rc = parse_shape(p, &t))) return rc;
    } else {
      if ((rc = loom__json_expect(&p->j, '[')) || (rc = loom__json_uint(&p->j, &t.begin)) ||
          (rc = loom__json_expect(&p->j, ',')) || (rc = loom__json_uint(&p->j, &t.end)) ||
          (rc = loom__json_expect(&p->j, ']')))
        return rc;
    }
    if (loom__json_peek(&p->j, ',')) continue;
    if ((rc = loom__json_expect(&p->j, '}'))) return rc;
    break;
  }
  if (seen != 7)
    return loom__json_fail(&p->j, "tensor \"%s\" has no \"%s\"", tn,
                           !(seen & 1) ? "dtype" : !(seen & 2) ? "shape" : "data_offsets");
  if (p->f->tensors.len == LOOM_SAFETENSORS_MAX_TENSORS)
    return loom__json_fail(&p->j, "more than %u tensors (loom's limit)",
                           LOOM_SAFETENSORS_MAX_TENSORS);
  return loom__vec_push(&p->f->tensors, &t, p->j.who);
}

static int parse(parser *p) {
  loom__json *j = &p->j;
  if (j->n == 0 || j->s[0] != '{') return loom__json_fail(j, "the header does not start with '{'");
  int rc = loom__json_expect(j, '{');
  bool have_meta = false;
  if (!rc && !loom__json_peek(j, '}')) {
    for (;;) {
      size_t name;
      size_t at = j->pos;
      if ((rc = string(p, &name, "tensor name")) || (rc = loom__json_expect(j, ':'))) return rc;
      if (strcmp(loom__st_str(p->f, name), "__metadata__") == 0) {
        if (have_meta) {
          j->pos = at;
          return loom__json_fail(j, "\"__metadata__\" given twice");
        }
        have_meta = true;
        rc = parse_meta(p);
      } else {
        rc = parse_tensor(p, name);
      }
      if (rc) return rc;
      if (loom__json_peek(j, ',')) continue;
      if ((rc = loom__json_expect(j, '}'))) return rc;
      break;
    }
  }
  if (rc) return rc;
  loom__json_ws(j);
  if (j->pos != j->n) return loom__json_fail(j, "characters after the header's JSON object");
  return LOOM_OK;
}

/* ---- validation ----------------------------------------------------------------------- */

static __thread const loom_safetensors *cmp_file;

static int by_offsets(const void *a, const void *b) {
  const loom__st_tensor *x = a, *y = b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  return x->end < y->end ? -1 : x->end > y->end;
}

static int by_name(const void *a, const void *b) {
  const loom__st_tensor *t = cmp_file->tensors.p;
  return strcmp(loom__st_str(cmp_file, t[*(const size_t *)a].name),
                loom__st_str(cmp_file, t[*(const size_t *)b].name));
}

static int fail(const loom_safetensors *f, const char *who, const char *what, const char *name) {
  return loom__fail(LOOM_EFORMAT, "%s: %s: tensor \"%s\": %s", who, f->label, name, what);
}

static int unique_keys(const loom_safetensors *f, const char *who) {
  const loom__st_meta *m = f->meta.p;
  size_t n = f->meta.len;
  if (n < 2) return LOOM_OK;
  const char **keys = loom__malloc(LOOM_POOL_META, n * sizeof *keys);
  if (!keys) return loom__fail(LOOM_ENOMEM, "%s: out of memory for the metadata keys", who);
  for (size_t i = 0; i < n; i++) keys[i] = loom__st_str(f, m[i].key);
  const char *twice = loom__sort_find_repeat(keys, n);
  int rc = twice ? loom__fail(LOOM_EFORMAT, "%s: %s: metadata key \"%s\" appears twice", who,
                              f->label, twice)
                 : LOOM_OK;
  loom__free(keys);
  return rc;
}

static int validate(loom_safetensors *f, const char *who) {
  loom__st_tensor *t = f->tensors.p;
  size_t n = f->tensors.len, data = f->size - f->data_start;
  const int64_t *shapes = f->shapes.p;
  char msg[320], sh[160];
  for (size_t i = 0; i < n; i++) {
    const char *name = loom__st_str(f, t[i].name);
    if (!name[0]) return loom__fail(LOOM_EFORMAT, "%s: %s: a tensor has an empty name", who, f->label);
    size_t numel = 1, nbytes;
    for (int d = 0; d < t[i].ndim; d++)
      if (!loom__mul_ok(numel, (size_t)shapes[t[i].shape + (size_t)d], &numel))
        return fail(f, who, "shape overflows the element count", name);
    if (!loom__mul_ok(numel, t[i].dt->size, &nbytes))
      return fail(f, who, "byte size overflows", name);
    t[i].numel = numel;
    if (t[i].end < t[i].begin) {
      snprintf(msg, sizeof msg, "data_offsets [%llu, %llu] are reversed",
               (unsigned long long)t[i].begin, (unsigned long long)t[i].end);
      return fail(f, who, msg, name);
    }
    if (t[i].end > data) {
      snprintf(msg, sizeof msg,
               "data_offsets [%llu, %llu] run past the data section's %zu bytes (truncated file?)",
               (unsigned long long)t[i].begin, (unsigned long long)t[i].end, data);
      return fail(f, who, msg, name);
    }
    if (t[i].end - t[i].begin != nbytes) {
      /* a file whose every tensor is a scalar has no shape array at all */
      loom__shape_str(t[i].ndim < 16 ? t[i].ndim : 16, shapes ? shapes + t[i].shape : NULL, sh,
                      sizeof sh);
      snprintf(msg, sizeof msg, "data_offsets [%llu, %llu] hold %llu bytes but %s %s needs %zu",
               (unsigned long long)t[i].begin, (unsigned long long)t[i].end,
               (unsigned long long)(t[i].end - t[i].begin), t[i].dt->name, sh, nbytes);
      return fail(f, who, msg, name);
    }
  }
  if (n) qsort(t, n, sizeof *t, by_offsets);
  uint64_t at = 0;
  for (size_t i = 0; i < n; i++) {
    const char *name = loom__st_str(f, t[i].name);
    if (t[i].begin < at) {
      bool same = t[i].begin == t[i - 1].begin && t[i].end == t[i - 1].end;
      snprintf(msg, sizeof msg, "data_offsets [%llu, %llu] %s tensor \"%s\"%s",
               (unsigned long long)t[i].begin, (unsigned long long)t[i].end,
               same ? "are the same as those of" : "overlap", loom__st_str(f, t[i - 1].name),
               same ? " (a duplicate entry for one byte range)" : "");
      return fail(f, who, msg, name);
    }
    if (t[i].begin > at) {
      snprintf(msg, sizeof msg, "a gap of %llu bytes before its data_offsets [%llu, %llu]",
               (unsigned long long)(t[i].begin - at), (unsigned long long)t[i].begin,
               (unsigned long long)t[i].end);
      return fail(f, who, msg, name);
    }
    at = t[i].end;
  }
  if (at != data)
    return loom__fail(LOOM_EFORMAT, "%s: %s: the tensors cover %llu bytes of the %zu-byte data section",
                      who, f->label, (unsigned long long)at, data);
  if (n) {
    f->by_name = loom__malloc(LOOM_POOL_META, n * sizeof(size_t));
    if (!f->by_name) return loom__fail(LOOM_ENOMEM, "%s: out of memory for the name index", who);
    for (size_t i = 0; i < n; i++) f->by_name[i] = i;
    cmp_file = f;
    qsort(f->by_name, n, sizeof(size_t), by_name);
    for (size_t i = 1; i < n; i++) {
      const char *a = loom__st_str(f, t[f->by_name[i]].name);
      if (strcmp(a, loom__st_str(f, t[f->by_name[i - 1]].name)) == 0)
        return loom__fail(LOOM_EFORMAT, "%s: %s: tensor name \"%s\" appears twice", who, f->label, a);
    }
  }
  return unique_keys(f, who);
}

int loom__st_parse(loom_safetensors *f, const char *who) {
  if (f->size < 8)
    return loom__fail(LOOM_EFORMAT, "%s: %s: %zu bytes is too short for the 8-byte header length",
                      who, f->label, f->size);
  uint64_t n;
  memcpy(&n, f->buf, 8);
  if (n > LOOM_SAFETENSORS_MAX_HEADER)
    return loom__fail(LOOM_EFORMAT, "%s: %s: header length %llu exceeds the %u-byte limit", who,
                      f->label, (unsigned long long)n, LOOM_SAFETENSORS_MAX_HEADER);
  if (n > f->size - 8)
    return loom__fail(LOOM_EFORMAT,
                      "%s: %s: header length %llu runs past the end of the file (%zu bytes)", who,
                      f->label, (unsigned long long)n, f->size);
  f->data_start = 8 + (size_t)n;
  f->strings.elem = 1;
  f->shapes.elem = sizeof(int64_t);
  f->tensors.elem = sizeof(loom__st_tensor);
  f->meta.elem = sizeof(loom__st_meta);
  parser p = {.f = f, .j = {who, f->label, f->buf + 8, (size_t)n, 0}, .scratch = {.elem = 1}};
  int rc = parse(&p);
  loom__vec_free(&p.scratch);
  return rc ? rc : validate(f, who);
}
