/* The CUDA backend's layer kernels: embedding (whole and vocab range),
 * linear, RMSNorm, RoPE, SwiGLU, residual, cross-entropy (whole and the
 * loss-parallel pieces). Arguments, shapes and formulas are layers.h's;
 * pointers are device pointers; everything runs on the compute stream.
 *
 * How, and where it differs from the CPU kernels:
 * - Argument checks are the CPU ones. Token and target ids live on the
 *   device, so they are checked there: a small kernel records the first
 *   offending index in a device flag (atomicMax of N - n), the flag is
 *   copied back (this synchronizes the compute stream), and the bad id is
 *   fetched for the message; only then does the kernel proper run, so
 *   nothing is written on an error, as on the CPU. Functions taking ids
 *   therefore wait for the stream; ids arrays are limited to N < 2^32.
 * - Row reductions (RMSNorm, softmax sums) accumulate in fp32, per thread
 *   and then in a tree (warp shuffles, then across warps in a fixed order),
 *   instead of the CPU's double; the sharded sumexp and the loss sums use
 *   double. Results agree with the CPU to ~1e-6 relative.
 * - Deterministic everywhere: embedding backward gathers each vocabulary
 *   row's tokens in order (no atomics; the CPU's bits), and column sums
 *   (dbias, RMSNorm's dweight) go through per-block partials and a second
 *   kernel that adds them in a fixed order.
 */
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "arg_checks.h"
#include "cuda_compat.h"
#include "cuda_internal.h"
#include "cuda_kernels.h"
#include "device_util.cuh"

/* Errors name the operation, as the CPU kernels' do (kernels/cpu/):
 * "rmsnorm_forward: ...", not the C function. */
#undef weft_error
#define weft_error(st, ...) weft_error_at((st), weft_op_name_(__func__), __VA_ARGS__)

namespace {

/* ------------------------------------------------------------ helpers */

struct alignas(8) f2 {
  float x, y;
};

bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }
size_t round_up_256(size_t x) { return (x + 255) & ~(size_t)255; }

/* The launch status, naming the operation of func. */
weft_status launched(const char *func) {
  return weft_cuda_check_((int)cudaGetLastError(), weft_op_name_(func));
}

#define REQUIRE_INIT() WEFT_CHECK(weft_cuda_require_init_(__func__))

__device__ inline float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ inline double warp_sum_d(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ inline float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/* Sum over a 1-D block (blockDim.x a multiple of 32, at most 1024): warp
 * trees, then the warp sums in order. sh holds 32 floats; every thread of
 * the block must call it and gets the sum. */
__device__ inline float block_sum(float v, float *sh) {
  const unsigned lane = threadIdx.x % 32, w = threadIdx.x / 32, nw = blockDim.x / 32;
  v = warp_sum(v);
  if (lane == 0) sh[w] = v;
  __syncthreads();
  float s = 0.0f;
  for (unsigned i = 0; i < nw; i++) s += sh[i];
  __syncthreads(); /* sh is reused by the next call */
  return s;
}
__device__ inline double block_sum_d(double v, double *sh) {
  const unsigned lane = threadIdx.x % 32, w = threadIdx.x / 32, nw = blockDim.x / 32;
  v = warp_sum_d(v);
  if (lane == 0) sh[w] = v;
  __syncthreads();
  double s = 0.0;
  for (unsigned i = 0; i < nw; i++) s += sh[i];
  __syncthreads();
  return s;
}
__device__ inline float block_max(float v, float *sh) {
  const unsigned lane = threadIdx.x % 32, w = threadIdx.x / 32, nw = blockDim.x / 32;
  v = warp_max(v);
  if (lane == 0) sh[w] = v;
  __syncthreads();
  float m = -INFINITY;
  for (unsigned i = 0; i < nw; i++) m = fmaxf(m, sh[i]);
  __syncthreads();
  return m;
}

/* ------------------------------------------------------------ id checks */

/* flag = max over bad n of (N - n): the first bad index is N - flag. An id
 * is bad when < 0 or (hi >= 0) >= hi. */
__global__ void check_ids_kernel(unsigned *flag, const int32_t *ids, int64_t N, int64_t hi) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t n = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; n < N; n += stride) {
    const int32_t t = ids[n];
    if (t < 0 || (hi >= 0 && t >= hi)) atomicMax(flag, (unsigned)(N - n));
  }
}

/* WEFT_ERR_INVALID naming the first id outside [0, hi) (hi < 0: the first
 * negative one), with the CPU kernels' messages ("embedding_forward:
 * tokens[3] = 9 is outside the vocabulary [0, 8)"); waits for the stream. */
weft_status check_ids(const char *func, const char *name, const int32_t *ids, int64_t N,
                      int64_t hi) {
  func = weft_op_name_(func);
  if (N == 0) return WEFT_OK;
  if (N > (int64_t)UINT32_MAX)
    return weft_error_at(WEFT_ERR_INVALID, func, "%s has %lld ids: at most 2^32 - 1 supported",
                         name, (long long)N);
  void *scratch;
  WEFT_CHECK(weft_cuda_scratch_(sizeof(unsigned), &scratch));
  unsigned *flag = (unsigned *)scratch;
  WEFT_CHECK(weft_cuda_memset_(flag, 0, sizeof *flag));
  WEFT_COST(0, 4.0 * (double)N);
  WEFT_LAUNCH(check_ids_kernel, grid_for(N, 256, 4096), 256, 0, compute_stream(), flag, ids, N, hi);
  WEFT_CHECK(launched(func));
  unsigned got = 0;
  WEFT_CHECK(weft_cuda_memcpy_(&got, flag, sizeof got, WEFT_COPY_D2H));
  if (got == 0) return WEFT_OK;
  const int64_t n = N - (int64_t)got;
  int32_t bad = 0;
  WEFT_CHECK(weft_cuda_memcpy_(&bad, ids + n, sizeof bad, WEFT_COPY_D2H));
  if (hi >= 0)
    return weft_error_at(WEFT_ERR_INVALID, func,
                         "%s[%lld] = %d is outside the vocabulary [0, %lld)", name, (long long)n,
                         bad, (long long)hi);
  return weft_error_at(WEFT_ERR_INVALID, func, "%s[%lld] = %d is negative", name, (long long)n,
                       bad);
}

/* ------------------------------------------------------------ embedding */

/* out[n] = weight_local[tokens[n] - v0] if that row is in [0, nv), else 0.
 * One warp (threadIdx.y) per row, lanes along C; vec (float only): C % 4
 * == 0 and 16-byte aligned rows. T: float, bf16_t or f16_t (copied as
 * they are). */
template <class T>
__global__ void embedding_fwd_kernel(T *out, const int32_t *tokens, const T *w, int64_t N,
                                     int64_t v0, int64_t nv, int64_t C, bool vec) {
  for (int64_t n = (int64_t)blockIdx.x * blockDim.y + threadIdx.y; n < N;
       n += (int64_t)gridDim.x * blockDim.y) {
    const int64_t r = (int64_t)tokens[n] - v0;
    const bool in = r >= 0 && r < nv;
    T *o = out + n * C;
    const T *src = w + (in ? r : 0) * C;
    if (vec) {
      for (int64_t c = threadIdx.x; c < C / 4; c += blockDim.x) {
        f4 v = {0.0f, 0.0f, 0.0f, 0.0f};
        if (in) v = ((const f4 *)src)[c];
        ((f4 *)o)[c] = v;
      }
    } else {
      for (int64_t c = threadIdx.x; c < C; c += blockDim.x) o[c] = in ? src[c] : from_f32<T>(0.0f);
    }
  }
}

/* dweight_local[r] += dout[n] for every n with tokens[n] == v0 + r, in
 * increasing n. One warp per (row r of [0, nv), tile of EMB_COLS columns,
 * blockIdx.y) scans the ids 32 at a time (a ballot of the matches) and adds
 * each matching dout row's slice, lane by lane in order, into registers
 * that start from the weight row and are stored once. No atomics: every
 * element gets the CPU's adds in the CPU's order (kernels/cpu/embedding.c),
 * so the result is the CPU's bits on every run. Cost: nv * ceil(C /
 * EMB_COLS) * N / 32 ballots besides the N * C loads. dout of T (float,
 * bf16_t, f16_t; each element widened), dw f32. */
#define EMB_COLS 256 /* 8 columns per lane */
template <class T>
__global__ void embedding_bwd_kernel(float *dw, const int32_t *tokens, const T *dout, int64_t N,
                                     int64_t v0, int64_t nv, int64_t C) {
  const int lane = (int)threadIdx.x;
  const int64_t c0 = (int64_t)blockIdx.y * EMB_COLS + lane;
  for (int64_t r = (int64_t)blockIdx.x * blockDim.y + threadIdx.y; r < nv;
       r += (int64_t)gridDim.x * blockDim.y) {
    const int64_t id = v0 + r;
    float *d = dw + r * C;
    float acc[EMB_COLS / 32];
    bool any = false;
    for (int64_t n0 = 0; n0 < N; n0 += 32) {
      const int64_t n = n0 + lane;
      unsigned hit = __ballot_sync(0xffffffffu, n < N && (int64_t)tokens[n] == id);
      if (hit && !any) {
        for (int k = 0; k < EMB_COLS / 32; k++) acc[k] = c0 + 32 * k < C ? d[c0 + 32 * k] : 0.0f;
        any = true;
      }
      while (hit) { /* the same for every lane */
        const int j = __ffs((int)hit) - 1;
        hit &= hit - 1;
        const T *g = dout + (n0 + j) * C;
        for (int k = 0; k < EMB_COLS / 32; k++)
          if (c0 + 32 * k < C) acc[k] += as_f32(g[c0 + 32 * k]);
      }
    }
    if (any)
      for (int k = 0; k < EMB_COLS / 32; k++)
        if (c0 + 32 * k < C) d[c0 + 32 * k] = acc[k];
  }
}

