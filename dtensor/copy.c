/* dtensor/copy.c — strided box copies and the pack/unpack of transfers
 * between two holdings (dt_xfer). */
#include <stdlib.h>
#include <string.h>

#include "dtensor_internal.h"

/* Merges dims that are contiguous in both layouts so the innermost copy is
 * one memcpy as long as possible. */
static int collapse(int64_t *shape, int64_t *ds, int64_t *ss, int ndim) {
  int k = 0;
  for (int d = 0; d < ndim; d++) {
    if (shape[d] == 1) continue; /* size-1 dims never matter */
    shape[k] = shape[d];
    ds[k] = ds[d];
    ss[k] = ss[d];
    k++;
  }
  if (k == 0) {
    shape[0] = 1;
    ds[0] = ss[0] = 1;
    return 1;
  }
  int out = 0;
  for (int d = 1; d < k; d++) {
    if (ds[out] == ds[d] * shape[d] && ss[out] == ss[d] * shape[d]) {
      shape[out] *= shape[d];
      ds[out] = ds[d];
      ss[out] = ss[d];
    } else {
      out++;
      shape[out] = shape[d];
      ds[out] = ds[d];
      ss[out] = ss[d];
    }
  }
  return out + 1;
}

static void copy_rec(char *dst, const int64_t *ds, const char *src, const int64_t *ss,
                     const int64_t *shape, int ndim, size_t esz) {
  if (ndim == 1) {
    if (ds[0] == 1 && ss[0] == 1) {
      memcpy(dst, src, (size_t)shape[0] * esz);
    } else {
      for (int64_t i = 0; i < shape[0]; i++)
        memcpy(dst + (size_t)(i * ds[0]) * esz, src + (size_t)(i * ss[0]) * esz, esz);
    }
    return;
  }
  for (int64_t i = 0; i < shape[0]; i++)
    copy_rec(dst + (size_t)(i * ds[0]) * esz, ds + 1, src + (size_t)(i * ss[0]) * esz, ss + 1,
             shape + 1, ndim - 1, esz);
}

void dt_copy_strided(char *dst, const int64_t *dst_strides, const char *src,
                     const int64_t *src_strides, const int64_t *shape, int ndim, size_t esz) {
  int64_t sh[WEFT_MAX_DIMS + 1], ds[WEFT_MAX_DIMS + 1], ss[WEFT_MAX_DIMS + 1];
  for (int d = 0; d < ndim; d++) {
    if (shape[d] == 0) return;
    sh[d] = shape[d];
    ds[d] = dst_strides[d];
    ss[d] = src_strides[d];
  }
  int k = collapse(sh, ds, ss, ndim);
  copy_rec(dst, ds, src, ss, sh, k, esz);
}

/* ------------------------------------------------------------- transfers */

void dt_xfer_free(dt_xfer *x) {
  for (int d = 0; d < WEFT_MAX_DIMS; d++) dt_segs_free(&x->seg[d]);
  x->ndim = 0;
  x->numel = 0;
}

weft_status dt_xfer_make(const dt_box *a, const dt_box *b, dt_xfer *out) {
  memset(out, 0, sizeof *out);
  out->ndim = b->ndim;
  out->numel = 1;
  for (int d = 0; d < b->ndim; d++) {
    weft_status st = dt_intersect(&a->d[d], &b->d[d], &out->seg[d]);
    if (st != WEFT_OK) {
      dt_xfer_free(out);
      return weft_error_trace(st, __func__);
    }
    int64_t t = 0;
    for (int i = 0; i < out->seg[d].n; i++) t += out->seg[d].s[i].len;
    out->packed_shape[d] = t;
    out->numel *= t;
  }
  return WEFT_OK;
}

/* Walks every combination of segments; mode 0: A -> packed, 1: packed -> B,
 * 2: A -> B. */
static void xfer_walk(const dt_xfer *x, int mode, const weft_tensor *a, const void *packed_in,
                      void *packed_out, weft_tensor *b) {
  int nd = x->ndim;
  size_t esz = weft_dtype_size(a ? a->dtype : b->dtype);
  if (x->numel == 0) return;
  int64_t pstr[WEFT_MAX_DIMS];
  int64_t acc = 1;
  for (int d = nd - 1; d >= 0; d--) {
    pstr[d] = acc;
    acc *= x->packed_shape[d];
  }
  if (nd == 0) {
    const char *src = mode == 1 ? (const char *)packed_in : (const char *)a->data;
    char *dst = mode == 0 ? (char *)packed_out : (char *)b->data;
    memcpy(dst, src, esz);
    return;
  }
  int idx[WEFT_MAX_DIMS] = {0};
  int64_t ppos[WEFT_MAX_DIMS] = {0}; /* packed position of the current segment per dim */
  for (;;) {
    int64_t shape[WEFT_MAX_DIMS], aoff = 0, boff = 0, poff = 0;
    for (int d = 0; d < nd; d++) {
      const dt_seg *s = &x->seg[d].s[idx[d]];
      shape[d] = s->len;
      if (a) aoff += s->pa * a->strides[d];
      if (b) boff += s->pb * b->strides[d];
      poff += ppos[d] * pstr[d];
    }
    switch (mode) {
      case 0:
        dt_copy_strided((char *)packed_out + (size_t)poff * esz, pstr,
                        (const char *)a->data + (size_t)aoff * esz, a->strides, shape, nd, esz);
        break;
      case 1:
        dt_copy_strided((char *)b->data + (size_t)boff * esz, b->strides,
                        (const char *)packed_in + (size_t)poff * esz, pstr, shape, nd, esz);
        break;
      default:
        dt_copy_strided((char *)b->data + (size_t)boff * esz, b->strides,
                        (const char *)a->data + (size_t)aoff * esz, a->strides, shape, nd, esz);
        break;
    }
    int d = nd - 1;
    while (d >= 0) {
      ppos[d] += x->seg[d].s[idx[d]].len;
      idx[d]++;
      if (idx[d] < x->seg[d].n) break;
      idx[d] = 0;
      ppos[d] = 0;
      d--;
    }
    if (d < 0) break;
  }
}

void dt_xfer_pack(const dt_xfer *x, const weft_tensor *a_local, void *packed) {
  xfer_walk(x, 0, a_local, NULL, packed, NULL);
}

void dt_xfer_unpack(const dt_xfer *x, const void *packed, weft_tensor *b_local) {
  xfer_walk(x, 1, NULL, packed, NULL, b_local);
}

void dt_xfer_copy(const dt_xfer *x, const weft_tensor *a_local, weft_tensor *b_local) {
  xfer_walk(x, 2, a_local, NULL, NULL, b_local);
}
