/* Multi-tensor optimizer kernels: AdamW, SGD, sum of squares (gradient
 * norm), scale (gradient clipping), each one launch over all the tensors.
 *
 * The tensors are cut into chunks of OPT_CHUNK elements; block c finds its
 * tensor by a binary search over the chunk offsets in a small table of
 * per-tensor descriptors (pointers, n, first chunk) that the host builds
 * and uploads into the shared scratch buffer with a synchronous copy on
 * the compute stream (so each call waits for the work queued before it;
 * the table is a few KiB). Empty tensors are left out of the table.
 *
 * AdamW and SGD are weft_adamw_step's and weft_sgd_step's formulas
 * (kernels/cpu/optim.c) with the host-side scalars computed the same way
 * (double, then rounded to float), every product written with mul_rn so
 * that nvcc fuses no multiply-add the CPU rounds twice: the same bits as
 * the CPU (sqrtf and '/' are IEEE-rounded without --use_fast_math). sumsq
 * accumulates in double, per chunk and then per tensor over its chunks in
 * a fixed order (deterministic; the CPU's order differs, so its last bits
 * may too). Argument checks are the CPU backend's (arg_checks.h).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "arg_checks.h"
#include "cuda_compat.h"
#include "cuda_internal.h"
#include "cuda_kernels.h"
#include "device_util.cuh"

#define OPT_THREADS 256
#define OPT_CHUNK 4096 /* elements per block: 256 threads x 4 floats x 4 */

