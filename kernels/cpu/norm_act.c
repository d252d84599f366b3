/* CPU fp32 kernels added in backend version 2: LayerNorm, the pointwise
 * activations (GELU tanh / erf, ReLU, SiLU), softmax over the last dim and
 * inverted dropout. Shapes and formulas are documented in layers.h; the
 * argument checks are arg_checks.h's, shared with the device kernels
 * (kernels/cuda/norm_act.cu), so both reject the same inputs with the same
 * first line.
 *
 * Deterministic: row reductions (LayerNorm's mean and variance, softmax
 * sums) accumulate in double; LayerNorm runs on 4-float vectors (simd.h)
 * with its sums on double lanes, the activations and softmax are scalar
 * fp32 with the float functions of <math.h>, but GELU-tanh's (gelu_vec.c:
 * AVX2 + FMA in double, rounded once). The rows (or elements) are split
 * over the CPU threads in fixed chunks (pool.h's weft_cpu_par_range_),
 * each computed as in the serial loop, so the bits do not depend on the
 * thread count. LayerNorm's backward reads each row once: dinp, and per
 * chunk of rows the partial column sums of its weight and bias gradients
 * (in double, in pool.h's partials block), added in chunk order at the end. */
#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "arg_checks.h"
#include "cpu_internal.h"
#include "gelu_vec.h"
#include "layers.h"
#include "pool.h"
#include "simd.h"

/* Errors name the operation ("layernorm_forward: ..."), not the C function. */
#define OP weft_op_name_(__func__)

/* -------------------------------------------------------------- LayerNorm */

typedef struct ln_args {
  float *out, *mean, *rstd, *dinp;
  double
      *part; /* backward: chunk k's C sums of dout * xhat at k * C, of dout at (nchunks + k) * C */
  const float *inp, *weight, *bias, *dout, *mean_in, *rstd_in;
  int64_t C, grain, nchunks;
  float eps;
  bool accumulate;
} ln_args;

/* Forward of rows [lo, hi), xr and yr pointing at row lo (a->inp and
 * a->out, or a 16-bit chunk's widened rows): one read of the row from
 * memory (it stays in L1 for the variance and the output), sums in double
 * on vector lanes. */
static void ln_forward_rows_at(const ln_args *a, int64_t lo, int64_t hi, const float *xr,
                               float *yr) {
  const int64_t C = a->C;
  const float *weight = a->weight, *bias = a->bias;
  for (int64_t n = lo; n < hi; n++) {
    const float *x = xr + (n - lo) * C;
    vd2 sl = {0}, sh = {0};
    int64_t c = 0;
    for (; c + VL <= C; c += VL) vacc_d(&sl, &sh, vload(x + c));
    double s = hsum_d(sl, sh);
    for (; c < C; c++) s += x[c];
    const double m = s / (double)C;
    const vd2 vm = {m, m};
    vd2 ql = {0}, qh = {0};
    for (c = 0; c + VL <= C; c += VL) {
      const vf4 xv = vload(x + c);
      const vd2 dl = vlo_d(xv) - vm, dh = vhi_d(xv) - vm;
      ql += dl * dl;
      qh += dh * dh;
    }
    double v = hsum_d(ql, qh);
    for (; c < C; c++) {
      const double d = (double)x[c] - m;
      v += d * d;
    }
    const float mf = (float)m, rf = (float)(1.0 / sqrt(v / (double)C + (double)a->eps));
    a->mean[n] = mf;
    a->rstd[n] = rf;
    float *y = yr + (n - lo) * C; /* may be x: each x[c] is read before y[c] is written */
    const vf4 vmf = vset(mf), vrf = vset(rf), one = vset(1.0f), zero = vset(0.0f);
    for (c = 0; c + VL <= C; c += VL) {
      const vf4 h = (vload(x + c) - vmf) * vrf;
      vstore(y + c, h * (weight ? vload(weight + c) : one) + (bias ? vload(bias + c) : zero));
    }
    for (; c < C; c++) {
      const float h = (x[c] - mf) * rf;
      y[c] = h * (weight ? weight[c] : 1.0f) + (bias ? bias[c] : 0.0f);
    }
  }
}

