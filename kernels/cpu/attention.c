/* kernels/cpu/attention.c — CPU fp32 causal / non-causal grouped-query
 * attention (layers.h), forward and backward, over blocks of ATT_BLOCK
 * query rows: per (batch, head) item, S = scale Q K^T by gemm.c's sgemm, a
 * row softmax with simd.h's row helpers (exp sums in double; forward saves
 * the log-sum-exp), then P V; backward recomputes P from the saved lse and
 * accumulates dQ, dK, dV with five GEMMs per block. The items run through
 * pool.h's weft_cpu_par_for_, each computed exactly as in a serial loop. */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "arg_checks.h"
#include "cpu_internal.h"
#include "kernels.h"
#include "layers.h"
#include "pool.h"
#include "simd.h"

/* Query rows per block. A causal block of rows [t0, t0 + nb) needs keys
 * [0, t0 + nb) only, so blocking skips most of the upper triangle; a
 * non-causal block reads all T keys. */
#define ATT_BLOCK 64

int64_t weft_attention_scratch_floats(int64_t T) {
  if (T <= 0) return 0;
  return 2 * (T < ATT_BLOCK ? T : ATT_BLOCK) * T;
}

/* The arguments of forward and backward (any element type), errors
 * naming op. */
static weft_status check_forward(const char *op, const void *out, const float *lse, const void *q,
                                 const void *k, const void *v, int64_t B, int64_t T, int64_t H,
                                 int64_t Hkv, int64_t hd, const void *scratch) {
  WEFT_RETURN_IF_BAD_(weft_check_attention_shape_(op, B, T, H, Hkv, hd));
  CHECK_PTR_AT(op, out, B * T * H * hd);
  CHECK_PTR_AT(op, lse, B * H * T);
  CHECK_PTR_AT(op, q, B * T * H * hd);
  CHECK_PTR_AT(op, k, B * T * Hkv * hd);
  CHECK_PTR_AT(op, v, B * T * Hkv * hd);
  CHECK_PTR_AT(op, scratch, B * H * hd > 0 ? weft_attention_scratch_floats(T) : 0);
  return WEFT_OK;
}

static weft_status check_backward(const char *op, const void *dq, const void *dk, const void *dv,
                                  const void *dout, const void *q, const void *k, const void *v,
                                  const float *lse, int64_t B, int64_t T, int64_t H, int64_t Hkv,
                                  int64_t hd, const void *scratch) {
  WEFT_RETURN_IF_BAD_(weft_check_attention_shape_(op, B, T, H, Hkv, hd));
  CHECK_PTR_AT(op, dq, B * T * H * hd);
  CHECK_PTR_AT(op, dk, B * T * Hkv * hd);
  CHECK_PTR_AT(op, dv, B * T * Hkv * hd);
  CHECK_PTR_AT(op, dout, B * T * H * hd);
  CHECK_PTR_AT(op, q, B * T * H * hd);
  CHECK_PTR_AT(op, k, B * T * Hkv * hd);
  CHECK_PTR_AT(op, v, B * T * Hkv * hd);
  CHECK_PTR_AT(op, lse, B * H * T);
  CHECK_PTR_AT(op, scratch, B * H * hd > 0 ? weft_attention_scratch_floats(T) : 0);
  return WEFT_OK;
}

/* What one (batch, head) item of forward or backward reads and writes. */
typedef struct att_args {
  float *out, *lse, *dq, *dk, *dv;
  const float *q, *k, *v, *dout, *lse_in;
  int64_t B, T, H, Hkv, hd;
  /* row strides (backend.h weft_attention_rows, resolved: never 0) of q,
   * k, v and of dq, dk, dv; out and dout rows are packed (H * hd) */
  int64_t lq, lk, lv, ldq, ldk, ldv;
  bool causal; /* keys 0..t for query t; else all T */
} att_args;

/* a's row strides from rows (NULL or 0: packed) */
static void set_rows(att_args *a, const weft_attention_rows *rows) {
  const int64_t wq = a->H * a->hd, wk = a->Hkv * a->hd;
  a->lq = rows && rows->q ? rows->q : wq;
  a->lk = rows && rows->k ? rows->k : wk;
  a->lv = rows && rows->v ? rows->v : wk;
  a->ldq = rows && rows->dq ? rows->dq : wq;
  a->ldk = rows && rows->dk ? rows->dk : wk;
  a->ldv = rows && rows->dv ? rows->dv : wk;
}

