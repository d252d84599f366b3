/* CPU GEMM: C = alpha * op(A) @ op(B) + beta * C, row-major.
 *
 * f32 and f64 go to OpenBLAS (cblas_sgemm / cblas_dgemm) when the build has
 * it (WEFT_HAVE_BLAS), else to the blocked C GEMM below; bf16 and f16 are
 * converted to f32, computed, and rounded back once (as torch does on CPU).
 * BLAS semantics for the edge cases: alpha == 0 or K == 0 leaves
 * C = beta * C without reading A or B, and beta == 0 overwrites C (NaN/inf
 * already in C do not propagate).
 */
#include <inttypes.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "arg_checks.h"
#include "backend_internal.h"
#include "cpu_internal.h"
#include "kernels.h"
#include "kernels_internal.h"
#include "pool.h"
#include "tensor_internal.h"
#include "weft_config.h"

#if WEFT_HAVE_BLAS
#include <cblas.h>
#endif

/* ------------------------------------------------ blocked fallback GEMM
 * The GotoBLAS structure (Goto & van de Geijn, "Anatomy of high-performance
 * matrix multiplication", TOMS 2008) in portable C: C is first scaled by
 * beta; then for each KC x NC panel of op(B) and MC x KC block of
 * alpha * op(A), both are packed into micro-panels (B: NR columns, A: MR
 * rows, zero-padded at the edges), and a micro-kernel keeps an MR x NR tile
 * of C in registers (GCC/Clang vector extensions, 2 vectors per row) for the
 * whole KC loop. Packed A (64 KiB for f32) stays in L2, one B micro-panel in
 * L1. */
#define GEMM_MR 4
#define GEMM_MC 64 /* multiple of MR */
#define GEMM_KC 256
#define GEMM_NC 256 /* multiple of NR */

typedef float gemm_v4f __attribute__((vector_size(16)));
typedef double gemm_v2d __attribute__((vector_size(16)));

