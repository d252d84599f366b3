/* weft/backend.h — the backend interface: one table of memory and compute
 * operations per device (CPU; CUDA, real or emulated), and the functions
 * every library above kernels/ calls instead of naming a kernel.
 *
 * A short tour:
 *
 *     // raw-pointer kernels: the device is an argument, the table is found
 *     // for it, a missing operation is a clear WEFT_ERR_UNSUPPORTED
 *     WEFT_CHECK(weft_backend_linear_forward(dev, out, inp, w, NULL, N, IC, OC));
 *
 *     // tensor operations dispatch on the tensors' device (kernels.h):
 *     weft_tensor *x;
 *     weft_tensor_create(WEFT_F32, WEFT_CUDA, 2, shape, &x);   // device allocator
 *     weft_tensor_copy(x, host);                                 // host -> device
 *     weft_add(x, x, x);                                         // on the device
 *
 *     // device set-up and memory, the same calls for every device:
 *     weft_device_init(WEFT_CUDA, weft_local_rank(), NULL);
 *     weft_memcpy(WEFT_CUDA, host_buf, dev_buf, bytes, WEFT_COPY_D2H);
 *     weft_device_synchronize(WEFT_CUDA);
 *
 * Design (ggml's backend, NCCL's versioned structs):
 * - One `weft_backend` table per device. kernels/cpu registers the CPU table
 *   at first use; the CUDA backend (kernels/cuda, built with nvcc, or the
 *   same sources against the emulator with meson -Dcuda=emulated) registers
 *   the WEFT_CUDA table itself. A CPU-only build has no WEFT_CUDA table:
 *   every call for WEFT_CUDA fails with WEFT_ERR_UNSUPPORTED saying so.
 * - Every operation has ONE argument list, the table member's, shared by
 *   every device (a backend whose function differs does not compile).
 *   Semantics, shapes and formulas of the compute operations are those of
 *   the CPU kernel of the same name in kernels/layers.h (weft's source
 *   tree; private to kernels/, not installed); pointers are the device's.
 * - Members marked (optional) may be NULL; calling one gives
 *   WEFT_ERR_UNSUPPORTED "<op> is not supported on <device> (backend
 *   '<name>')", made in one place (backend.c). The others are required: a
 *   table without them is refused by weft_backend_register.
 * - Errors a backend reports name the operation, not the C function, so
 *   every backend rejects bad arguments with the same first line; the
 *   dispatcher adds a line naming the device ("\n  in <op> on cuda").
 * - Asynchrony: device operations are ordered on the device's compute
 *   stream (WEFT_STREAM_COMPUTE) unless a stream is an argument; a status
 *   reports argument and launch errors, faults inside a kernel surface at
 *   weft_device_synchronize. Results the host receives through a pointer
 *   (a loss, a sum of squares) are complete when the call returns. On the
 *   CPU everything is synchronous.
 * - No operation here communicates: any rank may call any of them.
 */
#ifndef WEFT_BACKEND_H
#define WEFT_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------ vocabulary */

/* A device's streams (queues of work executed in order). The CPU has none:
 * its work is done when the call returns. */
typedef enum weft_stream_id {
  WEFT_STREAM_COMPUTE = 0, /* kernels, copies, the default */
  WEFT_STREAM_COMM = 1,    /* collectives on device buffers (TP, DTensor, the default) */
  WEFT_STREAM_FSDP_AG = 2, /* FSDP's parameter all-gathers */
  WEFT_STREAM_FSDP_RS = 3, /* FSDP's gradient reduce-scatters and HSDP all-reduces */
  WEFT_STREAM_COUNT
} weft_stream_id;

/* "compute", "comm", "fsdp_all_gather", "fsdp_reduce_scatter"; "?" if
 * out of range. */
WEFT_API const char *weft_stream_name(weft_stream_id s);

/* Direction of a copy, relative to the device whose table does it ("host"
 * is CPU memory; for the CPU backend every kind is a host copy). */
typedef enum weft_copy_kind {
  WEFT_COPY_H2D = 0,
  WEFT_COPY_D2H = 1,
  WEFT_COPY_D2D = 2
} weft_copy_kind;

/* A point in a stream's work (opaque; made and freed by the backend). */
typedef struct weft_event weft_event;

/* Precision of fp32 matrix products: F32 (exact fp32 FMA, the default),
 * TF32 (fp32 storage, TF32 tensor-core products), BF16 (operands rounded
 * to bf16 as weft_f32_to_bf16, fp32 accumulation and output). */
typedef enum weft_matmul_precision {
  WEFT_MATMUL_F32 = 0,
  WEFT_MATMUL_TF32 = 1,
  WEFT_MATMUL_BF16 = 2
} weft_matmul_precision;

/* A caching allocator's state (devices that cache; all zero otherwise). */
typedef struct weft_cache_stats {
  int64_t reserved_bytes; /* obtained from the driver and not yet returned */
  int64_t cached_bytes;   /* of those, in free blocks waiting for reuse */
  int64_t hits;           /* allocations served from the cache */
  int64_t misses;         /* allocations that went to the driver */
} weft_cache_stats;

/* Which distribution weft_tensor_fill_normal / _uniform draw (the fill
 * member): NORMAL(a = mean, b = std), UNIFORM[a = lo, b = hi). */
typedef enum weft_random_kind { WEFT_RANDOM_NORMAL = 0, WEFT_RANDOM_UNIFORM = 1 } weft_random_kind;

/* One tensor's piece of a flat buffer (FSDP's all-gather and
 * reduce-scatter buffers, llm.c's one-allocation parameters):
 *   data   the tensor's elements, contiguous, of dtype (f32, bf16 or f16);
 *          for flat_pack NULL means zeros;
 *   offset where the piece starts in the flat buffer, in flat elements;
 *   count  elements of the piece;
 *   pad    (flat_pack only) zero elements written after the piece.
 * Pieces of one call must not overlap in the flat buffer, nor (split and
 * accumulate) in their data. */
typedef struct weft_flat_piece {
  void *data;
  weft_dtype dtype;
  int64_t offset;
  int64_t count;
  int64_t pad;
} weft_flat_piece;

/* Row strides of attention's (B, T, heads, hd) operands, in elements: the
 * distance from row (b, t) to row (b, t + 1), batch b's rows starting at
 * b * T * stride; one row's heads * hd elements are packed. 0 means packed
 * (heads * hd). They let q, k, v and their gradients be column slices of a
 * fused projection's (B, T, width) output; out and dout are always packed.
 * attention_forward_dt reads q, k, v; attention_backward_dt also writes dq,
 * dk, dv with them. */
typedef struct weft_attention_rows {
  int64_t q, k, v;
  int64_t dq, dk, dv;
} weft_attention_rows;

/* ----------------------------------------------------------------- table */

/* Grows only at the end; a table says its size and the version it was
 * built against, so a backend compiled against an older header registers
 * with the members it knows and the rest read as NULL (absent).
 *   1  everything up to flat_accumulate
 *   2  layernorm_forward .. dropout_apply (LayerNorm, activations, softmax,
 *      dropout)
 *   3  attention_forward / attention_backward take `causal` (their argument
 *      lists changed in place: the attention members of a table built for
 *      version 1 or 2 have the causal-only argument list and are dropped at
 *      registration, so attention on such a table is WEFT_ERR_UNSUPPORTED)
 *   4  host_alloc_pinned / host_free_pinned (page-locked host memory),
 *      device_model
 *   5  takes_dtype (which operations compute in a 16-bit storage dtype),
 *      activation_forward_dt / activation_backward_dt, swiglu_forward_dt /
 *      swiglu_backward_dt, dropout_apply_dt, layernorm_forward_dt /
 *      layernorm_backward_dt, softmax_forward_dt / softmax_backward_dt,
 *      rmsnorm_forward_dt / rmsnorm_backward_dt, cross_entropy_forward_dt ..
 *      cross_entropy_backward_local_dt, embedding_range_forward_dt /
 *      embedding_range_backward_dt, rope_forward_dt / rope_backward_dt, gemm_dt,
 *      attention_forward_dt / attention_backward_dt (a table built against an
 * earlier version-5 header has a smaller size: these read as absent)
 *   6  attention_forward_dt / attention_backward_dt take row strides (a
 *      weft_attention_rows; their argument lists changed in place: in a
 *      table built for version 5 they are dropped at registration) */