static void ln_forward_rows(void *ctx, int64_t lo, int64_t hi) {
  const ln_args *a = ctx;
  ln_forward_rows_at(a, lo, hi, a->inp + lo * a->C, a->out + lo * a->C);
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

/* Backward of rows [lo, hi), one chunk, in one read of each row of inp and
 * dout: dinp (when wanted) and the chunk's partial column sums of
 * dout * xhat and dout (when wanted), in double. xr, dyr, dxr point at row
 * lo (a->inp, a->dout, a->dinp, or a 16-bit chunk's widened rows). */
static void ln_backward_rows_at(const ln_args *a, int64_t lo, int64_t hi, const float *xr,
                                const float *dyr, float *dxr) {
  const int64_t C = a->C;
  const float *weight = a->weight;
  double *pw = NULL, *pb = NULL;
  if (a->part) {
    const int64_t k = lo / a->grain;
    pw = a->part + k * C;
    pb = a->part + (a->nchunks + k) * C;
    memset(pw, 0, sizeof(double) * (size_t)C);
    memset(pb, 0, sizeof(double) * (size_t)C);
  }
  const vf4 one = vset(1.0f);
  for (int64_t n = lo; n < hi; n++) {
    const float *x = xr + (n - lo) * C, *dy = dyr + (n - lo) * C;
    const float m = a->mean_in[n], r = a->rstd_in[n];
    const vf4 vm = vset(m), vr = vset(r);
    vd2 gl = {0}, gh = {0}, xl = {0}, xh2 = {0}; /* sum_j g_j, sum_j g_j xhat_j */
    int64_t c = 0;
    for (; c + VL <= C; c += VL) {
      const vf4 dyv = vload(dy + c), xh = (vload(x + c) - vm) * vr;
      const vf4 g = dyv * (weight ? vload(weight + c) : one);
      vacc_d(&gl, &gh, g);
      xl += vlo_d(g) * vlo_d(xh);
      xh2 += vhi_d(g) * vhi_d(xh);
      if (pw) {
        dstore(pw + c, dload(pw + c) + vlo_d(dyv) * vlo_d(xh));
        dstore(pw + c + 2, dload(pw + c + 2) + vhi_d(dyv) * vhi_d(xh));
        dstore(pb + c, dload(pb + c) + vlo_d(dyv));
        dstore(pb + c + 2, dload(pb + c + 2) + vhi_d(dyv));
      }
    }
    double sg = hsum_d(gl, gh), sgx = hsum_d(xl, xh2);
    for (; c < C; c++) {
      const float xh = (x[c] - m) * r, g = dy[c] * (weight ? weight[c] : 1.0f);
      sg += g;
      sgx += (double)g * xh;
      if (pw) {
        pw[c] += (double)dy[c] * xh;
        pb[c] += dy[c];
      }
    }
    if (!dxr) continue;
    const float ga = (float)(sg / (double)C), gb = (float)(sgx / (double)C);
    const vf4 vga = vset(ga), vgb = vset(gb);
    float *dx = dxr + (n - lo) * C;
    for (c = 0; c + VL <= C; c += VL) {
      const vf4 xh = (vload(x + c) - vm) * vr;
      const vf4 g = vload(dy + c) * (weight ? vload(weight + c) : one);
      const vf4 d = vr * (g - vga - xh * vgb);
      vstore(dx + c, a->accumulate ? vload(dx + c) + d : d);
    }
    for (; c < C; c++) {
      const float xh = (x[c] - m) * r, g = dy[c] * (weight ? weight[c] : 1.0f);
      const float d = r * (g - ga - xh * gb);
      dx[c] = a->accumulate ? dx[c] + d : d;
    }
  }
}

static void ln_backward_rows(void *ctx, int64_t lo, int64_t hi) {
  const ln_args *a = ctx;
  ln_backward_rows_at(a, lo, hi, a->inp + lo * a->C, a->dout + lo * a->C,
                      a->dinp ? a->dinp + lo * a->C : NULL);
}

weft_status weft_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                                    const float *inp, const float *weight, const float *mean,
                                    const float *rstd, int64_t N, int64_t C, bool accumulate_dinp) {
  WEFT_CHECK_ARGS_(weft_check_layernorm_backward_(OP, dout, inp, mean, rstd, N, C));
  if (N == 0 || (!dinp && !dweight && !dbias)) return WEFT_OK;
  ln_args a = {.dinp = dinp,
               .inp = inp,
               .weight = weight,
               .dout = dout,
               .mean_in = mean,
               .rstd_in = rstd,
               .C = C,
               .accumulate = accumulate_dinp};
  const bool sums = dweight || dbias;
  a.grain = sums ? weft_cpu_partial_grain_(N, C) : weft_cpu_row_grain_(C);
  a.nchunks = (N + a.grain - 1) / a.grain;
  if (sums) WEFT_CHECK(weft_cpu_partials_get_(2 * a.nchunks * C, &a.part));
  weft_cpu_par_range_(N, a.grain, ln_backward_rows, &a);
  if (dweight) weft_cpu_add_partials_(dweight, a.part, a.nchunks, C);
  if (dbias) weft_cpu_add_partials_(dbias, a.part + a.nchunks * C, a.nchunks, C);
  weft_cpu_partials_put_(a.part);
  return WEFT_OK;
}

