/* The CUDA backend's GEMMs (cuBLAS) and the f32 <-> bf16 casts.
 *
 * Row-major on column-major cuBLAS: a row-major (r x c) matrix with leading
 * dim ld is, read column-major, its transpose (c x r, same ld). So the
 * row-major C = op(A) op(B) is computed as the column-major
 *   C^T = op(B)^T op(A)^T,
 * i.e. cuBLAS gets (B, A) swapped, the same transpose flags, and (n, m, k).
 *
 * Matmul precision (the set_matmul_precision member), applied by
 * weft_cuda_sgemm and weft_cuda_sgemm_strided_batched:
 *   F32  cublasGemmEx, fp32 in/out, CUBLAS_COMPUTE_32F_PEDANTIC: plain fp32
 *        FMA whatever the handle's math mode or NVIDIA_TF32_OVERRIDE says;
 *   TF32 CUBLAS_COMPUTE_32F_FAST_TF32 on the fp32 operands (tensor cores);
 *   BF16 both operands are first rounded to bf16 by a cast kernel into the
 *        shared scratch buffer (weft_cuda_scratch_), round to nearest even
 *        exactly as weft_f32_to_bf16, then cublasGemmEx with CUDA_R_16BF
 *        inputs, fp32 C and CUBLAS_COMPUTE_32F (fp32 accumulation).
 *        Chosen over CUBLAS_COMPUTE_32F_FAST_16BF because the result is then
 *        specified bit for bit up to the accumulation order (cuBLAS does
 *        not document how FAST_16BF rounds the operands, nor whether it
 *        splits them), so the CPU reference and the emulator reproduce it;
 *        the price is one extra pass over A and B (read 4, write 2 bytes per
 *        element), small next to the GEMM for the model's shapes.
 *
 * Edge cases as weft_sgemm (BLAS): m == 0 or n == 0 does nothing; k == 0 or
 * alpha == 0 sets C = beta * C without reading A or B (beta == 0 writes
 * zeros, NaN in C does not propagate), done by a small kernel here so that
 * it does not depend on cuBLAS's handling of k == 0.
 */
#include <limits.h>
#include <stdint.h>
#include <string.h>

#include "arg_checks.h"
#include "backend_internal.h"
#include "cuda_compat.h"
#include "cuda_internal.h"
#include "cuda_kernels.h"
#include "device_util.cuh"

namespace {

/* The process-wide matmul precision (a plain int: set it before launching
 * work from other threads). */
int g_precision = WEFT_MATMUL_F32;

struct alignas(8) h4 {
  uint16_t x, y, z, w;
};

bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

/* out[i] = bf16(in[i]), i < n; 4 per thread when vec (n % 4 handled by the
 * scalar tail below the vector part). */
__global__ void cast_to_bf16_kernel(uint16_t *out, const float *in, int64_t n, bool vec) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  int64_t done = 0;
  if (vec) {
    const int64_t n4 = n / 4;
    for (int64_t j = i; j < n4; j += stride) {
      f4 v = ((const f4 *)in)[j];
      h4 h = {weft_f32_to_bf16_i_(v.x), weft_f32_to_bf16_i_(v.y), weft_f32_to_bf16_i_(v.z),
              weft_f32_to_bf16_i_(v.w)};
      ((h4 *)out)[j] = h;
    }
    done = n4 * 4;
  }
  for (int64_t j = done + i; j < n; j += stride) out[j] = weft_f32_to_bf16_i_(in[j]);
}

__global__ void cast_from_bf16_kernel(float *out, const uint16_t *in, int64_t n, bool vec) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  int64_t done = 0;
  if (vec) {
    const int64_t n4 = n / 4;
    for (int64_t j = i; j < n4; j += stride) {
      h4 h = ((const h4 *)in)[j];
      f4 v = {weft_bf16_to_f32_i_(h.x), weft_bf16_to_f32_i_(h.y), weft_bf16_to_f32_i_(h.z),
              weft_bf16_to_f32_i_(h.w)};
      ((f4 *)out)[j] = v;
    }
    done = n4 * 4;
  }
  for (int64_t j = done + i; j < n; j += stride) out[j] = weft_bf16_to_f32_i_(in[j]);
}

/* Packs nbatch row-major (rows x cols) matrices, matrix b at src + b*stride
 * with leading dim ld, into contiguous bf16: dst[(b*rows + r)*cols + c].
 * One warp (threadIdx.y) per row, lanes along the columns; vec: cols, ld,
 * stride and src are multiples of 4 floats (16 bytes). */