#define WEFT_BACKEND_VERSION 6

/* The operations whose dtypes a backend declares through takes_dtype: the
 * op families that compute in the storage dtype of their tensors (bf16 or
 * f16 loaded, f32 arithmetic in registers, one rounding on store) instead
 * of on f32 copies that the op layer widens first (nn/mixed.c). Grows at
 * the end as families move to storage-dtype kernels. */
typedef enum weft_kernel_op {
  WEFT_KERNEL_ADD = 0,   /* the add member (weft_add): out = a + b */
  WEFT_KERNEL_MUL = 1,   /* mul (weft_mul): out = a * b */
  WEFT_KERNEL_SCALE = 2, /* scale (weft_scale): t *= alpha */
  /* activation_forward_dt / activation_backward_dt (GELU, ReLU, SiLU) */
  WEFT_KERNEL_ACTIVATION = 3,
  WEFT_KERNEL_SWIGLU = 4,    /* swiglu_forward_dt / swiglu_backward_dt */
  WEFT_KERNEL_DROPOUT = 5,   /* dropout_apply_dt */
  WEFT_KERNEL_LAYERNORM = 6, /* layernorm_forward_dt / layernorm_backward_dt */
  WEFT_KERNEL_SOFTMAX = 7,   /* softmax_forward_dt / softmax_backward_dt */
  WEFT_KERNEL_RMSNORM = 8,   /* rmsnorm_forward_dt / rmsnorm_backward_dt */
  /* cross_entropy_forward_dt, _backward_dt, _local_max_dt,
   * _local_target_dt, _local_sumexp_dt, _backward_local_dt */
  WEFT_KERNEL_CROSS_ENTROPY = 9,
  WEFT_KERNEL_EMBEDDING = 10, /* embedding_range_forward_dt / embedding_range_backward_dt */
  WEFT_KERNEL_ROPE = 11,      /* rope_forward_dt / rope_backward_dt */
  WEFT_KERNEL_GEMM = 12,      /* gemm_dt with 16-bit operands (linear, matmul) */
  WEFT_KERNEL_ATTENTION = 13, /* attention_forward_dt / attention_backward_dt */
  WEFT_KERNEL_COPY = 14,      /* copy (weft_tensor_copy) within dt: moving data */
  WEFT_KERNEL_REDUCE = 15,    /* reduce (weft_reduce) in and out of dt, double sums */
  WEFT_KERNEL_OP_COUNT
} weft_kernel_op;

