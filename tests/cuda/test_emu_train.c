/* examples/gpu/gpu_model on the emulated WEFT_CUDA device (-Dcuda=emulated
 * builds: the device kernels run as fibers on the CPU, in strict and
 * deferred mode, see kernels/cuda/emu).
 *
 * - golden: one step of tiny_mha and tiny_gqa against PyTorch float64
 *   (tests/data/golden/README.md tolerances: loss 1e-6, every gradient 1e-5
 *   by norm, the gradient norm 1e-5, the AdamW update after - init 1e-3);
 * - three training steps on the golden batch lower the loss and match a CPU
 *   run of the same steps (the CPU composition of layers.h below, plus
 *   clip and AdamW; it goes with examples/gpu when the stack runs on the
 *   device);
 * - two runs from the same weights give identical bits (the emulator is
 *   deterministic; so is every kernel gpu_model uses there);
 * - RNG init follows weft_tensor_fill_normal, bad configs and tokens are
 *   rejected. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../examples/gpu/gpu_golden.h"
#include "../../examples/gpu/gpu_model.h"
#include "cuda.h"
#include "harness.h"
#include "kernels.h"
#include "layers.h"
#include "safetensors.h"

/* ------------------------------------------------------------ golden data */

/* tests/data/golden/<name> through the trainer's loader (gpu_golden.c). */
static void golden_load(const char *name, gpu_golden *g) {
  char dir[1024];
  snprintf(dir, sizeof dir, "%s/golden/%s", WEFT_TEST_DATA_DIR, name);
  weft_status st = gpu_golden_load(dir, g);
  cr_assert_eq(st, WEFT_OK, "%s", weft_last_error());
}

static gpu_model *make_model(const gpu_golden *g) {
  OK(weft_cuda_init(0, NULL));
  gpu_model *m;
  OK(gpu_model_create(&g->cfg, NULL, 0, &m));
  char path[1024];
  snprintf(path, sizeof path, "%s/init.safetensors", g->dir);
  OK(gpu_model_load_safetensors(m, path));
  OK(gpu_model_set_batch(m, g->inp, g->tgt));
  return m;
}

static float **read_all(const gpu_model *m, bool grads) {
  int np = gpu_model_num_tensors(m);
  float **out = calloc((size_t)np, sizeof *out);
  for (int i = 0; i < np; i++) {
    out[i] = malloc((size_t)gpu_model_tensor_numel(m, i) * sizeof **out);
    OK(grads ? gpu_model_read_grad(m, i, out[i]) : gpu_model_read_param(m, i, out[i]));
  }
  return out;
}
static void free_all(float **a, int np) {
  for (int i = 0; i < np; i++) free(a[i]);
  free(a);
}

/* ------------------------------------------------------------- golden step */

