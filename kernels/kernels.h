/* weft/kernels.h — local dense tensors, memory accounting, counter-based RNG
 * and the compute kernels (CPU through OpenBLAS; CUDA in kernels/cuda/).
 *
 * A short tour:
 *
 *     int64_t shape[2] = {4, 6};
 *     weft_tensor *x;
 *     weft_tensor_create(WEFT_F32, WEFT_CPU, 2, shape, &x);     // owns its data
 *     weft_tensor_fill_normal(x, seed, weft_rng_key("w"), NULL, 0.0f, 1.0f);
 *     weft_tensor *rows;
 *     weft_tensor_narrow(x, 0, 1, 2, &rows);                     // a view, owns nothing
 *     weft_tensor_destroy(rows);                                 // frees the header only
 *     weft_tensor_destroy(x);                                    // frees the data
 *
 * Conventions:
 * - Shapes and strides are in elements; strides may be anything (views), but
 *   kernels that say "contiguous" require weft_tensor_is_contiguous.
 * - Ownership: a tensor made by _create owns its storage; views (_narrow,
 *   _view, _wrap, chunk results) never own and must not outlive their base.
 *   weft_tensor_destroy(NULL) is a no-op.
 * - Every allocation goes through weft_alloc so the accounting (current and
 *   peak bytes per device) is exact. It counts tensor storage (numel * dtype
 *   size, exactly) and kernel scratch (bf16/f16 gemm); the small tensor
 *   headers come from malloc and are not counted, so views cost 0 bytes.
 * - Dims may be negative (counting from the end) wherever a dim is taken.
 * - Devices: every operation here runs on the tensors' device through that
 *   device's table (backend.h): WEFT_CPU always, WEFT_CUDA in builds with the
 *   CUDA backend (real or emulated). Arguments are checked here, the same
 *   way for every device; the tensors of one operation must share a device
 *   (weft_tensor_copy and weft_tensor_to excepted: they cross between the
 *   host and a device). A device that cannot do an operation, or a dtype,
 *   says so (WEFT_ERR_UNSUPPORTED naming the op, the device and the tensor).
 *   Views of device tensors only move pointers and work everywhere.
 * - No kernel here communicates; they are all local and any rank may call them.
 */
#ifndef WEFT_KERNELS_H
#define WEFT_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ dtypes */

typedef enum weft_dtype {
  WEFT_F32 = 0,
  WEFT_F64 = 1,
  WEFT_BF16 = 2,
  WEFT_F16 = 3,
  WEFT_I32 = 4,
  WEFT_I64 = 5,
  WEFT_U8 = 6,
  WEFT_DTYPE_COUNT
} weft_dtype;

/* Bytes per element (0 for an invalid dtype). */
WEFT_API size_t weft_dtype_size(weft_dtype dt);
/* "f32", "bf16", ... ; "?" for an invalid dtype. */
WEFT_API const char *weft_dtype_name(weft_dtype dt);
/* Parses "f32"/"float32", "bf16"/"bfloat16", ...; WEFT_ERR_INVALID if unknown. */
WEFT_API weft_status weft_dtype_parse(const char *name, weft_dtype *out);
WEFT_API bool weft_dtype_is_float(weft_dtype dt);

/* Scalar conversions. bf16/f16 are stored as uint16_t bit patterns;
 * float -> bf16/f16 rounds to nearest, ties to even; NaN stays NaN. */
WEFT_API uint16_t weft_f32_to_bf16(float x);
WEFT_API float weft_bf16_to_f32(uint16_t x);
WEFT_API uint16_t weft_f32_to_f16(float x);
WEFT_API float weft_f16_to_f32(uint16_t x);

/* ------------------------------------------------------------- allocation */

typedef enum weft_device { WEFT_CPU = 0, WEFT_CUDA = 1, WEFT_DEVICE_COUNT } weft_device;

WEFT_API const char *weft_device_name(weft_device dev);

/* Allocates `bytes` on `dev` through its table's allocator (64-byte aligned
 * on the CPU, 256 on CUDA), zero bytes allowed (returns a unique non-NULL
 * pointer). Counts toward that device's current/peak bytes. WEFT_CUDA
 * requires a build with the CUDA backend and weft_device_init. */
WEFT_API weft_status weft_alloc(weft_device dev, size_t bytes, void **out);
/* Frees memory from weft_alloc on any device; NULL is a no-op. */
WEFT_API void weft_free(void *ptr);

