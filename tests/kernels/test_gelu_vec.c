/* GELU (tanh approximation) span kernels of kernels/cpu/gelu_vec.c: the
 * AVX2 + FMA path against a double-precision reference over the whole
 * float range, its independence of chunking, special values and
 * accumulate. (Its speed: vector ~2.2 ns/element forward and ~3 backward,
 * against ~39 and ~45 for the scalar libm path, 2^20 elements on the AMD
 * EPYC build machine, measured once while the kernel was written; the step
 * benchmark, bench/step.sh, shows what it does to a training step.)
 *
 * Reference: the formulas of layers.h in double with the exact constants
 * sqrt(2/pi) and 0.044715,
 *   gelu(x)  = 0.5 x (1 + t),
 *   gelu'(x) = T1 + T2,  T1 = 0.5 (1 + t),  T2 = 0.5 x (1 - t^2) K (1 + 3C x^2),
 * t = tanh(u), u = K (x + C x^3), with tanh() from <math.h> for x >= -3.
 * Below that 1 + t loses digits even in double (all of them from
 * x ~ -7.2 on, where tanh(u) rounds to -1), so there the same quantities
 * come from the equal forms 1 + t = 2 e / (1 + e) and
 * 1 - t^2 = 4 e / (1 + e)^2, e = exp(2u) (no cancellation); the test
 * ref_forms_agree checks the two forms against each other where both are
 * accurate. The reference is rounded to float only by the comparison.
 *
 * Metrics:
 * - forward: |got - ref| in ulps of ref (the float ulp at |ref|'s binade,
 *   2^-149 in the denormal range); <= 2 for every finite input.
 * - backward: gelu' has a zero near x = -0.75 where a relative error
 *   means nothing (the two terms cancel), so the error is measured in
 *   ulps of scale = max(|ref|, |T1|, |T2|): an absolute error bound scaled
 *   to the larger of the terms, i.e. what an evaluation that rounds each
 *   term once can reach; <= 2 for every finite input (dout = 1).
 *
 * Measured (AMD EPYC Zen 3, gcc 12, ~2.2M inputs): the vector path is at
 * most 0.53 ulps off forward and 0.53 backward. The scalar libm path
 * (float tanhf, float constants) is off by up to 196 ulps forward for
 * x >= -3 and by up to ~1.7e7 ulps (2^24: a relative error of 1) in the
 * negative tail, forward and backward: 1 + tanhf(u) cancels, then is 0
 * from x ~ -5.4 on while the true value is still a normal float. The
 * accuracy tests print these (cr_log_info; run with --verbose). */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/gelu_vec.h"
#include "harness.h"

#define REQUIRE_VEC()                                                                   \
  do {                                                                                  \
    if (!weft_gelu_vec_available_())                                                    \
      cr_skip_test(                                                                     \
          "no AVX2 + FMA on this processor (or a -DWEFT_NO_AVX2_PATH build): the span " \
          "functions take the scalar libm path");                                       \
  } while (0)

/* ------------------------------------------------------------ reference */

#define K_D 0.79788456080286535588 /* sqrt(2 / pi) */
#define C_D 0.044715
#define TANH_FORM_MIN (-3.0) /* tanh() form for x >= this, exp() form below */

/* 0.5 (1 + t) and 0.25 (1 - t^2) (= s and s (1 - s)) at x, finite, with
 * constants k (for K) and c (for C). */
static void ref_s_kc(double x, bool tanh_form, double k, double c, double *s, double *s1s) {
  const double u = k * (x + c * x * x * x);
  if (tanh_form) {
    const double t = tanh(u);
    *s = 0.5 * (1.0 + t);
    *s1s = 0.25 * (1.0 - t * t);
  } else {
    const double e = exp(2.0 * u); /* 0 when u < -373: the terms underflow */
    *s = e / (1.0 + e);
    *s1s = e / ((1.0 + e) * (1.0 + e));
  }
}

static void ref_s(double x, bool tanh_form, double *s, double *s1s) {
  ref_s_kc(x, tanh_form, K_D, C_D, s, s1s);
}

