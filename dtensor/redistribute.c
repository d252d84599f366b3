/* dtensor/redistribute.c — running a redistribute plan on this rank.
 *
 * Each step moves data over one mesh dim i (group = the ranks that differ
 * from this one only in coordinate i). What a rank sends to a peer is the
 * intersection of its old holding with the peer's new holding (dt_xfer),
 * packed densely in the receiver's order; buffers are used in place
 * whenever the packed form is already a contiguous piece of the local
 * tensor (S(0) -> R, P -> R, P -> S(0) on even sizes need no copies at all,
 * S(0) -> S(1) packs only on the sending side, like a hand-written program).
 */
#include <stdlib.h>
#include <string.h>

#include "dtensor_internal.h"

void dt_my_coords(const weft_mesh *mesh, int *coords) {
  int n = weft_mesh_ndim(mesh);
  for (int i = 0; i < n; i++) coords[i] = weft_mesh_coord(mesh, i);
}

/* The result tensor of a step, on the input's device: the caller's preset
 * (last step of a redistribute_into) or a new one. */
static weft_status out_tensor(const weft_dtensor_spec *spec, const dt_box *box, weft_device dev,
                              weft_tensor *preset, weft_tensor **out) {
  if (preset) {
    *out = preset;
    return WEFT_OK;
  }
  int64_t shape[WEFT_MAX_DIMS];
  for (int d = 0; d < spec->ndim; d++) shape[d] = dt_runs_total(&box->d[d]);
  return dt_tensor_new(dev, spec->dtype, spec->ndim, shape, out);
}

static void drop(weft_tensor *t, const weft_tensor *preset) {
  if (t != preset) dt_tensor_release(t);
}

/* If the packed form of x is one contiguous piece of a contiguous tensor of
 * holding sizes `full` (side a: positions pa, else pb), its element offset. */
static bool xfer_contig(const dt_xfer *x, bool side_a, const int64_t *full, int64_t *offset) {
  if (x->numel == 0) {
    *offset = 0;
    return true;
  }
  int nd = x->ndim;
  int64_t off = 0, stride = 1;
  for (int d = nd - 1; d >= 0; d--) {
    if (x->seg[d].n != 1) return false;
    const dt_seg *s = &x->seg[d].s[0];
    int64_t pos = side_a ? s->pa : s->pb;
    off += pos * stride;
    stride *= full[d];
  }
  /* contiguous iff after the first dim (from the outside) with len > 1 every
   * later dim is full */
  bool multi = false;
  for (int d = 0; d < nd; d++) {
    const dt_seg *s = &x->seg[d].s[0];
    if (multi && (s->len != full[d])) return false;
    if (s->len > 1) multi = true;
  }
  *offset = off;
  return true;
}

static void box_sizes(const dt_box *b, int64_t *sizes) {
  for (int d = 0; d < b->ndim; d++) sizes[d] = dt_runs_total(&b->d[d]);
}

typedef struct group_ctx {
  int m;
  int me;
  dt_box *boxes; /* m boxes (old or new holdings of each group member) */
  dt_xfer *xf;   /* m transfers */
} group_ctx;

static void boxes_free(dt_box *b, int m) {
  if (!b) return;
  for (int c = 0; c < m; c++) dt_box_free(&b[c]);
  free(b);
}

static void xfers_free(dt_xfer *x, int m) {
  if (!x) return;
  for (int c = 0; c < m; c++) dt_xfer_free(&x[c]);
  free(x);
}

/* Holdings of every member of mesh dim i's group under spec. */
static weft_status group_boxes(const weft_dtensor_spec *spec, const int *me, int i, dt_box **out) {
  int m = spec->mesh_shape[i];
  dt_box *b = calloc((size_t)m, sizeof *b);
  if (!b) return weft_error(WEFT_ERR_OOM, "%d boxes", m);
  int c[WEFT_MESH_MAX_DIMS];
  memcpy(c, me, sizeof c);
  for (int k = 0; k < m; k++) {
    c[i] = k;
    weft_status st = dt_box_of(spec, c, &b[k]);
    if (st != WEFT_OK) {
      boxes_free(b, m);
      return weft_error_trace(st, __func__);
    }
  }
  *out = b;
  return WEFT_OK;
}

