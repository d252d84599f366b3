/* Layer kernels (kernels/layers.h) against independent double-precision
 * references written here from the formulas:
 * - forward: the fp32 kernel against the naive double formula;
 * - backward: the fp32 kernel's gradients of L = sum(out * R) (R random)
 *   against central finite differences of the double reference.
 * Inputs are random floats (seeded; WEFT_TEST_SEED overrides) on odd shapes.
 * Errors are normalised, ||got - want|| / ||want||, as ggml's backend test. */
#include <criterion/criterion.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h" /* weft_cpu_set_num_threads */
#include "harness.h"
#include "kernels.h"
#include "layers.h"

/* ---------------------------------------------------------------- helpers */

static uint64_t rng_state;
static unsigned long seed_used;

/* One seeded stream (harness.h) for the whole test. */
static void rng_seed(unsigned long fallback) {
  seed_used = weft_test_seed(fallback);
  rng_state = weft_test_rng_state(seed_used);
}
static double urand(void) { return weft_test_rng_unit(&rng_state); } /* [0, 1) */
static int32_t irand(int32_t n) { return (int32_t)(urand() * n); }

/* n random floats in [lo, hi), with an exact double copy (either may be NULL). */
static void fill(float *f, double *d, int64_t n, double lo, double hi) {
  for (int64_t i = 0; i < n; i++) {
    float x = (float)(lo + (hi - lo) * urand());
    if (f) f[i] = x;
    if (d) d[i] = x;
  }
}
static float *fdup(const double *d, int64_t n) {
  float *f = malloc((n > 0 ? (size_t)n : 1) * sizeof *f);
  for (int64_t i = 0; i < n; i++) f[i] = (float)d[i];
  return f;
}
static double *dalloc(int64_t n) { return calloc(n > 0 ? (size_t)n : 1, sizeof(double)); }
static float *falloc(int64_t n) { return calloc(n > 0 ? (size_t)n : 1, sizeof(float)); }

/* ||got - want|| / ||want|| and the worst element; fails above tol. */
static double expect_close_(const char *what, const float *got, const double *want, int64_t n,
                            double tol, const char *file, int line) {
  double worst = -1;
  int64_t wi = 0;
  for (int64_t i = 0; i < n; i++) {
    double e = fabs((double)got[i] - want[i]);
    if (e > worst) {
      worst = e;
      wi = i;
    }
  }
  double rel = weft_test_rel_norm_f32_f64(got, want, n);
  cr_expect(rel <= tol,
            "%s:%d %s: normalised error %.3g > %.3g (seed %lu); worst [%lld]: got %.9g want %.9g",
            file, line, what, rel, tol, seed_used, (long long)wi, n ? (double)got[wi] : 0.0,
            n ? want[wi] : 0.0);
  return rel;
}
#define EXPECT_CLOSE(what, got, want, n, tol) \
  expect_close_(what, got, want, n, tol, __FILE__, __LINE__)

/* Central differences of f at x[i] for every i in idx (or all if idx NULL). */
typedef double (*loss_fn)(void *ctx);
static void fd_grad(loss_fn f, void *ctx, double *x, int64_t n, double h, double *g) {
  for (int64_t i = 0; i < n; i++) {
    double old = x[i];
    x[i] = old + h;
    double lp = f(ctx);
    x[i] = old - h;
    double lm = f(ctx);
    x[i] = old;
    g[i] = (lp - lm) / (2 * h);
  }
}
/* Only at `m` random coordinates (for the larger shapes): g_sel gets the
 * differences there and got_sel the matching entries of `got`. */
static void fd_grad_sampled(loss_fn f, void *ctx, double *x, int64_t n, double h, const float *got,
                            int64_t m, float *got_sel, double *g_sel) {
  for (int64_t s = 0; s < m; s++) {
    int64_t i = (int64_t)(urand() * (double)n);
    double old = x[i];
    x[i] = old + h;
    double lp = f(ctx);
    x[i] = old - h;
    double lm = f(ctx);
    x[i] = old;
    g_sel[s] = (lp - lm) / (2 * h);
    got_sel[s] = got[i];
  }
}

static double dot_d(const double *a, const double *b, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
  return s;
}

#define FD_H 1e-5
#define FWD_TOL 1e-6 /* fp32 forward vs double */
#define BWD_TOL 2e-6 /* fp32 backward vs double finite differences */

/* --------------------------------------------------------------- embedding */

Test(layers, embedding_forward_backward_match_naive) {
  rng_seed(101);
  const int64_t N = 13, V = 11, C = 5;
  int32_t tok[13];
  for (int i = 0; i < N; i++) tok[i] = irand((int32_t)V);
  tok[3] = tok[7] = tok[11]; /* repeats must add up in backward */
  float *w = falloc(V * C), *out = falloc(N * C), *dout = falloc(N * C), *dw = falloc(V * C);
  double *want = dalloc(N * C), *dwant = dalloc(V * C);
  fill(w, NULL, V * C, -1, 1);
  fill(dout, NULL, N * C, -1, 1);
  fill(dw, NULL, V * C, -1, 1); /* accumulates into existing values */
  for (int64_t i = 0; i < V * C; i++) dwant[i] = dw[i];
  cr_assert_eq(weft_embedding_forward(out, tok, w, N, V, C), WEFT_OK, "%s", weft_last_error());
  for (int64_t n = 0; n < N; n++)
    for (int64_t c = 0; c < C; c++) {
      want[n * C + c] = w[tok[n] * C + c];
      dwant[tok[n] * C + c] += dout[n * C + c];
    }
  EXPECT_CLOSE("embedding out", out, want, N * C, 0.0);
  cr_assert_eq(weft_embedding_backward(dw, tok, dout, N, V, C), WEFT_OK);
  EXPECT_CLOSE("embedding dweight", dw, dwant, V * C, 1e-7);
  free(w);
  free(out);
  free(dout);
  free(dw);
  free(want);
  free(dwant);
}

Test(layers, embedding_vocab_range_shards_sum_to_full_lookup) {
  rng_seed(102);
  const int64_t N = 17, V = 13, C = 3;
  int32_t tok[17];
  for (int i = 0; i < N; i++) tok[i] = irand((int32_t)V);
  tok[0] = 0;
  tok[1] = (int32_t)V - 1;
  float *w = falloc(V * C), *full = falloc(N * C), *dout = falloc(N * C), *dfull = falloc(V * C);
  fill(w, NULL, V * C, -1, 1);
  fill(dout, NULL, N * C, -1, 1);
  cr_assert_eq(weft_embedding_forward(full, tok, w, N, V, C), WEFT_OK);
  cr_assert_eq(weft_embedding_backward(dfull, tok, dout, N, V, C), WEFT_OK);
  for (int64_t k = 2; k <= 4; k++) {
    double *sum = dalloc(N * C), *dcat = dalloc(V * C);
    float *part = falloc(N * C), *dloc = falloc(V * C);
    for (int64_t s = 0; s < k; s++) {
      int64_t v0, nv;
      weft_chunk_range(V, k, s, &v0, &nv);
      memset(part, 0xff, (size_t)(N * C) * sizeof(float)); /* NaNs: must all be overwritten */
      cr_assert_eq(weft_embedding_range_forward(part, tok, w + v0 * C, N, v0, nv, C), WEFT_OK);
      for (int64_t i = 0; i < N * C; i++) sum[i] += part[i];
      memset(dloc, 0, (size_t)(V * C) * sizeof(float));
      cr_assert_eq(weft_embedding_range_backward(dloc, tok, dout, N, v0, nv, C), WEFT_OK);
      for (int64_t i = 0; i < nv * C; i++) dcat[v0 * C + i] = dloc[i];
      for (int64_t i = nv * C; i < V * C; i++)
        cr_expect_eq(dloc[i], 0.0f, "shard %lld of %lld wrote past its %lld rows", (long long)s,
                     (long long)k, (long long)nv);
    }
    EXPECT_CLOSE("sum of shard lookups", full, sum, N * C, 0.0);
    EXPECT_CLOSE("concatenated shard grads", dfull, dcat, V * C, 0.0);
    free(sum);
    free(dcat);
    free(part);
    free(dloc);
  }
  free(w);
  free(full);
  free(dout);
  free(dfull);
}

