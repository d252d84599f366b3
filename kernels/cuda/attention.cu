/* GQA attention, causal or not, on the device (weft_attention_forward /
 * _backward's math, kernels/cpu/attention.c), built on batched GEMMs so that
 * it runs on tensor cores in the TF32 and BF16 matmul precisions.
 *
 * Layout. q is (B, T, H, hd) = (B, T, Hkv, G, hd) with G = H / Hkv query
 * heads per kv head (h = g * G + j reads kv head g), and k, v are
 * (B, T, Hkv, hd). Swapping the T and Hkv axes gives
 *   Qp (B, Hkv, T, G, hd)   Kp, Vp (B, Hkv, T, hd)
 * where, for each (b, g), the G query heads of a block of query rows
 * [t0, t0 + nb) are the nb * G consecutive rows [t0 * G, (t0 + nb) * G) of
 * one hd-wide matrix (row t * G + j), and their keys are the rows [0, end)
 * of Kp's (b, g) matrix, end = t0 + nb when causal (later keys are masked
 * for every row of the block), else end = T (no mask). So one
 * strided-batched GEMM over the B * Hkv pairs (b, g) covers all heads,
 * with no copy of k and v per query head.
 *
 * Forward, per block of Bq = min(T, ATT_BQ) query rows:
 *   S = Qblk Kp[0:end]^T / sqrt(hd)              (B*Hkv GEMMs, nb*G x end)
 *   P = softmax(S (+ causal mask)) row by row, lse (one warp per row)
 *   Oblk = P Vp[0:end]                            (nb*G x hd)
 * then O is permuted back to (B, T, H, hd). lse is (B, H, T) in scaled
 * units, as the CPU's.
 * Backward recomputes P per block from lse, with D = rowsum(dO * O) (equal
 * to rowsum(P * dP) because O = P V; from `out`, so without a pass over
 * the scores):
 *   P = exp(S - lse), dP = dOblk Vp[0:end]^T, dS = P * (dP - D) / sqrt(hd)
 *   dV[0:end] += P^T dOblk,  dK[0:end] += dS^T Qblk,  dQblk = dS Kp[0:end]
 * so a kv head's gradients sum over its G query heads inside the GEMMs.
 *
 * Scratch (weft_cuda_attention_scratch_bytes, floats, each region rounded
 * up to 256 bytes): the permuted copies 3 * B*T*H*hd (Qp, dOp, dQp; forward
 * uses two: Qp, Op) + 4 * B*T*Hkv*hd (Kp, Vp, dKp, dVp), D (B*H*T), and two
 * score blocks of B*H*Bq*T floats each (forward uses one). Never a (T, T)
 * matrix per head: for T = 1024, Bq = 128 the scores are 1/8 of it.
 * Causal: the rows above the diagonal inside a block are computed and
 * masked (for Bq = 128 and T = 1024, 12% more score work than the
 * triangle). The scratch is the same for both (end <= T).
 */
#include <math.h>
#include <stdint.h>

#include "arg_checks.h"
#include "cuda_compat.h"
#include "cuda_internal.h"
#include "cuda_kernels.h"
#include "device_util.cuh"

#define ATT_BQ 128

