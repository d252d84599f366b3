/* CPU fp32 kernels added in backend version 2: LayerNorm, the pointwise
 * activations (GELU tanh / erf, ReLU, SiLU), softmax over the last dim and
 * inverted dropout. Shapes and formulas are documented in layers.h; the
 * argument checks are arg_checks.h's, shared with the device kernels
 * (kernels/cuda/norm_act.cu), so both reject the same inputs with the same
 * first line.
 *
 * Scalar loops, sequential and deterministic: row reductions (LayerNorm's
 * mean and variance, softmax sums) and the column sums of LayerNorm's
 * weight and bias gradients accumulate in double, in index order; the
 * elementwise arithmetic is fp32 with the float functions of <math.h>. No
 * allocation: the column sums run over blocks of COLS columns with their
 * double accumulators on the stack. */
#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "arg_checks.h"
#include "layers.h"

/* Errors name the operation ("layernorm_forward: ..."), not the C function. */
#define OP weft_op_name_(__func__)

/* Columns whose weight and bias gradients are summed together (a row
 * segment of COLS floats is read at a time). */
#define COLS 64

const char *weft_activation_name(weft_activation a) {
  switch (a) {
    case WEFT_ACT_GELU_TANH:
      return "gelu_tanh";
    case WEFT_ACT_GELU_ERF:
      return "gelu_erf";
    case WEFT_ACT_RELU:
      return "relu";
    case WEFT_ACT_SILU:
      return "silu";
    default:
      return "?";
  }
}

/* -------------------------------------------------------------- LayerNorm */

weft_status weft_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                                   const float *weight, const float *bias, int64_t N, int64_t C,
                                   float eps) {
  WEFT_CHECK_ARGS_(weft_check_layernorm_forward_(OP, out, mean, rstd, inp, N, C, eps));
  for (int64_t n = 0; n < N; n++) {
    const float *x = inp + n * C;
    double s = 0.0;
    for (int64_t c = 0; c < C; c++) s += x[c];
    const double m = s / (double)C;
    double v = 0.0;
    for (int64_t c = 0; c < C; c++) {
      const double d = (double)x[c] - m;
      v += d * d;
    }
    const float mf = (float)m, rf = (float)(1.0 / sqrt(v / (double)C + (double)eps));
    mean[n] = mf;
    rstd[n] = rf;
    float *y = out + n * C; /* may be x: each x[c] is read before y[c] is written */
    for (int64_t c = 0; c < C; c++) {
      const float h = (x[c] - mf) * rf;
      y[c] = h * (weight ? weight[c] : 1.0f) + (bias ? bias[c] : 0.0f);
    }
  }
  return WEFT_OK;
}

weft_status weft_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                                    const float *inp, const float *weight, const float *mean,
                                    const float *rstd, int64_t N, int64_t C, bool accumulate_dinp) {
  WEFT_CHECK_ARGS_(weft_check_layernorm_backward_(OP, dout, inp, mean, rstd, N, C));
  if (dinp) {
    for (int64_t n = 0; n < N; n++) {
      const float *x = inp + n * C, *dy = dout + n * C;
      const float m = mean[n], r = rstd[n];
      double sg = 0.0, sgx = 0.0; /* sum_j g_j, sum_j g_j xhat_j */
      for (int64_t c = 0; c < C; c++) {
        const float xh = (x[c] - m) * r, g = dy[c] * (weight ? weight[c] : 1.0f);
        sg += g;
        sgx += (double)g * xh;
      }
      const float a = (float)(sg / (double)C), b = (float)(sgx / (double)C);
      float *dx = dinp + n * C;
      for (int64_t c = 0; c < C; c++) {
        const float xh = (x[c] - m) * r, g = dy[c] * (weight ? weight[c] : 1.0f);
        const float d = r * (g - a - xh * b);
        dx[c] = accumulate_dinp ? dx[c] + d : d;
      }
    }
  }
  if (dweight || dbias) {
    for (int64_t c0 = 0; c0 < C; c0 += COLS) {
      const int64_t nc = C - c0 < COLS ? C - c0 : COLS;
      double sw[COLS] = {0}, sb[COLS] = {0};
      for (int64_t n = 0; n < N; n++) {
        const float *x = inp + n * C + c0, *dy = dout + n * C + c0;
        const float m = mean[n], r = rstd[n];
        for (int64_t j = 0; j < nc; j++) {
          sw[j] += (double)dy[j] * ((x[j] - m) * r);
          sb[j] += dy[j];
        }
      }
      for (int64_t j = 0; j < nc; j++) {
        if (dweight) dweight[c0 + j] = (float)((double)dweight[c0 + j] + sw[j]);
        if (dbias) dbias[c0 + j] = (float)((double)dbias[c0 + j] + sb[j]);
      }
    }
  }
  return WEFT_OK;
}

