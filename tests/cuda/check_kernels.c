/* The CUDA backend's device kernels (kernels/cuda/{gemm,layers,attention,
 * optim}.cu) against the CPU kernels (layers.h, weft_sgemm) and double
 * references, on seeded random inputs with odd sizes.
 *
 * Compiled twice (tests/cuda/meson.build): with WEFT_TEST_EMU=1 into
 * test_cuda_emu, where emu_names.h turns every weft_cuda_* call below into
 * the emulator's weft_emu_* (the same .cu sources run as fibers on the
 * CPU), and with WEFT_TEST_EMU=0 into test_cuda_gpu against the real
 * backend, where every test skips without a GPU.
 *
 * Every device output is poisoned with NaN before the call, so an element
 * a kernel fails to write fails the comparison. Errors are relative by
 * norm: ||got - ref|| / ||ref||; fp32 paths <= 1e-5, BF16 matmul
 * precision <= 1e-2 against the exact product (and <= 1e-5 against the
 * product of the bf16-rounded operands, which pins the rounding).
 * Seed: WEFT_TEST_SEED (printed on failure), default per test. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda.h"
#include "kernels.h"
#include "layers.h"

#if WEFT_TEST_EMU
#define SUITE emu_kernels
#define BACKEND "emulator"
#else
#define SUITE gpu_kernels
#define BACKEND "GPU"
#endif

#define OK(expr) cr_assert_eq((expr), WEFT_OK, "%s: %s", #expr, weft_last_error())

static void setup(void) {
  (void)weft_cuda_init(0, NULL); /* a failure shows as 0 devices below */
  weft_cuda_set_matmul_precision(WEFT_MATMUL_F32);
}

#define NEED_DEVICE()                                                                    \
  do {                                                                                   \
    if (weft_cuda_device_count() == 0)                                                   \
      cr_skip_test("no GPU: %d CUDA devices visible (" BACKEND " backend)",              \
                   weft_cuda_device_count());                                            \
    OK(weft_cuda_init(0, NULL));                                                         \
  } while (0)

TestSuite(SUITE, .init = setup, .timeout = 120);

/* ---------------------------------------------------------------- random */

static uint64_t rng_state;
static unsigned long test_seed;

static void seed(unsigned long fallback) {
  const char *s = getenv("WEFT_TEST_SEED");
  test_seed = s ? strtoul(s, NULL, 10) : fallback;
  rng_state = test_seed * 0x9E3779B97F4A7C15ull + 1;
}
static uint64_t next_u64(void) { /* splitmix64 */
  uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
static double uniform01(void) { return (double)(next_u64() >> 11) * (1.0 / 9007199254740992.0); }
static float uniform(float lo, float hi) { return lo + (hi - lo) * (float)uniform01(); }
static float normal(void) {
  double u = uniform01(), v = uniform01();
  if (u < 1e-300) u = 1e-300;
  return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}

static float *host_normal(int64_t n, float sd) {
  float *x = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
  cr_assert_not_null(x);
  for (int64_t i = 0; i < n; i++) x[i] = sd * normal();
  return x;
}
static float *host_uniform(int64_t n, float lo, float hi) {
  float *x = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
  cr_assert_not_null(x);
  for (int64_t i = 0; i < n; i++) x[i] = uniform(lo, hi);
  return x;
}
static float *host_copy(const float *x, int64_t n) {
  float *y = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
  cr_assert_not_null(y);
  memcpy(y, x, (size_t)n * sizeof(float));
  return y;
}
static int32_t *host_ids(int64_t n, int32_t lo, int32_t hi) {
  int32_t *t = malloc((size_t)(n > 0 ? n : 1) * sizeof(int32_t));
  cr_assert_not_null(t);
  for (int64_t i = 0; i < n; i++) t[i] = lo + (int32_t)(next_u64() % (uint64_t)(hi - lo));
  return t;
}

/* ---------------------------------------------------------------- device */

static void *dev_alloc(size_t bytes) {
  void *p = NULL;
  OK(weft_cuda_malloc(bytes > 0 ? bytes : 4, &p));
  return p;
}
static float *dev_up(const float *h, int64_t n) {
  float *d = dev_alloc((size_t)n * sizeof(float));
  OK(weft_cuda_memcpy(d, h, (size_t)n * sizeof(float), WEFT_COPY_H2D));
  return d;
}
static int32_t *dev_up_ids(const int32_t *h, int64_t n) {
  int32_t *d = dev_alloc((size_t)n * sizeof(int32_t));
  OK(weft_cuda_memcpy(d, h, (size_t)n * sizeof(int32_t), WEFT_COPY_H2D));
  return d;
}
/* A device array of n NaNs. */
static float *dev_nan(int64_t n) {
  float *h = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
  for (int64_t i = 0; i < n; i++) h[i] = NAN;
  float *d = dev_up(h, n);
  free(h);
  return d;
}
static void dev_poison(float *d, int64_t n) {
  float *h = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
  for (int64_t i = 0; i < n; i++) h[i] = NAN;
  OK(weft_cuda_memcpy(d, h, (size_t)n * sizeof(float), WEFT_COPY_H2D));
  free(h);
}
static float *dev_down(const float *d, int64_t n) {
  OK(weft_cuda_synchronize());
  float *h = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
  cr_assert_not_null(h);
  OK(weft_cuda_memcpy(h, d, (size_t)n * sizeof(float), WEFT_COPY_D2H));
  return h;
}

/* ------------------------------------------------------------- compare */

/* ||got - ref|| / ||ref|| (absolute norm if ref is 0); NaN if got has NaN. */
static double rel_err_d(const float *got, const double *ref, int64_t n) {
  double num = 0.0, den = 0.0;
  for (int64_t i = 0; i < n; i++) {
    const double d = (double)got[i] - ref[i];
    num += d * d;
    den += ref[i] * ref[i];
  }
  return den > 0.0 ? sqrt(num / den) : sqrt(num);
}
static double rel_err(const float *got, const float *ref, int64_t n) {
  double num = 0.0, den = 0.0;
  for (int64_t i = 0; i < n; i++) {
    const double d = (double)got[i] - (double)ref[i];
    num += d * d;
    den += (double)ref[i] * ref[i];
  }
  return den > 0.0 ? sqrt(num / den) : sqrt(num);
}

#define EXPECT_CLOSE(err, tol, what)                                                   \
  do {                                                                                 \
    const double e_ = (err);                                                           \
    cr_assert(e_ <= (tol), "%s: relative error %.3g > %.1g (seed %lu)", (what), e_,      \
              (double)(tol), test_seed);                                               \
  } while (0)

/* Downloads d (n) and compares it with ref; frees the download. */
static void expect_dev(const float *d, const float *ref, int64_t n, double tol, const char *what) {
  float *h = dev_down(d, n);
  EXPECT_CLOSE(rel_err(h, ref, n), tol, what);
  free(h);
}

static void expect_error(weft_status st, weft_status want, const char *needle, const char *what) {
  cr_assert_eq(st, want, "%s: status %d, expected %d (%s)", what, (int)st, (int)want,
               weft_last_error());
  if (needle)
    cr_assert(strstr(weft_last_error(), needle) != NULL, "%s: message '%s' lacks '%s'", what,
              weft_last_error(), needle);
}

/* ------------------------------------------------------------------ GEMM */

/* Row-major op(A)[i][p] for a matrix stored with leading dim ld. */
static double at(const float *a, bool t, int64_t ld, int64_t i, int64_t p) {
  return t ? a[p * ld + i] : a[i * ld + p];
}
/* C = alpha op(A) op(B) + beta C0 in double. */
static void gemm_ref(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha,
                     const float *a, int64_t lda, const float *b, int64_t ldb, double beta,
                     const float *c0, int64_t ldc, double *out /* m x n, ld n */) {
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < n; j++) {
      double s = 0.0;
      for (int64_t p = 0; p < k; p++) s += at(a, ta, lda, i, p) * at(b, tb, ldb, p, j);
      out[i * n + j] = alpha * s + (beta != 0.0 ? beta * c0[i * ldc + j] : 0.0);
    }
}

