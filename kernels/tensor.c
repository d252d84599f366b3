/* weft_tensor: construction, views, and copies between dtypes for any
 * strides. Storage goes through weft_alloc (exact accounting); the small
 * headers come from malloc and are not counted. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend_internal.h"
#include "cpu/cpu_internal.h"
#include "cpu/pool.h"
#include "kernels.h"
#include "tensor_internal.h"

/* ------------------------------------------------------------- helpers */

static bool dtype_valid(weft_dtype dt) { return (unsigned)dt < WEFT_DTYPE_COUNT; }
static bool device_valid(weft_device dev) { return (unsigned)dev < WEFT_DEVICE_COUNT; }

/* "[4, -3]" into buf. */
static const char *fmt_shape(char *buf, size_t cap, int ndim, const int64_t *shape) {
  size_t len = 0;
  buf[0] = '\0';
  len += (size_t)snprintf(buf, cap, "[");
  for (int d = 0; d < ndim && len < cap; d++)
    len += (size_t)snprintf(buf + len, cap - len, d ? ", %" PRId64 : "%" PRId64, shape[d]);
  if (len < cap) snprintf(buf + len, cap - len, "]");
  return buf;
}

void weft_tensor_describe(const weft_tensor *t, char *buf, size_t cap) {
  if (!buf || cap == 0) return;
  if (!t) {
    snprintf(buf, cap, "(null tensor)");
    return;
  }
  char sh[WEFT_MAX_DIMS * 22 + 4];
  int n = (t->ndim >= 0 && t->ndim <= WEFT_MAX_DIMS) ? t->ndim : 0;
  fmt_shape(sh, sizeof sh, n, t->shape);
  if (t->device == WEFT_CPU)
    snprintf(buf, cap, "%s%s", weft_dtype_name(t->dtype), sh);
  else
    snprintf(buf, cap, "%s%s on %s", weft_dtype_name(t->dtype), sh, weft_device_name(t->device));
}

/* Checks dtype, device, ndim and sizes; on success *numel_out is the product. */
static weft_status check_geometry(const char *func, weft_dtype dt, weft_device dev, int ndim,
                                  const int64_t *shape, int64_t *numel_out) {
  if (!dtype_valid(dt)) return weft_error_at(WEFT_ERR_INVALID, func, "invalid dtype %d", (int)dt);
  if (!device_valid(dev))
    return weft_error_at(WEFT_ERR_INVALID, func, "invalid device %d", (int)dev);
  if (ndim < 0 || ndim > WEFT_MAX_DIMS)
    return weft_error_at(WEFT_ERR_INVALID, func, "ndim %d out of range (0..%d, WEFT_MAX_DIMS)",
                         ndim, WEFT_MAX_DIMS);
  if (ndim > 0 && !shape)
    return weft_error_at(WEFT_ERR_INVALID, func, "shape is NULL with ndim %d", ndim);
  int64_t numel = 1;
  bool overflow = false;
  for (int d = 0; d < ndim; d++) {
    if (shape[d] < 0) {
      char sh[WEFT_MAX_DIMS * 22 + 4];
      return weft_error_at(WEFT_ERR_INVALID, func,
                           "negative size %" PRId64 " in dim %d of shape %s", shape[d], d,
                           fmt_shape(sh, sizeof sh, ndim, shape));
    }
    if (__builtin_mul_overflow(numel, shape[d], &numel)) overflow = true;
  }
  int64_t nbytes;
  if (overflow || __builtin_mul_overflow(numel, (int64_t)weft_dtype_size(dt), &nbytes)) {
    char sh[WEFT_MAX_DIMS * 22 + 4];
    return weft_error_at(WEFT_ERR_INVALID, func, "shape %s of %s has too many elements",
                         fmt_shape(sh, sizeof sh, ndim, shape), weft_dtype_name(dt));
  }
  if (numel_out) *numel_out = numel;
  return WEFT_OK;
}

/* Contiguous row-major strides for shape. */
static void contiguous_strides(int ndim, const int64_t *shape, int64_t *strides) {
  int64_t s = 1;
  for (int d = ndim - 1; d >= 0; d--) {
    strides[d] = s;
    s *= shape[d] > 0 ? shape[d] : 1;
  }
}

static void header_init(weft_tensor *t, void *data, weft_dtype dt, weft_device dev, int ndim,
                        const int64_t *shape, const int64_t *strides) {
  memset(t, 0, sizeof *t);
  t->dtype = dt;
  t->device = dev;
  t->ndim = ndim;
  for (int d = 0; d < ndim; d++) t->shape[d] = shape[d];
  if (strides)
    for (int d = 0; d < ndim; d++) t->strides[d] = strides[d];
  else
    contiguous_strides(ndim, shape, t->strides);
  t->data = data;
  t->base_ = NULL;
}

static weft_status check_tensor(const char *func, const weft_tensor *t, const char *name) {
  if (!t) return weft_error_at(WEFT_ERR_INVALID, func, "%s is NULL", name);
  if (t->ndim < 0 || t->ndim > WEFT_MAX_DIMS || !dtype_valid(t->dtype) || !device_valid(t->device))
    return weft_error_at(WEFT_ERR_INVALID, func,
                         "%s is not a valid tensor (ndim %d, dtype %d, device %d)", name, t->ndim,
                         (int)t->dtype, (int)t->device);
  return WEFT_OK;
}

/* Normalises a possibly negative dim against ndim. */
static weft_status norm_dim(const char *func, const weft_tensor *t, int dim, int *out) {
  int nd = t->ndim;
  if (dim < -nd || dim >= nd) {
    char desc[256];
    weft_tensor_describe(t, desc, sizeof desc);
    if (nd == 0)
      return weft_error_at(WEFT_ERR_INVALID, func, "dim %d out of range for 0-d tensor %s", dim,
                           desc);
    return weft_error_at(WEFT_ERR_INVALID, func, "dim %d out of range for %s (expected %d..%d)",
                         dim, desc, -nd, nd - 1);
  }
  *out = dim < 0 ? dim + nd : dim;
  return WEFT_OK;
}