namespace {

bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

/* One tensor of a multi-tensor launch. */
struct tensor_desc {
  float *p;            /* param (adamw, sgd) or x (sumsq, scale) */
  const float *g;      /* grad */
  float *m, *v, *vmax; /* sgd: m is the momentum buffer */
  int64_t n;           /* elements */
  int64_t chunk0;      /* its first chunk */
  int vec;             /* every pointer 16-byte aligned: 4 elements at a time */
  int pad;
};

/* The descriptor of chunk c. */
__device__ inline const tensor_desc *desc_of(const tensor_desc *d, int nt, int64_t c) {
  return chunk_owner(d, nt, c);
}

struct adam_scalars {
  float step_size, bc2_sqrt, decay, one_m_b1, beta2, one_m_b2, eps, sign;
  int amsgrad;
};

/* weft_adamw_step's scalar loop, element i. */
__device__ inline void adam_one(float &p, float g, float &m, float &v, float *vmax,
                                const adam_scalars &s) {
  g = mul_rn(s.sign, g);
  const float pd = mul_rn(p, s.decay);
  const float mi = m + mul_rn(s.one_m_b1, g - m); /* exp_avg.lerp_(grad, 1 - beta1) */
  const float vi = mul_rn(v, s.beta2) + mul_rn(mul_rn(s.one_m_b2, g), g);
  m = mi;
  v = vi;
  float vv = vi;
  if (s.amsgrad) {
    vv = *vmax > vi ? *vmax : vi;
    *vmax = vv;
  }
  const float denom = sqrtf(vv) / s.bc2_sqrt + s.eps;
  p = pd - mul_rn(s.step_size, mi / denom);
}

__global__ void adamw_kernel(const tensor_desc *descs, int nt, int64_t nchunks, adam_scalars s) {
  for (int64_t c = blockIdx.x; c < nchunks; c += gridDim.x) {
    const tensor_desc *d = desc_of(descs, nt, c);
    const int64_t e0 = (c - d->chunk0) * OPT_CHUNK;
    int64_t e1 = e0 + OPT_CHUNK;
    if (e1 > d->n) e1 = d->n;
    if (d->vec && !s.amsgrad) {
      const int64_t full = e0 + (e1 - e0) / 4 * 4;
      for (int64_t e = e0 + 4 * (int64_t)threadIdx.x; e < full; e += 4 * OPT_THREADS) {
        f4 p = *(const f4 *)(d->p + e), g = *(const f4 *)(d->g + e);
        f4 m = *(const f4 *)(d->m + e), v = *(const f4 *)(d->v + e);
        adam_one(p.x, g.x, m.x, v.x, nullptr, s);
        adam_one(p.y, g.y, m.y, v.y, nullptr, s);
        adam_one(p.z, g.z, m.z, v.z, nullptr, s);
        adam_one(p.w, g.w, m.w, v.w, nullptr, s);
        *(f4 *)(d->p + e) = p;
        *(f4 *)(d->m + e) = m;
        *(f4 *)(d->v + e) = v;
      }
      for (int64_t e = full + threadIdx.x; e < e1; e += OPT_THREADS)
        adam_one(d->p[e], d->g[e], d->m[e], d->v[e], nullptr, s);
    } else {
      for (int64_t e = e0 + threadIdx.x; e < e1; e += OPT_THREADS)
        adam_one(d->p[e], d->g[e], d->m[e], d->v[e], s.amsgrad ? d->vmax + e : nullptr, s);
    }
  }
}

struct sgd_scalars {
  float sign, lr, momentum, damp, weight_decay;
  int first, nesterov; /* first: step == 1 (the buffer starts as d) */
};

/* weft_sgd_step's loop, element i (buf NULL without momentum). */
__device__ inline void sgd_one(float &p, float g, float *buf, const sgd_scalars &s) {
  float d = mul_rn(s.sign, g);
  if (s.weight_decay != 0.0f) d = d + mul_rn(s.weight_decay, p);
  if (s.momentum != 0.0f) {
    const float bi = s.first ? d : mul_rn(s.momentum, *buf) + mul_rn(s.damp, d);
    *buf = bi;
    d = s.nesterov ? d + mul_rn(s.momentum, bi) : bi;
  }
  p = p - mul_rn(s.lr, d);
}

__global__ void sgd_kernel(const tensor_desc *descs, int nt, int64_t nchunks, sgd_scalars s) {
  for (int64_t c = blockIdx.x; c < nchunks; c += gridDim.x) {
    const tensor_desc *d = desc_of(descs, nt, c);
    const int64_t e0 = (c - d->chunk0) * OPT_CHUNK;
    int64_t e1 = e0 + OPT_CHUNK;
    if (e1 > d->n) e1 = d->n;
    for (int64_t e = e0 + threadIdx.x; e < e1; e += OPT_THREADS)
      sgd_one(d->p[e], d->g[e], d->m ? d->m + e : nullptr, s);
  }
}

/* partial[c] = sum of squares of chunk c, in double. */
__global__ void sumsq_kernel(double *partial, const tensor_desc *descs, int nt, int64_t nchunks) {
  __shared__ double sh[OPT_THREADS / 32];
  for (int64_t c = blockIdx.x; c < nchunks; c += gridDim.x) {
    const tensor_desc *d = desc_of(descs, nt, c);
    const int64_t e0 = (c - d->chunk0) * OPT_CHUNK;
    int64_t e1 = e0 + OPT_CHUNK;
    if (e1 > d->n) e1 = d->n;
    double s = 0.0;
    int64_t done = e0;
    if (d->vec) {
      done = e0 + (e1 - e0) / 4 * 4;
      for (int64_t e = e0 + 4 * (int64_t)threadIdx.x; e < done; e += 4 * OPT_THREADS) {
        const f4 x = *(const f4 *)(d->p + e);
        s += (double)x.x * x.x + (double)x.y * x.y + (double)x.z * x.z + (double)x.w * x.w;
      }
    }
    for (int64_t e = done + threadIdx.x; e < e1; e += OPT_THREADS) s += (double)d->p[e] * d->p[e];
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (threadIdx.x % 32 == 0) sh[threadIdx.x / 32] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
      double t = 0.0;
      for (int w = 0; w < OPT_THREADS / 32; w++) t += sh[w];
      partial[c] = t;
    }
    __syncthreads();
  }
}

/* out[t] = sum of tensor t's chunk partials in a fixed order (block t). */
__global__ void sum_partials_kernel(double *out, const double *partial, const tensor_desc *descs) {
  __shared__ double sh[32];
  const tensor_desc *d = descs + blockIdx.x;
  const int64_t nch = (d->n + OPT_CHUNK - 1) / OPT_CHUNK;
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < nch; i += blockDim.x) s += partial[d->chunk0 + i];
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (threadIdx.x % 32 == 0) sh[threadIdx.x / 32] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    double t = 0.0;
    for (unsigned w = 0; w < blockDim.x / 32; w++) t += sh[w];
    out[blockIdx.x] = t;
  }
}

