/* weft/cuda.h — CUDA conveniences over the backend interface (backend.h).
 *
 * The CUDA backend (the .cu sources of kernels/cuda, built by nvcc, or against the CPU
 * emulator with meson -Dcuda=emulated) is the WEFT_CUDA table of
 * backend.h: tensors on WEFT_CUDA, weft_memcpy(WEFT_CUDA, ...), the
 * weft_backend_<op>(WEFT_CUDA, ...) kernels and device collectives all go
 * through it. What is specific to CUDA is here, as inline calls of the
 * generic functions, so every name exists in every build (in a build
 * without the backend they report WEFT_ERR_UNSUPPORTED, and
 * weft_cuda_device_count() is 0).
 *
 *     int dev;
 *     weft_cuda_init(weft_local_rank(), &dev);        // device local_rank % count
 *     weft_tensor *x;
 *     weft_tensor_create(WEFT_F32, WEFT_CUDA, 2, shape, &x);   // caching allocator
 *     weft_tensor_copy(x, host);                        // host -> device
 *     weft_backend_rmsnorm_forward(WEFT_CUDA, out, rstd, x->data, w, N, C, 1e-5f);
 *     weft_cuda_synchronize();
 *
 * Device memory comes from weft_alloc(WEFT_CUDA, ...): a caching allocator
 * (size classes, free blocks reused in stream order) whose live bytes are
 * weft_mem_get(WEFT_CUDA); memory held in the cache but not in use is
 * weft_cuda_cache_get().reserved_bytes - live. Kernels run on the compute
 * stream (WEFT_STREAM_COMPUTE), collectives on WEFT_STREAM_COMM (or the
 * stream weft_comm_stream_set chose: FSDP's all-gathers and reduce-scatters
 * have their own).
 */
#ifndef WEFT_CUDA_H
#define WEFT_CUDA_H

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef weft_cache_stats weft_cuda_cache_stats;

/* GPUs visible to this process; 0 without the backend or a driver. */
static inline int weft_cuda_device_count(void) { return weft_device_count(WEFT_CUDA); }
/* Picks device local_rank % count (ranks of a node spread over its GPUs and
 * extra ranks share), creates the compute and communication streams and the
 * cuBLAS handle. Idempotent for the same device; *device may be NULL.
 * WEFT_ERR_NO_DEVICE without a GPU, WEFT_ERR_UNSUPPORTED without the backend. */
static inline weft_status weft_cuda_init(int local_rank, int *device) {
  return weft_device_init(WEFT_CUDA, local_rank, device);
}
/* Releases streams, handles and every cached block (live blocks must have
 * been freed). No-op before weft_cuda_init. */
static inline void weft_cuda_shutdown(void) { weft_device_shutdown(WEFT_CUDA); }
/* The device chosen by weft_cuda_init, -1 before. */
static inline int weft_cuda_current_device(void) { return weft_device_current(WEFT_CUDA); }
/* Waits for every stream (WEFT_STREAM_COUNT); reports a fault inside a kernel as WEFT_ERR_CUDA. */
static inline weft_status weft_cuda_synchronize(void) { return weft_device_synchronize(WEFT_CUDA); }
/* F32 (default), TF32 or BF16 products for every fp32 GEMM on the device
 * (sgemm and what is built on it: linear, attention). */
static inline weft_status weft_cuda_set_matmul_precision(weft_matmul_precision p) {
  return weft_device_set_matmul_precision(WEFT_CUDA, p);
}
static inline weft_matmul_precision weft_cuda_matmul_precision(void) {
  return weft_device_matmul_precision(WEFT_CUDA);
}
/* The caching allocator's counters (all zero before init or without the
 * backend). */
static inline weft_cuda_cache_stats weft_cuda_cache_get(void) {
  weft_cache_stats s = {0, 0, 0, 0};
  (void)weft_device_cache_stats(WEFT_CUDA, &s);
  return s;
}
/* Returns every cached (free) block to the driver. */
static inline weft_status weft_cuda_empty_cache(void) { return weft_device_empty_cache(WEFT_CUDA); }

#ifdef __cplusplus
}
#endif
#endif /* WEFT_CUDA_H */