/* Forward of item (b, h), h a query head. */
static void att_forward_item(void *ctx, int64_t item, float *scratch) {
  const att_args *a = ctx;
  const int64_t T = a->T, H = a->H, hd = a->hd, b = item / H, h = item % H;
  const float scale = (float)(1.0 / sqrt((double)hd));
  const int64_t ldo = H * hd, lq = a->lq, lk = a->lk, lv = a->lv, group = H / a->Hkv;
  const int64_t g = h / group;
  const float *qb = a->q + b * T * lq + h * hd;
  const float *kb = a->k + b * T * lk + g * hd;
  const float *vb = a->v + b * T * lv + g * hd;
  float *ob = a->out + b * T * ldo + h * hd;
  float *lb = a->lse + (b * H + h) * T;
  for (int64_t t0 = 0; t0 < T; t0 += ATT_BLOCK) {
    const int64_t nb = T - t0 < ATT_BLOCK ? T - t0 : ATT_BLOCK, nk = a->causal ? t0 + nb : T;
    float *S = scratch; /* (nb, nk) */
    /* S = scale * Q[t0:t0+nb] K[0:nk]^T */
    weft_cpu_sgemm_run_(false, true, nb, nk, hd, scale, qb + t0 * lq, lq, kb, lk, 0.0f, S, nk);
    for (int64_t r = 0; r < nb; r++) {
      float *row = S + r * nk;
      const int64_t valid = a->causal ? t0 + r + 1 : T; /* keys 0..t, or all */
      const float mx = row_max_of(row, valid);
      double sum = row_exp_sum(row, row, valid, mx, 1.0f); /* row = exp(row - mx) */
      const vf4 inv = vset((float)(1.0 / sum));
      int64_t j = 0;
      for (; j + VL <= valid; j += VL) vstore(row + j, vload(row + j) * inv);
      if (j < valid) vstore_tail(row + j, vload_tail(row + j, valid - j, 0.0f) * inv, valid - j);
      memset(row + valid, 0, (size_t)(nk - valid) * sizeof(float));
      lb[t0 + r] = mx + (float)log(sum);
    }
    /* O[t0:t0+nb] = P V[0:nk] */
    weft_cpu_sgemm_run_(false, false, nb, hd, nk, 1.0f, S, nk, vb, lv, 0.0f, ob + t0 * ldo, ldo);
  }
}

/* Backward of item (b, g), g a kv head: its query heads in order (they
 * all accumulate into the same dK, dV rows). */
