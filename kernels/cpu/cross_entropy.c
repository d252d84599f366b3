/* kernels/cpu/cross_entropy.c — CPU fp32 cross-entropy (layers.h): the
 * whole-vocabulary loss and gradient, and the local pieces of the
 * vocab-sharded (loss-parallel) form, whose max / sum / target reductions
 * over the ranks the caller performs between them (local_max,
 * local_target, local_sumexp, finish, backward_local). Row maxima and
 * exp sums use simd.h's row helpers (sums in double); the mean loss is
 * summed in double over fixed chunks of rows (below). */
#include <math.h>
#include <stdint.h>

#include "arg_checks.h"
#include "layers.h"
#include "pool.h"
#include "simd.h"

/* Errors name the operation, as every backend's do (arg_checks.h):
 * "cross_entropy_forward: ...", not the C function. */
#undef weft_error
#define weft_error(st, ...) weft_error_at((st), weft_op_name_(__func__), __VA_ARGS__)

/* Targets in [0, V), or (V < 0, the vocab-sharded pieces) only >= 0. */
static weft_status check_targets(const char *op, const int32_t *targets, int64_t N, int64_t V) {
  for (int64_t n = 0; n < N; n++)
    if (targets[n] < 0 || (V >= 0 && targets[n] >= V))
      return V >= 0 ? weft_error_at(WEFT_ERR_INVALID, op,
                                    "targets[%lld] = %d is outside the vocabulary [0, %lld)",
                                    (long long)n, targets[n], (long long)V)
                    : weft_error_at(WEFT_ERR_INVALID, op, "targets[%lld] = %d is negative",
                                    (long long)n, targets[n]);
  return WEFT_OK;
}

/* The CPU threads take fixed chunks of rows (pool.h), each computed as in
 * the serial loop; the forward's loss adds one partial per chunk in chunk
 * order (at most WEFT_CPU_MAX_PARTIALS chunks), so the bits do not depend
 * on the thread count. */

typedef struct ce_args {
  float *lse, *out;
  const float *logits, *gmax, *lse_in;
  const int32_t *targets;
  int64_t V, v0, grain;
  float scale;
  double part[WEFT_CPU_MAX_PARTIALS];
} ce_args;

static void ce_forward_rows(void *ctx, int64_t lo, int64_t hi) {
  ce_args *a = ctx;
  const int64_t V = a->V;
  double total = 0.0;
  for (int64_t n = lo; n < hi; n++) {
    const float *row = a->logits + n * V;
    const float mx = row_max_of(row, V);
    double sum = row_exp_sum(NULL, row, V, mx, 1.0f);
    double l = (double)mx + log(sum);
    if (a->lse) a->lse[n] = (float)l;
    total += l - (double)row[a->targets[n]];
  }
  a->part[lo / a->grain] = total;
}

static void ce_max_rows(void *ctx, int64_t lo, int64_t hi) {
  const ce_args *a = ctx;
  for (int64_t n = lo; n < hi; n++)
    a->out[n] = a->V > 0 ? row_max_of(a->logits + n * a->V, a->V) : -INFINITY;
}

static void ce_sumexp_rows(void *ctx, int64_t lo, int64_t hi) {
  const ce_args *a = ctx;
  for (int64_t n = lo; n < hi; n++)
    a->out[n] = (float)row_exp_sum(NULL, a->logits + n * a->V, a->V, a->gmax[n], 1.0f);
}

static void ce_backward_rows(void *ctx, int64_t lo, int64_t hi) {
  const ce_args *a = ctx;
  const int64_t nv = a->V;
  for (int64_t n = lo; n < hi; n++) {
    const float *row = a->logits + n * nv;
    float *drow = a->out + n * nv;
    row_exp(drow, row, nv, a->lse_in[n], a->scale); /* drow = exp(row - lse) * scale */
    int64_t t = (int64_t)a->targets[n] - a->v0;
    if (t >= 0 && t < nv) drow[t] -= a->scale;
  }
}

weft_status weft_cross_entropy_forward(double *loss, float *lse, const float *logits,
                                       const int32_t *targets, int64_t N, int64_t V) {
  CHECK_SIZES(N, V);
  CHECK_PTR(loss, 1);
  CHECK_PTR(logits, N * V);
  CHECK_PTR(targets, N);
  if (V == 0 && N > 0) return weft_error(WEFT_ERR_INVALID, "V = 0: no classes");
  WEFT_CHECK(check_targets(weft_op_name_(__func__), targets, N, V));
  /* one partial sum per fixed chunk of rows, added in chunk order */
  ce_args a = {.lse = lse, .logits = logits, .targets = targets, .V = V};
  a.grain = weft_cpu_partial_grain_(N, V);
  weft_cpu_par_range_(N, a.grain, ce_forward_rows, &a);
  double total = 0.0;
  for (int64_t c = 0; c * a.grain < N; c++) total += a.part[c];
  *loss = N > 0 ? total / (double)N : 0.0;
  return WEFT_OK;
}