/* C's m x n entries out of an ldc-strided buffer. */
static void unpad(float *dst, const float *c, int64_t m, int64_t n, int64_t ldc) {
  for (int64_t i = 0; i < m; i++) memcpy(dst + i * n, c + i * ldc, (size_t)n * sizeof(float));
}

static float *bf16_round(const float *x, int64_t n) {
  float *y = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
  for (int64_t i = 0; i < n; i++) y[i] = weft_bf16_to_f32(weft_f32_to_bf16(x[i]));
  return y;
}

/* One sgemm in the current precision vs the double reference of (ra, rb)
 * (the operands, or their bf16 roundings), all four transposes. */
static void check_sgemm_case(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double tol,
                             bool round_ref, double tol_exact) {
  const int64_t lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 1, ldc = n + 2;
  const int64_t na = (ta ? k : m) * lda, nb = (tb ? n : k) * ldb, nc = m * ldc;
  float *a = host_normal(na, 1.0f), *b = host_normal(nb, 1.0f), *c0 = host_normal(nc, 1.0f);
  const float alpha = 0.75f, beta = -0.5f;
  float *da = dev_up(a, na), *db = dev_up(b, nb), *dc = dev_up(c0, nc);
  OK(weft_cuda_sgemm(ta, tb, m, n, k, alpha, da, lda, db, ldb, beta, dc, ldc));
  float *c = dev_down(dc, nc), *got = malloc((size_t)(m * n) * sizeof(float));
  unpad(got, c, m, n, ldc);
  double *ref = malloc((size_t)(m * n) * sizeof(double));
  char what[96];
  gemm_ref(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c0, ldc, ref);
  snprintf(what, sizeof what, "sgemm ta=%d tb=%d %lldx%lldx%lld vs exact", ta, tb, (long long)m,
           (long long)n, (long long)k);
  EXPECT_CLOSE(rel_err_d(got, ref, m * n), tol_exact, what);
  if (round_ref) {
    float *ra = bf16_round(a, na), *rb = bf16_round(b, nb);
    gemm_ref(ta, tb, m, n, k, alpha, ra, lda, rb, ldb, beta, c0, ldc, ref);
    snprintf(what, sizeof what, "sgemm ta=%d tb=%d vs bf16-rounded operands", ta, tb);
    EXPECT_CLOSE(rel_err_d(got, ref, m * n), tol, what);
    free(ra);
    free(rb);
  }
  /* the padding between rows is untouched */
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = n; j < ldc; j++)
      cr_assert_eq(memcmp(&c[i * ldc + j], &c0[i * ldc + j], 4), 0, "C padding written");
  free(a), free(b), free(c0), free(c), free(got), free(ref);
  weft_cuda_free(da), weft_cuda_free(db), weft_cuda_free(dc);
}

Test(SUITE, sgemm_f32_matches_double_reference_for_every_transpose) {
  NEED_DEVICE();
  seed(11);
  for (int t = 0; t < 4; t++) check_sgemm_case(t & 1, t & 2, 37, 45, 29, 1e-5, false, 1e-5);
}

Test(SUITE, sgemm_matches_weft_sgemm) {
  NEED_DEVICE();
  seed(12);
  const int64_t m = 33, n = 17, k = 70;
  float *a = host_normal(m * k, 1.0f), *b = host_normal(n * k, 1.0f), *c = host_normal(m * n, 1.0f);
  float *da = dev_up(a, m * k), *db = dev_up(b, n * k), *dc = dev_nan(m * n);
  OK(weft_cuda_sgemm(false, true, m, n, k, 1.0f, da, k, db, k, 0.0f, dc, n));
  weft_sgemm(false, true, m, n, k, 1.0f, a, k, b, k, 0.0f, c, n); /* beta 0: C not read */
  expect_dev(dc, c, m * n, 1e-5, "sgemm vs weft_sgemm (beta 0 overwrites NaN)");
}

Test(SUITE, sgemm_tf32_is_close) {
  NEED_DEVICE();
  seed(13);
  weft_cuda_set_matmul_precision(WEFT_MATMUL_TF32);
  cr_assert_eq(weft_cuda_matmul_precision(), WEFT_MATMUL_TF32);
  for (int t = 0; t < 4; t++) check_sgemm_case(t & 1, t & 2, 21, 35, 40, 5e-3, false, 5e-3);
}

Test(SUITE, sgemm_bf16_precision_rounds_operands_to_nearest_even) {
  NEED_DEVICE();
  seed(14);
  weft_cuda_set_matmul_precision(WEFT_MATMUL_BF16);
  for (int t = 0; t < 4; t++) check_sgemm_case(t & 1, t & 2, 23, 41, 37, 1e-5, true, 1e-2);
}

Test(SUITE, sgemm_k0_or_alpha0_scales_c_without_reading_a_b) {
  NEED_DEVICE();
  seed(15);
  const int64_t m = 5, n = 7;
  float *c0 = host_normal(m * n, 1.0f), *want = host_copy(c0, m * n);
  for (int64_t i = 0; i < m * n; i++) want[i] = 2.0f * c0[i];
  float *dc = dev_up(c0, m * n);
  OK(weft_cuda_sgemm(false, false, m, n, 0, 1.0f, NULL, 1, NULL, n, 2.0f, dc, n));
  expect_dev(dc, want, m * n, 0.0, "k = 0: C = beta C");
  dev_poison(dc, m * n);
  float *da = dev_nan(m * 3), *db = dev_nan(3 * n);
  OK(weft_cuda_sgemm(false, false, m, n, 3, 0.0f, da, 3, db, n, 0.0f, dc, n));
  float *h = dev_down(dc, m * n);
  for (int64_t i = 0; i < m * n; i++) cr_assert_eq(h[i], 0.0f, "alpha = beta = 0: zeros, no NaN");
  OK(weft_cuda_sgemm(false, false, 0, n, 3, 1.0f, NULL, 3, NULL, n, 0.0f, NULL, n));
}

