/* GEMM against a naive double-precision reference: every transpose combo,
 * odd and empty sizes, padded row strides and transposed (column-major)
 * views, f32/f64/bf16/f16, alpha/beta edge cases with NaN, the raw
 * weft_sgemm, the blocked fallback across block boundaries, and bad input.
 * Error bound per element: tol * (|alpha| sum_k |a_ik b_kj| + |beta c_ij|). */
#include <stdio.h>
#include <stdlib.h>

#include "kernels_testutil.h"
#include "tensor_internal.h"

/* A (rows x cols) matrix view inside a padded base; column-major (a
 * transposed view) when colmajor. */
static weft_tensor *make_matrix(weft_dtype dt, int64_t rows, int64_t cols, bool colmajor,
                                uint64_t *r, weft_tensor *view) {
  int64_t pad = weft_test_rng_int(r, 0, 3);
  int64_t bs[2] = {colmajor ? cols : rows, (colmajor ? rows : cols) + pad};
  weft_tensor *base;
  cr_assert_eq(weft_tensor_create(dt, WEFT_CPU, 2, bs, &base), WEFT_OK);
  fill_rand(base, r);
  int64_t shape[2] = {rows, cols};
  int64_t st[2] = {colmajor ? 1 : bs[1], colmajor ? bs[1] : 1};
  char *p = (char *)base->data +
            (bs[1] > 0 ? weft_test_rng_int(r, 0, pad) : 0) * (int64_t)weft_dtype_size(dt);
  cr_assert_eq(weft_tensor_view_init(view, p, dt, WEFT_CPU, 2, shape, st), WEFT_OK, "%s",
               weft_last_error());
  return base;
}

static double at(const weft_tensor *t, int64_t i, int64_t j) {
  int64_t idx[2] = {i, j};
  return weft_tensor_get(t, idx);
}

static double tol_for(weft_dtype dt) {
  switch (dt) {
    case WEFT_F64:
      return 1e-12;
    case WEFT_F32:
      return 1e-5;
    case WEFT_F16:
      return 2e-3;
    default:
      return 1e-2; /* bf16: 8 mantissa bits on the output */
  }
}

/* Runs one GEMM case and compares with the reference; returns the max
 * normalised error. */
static double run_case(weft_dtype dt, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                       float alpha, float beta, uint64_t *r, unsigned long seed) {
  weft_tensor A, B, C;
  bool acm = weft_test_rng_int(r, 0, 2) == 0, bcm = weft_test_rng_int(r, 0, 2) == 0;
  weft_tensor *ba = make_matrix(dt, ta ? k : m, ta ? m : k, acm, r, &A);
  weft_tensor *bb = make_matrix(dt, tb ? n : k, tb ? k : n, bcm, r, &B);
  weft_tensor *bc = make_matrix(dt, m, n, false, r, &C);
  double *ref = malloc(sizeof(double) * (size_t)(m * n + 1));
  double *scale = malloc(sizeof(double) * (size_t)(m * n + 1));
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < n; j++) {
      double s = 0, sa = 0;
      for (int64_t p = 0; p < k; p++) {
        double x = ta ? at(&A, p, i) : at(&A, i, p), y = tb ? at(&B, j, p) : at(&B, p, j);
        s += x * y;
        sa += fabs(x * y);
      }
      double c0 = beta == 0.0f ? 0.0 : at(&C, i, j);
      ref[i * n + j] = (double)alpha * s + (double)beta * c0;
      scale[i * n + j] = fabs((double)alpha) * sa + fabs((double)beta * c0);
    }
  if (beta == 0.0f && m * n > 0) weft_tensor_fill(&C, NAN); /* beta = 0 must overwrite NaN */
  weft_status st = weft_gemm(ta, tb, alpha, &A, &B, beta, &C);
  cr_assert_eq(st, WEFT_OK, "%s", weft_last_error());
  double worst = 0;
  const double tol = tol_for(dt);
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < n; j++) {
      double got = at(&C, i, j), want = ref[i * n + j];
      double err = fabs(got - want) / (scale[i * n + j] + 1e-30);
      if (scale[i * n + j] == 0) err = fabs(got - want) > 0 ? INFINITY : 0;
      cr_assert(err <= tol,
                "%s ta %d tb %d m %" PRId64 " n %" PRId64 " k %" PRId64
                " alpha %g beta %g "
                "(A %s, B %s): C[%" PRId64 ",%" PRId64 "] = %.9g, want %.9g (seed %lu)",
                weft_dtype_name(dt), ta, tb, m, n, k, (double)alpha, (double)beta,
                acm ? "col-major" : "row-major", bcm ? "col-major" : "row-major", i, j, got, want,
                seed);
      if (err > worst) worst = err;
    }
  free(ref);
  free(scale);
  weft_tensor_destroy(ba);
  weft_tensor_destroy(bb);
  weft_tensor_destroy(bc);
  return worst;
}