/* Scratch through the buffer cache; *size remembers the request for put. */
static weft_status alloc_buf(weft_device dev, size_t bytes, void **out, size_t *size) {
  *size = bytes;
  return dt_buf_get(dev, bytes, out);
}

/* ------------------------------------------------------------- steps */

static weft_status step_local(const weft_dtensor_spec *x, const weft_dtensor_spec *y, const int *me,
                              const weft_tensor *in, weft_tensor *preset, weft_tensor **out) {
  dt_box o = {0}, n = {0};
  dt_xfer xf = {0};
  weft_tensor *t = NULL;
  weft_status st;
  WEFT_CHECK_GOTO(dt_box_of(x, me, &o), st, done);
  WEFT_CHECK_GOTO(dt_box_of(y, me, &n), st, done);
  WEFT_CHECK_GOTO(dt_xfer_make(&o, &n, &xf), st, done);
  if (xf.numel != dt_box_numel(&n)) {
    st = weft_error(WEFT_ERR_INTERNAL, "local step: new holding not inside the old one");
    goto done;
  }
  WEFT_CHECK_GOTO(out_tensor(y, &n, in->device, preset, &t), st, done);
  WEFT_CHECK_GOTO(dt_xfer_copy(&xf, in, t), st, done);
  *out = t;
  t = NULL;
done:
  drop(t, preset);
  dt_xfer_free(&xf);
  dt_box_free(&o);
  dt_box_free(&n);
  return st;
}

static weft_status step_partition(const weft_dtensor_spec *x, const int *me, int i,
                                  weft_placement to, const weft_tensor *in, weft_tensor *preset,
                                  weft_tensor **out) {
  weft_tensor *t;
  weft_status st = WEFT_OK;
  if (preset) {
    t = preset;
    WEFT_CHECK(weft_tensor_copy(t, in));
  } else {
    WEFT_CHECK(weft_tensor_clone(in, &t));
  }
  int m = x->mesh_shape[i];
  if (to.op == WEFT_OP_SUM && m > 1) {
    if (weft_dtype_is_float(x->dtype)) {
      /* PyTorch's Partial._partition_value: tensor / num_chunks, a true
       * division (x * (1/3) is 1 ulp off x / 3 for about a third of x) */
      st = weft_div_scalar(t, (double)m);
    } else if (me[i] != 0) {
      /* integers: keep the value on coordinate 0, zeros elsewhere (exact) */
      st = weft_memset(t->device, t->data, 0, weft_tensor_nbytes(t));
    }
  }
  if (st != WEFT_OK) {
    drop(t, preset);
    return weft_error_trace(st, __func__);
  }
  *out = t;
  return WEFT_OK;
}

static weft_status step_all_reduce(const weft_mesh *mesh, const weft_dtensor_spec *x, int i,
                                   weft_reduce_op op, const weft_tensor *in, weft_tensor *preset,
                                   weft_tensor **out) {
  weft_tensor *t;
  weft_status st;
  if (weft_tensor_is_contiguous(in)) {
    if (preset)
      t = preset;
    else
      WEFT_CHECK(dt_tensor_new(in->device, x->dtype, in->ndim, in->shape, &t));
    st = weft_all_reduce(mesh, i, in->data, t->data, weft_tensor_numel(in), x->dtype, op, NULL);
  } else {
    if (preset) {
      t = preset;
      WEFT_CHECK(weft_tensor_copy(t, in));
    } else {
      WEFT_CHECK(weft_tensor_clone(in, &t));
    }
    st = weft_all_reduce(mesh, i, t->data, t->data, weft_tensor_numel(t), x->dtype, op, NULL);
  }
  if (st != WEFT_OK) {
    drop(t, preset);
    return weft_error_trace(st, __func__);
  }
  *out = t;
  return WEFT_OK;
}