typedef struct weft_mem_stats {
  int64_t current_bytes; /* bytes allocated now */
  int64_t peak_bytes;    /* high-water mark since start or last reset */
  int64_t alloc_count;   /* number of weft_alloc calls that succeeded */
  int64_t free_count;
  /* Host (WEFT_CPU) only, 0 elsewhere: allocations of at least
   * WEFT_LARGE_ALLOC_BYTES that went to the system allocator (malloc) and
   * so may fault fresh pages in: the host cache's misses (alloc.c); a
   * steady training step makes none. */
  int64_t large_system_allocs;
} weft_mem_stats;

/* The size from which a host allocation counts in large_system_allocs. */
#define WEFT_LARGE_ALLOC_BYTES ((size_t)64 << 10)

/* Accounting for one device (thread-safe). */
WEFT_API weft_mem_stats weft_mem_get(weft_device dev);
/* Sets peak to the current value (to measure the peak of one phase). */
WEFT_API void weft_mem_reset_peak(weft_device dev);

/* ----------------------------------------------------------------- tensor */

#define WEFT_MAX_DIMS 8

typedef struct weft_tensor {
  /* read-only for users; set by the constructors */
  weft_dtype dtype;
  weft_device device;
  int ndim; /* 0..WEFT_MAX_DIMS; 0 = scalar */
  int64_t shape[WEFT_MAX_DIMS];
  int64_t strides[WEFT_MAX_DIMS]; /* in elements */
  void *data;                     /* first element */
  /* private */
  void *base_; /* allocation owned by this tensor, or NULL */
} weft_tensor;

/* A new contiguous tensor owning uninitialised storage. shape may contain 0. */
WEFT_API weft_status weft_tensor_create(weft_dtype dt, weft_device dev, int ndim,
                                        const int64_t *shape, weft_tensor **out);
/* Same, zero-filled (a CUDA tensor by an asynchronous device memset on the
 * compute stream). */
WEFT_API weft_status weft_tensor_zeros(weft_dtype dt, weft_device dev, int ndim,
                                       const int64_t *shape, weft_tensor **out);
/* A non-owning contiguous view of caller memory. data must be aligned to the
 * element size, and may be NULL only when the shape has 0 elements. */
WEFT_API weft_status weft_tensor_wrap(void *data, weft_dtype dt, weft_device dev, int ndim,
                                      const int64_t *shape, weft_tensor **out);
/* Frees the tensor header and, if it owns it, the storage. NULL: no-op. */
WEFT_API void weft_tensor_destroy(weft_tensor *t);

/* Fills a caller-provided header as a view (no allocation, never owns). Use
 * for stack views in hot paths. strides NULL = contiguous; otherwise any
 * strides (in elements) are taken as given. Same checks as _wrap. */
WEFT_API weft_status weft_tensor_view_init(weft_tensor *view, void *data, weft_dtype dt,
                                           weft_device dev, int ndim, const int64_t *shape,
                                           const int64_t *strides);

WEFT_API int64_t weft_tensor_numel(const weft_tensor *t);
WEFT_API size_t weft_tensor_nbytes(const weft_tensor *t); /* numel * dtype size */
WEFT_API bool weft_tensor_is_contiguous(const weft_tensor *t);
WEFT_API bool weft_tensor_same_shape(const weft_tensor *a, const weft_tensor *b);
/* Writes "f32[4, 6]" into buf ("f32[4, 6] on cuda" for device tensors;
 * "f64[]" for a 0-d tensor); truncates to cap, always terminated. */
WEFT_API void weft_tensor_describe(const weft_tensor *t, char *buf, size_t cap);

/* Views (never own; the base must outlive them). */
/* elements [start, start+len) along dim. */
WEFT_API weft_status weft_tensor_narrow(const weft_tensor *t, int dim, int64_t start, int64_t len,
                                        weft_tensor **out);
/* torch's view: the same elements in `shape` (numel must match; one -1
 * allowed) without copying. A contiguous tensor always can; a strided one
 * when each run of its dims that is laid out as one strided block maps to
 * whole new dims (splitting or merging such dims; weft_tensor_view_strides),
 * else WEFT_ERR_INVALID: clone it first. */
WEFT_API weft_status weft_tensor_view(const weft_tensor *t, int ndim, const int64_t *shape,
                                      weft_tensor **out);
/* The strides (ndim of them, into `strides`) under which t's elements in
 * order have `shape`, as torch's view computes them; false when no strides
 * can (or numel differs). Contiguous t: the contiguous strides. */
WEFT_API bool weft_tensor_view_strides(const weft_tensor *t, int ndim, const int64_t *shape,
                                       int64_t *strides);
