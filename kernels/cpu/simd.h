/* kernels/cpu/simd.h — private to kernels/cpu/: the SIMD helpers that the
 * CPU layer kernels (embedding.c, rmsnorm.c, rope.c, attention.c,
 * pointwise.c, cross_entropy.c, optim.c) share, all static inline: 4-float
 * vectors (GCC/Clang vector extensions, SSE width) with their loads,
 * stores, padded tails, double accumulation and a Cephes-style vexp; the
 * 8-lane AVX2 + FMA versions of the exp-bound loops, chosen at run time
 * (HAVE_AVX2_PATH, use_avx2); and the row loops built on them (row_exp,
 * row_exp_sum, row_max_of, row_dot_d, row_add). Every caller of a row
 * helper gets the same arithmetic in the same order, so a value does not
 * depend on which kernel computed it. Not installed. */
#ifndef WEFT_CPU_SIMD_H
#define WEFT_CPU_SIMD_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#if defined(__x86_64__) && defined(__GNUC__) && !defined(WEFT_NO_AVX2_PATH)
#define HAVE_AVX2_PATH 1 /* the AVX2 + FMA versions below exist */
#include <immintrin.h>
#endif

/* --------------------------------------------------------- 4-lane helpers
 * The elementwise and row loops of the layer kernels run on 4-float
 * vectors (GCC/Clang vector extensions, the SSE width that every x86-64
 * has; gcc -O2 leaves such loops scalar by itself), with the tail of a row done on a padded
 * vector so that every element goes through the same arithmetic wherever
 * it sits. Double accumulators stay double (2 lanes each, summed at the
 * end), as layers.h promises. */
typedef float vf4 __attribute__((vector_size(16)));
typedef int32_t vi4 __attribute__((vector_size(16)));
typedef double vd2 __attribute__((vector_size(16)));
#define VL 4

static inline vf4 vload(const float *p) {
  vf4 v;
  memcpy(&v, p, sizeof v);
  return v;
}
static inline void vstore(float *p, vf4 v) { memcpy(p, &v, sizeof v); }
/* The first n < VL elements of p, the other lanes `pad`. */
static inline vf4 vload_tail(const float *p, int64_t n, float pad) {
  vf4 v = {pad, pad, pad, pad};
  memcpy(&v, p, (size_t)n * sizeof(float));
  return v;
}
static inline void vstore_tail(float *p, vf4 v, int64_t n) {
  memcpy(p, &v, (size_t)n * sizeof(float));
}
static inline vf4 vset(float x) { return (vf4){x, x, x, x}; }
/* m ? a : b per lane (m from a vector comparison: all ones or zero). */
static inline vf4 vsel(vi4 m, vf4 a, vf4 b) { return (vf4)((m & (vi4)a) | (~m & (vi4)b)); }
static inline vf4 vmax(vf4 a, vf4 b) { return vsel(a > b, a, b); }
static inline float hmax(vf4 v) {
  float m = v[0];
  for (int i = 1; i < VL; i++) m = v[i] > m ? v[i] : m;
  return m;
}
/* The two halves of v widened to double. */
static inline vd2 vlo_d(vf4 v) {
  return __builtin_convertvector(__builtin_shufflevector(v, v, 0, 1), vd2);
}
static inline vd2 vhi_d(vf4 v) {
  return __builtin_convertvector(__builtin_shufflevector(v, v, 2, 3), vd2);
}
/* Two doubles at p (a column-sum accumulator row), loaded and stored. */
static inline vd2 dload(const double *p) {
  vd2 v;
  memcpy(&v, p, sizeof v);
  return v;
}
static inline void dstore(double *p, vd2 v) { memcpy(p, &v, sizeof v); }
/* Adds the 4 lanes of v, widened to double, into two double accumulators. */
static inline void vacc_d(vd2 *lo, vd2 *hi, vf4 v) {
  *lo += vlo_d(v);
  *hi += vhi_d(v);
}
static inline double hsum_d(vd2 lo, vd2 hi) {
  vd2 s = lo + hi;
  return s[0] + s[1];
}
static inline vf4 vsqrt(vf4 x) {
#if defined(__SSE__) && defined(__GNUC__) && !defined(__clang__)
  return __builtin_ia32_sqrtps(x);
#else
  for (int i = 0; i < VL; i++) x[i] = sqrtf(x[i]);
  return x;
#endif
}

/* exp on 4 lanes, after Cephes' expf (S. L. Moshier, Cephes Math Library,
 * expf.c): n = round(x log2 e), r = x - n ln2 with ln2 in two parts (the
 * first short, so n * C1 is exact), exp(r) = 1 + r + r^2 p(r) with
 * Cephes' degree-5 p on |r| <= ln2 / 2, then times 2^n as two factors
 * 2^(n/2) 2^(n - n/2) so that results near overflow and in the denormal
 * range come out right. Relative error about 1 ulp. x >= 89: +inf;
 * x <= -104: 0; NaN: NaN. */
