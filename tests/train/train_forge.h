/* train_forge.h: forging files for the tests of what `loom train` refuses: a checkpoint (or a
 * plain safetensors file) rewritten with one value changed and, for a checkpoint, a valid CRC,
 * as someone who edits the file on purpose would. */
#ifndef LOOM_TESTS_TRAIN_FORGE_H
#define LOOM_TESTS_TRAIN_FORGE_H

#include <stddef.h>
#include <stdint.h>

/* Rewrite `path` with metadata `key` set to `value`. 0 on success. */
int tf_set_meta(const char *path, const char *key, const char *value);
/* Rewrite `path` with element `index` of F32 tensor `name` set to v. */
int tf_set_f32(const char *path, const char *name, size_t index, float v);
/* Rewrite `path` with element `index` of I64 tensor `name` set to v. */
int tf_set_i64(const char *path, const char *name, size_t index, int64_t v);

#endif
