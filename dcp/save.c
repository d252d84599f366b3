/* dcp/save.c — sharded save: plan, write, commit; and async save.
 *
 * 1. Plan (collective). Every rank lists what it holds: for each tensor
 *    entry its dtype, global shape and the boxes of its shard (a strided
 *    shard gives several), and its values. The lists are all-gathered (a
 *    status and message travel with them, so a local error on any rank is
 *    an error on every rank), and every rank computes the same global plan
 *    from the same bytes: the unique boxes of each tensor (replicas hold
 *    equal boxes), checked to tile the tensor exactly; each box's writer —
 *    its only holder, else, largest boxes first, the holder with the
 *    fewest bytes so far (ties: lowest rank) — and its place in the
 *    writer's file (64-byte aligned after the 64-byte header).
 * 2. Write (local I/O only). Each rank writes its boxes to
 *    r<rank>-<id>.data, CRC32C per block, then fsyncs the file.
 * 3. Commit (collective). The ranks all-gather their status and checksums;
 *    rank 0 writes metadata.json.tmp, fsyncs it, renames it to
 *    metadata.json and fsyncs the directory, then removes data files of
 *    earlier saves; the outcome is agreed by an all-reduce.
 * Async save runs 1 and a copy of every box into staging on the calling
 * thread, 2 (and 3 under MPI_THREAD_MULTIPLE) on a background thread.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "dcp_internal.h"

#define WRITE_PIECE ((uint64_t)4 << 20)

/* ------------------------------------------------------------ plan types */

typedef struct rec {
  int rank;
  char *name;
  weft_dtype dtype;
  int ndim;
  int64_t shape[WEFT_MAX_DIMS];
  char *layout;
  int64_t nbox;
  weft_box *boxes;
} rec;

typedef struct vrec {
  int rank;
  char *name;
  weft_sd_value_type type;
  char *text;
} vrec;

typedef struct gbox {
  weft_box box;
  int64_t tensor;
  int64_t h0, nh; /* holders: ranks in holders[h0 .. h0 + nh) */
  int writer;
  uint64_t off, len;
  int64_t crc_at, ncrc; /* place in the writer's checksum list */
} gbox;

typedef struct gtensor {
  const char *name;
  weft_dtype dtype;
  int ndim;
  int64_t shape[WEFT_MAX_DIMS];
  const char *layout;
  int64_t b0, nb; /* its boxes in plan.b */
} gtensor;

typedef struct gplan {
  rec *recs;
  int64_t nrec;
  vrec *vrecs;
  int64_t nvrec;
  gtensor *t;
  int64_t nt;
  gbox *b;
  int64_t nb;
  int *holders;
  int64_t nholders;
  dcp_vmeta *v; /* borrowed name/text from vrecs; json rendered */
  int64_t nv;
  uint64_t *file_bytes; /* per rank */
  int64_t *ncrc;        /* per rank */
  uint64_t id;
} gplan;

/* What this rank holds: one per tensor entry. */
typedef struct litem {
  const dcp_sd_ent *e;
  const weft_tensor *local; /* on the host: the entry's, or `staged` */
  weft_tensor *staged;      /* host copy of a device local (owned; over pinned memory, or not) */
  char layout[320];
  weft_dtype dtype;
  int ndim;
  int64_t shape[WEFT_MAX_DIMS];
  weft_local_box *lb;
  int64_t nlb;
} litem;

/* One box this rank writes. */
typedef struct wjob {
  const char *src;
  int64_t strides[WEFT_MAX_DIMS]; /* bytes */
  int64_t len[WEFT_MAX_DIMS];
  int ndim;
  weft_dtype dtype;
  size_t esz;
  bool contig;
  bool private_src; /* src is the save's own host copy (of a device local): no one else writes it */
  uint64_t off, length;
  uint32_t *crc;
  int64_t ncrc;
} wjob;

typedef struct save_ctx {
  dcp_comm comm;
  char *dir;
  char fname[64];
  int64_t block;
  gplan plan;
  wjob *jobs;
  int64_t njobs;
  uint32_t *crcs;
  int64_t ncrcs;
  char *staging;
  size_t staging_cap;
  weft_tensor **staged; /* host copies of device locals the jobs read (owned) */
  int64_t nstaged;
  /* the device-to-host copies of device locals: queued on the device's
   * compute stream into pinned memory, complete once `copied` is */
  weft_device dev;
  char *pinned;
  size_t pinned_cap;
  weft_event *copied;
  weft_status io_st;
  char io_msg[1600];
  bool committed; /* rank 0: metadata.json renamed into place */
} save_ctx;

struct weft_dcp_async {
  save_ctx *ctx;
  pthread_t th;
  bool thread_started;
  bool commit_in_thread;
  int io_done; /* set by the thread when it is done (atomic) */
  bool finished;
  weft_status result;
  char msg[2048];
};

static weft_dcp_async *g_pending;
static char *g_stage;
static size_t g_stage_cap;
static bool g_stage_busy;

/* ------------------------------------------------------------ freeing */

static void plan_free(gplan *p) {
  for (int64_t i = 0; i < p->nrec; i++) {
    free(p->recs[i].name);
    free(p->recs[i].layout);
    free(p->recs[i].boxes);
  }
  free(p->recs);
  for (int64_t i = 0; i < p->nvrec; i++) {
    free(p->vrecs[i].name);
    free(p->vrecs[i].text);
  }
  free(p->vrecs);
  for (int64_t i = 0; i < p->nv; i++) free(p->v[i].json);
  free(p->v);
  free(p->t);
  free(p->b);
  free(p->holders);
  free(p->file_bytes);
  free(p->ncrc);
  memset(p, 0, sizeof *p);
}

/* The host copies of device locals, once no job reads them. */
static void staged_free(save_ctx *c) {
  for (int64_t i = 0; i < c->nstaged; i++) weft_tensor_destroy(c->staged[i]);
  free(c->staged);
  c->staged = NULL;
  c->nstaged = 0;
}

/* Waits until the queued device-to-host copies have landed (they write
 * into c->pinned). Blocks; the first wait does the work. */
static weft_status copies_wait(save_ctx *c) {
  if (!c->copied) return WEFT_OK;
  weft_status st = weft_event_synchronize(c->dev, c->copied);
  weft_event_destroy(c->dev, c->copied);
  c->copied = NULL;
  return st;
}

static void ctx_free(save_ctx *c) {
  if (!c) return;
  copies_wait(c); /* never release memory a queued copy still writes */
  staged_free(c);
  dcp_pinned_give(c->dev, c->pinned, c->pinned_cap);
  c->pinned = NULL;
  dcp_comm_close(&c->comm);
  plan_free(&c->plan);
  free(c->jobs);
  free(c->crcs);
  free(c->dir);
  if (c->staging) {
    if (!g_stage || g_stage_cap < c->staging_cap) {
      if (g_stage) weft_free(g_stage);
      g_stage = c->staging;
      g_stage_cap = c->staging_cap;
    } else {
      weft_free(c->staging);
    }
    g_stage_busy = false;
  }
  free(c);
}

