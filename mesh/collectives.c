/* Collectives over one mesh dim, on MPI's nonblocking collectives.
 *
 * Every call goes: resolve the group -> check the arguments (locally) ->
 * take a sequence number and account -> (WEFT_DEBUG) compare fingerprints
 * -> post the MPI_I* call -> return a handle (async) or wait with backoff
 * and timeout (blocking). AVG is SUM, then a division by the group size
 * when the request completes. bf16/f16 move as MPI_UINT16_T and reduce
 * with the user ops made at weft_init.
 *
 * Counts are int64. A block larger than WEFT_CHUNK_BYTES (default 1 GiB)
 * is posted as several MPI calls, one per chunk of every block, all in
 * flight at once: contiguous pieces for all-reduce and broadcast; for
 * all-gather, reduce-scatter and all-to-all a datatype of `len` elements
 * resized to the block's extent (count * elem size), so that one "element"
 * of it addresses the same chunk in every rank's block. This keeps every
 * count an int and every message below 2 GiB: MPICH 4.0.2's nonblocking
 * large-count calls fail (MPI_Ibcast_c of INT_MAX + 77 bytes on 2 ranks:
 * "Invalid communicator" from the schedule). The _v collectives take int
 * counts and displacements: above INT_MAX they are unsupported.
 */
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device_comm.h"
#include "mesh_internal.h"

/* note: MPICH's mpi.h marks the status arguments with access attributes,
 * and gcc 12 then flags MPI_STATUSES_IGNORE (a null pointer constant) as
 * a zero-size region. */
#pragma GCC diagnostic ignored "-Wstringop-overflow"

const char *weft_reduce_op_name(weft_reduce_op op) {
  static const char *const n[WEFT_OP_COUNT] = {"sum", "avg", "max", "min"};
  return (unsigned)op < WEFT_OP_COUNT ? n[op] : "?";
}

const char *weft_coll_kind_name(weft_coll_kind kind) {
  static const char *const n[WEFT_COLL_KIND_COUNT] = {"all_gather", "reduce_scatter", "all_reduce",
                                                      "broadcast",  "all_to_all",     "barrier"};
  return (unsigned)kind < WEFT_COLL_KIND_COUNT ? n[kind] : "?";
}

/* --------------------------------------------------------------- types */

static MPI_Datatype mpi_type(weft_dtype dt) {
  switch (dt) {
    case WEFT_F32:
      return MPI_FLOAT;
    case WEFT_F64:
      return MPI_DOUBLE;
    case WEFT_BF16:
    case WEFT_F16:
      return MPI_UINT16_T;
    case WEFT_I32:
      return MPI_INT32_T;
    case WEFT_I64:
      return MPI_INT64_T;
    case WEFT_U8:
      return MPI_UINT8_T;
    default:
      return MPI_DATATYPE_NULL;
  }
}

static MPI_Op mpi_op(weft_dtype dt, weft_reduce_op op) {
  int k = op == WEFT_OP_MAX ? 1 : op == WEFT_OP_MIN ? 2 : 0; /* AVG reduces as SUM */
  if (dt == WEFT_BF16) return weft__rt.ops16[0][k];
  if (dt == WEFT_F16) return weft__rt.ops16[1][k];
  static const MPI_Op builtin[3] = {MPI_SUM, MPI_MAX, MPI_MIN};
  return builtin[k];
}

/* The op for chunked reduce-scatter (resized chunk types). */
static MPI_Op mpi_op_blk(weft_dtype dt, weft_reduce_op op) {
  int k = op == WEFT_OP_MAX ? 1 : op == WEFT_OP_MIN ? 2 : 0;
  return weft__rt.ops_blk[dt][k];
}

/* Divides n elements by the group size g in place (integers truncate). */
static void avg_divide(void *buf, int64_t n, weft_dtype dt, int g) {
  switch (dt) {
    case WEFT_F32: {
      float *x = buf;
      for (int64_t i = 0; i < n; i++) x[i] /= (float)g;
    } break;
    case WEFT_F64: {
      double *x = buf;
      for (int64_t i = 0; i < n; i++) x[i] /= (double)g;
    } break;
    case WEFT_BF16: {
      uint16_t *x = buf;
      for (int64_t i = 0; i < n; i++) x[i] = weft_f32_to_bf16(weft_bf16_to_f32(x[i]) / (float)g);
    } break;
    case WEFT_F16: {
      uint16_t *x = buf;
      for (int64_t i = 0; i < n; i++) x[i] = weft_f32_to_f16(weft_f16_to_f32(x[i]) / (float)g);
    } break;
    case WEFT_I32: {
      int32_t *x = buf;
      for (int64_t i = 0; i < n; i++) x[i] /= g;
    } break;
    case WEFT_I64: {
      int64_t *x = buf;
      for (int64_t i = 0; i < n; i++) x[i] /= g;
    } break;
    case WEFT_U8: {
      uint8_t *x = buf;
      for (int64_t i = 0; i < n; i++) x[i] = (uint8_t)(x[i] / g);
    } break;
    default:
      break;
  }
}

/* ---------------------------------------------------------- checking */

static char dummy_buf[64] __attribute__((aligned(64)));
/* MPI gets a valid pointer even for empty buffers. */
static void *nz(const void *p) { return p ? (void *)p : dummy_buf; }

static bool overlap(const void *a, size_t an, const void *b, size_t bn) {
  if (!an || !bn) return false;
  uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
  return x < y + bn && y < x + an;
}

