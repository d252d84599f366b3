/* tests/nn/test_torch_crosscheck.c — weft's reference model against
 * PyTorch on a fresh random model (not the golden files).
 *
 * weft (fp32, 1-rank mesh) initialises the model with
 * weft_module_init_weights(seed), draws random tokens and targets, runs
 * forward + backward, and writes into a temporary directory:
 *   config.json          the model config
 *   weights.safetensors  every parameter (F32, torchtitan names) and the
 *                        tokens: "inputs", "targets" (I32 [B, T])
 *   weft.safetensors     weft's gradients (same names) and "loss" (F64 [1])
 * then runs `/usr/bin/python3 tests/nn/torch_crosscheck.py DIR`, which
 * recomputes loss and gradients in float64 with torch autograd (the model
 * of tests/kernels/torch_reference.py), prints the errors and exits 0 when
 * the loss agrees to 1e-6 relative and every gradient to 1e-5 relative by
 * norm (||g_weft - g_torch|| / ||g_torch||), 1 on a mismatch, 2 on bad
 * input.
 *
 * Skipped with a message when /usr/bin/python3 cannot import torch
 * (scripts/setup.sh installs Debian's python3-torch).
 *
 * The model runs in this process: MPI starts as a singleton (no mpiexec),
 * which MPICH allows and a 1-rank mesh needs nothing more. Each Test is its
 * own Criterion child, so weft_init/weft_finalize run once per process.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "autograd.h"
#include "nn.h"
#include "safetensors.h"

#ifndef WEFT_TORCH_CROSSCHECK_PY
#error "meson passes WEFT_TORCH_CROSSCHECK_PY (the script's path)"
#endif
#ifndef WEFT_TORCH_BF16_CHECK_PY
#error "meson passes WEFT_TORCH_BF16_CHECK_PY (the script's path)"
#endif

/* Debian's python3-torch is for /usr/bin/python3 (the python3 first on
 * PATH may be another one). */
#ifndef WEFT_TEST_PYTHON
#define WEFT_TEST_PYTHON "/usr/bin/python3"
#endif
#define PYTHON WEFT_TEST_PYTHON

/* 0 when /usr/bin/python3 can import torch; else 1, after printing a
 * "[SKIP]" line (Criterion shows its own skip message only with
 * --verbose; scripts/test.sh counts these lines). */
static int torch_missing(const char *test) {
  int rc = system(PYTHON " -c 'import torch' >/dev/null 2>&1");
  if (rc != -1 && WIFEXITED(rc) && WEXITSTATUS(rc) == 0) return 0;
  fprintf(stderr,
          "[SKIP] torch_crosscheck::%s: %s cannot import torch (install python3-torch: "
          "scripts/setup.sh does)\n",
          test, PYTHON);
  return 1;
}

typedef struct crosscheck {
  weft_llama_config cfg;
  int64_t B, T;
  unsigned long seed;
  /* a weight that weft changes after writing weights.safetensors (NULL:
   * none), so that the two sides compute on different models */
  const char *perturb;
  /* a weft gradient that is scaled by 1 + 1e-4 before it is written
   * (NULL: none) */
  const char *perturb_grad;
  char dir[256];
} crosscheck;

static crosscheck small_case(unsigned long seed) {
  crosscheck c;
  memset(&c, 0, sizeof c);
  c.cfg = WEFT_LLAMA_CONFIG_INIT;
  c.cfg.dim = 48;
  c.cfg.n_layers = 2;
  c.cfg.n_heads = 4;
  c.cfg.n_kv_heads = 2;
  c.cfg.ffn_dim = 128;
  c.cfg.vocab = 80;
  c.cfg.max_seq_len = 16;
  c.B = 3;
  c.T = 12;
  c.seed = seed;
  return c;
}

