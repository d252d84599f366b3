/* The CUDA backend's tensor operations (kernels.h, through the table's
 * copy, fill, fill_random, gemm, add, mul, scale, div_scalar, axpy, reduce and
 * reduce_all members): same-shape tensors of any strides, arguments already
 * checked by the entry points.
 *
 * Geometry. Operands are described by one `geom` passed by value to the
 * kernel: the shape with its size-1 dims dropped and the dims that are
 * contiguous in every operand merged (the CPU's weft_iter_, so a contiguous
 * tensor is one dim and the traversal order is the same row-major order),
 * and each operand's strides in elements. Thread i handles linear index i
 * (grid-stride loops) and finds its offsets by division over the dims.
 *
 * What is the CPU's bit for bit (kernels/tensor.c, kernels/cpu/ops.c,
 * kernels/rng.c):
 * - copy: every conversion (the device_util.cuh conversions are the CPU's);
 * - fill: the element's bytes are made on the host by weft_store_f_;
 * - add, mul, scale, axpy: f32/f64 in their own precision, bf16/f16 in f32
 *   rounded once, alpha rounded to the compute precision first, products
 *   with mul_rn (no fused multiply-add);
 * - fill_random: Philox4x32-10 and the recipe of kernels.h in double. On the
 *   emulator the bits are the CPU's; on a GPU CUDA's double log, sin and
 *   cos are within 1-2 ulp of glibc's, so a normal draw may differ in the
 *   last bit of its double, which the rounding to the dtype almost always
 *   hides (uniform draws use no libm call and are the CPU's bits); the
 *   double rounds to bf16/f16 through f32, as weft_store_f_ does;
 * - reduce over a dim: one thread per output element summing in the CPU's
 *   order, in double, except for long rows with few outputs (block per
 *   row, a fixed tree: deterministic, sums within double rounding of the
 *   CPU's); max is exact either way and propagates NaN;
 * - reduce_all: the CPU's sequential order up to REDUCE_SERIAL_MAX
 *   elements, above that fixed-size chunks and a fixed tree (deterministic,
 *   sums within double rounding of the CPU's).
 * note: NaN stays NaN, but on a GPU float arithmetic and the f32 <-> f64
 * conversions give the canonical NaN where x86 keeps a NaN's payload, so
 * NaN bits may differ there (the bf16 and f16 casts are integer code and
 * keep the CPU's bits).
 * gemm: f32 through cuBLAS (weft_cuda_sgemm, in the device's matmul
 * precision), bf16/f16 converted to f32 temporaries on the device as the
 * CPU does; not the CPU's bits (another summation order).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "arg_checks.h"
#include "backend_internal.h"
#include "cuda_compat.h"
#include "cuda_internal.h"
#include "cuda_kernels.h"
#include "device_util.cuh"
#include "kernels_internal.h"
#include "tensor_internal.h"

#define EW_THREADS 256
#define REDUCE_SERIAL_MAX 4096 /* reduce_all: one thread, the CPU's order */
#define REDUCE_CHUNK 4096      /* reduce_all: elements per block */
#define REDUCE_LONG_ROW 8192   /* reduce: rows this long ... */
#define REDUCE_FEW_ROWS 1024   /* ... and at most this many get a block each */

namespace {

/* ------------------------------------------------------------ geometry */

struct geom {
  int ndim; /* >= 1 */
  int64_t shape[WEFT_MAX_DIMS];
  int64_t strides[WEFT_ITER_MAX_OPS][WEFT_MAX_DIMS]; /* elements */
};

/* The iteration geometry of nops same-shape tensors (ts[0]'s shape): the
 * CPU iterator's (weft_iter_init_: size-1 dims dropped, dims contiguous in
 * every operand merged, row-major order kept), by value for a launch. */
geom make_geom(int nops, const weft_tensor *const *ts) {
  weft_iter_ it;
  weft_iter_init_(&it, nops, ts);
  geom g;
  memset(&g, 0, sizeof g);
  g.ndim = it.ndim;
  for (int i = 0; i < it.ndim; i++) {
    g.shape[i] = it.shape[i];
    for (int op = 0; op < nops; op++) g.strides[op][i] = it.strides[op][i];
  }
  return g;
}

/* Offsets (elements) of linear index i in the first NOPS operands. */
template <int NOPS>
__device__ inline void offsets_of(const geom &g, int64_t i, int64_t *off) {
  for (int o = 0; o < NOPS; o++) off[o] = 0;
  for (int k = g.ndim - 1; k >= 0; k--) {
    const int64_t q = k > 0 ? i / g.shape[k] : 0;
    const int64_t idx = i - q * g.shape[k];
    for (int o = 0; o < NOPS; o++) off[o] += idx * g.strides[o][k];
    i = q;
  }
}

weft_status launched(const char *op) { return weft_cuda_check_((int)cudaGetLastError(), op); }

unsigned blocks_for(int64_t n) { return grid_for(n, EW_THREADS, 65535); }

bool contiguous(const weft_tensor *t) { return weft_tensor_is_contiguous(t); }

/* ---------------------------------------------------------------- copy */

template <class D, class S>
struct conv_pair {
  typedef D dst;
  typedef S src;
};

/* dst[i] = src[i] converted (P = conv_pair<D, S>). */
template <class P>
__global__ void copy_kernel(geom g, int64_t n, typename P::dst *dst, const typename P::src *src) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    int64_t off[2];
    offsets_of<2>(g, i, off);
    dst[off[0]] = convert<typename P::dst, typename P::src>::from(src[off[1]]);
  }
}

