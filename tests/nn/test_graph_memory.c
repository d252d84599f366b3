/* tests/nn/test_graph_memory.c — the graph's buffers during backward
 * (autograd.h weft_graph_bytes_in_use / weft_graph_bytes_peak), in process
 * on a 1-rank mesh.
 *
 * A chain of elementwise ops, h_i = h_{i-1} * w_i, plus h_{i-1} on every
 * third link (add's backward hands its output grad to both inputs, so that
 * grad is shared and then summed with mul's), runs forward and backward:
 *   - x's grad equals the float64 product of (w_i + [i % 3 == 0]) times the
 *     output grad;
 *   - backward returns each grad to the pool once the node that consumed
 *     it has run, so the step's peak is the forward's activations plus a
 *     few grads, not twice the activations;
 *   - the values stay readable after backward (only grads go back), and a
 *     second step reuses the pool without a new large allocation.
 * A stack of attention layers keeps each layer's output and log-sum-exp
 * for backward, but not the kernel's scratch: every layer, forward and
 * backward, works in the one scratch buffer the pool hands out again; and
 * each log-sum-exp goes back to the pool once its layer's backward ran.
 * A chain of modules whose backward hooks replace the grad (as TP's do
 * when they move it back to the forward input's layout) leaves nothing
 * of a step allocated once the graph is gone: the graph copies each
 * replacement into its pool and the module lets it go at once, not at the
 * hook's next run a step later.
 * The _on_device variant puts the mesh on WEFT_CUDA and skips, saying why,
 * without a CUDA device. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "harness.h"
#include "ops_check.h"

enum { LINKS = 12, ROWS = 64, COLS = 300 };

static weft_dtensor *replicated(weft_mesh *mesh, const double *v) {
  const int64_t shape[2] = {ROWS, COLS};
  weft_tensor *t;
  OK(weft_tensor_create(WEFT_F32, WEFT_CPU, 2, shape, &t));
  for (int64_t i = 0; i < ROWS * COLS; i++) ((float *)t->data)[i] = (float)v[i];
  weft_placement r = weft_replicate();
  weft_dtensor *d;
  OK(weft_dtensor_distribute(mesh, t, WEFT_DTENSOR_ALL_RANKS, &r, 1, &d));
  weft_tensor_destroy(t);
  return d;
}

static double *values(const weft_dtensor *d) {
  double *v;
  int64_t n;
  OK(oc_full_values(d, &v, &n));
  cr_assert_eq(n, (int64_t)ROWS * COLS);
  return v;
}

/* One step of the chain on graph g; returns h at link LINKS / 2 and the
 * output, and fills the forward's and the step's bytes. */
static void chain_step(weft_graph *g, weft_var *x, weft_var *const *w, const weft_dtensor *r,
                       weft_var **mid, int64_t *fwd_bytes, int64_t *peak_bytes) {
  weft_var *h = x;
  for (int i = 1; i <= LINKS; i++) {
    weft_var *t;
    OK(weft_op_mul(h, w[i - 1], &t));
    if (i % 3 == 0) OK(weft_op_add(t, h, &t));
    h = t;
    if (i == LINKS / 2) *mid = h;
  }
  *fwd_bytes = weft_graph_bytes_in_use(g);
  cr_assert_eq(weft_graph_bytes_peak(g), *fwd_bytes, "the forward only adds buffers");
  OK(weft_backward_grad(h, r));
  *peak_bytes = weft_graph_bytes_peak(g);
}

