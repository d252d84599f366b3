/* CPU elementwise kernels (add, mul, scale, div_scalar, axpy) and reductions (sum, sum of
 * squares, max; over a dim or over everything, accumulated in double): the
 * CPU table's members (weft_cpu_*_), called by kernels/ops.c's entry
 * points after their argument checks.
 *
 * Elementwise ops compute in the dtype's own precision for f32/f64 and in
 * f32 for bf16/f16 (round once to the dtype at the end), as torch does on
 * CPU. Contiguous f32 operands take a direct loop with no iterator and no
 * per-element dispatch: nn/ calls these in its hot path.
 */
#include <inttypes.h>
#include <math.h>
#include <string.h>

#include "backend_internal.h"
#include "cpu_internal.h"
#include "kernels.h"
#include "pool.h"
#include "tensor_internal.h"

/* --------------------------------------------------------- elementwise */

typedef enum { EW_ADD, EW_MUL, EW_SCALE, EW_DIV, EW_AXPY } ew_kind;

typedef struct ew_ctx {
  ew_kind kind;
  weft_dtype dt;
  double alpha;
} ew_ctx;

/* Operand order in rows: binary (out, a, b); scale, div (t); axpy (y, x). */
#define EW_LOOP(T, LOAD, STORE, CT, ALPHA)                    \
  do {                                                        \
    const CT al_ = (CT)(ALPHA);                               \
    T *o_ = (T *)p[0];                                        \
    const int64_t s0 = st[0];                                 \
    switch (c->kind) {                                        \
      case EW_ADD:                                            \
      case EW_MUL: {                                          \
        const T *a_ = (const T *)p[1], *b_ = (const T *)p[2]; \
        const int64_t s1 = st[1], s2 = st[2];                 \
        if (c->kind == EW_ADD)                                \
          for (int64_t i = 0; i < n; i++) {                   \
            CT x = LOAD(a_[i * s1]), y = LOAD(b_[i * s2]);    \
            o_[i * s0] = STORE(x + y);                        \
          }                                                   \
        else                                                  \
          for (int64_t i = 0; i < n; i++) {                   \
            CT x = LOAD(a_[i * s1]), y = LOAD(b_[i * s2]);    \
            o_[i * s0] = STORE(x * y);                        \
          }                                                   \
        break;                                                \
      }                                                       \
      case EW_SCALE:                                          \
        for (int64_t i = 0; i < n; i++) {                     \
          CT x = LOAD(o_[i * s0]);                            \
          o_[i * s0] = STORE(x * al_);                        \
        }                                                     \
        break;                                                \
      case EW_DIV:                                            \
        for (int64_t i = 0; i < n; i++) {                     \
          CT x = LOAD(o_[i * s0]);                            \
          o_[i * s0] = STORE(x / al_);                        \
        }                                                     \
        break;                                                \
      case EW_AXPY: {                                         \
        const T *x_ = (const T *)p[1];                        \
        const int64_t s1 = st[1];                             \
        for (int64_t i = 0; i < n; i++) {                     \
          CT y = LOAD(o_[i * s0]), x = LOAD(x_[i * s1]);      \
          o_[i * s0] = STORE(y + al_ * x);                    \
        }                                                     \
        break;                                                \
      }                                                       \
    }                                                         \
  } while (0)

#define ID_(x) (x)
#define TO_BF16_(x) weft_f32_to_bf16_i_(x)
#define TO_F16_(x) weft_f32_to_f16_i_(x)

static void ew_row(char *const *p, const int64_t *st, int64_t n, void *vctx) {
  const ew_ctx *c = vctx;
  switch (c->dt) {
    case WEFT_F32:
      EW_LOOP(float, ID_, ID_, float, c->alpha);
      break;
    case WEFT_F64:
      EW_LOOP(double, ID_, ID_, double, c->alpha);
      break;
    case WEFT_BF16:
      EW_LOOP(uint16_t, weft_bf16_to_f32_i_, TO_BF16_, float, c->alpha);
      break;
    case WEFT_F16:
      EW_LOOP(uint16_t, weft_f16_to_f32_i_, TO_F16_, float, c->alpha);
      break;
    default:
      break;
  }
}

