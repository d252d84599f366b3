/* kernels/cpu/rope.c — CPU fp32 rotary position embeddings (layers.h): the
 * cos/sin tables (computed in double, rounded once) and the rotation of
 * interleaved pairs, forward and backward (the transpose: the same loop
 * with the sine negated), two pairs per 4-float vector. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "arg_checks.h"
#include "cpu_internal.h"
#include "layers.h"
#include "simd.h"

/* Errors name the operation, as every backend's do (arg_checks.h):
 * "rope_tables: ...", not the C function. */
#undef weft_error
#define weft_error(st, ...) weft_error_at((st), weft_op_name_(__func__), __VA_ARGS__)

weft_status weft_rope_tables(float *cosb, float *sinb, int64_t max_pos, int64_t hd, double theta) {
  CHECK_SIZES(max_pos, hd);
  if (hd == 0 || hd % 2 != 0)
    return weft_error(WEFT_ERR_INVALID, "head dim %lld must be even and > 0", (long long)hd);
  if (!(theta > 0.0)) return weft_error(WEFT_ERR_INVALID, "theta = %g must be > 0", theta);
  CHECK_PTR(cosb, max_pos * hd / 2);
  CHECK_PTR(sinb, max_pos * hd / 2);
  int64_t half = hd / 2;
  for (int64_t j = 0; j < half; j++) {
    double freq = pow(theta, -2.0 * (double)j / (double)hd);
    for (int64_t p = 0; p < max_pos; p++) {
      double a = (double)p * freq;
      cosb[p * half + j] = (float)cos(a);
      sinb[p * half + j] = (float)sin(a);
    }
  }
  return WEFT_OK;
}

/* The NH heads of one (b, t) row: y = the rotation of x by the position's
 * cos cp / sin sp (sign -1: the transpose). */
static void rope_row(float *y, const float *x, const float *cp, const float *sp, int64_t NH,
                     int64_t half, float sign) {
  const int64_t hd = 2 * half;
  for (int64_t h = 0; h < NH; h++, x += hd, y += hd) {
    int64_t j = 0;
    /* two pairs per vector: y = x * (c0 c0 c1 c1) + swap(x) * (-s0 s0 -s1 s1),
     * the same products and sums as the scalar form below */
    const vf4 sg = {-sign, sign, -sign, sign};
    for (; j + 2 <= half; j += 2) {
      vf4 xv = vload(x + 2 * j);
      vf4 cv = {cp[j], cp[j], cp[j + 1], cp[j + 1]};
      vf4 sv = (vf4){sp[j], sp[j], sp[j + 1], sp[j + 1]} * sg;
      vf4 sw = __builtin_shufflevector(xv, xv, 1, 0, 3, 2);
      vstore(y + 2 * j, xv * cv + sw * sv);
    }
    for (; j < half; j++) {
      float c = cp[j], s = sign * sp[j];
      float x0 = x[2 * j], x1 = x[2 * j + 1];
      y[2 * j] = x0 * c - x1 * s;
      y[2 * j + 1] = x0 * s + x1 * c;
    }
  }
}

/* Shared by forward (sign = +1) and backward (sign = -1, the transpose);
 * out and inp of dtype dt (bf16 / f16: each (b, t) row widened, rotated as
 * in f32 and rounded once; out may be inp). */
static weft_status rope_apply(const char *op, weft_dtype dt, void *out, const void *inp,
                              const float *cosb, const float *sinb, int64_t max_pos, int64_t B,
                              int64_t T, int64_t NH, int64_t hd, int64_t pos0, float sign) {
  CHECK_SIZES_AT(op, max_pos, B, T, NH, hd, pos0);
  if (hd == 0 || hd % 2 != 0)
    return weft_error_at(WEFT_ERR_INVALID, op, "head dim %lld must be even and > 0", (long long)hd);
  if (pos0 + T > max_pos)
    return weft_error_at(WEFT_ERR_INVALID, op,
                         "positions [%lld, %lld) run past the tables' %lld rows", (long long)pos0,
                         (long long)(pos0 + T), (long long)max_pos);
  int64_t n = B * T * NH * hd;
  CHECK_PTR_AT(op, out, n);
  CHECK_PTR_AT(op, inp, n);
  CHECK_PTR_AT(op, cosb, (pos0 + T) * hd / 2);
  CHECK_PTR_AT(op, sinb, (pos0 + T) * hd / 2);
  const int64_t half = hd / 2, row = NH * hd;
  float *wide = NULL;
  if (dt != WEFT_F32 && n > 0) {
    wide = malloc(sizeof(float) * 2 * (size_t)row);
    if (!wide)
      return weft_error_at(WEFT_ERR_OOM, op, "no memory for a row of %lld floats", (long long)row);
  }
  const size_t es = weft_dtype_size(dt);
  for (int64_t b = 0; b < B; b++)
    for (int64_t t = 0; t < T; t++) {
      const float *cp = cosb + (pos0 + t) * half, *sp = sinb + (pos0 + t) * half;
      const size_t at = (size_t)((b * T + t) * row) * es;
      if (!wide) {
        rope_row((float *)((char *)out + at), (const float *)((const char *)inp + at), cp, sp, NH,
                 half, sign);
        continue;
      }
      weft_cpu_to_f32_(wide, (const char *)inp + at, dt, row);
      rope_row(wide + row, wide, cp, sp, NH, half, sign);
      weft_cpu_from_f32_((char *)out + at, dt, wide + row, row);
    }
  free(wide);
  return WEFT_OK;
}

weft_status weft_rope_forward(float *out, const float *inp, const float *cosb, const float *sinb,
                              int64_t max_pos, int64_t B, int64_t T, int64_t NH, int64_t hd,
                              int64_t pos0) {
  WEFT_CHECK(rope_apply("rope_forward", WEFT_F32, out, inp, cosb, sinb, max_pos, B, T, NH, hd, pos0,
                        1.0f));
  return WEFT_OK;
}

weft_status weft_rope_backward(float *dinp, const float *dout, const float *cosb, const float *sinb,
                               int64_t max_pos, int64_t B, int64_t T, int64_t NH, int64_t hd,
                               int64_t pos0) {
  WEFT_CHECK(rope_apply("rope_backward", WEFT_F32, dinp, dout, cosb, sinb, max_pos, B, T, NH, hd,
                        pos0, -1.0f));
  return WEFT_OK;
}

/* bf16 / f16 (backend.h rope_forward_dt / rope_backward_dt) */
weft_status weft_cpu_rope_forward_dt_(weft_dtype dt, void *out, const void *inp, const float *cosb,
                                      const float *sinb, int64_t max_pos, int64_t B, int64_t T,
                                      int64_t NH, int64_t hd, int64_t pos0) {
  WEFT_CHECK_STORAGE_DT_("rope_forward_dt", dt);
  return rope_apply("rope_forward_dt", dt, out, inp, cosb, sinb, max_pos, B, T, NH, hd, pos0, 1.0f);
}

weft_status weft_cpu_rope_backward_dt_(weft_dtype dt, void *dinp, const void *dout,
                                       const float *cosb, const float *sinb, int64_t max_pos,
                                       int64_t B, int64_t T, int64_t NH, int64_t hd, int64_t pos0) {
  WEFT_CHECK_STORAGE_DT_("rope_backward_dt", dt);
  return rope_apply("rope_backward_dt", dt, dinp, dout, cosb, sinb, max_pos, B, T, NH, hd, pos0,
                    -1.0f);
}