Test(SUITE, sgemm_strided_batched_with_a_broadcast_operand) {
  NEED_DEVICE();
  seed(16);
  const int64_t m = 13, n = 9, k = 11, count = 3, lda = k, ldb = k + 2, ldc = n;
  const int64_t sa = m * lda + 5, sc = m * ldc + 3; /* gaps between the matrices */
  float *a = host_normal(count * sa, 1.0f), *b = host_normal(n * ldb, 1.0f);
  float *c0 = host_normal(count * sc, 1.0f);
  float *da = dev_up(a, count * sa), *db = dev_up(b, n * ldb), *dc = dev_up(c0, count * sc);
  for (int prec = 0; prec < 2; prec++) {
    weft_cuda_set_matmul_precision(prec ? WEFT_MATMUL_BF16 : WEFT_MATMUL_F32);
    OK(weft_cuda_memcpy(dc, c0, (size_t)(count * sc) * sizeof(float), WEFT_COPY_H2D));
    OK(weft_cuda_sgemm_strided_batched(false, true, m, n, k, 1.5f, da, lda, sa, db, ldb, 0, 1.0f,
                                       dc, ldc, sc, count));
    float *c = dev_down(dc, count * sc);
    float *ra = prec ? bf16_round(a, count * sa) : host_copy(a, count * sa);
    float *rb = prec ? bf16_round(b, n * ldb) : host_copy(b, n * ldb);
    double *ref = malloc((size_t)(m * n) * sizeof(double));
    float *got = malloc((size_t)(m * n) * sizeof(float));
    for (int64_t i = 0; i < count; i++) {
      gemm_ref(false, true, m, n, k, 1.5, ra + i * sa, lda, rb, ldb, 1.0, c0 + i * sc, ldc, ref);
      unpad(got, c + i * sc, m, n, ldc);
      EXPECT_CLOSE(rel_err_d(got, ref, m * n), 1e-5, prec ? "batched bf16" : "batched f32");
      for (int64_t j = m * ldc; j < sc; j++)
        cr_assert_eq(memcmp(&c[i * sc + j], &c0[i * sc + j], 4), 0, "gap between C written");
    }
    free(c), free(ra), free(rb), free(ref), free(got);
  }
}

Test(SUITE, gemm_bf16_accumulates_in_fp32) {
  NEED_DEVICE();
  seed(17);
  const int64_t m = 19, n = 31, k = 53;
  float *a = host_normal(k * m, 1.0f), *b = host_normal(k * n, 1.0f), *c0 = host_normal(m * n, 1.0f);
  uint16_t *ha = malloc((size_t)(k * m) * 2), *hb = malloc((size_t)(k * n) * 2);
  for (int64_t i = 0; i < k * m; i++) ha[i] = weft_f32_to_bf16(a[i]), a[i] = weft_bf16_to_f32(ha[i]);
  for (int64_t i = 0; i < k * n; i++) hb[i] = weft_f32_to_bf16(b[i]), b[i] = weft_bf16_to_f32(hb[i]);
  uint16_t *da = dev_alloc((size_t)(k * m) * 2), *db = dev_alloc((size_t)(k * n) * 2);
  OK(weft_cuda_memcpy(da, ha, (size_t)(k * m) * 2, WEFT_COPY_H2D));
  OK(weft_cuda_memcpy(db, hb, (size_t)(k * n) * 2, WEFT_COPY_H2D));
  float *dc = dev_up(c0, m * n);
  /* C = A^T B with A stored (k, m), B stored (k, n) */
  OK(weft_cuda_gemm_bf16(true, false, m, n, k, 1.0f, da, m, db, n, 0.25f, dc, n));
  double *ref = malloc((size_t)(m * n) * sizeof(double));
  gemm_ref(true, false, m, n, k, 1.0, a, m, b, n, 0.25, c0, n, ref);
  float *got = dev_down(dc, m * n);
  EXPECT_CLOSE(rel_err_d(got, ref, m * n), 1e-5, "gemm_bf16");
}

Test(SUITE, gemm_rejects_bad_sizes_and_leading_dims) {
  NEED_DEVICE();
  float *d = dev_nan(64);
  expect_error(weft_cuda_sgemm(false, false, -1, 2, 2, 1.0f, d, 2, d, 2, 0.0f, d, 2),
               WEFT_ERR_INVALID, "negative size", "m < 0");
  expect_error(weft_cuda_sgemm(false, false, 4, 4, 4, 1.0f, d, 3, d, 4, 0.0f, d, 4),
               WEFT_ERR_INVALID, "lda 3", "lda < k");
  expect_error(weft_cuda_sgemm(false, true, 4, 4, 4, 1.0f, d, 4, d, 4, 0.0f, d, 3),
               WEFT_ERR_INVALID, "ldc 3", "ldc < n");
  expect_error(weft_cuda_sgemm(false, false, 2, 2, 2, 1.0f, NULL, 2, d, 2, 0.0f, d, 2),
               WEFT_ERR_INVALID, "A is NULL", "A NULL");
  expect_error(weft_cuda_sgemm_strided_batched(false, false, 4, 4, 4, 1.0f, d, 4, 16, d, 4, 16,
                                               0.0f, d, 4, 8, 2),
               WEFT_ERR_INVALID, "overlap", "overlapping C");
  expect_error(weft_cuda_sgemm_strided_batched(false, false, 2, 2, 2, 1.0f, d, 2, 4, d, 2, 4,
                                               0.0f, d, 2, 4, -1),
               WEFT_ERR_INVALID, "batch count", "count < 0");
  uint16_t *h = (uint16_t *)d;
  expect_error(weft_cuda_gemm_bf16(true, false, 4, 4, 4, 1.0f, h, 3, h, 4, 0.0f, d, 4),
               WEFT_ERR_INVALID, "lda 3", "bf16 lda < m");
}

/* ----------------------------------------------------------------- casts */

Test(SUITE, casts_round_like_weft_f32_to_bf16_bit_for_bit) {
  NEED_DEVICE();
  seed(18);
  const int64_t n = 1003;
  float *x = host_normal(n + 1, 3.0f);
  /* specials: ties (even and odd), NaNs with payloads, infinities, huge, tiny */
  const uint32_t bits[] = {0x3f808000u, 0x3f818000u, 0x7fc00001u, 0xffa00000u, 0x7f800000u,
                           0xff800000u, 0x7f7fffffu, 0x00000001u, 0x80000000u, 0x3f80ffffu};
  for (size_t i = 0; i < sizeof bits / sizeof bits[0]; i++) memcpy(&x[5 * i + 1], &bits[i], 4);
  float *dx = dev_up(x, n + 1);
  uint16_t *dh = dev_alloc((size_t)(n + 1) * 2);
  uint16_t *h = malloc((size_t)(n + 1) * 2);
  for (int off = 0; off < 2; off++) { /* off 1: unaligned, the scalar path */
    const int64_t cnt = n - off;
    OK(weft_cuda_cast_f32_to_bf16(dh + off, dx + off, cnt));
    OK(weft_cuda_synchronize());
    OK(weft_cuda_memcpy(h, dh + off, (size_t)cnt * 2, WEFT_COPY_D2H));
    for (int64_t i = 0; i < cnt; i++)
      cr_assert_eq(h[i], weft_f32_to_bf16(x[off + i]), "f32->bf16 [%lld]: %04x vs %04x",
                   (long long)i, h[i], weft_f32_to_bf16(x[off + i]));
    float *dy = dev_nan(cnt + 1);
    OK(weft_cuda_cast_bf16_to_f32(dy + off, dh + off, cnt));
    float *y = dev_down(dy + off, cnt);
    for (int64_t i = 0; i < cnt; i++) {
      const float want = weft_bf16_to_f32(h[i]);
      cr_assert_eq(memcmp(&y[i], &want, 4), 0, "bf16->f32 [%lld]", (long long)i);
    }
    free(y);
    weft_cuda_free(dy);
  }
  expect_error(weft_cuda_cast_f32_to_bf16(dh, dx, -1), WEFT_ERR_INVALID, "negative", "n < 0");
  expect_error(weft_cuda_cast_bf16_to_f32(NULL, dh, 4), WEFT_ERR_INVALID, "NULL", "out NULL");
}

/* ------------------------------------------------------------- embedding */

