/* Collectives on device buffers: the backend choice per mesh dim, the NCCL
 * path (WEFT_HAVE_NCCL builds) and the MPI path with host staging. See
 * device_comm.h for the design and mesh.h for the contract.
 *
 * The staged path hands host bounce buffers to the host collective of
 * collectives.c, keeping the call's layout: when send and recv overlap (the
 * in-place forms) one bounce buffer covers both at the same relative
 * offsets, so the host code sees the same in-place call. Only the bytes the
 * call reads go device -> host, and only those it writes come back.
 */
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <pthread.h>
#include <string.h>

#include "weft_config.h"

#include "device_comm.h"
#include "watchdog.h"

#if WEFT_HAVE_NCCL
#include <cuda_runtime.h>
#include <nccl.h>
#endif

/* note: MPICH's mpi.h marks the status arguments with access attributes,
 * and gcc 12 then flags MPI_STATUSES_IGNORE (a null pointer constant) as
 * a zero-size region. */
#pragma GCC diagnostic ignored "-Wstringop-overflow"

/* ------------------------------------------------------------ hooks */

/* Through the WEFT_CUDA table of backend.h (none in a CPU-only build: then
 * no buffer is device memory and no device is selected). */
static bool real_is_device(const void *p) { return weft_ptr_device(p) == WEFT_CUDA; }
static weft_status real_copy(void *dst, const void *src, size_t bytes, weft_copy_kind kind,
                             weft_stream_id s) {
  return weft_memcpy_async(WEFT_CUDA, dst, src, bytes, kind, s);
}
static weft_status real_order(weft_stream_id waiter, weft_stream_id signaler) {
  weft_event *e;
  WEFT_CHECK(weft_event_record(WEFT_CUDA, signaler, &e));
  weft_status st = weft_stream_wait_event(WEFT_CUDA, waiter, e);
  weft_event_destroy(WEFT_CUDA, e); /* released once the wait passed it */
  return st;
}
static weft_status real_sync(weft_stream_id s) {
  weft_event *e;
  WEFT_CHECK(weft_event_record(WEFT_CUDA, s, &e));
  weft_status st = weft_event_synchronize(WEFT_CUDA, e);
  weft_event_destroy(WEFT_CUDA, e);
  return st;
}
static void *real_mark(weft_stream_id s) {
  weft_event *e = NULL;
  if (weft_event_record(WEFT_CUDA, s, &e) != WEFT_OK) {
    weft_clear_error();
    return NULL; /* the caller then waits for s instead */
  }
  return e;
}
static bool real_mark_done(void *m) {
  bool done = true;
  if (weft_event_query(WEFT_CUDA, m, &done) != WEFT_OK) {
    weft_clear_error();
    return true; /* a failed device: nothing will run the copy any more */
  }
  return done;
}
static void real_mark_release(void *m) { weft_event_destroy(WEFT_CUDA, m); }
static int real_device(void) { return weft_device_current(WEFT_CUDA); }

#define REAL_HOOKS                                                               \
  {                                                                              \
    real_is_device, real_copy, real_order, real_sync, real_mark, real_mark_done, \
        real_mark_release, real_device, WEFT_HAVE_NCCL != 0                      \
  }
static weft_device_hooks hooks = REAL_HOOKS;

void weft__device_hooks_set(const weft_device_hooks *h) {
  static const weft_device_hooks real = REAL_HOOKS;
  hooks = h ? *h : real;
}

const weft_device_hooks *weft__device_hooks(void) { return &hooks; }

/* ------------------------------------------------------------ state */

struct weft_dev_dim {
  weft_comm_backend backend;
  char reason[320];
#if WEFT_HAVE_NCCL
  ncclComm_t nccl;
#endif
};

typedef struct stage_copy {
  void *dst;       /* device */
  const void *src; /* host bounce */
  size_t bytes;
} stage_copy;

enum { DW_STAGE = 1, DW_NCCL = 2 };

struct weft_dev_work {
  int kind;
  weft_stream_id stream; /* the comm stream of the call */
  /* staged: the bounce buffer (a pool slot, -1 none) and the host ->
   * device copies at completion */
  int hb;
  int ncopy;
  stage_copy *copies;
#if WEFT_HAVE_NCCL
  weft_event *done; /* recorded on the comm stream after the NCCL call */
  ncclComm_t nccl;
#endif
  double t0;
};

/* ------------------------------------------------------ comm stream */

static _Thread_local weft_stream_id comm_stream = WEFT_STREAM_COMM;
bool weft__device_skip_order;

weft_status weft_comm_stream_set(weft_stream_id s, weft_stream_id *previous) {
  if (s == WEFT_STREAM_COMPUTE || (unsigned)s >= WEFT_STREAM_COUNT)
    return weft_error(WEFT_ERR_INVALID,
                      "comm_stream_set: stream %d is not a communication stream (comm, "
                      "fsdp_all_gather or fsdp_reduce_scatter)",
                      (int)s);
  if (previous) *previous = comm_stream;
  comm_stream = s;
  return WEFT_OK;
}

weft_stream_id weft_comm_stream(void) { return comm_stream; }

/* ------------------------------------------------------------ bounce pool */

/* Pinned host bounce buffers of the staged path (one per call), kept for
 * reuse: a slot is
 * busy from stage_pair until stage_finish queued its host -> device
 * copies, then free for reuse once its stream passed the mark recorded
 * after them (so those copies may still be queued when the call returns,
 * as NCCL's would). A slot an MPI call may still write (after a timeout)
 * is dropped from the pool, its memory leaked. */
typedef struct bounce {
  void *p;
  size_t cap;
  void *mark; /* NULL: no copy pending */
  bool busy;
  bool pinned; /* else malloc'd: no device to pin for (the test hooks) */
} bounce;

static void bounce_free(bounce *b) {
  if (b->pinned)
    weft_free_pinned(WEFT_CUDA, b->p);
  else
    free(b->p);
  b->p = NULL;
  b->cap = 0;
}

static struct {
  pthread_mutex_t mu;
  bounce *v;
  int n, cap;
} pool = {.mu = PTHREAD_MUTEX_INITIALIZER};

static bool bounce_idle(bounce *b) {
  if (b->busy || !b->p) return false;
  if (b->mark && hooks.mark_done && !hooks.mark_done(b->mark)) return false;
  if (b->mark && hooks.mark_release) hooks.mark_release(b->mark);
  b->mark = NULL;
  return true;
}

