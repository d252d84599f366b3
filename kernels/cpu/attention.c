/* kernels/cpu/attention.c — CPU fp32 causal / non-causal grouped-query
 * attention (layers.h), forward and backward, over blocks of ATT_BLOCK
 * query rows: per (batch, head) item, S = scale Q K^T by weft_sgemm, a
 * row softmax with simd.h's row helpers (exp sums in double; forward saves
 * the log-sum-exp), then P V; backward recomputes P from the saved lse and
 * accumulates dQ, dK, dV with five GEMMs per block. The items run through
 * pool.h's weft_cpu_par_for_, each computed exactly as in a serial loop. */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "arg_checks.h"
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

/* What one (batch, head) item of forward or backward reads and writes. */
typedef struct att_args {
  float *out, *lse, *dq, *dk, *dv;
  const float *q, *k, *v, *dout, *lse_in;
  int64_t B, T, H, Hkv, hd;
  bool causal; /* keys 0..t for query t; else all T */
} att_args;

/* Forward of item (b, h), h a query head. */
static void att_forward_item(void *ctx, int64_t item, float *scratch) {
  const att_args *a = ctx;
  const int64_t T = a->T, H = a->H, hd = a->hd, b = item / H, h = item % H;
  const float scale = (float)(1.0 / sqrt((double)hd));
  const int64_t ldq = H * hd, ldk = a->Hkv * hd, group = H / a->Hkv;
  const int64_t g = h / group;
  const float *qb = a->q + b * T * ldq + h * hd;
  const float *kb = a->k + b * T * ldk + g * hd;
  const float *vb = a->v + b * T * ldk + g * hd;
  float *ob = a->out + b * T * ldq + h * hd;
  float *lb = a->lse + (b * H + h) * T;
  for (int64_t t0 = 0; t0 < T; t0 += ATT_BLOCK) {
    const int64_t nb = T - t0 < ATT_BLOCK ? T - t0 : ATT_BLOCK, nk = a->causal ? t0 + nb : T;
    float *S = scratch; /* (nb, nk) */
    /* S = scale * Q[t0:t0+nb] K[0:nk]^T */
    weft_sgemm(false, true, nb, nk, hd, scale, qb + t0 * ldq, ldq, kb, ldk, 0.0f, S, nk);
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
    weft_sgemm(false, false, nb, hd, nk, 1.0f, S, nk, vb, ldk, 0.0f, ob + t0 * ldq, ldq);
  }
}

weft_status weft_attention_forward(float *out, float *lse, const float *q, const float *k,
                                   const float *v, int64_t B, int64_t T, int64_t H, int64_t Hkv,
                                   int64_t hd, bool causal, float *scratch) {
  WEFT_RETURN_IF_BAD_(weft_check_attention_shape_(weft_op_name_(__func__), B, T, H, Hkv, hd));
  CHECK_PTR(out, B * T * H * hd);
  CHECK_PTR(lse, B * H * T);
  CHECK_PTR(q, B * T * H * hd);
  CHECK_PTR(k, B * T * Hkv * hd);
  CHECK_PTR(v, B * T * Hkv * hd);
  CHECK_PTR(scratch, B * H * hd > 0 ? weft_attention_scratch_floats(T) : 0);
  if (B * T * H == 0) return WEFT_OK;
  if (hd == 0) { /* no features: softmax over zeros, empty outputs */
    for (int64_t i = 0; i < B * H; i++)
      for (int64_t t = 0; t < T; t++) lse[i * T + t] = logf((float)(causal ? t + 1 : T));
    return WEFT_OK;
  }
  att_args a = {.out = out,
                .lse = lse,
                .q = q,
                .k = k,
                .v = v,
                .B = B,
                .T = T,
                .H = H,
                .Hkv = Hkv,
                .hd = hd,
                .causal = causal};
  weft_cpu_par_for_(B * H, att_forward_item, &a, scratch, weft_attention_scratch_floats(T));
  return WEFT_OK;
}

/* Backward of item (b, g), g a kv head: its query heads in order (they
 * all accumulate into the same dK, dV rows). */