Test(SUITE, embedding_forward_backward_match_cpu) {
  NEED_DEVICE();
  seed(19);
  const int64_t Cs[2] = {45, 64}; /* odd, and the vector path */
  for (int ci = 0; ci < 2; ci++) {
    const int64_t N = 37, V = 23, C = Cs[ci];
    int32_t *tok = host_ids(N, 0, (int32_t)V);
    tok[3] = tok[7] = tok[20] = 5; /* repeated tokens add up */
    float *w = host_normal(V * C, 1.0f), *dout = host_normal(N * C, 1.0f);
    float *dw0 = host_normal(V * C, 1.0f);
    int32_t *dtok = dev_up_ids(tok, N);
    float *dwt = dev_up(w, V * C), *ddout = dev_up(dout, N * C), *dout_d = dev_nan(N * C);
    float *out = malloc((size_t)(N * C) * sizeof(float));
    OK(weft_cuda_embedding_forward(dout_d, dtok, dwt, N, V, C));
    OK(weft_embedding_forward(out, tok, w, N, V, C));
    expect_dev(dout_d, out, N * C, 0.0, "embedding forward (a copy: exact)");
    float *ddw = dev_up(dw0, V * C), *dw = host_copy(dw0, V * C);
    OK(weft_cuda_embedding_backward(ddw, dtok, ddout, N, V, C));
    OK(weft_embedding_backward(dw, tok, dout, N, V, C));
    expect_dev(ddw, dw, V * C, 1e-6, "embedding backward (accumulates)");

    /* the vocab range [v0, v0 + nv) of the same table */
    const int64_t v0 = 5, nv = 10;
    dev_poison(dout_d, N * C);
    OK(weft_cuda_embedding_range_forward(dout_d, dtok, dwt + v0 * C, N, v0, nv, C));
    OK(weft_embedding_range_forward(out, tok, w + v0 * C, N, v0, nv, C));
    expect_dev(dout_d, out, N * C, 0.0, "embedding range forward");
    OK(weft_cuda_memcpy(ddw, dw0, (size_t)(V * C) * sizeof(float), WEFT_COPY_H2D));
    memcpy(dw, dw0, (size_t)(V * C) * sizeof(float));
    OK(weft_cuda_embedding_range_backward(ddw + v0 * C, dtok, ddout, N, v0, nv, C));
    OK(weft_embedding_range_backward(dw + v0 * C, tok, dout, N, v0, nv, C));
    expect_dev(ddw, dw, V * C, 1e-6, "embedding range backward (other rows untouched)");
  }
}

Test(SUITE, embedding_rejects_bad_tokens_before_writing) {
  NEED_DEVICE();
  seed(20);
  const int64_t N = 9, V = 7, C = 5;
  int32_t *tok = host_ids(N, 0, (int32_t)V);
  tok[4] = (int32_t)V;
  tok[6] = -1;
  int32_t *dtok = dev_up_ids(tok, N);
  float *w = host_normal(V * C, 1.0f), *dw = dev_up(w, V * C), *out = dev_nan(N * C);
  expect_error(weft_cuda_embedding_forward(out, dtok, dw, N, V, C), WEFT_ERR_INVALID,
               "tokens[4] = 7", "token == V");
  float *h = dev_down(out, N * C);
  for (int64_t i = 0; i < N * C; i++) cr_assert(isnan(h[i]), "out written before the error");
  expect_error(weft_cuda_embedding_backward(dw, dtok, out, N, V, C), WEFT_ERR_INVALID,
               "tokens[4]", "backward token == V");
  expect_error(weft_cuda_embedding_range_forward(out, dtok, dw, N, 0, V, C), WEFT_ERR_INVALID,
               "tokens[6] = -1 is negative", "range: negative token");
  expect_error(weft_cuda_embedding_forward(out, dtok, dw, -1, V, C), WEFT_ERR_INVALID,
               "negative", "N < 0");
  expect_error(weft_cuda_embedding_forward(out, NULL, dw, N, V, C), WEFT_ERR_INVALID,
               "tokens is NULL", "tokens NULL");
  float *h2 = dev_down(dw, V * C);
  EXPECT_CLOSE(rel_err(h2, w, V * C), 0.0, "dweight untouched by the failed backward");
}

/* ---------------------------------------------------------------- linear */

Test(SUITE, linear_forward_backward_match_cpu) {
  NEED_DEVICE();
  seed(21);
  const int64_t shapes[2][3] = {{37, 45, 29}, {16, 64, 32}};
  for (int si = 0; si < 2; si++) {
    const int64_t N = shapes[si][0], IC = shapes[si][1], OC = shapes[si][2];
    float *x = host_normal(N * IC, 1.0f), *w = host_normal(OC * IC, 0.3f);
    float *bias = host_normal(OC, 1.0f), *dout = host_normal(N * OC, 1.0f);
    float *dx = dev_up(x, N * IC), *dwt = dev_up(w, OC * IC), *db = dev_up(bias, OC);
    float *ddout = dev_up(dout, N * OC), *dy = dev_nan(N * OC);
    float *y = malloc((size_t)(N * OC) * sizeof(float));
    for (int with_bias = 0; with_bias < 2; with_bias++) {
      dev_poison(dy, N * OC);
      OK(weft_cuda_linear_forward(dy, dx, dwt, with_bias ? db : NULL, N, IC, OC));
      OK(weft_linear_forward(y, x, w, with_bias ? bias : NULL, N, IC, OC));
      expect_dev(dy, y, N * OC, 1e-5, with_bias ? "linear forward + bias" : "linear forward");
    }
    float *gi0 = host_normal(N * IC, 1.0f), *gw0 = host_normal(OC * IC, 1.0f);
    float *gb0 = host_normal(OC, 1.0f);
    for (int acc = 0; acc < 2; acc++) {
      float *gi = host_copy(gi0, N * IC), *gw = host_copy(gw0, OC * IC), *gb = host_copy(gb0, OC);
      float *dgi = acc ? dev_up(gi0, N * IC) : dev_nan(N * IC);
      float *dgw = acc ? dev_up(gw0, OC * IC) : dev_nan(OC * IC);
      float *dgb = acc ? dev_up(gb0, OC) : dev_nan(OC);
      OK(weft_cuda_linear_backward(dgi, dgw, dgb, ddout, dx, dwt, N, IC, OC, acc, acc));
      OK(weft_linear_backward(gi, gw, gb, dout, x, w, N, IC, OC, acc, acc));
      expect_dev(dgi, gi, N * IC, 1e-5, acc ? "dinp +=" : "dinp =");
      expect_dev(dgw, gw, OC * IC, 1e-5, acc ? "dweight +=" : "dweight =");
      expect_dev(dgb, gb, OC, 1e-5, acc ? "dbias +=" : "dbias =");
      free(gi), free(gw), free(gb);
      weft_cuda_free(dgi), weft_cuda_free(dgw), weft_cuda_free(dgb);
    }
    /* NULL outputs are skipped */
    OK(weft_cuda_linear_backward(NULL, NULL, NULL, ddout, NULL, NULL, N, IC, OC, false, false));
  }
}

Test(SUITE, linear_bf16_precision_is_close) {
  NEED_DEVICE();
  seed(22);
  const int64_t N = 24, IC = 40, OC = 36;
  weft_cuda_set_matmul_precision(WEFT_MATMUL_BF16);
  float *x = host_normal(N * IC, 1.0f), *w = host_normal(OC * IC, 0.3f), *y = malloc(N * OC * 4);
  float *dx = dev_up(x, N * IC), *dwt = dev_up(w, OC * IC), *dy = dev_nan(N * OC);
  OK(weft_cuda_linear_forward(dy, dx, dwt, NULL, N, IC, OC));
  OK(weft_linear_forward(y, x, w, NULL, N, IC, OC));
  expect_dev(dy, y, N * OC, 1e-2, "linear forward, bf16 matmuls");
}

