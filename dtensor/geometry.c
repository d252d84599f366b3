/* dtensor/geometry.c — which global indices each mesh coordinate holds.
 *
 * The holding of a rank along one tensor dim is an ordered list of runs of
 * global indices (dt_runs); the local tensor is the product of the per-dim
 * holdings, in row-major order. Placements on different tensor dims never
 * interact, so each dim is computed on its own by replaying the placements
 * that shard it, left to right (mesh dim order):
 *
 *   Shard(d) on mesh dim (size m, coord c), holding L (n indices):
 *     torch.chunk: chunk size q = ceil(n/m), keep positions
 *     [c*q, min((c+1)*q, n)) of L   (weft_chunk_range).
 *     If L is held as B > 1 blocks (after a strided shard) and m divides
 *     B, keep the blocks [c*B/m, (c+1)*B/m) instead.
 *   StridedShard(d, sf) on mesh dim (m, c): split L into sf virtual blocks
 *     (torch.chunk(L, sf), or the nested chunk by the sizes of the following
 *     plain Shard(d) mesh dims — see dtensor.h), then keep chunk(V_j, m)[c]
 *     of every block j, in block order.
 *
 * For evenly divisible sizes this is PyTorch's left-to-right chunking with
 * _StridedShard._split_tensor; for uneven sizes it keeps FSDP-over-TP exact.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "dtensor_internal.h"

/* ------------------------------------------------------------ run lists */

void dt_runs_free(dt_runs *l) {
  if (!l) return;
  free(l->r);
  l->r = NULL;
  l->n = l->cap = 0;
}

weft_status dt_runs_push(dt_runs *l, int64_t start, int64_t len) {
  if (len <= 0) return WEFT_OK;
  if (l->n > 0 && l->r[l->n - 1].start + l->r[l->n - 1].len == start) {
    l->r[l->n - 1].len += len;
    return WEFT_OK;
  }
  if (l->n == l->cap) {
    int nc = l->cap ? 2 * l->cap : 4;
    weft_range *nr = realloc(l->r, (size_t)nc * sizeof *nr);
    if (!nr) return weft_error(WEFT_ERR_OOM, "run list of %d entries", nc);
    l->r = nr;
    l->cap = nc;
  }
  l->r[l->n].start = start;
  l->r[l->n].len = len;
  l->n++;
  return WEFT_OK;
}

int64_t dt_runs_total(const dt_runs *l) {
  int64_t t = 0;
  for (int i = 0; i < l->n; i++) t += l->r[i].len;
  return t;
}

bool dt_runs_equal(const dt_runs *a, const dt_runs *b) {
  if (a->n != b->n) return false;
  for (int i = 0; i < a->n; i++)
    if (a->r[i].start != b->r[i].start || a->r[i].len != b->r[i].len) return false;
  return true;
}

/* Appends positions [p0, p1) of list `src` to `dst`. */
static weft_status runs_slice_into(const dt_runs *src, int64_t p0, int64_t p1, dt_runs *dst) {
  int64_t pos = 0;
  for (int i = 0; i < src->n && pos < p1; i++) {
    int64_t a = pos, b = pos + src->r[i].len;
    int64_t lo = a > p0 ? a : p0, hi = b < p1 ? b : p1;
    if (lo < hi) WEFT_CHECK(dt_runs_push(dst, src->r[i].start + (lo - a), hi - lo));
    pos = b;
  }
  return WEFT_OK;
}

/* ------------------------------------------------------------ blocks */

/* A holding during the replay: a list of blocks, each a run list. */
typedef struct blocks {
  int n;
  int cap;
  dt_runs *b;
} blocks;

static void blocks_free(blocks *bl) {
  for (int i = 0; i < bl->n; i++) dt_runs_free(&bl->b[i]);
  free(bl->b);
  bl->b = NULL;
  bl->n = bl->cap = 0;
}

static weft_status blocks_add(blocks *bl, dt_runs **slot) {
  if (bl->n == bl->cap) {
    int nc = bl->cap ? 2 * bl->cap : 4;
    dt_runs *nb = realloc(bl->b, (size_t)nc * sizeof *nb);
    if (!nb) return weft_error(WEFT_ERR_OOM, "block list of %d entries", nc);
    bl->b = nb;
    bl->cap = nc;
  }
  memset(&bl->b[bl->n], 0, sizeof bl->b[bl->n]);
  *slot = &bl->b[bl->n++];
  return WEFT_OK;
}

