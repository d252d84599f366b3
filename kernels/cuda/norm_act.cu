/* The CUDA backend's LayerNorm, pointwise activations, softmax and dropout
 * (backend version 2). Arguments, shapes and formulas are layers.h's; the
 * argument checks are arg_checks.h's, the CPU kernels' own
 * (kernels/cpu/norm_act.c), so both reject the same inputs with the same
 * first line; pointers are device pointers; everything runs on the compute
 * stream.
 *
 * How:
 * - Row operations (LayerNorm forward and dinp, softmax forward and
 *   backward) give one warp to a row (blocks of 4 warps, grid-stride over
 *   rows); the row's sums accumulate in double per lane, then in a
 *   butterfly of warp shuffles, as the CPU's accumulate in double. A lane
 *   reads and writes the same columns in every pass, so the documented
 *   aliases (out = inp) are safe.
 * - LayerNorm's dweight and dbias are column sums over the rows, done
 *   without atomics in two kernels: blocks of 32 columns x 8 row lanes sum
 *   a chunk of rows each into double partials (the 8 lanes combined in
 *   order through shared memory), then one thread per column adds its
 *   chunks' partials in chunk order and adds the sum to the gradient. The
 *   chunking depends only on N, so the result is the same bits on every
 *   run.
 * - Activations and dropout are grid-stride elementwise kernels (one
 *   instantiation per activation), fp32 with the device's float functions.
 * Everything is deterministic; results agree with the CPU to ~1e-6
 * relative (the float functions and FMA contraction differ). */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "arg_checks.h"
#include "cuda_compat.h"
#include "cuda_internal.h"
#include "cuda_kernels.h"
#include "device_util.cuh"

/* Errors name the operation ("layernorm_forward: ..."), as the CPU's do. */
#define OP weft_op_name_(__func__)