static weft_status check_common(const char *func, mesh_dim *g, weft_dtype dt, int64_t count) {
  WEFT_CHECK(weft__require_init(func));
  if ((unsigned)dt >= WEFT_DTYPE_COUNT)
    return weft_error_at(WEFT_ERR_INVALID, func, "invalid dtype %d", (int)dt);
  if (count < 0) return weft_error_at(WEFT_ERR_INVALID, func, "count %" PRId64 " < 0", count);
  if (g->broken)
    return weft_error_at(WEFT_ERR_STATE, func, "mesh dim '%s' is unusable: %s", g->name,
                         g->broken_msg);
  return WEFT_OK;
}

static weft_status check_op(const char *func, weft_reduce_op op) {
  if ((unsigned)op >= WEFT_OP_COUNT)
    return weft_error_at(WEFT_ERR_INVALID, func, "invalid reduce op %d", (int)op);
  return WEFT_OK;
}

static weft_status check_buf(const char *func, const char *what, const void *p, int64_t bytes) {
  if (bytes > 0 && !p)
    return weft_error_at(WEFT_ERR_INVALID, func, "%s is NULL with %" PRId64 " bytes to move", what,
                         bytes);
  return WEFT_OK;
}

/* ------------------------------------------------------------ running */

static weft_fingerprint fp_make(mesh_dim *g, int dim_id, weft_coll_kind kind, bool v, weft_dtype dt,
                                int64_t count, int op, int root) {
  weft_fingerprint fp = {WEFT_FP_MAGIC, kind, v, dim_id, dt, count, op, root, 0, 0};
  fp.seq = (int64_t)++g->seq;
  return fp;
}

static int group_index(const weft_mesh *root, const mesh_dim *g) {
  if (g == &root->whole) return -1;
  for (int i = 0; i < root->ndims_all; i++)
    if (root->dims[i] == g) return i;
  return -2;
}

static weft_status mpi_posted(int rc, const char *func, const char *call, mesh_dim *g) {
  if (rc == MPI_SUCCESS) return WEFT_OK;
  char s[MPI_MAX_ERROR_STRING] = "";
  int len = 0;
  MPI_Error_string(rc, s, &len);
  return weft_error_at(WEFT_ERR_MPI, func, "%s on mesh dim '%s' failed: %s", call, g->name, s);
}

/* Runs the post-completion step and releases what the work holds. */
static void free_types(weft_work *w) {
  /* note: freeing a datatype that a pending operation uses is allowed;
   * MPI keeps it until the operation completes (MPI-4.0 §5.1.5). */
  for (int i = 0; i < w->ntypes; i++) MPI_Type_free(&w->types[i]);
  w->ntypes = 0;
}

static void work_complete(weft_work *w) {
  free_types(w);
  if (w->avg_buf && w->avg_count > 0)
    avg_divide(w->avg_buf, w->avg_count, w->avg_dt, w->group->size);
  free(w->owned);
  w->owned = NULL;
  if (w->reqs != w->reqs_inline) free(w->reqs);
  w->reqs = NULL;
  if (w->async) w->root->inflight--;
}

/* Releases a work whose requests may still be active (timeout / error):
 * the buffers MPI may still read are leaked on purpose. */
static void work_abandon(weft_work *w) {
  free_types(w);
  bool active = false;
  for (int i = 0; i < w->nreq; i++) active |= w->reqs[i] != MPI_REQUEST_NULL;
  if (!active) free(w->owned);
  if (w->reqs != w->reqs_inline) free(w->reqs);
  w->reqs = NULL;
  if (w->async) w->root->inflight--;
}

static weft_status work_timeout(weft_work *w, double waited) {
  char desc[256], members[256];
  weft__fingerprint_describe(&w->fp, desc, sizeof desc);
  weft__format_ranks(w->group->members, w->group->size, members, sizeof members);
  mesh_dim *g = w->group;
  g->broken = true;
  snprintf(g->broken_msg, sizeof g->broken_msg, "%.160s timed out", desc);
  if (weft__rt.settings.debug) {
    /* everyone arrived, so no one to name: still tell the others that
     * this rank is stuck (debug.c, notices) */
    char what[200];
    snprintf(what, sizeof what, "%.120s on mesh dim '%.31s' (after all arrived)", desc, g->name);
    (void)weft__notice_resolve(NULL, 0, what, NULL, 0, NULL, 0);
  }
  work_abandon(w);
  return weft_error(WEFT_ERR_TIMEOUT,
                    "%s on mesh dim '%s' did not complete within %g s (group: world ranks %s)%s",
                    desc, g->name, waited, members,
                    weft__rt.settings.debug
                        ? "; every rank passed the debug fingerprint check, so all arrived"
                        : "; run with WEFT_DEBUG=1 to learn which ranks never arrived");
}

static weft_status work_wait_internal(weft_work *w) {
  weft_status st = weft__wait_all_sized(w->nreq, w->reqs, weft__rt.settings.timeout_s, w->bytes);
  if (st == WEFT_ERR_TIMEOUT) return work_timeout(w, weft__rt.settings.timeout_s);
  if (st != WEFT_OK) {
    work_abandon(w);
    return weft_error_trace(st, __func__);
  }
  work_complete(w);
  return WEFT_OK;
}

/* Either hands the posted work to the caller or waits for it here. The
 * work lives on the caller's stack until then. */