namespace {

bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

/* The launch status, naming the operation of func. */
weft_status launched(const char *func) {
  return weft_cuda_check_((int)cudaGetLastError(), weft_op_name_(func));
}

/* Scratch regions, in floats from the start (each a multiple of 64). */
struct att_layout {
  int64_t bq;                                      /* query rows per block */
  int64_t qp, kp, vp, op, dqp, dkp, dvp, d, s, ds; /* offsets */
  int64_t total;                                   /* floats */
};

int64_t round64(int64_t x) { return (x + 63) / 64 * 64; }

att_layout layout_for(int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t hd) {
  att_layout L;
  L.bq = T < ATT_BQ ? T : ATT_BQ;
  const int64_t nq = round64(B * T * H * hd), nkv = round64(B * T * Hkv * hd);
  const int64_t nl = round64(B * H * T), ns = round64(B * H * L.bq * T);
  int64_t o = 0;
  L.qp = o, o += nq;
  L.kp = o, o += nkv;
  L.vp = o, o += nkv;
  L.op = o, o += nq; /* O (forward) or dO (backward) */
  L.s = o, o += ns;
  L.dqp = o, o += nq;
  L.dkp = o, o += nkv;
  L.dvp = o, o += nkv;
  L.d = o, o += nl;
  L.ds = o, o += ns;
  L.total = o;
  return L;
}

__device__ inline float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

/* dst (A0, A2, A1, inner) = src (A0, A1, A2, inner) with axes 1 and 2
 * swapped; one warp (threadIdx.y) per row of `inner` floats, in dst
 * order. sld: elements from src's (a0, a1) to (a0, a1 + 1) (A2 * inner
 * when packed), dld: from dst's (a0, a2) to (a0, a2 + 1) (A1 * inner), so
 * either side may be column slices of wider rows (weft_attention_rows).
 * vec: inner, sld, dld % 4 == 0 and both 16-byte aligned. */
template <class D, class S>
__global__ void permute_kernel(D *dst, const S *src, int64_t A0, int64_t A1, int64_t A2,
                               int64_t inner, int64_t sld, int64_t dld, bool vec) {
  const int64_t rows = A0 * A1 * A2;
  for (int64_t R = (int64_t)blockIdx.x * blockDim.y + threadIdx.y; R < rows;
       R += (int64_t)gridDim.x * blockDim.y) {
    const int64_t a1 = R % A1, rest = R / A1, a2 = rest % A2, a0 = rest / A2;
    const S *s = src + (a0 * A1 + a1) * sld + a2 * inner;
    D *d = dst + (a0 * A2 + a2) * dld + a1 * inner;
    if (vec) {
      for (int64_t c = threadIdx.x; c < inner / 4; c += 32) ((f4 *)d)[c] = ((const f4 *)s)[c];
    } else {
      for (int64_t c = threadIdx.x; c < inner; c += 32) d[c] = from_f32<D>(as_f32(s[c]));
    }
  }
}

/* dst = the permuted src; D and S float, or one of them bf16_t / f16_t
 * (the 16-bit side widened or rounded on the way: attention_*_dt). sld,
 * dld: permute_kernel's, 0 for packed. */
template <class D, class S>
weft_status permute(const char *func, D *dst, const S *src, int64_t A0, int64_t A1, int64_t A2,
                    int64_t inner, int64_t sld = 0, int64_t dld = 0) {
  if (sld == 0) sld = A2 * inner;
  if (dld == 0) dld = A1 * inner;
  const bool vec = sizeof(D) == sizeof(float) && sizeof(S) == sizeof(float) && inner % 4 == 0 &&
                   sld % 4 == 0 && dld % 4 == 0 && aligned16(dst) && aligned16(src);
  WEFT_COST(0, (double)(sizeof(D) + sizeof(S)) * (double)(A0 * A1 * A2 * inner));
  WEFT_LAUNCH((permute_kernel<D, S>), grid_for(A0 * A1 * A2, 8), dim3(32, 8), 0, compute_stream(),
              dst, src, A0, A1, A2, inner, sld, dld, vec);
  return launched(func);
}

/* The six row strides of rows, 0 where rows is NULL (packed). */
struct row_strides {
  int64_t q, k, v, dq, dk, dv;
};
row_strides strides_of(const weft_attention_rows *rows) {
  row_strides r = {0, 0, 0, 0, 0, 0};
  if (rows) r = {rows->q, rows->k, rows->v, rows->dq, rows->dk, rows->dv};
  return r;
}

/* Where row R of a score block lives: batch i = (b, g), row r = tl * G + j
 * of the block starting at t0; its lse / D index is (b, h = g G + j, t). */
struct row_pos {
  int64_t t, lidx;
};
__device__ inline row_pos row_of(int64_t R, int64_t M, int64_t G, int64_t Hkv, int64_t H, int64_t T,
                                 int64_t t0) {
  const int64_t i = R / M, r = R - i * M;
  const int64_t tl = r / G, j = r - tl * G;
  const int64_t b = i / Hkv, g = i - b * Hkv;
  row_pos p;
  p.t = t0 + tl;
  p.lidx = (b * H + g * G + j) * T + p.t;
  return p;
}

/* Forward: rows of S (nrows x end, contiguous) become the softmax in
 * place (causal: 0 past the diagonal), lse saved; one warp per row, online
 * max and sum per lane merged across the warp. */
__global__ void softmax_fwd_kernel(float *S, float *lse, int64_t nrows, int64_t end, int64_t M,
                                   int64_t G, int64_t Hkv, int64_t H, int64_t T, int64_t t0,
                                   bool causal) {
  for (int64_t R = (int64_t)blockIdx.x * blockDim.y + threadIdx.y; R < nrows;
       R += (int64_t)gridDim.x * blockDim.y) {
    const row_pos p = row_of(R, M, G, Hkv, H, T, t0);
    const int64_t valid = causal ? p.t + 1 : end;
    float *row = S + R * end;
    float m = -INFINITY, s = 0.0f;
    for (int64_t c = threadIdx.x; c < valid; c += 32) {
      const float x = row[c];
      lse_push(m, s, x);
    }
    for (int o = 16; o > 0; o >>= 1) {
      const float m2 = __shfl_xor_sync(0xffffffffu, m, o);
      const float s2 = __shfl_xor_sync(0xffffffffu, s, o);
      lse_merge(m, s, m2, s2);
    }
    const float inv = 1.0f / s;
    for (int64_t c = threadIdx.x; c < end; c += 32)
      row[c] = c < valid ? expf(row[c] - m) * inv : 0.0f;
    if (threadIdx.x == 0) lse[p.lidx] = m + logf(s);
  }
}

/* Backward: P = exp(S - lse) (causal: 0 past the diagonal) in place in
 * S, and dS = P * (dP - D) * scale in place in dP. */
__global__ void softmax_bwd_kernel(float *S, float *dP, const float *lse, const float *D,
                                   int64_t nrows, int64_t end, int64_t M, int64_t G, int64_t Hkv,
                                   int64_t H, int64_t T, int64_t t0, float scale, bool causal) {
  for (int64_t R = (int64_t)blockIdx.x * blockDim.y + threadIdx.y; R < nrows;
       R += (int64_t)gridDim.x * blockDim.y) {
    const row_pos p = row_of(R, M, G, Hkv, H, T, t0);
    const int64_t valid = causal ? p.t + 1 : end;
    const float l = lse[p.lidx], d = D[p.lidx];
    float *srow = S + R * end, *drow = dP + R * end;
    for (int64_t c = threadIdx.x; c < end; c += 32) {
      const float pv = c < valid ? expf(srow[c] - l) : 0.0f;
      srow[c] = pv;
      drow[c] = c < valid ? pv * (drow[c] - d) * scale : 0.0f;
    }
  }
}

/* D[(b*H + h)*T + t] = dout[b, t, h, :] . out[b, t, h, :]; warp per row. */
template <class E>
__global__ void rowdot_kernel(float *D, const E *dout, const E *out, int64_t B, int64_t T,
                              int64_t H, int64_t hd) {
  const int64_t rows = B * T * H;
  for (int64_t R = (int64_t)blockIdx.x * blockDim.y + threadIdx.y; R < rows;
       R += (int64_t)gridDim.x * blockDim.y) {
    const int64_t h = R % H, bt = R / H, t = bt % T, b = bt / T;
    const E *x = dout + R * hd, *y = out + R * hd;
    float s = 0.0f;
    for (int64_t c = threadIdx.x; c < hd; c += 32) s += as_f32(x[c]) * as_f32(y[c]);
    s = warp_sum(s);
    if (threadIdx.x == 0) D[(b * H + h) * T + t] = s;
  }
}

/* hd == 0: every score is 0, so lse = log(number of keys seen): t + 1
 * (causal) or T. */
__global__ void lse_empty_kernel(float *lse, int64_t BH, int64_t T, bool causal) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < BH * T; i += stride)
    lse[i] = logf((float)(causal ? i % T + 1 : T));
}

