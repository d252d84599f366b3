/* kernels/cpu/rmsnorm.c — CPU fp32 RMSNorm (layers.h), forward and
 * backward, one row at a time on 4-float vectors (simd.h): the row's sum
 * of squares and backward's sum of g * x accumulate in double, the rest is
 * fp32 with a scalar loop for the last C % 4 columns. (LayerNorm, the
 * other norm, is in norm_act.c.) */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#include "arg_checks.h"
#include "layers.h"
#include "simd.h"

/* Errors name the operation, as every backend's do (arg_checks.h):
 * "rmsnorm_forward: ...", not the C function. */
#undef weft_error
#define weft_error(st, ...) weft_error_at((st), weft_op_name_(__func__), __VA_ARGS__)

weft_status weft_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight,
                                 int64_t N, int64_t C, float eps) {
  WEFT_RETURN_IF_BAD_(
      weft_check_rmsnorm_forward_(weft_op_name_(__func__), out, rstd, inp, weight, N, C, eps));
  for (int64_t n = 0; n < N; n++) {
    const float *x = inp + n * C;
    const double ss = row_dot_d(x, x, C); /* the sum of squares, in double */
    float r = (float)(1.0 / sqrt(ss / (double)C + (double)eps));
    rstd[n] = r;
    float *y = out + n * C;
    const vf4 vr = vset(r);
    int64_t c = 0;
    for (; c + VL <= C; c += VL) vstore(y + c, vload(x + c) * vr * vload(weight + c));
    for (; c < C; c++) y[c] = x[c] * r * weight[c];
  }
  return WEFT_OK;
}

weft_status weft_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                                  const float *weight, const float *rstd, int64_t N, int64_t C,
                                  bool accumulate_dinp) {
  CHECK_SIZES(N, C);
  CHECK_PTR(dinp, N * C);
  CHECK_PTR(dweight, C);
  CHECK_PTR(dout, N * C);
  CHECK_PTR(inp, N * C);
  CHECK_PTR(weight, C);
  CHECK_PTR(rstd, N);
  for (int64_t n = 0; n < N; n++) {
    const float *x = inp + n * C, *dy = dout + n * C;
    float *dx = dinp + n * C;
    float r = rstd[n];
    const vf4 vr = vset(r);
    vd2 lo = {0}, hi = {0}; /* sum_j g_j x_j with g = dy * w */
    int64_t c = 0;
    for (; c + VL <= C; c += VL) {
      vf4 xv = vload(x + c), dyv = vload(dy + c);
      vf4 g = dyv * vload(weight + c);
      lo += vlo_d(g) * vlo_d(xv);
      hi += vhi_d(g) * vhi_d(xv);
      vstore(dweight + c, vload(dweight + c) + dyv * xv * vr);
    }
    double gx = hsum_d(lo, hi);
    for (; c < C; c++) {
      gx += (double)(dy[c] * weight[c]) * x[c];
      dweight[c] += dy[c] * x[c] * r;
    }
    float k = (float)(gx / (double)C) * r * r;
    const vf4 vk = vset(k);
    c = 0;
    if (accumulate_dinp) {
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
  return WEFT_OK;
}