/* ------------------------------------------------------------ local plan */

static weft_status local_items(const weft_state_dict *sd, litem **out, int64_t *n) {
  *out = NULL;
  *n = 0;
  litem *it = calloc((size_t)(sd->n ? sd->n : 1), sizeof *it);
  if (!it) return weft_error(WEFT_ERR_OOM, "save plan");
  int64_t k = 0;
  weft_status st = WEFT_OK;
  for (int64_t i = 0; i < sd->n; i++) {
    const dcp_sd_ent *e = &sd->e[i];
    if (e->kind == WEFT_SD_VALUE) continue;
    litem *L = &it[k++];
    L->e = e;
    if (e->kind == WEFT_SD_DTENSOR) {
      const weft_dtensor_spec *s = weft_dtensor_get_spec(e->dt);
      for (int d = 0; d < s->mesh_ndim; d++)
        if (s->placements[d].kind == WEFT_PLACE_PARTIAL) {
          char pl[128];
          weft_placements_describe(s->placements, s->mesh_ndim, pl, sizeof pl);
          st = weft_error(WEFT_ERR_UNSUPPORTED,
                          "save: tensor '%s' has placements %s: a Partial "
                          "value cannot be saved (redistribute it to Replicate first)",
                          e->name, pl);
          goto fail;
        }
      L->local = weft_dtensor_local(e->dt);
      L->dtype = s->dtype;
      L->ndim = s->ndim;
      memcpy(L->shape, s->shape, sizeof L->shape);
      char pl[200];
      weft_placements_describe(s->placements, s->mesh_ndim, pl, sizeof pl);
      size_t at = (size_t)snprintf(L->layout, sizeof L->layout, "%s on mesh ", pl);
      for (int d = 0; d < s->mesh_ndim && at < sizeof L->layout; d++)
        at += (size_t)snprintf(L->layout + at, sizeof L->layout - at, "%s%d", d ? "x" : "",
                               s->mesh_shape[d]);
      WEFT_CHECK_GOTO(weft_dtensor_local_boxes(e->dt, &L->lb, &L->nlb), st, fail);
    } else {
      L->local = e->t;
      L->dtype = e->t->dtype;
      L->ndim = e->t->ndim;
      memcpy(L->shape, e->t->shape, sizeof L->shape);
      snprintf(L->layout, sizeof L->layout, "full");
      L->lb = calloc(1, sizeof *L->lb);
      if (!L->lb) {
        st = weft_error(WEFT_ERR_OOM, "box");
        goto fail;
      }
      for (int d = 0; d < L->ndim; d++) L->lb[0].global.size[d] = L->shape[d];
      L->nlb = weft_tensor_numel(e->t) > 0 ? 1 : 0;
    }
    if (!L->local) {
      st = weft_error(WEFT_ERR_INVALID, "save: tensor '%s' has no local tensor", e->name);
      goto fail;
    }
    /* a device local is written from a host copy queued before the save
     * returns (stage_device_locals), so training may go on changing it */
  }
  *out = it;
  *n = k;
  return WEFT_OK;
fail:
  for (int64_t i = 0; i < k; i++) {
    free(it[i].lb);
    weft_tensor_destroy(it[i].staged);
  }
  free(it);
  return st;
}

static void local_items_free(litem *it, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    free(it[i].lb);
    weft_tensor_destroy(it[i].staged);
  }
  free(it);
}

/* Host copies of this rank's device locals, taken in stream order: one
 * pinned block for the contiguous ones (reused from the last save when it
 * is big enough), an async device-to-host copy each on the compute stream
 * and an event after them (c->copied: write_file waits for it, so a save
 * returns as soon as the copies are queued, and the training work queued
 * after them cannot change what they read). A strided device local gets a
 * blocking copy. Each item's local then points at its host copy. */
static weft_status stage_device_locals(save_ctx *c, litem *it, int64_t n) {
  size_t total = 0;
  bool any = false;
  for (int64_t i = 0; i < n; i++) {
    const weft_tensor *t = it[i].local;
    if (t->device == WEFT_CPU || !weft_tensor_is_contiguous(t)) continue;
    if (!any) c->dev = t->device;
    any = true;
    total += (weft_tensor_nbytes(t) + DCP_ALIGN - 1) / DCP_ALIGN * DCP_ALIGN;
  }
  if (any) WEFT_CHECK(dcp_pinned_take(c->dev, total, &c->pinned, &c->pinned_cap));
  size_t at = 0;
  weft_status st = WEFT_OK;
  for (int64_t i = 0; i < n && st == WEFT_OK; i++) {
    litem *L = &it[i];
    const weft_tensor *t = L->local;
    if (t->device == WEFT_CPU) continue;
    if (!weft_tensor_is_contiguous(t)) {
      st = dcp_host_of(t, &L->local, &L->staged);
      continue;
    }
    size_t bytes = weft_tensor_nbytes(t);
    st = weft_tensor_wrap(c->pinned + at, t->dtype, WEFT_CPU, t->ndim, t->shape, &L->staged);
    if (st == WEFT_OK && bytes > 0)
      st = weft_memcpy_async(t->device, c->pinned + at, t->data, bytes, WEFT_COPY_D2H,
                             WEFT_STREAM_COMPUTE);
    if (st == WEFT_OK) L->local = L->staged;
    at += (bytes + DCP_ALIGN - 1) / DCP_ALIGN * DCP_ALIGN;
  }
  if (st == WEFT_OK && any) st = weft_event_record(c->dev, WEFT_STREAM_COMPUTE, &c->copied);
  if (st != WEFT_OK && any) weft_device_synchronize(c->dev); /* nothing left writing c->pinned */
  return st;
}

static void put_status(dcp_buf *b, weft_status st) {
  dcp_buf_u32(b, (uint32_t)st);
  dcp_buf_str(b, st != WEFT_OK ? dcp_last_msg() : "");
}

