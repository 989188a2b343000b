/* train_error.c: the message of the trainer's last failure, per thread (ranks may be threads):
 * the tool's own context followed by loom's detail. */
#include "train_api.h"

#include <stdarg.h>

static _Thread_local char msg[1024];

int train_fail(int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return code;
}

int train_fail_loom(int code, const char *prefix) {
  char detail[768];
  snprintf(detail, sizeof detail, "%s", loom_last_error());
  return train_fail(code, "%s: %s", prefix, detail);
}

const char *train_last_error(void) { return msg; }