/* S -> R: all-gather (exact counts when uneven). */
static weft_status step_all_gather(const weft_mesh *mesh, const weft_dtensor_spec *x,
                                   const weft_dtensor_spec *y, const int *me, int i,
                                   const weft_tensor *in, weft_tensor *preset, weft_tensor **out) {
  int m = x->mesh_shape[i];
  size_t esz = weft_dtype_size(x->dtype);
  dt_box *ob = NULL, nb = {0};
  dt_xfer *xf = NULL;
  int64_t *counts = NULL;
  void *sendbuf = NULL, *recvbuf = NULL;
  size_t sendsz = 0, recvsz = 0;
  weft_tensor *t = NULL;
  weft_status st;
  WEFT_CHECK_GOTO(group_boxes(x, me, i, &ob), st, done);
  WEFT_CHECK_GOTO(dt_box_of(y, me, &nb), st, done);
  xf = calloc((size_t)m, sizeof *xf);
  counts = calloc((size_t)m, sizeof *counts);
  if (!xf || !counts) {
    st = weft_error(WEFT_ERR_OOM, "all-gather bookkeeping");
    goto done;
  }
  bool even = true;
  int64_t total = 0;
  for (int c = 0; c < m; c++) {
    WEFT_CHECK_GOTO(dt_xfer_make(&ob[c], &nb, &xf[c]), st, done);
    counts[c] = xf[c].numel;
    total += counts[c];
    if (counts[c] != counts[0]) even = false;
  }
  WEFT_CHECK_GOTO(out_tensor(y, &nb, in->device, preset, &t), st, done);
  int64_t osz[WEFT_MAX_DIMS], nsz[WEFT_MAX_DIMS], off;
  box_sizes(&ob[me[i]], osz);
  box_sizes(&nb, nsz);
  /* send side */
  const void *send;
  if (weft_tensor_is_contiguous(in) && xfer_contig(&xf[me[i]], true, osz, &off)) {
    send = (const char *)in->data + (size_t)off * esz;
  } else {
    WEFT_CHECK_GOTO(alloc_buf(in->device, (size_t)counts[me[i]] * esz, &sendbuf, &sendsz), st,
                    done);
    WEFT_CHECK_GOTO(dt_xfer_pack(&xf[me[i]], in, sendbuf), st, done);
    send = sendbuf;
  }
  /* receive side: straight into the new local tensor when the blocks are
   * consecutive pieces of it in rank order */
  bool direct = true;
  int64_t disp = 0;
  for (int c = 0; c < m && direct; c++) {
    if (counts[c] == 0) continue;
    if (!xfer_contig(&xf[c], false, nsz, &off) || off != disp) direct = false;
    disp += counts[c];
  }
  void *recv;
  if (direct) {
    recv = t->data;
  } else {
    WEFT_CHECK_GOTO(alloc_buf(in->device, (size_t)total * esz, &recvbuf, &recvsz), st, done);
    recv = recvbuf;
  }
  if (even)
    st = weft_all_gather(mesh, i, send, recv, counts[0], x->dtype, NULL);
  else
    st = weft_all_gather_v(mesh, i, send, recv, counts, x->dtype, NULL);
  if (st != WEFT_OK) goto done;
  if (!direct) {
    int64_t at = 0;
    for (int c = 0; c < m; c++) {
      WEFT_CHECK_GOTO(dt_xfer_unpack(&xf[c], (const char *)recvbuf + (size_t)at * esz, t), st,
                      done);
      at += counts[c];
    }
  }
  *out = t;
  t = NULL;
done:
  drop(t, preset);
  dt_buf_put(sendbuf, sendsz);
  dt_buf_put(recvbuf, recvsz);
  xfers_free(xf, m);
  free(counts);
  boxes_free(ob, m);
  dt_box_free(&nb);
  if (st != WEFT_OK) weft_error_trace(st, __func__);
  return st;
}