Test(layers, embedding_rejects_tokens_outside_the_vocabulary) {
  const int32_t tok[3] = {0, 5, 2};
  float w[5 * 2] = {0}, out[6] = {7, 7, 7, 7, 7, 7};
  cr_expect_eq(weft_embedding_forward(out, tok, w, 3, 5, 2), WEFT_ERR_INVALID);
  cr_expect(strstr(weft_last_error(), "tokens[1] = 5") != NULL, "message: %s", weft_last_error());
  cr_expect_eq(out[0], 7.0f, "output written before the check");
  cr_expect_eq(weft_embedding_backward(w, tok, out, 3, 5, 2), WEFT_ERR_INVALID);
  const int32_t neg[2] = {1, -1};
  cr_expect_eq(weft_embedding_range_forward(out, neg, w, 2, 0, 5, 2), WEFT_ERR_INVALID);
  cr_expect_eq(weft_embedding_forward(NULL, tok, w, 3, 5, 2), WEFT_ERR_INVALID);
  cr_expect_eq(weft_embedding_forward(out, tok, w, -1, 5, 2), WEFT_ERR_INVALID);
}

/* ------------------------------------------------------------------ linear */

typedef struct lin_ctx {
  int64_t N, IC, OC;
  double *x, *w, *b, *R;
} lin_ctx;
static void lin_ref(const lin_ctx *c, double *y) {
  for (int64_t n = 0; n < c->N; n++)
    for (int64_t o = 0; o < c->OC; o++) {
      double s = c->b ? c->b[o] : 0;
      for (int64_t i = 0; i < c->IC; i++) s += c->x[n * c->IC + i] * c->w[o * c->IC + i];
      y[n * c->OC + o] = s;
    }
}
static double lin_loss(void *p) {
  lin_ctx *c = p;
  double *y = dalloc(c->N * c->OC);
  lin_ref(c, y);
  double l = dot_d(y, c->R, c->N * c->OC);
  free(y);
  return l;
}

Test(layers, linear_backward_matches_finite_differences) {
  rng_seed(201);
  lin_ctx c = {.N = 5, .IC = 7, .OC = 3};
  c.x = dalloc(c.N * c.IC);
  c.w = dalloc(c.OC * c.IC);
  c.b = dalloc(c.OC);
  c.R = dalloc(c.N * c.OC);
  fill(NULL, c.x, c.N * c.IC, -1, 1);
  fill(NULL, c.w, c.OC * c.IC, -1, 1);
  fill(NULL, c.b, c.OC, -1, 1);
  fill(NULL, c.R, c.N * c.OC, -1, 1);
  float *x = fdup(c.x, c.N * c.IC), *w = fdup(c.w, c.OC * c.IC), *b = fdup(c.b, c.OC);
  float *R = fdup(c.R, c.N * c.OC), *y = falloc(c.N * c.OC);
  double *yref = dalloc(c.N * c.OC);
  cr_assert_eq(weft_linear_forward(y, x, w, b, c.N, c.IC, c.OC), WEFT_OK, "%s", weft_last_error());
  lin_ref(&c, yref);
  EXPECT_CLOSE("linear out", y, yref, c.N * c.OC, FWD_TOL);

  float *dx = falloc(c.N * c.IC), *dw = falloc(c.OC * c.IC), *db = falloc(c.OC);
  cr_assert_eq(weft_linear_backward(dx, dw, db, R, x, w, c.N, c.IC, c.OC, false, false), WEFT_OK);
  double *gx = dalloc(c.N * c.IC), *gw = dalloc(c.OC * c.IC), *gb = dalloc(c.OC);
  fd_grad(lin_loss, &c, c.x, c.N * c.IC, FD_H, gx);
  fd_grad(lin_loss, &c, c.w, c.OC * c.IC, FD_H, gw);
  fd_grad(lin_loss, &c, c.b, c.OC, FD_H, gb);
  EXPECT_CLOSE("linear dinp", dx, gx, c.N * c.IC, BWD_TOL);
  EXPECT_CLOSE("linear dweight", dw, gw, c.OC * c.IC, BWD_TOL);
  EXPECT_CLOSE("linear dbias", db, gb, c.OC, BWD_TOL);

  /* accumulate flags: += onto what is there; = ignores it */
  double *ax = dalloc(c.N * c.IC), *aw = dalloc(c.OC * c.IC), *ab = dalloc(c.OC);
  for (int64_t i = 0; i < c.N * c.IC; i++) {
    ax[i] = 0.5 + gx[i];
    dx[i] = 0.5f;
  }
  for (int64_t i = 0; i < c.OC * c.IC; i++) {
    aw[i] = -2 + gw[i];
    dw[i] = -2.0f;
  }
  for (int64_t i = 0; i < c.OC; i++) {
    ab[i] = 3 + gb[i];
    db[i] = 3.0f;
  }
  cr_assert_eq(weft_linear_backward(dx, dw, db, R, x, w, c.N, c.IC, c.OC, true, true), WEFT_OK);
  EXPECT_CLOSE("linear dinp accumulated", dx, ax, c.N * c.IC, BWD_TOL);
  EXPECT_CLOSE("linear dweight accumulated", dw, aw, c.OC * c.IC, BWD_TOL);
  EXPECT_CLOSE("linear dbias accumulated", db, ab, c.OC, BWD_TOL);
  for (int64_t i = 0; i < c.OC * c.IC; i++) dw[i] = 99.0f;
  cr_assert_eq(weft_linear_backward(dx, dw, NULL, R, x, w, c.N, c.IC, c.OC, true, false), WEFT_OK);
  EXPECT_CLOSE("linear dweight overwritten", dw, gw, c.OC * c.IC, BWD_TOL);
  /* no bias */
  double *bias_d = c.b;
  c.b = NULL;
  cr_assert_eq(weft_linear_forward(y, x, w, NULL, c.N, c.IC, c.OC), WEFT_OK);
  lin_ref(&c, yref);
  EXPECT_CLOSE("linear out, no bias", y, yref, c.N * c.OC, FWD_TOL);
  free(c.x);
  free(c.w);
  free(bias_d);
  free(gb);
  free(c.R);
  free(x);
  free(w);
  free(b);
  free(R);
  free(y);
  free(yref);
  free(dx);
  free(dw);
  free(db);
  free(gx);
  free(gw);
  free(ax);
  free(aw);
  free(ab);
}

/* ----------------------------------------------------------------- RMSNorm */

typedef struct rms_ctx {
  int64_t N, C;
  double *x, *w, *R;
} rms_ctx;
static void rms_ref(const rms_ctx *c, double *y, double *rstd) {
  for (int64_t n = 0; n < c->N; n++) {
    double ss = 0;
    for (int64_t i = 0; i < c->C; i++) ss += c->x[n * c->C + i] * c->x[n * c->C + i];
    double r = 1.0 / sqrt(ss / (double)c->C + 1e-5);
    if (rstd) rstd[n] = r;
    for (int64_t i = 0; i < c->C; i++) y[n * c->C + i] = c->x[n * c->C + i] * r * c->w[i];
  }
}
static double rms_loss(void *p) {
  rms_ctx *c = p;
  double *y = dalloc(c->N * c->C);
  rms_ref(c, y, NULL);
  double l = dot_d(y, c->R, c->N * c->C);
  free(y);
  return l;
}

