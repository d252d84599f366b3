/* Allocator accounting: exact byte counts for raw allocations and for every
 * tensor constructor; views cost nothing; peak and reset; thread safety. */
#include <pthread.h>

#include "backend.h" /* weft_device_cache_stats */
#include "kernels_testutil.h"

/* A thread of the cache test: N blocks of 64 KiB .. 1 MiB, each filled
 * with its id and checked before it is freed (a block handed to two users
 * at once would fail the check). */
static void *cache_churn(void *arg) {
  const int id = (int)(intptr_t)arg;
  for (int i = 0; i < 200; i++) {
    size_t n = WEFT_LARGE_ALLOC_BYTES << (i % 5);
    unsigned char *p;
    if (weft_alloc(WEFT_CPU, n, (void **)&p) != WEFT_OK) return (void *)1;
    memset(p, id + 1, n);
    for (size_t k = 0; k < n; k += 4096)
      if (p[k] != id + 1) return (void *)1;
    weft_free(p);
  }
  return NULL;
}

Test(alloc, raw_allocations_count_exact_bytes) {
  weft_mem_stats s0 = weft_mem_get(WEFT_CPU);
  void *p[4];
  size_t sizes[4] = {100, 1, 0, 4096};
  for (int i = 0; i < 4; i++) OK(weft_alloc(WEFT_CPU, sizes[i], &p[i]));
  weft_mem_stats s1 = weft_mem_get(WEFT_CPU);
  cr_expect_eq(s1.current_bytes - s0.current_bytes, 4197, "current grew by %" PRId64,
               s1.current_bytes - s0.current_bytes);
  cr_expect_eq(s1.alloc_count - s0.alloc_count, 4);
  cr_expect_geq(s1.peak_bytes, s1.current_bytes);
  weft_free(p[1]);
  weft_free(p[0]);
  cr_expect_eq(weft_mem_get(WEFT_CPU).current_bytes - s0.current_bytes, 4096);
  weft_free(p[2]);
  weft_free(p[3]);
  weft_free(NULL);
  weft_mem_stats s2 = weft_mem_get(WEFT_CPU);
  cr_expect_eq(s2.current_bytes, s0.current_bytes);
  cr_expect_eq(s2.free_count - s0.free_count, 4, "weft_free(NULL) is not counted");
}

Test(alloc, peak_tracks_high_water_and_reset) {
  weft_mem_reset_peak(WEFT_CPU);
  weft_mem_stats s0 = weft_mem_get(WEFT_CPU);
  cr_expect_eq(s0.peak_bytes, s0.current_bytes, "reset sets peak to current");
  void *a, *b;
  OK(weft_alloc(WEFT_CPU, 1000, &a));
  OK(weft_alloc(WEFT_CPU, 234, &b));
  weft_free(a);
  cr_expect_eq(weft_mem_get(WEFT_CPU).peak_bytes, s0.current_bytes + 1234);
  weft_mem_reset_peak(WEFT_CPU);
  cr_expect_eq(weft_mem_get(WEFT_CPU).peak_bytes, s0.current_bytes + 234);
  weft_free(b);
  cr_expect_eq(weft_mem_get(WEFT_CPU).peak_bytes, s0.current_bytes + 234, "free keeps the peak");
}

Test(alloc, blocks_are_64_byte_aligned_and_distinct) {
  void *p[200];
  for (int i = 0; i < 200; i++) {
    OK(weft_alloc(WEFT_CPU, (size_t)(i % 67), &p[i]));
    cr_assert_not_null(p[i]);
    cr_expect_eq((uintptr_t)p[i] % 64, 0, "block %d (%d bytes) at %p", i, i % 67, p[i]);
    memset(p[i], 0xab, (size_t)(i % 67));
    for (int j = 0; j < i; j++) cr_assert_neq(p[i], p[j]);
  }
  for (int i = 0; i < 200; i++) weft_free(p[i]);
}

