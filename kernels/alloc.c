/* Allocation with exact accounting, for every device: the block comes from
 * the device's table (backend.h; the CPU's is the header scheme below), the
 * bytes are counted here. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "backend_internal.h"
#include "cpu/cpu_internal.h"
#include "kernels.h"
#include "kernels_internal.h"

/* Under AddressSanitizer, poison the block header and the tail padding (the
 * data is rounded up to 64 bytes) so that an off-by-one in a kernel is
 * reported instead of landing in slack that malloc never sees. */
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define WEFT_POISON_(p, n) ASAN_POISON_MEMORY_REGION((p), (n))
#define WEFT_UNPOISON_(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#define WEFT_POISON_(p, n) ((void)(p), (void)(n))
#define WEFT_UNPOISON_(p, n) ((void)(p), (void)(n))
#endif

/* Every block carries a 64-byte header (keeps the data 64-byte aligned)
 * recording its size and device, so weft_free needs no size argument. */
typedef struct alloc_header {
  uint64_t magic;
  uint64_t bytes;
  int32_t device;
  char pad[64 - 20];
} alloc_header;
_Static_assert(sizeof(alloc_header) == 64, "header keeps 64-byte alignment");

#define ALLOC_MAGIC 0x7765667461626c6bULL /* "weftablk" */

static _Atomic int64_t cur_bytes[WEFT_DEVICE_COUNT];
static _Atomic int64_t peak_bytes[WEFT_DEVICE_COUNT];
static _Atomic int64_t n_alloc[WEFT_DEVICE_COUNT];
static _Atomic int64_t n_free[WEFT_DEVICE_COUNT];
static _Atomic int64_t n_large_host; /* weft_mem_stats.large_system_allocs */

const char *weft_device_name(weft_device dev) {
  switch (dev) {
    case WEFT_CPU:
      return "cpu";
    case WEFT_CUDA:
      return "cuda";
    default:
      return "?";
  }
}

void weft_mem_account_alloc_(weft_device dev, int64_t bytes) {
  int64_t now = atomic_fetch_add(&cur_bytes[dev], bytes) + bytes;
  int64_t peak = atomic_load(&peak_bytes[dev]);
  while (now > peak && !atomic_compare_exchange_weak(&peak_bytes[dev], &peak, now)) {
  }
  atomic_fetch_add(&n_alloc[dev], 1);
}

void weft_mem_account_free_(weft_device dev, int64_t bytes) {
  atomic_fetch_sub(&cur_bytes[dev], bytes);
  atomic_fetch_add(&n_free[dev], 1);
}

/* The CPU table's alloc member: a 64-byte header, then the data. */
weft_status weft_cpu_alloc_(size_t bytes, void **out) {
  *out = NULL;
  if (bytes > ((size_t)1 << 46))
    return weft_error_at(WEFT_ERR_OOM, "weft_alloc", "refusing a host allocation of %zu bytes",
                         bytes);
  const size_t padded = (bytes + 63) & ~(size_t)63;
  alloc_header *h = aligned_alloc(64, sizeof(alloc_header) + padded);
  if (!h)
    return weft_error_at(WEFT_ERR_OOM, "weft_alloc", "host allocation of %zu bytes failed", bytes);
  if (bytes >= WEFT_LARGE_ALLOC_BYTES)
    atomic_fetch_add_explicit(&n_large_host, 1, memory_order_relaxed);
  h->magic = ALLOC_MAGIC;
  h->bytes = bytes;
  h->device = WEFT_CPU;
  WEFT_POISON_(h, sizeof *h);
  WEFT_POISON_((char *)(h + 1) + bytes, padded - bytes);
  *out = h + 1;
  return WEFT_OK;
}

/* The CPU table's free member. */
size_t weft_cpu_free_(void *ptr) {
  alloc_header *h = (alloc_header *)ptr - 1;
  WEFT_UNPOISON_(h, sizeof *h);
  WEFT_ASSERT(h->magic == ALLOC_MAGIC);
  WEFT_UNPOISON_(ptr, (h->bytes + 63) & ~(uint64_t)63);
  h->magic = 0;
  size_t bytes = h->bytes;
  free(h);
  return bytes;
}

weft_status weft_alloc(weft_device dev, size_t bytes, void **out) {
  if (!out) return weft_error(WEFT_ERR_INVALID, "out is NULL");
  *out = NULL;
  weft_status st;
  const weft_backend *be = weft_backend_find_(dev, offsetof(weft_backend, alloc), __func__, &st);
  if (!be) return st;
  st = be->alloc(bytes, out);
  if (st != WEFT_OK) return weft_backend_trace_(st, be, __func__);
  weft_mem_account_alloc_(dev, (int64_t)bytes);
  return WEFT_OK;
}

void weft_free(void *ptr) {
  if (!ptr) return;
  /* a device block (a device's allocator knows its own), else the host's */
  for (int d = 0; d < WEFT_DEVICE_COUNT; d++) {
    const weft_backend *be = weft_backend_get((weft_device)d);
    if (d == WEFT_CPU || !be || !be->owns || !be->owns(ptr)) continue;
    weft_mem_account_free_((weft_device)d, (int64_t)be->free(ptr));
    return;
  }
  weft_mem_account_free_(WEFT_CPU, (int64_t)weft_cpu_free_(ptr));
}

weft_mem_stats weft_mem_get(weft_device dev) {
  weft_mem_stats s = {0};
  if ((unsigned)dev >= WEFT_DEVICE_COUNT) return s;
  s.current_bytes = atomic_load(&cur_bytes[dev]);
  s.peak_bytes = atomic_load(&peak_bytes[dev]);
  s.alloc_count = atomic_load(&n_alloc[dev]);
  s.free_count = atomic_load(&n_free[dev]);
  if (dev == WEFT_CPU) s.large_system_allocs = atomic_load(&n_large_host);
  return s;
}

void weft_mem_reset_peak(weft_device dev) {
  if ((unsigned)dev >= WEFT_DEVICE_COUNT) return;
  atomic_store(&peak_bytes[dev], atomic_load(&cur_bytes[dev]));
}
