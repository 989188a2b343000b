/* train_test.h: running `loom train` (and `loom plan`) in process for the tests: argv from a string, stdout and
 * stderr captured, scratch folders, whole-file reads. */
#ifndef LOOM_TESTS_TRAIN_TEST_H
#define LOOM_TESTS_TRAIN_TEST_H

#include <stddef.h>

typedef struct tt_run {
  int rc;          /* cmd_train's exit code */
  char *out, *err; /* what it printed (malloc'd, NUL-terminated) */
} tt_run;

/* Run `loom train` with the space-separated arguments of fmt (printf-style; no quoting). */
tt_run tt_train(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The same for `loom plan`. */
tt_run tt_plan(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The same for `loom generate`. */
tt_run tt_generate(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The same for `loom eval`. */
tt_run tt_eval(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void tt_run_free(tt_run *r);
/* Whether r ended with exit code rc and want in its stderr; if not, both are printed with
 * what (the arguments) for the log. */
int tt_ended(const tt_run *r, int rc, const char *want, const char *what);
/* A new empty folder under $TMPDIR (or /tmp); the path lives until tt_cleanup. */
const char *tt_tempdir(void);
/* Remove every folder tt_tempdir made (and the files in them). */
void tt_cleanup(void);
/* The whole file (malloc'd) and its size; NULL if it cannot be read. */
char *tt_read_file(const char *path, size_t *size);
/* Whether two files hold the same bytes (false if either cannot be read). */
int tt_same_file(const char *a, const char *b);
/* Write bytes to a file; 0 on success. */
int tt_write_file(const char *path, const void *data, size_t n);
/* A model file at path holding one f32 tensor `name` of 4 zeros and the metadata of kv, n
 * key-value pairs as 2n strings (at most 16 pairs); 0 on success. */
int tt_write_model_file(const char *path, const char *name, const char *const *kv, size_t n);
/* Copy file `from` over `to`; 0 on success. */
int tt_copy_file(const char *from, const char *to);
/* The largest difference between two model files' f32 tensors of the same names (INFINITY if
 * either cannot be read or they do not hold the same tensors). */
double tt_model_diff(const char *a, const char *b);

#endif