static void check_golden(const char *name) {
  gpu_golden g;
  golden_load(name, &g);
  gpu_model_config preset;
  OK(gpu_model_config_preset(name, &preset));
  cr_assert(preset.D == g.cfg.D && preset.L == g.cfg.L && preset.H == g.cfg.H &&
                preset.Hkv == g.cfg.Hkv && preset.F == g.cfg.F && preset.V == g.cfg.V &&
                preset.T == g.cfg.T && preset.B == g.cfg.B,
            "%s: preset differs from expected.json", name);
  gpu_model *m = make_model(&g);
  const int np = gpu_model_num_tensors(m);
  cr_assert_eq(np, 3 + 9 * g.cfg.L);
  float **init = read_all(m, false);

  double loss;
  OK(gpu_model_forward(m, &loss));
  const double lerr = fabs(loss - g.loss) / fabs(g.loss);
  cr_expect(lerr <= 1e-6, "%s: loss %.10g, golden %.10g (rel %.2e > 1e-6)", name, loss, g.loss,
            lerr);

  OK(gpu_model_backward(m));
  char path[1024];
  snprintf(path, sizeof path, "%s/grads.safetensors", g.dir);
  weft_safetensors *f;
  OK(weft_safetensors_open(path, &f));
  float **grads = read_all(m, true);
  double worst = 0, sumsq = 0;
  const char *worst_name = "";
  for (int i = 0; i < np; i++) {
    const int64_t n = gpu_model_tensor_numel(m, i);
    double *ref = malloc((size_t)n * sizeof *ref);
    OK(weft_safetensors_read(f, gpu_model_tensor_name(m, i), WEFT_F64, ref, n));
    double r = gpu_golden_rel_err(grads[i], ref, NULL, n);
    cr_expect(r <= 1e-5, "%s: grad of %s: rel err %.2e > 1e-5", name, gpu_model_tensor_name(m, i),
              r);
    if (r > worst) {
      worst = r;
      worst_name = gpu_model_tensor_name(m, i);
    }
    sumsq += weft_sumsq(grads[i], n);
    free(ref);
  }
  weft_safetensors_close(f);

  double norm;
  OK(gpu_model_clip_grads(m, g.clip, &norm));
  const double nerr = fabs(norm - g.grad_norm) / g.grad_norm;
  cr_expect(nerr <= 1e-5, "%s: grad norm %.10g, golden %.10g (rel %.2e)", name, norm, g.grad_norm,
            nerr);
  /* the device norm is the CPU norm of the same gradients */
  cr_expect(fabs(norm - sqrt(sumsq)) <= 1e-9 * sqrt(sumsq), "%s: device norm %.12g, host %.12g",
            name, norm, sqrt(sumsq));
  /* clipping scaled every gradient by weft_clip_coef */
  float **clipped = read_all(m, true);
  const float coef = (float)weft_clip_coef(norm, g.clip);
  cr_assert(coef < 1.0f, "%s: golden norm %.3g should clip at %.3g", name, norm, g.clip);
  for (int i = 0; i < np; i++)
    for (int64_t e = 0; e < gpu_model_tensor_numel(m, i); e++)
      cr_assert_float_eq(clipped[i][e], grads[i][e] * coef, 1e-6f * fabsf(grads[i][e]) + 1e-30f,
                         "%s: clipped grad of %s[%lld]", name, gpu_model_tensor_name(m, i),
                         (long long)e);

  OK(gpu_model_adamw_step(m, &g.hp));
  snprintf(path, sizeof path, "%s/after_step.safetensors", g.dir);
  OK(weft_safetensors_open(path, &f));
  float **after = read_all(m, false);
  double worst_u = 0;
  for (int i = 0; i < np; i++) {
    const int64_t n = gpu_model_tensor_numel(m, i);
    double *ref = malloc((size_t)n * sizeof *ref);
    OK(weft_safetensors_read(f, gpu_model_tensor_name(m, i), WEFT_F64, ref, n));
    double r = gpu_golden_rel_err(after[i], ref, init[i], n);
    cr_expect(r <= 1e-3, "%s: AdamW update of %s: rel err %.2e > 1e-3", name,
              gpu_model_tensor_name(m, i), r);
    if (r > worst_u) worst_u = r;
    free(ref);
  }
  weft_safetensors_close(f);
  cr_log_info(
      "%s (emulator): loss rel err %.2e, worst grad rel err %.2e (%s), grad norm rel err "
      "%.2e, worst AdamW update rel err %.2e",
      name, lerr, worst, worst_name, nerr, worst_u);
  free_all(init, np);
  free_all(grads, np);
  free_all(clipped, np);
  free_all(after, np);
  gpu_model_destroy(m);
  gpu_golden_free(&g);
}

Test(emu_train, tiny_mha_golden_step_matches_pytorch, .timeout = 60) { check_golden("tiny_mha"); }
Test(emu_train, tiny_gqa_golden_step_matches_pytorch, .timeout = 60) { check_golden("tiny_gqa"); }

/* ---------------------------------------------- CPU composition (layers.h) */

/* The reference model on the CPU kernels (layers.h), as gpu_model composes
 * it on the device; tensors in gpu_model's order, one host array each. */