namespace {

/* The launch status, naming the operation of func. */
weft_status na_launched(const char *func) {
  return weft_cuda_check_((int)cudaGetLastError(), weft_op_name_(func));
}

#define NA_REQUIRE_INIT() WEFT_CHECK(weft_cuda_require_init_(__func__))

/* Rows per block of the warp-per-row kernels (blockDim = (32, ROWS)). */
#define ROWS 4

__device__ inline double na_warp_sum_d(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ inline float na_warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/* ------------------------------------------------------------ LayerNorm */

/* T: float, or bf16_t / f16_t (layernorm_*_dt: inp, out, weight, bias,
 * dout and dinp of that type, loaded as f32, rounded once on store; the
 * statistics and the weight / bias grads stay f32). */
template <class T>
__global__ void ln_fwd_kernel(T *out, float *mean, float *rstd, const T *inp, const T *w,
                              const T *b, int64_t N, int64_t C, float eps) {
  for (int64_t n = (int64_t)blockIdx.x * blockDim.y + threadIdx.y; n < N;
       n += (int64_t)gridDim.x * blockDim.y) {
    const T *x = inp + n * C;
    T *y = out + n * C;
    double s = 0.0;
    for (int64_t c = threadIdx.x; c < C; c += 32) s += (double)as_f32(x[c]);
    const double m = na_warp_sum_d(s) / (double)C;
    double v = 0.0;
    for (int64_t c = threadIdx.x; c < C; c += 32) {
      const double d = (double)as_f32(x[c]) - m;
      v += d * d;
    }
    v = na_warp_sum_d(v);
    const float mf = (float)m, rf = (float)(1.0 / sqrt(v / (double)C + (double)eps));
    if (threadIdx.x == 0) {
      mean[n] = mf;
      rstd[n] = rf;
    }
    for (int64_t c = threadIdx.x; c < C; c += 32) {
      const float h = (as_f32(x[c]) - mf) * rf;
      y[c] = from_f32<T>(h * (w ? as_f32(w[c]) : 1.0f) + (b ? as_f32(b[c]) : 0.0f));
    }
  }
}

/* dinp, one warp per row. */
template <class T>
__global__ void ln_bwd_dinp_kernel(T *dinp, const T *dout, const T *inp, const T *w,
                                   const float *mean, const float *rstd, int64_t N, int64_t C,
                                   bool acc) {
  for (int64_t n = (int64_t)blockIdx.x * blockDim.y + threadIdx.y; n < N;
       n += (int64_t)gridDim.x * blockDim.y) {
    const T *x = inp + n * C, *dy = dout + n * C;
    T *dx = dinp + n * C;
    const float m = mean[n], r = rstd[n];
    double sg = 0.0, sgx = 0.0;
    for (int64_t c = threadIdx.x; c < C; c += 32) {
      const float xh = mul_rn(as_f32(x[c]) - m, r),
                  g = mul_rn(as_f32(dy[c]), w ? as_f32(w[c]) : 1.0f);
      sg += (double)g;
      sgx += (double)g * (double)xh;
    }
    const float a = (float)(na_warp_sum_d(sg) / (double)C);
    const float bb = (float)(na_warp_sum_d(sgx) / (double)C);
    /* products with mul_rn: g - a fused into fma(dy, w, -a) would leave
     * dy * w's rounding error where the CPU has exactly 0 (C = 1) */
    for (int64_t c = threadIdx.x; c < C; c += 32) {
      const float xh = mul_rn(as_f32(x[c]) - m, r),
                  g = mul_rn(as_f32(dy[c]), w ? as_f32(w[c]) : 1.0f);
      const float d = mul_rn(r, g - a - mul_rn(xh, bb));
      dx[c] = from_f32<T>(acc ? as_f32(dx[c]) + d : d);
    }
  }
}

/* Pass 1 of dweight / dbias, block (32, 8), grid (column tiles of 32, row
 * chunks): pw[chunk][o] = sum over the chunk's rows of dout * xhat, pb the
 * same of dout (8 row lanes, then their 8 sums in order). */
template <class T>
__global__ void ln_colsum_partial_kernel(double *pw, double *pb, const T *dout, const T *inp,
                                         const float *mean, const float *rstd, int64_t N, int64_t C,
                                         int64_t rows_per_chunk) {
  __shared__ double shw[8][33], shb[8][33];
  const int64_t o = (int64_t)blockIdx.x * 32 + threadIdx.x;
  const int64_t r0 = (int64_t)blockIdx.y * rows_per_chunk;
  int64_t r1 = r0 + rows_per_chunk;
  if (r1 > N) r1 = N;
  double sw = 0.0, sb = 0.0;
  if (o < C)
    for (int64_t n = r0 + threadIdx.y; n < r1; n += 8) {
      const float dy = as_f32(dout[n * C + o]), xh = (as_f32(inp[n * C + o]) - mean[n]) * rstd[n];
      sw += (double)dy * (double)xh;
      sb += (double)dy;
    }
  shw[threadIdx.y][threadIdx.x] = sw;
  shb[threadIdx.y][threadIdx.x] = sb;
  __syncthreads();
  if (threadIdx.y == 0 && o < C) {
    double tw = 0.0, tb = 0.0;
    for (int i = 0; i < 8; i++) {
      tw += shw[i][threadIdx.x];
      tb += shb[i][threadIdx.x];
    }
    pw[(int64_t)blockIdx.y * C + o] = tw;
    pb[(int64_t)blockIdx.y * C + o] = tb;
  }
}

/* Pass 2: dweight[o] += sum over chunks of pw[chunk][o] in order (dbias
 * likewise); either may be NULL. */
__global__ void ln_colsum_finish_kernel(float *dweight, float *dbias, const double *pw,
                                        const double *pb, int64_t nchunks, int64_t C) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t o = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; o < C; o += stride) {
    double sw = 0.0, sb = 0.0;
    for (int64_t k = 0; k < nchunks; k++) {
      sw += pw[k * C + o];
      sb += pb[k * C + o];
    }
    if (dweight) dweight[o] = (float)((double)dweight[o] + sw);
    if (dbias) dbias[o] = (float)((double)dbias[o] + sb);
  }
}

