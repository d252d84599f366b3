/* kernels/cpu/linear.c — CPU fp32 linear layer (layers.h): forward
 * out = inp @ weight^T (+ bias) and backward (dinp, dweight, dbias), each
 * GEMM one call of gemm.c's weft_cpu_sgemm_run_ (OpenBLAS or the blocked
 * fallback); forward's bias is the GEMM's C (beta = 1), backward's dbias
 * summed row by row in index order. */
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "arg_checks.h"
#include "cpu_internal.h"
#include "kernels.h"
#include "layers.h"
#include "pool.h"

/* out[n, :] = bias for rows [lo, hi) (fixed chunks on the CPU threads,
 * pool.h): the GEMM then adds inp @ weight^T to it (beta = 1), so the bias
 * costs one write pass instead of a zeroing pass and an add pass. */
typedef struct bias_args {
  float *out;
  const float *bias;
  int64_t OC;
} bias_args;

static void bias_rows(void *ctx, int64_t lo, int64_t hi) {
  const bias_args *a = ctx;
  for (int64_t n = lo; n < hi; n++)
    memcpy(a->out + n * a->OC, a->bias, (size_t)a->OC * sizeof(float));
}

weft_status weft_linear_forward(float *out, const float *inp, const float *weight,
                                const float *bias, int64_t N, int64_t IC, int64_t OC) {
  CHECK_SIZES(N, IC, OC);
  CHECK_PTR(out, N * OC);
  CHECK_PTR(inp, N * IC);
  CHECK_PTR(weight, OC * IC);
  if (N == 0 || OC == 0) return WEFT_OK;
  if (bias) {
    bias_args a = {out, bias, OC};
    weft_cpu_par_range_(N, weft_cpu_row_grain_(OC), bias_rows, &a);
  }
  /* out (N, OC) = inp (N, IC) @ weight^T (IC, OC) (+ the bias already in out) */
  weft_cpu_sgemm_run_(false, true, N, OC, IC, 1.0f, inp, IC, weight, IC, bias ? 1.0f : 0.0f, out,
                      OC);
  return WEFT_OK;
}

weft_status weft_linear_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                                 const float *inp, const float *weight, int64_t N, int64_t IC,
                                 int64_t OC, bool accumulate_dinp, bool accumulate_dweight) {
  CHECK_SIZES(N, IC, OC);
  CHECK_PTR(dout, N * OC);
  if (dinp) CHECK_PTR(weight, OC * IC);
  if (dweight) CHECK_PTR(inp, N * IC);
  if (dinp && N * IC > 0) {
    /* dinp (N, IC) = dout (N, OC) @ weight (OC, IC) */
    weft_cpu_sgemm_run_(false, false, N, IC, OC, 1.0f, dout, OC, weight, IC,
                        accumulate_dinp ? 1.0f : 0.0f, dinp, IC);
  }
  if (dweight && OC * IC > 0) {
    /* dweight (OC, IC) = dout^T (OC, N) @ inp (N, IC) */
    weft_cpu_sgemm_run_(true, false, OC, IC, N, 1.0f, dout, OC, inp, IC,
                        accumulate_dweight ? 1.0f : 0.0f, dweight, IC);
  }
  if (dbias) {
    if (!accumulate_dweight) memset(dbias, 0, (size_t)OC * sizeof(float));
    for (int64_t n = 0; n < N; n++)
      for (int64_t o = 0; o < OC; o++) dbias[o] += dout[n * OC + o];
  }
  return WEFT_OK;
}