/* Host blocks of >= 64 KiB come from the host cache (kernels/alloc.c): a
 * freed one serves the next request of its size class without reaching
 * malloc, the cache's stats show it, and empty_cache gives it back. The
 * accounting counts the bytes asked for, not the class. */
Test(alloc, large_host_blocks_are_cached_by_size_class_and_emptied_on_request) {
  weft_cache_stats c0, c1, c2, c3;
  OK(weft_device_empty_cache(WEFT_CPU));
  OK(weft_device_cache_stats(WEFT_CPU, &c0));
  cr_expect_eq(c0.cached_bytes, 0, "empty_cache left %" PRId64 " bytes", c0.cached_bytes);
  weft_mem_stats m0 = weft_mem_get(WEFT_CPU);
  const size_t big = (size_t)3 << 20; /* 3 MiB */
  void *a, *b, *c;
  OK(weft_alloc(WEFT_CPU, big, &a));
  memset(a, 1, big); /* the whole block is usable */
  weft_mem_stats m1 = weft_mem_get(WEFT_CPU);
  cr_expect_eq(m1.large_system_allocs - m0.large_system_allocs, 1);
  cr_expect_eq(m1.current_bytes - m0.current_bytes, (int64_t)big);
  weft_free(a);
  OK(weft_device_cache_stats(WEFT_CPU, &c1));
  cr_expect_geq(c1.cached_bytes, (int64_t)big, "a freed 3 MiB block waits in the cache");
  cr_expect_eq(weft_mem_get(WEFT_CPU).current_bytes, m0.current_bytes, "cached is not live");
  /* a request of the same class (3 MiB - 1000 B rounds up to 3 MiB) gets
   * the block back */
  OK(weft_alloc(WEFT_CPU, big - 1000, &b));
  cr_expect_eq(b, a, "the cached block is reused");
  cr_expect_eq((uintptr_t)b % 64, 0);
  OK(weft_device_cache_stats(WEFT_CPU, &c2));
  cr_expect_eq(c2.hits - c1.hits, 1);
  cr_expect_eq(weft_mem_get(WEFT_CPU).large_system_allocs, m1.large_system_allocs,
               "a cache hit does not reach malloc");
  /* below 64 KiB nothing is cached */
  OK(weft_alloc(WEFT_CPU, WEFT_LARGE_ALLOC_BYTES - 1, &c));
  weft_free(c);
  OK(weft_device_cache_stats(WEFT_CPU, &c3));
  cr_expect_eq(c3.cached_bytes, c2.cached_bytes, "a small block is not cached");
  cr_expect_eq(weft_mem_get(WEFT_CPU).large_system_allocs, m1.large_system_allocs);
  weft_free(b);
  OK(weft_device_empty_cache(WEFT_CPU));
  OK(weft_device_cache_stats(WEFT_CPU, &c3));
  cr_expect_eq(c3.cached_bytes, 0);
  cr_expect_eq(c3.reserved_bytes, c0.reserved_bytes, "empty_cache returns the free blocks");
  cr_expect_eq(weft_mem_get(WEFT_CPU).current_bytes, m0.current_bytes);
}

Test(alloc, cached_host_blocks_keep_exact_accounting_across_threads) {
  /* 4 threads allocate and free blocks of several large classes at once */
  enum { T = 4, N = 200 };
  weft_mem_stats m0 = weft_mem_get(WEFT_CPU);
  pthread_t th[T];
  for (int t = 0; t < T; t++)
    cr_assert_eq(pthread_create(&th[t], NULL, cache_churn, (void *)(intptr_t)t), 0);
  for (int t = 0; t < T; t++) {
    void *bad = NULL;
    pthread_join(th[t], &bad);
    cr_expect_null(bad, "thread %d saw a block overwritten or an allocation fail", t);
  }
  weft_mem_stats m1 = weft_mem_get(WEFT_CPU);
  cr_expect_eq(m1.current_bytes, m0.current_bytes);
  cr_expect_eq(m1.alloc_count - m0.alloc_count, T * N);
  cr_expect_eq(m1.free_count - m0.free_count, T * N);
}