static void encode_plan(dcp_buf *b, weft_status st, uint64_t id, const litem *it, int64_t n,
                        const weft_state_dict *sd) {
  put_status(b, st);
  dcp_buf_u64(b, id);
  dcp_buf_u64(b, st == WEFT_OK ? (uint64_t)n : 0);
  for (int64_t i = 0; st == WEFT_OK && i < n; i++) {
    const litem *L = &it[i];
    dcp_buf_str(b, L->e->name);
    dcp_buf_u32(b, (uint32_t)L->dtype);
    dcp_buf_u32(b, (uint32_t)L->ndim);
    for (int d = 0; d < L->ndim; d++) dcp_buf_u64(b, (uint64_t)L->shape[d]);
    dcp_buf_str(b, L->layout);
    dcp_buf_u64(b, (uint64_t)L->nlb);
    for (int64_t k = 0; k < L->nlb; k++)
      for (int d = 0; d < L->ndim; d++) {
        dcp_buf_u64(b, (uint64_t)L->lb[k].global.off[d]);
        dcp_buf_u64(b, (uint64_t)L->lb[k].global.size[d]);
      }
  }
  int64_t nv = 0;
  for (int64_t i = 0; st == WEFT_OK && i < sd->n; i++) nv += sd->e[i].kind == WEFT_SD_VALUE;
  dcp_buf_u64(b, (uint64_t)nv);
  for (int64_t i = 0; st == WEFT_OK && i < sd->n; i++) {
    const dcp_sd_ent *e = &sd->e[i];
    if (e->kind != WEFT_SD_VALUE) continue;
    dcp_buf_str(b, e->name);
    dcp_buf_u32(b, (uint32_t)e->val.type);
    dcp_buf_str(b, e->val.text);
  }
}

/* Finds the first failing rank's status in gathered blobs (each starting
 * with put_status) and raises it on this rank. */
static weft_status first_failure(const dcp_comm *c, const char *blobs, const int64_t *displs,
                                 const char *what) {
  for (int r = 0; r < c->size; r++) {
    dcp_rd rd = {blobs + displs[r], (size_t)(displs[r + 1] - displs[r]), 0, false};
    uint32_t st = dcp_rd_u32(&rd);
    if (rd.bad) return weft_error(WEFT_ERR_INTERNAL, "%s: short blob from rank %d", what, r);
    if (st != WEFT_OK) {
      char *msg = dcp_rd_str(&rd);
      weft_status out;
      if (r == c->rank)
        out = weft_error((weft_status)st, "%s", msg ? msg : "?");
      else
        out = weft_error((weft_status)st, "%s failed on rank %d: %s", what, r, msg ? msg : "?");
      free(msg);
      return out;
    }
  }
  return WEFT_OK;
}

/* ------------------------------------------------------------ global plan */

static int cmp_rec(const void *a, const void *b) {
  const rec *x = a, *y = b;
  int c = strcmp(x->name, y->name);
  if (c) return c;
  return x->rank < y->rank ? -1 : x->rank > y->rank;
}
static int cmp_vrec(const void *a, const void *b) {
  const vrec *x = a, *y = b;
  int c = strcmp(x->name, y->name);
  if (c) return c;
  return x->rank < y->rank ? -1 : x->rank > y->rank;
}

typedef struct boxrank {
  weft_box box;
  int rank;
} boxrank;

static int cmp_boxrank(const void *a, const void *b, void *ctx) {
  int nd = *(const int *)ctx;
  const boxrank *x = a, *y = b;
  for (int d = 0; d < nd; d++) {
    if (x->box.off[d] != y->box.off[d]) return x->box.off[d] < y->box.off[d] ? -1 : 1;
    if (x->box.size[d] != y->box.size[d]) return x->box.size[d] < y->box.size[d] ? -1 : 1;
  }
  return x->rank < y->rank ? -1 : x->rank > y->rank;
}

typedef struct repl_ord {
  int64_t b;
  uint64_t len;
} repl_ord;
static int cmp_repl(const void *a, const void *b) {
  const repl_ord *x = a, *y = b;
  if (x->len != y->len) return x->len > y->len ? -1 : 1;
  return x->b < y->b ? -1 : x->b > y->b;
}

static const char *holder_label(int64_t i, void *ctx) {
  static _Thread_local char buf[96];
  const void **c = ctx;
  const gplan *p = c[0];
  const gtensor *t = c[1];
  const gbox *g = &p->b[t->b0 + i];
  snprintf(buf, sizeof buf, "the shard of rank %d", p->holders[g->h0]);
  return buf;
}

static weft_status decode_plans(const dcp_comm *c, const char *blobs, const int64_t *displs,
                                gplan *p) {
  /* count */
  int64_t nrec = 0, nv = 0;
  for (int pass = 0; pass < 2; pass++) {
    int64_t ri = 0, vi = 0;
    for (int r = 0; r < c->size; r++) {
      dcp_rd rd = {blobs + displs[r], (size_t)(displs[r + 1] - displs[r]), 0, false};
      dcp_rd_u32(&rd);
      free(dcp_rd_str(&rd));
      uint64_t id = dcp_rd_u64(&rd);
      if (r == 0) p->id = id;
      uint64_t nt = dcp_rd_u64(&rd);
      for (uint64_t i = 0; i < nt && !rd.bad; i++) {
        rec R = {0};
        R.rank = r;
        R.name = dcp_rd_str(&rd);
        R.dtype = (weft_dtype)dcp_rd_u32(&rd);
        R.ndim = (int)dcp_rd_u32(&rd);
        if (R.ndim > WEFT_MAX_DIMS || (unsigned)R.dtype >= WEFT_DTYPE_COUNT) rd.bad = true;
        for (int d = 0; d < R.ndim && !rd.bad; d++) R.shape[d] = (int64_t)dcp_rd_u64(&rd);
        R.layout = dcp_rd_str(&rd);
        R.nbox = (int64_t)dcp_rd_u64(&rd);
        if (!rd.bad && (uint64_t)R.nbox > rd.len) rd.bad = true;
        if (pass == 1 && !rd.bad) {
          R.boxes = calloc((size_t)(R.nbox ? R.nbox : 1), sizeof *R.boxes);
          if (!R.boxes) rd.bad = true;
        }
        for (int64_t k = 0; k < R.nbox && !rd.bad; k++)
          for (int d = 0; d < R.ndim; d++) {
            uint64_t o = dcp_rd_u64(&rd), s = dcp_rd_u64(&rd);
            if (pass == 1 && R.boxes) {
              R.boxes[k].off[d] = (int64_t)o;
              R.boxes[k].size[d] = (int64_t)s;
            }
          }
        if (pass == 1 && ri < nrec)
          p->recs[ri] = R;
        else {
          free(R.name);
          free(R.layout);
          free(R.boxes);
        }
        ri++;
      }
      uint64_t nvals = dcp_rd_u64(&rd);
      for (uint64_t i = 0; i < nvals && !rd.bad; i++) {
        vrec V = {0};
        V.rank = r;
        V.name = dcp_rd_str(&rd);
        V.type = (weft_sd_value_type)dcp_rd_u32(&rd);
        V.text = dcp_rd_str(&rd);
        if (pass == 1 && vi < nv)
          p->vrecs[vi] = V;
        else {
          free(V.name);
          free(V.text);
        }
        vi++;
      }
      if (rd.bad) return weft_error(WEFT_ERR_INTERNAL, "save: malformed plan from rank %d", r);
    }
    if (pass == 0) {
      nrec = ri;
      nv = vi;
      p->recs = calloc((size_t)(nrec ? nrec : 1), sizeof *p->recs);
      p->vrecs = calloc((size_t)(nv ? nv : 1), sizeof *p->vrecs);
      if (!p->recs || !p->vrecs) return weft_error(WEFT_ERR_OOM, "save plan");
    } else {
      p->nrec = nrec;
      p->nvrec = nv;
    }
  }
  return WEFT_OK;
}

