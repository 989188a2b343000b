/* train_error.c: the message of the trainer's last failure, per thread (ranks may be threads):
 * the tool's own context followed by loom's detail. */
#include "train_api.h"

#include <stdarg.h>
#include <string.h>

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

const char *train_error_hint(const char *message) {
  if (strstr(message, "oneDNN") && strstr(message, "unimplemented"))
    return "hint: oneDNN has no kernel for this operation on this CPU (or under "
           "ONEDNN_MAX_CPU_ISA / LOOM_CPU). loom widens bf16 and f16 to f32 where oneDNN lacks "
           "them, so this is a case it missed: run again with --amp off (f32), and report the "
           "command with the output of `lscpu | grep -i 'model name\\|flags'`";
  if (strstr(message, "out of memory"))
    return "hint: lower --batch (or --eval-batch), or use more ranks";
  return NULL;
}
