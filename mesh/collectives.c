/* Collectives over one mesh dim, on MPI's nonblocking collectives.
 *
 * Every call goes: resolve the group -> check the arguments (locally) ->
 * take a sequence number and account -> (WEFT_DEBUG) compare fingerprints
 * -> post the MPI_I* call -> return a handle (async) or wait with backoff
 * and timeout (blocking). AVG is SUM, then a division by the group size
 * when the request completes. bf16/f16 move as MPI_UINT16_T and reduce
 * with the user ops made at weft_init.
 *
 * Counts are int64. A count or displacement above INT_MAX uses the MPI-4
 * large-count (_c) calls; all-reduce is split into chunks instead (so the
 * 16-bit user ops, which take an int length, never see a large count);
 * bf16/f16 reduce-scatter blocks above INT_MAX elements are unsupported.
 */
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
  static const char *const n[WEFT_COLL_KIND_COUNT] = {
      "all_gather", "reduce_scatter", "all_reduce", "broadcast", "all_to_all", "barrier"};
  return (unsigned)kind < WEFT_COLL_KIND_COUNT ? n[kind] : "?";
}

/* All-reduce chunk when count > INT_MAX (a multiple of 64 elements). */
#define BIG_CHUNK ((int64_t)INT_MAX & ~(int64_t)63)

#define WORK_INLINE_REQS 2

struct weft_work {
  weft_mesh *root;
  mesh_dim *group;
  weft_fingerprint fp;       /* what was called, for messages */
  int nreq;
  MPI_Request *reqs;         /* reqs_inline or malloc'd */
  MPI_Request reqs_inline[WORK_INLINE_REQS];
  void *owned;               /* counts/displs MPI reads until completion */
  void *avg_buf;             /* AVG: divide avg_count elements by the group size */
  int64_t avg_count;
  weft_dtype avg_dt;
  bool async;
};

/* --------------------------------------------------------------- types */

static MPI_Datatype mpi_type(weft_dtype dt) {
  switch (dt) {
    case WEFT_F32: return MPI_FLOAT;
    case WEFT_F64: return MPI_DOUBLE;
    case WEFT_BF16:
    case WEFT_F16: return MPI_UINT16_T;
    case WEFT_I32: return MPI_INT32_T;
    case WEFT_I64: return MPI_INT64_T;
    case WEFT_U8: return MPI_UINT8_T;
    default: return MPI_DATATYPE_NULL;
  }
}