static double ref_forward(double x) {
  double s, s1s;
  ref_s(x, x >= TANH_FORM_MIN, &s, &s1s);
  return x * s;
}

/* gelu'(x) and the larger of |T1|, |T2| (scale). */
static double ref_grad(double x, double *scale) {
  double s, s1s;
  ref_s(x, x >= TANH_FORM_MIN, &s, &s1s);
  const double t1 = s, t2 = 2.0 * x * s1s * K_D * (1.0 + 3.0 * C_D * x * x), g = t1 + t2;
  *scale = fmax(fabs(g), fmax(fabs(t1), fabs(t2)));
  return g;
}

/* The float ulp at |v|'s binade (2^-149 below FLT_MIN). */
static double ulp_at(double v) {
  v = fabs(v);
  if (v < FLT_MIN) return ldexp(1.0, -149);
  int e;
  frexp(v, &e); /* v in [2^(e-1), 2^e) */
  return ldexp(1.0, e - 24);
}

/* |got - ref| in ulps of scale; a NaN got (ref finite) counts as infinite. */
static double ulps(float got, double ref, double scale) {
  if (isnan(got)) return INFINITY;
  if (isinf(got) || isinf(ref)) return (double)got == ref ? 0.0 : INFINITY;
  return fabs((double)got - ref) / ulp_at(scale);
}

/* ---------------------------------------------------------------- inputs */

static float from_bits(uint32_t b) {
  float f;
  memcpy(&f, &b, sizeof f);
  return f;
}
static uint32_t to_bits(float f) {
  uint32_t b;
  memcpy(&b, &f, sizeof b);
  return b;
}

/* Every 4093rd bit pattern (~1.05M, all signs and exponents; NaNs
 * included), 2^20 points evenly over [-10, 10], 2^17 over [-11.5, -9.5]
 * (results going denormal, then 0) and the edge values. *n gets the count. */
static float *accuracy_inputs(int64_t *n) {
  const int64_t n_bits = (int64_t)((UINT64_C(1) << 32) / 4093) + 1, n_dense = 1 << 20,
                n_tail = 1 << 17;
  const float edges[] = {0.0f,
                         -0.0f,
                         INFINITY,
                         -INFINITY,
                         NAN,
                         FLT_MAX,
                         -FLT_MAX,
                         FLT_MIN,
                         -FLT_MIN,
                         0x1p-149f,
                         -0x1p-149f,
                         0x1.fffffcp-127f,
                         -0x1.fffffcp-127f,
                         1.0f,
                         -1.0f};
  const int64_t n_edges = (int64_t)(sizeof edges / sizeof edges[0]);
  float *x = malloc((size_t)(n_bits + n_dense + n_tail + n_edges) * sizeof *x);
  int64_t k = 0;
  for (uint64_t b = 0; b < (UINT64_C(1) << 32); b += 4093) x[k++] = from_bits((uint32_t)b);
  for (int64_t i = 0; i < n_dense; i++) x[k++] = (float)(-10.0 + 20.0 * (double)i / n_dense);
  for (int64_t i = 0; i < n_tail; i++) x[k++] = (float)(-11.5 + 2.0 * (double)i / n_tail);
  for (int64_t i = 0; i < n_edges; i++) x[k++] = edges[i];
  *n = k;
  return x;
}

/* n random inputs: mostly [-12, 12], some random bit patterns and edges. */
static float *random_inputs(int64_t n, uint64_t *r) {
  float *x = malloc((size_t)n * sizeof *x);
  const float edges[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, FLT_MAX, -FLT_MAX, 0x1p-149f};
  for (int64_t i = 0; i < n; i++) {
    const int64_t kind = weft_test_rng_int(r, 0, 9);
    if (kind < 7) {
      x[i] = (float)(12.0 * weft_test_rng_sym(r));
    } else if (kind < 9) {
      x[i] = from_bits((uint32_t)weft_test_rng_u64(r));
    } else {
      x[i] = edges[weft_test_rng_int(r, 0, (int64_t)(sizeof edges / sizeof edges[0]) - 1)];
    }
  }
  return x;
}