/* ------------------------------------------------------------- activations */

#define GELU_K 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_C 0.044715f
#define INV_SQRT2 0.7071067811865476f
#define INV_SQRT_2PI 0.3989422804014327f

static inline float act_value(weft_activation act, float x) {
  switch (act) {
    case WEFT_ACT_GELU_TANH:
      return 0.5f * x * (1.0f + tanhf(GELU_K * (x + GELU_C * x * x * x)));
    case WEFT_ACT_GELU_ERF:
      return 0.5f * x * (1.0f + erff(x * INV_SQRT2));
    case WEFT_ACT_RELU:
      return x > 0.0f ? x : (x != x ? x : 0.0f);
    default:
      return x / (1.0f + expf(-x)); /* silu (act checked) */
  }
}

/* act'(x) */
static inline float act_grad(weft_activation act, float x) {
  switch (act) {
    case WEFT_ACT_GELU_TANH: {
      const float t = tanhf(GELU_K * (x + GELU_C * x * x * x)), sech2 = 1.0f - t * t;
      /* sech2 is 0 for |x| > ~9: the second term is 0 (x^2 may be inf) */
      const float d2 =
          sech2 == 0.0f ? 0.0f : 0.5f * x * sech2 * GELU_K * (1.0f + 3.0f * GELU_C * x * x);
      return 0.5f * (1.0f + t) + d2;
    }
    case WEFT_ACT_GELU_ERF:
      return 0.5f * (1.0f + erff(x * INV_SQRT2)) + x * expf(-0.5f * x * x) * INV_SQRT_2PI;
    case WEFT_ACT_RELU:
      return x > 0.0f ? 1.0f : 0.0f;
    default: {
      const float s = 1.0f / (1.0f + expf(-x));
      return s * (1.0f + x * (1.0f - s));
    }
  }
}

weft_status weft_activation_forward(weft_activation act, float *out, const float *inp, int64_t n) {
  WEFT_CHECK_ARGS_(weft_check_activation_forward_(OP, act, out, inp, n));
  for (int64_t i = 0; i < n; i++) out[i] = act_value(act, inp[i]);
  return WEFT_OK;
}

weft_status weft_activation_backward(weft_activation act, float *dinp, const float *dout,
                                     const float *inp, int64_t n, bool accumulate) {
  WEFT_CHECK_ARGS_(weft_check_activation_backward_(OP, act, dinp, dout, inp, n));
  for (int64_t i = 0; i < n; i++) {
    const float d = dout[i] * act_grad(act, inp[i]);
    dinp[i] = accumulate ? dinp[i] + d : d;
  }
  return WEFT_OK;
}

/* ----------------------------------------------------------------- softmax */

weft_status weft_softmax_forward(float *out, const float *inp, int64_t N, int64_t C) {
  WEFT_CHECK_ARGS_(weft_check_softmax_forward_(OP, out, inp, N, C));
  for (int64_t n = 0; n < N; n++) {
    const float *x = inp + n * C;
    float *y = out + n * C; /* may be x: x[c] is not read after y[c] is written */
    float mx = -INFINITY;
    for (int64_t c = 0; c < C; c++) mx = fmaxf(mx, x[c]);
    double s = 0.0;
    for (int64_t c = 0; c < C; c++) {
      const float e = expf(x[c] - mx);
      y[c] = e;
      s += e;
    }
    const float inv = (float)(1.0 / s);
    for (int64_t c = 0; c < C; c++) y[c] *= inv;
  }
  return WEFT_OK;
}

weft_status weft_softmax_backward(float *dinp, const float *dout, const float *out, int64_t N,
                                  int64_t C, bool accumulate) {
  WEFT_CHECK_ARGS_(weft_check_softmax_backward_(OP, dinp, dout, out, N, C));
  for (int64_t n = 0; n < N; n++) {
    const float *dy = dout + n * C, *y = out + n * C;
    float *dx = dinp + n * C;
    double s = 0.0;
    for (int64_t c = 0; c < C; c++) s += (double)dy[c] * y[c];
    const float sf = (float)s;
    for (int64_t c = 0; c < C; c++) {
      const float d = y[c] * (dy[c] - sf);
      dx[c] = accumulate ? dx[c] + d : d;
    }
  }
  return WEFT_OK;
}

/* ----------------------------------------------------------------- dropout */

weft_status weft_dropout_apply(float *out, const float *inp, const float *uniform, float p,
                               int64_t n) {
  WEFT_CHECK_ARGS_(weft_check_dropout_(OP, out, inp, uniform, p, n));
  const float s = (float)(1.0 / (1.0 - (double)p));
  for (int64_t i = 0; i < n; i++) out[i] = uniform[i] >= p ? inp[i] * s : 0.0f;
  return WEFT_OK;
}
