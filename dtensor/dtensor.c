/* dtensor/dtensor.c — the DTensor object: construction (empty, distribute,
 * from_local), consistency checks, exits (to_local, full_tensor),
 * redistribute entry points, accessors and RNG fills. */
#include <stdlib.h>
#include <string.h>

#include "dtensor_internal.h"

/* ------------------------------------------------------------- helpers */

bool dt_same_mesh(const weft_mesh *a, const weft_mesh *b) {
  if (a == b) return true;
  if (!a || !b) return false;
  int n = weft_mesh_ndim(a);
  if (n != weft_mesh_ndim(b)) return false;
  for (int i = 0; i < n; i++)
    if (weft_mesh_dim_size(a, i) != weft_mesh_dim_size(b, i) ||
        weft_mesh_dim_comm(a, i) != weft_mesh_dim_comm(b, i))
      return false;
  return true;
}

weft_status dt_wrap(weft_mesh *mesh, const weft_dtensor_spec *spec, weft_tensor *local, bool owns,
                    weft_dtensor **out) {
  weft_dtensor *dt = calloc(1, sizeof *dt);
  if (!dt) return weft_error(WEFT_ERR_OOM, "DTensor header");
  dt->mesh = mesh;
  dt->spec = *spec;
  dt->local = local;
  dt->owns_local = owns;
  weft_mesh_retain(mesh);
  *out = dt;
  return WEFT_OK;
}

static weft_status check_out(weft_dtensor **out) {
  if (!out) return weft_error(WEFT_ERR_INVALID, "out is NULL");
  *out = NULL;
  return WEFT_OK;
}

static weft_status check_dt(const weft_dtensor *dt, const char *what) {
  if (!dt) return weft_error(WEFT_ERR_INVALID, "%s is NULL", what);
  return WEFT_OK;
}

void weft_dtensor_destroy(weft_dtensor *dt) {
  if (!dt) return;
  /* a VIEW's header is ours too (it owns no data), so destroy frees just it;
   * an owned buffer may go back to the buffer cache */
  if (dt->owns_local)
    dt_tensor_release(dt->local);
  else
    weft_tensor_destroy(dt->local);
  weft_mesh_release(dt->mesh);
  free(dt);
}

/* ------------------------------------------------------------- accessors */

weft_tensor *weft_dtensor_local(const weft_dtensor *dt) { return dt ? dt->local : NULL; }
weft_mesh *weft_dtensor_mesh(const weft_dtensor *dt) { return dt ? dt->mesh : NULL; }
const weft_dtensor_spec *weft_dtensor_get_spec(const weft_dtensor *dt) {
  return dt ? &dt->spec : NULL;
}
const weft_placement *weft_dtensor_placements(const weft_dtensor *dt) {
  return dt ? dt->spec.placements : NULL;
}
int weft_dtensor_ndim(const weft_dtensor *dt) { return dt ? dt->spec.ndim : 0; }
const int64_t *weft_dtensor_shape(const weft_dtensor *dt) { return dt ? dt->spec.shape : NULL; }
weft_dtype weft_dtensor_dtype(const weft_dtensor *dt) { return dt ? dt->spec.dtype : WEFT_F32; }

bool weft_dtensor_local_offset(const weft_dtensor *dt, int64_t *global_offset) {
  int me[WEFT_MESH_MAX_DIMS];
  dt_my_coords(dt->mesh, me);
  bool contig = true;
  if (weft_dtensor_spec_local_shape(&dt->spec, me, NULL, global_offset, &contig) != WEFT_OK)
    return false;
  return contig;
}

weft_status weft_dtensor_ranges(const weft_dtensor *dt, int dim, weft_range *ranges, int cap,
                                int *count) {
  WEFT_CHECK(check_dt(dt, "dt"));
  int me[WEFT_MESH_MAX_DIMS];
  dt_my_coords(dt->mesh, me);
  WEFT_CHECK(weft_dtensor_spec_ranges(&dt->spec, me, dim, ranges, cap, count));
  return WEFT_OK;
}

weft_status weft_dtensor_local_boxes(const weft_dtensor *dt, weft_local_box **out, int64_t *n) {
  WEFT_CHECK(check_dt(dt, "dt"));
  int me[WEFT_MESH_MAX_DIMS];
  dt_my_coords(dt->mesh, me);
  return weft_dtensor_spec_local_boxes(&dt->spec, me, out, n);
}

void weft_dtensor_describe(const weft_dtensor *dt, char *buf, size_t cap) {
  if (!buf || !cap) return;
  if (!dt) {
    snprintf(buf, cap, "(null)");
    return;
  }
  char spec[512], mesh[256], loc[128], off[128];
  weft_dtensor_spec_describe(&dt->spec, spec, sizeof spec);
  weft_mesh_describe(dt->mesh, mesh, sizeof mesh);
  weft_tensor_describe(dt->local, loc, sizeof loc);
  int64_t o[WEFT_MAX_DIMS];
  weft_dtensor_local_offset(dt, o);
  size_t at = 0;
  off[0] = '\0';
  for (int d = 0; d < dt->spec.ndim && at < sizeof off; d++)
    at += (size_t)snprintf(off + at, sizeof off - at, "%s%lld", d ? ", " : "", (long long)o[d]);
  snprintf(buf, cap, "%s [%s], local %s at [%s]", spec, mesh, loc, off);
}

/* ------------------------------------------------------------ creation */

static weft_status make_empty(weft_mesh *mesh, weft_device dev, weft_dtype dtype, int ndim,
                              const int64_t *shape, const weft_placement *pl, int n, bool zero,
                              weft_dtensor **out) {
  WEFT_CHECK(check_out(out));
  if (!mesh) return weft_error(WEFT_ERR_INVALID, "mesh is NULL");
  weft_dtensor_spec spec;
  WEFT_CHECK(weft_dtensor_spec_init_mesh(&spec, mesh, pl, n, dtype, ndim, shape));
  int me[WEFT_MESH_MAX_DIMS];
  int64_t lshape[WEFT_MAX_DIMS];
  dt_my_coords(mesh, me);
  WEFT_CHECK(weft_dtensor_spec_local_shape(&spec, me, lshape, NULL, NULL));
  weft_tensor *t;
  if (zero)
    WEFT_CHECK(weft_tensor_zeros(dtype, dev, ndim, lshape, &t));
  else
    WEFT_CHECK(weft_tensor_create(dtype, dev, ndim, lshape, &t));
  weft_status st = dt_wrap(mesh, &spec, t, true, out);
  if (st != WEFT_OK) weft_tensor_destroy(t);
  return st;
}