/* dst (+)= the rows of src the tokens pick (forward: dst, src of T) or
 * their scatter-add (backward: dst f32, src = dout of T). */
template <class T>
weft_status embedding_fwd_launch(const char *func, T *dst, const int32_t *tokens, const T *src,
                                 int64_t N, int64_t v0, int64_t nv, int64_t C) {
  if (N == 0 || C == 0) return WEFT_OK;
  const bool vec = sizeof(T) == sizeof(float) && C % 4 == 0 && aligned16(dst) && aligned16(src);
  WEFT_COST(0, 2.0 * (double)sizeof(T) * (double)N * (double)C + 4.0 * (double)N);
  WEFT_LAUNCH(embedding_fwd_kernel<T>, grid_for(N, 8), dim3(32, 8), 0, compute_stream(), dst,
              tokens, src, N, v0, nv, C, vec);
  return launched(func);
}

template <class T>
weft_status embedding_bwd_launch(const char *func, float *dst, const int32_t *tokens, const T *src,
                                 int64_t N, int64_t v0, int64_t nv, int64_t C) {
  if (N == 0 || C == 0) return WEFT_OK;
  const int64_t tiles = (C + EMB_COLS - 1) / EMB_COLS;
  if (tiles > 65535)
    return weft_error_at(WEFT_ERR_UNSUPPORTED, func, "C = %lld columns: at most %lld on cuda",
                         (long long)C, 65535LL * EMB_COLS);
  /* as the kernel does it: every warp (a vocab row's column tile) scans
   * all N ids; dout rows read, the hit rows of dw read and written */
  WEFT_COST((double)N * (double)C, 4.0 * (double)N * (double)nv * (double)tiles +
                                       (double)sizeof(T) * (double)N * (double)C +
                                       8.0 * (double)(nv < N ? nv : N) * (double)C);
  WEFT_LAUNCH(embedding_bwd_kernel<T>, dim3(grid_for(nv, 8), (unsigned)tiles), dim3(32, 8), 0,
              compute_stream(), dst, tokens, src, N, v0, nv, C);
  return launched(func);
}

/* --------------------------------------------------------------- linear */

/* out[n, o] += bias[o]; one warp per row. */
__global__ void bias_add_kernel(float *out, const float *bias, int64_t N, int64_t OC) {
  for (int64_t n = (int64_t)blockIdx.x * blockDim.y + threadIdx.y; n < N;
       n += (int64_t)gridDim.x * blockDim.y) {
    float *row = out + n * OC;
    for (int64_t o = threadIdx.x; o < OC; o += blockDim.x) row[o] += bias[o];
  }
}

/* Column sums in two passes. Pass 1, block (32, 8), grid (column tiles of
 * 32, row chunks): partial[chunk][o] = sum of dout[n, o] over the chunk's
 * rows (8 row lanes, then their 8 sums in order). */
__global__ void colsum_partial_kernel(float *partial, const float *x, int64_t N, int64_t C,
                                      int64_t rows_per_chunk) {
  __shared__ float sh[8][33];
  const int64_t o = (int64_t)blockIdx.x * 32 + threadIdx.x;
  const int64_t r0 = (int64_t)blockIdx.y * rows_per_chunk;
  int64_t r1 = r0 + rows_per_chunk;
  if (r1 > N) r1 = N;
  float s = 0.0f;
  if (o < C)
    for (int64_t n = r0 + threadIdx.y; n < r1; n += 8) s += x[n * C + o];
  sh[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && o < C) {
    float t = 0.0f;
    for (int i = 0; i < 8; i++) t += sh[i][threadIdx.x];
    partial[(int64_t)blockIdx.y * C + o] = t;
  }
}

/* Pass 2: out[o] (+)= sum over chunks of partial[chunk][o], in order. */
__global__ void colsum_finish_kernel(float *out, const float *partial, int64_t nchunks, int64_t C,
                                     bool accumulate) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t o = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; o < C; o += stride) {
    float s = 0.0f;
    for (int64_t b = 0; b < nchunks; b++) s += partial[b * C + o];
    out[o] = accumulate ? out[o] + s : s;
  }
}

/* -------------------------------------------------------------- RMSNorm */

/* Four elements c4 * 4 .. + 3 as f32: one 16-byte load for float, four
 * widened loads for bf16_t / f16_t (the same values and grouping, so the
 * same sums); store4 rounds each once. */
template <class T>
__device__ inline f4 load4(const T *p, int64_t c4) {
  return f4{as_f32(p[4 * c4]), as_f32(p[4 * c4 + 1]), as_f32(p[4 * c4 + 2]), as_f32(p[4 * c4 + 3])};
}
template <>
__device__ inline f4 load4<float>(const float *p, int64_t c4) {
  return ((const f4 *)p)[c4];
}
template <class T>
__device__ inline void store4(T *p, int64_t c4, f4 v) {
  p[4 * c4] = from_f32<T>(v.x);
  p[4 * c4 + 1] = from_f32<T>(v.y);
  p[4 * c4 + 2] = from_f32<T>(v.z);
  p[4 * c4 + 3] = from_f32<T>(v.w);
}
template <>
__device__ inline void store4<float>(float *p, int64_t c4, f4 v) {
  ((f4 *)p)[c4] = v;
}

/* One warp per row: rstd from the tree-summed squares, then the scaled row.
 * T: float, or bf16_t / f16_t (rmsnorm_*_dt; rstd stays f32). */
template <class T>
__global__ void rmsnorm_fwd_kernel(T *out, float *rstd, const T *inp, const T *w, int64_t N,
                                   int64_t C, float eps, bool vec) {
  for (int64_t n = (int64_t)blockIdx.x * blockDim.y + threadIdx.y; n < N;
       n += (int64_t)gridDim.x * blockDim.y) {
    const T *x = inp + n * C;
    T *y = out + n * C;
    float ss = 0.0f;
    if (vec) {
      for (int64_t c = threadIdx.x; c < C / 4; c += 32) {
        f4 v = load4(x, c);
        ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
      }
    } else {
      for (int64_t c = threadIdx.x; c < C; c += 32) ss += as_f32(x[c]) * as_f32(x[c]);
    }
    ss = warp_sum(ss);
    const float r = (float)(1.0 / sqrt((double)ss / (double)C + (double)eps));
    if (threadIdx.x == 0) rstd[n] = r;
    if (vec) {
      for (int64_t c = threadIdx.x; c < C / 4; c += 32) {
        f4 v = load4(x, c), g = load4(w, c);
        store4(y, c, f4{v.x * r * g.x, v.y * r * g.y, v.z * r * g.z, v.w * r * g.w});
      }
    } else {
      for (int64_t c = threadIdx.x; c < C; c += 32)
        y[c] = from_f32<T>(as_f32(x[c]) * r * as_f32(w[c]));
    }
  }
}

/* Backward, one block (RMS_THREADS) per row in turn, a thread owning
 * columns tid + k * RMS_THREADS (k < K) so that its share of the row and
 * of dweight stays in registers; partial[blockIdx.x][:] gets the block's
 * dweight sums (summed in order by colsum_finish_kernel). */
#define RMS_THREADS 256
template <int K, class T>
__global__ void rmsnorm_bwd_kernel(T *dinp, float *partial, const T *dout, const T *inp,
                                   const T *weight, const float *rstd, int64_t N, int64_t C,
                                   bool acc) {
  __shared__ float sh[32];
  float w[K], dw[K];
  for (int k = 0; k < K; k++) {
    const int64_t j = threadIdx.x + (int64_t)k * RMS_THREADS;
    w[k] = j < C ? as_f32(weight[j]) : 0.0f;
    dw[k] = 0.0f;
  }
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const float r = rstd[n];
    const T *x = inp + n * C, *dy = dout + n * C;
    float xs[K], ds[K], gx = 0.0f;
    for (int k = 0; k < K; k++) {
      const int64_t j = threadIdx.x + (int64_t)k * RMS_THREADS;
      xs[k] = j < C ? as_f32(x[j]) : 0.0f;
      ds[k] = j < C ? as_f32(dy[j]) : 0.0f;
      gx += (ds[k] * w[k]) * xs[k];
    }
    gx = block_sum(gx, sh);
    const float kk = gx / (float)C * r * r;
    T *dx = dinp + n * C;
    for (int k = 0; k < K; k++) {
      const int64_t j = threadIdx.x + (int64_t)k * RMS_THREADS;
      if (j >= C) continue;
      const float d = r * (ds[k] * w[k] - xs[k] * kk);
      dx[j] = from_f32<T>(acc ? as_f32(dx[j]) + d : d);
      dw[k] += ds[k] * xs[k] * r;
    }
  }
  for (int k = 0; k < K; k++) {
    const int64_t j = threadIdx.x + (int64_t)k * RMS_THREADS;
    if (j < C) partial[(int64_t)blockIdx.x * C + j] = dw[k];
  }
}