/* --------------------------------------------------------------- accuracy */

/* Worst error of a forward result array against the reference, over
 * finite inputs (and where: x, got, ref), restricted to x in [lo, hi]. */
typedef struct worst {
  double ulps;
  float x, got;
  double ref;
} worst;

static worst forward_worst(const float *x, const float *y, int64_t n, double lo, double hi) {
  worst w = {0};
  for (int64_t i = 0; i < n; i++) {
    if (!isfinite(x[i]) || x[i] < lo || x[i] > hi) continue;
    const double ref = ref_forward(x[i]), e = ulps(y[i], ref, ref);
    if (e > w.ulps) w = (worst){e, x[i], y[i], ref};
  }
  return w;
}

static worst backward_worst(const float *x, const float *g, int64_t n, double lo, double hi) {
  worst w = {0};
  for (int64_t i = 0; i < n; i++) {
    if (!isfinite(x[i]) || x[i] < lo || x[i] > hi) continue;
    double scale;
    const double ref = ref_grad(x[i], &scale), e = ulps(g[i], ref, scale);
    if (e > w.ulps) w = (worst){e, x[i], g[i], ref};
  }
  return w;
}

#define LOG_WORST(what, w)                                                                \
  cr_log_info("%s: max error %.3g ulps at x = %.9g (%a): got %.9g, reference %.9g", what, \
              (w).ulps, (double)(w).x, (double)(w).x, (double)(w).got, (w).ref)

Test(gelu_vec, ref_forms_agree) {
  /* The tanh() and exp() forms of the reference, where both are accurate
   * (1 + t >= ~1e-5 for x >= -4), agree far below a float ulp. */
  double worst_s = 0, worst_s1s = 0;
  for (int i = 0; i <= 100000; i++) {
    const double x = -4.0 + 14.0 * i / 100000;
    double s_t, s1s_t, s_e, s1s_e;
    ref_s(x, true, &s_t, &s1s_t);
    ref_s(x, false, &s_e, &s1s_e);
    worst_s = fmax(worst_s, fabs(s_t - s_e) / s_e);
    if (x <= 4.0) worst_s1s = fmax(worst_s1s, fabs(s1s_t - s1s_e) / s1s_e);
  }
  cr_expect(worst_s < 1e-11 && worst_s1s < 1e-11,
            "reference forms differ: s by %.3g, s (1 - s) by %.3g relative", worst_s, worst_s1s);
}

Test(gelu_vec, forward_accuracy, .timeout = 120) {
  REQUIRE_VEC();
  int64_t n;
  float *x = accuracy_inputs(&n), *y = malloc((size_t)n * sizeof *y);
  weft_gelu_tanh_forward_span_(y, x, n);
  const worst w = forward_worst(x, y, n, -INFINITY, INFINITY);
  LOG_WORST("gelu forward, vector path", w);
  cr_expect(w.ulps <= 2.0,
            "forward: %.3g ulps at x = %.9g (%a): got %.9g (%a), reference %.17g (%lld inputs)",
            w.ulps, (double)w.x, (double)w.x, (double)w.got, (double)w.got, w.ref, (long long)n);

  /* for comparison: the scalar libm path, overall and in the negative
   * tail, and within [-3, inf) where 1 + tanhf(u) does not cancel badly */
  weft_gelu_tanh_forward_scalar_(y, x, n);
  const worst ws = forward_worst(x, y, n, -INFINITY, INFINITY);
  const worst wt = forward_worst(x, y, n, -INFINITY, -3.0);
  const worst wh = forward_worst(x, y, n, -3.0, INFINITY);
  LOG_WORST("gelu forward, scalar libm path (all)", ws);
  LOG_WORST("gelu forward, scalar libm path (x < -3)", wt);
  LOG_WORST("gelu forward, scalar libm path (x >= -3)", wh);

  /* how far the float-rounded constants of the scalar formula (GELU_K,
   * GELU_C of norm_act.c) move the exact function, in ulps */
  worst wk = {0};
  for (int64_t i = 0; i < n; i++) {
    if (!isfinite(x[i])) continue;
    double s, s1s;
    ref_s_kc(x[i], x[i] >= TANH_FORM_MIN, (double)0.7978845608028654f, (double)0.044715f, &s, &s1s);
    const double ref = ref_forward(x[i]), e = ulps((float)(x[i] * s), ref, ref);
    if (e > wk.ulps) wk = (worst){e, x[i], (float)(x[i] * s), ref};
  }
  LOG_WORST("gelu forward with float constants, exactly evaluated and rounded", wk);
  free(x);
  free(y);
}