static MPI_Op mpi_op(weft_dtype dt, weft_reduce_op op) {
  int k = op == WEFT_OP_MAX ? 1 : op == WEFT_OP_MIN ? 2 : 0; /* AVG reduces as SUM */
  if (dt == WEFT_BF16) return weft__rt.ops16[0][k];
  if (dt == WEFT_F16) return weft__rt.ops16[1][k];
  static const MPI_Op builtin[3] = {MPI_SUM, MPI_MAX, MPI_MIN};
  return builtin[k];
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
    default: break;
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

static weft_fingerprint fp_make(mesh_dim *g, int dim_id, weft_coll_kind kind, bool v,
                                weft_dtype dt, int64_t count, int op, int root) {
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
static void work_complete(weft_work *w) {
  if (w->avg_buf && w->avg_count > 0) avg_divide(w->avg_buf, w->avg_count, w->avg_dt, w->group->size);
  free(w->owned);
  w->owned = NULL;
  if (w->reqs != w->reqs_inline) free(w->reqs);
  w->reqs = NULL;
  if (w->async) w->root->inflight--;
}

/* Releases a work whose requests may still be active (timeout / error):
 * the buffers MPI may still read are leaked on purpose. */
static void work_abandon(weft_work *w) {
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
  work_abandon(w);
  return weft_error(WEFT_ERR_TIMEOUT,
                    "%s on mesh dim '%s' (seq %" PRId64 ") did not complete within %g s "
                    "(group: world ranks %s)%s",
                    desc, g->name, w->fp.seq, waited, members,
                    weft__rt.settings.debug
                        ? "; every rank passed the debug fingerprint check, so all arrived"
                        : "; run with WEFT_DEBUG=1 to learn which ranks never arrived");
}

static weft_status work_wait_internal(weft_work *w) {
  weft_status st = weft__wait_all(w->nreq, w->reqs, weft__rt.settings.timeout_s);
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
  if (!out) return work_wait_internal(w);
  weft_work *h = malloc(sizeof *h);
  if (!h) {
    /* cannot hand it out: complete it now instead */
    weft_status st = work_wait_internal(w);
    if (st) return st;
    return weft_error(WEFT_ERR_OOM, "no memory for a work handle (the collective completed)");
  }
  *h = *w;
  if (w->reqs == w->reqs_inline) h->reqs = h->reqs_inline;
  h->async = true;
  h->root->inflight++;
  *out = h;
  return WEFT_OK;
}

weft_status weft_work_wait(weft_work *work) {
  if (!work) return WEFT_OK;
  weft_status st = work_wait_internal(work);
  free(work);
  return st;
}

weft_status weft_work_test(weft_work *work, bool *done) {
  if (!done) return weft_error(WEFT_ERR_INVALID, "done is NULL");
  *done = false;
  if (!work) {
    *done = true;
    return WEFT_OK;
  }
  int flag = 0;
  if (MPI_Testall(work->nreq, work->reqs, &flag, MPI_STATUSES_IGNORE) != MPI_SUCCESS) {
    weft_status st = weft_error(WEFT_ERR_MPI, "MPI_Testall failed on mesh dim '%s'",
                                work->group->name);
    work_abandon(work);
    free(work);
    *done = true;
    return st;
  }
  if (!flag) return WEFT_OK;
  work_complete(work);
  free(work);
  *done = true;
  return WEFT_OK;
}

/* Prepares w for the group; returns the debug-check status. */
static weft_status begin(weft_work *w, const weft_mesh *mesh, mesh_dim *g,
                         const weft_fingerprint *fp, const int64_t *pair_send,
                         const int64_t *pair_recv) {
  memset(w, 0, sizeof *w);
  w->root = mesh->root;
  w->group = g;
  w->fp = *fp;
  w->reqs = w->reqs_inline;
  w->nreq = 1;
  for (int i = 0; i < WORK_INLINE_REQS; i++) w->reqs_inline[i] = MPI_REQUEST_NULL;
  if (weft__rt.settings.debug && g->size > 1) return weft__debug_check(g, fp, pair_send, pair_recv);
  if (weft__rt.settings.debug && pair_send && pair_send[0] != pair_recv[0])
    return weft_error(WEFT_ERR_MISMATCH, "all_to_all_v on mesh dim '%s': sends %" PRId64
                      " to itself but expects %" PRId64, g->name, pair_send[0], pair_recv[0]);
  return WEFT_OK;
}

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
    return weft_error(WEFT_ERR_INVALID, "send overlaps recv (in place means send == recv + "
                      "coord * count, coord %d)", g->coord);
  weft_fingerprint fp = fp_make(g, group_index(mesh->root, g), WEFT_COLL_ALL_GATHER, false, dt,
                                count, -1, -1);
  weft__account(g, WEFT_COLL_ALL_GATHER, n * count * es);
  weft_work w;
  WEFT_CHECK(begin(&w, mesh, g, &fp, NULL, NULL));
  MPI_Datatype t = mpi_type(dt);
  int rc;
  if (count > INT_MAX) {
#if MPI_VERSION >= 4
    rc = MPI_Iallgather_c(nz(sbuf), count, t, nz(recv), count, t, g->comm, &w.reqs[0]);
#else
    return weft_error(WEFT_ERR_UNSUPPORTED, "count %" PRId64 " > INT_MAX needs MPI 4", count);
#endif
  } else {
    rc = MPI_Iallgather(nz(sbuf), (int)count, t, nz(recv), (int)count, t, g->comm, &w.reqs[0]);
  }
  WEFT_CHECK(mpi_posted(rc, __func__, "MPI_Iallgather", g));
  return finish(&w, work);
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
    big |= counts[i] > INT_MAX || total > INT_MAX;
    total += counts[i];
    h = (h ^ (uint64_t)counts[i]) * 1099511628211ull;
  }
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
    return weft_error(WEFT_ERR_INVALID, "send overlaps recv (in place means send == recv + "
                      "sum(counts[0..coord)))");
  /* MPI reads counts/displs until completion: keep our own copies. */
  size_t each = big ? sizeof(MPI_Count) + sizeof(MPI_Aint) : 2 * sizeof(int);
  void *arr = malloc((size_t)n * each + 1);
  if (!arr) return weft_error(WEFT_ERR_OOM, "no memory for %d counts", n);
  weft_fingerprint fp = fp_make(g, group_index(mesh->root, g), WEFT_COLL_ALL_GATHER, true, dt,
                                total, -1, -1);
  fp.extra = (int64_t)h;
  weft__account(g, WEFT_COLL_ALL_GATHER, total * es);
  weft_work w;
  weft_status st = begin(&w, mesh, g, &fp, NULL, NULL);
  if (st) {
    free(arr);
    return weft_error_trace(st, __func__);
  }
  w.owned = arr;
  MPI_Datatype t = mpi_type(dt);
  int rc;
  if (big) {
#if MPI_VERSION >= 4
    MPI_Count *c = arr;
    MPI_Aint *d = (MPI_Aint *)(c + n);
    for (int i = 0; i < n; i++) {
      c[i] = counts[i];
      d[i] = i ? d[i - 1] + (MPI_Aint)counts[i - 1] : 0;
    }
    rc = MPI_Iallgatherv_c(nz(sbuf), mine, t, nz(recv), c, d, t, g->comm, &w.reqs[0]);
#else
    free(arr);
    return weft_error(WEFT_ERR_UNSUPPORTED, "counts above INT_MAX need MPI 4");
#endif
  } else {
    int *c = arr, *d = c + n;
    for (int i = 0; i < n; i++) {
      c[i] = (int)counts[i];
      d[i] = i ? d[i - 1] + c[i - 1] : 0;
    }
    rc = MPI_Iallgatherv(nz(sbuf), (int)mine, t, nz(recv), c, d, t, g->comm, &w.reqs[0]);
  }
  if (rc != MPI_SUCCESS) free(arr);
  WEFT_CHECK(mpi_posted(rc, __func__, "MPI_Iallgatherv", g));
  return finish(&w, work);
}