/* The same for rows too long for registers (C > 32 * RMS_THREADS): two
 * passes over the row, dweight partials accumulated in place in partial
 * (zeroed first; each thread owns its columns). */
template <class T>
__global__ void rmsnorm_bwd_long_kernel(T *dinp, float *partial, const T *dout, const T *inp,
                                        const T *weight, const float *rstd, int64_t N, int64_t C,
                                        bool acc) {
  __shared__ float sh[32];
  float *pw = partial + (int64_t)blockIdx.x * C;
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const float r = rstd[n];
    const T *x = inp + n * C, *dy = dout + n * C;
    float gx = 0.0f;
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x)
      gx += (as_f32(dy[j]) * as_f32(weight[j])) * as_f32(x[j]);
    gx = block_sum(gx, sh);
    const float kk = gx / (float)C * r * r;
    T *dx = dinp + n * C;
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x) {
      const float xj = as_f32(x[j]), dj = as_f32(dy[j]);
      const float d = r * (dj * as_f32(weight[j]) - xj * kk);
      dx[j] = from_f32<T>(acc ? as_f32(dx[j]) + d : d);
      pw[j] += dj * xj * r;
    }
  }
}

/* ----------------------------------------------------------------- RoPE */

/* One block per (b, t) row in turn, threads over the NH * hd/2 pairs of
 * the row; sign +1 forward, -1 backward (the transpose rotation). */
template <class E>
__global__ void rope_kernel(E *out, const E *inp, const float *cosb, const float *sinb, int64_t BT,
                            int64_t T, int64_t NH, int64_t half, int64_t pos0, float sign,
                            bool vec) {
  const int64_t pairs = NH * half;
  for (int64_t row = blockIdx.x; row < BT; row += gridDim.x) {
    const int64_t t = row % T;
    const float *cp = cosb + (pos0 + t) * half, *sp = sinb + (pos0 + t) * half;
    const E *x = inp + row * pairs * 2;
    E *y = out + row * pairs * 2;
    for (int64_t q = threadIdx.x; q < pairs; q += blockDim.x) {
      const int64_t j = q % half;
      const float c = cp[j], s = sign * sp[j];
      f2 v;
      if (vec) {
        v = ((const f2 *)x)[q];
      } else {
        v.x = as_f32(x[2 * q]);
        v.y = as_f32(x[2 * q + 1]);
      }
      const f2 r = {v.x * c - v.y * s, v.x * s + v.y * c};
      if (vec) {
        ((f2 *)y)[q] = r;
      } else {
        y[2 * q] = from_f32<E>(r.x);
        y[2 * q + 1] = from_f32<E>(r.y);
      }
    }
  }
}

/* ----------------------------------------------------- elementwise ops */

__device__ inline float silu_of(float x) { return x / (1.0f + expf(-x)); }

__global__ void swiglu_fwd_kernel(float *out, const float *a, const float *b, int64_t n, bool vec) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  const int64_t i0 = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  int64_t done = 0;
  if (vec) {
    for (int64_t i = i0; i < n / 4; i += stride) {
      const f4 x = ((const f4 *)a)[i], y = ((const f4 *)b)[i];
      ((f4 *)out)[i] = {silu_of(x.x) * y.x, silu_of(x.y) * y.y, silu_of(x.z) * y.z,
                        silu_of(x.w) * y.w};
    }
    done = n / 4 * 4;
  }
  for (int64_t i = done + i0; i < n; i += stride) out[i] = silu_of(a[i]) * b[i];
}

__device__ inline void swiglu_grad(float d, float x, float y, float *da, float *db) {
  const float s = 1.0f / (1.0f + expf(-x));
  *da = d * y * s * (1.0f + x * (1.0f - s));
  *db = d * (x * s);
}

/* bf16_t / f16_t storage (swiglu_*_dt): one element a thread, loaded as
 * f32, the f32 kernels' arithmetic, rounded once on store. */
template <class T>
__global__ void swiglu_fwd_dt_kernel(T *out, const T *a, const T *b, int64_t n) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = from_f32<T>(silu_of(as_f32(a[i])) * as_f32(b[i]));
}

template <class T>
__global__ void swiglu_bwd_dt_kernel(T *da, T *db, const T *dout, const T *a, const T *b,
                                     int64_t n) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    float ga, gb;
    swiglu_grad(as_f32(dout[i]), as_f32(a[i]), as_f32(b[i]), &ga, &gb);
    da[i] = from_f32<T>(ga);
    db[i] = from_f32<T>(gb);
  }
}

__global__ void swiglu_bwd_kernel(float *da, float *db, const float *dout, const float *a,
                                  const float *b, int64_t n, bool vec) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  const int64_t i0 = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  int64_t done = 0;
  if (vec) {
    for (int64_t i = i0; i < n / 4; i += stride) {
      const f4 d = ((const f4 *)dout)[i], x = ((const f4 *)a)[i], y = ((const f4 *)b)[i];
      f4 ga, gb;
      swiglu_grad(d.x, x.x, y.x, &ga.x, &gb.x);
      swiglu_grad(d.y, x.y, y.y, &ga.y, &gb.y);
      swiglu_grad(d.z, x.z, y.z, &ga.z, &gb.z);
      swiglu_grad(d.w, x.w, y.w, &ga.w, &gb.w);
      ((f4 *)da)[i] = ga;
      ((f4 *)db)[i] = gb;
    }
    done = n / 4 * 4;
  }
  for (int64_t i = done + i0; i < n; i += stride) {
    float ga, gb;
    swiglu_grad(dout[i], a[i], b[i], &ga, &gb);
    da[i] = ga;
    db[i] = gb;
  }
}

/* out = a + b, or (a == out) out += b; vec as above. */
__global__ void add_kernel(float *out, const float *a, const float *b, int64_t n, bool vec) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  const int64_t i0 = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  int64_t done = 0;
  if (vec) {
    for (int64_t i = i0; i < n / 4; i += stride) {
      const f4 x = ((const f4 *)a)[i], y = ((const f4 *)b)[i];
      ((f4 *)out)[i] = {x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w};
    }
    done = n / 4 * 4;
  }
  for (int64_t i = done + i0; i < n; i += stride) out[i] = a[i] + b[i];
}

/* ------------------------------------------------------- cross-entropy */

/* What the loss kernels hand back to the host in one copy. */
struct loss_result {
  double sum;
  unsigned flag; /* N - first bad row, 0 if none */
  unsigned pad;
};

/* Full-vocab forward, one block per row: online max/sum per thread, merged
 * by warp shuffles and then across warps in order; row_lse[n] and
 * row_loss[n] = lse - logits[n, target] (double) into scratch. A target
 * outside [0, V) marks the row in res->flag (the loss is then not used). */
template <class T>
__global__ void ce_fwd_kernel(float *row_lse, double *row_loss, loss_result *res, const T *logits,
                              const int32_t *targets, int64_t N, int64_t V) {
  __shared__ float shm[32], shs[32];
  const unsigned lane = threadIdx.x % 32, w = threadIdx.x / 32, nw = blockDim.x / 32;
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const T *row = logits + n * V;
    float m = -INFINITY, s = 0.0f;
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
      const float x = as_f32(row[v]);
      lse_push(m, s, x);
    }
    for (int o = 16; o > 0; o >>= 1) {
      const float m2 = __shfl_xor_sync(0xffffffffu, m, o);
      const float s2 = __shfl_xor_sync(0xffffffffu, s, o);
      lse_merge(m, s, m2, s2);
    }
    if (lane == 0) {
      shm[w] = m;
      shs[w] = s;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      float M = -INFINITY, S = 0.0f;
      for (unsigned i = 0; i < nw; i++) lse_merge(M, S, shm[i], shs[i]);
      const float l = M + logf(S);
      const int32_t t = targets[n];
      row_lse[n] = l;
      if (t < 0 || t >= V) {
        atomicMax(&res->flag, (unsigned)(N - n));
        row_loss[n] = 0.0;
      } else {
        row_loss[n] = (double)l - (double)as_f32(row[t]);
      }
    }
    __syncthreads();
  }
}

/* res->sum = sum of x[0..n) in double, one block, fixed order. */
__global__ void sum_d_kernel(loss_result *res, const double *x, int64_t n) {
  __shared__ double sh[32];
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += x[i];
  s = block_sum_d(s, sh);
  if (threadIdx.x == 0) res->sum = s;
}

/* dlogits[n, j] = scale * (exp(logits[n, j] - lse[n]) - [v0 + j == t]),
 * one block per row (dlogits may alias logits). T: float, or bf16_t /
 * f16_t (each element widened, its gradient rounded once). */