weft_status weft_dtensor_empty(weft_mesh *mesh, weft_dtype dtype, int ndim, const int64_t *shape,
                               const weft_placement *placements, int nplacements,
                               weft_dtensor **out) {
  WEFT_CHECK(make_empty(mesh, weft_mesh_device(mesh), dtype, ndim, shape, placements, nplacements,
                        false, out));
  return WEFT_OK;
}

weft_status weft_dtensor_zeros(weft_mesh *mesh, weft_dtype dtype, int ndim, const int64_t *shape,
                               const weft_placement *placements, int nplacements,
                               weft_dtensor **out) {
  WEFT_CHECK(make_empty(mesh, weft_mesh_device(mesh), dtype, ndim, shape, placements, nplacements,
                        true, out));
  return WEFT_OK;
}

weft_status weft_dtensor_zeros_on(weft_mesh *mesh, weft_device dev, weft_dtype dtype, int ndim,
                                  const int64_t *shape, const weft_placement *placements,
                                  int nplacements, weft_dtensor **out) {
  WEFT_CHECK(check_out(out));
  if (mesh && dev != weft_mesh_device(mesh) && dev != WEFT_CPU)
    return weft_error(WEFT_ERR_INVALID,
                      "zeros_on: a local on %s for a mesh on %s (the mesh's device or the CPU)",
                      weft_device_name(dev), weft_device_name(weft_mesh_device(mesh)));
  WEFT_CHECK(make_empty(mesh, dev, dtype, ndim, shape, placements, nplacements, true, out));
  return WEFT_OK;
}

weft_status weft_dtensor_zeros_like(const weft_dtensor *t, weft_dtype dtype, weft_dtensor **out) {
  WEFT_CHECK(check_out(out));
  if (!t) return weft_error(WEFT_ERR_INVALID, "zeros_like: the tensor is NULL");
  const weft_dtensor_spec *s = weft_dtensor_get_spec(t);
  WEFT_CHECK(make_empty(weft_dtensor_mesh(t), weft_dtensor_local(t)->device, dtype, s->ndim,
                        s->shape, s->placements, s->mesh_ndim, true, out));
  return WEFT_OK;
}

/* Collective over the whole mesh: max of a flag (chained over the dims). */
static weft_status mesh_any(const weft_mesh *mesh, int64_t *flag) {
  int n = weft_mesh_ndim(mesh);
  for (int i = 0; i < n; i++)
    WEFT_CHECK(weft_all_reduce(mesh, i, flag, flag, 1, WEFT_I64, WEFT_OP_MAX, NULL));
  return WEFT_OK;
}

/* Sorted union over every coordinate of the mesh dims >= from of the
 * holding along each tensor dim, for the coordinates below `from` of me. */
static weft_status union_box(const weft_dtensor_spec *spec, const int *me, int from, dt_box *out) {
  out->ndim = spec->ndim;
  for (int d = 0; d < spec->ndim; d++) {
    int dims[WEFT_MESH_MAX_DIMS], nd = 0;
    for (int i = from; i < spec->mesh_ndim; i++)
      if (weft_placement_is_shard(spec->placements[i]) && spec->placements[i].dim == d)
        dims[nd++] = i;
    int c[WEFT_MESH_MAX_DIMS];
    memcpy(c, me, sizeof c);
    for (int k = 0; k < nd; k++) c[dims[k]] = 0;
    /* mark the covered indices with an interval list: collect and merge */
    dt_runs all = {0};
    weft_status st = WEFT_OK;
    for (;;) {
      dt_runs h = {0};
      st = dt_holding(spec, c, d, &h);
      for (int r = 0; st == WEFT_OK && r < h.n; r++) {
        /* plain append; sorted merge below */
        if (all.n == all.cap) {
          int ncap = all.cap ? 2 * all.cap : 8;
          weft_range *nr = realloc(all.r, (size_t)ncap * sizeof *nr);
          if (!nr) {
            st = weft_error(WEFT_ERR_OOM, "union of holdings");
            break;
          }
          all.r = nr;
          all.cap = ncap;
        }
        all.r[all.n++] = h.r[r];
      }
      dt_runs_free(&h);
      if (st != WEFT_OK) break;
      int k = nd - 1;
      while (k >= 0) {
        if (++c[dims[k]] < spec->mesh_shape[dims[k]]) break;
        c[dims[k]] = 0;
        k--;
      }
      if (k < 0) break;
    }
    if (st != WEFT_OK) {
      dt_runs_free(&all);
      return st;
    }
    /* sort by start (insertion sort: lists are short) and merge */
    for (int a = 1; a < all.n; a++) {
      weft_range v = all.r[a];
      int b = a - 1;
      while (b >= 0 && all.r[b].start > v.start) {
        all.r[b + 1] = all.r[b];
        b--;
      }
      all.r[b + 1] = v;
    }
    out->d[d].n = 0;
    int64_t end = -1;
    for (int a = 0; a < all.n; a++) {
      int64_t s = all.r[a].start, e = s + all.r[a].len;
      if (end >= 0 && s <= end) {
        if (e > end) {
          out->d[d].r[out->d[d].n - 1].len += e - end;
          end = e;
        }
      } else {
        st = dt_runs_push(&out->d[d], s, e - s);
        if (st != WEFT_OK) break;
        end = e;
      }
    }
    dt_runs_free(&all);
    WEFT_CHECK(st);
  }
  return WEFT_OK;
}

static weft_status full_box(const weft_dtensor_spec *spec, dt_box *out) {
  out->ndim = spec->ndim;
  for (int d = 0; d < spec->ndim; d++) WEFT_CHECK(dt_runs_push(&out->d[d], 0, spec->shape[d]));
  return WEFT_OK;
}

/* This rank's piece of `full` (any strides, on `dev`). */
static weft_status slice_from_full(const weft_dtensor_spec *spec, const int *me, weft_device dev,
                                   const weft_tensor *full, weft_tensor **out) {
  dt_box fb = {0}, mb = {0};
  dt_xfer xf = {0};
  weft_tensor *t = NULL;
  weft_status st;
  WEFT_CHECK_GOTO(full_box(spec, &fb), st, done);
  WEFT_CHECK_GOTO(dt_box_of(spec, me, &mb), st, done);
  WEFT_CHECK_GOTO(dt_xfer_make(&fb, &mb, &xf), st, done);
  int64_t shape[WEFT_MAX_DIMS];
  for (int d = 0; d < spec->ndim; d++) shape[d] = dt_runs_total(&mb.d[d]);
  WEFT_CHECK_GOTO(weft_tensor_create(spec->dtype, dev, spec->ndim, shape, &t), st, done);
  WEFT_CHECK_GOTO(dt_xfer_copy(&xf, full, t), st, done);
  *out = t;
  t = NULL;
done:
  weft_tensor_destroy(t);
  dt_xfer_free(&xf);
  dt_box_free(&fb);
  dt_box_free(&mb);
  return st;
}