static weft_status global_plan(const dcp_comm *c, int64_t block, gplan *p) {
  char a[256], b[256];
  qsort(p->recs, (size_t)p->nrec, sizeof *p->recs, cmp_rec);
  qsort(p->vrecs, (size_t)p->nvrec, sizeof *p->vrecs, cmp_vrec);
  /* tensors */
  int64_t nt = 0, nbr = 0;
  for (int64_t i = 0; i < p->nrec; i++) {
    if (i == 0 || strcmp(p->recs[i].name, p->recs[i - 1].name) != 0) nt++;
    nbr += p->recs[i].nbox;
  }
  p->t = calloc((size_t)(nt ? nt : 1), sizeof *p->t);
  boxrank *br = malloc((size_t)(nbr ? nbr : 1) * sizeof *br);
  p->b = calloc((size_t)(nbr ? nbr : 1), sizeof *p->b);
  p->holders = malloc((size_t)(nbr ? nbr : 1) * sizeof *p->holders);
  p->file_bytes = calloc((size_t)c->size, sizeof *p->file_bytes);
  p->ncrc = calloc((size_t)c->size, sizeof *p->ncrc);
  uint64_t *load = calloc((size_t)c->size, sizeof *load);
  repl_ord *ro = malloc((size_t)(nbr ? nbr : 1) * sizeof *ro);
  weft_status st = WEFT_OK;
  if (!p->t || !br || !p->b || !p->holders || !p->file_bytes || !p->ncrc || !load || !ro) {
    st = weft_error(WEFT_ERR_OOM, "save plan");
    goto done;
  }
  for (int64_t i = 0; i < p->nrec;) {
    int64_t j = i;
    while (j < p->nrec && strcmp(p->recs[j].name, p->recs[i].name) == 0) j++;
    const rec *R0 = &p->recs[i];
    gtensor *T = &p->t[p->nt];
    T->name = R0->name;
    T->dtype = R0->dtype;
    T->ndim = R0->ndim;
    memcpy(T->shape, R0->shape, sizeof T->shape);
    T->layout = R0->layout;
    int64_t n = 0;
    for (int64_t k = i; k < j; k++) {
      const rec *R = &p->recs[k];
      bool same = R->dtype == R0->dtype && R->ndim == R0->ndim;
      for (int d = 0; same && d < R->ndim; d++) same = R->shape[d] == R0->shape[d];
      if (!same) {
        weft_box x = {{0}, {0}}, y = {{0}, {0}};
        memcpy(x.size, R0->shape, sizeof x.size);
        memcpy(y.size, R->shape, sizeof y.size);
        dcp_box_describe(&x, R0->ndim, a, sizeof a);
        dcp_box_describe(&y, R->ndim, b, sizeof b);
        st = weft_error(WEFT_ERR_MISMATCH,
                        "save: ranks disagree on tensor '%s': rank %d has %s %s, "
                        "rank %d has %s %s",
                        T->name, R0->rank, weft_dtype_name(R0->dtype), a, R->rank,
                        weft_dtype_name(R->dtype), b);
        goto done;
      }
      for (int64_t q = 0; q < R->nbox; q++) {
        br[n].box = R->boxes[q];
        br[n].rank = R->rank;
        n++;
      }
    }
    int nd = T->ndim;
    qsort_r(br, (size_t)n, sizeof *br, cmp_boxrank, &nd);
    T->b0 = p->nb;
    for (int64_t k = 0; k < n;) {
      int64_t l = k;
      gbox *G = &p->b[p->nb++];
      G->box = br[k].box;
      G->tensor = p->nt;
      G->h0 = p->nholders;
      while (l < n && weft_box_equal(&br[l].box, &br[k].box, nd))
        p->holders[p->nholders++] = br[l++].rank;
      G->nh = l - k;
      G->len = (uint64_t)weft_box_volume(&G->box, nd) * weft_dtype_size(T->dtype);
      G->ncrc = (int64_t)((G->len + (uint64_t)block - 1) / (uint64_t)block);
      k = l;
    }
    T->nb = p->nb - T->b0;
    const weft_box **bx = malloc((size_t)(T->nb ? T->nb : 1) * sizeof *bx);
    if (!bx) {
      st = weft_error(WEFT_ERR_OOM, "save plan");
      goto done;
    }
    for (int64_t k = 0; k < T->nb; k++) bx[k] = &p->b[T->b0 + k].box;
    const void *ctx[2] = {p, T};
    st = dcp_check_tiling("save", T->name, nd, T->shape, bx, T->nb, holder_label, ctx);
    free(bx);
    if (st != WEFT_OK) {
      char msg[1500];
      snprintf(msg, sizeof msg, "%s", dcp_last_msg());
      st = weft_error(WEFT_ERR_INVALID,
                      "%s (the ranks' shards must tile the tensor: a replica "
                      "holds exactly the same box)",
                      msg);
      goto done;
    }
    p->nt++;
    i = j;
  }
  /* writers: single holders first, then replicas largest first */
  int64_t nro = 0;
  for (int64_t k = 0; k < p->nb; k++) {
    gbox *G = &p->b[k];
    if (G->nh == 1) {
      G->writer = p->holders[G->h0];
      load[G->writer] += G->len;
    } else {
      ro[nro].b = k;
      ro[nro].len = G->len;
      nro++;
    }
  }
  qsort(ro, (size_t)nro, sizeof *ro, cmp_repl);
  for (int64_t k = 0; k < nro; k++) {
    gbox *G = &p->b[ro[k].b];
    int best = p->holders[G->h0];
    for (int64_t h = 1; h < G->nh; h++) {
      int r = p->holders[G->h0 + h];
      if (load[r] < load[best] || (load[r] == load[best] && r < best)) best = r;
    }
    G->writer = best;
    load[best] += G->len;
  }
  /* file layout: boxes in plan order */
  for (int r = 0; r < c->size; r++) p->file_bytes[r] = DCP_FILE_HEADER;
  for (int64_t k = 0; k < p->nb; k++) {
    gbox *G = &p->b[k];
    uint64_t off = (p->file_bytes[G->writer] + DCP_ALIGN - 1) / DCP_ALIGN * DCP_ALIGN;
    G->off = off;
    p->file_bytes[G->writer] = off + G->len;
    G->crc_at = p->ncrc[G->writer];
    p->ncrc[G->writer] += G->ncrc;
  }
  /* values: ranks must agree on each name */
  p->v = calloc((size_t)(p->nvrec ? p->nvrec : 1), sizeof *p->v);
  if (!p->v) {
    st = weft_error(WEFT_ERR_OOM, "values");
    goto done;
  }
  for (int64_t i = 0; i < p->nvrec;) {
    int64_t j = i;
    while (j < p->nvrec && strcmp(p->vrecs[j].name, p->vrecs[i].name) == 0) {
      const vrec *V = &p->vrecs[j], *V0 = &p->vrecs[i];
      if (V->type != V0->type || strcmp(V->text, V0->text) != 0) {
        st = weft_error(WEFT_ERR_MISMATCH,
                        "save: value '%s' differs between rank %d (%s %.60s) and "
                        "rank %d (%s %.60s); give per-rank values per-rank names",
                        V0->name, V0->rank, dcp_value_type_name(V0->type), V0->text, V->rank,
                        dcp_value_type_name(V->type), V->text);
        goto done;
      }
      j++;
    }
    dcp_vmeta *v = &p->v[p->nv++];
    v->name = p->vrecs[i].name;
    v->type = p->vrecs[i].type;
    v->text = p->vrecs[i].text;
    WEFT_CHECK_GOTO(dcp_value_render_json(v), st, done);
    i = j;
  }
done:
  free(br);
  free(load);
  free(ro);
  return st;
}

