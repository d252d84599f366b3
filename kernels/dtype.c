/* dtype sizes, names and scalar conversions (bf16/f16 round to nearest even). */
#include <math.h>
#include <string.h>

#include "kernels.h"

static const struct {
  const char *name, *alias;
  size_t size;
  bool is_float;
} dtype_info[WEFT_DTYPE_COUNT] = {
    [WEFT_F32] = {"f32", "float32", 4, true},   [WEFT_F64] = {"f64", "float64", 8, true},
    [WEFT_BF16] = {"bf16", "bfloat16", 2, true}, [WEFT_F16] = {"f16", "float16", 2, true},
    [WEFT_I32] = {"i32", "int32", 4, false},    [WEFT_I64] = {"i64", "int64", 8, false},
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
  return weft_error(WEFT_ERR_INVALID, "unknown dtype '%s' (expected f32, f64, bf16, f16, i32, i64, u8)",
                    name ? name : "(null)");
}

static uint32_t f32_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  return u;
}
static float bits_f32(uint32_t u) {
  float x;
  memcpy(&x, &u, 4);
  return x;
}

/* bf16 is the top 16 bits of an IEEE f32; rounding adds 0x7fff plus the
 * lowest kept bit (ties to even). NaN keeps a quiet-NaN payload. */
uint16_t weft_f32_to_bf16(float x) {
  uint32_t u = f32_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

float weft_bf16_to_f32(uint16_t x) { return bits_f32((uint32_t)x << 16); }

/* IEEE binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits. */
uint16_t weft_f32_to_f16(float x) {
  uint32_t u = f32_bits(x);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  uint32_t absu = u & 0x7fffffffu;
  if (absu > 0x7f800000u) return sign | 0x7e00u;          /* NaN */
  if (absu >= 0x477ff000u) return sign | 0x7c00u;         /* overflow -> inf (rounds past 65504) */
  if (absu < 0x38800000u) {                               /* subnormal or zero in f16 */
    /* value = absf; f16 subnormal step is 2^-24: round(absf * 2^24) ties even */
    float absf = bits_f32(absu);
    float scaled = absf * 16777216.0f;                     /* exact: power of two */
    float r = rintf(scaled);                               /* default mode: ties to even */
    return sign | (uint16_t)r;
  }
  /* normal: rebias exponent, round 13 dropped mantissa bits to nearest even */
  uint32_t mant_round = absu + 0x0fffu + ((absu >> 13) & 1u);
  uint32_t h = (mant_round >> 13) - ((127u - 15u) << 10);
  return sign | (uint16_t)h;
}

float weft_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    float v = (float)mant * (1.0f / 16777216.0f); /* subnormal: mant * 2^-24 */
    return sign ? -v : v;
  }
  if (exp == 31) return bits_f32(sign | 0x7f800000u | (mant << 13));
  return bits_f32(sign | ((exp + 127u - 15u) << 23) | (mant << 13));
}
