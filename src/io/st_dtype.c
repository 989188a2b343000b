/* st_dtype.c: the safetensors dtype names, sizes and order (the reference implementation's
 * Dtype enum, which its writer sorts by), and which of them loom can hold. Sub-byte types
 * (F4, F6_*) are not accepted. */
#include "io/io_int.h"

#include <string.h>

static const loom__st_dtype table[] = {
    {"BOOL", 1, 0, -1},     {"U8", 1, 1, -1},       {"I8", 1, 2, -1},
    {"F8_E5M2", 1, 3, -1},  {"F8_E4M3", 1, 4, -1},  {"F8_E8M0", 1, 5, -1},
    {"I16", 2, 6, -1},      {"U16", 2, 7, -1},      {"F16", 2, 8, LOOM_F16},
    {"BF16", 2, 9, LOOM_BF16}, {"I32", 4, 10, LOOM_I32}, {"U32", 4, 11, -1},
    {"F32", 4, 12, LOOM_F32}, {"C64", 8, 13, -1},   {"F64", 8, 14, -1},
    {"I64", 8, 15, LOOM_I64}, {"U64", 8, 16, -1},
};

const loom__st_dtype *loom__st_dtype_find(const char *name, size_t len) {
  for (size_t i = 0; i < sizeof table / sizeof *table; i++)
    if (strlen(table[i].name) == len && memcmp(table[i].name, name, len) == 0) return &table[i];
  return NULL;
}

const loom__st_dtype *loom__st_dtype_of(loom_dtype dt) {
  for (size_t i = 0; i < sizeof table / sizeof *table; i++)
    if (table[i].loom == (int)dt) return &table[i];
  return NULL;
}