/* NULL check of named pointers with element counts. */
weft_status check_ptrs(const char *func, int n, const char *const *names, const void *const *ptrs,
                       const int64_t *counts) {
  func = weft_op_name_(func);
  for (int i = 0; i < n; i++)
    if (!ptrs[i] && counts[i] > 0)
      return weft_error_at(WEFT_ERR_INVALID, func, "%s is NULL", names[i]);
  return WEFT_OK;
}

}  // namespace

extern "C" {

size_t weft_cuda_attention_scratch_bytes(int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t hd) {
  if (B <= 0 || T <= 0 || H <= 0 || Hkv <= 0 || hd <= 0) return 0;
  return (size_t)layout_for(B, T, H, Hkv, hd).total * sizeof(float);
}

}  // extern "C"

namespace {

/* The members for q, k, v, out (dq, dk, dv, dout) of element type E:
 * float, or bf16_t / f16_t (attention_*_dt), widened where they are
 * permuted into the f32 scratch and rounded where the results are
 * permuted back, so everything between is the f32 member's. func: the
 * entry point's name, for messages. */
template <class E>
weft_status att_forward_impl(const char *func, E *out, float *lse, const E *q, const E *k,
                             const E *v, int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t hd,
                             bool causal, const weft_attention_rows *rows, void *scratch) {
  const row_strides ld = strides_of(rows);
  WEFT_CHECK(weft_cuda_require_init_(func));
  WEFT_RETURN_IF_BAD_(weft_check_attention_shape_(weft_op_name_(func), B, T, H, Hkv, hd));
  {
    const int64_t nq = B * T * H * hd, nkv = B * T * Hkv * hd;
    const char *names[6] = {"out", "lse", "q", "k", "v", "scratch"};
    const void *ptrs[6] = {out, lse, q, k, v, scratch};
    const int64_t counts[6] = {
        nq, B * H * T, nq, nkv, nkv, (int64_t)weft_cuda_attention_scratch_bytes(B, T, H, Hkv, hd)};
    WEFT_CHECK(check_ptrs(func, 6, names, ptrs, counts));
  }
  if (B * T * H == 0) return WEFT_OK;
  cudaStream_t s = compute_stream();
  if (hd == 0) {
    WEFT_COST(B * H * T, 4.0 * (double)(B * H * T));
    WEFT_LAUNCH(lse_empty_kernel, grid_for(B * H * T, 256), 256, 0, s, lse, B * H, T, causal);
    return launched(func);
  }
  const int64_t G = H / Hkv, count = B * Hkv;
  const att_layout L = layout_for(B, T, H, Hkv, hd);
  float *base = (float *)scratch;
  float *Qp = base + L.qp, *Kp = base + L.kp, *Vp = base + L.vp, *Op = base + L.op, *S = base + L.s;
  const float scale = (float)(1.0 / sqrt((double)hd));
  WEFT_CHECK(permute(func, Qp, q, B, T, Hkv, G * hd, ld.q));
  WEFT_CHECK(permute(func, Kp, k, B, T, Hkv, hd, ld.k));
  WEFT_CHECK(permute(func, Vp, v, B, T, Hkv, hd, ld.v));
  for (int64_t t0 = 0; t0 < T; t0 += L.bq) {
    const int64_t nb = T - t0 < L.bq ? T - t0 : L.bq, end = causal ? t0 + nb : T, M = nb * G;
    /* S = scale * Qblk Kp[0:end]^T, per (b, g) */
    WEFT_CHECK(weft_cuda_sgemm_strided_batched(false, true, M, end, hd, scale, Qp + t0 * G * hd, hd,
                                               T * G * hd, Kp, hd, T * hd, 0.0f, S, end, M * end,
                                               count));
    /* each row read twice (max/sum, then the write), lse written */
    WEFT_COST(5.0 * (double)(count * M * end), 12.0 * (double)(count * M * end) + 4.0 * count * M);
    WEFT_LAUNCH(softmax_fwd_kernel, grid_for(count * M, 8), dim3(32, 8), 0, s, S, lse, count * M,
                end, M, G, Hkv, H, T, t0, causal);
    WEFT_CHECK(launched(func));
    /* Oblk = P Vp[0:end] */
    WEFT_CHECK(weft_cuda_sgemm_strided_batched(false, false, M, hd, end, 1.0f, S, end, M * end, Vp,
                                               hd, T * hd, 0.0f, Op + t0 * G * hd, hd, T * G * hd,
                                               count));
  }
  return permute(func, out, Op, B, Hkv, T, G * hd);
}

template <class E>
weft_status att_backward_impl(const char *func, E *dq, E *dk, E *dv, const E *dout, const E *q,
                              const E *k, const E *v, const float *lse, const E *out, int64_t B,
                              int64_t T, int64_t H, int64_t Hkv, int64_t hd, bool causal,
                              const weft_attention_rows *rows, void *scratch) {
  const row_strides ld = strides_of(rows);
  WEFT_CHECK(weft_cuda_require_init_(func));
  WEFT_RETURN_IF_BAD_(weft_check_attention_shape_(weft_op_name_(func), B, T, H, Hkv, hd));
  const int64_t nq = B * T * H * hd, nkv = B * T * Hkv * hd;
  {
    const char *names[10] = {"dq", "dk", "dv", "dout", "q", "k", "v", "lse", "out", "scratch"};
    const void *ptrs[10] = {dq, dk, dv, dout, q, k, v, lse, out, scratch};
    const int64_t counts[10] = {
        nq,  nkv, nkv,       nq, nq,
        nkv, nkv, B * H * T, nq, (int64_t)weft_cuda_attention_scratch_bytes(B, T, H, Hkv, hd)};
    WEFT_CHECK(check_ptrs(func, 10, names, ptrs, counts));
  }
  if (nkv > 0 && H == 0) { /* no query heads read these kv heads: zeros, row by row */
    const size_t bytes = (size_t)(Hkv * hd) * sizeof(E);
    for (int64_t i = 0; i < B * T; i++) {
      WEFT_CHECK(weft_cuda_memset_(dk + i * (ld.dk ? ld.dk : Hkv * hd), 0, bytes));
      WEFT_CHECK(weft_cuda_memset_(dv + i * (ld.dv ? ld.dv : Hkv * hd), 0, bytes));
    }
  }
  if (nq == 0) return WEFT_OK;
  cudaStream_t s = compute_stream();
  const int64_t G = H / Hkv, count = B * Hkv;
  const att_layout L = layout_for(B, T, H, Hkv, hd);
  float *base = (float *)scratch;
  float *Qp = base + L.qp, *Kp = base + L.kp, *Vp = base + L.vp, *dOp = base + L.op;
  float *P = base + L.s, *dS = base + L.ds, *dQp = base + L.dqp, *dKp = base + L.dkp,
        *dVp = base + L.dvp, *D = base + L.d;
  const float scale = (float)(1.0 / sqrt((double)hd));
  WEFT_CHECK(permute(func, Qp, q, B, T, Hkv, G * hd, ld.q));
  WEFT_CHECK(permute(func, Kp, k, B, T, Hkv, hd, ld.k));
  WEFT_CHECK(permute(func, Vp, v, B, T, Hkv, hd, ld.v));
  WEFT_CHECK(permute(func, dOp, dout, B, T, Hkv, G * hd));
  WEFT_COST(2.0 * (double)nq, 8.0 * (double)nq + 4.0 * (double)(B * T * H));
  WEFT_LAUNCH(rowdot_kernel<E>, grid_for(B * T * H, 8), dim3(32, 8), 0, s, D, dout, out, B, T, H,
              hd);
  WEFT_CHECK(launched(func));
  WEFT_CHECK(weft_cuda_memset_(dKp, 0, (size_t)nkv * sizeof(float)));
  WEFT_CHECK(weft_cuda_memset_(dVp, 0, (size_t)nkv * sizeof(float)));
  for (int64_t t0 = 0; t0 < T; t0 += L.bq) {
    const int64_t nb = T - t0 < L.bq ? T - t0 : L.bq, end = causal ? t0 + nb : T, M = nb * G;
    const float *Qb = Qp + t0 * G * hd, *dOb = dOp + t0 * G * hd;
    /* S = scale * Qblk Kp^T, dP = dOblk Vp^T */
    WEFT_CHECK(weft_cuda_sgemm_strided_batched(false, true, M, end, hd, scale, Qb, hd, T * G * hd,
                                               Kp, hd, T * hd, 0.0f, P, end, M * end, count));
    WEFT_CHECK(weft_cuda_sgemm_strided_batched(false, true, M, end, hd, 1.0f, dOb, hd, T * G * hd,
                                               Vp, hd, T * hd, 0.0f, dS, end, M * end, count));
    /* S and dP read, both written; lse and D per row */
    WEFT_COST(6.0 * (double)(count * M * end), 16.0 * (double)(count * M * end) + 8.0 * count * M);
    WEFT_LAUNCH(softmax_bwd_kernel, grid_for(count * M, 8), dim3(32, 8), 0, s, P, dS, lse, D,
                count * M, end, M, G, Hkv, H, T, t0, scale, causal);
    WEFT_CHECK(launched(func));
    /* dV[0:end] += P^T dOblk, dK[0:end] += dS^T Qblk, dQblk = dS Kp[0:end] */
    WEFT_CHECK(weft_cuda_sgemm_strided_batched(true, false, end, hd, M, 1.0f, P, end, M * end, dOb,
                                               hd, T * G * hd, 1.0f, dVp, hd, T * hd, count));
    WEFT_CHECK(weft_cuda_sgemm_strided_batched(true, false, end, hd, M, 1.0f, dS, end, M * end, Qb,
                                               hd, T * G * hd, 1.0f, dKp, hd, T * hd, count));
    WEFT_CHECK(weft_cuda_sgemm_strided_batched(false, false, M, hd, end, 1.0f, dS, end, M * end, Kp,
                                               hd, T * hd, 0.0f, dQp + t0 * G * hd, hd, T * G * hd,
                                               count));
  }
  WEFT_CHECK(permute(func, dq, dQp, B, Hkv, T, G * hd, 0, ld.dq));
  WEFT_CHECK(permute(func, dk, dKp, B, Hkv, T, hd, 0, ld.dk));
  return permute(func, dv, dVp, B, Hkv, T, hd, 0, ld.dv);
}

}  // namespace