static weft_status finish(weft_work *w, weft_work **out) {
  if (!out) {
    weft_status st = work_wait_internal(w);
    weft__account_seconds(w->group, w->fp.kind, weft__now() - w->t0);
    return st;
  }
  weft_work *h = malloc(sizeof *h);
  if (!h) {
    /* cannot hand it out: complete it now instead */
    weft_status st = work_wait_internal(w);
    weft__account_seconds(w->group, w->fp.kind, weft__now() - w->t0);
    if (st) return st;
    return weft_error(WEFT_ERR_OOM, "no memory for a work handle (the collective completed)");
  }
  *h = *w;
  if (w->reqs == w->reqs_inline) h->reqs = h->reqs_inline;
  h->async = true;
  h->root->inflight++;
  *out = h;
  weft__account_seconds(w->group, w->fp.kind, weft__now() - w->t0); /* posting */
  return WEFT_OK;
}

weft_status weft__work_wait_host(weft_work *w) { return work_wait_internal(w); }

weft_status weft_work_wait(weft_work *work) {
  if (!work) return WEFT_OK;
  double t0 = weft__now();
  mesh_dim *g = work->group; /* outlives the work: the root cannot be destroyed meanwhile */
  int64_t kind = work->fp.kind;
  weft_status st = work->dev ? weft__device_work_wait(work) : work_wait_internal(work);
  free(work);
  weft__account_seconds(g, kind, weft__now() - t0);
  return st;
}

weft_status weft__work_test_host(weft_work *work, bool *done) {
  *done = false;
  int flag = 0;
  if (MPI_Testall(work->nreq, work->reqs, &flag, MPI_STATUSES_IGNORE) != MPI_SUCCESS) {
    weft_status st =
        weft_error(WEFT_ERR_MPI, "MPI_Testall failed on mesh dim '%s'", work->group->name);
    work_abandon(work);
    *done = true;
    return st;
  }
  if (!flag) return WEFT_OK;
  work_complete(work);
  *done = true;
  return WEFT_OK;
}

weft_status weft_work_test(weft_work *work, bool *done) {
  if (!done) return weft_error(WEFT_ERR_INVALID, "done is NULL");
  *done = false;
  if (!work) {
    *done = true;
    return WEFT_OK;
  }
  double t0 = weft__now();
  mesh_dim *g = work->group;
  int64_t kind = work->fp.kind;
  weft_status st =
      work->dev ? weft__device_work_test(work, done) : weft__work_test_host(work, done);
  if (*done) free(work);
  weft__account_seconds(g, kind, weft__now() - t0);
  return st;
}

/* Before a blocking collective of at least WEFT_PRESYNC_BYTES on a group
 * that spans nodes and has their links to itself (it holds every rank of
 * each of its nodes), the group meets in a barrier first.
 *
 * Why: over TCP (MPICH ch4:ucx) a large message goes by rendezvous: the
 * sender's request-to-send is answered by the receiver before the data
 * moves. When the ranks of a pair enter a collective at different moments,
 * the first to get its answer fills its one TCP connection with data, and
 * its own answer to the peer's request waits behind that data in the same
 * stream: the two directions, meant to run at once, run one after the
 * other. Measured (2 emulated nodes x 1 rank, 200 Mbit/s, weft-train
 * dp_replicate=2, 803840-byte all-reduces at the end of backward): 49.5 ms
 * per all-reduce without the barrier, 33.7 ms with it (the same call back
 * to back: 33.7 ms), step 141 -> 107 ms (bench/presync.sh: x1.18-1.31),
 * and on 2 nodes x 2 ranks dp_replicate=4 steps of 167-192 ms against
 * 181-191 ms without (6 runs each). When other groups of the dim share the
 * nodes' links (HSDP's replicate groups {0,2} and {1,3} on 2 x 2), their
 * data keeps the links busy and the barrier's own messages queue behind
 * it: HSDP's median step went 148 -> 154 ms (6 runs each; 0.89-0.96x in
 * three more comparisons), so those groups skip it. Inside a node, for
 * smaller payloads and for async calls it is skipped too. */
static weft_status presync(weft_work *w) {
  int64_t min = weft__rt.settings.presync_bytes;
  mesh_dim *g = w->group;
  if (min <= 0 || g->nodes <= 1 || !g->whole_nodes || w->bytes < min) return WEFT_OK;
  int rc = MPI_Ibarrier(g->comm, &w->reqs[0]);
  if (rc != MPI_SUCCESS) return mpi_posted(rc, __func__, "MPI_Ibarrier", g);
  weft_status st = weft__wait_all(1, w->reqs, weft__rt.settings.timeout_s);
  if (st == WEFT_ERR_TIMEOUT) return work_timeout(w, weft__rt.settings.timeout_s);
  if (st != WEFT_OK) work_abandon(w);
  return st;
}

/* Prepares w for the group; returns the debug-check status. A blocking
 * call (the caller waits for it) may first meet the group (presync). */
static weft_status begin(weft_work *w, const weft_mesh *mesh, mesh_dim *g,
                         const weft_fingerprint *fp, const int64_t *pair_send,
                         const int64_t *pair_recv, bool blocking) {
  memset(w, 0, sizeof *w);
  w->t0 = weft__now();
  w->root = mesh->root;
  w->group = g;
  w->fp = *fp;
  w->reqs = w->reqs_inline;
  w->nreq = 1;
  for (int i = 0; i < WORK_INLINE_REQS; i++) w->reqs_inline[i] = MPI_REQUEST_NULL;
  if (fp->count > 0 && fp->dtype >= 0) {
    int64_t b = fp->count * (int64_t)weft_dtype_size((weft_dtype)fp->dtype);
    bool blocks =
        !fp->vflag && (fp->kind == WEFT_COLL_ALL_GATHER || fp->kind == WEFT_COLL_REDUCE_SCATTER ||
                       fp->kind == WEFT_COLL_ALL_TO_ALL);
    w->bytes = blocks ? b * g->size : b;
  }
  if (weft__rt.settings.debug && g->size > 1)
    WEFT_CHECK(weft__debug_check(g, fp, pair_send, pair_recv));
  else if (weft__rt.settings.debug && pair_send && pair_send[0] != pair_recv[0])
    return weft_error(WEFT_ERR_MISMATCH,
                      "all_to_all_v on mesh dim '%s': sends %" PRId64
                      " to itself but expects %" PRId64,
                      g->name, pair_send[0], pair_recv[0]);
  return blocking ? presync(w) : WEFT_OK;
}