static const int64_t sizes[] = {0, 1, 3, 17, 33, 65};
#define N_SIZES 6

Test(gemm, f32_all_transposes_all_odd_and_empty_sizes) {
  const unsigned long seed = weft_test_seed(101);
  uint64_t r = weft_test_rng_state(weft_test_seed(101));
  double worst = 0;
  for (int t = 0; t < 4; t++)
    for (int a = 0; a < N_SIZES; a++)
      for (int b = 0; b < N_SIZES; b++)
        for (int c = 0; c < N_SIZES; c++) {
          float alpha = (float)(0.5 + weft_test_rng_unit(&r)),
                beta = (c + a) % 3 == 0 ? 0.0f : (float)weft_test_rng_sym(&r);
          double w =
              run_case(WEFT_F32, t & 1, t & 2, sizes[a], sizes[b], sizes[c], alpha, beta, &r, seed);
          if (w > worst) worst = w;
        }
  cr_log_info("f32 worst normalised error %.3g", worst);
}

Test(gemm, f64_bf16_f16_random_shapes) {
  const unsigned long seed = weft_test_seed(102);
  uint64_t r = weft_test_rng_state(weft_test_seed(102));
  const weft_dtype dts[3] = {WEFT_F64, WEFT_BF16, WEFT_F16};
  for (int d = 0; d < 3; d++)
    for (int t = 0; t < 4; t++)
      for (int rep = 0; rep < 25; rep++) {
        int64_t m = sizes[weft_test_rng_int(&r, 0, N_SIZES - 1)],
                n = sizes[weft_test_rng_int(&r, 0, N_SIZES - 1)],
                k = sizes[weft_test_rng_int(&r, 0, N_SIZES - 1)];
        float alpha = (float)weft_test_rng_sym(&r),
              beta = rep % 4 == 0 ? 0.0f : (float)weft_test_rng_sym(&r);
        run_case(dts[d], t & 1, t & 2, m, n, k, alpha, beta, &r, seed);
      }
}