#define META_WORDS (3 + WEFT_MAX_DIMS)

/* Phase 1 of distribute: the local argument checks (identical on every rank
 * when the arguments are), then, from one source rank, the source's
 * metadata (dtype, shape, or its own error) broadcast along the mesh and
 * every rank's agreement that its `full` (if any) matches. Collective: every
 * rank fails together. Out: the source's coords, whether this rank is it,
 * and the spec of the result. */
static weft_status distribute_agree(weft_mesh *mesh, const weft_tensor *full, int src_rank,
                                    const weft_placement *placements, int nplacements,
                                    const int *me, int *src, bool *is_src, weft_dtensor_spec *spec,
                                    weft_tensor **moved) {
  int k = weft_mesh_ndim(mesh);
  /* The source's metadata travels along the same chain as the data; a
   * source-side error travels with it so every rank fails together. */
  int mshape[WEFT_MESH_MAX_DIMS];
  for (int i = 0; i < k; i++) mshape[i] = weft_mesh_dim_size(mesh, i);
  dt_unlinear(mshape, k, src_rank, src);
  *is_src = dt_linear(mshape, k, me) == src_rank;
  int64_t meta[META_WORDS] = {0};
  if (*is_src) {
    weft_device dev = weft_mesh_device(mesh);
    if (!full) {
      meta[0] = WEFT_ERR_INVALID;
    } else if (full->device != dev && weft_tensor_to(full, dev, moved) != WEFT_OK) {
      meta[0] = weft_last_status();
      meta[1] = -1; /* marks a failed copy */
    } else {
      meta[1] = full->dtype;
      meta[2] = full->ndim;
      for (int d = 0; d < full->ndim; d++) meta[3 + d] = full->shape[d];
    }
  }
  for (int i = 0; i < k; i++)
    WEFT_CHECK(weft_broadcast(mesh, i, meta, META_WORDS, WEFT_I64, src[i], NULL));
  if (meta[0] != WEFT_OK)
    return weft_error((weft_status)meta[0],
                      meta[1] != -1
                          ? "the source (mesh rank %d) passed full = NULL"
                          : "the source (mesh rank %d) could not copy its full tensor to the "
                            "mesh's device",
                      src_rank);
  int64_t shape[WEFT_MAX_DIMS];
  for (int d = 0; d < (int)meta[2]; d++) shape[d] = meta[3 + d];
  weft_status sst = weft_dtensor_spec_init_mesh(spec, mesh, placements, nplacements,
                                                (weft_dtype)meta[1], (int)meta[2], shape);
  if (sst != WEFT_OK) return sst; /* same on every rank */
  int64_t bad = 0;
  if (!*is_src && full) {
    bool same = full->dtype == spec->dtype && full->ndim == spec->ndim;
    for (int d = 0; same && d < spec->ndim; d++) same = full->shape[d] == spec->shape[d];
    if (!same) bad = 1;
  }
  char mydesc[96] = "";
  if (bad) weft_tensor_describe(full, mydesc, sizeof mydesc);
  WEFT_CHECK(mesh_any(mesh, &bad));
  if (bad) {
    if (mydesc[0]) {
      char want[512];
      weft_dtensor_spec_describe(spec, want, sizeof want);
      return weft_error(WEFT_ERR_MISMATCH,
                        "this rank's full tensor %s does not match the "
                        "source's (mesh rank %d): %s",
                        mydesc, src_rank, want);
    }
    return weft_error(WEFT_ERR_MISMATCH,
                      "a rank's full tensor does not match the source's "
                      "(mesh rank %d) shape or dtype",
                      src_rank);
  }
  return WEFT_OK;
}

/* Phase 2 of distribute, for step i (mesh dim i, size m): the boxes. A live
 * rank gets its U_{i+1} (*next, with a tensor *nt of that shape); the root,
 * holding U_i (`cur`), also gets the transfer of U_i to each member x's
 * U_{i+1} (xs[x], caller-allocated, m entries) with its send counts and
 * displacements (sc, sd; elements). Local. On failure the caller frees
 * next, nt and xs. */
static weft_status distribute_boxes(const weft_dtensor_spec *spec, weft_device dev, const int *me,
                                    int i, int m, bool live, bool root, const dt_box *cur,
                                    dt_box *next, weft_tensor **nt, dt_xfer *xs, int64_t *sc,
                                    int64_t *sd) {
  if (live) {
    WEFT_CHECK(union_box(spec, me, i + 1, next));
    int64_t ns[WEFT_MAX_DIMS];
    for (int d = 0; d < spec->ndim; d++) ns[d] = dt_runs_total(&next->d[d]);
    WEFT_CHECK(weft_tensor_create(spec->dtype, dev, spec->ndim, ns, nt));
  }
  if (!root || !xs) return WEFT_OK;
  int64_t tot = 0;
  int c[WEFT_MESH_MAX_DIMS];
  memcpy(c, me, sizeof c);
  for (int x = 0; x < m; x++) {
    c[i] = x;
    dt_box nb = {0};
    weft_status st = union_box(spec, c, i + 1, &nb);
    if (st == WEFT_OK) st = dt_xfer_make(cur, &nb, &xs[x]);
    dt_box_free(&nb);
    WEFT_CHECK(st);
    sc[x] = xs[x].numel;
    sd[x] = tot;
    tot += sc[x];
  }
  return WEFT_OK;
}

/* Phase 3 of distribute: the data. At step i the group along mesh dim i
 * whose coordinates above i are the source's is live; its root (coordinate
 * src[i]) holds the union U_i of what the group's members and their
 * descendants need and sends each member its U_{i+1} (broadcast for a
 * Replicate dim, scatter by all_to_all_v otherwise). Other groups take part
 * with zero counts. Finally U_k is put in this rank's holding order into a
 * new tensor *res. Collective over the mesh; `full` only on the source. */
