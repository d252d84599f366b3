/* kernels/cpu/pointwise.c — CPU fp32 elementwise layer kernels of the
 * Llama-style block (layers.h): SwiGLU forward and backward (silu(a) * b,
 * exp-bound, with an 8-lane AVX2 + FMA version chosen at run time, see
 * simd.h) and the residual add with its backward (dout added into each
 * non-NULL gradient). The other pointwise activations (GELU, ReLU, SiLU)
 * are in norm_act.c. */
#include <stdint.h>

#include "arg_checks.h"
#include "cpu_internal.h"
#include "layers.h"
#include "pool.h"
#include "simd.h"

/* ---------------------------------------------------------------- SwiGLU */

/* The SwiGLU loops below on 8 lanes with fused multiply-adds (simd.h, "AVX2
 * + FMA variants"); chosen at run time by use_avx2(). */
#ifdef HAVE_AVX2_PATH
AVX2_FN static void swiglu_fwd_avx2(float *out, const float *a, const float *b, int64_t n) {
  const vf8 one = v8set(1.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    vf8 x = v8load(a + i);
    v8store(out + i, x / (one + v8exp(-x)) * v8load(b + i));
  }
  if (i < n) {
    vf8 x = v8load_tail(a + i, n - i, 0.0f);
    v8store_tail(out + i, x / (one + v8exp(-x)) * v8load_tail(b + i, n - i, 0.0f), n - i);
  }
}

AVX2_FN static void swiglu_bwd_avx2(float *da, float *db, const float *dout, const float *a,
                                    const float *b, int64_t n) {
  const vf8 one = v8set(1.0f);
  int64_t i = 0;
  for (; i < n; i += 8) {
    const int64_t m = n - i < 8 ? n - i : 8;
    vf8 x, y, d;
    if (m == 8) {
      x = v8load(a + i), y = v8load(b + i), d = v8load(dout + i);
    } else {
      x = v8load_tail(a + i, m, 0.0f), y = v8load_tail(b + i, m, 0.0f);
      d = v8load_tail(dout + i, m, 0.0f);
    }
    vf8 s = one / (one + v8exp(-x));
    vf8 gda = d * y * s * (one + x * (one - s)), gdb = d * (x * s);
    if (m == 8) {
      v8store(da + i, gda);
      v8store(db + i, gdb);
    } else {
      v8store_tail(da + i, gda, m);
      v8store_tail(db + i, gdb, m);
    }
  }
}
#endif

/* out = silu(a) * b over n elements, on this thread. */
static void swiglu_fwd(float *out, const float *a, const float *b, int64_t n) {
#ifdef HAVE_AVX2_PATH
  if (use_avx2()) {
    swiglu_fwd_avx2(out, a, b, n);
    return;
  }
#endif
  const vf4 one = vset(1.0f);
  int64_t i = 0;
  for (; i + VL <= n; i += VL) {
    vf4 x = vload(a + i);
    vstore(out + i, x / (one + vexp(-x)) * vload(b + i));
  }
  if (i < n) {
    vf4 x = vload_tail(a + i, n - i, 0.0f);
    vstore_tail(out + i, x / (one + vexp(-x)) * vload_tail(b + i, n - i, 0.0f), n - i);
  }
}

/* SwiGLU's backward over n elements, on this thread. */
static void swiglu_bwd(float *da, float *db, const float *dout, const float *a, const float *b,
                       int64_t n) {
#ifdef HAVE_AVX2_PATH
  if (use_avx2()) {
    swiglu_bwd_avx2(da, db, dout, a, b, n);
    return;
  }
#endif
  const vf4 one = vset(1.0f);
  int64_t i = 0;
  for (; i + VL <= n; i += VL) {
    vf4 x = vload(a + i), y = vload(b + i), d = vload(dout + i);
    vf4 s = one / (one + vexp(-x));
    vf4 silu = x * s;
    vstore(da + i, d * y * s * (one + x * (one - s)));
    vstore(db + i, d * silu);
  }
  if (i < n) {
    int64_t m = n - i;
    vf4 x = vload_tail(a + i, m, 0.0f), y = vload_tail(b + i, m, 0.0f),
        d = vload_tail(dout + i, m, 0.0f);
    vf4 s = one / (one + vexp(-x));
    vf4 silu = x * s;
    vstore_tail(da + i, d * y * s * (one + x * (one - s)), m);
    vstore_tail(db + i, d * silu, m);
  }
}

/* The SwiGLU and residual kernels split their elements over the CPU
 * threads in fixed chunks (pool.h), each element computed as on one
 * thread (the lanes do the same arithmetic as the tails). */
typedef struct pw_args {
  float *out, *da, *db;
  const float *a, *b, *dout;
} pw_args;

static void swiglu_fwd_span(void *ctx, int64_t lo, int64_t hi) {
  const pw_args *p = ctx;
  swiglu_fwd(p->out + lo, p->a + lo, p->b + lo, hi - lo);
}