enum { P_ANORM, P_WQ, P_WK, P_WV, P_WO, P_FNORM, P_W1, P_W3, P_W2 };
typedef struct cpu_model {
  gpu_model_config c;
  int64_t N, hd, qd, kd;
  int np;
  int64_t *numel;
  float **p, **g, **mm, **vv;
  const int32_t *inp, *tgt;
  float *x, *n1, *rstd1, *q, *k, *v, *att, *lse, *h, *n2, *rstd2, *a, *b, *gg;
  float *nf, *rstdf, *logits, *lsece, *cosb, *sinb, *scratch;
  float *dx, *dbig, *dq, *dk, *dv, *da, *db, *dn;
} cpu_model;

static float *fz(int64_t n) { return calloc((size_t)(n > 0 ? n : 1), sizeof(float)); }

static void cpu_build(cpu_model *m, const gpu_model *gm, const gpu_golden *gd) {
  memset(m, 0, sizeof *m);
  m->c = gd->cfg;
  const gpu_model_config *c = &m->c;
  m->hd = c->D / c->H;
  m->qd = c->H * m->hd;
  m->kd = c->Hkv * m->hd;
  m->N = c->B * c->T;
  const int64_t D = c->D, F = c->F, V = c->V, L = c->L, qd = m->qd, kd = m->kd, N = m->N;
  m->np = gpu_model_num_tensors(gm);
  m->numel = calloc((size_t)m->np, sizeof *m->numel);
  m->p = read_all(gm, false); /* the same starting weights */
  m->g = calloc((size_t)m->np, sizeof *m->g);
  m->mm = calloc((size_t)m->np, sizeof *m->mm);
  m->vv = calloc((size_t)m->np, sizeof *m->vv);
  for (int i = 0; i < m->np; i++) {
    m->numel[i] = gpu_model_tensor_numel(gm, i);
    m->g[i] = fz(m->numel[i]);
    m->mm[i] = fz(m->numel[i]);
    m->vv[i] = fz(m->numel[i]);
  }
  m->inp = gd->inp;
  m->tgt = gd->tgt;
  m->x = fz((L + 1) * N * D);
  m->n1 = fz(L * N * D);
  m->rstd1 = fz(L * N);
  m->q = fz(L * N * qd);
  m->k = fz(L * N * kd);
  m->v = fz(L * N * kd);
  m->att = fz(L * N * qd);
  m->lse = fz(L * c->B * c->H * c->T);
  m->h = fz(L * N * D);
  m->n2 = fz(L * N * D);
  m->rstd2 = fz(L * N);
  m->a = fz(L * N * F);
  m->b = fz(L * N * F);
  m->gg = fz(L * N * F);
  m->nf = fz(N * D);
  m->rstdf = fz(N);
  m->logits = fz(N * V);
  m->lsece = fz(N);
  m->cosb = fz(c->T * m->hd / 2);
  m->sinb = fz(c->T * m->hd / 2);
  OK(weft_rope_tables(m->cosb, m->sinb, c->T, m->hd, c->rope_theta));
  m->scratch = fz(weft_attention_scratch_floats(c->T));
  int64_t big = N * (V > F ? (V > qd ? V : qd) : (F > qd ? F : qd));
  m->dx = fz(N * D);
  m->dbig = fz(big);
  m->dq = fz(N * qd);
  m->dk = fz(N * kd);
  m->dv = fz(N * kd);
  m->da = fz(N * F);
  m->db = fz(N * F);
  m->dn = fz(N * D);
}

static void cpu_free(cpu_model *m) {
  float *fs[] = {m->x,      m->n1,    m->rstd1, m->q,    m->k,       m->v,  m->att,  m->lse,
                 m->h,      m->n2,    m->rstd2, m->a,    m->b,       m->gg, m->nf,   m->rstdf,
                 m->logits, m->lsece, m->cosb,  m->sinb, m->scratch, m->dx, m->dbig, m->dq,
                 m->dk,     m->dv,    m->da,    m->db,   m->dn};
  for (size_t i = 0; i < sizeof fs / sizeof fs[0]; i++) free(fs[i]);
  free_all(m->p, m->np);
  free_all(m->g, m->np);
  free_all(m->mm, m->np);
  free_all(m->vv, m->np);
  free(m->numel);
}