template <class D, class S>
weft_status launch_copy(const geom &g, int64_t n, void *dst, const void *src) {
  typedef conv_pair<D, S> P;
  WEFT_COST(0, (double)(sizeof(D) + sizeof(S)) * (double)n);
  WEFT_LAUNCH(copy_kernel<P>, blocks_for(n), EW_THREADS, 0, compute_stream(), g, n, (D *)dst,
              (const S *)src);
  return launched("weft_tensor_copy");
}

template <class D>
weft_status copy_from(weft_dtype sdt, const geom &g, int64_t n, void *dst, const void *src) {
  switch (sdt) {
    case WEFT_F32:
      return launch_copy<D, float>(g, n, dst, src);
    case WEFT_F64:
      return launch_copy<D, double>(g, n, dst, src);
    case WEFT_BF16:
      return launch_copy<D, bf16_t>(g, n, dst, src);
    default:
      return launch_copy<D, f16_t>(g, n, dst, src);
  }
}

/* ---------------------------------------------------------------- fill */

template <class T>
__global__ void fill_kernel(geom g, int64_t n, T *p, T v) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    int64_t off[1];
    offsets_of<1>(g, i, off);
    p[off[0]] = v;
  }
}

template <class T>
weft_status launch_fill(const geom &g, int64_t n, void *p, const unsigned char *bytes) {
  T v;
  memcpy(&v, bytes, sizeof v);
  WEFT_COST(0, (double)sizeof(T) * (double)n);
  WEFT_LAUNCH(fill_kernel<T>, blocks_for(n), EW_THREADS, 0, compute_stream(), g, n, (T *)p, v);
  return launched("weft_tensor_fill");
}

/* ------------------------------------------------------------- random */

/* Where each element of a tensor sits in the region's global row-major
 * order: local shape and strides, the global stride of each dim, and the
 * global index of the first element. */
struct rng_geom {
  int ndim; /* 0 for a 0-d tensor */
  int64_t shape[WEFT_MAX_DIMS];
  int64_t strides[WEFT_MAX_DIMS];
  int64_t gstride[WEFT_MAX_DIMS];
  int64_t g0;
};

struct rng_params {
  int normal;
  int have_below;
  uint64_t seed, key;
  double a, b; /* normal: mean, std; uniform: lo, hi */
};

/* The draw of global index e (kernels.h's recipe, in double). */
__device__ inline double rng_sample(const rng_params &r, uint64_t e) {
  uint32_t x[4];
  const uint64_t c = e >> 1;
  weft_philox_rounds_((uint32_t)c, (uint32_t)(c >> 32), (uint32_t)r.key, (uint32_t)(r.key >> 32),
                      (uint32_t)r.seed, (uint32_t)(r.seed >> 32), x);
  const uint64_t A = (uint64_t)x[0] | (uint64_t)x[1] << 32;
  const uint64_t B = (uint64_t)x[2] | (uint64_t)x[3] << 32;
  const double two_m53 = 1.0 / 9007199254740992.0; /* 2^-53 */
  if (!r.normal) {
    const double u = (double)((e & 1) ? B >> 11 : A >> 11) * two_m53;
    return r.a + mul_rn(r.b - r.a, u);
  }
  const double u1 = (double)((A >> 11) + 1) * two_m53;
  const double u2 = (double)(B >> 11) * two_m53;
  const double rad = sqrt(-2.0 * log(u1)), th = 6.283185307179586476925 * u2;
  return r.a + mul_rn(r.b, mul_rn(rad, (e & 1) ? sin(th) : cos(th)));
}

