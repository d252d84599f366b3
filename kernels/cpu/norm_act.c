/* CPU fp32 kernels added in backend version 2: LayerNorm, the pointwise
 * activations (GELU tanh / erf, ReLU, SiLU), softmax over the last dim and
 * inverted dropout. Shapes and formulas are documented in layers.h; the
 * argument checks are arg_checks.h's, shared with the device kernels
 * (kernels/cuda/norm_act.cu), so both reject the same inputs with the same
 * first line.
 *
 * Scalar loops, deterministic: row reductions (LayerNorm's mean and
 * variance, softmax sums) and the column sums of LayerNorm's weight and bias
 * gradients accumulate in double, in index order; the elementwise
 * arithmetic is fp32 with the float functions of <math.h>, but GELU-tanh's
 * (gelu_vec.c: AVX2 + FMA in double, rounded once). The rows (or
 * elements, or blocks of COLS columns) are split over the CPU threads in
 * fixed chunks (pool.h's weft_cpu_par_range_), each computed as in the
 * serial loop, so the bits do not depend on the thread count. No
 * allocation: the column sums keep their double accumulators on the stack. */
#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "arg_checks.h"
#include "gelu_vec.h"
#include "layers.h"
#include "pool.h"

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

typedef struct ln_args {
  float *out, *mean, *rstd, *dinp, *dweight, *dbias;
  const float *inp, *weight, *bias, *dout, *mean_in, *rstd_in;
  int64_t C, rows;
  float eps;
  bool accumulate;
} ln_args;

/* Forward of rows [lo, hi). */
static void ln_forward_rows(void *ctx, int64_t lo, int64_t hi) {
  const ln_args *a = ctx;
  const int64_t C = a->C;
  const float *weight = a->weight, *bias = a->bias;
  for (int64_t n = lo; n < hi; n++) {
    const float *x = a->inp + n * C;
    double s = 0.0;
    for (int64_t c = 0; c < C; c++) s += x[c];
    const double m = s / (double)C;
    double v = 0.0;
    for (int64_t c = 0; c < C; c++) {
      const double d = (double)x[c] - m;
      v += d * d;
    }
    const float mf = (float)m, rf = (float)(1.0 / sqrt(v / (double)C + (double)a->eps));
    a->mean[n] = mf;
    a->rstd[n] = rf;
    float *y = a->out + n * C; /* may be x: each x[c] is read before y[c] is written */
    for (int64_t c = 0; c < C; c++) {
      const float h = (x[c] - mf) * rf;
      y[c] = h * (weight ? weight[c] : 1.0f) + (bias ? bias[c] : 0.0f);
    }
  }
}

weft_status weft_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                                   const float *weight, const float *bias, int64_t N, int64_t C,
                                   float eps) {
  WEFT_CHECK_ARGS_(weft_check_layernorm_forward_(OP, out, mean, rstd, inp, N, C, eps));
  ln_args a = {.out = out,
               .mean = mean,
               .rstd = rstd,
               .inp = inp,
               .weight = weight,
               .bias = bias,
               .C = C,
               .eps = eps};
  weft_cpu_par_range_(N, weft_cpu_row_grain_(C), ln_forward_rows, &a);
  return WEFT_OK;
}

/* dinp of rows [lo, hi). */
static void ln_backward_rows(void *ctx, int64_t lo, int64_t hi) {
  const ln_args *a = ctx;
  const int64_t C = a->C;
  const float *weight = a->weight;
  for (int64_t n = lo; n < hi; n++) {
    const float *x = a->inp + n * C, *dy = a->dout + n * C;
    const float m = a->mean_in[n], r = a->rstd_in[n];
    double sg = 0.0, sgx = 0.0; /* sum_j g_j, sum_j g_j xhat_j */
    for (int64_t c = 0; c < C; c++) {
      const float xh = (x[c] - m) * r, g = dy[c] * (weight ? weight[c] : 1.0f);
      sg += g;
      sgx += (double)g * xh;
    }
    const float ga = (float)(sg / (double)C), gb = (float)(sgx / (double)C);
    float *dx = a->dinp + n * C;
    for (int64_t c = 0; c < C; c++) {
      const float xh = (x[c] - m) * r, g = dy[c] * (weight ? weight[c] : 1.0f);
      const float d = r * (g - ga - xh * gb);
      dx[c] = a->accumulate ? dx[c] + d : d;
    }
  }
}