/* ---------------------------------------------------------- activations */

#define GELU_K 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_C 0.044715f
#define INV_SQRT2 0.7071067811865476f
#define INV_SQRT_2PI 0.3989422804014327f

template <int A>
__device__ inline float act_value(float x) {
  if (A == WEFT_ACT_GELU_TANH) return 0.5f * x * (1.0f + tanhf(GELU_K * (x + GELU_C * x * x * x)));
  if (A == WEFT_ACT_GELU_ERF) return 0.5f * x * (1.0f + erff(x * INV_SQRT2));
  if (A == WEFT_ACT_RELU) return x > 0.0f ? x : (x != x ? x : 0.0f);
  return x / (1.0f + expf(-x)); /* silu */
}

template <int A>
__device__ inline float act_grad(float x) {
  if (A == WEFT_ACT_GELU_TANH) {
    const float t = tanhf(GELU_K * (x + GELU_C * x * x * x)), sech2 = 1.0f - t * t;
    const float d2 =
        sech2 == 0.0f ? 0.0f : 0.5f * x * sech2 * GELU_K * (1.0f + 3.0f * GELU_C * x * x);
    return 0.5f * (1.0f + t) + d2;
  }
  if (A == WEFT_ACT_GELU_ERF)
    return 0.5f * (1.0f + erff(x * INV_SQRT2)) + x * expf(-0.5f * x * x) * INV_SQRT_2PI;
  if (A == WEFT_ACT_RELU) return x > 0.0f ? 1.0f : 0.0f;
  const float s = 1.0f / (1.0f + expf(-x)); /* silu */
  return s * (1.0f + x * (1.0f - s));
}

/* T: float, or bf16_t / f16_t (the _dt members): loaded as f32, computed
 * in f32, rounded once on store. */
template <int A, class T>
__global__ void act_fwd_kernel(T *out, const T *inp, int64_t n) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = from_f32<T>(act_value<A>(as_f32(inp[i])));
}

template <int A, class T>
__global__ void act_bwd_kernel(T *dinp, const T *dout, const T *inp, int64_t n, bool acc) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float d = as_f32(dout[i]) * act_grad<A>(as_f32(inp[i]));
    dinp[i] = from_f32<T>(acc ? as_f32(dinp[i]) + d : d);
  }
}

/* -------------------------------------------------------------- softmax */

/* T: float, or bf16_t / f16_t (softmax_*_dt): loaded as f32, rounded
 * once on store. */
template <class T>
__global__ void softmax_fwd_kernel(T *out, const T *inp, int64_t N, int64_t C) {
  for (int64_t n = (int64_t)blockIdx.x * blockDim.y + threadIdx.y; n < N;
       n += (int64_t)gridDim.x * blockDim.y) {
    const T *x = inp + n * C;
    T *y = out + n * C;
    float mx = -INFINITY;
    for (int64_t c = threadIdx.x; c < C; c += 32) mx = fmaxf(mx, as_f32(x[c]));
    mx = na_warp_max(mx);
    double s = 0.0;
    for (int64_t c = threadIdx.x; c < C; c += 32) s += (double)expf(as_f32(x[c]) - mx);
    const float inv = (float)(1.0 / na_warp_sum_d(s));
    for (int64_t c = threadIdx.x; c < C; c += 32) y[c] = from_f32<T>(expf(as_f32(x[c]) - mx) * inv);
  }
}