/* NAME: function; T: scalar; V: vector of VL lanes; NR = 2 * VL. */
#define DEFINE_BLOCKED_GEMM(NAME, T, V, VL)                                                      \
  enum { NAME##_NR = 2 * (VL) };                                                                 \
  static void NAME##_scale(int64_t m, int64_t n, T beta, T *c, int64_t ldc) {                    \
    if (beta == (T)1) return;                                                                    \
    for (int64_t i = 0; i < m; i++) {                                                            \
      T *row = c + i * ldc;                                                                      \
      if (beta == (T)0)                                                                          \
        for (int64_t j = 0; j < n; j++) row[j] = (T)0;                                           \
      else                                                                                       \
        for (int64_t j = 0; j < n; j++) row[j] *= beta;                                          \
    }                                                                                            \
  }                                                                                              \
  /* C[0..mr, 0..nr) += A_panel (kb x MR) * B_panel (kb x NR) */                                 \
  static void NAME##_micro(int64_t kb, const T *ap, const T *bp, T *c, int64_t ldc, int64_t mr,  \
                           int64_t nr) {                                                         \
    V c00 = {0}, c01 = {0}, c10 = {0}, c11 = {0}, c20 = {0}, c21 = {0}, c30 = {0}, c31 = {0};    \
    for (int64_t p = 0; p < kb; p++) {                                                           \
      V b0, b1, a;                                                                               \
      memcpy(&b0, bp, sizeof b0);                                                                \
      memcpy(&b1, bp + (VL), sizeof b1);                                                         \
      a = (V){0} + ap[0];                                                                        \
      c00 += a * b0;                                                                             \
      c01 += a * b1;                                                                             \
      a = (V){0} + ap[1];                                                                        \
      c10 += a * b0;                                                                             \
      c11 += a * b1;                                                                             \
      a = (V){0} + ap[2];                                                                        \
      c20 += a * b0;                                                                             \
      c21 += a * b1;                                                                             \
      a = (V){0} + ap[3];                                                                        \
      c30 += a * b0;                                                                             \
      c31 += a * b1;                                                                             \
      ap += GEMM_MR;                                                                             \
      bp += NAME##_NR;                                                                           \
    }                                                                                            \
    T tile[GEMM_MR][NAME##_NR];                                                                  \
    memcpy(&tile[0][0], &c00, sizeof c00);                                                       \
    memcpy(&tile[0][VL], &c01, sizeof c01);                                                      \
    memcpy(&tile[1][0], &c10, sizeof c10);                                                       \
    memcpy(&tile[1][VL], &c11, sizeof c11);                                                      \
    memcpy(&tile[2][0], &c20, sizeof c20);                                                       \
    memcpy(&tile[2][VL], &c21, sizeof c21);                                                      \
    memcpy(&tile[3][0], &c30, sizeof c30);                                                       \
    memcpy(&tile[3][VL], &c31, sizeof c31);                                                      \
    for (int64_t i = 0; i < mr; i++)                                                             \
      for (int64_t j = 0; j < nr; j++) c[i * ldc + j] += tile[i][j];                             \
  }                                                                                              \
  void NAME(bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha, const T *a, int64_t lda, \
            const T *b, int64_t ldb, T beta, T *c, int64_t ldc) {                                \
    if (m <= 0 || n <= 0) return;                                                                \
    NAME##_scale(m, n, beta, c, ldc);                                                            \
    if (k <= 0 || alpha == (T)0) return;                                                         \
    T *pa = malloc(sizeof(T) * GEMM_MC * GEMM_KC);                                               \
    T *pb = malloc(sizeof(T) * GEMM_KC * GEMM_NC);                                               \
    if (!pa || !pb) {                                                                            \
      /* no scratch: an unpacked triple loop, slow but still correct */                          \
      free(pa);                                                                                  \
      free(pb);                                                                                  \
      for (int64_t i = 0; i < m; i++)                                                            \
        for (int64_t p = 0; p < k; p++) {                                                        \
          T av = alpha * (ta ? a[p * lda + i] : a[i * lda + p]);                                 \
          for (int64_t j = 0; j < n; j++)                                                        \
            c[i * ldc + j] += av * (tb ? b[j * ldb + p] : b[p * ldb + j]);                       \
        }                                                                                        \
      return;                                                                                    \
    }                                                                                            \
    const int64_t NR = NAME##_NR;                                                                \
    for (int64_t jc = 0; jc < n; jc += GEMM_NC) {                                                \
      const int64_t nb = n - jc < GEMM_NC ? n - jc : GEMM_NC;                                    \
      for (int64_t pc = 0; pc < k; pc += GEMM_KC) {                                              \
        const int64_t kb = k - pc < GEMM_KC ? k - pc : GEMM_KC;                                  \
        /* pb: micro-panel jr holds op(B)[pc + p][jc + jr + jj] at [jr * kb + p * NR + jj] */    \
        for (int64_t jr = 0; jr < nb; jr += NR) {                                                \
          T *dst = pb + jr * kb;                                                                 \
          const int64_t nr = nb - jr < NR ? nb - jr : NR;                                        \
          for (int64_t p = 0; p < kb; p++)                                                       \
            for (int64_t jj = 0; jj < NR; jj++)                                                  \
              dst[p * NR + jj] = jj >= nr ? (T)0                                                 \
                                 : tb     ? b[(jc + jr + jj) * ldb + pc + p]                     \
                                          : b[(pc + p) * ldb + jc + jr + jj];                        \
        }                                                                                        \
        for (int64_t ic = 0; ic < m; ic += GEMM_MC) {                                            \
          const int64_t mb = m - ic < GEMM_MC ? m - ic : GEMM_MC;                                \
          /* pa: micro-panel ir holds alpha * op(A)[ic + ir + ii][pc + p] at                     \
           * [ir * kb + p * MR + ii] */                                                          \
          for (int64_t ir = 0; ir < mb; ir += GEMM_MR) {                                         \
            T *dst = pa + ir * kb;                                                               \
            const int64_t mr = mb - ir < GEMM_MR ? mb - ir : GEMM_MR;                            \
            for (int64_t p = 0; p < kb; p++)                                                     \
              for (int64_t ii = 0; ii < GEMM_MR; ii++)                                           \
                dst[p * GEMM_MR + ii] = ii >= mr                                                 \
                                            ? (T)0                                               \
                                            : alpha * (ta ? a[(pc + p) * lda + ic + ir + ii]     \
                                                          : a[(ic + ir + ii) * lda + pc + p]);   \
          }                                                                                      \
          for (int64_t jr = 0; jr < nb; jr += NR)                                                \
            for (int64_t ir = 0; ir < mb; ir += GEMM_MR)                                         \
              NAME##_micro(kb, pa + ir * kb, pb + jr * kb, c + (ic + ir) * ldc + jc + jr, ldc,   \
                           mb - ir < GEMM_MR ? mb - ir : GEMM_MR, nb - jr < NR ? nb - jr : NR);  \
        }                                                                                        \
      }                                                                                          \
    }                                                                                            \
    free(pa);                                                                                    \
    free(pb);                                                                                    \
  }

