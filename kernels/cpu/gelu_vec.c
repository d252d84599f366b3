/* kernels/cpu/gelu_vec.c — GELU (tanh approximation) over spans, forward
 * and backward: an AVX2 + FMA path chosen at run time, and the scalar libm
 * path for other processors (gelu_vec.h has the contracts).
 *
 * Why not tanhf in float. With u = K (x + C x^3), K = sqrt(2/pi),
 * C = 0.044715,
 *   gelu(x) = 0.5 x (1 + tanh u) = x s,   s = 1 / (1 + exp(-2u)),
 * and 1 + tanhf(u) cancels for negative x: tanhf(u) is within a few ulps
 * of -1 while the true 1 + tanh(u) is tiny, so the float formula loses
 * digits (~200 ulps at x = -3) and then all of them (it is 0 from
 * x ~ -5.4 on, where the true value is still ~ -1.5e-8). The sigmoid form
 * has no cancellation. The
 * function is also ill-conditioned in its argument there: the result is
 * about x exp(2u), so an absolute error d in 2u is a relative error d in
 * the result, and |2u| reaches ~105 before the result underflows
 * completely; 2u rounded to float (error up to 105 * 2^-24 ~ 6e-6) would
 * alone cost ~50 ulps. So the vector path works in double: the 8 floats
 * of a vector are widened to two 4-lane double vectors, everything below
 * is evaluated there (errors ~1e-9 relative, from the exp polynomial), and
 * the result is rounded once to float: within ~0.5 ulp of the exact value
 * everywhere, denormal results included (cvtpd2ps rounds into the
 * denormal range correctly). Double lanes halve the vector width; a float
 * evaluation would be faster but could not reach that accuracy in the
 * tail.
 *
 * Constants. K and C are the exact sqrt(2/pi) and 0.044715 in double (the
 * definition in layers.h, and what the double references of the tests
 * use), not the float-rounded GELU_K / GELU_C of the scalar path; the
 * function with those, evaluated exactly, differs from this one by up to
 * ~3.5 ulps (x ~ -5.6; the two roundings partly cancel in u).
 *
 * Forward, with z = 2u = x (2K + 2KC x^2) and E = exp(-|z|) in (0, 1]
 * (never overflows), D = 1 + E:
 *   x >= 0 (z >= 0):  s = 1 / D,  gelu = x / D;
 *   x <  0 (z <  0):  s = E / D,  gelu = x E / D.
 * Backward: 1 - t^2 = 4 s (1 - s) = 4 E / D^2 for either sign, so
 *   gelu'(x) = s + 0.5 x (4 E / D^2) K (1 + 3C x^2)
 *            = (a + x z' E / D) / D,   a = 1 (x >= 0) or E (x < 0),
 * with z' = dz/dx = 2K (1 + 3C x^2). The sign test is the sign bit of x
 * (blendv), so -0 takes the second branch; both give the same there.
 *
 * exp(a) for a in [-700, 0]: k = round(a / ln 2), r = a - k ln2 in
 * [-ln2/2, ln2/2] (one fused multiply-add; the part of ln 2 below double
 * precision moves r by at most 1010 * 2.3e-17 ~ 2e-14, far below what a
 * float result sees, so Cody-Waite's second, low-order constant is not
 * needed), exp(r) = 1 + r q(r) with q of degree 5, then times 2^k by
 * adding k to the exponent field. q is the minimax polynomial for the
 * relative error of exp on [-ln2/2, ln2/2] with exp(0) = 1 kept exact,
 * i.e. min max |r| e^-r |q(r) - (e^r - 1)/r|, computed for this file by a
 * Remez exchange in 60-digit decimal arithmetic (7 equioscillation points
 * of the weighted error): max relative error 1.97e-9 (2^-28.9), ~1/30 of
 * a float ulp. |z| is clamped to 700 first, so k >= -1010 and E stays a
 * normal double (the exponent-field addition cannot underflow); where the
 * clamp acts (|x| > 21) the true E is below 1e-304 and every result is
 * already x, 1 or a float -0 (x E and x z' E are < 1e-189 there; x z' is
 * at most ~1e115 for a finite float x, so no overflow, no inf * 0).
 *
 * Specials: x = +-inf makes z and x z' infinite, so those lanes are
 * replaced at the end (gelu: +inf stays +inf by itself, -inf -> -0;
 * gelu': +inf -> 1, -inf -> 0); NaN propagates through x by itself.
 *
 * Bitwise position independence: every lane goes through the same
 * instructions; the last partial vector is loaded and stored with masks
 * and goes through the same loop body (one copy of the code), so an
 * element's result does not depend on where a span starts or ends. */