Test(layers, rmsnorm_backward_matches_finite_differences) {
  rng_seed(301);
  rms_ctx c = {.N = 4, .C = 9};
  c.x = dalloc(c.N * c.C);
  c.w = dalloc(c.C);
  c.R = dalloc(c.N * c.C);
  fill(NULL, c.x, c.N * c.C, -2, 2);
  fill(NULL, c.w, c.C, 0.5, 1.5);
  fill(NULL, c.R, c.N * c.C, -1, 1);
  c.x[0] = 1e-3; /* a row with a tiny element */
  float *x = fdup(c.x, c.N * c.C), *w = fdup(c.w, c.C), *R = fdup(c.R, c.N * c.C);
  float *y = falloc(c.N * c.C), *rstd = falloc(c.N);
  double *yref = dalloc(c.N * c.C), *rref = dalloc(c.N);
  cr_assert_eq(weft_rmsnorm_forward(y, rstd, x, w, c.N, c.C, 1e-5f), WEFT_OK, "%s",
               weft_last_error());
  rms_ref(&c, yref, rref);
  EXPECT_CLOSE("rmsnorm out", y, yref, c.N * c.C, FWD_TOL);
  EXPECT_CLOSE("rmsnorm rstd", rstd, rref, c.N, FWD_TOL);
  float *dx = falloc(c.N * c.C), *dw = falloc(c.C);
  for (int64_t i = 0; i < c.C; i++) dw[i] = 0.25f; /* dweight accumulates */
  cr_assert_eq(weft_rmsnorm_backward(dx, dw, R, x, w, rstd, c.N, c.C, false), WEFT_OK);
  double *gx = dalloc(c.N * c.C), *gw = dalloc(c.C);
  fd_grad(rms_loss, &c, c.x, c.N * c.C, FD_H, gx);
  fd_grad(rms_loss, &c, c.w, c.C, FD_H, gw);
  for (int64_t i = 0; i < c.C; i++) gw[i] += 0.25;
  EXPECT_CLOSE("rmsnorm dinp", dx, gx, c.N * c.C, BWD_TOL);
  EXPECT_CLOSE("rmsnorm dweight (accumulated)", dw, gw, c.C, BWD_TOL);
  /* accumulate_dinp adds */
  for (int64_t i = 0; i < c.N * c.C; i++) {
    dx[i] = 1.0f;
    gx[i] += 1.0;
  }
  cr_assert_eq(weft_rmsnorm_backward(dx, dw, R, x, w, rstd, c.N, c.C, true), WEFT_OK);
  EXPECT_CLOSE("rmsnorm dinp accumulated", dx, gx, c.N * c.C, BWD_TOL);
  free(c.x);
  free(c.w);
  free(c.R);
  free(x);
  free(w);
  free(R);
  free(y);
  free(rstd);
  free(yref);
  free(rref);
  free(dx);
  free(dw);
  free(gx);
  free(gw);
}

/* -------------------------------------------------------------------- RoPE */

typedef struct rope_ctx {
  int64_t B, T, NH, hd, pos0;
  double *x, *R;
} rope_ctx;
/* Straight from the formula: theta_j = 10000^(-2j/hd), angle = p theta_j. */
static void rope_ref(const rope_ctx *c, double *y) {
  for (int64_t b = 0; b < c->B; b++)
    for (int64_t t = 0; t < c->T; t++)
      for (int64_t h = 0; h < c->NH; h++)
        for (int64_t j = 0; j < c->hd / 2; j++) {
          double a = (double)(c->pos0 + t) * pow(10000.0, -2.0 * (double)j / (double)c->hd);
          int64_t o = ((b * c->T + t) * c->NH + h) * c->hd + 2 * j;
          y[o] = c->x[o] * cos(a) - c->x[o + 1] * sin(a);
          y[o + 1] = c->x[o] * sin(a) + c->x[o + 1] * cos(a);
        }
}
static double rope_loss(void *p) {
  rope_ctx *c = p;
  int64_t n = c->B * c->T * c->NH * c->hd;
  double *y = dalloc(n);
  rope_ref(c, y);
  double l = dot_d(y, c->R, n);
  free(y);
  return l;
}

Test(layers, rope_matches_formula_at_an_offset_and_backward_is_its_transpose) {
  rng_seed(401);
  rope_ctx c = {.B = 2, .T = 5, .NH = 3, .hd = 8, .pos0 = 6};
  const int64_t n = c.B * c.T * c.NH * c.hd, maxp = 11;
  c.x = dalloc(n);
  c.R = dalloc(n);
  fill(NULL, c.x, n, -1, 1);
  fill(NULL, c.R, n, -1, 1);
  float *cosb = falloc(maxp * c.hd / 2), *sinb = falloc(maxp * c.hd / 2);
  cr_assert_eq(weft_rope_tables(cosb, sinb, maxp, c.hd, 10000.0), WEFT_OK, "%s", weft_last_error());
  float *x = fdup(c.x, n), *R = fdup(c.R, n), *y = falloc(n), *dx = falloc(n);
  double *yref = dalloc(n), *g = dalloc(n);
  cr_assert_eq(weft_rope_forward(y, x, cosb, sinb, maxp, c.B, c.T, c.NH, c.hd, c.pos0), WEFT_OK);
  rope_ref(&c, yref);
  EXPECT_CLOSE("rope out", y, yref, n, FWD_TOL);
  /* in place gives the same */
  float *xi = fdup(c.x, n);
  cr_assert_eq(weft_rope_forward(xi, xi, cosb, sinb, maxp, c.B, c.T, c.NH, c.hd, c.pos0), WEFT_OK);
  cr_expect(memcmp(xi, y, (size_t)n * sizeof(float)) == 0, "in-place rope differs");
  cr_assert_eq(weft_rope_backward(dx, R, cosb, sinb, maxp, c.B, c.T, c.NH, c.hd, c.pos0), WEFT_OK);
  fd_grad(rope_loss, &c, c.x, n, FD_H, g);
  EXPECT_CLOSE("rope dinp", dx, g, n, BWD_TOL);
  /* pos0 + T past the tables, odd head dim */
  cr_expect_eq(weft_rope_forward(y, x, cosb, sinb, maxp, c.B, c.T, c.NH, c.hd, 7),
               WEFT_ERR_INVALID);
  cr_expect_eq(weft_rope_tables(cosb, sinb, maxp, 7, 10000.0), WEFT_ERR_INVALID);
  cr_expect_eq(weft_rope_forward(y, x, cosb, sinb, maxp, c.B, c.T, c.NH, 7, 0), WEFT_ERR_INVALID);
  free(c.x);
  free(c.R);
  free(cosb);
  free(sinb);
  free(x);
  free(R);
  free(y);
  free(dx);
  free(yref);
  free(g);
  free(xi);
}

/* --------------------------------------------------------------- attention */

typedef struct att_ctx {
  int64_t B, T, H, Hkv, hd;
  double *q, *k, *v, *R;
} att_ctx;
/* Naive: k and v repeated over heads (repeat_interleave), full score
 * matrix, causal mask, softmax, weighted sum. */
static void att_ref(const att_ctx *c, double *out) {
  const int64_t rep = c->H / c->Hkv, hd = c->hd;
  double *s = dalloc(c->T);
  for (int64_t b = 0; b < c->B; b++)
    for (int64_t h = 0; h < c->H; h++) {
      int64_t g = h / rep;
      for (int64_t t = 0; t < c->T; t++) {
        const double *qt = c->q + ((b * c->T + t) * c->H + h) * hd;
        double mx = -INFINITY;
        for (int64_t j = 0; j <= t; j++) {
          const double *kj = c->k + ((b * c->T + j) * c->Hkv + g) * hd;
          s[j] = dot_d(qt, kj, hd) / sqrt((double)hd);
          mx = fmax(mx, s[j]);
        }
        double z = 0;
        for (int64_t j = 0; j <= t; j++) z += (s[j] = exp(s[j] - mx));
        double *o = out + ((b * c->T + t) * c->H + h) * hd;
        for (int64_t d = 0; d < hd; d++) {
          double acc = 0;
          for (int64_t j = 0; j <= t; j++)
            acc += s[j] / z * c->v[((b * c->T + j) * c->Hkv + g) * hd + d];
          o[d] = acc;
        }
      }
    }
  free(s);
}
static double att_loss(void *p) {
  att_ctx *c = p;
  int64_t n = c->B * c->T * c->H * c->hd;
  double *o = dalloc(n);
  att_ref(c, o);
  double l = dot_d(o, c->R, n);
  free(o);
  return l;
}

