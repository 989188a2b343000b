/* status.c: the status-code table's text and the thread-local last-error message. */
#include "core/core_int.h"
#include "loom/check.h"

#include <stdarg.h>
#include <stdio.h>

static _Thread_local char last_error[512];

const char *loom_strerror(int code) {
  switch (code) {
  case LOOM_OK: return "success";
#define CASE_TEXT(name, value, text) case LOOM_##name: return text;
  LOOM_STATUS_MAP(CASE_TEXT)
#undef CASE_TEXT
  default: return "unknown status";
  }
}

const char *loom_status_name(int code) {
  switch (code) {
  case LOOM_OK: return "LOOM_OK";
#define CASE_NAME(name, value, text) case LOOM_##name: return "LOOM_" #name;
  LOOM_STATUS_MAP(CASE_NAME)
#undef CASE_NAME
  default: return "LOOM_UNKNOWN";
  }
}

const char *loom_last_error(void) { return last_error; }

void loom_clear_error(void) { last_error[0] = '\0'; }

int loom__fail(int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
  return code;
}

int loom_check_report(const char *file, int line, const char *expr, int code) {
  if (code == LOOM_OK) return code;
  const char *msg = last_error[0] ? last_error : loom_strerror(code);
  fprintf(stderr, "%s:%d: %s: %s: %s\n", file ? file : "?", line, expr ? expr : "?",
          loom_status_name(code), msg);
  return code;
}