DEFINE_BLOCKED_GEMM(weft_sgemm_blocked_, float, gemm_v4f, 4)
DEFINE_BLOCKED_GEMM(weft_dgemm_blocked_, double, gemm_v2d, 2)

#if WEFT_HAVE_BLAS
static bool blas_fits(int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb, int64_t ldc) {
  return m <= INT_MAX && n <= INT_MAX && k <= INT_MAX && lda <= INT_MAX && ldb <= INT_MAX &&
         ldc <= INT_MAX;
}
#endif

#if WEFT_HAVE_BLAS
/* OpenBLAS runs on 1 thread (pool.c); a GEMM of at least SGEMM_PAR_FLOPS
 * is split over the CPU threads into `parts` blocks of C's rows (or
 * columns, when C is wider than tall), each a 1-thread cblas_sgemm, block
 * edges on multiples of SGEMM_PAR_ALIGN. As with OpenBLAS's own threading,
 * the bits of C may depend on the split, so on the thread count. */
#define SGEMM_PAR_FLOPS 8388608.0 /* 2^23: ~0.1 ms on one core, well above a wake-up */
#define SGEMM_PAR_ALIGN 16

typedef struct sgemm_job {
  bool ta, tb;
  int64_t m, n, k;
  float alpha;
  const float *a;
  int64_t lda;
  const float *b;
  int64_t ldb;
  float beta;
  float *c;
  int64_t ldc;
  int parts;
  bool split_m; /* blocks of rows of C, else of columns */
} sgemm_job;

static void sgemm_part(void *ctx, int64_t i, float *scratch) {
  (void)scratch;
  const sgemm_job *j = ctx;
  const int64_t along = j->split_m ? j->m : j->n, units = along / SGEMM_PAR_ALIGN;
  const int64_t lo = i == 0 ? 0 : units * i / j->parts * SGEMM_PAR_ALIGN;
  const int64_t hi = i + 1 == j->parts ? along : units * (i + 1) / j->parts * SGEMM_PAR_ALIGN;
  const float *a = j->a, *b = j->b;
  float *c = j->c;
  int64_t m = j->m, n = j->n;
  if (j->split_m) { /* rows lo..hi of op(A) and C */
    a += j->ta ? lo : lo * j->lda;
    c += lo * j->ldc;
    m = hi - lo;
  } else { /* columns lo..hi of op(B) and C */
    b += j->tb ? lo * j->ldb : lo;
    c += lo;
    n = hi - lo;
  }
  cblas_sgemm(CblasRowMajor, j->ta ? CblasTrans : CblasNoTrans, j->tb ? CblasTrans : CblasNoTrans,
              (int)m, (int)n, (int)j->k, j->alpha, a, (int)j->lda, b, (int)j->ldb, j->beta, c,
              (int)j->ldc);
}
#endif

