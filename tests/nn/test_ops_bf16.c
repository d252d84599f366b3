/* tests/nn/test_ops_bf16.c — bf16 inputs of the shape and linear ops
 * (autograd.h "dtypes"; nn/mixed.c), in process on a 1-rank mesh.
 *
 * Every case of tests/nn/ops_check.c (matmul, reshape, transpose, split,
 * cat, sum, mean, linear, add, mul, scale) runs twice on the same values
 * (random, bf16-representable): once as f32 DTensors, once as bf16. The
 * bf16 outputs must be bf16 and equal the f32 outputs rounded to bf16
 * (bitwise: the op computes in f32 on the widened inputs and rounds once);
 * the input grads must be bf16 and agree with the f32 grads to bf16
 * precision. Then PyTorch's promotion and its errors: f32 + bf16 is f32
 * with each grad in its input's dtype, a linear of f32 and bf16 operands
 * and an op mixing bf16 with f16 fail naming the dtypes, weft_op_to
 * converts both ways, and a bf16 loss is read by weft_var_item.
 * The *_on_device variants put the mesh on WEFT_CUDA (within one bf16 step
 * instead of bitwise) and skip, saying why, without a CUDA device. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "harness.h"
#include "ops_check.h"

static double bf16r(double x) { return weft_bf16_to_f32(weft_f32_to_bf16((float)x)); }

static weft_mesh *one_rank_mesh(bool on_device) {
  weft_mesh *mesh;
  OK(oc_one_rank_mesh(on_device, &mesh));
  return mesh;
}

/* A Replicate DTensor of dtype dt holding v (bf16-representable). */
static weft_dtensor *make(weft_mesh *mesh, weft_dtype dt, int nd, const int64_t *shape,
                          const double *v) {
  weft_tensor *f32, *t;
  OK(weft_tensor_create(WEFT_F32, WEFT_CPU, nd, shape, &f32));
  int64_t n = weft_tensor_numel(f32);
  for (int64_t i = 0; i < n; i++) ((float *)f32->data)[i] = (float)v[i];
  OK(weft_tensor_create(dt, WEFT_CPU, nd, shape, &t));
  OK(weft_tensor_copy(t, f32));
  weft_placement r = weft_replicate();
  weft_dtensor *d;
  OK(weft_dtensor_distribute(mesh, t, WEFT_DTENSOR_ALL_RANKS, &r, 1, &d));
  weft_tensor_destroy(f32);
  weft_tensor_destroy(t);
  return d;
}

/* The full value as doubles (any float dtype, any device). */
static double *values(const weft_dtensor *d, int64_t *n) {
  double *v;
  OK(oc_full_values(d, &v, n));
  return v;
}

static void random_bf16(double *v, int64_t n, uint64_t *s) {
  for (int64_t i = 0; i < n; i++) {
    double x = 0.5 + weft_test_rng_unit(s);
    v[i] = bf16r(weft_test_rng_u64(s) & 1 ? -x : x);
  }
}

/* bf16 `got` against the f32 `want`: bitwise the rounded value (rounded,
 * on the CPU), within one bf16 step (rounded, on a device), or largest
 * error within 1/64 of the largest value. */
static void expect_bf16(const char *what, const weft_dtensor *got, const weft_dtensor *want,
                        bool rounded, bool exact) {
  cr_assert_eq(weft_dtensor_dtype(got), WEFT_BF16, "%s is %s, not bf16", what,
               weft_dtype_name(weft_dtensor_dtype(got)));
  int64_t n1, n2;
  double *a = values(got, &n1), *b = values(want, &n2);
  cr_assert_eq(n1, n2, "%s: %lld elements vs %lld", what, (long long)n1, (long long)n2);
  if (rounded) {
    for (int64_t i = 0; i < n1; i++) {
      double r = bf16r(b[i]);
      bool ok = exact ? a[i] == r : fabs(a[i] - r) <= fabs(r) / 128;
      cr_assert(ok, "%s[%lld]: bf16 %.9g, f32 %.9g rounded %.9g", what, (long long)i, a[i], b[i],
                r);
    }
  } else {
    double e = weft_test_rel_max_f64(a, b, n1);
    cr_assert_leq(e, 1.0 / 64, "%s: bf16 vs f32 rel err %.3g > 1/64", what, e);
  }
  free(a);
  free(b);
}