static weft_status blocks_flatten(const blocks *bl, dt_runs *out) {
  for (int i = 0; i < bl->n; i++)
    for (int j = 0; j < bl->b[i].n; j++)
      WEFT_CHECK(dt_runs_push(out, bl->b[i].r[j].start, bl->b[i].r[j].len));
  return WEFT_OK;
}

/* torch.chunk piece c of k of run list L, appended to dst. */
static weft_status chunk_into(const dt_runs *l, int64_t k, int64_t c, dt_runs *dst) {
  int64_t n = dt_runs_total(l), start, len;
  weft_chunk_range(n, k, c, &start, &len);
  return runs_slice_into(l, start, start + len, dst);
}

/* Splits every block of `in` into k chunks (block order, then chunk order). */
static weft_status blocks_split(const blocks *in, int64_t k, blocks *out) {
  for (int i = 0; i < in->n; i++)
    for (int64_t c = 0; c < k; c++) {
      dt_runs *slot = NULL;
      WEFT_CHECK(blocks_add(out, &slot));
      WEFT_CHECK(chunk_into(&in->b[i], k, c, slot));
    }
  return WEFT_OK;
}

static weft_status holding_blocks(const weft_dtensor_spec *spec, const int *coords, int dim,
                                  blocks *cur) {
  dt_runs *slot = NULL;
  WEFT_CHECK(blocks_add(cur, &slot));
  WEFT_CHECK(dt_runs_push(slot, 0, spec->shape[dim]));
  weft_status st = WEFT_OK;
  for (int i = 0; i < spec->mesh_ndim; i++) {
    weft_placement p = spec->placements[i];
    if (!weft_placement_is_shard(p) || p.dim != dim) continue;
    int64_t m = spec->mesh_shape[i], c = coords[i];
    blocks next = {0};
    if (p.kind == WEFT_PLACE_SHARD) {
      if (cur->n > 1 && cur->n % m == 0) {
        int64_t per = cur->n / m;
        for (int64_t j = c * per; j < (c + 1) * per; j++) {
          WEFT_CHECK_GOTO(blocks_add(&next, &slot), st, fail);
          for (int r = 0; r < cur->b[j].n; r++)
            WEFT_CHECK_GOTO(dt_runs_push(slot, cur->b[j].r[r].start, cur->b[j].r[r].len), st, fail);
        }
      } else {
        dt_runs flat = {0};
        WEFT_CHECK_GOTO(blocks_flatten(cur, &flat), st, fail);
        st = blocks_add(&next, &slot);
        if (st == WEFT_OK) st = chunk_into(&flat, m, c, slot);
        dt_runs_free(&flat);
        if (st != WEFT_OK) goto fail;
      }
    } else {
      /* Strided: virtual split of the flattened holding, nested by the sizes
       * of the following plain Shard(dim) mesh dims while their product
       * divides sf, then by the rest of sf. */
      int64_t sf = p.split_factor, prod = 1;
      blocks virt = {0};
      WEFT_CHECK_GOTO(blocks_add(&virt, &slot), st, fail);
      WEFT_CHECK_GOTO(blocks_flatten(cur, slot), st, vfail);
      for (int j = i + 1; j < spec->mesh_ndim; j++) {
        weft_placement q = spec->placements[j];
        if (!weft_placement_is_shard(q) || q.dim != dim) continue;
        if (q.kind != WEFT_PLACE_SHARD) break;
        int64_t mj = spec->mesh_shape[j];
        if (sf % (prod * mj) != 0) break;
        prod *= mj;
        blocks t = {0};
        st = blocks_split(&virt, mj, &t);
        blocks_free(&virt);
        virt = t;
        if (st != WEFT_OK) goto vfail;
      }
      if (sf / prod > 1) {
        blocks t = {0};
        st = blocks_split(&virt, sf / prod, &t);
        blocks_free(&virt);
        virt = t;
        if (st != WEFT_OK) goto vfail;
      }
      for (int j = 0; j < virt.n; j++) {
        WEFT_CHECK_GOTO(blocks_add(&next, &slot), st, vfail);
        WEFT_CHECK_GOTO(chunk_into(&virt.b[j], m, c, slot), st, vfail);
      }
      blocks_free(&virt);
      goto done;
    vfail:
      blocks_free(&virt);
      goto fail;
    }
  done:
    blocks_free(cur);
    *cur = next;
    continue;
  fail:
    blocks_free(&next);
    return st;
  }
  return WEFT_OK;
}

