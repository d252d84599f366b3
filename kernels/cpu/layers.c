/* CPU fp32 kernels of the reference model: embedding, linear, RMSNorm, RoPE,
 * causal GQA attention, SwiGLU, residual, cross-entropy (whole and
 * vocab-sharded), AdamW, SGD. Shapes and formulas are documented in
 * layers.h; this file says how. */
#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <string.h>

#include "kernels.h"
#include "layers.h"
#include "arg_checks.h"
#include "weft_config.h"

/* Errors name the operation, as every backend's do (arg_checks.h):
 * "linear_forward: ...", not the C function. */
#undef weft_error
#define weft_error(st, ...) weft_error_at((st), weft_op_name_(__func__), __VA_ARGS__)

/* --------------------------------------------------------- vector helpers
 * The elementwise and row loops below run on 4-float vectors (GCC/Clang
 * vector extensions, the SSE width that every x86-64 has; gcc -O2 leaves
 * such loops scalar by itself), with the tail of a row done on a padded
 * vector so that every element goes through the same arithmetic wherever
 * it sits. Double accumulators stay double (2 lanes each, summed at the
 * end), as layers.h promises. */
typedef float vf4 __attribute__((vector_size(16)));
typedef int32_t vi4 __attribute__((vector_size(16)));
typedef float vf2 __attribute__((vector_size(8)));
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
static inline vd2 vlo_d(vf4 v) { return __builtin_convertvector(__builtin_shufflevector(v, v, 0, 1), vd2); }
static inline vd2 vhi_d(vf4 v) { return __builtin_convertvector(__builtin_shufflevector(v, v, 2, 3), vd2); }
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
#if defined(__x86_64__) && defined(__GNUC__) && !defined(WEFT_NO_AVX2_PATH)
#include <immintrin.h>
#define HAVE_AVX2_PATH 1
#define AVX2_FN __attribute__((target("avx2,fma")))
typedef float vf8 __attribute__((vector_size(32)));
typedef int32_t vi8 __attribute__((vector_size(32)));
typedef double vd4 __attribute__((vector_size(32)));

static bool use_avx2(void) {
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
AVX2_FN static inline vf8 v8sel(vi8 m, vf8 a, vf8 b) {
  return (vf8)((m & (vi8)a) | (~m & (vi8)b));
}
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

AVX2_FN static void row_exp_avx2(float *out, const float *x, int64_t n, float sub, float mul) {
  const vf8 vs = v8set(sub), vm = v8set(mul);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) v8store(out + j, v8exp(v8load(x + j) - vs) * vm);
  if (j < n) v8store_tail(out + j, v8exp(v8load_tail(x + j, n - j, 0.0f) - vs) * vm, n - j);
}