/* bf16 / f16 (backend.h layernorm_forward_dt): weft_cpu_rows_dt_ widens
 * each chunk of rows and the f32 row code above runs on it (the same
 * chunks, so the same partial sums); weight and bias are widened once per
 * call. */
static void ln_dt_forward_rows(void *ctx, int64_t lo, int64_t hi, float *const *o,
                               const float *const *in) {
  ln_forward_rows_at(ctx, lo, hi, in[0], o[0]);
}

static void ln_dt_backward_rows(void *ctx, int64_t lo, int64_t hi, float *const *o,
                                const float *const *in) {
  ln_backward_rows_at(ctx, lo, hi, in[0], in[1], o[0]);
}

weft_status weft_cpu_layernorm_forward_dt_(weft_dtype dt, void *out, float *mean, float *rstd,
                                           const void *inp, const void *weight, const void *bias,
                                           int64_t N, int64_t C, float eps) {
  const char *op = "layernorm_forward_dt";
  WEFT_CHECK_STORAGE_DT_(op, dt);
  if (dt == WEFT_F32) return weft_layernorm_forward(out, mean, rstd, inp, weight, bias, N, C, eps);
  WEFT_CHECK_ARGS_(weft_check_layernorm_forward_(op, out, mean, rstd, inp, N, C, eps));
  float *w, *b = NULL;
  WEFT_CHECK(weft_cpu_widened_copy_(op, dt, weight, C, &w));
  weft_status st = weft_cpu_widened_copy_(op, dt, bias, C, &b);
  ln_args a = {.mean = mean, .rstd = rstd, .weight = w, .bias = b, .C = C, .eps = eps};
  if (st == WEFT_OK)
    st = weft_cpu_rows_dt_(op, dt, N, C, weft_cpu_row_grain_(C), 1, &out, false, 1, &inp,
                           ln_dt_forward_rows, &a);
  free(w);
  free(b);
  return st;
}

weft_status weft_cpu_layernorm_backward_dt_(weft_dtype dt, void *dinp, float *dweight, float *dbias,
                                            const void *dout, const void *inp, const void *weight,
                                            const float *mean, const float *rstd, int64_t N,
                                            int64_t C, bool accumulate_dinp) {
  const char *op = "layernorm_backward_dt";
  WEFT_CHECK_STORAGE_DT_(op, dt);
  if (dt == WEFT_F32)
    return weft_layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C,
                                   accumulate_dinp);
  WEFT_CHECK_ARGS_(weft_check_layernorm_backward_(op, dout, inp, mean, rstd, N, C));
  if (N == 0 || (!dinp && !dweight && !dbias)) return WEFT_OK;
  float *w;
  WEFT_CHECK(weft_cpu_widened_copy_(op, dt, weight, C, &w));
  ln_args a = {
      .mean_in = mean, .rstd_in = rstd, .weight = w, .C = C, .accumulate = accumulate_dinp};
  const bool sums = dweight || dbias;
  a.grain = sums ? weft_cpu_partial_grain_(N, C) : weft_cpu_row_grain_(C);
  a.nchunks = (N + a.grain - 1) / a.grain;
  weft_status st = sums ? weft_cpu_partials_get_(2 * a.nchunks * C, &a.part) : WEFT_OK;
  if (st == WEFT_OK) {
    const void *in[2] = {inp, dout};
    st = weft_cpu_rows_dt_(op, dt, N, C, a.grain, 1, &dinp, accumulate_dinp, 2, in,
                           ln_dt_backward_rows, &a);
    if (st == WEFT_OK && dweight) weft_cpu_add_partials_(dweight, a.part, a.nchunks, C);
    if (st == WEFT_OK && dbias) weft_cpu_add_partials_(dbias, a.part + a.nchunks * C, a.nchunks, C);
    if (sums) weft_cpu_partials_put_(a.part);
  }
  free(w);
  return st;
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