Test(alloc, bad_requests_fail_cleanly_without_counting) {
  weft_mem_stats s0 = weft_mem_get(WEFT_CPU);
  void *p = (void *)1;
  EXPECT_ERR(weft_alloc((weft_device)7, 16, &p), WEFT_ERR_INVALID, "7");
  cr_expect_null(p);
  p = (void *)1;
  EXPECT_ERR(weft_alloc(WEFT_CPU, (size_t)1 << 50, &p), WEFT_ERR_OOM, "1125899906842624");
  cr_expect_null(p);
  weft_mem_stats s1 = weft_mem_get(WEFT_CPU);
  cr_expect_eq(s1.current_bytes, s0.current_bytes);
  cr_expect_eq(s1.alloc_count, s0.alloc_count);
  weft_mem_stats bad = weft_mem_get((weft_device)9);
  cr_expect_eq(bad.current_bytes, 0);
  cr_expect_eq(bad.alloc_count, 0);
}

Test(alloc, cuda_without_backend_reports_clearly) {
  weft_mem_stats s0 = weft_mem_get(WEFT_CUDA);
  void *p = NULL;
  weft_clear_error();
  weft_status st = weft_alloc(WEFT_CUDA, 256, &p);
  if (st == WEFT_OK) { /* a build with a GPU backend and a GPU */
    cr_expect_eq(weft_mem_get(WEFT_CUDA).current_bytes - s0.current_bytes, 256);
    weft_free(p);
    cr_expect_eq(weft_mem_get(WEFT_CUDA).current_bytes, s0.current_bytes);
  } else {
    cr_expect(st == WEFT_ERR_UNSUPPORTED || st == WEFT_ERR_NO_DEVICE || st == WEFT_ERR_CUDA,
              "status %d: %s", (int)st, weft_last_error());
    cr_expect_null(p);
    cr_expect_gt(strlen(weft_last_error()), 10, "message: '%s'", weft_last_error());
    cr_expect_eq(weft_mem_get(WEFT_CUDA).current_bytes, s0.current_bytes);
    cr_expect_eq(weft_mem_get(WEFT_CUDA).alloc_count, s0.alloc_count);
    /* a CUDA tensor goes through weft_alloc and fails the same way */
    int64_t shape[1] = {4};
    weft_tensor *t = (weft_tensor *)1;
    cr_expect_eq(weft_tensor_create(WEFT_F32, WEFT_CUDA, 1, shape, &t), st);
    cr_expect_null(t);
  }
}

typedef struct thread_arg {
  unsigned seed;
  int iters;
} thread_arg;

static void *alloc_worker(void *vp) {
  thread_arg *a = vp;
  void *held[8] = {0};
  unsigned s = a->seed;
  for (int i = 0; i < a->iters; i++) {
    s = s * 1103515245u + 12345u;
    int slot = (int)((s >> 16) % 8);
    if (held[slot]) {
      weft_free(held[slot]);
      held[slot] = NULL;
    } else if (weft_alloc(WEFT_CPU, (s >> 8) % 5000, &held[slot]) != WEFT_OK) {
      return (void *)1;
    }
  }
  for (int i = 0; i < 8; i++) weft_free(held[i]);
  return NULL;
}