__global__ void scale_kernel(const tensor_desc *descs, int nt, int64_t nchunks, float alpha) {
  for (int64_t c = blockIdx.x; c < nchunks; c += gridDim.x) {
    const tensor_desc *d = desc_of(descs, nt, c);
    const int64_t e0 = (c - d->chunk0) * OPT_CHUNK;
    int64_t e1 = e0 + OPT_CHUNK;
    if (e1 > d->n) e1 = d->n;
    int64_t done = e0;
    if (d->vec) {
      done = e0 + (e1 - e0) / 4 * 4;
      for (int64_t e = e0 + 4 * (int64_t)threadIdx.x; e < done; e += 4 * OPT_THREADS) {
        f4 x = *(const f4 *)(d->p + e);
        x = {x.x * alpha, x.y * alpha, x.z * alpha, x.w * alpha};
        *(f4 *)(d->p + e) = x;
      }
    }
    for (int64_t e = done + threadIdx.x; e < e1; e += OPT_THREADS) d->p[e] *= alpha;
  }
}

unsigned grid_of(int64_t nchunks) { return (unsigned)(nchunks < 1048576 ? nchunks : 1048576); }

/* The descriptor table: host copy, then uploaded to the scratch buffer
 * after `extra` bytes the caller keeps for itself (aligned to 256). */
struct table {
  tensor_desc *host = nullptr;
  int nt = 0; /* non-empty tensors */
  int64_t nchunks = 0;
  tensor_desc *dev = nullptr;
  void *extra = nullptr; /* the caller's part of the scratch */
  table() = default;
  table(const table &) = delete; /* owns host; launches must not capture it */
  table &operator=(const table &) = delete;
  ~table() { free(host); }
};

weft_status build_table(const char *func, table &t, int ntensors, float *const *p,
                        const float *const *g, float *const *m, float *const *v, float *const *vmax,
                        const int64_t *n, size_t extra_bytes) {
  t.host = (tensor_desc *)calloc((size_t)(ntensors > 0 ? ntensors : 1), sizeof(tensor_desc));
  if (!t.host)
    return weft_error_at(WEFT_ERR_OOM, func, "no host memory for %d tensor descriptors", ntensors);
  for (int i = 0; i < ntensors; i++) {
    if (n[i] == 0) continue;
    tensor_desc &d = t.host[t.nt++];
    d.p = p[i];
    d.g = g ? g[i] : nullptr;
    d.m = m ? m[i] : nullptr;
    d.v = v ? v[i] : nullptr;
    d.vmax = vmax ? vmax[i] : nullptr;
    d.n = n[i];
    d.chunk0 = t.nchunks;
    d.vec = aligned16(d.p) && (!g || aligned16(d.g)) && (!m || aligned16(d.m)) &&
            (!v || aligned16(d.v));
    t.nchunks += (n[i] + OPT_CHUNK - 1) / OPT_CHUNK;
  }
  if (t.nt == 0) return WEFT_OK;
  const size_t off = (extra_bytes + 255) & ~(size_t)255;
  const size_t bytes = (size_t)t.nt * sizeof(tensor_desc);
  void *scratch;
  WEFT_CHECK(weft_cuda_scratch_(off + bytes, &scratch));
  t.extra = scratch;
  t.dev = (tensor_desc *)((char *)scratch + off);
  /* synchronous: the host table may go, and kernels queued before that
   * used the scratch buffer have finished */
  return weft_cuda_memcpy_(t.dev, t.host, bytes, WEFT_COPY_H2D);
}

}  // namespace