static weft_status new_header(const char *func, weft_tensor **out) {
  *out = malloc(sizeof(weft_tensor));
  if (!*out) return weft_error_at(WEFT_ERR_OOM, func, "tensor header allocation failed");
  return WEFT_OK;
}

/* A heap copy of t's header as a non-owning view. */
static weft_status view_of(const char *func, const weft_tensor *t, weft_tensor **out) {
  weft_status st = new_header(func, out);
  if (st != WEFT_OK) return st;
  **out = *t;
  (*out)->base_ = NULL;
  return WEFT_OK;
}

/* ---------------------------------------------------------- iteration */

void weft_iter_init_(weft_iter_ *it, int nops, const weft_tensor *const *ts) {
  /* only the fields below ndim / nops are set (and read): no memset of the
   * whole struct, this runs once per kernel call */
  it->nops = nops;
  const weft_tensor *t0 = ts[0];
  int64_t numel = 1;
  for (int d = 0; d < t0->ndim; d++) numel *= t0->shape[d];
  it->numel = numel;
  for (int op = 0; op < nops; op++) {
    it->data[op] = (char *)ts[op]->data;
    it->esize[op] = (int64_t)weft_dtype_size(ts[op]->dtype);
  }
  /* kept dims (size != 1), then merge from the innermost outwards */
  int kept[WEFT_MAX_DIMS], m = 0;
  for (int d = 0; d < t0->ndim; d++)
    if (t0->shape[d] != 1) kept[m++] = d;
  if (m == 0 || numel == 0) {
    it->ndim = 1;
    it->shape[0] = numel == 0 ? 0 : 1;
    for (int op = 0; op < nops; op++) it->strides[op][0] = 0;
    return;
  }
  int64_t rs[WEFT_MAX_DIMS], rst[WEFT_ITER_MAX_OPS][WEFT_MAX_DIMS];
  int r = 0;
  for (int j = m - 1; j >= 0; j--) {
    int d = kept[j];
    bool merge = r > 0;
    for (int op = 0; merge && op < nops; op++)
      if (ts[op]->strides[d] != rst[op][r - 1] * rs[r - 1]) merge = false;
    if (merge) {
      rs[r - 1] *= t0->shape[d];
    } else {
      rs[r] = t0->shape[d];
      for (int op = 0; op < nops; op++) rst[op][r] = ts[op]->strides[d];
      r++;
    }
  }
  it->ndim = r;
  for (int i = 0; i < r; i++) {
    it->shape[i] = rs[r - 1 - i];
    for (int op = 0; op < nops; op++) it->strides[op][i] = rst[op][r - 1 - i];
  }
}

void weft_iter_run_(const weft_iter_ *it, weft_iter_row_fn_ fn, void *ctx) {
  if (it->numel == 0) return;
  const int nd = it->ndim, no = it->nops;
  char *p[WEFT_ITER_MAX_OPS] = {0};
  int64_t inner[WEFT_ITER_MAX_OPS] = {0};
  for (int op = 0; op < no; op++) {
    p[op] = it->data[op];
    inner[op] = it->strides[op][nd - 1];
  }
  const int64_t n = it->shape[nd - 1];
  int64_t idx[WEFT_MAX_DIMS] = {0};
  for (;;) {
    fn(p, inner, n, ctx);
    int d = nd - 2;
    for (; d >= 0; d--) {
      idx[d]++;
      for (int op = 0; op < no; op++) p[op] += it->strides[op][d] * it->esize[op];
      if (idx[d] < it->shape[d]) break;
      for (int op = 0; op < no; op++) p[op] -= it->strides[op][d] * it->shape[d] * it->esize[op];
      idx[d] = 0;
    }
    if (d < 0) return;
  }
}

/* ------------------------------------------------------- construction */

weft_status weft_tensor_create(weft_dtype dt, weft_device dev, int ndim, const int64_t *shape,
                               weft_tensor **out) {
  if (!out) return weft_error(WEFT_ERR_INVALID, "out is NULL");
  *out = NULL;
  int64_t numel;
  weft_status st = check_geometry(__func__, dt, dev, ndim, shape, &numel);
  if (st != WEFT_OK) return st;
  weft_tensor *t;
  WEFT_CHECK(new_header(__func__, &t));
  header_init(t, NULL, dt, dev, ndim, shape, NULL);
  void *mem;
  st = weft_alloc(dev, (size_t)numel * weft_dtype_size(dt), &mem);
  if (st != WEFT_OK) {
    free(t);
    return weft_error_trace(st, __func__);
  }
  t->data = t->base_ = mem;
  *out = t;
  return WEFT_OK;
}

weft_status weft_tensor_zeros(weft_dtype dt, weft_device dev, int ndim, const int64_t *shape,
                              weft_tensor **out) {
  WEFT_CHECK(weft_tensor_create(dt, dev, ndim, shape, out));
  weft_status st = weft_memset(dev, (*out)->data, 0, weft_tensor_nbytes(*out));
  if (st != WEFT_OK) {
    weft_tensor_destroy(*out);
    *out = NULL;
    return weft_error_trace(st, __func__);
  }
  return WEFT_OK;
}

