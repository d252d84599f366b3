/* kernels/cpu/gelu_vec.h — private to the kernels (not installed): GELU with
 * the tanh approximation (layers.h's WEFT_ACT_GELU_TANH) over a span of
 * floats, forward and backward,
 *
 *   gelu(x)  = 0.5 x (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3),
 *   gelu'(x) = 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2),  t = tanh(u),
 *
 * vectorised with AVX2 + FMA where the processor has both (chosen at run
 * time; see weft_gelu_vec_available_), else the scalar libm formulas.
 *
 * The vector path (gelu_vec.c) evaluates the algebraically equal, stable
 * forms 0.5 (1 + tanh u) = 1 / (1 + exp(-2u)) and 1 - t^2 = 4 s (1 - s)
 * (s that sigmoid) in double precision and rounds once to float: within
 * about 0.5 ulp of the exact function over the whole float range,
 * including the negative tail where 1 + tanhf(u) cancels in float (the
 * scalar path is ~200 ulps off at x = -3 and gives 0 from x ~ -5.4 on,
 * where the true value is still a normal float). Each element is computed
 * independently of its neighbours and of its position in the span (tails
 * go through the same vector code on a masked vector), so splitting a
 * span into chunks, e.g. over threads, gives the same bits.
 *
 * Special values (vector path): gelu(+inf) = +inf, gelu(-inf) = -0,
 * gelu(NaN) = NaN; gelu'(+inf) = 1, gelu'(-inf) = 0, gelu'(NaN) = NaN;
 * large finite |x| gives gelu(x) = x or -0 and gelu'(x) = 1 or a zero,
 * never NaN. (The scalar path gives NaN for gelu(-inf):
 * -inf * (1 + tanhf(-inf)) = -inf * 0.) Denormal inputs and results are computed as such (no
 * flush-to-zero is assumed; with FTZ/DAZ set by the caller they flush). */
#ifndef WEFT_CPU_GELU_VEC_H
#define WEFT_CPU_GELU_VEC_H

#include <stdbool.h>
#include <stdint.h>

/* out[i] = gelu(inp[i]) for i < n (n <= 0: nothing). out may equal inp
 * (no other overlap). */
void weft_gelu_tanh_forward_span_(float *out, const float *inp, int64_t n);

/* d = dout[i] * gelu'(inp[i]); dinp[i] = dinp[i] + d when accumulate,
 * else dinp[i] = d, for i < n (n <= 0: nothing). dinp may equal dout or
 * inp (no other overlap). The vector path forms dout * gelu' (+ dinp) in
 * double and rounds once. */
void weft_gelu_tanh_backward_span_(float *dinp, const float *dout, const float *inp, int64_t n,
                                   bool accumulate);

/* Whether the two functions above take the AVX2 + FMA path on this
 * processor (false on other architectures, and in builds with
 * -DWEFT_NO_AVX2_PATH). Decided once. */
bool weft_gelu_vec_available_(void);

/* The scalar path, exported for tests and used where the vector path is
 * not available: exactly the libm formulas of norm_act.c's act_value /
 * act_grad for WEFT_ACT_GELU_TANH, in float with tanhf. Same contracts as
 * the span functions. */
void weft_gelu_tanh_forward_scalar_(float *out, const float *inp, int64_t n);
void weft_gelu_tanh_backward_scalar_(float *dinp, const float *dout, const float *inp, int64_t n,
                                     bool accumulate);

#endif /* WEFT_CPU_GELU_VEC_H */
