/* weft/cuda.h — the CUDA backend: devices, streams, the caching allocator,
 * host<->device copies and the device kernels (cuBLAS GEMMs and the layer
 * kernels of layers.h, same arguments, device pointers).
 *
 * A short tour (one process per GPU, or several processes sharing one):
 *
 *     int dev;
 *     weft_cuda_init(weft_local_rank(), &dev);        // device local_rank % count
 *     float *x;
 *     weft_alloc(WEFT_CUDA, n * sizeof(float), (void **)&x);   // caching allocator
 *     weft_cuda_memcpy(x, host, n * sizeof(float), WEFT_COPY_H2D);
 *     weft_cuda_rmsnorm_forward(out, rstd, x, w, N, C, 1e-5f); // compute stream
 *     weft_cuda_synchronize();
 *     weft_free(x);                                    // back to the cache
 *
 * Conventions:
 * - Every function exists in every build. Without the backend (meson
 *   -Dcuda=disabled, or no nvcc) weft_cuda_device_count() is 0 and the rest
 *   return WEFT_ERR_UNSUPPORTED; with the backend but no GPU (or before
 *   weft_cuda_init) they return WEFT_ERR_NO_DEVICE, saying which.
 * - Kernels are asynchronous on the compute stream (WEFT_STREAM_COMPUTE);
 *   a status reports argument errors and launch errors, not faults inside a
 *   kernel (weft_cuda_synchronize reports those). Their arguments, shapes
 *   and formulas are those of the same-named function in layers.h (read the
 *   documentation there); pointers are device pointers.
 * - Device memory comes from weft_alloc(WEFT_CUDA, ...): a caching allocator
 *   (size classes, free blocks reused in stream order) whose live bytes are
 *   weft_mem_get(WEFT_CUDA) like the CPU accounting; memory held in the
 *   cache but not in use is reported by weft_cuda_cache_get.
 * - Matmul precision (weft_cuda_set_matmul_precision): F32 (default; exact
 *   fp32 FMA), TF32 (fp32 storage, tensor-core TF32 products) or BF16
 *   (operands rounded to bf16, fp32 accumulation and output). It applies to
 *   weft_cuda_sgemm and everything built on it (linear, attention).
 */
#ifndef WEFT_CUDA_H
#define WEFT_CUDA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels.h"
#include "layers.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- devices */

/* GPUs visible to this process; 0 without the backend or a driver. Never
 * fails, never prints. */
int weft_cuda_device_count(void);
/* Picks device local_rank % count (so ranks of a node spread over its GPUs
 * and extra ranks share), creates the compute and communication streams and
 * the cuBLAS handle. Idempotent for the same device; *device may be NULL. */
weft_status weft_cuda_init(int local_rank, int *device);
/* Releases streams, handles and every cached block (live weft_alloc blocks
 * must have been freed). No-op before weft_cuda_init. */
void weft_cuda_shutdown(void);
/* The device chosen by weft_cuda_init, -1 before. */
int weft_cuda_current_device(void);
/* Waits for both streams; reports an asynchronous kernel fault as
 * WEFT_ERR_CUDA with CUDA's message. */
weft_status weft_cuda_synchronize(void);
/* true when ptr points into device memory (any byte of a weft_alloc block,
 * or any CUDA allocation); false for host memory, NULL, or no backend. */
bool weft_cuda_is_device_ptr(const void *ptr);

/* Device memory from the caching allocator: what weft_alloc(WEFT_CUDA, ...)
 * returns, counted in weft_mem_get(WEFT_CUDA); 256-byte aligned. Free it
 * with weft_cuda_free or weft_free. Needs weft_cuda_init. */
weft_status weft_cuda_malloc(size_t bytes, void **out);
void weft_cuda_free(void *ptr); /* NULL: no-op */

/* ---------------------------------------------------------------- streams */

typedef enum weft_cuda_stream_id { WEFT_STREAM_COMPUTE = 0, WEFT_STREAM_COMM = 1 } weft_cuda_stream_id;
typedef struct weft_cuda_event weft_cuda_event;

/* Records an event on stream s (a new event object in *ev). */
weft_status weft_cuda_event_record(weft_cuda_stream_id s, weft_cuda_event **ev);
/* Makes stream s wait (on the device) for ev. */
weft_status weft_cuda_stream_wait_event(weft_cuda_stream_id s, weft_cuda_event *ev);
/* Blocks the host until ev completed. */
weft_status weft_cuda_event_synchronize(weft_cuda_event *ev);
/* Milliseconds between two completed events. */
weft_status weft_cuda_event_elapsed_ms(weft_cuda_event *start, weft_cuda_event *end, float *ms);
void weft_cuda_event_destroy(weft_cuda_event *ev); /* NULL: no-op */
/* The cudaStream_t behind s (for NCCL), as void *; NULL before init. */
void *weft_cuda_stream_handle(weft_cuda_stream_id s);