typedef struct weft_backend {
  /* ---- identity (required) */
  size_t size;        /* sizeof(weft_backend) as the backend was compiled */
  int version;        /* WEFT_BACKEND_VERSION */
  weft_device device; /* the device this table serves */
  const char *name;   /* "cpu", "cuda", "cuda (emulated)" */

  /* ---- device set-up */
  /* Devices of this kind visible to the process (0: none). Never fails. */
  int (*device_count)(void);
  /* (optional) Selects device local_rank % count and makes its streams and
   * handles; idempotent for the same device. *ordinal may be NULL. */
  weft_status (*init)(int local_rank, int *ordinal);
  /* (optional) Releases streams, handles and cached memory. */
  void (*shutdown)(void);
  /* (optional) The ordinal chosen by init, -1 before. */
  int (*current_device)(void);
  /* Waits for all the device's work; reports a fault inside a kernel. */
  weft_status (*synchronize)(void);

  /* ---- memory */
  /* A block of `bytes` (0 allowed, a unique pointer) from the device's
   * allocator, not yet counted (weft_alloc counts it). */
  weft_status (*alloc)(size_t bytes, void **out);
  /* Returns a block of this device's allocator; the bytes it was asked for
   * (0 if ptr is not the start of a live block here). */
  size_t (*free)(void *ptr);
  /* (optional; devices other than the CPU) true when ptr is the start of a
   * live block of this backend's allocator (weft_free's routing). */
  bool (*owns)(const void *ptr);
  /* (optional; devices other than the CPU) true when ptr points anywhere
   * into this device's memory (collectives route device buffers). */
  bool (*contains)(const void *ptr);
  /* bytes of dst = (unsigned char)value, on the compute stream. */
  weft_status (*memset)(void *dst, int value, size_t bytes);
  /* Copies bytes in the given direction, ordered after the compute
   * stream's work; when it returns, a D2H destination holds the bytes and
   * an H2D source may be reused. Overlap is an error (D2D and host). */
  weft_status (*memcpy)(void *dst, const void *src, size_t bytes, weft_copy_kind kind);
  /* (optional) The same on stream s without waiting: host memory must stay
   * valid and unchanged until the stream passes the copy. */
  weft_status (*memcpy_async)(void *dst, const void *src, size_t bytes, weft_copy_kind kind,
                              weft_stream_id s);
  /* dst = src for two tensors of this device (same shape, any strides),
   * converting dtypes as weft_tensor_copy says. A backend may support a
   * subset of dtype pairs and says which in its error. */
  weft_status (*copy)(weft_tensor *dst, const weft_tensor *src);
  /* Every element of t = v (converted as weft_tensor_fill says). */
  weft_status (*fill)(weft_tensor *t, double v);
  /* Philox counter RNG, kernels.h's recipe: the same value for the same
   * (seed, key, global index) on every device. a, b as weft_random_kind;
   * region already checked (NULL = t is the whole tensor). */
  weft_status (*fill_random)(weft_tensor *t, weft_random_kind kind, uint64_t seed, uint64_t key,
                             const weft_rng_region *region, float a, float b);

  /* ---- streams and events (optional: the CPU has none) */
  weft_status (*event_record)(weft_stream_id s, weft_event **ev);
  weft_status (*stream_wait_event)(weft_stream_id s, weft_event *ev);
  weft_status (*event_synchronize)(weft_event *ev);
  /* *done = whether the stream has passed the event. */
  weft_status (*event_query)(weft_event *ev, bool *done);
  weft_status (*event_elapsed_ms)(weft_event *start, weft_event *end, float *ms);
  void (*event_destroy)(weft_event *ev);
  /* A live block is also used on stream s: it is not reused before s
   * passes the point where it is freed (torch's record_stream). */
  weft_status (*record_stream)(void *ptr, weft_stream_id s);
  /* The native stream handle (cudaStream_t for NCCL), NULL before init. */
  void *(*stream_handle)(weft_stream_id s);

  /* ---- options (optional) */
  weft_status (*set_matmul_precision)(weft_matmul_precision p);
  weft_matmul_precision (*matmul_precision)(void);
  weft_status (*cache_stats)(weft_cache_stats *out);
  weft_status (*empty_cache)(void);

  /* ---- dense tensor operations (kernels.h; arguments already checked by
   * the entry point: shapes agree, dtypes are float, one device) */
  weft_status (*gemm)(bool trans_a, bool trans_b, float alpha, const weft_tensor *a,
                      const weft_tensor *b, float beta, weft_tensor *c);
  weft_status (*add)(weft_tensor *out, const weft_tensor *a, const weft_tensor *b);
  weft_status (*mul)(weft_tensor *out, const weft_tensor *a, const weft_tensor *b);
  weft_status (*scale)(weft_tensor *t, double alpha);
  weft_status (*div_scalar)(weft_tensor *t, double divisor); /* t /= divisor (weft_div_scalar) */
  weft_status (*axpy)(weft_tensor *y, double alpha, const weft_tensor *x);
  /* dim already normalised to [0, ndim) (0 for a 0-d tensor); out checked */
  weft_status (*reduce)(const weft_tensor *t, weft_reduce_kind kind, int dim, weft_tensor *out);
  weft_status (*reduce_all)(const weft_tensor *t, weft_reduce_kind kind, double *out);

  /* ---- GEMMs on raw row-major fp32 pointers (weft_sgemm's contract,
   * leading dims in elements; the device's matmul precision applies) */
  weft_status (*sgemm)(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                       const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                       float *c, int64_t ldc);
  /* count independent GEMMs, operand i at a + i*stride_a, b + i*stride_b,
   * c + i*stride_c (C blocks must not overlap) */
  weft_status (*sgemm_strided_batched)(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                                       float alpha, const float *a, int64_t lda, int64_t stride_a,
                                       const float *b, int64_t ldb, int64_t stride_b, float beta,
                                       float *c, int64_t ldc, int64_t stride_c, int64_t count);
  /* bf16 operands (uint16_t bit patterns), fp32 accumulation, fp32 C */
  weft_status (*gemm_bf16)(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                           const uint16_t *a, int64_t lda, const uint16_t *b, int64_t ldb,
                           float beta, float *c, int64_t ldc);

  /* ---- layer kernels, forward next to backward (layers.h) */
  weft_status (*embedding_forward)(float *out, const int32_t *tokens, const float *weight,
                                   int64_t N, int64_t V, int64_t C);
  weft_status (*embedding_backward)(float *dweight, const int32_t *tokens, const float *dout,
                                    int64_t N, int64_t V, int64_t C);
  weft_status (*embedding_range_forward)(float *out, const int32_t *tokens,
                                         const float *weight_local, int64_t N, int64_t v0,
                                         int64_t nv, int64_t C);
  weft_status (*embedding_range_backward)(float *dweight_local, const int32_t *tokens,
                                          const float *dout, int64_t N, int64_t v0, int64_t nv,
                                          int64_t C);
  weft_status (*linear_forward)(float *out, const float *inp, const float *weight,
                                const float *bias, int64_t N, int64_t IC, int64_t OC);
  weft_status (*linear_backward)(float *dinp, float *dweight, float *dbias, const float *dout,
                                 const float *inp, const float *weight, int64_t N, int64_t IC,
                                 int64_t OC, bool accumulate_dinp, bool accumulate_dweight);
  weft_status (*rmsnorm_forward)(float *out, float *rstd, const float *inp, const float *weight,
                                 int64_t N, int64_t C, float eps);
  weft_status (*rmsnorm_backward)(float *dinp, float *dweight, const float *dout, const float *inp,
                                  const float *weight, const float *rstd, int64_t N, int64_t C,
                                  bool accumulate_dinp);
  /* cosb, sinb: this device's memory */
  weft_status (*rope_tables)(float *cosb, float *sinb, int64_t max_pos, int64_t hd, double theta);
  weft_status (*rope_forward)(float *out, const float *inp, const float *cosb, const float *sinb,
                              int64_t max_pos, int64_t B, int64_t T, int64_t NH, int64_t hd,
                              int64_t pos0);
  weft_status (*rope_backward)(float *dinp, const float *dout, const float *cosb, const float *sinb,
                               int64_t max_pos, int64_t B, int64_t T, int64_t NH, int64_t hd,
                               int64_t pos0);
  /* Bytes of scratch attention_forward/_backward need for these sizes (one
   * query for every device, causal or not; scratch is this device's
   * memory). */
  size_t (*attention_scratch_bytes)(int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t hd);
  /* causal: query t attends to keys 0..t; else to all T keys (version 3) */
  weft_status (*attention_forward)(float *out, float *lse, const float *q, const float *k,
                                   const float *v, int64_t B, int64_t T, int64_t H, int64_t Hkv,
                                   int64_t hd, bool causal, void *scratch);
  /* out is forward's output (a backend may use it for rowsum(dout * out));
   * causal must be the forward's */
  weft_status (*attention_backward)(float *dq, float *dk, float *dv, const float *dout,
                                    const float *q, const float *k, const float *v,
                                    const float *lse, const float *out, int64_t B, int64_t T,
                                    int64_t H, int64_t Hkv, int64_t hd, bool causal, void *scratch);
  weft_status (*swiglu_forward)(float *out, const float *a, const float *b, int64_t n);
  weft_status (*swiglu_backward)(float *da, float *db, const float *dout, const float *a,
                                 const float *b, int64_t n);
  weft_status (*residual_forward)(float *out, const float *a, const float *b, int64_t n);
  weft_status (*residual_backward)(float *da, float *db, const float *dout, int64_t n);
  /* *loss is host memory (the call waits for it); the rest device memory */
  weft_status (*cross_entropy_forward)(double *loss, float *lse, const float *logits,
                                       const int32_t *targets, int64_t N, int64_t V);
  weft_status (*cross_entropy_backward)(float *dlogits, const float *logits, const float *lse,
                                        const int32_t *targets, int64_t N, int64_t V, float scale);
  weft_status (*cross_entropy_local_max)(float *row_max, const float *logits_local, int64_t N,
                                         int64_t nv);
  weft_status (*cross_entropy_local_target)(float *target_logit, const float *logits_local,
                                            const int32_t *targets, int64_t N, int64_t v0,
                                            int64_t nv);
  weft_status (*cross_entropy_local_sumexp)(float *sumexp, const float *logits_local,
                                            const float *gmax, int64_t N, int64_t nv);
  weft_status (*cross_entropy_finish)(double *loss, float *lse, const float *gmax,
                                      const float *gsum, const float *gtarget, int64_t N);
  weft_status (*cross_entropy_backward_local)(float *dlogits_local, const float *logits_local,
                                              const float *lse, const int32_t *targets, int64_t N,
                                              int64_t v0, int64_t nv, float scale);

  /* ---- multi-tensor optimizer steps: tensor i has n[i] elements at
   * param[i], grad[i], ... (device pointers; the pointer arrays and n are
   * host arrays). One launch per call on a device. */
  /* weft_adamw_step on each tensor; vmax NULL unless hp->amsgrad */
  weft_status (*adamw_multi)(float *const *param, const float *const *grad, float *const *m,
                             float *const *v, float *const *vmax, const int64_t *n, int ntensors,
                             int64_t step, const weft_adamw_params *hp);
  /* weft_sgd_step on each tensor; buf NULL when hp->momentum == 0 */
  weft_status (*sgd_multi)(float *const *param, const float *const *grad, float *const *buf,
                           const int64_t *n, int ntensors, int64_t step, const weft_sgd_params *hp);
  /* out[i] = sum_j x[i][j]^2 in double (out: host array of ntensors) */
  weft_status (*sumsq_multi)(const float *const *x, const int64_t *n, int ntensors, double *out);
  /* x[i][j] *= alpha */
  weft_status (*scale_multi)(float *const *x, const int64_t *n, int ntensors, float alpha);

  /* ---- flat buffers (FSDP), casts between f32, bf16 and f16 rounding to
   * nearest even as weft_tensor_copy */
  /* flat[p.offset + j] = p.data[j] (0 if p.data is NULL) for j < p.count,
   * then p.pad zeros */
  weft_status (*flat_pack)(void *flat, weft_dtype flat_dtype, const weft_flat_piece *pieces,
                           int npieces);
  /* p.data[j] = flat[p.offset + j] for j < p.count */
  weft_status (*flat_split)(const void *flat, weft_dtype flat_dtype, const weft_flat_piece *pieces,
                            int npieces);
  /* p.data[j] += scale * flat[p.offset + j] in fp32 (p.data f32) */
  weft_status (*flat_accumulate)(const void *flat, weft_dtype flat_dtype,
                                 const weft_flat_piece *pieces, int npieces, float scale);

  /* ---- version 2: more layer kernels (layers.h; optional, so that a
   * version-1 table reads them as absent). Deterministic on every device:
   * the weight and bias gradients are column sums in a fixed order. */
  weft_status (*layernorm_forward)(float *out, float *mean, float *rstd, const float *inp,
                                   const float *weight, const float *bias, int64_t N, int64_t C,
                                   float eps);
  weft_status (*layernorm_backward)(float *dinp, float *dweight, float *dbias, const float *dout,
                                    const float *inp, const float *weight, const float *mean,
                                    const float *rstd, int64_t N, int64_t C, bool accumulate_dinp);
  weft_status (*activation_forward)(weft_activation act, float *out, const float *inp, int64_t n);
  weft_status (*activation_backward)(weft_activation act, float *dinp, const float *dout,
                                     const float *inp, int64_t n, bool accumulate);
  weft_status (*softmax_forward)(float *out, const float *inp, int64_t N, int64_t C);
  weft_status (*softmax_backward)(float *dinp, const float *dout, const float *out, int64_t N,
                                  int64_t C, bool accumulate);
  /* uniform: this device's memory, as the other arrays */
  weft_status (*dropout_apply)(float *out, const float *inp, const float *uniform, float p,
                               int64_t n);

  /* ---- version 4 (optional): page-locked host memory, which this
   * device's asynchronous copies read and write when the stream reaches
   * them (cudaMallocHost / cudaFreeHost) */
  weft_status (*host_alloc_pinned)(size_t bytes, void **out);
  void (*host_free_pinned)(void *ptr);
  /* (optional) the selected device's model name ("NVIDIA H100 80GB HBM3") */
  weft_status (*device_model)(char *buf, size_t cap);

  /* ---- version 5 (optional): storage dtypes. Whether operation op
   * computes directly on tensors of dtype dt, as the member's contract
   * says for that dtype (for bf16 / f16: f32 arithmetic, the result
   * rounded once, the bits of "widen, compute in f32, round"). Asked by the
   * op layer before it widens an op's 16-bit inputs. Pure: no device
   * work, never fails; op may be any value (false for unknown ones).
   * Absent: only f32. */
  bool (*takes_dtype)(weft_kernel_op op, weft_dtype dt);
  /* activation_forward / _backward on tensors of dtype dt (f32, bf16 or
   * f16: out, inp, dout and dinp alike): every element widened to f32,
   * computed as the f32 member computes it, rounded once (with accumulate,
   * dinp is widened and the sum rounded once). For bf16 / f16 these are
   * the f32 member's bits on the widened values, rounded. */
  weft_status (*activation_forward_dt)(weft_activation act, weft_dtype dt, void *out,
                                       const void *inp, int64_t n);
  weft_status (*activation_backward_dt)(weft_activation act, weft_dtype dt, void *dinp,
                                        const void *dout, const void *inp, int64_t n,
                                        bool accumulate);
  /* swiglu_forward / _backward and dropout_apply the same way (every array
   * of dtype dt but dropout's uniforms, which stay f32) */
  weft_status (*swiglu_forward_dt)(weft_dtype dt, void *out, const void *a, const void *b,
                                   int64_t n);
  weft_status (*swiglu_backward_dt)(weft_dtype dt, void *da, void *db, const void *dout,
                                    const void *a, const void *b, int64_t n);
  weft_status (*dropout_apply_dt)(weft_dtype dt, void *out, const void *inp, const float *uniform,
                                  float p, int64_t n);
  /* layernorm_forward / _backward with inp, out, weight, bias, dout and
   * dinp of dtype dt; mean, rstd, dweight and dbias stay f32 (the grads
   * accumulate in double as the f32 member's). For bf16 / f16 the f32
   * member's bits on the widened values, the outputs rounded once. */
  weft_status (*layernorm_forward_dt)(weft_dtype dt, void *out, float *mean, float *rstd,
                                      const void *inp, const void *weight, const void *bias,
                                      int64_t N, int64_t C, float eps);
  weft_status (*layernorm_backward_dt)(weft_dtype dt, void *dinp, float *dweight, float *dbias,
                                       const void *dout, const void *inp, const void *weight,
                                       const float *mean, const float *rstd, int64_t N, int64_t C,
                                       bool accumulate_dinp);
  /* softmax_forward / _backward with every array of dtype dt, the row sums
   * as the f32 member's (bf16 / f16: its bits on the widened values,
   * rounded once) */
  weft_status (*softmax_forward_dt)(weft_dtype dt, void *out, const void *inp, int64_t N,
                                    int64_t C);
  weft_status (*softmax_backward_dt)(weft_dtype dt, void *dinp, const void *dout, const void *out,
                                     int64_t N, int64_t C, bool accumulate);
  /* rmsnorm_forward / _backward with inp, out, weight, dout and dinp of
   * dtype dt; rstd and dweight stay f32 (bf16 / f16: the f32 member's bits
   * on the widened values, rounded once) */
  weft_status (*rmsnorm_forward_dt)(weft_dtype dt, void *out, float *rstd, const void *inp,
                                    const void *weight, int64_t N, int64_t C, float eps);
  weft_status (*rmsnorm_backward_dt)(weft_dtype dt, void *dinp, float *dweight, const void *dout,
                                     const void *inp, const void *weight, const float *rstd,
                                     int64_t N, int64_t C, bool accumulate_dinp);
  /* cross_entropy_forward .. cross_entropy_backward_local (but finish,
   * which reads no logits) with the logits and dlogits of dtype dt; the
   * loss, lse and the row statistics (row_max, target_logit, sumexp) stay
   * f32 (the loss double). For bf16 / f16 the f32 member's bits on the
   * widened logits, each dlogits element rounded once. */
  weft_status (*cross_entropy_forward_dt)(weft_dtype dt, double *loss, float *lse,
                                          const void *logits, const int32_t *targets, int64_t N,
                                          int64_t V);
  weft_status (*cross_entropy_backward_dt)(weft_dtype dt, void *dlogits, const void *logits,
                                           const float *lse, const int32_t *targets, int64_t N,
                                           int64_t V, float scale);
  weft_status (*cross_entropy_local_max_dt)(weft_dtype dt, float *row_max, const void *logits_local,
                                            int64_t N, int64_t nv);
  weft_status (*cross_entropy_local_target_dt)(weft_dtype dt, float *target_logit,
                                               const void *logits_local, const int32_t *targets,
                                               int64_t N, int64_t v0, int64_t nv);
  weft_status (*cross_entropy_local_sumexp_dt)(weft_dtype dt, float *sumexp,
                                               const void *logits_local, const float *gmax,
                                               int64_t N, int64_t nv);
  weft_status (*cross_entropy_backward_local_dt)(weft_dtype dt, void *dlogits_local,
                                                 const void *logits_local, const float *lse,
                                                 const int32_t *targets, int64_t N, int64_t v0,
                                                 int64_t nv, float scale);
  /* embedding_range_forward with out and weight_local of dtype dt (rows
   * copied as they are); embedding_range_backward with dout of dtype dt
   * and dweight_local f32 (each dout row widened and added as the f32
   * member adds it) */
  weft_status (*embedding_range_forward_dt)(weft_dtype dt, void *out, const int32_t *tokens,
                                            const void *weight_local, int64_t N, int64_t v0,
                                            int64_t nv, int64_t C);
  weft_status (*embedding_range_backward_dt)(weft_dtype dt, float *dweight_local,
                                             const int32_t *tokens, const void *dout, int64_t N,
                                             int64_t v0, int64_t nv, int64_t C);
  /* rope_forward / rope_backward with out / inp (dinp / dout) of dtype dt,
   * the tables f32 (bf16 / f16: the f32 member's bits on the widened
   * values, rounded once) */
  weft_status (*rope_forward_dt)(weft_dtype dt, void *out, const void *inp, const float *cosb,
                                 const float *sinb, int64_t max_pos, int64_t B, int64_t T,
                                 int64_t NH, int64_t hd, int64_t pos0);
  weft_status (*rope_backward_dt)(weft_dtype dt, void *dinp, const void *dout, const float *cosb,
                                  const float *sinb, int64_t max_pos, int64_t B, int64_t T,
                                  int64_t NH, int64_t hd, int64_t pos0);
  /* C = alpha op(A) op(B) + beta C (sgemm's contract: row-major, leading
   * dims in elements, k == 0 or alpha == 0 reads neither A nor B) with A
   * and B of dtype ab_dt (f32, bf16 or f16) and C of dtype c_dt (f32 or
   * ab_dt). Products and sums in at least f32 (16-bit operands are exact
   * in f32); a 16-bit C is the result rounded once (beta != 0 reads it
   * widened). bias: NULL, or n values of dtype c_dt added to every row
   * (then beta must be 0), before C is rounded. f32 operands and C without
   * a bias: the sgemm member (the matmul precision applies); 16-bit
   * operands are used as they are. */
  weft_status (*gemm_dt)(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                         weft_dtype ab_dt, const void *a, int64_t lda, const void *b, int64_t ldb,
                         float beta, weft_dtype c_dt, void *c, int64_t ldc, const void *bias);
  /* attention_forward / _backward with q, k, v, out, dout, dq, dk, dv of
   * dtype dt; lse and the scratch (attention_scratch_bytes) as the f32
   * members'. bf16 / f16: the f32 member's bits on the widened values,
   * the outputs rounded once (dk, dv summed over a kv head's query heads
   * in f32 first). rows: the row strides of q, k, v (dq, dk, dv), NULL
   * when all are packed; the results do not depend on them (version 6). */
  weft_status (*attention_forward_dt)(weft_dtype dt, void *out, float *lse, const void *q,
                                      const void *k, const void *v, int64_t B, int64_t T, int64_t H,
                                      int64_t Hkv, int64_t hd, bool causal,
                                      const weft_attention_rows *rows, void *scratch);
  weft_status (*attention_backward_dt)(weft_dtype dt, void *dq, void *dk, void *dv,
                                       const void *dout, const void *q, const void *k,
                                       const void *v, const float *lse, const void *out, int64_t B,
                                       int64_t T, int64_t H, int64_t Hkv, int64_t hd, bool causal,
                                       const weft_attention_rows *rows, void *scratch);
} weft_backend;