static inline vf4 vexp(vf4 x) {
  const vf4 lo = vset(-104.0f), hi = vset(89.0f);
  vi4 nan = x != x;
  x = vsel(x < lo, lo, x);
  x = vsel(x > hi, hi, x);
  x = vsel(nan, vset(0.0f), x);
  const vf4 magic = vset(12582912.0f); /* 1.5 * 2^23: adding it rounds to an integer */
  vf4 n = (x * vset(1.44269504088896341f) + magic) - magic;
  vf4 r = x - n * vset(0.693359375f);
  r = r - n * vset(-2.12194440e-4f);
  vf4 z = r * r;
  vf4 p = vset(1.9875691500E-4f);
  p = p * r + vset(1.3981999507E-3f);
  p = p * r + vset(8.3334519073E-3f);
  p = p * r + vset(4.1665795894E-2f);
  p = p * r + vset(1.6666665459E-1f);
  p = p * r + vset(5.0000001201E-1f);
  p = p * z + r + vset(1.0f);
  vi4 ni = __builtin_convertvector(n, vi4);
  vi4 n1 = ni >> 1, n2 = ni - n1;
  vf4 s1 = (vf4)((n1 + 127) << 23), s2 = (vf4)((n2 + 127) << 23);
  p = p * s1 * s2;
  return vsel(nan, vset(NAN), p);
}

/* ------------------------------------------------- AVX2 + FMA variants
 * The loops that are bound by exp (softmax rows, cross-entropy, SwiGLU)
 * have a second version on 8 lanes with fused multiply-adds, compiled for
 * AVX2 + FMA through a target attribute and chosen at run time when the
 * processor has both (every x86-64 since 2013/2015), so the library
 * itself still runs on baseline x86-64. The same formulas; fused
 * multiply-adds round once where the SSE version rounds twice, so the two
 * paths can differ in the last bit. Building with -DWEFT_NO_AVX2_PATH
 * leaves only the SSE version (to test it on an AVX2 machine). */
#ifdef HAVE_AVX2_PATH
#define AVX2_FN __attribute__((target("avx2,fma")))
typedef float vf8 __attribute__((vector_size(32)));
typedef int32_t vi8 __attribute__((vector_size(32)));
typedef double vd4 __attribute__((vector_size(32)));

static inline bool use_avx2(void) {
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

AVX2_FN static inline vf8 v8load(const float *p) {
  vf8 v;
  memcpy(&v, p, sizeof v);
  return v;
}
AVX2_FN static inline void v8store(float *p, vf8 v) { memcpy(p, &v, sizeof v); }
AVX2_FN static inline vf8 v8load_tail(const float *p, int64_t n, float pad) {
  vf8 v = {pad, pad, pad, pad, pad, pad, pad, pad};
  memcpy(&v, p, (size_t)n * sizeof(float));
  return v;
}
AVX2_FN static inline void v8store_tail(float *p, vf8 v, int64_t n) {
  memcpy(p, &v, (size_t)n * sizeof(float));
}
AVX2_FN static inline vf8 v8set(float x) { return (vf8){x, x, x, x, x, x, x, x}; }
AVX2_FN static inline vf8 v8sel(vi8 m, vf8 a, vf8 b) { return (vf8)((m & (vi8)a) | (~m & (vi8)b)); }
/* a * b + c, rounded once */
AVX2_FN static inline vf8 v8fma(vf8 a, vf8 b, vf8 c) {
  return (vf8)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
}
AVX2_FN static inline void v8acc_d(vd4 *lo, vd4 *hi, vf8 v) {
  *lo += (vd4)_mm256_cvtps_pd(_mm256_castps256_ps128((__m256)v));
  *hi += (vd4)_mm256_cvtps_pd(_mm256_extractf128_ps((__m256)v, 1));
}
AVX2_FN static inline double v8hsum_d(vd4 lo, vd4 hi) {
  vd4 s = lo + hi;
  return (s[0] + s[2]) + (s[1] + s[3]);
}
/* vexp on 8 lanes with fused multiply-adds (same constants and steps). */
AVX2_FN static inline vf8 v8exp(vf8 x) {
  const vf8 lo = v8set(-104.0f), hi = v8set(89.0f);
  vi8 nan = x != x;
  x = v8sel(x < lo, lo, x);
  x = v8sel(x > hi, hi, x);
  x = v8sel(nan, v8set(0.0f), x);
  const vf8 magic = v8set(12582912.0f);
  vf8 n = v8fma(x, v8set(1.44269504088896341f), magic) - magic;
  vf8 r = v8fma(n, v8set(-0.693359375f), x);
  r = v8fma(n, v8set(2.12194440e-4f), r);
  vf8 z = r * r;
  vf8 p = v8fma(v8set(1.9875691500E-4f), r, v8set(1.3981999507E-3f));
  p = v8fma(p, r, v8set(8.3334519073E-3f));
  p = v8fma(p, r, v8set(4.1665795894E-2f));
  p = v8fma(p, r, v8set(1.6666665459E-1f));
  p = v8fma(p, r, v8set(5.0000001201E-1f));
  p = v8fma(p, z, r + v8set(1.0f));
  vi8 ni = __builtin_convertvector(n, vi8);
  vi8 n1 = ni >> 1, n2 = ni - n1;
  vf8 s1 = (vf8)((n1 + 127) << 23), s2 = (vf8)((n2 + 127) << 23);
  p = p * s1 * s2;
  return v8sel(nan, v8set(NAN), p);
}

AVX2_FN static inline void row_exp_avx2(float *out, const float *x, int64_t n, float sub,
                                        float mul) {
  const vf8 vs = v8set(sub), vm = v8set(mul);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) v8store(out + j, v8exp(v8load(x + j) - vs) * vm);
  if (j < n) v8store_tail(out + j, v8exp(v8load_tail(x + j, n - j, 0.0f) - vs) * vm, n - j);
}

