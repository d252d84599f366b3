/* The caching allocator's logic (kernels/cuda/cache_alloc.c) over a fake
 * backend: host memory for blocks, flags for stream markers. Runs without a
 * GPU; the device backend is the same code over cudaMalloc and events. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "cache_alloc.h"

typedef struct fake {
  int64_t live_bytes; /* raw bytes held */
  int raw_allocs, raw_frees;
  int64_t limit;     /* raw_alloc fails beyond this many live bytes */
  bool markers_done; /* what mark_done reports */
  int marks, releases;
} fake;

static void *fk_alloc(size_t bytes, void *ctx) {
  fake *f = ctx;
  if (f->limit && f->live_bytes + (int64_t)bytes > f->limit) return NULL;
  void *p = malloc(bytes);
  f->live_bytes += (int64_t)bytes;
  f->raw_allocs++;
  return p;
}
static void fk_free(void *p, size_t bytes, void *ctx) {
  fake *f = ctx;
  f->live_bytes -= (int64_t)bytes;
  f->raw_frees++;
  free(p);
}
static int marker_token;
static void *fk_mark(int stream, void *ctx) {
  fake *f = ctx;
  f->marks++;
  return &marker_token + stream * 0; /* any non-NULL token */
}
static bool fk_done(void *m, void *ctx) {
  (void)m;
  return ((fake *)ctx)->markers_done;
}
static void fk_release(void *m, void *ctx) {
  (void)m;
  ((fake *)ctx)->releases++;
}

static weft_cache_ *make(fake *f) {
  weft_cache_backend_ be = {fk_alloc, fk_free, fk_mark, fk_done, fk_release, f, "device"};
  weft_cache_ *c;
  cr_assert_eq(weft_cache_new_(&be, &c), WEFT_OK);
  return c;
}

Test(cuda_cache, size_classes) {
  cr_assert_eq(weft_cache_round_(0), 512);
  cr_assert_eq(weft_cache_round_(1), 512);
  cr_assert_eq(weft_cache_round_(512), 512);
  cr_assert_eq(weft_cache_round_(513), 1024);
  cr_assert_eq(weft_cache_round_((1 << 20) - 1), 1 << 20);
  cr_assert_eq(weft_cache_round_(1 << 20), 1 << 20);
  cr_assert_eq(weft_cache_round_((1 << 20) + 1), (1 << 20) + (1 << 18));
  cr_assert_eq(weft_cache_round_(3u << 20), 3u << 20);
  cr_assert_eq(weft_cache_round_((3u << 20) + 1), (3u << 20) + (1u << 19));
  /* every class wastes at most 25% above 1 MiB, at most 511 bytes below */
  for (size_t b = 1; b < ((size_t)1 << 34); b = b * 3 + 7) {
    size_t r = weft_cache_round_(b);
    cr_assert_geq(r, b);
    if (b >= (1 << 20))
      cr_assert_leq((double)r, 1.25 * (double)b, "class %zu for %zu", r, b);
    else
      cr_assert_lt(r - b, 512);
    cr_assert_eq(weft_cache_round_(r), r, "a class is its own class (%zu)", r);
  }
  cr_assert_eq(weft_cache_round_(SIZE_MAX), 0, "too large to serve");
}

Test(cuda_cache, reuse_same_stream_and_class) {
  fake f = {0};
  weft_cache_ *c = make(&f);
  void *a, *b;
  cr_assert_eq(weft_cache_alloc_(c, 1000, 0, &a), WEFT_OK);
  cr_assert_eq(weft_cache_free_(c, a), 1000, "free returns the requested size");
  cr_assert_eq(weft_cache_alloc_(c, 900, 0, &b), WEFT_OK);
  cr_assert_eq(a, b, "same class (1024) on the same stream reuses the block");
  weft_cache_stats s = weft_cache_stats_(c);
  cr_assert_eq(s.hits, 1);
  cr_assert_eq(s.misses, 1);
  cr_assert_eq(s.reserved_bytes, 1024);
  cr_assert_eq(s.cached_bytes, 0);
  cr_assert_eq(f.raw_allocs, 1);
  /* a different class does not take it */
  weft_cache_free_(c, b);
  void *d;
  cr_assert_eq(weft_cache_alloc_(c, 2000, 0, &d), WEFT_OK);
  cr_assert_neq(d, b);
  cr_assert_eq(weft_cache_stats_(c).cached_bytes, 1024);
  /* another stream does not take a block freed on stream 0 */
  void *e;
  cr_assert_eq(weft_cache_alloc_(c, 1000, 1, &e), WEFT_OK);
  cr_assert_neq(e, b, "stream-ordered: stream 1 must not reuse stream 0's block");
  weft_cache_free_(c, d);
  weft_cache_free_(c, e);
  weft_cache_delete_(c);
  cr_assert_eq(f.live_bytes, 0, "delete returns every block");
  cr_assert_eq(f.raw_allocs, f.raw_frees);
}