weft_status weft_tensor_view_init(weft_tensor *view, void *data, weft_dtype dt, weft_device dev,
                                  int ndim, const int64_t *shape, const int64_t *strides) {
  if (!view) return weft_error(WEFT_ERR_INVALID, "view is NULL");
  int64_t numel;
  weft_status st = check_geometry(__func__, dt, dev, ndim, shape, &numel);
  if (st != WEFT_OK) return st;
  if (!data && numel > 0)
    return weft_error(WEFT_ERR_INVALID, "data is NULL for %" PRId64 " elements of %s", numel,
                      weft_dtype_name(dt));
  if ((uintptr_t)data % weft_dtype_size(dt) != 0)
    return weft_error(WEFT_ERR_INVALID, "data %p is not aligned to the %zu-byte %s elements", data,
                      weft_dtype_size(dt), weft_dtype_name(dt));
  header_init(view, data, dt, dev, ndim, shape, strides);
  return WEFT_OK;
}

weft_status weft_tensor_wrap(void *data, weft_dtype dt, weft_device dev, int ndim,
                             const int64_t *shape, weft_tensor **out) {
  if (!out) return weft_error(WEFT_ERR_INVALID, "out is NULL");
  *out = NULL;
  weft_tensor tmp;
  WEFT_CHECK(weft_tensor_view_init(&tmp, data, dt, dev, ndim, shape, NULL));
  WEFT_CHECK(new_header(__func__, out));
  **out = tmp;
  return WEFT_OK;
}

void weft_tensor_destroy(weft_tensor *t) {
  if (!t) return;
  if (t->base_) weft_free(t->base_);
  free(t);
}

/* --------------------------------------------------------- properties */

int64_t weft_tensor_numel(const weft_tensor *t) {
  if (!t) return 0;
  int64_t n = 1;
  for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
  return n;
}

size_t weft_tensor_nbytes(const weft_tensor *t) {
  return t ? (size_t)weft_tensor_numel(t) * weft_dtype_size(t->dtype) : 0;
}

/* As torch: dims of size 1 may have any stride; an empty tensor is contiguous. */
bool weft_tensor_is_contiguous(const weft_tensor *t) {
  if (!t) return false;
  if (weft_tensor_numel(t) == 0) return true;
  int64_t expect = 1;
  for (int d = t->ndim - 1; d >= 0; d--) {
    if (t->shape[d] != 1 && t->strides[d] != expect) return false;
    expect *= t->shape[d];
  }
  return true;
}

bool weft_tensor_same_shape(const weft_tensor *a, const weft_tensor *b) {
  if (!a || !b || a->ndim != b->ndim) return false;
  for (int d = 0; d < a->ndim; d++)
    if (a->shape[d] != b->shape[d]) return false;
  return true;
}

/* -------------------------------------------------------------- views */

weft_status weft_tensor_narrow(const weft_tensor *t, int dim, int64_t start, int64_t len,
                               weft_tensor **out) {
  if (!out) return weft_error(WEFT_ERR_INVALID, "out is NULL");
  *out = NULL;
  WEFT_CHECK(check_tensor(__func__, t, "tensor"));
  int d = 0; /* set by norm_dim; initialised for -O3 maybe-uninitialized */
  WEFT_CHECK(norm_dim(__func__, t, dim, &d));
  int64_t n = t->shape[d];
  if (start < 0 || len < 0 || start > n || len > n - start) {
    char desc[256];
    weft_tensor_describe(t, desc, sizeof desc);
    return weft_error(WEFT_ERR_INVALID,
                      "narrow(dim %d, start %" PRId64 ", len %" PRId64 ") is outside [0, %" PRId64
                      ") of %s",
                      dim, start, len, n, desc);
  }
  WEFT_CHECK(view_of(__func__, t, out));
  (*out)->shape[d] = len;
  (*out)->data = (char *)t->data + start * t->strides[d] * (int64_t)weft_dtype_size(t->dtype);
  return WEFT_OK;
}

weft_status weft_tensor_view(const weft_tensor *t, int ndim, const int64_t *shape,
                             weft_tensor **out) {
  if (!out) return weft_error(WEFT_ERR_INVALID, "out is NULL");
  *out = NULL;
  WEFT_CHECK(check_tensor(__func__, t, "tensor"));
  char desc[256], sh[WEFT_MAX_DIMS * 22 + 4];
  weft_tensor_describe(t, desc, sizeof desc);
  if (ndim < 0 || ndim > WEFT_MAX_DIMS)
    return weft_error(WEFT_ERR_INVALID, "ndim %d out of range (0..%d, WEFT_MAX_DIMS)", ndim,
                      WEFT_MAX_DIMS);
  if (ndim > 0 && !shape) return weft_error(WEFT_ERR_INVALID, "shape is NULL with ndim %d", ndim);
  int64_t fixed[WEFT_MAX_DIMS];
  int infer = -1;
  int64_t prod = 1;
  for (int d = 0; d < ndim; d++) {
    fixed[d] = shape[d];
    if (shape[d] == -1) {
      if (infer >= 0)
        return weft_error(WEFT_ERR_INVALID, "view shape %s has more than one -1",
                          fmt_shape(sh, sizeof sh, ndim, shape));
      infer = d;
    } else if (shape[d] < 0) {
      return weft_error(WEFT_ERR_INVALID, "negative size %" PRId64 " in dim %d of view shape %s",
                        shape[d], d, fmt_shape(sh, sizeof sh, ndim, shape));
    } else if (__builtin_mul_overflow(prod, shape[d], &prod)) {
      return weft_error(WEFT_ERR_INVALID, "view shape %s has too many elements",
                        fmt_shape(sh, sizeof sh, ndim, shape));
    }
  }
  int64_t numel = weft_tensor_numel(t);
  if (infer >= 0) {
    if (prod == 0 || numel % prod != 0)
      return weft_error(WEFT_ERR_INVALID,
                        "view shape %s cannot hold the %" PRId64 " elements of %s",
                        fmt_shape(sh, sizeof sh, ndim, shape), numel, desc);
    fixed[infer] = numel / prod;
    prod = numel;
  }
  if (prod != numel)
    return weft_error(WEFT_ERR_INVALID, "view shape %s has %" PRId64 " elements, %s has %" PRId64,
                      fmt_shape(sh, sizeof sh, ndim, shape), prod, desc, numel);
  int64_t strides[WEFT_MAX_DIMS];
  if (!weft_tensor_view_strides(t, ndim, fixed, strides))
    return weft_error(WEFT_ERR_INVALID,
                      "view shape %s: %s is strided so that no view has that shape (clone it "
                      "first)",
                      fmt_shape(sh, sizeof sh, ndim, fixed), desc);
  WEFT_CHECK(new_header(__func__, out));
  header_init(*out, t->data, t->dtype, t->device, ndim, fixed, strides);
  return WEFT_OK;
}