template <class T>
__global__ void ce_bwd_kernel(T *dlogits, const T *logits, const float *lse, const int32_t *targets,
                              int64_t N, int64_t v0, int64_t nv, float scale, bool vec) {
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const float l = lse[n];
    const int64_t t = (int64_t)targets[n] - v0;
    const T *x = logits + n * nv;
    T *d = dlogits + n * nv;
    int64_t done = 0;
    if (vec) {
      for (int64_t j = threadIdx.x; j < nv / 4; j += blockDim.x) {
        const f4 v = load4(x, j);
        f4 g = {expf(v.x - l) * scale, expf(v.y - l) * scale, expf(v.z - l) * scale,
                expf(v.w - l) * scale};
        const int64_t j4 = 4 * j;
        if (t == j4) g.x -= scale;
        if (t == j4 + 1) g.y -= scale;
        if (t == j4 + 2) g.z -= scale;
        if (t == j4 + 3) g.w -= scale;
        store4(d, j, g);
      }
      done = nv / 4 * 4;
    }
    for (int64_t j = done + threadIdx.x; j < nv; j += blockDim.x) {
      float g = expf(as_f32(x[j]) - l) * scale;
      if (j == t) g -= scale;
      d[j] = from_f32<T>(g);
    }
  }
}

template <class T>
__global__ void row_max_kernel(float *row_max, const T *x, int64_t N, int64_t nv) {
  __shared__ float sh[32];
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    float m = -INFINITY;
    for (int64_t j = threadIdx.x; j < nv; j += blockDim.x) m = fmaxf(m, as_f32(x[n * nv + j]));
    m = block_max(m, sh);
    if (threadIdx.x == 0) row_max[n] = m;
  }
}

template <class T>
__global__ void local_target_kernel(float *out, const T *x, const int32_t *targets, int64_t N,
                                    int64_t v0, int64_t nv) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t n = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; n < N; n += stride) {
    const int64_t j = (int64_t)targets[n] - v0;
    out[n] = (j >= 0 && j < nv) ? as_f32(x[n * nv + j]) : 0.0f;
  }
}

/* sumexp[n] = sum_j exp(x[n, j] - gmax[n]), accumulated in double. */
template <class T>
__global__ void sumexp_kernel(float *sumexp, const T *x, const float *gmax, int64_t N, int64_t nv) {
  __shared__ double sh[32];
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const float m = gmax[n];
    double s = 0.0;
    for (int64_t j = threadIdx.x; j < nv; j += blockDim.x)
      s += (double)expf(as_f32(x[n * nv + j]) - m);
    s = block_sum_d(s, sh);
    if (threadIdx.x == 0) sumexp[n] = (float)s;
  }
}

/* row_loss[n] = gmax + log(gsum) - gtarget in double; a row with gsum <= 0
 * (or NaN) marks res->flag. */
__global__ void finish_rows_kernel(double *row_loss, loss_result *res, const float *gmax,
                                   const float *gsum, const float *gtarget, int64_t N) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t n = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; n < N; n += stride) {
    if (!(gsum[n] > 0.0f)) {
      atomicMax(&res->flag, (unsigned)(N - n));
      row_loss[n] = 0.0;
    } else {
      row_loss[n] = (double)gmax[n] + log((double)gsum[n]) - (double)gtarget[n];
    }
  }
}

__global__ void finish_lse_kernel(float *lse, const float *gmax, const float *gsum, int64_t N) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t n = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; n < N; n += stride)
    lse[n] = (float)((double)gmax[n] + log((double)gsum[n]));
}

#define ROW_THREADS 256

/* T: float, bf16_t or f16_t; the four-wide path for 16-bit storage
 * whenever nv % 4 == 0 (elementwise: the same values either way) */
template <class T>
weft_status ce_backward_launch(const char *func, T *dlogits, const T *logits, const float *lse,
                               const int32_t *targets, int64_t N, int64_t v0, int64_t nv,
                               float scale) {
  if (N == 0 || nv == 0) return WEFT_OK;
  const bool vec =
      nv % 4 == 0 && (sizeof(T) != sizeof(float) || (aligned16(dlogits) && aligned16(logits)));
  WEFT_COST(4.0 * (double)N * (double)nv,
            2.0 * (double)sizeof(T) * (double)N * (double)nv + 12.0 * (double)N);
  WEFT_LAUNCH(ce_bwd_kernel, grid_for(N, 1), ROW_THREADS, 0, compute_stream(), dlogits, logits, lse,
              targets, N, v0, nv, scale, vec);
  return launched(func);
}

/* Copies *res back (waits for the compute stream). */
weft_status fetch_result(const loss_result *dres, loss_result *res) {
  return weft_cuda_memcpy_(res, dres, sizeof *res, WEFT_COPY_D2H);
}

/* The cross-entropy members for logits of element type T (float, bf16_t,
 * f16_t); func names the operation in errors. */
template <class T>
weft_status ce_forward_impl(const char *func, double *loss, float *lse, const T *logits,
                            const int32_t *targets, int64_t N, int64_t V) {
  WEFT_CHECK(weft_cuda_require_init_(func));
  const char *op = weft_op_name_(func);
  CHECK_SIZES_AT(op, N, V);
  CHECK_PTR_AT(op, loss, 1);
  CHECK_PTR_AT(op, logits, N * V);
  CHECK_PTR_AT(op, targets, N);
  if (V == 0 && N > 0) return weft_error_at(WEFT_ERR_INVALID, op, "V = 0: no classes");
  if (N == 0) {
    *loss = 0.0;
    return WEFT_OK;
  }
  if (N > (int64_t)UINT32_MAX)
    return weft_error_at(WEFT_ERR_INVALID, op, "N = %lld rows: at most 2^32 - 1 supported",
                         (long long)N);
  /* scratch: result | row_loss (N doubles) | row_lse (N floats) */
  const size_t off_loss = 256, off_lse = off_loss + round_up_256((size_t)N * sizeof(double));
  void *scratch;
  WEFT_CHECK(weft_cuda_scratch_(off_lse + (size_t)N * sizeof(float), &scratch));
  loss_result *dres = (loss_result *)scratch;
  double *row_loss = (double *)((char *)scratch + off_loss);
  float *row_lse = (float *)((char *)scratch + off_lse);
  cudaStream_t s = compute_stream();
  WEFT_CHECK(weft_cuda_memset_(dres, 0, sizeof *dres));
  WEFT_COST(4.0 * (double)N * (double)V,
            (double)sizeof(T) * (double)N * (double)V + 16.0 * (double)N);
  WEFT_LAUNCH(ce_fwd_kernel<T>, grid_for(N, 1), ROW_THREADS, 0, s, row_lse, row_loss, dres, logits,
              targets, N, V);
  WEFT_CHECK(launched(func));
  WEFT_COST((double)N, 8.0 * (double)N);
  WEFT_LAUNCH(sum_d_kernel, 1, 1024, 0, s, dres, row_loss, N);
  WEFT_CHECK(launched(func));
  loss_result res;
  WEFT_CHECK(fetch_result(dres, &res));
  if (res.flag != 0) { /* nothing was written: report the first bad target as the CPU does */
    const int64_t n = N - (int64_t)res.flag;
    int32_t bad = 0;
    WEFT_CHECK(weft_cuda_memcpy_(&bad, targets + n, sizeof bad, WEFT_COPY_D2H));
    return weft_error_at(WEFT_ERR_INVALID, op,
                         "targets[%lld] = %d is outside the vocabulary [0, %lld)", (long long)n,
                         bad, (long long)V);
  }
  *loss = res.sum / (double)N;
  if (lse)
    WEFT_CHECK(weft_cuda_memcpy_async_(lse, row_lse, (size_t)N * sizeof(float), WEFT_COPY_D2D,
                                       WEFT_STREAM_COMPUTE));
  return WEFT_OK;
}

/* whole: the whole vocabulary (cross_entropy_backward: targets in [0, nv),
 * v0 = 0) */
template <class T>
weft_status ce_backward_impl(const char *func, bool whole, T *dlogits, const T *logits,
                             const float *lse, const int32_t *targets, int64_t N, int64_t v0,
                             int64_t nv, float scale) {
  WEFT_CHECK(weft_cuda_require_init_(func));
  const char *op = weft_op_name_(func);
  CHECK_SIZES_AT(op, N, v0, nv);
  CHECK_PTR_AT(op, dlogits, N * nv);
  CHECK_PTR_AT(op, logits, N * nv);
  CHECK_PTR_AT(op, lse, N);
  CHECK_PTR_AT(op, targets, N);
  WEFT_CHECK(check_ids(func, "targets", targets, N, whole ? nv : -1));
  return ce_backward_launch(func, dlogits, logits, lse, targets, N, v0, nv, scale);
}

template <class T>
weft_status ce_local_max_impl(const char *func, float *row_max, const T *logits_local, int64_t N,
                              int64_t nv) {
  WEFT_CHECK(weft_cuda_require_init_(func));
  const char *op = weft_op_name_(func);
  CHECK_SIZES_AT(op, N, nv);
  CHECK_PTR_AT(op, row_max, N);
  CHECK_PTR_AT(op, logits_local, N * nv);
  if (N == 0) return WEFT_OK;
  WEFT_COST((double)N * (double)nv, (double)sizeof(T) * (double)N * (double)nv + 4.0 * (double)N);
  WEFT_LAUNCH(row_max_kernel<T>, grid_for(N, 1), ROW_THREADS, 0, compute_stream(), row_max,
              logits_local, N, nv);
  return launched(func);
}

