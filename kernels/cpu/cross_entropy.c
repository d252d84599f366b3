/* kernels/cpu/cross_entropy.c — CPU fp32 cross-entropy (layers.h): the
 * whole-vocabulary loss and gradient, and the local pieces of the
 * vocab-sharded (loss-parallel) form, whose max / sum / target reductions
 * over the ranks the caller performs between them (local_max,
 * local_target, local_sumexp, finish, backward_local). Row maxima and
 * exp sums use simd.h's row helpers (sums in double); the mean loss is
 * summed in double over fixed chunks of rows (below). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "arg_checks.h"
#include "cpu_internal.h"
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
 * on the thread count.
 *
 * Logits of dtype bf16 / f16 (the _dt entry points below) are widened one
 * row at a time into a chunk's own buffer and go through the same f32 row
 * code, so their results are the f32 kernel's bits on the widened values;
 * a 16-bit gradient row is computed in f32 and rounded once. */

typedef struct ce_args {
  float *lse;
  void *out; /* row_max / sumexp (f32), or dlogits (dtype dt) */
  const void *logits;
  const float *gmax, *lse_in;
  const int32_t *targets;
  weft_dtype dt;
  int64_t V, v0, grain;
  float scale;
  int failed; /* a chunk had no memory for its widened rows (set atomically) */
  double part[WEFT_CPU_MAX_PARTIALS];
} ce_args;

/* Row n of the logits as f32: in place for f32, else widened into buf. */
static const float *ce_row(const ce_args *a, int64_t n, float *buf) {
  if (a->dt == WEFT_F32) return (const float *)a->logits + n * a->V;
  const size_t es = weft_dtype_size(a->dt);
  weft_cpu_to_f32_(buf, (const char *)a->logits + (size_t)(n * a->V) * es, a->dt, a->V);
  return buf;
}

/* A chunk's row buffer(s) of `rows` x V floats; NULL (no buffer needed)
 * for f32. Sets a->failed when there is no memory. */
static float *ce_buffer(ce_args *a, int rows, bool *ok) {
  *ok = true;
  if (a->dt == WEFT_F32) return NULL;
  float *b = malloc(sizeof(float) * (size_t)rows * (size_t)(a->V > 0 ? a->V : 1));
  if (!b) {
    __atomic_store_n(&a->failed, 1, __ATOMIC_RELAXED);
    *ok = false;
  }
  return b;
}

static void ce_forward_rows(void *ctx, int64_t lo, int64_t hi) {
  ce_args *a = ctx;
  const int64_t V = a->V;
  bool ok;
  float *buf = ce_buffer(a, 1, &ok);
  if (!ok) return;
  double total = 0.0;
  for (int64_t n = lo; n < hi; n++) {
    const float *row = ce_row(a, n, buf);
    const float mx = row_max_of(row, V);
    double sum = row_exp_sum(NULL, row, V, mx, 1.0f);
    double l = (double)mx + log(sum);
    if (a->lse) a->lse[n] = (float)l;
    total += l - (double)row[a->targets[n]];
  }
  a->part[lo / a->grain] = total;
  free(buf);
}

static void ce_max_rows(void *ctx, int64_t lo, int64_t hi) {
  ce_args *a = ctx;
  bool ok;
  float *buf = ce_buffer(a, 1, &ok);
  if (!ok) return;
  for (int64_t n = lo; n < hi; n++)
    ((float *)a->out)[n] = a->V > 0 ? row_max_of(ce_row(a, n, buf), a->V) : -INFINITY;
  free(buf);
}

static void ce_sumexp_rows(void *ctx, int64_t lo, int64_t hi) {
  ce_args *a = ctx;
  bool ok;
  float *buf = ce_buffer(a, 1, &ok);
  if (!ok) return;
  for (int64_t n = lo; n < hi; n++)
    ((float *)a->out)[n] = (float)row_exp_sum(NULL, ce_row(a, n, buf), a->V, a->gmax[n], 1.0f);
  free(buf);
}

static void ce_backward_rows(void *ctx, int64_t lo, int64_t hi) {
  ce_args *a = ctx;
  const int64_t nv = a->V;
  bool ok;
  float *buf = ce_buffer(a, 2, &ok); /* the widened row, then its gradient */
  if (!ok) return;
  const size_t es = weft_dtype_size(a->dt);
  for (int64_t n = lo; n < hi; n++) {
    const float *row = ce_row(a, n, buf);
    char *dst = (char *)a->out + (size_t)(n * nv) * es;
    float *drow = a->dt == WEFT_F32 ? (float *)dst : buf + nv;
    row_exp(drow, row, nv, a->lse_in[n], a->scale); /* drow = exp(row - lse) * scale */
    int64_t t = (int64_t)a->targets[n] - a->v0;
    if (t >= 0 && t < nv) drow[t] -= a->scale;
    if (a->dt != WEFT_F32) weft_cpu_from_f32_(dst, a->dt, drow, nv);
  }
  free(buf);
}