/* torch's computeStride: walks t's dims from the last in chunks whose
 * elements are laid out as one contiguous run of some base stride, and
 * gives each chunk's elements to the new dims that hold exactly as many. */
bool weft_tensor_view_strides(const weft_tensor *t, int ndim, const int64_t *shape,
                              int64_t *strides) {
  if (!t || ndim < 0 || ndim > WEFT_MAX_DIMS || (ndim > 0 && (!shape || !strides))) return false;
  int64_t n = 1;
  for (int d = 0; d < ndim; d++) n *= shape[d];
  if (n != weft_tensor_numel(t)) return false;
  if (n == 0 || t->ndim == 0 || weft_tensor_is_contiguous(t)) {
    int64_t s = 1;
    for (int d = ndim - 1; d >= 0; d--) {
      strides[d] = s;
      s *= shape[d] > 1 ? shape[d] : 1;
    }
    return true;
  }
  int view_d = ndim - 1;
  int64_t base = t->strides[t->ndim - 1], tensor_n = 1, view_n = 1;
  for (int td = t->ndim - 1; td >= 0; td--) {
    tensor_n *= t->shape[td];
    if (td == 0 || (t->shape[td - 1] != 1 && t->strides[td - 1] != tensor_n * base)) {
      while (view_d >= 0 && (view_n < tensor_n || shape[view_d] == 1)) {
        strides[view_d] = view_n * base;
        view_n *= shape[view_d];
        view_d--;
      }
      if (view_n != tensor_n) return false;
      if (td > 0) {
        base = t->strides[td - 1];
        tensor_n = view_n = 1;
      }
    }
  }
  return view_d == -1;
}

weft_status weft_tensor_transpose(const weft_tensor *t, int d0, int d1, weft_tensor **out) {
  if (!out) return weft_error(WEFT_ERR_INVALID, "out is NULL");
  *out = NULL;
  WEFT_CHECK(check_tensor(__func__, t, "tensor"));
  int a, b;
  WEFT_CHECK(norm_dim(__func__, t, d0, &a));
  WEFT_CHECK(norm_dim(__func__, t, d1, &b));
  WEFT_CHECK(view_of(__func__, t, out));
  (*out)->shape[a] = t->shape[b];
  (*out)->shape[b] = t->shape[a];
  (*out)->strides[a] = t->strides[b];
  (*out)->strides[b] = t->strides[a];
  return WEFT_OK;
}

void weft_chunk_range(int64_t n, int64_t k, int64_t i, int64_t *start, int64_t *len) {
  int64_t s = 0, l = 0;
  if (n > 0 && k > 0 && i >= 0 && i < k) {
    int64_t c = n / k + (n % k != 0); /* ceil(n / k) without overflow */
    /* i * c <= (k - 1) * ceil(n / k) < n + k: no overflow for sane n, k */
    s = i * c < n ? i * c : n;
    int64_t e = (i + 1) * c < n ? (i + 1) * c : n;
    l = e - s;
  }
  if (start) *start = s;
  if (len) *len = l;
}

weft_status weft_tensor_chunk(const weft_tensor *t, int64_t k, int dim, weft_tensor **out) {
  if (!out) return weft_error(WEFT_ERR_INVALID, "out is NULL");
  WEFT_CHECK(check_tensor(__func__, t, "tensor"));
  if (k < 1) return weft_error(WEFT_ERR_INVALID, "chunk count k must be >= 1, got %" PRId64, k);
  int d = 0; /* set by norm_dim; initialised for -O3 maybe-uninitialized */
  WEFT_CHECK(norm_dim(__func__, t, dim, &d));
  for (int64_t i = 0; i < k; i++) {
    int64_t s, l;
    weft_chunk_range(t->shape[d], k, i, &s, &l);
    weft_status st = weft_tensor_narrow(t, d, s, l, &out[i]);
    if (st != WEFT_OK) {
      for (int64_t j = 0; j < i; j++) {
        weft_tensor_destroy(out[j]);
        out[j] = NULL;
      }
      return weft_error_trace(st, __func__);
    }
  }
  return WEFT_OK;
}

/* ------------------------------------------------------------- copies */

typedef struct copy_ctx {
  weft_dtype dst, src;
} copy_ctx;

#define COPY_LOOP(DT, ST, EXPR)               \
  do {                                        \
    DT *restrict o_ = (DT *)p[0];             \
    const ST *restrict s_ = (const ST *)p[1]; \
    const int64_t so_ = st[0], ss_ = st[1];   \
    if (so_ == 1 && ss_ == 1) {               \
      for (int64_t i = 0; i < n; i++) {       \
        ST x = s_[i];                         \
        o_[i] = (EXPR);                       \
      }                                       \
    } else {                                  \
      for (int64_t i = 0; i < n; i++) {       \
        ST x = s_[i * ss_];                   \
        o_[i * so_] = (EXPR);                 \
      }                                       \
    }                                         \
  } while (0)