template <class T>
weft_status ce_local_target_impl(const char *func, float *target_logit, const T *logits_local,
                                 const int32_t *targets, int64_t N, int64_t v0, int64_t nv) {
  WEFT_CHECK(weft_cuda_require_init_(func));
  const char *op = weft_op_name_(func);
  CHECK_SIZES_AT(op, N, v0, nv);
  CHECK_PTR_AT(op, target_logit, N);
  CHECK_PTR_AT(op, logits_local, N * nv);
  CHECK_PTR_AT(op, targets, N);
  WEFT_CHECK(check_ids(func, "targets", targets, N, -1));
  if (N == 0) return WEFT_OK;
  WEFT_COST(0, (8.0 + (double)sizeof(T)) * (double)N);
  WEFT_LAUNCH(local_target_kernel<T>, grid_for(N, 256), 256, 0, compute_stream(), target_logit,
              logits_local, targets, N, v0, nv);
  return launched(func);
}

template <class T>
weft_status ce_local_sumexp_impl(const char *func, float *sumexp, const T *logits_local,
                                 const float *gmax, int64_t N, int64_t nv) {
  WEFT_CHECK(weft_cuda_require_init_(func));
  const char *op = weft_op_name_(func);
  CHECK_SIZES_AT(op, N, nv);
  CHECK_PTR_AT(op, sumexp, N);
  CHECK_PTR_AT(op, logits_local, N * nv);
  CHECK_PTR_AT(op, gmax, N);
  if (N == 0) return WEFT_OK;
  WEFT_COST(3.0 * (double)N * (double)nv,
            (double)sizeof(T) * (double)N * (double)nv + 8.0 * (double)N);
  WEFT_LAUNCH(sumexp_kernel<T>, grid_for(N, 1), ROW_THREADS, 0, compute_stream(), sumexp,
              logits_local, gmax, N, nv);
  return launched(func);
}

}  // namespace

extern "C" {

/* ------------------------------------------------------------ embedding */

weft_status weft_cuda_embedding_forward(float *out, const int32_t *tokens, const float *weight,
                                        int64_t N, int64_t V, int64_t C) {
  REQUIRE_INIT();
  CHECK_SIZES(N, V, C);
  CHECK_PTR(out, N * C);
  CHECK_PTR(tokens, N);
  CHECK_PTR(weight, V * C);
  WEFT_CHECK(check_ids(__func__, "tokens", tokens, N, V));
  return embedding_fwd_launch(__func__, out, tokens, weight, N, 0, V, C);
}

weft_status weft_cuda_embedding_backward(float *dweight, const int32_t *tokens, const float *dout,
                                         int64_t N, int64_t V, int64_t C) {
  REQUIRE_INIT();
  CHECK_SIZES(N, V, C);
  CHECK_PTR(dweight, V * C);
  CHECK_PTR(tokens, N);
  CHECK_PTR(dout, N * C);
  WEFT_CHECK(check_ids(__func__, "tokens", tokens, N, V));
  return embedding_bwd_launch(__func__, dweight, tokens, dout, N, 0, V, C);
}

weft_status weft_cuda_embedding_range_forward(float *out, const int32_t *tokens,
                                              const float *weight_local, int64_t N, int64_t v0,
                                              int64_t nv, int64_t C) {
  REQUIRE_INIT();
  CHECK_SIZES(N, v0, nv, C);
  CHECK_PTR(out, N * C);
  CHECK_PTR(tokens, N);
  CHECK_PTR(weight_local, nv * C);
  WEFT_CHECK(check_ids(__func__, "tokens", tokens, N, -1));
  return embedding_fwd_launch(__func__, out, tokens, weight_local, N, v0, nv, C);
}

weft_status weft_cuda_embedding_range_backward(float *dweight_local, const int32_t *tokens,
                                               const float *dout, int64_t N, int64_t v0, int64_t nv,
                                               int64_t C) {
  REQUIRE_INIT();
  CHECK_SIZES(N, v0, nv, C);
  CHECK_PTR(dweight_local, nv * C);
  CHECK_PTR(tokens, N);
  CHECK_PTR(dout, N * C);
  WEFT_CHECK(check_ids(__func__, "tokens", tokens, N, -1));
  return embedding_bwd_launch(__func__, dweight_local, tokens, dout, N, v0, nv, C);
}

/* bf16 / f16 (backend.h embedding_range_*_dt); f32 is the members above */
weft_status weft_cuda_embedding_range_forward_dt(weft_dtype dt, void *out, const int32_t *tokens,
                                                 const void *weight_local, int64_t N, int64_t v0,
                                                 int64_t nv, int64_t C) {
  REQUIRE_INIT();
  const char *op = weft_op_name_(__func__);
  WEFT_CHECK_STORAGE_DT_(op, dt);
  CHECK_SIZES(N, v0, nv, C);
  CHECK_PTR(out, N * C);
  CHECK_PTR(tokens, N);
  CHECK_PTR(weight_local, nv * C);
  WEFT_CHECK(check_ids(__func__, "tokens", tokens, N, -1));
  if (dt == WEFT_F32)
    return embedding_fwd_launch(__func__, (float *)out, tokens, (const float *)weight_local, N, v0,
                                nv, C);
  if (dt == WEFT_BF16)
    return embedding_fwd_launch(__func__, (bf16_t *)out, tokens, (const bf16_t *)weight_local, N,
                                v0, nv, C);
  return embedding_fwd_launch(__func__, (f16_t *)out, tokens, (const f16_t *)weight_local, N, v0,
                              nv, C);
}

weft_status weft_cuda_embedding_range_backward_dt(weft_dtype dt, float *dweight_local,
                                                  const int32_t *tokens, const void *dout,
                                                  int64_t N, int64_t v0, int64_t nv, int64_t C) {
  REQUIRE_INIT();
  const char *op = weft_op_name_(__func__);
  WEFT_CHECK_STORAGE_DT_(op, dt);
  CHECK_SIZES(N, v0, nv, C);
  CHECK_PTR(dweight_local, nv * C);
  CHECK_PTR(tokens, N);
  CHECK_PTR(dout, N * C);
  WEFT_CHECK(check_ids(__func__, "tokens", tokens, N, -1));
  if (dt == WEFT_F32)
    return embedding_bwd_launch(__func__, dweight_local, tokens, (const float *)dout, N, v0, nv, C);
  if (dt == WEFT_BF16)
    return embedding_bwd_launch(__func__, dweight_local, tokens, (const bf16_t *)dout, N, v0, nv,
                                C);
  return embedding_bwd_launch(__func__, dweight_local, tokens, (const f16_t *)dout, N, v0, nv, C);
}

/* --------------------------------------------------------------- linear */

weft_status weft_cuda_linear_forward(float *out, const float *inp, const float *weight,
                                     const float *bias, int64_t N, int64_t IC, int64_t OC) {
  REQUIRE_INIT();
  CHECK_SIZES(N, IC, OC);
  CHECK_PTR(out, N * OC);
  CHECK_PTR(inp, N * IC);
  CHECK_PTR(weight, OC * IC);
  if (N == 0 || OC == 0) return WEFT_OK;
  /* out (N, OC) = inp (N, IC) @ weight^T (IC, OC) */
  WEFT_CHECK(weft_cuda_sgemm(false, true, N, OC, IC, 1.0f, inp, IC > 0 ? IC : 1, weight,
                             IC > 0 ? IC : 1, 0.0f, out, OC));
  if (!bias) return WEFT_OK;
  WEFT_COST((double)N * (double)OC, 8.0 * (double)N * (double)OC + 4.0 * (double)OC);
  WEFT_LAUNCH(bias_add_kernel, grid_for(N, 8), dim3(32, 8), 0, compute_stream(), out, bias, N, OC);
  return launched(__func__);
}

weft_status weft_cuda_linear_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                                      const float *inp, const float *weight, int64_t N, int64_t IC,
                                      int64_t OC, bool accumulate_dinp, bool accumulate_dweight) {
  REQUIRE_INIT();
  CHECK_SIZES(N, IC, OC);
  CHECK_PTR(dout, N * OC);
  if (dinp) CHECK_PTR(weight, OC * IC);
  if (dweight) CHECK_PTR(inp, N * IC);
  if (dinp && N * IC > 0) {
    /* dinp (N, IC) = dout (N, OC) @ weight (OC, IC) */
    WEFT_CHECK(weft_cuda_sgemm(false, false, N, IC, OC, 1.0f, dout, OC > 0 ? OC : 1, weight, IC,
                               accumulate_dinp ? 1.0f : 0.0f, dinp, IC));
  }
  if (dweight && OC * IC > 0) {
    /* dweight (OC, IC) = dout^T (OC, N) @ inp (N, IC) */
    WEFT_CHECK(weft_cuda_sgemm(true, false, OC, IC, N, 1.0f, dout, OC, inp, IC,
                               accumulate_dweight ? 1.0f : 0.0f, dweight, IC));
  }
  if (dbias && OC > 0) {
    /* at least 256 rows per chunk, at most 65535 chunks (grid.y) */
    int64_t rows_per_chunk = (N + 65534) / 65535;
    if (rows_per_chunk < 256) rows_per_chunk = 256;
    const int64_t nchunks = (N + rows_per_chunk - 1) / rows_per_chunk;
    float *partial = NULL;
    if (nchunks > 0) {
      void *scratch;
      WEFT_CHECK(weft_cuda_scratch_((size_t)(nchunks * OC) * sizeof(float), &scratch));
      partial = (float *)scratch;
      WEFT_COST((double)N * (double)OC,
                4.0 * (double)N * (double)OC + 4.0 * (double)(nchunks * OC));
      WEFT_LAUNCH(colsum_partial_kernel, dim3((unsigned)((OC + 31) / 32), (unsigned)nchunks),
                  dim3(32, 8), 0, compute_stream(), partial, dout, N, OC, rows_per_chunk);
      WEFT_CHECK(launched(__func__));
    }
    WEFT_COST((double)(nchunks * OC), 4.0 * (double)(nchunks * OC) + 8.0 * (double)OC);
    WEFT_LAUNCH(colsum_finish_kernel, grid_for(OC, 256), 256, 0, compute_stream(), dbias, partial,
                nchunks, OC, accumulate_dweight);
    WEFT_CHECK(launched(__func__));
  }
  return WEFT_OK;
}