/* ------------------------------------------------------------------ copies */

typedef enum weft_copy_kind { WEFT_COPY_H2D, WEFT_COPY_D2H, WEFT_COPY_D2D } weft_copy_kind;
/* Copies bytes on the compute stream and waits for it (host memory may be
 * pageable). bytes == 0 is a no-op. */
weft_status weft_cuda_memcpy(void *dst, const void *src, size_t bytes, weft_copy_kind kind);
/* Same on stream s without waiting (host memory must stay valid until the
 * stream passes the copy). */
weft_status weft_cuda_memcpy_async(void *dst, const void *src, size_t bytes, weft_copy_kind kind,
                                   weft_cuda_stream_id s);
/* Zeroes bytes of device memory on the compute stream (async). */
weft_status weft_cuda_memset_zero(void *dst, size_t bytes);

/* A new contiguous tensor on dev holding a copy of src (any device, any
 * strides on the CPU side; a device source must be contiguous). */
weft_status weft_cuda_tensor_to(const weft_tensor *src, weft_device dev, weft_tensor **out);

/* ------------------------------------------------------- caching allocator */

typedef struct weft_cuda_cache_stats {
  int64_t reserved_bytes; /* obtained from cudaMalloc and not yet returned */
  int64_t cached_bytes;   /* of those, in free blocks waiting for reuse */
  int64_t hits;           /* allocations served from the cache */
  int64_t misses;         /* allocations that called cudaMalloc */
} weft_cuda_cache_stats;
weft_cuda_cache_stats weft_cuda_cache_get(void);
/* Returns every cached (free) block to the driver. */
weft_status weft_cuda_empty_cache(void);

/* ---------------------------------------------------------------- options */

typedef enum weft_matmul_precision {
  WEFT_MATMUL_F32 = 0,
  WEFT_MATMUL_TF32 = 1,
  WEFT_MATMUL_BF16 = 2
} weft_matmul_precision;
void weft_cuda_set_matmul_precision(weft_matmul_precision p);
weft_matmul_precision weft_cuda_matmul_precision(void);

/* ------------------------------------------------------------------- GEMM */

/* weft_sgemm on device pointers (row-major, leading dims in elements), in
 * the current matmul precision, through cuBLAS. */
weft_status weft_cuda_sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                            float alpha, const float *a, int64_t lda, const float *b, int64_t ldb,
                            float beta, float *c, int64_t ldc);
/* Batched form: count independent GEMMs, operand i at a + i*stride_a, ... */
weft_status weft_cuda_sgemm_strided_batched(bool trans_a, bool trans_b, int64_t m, int64_t n,
                                            int64_t k, float alpha, const float *a, int64_t lda,
                                            int64_t stride_a, const float *b, int64_t ldb,
                                            int64_t stride_b, float beta, float *c, int64_t ldc,
                                            int64_t stride_c, int64_t count);
/* bf16 operands (uint16_t bit patterns), fp32 accumulation and fp32 C. */
weft_status weft_cuda_gemm_bf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                                float alpha, const uint16_t *a, int64_t lda, const uint16_t *b,
                                int64_t ldb, float beta, float *c, int64_t ldc);

/* ---------------------------------------------------------- layer kernels */
/* Same arguments and results as layers.h, on device pointers. */

weft_status weft_cuda_embedding_forward(float *out, const int32_t *tokens, const float *weight,
                                        int64_t N, int64_t V, int64_t C);
weft_status weft_cuda_embedding_backward(float *dweight, const int32_t *tokens, const float *dout,
                                         int64_t N, int64_t V, int64_t C);
weft_status weft_cuda_embedding_range_forward(float *out, const int32_t *tokens,
                                              const float *weight_local, int64_t N, int64_t v0,
                                              int64_t nv, int64_t C);
weft_status weft_cuda_embedding_range_backward(float *dweight_local, const int32_t *tokens,
                                               const float *dout, int64_t N, int64_t v0,
                                               int64_t nv, int64_t C);

weft_status weft_cuda_linear_forward(float *out, const float *inp, const float *weight,
                                     const float *bias, int64_t N, int64_t IC, int64_t OC);
weft_status weft_cuda_linear_backward(float *dinp, float *dweight, float *dbias,
                                      const float *dout, const float *inp, const float *weight,
                                      int64_t N, int64_t IC, int64_t OC, bool accumulate_dinp,
                                      bool accumulate_dweight);

weft_status weft_cuda_rmsnorm_forward(float *out, float *rstd, const float *inp,
                                      const float *weight, int64_t N, int64_t C, float eps);
weft_status weft_cuda_rmsnorm_backward(float *dinp, float *dweight, const float *dout,
                                       const float *inp, const float *weight, const float *rstd,
                                       int64_t N, int64_t C, bool accumulate_dinp);