static weft_status ce_done(const char *op, const ce_args *a) {
  if (a->failed)
    return weft_error_at(WEFT_ERR_OOM, op, "no memory for a row of %lld logits widened to f32",
                         (long long)a->V);
  return WEFT_OK;
}

/* ---- the members, each for f32 (layers.h) and for a storage dtype dt
 * (backend.h's _dt members; errors name `op`) */

static weft_status ce_forward(const char *op, weft_dtype dt, double *loss, float *lse,
                              const void *logits, const int32_t *targets, int64_t N, int64_t V) {
  CHECK_SIZES_AT(op, N, V);
  CHECK_PTR_AT(op, loss, 1);
  CHECK_PTR_AT(op, logits, N * V);
  CHECK_PTR_AT(op, targets, N);
  if (V == 0 && N > 0) return weft_error_at(WEFT_ERR_INVALID, op, "V = 0: no classes");
  WEFT_CHECK(check_targets(op, targets, N, V));
  /* one partial sum per fixed chunk of rows, added in chunk order */
  ce_args a = {.lse = lse, .logits = logits, .targets = targets, .dt = dt, .V = V};
  a.grain = weft_cpu_partial_grain_(N, V);
  weft_cpu_par_range_(N, a.grain, ce_forward_rows, &a);
  WEFT_CHECK(ce_done(op, &a));
  double total = 0.0;
  for (int64_t c = 0; c * a.grain < N; c++) total += a.part[c];
  *loss = N > 0 ? total / (double)N : 0.0;
  return WEFT_OK;
}

static weft_status ce_backward_local(const char *op, weft_dtype dt, void *dlogits_local,
                                     const void *logits_local, const float *lse,
                                     const int32_t *targets, int64_t N, int64_t v0, int64_t nv,
                                     float scale) {
  CHECK_SIZES_AT(op, N, v0, nv);
  CHECK_PTR_AT(op, dlogits_local, N * nv);
  CHECK_PTR_AT(op, logits_local, N * nv);
  CHECK_PTR_AT(op, lse, N);
  CHECK_PTR_AT(op, targets, N);
  WEFT_CHECK(check_targets(op, targets, N, -1));
  ce_args a = {.out = dlogits_local,
               .logits = logits_local,
               .lse_in = lse,
               .targets = targets,
               .dt = dt,
               .V = nv,
               .v0 = v0,
               .scale = scale};
  weft_cpu_par_range_(N, weft_cpu_partial_grain_(N, nv), ce_backward_rows, &a);
  return ce_done(op, &a);
}

static weft_status ce_backward(const char *op, weft_dtype dt, void *dlogits, const void *logits,
                               const float *lse, const int32_t *targets, int64_t N, int64_t V,
                               float scale) {
  CHECK_SIZES_AT(op, N, V);
  CHECK_PTR_AT(op, targets, N);
  WEFT_CHECK(check_targets(op, targets, N, V));
  return ce_backward_local(op, dt, dlogits, logits, lse, targets, N, 0, V, scale);
}

static weft_status ce_local_max(const char *op, weft_dtype dt, float *row_max,
                                const void *logits_local, int64_t N, int64_t nv) {
  CHECK_SIZES_AT(op, N, nv);
  CHECK_PTR_AT(op, row_max, N);
  CHECK_PTR_AT(op, logits_local, N * nv);
  ce_args a = {.out = row_max, .logits = logits_local, .dt = dt, .V = nv};
  weft_cpu_par_range_(N, weft_cpu_partial_grain_(N, nv), ce_max_rows, &a);
  return ce_done(op, &a);
}

static weft_status ce_local_target(const char *op, weft_dtype dt, float *target_logit,
                                   const void *logits_local, const int32_t *targets, int64_t N,
                                   int64_t v0, int64_t nv) {
  CHECK_SIZES_AT(op, N, v0, nv);
  CHECK_PTR_AT(op, target_logit, N);
  CHECK_PTR_AT(op, logits_local, N * nv);
  CHECK_PTR_AT(op, targets, N);
  WEFT_CHECK(check_targets(op, targets, N, -1));
  const size_t es = weft_dtype_size(dt);
  for (int64_t n = 0; n < N; n++) {
    int64_t j = (int64_t)targets[n] - v0;
    target_logit[n] = 0.0f;
    if (j >= 0 && j < nv)
      weft_cpu_to_f32_(&target_logit[n], (const char *)logits_local + (size_t)(n * nv + j) * es, dt,
                       1);
  }
  return WEFT_OK;
}