/* -------------------------------------------------------------- registry */

/* Installs the table for be->device (replacing the one there; the CPU and
 * CUDA backends register themselves at first use). WEFT_ERR_INVALID when
 * the version, size, device, name or a required member is wrong, naming it.
 * The table is copied (members beyond be->size read as absent). Not
 * thread-safe against concurrent dispatch: register at start-up (or in
 * tests). */
WEFT_API weft_status weft_backend_register(const weft_backend *be);
/* Removes the table of dev (tests); the built-in one is back at next use. */
WEFT_API void weft_backend_reset(weft_device dev);
/* The table of dev (full size: absent members are NULL), NULL when this
 * build has none (no CUDA backend) or dev is not a device. */
WEFT_API const weft_backend *weft_backend_get(weft_device dev);
/* "cpu", "cuda", "cuda (emulated)"; "none" when dev has no table. */
WEFT_API const char *weft_backend_name(weft_device dev);
/* Whether dev's backend computes operation op in dtype dt without the
 * caller widening to f32: true for f32 when dev has a table; for other
 * dtypes the table's takes_dtype answers (false without one, for an
 * unknown op or device). The op layer (nn/) calls it per op to choose
 * between the storage-dtype kernel and nn/mixed.c's widening. Local,
 * never fails. */
WEFT_API bool weft_backend_takes_dtype(weft_device dev, weft_kernel_op op, weft_dtype dt);

