/* dtype sizes, names and scalar conversions (bf16/f16 round to nearest even). */
#include <math.h>
#include <string.h>

#include "kernels.h"
#include "tensor_internal.h"

static const struct {
  const char *name, *alias;
  size_t size;
  bool is_float;
} dtype_info[WEFT_DTYPE_COUNT] = {
    [WEFT_F32] = {"f32", "float32", 4, true},    [WEFT_F64] = {"f64", "float64", 8, true},
    [WEFT_BF16] = {"bf16", "bfloat16", 2, true}, [WEFT_F16] = {"f16", "float16", 2, true},
    [WEFT_I32] = {"i32", "int32", 4, false},     [WEFT_I64] = {"i64", "int64", 8, false},
    [WEFT_U8] = {"u8", "uint8", 1, false},
};

static bool dtype_valid(weft_dtype dt) { return (unsigned)dt < WEFT_DTYPE_COUNT; }

size_t weft_dtype_size(weft_dtype dt) { return dtype_valid(dt) ? dtype_info[dt].size : 0; }
const char *weft_dtype_name(weft_dtype dt) { return dtype_valid(dt) ? dtype_info[dt].name : "?"; }
bool weft_dtype_is_float(weft_dtype dt) { return dtype_valid(dt) && dtype_info[dt].is_float; }

weft_status weft_dtype_parse(const char *name, weft_dtype *out) {
  for (int i = 0; name && i < WEFT_DTYPE_COUNT; i++) {
    if (strcmp(name, dtype_info[i].name) == 0 || strcmp(name, dtype_info[i].alias) == 0) {
      *out = (weft_dtype)i;
      return WEFT_OK;
    }
  }
  return weft_error(WEFT_ERR_INVALID,
                    "unknown dtype '%s' (expected f32, f64, bf16, f16, i32, i64, u8)",
                    name ? name : "(null)");
}

/* The conversions live in tensor_internal.h as inline functions (so that
 * conversion loops inline them); these are the public entry points. */
uint16_t weft_f32_to_bf16(float x) { return weft_f32_to_bf16_i_(x); }
float weft_bf16_to_f32(uint16_t x) { return weft_bf16_to_f32_i_(x); }
uint16_t weft_f32_to_f16(float x) { return weft_f32_to_f16_i_(x); }
float weft_f16_to_f32(uint16_t x) { return weft_f16_to_f32_i_(x); }