/* dweight / dbias of the column blocks [lo, hi) (block b: columns
 * [b * COLS, b * COLS + COLS)), each summed over all N rows in order. */
static void ln_backward_cols(void *ctx, int64_t lo, int64_t hi) {
  const ln_args *a = ctx;
  const int64_t C = a->C;
  for (int64_t b = lo; b < hi; b++) {
    const int64_t c0 = b * COLS, nc = C - c0 < COLS ? C - c0 : COLS;
    double sw[COLS] = {0}, sb[COLS] = {0};
    for (int64_t n = 0; n < a->rows; n++) {
      const float *x = a->inp + n * C + c0, *dy = a->dout + n * C + c0;
      const float m = a->mean_in[n], r = a->rstd_in[n];
      for (int64_t j = 0; j < nc; j++) {
        sw[j] += (double)dy[j] * ((x[j] - m) * r);
        sb[j] += dy[j];
      }
    }
    for (int64_t j = 0; j < nc; j++) {
      if (a->dweight) a->dweight[c0 + j] = (float)((double)a->dweight[c0 + j] + sw[j]);
      if (a->dbias) a->dbias[c0 + j] = (float)((double)a->dbias[c0 + j] + sb[j]);
    }
  }
}

weft_status weft_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                                    const float *inp, const float *weight, const float *mean,
                                    const float *rstd, int64_t N, int64_t C, bool accumulate_dinp) {
  WEFT_CHECK_ARGS_(weft_check_layernorm_backward_(OP, dout, inp, mean, rstd, N, C));
  ln_args a = {.dinp = dinp,
               .dweight = dweight,
               .dbias = dbias,
               .inp = inp,
               .weight = weight,
               .dout = dout,
               .mean_in = mean,
               .rstd_in = rstd,
               .C = C,
               .rows = N,
               .accumulate = accumulate_dinp};
  if (dinp) weft_cpu_par_range_(N, weft_cpu_row_grain_(C), ln_backward_rows, &a);
  if (dweight || dbias) weft_cpu_par_range_((C + COLS - 1) / COLS, 1, ln_backward_cols, &a);
  return WEFT_OK;
}

/* ------------------------------------------------------------- activations */

#define INV_SQRT2 0.7071067811865476f
#define INV_SQRT_2PI 0.3989422804014327f

/* act(x) for the activations but GELU-tanh (gelu_vec.c). */
static inline float act_value(weft_activation act, float x) {
  switch (act) {
    case WEFT_ACT_GELU_ERF:
      return 0.5f * x * (1.0f + erff(x * INV_SQRT2));
    case WEFT_ACT_RELU:
      return x > 0.0f ? x : (x != x ? x : 0.0f);
    default:
      return x / (1.0f + expf(-x)); /* silu (act checked) */
  }
}