__global__ void pack_bf16_kernel(uint16_t *dst, const float *src, int64_t rows, int64_t cols,
                                 int64_t ld, int64_t stride, int64_t nbatch, bool vec) {
  const int64_t total = rows * nbatch;
  for (int64_t R = (int64_t)blockIdx.x * blockDim.y + threadIdx.y; R < total;
       R += (int64_t)gridDim.x * blockDim.y) {
    const int64_t b = R / rows, r = R - b * rows;
    const float *s = src + b * stride + r * ld;
    uint16_t *d = dst + R * cols;
    if (vec) {
      for (int64_t c = threadIdx.x; c < cols / 4; c += blockDim.x) {
        f4 v = ((const f4 *)s)[c];
        h4 h = {weft_f32_to_bf16_i_(v.x), weft_f32_to_bf16_i_(v.y), weft_f32_to_bf16_i_(v.z),
                weft_f32_to_bf16_i_(v.w)};
        ((h4 *)d)[c] = h;
      }
    } else {
      for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) d[c] = weft_f32_to_bf16_i_(s[c]);
    }
  }
}

/* C = beta * C (beta == 0: zeros) over nbatch (m x n) matrices, ldc,
 * stride; T float, bf16_t or f16_t (rounded once). */
template <class T>
__global__ void scale_c_kernel(T *c, int64_t m, int64_t n, int64_t ldc, int64_t stride,
                               int64_t nbatch, float beta) {
  const int64_t total = m * nbatch;
  for (int64_t R = (int64_t)blockIdx.x * blockDim.y + threadIdx.y; R < total;
       R += (int64_t)gridDim.x * blockDim.y) {
    const int64_t b = R / m, r = R - b * m;
    T *row = c + b * stride + r * ldc;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
      row[j] = from_f32<T>(beta == 0.0f ? 0.0f : beta * as_f32(row[j]));
  }
}

/* Every row of C (m x n, ldc) set to bias (n values of T). */
template <class T>
__global__ void bias_rows_kernel(T *c, const T *bias, int64_t m, int64_t n, int64_t ldc) {
  for (int64_t r = (int64_t)blockIdx.x * blockDim.y + threadIdx.y; r < m;
       r += (int64_t)gridDim.x * blockDim.y)
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) c[r * ldc + j] = bias[j];
}

/* Operand kinds of one GEMM call: f32 (the matmul precision applies) or
 * 16-bit operands used as they are. */
enum operand_kind { OPERANDS_F32, OPERANDS_BF16, OPERANDS_F16 };

template <class T>
weft_status scale_c(const char *op, T *c, int64_t m, int64_t n, int64_t ldc, int64_t sc,
                    int64_t count, float beta) {
  const double es = (double)sizeof(T);
  WEFT_COST((double)(m * n * count), (beta != 0.0f ? 2.0 * es : es) * (double)(m * n * count));
  WEFT_LAUNCH(scale_c_kernel<T>, grid_for(m * count, 8), dim3(32, 8), 0, compute_stream(), c, m, n,
              ldc, sc, count, beta);
  return weft_cuda_check_((int)cudaGetLastError(), op);
}

/* cuBLAS takes 32-bit sizes and leading dims (an extra limit of this
 * backend, after the checks every backend makes). */
weft_status check_cublas_dims(const char *op, int64_t m, int64_t n, int64_t k, int64_t lda,
                              int64_t ldb, int64_t ldc, int64_t count) {
  const int64_t dims[6] = {m, n, k, lda, ldb, ldc};
  for (int i = 0; i < 6; i++)
    if (dims[i] > INT_MAX)
      return weft_error_at(WEFT_ERR_INVALID, op,
                           "m %lld, n %lld, k %lld, lda %lld, ldb %lld, ldc %lld: cuBLAS takes "
                           "32-bit sizes (each must be <= %d)",
                           (long long)m, (long long)n, (long long)k, (long long)lda, (long long)ldb,
                           (long long)ldc, INT_MAX);
  if (count > INT_MAX)
    return weft_error_at(WEFT_ERR_INVALID, op, "batch count %lld is more than cuBLAS's %d",
                         (long long)count, INT_MAX);
  return WEFT_OK;
}

size_t round_up_256(size_t x) { return (x + 255) & ~(size_t)255; }

/* Rounds nbatch matrices of a row-major operand (rows x cols, ld, stride)
 * to packed bf16 at dst (nbatch * rows * cols elements). */