weft_status dt_holding(const weft_dtensor_spec *spec, const int *coords, int dim, dt_runs *out) {
  out->n = 0;
  blocks cur = {0};
  weft_status st = holding_blocks(spec, coords, dim, &cur);
  if (st == WEFT_OK) st = blocks_flatten(&cur, out);
  blocks_free(&cur);
  return st;
}

void dt_box_free(dt_box *b) {
  for (int d = 0; d < WEFT_MAX_DIMS; d++) dt_runs_free(&b->d[d]);
  b->ndim = 0;
}

weft_status dt_box_of(const weft_dtensor_spec *spec, const int *coords, dt_box *out) {
  out->ndim = spec->ndim;
  for (int d = 0; d < spec->ndim; d++) WEFT_CHECK(dt_holding(spec, coords, d, &out->d[d]));
  return WEFT_OK;
}

int64_t dt_box_numel(const dt_box *b) {
  int64_t n = 1;
  for (int d = 0; d < b->ndim; d++) n *= dt_runs_total(&b->d[d]);
  return n;
}

/* ------------------------------------------------------- intersections */

void dt_segs_free(dt_segs *s) {
  free(s->s);
  s->s = NULL;
  s->n = s->cap = 0;
}

static weft_status segs_push(dt_segs *s, int64_t pa, int64_t pb, int64_t len) {
  if (len <= 0) return WEFT_OK;
  if (s->n > 0) {
    dt_seg *l = &s->s[s->n - 1];
    if (l->pa + l->len == pa && l->pb + l->len == pb) {
      l->len += len;
      return WEFT_OK;
    }
  }
  if (s->n == s->cap) {
    int nc = s->cap ? 2 * s->cap : 4;
    dt_seg *ns = realloc(s->s, (size_t)nc * sizeof *ns);
    if (!ns) return weft_error(WEFT_ERR_OOM, "segment list of %d entries", nc);
    s->s = ns;
    s->cap = nc;
  }
  s->s[s->n].pa = pa;
  s->s[s->n].pb = pb;
  s->s[s->n].len = len;
  s->n++;
  return WEFT_OK;
}

weft_status dt_intersect(const dt_runs *a, const dt_runs *b, dt_segs *out) {
  out->n = 0;
  int64_t pb = 0;
  for (int j = 0; j < b->n; j++) {
    int64_t b0 = b->r[j].start, b1 = b0 + b->r[j].len;
    int64_t pa = 0;
    for (int i = 0; i < a->n; i++) {
      int64_t a0 = a->r[i].start, a1 = a0 + a->r[i].len;
      int64_t lo = a0 > b0 ? a0 : b0, hi = a1 < b1 ? a1 : b1;
      if (lo < hi) WEFT_CHECK(segs_push(out, pa + (lo - a0), pb + (lo - b0), hi - lo));
      pa += a->r[i].len;
    }
    pb += b->r[j].len;
  }
  return WEFT_OK;
}

int64_t dt_intersect_count(const dt_runs *a, const dt_runs *b) {
  int64_t n = 0;
  for (int j = 0; j < b->n; j++) {
    int64_t b0 = b->r[j].start, b1 = b0 + b->r[j].len;
    for (int i = 0; i < a->n; i++) {
      int64_t a0 = a->r[i].start, a1 = a0 + a->r[i].len;
      int64_t lo = a0 > b0 ? a0 : b0, hi = a1 < b1 ? a1 : b1;
      if (lo < hi) n += hi - lo;
    }
  }
  return n;
}

/* ------------------------------------------------------------ public */

static weft_status check_coords(const weft_dtensor_spec *spec, const int *coords) {
  if (!spec) return weft_error(WEFT_ERR_INVALID, "spec is NULL");
  if (!coords) return weft_error(WEFT_ERR_INVALID, "coords is NULL");
  for (int i = 0; i < spec->mesh_ndim; i++)
    if (coords[i] < 0 || coords[i] >= spec->mesh_shape[i])
      return weft_error(WEFT_ERR_INVALID, "coordinate %d on mesh dim %d (size %d) out of range",
                        coords[i], i, spec->mesh_shape[i]);
  return WEFT_OK;
}

