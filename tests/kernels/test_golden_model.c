/* KERNELS-COMPOSE CHECK: the reference model (DESIGN.md) built from the
 * layer kernels alone, forward + backward + clip + AdamW on one rank,
 * against PyTorch float64 golden vectors (tests/data/golden/<cfg>/, see the
 * README there). nn/ provides the real module; this composition is
 * test-local and kept compact on purpose: parameters in one flat
 * allocation (llm.c style), activations saved per layer, the backward a
 * mirror of the forward.
 *
 * Tolerances from golden/README.md: loss 1e-6 relative, gradients 1e-5
 * relative per tensor (by norm), AdamW update (after - init) 1e-3. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "layers.h"
#include "safetensors.h"

#define NPL 9 /* parameters per layer */
static const char *layer_param[NPL] = {
    "attention_norm.weight", "attention.wq.weight", "attention.wk.weight",
    "attention.wv.weight",   "attention.wo.weight", "ffn_norm.weight",
    "feed_forward.w1.weight", "feed_forward.w3.weight", "feed_forward.w2.weight"};
enum { P_ANORM, P_WQ, P_WK, P_WV, P_WO, P_FNORM, P_W1, P_W3, P_W2 };

typedef struct golden {
  int64_t D, L, H, Hkv, F, V, T, B, hd;
  double lr, beta1, beta2, eps, wd, clip, loss, grad_norm;
} golden;

typedef struct model {
  golden c;
  int np;                 /* 3 + 9 L */
  char (*name)[64];
  int64_t *numel;
  float *params, *grads;  /* one allocation each */
  float **p, **g;         /* p[i] points into params */
  /* activations, N = B T rows */
  int32_t *inp, *tgt;
  float *x;               /* (L + 1, N, D): residual stream entering each layer, then final */
  float *n1, *rstd1, *q, *k, *v, *att, *lse, *h, *n2, *rstd2, *a, *b, *gg; /* per layer */
  float *nf, *rstdf, *logits, *lsece;
  float *cosb, *sinb, *scratch;
  /* backward buffers */
  float *dx, *dbig, *dq, *dk, *dv, *da, *db, *dn;
} model;

static int64_t pi(const model *m, int64_t l, int which) { return 1 + l * NPL + which; }
#define P_TOK 0
#define P_NORM (m->np - 2)
#define P_OUT (m->np - 1)

/* ------------------------------------------------------------- test data */

static char *slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = malloc((size_t)n + 1);
  size_t got = fread(buf, 1, (size_t)n, f);
  fclose(f);
  buf[got] = '\0';
  if (len) *len = got;
  return buf;
}

/* The number after "key": in expected.json (keys there are unique). */
static double json_num(const char *json, const char *key) {
  char pat[64];
  snprintf(pat, sizeof pat, "\"%s\"", key);
  const char *p = strstr(json, pat);
  cr_assert(p != NULL, "expected.json has no \"%s\"", key);
  p = strchr(p + strlen(pat), ':');
  cr_assert(p != NULL);
  return strtod(p + 1, NULL);
}

static void load_config(golden *c, const char *dir) {
  char path[1024];
  snprintf(path, sizeof path, "%s/expected.json", dir);
  char *j = slurp(path, NULL);
  cr_assert(j != NULL, "cannot read %s", path);
  c->D = (int64_t)json_num(j, "dim");
  c->L = (int64_t)json_num(j, "layers");
  c->H = (int64_t)json_num(j, "heads");
  c->Hkv = (int64_t)json_num(j, "kv_heads");
  c->F = (int64_t)json_num(j, "ffn");
  c->V = (int64_t)json_num(j, "vocab");
  c->T = (int64_t)json_num(j, "seq");
  c->B = (int64_t)json_num(j, "batch");
  c->lr = json_num(j, "lr");
  c->beta1 = json_num(j, "beta1");
  c->beta2 = json_num(j, "beta2");
  c->eps = json_num(j, "eps");
  c->wd = json_num(j, "weight_decay");
  c->clip = json_num(j, "clip");
  c->loss = json_num(j, "loss");
  c->grad_norm = json_num(j, "grad_norm_before_clip");
  c->hd = c->D / c->H;
  free(j);
}

/* llm.c token file: 256 int32 header (magic 20240520, version 1, count),
 * then count uint16 tokens. Inputs tokens[0:BT], targets tokens[1:BT+1]. */