/* A busy slot of at least bytes (> 0): the smallest idle one that fits,
 * else an idle one regrown, else a new one. -1 with an error set. */
static int bounce_get(size_t bytes) {
  pthread_mutex_lock(&pool.mu);
  int best = -1, spare = -1;
  for (int i = 0; i < pool.n; i++) {
    if (!bounce_idle(&pool.v[i])) continue;
    if (pool.v[i].cap >= bytes && (best < 0 || pool.v[i].cap < pool.v[best].cap)) best = i;
    if (pool.v[i].cap < bytes) spare = i;
  }
  if (best < 0) {
    if (spare < 0) {
      for (int i = 0; i < pool.n && spare < 0; i++)
        if (!pool.v[i].p) spare = i;
      if (spare < 0 && pool.n == pool.cap) {
        int c = pool.cap ? 2 * pool.cap : 8;
        bounce *v = realloc(pool.v, (size_t)c * sizeof *v);
        if (!v) {
          pthread_mutex_unlock(&pool.mu);
          weft_error(WEFT_ERR_OOM, "no memory for the bounce buffer pool");
          return -1;
        }
        pool.v = v;
        pool.cap = c;
      }
      if (spare < 0) {
        spare = pool.n++;
        pool.v[spare] = (bounce){0};
      }
    }
    bounce *b = &pool.v[spare];
    bounce_free(b);
    void *p = NULL;
    b->pinned = hooks.copy == real_copy && real_device() >= 0; /* a device to pin for */
    if (b->pinned ? weft_alloc_pinned(WEFT_CUDA, bytes, &p) != WEFT_OK : !(p = malloc(bytes))) {
      pthread_mutex_unlock(&pool.mu);
      weft_error(WEFT_ERR_OOM, "no memory for a %zu-byte %shost bounce buffer", bytes,
                 b->pinned ? "pinned " : "");
      return -1;
    }
    b->p = p;
    b->cap = bytes;
    best = spare;
  }
  pool.v[best].busy = true;
  pthread_mutex_unlock(&pool.mu);
  return best;
}

static void *bounce_ptr(int slot) {
  pthread_mutex_lock(&pool.mu);
  void *p = pool.v[slot].p;
  pthread_mutex_unlock(&pool.mu);
  return p;
}

/* Back to the pool once stream s passed the work queued on it so far;
 * lost: an MPI call may still write it (the memory is leaked). */
static void bounce_put(int slot, weft_stream_id s, bool lost) {
  if (slot < 0) return;
  void *m = (!lost && hooks.mark) ? hooks.mark(s) : NULL;
  if (!lost && hooks.mark && !m && hooks.sync) (void)hooks.sync(s); /* no mark: wait now */
  pthread_mutex_lock(&pool.mu);
  bounce *b = &pool.v[slot];
  if (lost)
    *b = (bounce){0};
  else {
    b->mark = m;
    b->busy = false;
  }
  pthread_mutex_unlock(&pool.mu);
}

int weft__device_bounce_slots(size_t *bytes) {
  pthread_mutex_lock(&pool.mu);
  int k = 0;
  size_t b = 0;
  for (int i = 0; i < pool.n; i++)
    if (pool.v[i].p) {
      k++;
      b += pool.v[i].cap;
    }
  pthread_mutex_unlock(&pool.mu);
  if (bytes) *bytes = b;
  return k;
}

void weft__device_bounce_release(void) {
  pthread_mutex_lock(&pool.mu);
  bool pending = false;
  for (int i = 0; i < pool.n; i++) pending = pending || pool.v[i].mark;
  /* copies still queued from a bounce buffer: let every comm stream pass them */
  for (int s = WEFT_STREAM_COMM; pending && hooks.sync && s < WEFT_STREAM_COUNT; s++)
    if (hooks.sync((weft_stream_id)s) != WEFT_OK) weft_clear_error();
  int kept = 0;
  for (int i = 0; i < pool.n; i++) {
    bounce *b = &pool.v[i];
    if (b->busy) { /* in a collective still: leave it */
      pool.v[kept++] = *b;
      continue;
    }
    if (b->mark && hooks.mark_release) hooks.mark_release(b->mark);
    bounce_free(b);
  }
  pool.n = kept;
  if (!kept) {
    free(pool.v);
    pool.v = NULL;
    pool.cap = 0;
  }
  pthread_mutex_unlock(&pool.mu);
}

/* ------------------------------------------------------------ routing */

weft_status weft__device_route(const char *func, const char *aname, const void *a, int64_t abytes,
                               const char *bname, const void *b, int64_t bbytes, bool *device) {
  *device = false;
  bool ac = a && abytes > 0, bc = b && bbytes > 0;
  if (!ac && !bc) return WEFT_OK;
  bool ad = ac && hooks.is_device(a), bd = bc && hooks.is_device(b);
  if (ac && bc && ad != bd)
    return weft_error_at(WEFT_ERR_INVALID, func,
                         "%s is %s memory but %s is %s memory (a collective takes host buffers "
                         "or device buffers, not both)",
                         aname, ad ? "device" : "host", bname, bd ? "device" : "host");
  *device = ad || bd;
  return WEFT_OK;
}

/* ------------------------------------------------------- backend choice */

void weft__comm_facts_local(weft_comm_facts *f) {
  memset(f, 0, sizeof *f);
  char name[MPI_MAX_PROCESSOR_NAME + 1] = "";
  int len = 0;
  MPI_Get_processor_name(name, &len);
  uint64_t h = 1469598103934665603ull;
  for (const char *p = name; *p; p++) h = (h ^ (uint8_t)*p) * 1099511628211ull;
  f->host_hash = h;
  snprintf(f->host, sizeof f->host, "%s", name);
  f->device = hooks.device ? hooks.device() : -1;
  f->world_rank = weft__rt.world_rank;
  f->have_nccl = hooks.nccl;
  const char *e = getenv("WEFT_NCCL");
  f->env_disabled = e && (strcmp(e, "0") == 0 || strcmp(e, "off") == 0 || strcmp(e, "false") == 0 ||
                          strcmp(e, "no") == 0);
}

