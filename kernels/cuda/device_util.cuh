/* kernels/cuda/device_util.cuh — private helpers shared by the .cu sources
 * (each includes it once; everything here is internal to that source). */
#ifndef WEFT_DEVICE_UTIL_CUH
#define WEFT_DEVICE_UTIL_CUH

#include <stdint.h>
#include <string.h>

#include "cuda_compat.h"
#include "cuda_internal.h"
#include "tensor_internal.h"

namespace {

/* The compute stream every kernel launches on. */
inline cudaStream_t compute_stream() {
  return (cudaStream_t)weft_cuda_stream_handle_(WEFT_STREAM_COMPUTE);
}

/* Blocks for `work` items at `per_block` items per block, at least 1 and at
 * most `cap` (kernels loop over the rest with a grid stride). */
inline unsigned grid_for(int64_t work, int64_t per_block, int64_t cap = 65535) {
  int64_t g = (work + per_block - 1) / per_block;
  if (g < 1) g = 1;
  if (g > cap) g = cap;
  return (unsigned)g;
}

/* Four floats loaded or stored as one 16-byte access. */
struct alignas(16) f4 {
  float x, y, z, w;
};

/* Online log-sum-exp: (m, s) with s = sum exp(x - m) over the values seen,
 * m = -inf and s = 0 before the first. lse_push adds one value,
 * lse_merge another pair (a warp's lanes combine theirs with shuffles). */
__device__ inline void lse_push(float &m, float &s, float x) {
  if (x > m) {
    s = (m == -INFINITY ? 0.0f : s * expf(m - x)) + 1.0f;
    m = x;
  } else {
    s += expf(x - m);
  }
}
/* (m, s) with s = sum exp(x - m): merges two such pairs. */
__device__ inline void lse_merge(float &m, float &s, float m2, float s2) {
  if (m2 == -INFINITY) return;
  if (m == -INFINITY) {
    m = m2;
    s = s2;
    return;
  }
  if (m2 > m) {
    s = s * expf(m - m2) + s2;
    m = m2;
  } else {
    s += s2 * expf(m2 - m);
  }
}

/* Products that nvcc must not fuse with a following add into an FMA (it
 * does by default, -fmad=true), so that a*b + c rounds twice as on the CPU:
 * the kernels that promise the CPU's bits write their products with these. */
#ifdef WEFT_CUDA_EMU
/* the emulated kernels are compiled with FMA contraction where the machine
 * has FMA (kernels/cuda/meson.build): the empty asm makes the rounded
 * product a value the compiler cannot fuse into a following add */
__device__ inline float mul_rn(float a, float b) {
  float r = a * b;
  __asm__("" : "+x"(r));
  return r;
}
__device__ inline double mul_rn(double a, double b) {
  double r = a * b;
  __asm__("" : "+x"(r));
  return r;
}
#else
__device__ inline float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ inline double mul_rn(double a, double b) { return __dmul_rn(a, b); }
#endif

/* ---- bf16 and f16 as bit patterns: the host's conversions themselves
 * (kernels/tensor_internal.h, host and device code), so the device rounds
 * bit for bit as the CPU (round to nearest even, NaN stays NaN). */

/* Multi-tensor launches (optim.cu, flat.cu) split their tensors into
 * chunks; descriptor i covers chunks [d[i].chunk0, d[i + 1].chunk0). The
 * descriptor of chunk c: the last one whose chunk0 <= c (binary search over
 * n sorted descriptors, n >= 1). */
template <class D>
__device__ inline const D *chunk_owner(const D *d, int n, int64_t c) {
  int lo = 0, hi = n - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (d[mid].chunk0 <= c)
      lo = mid;
    else
      hi = mid - 1;
  }
  return d + lo;
}

/* Element types of the tensor kernels: the storage of each float dtype,
 * bf16 and f16 told apart by type. */
struct bf16_t {
  uint16_t bits;
};
struct f16_t {
  uint16_t bits;
};

/* Value as f32 (exact except f64, which rounds to nearest even). */
__device__ inline float as_f32(float x) { return x; }
__device__ inline float as_f32(double x) { return (float)x; }
__device__ inline float as_f32(bf16_t x) { return weft_bf16_to_f32_i_(x.bits); }
__device__ inline float as_f32(f16_t x) { return weft_f16_to_f32_i_(x.bits); }
/* Value as f64 (exact). */
__device__ inline double as_f64(double x) { return x; }
template <class T>
__device__ inline double as_f64(T x) {
  return (double)as_f32(x);
}

/* dtype D from f32 (rounding to nearest even). */
template <class D>
__device__ inline D from_f32(float x);
template <>
__device__ inline float from_f32<float>(float x) {
  return x;
}
template <>
__device__ inline double from_f32<double>(float x) {
  return (double)x;
}
template <>
__device__ inline bf16_t from_f32<bf16_t>(float x) {
  return bf16_t{weft_f32_to_bf16_i_(x)};
}
template <>
__device__ inline f16_t from_f32<f16_t>(float x) {
  return f16_t{weft_f32_to_f16_i_(x)};
}

/* D from S as weft_tensor_copy converts: f64 -> f32 rounds once; to bf16
 * and f16 through f32 (f64 too, as torch); widening is exact; the same
 * type is the same bits. */
template <class D, class S>
struct convert {
  __device__ static D from(S x) { return from_f32<D>(as_f32(x)); }
};
template <class S>
struct convert<double, S> {
  __device__ static double from(S x) { return as_f64(x); }
};
template <class T>
struct convert<T, T> {
  __device__ static T from(T x) { return x; }
};
template <>
struct convert<double, double> {
  __device__ static double from(double x) { return x; }
};

}  // namespace

#endif /* WEFT_DEVICE_UTIL_CUH */