void weft_cpu_sgemm_run_(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                         const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                         float *c, int64_t ldc) {
  if (weft_check_gemm_dims_("sgemm", trans_a, trans_b, m, n, k, lda, ldb, ldc) != WEFT_OK) return;
  if (m == 0 || n == 0) return;
  if (k == 0 || alpha == 0.0f) {
    weft_sgemm_blocked__scale(m, n, beta, c, ldc);
    return;
  }
#if WEFT_HAVE_BLAS
  if (blas_fits(m, n, k, lda, ldb, ldc)) {
    sgemm_job j = {trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, 1, m >= n};
    const int nt = weft_cpu_num_threads();
    const int64_t along = j.split_m ? m : n;
    if (nt > 1 && 2.0 * (double)m * (double)n * (double)k >= SGEMM_PAR_FLOPS &&
        along >= 2 * SGEMM_PAR_ALIGN) {
      j.parts = nt < along / SGEMM_PAR_ALIGN ? nt : (int)(along / SGEMM_PAR_ALIGN);
      weft_cpu_par_for_(j.parts, sgemm_part, &j, NULL, 0);
      return;
    }
    sgemm_part(&j, 0, NULL);
    return;
  }
#endif
  weft_sgemm_blocked_(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

static void dgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const double *a,
                  int64_t lda, const double *b, int64_t ldb, double beta, double *c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0 || alpha == 0.0) {
    weft_dgemm_blocked__scale(m, n, beta, c, ldc);
    return;
  }
#if WEFT_HAVE_BLAS
  if (blas_fits(m, n, k, lda, ldb, ldc)) {
    cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                (int)m, (int)n, (int)k, alpha, a, (int)lda, b, (int)ldb, beta, c, (int)ldc);
    return;
  }