static void write_config(const crosscheck *c) {
  char path[512];
  snprintf(path, sizeof path, "%s/config.json", c->dir);
  FILE *f = fopen(path, "w");
  cr_assert_not_null(f, "cannot write %s: %s", path, strerror(errno));
  fprintf(f,
          "{\"dim\": %lld, \"layers\": %lld, \"heads\": %lld, \"kv_heads\": %lld, "
          "\"ffn\": %lld, \"vocab\": %lld, \"batch\": %lld, \"seq\": %lld, "
          "\"norm_eps\": %.9g, \"rope_theta\": %.17g, \"seed\": %lu}\n",
          (long long)c->cfg.dim, (long long)c->cfg.n_layers, (long long)c->cfg.n_heads,
          (long long)c->cfg.n_kv_heads, (long long)c->cfg.ffn_dim, (long long)c->cfg.vocab,
          (long long)c->B, (long long)c->T, (double)c->cfg.norm_eps, c->cfg.rope_theta, c->seed);
  cr_assert_eq(fclose(f), 0);
}

/* Runs weft, writes the files, runs the script; returns its exit status
 * (or -1 if it did not exit normally). */
static int run_crosscheck(crosscheck *c) {
  snprintf(c->dir, sizeof c->dir, "/tmp/weft-torch-crosscheck-XXXXXX");
  cr_assert_not_null(mkdtemp(c->dir), "mkdtemp: %s", strerror(errno));
  int argc = 0;
  char **argv = NULL;
  OK(weft_init(&argc, &argv));
  int shape[1] = {1};
  const char *names[1] = {"model"};
  weft_mesh *mesh;
  OK(weft_mesh_create(1, shape, names, &mesh));
  weft_module *model;
  OK(weft_llama_create(&c->cfg, mesh, &model));
  OK(weft_module_init_weights(model, c->seed));

  /* random tokens and targets (ids in [0, V)) */
  int64_t bt[2] = {c->B, c->T};
  weft_tensor *inputs, *targets;
  OK(weft_tensor_create(WEFT_I32, WEFT_CPU, 2, bt, &inputs));
  OK(weft_tensor_create(WEFT_I32, WEFT_CPU, 2, bt, &targets));
  uint64_t s = c->seed * 0x2545F4914F6CDD1Dull + 17;
  for (int64_t i = 0; i < c->B * c->T; i++) {
    ((int32_t *)inputs->data)[i] = (int32_t)(weft_test_rng_u64(&s) % (uint64_t)c->cfg.vocab);
    ((int32_t *)targets->data)[i] = (int32_t)(weft_test_rng_u64(&s) % (uint64_t)c->cfg.vocab);
  }

  int np;
  OK(weft_module_parameters(model, NULL, 0, &np));
  weft_param **ps = calloc((size_t)np, sizeof *ps);
  weft_safetensors_entry *e = calloc((size_t)np + 2, sizeof *e);
  cr_assert(ps && e);
  OK(weft_module_parameters(model, ps, np, &np));
  for (int i = 0; i < np; i++) {
    const weft_tensor *l = weft_dtensor_local(ps[i]->data);
    e[i] = (weft_safetensors_entry){ps[i]->fqn, WEFT_F32, l->ndim, l->shape, l->data};
  }
  e[np] = (weft_safetensors_entry){"inputs", WEFT_I32, 2, inputs->shape, inputs->data};
  e[np + 1] = (weft_safetensors_entry){"targets", WEFT_I32, 2, targets->shape, targets->data};
  char path[512];
  snprintf(path, sizeof path, "%s/weights.safetensors", c->dir);
  OK(weft_safetensors_write(path, e, np + 2, NULL));
  write_config(c);

  if (c->perturb) {
    weft_param *p;
    OK(weft_module_find_param(model, c->perturb, &p));
    float *w = weft_dtensor_local(p->data)->data;
    w[3] += 1e-3f; /* one element, 5% of the init std */
  }
  double loss;
  OK(weft_llama_forward(model, inputs, targets, &loss));
  OK(weft_llama_backward(model));
  if (c->perturb_grad) {
    weft_param *p;
    OK(weft_module_find_param(model, c->perturb_grad, &p));
    const weft_tensor *l = weft_dtensor_local(p->grad);
    float *g = l->data;
    for (int64_t i = 0; i < weft_tensor_numel(l); i++) g[i] *= 1.0001f; /* 1e-4 relative */
  }
  for (int i = 0; i < np; i++) {
    cr_assert_not_null(ps[i]->grad, "%s has no grad", ps[i]->fqn);
    const weft_tensor *l = weft_dtensor_local(ps[i]->grad);
    e[i] = (weft_safetensors_entry){ps[i]->fqn, WEFT_F32, l->ndim, l->shape, l->data};
  }
  int64_t one = 1;
  e[np] = (weft_safetensors_entry){"loss", WEFT_F64, 1, &one, &loss};
  snprintf(path, sizeof path, "%s/weft.safetensors", c->dir);
  OK(weft_safetensors_write(path, e, np + 1, NULL));
  printf("crosscheck seed %lu: weft loss %.9f, files in %s\n", c->seed, loss, c->dir);
  fflush(stdout);

  free(e);
  free(ps);
  weft_tensor_destroy(inputs);
  weft_tensor_destroy(targets);
  OK(weft_module_destroy(model));
  weft_mesh_destroy(mesh);
  weft_finalize();

  char cmd[1024];
  snprintf(cmd, sizeof cmd, "%s '%s' '%s'", PYTHON, WEFT_TORCH_CROSSCHECK_PY, c->dir);
  int rc = system(cmd);
  return rc != -1 && WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static void remove_dir(const crosscheck *c) {
  const char *files[] = {"config.json", "weights.safetensors", "weft.safetensors"};
  char path[512];
  for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
    snprintf(path, sizeof path, "%s/%s", c->dir, files[i]);
    unlink(path);
  }
  rmdir(c->dir);
}