static void ew_run(ew_kind kind, double alpha, int nops, const weft_tensor *const *ops) {
  weft_iter_ it;
  weft_iter_init_(&it, nops, ops);
  ew_ctx c = {kind, ops[0]->dtype, alpha};
  weft_iter_run_(&it, ew_row, &c);
}

/* Contiguous f32 loops written with GCC/Clang vector extensions (8 floats per
 * step as two 4-lane vectors): gcc 12 at -O2 does not vectorise plain loops
 * with unknown trip counts. Each lane does the same IEEE operation as the
 * scalar tail, so results are bitwise those of the scalar loop. Loads and
 * stores go through memcpy (unaligned-safe); out may alias an input at the
 * same index because every step loads before it stores. */
typedef float v4f __attribute__((vector_size(16)));

static inline v4f v4_load(const float *p) {
  v4f v;
  memcpy(&v, p, sizeof v);
  return v;
}
static inline void v4_store(float *p, v4f v) { memcpy(p, &v, sizeof v); }

static void f32_add(float *o, const float *x, const float *y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    v4f a0 = v4_load(x + i) + v4_load(y + i), a1 = v4_load(x + i + 4) + v4_load(y + i + 4);
    v4_store(o + i, a0);
    v4_store(o + i + 4, a1);
  }
  for (; i < n; i++) o[i] = x[i] + y[i];
}

static void f32_mul(float *o, const float *x, const float *y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    v4f a0 = v4_load(x + i) * v4_load(y + i), a1 = v4_load(x + i + 4) * v4_load(y + i + 4);
    v4_store(o + i, a0);
    v4_store(o + i + 4, a1);
  }
  for (; i < n; i++) o[i] = x[i] * y[i];
}

static void f32_scale(float *x, float al, int64_t n) {
  const v4f va = {al, al, al, al};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    v4_store(x + i, v4_load(x + i) * va);
    v4_store(x + i + 4, v4_load(x + i + 4) * va);
  }
  for (; i < n; i++) x[i] *= al;
}

static void f32_axpy(float *y, float al, const float *x, int64_t n) {
  const v4f va = {al, al, al, al};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    v4_store(y + i, v4_load(y + i) + va * v4_load(x + i));
    v4_store(y + i + 4, v4_load(y + i + 4) + va * v4_load(x + i + 4));
  }
  for (; i < n; i++) y[i] += al * x[i];
}

/* The contiguous f32 loops over fixed chunks on the CPU threads (pool.h):
 * each element is computed as in the serial loop. */
typedef struct f32_args {
  ew_kind kind;
  float *o;
  const float *x, *y;
  float al;
} f32_args;

static void f32_span(void *ctx, int64_t lo, int64_t hi) {
  const f32_args *a = ctx;
  switch (a->kind) {
    case EW_ADD:
      f32_add(a->o + lo, a->x + lo, a->y + lo, hi - lo);
      break;
    case EW_MUL:
      f32_mul(a->o + lo, a->x + lo, a->y + lo, hi - lo);
      break;
    case EW_SCALE:
      f32_scale(a->o + lo, a->al, hi - lo);
      break;
    case EW_AXPY:
      f32_axpy(a->o + lo, a->al, a->x + lo, hi - lo);
      break;
    default:
      break;
  }
}

static void f32_run(ew_kind kind, float *o, const float *x, const float *y, float al, int64_t n) {
  f32_args a = {kind, o, x, y, al};
  weft_cpu_par_range_(n, WEFT_CPU_GRAIN, f32_span, &a);
}

/* Contiguous bf16: the f32 loops above on tiles that weft_cpu_tiled_
 * widens (exact) and rounds once: the bits of the scalar bf16 loop
 * (ew_row), vectorised and split over the CPU threads. */
typedef struct bf16_args {
  ew_kind kind;
  float al;
} bf16_args;