/* Swap two dims (a strided view). */
WEFT_API weft_status weft_tensor_transpose(const weft_tensor *t, int d0, int d1, weft_tensor **out);

/* torch.chunk semantics: chunk size c = ceil(n / k); chunk i covers
 * [i*c, min((i+1)*c, n)); trailing chunks may be smaller or empty (length 0).
 * note: unlike torch.chunk, which drops empty trailing chunks, this always
 * yields k views so that chunk i belongs to rank i; empty ones have size 0.
 * out must have room for k pointers; each is a view to destroy. */
WEFT_API weft_status weft_tensor_chunk(const weft_tensor *t, int64_t k, int dim, weft_tensor **out);
/* Geometry of chunk i of k over a dim of size n, as above (no tensor needed). */
WEFT_API void weft_chunk_range(int64_t n, int64_t k, int64_t i, int64_t *start, int64_t *len);

/* Concatenates n tensors (same dtype, same shape except dim) into a new
 * owning contiguous tensor. */
WEFT_API weft_status weft_tensor_cat(weft_tensor *const *ts, int n, int dim, weft_tensor **out);

/* A new owning contiguous copy (same dtype, same device). */
WEFT_API weft_status weft_tensor_clone(const weft_tensor *t, weft_tensor **out);
/* A new owning contiguous copy of src on dev (same dtype): host <-> device
 * copies, any strides on either side. */
WEFT_API weft_status weft_tensor_to(const weft_tensor *src, weft_device dev, weft_tensor **out);
/* dst = src elementwise for any strides, converting dtype if they differ
 * (float->bf16/f16 round to nearest even, f64->bf16/f16 via f32 as torch;
 * float->int truncates toward zero and saturates, NaN -> 0; int->int wraps
 * modulo 2^bits). Shapes must match. dst and src may be the same view but
 * must not otherwise overlap. Between the host and a device the bytes cross
 * once, contiguous; strides and conversions are done on one side. A device
 * may support fewer dtype pairs than the CPU (it says which). */
WEFT_API weft_status weft_tensor_copy(weft_tensor *dst, const weft_tensor *src);
/* The n-d box copy: the elements [dst_offsets[d], dst_offsets[d] + sizes[d])
 * of dst (every dim d < ndim) = the elements [src_offsets[d], ... + sizes[d])
 * of src, as weft_tensor_copy of the two boxes (any strides, dtype
 * conversion, host <-> device), without making views on the heap. The one
 * strided copy of the library: dtensor's transfers (pack, unpack, local
 * slices) and dcp's staging call it. Local; the caller keeps ownership of
 * both tensors. dst->ndim == src->ndim; an offsets array may be NULL (all
 * zeros); sizes may be NULL only for 0-d tensors; a size of 0 copies nothing.
 * The two boxes must not overlap in memory. Errors: WEFT_ERR_INVALID for a
 * NULL/invalid tensor, different ndims, or a box outside its tensor (the
 * message names the dim and the tensor); otherwise weft_tensor_copy's. */
WEFT_API weft_status weft_tensor_copy_region(weft_tensor *dst, const int64_t *dst_offsets,
                                             const weft_tensor *src, const int64_t *src_offsets,
                                             const int64_t *sizes);
/* Sets every element to v (converted to dtype as weft_tensor_copy does). */
WEFT_API weft_status weft_tensor_fill(weft_tensor *t, double v);
/* Element at a multi-index, as double (tests and debugging; on a device one
 * element is copied, waiting for the device). index may be NULL for a 0-d
 * tensor. A bad index (or tensor) returns NaN, resp. writes nothing, and
 * sets weft_last_error(). */
WEFT_API double weft_tensor_get(const weft_tensor *t, const int64_t *index);
WEFT_API void weft_tensor_set(weft_tensor *t, const int64_t *index, double v);
/* true when dtype, shape and every element's bytes are equal (so 0.0 !=
 * -0.0 and identical NaNs are equal); false for NULL or device (non-CPU)
 * tensors: copy those to the host first. */
WEFT_API bool weft_tensor_equal(const weft_tensor *a, const weft_tensor *b);

/* -------------------------------------------------------------------- RNG */