/* ------------------------------------------------------------ device set-up */

/* Devices of kind dev visible to this process: 1 for WEFT_CPU; 0 when the
 * build has no backend for dev or no device is visible. Never fails. */
WEFT_API int weft_device_count(weft_device dev);
/* Selects device local_rank % count (ranks of a node spread over its GPUs)
 * and prepares it; WEFT_OK and nothing to do for the CPU. */
WEFT_API weft_status weft_device_init(weft_device dev, int local_rank, int *ordinal);
WEFT_API void weft_device_shutdown(weft_device dev);
/* The selected ordinal, -1 before init (0 for the CPU). */
WEFT_API int weft_device_current(weft_device dev);
/* Waits for every stream of dev (a no-op on the CPU). */
WEFT_API weft_status weft_device_synchronize(weft_device dev);
/* The device whose memory ptr points into (WEFT_CPU for host memory and
 * NULL). */
WEFT_API weft_device weft_ptr_device(const void *ptr);

/* --------------------------------------------------------------- memory */

WEFT_API weft_status weft_memset(weft_device dev, void *dst, int value, size_t bytes);
WEFT_API weft_status weft_memcpy(weft_device dev, void *dst, const void *src, size_t bytes,
                                 weft_copy_kind kind);
WEFT_API weft_status weft_memcpy_async(weft_device dev, void *dst, const void *src, size_t bytes,
                                       weft_copy_kind kind, weft_stream_id s);
WEFT_API weft_status weft_record_stream(weft_device dev, void *ptr, weft_stream_id s);
/* Page-locked host memory for dev's asynchronous copies (cudaMallocHost):
 * weft_memcpy_async D2H into it returns at once and the bytes land when the
 * stream reaches the copy (wait for an event recorded after it before
 * reading them). Where dev has no pinned allocator (the CPU) it is ordinary
 * host memory from weft_alloc(WEFT_CPU). Local. Free it with
 * weft_free_pinned(dev, ptr) (same dev); not counted by weft_mem_get(dev). */
WEFT_API weft_status weft_alloc_pinned(weft_device dev, size_t bytes, void **out);
WEFT_API void weft_free_pinned(weft_device dev, void *ptr); /* NULL: no-op */
/* The model name of this process's device of kind dev (the one
 * weft_device_init selected): the GPU's ("NVIDIA H100 80GB HBM3"), "weft
 * CUDA emulator", "cpu". Local. WEFT_ERR_UNSUPPORTED where the backend
 * cannot say; a backend's init errors before weft_device_init. */
WEFT_API weft_status weft_device_model(weft_device dev, char *buf, size_t cap);

/* --------------------------------------------------------------- events */

/* A point in one of dev's streams (the table's members of these names):
 * weft_event_record marks the current end of stream s (any weft_stream_id,
 * the communication streams included); weft_stream_wait_event orders s's
 * later work after it; _synchronize waits for it on the host; _query sets
 * *done without waiting; _elapsed_ms is the time between two events;
 * _destroy frees one (the device may still be passing it). Local, and
 * callable from any thread: the CUDA backend makes this process's device
 * current on a thread the first time (a fresh thread would use device 0).
 * The CPU has no streams: WEFT_ERR_UNSUPPORTED. weft_device_stream_handle
 * is the native handle of stream s (cudaStream_t, for NCCL), NULL before
 * weft_device_init and on the CPU. */
WEFT_API weft_status weft_event_record(weft_device dev, weft_stream_id s, weft_event **ev);
WEFT_API weft_status weft_stream_wait_event(weft_device dev, weft_stream_id s, weft_event *ev);
WEFT_API weft_status weft_event_synchronize(weft_device dev, weft_event *ev);
WEFT_API weft_status weft_event_query(weft_device dev, weft_event *ev, bool *done);
WEFT_API weft_status weft_event_elapsed_ms(weft_device dev, weft_event *start, weft_event *end,
                                           float *ms);
WEFT_API void weft_event_destroy(weft_device dev, weft_event *ev); /* NULL: no-op */
WEFT_API void *weft_device_stream_handle(weft_device dev, weft_stream_id s);

/* -------------------------------------------------------------- options */