template <class T>
__global__ void softmax_bwd_kernel(T *dinp, const T *dout, const T *out, int64_t N, int64_t C,
                                   bool acc) {
  for (int64_t n = (int64_t)blockIdx.x * blockDim.y + threadIdx.y; n < N;
       n += (int64_t)gridDim.x * blockDim.y) {
    const T *dy = dout + n * C, *y = out + n * C;
    T *dx = dinp + n * C;
    double s = 0.0;
    for (int64_t c = threadIdx.x; c < C; c += 32) s += (double)as_f32(dy[c]) * (double)as_f32(y[c]);
    const float sf = (float)na_warp_sum_d(s);
    for (int64_t c = threadIdx.x; c < C; c += 32) {
      const float d = as_f32(y[c]) * (as_f32(dy[c]) - sf);
      dx[c] = from_f32<T>(acc ? as_f32(dx[c]) + d : d);
    }
  }
}

/* -------------------------------------------------------------- dropout */

/* T: float, or bf16_t / f16_t (dropout_apply_dt), the uniforms f32 */
template <class T>
__global__ void dropout_kernel(T *out, const T *inp, const float *u, float p, float s, int64_t n) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = from_f32<T>(u[i] >= p ? as_f32(inp[i]) * s : 0.0f);
}

}  // namespace

/* ------------------------------------------------------------ LayerNorm */

template <class T>
static weft_status ln_forward_impl(const char *func, T *out, float *mean, float *rstd, const T *inp,
                                   const T *weight, const T *bias, int64_t N, int64_t C,
                                   float eps) {
  const double es = (double)sizeof(T);
  WEFT_COST(8.0 * (double)N * (double)C,
            2.0 * es * (double)N * (double)C + 2.0 * es * (double)C + 8.0 * (double)N);
  WEFT_LAUNCH(ln_fwd_kernel<T>, grid_for(N, ROWS), dim3(32, ROWS), 0, compute_stream(), out, mean,
              rstd, inp, weight, bias, N, C, eps);
  return na_launched(func);
}

template <class T>
static weft_status ln_backward_impl(const char *func, T *dinp, float *dweight, float *dbias,
                                    const T *dout, const T *inp, const T *weight, const float *mean,
                                    const float *rstd, int64_t N, int64_t C, bool accumulate_dinp) {
  const double es = (double)sizeof(T);
  cudaStream_t s = compute_stream();
  if (dinp) {
    WEFT_COST(8.0 * (double)N * (double)C,
              (accumulate_dinp ? 4.0 : 3.0) * es * (double)N * (double)C + 2.0 * es * (double)C +
                  8.0 * (double)N);
    WEFT_LAUNCH(ln_bwd_dinp_kernel<T>, grid_for(N, ROWS), dim3(32, ROWS), 0, s, dinp, dout, inp,
                weight, mean, rstd, N, C, accumulate_dinp);
    WEFT_CHECK(na_launched(func));
  }
  if (dweight || dbias) {
    /* at least 256 rows per chunk and at most 256 chunks, so the partials
     * (2 doubles per chunk and column) stay small for any N */
    int64_t rows_per_chunk = (N + 255) / 256;
    if (rows_per_chunk < 256) rows_per_chunk = 256;
    const int64_t nchunks = (N + rows_per_chunk - 1) / rows_per_chunk;
    void *scratch;
    WEFT_CHECK(weft_cuda_scratch_((size_t)(2 * nchunks * C) * sizeof(double), &scratch));
    double *pw = (double *)scratch, *pb = pw + nchunks * C;
    WEFT_COST(4.0 * (double)N * (double)C,
              2.0 * es * (double)N * (double)C + 8.0 * (double)N + 16.0 * (double)(nchunks * C));
    WEFT_LAUNCH(ln_colsum_partial_kernel<T>, dim3((unsigned)((C + 31) / 32), (unsigned)nchunks),
                dim3(32, 8), 0, s, pw, pb, dout, inp, mean, rstd, N, C, rows_per_chunk);
    WEFT_CHECK(na_launched(func));
    WEFT_COST(2.0 * (double)(nchunks * C), 16.0 * (double)(nchunks * C) + 16.0 * (double)C);
    WEFT_LAUNCH(ln_colsum_finish_kernel, grid_for(C, 256), 256, 0, s, dweight, dbias, pw, pb,
                nchunks, C);
    WEFT_CHECK(na_launched(func));
  }
  return WEFT_OK;
}