/* S(a) -> S(b): all-to-all (exact counts when uneven). */
static weft_status step_all_to_all(const weft_mesh *mesh, const weft_dtensor_spec *x,
                                   const weft_dtensor_spec *y, const int *me, int i,
                                   const weft_tensor *in, weft_tensor *preset, weft_tensor **out) {
  int m = x->mesh_shape[i], r = me[i];
  size_t esz = weft_dtype_size(x->dtype);
  dt_box *ob = NULL, *nb = NULL;
  dt_xfer *xs = NULL, *xr = NULL;
  int64_t *sc = NULL, *sd = NULL, *rc = NULL, *rd = NULL;
  void *sendbuf = NULL, *recvbuf = NULL;
  size_t sendsz = 0, recvsz = 0;
  weft_tensor *t = NULL;
  weft_status st;
  WEFT_CHECK_GOTO(group_boxes(x, me, i, &ob), st, done);
  WEFT_CHECK_GOTO(group_boxes(y, me, i, &nb), st, done);
  xs = calloc((size_t)m, sizeof *xs);
  xr = calloc((size_t)m, sizeof *xr);
  sc = calloc((size_t)m * 4, sizeof *sc);
  if (!xs || !xr || !sc) {
    st = weft_error(WEFT_ERR_OOM, "all-to-all bookkeeping");
    goto done;
  }
  sd = sc + m;
  rc = sd + m;
  rd = rc + m;
  for (int c = 0; c < m; c++) {
    WEFT_CHECK_GOTO(dt_xfer_make(&ob[r], &nb[c], &xs[c]), st, done);
    WEFT_CHECK_GOTO(dt_xfer_make(&ob[c], &nb[r], &xr[c]), st, done);
    sc[c] = xs[c].numel;
    rc[c] = xr[c].numel;
  }
  WEFT_CHECK_GOTO(out_tensor(y, &nb[r], in->device, preset, &t), st, done);
  int64_t osz[WEFT_MAX_DIMS], nsz[WEFT_MAX_DIMS];
  box_sizes(&ob[r], osz);
  box_sizes(&nb[r], nsz);
  /* fixed-count all-to-all only when every block of the whole group's
   * m x m exchange has one size (a group-wide decision: every member
   * computes the same matrix) */
  bool even = true;
  for (int s = 0; s < m && even; s++)
    for (int c = 0; c < m && even; c++) {
      int64_t cnt = 1;
      for (int d = 0; d < ob[s].ndim; d++) cnt *= dt_intersect_count(&ob[s].d[d], &nb[c].d[d]);
      if (cnt != sc[0]) even = false;
    }
  /* send: in place when every block is a contiguous piece of the input */
  bool sdirect = weft_tensor_is_contiguous(in);
  for (int c = 0; c < m && sdirect; c++)
    if (!xfer_contig(&xs[c], true, osz, &sd[c])) sdirect = false;
  const void *send = in->data;
  if (sdirect && even)
    for (int c = 0; c < m; c++)
      if (sc[c] && sd[c] != c * sc[0]) sdirect = false;
  if (!sdirect) {
    int64_t tot = 0;
    for (int c = 0; c < m; c++) {
      sd[c] = tot;
      tot += sc[c];
    }
    WEFT_CHECK_GOTO(alloc_buf(in->device, (size_t)tot * esz, &sendbuf, &sendsz), st, done);
    for (int c = 0; c < m; c++)
      WEFT_CHECK_GOTO(dt_xfer_pack(&xs[c], in, (char *)sendbuf + (size_t)sd[c] * esz), st, done);
    send = sendbuf;
  }
  bool rdirect = true;
  for (int c = 0; c < m && rdirect; c++)
    if (!xfer_contig(&xr[c], false, nsz, &rd[c])) rdirect = false;
  if (rdirect && even)
    for (int c = 0; c < m; c++)
      if (rc[c] && rd[c] != c * rc[0]) rdirect = false;
  void *recv = t->data;
  if (!rdirect) {
    int64_t tot = 0;
    for (int c = 0; c < m; c++) {
      rd[c] = tot;
      tot += rc[c];
    }
    WEFT_CHECK_GOTO(alloc_buf(in->device, (size_t)tot * esz, &recvbuf, &recvsz), st, done);
    recv = recvbuf;
  }
  if (even)
    st = weft_all_to_all(mesh, i, send, recv, sc[0], x->dtype, NULL);
  else
    st = weft_all_to_all_v(mesh, i, send, sc, sd, recv, rc, rd, x->dtype, NULL);
  if (st != WEFT_OK) goto done;
  if (!rdirect)
    for (int c = 0; c < m; c++)
      WEFT_CHECK_GOTO(dt_xfer_unpack(&xr[c], (const char *)recvbuf + (size_t)rd[c] * esz, t), st,
                      done);
  *out = t;
  t = NULL;
done:
  drop(t, preset);
  dt_buf_put(sendbuf, sendsz);
  dt_buf_put(recvbuf, recvsz);
  xfers_free(xs, m);
  xfers_free(xr, m);
  free(sc);
  boxes_free(ob, m);
  boxes_free(nb, m);
  if (st != WEFT_OK) weft_error_trace(st, __func__);
  return st;
}