static weft_status distribute_scatter(weft_mesh *mesh, const weft_dtensor_spec *spec, const int *me,
                                      const int *src, const weft_tensor *full, weft_tensor **res) {
  const int k = spec->mesh_ndim, msize = weft_mesh_size(mesh);
  const size_t esz = weft_dtype_size(spec->dtype);
  const weft_device dev = weft_mesh_device(mesh);
  weft_status st = WEFT_OK;
  dt_box cur = {0};
  weft_tensor *curt = NULL; /* U_i for this rank (NULL before it has data) */
  const weft_tensor *curv = NULL;
  int64_t *cnt = NULL;
  if (full) {
    WEFT_CHECK_GOTO(full_box(spec, &cur), st, fail);
    curv = full;
  }
  cnt = calloc((size_t)4 * (size_t)msize + 4, sizeof *cnt);
  if (!cnt) {
    st = weft_error(WEFT_ERR_OOM, "distribute bookkeeping");
    goto fail;
  }
  for (int i = 0; i < k; i++) {
    int m = spec->mesh_shape[i];
    bool live = true;
    for (int j = i + 1; j < k; j++)
      if (me[j] != src[j]) live = false;
    bool root = live && me[i] == src[i];
    bool rep = spec->placements[i].kind == WEFT_PLACE_REPLICATE;
    int64_t *sc = cnt, *sd = cnt + msize, *rc = cnt + 2 * msize, *rd = cnt + 3 * msize;
    memset(cnt, 0, (size_t)4 * (size_t)msize * sizeof *cnt);
    dt_box next = {0};
    weft_tensor *nt = NULL;
    void *sendbuf = NULL;
    dt_xfer *xs = NULL;
    if (root && !rep) {
      xs = calloc((size_t)m, sizeof *xs);
      if (!xs) st = weft_error(WEFT_ERR_OOM, "distribute transfers");
    }
    if (st == WEFT_OK)
      st = distribute_boxes(spec, dev, me, i, m, live, root, &cur, &next, &nt, xs, sc, sd);
    if (st == WEFT_OK && rep) {
      /* the members' U_{i+1} equal the root's U_i (same box, same order) */
      if (root) {
        dt_xfer xf = {0};
        st = dt_xfer_make(&cur, &next, &xf);
        if (st == WEFT_OK) st = dt_xfer_copy(&xf, curv, nt);
        dt_xfer_free(&xf);
      }
      if (st == WEFT_OK)
        st = weft_broadcast(mesh, i, live ? nt->data : NULL, live ? weft_tensor_numel(nt) : 0,
                            spec->dtype, src[i], NULL);
    } else if (st == WEFT_OK) {
      if (root) {
        int64_t tot = m > 0 ? sd[m - 1] + sc[m - 1] : 0;
        st = weft_alloc(dev, (size_t)tot * esz + 1, &sendbuf);
        for (int x = 0; x < m && st == WEFT_OK; x++)
          st = dt_xfer_pack(&xs[x], curv, (char *)sendbuf + (size_t)sd[x] * esz);
      }
      if (live) rc[src[i]] = weft_tensor_numel(nt);
      if (st == WEFT_OK)
        st = weft_all_to_all_v(mesh, i, sendbuf, sc, sd, live ? nt->data : NULL, rc, rd,
                               spec->dtype, NULL);
    }
    weft_free(sendbuf);
    if (xs)
      for (int x = 0; x < m; x++) dt_xfer_free(&xs[x]);
    free(xs);
    if (st != WEFT_OK) {
      weft_tensor_destroy(nt);
      dt_box_free(&next);
      goto fail;
    }
    dt_box_free(&cur);
    weft_tensor_destroy(curt);
    cur = next;
    curt = nt;
    curv = nt;
  }
  /* U_k is this rank's holding as a sorted set; put it in holding order */
  {
    dt_box mb = {0};
    dt_xfer xf = {0};
    int64_t ls[WEFT_MAX_DIMS];
    st = dt_box_of(spec, me, &mb);
    if (st == WEFT_OK) st = dt_xfer_make(&cur, &mb, &xf);
    for (int d = 0; d < spec->ndim; d++) ls[d] = dt_runs_total(&mb.d[d]);
    if (st == WEFT_OK) st = weft_tensor_create(spec->dtype, dev, spec->ndim, ls, res);
    if (st == WEFT_OK) st = dt_xfer_copy(&xf, curv, *res);
    dt_xfer_free(&xf);
    dt_box_free(&mb);
  }
fail:
  weft_tensor_destroy(curt);
  dt_box_free(&cur);
  free(cnt);
  return st;
}

weft_status weft_dtensor_distribute(weft_mesh *mesh, const weft_tensor *full, int src_rank,
                                    const weft_placement *placements, int nplacements,
                                    weft_dtensor **out) {
  WEFT_CHECK(check_out(out));
  if (!mesh) return weft_error(WEFT_ERR_INVALID, "mesh is NULL");
  int k = weft_mesh_ndim(mesh);
  int msize = weft_mesh_size(mesh);
  if (src_rank != WEFT_DTENSOR_ALL_RANKS && (src_rank < 0 || src_rank >= msize))
    return weft_error(WEFT_ERR_INVALID,
                      "src_rank %d is not a rank of the mesh (size %d) nor "
                      "WEFT_DTENSOR_ALL_RANKS",
                      src_rank, msize);
  for (int i = 0; i < nplacements && placements; i++)
    if (placements[i].kind == WEFT_PLACE_PARTIAL)
      return weft_error(WEFT_ERR_INVALID,
                        "placement %d: cannot distribute a full tensor to a "
                        "Partial placement (as distribute_tensor)",
                        i);
  if (nplacements != k)
    return weft_error(WEFT_ERR_INVALID,
                      "%d placements for a %d-dim mesh (need one placement per mesh dim)",
                      nplacements, k);
  int me[WEFT_MESH_MAX_DIMS], src[WEFT_MESH_MAX_DIMS];
  dt_my_coords(mesh, me);
  weft_dtensor_spec spec;
  weft_tensor *res = NULL;
  weft_status st;
  if (src_rank == WEFT_DTENSOR_ALL_RANKS) {
    /* every rank holds `full`: no communication, each slices its own */
    if (!full) return weft_error(WEFT_ERR_INVALID, "full is NULL (every rank must pass it)");
    WEFT_CHECK(weft_dtensor_spec_init_mesh(&spec, mesh, placements, nplacements, full->dtype,
                                           full->ndim, full->shape));
    WEFT_CHECK(slice_from_full(&spec, me, weft_mesh_device(mesh), full, &res));
    st = dt_wrap(mesh, &spec, res, true, out);
    if (st != WEFT_OK) weft_tensor_destroy(res);
    return st;
  }
  bool is_src = false;
  weft_tensor *moved = NULL; /* the source's `full` on the mesh's device */
  st = distribute_agree(mesh, full, src_rank, placements, nplacements, me, src, &is_src, &spec,
                        &moved);
  if (st == WEFT_OK)
    st = distribute_scatter(mesh, &spec, me, src, is_src ? (moved ? moved : full) : NULL, &res);
  weft_tensor_destroy(moved);
  if (st == WEFT_OK) st = dt_wrap(mesh, &spec, res, true, out);
  if (st != WEFT_OK) {
    weft_tensor_destroy(res);
    return weft_error_trace(st, __func__);
  }
  return WEFT_OK;
}