/* Forward against the naive reference; backward against finite differences
 * (at every element, or `samples` random ones per input when > 0). */
static void check_attention(int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t hd,
                            int64_t samples) {
  att_ctx c = {.B = B, .T = T, .H = H, .Hkv = Hkv, .hd = hd};
  const int64_t nq = B * T * H * hd, nk = B * T * Hkv * hd;
  c.q = dalloc(nq);
  c.k = dalloc(nk);
  c.v = dalloc(nk);
  c.R = dalloc(nq);
  fill(NULL, c.q, nq, -1.5, 1.5);
  fill(NULL, c.k, nk, -1.5, 1.5);
  fill(NULL, c.v, nk, -1, 1);
  fill(NULL, c.R, nq, -1, 1);
  float *q = fdup(c.q, nq), *k = fdup(c.k, nk), *v = fdup(c.v, nk), *R = fdup(c.R, nq);
  float *out = falloc(nq), *lse = falloc(B * H * T);
  float *scratch = falloc(weft_attention_scratch_floats(T));
  double *oref = dalloc(nq);
  cr_assert_eq(weft_attention_forward(out, lse, q, k, v, B, T, H, Hkv, hd, true, scratch), WEFT_OK,
               "%s", weft_last_error());
  att_ref(&c, oref);
  EXPECT_CLOSE("attention out", out, oref, nq, FWD_TOL);
  float *dq = falloc(nq), *dk = falloc(nk), *dv = falloc(nk);
  for (int64_t i = 0; i < nk; i++) dk[i] = dv[i] = 42.0f; /* overwritten, not accumulated */
  cr_assert_eq(
      weft_attention_backward(dq, dk, dv, R, q, k, v, lse, B, T, H, Hkv, hd, true, scratch),
      WEFT_OK, "%s", weft_last_error());
  struct {
    const char *name;
    double *x;
    int64_t n;
    float *got;
  } in[3] = {
      {"attention dq", c.q, nq, dq}, {"attention dk", c.k, nk, dk}, {"attention dv", c.v, nk, dv}};
  for (int i = 0; i < 3; i++) {
    if (samples <= 0) {
      double *g = dalloc(in[i].n);
      fd_grad(att_loss, &c, in[i].x, in[i].n, FD_H, g);
      EXPECT_CLOSE(in[i].name, in[i].got, g, in[i].n, BWD_TOL);
      free(g);
    } else {
      double *gs = dalloc(samples);
      float *got = falloc(samples);
      fd_grad_sampled(att_loss, &c, in[i].x, in[i].n, FD_H, in[i].got, samples, got, gs);
      EXPECT_CLOSE(in[i].name, got, gs, samples, BWD_TOL);
      free(gs);
      free(got);
    }
  }
  free(c.q);
  free(c.k);
  free(c.v);
  free(c.R);
  free(q);
  free(k);
  free(v);
  free(R);
  free(out);
  free(lse);
  free(scratch);
  free(oref);
  free(dq);
  free(dk);
  free(dv);
}

Test(layers, attention_gqa_backward_matches_finite_differences) {
  rng_seed(501);
  check_attention(2, 7, 4, 2, 6, 0);
}
Test(layers, attention_mha_backward_matches_finite_differences) {
  rng_seed(502);
  check_attention(1, 5, 3, 3, 4, 0);
}
Test(layers, attention_multi_query_head_group_matches_finite_differences) {
  rng_seed(503);
  check_attention(2, 3, 4, 1, 2, 0); /* Hkv = 1: every query head shares one kv head */
}
Test(layers, attention_across_query_blocks_matches_reference) {
  rng_seed(504);
  check_attention(1, 150, 2, 1, 4, 60); /* T > 2 blocks of 64, sampled differences */
}

Test(layers, attention_rejects_heads_not_a_multiple_of_kv_heads) {
  float buf[64] = {0};
  cr_expect_eq(weft_attention_forward(buf, buf, buf, buf, buf, 1, 2, 3, 2, 2, true, buf),
               WEFT_ERR_INVALID);
  cr_expect(strstr(weft_last_error(), "not a multiple") != NULL, "%s", weft_last_error());
  cr_expect_eq(
      weft_attention_backward(buf, buf, buf, buf, buf, buf, buf, buf, 1, 2, 4, 0, 2, true, buf),
      WEFT_ERR_INVALID);
  cr_expect_eq(weft_attention_forward(buf, buf, buf, buf, buf, 1, 2, 2, 2, 2, true, NULL),
               WEFT_ERR_INVALID);
  cr_expect_eq(weft_attention_scratch_floats(10), 200);
  cr_expect_eq(weft_attention_scratch_floats(1000), 2 * 64 * 1000);
}

/* ------------------------------------------------------------------ SwiGLU */

typedef struct swi_ctx {
  int64_t n;
  double *a, *b, *R;
} swi_ctx;
static double swi_loss(void *p) {
  swi_ctx *c = p;
  double l = 0;
  for (int64_t i = 0; i < c->n; i++) l += c->a[i] / (1 + exp(-c->a[i])) * c->b[i] * c->R[i];
  return l;
}

Test(layers, swiglu_backward_matches_finite_differences) {
  rng_seed(601);
  swi_ctx c = {.n = 23};
  c.a = dalloc(c.n);
  c.b = dalloc(c.n);
  c.R = dalloc(c.n);
  fill(NULL, c.a, c.n, -6, 6);
  fill(NULL, c.b, c.n, -2, 2);
  fill(NULL, c.R, c.n, -1, 1);
  float *a = fdup(c.a, c.n), *b = fdup(c.b, c.n), *R = fdup(c.R, c.n), *y = falloc(c.n);
  double *yref = dalloc(c.n), *ga = dalloc(c.n), *gb = dalloc(c.n);
  for (int64_t i = 0; i < c.n; i++) yref[i] = c.a[i] / (1 + exp(-c.a[i])) * c.b[i];
  cr_assert_eq(weft_swiglu_forward(y, a, b, c.n), WEFT_OK);
  EXPECT_CLOSE("swiglu out", y, yref, c.n, FWD_TOL);
  float *da = falloc(c.n), *db = falloc(c.n);
  cr_assert_eq(weft_swiglu_backward(da, db, R, a, b, c.n), WEFT_OK);
  fd_grad(swi_loss, &c, c.a, c.n, FD_H, ga);
  fd_grad(swi_loss, &c, c.b, c.n, FD_H, gb);
  EXPECT_CLOSE("swiglu da", da, ga, c.n, BWD_TOL);
  EXPECT_CLOSE("swiglu db", db, gb, c.n, BWD_TOL);
  /* in place: da over a, db over b */
  cr_assert_eq(weft_swiglu_backward(a, b, R, a, b, c.n), WEFT_OK);
  EXPECT_CLOSE("swiglu da in place", a, ga, c.n, BWD_TOL);
  EXPECT_CLOSE("swiglu db in place", b, gb, c.n, BWD_TOL);
  free(c.a);
  free(c.b);
  free(c.R);
  free(a);
  free(b);
  free(R);
  free(y);
  free(yref);
  free(ga);
  free(gb);
  free(da);
  free(db);
}