Test(torch_crosscheck, loss_and_grads_match_pytorch_float64_on_random_init, .timeout = 180) {
  if (torch_missing("loss_and_grads_match_pytorch_float64_on_random_init"))
    cr_skip_test(PYTHON " cannot import torch (install python3-torch: scripts/setup.sh does)");
  crosscheck c = small_case(weft_test_seed(20240607));
  int rc = run_crosscheck(&c);
  cr_assert_eq(rc, 0,
               "torch_crosscheck.py exited %d (seed %lu): weft and torch disagree beyond loss "
               "1e-6 / grads 1e-5 relative (see the table above; files kept in %s)",
               rc, c.seed, c.dir);
  remove_dir(&c);
}

/* The comparison can fail: weft computes on a model that differs from the
 * written weights in one element (1e-3 on an element of std 0.02), and
 * the script must report the mismatch (exit 1), not pass. */
Test(torch_crosscheck, a_perturbed_weight_is_reported_as_a_mismatch, .timeout = 180) {
  if (torch_missing("a_perturbed_weight_is_reported_as_a_mismatch"))
    cr_skip_test(PYTHON " cannot import torch");
  crosscheck c = small_case(weft_test_seed(777));
  c.perturb = "layers.1.feed_forward.w2.weight";
  int rc = run_crosscheck(&c);
  cr_assert_eq(rc, 1, "a weight perturbed on weft's side gave exit %d, want 1 (seed %lu, %s)", rc,
               c.seed, c.dir);
  remove_dir(&c);
}

/* And on the gradient side: one weft gradient scaled by 1 + 1e-4 (ten
 * times the tolerance). */
Test(torch_crosscheck, a_perturbed_gradient_is_reported_as_a_mismatch, .timeout = 180) {
  if (torch_missing("a_perturbed_gradient_is_reported_as_a_mismatch"))
    cr_skip_test(PYTHON " cannot import torch");
  crosscheck c = small_case(weft_test_seed(778));
  c.perturb_grad = "layers.0.attention.wk.weight";
  int rc = run_crosscheck(&c);
  cr_assert_eq(rc, 1, "a gradient perturbed on weft's side gave exit %d, want 1 (seed %lu, %s)", rc,
               c.seed, c.dir);
  remove_dir(&c);
}

/* ------------------------------------------------------------------ bf16
 * weft's bf16 ops (autograd.h "dtypes") against PyTorch's own bf16 CPU
 * kernels on the same random bf16 values (tests/nn/torch_bf16_check.py:
 * bitwise where PyTorch computes in f32 and rounds once, within one bf16
 * step where PyTorch 1.13 rounds intermediates). */