static void att_backward_item(void *ctx, int64_t item, float *scratch) {
  const att_args *a = ctx;
  const int64_t T = a->T, H = a->H, Hkv = a->Hkv, hd = a->hd, b = item / Hkv, g = item % Hkv;
  const float scale = (float)(1.0 / sqrt((double)hd));
  const int64_t ldo = H * hd, lq = a->lq, lk = a->lk, lv = a->lv, group = H / Hkv;
  const int64_t ldq = a->ldq, ldk = a->ldk, ldv = a->ldv;
  const int64_t bs = T < ATT_BLOCK ? T : ATT_BLOCK;
  for (int64_t h = g * group; h < (g + 1) * group; h++) {
    const float *qb = a->q + b * T * lq + h * hd, *dob = a->dout + b * T * ldo + h * hd;
    const float *kb = a->k + b * T * lk + g * hd, *vb = a->v + b * T * lv + g * hd;
    float *dqb = a->dq + b * T * ldq + h * hd;
    float *dkb = a->dk + b * T * ldk + g * hd, *dvb = a->dv + b * T * ldv + g * hd;
    const float *lb = a->lse_in + (b * H + h) * T;
    for (int64_t t0 = 0; t0 < T; t0 += ATT_BLOCK) {
      const int64_t nb = T - t0 < ATT_BLOCK ? T - t0 : ATT_BLOCK, nk = a->causal ? t0 + nb : T;
      float *P = scratch, *dP = scratch + bs * T; /* each (nb, nk) */
      /* recompute P = exp(scale * Q K^T - lse), zero above the diagonal
       * (causal) */
      weft_cpu_sgemm_run_(false, true, nb, nk, hd, scale, qb + t0 * lq, lq, kb, lk, 0.0f, P, nk);
      /* dP = dO V^T */
      weft_cpu_sgemm_run_(false, true, nb, nk, hd, 1.0f, dob + t0 * ldo, ldo, vb, lv, 0.0f, dP, nk);
      for (int64_t r = 0; r < nb; r++) {
        float *prow = P + r * nk, *drow = dP + r * nk;
        const int64_t valid = a->causal ? t0 + r + 1 : T;
        row_exp(prow, prow, valid, lb[t0 + r], 1.0f); /* P = exp(S - lse) */
        /* rowsum(P * dP) = dO . O, in double */
        const double dsum = row_dot_d(prow, drow, valid);
        const vf4 d = vset((float)dsum), sc = vset(scale);
        int64_t j = 0;
        /* dS (times the score scale, folded in here) */
        for (; j + VL <= valid; j += VL)
          vstore(drow + j, vload(prow + j) * (vload(drow + j) - d) * sc);
        if (j < valid)
          vstore_tail(drow + j,
                      vload_tail(prow + j, valid - j, 0.0f) *
                          (vload_tail(drow + j, valid - j, 0.0f) - d) * sc,
                      valid - j);
        memset(prow + valid, 0, (size_t)(nk - valid) * sizeof(float));
        memset(drow + valid, 0, (size_t)(nk - valid) * sizeof(float));
      }
      /* dV[0:nk] += P^T dO[t0:t0+nb] */
      weft_cpu_sgemm_run_(true, false, nk, hd, nb, 1.0f, P, nk, dob + t0 * ldo, ldo, 1.0f, dvb,
                          ldv);
      /* dQ[t0:t0+nb] = dS K[0:nk] */
      weft_cpu_sgemm_run_(false, false, nb, hd, nk, 1.0f, dP, nk, kb, lk, 0.0f, dqb + t0 * ldq,
                          ldq);
      /* dK[0:nk] += dS^T Q[t0:t0+nb] */
      weft_cpu_sgemm_run_(true, false, nk, hd, nb, 1.0f, dP, nk, qb + t0 * lq, lq, 1.0f, dkb, ldk);
    }
  }
}

/* ---- bf16 / f16 (backend.h attention_forward_dt / _backward_dt): per
 * item the head's slices are widened into f32 blocks (T x hd each, heap),
 * the f32 item above runs on them as a problem of one batch and one head,
 * and the results are rounded once into the 16-bit outputs: the f32
 * kernel's bits on the widened values (sgemm's sums do not depend on the
 * leading dims). dK and dV of a kv head sum over its query heads in f32
 * before they are rounded. */
typedef struct att_dt_args {
  att_args a; /* the 16-bit tensors' pointers (as float *, never read so) */
  weft_dtype dt;
  int failed; /* an item had no memory for its blocks (set atomically) */
} att_dt_args;

/* The (T x hd) slice of head h of a (B, T, heads, hd) tensor of dtype dt
 * with row stride ld, batch b, widened into dst (dense) or rounded from
 * it. */
static void head_slice(float *f32, const void *t, weft_dtype dt, bool widen, int64_t b, int64_t T,
                       int64_t ld, int64_t h, int64_t hd) {
  const size_t es = weft_dtype_size(dt);
  for (int64_t r = 0; r < T; r++) {
    char *row = (char *)t + (size_t)((b * T + r) * ld + h * hd) * es;
    if (widen)
      weft_cpu_to_f32_(f32 + r * hd, row, dt, hd);
    else
      weft_cpu_from_f32_(row, dt, f32 + r * hd, hd);
  }
}

static void att_forward_dt_item(void *ctx, int64_t item, float *scratch) {
  att_dt_args *d = ctx;
  const att_args *a = &d->a;
  const int64_t T = a->T, H = a->H, hd = a->hd, b = item / H, h = item % H;
  const int64_t g = h / (H / a->Hkv), n = T * hd;
  float *blk = malloc(sizeof(float) * 4 * (size_t)n);
  if (!blk) {
    __atomic_store_n(&d->failed, 1, __ATOMIC_RELAXED);
    return;
  }
  float *q = blk, *k = q + n, *v = k + n, *o = v + n;
  head_slice(q, a->q, d->dt, true, b, T, a->lq, h, hd);
  head_slice(k, a->k, d->dt, true, b, T, a->lk, g, hd);
  head_slice(v, a->v, d->dt, true, b, T, a->lv, g, hd);
  att_args one = {.out = o,
                  .lse = a->lse + (b * H + h) * T,
                  .q = q,
                  .k = k,
                  .v = v,
                  .B = 1,
                  .T = T,
                  .H = 1,
                  .Hkv = 1,
                  .hd = hd,
                  .causal = a->causal};
  set_rows(&one, NULL);
  att_forward_item(&one, 0, scratch);
  head_slice(o, a->out, d->dt, false, b, T, H * hd, h, hd);
  free(blk);
}