weft_status weft__coll_start(weft_work *w, const weft_mesh *mesh, mesh_dim *g, weft_coll_kind kind,
                             bool v, weft_dtype dt, int64_t count, int op, int root, int64_t extra,
                             int64_t payload, const int64_t *pair_send, const int64_t *pair_recv) {
  weft_fingerprint fp = fp_make(g, group_index(mesh->root, g), kind, v, dt, count, op, root);
  fp.extra = extra;
  weft__account(g, kind, payload);
  weft_status st = begin(w, mesh, g, &fp, pair_send, pair_recv, false);
  w->nreq = 0; /* the caller posts its own work */
  return st;
}

/* ------------------------------------------------------------ chunking */

/* Elements per chunk of dtype dt (WEFT_CHUNK_BYTES / element size). */
static int64_t chunk_elems(weft_dtype dt) {
  int64_t c = weft__rt.settings.chunk_bytes / (int64_t)weft_dtype_size(dt);
  if (c > INT_MAX) c = INT_MAX;
  return c < 1 ? 1 : c;
}

/* Room for n requests in w. */
static weft_status work_reqs(weft_work *w, int64_t n) {
  if (n > INT_MAX / 2) return weft_error(WEFT_ERR_UNSUPPORTED, "%" PRId64 " chunks", n);
  if (n > WORK_INLINE_REQS) {
    w->reqs = malloc((size_t)n * sizeof *w->reqs);
    if (!w->reqs) {
      w->reqs = w->reqs_inline;
      return weft_error(WEFT_ERR_OOM, "no memory for %" PRId64 " requests", n);
    }
  }
  for (int64_t i = 0; i < n; i++) w->reqs[i] = MPI_REQUEST_NULL;
  w->nreq = (int)n;
  return WEFT_OK;
}

/* Error after `posted` requests went out: let those finish, then report. */
static weft_status post_failed(weft_work *w, int posted, int rc, const char *func,
                               const char *call) {
  weft__wait_all(posted, w->reqs, weft__rt.settings.timeout_s);
  free_types(w);
  if (w->reqs != w->reqs_inline) free(w->reqs);
  w->reqs = w->reqs_inline;
  return mpi_posted(rc, func, call, w->group);
}

/* Datatype for a chunk of `len` elements inside a block of `count`:
 * contiguous, resized to the block's extent so that item j of it is the
 * same chunk of block j. Owned by w. */
static int chunk_type(weft_work *w, MPI_Datatype base, int64_t len, int64_t count, size_t es,
                      MPI_Datatype *out) {
  MPI_Datatype c;
  int rc = MPI_Type_contiguous((int)len, base, &c);
  if (rc != MPI_SUCCESS) return rc;
  rc = MPI_Type_create_resized(c, 0, (MPI_Aint)((size_t)count * es), out);
  MPI_Type_free(&c);
  if (rc != MPI_SUCCESS) return rc;
  rc = MPI_Type_commit(out);
  w->types[w->ntypes++] = *out;
  return rc;
}

typedef enum { BLK_ALL_GATHER, BLK_REDUCE_SCATTER, BLK_ALL_TO_ALL } blk_kind;

/* Posts an all-gather / reduce-scatter / all-to-all of n blocks of `count`
 * elements: one MPI call, or one per chunk when a block is larger than a
 * chunk (see the top of this file). sbuf may be MPI_IN_PLACE. */