weft_comm_backend weft__comm_backend_choose(int n, const weft_comm_facts *f, char *reason,
                                            size_t cap) {
  char tmp[8];
  if (!reason || !cap) {
    reason = tmp;
    cap = sizeof tmp;
  }
  reason[0] = 0;
  int missing = 0, first = -1;
  for (int i = 0; i < n; i++)
    if (!f[i].have_nccl && missing++ == 0) first = i;
  if (missing == n) {
    snprintf(reason, cap, "this build has no NCCL (WEFT_HAVE_NCCL 0)");
    return WEFT_COMM_MPI_STAGED;
  }
  if (missing) {
    snprintf(reason, cap, "world rank %d cannot use NCCL (built without it)", f[first].world_rank);
    return WEFT_COMM_MPI_STAGED;
  }
  int off = 0;
  first = -1;
  for (int i = 0; i < n; i++)
    if (f[i].env_disabled && off++ == 0) first = i;
  if (off == n) {
    snprintf(reason, cap, "WEFT_NCCL=0 is set");
    return WEFT_COMM_MPI_STAGED;
  }
  if (off) {
    snprintf(reason, cap, "WEFT_NCCL=0 is set on world rank %d", f[first].world_rank);
    return WEFT_COMM_MPI_STAGED;
  }
  for (int i = 0; i < n; i++)
    if (f[i].device < 0) {
      snprintf(reason, cap, "world rank %d has no CUDA device selected (weft_cuda_init)",
               f[i].world_rank);
      return WEFT_COMM_MPI_STAGED;
    }
  for (int i = 0; i < n; i++)
    for (int j = i + 1; j < n; j++)
      if (f[i].host_hash == f[j].host_hash && f[i].device == f[j].device) {
        snprintf(reason, cap, "world ranks %d and %d share GPU %d on node %.64s", f[i].world_rank,
                 f[j].world_rank, f[i].device, f[i].host);
        return WEFT_COMM_MPI_STAGED;
      }
  snprintf(reason, cap, "%d rank%s on distinct GPUs", n, n == 1 ? "" : "s");
  return WEFT_COMM_NCCL;
}

/* Marks g unusable after a control exchange that timed out. */
static weft_status ctl_timeout(mesh_dim *g, const char *what) {
  char members[256];
  weft__format_ranks(g->members, g->size, members, sizeof members);
  g->broken = true;
  snprintf(g->broken_msg, sizeof g->broken_msg, "%s timed out", what);
  return weft_error(WEFT_ERR_TIMEOUT,
                    "%s on mesh dim '%s' did not complete within %g s (group: world ranks %s): "
                    "every rank of the dim must make the same device collective",
                    what, g->name, weft__rt.settings.timeout_s, members);
}

weft_status weft__comm_id_exchange(mesh_dim *g, void *blob, size_t bytes) {
  if (!g || !blob) return weft_error(WEFT_ERR_INVALID, "group or blob is NULL");
  if (bytes == 0 || bytes > INT_MAX)
    return weft_error(WEFT_ERR_INVALID, "blob of %zu bytes (1..INT_MAX)", bytes);
  if (g->broken)
    return weft_error(WEFT_ERR_STATE, "mesh dim '%s' is unusable: %s", g->name, g->broken_msg);
  if (g->size == 1) return WEFT_OK;
  MPI_Request req;
  int rc = MPI_Ibcast(blob, (int)bytes, MPI_BYTE, 0, g->ctl, &req);
  if (rc != MPI_SUCCESS)
    return weft_error(WEFT_ERR_MPI, "MPI_Ibcast of the communicator id on mesh dim '%s' failed",
                      g->name);
  weft_status st = weft__wait_all(1, &req, weft__rt.settings.timeout_s);
  if (st == WEFT_ERR_TIMEOUT) return ctl_timeout(g, "the NCCL id exchange");
  return st ? weft_error_trace(st, __func__) : WEFT_OK;
}

#if WEFT_HAVE_NCCL
static weft_status nccl_check(ncclResult_t r, const char *func, const char *call,
                              const mesh_dim *g) {
  if (r == ncclSuccess) return WEFT_OK;
  return weft_error_at(WEFT_ERR_NCCL, func, "%s on mesh dim '%s' failed: %s", call, g->name,
                       ncclGetErrorString(r));
}

static weft_status cuda_check(cudaError_t e, const char *func, const char *call,
                              const mesh_dim *g) {
  if (e == cudaSuccess) return WEFT_OK;
  return weft_error_at(WEFT_ERR_CUDA, func, "%s on mesh dim '%s' failed: %s", call, g->name,
                       cudaGetErrorString(e));
}

/* The reason of the error just set, without its "[rank r] head: " prefix
 * and its trail: the backend's words ("invalid resource handle"). */
static void last_reason(char *buf, size_t cap) {
  const char *m = weft_last_error();
  if (m[0] == '[') {
    const char *r = strstr(m, "] ");
    if (r) m = r + 2;
  }
  const char *c = strstr(m, ": ");
  if (c) m = c + 2;
  snprintf(buf, cap, "%.*s", (int)strcspn(m, "\n"), m);
}

/* A failed event operation of the backend (backend.h), reported as
 * cuda_check reports a CUDA call: what it was for, the mesh dim, why. */
static weft_status event_check(weft_status st, const char *func, const char *what,
                               const mesh_dim *g) {
  if (st == WEFT_OK) return WEFT_OK;
  char why[256];
  last_reason(why, sizeof why);
  return weft_error_at(st, func, "%s on mesh dim '%s' failed: %s", what, g->name, why);
}

/* The id and whether coordinate 0 could make one. */
typedef struct id_blob {
  int32_t ok;
  char msg[124];
  ncclUniqueId id;
} id_blob;

/* Makes g's NCCL communicator; *fallback with a reason when coordinate 0
 * could not make an id (every rank learns it from the blob). */
static weft_status nccl_create(mesh_dim *g, bool *fallback) {
  *fallback = false;
  id_blob b;
  memset(&b, 0, sizeof b);
  if (g->coord == 0) {
    ncclResult_t r = ncclGetUniqueId(&b.id);
    b.ok = r == ncclSuccess;
    if (!b.ok) snprintf(b.msg, sizeof b.msg, "%s", ncclGetErrorString(r));
  }
  WEFT_CHECK(weft__comm_id_exchange(g, &b, sizeof b));
  if (!b.ok) {
    snprintf(g->dev->reason, sizeof g->dev->reason,
             "ncclGetUniqueId failed on the dim's coordinate 0: %.120s", b.msg);
    *fallback = true;
    return WEFT_OK;
  }
  ncclComm_t c = NULL;
  ncclResult_t r = ncclCommInitRank(&c, g->size, b.id, g->coord);
  if (r != ncclSuccess) {
    g->broken = true;
    snprintf(g->broken_msg, sizeof g->broken_msg, "ncclCommInitRank failed: %.140s",
             ncclGetErrorString(r));
    return nccl_check(r, __func__, "ncclCommInitRank", g);
  }
  g->dev->nccl = c;
  return WEFT_OK;
}
#endif