static void bf16_tile(void *ctx, int64_t at, int64_t m, float *const *o, const float *const *in) {
  (void)at;
  const bf16_args *a = ctx;
  if (a->kind == EW_SCALE)
    f32_scale(o[0], a->al, m); /* o[0] holds t's widened values (read_out) */
  else if (a->kind == EW_ADD)
    f32_add(o[0], in[0], in[1], m);
  else
    f32_mul(o[0], in[0], in[1], m);
}

static bool all_contig(weft_dtype dt, int nops, const weft_tensor *const *ops) {
  for (int i = 0; i < nops; i++)
    if (ops[i]->dtype != dt || !weft_tensor_is_contiguous(ops[i])) return false;
  return true;
}

static weft_status binary_cpu(ew_kind kind, weft_tensor *out, const weft_tensor *a,
                              const weft_tensor *b) {
  const weft_tensor *ops[3] = {out, a, b};
  if (all_contig(WEFT_F32, 3, ops)) {
    f32_run(kind, out->data, a->data, b->data, 0.0f, weft_tensor_numel(out));
    return WEFT_OK;
  }
  if (all_contig(WEFT_BF16, 3, ops)) {
    bf16_args g = {kind, 0.0f};
    void *o = out->data;
    const void *in[2] = {a->data, b->data};
    weft_cpu_tiled_(WEFT_BF16, weft_tensor_numel(out), 1, &o, false, 2, in, bf16_tile, &g);
    return WEFT_OK;
  }
  ew_run(kind, 0.0, 3, ops);
  return WEFT_OK;
}

weft_status weft_cpu_add_(weft_tensor *out, const weft_tensor *a, const weft_tensor *b) {
  return binary_cpu(EW_ADD, out, a, b);
}

weft_status weft_cpu_mul_(weft_tensor *out, const weft_tensor *a, const weft_tensor *b) {
  return binary_cpu(EW_MUL, out, a, b);
}

weft_status weft_cpu_scale_(weft_tensor *t, double alpha) {
  const weft_tensor *ops[1] = {t};
  if (all_contig(WEFT_F32, 1, ops)) {
    f32_run(EW_SCALE, t->data, NULL, NULL, (float)alpha, weft_tensor_numel(t));
    return WEFT_OK;
  }
  if (all_contig(WEFT_BF16, 1, ops)) {
    bf16_args g = {EW_SCALE, (float)alpha};
    void *o = t->data;
    weft_cpu_tiled_(WEFT_BF16, weft_tensor_numel(t), 1, &o, true, 0, NULL, bf16_tile, &g);
    return WEFT_OK;
  }
  ew_run(EW_SCALE, alpha, 1, ops);
  return WEFT_OK;
}

weft_status weft_cpu_div_scalar_(weft_tensor *t, double divisor) {
  const weft_tensor *ops[1] = {t};
  ew_run(EW_DIV, divisor, 1, ops);
  return WEFT_OK;
}

weft_status weft_cpu_axpy_(weft_tensor *y, double alpha, const weft_tensor *x) {
  const weft_tensor *ops[2] = {y, x};
  if (all_contig(WEFT_F32, 2, ops)) {
    f32_run(EW_AXPY, y->data, x->data, NULL, (float)alpha, weft_tensor_numel(y));
    return WEFT_OK;
  }
  ew_run(EW_AXPY, alpha, 2, ops);
  return WEFT_OK;
}

/* ---------------------------------------------------------- reductions */

/* acc over n elements at p, step s (elements). max propagates NaN as torch. */
static inline double reduce_span(const char *p, int64_t n, int64_t s, weft_dtype dt,
                                 weft_reduce_kind kind, double acc) {
  if (dt == WEFT_F32) {
    const float *x = (const float *)p;
    switch (kind) {
      case WEFT_REDUCE_SUM:
        for (int64_t i = 0; i < n; i++) acc += x[i * s];
        return acc;
      case WEFT_REDUCE_SUMSQ:
        for (int64_t i = 0; i < n; i++) {
          double v = x[i * s];
          acc += v * v;
        }
        return acc;
      case WEFT_REDUCE_MAX:
        for (int64_t i = 0; i < n; i++) {
          double v = x[i * s];
          if (v != v) return v;
          if (v > acc) acc = v;
        }
        return acc;
    }
    return acc;
  }
  const int64_t es = (int64_t)weft_dtype_size(dt);
  for (int64_t i = 0; i < n; i++) {
    double v = weft_load_f_(p + i * s * es, dt);
    switch (kind) {
      case WEFT_REDUCE_SUM:
        acc += v;
        break;
      case WEFT_REDUCE_SUMSQ:
        acc += v * v;
        break;
      case WEFT_REDUCE_MAX:
        if (v != v) return v;
        if (v > acc) acc = v;
        break;
    }
  }
  return acc;
}