Test(gemm, alpha_zero_and_k_zero_leave_beta_c) {
  int64_t s23[2] = {2, 3}, s34[2] = {3, 4}, s24[2] = {2, 4}, s20[2] = {2, 0}, s04[2] = {0, 4};
  weft_tensor *a, *b, *c, *a0, *b0;
  OK(weft_tensor_create(WEFT_F32, WEFT_CPU, 2, s23, &a));
  OK(weft_tensor_create(WEFT_F32, WEFT_CPU, 2, s34, &b));
  OK(weft_tensor_create(WEFT_F32, WEFT_CPU, 2, s24, &c));
  OK(weft_tensor_create(WEFT_F32, WEFT_CPU, 2, s20, &a0));
  OK(weft_tensor_create(WEFT_F32, WEFT_CPU, 2, s04, &b0));
  weft_tensor_fill(a, NAN); /* alpha = 0: A and B are not read */
  weft_tensor_fill(b, INFINITY);
  float *pc = c->data;
  for (int i = 0; i < 8; i++) pc[i] = (float)i;
  OK(weft_gemm(false, false, 0.0f, a, b, 0.5f, c));
  for (int i = 0; i < 8; i++)
    cr_expect_eq(pc[i], 0.5f * (float)i, "alpha 0: C[%d] = %g", i, (double)pc[i]);
  OK(weft_gemm(false, false, 1.0f, a0, b0, 2.0f, c)); /* K = 0 */
  for (int i = 0; i < 8; i++) cr_expect_eq(pc[i], (float)i, "k 0: C[%d] = %g", i, (double)pc[i]);
  weft_tensor_fill(c, NAN);
  OK(weft_gemm(false, false, 1.0f, a0, b0, 0.0f, c)); /* K = 0, beta = 0: zeros */
  for (int i = 0; i < 8; i++) cr_expect_eq(pc[i], 0.0f);
  weft_tensor *list[] = {a, b, c, a0, b0};
  for (int i = 0; i < 5; i++) weft_tensor_destroy(list[i]);
}

/* Naive double reference on raw row-major arrays. */
static void ref_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha,
                     const float *a, int64_t lda, const float *b, int64_t ldb, double beta,
                     const float *c0, int64_t ldc, double *out, double *scale) {
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < n; j++) {
      double s = 0, sa = 0;
      for (int64_t p = 0; p < k; p++) {
        double x = ta ? a[p * lda + i] : a[i * lda + p], y = tb ? b[j * ldb + p] : b[p * ldb + j];
        s += x * y;
        sa += fabs(x * y);
      }
      out[i * n + j] = alpha * s + beta * c0[i * ldc + j];
      scale[i * n + j] = fabs(alpha) * sa + fabs(beta * c0[i * ldc + j]);
    }
}

static float *rand_floats(int64_t n, uint64_t *r) {
  float *p = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
  for (int64_t i = 0; i < n; i++) p[i] = (float)weft_test_rng_sym(r);
  return p;
}

/* weft_sgemm (or the blocked fallback when blocked) with padded leading dims. */
static void check_raw(bool blocked, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                      uint64_t *r) {
  int64_t lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 1, ldc = n + 2;
  float *a = rand_floats((ta ? k : m) * lda, r), *b = rand_floats((tb ? n : k) * ldb, r);
  float *c = rand_floats(m * ldc, r), *c0 = malloc(sizeof(float) * (size_t)(m * ldc + 1));
  memcpy(c0, c, sizeof(float) * (size_t)(m * ldc));
  double *ref = malloc(sizeof(double) * (size_t)(m * n + 1)),
         *sc = malloc(sizeof(double) * (size_t)(m * n + 1));
  const float alpha = 0.75f, beta = -1.25f;
  ref_gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c0, ldc, ref, sc);
  if (blocked)
    weft_sgemm_blocked_(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  else
    weft_sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  for (int64_t i = 0; i < m; i++) {
    for (int64_t j = 0; j < n; j++)
      cr_assert(fabs(c[i * ldc + j] - ref[i * n + j]) <= 1e-5 * sc[i * n + j] + 1e-30,
                "%s ta %d tb %d %" PRId64 "x%" PRId64 "x%" PRId64 ": C[%" PRId64 ",%" PRId64
                "] = %.9g, want %.9g",
                blocked ? "blocked" : "sgemm", ta, tb, m, n, k, i, j, (double)c[i * ldc + j],
                ref[i * n + j]);
    for (int64_t j = n; j < ldc; j++)
      cr_assert_eq(c[i * ldc + j], c0[i * ldc + j], "padding column %" PRId64 " was written", j);
  }
  free(a);
  free(b);
  free(c);
  free(c0);
  free(ref);
  free(sc);
}

