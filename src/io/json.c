/* json.c: the strict JSON pieces a safetensors header needs (whitespace, punctuation, strings
 * with every escape and UTF-8 validation, non-negative integers), numbers (for json_walk.c)
 * and string output with escaping. The header's schema is walked by safetensors_header.c; there is no value tree. */
#include "io/io_int.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

int loom__json_fail(const loom__json *j, const char *fmt, ...) {
  char what[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  return loom__fail(LOOM_EFORMAT, "%s: %s: %s %zu: %s", j->who, j->label,
                    j->unit ? j->unit : "header byte", j->pos, what);
}

void loom__json_ws(loom__json *j) {
  while (j->pos < j->n) {
    unsigned char c = j->s[j->pos];
    if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
    j->pos++;
  }
}

static const char *describe(const loom__json *j) {
  return j->pos >= j->n ? "the end of the header" : "another character";
}

int loom__json_expect(loom__json *j, char c) {
  loom__json_ws(j);
  if (j->pos < j->n && j->s[j->pos] == (unsigned char)c) {
    j->pos++;
    return LOOM_OK;
  }
  if (j->pos < j->n && j->s[j->pos] >= 0x20 && j->s[j->pos] < 0x7f)
    return loom__json_fail(j, "expected '%c', found '%c'", c, j->s[j->pos]);
  return loom__json_fail(j, "expected '%c', found %s", c, describe(j));
}

bool loom__json_peek(loom__json *j, char c) {
  loom__json_ws(j);
  if (j->pos < j->n && j->s[j->pos] == (unsigned char)c) {
    j->pos++;
    return true;
  }
  return false;
}

/* Length of the UTF-8 sequence starting at s (at most n bytes), 0 if invalid. */
static size_t utf8_seq(const unsigned char *s, size_t n) {
  unsigned char c = s[0];
  if (c < 0x80) return 1;
  size_t len;
  uint32_t cp, min;
  if ((c & 0xe0) == 0xc0) len = 2, cp = c & 0x1f, min = 0x80;
  else if ((c & 0xf0) == 0xe0) len = 3, cp = c & 0x0f, min = 0x800;
  else if ((c & 0xf8) == 0xf0) len = 4, cp = c & 0x07, min = 0x10000;
  else return 0;
  if (len > n) return 0;
  for (size_t i = 1; i < len; i++) {
    if ((s[i] & 0xc0) != 0x80) return 0;
    cp = (cp << 6) | (s[i] & 0x3f);
  }
  if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
  return len;
}

bool loom__utf8_valid(const unsigned char *s, size_t n) {
  for (size_t i = 0; i < n;) {
    size_t l = utf8_seq(s + i, n - i);
    if (!l) return false;
    i += l;
  }
  return true;
}

static int hex4(loom__json *j, uint32_t *out) {
  if (j->n - j->pos < 4) return loom__json_fail(j, "truncated \\u escape");
  uint32_t v = 0;
  for (int i = 0; i < 4; i++) {
    unsigned char c = j->s[j->pos + (size_t)i];
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
            : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (d < 0) return loom__json_fail(j, "bad hex digit in \\u escape");
    v = v << 4 | (uint32_t)d;
  }
  j->pos += 4;
  *out = v;
  return LOOM_OK;
}

static int put_utf8(loom__vec *out, uint32_t cp, const char *who) {
  unsigned char b[4];
  size_t n;
  if (cp < 0x80) b[0] = (unsigned char)cp, n = 1;
  else if (cp < 0x800) b[0] = (unsigned char)(0xc0 | cp >> 6), b[1] = (unsigned char)(0x80 | (cp & 0x3f)), n = 2;
  else if (cp < 0x10000)
    b[0] = (unsigned char)(0xe0 | cp >> 12), b[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f)),
    b[2] = (unsigned char)(0x80 | (cp & 0x3f)), n = 3;
  else
    b[0] = (unsigned char)(0xf0 | cp >> 18), b[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3f)),
    b[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f)), b[3] = (unsigned char)(0x80 | (cp & 0x3f)),
    n = 4;
  return loom__vec_append(out, b, n, who);
}

int loom__json_string(loom__json *j, loom__vec *out, size_t *len) {
  int rc = loom__json_expect(j, '"');
  if (rc) return rc;
  size_t start = out->len;
  for (;;) {
    if (j->pos >= j->n) return loom__json_fail(j, "unterminated string");
    unsigned char c = j->s[j->pos];
    if (c == '"') {
      j->pos++;
      break;
    }
    if (c < 0x20) return loom__json_fail(j, "control character 0x%02x in a string", c);
    if (c != '\\') {
      size_t l = utf8_seq(j->s + j->pos, j->n - j->pos);
      if (!l) return loom__json_fail(j, "invalid UTF-8 in a string");
      if ((rc = loom__vec_append(out, j->s + j->pos, l, j->who))) return rc;
      j->pos += l;
      continue;
    }
    if (++j->pos >= j->n) return loom__json_fail(j, "unterminated escape");
    c = j->s[j->pos++];
    uint32_t cp;
    switch (c) {
    case '"': cp = '"'; break;
    case '\\': cp = '\\'; break;
    case '/': cp = '/'; break;
    case 'b': cp = '\b'; break;
    case 'f': cp = '\f'; break;
    case 'n': cp = '\n'; break;
    case 'r': cp = '\r'; break;
    case 't': cp = '\t'; break;
    case 'u':
      if ((rc = hex4(j, &cp))) return rc;
      if (cp >= 0xdc00 && cp <= 0xdfff) return loom__json_fail(j, "lone low surrogate \\u%04x", cp);
      if (cp >= 0xd800 && cp <= 0xdbff) {
        uint32_t lo;
        if (j->n - j->pos < 2 || j->s[j->pos] != '\\' || j->s[j->pos + 1] != 'u')
          return loom__json_fail(j, "high surrogate \\u%04x without its pair", cp);
        j->pos += 2;
        if ((rc = hex4(j, &lo))) return rc;
        if (lo < 0xdc00 || lo > 0xdfff)
          return loom__json_fail(j, "high surrogate \\u%04x followed by \\u%04x", cp, lo);
        cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
      }
      break;
    default: j->pos--; return loom__json_fail(j, "bad escape '\\%c'", c >= 0x20 && c < 0x7f ? c : '?');
    }
    if ((rc = put_utf8(out, cp, j->who))) return rc;
  }
  *len = out->len - start;
  char nul = 0;
  return loom__vec_push(out, &nul, j->who);
}

