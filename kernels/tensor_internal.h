/* Private to kernels/: scalar load/store by dtype and strided iteration over
 * one to three same-shape tensors, shared by tensor.c, rng.c and cpu/ops.c.
 *
 * The iterator drops size-1 dims and merges dims that are contiguous in every
 * operand, so a contiguous tensor becomes one row; a row callback then runs
 * over the innermost dim with the operands' inner strides. The callback is
 * called once per row (never per element).
 */
#ifndef WEFT_TENSOR_INTERNAL_H
#define WEFT_TENSOR_INTERNAL_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

#define WEFT_ITER_MAX_OPS 3

typedef struct weft_iter_ {
  int ndim;      /* >= 1 after init */
  int nops;      /* 1..WEFT_ITER_MAX_OPS */
  int64_t numel; /* 0: run does nothing */
  int64_t shape[WEFT_MAX_DIMS];
  int64_t strides[WEFT_ITER_MAX_OPS][WEFT_MAX_DIMS]; /* elements */
  char *data[WEFT_ITER_MAX_OPS];
  int64_t esize[WEFT_ITER_MAX_OPS];
} weft_iter_;

/* One row: n elements per operand starting at ptrs[op], step strides[op]
 * elements. */
typedef void (*weft_iter_row_fn_)(char *const *ptrs, const int64_t *strides, int64_t n, void *ctx);

/* ts[0..nops) must have the same shape (the caller checks); geometry comes
 * from ts[0]. */
void weft_iter_init_(weft_iter_ *it, int nops, const weft_tensor *const *ts);
void weft_iter_run_(const weft_iter_ *it, weft_iter_row_fn_ fn, void *ctx);

/* ---- bf16 / f16 conversions. The public weft_f32_to_bf16 ... (dtype.c) call
 * these; they are inline so that conversion loops make no call per element.
 * They also compile as device code (the CUDA backend's kernels call them,
 * kernels/cuda/device_util.cuh), so the device rounds exactly as the host. */
#if defined(__CUDACC__)
#define WEFT_HD_ __host__ __device__
#else
#define WEFT_HD_
#endif

static inline WEFT_HD_ uint32_t weft_f32_bits_(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  return u;
}
static inline WEFT_HD_ float weft_bits_f32_(uint32_t u) {
  float x;
  memcpy(&x, &u, 4);
  return x;
}

/* bf16 is the top 16 bits of an IEEE f32; rounding adds 0x7fff plus the
 * lowest kept bit (ties to even). NaN keeps a quiet-NaN payload. */