#endif
  weft_dgemm_blocked_(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

/* A 2-D operand as a row-major matrix: *ld its row stride; *flip set when
 * the tensor is column-major (a transposed view), which GEMM handles by
 * flipping the operand's transpose flag. */
weft_status weft_gemm_layout_(const char *func, const weft_tensor *t, const char *name,
                              bool allow_flip, int64_t *ld, bool *flip) {
  const int64_t r = t->shape[0], c = t->shape[1];
  *flip = false;
  if ((c <= 1 || t->strides[1] == 1) && (r <= 1 || t->strides[0] >= c)) {
    *ld = r <= 1 ? (c > 1 ? c : 1) : t->strides[0];
    if (*ld < 1) *ld = 1; /* no columns: nothing is read */
    return WEFT_OK;
  }
  if (allow_flip && (r <= 1 || t->strides[0] == 1) && (c <= 1 || t->strides[1] >= r)) {
    *flip = true;
    *ld = c <= 1 ? (r > 1 ? r : 1) : t->strides[1];
    if (*ld < 1) *ld = 1;
    return WEFT_OK;
  }
  char desc[256];
  weft_tensor_describe(t, desc, sizeof desc);
  return weft_error_at(WEFT_ERR_INVALID, func,
                       "%s %s has strides [%" PRId64 ", %" PRId64
                       "]: gemm needs a unit-stride "
                       "last dim and a row stride >= the row length%s",
                       name, desc, t->strides[0], t->strides[1],
                       allow_flip ? " (or a transposed view of such a matrix)" : "");
}

/* Converts the 2-D tensor t into a new contiguous f32 buffer (*buf) on its
 * device. */
static weft_status to_f32(const weft_tensor *t, weft_tensor **buf) {
  WEFT_CHECK(weft_tensor_create(WEFT_F32, t->device, 2, t->shape, buf));
  weft_status st = weft_tensor_copy(*buf, t);
  if (st != WEFT_OK) {
    weft_tensor_destroy(*buf);
    *buf = NULL;
    return weft_error_trace(st, __func__);
  }
  return WEFT_OK;
}

/* The sgemm member (weft_sgemm's CPU table entry): weft_cpu_sgemm_run_
 * with a status. */
weft_status weft_cpu_sgemm_(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                            float alpha, const float *a, int64_t lda, const float *b, int64_t ldb,
                            float beta, float *c, int64_t ldc) {
  WEFT_CHECK(weft_check_gemm_dims_("sgemm", trans_a, trans_b, m, n, k, lda, ldb, ldc));
  if (m > 0 && n > 0 && (!c || (k > 0 && alpha != 0.0f && (!a || !b))))
    return weft_error_at(WEFT_ERR_INVALID, "sgemm", "NULL matrix pointer");
  weft_cpu_sgemm_run_(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  return WEFT_OK;
}

weft_status weft_gemm_via_f32_(bool trans_a, bool trans_b, float alpha, const weft_tensor *a,
                               const weft_tensor *b, float beta, weft_tensor *c) {
  const weft_device dev = c->device;
  const int64_t m = trans_a ? a->shape[1] : a->shape[0];
  const int64_t k = trans_a ? a->shape[0] : a->shape[1];
  const int64_t n = trans_b ? b->shape[0] : b->shape[1];
  weft_tensor *fa = NULL, *fb = NULL, *fc = NULL;
  weft_status st = WEFT_OK;
  WEFT_CHECK_GOTO(to_f32(a, &fa), st, done);
  WEFT_CHECK_GOTO(to_f32(b, &fb), st, done);
  if (beta != 0.0f) {
    WEFT_CHECK_GOTO(to_f32(c, &fc), st, done);
  } else {
    WEFT_CHECK_GOTO(weft_tensor_create(WEFT_F32, dev, 2, c->shape, &fc), st, done);
  }
  WEFT_CHECK_GOTO(weft_backend_sgemm(dev, trans_a, trans_b, m, n, k, alpha, fa->data,
                                     fa->shape[1] > 0 ? fa->shape[1] : 1, fb->data,
                                     fb->shape[1] > 0 ? fb->shape[1] : 1, beta, fc->data, n),
                  st, done);
  WEFT_CHECK_GOTO(weft_tensor_copy(c, fc), st, done);
done:
  weft_tensor_destroy(fa); /* on a device: stream-ordered, reused only after the GEMM */
  weft_tensor_destroy(fb);
  weft_tensor_destroy(fc);
  return st;
}

/* The gemm member; arguments checked by weft_gemm. */
weft_status weft_cpu_gemm_(bool trans_a, bool trans_b, float alpha, const weft_tensor *a,
                           const weft_tensor *b, float beta, weft_tensor *c) {
  const weft_dtype dt = a->dtype;
  const int64_t m = trans_a ? a->shape[1] : a->shape[0];
  const int64_t k = trans_a ? a->shape[0] : a->shape[1];
  const int64_t n = trans_b ? b->shape[0] : b->shape[1];
  if (m == 0 || n == 0) return WEFT_OK;
  if (dt == WEFT_BF16 || dt == WEFT_F16)
    return weft_gemm_via_f32_(trans_a, trans_b, alpha, a, b, beta, c);

  int64_t lda, ldb, ldc;
  bool fa, fb, fc;
  WEFT_CHECK(weft_gemm_layout_("weft_gemm", a, "A", true, &lda, &fa));
  WEFT_CHECK(weft_gemm_layout_("weft_gemm", b, "B", true, &ldb, &fb));
  WEFT_CHECK(weft_gemm_layout_("weft_gemm", c, "C", false, &ldc, &fc));
  const bool ta = trans_a != fa, tb = trans_b != fb;
  if (dt == WEFT_F32)
    weft_cpu_sgemm_run_(ta, tb, m, n, k, alpha, a->data, lda, b->data, ldb, beta, c->data, ldc);
  else
    dgemm(ta, tb, m, n, k, alpha, a->data, lda, b->data, ldb, beta, c->data, ldc);
  return WEFT_OK;
}