/* ------------------------------------------------------------ from_local */

/* One rank's view for weft_dtensor_check. */
#define REC_WORDS (6 + 2 * WEFT_MAX_DIMS + 4 * WEFT_MESH_MAX_DIMS)

static void rec_fill(int64_t *rec, int64_t status, int mesh_rank, const weft_dtensor_spec *spec,
                     const weft_tensor *local) {
  memset(rec, 0, REC_WORDS * sizeof *rec);
  rec[0] = status;
  rec[1] = mesh_rank;
  if (!spec) return;
  rec[2] = spec->dtype;
  rec[3] = spec->ndim;
  rec[4] = local ? local->ndim : -1;
  rec[5] = local ? (int64_t)local->dtype : -1;
  for (int d = 0; d < spec->ndim; d++) rec[6 + d] = spec->shape[d];
  for (int d = 0; local && d < local->ndim; d++) rec[6 + WEFT_MAX_DIMS + d] = local->shape[d];
  int64_t *p = rec + 6 + 2 * WEFT_MAX_DIMS;
  for (int i = 0; i < spec->mesh_ndim; i++) {
    p[4 * i] = spec->placements[i].kind;
    p[4 * i + 1] = weft_placement_is_shard(spec->placements[i]) ? spec->placements[i].dim : 0;
    p[4 * i + 2] =
        spec->placements[i].kind == WEFT_PLACE_STRIDED_SHARD ? spec->placements[i].split_factor : 0;
    p[4 * i + 3] = spec->placements[i].kind == WEFT_PLACE_PARTIAL ? spec->placements[i].op : 0;
  }
}

/* Collective: gathers every rank's record, checks them identically on every
 * rank. `status` is this rank's local verdict (WEFT_OK or the error it
 * found, which is then reported everywhere). */
static weft_status check_collective(const weft_mesh *mesh, const weft_dtensor_spec *spec,
                                    const weft_tensor *local, weft_status status) {
  int k = weft_mesh_ndim(mesh), n = weft_mesh_size(mesh);
  int64_t *all = malloc((size_t)n * REC_WORDS * sizeof *all);
  int64_t *tmp = malloc((size_t)n * REC_WORDS * sizeof *tmp);
  weft_status st = WEFT_OK;
  if (!all || !tmp) {
    /* still take part so nobody hangs: a one-word all-reduce of the error */
    free(all);
    free(tmp);
    int64_t flag = 1;
    mesh_any(mesh, &flag);
    return weft_error(WEFT_ERR_OOM, "check buffers for %d ranks", n);
  }
  rec_fill(all, status, weft_mesh_rank(mesh), status == WEFT_OK ? spec : NULL, local);
  int64_t have = 1;
  for (int i = 0; i < k && st == WEFT_OK; i++) {
    int m = weft_mesh_dim_size(mesh, i);
    st = weft_all_gather(mesh, i, all, tmp, have * REC_WORDS, WEFT_I64, NULL);
    memcpy(all, tmp, (size_t)(have * m) * REC_WORDS * sizeof *all);
    have *= m;
  }
  free(tmp);
  if (st != WEFT_OK) {
    free(all);
    return weft_error_trace(st, __func__);
  }
  /* order records by mesh rank */
  int64_t *byrank[4096];
  int64_t **br = n <= 4096 ? byrank : malloc((size_t)n * sizeof *br);
  if (!br) {
    free(all);
    return weft_error(WEFT_ERR_OOM, "check index");
  }
  for (int r = 0; r < n; r++) br[r] = NULL;
  for (int r = 0; r < n; r++) {
    int64_t *rec = all + (size_t)r * REC_WORDS;
    if (rec[1] >= 0 && rec[1] < n) br[rec[1]] = rec;
  }
  int mshape[WEFT_MESH_MAX_DIMS];
  for (int i = 0; i < k; i++) mshape[i] = weft_mesh_dim_size(mesh, i);
  /* 1: every rank accepted its own arguments */
  for (int r = 0; r < n && st == WEFT_OK; r++) {
    if (!br[r])
      st = weft_error(WEFT_ERR_INTERNAL, "check: no record from mesh rank %d", r);
    else if (br[r][0] != WEFT_OK)
      st = weft_error(WEFT_ERR_MISMATCH, "mesh rank %d rejected its local shard (%s)", r,
                      weft_status_str((weft_status)br[r][0]));
  }
  /* 2: everyone has mesh rank 0's spec */
  const int64_t *ref = st == WEFT_OK ? br[0] : NULL;
  for (int r = 1; r < n && st == WEFT_OK; r++) {
    const int64_t *rec = br[r];
    if (memcmp(ref + 2, rec + 2, 2 * sizeof *rec) != 0 ||
        memcmp(ref + 6, rec + 6, WEFT_MAX_DIMS * sizeof *rec) != 0 ||
        memcmp(ref + 6 + 2 * WEFT_MAX_DIMS, rec + 6 + 2 * WEFT_MAX_DIMS,
               4 * WEFT_MESH_MAX_DIMS * sizeof *rec) != 0) {
      char a[160] = "", b[160] = "";
      size_t x = 0, y = 0;
      for (int d = 0; d < (int)ref[3] && d < WEFT_MAX_DIMS; d++)
        x += (size_t)snprintf(a + x, x < sizeof a ? sizeof a - x : 0, "%s%lld", d ? ", " : "",
                              (long long)ref[6 + d]);
      for (int d = 0; d < (int)rec[3] && d < WEFT_MAX_DIMS; d++)
        y += (size_t)snprintf(b + y, y < sizeof b ? sizeof b - y : 0, "%s%lld", d ? ", " : "",
                              (long long)rec[6 + d]);
      st = weft_error(WEFT_ERR_MISMATCH,
                      "mesh rank %d has a different global shape, dtype or placements (global "
                      "[%s]) than mesh rank 0 (global [%s])",
                      r, b, a);
    }
  }
  /* 3: each rank's local shape is what the (common) spec gives it */
  weft_dtensor_spec s;
  memset(&s, 0, sizeof s);
  if (st == WEFT_OK) {
    weft_placement pl[WEFT_MESH_MAX_DIMS];
    const int64_t *p = ref + 6 + 2 * WEFT_MAX_DIMS;
    for (int i = 0; i < k; i++) {
      pl[i].kind = (weft_placement_kind)p[4 * i];
      pl[i].dim = (int)p[4 * i + 1];
      pl[i].split_factor = p[4 * i + 2] ? (int)p[4 * i + 2] : 1;
      pl[i].op = (weft_reduce_op)p[4 * i + 3];
    }
    st = weft_dtensor_spec_init(&s, k, mshape, pl, k, (weft_dtype)ref[2], (int)ref[3], ref + 6);
  }
  for (int r = 0; r < n && st == WEFT_OK; r++) {
    const int64_t *rec = br[r];
    int c[WEFT_MESH_MAX_DIMS];
    dt_unlinear(mshape, k, r, c);
    int64_t want[WEFT_MAX_DIMS];
    st = weft_dtensor_spec_local_shape(&s, c, want, NULL, NULL);
    if (st != WEFT_OK) break;
    bool ok = rec[4] == s.ndim && rec[5] == s.dtype;
    for (int d = 0; ok && d < s.ndim; d++) ok = rec[6 + WEFT_MAX_DIMS + d] == want[d];
    if (!ok) {
      char got[160] = "", exp[160] = "";
      size_t a = 0, b = 0;
      for (int d = 0; d < s.ndim; d++) {
        a += (size_t)snprintf(got + a, a < sizeof got ? sizeof got - a : 0, "%s%lld", d ? ", " : "",
                              (long long)rec[6 + WEFT_MAX_DIMS + d]);
        b += (size_t)snprintf(exp + b, b < sizeof exp ? sizeof exp - b : 0, "%s%lld", d ? ", " : "",
                              (long long)want[d]);
      }
      st = weft_error(WEFT_ERR_MISMATCH,
                      "mesh rank %d holds a local shard of shape [%s] but the placements give "
                      "[%s] for its coordinates",
                      r, got, exp);
    }
  }
  if (br != byrank) free(br);
  free(all);
  return st;
}