static void swiglu_bwd_span(void *ctx, int64_t lo, int64_t hi) {
  const pw_args *p = ctx;
  swiglu_bwd(p->da + lo, p->db + lo, p->dout + lo, p->a + lo, p->b + lo, hi - lo);
}

/* out = f(a, b) elementwise over n (SwiGLU and residual forward): the
 * checks, named after the caller, then fixed chunks on the CPU threads. */
static weft_status pw_binary(const char *func, float *out, const float *a, const float *b,
                             int64_t n, weft_cpu_range_fn span) {
  const char *op = weft_op_name_(func);
  CHECK_SIZES_AT(op, n);
  CHECK_PTR_AT(op, out, n);
  CHECK_PTR_AT(op, a, n);
  CHECK_PTR_AT(op, b, n);
  pw_args p = {.out = out, .a = a, .b = b};
  weft_cpu_par_range_(n, WEFT_CPU_GRAIN, span, &p);
  return WEFT_OK;
}

/* bf16 / f16 (backend.h swiglu_forward_dt): the f32 loops on tiles
 * widened by weft_cpu_tiled_ (each element as on one thread). */
static void swiglu_fwd_tile(void *ctx, int64_t at, int64_t m, float *const *o,
                            const float *const *in) {
  (void)ctx, (void)at;
  swiglu_fwd(o[0], in[0], in[1], m);
}

static void swiglu_bwd_tile(void *ctx, int64_t at, int64_t m, float *const *o,
                            const float *const *in) {
  (void)ctx, (void)at;
  swiglu_bwd(o[0], o[1], in[0], in[1], in[2], m);
}

weft_status weft_cpu_swiglu_forward_dt_(weft_dtype dt, void *out, const void *a, const void *b,
                                        int64_t n) {
  const char *op = "swiglu_forward_dt";
  WEFT_CHECK_STORAGE_DT_(op, dt);
  if (dt == WEFT_F32) return weft_swiglu_forward(out, a, b, n);
  WEFT_CHECK_ARGS_(weft_check_swiglu_forward_(op, out, a, b, n));
  const void *in[2] = {a, b};
  weft_cpu_tiled_(dt, n, 1, &out, false, 2, in, swiglu_fwd_tile, NULL);
  return WEFT_OK;
}

weft_status weft_cpu_swiglu_backward_dt_(weft_dtype dt, void *da, void *db, const void *dout,
                                         const void *a, const void *b, int64_t n) {
  const char *op = "swiglu_backward_dt";
  WEFT_CHECK_STORAGE_DT_(op, dt);
  if (dt == WEFT_F32) return weft_swiglu_backward(da, db, dout, a, b, n);
  WEFT_CHECK_ARGS_(weft_check_swiglu_backward_(op, da, db, dout, a, b, n));
  void *out[2] = {da, db};
  const void *in[3] = {dout, a, b};
  weft_cpu_tiled_(dt, n, 2, out, false, 3, in, swiglu_bwd_tile, NULL);
  return WEFT_OK;
}

weft_status weft_swiglu_forward(float *out, const float *a, const float *b, int64_t n) {
  return pw_binary(__func__, out, a, b, n, swiglu_fwd_span);
}

weft_status weft_swiglu_backward(float *da, float *db, const float *dout, const float *a,
                                 const float *b, int64_t n) {
  WEFT_RETURN_IF_BAD_(weft_check_swiglu_backward_(weft_op_name_(__func__), da, db, dout, a, b, n));
  pw_args p = {.da = da, .db = db, .dout = dout, .a = a, .b = b};
  weft_cpu_par_range_(n, WEFT_CPU_GRAIN, swiglu_bwd_span, &p);
  return WEFT_OK;
}

/* -------------------------------------------------------------- residual */

static void residual_fwd_span(void *ctx, int64_t lo, int64_t hi) {
  const pw_args *p = ctx;
  float *out = p->out;
  const float *a = p->a, *b = p->b;
  int64_t i = lo;
  for (; i + VL <= hi; i += VL) vstore(out + i, vload(a + i) + vload(b + i));
  for (; i < hi; i++) out[i] = a[i] + b[i];
}

static void residual_bwd_span(void *ctx, int64_t lo, int64_t hi) {
  const pw_args *p = ctx;
  float *dst[2] = {p->da, p->db};
  for (int k = 0; k < 2; k++) {
    float *x = dst[k];
    if (!x) continue;
    int64_t i = lo;
    for (; i + VL <= hi; i += VL) vstore(x + i, vload(x + i) + vload(p->dout + i));
    for (; i < hi; i++) x[i] += p->dout[i];
  }
}

weft_status weft_residual_forward(float *out, const float *a, const float *b, int64_t n) {
  return pw_binary(__func__, out, a, b, n, residual_fwd_span);
}

weft_status weft_residual_backward(float *da, float *db, const float *dout, int64_t n) {
  CHECK_SIZES(n);
  CHECK_PTR(dout, n);
  pw_args p = {.da = da, .db = db, .dout = dout};
  weft_cpu_par_range_(n, WEFT_CPU_GRAIN, residual_bwd_span, &p);
  return WEFT_OK;
}