weft_status weft__device_backend(mesh_dim *g, weft_comm_backend *out) {
  *out = WEFT_COMM_UNDECIDED;
  if (g->dev && g->dev->backend != WEFT_COMM_UNDECIDED) {
    *out = g->dev->backend;
    return WEFT_OK;
  }
  if (g->broken)
    return weft_error(WEFT_ERR_STATE, "mesh dim '%s' is unusable: %s", g->name, g->broken_msg);
  if (!g->dev) {
    g->dev = calloc(1, sizeof *g->dev);
    if (!g->dev)
      return weft_error(WEFT_ERR_OOM, "no memory for mesh dim '%s''s device state", g->name);
  }
  weft_comm_facts mine;
  weft__comm_facts_local(&mine);
  weft_comm_facts *all = calloc((size_t)g->size, sizeof *all);
  if (!all) return weft_error(WEFT_ERR_OOM, "no memory for %d facts", g->size);
  MPI_Request req;
  int rc = MPI_Iallgather(&mine, (int)sizeof mine, MPI_BYTE, all, (int)sizeof mine, MPI_BYTE,
                          g->ctl, &req);
  if (rc != MPI_SUCCESS) {
    free(all);
    return weft_error(WEFT_ERR_MPI, "MPI_Iallgather of device facts on mesh dim '%s' failed",
                      g->name);
  }
  weft_status st = weft__wait_all(1, &req, weft__rt.settings.timeout_s);
  if (st == WEFT_ERR_TIMEOUT) return ctl_timeout(g, "choosing the device backend"); /* leaks all */
  if (st) {
    free(all);
    return weft_error_trace(st, __func__);
  }
  weft_comm_backend b =
      weft__comm_backend_choose(g->size, all, g->dev->reason, sizeof g->dev->reason);
  free(all);
#if WEFT_HAVE_NCCL
  if (b == WEFT_COMM_NCCL) {
    bool fallback = false;
    WEFT_CHECK(nccl_create(g, &fallback));
    if (fallback) b = WEFT_COMM_MPI_STAGED;
  }
#else
  if (b == WEFT_COMM_NCCL) { /* unreachable: hooks.nccl is false without NCCL */
    snprintf(g->dev->reason, sizeof g->dev->reason, "this build has no NCCL (WEFT_HAVE_NCCL 0)");
    b = WEFT_COMM_MPI_STAGED;
  }
#endif
  if (b == WEFT_COMM_MPI_STAGED && g->coord == 0) {
    fprintf(stderr,
            "weft: mesh dim '%s': NCCL not used (%s); collectives on device buffers go through "
            "MPI with host staging\n",
            g->name, g->dev->reason);
    fflush(stderr);
  }
  g->dev->backend = b;
  *out = b;
  return WEFT_OK;
}

weft_comm_backend weft__device_dim_backend(const mesh_dim *g) {
  return g && g->dev ? g->dev->backend : WEFT_COMM_UNDECIDED;
}

const char *weft__device_dim_reason(const mesh_dim *g) { return g && g->dev ? g->dev->reason : ""; }

void weft__device_dim_free(mesh_dim *g) {
  if (!g) return;
  weft__watch_forget(g); /* no abort can come for g after this */
  if (!g->dev) return;
#if WEFT_HAVE_NCCL
  if (g->dev->nccl) {
    if (g->broken)
      ncclCommAbort(g->dev->nccl);
    else
      ncclCommDestroy(g->dev->nccl);
  }
#endif
  free(g->dev);
  g->dev = NULL;
}

/* ------------------------------------------------------------ staging */

static struct weft_dev_work *stage_new(int ncopy) {
  struct weft_dev_work *dw = calloc(1, sizeof *dw);
  if (!dw) return NULL;
  dw->kind = DW_STAGE;
  dw->stream = comm_stream;
  dw->hb = -1;
  if (ncopy > 0) {
    dw->copies = calloc((size_t)ncopy, sizeof *dw->copies);
    if (!dw->copies) {
      free(dw);
      return NULL;
    }
  }
  return dw;
}

/* Queues the copies of the results back on the call's stream and makes
 * the compute stream wait for them (when st is WEFT_OK), gives the bounce
 * buffers back and frees dw. After a timeout MPI may still write the
 * bounce buffers: they are leaked. */
static weft_status stage_finish(struct weft_dev_work *dw, weft_status st) {
  weft_status out = st;
  weft_stream_id s = dw->stream;
  if (st == WEFT_OK) {
    for (int i = 0; i < dw->ncopy && out == WEFT_OK; i++) {
      stage_copy *c = &dw->copies[i];
      if (c->bytes) {
        out = hooks.copy(c->dst, c->src, c->bytes, WEFT_COPY_H2D, s);
        if (out) weft_error_trace(out, "weft: copying a collective's result to the device");
      }
    }
    if (out == WEFT_OK && hooks.order && !weft__device_skip_order) {
      out = hooks.order(WEFT_STREAM_COMPUTE, s);
      if (out) weft_error_trace(out, "weft: ordering the compute stream after a collective");
    }
  }
  bounce_put(dw->hb, s, st == WEFT_ERR_TIMEOUT);
  free(dw->copies);
  free(dw);
  return out;
}

static void stage_add(struct weft_dev_work *dw, void *dst, const void *src, size_t bytes) {
  dw->copies[dw->ncopy++] = (stage_copy){dst, src, bytes};
}

/* Host stand-ins for device send (sbytes read) and recv (rspan bytes from
 * recv), in one bounce buffer: overlapping ranges at the same relative
 * offsets, else send's bytes then recv's (at a 64-byte boundary). Orders
 * the call's stream after the compute stream's work so far, copies send's
 * bytes device -> host on it and waits for them. Zero-byte buffers map to
 * NULL. */
