/* loom/check.h: LOOM_CHECK, the error check every program writes, written once.
 *
 * Every fallible loom call returns an int status (loom/status.h). LOOM_CHECK(call) runs the
 * call; on a failure it prints one line to standard error, "file:line: call: LOOM_ENAME:
 * loom's message" (loom_last_error), stores the status in the caller's `int rc` and jumps to
 * the caller's `done:` label, where the function frees what it made and returns rc:
 *
 *   int rc = LOOM_OK;
 *   loom_module *model = NULL;             (every object NULL, so the cleanup may free it)
 *   LOOM_CHECK(loom_nn_mlp_create(sizes, 3, LOOM_ACT_RELU, LOOM_F32, 1, &model));
 *   ...
 * done:
 *   loom_module_free(model);              (free(NULL) is a no-op for every loom object)
 *   return rc;
 *
 * The names are settable: #define LOOM_CHECK_RC and LOOM_CHECK_LABEL before including this
 * header to use another variable or label, or name them at each use with
 * LOOM_CHECK_GOTO(call, rc_variable, label). LOOM_CHECK_RETURN(call) returns the status instead
 * (for a function with nothing to clean up). Define LOOM_CHECK_QUIET to print nothing (the
 * status and loom_last_error() stay for the caller). Any call returning a loom status works,
 * including the caller's own functions that follow the convention. */
#ifndef LOOM_CHECK_H
#define LOOM_CHECK_H

#include "loom/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#ifndef LOOM_CHECK_RC
#define LOOM_CHECK_RC rc
#endif
#ifndef LOOM_CHECK_LABEL
#define LOOM_CHECK_LABEL done
#endif

/* Print "file:line: expr: LOOM_ENAME: message" to standard error for status `code` (nothing
 * with LOOM_CHECK_QUIET, nothing for LOOM_OK) and return `code`. What the macros call; a
 * program may call it too. The message is this thread's loom_last_error(), or the code's
 * loom_strerror() text if there is none. */
int loom_check_report(const char *file, int line, const char *expr, int code);

#ifdef LOOM_CHECK_QUIET
#define LOOM__CHECK_REPORT(expr, code) (code)
#else
#define LOOM__CHECK_REPORT(expr, code) loom_check_report(__FILE__, __LINE__, expr, code)
#endif

#define LOOM_CHECK_GOTO(call, rc_variable, label)                                            \
  do {                                                                                        \
    int loom_check_rc_ = (call);                                                              \
    if (loom_check_rc_ != LOOM_OK) {                                                          \
      (rc_variable) = LOOM__CHECK_REPORT(#call, loom_check_rc_);                              \
      goto label;                                                                             \
    }                                                                                         \
  } while (0)

#define LOOM_CHECK(call) LOOM_CHECK_GOTO(call, LOOM_CHECK_RC, LOOM_CHECK_LABEL)

#define LOOM_CHECK_RETURN(call)                                                               \
  do {                                                                                        \
    int loom_check_rc_ = (call);                                                              \
    if (loom_check_rc_ != LOOM_OK) return LOOM__CHECK_REPORT(#call, loom_check_rc_);          \
  } while (0)

#ifdef __cplusplus
}
#endif
#endif