static double cpu_forward(cpu_model *m) {
  const gpu_model_config *c = &m->c;
  const int64_t B = c->B, T = c->T, D = c->D, F = c->F, V = c->V, H = c->H, Hkv = c->Hkv,
                hd = m->hd, qd = m->qd, kd = m->kd, N = m->N;
  OK(weft_embedding_forward(m->x, m->inp, m->p[0], N, V, D));
  for (int64_t l = 0; l < c->L; l++) {
    float *x = m->x + l * N * D, *xo = x + N * D, *n1 = m->n1 + l * N * D, *q = m->q + l * N * qd,
          *k = m->k + l * N * kd, *v = m->v + l * N * kd, *att = m->att + l * N * qd,
          *h = m->h + l * N * D, *n2 = m->n2 + l * N * D, *a = m->a + l * N * F,
          *b = m->b + l * N * F, *g = m->gg + l * N * F;
    float *const *P = m->p + 1 + 9 * l;
    OK(weft_rmsnorm_forward(n1, m->rstd1 + l * N, x, P[P_ANORM], N, D, 1e-5f));
    OK(weft_linear_forward(q, n1, P[P_WQ], NULL, N, D, qd));
    OK(weft_linear_forward(k, n1, P[P_WK], NULL, N, D, kd));
    OK(weft_linear_forward(v, n1, P[P_WV], NULL, N, D, kd));
    OK(weft_rope_forward(q, q, m->cosb, m->sinb, T, B, T, H, hd, 0));
    OK(weft_rope_forward(k, k, m->cosb, m->sinb, T, B, T, Hkv, hd, 0));
    OK(weft_attention_forward(att, m->lse + l * B * H * T, q, k, v, B, T, H, Hkv, hd, true,
                              m->scratch));
    OK(weft_linear_forward(h, att, P[P_WO], NULL, N, qd, D));
    OK(weft_residual_forward(h, h, x, N * D));
    OK(weft_rmsnorm_forward(n2, m->rstd2 + l * N, h, P[P_FNORM], N, D, 1e-5f));
    OK(weft_linear_forward(a, n2, P[P_W1], NULL, N, D, F));
    OK(weft_linear_forward(b, n2, P[P_W3], NULL, N, D, F));
    OK(weft_swiglu_forward(g, a, b, N * F));
    OK(weft_linear_forward(xo, g, P[P_W2], NULL, N, F, D));
    OK(weft_residual_forward(xo, xo, h, N * D));
  }
  OK(weft_rmsnorm_forward(m->nf, m->rstdf, m->x + c->L * N * D, m->p[m->np - 2], N, D, 1e-5f));
  OK(weft_linear_forward(m->logits, m->nf, m->p[m->np - 1], NULL, N, D, V));
  double loss;
  OK(weft_cross_entropy_forward(&loss, m->lsece, m->logits, m->tgt, N, V));
  return loss;
}