static weft_status stage_pair(struct weft_dev_work *dw, const void *send, size_t sbytes, void *recv,
                              size_t rspan, const void **hs, void **hr) {
  bool sc = send && sbytes, rc = recv && rspan;
  uintptr_t s = (uintptr_t)send, r = (uintptr_t)recv;
  *hs = NULL;
  *hr = NULL;
  size_t total, soff = 0, roff;
  if (sc && rc && s < r + rspan && r < s + sbytes) {
    uintptr_t lo = s < r ? s : r, hi = s + sbytes > r + rspan ? s + sbytes : r + rspan;
    total = hi - lo;
    soff = s - lo;
    roff = r - lo;
  } else {
    roff = sc ? (sbytes + 63) & ~(size_t)63 : 0;
    total = roff + (rc ? rspan : 0);
  }
  if (total) {
    if ((dw->hb = bounce_get(total)) < 0) return weft_last_status();
    char *h = bounce_ptr(dw->hb);
    if (sc) *hs = h + soff;
    if (rc) *hr = h + roff;
  }
  /* after the compute stream's work so far: it may write send, and read
   * or write recv before the result lands there (a write after the copy
   * back would clobber it) */
  if ((sc || rc) && hooks.order && !weft__device_skip_order)
    WEFT_CHECK(hooks.order(dw->stream, WEFT_STREAM_COMPUTE));
  if (sc) {
    WEFT_CHECK(hooks.copy((void *)*hs, send, sbytes, WEFT_COPY_D2H, dw->stream));
    if (hooks.sync) WEFT_CHECK(hooks.sync(dw->stream));
  }
  return WEFT_OK;
}

/* After the host collective: hand the staging to the async work, or copy
 * back now (blocking). */
static weft_status stage_end(struct weft_dev_work *dw, weft_status st, weft_work **work) {
  if (st) {
    stage_finish(dw, st);
    return weft_error_trace(st, "weft: staged device collective");
  }
  if (work && *work) {
    (*work)->dev = dw;
    return WEFT_OK;
  }
  return stage_finish(dw, WEFT_OK);
}

#define STAGE_NEW(dw, n)                   \
  struct weft_dev_work *dw = stage_new(n); \
  if (!dw) return weft_error(WEFT_ERR_OOM, "no memory for a staged collective")

#define STAGE_PAIR(dw, send, sbytes, recv, rspan, hs, hr)                     \
  do {                                                                        \
    weft_status sp_st_ = stage_pair(dw, send, sbytes, recv, rspan, &hs, &hr); \
    if (sp_st_) {                                                             \
      stage_finish(dw, WEFT_ERR_INVALID);                                     \
      return weft_error_trace(sp_st_, __func__);                              \
    }                                                                         \
  } while (0)

/* ------------------------------------------------------------ NCCL path */

#if WEFT_HAVE_NCCL
static ncclDataType_t nccl_type(weft_dtype dt) {
  switch (dt) {
    case WEFT_F32:
      return ncclFloat32;
    case WEFT_F64:
      return ncclFloat64;
    case WEFT_BF16:
      return ncclBfloat16;
    case WEFT_F16:
      return ncclFloat16;
    case WEFT_I32:
      return ncclInt32;
    case WEFT_I64:
      return ncclInt64;
    default:
      return ncclUint8;
  }
}

static ncclRedOp_t nccl_op(weft_reduce_op op) {
  switch (op) {
    case WEFT_OP_AVG:
      return ncclAvg;
    case WEFT_OP_MAX:
      return ncclMax;
    case WEFT_OP_MIN:
      return ncclMin;
    default:
      return ncclSum;
  }
}

typedef struct nccl_ctx {
  cudaStream_t comm, comp;
  ncclComm_t nc;
} nccl_ctx;

/* Orders the call's comm stream after the compute stream's work so far. */
static weft_status nccl_pre(mesh_dim *g, nccl_ctx *c, const char *func) {
  c->comp = (cudaStream_t)weft_device_stream_handle(WEFT_CUDA, WEFT_STREAM_COMPUTE);
  c->comm = (cudaStream_t)weft_device_stream_handle(WEFT_CUDA, comm_stream);
  c->nc = g->dev->nccl;
  if (!c->comm || !c->comp)
    return weft_error_at(WEFT_ERR_NO_DEVICE, func,
                         "device collective on mesh dim '%s' before weft_cuda_init", g->name);
  weft_event *e;
  WEFT_CHECK(event_check(weft_event_record(WEFT_CUDA, WEFT_STREAM_COMPUTE, &e), func,
                         "recording an event on the compute stream", g));
  weft_status st = weft_stream_wait_event(WEFT_CUDA, comm_stream, e);
  weft_event_destroy(WEFT_CUDA, e); /* released once the wait passed it */
  return event_check(st, func, "ordering the comm stream after the compute stream", g);
}

/* The watchdog's view of an NCCL call (watchdog.h): an event recorded
 * after it on the comm stream, queried on the watchdog's thread (the
 * backend makes this process's device current there). A failed query is
 * the watchdog's "failed", not an error of that thread. */
static int nccl_watch_query(void *ev) {
  bool done = false;
  if (weft_event_query(WEFT_CUDA, ev, &done) != WEFT_OK) {
    weft_clear_error();
    return -1;
  }
  return done ? 1 : 0;
}
static void nccl_watch_release(void *ev) { weft_event_destroy(WEFT_CUDA, ev); }
/* ends the device work waiting on g's calls; the dim is broken from now on,
 * so nothing uses the communicator again */
static void nccl_watch_abort(mesh_dim *g) {
  if (!g->dev || !g->dev->nccl) return;
  ncclCommAbort(g->dev->nccl);
  g->dev->nccl = NULL;
}
static const weft_watch_ops nccl_watch_ops = {nccl_watch_query, nccl_watch_release,
                                              nccl_watch_abort};

/* Hands the call just queued on the comm stream to the watchdog. */
static weft_status nccl_watch(const weft_work *w, mesh_dim *g, const char *func) {
  weft_event *ev;
  WEFT_CHECK(event_check(weft_event_record(WEFT_CUDA, comm_stream, &ev), func,
                         "recording the watchdog's event on the comm stream", g));
  char desc[112];
  weft__fingerprint_describe(&w->fp, desc, sizeof desc);
  return weft__watch(g, &nccl_watch_ops, (void *)ev, desc);
}

