/* weft-plan's compute probe: one transformer block's forward + backward and
 * the output head's, at a factorisation's rank-local shapes, through the
 * weft CPU kernels (backend.h), every rank at once (the oversubscription of
 * the machine is in the number), the slowest rank's time. The same kernels
 * in the same order as models/llama's ops call them for one block (the
 * autograd and DTensor bookkeeping around them is not timed); AdamW's rate
 * over a 1 Mi-element shard likewise.
 *
 * Shapes for B_l = batch / dp sequences of T tokens, N = B_l * T, tp t:
 *   q (N, H/t * hd), k and v (N, Hkv/t * hd), ffn (N, F/t), logits (N, V/t).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "nn.h"
#include "plan.h"

enum {
  X,
  XN,
  RSTD,
  Q,
  K,
  V,
  ATT,
  LSE,
  O,
  X2,
  XN2,
  RSTD2,
  H1,
  H3,
  G,
  O2,
  X3, /* activations */
  WQ,
  WK,
  WV,
  WO,
  W1,
  W3,
  W2,
  NW, /* weights */
  DWQ,
  DWK,
  DWV,
  DWO,
  DW1,
  DW3,
  DW2,
  DNW, /* weight grads */
  DX,
  DXN,
  DQ,
  DK,
  DV,
  DATT,
  DX2,
  DXN2,
  DH1,
  DH3,
  DG,
  DO2, /* activation grads */
  COS,
  SIN,
  LOGITS,
  DLOGITS,
  WOUT,
  DWOUT,
  SCRATCH,
  NBUF
};

typedef struct block_bufs {
  float *b[NBUF];
  int32_t *targets;
} block_bufs;

#define CK(call)                    \
  do {                              \
    weft_status st_ = (call);       \
    if (st_ != WEFT_OK) return st_; \
  } while (0)

static weft_status block(block_bufs *s, const weft_llama_config *m, int64_t Bl, int t) {
  float **b = s->b;
  int64_t T = m->max_seq_len, D = m->dim, N = Bl * T, hd = m->dim / m->n_heads;
  int64_t Hl = m->n_heads / t, Hkl = m->n_kv_heads / t, qd = Hl * hd, kd = Hkl * hd;
  int64_t Fl = m->ffn_dim / t;
  const weft_device c = WEFT_CPU;
  /* forward */
  CK(weft_backend_rmsnorm_forward(c, b[XN], b[RSTD], b[X], b[NW], N, D, 1e-5f));
  CK(weft_backend_linear_forward(c, b[Q], b[XN], b[WQ], NULL, N, D, qd));
  CK(weft_backend_linear_forward(c, b[K], b[XN], b[WK], NULL, N, D, kd));
  CK(weft_backend_linear_forward(c, b[V], b[XN], b[WV], NULL, N, D, kd));
  CK(weft_backend_rope_forward(c, b[Q], b[Q], b[COS], b[SIN], T, Bl, T, Hl, hd, 0));
  CK(weft_backend_rope_forward(c, b[K], b[K], b[COS], b[SIN], T, Bl, T, Hkl, hd, 0));
  CK(weft_backend_attention_forward(c, b[ATT], b[LSE], b[Q], b[K], b[V], Bl, T, Hl, Hkl, hd, true,
                                    b[SCRATCH]));
  CK(weft_backend_linear_forward(c, b[O], b[ATT], b[WO], NULL, N, qd, D));
  CK(weft_backend_residual_forward(c, b[X2], b[X], b[O], N * D));
  CK(weft_backend_rmsnorm_forward(c, b[XN2], b[RSTD2], b[X2], b[NW], N, D, 1e-5f));
  CK(weft_backend_linear_forward(c, b[H1], b[XN2], b[W1], NULL, N, D, Fl));
  CK(weft_backend_linear_forward(c, b[H3], b[XN2], b[W3], NULL, N, D, Fl));
  CK(weft_backend_swiglu_forward(c, b[G], b[H1], b[H3], N * Fl));
  CK(weft_backend_linear_forward(c, b[O2], b[G], b[W2], NULL, N, Fl, D));
  CK(weft_backend_residual_forward(c, b[X3], b[X2], b[O2], N * D));
  /* backward (dout of the block in X3's place) */
  CK(weft_backend_residual_backward(c, b[DX2], b[DO2], b[X3], N * D));
  CK(weft_backend_linear_backward(c, b[DG], b[DW2], NULL, b[DO2], b[G], b[W2], N, Fl, D, false,
                                  true));
  CK(weft_backend_swiglu_backward(c, b[DH1], b[DH3], b[DG], b[H1], b[H3], N * Fl));
  CK(weft_backend_linear_backward(c, b[DXN2], b[DW1], NULL, b[DH1], b[XN2], b[W1], N, D, Fl, false,
                                  true));
  CK(weft_backend_linear_backward(c, b[DXN2], b[DW3], NULL, b[DH3], b[XN2], b[W3], N, D, Fl, true,
                                  true));
  CK(weft_backend_rmsnorm_backward(c, b[DX2], b[DNW], b[DXN2], b[X2], b[NW], b[RSTD2], N, D, true));
  CK(weft_backend_linear_backward(c, b[DATT], b[DWO], NULL, b[DX2], b[ATT], b[WO], N, qd, D, false,
                                  true));
  CK(weft_backend_attention_backward(c, b[DQ], b[DK], b[DV], b[DATT], b[Q], b[K], b[V], b[LSE],
                                     b[ATT], Bl, T, Hl, Hkl, hd, true, b[SCRATCH]));
  CK(weft_backend_rope_backward(c, b[DQ], b[DQ], b[COS], b[SIN], T, Bl, T, Hl, hd, 0));
  CK(weft_backend_rope_backward(c, b[DK], b[DK], b[COS], b[SIN], T, Bl, T, Hkl, hd, 0));
  CK(weft_backend_linear_backward(c, b[DXN], b[DWQ], NULL, b[DQ], b[XN], b[WQ], N, D, qd, false,
                                  true));
  CK(weft_backend_linear_backward(c, b[DXN], b[DWK], NULL, b[DK], b[XN], b[WK], N, D, kd, true,
                                  true));
  CK(weft_backend_linear_backward(c, b[DXN], b[DWV], NULL, b[DV], b[XN], b[WV], N, D, kd, true,
                                  true));
  CK(weft_backend_rmsnorm_backward(c, b[DX], b[DNW], b[DXN], b[X], b[NW], b[RSTD], N, D, true));
  return WEFT_OK;
}