/* act'(x), the same activations */
static inline float act_grad(weft_activation act, float x) {
  switch (act) {
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

typedef struct act_args {
  weft_activation act;
  float *out;
  const float *inp, *dout;
  bool accumulate;
} act_args;

/* GELU-tanh goes to gelu_vec.c's spans (AVX2 + FMA in double, rounded
 * once; its scalar path elsewhere); the others to act_value / act_grad. */
static void act_forward_span(void *ctx, int64_t lo, int64_t hi) {
  const act_args *a = ctx;
  if (a->act == WEFT_ACT_GELU_TANH) {
    weft_gelu_tanh_forward_span_(a->out + lo, a->inp + lo, hi - lo);
    return;
  }
  for (int64_t i = lo; i < hi; i++) a->out[i] = act_value(a->act, a->inp[i]);
}

static void act_backward_span(void *ctx, int64_t lo, int64_t hi) {
  const act_args *a = ctx;
  if (a->act == WEFT_ACT_GELU_TANH) {
    weft_gelu_tanh_backward_span_(a->out + lo, a->dout + lo, a->inp + lo, hi - lo, a->accumulate);
    return;
  }
  for (int64_t i = lo; i < hi; i++) {
    const float d = a->dout[i] * act_grad(a->act, a->inp[i]);
    a->out[i] = a->accumulate ? a->out[i] + d : d;
  }
}

weft_status weft_activation_forward(weft_activation act, float *out, const float *inp, int64_t n) {
  WEFT_CHECK_ARGS_(weft_check_activation_forward_(OP, act, out, inp, n));
  act_args a = {.act = act, .out = out, .inp = inp};
  weft_cpu_par_range_(n, WEFT_CPU_GRAIN, act_forward_span, &a);
  return WEFT_OK;
}

weft_status weft_activation_backward(weft_activation act, float *dinp, const float *dout,
                                     const float *inp, int64_t n, bool accumulate) {
  WEFT_CHECK_ARGS_(weft_check_activation_backward_(OP, act, dinp, dout, inp, n));
  act_args a = {.act = act, .out = dinp, .inp = inp, .dout = dout, .accumulate = accumulate};
  weft_cpu_par_range_(n, WEFT_CPU_GRAIN, act_backward_span, &a);
  return WEFT_OK;
}

/* ----------------------------------------------------------------- softmax */

typedef struct sm_args {
  float *out;
  const float *inp, *dout, *y;
  int64_t C;
  bool accumulate;
} sm_args;

static void sm_forward_rows(void *ctx, int64_t lo, int64_t hi) {
  const sm_args *a = ctx;
  const int64_t C = a->C;
  for (int64_t n = lo; n < hi; n++) {
    const float *x = a->inp + n * C;
    float *y = a->out + n * C; /* may be x: x[c] is not read after y[c] is written */
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
}

weft_status weft_softmax_forward(float *out, const float *inp, int64_t N, int64_t C) {
  WEFT_CHECK_ARGS_(weft_check_softmax_forward_(OP, out, inp, N, C));
  sm_args a = {.out = out, .inp = inp, .C = C};
  weft_cpu_par_range_(N, weft_cpu_row_grain_(C), sm_forward_rows, &a);
  return WEFT_OK;
}

static void sm_backward_rows(void *ctx, int64_t lo, int64_t hi) {
  const sm_args *a = ctx;
  const int64_t C = a->C;
  for (int64_t n = lo; n < hi; n++) {
    const float *dy = a->dout + n * C, *y = a->y + n * C;
    float *dx = a->out + n * C;
    double s = 0.0;
    for (int64_t c = 0; c < C; c++) s += (double)dy[c] * y[c];
    const float sf = (float)s;
    for (int64_t c = 0; c < C; c++) {
      const float d = y[c] * (dy[c] - sf);
      dx[c] = a->accumulate ? dx[c] + d : d;
    }
  }
}

weft_status weft_softmax_backward(float *dinp, const float *dout, const float *out, int64_t N,
                                  int64_t C, bool accumulate) {
  WEFT_CHECK_ARGS_(weft_check_softmax_backward_(OP, dinp, dout, out, N, C));
  sm_args a = {.out = dinp, .dout = dout, .y = out, .C = C, .accumulate = accumulate};
  weft_cpu_par_range_(N, weft_cpu_row_grain_(C), sm_backward_rows, &a);
  return WEFT_OK;
}

/* ----------------------------------------------------------------- dropout */

typedef struct dropout_args {
  float *out;
  const float *inp, *uniform;
  float p, s;
} dropout_args;

static void dropout_span(void *ctx, int64_t lo, int64_t hi) {
  const dropout_args *a = ctx;
  for (int64_t i = lo; i < hi; i++) a->out[i] = a->uniform[i] >= a->p ? a->inp[i] * a->s : 0.0f;
}

weft_status weft_dropout_apply(float *out, const float *inp, const float *uniform, float p,
                               int64_t n) {
  WEFT_CHECK_ARGS_(weft_check_dropout_(OP, out, inp, uniform, p, n));
  dropout_args a = {out, inp, uniform, p, (float)(1.0 / (1.0 - (double)p))};
  weft_cpu_par_range_(n, WEFT_CPU_GRAIN, dropout_span, &a);
  return WEFT_OK;
}