static void fill_bf16(float *v, int64_t n, uint64_t *s, double scale) {
  for (int64_t i = 0; i < n; i++)
    v[i] = weft_bf16_to_f32(weft_f32_to_bf16((float)((2 * weft_test_rng_unit(s) - 1) * scale)));
}

/* A bf16 graph input (1-rank mesh) from f32 values. */
static weft_var *bf16_input(weft_graph *g, weft_mesh *mesh, weft_dtensor **keep, int nd,
                            const int64_t *shape, const float *v, bool grad) {
  weft_tensor *t32, *t16;
  OK(weft_tensor_wrap((void *)v, WEFT_F32, WEFT_CPU, nd, shape, &t32));
  OK(weft_tensor_create(WEFT_BF16, WEFT_CPU, nd, shape, &t16));
  OK(weft_tensor_copy(t16, t32));
  weft_placement r = weft_replicate();
  OK(weft_dtensor_distribute(mesh, t16, WEFT_DTENSOR_ALL_RANKS, &r, 1, keep));
  weft_tensor_destroy(t16);
  weft_tensor_destroy(t32);
  weft_var *x;
  OK(weft_graph_input(g, *keep, grad, &x));
  return x;
}

/* The f32 values of a (replicated, host) DTensor, as a safetensors entry. */
static weft_safetensors_entry f32_entry(const char *name, const weft_dtensor *d, float **buf) {
  const weft_tensor *l = weft_dtensor_local(d);
  weft_tensor *t;
  OK(weft_tensor_create(WEFT_F32, WEFT_CPU, l->ndim, l->shape, &t));
  OK(weft_tensor_copy(t, l));
  int64_t n = weft_tensor_numel(t);
  *buf = malloc(sizeof(float) * (size_t)n);
  memcpy(*buf, t->data, sizeof(float) * (size_t)n);
  weft_tensor_destroy(t);
  return (weft_safetensors_entry){name, WEFT_F32, l->ndim, l->shape, *buf};
}