Test(layers, residual_adds_forward_and_fans_out_backward) {
  rng_seed(602);
  const int64_t n = 9;
  float a[9], b[9], d[9], o[9], da[9], db[9];
  double want[9], wa[9], wb[9];
  fill(a, NULL, n, -1, 1);
  fill(b, NULL, n, -1, 1);
  fill(d, NULL, n, -1, 1);
  fill(da, NULL, n, -1, 1);
  fill(db, NULL, n, -1, 1);
  for (int i = 0; i < n; i++) {
    want[i] = (double)(a[i] + b[i]);
    wa[i] = (double)(da[i] + d[i]);
    wb[i] = (double)(db[i] + d[i]);
  }
  cr_assert_eq(weft_residual_forward(o, a, b, n), WEFT_OK);
  cr_assert_eq(weft_residual_backward(da, db, d, n), WEFT_OK);
  EXPECT_CLOSE("residual out", o, want, n, 0.0);
  EXPECT_CLOSE("residual da", da, wa, n, 0.0);
  EXPECT_CLOSE("residual db", db, wb, n, 0.0);
}

/* ------------------------------------------------------------ cross-entropy */

typedef struct ce_ctx {
  int64_t N, V;
  double *z;
  const int32_t *t;
} ce_ctx;
static double ce_loss(void *p) {
  ce_ctx *c = p;
  double L = 0;
  for (int64_t n = 0; n < c->N; n++) {
    double mx = -INFINITY, s = 0;
    for (int64_t v = 0; v < c->V; v++) mx = fmax(mx, c->z[n * c->V + v]);
    for (int64_t v = 0; v < c->V; v++) s += exp(c->z[n * c->V + v] - mx);
    L += mx + log(s) - c->z[n * c->V + c->t[n]];
  }
  return L / (double)c->N;
}

Test(layers, cross_entropy_matches_reference_and_finite_differences) {
  rng_seed(701);
  const int64_t N = 6, V = 17;
  int32_t t[6];
  for (int i = 0; i < N; i++) t[i] = irand((int32_t)V);
  t[0] = 0;
  t[1] = (int32_t)V - 1;
  ce_ctx c = {.N = N, .V = V, .t = t};
  c.z = dalloc(N * V);
  fill(NULL, c.z, N * V, -4, 4);
  c.z[5] = 30.0; /* a large logit: the max shift must keep it finite */
  float *z = fdup(c.z, N * V), *lse = falloc(N), *dz = falloc(N * V);
  double loss;
  cr_assert_eq(weft_cross_entropy_forward(&loss, lse, z, t, N, V), WEFT_OK, "%s",
               weft_last_error());
  double want = ce_loss(&c);
  cr_expect(fabs(loss - want) <= 1e-6 * fabs(want), "loss %.12g want %.12g (seed %lu)", loss, want,
            seed_used);
  cr_assert_eq(weft_cross_entropy_backward(dz, z, lse, t, N, V, 1.0f / (float)N), WEFT_OK);
  double *g = dalloc(N * V);
  fd_grad(ce_loss, &c, c.z, N * V, FD_H, g);
  EXPECT_CLOSE("cross-entropy dlogits", dz, g, N * V, BWD_TOL);
  /* in place over the logits, and a custom scale */
  for (int64_t i = 0; i < N * V; i++) g[i] *= 0.5 * (double)N;
  cr_assert_eq(weft_cross_entropy_backward(z, z, lse, t, N, V, 0.5f), WEFT_OK);
  EXPECT_CLOSE("cross-entropy dlogits in place, scale 0.5", z, g, N * V, BWD_TOL);
  /* bad targets */
  int32_t bad[6] = {0, 1, 17, 0, 0, 0};
  cr_expect_eq(weft_cross_entropy_forward(&loss, lse, z, bad, N, V), WEFT_ERR_INVALID);
  cr_expect(strstr(weft_last_error(), "targets[2] = 17") != NULL, "%s", weft_last_error());
  bad[2] = -3;
  cr_expect_eq(weft_cross_entropy_backward(dz, z, lse, bad, N, V, 1.0f), WEFT_ERR_INVALID);
  free(c.z);
  free(z);
  free(lse);
  free(dz);
  free(g);
}

Test(layers, cross_entropy_vocab_sharded_pieces_equal_unsharded) {
  rng_seed(702);
  const int64_t N = 7, V = 17;
  int32_t t[7];
  for (int i = 0; i < N; i++) t[i] = irand((int32_t)V);
  t[0] = 16; /* the last shard's last column */
  float *z = falloc(N * V), *lse = falloc(N), *dz = falloc(N * V);
  fill(z, NULL, N * V, -5, 5);
  double loss;
  cr_assert_eq(weft_cross_entropy_forward(&loss, lse, z, t, N, V), WEFT_OK);
  cr_assert_eq(weft_cross_entropy_backward(dz, z, lse, t, N, V, 1.0f / (float)N), WEFT_OK);
  double *dzd = dalloc(N * V), *lsed = dalloc(N);
  for (int64_t i = 0; i < N * V; i++) dzd[i] = dz[i];
  for (int64_t i = 0; i < N; i++) lsed[i] = lse[i];
  for (int64_t k = 2; k <= 4; k++) {
    /* simulate k ranks: each holds columns [v0, v0 + nv) of the logits */
    float *loc[4], gmax[7], gsum[7], gtgt[7], piece[7], slse[7];
    int64_t v0[4], nv[4];
    for (int64_t s = 0; s < k; s++) {
      weft_chunk_range(V, k, s, &v0[s], &nv[s]);
      loc[s] = falloc(N * nv[s]);
      for (int64_t n = 0; n < N; n++)
        memcpy(loc[s] + n * nv[s], z + n * V + v0[s], (size_t)nv[s] * sizeof(float));
    }
    for (int64_t n = 0; n < N; n++) {
      gmax[n] = -INFINITY;
      gsum[n] = 0;
      gtgt[n] = 0;
    }
    for (int64_t s = 0; s < k; s++) { /* all-reduce MAX and SUM */
      cr_assert_eq(weft_cross_entropy_local_max(piece, loc[s], N, nv[s]), WEFT_OK);
      for (int64_t n = 0; n < N; n++) gmax[n] = fmaxf(gmax[n], piece[n]);
      cr_assert_eq(weft_cross_entropy_local_target(piece, loc[s], t, N, v0[s], nv[s]), WEFT_OK);
      for (int64_t n = 0; n < N; n++) gtgt[n] += piece[n];
    }
    for (int64_t s = 0; s < k; s++) {
      cr_assert_eq(weft_cross_entropy_local_sumexp(piece, loc[s], gmax, N, nv[s]), WEFT_OK);
      for (int64_t n = 0; n < N; n++) gsum[n] += piece[n];
    }
    double sl;
    cr_assert_eq(weft_cross_entropy_finish(&sl, slse, gmax, gsum, gtgt, N), WEFT_OK);
    cr_expect(fabs(sl - loss) <= 1e-6 * fabs(loss), "%lld shards: loss %.10g, unsharded %.10g",
              (long long)k, sl, loss);
    EXPECT_CLOSE("sharded lse", slse, lsed, N, 1e-6);
    float *dcat = falloc(N * V);
    for (int64_t s = 0; s < k; s++) {
      float *dl = falloc(N * nv[s]);
      cr_assert_eq(
          weft_cross_entropy_backward_local(dl, loc[s], slse, t, N, v0[s], nv[s], 1.0f / (float)N),
          WEFT_OK);
      for (int64_t n = 0; n < N; n++)
        memcpy(dcat + n * V + v0[s], dl + n * nv[s], (size_t)nv[s] * sizeof(float));
      free(dl);
      free(loc[s]);
    }
    EXPECT_CLOSE("sharded dlogits", dcat, dzd, N * V, 1e-6);
    free(dcat);
  }
  /* an empty shard reports -inf as its max and 0 as its sum */
  float m1[1], s1[1], g1[1] = {0.0f};
  cr_assert_eq(weft_cross_entropy_local_max(m1, z, 1, 0), WEFT_OK);
  cr_expect(isinf(m1[0]) && m1[0] < 0, "empty shard max %g", (double)m1[0]);
  cr_assert_eq(weft_cross_entropy_local_sumexp(s1, z, g1, 1, 0), WEFT_OK);
  cr_expect_eq(s1[0], 0.0f);
  cr_expect_eq(weft_cross_entropy_finish(&loss, NULL, g1, s1, g1, 1), WEFT_ERR_INVALID);
  free(z);
  free(lse);
  free(dz);
  free(dzd);
  free(lsed);
}