static void cpu_backward(cpu_model *m) {
  const gpu_model_config *c = &m->c;
  const int64_t B = c->B, T = c->T, D = c->D, F = c->F, V = c->V, H = c->H, Hkv = c->Hkv,
                hd = m->hd, qd = m->qd, kd = m->kd, N = m->N;
  for (int i = 0; i < m->np; i++) memset(m->g[i], 0, (size_t)m->numel[i] * sizeof(float));
  float *dlog = m->dbig, *dx = m->dx;
  const int on = m->np - 1, nn = m->np - 2;
  OK(weft_cross_entropy_backward(dlog, m->logits, m->lsece, m->tgt, N, V, 1.0f / (float)N));
  OK(weft_linear_backward(m->dn, m->g[on], NULL, dlog, m->nf, m->p[on], N, D, V, false, true));
  OK(weft_rmsnorm_backward(dx, m->g[nn], m->dn, m->x + c->L * N * D, m->p[nn], m->rstdf, N, D,
                           false));
  for (int64_t l = c->L - 1; l >= 0; l--) {
    float *x = m->x + l * N * D, *n1 = m->n1 + l * N * D, *q = m->q + l * N * qd,
          *k = m->k + l * N * kd, *v = m->v + l * N * kd, *att = m->att + l * N * qd,
          *h = m->h + l * N * D, *n2 = m->n2 + l * N * D, *a = m->a + l * N * F,
          *b = m->b + l * N * F, *g = m->gg + l * N * F;
    float *const *P = m->p + 1 + 9 * l;
    float *const *G = m->g + 1 + 9 * l;
    float *dg = m->dbig;
    OK(weft_linear_backward(dg, G[P_W2], NULL, dx, g, P[P_W2], N, F, D, false, true));
    OK(weft_swiglu_backward(m->da, m->db, dg, a, b, N * F));
    OK(weft_linear_backward(m->dn, G[P_W1], NULL, m->da, n2, P[P_W1], N, D, F, false, true));
    OK(weft_linear_backward(m->dn, G[P_W3], NULL, m->db, n2, P[P_W3], N, D, F, true, true));
    OK(weft_rmsnorm_backward(dx, G[P_FNORM], m->dn, h, P[P_FNORM], m->rstd2 + l * N, N, D, true));
    float *datt = m->dbig;
    OK(weft_linear_backward(datt, G[P_WO], NULL, dx, att, P[P_WO], N, qd, D, false, true));
    OK(weft_attention_backward(m->dq, m->dk, m->dv, datt, q, k, v, m->lse + l * B * H * T, B, T, H,
                               Hkv, hd, true, m->scratch));
    OK(weft_rope_backward(m->dq, m->dq, m->cosb, m->sinb, T, B, T, H, hd, 0));
    OK(weft_rope_backward(m->dk, m->dk, m->cosb, m->sinb, T, B, T, Hkv, hd, 0));
    OK(weft_linear_backward(m->dn, G[P_WQ], NULL, m->dq, n1, P[P_WQ], N, D, qd, false, true));
    OK(weft_linear_backward(m->dn, G[P_WK], NULL, m->dk, n1, P[P_WK], N, D, kd, true, true));
    OK(weft_linear_backward(m->dn, G[P_WV], NULL, m->dv, n1, P[P_WV], N, D, kd, true, true));
    OK(weft_rmsnorm_backward(dx, G[P_ANORM], m->dn, x, P[P_ANORM], m->rstd1 + l * N, N, D, true));
  }
  OK(weft_embedding_backward(m->g[0], m->inp, dx, N, V, D));
}

static void cpu_step(cpu_model *m, const weft_adamw_params *hp, double clip, int64_t step,
                     double *loss, double *norm) {
  *loss = cpu_forward(m);
  cpu_backward(m);
  double sumsq = 0;
  for (int i = 0; i < m->np; i++) sumsq += weft_sumsq(m->g[i], m->numel[i]);
  *norm = sqrt(sumsq);
  const float coef = (float)weft_clip_coef(*norm, clip);
  for (int i = 0; i < m->np; i++) {
    if (coef < 1.0f) weft_scale_f32(m->g[i], m->numel[i], coef);
    OK(weft_adamw_step(m->p[i], m->g[i], m->mm[i], m->vv[i], NULL, m->numel[i], step, hp));
  }
}

/* --------------------------------------------------------------- training */

#define STEPS 3

