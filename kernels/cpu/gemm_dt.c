/* kernels/cpu/gemm_dt.c — the CPU's storage-dtype GEMM (backend.h
 * gemm_dt): C = alpha op(A) op(B) (+ beta C or + bias) with bf16 / f16
 * operands and an f32 or 16-bit C, f32 products and sums.
 *
 * Debian's OpenBLAS has no sbgemm, so the operands are widened to f32 in
 * blocks, never as whole tensors, and each block is one f32 sgemm:
 *   for each block of NB columns of C: op(B)'s k x NB block widened once;
 *     for each block of MB rows: op(A)'s MB x k block widened, C's block
 *       (f32: in place; 16-bit: an f32 block, rounded once at the end)
 *       = one sgemm over the whole k.
 * The sum over k is one sgemm's, as the widened path's (the op layer's
 * nn/mixed.c: whole operands widened, one sgemm), so a product that fits
 * one block is that path's bits, and OpenBLAS sums each element of C over
 * k the same way whatever the row and column blocks around it. The block
 * sizes keep a block of B under BLOCK_FLOATS floats and one of A or C
 * under BLOCK_FLOATS / 4 but at MIN_ROWS rows (fewer, larger sgemm calls:
 * OpenBLAS packs all of B's block again in every call): op(A) is widened
 * ceil(n / NB) times, op(B) once. */
#include <stdlib.h>
#include <string.h>

#include "arg_checks.h"
#include "cpu_internal.h"
#include "pool.h"

#define BLOCK_FLOATS ((int64_t)1 << 24) /* 64 MiB of widened B */
#define MIN_ROWS 256                    /* rows of A and C per sgemm at least */

/* Between dense f32 (rows x cols) and rows [r0, r0 + rows) x columns [c0,
 * c0 + cols) of a row-major matrix of dtype dt with leading dim ld:
 * widened from the matrix (widen) or rounded into it, rows split over the
 * CPU threads. */
typedef struct block_args {
  float *f32;
  char *mat;
  weft_dtype dt;
  bool widen;
  int64_t ld, r0, c0, cols;
} block_args;

static void block_rows(void *ctx, int64_t lo, int64_t hi) {
  const block_args *a = ctx;
  const size_t es = weft_dtype_size(a->dt);
  for (int64_t r = lo; r < hi; r++) {
    char *m = a->mat + (size_t)((a->r0 + r) * a->ld + a->c0) * es;
    if (a->widen)
      weft_cpu_to_f32_(a->f32 + r * a->cols, m, a->dt, a->cols);
    else
      weft_cpu_from_f32_(m, a->dt, a->f32 + r * a->cols, a->cols);
  }
}

static void convert_block(float *f32, const void *mat, weft_dtype dt, bool widen, int64_t ld,
                          int64_t r0, int64_t c0, int64_t rows, int64_t cols) {
  block_args a = {f32, (char *)mat, dt, widen, ld, r0, c0, cols};
  weft_cpu_par_range_(rows, weft_cpu_row_grain_(cols), block_rows, &a);
}

static void widen_block(float *dst, const void *src, weft_dtype dt, int64_t ld, int64_t r0,
                        int64_t c0, int64_t rows, int64_t cols) {
  convert_block(dst, src, dt, true, ld, r0, c0, rows, cols);
}

/* Every row of the dense f32 block (rows x cols, leading dim ld) set to
 * bias[c0 .. c0 + cols) (dtype dt). */
static void bias_rows_f32(float *dst, int64_t ld, const void *bias, weft_dtype dt, int64_t c0,
                          int64_t rows, int64_t cols) {
  if (rows == 0) return;
  weft_cpu_to_f32_(dst, (const char *)bias + (size_t)c0 * weft_dtype_size(dt), dt, cols);
  for (int64_t r = 1; r < rows; r++) memcpy(dst + r * ld, dst, (size_t)cols * sizeof(float));
}

