/* kernels/cuda/cuda_internal.h — private to the CUDA backend: the caching
 * allocator's host-side logic (cache_alloc.c, plain C, unit-tested without
 * a GPU) and what the .cu sources share.
 *
 * The caching allocator keeps freed device blocks in per-size-class free
 * lists instead of returning them to cudaFree (which synchronizes the
 * device). Size classes: requests round up to a multiple of 512 bytes below
 * 1 MiB, and above that to one of 4 steps per power of two (1, 1.25, 1.5,
 * 1.75 x 2^k), so a class wastes at most 25% and a block serves any request
 * of its class. Reuse is stream-ordered: a freed block carries the stream it
 * was used on and is handed again at once only to a request on that stream
 * (the stream runs in order, so the old kernels finish first); a block also
 * used on another stream (weft_cuda_cache_record_stream_) gets a marker
 * (an event, through the backend) on that stream when it is freed, and is
 * reusable by anyone only once the marker has completed. When the raw
 * allocator fails, the cache returns its free blocks and tries once more.
 */
#ifndef WEFT_CUDA_INTERNAL_H
#define WEFT_CUDA_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cuda.h"
#include "kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

#define WEFT_CUDA_CACHE_STREAMS \
  4 /* WEFT_STREAM_COUNT: compute, comm, fsdp_all_gather, fsdp_reduce_scatter */

/* How the cache gets raw memory and stream markers (cudaMalloc / events on
 * the device; plain malloc and flags in the unit tests). */
typedef struct weft_cuda_cache_backend_ {
  void *(*raw_alloc)(size_t bytes, void *ctx); /* NULL on failure */
  void (*raw_free)(void *ptr, size_t bytes, void *ctx);
  void *(*mark)(int stream, void *ctx);       /* record a marker on stream */
  bool (*mark_done)(void *marker, void *ctx); /* has the stream passed it? */
  void (*mark_release)(void *marker, void *ctx);
  void *ctx;
} weft_cuda_cache_backend_;

typedef struct weft_cuda_cache_ weft_cuda_cache_;

/* The size class of a request (bytes 0 -> 512). */
size_t weft_cuda_cache_round_(size_t bytes);
weft_status weft_cuda_cache_new_(const weft_cuda_cache_backend_ *be, weft_cuda_cache_ **out);
/* Returns every block (cached or live) to the backend. */
void weft_cuda_cache_delete_(weft_cuda_cache_ *c);
/* A block of at least `bytes` for use on `stream` (0..WEFT_CUDA_CACHE_STREAMS-1). */
weft_status weft_cuda_cache_alloc_(weft_cuda_cache_ *c, size_t bytes, int stream, void **out);
/* Marks a live block as used on another stream too (torch's record_stream). */
weft_status weft_cuda_cache_record_stream_(weft_cuda_cache_ *c, void *ptr, int stream);
/* Puts a live block back in the cache; returns the size that was requested
 * for it (0 if ptr is not a live block of this cache). */
size_t weft_cuda_cache_free_(weft_cuda_cache_ *c, void *ptr);
/* true when ptr lies inside a live block (any byte of it). */
bool weft_cuda_cache_owns_(const weft_cuda_cache_ *c, const void *ptr);
/* Start of the live block holding ptr and its requested size; false if none. */
bool weft_cuda_cache_lookup_(const weft_cuda_cache_ *c, const void *ptr, void **start,
                             size_t *bytes);
weft_cuda_cache_stats weft_cuda_cache_stats_(const weft_cuda_cache_ *c);
/* Returns free blocks whose markers completed to the backend. */
void weft_cuda_cache_trim_(weft_cuda_cache_ *c);

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