weft_status weft_cuda_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                                        const float *weight, const float *bias, int64_t N,
                                        int64_t C, float eps) {
  NA_REQUIRE_INIT();
  WEFT_CHECK_ARGS_(weft_check_layernorm_forward_(OP, out, mean, rstd, inp, N, C, eps));
  if (N == 0) return WEFT_OK;
  return ln_forward_impl(__func__, out, mean, rstd, inp, weight, bias, N, C, eps);
}

weft_status weft_cuda_layernorm_backward(float *dinp, float *dweight, float *dbias,
                                         const float *dout, const float *inp, const float *weight,
                                         const float *mean, const float *rstd, int64_t N, int64_t C,
                                         bool accumulate_dinp) {
  NA_REQUIRE_INIT();
  WEFT_CHECK_ARGS_(weft_check_layernorm_backward_(OP, dout, inp, mean, rstd, N, C));
  if (N == 0) return WEFT_OK;
  return ln_backward_impl(__func__, dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C,
                          accumulate_dinp);
}

weft_status weft_cuda_layernorm_forward_dt(weft_dtype dt, void *out, float *mean, float *rstd,
                                           const void *inp, const void *weight, const void *bias,
                                           int64_t N, int64_t C, float eps) {
  NA_REQUIRE_INIT();
  WEFT_CHECK_STORAGE_DT_(OP, dt);
  WEFT_CHECK_ARGS_(weft_check_layernorm_forward_(OP, (const float *)out, mean, rstd,
                                                 (const float *)inp, N, C, eps));
  if (N == 0) return WEFT_OK;
  if (dt == WEFT_F32)
    return ln_forward_impl(__func__, (float *)out, mean, rstd, (const float *)inp,
                           (const float *)weight, (const float *)bias, N, C, eps);
  if (dt == WEFT_BF16)
    return ln_forward_impl(__func__, (bf16_t *)out, mean, rstd, (const bf16_t *)inp,
                           (const bf16_t *)weight, (const bf16_t *)bias, N, C, eps);
  return ln_forward_impl(__func__, (f16_t *)out, mean, rstd, (const f16_t *)inp,
                         (const f16_t *)weight, (const f16_t *)bias, N, C, eps);
}

weft_status weft_cuda_layernorm_backward_dt(weft_dtype dt, void *dinp, float *dweight, float *dbias,
                                            const void *dout, const void *inp, const void *weight,
                                            const float *mean, const float *rstd, int64_t N,
                                            int64_t C, bool accumulate_dinp) {
  NA_REQUIRE_INIT();
  WEFT_CHECK_STORAGE_DT_(OP, dt);
  WEFT_CHECK_ARGS_(weft_check_layernorm_backward_(OP, (const float *)dout, (const float *)inp, mean,
                                                  rstd, N, C));
  if (N == 0) return WEFT_OK;
  if (dt == WEFT_F32)
    return ln_backward_impl(__func__, (float *)dinp, dweight, dbias, (const float *)dout,
                            (const float *)inp, (const float *)weight, mean, rstd, N, C,
                            accumulate_dinp);
  if (dt == WEFT_BF16)
    return ln_backward_impl(__func__, (bf16_t *)dinp, dweight, dbias, (const bf16_t *)dout,
                            (const bf16_t *)inp, (const bf16_t *)weight, mean, rstd, N, C,
                            accumulate_dinp);
  return ln_backward_impl(__func__, (f16_t *)dinp, dweight, dbias, (const f16_t *)dout,
                          (const f16_t *)inp, (const f16_t *)weight, mean, rstd, N, C,
                          accumulate_dinp);
}