extern "C" {

weft_status weft_cuda_attention_forward(float *out, float *lse, const float *q, const float *k,
                                        const float *v, int64_t B, int64_t T, int64_t H,
                                        int64_t Hkv, int64_t hd, bool causal, void *scratch) {
  return att_forward_impl(__func__, out, lse, q, k, v, B, T, H, Hkv, hd, causal, NULL, scratch);
}

weft_status weft_cuda_attention_backward(float *dq, float *dk, float *dv, const float *dout,
                                         const float *q, const float *k, const float *v,
                                         const float *lse, const float *out, int64_t B, int64_t T,
                                         int64_t H, int64_t Hkv, int64_t hd, bool causal,
                                         void *scratch) {
  return att_backward_impl(__func__, dq, dk, dv, dout, q, k, v, lse, out, B, T, H, Hkv, hd, causal,
                           NULL, scratch);
}

/* bf16 / f16 (backend.h attention_forward_dt / _backward_dt) */
weft_status weft_cuda_attention_forward_dt(weft_dtype dt, void *out, float *lse, const void *q,
                                           const void *k, const void *v, int64_t B, int64_t T,
                                           int64_t H, int64_t Hkv, int64_t hd, bool causal,
                                           const weft_attention_rows *rows, void *scratch) {
  WEFT_CHECK(weft_cuda_require_init_(__func__));
  WEFT_CHECK_STORAGE_DT_(weft_op_name_(__func__), dt);
  if (dt == WEFT_F32)
    return att_forward_impl(__func__, (float *)out, lse, (const float *)q, (const float *)k,
                            (const float *)v, B, T, H, Hkv, hd, causal, rows, scratch);
  if (dt == WEFT_BF16)
    return att_forward_impl(__func__, (bf16_t *)out, lse, (const bf16_t *)q, (const bf16_t *)k,
                            (const bf16_t *)v, B, T, H, Hkv, hd, causal, rows, scratch);
  return att_forward_impl(__func__, (f16_t *)out, lse, (const f16_t *)q, (const f16_t *)k,
                          (const f16_t *)v, B, T, H, Hkv, hd, causal, rows, scratch);
}

weft_status weft_cuda_attention_backward_dt(weft_dtype dt, void *dq, void *dk, void *dv,
                                            const void *dout, const void *q, const void *k,
                                            const void *v, const float *lse, const void *out,
                                            int64_t B, int64_t T, int64_t H, int64_t Hkv,
                                            int64_t hd, bool causal,
                                            const weft_attention_rows *rows, void *scratch) {
  WEFT_CHECK(weft_cuda_require_init_(__func__));
  WEFT_CHECK_STORAGE_DT_(weft_op_name_(__func__), dt);
  if (dt == WEFT_F32)
    return att_backward_impl(__func__, (float *)dq, (float *)dk, (float *)dv, (const float *)dout,
                             (const float *)q, (const float *)k, (const float *)v, lse,
                             (const float *)out, B, T, H, Hkv, hd, causal, rows, scratch);
  if (dt == WEFT_BF16)
    return att_backward_impl(__func__, (bf16_t *)dq, (bf16_t *)dk, (bf16_t *)dv,
                             (const bf16_t *)dout, (const bf16_t *)q, (const bf16_t *)k,
                             (const bf16_t *)v, lse, (const bf16_t *)out, B, T, H, Hkv, hd, causal,
                             rows, scratch);
  return att_backward_impl(__func__, (f16_t *)dq, (f16_t *)dk, (f16_t *)dv, (const f16_t *)dout,
                           (const f16_t *)q, (const f16_t *)k, (const f16_t *)v, lse,
                           (const f16_t *)out, B, T, H, Hkv, hd, causal, rows, scratch);
}

}  // extern "C"
