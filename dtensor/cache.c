/* dtensor/cache.c — an opt-in cache of host buffers for DTensor local
 * tensors and redistribute scratch (weft_dtensor_set_buffer_cache).
 *
 * Why: a fresh 64 MiB result costs 16384 first-touch page faults, more than
 * the all-gather that fills it; PyTorch avoids this with its caching
 * allocator. Off by default, because cached blocks stay allocated (and
 * counted by weft_mem_get) after the DTensors that used them are gone.
 * Blocks come from weft_alloc, so a cached block handed out inside a tensor
 * is freed normally by weft_tensor_destroy if it never comes back. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "dtensor_internal.h"

#define CACHE_SLOTS 16
#define CACHE_MIN_BYTES ((size_t)64 << 10) /* smaller blocks are cheap: not cached */

typedef struct slot {
  void *p;
  size_t cap;
  uint64_t age;
} slot;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static slot slots[CACHE_SLOTS];
static size_t limit, held;
static uint64_t clock_;

static void evict_locked(size_t need) {
  /* oldest first until `need` more bytes fit */
  while (held + need > limit) {
    int o = -1;
    for (int i = 0; i < CACHE_SLOTS; i++)
      if (slots[i].p && (o < 0 || slots[i].age < slots[o].age)) o = i;
    if (o < 0) break;
    weft_free(slots[o].p);
    held -= slots[o].cap;
    slots[o].p = NULL;
  }
}

void weft_dtensor_set_buffer_cache(size_t max_bytes) {
  pthread_mutex_lock(&mu);
  limit = max_bytes;
  evict_locked(0);
  pthread_mutex_unlock(&mu);
}

weft_status dt_buf_get(weft_device dev, size_t bytes, void **out) {
  if (dev != WEFT_CPU) return weft_alloc(dev, bytes ? bytes : 1, out);
  if (bytes >= CACHE_MIN_BYTES) {
    pthread_mutex_lock(&mu);
    int best = -1;
    for (int i = 0; i < CACHE_SLOTS; i++)
      if (slots[i].p && slots[i].cap >= bytes && slots[i].cap <= 2 * bytes &&
          (best < 0 || slots[i].cap < slots[best].cap))
        best = i;
    if (best >= 0) {
      *out = slots[best].p;
      held -= slots[best].cap;
      slots[best].p = NULL;
      pthread_mutex_unlock(&mu);
      return WEFT_OK;
    }
    pthread_mutex_unlock(&mu);
  }
  return weft_alloc(WEFT_CPU, bytes ? bytes : 1, out);
}

void dt_buf_put(void *p, size_t cap) {
  if (!p) return;
  if (cap >= CACHE_MIN_BYTES && weft_ptr_device(p) == WEFT_CPU) {
    pthread_mutex_lock(&mu);
    if (cap <= limit) {
      evict_locked(cap);
      for (int i = 0; i < CACHE_SLOTS; i++)
        if (!slots[i].p) {
          slots[i] = (slot){p, cap, ++clock_};
          held += cap;
          p = NULL;
          break;
        }
    }
    pthread_mutex_unlock(&mu);
  }
  if (p) weft_free(p);
}

weft_status dt_tensor_new(weft_device dev, weft_dtype dt, int ndim, const int64_t *shape,
                          weft_tensor **out) {
  if (dev != WEFT_CPU) return weft_tensor_create(dt, dev, ndim, shape, out);
  bool on;
  pthread_mutex_lock(&mu);
  on = limit > 0;
  pthread_mutex_unlock(&mu);
  if (!on) return weft_tensor_create(dt, WEFT_CPU, ndim, shape, out);
  int64_t numel = 1;
  for (int d = 0; d < ndim; d++) numel *= shape[d];
  size_t bytes = (size_t)numel * weft_dtype_size(dt);
  if (bytes < CACHE_MIN_BYTES) return weft_tensor_create(dt, WEFT_CPU, ndim, shape, out);
  void *p;
  WEFT_CHECK(dt_buf_get(WEFT_CPU, bytes, &p));
  weft_status st = weft_tensor_wrap(p, dt, WEFT_CPU, ndim, shape, out);
  if (st != WEFT_OK) {
    weft_free(p);
    return weft_error_trace(st, __func__);
  }
  /* the tensor owns the weft_alloc block (kernels.h: base_ is the tensor's
   * own allocation), so weft_tensor_destroy frees it like any other */
  (*out)->base_ = p;
  return WEFT_OK;
}

void dt_tensor_release(weft_tensor *t) {
  if (!t) return;
  if (t->base_ && t->base_ == t->data && t->device == WEFT_CPU && weft_tensor_is_contiguous(t)) {
    size_t bytes = weft_tensor_nbytes(t);
    bool on;
    pthread_mutex_lock(&mu);
    on = limit > 0;
    pthread_mutex_unlock(&mu);
    if (on && bytes >= CACHE_MIN_BYTES) {
      void *p = t->base_;
      t->base_ = NULL;
      weft_tensor_destroy(t);
      dt_buf_put(p, bytes);
      return;
    }
  }
  weft_tensor_destroy(t);
}