weft_status weft_reduce_scatter(const weft_mesh *mesh, int dim, const void *send, void *recv,
                                int64_t count, weft_dtype dt, weft_reduce_op op,
                                weft_work **work) {
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
  if (count > INT_MAX && (dt == WEFT_BF16 || dt == WEFT_F16))
    return weft_error(WEFT_ERR_UNSUPPORTED, "%s reduce_scatter blocks above INT_MAX elements",
                      weft_dtype_name(dt));
  weft_fingerprint fp = fp_make(g, group_index(mesh->root, g), WEFT_COLL_REDUCE_SCATTER, false, dt,
                                count, op, -1);
  weft__account(g, WEFT_COLL_REDUCE_SCATTER, n * count * es);
  weft_work w;
  WEFT_CHECK(begin(&w, mesh, g, &fp, NULL, NULL));
  if (op == WEFT_OP_AVG) {
    w.avg_buf = recv;
    w.avg_count = count;
    w.avg_dt = dt;
  }
  MPI_Datatype t = mpi_type(dt);
  int rc;
  if (count > INT_MAX) {
#if MPI_VERSION >= 4
    rc = MPI_Ireduce_scatter_block_c(nz(sbuf), nz(recv), count, t, mpi_op(dt, op), g->comm,
                                     &w.reqs[0]);
#else
    return weft_error(WEFT_ERR_UNSUPPORTED, "count %" PRId64 " > INT_MAX needs MPI 4", count);
#endif
  } else {
    rc = MPI_Ireduce_scatter_block(nz(sbuf), nz(recv), (int)count, t, mpi_op(dt, op), g->comm,
                                   &w.reqs[0]);
  }
  WEFT_CHECK(mpi_posted(rc, __func__, "MPI_Ireduce_scatter_block", g));
  return finish(&w, work);
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
  int nchunk = count > INT_MAX ? (int)((count + BIG_CHUNK - 1) / BIG_CHUNK) : 1;
  weft_fingerprint fp = fp_make(g, group_index(mesh->root, g), WEFT_COLL_ALL_REDUCE, false, dt,
                                count, op, -1);
  weft__account(g, WEFT_COLL_ALL_REDUCE, count * es);
  weft_work w;
  WEFT_CHECK(begin(&w, mesh, g, &fp, NULL, NULL));
  if (nchunk > WORK_INLINE_REQS) {
    w.reqs = malloc((size_t)nchunk * sizeof *w.reqs);
    if (!w.reqs) return weft_error(WEFT_ERR_OOM, "no memory for %d requests", nchunk);
  }
  w.nreq = nchunk;
  if (op == WEFT_OP_AVG) {
    w.avg_buf = recv;
    w.avg_count = count;
    w.avg_dt = dt;
  }
  MPI_Datatype t = mpi_type(dt);
  MPI_Op mop = mpi_op(dt, op);
  for (int c = 0; c < nchunk; c++) {
    int64_t off = (int64_t)c * BIG_CHUNK;
    int64_t len = count - off < BIG_CHUNK ? count - off : BIG_CHUNK;
    if (nchunk == 1) len = count;
    const void *s = in_place ? MPI_IN_PLACE : (const char *)nz(send) + off * es;
    int rc = MPI_Iallreduce(s, (char *)nz(recv) + off * es, (int)len, t, mop, g->comm, &w.reqs[c]);
    if (rc != MPI_SUCCESS) {
      /* earlier chunks are in flight: wait for them before reporting */
      weft__wait_all(c, w.reqs, weft__rt.settings.timeout_s);
      if (w.reqs != w.reqs_inline) free(w.reqs);
      return mpi_posted(rc, __func__, "MPI_Iallreduce", g);
    }
  }
  return finish(&w, work);
}