weft_status pack_operand(const char *func, uint16_t *dst, const float *src, int64_t rows,
                         int64_t cols, int64_t ld, int64_t stride, int64_t nbatch) {
  const bool vec = cols % 4 == 0 && ld % 4 == 0 && stride % 4 == 0 && aligned16(src);
  const dim3 block(32, 8);
  WEFT_COST(0, 6.0 * (double)(rows * cols * nbatch));
  WEFT_LAUNCH(pack_bf16_kernel, grid_for(rows * nbatch, 8), block, 0, compute_stream(), dst, src,
              rows, cols, ld, stride, nbatch, vec);
  return weft_cuda_check_((int)cudaGetLastError(), func);
}

/* The one GEMM path: count row-major GEMMs C_i = alpha op(A_i) op(B_i) +
 * beta C_i. kind OPERANDS_F32: a and b are float and the matmul precision
 * applies; OPERANDS_BF16 / _F16: a and b are 16-bit. C is f32, or (c16,
 * 16-bit operands only) of the operands' dtype. batched selects
 * cublasGemmStridedBatchedEx (strides ignored otherwise). */
weft_status gemm_any(const char *func, operand_kind kind, bool batched, bool ta, bool tb, int64_t m,
                     int64_t n, int64_t k, float alpha, const void *a, int64_t lda, int64_t sa,
                     const void *b, int64_t ldb, int64_t sb, float beta, void *c, int64_t ldc,
                     int64_t sc, int64_t count, bool c16 = false) {
  /* the checks and their order are the CPU backend's (kernels/cpu/backend.c) */
  const char *op = weft_op_name_(func);
  WEFT_CHECK(weft_cuda_require_init_(func));
  WEFT_CHECK(weft_check_gemm_dims_(op, ta, tb, m, n, k, lda, ldb, ldc));
  if (batched) {
    if (count < 0)
      return weft_error_at(WEFT_ERR_INVALID, op, "negative batch count %lld", (long long)count);
    if (sa < 0 || sb < 0 || sc < 0)
      return weft_error_at(WEFT_ERR_INVALID, op,
                           "negative batch stride: stride_a %lld, stride_b %lld, stride_c %lld",
                           (long long)sa, (long long)sb, (long long)sc);
    if (count > 1 && m > 0 && n > 0 && sc < (m - 1) * ldc + n)
      return weft_error_at(WEFT_ERR_INVALID, op,
                           "stride_c %lld < %lld: the %lld x %lld C matrices (ldc %lld) of the "
                           "batch would overlap",
                           (long long)sc, (long long)((m - 1) * ldc + n), (long long)m,
                           (long long)n, (long long)ldc);
  }
  if (m == 0 || n == 0 || count == 0) return WEFT_OK;
  const bool reads_ab = k > 0 && alpha != 0.0f;
  /* note: the CPU's batched GEMM reports this from its per-matrix sgemm */
  if (!c || (reads_ab && (!a || !b)))
    return weft_error_at(WEFT_ERR_INVALID, batched ? "sgemm" : op, "NULL matrix pointer");
  WEFT_CHECK(check_cublas_dims(op, m, n, k, lda, ldb, ldc, count));
  if (!reads_ab) {
    if (!c16) return scale_c(op, (float *)c, m, n, ldc, sc, count, beta);
    if (kind == OPERANDS_BF16) return scale_c(op, (bf16_t *)c, m, n, ldc, sc, count, beta);
    return scale_c(op, (f16_t *)c, m, n, ldc, sc, count, beta);
  }

  cudaDataType_t in_type = CUDA_R_32F;
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F_PEDANTIC;
  if (kind != OPERANDS_F32) {
    in_type = kind == OPERANDS_BF16 ? CUDA_R_16BF : CUDA_R_16F;
    compute = CUBLAS_COMPUTE_32F;
  } else if (g_precision == WEFT_MATMUL_TF32) {
    compute = CUBLAS_COMPUTE_32F_FAST_TF32;
  } else if (g_precision == WEFT_MATMUL_BF16) {
    /* round both operands into the scratch buffer, then a bf16 GEMM */
    const int64_t ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
    const int64_t na = batched && sa != 0 ? count : 1, nb = batched && sb != 0 ? count : 1;
    const size_t abytes = round_up_256((size_t)(na * ar * ac) * 2);
    const size_t bbytes = (size_t)(nb * br * bc) * 2;
    void *scratch;
    WEFT_CHECK(weft_cuda_scratch_(abytes + bbytes, &scratch));
    uint16_t *pa = (uint16_t *)scratch, *pb = (uint16_t *)((char *)scratch + abytes);
    WEFT_CHECK(pack_operand(op, pa, (const float *)a, ar, ac, lda, sa, na));
    WEFT_CHECK(pack_operand(op, pb, (const float *)b, br, bc, ldb, sb, nb));
    a = pa;
    b = pb;
    lda = ac;
    ldb = bc;
    sa = na > 1 ? ar * ac : 0;
    sb = nb > 1 ? br * bc : 0;
    in_type = CUDA_R_16BF;
    compute = CUBLAS_COMPUTE_32F;
  }

  cublasHandle_t h = (cublasHandle_t)weft_cuda_cublas_handle_();
  const cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasStatus_t st;
  {
    /* the model's cost: 2mnk per product; A and B read once, C written
     * (and read when beta != 0), C in f32 */
    const int engine = in_type != CUDA_R_32F                     ? WEFT_ENGINE_BF16
                       : compute == CUBLAS_COMPUTE_32F_FAST_TF32 ? WEFT_ENGINE_TF32
                                                                 : WEFT_ENGINE_FP32;
    const double in_size = in_type != CUDA_R_32F ? 2.0 : 4.0, c_size = c16 ? 2.0 : 4.0;
    const double na = batched && sa != 0 ? (double)count : 1.0;
    const double nb = batched && sb != 0 ? (double)count : 1.0;
    const double bytes =
        in_size * ((double)m * (double)k * na + (double)k * (double)n * nb) +
        (beta != 0.0f ? 2.0 : 1.0) * c_size * (double)m * (double)n * (double)count;
    weft_device_cost_blas_(engine, batched, 2.0 * (double)m * (double)n * (double)k * (double)count,
                           bytes);
  }
  const cudaDataType_t c_type = c16 ? in_type : CUDA_R_32F;
  /* C^T (n x m) = op(B)^T (n x k) op(A)^T (k x m), column-major */
  if (batched)
    st = cublasGemmStridedBatchedEx(h, opb, opa, (int)n, (int)m, (int)k, &alpha, b, in_type,
                                    (int)ldb, (long long)sb, a, in_type, (int)lda, (long long)sa,
                                    &beta, c, c_type, (int)ldc, (long long)sc, (int)count, compute,
                                    CUBLAS_GEMM_DEFAULT);
  else
    st = cublasGemmEx(h, opb, opa, (int)n, (int)m, (int)k, &alpha, b, in_type, (int)ldb, a, in_type,
                      (int)lda, &beta, c, c_type, (int)ldc, compute, CUBLAS_GEMM_DEFAULT);
  return weft_cuda_check_cublas_((int)st, op);
}