/* One case of ops_check.c in f32 and in bf16 on the same values. */
static void twin(const oc_case *c, weft_mesh *mesh, bool exact) {
  uint64_t s = weft_test_rng_state(weft_test_seed(77));
  weft_graph *g[2];
  weft_dtensor *in[2][OC_MAX_IN] = {{0}}, *R[2] = {0};
  weft_var *v[2][OC_MAX_IN] = {{0}}, *out[2][OC_MAX_OUT] = {{0}};
  double *h[OC_MAX_IN];
  for (int a = 0; a < c->nin; a++) {
    int64_t n = oc_numel(c->ndim[a], c->shape[a]);
    h[a] = malloc(sizeof(double) * (size_t)n);
    random_bf16(h[a], n, &s);
  }
  int64_t nr = oc_numel(c->ondim[0], c->oshape[0]);
  double *hr = malloc(sizeof(double) * (size_t)nr);
  random_bf16(hr, nr, &s);
  for (int k = 0; k < 2; k++) {
    weft_dtype dt = k ? WEFT_BF16 : WEFT_F32;
    OK(weft_graph_create(&g[k]));
    for (int a = 0; a < c->nin; a++) {
      in[k][a] = make(mesh, dt, c->ndim[a], c->shape[a], h[a]);
      OK(weft_graph_input(g[k], in[k][a], true, &v[k][a]));
    }
    OK(c->run(c, v[k], out[k]));
    R[k] = make(mesh, dt, c->ondim[0], c->oshape[0], hr);
    OK(weft_backward_grad(out[k][0], R[k]));
  }
  char what[96];
  for (int j = 0; j < c->nout; j++) {
    snprintf(what, sizeof what, "%s: output %d", c->name, j);
    expect_bf16(what, weft_var_value(out[1][j]), weft_var_value(out[0][j]), true, exact);
  }
  for (int a = 0; a < c->nin; a++) {
    snprintf(what, sizeof what, "%s: grad of input %d", c->name, a);
    cr_assert(weft_var_grad(v[1][a]) && weft_var_grad(v[0][a]), "%s missing", what);
    expect_bf16(what, weft_var_grad(v[1][a]), weft_var_grad(v[0][a]), false, exact);
  }
  for (int k = 0; k < 2; k++) {
    weft_graph_destroy(g[k]);
    weft_dtensor_destroy(R[k]);
    for (int a = 0; a < c->nin; a++) weft_dtensor_destroy(in[k][a]);
  }
  for (int a = 0; a < c->nin; a++) free(h[a]);
  free(hr);
}

static void every_case(bool on_device) {
  if (on_device) WEFT_TEST_REQUIRE_CUDA_DEVICE();
  weft_mesh *mesh = one_rank_mesh(on_device);
  int n = 0;
  for (const oc_case *c = oc_cases; c->name; c++, n++) twin(c, mesh, !on_device);
  cr_assert_geq(n, 20, "only %d cases", n);
  weft_mesh_destroy(mesh);
  weft_finalize();
}

Test(ops_bf16, every_shape_and_linear_op_gives_the_f32_result_rounded, .timeout = 60) {
  every_case(false);
}
Test(ops_bf16, every_shape_and_linear_op_gives_the_f32_result_rounded_on_device, .timeout = 60) {
  every_case(true);
}