/* Counter-based RNG (Philox4x32-10). The value of element e of a tensor is a
 * pure function of (seed, key, global linear index of e): filling a shard
 * with its global offset gives exactly the numbers of filling the full tensor
 * and slicing.
 *
 * The recipe (kernels/rng.c; a CUDA fill must follow it): for global
 * row-major index e, x = weft_philox4x32(counter_lo = e >> 1, counter_hi =
 * key, key = seed); a = x0 | x1 << 32, b = x2 | x3 << 32; uniform:
 * lo + (hi - lo) * ((e even ? a : b) >> 11) * 2^-53; normal (Box-Muller):
 * u1 = ((a >> 11) + 1) * 2^-53, u2 = (b >> 11) * 2^-53, mean + std *
 * sqrt(-2 ln u1) * (e even ? cos : sin)(2 pi u2); computed in double,
 * rounded to the dtype as weft_tensor_copy converts a double (f64 exact,
 * f32 once, bf16/f16 through f32 as torch does). */

/* A 64-bit stream key from a name (FNV-1a), e.g. a parameter's qualified name. */
WEFT_API uint64_t weft_rng_key(const char *name);
/* Philox4x32-10 of a 128-bit counter under a 64-bit key: 4 uint32 outputs.
 * Words as Random123 numbers them: counter {lo, lo >> 32, hi, hi >> 32}, key
 * {key, key >> 32} (low halves first). */
WEFT_API void weft_philox4x32(uint64_t counter_lo, uint64_t counter_hi, uint64_t key,
                              uint32_t out[4]);

/* Global placement of a local tensor for the RNG: the full tensor's shape and
 * this tensor's offset in it, per dim. NULL = the tensor is the whole thing. */
typedef struct weft_rng_region {
  int ndim;
  int64_t global_shape[WEFT_MAX_DIMS];
  int64_t offset[WEFT_MAX_DIMS];
} weft_rng_region;

/* Normal(mean, std) per element (Box-Muller on the element's counter). f32,
 * f64, bf16, f16 tensors, any strides. region: ndim must match the tensor's
 * and offset + local size must fit global_shape in every dim. mean finite,
 * std finite and >= 0. */
WEFT_API weft_status weft_tensor_fill_normal(weft_tensor *t, uint64_t seed, uint64_t key,
                                             const weft_rng_region *region, float mean, float std);
/* Uniform [lo, hi) per element (finite lo < hi). A value that would round
 * up to hi in the dtype is replaced by the largest value below hi. */
WEFT_API weft_status weft_tensor_fill_uniform(weft_tensor *t, uint64_t seed, uint64_t key,
                                              const weft_rng_region *region, float lo, float hi);

/* ---------------------------------------------------------------- kernels */

/* C = alpha * op(A) @ op(B) + beta * C for 2-D tensors, op = transpose when
 * trans_*. A: (M, K) or (K, M) if trans_a; B: (K, N) or (N, K); C: (M, N).
 * f32 (OpenBLAS sgemm), f64 (dgemm), bf16 and f16 (converted to f32,
 * computed, rounded back; the f32 copies count as scratch). Without BLAS
 * (meson -Dblas=disabled) a blocked C GEMM computes the same. Row-stride views
 * are fine; the last dim must be unit-stride, except that A and B may also be
 * transposed views of such matrices (column-major), handled by flipping the
 * transpose. C must not overlap A or B. BLAS edge cases: alpha == 0 or K == 0
 * give beta * C without reading A, B; beta == 0 overwrites C (NaN in C does
 * not propagate). */
WEFT_API weft_status weft_gemm(bool trans_a, bool trans_b, float alpha, const weft_tensor *a,
                               const weft_tensor *b, float beta, weft_tensor *c);

/* Raw row-major f32 GEMM on pointers (the hot path of nn/): C[M,N] =
 * alpha*op(A)*op(B) + beta*C with leading dims lda, ldb, ldc (row strides of
 * A, B, C as stored). M, N or K may be 0 (M or N = 0: nothing is touched and
 * the pointers may be NULL; K = 0: C = beta*C). Negative sizes or a leading
 * dim smaller than the stored row length set weft_last_error() and leave C
 * untouched (no status: check weft_last_status() when unsure). */
WEFT_API void weft_sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                         const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                         float *c, int64_t ldc);

/* Elementwise on same-shape tensors of one float dtype, any strides; out may
 * alias an input when it is the same view (same data and strides). f32 and
 * f64 compute in their own precision, bf16/f16 in f32 rounded once; alpha is
 * rounded to the compute precision first. Contiguous f32 takes a direct loop. */
WEFT_API weft_status weft_add(weft_tensor *out, const weft_tensor *a,
                              const weft_tensor *b); /* a + b */
WEFT_API weft_status weft_mul(weft_tensor *out, const weft_tensor *a,
                              const weft_tensor *b);           /* a * b */