/* n-element casts: validation shared by both directions. */
weft_status check_cast(const char *func, const void *out, const void *in, int64_t n) {
  WEFT_CHECK(weft_cuda_require_init_(func));
  const char *op = weft_op_name_(func);
  if (n < 0)
    return weft_error_at(WEFT_ERR_INVALID, op, "negative element count %lld", (long long)n);
  if (n > 0 && (!out || !in))
    return weft_error_at(WEFT_ERR_INVALID, op, "%s is NULL", !out ? "out" : "in");
  return WEFT_OK;
}

}  // namespace

extern "C" {

weft_status weft_cuda_set_matmul_precision_(weft_matmul_precision p) {
  if (p != WEFT_MATMUL_F32 && p != WEFT_MATMUL_TF32 && p != WEFT_MATMUL_BF16)
    return weft_error_at(WEFT_ERR_INVALID, "set_matmul_precision",
                         "unknown matmul precision %d (kept %d)", (int)p, g_precision);
  g_precision = (int)p;
  return WEFT_OK;
}

weft_matmul_precision weft_cuda_matmul_precision_(void) {
  return (weft_matmul_precision)g_precision;
}

weft_status weft_cuda_sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                            float alpha, const float *a, int64_t lda, const float *b, int64_t ldb,
                            float beta, float *c, int64_t ldc) {
  return gemm_any(__func__, OPERANDS_F32, false, trans_a, trans_b, m, n, k, alpha, a, lda, 0, b,
                  ldb, 0, beta, c, ldc, 0, 1);
}

weft_status weft_cuda_sgemm_strided_batched(bool trans_a, bool trans_b, int64_t m, int64_t n,
                                            int64_t k, float alpha, const float *a, int64_t lda,
                                            int64_t stride_a, const float *b, int64_t ldb,
                                            int64_t stride_b, float beta, float *c, int64_t ldc,
                                            int64_t stride_c, int64_t count) {
  return gemm_any(__func__, OPERANDS_F32, true, trans_a, trans_b, m, n, k, alpha, a, lda, stride_a,
                  b, ldb, stride_b, beta, c, ldc, stride_c, count);
}

