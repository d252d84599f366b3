/* dtensor/visualize.c — which mesh ranks hold which index ranges (like
 * torch.distributed.tensor.debug.visualize_sharding), for 1-D and 2-D
 * tensors. The table's row/column ranges are the pieces between every
 * shard boundary of every rank; each cell lists the mesh ranks holding it:
 *
 *     f32[8, 6] (S(0), S(1)) on mesh 2x2
 *               cols 0-2  cols 3-5
 *     rows 0-3  0         1
 *     rows 4-7  2         3
 */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "dtensor_internal.h"

typedef struct sb {
  char *s;
  size_t n, cap;
  bool oom;
} sb;

static void sb_printf(sb *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sb *b, const char *fmt, ...) {
  if (b->oom) return;
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(b->s ? b->s + b->n : NULL, b->s ? b->cap - b->n : 0, fmt, ap);
    va_end(ap);
    if (w < 0) {
      b->oom = true;
      return;
    }
    if (b->s && b->n + (size_t)w < b->cap) {
      b->n += (size_t)w;
      return;
    }
    size_t nc = (b->cap ? b->cap * 2 : 256) + (size_t)w;
    char *ns = realloc(b->s, nc);
    if (!ns) {
      b->oom = true;
      return;
    }
    b->s = ns;
    b->cap = nc;
  }
}

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return x < y ? -1 : x > y;
}

static bool runs_contain(const dt_runs *l, int64_t g) {
  for (int i = 0; i < l->n; i++)
    if (g >= l->r[i].start && g < l->r[i].start + l->r[i].len) return true;
  return false;
}

/* Sorted unique boundaries of dim d over all ranks (incl. 0 and n). */
static weft_status boundaries(dt_box *boxes, int nranks, int d, int64_t n, int64_t **out,
                              int *count) {
  int cap = 2;
  for (int r = 0; r < nranks; r++) cap += 2 * boxes[r].d[d].n;
  int64_t *b = malloc((size_t)cap * sizeof *b);
  if (!b) return weft_error(WEFT_ERR_OOM, "visualize boundaries");
  int k = 0;
  b[k++] = 0;
  b[k++] = n;
  for (int r = 0; r < nranks; r++)
    for (int i = 0; i < boxes[r].d[d].n; i++) {
      b[k++] = boxes[r].d[d].r[i].start;
      b[k++] = boxes[r].d[d].r[i].start + boxes[r].d[d].r[i].len;
    }
  qsort(b, (size_t)k, sizeof *b, cmp_i64);
  int u = 0;
  for (int i = 0; i < k; i++)
    if (u == 0 || b[i] != b[u - 1]) b[u++] = b[i];
  *out = b;
  *count = u;
  return WEFT_OK;
}

static void range_label(char *buf, size_t cap, const char *what, int64_t a, int64_t b) {
  if (b - a == 1)
    snprintf(buf, cap, "%s %lld", what, (long long)a);
  else
    snprintf(buf, cap, "%s %lld-%lld", what, (long long)a, (long long)(b - 1));
}