WEFT_API weft_status weft_device_set_matmul_precision(weft_device dev, weft_matmul_precision p);
/* WEFT_MATMUL_F32 for a device without the option */
WEFT_API weft_matmul_precision weft_device_matmul_precision(weft_device dev);
WEFT_API weft_status weft_device_cache_stats(weft_device dev, weft_cache_stats *out);
WEFT_API weft_status weft_device_empty_cache(weft_device dev);
/* Threads of the CPU backend's kernels (GEMMs, attention, elementwise ops,
 * activations, norms, softmax, cross-entropy), this process; n >= 1. The
 * starting value is OpenBLAS's (OPENBLAS_NUM_THREADS, the pthreads build),
 * after which weft keeps OpenBLAS itself at 1 thread and splits its GEMMs
 * over its own threads (a program's own cblas calls then run on 1 thread
 * too). Every kernel but the GEMMs gives the same bits on any count; a
 * GEMM's bits may depend on it, as with OpenBLAS's threading. With another
 * BLAS, or none, the kernels run on 1 thread and n > 1 is
 * WEFT_ERR_UNSUPPORTED. Local; not while another thread runs CPU kernels. */
WEFT_API weft_status weft_cpu_set_num_threads(int n);
WEFT_API int weft_cpu_num_threads(void);

/* ------------------------------------------------------------- counters */

/* What the device backend (WEFT_CUDA, real or emulated: the same counting
 * code) asked of the device, to judge a change to the device path without
 * a GPU (weft-train --profile prints the difference over each step as
 * "device calls per step: ..."; tests on the emulated device pin it).
 * Counted where the backend's own code makes the call, in every thread;
 * what other code asks of CUDA directly (the NCCL path of
 * mesh/device_comm.c: its events and cudaMallocAsync) is not counted.
 * Counts since the process started; read before and after and subtract. */
typedef struct weft_device_stats {
  int64_t launches;   /* kernel launches (every WEFT_LAUNCH of kernels/cuda;
                       * a cudaMemsetAsync is not one) */
  int64_t blas;       /* cuBLAS GEMM calls (handle set-up is not counted) */
  int64_t host_syncs; /* backend calls that made the host wait for the device:
                       * weft_device_synchronize (one, however many streams),
                       * a blocking weft_memcpy (its copy and wait are one),
                       * weft_event_synchronize, cudaFree and cudaFreeHost of
                       * the allocators (CUDA waits for the device there) and
                       * shutdown; not an async copy to or from pageable host
                       * memory, which a GPU may also make wait */
  int64_t mallocs;    /* cudaMalloc (the caching allocator's misses) and
                       * cudaMallocHost (weft_alloc_pinned) calls */
  int64_t bytes_h2d;  /* bytes of host-to-device copies issued, blocking or */
  int64_t bytes_d2h;  /* async, and device-to-host (device-to-device: none) */
} weft_device_stats;
/* The counters now: this process's, local, thread-safe (relaxed atomics),
 * never fails; all zero in a build without the CUDA backend. Read by
 * weft-train --profile (examples/train/loop.c) and tests. */
WEFT_API weft_device_stats weft_device_stats_get(void);

/* ------------------------------------------------------------ cost model */

/* A roofline model of the device path, to judge a change without a GPU
 * (weft-train --profile --predict h100|h200). Every WEFT_LAUNCH of
 * kernels/cuda and every cuBLAS GEMM records, under the kernel's name, the
 * floating-point operations and the device-memory bytes it reads and writes
 * (formulas at each launch site: what the kernel must move at least, not
 * what a cache would save), and the engine whose peak bounds it; memsets
 * and copies record their bytes too ("cudaMemsetAsync", "memcpy d2d",
 * "memcpy h2d", "memcpy d2h"; the last two over the host link). With a
 * spec set, each call adds
 *   max(flops / (peak[engine] share), bytes / (mem_bytes_s share)) + launch_s
 * to its kernel's modeled time, where share = min(1, thread blocks / sms)
 * for a kernel (1 for BLAS, memsets and copies). Host synchronisations are in
 * weft_device_stats; a caller adds sync_s for each (weft-train does).
 * Collectives are not modeled. Counted in the real and the emulated build
 * alike; process-wide, thread-safe. */
typedef enum weft_engine {
  WEFT_ENGINE_FP32 = 0, /* CUDA cores, f32 arithmetic (every weft kernel) */
  WEFT_ENGINE_TF32,     /* tensor cores, tf32 inputs */
  WEFT_ENGINE_BF16,     /* tensor cores, bf16 or f16 inputs */
  WEFT_ENGINE_COUNT
} weft_engine;

typedef struct weft_gpu_spec {
  const char *name;                     /* "H100 SXM" */
  double peak_flops[WEFT_ENGINE_COUNT]; /* dense FLOP/s of each engine */
  double mem_bytes_s;                   /* device-memory bandwidth */
  double link_bytes_s;                  /* host<->device copies, each way */
  double sms;      /* streaming multiprocessors: a kernel launched on fewer thread blocks gets
                    * that share of the peaks */
  double launch_s; /* fixed time of every kernel, BLAS call, memset or copy */
  double sync_s; /* device idle per host synchronisation (the host waits, then refills the queue) */
} weft_gpu_spec;

/* The datasheet spec of a known GPU by short name, "h100" or "h200" (the
 * SXM parts), case-insensitive; NULL for any other name. Static storage. */
WEFT_API const weft_gpu_spec *weft_gpu_spec_find(const char *name);

typedef struct weft_kernel_cost {
  const char *name; /* the kernel as launched ("act_fwd_kernel<WEFT_ACT_GELU_TANH>"), or
                     * "cublas gemm <engine>[ batched]"; static storage */
  int engine;       /* weft_engine */
  int64_t calls;
  int64_t uncosted; /* calls whose launch site gave no cost (counted at launch_s only) */
  double flops, bytes;
  double model_s; /* modeled seconds under the spec set at the time of each call */
} weft_kernel_cost;

/* Sets the spec that the per-call model uses from now on (NULL: none, and
 * model_s stays 0). Local, thread-safe; keep it set for a whole step. */
WEFT_API void weft_device_cost_model_set(const weft_gpu_spec *spec);
/* Forgets every record (weft-train resets before each step). */
WEFT_API void weft_device_costs_reset(void);
/* Kernels with records at most: past WEFT_KERNEL_COSTS_MAX - 1 names the
 * last record, "(other kernels)", takes the rest (~70 launch sites today). */
#define WEFT_KERNEL_COSTS_MAX 256
/* Copies the records, by modeled time then bytes (largest first), into
 * out[0 .. min(n, cap)) and returns n (<= WEFT_KERNEL_COSTS_MAX), how many
 * kernels have records (out may be NULL with cap 0). */
WEFT_API int weft_device_costs_get(weft_kernel_cost *out, int cap);

/* ------------------------------------------------------------- compute */
/* weft_backend_<op>(dev, args...) calls member <op> of dev's table with the
 * same arguments; the semantics are layers.h's function of that name. */

WEFT_API weft_status weft_backend_sgemm(weft_device dev, bool trans_a, bool trans_b, int64_t m,
                                        int64_t n, int64_t k, float alpha, const float *a,
                                        int64_t lda, const float *b, int64_t ldb, float beta,
                                        float *c, int64_t ldc);
WEFT_API weft_status weft_backend_sgemm_strided_batched(
    weft_device dev, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
    const float *a, int64_t lda, int64_t stride_a, const float *b, int64_t ldb, int64_t stride_b,
    float beta, float *c, int64_t ldc, int64_t stride_c, int64_t count);
WEFT_API weft_status weft_backend_gemm_bf16(weft_device dev, bool trans_a, bool trans_b, int64_t m,
                                            int64_t n, int64_t k, float alpha, const uint16_t *a,
                                            int64_t lda, const uint16_t *b, int64_t ldb, float beta,
                                            float *c, int64_t ldc);