int loom__json_uint(loom__json *j, uint64_t *out) {
  loom__json_ws(j);
  size_t start = j->pos;
  if (j->pos < j->n && j->s[j->pos] == '-')
    return loom__json_fail(j, "negative number where a size or offset belongs");
  uint64_t v = 0;
  while (j->pos < j->n && j->s[j->pos] >= '0' && j->s[j->pos] <= '9') {
    unsigned d = j->s[j->pos] - '0';
    if (v > (UINT64_C(0x7fffffffffffffff) - d) / 10) return loom__json_fail(j, "integer overflows 63 bits");
    v = v * 10 + d;
    j->pos++;
  }
  if (j->pos == start) return loom__json_fail(j, "expected a non-negative integer");
  if (j->pos - start > 1 && j->s[start] == '0') {
    j->pos = start;
    return loom__json_fail(j, "leading zero in an integer");
  }
  if (j->pos < j->n && (j->s[j->pos] == '.' || j->s[j->pos] == 'e' || j->s[j->pos] == 'E'))
    return loom__json_fail(j, "expected an integer, found a fraction or exponent");
  *out = v;
  return LOOM_OK;
}

/* Whether s[pos..n) starts with word. */
static bool starts(const loom__json *j, const char *word) {
  size_t len = strlen(word);
  return j->n - j->pos >= len && memcmp(j->s + j->pos, word, len) == 0;
}

int loom__json_number(loom__json *j, double *out) {
  loom__json_ws(j);
  static const struct {
    const char *word;
    double v;
  } words[] = {{"NaN", NAN}, {"nan", NAN}, {"-nan", NAN}, {"Infinity", INFINITY},
               {"-Infinity", -INFINITY}, {"inf", INFINITY}, {"-inf", -INFINITY}};
  for (size_t w = 0; w < sizeof words / sizeof words[0]; w++)
    if (starts(j, words[w].word)) {
      j->pos += strlen(words[w].word);
      *out = words[w].v;
      return LOOM_OK;
    }
  size_t start = j->pos, i = start;
  const unsigned char *s = j->s;
#define DIGITS(at) ((at) < j->n && s[at] >= '0' && s[at] <= '9')
  if (i < j->n && s[i] == '-') i++;
  if (!DIGITS(i)) return loom__json_fail(j, "expected a number");
  if (s[i] == '0' && DIGITS(i + 1)) return loom__json_fail(j, "leading zero in a number");
  while (DIGITS(i)) i++;
  if (i < j->n && s[i] == '.') {
    if (!DIGITS(i + 1)) return loom__json_fail(j, "a digit must follow the decimal point");
    for (i++; DIGITS(i); i++) {}
  }
  if (i < j->n && (s[i] == 'e' || s[i] == 'E')) {
    i++;
    if (i < j->n && (s[i] == '+' || s[i] == '-')) i++;
    if (!DIGITS(i)) return loom__json_fail(j, "a digit must follow the exponent");
    while (DIGITS(i)) i++;
  }
#undef DIGITS
  char buf[64];
  size_t len = i - start;
  if (len >= sizeof buf) { /* a long literal: its digits beyond 17 do not change a double much */
    char *copy = malloc(len + 1);
    if (!copy) return loom__fail(LOOM_ENOMEM, "%s: out of memory", j->who);
    memcpy(copy, s + start, len);
    copy[len] = 0;
    *out = strtod(copy, NULL);
    free(copy);
  } else {
    memcpy(buf, s + start, len);
    buf[len] = 0;
    *out = strtod(buf, NULL); /* +-HUGE_VAL beyond the range: the caller checks */
  }
  j->pos = i;
  return LOOM_OK;
}

int loom__json_put_string(loom__vec *out, const char *s, const char *who) {
  int rc = loom__vec_append(out, "\"", 1, who);
  for (const unsigned char *p = (const unsigned char *)s; !rc && *p; p++) {
    char esc[8];
    if (*p == '"' || *p == '\\') esc[0] = '\\', esc[1] = (char)*p, esc[2] = 0;
    else if (*p < 0x20 && strchr("\b\t\n\f\r", *p))
      esc[0] = '\\', esc[1] = "btnfr"[strchr("\b\t\n\f\r", *p) - "\b\t\n\f\r"], esc[2] = 0;
    else if (*p < 0x20) snprintf(esc, sizeof esc, "\\u%04x", *p); /* as serde_json */
    else esc[0] = (char)*p, esc[1] = 0;
    rc = loom__vec_append(out, esc, strlen(esc), who);
  }
  return rc ? rc : loom__vec_append(out, "\"", 1, who);
}
