/* The caching allocator (cache_alloc.h explains the policy). Plain C over a
 * backend of raw allocations and stream markers, so the same code serves
 * cudaMalloc on a GPU, the CPU backend's large host blocks and malloc in
 * the unit tests.
 *
 * Data structures: every block the cache obtained is in `all` (sorted by
 * address, for interior-pointer lookups); a free block is also on the free
 * list of the stream it was last used on, or on the pending list while it
 * waits for markers on other streams. Block counts are in the hundreds, so
 * lists are searched linearly. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cache_alloc.h"

typedef struct cblock {
  char *ptr;
  size_t size;      /* class size: what the block can hold */
  size_t req;       /* bytes requested by the current (or last) user */
  int stream;       /* stream it was allocated for */
  unsigned used_on; /* bit s: also used on stream s (record_stream) */
  bool live;
  void *marker[WEFT_CACHE_STREAMS]; /* pending markers (free blocks only) */
  struct cblock *next;              /* free or pending list */
} cblock;

struct weft_cache_ {
  weft_cache_backend_ be;
  pthread_mutex_t mu;
  cblock **all; /* sorted by ptr */
  int nall, capall;
  cblock *free_list[WEFT_CACHE_STREAMS];
  cblock *pending;
  weft_cache_stats st;
};

#define SMALL_LIMIT ((size_t)1 << 20)
#define SMALL_STEP ((size_t)512)

size_t weft_cache_round_(size_t bytes) {
  if (bytes == 0) return SMALL_STEP;
  if (bytes < SMALL_LIMIT) return (bytes + SMALL_STEP - 1) / SMALL_STEP * SMALL_STEP;
  /* 4 steps per power of two: step = 2^floor(log2 bytes) / 4 */
  int k = 63 - __builtin_clzll((unsigned long long)bytes);
  size_t step = ((size_t)1 << k) >> 2;
  if (bytes > SIZE_MAX - step) return 0; /* cannot be served */
  return (bytes + step - 1) / step * step;
}

weft_status weft_cache_new_(const weft_cache_backend_ *be, weft_cache_ **out) {
  *out = NULL;
  if (!be || !be->raw_alloc || !be->raw_free)
    return weft_error(WEFT_ERR_INVALID, "caching allocator: backend needs raw_alloc and raw_free");
  weft_cache_ *c = calloc(1, sizeof *c);
  if (!c) return weft_error(WEFT_ERR_OOM, "caching allocator: out of host memory");
  c->be = *be;
  pthread_mutex_init(&c->mu, NULL);
  *out = c;
  return WEFT_OK;
}

static void release_markers(weft_cache_ *c, cblock *b) {
  for (int s = 0; s < WEFT_CACHE_STREAMS; s++) {
    if (b->marker[s] && c->be.mark_release) c->be.mark_release(b->marker[s], c->be.ctx);
    b->marker[s] = NULL;
  }
}

void weft_cache_delete_(weft_cache_ *c) {
  if (!c) return;
  for (int i = 0; i < c->nall; i++) {
    release_markers(c, c->all[i]);
    c->be.raw_free(c->all[i]->ptr, c->all[i]->size, c->be.ctx);
    free(c->all[i]);
  }
  free(c->all);
  pthread_mutex_destroy(&c->mu);
  free(c);
}

/* Index of the last block whose start is <= p, or -1. */
static int find_le(const weft_cache_ *c, const char *p) {
  int lo = 0, hi = c->nall - 1, ans = -1;
  while (lo <= hi) {
    int mid = lo + (hi - lo) / 2;
    if (c->all[mid]->ptr <= p) {
      ans = mid;
      lo = mid + 1;
    } else {
      hi = mid - 1;
    }
  }
  return ans;
}

static bool insert_sorted(weft_cache_ *c, cblock *b) {
  if (c->nall == c->capall) {
    int cap = c->capall ? 2 * c->capall : 64;
    cblock **v = realloc(c->all, (size_t)cap * sizeof *v);
    if (!v) return false;
    c->all = v;
    c->capall = cap;
  }
  int at = find_le(c, b->ptr) + 1;
  memmove(c->all + at + 1, c->all + at, (size_t)(c->nall - at) * sizeof *c->all);
  c->all[at] = b;
  c->nall++;
  return true;
}

static void remove_sorted(weft_cache_ *c, cblock *b) {
  int at = find_le(c, b->ptr);
  WEFT_ASSERT(at >= 0 && c->all[at] == b);
  memmove(c->all + at, c->all + at + 1, (size_t)(c->nall - at - 1) * sizeof *c->all);
  c->nall--;
}

/* Moves pending blocks whose markers all completed to their stream's list. */
static void settle_pending(weft_cache_ *c) {
  cblock **pp = &c->pending;
  while (*pp) {
    cblock *b = *pp;
    bool done = true;
    for (int s = 0; s < WEFT_CACHE_STREAMS && done; s++)
      if (b->marker[s]) done = c->be.mark_done ? c->be.mark_done(b->marker[s], c->be.ctx) : true;
    if (done) {
      release_markers(c, b);
      *pp = b->next;
      b->next = c->free_list[b->stream];
      c->free_list[b->stream] = b;
    } else {
      pp = &b->next;
    }
  }
}

/* Returns every free (settled) block to the backend. Caller holds mu. */
static void trim_locked(weft_cache_ *c) {
  settle_pending(c);
  for (int s = 0; s < WEFT_CACHE_STREAMS; s++) {
    cblock *b = c->free_list[s];
    while (b) {
      cblock *next = b->next;
      remove_sorted(c, b);
      c->st.reserved_bytes -= (int64_t)b->size;
      c->st.cached_bytes -= (int64_t)b->size;
      c->be.raw_free(b->ptr, b->size, c->be.ctx);
      free(b);
      b = next;
    }
    c->free_list[s] = NULL;
  }
}