static void chain_case(bool on_device) {
  if (on_device) WEFT_TEST_REQUIRE_CUDA_DEVICE();
  weft_mesh *mesh;
  OK(oc_one_rank_mesh(on_device, &mesh));
  const int64_t n = (int64_t)ROWS * COLS;
  uint64_t s = weft_test_rng_state(42);
  double *hx = malloc(sizeof(double) * (size_t)n), *hr = malloc(sizeof(double) * (size_t)n);
  double *hw[LINKS];
  for (int64_t e = 0; e < n; e++) {
    hx[e] = 2 * weft_test_rng_unit(&s) - 1;
    hr[e] = 2 * weft_test_rng_unit(&s) - 1;
  }
  for (int i = 0; i < LINKS; i++) {
    hw[i] = malloc(sizeof(double) * (size_t)n);
    for (int64_t e = 0; e < n; e++) hw[i][e] = 0.5 + weft_test_rng_unit(&s); /* [0.5, 1.5) */
  }
  weft_dtensor *dx = replicated(mesh, hx), *dr = replicated(mesh, hr), *dw[LINKS];
  for (int i = 0; i < LINKS; i++) dw[i] = replicated(mesh, hw[i]);
  weft_graph *g;
  OK(weft_graph_create(&g));
  const int64_t buf = n * (int64_t)sizeof(float);
  for (int step = 0; step < 2; step++) {
    weft_var *x, *w[LINKS], *mid = NULL;
    OK(weft_graph_input(g, dx, true, &x));
    for (int i = 0; i < LINKS; i++) OK(weft_graph_input(g, dw[i], false, &w[i]));
    const weft_op_stats before = weft_op_stats_get();
    int64_t fwd, peak;
    chain_step(g, x, w, dr, &mid, &fwd, &peak);
    const weft_op_stats after = weft_op_stats_get();
    /* LINKS mul outputs and LINKS / 3 add outputs */
    cr_assert_geq(fwd, (LINKS + LINKS / 3) * buf, "forward holds %lld bytes", (long long)fwd);
    /* the grads in flight: the output's, one link's and a shared one being
     * summed (without returning consumed grads this is about fwd more) */
    cr_assert_leq(peak - fwd, 4 * buf,
                  "backward added %lld bytes to the forward's %lld (%lld per buffer)",
                  (long long)(peak - fwd), (long long)fwd, (long long)buf);
    if (step == 1 && !on_device)
      cr_assert_eq(after.mallocs - before.mallocs, 0,
                   "the second step allocated %lld large buffers",
                   (long long)(after.mallocs - before.mallocs));
    /* dx = r * prod(w_i + [i % 3 == 0]) */
    double *got = values(weft_var_grad(x)), worst = 0;
    for (int64_t e = 0; e < n; e++) {
      double want = hr[e];
      for (int i = 1; i <= LINKS; i++) want *= hw[i - 1][e] + (i % 3 == 0);
      double err = fabs(got[e] - want) / (fabs(want) + 1e-3);
      if (err > worst) worst = err;
    }
    cr_assert_leq(worst, 1e-5, "step %d: dx rel err %.3g", step, worst);
    free(got);
    /* the values stay readable after backward: h at the middle link */
    double *m = values(weft_var_value(mid)), worst_m = 0;
    for (int64_t e = 0; e < n; e++) {
      double want = hx[e];
      for (int i = 1; i <= LINKS / 2; i++) want *= hw[i - 1][e] + (i % 3 == 0);
      double err = fabs(m[e] - want) / (fabs(want) + 1e-3);
      if (err > worst_m) worst_m = err;
    }
    cr_assert_leq(worst_m, 1e-5, "step %d: h[%d] after backward rel err %.3g", step, LINKS / 2,
                  worst_m);
    free(m);
    OK(weft_graph_reset(g));
    cr_assert_eq(weft_graph_bytes_in_use(g), 0);
    cr_assert_eq(weft_graph_bytes_peak(g), 0);
  }
  weft_graph_destroy(g);
  weft_dtensor_destroy(dx);
  weft_dtensor_destroy(dr);
  for (int i = 0; i < LINKS; i++) {
    weft_dtensor_destroy(dw[i]);
    free(hw[i]);
  }
  free(hx);
  free(hr);
  weft_mesh_destroy(mesh);
  weft_finalize();
}

Test(graph_memory, backward_returns_consumed_grads_so_the_peak_is_the_forward_plus_a_few,
     .timeout = 60) {
  chain_case(false);
}
Test(graph_memory, backward_returns_consumed_grads_so_the_peak_is_the_forward_plus_a_few_on_device,
     .timeout = 60) {
  chain_case(true);
}