/* -------------------------------------------------------------- RMSNorm */

extern "C++" { /* the templates inside this file's extern "C" block */
template <class T>
static weft_status rms_forward_impl(const char *func, T *out, float *rstd, const T *inp,
                                    const T *weight, int64_t N, int64_t C, float eps, bool vec) {
  const double es = (double)sizeof(T);
  WEFT_COST(4.0 * (double)N * (double)C,
            2.0 * es * (double)N * (double)C + es * (double)C + 4.0 * (double)N);
  WEFT_LAUNCH(rmsnorm_fwd_kernel<T>, grid_for(N, 4), dim3(32, 4), 0, compute_stream(), out, rstd,
              inp, weight, N, C, eps, vec);
  return launched(func);
}

template <class T>
static weft_status rms_backward_impl(const char *func, T *dinp, float *dweight, const T *dout,
                                     const T *inp, const T *weight, const float *rstd, int64_t N,
                                     int64_t C, bool accumulate_dinp) {
  const double es = (double)sizeof(T);
  const int64_t blocks = N < 1024 ? N : 1024;
  void *scratch;
  WEFT_CHECK(weft_cuda_scratch_((size_t)(blocks * C) * sizeof(float), &scratch));
  float *partial = (float *)scratch;
  cudaStream_t s = compute_stream();
  const int64_t K = (C + RMS_THREADS - 1) / RMS_THREADS;
  /* dout and inp read, dinp written (and read when accumulating), a
   * partial row of dweight per block */
  const double rms_bwd_bytes = (accumulate_dinp ? 4.0 : 3.0) * es * (double)N * (double)C +
                               es * (double)C + 4.0 * (double)(blocks * C + N);
  WEFT_COST(8.0 * (double)N * (double)C, rms_bwd_bytes);
#define RMS_BWD(KK)                                                                            \
  WEFT_LAUNCH((rmsnorm_bwd_kernel<KK, T>), (unsigned)blocks, RMS_THREADS, 0, s, dinp, partial, \
              dout, inp, weight, rstd, N, C, accumulate_dinp)
  if (K <= 1)
    RMS_BWD(1);
  else if (K <= 2)
    RMS_BWD(2);
  else if (K <= 4)
    RMS_BWD(4);
  else if (K <= 8)
    RMS_BWD(8);
  else if (K <= 16)
    RMS_BWD(16);
  else if (K <= 32)
    RMS_BWD(32);
  else {
    WEFT_CHECK(weft_cuda_memset_(partial, 0, (size_t)(blocks * C) * sizeof(float)));
    WEFT_COST(8.0 * (double)N * (double)C, rms_bwd_bytes);
    WEFT_LAUNCH(rmsnorm_bwd_long_kernel<T>, (unsigned)blocks, 1024, 0, s, dinp, partial, dout, inp,
                weight, rstd, N, C, accumulate_dinp);
  }
#undef RMS_BWD
  WEFT_CHECK(launched(func));
  WEFT_COST((double)(blocks * C), 4.0 * (double)(blocks * C) + 8.0 * (double)C);
  WEFT_LAUNCH(colsum_finish_kernel, grid_for(C, 256), 256, 0, s, dweight, partial, blocks, C, true);
  return launched(func);
}

}  // extern "C++"

weft_status weft_cuda_rmsnorm_forward(float *out, float *rstd, const float *inp,
                                      const float *weight, int64_t N, int64_t C, float eps) {
  REQUIRE_INIT();
  WEFT_RETURN_IF_BAD_(
      weft_check_rmsnorm_forward_(weft_op_name_(__func__), out, rstd, inp, weight, N, C, eps));
  if (N == 0) return WEFT_OK;
  const bool vec = C % 4 == 0 && aligned16(out) && aligned16(inp) && aligned16(weight);
  return rms_forward_impl(__func__, out, rstd, inp, weight, N, C, eps, vec);
}

weft_status weft_cuda_rmsnorm_backward(float *dinp, float *dweight, const float *dout,
                                       const float *inp, const float *weight, const float *rstd,
                                       int64_t N, int64_t C, bool accumulate_dinp) {
  REQUIRE_INIT();
  WEFT_RETURN_IF_BAD_(weft_check_rmsnorm_backward_(weft_op_name_(__func__), dinp, dweight, dout,
                                                   inp, weight, rstd, N, C));
  if (N == 0 || C == 0) return WEFT_OK;
  return rms_backward_impl(__func__, dinp, dweight, dout, inp, weight, rstd, N, C, accumulate_dinp);
}

/* bf16 / f16: the vectorised grouping whenever C % 4 == 0 (the f32
 * member's on aligned buffers), each element loaded and stored alone. */
weft_status weft_cuda_rmsnorm_forward_dt(weft_dtype dt, void *out, float *rstd, const void *inp,
                                         const void *weight, int64_t N, int64_t C, float eps) {
  REQUIRE_INIT();
  const char *op = weft_op_name_(__func__);
  WEFT_CHECK_STORAGE_DT_(op, dt);
  if (dt == WEFT_F32)
    return weft_cuda_rmsnorm_forward((float *)out, rstd, (const float *)inp, (const float *)weight,
                                     N, C, eps);
  WEFT_RETURN_IF_BAD_(weft_check_rmsnorm_forward_(op, (const float *)out, rstd, (const float *)inp,
                                                  (const float *)weight, N, C, eps));
  if (N == 0) return WEFT_OK;
  if (dt == WEFT_BF16)
    return rms_forward_impl(__func__, (bf16_t *)out, rstd, (const bf16_t *)inp,
                            (const bf16_t *)weight, N, C, eps, C % 4 == 0);
  return rms_forward_impl(__func__, (f16_t *)out, rstd, (const f16_t *)inp, (const f16_t *)weight,
                          N, C, eps, C % 4 == 0);
}

weft_status weft_cuda_rmsnorm_backward_dt(weft_dtype dt, void *dinp, float *dweight,
                                          const void *dout, const void *inp, const void *weight,
                                          const float *rstd, int64_t N, int64_t C,
                                          bool accumulate_dinp) {
  REQUIRE_INIT();
  const char *op = weft_op_name_(__func__);
  WEFT_CHECK_STORAGE_DT_(op, dt);
  if (dt == WEFT_F32)
    return weft_cuda_rmsnorm_backward((float *)dinp, dweight, (const float *)dout,
                                      (const float *)inp, (const float *)weight, rstd, N, C,
                                      accumulate_dinp);
  WEFT_RETURN_IF_BAD_(
      weft_check_rmsnorm_backward_(op, dinp, dweight, dout, inp, weight, rstd, N, C));
  if (N == 0 || C == 0) return WEFT_OK;
  if (dt == WEFT_BF16)
    return rms_backward_impl(__func__, (bf16_t *)dinp, dweight, (const bf16_t *)dout,
                             (const bf16_t *)inp, (const bf16_t *)weight, rstd, N, C,
                             accumulate_dinp);
  return rms_backward_impl(__func__, (f16_t *)dinp, dweight, (const f16_t *)dout,
                           (const f16_t *)inp, (const f16_t *)weight, rstd, N, C, accumulate_dinp);
}

/* ----------------------------------------------------------------- RoPE */

weft_status weft_cuda_rope_tables(float *cosb, float *sinb, int64_t max_pos, int64_t hd,
                                  double theta) {
  REQUIRE_INIT();
  CHECK_SIZES(max_pos, hd);
  if (hd == 0 || hd % 2 != 0)
    return weft_error(WEFT_ERR_INVALID, "head dim %lld must be even and > 0", (long long)hd);
  if (!(theta > 0.0)) return weft_error(WEFT_ERR_INVALID, "theta = %g must be > 0", theta);
  const int64_t n = max_pos * hd / 2;
  CHECK_PTR(cosb, n);
  CHECK_PTR(sinb, n);
  if (n == 0) return WEFT_OK;
  float *hc = (float *)malloc((size_t)n * sizeof(float));
  float *hs = (float *)malloc((size_t)n * sizeof(float));
  weft_status st = WEFT_OK;
  if (!hc || !hs) {
    st = weft_error(WEFT_ERR_OOM, "no host memory for %lld-entry RoPE tables", (long long)n);
  } else {
    st = weft_rope_tables(hc, hs, max_pos, hd, theta);
    if (st == WEFT_OK) st = weft_cuda_memcpy_(cosb, hc, (size_t)n * sizeof(float), WEFT_COPY_H2D);
    if (st == WEFT_OK) st = weft_cuda_memcpy_(sinb, hs, (size_t)n * sizeof(float), WEFT_COPY_H2D);
  }
  free(hc);
  free(hs);
  return st;
}