void weft_cache_trim_(weft_cache_ *c) {
  pthread_mutex_lock(&c->mu);
  trim_locked(c);
  pthread_mutex_unlock(&c->mu);
}

weft_status weft_cache_alloc_(weft_cache_ *c, size_t bytes, int stream, void **out) {
  *out = NULL;
  if (stream < 0 || stream >= WEFT_CACHE_STREAMS)
    return weft_error(WEFT_ERR_INVALID, "caching allocator: stream %d out of range", stream);
  size_t cls = weft_cache_round_(bytes);
  if (cls == 0)
    return weft_error(WEFT_ERR_OOM, "caching allocator: a request of %zu bytes is too large",
                      bytes);
  pthread_mutex_lock(&c->mu);
  settle_pending(c);
  /* a free block of exactly this class, last used on this stream */
  for (cblock **pp = &c->free_list[stream]; *pp; pp = &(*pp)->next) {
    cblock *b = *pp;
    if (b->size == cls) {
      *pp = b->next;
      b->next = NULL;
      b->live = true;
      b->req = bytes;
      b->used_on = 0;
      c->st.cached_bytes -= (int64_t)b->size;
      c->st.hits++;
      pthread_mutex_unlock(&c->mu);
      *out = b->ptr;
      return WEFT_OK;
    }
  }
  void *p = c->be.raw_alloc(cls, c->be.ctx);
  if (!p) { /* give the cache back and try once more */
    trim_locked(c);
    p = c->be.raw_alloc(cls, c->be.ctx);
  }
  cblock *b = p ? calloc(1, sizeof *b) : NULL;
  if (b) {
    b->ptr = p;
    b->size = cls;
    b->req = bytes;
    b->stream = stream;
    b->live = true;
  }
  if (!b || !insert_sorted(c, b)) {
    if (p) c->be.raw_free(p, cls, c->be.ctx);
    free(b);
    int64_t reserved = c->st.reserved_bytes;
    pthread_mutex_unlock(&c->mu);
    return weft_error(WEFT_ERR_OOM,
                      "%s allocation of %zu bytes (class %zu) failed with %lld bytes "
                      "reserved by weft",
                      c->be.memory ? c->be.memory : "device", bytes, cls, (long long)reserved);
  }
  c->st.reserved_bytes += (int64_t)cls;
  c->st.misses++;
  pthread_mutex_unlock(&c->mu);
  *out = p;
  return WEFT_OK;
}

/* The live block starting exactly at ptr (caller holds mu), or NULL. */
static cblock *live_at(const weft_cache_ *c, const void *ptr) {
  int at = find_le(c, ptr);
  if (at < 0 || c->all[at]->ptr != ptr || !c->all[at]->live) return NULL;
  return c->all[at];
}

weft_status weft_cache_record_stream_(weft_cache_ *c, void *ptr, int stream) {
  if (stream < 0 || stream >= WEFT_CACHE_STREAMS)
    return weft_error(WEFT_ERR_INVALID, "caching allocator: stream %d out of range", stream);
  pthread_mutex_lock(&c->mu);
  cblock *b = live_at(c, ptr);
  if (b && stream != b->stream) b->used_on |= 1u << stream;
  pthread_mutex_unlock(&c->mu);
  if (!b) return weft_error(WEFT_ERR_INVALID, "record_stream: %p is not a live device block", ptr);
  return WEFT_OK;
}

size_t weft_cache_free_(weft_cache_ *c, void *ptr) {
  if (!ptr) return 0;
  pthread_mutex_lock(&c->mu);
  cblock *b = live_at(c, ptr);
  if (!b) {
    pthread_mutex_unlock(&c->mu);
    return 0;
  }
  size_t req = b->req;
  b->live = false;
  c->st.cached_bytes += (int64_t)b->size;
  bool waits = false;
  for (int s = 0; s < WEFT_CACHE_STREAMS; s++) {
    if (!(b->used_on & (1u << s))) continue;
    b->marker[s] = c->be.mark ? c->be.mark(s, c->be.ctx) : NULL;
    waits = waits || b->marker[s] != NULL;
  }
  b->used_on = 0;
  if (waits) {
    b->next = c->pending;
    c->pending = b;
  } else {
    b->next = c->free_list[b->stream];
    c->free_list[b->stream] = b;
  }
  pthread_mutex_unlock(&c->mu);
  return req;
}

bool weft_cache_lookup_(const weft_cache_ *c, const void *ptr, void **start, size_t *bytes) {
  if (!c || !ptr) return false;
  weft_cache_ *mc = (weft_cache_ *)c; /* the lock is not part of the value */
  pthread_mutex_lock(&mc->mu);
  int at = find_le(c, ptr);
  bool hit = false;
  if (at >= 0) {
    const cblock *b = c->all[at];
    size_t span = b->req ? b->req : 1;
    hit = b->live && (const char *)ptr < b->ptr + span;
    if (hit) {
      if (start) *start = b->ptr;
      if (bytes) *bytes = b->req;
    }
  }
  pthread_mutex_unlock(&mc->mu);
  return hit;
}

bool weft_cache_owns_(const weft_cache_ *c, const void *ptr) {
  return weft_cache_lookup_(c, ptr, NULL, NULL);
}

weft_cache_stats weft_cache_stats_(const weft_cache_ *c) {
  weft_cache_stats s = {0};
  if (!c) return s;
  weft_cache_ *mc = (weft_cache_ *)c;
  pthread_mutex_lock(&mc->mu);
  s = c->st;
  pthread_mutex_unlock(&mc->mu);
  return s;
}