static uint64_t new_id(void) {
  uint64_t id = 0;
  if (getrandom(&id, sizeof id, 0) != (ssize_t)sizeof id) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    id = (uint64_t)ts.tv_nsec * 0x9E3779B97F4A7C15ull ^ (uint64_t)ts.tv_sec ^
         ((uint64_t)getpid() << 32);
  }
  return id ? id : 1;
}

/* This rank's jobs: its boxes in file order, pointing at the local data. */
static weft_status make_jobs(save_ctx *c, const litem *it, int64_t nit) {
  gplan *p = &c->plan;
  int64_t n = 0;
  for (int64_t k = 0; k < p->nb; k++) n += p->b[k].writer == c->comm.rank;
  c->jobs = calloc((size_t)(n ? n : 1), sizeof *c->jobs);
  c->ncrcs = p->ncrc[c->comm.rank];
  c->crcs = calloc((size_t)(c->ncrcs ? c->ncrcs : 1), sizeof *c->crcs);
  if (!c->jobs || !c->crcs) return weft_error(WEFT_ERR_OOM, "save jobs");
  for (int64_t k = 0; k < p->nb; k++) {
    const gbox *G = &p->b[k];
    if (G->writer != c->comm.rank) continue;
    const gtensor *T = &p->t[G->tensor];
    const litem *L = NULL;
    for (int64_t i = 0; i < nit && !L; i++)
      if (strcmp(it[i].e->name, T->name) == 0) L = &it[i];
    const weft_local_box *lb = NULL;
    for (int64_t q = 0; L && q < L->nlb && !lb; q++)
      if (weft_box_equal(&L->lb[q].global, &G->box, T->ndim)) lb = &L->lb[q];
    if (!lb)
      return weft_error(WEFT_ERR_INTERNAL, "save: rank %d was given box of '%s' it does not hold",
                        c->comm.rank, T->name);
    wjob *J = &c->jobs[c->njobs++];
    J->ndim = T->ndim;
    J->dtype = T->dtype;
    J->esz = weft_dtype_size(T->dtype);
    int64_t bs[WEFT_MAX_DIMS];
    dcp_byte_strides(L->local, bs);
    const char *src = L->local->data;
    for (int d = 0; d < T->ndim; d++) {
      src += lb->local_start[d] * bs[d];
      J->strides[d] = bs[d];
      J->len[d] = G->box.size[d];
    }
    J->src = src;
    J->private_src = L->staged != NULL;
    /* contiguous when merging trailing dims swallows every dim */
    int64_t cs[WEFT_MAX_DIMS];
    dcp_contig_strides(J->len, J->ndim, J->esz, cs);
    J->contig = true;
    for (int d = 0; d < J->ndim; d++)
      if (J->len[d] > 1 && J->strides[d] != cs[d]) J->contig = false;
    J->off = G->off;
    J->length = G->len;
    J->crc = c->crcs + G->crc_at;
    J->ncrc = G->ncrc;
  }
  return WEFT_OK;
}

/* ------------------------------------------------------------ write */

/* Copies job J's box (strided in the local tensor) into dst, dense
 * row-major (element-aligned: malloc'ed or a DCP_ALIGN offset), through
 * kernels' strided copy. */
static weft_status job_stage(const wjob *J, char *dst) {
  weft_tensor s, d;
  int64_t es[WEFT_MAX_DIMS];
  for (int k = 0; k < J->ndim; k++) es[k] = J->strides[k] / (int64_t)J->esz;
  WEFT_CHECK(weft_tensor_view_init(&s, (void *)(uintptr_t)J->src, J->dtype, WEFT_CPU, J->ndim,
                                   J->len, es));
  WEFT_CHECK(weft_tensor_view_init(&d, dst, J->dtype, WEFT_CPU, J->ndim, J->len, NULL));
  return weft_tensor_copy(&d, &s);
}

static weft_status write_bytes(int fd, const char *path, const char *p, uint64_t n, uint64_t off,
                               uint64_t B, uint32_t *crc) {
  for (uint64_t at = 0; at < n;) {
    uint64_t piece = n - at < WRITE_PIECE ? n - at : WRITE_PIECE; /* a multiple of B unless last */
    for (uint64_t s = 0; s < piece; s += B) {
      uint64_t m = piece - s < B ? piece - s : B;
      crc[(at + s) / B] = weft_crc32c(0, p + at + s, m);
    }
    WEFT_CHECK(dcp_write_full(fd, p + at, piece, off + at, path));
    at += piece;
  }
  return WEFT_OK;
}