Test(torch_crosscheck, bf16_ops_match_pytorch_bf16_kernels, .timeout = 180) {
  if (torch_missing("bf16_ops_match_pytorch_bf16_kernels"))
    cr_skip_test(PYTHON " cannot import torch");
  int argc = 0;
  char **argv = NULL;
  OK(weft_init(&argc, &argv));
  int one_rank = 1;
  const char *names[1] = {"tp"};
  weft_mesh *mesh;
  OK(weft_mesh_create(1, &one_rank, names, &mesh));
  enum { B = 4, T = 16, C = 64, N = 96, R = 32, V = 96, NIN = 8, NOUT = 9 };
  int64_t xs[3] = {B, T, C}, ws[2] = {N, C}, bs[1] = {N}, gs[1] = {C}, ys[3] = {B, T, N},
          ls[2] = {R, V}, ts[1] = {R};
  static float x[B * T * C], w[N * C], b[N], g[C], bb[C], dy[B * T * N], logits[R * V];
  static int32_t tg[R];
  uint64_t s = weft_test_rng_state(weft_test_seed(4242));
  fill_bf16(x, B * T * C, &s, 1);
  fill_bf16(w, N * C, &s, 0.125);
  fill_bf16(b, N, &s, 0.5);
  fill_bf16(g, C, &s, 1);
  fill_bf16(bb, C, &s, 0.5);
  fill_bf16(dy, B * T * N, &s, 1);
  fill_bf16(logits, R * V, &s, 1);
  for (int i = 0; i < R; i++) tg[i] = (int32_t)(weft_test_rng_u64(&s) % V);

  weft_graph *gr;
  OK(weft_graph_create(&gr));
  weft_dtensor *in[NIN] = {0};
  weft_var *vx = bf16_input(gr, mesh, &in[0], 3, xs, x, true);
  weft_var *vw = bf16_input(gr, mesh, &in[1], 2, ws, w, true);
  weft_var *vb = bf16_input(gr, mesh, &in[2], 1, bs, b, false);
  weft_var *vg = bf16_input(gr, mesh, &in[3], 1, gs, g, false);
  weft_var *vbb = bf16_input(gr, mesh, &in[4], 1, gs, bb, false);
  weft_var *vdy = bf16_input(gr, mesh, &in[5], 3, ys, dy, false);
  weft_var *vl = bf16_input(gr, mesh, &in[6], 2, ls, logits, false);
  weft_tensor *tt;
  OK(weft_tensor_wrap(tg, WEFT_I32, WEFT_CPU, 1, ts, &tt));
  weft_placement r = weft_replicate();
  OK(weft_dtensor_distribute(mesh, tt, WEFT_DTENSOR_ALL_RANKS, &r, 1, &in[7]));
  weft_tensor_destroy(tt);

  weft_var *y, *x3, *x4, *xh, *l3, *out[NOUT];
  OK(weft_op_linear(vx, vw, vb, &y));
  OK(weft_op_scale(vx, 3.0, &x3));
  OK(weft_op_scale(vx, 4.0, &x4));
  OK(weft_op_scale(vx, 0.5, &xh));
  OK(weft_op_scale(vl, 3.0, &l3));
  out[0] = y;
  OK(weft_op_gelu(x3, false, &out[1]));
  OK(weft_op_softmax(x4, &out[2]));
  OK(weft_op_add(vx, xh, &out[3]));
  OK(weft_op_cross_entropy(l3, in[7], -100, &out[4]));
  OK(weft_op_layer_norm(vx, vg, vbb, 1e-5f, &out[5]));
  OK(weft_op_gelu(x3, true, &out[6]));
  for (int i = 0; i < 7; i++)
    cr_assert_eq(weft_dtensor_dtype(weft_var_value(out[i])), WEFT_BF16, "output %d is not bf16", i);
  OK(weft_backward_grad(y, weft_var_value(vdy)));

  static const char *const onames[] = {"linear",        "gelu",       "softmax",  "add",
                                       "cross_entropy", "layer_norm", "gelu_tanh"};
  weft_safetensors_entry e[NIN + NOUT + 2];
  float *bufs[NOUT + 2] = {0};
  int ne = 0;
  e[ne++] = (weft_safetensors_entry){"x", WEFT_F32, 3, xs, x};
  e[ne++] = (weft_safetensors_entry){"w", WEFT_F32, 2, ws, w};
  e[ne++] = (weft_safetensors_entry){"b", WEFT_F32, 1, bs, b};
  e[ne++] = (weft_safetensors_entry){"g", WEFT_F32, 1, gs, g};
  e[ne++] = (weft_safetensors_entry){"bb", WEFT_F32, 1, gs, bb};
  e[ne++] = (weft_safetensors_entry){"dy", WEFT_F32, 3, ys, dy};
  e[ne++] = (weft_safetensors_entry){"logits", WEFT_F32, 2, ls, logits};
  e[ne++] = (weft_safetensors_entry){"targets", WEFT_I32, 1, ts, tg};
  int nb = 0;
  for (int i = 0; i < 7; i++) e[ne++] = f32_entry(onames[i], weft_var_value(out[i]), &bufs[nb++]);
  e[ne++] = f32_entry("linear.dx", weft_var_grad(vx), &bufs[nb++]);
  e[ne++] = f32_entry("linear.dw", weft_var_grad(vw), &bufs[nb++]);
  char dir[] = "/tmp/weft-torch-bf16-XXXXXX", path[256];
  cr_assert_not_null(mkdtemp(dir), "mkdtemp: %s", strerror(errno));
  snprintf(path, sizeof path, "%s/bf16.safetensors", dir);
  OK(weft_safetensors_write(path, e, ne, NULL));
  for (int i = 0; i < nb; i++) free(bufs[i]);
  weft_graph_destroy(gr);
  for (int i = 0; i < NIN; i++) weft_dtensor_destroy(in[i]);
  weft_mesh_destroy(mesh);
  weft_finalize();

  char cmd[1024];
  snprintf(cmd, sizeof cmd, "%s '%s' '%s'", PYTHON, WEFT_TORCH_BF16_CHECK_PY, path);
  int rc = system(cmd);
  rc = rc != -1 && WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  cr_assert_eq(rc, 0,
               "torch_bf16_check.py exited %d: weft's bf16 ops and PyTorch's disagree "
               "(see the table above; file kept: %s)",
               rc, path);
  unlink(path);
  rmdir(dir);
}