static void load_tokens(model *m, const char *dir) {
  char path[1024];
  snprintf(path, sizeof path, "%s/tokens.bin", dir);
  size_t len;
  char *raw = slurp(path, &len);
  cr_assert(raw != NULL && len >= 1024, "cannot read %s", path);
  int32_t hdr[256];
  memcpy(hdr, raw, sizeof hdr);
  cr_assert_eq(hdr[0], 20240520, "%s: magic %d", path, hdr[0]);
  cr_assert_eq(hdr[1], 1, "%s: version %d", path, hdr[1]);
  const int64_t N = m->c.B * m->c.T;
  cr_assert(hdr[2] >= N + 1, "%s: %d tokens, need %lld", path, hdr[2], (long long)(N + 1));
  cr_assert_eq(len, 1024 + 2 * (size_t)hdr[2], "%s: %zu bytes for %d tokens", path, len, hdr[2]);
  const uint8_t *t = (const uint8_t *)raw + 1024;
  for (int64_t i = 0; i <= N; i++) {
    int32_t tok = t[2 * i] | (t[2 * i + 1] << 8);
    cr_assert(tok < m->c.V, "token %lld = %d >= V", (long long)i, tok);
    if (i < N) m->inp[i] = tok;
    if (i > 0) m->tgt[i - 1] = tok;
  }
  free(raw);
}

static float *fz(int64_t n) { return calloc((size_t)(n > 0 ? n : 1), sizeof(float)); }

static void model_build(model *m, const char *dir) {
  memset(m, 0, sizeof *m);
  load_config(&m->c, dir);
  const golden *c = &m->c;
  const int64_t D = c->D, F = c->F, V = c->V, L = c->L, qd = c->H * c->hd, kd = c->Hkv * c->hd;
  const int64_t N = c->B * c->T;
  m->np = (int)(3 + NPL * L);
  m->name = calloc((size_t)m->np, sizeof *m->name);
  m->numel = calloc((size_t)m->np, sizeof *m->numel);
  m->p = calloc((size_t)m->np, sizeof *m->p);
  m->g = calloc((size_t)m->np, sizeof *m->g);
  const int64_t per[NPL] = {D, qd * D, kd * D, kd * D, D * qd, D, F * D, F * D, D * F};
  snprintf(m->name[P_TOK], 64, "tok_embeddings.weight");
  m->numel[P_TOK] = V * D;
  for (int64_t l = 0; l < L; l++)
    for (int w = 0; w < NPL; w++) {
      snprintf(m->name[pi(m, l, w)], 64, "layers.%lld.%s", (long long)l, layer_param[w]);
      m->numel[pi(m, l, w)] = per[w];
    }
  snprintf(m->name[P_NORM], 64, "norm.weight");
  m->numel[P_NORM] = D;
  snprintf(m->name[P_OUT], 64, "output.weight");
  m->numel[P_OUT] = V * D;
  int64_t total = 0;
  for (int i = 0; i < m->np; i++) total += m->numel[i];
  m->params = fz(total);
  m->grads = fz(total);
  int64_t off = 0;
  for (int i = 0; i < m->np; i++) {
    m->p[i] = m->params + off;
    m->g[i] = m->grads + off;
    off += m->numel[i];
  }
  char path[1024];
  snprintf(path, sizeof path, "%s/init.safetensors", dir);
  weft_safetensors *st;
  cr_assert_eq(weft_safetensors_open(path, &st), WEFT_OK, "%s", weft_last_error());
  cr_assert_eq(weft_safetensors_count(st), m->np, "%s: %lld tensors, model has %d", path,
               (long long)weft_safetensors_count(st), m->np);
  for (int i = 0; i < m->np; i++) {
    weft_safetensors_info info;
    cr_assert_eq(weft_safetensors_find(st, m->name[i], &info), WEFT_OK, "%s", weft_last_error());
    cr_assert_eq(info.numel, m->numel[i], "%s: %lld elements, expected %lld", m->name[i],
                 (long long)info.numel, (long long)m->numel[i]);
    cr_assert_eq(weft_safetensors_read(st, m->name[i], WEFT_F32, m->p[i], m->numel[i]), WEFT_OK,
                 "%s", weft_last_error());
  }
  weft_safetensors_close(st);

  m->inp = calloc((size_t)N, sizeof *m->inp);
  m->tgt = calloc((size_t)N, sizeof *m->tgt);
  load_tokens(m, dir);
  m->x = fz((L + 1) * N * D);
  m->n1 = fz(L * N * D); m->rstd1 = fz(L * N); m->q = fz(L * N * qd); m->k = fz(L * N * kd);
  m->v = fz(L * N * kd); m->att = fz(L * N * qd); m->lse = fz(L * c->B * c->H * c->T);
  m->h = fz(L * N * D); m->n2 = fz(L * N * D); m->rstd2 = fz(L * N);
  m->a = fz(L * N * F); m->b = fz(L * N * F); m->gg = fz(L * N * F);
  m->nf = fz(N * D); m->rstdf = fz(N); m->logits = fz(N * V); m->lsece = fz(N);
  m->cosb = fz(c->T * c->hd / 2); m->sinb = fz(c->T * c->hd / 2);
  cr_assert_eq(weft_rope_tables(m->cosb, m->sinb, c->T, c->hd, 10000.0), WEFT_OK);
  m->scratch = fz(weft_attention_scratch_floats(c->T));
  int64_t big = N * (V > F ? (V > qd ? V : qd) : (F > qd ? F : qd));
  m->dx = fz(N * D); m->dbig = fz(big); m->dq = fz(N * qd); m->dk = fz(N * kd); m->dv = fz(N * kd);
  m->da = fz(N * F); m->db = fz(N * F); m->dn = fz(N * D);
}