WEFT_API weft_status weft_backend_embedding_forward(weft_device dev, float *out,
                                                    const int32_t *tokens, const float *weight,
                                                    int64_t N, int64_t V, int64_t C);
WEFT_API weft_status weft_backend_embedding_backward(weft_device dev, float *dweight,
                                                     const int32_t *tokens, const float *dout,
                                                     int64_t N, int64_t V, int64_t C);
WEFT_API weft_status weft_backend_embedding_range_forward(weft_device dev, float *out,
                                                          const int32_t *tokens,
                                                          const float *weight_local, int64_t N,
                                                          int64_t v0, int64_t nv, int64_t C);
WEFT_API weft_status weft_backend_embedding_range_backward(weft_device dev, float *dweight_local,
                                                           const int32_t *tokens, const float *dout,
                                                           int64_t N, int64_t v0, int64_t nv,
                                                           int64_t C);
WEFT_API weft_status weft_backend_linear_forward(weft_device dev, float *out, const float *inp,
                                                 const float *weight, const float *bias, int64_t N,
                                                 int64_t IC, int64_t OC);
WEFT_API weft_status weft_backend_linear_backward(weft_device dev, float *dinp, float *dweight,
                                                  float *dbias, const float *dout, const float *inp,
                                                  const float *weight, int64_t N, int64_t IC,
                                                  int64_t OC, bool accumulate_dinp,
                                                  bool accumulate_dweight);
WEFT_API weft_status weft_backend_rmsnorm_forward(weft_device dev, float *out, float *rstd,
                                                  const float *inp, const float *weight, int64_t N,
                                                  int64_t C, float eps);
WEFT_API weft_status weft_backend_rmsnorm_backward(weft_device dev, float *dinp, float *dweight,
                                                   const float *dout, const float *inp,
                                                   const float *weight, const float *rstd,
                                                   int64_t N, int64_t C, bool accumulate_dinp);
WEFT_API weft_status weft_backend_rope_tables(weft_device dev, float *cosb, float *sinb,
                                              int64_t max_pos, int64_t hd, double theta);
WEFT_API weft_status weft_backend_rope_forward(weft_device dev, float *out, const float *inp,
                                               const float *cosb, const float *sinb,
                                               int64_t max_pos, int64_t B, int64_t T, int64_t NH,
                                               int64_t hd, int64_t pos0);
WEFT_API weft_status weft_backend_rope_backward(weft_device dev, float *dinp, const float *dout,
                                                const float *cosb, const float *sinb,
                                                int64_t max_pos, int64_t B, int64_t T, int64_t NH,
                                                int64_t hd, int64_t pos0);
/* 0 when dev has no attention (the call itself then says why) */
WEFT_API size_t weft_backend_attention_scratch_bytes(weft_device dev, int64_t B, int64_t T,
                                                     int64_t H, int64_t Hkv, int64_t hd);
/* causal: weft_attention_forward's flag (false: every query sees all T
 * keys); the backward's must be the forward's */
WEFT_API weft_status weft_backend_attention_forward(weft_device dev, float *out, float *lse,
                                                    const float *q, const float *k, const float *v,
                                                    int64_t B, int64_t T, int64_t H, int64_t Hkv,
                                                    int64_t hd, bool causal, void *scratch);
WEFT_API weft_status weft_backend_attention_backward(weft_device dev, float *dq, float *dk,
                                                     float *dv, const float *dout, const float *q,
                                                     const float *k, const float *v,
                                                     const float *lse, const float *out, int64_t B,
                                                     int64_t T, int64_t H, int64_t Hkv, int64_t hd,
                                                     bool causal, void *scratch);
WEFT_API weft_status weft_backend_swiglu_forward(weft_device dev, float *out, const float *a,
                                                 const float *b, int64_t n);
WEFT_API weft_status weft_backend_swiglu_backward(weft_device dev, float *da, float *db,
                                                  const float *dout, const float *a, const float *b,
                                                  int64_t n);
WEFT_API weft_status weft_backend_residual_forward(weft_device dev, float *out, const float *a,
                                                   const float *b, int64_t n);
WEFT_API weft_status weft_backend_residual_backward(weft_device dev, float *da, float *db,
                                                    const float *dout, int64_t n);
WEFT_API weft_status weft_backend_cross_entropy_forward(weft_device dev, double *loss, float *lse,
                                                        const float *logits, const int32_t *targets,
                                                        int64_t N, int64_t V);
WEFT_API weft_status weft_backend_cross_entropy_backward(weft_device dev, float *dlogits,
                                                         const float *logits, const float *lse,
                                                         const int32_t *targets, int64_t N,
                                                         int64_t V, float scale);
WEFT_API weft_status weft_backend_cross_entropy_local_max(weft_device dev, float *row_max,
                                                          const float *logits_local, int64_t N,
                                                          int64_t nv);
WEFT_API weft_status weft_backend_cross_entropy_local_target(weft_device dev, float *target_logit,
                                                             const float *logits_local,
                                                             const int32_t *targets, int64_t N,
                                                             int64_t v0, int64_t nv);
WEFT_API weft_status weft_backend_cross_entropy_local_sumexp(weft_device dev, float *sumexp,
                                                             const float *logits_local,
                                                             const float *gmax, int64_t N,
                                                             int64_t nv);
WEFT_API weft_status weft_backend_cross_entropy_finish(weft_device dev, double *loss, float *lse,
                                                       const float *gmax, const float *gsum,
                                                       const float *gtarget, int64_t N);
WEFT_API weft_status weft_backend_cross_entropy_backward_local(
    weft_device dev, float *dlogits_local, const float *logits_local, const float *lse,
    const int32_t *targets, int64_t N, int64_t v0, int64_t nv, float scale);

WEFT_API weft_status weft_backend_adamw_multi(weft_device dev, float *const *param,
                                              const float *const *grad, float *const *m,
                                              float *const *v, float *const *vmax, const int64_t *n,
                                              int ntensors, int64_t step,
                                              const weft_adamw_params *hp);
WEFT_API weft_status weft_backend_sgd_multi(weft_device dev, float *const *param,
                                            const float *const *grad, float *const *buf,
                                            const int64_t *n, int ntensors, int64_t step,
                                            const weft_sgd_params *hp);
WEFT_API weft_status weft_backend_sumsq_multi(weft_device dev, const float *const *x,
                                              const int64_t *n, int ntensors, double *out);
WEFT_API weft_status weft_backend_scale_multi(weft_device dev, float *const *x, const int64_t *n,
                                              int ntensors, float alpha);

WEFT_API weft_status weft_backend_flat_pack(weft_device dev, void *flat, weft_dtype flat_dtype,
                                            const weft_flat_piece *pieces, int npieces);
WEFT_API weft_status weft_backend_flat_split(weft_device dev, const void *flat,
                                             weft_dtype flat_dtype, const weft_flat_piece *pieces,
                                             int npieces);
WEFT_API weft_status weft_backend_flat_accumulate(weft_device dev, const void *flat,
                                                  weft_dtype flat_dtype,
                                                  const weft_flat_piece *pieces, int npieces,
                                                  float scale);

WEFT_API weft_status weft_backend_layernorm_forward(weft_device dev, float *out, float *mean,
                                                    float *rstd, const float *inp,
                                                    const float *weight, const float *bias,
                                                    int64_t N, int64_t C, float eps);
WEFT_API weft_status weft_backend_layernorm_backward(weft_device dev, float *dinp, float *dweight,
                                                     float *dbias, const float *dout,
                                                     const float *inp, const float *weight,
                                                     const float *mean, const float *rstd,
                                                     int64_t N, int64_t C, bool accumulate_dinp);
WEFT_API weft_status weft_backend_activation_forward(weft_device dev, weft_activation act,
                                                     float *out, const float *inp, int64_t n);
WEFT_API weft_status weft_backend_activation_backward(weft_device dev, weft_activation act,
                                                      float *dinp, const float *dout,
                                                      const float *inp, int64_t n, bool accumulate);