/* After the NCCL call: blocking -> the compute stream waits for it;
 * async -> a handle holding the completion event. Either way the
 * watchdog watches it. */
static weft_status nccl_post(weft_work *w, mesh_dim *g, nccl_ctx *c, weft_work **out,
                             const char *func) {
  WEFT_CHECK(nccl_watch(w, g, func));
  weft_event *done;
  WEFT_CHECK(event_check(weft_event_record(WEFT_CUDA, comm_stream, &done), func,
                         "recording the collective's event on the comm stream", g));
  if (!out) {
    weft_status st = weft_stream_wait_event(WEFT_CUDA, WEFT_STREAM_COMPUTE, done);
    weft_event_destroy(WEFT_CUDA, done);
    WEFT_CHECK(event_check(st, func, "ordering the compute stream after the collective", g));
    ncclResult_t ae = ncclSuccess;
    ncclCommGetAsyncError(c->nc, &ae);
    return nccl_check(ae, func, "the NCCL communicator", g);
  }
  struct weft_dev_work *dw = calloc(1, sizeof *dw);
  weft_work *h = dw ? malloc(sizeof *h) : NULL;
  if (!h) {
    free(dw);
    if (weft_stream_wait_event(WEFT_CUDA, WEFT_STREAM_COMPUTE, done) != WEFT_OK)
      weft_clear_error(); /* the out-of-memory error below is the one to report */
    weft_event_destroy(WEFT_CUDA, done);
    return weft_error_at(WEFT_ERR_OOM, func,
                         "no memory for a work handle (the collective is ordered before later "
                         "compute-stream work)");
  }
  dw->kind = DW_NCCL;
  dw->done = done;
  dw->nccl = c->nc;
  dw->t0 = weft__now();
  *h = *w;
  h->reqs = h->reqs_inline;
  h->nreq = 0;
  h->async = true;
  h->dev = dw;
  h->root->inflight++;
  *out = h;
  return WEFT_OK;
}

/* Common prologue of the NCCL branches. */
#define NCCL_BEGIN(kind, v, cnt, op, rt, extra, payload, ps, pr)                                \
  weft_work w_;                                                                                 \
  WEFT_CHECK(weft__coll_start(&w_, mesh, g, kind, v, dt, cnt, op, rt, extra, payload, ps, pr)); \
  nccl_ctx c_;                                                                                  \
  WEFT_CHECK(nccl_pre(g, &c_, __func__))

#define NCCL_CALL(expr, name) WEFT_CHECK(nccl_check((expr), __func__, name, g))
#define NCCL_END() return nccl_post(&w_, g, &c_, work, __func__)

static weft_status nccl_work_done(weft_work *w) {
  struct weft_dev_work *dw = w->dev;
  /* (without the device's streams, after weft_device_shutdown, there is
   * nothing left to order) */
  weft_status err = weft_device_stream_handle(WEFT_CUDA, WEFT_STREAM_COMPUTE)
                        ? weft_stream_wait_event(WEFT_CUDA, WEFT_STREAM_COMPUTE, dw->done)
                        : WEFT_OK;
  weft_event_destroy(WEFT_CUDA, dw->done);
  ncclResult_t ae = ncclSuccess;
  bool aborted = __atomic_load_n(&w->group->broken, __ATOMIC_ACQUIRE);
  if (!aborted) ncclCommGetAsyncError(dw->nccl, &ae); /* (an aborted communicator is gone) */
  free(dw);
  w->dev = NULL;
  if (w->async) w->root->inflight--;
  if (aborted)
    return weft_error(WEFT_ERR_STATE, "mesh dim '%s' is unusable: %s", w->group->name,
                      w->group->broken_msg);
  WEFT_CHECK(
      event_check(err, __func__, "ordering the compute stream after the collective", w->group));
  return nccl_check(ae, __func__, "the NCCL communicator", w->group);
}
#endif

/* ------------------------------------------------------------ works */

weft_status weft__device_work_wait(weft_work *w) {
  struct weft_dev_work *dw = w->dev;
  if (dw->kind == DW_STAGE) {
    w->dev = NULL;
    weft_status st = weft__work_wait_host(w);
    return stage_finish(dw, st);
  }
#if WEFT_HAVE_NCCL
  return nccl_work_done(w);
#else
  return weft_error(WEFT_ERR_INTERNAL, "NCCL work in a build without NCCL");
#endif
}

weft_status weft__device_work_test(weft_work *w, bool *done) {
  *done = false;
  struct weft_dev_work *dw = w->dev;
  if (dw->kind == DW_STAGE) {
    weft_status st = weft__work_test_host(w, done);
    if (!*done) return st;
    w->dev = NULL;
    return stage_finish(dw, st);
  }
#if WEFT_HAVE_NCCL
  bool passed = false;
  weft_status q = weft_event_query(WEFT_CUDA, dw->done, &passed);
  if (q == WEFT_OK && passed) {
    *done = true;
    return nccl_work_done(w);
  }
  char why[256] = "";
  if (q != WEFT_OK) last_reason(why, sizeof why);
  mesh_dim *g = w->group;
  ncclResult_t ae = ncclSuccess;
  if (__atomic_load_n(&g->broken, __ATOMIC_ACQUIRE)) { /* the watchdog gave up on the dim */
    *done = true;
    weft_event_destroy(WEFT_CUDA, dw->done);
    free(dw);
    w->dev = NULL;
    if (w->async) w->root->inflight--;
    return weft_error(WEFT_ERR_STATE, "mesh dim '%s' is unusable: %s", g->name, g->broken_msg);
  }
  ncclCommGetAsyncError(dw->nccl, &ae);
  double waited = weft__now() - dw->t0;
  bool nccl_ok = ae == ncclSuccess || ae == ncclInProgress;
  if (q == WEFT_OK && nccl_ok && waited <= weft__rt.settings.timeout_s) return WEFT_OK;
  char desc[256];
  weft__fingerprint_describe(&w->fp, desc, sizeof desc);
  g->broken = true;
  *done = true;
  weft_status st;
  if (!nccl_ok)
    st = weft_error(WEFT_ERR_NCCL, "%s on mesh dim '%s' failed: %s", desc, g->name,
                    ncclGetErrorString(ae));
  else if (q != WEFT_OK)
    st = weft_error(q, "%s on mesh dim '%s' failed: %s", desc, g->name, why);
  else
    st = weft_error(WEFT_ERR_TIMEOUT, "%s on mesh dim '%s' did not complete within %g s (NCCL)",
                    desc, g->name, waited);
  snprintf(g->broken_msg, sizeof g->broken_msg, "%.160s failed", desc);
  weft_event_destroy(WEFT_CUDA, dw->done);
  free(dw);
  w->dev = NULL;
  if (w->async) w->root->inflight--;
  return st;
#else
  *done = true;
  return weft_error(WEFT_ERR_INTERNAL, "NCCL work in a build without NCCL");
#endif
}