/* The dtype's value of a double (weft_store_f_ for float dtypes). */
template <class T>
__device__ inline T from_f64(double v) {
  return from_f32<T>((float)v);
}
template <>
__device__ inline double from_f64<double>(double v) {
  return v;
}

template <class T>
__global__ void fill_random_kernel(rng_geom g, int64_t n, T *p, rng_params r, T below) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    int64_t off = 0, e = g.g0, rest = i;
    for (int k = g.ndim - 1; k >= 0; k--) {
      const int64_t q = rest / g.shape[k], idx = rest - q * g.shape[k];
      off += idx * g.strides[k];
      e += idx * g.gstride[k];
      rest = q;
    }
    T x = from_f64<T>(rng_sample(r, (uint64_t)e));
    /* [lo, hi): rounding to the dtype may land on hi itself */
    if (!r.normal && r.have_below && as_f64(x) >= r.b) x = below;
    p[off] = x;
  }
}

template <class T>
weft_status launch_fill_random(const rng_geom &g, int64_t n, void *p, const rng_params &r,
                               const unsigned char *below_bytes) {
  T below;
  memcpy(&below, below_bytes, sizeof below);
  WEFT_COST(20.0 * (double)n, (double)sizeof(T) * (double)n);
  WEFT_LAUNCH(fill_random_kernel<T>, blocks_for(n), EW_THREADS, 0, compute_stream(), g, n, (T *)p,
              r, below);
  return launched("fill_random");
}

/* --------------------------------------------------------- elementwise */

enum ew_kind { EW_ADD, EW_MUL, EW_SCALE, EW_DIV, EW_AXPY };

/* The compute type: f64 in double, the others in float. */
template <class T>
struct compute_type {
  typedef float type;
};
template <>
struct compute_type<double> {
  typedef double type;
};

__device__ inline float to_ct(float x) { return x; }
__device__ inline double to_ct(double x) { return x; }
__device__ inline float to_ct(bf16_t x) { return weft_bf16_to_f32_i_(x.bits); }
__device__ inline float to_ct(f16_t x) { return weft_f16_to_f32_i_(x.bits); }

/* Operands: add, mul (o, a, b); scale, div (o); axpy (o = y, a = x). */
template <class T>
__global__ void ew_kernel(geom g, int64_t n, int kind, T *o, const T *a, const T *b,
                          typename compute_type<T>::type alpha) {
  typedef typename compute_type<T>::type CT;
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    int64_t off[3];
    offsets_of<3>(g, i, off);
    CT r;
    switch (kind) {
      case EW_ADD:
        r = to_ct(a[off[1]]) + to_ct(b[off[2]]);
        break;
      case EW_MUL:
        r = to_ct(a[off[1]]) * to_ct(b[off[2]]);
        break;
      case EW_SCALE:
        r = to_ct(o[off[0]]) * alpha;
        break;
      case EW_DIV:
        r = to_ct(o[off[0]]) / alpha;
        break;
      default:
        r = to_ct(o[off[0]]) + mul_rn(alpha, to_ct(a[off[1]]));
        break;
    }
    o[off[0]] = convert<T, CT>::from(r);
  }
}

template <class T>
weft_status launch_ew(const geom &g, int64_t n, ew_kind kind, void *o, const void *a, const void *b,
                      typename compute_type<T>::type alpha, const char *op) {
  WEFT_COST((double)n, (b ? 3.0 : 2.0) * (double)sizeof(T) * (double)n);
  WEFT_LAUNCH(ew_kernel<T>, blocks_for(n), EW_THREADS, 0, compute_stream(), g, n, (int)kind, (T *)o,
              (const T *)a, (const T *)b, alpha);
  return launched(op);
}

