/* kernels/cuda/cuda_internal.h — private to the CUDA backend: what the .cu
 * sources share. Its caching allocator is kernels/cache_alloc.h's, over
 * cudaMalloc and events (runtime.cu). */
#ifndef WEFT_CUDA_INTERNAL_H
#define WEFT_CUDA_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cache_alloc.h"
#include "cuda.h"
#include "kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the runtime (runtime.cu): the members of the WEFT_CUDA table that
 * are not kernels (backend.cu puts them in the table), and what the .cu
 * sources share. Names end in '_': none of this is public API (cuda.h's
 * weft_cuda_init & co. are inline calls of backend.h's generic functions). */

int weft_cuda_device_count_(void);
weft_status weft_cuda_init_(int local_rank, int *ordinal);
void weft_cuda_shutdown_(void);
int weft_cuda_current_device_(void);
weft_status weft_cuda_synchronize_(void);
/* The allocator members: blocks of the caching allocator, not counted
 * (weft_alloc counts); free returns the bytes that were requested. */
weft_status weft_cuda_alloc_(size_t bytes, void **out);
size_t weft_cuda_free_(void *ptr);
bool weft_cuda_owns_(const void *ptr);     /* the start of a live block */
bool weft_cuda_contains_(const void *ptr); /* any byte of device memory */
/* Copies and memset, ordered on the compute stream (memcpy_ waits for it). */
weft_status weft_cuda_memset_(void *dst, int value, size_t bytes);
weft_status weft_cuda_memcpy_(void *dst, const void *src, size_t bytes, weft_copy_kind kind);
weft_status weft_cuda_host_alloc_pinned_(size_t bytes, void **out);
weft_status weft_cuda_device_model_(char *buf, size_t cap);
void weft_cuda_host_free_pinned_(void *ptr);
weft_status weft_cuda_memcpy_async_(void *dst, const void *src, size_t bytes, weft_copy_kind kind,
                                    weft_stream_id s);
weft_status weft_cuda_event_record_(weft_stream_id s, weft_event **ev);
weft_status weft_cuda_stream_wait_event_(weft_stream_id s, weft_event *ev);
weft_status weft_cuda_event_synchronize_(weft_event *ev);
weft_status weft_cuda_event_query_(weft_event *ev, bool *done);
weft_status weft_cuda_event_elapsed_ms_(weft_event *start, weft_event *end, float *ms);
void weft_cuda_event_destroy_(weft_event *ev);
weft_status weft_cuda_record_stream_(void *ptr, weft_stream_id s);
/* The cudaStream_t of s as void *, NULL before init. */
void *weft_cuda_stream_handle_(weft_stream_id s);
weft_status weft_cuda_get_cache_stats_(weft_cache_stats *out);
weft_status weft_cuda_empty_cache_(void);

/* WEFT_ERR_NO_DEVICE naming the operation (weft_op_name_(func)) unless
 * weft_device_init(WEFT_CUDA, ...) has run. */
weft_status weft_cuda_require_init_(const char *func);
/* WEFT_OK for cudaSuccess (err is a cudaError_t), else WEFT_ERR_CUDA with
 * "what: <CUDA's message>". */
weft_status weft_cuda_check_(int err, const char *what);
/* Same for a cublasStatus_t. */
weft_status weft_cuda_check_cublas_(int status, const char *what);
/* The cuBLAS handle (cublasHandle_t), bound to the compute stream. */
void *weft_cuda_cublas_handle_(void);
/* A device scratch buffer of at least `bytes`, grow-only, reused by every
 * caller on the compute stream (at most one user at a time: callers use it
 * within one kernel sequence on that stream, and call nothing that uses
 * it in between). */
weft_status weft_cuda_scratch_(size_t bytes, void **out);

#ifdef __cplusplus
}
#endif
#endif /* WEFT_CUDA_INTERNAL_H */