/* ---------------------------------------------------------- activations */

/* One launch of the activation kernels for storage type T. */
template <class T>
static void act_forward_launch(weft_activation act, unsigned grid, cudaStream_t s, T *out,
                               const T *inp, int64_t n) {
  switch (act) {
    case WEFT_ACT_GELU_TANH:
      WEFT_LAUNCH((act_fwd_kernel<WEFT_ACT_GELU_TANH, T>), grid, 256, 0, s, out, inp, n);
      break;
    case WEFT_ACT_GELU_ERF:
      WEFT_LAUNCH((act_fwd_kernel<WEFT_ACT_GELU_ERF, T>), grid, 256, 0, s, out, inp, n);
      break;
    case WEFT_ACT_RELU:
      WEFT_LAUNCH((act_fwd_kernel<WEFT_ACT_RELU, T>), grid, 256, 0, s, out, inp, n);
      break;
    default:
      WEFT_LAUNCH((act_fwd_kernel<WEFT_ACT_SILU, T>), grid, 256, 0, s, out, inp, n);
      break;
  }
}

template <class T>
static void act_backward_launch(weft_activation act, unsigned grid, cudaStream_t s, T *dinp,
                                const T *dout, const T *inp, int64_t n, bool acc) {
  switch (act) {
    case WEFT_ACT_GELU_TANH:
      WEFT_LAUNCH((act_bwd_kernel<WEFT_ACT_GELU_TANH, T>), grid, 256, 0, s, dinp, dout, inp, n,
                  acc);
      break;
    case WEFT_ACT_GELU_ERF:
      WEFT_LAUNCH((act_bwd_kernel<WEFT_ACT_GELU_ERF, T>), grid, 256, 0, s, dinp, dout, inp, n, acc);
      break;
    case WEFT_ACT_RELU:
      WEFT_LAUNCH((act_bwd_kernel<WEFT_ACT_RELU, T>), grid, 256, 0, s, dinp, dout, inp, n, acc);
      break;
    default:
      WEFT_LAUNCH((act_bwd_kernel<WEFT_ACT_SILU, T>), grid, 256, 0, s, dinp, dout, inp, n, acc);
      break;
  }
}

weft_status weft_cuda_activation_forward(weft_activation act, float *out, const float *inp,
                                         int64_t n) {
  NA_REQUIRE_INIT();
  WEFT_CHECK_ARGS_(weft_check_activation_forward_(OP, act, out, inp, n));
  if (n == 0) return WEFT_OK;
  WEFT_COST(8.0 * (double)n, 8.0 * (double)n);
  act_forward_launch(act, grid_for(n, 256), compute_stream(), out, inp, n);
  return na_launched(__func__);
}

weft_status weft_cuda_activation_backward(weft_activation act, float *dinp, const float *dout,
                                          const float *inp, int64_t n, bool accumulate) {
  NA_REQUIRE_INIT();
  WEFT_CHECK_ARGS_(weft_check_activation_backward_(OP, act, dinp, dout, inp, n));
  if (n == 0) return WEFT_OK;
  WEFT_COST(12.0 * (double)n, (accumulate ? 16.0 : 12.0) * (double)n);
  act_backward_launch(act, grid_for(n, 256), compute_stream(), dinp, dout, inp, n, accumulate);
  return na_launched(__func__);
}

weft_status weft_cuda_activation_forward_dt(weft_activation act, weft_dtype dt, void *out,
                                            const void *inp, int64_t n) {
  NA_REQUIRE_INIT();
  WEFT_CHECK_STORAGE_DT_(OP, dt);
  if (dt == WEFT_F32) return weft_cuda_activation_forward(act, (float *)out, (const float *)inp, n);
  WEFT_CHECK_ARGS_(
      weft_check_activation_forward_(OP, act, (const float *)out, (const float *)inp, n));
  if (n == 0) return WEFT_OK;
  WEFT_COST(8.0 * (double)n, 4.0 * (double)n);
  const unsigned grid = grid_for(n, 256);
  if (dt == WEFT_BF16)
    act_forward_launch(act, grid, compute_stream(), (bf16_t *)out, (const bf16_t *)inp, n);
  else
    act_forward_launch(act, grid, compute_stream(), (f16_t *)out, (const f16_t *)inp, n);
  return na_launched(__func__);
}