weft_status weft_dtensor_check(const weft_dtensor *dt) {
  WEFT_CHECK(check_dt(dt, "dt"));
  WEFT_CHECK(check_collective(dt->mesh, &dt->spec, dt->local, WEFT_OK));
  return WEFT_OK;
}

weft_status weft_dtensor_from_local(weft_mesh *mesh, weft_tensor *local, weft_local_ownership own,
                                    const weft_placement *placements, int nplacements,
                                    const int64_t *global_shape, weft_dtensor **out) {
  WEFT_CHECK(check_out(out));
  if (!mesh) return weft_error(WEFT_ERR_INVALID, "mesh is NULL");
  bool debug = weft_get_settings() && weft_get_settings()->debug;
  weft_status st = WEFT_OK;
  weft_dtensor_spec spec;
  memset(&spec, 0, sizeof spec);
  if (!local)
    st = weft_error(WEFT_ERR_INVALID, "local is NULL");
  else if (own != WEFT_LOCAL_COPY && own != WEFT_LOCAL_TAKE && own != WEFT_LOCAL_VIEW)
    st = weft_error(WEFT_ERR_INVALID, "invalid ownership %d", (int)own);
  else if (local->device != weft_mesh_device(mesh) && local->device != WEFT_CPU)
    st = weft_error(WEFT_ERR_INVALID,
                    "local is a %s tensor but the mesh is on %s (move it there with "
                    "weft_tensor_to, or set the mesh's device)",
                    weft_device_name(local->device), weft_device_name(weft_mesh_device(mesh)));
  if (st == WEFT_OK) {
    int64_t gshape[WEFT_MAX_DIMS];
    int k = weft_mesh_ndim(mesh);
    for (int d = 0; d < local->ndim; d++) {
      if (global_shape) {
        gshape[d] = global_shape[d];
      } else {
        gshape[d] = local->shape[d];
        for (int i = 0; i < k && i < nplacements && placements; i++) {
          weft_placement p = placements[i];
          int pd = p.dim < 0 ? p.dim + local->ndim : p.dim;
          if (weft_placement_is_shard(p) && pd == d) gshape[d] *= weft_mesh_dim_size(mesh, i);
        }
      }
    }
    st = weft_dtensor_spec_init_mesh(&spec, mesh, placements, nplacements, local->dtype,
                                     local->ndim, gshape);
  }
  if (st == WEFT_OK) {
    int me[WEFT_MESH_MAX_DIMS];
    int64_t want[WEFT_MAX_DIMS];
    dt_my_coords(mesh, me);
    st = weft_dtensor_spec_local_shape(&spec, me, want, NULL, NULL);
    for (int d = 0; st == WEFT_OK && d < spec.ndim; d++)
      if (want[d] != local->shape[d]) {
        char pl[256];
        weft_placements_describe(spec.placements, spec.mesh_ndim, pl, sizeof pl);
        st = weft_error(WEFT_ERR_INVALID,
                        "local shard has size %lld along dim %d but %s of global size %lld gives "
                        "this rank (mesh rank %d) %lld",
                        (long long)local->shape[d], d, pl, (long long)spec.shape[d],
                        weft_mesh_rank(mesh), (long long)want[d]);
      }
  }
  if (debug) {
    char mine[1024] = "";
    if (st != WEFT_OK) snprintf(mine, sizeof mine, "%s", weft_last_error());
    weft_status cst = check_collective(mesh, &spec, local, st);
    if (cst != WEFT_OK) {
      /* a rank with bad arguments keeps its own code; the others report the
       * mismatch, naming the first rank at fault */
      if (mine[0]) return weft_error(st, "%s (across the mesh: %s)", mine, weft_last_error());
      return weft_error_trace(cst, __func__);
    }
  }
  if (st != WEFT_OK) return weft_error_trace(st, __func__);
  weft_tensor *t = NULL;
  bool owns = true;
  switch (own) {
    case WEFT_LOCAL_COPY:
      WEFT_CHECK(weft_tensor_clone(local, &t));
      break;
    case WEFT_LOCAL_TAKE:
      t = local;
      break;
    case WEFT_LOCAL_VIEW:
      WEFT_CHECK(weft_tensor_wrap(local->data, local->dtype, local->device, 0, NULL, &t));
      WEFT_CHECK(weft_tensor_view_init(t, local->data, local->dtype, local->device, local->ndim,
                                       local->shape, local->strides));
      owns = false;
      break;
  }
  st = dt_wrap(mesh, &spec, t, owns, out);
  if (st != WEFT_OK && own != WEFT_LOCAL_TAKE) weft_tensor_destroy(t);
  return st;
}

/* The spec of global `shape` and `placements` on x's mesh and this rank's
 * local shape under it (ls), for the view functions below (errors name
 * who). */
static weft_status view_spec(const char *who, const weft_dtensor *x, int ndim, const int64_t *shape,
                             const weft_placement *placements, weft_dtensor_spec *spec,
                             int64_t *ls) {
  if (!x || (ndim > 0 && !shape) || !placements)
    return weft_error(WEFT_ERR_INVALID, "%s: NULL argument", who);
  WEFT_CHECK(weft_dtensor_spec_init_mesh(spec, x->mesh, placements, x->spec.mesh_ndim,
                                         x->local->dtype, ndim, shape));
  int me[WEFT_MESH_MAX_DIMS];
  dt_my_coords(x->mesh, me);
  return weft_dtensor_spec_local_shape(spec, me, ls, NULL, NULL);
}