/* Phase 2 (no MPI): writes this rank's file and fsyncs it. */
static weft_status write_file(save_ctx *c) {
  WEFT_CHECK(copies_wait(c)); /* the host copies of device locals */
  char *path = dcp_path_join(c->dir, c->fname);
  if (!path) return weft_error(WEFT_ERR_OOM, "path");
  weft_status st = WEFT_OK;
  char *tmp = NULL;
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    st = weft_error(WEFT_ERR_IO, "save: cannot create data file '%s': %s", path, strerror(errno));
    goto done;
  }
  uint8_t h[DCP_FILE_HEADER];
  dcp_file_header(c->comm.rank, c->plan.id, c->comm.size, h);
  WEFT_CHECK_GOTO(dcp_write_full(fd, h, sizeof h, 0, path), st, done);
  const uint64_t B = (uint64_t)c->block;
  for (int64_t j = 0; j < c->njobs; j++) {
    const wjob *J = &c->jobs[j];
    const char *src = J->src;
    if (!J->contig) {
      free(tmp);
      tmp = malloc(J->length ? J->length : 1);
      if (!tmp) {
        st = weft_error(WEFT_ERR_OOM, "save: staging of %" PRIu64 " bytes", J->length);
        goto done;
      }
      WEFT_CHECK_GOTO(job_stage(J, tmp), st, done);
      src = tmp;
    }
    WEFT_CHECK_GOTO(write_bytes(fd, path, src, J->length, J->off, B, J->crc), st, done);
    if (j == 0) dcp_fault_point(c->comm.rank, "write");
    if (j == 0 && dcp_fault_errno(c->comm.rank, "write")) {
      st = weft_error(WEFT_ERR_IO, "save: cannot write data file '%s': %s", path,
                      strerror(dcp_fault_errno(c->comm.rank, "write")));
      goto done;
    }
  }
  if (c->njobs == 0) dcp_fault_point(c->comm.rank, "write");
  if (ftruncate(fd, (off_t)c->plan.file_bytes[c->comm.rank]) != 0) {
    st = weft_error(WEFT_ERR_IO, "save: %s: ftruncate: %s", path, strerror(errno));
    goto done;
  }
  if (fsync(fd) != 0) {
    st = weft_error(WEFT_ERR_IO, "save: %s: fsync: %s", path, strerror(errno));
    goto done;
  }
  if (close(fd) != 0) {
    fd = -1;
    st = weft_error(WEFT_ERR_IO, "save: %s: close: %s", path, strerror(errno));
    goto done;
  }
  fd = -1;
done:
  if (fd >= 0) close(fd);
  free(tmp);
  free(path);
  return st;
}

static void record_io(save_ctx *c, weft_status st) {
  c->io_st = st;
  if (st != WEFT_OK) snprintf(c->io_msg, sizeof c->io_msg, "%s", dcp_last_msg());
}

/* ------------------------------------------------------------ commit */

static int is_stale(const char *name, const gplan *p, int size) {
  /* r<5 digits>-<16 hex>.data of another save */
  size_t n = strlen(name);
  if (n != 28 || name[0] != 'r' || name[6] != '-' || strcmp(name + 23, ".data") != 0) return 0;
  char mine[64];
  for (int r = 0; r < size; r++) {
    dcp_file_name(r, p->id, mine, sizeof mine);
    if (strcmp(name, mine) == 0) return 0;
  }
  return 1;
}

static weft_status write_metadata(save_ctx *c, const uint32_t *const *crcs) {
  gplan *p = &c->plan;
  dcp_meta m = {0};
  weft_status st = WEFT_OK;
  char *text = NULL, *tmp = NULL, *path = NULL;
  int fd = -1;
  m.version = DCP_FORMAT_VERSION;
  m.id = p->id;
  m.world_size = c->comm.size;
  m.block = c->block;
  m.nfiles = c->comm.size;
  m.files = calloc((size_t)m.nfiles, sizeof *m.files);
  m.t = calloc((size_t)(p->nt ? p->nt : 1), sizeof *m.t);
  m.nt = p->nt;
  if (!m.files || !m.t) {
    st = weft_error(WEFT_ERR_OOM, "metadata");
    goto done;
  }
  char fn[64];
  for (int r = 0; r < m.nfiles; r++) {
    dcp_file_name(r, p->id, fn, sizeof fn);
    m.files[r].name = dcp_strdup(fn);
    m.files[r].rank = r;
    m.files[r].bytes = p->file_bytes[r];
    if (!m.files[r].name) {
      st = weft_error(WEFT_ERR_OOM, "metadata");
      goto done;
    }
  }
  for (int64_t i = 0; i < p->nt; i++) {
    const gtensor *T = &p->t[i];
    dcp_tmeta *t = &m.t[i];
    t->name = (char *)T->name; /* borrowed: not freed below */
    t->dtype = T->dtype;
    t->ndim = T->ndim;
    memcpy(t->shape, T->shape, sizeof t->shape);
    t->layout = (char *)T->layout;
    t->nchunks = T->nb;
    t->chunks = calloc((size_t)(T->nb ? T->nb : 1), sizeof *t->chunks);
    if (!t->chunks) {
      st = weft_error(WEFT_ERR_OOM, "metadata");
      goto done;
    }
    for (int64_t k = 0; k < T->nb; k++) {
      const gbox *G = &p->b[T->b0 + k];
      dcp_chunk *ch = &t->chunks[k];
      ch->box = G->box;
      ch->file = G->writer;
      ch->byte_off = G->off;
      ch->length = G->len;
      ch->crc = (uint32_t *)crcs[G->writer] + G->crc_at; /* borrowed */
      ch->ncrc = G->ncrc;
    }
  }
  m.v = p->v;
  m.nv = p->nv;
  text = dcp_meta_serialize(&m);
  if (!text) {
    st = weft_error(WEFT_ERR_OOM, "metadata text");
    goto done;
  }
  tmp = dcp_path_join(c->dir, DCP_METADATA_TMP);
  path = dcp_path_join(c->dir, DCP_METADATA);
  if (!tmp || !path) {
    st = weft_error(WEFT_ERR_OOM, "path");
    goto done;
  }
  fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    st = weft_error(WEFT_ERR_IO, "save: cannot create '%s': %s", tmp, strerror(errno));
    goto done;
  }
  WEFT_CHECK_GOTO(dcp_write_full(fd, text, strlen(text), 0, tmp), st, done);
  if (fsync(fd) != 0 || close(fd) != 0) {
    fd = -1;
    st = weft_error(WEFT_ERR_IO, "save: %s: fsync/close: %s", tmp, strerror(errno));
    goto done;
  }
  fd = -1;
  dcp_fault_point(c->comm.rank, "commit");
  if (rename(tmp, path) != 0) {
    st = weft_error(WEFT_ERR_IO, "save: rename '%s' -> '%s': %s", tmp, path, strerror(errno));
    goto done;
  }
  c->committed = true;
  WEFT_CHECK_GOTO(dcp_fsync_dir(c->dir), st, done);
  /* committed: remove data files of earlier saves into this directory */
  DIR *d = opendir(c->dir);
  if (d) {
    struct dirent *de;
    while ((de = readdir(d)))
      if (is_stale(de->d_name, p, c->comm.size)) {
        char *f = dcp_path_join(c->dir, de->d_name);
        if (f) unlink(f);
        free(f);
      }
    closedir(d);
  }
done:
  if (fd >= 0) close(fd);
  if (m.files)
    for (int r = 0; r < m.nfiles; r++) free(m.files[r].name);
  free(m.files);
  for (int64_t i = 0; m.t && i < m.nt; i++) free(m.t[i].chunks);
  free(m.t);
  free(text);
  free(tmp);
  free(path);
  return st;
}