/* --------------------------------------------------------------- RMSNorm */

Test(SUITE, rmsnorm_forward_backward_match_cpu) {
  NEED_DEVICE();
  seed(23);
  /* C: one register column per thread, two, the vector forward, and a row
   * too long for registers (the two-pass backward) */
  const int64_t shapes[4][2] = {{37, 77}, {21, 300}, {8, 64}, {3, 8200}};
  for (int si = 0; si < 4; si++) {
    const int64_t N = shapes[si][0], C = shapes[si][1];
    float *x = host_normal(N * C, 2.0f), *w = host_uniform(C, 0.5f, 1.5f);
    float *dout = host_normal(N * C, 1.0f);
    float *dx = dev_up(x, N * C), *dwt = dev_up(w, C), *ddout = dev_up(dout, N * C);
    float *dy = dev_nan(N * C), *drstd = dev_nan(N);
    float *y = malloc((size_t)(N * C) * 4), *rstd = malloc((size_t)N * 4);
    OK(weft_cuda_rmsnorm_forward(dy, drstd, dx, dwt, N, C, 1e-5f));
    OK(weft_rmsnorm_forward(y, rstd, x, w, N, C, 1e-5f));
    expect_dev(dy, y, N * C, 1e-5, "rmsnorm out");
    expect_dev(drstd, rstd, N, 1e-6, "rmsnorm rstd");
    float *gi0 = host_normal(N * C, 1.0f), *gw0 = host_normal(C, 1.0f);
    for (int acc = 0; acc < 2; acc++) {
      float *gi = host_copy(gi0, N * C), *gw = host_copy(gw0, C);
      float *dgi = acc ? dev_up(gi0, N * C) : dev_nan(N * C), *dgw = dev_up(gw0, C);
      OK(weft_cuda_rmsnorm_backward(dgi, dgw, ddout, dx, dwt, drstd, N, C, acc));
      OK(weft_rmsnorm_backward(gi, gw, dout, x, w, rstd, N, C, acc));
      char what[64];
      snprintf(what, sizeof what, "rmsnorm dinp (C %lld, %s)", (long long)C, acc ? "+=" : "=");
      expect_dev(dgi, gi, N * C, 1e-5, what);
      snprintf(what, sizeof what, "rmsnorm dweight += (C %lld)", (long long)C);
      expect_dev(dgw, gw, C, 1e-5, what);
      free(gi), free(gw);
      weft_cuda_free(dgi), weft_cuda_free(dgw);
    }
  }
  float *d = dev_nan(8);
  expect_error(weft_cuda_rmsnorm_forward(d, d, d, d, 2, 0, 1e-5f), WEFT_ERR_INVALID, "C = 0",
               "empty row");
  expect_error(weft_cuda_rmsnorm_forward(d, d, d, d, 2, 2, -1.0f), WEFT_ERR_INVALID, "eps",
               "eps < 0");
  expect_error(weft_cuda_rmsnorm_backward(d, NULL, d, d, d, d, 2, 2, false), WEFT_ERR_INVALID,
               "dweight is NULL", "dweight NULL");
}

/* ------------------------------------------------------------------ RoPE */

Test(SUITE, rope_tables_forward_backward_match_cpu) {
  NEED_DEVICE();
  seed(24);
  const int64_t max_pos = 12, hd = 10, B = 2, T = 7, NH = 3, pos0 = 3, half = hd / 2;
  const int64_t n = B * T * NH * hd;
  float *dc = dev_nan(max_pos * half), *ds = dev_nan(max_pos * half);
  float *hc = malloc((size_t)(max_pos * half) * 4), *hs = malloc((size_t)(max_pos * half) * 4);
  OK(weft_cuda_rope_tables(dc, ds, max_pos, hd, 10000.0));
  OK(weft_rope_tables(hc, hs, max_pos, hd, 10000.0));
  expect_dev(dc, hc, max_pos * half, 0.0, "cos table (computed on the host: exact)");
  expect_dev(ds, hs, max_pos * half, 0.0, "sin table");
  float *x = host_normal(n, 1.0f), *y = malloc((size_t)n * 4), *g = malloc((size_t)n * 4);
  float *dx = dev_up(x, n), *dy = dev_nan(n);
  OK(weft_cuda_rope_forward(dy, dx, dc, ds, max_pos, B, T, NH, hd, pos0));
  OK(weft_rope_forward(y, x, hc, hs, max_pos, B, T, NH, hd, pos0));
  expect_dev(dy, y, n, 1e-6, "rope forward");
  OK(weft_cuda_rope_backward(dy, dy, dc, ds, max_pos, B, T, NH, hd, pos0)); /* in place */
  OK(weft_rope_backward(g, y, hc, hs, max_pos, B, T, NH, hd, pos0));
  expect_dev(dy, g, n, 1e-6, "rope backward in place");
  expect_dev(dy, x, n, 1e-5, "backward undoes forward");
  /* an unaligned view (the scalar path) */
  float *dz = dev_nan(n + 1);
  OK(weft_cuda_rope_forward(dz + 1, dx, dc, ds, max_pos, B, T, NH, hd, pos0));
  expect_dev(dz + 1, y, n, 1e-6, "rope forward, unaligned output");
  expect_error(weft_cuda_rope_forward(dy, dx, dc, ds, max_pos, B, T, NH, hd, 6), WEFT_ERR_INVALID,
               "past the tables", "pos0 + T > max_pos");
  expect_error(weft_cuda_rope_forward(dy, dx, dc, ds, max_pos, B, T, NH, 9, 0), WEFT_ERR_INVALID,
               "even", "odd hd");
  expect_error(weft_cuda_rope_tables(dc, ds, max_pos, hd, 0.0), WEFT_ERR_INVALID, "theta",
               "theta 0");
}

/* -------------------------------------------------- SwiGLU and residual */

