/* loom/status.h: status codes and error messages.
 *
 * Every fallible loom function returns an int: LOOM_OK (0) on success or a negative LOOM_E*
 * code. loom_strerror(code) gives the code's fixed description; loom_last_error() gives the
 * detail of this thread's most recent failure ("matmul: shapes [4,3] and [5,2] do not match").
 * The message is owned by loom, lasts until this thread's next failure (a success does not
 * clear it) and is never shared between threads. */
#ifndef LOOM_STATUS_H
#define LOOM_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

/* One table: the enum, loom_strerror and loom_status_name are all generated from it. */
#define LOOM_STATUS_MAP(XX)                                                                   \
  XX(EINVAL, -1, "invalid argument")                                                          \
  XX(EMISUSE, -2, "API misuse (freed object, wrong call order)")                              \
  XX(ENOMEM, -3, "out of memory")                                                             \
  XX(ESHAPE, -4, "shape mismatch")                                                            \
  XX(EDTYPE, -5, "unsupported or mismatched dtype")                                           \
  XX(EOVERFLOW, -6, "size overflows")                                                         \
  XX(EIO, -7, "I/O error")                                                                    \
  XX(EFORMAT, -8, "malformed file or data")                                                   \
  XX(EBACKEND, -9, "backend library error")                                                   \
  XX(EREMOTE, -10, "a peer rank failed")                                                      \
  XX(ETIMEDOUT, -11, "timed out waiting for peers")                                           \
  XX(EABORTED, -12, "aborted")                                                                \
  XX(EBUSY, -13, "busy: work is still outstanding")                                           \
  XX(ENOSYS, -14, "not supported here")                                                       \
  XX(ENOTFOUND, -15, "not found")

typedef enum loom_status {
  LOOM_OK = 0,
#define LOOM__STATUS_ENUM(name, value, text) LOOM_##name = value,
  LOOM_STATUS_MAP(LOOM__STATUS_ENUM)
#undef LOOM__STATUS_ENUM
} loom_status;

/* Fixed text describing `code` ("shape mismatch"); "unknown status" for a code not in the
 * table. Never NULL, static storage. */
const char *loom_strerror(int code);

/* The code's name ("LOOM_ESHAPE", "LOOM_OK"); "LOOM_UNKNOWN" for a code not in the table. */
const char *loom_status_name(int code);

/* The detailed message of this thread's most recent failure, or "" if this thread has not
 * failed. Borrowed: valid until this thread's next loom call that fails. */
const char *loom_last_error(void);

/* Forget this thread's last error message (tests use it). */
void loom_clear_error(void);

#ifdef __cplusplus
}
#endif
#endif