/* A non-owning DTensor of spec over x's local storage from element
 * `offset` with local shape ls and `strides`. */
static weft_status wrap_view(const weft_dtensor *x, const weft_dtensor_spec *spec,
                             const int64_t *ls, int64_t offset, const int64_t *strides,
                             weft_dtensor **out) {
  const weft_tensor *xl = x->local;
  char *data = (char *)xl->data + (size_t)offset * weft_dtype_size(xl->dtype);
  weft_tensor *t = NULL;
  WEFT_CHECK(weft_tensor_wrap(data, xl->dtype, xl->device, spec->ndim, ls, &t));
  for (int d = 0; d < spec->ndim; d++) t->strides[d] = strides[d];
  weft_status st = dt_wrap(x->mesh, spec, t, false, out);
  if (st != WEFT_OK) weft_tensor_destroy(t);
  return st;
}

weft_status weft_dtensor_view(const weft_dtensor *x, int ndim, const int64_t *shape,
                              const weft_placement *placements, weft_dtensor **out) {
  WEFT_CHECK(check_out(out));
  weft_dtensor_spec spec;
  int64_t ls[WEFT_MAX_DIMS];
  WEFT_CHECK(view_spec("dtensor_view", x, ndim, shape, placements, &spec, ls));
  const weft_tensor *xl = x->local;
  int64_t n = 1;
  for (int d = 0; d < ndim; d++) n *= ls[d];
  if (n != weft_tensor_numel(xl)) {
    char a[256], b[256];
    weft_dtensor_spec_describe(&x->spec, a, sizeof a);
    weft_dtensor_spec_describe(&spec, b, sizeof b);
    return weft_error(WEFT_ERR_INVALID,
                      "dtensor_view: %s holds %lld local elements on mesh rank %d; %s needs %lld",
                      a, (long long)weft_tensor_numel(xl), weft_mesh_rank(x->mesh), b,
                      (long long)n);
  }
  int64_t strides[WEFT_MAX_DIMS];
  if (!weft_tensor_view_strides(xl, ndim, ls, strides)) {
    char a[128], b[256];
    weft_tensor_describe(xl, a, sizeof a);
    weft_dtensor_spec_describe(&spec, b, sizeof b);
    return weft_error(WEFT_ERR_INVALID,
                      "dtensor_view: the local tensor %s is strided so that no view has the "
                      "local shape of %s on mesh rank %d",
                      a, b, weft_mesh_rank(x->mesh));
  }
  return wrap_view(x, &spec, ls, 0, strides, out);
}

weft_status weft_dtensor_as_strided(const weft_dtensor *x, int ndim, const int64_t *shape,
                                    const weft_placement *placements, int64_t offset,
                                    const int64_t *strides, weft_dtensor **out) {
  WEFT_CHECK(check_out(out));
  if (ndim > 0 && !strides) return weft_error(WEFT_ERR_INVALID, "dtensor_as_strided: NULL strides");
  weft_dtensor_spec spec;
  int64_t ls[WEFT_MAX_DIMS];
  WEFT_CHECK(view_spec("dtensor_as_strided", x, ndim, shape, placements, &spec, ls));
  /* the span of x's local elements, and of the view's */
  const weft_tensor *xl = x->local;
  int64_t xlast = weft_tensor_numel(xl) > 0 ? 0 : -1, last = offset, n = 1;
  for (int d = 0; xlast >= 0 && d < xl->ndim; d++) xlast += (xl->shape[d] - 1) * xl->strides[d];
  bool ok = offset >= 0;
  for (int d = 0; d < ndim; d++) {
    ok = ok && strides[d] >= 0;
    n *= ls[d];
    if (ls[d] > 0) last += (ls[d] - 1) * strides[d];
  }
  /* a view of no elements reads nothing (a rank's empty shard): any
   * offset will do, and the view starts where x does */
  if (ok && n == 0) return wrap_view(x, &spec, ls, 0, strides, out);
  if (!ok || last > xlast)
    return weft_error(WEFT_ERR_INVALID,
                      "dtensor_as_strided: elements %lld..%lld of the local storage (offset "
                      "%lld) are outside the %lld the local tensor spans",
                      (long long)offset, (long long)last, (long long)offset,
                      (long long)(xlast + 1));
  return wrap_view(x, &spec, ls, offset, strides, out);
}

/* ------------------------------------------------------------ exits */

weft_status weft_dtensor_to_local(const weft_dtensor *dt, weft_tensor **out) {
  WEFT_CHECK(check_dt(dt, "dt"));
  if (!out) return weft_error(WEFT_ERR_INVALID, "out is NULL");
  WEFT_CHECK(weft_tensor_clone(dt->local, out));
  return WEFT_OK;
}

weft_status weft_dtensor_redistribute_ex(const weft_dtensor *dt, const weft_placement *placements,
                                         int nplacements, const weft_redistribute_opts *opts,
                                         weft_dtensor **out) {
  WEFT_CHECK(check_out(out));
  WEFT_CHECK(check_dt(dt, "dt"));
  bool allow = opts && opts->version >= 1 && opts->allow_partial;
  if (nplacements != dt->spec.mesh_ndim)
    return weft_error(WEFT_ERR_INVALID,
                      "%d placements for a %d-dim mesh (need one placement per mesh dim)",
                      nplacements, dt->spec.mesh_ndim);
  if (!placements) return weft_error(WEFT_ERR_INVALID, "placements is NULL");
  weft_dtensor_spec dst;
  WEFT_CHECK(dt_spec_with(&dt->spec, placements, nplacements, &dst));
  dt_plan plan;
  WEFT_CHECK(dt_plan_get(&dt->spec, dst.placements, allow, &plan));
  WEFT_CHECK(dt_redistribute_run(dt, &dst, &plan, NULL, out));
  return WEFT_OK;
}