/* P -> S: reduce-scatter (blocks padded to the largest for uneven shards). */
static weft_status step_reduce_scatter(const weft_mesh *mesh, const weft_dtensor_spec *x,
                                       const weft_dtensor_spec *y, const int *me, int i,
                                       weft_reduce_op op, const weft_tensor *in,
                                       weft_tensor *preset, weft_tensor **out) {
  int m = x->mesh_shape[i], r = me[i];
  size_t esz = weft_dtype_size(x->dtype);
  dt_box ob = {0}, *nb = NULL;
  dt_xfer *xs = NULL;
  void *sendbuf = NULL, *recvbuf = NULL;
  size_t sendsz = 0, recvsz = 0;
  weft_tensor *t = NULL;
  weft_status st;
  WEFT_CHECK_GOTO(dt_box_of(x, me, &ob), st, done);
  WEFT_CHECK_GOTO(group_boxes(y, me, i, &nb), st, done);
  xs = calloc((size_t)m, sizeof *xs);
  if (!xs) {
    st = weft_error(WEFT_ERR_OOM, "reduce-scatter bookkeeping");
    goto done;
  }
  int64_t count = 0;
  bool even = true;
  for (int c = 0; c < m; c++) {
    WEFT_CHECK_GOTO(dt_xfer_make(&ob, &nb[c], &xs[c]), st, done);
    if (xs[c].numel > count) count = xs[c].numel;
  }
  for (int c = 0; c < m; c++)
    if (xs[c].numel != count) even = false;
  WEFT_CHECK_GOTO(out_tensor(y, &nb[r], in->device, preset, &t), st, done);
  int64_t osz[WEFT_MAX_DIMS];
  box_sizes(&ob, osz);
  bool sdirect = even && weft_tensor_is_contiguous(in);
  for (int c = 0; c < m && sdirect; c++) {
    int64_t off;
    if (!xfer_contig(&xs[c], true, osz, &off) || (count && off != c * count)) sdirect = false;
  }
  const void *send = in->data;
  if (!sdirect) {
    WEFT_CHECK_GOTO(alloc_buf(in->device, (size_t)(count * m) * esz, &sendbuf, &sendsz), st, done);
    for (int c = 0; c < m; c++) {
      char *blk = (char *)sendbuf + (size_t)(c * count) * esz;
      WEFT_CHECK_GOTO(dt_xfer_pack(&xs[c], in, blk), st, done);
      /* padding joins the reduction and is dropped; keep it defined */
      if (count > xs[c].numel)
        WEFT_CHECK_GOTO(weft_memset(in->device, blk + (size_t)xs[c].numel * esz, 0,
                                    (size_t)(count - xs[c].numel) * esz),
                        st, done);
    }
    send = sendbuf;
  }
  void *recv = t->data;
  if (xs[r].numel != count) {
    WEFT_CHECK_GOTO(alloc_buf(in->device, (size_t)count * esz, &recvbuf, &recvsz), st, done);
    recv = recvbuf;
  }
  st = weft_reduce_scatter(mesh, i, send, recv, count, x->dtype, op, NULL);
  if (st != WEFT_OK) goto done;
  if (recvbuf && xs[r].numel)
    WEFT_CHECK_GOTO(
        weft_memcpy(t->device, t->data, recvbuf, (size_t)xs[r].numel * esz, WEFT_COPY_D2D), st,
        done);
  *out = t;
  t = NULL;
done:
  drop(t, preset);
  dt_buf_put(sendbuf, sendsz);
  dt_buf_put(recvbuf, recvsz);
  xfers_free(xs, m);
  dt_box_free(&ob);
  boxes_free(nb, m);
  if (st != WEFT_OK) weft_error_trace(st, __func__);
  return st;
}