Test(gelu_vec, backward_accuracy, .timeout = 120) {
  REQUIRE_VEC();
  int64_t n;
  float *x = accuracy_inputs(&n), *g = malloc((size_t)n * sizeof *g),
        *ones = malloc((size_t)n * sizeof *ones);
  for (int64_t i = 0; i < n; i++) ones[i] = 1.0f;
  weft_gelu_tanh_backward_span_(g, ones, x, n, false);
  const worst w = backward_worst(x, g, n, -INFINITY, INFINITY);
  LOG_WORST("gelu backward, vector path (ulps of max(|ref|, |T1|, |T2|))", w);
  cr_expect(w.ulps <= 2.0,
            "backward: %.3g ulps (of the terms' scale) at x = %.9g (%a): got %.9g (%a), "
            "reference %.17g (%lld inputs)",
            w.ulps, (double)w.x, (double)w.x, (double)w.got, (double)w.got, w.ref, (long long)n);
  for (int64_t i = 0; i < n; i++)
    if (!isnan(x[i]) && isnan(g[i])) {
      cr_expect(false, "backward: NaN at x = %a", (double)x[i]);
      break;
    }

  weft_gelu_tanh_backward_scalar_(g, ones, x, n, false);
  const worst ws = backward_worst(x, g, n, -INFINITY, INFINITY);
  const worst wt = backward_worst(x, g, n, -INFINITY, -3.0);
  LOG_WORST("gelu backward, scalar libm path (all)", ws);
  LOG_WORST("gelu backward, scalar libm path (x < -3)", wt);
  free(x);
  free(g);
  free(ones);
}

/* ------------------------------------------------------------- chunking */

/* Forward and backward (both accumulate modes) of n elements in one call
 * and in chunks of the sizes in `sizes` (cycled): the same bits. */