/* bf16 / f16 (backend.h, activation_forward_dt): the f32 spans above on
 * tiles widened by weft_cpu_tiled_. */
static void act_dt_forward_tile(void *ctx, int64_t at, int64_t m, float *const *o,
                                const float *const *in) {
  (void)at;
  act_args f = {.act = *(const weft_activation *)ctx, .out = o[0], .inp = in[0]};
  act_forward_span(&f, 0, m);
}

typedef struct act_dt_bwd {
  weft_activation act;
  bool accumulate;
} act_dt_bwd;

static void act_dt_backward_tile(void *ctx, int64_t at, int64_t m, float *const *o,
                                 const float *const *in) {
  (void)at;
  const act_dt_bwd *b = ctx;
  act_args f = {
      .act = b->act, .out = o[0], .dout = in[0], .inp = in[1], .accumulate = b->accumulate};
  act_backward_span(&f, 0, m);
}

weft_status weft_cpu_activation_forward_dt_(weft_activation act, weft_dtype dt, void *out,
                                            const void *inp, int64_t n) {
  const char *op = "activation_forward_dt"; /* the CUDA member's name too */
  WEFT_CHECK_STORAGE_DT_(op, dt);
  if (dt == WEFT_F32) return weft_activation_forward(act, out, inp, n);
  WEFT_CHECK_ARGS_(weft_check_activation_forward_(op, act, out, inp, n));
  weft_cpu_tiled_(dt, n, 1, &out, false, 1, &inp, act_dt_forward_tile, &act);
  return WEFT_OK;
}

weft_status weft_cpu_activation_backward_dt_(weft_activation act, weft_dtype dt, void *dinp,
                                             const void *dout, const void *inp, int64_t n,
                                             bool accumulate) {
  const char *op = "activation_backward_dt";
  WEFT_CHECK_STORAGE_DT_(op, dt);
  if (dt == WEFT_F32) return weft_activation_backward(act, dinp, dout, inp, n, accumulate);
  WEFT_CHECK_ARGS_(weft_check_activation_backward_(op, act, dinp, dout, inp, n));
  act_dt_bwd b = {act, accumulate};
  const void *in[2] = {dout, inp};
  weft_cpu_tiled_(dt, n, 1, &dinp, accumulate, 2, in, act_dt_backward_tile, &b);
  return WEFT_OK;
}

/* ----------------------------------------------------------------- softmax */

typedef struct sm_args {
  float *out;
  const float *inp, *dout, *y;
  int64_t C;
  bool accumulate;
} sm_args;