/* ------------------------------------------------------------------ run */

weft_status dt_redistribute_run(const weft_dtensor *dt, const weft_dtensor_spec *dst_spec,
                                const dt_plan *plan, weft_tensor *into, weft_dtensor **out) {
  if (into && into->device != dt->local->device)
    return weft_error(WEFT_ERR_INVALID, "redistribute_into: `into` is on %s but the DTensor on %s",
                      weft_device_name(into->device), weft_device_name(dt->local->device));
  int me[WEFT_MESH_MAX_DIMS];
  dt_my_coords(dt->mesh, me);
  /* the last step writes straight into `into` when it is a dense tensor of
   * the right shape (checked by the caller), else the result is copied */
  weft_tensor *preset = into && weft_tensor_is_contiguous(into) ? into : NULL;
  weft_dtensor_spec cur = dt->spec;
  const weft_tensor *in = dt->local;
  weft_tensor *owned = NULL; /* intermediate result */
  weft_status st = WEFT_OK;
  for (int s = 0; s < plan->nsteps; s++) {
    const dt_step *stp = &plan->steps[s];
    int i = stp->mesh_dim;
    weft_dtensor_spec next = cur;
    next.placements[i] = stp->to;
    weft_tensor *res = NULL;
    weft_tensor *pre = s == plan->nsteps - 1 ? preset : NULL;
    dt_step_kind kind = stp->kind;
    if (cur.mesh_shape[i] == 1 && kind != DT_STEP_PARTITION) kind = DT_STEP_LOCAL;
    switch (kind) {
      case DT_STEP_LOCAL:
        st = step_local(&cur, &next, me, in, pre, &res);
        break;
      case DT_STEP_PARTITION:
        st = step_partition(&cur, me, i, stp->to, in, pre, &res);
        break;
      case DT_STEP_ALL_GATHER:
        st = step_all_gather(dt->mesh, &cur, &next, me, i, in, pre, &res);
        break;
      case DT_STEP_ALL_TO_ALL:
        st = step_all_to_all(dt->mesh, &cur, &next, me, i, in, pre, &res);
        break;
      case DT_STEP_ALL_REDUCE:
        st = step_all_reduce(dt->mesh, &cur, i, stp->from.op, in, pre, &res);
        break;
      case DT_STEP_REDUCE_SCATTER:
        st = step_reduce_scatter(dt->mesh, &cur, &next, me, i, stp->from.op, in, pre, &res);
        break;
    }
    if (st != WEFT_OK) {
      dt_tensor_release(owned);
      return weft_error_trace(st, __func__);
    }
    dt_tensor_release(owned);
    owned = res == preset ? NULL : res;
    in = res;
    cur = next;
  }
  if (into) {
    if (in != into) st = weft_tensor_copy(into, in); /* no steps, or a strided `into` */
    dt_tensor_release(owned);
    if (st != WEFT_OK) return weft_error_trace(st, __func__);
    return WEFT_OK;
  }
  if (!owned) WEFT_CHECK(weft_tensor_clone(dt->local, &owned));
  st = dt_wrap(dt->mesh, dst_spec, owned, true, out);
  if (st != WEFT_OK) weft_tensor_destroy(owned);
  return st;
}