extern "C++" { /* a template inside this file's extern "C" block */
/* E: float, or bf16_t / f16_t (rope_*_dt: each element widened, rotated
 * as in f32, rounded once); vec for 8-byte aligned float rows only */
template <class E>
static weft_status rope_apply(const char *func, E *out, const E *inp, const float *cosb,
                              const float *sinb, int64_t max_pos, int64_t B, int64_t T, int64_t NH,
                              int64_t hd, int64_t pos0, float sign) {
  WEFT_CHECK(weft_cuda_require_init_(func));
  func = weft_op_name_(func);
  CHECK_SIZES_AT(func, max_pos, B, T, NH, hd, pos0);
  if (hd == 0 || hd % 2 != 0)
    return weft_error_at(WEFT_ERR_INVALID, func, "head dim %lld must be even and > 0",
                         (long long)hd);
  if (pos0 + T > max_pos)
    return weft_error_at(WEFT_ERR_INVALID, func,
                         "positions [%lld, %lld) run past the tables' %lld rows", (long long)pos0,
                         (long long)(pos0 + T), (long long)max_pos);
  const int64_t n = B * T * NH * hd;
  const char *names[4] = {"out", "inp", "cosb", "sinb"};
  const void *ptrs[4] = {out, inp, cosb, sinb};
  const int64_t counts[4] = {n, n, (pos0 + T) * hd / 2, (pos0 + T) * hd / 2};
  for (int i = 0; i < 4; i++)
    if (!ptrs[i] && counts[i] > 0)
      return weft_error_at(WEFT_ERR_INVALID, func, "%s is NULL", names[i]);
  if (n == 0) return WEFT_OK;
  WEFT_COST(3.0 * (double)n, 2.0 * (double)sizeof(E) * (double)n + 4.0 * (double)(T * hd));
  const bool vec =
      sizeof(E) == sizeof(float) && ((uintptr_t)out & 7u) == 0 && ((uintptr_t)inp & 7u) == 0;
  WEFT_LAUNCH(rope_kernel<E>, grid_for(B * T, 1), 128, 0, compute_stream(), out, inp, cosb, sinb,
              B * T, T, NH, hd / 2, pos0, sign, vec);
  return launched(func);
}
}  // extern "C++"

weft_status weft_cuda_rope_forward(float *out, const float *inp, const float *cosb,
                                   const float *sinb, int64_t max_pos, int64_t B, int64_t T,
                                   int64_t NH, int64_t hd, int64_t pos0) {
  return rope_apply(__func__, out, inp, cosb, sinb, max_pos, B, T, NH, hd, pos0, 1.0f);
}

weft_status weft_cuda_rope_backward(float *dinp, const float *dout, const float *cosb,
                                    const float *sinb, int64_t max_pos, int64_t B, int64_t T,
                                    int64_t NH, int64_t hd, int64_t pos0) {
  return rope_apply(__func__, dinp, dout, cosb, sinb, max_pos, B, T, NH, hd, pos0, -1.0f);
}

/* bf16 / f16 (backend.h rope_forward_dt / rope_backward_dt) */
static weft_status rope_apply_dt(const char *func, weft_dtype dt, void *out, const void *inp,
                                 const float *cosb, const float *sinb, int64_t max_pos, int64_t B,
                                 int64_t T, int64_t NH, int64_t hd, int64_t pos0, float sign) {
  WEFT_CHECK(weft_cuda_require_init_(func));
  WEFT_CHECK_STORAGE_DT_(weft_op_name_(func), dt);
  if (dt == WEFT_F32)
    return rope_apply(func, (float *)out, (const float *)inp, cosb, sinb, max_pos, B, T, NH, hd,
                      pos0, sign);
  if (dt == WEFT_BF16)
    return rope_apply(func, (bf16_t *)out, (const bf16_t *)inp, cosb, sinb, max_pos, B, T, NH, hd,
                      pos0, sign);
  return rope_apply(func, (f16_t *)out, (const f16_t *)inp, cosb, sinb, max_pos, B, T, NH, hd, pos0,
                    sign);
}

weft_status weft_cuda_rope_forward_dt(weft_dtype dt, void *out, const void *inp, const float *cosb,
                                      const float *sinb, int64_t max_pos, int64_t B, int64_t T,
                                      int64_t NH, int64_t hd, int64_t pos0) {
  return rope_apply_dt(__func__, dt, out, inp, cosb, sinb, max_pos, B, T, NH, hd, pos0, 1.0f);
}

weft_status weft_cuda_rope_backward_dt(weft_dtype dt, void *dinp, const void *dout,
                                       const float *cosb, const float *sinb, int64_t max_pos,
                                       int64_t B, int64_t T, int64_t NH, int64_t hd, int64_t pos0) {
  return rope_apply_dt(__func__, dt, dinp, dout, cosb, sinb, max_pos, B, T, NH, hd, pos0, -1.0f);
}

/* ------------------------------------------------------ SwiGLU, residual */

weft_status weft_cuda_swiglu_forward(float *out, const float *a, const float *b, int64_t n) {
  REQUIRE_INIT();
  CHECK_SIZES(n);
  CHECK_PTR(out, n);
  CHECK_PTR(a, n);
  CHECK_PTR(b, n);
  if (n == 0) return WEFT_OK;
  const bool vec = aligned16(out) && aligned16(a) && aligned16(b);
  WEFT_COST(8.0 * (double)n, 12.0 * (double)n);
  WEFT_LAUNCH(swiglu_fwd_kernel, grid_for(vec ? (n + 3) / 4 : n, 256), 256, 0, compute_stream(),
              out, a, b, n, vec);
  return launched(__func__);
}

weft_status weft_cuda_swiglu_backward(float *da, float *db, const float *dout, const float *a,
                                      const float *b, int64_t n) {
  REQUIRE_INIT();
  WEFT_RETURN_IF_BAD_(weft_check_swiglu_backward_(weft_op_name_(__func__), da, db, dout, a, b, n));
  if (n == 0) return WEFT_OK;
  const bool vec =
      aligned16(da) && aligned16(db) && aligned16(dout) && aligned16(a) && aligned16(b);
  WEFT_COST(12.0 * (double)n, 20.0 * (double)n);
  WEFT_LAUNCH(swiglu_bwd_kernel, grid_for(vec ? (n + 3) / 4 : n, 256), 256, 0, compute_stream(), da,
              db, dout, a, b, n, vec);
  return launched(__func__);
}

weft_status weft_cuda_swiglu_forward_dt(weft_dtype dt, void *out, const void *a, const void *b,
                                        int64_t n) {
  REQUIRE_INIT();
  const char *op = weft_op_name_(__func__);
  WEFT_CHECK_STORAGE_DT_(op, dt);
  if (dt == WEFT_F32)
    return weft_cuda_swiglu_forward((float *)out, (const float *)a, (const float *)b, n);
  WEFT_RETURN_IF_BAD_(
      weft_check_swiglu_forward_(op, (const float *)out, (const float *)a, (const float *)b, n));
  if (n == 0) return WEFT_OK;
  WEFT_COST(8.0 * (double)n, 6.0 * (double)n);
  if (dt == WEFT_BF16)
    WEFT_LAUNCH(swiglu_fwd_dt_kernel<bf16_t>, grid_for(n, 256), 256, 0, compute_stream(),
                (bf16_t *)out, (const bf16_t *)a, (const bf16_t *)b, n);
  else
    WEFT_LAUNCH(swiglu_fwd_dt_kernel<f16_t>, grid_for(n, 256), 256, 0, compute_stream(),
                (f16_t *)out, (const f16_t *)a, (const f16_t *)b, n);
  return launched(__func__);
}

weft_status weft_cuda_swiglu_backward_dt(weft_dtype dt, void *da, void *db, const void *dout,
                                         const void *a, const void *b, int64_t n) {
  REQUIRE_INIT();
  const char *op = weft_op_name_(__func__);
  WEFT_CHECK_STORAGE_DT_(op, dt);
  if (dt == WEFT_F32)
    return weft_cuda_swiglu_backward((float *)da, (float *)db, (const float *)dout,
                                     (const float *)a, (const float *)b, n);
  WEFT_RETURN_IF_BAD_(weft_check_swiglu_backward_(op, (const float *)da, (const float *)db,
                                                  (const float *)dout, (const float *)a,
                                                  (const float *)b, n));
  if (n == 0) return WEFT_OK;
  WEFT_COST(12.0 * (double)n, 10.0 * (double)n);
  if (dt == WEFT_BF16)
    WEFT_LAUNCH(swiglu_bwd_dt_kernel<bf16_t>, grid_for(n, 256), 256, 0, compute_stream(),
                (bf16_t *)da, (bf16_t *)db, (const bf16_t *)dout, (const bf16_t *)a,
                (const bf16_t *)b, n);
  else
    WEFT_LAUNCH(swiglu_bwd_dt_kernel<f16_t>, grid_for(n, 256), 256, 0, compute_stream(),
                (f16_t *)da, (f16_t *)db, (const f16_t *)dout, (const f16_t *)a, (const f16_t *)b,
                n);
  return launched(__func__);
}

weft_status weft_cuda_residual_forward(float *out, const float *a, const float *b, int64_t n) {
  REQUIRE_INIT();
  CHECK_SIZES(n);
  CHECK_PTR(out, n);
  CHECK_PTR(a, n);
  CHECK_PTR(b, n);
  if (n == 0) return WEFT_OK;
  const bool vec = aligned16(out) && aligned16(a) && aligned16(b);
  WEFT_COST((double)n, 12.0 * (double)n);
  WEFT_LAUNCH(add_kernel, grid_for(vec ? (n + 3) / 4 : n, 256), 256, 0, compute_stream(), out, a, b,
              n, vec);
  return launched(__func__);
}