static void att_backward_dt_item(void *ctx, int64_t item, float *scratch) {
  att_dt_args *d = ctx;
  const att_args *a = &d->a;
  const int64_t T = a->T, H = a->H, Hkv = a->Hkv, hd = a->hd, b = item / Hkv, g = item % Hkv;
  const int64_t group = H / Hkv, n = T * hd;
  float *blk = malloc(sizeof(float) * 7 * (size_t)n);
  if (!blk) {
    __atomic_store_n(&d->failed, 1, __ATOMIC_RELAXED);
    return;
  }
  float *k = blk, *v = k + n, *dk = v + n, *dv = dk + n, *q = dv + n, *dout = q + n, *dq = dout + n;
  head_slice(k, a->k, d->dt, true, b, T, a->lk, g, hd);
  head_slice(v, a->v, d->dt, true, b, T, a->lv, g, hd);
  memset(dk, 0, sizeof(float) * 2 * (size_t)n); /* dk and dv */
  for (int64_t h = g * group; h < (g + 1) * group; h++) {
    head_slice(q, a->q, d->dt, true, b, T, a->lq, h, hd);
    head_slice(dout, a->dout, d->dt, true, b, T, H * hd, h, hd);
    att_args one = {.dq = dq,
                    .dk = dk,
                    .dv = dv,
                    .q = q,
                    .k = k,
                    .v = v,
                    .dout = dout,
                    .lse_in = a->lse_in + (b * H + h) * T,
                    .B = 1,
                    .T = T,
                    .H = 1,
                    .Hkv = 1,
                    .hd = hd,
                    .causal = a->causal};
    set_rows(&one, NULL);
    att_backward_item(&one, 0, scratch);
    head_slice(dq, a->dq, d->dt, false, b, T, a->ldq, h, hd);
  }
  head_slice(dk, a->dk, d->dt, false, b, T, a->ldk, g, hd);
  head_slice(dv, a->dv, d->dt, false, b, T, a->ldv, g, hd);
  free(blk);
}

static weft_status att_dt_done(const char *op, const att_dt_args *d) {
  if (d->failed)
    return weft_error_at(WEFT_ERR_OOM, op, "no memory for a head's widened blocks (%lld x %lld)",
                         (long long)d->a.T, (long long)d->a.hd);
  return WEFT_OK;
}

/* Forward and backward for tensors of dtype dt: f32 runs the items above
 * on the tensors themselves, bf16 / f16 the widening items (the same
 * arguments: att_dt_args starts with att_args). Errors name op. */
static weft_status forward(const char *op, weft_dtype dt, void *out, float *lse, const void *q,
                           const void *k, const void *v, int64_t B, int64_t T, int64_t H,
                           int64_t Hkv, int64_t hd, bool causal, const weft_attention_rows *rows,
                           void *scratch) {
  WEFT_RETURN_IF_BAD_(check_forward(op, out, lse, q, k, v, B, T, H, Hkv, hd, scratch));
  if (B * T * H == 0) return WEFT_OK;
  if (hd == 0) { /* no features: softmax over zeros, empty outputs */
    for (int64_t i = 0; i < B * H; i++)
      for (int64_t t = 0; t < T; t++) lse[i * T + t] = logf((float)(causal ? t + 1 : T));
    return WEFT_OK;
  }
  att_dt_args d = {.a = {.out = out,
                         .lse = lse,
                         .q = q,
                         .k = k,
                         .v = v,
                         .B = B,
                         .T = T,
                         .H = H,
                         .Hkv = Hkv,
                         .hd = hd,
                         .causal = causal},
                   .dt = dt};
  set_rows(&d.a, rows);
  weft_cpu_par_for_(B * H, dt == WEFT_F32 ? att_forward_item : att_forward_dt_item, &d, scratch,
                    weft_attention_scratch_floats(T));
  return att_dt_done(op, &d);
}