/* ops[0] is written; nops 1..3 (kernels.h's entry points checked them). */
weft_status elementwise(const char *op, ew_kind kind, double alpha, int nops,
                        const weft_tensor *const *ops) {
  WEFT_CHECK(weft_cuda_require_init_(op));
  const int64_t n = weft_tensor_numel(ops[0]);
  if (n == 0) return WEFT_OK;
  const weft_tensor *full[3] = {ops[0], nops > 1 ? ops[1] : ops[0], nops > 2 ? ops[2] : ops[0]};
  const geom g = make_geom(3, full);
  void *o = ops[0]->data;
  const void *a = full[1]->data, *b = full[2]->data;
  switch (ops[0]->dtype) {
    case WEFT_F32:
      return launch_ew<float>(g, n, kind, o, a, b, (float)alpha, op);
    case WEFT_F64:
      return launch_ew<double>(g, n, kind, o, a, b, alpha, op);
    case WEFT_BF16:
      return launch_ew<bf16_t>(g, n, kind, o, a, b, (float)alpha, op);
    case WEFT_F16:
      return launch_ew<f16_t>(g, n, kind, o, a, b, (float)alpha, op);
    default:
      return weft_backend_dtype_unsupported_(op, "out", ops[0], "f32, f64, bf16 and f16");
  }
}

/* ---------------------------------------------------------- reductions */

__device__ inline double load_f64(float x) { return x; }
__device__ inline double load_f64(double x) { return x; }
__device__ inline double load_f64(bf16_t x) { return weft_bf16_to_f32_i_(x.bits); }
__device__ inline double load_f64(f16_t x) { return weft_f16_to_f32_i_(x.bits); }
__device__ inline double load_f64(int32_t x) { return x; }
__device__ inline double load_f64(int64_t x) { return (double)x; }
__device__ inline double load_f64(uint8_t x) { return x; }

/* weft_sat_i_: truncate toward zero, saturate, NaN -> 0. */
__device__ inline int64_t sat_i(double v, double lo, double hi_excl, int64_t lo_i, int64_t hi_i) {
  if (v != v) return 0;
  if (v <= lo) return lo_i;
  if (v >= hi_excl) return hi_i;
  return (int64_t)v;
}

/* weft_store_f_: the dtype's value of an accumulated double. */
template <class T>
__device__ inline T store_f64(double v) {
  return from_f64<T>(v);
}
template <>
__device__ inline int32_t store_f64<int32_t>(double v) {
  return (int32_t)sat_i(v, -2147483648.0, 2147483647.0, INT32_MIN, INT32_MAX);
}
template <>
__device__ inline int64_t store_f64<int64_t>(double v) {
  return sat_i(v, -9223372036854775808.0, 9223372036854775808.0, INT64_MIN, INT64_MAX);
}
template <>
__device__ inline uint8_t store_f64<uint8_t>(double v) {
  return (uint8_t)sat_i(v, 0.0, 255.0, 0, 255);
}

/* One step of reduce_span (kernels/cpu/ops.c); max keeps the first NaN. */
__device__ inline double reduce_step(int kind, double acc, double v) {
  switch (kind) {
    case WEFT_REDUCE_SUM:
      return acc + v;
    case WEFT_REDUCE_SUMSQ:
      return acc + mul_rn(v, v);
    default:
      if (acc != acc) return acc;
      if (v != v) return v;
      return v > acc ? v : acc;
  }
}

/* Two partial results (deterministic trees). */
__device__ inline double reduce_merge(int kind, double a, double b) {
  if (kind != WEFT_REDUCE_MAX) return a + b;
  if (a != a) return a;
  if (b != b) return b;
  return b > a ? b : a;
}

__device__ inline double reduce_init(int kind) { return kind == WEFT_REDUCE_MAX ? -INFINITY : 0.0; }

/* Block-wide merge of one value per thread in a fixed order (blockDim.x a
 * multiple of 32, at most 1024); thread 0 gets the result. */
__device__ inline double block_merge(int kind, double v) {
  __shared__ double sh[32];
  for (int o = 16; o > 0; o >>= 1) v = reduce_merge(kind, v, __shfl_xor_sync(0xffffffffu, v, o));
  if (threadIdx.x % 32 == 0) sh[threadIdx.x / 32] = v;
  __syncthreads();
  double t = reduce_init(kind);
  if (threadIdx.x == 0)
    for (unsigned w = 0; w < blockDim.x / 32; w++) t = reduce_merge(kind, t, sh[w]);
  __syncthreads(); /* sh is reused by the next call */
  return t;
}

/* One thread per output element, the CPU's order: g is over (out, input
 * narrowed to the reduced dim), len and stride the reduced dim's. The
 * loads go REDUCE_BATCH at a time ahead of the (in-order) adds: a column
 * sum of few outputs (a bias grad: 768 columns of 4096 rows) is otherwise
 * one dependent global load per element, 1.4 ms on an H200 where the
 * batch takes ~0.1. */