weft_status weft_cuda_residual_backward(float *da, float *db, const float *dout, int64_t n) {
  REQUIRE_INIT();
  CHECK_SIZES(n);
  CHECK_PTR(dout, n);
  if (n == 0) return WEFT_OK;
  float *dst[2] = {da, db};
  for (int k = 0; k < 2; k++) {
    float *x = dst[k];
    if (!x) continue;
    const bool vec = aligned16(x) && aligned16(dout);
    WEFT_COST((double)n, 12.0 * (double)n);
    WEFT_LAUNCH(add_kernel, grid_for(vec ? (n + 3) / 4 : n, 256), 256, 0, compute_stream(), x, x,
                dout, n, vec);
    WEFT_CHECK(launched(__func__));
  }
  return WEFT_OK;
}

/* ------------------------------------------------------- cross-entropy */

weft_status weft_cuda_cross_entropy_forward(double *loss, float *lse, const float *logits,
                                            const int32_t *targets, int64_t N, int64_t V) {
  return ce_forward_impl(__func__, loss, lse, logits, targets, N, V);
}

weft_status weft_cuda_cross_entropy_backward(float *dlogits, const float *logits, const float *lse,
                                             const int32_t *targets, int64_t N, int64_t V,
                                             float scale) {
  return ce_backward_impl(__func__, true, dlogits, logits, lse, targets, N, 0, V, scale);
}

weft_status weft_cuda_cross_entropy_local_max(float *row_max, const float *logits_local, int64_t N,
                                              int64_t nv) {
  return ce_local_max_impl(__func__, row_max, logits_local, N, nv);
}

weft_status weft_cuda_cross_entropy_local_target(float *target_logit, const float *logits_local,
                                                 const int32_t *targets, int64_t N, int64_t v0,
                                                 int64_t nv) {
  return ce_local_target_impl(__func__, target_logit, logits_local, targets, N, v0, nv);
}

weft_status weft_cuda_cross_entropy_local_sumexp(float *sumexp, const float *logits_local,
                                                 const float *gmax, int64_t N, int64_t nv) {
  return ce_local_sumexp_impl(__func__, sumexp, logits_local, gmax, N, nv);
}

weft_status weft_cuda_cross_entropy_finish(double *loss, float *lse, const float *gmax,
                                           const float *gsum, const float *gtarget, int64_t N) {
  REQUIRE_INIT();
  CHECK_SIZES(N);
  CHECK_PTR(loss, 1);
  CHECK_PTR(gmax, N);
  CHECK_PTR(gsum, N);
  CHECK_PTR(gtarget, N);
  if (N == 0) {
    *loss = 0.0;
    return WEFT_OK;
  }
  if (N > (int64_t)UINT32_MAX)
    return weft_error(WEFT_ERR_INVALID, "N = %lld rows: at most 2^32 - 1 supported", (long long)N);
  void *scratch;
  WEFT_CHECK(weft_cuda_scratch_(256 + (size_t)N * sizeof(double), &scratch));
  loss_result *dres = (loss_result *)scratch;
  double *row_loss = (double *)((char *)scratch + 256);
  cudaStream_t s = compute_stream();
  WEFT_CHECK(weft_cuda_memset_(dres, 0, sizeof *dres));
  WEFT_COST(4.0 * (double)N, 20.0 * (double)N);
  WEFT_LAUNCH(finish_rows_kernel, grid_for(N, 256), 256, 0, s, row_loss, dres, gmax, gsum, gtarget,
              N);
  WEFT_CHECK(launched(__func__));
  WEFT_COST((double)N, 8.0 * (double)N);
  WEFT_LAUNCH(sum_d_kernel, 1, 1024, 0, s, dres, row_loss, N);
  WEFT_CHECK(launched(__func__));
  loss_result res;
  WEFT_CHECK(fetch_result(dres, &res));
  if (res.flag != 0) {
    const int64_t n = N - (int64_t)res.flag;
    float bad = 0.0f;
    WEFT_CHECK(weft_cuda_memcpy_(&bad, gsum + n, sizeof bad, WEFT_COPY_D2H));
    return weft_error(WEFT_ERR_INVALID, "sum of exponentials of row %lld is %g (must be > 0)",
                      (long long)n, (double)bad);
  }
  *loss = res.sum / (double)N;
  if (lse) {
    WEFT_COST(2.0 * (double)N, 12.0 * (double)N);
    WEFT_LAUNCH(finish_lse_kernel, grid_for(N, 256), 256, 0, s, lse, gmax, gsum, N);
    WEFT_CHECK(launched(__func__));
  }
  return WEFT_OK;
}

weft_status weft_cuda_cross_entropy_backward_local(float *dlogits_local, const float *logits_local,
                                                   const float *lse, const int32_t *targets,
                                                   int64_t N, int64_t v0, int64_t nv, float scale) {
  return ce_backward_impl(__func__, false, dlogits_local, logits_local, lse, targets, N, v0, nv,
                          scale);
}

/* bf16 / f16 logits (backend.h cross_entropy_*_dt): the kernels above on
 * the widened elements; f32 is the members above. */
#define CE_DT(call_f32, call_bf16, call_f16)             \
  do {                                                   \
    REQUIRE_INIT();                                      \
    WEFT_CHECK_STORAGE_DT_(weft_op_name_(__func__), dt); \
    if (dt == WEFT_F32) return call_f32;                 \
    if (dt == WEFT_BF16) return call_bf16;               \
    return call_f16;                                     \
  } while (0)

weft_status weft_cuda_cross_entropy_forward_dt(weft_dtype dt, double *loss, float *lse,
                                               const void *logits, const int32_t *targets,
                                               int64_t N, int64_t V) {
  CE_DT(ce_forward_impl(__func__, loss, lse, (const float *)logits, targets, N, V),
        ce_forward_impl(__func__, loss, lse, (const bf16_t *)logits, targets, N, V),
        ce_forward_impl(__func__, loss, lse, (const f16_t *)logits, targets, N, V));
}

weft_status weft_cuda_cross_entropy_backward_dt(weft_dtype dt, void *dlogits, const void *logits,
                                                const float *lse, const int32_t *targets, int64_t N,
                                                int64_t V, float scale) {
  CE_DT(ce_backward_impl(__func__, true, (float *)dlogits, (const float *)logits, lse, targets, N,
                         0, V, scale),
        ce_backward_impl(__func__, true, (bf16_t *)dlogits, (const bf16_t *)logits, lse, targets, N,
                         0, V, scale),
        ce_backward_impl(__func__, true, (f16_t *)dlogits, (const f16_t *)logits, lse, targets, N,
                         0, V, scale));
}

weft_status weft_cuda_cross_entropy_local_max_dt(weft_dtype dt, float *row_max,
                                                 const void *logits_local, int64_t N, int64_t nv) {
  CE_DT(ce_local_max_impl(__func__, row_max, (const float *)logits_local, N, nv),
        ce_local_max_impl(__func__, row_max, (const bf16_t *)logits_local, N, nv),
        ce_local_max_impl(__func__, row_max, (const f16_t *)logits_local, N, nv));
}

weft_status weft_cuda_cross_entropy_local_target_dt(weft_dtype dt, float *target_logit,
                                                    const void *logits_local,
                                                    const int32_t *targets, int64_t N, int64_t v0,
                                                    int64_t nv) {
  CE_DT(
      ce_local_target_impl(__func__, target_logit, (const float *)logits_local, targets, N, v0, nv),
      ce_local_target_impl(__func__, target_logit, (const bf16_t *)logits_local, targets, N, v0,
                           nv),
      ce_local_target_impl(__func__, target_logit, (const f16_t *)logits_local, targets, N, v0,
                           nv));
}

weft_status weft_cuda_cross_entropy_local_sumexp_dt(weft_dtype dt, float *sumexp,
                                                    const void *logits_local, const float *gmax,
                                                    int64_t N, int64_t nv) {
  CE_DT(ce_local_sumexp_impl(__func__, sumexp, (const float *)logits_local, gmax, N, nv),
        ce_local_sumexp_impl(__func__, sumexp, (const bf16_t *)logits_local, gmax, N, nv),
        ce_local_sumexp_impl(__func__, sumexp, (const f16_t *)logits_local, gmax, N, nv));
}

weft_status weft_cuda_cross_entropy_backward_local_dt(weft_dtype dt, void *dlogits_local,
                                                      const void *logits_local, const float *lse,
                                                      const int32_t *targets, int64_t N, int64_t v0,
                                                      int64_t nv, float scale) {
  CE_DT(ce_backward_impl(__func__, false, (float *)dlogits_local, (const float *)logits_local, lse,
                         targets, N, v0, nv, scale),
        ce_backward_impl(__func__, false, (bf16_t *)dlogits_local, (const bf16_t *)logits_local,
                         lse, targets, N, v0, nv, scale),
        ce_backward_impl(__func__, false, (f16_t *)dlogits_local, (const f16_t *)logits_local, lse,
                         targets, N, v0, nv, scale));
}

}  // extern "C"