/* f32 + bf16 promotes to f32 (PyTorch); each input's grad keeps its dtype. */
Test(ops_bf16, f32_plus_bf16_is_f32_and_grads_keep_their_dtypes, .timeout = 60) {
  weft_mesh *mesh = one_rank_mesh(false);
  uint64_t s = weft_test_rng_state(5);
  double ha[12], hb[12], hr[12];
  random_bf16(ha, 12, &s);
  random_bf16(hb, 12, &s);
  random_bf16(hr, 12, &s);
  int64_t shape[2] = {3, 4};
  weft_dtensor *a = make(mesh, WEFT_F32, 2, shape, ha), *b = make(mesh, WEFT_BF16, 2, shape, hb);
  weft_dtensor *r = make(mesh, WEFT_F32, 2, shape, hr);
  weft_graph *g;
  OK(weft_graph_create(&g));
  weft_var *va, *vb, *y;
  OK(weft_graph_input(g, a, true, &va));
  OK(weft_graph_input(g, b, true, &vb));
  OK(weft_op_mul(va, vb, &y));
  cr_assert_eq(weft_dtensor_dtype(weft_var_value(y)), WEFT_F32);
  int64_t n;
  double *yv = values(weft_var_value(y), &n);
  for (int i = 0; i < 12; i++) cr_assert_eq(yv[i], (double)(float)(ha[i] * hb[i]), "y[%d]", i);
  OK(weft_backward_grad(y, r));
  cr_assert_eq(weft_dtensor_dtype(weft_var_grad(va)), WEFT_F32);
  cr_assert_eq(weft_dtensor_dtype(weft_var_grad(vb)), WEFT_BF16);
  double *gb = values(weft_var_grad(vb), &n);
  for (int i = 0; i < 12; i++) cr_assert_eq(gb[i], bf16r(hr[i] * ha[i]), "grad b[%d]", i);
  free(yv);
  free(gb);
  weft_graph_destroy(g);
  weft_dtensor_destroy(a);
  weft_dtensor_destroy(b);
  weft_dtensor_destroy(r);
  weft_mesh_destroy(mesh);
  weft_finalize();
}