Test(gemm, sgemm_raw_pointers_padded_leading_dims) {
  uint64_t r = weft_test_rng_state(weft_test_seed(103));
  for (int t = 0; t < 4; t++)
    for (int rep = 0; rep < 12; rep++)
      check_raw(false, t & 1, t & 2, sizes[weft_test_rng_int(&r, 0, N_SIZES - 1)],
                sizes[weft_test_rng_int(&r, 0, N_SIZES - 1)],
                sizes[weft_test_rng_int(&r, 0, N_SIZES - 1)], &r);
}

Test(gemm, blocked_fallback_across_block_boundaries) {
  uint64_t r = weft_test_rng_state(weft_test_seed(104));
  /* MC = 64, KC = 256, NC = 256: cross each boundary, with remainders */
  for (int t = 0; t < 4; t++) check_raw(true, t & 1, t & 2, 130, 260, 520, &r);
  for (int t = 0; t < 4; t++) check_raw(true, t & 1, t & 2, 1, 3, 17, &r);
  check_raw(true, false, false, 0, 5, 5, &r);
  check_raw(true, false, true, 5, 5, 0, &r);
  /* double version */
  const int64_t m = 70, n = 65, k = 300;
  double *a = malloc(sizeof(double) * (size_t)(m * k)),
         *b = malloc(sizeof(double) * (size_t)(k * n)),
         *c = malloc(sizeof(double) * (size_t)(m * n));
  for (int64_t i = 0; i < m * k; i++) a[i] = weft_test_rng_sym(&r);
  for (int64_t i = 0; i < k * n; i++) b[i] = weft_test_rng_sym(&r);
  for (int64_t i = 0; i < m * n; i++) c[i] = NAN;                        /* beta = 0 overwrites */
  weft_dgemm_blocked_(true, false, m, n, k, 2.0, a, m, b, n, 0.0, c, n); /* A stored as (k, m) */
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < n; j++) {
      double s = 0, sa = 0;
      for (int64_t p = 0; p < k; p++) {
        s += a[p * m + i] * b[p * n + j];
        sa += fabs(a[p * m + i] * b[p * n + j]);
      }
      cr_assert(fabs(c[i * n + j] - 2.0 * s) <= 1e-13 * 2.0 * sa,
                "dgemm C[%" PRId64 ",%" PRId64 "]", i, j);
    }
  free(a);
  free(b);
  free(c);
}

Test(gemm, sgemm_edge_sizes_and_bad_leading_dims) {
  float c[6] = {1, 2, 3, 4, 5, 6};
  /* M = 0 or N = 0: nothing is touched, NULL pointers are fine */
  weft_sgemm(false, false, 0, 3, 4, 1.0f, NULL, 4, NULL, 3, 0.0f, NULL, 3);
  weft_sgemm(false, false, 2, 0, 4, 1.0f, NULL, 4, NULL, 1, 0.0f, NULL, 1);
  /* K = 0: C = beta * C without reading A, B */
  weft_sgemm(false, true, 2, 3, 0, 1.0f, NULL, 1, NULL, 1, 2.0f, c, 3);
  for (int i = 0; i < 6; i++) cr_expect_eq(c[i], 2.0f * (float)(i + 1));
  weft_sgemm(true, true, 2, 3, 0, 1.0f, NULL, 2, NULL, 1, 0.0f, c, 3);
  for (int i = 0; i < 6; i++) cr_expect_eq(c[i], 0.0f);
  /* lda too small: error set, C untouched */
  float a[8] = {0}, b[12] = {0};
  for (int i = 0; i < 6; i++) c[i] = 7.0f;
  weft_clear_error();
  weft_sgemm(false, false, 2, 3, 4, 1.0f, a, 3, b, 3, 0.0f, c, 3);
  cr_expect_eq(weft_last_status(), WEFT_ERR_INVALID);
  cr_expect(strstr(weft_last_error(), "lda 3 (need >= 4)"), "%s", weft_last_error());
  for (int i = 0; i < 6; i++) cr_expect_eq(c[i], 7.0f);
  weft_clear_error();
  weft_sgemm(false, false, -1, 3, 4, 1.0f, a, 4, b, 3, 0.0f, c, 3);
  cr_expect(strstr(weft_last_error(), "m -1"), "%s", weft_last_error());
}