extern "C" {

/* Elements over all tensors (the cost model's, backend.h). */
static double total_elems(const int64_t *n, int ntensors) {
  double t = 0;
  for (int i = 0; i < ntensors; i++) t += (double)n[i];
  return t;
}

weft_status weft_cuda_adamw_multi(float *const *param, const float *const *grad, float *const *m,
                                  float *const *v, float *const *vmax, const int64_t *n,
                                  int ntensors, int64_t step, const weft_adamw_params *hp) {
  const char *op = weft_op_name_(__func__);
  WEFT_CHECK(weft_cuda_require_init_(__func__));
  WEFT_CHECK_ADAMW_HP_(op, hp, step); /* torch's argument checks (AdamW.__init__) */
  {
    const char *names[5] = {"param", "grad", "m", "v", "vmax"};
    const void *const *arrays[5] = {(const void *const *)param, (const void *const *)grad,
                                    (const void *const *)m, (const void *const *)v,
                                    (const void *const *)vmax};
    const bool required[5] = {true, true, true, true, hp->amsgrad};
    WEFT_CHECK(weft_check_multi_(op, ntensors, n, 5, names, arrays, required));
  }
  if (ntensors == 0) return WEFT_OK;
  /* the scalars as weft_adamw_step computes them (Python floats: double) */
  const double bc1 = 1.0 - pow((double)hp->beta1, (double)step);
  const double bc2 = 1.0 - pow((double)hp->beta2, (double)step);
  adam_scalars s;
  s.step_size = (float)((double)hp->lr / bc1);
  s.bc2_sqrt = (float)sqrt(bc2);
  s.decay = (float)(1.0 - (double)hp->lr * (double)hp->weight_decay);
  s.one_m_b1 = 1.0f - hp->beta1;
  s.beta2 = hp->beta2;
  s.one_m_b2 = 1.0f - hp->beta2;
  s.eps = hp->eps;
  s.sign = hp->maximize ? -1.0f : 1.0f;
  s.amsgrad = hp->amsgrad ? 1 : 0;
  table t;
  WEFT_CHECK(build_table(op, t, ntensors, param, grad, m, v, hp->amsgrad ? vmax : nullptr, n, 0));
  if (t.nt == 0) return WEFT_OK;
  const tensor_desc *descs = t.dev;
  const int nt = t.nt;
  const int64_t nchunks = t.nchunks;
  /* param, m, v (and vmax) read and written, grad read */
  WEFT_COST(16.0 * total_elems(n, ntensors),
            (hp->amsgrad ? 36.0 : 28.0) * total_elems(n, ntensors));
  WEFT_LAUNCH(adamw_kernel, grid_of(nchunks), OPT_THREADS, 0, compute_stream(), descs, nt, nchunks,
              s);
  return weft_cuda_check_((int)cudaGetLastError(), op);
}

weft_status weft_cuda_sgd_multi(float *const *param, const float *const *grad, float *const *buf,
                                const int64_t *n, int ntensors, int64_t step,
                                const weft_sgd_params *hp) {
  const char *op = weft_op_name_(__func__);
  WEFT_CHECK(weft_cuda_require_init_(__func__));
  WEFT_CHECK_SGD_HP_(op, hp, step); /* torch's argument checks (SGD.__init__) */
  const bool momentum = hp->momentum != 0.0f;
  {
    const char *names[3] = {"param", "grad", "buf"};
    const void *const *arrays[3] = {(const void *const *)param, (const void *const *)grad,
                                    (const void *const *)buf};
    const bool required[3] = {true, true, momentum};
    WEFT_CHECK(weft_check_multi_(op, ntensors, n, 3, names, arrays, required));
  }
  if (ntensors == 0) return WEFT_OK;
  sgd_scalars s;
  s.sign = hp->maximize ? -1.0f : 1.0f;
  s.lr = hp->lr;
  s.momentum = hp->momentum;
  s.damp = 1.0f - hp->dampening;
  s.weight_decay = hp->weight_decay;
  s.first = step == 1;
  s.nesterov = hp->nesterov ? 1 : 0;
  table t;
  WEFT_CHECK(
      build_table(op, t, ntensors, param, grad, momentum ? buf : nullptr, nullptr, nullptr, n, 0));
  if (t.nt == 0) return WEFT_OK;
  const tensor_desc *descs = t.dev;
  const int nt = t.nt;
  const int64_t nchunks = t.nchunks;
  WEFT_COST(4.0 * total_elems(n, ntensors), (momentum ? 20.0 : 12.0) * total_elems(n, ntensors));
  WEFT_LAUNCH(sgd_kernel, grid_of(nchunks), OPT_THREADS, 0, compute_stream(), descs, nt, nchunks,
              s);
  return weft_cuda_check_((int)cudaGetLastError(), op);
}

weft_status weft_cuda_sumsq_multi(const float *const *x, const int64_t *n, int ntensors,
                                  double *out) {
  const char *op = weft_op_name_(__func__);
  WEFT_CHECK(weft_cuda_require_init_(__func__));
  {
    const char *names[1] = {"x"};
    const void *const *arrays[1] = {(const void *const *)x};
    const bool required[1] = {true};
    WEFT_CHECK(weft_check_multi_(op, ntensors, n, 1, names, arrays, required));
  }
  if (ntensors > 0 && !out) return weft_error_at(WEFT_ERR_INVALID, op, "out is NULL");
  for (int i = 0; i < ntensors; i++) out[i] = 0.0;
  int64_t nchunks = 0;
  int nonempty = 0;
  for (int i = 0; i < ntensors; i++) {
    nchunks += (n[i] + OPT_CHUNK - 1) / OPT_CHUNK;
    nonempty += n[i] > 0;
  }
  if (nchunks == 0) return WEFT_OK;
  /* scratch: per-tensor sums (nonempty doubles) | partials (nchunks) | table */
  const size_t off_partial = ((size_t)nonempty * sizeof(double) + 255) & ~(size_t)255;
  const size_t extra = off_partial + (size_t)nchunks * sizeof(double);
  table t;
  WEFT_CHECK(build_table(op, t, ntensors, (float *const *)x, nullptr, nullptr, nullptr, nullptr, n,
                         extra));
  double *result = (double *)t.extra, *partial = (double *)((char *)t.extra + off_partial);
  cudaStream_t s = compute_stream();
  const tensor_desc *descs = t.dev;
  const int nt = t.nt;
  WEFT_COST(2.0 * total_elems(n, ntensors), 4.0 * total_elems(n, ntensors) + 8.0 * (double)nchunks);
  WEFT_LAUNCH(sumsq_kernel, grid_of(nchunks), OPT_THREADS, 0, s, partial, descs, nt, nchunks);
  WEFT_CHECK(weft_cuda_check_((int)cudaGetLastError(), op));
  WEFT_COST((double)nchunks, 8.0 * (double)(nchunks + nt));
  WEFT_LAUNCH(sum_partials_kernel, (unsigned)nt, 256, 0, s, result, partial, descs);
  WEFT_CHECK(weft_cuda_check_((int)cudaGetLastError(), op));
  double *host = (double *)malloc((size_t)nt * sizeof(double));
  if (!host) return weft_error_at(WEFT_ERR_OOM, op, "no host memory for %d sums", nt);
  weft_status st = weft_cuda_memcpy_(host, result, (size_t)nt * sizeof(double), WEFT_COPY_D2H);
  if (st == WEFT_OK)
    for (int i = 0, j = 0; i < ntensors; i++)
      if (n[i] > 0) out[i] = host[j++];
  free(host);
  return st;
}

weft_status weft_cuda_scale_multi(float *const *x, const int64_t *n, int ntensors, float alpha) {
  const char *op = weft_op_name_(__func__);
  WEFT_CHECK(weft_cuda_require_init_(__func__));
  {
    const char *names[1] = {"x"};
    const void *const *arrays[1] = {(const void *const *)x};
    const bool required[1] = {true};
    WEFT_CHECK(weft_check_multi_(op, ntensors, n, 1, names, arrays, required));
  }
  if (ntensors == 0) return WEFT_OK;
  table t;
  WEFT_CHECK(build_table(op, t, ntensors, x, nullptr, nullptr, nullptr, nullptr, n, 0));
  if (t.nt == 0) return WEFT_OK;
  const tensor_desc *descs = t.dev;
  const int nt = t.nt;
  const int64_t nchunks = t.nchunks;
  WEFT_COST(total_elems(n, ntensors), 8.0 * total_elems(n, ntensors));
  WEFT_LAUNCH(scale_kernel, grid_of(nchunks), OPT_THREADS, 0, compute_stream(), descs, nt, nchunks,
              alpha);
  return weft_cuda_check_((int)cudaGetLastError(), op);
}

}  // extern "C"