Test(gelu_vec, chunked_calls_give_same_bits) {
  REQUIRE_VEC();
  const int64_t n = 1000;
  uint64_t r = weft_test_rng_state(weft_test_seed(4093));
  float *x = random_inputs(n, &r), *dy = random_inputs(n, &r), *acc0 = random_inputs(n, &r);
  for (int64_t i = 0; i < n; i++) dy[i] = isfinite(dy[i]) ? fmodf(dy[i], 4.0f) : 1.0f;
  for (int64_t i = 0; i < n; i++) acc0[i] = isfinite(acc0[i]) ? fmodf(acc0[i], 4.0f) : 0.5f;
  float *y1 = malloc((size_t)n * sizeof(float)), *y2 = malloc((size_t)n * sizeof(float));
  float *g1 = malloc((size_t)n * sizeof(float)), *g2 = malloc((size_t)n * sizeof(float));
  float *a1 = malloc((size_t)n * sizeof(float)), *a2 = malloc((size_t)n * sizeof(float));
  weft_gelu_tanh_forward_span_(y1, x, n);
  weft_gelu_tanh_backward_span_(g1, dy, x, n, false);
  memcpy(a1, acc0, (size_t)n * sizeof(float));
  weft_gelu_tanh_backward_span_(a1, dy, x, n, true);

  const int64_t sizes[] = {1, 7, 8, 13, 3, 16, 9, 31, 2, 64, 5, 17, 1, 8, 100, 6, 15, 33};
  const int n_sizes = (int)(sizeof sizes / sizeof sizes[0]);
  for (int rot = 0; rot < n_sizes; rot++) { /* each rotation of the size list */
    memset(y2, 0xff, (size_t)n * sizeof(float));
    memset(g2, 0xff, (size_t)n * sizeof(float));
    memcpy(a2, acc0, (size_t)n * sizeof(float));
    for (int64_t i = 0, c = rot; i < n; c++) {
      int64_t m = sizes[c % n_sizes];
      if (m > n - i) m = n - i;
      weft_gelu_tanh_forward_span_(y2 + i, x + i, m);
      weft_gelu_tanh_backward_span_(g2 + i, dy + i, x + i, m, false);
      weft_gelu_tanh_backward_span_(a2 + i, dy + i, x + i, m, true);
      i += m;
    }
    for (int64_t i = 0; i < n; i++) {
      if (to_bits(y1[i]) != to_bits(y2[i]) || to_bits(g1[i]) != to_bits(g2[i]) ||
          to_bits(a1[i]) != to_bits(a2[i])) {
        cr_expect(false,
                  "rotation %d, element %lld (x = %a, dout = %a): one call gives %a %a %a, "
                  "chunks %a %a %a",
                  rot, (long long)i, (double)x[i], (double)dy[i], (double)y1[i], (double)g1[i],
                  (double)a1[i], (double)y2[i], (double)g2[i], (double)a2[i]);
        break;
      }
    }
  }

  /* in place (out == inp; dinp == dout) gives the same bits too */
  memcpy(y2, x, (size_t)n * sizeof(float));
  weft_gelu_tanh_forward_span_(y2, y2, n);
  memcpy(g2, dy, (size_t)n * sizeof(float));
  weft_gelu_tanh_backward_span_(g2, g2, x, n, false);
  cr_expect(memcmp(y1, y2, (size_t)n * sizeof(float)) == 0, "forward in place differs");
  cr_expect(memcmp(g1, g2, (size_t)n * sizeof(float)) == 0, "backward in place differs");
  free(x);
  free(dy);
  free(acc0);
  free(y1);
  free(y2);
  free(g1);
  free(g2);
  free(a1);
  free(a2);
}

/* -------------------------------------------------------- special values */

Test(gelu_vec, special_values) {
  REQUIRE_VEC();
  const float x[] = {INFINITY,        -INFINITY, NAN,       -NAN,       0.0f,    -0.0f,
                     FLT_MAX,         -FLT_MAX,  1e30f,     -1e30f,     1e10f,   -1e10f,
                     30.0f,           -30.0f,    0x1p-149f, -0x1p-149f, FLT_MIN, -FLT_MIN,
                     0x1.fffffcp-127f};
  enum { N = sizeof x / sizeof x[0] };
  float y[N], g[N], ones[N];
  for (int i = 0; i < N; i++) ones[i] = 1.0f;
  weft_gelu_tanh_forward_span_(y, x, N);
  weft_gelu_tanh_backward_span_(g, ones, x, N, false);

  /* forward: +inf, -0 (the limit from below; the scalar path gives NaN:
   * -inf * (1 + tanhf(-inf)) = -inf * 0), NaN */
  cr_expect(y[0] == INFINITY, "gelu(+inf) = %a", (double)y[0]);
  cr_expect(y[1] == 0.0f && signbit(y[1]), "gelu(-inf) = %a, want -0", (double)y[1]);
  cr_expect(isnan(y[2]) && isnan(y[3]), "gelu(NaN) = %a, %a", (double)y[2], (double)y[3]);
  /* gradients: 1, 0, NaN */
  cr_expect(g[0] == 1.0f, "gelu'(+inf) = %a", (double)g[0]);
  cr_expect(g[1] == 0.0f, "gelu'(-inf) = %a", (double)g[1]);
  cr_expect(isnan(g[2]) && isnan(g[3]), "gelu'(NaN) = %a, %a", (double)g[2], (double)g[3]);
  /* signed zeros: gelu(+-0) = +-0, gelu'(+-0) = 0.5 */
  cr_expect(to_bits(y[4]) == to_bits(0.0f) && to_bits(y[5]) == to_bits(-0.0f),
            "gelu(+0) = %a, gelu(-0) = %a", (double)y[4], (double)y[5]);
  cr_expect(g[4] == 0.5f && g[5] == 0.5f, "gelu'(+-0) = %a, %a", (double)g[4], (double)g[5]);
  /* large |x|: x or a zero, gradient 1 or a zero, never NaN */
  for (int i = 6; i < 14; i++) {
    const bool pos = x[i] > 0;
    cr_expect(pos ? y[i] == x[i] : y[i] == 0.0f, "gelu(%a) = %a", (double)x[i], (double)y[i]);
    cr_expect(pos ? g[i] == 1.0f : g[i] == 0.0f, "gelu'(%a) = %a", (double)x[i], (double)g[i]);
  }
  /* denormals: gelu(x) = x (1/2 + ~0.4 x) rounded, gelu'(x) = 1/2 */
  for (int i = 14; i < N; i++) {
    const double ref = ref_forward(x[i]);
    cr_expect(ulps(y[i], ref, ref) <= 0.5, "gelu(%a) = %a, reference %a", (double)x[i],
              (double)y[i], ref);
    cr_expect(g[i] == 0.5f, "gelu'(%a) = %a", (double)x[i], (double)g[i]);
  }
  /* (gelu(2^-149) = 2^-150 (1 + ~2^-149), correctly rounded 2^-149, is
   * the tie 2^-150 in double, which rounds to even: 0, 1/2 ulp off, like
   * the scalar path's 0.5f * x.) */

  /* the scalar path on the same values, for the record */
  float ys[N], gs[N];
  weft_gelu_tanh_forward_scalar_(ys, x, N);
  weft_gelu_tanh_backward_scalar_(gs, ones, x, N, false);
  cr_log_info("scalar path: gelu(+inf) = %g, gelu(-inf) = %g, gelu'(+inf) = %g, gelu'(-inf) = %g",
              (double)ys[0], (double)ys[1], (double)gs[0], (double)gs[1]);
}