#define REDUCE_BATCH 16
template <class T>
__global__ void reduce_rows_kernel(geom g, int64_t nout, int kind, T *out, const T *in, int64_t len,
                                   int64_t stride) {
  const int64_t gs = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < nout; i += gs) {
    int64_t off[2];
    offsets_of<2>(g, i, off);
    const T *row = in + off[1];
    double acc = reduce_init(kind);
    int64_t j = 0;
    for (; j + REDUCE_BATCH <= len; j += REDUCE_BATCH) {
      double v[REDUCE_BATCH];
      for (int k = 0; k < REDUCE_BATCH; k++) v[k] = load_f64(row[(j + k) * stride]);
      for (int k = 0; k < REDUCE_BATCH; k++) acc = reduce_step(kind, acc, v[k]);
      if (kind == WEFT_REDUCE_MAX && acc != acc) break;
    }
    for (; j < len && !(kind == WEFT_REDUCE_MAX && acc != acc); j++)
      acc = reduce_step(kind, acc, load_f64(row[j * stride]));
    out[off[0]] = store_f64<T>(acc);
  }
}

/* One block per output element (long rows, few outputs): a fixed tree. */
template <class T>
__global__ void reduce_long_kernel(geom g, int64_t nout, int kind, T *out, const T *in, int64_t len,
                                   int64_t stride) {
  for (int64_t i = blockIdx.x; i < nout; i += gridDim.x) {
    int64_t off[2];
    offsets_of<2>(g, i, off);
    const T *row = in + off[1];
    double acc = reduce_init(kind);
    for (int64_t j = threadIdx.x; j < len; j += blockDim.x)
      acc = reduce_step(kind, acc, load_f64(row[j * stride]));
    acc = block_merge(kind, acc);
    if (threadIdx.x == 0) out[off[0]] = store_f64<T>(acc);
  }
}

template <class T>
weft_status launch_reduce(const geom &g, int64_t nout, int kind, void *out, const void *in,
                          int64_t len, int64_t stride) {
  WEFT_COST((double)(nout * len), (double)sizeof(T) * (double)(nout * len + nout));
  if (len >= REDUCE_LONG_ROW && nout <= REDUCE_FEW_ROWS)
    WEFT_LAUNCH(reduce_long_kernel<T>, (unsigned)nout, 256, 0, compute_stream(), g, nout, kind,
                (T *)out, (const T *)in, len, stride);
  else
    WEFT_LAUNCH(reduce_rows_kernel<T>, grid_for(nout, 128, 65535), 128, 0, compute_stream(), g,
                nout, kind, (T *)out, (const T *)in, len, stride);
  return launched("weft_reduce");
}

/* *result = the whole tensor's reduction, one thread in row-major order. */
template <class T>
__global__ void reduce_all_serial_kernel(geom g, int64_t n, int kind, const T *in, double *result) {
  double acc = reduce_init(kind);
  for (int64_t i = 0; i < n; i++) {
    int64_t off[1];
    offsets_of<1>(g, i, off);
    acc = reduce_step(kind, acc, load_f64(in[off[0]]));
    if (kind == WEFT_REDUCE_MAX && acc != acc) break;
  }
  *result = acc;
}

/* partial[c] = the reduction of linear indices [c * REDUCE_CHUNK, ...). */
template <class T>
__global__ void reduce_chunks_kernel(geom g, int64_t n, int kind, const T *in, double *partial,
                                     int64_t nchunks) {
  for (int64_t c = blockIdx.x; c < nchunks; c += gridDim.x) {
    const int64_t e0 = c * REDUCE_CHUNK;
    const int64_t e1 = e0 + REDUCE_CHUNK < n ? e0 + REDUCE_CHUNK : n;
    double acc = reduce_init(kind);
    for (int64_t i = e0 + threadIdx.x; i < e1; i += blockDim.x) {
      int64_t off[1];
      offsets_of<1>(g, i, off);
      acc = reduce_step(kind, acc, load_f64(in[off[0]]));
    }
    acc = block_merge(kind, acc);
    if (threadIdx.x == 0) partial[c] = acc;
  }
}

/* *result = partial[0..n) merged in a fixed order (one block). */
__global__ void reduce_partials_kernel(int kind, const double *partial, int64_t n, double *result) {
  double acc = reduce_init(kind);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) acc = reduce_merge(kind, acc, partial[i]);
  acc = block_merge(kind, acc);
  if (threadIdx.x == 0) *result = acc;
}