static weft_status backward(const char *op, weft_dtype dt, void *dq, void *dk, void *dv,
                            const void *dout, const void *q, const void *k, const void *v,
                            const float *lse, int64_t B, int64_t T, int64_t H, int64_t Hkv,
                            int64_t hd, bool causal, const weft_attention_rows *rows,
                            void *scratch) {
  WEFT_RETURN_IF_BAD_(
      check_backward(op, dq, dk, dv, dout, q, k, v, lse, B, T, H, Hkv, hd, scratch));
  att_args r = {.H = H, .Hkv = Hkv, .hd = hd};
  set_rows(&r, rows);
  /* zeros first where the f32 items add into dK and dV, or where no item
   * runs (the 16-bit items write theirs whole); row by row, as the rows
   * may be slices of wider ones */
  if (B * T * Hkv * hd > 0 && (dt == WEFT_F32 || B * T * H * hd == 0)) {
    const size_t es = weft_dtype_size(dt), bytes = (size_t)(Hkv * hd) * es;
    for (int64_t i = 0; i < B * T; i++) {
      memset((char *)dk + (size_t)(i * r.ldk) * es, 0, bytes);
      memset((char *)dv + (size_t)(i * r.ldv) * es, 0, bytes);
    }
  }
  if (B * T * H * hd == 0) return WEFT_OK;
  att_dt_args d = {.a = {.dq = dq,
                         .dk = dk,
                         .dv = dv,
                         .q = q,
                         .k = k,
                         .v = v,
                         .dout = dout,
                         .lse_in = lse,
                         .B = B,
                         .T = T,
                         .H = H,
                         .Hkv = Hkv,
                         .hd = hd,
                         .causal = causal},
                   .dt = dt};
  set_rows(&d.a, rows);
  weft_cpu_par_for_(B * Hkv, dt == WEFT_F32 ? att_backward_item : att_backward_dt_item, &d, scratch,
                    weft_attention_scratch_floats(T));
  return att_dt_done(op, &d);
}

weft_status weft_attention_forward(float *out, float *lse, const float *q, const float *k,
                                   const float *v, int64_t B, int64_t T, int64_t H, int64_t Hkv,
                                   int64_t hd, bool causal, float *scratch) {
  return forward(weft_op_name_(__func__), WEFT_F32, out, lse, q, k, v, B, T, H, Hkv, hd, causal,
                 NULL, scratch);
}

weft_status weft_attention_backward(float *dq, float *dk, float *dv, const float *dout,
                                    const float *q, const float *k, const float *v,
                                    const float *lse, int64_t B, int64_t T, int64_t H, int64_t Hkv,
                                    int64_t hd, bool causal, float *scratch) {
  return backward(weft_op_name_(__func__), WEFT_F32, dq, dk, dv, dout, q, k, v, lse, B, T, H, Hkv,
                  hd, causal, NULL, scratch);
}

weft_status weft_cpu_attention_forward_dt_(weft_dtype dt, void *out, float *lse, const void *q,
                                           const void *k, const void *v, int64_t B, int64_t T,
                                           int64_t H, int64_t Hkv, int64_t hd, bool causal,
                                           const weft_attention_rows *rows, void *scratch) {
  const char *op = "attention_forward_dt";
  WEFT_CHECK_STORAGE_DT_(op, dt);
  return forward(op, dt, out, lse, q, k, v, B, T, H, Hkv, hd, causal, rows, scratch);
}

weft_status weft_cpu_attention_backward_dt_(weft_dtype dt, void *dq, void *dk, void *dv,
                                            const void *dout, const void *q, const void *k,
                                            const void *v, const float *lse, const void *out,
                                            int64_t B, int64_t T, int64_t H, int64_t Hkv,
                                            int64_t hd, bool causal,
                                            const weft_attention_rows *rows, void *scratch) {
  const char *op = "attention_backward_dt";
  (void)out; /* rowsum(dO * O) is recomputed from P, as the f32 member does */
  WEFT_CHECK_STORAGE_DT_(op, dt);
  return backward(op, dt, dq, dk, dv, dout, q, k, v, lse, B, T, H, Hkv, hd, causal, rows, scratch);
}