AVX2_FN static double row_exp_sum_avx2(float *out, const float *x, int64_t n, float sub,
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

AVX2_FN static void swiglu_fwd_avx2(float *out, const float *a, const float *b, int64_t n) {
  const vf8 one = v8set(1.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    vf8 x = v8load(a + i);
    v8store(out + i, x / (one + v8exp(-x)) * v8load(b + i));
  }
  if (i < n) {
    vf8 x = v8load_tail(a + i, n - i, 0.0f);
    v8store_tail(out + i, x / (one + v8exp(-x)) * v8load_tail(b + i, n - i, 0.0f), n - i);
  }
}

AVX2_FN static void swiglu_bwd_avx2(float *da, float *db, const float *dout, const float *a,
                                    const float *b, int64_t n) {
  const vf8 one = v8set(1.0f);
  int64_t i = 0;
  for (; i < n; i += 8) {
    const int64_t m = n - i < 8 ? n - i : 8;
    vf8 x, y, d;
    if (m == 8) {
      x = v8load(a + i), y = v8load(b + i), d = v8load(dout + i);
    } else {
      x = v8load_tail(a + i, m, 0.0f), y = v8load_tail(b + i, m, 0.0f);
      d = v8load_tail(dout + i, m, 0.0f);
    }
    vf8 s = one / (one + v8exp(-x));
    vf8 gda = d * y * s * (one + x * (one - s)), gdb = d * (x * s);
    if (m == 8) {
      v8store(da + i, gda);
      v8store(db + i, gdb);
    } else {
      v8store_tail(da + i, gda, m);
      v8store_tail(db + i, gdb, m);
    }
  }
}
#endif

/* out[j] = exp(x[j] - sub) * mul for j < n (out may be x). */
static void row_exp(float *out, const float *x, int64_t n, float sub, float mul) {
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

/* sum_j x[j] y[j] over j < n, in double. */
static double row_dot_d(const float *x, const float *y, int64_t n) {
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
static void row_add(float *y, const float *x, int64_t n) {
  int64_t j = 0;
  for (; j + VL <= n; j += VL) vstore(y + j, vload(y + j) + vload(x + j));
  for (; j < n; j++) y[j] += x[j];
}

/* Row maximum of x[0..n) (n >= 1). */
static float row_max_of(const float *x, int64_t n) {
  vf4 m = vset(-INFINITY);
  int64_t j = 0;
  for (; j + VL <= n; j += VL) m = vmax(m, vload(x + j));
  if (j < n) m = vmax(m, vload_tail(x + j, n - j, -INFINITY));
  return hmax(m);
}

/* sum_j exp(x[j] - sub) over j < n, accumulated in double; when out is
 * non-NULL also out[j] = exp(x[j] - sub) * mul (out may be x). */
static double row_exp_sum(float *out, const float *x, int64_t n, float sub, float mul) {
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

/* ------------------------------------------------------------- embedding */

weft_status weft_embedding_forward(float *out, const int32_t *tokens, const float *weight,
                                   int64_t N, int64_t V, int64_t C) {
  CHECK_SIZES(N, V, C);
  CHECK_PTR(out, N * C);
  CHECK_PTR(tokens, N);
  CHECK_PTR(weight, V * C);
  for (int64_t n = 0; n < N; n++)
    if (tokens[n] < 0 || tokens[n] >= V)
      return weft_error(WEFT_ERR_INVALID, "tokens[%lld] = %d is outside the vocabulary [0, %lld)",
                        (long long)n, tokens[n], (long long)V);
  for (int64_t n = 0; n < N; n++)
    memcpy(out + n * C, weight + (int64_t)tokens[n] * C, (size_t)C * sizeof(float));
  return WEFT_OK;
}

weft_status weft_embedding_backward(float *dweight, const int32_t *tokens, const float *dout,
                                    int64_t N, int64_t V, int64_t C) {
  CHECK_SIZES(N, V, C);
  CHECK_PTR(dweight, V * C);
  CHECK_PTR(tokens, N);
  CHECK_PTR(dout, N * C);
  for (int64_t n = 0; n < N; n++)
    if (tokens[n] < 0 || tokens[n] >= V)
      return weft_error(WEFT_ERR_INVALID, "tokens[%lld] = %d is outside the vocabulary [0, %lld)",
                        (long long)n, tokens[n], (long long)V);
  for (int64_t n = 0; n < N; n++) row_add(dweight + (int64_t)tokens[n] * C, dout + n * C, C);
  return WEFT_OK;
}

static weft_status check_tokens_nonneg(const char *op, const int32_t *tokens, int64_t N) {
  for (int64_t n = 0; n < N; n++)
    if (tokens[n] < 0)
      return weft_error_at(WEFT_ERR_INVALID, op, "tokens[%lld] = %d is negative", (long long)n,
                        tokens[n]);
  return WEFT_OK;
}

weft_status weft_embedding_range_forward(float *out, const int32_t *tokens,
                                         const float *weight_local, int64_t N, int64_t v0,
                                         int64_t nv, int64_t C) {
  CHECK_SIZES(N, v0, nv, C);
  CHECK_PTR(out, N * C);
  CHECK_PTR(tokens, N);
  CHECK_PTR(weight_local, nv * C);
  WEFT_CHECK(check_tokens_nonneg(weft_op_name_(__func__), tokens, N));
  for (int64_t n = 0; n < N; n++) {
    int64_t r = (int64_t)tokens[n] - v0;
    if (r >= 0 && r < nv)
      memcpy(out + n * C, weight_local + r * C, (size_t)C * sizeof(float));
    else
      memset(out + n * C, 0, (size_t)C * sizeof(float));
  }
  return WEFT_OK;
}

weft_status weft_embedding_range_backward(float *dweight_local, const int32_t *tokens,
                                          const float *dout, int64_t N, int64_t v0, int64_t nv,
                                          int64_t C) {
  CHECK_SIZES(N, v0, nv, C);
  CHECK_PTR(dweight_local, nv * C);
  CHECK_PTR(tokens, N);
  CHECK_PTR(dout, N * C);
  WEFT_CHECK(check_tokens_nonneg(weft_op_name_(__func__), tokens, N));
  for (int64_t n = 0; n < N; n++) {
    int64_t r = (int64_t)tokens[n] - v0;
    if (r < 0 || r >= nv) continue;
    row_add(dweight_local + r * C, dout + n * C, C);
  }
  return WEFT_OK;
}

/* ---------------------------------------------------------------- linear */

weft_status weft_linear_forward(float *out, const float *inp, const float *weight,
                                const float *bias, int64_t N, int64_t IC, int64_t OC) {
  CHECK_SIZES(N, IC, OC);
  CHECK_PTR(out, N * OC);
  CHECK_PTR(inp, N * IC);
  CHECK_PTR(weight, OC * IC);
  if (N == 0 || OC == 0) return WEFT_OK;
  /* out (N, OC) = inp (N, IC) @ weight^T (IC, OC) */
  weft_sgemm(false, true, N, OC, IC, 1.0f, inp, IC, weight, IC, 0.0f, out, OC);
  if (bias)
    for (int64_t n = 0; n < N; n++)
      for (int64_t o = 0; o < OC; o++) out[n * OC + o] += bias[o];
  return WEFT_OK;
}

weft_status weft_linear_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                                 const float *inp, const float *weight, int64_t N, int64_t IC,
                                 int64_t OC, bool accumulate_dinp, bool accumulate_dweight) {
  CHECK_SIZES(N, IC, OC);
  CHECK_PTR(dout, N * OC);
  if (dinp) CHECK_PTR(weight, OC * IC);
  if (dweight) CHECK_PTR(inp, N * IC);
  if (dinp && N * IC > 0) {
    /* dinp (N, IC) = dout (N, OC) @ weight (OC, IC) */
    weft_sgemm(false, false, N, IC, OC, 1.0f, dout, OC, weight, IC,
               accumulate_dinp ? 1.0f : 0.0f, dinp, IC);
  }
  if (dweight && OC * IC > 0) {
    /* dweight (OC, IC) = dout^T (OC, N) @ inp (N, IC) */
    weft_sgemm(true, false, OC, IC, N, 1.0f, dout, OC, inp, IC,
               accumulate_dweight ? 1.0f : 0.0f, dweight, IC);
  }
  if (dbias) {
    if (!accumulate_dweight) memset(dbias, 0, (size_t)OC * sizeof(float));
    for (int64_t n = 0; n < N; n++)
      for (int64_t o = 0; o < OC; o++) dbias[o] += dout[n * OC + o];
  }
  return WEFT_OK;
}

/* --------------------------------------------------------------- RMSNorm */

weft_status weft_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight,
                                 int64_t N, int64_t C, float eps) {
  CHECK_SIZES(N, C);
  if (C == 0 && N > 0) return weft_error(WEFT_ERR_INVALID, "C = 0: RMSNorm over an empty row");
  CHECK_PTR(out, N * C);
  CHECK_PTR(rstd, N);
  CHECK_PTR(inp, N * C);
  CHECK_PTR(weight, C);
  if (!(eps >= 0.0f)) return weft_error(WEFT_ERR_INVALID, "eps = %g must be >= 0", (double)eps);
  for (int64_t n = 0; n < N; n++) {
    const float *x = inp + n * C;
    vd2 lo = {0}, hi = {0};
    int64_t c = 0;
    for (; c + VL <= C; c += VL) {
      vf4 v = vload(x + c);
      vd2 a = vlo_d(v), b = vhi_d(v);
      lo += a * a;
      hi += b * b;
    }
    double ss = hsum_d(lo, hi);
    for (; c < C; c++) ss += (double)x[c] * x[c];
    float r = (float)(1.0 / sqrt(ss / (double)C + (double)eps));
    rstd[n] = r;
    float *y = out + n * C;
    const vf4 vr = vset(r);
    for (c = 0; c + VL <= C; c += VL) vstore(y + c, vload(x + c) * vr * vload(weight + c));
    for (; c < C; c++) y[c] = x[c] * r * weight[c];
  }
  return WEFT_OK;
}

weft_status weft_rmsnorm_backward(float *dinp, float *dweight, const float *dout,
                                  const float *inp, const float *weight, const float *rstd,
                                  int64_t N, int64_t C, bool accumulate_dinp) {
  CHECK_SIZES(N, C);
  CHECK_PTR(dinp, N * C);
  CHECK_PTR(dweight, C);
  CHECK_PTR(dout, N * C);
  CHECK_PTR(inp, N * C);
  CHECK_PTR(weight, C);
  CHECK_PTR(rstd, N);
  for (int64_t n = 0; n < N; n++) {
    const float *x = inp + n * C, *dy = dout + n * C;
    float *dx = dinp + n * C;
    float r = rstd[n];
    const vf4 vr = vset(r);
    vd2 lo = {0}, hi = {0}; /* sum_j g_j x_j with g = dy * w */
    int64_t c = 0;
    for (; c + VL <= C; c += VL) {
      vf4 xv = vload(x + c), dyv = vload(dy + c);
      vf4 g = dyv * vload(weight + c);
      lo += vlo_d(g) * vlo_d(xv);
      hi += vhi_d(g) * vhi_d(xv);
      vstore(dweight + c, vload(dweight + c) + dyv * xv * vr);
    }
    double gx = hsum_d(lo, hi);
    for (; c < C; c++) {
      gx += (double)(dy[c] * weight[c]) * x[c];
      dweight[c] += dy[c] * x[c] * r;
    }
    float k = (float)(gx / (double)C) * r * r;
    const vf4 vk = vset(k);
    c = 0;
    if (accumulate_dinp) {
      for (; c + VL <= C; c += VL)
        vstore(dx + c, vload(dx + c) +
                           vr * (vload(dy + c) * vload(weight + c) - vload(x + c) * vk));
      for (; c < C; c++) dx[c] += r * (dy[c] * weight[c] - x[c] * k);
    } else {
      for (; c + VL <= C; c += VL)
        vstore(dx + c, vr * (vload(dy + c) * vload(weight + c) - vload(x + c) * vk));
      for (; c < C; c++) dx[c] = r * (dy[c] * weight[c] - x[c] * k);
    }
  }
  return WEFT_OK;
}

/* ------------------------------------------------------------------ RoPE */

weft_status weft_rope_tables(float *cosb, float *sinb, int64_t max_pos, int64_t hd,
                             double theta) {
  CHECK_SIZES(max_pos, hd);
  if (hd == 0 || hd % 2 != 0)
    return weft_error(WEFT_ERR_INVALID, "head dim %lld must be even and > 0", (long long)hd);
  if (!(theta > 0.0)) return weft_error(WEFT_ERR_INVALID, "theta = %g must be > 0", theta);
  CHECK_PTR(cosb, max_pos * hd / 2);
  CHECK_PTR(sinb, max_pos * hd / 2);
  int64_t half = hd / 2;
  for (int64_t j = 0; j < half; j++) {
    double freq = pow(theta, -2.0 * (double)j / (double)hd);
    for (int64_t p = 0; p < max_pos; p++) {
      double a = (double)p * freq;
      cosb[p * half + j] = (float)cos(a);
      sinb[p * half + j] = (float)sin(a);
    }
  }
  return WEFT_OK;
}

/* Shared by forward (sign = +1) and backward (sign = -1, the transpose). */
static weft_status rope_apply(const char *op, float *out, const float *inp, const float *cosb,
                              const float *sinb, int64_t max_pos, int64_t B, int64_t T,
                              int64_t NH, int64_t hd, int64_t pos0, float sign) {
  CHECK_SIZES_AT(op, max_pos, B, T, NH, hd, pos0);
  if (hd == 0 || hd % 2 != 0)
    return weft_error_at(WEFT_ERR_INVALID, op, "head dim %lld must be even and > 0", (long long)hd);
  if (pos0 + T > max_pos)
    return weft_error_at(WEFT_ERR_INVALID, op,
                         "positions [%lld, %lld) run past the tables' %lld rows", (long long)pos0,
                         (long long)(pos0 + T), (long long)max_pos);
  int64_t n = B * T * NH * hd;
  CHECK_PTR_AT(op, out, n);
  CHECK_PTR_AT(op, inp, n);
  CHECK_PTR_AT(op, cosb, (pos0 + T) * hd / 2);
  CHECK_PTR_AT(op, sinb, (pos0 + T) * hd / 2);
  int64_t half = hd / 2;
  for (int64_t b = 0; b < B; b++)
    for (int64_t t = 0; t < T; t++) {
      const float *cp = cosb + (pos0 + t) * half, *sp = sinb + (pos0 + t) * half;
      for (int64_t h = 0; h < NH; h++) {
        int64_t off = ((b * T + t) * NH + h) * hd;
        const float *x = inp + off;
        float *y = out + off;
        int64_t j = 0;
        /* two pairs per vector: y = x * (c0 c0 c1 c1) + swap(x) * (-s0 s0 -s1 s1),
         * the same products and sums as the scalar form below */
        const vf4 sg = {-sign, sign, -sign, sign};
        for (; j + 2 <= half; j += 2) {
          vf4 xv = vload(x + 2 * j);
          vf4 cv = {cp[j], cp[j], cp[j + 1], cp[j + 1]};
          vf4 sv = (vf4){sp[j], sp[j], sp[j + 1], sp[j + 1]} * sg;
          vf4 sw = __builtin_shufflevector(xv, xv, 1, 0, 3, 2);
          vstore(y + 2 * j, xv * cv + sw * sv);
        }
        for (; j < half; j++) {
          float c = cp[j], s = sign * sp[j];
          float x0 = x[2 * j], x1 = x[2 * j + 1];
          y[2 * j] = x0 * c - x1 * s;
          y[2 * j + 1] = x0 * s + x1 * c;
        }
      }
    }
  return WEFT_OK;
}

weft_status weft_rope_forward(float *out, const float *inp, const float *cosb, const float *sinb,
                              int64_t max_pos, int64_t B, int64_t T, int64_t NH, int64_t hd,
                              int64_t pos0) {
  return rope_apply("rope_forward", out, inp, cosb, sinb, max_pos, B, T, NH, hd, pos0, 1.0f);
}

weft_status weft_rope_backward(float *dinp, const float *dout, const float *cosb,
                               const float *sinb, int64_t max_pos, int64_t B, int64_t T,
                               int64_t NH, int64_t hd, int64_t pos0) {
  return rope_apply("rope_backward", dinp, dout, cosb, sinb, max_pos, B, T, NH, hd, pos0, -1.0f);
}

/* ------------------------------------------------------------- attention */

/* Query rows per block. A causal block of rows [t0, t0 + nb) needs keys
 * [0, t0 + nb) only, so blocking skips most of the upper triangle; a
 * non-causal block reads all T keys. */
#define ATT_BLOCK 64

int64_t weft_attention_scratch_floats(int64_t T) {
  if (T <= 0) return 0;
  return 2 * (T < ATT_BLOCK ? T : ATT_BLOCK) * T;
}

/* ------------------------------------------------- attention's threads
 * The (batch, head) pairs of attention are independent and each one's
 * GEMMs are small (64 query rows x at most T keys x hd): OpenBLAS splits
 * such a GEMM over its threads with a synchronisation per call, which
 * measured here makes 2-thread attention slower than 1 thread (4x512x12x64
 * forward 35 -> 45 ms). So when OpenBLAS is the pthreads build and set to
 * N > 1 threads (OPENBLAS_NUM_THREADS), attention sets it to 1 for the
 * duration, runs the pairs on N threads of its own (the caller and N - 1
 * pool workers, started on first use, each with its own scratch block),
 * and restores N. Every pair is computed exactly as in the serial loop,
 * so results do not depend on N. One caller at a time uses the pool; a
 * concurrent caller runs serially. After fork() the child starts a new
 * pool (the workers do not survive it). */
#if WEFT_HAVE_BLAS
#include <cblas.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>
#define PAR_MAX 64

typedef void (*par_fn)(void *ctx, int64_t item, float *scratch);

static struct {
  pthread_mutex_t call; /* held by the caller for a whole job */
  pthread_mutex_t mu;   /* guards the fields below */
  pthread_cond_t wake, idle;
  int nworkers;         /* started workers, ids 1..nworkers */
  uint64_t gen;         /* job generation */
  int want;             /* workers 1..want take part in the current job */
  int busy;             /* of those, still working */
  par_fn fn;
  void *ctx;
  int64_t n;
  atomic_llong next;    /* next item to take */
  uint64_t start_gen[PAR_MAX]; /* the generation before the job a worker was started for */
  float *scratch[PAR_MAX];
  int64_t scratch_cap[PAR_MAX];
} par = {.call = PTHREAD_MUTEX_INITIALIZER, .mu = PTHREAD_MUTEX_INITIALIZER,
         .wake = PTHREAD_COND_INITIALIZER, .idle = PTHREAD_COND_INITIALIZER};
static pthread_once_t par_once = PTHREAD_ONCE_INIT;

static void par_items(par_fn fn, void *ctx, int64_t n, float *scratch) {
  for (;;) {
    int64_t i = atomic_fetch_add(&par.next, 1);
    if (i >= n) break;
    fn(ctx, i, scratch);
  }
}

static void *par_worker(void *arg) {
  const int id = (int)(intptr_t)arg;
  pthread_mutex_lock(&par.mu);
  uint64_t seen = par.start_gen[id]; /* so it joins the job it was started for */
  for (;;) {
    while (par.gen == seen) pthread_cond_wait(&par.wake, &par.mu);
    seen = par.gen;
    if (id > par.want) continue;
    par_fn fn = par.fn;
    void *ctx = par.ctx;
    int64_t n = par.n;
    float *scratch = par.scratch[id];
    pthread_mutex_unlock(&par.mu);
    par_items(fn, ctx, n, scratch);
    pthread_mutex_lock(&par.mu);
    if (--par.busy == 0) pthread_cond_signal(&par.idle);
  }
  return NULL;
}

static void par_prepare(void) {
  pthread_mutex_lock(&par.call);
  pthread_mutex_lock(&par.mu);
}
static void par_parent(void) {
  pthread_mutex_unlock(&par.mu);
  pthread_mutex_unlock(&par.call);
}
static void par_child(void) {
  /* the workers are gone; the scratch blocks stay this process's */
  par.nworkers = 0;
  par.want = par.busy = 0;
  pthread_mutex_unlock(&par.mu);
  pthread_mutex_unlock(&par.call);
}
static void par_init(void) { pthread_atfork(par_prepare, par_parent, par_child); }

/* Threads attention may use: OpenBLAS's setting, when it is the pthreads
 * build (with the OpenMP build a setting made here would not reach the
 * pool's threads); else 1. */
static int par_threads(void) {
  if (openblas_get_parallel() != 1) return 1;
  int nt = openblas_get_num_threads();
  return nt < 1 ? 1 : nt > PAR_MAX ? PAR_MAX : nt;
}

/* fn(ctx, i, scratch) for i in [0, n) on up to nt threads (this one
 * included); each thread passes its own scratch of `floats` floats (the
 * caller's is `own`). Falls back to this thread alone when the pool is
 * busy or cannot grow. */
static void par_run(int64_t n, int nt, par_fn fn, void *ctx, float *own, int64_t floats) {
  if (nt > 1 && n > 1 && pthread_mutex_trylock(&par.call) == 0) {
    pthread_once(&par_once, par_init);
    int want = nt - 1 < n - 1 ? nt - 1 : (int)(n - 1);
    for (int id = 1; id <= want; id++) {
      if (par.scratch_cap[id] < floats) {
        float *p = malloc((size_t)(floats > 0 ? floats : 1) * sizeof(float));
        if (!p) {
          want = id - 1;
          break;
        }
        free(par.scratch[id]);
        par.scratch[id] = p;
        par.scratch_cap[id] = floats;
      }
    }
    pthread_mutex_lock(&par.mu);
    while (par.nworkers < want) {
      pthread_t t;
      par.start_gen[par.nworkers + 1] = par.gen;
      if (pthread_create(&t, NULL, par_worker, (void *)(intptr_t)(par.nworkers + 1)) != 0) break;
      pthread_detach(t);
      par.nworkers++;
    }
    if (want > par.nworkers) want = par.nworkers;
    par.fn = fn;
    par.ctx = ctx;
    par.n = n;
    atomic_store(&par.next, 0);
    par.want = par.busy = want;
    par.gen++;
    pthread_cond_broadcast(&par.wake);
    pthread_mutex_unlock(&par.mu);
    par_items(fn, ctx, n, own);
    pthread_mutex_lock(&par.mu);
    while (par.busy > 0) pthread_cond_wait(&par.idle, &par.mu);
    pthread_mutex_unlock(&par.mu);
    pthread_mutex_unlock(&par.call);
    return;
  }
  for (int64_t i = 0; i < n; i++) fn(ctx, i, own);
}

/* Runs fn over the n items on OpenBLAS's thread count with OpenBLAS at 1
 * thread meanwhile (see above). */
static void att_parallel(int64_t n, par_fn fn, void *ctx, float *own, int64_t floats) {
  const int nt = par_threads();
  if (nt <= 1 || n <= 1) {
    for (int64_t i = 0; i < n; i++) fn(ctx, i, own);
    return;
  }
  openblas_set_num_threads(1);
  par_run(n, nt, fn, ctx, own, floats);
  openblas_set_num_threads(nt);
}
#else
typedef void (*par_fn)(void *ctx, int64_t item, float *scratch);
static void att_parallel(int64_t n, par_fn fn, void *ctx, float *own, int64_t floats) {
  (void)floats;
  for (int64_t i = 0; i < n; i++) fn(ctx, i, own);
}
#endif

static weft_status attention_check(const char *op, int64_t B, int64_t T, int64_t H, int64_t Hkv,
                                   int64_t hd) {
  CHECK_SIZES_AT(op, B, T, H, Hkv, hd);
  if (H > 0 && (Hkv == 0 || H % Hkv != 0))
    return weft_error_at(WEFT_ERR_INVALID, op, "H = %lld query heads is not a multiple of Hkv = %lld",
                      (long long)H, (long long)Hkv);
  return WEFT_OK;
}

/* What one (batch, head) item of forward or backward reads and writes. */
typedef struct att_args {
  float *out, *lse, *dq, *dk, *dv;
  const float *q, *k, *v, *dout, *lse_in;
  int64_t B, T, H, Hkv, hd;
  bool causal; /* keys 0..t for query t; else all T */
} att_args;

/* Forward of item (b, h), h a query head. */
static void att_forward_item(void *ctx, int64_t item, float *scratch) {
  const att_args *a = ctx;
  const int64_t T = a->T, H = a->H, hd = a->hd, b = item / H, h = item % H;
  const float scale = (float)(1.0 / sqrt((double)hd));
  const int64_t ldq = H * hd, ldk = a->Hkv * hd, group = H / a->Hkv;
  const int64_t g = h / group;
  const float *qb = a->q + b * T * ldq + h * hd;
  const float *kb = a->k + b * T * ldk + g * hd;
  const float *vb = a->v + b * T * ldk + g * hd;
  float *ob = a->out + b * T * ldq + h * hd;
  float *lb = a->lse + (b * H + h) * T;
  for (int64_t t0 = 0; t0 < T; t0 += ATT_BLOCK) {
    const int64_t nb = T - t0 < ATT_BLOCK ? T - t0 : ATT_BLOCK, nk = a->causal ? t0 + nb : T;
    float *S = scratch; /* (nb, nk) */
    /* S = scale * Q[t0:t0+nb] K[0:nk]^T */
    weft_sgemm(false, true, nb, nk, hd, scale, qb + t0 * ldq, ldq, kb, ldk, 0.0f, S, nk);
    for (int64_t r = 0; r < nb; r++) {
      float *row = S + r * nk;
      const int64_t valid = a->causal ? t0 + r + 1 : T; /* keys 0..t, or all */
      const float mx = row_max_of(row, valid);
      double sum = row_exp_sum(row, row, valid, mx, 1.0f); /* row = exp(row - mx) */
      const vf4 inv = vset((float)(1.0 / sum));
      int64_t j = 0;
      for (; j + VL <= valid; j += VL) vstore(row + j, vload(row + j) * inv);
      if (j < valid) vstore_tail(row + j, vload_tail(row + j, valid - j, 0.0f) * inv, valid - j);
      memset(row + valid, 0, (size_t)(nk - valid) * sizeof(float));
      lb[t0 + r] = mx + (float)log(sum);
    }
    /* O[t0:t0+nb] = P V[0:nk] */
    weft_sgemm(false, false, nb, hd, nk, 1.0f, S, nk, vb, ldk, 0.0f, ob + t0 * ldq, ldq);
  }
}

weft_status weft_attention_forward(float *out, float *lse, const float *q, const float *k,
                                   const float *v, int64_t B, int64_t T, int64_t H, int64_t Hkv,
                                   int64_t hd, bool causal, float *scratch) {
  WEFT_CHECK(attention_check(weft_op_name_(__func__), B, T, H, Hkv, hd));
  CHECK_PTR(out, B * T * H * hd);
  CHECK_PTR(lse, B * H * T);
  CHECK_PTR(q, B * T * H * hd);
  CHECK_PTR(k, B * T * Hkv * hd);
  CHECK_PTR(v, B * T * Hkv * hd);
  CHECK_PTR(scratch, B * H * hd > 0 ? weft_attention_scratch_floats(T) : 0);
  if (B * T * H == 0) return WEFT_OK;
  if (hd == 0) { /* no features: softmax over zeros, empty outputs */
    for (int64_t i = 0; i < B * H; i++)
      for (int64_t t = 0; t < T; t++) lse[i * T + t] = logf((float)(causal ? t + 1 : T));
    return WEFT_OK;
  }
  att_args a = {.out = out, .lse = lse, .q = q, .k = k, .v = v, .B = B, .T = T, .H = H,
                .Hkv = Hkv, .hd = hd, .causal = causal};
  att_parallel(B * H, att_forward_item, &a, scratch, weft_attention_scratch_floats(T));
  return WEFT_OK;
}

/* Backward of item (b, g), g a kv head: its query heads in order (they
 * all accumulate into the same dK, dV rows). */
static void att_backward_item(void *ctx, int64_t item, float *scratch) {
  const att_args *a = ctx;
  const int64_t T = a->T, H = a->H, Hkv = a->Hkv, hd = a->hd, b = item / Hkv, g = item % Hkv;
  const float scale = (float)(1.0 / sqrt((double)hd));
  const int64_t ldq = H * hd, ldk = Hkv * hd, group = H / Hkv;
  const int64_t bs = T < ATT_BLOCK ? T : ATT_BLOCK;
  for (int64_t h = g * group; h < (g + 1) * group; h++) {
    const float *qb = a->q + b * T * ldq + h * hd, *dob = a->dout + b * T * ldq + h * hd;
    const float *kb = a->k + b * T * ldk + g * hd, *vb = a->v + b * T * ldk + g * hd;
    float *dqb = a->dq + b * T * ldq + h * hd;
    float *dkb = a->dk + b * T * ldk + g * hd, *dvb = a->dv + b * T * ldk + g * hd;
    const float *lb = a->lse_in + (b * H + h) * T;
    for (int64_t t0 = 0; t0 < T; t0 += ATT_BLOCK) {
      const int64_t nb = T - t0 < ATT_BLOCK ? T - t0 : ATT_BLOCK,
                    nk = a->causal ? t0 + nb : T;
      float *P = scratch, *dP = scratch + bs * T; /* each (nb, nk) */
      /* recompute P = exp(scale * Q K^T - lse), zero above the diagonal
       * (causal) */
      weft_sgemm(false, true, nb, nk, hd, scale, qb + t0 * ldq, ldq, kb, ldk, 0.0f, P, nk);
      /* dP = dO V^T */
      weft_sgemm(false, true, nb, nk, hd, 1.0f, dob + t0 * ldq, ldq, vb, ldk, 0.0f, dP, nk);
      for (int64_t r = 0; r < nb; r++) {
        float *prow = P + r * nk, *drow = dP + r * nk;
        const int64_t valid = a->causal ? t0 + r + 1 : T;
        row_exp(prow, prow, valid, lb[t0 + r], 1.0f); /* P = exp(S - lse) */
        /* rowsum(P * dP) = dO . O, in double */
        const double dsum = row_dot_d(prow, drow, valid);
        const vf4 d = vset((float)dsum), sc = vset(scale);
        int64_t j = 0;
        /* dS (times the score scale, folded in here) */
        for (; j + VL <= valid; j += VL)
          vstore(drow + j, vload(prow + j) * (vload(drow + j) - d) * sc);
        if (j < valid)
          vstore_tail(drow + j,
                      vload_tail(prow + j, valid - j, 0.0f) *
                          (vload_tail(drow + j, valid - j, 0.0f) - d) * sc,
                      valid - j);
        memset(prow + valid, 0, (size_t)(nk - valid) * sizeof(float));
        memset(drow + valid, 0, (size_t)(nk - valid) * sizeof(float));
      }
      /* dV[0:nk] += P^T dO[t0:t0+nb] */
      weft_sgemm(true, false, nk, hd, nb, 1.0f, P, nk, dob + t0 * ldq, ldq, 1.0f, dvb, ldk);
      /* dQ[t0:t0+nb] = dS K[0:nk] */
      weft_sgemm(false, false, nb, hd, nk, 1.0f, dP, nk, kb, ldk, 0.0f, dqb + t0 * ldq, ldq);
      /* dK[0:nk] += dS^T Q[t0:t0+nb] */
      weft_sgemm(true, false, nk, hd, nb, 1.0f, dP, nk, qb + t0 * ldq, ldq, 1.0f, dkb, ldk);
    }
  }
}

weft_status weft_attention_backward(float *dq, float *dk, float *dv, const float *dout,
                                    const float *q, const float *k, const float *v,
                                    const float *lse, int64_t B, int64_t T, int64_t H,
                                    int64_t Hkv, int64_t hd, bool causal, float *scratch) {
  WEFT_CHECK(attention_check(weft_op_name_(__func__), B, T, H, Hkv, hd));
  CHECK_PTR(dq, B * T * H * hd);
  CHECK_PTR(dk, B * T * Hkv * hd);
  CHECK_PTR(dv, B * T * Hkv * hd);
  CHECK_PTR(dout, B * T * H * hd);
  CHECK_PTR(q, B * T * H * hd);
  CHECK_PTR(k, B * T * Hkv * hd);
  CHECK_PTR(v, B * T * Hkv * hd);
  CHECK_PTR(lse, B * H * T);
  CHECK_PTR(scratch, B * H * hd > 0 ? weft_attention_scratch_floats(T) : 0);
  if (B * T * Hkv * hd > 0) {
    memset(dk, 0, (size_t)(B * T * Hkv * hd) * sizeof(float));
    memset(dv, 0, (size_t)(B * T * Hkv * hd) * sizeof(float));
  }
  if (B * T * H * hd == 0) return WEFT_OK;
  att_args a = {.dq = dq, .dk = dk, .dv = dv, .q = q, .k = k, .v = v, .dout = dout,
                .lse_in = lse, .B = B, .T = T, .H = H, .Hkv = Hkv, .hd = hd, .causal = causal};
  att_parallel(B * Hkv, att_backward_item, &a, scratch, weft_attention_scratch_floats(T));
  return WEFT_OK;
}

/* ---------------------------------------------------------------- SwiGLU */

weft_status weft_swiglu_forward(float *out, const float *a, const float *b, int64_t n) {
  CHECK_SIZES(n);
  CHECK_PTR(out, n);
  CHECK_PTR(a, n);
  CHECK_PTR(b, n);
#ifdef HAVE_AVX2_PATH
  if (use_avx2()) {
    swiglu_fwd_avx2(out, a, b, n);
    return WEFT_OK;
  }
#endif
  const vf4 one = vset(1.0f);
  int64_t i = 0;
  for (; i + VL <= n; i += VL) {
    vf4 x = vload(a + i);
    vstore(out + i, x / (one + vexp(-x)) * vload(b + i));
  }
  if (i < n) {
    vf4 x = vload_tail(a + i, n - i, 0.0f);
    vstore_tail(out + i, x / (one + vexp(-x)) * vload_tail(b + i, n - i, 0.0f), n - i);
  }
  return WEFT_OK;
}

weft_status weft_swiglu_backward(float *da, float *db, const float *dout, const float *a,
                                 const float *b, int64_t n) {
  CHECK_SIZES(n);
  CHECK_PTR(da, n);
  CHECK_PTR(db, n);
  CHECK_PTR(dout, n);
  CHECK_PTR(a, n);
  CHECK_PTR(b, n);
#ifdef HAVE_AVX2_PATH
  if (use_avx2()) {
    swiglu_bwd_avx2(da, db, dout, a, b, n);
    return WEFT_OK;
  }
#endif
  const vf4 one = vset(1.0f);
  int64_t i = 0;
  for (; i + VL <= n; i += VL) {
    vf4 x = vload(a + i), y = vload(b + i), d = vload(dout + i);
    vf4 s = one / (one + vexp(-x));
    vf4 silu = x * s;
    vstore(da + i, d * y * s * (one + x * (one - s)));
    vstore(db + i, d * silu);
  }
  if (i < n) {
    int64_t m = n - i;
    vf4 x = vload_tail(a + i, m, 0.0f), y = vload_tail(b + i, m, 0.0f),
        d = vload_tail(dout + i, m, 0.0f);
    vf4 s = one / (one + vexp(-x));
    vf4 silu = x * s;
    vstore_tail(da + i, d * y * s * (one + x * (one - s)), m);
    vstore_tail(db + i, d * silu, m);
  }
  return WEFT_OK;
}

/* -------------------------------------------------------------- residual */

weft_status weft_residual_forward(float *out, const float *a, const float *b, int64_t n) {
  CHECK_SIZES(n);
  CHECK_PTR(out, n);
  CHECK_PTR(a, n);
  CHECK_PTR(b, n);
  int64_t i = 0;
  for (; i + VL <= n; i += VL) vstore(out + i, vload(a + i) + vload(b + i));
  for (; i < n; i++) out[i] = a[i] + b[i];
  return WEFT_OK;
}

weft_status weft_residual_backward(float *da, float *db, const float *dout, int64_t n) {
  CHECK_SIZES(n);
  CHECK_PTR(dout, n);
  float *dst[2] = {da, db};
  for (int k = 0; k < 2; k++) {
    float *x = dst[k];
    if (!x) continue;
    int64_t i = 0;
    for (; i + VL <= n; i += VL) vstore(x + i, vload(x + i) + vload(dout + i));
    for (; i < n; i++) x[i] += dout[i];
  }
  return WEFT_OK;
}

/* --------------------------------------------------------- cross-entropy */

static weft_status check_targets(const char *op, const int32_t *targets, int64_t N, int64_t V) {
  for (int64_t n = 0; n < N; n++)
    if (targets[n] < 0 || (V >= 0 && targets[n] >= V))
      return V >= 0 ? weft_error_at(WEFT_ERR_INVALID, op,
                                    "targets[%lld] = %d is outside the vocabulary [0, %lld)",
                                    (long long)n, targets[n], (long long)V)
                    : weft_error_at(WEFT_ERR_INVALID, op, "targets[%lld] = %d is negative",
                                    (long long)n, targets[n]);
  return WEFT_OK;
}

weft_status weft_cross_entropy_forward(double *loss, float *lse, const float *logits,
                                       const int32_t *targets, int64_t N, int64_t V) {
  CHECK_SIZES(N, V);
  CHECK_PTR(loss, 1);
  CHECK_PTR(logits, N * V);
  CHECK_PTR(targets, N);
  if (V == 0 && N > 0) return weft_error(WEFT_ERR_INVALID, "V = 0: no classes");
  WEFT_CHECK(check_targets(weft_op_name_(__func__), targets, N, V));
  double total = 0.0;
  for (int64_t n = 0; n < N; n++) {
    const float *row = logits + n * V;
    const float mx = row_max_of(row, V);
    double sum = row_exp_sum(NULL, row, V, mx, 1.0f);
    double l = (double)mx + log(sum);
    if (lse) lse[n] = (float)l;
    total += l - (double)row[targets[n]];
  }
  *loss = N > 0 ? total / (double)N : 0.0;
  return WEFT_OK;
}

weft_status weft_cross_entropy_backward(float *dlogits, const float *logits, const float *lse,
                                        const int32_t *targets, int64_t N, int64_t V,
                                        float scale) {
  CHECK_SIZES(N, V);
  CHECK_PTR(dlogits, N * V);
  CHECK_PTR(logits, N * V);
  CHECK_PTR(lse, N);
  CHECK_PTR(targets, N);
  WEFT_CHECK(check_targets(weft_op_name_(__func__), targets, N, V));
  return weft_cross_entropy_backward_local(dlogits, logits, lse, targets, N, 0, V, scale);
}

weft_status weft_cross_entropy_local_max(float *row_max, const float *logits_local, int64_t N,
                                         int64_t nv) {
  CHECK_SIZES(N, nv);
  CHECK_PTR(row_max, N);
  CHECK_PTR(logits_local, N * nv);
  for (int64_t n = 0; n < N; n++)
    row_max[n] = nv > 0 ? row_max_of(logits_local + n * nv, nv) : -INFINITY;
  return WEFT_OK;
}

weft_status weft_cross_entropy_local_target(float *target_logit, const float *logits_local,
                                            const int32_t *targets, int64_t N, int64_t v0,
                                            int64_t nv) {
  CHECK_SIZES(N, v0, nv);
  CHECK_PTR(target_logit, N);
  CHECK_PTR(logits_local, N * nv);
  CHECK_PTR(targets, N);
  WEFT_CHECK(check_targets(weft_op_name_(__func__), targets, N, -1));
  for (int64_t n = 0; n < N; n++) {
    int64_t j = (int64_t)targets[n] - v0;
    target_logit[n] = (j >= 0 && j < nv) ? logits_local[n * nv + j] : 0.0f;
  }
  return WEFT_OK;
}

weft_status weft_cross_entropy_local_sumexp(float *sumexp, const float *logits_local,
                                            const float *gmax, int64_t N, int64_t nv) {
  CHECK_SIZES(N, nv);
  CHECK_PTR(sumexp, N);
  CHECK_PTR(logits_local, N * nv);
  CHECK_PTR(gmax, N);
  for (int64_t n = 0; n < N; n++)
    sumexp[n] = (float)row_exp_sum(NULL, logits_local + n * nv, nv, gmax[n], 1.0f);
  return WEFT_OK;
}

weft_status weft_cross_entropy_finish(double *loss, float *lse, const float *gmax,
                                      const float *gsum, const float *gtarget, int64_t N) {
  CHECK_SIZES(N);
  CHECK_PTR(loss, 1);
  CHECK_PTR(gmax, N);
  CHECK_PTR(gsum, N);
  CHECK_PTR(gtarget, N);
  for (int64_t n = 0; n < N; n++)
    if (!(gsum[n] > 0.0f))
      return weft_error(WEFT_ERR_INVALID, "sum of exponentials of row %lld is %g (must be > 0)",
                        (long long)n, (double)gsum[n]);
  double total = 0.0;
  for (int64_t n = 0; n < N; n++) {
    double l = (double)gmax[n] + log((double)gsum[n]);
    if (lse) lse[n] = (float)l;
    total += l - (double)gtarget[n];
  }
  *loss = N > 0 ? total / (double)N : 0.0;
  return WEFT_OK;
}

weft_status weft_cross_entropy_backward_local(float *dlogits_local, const float *logits_local,
                                              const float *lse, const int32_t *targets,
                                              int64_t N, int64_t v0, int64_t nv, float scale) {
  CHECK_SIZES(N, v0, nv);
  CHECK_PTR(dlogits_local, N * nv);
  CHECK_PTR(logits_local, N * nv);
  CHECK_PTR(lse, N);
  CHECK_PTR(targets, N);
  WEFT_CHECK(check_targets(weft_op_name_(__func__), targets, N, -1));
  for (int64_t n = 0; n < N; n++) {
    const float *row = logits_local + n * nv;
    float *drow = dlogits_local + n * nv;
    row_exp(drow, row, nv, lse[n], scale); /* drow = exp(row - lse) * scale */
    int64_t t = (int64_t)targets[n] - v0;
    if (t >= 0 && t < nv) drow[t] -= scale;
  }
  return WEFT_OK;
}

/* ------------------------------------------------------------ optimizers */

weft_status weft_adamw_step(float *param, const float *grad, float *m, float *v, float *vmax,
                            int64_t n, int64_t step, const weft_adamw_params *hp) {
  CHECK_SIZES(n);
  if (!hp) return weft_error_at(WEFT_ERR_INVALID, "adamw_step", "hyper-parameters are NULL");
  CHECK_PTR(param, n);
  CHECK_PTR(grad, n);
  CHECK_PTR(m, n);
  CHECK_PTR(v, n);
  if (hp->amsgrad) CHECK_PTR(vmax, n);
  WEFT_CHECK_ADAMW_HP_("adamw_step", hp, step); /* torch's argument checks (AdamW.__init__) */
  /* Scalars as torch computes them (Python floats, i.e. double). */
  const double bc1 = 1.0 - pow((double)hp->beta1, (double)step);
  const double bc2 = 1.0 - pow((double)hp->beta2, (double)step);
  const float step_size = (float)((double)hp->lr / bc1);
  const float bc2_sqrt = (float)sqrt(bc2);
  const float decay = (float)(1.0 - (double)hp->lr * (double)hp->weight_decay);
  const float one_m_b1 = 1.0f - hp->beta1, one_m_b2 = 1.0f - hp->beta2;
  const float sign = hp->maximize ? -1.0f : 1.0f;
  int64_t i = 0;
  if (!hp->amsgrad) {
    /* the loop below on 4 lanes, the same operations in the same order */
    const vf4 vsign = vset(sign), vdecay = vset(decay), vb1 = vset(one_m_b1), vb2 = vset(hp->beta2),
              v1b2 = vset(one_m_b2), vbc2 = vset(bc2_sqrt), veps = vset(hp->eps),
              vstep = vset(step_size);
    for (; i + VL <= n; i += VL) {
      const vf4 g = vsign * vload(grad + i);
      vf4 p = vload(param + i) * vdecay;
      vf4 mi = vload(m + i), vi = vload(v + i);
      mi = mi + vb1 * (g - mi);
      vi = vi * vb2 + v1b2 * g * g;
      vstore(m + i, mi);
      vstore(v + i, vi);
      const vf4 denom = vsqrt(vi) / vbc2 + veps;
      vstore(param + i, p - vstep * (mi / denom));
    }
  }
  for (; i < n; i++) {
    const float g = sign * grad[i];
    float p = param[i] * decay;
    const float mi = m[i] + one_m_b1 * (g - m[i]); /* exp_avg.lerp_(grad, 1 - beta1) */
    const float vi = v[i] * hp->beta2 + one_m_b2 * g * g;
    m[i] = mi;
    v[i] = vi;
    float vv = vi;
    if (hp->amsgrad) {
      vv = vmax[i] > vi ? vmax[i] : vi;
      vmax[i] = vv;
    }
    const float denom = sqrtf(vv) / bc2_sqrt + hp->eps;
    param[i] = p - step_size * (mi / denom);
  }
  return WEFT_OK;
}

weft_status weft_sgd_step(float *param, const float *grad, float *buf, int64_t n, int64_t step,
                          const weft_sgd_params *hp) {
  CHECK_SIZES(n);
  if (!hp) return weft_error_at(WEFT_ERR_INVALID, "sgd_step", "hyper-parameters are NULL");
  CHECK_PTR(param, n);
  CHECK_PTR(grad, n);
  if (hp->momentum != 0.0f) CHECK_PTR(buf, n);
  WEFT_CHECK_SGD_HP_("sgd_step", hp, step); /* torch's argument checks (SGD.__init__) */
  const float sign = hp->maximize ? -1.0f : 1.0f;
  const float mom = hp->momentum, damp = 1.0f - hp->dampening, wd = hp->weight_decay;
  for (int64_t i = 0; i < n; i++) {
    float d = sign * grad[i];
    if (wd != 0.0f) d += wd * param[i];
    if (mom != 0.0f) {
      float bi = step == 1 ? d : mom * buf[i] + damp * d;
      buf[i] = bi;
      d = hp->nesterov ? d + mom * bi : bi;
    }
    param[i] -= hp->lr * d;
  }
  return WEFT_OK;
}

double weft_sumsq(const float *x, int64_t n) {
  if (!x) return 0.0;
  vd2 lo = {0}, hi = {0};
  int64_t i = 0;
  for (; i + VL <= n; i += VL) {
    vf4 v = vload(x + i);
    vd2 a = vlo_d(v), b = vhi_d(v);
    lo += a * a;
    hi += b * b;
  }
  double s = hsum_d(lo, hi);
  for (; i < n; i++) s += (double)x[i] * x[i];
  return s;
}

double weft_clip_coef(double total_norm, double max_norm) {
  double c = max_norm / (total_norm + 1e-6);
  return c < 1.0 ? c : 1.0;
}

void weft_scale_f32(float *x, int64_t n, float alpha) {
  if (!x) return;
  const vf4 a = vset(alpha);
  int64_t i = 0;
  for (; i + VL <= n; i += VL) vstore(x + i, vload(x + i) * a);
  for (; i < n; i++) x[i] *= alpha;
}