static inline WEFT_HD_ uint16_t weft_f32_to_bf16_i_(float x) {
  uint32_t u = weft_f32_bits_(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

static inline WEFT_HD_ float weft_bf16_to_f32_i_(uint16_t x) {
  return weft_bits_f32_((uint32_t)x << 16);
}

/* IEEE binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits. */
static inline WEFT_HD_ uint16_t weft_f32_to_f16_i_(float x) {
  uint32_t u = weft_f32_bits_(x);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  uint32_t absu = u & 0x7fffffffu;
  if (absu > 0x7f800000u) return sign | 0x7e00u;  /* NaN */
  if (absu >= 0x477ff000u) return sign | 0x7c00u; /* overflow -> inf (rounds past 65504) */
  if (absu < 0x38800000u) {                       /* subnormal or zero in f16 */
    /* the f16 subnormal step is 2^-24: round(|x| * 2^24), ties to even */
    float scaled = weft_bits_f32_(absu) * 16777216.0f; /* exact: power of two */
    return sign | (uint16_t)rintf(scaled);             /* default mode: ties to even */
  }
  /* normal: rebias the exponent, round the 13 dropped mantissa bits to even */
  uint32_t mant_round = absu + 0x0fffu + ((absu >> 13) & 1u);
  return sign | (uint16_t)((mant_round >> 13) - ((127u - 15u) << 10));
}

static inline WEFT_HD_ float weft_f16_to_f32_i_(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    float v = (float)mant * (1.0f / 16777216.0f); /* subnormal: mant * 2^-24 */
    return sign ? -v : v;
  }
  if (exp == 31) return weft_bits_f32_(sign | 0x7f800000u | (mant << 13));
  return weft_bits_f32_(sign | ((exp + 127u - 15u) << 23) | (mant << 13));
}

/* ---- Philox4x32-10 (Salmon, Moraes, Dror, Shaw, SC 2011), the rounds of
 * weft_philox4x32 (kernels/rng.c): counter words c0 = low 32 bits of
 * counter_lo, c1 = its high 32 bits, c2/c3 likewise of counter_hi; key
 * words k0 = low, k1 = high half of key (Random123's kat_vectors order).
 * Host and device code: the CUDA backend's fills call it too. */
static inline WEFT_HD_ void weft_philox_rounds_(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3,
                                                uint32_t k0, uint32_t k1, uint32_t out[4]) {
  for (int r = 0; r < 10; r++) {
    if (r > 0) {
      k0 += 0x9E3779B9u; /* golden ratio */
      k1 += 0xBB67AE85u; /* sqrt(3) - 1 */
    }
    const uint64_t p0 = (uint64_t)0xD2511F53u * c0;
    const uint64_t p1 = (uint64_t)0xCD9E8D57u * c2;
    const uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
    const uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
    c1 = (uint32_t)p1;
    c3 = (uint32_t)p0;
    c0 = n0;
    c2 = n2;
  }
  out[0] = c0;
  out[1] = c1;
  out[2] = c2;
  out[3] = c3;
}

/* ---- scalar conversions -------------------------------------------------
 * Float -> integer truncates toward zero and saturates (NaN -> 0), so no
 * conversion is undefined behaviour; integer -> integer wraps modulo 2^bits
 * as C's unsigned conversions do. */

static inline int64_t weft_sat_i_(double v, double lo, double hi_excl, int64_t lo_i, int64_t hi_i) {
  if (v != v) return 0;
  if (v <= lo) return lo_i;
  if (v >= hi_excl) return hi_i;
  return (int64_t)v;
}

/* Element at p as double (i64 beyond 2^53 rounds). */
static inline double weft_load_f_(const char *p, weft_dtype dt) {
  switch (dt) {
    case WEFT_F32: {
      float v;
      memcpy(&v, p, 4);
      return v;
    }
    case WEFT_F64: {
      double v;
      memcpy(&v, p, 8);
      return v;
    }
    case WEFT_BF16: {
      uint16_t v;
      memcpy(&v, p, 2);
      return weft_bf16_to_f32_i_(v);
    }
    case WEFT_F16: {
      uint16_t v;
      memcpy(&v, p, 2);
      return weft_f16_to_f32_i_(v);
    }
    case WEFT_I32: {
      int32_t v;
      memcpy(&v, p, 4);
      return v;
    }
    case WEFT_I64: {
      int64_t v;
      memcpy(&v, p, 8);
      return (double)v;
    }
    case WEFT_U8:
      return *(const uint8_t *)p;
    default:
      return 0.0;
  }
}

/* Element at p as int64 (integers exactly; floats truncated, saturated). */
static inline int64_t weft_load_i_(const char *p, weft_dtype dt) {
  switch (dt) {
    case WEFT_I32: {
      int32_t v;
      memcpy(&v, p, 4);
      return v;
    }
    case WEFT_I64: {
      int64_t v;
      memcpy(&v, p, 8);
      return v;
    }
    case WEFT_U8:
      return *(const uint8_t *)p;
    default:
      return weft_sat_i_(weft_load_f_(p, dt), -9223372036854775808.0, 9223372036854775808.0,
                         INT64_MIN, INT64_MAX);
  }
}

/* Stores v at p as dtype dt (float: rounds to nearest even; integer:
 * truncates and saturates). */
static inline void weft_store_f_(char *p, weft_dtype dt, double v) {
  switch (dt) {
    case WEFT_F32: {
      float f = (float)v;
      memcpy(p, &f, 4);
      return;
    }
    case WEFT_F64:
      memcpy(p, &v, 8);
      return;
    case WEFT_BF16: {
      uint16_t h = weft_f32_to_bf16_i_((float)v);
      memcpy(p, &h, 2);
      return;
    }
    case WEFT_F16: {
      uint16_t h = weft_f32_to_f16_i_((float)v);
      memcpy(p, &h, 2);
      return;
    }
    case WEFT_I32: {
      int32_t i = (int32_t)weft_sat_i_(v, -2147483648.0, 2147483647.0, INT32_MIN, INT32_MAX);
      memcpy(p, &i, 4);
      return;
    }
    case WEFT_I64: {
      int64_t i =
          weft_sat_i_(v, -9223372036854775808.0, 9223372036854775808.0, INT64_MIN, INT64_MAX);
      memcpy(p, &i, 8);
      return;
    }
    case WEFT_U8:
      *(uint8_t *)p = (uint8_t)weft_sat_i_(v, 0.0, 255.0, 0, 255);
      return;
    default:
      return;
  }
}

/* Stores an integer value (integers wrap; floats convert). */
static inline void weft_store_i_(char *p, weft_dtype dt, int64_t v) {
  switch (dt) {
    case WEFT_I32: {
      int32_t i = (int32_t)(uint32_t)(uint64_t)v;
      memcpy(p, &i, 4);
      return;
    }
    case WEFT_I64:
      memcpy(p, &v, 8);
      return;
    case WEFT_U8:
      *(uint8_t *)p = (uint8_t)(uint64_t)v;
      return;
    case WEFT_F32: {
      float f = (float)v;
      memcpy(p, &f, 4);
      return;
    }
    case WEFT_BF16: {
      uint16_t h = weft_f32_to_bf16_i_((float)v);
      memcpy(p, &h, 2);
      return;
    }
    case WEFT_F16: {
      uint16_t h = weft_f32_to_f16_i_((float)v);
      memcpy(p, &h, 2);
      return;
    }
    default:
      weft_store_f_(p, dt, (double)v);
      return;
  }
}

/* dst (dtype dd) = src (dtype sd), converting as weft_tensor_copy documents. */
static inline void weft_convert_elem_(char *dst, weft_dtype dd, const char *src, weft_dtype sd) {
  if (weft_dtype_is_float(sd)) {
    weft_store_f_(dst, dd, weft_load_f_(src, sd));
  } else {
    weft_store_i_(dst, dd, weft_load_i_(src, sd));
  }
}

/* ---- CPU backend internals (kernels/cpu/gemm.c) -------------------------
 * The blocked C GEMMs used when the build has no BLAS (and for operands too
 * large for a 32-bit BLAS interface); row-major, arguments as weft_sgemm,
 * already validated. Exposed so tests check them in every build. */
void weft_sgemm_blocked_(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                         const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                         float *c, int64_t ldc);
void weft_dgemm_blocked_(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha,
                         const double *a, int64_t lda, const double *b, int64_t ldb, double beta,
                         double *c, int64_t ldc);

#ifdef __cplusplus
}
#endif
#endif /* WEFT_TENSOR_INTERNAL_H */