/* The head: final norm, output projection, cross-entropy and back. */
static weft_status head(block_bufs *s, const weft_llama_config *m, int64_t Bl, int t) {
  float **b = s->b;
  int64_t N = Bl * m->max_seq_len, D = m->dim, Vl = m->vocab / t;
  const weft_device c = WEFT_CPU;
  double loss = 0;
  CK(weft_backend_rmsnorm_forward(c, b[XN], b[RSTD], b[X], b[NW], N, D, 1e-5f));
  CK(weft_backend_linear_forward(c, b[LOGITS], b[XN], b[WOUT], NULL, N, D, Vl));
  CK(weft_backend_cross_entropy_forward(c, &loss, b[LSE], b[LOGITS], s->targets, N, Vl));
  CK(weft_backend_cross_entropy_backward(c, b[DLOGITS], b[LOGITS], b[LSE], s->targets, N, Vl,
                                         1.0f / (float)N));
  CK(weft_backend_linear_backward(c, b[DXN], b[DWOUT], NULL, b[DLOGITS], b[XN], b[WOUT], N, D, Vl,
                                  false, true));
  CK(weft_backend_rmsnorm_backward(c, b[DX], b[DNW], b[DXN], b[X], b[NW], b[RSTD], N, D, false));
  return WEFT_OK;
}
#undef CK

/* The slowest rank's seconds for reps calls, after a barrier; -1 on error
 * (on every rank). */