weft_status weft_cuda_gemm_bf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                                float alpha, const uint16_t *a, int64_t lda, const uint16_t *b,
                                int64_t ldb, float beta, float *c, int64_t ldc) {
  return gemm_any(__func__, OPERANDS_BF16, false, trans_a, trans_b, m, n, k, alpha, a, lda, 0, b,
                  ldb, 0, beta, c, ldc, 0, 1);
}

/* backend.h gemm_dt: 16-bit operands as they are (cublasGemmEx, f32
 * compute), C f32 or 16-bit; a bias is first written into C's rows and the
 * GEMM adds to it (beta 1), so C is rounded once. */
weft_status weft_cuda_gemm_dt(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                              float alpha, weft_dtype ab_dt, const void *a, int64_t lda,
                              const void *b, int64_t ldb, float beta, weft_dtype c_dt, void *c,
                              int64_t ldc, const void *bias) {
  const char *op = weft_op_name_(__func__);
  WEFT_CHECK(weft_cuda_require_init_(__func__));
  WEFT_RETURN_IF_BAD_(
      weft_check_gemm_dt_(op, trans_a, trans_b, m, n, k, ab_dt, lda, ldb, beta, c_dt, ldc, bias));
  if (m == 0 || n == 0) return WEFT_OK;
  if (!c || (k > 0 && alpha != 0.0f && (!a || !b)))
    return weft_error_at(WEFT_ERR_INVALID, op, "NULL matrix pointer");
  if (bias) {
    WEFT_CHECK(check_cublas_dims(op, m, n, k, lda, ldb, ldc, 1));
    const double es = (double)weft_dtype_size(c_dt);
    WEFT_COST(0, es * (double)m * (double)n + es * (double)n);
    if (c_dt == WEFT_F32)
      WEFT_LAUNCH(bias_rows_kernel<float>, grid_for(m, 8), dim3(32, 8), 0, compute_stream(),
                  (float *)c, (const float *)bias, m, n, ldc);
    else if (c_dt == WEFT_BF16)
      WEFT_LAUNCH(bias_rows_kernel<bf16_t>, grid_for(m, 8), dim3(32, 8), 0, compute_stream(),
                  (bf16_t *)c, (const bf16_t *)bias, m, n, ldc);
    else
      WEFT_LAUNCH(bias_rows_kernel<f16_t>, grid_for(m, 8), dim3(32, 8), 0, compute_stream(),
                  (f16_t *)c, (const f16_t *)bias, m, n, ldc);
    WEFT_CHECK(weft_cuda_check_((int)cudaGetLastError(), op));
    beta = 1.0f;
  }
  const operand_kind kind = ab_dt == WEFT_F32    ? OPERANDS_F32
                            : ab_dt == WEFT_BF16 ? OPERANDS_BF16
                                                 : OPERANDS_F16;
  return gemm_any(__func__, kind, false, trans_a, trans_b, m, n, k, alpha, a, lda, 0, b, ldb, 0,
                  beta, c, ldc, 0, 1, c_dt != WEFT_F32);
}

weft_status weft_cuda_cast_f32_to_bf16(uint16_t *out, const float *in, int64_t n) {
  WEFT_CHECK(check_cast(__func__, out, in, n));
  if (n == 0) return WEFT_OK;
  const bool vec = aligned16(in) && ((uintptr_t)out & 7u) == 0;
  WEFT_COST(0, 6.0 * (double)n);
  WEFT_LAUNCH(cast_to_bf16_kernel, grid_for(vec ? (n + 3) / 4 : n, 256), 256, 0, compute_stream(),
              out, in, n, vec);
  return weft_cuda_check_((int)cudaGetLastError(), weft_op_name_(__func__));
}

weft_status weft_cuda_cast_bf16_to_f32(float *out, const uint16_t *in, int64_t n) {
  WEFT_CHECK(check_cast(__func__, out, in, n));
  if (n == 0) return WEFT_OK;
  const bool vec = aligned16(out) && ((uintptr_t)in & 7u) == 0;
  WEFT_COST(0, 6.0 * (double)n);
  WEFT_LAUNCH(cast_from_bf16_kernel, grid_for(vec ? (n + 3) / 4 : n, 256), 256, 0, compute_stream(),
              out, in, n, vec);
  return weft_cuda_check_((int)cudaGetLastError(), weft_op_name_(__func__));
}

}  // extern "C"
