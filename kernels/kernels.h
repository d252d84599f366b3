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
 *   peak bytes per device) is exact.
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
size_t weft_dtype_size(weft_dtype dt);
/* "f32", "bf16", ... ; "?" for an invalid dtype. */
const char *weft_dtype_name(weft_dtype dt);
/* Parses "f32"/"float32", "bf16"/"bfloat16", ...; WEFT_ERR_INVALID if unknown. */
weft_status weft_dtype_parse(const char *name, weft_dtype *out);
bool weft_dtype_is_float(weft_dtype dt);

/* Scalar conversions. bf16/f16 are stored as uint16_t bit patterns;
 * float -> bf16/f16 rounds to nearest, ties to even; NaN stays NaN. */
uint16_t weft_f32_to_bf16(float x);
float weft_bf16_to_f32(uint16_t x);
uint16_t weft_f32_to_f16(float x);
float weft_f16_to_f32(uint16_t x);

/* ------------------------------------------------------------- allocation */

typedef enum weft_device { WEFT_CPU = 0, WEFT_CUDA = 1, WEFT_DEVICE_COUNT } weft_device;

const char *weft_device_name(weft_device dev);

/* Allocates `bytes` (64-byte aligned) on `dev`, zero bytes allowed (returns a
 * unique non-NULL pointer). Counts toward that device's current/peak bytes.
 * WEFT_CUDA requires a build with the CUDA backend and a GPU. */
weft_status weft_alloc(weft_device dev, size_t bytes, void **out);
/* Frees memory from weft_alloc; NULL is a no-op. */
void weft_free(void *ptr);

typedef struct weft_mem_stats {
  int64_t current_bytes; /* bytes allocated now */
  int64_t peak_bytes;    /* high-water mark since start or last reset */
  int64_t alloc_count;   /* number of weft_alloc calls that succeeded */
  int64_t free_count;
} weft_mem_stats;

/* Accounting for one device (thread-safe). */
weft_mem_stats weft_mem_get(weft_device dev);
/* Sets peak to the current value (to measure the peak of one phase). */
void weft_mem_reset_peak(weft_device dev);

/* ----------------------------------------------------------------- tensor */

#define WEFT_MAX_DIMS 8

typedef struct weft_tensor {
  /* read-only for users; set by the constructors */
  weft_dtype dtype;
  weft_device device;
  int ndim;                       /* 0..WEFT_MAX_DIMS; 0 = scalar */
  int64_t shape[WEFT_MAX_DIMS];
  int64_t strides[WEFT_MAX_DIMS]; /* in elements */
  void *data;                     /* first element */
  /* private */
  void *base_;                    /* allocation owned by this tensor, or NULL */
} weft_tensor;

/* A new contiguous tensor owning uninitialised storage. shape may contain 0. */
weft_status weft_tensor_create(weft_dtype dt, weft_device dev, int ndim, const int64_t *shape,
                               weft_tensor **out);
/* Same, zero-filled. */
weft_status weft_tensor_zeros(weft_dtype dt, weft_device dev, int ndim, const int64_t *shape,
                              weft_tensor **out);
/* A non-owning contiguous view of caller memory. */
weft_status weft_tensor_wrap(void *data, weft_dtype dt, weft_device dev, int ndim,
                             const int64_t *shape, weft_tensor **out);
/* Frees the tensor header and, if it owns it, the storage. NULL: no-op. */
void weft_tensor_destroy(weft_tensor *t);

/* Fills a caller-provided header as a view (no allocation, never owns). Use
 * for stack views in hot paths. strides NULL = contiguous. */
weft_status weft_tensor_view_init(weft_tensor *view, void *data, weft_dtype dt, weft_device dev,
                                  int ndim, const int64_t *shape, const int64_t *strides);

int64_t weft_tensor_numel(const weft_tensor *t);
size_t weft_tensor_nbytes(const weft_tensor *t); /* numel * dtype size */
bool weft_tensor_is_contiguous(const weft_tensor *t);
bool weft_tensor_same_shape(const weft_tensor *a, const weft_tensor *b);
/* Writes "f32[4, 6]" into buf. */
void weft_tensor_describe(const weft_tensor *t, char *buf, size_t cap);

/* Views (never own; the base must outlive them). */
/* elements [start, start+len) along dim. */
weft_status weft_tensor_narrow(const weft_tensor *t, int dim, int64_t start, int64_t len,
                               weft_tensor **out);
/* Reshape a contiguous tensor (numel must match; one -1 allowed). */
weft_status weft_tensor_view(const weft_tensor *t, int ndim, const int64_t *shape,
                             weft_tensor **out);
/* Swap two dims (a strided view). */
weft_status weft_tensor_transpose(const weft_tensor *t, int d0, int d1, weft_tensor **out);

/* torch.chunk semantics: chunk size c = ceil(n / k); chunk i covers
 * [i*c, min((i+1)*c, n)); trailing chunks may be smaller or empty (length 0).
 * note: unlike torch.chunk, which drops empty trailing chunks, this always
 * yields k views so that chunk i belongs to rank i; empty ones have size 0.
 * out must have room for k pointers; each is a view to destroy. */