weft_status weft_cpu_gemm_dt_(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                              weft_dtype ab_dt, const void *a, int64_t lda, const void *b,
                              int64_t ldb, float beta, weft_dtype c_dt, void *c, int64_t ldc,
                              const void *bias) {
  const char *op = "gemm_dt";
  WEFT_RETURN_IF_BAD_(
      weft_check_gemm_dt_(op, ta, tb, m, n, k, ab_dt, lda, ldb, beta, c_dt, ldc, bias));
  if (m == 0 || n == 0) return WEFT_OK;
  const bool reads_ab = k > 0 && alpha != 0.0f;
  if (!c || (reads_ab && (!a || !b)))
    return weft_error_at(WEFT_ERR_INVALID, op, "NULL matrix pointer");
  if (ab_dt == WEFT_F32 && c_dt == WEFT_F32 && !bias)
    return weft_cpu_sgemm_(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  /* block sizes: B's k x NB block under BLOCK_FLOATS, A's and C's blocks
   * of MB rows under a quarter of that */
  const int64_t kk = k > 0 ? k : 1;
  int64_t NB = BLOCK_FLOATS / kk, MB = BLOCK_FLOATS / 4 / (kk > n ? kk : n);
  NB = NB < 64 ? 64 : NB > n ? n : NB;
  MB = MB < MIN_ROWS ? MIN_ROWS : MB > m ? m : MB;
  const bool wide_ab = ab_dt != WEFT_F32 && reads_ab, wide_c = c_dt != WEFT_F32;
  /* the blocks B | A | C in the kept partials block (pool.h: a steady
   * state allocates nothing; a fresh malloc'd one would fault its pages
   * in on every call) */
  const int64_t nbf = wide_ab ? kk * NB : 0, naf = wide_ab ? MB * kk : 0,
                ncf = wide_c ? MB * NB : 0;
  double *block = NULL;
  weft_status st = weft_cpu_partials_get_((nbf + naf + ncf + 1) / 2 + 1, &block);
  if (st != WEFT_OK)
    return weft_error_at(WEFT_ERR_OOM, op, "no memory for the widened blocks (%lld x %lld, k %lld)",
                         (long long)MB, (long long)NB, (long long)k);
  float *pb = (float *)block, *pa = pb + nbf, *pc = pa + naf;
  for (int64_t j0 = 0; st == WEFT_OK && j0 < n; j0 += NB) {
    const int64_t nb = n - j0 < NB ? n - j0 : NB;
    /* op(B)'s columns [j0, j0 + nb): stored (k x n) columns, or (n x k) rows */
    const void *bb = NULL;
    int64_t ldbb = 0;
    if (reads_ab) {
      if (wide_ab) {
        if (tb)
          widen_block(pb, b, ab_dt, ldb, j0, 0, nb, k);
        else
          widen_block(pb, b, ab_dt, ldb, 0, j0, k, nb);
        bb = pb;
        ldbb = tb ? k : nb;
      } else {
        bb = (const float *)b + (tb ? j0 * ldb : j0);
        ldbb = ldb;
      }
    }
    for (int64_t i0 = 0; st == WEFT_OK && i0 < m; i0 += MB) {
      const int64_t mb = m - i0 < MB ? m - i0 : MB;
      const void *aa = NULL;
      int64_t ldaa = 0;
      if (reads_ab) {
        if (wide_ab) {
          if (ta)
            widen_block(pa, a, ab_dt, lda, 0, i0, k, mb);
          else
            widen_block(pa, a, ab_dt, lda, i0, 0, mb, k);
          aa = pa;
          ldaa = ta ? mb : k;
        } else {
          aa = (const float *)a + (ta ? i0 : i0 * lda);
          ldaa = lda;
        }
      }
      float *cc;
      int64_t ldcc;
      float b2 = beta;
      if (wide_c) {
        cc = pc;
        ldcc = nb;
        if (bias) {
          bias_rows_f32(cc, ldcc, bias, c_dt, j0, mb, nb);
          b2 = 1.0f;
        } else if (beta != 0.0f) {
          widen_block(cc, c, c_dt, ldc, i0, j0, mb, nb);
        }
      } else {
        cc = (float *)c + i0 * ldc + j0;
        ldcc = ldc;
        if (bias) {
          bias_rows_f32(cc, ldcc, bias, c_dt, j0, mb, nb);
          b2 = 1.0f;
        }
      }
      /* without A and B read (k 0 or alpha 0): C = beta C (+ bias) */
      st = weft_cpu_sgemm_(ta, tb, mb, nb, reads_ab ? k : 0, alpha, aa, ldaa > 0 ? ldaa : 1, bb,
                           ldbb > 0 ? ldbb : 1, b2, cc, ldcc);
      if (st == WEFT_OK && wide_c) convert_block(pc, c, c_dt, false, ldc, i0, j0, mb, nb);
    }
  }
  weft_cpu_partials_put_(block);
  return st;
}