WEFT_API weft_status weft_scale(weft_tensor *t, double alpha); /* t *= alpha */
WEFT_API weft_status weft_axpy(weft_tensor *y, double alpha,
                               const weft_tensor *x); /* y += alpha x */
/* t /= divisor elementwise (local, any float dtype and device, any strides):
 * a true IEEE division, not t *= 1/divisor, so that x / 3 is the correctly
 * rounded quotient in the dtype's compute precision, as torch's `t / 3`
 * (divisor rounded to the compute precision first, like alpha above; 3 and
 * other small integers are exact). Division by 0 gives +-inf/NaN per IEEE.
 * Called by dtensor's Replicate/Shard -> Partial(sum) (Partial._partition_value).
 * Errors: WEFT_ERR_INVALID for a NULL or non-float tensor. */
WEFT_API weft_status weft_div_scalar(weft_tensor *t, double divisor);

/* Reductions, accumulated in double. dim = -1 ... over a dim (negative dims
 * count from the end); the output keeps that dim with size 1 (keepdim) and
 * has the input's dtype. _all variants reduce everything to one double.
 * Any dtype (integers are accumulated as doubles), any strides; out must not
 * overlap t. A 0-d input reduces over dim 0 / -1 into a 0-d out. Sums of an
 * empty dim are 0; max over an empty dim is WEFT_ERR_INVALID; max propagates
 * NaN as torch does. */
typedef enum weft_reduce_kind {
  WEFT_REDUCE_SUM,
  WEFT_REDUCE_SUMSQ,
  WEFT_REDUCE_MAX
} weft_reduce_kind;
WEFT_API weft_status weft_reduce(const weft_tensor *t, weft_reduce_kind kind, int dim,
                                 weft_tensor *out);
WEFT_API weft_status weft_reduce_all(const weft_tensor *t, weft_reduce_kind kind, double *out);

/* Cast into a new owning tensor of dtype dt (see weft_tensor_copy). */
WEFT_API weft_status weft_cast(const weft_tensor *t, weft_dtype dt, weft_tensor **out);

/* ---------------------------------------- parameters of the layer kernels
 * Types that the backend table (backend.h) and the op layer (nn/) pass to
 * the layer kernels, so that neither includes the raw-pointer CPU kernels
 * (layers.h). */

/* Pointwise activations, as torch.nn.functional: */
typedef enum weft_activation {
  /* gelu(approximate='tanh'): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
  WEFT_ACT_GELU_TANH = 0,
  WEFT_ACT_GELU_ERF, /* gelu(): 0.5 x (1 + erf(x / sqrt(2))) */
  WEFT_ACT_RELU,     /* relu(): max(x, 0) (NaN stays NaN) */
  WEFT_ACT_SILU,     /* silu(): x * sigmoid(x) */
  WEFT_ACT_COUNT
} weft_activation;
/* "gelu_tanh", "gelu_erf", "relu", "silu"; "?" for anything else. */
WEFT_API const char *weft_activation_name(weft_activation a);

/* torch.optim.AdamW hyper-parameters. Defaults as torch: WEFT_ADAMW_DEFAULT. */
typedef struct weft_adamw_params {
  float lr;           /* 1e-3 */
  float beta1;        /* 0.9 */
  float beta2;        /* 0.999 */
  float eps;          /* 1e-8, added outside the square root */
  float weight_decay; /* 1e-2, decoupled */
  bool amsgrad;       /* false; true needs the vmax buffer */
  bool maximize;      /* false */
} weft_adamw_params;
#define WEFT_ADAMW_DEFAULT ((weft_adamw_params){1e-3f, 0.9f, 0.999f, 1e-8f, 1e-2f, false, false})

/* torch.optim.SGD hyper-parameters (lr has no default there; 0 here). */
typedef struct weft_sgd_params {
  float lr;
  float momentum;     /* 0 */
  float dampening;    /* 0 */
  float weight_decay; /* 0 */
  bool nesterov;      /* false; needs momentum > 0 and dampening == 0 */
  bool maximize;      /* false */
} weft_sgd_params;

/* torch.nn.utils.clip_grad_norm_'s factor: min(1, max_norm / (total_norm +
 * 1e-6)); multiply every gradient by it (torch skips the multiply when it
 * is 1, which is the same). */
WEFT_API double weft_clip_coef(double total_norm, double max_norm);

#ifdef __cplusplus
}
#endif
#endif /* WEFT_KERNELS_H */