/* h = sdpa(h, h, h) LAYERS times on a (B, T, H, hd) input. */
static void attention_stack_case(bool on_device) {
  if (on_device) WEFT_TEST_REQUIRE_CUDA_DEVICE();
  enum { LAYERS = 6, B = 2, T = 48, H = 4, HD = 16 };
  weft_mesh *mesh;
  OK(oc_one_rank_mesh(on_device, &mesh));
  const int64_t shape[4] = {B, T, H, HD}, n = (int64_t)B * T * H * HD;
  weft_tensor *t;
  OK(weft_tensor_create(WEFT_F32, WEFT_CPU, 4, shape, &t));
  uint64_t s = weft_test_rng_state(7);
  for (int64_t e = 0; e < n; e++) ((float *)t->data)[e] = (float)(2 * weft_test_rng_unit(&s) - 1);
  weft_placement r = weft_replicate();
  weft_dtensor *dx, *dr;
  OK(weft_dtensor_distribute(mesh, t, WEFT_DTENSOR_ALL_RANKS, &r, 1, &dx));
  OK(weft_dtensor_distribute(mesh, t, WEFT_DTENSOR_ALL_RANKS, &r, 1, &dr));
  weft_tensor_destroy(t);
  weft_graph *g;
  OK(weft_graph_create(&g));
  weft_var *x, *h;
  OK(weft_graph_input(g, dx, true, &x));
  h = x;
  for (int l = 0; l < LAYERS; l++) OK(weft_op_sdpa(h, h, h, true, &h));
  const int64_t out = n * (int64_t)sizeof(float), lse = (int64_t)B * H * T * (int64_t)sizeof(float);
  const int64_t scratch =
      (int64_t)weft_backend_attention_scratch_bytes(weft_mesh_device(mesh), B, T, H, H, HD);
  cr_assert_gt(scratch, 0);
  const int64_t fwd = weft_graph_bytes_in_use(g);
  cr_assert_eq(fwd, LAYERS * (out + lse),
               "after forward %lld bytes in use: %d x (output %lld + lse %lld) expected, "
               "scratch %lld each",
               (long long)fwd, LAYERS, (long long)out, (long long)lse, (long long)scratch);
  OK(weft_backward_grad(h, dr));
  const int64_t peak = weft_graph_bytes_peak(g);
  /* one scratch, the output grad, one layer's dq|dk|dv and their sum */
  cr_assert_leq(peak - fwd, scratch + 6 * out, "backward added %lld bytes (scratch %lld)",
                (long long)(peak - fwd), (long long)scratch);
  /* after backward: the outputs (values stay) and the input's grad; each
   * layer's lse went back once its backward had run */
  const int64_t after = weft_graph_bytes_in_use(g);
  cr_assert_leq(after, (LAYERS + 1) * out,
                "after backward %lld bytes in use: %d outputs and one grad of %lld expected",
                (long long)after, LAYERS, (long long)out);
  double *gx;
  int64_t ng;
  OK(oc_full_values(weft_var_grad(x), &gx, &ng));
  cr_assert_eq(ng, n);
  double sq = 0;
  for (int64_t e = 0; e < n; e++) sq += gx[e] * gx[e];
  cr_assert(isfinite(sq) && sq > 0, "the input's grad: sum of squares %g", sq);
  free(gx);
  weft_graph_destroy(g);
  weft_dtensor_destroy(dx);
  weft_dtensor_destroy(dr);
  weft_mesh_destroy(mesh);
  weft_finalize();
}

Test(graph_memory, attention_layers_share_one_scratch_forward_and_backward, .timeout = 60) {
  attention_stack_case(false);
}
Test(graph_memory, attention_layers_share_one_scratch_forward_and_backward_on_device,
     .timeout = 60) {
  attention_stack_case(true);
}

/* y = 2 x, in a module of its own (so that its hooks fire in backward). */
static weft_status twice_forward(weft_module *m, void *ctx, weft_var *const *in, int nin,
                                 weft_var **out, int nout) {
  (void)m, (void)ctx, (void)nin, (void)nout;
  return weft_op_scale(in[0], 2.0, out);
}

