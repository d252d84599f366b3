/* kernels/cpu/pointwise.c — CPU fp32 elementwise layer kernels of the
 * Llama-style block (layers.h): SwiGLU forward and backward (silu(a) * b,
 * exp-bound, with an 8-lane AVX2 + FMA version chosen at run time, see
 * simd.h) and the residual add with its backward (dout added into each
 * non-NULL gradient). The other pointwise activations (GELU, ReLU, SiLU)
 * are in norm_act.c. */
#include <stdint.h>

#include "arg_checks.h"
#include "layers.h"
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

weft_status weft_swiglu_forward(float *out, const float *a, const float *b, int64_t n) {
  CHECK_SIZES(n);
  CHECK_PTR(out, n);
  CHECK_PTR(a, n);
  CHECK_PTR(b, n);
#ifdef HAVE_AVX2_PATH
  if (use_avx2()) {
    swiglu_fwd_avx2(out, a, b, n);
    return WEFT_OK;
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
  return WEFT_OK;
}

weft_status weft_swiglu_backward(float *da, float *db, const float *dout, const float *a,
                                 const float *b, int64_t n) {
  WEFT_RETURN_IF_BAD_(weft_check_swiglu_backward_(weft_op_name_(__func__), da, db, dout, a, b, n));
#ifdef HAVE_AVX2_PATH
  if (use_avx2()) {
    swiglu_bwd_avx2(da, db, dout, a, b, n);
    return WEFT_OK;
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
  return WEFT_OK;
}

/* -------------------------------------------------------------- residual */

weft_status weft_residual_forward(float *out, const float *a, const float *b, int64_t n) {
  CHECK_SIZES(n);
  CHECK_PTR(out, n);
  CHECK_PTR(a, n);
  CHECK_PTR(b, n);
  int64_t i = 0;
  for (; i + VL <= n; i += VL) vstore(out + i, vload(a + i) + vload(b + i));
  for (; i < n; i++) out[i] = a[i] + b[i];
  return WEFT_OK;
}

weft_status weft_residual_backward(float *da, float *db, const float *dout, int64_t n) {
  CHECK_SIZES(n);
  CHECK_PTR(dout, n);
  float *dst[2] = {da, db};
  for (int k = 0; k < 2; k++) {
    float *x = dst[k];
    if (!x) continue;
    int64_t i = 0;
    for (; i + VL <= n; i += VL) vstore(x + i, vload(x + i) + vload(dout + i));
    for (; i < n; i++) x[i] += dout[i];
  }
  return WEFT_OK;
}
