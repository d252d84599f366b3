/* Allocation with exact accounting, for every device: the block comes from
 * the device's table (backend.h; the CPU's is the header scheme below), the
 * bytes are counted here.
 *
 * Host blocks of WEFT_LARGE_ALLOC_BYTES or more come from a caching
 * allocator (cache_alloc.h, stream 0, no markers): glibc hands a large
 * block out as fresh pages (mmap) and returns them when it is freed, so a
 * step that frees and allocates large buffers again (nn/mixed.c's f32
 * copies of bf16 tensors: 302 such allocations per gpt2-demo bf16 step
 * before this cache, 0 after) faults their pages in anew each time. The fp32
 * op graph reuses its own buffers and made none. A freed large block waits in its size
 * class for the next request of that class; weft_device_cache_stats(
 * WEFT_CPU) shows what is held, weft_device_empty_cache(WEFT_CPU) and
 * weft_finalize give it back. Smaller blocks go to aligned_alloc directly
 * (glibc reuses them from its arenas). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "backend_internal.h"
#include "cache_alloc.h"
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

/* Every small block carries a 64-byte header (keeps the data 64-byte
 * aligned) recording its size and device, so weft_free needs no size
 * argument; the cache's large blocks need none. */
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

/* ------------------------------------------------------------ host cache */

static void *host_raw_alloc(size_t bytes, void *ctx) {
  (void)ctx;
  void *p = aligned_alloc(64, bytes); /* classes are multiples of 512 */
  if (p) atomic_fetch_add_explicit(&n_large_host, 1, memory_order_relaxed);
  return p;
}

static void host_raw_free(void *p, size_t bytes, void *ctx) {
  (void)ctx;
  WEFT_UNPOISON_(p, bytes); /* poisoned while it waited in the cache */
  free(p);
}

static weft_cache_ *host_cache; /* NULL: the cache could not be made; blocks go to malloc */
static pthread_once_t host_cache_once = PTHREAD_ONCE_INIT;

static void host_cache_make(void) {
  const weft_cache_backend_ be = {
      .raw_alloc = host_raw_alloc, .raw_free = host_raw_free, .memory = "host"};
  if (weft_cache_new_(&be, &host_cache) != WEFT_OK) host_cache = NULL;
}

/* The CPU table's cache_stats member. */
weft_status weft_cpu_cache_stats_(weft_cache_stats *out) {
  pthread_once(&host_cache_once, host_cache_make);
  *out = host_cache ? weft_cache_stats_(host_cache) : (weft_cache_stats){0, 0, 0, 0};
  return WEFT_OK;
}

/* The CPU table's empty_cache member: the free blocks go back to malloc. */
weft_status weft_cpu_empty_cache_(void) {
  pthread_once(&host_cache_once, host_cache_make);
  if (host_cache) weft_cache_trim_(host_cache);
  return WEFT_OK;
}

/* The CPU table's alloc member. A large block is the cache's, with no
 * header (the cache knows its size: a header would push a tensor of 2^k
 * bytes into the next size class, 25% more memory); a small one is a
 * 64-byte header, then the data. */
weft_status weft_cpu_alloc_(size_t bytes, void **out) {
  *out = NULL;
  if (bytes > ((size_t)1 << 46))
    return weft_error_at(WEFT_ERR_OOM, "weft_alloc", "refusing a host allocation of %zu bytes",
                         bytes);
  if (bytes >= WEFT_LARGE_ALLOC_BYTES) {
    pthread_once(&host_cache_once, host_cache_make);
    if (host_cache) {
      void *p;
      weft_status st = weft_cache_alloc_(host_cache, bytes, 0, &p);
      if (st != WEFT_OK) return weft_error_trace(st, "weft_alloc");
      WEFT_UNPOISON_(p, bytes);
      WEFT_POISON_((char *)p + bytes, weft_cache_round_(bytes) - bytes);
      *out = p;
      return WEFT_OK;
    }
  }
  const size_t padded = (bytes + 63) & ~(size_t)63;
  alloc_header *h = aligned_alloc(64, sizeof(alloc_header) + padded);
  if (!h)
    return weft_error_at(WEFT_ERR_OOM, "weft_alloc", "host allocation of %zu bytes failed", bytes);
  if (bytes >= WEFT_LARGE_ALLOC_BYTES) /* the cache could not be made */
    atomic_fetch_add_explicit(&n_large_host, 1, memory_order_relaxed);
  h->magic = ALLOC_MAGIC;
  h->bytes = bytes;
  h->device = WEFT_CPU;
  WEFT_POISON_(h, sizeof *h);
  WEFT_POISON_((char *)(h + 1) + bytes, padded - bytes);
  *out = h + 1;
  return WEFT_OK;
}

/* The CPU table's free member: a block of the cache goes back there,
 * poisoned whole while it waits (so a use after free is caught under ASan;
 * poisoned before the cache has it, so no other thread's block is hit). */
size_t weft_cpu_free_(void *ptr) {
  pthread_once(&host_cache_once, host_cache_make);
  void *start;
  size_t bytes;
  if (host_cache && weft_cache_lookup_(host_cache, ptr, &start, &bytes) && start == ptr) {
    WEFT_POISON_(ptr, weft_cache_round_(bytes));
    return weft_cache_free_(host_cache, ptr);
  }
  alloc_header *h = (alloc_header *)ptr - 1;
  WEFT_UNPOISON_(h, sizeof *h);
  WEFT_ASSERT(h->magic == ALLOC_MAGIC);
  WEFT_UNPOISON_(ptr, (h->bytes + 63) & ~(uint64_t)63);
  h->magic = 0;
  bytes = h->bytes;
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