static weft_status ce_local_sumexp(const char *op, weft_dtype dt, float *sumexp,
                                   const void *logits_local, const float *gmax, int64_t N,
                                   int64_t nv) {
  CHECK_SIZES_AT(op, N, nv);
  CHECK_PTR_AT(op, sumexp, N);
  CHECK_PTR_AT(op, logits_local, N * nv);
  CHECK_PTR_AT(op, gmax, N);
  ce_args a = {.out = sumexp, .logits = logits_local, .gmax = gmax, .dt = dt, .V = nv};
  weft_cpu_par_range_(N, weft_cpu_partial_grain_(N, nv), ce_sumexp_rows, &a);
  return ce_done(op, &a);
}

#define OP weft_op_name_(__func__)

weft_status weft_cross_entropy_forward(double *loss, float *lse, const float *logits,
                                       const int32_t *targets, int64_t N, int64_t V) {
  return ce_forward(OP, WEFT_F32, loss, lse, logits, targets, N, V);
}

weft_status weft_cross_entropy_backward(float *dlogits, const float *logits, const float *lse,
                                        const int32_t *targets, int64_t N, int64_t V, float scale) {
  return ce_backward(OP, WEFT_F32, dlogits, logits, lse, targets, N, V, scale);
}

weft_status weft_cross_entropy_local_max(float *row_max, const float *logits_local, int64_t N,
                                         int64_t nv) {
  return ce_local_max(OP, WEFT_F32, row_max, logits_local, N, nv);
}

weft_status weft_cross_entropy_local_target(float *target_logit, const float *logits_local,
                                            const int32_t *targets, int64_t N, int64_t v0,
                                            int64_t nv) {
  return ce_local_target(OP, WEFT_F32, target_logit, logits_local, targets, N, v0, nv);
}

weft_status weft_cross_entropy_local_sumexp(float *sumexp, const float *logits_local,
                                            const float *gmax, int64_t N, int64_t nv) {
  return ce_local_sumexp(OP, WEFT_F32, sumexp, logits_local, gmax, N, nv);
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
  return ce_backward_local(OP, WEFT_F32, dlogits_local, logits_local, lse, targets, N, v0, nv,
                           scale);
}

/* bf16 / f16 (backend.h cross_entropy_*_dt); f32 is the members above */

weft_status weft_cpu_cross_entropy_forward_dt_(weft_dtype dt, double *loss, float *lse,
                                               const void *logits, const int32_t *targets,
                                               int64_t N, int64_t V) {
  WEFT_CHECK_STORAGE_DT_("cross_entropy_forward_dt", dt);
  return ce_forward("cross_entropy_forward_dt", dt, loss, lse, logits, targets, N, V);
}

weft_status weft_cpu_cross_entropy_backward_dt_(weft_dtype dt, void *dlogits, const void *logits,
                                                const float *lse, const int32_t *targets, int64_t N,
                                                int64_t V, float scale) {
  WEFT_CHECK_STORAGE_DT_("cross_entropy_backward_dt", dt);
  return ce_backward("cross_entropy_backward_dt", dt, dlogits, logits, lse, targets, N, V, scale);
}

weft_status weft_cpu_cross_entropy_local_max_dt_(weft_dtype dt, float *row_max,
                                                 const void *logits_local, int64_t N, int64_t nv) {
  WEFT_CHECK_STORAGE_DT_("cross_entropy_local_max_dt", dt);
  return ce_local_max("cross_entropy_local_max_dt", dt, row_max, logits_local, N, nv);
}

weft_status weft_cpu_cross_entropy_local_target_dt_(weft_dtype dt, float *target_logit,
                                                    const void *logits_local,
                                                    const int32_t *targets, int64_t N, int64_t v0,
                                                    int64_t nv) {
  WEFT_CHECK_STORAGE_DT_("cross_entropy_local_target_dt", dt);
  return ce_local_target("cross_entropy_local_target_dt", dt, target_logit, logits_local, targets,
                         N, v0, nv);
}

weft_status weft_cpu_cross_entropy_local_sumexp_dt_(weft_dtype dt, float *sumexp,
                                                    const void *logits_local, const float *gmax,
                                                    int64_t N, int64_t nv) {
  WEFT_CHECK_STORAGE_DT_("cross_entropy_local_sumexp_dt", dt);
  return ce_local_sumexp("cross_entropy_local_sumexp_dt", dt, sumexp, logits_local, gmax, N, nv);
}

weft_status weft_cpu_cross_entropy_backward_local_dt_(weft_dtype dt, void *dlogits_local,
                                                      const void *logits_local, const float *lse,
                                                      const int32_t *targets, int64_t N, int64_t v0,
                                                      int64_t nv, float scale) {
  WEFT_CHECK_STORAGE_DT_("cross_entropy_backward_local_dt", dt);
  return ce_backward_local("cross_entropy_backward_local_dt", dt, dlogits_local, logits_local, lse,
                           targets, N, v0, nv, scale);
}