static void copy_row(char *const *p, const int64_t *st, int64_t n, void *vctx) {
  const copy_ctx *c = vctx;
  if (c->dst == c->src) {
    size_t es = weft_dtype_size(c->dst);
    if (st[0] == 1 && st[1] == 1) {
      memmove(p[0], p[1], (size_t)n * es);
      return;
    }
    switch (es) {
      case 1:
        COPY_LOOP(uint8_t, uint8_t, x);
        return;
      case 2:
        COPY_LOOP(uint16_t, uint16_t, x);
        return;
      case 4:
        COPY_LOOP(uint32_t, uint32_t, x);
        return;
      default:
        COPY_LOOP(uint64_t, uint64_t, x);
        return;
    }
  }
  /* the conversions mixed precision uses, without a per-element switch
   * (f32 <-> bf16 on unit strides vectorised) */
  if (st[0] == 1 && st[1] == 1 && c->dst == WEFT_BF16 && c->src == WEFT_F32)
    weft_cpu_f32_to_bf16_((uint16_t *)p[0], (const float *)p[1], n);
  else if (st[0] == 1 && st[1] == 1 && c->dst == WEFT_F32 && c->src == WEFT_BF16)
    weft_cpu_bf16_to_f32_((float *)p[0], (const uint16_t *)p[1], n);
  else if (c->dst == WEFT_BF16 && c->src == WEFT_F32)
    COPY_LOOP(uint16_t, float, weft_f32_to_bf16_i_(x));
  else if (c->dst == WEFT_F32 && c->src == WEFT_BF16)
    COPY_LOOP(float, uint16_t, weft_bf16_to_f32_i_(x));
  else if (c->dst == WEFT_F16 && c->src == WEFT_F32)
    COPY_LOOP(uint16_t, float, weft_f32_to_f16_i_(x));
  else if (c->dst == WEFT_F32 && c->src == WEFT_F16)
    COPY_LOOP(float, uint16_t, weft_f16_to_f32_i_(x));
  else if (c->dst == WEFT_F64 && c->src == WEFT_F32)
    COPY_LOOP(double, float, (double)x);
  else if (c->dst == WEFT_F32 && c->src == WEFT_F64)
    COPY_LOOP(float, double, (float)x);
  else {
    const int64_t eo = (int64_t)weft_dtype_size(c->dst), es = (int64_t)weft_dtype_size(c->src);
    for (int64_t i = 0; i < n; i++)
      weft_convert_elem_(p[0] + i * st[0] * eo, c->dst, p[1] + i * st[1] * es, c->src);
  }
}

/* Same dtype, unit inner strides on both sides (after the iterator merged
 * what it could): one memmove per row, no callback per row. This is the
 * box copy of dtensor's transfers and dcp's staging (weft_tensor_copy_region). */
static void copy_rows_same(const weft_iter_ *it, size_t es) {
  const int nd = it->ndim;
  char *d = it->data[0];
  const char *s = it->data[1];
  const size_t row = (size_t)it->shape[nd - 1] * es;
  if (nd == 1) {
    memmove(d, s, row);
    return;
  }
  if (nd == 2) {
    const int64_t dst0 = it->strides[0][0] * (int64_t)es, sst0 = it->strides[1][0] * (int64_t)es;
    for (int64_t i = 0; i < it->shape[0]; i++) memmove(d + i * dst0, s + i * sst0, row);
    return;
  }
  int64_t idx[WEFT_MAX_DIMS] = {0};
  for (;;) {
    memmove(d, s, row);
    int k = nd - 2;
    for (; k >= 0; k--) {
      idx[k]++;
      d += it->strides[0][k] * (int64_t)es;
      s += it->strides[1][k] * (int64_t)es;
      if (idx[k] < it->shape[k]) break;
      d -= it->strides[0][k] * it->shape[k] * (int64_t)es;
      s -= it->strides[1][k] * it->shape[k] * (int64_t)es;
      idx[k] = 0;
    }
    if (k < 0) return;
  }
}

typedef struct dense_copy {
  const copy_ctx *c;
  char *dst;
  const char *src;
  int64_t dsize, ssize;
} dense_copy;

static void dense_span(void *ctx, int64_t lo, int64_t hi) {
  const dense_copy *d = ctx;
  char *p[2] = {d->dst + lo * d->dsize, (char *)d->src + lo * d->ssize};
  const int64_t st[2] = {1, 1};
  copy_row(p, st, hi - lo, (void *)d->c);
}

weft_status weft_cpu_copy_(weft_tensor *dst, const weft_tensor *src) {
  if (weft_tensor_numel(dst) == 0) return WEFT_OK;
  const weft_tensor *ops[2] = {dst, src};
  weft_iter_ it;
  weft_iter_init_(&it, 2, ops); /* merges contiguous dims: a dense pair is one row */
  if (dst->dtype == src->dtype && it.strides[0][it.ndim - 1] == 1 &&
      it.strides[1][it.ndim - 1] == 1) {
    copy_rows_same(&it, weft_dtype_size(dst->dtype));
    return WEFT_OK;
  }
  copy_ctx c = {dst->dtype, src->dtype};
  if (it.ndim == 1 && it.strides[0][0] == 1 && it.strides[1][0] == 1) {
    /* one dense run: split over the CPU threads (each chunk converts as
     * the whole would) */
    dense_copy d = {&c, it.data[0], it.data[1], (int64_t)weft_dtype_size(dst->dtype),
                    (int64_t)weft_dtype_size(src->dtype)};
    weft_cpu_par_range_(it.shape[0], WEFT_CPU_GRAIN, dense_span, &d);
    return WEFT_OK;
  }
  weft_iter_run_(&it, copy_row, &c);
  return WEFT_OK;
}