static double reduce_init(weft_reduce_kind kind) {
  return kind == WEFT_REDUCE_MAX ? -INFINITY : 0.0;
}

typedef struct red_all_ctx {
  weft_reduce_kind kind;
  weft_dtype dt;
  double acc;
} red_all_ctx;

static void red_all_row(char *const *p, const int64_t *st, int64_t n, void *vctx) {
  red_all_ctx *c = vctx;
  if (c->kind == WEFT_REDUCE_MAX && c->acc != c->acc) return; /* NaN already */
  c->acc = reduce_span(p[0], n, st[0], c->dt, c->kind, c->acc);
}

weft_status weft_cpu_reduce_all_(const weft_tensor *t, weft_reduce_kind kind, double *out) {
  if (t->dtype == WEFT_F32 && weft_tensor_is_contiguous(t)) {
    *out = reduce_span(t->data, weft_tensor_numel(t), 1, WEFT_F32, kind, reduce_init(kind));
    return WEFT_OK;
  }
  const weft_tensor *ops[1] = {t};
  weft_iter_ it;
  weft_iter_init_(&it, 1, ops);
  red_all_ctx c = {kind, t->dtype, reduce_init(kind)};
  weft_iter_run_(&it, red_all_row, &c);
  *out = c.acc;
  return WEFT_OK;
}

typedef struct red_dim_ctx {
  weft_reduce_kind kind;
  weft_dtype dt;
  int64_t len, stride; /* the reduced dim of the input */
} red_dim_ctx;

/* Rows over (out, input with the reduced dim narrowed to 1). */
static void red_dim_row(char *const *p, const int64_t *st, int64_t n, void *vctx) {
  const red_dim_ctx *c = vctx;
  const int64_t es = (int64_t)weft_dtype_size(c->dt);
  for (int64_t i = 0; i < n; i++) {
    double acc =
        reduce_span(p[1] + i * st[1] * es, c->len, c->stride, c->dt, c->kind, reduce_init(c->kind));
    weft_store_f_(p[0] + i * st[0] * es, c->dt, acc);
  }
}

/* Contiguous f32, bf16 or f16 in and out (of one dtype), viewed as x (outer, len, inner) -> out
 * (outer, inner): out[o, i] = reduce over l of x[o, l, i] (16-bit elements widened as they are
 * read, the result stored as weft_store_f_ stores it). Items are (o, block of RED_COLS columns of
 * inner), or (o) when inner is 1, on the CPU threads in fixed chunks (pool.h); each output
 * accumulates in double over l in order, as reduce_span does, so the bits are those of the strided
 * loop on any thread count, and the rows of a block are read contiguously (a bias gradient's column
 * sums no longer stride by C). */
#define RED_COLS 64

typedef struct red_fast {
  weft_reduce_kind kind;
  weft_dtype dt, odt; /* the input's and the output's */
  const char *x;
  char *out;
  int64_t len, inner, nblocks;
} red_fast;

static void red_fast_rows(void *ctx, int64_t lo, int64_t hi) { /* inner == 1 */
  const red_fast *r = ctx;
  const size_t es = weft_dtype_size(r->dt), oes = weft_dtype_size(r->odt);
  for (int64_t o = lo; o < hi; o++)
    weft_store_f_(r->out + (size_t)o * oes, r->odt,
                  reduce_span(r->x + (size_t)(o * r->len) * es, r->len, 1, r->dt, r->kind,
                              reduce_init(r->kind)));
}