static void model_free(model *m) {
  float *fs[] = {m->params, m->grads, m->x, m->n1, m->rstd1, m->q, m->k, m->v, m->att, m->lse,
                 m->h, m->n2, m->rstd2, m->a, m->b, m->gg, m->nf, m->rstdf, m->logits, m->lsece,
                 m->cosb, m->sinb, m->scratch, m->dx, m->dbig, m->dq, m->dk, m->dv, m->da,
                 m->db, m->dn};
  for (size_t i = 0; i < sizeof fs / sizeof fs[0]; i++) free(fs[i]);
  free(m->name); free(m->numel); free(m->p); free(m->g); free(m->inp); free(m->tgt);
}

#define OK(expr) cr_assert_eq((expr), WEFT_OK, "%s: %s", #expr, weft_last_error())

/* ------------------------------------------------------- forward/backward */

static double model_forward(model *m) {
  const golden *c = &m->c;
  const int64_t B = c->B, T = c->T, D = c->D, F = c->F, V = c->V, H = c->H, Hkv = c->Hkv,
                hd = c->hd, qd = H * hd, kd = Hkv * hd, N = B * T;
  OK(weft_embedding_forward(m->x, m->inp, m->p[P_TOK], N, V, D));
  for (int64_t l = 0; l < c->L; l++) {
    float *x = m->x + l * N * D, *xo = x + N * D, *n1 = m->n1 + l * N * D, *q = m->q + l * N * qd,
          *k = m->k + l * N * kd, *v = m->v + l * N * kd, *att = m->att + l * N * qd,
          *h = m->h + l * N * D, *n2 = m->n2 + l * N * D, *a = m->a + l * N * F,
          *b = m->b + l * N * F, *g = m->gg + l * N * F;
    float *const *P = m->p + pi(m, l, 0);
    /* h = x + wo(attn(rmsnorm(x))) */
    OK(weft_rmsnorm_forward(n1, m->rstd1 + l * N, x, P[P_ANORM], N, D, 1e-5f));
    OK(weft_linear_forward(q, n1, P[P_WQ], NULL, N, D, qd));
    OK(weft_linear_forward(k, n1, P[P_WK], NULL, N, D, kd));
    OK(weft_linear_forward(v, n1, P[P_WV], NULL, N, D, kd));
    OK(weft_rope_forward(q, q, m->cosb, m->sinb, T, B, T, H, hd, 0));
    OK(weft_rope_forward(k, k, m->cosb, m->sinb, T, B, T, Hkv, hd, 0));
    OK(weft_attention_forward(att, m->lse + l * B * H * T, q, k, v, B, T, H, Hkv, hd, m->scratch));
    OK(weft_linear_forward(h, att, P[P_WO], NULL, N, qd, D));
    OK(weft_residual_forward(h, h, x, N * D));
    /* out = h + w2(silu(w1 n) * w3 n), n = rmsnorm(h) */
    OK(weft_rmsnorm_forward(n2, m->rstd2 + l * N, h, P[P_FNORM], N, D, 1e-5f));
    OK(weft_linear_forward(a, n2, P[P_W1], NULL, N, D, F));
    OK(weft_linear_forward(b, n2, P[P_W3], NULL, N, D, F));
    OK(weft_swiglu_forward(g, a, b, N * F));
    OK(weft_linear_forward(xo, g, P[P_W2], NULL, N, F, D));
    OK(weft_residual_forward(xo, xo, h, N * D));
  }
  OK(weft_rmsnorm_forward(m->nf, m->rstdf, m->x + c->L * N * D, m->p[P_NORM], N, D, 1e-5f));
  OK(weft_linear_forward(m->logits, m->nf, m->p[P_OUT], NULL, N, D, V));
  double loss;
  OK(weft_cross_entropy_forward(&loss, m->lsece, m->logits, m->tgt, N, V));
  return loss;
}