/* The same on f32, bf16 or f16 tensors (the _dt members, version 5); f32
 * goes to the f32 members, so it works on every table. A 16-bit dtype on
 * a table without the member is WEFT_ERR_UNSUPPORTED naming it. */
WEFT_API weft_status weft_backend_activation_forward_dt(weft_device dev, weft_activation act,
                                                        weft_dtype dt, void *out, const void *inp,
                                                        int64_t n);
WEFT_API weft_status weft_backend_activation_backward_dt(weft_device dev, weft_activation act,
                                                         weft_dtype dt, void *dinp,
                                                         const void *dout, const void *inp,
                                                         int64_t n, bool accumulate);
WEFT_API weft_status weft_backend_swiglu_forward_dt(weft_device dev, weft_dtype dt, void *out,
                                                    const void *a, const void *b, int64_t n);
WEFT_API weft_status weft_backend_swiglu_backward_dt(weft_device dev, weft_dtype dt, void *da,
                                                     void *db, const void *dout, const void *a,
                                                     const void *b, int64_t n);
WEFT_API weft_status weft_backend_layernorm_forward_dt(weft_device dev, weft_dtype dt, void *out,
                                                       float *mean, float *rstd, const void *inp,
                                                       const void *weight, const void *bias,
                                                       int64_t N, int64_t C, float eps);
WEFT_API weft_status weft_backend_layernorm_backward_dt(weft_device dev, weft_dtype dt, void *dinp,
                                                        float *dweight, float *dbias,
                                                        const void *dout, const void *inp,
                                                        const void *weight, const float *mean,
                                                        const float *rstd, int64_t N, int64_t C,
                                                        bool accumulate_dinp);
WEFT_API weft_status weft_backend_softmax_forward_dt(weft_device dev, weft_dtype dt, void *out,
                                                     const void *inp, int64_t N, int64_t C);
WEFT_API weft_status weft_backend_softmax_backward_dt(weft_device dev, weft_dtype dt, void *dinp,
                                                      const void *dout, const void *out, int64_t N,
                                                      int64_t C, bool accumulate);
WEFT_API weft_status weft_backend_rmsnorm_forward_dt(weft_device dev, weft_dtype dt, void *out,
                                                     float *rstd, const void *inp,
                                                     const void *weight, int64_t N, int64_t C,
                                                     float eps);
WEFT_API weft_status weft_backend_rmsnorm_backward_dt(weft_device dev, weft_dtype dt, void *dinp,
                                                      float *dweight, const void *dout,
                                                      const void *inp, const void *weight,
                                                      const float *rstd, int64_t N, int64_t C,
                                                      bool accumulate_dinp);
WEFT_API weft_status weft_backend_cross_entropy_forward_dt(weft_device dev, weft_dtype dt,
                                                           double *loss, float *lse,
                                                           const void *logits,
                                                           const int32_t *targets, int64_t N,
                                                           int64_t V);
WEFT_API weft_status weft_backend_cross_entropy_backward_dt(weft_device dev, weft_dtype dt,
                                                            void *dlogits, const void *logits,
                                                            const float *lse,
                                                            const int32_t *targets, int64_t N,
                                                            int64_t V, float scale);
WEFT_API weft_status weft_backend_cross_entropy_local_max_dt(weft_device dev, weft_dtype dt,
                                                             float *row_max,
                                                             const void *logits_local, int64_t N,
                                                             int64_t nv);
WEFT_API weft_status weft_backend_cross_entropy_local_target_dt(weft_device dev, weft_dtype dt,
                                                                float *target_logit,
                                                                const void *logits_local,
                                                                const int32_t *targets, int64_t N,
                                                                int64_t v0, int64_t nv);
WEFT_API weft_status weft_backend_cross_entropy_local_sumexp_dt(weft_device dev, weft_dtype dt,
                                                                float *sumexp,
                                                                const void *logits_local,
                                                                const float *gmax, int64_t N,
                                                                int64_t nv);
WEFT_API weft_status weft_backend_cross_entropy_backward_local_dt(
    weft_device dev, weft_dtype dt, void *dlogits_local, const void *logits_local, const float *lse,
    const int32_t *targets, int64_t N, int64_t v0, int64_t nv, float scale);
WEFT_API weft_status weft_backend_embedding_range_forward_dt(weft_device dev, weft_dtype dt,
                                                             void *out, const int32_t *tokens,
                                                             const void *weight_local, int64_t N,
                                                             int64_t v0, int64_t nv, int64_t C);
WEFT_API weft_status weft_backend_embedding_range_backward_dt(weft_device dev, weft_dtype dt,
                                                              float *dweight_local,
                                                              const int32_t *tokens,
                                                              const void *dout, int64_t N,
                                                              int64_t v0, int64_t nv, int64_t C);
WEFT_API weft_status weft_backend_rope_forward_dt(weft_device dev, weft_dtype dt, void *out,
                                                  const void *inp, const float *cosb,
                                                  const float *sinb, int64_t max_pos, int64_t B,
                                                  int64_t T, int64_t NH, int64_t hd, int64_t pos0);
WEFT_API weft_status weft_backend_rope_backward_dt(weft_device dev, weft_dtype dt, void *dinp,
                                                   const void *dout, const float *cosb,
                                                   const float *sinb, int64_t max_pos, int64_t B,
                                                   int64_t T, int64_t NH, int64_t hd, int64_t pos0);
WEFT_API weft_status weft_backend_gemm_dt(weft_device dev, bool trans_a, bool trans_b, int64_t m,
                                          int64_t n, int64_t k, float alpha, weft_dtype ab_dt,
                                          const void *a, int64_t lda, const void *b, int64_t ldb,
                                          float beta, weft_dtype c_dt, void *c, int64_t ldc,
                                          const void *bias);
/* rows: NULL or row strides (weft_attention_rows); f32 with packed rows
 * goes to the f32 members, anything else to the _dt members (a table
 * without them: WEFT_ERR_UNSUPPORTED; see weft_backend_attention_takes_rows).
 * A stride below its operand's heads * hd is WEFT_ERR_INVALID. */
WEFT_API weft_status weft_backend_attention_forward_dt(weft_device dev, weft_dtype dt, void *out,
                                                       float *lse, const void *q, const void *k,
                                                       const void *v, int64_t B, int64_t T,
                                                       int64_t H, int64_t Hkv, int64_t hd,
                                                       bool causal, const weft_attention_rows *rows,
                                                       void *scratch);
WEFT_API weft_status weft_backend_attention_backward_dt(
    weft_device dev, weft_dtype dt, void *dq, void *dk, void *dv, const void *dout, const void *q,
    const void *k, const void *v, const float *lse, const void *out, int64_t B, int64_t T,
    int64_t H, int64_t Hkv, int64_t hd, bool causal, const weft_attention_rows *rows,
    void *scratch);
/* Whether dev's attention takes strided rows (its table has both _dt
 * members): the op layer then hands it slices of a fused projection
 * without copying them. Local, no error. */
WEFT_API bool weft_backend_attention_takes_rows(weft_device dev);
WEFT_API weft_status weft_backend_dropout_apply_dt(weft_device dev, weft_dtype dt, void *out,
                                                   const void *inp, const float *uniform, float p,
                                                   int64_t n);
WEFT_API weft_status weft_backend_softmax_forward(weft_device dev, float *out, const float *inp,
                                                  int64_t N, int64_t C);
WEFT_API weft_status weft_backend_softmax_backward(weft_device dev, float *dinp, const float *dout,
                                                   const float *out, int64_t N, int64_t C,
                                                   bool accumulate);
WEFT_API weft_status weft_backend_dropout_apply(weft_device dev, float *out, const float *inp,
                                                const float *uniform, float p, int64_t n);

#ifdef __cplusplus
}
#endif
#endif /* WEFT_BACKEND_H */