weft_status weft_dtensor_redistribute_into(const weft_dtensor *dt, weft_dtensor *out,
                                           const weft_redistribute_opts *opts) {
  WEFT_CHECK(check_dt(dt, "dt"));
  WEFT_CHECK(check_dt(out, "out"));
  if (dt == out) return weft_error(WEFT_ERR_INVALID, "out is the input DTensor");
  if (!dt_same_mesh(dt->mesh, out->mesh))
    return weft_error(WEFT_ERR_INVALID, "out lives on a different mesh than the input");
  const weft_dtensor_spec *a = &dt->spec, *b = &out->spec;
  bool same = a->ndim == b->ndim && a->dtype == b->dtype;
  for (int d = 0; same && d < a->ndim; d++) same = a->shape[d] == b->shape[d];
  if (!same) {
    char da[512], db[512];
    weft_dtensor_spec_describe(a, da, sizeof da);
    weft_dtensor_spec_describe(b, db, sizeof db);
    return weft_error(WEFT_ERR_INVALID,
                      "out %s does not have the input's global shape and dtype (%s)", db, da);
  }
  bool allow = opts && opts->version >= 1 && opts->allow_partial;
  dt_plan plan;
  WEFT_CHECK(dt_plan_get(a, b->placements, allow, &plan));
  int me[WEFT_MESH_MAX_DIMS];
  int64_t want[WEFT_MAX_DIMS];
  dt_my_coords(out->mesh, me);
  WEFT_CHECK(weft_dtensor_spec_local_shape(b, me, want, NULL, NULL));
  for (int d = 0; d < b->ndim; d++)
    if (out->local->shape[d] != want[d])
      return weft_error(WEFT_ERR_INVALID,
                        "out's local tensor has size %lld on dim %d, its spec "
                        "gives %lld",
                        (long long)out->local->shape[d], d, (long long)want[d]);
  WEFT_CHECK(dt_redistribute_run(dt, b, &plan, out->local, NULL));
  return WEFT_OK;
}

weft_status weft_dtensor_redistribute(const weft_dtensor *dt, const weft_placement *placements,
                                      int nplacements, weft_dtensor **out) {
  WEFT_CHECK(weft_dtensor_redistribute_ex(dt, placements, nplacements, NULL, out));
  return WEFT_OK;
}

weft_status weft_dtensor_full_tensor(const weft_dtensor *dt, weft_tensor **out) {
  WEFT_CHECK(check_dt(dt, "dt"));
  if (!out) return weft_error(WEFT_ERR_INVALID, "out is NULL");
  *out = NULL;
  weft_placement r[WEFT_MESH_MAX_DIMS];
  for (int i = 0; i < dt->spec.mesh_ndim; i++) r[i] = weft_replicate();
  weft_dtensor *rep;
  WEFT_CHECK(weft_dtensor_redistribute(dt, r, dt->spec.mesh_ndim, &rep));
  *out = rep->local;
  rep->local = NULL;
  rep->owns_local = false;
  weft_dtensor_destroy(rep);
  return WEFT_OK;
}

/* ------------------------------------------------------------ RNG fills */

/* row0 / total_rows: dt stands for rows [row0, row0 + shape[0]) of a
 * tensor of total_rows rows (dim 0); total_rows 0: dt is the whole tensor. */
static weft_status fill_rng(weft_dtensor *dt, bool normal, uint64_t seed, uint64_t key, float a,
                            float b, int64_t row0, int64_t total_rows) {
  WEFT_CHECK(check_dt(dt, "dt"));
  const weft_dtensor_spec *s = &dt->spec;
  if (total_rows > 0 && (s->ndim < 1 || row0 < 0 || row0 + s->shape[0] > total_rows))
    return weft_error(
        WEFT_ERR_INVALID, "fill: rows [%lld, %lld) do not lie in a tensor of %lld rows",
        (long long)row0, (long long)(row0 + (s->ndim ? s->shape[0] : 0)), (long long)total_rows);
  int me[WEFT_MESH_MAX_DIMS];
  dt_my_coords(dt->mesh, me);
  dt_box box = {0};
  weft_status st = dt_box_of(s, me, &box);
  if (st != WEFT_OK) {
    dt_box_free(&box);
    return weft_error_trace(st, __func__);
  }
  if (dt_box_numel(&box) == 0 || s->ndim == 0) {
    if (s->ndim == 0) {
      weft_rng_region reg = {0};
      st = normal ? weft_tensor_fill_normal(dt->local, seed, key, &reg, a, b)
                  : weft_tensor_fill_uniform(dt->local, seed, key, &reg, a, b);
    }
    dt_box_free(&box);
    return st;
  }
  /* one view per combination of runs, each filled with its global offset */
  int nd = s->ndim, idx[WEFT_MAX_DIMS] = {0};
  int64_t pos[WEFT_MAX_DIMS] = {0};
  size_t esz = weft_dtype_size(s->dtype);
  for (;;) {
    weft_rng_region reg;
    reg.ndim = nd;
    int64_t shape[WEFT_MAX_DIMS], off = 0;
    for (int d = 0; d < nd; d++) {
      reg.global_shape[d] = s->shape[d];
      reg.offset[d] = box.d[d].r[idx[d]].start;
      if (d == 0 && total_rows > 0) {
        reg.global_shape[0] = total_rows;
        reg.offset[0] += row0;
      }
      shape[d] = box.d[d].r[idx[d]].len;
      off += pos[d] * dt->local->strides[d];
    }
    weft_tensor view;
    st = weft_tensor_view_init(&view, (char *)dt->local->data + (size_t)off * esz, s->dtype,
                               dt->local->device, nd, shape, dt->local->strides);
    if (st == WEFT_OK)
      st = normal ? weft_tensor_fill_normal(&view, seed, key, &reg, a, b)
                  : weft_tensor_fill_uniform(&view, seed, key, &reg, a, b);
    if (st != WEFT_OK) break;
    int d = nd - 1;
    while (d >= 0) {
      pos[d] += box.d[d].r[idx[d]].len;
      if (++idx[d] < box.d[d].n) break;
      idx[d] = 0;
      pos[d] = 0;
      d--;
    }
    if (d < 0) break;
  }
  dt_box_free(&box);
  if (st != WEFT_OK) weft_error_trace(st, __func__);
  return st;
}

weft_status weft_dtensor_fill_normal(weft_dtensor *dt, uint64_t seed, uint64_t key, float mean,
                                     float std) {
  WEFT_CHECK(fill_rng(dt, true, seed, key, mean, std, 0, 0));
  return WEFT_OK;
}

weft_status weft_dtensor_fill_uniform(weft_dtensor *dt, uint64_t seed, uint64_t key, float lo,
                                      float hi) {
  WEFT_CHECK(fill_rng(dt, false, seed, key, lo, hi, 0, 0));
  return WEFT_OK;
}

weft_status weft_dtensor_fill_uniform_rows(weft_dtensor *dt, uint64_t seed, uint64_t key, float lo,
                                           float hi, int64_t row0, int64_t total_rows) {
  if (total_rows < 1)
    return weft_error(WEFT_ERR_INVALID, "fill_uniform_rows: total_rows %lld < 1",
                      (long long)total_rows);
  WEFT_CHECK(fill_rng(dt, false, seed, key, lo, hi, row0, total_rows));
  return WEFT_OK;
}