AVX2_FN static inline double row_exp_sum_avx2(float *out, const float *x, int64_t n, float sub,
                                              float mul) {
  vd4 lo = {0}, hi = {0};
  const vf8 vs = v8set(sub), vm = v8set(mul);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    vf8 e = v8exp(v8load(x + j) - vs);
    v8acc_d(&lo, &hi, e);
    if (out) v8store(out + j, e * vm);
  }
  if (j < n) {
    vf8 e = v8exp(v8load_tail(x + j, n - j, -INFINITY) - vs);
    v8acc_d(&lo, &hi, e);
    if (out) v8store_tail(out + j, e * vm, n - j);
  }
  return v8hsum_d(lo, hi);
}

#endif

/* out[j] = exp(x[j] - sub) * mul for j < n (out may be x). */
static inline void row_exp(float *out, const float *x, int64_t n, float sub, float mul) {
#ifdef HAVE_AVX2_PATH
  if (use_avx2()) {
    row_exp_avx2(out, x, n, sub, mul);
    return;
  }
#endif
  const vf4 vs = vset(sub), vm = vset(mul);
  int64_t j = 0;
  for (; j + VL <= n; j += VL) vstore(out + j, vexp(vload(x + j) - vs) * vm);
  if (j < n) vstore_tail(out + j, vexp(vload_tail(x + j, n - j, 0.0f) - vs) * vm, n - j);
}

/* sum_j x[j] y[j] over j < n, in double (y = x: the sum of squares of
 * RMSNorm and weft_sumsq). */
static inline double row_dot_d(const float *x, const float *y, int64_t n) {
  vd2 lo = {0}, hi = {0};
  int64_t j = 0;
  for (; j + VL <= n; j += VL) {
    vf4 a = vload(x + j), b = vload(y + j);
    lo += vlo_d(a) * vlo_d(b);
    hi += vhi_d(a) * vhi_d(b);
  }
  double s = hsum_d(lo, hi);
  for (; j < n; j++) s += (double)x[j] * y[j];
  return s;
}

/* y[j] += x[j] for j < n. */
static inline void row_add(float *y, const float *x, int64_t n) {
  int64_t j = 0;
  for (; j + VL <= n; j += VL) vstore(y + j, vload(y + j) + vload(x + j));
  for (; j < n; j++) y[j] += x[j];
}

/* Row maximum of x[0..n) (n >= 1). */
static inline float row_max_of(const float *x, int64_t n) {
  vf4 m = vset(-INFINITY);
  int64_t j = 0;
  for (; j + VL <= n; j += VL) m = vmax(m, vload(x + j));
  if (j < n) m = vmax(m, vload_tail(x + j, n - j, -INFINITY));
  return hmax(m);
}

/* sum_j exp(x[j] - sub) over j < n, accumulated in double; when out is
 * non-NULL also out[j] = exp(x[j] - sub) * mul (out may be x). */
static inline double row_exp_sum(float *out, const float *x, int64_t n, float sub, float mul) {
#ifdef HAVE_AVX2_PATH
  if (use_avx2()) return row_exp_sum_avx2(out, x, n, sub, mul);
#endif
  vd2 lo = {0}, hi = {0};
  const vf4 vs = vset(sub), vm = vset(mul);
  int64_t j = 0;
  for (; j + VL <= n; j += VL) {
    vf4 e = vexp(vload(x + j) - vs);
    vacc_d(&lo, &hi, e);
    if (out) vstore(out + j, e * vm);
  }
  if (j < n) {
    vf4 e = vexp(vload_tail(x + j, n - j, -INFINITY) - vs);
    vacc_d(&lo, &hi, e);
    if (out) vstore_tail(out + j, e * vm, n - j);
  }
  return hsum_d(lo, hi);
}

#endif /* WEFT_CPU_SIMD_H */