Test(SUITE, swiglu_and_residual_match_cpu) {
  NEED_DEVICE();
  seed(25);
  const int64_t n = 1001;
  float *a = host_normal(n + 1, 3.0f), *b = host_normal(n + 1, 1.0f), *d = host_normal(n + 1, 1.0f);
  float *da = dev_up(a, n + 1), *db = dev_up(b, n + 1), *dd = dev_up(d, n + 1);
  float *dy = dev_nan(n + 1), *dga = dev_nan(n + 1), *dgb = dev_nan(n + 1);
  float *y = malloc((size_t)(n + 1) * 4), *ga = malloc((size_t)(n + 1) * 4),
        *gb = malloc((size_t)(n + 1) * 4);
  for (int off = 0; off < 2; off++) { /* off 1: unaligned, the scalar path */
    const int64_t m = n - off;
    OK(weft_cuda_swiglu_forward(dy + off, da + off, db + off, m));
    OK(weft_swiglu_forward(y, a + off, b + off, m));
    expect_dev(dy + off, y, m, 1e-6, "swiglu forward");
    OK(weft_cuda_swiglu_backward(dga + off, dgb + off, dd + off, da + off, db + off, m));
    OK(weft_swiglu_backward(ga, gb, d + off, a + off, b + off, m));
    expect_dev(dga + off, ga, m, 1e-6, "swiglu da");
    expect_dev(dgb + off, gb, m, 1e-6, "swiglu db");
    dev_poison(dy, n + 1);
    OK(weft_cuda_residual_forward(dy + off, da + off, db + off, m));
    OK(weft_residual_forward(y, a + off, b + off, m));
    expect_dev(dy + off, y, m, 0.0, "residual forward");
    /* backward accumulates into both (NULL: skipped) */
    OK(weft_cuda_memcpy(dga, a, (size_t)(n + 1) * 4, WEFT_COPY_H2D));
    memcpy(ga, a + off, (size_t)m * 4);
    OK(weft_cuda_residual_backward(dga + off, NULL, dd + off, m));
    OK(weft_residual_backward(ga, NULL, d + off, m));
    expect_dev(dga + off, ga, m, 0.0, "residual da +=");
  }
  /* in place: da aliases a, db aliases b */
  OK(weft_cuda_swiglu_backward(da, db, dd, da, db, n));
  OK(weft_swiglu_backward(ga, gb, d, a, b, n));
  expect_dev(da, ga, n, 1e-6, "swiglu da in place");
  expect_dev(db, gb, n, 1e-6, "swiglu db in place");
  expect_error(weft_cuda_swiglu_forward(dy, NULL, db, 4), WEFT_ERR_INVALID, "a is NULL", "a NULL");
  expect_error(weft_cuda_residual_backward(dy, dy, dd, -2), WEFT_ERR_INVALID, "negative", "n < 0");
}

/* ---------------------------------------------------------- cross-entropy */

Test(SUITE, cross_entropy_forward_backward_match_cpu) {
  NEED_DEVICE();
  seed(26);
  const int64_t Vs[2] = {101, 64};
  for (int vi = 0; vi < 2; vi++) {
    const int64_t N = 37, V = Vs[vi];
    float *x = host_normal(N * V, 3.0f);
    int32_t *t = host_ids(N, 0, (int32_t)V);
    float *dx = dev_up(x, N * V), *dlse = dev_nan(N), *dg = dev_nan(N * V);
    int32_t *dt = dev_up_ids(t, N);
    float *lse = malloc((size_t)N * 4), *g = malloc((size_t)(N * V) * 4);
    double loss_d = NAN, loss_c = NAN;
    OK(weft_cuda_cross_entropy_forward(&loss_d, dlse, dx, dt, N, V));
    OK(weft_cross_entropy_forward(&loss_c, lse, x, t, N, V));
    cr_assert(fabs(loss_d - loss_c) <= 1e-6 * fabs(loss_c), "loss %.10g vs cpu %.10g (seed %lu)",
              loss_d, loss_c, test_seed);
    expect_dev(dlse, lse, N, 1e-6, "lse");
    const float scale = 1.0f / (float)N;
    OK(weft_cuda_cross_entropy_backward(dg, dx, dlse, dt, N, V, scale));
    OK(weft_cross_entropy_backward(g, x, lse, t, N, V, scale));
    expect_dev(dg, g, N * V, 1e-5, "dlogits");
    OK(weft_cuda_cross_entropy_backward(dx, dx, dlse, dt, N, V, scale)); /* in place */
    expect_dev(dx, g, N * V, 1e-5, "dlogits in place");
    double loss_null = NAN;
    OK(weft_cuda_cross_entropy_forward(&loss_null, NULL, dg, dt, N, V)); /* lse NULL */
    cr_assert(isfinite(loss_null));
  }
}

Test(SUITE, cross_entropy_rejects_bad_targets_before_writing) {
  NEED_DEVICE();
  seed(27);
  const int64_t N = 11, V = 13;
  float *x = host_normal(N * V, 1.0f), *dx = dev_up(x, N * V), *dlse = dev_nan(N);
  int32_t *t = host_ids(N, 0, (int32_t)V);
  t[8] = (int32_t)V + 4;
  int32_t *dt = dev_up_ids(t, N);
  double loss = 42.0;
  expect_error(weft_cuda_cross_entropy_forward(&loss, dlse, dx, dt, N, V), WEFT_ERR_INVALID,
               "targets[8] = 17 is outside", "target > V");
  cr_assert_eq(loss, 42.0, "loss written on error");
  float *h = dev_down(dlse, N);
  for (int64_t i = 0; i < N; i++) cr_assert(isnan(h[i]), "lse written on error");
  float *dg = dev_nan(N * V);
  expect_error(weft_cuda_cross_entropy_backward(dg, dx, dlse, dt, N, V, 1.0f), WEFT_ERR_INVALID,
               "targets[8]", "backward target > V");
  t[8] = -3;
  OK(weft_cuda_memcpy(dt, t, (size_t)N * 4, WEFT_COPY_H2D));
  expect_error(weft_cuda_cross_entropy_local_target(dlse, dx, dt, N, 0, V), WEFT_ERR_INVALID,
               "targets[8] = -3 is negative", "local_target negative");
  expect_error(weft_cuda_cross_entropy_backward_local(dg, dx, dlse, dt, N, 0, V, 1.0f),
               WEFT_ERR_INVALID, "targets[8]", "backward_local negative");
  expect_error(weft_cuda_cross_entropy_forward(&loss, dlse, dx, dt, 2, 0), WEFT_ERR_INVALID,
               "V = 0", "no classes");
  /* finish: a non-positive sum of exponentials */
  float ones[4] = {1.0f, 1.0f, 0.0f, 1.0f};
  float *dsum = dev_up(ones, 4);
  expect_error(weft_cuda_cross_entropy_finish(&loss, NULL, dsum, dsum, dsum, 4), WEFT_ERR_INVALID,
               "row 2", "gsum 0");
}

/* The loss-parallel pieces over three vocab shards compose to the full
 * loss, lse and gradient (the reductions done here on the host). */