template <class T>
weft_status launch_reduce_all(const geom &g, int64_t n, int kind, const void *in, double *scratch) {
  cudaStream_t s = compute_stream();
  if (n <= REDUCE_SERIAL_MAX) {
    WEFT_COST((double)n, (double)sizeof(T) * (double)n);
    WEFT_LAUNCH(reduce_all_serial_kernel<T>, 1, 1, 0, s, g, n, kind, (const T *)in, scratch);
    return launched("weft_reduce_all");
  }
  const int64_t nchunks = (n + REDUCE_CHUNK - 1) / REDUCE_CHUNK;
  double *partial = scratch + 32; /* 256 bytes after the result */
  WEFT_COST((double)n, (double)sizeof(T) * (double)n + 8.0 * (double)nchunks);
  WEFT_LAUNCH(reduce_chunks_kernel<T>, grid_for(nchunks, 1, 1 << 20), 256, 0, s, g, n, kind,
              (const T *)in, partial, nchunks);
  WEFT_CHECK(launched("weft_reduce_all"));
  WEFT_COST((double)nchunks, 8.0 * (double)nchunks);
  WEFT_LAUNCH(reduce_partials_kernel, 1, 1024, 0, s, kind, (const double *)partial, nchunks,
              scratch);
  return launched("weft_reduce_all");
}

/* *st = f(T()) for the C type T of dtype dt (every dtype); false for an
 * invalid dtype. */
template <class F>
bool by_dtype(weft_dtype dt, F f, weft_status *st) {
  switch (dt) {
    case WEFT_F32:
      *st = f(float());
      return true;
    case WEFT_F64:
      *st = f(double());
      return true;
    case WEFT_BF16:
      *st = f(bf16_t());
      return true;
    case WEFT_F16:
      *st = f(f16_t());
      return true;
    case WEFT_I32:
      *st = f(int32_t());
      return true;
    case WEFT_I64:
      *st = f(int64_t());
      return true;
    case WEFT_U8:
      *st = f(uint8_t());
      return true;
    default:
      return false;
  }
}

}  // namespace