/* One device's copy member (dst and src on that device). */
static weft_status copy_on(weft_tensor *dst, const weft_tensor *src) {
  weft_status st;
  const weft_tensor *ts[2] = {dst, src};
  const char *names[2] = {"dst", "src"};
  const weft_backend *be = weft_backend_for_tensors_(
      "weft_tensor_copy", offsetof(weft_backend, copy), 2, ts, names, &st);
  if (!be) return st;
  return weft_backend_trace_(be->copy(dst, src), be, "weft_tensor_copy");
}

/* A contiguous tensor like t (its shape) of dtype dt on dev. */
static weft_status temp_like(const weft_tensor *t, weft_dtype dt, weft_device dev,
                             weft_tensor **out) {
  return weft_tensor_create(dt, dev, t->ndim, t->shape, out);
}

/* Between the host and a device: the bytes cross once, contiguous, in the
 * dtype of the side that converts nothing; conversions and strides are
 * handled on the host side (CPU copy) or by the device's own copy. */
static weft_status copy_across(weft_tensor *dst, const weft_tensor *src) {
  if (weft_tensor_numel(dst) == 0) {
    /* still refuse a device this build cannot serve */
    weft_device dev = dst->device == WEFT_CPU ? src->device : dst->device;
    return weft_backend_get(dev) ? WEFT_OK : weft_backend_no_table_(dev, "weft_tensor_copy");
  }
  weft_status st = WEFT_OK;
  weft_tensor *host = NULL, *devtmp = NULL;
  if (src->device == WEFT_CPU) { /* host -> device */
    weft_device dev = dst->device;
    const weft_tensor *from = src;
    if (src->dtype != dst->dtype || !weft_tensor_is_contiguous(src)) {
      st = temp_like(dst, dst->dtype, WEFT_CPU, &host);
      if (!st) st = weft_cpu_copy_(host, src);
      from = host;
    }
    if (!st && weft_tensor_is_contiguous(dst)) {
      st = weft_memcpy(dev, dst->data, from->data, weft_tensor_nbytes(dst), WEFT_COPY_H2D);
    } else if (!st) {
      st = temp_like(dst, dst->dtype, dev, &devtmp);
      if (!st)
        st = weft_memcpy(dev, devtmp->data, from->data, weft_tensor_nbytes(dst), WEFT_COPY_H2D);
      if (!st) st = copy_on(dst, devtmp);
    }
  } else { /* device -> host */
    weft_device dev = src->device;
    const weft_tensor *from = src;
    if (!weft_tensor_is_contiguous(src)) {
      st = temp_like(src, src->dtype, dev, &devtmp);
      if (!st) st = copy_on(devtmp, src);
      from = devtmp;
    }
    if (!st && dst->dtype == src->dtype && weft_tensor_is_contiguous(dst)) {
      st = weft_memcpy(dev, dst->data, from->data, weft_tensor_nbytes(dst), WEFT_COPY_D2H);
    } else if (!st) {
      st = temp_like(src, src->dtype, WEFT_CPU, &host);
      if (!st)
        st = weft_memcpy(dev, host->data, from->data, weft_tensor_nbytes(host), WEFT_COPY_D2H);
      if (!st) st = weft_cpu_copy_(dst, host);
    }
  }
  weft_tensor_destroy(host);
  weft_tensor_destroy(devtmp);
  return st;
}

weft_status weft_tensor_copy(weft_tensor *dst, const weft_tensor *src) {
  WEFT_CHECK(check_tensor(__func__, dst, "dst"));
  WEFT_CHECK(check_tensor(__func__, src, "src"));
  if (!weft_tensor_same_shape(dst, src)) {
    char dd[256], ds[256];
    weft_tensor_describe(dst, dd, sizeof dd);
    weft_tensor_describe(src, ds, sizeof ds);
    return weft_error(WEFT_ERR_INVALID, "shape mismatch: dst %s, src %s", dd, ds);
  }
  if (dst->device == src->device) return copy_on(dst, src);
  if (dst->device != WEFT_CPU && src->device != WEFT_CPU)
    return weft_error(WEFT_ERR_UNSUPPORTED, "copies between %s and %s go through the host",
                      weft_device_name(src->device), weft_device_name(dst->device));
  weft_status st = copy_across(dst, src);
  return st ? weft_error_trace(st, __func__) : WEFT_OK;
}

/* dst_offsets/src_offsets + sizes inside t (ndim dims), or an error naming
 * which. */
static weft_status region_check(const weft_tensor *t, const char *name, const int64_t *off,
                                const int64_t *sizes) {
  for (int d = 0; d < t->ndim; d++) {
    int64_t o = off ? off[d] : 0;
    if (sizes[d] < 0 || o < 0 || o > t->shape[d] - sizes[d]) {
      char desc[256];
      weft_tensor_describe(t, desc, sizeof desc);
      return weft_error_at(WEFT_ERR_INVALID, "weft_tensor_copy_region",
                           "dim %d: region [%" PRId64 ", +%" PRId64 ") lies outside %s %s", d, o,
                           sizes[d], name, desc);
    }
  }
  return WEFT_OK;
}