Test(SUITE, vocab_sharded_cross_entropy_composes_to_the_full_loss) {
  NEED_DEVICE();
  seed(28);
  const int64_t N = 29, V = 101, cuts[4] = {0, 40, 77, 101};
  float *x = host_normal(N * V, 2.0f);
  int32_t *t = host_ids(N, 0, (int32_t)V);
  int32_t *dt = dev_up_ids(t, N);
  float *lse = malloc((size_t)N * 4), *g = malloc((size_t)(N * V) * 4);
  double loss_c;
  OK(weft_cross_entropy_forward(&loss_c, lse, x, t, N, V));
  const float scale = 0.5f / (float)N;
  OK(weft_cross_entropy_backward(g, x, lse, t, N, V, scale));
  float *shard[3], *dshard[3];
  float gmax[64], gtgt[64], gsum[64];
  for (int64_t n = 0; n < N; n++) gmax[n] = -INFINITY, gtgt[n] = 0.0f, gsum[n] = 0.0f;
  float *dtmp = dev_nan(N);
  for (int s = 0; s < 3; s++) {
    const int64_t v0 = cuts[s], nv = cuts[s + 1] - cuts[s];
    shard[s] = malloc((size_t)(N * nv) * 4);
    for (int64_t n = 0; n < N; n++) memcpy(shard[s] + n * nv, x + n * V + v0, (size_t)nv * 4);
    dshard[s] = dev_up(shard[s], N * nv);
    dev_poison(dtmp, N);
    OK(weft_cuda_cross_entropy_local_max(dtmp, dshard[s], N, nv));
    float *h = dev_down(dtmp, N);
    for (int64_t n = 0; n < N; n++) gmax[n] = h[n] > gmax[n] ? h[n] : gmax[n];
    free(h);
    dev_poison(dtmp, N);
    OK(weft_cuda_cross_entropy_local_target(dtmp, dshard[s], dt, N, v0, nv));
    h = dev_down(dtmp, N);
    for (int64_t n = 0; n < N; n++) gtgt[n] += h[n];
    free(h);
  }
  float *dgmax = dev_up(gmax, N);
  for (int s = 0; s < 3; s++) {
    const int64_t nv = cuts[s + 1] - cuts[s];
    dev_poison(dtmp, N);
    OK(weft_cuda_cross_entropy_local_sumexp(dtmp, dshard[s], dgmax, N, nv));
    float *h = dev_down(dtmp, N);
    for (int64_t n = 0; n < N; n++) gsum[n] += h[n];
    free(h);
  }
  float *dgsum = dev_up(gsum, N), *dgtgt = dev_up(gtgt, N), *dlse = dev_nan(N);
  double loss_d = NAN;
  OK(weft_cuda_cross_entropy_finish(&loss_d, dlse, dgmax, dgsum, dgtgt, N));
  cr_assert(fabs(loss_d - loss_c) <= 1e-6 * fabs(loss_c), "sharded loss %.10g vs full %.10g",
            loss_d, loss_c);
  expect_dev(dlse, lse, N, 1e-6, "sharded lse");
  for (int s = 0; s < 3; s++) {
    const int64_t v0 = cuts[s], nv = cuts[s + 1] - cuts[s];
    float *dgs = dev_nan(N * nv), *want = malloc((size_t)(N * nv) * 4);
    OK(weft_cuda_cross_entropy_backward_local(dgs, dshard[s], dlse, dt, N, v0, nv, scale));
    for (int64_t n = 0; n < N; n++) memcpy(want + n * nv, g + n * V + v0, (size_t)nv * 4);
    expect_dev(dgs, want, N * nv, 1e-5, "sharded dlogits");
  }
  /* an empty shard reports -inf and sums to 0 */
  OK(weft_cuda_cross_entropy_local_max(dtmp, dshard[0], N, 0));
  float *h = dev_down(dtmp, N);
  for (int64_t n = 0; n < N; n++) cr_assert(isinf(h[n]) && h[n] < 0, "nv = 0: -inf");
  OK(weft_cuda_cross_entropy_local_sumexp(dtmp, dshard[0], dgmax, N, 0));
  free(h);
  h = dev_down(dtmp, N);
  for (int64_t n = 0; n < N; n++) cr_assert_eq(h[n], 0.0f, "nv = 0: sum 0");
}

/* -------------------------------------------------------------- attention */

static void check_attention(int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t hd, double tol,
                            const char *what) {
  const int64_t nq = B * T * H * hd, nkv = B * T * Hkv * hd, nl = B * H * T;
  float *q = host_normal(nq, 1.0f), *k = host_normal(nkv, 1.0f), *v = host_normal(nkv, 1.0f);
  float *dout = host_normal(nq, 1.0f);
  float *out = malloc((size_t)nq * 4), *lse = malloc((size_t)nl * 4);
  float *dq = malloc((size_t)nq * 4), *dk = malloc((size_t)nkv * 4), *dv = malloc((size_t)nkv * 4);
  float *cpu_scratch = malloc((size_t)weft_attention_scratch_floats(T) * 4);
  OK(weft_attention_forward(out, lse, q, k, v, B, T, H, Hkv, hd, cpu_scratch));
  OK(weft_attention_backward(dq, dk, dv, dout, q, k, v, lse, B, T, H, Hkv, hd, cpu_scratch));
  const size_t sb = weft_cuda_attention_scratch_bytes(B, T, H, Hkv, hd);
  /* the promise of the header: scores for one block of query rows, never T x T per head */
  const int64_t bq = T < 128 ? T : 128;
  cr_assert(sb <= 4 * (size_t)(3 * nq + 4 * nkv + nl + 2 * B * H * bq * T) + 10 * 256,
            "scratch %zu bytes is more than the documented formula", sb);
  void *scratch = dev_alloc(sb);
  float *dqd = dev_up(q, nq), *dkd = dev_up(k, nkv), *dvd = dev_up(v, nkv),
        *ddout = dev_up(dout, nq);
  float *dod = dev_nan(nq), *dlse = dev_nan(nl);
  OK(weft_cuda_attention_forward(dod, dlse, dqd, dkd, dvd, B, T, H, Hkv, hd, scratch));
  char msg[128];
  snprintf(msg, sizeof msg, "%s: out", what);
  expect_dev(dod, out, nq, tol, msg);
  snprintf(msg, sizeof msg, "%s: lse", what);
  expect_dev(dlse, lse, nl, tol, msg);
  float *gq = dev_nan(nq), *gk = dev_nan(nkv), *gv = dev_nan(nkv);
  OK(weft_cuda_attention_backward(gq, gk, gv, ddout, dqd, dkd, dvd, dlse, dod, B, T, H, Hkv, hd,
                                  scratch));
  snprintf(msg, sizeof msg, "%s: dq", what);
  expect_dev(gq, dq, nq, tol, msg);
  snprintf(msg, sizeof msg, "%s: dk", what);
  expect_dev(gk, dk, nkv, tol, msg);
  snprintf(msg, sizeof msg, "%s: dv", what);
  expect_dev(gv, dv, nkv, tol, msg);
  free(q), free(k), free(v), free(dout), free(out), free(lse), free(dq), free(dk), free(dv);
  free(cpu_scratch);
  weft_cuda_free(scratch), weft_cuda_free(dqd), weft_cuda_free(dkd), weft_cuda_free(dvd);
  weft_cuda_free(ddout), weft_cuda_free(dod), weft_cuda_free(dlse);
  weft_cuda_free(gq), weft_cuda_free(gk), weft_cuda_free(gv);
}

Test(SUITE, attention_gqa_two_query_blocks_matches_cpu) {
  NEED_DEVICE();
  seed(29);
  /* T = 150: one full block of 128 query rows and a partial one */
  check_attention(2, 150, 4, 2, 16, 1e-5, "GQA B=2 T=150 H=4 Hkv=2 hd=16 f32");
}

Test(SUITE, attention_mha_short_and_mqa_match_cpu) {
  NEED_DEVICE();
  seed(30);
  check_attention(1, 5, 3, 3, 8, 1e-5, "MHA B=1 T=5 H=3 hd=8");
  check_attention(2, 9, 4, 1, 12, 1e-5, "MQA B=2 T=9 H=4 Hkv=1 hd=12");
}

Test(SUITE, attention_bf16_precision_is_close) {
  NEED_DEVICE();
  seed(31);
  weft_cuda_set_matmul_precision(WEFT_MATMUL_BF16);
  check_attention(2, 33, 4, 2, 16, 1e-2, "GQA bf16");
}