weft_status weft_cuda_activation_backward_dt(weft_activation act, weft_dtype dt, void *dinp,
                                             const void *dout, const void *inp, int64_t n,
                                             bool accumulate) {
  NA_REQUIRE_INIT();
  WEFT_CHECK_STORAGE_DT_(OP, dt);
  if (dt == WEFT_F32)
    return weft_cuda_activation_backward(act, (float *)dinp, (const float *)dout,
                                         (const float *)inp, n, accumulate);
  WEFT_CHECK_ARGS_(weft_check_activation_backward_(OP, act, (const float *)dinp,
                                                   (const float *)dout, (const float *)inp, n));
  if (n == 0) return WEFT_OK;
  WEFT_COST(12.0 * (double)n, (accumulate ? 8.0 : 6.0) * (double)n);
  const unsigned grid = grid_for(n, 256);
  if (dt == WEFT_BF16)
    act_backward_launch(act, grid, compute_stream(), (bf16_t *)dinp, (const bf16_t *)dout,
                        (const bf16_t *)inp, n, accumulate);
  else
    act_backward_launch(act, grid, compute_stream(), (f16_t *)dinp, (const f16_t *)dout,
                        (const f16_t *)inp, n, accumulate);
  return na_launched(__func__);
}

/* -------------------------------------------------------------- softmax */

weft_status weft_cuda_softmax_forward(float *out, const float *inp, int64_t N, int64_t C) {
  NA_REQUIRE_INIT();
  WEFT_CHECK_ARGS_(weft_check_softmax_forward_(OP, out, inp, N, C));
  if (N == 0) return WEFT_OK;
  WEFT_COST(4.0 * (double)N * (double)C, 12.0 * (double)N * (double)C);
  WEFT_LAUNCH(softmax_fwd_kernel<float>, grid_for(N, ROWS), dim3(32, ROWS), 0, compute_stream(),
              out, inp, N, C);
  return na_launched(__func__);
}

weft_status weft_cuda_softmax_backward(float *dinp, const float *dout, const float *out, int64_t N,
                                       int64_t C, bool accumulate) {
  NA_REQUIRE_INIT();
  WEFT_CHECK_ARGS_(weft_check_softmax_backward_(OP, dinp, dout, out, N, C));
  if (N == 0) return WEFT_OK;
  WEFT_COST(4.0 * (double)N * (double)C, (accumulate ? 16.0 : 12.0) * (double)N * (double)C);
  WEFT_LAUNCH(softmax_bwd_kernel<float>, grid_for(N, ROWS), dim3(32, ROWS), 0, compute_stream(),
              dinp, dout, out, N, C, accumulate);
  return na_launched(__func__);
}

weft_status weft_cuda_softmax_forward_dt(weft_dtype dt, void *out, const void *inp, int64_t N,
                                         int64_t C) {
  NA_REQUIRE_INIT();
  WEFT_CHECK_STORAGE_DT_(OP, dt);
  if (dt == WEFT_F32) return weft_cuda_softmax_forward((float *)out, (const float *)inp, N, C);
  WEFT_CHECK_ARGS_(weft_check_softmax_forward_(OP, (const float *)out, (const float *)inp, N, C));
  if (N == 0) return WEFT_OK;
  WEFT_COST(4.0 * (double)N * (double)C, 6.0 * (double)N * (double)C);
  if (dt == WEFT_BF16)
    WEFT_LAUNCH(softmax_fwd_kernel<bf16_t>, grid_for(N, ROWS), dim3(32, ROWS), 0, compute_stream(),
                (bf16_t *)out, (const bf16_t *)inp, N, C);
  else
    WEFT_LAUNCH(softmax_fwd_kernel<f16_t>, grid_for(N, ROWS), dim3(32, ROWS), 0, compute_stream(),
                (f16_t *)out, (const f16_t *)inp, N, C);
  return na_launched(__func__);
}

