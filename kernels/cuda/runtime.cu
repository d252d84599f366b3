/* The CUDA backend's runtime: device choice, the two streams, the cuBLAS
 * handle, the caching allocator over cudaMalloc with events as stream
 * markers, copies, events, the shared scratch buffer and the allocation
 * hooks of kernels_internal.h. Host code only (no kernels here), compiled by
 * nvcc for the real backend and by g++ for the emulator (cuda_compat.h). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_compat.h"
#include "cuda_internal.h"
#include "kernels_internal.h"

namespace {

struct runtime_state {
  bool initialized = false;
  int device = -1;
  cudaStream_t stream[WEFT_CUDA_CACHE_STREAMS] = {};
  cublasHandle_t cublas = nullptr;
  weft_cuda_cache_ *cache = nullptr;
  void *scratch = nullptr;
  size_t scratch_bytes = 0;
};

runtime_state rt;
pthread_mutex_t rt_mu = PTHREAD_MUTEX_INITIALIZER;

/* ---- the caching allocator's backend: cudaMalloc, events as markers ---- */

void *raw_alloc(size_t bytes, void *) {
  void *p = nullptr;
  if (cudaMalloc(&p, bytes) != cudaSuccess) {
    (void)cudaGetLastError(); /* an OOM is reported by the cache, not left sticky */
    return nullptr;
  }
  return p;
}

void raw_free(void *p, size_t, void *) { (void)cudaFree(p); }

void *mark(int stream, void *) {
  cudaEvent_t ev;
  if (cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) != cudaSuccess) return nullptr;
  if (cudaEventRecord(ev, rt.stream[stream]) != cudaSuccess) {
    (void)cudaEventDestroy(ev);
    return nullptr;
  }
  return (void *)ev;
}

bool mark_done(void *m, void *) { return cudaEventQuery((cudaEvent_t)m) != cudaErrorNotReady; }

void mark_release(void *m, void *) { (void)cudaEventDestroy((cudaEvent_t)m); }

cudaMemcpyKind copy_kind(weft_copy_kind k) {
  switch (k) {
    case WEFT_COPY_H2D: return cudaMemcpyHostToDevice;
    case WEFT_COPY_D2H: return cudaMemcpyDeviceToHost;
    default: return cudaMemcpyDeviceToDevice;
  }
}

void release_all_locked() {
  if (rt.stream[0]) (void)cudaStreamSynchronize(rt.stream[0]);
  if (rt.stream[1]) (void)cudaStreamSynchronize(rt.stream[1]);
  if (rt.scratch && rt.cache) weft_cuda_cache_free_(rt.cache, rt.scratch);
  rt.scratch = nullptr;
  rt.scratch_bytes = 0;
  weft_cuda_cache_delete_(rt.cache);
  rt.cache = nullptr;
  if (rt.cublas) (void)cublasDestroy(rt.cublas);
  rt.cublas = nullptr;
  for (int s = 0; s < WEFT_CUDA_CACHE_STREAMS; s++) {
    if (rt.stream[s]) (void)cudaStreamDestroy(rt.stream[s]);
    rt.stream[s] = nullptr;
  }
  rt.initialized = false;
  rt.device = -1;
}

}  // namespace

struct weft_cuda_event {
  cudaEvent_t ev;
};

