/* st_values.c: checks of the values a tensor of an untrusted safetensors file holds: every
 * float finite (no NaN, no infinity), none below zero. Weights and optimizer moments from a
 * checkpoint or an --init file pass through here, so a file of NaNs is refused by tensor
 * name at load rather than turning a run's loss into NaN. Read bit by bit (the bytes need not
 * be aligned); integer dtypes always pass. */
#include "io/safetensors_int.h"

#include <stdio.h>
#include <string.h>

typedef struct float_kind {
  const char *name;
  size_t size;    /* bytes */
  unsigned shift; /* of the exponent field */
  uint64_t exp;   /* exponent field, all ones */
} float_kind;

static const float_kind kinds[] = {
    {"F64", 8, 52, 0x7ff}, {"F32", 4, 23, 0xff}, {"F16", 2, 10, 0x1f}, {"BF16", 2, 7, 0xff}};

static const float_kind *kind_of(const char *dtype) {
  for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
    if (strcmp(kinds[i].name, dtype) == 0) return &kinds[i];
  return NULL;
}

/* Element bits as a double, for the message. */
static double as_double(const char *dtype, uint64_t bits) {
  if (strcmp(dtype, "F64") == 0) {
    double d;
    memcpy(&d, &bits, 8);
    return d;
  }
  if (strcmp(dtype, "F32") == 0) {
    uint32_t u = (uint32_t)bits;
    float x;
    memcpy(&x, &u, 4);
    return x;
  }
  return strcmp(dtype, "F16") == 0 ? loom_f16_to_f32((uint16_t)bits)
                                   : loom_bf16_to_f32((uint16_t)bits);
}

int loom_safetensors_check_values(const loom_safetensors *f, const char *name, unsigned checks) {
  static const char *who = "loom_safetensors_check_values";
  if (checks & ~(LOOM_CHECK_FINITE | LOOM_CHECK_NONNEG))
    return loom__fail(LOOM_EINVAL, "%s: unknown checks 0x%x", who, checks);
  loom_safetensors_info in;
  int rc = loom_safetensors_find(f, name, &in);
  if (rc) return rc;
  const float_kind *k = kind_of(in.dtype_name);
  if (!k || !checks) return LOOM_OK;
  size_t size = k->size;
  const uint64_t sign = (uint64_t)1 << (8 * size - 1);
  const unsigned char *p = in.data;
  const char *need = checks == (LOOM_CHECK_FINITE | LOOM_CHECK_NONNEG) ? "finite and >= 0"
                     : checks == LOOM_CHECK_FINITE                     ? "finite"
                                                                       : ">= 0";
  for (size_t i = 0; i < in.numel; i++) {
    uint64_t bits = 0;
    memcpy(&bits, p + i * size, size); /* little-endian host (io_int.h) */
    bool nonfinite = ((bits >> k->shift) & k->exp) == k->exp;
    bool nan = nonfinite && (bits & (((uint64_t)1 << k->shift) - 1));
    bool negative = (bits & sign) && (bits & ~sign) && !nan; /* -0 is not below zero */
    if (((checks & LOOM_CHECK_FINITE) && nonfinite) || ((checks & LOOM_CHECK_NONNEG) && negative))
      return loom__fail(LOOM_EFORMAT, "%s: tensor \"%s\" holds %g at element %zu: its values "
                        "must be %s", f->label, name, as_double(in.dtype_name, bits), i, need);
  }
  return LOOM_OK;
}