weft_status weft_cuda_softmax_backward_dt(weft_dtype dt, void *dinp, const void *dout,
                                          const void *out, int64_t N, int64_t C, bool accumulate) {
  NA_REQUIRE_INIT();
  WEFT_CHECK_STORAGE_DT_(OP, dt);
  if (dt == WEFT_F32)
    return weft_cuda_softmax_backward((float *)dinp, (const float *)dout, (const float *)out, N, C,
                                      accumulate);
  WEFT_CHECK_ARGS_(weft_check_softmax_backward_(OP, (const float *)dinp, (const float *)dout,
                                                (const float *)out, N, C));
  if (N == 0) return WEFT_OK;
  WEFT_COST(4.0 * (double)N * (double)C, (accumulate ? 8.0 : 6.0) * (double)N * (double)C);
  if (dt == WEFT_BF16)
    WEFT_LAUNCH(softmax_bwd_kernel<bf16_t>, grid_for(N, ROWS), dim3(32, ROWS), 0, compute_stream(),
                (bf16_t *)dinp, (const bf16_t *)dout, (const bf16_t *)out, N, C, accumulate);
  else
    WEFT_LAUNCH(softmax_bwd_kernel<f16_t>, grid_for(N, ROWS), dim3(32, ROWS), 0, compute_stream(),
                (f16_t *)dinp, (const f16_t *)dout, (const f16_t *)out, N, C, accumulate);
  return na_launched(__func__);
}

/* -------------------------------------------------------------- dropout */

weft_status weft_cuda_dropout_apply(float *out, const float *inp, const float *uniform, float p,
                                    int64_t n) {
  NA_REQUIRE_INIT();
  WEFT_CHECK_ARGS_(weft_check_dropout_(OP, out, inp, uniform, p, n));
  if (n == 0) return WEFT_OK;
  const float s = (float)(1.0 / (1.0 - (double)p)); /* the CPU's scale */
  WEFT_COST(2.0 * (double)n, 12.0 * (double)n);
  WEFT_LAUNCH(dropout_kernel<float>, grid_for(n, 256), 256, 0, compute_stream(), out, inp, uniform,
              p, s, n);
  return na_launched(__func__);
}

weft_status weft_cuda_dropout_apply_dt(weft_dtype dt, void *out, const void *inp,
                                       const float *uniform, float p, int64_t n) {
  NA_REQUIRE_INIT();
  WEFT_CHECK_STORAGE_DT_(OP, dt);
  if (dt == WEFT_F32)
    return weft_cuda_dropout_apply((float *)out, (const float *)inp, uniform, p, n);
  WEFT_CHECK_ARGS_(weft_check_dropout_(OP, (const float *)out, (const float *)inp, uniform, p, n));
  if (n == 0) return WEFT_OK;
  const float s = (float)(1.0 / (1.0 - (double)p));
  WEFT_COST(2.0 * (double)n, 8.0 * (double)n);
  if (dt == WEFT_BF16)
    WEFT_LAUNCH(dropout_kernel<bf16_t>, grid_for(n, 256), 256, 0, compute_stream(), (bf16_t *)out,
                (const bf16_t *)inp, uniform, p, s, n);
  else
    WEFT_LAUNCH(dropout_kernel<f16_t>, grid_for(n, 256), 256, 0, compute_stream(), (f16_t *)out,
                (const f16_t *)inp, uniform, p, s, n);
  return na_launched(__func__);
}