weft_status weft_tensor_copy_region(weft_tensor *dst, const int64_t *dst_offsets,
                                    const weft_tensor *src, const int64_t *src_offsets,
                                    const int64_t *sizes) {
  WEFT_CHECK(check_tensor(__func__, dst, "dst"));
  WEFT_CHECK(check_tensor(__func__, src, "src"));
  if (dst->ndim != src->ndim)
    return weft_error(WEFT_ERR_INVALID, "dst has %d dims, src %d", dst->ndim, src->ndim);
  if (!sizes && dst->ndim > 0) return weft_error(WEFT_ERR_INVALID, "sizes is NULL");
  WEFT_CHECK(region_check(dst, "dst", dst_offsets, sizes));
  WEFT_CHECK(region_check(src, "src", src_offsets, sizes));
  /* two stack views of the box; their data pointers stay element-aligned */
  weft_tensor d = *dst, s = *src;
  d.base_ = s.base_ = NULL;
  const size_t de = weft_dtype_size(dst->dtype), se = weft_dtype_size(src->dtype);
  for (int k = 0; k < dst->ndim; k++) {
    if (sizes[k] == 0) return WEFT_OK;
    if (dst_offsets) d.data = (char *)d.data + dst_offsets[k] * dst->strides[k] * (int64_t)de;
    if (src_offsets) s.data = (char *)s.data + src_offsets[k] * src->strides[k] * (int64_t)se;
    d.shape[k] = s.shape[k] = sizes[k];
  }
  if (d.device == s.device) return copy_on(&d, &s);
  if (d.device != WEFT_CPU && s.device != WEFT_CPU)
    return weft_error(WEFT_ERR_UNSUPPORTED, "copies between %s and %s go through the host",
                      weft_device_name(s.device), weft_device_name(d.device));
  weft_status st = copy_across(&d, &s);
  return st ? weft_error_trace(st, __func__) : WEFT_OK;
}

weft_status weft_tensor_to(const weft_tensor *src, weft_device dev, weft_tensor **out) {
  if (!out) return weft_error(WEFT_ERR_INVALID, "out is NULL");
  *out = NULL;
  WEFT_CHECK(check_tensor(__func__, src, "src"));
  WEFT_CHECK(weft_tensor_create(src->dtype, dev, src->ndim, src->shape, out));
  weft_status st = weft_tensor_copy(*out, src);
  if (st != WEFT_OK) {
    weft_tensor_destroy(*out);
    *out = NULL;
    return weft_error_trace(st, __func__);
  }
  return WEFT_OK;
}

weft_status weft_tensor_clone(const weft_tensor *t, weft_tensor **out) {
  if (!out) return weft_error(WEFT_ERR_INVALID, "out is NULL");
  *out = NULL;
  WEFT_CHECK(check_tensor(__func__, t, "tensor"));
  WEFT_CHECK(weft_tensor_create(t->dtype, t->device, t->ndim, t->shape, out));
  weft_status st = weft_tensor_copy(*out, t);
  if (st != WEFT_OK) {
    weft_tensor_destroy(*out);
    *out = NULL;
    return weft_error_trace(st, __func__);
  }
  return WEFT_OK;
}

weft_status weft_cast(const weft_tensor *t, weft_dtype dt, weft_tensor **out) {
  if (!out) return weft_error(WEFT_ERR_INVALID, "out is NULL");
  *out = NULL;
  WEFT_CHECK(check_tensor(__func__, t, "tensor"));
  if (!dtype_valid(dt)) return weft_error(WEFT_ERR_INVALID, "invalid dtype %d", (int)dt);
  WEFT_CHECK(weft_tensor_create(dt, t->device, t->ndim, t->shape, out));
  weft_status st = weft_tensor_copy(*out, t);
  if (st != WEFT_OK) {
    weft_tensor_destroy(*out);
    *out = NULL;
    return weft_error_trace(st, __func__);
  }
  return WEFT_OK;
}

weft_status weft_tensor_cat(weft_tensor *const *ts, int n, int dim, weft_tensor **out) {
  if (!out) return weft_error(WEFT_ERR_INVALID, "out is NULL");
  *out = NULL;
  if (!ts) return weft_error(WEFT_ERR_INVALID, "tensor list is NULL");
  if (n < 1) return weft_error(WEFT_ERR_INVALID, "need at least one tensor, got n = %d", n);
  for (int i = 0; i < n; i++) {
    char name[32];
    snprintf(name, sizeof name, "tensor %d", i);
    WEFT_CHECK(check_tensor(__func__, ts[i], name));
    if (ts[i]->device != ts[0]->device)
      return weft_error(WEFT_ERR_INVALID, "%s is on %s, tensor 0 on %s: one device per cat", name,
                        weft_device_name(ts[i]->device), weft_device_name(ts[0]->device));
  }
  const weft_tensor *r = ts[0];
  if (r->ndim == 0) return weft_error(WEFT_ERR_INVALID, "cannot concatenate 0-d tensors");
  int d = 0; /* set by norm_dim; initialised for -O3 maybe-uninitialized */
  WEFT_CHECK(norm_dim(__func__, r, dim, &d));
  int64_t total = 0;
  for (int i = 0; i < n; i++) {
    const weft_tensor *t = ts[i];
    char d0[256], di[256];
    weft_tensor_describe(r, d0, sizeof d0);
    weft_tensor_describe(t, di, sizeof di);
    if (t->dtype != r->dtype)
      return weft_error(WEFT_ERR_INVALID, "dtype mismatch: tensor 0 is %s, tensor %d is %s", d0, i,
                        di);
    bool ok = t->ndim == r->ndim;
    for (int k = 0; ok && k < r->ndim; k++)
      if (k != d && t->shape[k] != r->shape[k]) ok = false;
    if (!ok)
      return weft_error(WEFT_ERR_INVALID,
                        "shape mismatch outside dim %d: tensor 0 is %s, tensor %d is %s", d, d0, i,
                        di);
    if (__builtin_add_overflow(total, t->shape[d], &total))
      return weft_error(WEFT_ERR_INVALID, "concatenated size overflows");
  }
  int64_t shape[WEFT_MAX_DIMS];
  memcpy(shape, r->shape, sizeof shape);
  shape[d] = total;
  WEFT_CHECK(weft_tensor_create(r->dtype, r->device, r->ndim, shape, out));
  int64_t off = 0;
  const int64_t es = (int64_t)weft_dtype_size(r->dtype);
  for (int i = 0; i < n; i++) {
    weft_tensor part = **out;
    part.base_ = NULL;
    part.shape[d] = ts[i]->shape[d];
    part.data = (char *)(*out)->data + off * (*out)->strides[d] * es;
    off += ts[i]->shape[d];
    weft_status st = weft_tensor_copy(&part, ts[i]);
    if (st != WEFT_OK) {
      weft_tensor_destroy(*out);
      *out = NULL;
      return weft_error_trace(st, __func__);
    }
  }
  return WEFT_OK;
}

