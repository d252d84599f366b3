/* Multi-tensor optimizer kernels: AdamW, sum of squares (gradient norm),
 * scale (gradient clipping), each one launch over all the tensors.
 *
 * The tensors are cut into chunks of OPT_CHUNK elements; block c finds its
 * tensor by a binary search over the chunk offsets in a small table of
 * per-tensor descriptors (pointers, n, first chunk) that the host builds
 * and uploads into the shared scratch buffer with a synchronous copy on
 * the compute stream (so each call waits for the work queued before it;
 * the table is a few KiB). Empty tensors are left out of the table.
 *
 * AdamW is weft_adamw_step's formula with its host-side scalars computed
 * the same way (double, then rounded to float); the device may fuse a
 * multiply and an add where the CPU rounds twice, so results agree to an
 * ulp or so, not bit for bit. sumsq accumulates in double, per block and
 * then over the blocks in a fixed order (deterministic).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "cuda_compat.h"
#include "cuda_internal.h"
#include "device_util.cuh"

#define OPT_THREADS 256
#define OPT_CHUNK 4096 /* elements per block: 256 threads x 4 floats x 4 */

namespace {



bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

/* One tensor of a multi-tensor launch. */
struct tensor_desc {
  float *p;        /* param (adamw) or x (sumsq, scale) */
  const float *g;  /* grad */
  float *m, *v, *vmax;
  int64_t n;       /* elements */
  int64_t chunk0;  /* its first chunk */
  int vec;         /* every pointer 16-byte aligned: 4 elements at a time */
  int pad;
};

/* The descriptor of chunk c: the last one whose first chunk is <= c. */
__device__ inline const tensor_desc *desc_of(const tensor_desc *d, int nt, int64_t c) {
  int lo = 0, hi = nt - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (d[mid].chunk0 <= c)
      lo = mid;
    else
      hi = mid - 1;
  }
  return d + lo;
}

struct adam_scalars {
  float step_size, bc2_sqrt, decay, one_m_b1, beta2, one_m_b2, eps, sign;
  int amsgrad;
};

/* weft_adamw_step's scalar loop, element i. */
__device__ inline void adam_one(float &p, float g, float &m, float &v, float *vmax,
                                const adam_scalars &s) {
  g = s.sign * g;
  const float pd = p * s.decay;
  const float mi = m + s.one_m_b1 * (g - m);
  const float vi = v * s.beta2 + s.one_m_b2 * g * g;
  m = mi;
  v = vi;
  float vv = vi;
  if (s.amsgrad) {
    vv = *vmax > vi ? *vmax : vi;
    *vmax = vv;
  }
  const float denom = sqrtf(vv) / s.bc2_sqrt + s.eps;
  p = pd - s.step_size * (mi / denom);
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

/* *out = sum of partial[0..n) in a fixed order (one block). */
__global__ void sum_partials_kernel(double *out, const double *partial, int64_t n) {
  __shared__ double sh[32];
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += partial[i];
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (threadIdx.x % 32 == 0) sh[threadIdx.x / 32] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    double t = 0.0;
    for (unsigned w = 0; w < blockDim.x / 32; w++) t += sh[w];
    *out = t;
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
  int nt = 0;             /* non-empty tensors */
  int64_t nchunks = 0;
  tensor_desc *dev = nullptr;
  void *extra = nullptr;  /* the caller's part of the scratch */
  table() = default;
  table(const table &) = delete; /* owns host; launches must not capture it */
  table &operator=(const table &) = delete;
  ~table() { free(host); }
};

weft_status build_table(const char *func, table &t, int ntensors, float *const *p,
                        const float *const *g, float *const *m, float *const *v,
                        float *const *vmax, const int64_t *n, size_t extra_bytes) {
  t.host = (tensor_desc *)calloc((size_t)(ntensors > 0 ? ntensors : 1), sizeof(tensor_desc));
  if (!t.host)
    return weft_error_at(WEFT_ERR_OOM, func, "no host memory for %d tensor descriptors",
                         ntensors);
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
  return weft_cuda_memcpy(t.dev, t.host, bytes, WEFT_COPY_H2D);
}

/* ntensors, the arrays, and each tensor's n and pointers (names[k] for
 * arrays[k], NULL arrays skipped). */
weft_status check_tensors(const char *func, int ntensors, const int64_t *n, int narrays,
                          const char *const *names, const void *const *const *arrays,
                          const bool *required) {
  if (ntensors < 0)
    return weft_error_at(WEFT_ERR_INVALID, func, "ntensors = %d is negative", ntensors);
  if (ntensors == 0) return WEFT_OK;
  if (!n) return weft_error_at(WEFT_ERR_INVALID, func, "n is NULL");
  for (int k = 0; k < narrays; k++)
    if (required[k] && !arrays[k])
      return weft_error_at(WEFT_ERR_INVALID, func, "%s is NULL", names[k]);
  for (int i = 0; i < ntensors; i++) {
    if (n[i] < 0)
      return weft_error_at(WEFT_ERR_INVALID, func, "n[%d] = %lld is negative", i,
                           (long long)n[i]);
    for (int k = 0; k < narrays; k++)
      if (required[k] && n[i] > 0 && !arrays[k][i])
        return weft_error_at(WEFT_ERR_INVALID, func, "%s[%d] is NULL (n[%d] = %lld)", names[k],
                             i, i, (long long)n[i]);
  }
  return WEFT_OK;
}

}  // namespace