static weft_status post_blocks(weft_work *w, blk_kind k, const void *sbuf, void *recv,
                               int64_t count, weft_dtype dt, MPI_Op op, const char *func) {
  static const char *const call[3] = {"MPI_Iallgather", "MPI_Ireduce_scatter_block",
                                      "MPI_Ialltoall"};
  MPI_Comm comm = w->group->comm;
  MPI_Datatype t = mpi_type(dt);
  bool inplace = sbuf == MPI_IN_PLACE;
  const void *s0 = inplace ? MPI_IN_PLACE : nz(sbuf);
  int64_t ch = chunk_elems(dt);
  int rc;
  if (count <= ch) {
    int c = (int)count;
    if (k == BLK_ALL_GATHER)
      rc = MPI_Iallgather(s0, c, t, nz(recv), c, t, comm, &w->reqs[0]);
    else if (k == BLK_REDUCE_SCATTER)
      rc = MPI_Ireduce_scatter_block(s0, nz(recv), c, t, op, comm, &w->reqs[0]);
    else
      rc = MPI_Ialltoall(s0, c, t, nz(recv), c, t, comm, &w->reqs[0]);
    return rc == MPI_SUCCESS ? WEFT_OK : mpi_posted(rc, func, call[k], w->group);
  }
  int64_t nchunk = (count + ch - 1) / ch, last = count - (nchunk - 1) * ch;
  WEFT_CHECK(work_reqs(w, nchunk));
  size_t es = weft_dtype_size(dt);
  MPI_Datatype full, tail;
  rc = chunk_type(w, t, ch, count, es, &full);
  if (rc == MPI_SUCCESS) {
    tail = full;
    if (last != ch) rc = chunk_type(w, t, last, count, es, &tail);
  }
  if (rc != MPI_SUCCESS) return post_failed(w, 0, rc, func, "MPI_Type_create_resized");
  for (int64_t c = 0; c < nchunk; c++) {
    size_t off = (size_t)(c * ch) * es;
    int len = (int)(c == nchunk - 1 ? last : ch);
    MPI_Datatype T = c == nchunk - 1 ? tail : full;
    const void *s = inplace ? MPI_IN_PLACE : (const char *)sbuf + off;
    char *r = (char *)recv + off;
    if (k == BLK_ALL_GATHER)
      rc = MPI_Iallgather(s, len, t, r, 1, T, comm, &w->reqs[c]);
    else if (k == BLK_REDUCE_SCATTER)
      rc = MPI_Ireduce_scatter_block(s, r, 1, T, op, comm, &w->reqs[c]);
    else
      rc = MPI_Ialltoall(s, 1, T, r, 1, T, comm, &w->reqs[c]);
    if (rc != MPI_SUCCESS) return post_failed(w, (int)c, rc, func, call[k]);
  }
  return WEFT_OK;
}

/* Posts a contiguous all-reduce or broadcast, in chunks if large. */
static weft_status post_flat(weft_work *w, bool bcast, const void *send, void *recv, int64_t count,
                             weft_dtype dt, MPI_Op op, int root, const char *func) {
  int64_t ch = chunk_elems(dt);
  int64_t nchunk = count <= ch ? 1 : (count + ch - 1) / ch;
  if (nchunk > 1) WEFT_CHECK(work_reqs(w, nchunk));
  size_t es = weft_dtype_size(dt);
  MPI_Datatype t = mpi_type(dt);
  for (int64_t c = 0; c < nchunk; c++) {
    size_t off = (size_t)(c * ch) * es;
    int len = (int)(c == nchunk - 1 ? count - c * ch : ch);
    char *r = (char *)nz(recv) + off;
    int rc;
    if (bcast) {
      rc = MPI_Ibcast(r, len, t, root, w->group->comm, &w->reqs[c]);
    } else {
      const void *s = send == MPI_IN_PLACE ? MPI_IN_PLACE : (const char *)nz(send) + off;
      rc = MPI_Iallreduce(s, r, len, t, op, w->group->comm, &w->reqs[c]);
    }
    if (rc != MPI_SUCCESS)
      return post_failed(w, (int)c, rc, func, bcast ? "MPI_Ibcast" : "MPI_Iallreduce");
  }
  return WEFT_OK;
}

/* Device buffers (see mesh.h): after the local checks, a call whose
 * buffers are device memory goes to device_comm.c (NCCL, or MPI with host
 * staging); host and device mixed is WEFT_ERR_INVALID naming which. */