weft_status weft_dtensor_spec_local_shape(const weft_dtensor_spec *spec, const int *coords,
                                          int64_t *local_shape, int64_t *global_offset,
                                          bool *contiguous) {
  WEFT_CHECK(check_coords(spec, coords));
  bool contig = true;
  for (int d = 0; d < spec->ndim; d++) {
    dt_runs l = {0};
    weft_status st = dt_holding(spec, coords, d, &l);
    if (st != WEFT_OK) {
      dt_runs_free(&l);
      return weft_error_trace(st, __func__);
    }
    int64_t n = dt_runs_total(&l);
    if (local_shape) local_shape[d] = n;
    if (global_offset) global_offset[d] = n > 0 ? l.r[0].start : spec->shape[d];
    if (l.n > 1) contig = false;
    dt_runs_free(&l);
  }
  if (contiguous) *contiguous = contig;
  return WEFT_OK;
}

weft_status weft_dtensor_spec_ranges(const weft_dtensor_spec *spec, const int *coords, int dim,
                                     weft_range *ranges, int cap, int *count) {
  WEFT_CHECK(check_coords(spec, coords));
  if (dim < 0 || dim >= spec->ndim)
    return weft_error(WEFT_ERR_INVALID, "dim %d out of range for a %d-dim tensor", dim, spec->ndim);
  if (!count) return weft_error(WEFT_ERR_INVALID, "count is NULL");
  dt_runs l = {0};
  weft_status st = dt_holding(spec, coords, dim, &l);
  if (st == WEFT_OK) {
    for (int i = 0; i < l.n && i < cap && ranges; i++) ranges[i] = l.r[i];
    *count = l.n;
  }
  dt_runs_free(&l);
  return st;
}

/* ---------------------------------------------------------------- boxes */

int64_t weft_box_volume(const weft_box *b, int ndim) {
  int64_t v = 1;
  for (int d = 0; d < ndim; d++) v *= b->size[d];
  return v;
}

bool weft_box_equal(const weft_box *a, const weft_box *b, int ndim) {
  for (int d = 0; d < ndim; d++)
    if (a->off[d] != b->off[d] || a->size[d] != b->size[d]) return false;
  return true;
}

bool weft_box_intersect(const weft_box *a, const weft_box *b, int ndim, weft_box *out) {
  weft_box r;
  for (int d = 0; d < ndim; d++) {
    int64_t lo = a->off[d] > b->off[d] ? a->off[d] : b->off[d];
    int64_t ea = a->off[d] + a->size[d], eb = b->off[d] + b->size[d];
    int64_t hi = ea < eb ? ea : eb;
    if (hi <= lo) return false;
    r.off[d] = lo;
    r.size[d] = hi - lo;
  }
  if (out) *out = r;
  return true;
}

/* The product of the per-dim runs of box `b` (dt_box_of) as rectangles, in
 * row-major order of the runs. */
static weft_status boxes_of_runs(const dt_box *b, weft_local_box **out, int64_t *n) {
  const int nd = b->ndim;
  int64_t total = 1;
  for (int d = 0; d < nd; d++) total *= b->d[d].n;
  if (total == 0) return WEFT_OK; /* an empty shard */
  weft_local_box *lb = malloc((size_t)total * sizeof *lb);
  if (!lb) return weft_error(WEFT_ERR_OOM, "%" PRId64 " local boxes", total);
  int idx[WEFT_MAX_DIMS] = {0};
  int64_t ls[WEFT_MAX_DIMS] = {0}; /* local start of run idx[d] along d */
  for (int64_t k = 0; k < total; k++) {
    memset(&lb[k], 0, sizeof lb[k]);
    for (int d = 0; d < nd; d++) {
      lb[k].global.off[d] = b->d[d].r[idx[d]].start;
      lb[k].global.size[d] = b->d[d].r[idx[d]].len;
      lb[k].local_start[d] = ls[d];
    }
    for (int d = nd - 1; d >= 0; d--) {
      ls[d] += b->d[d].r[idx[d]].len;
      if (++idx[d] < b->d[d].n) break;
      idx[d] = 0;
      ls[d] = 0;
    }
  }
  *out = lb;
  *n = total;
  return WEFT_OK;
}

weft_status weft_dtensor_spec_local_boxes(const weft_dtensor_spec *spec, const int *coords,
                                          weft_local_box **out, int64_t *n) {
  if (!out || !n) return weft_error(WEFT_ERR_INVALID, "out or n is NULL");
  *out = NULL;
  *n = 0;
  WEFT_CHECK(check_coords(spec, coords));
  dt_box b = {0};
  weft_status st = dt_box_of(spec, coords, &b);
  if (st == WEFT_OK) st = boxes_of_runs(&b, out, n);
  dt_box_free(&b);
  return st;
}