extern "C" {

weft_status weft_cuda_adamw_multi(float *const *param, const float *const *grad, float *const *m,
                                  float *const *v, float *const *vmax, const int64_t *n,
                                  int ntensors, int64_t step, const weft_adamw_params *hp) {
  WEFT_CHECK(weft_cuda_require_init_(__func__));
  if (!hp) return weft_error(WEFT_ERR_INVALID, "hyper-parameters are NULL");
  {
    const char *names[5] = {"param", "grad", "m", "v", "vmax"};
    const void *const *arrays[5] = {(const void *const *)param, (const void *const *)grad,
                                    (const void *const *)m, (const void *const *)v,
                                    (const void *const *)vmax};
    const bool required[5] = {true, true, true, true, hp->amsgrad};
    WEFT_CHECK(check_tensors(__func__, ntensors, n, 5, names, arrays, required));
  }
  if (step < 1) return weft_error(WEFT_ERR_INVALID, "step = %lld must be >= 1", (long long)step);
  /* torch's argument checks (AdamW.__init__), as weft_adamw_step */
  if (!(hp->lr >= 0.0f))
    return weft_error(WEFT_ERR_INVALID, "Invalid learning rate: %g", (double)hp->lr);
  if (!(hp->eps >= 0.0f))
    return weft_error(WEFT_ERR_INVALID, "Invalid epsilon value: %g", (double)hp->eps);
  if (!(hp->beta1 >= 0.0f && hp->beta1 < 1.0f))
    return weft_error(WEFT_ERR_INVALID, "Invalid beta parameter at index 0: %g",
                      (double)hp->beta1);
  if (!(hp->beta2 >= 0.0f && hp->beta2 < 1.0f))
    return weft_error(WEFT_ERR_INVALID, "Invalid beta parameter at index 1: %g",
                      (double)hp->beta2);
  if (!(hp->weight_decay >= 0.0f))
    return weft_error(WEFT_ERR_INVALID, "Invalid weight_decay value: %g",
                      (double)hp->weight_decay);
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
  WEFT_CHECK(build_table(__func__, t, ntensors, param, grad, m, v, hp->amsgrad ? vmax : nullptr,
                         n, 0));
  if (t.nt == 0) return WEFT_OK;
  const tensor_desc *descs = t.dev;
  const int nt = t.nt;
  const int64_t nchunks = t.nchunks;
  WEFT_LAUNCH(adamw_kernel, grid_of(nchunks), OPT_THREADS, 0, compute_stream(), descs, nt,
              nchunks, s);
  return weft_cuda_check_((int)cudaGetLastError(), __func__);
}

weft_status weft_cuda_sumsq_multi(const float *const *x, const int64_t *n, int ntensors,
                                  double *out) {
  WEFT_CHECK(weft_cuda_require_init_(__func__));
  if (!out) return weft_error(WEFT_ERR_INVALID, "out is NULL");
  {
    const char *names[1] = {"x"};
    const void *const *arrays[1] = {(const void *const *)x};
    const bool required[1] = {true};
    WEFT_CHECK(check_tensors(__func__, ntensors, n, 1, names, arrays, required));
  }
  *out = 0.0;
  if (ntensors == 0) return WEFT_OK;
  int64_t nchunks = 0;
  for (int i = 0; i < ntensors; i++) nchunks += (n[i] + OPT_CHUNK - 1) / OPT_CHUNK;
  if (nchunks == 0) return WEFT_OK;
  /* scratch: result (8 bytes) + partials (nchunks doubles) | table */
  const size_t extra = 256 + (size_t)nchunks * sizeof(double);
  table t;
  WEFT_CHECK(build_table(__func__, t, ntensors, (float *const *)x, nullptr, nullptr, nullptr,
                         nullptr, n, extra));
  double *result = (double *)t.extra, *partial = (double *)((char *)t.extra + 256);
  cudaStream_t s = compute_stream();
  const tensor_desc *descs = t.dev;
  const int nt = t.nt;
  WEFT_LAUNCH(sumsq_kernel, grid_of(nchunks), OPT_THREADS, 0, s, partial, descs, nt, nchunks);
  WEFT_CHECK(weft_cuda_check_((int)cudaGetLastError(), __func__));
  WEFT_LAUNCH(sum_partials_kernel, 1, 1024, 0, s, result, partial, nchunks);
  WEFT_CHECK(weft_cuda_check_((int)cudaGetLastError(), __func__));
  return weft_cuda_memcpy(out, result, sizeof *out, WEFT_COPY_D2H);
}

weft_status weft_cuda_scale_multi(float *const *x, const int64_t *n, int ntensors, float alpha) {
  WEFT_CHECK(weft_cuda_require_init_(__func__));
  {
    const char *names[1] = {"x"};
    const void *const *arrays[1] = {(const void *const *)x};
    const bool required[1] = {true};
    WEFT_CHECK(check_tensors(__func__, ntensors, n, 1, names, arrays, required));
  }
  if (ntensors == 0) return WEFT_OK;
  table t;
  WEFT_CHECK(build_table(__func__, t, ntensors, x, nullptr, nullptr, nullptr, nullptr, n, 0));
  if (t.nt == 0) return WEFT_OK;
  const tensor_desc *descs = t.dev;
  const int nt = t.nt;
  const int64_t nchunks = t.nchunks;
  WEFT_LAUNCH(scale_kernel, grid_of(nchunks), OPT_THREADS, 0, compute_stream(), descs, nt,
              nchunks, alpha);
  return weft_cuda_check_((int)cudaGetLastError(), __func__);
}

}  // extern "C"