#include "gelu_vec.h"

#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(WEFT_NO_AVX2_PATH)
#define GELU_HAVE_AVX2 1
#include <immintrin.h>
#endif

/* ------------------------------------------------------------ scalar path
 * Exactly norm_act.c's act_value / act_grad for WEFT_ACT_GELU_TANH. */

#define GELU_K 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_C 0.044715f

static inline float gelu_scalar(float x) {
  return 0.5f * x * (1.0f + tanhf(GELU_K * (x + GELU_C * x * x * x)));
}

static inline float gelu_grad_scalar(float x) {
  const float t = tanhf(GELU_K * (x + GELU_C * x * x * x)), sech2 = 1.0f - t * t;
  /* sech2 is 0 for |x| > ~9: the second term is 0 (x^2 may be inf) */
  const float d2 =
      sech2 == 0.0f ? 0.0f : 0.5f * x * sech2 * GELU_K * (1.0f + 3.0f * GELU_C * x * x);
  return 0.5f * (1.0f + t) + d2;
}

void weft_gelu_tanh_forward_scalar_(float *out, const float *inp, int64_t n) {
  for (int64_t i = 0; i < n; i++) out[i] = gelu_scalar(inp[i]);
}

void weft_gelu_tanh_backward_scalar_(float *dinp, const float *dout, const float *inp, int64_t n,
                                     bool accumulate) {
  for (int64_t i = 0; i < n; i++) {
    const float d = dout[i] * gelu_grad_scalar(inp[i]);
    dinp[i] = accumulate ? dinp[i] + d : d;
  }
}

/* ------------------------------------------------------ AVX2 + FMA path */

#ifdef GELU_HAVE_AVX2
#define AVX2_FN __attribute__((target("avx2,fma")))

#define GELU_K_D 0.79788456080286535588 /* sqrt(2 / pi) */
#define GELU_C_D 0.044715
#define TWO_K (2.0 * GELU_K_D)
#define TWO_KC (2.0 * GELU_K_D * GELU_C_D)
#define SIX_KC (6.0 * GELU_K_D * GELU_C_D)
#define MAX_ABS_Z 700.0 /* exp(-700) ~ 1e-304: still a normal double */

/* exp(a) for a in [-MAX_ABS_Z, 0] (see the top of the file). */
AVX2_FN static inline __m256d exp_nonpos(__m256d a) {
  /* a log2(e) + 1.5 * 2^52 rounds a log2(e) to the integer k in the low
   * mantissa bits; subtracting the constant back gives k as a double. */
  const __m256d magic = _mm256_set1_pd(0x1.8p52);
  const __m256d t = _mm256_fmadd_pd(a, _mm256_set1_pd(1.4426950408889634), magic);
  const __m256d k = _mm256_sub_pd(t, magic);
  const __m256d r = _mm256_fnmadd_pd(k, _mm256_set1_pd(0.69314718055994531), a);
  __m256d q = _mm256_set1_pd(0.0013843653514845863);
  q = _mm256_fmadd_pd(q, r, _mm256_set1_pd(0.0083741553060077221));
  q = _mm256_fmadd_pd(q, r, _mm256_set1_pd(0.04166800203542026));
  q = _mm256_fmadd_pd(q, r, _mm256_set1_pd(0.16666431262705456));
  q = _mm256_fmadd_pd(q, r, _mm256_set1_pd(0.49999994209048731));
  q = _mm256_fmadd_pd(q, r, _mm256_set1_pd(1.0000000321650249));
  const __m256d p = _mm256_fmadd_pd(q, r, _mm256_set1_pd(1.0)); /* in [0.70, 1.42] */
  /* p 2^k: k (-1010 <= k <= 0) added to the exponent field; the bits of t
   * minus those of magic are k as a 64-bit integer (same binade). */
  const __m256i ki = _mm256_sub_epi64(_mm256_castpd_si256(t), _mm256_castpd_si256(magic));
  return _mm256_castsi256_pd(_mm256_add_epi64(_mm256_castpd_si256(p), _mm256_slli_epi64(ki, 52)));
}