static void att_backward_item(void *ctx, int64_t item, float *scratch) {
  const att_args *a = ctx;
  const int64_t T = a->T, H = a->H, Hkv = a->Hkv, hd = a->hd, b = item / Hkv, g = item % Hkv;
  const float scale = (float)(1.0 / sqrt((double)hd));
  const int64_t ldq = H * hd, ldk = Hkv * hd, group = H / Hkv;
  const int64_t bs = T < ATT_BLOCK ? T : ATT_BLOCK;
  for (int64_t h = g * group; h < (g + 1) * group; h++) {
    const float *qb = a->q + b * T * ldq + h * hd, *dob = a->dout + b * T * ldq + h * hd;
    const float *kb = a->k + b * T * ldk + g * hd, *vb = a->v + b * T * ldk + g * hd;
    float *dqb = a->dq + b * T * ldq + h * hd;
    float *dkb = a->dk + b * T * ldk + g * hd, *dvb = a->dv + b * T * ldk + g * hd;
    const float *lb = a->lse_in + (b * H + h) * T;
    for (int64_t t0 = 0; t0 < T; t0 += ATT_BLOCK) {
      const int64_t nb = T - t0 < ATT_BLOCK ? T - t0 : ATT_BLOCK, nk = a->causal ? t0 + nb : T;
      float *P = scratch, *dP = scratch + bs * T; /* each (nb, nk) */
      /* recompute P = exp(scale * Q K^T - lse), zero above the diagonal
       * (causal) */
      weft_sgemm(false, true, nb, nk, hd, scale, qb + t0 * ldq, ldq, kb, ldk, 0.0f, P, nk);
      /* dP = dO V^T */
      weft_sgemm(false, true, nb, nk, hd, 1.0f, dob + t0 * ldq, ldq, vb, ldk, 0.0f, dP, nk);
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
      weft_sgemm(true, false, nk, hd, nb, 1.0f, P, nk, dob + t0 * ldq, ldq, 1.0f, dvb, ldk);
      /* dQ[t0:t0+nb] = dS K[0:nk] */
      weft_sgemm(false, false, nb, hd, nk, 1.0f, dP, nk, kb, ldk, 0.0f, dqb + t0 * ldq, ldq);
      /* dK[0:nk] += dS^T Q[t0:t0+nb] */
      weft_sgemm(true, false, nk, hd, nb, 1.0f, dP, nk, qb + t0 * ldq, ldq, 1.0f, dkb, ldk);
    }
  }
}

weft_status weft_attention_backward(float *dq, float *dk, float *dv, const float *dout,
                                    const float *q, const float *k, const float *v,
                                    const float *lse, int64_t B, int64_t T, int64_t H, int64_t Hkv,
                                    int64_t hd, bool causal, float *scratch) {
  WEFT_RETURN_IF_BAD_(weft_check_attention_shape_(weft_op_name_(__func__), B, T, H, Hkv, hd));
  CHECK_PTR(dq, B * T * H * hd);
  CHECK_PTR(dk, B * T * Hkv * hd);
  CHECK_PTR(dv, B * T * Hkv * hd);
  CHECK_PTR(dout, B * T * H * hd);
  CHECK_PTR(q, B * T * H * hd);
  CHECK_PTR(k, B * T * Hkv * hd);
  CHECK_PTR(v, B * T * Hkv * hd);
  CHECK_PTR(lse, B * H * T);
  CHECK_PTR(scratch, B * H * hd > 0 ? weft_attention_scratch_floats(T) : 0);
  if (B * T * Hkv * hd > 0) {
    memset(dk, 0, (size_t)(B * T * Hkv * hd) * sizeof(float));
    memset(dv, 0, (size_t)(B * T * Hkv * hd) * sizeof(float));
  }
  if (B * T * H * hd == 0) return WEFT_OK;
  att_args a = {.dq = dq,
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
                .causal = causal};
  weft_cpu_par_for_(B * Hkv, att_backward_item, &a, scratch, weft_attention_scratch_floats(T));
  return WEFT_OK;
}
