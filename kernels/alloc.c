/* Host allocation with exact accounting; device allocations are delegated to
 * the CUDA backend when it is built. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "cuda/cuda.h"
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

const char *weft_device_name(weft_device dev) {
  switch (dev) {
    case WEFT_CPU: return "cpu";
    case WEFT_CUDA: return "cuda";
    default: return "?";
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

weft_status weft_alloc(weft_device dev, size_t bytes, void **out) {
  *out = NULL;
  if ((unsigned)dev >= WEFT_DEVICE_COUNT)
    return weft_error(WEFT_ERR_INVALID, "unknown device %d", (int)dev);
  if (dev == WEFT_CUDA) return weft_cuda_malloc(bytes, out); /* counts the bytes itself */
  if (bytes > ((size_t)1 << 46))
    return weft_error(WEFT_ERR_OOM, "refusing a host allocation of %zu bytes", bytes);
  const size_t padded = (bytes + 63) & ~(size_t)63;
  alloc_header *h = aligned_alloc(64, sizeof(alloc_header) + padded);
  if (!h) return weft_error(WEFT_ERR_OOM, "host allocation of %zu bytes failed", bytes);
  h->magic = ALLOC_MAGIC;
  h->bytes = bytes;
  h->device = WEFT_CPU;
  weft_mem_account_alloc_(WEFT_CPU, (int64_t)bytes);
  WEFT_POISON_(h, sizeof *h);
  WEFT_POISON_((char *)(h + 1) + bytes, padded - bytes);
  *out = h + 1;
  return WEFT_OK;
}

void weft_free(void *ptr) {
  if (!ptr) return;
  if (weft_cuda_owns_(ptr)) {
    weft_cuda_free(ptr); /* counts the bytes itself */
    return;
  }
  alloc_header *h = (alloc_header *)ptr - 1;
  WEFT_UNPOISON_(h, sizeof *h);
  WEFT_ASSERT(h->magic == ALLOC_MAGIC);
  WEFT_UNPOISON_(ptr, (h->bytes + 63) & ~(uint64_t)63);
  h->magic = 0;
  weft_mem_account_free_(WEFT_CPU, (int64_t)h->bytes);
  free(h);
}

weft_mem_stats weft_mem_get(weft_device dev) {
  weft_mem_stats s = {0};
  if ((unsigned)dev >= WEFT_DEVICE_COUNT) return s;
  s.current_bytes = atomic_load(&cur_bytes[dev]);
  s.peak_bytes = atomic_load(&peak_bytes[dev]);
  s.alloc_count = atomic_load(&n_alloc[dev]);
  s.free_count = atomic_load(&n_free[dev]);
  return s;
}

void weft_mem_reset_peak(weft_device dev) {
  if ((unsigned)dev >= WEFT_DEVICE_COUNT) return;
  atomic_store(&peak_bytes[dev], atomic_load(&cur_bytes[dev]));
}