/* E = exp(-|z|), z = 2u = x (2K + 2KC x^2); x2 = x^2. */
AVX2_FN static inline __m256d exp_neg_abs_z(__m256d x, __m256d x2) {
  const __m256d z =
      _mm256_mul_pd(x, _mm256_fmadd_pd(x2, _mm256_set1_pd(TWO_KC), _mm256_set1_pd(TWO_K)));
  /* -|z| (sign bit set), clamped; a NaN z gives -MAX_ABS_Z (maxpd returns
   * its second operand then): the NaN comes back through x. */
  const __m256d a =
      _mm256_max_pd(_mm256_or_pd(z, _mm256_set1_pd(-0.0)), _mm256_set1_pd(-MAX_ABS_Z));
  return exp_nonpos(a);
}

/* gelu(x) on 4 doubles. */
AVX2_FN static inline __m256d gelu_pd(__m256d x) {
  const __m256d e = exp_neg_abs_z(x, _mm256_mul_pd(x, x));
  const __m256d num = _mm256_blendv_pd(x, _mm256_mul_pd(x, e), x); /* x<0: x E */
  const __m256d y = _mm256_div_pd(num, _mm256_add_pd(_mm256_set1_pd(1.0), e));
  const __m256d ninf = _mm256_cmp_pd(x, _mm256_set1_pd(-INFINITY), _CMP_EQ_OQ);
  return _mm256_blendv_pd(y, _mm256_set1_pd(-0.0), ninf);
}

/* gelu'(x) on 4 doubles. */
AVX2_FN static inline __m256d gelu_grad_pd(__m256d x) {
  const __m256d one = _mm256_set1_pd(1.0);
  const __m256d x2 = _mm256_mul_pd(x, x);
  const __m256d e = exp_neg_abs_z(x, x2);
  const __m256d inv = _mm256_div_pd(one, _mm256_add_pd(one, e)); /* 1 / D */
  const __m256d zp = _mm256_fmadd_pd(x2, _mm256_set1_pd(SIX_KC), _mm256_set1_pd(TWO_K));
  const __m256d w = _mm256_mul_pd(_mm256_mul_pd(x, zp), e); /* x z' E */
  const __m256d a = _mm256_blendv_pd(one, e, x);            /* s D */
  __m256d g = _mm256_mul_pd(inv, _mm256_fmadd_pd(w, inv, a));
  g = _mm256_blendv_pd(g, one, _mm256_cmp_pd(x, _mm256_set1_pd(INFINITY), _CMP_EQ_OQ));
  return _mm256_blendv_pd(g, _mm256_setzero_pd(),
                          _mm256_cmp_pd(x, _mm256_set1_pd(-INFINITY), _CMP_EQ_OQ));
}

AVX2_FN static inline __m256d lo_pd(__m256 v) { return _mm256_cvtps_pd(_mm256_castps256_ps128(v)); }
AVX2_FN static inline __m256d hi_pd(__m256 v) {
  return _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
}
/* Rounds two 4-double vectors to one 8-float vector (lo in lanes 0-3). */
AVX2_FN static inline __m256 to_ps(__m256d lo, __m256d hi) {
  return _mm256_insertf128_ps(_mm256_castps128_ps256(_mm256_cvtpd_ps(lo)), _mm256_cvtpd_ps(hi), 1);
}