#define DEVICE_ROUTE(a, abytes, b, bbytes, call)                                              \
  do {                                                                                        \
    bool on_dev_ = false;                                                                     \
    WEFT_CHECK(weft__device_route(__func__, #a, (a), (abytes), #b, (b), (bbytes), &on_dev_)); \
    if (on_dev_) return (call);                                                               \
  } while (0)

/* ------------------------------------------------------------- public */

weft_status weft_all_gather(const weft_mesh *mesh, int dim, const void *send, void *recv,
                            int64_t count, weft_dtype dt, weft_work **work) {
  if (work) *work = NULL;
  mesh_dim *g = weft__mesh_group(mesh, dim, __func__);
  if (!g) return weft_last_status();
  WEFT_CHECK(check_common(__func__, g, dt, count));
  int64_t es = (int64_t)weft_dtype_size(dt), n = g->size;
  WEFT_CHECK(check_buf(__func__, "send", send, count * es));
  WEFT_CHECK(check_buf(__func__, "recv", recv, n * count * es));
  const void *sbuf = send;
  if (count > 0 && send == (const char *)recv + (int64_t)g->coord * count * es)
    sbuf = MPI_IN_PLACE; /* this rank's block already sits in place */
  else if (overlap(send, (size_t)(count * es), recv, (size_t)(n * count * es)))
    return weft_error(WEFT_ERR_INVALID,
                      "send overlaps recv (in place means send == recv + "
                      "coord * count, coord %d)",
                      g->coord);
  DEVICE_ROUTE(send, count * es, recv, n * count * es,
               weft__device_all_gather(mesh, dim, g, send, recv, count, dt, work));
  weft_fingerprint fp =
      fp_make(g, group_index(mesh->root, g), WEFT_COLL_ALL_GATHER, false, dt, count, -1, -1);
  weft__account(g, WEFT_COLL_ALL_GATHER, n * count * es);
  weft_work w;
  WEFT_CHECK(begin(&w, mesh, g, &fp, NULL, NULL, !work));
  WEFT_CHECK(post_blocks(&w, BLK_ALL_GATHER, sbuf, recv, count, dt, MPI_OP_NULL, __func__));
  WEFT_CHECK(finish(&w, work));
  return WEFT_OK;
}

weft_status weft_all_gather_v(const weft_mesh *mesh, int dim, const void *send, void *recv,
                              const int64_t *counts, weft_dtype dt, weft_work **work) {
  if (work) *work = NULL;
  mesh_dim *g = weft__mesh_group(mesh, dim, __func__);
  if (!g) return weft_last_status();
  WEFT_CHECK(check_common(__func__, g, dt, 0));
  if (!counts) return weft_error(WEFT_ERR_INVALID, "counts is NULL");
  int n = g->size;
  int64_t es = (int64_t)weft_dtype_size(dt), total = 0;
  bool big = false;
  uint64_t h = 1469598103934665603ull;
  for (int i = 0; i < n; i++) {
    if (counts[i] < 0)
      return weft_error(WEFT_ERR_INVALID, "counts[%d] = %" PRId64 " < 0", i, counts[i]);
    total += counts[i];
    big |= counts[i] > INT_MAX || total > INT_MAX;
    h = (h ^ (uint64_t)counts[i]) * 1099511628211ull;
  }
  if (big)
    return weft_error(WEFT_ERR_UNSUPPORTED,
                      "all_gather_v with counts or displacements above "
                      "INT_MAX (total %" PRId64 " elements)",
                      total);
  int64_t mine = counts[g->coord];
  WEFT_CHECK(check_buf(__func__, "send", send, mine * es));
  WEFT_CHECK(check_buf(__func__, "recv", recv, total * es));
  /* displacement of this rank's block */
  int64_t off = 0;
  for (int i = 0; i < g->coord; i++) off += counts[i];
  const void *sbuf = send;
  if (mine > 0 && send == (const char *)recv + off * es)
    sbuf = MPI_IN_PLACE;
  else if (overlap(send, (size_t)(mine * es), recv, (size_t)(total * es)))
    return weft_error(WEFT_ERR_INVALID,
                      "send overlaps recv (in place means send == recv + "
                      "sum(counts[0..coord)))");
  DEVICE_ROUTE(send, mine * es, recv, total * es,
               weft__device_all_gather_v(mesh, dim, g, send, recv, counts, dt, work));
  /* MPI reads counts/displs until completion: keep our own copies. */
  void *arr = malloc((size_t)n * 2 * sizeof(int) + 1);
  if (!arr) return weft_error(WEFT_ERR_OOM, "no memory for %d counts", n);
  weft_fingerprint fp =
      fp_make(g, group_index(mesh->root, g), WEFT_COLL_ALL_GATHER, true, dt, total, -1, -1);
  fp.extra = (int64_t)h;
  weft__account(g, WEFT_COLL_ALL_GATHER, total * es);
  weft_work w;
  weft_status st = begin(&w, mesh, g, &fp, NULL, NULL, !work);
  if (st) {
    free(arr);
    return weft_error_trace(st, __func__);
  }
  w.owned = arr;
  MPI_Datatype t = mpi_type(dt);
  int *c = arr, *d = c + n;
  for (int i = 0; i < n; i++) {
    c[i] = (int)counts[i];
    d[i] = i ? d[i - 1] + c[i - 1] : 0;
  }
  int rc = MPI_Iallgatherv(sbuf == MPI_IN_PLACE ? sbuf : nz(sbuf), (int)mine, t, nz(recv), c, d, t,
                           g->comm, &w.reqs[0]);
  if (rc != MPI_SUCCESS) free(arr);
  WEFT_CHECK(mpi_posted(rc, __func__, "MPI_Iallgatherv", g));
  WEFT_CHECK(finish(&w, work));
  return WEFT_OK;
}

weft_status weft_reduce_scatter(const weft_mesh *mesh, int dim, const void *send, void *recv,
                                int64_t count, weft_dtype dt, weft_reduce_op op, weft_work **work) {
  if (work) *work = NULL;
  mesh_dim *g = weft__mesh_group(mesh, dim, __func__);
  if (!g) return weft_last_status();
  WEFT_CHECK(check_common(__func__, g, dt, count));
  WEFT_CHECK(check_op(__func__, op));
  int64_t es = (int64_t)weft_dtype_size(dt), n = g->size;
  WEFT_CHECK(check_buf(__func__, "send", send, n * count * es));
  WEFT_CHECK(check_buf(__func__, "recv", recv, count * es));
  const void *sbuf = send;
  if (count > 0 && send == recv)
    sbuf = MPI_IN_PLACE; /* MPI's in-place: input in recv (n*count), result at its start */
  else if (overlap(send, (size_t)(n * count * es), recv, (size_t)(count * es)))
    return weft_error(WEFT_ERR_INVALID, "send overlaps recv (in place means send == recv)");
  DEVICE_ROUTE(send, n * count * es, recv, count * es,
               weft__device_reduce_scatter(mesh, dim, g, send, recv, count, dt, op, work));
  weft_fingerprint fp =
      fp_make(g, group_index(mesh->root, g), WEFT_COLL_REDUCE_SCATTER, false, dt, count, op, -1);
  weft__account(g, WEFT_COLL_REDUCE_SCATTER, n * count * es);
  weft_work w;
  WEFT_CHECK(begin(&w, mesh, g, &fp, NULL, NULL, !work));
  if (op == WEFT_OP_AVG) {
    w.avg_buf = recv;
    w.avg_count = count;
    w.avg_dt = dt;
  }
  MPI_Op mop = count > chunk_elems(dt) ? mpi_op_blk(dt, op) : mpi_op(dt, op);
  WEFT_CHECK(post_blocks(&w, BLK_REDUCE_SCATTER, sbuf, recv, count, dt, mop, __func__));
  WEFT_CHECK(finish(&w, work));
  return WEFT_OK;
}

weft_status weft_all_reduce(const weft_mesh *mesh, int dim, const void *send, void *recv,
                            int64_t count, weft_dtype dt, weft_reduce_op op, weft_work **work) {
  if (work) *work = NULL;
  mesh_dim *g = weft__mesh_group(mesh, dim, __func__);
  if (!g) return weft_last_status();
  WEFT_CHECK(check_common(__func__, g, dt, count));
  WEFT_CHECK(check_op(__func__, op));
  int64_t es = (int64_t)weft_dtype_size(dt);
  WEFT_CHECK(check_buf(__func__, "send", send, count * es));
  WEFT_CHECK(check_buf(__func__, "recv", recv, count * es));
  bool in_place = send == recv;
  if (!in_place && overlap(send, (size_t)(count * es), recv, (size_t)(count * es)))
    return weft_error(WEFT_ERR_INVALID, "send overlaps recv (in place means send == recv)");
  DEVICE_ROUTE(send, count * es, recv, count * es,
               weft__device_all_reduce(mesh, dim, g, send, recv, count, dt, op, work));
  weft_fingerprint fp =
      fp_make(g, group_index(mesh->root, g), WEFT_COLL_ALL_REDUCE, false, dt, count, op, -1);
  weft__account(g, WEFT_COLL_ALL_REDUCE, count * es);
  weft_work w;
  WEFT_CHECK(begin(&w, mesh, g, &fp, NULL, NULL, !work));
  if (op == WEFT_OP_AVG) {
    w.avg_buf = recv;
    w.avg_count = count;
    w.avg_dt = dt;
  }
  WEFT_CHECK(post_flat(&w, false, in_place ? MPI_IN_PLACE : send, recv, count, dt, mpi_op(dt, op),
                       -1, __func__));
  WEFT_CHECK(finish(&w, work));
  return WEFT_OK;
}

weft_status weft_broadcast(const weft_mesh *mesh, int dim, void *buf, int64_t count, weft_dtype dt,
                           int root, weft_work **work) {
  if (work) *work = NULL;
  mesh_dim *g = weft__mesh_group(mesh, dim, __func__);
  if (!g) return weft_last_status();
  WEFT_CHECK(check_common(__func__, g, dt, count));
  if (root < 0 || root >= g->size)
    return weft_error(WEFT_ERR_INVALID, "root %d outside 0..%d (mesh dim '%s')", root, g->size - 1,
                      g->name);
  int64_t es = (int64_t)weft_dtype_size(dt);
  WEFT_CHECK(check_buf(__func__, "buf", buf, count * es));
  DEVICE_ROUTE(buf, count * es, NULL, 0,
               weft__device_broadcast(mesh, dim, g, buf, count, dt, root, work));
  weft_fingerprint fp =
      fp_make(g, group_index(mesh->root, g), WEFT_COLL_BROADCAST, false, dt, count, -1, root);
  weft__account(g, WEFT_COLL_BROADCAST, count * es);
  weft_work w;
  WEFT_CHECK(begin(&w, mesh, g, &fp, NULL, NULL, !work));
  WEFT_CHECK(post_flat(&w, true, NULL, buf, count, dt, MPI_OP_NULL, root, __func__));
  WEFT_CHECK(finish(&w, work));
  return WEFT_OK;
}

weft_status weft_all_to_all(const weft_mesh *mesh, int dim, const void *send, void *recv,
                            int64_t count, weft_dtype dt, weft_work **work) {
  if (work) *work = NULL;
  mesh_dim *g = weft__mesh_group(mesh, dim, __func__);
  if (!g) return weft_last_status();
  WEFT_CHECK(check_common(__func__, g, dt, count));
  int64_t es = (int64_t)weft_dtype_size(dt), n = g->size;
  WEFT_CHECK(check_buf(__func__, "send", send, n * count * es));
  WEFT_CHECK(check_buf(__func__, "recv", recv, n * count * es));
  const void *sbuf = send;
  if (count > 0 && send == recv)
    sbuf = MPI_IN_PLACE;
  else if (overlap(send, (size_t)(n * count * es), recv, (size_t)(n * count * es)))
    return weft_error(WEFT_ERR_INVALID, "send overlaps recv (in place means send == recv)");
  DEVICE_ROUTE(send, n * count * es, recv, n * count * es,
               weft__device_all_to_all(mesh, dim, g, send, recv, count, dt, work));
  weft_fingerprint fp =
      fp_make(g, group_index(mesh->root, g), WEFT_COLL_ALL_TO_ALL, false, dt, count, -1, -1);
  weft__account(g, WEFT_COLL_ALL_TO_ALL, n * count * es);
  weft_work w;
  WEFT_CHECK(begin(&w, mesh, g, &fp, NULL, NULL, !work));
  WEFT_CHECK(post_blocks(&w, BLK_ALL_TO_ALL, sbuf, recv, count, dt, MPI_OP_NULL, __func__));
  WEFT_CHECK(finish(&w, work));
  return WEFT_OK;
}

weft_status weft_all_to_all_v(const weft_mesh *mesh, int dim, const void *send,
                              const int64_t *send_counts, const int64_t *send_displs, void *recv,
                              const int64_t *recv_counts, const int64_t *recv_displs, weft_dtype dt,
                              weft_work **work) {
  if (work) *work = NULL;
  mesh_dim *g = weft__mesh_group(mesh, dim, __func__);
  if (!g) return weft_last_status();
  WEFT_CHECK(check_common(__func__, g, dt, 0));
  if (!send_counts || !send_displs || !recv_counts || !recv_displs)
    return weft_error(WEFT_ERR_INVALID, "a counts or displs array is NULL");
  int n = g->size;
  int64_t es = (int64_t)weft_dtype_size(dt), stotal = 0, send_end = 0, recv_end = 0;
  bool big = false;
  for (int i = 0; i < n; i++) {
    if (send_counts[i] < 0 || recv_counts[i] < 0 || send_displs[i] < 0 || recv_displs[i] < 0)
      return weft_error(WEFT_ERR_INVALID, "negative count or displacement for rank %d", i);
    big |= send_counts[i] > INT_MAX || recv_counts[i] > INT_MAX || send_displs[i] > INT_MAX ||
           recv_displs[i] > INT_MAX;
    stotal += send_counts[i];
    if (send_counts[i] && send_displs[i] + send_counts[i] > send_end)
      send_end = send_displs[i] + send_counts[i];
    if (recv_counts[i] && recv_displs[i] + recv_counts[i] > recv_end)
      recv_end = recv_displs[i] + recv_counts[i];
  }
  if (big)
    return weft_error(WEFT_ERR_UNSUPPORTED,
                      "all_to_all_v with counts or displacements above "
                      "INT_MAX");
  WEFT_CHECK(check_buf(__func__, "send", send, send_end * es));
  WEFT_CHECK(check_buf(__func__, "recv", recv, recv_end * es));
  if (overlap(send, (size_t)(send_end * es), recv, (size_t)(recv_end * es)))
    return weft_error(WEFT_ERR_INVALID, "send overlaps recv (all_to_all_v has no in-place form)");
  DEVICE_ROUTE(send, send_end * es, recv, recv_end * es,
               weft__device_all_to_all_v(mesh, dim, g, send, send_counts, send_displs, recv,
                                         recv_counts, recv_displs, dt, work));
  void *arr = malloc((size_t)n * 4 * sizeof(int) + 1);
  if (!arr) return weft_error(WEFT_ERR_OOM, "no memory for %d counts", n);
  weft_fingerprint fp =
      fp_make(g, group_index(mesh->root, g), WEFT_COLL_ALL_TO_ALL, true, dt, -1, -1, -1);
  weft__account(g, WEFT_COLL_ALL_TO_ALL, stotal * es);
  weft_work w;
  weft_status st = begin(&w, mesh, g, &fp, send_counts, recv_counts, !work);
  if (st) {
    free(arr);
    return weft_error_trace(st, __func__);
  }
  w.owned = arr;
  MPI_Datatype t = mpi_type(dt);
  int *sc = arr, *rcn = sc + n, *sd = rcn + n, *rd = sd + n;
  for (int i = 0; i < n; i++) {
    sc[i] = (int)send_counts[i];
    rcn[i] = (int)recv_counts[i];
    sd[i] = (int)send_displs[i];
    rd[i] = (int)recv_displs[i];
  }
  int rc = MPI_Ialltoallv(nz(send), sc, sd, t, nz(recv), rcn, rd, t, g->comm, &w.reqs[0]);
  if (rc != MPI_SUCCESS) free(arr);
  WEFT_CHECK(mpi_posted(rc, __func__, "MPI_Ialltoallv", g));
  WEFT_CHECK(finish(&w, work));
  return WEFT_OK;
}

static weft_status barrier_group(const weft_mesh *mesh, mesh_dim *g, weft_work **work) {
  WEFT_CHECK(check_common("weft_barrier", g, WEFT_U8, 0));
  weft_fingerprint fp =
      fp_make(g, group_index(mesh->root, g), WEFT_COLL_BARRIER, false, -1, -1, -1, -1);
  fp.dtype = -1;
  weft__account(g, WEFT_COLL_BARRIER, 0);
  weft_work w;
  WEFT_CHECK(begin(&w, mesh, g, &fp, NULL, NULL, !work));
  int rc = MPI_Ibarrier(g->comm, &w.reqs[0]);
  WEFT_CHECK(mpi_posted(rc, "weft_barrier", "MPI_Ibarrier", g));
  return finish(&w, work);
}

weft_status weft_barrier(const weft_mesh *mesh, int dim, weft_work **work) {
  if (work) *work = NULL;
  if (!mesh) return weft_error(WEFT_ERR_INVALID, "mesh is NULL");
  if (!weft__mesh_live(mesh))
    return weft_error(WEFT_ERR_INVALID, "the mesh was destroyed (weft_mesh_destroy)");
  if (dim != -1) {
    mesh_dim *g = weft__mesh_group(mesh, dim, __func__);
    if (!g) return weft_last_status();
    WEFT_CHECK(barrier_group(mesh, g, work));
    return WEFT_OK;
  }
  mesh_dim *whole = weft__mesh_whole(mesh);
  if (whole) return barrier_group(mesh, whole, work);
  /* A sub-mesh over some root dims with no communicator of its own: a
   * barrier over each of its dims in turn is a barrier over their product
   * (after dim a every rank knows its a-line arrived; after dim b, that
   * every a-line of its b-line did). Each stage needs the previous one
   * done, so only the blocking form is offered. */
  if (work)
    return weft_error(WEFT_ERR_UNSUPPORTED,
                      "async whole-mesh barrier on a sub-mesh without its own communicator; "
                      "flatten its dims (weft_mesh_flatten) or pass work = NULL");
  for (int d = 0; d < mesh->ndim; d++) {
    mesh_dim *g = weft__mesh_group(mesh, d, __func__);
    WEFT_CHECK(barrier_group(mesh, g, NULL));
  }
  return WEFT_OK;
}