extern "C" {

/* ------------------------------------------------------------- errors */

weft_status weft_cuda_check_(int err, const char *what) {
  if (err == (int)cudaSuccess) return WEFT_OK;
  return weft_error(WEFT_ERR_CUDA, "%s: %s", what, cudaGetErrorString((cudaError_t)err));
}

weft_status weft_cuda_check_cublas_(int status, const char *what) {
  if (status == (int)CUBLAS_STATUS_SUCCESS) return WEFT_OK;
  return weft_error(WEFT_ERR_CUDA, "%s: cuBLAS %s", what,
                    cublasGetStatusString((cublasStatus_t)status));
}

weft_status weft_cuda_require_init_(const char *func) {
  if (rt.initialized) return WEFT_OK;
  return weft_error(WEFT_ERR_NO_DEVICE, "%s: call weft_cuda_init first (%d CUDA devices visible)",
                    func, weft_cuda_device_count());
}

void *weft_cuda_cublas_handle_(void) { return (void *)rt.cublas; }

/* ------------------------------------------------------------- devices */

int weft_cuda_device_count(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

weft_status weft_cuda_init(int local_rank, int *device) {
  if (local_rank < 0)
    return weft_error(WEFT_ERR_INVALID, "weft_cuda_init: local rank %d is negative", local_rank);
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess || n == 0) {
    const char *why = err != cudaSuccess ? cudaGetErrorString(err) : "0 devices";
    (void)cudaGetLastError();
    return weft_error(WEFT_ERR_NO_DEVICE, "weft_cuda_init: no CUDA device visible (%s)", why);
  }
  int want = local_rank % n;
  pthread_mutex_lock(&rt_mu);
  if (rt.initialized) {
    int have = rt.device;
    pthread_mutex_unlock(&rt_mu);
    if (have != want)
      return weft_error(WEFT_ERR_STATE,
                        "weft_cuda_init: already using device %d, asked for device %d", have,
                        want);
    if (device) *device = have;
    return WEFT_OK;
  }
  weft_status st = weft_cuda_check_(cudaSetDevice(want), "cudaSetDevice");
  for (int s = 0; st == WEFT_OK && s < WEFT_CUDA_CACHE_STREAMS; s++)
    st = weft_cuda_check_(cudaStreamCreateWithFlags(&rt.stream[s], cudaStreamNonBlocking),
                          "cudaStreamCreateWithFlags");
  if (st == WEFT_OK) st = weft_cuda_check_cublas_(cublasCreate(&rt.cublas), "cublasCreate");
  if (st == WEFT_OK)
    st = weft_cuda_check_cublas_(cublasSetStream(rt.cublas, rt.stream[WEFT_STREAM_COMPUTE]),
                                 "cublasSetStream");
  if (st == WEFT_OK) {
    weft_cuda_cache_backend_ be = {raw_alloc, raw_free, mark, mark_done, mark_release, nullptr};
    st = weft_cuda_cache_new_(&be, &rt.cache);
  }
  if (st != WEFT_OK) {
    release_all_locked();
    pthread_mutex_unlock(&rt_mu);
    return st;
  }
  rt.device = want;
  rt.initialized = true;
  pthread_mutex_unlock(&rt_mu);
  if (device) *device = want;
  return WEFT_OK;
}

void weft_cuda_shutdown(void) {
  pthread_mutex_lock(&rt_mu);
  if (rt.initialized) release_all_locked();
  pthread_mutex_unlock(&rt_mu);
}

int weft_cuda_current_device(void) { return rt.initialized ? rt.device : -1; }

weft_status weft_cuda_synchronize(void) {
  WEFT_CHECK(weft_cuda_require_init_("weft_cuda_synchronize"));
  for (int s = 0; s < WEFT_CUDA_CACHE_STREAMS; s++)
    WEFT_CHECK(weft_cuda_check_(cudaStreamSynchronize(rt.stream[s]),
                                s == 0 ? "compute stream" : "communication stream"));
  return weft_cuda_check_(cudaGetLastError(), "a kernel launch");
}

bool weft_cuda_is_device_ptr(const void *ptr) {
  if (!ptr) return false;
  if (rt.cache && weft_cuda_cache_owns_(rt.cache, ptr)) return true;
  if (!rt.initialized) return false;
  cudaPointerAttributes attr;
  if (cudaPointerGetAttributes(&attr, ptr) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
}

/* -------------------------------------------------------------- memory */

weft_status weft_cuda_alloc_(size_t bytes, void **out) {
  *out = nullptr;
  WEFT_CHECK(weft_cuda_require_init_("weft_alloc(WEFT_CUDA)"));
  return weft_cuda_cache_alloc_(rt.cache, bytes, WEFT_STREAM_COMPUTE, out);
}

bool weft_cuda_owns_(const void *ptr) {
  void *start = nullptr;
  return rt.cache && weft_cuda_cache_lookup_(rt.cache, ptr, &start, nullptr) && start == ptr;
}

size_t weft_cuda_free_(void *ptr) { return rt.cache ? weft_cuda_cache_free_(rt.cache, ptr) : 0; }

weft_status weft_cuda_malloc(size_t bytes, void **out) {
  if (!out) return weft_error(WEFT_ERR_INVALID, "weft_cuda_malloc: out is NULL");
  WEFT_CHECK(weft_cuda_alloc_(bytes, out));
  weft_mem_account_alloc_(WEFT_CUDA, (int64_t)bytes);
  return WEFT_OK;
}

void weft_cuda_free(void *ptr) {
  if (!ptr) return;
  if (!weft_cuda_owns_(ptr)) {
    (void)weft_error(WEFT_ERR_INVALID, "weft_cuda_free: %p is not a live weft device block", ptr);
    return;
  }
  size_t bytes = weft_cuda_free_(ptr);
  weft_mem_account_free_(WEFT_CUDA, (int64_t)bytes);
}

weft_cuda_cache_stats weft_cuda_cache_get(void) {
  weft_cuda_cache_stats s = {};
  if (rt.cache) s = weft_cuda_cache_stats_(rt.cache);
  return s;
}

weft_status weft_cuda_empty_cache(void) {
  WEFT_CHECK(weft_cuda_require_init_("weft_cuda_empty_cache"));
  weft_cuda_cache_trim_(rt.cache);
  return WEFT_OK;
}

weft_status weft_cuda_scratch_(size_t bytes, void **out) {
  *out = nullptr;
  WEFT_CHECK(weft_cuda_require_init_("device scratch"));
  if (bytes > rt.scratch_bytes || !rt.scratch) {
    /* stream-ordered: kernels already queued on the compute stream finish
     * with the old buffer before the cache hands it to anyone on that stream */
    if (rt.scratch) weft_cuda_cache_free_(rt.cache, rt.scratch);
    rt.scratch = nullptr;
    rt.scratch_bytes = 0;
    void *p;
    WEFT_CHECK(weft_cuda_cache_alloc_(rt.cache, bytes, WEFT_STREAM_COMPUTE, &p));
    rt.scratch = p;
    rt.scratch_bytes = bytes;
  }
  *out = rt.scratch;
  return WEFT_OK;
}

/* -------------------------------------------------------------- streams */

weft_status weft_cuda_event_record(weft_cuda_stream_id s, weft_cuda_event **ev) {
  *ev = nullptr;
  WEFT_CHECK(weft_cuda_require_init_("weft_cuda_event_record"));
  if ((unsigned)s >= WEFT_CUDA_CACHE_STREAMS)
    return weft_error(WEFT_ERR_INVALID, "weft_cuda_event_record: unknown stream %d", (int)s);
  weft_cuda_event *e = (weft_cuda_event *)calloc(1, sizeof *e);
  if (!e) return weft_error(WEFT_ERR_OOM, "weft_cuda_event_record: out of host memory");
  weft_status st = weft_cuda_check_(cudaEventCreate(&e->ev), "cudaEventCreate");
  if (st == WEFT_OK) {
    st = weft_cuda_check_(cudaEventRecord(e->ev, rt.stream[s]), "cudaEventRecord");
    if (st != WEFT_OK) (void)cudaEventDestroy(e->ev);
  }
  if (st != WEFT_OK) {
    free(e);
    return st;
  }
  *ev = e;
  return WEFT_OK;
}

weft_status weft_cuda_stream_wait_event(weft_cuda_stream_id s, weft_cuda_event *ev) {
  WEFT_CHECK(weft_cuda_require_init_("weft_cuda_stream_wait_event"));
  if ((unsigned)s >= WEFT_CUDA_CACHE_STREAMS || !ev)
    return weft_error(WEFT_ERR_INVALID, "weft_cuda_stream_wait_event: bad stream or NULL event");
  return weft_cuda_check_(cudaStreamWaitEvent(rt.stream[s], ev->ev, 0), "cudaStreamWaitEvent");
}

weft_status weft_cuda_event_synchronize(weft_cuda_event *ev) {
  if (!ev) return weft_error(WEFT_ERR_INVALID, "weft_cuda_event_synchronize: NULL event");
  return weft_cuda_check_(cudaEventSynchronize(ev->ev), "cudaEventSynchronize");
}

weft_status weft_cuda_event_elapsed_ms(weft_cuda_event *start, weft_cuda_event *end, float *ms) {
  if (!start || !end || !ms)
    return weft_error(WEFT_ERR_INVALID, "weft_cuda_event_elapsed_ms: NULL argument");
  return weft_cuda_check_(cudaEventElapsedTime(ms, start->ev, end->ev), "cudaEventElapsedTime");
}

void weft_cuda_event_destroy(weft_cuda_event *ev) {
  if (!ev) return;
  (void)cudaEventDestroy(ev->ev);
  free(ev);
}

void *weft_cuda_stream_handle(weft_cuda_stream_id s) {
  if (!rt.initialized || (unsigned)s >= WEFT_CUDA_CACHE_STREAMS) return nullptr;
  return (void *)rt.stream[s];
}

/* --------------------------------------------------------------- copies */

weft_status weft_cuda_memcpy_async(void *dst, const void *src, size_t bytes, weft_copy_kind kind,
                                   weft_cuda_stream_id s) {
  WEFT_CHECK(weft_cuda_require_init_("weft_cuda_memcpy"));
  if ((unsigned)s >= WEFT_CUDA_CACHE_STREAMS || (unsigned)kind > WEFT_COPY_D2D)
    return weft_error(WEFT_ERR_INVALID, "weft_cuda_memcpy: bad stream %d or copy kind %d", (int)s,
                      (int)kind);
  if (bytes == 0) return WEFT_OK;
  if (!dst || !src) return weft_error(WEFT_ERR_INVALID, "weft_cuda_memcpy: NULL pointer");
  return weft_cuda_check_(cudaMemcpyAsync(dst, src, bytes, copy_kind(kind), rt.stream[s]),
                          "cudaMemcpyAsync");
}

weft_status weft_cuda_memcpy(void *dst, const void *src, size_t bytes, weft_copy_kind kind) {
  WEFT_CHECK(weft_cuda_memcpy_async(dst, src, bytes, kind, WEFT_STREAM_COMPUTE));
  return weft_cuda_check_(cudaStreamSynchronize(rt.stream[WEFT_STREAM_COMPUTE]),
                          "weft_cuda_memcpy (waiting for the compute stream)");
}

weft_status weft_cuda_memset_zero(void *dst, size_t bytes) {
  WEFT_CHECK(weft_cuda_require_init_("weft_cuda_memset_zero"));
  if (bytes == 0) return WEFT_OK;
  if (!dst) return weft_error(WEFT_ERR_INVALID, "weft_cuda_memset_zero: NULL pointer");
  return weft_cuda_check_(cudaMemsetAsync(dst, 0, bytes, rt.stream[WEFT_STREAM_COMPUTE]),
                          "cudaMemsetAsync");
}

weft_status weft_cuda_tensor_to(const weft_tensor *src, weft_device dev, weft_tensor **out) {
  *out = nullptr;
  if (!src) return weft_error(WEFT_ERR_INVALID, "weft_cuda_tensor_to: src is NULL");
  if ((unsigned)dev >= WEFT_DEVICE_COUNT)
    return weft_error(WEFT_ERR_INVALID, "weft_cuda_tensor_to: unknown device %d", (int)dev);
  if (src->device == WEFT_CPU && dev == WEFT_CPU) return weft_tensor_clone(src, out);
  WEFT_CHECK(weft_cuda_require_init_("weft_cuda_tensor_to"));
  if (src->device == WEFT_CUDA && !weft_tensor_is_contiguous(src))
    return weft_error(WEFT_ERR_UNSUPPORTED,
                      "weft_cuda_tensor_to: a strided device tensor must be made contiguous first");
  const weft_tensor *from = src;
  weft_tensor *packed = nullptr;
  if (src->device == WEFT_CPU && !weft_tensor_is_contiguous(src)) {
    WEFT_CHECK(weft_tensor_clone(src, &packed));
    from = packed;
  }
  weft_tensor *t = nullptr;
  weft_status st = weft_tensor_create(src->dtype, dev, src->ndim, src->shape, &t);
  if (st == WEFT_OK) {
    weft_copy_kind kind = src->device == WEFT_CPU  ? WEFT_COPY_H2D
                          : dev == WEFT_CPU        ? WEFT_COPY_D2H
                                                   : WEFT_COPY_D2D;
    st = weft_cuda_memcpy(t->data, from->data, weft_tensor_nbytes(from), kind);
  }
  weft_tensor_destroy(packed);
  if (st != WEFT_OK) {
    weft_tensor_destroy(t);
    return st;
  }
  *out = t;
  return WEFT_OK;
}

}  // extern "C"