/* ------------------------------------------------------------ collectives */

#define BACKEND(b)     \
  weft_comm_backend b; \
  WEFT_CHECK(weft__device_backend(g, &b))

weft_status weft__device_all_gather(const weft_mesh *mesh, int dim, mesh_dim *g, const void *send,
                                    void *recv, int64_t count, weft_dtype dt, weft_work **work) {
  BACKEND(b);
  size_t es = weft_dtype_size(dt), n = (size_t)g->size, blk = (size_t)count * es;
#if WEFT_HAVE_NCCL
  if (b == WEFT_COMM_NCCL) {
    NCCL_BEGIN(WEFT_COLL_ALL_GATHER, false, count, -1, -1, 0, (int64_t)(n * blk), NULL, NULL);
    NCCL_CALL(ncclAllGather(send, recv, (size_t)count, nccl_type(dt), c_.nc, c_.comm),
              "ncclAllGather");
    NCCL_END();
  }
#endif
  STAGE_NEW(dw, 1);
  const void *hs;
  void *hr;
  STAGE_PAIR(dw, send, blk, recv, n * blk, hs, hr);
  stage_add(dw, recv, hr, n * blk);
  return stage_end(dw, weft_all_gather(mesh, dim, hs, hr, count, dt, work), work);
}

weft_status weft__device_all_gather_v(const weft_mesh *mesh, int dim, mesh_dim *g, const void *send,
                                      void *recv, const int64_t *counts, weft_dtype dt,
                                      weft_work **work) {
  BACKEND(b);
  size_t es = weft_dtype_size(dt);
  int64_t total = 0;
  uint64_t h = 1469598103934665603ull;
  for (int i = 0; i < g->size; i++) {
    total += counts[i];
    h = (h ^ (uint64_t)counts[i]) * 1099511628211ull;
  }
#if WEFT_HAVE_NCCL
  if (b == WEFT_COMM_NCCL) {
    NCCL_BEGIN(WEFT_COLL_ALL_GATHER, true, total, -1, -1, (int64_t)h, total * (int64_t)es, NULL,
               NULL);
    NCCL_CALL(ncclGroupStart(), "ncclGroupStart");
    ncclResult_t r = ncclSuccess;
    int64_t off = 0;
    for (int i = 0; i < g->size && r == ncclSuccess; i++) {
      char *dst = (char *)recv + (size_t)off * es;
      if (counts[i] > 0)
        r = ncclBroadcast(i == g->coord ? send : dst, dst, (size_t)counts[i], nccl_type(dt), i,
                          c_.nc, c_.comm);
      off += counts[i];
    }
    ncclResult_t e = ncclGroupEnd();
    NCCL_CALL(r, "ncclBroadcast");
    NCCL_CALL(e, "ncclGroupEnd");
    NCCL_END();
  }
#else
  (void)h;
#endif
  STAGE_NEW(dw, 1);
  const void *hs;
  void *hr;
  STAGE_PAIR(dw, send, (size_t)counts[g->coord] * es, recv, (size_t)total * es, hs, hr);
  stage_add(dw, recv, hr, (size_t)total * es);
  return stage_end(dw, weft_all_gather_v(mesh, dim, hs, hr, counts, dt, work), work);
}

weft_status weft__device_reduce_scatter(const weft_mesh *mesh, int dim, mesh_dim *g,
                                        const void *send, void *recv, int64_t count, weft_dtype dt,
                                        weft_reduce_op op, weft_work **work) {
  BACKEND(b);
  size_t es = weft_dtype_size(dt), n = (size_t)g->size, blk = (size_t)count * es;
#if WEFT_HAVE_NCCL
  if (b == WEFT_COMM_NCCL) {
    NCCL_BEGIN(WEFT_COLL_REDUCE_SCATTER, false, count, op, -1, 0, (int64_t)(n * blk), NULL, NULL);
    /* weft's in place (send == recv, result at the start) is not NCCL's
     * (result at block coord): reduce into block coord, then move it. */
    bool in_place = send == recv;
    void *dst = in_place ? (char *)recv + (size_t)g->coord * blk : recv;
    NCCL_CALL(
        ncclReduceScatter(send, dst, (size_t)count, nccl_type(dt), nccl_op(op), c_.nc, c_.comm),
        "ncclReduceScatter");
    if (in_place && g->coord != 0)
      WEFT_CHECK(cuda_check(cudaMemcpyAsync(recv, dst, blk, cudaMemcpyDeviceToDevice, c_.comm),
                            __func__, "cudaMemcpyAsync", g));
    NCCL_END();
  }
#endif
  STAGE_NEW(dw, 1);
  const void *hs;
  void *hr;
  STAGE_PAIR(dw, send, n * blk, recv, blk, hs, hr);
  stage_add(dw, recv, hr, blk);
  return stage_end(dw, weft_reduce_scatter(mesh, dim, hs, hr, count, dt, op, work), work);
}

weft_status weft__device_all_reduce(const weft_mesh *mesh, int dim, mesh_dim *g, const void *send,
                                    void *recv, int64_t count, weft_dtype dt, weft_reduce_op op,
                                    weft_work **work) {
  BACKEND(b);
  size_t bytes = (size_t)count * weft_dtype_size(dt);
#if WEFT_HAVE_NCCL
  if (b == WEFT_COMM_NCCL) {
    NCCL_BEGIN(WEFT_COLL_ALL_REDUCE, false, count, op, -1, 0, (int64_t)bytes, NULL, NULL);
    NCCL_CALL(ncclAllReduce(send, recv, (size_t)count, nccl_type(dt), nccl_op(op), c_.nc, c_.comm),
              "ncclAllReduce");
    NCCL_END();
  }
#endif
  STAGE_NEW(dw, 1);
  const void *hs;
  void *hr;
  STAGE_PAIR(dw, send, bytes, recv, bytes, hs, hr);
  stage_add(dw, recv, hr, bytes);
  return stage_end(dw, weft_all_reduce(mesh, dim, hs, hr, count, dt, op, work), work);
}