weft_status weft_broadcast(const weft_mesh *mesh, int dim, void *buf, int64_t count,
                           weft_dtype dt, int root, weft_work **work) {
  if (work) *work = NULL;
  mesh_dim *g = weft__mesh_group(mesh, dim, __func__);
  if (!g) return weft_last_status();
  WEFT_CHECK(check_common(__func__, g, dt, count));
  if (root < 0 || root >= g->size)
    return weft_error(WEFT_ERR_INVALID, "root %d outside 0..%d (mesh dim '%s')", root,
                      g->size - 1, g->name);
  int64_t es = (int64_t)weft_dtype_size(dt);
  WEFT_CHECK(check_buf(__func__, "buf", buf, count * es));
  weft_fingerprint fp = fp_make(g, group_index(mesh->root, g), WEFT_COLL_BROADCAST, false, dt,
                                count, -1, root);
  weft__account(g, WEFT_COLL_BROADCAST, count * es);
  weft_work w;
  WEFT_CHECK(begin(&w, mesh, g, &fp, NULL, NULL));
  MPI_Datatype t = mpi_type(dt);
  int rc;
  if (count > INT_MAX) {
#if MPI_VERSION >= 4
    rc = MPI_Ibcast_c(nz(buf), count, t, root, g->comm, &w.reqs[0]);
#else
    return weft_error(WEFT_ERR_UNSUPPORTED, "count %" PRId64 " > INT_MAX needs MPI 4", count);
#endif
  } else {
    rc = MPI_Ibcast(nz(buf), (int)count, t, root, g->comm, &w.reqs[0]);
  }
  WEFT_CHECK(mpi_posted(rc, __func__, "MPI_Ibcast", g));
  return finish(&w, work);
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
  weft_fingerprint fp = fp_make(g, group_index(mesh->root, g), WEFT_COLL_ALL_TO_ALL, false, dt,
                                count, -1, -1);
  weft__account(g, WEFT_COLL_ALL_TO_ALL, n * count * es);
  weft_work w;
  WEFT_CHECK(begin(&w, mesh, g, &fp, NULL, NULL));
  MPI_Datatype t = mpi_type(dt);
  int rc;
  if (count > INT_MAX) {
#if MPI_VERSION >= 4
    rc = MPI_Ialltoall_c(sbuf == MPI_IN_PLACE ? sbuf : nz(sbuf), count, t, nz(recv), count, t,
                         g->comm, &w.reqs[0]);
#else
    return weft_error(WEFT_ERR_UNSUPPORTED, "count %" PRId64 " > INT_MAX needs MPI 4", count);
#endif
  } else {
    rc = MPI_Ialltoall(sbuf == MPI_IN_PLACE ? sbuf : nz(sbuf), (int)count, t, nz(recv),
                       (int)count, t, g->comm, &w.reqs[0]);
  }
  WEFT_CHECK(mpi_posted(rc, __func__, "MPI_Ialltoall", g));
  return finish(&w, work);
}