weft_status weft_cross_entropy_backward(float *dlogits, const float *logits, const float *lse,
                                        const int32_t *targets, int64_t N, int64_t V, float scale) {
  CHECK_SIZES(N, V);
  CHECK_PTR(dlogits, N * V);
  CHECK_PTR(logits, N * V);
  CHECK_PTR(lse, N);
  CHECK_PTR(targets, N);
  WEFT_CHECK(check_targets(weft_op_name_(__func__), targets, N, V));
  return weft_cross_entropy_backward_local(dlogits, logits, lse, targets, N, 0, V, scale);
}

weft_status weft_cross_entropy_local_max(float *row_max, const float *logits_local, int64_t N,
                                         int64_t nv) {
  CHECK_SIZES(N, nv);
  CHECK_PTR(row_max, N);
  CHECK_PTR(logits_local, N * nv);
  ce_args a = {.out = row_max, .logits = logits_local, .V = nv};
  weft_cpu_par_range_(N, weft_cpu_partial_grain_(N, nv), ce_max_rows, &a);
  return WEFT_OK;
}

weft_status weft_cross_entropy_local_target(float *target_logit, const float *logits_local,
                                            const int32_t *targets, int64_t N, int64_t v0,
                                            int64_t nv) {
  CHECK_SIZES(N, v0, nv);
  CHECK_PTR(target_logit, N);
  CHECK_PTR(logits_local, N * nv);
  CHECK_PTR(targets, N);
  WEFT_CHECK(check_targets(weft_op_name_(__func__), targets, N, -1));
  for (int64_t n = 0; n < N; n++) {
    int64_t j = (int64_t)targets[n] - v0;
    target_logit[n] = (j >= 0 && j < nv) ? logits_local[n * nv + j] : 0.0f;
  }
  return WEFT_OK;
}

weft_status weft_cross_entropy_local_sumexp(float *sumexp, const float *logits_local,
                                            const float *gmax, int64_t N, int64_t nv) {
  CHECK_SIZES(N, nv);
  CHECK_PTR(sumexp, N);
  CHECK_PTR(logits_local, N * nv);
  CHECK_PTR(gmax, N);
  ce_args a = {.out = sumexp, .logits = logits_local, .gmax = gmax, .V = nv};
  weft_cpu_par_range_(N, weft_cpu_partial_grain_(N, nv), ce_sumexp_rows, &a);
  return WEFT_OK;
}

weft_status weft_cross_entropy_finish(double *loss, float *lse, const float *gmax,
                                      const float *gsum, const float *gtarget, int64_t N) {
  CHECK_SIZES(N);
  CHECK_PTR(loss, 1);
  CHECK_PTR(gmax, N);
  CHECK_PTR(gsum, N);
  CHECK_PTR(gtarget, N);
  for (int64_t n = 0; n < N; n++)
    if (!(gsum[n] > 0.0f))
      return weft_error(WEFT_ERR_INVALID, "sum of exponentials of row %lld is %g (must be > 0)",
                        (long long)n, (double)gsum[n]);
  double total = 0.0;
  for (int64_t n = 0; n < N; n++) {
    double l = (double)gmax[n] + log((double)gsum[n]);
    if (lse) lse[n] = (float)l;
    total += l - (double)gtarget[n];
  }
  *loss = N > 0 ? total / (double)N : 0.0;
  return WEFT_OK;
}

weft_status weft_cross_entropy_backward_local(float *dlogits_local, const float *logits_local,
                                              const float *lse, const int32_t *targets, int64_t N,
                                              int64_t v0, int64_t nv, float scale) {
  CHECK_SIZES(N, v0, nv);
  CHECK_PTR(dlogits_local, N * nv);
  CHECK_PTR(logits_local, N * nv);
  CHECK_PTR(lse, N);
  CHECK_PTR(targets, N);
  WEFT_CHECK(check_targets(weft_op_name_(__func__), targets, N, -1));
  ce_args a = {.out = dlogits_local,
               .logits = logits_local,
               .lse_in = lse,
               .targets = targets,
               .V = nv,
               .v0 = v0,
               .scale = scale};
  weft_cpu_par_range_(N, weft_cpu_partial_grain_(N, nv), ce_backward_rows, &a);
  return WEFT_OK;
}