/* -------------------------------------------------------------- optimizers */

/* torch.optim.AdamW's single-tensor loop, in double. */
static void adamw_ref(double *p, const double *g, double *m, double *v, double *vmax, int64_t n,
                      int64_t step, double lr, double b1, double b2, double eps, double wd,
                      bool amsgrad, bool maximize) {
  for (int64_t i = 0; i < n; i++) {
    double gi = maximize ? -g[i] : g[i];
    p[i] *= 1 - lr * wd;
    m[i] = b1 * m[i] + (1 - b1) * gi;
    v[i] = b2 * v[i] + (1 - b2) * gi * gi;
    double vv = v[i];
    if (amsgrad) vv = vmax[i] = fmax(vmax[i], v[i]);
    double bc1 = 1 - pow(b1, (double)step), bc2 = 1 - pow(b2, (double)step);
    p[i] -= lr / bc1 * m[i] / (sqrt(vv) / sqrt(bc2) + eps);
  }
}

Test(layers, adamw_matches_torch_formula_over_steps) {
  rng_seed(801);
  const int64_t n = 31;
  for (int variant = 0; variant < 3; variant++) {
    weft_adamw_params hp = WEFT_ADAMW_DEFAULT;
    hp.lr = 0.01f;
    hp.beta2 = 0.95f;
    hp.weight_decay = 0.1f;
    hp.amsgrad = variant == 1;
    hp.maximize = variant == 2;
    float *p = falloc(n), *g = falloc(n), *m = falloc(n), *v = falloc(n), *vm = falloc(n);
    double *pd = dalloc(n), *gd = dalloc(n), *md = dalloc(n), *vd = dalloc(n), *vmd = dalloc(n);
    fill(p, pd, n, -1, 1);
    for (int64_t s = 1; s <= 4; s++) {
      fill(g, gd, n, -1, 1);
      if (s == 3)
        for (int64_t i = 0; i < n; i++)
          g[i] = (float)(gd[i] *= 0.01); /* shrinking grads: amsgrad keeps the max */
      cr_assert_eq(weft_adamw_step(p, g, m, v, vm, n, s, &hp), WEFT_OK, "%s", weft_last_error());
      adamw_ref(pd, gd, md, vd, vmd, n, s, hp.lr, hp.beta1, hp.beta2, hp.eps, hp.weight_decay,
                hp.amsgrad, hp.maximize);
    }
    char what[64];
    snprintf(what, sizeof what, "adamw param after 4 steps (variant %d)", variant);
    EXPECT_CLOSE(what, p, pd, n, 1e-6);
    EXPECT_CLOSE("adamw exp_avg", m, md, n, 1e-6);
    EXPECT_CLOSE("adamw exp_avg_sq", v, vd, n, 1e-6);
    free(p);
    free(g);
    free(m);
    free(v);
    free(vm);
    free(pd);
    free(gd);
    free(md);
    free(vd);
    free(vmd);
  }
  /* torch's argument checks */
  weft_adamw_params bad = WEFT_ADAMW_DEFAULT;
  float x[2] = {1, 2}, y[2] = {0}, z[2] = {0};
  bad.beta1 = 1.0f;
  cr_expect_eq(weft_adamw_step(x, x, y, z, NULL, 2, 1, &bad), WEFT_ERR_INVALID);
  bad = WEFT_ADAMW_DEFAULT;
  cr_expect_eq(weft_adamw_step(x, x, y, z, NULL, 2, 0, &bad), WEFT_ERR_INVALID);
  bad.amsgrad = true;
  cr_expect_eq(weft_adamw_step(x, x, y, z, NULL, 2, 1, &bad), WEFT_ERR_INVALID);
  cr_expect_eq(weft_adamw_step(x, x, y, z, NULL, 2, 1, NULL), WEFT_ERR_INVALID);
}

/* torch.optim.SGD's single-tensor loop, in double. */
static void sgd_ref(double *p, const double *g, double *buf, int64_t n, int64_t step, double lr,
                    double mom, double damp, double wd, bool nesterov, bool maximize) {
  for (int64_t i = 0; i < n; i++) {
    double d = maximize ? -g[i] : g[i];
    if (wd != 0) d += wd * p[i];
    if (mom != 0) {
      buf[i] = step == 1 ? d : mom * buf[i] + (1 - damp) * d;
      d = nesterov ? d + mom * buf[i] : buf[i];
    }
    p[i] -= lr * d;
  }
}

Test(layers, sgd_matches_torch_formula_over_steps) {
  rng_seed(802);
  const int64_t n = 19;
  const weft_sgd_params variants[4] = {
      {.lr = 0.1f},
      {.lr = 0.05f, .momentum = 0.9f, .dampening = 0.3f, .weight_decay = 0.01f},
      {.lr = 0.05f, .momentum = 0.8f, .nesterov = true, .weight_decay = 0.02f},
      {.lr = 0.05f, .momentum = 0.5f, .maximize = true},
  };
  for (int vi = 0; vi < 4; vi++) {
    const weft_sgd_params *hp = &variants[vi];
    float *p = falloc(n), *g = falloc(n), *b = falloc(n);
    double *pd = dalloc(n), *gd = dalloc(n), *bd = dalloc(n);
    fill(p, pd, n, -1, 1);
    for (int64_t i = 0; i < n; i++) b[i] = 123.0f; /* step 1 must ignore the buffer's contents */
    for (int64_t s = 1; s <= 4; s++) {
      fill(g, gd, n, -1, 1);
      cr_assert_eq(weft_sgd_step(p, g, hp->momentum != 0 ? b : NULL, n, s, hp), WEFT_OK, "%s",
                   weft_last_error());
      sgd_ref(pd, gd, bd, n, s, hp->lr, hp->momentum, hp->dampening, hp->weight_decay, hp->nesterov,
              hp->maximize);
    }
    char what[64];
    snprintf(what, sizeof what, "sgd param after 4 steps (variant %d)", vi);
    EXPECT_CLOSE(what, p, pd, n, 1e-6);
    free(p);
    free(g);
    free(b);
    free(pd);
    free(gd);
    free(bd);
  }
  weft_sgd_params bad = {.lr = 0.1f, .nesterov = true};
  float x[2] = {1, 2}, bb[2];
  cr_expect_eq(weft_sgd_step(x, x, bb, 2, 1, &bad), WEFT_ERR_INVALID);
  cr_expect(strstr(weft_last_error(), "Nesterov") != NULL, "%s", weft_last_error());
  bad = (weft_sgd_params){.lr = 0.1f, .momentum = 0.9f};
  cr_expect_eq(weft_sgd_step(x, x, NULL, 2, 1, &bad), WEFT_ERR_INVALID);
  bad.lr = -1.0f;
  cr_expect_eq(weft_sgd_step(x, x, bb, 2, 1, &bad), WEFT_ERR_INVALID);
}

Test(layers, sumsq_and_clip_coef_follow_clip_grad_norm) {
  float x[5] = {3, -4, 0.5f, 1e-3f, -2};
  double want = 9 + 16 + 0.25 + 1e-6 + 4;
  cr_expect(fabs(weft_sumsq(x, 5) - want) < 1e-12, "sumsq %.15g want %.15g", weft_sumsq(x, 5),
            want);
  cr_expect_eq(weft_sumsq(NULL, 0), 0.0);
  cr_expect(fabs(weft_clip_coef(2.0, 1.0) - 1.0 / (2.0 + 1e-6)) < 1e-15);
  cr_expect_eq(weft_clip_coef(0.5, 1.0), 1.0);
  weft_scale_f32(x, 5, 0.5f);
  cr_expect(x[0] == 1.5f && x[1] == -2.0f, "scaled %g %g", (double)x[0], (double)x[1]);
}

