/* kernels/cpu/rmsnorm.c — CPU fp32 RMSNorm (layers.h), forward and
 * backward, one row at a time on 4-float vectors (simd.h): the row's sum
 * of squares and backward's sum of g * x accumulate in double, the rest is
 * fp32 with a scalar loop for the last C % 4 columns. Rows go to the CPU
 * threads in fixed chunks (pool.h); backward reads each row once and keeps
 * per chunk the partial column sums of dweight in double, added in chunk
 * order, so the bits do not depend on the thread count. (LayerNorm, the
 * other norm, is in norm_act.c.) */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "arg_checks.h"
#include "cpu_internal.h"
#include "layers.h"
#include "pool.h"
#include "simd.h"

/* Errors name the operation, as every backend's do (arg_checks.h):
 * "rmsnorm_forward: ...", not the C function. */
#undef weft_error
#define weft_error(st, ...) weft_error_at((st), weft_op_name_(__func__), __VA_ARGS__)

typedef struct rms_args {
  float *out, *rstd, *dinp;
  double *part; /* backward: chunk k's C partial sums of dout * inp * rstd at k * C */
  const float *inp, *weight, *dout, *rstd_in;
  int64_t C, grain;
  float eps;
  bool accumulate;
} rms_args;

/* Rows [lo, hi), xr and yr pointing at row lo. */
static void rms_forward_rows_at(const rms_args *a, int64_t lo, int64_t hi, const float *xr,
                                float *yr) {
  const int64_t C = a->C;
  for (int64_t n = lo; n < hi; n++) {
    const float *x = xr + (n - lo) * C;
    const double ss = row_dot_d(x, x, C); /* the sum of squares, in double */
    float r = (float)(1.0 / sqrt(ss / (double)C + (double)a->eps));
    a->rstd[n] = r;
    float *y = yr + (n - lo) * C;
    const vf4 vr = vset(r);
    int64_t c = 0;
    for (; c + VL <= C; c += VL) vstore(y + c, vload(x + c) * vr * vload(a->weight + c));
    for (; c < C; c++) y[c] = x[c] * r * a->weight[c];
  }
}

static void rms_forward_rows(void *ctx, int64_t lo, int64_t hi) {
  const rms_args *a = ctx;
  rms_forward_rows_at(a, lo, hi, a->inp + lo * a->C, a->out + lo * a->C);
}

weft_status weft_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight,
                                 int64_t N, int64_t C, float eps) {
  WEFT_RETURN_IF_BAD_(
      weft_check_rmsnorm_forward_(weft_op_name_(__func__), out, rstd, inp, weight, N, C, eps));
  rms_args a = {.out = out, .rstd = rstd, .inp = inp, .weight = weight, .C = C, .eps = eps};
  weft_cpu_par_range_(N, weft_cpu_row_grain_(C), rms_forward_rows, &a);
  return WEFT_OK;
}

/* Backward of rows [lo, hi), one chunk: dinp, and the chunk's partial
 * column sums of dout * inp * rstd (the product in fp32, summed in double). */
static void rms_backward_rows_at(const rms_args *a, int64_t lo, int64_t hi, const float *xr,
                                 const float *dyr, float *dxr) {
  const int64_t C = a->C;
  const float *weight = a->weight;
  double *pw = a->part + (lo / a->grain) * C;
  memset(pw, 0, sizeof(double) * (size_t)C);
  for (int64_t n = lo; n < hi; n++) {
    const float *x = xr + (n - lo) * C, *dy = dyr + (n - lo) * C;
    float *dx = dxr + (n - lo) * C;
    float r = a->rstd_in[n];
    const vf4 vr = vset(r);
    vd2 lo2 = {0}, hi2 = {0}; /* sum_j g_j x_j with g = dy * w */
    int64_t c = 0;
    for (; c + VL <= C; c += VL) {
      vf4 xv = vload(x + c), dyv = vload(dy + c);
      vf4 g = dyv * vload(weight + c);
      lo2 += vlo_d(g) * vlo_d(xv);
      hi2 += vhi_d(g) * vhi_d(xv);
      const vf4 p = dyv * xv * vr;
      dstore(pw + c, dload(pw + c) + vlo_d(p));
      dstore(pw + c + 2, dload(pw + c + 2) + vhi_d(p));
    }
    double gx = hsum_d(lo2, hi2);
    for (; c < C; c++) {
      gx += (double)(dy[c] * weight[c]) * x[c];
      pw[c] += dy[c] * x[c] * r;
    }
    float k = (float)(gx / (double)C) * r * r;
    const vf4 vk = vset(k);
    c = 0;
    if (a->accumulate) {
      for (; c + VL <= C; c += VL)
        vstore(dx + c,
               vload(dx + c) + vr * (vload(dy + c) * vload(weight + c) - vload(x + c) * vk));
      for (; c < C; c++) dx[c] += r * (dy[c] * weight[c] - x[c] * k);
    } else {
      for (; c + VL <= C; c += VL)
        vstore(dx + c, vr * (vload(dy + c) * vload(weight + c) - vload(x + c) * vk));
      for (; c < C; c++) dx[c] = r * (dy[c] * weight[c] - x[c] * k);
    }
  }
}