Test(emu_train, three_steps_lower_the_loss_and_match_the_cpu_kernels, .timeout = 90) {
  gpu_golden g;
  golden_load("tiny_gqa", &g);
  weft_adamw_params hp = g.hp;
  hp.lr = 1e-2f; /* big enough that 3 steps on one batch visibly lower the loss */
  gpu_model *m = make_model(&g);
  cpu_model c;
  cpu_build(&c, m, &g);
  float **init = read_all(m, false);
  double gl[STEPS], gn[STEPS], cl[STEPS], cn[STEPS];
  for (int s = 0; s < STEPS; s++) {
    OK(gpu_model_train_step(m, &hp, g.clip, &gl[s], &gn[s]));
    cpu_step(&c, &hp, g.clip, s + 1, &cl[s], &cn[s]);
    const double le = fabs(gl[s] - cl[s]) / fabs(cl[s]), ne = fabs(gn[s] - cn[s]) / cn[s];
    cr_expect(le <= 1e-5, "step %d: emulated loss %.10g, CPU %.10g (rel %.2e)", s + 1, gl[s], cl[s],
              le);
    cr_expect(ne <= 1e-4, "step %d: emulated grad norm %.10g, CPU %.10g (rel %.2e)", s + 1, gn[s],
              cn[s], ne);
    cr_log_info("step %d: loss %.8f (CPU %.8f), grad norm %.6f (CPU %.6f)", s + 1, gl[s], cl[s],
                gn[s], cn[s]);
  }
  for (int s = 1; s < STEPS; s++)
    cr_expect(gl[s] < gl[s - 1] - 1e-3, "loss did not go down: step %d %.8f, step %d %.8f", s,
              gl[s - 1], s + 1, gl[s]);
  /* the weights after 3 steps: the update (after - init) agrees with the
   * CPU run's within the golden AdamW tolerance */
  float **after = read_all(m, false);
  double worst = 0;
  for (int i = 0; i < c.np; i++) {
    double r = weft_test_rel_change_f32(after[i], c.p[i], init[i], c.numel[i]);
    cr_expect(r <= 1e-3, "%s after %d steps: update rel err %.2e vs CPU",
              gpu_model_tensor_name(m, i), STEPS, r);
    if (r > worst) worst = r;
  }
  cr_log_info("after %d steps: worst update rel err vs CPU %.2e", STEPS, worst);
  free_all(init, c.np);
  free_all(after, c.np);
  cpu_free(&c);
  gpu_model_destroy(m);
  gpu_golden_free(&g);
}

Test(emu_train, two_runs_from_the_same_weights_are_bitwise_identical, .timeout = 90) {
  gpu_golden g;
  golden_load("tiny_mha", &g);
  float **res[2];
  double loss[2][STEPS];
  int np = 0;
  for (int run = 0; run < 2; run++) {
    gpu_model *m = make_model(&g);
    np = gpu_model_num_tensors(m);
    for (int s = 0; s < STEPS; s++) OK(gpu_model_train_step(m, &g.hp, g.clip, &loss[run][s], NULL));
    res[run] = read_all(m, false);
    gpu_model_destroy(m);
  }
  for (int s = 0; s < STEPS; s++)
    cr_expect(memcmp(&loss[0][s], &loss[1][s], sizeof(double)) == 0, "step %d: loss %.17g vs %.17g",
              s + 1, loss[0][s], loss[1][s]);
  gpu_model *m = make_model(&g);
  for (int i = 0; i < np; i++)
    cr_expect(
        memcmp(res[0][i], res[1][i], (size_t)gpu_model_tensor_numel(m, i) * sizeof(float)) == 0,
        "%s differs between two identical runs", gpu_model_tensor_name(m, i));
  gpu_model_destroy(m);
  free_all(res[0], np);
  free_all(res[1], np);
  gpu_golden_free(&g);
}

/* ------------------------------------------------------ init and arguments */

Test(emu_train, rng_init_is_weft_fill_normal_by_name_and_norms_are_one) {
  OK(weft_cuda_init(0, NULL));
  gpu_model_config c;
  OK(gpu_model_config_preset("tiny_gqa", &c));
  gpu_model *m;
  OK(gpu_model_create(&c, NULL, 0, &m));
  const uint64_t seed = 777;
  OK(gpu_model_init_weights(m, seed));
  cr_assert_eq(gpu_model_param_count(m),
               2 * c.V * c.D + c.D +
                   c.L * (2 * c.D + 2 * c.D * c.D + 2 * c.D * (c.D / c.H) * c.Hkv + 3 * c.D * c.F));
  for (int i = 0; i < gpu_model_num_tensors(m); i++) {
    const char *name = gpu_model_tensor_name(m, i);
    cr_assert_eq(gpu_model_tensor_index(m, name), i);
    int64_t n = gpu_model_tensor_numel(m, i);
    float *got = malloc((size_t)n * sizeof *got), *want = malloc((size_t)n * sizeof *want);
    OK(gpu_model_read_param(m, i, got));
    if (strstr(name, "norm.weight")) {
      for (int64_t e = 0; e < n; e++) want[e] = 1.0f;
    } else {
      weft_tensor v;
      OK(weft_tensor_view_init(&v, want, WEFT_F32, WEFT_CPU, 1, &n, NULL));
      OK(weft_tensor_fill_normal(&v, seed, weft_rng_key(name), NULL, 0.0f, 0.02f));
    }
    cr_expect(memcmp(got, want, (size_t)n * sizeof *got) == 0,
              "%s: not the RNG's values (seed %llu)", name, (unsigned long long)seed);
    free(got);
    free(want);
  }
  cr_assert_eq(gpu_model_tensor_index(m, "no.such.weight"), -1);
  gpu_model_destroy(m);
}