/* ------------------------------------------- 1 thread and N threads alike */

/* The CPU kernels split their work over weft_cpu_num_threads() threads in
 * fixed chunks (kernels/cpu/pool.h), so their results must be the same
 * bits on 1, 2 and 3 threads. Shapes give every kernel several chunks
 * (N x C = 301 x 700 floats: 13 chunks of rows or elements, 11 column
 * blocks). */
typedef struct thr_bufs {
  float *out, *mean, *rstd, *dinp, *dw, *db, *lse, *act_f, *act_b, *sm_f, *sm_b, *drop, *ce_d,
      *ce_max, *ce_sum, *sw_f, *sw_da, *sw_db, *res_f, *res_da, *res_db, *add, *mul, *scale, *axpy,
      *rms_out, *rms_rstd, *rms_dinp, *rms_dw;
  double ce_loss;
} thr_bufs;

enum { THR_N = 301, THR_C = 700 };

static void thr_run(thr_bufs *o, const float *x, const float *w, const float *b, const float *dy,
                    const float *u, const float *y2, const int32_t *tg) {
  const int64_t N = THR_N, C = THR_C, n = N * C;
  cr_assert_eq(weft_layernorm_forward(o->out, o->mean, o->rstd, x, w, b, N, C, 1e-5f), WEFT_OK);
  memset(o->dw, 0, sizeof(float) * C);
  memset(o->db, 0, sizeof(float) * C);
  cr_assert_eq(
      weft_layernorm_backward(o->dinp, o->dw, o->db, dy, x, w, o->mean, o->rstd, N, C, false),
      WEFT_OK);
  /* the weight gradient alone (no dinp, no dbias) is the same sum */
  memset(o->rms_dw, 0, sizeof(float) * C);
  cr_assert_eq(
      weft_layernorm_backward(NULL, o->rms_dw, NULL, dy, x, w, o->mean, o->rstd, N, C, false),
      WEFT_OK);
  cr_expect(memcmp(o->rms_dw, o->dw, sizeof(float) * C) == 0,
            "layernorm dweight without dinp and dbias differs from dweight with them");
  cr_assert_eq(weft_rmsnorm_forward(o->rms_out, o->rms_rstd, x, w, N, C, 1e-5f), WEFT_OK);
  memset(o->rms_dw, 0, sizeof(float) * C);
  cr_assert_eq(weft_rmsnorm_backward(o->rms_dinp, o->rms_dw, dy, x, w, o->rms_rstd, N, C, false),
               WEFT_OK);
  cr_assert_eq(weft_activation_forward(WEFT_ACT_GELU_TANH, o->act_f, x, n), WEFT_OK);
  memcpy(o->act_b, y2, sizeof(float) * n);
  cr_assert_eq(weft_activation_backward(WEFT_ACT_SILU, o->act_b, dy, x, n, true), WEFT_OK);
  cr_assert_eq(weft_softmax_forward(o->sm_f, x, N, C), WEFT_OK);
  cr_assert_eq(weft_softmax_backward(o->sm_b, dy, o->sm_f, N, C, false), WEFT_OK);
  cr_assert_eq(weft_dropout_apply(o->drop, x, u, 0.3f, n), WEFT_OK);
  cr_assert_eq(weft_cross_entropy_forward(&o->ce_loss, o->lse, x, tg, N, C), WEFT_OK);
  cr_assert_eq(weft_cross_entropy_backward(o->ce_d, x, o->lse, tg, N, C, 0.5f), WEFT_OK);
  cr_assert_eq(weft_cross_entropy_local_max(o->ce_max, x, N, C), WEFT_OK);
  cr_assert_eq(weft_cross_entropy_local_sumexp(o->ce_sum, x, o->ce_max, N, C), WEFT_OK);
  cr_assert_eq(weft_swiglu_forward(o->sw_f, x, y2, n), WEFT_OK);
  cr_assert_eq(weft_swiglu_backward(o->sw_da, o->sw_db, dy, x, y2, n), WEFT_OK);
  cr_assert_eq(weft_residual_forward(o->res_f, x, y2, n), WEFT_OK);
  memcpy(o->res_da, x, sizeof(float) * n);
  memcpy(o->res_db, y2, sizeof(float) * n);
  cr_assert_eq(weft_residual_backward(o->res_da, o->res_db, dy, n), WEFT_OK);
  /* the tensor ops (kernels.h) on contiguous f32 */
  weft_tensor *tx, *ty, *ta, *tm, *ts, *tp;
  cr_assert_eq(weft_tensor_wrap((float *)x, WEFT_F32, WEFT_CPU, 1, &n, &tx), WEFT_OK);
  cr_assert_eq(weft_tensor_wrap((float *)y2, WEFT_F32, WEFT_CPU, 1, &n, &ty), WEFT_OK);
  cr_assert_eq(weft_tensor_wrap(o->add, WEFT_F32, WEFT_CPU, 1, &n, &ta), WEFT_OK);
  cr_assert_eq(weft_tensor_wrap(o->mul, WEFT_F32, WEFT_CPU, 1, &n, &tm), WEFT_OK);
  cr_assert_eq(weft_tensor_wrap(o->scale, WEFT_F32, WEFT_CPU, 1, &n, &ts), WEFT_OK);
  cr_assert_eq(weft_tensor_wrap(o->axpy, WEFT_F32, WEFT_CPU, 1, &n, &tp), WEFT_OK);
  cr_assert_eq(weft_add(ta, tx, ty), WEFT_OK);
  cr_assert_eq(weft_mul(tm, tx, ty), WEFT_OK);
  memcpy(o->scale, x, sizeof(float) * n);
  cr_assert_eq(weft_scale(ts, 0.37), WEFT_OK);
  memcpy(o->axpy, y2, sizeof(float) * n);
  cr_assert_eq(weft_axpy(tp, -1.7, tx), WEFT_OK);
  weft_tensor_destroy(tx), weft_tensor_destroy(ty), weft_tensor_destroy(ta);
  weft_tensor_destroy(tm), weft_tensor_destroy(ts), weft_tensor_destroy(tp);
}