/* After a failed save (collective on c->comm, every rank takes this path
 * alike): unless rank 0 renamed the metadata into place (then the files
 * belong to the committed checkpoint), each rank removes its data file of
 * this save and rank 0 metadata.json.tmp, so a failed save leaves the
 * directory as it was (a full disk stays no fuller; the previous
 * checkpoint and its files are untouched). Where the ranks cannot agree
 * on that, the files stay. */
static void remove_partial(save_ctx *c) {
  int mine = c->committed, any = 1;
  MPI_Request r;
  if (MPI_Iallreduce(&mine, &any, 1, MPI_INT, MPI_MAX, c->comm.comm, &r) != MPI_SUCCESS) return;
  if (dcp_wait(&r, "save: cleanup after a failed save") != WEFT_OK || any) return;
  char *f = dcp_path_join(c->dir, c->fname);
  if (f) unlink(f);
  free(f);
  if (c->comm.rank == 0) {
    f = dcp_path_join(c->dir, DCP_METADATA_TMP);
    if (f) unlink(f);
    free(f);
  }
}

/* Phase 3 (collective on c->comm). */
static weft_status commit(save_ctx *c) {
  dcp_fault_point(c->comm.rank, "synced");
  dcp_buf b = {0};
  if (c->io_st != WEFT_OK) weft_error(c->io_st, "%s", c->io_msg);
  put_status(&b, c->io_st);
  dcp_buf_u64(&b, (uint64_t)c->ncrcs);
  dcp_buf_put(&b, c->crcs, (size_t)c->ncrcs * sizeof *c->crcs);
  if (b.oom) {
    free(b.p);
    return weft_error(WEFT_ERR_OOM, "checksum exchange");
  }
  char *all = NULL;
  int64_t *displs = NULL;
  weft_status st = dcp_allgatherv(&c->comm, b.p, (int64_t)b.len, &all, &displs);
  free(b.p);
  if (st != WEFT_OK) return weft_error_trace(st, __func__);
  st = first_failure(&c->comm, all, displs, "save");
  if (st == WEFT_OK && c->comm.rank == 0) {
    const uint32_t **crcs = calloc((size_t)(unsigned)c->comm.size + 1, sizeof *crcs);
    if (!crcs) st = weft_error(WEFT_ERR_OOM, "checksums");
    for (int r = 0; crcs && r < c->comm.size && st == WEFT_OK; r++) {
      dcp_rd rd = {all + displs[r], (size_t)(displs[r + 1] - displs[r]), 0, false};
      dcp_rd_u32(&rd);
      free(dcp_rd_str(&rd));
      uint64_t n = dcp_rd_u64(&rd);
      crcs[r] = (const uint32_t *)dcp_rd_bytes(&rd, n * sizeof(uint32_t));
      if (rd.bad || (int64_t)n != c->plan.ncrc[r])
        st = weft_error(WEFT_ERR_INTERNAL,
                        "save: rank %d sent %" PRIu64 " checksums, expected %" PRId64, r, n,
                        c->plan.ncrc[r]);
    }
    /* note: crcs point into the gathered buffer, which is 1-byte aligned in
     * general; copy them into aligned storage before use */
    uint32_t *aligned = NULL;
    const uint32_t **ptrs = NULL;
    if (st == WEFT_OK) {
      size_t tot = 1;
      for (int r = 0; r < c->comm.size; r++) tot += (size_t)c->plan.ncrc[r];
      aligned = malloc(tot * sizeof *aligned);
      ptrs = calloc((size_t)(unsigned)c->comm.size + 1, sizeof *ptrs);
      if (!aligned || !ptrs) st = weft_error(WEFT_ERR_OOM, "checksums");
      int64_t at = 0;
      for (int r = 0; st == WEFT_OK && r < c->comm.size; r++) {
        memcpy(aligned + at, crcs[r], (size_t)c->plan.ncrc[r] * sizeof *aligned);
        ptrs[r] = aligned + at;
        at += c->plan.ncrc[r];
      }
    }
    if (st == WEFT_OK) st = write_metadata(c, ptrs);
    free(aligned);
    free(ptrs);
    free(crcs);
  }
  free(all);
  free(displs);
  st = dcp_agree(&c->comm, st, "save");
  if (st != WEFT_OK) remove_partial(c);
  return st;
}

/* ------------------------------------------------------------ plan phase */

static weft_status check_opts(const weft_dcp_opts *o, int64_t *block) {
  if (o && o->version != WEFT_DCP_OPTS_VERSION)
    return weft_error(WEFT_ERR_INVALID, "weft_dcp_opts version %d (this library: %d)", o->version,
                      WEFT_DCP_OPTS_VERSION);
  int64_t b = o && o->block_bytes ? o->block_bytes : DCP_DEFAULT_BLOCK;
  if (b < DCP_MIN_BLOCK || b > DCP_MAX_BLOCK || b % 8 != 0)
    return weft_error(WEFT_ERR_INVALID,
                      "block_bytes %" PRId64 " must be a multiple of 8 in [%d, %" PRId64 "]", b,
                      DCP_MIN_BLOCK, DCP_MAX_BLOCK);
  *block = b;
  return WEFT_OK;
}

/* Phase 1. On success *out is ready to write (jobs point at sd's data). */
static weft_status plan_save(const weft_state_dict *sd, const char *dir, const weft_dcp_opts *opts,
                             save_ctx **out) {
  *out = NULL;
  int64_t block = DCP_DEFAULT_BLOCK;
  /* argument errors that every rank sees alike: no communication */
  WEFT_CHECK(check_opts(opts, &block));
  if (!sd) return weft_error(WEFT_ERR_INVALID, "save: state dict is NULL");
  if (!dir || !dir[0]) return weft_error(WEFT_ERR_INVALID, "save: directory is NULL or empty");
  save_ctx *c = calloc(1, sizeof *c);
  if (!c) return weft_error(WEFT_ERR_OOM, "save");
  c->comm.comm = MPI_COMM_NULL;
  c->block = block;
  c->dir = dcp_strdup(dir);
  if (!c->dir) {
    free(c);
    return weft_error(WEFT_ERR_OOM, "save");
  }
  weft_status st = dcp_comm_open(opts ? opts->group : NULL, &c->comm);
  if (st != WEFT_OK) {
    ctx_free(c);
    return weft_error_trace(st, __func__);
  }
  litem *it = NULL;
  int64_t nit = 0;
  weft_status local = local_items(sd, &it, &nit);
  if (local == WEFT_OK) local = stage_device_locals(c, it, nit);
  if (local == WEFT_OK && c->comm.rank == 0) local = dcp_mkdirs(dir);
  uint64_t id = c->comm.rank == 0 ? new_id() : 0;
  dcp_buf b = {0};
  encode_plan(&b, local, id, it, nit, sd);
  char *all = NULL;
  int64_t *displs = NULL;
  if (b.oom)
    st = weft_error(WEFT_ERR_OOM, "save plan");
  else
    st = dcp_allgatherv(&c->comm, b.p, (int64_t)b.len, &all, &displs);
  free(b.p);
  if (st == WEFT_OK) st = first_failure(&c->comm, all, displs, "save");
  if (st == WEFT_OK) st = decode_plans(&c->comm, all, displs, &c->plan);
  if (st == WEFT_OK) st = global_plan(&c->comm, block, &c->plan);
  if (st == WEFT_OK) {
    dcp_file_name(c->comm.rank, c->plan.id, c->fname, sizeof c->fname);
    st = make_jobs(c, it, nit);
  }
  free(all);
  free(displs);
  /* the jobs read the host copies of device locals: the context keeps them */
  if (st == WEFT_OK && nit > 0) {
    c->staged = calloc((size_t)nit, sizeof *c->staged);
    if (!c->staged) st = weft_error(WEFT_ERR_OOM, "save: staged copies");
    for (int64_t i = 0; c->staged && i < nit; i++) {
      if (!it[i].staged) continue;
      c->staged[c->nstaged++] = it[i].staged;
      it[i].staged = NULL;
    }
  }
  local_items_free(it, nit);
  if (st != WEFT_OK) {
    ctx_free(c);
    return weft_error_trace(st, __func__);
  }
  dcp_fault_point(c->comm.rank, "plan");
  *out = c;
  return WEFT_OK;
}

