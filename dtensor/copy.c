/* dtensor/copy.c — the pack/unpack of transfers between two holdings
 * (dt_xfer). Every box copy is kernels' weft_tensor_copy_region. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dtensor_internal.h"

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
 * 2: A -> B. Each combination is one box copy (weft_tensor_copy_region). */
static weft_status xfer_walk(const dt_xfer *x, int mode, const weft_tensor *a,
                             const void *packed_in, void *packed_out, weft_tensor *b) {
  int nd = x->ndim;
  if (x->numel == 0) return WEFT_OK;
  weft_tensor pv; /* the packed buffer as a dense tensor of packed_shape */
  if (mode != 2) {
    const weft_tensor *t = mode == 0 ? a : b;
    void *p = mode == 0 ? packed_out : (void *)(uintptr_t)packed_in;
    WEFT_CHECK(weft_tensor_view_init(&pv, p, t->dtype, t->device, nd, x->packed_shape, NULL));
  }
  weft_tensor *dst = mode == 0 ? &pv : b;
  const weft_tensor *src = mode == 1 ? &pv : a;
  int idx[WEFT_MAX_DIMS] = {0};
  int64_t ppos[WEFT_MAX_DIMS] = {0}; /* packed position of the current segment per dim */
  for (;;) {
    int64_t shape[WEFT_MAX_DIMS], ao[WEFT_MAX_DIMS], bo[WEFT_MAX_DIMS];
    for (int d = 0; d < nd; d++) {
      const dt_seg *s = &x->seg[d].s[idx[d]];
      shape[d] = s->len;
      ao[d] = s->pa;
      bo[d] = s->pb;
    }
    WEFT_CHECK(
        weft_tensor_copy_region(dst, mode == 0 ? ppos : bo, src, mode == 1 ? ppos : ao, shape));
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
  return WEFT_OK;
}

weft_status dt_xfer_pack(const dt_xfer *x, const weft_tensor *a_local, void *packed) {
  return xfer_walk(x, 0, a_local, NULL, packed, NULL);
}

weft_status dt_xfer_unpack(const dt_xfer *x, const void *packed, weft_tensor *b_local) {
  return xfer_walk(x, 1, NULL, packed, NULL, b_local);
}

weft_status dt_xfer_copy(const dt_xfer *x, const weft_tensor *a_local, weft_tensor *b_local) {
  return xfer_walk(x, 2, a_local, NULL, NULL, b_local);
}