/* A backward hook that replaces the grad by a new tensor of 1.5 x it. */
static weft_status grad_hook(weft_module *m, weft_hook_kind kind, const weft_dtensor *t,
                             weft_dtensor **replace, void *ctx) {
  (void)m, (void)kind;
  int *calls = ctx;
  ++*calls;
  const weft_dtensor_spec *s = weft_dtensor_get_spec(t);
  WEFT_CHECK(weft_dtensor_empty(weft_dtensor_mesh(t), s->dtype, s->ndim, s->shape, s->placements,
                                s->mesh_ndim, replace));
  WEFT_CHECK(weft_tensor_copy(weft_dtensor_local(*replace), weft_dtensor_local(t)));
  return weft_scale(weft_dtensor_local(*replace), 1.5);
}

Test(graph_memory, backward_hook_replacements_are_freed_once_consumed, .timeout = 60) {
  enum { MODS = 6 };
  weft_mesh *mesh;
  OK(oc_one_rank_mesh(false, &mesh));
  const int64_t n = (int64_t)ROWS * COLS, buf = n * (int64_t)sizeof(float);
  uint64_t s = weft_test_rng_state(11);
  double *hx = malloc(sizeof(double) * (size_t)n), *hr = malloc(sizeof(double) * (size_t)n);
  for (int64_t e = 0; e < n; e++) {
    hx[e] = 2 * weft_test_rng_unit(&s) - 1;
    hr[e] = 2 * weft_test_rng_unit(&s) - 1;
  }
  weft_dtensor *dx = replicated(mesh, hx), *dr = replicated(mesh, hr);
  static const weft_module_def def = {"twice", twice_forward, NULL};
  weft_module *mods[MODS];
  weft_hook_handle h[MODS];
  int calls = 0;
  for (int i = 0; i < MODS; i++) {
    char name[16];
    snprintf(name, sizeof name, "m%d", i);
    OK(weft_module_create(mesh, name, &def, NULL, &mods[i]));
    /* both backward hook points: the END node's and the BEGIN node's */
    weft_hook_kind kind = i % 2 ? WEFT_HOOK_PRE_BACKWARD : WEFT_HOOK_POST_BACKWARD;
    OK(weft_module_register_hook(mods[i], kind, grad_hook, &calls, &h[i]));
  }
  const int64_t base = weft_mem_get(WEFT_CPU).current_bytes;
  weft_graph *g;
  OK(weft_graph_create(&g));
  for (int step = 0; step < 2; step++) {
    weft_var *x, *y;
    OK(weft_graph_input(g, dx, true, &x));
    y = x;
    for (int i = 0; i < MODS; i++) OK(weft_module_call1(mods[i], y, &y));
    OK(weft_backward_grad(y, dr));
    cr_assert_eq(calls, (step + 1) * MODS, "step %d: %d hook calls", step, calls);
    /* dx = (2 * 1.5)^MODS r: every replacement was read before it went */
    double *got = values(weft_var_grad(x)), worst = 0, f = pow(3.0, MODS);
    for (int64_t e = 0; e < n; e++) {
      double err = fabs(got[e] - f * hr[e]) / (fabs(f * hr[e]) + 1e-3);
      if (err > worst) worst = err;
    }
    cr_assert_leq(worst, 1e-5, "step %d: dx rel err %.3g", step, worst);
    free(got);
    OK(weft_graph_reset(g));
  }
  weft_graph_destroy(g);
  /* the pool went with the graph; held by the modules until their hooks'
   * next run, the replacements would be MODS buffers more */
  const int64_t left = weft_mem_get(WEFT_CPU).current_bytes - base;
  cr_assert_eq(left, 0, "%lld bytes left after the graph is gone (%lld per replacement)",
               (long long)left, (long long)buf);
  for (int i = 0; i < MODS; i++) weft_module_destroy(mods[i]);
  weft_dtensor_destroy(dx);
  weft_dtensor_destroy(dr);
  free(hx);
  free(hr);
  weft_mesh_destroy(mesh);
  weft_finalize();
}