Test(layers, kernels_give_the_same_bits_on_1_2_and_3_threads) {
  const int was = weft_cpu_num_threads();
  if (weft_cpu_set_num_threads(2) != WEFT_OK)
    cr_skip_test("this build's CPU kernels run on 1 thread: %s", weft_last_error());
  rng_seed(4242);
  const int64_t N = THR_N, C = THR_C, n = N * C;
  float *x = falloc(n), *w = falloc(C), *b = falloc(C), *dy = falloc(n), *u = falloc(n),
        *y2 = falloc(n);
  int32_t *tg = malloc(sizeof(int32_t) * N);
  fill(x, NULL, n, -4, 4);
  fill(w, NULL, C, 0.5, 1.5);
  fill(b, NULL, C, -1, 1);
  fill(dy, NULL, n, -1, 1);
  fill(u, NULL, n, 0, 1);
  fill(y2, NULL, n, -2, 2);
  for (int64_t i = 0; i < N; i++) tg[i] = irand((int32_t)C);
  thr_bufs r[3];
  const int threads[3] = {1, 2, 3};
  for (int k = 0; k < 3; k++) {
    float **f = (float **)&r[k];
    for (size_t j = 0; j < offsetof(thr_bufs, ce_loss) / sizeof(float *); j++) f[j] = falloc(n);
    cr_assert_eq(weft_cpu_set_num_threads(threads[k]), WEFT_OK);
    cr_assert_eq(weft_cpu_num_threads(), threads[k]);
    thr_run(&r[k], x, w, b, dy, u, y2, tg);
  }
  static const char *names[] = {
      "layernorm out", "mean",         "rstd",         "layernorm dinp", "dweight",
      "dbias",         "lse",          "gelu",         "silu backward",  "softmax",
      "softmax bwd",   "dropout",      "ce dlogits",   "ce local max",   "ce sumexp",
      "swiglu",        "swiglu da",    "swiglu db",    "residual",       "residual da",
      "residual db",   "add",          "mul",          "scale",          "axpy",
      "rmsnorm out",   "rmsnorm rstd", "rmsnorm dinp", "rmsnorm dweight"};
  const int64_t len[] = {n, N, N, n, C, C, N, n, n, n, n, n, n, N, N,
                         n, n, n, n, n, n, n, n, n, n, n, N, n, C};
  _Static_assert(sizeof names / sizeof names[0] == offsetof(thr_bufs, ce_loss) / sizeof(float *),
                 "one name per buffer");
  for (int k = 1; k < 3; k++) {
    float **a = (float **)&r[0], **c = (float **)&r[k];
    for (size_t j = 0; j < sizeof names / sizeof names[0]; j++)
      cr_expect(memcmp(a[j], c[j], sizeof(float) * (size_t)len[j]) == 0,
                "%s: %d threads differ from 1 (seed %lu)", names[j], threads[k], seed_used);
    cr_expect(memcmp(&r[0].ce_loss, &r[k].ce_loss, sizeof(double)) == 0,
              "cross-entropy loss: %d threads %.17g, 1 thread %.17g", threads[k], r[k].ce_loss,
              r[0].ce_loss);
  }
  for (int k = 0; k < 3; k++) {
    float **f = (float **)&r[k];
    for (size_t j = 0; j < offsetof(thr_bufs, ce_loss) / sizeof(float *); j++) free(f[j]);
  }
  free(x), free(w), free(b), free(dy), free(u), free(y2), free(tg);
  cr_assert_eq(weft_cpu_set_num_threads(was), WEFT_OK);
}

/* A GEMM large enough to be split over the threads (gemm.c: one block of
 * C's rows, or of its columns when C is wider, per thread) gives C =
 * alpha op(A) op(B) + beta C on 1, 2 and 3 threads, for every transpose
 * and both split directions, against a double reference. */
Test(layers, split_sgemm_matches_the_reference_on_1_2_and_3_threads) {
  const int was = weft_cpu_num_threads();
  if (weft_cpu_set_num_threads(2) != WEFT_OK)
    cr_skip_test("this build's CPU kernels run on 1 thread: %s", weft_last_error());
  rng_seed(777);
  const int64_t shapes[2][3] = {{301, 173, 211}, {97, 389, 233}}; /* m > n, then m < n */
  for (int s = 0; s < 2; s++) {
    const int64_t m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
    float *a = falloc(m * k), *b = falloc(k * n), *c0 = falloc(m * n), *c = falloc(m * n);
    fill(a, NULL, m * k, -1, 1);
    fill(b, NULL, k * n, -1, 1);
    fill(c0, NULL, m * n, -1, 1);
    double *want = dalloc(m * n);
    for (int tr = 0; tr < 4; tr++) {
      const bool ta = tr & 1, tb = tr & 2;
      const int64_t lda = ta ? m : k, ldb = tb ? k : n;
      for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
          double acc = 0;
          for (int64_t p = 0; p < k; p++)
            acc += (double)(ta ? a[p * lda + i] : a[i * lda + p]) *
                   (double)(tb ? b[j * ldb + p] : b[p * ldb + j]);
          want[i * n + j] = 0.5 * acc - 0.25 * (double)c0[i * n + j];
        }
      for (int nt = 1; nt <= 3; nt++) {
        cr_assert_eq(weft_cpu_set_num_threads(nt), WEFT_OK);
        memcpy(c, c0, sizeof(float) * (size_t)(m * n));
        weft_sgemm(ta, tb, m, n, k, 0.5f, a, lda, b, ldb, -0.25f, c, n);
        char what[96];
        snprintf(what, sizeof what, "sgemm %lldx%lldx%lld ta=%d tb=%d on %d threads", (long long)m,
                 (long long)n, (long long)k, ta, tb, nt);
        expect_close_(what, c, want, m * n, 1e-6, __FILE__, __LINE__);
      }
    }
    free(a), free(b), free(c0), free(c), free(want);
  }
  cr_assert_eq(weft_cpu_set_num_threads(was), WEFT_OK);
}

/* weft_reduce over each dim of a contiguous f32 tensor (the fast path:
 * blocks of columns on the threads) gives the bits of a sum in double over
 * the reduced dim in index order, rounded once (as the strided loop does),
 * for sum, sum of squares and max (a NaN stays NaN), on 1, 2 and 3 threads. */
Test(layers, reduce_over_any_dim_is_the_in_order_double_sum_on_1_2_and_3_threads) {
  const int was = weft_cpu_num_threads();
  if (weft_cpu_set_num_threads(2) != WEFT_OK)
    cr_skip_test("this build's CPU kernels run on 1 thread: %s", weft_last_error());
  rng_seed(99);
  const int64_t shape[3] = {7, 300, 90}, n = 7 * 300 * 90;
  float *x = falloc(n);
  fill(x, NULL, n, -2, 2);
  x[5 * 300 * 90 + 17 * 90 + 33] = NAN;
  weft_tensor *tx;
  cr_assert_eq(weft_tensor_wrap(x, WEFT_F32, WEFT_CPU, 3, shape, &tx), WEFT_OK);
  for (int d = 0; d < 3; d++) {
    int64_t os[3] = {shape[0], shape[1], shape[2]}; /* keepdim */
    os[d] = 1;
    const int64_t outer = d == 0   ? 1
                          : d == 1 ? 7
                                   : 7 * 300,
                  len = shape[d],
                  inner = d == 0   ? 300 * 90
                          : d == 1 ? 90
                                   : 1,
                  m = outer * inner;
    float *got = falloc(m), *want = falloc(m);
    weft_tensor *to;
    cr_assert_eq(weft_tensor_wrap(got, WEFT_F32, WEFT_CPU, 3, os, &to), WEFT_OK);
    for (int kind = WEFT_REDUCE_SUM; kind <= WEFT_REDUCE_MAX; kind++) {
      for (int64_t o = 0; o < outer; o++)
        for (int64_t i = 0; i < inner; i++) {
          double acc = kind == WEFT_REDUCE_MAX ? -INFINITY : 0.0;
          for (int64_t l = 0; l < len; l++) {
            const double v = x[(o * len + l) * inner + i];
            if (kind == WEFT_REDUCE_SUM) acc += v;
            if (kind == WEFT_REDUCE_SUMSQ) acc += v * v;
            if (kind == WEFT_REDUCE_MAX && acc == acc && (v != v || v > acc)) acc = v;
          }
          want[o * inner + i] = (float)acc;
        }
      for (int nt = 1; nt <= 3; nt++) {
        cr_assert_eq(weft_cpu_set_num_threads(nt), WEFT_OK);
        memset(got, 0, sizeof(float) * (size_t)m);
        cr_assert_eq(weft_reduce(tx, (weft_reduce_kind)kind, d, to), WEFT_OK);
        for (int64_t i = 0; i < m; i++)
          if (!(got[i] == want[i] || (got[i] != got[i] && want[i] != want[i]))) {
            cr_expect(false,
                      "reduce kind %d over dim %d on %d threads: out[%lld] = %.9g, want %.9g", kind,
                      d, nt, (long long)i, got[i], want[i]);
            break;
          }
      }
    }
    weft_tensor_destroy(to);
    free(got), free(want);
  }
  weft_tensor_destroy(tx);
  free(x);
  cr_assert_eq(weft_cpu_set_num_threads(was), WEFT_OK);
}