/* Rows [lo, hi), xr and yr pointing at row lo. */
static void sm_forward_rows_at(const sm_args *a, int64_t lo, int64_t hi, const float *xr,
                               float *yr) {
  const int64_t C = a->C;
  for (int64_t n = lo; n < hi; n++) {
    const float *x = xr + (n - lo) * C;
    float *y = yr + (n - lo) * C; /* may be x: x[c] is not read after y[c] is written */
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

static void sm_forward_rows(void *ctx, int64_t lo, int64_t hi) {
  const sm_args *a = ctx;
  sm_forward_rows_at(a, lo, hi, a->inp + lo * a->C, a->out + lo * a->C);
}

weft_status weft_softmax_forward(float *out, const float *inp, int64_t N, int64_t C) {
  WEFT_CHECK_ARGS_(weft_check_softmax_forward_(OP, out, inp, N, C));
  sm_args a = {.out = out, .inp = inp, .C = C};
  weft_cpu_par_range_(N, weft_cpu_row_grain_(C), sm_forward_rows, &a);
  return WEFT_OK;
}

/* Rows [lo, hi), dyr, yr and dxr pointing at row lo. */
static void sm_backward_rows_at(const sm_args *a, int64_t lo, int64_t hi, const float *dyr,
                                const float *yr, float *dxr) {
  const int64_t C = a->C;
  for (int64_t n = lo; n < hi; n++) {
    const float *dy = dyr + (n - lo) * C, *y = yr + (n - lo) * C;
    float *dx = dxr + (n - lo) * C;
    double s = 0.0;
    for (int64_t c = 0; c < C; c++) s += (double)dy[c] * y[c];
    const float sf = (float)s;
    for (int64_t c = 0; c < C; c++) {
      const float d = y[c] * (dy[c] - sf);
      dx[c] = a->accumulate ? dx[c] + d : d;
    }
  }
}

static void sm_backward_rows(void *ctx, int64_t lo, int64_t hi) {
  const sm_args *a = ctx;
  sm_backward_rows_at(a, lo, hi, a->dout + lo * a->C, a->y + lo * a->C, a->out + lo * a->C);
}

weft_status weft_softmax_backward(float *dinp, const float *dout, const float *out, int64_t N,
                                  int64_t C, bool accumulate) {
  WEFT_CHECK_ARGS_(weft_check_softmax_backward_(OP, dinp, dout, out, N, C));
  sm_args a = {.out = dinp, .dout = dout, .y = out, .C = C, .accumulate = accumulate};
  weft_cpu_par_range_(N, weft_cpu_row_grain_(C), sm_backward_rows, &a);
  return WEFT_OK;
}

/* bf16 / f16 (backend.h softmax_forward_dt): the f32 rows above on the
 * chunks weft_cpu_rows_dt_ widens. */
static void sm_dt_forward_rows(void *ctx, int64_t lo, int64_t hi, float *const *o,
                               const float *const *in) {
  sm_forward_rows_at(ctx, lo, hi, in[0], o[0]);
}

static void sm_dt_backward_rows(void *ctx, int64_t lo, int64_t hi, float *const *o,
                                const float *const *in) {
  sm_backward_rows_at(ctx, lo, hi, in[0], in[1], o[0]);
}

weft_status weft_cpu_softmax_forward_dt_(weft_dtype dt, void *out, const void *inp, int64_t N,
                                         int64_t C) {
  const char *op = "softmax_forward_dt";
  WEFT_CHECK_STORAGE_DT_(op, dt);
  if (dt == WEFT_F32) return weft_softmax_forward(out, inp, N, C);
  WEFT_CHECK_ARGS_(weft_check_softmax_forward_(op, out, inp, N, C));
  sm_args a = {.C = C};
  return weft_cpu_rows_dt_(op, dt, N, C, weft_cpu_row_grain_(C), 1, &out, false, 1, &inp,
                           sm_dt_forward_rows, &a);
}

weft_status weft_cpu_softmax_backward_dt_(weft_dtype dt, void *dinp, const void *dout,
                                          const void *out, int64_t N, int64_t C, bool accumulate) {
  const char *op = "softmax_backward_dt";
  WEFT_CHECK_STORAGE_DT_(op, dt);
  if (dt == WEFT_F32) return weft_softmax_backward(dinp, dout, out, N, C, accumulate);
  WEFT_CHECK_ARGS_(weft_check_softmax_backward_(op, dinp, dout, out, N, C));
  sm_args a = {.C = C, .accumulate = accumulate};
  const void *in[2] = {dout, out};
  return weft_cpu_rows_dt_(op, dt, N, C, weft_cpu_row_grain_(C), 1, &dinp, accumulate, 2, in,
                           sm_dt_backward_rows, &a);
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

/* bf16 / f16 (backend.h dropout_apply_dt): the f32 loop on tiles widened
 * by weft_cpu_tiled_; the uniforms stay f32. */
static void dropout_tile(void *ctx, int64_t at, int64_t m, float *const *o,
                         const float *const *in) {
  const dropout_args *a = ctx;
  dropout_args t = {o[0], in[0], a->uniform + at, a->p, a->s};
  dropout_span(&t, 0, m);
}

weft_status weft_cpu_dropout_apply_dt_(weft_dtype dt, void *out, const void *inp,
                                       const float *uniform, float p, int64_t n) {
  const char *op = "dropout_apply_dt";
  WEFT_CHECK_STORAGE_DT_(op, dt);
  if (dt == WEFT_F32) return weft_dropout_apply(out, inp, uniform, p, n);
  WEFT_CHECK_ARGS_(weft_check_dropout_(op, out, inp, uniform, p, n));
  dropout_args a = {NULL, NULL, uniform, p, (float)(1.0 / (1.0 - (double)p))};
  weft_cpu_tiled_(dt, n, 1, &out, false, 1, &inp, dropout_tile, &a);
  return WEFT_OK;
}
