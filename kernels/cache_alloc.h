/* kernels/cache_alloc.h — private to weft_kernels: the caching allocator
 * (cache_alloc.c, plain C, unit-tested without a GPU in tests/cuda) that
 * serves the CUDA backend's device memory (over cudaMalloc and events,
 * cuda/runtime.cu) and the CPU backend's large host blocks (over
 * aligned_alloc, alloc.c). Not installed.
 *
 * It keeps freed blocks in per-size-class free lists instead of returning
 * them to the raw allocator (cudaFree synchronizes the device; malloc of a
 * large block maps fresh pages that fault in on first touch). Size classes:
 * requests round up to a multiple of 512 bytes below 1 MiB, and above that
 * to one of 4 steps per power of two (1, 1.25, 1.5, 1.75 x 2^k), so a class
 * wastes at most 25% and a block serves any request of its class. Reuse is
 * stream-ordered: a freed block carries the stream it was used on and is
 * handed again at once only to a request on that stream (the stream runs in
 * order, so the old kernels finish first); a block also used on another
 * stream (weft_cache_record_stream_) gets a marker (an event, through the
 * backend) on that stream when it is freed, and is reusable by anyone only
 * once the marker has completed. The host uses stream 0 only and no
 * markers. When the raw allocator fails, the cache returns its free blocks
 * and tries once more. Thread-safe (one mutex per cache).
 */
#ifndef WEFT_CACHE_ALLOC_H
#define WEFT_CACHE_ALLOC_H

#include <stdbool.h>
#include <stddef.h>

#include "backend.h" /* weft_cache_stats */
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define WEFT_CACHE_STREAMS \
  4 /* WEFT_STREAM_COUNT: compute, comm, fsdp_all_gather, fsdp_reduce_scatter */

/* How the cache gets raw memory and stream markers (cudaMalloc / events on
 * the device; plain malloc and flags in the unit tests). */
typedef struct weft_cache_backend_ {
  void *(*raw_alloc)(size_t bytes, void *ctx); /* NULL on failure */
  void (*raw_free)(void *ptr, size_t bytes, void *ctx);
  void *(*mark)(int stream, void *ctx);       /* record a marker on stream */
  bool (*mark_done)(void *marker, void *ctx); /* has the stream passed it? */
  void (*mark_release)(void *marker, void *ctx);
  void *ctx;
  const char *memory; /* "device" or "host": what an allocation error names */
} weft_cache_backend_;

typedef struct weft_cache_ weft_cache_;

/* The size class of a request (bytes 0 -> 512). */
size_t weft_cache_round_(size_t bytes);
weft_status weft_cache_new_(const weft_cache_backend_ *be, weft_cache_ **out);
/* Returns every block (cached or live) to the backend. */
void weft_cache_delete_(weft_cache_ *c);
/* A block of at least `bytes` for use on `stream` (0..WEFT_CACHE_STREAMS-1). */
weft_status weft_cache_alloc_(weft_cache_ *c, size_t bytes, int stream, void **out);
/* Marks a live block as used on another stream too (torch's record_stream). */
weft_status weft_cache_record_stream_(weft_cache_ *c, void *ptr, int stream);
/* Puts a live block back in the cache; returns the size that was requested
 * for it (0 if ptr is not a live block of this cache). */
size_t weft_cache_free_(weft_cache_ *c, void *ptr);
/* true when ptr lies inside a live block (any byte of it). */
bool weft_cache_owns_(const weft_cache_ *c, const void *ptr);
/* Start of the live block holding ptr and its requested size; false if none. */
bool weft_cache_lookup_(const weft_cache_ *c, const void *ptr, void **start, size_t *bytes);
weft_cache_stats weft_cache_stats_(const weft_cache_ *c);
/* Returns free blocks whose markers completed to the backend. */
void weft_cache_trim_(weft_cache_ *c);

#ifdef __cplusplus
}
#endif

#endif /* WEFT_CACHE_ALLOC_H */