extern "C" {

weft_status weft_cuda_copy(weft_tensor *dst, const weft_tensor *src) {
  WEFT_CHECK(weft_cuda_require_init_("weft_tensor_copy"));
  const int64_t n = weft_tensor_numel(dst);
  if (n == 0) return WEFT_OK;
  const weft_dtype dd = dst->dtype, sd = src->dtype;
  if (dd == sd && contiguous(dst) && contiguous(src)) {
    if (dst->data == src->data) return WEFT_OK;
    const size_t bytes = weft_tensor_nbytes(dst);
    const char *d = (const char *)dst->data, *s = (const char *)src->data;
    if (d < s + bytes && s < d + bytes) { /* overlapping views: memmove through a copy */
      void *tmp;
      WEFT_CHECK(weft_alloc(WEFT_CUDA, bytes, &tmp));
      weft_status st =
          weft_cuda_memcpy_async_(tmp, src->data, bytes, WEFT_COPY_D2D, WEFT_STREAM_COMPUTE);
      if (st == WEFT_OK)
        st = weft_cuda_memcpy_async_(dst->data, tmp, bytes, WEFT_COPY_D2D, WEFT_STREAM_COMPUTE);
      weft_free(tmp); /* stream-ordered: reused only after the copies */
      return st;
    }
    return weft_cuda_memcpy_async_(dst->data, src->data, bytes, WEFT_COPY_D2D, WEFT_STREAM_COMPUTE);
  }
  const weft_tensor *ops[2] = {dst, src};
  const geom g = make_geom(2, ops);
  if (dd == sd) { /* strided: the same bytes, by element size */
    switch (weft_dtype_size(dd)) {
      case 1:
        return launch_copy<uint8_t, uint8_t>(g, n, dst->data, src->data);
      case 2:
        return launch_copy<uint16_t, uint16_t>(g, n, dst->data, src->data);
      case 4:
        return launch_copy<uint32_t, uint32_t>(g, n, dst->data, src->data);
      default:
        return launch_copy<uint64_t, uint64_t>(g, n, dst->data, src->data);
    }
  }
  if (!weft_dtype_is_float(dd) || !weft_dtype_is_float(sd)) {
    const bool src_bad = !weft_dtype_is_float(sd);
    return weft_backend_dtype_unsupported_(
        "weft_tensor_copy", src_bad ? "src" : "dst", src_bad ? src : dst,
        "conversions between f32, f64, bf16 and f16, and copies within one dtype");
  }
  switch (dd) {
    case WEFT_F32:
      return copy_from<float>(sd, g, n, dst->data, src->data);
    case WEFT_F64:
      return copy_from<double>(sd, g, n, dst->data, src->data);
    case WEFT_BF16:
      return copy_from<bf16_t>(sd, g, n, dst->data, src->data);
    default:
      return copy_from<f16_t>(sd, g, n, dst->data, src->data);
  }
}

weft_status weft_cuda_fill(weft_tensor *t, double v) {
  WEFT_CHECK(weft_cuda_require_init_("weft_tensor_fill"));
  const int64_t n = weft_tensor_numel(t);
  if (n == 0) return WEFT_OK;
  unsigned char bytes[8] = {0};
  weft_store_f_((char *)bytes, t->dtype, v); /* the CPU's conversion, on the host */
  const weft_tensor *ops[1] = {t};
  const geom g = make_geom(1, ops);
  switch (weft_dtype_size(t->dtype)) {
    case 1:
      return launch_fill<uint8_t>(g, n, t->data, bytes);
    case 2:
      return launch_fill<uint16_t>(g, n, t->data, bytes);
    case 4:
      return launch_fill<uint32_t>(g, n, t->data, bytes);
    default:
      return launch_fill<uint64_t>(g, n, t->data, bytes);
  }
}

weft_status weft_cuda_fill_random(weft_tensor *t, weft_random_kind kind, uint64_t seed,
                                  uint64_t key, const weft_rng_region *region, float a, float b) {
  WEFT_CHECK(weft_cuda_require_init_(__func__));
  const int64_t n = weft_tensor_numel(t);
  if (n == 0) return WEFT_OK;
  /* region is checked: the global geometry as kernels/rng.c computes it */
  rng_geom g;
  memset(&g, 0, sizeof g);
  const int nd = t->ndim;
  g.ndim = nd;
  int64_t gn = 1;
  for (int k = nd - 1; k >= 0; k--) {
    const int64_t gshape = region ? region->global_shape[k] : t->shape[k];
    g.shape[k] = t->shape[k];
    g.strides[k] = t->strides[k];
    g.gstride[k] = gn;
    gn *= gshape > 0 ? gshape : 1;
  }
  for (int k = 0; k < nd; k++) g.g0 += (region ? region->offset[k] : 0) * g.gstride[k];
  rng_params r;
  r.normal = kind == WEFT_RANDOM_NORMAL;
  r.seed = seed;
  r.key = key;
  r.a = a;
  r.b = b;
  unsigned char below[8] = {0};
  r.have_below = kind == WEFT_RANDOM_UNIFORM && weft_rng_uniform_below_(t->dtype, a, b, below);
  switch (t->dtype) {
    case WEFT_F32:
      return launch_fill_random<float>(g, n, t->data, r, below);
    case WEFT_F64:
      return launch_fill_random<double>(g, n, t->data, r, below);
    case WEFT_BF16:
      return launch_fill_random<bf16_t>(g, n, t->data, r, below);
    case WEFT_F16:
      return launch_fill_random<f16_t>(g, n, t->data, r, below);
    default:
      return weft_backend_dtype_unsupported_("fill_random", "tensor", t, "f32, f64, bf16 and f16");
  }
}

weft_status weft_cuda_add(weft_tensor *out, const weft_tensor *a, const weft_tensor *b) {
  const weft_tensor *ops[3] = {out, a, b};
  return elementwise("weft_add", EW_ADD, 0.0, 3, ops);
}

weft_status weft_cuda_mul(weft_tensor *out, const weft_tensor *a, const weft_tensor *b) {
  const weft_tensor *ops[3] = {out, a, b};
  return elementwise("weft_mul", EW_MUL, 0.0, 3, ops);
}

weft_status weft_cuda_scale(weft_tensor *t, double alpha) {
  const weft_tensor *ops[1] = {t};
  return elementwise("weft_scale", EW_SCALE, alpha, 1, ops);
}

weft_status weft_cuda_div_scalar(weft_tensor *t, double divisor) {
  const weft_tensor *ops[1] = {t};
  return elementwise("weft_div_scalar", EW_DIV, divisor, 1, ops);
}

weft_status weft_cuda_axpy(weft_tensor *y, double alpha, const weft_tensor *x) {
  const weft_tensor *ops[2] = {y, x};
  return elementwise("weft_axpy", EW_AXPY, alpha, 2, ops);
}

weft_status weft_cuda_reduce(const weft_tensor *t, weft_reduce_kind kind, int dim,
                             weft_tensor *out) {
  WEFT_CHECK(weft_cuda_require_init_("weft_reduce"));
  const int64_t nout = weft_tensor_numel(out);
  if (nout == 0) return WEFT_OK;
  /* (out, input with the reduced dim narrowed to 1), as kernels/cpu/ops.c */
  weft_tensor in = *t, ov = *out;
  in.base_ = nullptr;
  ov.base_ = nullptr;
  if (t->ndim == 0) {
    in.ndim = 1;
    in.shape[0] = 1;
    in.strides[0] = 1;
  }
  if (out->ndim == 0) {
    ov.ndim = 1;
    ov.shape[0] = 1;
    ov.strides[0] = 1;
  }
  const int64_t len = in.shape[dim], stride = in.strides[dim];
  in.shape[dim] = 1;
  const weft_tensor *ops[2] = {&ov, &in};
  const geom g = make_geom(2, ops);
  weft_status st;
  const auto launch = [&](auto tag) {
    return launch_reduce<decltype(tag)>(g, nout, (int)kind, out->data, t->data, len, stride);
  };
  if (!by_dtype(t->dtype, launch, &st))
    return weft_backend_dtype_unsupported_("weft_reduce", "t", t, "every dtype");
  return st;
}

weft_status weft_cuda_reduce_all(const weft_tensor *t, weft_reduce_kind kind, double *out) {
  WEFT_CHECK(weft_cuda_require_init_("weft_reduce_all"));
  const int64_t n = weft_tensor_numel(t);
  if (n == 0) { /* max of nothing was refused by the entry point */
    *out = 0.0;
    return WEFT_OK;
  }
  const int64_t nchunks = n <= REDUCE_SERIAL_MAX ? 0 : (n + REDUCE_CHUNK - 1) / REDUCE_CHUNK;
  void *scratch;
  WEFT_CHECK(weft_cuda_scratch_(256 + (size_t)nchunks * sizeof(double), &scratch));
  const weft_tensor *ops[1] = {t};
  const geom g = make_geom(1, ops);
  weft_status st;
  const auto launch = [&](auto tag) {
    return launch_reduce_all<decltype(tag)>(g, n, (int)kind, t->data, (double *)scratch);
  };
  if (!by_dtype(t->dtype, launch, &st))
    return weft_backend_dtype_unsupported_("weft_reduce_all", "t", t, "every dtype");
  WEFT_CHECK(st);
  /* waits for the stream: *out is host memory */
  return weft_cuda_memcpy_(out, scratch, sizeof *out, WEFT_COPY_D2H);
}

weft_status weft_cuda_gemm(bool trans_a, bool trans_b, float alpha, const weft_tensor *a,
                           const weft_tensor *b, float beta, weft_tensor *c) {
  WEFT_CHECK(weft_cuda_require_init_("weft_gemm"));
  const weft_dtype dt = a->dtype;
  const int64_t m = trans_a ? a->shape[1] : a->shape[0];
  const int64_t k = trans_a ? a->shape[0] : a->shape[1];
  const int64_t n = trans_b ? b->shape[0] : b->shape[1];
  if (m == 0 || n == 0) return WEFT_OK;
  if (dt == WEFT_BF16 || dt == WEFT_F16) /* the CPU's way: f32 temporaries, one SGEMM */
    return weft_gemm_via_f32_(trans_a, trans_b, alpha, a, b, beta, c);
  if (dt != WEFT_F32)
    return weft_backend_dtype_unsupported_("weft_gemm", "A", a,
                                           "f32, bf16 and f16 GEMMs (cuBLAS SGEMM)");
  int64_t lda, ldb, ldc;
  bool fa, fb, fc;
  WEFT_CHECK(weft_gemm_layout_("weft_gemm", a, "A", true, &lda, &fa));
  WEFT_CHECK(weft_gemm_layout_("weft_gemm", b, "B", true, &ldb, &fb));
  WEFT_CHECK(weft_gemm_layout_("weft_gemm", c, "C", false, &ldc, &fc));
  return weft_cuda_sgemm(trans_a != fa, trans_b != fb, m, n, k, alpha, (const float *)a->data, lda,
                         (const float *)b->data, ldb, beta, (float *)c->data, ldc);
}

}  // extern "C"