/* Gradients of the mean loss into m->g (overwritten: zero_grad first). */
static void model_backward(model *m) {
  const golden *c = &m->c;
  const int64_t B = c->B, T = c->T, D = c->D, F = c->F, V = c->V, H = c->H, Hkv = c->Hkv,
                hd = c->hd, qd = H * hd, kd = Hkv * hd, N = B * T;
  int64_t total = 0;
  for (int i = 0; i < m->np; i++) total += m->numel[i];
  memset(m->grads, 0, (size_t)total * sizeof(float));
  float *dlog = m->dbig, *dx = m->dx;
  OK(weft_cross_entropy_backward(dlog, m->logits, m->lsece, m->tgt, N, V, 1.0f / (float)N));
  OK(weft_linear_backward(m->dn, m->g[P_OUT], NULL, dlog, m->nf, m->p[P_OUT], N, D, V, false, true));
  OK(weft_rmsnorm_backward(dx, m->g[P_NORM], m->dn, m->x + c->L * N * D, m->p[P_NORM], m->rstdf,
                           N, D, false));
  for (int64_t l = c->L - 1; l >= 0; l--) {
    float *x = m->x + l * N * D, *n1 = m->n1 + l * N * D, *q = m->q + l * N * qd,
          *k = m->k + l * N * kd, *v = m->v + l * N * kd, *att = m->att + l * N * qd,
          *h = m->h + l * N * D, *n2 = m->n2 + l * N * D, *a = m->a + l * N * F,
          *b = m->b + l * N * F, *g = m->gg + l * N * F;
    float *const *P = m->p + pi(m, l, 0);
    float *const *G = m->g + pi(m, l, 0);
    /* feed-forward branch; dx carries d(out) = d(h) through the residual */
    float *dg = m->dbig;
    OK(weft_linear_backward(dg, G[P_W2], NULL, dx, g, P[P_W2], N, F, D, false, true));
    OK(weft_swiglu_backward(m->da, m->db, dg, a, b, N * F));
    OK(weft_linear_backward(m->dn, G[P_W1], NULL, m->da, n2, P[P_W1], N, D, F, false, true));
    OK(weft_linear_backward(m->dn, G[P_W3], NULL, m->db, n2, P[P_W3], N, D, F, true, true));
    OK(weft_rmsnorm_backward(dx, G[P_FNORM], m->dn, h, P[P_FNORM], m->rstd2 + l * N, N, D, true));
    /* attention branch; dx now d(h) = d(x) through the residual */
    float *datt = m->dbig;
    OK(weft_linear_backward(datt, G[P_WO], NULL, dx, att, P[P_WO], N, qd, D, false, true));
    OK(weft_attention_backward(m->dq, m->dk, m->dv, datt, q, k, v, m->lse + l * B * H * T, B, T,
                               H, Hkv, hd, m->scratch));
    OK(weft_rope_backward(m->dq, m->dq, m->cosb, m->sinb, T, B, T, H, hd, 0));
    OK(weft_rope_backward(m->dk, m->dk, m->cosb, m->sinb, T, B, T, Hkv, hd, 0));
    OK(weft_linear_backward(m->dn, G[P_WQ], NULL, m->dq, n1, P[P_WQ], N, D, qd, false, true));
    OK(weft_linear_backward(m->dn, G[P_WK], NULL, m->dk, n1, P[P_WK], N, D, kd, true, true));
    OK(weft_linear_backward(m->dn, G[P_WV], NULL, m->dv, n1, P[P_WV], N, D, kd, true, true));
    OK(weft_rmsnorm_backward(dx, G[P_ANORM], m->dn, x, P[P_ANORM], m->rstd1 + l * N, N, D, true));
  }
  OK(weft_embedding_backward(m->g[P_TOK], m->inp, dx, N, V, D));
}