weft_status weft_all_to_all_v(const weft_mesh *mesh, int dim, const void *send,
                              const int64_t *send_counts, const int64_t *send_displs, void *recv,
                              const int64_t *recv_counts, const int64_t *recv_displs,
                              weft_dtype dt, weft_work **work) {
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
  WEFT_CHECK(check_buf(__func__, "send", send, send_end * es));
  WEFT_CHECK(check_buf(__func__, "recv", recv, recv_end * es));
  if (overlap(send, (size_t)(send_end * es), recv, (size_t)(recv_end * es)))
    return weft_error(WEFT_ERR_INVALID, "send overlaps recv (all_to_all_v has no in-place form)");
  size_t each = big ? 2 * (sizeof(MPI_Count) + sizeof(MPI_Aint)) : 4 * sizeof(int);
  void *arr = malloc((size_t)n * each + 1);
  if (!arr) return weft_error(WEFT_ERR_OOM, "no memory for %d counts", n);
  weft_fingerprint fp = fp_make(g, group_index(mesh->root, g), WEFT_COLL_ALL_TO_ALL, true, dt, -1,
                                -1, -1);
  weft__account(g, WEFT_COLL_ALL_TO_ALL, stotal * es);
  weft_work w;
  weft_status st = begin(&w, mesh, g, &fp, send_counts, recv_counts);
  if (st) {
    free(arr);
    return weft_error_trace(st, __func__);
  }
  w.owned = arr;
  MPI_Datatype t = mpi_type(dt);
  int rc;
  if (big) {
#if MPI_VERSION >= 4
    MPI_Count *sc = arr, *rcn = sc + n;
    MPI_Aint *sd = (MPI_Aint *)(rcn + n), *rd = sd + n;
    for (int i = 0; i < n; i++) {
      sc[i] = send_counts[i];
      rcn[i] = recv_counts[i];
      sd[i] = (MPI_Aint)send_displs[i];
      rd[i] = (MPI_Aint)recv_displs[i];
    }
    rc = MPI_Ialltoallv_c(nz(send), sc, sd, t, nz(recv), rcn, rd, t, g->comm, &w.reqs[0]);
#else
    free(arr);
    return weft_error(WEFT_ERR_UNSUPPORTED, "counts above INT_MAX need MPI 4");
#endif
  } else {
    int *sc = arr, *rcn = sc + n, *sd = rcn + n, *rd = sd + n;
    for (int i = 0; i < n; i++) {
      sc[i] = (int)send_counts[i];
      rcn[i] = (int)recv_counts[i];
      sd[i] = (int)send_displs[i];
      rd[i] = (int)recv_displs[i];
    }
    rc = MPI_Ialltoallv(nz(send), sc, sd, t, nz(recv), rcn, rd, t, g->comm, &w.reqs[0]);
  }
  if (rc != MPI_SUCCESS) free(arr);
  WEFT_CHECK(mpi_posted(rc, __func__, "MPI_Ialltoallv", g));
  return finish(&w, work);
}

static weft_status barrier_group(const weft_mesh *mesh, mesh_dim *g, weft_work **work) {
  WEFT_CHECK(check_common("weft_barrier", g, WEFT_U8, 0));
  weft_fingerprint fp = fp_make(g, group_index(mesh->root, g), WEFT_COLL_BARRIER, false, -1, -1,
                                -1, -1);
  fp.dtype = -1;
  weft__account(g, WEFT_COLL_BARRIER, 0);
  weft_work w;
  WEFT_CHECK(begin(&w, mesh, g, &fp, NULL, NULL));
  int rc = MPI_Ibarrier(g->comm, &w.reqs[0]);
  WEFT_CHECK(mpi_posted(rc, "weft_barrier", "MPI_Ibarrier", g));
  return finish(&w, work);
}

weft_status weft_barrier(const weft_mesh *mesh, int dim, weft_work **work) {
  if (work) *work = NULL;
  if (!mesh) return weft_error(WEFT_ERR_INVALID, "mesh is NULL");
  if (dim != -1) {
    mesh_dim *g = weft__mesh_group(mesh, dim, __func__);
    if (!g) return weft_last_status();
    return barrier_group(mesh, g, work);
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