static void rms_backward_rows(void *ctx, int64_t lo, int64_t hi) {
  const rms_args *a = ctx;
  rms_backward_rows_at(a, lo, hi, a->inp + lo * a->C, a->dout + lo * a->C, a->dinp + lo * a->C);
}

weft_status weft_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                                  const float *weight, const float *rstd, int64_t N, int64_t C,
                                  bool accumulate_dinp) {
  WEFT_RETURN_IF_BAD_(weft_check_rmsnorm_backward_(weft_op_name_(__func__), dinp, dweight, dout,
                                                   inp, weight, rstd, N, C));
  if (N == 0) return WEFT_OK;
  rms_args a = {.dinp = dinp,
                .inp = inp,
                .weight = weight,
                .dout = dout,
                .rstd_in = rstd,
                .C = C,
                .accumulate = accumulate_dinp};
  a.grain = weft_cpu_partial_grain_(N, C);
  const int64_t nchunks = (N + a.grain - 1) / a.grain;
  WEFT_CHECK(weft_cpu_partials_get_(nchunks * C, &a.part));
  weft_cpu_par_range_(N, a.grain, rms_backward_rows, &a);
  weft_cpu_add_partials_(dweight, a.part, nchunks, C);
  weft_cpu_partials_put_(a.part);
  return WEFT_OK;
}

/* bf16 / f16 (backend.h rmsnorm_forward_dt): the f32 rows above on the
 * chunks weft_cpu_rows_dt_ widens (the same chunks: the same partials);
 * the weight widened once per call. */
static void rms_dt_forward_rows(void *ctx, int64_t lo, int64_t hi, float *const *o,
                                const float *const *in) {
  rms_forward_rows_at(ctx, lo, hi, in[0], o[0]);
}

static void rms_dt_backward_rows(void *ctx, int64_t lo, int64_t hi, float *const *o,
                                 const float *const *in) {
  rms_backward_rows_at(ctx, lo, hi, in[0], in[1], o[0]);
}

weft_status weft_cpu_rmsnorm_forward_dt_(weft_dtype dt, void *out, float *rstd, const void *inp,
                                         const void *weight, int64_t N, int64_t C, float eps) {
  const char *op = "rmsnorm_forward_dt";
  WEFT_CHECK_STORAGE_DT_(op, dt);
  if (dt == WEFT_F32) return weft_rmsnorm_forward(out, rstd, inp, weight, N, C, eps);
  WEFT_RETURN_IF_BAD_(weft_check_rmsnorm_forward_(op, out, rstd, inp, weight, N, C, eps));
  float *w;
  WEFT_CHECK(weft_cpu_widened_copy_(op, dt, weight, C, &w));
  rms_args a = {.rstd = rstd, .weight = w, .C = C, .eps = eps};
  weft_status st = weft_cpu_rows_dt_(op, dt, N, C, weft_cpu_row_grain_(C), 1, &out, false, 1, &inp,
                                     rms_dt_forward_rows, &a);
  free(w);
  return st;
}

weft_status weft_cpu_rmsnorm_backward_dt_(weft_dtype dt, void *dinp, float *dweight,
                                          const void *dout, const void *inp, const void *weight,
                                          const float *rstd, int64_t N, int64_t C,
                                          bool accumulate_dinp) {
  const char *op = "rmsnorm_backward_dt";
  WEFT_CHECK_STORAGE_DT_(op, dt);
  if (dt == WEFT_F32)
    return weft_rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, N, C, accumulate_dinp);
  WEFT_RETURN_IF_BAD_(
      weft_check_rmsnorm_backward_(op, dinp, dweight, dout, inp, weight, rstd, N, C));
  if (N == 0) return WEFT_OK;
  float *w;
  WEFT_CHECK(weft_cpu_widened_copy_(op, dt, weight, C, &w));
  rms_args a = {.weight = w, .rstd_in = rstd, .C = C, .accumulate = accumulate_dinp};
  a.grain = weft_cpu_partial_grain_(N, C);
  const int64_t nchunks = (N + a.grain - 1) / a.grain;
  weft_status st = weft_cpu_partials_get_(nchunks * C, &a.part);
  if (st == WEFT_OK) {
    const void *in[2] = {inp, dout};
    st = weft_cpu_rows_dt_(op, dt, N, C, a.grain, 1, &dinp, accumulate_dinp, 2, in,
                           rms_dt_backward_rows, &a);
    if (st == WEFT_OK) weft_cpu_add_partials_(dweight, a.part, nchunks, C);
    weft_cpu_partials_put_(a.part);
  }
  free(w);
  return st;
}