/* ------------------------------------------------------------------ check */

static double rel_norm(const float *got, const double *want, const double *base, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; i++) {
    double w = want[i] - (base ? base[i] : 0);
    double e = (double)got[i] - (base ? base[i] : 0) - w;
    num += e * e;
    den += w * w;
  }
  return den > 0 ? sqrt(num / den) : sqrt(num);
}

static void check_golden(const char *cfgname) {
  char dir[512], path[1024];
  snprintf(dir, sizeof dir, "%s/golden/%s", WEFT_TEST_DATA_DIR, cfgname);
  model m;
  model_build(&m, dir);
  const golden *c = &m.c;

  double loss = model_forward(&m);
  double lerr = fabs(loss - c->loss) / fabs(c->loss);
  cr_expect(lerr <= 1e-6, "%s: loss %.10g, golden %.10g (rel %.2e > 1e-6)", cfgname, loss, c->loss, lerr);

  model_backward(&m);
  snprintf(path, sizeof path, "%s/grads.safetensors", dir);
  weft_safetensors *gs;
  OK(weft_safetensors_open(path, &gs));
  double worst = 0, sumsq = 0;
  const char *worst_name = "";
  for (int i = 0; i < m.np; i++) {
    double *ref = malloc((size_t)m.numel[i] * sizeof *ref);
    OK(weft_safetensors_read(gs, m.name[i], WEFT_F64, ref, m.numel[i]));
    double r = rel_norm(m.g[i], ref, NULL, m.numel[i]);
    cr_expect(r <= 1e-5, "%s: grad of %s: rel err %.2e > 1e-5", cfgname, m.name[i], r);
    if (r > worst) { worst = r; worst_name = m.name[i]; }
    sumsq += weft_sumsq(m.g[i], m.numel[i]);
    free(ref);
  }
  weft_safetensors_close(gs);
  double gnorm = sqrt(sumsq), nerr = fabs(gnorm - c->grad_norm) / c->grad_norm;
  cr_expect(nerr <= 1e-5, "%s: grad norm %.10g, golden %.10g", cfgname, gnorm, c->grad_norm);

  /* clip_grad_norm_(clip), then one AdamW step from zero moments */
  float coef = (float)weft_clip_coef(gnorm, c->clip);
  int64_t total = 0;
  for (int i = 0; i < m.np; i++) total += m.numel[i];
  weft_scale_f32(m.grads, total, coef);
  float *mm = fz(total), *vv = fz(total);
  double *init = malloc((size_t)total * sizeof *init);
  for (int64_t i = 0; i < total; i++) init[i] = m.params[i];
  weft_adamw_params hp = {.lr = (float)c->lr, .beta1 = (float)c->beta1, .beta2 = (float)c->beta2,
                          .eps = (float)c->eps, .weight_decay = (float)c->wd};
  OK(weft_adamw_step(m.params, m.grads, mm, vv, NULL, total, 1, &hp));
  snprintf(path, sizeof path, "%s/after_step.safetensors", dir);
  weft_safetensors *as;
  OK(weft_safetensors_open(path, &as));
  double worst_u = 0;
  for (int i = 0; i < m.np; i++) {
    double *ref = malloc((size_t)m.numel[i] * sizeof *ref);
    OK(weft_safetensors_read(as, m.name[i], WEFT_F64, ref, m.numel[i]));
    double r = rel_norm(m.p[i], ref, init + (m.p[i] - m.params), m.numel[i]);
    cr_expect(r <= 1e-3, "%s: AdamW update of %s: rel err %.2e > 1e-3", cfgname, m.name[i], r);
    if (r > worst_u) worst_u = r;
    free(ref);
  }
  weft_safetensors_close(as);
  cr_log_info("%s: loss rel err %.2e, worst grad rel err %.2e (%s), grad norm rel err %.2e, "
              "worst AdamW update rel err %.2e", cfgname, lerr, worst, worst_name, nerr, worst_u);
  free(mm); free(vv); free(init);
  model_free(&m);
}

Test(golden_model, tiny_mha_loss_grads_and_adamw_step_match_pytorch) { check_golden("tiny_mha"); }
Test(golden_model, tiny_gqa_loss_grads_and_adamw_step_match_pytorch) { check_golden("tiny_gqa"); }