weft_status weft__device_broadcast(const weft_mesh *mesh, int dim, mesh_dim *g, void *buf,
                                   int64_t count, weft_dtype dt, int root, weft_work **work) {
  BACKEND(b);
  size_t bytes = (size_t)count * weft_dtype_size(dt);
#if WEFT_HAVE_NCCL
  if (b == WEFT_COMM_NCCL) {
    NCCL_BEGIN(WEFT_COLL_BROADCAST, false, count, -1, root, 0, (int64_t)bytes, NULL, NULL);
    NCCL_CALL(ncclBroadcast(buf, buf, (size_t)count, nccl_type(dt), root, c_.nc, c_.comm),
              "ncclBroadcast");
    NCCL_END();
  }
#endif
  STAGE_NEW(dw, 1);
  bool is_root = g->coord == root;
  /* only the root's data is read; only the others' is written */
  const void *hs;
  void *hr;
  STAGE_PAIR(dw, is_root ? buf : NULL, bytes, buf, bytes, hs, hr);
  if (!is_root) stage_add(dw, buf, hr, bytes);
  return stage_end(dw, weft_broadcast(mesh, dim, hr, count, dt, root, work), work);
}

weft_status weft__device_all_to_all(const weft_mesh *mesh, int dim, mesh_dim *g, const void *send,
                                    void *recv, int64_t count, weft_dtype dt, weft_work **work) {
  BACKEND(b);
  size_t es = weft_dtype_size(dt), n = (size_t)g->size, blk = (size_t)count * es;
#if WEFT_HAVE_NCCL
  if (b == WEFT_COMM_NCCL) {
    NCCL_BEGIN(WEFT_COLL_ALL_TO_ALL, false, count, -1, -1, 0, (int64_t)(n * blk), NULL, NULL);
    const char *s = send;
    void *tmp = NULL;
    if (send == recv) { /* in place: send from a stream-ordered copy */
      WEFT_CHECK(
          cuda_check(cudaMallocAsync(&tmp, n * blk, c_.comm), __func__, "cudaMallocAsync", g));
      WEFT_CHECK(cuda_check(cudaMemcpyAsync(tmp, send, n * blk, cudaMemcpyDeviceToDevice, c_.comm),
                            __func__, "cudaMemcpyAsync", g));
      s = tmp;
    }
    NCCL_CALL(ncclGroupStart(), "ncclGroupStart");
    ncclResult_t r = ncclSuccess;
    for (size_t j = 0; j < n && r == ncclSuccess; j++) {
      r = ncclSend(s + j * blk, (size_t)count, nccl_type(dt), (int)j, c_.nc, c_.comm);
      if (r == ncclSuccess)
        r = ncclRecv((char *)recv + j * blk, (size_t)count, nccl_type(dt), (int)j, c_.nc, c_.comm);
    }
    ncclResult_t e = ncclGroupEnd();
    if (tmp) cudaFreeAsync(tmp, c_.comm);
    NCCL_CALL(r, "ncclSend/ncclRecv");
    NCCL_CALL(e, "ncclGroupEnd");
    NCCL_END();
  }
#endif
  STAGE_NEW(dw, 1);
  const void *hs;
  void *hr;
  STAGE_PAIR(dw, send, n * blk, recv, n * blk, hs, hr);
  stage_add(dw, recv, hr, n * blk);
  return stage_end(dw, weft_all_to_all(mesh, dim, hs, hr, count, dt, work), work);
}

weft_status weft__device_all_to_all_v(const weft_mesh *mesh, int dim, mesh_dim *g, const void *send,
                                      const int64_t *send_counts, const int64_t *send_displs,
                                      void *recv, const int64_t *recv_counts,
                                      const int64_t *recv_displs, weft_dtype dt, weft_work **work) {
  BACKEND(b);
  size_t es = weft_dtype_size(dt);
  int n = g->size;
  int64_t stotal = 0, send_end = 0, recv_end = 0;
  for (int i = 0; i < n; i++) {
    stotal += send_counts[i];
    if (send_counts[i] && send_displs[i] + send_counts[i] > send_end)
      send_end = send_displs[i] + send_counts[i];
    if (recv_counts[i] && recv_displs[i] + recv_counts[i] > recv_end)
      recv_end = recv_displs[i] + recv_counts[i];
  }
#if WEFT_HAVE_NCCL
  if (b == WEFT_COMM_NCCL) {
    NCCL_BEGIN(WEFT_COLL_ALL_TO_ALL, true, -1, -1, -1, 0, stotal * (int64_t)es, send_counts,
               recv_counts);
    NCCL_CALL(ncclGroupStart(), "ncclGroupStart");
    ncclResult_t r = ncclSuccess;
    for (int j = 0; j < n && r == ncclSuccess; j++) {
      if (send_counts[j] > 0)
        r = ncclSend((const char *)send + (size_t)send_displs[j] * es, (size_t)send_counts[j],
                     nccl_type(dt), j, c_.nc, c_.comm);
      if (r == ncclSuccess && recv_counts[j] > 0)
        r = ncclRecv((char *)recv + (size_t)recv_displs[j] * es, (size_t)recv_counts[j],
                     nccl_type(dt), j, c_.nc, c_.comm);
    }
    ncclResult_t e = ncclGroupEnd();
    NCCL_CALL(r, "ncclSend/ncclRecv");
    NCCL_CALL(e, "ncclGroupEnd");
    NCCL_END();
  }
#else
  (void)stotal;
#endif
  STAGE_NEW(dw, n);
  const void *hs;
  void *hr;
  STAGE_PAIR(dw, send, (size_t)send_end * es, recv, (size_t)recv_end * es, hs, hr);
  /* only the received pieces come back (gaps in recv stay as they were) */
  for (int i = 0; i < n; i++)
    if (recv_counts[i] > 0)
      stage_add(dw, (char *)recv + (size_t)recv_displs[i] * es,
                (const char *)hr + (size_t)recv_displs[i] * es, (size_t)recv_counts[i] * es);
  return stage_end(dw,
                   weft_all_to_all_v(mesh, dim, hs, send_counts, send_displs, hr, recv_counts,
                                     recv_displs, dt, work),
                   work);
}