Test(alloc, accounting_is_exact_under_threads) {
  weft_mem_stats s0 = weft_mem_get(WEFT_CPU);
  pthread_t th[4];
  thread_arg args[4];
  for (int i = 0; i < 4; i++) {
    args[i] = (thread_arg){(unsigned)(i * 7919 + 1), 20000};
    cr_assert_eq(pthread_create(&th[i], NULL, alloc_worker, &args[i]), 0);
  }
  for (int i = 0; i < 4; i++) {
    void *ret;
    pthread_join(th[i], &ret);
    cr_expect_null(ret);
  }
  weft_mem_stats s1 = weft_mem_get(WEFT_CPU);
  cr_expect_eq(s1.current_bytes, s0.current_bytes, "current %" PRId64 " != %" PRId64,
               s1.current_bytes, s0.current_bytes);
  cr_expect_eq(s1.alloc_count - s0.alloc_count, s1.free_count - s0.free_count);
  cr_expect_gt(s1.alloc_count - s0.alloc_count, 1000);
}

static int64_t cur(void) { return weft_mem_get(WEFT_CPU).current_bytes; }

Test(alloc, tensors_count_storage_exactly_and_views_nothing) {
  const int64_t base = cur();
  weft_mem_reset_peak(WEFT_CPU);
  int64_t s35[2] = {3, 5}, s7[1] = {7};
  weft_tensor *a, *z, *c, *k, *e;
  OK(weft_tensor_create(WEFT_F32, WEFT_CPU, 2, s35, &a));
  cr_expect_eq(cur() - base, 60);
  OK(weft_tensor_zeros(WEFT_BF16, WEFT_CPU, 1, s7, &z));
  cr_expect_eq(cur() - base, 74);
  int64_t s0[2] = {0, 9};
  OK(weft_tensor_create(WEFT_F64, WEFT_CPU, 2, s0, &e));
  cr_expect_eq(cur() - base, 74, "an empty tensor holds 0 bytes");

  /* views: no storage */
  weft_tensor *n, *v, *t, *ch[4], *w;
  OK(weft_tensor_narrow(a, 1, 1, 3, &n));
  int64_t s15[1] = {15};
  OK(weft_tensor_view(a, 1, s15, &v));
  OK(weft_tensor_transpose(a, 0, 1, &t));
  OK(weft_tensor_chunk(a, 4, 1, ch));
  float buf[6];
  int64_t s6[1] = {6};
  OK(weft_tensor_wrap(buf, WEFT_F32, WEFT_CPU, 1, s6, &w));
  cr_expect_eq(cur() - base, 74, "views allocated %" PRId64 " bytes", cur() - base - 74);

  OK(weft_tensor_clone(t, &c)); /* 60 */
  weft_tensor *parts[2] = {a, n};
  OK(weft_tensor_cat(parts, 2, 1, &k)); /* [3, 8] f32 = 96 */
  weft_tensor *d;
  OK(weft_cast(z, WEFT_F64, &d)); /* 56 */
  cr_expect_eq(cur() - base, 74 + 60 + 96 + 56);
  cr_expect_eq(weft_mem_get(WEFT_CPU).peak_bytes - base, 74 + 60 + 96 + 56);

  /* failures allocate nothing */
  int64_t bad[2] = {3, -1};
  weft_tensor *x = NULL;
  EXPECT_ERR(weft_tensor_create(WEFT_F32, WEFT_CPU, 2, bad, &x), WEFT_ERR_INVALID, "-1");
  cr_expect_eq(cur() - base, 286);

  weft_tensor_destroy(w);
  for (int i = 0; i < 4; i++) weft_tensor_destroy(ch[i]);
  weft_tensor_destroy(n);
  weft_tensor_destroy(v);
  weft_tensor_destroy(t);
  cr_expect_eq(cur() - base, 286, "destroying views frees no storage");
  weft_tensor_destroy(k);
  weft_tensor_destroy(c);
  weft_tensor_destroy(d);
  weft_tensor_destroy(a);
  weft_tensor_destroy(z);
  weft_tensor_destroy(e);
  weft_tensor_destroy(NULL);
  cr_expect_eq(cur(), base);
  cr_expect_eq(weft_mem_get(WEFT_CPU).peak_bytes - base, 286);
}
