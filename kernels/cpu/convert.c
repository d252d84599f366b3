/* kernels/cpu/convert.c — contiguous f32 <-> bf16 conversion on the CPU,
 * eight elements a step with GCC/Clang vector extensions (gcc 12 at -O2
 * does not vectorise the plain loops: their trip count is unknown). The
 * bits are those of weft_f32_to_bf16_i_ / weft_bf16_to_f32_i_
 * (tensor_internal.h) element by element: widening is exact (the bf16
 * bits in the high half), rounding is to nearest even with a NaN kept
 * quiet and its sign and high payload bits kept. Used by weft_cpu_copy_
 * (the op layer's widening and rounding of 16-bit tensors) and by the
 * bf16 elementwise kernels (cpu/ops.c). Local, no allocation. */
#include <stdint.h>
#include <string.h>

#include "cpu_internal.h"
#include "tensor_internal.h"

typedef uint16_t v8h __attribute__((vector_size(16)));
typedef uint32_t v8u __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));

void weft_cpu_bf16_to_f32_(float *dst, const uint16_t *src, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    v8h h;
    memcpy(&h, src + i, sizeof h);
    v8u u = __builtin_convertvector(h, v8u) << 16;
    memcpy(dst + i, &u, sizeof u);
  }
  for (; i < n; i++) dst[i] = weft_bf16_to_f32_i_(src[i]);
}

void weft_cpu_f32_to_bf16_(uint16_t *dst, const float *src, int64_t n) {
  int64_t i = 0;
  const v8u inf = {0x7f800000u, 0x7f800000u, 0x7f800000u, 0x7f800000u,
                   0x7f800000u, 0x7f800000u, 0x7f800000u, 0x7f800000u};
  for (; i + 8 <= n; i += 8) {
    v8u u;
    memcpy(&u, src + i, sizeof u);
    v8u rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    v8u quiet = (u >> 16) | 0x0040u;
    /* |x| > inf bits: NaN (both below 2^31, so a signed compare is right) */
    v8u nan = (v8u)((v8i)(u & 0x7fffffffu) > (v8i)inf);
    v8u r = (rounded & ~nan) | (quiet & nan);
    v8h h = __builtin_convertvector(r, v8h);
    memcpy(dst + i, &h, sizeof h);
  }
  for (; i < n; i++) dst[i] = weft_f32_to_bf16_i_(src[i]);
}

void weft_cpu_to_f32_(float *dst, const void *src, weft_dtype dt, int64_t n) {
  if (dt == WEFT_BF16) {
    weft_cpu_bf16_to_f32_(dst, src, n);
  } else if (dt == WEFT_F16) {
    const uint16_t *s = src;
    for (int64_t i = 0; i < n; i++) dst[i] = weft_f16_to_f32_i_(s[i]);
  } else {
    memcpy(dst, src, (size_t)n * sizeof(float));
  }
}

void weft_cpu_from_f32_(void *dst, weft_dtype dt, const float *src, int64_t n) {
  if (dt == WEFT_BF16) {
    weft_cpu_f32_to_bf16_(dst, src, n);
  } else if (dt == WEFT_F16) {
    uint16_t *d = dst;
    for (int64_t i = 0; i < n; i++) d[i] = weft_f32_to_f16_i_(src[i]);
  } else {
    memcpy(dst, src, (size_t)n * sizeof(float));
  }
}