/* --------------------------------------------------------- fill / get */

typedef struct fill_ctx {
  int64_t esize;
  unsigned char bytes[8];
} fill_ctx;

static void fill_row(char *const *p, const int64_t *st, int64_t n, void *vctx) {
  const fill_ctx *c = vctx;
  const int64_t s = st[0];
#define FILL_AS(T)                                  \
  do {                                              \
    T v_;                                           \
    memcpy(&v_, c->bytes, sizeof v_);               \
    T *o_ = (T *)p[0];                              \
    for (int64_t i = 0; i < n; i++) o_[i * s] = v_; \
  } while (0)
  switch (c->esize) {
    case 1:
      FILL_AS(uint8_t);
      break;
    case 2:
      FILL_AS(uint16_t);
      break;
    case 4:
      FILL_AS(uint32_t);
      break;
    default:
      FILL_AS(uint64_t);
      break;
  }
#undef FILL_AS
}

weft_status weft_cpu_fill_(weft_tensor *t, double v) {
  fill_ctx c = {(int64_t)weft_dtype_size(t->dtype), {0}};
  weft_store_f_((char *)c.bytes, t->dtype, v);
  const weft_tensor *ops[1] = {t};
  weft_iter_ it;
  weft_iter_init_(&it, 1, ops);
  weft_iter_run_(&it, fill_row, &c);
  return WEFT_OK;
}

weft_status weft_tensor_fill(weft_tensor *t, double v) {
  WEFT_CHECK(check_tensor(__func__, t, "tensor"));
  weft_status st;
  const weft_tensor *ts[1] = {t};
  const char *names[1] = {"tensor"};
  const weft_backend *be =
      weft_backend_for_tensors_(__func__, offsetof(weft_backend, fill), 1, ts, names, &st);
  if (!be) return st;
  if (weft_tensor_numel(t) == 0) return WEFT_OK;
  return weft_backend_trace_(be->fill(t, v), be, __func__);
}

/* Byte address of t[index] (in t's device memory), or NULL with an error set. */
static char *element_at(const char *func, const weft_tensor *t, const int64_t *index) {
  if (check_tensor(func, t, "tensor") != WEFT_OK) return NULL;
  if (t->ndim > 0 && !index) {
    weft_error_at(WEFT_ERR_INVALID, func, "index is NULL for a %d-d tensor", t->ndim);
    return NULL;
  }
  int64_t off = 0;
  for (int d = 0; d < t->ndim; d++) {
    if (index[d] < 0 || index[d] >= t->shape[d]) {
      char desc[256];
      weft_tensor_describe(t, desc, sizeof desc);
      weft_error_at(WEFT_ERR_INVALID, func, "index %" PRId64 " out of range for dim %d of %s",
                    index[d], d, desc);
      return NULL;
    }
    off += index[d] * t->strides[d];
  }
  return (char *)t->data + off * (int64_t)weft_dtype_size(t->dtype);
}

double weft_tensor_get(const weft_tensor *t, const int64_t *index) {
  const char *p = element_at(__func__, t, index);
  if (!p) return NAN;
  if (t->device == WEFT_CPU) return weft_load_f_(p, t->dtype);
  unsigned char bytes[8];
  if (weft_memcpy(t->device, bytes, p, weft_dtype_size(t->dtype), WEFT_COPY_D2H) != WEFT_OK) {
    weft_error_trace(weft_last_status(), __func__);
    return NAN;
  }
  return weft_load_f_((const char *)bytes, t->dtype);
}

void weft_tensor_set(weft_tensor *t, const int64_t *index, double v) {
  char *p = element_at(__func__, t, index);
  if (!p) return;
  if (t->device == WEFT_CPU) {
    weft_store_f_(p, t->dtype, v);
    return;
  }
  unsigned char bytes[8];
  weft_store_f_((char *)bytes, t->dtype, v);
  if (weft_memcpy(t->device, p, bytes, weft_dtype_size(t->dtype), WEFT_COPY_H2D) != WEFT_OK)
    weft_error_trace(weft_last_status(), __func__);
}

typedef struct equal_ctx {
  size_t esize;
  bool equal;
} equal_ctx;

static void equal_row(char *const *p, const int64_t *st, int64_t n, void *vctx) {
  equal_ctx *c = vctx;
  if (!c->equal) return;
  const int64_t es = (int64_t)c->esize;
  if (st[0] == 1 && st[1] == 1) {
    if (memcmp(p[0], p[1], (size_t)n * c->esize) != 0) c->equal = false;
    return;
  }
  for (int64_t i = 0; i < n; i++)
    if (memcmp(p[0] + i * st[0] * es, p[1] + i * st[1] * es, c->esize) != 0) {
      c->equal = false;
      return;
    }
}

bool weft_tensor_equal(const weft_tensor *a, const weft_tensor *b) {
  if (!a || !b || a->dtype != b->dtype || !weft_tensor_same_shape(a, b)) return false;
  if (a->device != WEFT_CPU || b->device != WEFT_CPU) return false;
  const weft_tensor *ops[2] = {a, b};
  weft_iter_ it;
  weft_iter_init_(&it, 2, ops);
  equal_ctx c = {weft_dtype_size(a->dtype), true};
  weft_iter_run_(&it, equal_row, &c);
  return c.equal;
}