/* PyTorch rejects a matmul of f32 and bf16 operands; weft names both. */
Test(ops_bf16, mixed_operand_dtypes_fail_naming_them, .timeout = 60) {
  weft_mesh *mesh = one_rank_mesh(false);
  double h[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  int64_t xs[2] = {3, 4}, ws[2] = {2, 4};
  weft_dtensor *x = make(mesh, WEFT_F32, 2, xs, h), *w = make(mesh, WEFT_BF16, 2, ws, h);
  weft_dtensor *x16 = make(mesh, WEFT_F16, 2, xs, h), *xb = make(mesh, WEFT_BF16, 2, xs, h);
  weft_graph *g;
  OK(weft_graph_create(&g));
  weft_var *vx, *vw, *v16, *vb, *y = NULL;
  OK(weft_graph_input(g, x, true, &vx));
  OK(weft_graph_input(g, w, true, &vw));
  OK(weft_graph_input(g, x16, true, &v16));
  OK(weft_graph_input(g, xb, true, &vb));
  cr_assert_eq(weft_op_linear(vx, vw, NULL, &y), WEFT_ERR_INVALID);
  cr_assert(strstr(weft_last_error(), "f32 and bf16"), "%s", weft_last_error());
  cr_assert(strstr(weft_last_error(), "linear"), "%s", weft_last_error());
  cr_assert_eq(weft_op_add(v16, vb, &y), WEFT_ERR_UNSUPPORTED);
  cr_assert(strstr(weft_last_error(), "f16") && strstr(weft_last_error(), "bf16"), "%s",
            weft_last_error());
  /* after a cast the linear runs, in bf16 */
  weft_var *xc;
  OK(weft_op_to(vx, WEFT_BF16, &xc));
  OK(weft_op_linear(xc, vw, NULL, &y));
  cr_assert_eq(weft_dtensor_dtype(weft_var_value(y)), WEFT_BF16);
  cr_assert_eq(weft_op_to(vx, WEFT_I32, &y), WEFT_ERR_UNSUPPORTED);
  weft_graph_destroy(g);
  weft_dtensor_destroy(x);
  weft_dtensor_destroy(w);
  weft_dtensor_destroy(x16);
  weft_dtensor_destroy(xb);
  weft_mesh_destroy(mesh);
  weft_finalize();
}

/* A bf16 parameter (as FSDP's mixed precision swaps one into `data`) keeps
 * an f32 grad: each backward's bf16 grad is widened into it a chunk at a
 * time (nn/graph.c add_widened), with no f32 copy of the whole grad. A
 * weight of 300 x 301 spans chunks and ends in a partial one; its grad is
 * dy^T x rounded once to bf16, widened, and a second backward doubles it
 * exactly. */
static void bf16_param_grad_case(bool on_device) {
  if (on_device) WEFT_TEST_REQUIRE_CUDA_DEVICE();
  weft_mesh *mesh = one_rank_mesh(on_device);
  enum { R = 4, K = 301, N = 300 };
  weft_module *lin;
  OK(weft_linear_create_ex(mesh, "lin", K, N, false, &lin));
  OK(weft_module_init_weights(lin, 3));
  weft_param *p = weft_module_get_param(lin, "weight");
  cr_assert_not_null(p);
  uint64_t s = weft_test_rng_state(11);
  double *hw = malloc(sizeof(double) * N * K), hx[R * K], hd[R * N];
  random_bf16(hw, N * K, &s);
  random_bf16(hx, R * K, &s);
  random_bf16(hd, R * N, &s);
  int64_t ws[2] = {N, K}, xs[2] = {R, K}, ds[2] = {R, N};
  weft_dtensor *f32_data = p->data, *w = make(mesh, WEFT_BF16, 2, ws, hw);
  weft_dtensor *x = make(mesh, WEFT_BF16, 2, xs, hx), *dy = make(mesh, WEFT_BF16, 2, ds, hd);
  p->data = w;
  double *g1 = NULL;
  for (int pass = 0; pass < 2; pass++) {
    weft_graph *g;
    OK(weft_graph_create(&g));
    weft_var *vx, *y;
    OK(weft_graph_input(g, x, false, &vx));
    OK(weft_op_linear(vx, weft_graph_param(g, p), NULL, &y));
    OK(weft_backward_grad(y, dy));
    cr_assert_eq(weft_dtensor_dtype(p->grad), WEFT_F32);
    int64_t n;
    double *gv = values(p->grad, &n);
    cr_assert_eq(n, (int64_t)N * K);
    if (pass == 0) {
      for (int i = 0; i < N; i++)
        for (int j = 0; j < K; j++) {
          double ref = 0;
          for (int r = 0; r < R; r++) ref += hd[r * N + i] * hx[r * K + j];
          const double got = gv[(int64_t)i * K + j], tol = fabs(ref) / 128 + 1e-6;
          cr_assert(fabs(got - ref) <= tol && got == bf16r(got),
                    "grad[%d][%d] = %.9g, want %.9g rounded once to bf16", i, j, got, ref);
        }
      g1 = gv;
    } else {
      for (int64_t i = 0; i < n; i++)
        cr_assert_eq(gv[i], 2 * g1[i], "grad[%lld] after two backwards: %.9g, want 2 x %.9g",
                     (long long)i, gv[i], g1[i]);
      free(gv);
    }
    weft_graph_destroy(g);
  }
  free(g1);
  p->data = f32_data;
  weft_module_destroy(lin);
  weft_dtensor_destroy(w);
  weft_dtensor_destroy(x);
  weft_dtensor_destroy(dy);
  free(hw);
  weft_mesh_destroy(mesh);
  weft_finalize();
}
Test(ops_bf16, bf16_parameter_grad_is_widened_into_its_f32_grad_chunk_by_chunk, .timeout = 60) {
  bf16_param_grad_case(false);
}
Test(ops_bf16, bf16_parameter_grad_is_widened_into_its_f32_grad_chunk_by_chunk_on_device,
     .timeout = 60) {
  bf16_param_grad_case(true);
}

/* to(bf16) rounds, its grad comes back in the input's dtype; a bf16 loss
 * (cross-entropy of bf16 logits) is read by weft_var_item. */
Test(ops_bf16, to_rounds_and_its_grad_returns_in_the_input_dtype, .timeout = 60) {
  weft_mesh *mesh = one_rank_mesh(false);
  double h[8] = {1.0 / 3, -2.0 / 3, 0.1, 7.123456, -5.5, 1e-3, 2.0, 3.25};
  int64_t shape[2] = {2, 4};
  weft_dtensor *x = make(mesh, WEFT_F32, 2, shape, h);
  weft_graph *g;
  OK(weft_graph_create(&g));
  weft_var *vx, *y, *same, *loss;
  OK(weft_graph_input(g, x, true, &vx));
  OK(weft_op_to(vx, WEFT_F32, &same));
  cr_assert_eq(same, vx, "to(own dtype) returns the var itself");
  OK(weft_op_to(vx, WEFT_BF16, &y));
  int64_t n;
  double *yv = values(weft_var_value(y), &n);
  for (int i = 0; i < 8; i++) cr_assert_eq(yv[i], bf16r((float)h[i]), "y[%d]", i);
  weft_tensor *tt;
  int64_t ts[1] = {2};
  OK(weft_tensor_create(WEFT_I32, WEFT_CPU, 1, ts, &tt));
  ((int32_t *)tt->data)[0] = 1;
  ((int32_t *)tt->data)[1] = 3;
  weft_placement r = weft_replicate();
  weft_dtensor *tgt;
  OK(weft_dtensor_distribute(mesh, tt, WEFT_DTENSOR_ALL_RANKS, &r, 1, &tgt));
  OK(weft_op_cross_entropy(y, tgt, -100, &loss));
  cr_assert_eq(weft_dtensor_dtype(weft_var_value(loss)), WEFT_BF16);
  /* the f64 reference: mean over rows of lse - logit[target], on the bf16 values */
  double want = 0;
  for (int row = 0; row < 2; row++) {
    double m = -1e300, se = 0;
    for (int c = 0; c < 4; c++) m = fmax(m, yv[row * 4 + c]);
    for (int c = 0; c < 4; c++) se += exp(yv[row * 4 + c] - m);
    want += (m + log(se) - yv[row * 4 + (row ? 3 : 1)]) / 2;
  }
  double got = weft_var_item(loss);
  cr_assert(fabs(got - want) <= fabs(want) / 128, "loss %.6g, f64 %.6g", got, want);
  cr_assert_eq(got, bf16r(got), "the loss is a bf16 value");
  OK(weft_backward(loss));
  cr_assert_eq(weft_dtensor_dtype(weft_var_grad(vx)), WEFT_F32);
  free(yv);
  weft_graph_destroy(g);
  weft_dtensor_destroy(x);
  weft_dtensor_destroy(tgt);
  weft_tensor_destroy(tt);
  weft_mesh_destroy(mesh);
  weft_finalize();
}

/* ----------------------------------------------- storage-dtype kernels
 * add, mul, scale, linear (without a bias: with one, a device adds it
 * before rounding the GEMM's f32 sum, where the f32 path adds it after),
 * matmul, the activations, SwiGLU, dropout, LayerNorm, RMSNorm,
 * softmax, cross-entropy, embedding, RoPE, attention, the shape ops and sum
 * run in bf16 / f16 themselves
 * where the device's
 * kernel takes the dtype (backend.h takes_dtype): nothing is widened, in
 * forward or backward, and outputs and grads have the bits of the
 * widened path (a registered copy of the device's table without
 * takes_dtype, which the op layer must widen for). */

enum { SD_IN = 4, SD_ROWS = 6, SD_COLS = 5 };

typedef struct sd_run {
  double *y, *loss, *grad[SD_IN];
  int64_t widened;
} sd_run;

/* z = softmax(relu(gelu(scale(silu(dropout(swiglu(mul(rms_norm(rms_norm(
 * layer_norm(gelu_tanh(add(add(a, b), bias)), bias, bias), bias)), c), b),
 * 0.3)), 0.37)))) + a on the values
 * h (a, b, c: ROWS x COLS; bias: COLS, broadcast, and LayerNorm's weight
 * and bias); loss = cross_entropy(matmul(linear(z, c), c) * r, targets)
 * with one row ignored (its loss in the storage dtype, as PyTorch's),
 * backward from it. */
static sd_run sd_chain(weft_mesh *mesh, weft_dtype dt, double *const *h, const double *hr) {
  int64_t full[2] = {SD_ROWS, SD_COLS}, row[1] = {SD_COLS};
  weft_dtensor *in[SD_IN], *r = make(mesh, dt, 2, full, hr), *tg;
  {
    weft_tensor *t;
    OK(weft_tensor_create(WEFT_I32, WEFT_CPU, 1, full, &t));
    for (int64_t i = 0; i < SD_ROWS; i++)
      ((int32_t *)t->data)[i] = (int32_t)((i * 3 + 1) % SD_COLS);
    weft_placement rp = weft_replicate();
    OK(weft_dtensor_distribute(mesh, t, WEFT_DTENSOR_ALL_RANKS, &rp, 1, &tg));
    weft_tensor_destroy(t);
  }
  weft_graph *g;
  OK(weft_graph_create(&g));
  weft_var *v[SD_IN], *t, *z, *rv, *loss;
  for (int i = 0; i < SD_IN; i++) {
    in[i] = i == 2 ? make(mesh, dt, 1, row, h[i]) : make(mesh, dt, 2, full, h[i]);
    OK(weft_graph_input(g, in[i], true, &v[i]));
  }
  weft_op_stats s0 = weft_op_stats_get();
  OK(weft_op_add(v[0], v[1], &t));
  OK(weft_op_add(t, v[2], &t));
  OK(weft_op_gelu(t, true, &t));
  OK(weft_op_layer_norm(t, v[2], v[2], 1e-5f, &t));
  OK(weft_op_rms_norm(t, v[2], 1e-6f, &t));
  OK(weft_op_rms_norm(t, NULL, 1e-6f, &t));
  OK(weft_op_mul(t, v[3], &t));
  OK(weft_op_swiglu(t, v[1], &t));
  OK(weft_op_dropout(t, 0.3f, &t));
  OK(weft_op_silu(t, &t));
  OK(weft_op_scale(t, 0.37, &t));
  OK(weft_op_gelu(t, false, &t));
  OK(weft_op_relu(t, &t));
  OK(weft_op_softmax(t, &t));
  OK(weft_op_add(t, v[0], &z));
  cr_assert_eq(weft_dtensor_dtype(weft_var_value(z)), dt, "z is %s",
               weft_dtype_name(weft_dtensor_dtype(weft_var_value(z))));
  OK(weft_graph_input(g, r, false, &rv));
  OK(weft_op_linear(z, v[3], NULL, &t)); /* (ROWS, ROWS) */
  OK(weft_op_matmul(t, v[3], &t));       /* (ROWS, COLS) */
  OK(weft_op_mul(t, rv, &t));
  OK(weft_op_cross_entropy(t, tg, 2, &loss)); /* row 2's target is 2: ignored */
  cr_assert_eq(weft_dtensor_dtype(weft_var_value(loss)), dt, "the loss is %s",
               weft_dtype_name(weft_dtensor_dtype(weft_var_value(loss))));
  OK(weft_backward(loss));
  sd_run out;
  out.widened = weft_op_stats_get().widened - s0.widened;
  int64_t n;
  out.y = values(weft_var_value(z), &n);
  out.loss = values(weft_var_value(loss), &n);
  cr_assert(isfinite(out.loss[0]) && out.loss[0] > 0, "loss %g", out.loss[0]);
  for (int i = 0; i < SD_IN; i++) {
    cr_assert_eq(weft_dtensor_dtype(weft_var_grad(v[i])), dt, "grad %d dtype", i);
    out.grad[i] = values(weft_var_grad(v[i]), &n);
  }
  weft_graph_destroy(g);
  for (int i = 0; i < SD_IN; i++) weft_dtensor_destroy(in[i]);
  weft_dtensor_destroy(r);
  weft_dtensor_destroy(tg);
  return out;
}

static void sd_free(sd_run *r) {
  free(r->y);
  free(r->loss);
  for (int i = 0; i < SD_IN; i++) free(r->grad[i]);
}

static void sd_expect_same(const char *what, const double *got, const double *want, int64_t n,
                           weft_dtype dt) {
  for (int64_t i = 0; i < n; i++)
    cr_assert(got[i] == want[i], "%s %s[%lld]: storage-dtype kernel %.9g, widened %.9g",
              weft_dtype_name(dt), what, (long long)i, got[i], want[i]);
}

/* An int32 DTensor of shape (nd dims) with the values v, replicated. */
static weft_dtensor *make_ids(weft_mesh *mesh, int nd, const int64_t *shape, const int32_t *v) {
  weft_tensor *t;
  OK(weft_tensor_create(WEFT_I32, WEFT_CPU, nd, shape, &t));
  memcpy(t->data, v, sizeof(int32_t) * (size_t)weft_tensor_numel(t));
  weft_placement rp = weft_replicate();
  weft_dtensor *d;
  OK(weft_dtensor_distribute(mesh, t, WEFT_DTENSOR_ALL_RANKS, &rp, 1, &d));
  weft_tensor_destroy(t);
  return d;
}

/* The lookups, attention and the shape ops: e = rope(embedding(ids, w),
 * 10000, pos0 3) with ids (1, 3, 2) into w (7, 4) (id 5 twice: its grad
 * row sums two rows), y = sdpa(e, e, e, causal) (B 1, T 3, 2 heads of 4),
 * then s = sum(cat(split(transpose(reshape(y, (3, 8)), 0, 1), 0, [5, 3])
 * swapped, 0), 1), backward from r (8 values); y and w's grad. */
enum { EMB_V = 7, EMB_D = 4, EMB_N = 6 };
static void sd_lookups(weft_mesh *mesh, weft_dtype dt, const double *hw, const double *hr,
                       double **yo, double **gw, int64_t *widened) {
  const int64_t ishape[3] = {1, 3, 2}, wshape[2] = {EMB_V, EMB_D}, rshape[1] = {8};
  const int32_t ids[EMB_N] = {5, 0, 3, 5, 6, 1};
  weft_dtensor *id = make_ids(mesh, 3, ishape, ids), *w = make(mesh, dt, 2, wshape, hw),
               *r = make(mesh, dt, 1, rshape, hr);
  weft_graph *g;
  OK(weft_graph_create(&g));
  weft_var *vi, *vw, *t, *y, *parts[2];
  OK(weft_graph_input(g, id, false, &vi));
  OK(weft_graph_input(g, w, true, &vw));
  weft_op_stats s0 = weft_op_stats_get();
  OK(weft_op_embedding(vi, vw, &t));
  OK(weft_op_rope(t, 10000.0, 3, &t));
  OK(weft_op_sdpa(t, t, t, true, &y));
  OK(weft_op_reshape(y, 2, (const int64_t[]){3, 8}, &t));
  OK(weft_op_transpose(t, 0, 1, &t)); /* (8, 3) */
  OK(weft_op_split(t, 0, 2, (const int64_t[]){5, 3}, parts));
  OK(weft_op_cat((weft_var *const[]){parts[1], parts[0]}, 2, 0, &t));
  OK(weft_op_sum(t, 1, false, &t)); /* (8) */
  cr_assert_eq(weft_dtensor_dtype(weft_var_value(t)), dt);
  OK(weft_backward_grad(t, r));
  *widened = weft_op_stats_get().widened - s0.widened;
  int64_t n;
  *yo = values(weft_var_value(y), &n);
  cr_assert_eq(weft_dtensor_dtype(weft_var_grad(vw)), dt, "grad w dtype");
  *gw = values(weft_var_grad(vw), &n);
  weft_graph_destroy(g);
  weft_dtensor_destroy(id);
  weft_dtensor_destroy(w);
  weft_dtensor_destroy(r);
}

static void storage_dtype_case(bool on_device) {
  if (on_device) WEFT_TEST_REQUIRE_CUDA_DEVICE();
  weft_mesh *mesh = one_rank_mesh(on_device);
  weft_device dev = on_device ? WEFT_CUDA : WEFT_CPU;
  uint64_t s = weft_test_rng_state(weft_test_seed(43));
  const int64_t n = SD_ROWS * SD_COLS;
  double *h[SD_IN], hr[SD_ROWS * SD_COLS];
  for (int i = 0; i < SD_IN; i++) {
    h[i] = malloc(sizeof(double) * (size_t)n);
    random_bf16(h[i], n, &s); /* bf16 values: f16 holds them too */
  }
  random_bf16(hr, n, &s);
  const weft_dtype dts[2] = {WEFT_BF16, WEFT_F16};
  for (int k = 0; k < 2; k++) {
    cr_assert(weft_backend_takes_dtype(dev, WEFT_KERNEL_ADD, dts[k]));
    sd_run native = sd_chain(mesh, dts[k], h, hr);
    cr_expect_eq(native.widened, 0, "%s on %s: %lld tensors widened, want 0",
                 weft_dtype_name(dts[k]), weft_device_name(dev), (long long)native.widened);
    weft_backend t = *weft_backend_get(dev);
    t.takes_dtype = NULL;
    OK(weft_backend_register(&t));
    sd_run widened = sd_chain(mesh, dts[k], h, hr);
    weft_backend_reset(dev);
    cr_expect_gt(widened.widened, 0, "the table without takes_dtype widens");
    sd_expect_same("z", native.y, widened.y, n, dts[k]);
    sd_expect_same("loss", native.loss, widened.loss, 1, dts[k]);
    const char *names[SD_IN] = {"grad a", "grad b", "grad bias", "grad c"};
    for (int i = 0; i < SD_IN; i++)
      sd_expect_same(names[i], native.grad[i], widened.grad[i], i == 2 ? SD_COLS : n, dts[k]);
    sd_free(&native);
    sd_free(&widened);
  }
  /* embedding and RoPE the same way */
  double hw[EMB_V * EMB_D], hy[EMB_N * EMB_D];
  random_bf16(hw, EMB_V * EMB_D, &s);
  random_bf16(hy, EMB_N * EMB_D, &s);
  for (int k = 0; k < 2; k++) {
    double *y1, *g1, *y2, *g2;
    int64_t w1, w2;
    sd_lookups(mesh, dts[k], hw, hy, &y1, &g1, &w1);
    weft_backend t = *weft_backend_get(dev);
    t.takes_dtype = NULL;
    OK(weft_backend_register(&t));
    sd_lookups(mesh, dts[k], hw, hy, &y2, &g2, &w2);
    weft_backend_reset(dev);
    cr_expect_eq(w1, 0, "%s embedding ... sum: %lld tensors widened", weft_dtype_name(dts[k]),
                 (long long)w1);
    cr_expect_gt(w2, 0);
    sd_expect_same("sdpa(rope(embedding))", y1, y2, EMB_N * EMB_D, dts[k]);
    sd_expect_same("grad w", g1, g2, EMB_V * EMB_D, dts[k]);
    free(y1), free(g1), free(y2), free(g2);
  }
  for (int i = 0; i < SD_IN; i++) free(h[i]);
  weft_mesh_destroy(mesh);
  weft_finalize();
}

Test(ops_bf16, elementwise_and_activations_in_bf16_and_f16_widen_nothing_and_give_the_widened_bits,
     .timeout = 60) {
  storage_dtype_case(false);
}
Test(ops_bf16,
     elementwise_and_activations_in_bf16_and_f16_widen_nothing_and_give_the_widened_bits_on_device,
     .timeout = 60) {
  storage_dtype_case(true);
}