static void red_fast_blocks(void *ctx, int64_t lo, int64_t hi) {
  const red_fast *r = ctx;
  for (int64_t it = lo; it < hi; it++) {
    const int64_t o = it / r->nblocks, c0 = (it % r->nblocks) * RED_COLS;
    const int64_t nc = r->inner - c0 < RED_COLS ? r->inner - c0 : RED_COLS;
    double acc[RED_COLS];
    float wide[RED_COLS];
    for (int64_t j = 0; j < nc; j++) acc[j] = reduce_init(r->kind);
    const size_t es = weft_dtype_size(r->dt);
    const char *xl = r->x + (size_t)(o * r->len * r->inner + c0) * es;
    for (int64_t l = 0; l < r->len; l++, xl += (size_t)r->inner * es) {
      const float *x = (const float *)xl;
      if (r->dt != WEFT_F32) {
        weft_cpu_to_f32_(wide, xl, r->dt, nc);
        x = wide;
      }
      switch (r->kind) {
        case WEFT_REDUCE_SUM:
          for (int64_t j = 0; j < nc; j++) acc[j] += x[j];
          break;
        case WEFT_REDUCE_SUMSQ:
          for (int64_t j = 0; j < nc; j++) {
            const double v = x[j];
            acc[j] += v * v;
          }
          break;
        case WEFT_REDUCE_MAX: /* NaN sticks, as in reduce_span */
          for (int64_t j = 0; j < nc; j++) {
            const double v = x[j];
            if (acc[j] != acc[j]) continue;
            if (v != v || v > acc[j]) acc[j] = v;
          }
          break;
      }
    }
    const size_t oes = weft_dtype_size(r->odt);
    for (int64_t j = 0; j < nc; j++)
      weft_store_f_(r->out + (size_t)(o * r->inner + c0 + j) * oes, r->odt, acc[j]);
  }
}

weft_status weft_cpu_reduce_(const weft_tensor *t, weft_reduce_kind kind, int d, weft_tensor *out) {
  const bool storage = t->dtype == WEFT_F32 || t->dtype == WEFT_BF16 || t->dtype == WEFT_F16;
  if (storage && out->dtype == t->dtype && weft_tensor_is_contiguous(t) &&
      weft_tensor_is_contiguous(out) && t->ndim > 0) {
    red_fast r = {kind, t->dtype, out->dtype, t->data, out->data, t->shape[d], 1, 0};
    int64_t outer = 1;
    for (int e = 0; e < d; e++) outer *= t->shape[e];
    for (int e = d + 1; e < t->ndim; e++) r.inner *= t->shape[e];
    if (r.inner == 1) {
      weft_cpu_par_range_(outer, weft_cpu_row_grain_(r.len), red_fast_rows, &r);
    } else {
      r.nblocks = (r.inner + RED_COLS - 1) / RED_COLS;
      /* an item reads len x RED_COLS floats */
      weft_cpu_par_range_(outer * r.nblocks, weft_cpu_row_grain_(r.len * RED_COLS), red_fast_blocks,
                          &r);
    }
    return WEFT_OK;
  }
  weft_tensor in = *t; /* input with the reduced dim narrowed to 1 */
  in.base_ = NULL;
  if (t->ndim == 0) {
    in.ndim = 1;
    in.shape[0] = 1;
    in.strides[0] = 1;
  }
  const int64_t len = in.shape[d], stride = in.strides[d];
  in.shape[d] = 1;
  weft_tensor ov = *out;
  ov.base_ = NULL;
  if (out->ndim == 0) {
    ov.ndim = 1;
    ov.shape[0] = 1;
    ov.strides[0] = 1;
  }
  const weft_tensor *ops[2] = {&ov, &in};
  weft_iter_ it;
  weft_iter_init_(&it, 2, ops);
  red_dim_ctx c = {kind, t->dtype, len, stride};
  weft_iter_run_(&it, red_dim_row, &c);
  return WEFT_OK;
}