static double timed(weft_status (*fn)(block_bufs *, const weft_llama_config *, int64_t, int),
                    block_bufs *s, const weft_llama_config *m, int64_t Bl, int t, int reps) {
  MPI_Barrier(MPI_COMM_WORLD);
  weft_status st = WEFT_OK;
  double t0 = plan_now();
  for (int i = 0; i < reps && st == WEFT_OK; i++) st = fn(s, m, Bl, t);
  double dt = st == WEFT_OK ? plan_now() - t0 : -1;
  double r[2] = {dt, dt < 0 ? 1 : 0};
  MPI_Allreduce(MPI_IN_PLACE, r, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return r[1] > 0 ? -1 : r[0] / reps;
}

/* The median of KERNEL_TRIALS timings of enough calls for ~40 ms each
 * (first: one call's seconds): a shared machine's hiccups do not make the
 * number. Three trials of 30 ms moved a block's time by up to 20% from one
 * probe to the next on 4 ranks over 2 cores (5.2 vs 4.3 ms); seven of
 * 40 ms keep the probes of one machine within a few percent. */
enum { KERNEL_TRIALS = 7 };
static double median_of_trials(weft_status (*fn)(block_bufs *, const weft_llama_config *, int64_t,
                                                 int),
                               block_bufs *s, const weft_llama_config *m, int64_t Bl, int t,
                               double first) {
  int reps = (int)fmin(50, fmax(1, 0.04 / fmax(first, 1e-6)));
  double v[KERNEL_TRIALS];
  for (int i = 0; i < KERNEL_TRIALS; i++)
    if ((v[i] = timed(fn, s, m, Bl, t, reps)) < 0) return -1;
  return plan_median(v, KERNEL_TRIALS);
}

static int probe_one(const weft_llama_config *m, int64_t Bl, int t, plan_kernel_time *out) {
  int64_t T = m->max_seq_len, D = m->dim, N = Bl * T, hd = m->dim / m->n_heads;
  int64_t qd = m->n_heads / t * hd, kd = m->n_kv_heads / t * hd, Fl = m->ffn_dim / t;
  int64_t Vl = m->vocab / t;
  int64_t sz[NBUF];
  int64_t nd = N * D;
  int64_t act[] = {nd, nd, N,      N * qd, N * kd, N * kd, N * qd, Bl * m->n_heads * T, nd, nd,
                   nd, N,  N * Fl, N * Fl, N * Fl, nd,     nd};
  for (int i = 0; i <= X3; i++) sz[i] = act[i];
  int64_t w[] = {qd * D, kd * D, kd * D, D * qd, Fl * D, Fl * D, D * Fl, D};
  for (int i = 0; i < 8; i++) sz[WQ + i] = sz[DWQ + i] = w[i];
  int64_t g[] = {nd, nd, N * qd, N * kd, N * kd, N * qd, nd, nd, N * Fl, N * Fl, N * Fl, nd};
  for (int i = 0; i < 12; i++) sz[DX + i] = g[i];
  sz[COS] = sz[SIN] = T * hd / 2;
  sz[LOGITS] = sz[DLOGITS] = N * Vl;
  sz[WOUT] = sz[DWOUT] = Vl * D;
  size_t scratch =
      weft_backend_attention_scratch_bytes(WEFT_CPU, Bl, T, m->n_heads / t, m->n_kv_heads / t, hd);
  sz[SCRATCH] = (int64_t)(scratch / sizeof(float)) + 1;
  block_bufs s;
  memset(&s, 0, sizeof s);
  int bad = 0;
  for (int i = 0; i < NBUF && !bad; i++) {
    s.b[i] = malloc(sizeof(float) * (size_t)sz[i]);
    bad = !s.b[i];
    if (!bad && i != COS && i != SIN) plan_fill(s.b[i], sz[i], 31u * (uint32_t)i + 1u, 0.2f);
  }
  s.targets = bad ? NULL : malloc(sizeof(int32_t) * (size_t)N);
  bad = bad || !s.targets;
  if (!bad) {
    for (int64_t i = 0; i < N; i++) s.targets[i] = (int32_t)((i * 7919) % Vl);
    bad = weft_backend_rope_tables(WEFT_CPU, s.b[COS], s.b[SIN], T, hd, m->rope_theta) != WEFT_OK;
  }
  MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  int rc = -1;
  if (!bad) {
    /* one untimed call each (first-touch of the buffers, BLAS set-up) */
    double w0 = timed(block, &s, m, Bl, t, 1), w1 = timed(head, &s, m, Bl, t, 1);
    out->block_s = w0 < 0 ? -1 : median_of_trials(block, &s, m, Bl, t, w0);
    out->head_s = w1 < 0 ? -1 : median_of_trials(head, &s, m, Bl, t, w1);
    out->batch_local = Bl;
    out->tp = t;
    rc = out->block_s > 0 && out->head_s > 0 ? 0 : -1;
  }
  for (int i = 0; i < NBUF; i++) free(s.b[i]);
  free(s.targets);
  return rc;
}

/* The whole model's forward + backward on this rank alone (a 1-rank mesh
 * over MPI_COMM_SELF, every rank at once): weft_llama_forward/_backward as
 * weft-train calls them, so autograd, DTensor and allocation costs are in.
 * The slowest rank's seconds per step (after one untimed step), or -1. */
static double model_step(const weft_llama_config *m, int64_t Bl) {
  weft_mesh *mesh = NULL;
  weft_module *model = NULL;
  int shape[1] = {1};
  const char *names[1] = {"dp"};
  int64_t T = m->max_seq_len, n = Bl * T, tshape[2] = {Bl, T};
  int32_t *tok = malloc(sizeof(int32_t) * (size_t)n * 2);
  weft_tensor *tt = NULL, *gt = NULL;
  weft_status st = tok ? WEFT_OK : WEFT_ERR_OOM;
  for (int64_t i = 0; tok && i < 2 * n; i++) tok[i] = (int32_t)((i * 7919 + 13) % m->vocab);
  if (st == WEFT_OK) st = weft_mesh_create_from_comm(MPI_COMM_SELF, 1, shape, names, &mesh);
  if (st == WEFT_OK) st = weft_llama_create(m, mesh, &model);
  if (st == WEFT_OK) st = weft_module_init_weights(model, 1234);
  if (st == WEFT_OK) st = weft_tensor_wrap(tok, WEFT_I32, WEFT_CPU, 2, tshape, &tt);
  if (st == WEFT_OK) st = weft_tensor_wrap(tok + n, WEFT_I32, WEFT_CPU, 2, tshape, &gt);
  enum { STEPS = 8 };
  double v[STEPS] = {0}, loss;
  bool failed = false;
  /* every rank runs the same reductions, whether or not its steps failed */
  for (int i = 0; i < STEPS && !failed; i++) {
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = plan_now();
    if (st == WEFT_OK) st = weft_llama_forward(model, tt, gt, &loss);
    if (st == WEFT_OK) st = weft_llama_backward(model);
    if (st == WEFT_OK) st = weft_module_zero_grad(model, false);
    double r[2] = {plan_now() - t0, st != WEFT_OK};
    MPI_Allreduce(MPI_IN_PLACE, r, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    v[i] = r[0];
    failed = r[1] > 0;
  }
  /* the median of the steps after the first */
  double dt = failed ? -1 : plan_median(v + 1, STEPS - 1);
  weft_tensor_destroy(tt);
  weft_tensor_destroy(gt);
  weft_module_destroy(model);
  weft_mesh_destroy(mesh);
  free(tok);
  return dt;
}

int plan_probe_kernels(const plan_opts *o, int world, plan_probe *p) {
  const weft_llama_config *m = &o->m;
  p->nkern = 0;
  for (int t = 1; t <= world; t++) {
    if (world % t || m->n_heads % t || m->n_kv_heads % t) continue;
    int dp = world / t;
    if (o->batch % dp) continue;
    if (p->nkern == PLAN_MAX_KERN) break;
    if (probe_one(m, o->batch / dp, t, &p->kern[p->nkern])) return -1;
    p->nkern++;
  }
  /* the framework around the kernels: the whole model at tp = 1 and the
   * smallest batch per rank (batch / world; the largest dp) minus the
   * kernels' time at the same shapes; per-op costs (autograd, DTensor,
   * allocation), added to every factorisation's micro-batch */
  p->framework = 0;
  for (int i = 0; i < p->nkern; i++)
    if (p->kern[i].tp == 1) {
      double ms = model_step(&o->m, p->kern[i].batch_local);
      if (ms < 0) return -1;
      double kt = (double)o->m.n_layers * p->kern[i].block_s + p->kern[i].head_s;
      p->framework = fmax(0, ms - kt);
      p->model_step_s = ms;
      break;
    }
  /* AdamW over a 1 Mi-element shard: elements per second */
  const int64_t n = 1 << 20;
  float *buf = malloc(sizeof(float) * (size_t)n * 4);
  int bad = !buf;
  MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (bad) {
    free(buf);
    return -1;
  }
  plan_fill(buf, n * 2, 5u, 0.2f);
  memset(buf + 2 * n, 0, sizeof(float) * (size_t)n * 2);
  float *param = buf, *m1 = buf + 2 * n, *v1 = buf + 3 * n;
  const float *grad = buf + n;
  weft_adamw_params hp = WEFT_ADAMW_DEFAULT;
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = plan_now();
  weft_status st = WEFT_OK;
  for (int i = 1; i <= 4 && st == WEFT_OK; i++)
    st = weft_backend_adamw_multi(WEFT_CPU, &param, &grad, &m1, &v1, NULL, &n, 1, i, &hp);
  double r[2] = {plan_now() - t0, st != WEFT_OK};
  MPI_Allreduce(MPI_IN_PLACE, r, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  free(buf);
  if (r[1] > 0) return -1;
  p->adamw_rate = 4.0 * (double)n / r[0];
  return 0;
}