Test(cuda_cache, record_stream_defers_reuse_until_marker_done) {
  fake f = {0};
  weft_cache_ *c = make(&f);
  void *a, *b;
  cr_assert_eq(weft_cache_alloc_(c, 4096, 0, &a), WEFT_OK);
  cr_assert_eq(weft_cache_record_stream_(c, a, 1), WEFT_OK);
  f.markers_done = false;
  weft_cache_free_(c, a);
  cr_assert_eq(f.marks, 1, "one marker on the other stream");
  cr_assert_eq(weft_cache_alloc_(c, 4096, 0, &b), WEFT_OK);
  cr_assert_neq(a, b, "still in use on stream 1: not reused");
  f.markers_done = true;
  void *d;
  cr_assert_eq(weft_cache_alloc_(c, 4096, 0, &d), WEFT_OK);
  cr_assert_eq(d, a, "marker passed: reused on its own stream");
  cr_assert_eq(f.releases, 1);
  cr_assert_eq(weft_cache_record_stream_(c, (char *)d + 8, 1), WEFT_ERR_INVALID,
               "record_stream wants the block start");
  weft_cache_free_(c, b);
  weft_cache_free_(c, d);
  weft_cache_delete_(c);
  cr_assert_eq(f.live_bytes, 0);
}

Test(cuda_cache, interior_lookup_and_double_free) {
  fake f = {0};
  weft_cache_ *c = make(&f);
  void *blocks[40];
  for (int i = 0; i < 40; i++)
    cr_assert_eq(weft_cache_alloc_(c, (size_t)(100 + 997 * i), i % 2, &blocks[i]), WEFT_OK);
  for (int i = 0; i < 40; i++) {
    size_t req = (size_t)(100 + 997 * i);
    void *start;
    size_t bytes;
    cr_assert(weft_cache_lookup_(c, (char *)blocks[i] + req - 1, &start, &bytes));
    cr_assert_eq(start, blocks[i]);
    cr_assert_eq(bytes, req);
    cr_assert(weft_cache_owns_(c, blocks[i]));
    /* one past the requested end is not this block (it may be another one) */
    if (weft_cache_lookup_(c, (char *)blocks[i] + req, &start, NULL))
      cr_assert_neq(start, blocks[i]);
  }
  int dummy;
  cr_assert(!weft_cache_owns_(c, &dummy), "host memory is not a device block");
  cr_assert(!weft_cache_owns_(c, NULL));
  cr_assert_eq(weft_cache_free_(c, blocks[3]), 100 + 997 * 3);
  cr_assert_eq(weft_cache_free_(c, blocks[3]), 0, "a second free is refused");
  cr_assert(!weft_cache_owns_(c, blocks[3]), "a freed block is not live");
  cr_assert_eq(weft_cache_free_(c, (char *)blocks[4] + 1), 0, "interior free refused");
  for (int i = 0; i < 40; i++)
    if (i != 3) weft_cache_free_(c, blocks[i]);
  weft_cache_stats s = weft_cache_stats_(c);
  cr_assert_eq(s.cached_bytes, s.reserved_bytes, "everything is cached after freeing all");
  weft_cache_trim_(c);
  s = weft_cache_stats_(c);
  cr_assert_eq(s.reserved_bytes, 0);
  cr_assert_eq(f.live_bytes, 0, "trim returned the free blocks");
  weft_cache_delete_(c);
}

Test(cuda_cache, oom_trims_then_retries_then_reports) {
  fake f = {.limit = 8192};
  weft_cache_ *c = make(&f);
  void *a, *b, *d;
  cr_assert_eq(weft_cache_alloc_(c, 6000, 0, &a), WEFT_OK); /* 6144 */
  weft_cache_free_(c, a);                                   /* cached */
  cr_assert_eq(weft_cache_alloc_(c, 4000, 0, &b), WEFT_OK,
               "the cached 6144-byte block is returned to make room");
  cr_assert_eq(weft_cache_stats_(c).cached_bytes, 0);
  cr_assert_eq(weft_cache_alloc_(c, 8000, 0, &d), WEFT_ERR_OOM);
  cr_assert_null(d);
  cr_assert(strstr(weft_last_error(), "8000 bytes") != NULL, "%s", weft_last_error());
  cr_assert_eq(weft_cache_alloc_(c, 10, 5, &d), WEFT_ERR_INVALID, "bad stream");
  weft_cache_free_(c, b);
  weft_cache_delete_(c);
  cr_assert_eq(f.live_bytes, 0);
}

Test(cuda_cache, steady_state_loop_allocates_nothing_new) {
  /* A training step's pattern: the same sizes allocated and freed each step.
   * After the first step every request is a hit. */
  fake f = {0};
  weft_cache_ *c = make(&f);
  const size_t sizes[] = {256, 3 << 20, 65536, 1000000, 12345, 7 << 22};
  void *p[6];
  for (int step = 0; step < 5; step++) {
    for (int i = 0; i < 6; i++) cr_assert_eq(weft_cache_alloc_(c, sizes[i], 0, &p[i]), WEFT_OK);
    for (int i = 5; i >= 0; i--) weft_cache_free_(c, p[i]);
  }
  weft_cache_stats s = weft_cache_stats_(c);
  cr_assert_eq(s.misses, 6);
  cr_assert_eq(s.hits, 24);
  cr_assert_eq(f.raw_allocs, 6);
  weft_cache_delete_(c);
}