Test(SUITE, attention_rejects_bad_shapes) {
  NEED_DEVICE();
  float *d = dev_nan(64);
  expect_error(weft_cuda_attention_forward(d, d, d, d, d, 1, 2, 3, 2, 4, d), WEFT_ERR_INVALID,
               "not a multiple", "H % Hkv");
  expect_error(weft_cuda_attention_forward(d, d, d, d, d, 1, -2, 2, 2, 4, d), WEFT_ERR_INVALID,
               "negative", "T < 0");
  expect_error(weft_cuda_attention_forward(d, d, d, d, d, 1, 2, 2, 2, 4, NULL), WEFT_ERR_INVALID,
               "scratch is NULL", "no scratch");
  expect_error(weft_cuda_attention_backward(d, d, d, d, d, d, d, d, NULL, 1, 2, 2, 2, 4, d),
               WEFT_ERR_INVALID, "out is NULL", "backward without out");
  cr_assert_eq(weft_cuda_attention_scratch_bytes(0, 4, 2, 2, 4), 0);
  /* hd = 0: lse = log(t + 1), as the CPU kernel */
  float *dl = dev_nan(6), want[6];
  OK(weft_cuda_attention_forward(NULL, dl, NULL, NULL, NULL, 1, 3, 2, 1, 0, NULL));
  for (int i = 0; i < 6; i++) want[i] = logf((float)(i % 3 + 1));
  expect_dev(dl, want, 6, 1e-7, "hd = 0 lse");
}

/* ------------------------------------------------------------- optimizers */

Test(SUITE, adamw_multi_matches_adamw_step_over_three_tensors) {
  NEED_DEVICE();
  seed(32);
  /* sizes: a vector body with a tail, a short one, one past a 4096 chunk,
   * an empty one; tensor 1 at an odd offset (the scalar path) */
  const int64_t n[4] = {1001, 37, 4099, 0};
  const int nt = 4;
  for (int variant = 0; variant < 2; variant++) {
    weft_adamw_params hp = WEFT_ADAMW_DEFAULT;
    hp.lr = 3e-3f;
    hp.weight_decay = 0.1f;
    if (variant) hp.amsgrad = hp.maximize = true, hp.beta2 = 0.95f;
    float *p[4], *g[4], *m[4], *v[4], *vm[4];
    float *dp[4], *dg[4], *dm[4], *dv[4], *dvm[4];
    for (int i = 0; i < nt; i++) {
      const int off = i == 1;
      p[i] = host_normal(n[i], 1.0f), m[i] = host_normal(n[i], 0.1f);
      v[i] = host_uniform(n[i], 0.0f, 0.01f), vm[i] = host_uniform(n[i], 0.0f, 0.01f);
      g[i] = host_normal(n[i], 1.0f);
      float *buf = dev_alloc((size_t)(5 * n[i] + 8) * 4);
      dp[i] = buf + off, dg[i] = buf + n[i] + 2, dm[i] = buf + 2 * n[i] + 4;
      dv[i] = buf + 3 * n[i] + 6 - off, dvm[i] = buf + 4 * n[i] + 7;
      OK(weft_cuda_memcpy(dp[i], p[i], (size_t)n[i] * 4, WEFT_COPY_H2D));
      OK(weft_cuda_memcpy(dg[i], g[i], (size_t)n[i] * 4, WEFT_COPY_H2D));
      OK(weft_cuda_memcpy(dm[i], m[i], (size_t)n[i] * 4, WEFT_COPY_H2D));
      OK(weft_cuda_memcpy(dv[i], v[i], (size_t)n[i] * 4, WEFT_COPY_H2D));
      OK(weft_cuda_memcpy(dvm[i], vm[i], (size_t)n[i] * 4, WEFT_COPY_H2D));
    }
    for (int64_t step = 1; step <= 2; step++) {
      OK(weft_cuda_adamw_multi(dp, (const float *const *)dg, dm, dv, variant ? dvm : NULL, n, nt,
                               step, &hp));
      for (int i = 0; i < nt; i++)
        OK(weft_adamw_step(p[i], g[i], m[i], v[i], variant ? vm[i] : NULL, n[i], step, &hp));
    }
    for (int i = 0; i < 3; i++) {
      char what[64];
      snprintf(what, sizeof what, "adamw%s tensor %d param", variant ? " amsgrad" : "", i);
      expect_dev(dp[i], p[i], n[i], 1e-6, what);
      expect_dev(dm[i], m[i], n[i], 1e-6, "exp_avg");
      expect_dev(dv[i], v[i], n[i], 1e-6, "exp_avg_sq");
      if (variant) expect_dev(dvm[i], vm[i], n[i], 1e-6, "max_exp_avg_sq");
    }
    /* argument errors name the tensor */
    int64_t bad_n[4] = {1001, -1, 4099, 0};
    expect_error(weft_cuda_adamw_multi(dp, (const float *const *)dg, dm, dv, dvm, bad_n, nt, 1,
                                       &hp),
                 WEFT_ERR_INVALID, "n[1] = -1", "negative n");
    float *save = dg[2];
    dg[2] = NULL;
    expect_error(weft_cuda_adamw_multi(dp, (const float *const *)dg, dm, dv, dvm, n, nt, 1, &hp),
                 WEFT_ERR_INVALID, "grad[2] is NULL", "NULL grad");
    dg[2] = save;
    expect_error(weft_cuda_adamw_multi(dp, (const float *const *)dg, dm, dv, dvm, n, nt, 0, &hp),
                 WEFT_ERR_INVALID, "step = 0", "step 0");
    if (variant)
      expect_error(weft_cuda_adamw_multi(dp, (const float *const *)dg, dm, dv, NULL, n, nt, 1,
                                         &hp),
                   WEFT_ERR_INVALID, "vmax is NULL", "amsgrad without vmax");
    hp.beta1 = 1.0f;
    expect_error(weft_cuda_adamw_multi(dp, (const float *const *)dg, dm, dv, dvm, n, nt, 1, &hp),
                 WEFT_ERR_INVALID, "beta parameter at index 0", "beta1 = 1");
  }
}

Test(SUITE, sumsq_and_scale_multi_match_cpu) {
  NEED_DEVICE();
  seed(33);
  const int64_t n[4] = {1001, 0, 37, 5000};
  float *x[4], *dx[4];
  double want = 0.0;
  for (int i = 0; i < 4; i++) {
    x[i] = host_normal(n[i], 1.0f);
    dx[i] = (float *)dev_alloc((size_t)(n[i] + 1) * 4) + (i == 2); /* one at an odd offset */
    OK(weft_cuda_memcpy(dx[i], x[i], (size_t)n[i] * 4, WEFT_COPY_H2D));
    want += weft_sumsq(x[i], n[i]);
  }
  double got = NAN;
  OK(weft_cuda_sumsq_multi((const float *const *)dx, n, 4, &got));
  cr_assert(fabs(got - want) <= 1e-12 * want, "sumsq %.17g vs %.17g", got, want);
  OK(weft_cuda_scale_multi(dx, n, 4, 0.37f));
  for (int i = 0; i < 4; i++) {
    weft_scale_f32(x[i], n[i], 0.37f);
    expect_dev(dx[i], x[i], n[i], 0.0, "scale (one multiply: exact)");
  }
  OK(weft_cuda_sumsq_multi((const float *const *)dx, n, 0, &got));
  cr_assert_eq(got, 0.0, "no tensors: 0");
  int64_t bad[2] = {3, -4};
  expect_error(weft_cuda_sumsq_multi((const float *const *)dx, bad, 2, &got), WEFT_ERR_INVALID,
               "n[1] = -4", "negative n");
  float *nul[2] = {dx[0], NULL};
  int64_t two[2] = {3, 4};
  expect_error(weft_cuda_scale_multi(nul, two, 2, 2.0f), WEFT_ERR_INVALID, "x[1] is NULL",
               "NULL tensor");
  expect_error(weft_cuda_scale_multi(dx, n, -1, 2.0f), WEFT_ERR_INVALID, "ntensors", "nt < 0");
}