weft_status weft_dtensor_spec_visualize(const weft_dtensor_spec *spec, FILE *f, char *buf,
                                        size_t cap) {
  if (!spec) return weft_error(WEFT_ERR_INVALID, "spec is NULL");
  if (!f && (!buf || cap == 0)) return weft_error(WEFT_ERR_INVALID, "need a FILE or a buffer");
  if (spec->ndim < 1 || spec->ndim > 2)
    return weft_error(WEFT_ERR_UNSUPPORTED, "visualize needs a 1-D or 2-D tensor, got %d dims",
                      spec->ndim);
  int nranks = 1;
  for (int i = 0; i < spec->mesh_ndim; i++) nranks *= spec->mesh_shape[i];
  dt_box *boxes = calloc((size_t)nranks, sizeof *boxes);
  if (!boxes) return weft_error(WEFT_ERR_OOM, "visualize boxes");
  weft_status st = WEFT_OK;
  int64_t *rb = NULL, *cb = NULL;
  int nrb = 0, ncb = 0;
  char **cells = NULL;
  sb out = {0};
  for (int r = 0; r < nranks && st == WEFT_OK; r++) {
    int c[WEFT_MESH_MAX_DIMS];
    dt_unlinear(spec->mesh_shape, spec->mesh_ndim, r, c);
    st = dt_box_of(spec, c, &boxes[r]);
  }
  if (st != WEFT_OK) goto done;
  bool two = spec->ndim == 2;
  WEFT_CHECK_GOTO(boundaries(boxes, nranks, 0, spec->shape[0], &rb, &nrb), st, done);
  if (two) WEFT_CHECK_GOTO(boundaries(boxes, nranks, 1, spec->shape[1], &cb, &ncb), st, done);
  int nrows = nrb - 1, ncols = two ? ncb - 1 : 1;
  char desc[512];
  weft_dtensor_spec_describe(spec, desc, sizeof desc);
  sb_printf(&out, "%s\n", desc);
  for (int i = 0; i < spec->mesh_ndim; i++)
    if (spec->placements[i].kind == WEFT_PLACE_PARTIAL)
      sb_printf(&out, "(mesh dim %d is Partial(%s): every rank along it holds a partial value)\n",
                i, weft_reduce_op_name(spec->placements[i].op));
  if (nrows <= 0 || ncols <= 0) {
    sb_printf(&out, "(empty: no elements)\n");
    goto emit;
  }
  cells = calloc((size_t)(nrows * ncols), sizeof *cells);
  if (!cells) {
    st = weft_error(WEFT_ERR_OOM, "visualize cells");
    goto done;
  }
  size_t cw = 0;
  for (int i = 0; i < nrows; i++)
    for (int j = 0; j < ncols; j++) {
      sb cell = {0};
      int listed = 0;
      for (int r = 0; r < nranks; r++) {
        bool in = runs_contain(&boxes[r].d[0], rb[i]);
        if (in && two) in = runs_contain(&boxes[r].d[1], cb[j]);
        if (in) sb_printf(&cell, "%s%d", listed++ ? "," : "", r);
      }
      if (!listed) sb_printf(&cell, "-");
      if (cell.oom) {
        free(cell.s);
        st = weft_error(WEFT_ERR_OOM, "visualize cell");
        goto done;
      }
      cells[i * ncols + j] = cell.s;
      if (strlen(cell.s) > cw) cw = strlen(cell.s);
    }
  const char *rowword = two ? "rows" : "elems";
  char lab[64];
  size_t lw = 0;
  for (int i = 0; i < nrows; i++) {
    range_label(lab, sizeof lab, rowword, rb[i], rb[i + 1]);
    if (strlen(lab) > lw) lw = strlen(lab);
  }
  if (two) {
    for (int j = 0; j < ncols; j++) {
      range_label(lab, sizeof lab, "cols", cb[j], cb[j + 1]);
      if (strlen(lab) > cw) cw = strlen(lab);
    }
    sb_printf(&out, "%*s", (int)lw, "");
    for (int j = 0; j < ncols; j++) {
      range_label(lab, sizeof lab, "cols", cb[j], cb[j + 1]);
      sb_printf(&out, "  %-*s", j + 1 < ncols ? (int)cw : 0, lab);
    }
    sb_printf(&out, "\n");
  }
  for (int i = 0; i < nrows; i++) {
    range_label(lab, sizeof lab, rowword, rb[i], rb[i + 1]);
    sb_printf(&out, "%-*s", (int)lw, lab);
    for (int j = 0; j < ncols; j++)
      sb_printf(&out, "  %-*s", j + 1 < ncols ? (int)cw : 0, cells[i * ncols + j]);
    sb_printf(&out, "\n");
  }
emit:
  if (out.oom) {
    st = weft_error(WEFT_ERR_OOM, "visualize output");
    goto done;
  }
  if (f) {
    if (fputs(out.s ? out.s : "", f) < 0) st = weft_error(WEFT_ERR_IO, "writing the table failed");
  } else {
    snprintf(buf, cap, "%s", out.s ? out.s : "");
  }
done:
  if (cells)
    for (int i = 0; i < nrows * ncols; i++) free(cells[i]);
  free(cells);
  free(out.s);
  free(rb);
  free(cb);
  for (int r = 0; r < nranks; r++) dt_box_free(&boxes[r]);
  free(boxes);
  return st;
}

weft_status weft_dtensor_visualize(const weft_dtensor *dt, FILE *f) {
  if (!dt) return weft_error(WEFT_ERR_INVALID, "dt is NULL");
  if (!f) return weft_error(WEFT_ERR_INVALID, "f is NULL");
  WEFT_CHECK(weft_dtensor_spec_visualize(&dt->spec, f, NULL, 0));
  return WEFT_OK;
}

weft_status weft_dtensor_visualize_str(const weft_dtensor *dt, char *buf, size_t cap) {
  if (!dt) return weft_error(WEFT_ERR_INVALID, "dt is NULL");
  if (!buf || cap == 0) return weft_error(WEFT_ERR_INVALID, "buffer is NULL or empty");
  WEFT_CHECK(weft_dtensor_spec_visualize(&dt->spec, NULL, buf, cap));
  return WEFT_OK;
}