weft_status weft_tensor_chunk(const weft_tensor *t, int64_t k, int dim, weft_tensor **out);
/* Geometry of chunk i of k over a dim of size n, as above (no tensor needed). */
void weft_chunk_range(int64_t n, int64_t k, int64_t i, int64_t *start, int64_t *len);

/* Concatenates n tensors (same dtype, same shape except dim) into a new
 * owning contiguous tensor. */
weft_status weft_tensor_cat(weft_tensor *const *ts, int n, int dim, weft_tensor **out);

/* A new owning contiguous copy (same dtype). */
weft_status weft_tensor_clone(const weft_tensor *t, weft_tensor **out);
/* dst = src elementwise for any strides, converting dtype if they differ
 * (float->bf16/f16 round to nearest even; float->int truncates as C does).
 * Shapes must match. */
weft_status weft_tensor_copy(weft_tensor *dst, const weft_tensor *src);
/* Sets every element to v (converted to dtype). */
weft_status weft_tensor_fill(weft_tensor *t, double v);
/* Element at a multi-index, as double (tests and debugging). */
double weft_tensor_get(const weft_tensor *t, const int64_t *index);
void weft_tensor_set(weft_tensor *t, const int64_t *index, double v);
/* true when dtype, shape and every element's bytes are equal. */
bool weft_tensor_equal(const weft_tensor *a, const weft_tensor *b);

/* -------------------------------------------------------------------- RNG */

/* Counter-based RNG (Philox4x32-10). The value of element e of a tensor is a
 * pure function of (seed, key, global linear index of e): filling a shard
 * with its global offset gives exactly the numbers of filling the full tensor
 * and slicing. */

/* A 64-bit stream key from a name (FNV-1a), e.g. a parameter's qualified name. */
uint64_t weft_rng_key(const char *name);
/* Philox4x32-10 of a 128-bit counter under a 64-bit key: 4 uint32 outputs. */
void weft_philox4x32(uint64_t counter_lo, uint64_t counter_hi, uint64_t key, uint32_t out[4]);

/* Global placement of a local tensor for the RNG: the full tensor's shape and
 * this tensor's offset in it, per dim. NULL = the tensor is the whole thing. */
typedef struct weft_rng_region {
  int ndim;
  int64_t global_shape[WEFT_MAX_DIMS];
  int64_t offset[WEFT_MAX_DIMS];
} weft_rng_region;

/* Normal(mean, std) per element (Box-Muller on the element's counter). f32,
 * f64, bf16, f16 tensors. */
weft_status weft_tensor_fill_normal(weft_tensor *t, uint64_t seed, uint64_t key,
                                    const weft_rng_region *region, float mean, float std);
/* Uniform [lo, hi) per element. */
weft_status weft_tensor_fill_uniform(weft_tensor *t, uint64_t seed, uint64_t key,
                                     const weft_rng_region *region, float lo, float hi);

/* ---------------------------------------------------------------- kernels */

/* C = alpha * op(A) @ op(B) + beta * C for 2-D tensors, op = transpose when
 * trans_*. A: (M, K) or (K, M) if trans_a; B: (K, N) or (N, K); C: (M, N).
 * f32 (OpenBLAS sgemm), f64 (dgemm), bf16 (converted to f32, computed,
 * rounded back). Row-stride views are fine; the last dim must be unit-stride. */
weft_status weft_gemm(bool trans_a, bool trans_b, float alpha, const weft_tensor *a,
                      const weft_tensor *b, float beta, weft_tensor *c);

/* Raw row-major f32 GEMM on pointers (the hot path of nn/): C[M,N] =
 * alpha*op(A)*op(B) + beta*C with leading dims lda, ldb, ldc. */
void weft_sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c,
                int64_t ldc);

/* Elementwise on same-shape tensors of one float dtype, any strides; out may
 * alias an input. */
weft_status weft_add(weft_tensor *out, const weft_tensor *a, const weft_tensor *b); /* a + b */
weft_status weft_mul(weft_tensor *out, const weft_tensor *a, const weft_tensor *b); /* a * b */
weft_status weft_scale(weft_tensor *t, double alpha);                              /* t *= alpha */
weft_status weft_axpy(weft_tensor *y, double alpha, const weft_tensor *x);         /* y += alpha x */

/* Reductions, accumulated in double. dim = -1 ... over a dim (negative dims
 * count from the end); the output keeps that dim with size 1 (keepdim) and
 * has the input's dtype. _all variants reduce everything to one double. */
typedef enum weft_reduce_kind { WEFT_REDUCE_SUM, WEFT_REDUCE_SUMSQ, WEFT_REDUCE_MAX } weft_reduce_kind;
weft_status weft_reduce(const weft_tensor *t, weft_reduce_kind kind, int dim, weft_tensor *out);
weft_status weft_reduce_all(const weft_tensor *t, weft_reduce_kind kind, double *out);

/* Cast into a new owning tensor of dtype dt (see weft_tensor_copy). */
weft_status weft_cast(const weft_tensor *t, weft_dtype dt, weft_tensor **out);

#ifdef __cplusplus
}
#endif
#endif /* WEFT_KERNELS_H */
