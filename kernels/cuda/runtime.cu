/* The CUDA backend's runtime: device choice, the two streams, the cuBLAS
 * handle, the caching allocator over cudaMalloc with events as stream
 * markers, copies, events and the shared scratch buffer — the members of
 * the WEFT_CUDA table that are not kernels (backend.cu assembles it). Host
 * code only (no kernels here), compiled by nvcc for the real backend and by
 * g++ for the emulator (cuda_compat.h). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arg_checks.h"
#include "backend_internal.h"
#include "cuda_compat.h"
#include "cuda_internal.h"

namespace {

static_assert(WEFT_CACHE_STREAMS == WEFT_STREAM_COUNT, "one cache stream per weft stream");

struct runtime_state {
  bool initialized = false;
  int device = -1;
  cudaStream_t stream[WEFT_CACHE_STREAMS] = {};
  cublasHandle_t cublas = nullptr;
  weft_cache_ *cache = nullptr;
  void *scratch = nullptr;
  size_t scratch_bytes = 0;
};

runtime_state rt;
pthread_mutex_t rt_mu = PTHREAD_MUTEX_INITIALIZER;

/* ---- the caching allocator's backend: cudaMalloc, events as markers ---- */

void *raw_alloc(size_t bytes, void *) {
  void *p = nullptr;
  weft_device_count_(WEFT_DEV_MALLOCS_, 1);
  if (cudaMalloc(&p, bytes) != cudaSuccess) {
    (void)cudaGetLastError(); /* an OOM is reported by the cache, not left sticky */
    return nullptr;
  }
  return p;
}

/* cudaFree waits for the device (an implicit synchronization) */
void raw_free(void *p, size_t, void *) {
  weft_device_count_(WEFT_DEV_HOST_SYNCS_, 1);
  (void)cudaFree(p);
}

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

bool valid_stream(weft_stream_id s) { return (unsigned)s < WEFT_CACHE_STREAMS; }

/* The event operations may run on any thread (mesh's watchdog polls the
 * events of NCCL calls on its own). A thread that has not used CUDA starts
 * on device 0, and its first runtime call would make a context there (on
 * every rank's device 0): so the first event operation on a thread makes
 * this process's device current there, once. */
thread_local int thread_device = -1;
cudaError_t bind_thread_quiet() {
  const int want = rt.device;
  if (want < 0 || thread_device == want) return cudaSuccess;
  cudaError_t err = cudaSetDevice(want);
  if (err == cudaSuccess) thread_device = want;
  return err;
}
weft_status bind_thread() { return weft_cuda_check_(bind_thread_quiet(), "cudaSetDevice"); }

cudaMemcpyKind copy_kind(weft_copy_kind k) {
  switch (k) {
    case WEFT_COPY_H2D:
      return cudaMemcpyHostToDevice;
    case WEFT_COPY_D2H:
      return cudaMemcpyDeviceToHost;
    default:
      return cudaMemcpyDeviceToDevice;
  }
}

void release_all_locked() {
  weft_device_count_(WEFT_DEV_HOST_SYNCS_, 1); /* one wait for every stream */
  for (int s = 0; s < WEFT_CACHE_STREAMS; s++)
    if (rt.stream[s]) (void)cudaStreamSynchronize(rt.stream[s]);
  if (rt.scratch && rt.cache) weft_cache_free_(rt.cache, rt.scratch);
  rt.scratch = nullptr;
  rt.scratch_bytes = 0;
  weft_cache_delete_(rt.cache);
  rt.cache = nullptr;
  if (rt.cublas) (void)cublasDestroy(rt.cublas);
  rt.cublas = nullptr;
  for (int s = 0; s < WEFT_CACHE_STREAMS; s++) {
    if (rt.stream[s]) (void)cudaStreamDestroy(rt.stream[s]);
    rt.stream[s] = nullptr;
  }
  rt.initialized = false;
  rt.device = -1;
}

}  // namespace

/* A recorded point of a stream (backend.h's opaque weft_event). */
struct weft_event {
  cudaEvent_t ev;
};