Test(gemm, bad_tensors_are_rejected_with_the_shapes) {
  int64_t s23[2] = {2, 3}, s45[2] = {4, 5}, s34[2] = {3, 4}, s25[2] = {2, 5}, s24[2] = {2, 4},
          s3[3] = {1, 2, 3};
  weft_tensor *a, *b, *bad, *c, *c2, *a3, *bd, *ai, *bi, *ci;
  OK(weft_tensor_create(WEFT_F32, WEFT_CPU, 2, s23, &a));
  OK(weft_tensor_create(WEFT_F32, WEFT_CPU, 2, s34, &b));
  OK(weft_tensor_create(WEFT_F32, WEFT_CPU, 2, s45, &bad));
  OK(weft_tensor_create(WEFT_F32, WEFT_CPU, 2, s24, &c));
  OK(weft_tensor_create(WEFT_F32, WEFT_CPU, 2, s25, &c2));
  OK(weft_tensor_create(WEFT_F32, WEFT_CPU, 3, s3, &a3));
  OK(weft_tensor_create(WEFT_F64, WEFT_CPU, 2, s34, &bd));
  OK(weft_tensor_create(WEFT_I32, WEFT_CPU, 2, s23, &ai));
  OK(weft_tensor_create(WEFT_I32, WEFT_CPU, 2, s34, &bi));
  OK(weft_tensor_create(WEFT_I32, WEFT_CPU, 2, s24, &ci));
  EXPECT_ERR(weft_gemm(false, false, 1, a, bad, 0, c), WEFT_ERR_INVALID,
             "inner dims differ: op(A) is 2 x 3 (A f32[2, 3]), op(B) is 4 x 5 (B f32[4, 5])");
  EXPECT_ERR(weft_gemm(false, false, 1, a, b, 0, c2), WEFT_ERR_INVALID,
             "C is f32[2, 5] but op(A) @ op(B) is 2 x 4");
  EXPECT_ERR(weft_gemm(true, false, 1, a, b, 0, c), WEFT_ERR_INVALID,
             "op(A) is 3 x 2 (A f32[2, 3], transposed)");
  EXPECT_ERR(weft_gemm(false, false, 1, a3, b, 0, c), WEFT_ERR_INVALID,
             "A must be 2-D, got f32[1, 2, 3]");
  EXPECT_ERR(weft_gemm(false, false, 1, a, bd, 0, c), WEFT_ERR_INVALID, "B f64[3, 4]");
  EXPECT_ERR(weft_gemm(false, false, 1, ai, bi, 0, ci), WEFT_ERR_UNSUPPORTED, "i32");
  EXPECT_ERR(weft_gemm(false, false, 1, NULL, b, 0, c), WEFT_ERR_INVALID, "A is NULL");
  /* every other column: not unit-stride in either dim */
  float buf[2 * 8];
  weft_tensor sk, ct;
  int64_t st[2] = {8, 2};
  OK(weft_tensor_view_init(&sk, buf, WEFT_F32, WEFT_CPU, 2, s23, st));
  EXPECT_ERR(weft_gemm(false, false, 1, &sk, b, 0, c), WEFT_ERR_INVALID, "strides [8, 2]");
  /* a transposed C is refused (A and B may be transposed views) */
  int64_t s42[2] = {4, 2}, cst[2] = {1, 4};
  (void)s42;
  OK(weft_tensor_view_init(&ct, buf, WEFT_F32, WEFT_CPU, 2, s24, cst));
  EXPECT_ERR(weft_gemm(false, false, 1, a, b, 0, &ct), WEFT_ERR_INVALID, "C f32[2, 4]");
  weft_tensor *list[] = {a, b, bad, c, c2, a3, bd, ai, bi, ci};
  for (int i = 0; i < 10; i++) weft_tensor_destroy(list[i]);
}