/* ------------------------------------------------------------ public */

weft_status weft_dcp_save(const weft_state_dict *sd, const char *dir, const weft_dcp_opts *opts) {
  dcp_complete_pending();
  save_ctx *c;
  WEFT_CHECK(plan_save(sd, dir, opts, &c));
  record_io(c, write_file(c));
  weft_status st = commit(c);
  ctx_free(c);
  return st;
}

static void *async_main(void *arg) {
  weft_dcp_async *h = arg;
  record_io(h->ctx, write_file(h->ctx));
  if (h->commit_in_thread) {
    h->result = commit(h->ctx);
    if (h->result != WEFT_OK) snprintf(h->msg, sizeof h->msg, "%s", dcp_last_msg());
  }
  __atomic_store_n(&h->io_done, 1, __ATOMIC_RELEASE);
  return NULL;
}

/* Joins the thread and commits if that was left to us; the result stays
 * in h (finished). Collective when the commit happens here. */
static void async_finish(weft_dcp_async *h) {
  if (h->finished) return;
  if (h->thread_started) pthread_join(h->th, NULL);
  h->thread_started = false;
  if (!h->commit_in_thread) {
    h->result = commit(h->ctx);
    if (h->result != WEFT_OK) snprintf(h->msg, sizeof h->msg, "%s", dcp_last_msg());
  }
  ctx_free(h->ctx);
  h->ctx = NULL;
  h->finished = true;
  if (g_pending == h) g_pending = NULL;
}

void dcp_complete_pending(void) {
  if (g_pending) async_finish(g_pending);
}

weft_status weft_dcp_async_save(const weft_state_dict *sd, const char *dir,
                                const weft_dcp_opts *opts, weft_dcp_async **out) {
  if (!out) return weft_error(WEFT_ERR_INVALID, "out is NULL");
  *out = NULL;
  dcp_complete_pending();
  save_ctx *c;
  WEFT_CHECK(plan_save(sd, dir, opts, &c));
  /* stage every box this rank writes from memory the caller may change on
   * return (the host copies of device locals are the save's own: their
   * jobs read them in place once the queued copies have landed) */
  weft_status st = WEFT_OK;
  size_t total = 0;
  for (int64_t j = 0; j < c->njobs; j++)
    if (!c->jobs[j].private_src)
      total += (size_t)((c->jobs[j].length + DCP_ALIGN - 1) / DCP_ALIGN * DCP_ALIGN);
  if (g_stage && g_stage_cap >= total) {
    c->staging = g_stage;
    c->staging_cap = g_stage_cap;
    g_stage = NULL;
    g_stage_cap = 0;
  } else {
    if (g_stage) weft_free(g_stage);
    g_stage = NULL;
    g_stage_cap = 0;
    st = weft_alloc(WEFT_CPU, total, (void **)&c->staging);
    if (st == WEFT_OK) c->staging_cap = total;
  }
  if (st == WEFT_OK) {
    g_stage_busy = true;
    size_t at = 0;
    for (int64_t j = 0; j < c->njobs; j++) {
      wjob *J = &c->jobs[j];
      if (J->private_src) continue;
      int64_t cs[WEFT_MAX_DIMS];
      dcp_contig_strides(J->len, J->ndim, J->esz, cs);
      if (J->contig)
        memcpy(c->staging + at, J->src, J->length);
      else if ((st = job_stage(J, c->staging + at)) != WEFT_OK)
        break;
      J->src = c->staging + at;
      J->contig = true;
      for (int d = 0; d < J->ndim; d++) J->strides[d] = cs[d];
      at += (size_t)((J->length + DCP_ALIGN - 1) / DCP_ALIGN * DCP_ALIGN);
    }
  }
  /* (the host copies of device locals stay until the write is done) */
  weft_dcp_async *h = NULL;
  if (st == WEFT_OK) {
    h = calloc(1, sizeof *h);
    if (!h) st = weft_error(WEFT_ERR_OOM, "async save handle");
  }
  /* every rank must agree that staging worked before any writes */
  st = dcp_agree(&c->comm, st, "async save");
  if (st != WEFT_OK) {
    free(h);
    ctx_free(c);
    return weft_error_trace(st, __func__);
  }
  h->ctx = c;
  h->commit_in_thread = dcp_thread_multiple() && !(opts && opts->commit_in_wait);
  if (pthread_create(&h->th, NULL, async_main, h) != 0) {
    /* no thread: do the I/O here (the handle still commits in wait) */
    h->commit_in_thread = false;
    record_io(c, write_file(c));
    h->io_done = 1;
  } else {
    h->thread_started = true;
  }
  g_pending = h;
  *out = h;
  return WEFT_OK;
}

weft_status weft_dcp_async_wait(weft_dcp_async *h) {
  if (!h) return WEFT_OK;
  async_finish(h);
  weft_status st = h->result;
  if (st != WEFT_OK) weft_error(st, "%s", h->msg);
  free(h);
  return st;
}

weft_status weft_dcp_async_test(weft_dcp_async *h, bool *done) {
  if (!h || !done) return weft_error(WEFT_ERR_INVALID, "handle or done is NULL");
  *done = h->finished || __atomic_load_n(&h->io_done, __ATOMIC_ACQUIRE);
  return WEFT_OK;
}

weft_status weft_dcp_release_staging(void) {
  if (g_stage_busy) return weft_error(WEFT_ERR_BUSY, "an async save is using the staging buffers");
  if (g_stage) weft_free(g_stage);
  g_stage = NULL;
  g_stage_cap = 0;
  dcp_pinned_release();
  return WEFT_OK;
}