/* ------------------------------------------------------------ accumulate */

Test(gelu_vec, accumulate_adds) {
  REQUIRE_VEC();
  const int64_t n = 1003;
  uint64_t r = weft_test_rng_state(weft_test_seed(77));
  float *x = malloc((size_t)n * sizeof(float)), *dy = malloc((size_t)n * sizeof(float));
  float *acc = malloc((size_t)n * sizeof(float)), *acc0 = malloc((size_t)n * sizeof(float));
  float *d = malloc((size_t)n * sizeof(float)), *z = malloc((size_t)n * sizeof(float));
  for (int64_t i = 0; i < n; i++) {
    x[i] = (float)(8.0 * weft_test_rng_sym(&r));
    dy[i] = (float)(2.0 * weft_test_rng_sym(&r));
    acc0[i] = acc[i] = (float)(3.0 * weft_test_rng_sym(&r));
    z[i] = 0.0f;
  }
  weft_gelu_tanh_backward_span_(d, dy, x, n, false);
  weft_gelu_tanh_backward_span_(acc, dy, x, n, true);
  weft_gelu_tanh_backward_span_(z, dy, x, n, true);
  for (int64_t i = 0; i < n; i++) {
    /* acc = round(acc0 + dout gelu'), d = round(dout gelu'): within an ulp
     * of the larger of the two addends of acc0 + d */
    const double want = (double)acc0[i] + d[i];
    const double tol = ulp_at(fmax(fabs((double)acc0[i]), fabs((double)d[i])));
    if (!(fabs(acc[i] - want) <= tol)) {
      cr_expect(false, "element %lld: %a + %a accumulated to %a", (long long)i, (double)acc0[i],
                (double)d[i], (double)acc[i]);
      break;
    }
    /* accumulating into zeros equals overwriting (up to the sign of 0) */
    if (!(z[i] == d[i])) {
      cr_expect(false, "element %lld: 0 + %a accumulated to %a", (long long)i, (double)d[i],
                (double)z[i]);
      break;
    }
  }
  free(x);
  free(dy);
  free(acc);
  free(acc0);
  free(d);
  free(z);
}