Test(emu_train, bad_configs_and_tokens_are_rejected_with_the_field_named) {
  OK(weft_cuda_init(0, NULL));
  gpu_model_config c, bad;
  OK(gpu_model_config_preset("tiny_mha", &c));
  gpu_model *m = NULL;
  cr_expect_eq(gpu_model_config_preset("gpt3", &bad), WEFT_ERR_NOT_FOUND);
  bad = c;
  bad.Hkv = 3;
  cr_expect_eq(gpu_model_create(&bad, NULL, 0, &m), WEFT_ERR_INVALID);
  cr_expect(strstr(weft_last_error(), "Hkv") != NULL, "%s", weft_last_error());
  bad = c;
  bad.F = 0;
  cr_expect_eq(gpu_model_create(&bad, NULL, 0, &m), WEFT_ERR_INVALID);
  cr_expect(strstr(weft_last_error(), "F = 0") != NULL, "%s", weft_last_error());
  bad = c;
  bad.H = 3;
  cr_expect_eq(gpu_model_create(&bad, NULL, 0, &m), WEFT_ERR_INVALID);
  cr_expect(m == NULL);
  OK(gpu_model_create(&c, NULL, 0, &m));
  const int64_t n = c.B * c.T;
  int32_t *inp = calloc((size_t)n, sizeof *inp), *tgt = calloc((size_t)n, sizeof *tgt);
  tgt[5] = (int32_t)c.V;
  cr_expect_eq(gpu_model_set_batch(m, inp, tgt), WEFT_ERR_INVALID);
  cr_expect(strstr(weft_last_error(), "target 5") != NULL, "%s", weft_last_error());
  weft_adamw_params hp = WEFT_ADAMW_DEFAULT;
  hp.amsgrad = true;
  cr_expect_eq(gpu_model_adamw_step(m, &hp), WEFT_ERR_UNSUPPORTED);
  free(inp);
  free(tgt);
  gpu_model_destroy(m);
}

/* Data parallel: weft-gpu-train (this build's, so on the emulated device)
 * under mpiexec on 2 ranks, each taking B/2 of the golden batch, gradients all-reduced
 * (AVG) over the "dp" mesh dim: the golden check (loss, every gradient,
 * the AdamW update) must pass on both golden configs. */
static void run_dp_golden(const char *cfg) {
  char cmd[2048];
  snprintf(cmd, sizeof cmd,
           "MPIEXEC_TIMEOUT=60 %s -n 2 %s --config %s --golden %s/golden/%s "
           "> %s/dp_%s.log 2>&1",
           WEFT_TEST_MPIEXEC, WEFT_GPU_TRAIN, cfg, WEFT_TEST_DATA_DIR, cfg, WEFT_TEST_BUILD_DIR,
           cfg);
  int rc = system(cmd);
  char log[512];
  snprintf(log, sizeof log, "%s/dp_%s.log", WEFT_TEST_BUILD_DIR, cfg);
  FILE *f = fopen(log, "r");
  char text[8192] = "";
  if (f) {
    size_t got = fread(text, 1, sizeof text - 1, f);
    text[got] = '\0';
    fclose(f);
  }
  cr_assert_eq(rc, 0, "2-rank golden run of %s failed (status %d); log:\n%s", cfg, rc, text);
  cr_assert(strstr(text, "golden=PASS") != NULL, "no golden=PASS in:\n%s", text);
}

Test(emu_train, data_parallel_2_ranks_golden_mha, .timeout = 120) { run_dp_golden("tiny_mha"); }
Test(emu_train, data_parallel_2_ranks_golden_gqa, .timeout = 120) { run_dp_golden("tiny_gqa"); }