/* Tables are computed on the host (weft_rope_tables) and copied. */
weft_status weft_cuda_rope_tables(float *cosb, float *sinb, int64_t max_pos, int64_t hd,
                                  double theta);
weft_status weft_cuda_rope_forward(float *out, const float *inp, const float *cosb,
                                   const float *sinb, int64_t max_pos, int64_t B, int64_t T,
                                   int64_t NH, int64_t hd, int64_t pos0);
weft_status weft_cuda_rope_backward(float *dinp, const float *dout, const float *cosb,
                                    const float *sinb, int64_t max_pos, int64_t B, int64_t T,
                                    int64_t NH, int64_t hd, int64_t pos0);

/* Causal GQA attention as weft_attention_forward/_backward. Memory
 * efficient: scores exist only for one block of query rows at a time
 * (weft_cuda_attention_scratch_bytes), lse is saved, backward recomputes
 * the probabilities. scratch is device memory of that many bytes. */
size_t weft_cuda_attention_scratch_bytes(int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t hd);
weft_status weft_cuda_attention_forward(float *out, float *lse, const float *q, const float *k,
                                        const float *v, int64_t B, int64_t T, int64_t H,
                                        int64_t Hkv, int64_t hd, void *scratch);
weft_status weft_cuda_attention_backward(float *dq, float *dk, float *dv, const float *dout,
                                         const float *q, const float *k, const float *v,
                                         const float *lse, const float *out, int64_t B, int64_t T,
                                         int64_t H, int64_t Hkv, int64_t hd, void *scratch);

weft_status weft_cuda_swiglu_forward(float *out, const float *a, const float *b, int64_t n);
weft_status weft_cuda_swiglu_backward(float *da, float *db, const float *dout, const float *a,
                                      const float *b, int64_t n);
weft_status weft_cuda_residual_forward(float *out, const float *a, const float *b, int64_t n);
weft_status weft_cuda_residual_backward(float *da, float *db, const float *dout, int64_t n);

/* Full-vocab cross-entropy; *loss is copied to the host (synchronizes). */
weft_status weft_cuda_cross_entropy_forward(double *loss, float *lse, const float *logits,
                                            const int32_t *targets, int64_t N, int64_t V);
weft_status weft_cuda_cross_entropy_backward(float *dlogits, const float *logits,
                                             const float *lse, const int32_t *targets, int64_t N,
                                             int64_t V, float scale);
/* Vocab-sharded pieces (loss parallel), all arrays on the device; finish
 * writes the loss to the host. */
weft_status weft_cuda_cross_entropy_local_max(float *row_max, const float *logits_local,
                                              int64_t N, int64_t nv);
weft_status weft_cuda_cross_entropy_local_target(float *target_logit, const float *logits_local,
                                                 const int32_t *targets, int64_t N, int64_t v0,
                                                 int64_t nv);
weft_status weft_cuda_cross_entropy_local_sumexp(float *sumexp, const float *logits_local,
                                                 const float *gmax, int64_t N, int64_t nv);
weft_status weft_cuda_cross_entropy_finish(double *loss, float *lse, const float *gmax,
                                           const float *gsum, const float *gtarget, int64_t N);
weft_status weft_cuda_cross_entropy_backward_local(float *dlogits_local,
                                                   const float *logits_local, const float *lse,
                                                   const int32_t *targets, int64_t N, int64_t v0,
                                                   int64_t nv, float scale);

/* ------------------------------------------------------------- optimizers */

/* One AdamW step (weft_adamw_step's formula) over ntensors tensors in one
 * launch: tensor i has n[i] elements at param[i], grad[i], m[i], v[i]
 * (device pointers; the pointer arrays and n are host arrays). vmax may be
 * NULL unless hp->amsgrad. */
weft_status weft_cuda_adamw_multi(float *const *param, const float *const *grad, float *const *m,
                                  float *const *v, float *const *vmax, const int64_t *n,
                                  int ntensors, int64_t step, const weft_adamw_params *hp);
/* sum_i x[i]^2 in double over ntensors device arrays; result on the host. */
weft_status weft_cuda_sumsq_multi(const float *const *x, const int64_t *n, int ntensors,
                                  double *out);
/* x *= alpha over ntensors device arrays in one launch. */
weft_status weft_cuda_scale_multi(float *const *x, const int64_t *n, int ntensors, float alpha);

/* ------------------------------------------------------------------ casts */

/* Round to nearest even like weft_f32_to_bf16; n elements, device arrays. */
weft_status weft_cuda_cast_f32_to_bf16(uint16_t *out, const float *in, int64_t n);
weft_status weft_cuda_cast_bf16_to_f32(float *out, const uint16_t *in, int64_t n);

#ifdef __cplusplus
}
#endif
#endif /* WEFT_CUDA_H */