extern "C" {

/* ------------------------------------------------------------- errors */

weft_status weft_cuda_check_(int err, const char *what) {
  if (err == (int)cudaSuccess) return WEFT_OK;
  return weft_error_at(WEFT_ERR_CUDA, what, "%s", cudaGetErrorString((cudaError_t)err));
}

weft_status weft_cuda_check_cublas_(int status, const char *what) {
  if (status == (int)CUBLAS_STATUS_SUCCESS) return WEFT_OK;
  return weft_error_at(WEFT_ERR_CUDA, what, "cuBLAS %s",
                       cublasGetStatusString((cublasStatus_t)status));
}

weft_status weft_cuda_require_init_(const char *func) {
  if (rt.initialized) return WEFT_OK;
  return weft_error_at(WEFT_ERR_NO_DEVICE, weft_op_name_(func),
                       "call weft_device_init(WEFT_CUDA, ...) first (%d CUDA devices visible)",
                       weft_cuda_device_count_());
}

void *weft_cuda_cublas_handle_(void) { return (void *)rt.cublas; }

/* ------------------------------------------------------------- devices */

int weft_cuda_device_count_(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

weft_status weft_cuda_init_(int local_rank, int *ordinal) {
  if (local_rank < 0)
    return weft_error_at(WEFT_ERR_INVALID, "device init", "local rank %d is negative", local_rank);
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess || n == 0) {
    const char *why = err != cudaSuccess ? cudaGetErrorString(err) : "0 devices";
    (void)cudaGetLastError();
    return weft_error_at(WEFT_ERR_NO_DEVICE, "device init", "no CUDA device visible (%s)", why);
  }
  int want = local_rank % n;
  pthread_mutex_lock(&rt_mu);
  if (rt.initialized) {
    int have = rt.device;
    pthread_mutex_unlock(&rt_mu);
    if (have != want)
      return weft_error_at(WEFT_ERR_STATE, "device init",
                           "already using CUDA device %d, asked for device %d", have, want);
    if (ordinal) *ordinal = have;
    return WEFT_OK;
  }
  weft_status st = weft_cuda_check_(cudaSetDevice(want), "cudaSetDevice");
  for (int s = 0; st == WEFT_OK && s < WEFT_CACHE_STREAMS; s++)
    st = weft_cuda_check_(cudaStreamCreateWithFlags(&rt.stream[s], cudaStreamNonBlocking),
                          "cudaStreamCreateWithFlags");
  if (st == WEFT_OK) st = weft_cuda_check_cublas_(cublasCreate(&rt.cublas), "cublasCreate");
  if (st == WEFT_OK)
    st = weft_cuda_check_cublas_(cublasSetStream(rt.cublas, rt.stream[WEFT_STREAM_COMPUTE]),
                                 "cublasSetStream");
  if (st == WEFT_OK) {
    weft_cache_backend_ be = {raw_alloc,    raw_free, mark,    mark_done,
                              mark_release, nullptr,  "device"};
    st = weft_cache_new_(&be, &rt.cache);
  }
  if (st != WEFT_OK) {
    release_all_locked();
    pthread_mutex_unlock(&rt_mu);
    return st;
  }
  rt.device = want;
  rt.initialized = true;
  thread_device = want; /* made current above */
  pthread_mutex_unlock(&rt_mu);
  if (ordinal) *ordinal = want;
  return WEFT_OK;
}

void weft_cuda_shutdown_(void) {
  pthread_mutex_lock(&rt_mu);
  if (rt.initialized) release_all_locked();
  pthread_mutex_unlock(&rt_mu);
}

int weft_cuda_current_device_(void) { return rt.initialized ? rt.device : -1; }

weft_status weft_cuda_synchronize_(void) {
  WEFT_CHECK(weft_cuda_require_init_("synchronize"));
  weft_device_count_(WEFT_DEV_HOST_SYNCS_, 1); /* one wait for every stream */
  for (int s = 0; s < WEFT_CACHE_STREAMS; s++)
    WEFT_CHECK(
        weft_cuda_check_(cudaStreamSynchronize(rt.stream[s]), weft_stream_name((weft_stream_id)s)));
  return weft_cuda_check_(cudaGetLastError(), "a kernel launch");
}

bool weft_cuda_contains_(const void *ptr) {
  if (!ptr) return false;
  if (rt.cache && weft_cache_owns_(rt.cache, ptr)) return true;
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
  WEFT_CHECK(weft_cuda_require_init_("weft_alloc"));
  return weft_cache_alloc_(rt.cache, bytes, WEFT_STREAM_COMPUTE, out);
}

bool weft_cuda_owns_(const void *ptr) {
  void *start = nullptr;
  return rt.cache && weft_cache_lookup_(rt.cache, ptr, &start, nullptr) && start == ptr;
}

size_t weft_cuda_free_(void *ptr) { return rt.cache ? weft_cache_free_(rt.cache, ptr) : 0; }

weft_status weft_cuda_get_cache_stats_(weft_cache_stats *out) {
  weft_cache_stats s = {0, 0, 0, 0};
  if (rt.cache) s = weft_cache_stats_(rt.cache);
  *out = s;
  return WEFT_OK;
}

weft_status weft_cuda_empty_cache_(void) {
  WEFT_CHECK(weft_cuda_require_init_("empty_cache"));
  weft_cache_trim_(rt.cache);
  return WEFT_OK;
}

weft_status weft_cuda_record_stream_(void *ptr, weft_stream_id s) {
  WEFT_CHECK(weft_cuda_require_init_("record_stream"));
  if (!valid_stream(s))
    return weft_error_at(WEFT_ERR_INVALID, "record_stream", "unknown stream %d", (int)s);
  /* a view into a block marks the block */
  void *start = nullptr;
  if (!ptr || !weft_cache_lookup_(rt.cache, ptr, &start, nullptr))
    return weft_error_at(WEFT_ERR_INVALID, "record_stream", "%p is not in a live device block",
                         ptr);
  return weft_cache_record_stream_(rt.cache, start, (int)s);
}

weft_status weft_cuda_scratch_(size_t bytes, void **out) {
  *out = nullptr;
  WEFT_CHECK(weft_cuda_require_init_("device scratch"));
  if (bytes > rt.scratch_bytes || !rt.scratch) {
    /* stream-ordered: kernels already queued on the compute stream finish
     * with the old buffer before the cache hands it to anyone on that stream */
    if (rt.scratch) weft_cache_free_(rt.cache, rt.scratch);
    rt.scratch = nullptr;
    rt.scratch_bytes = 0;
    void *p;
    WEFT_CHECK(weft_cache_alloc_(rt.cache, bytes, WEFT_STREAM_COMPUTE, &p));
    rt.scratch = p;
    rt.scratch_bytes = bytes;
  }
  *out = rt.scratch;
  return WEFT_OK;
}

/* -------------------------------------------------------------- streams */

weft_status weft_cuda_event_record_(weft_stream_id s, weft_event **ev) {
  *ev = nullptr;
  WEFT_CHECK(weft_cuda_require_init_("event_record"));
  if (!valid_stream(s))
    return weft_error_at(WEFT_ERR_INVALID, "event_record", "unknown stream %d", (int)s);
  WEFT_CHECK(bind_thread());
  weft_event *e = (weft_event *)calloc(1, sizeof *e);
  if (!e) return weft_error_at(WEFT_ERR_OOM, "event_record", "out of host memory");
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

weft_status weft_cuda_stream_wait_event_(weft_stream_id s, weft_event *ev) {
  WEFT_CHECK(weft_cuda_require_init_("stream_wait_event"));
  if (!valid_stream(s) || !ev)
    return weft_error_at(WEFT_ERR_INVALID, "stream_wait_event", "bad stream %d or NULL event",
                         (int)s);
  WEFT_CHECK(bind_thread());
  return weft_cuda_check_(cudaStreamWaitEvent(rt.stream[s], ev->ev, 0), "cudaStreamWaitEvent");
}

weft_status weft_cuda_event_synchronize_(weft_event *ev) {
  if (!ev) return weft_error_at(WEFT_ERR_INVALID, "event_synchronize", "NULL event");
  WEFT_CHECK(bind_thread());
  weft_device_count_(WEFT_DEV_HOST_SYNCS_, 1);
  return weft_cuda_check_(cudaEventSynchronize(ev->ev), "cudaEventSynchronize");
}

weft_status weft_cuda_event_query_(weft_event *ev, bool *done) {
  if (!ev || !done) return weft_error_at(WEFT_ERR_INVALID, "event_query", "NULL argument");
  WEFT_CHECK(bind_thread());
  cudaError_t err = cudaEventQuery(ev->ev);
  if (err == cudaErrorNotReady) {
    /* not an error: must not stay as the last error (nor clear another) */
    if (cudaPeekAtLastError() == cudaErrorNotReady) (void)cudaGetLastError();
    *done = false;
    return WEFT_OK;
  }
  *done = err == cudaSuccess;
  return weft_cuda_check_(err, "cudaEventQuery");
}

weft_status weft_cuda_event_elapsed_ms_(weft_event *start, weft_event *end, float *ms) {
  if (!start || !end || !ms)
    return weft_error_at(WEFT_ERR_INVALID, "event_elapsed_ms", "NULL argument");
  WEFT_CHECK(bind_thread());
  return weft_cuda_check_(cudaEventElapsedTime(ms, start->ev, end->ev), "cudaEventElapsedTime");
}

void weft_cuda_event_destroy_(weft_event *ev) {
  if (!ev) return;
  /* no status to report: a failed bind must not replace the caller's error
   * (destroy often runs on a failure's way out) */
  if (bind_thread_quiet() != cudaSuccess) (void)cudaGetLastError();
  (void)cudaEventDestroy(ev->ev);
  free(ev);
}

void *weft_cuda_stream_handle_(weft_stream_id s) {
  if (!rt.initialized || !valid_stream(s)) return nullptr;
  return (void *)rt.stream[s];
}

/* --------------------------------------------------------------- copies */

weft_status weft_cuda_memcpy_async_(void *dst, const void *src, size_t bytes, weft_copy_kind kind,
                                    weft_stream_id s) {
  /* the CPU backend's checks, in its order */
  WEFT_CHECK(weft_cuda_require_init_("memcpy"));
  if ((unsigned)kind > WEFT_COPY_D2D)
    return weft_error_at(WEFT_ERR_INVALID, "memcpy", "unknown copy kind %d", (int)kind);
  if (!valid_stream(s))
    return weft_error_at(WEFT_ERR_INVALID, "memcpy", "unknown stream %d", (int)s);
  if (bytes == 0) return WEFT_OK;
  if (!dst || !src) return weft_error_at(WEFT_ERR_INVALID, "memcpy", "NULL pointer");
  const char *d = (const char *)dst, *sp = (const char *)src;
  if (kind == WEFT_COPY_D2D && d < sp + bytes && sp < d + bytes)
    return weft_error_at(WEFT_ERR_INVALID, "memcpy", "the %zu bytes at %p and %p overlap", bytes,
                         dst, src);
  if (kind != WEFT_COPY_D2D)
    weft_device_count_(kind == WEFT_COPY_H2D ? WEFT_DEV_BYTES_H2D_ : WEFT_DEV_BYTES_D2H_,
                       (int64_t)bytes);
  static const char *const names[] = {"memcpy h2d", "memcpy d2h", "memcpy d2d"};
  weft_device_cost_copy_(names[kind == WEFT_COPY_H2D   ? 0
                               : kind == WEFT_COPY_D2H ? 1
                                                       : 2],
                         kind == WEFT_COPY_D2D ? 2.0 * (double)bytes : (double)bytes,
                         kind != WEFT_COPY_D2D);
  return weft_cuda_check_(cudaMemcpyAsync(dst, src, bytes, copy_kind(kind), rt.stream[s]),
                          "cudaMemcpyAsync");
}

weft_status weft_cuda_host_alloc_pinned_(size_t bytes, void **out) {
  WEFT_CHECK(weft_cuda_require_init_("alloc_pinned"));
  *out = NULL;
  weft_device_count_(WEFT_DEV_MALLOCS_, 1);
  WEFT_CHECK(weft_cuda_check_(cudaMallocHost(out, bytes ? bytes : 1), "cudaMallocHost"));
  return WEFT_OK;
}

/* cudaFreeHost waits for the device (an implicit synchronization) */
void weft_cuda_host_free_pinned_(void *ptr) {
  weft_device_count_(WEFT_DEV_HOST_SYNCS_, 1);
  cudaFreeHost(ptr);
}

weft_status weft_cuda_device_model_(char *buf, size_t cap) {
  WEFT_CHECK(weft_cuda_require_init_("device_model"));
#ifdef WEFT_CUDA_EMU
  snprintf(buf, cap, "weft CUDA emulator");
#else
  cudaDeviceProp p;
  WEFT_CHECK(weft_cuda_check_(cudaGetDeviceProperties(&p, rt.device), "cudaGetDeviceProperties"));
  snprintf(buf, cap, "%s", p.name);
#endif
  return WEFT_OK;
}

weft_status weft_cuda_memcpy_(void *dst, const void *src, size_t bytes, weft_copy_kind kind) {
  WEFT_CHECK(weft_cuda_memcpy_async_(dst, src, bytes, kind, WEFT_STREAM_COMPUTE));
  if (bytes == 0) return WEFT_OK;
  weft_device_count_(WEFT_DEV_HOST_SYNCS_, 1); /* the copy and its wait: one */
  return weft_cuda_check_(cudaStreamSynchronize(rt.stream[WEFT_STREAM_COMPUTE]),
                          "memcpy (waiting for the compute stream)");
}

weft_status weft_cuda_memset_(void *dst, int value, size_t bytes) {
  WEFT_CHECK(weft_cuda_require_init_("memset"));
  if (bytes == 0) return WEFT_OK;
  if (!dst) return weft_error_at(WEFT_ERR_INVALID, "memset", "dst is NULL");
  weft_device_cost_copy_("cudaMemsetAsync", (double)bytes, false);
  return weft_cuda_check_(cudaMemsetAsync(dst, value, bytes, rt.stream[WEFT_STREAM_COMPUTE]),
                          "cudaMemsetAsync");
}

}  // extern "C"