/* Lanes i < m of a mask (m < 8), for maskload / maskstore. */
AVX2_FN static inline __m256i tail_mask(int64_t m) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)m), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
/* p[0..8), or only the lanes of mask (the rest 0) when part. */
AVX2_FN static inline __m256 load8(const float *p, bool part, __m256i mask) {
  return part ? _mm256_maskload_ps(p, mask) : _mm256_loadu_ps(p);
}
AVX2_FN static inline void store8(float *p, __m256 v, bool part, __m256i mask) {
  if (part) {
    _mm256_maskstore_ps(p, mask, v);
  } else {
    _mm256_storeu_ps(p, v);
  }
}

/* One loop body for whole and partial vectors (see the top of the file). */
AVX2_FN static void forward_avx2(float *out, const float *inp, int64_t n) {
  for (int64_t i = 0; i < n; i += 8) {
    const bool part = n - i < 8;
    const __m256i mask = part ? tail_mask(n - i) : _mm256_set1_epi32(-1);
    const __m256 x = load8(inp + i, part, mask);
    store8(out + i, to_ps(gelu_pd(lo_pd(x)), gelu_pd(hi_pd(x))), part, mask);
  }
}

AVX2_FN static void backward_avx2(float *dinp, const float *dout, const float *inp, int64_t n,
                                  bool accumulate) {
  for (int64_t i = 0; i < n; i += 8) {
    const bool part = n - i < 8;
    const __m256i mask = part ? tail_mask(n - i) : _mm256_set1_epi32(-1);
    const __m256 x = load8(inp + i, part, mask), dy = load8(dout + i, part, mask);
    /* dout gelu'(x) (+ dinp) in double, rounded once */
    __m256d lo = _mm256_mul_pd(lo_pd(dy), gelu_grad_pd(lo_pd(x)));
    __m256d hi = _mm256_mul_pd(hi_pd(dy), gelu_grad_pd(hi_pd(x)));
    if (accumulate) {
      const __m256 acc = load8(dinp + i, part, mask);
      lo = _mm256_add_pd(lo, lo_pd(acc));
      hi = _mm256_add_pd(hi, hi_pd(acc));
    }
    store8(dinp + i, to_ps(lo, hi), part, mask);
  }
}
#endif /* GELU_HAVE_AVX2 */

/* --------------------------------------------------------------- dispatch */

bool weft_gelu_vec_available_(void) {
#ifdef GELU_HAVE_AVX2
  /* 0: not yet known, 1: no, 2: yes. Racing first calls store the same. */
  static atomic_int state;
  int s = atomic_load_explicit(&state, memory_order_relaxed);
  if (s == 0) {
    __builtin_cpu_init(); /* in case this runs before libgcc's constructor */
    s = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? 2 : 1;
    atomic_store_explicit(&state, s, memory_order_relaxed);
  }
  return s == 2;
#else
  return false;
#endif
}

void weft_gelu_tanh_forward_span_(float *out, const float *inp, int64_t n) {
  if (n <= 0) return;
#ifdef GELU_HAVE_AVX2
  if (weft_gelu_vec_available_()) {
    forward_avx2(out, inp, n);
    return;
  }
#endif
  weft_gelu_tanh_forward_scalar_(out, inp, n);
}

void weft_gelu_tanh_backward_span_(float *dinp, const float *dout, const float *inp, int64_t n,
                                   bool accumulate) {
  if (n <= 0) return;
#ifdef GELU_HAVE_AVX2
  if (weft_gelu_vec_available_()) {
    backward_avx2(dinp, dout, inp, n, accumulate);
    return;
  }
#endif
  weft_gelu_tanh_backward_scalar_(dinp, dout, inp, n, accumulate);
}
