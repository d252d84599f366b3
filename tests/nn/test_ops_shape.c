/* tests/nn/test_ops_shape.c — the autograd ops of nn/ops_shape.c (matmul,
 * reshape, transpose, split, cat, sum, mean) and nn/ops_linear.c (linear,
 * add with broadcast, mul, scale).
 *
 * In process on a 1-rank mesh (MPI starts as a singleton; each Test is its
 * own Criterion child): every op's forward against a double reference on
 * random non-zero inputs, and its backward (weft_backward_grad(out, R))
 * against central differences of sum(out * R) from the reference
 * (tests/nn/ops_check.c). Then ops_shape_worker on 2 and 4 ranks: random
 * placements give the 1-rank results, and directed cases keep their shards.
 * The multi-rank *_on_device variants run the same worker cases with every
 * mesh on WEFT_CUDA (the worker's device mode, WEFT_TEST_DEVICE=cuda) and
 * the same tolerances; they skip, saying why, where this process sees no
 * CUDA device.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "harness.h"
#include "ops_check.h"

#define OPS_WORKER WORKER("ops_shape_worker")

/* on_device: the mesh on WEFT_CUDA (skips, saying why, without one) */
static void one_rank(const char *name, bool on_device) {
  if (on_device) WEFT_TEST_REQUIRE_CUDA_DEVICE();
  const oc_case *c = oc_find(name);
  cr_assert_not_null(c, "no case %s", name);
  unsigned long seed = weft_test_seed(1234);
  weft_mesh *mesh;
  OK(oc_one_rank_mesh(on_device, &mesh));
  int fails = 0;
  /* all Replicate; multi-output ops also from each output alone */
  fails += oc_run(c, mesh, NULL, NULL, -1, seed, 1e-5, NULL);
  for (int j = 0; c->nout > 1 && j < c->nout; j++)
    fails += oc_run(c, mesh, NULL, NULL, j, seed + 1 + (unsigned long)j, 1e-5, NULL);
  /* placements on a 1-rank mesh (Partial, shards) */
  uint64_t st = seed;
  for (int t = 0; t < 6; t++) {
    weft_placement pl[OC_MAX_IN], gpl[1];
    oc_random_placements(c, 1, &st, pl);
    oc_random_grad_placements(c->ondim[0], 1, &st, gpl);
    fails += oc_run(c, mesh, pl, gpl, -1, seed + 100 + (unsigned long)t, 1e-5, NULL);
  }
  int64_t device_allocs = on_device ? weft_mem_get(WEFT_CUDA).alloc_count : 0;
  weft_mesh_destroy(mesh);
  weft_finalize();
  cr_assert_eq(fails, 0, "%s: %d failed checks (seed %lu; see stderr)", name, fails, seed);
  cr_assert(!on_device || device_allocs > 0, "%s: nothing was allocated on the device", name);
}

#define ONE_RANK(name)                                                                  \
  Test(ops_shape, name##_forward_and_grads_match_double_ref, .timeout = 60) {           \
    one_rank(#name, false);                                                             \
  }                                                                                     \
  Test(ops_shape, name##_forward_and_grads_match_double_ref_on_device, .timeout = 60) { \
    one_rank(#name, true);                                                              \
  }

ONE_RANK(matmul)
ONE_RANK(matmul_2d)
ONE_RANK(reshape_split_heads)
ONE_RANK(reshape_split_heads4)
ONE_RANK(reshape_merge_heads)
ONE_RANK(reshape_flatten)
ONE_RANK(reshape_regroup)
ONE_RANK(transpose)
ONE_RANK(transpose_heads)
ONE_RANK(split_qkv)
ONE_RANK(split_uneven)
ONE_RANK(split_dim1)
ONE_RANK(cat_last)
ONE_RANK(cat_dim0)
ONE_RANK(cat_qkv)
ONE_RANK(sum_dim1)
ONE_RANK(sum_keepdim_last)
ONE_RANK(mean_last)
ONE_RANK(mean_dim0_keepdim)
ONE_RANK(linear)
ONE_RANK(linear_bias)
ONE_RANK(add)
ONE_RANK(add_bias)
ONE_RANK(add_pos)
ONE_RANK(mul)
ONE_RANK(scale)

Test(ops_shape, bad_arguments_fail_with_clear_errors, .timeout = 60) {
  int argc = 0;
  char **argv = NULL;
  OK(weft_init(&argc, &argv));
  int shape[1] = {1};
  const char *names[1] = {"tp"};
  weft_mesh *mesh;
  OK(weft_mesh_create(1, shape, names, &mesh));
  int64_t s[3] = {2, 3, 4};
  weft_placement r = weft_replicate();
  weft_dtensor *x;
  OK(weft_dtensor_zeros(mesh, WEFT_F32, 3, s, &r, 1, &x));
  weft_graph *g;
  OK(weft_graph_create(&g));
  weft_var *v, *o = NULL, *outs[3];
  OK(weft_graph_input(g, x, true, &v));
  int64_t bad[2] = {5, 5};
  cr_assert_eq(weft_op_reshape(v, 2, bad, &o), WEFT_ERR_INVALID);
  cr_assert(strstr(weft_last_error(), "reshape") != NULL, "%s", weft_last_error());
  int64_t two[2] = {-1, -1};
  cr_assert_eq(weft_op_reshape(v, 2, two, &o), WEFT_ERR_INVALID);
  cr_assert_eq(weft_op_transpose(v, 0, 3, &o), WEFT_ERR_INVALID);
  int64_t sz[2] = {2, 3};
  cr_assert_eq(weft_op_split(v, 2, 2, sz, outs), WEFT_ERR_INVALID);
  cr_assert(strstr(weft_last_error(), "split") != NULL, "%s", weft_last_error());
  cr_assert_eq(weft_op_sum(v, 3, false, &o), WEFT_ERR_INVALID);
  cr_assert_eq(weft_op_matmul(v, v, &o), WEFT_ERR_INVALID);
  weft_var *two_in[2] = {v, NULL};
  cr_assert_eq(weft_op_cat(two_in, 2, 0, &o), WEFT_ERR_INVALID);
  weft_graph_destroy(g);
  weft_dtensor_destroy(x);
  weft_mesh_destroy(mesh);
  weft_finalize();
}

/* ------------------------------------------------------------- multi-rank */

Test(ops_shape, two_ranks_random_placements_equal_one_rank, .timeout = 240) {
  cr_assert_eq(weft_test_mpiexec(2, OPS_WORKER, "random", 200), 0);
}

Test(ops_shape, four_ranks_random_placements_equal_one_rank, .timeout = 400) {
  cr_assert_eq(weft_test_mpiexec(4, OPS_WORKER, "random", 360), 0);
}

Test(ops_shape, eight_ranks_random_placements_on_8_and_2x4_meshes_equal_one_rank, .timeout = 400) {
  const char *extra[] = {"2", NULL};
  cr_assert_eq(weft_test_mpiexec_args(8, OPS_WORKER, "random", 360, extra), 0);
}

Test(ops_shape, two_ranks_directed_shardings_survive_and_match, .timeout = 120) {
  cr_assert_eq(weft_test_mpiexec(2, OPS_WORKER, "directed", 100), 0);
}

Test(ops_shape, four_ranks_directed_shardings_survive_and_match, .timeout = 120) {
  cr_assert_eq(weft_test_mpiexec(4, OPS_WORKER, "directed", 100), 0);
}

/* ------------------------------------------- the same on the device */

Test(ops_shape, two_ranks_random_placements_equal_one_rank_on_device, .timeout = 240) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  cr_assert_eq(weft_test_mpiexec_on_device(2, OPS_WORKER, "random", 200, NULL), 0);
}

Test(ops_shape, four_ranks_random_placements_equal_one_rank_on_device, .timeout = 400) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  cr_assert_eq(weft_test_mpiexec_on_device(4, OPS_WORKER, "random", 360, NULL), 0);
}

Test(ops_shape, eight_ranks_random_placements_on_8_and_2x4_meshes_equal_one_rank_on_device,
     .timeout = 400) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  const char *extra[] = {"2", NULL};
  cr_assert_eq(weft_test_mpiexec_on_device(8, OPS_WORKER, "random", 360, extra), 0);
}

Test(ops_shape, two_ranks_directed_shardings_survive_and_match_on_device, .timeout = 120) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  cr_assert_eq(weft_test_mpiexec_on_device(2, OPS_WORKER, "directed", 100, NULL), 0);
}

Test(ops_shape, four_ranks_directed_shardings_survive_and_match_on_device, .timeout = 120) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  cr_assert_eq(weft_test_mpiexec_on_device(4, OPS_WORKER, "directed", 100, NULL), 0);
}

/* ------------------------------------------------ reshape as a view (issue 42) */

/* torch's reshape of contiguous data is a view: reshape of an op's output
 * (a graph buffer) shares its storage, and so does a reshape of that view;
 * a reshape of the caller's own input copies (its storage is the caller's
 * and may change before backward). Values and grads are those of the
 * copies, and a second step on the same graph (after reset, buffers
 * reused) gives the same. Backward: each reshape's grad is a view of its
 * output's grad (see the graph below). */
static void reshape_view_case(bool on_device) {
  if (on_device) WEFT_TEST_REQUIRE_CUDA_DEVICE();
  weft_mesh *mesh;
  OK(oc_one_rank_mesh(on_device, &mesh));
  enum { N = 72 };
  uint64_t s = weft_test_rng_state(42);
  weft_tensor *hx, *hr;
  int64_t xs[3] = {3, 4, 6}, ys[2] = {6, 12};
  OK(weft_tensor_create(WEFT_F32, WEFT_CPU, 3, xs, &hx));
  OK(weft_tensor_create(WEFT_F32, WEFT_CPU, 2, ys, &hr));
  for (int i = 0; i < N; i++) {
    ((float *)hx->data)[i] = (float)(weft_test_rng_unit(&s) - 0.5);
    ((float *)hr->data)[i] = (float)(weft_test_rng_unit(&s) - 0.5);
  }
  weft_placement r = weft_replicate();
  weft_dtensor *x, *dr;
  OK(weft_dtensor_distribute(mesh, hx, WEFT_DTENSOR_ALL_RANKS, &r, 1, &x));
  OK(weft_dtensor_distribute(mesh, hr, WEFT_DTENSOR_ALL_RANKS, &r, 1, &dr));
  weft_graph *g;
  OK(weft_graph_create(&g));
  for (int step = 0; step < 2; step++) {
    /* in creation order (backward runs it in reverse):
     *   a = 2x, t = reshape(3x), q = 5a, c = reshape(reshape(a)),
     *   u = c + t, w = u + reshape(q), y = w^2 = (15x)^2.
     * add hands its dy to both inputs and reshape's backward returns a
     * view, so a's first grad shares the storage of t's grad; q's
     * contribution must then be added out of place, or t's grad (read
     * later) changes: dy/dx = 2 * 6 dw + 3 dw = 450 x R, with dw = 2wR */
    weft_var *vx, *a, *t0, *t, *q, *b, *c, *u, *qr, *w, *y, *xr;
    OK(weft_graph_input(g, x, true, &vx));
    OK(weft_op_scale(vx, 2.0, &a));
    OK(weft_op_scale(vx, 3.0, &t0));
    OK(weft_op_reshape(t0, 2, ys, &t));
    OK(weft_op_scale(a, 5.0, &q));
    int64_t bs[2] = {12, 6};
    OK(weft_op_reshape(a, 2, bs, &b));
    OK(weft_op_reshape(b, 2, ys, &c));
    OK(weft_op_reshape(vx, 2, ys, &xr));
    const void *pa = weft_dtensor_local(weft_var_value(a))->data;
    cr_assert_eq(weft_dtensor_local(weft_var_value(b))->data, pa, "reshape of a buffer copied");
    cr_assert_eq(weft_dtensor_local(weft_var_value(c))->data, pa, "reshape of a view copied");
    cr_assert_neq(weft_dtensor_local(weft_var_value(xr))->data, weft_dtensor_local(x)->data,
                  "reshape of the caller's input is a view");
    OK(weft_op_add(c, t, &u));
    OK(weft_op_reshape(q, 2, ys, &qr));
    OK(weft_op_add(u, qr, &w));
    OK(weft_op_mul(w, w, &y));
    OK(weft_backward_grad(y, dr));
    int64_t n;
    double *yv, *gx;
    OK(oc_full_values(weft_var_value(y), &yv, &n));
    OK(oc_full_values(weft_var_grad(vx), &gx, &n));
    cr_assert_eq(n, N);
    for (int i = 0; i < N; i++) {
      const double xi = ((float *)hx->data)[i], ri = ((float *)hr->data)[i];
      cr_assert_float_eq(yv[i], 225 * xi * xi, 1e-4, "step %d: y[%d]", step, i);
      cr_assert_float_eq(gx[i], 450 * xi * ri, 1e-4, "step %d: grad x[%d]", step, i);
    }
    free(yv);
    free(gx);
    OK(weft_graph_reset(g));
  }
  weft_graph_destroy(g);
  weft_dtensor_destroy(x);
  weft_dtensor_destroy(dr);
  weft_tensor_destroy(hx);
  weft_tensor_destroy(hr);
  weft_mesh_destroy(mesh);
  weft_finalize();
}
Test(ops_shape, reshape_of_a_graph_buffer_is_a_view_and_of_an_input_a_copy) {
  reshape_view_case(false);
}
Test(ops_shape, reshape_of_a_graph_buffer_is_a_view_and_of_an_input_a_copy_on_device) {
  reshape_view_case(true);
}

/* ------------------------------------- split pieces as views (issue 42) */

/* A Replicate f32 DTensor on mesh of `shape` with values uniform in
 * [-0.5, 0.5) from the rng state s. */
static weft_dtensor *replicated_uniform(weft_mesh *mesh, int ndim, const int64_t *shape,
                                        uint64_t *s) {
  weft_tensor *h;
  OK(weft_tensor_create(WEFT_F32, WEFT_CPU, ndim, shape, &h));
  const int64_t n = weft_tensor_numel(h);
  for (int64_t i = 0; i < n; i++) ((float *)h->data)[i] = (float)(weft_test_rng_unit(s) - 0.5);
  weft_placement r = weft_replicate();
  weft_dtensor *d;
  OK(weft_dtensor_distribute(mesh, h, WEFT_DTENSOR_ALL_RANKS, &r, 1, &d));
  weft_tensor_destroy(h);
  return d;
}

/* The fused q|k|v projection of GPT-2: p = 1.5 x (an op's output, B=2,
 * T=5, 3 x 8), q, k, v = split(p), each reshaped to (B, T, 2 heads, 4),
 * y = sdpa(q, k, v), backward with a random dy. Mode 0 reads them in
 * place: the pieces and their head views share p's storage, attention
 * takes them strided and writes dq, dk, dv into one buffer that split's
 * backward hands on whole: no copy forward or backward. Mode 1 first
 * scales each head view by 1 (an op without strided kernels: one copy
 * each), mode 2 only v (q and k are still read in place, but their grads
 * no longer share one buffer, so split's backward copies). Every mode
 * gives mode 0's output and input grad bit for bit, on a second step of
 * the same graph too. */
static void split_view_case(bool on_device) {
  if (on_device) WEFT_TEST_REQUIRE_CUDA_DEVICE();
  weft_mesh *mesh;
  OK(oc_one_rank_mesh(on_device, &mesh));
  enum { B = 2, T = 5, H = 2, HD = 4, C = H * HD, N = B * T * 3 * C, NY = B * T * C };
  uint64_t s = weft_test_rng_state(43);
  int64_t xs[3] = {B, T, 3 * C}, ys[4] = {B, T, H, HD};
  weft_dtensor *x = replicated_uniform(mesh, 3, xs, &s), *dr = replicated_uniform(mesh, 4, ys, &s);
  weft_graph *g;
  OK(weft_graph_create(&g));
  double *want_y = NULL, *want_g = NULL;
  const int64_t want_copies[3] = {0, 3 + 3, 1 + 3};
  for (int run = 0; run < 6; run++) {
    const int mode = run % 3;
    const weft_op_stats before = weft_op_stats_get();
    weft_var *vx, *p, *pieces[3], *heads[3], *y;
    OK(weft_graph_input(g, x, true, &vx));
    OK(weft_op_scale(vx, 1.5, &p));
    const int64_t sizes[3] = {C, C, C};
    OK(weft_op_split(p, 2, 3, sizes, pieces));
    const char *p0 = weft_dtensor_local(weft_var_value(p))->data;
    for (int j = 0; j < 3; j++) {
      OK(weft_op_reshape(pieces[j], 4, ys, &heads[j]));
      const weft_tensor *l = weft_dtensor_local(weft_var_value(heads[j]));
      cr_assert_eq((const char *)l->data, p0 + (size_t)j * C * sizeof(float),
                   "piece %d is not a view of the projection", j);
      cr_assert(l->strides[1] == 3 * C && l->strides[2] == HD && l->strides[3] == 1);
      if (mode == 1 || (mode == 2 && j == 2)) OK(weft_op_scale(heads[j], 1.0, &heads[j]));
    }
    OK(weft_op_sdpa(heads[0], heads[1], heads[2], true, &y));
    OK(weft_backward_grad(y, dr));
    const weft_op_stats after = weft_op_stats_get();
    cr_expect_eq(after.copies - before.copies, want_copies[mode], "mode %d: %lld copies, want %lld",
                 mode, (long long)(after.copies - before.copies), (long long)want_copies[mode]);
    int64_t n;
    double *yv, *gx;
    OK(oc_full_values(weft_var_value(y), &yv, &n));
    cr_assert_eq(n, NY);
    OK(oc_full_values(weft_var_grad(vx), &gx, &n));
    cr_assert_eq(n, N);
    if (!want_y) {
      want_y = yv, want_g = gx;
      double norm = 0;
      for (int i = 0; i < N; i++) norm += gx[i] * gx[i];
      cr_assert(norm > 0, "the input grad is all zeros");
    } else {
      cr_assert_eq(memcmp(yv, want_y, sizeof(double) * NY), 0, "run %d: output differs", run);
      cr_assert_eq(memcmp(gx, want_g, sizeof(double) * N), 0, "run %d: input grad differs", run);
      free(yv);
      free(gx);
    }
    OK(weft_graph_reset(g));
  }
  free(want_y);
  free(want_g);
  weft_graph_destroy(g);
  weft_dtensor_destroy(x);
  weft_dtensor_destroy(dr);
  weft_mesh_destroy(mesh);
  weft_finalize();
}
/* Self-attention on one view: y = sdpa(q, q, q) with q a reshape (a view)
 * of an op's output. Its three grads must not share storage (they are
 * summed into q's): the output and input grad equal those of the same
 * graph with q first scaled by 1 (an ordinary buffer), bit for bit. */
static void self_attention_view_case(bool on_device) {
  if (on_device) WEFT_TEST_REQUIRE_CUDA_DEVICE();
  weft_mesh *mesh;
  OK(oc_one_rank_mesh(on_device, &mesh));
  enum { B = 2, T = 6, H = 2, HD = 4, N = B * T * H * HD };
  uint64_t s = weft_test_rng_state(44);
  int64_t xs[3] = {B, T, H * HD}, ys[4] = {B, T, H, HD};
  weft_dtensor *x = replicated_uniform(mesh, 3, xs, &s), *dr = replicated_uniform(mesh, 4, ys, &s);
  weft_graph *g;
  OK(weft_graph_create(&g));
  double *vals[2][2];
  for (int mode = 0; mode < 2; mode++) {
    weft_var *vx, *p, *q, *y;
    OK(weft_graph_input(g, x, true, &vx));
    OK(weft_op_scale(vx, 1.5, &p));
    OK(weft_op_reshape(p, 4, ys, &q));
    if (mode == 1) OK(weft_op_scale(q, 1.0, &q));
    OK(weft_op_sdpa(q, q, q, false, &y));
    OK(weft_backward_grad(y, dr));
    int64_t n;
    OK(oc_full_values(weft_var_value(y), &vals[mode][0], &n));
    OK(oc_full_values(weft_var_grad(vx), &vals[mode][1], &n));
    cr_assert_eq(n, N);
    OK(weft_graph_reset(g));
  }
  cr_assert_eq(memcmp(vals[0][0], vals[1][0], sizeof(double) * N), 0, "output differs");
  cr_assert_eq(memcmp(vals[0][1], vals[1][1], sizeof(double) * N), 0, "input grad differs");
  for (int m = 0; m < 2; m++) free(vals[m][0]), free(vals[m][1]);
  weft_graph_destroy(g);
  weft_dtensor_destroy(x);
  weft_dtensor_destroy(dr);
  weft_mesh_destroy(mesh);
  weft_finalize();
}
Test(ops_shape, self_attention_on_one_view_sums_three_separate_grads) {
  self_attention_view_case(false);
}
Test(ops_shape, self_attention_on_one_view_sums_three_separate_grads_on_device) {
  self_attention_view_case(true);
}
Test(ops_shape, split_pieces_are_views_that_attention_reads_in_place) { split_view_case(false); }
Test(ops_shape, split_pieces_are_views_that_attention_reads_in_place_on_device) {
  split_view_case(true);
}

/* linear on strided inputs: the three pieces of p = split(1.5 x) (rows
 * 3C apart) and t = transpose(0.5 a) (a transposed view) feed linear
 * without a copy: its GEMM reads them through their leading dim and
 * transpose flag, forward and backward. y = sum_j linear(piece_j, W_j,
 * b_j) + linear(t, W3); the output and the grads of x, a, W_j, b_j and W3
 * against float64. Copies: only split's backward (the pieces' grads are
 * separate buffers), 3 (6 when linear copied its strided inputs, plus
 * one for t). */
static void linear_strided_case(bool on_device) {
  if (on_device) WEFT_TEST_REQUIRE_CUDA_DEVICE();
  weft_mesh *mesh;
  OK(oc_one_rank_mesh(on_device, &mesh));
  enum { R = 6, C = 5, N = 7 };
  uint64_t s = weft_test_rng_state(44);
  const int64_t xs[2] = {R, 3 * C}, as[2] = {C, R}, ws[2] = {N, C}, bs[1] = {N}, ys[2] = {R, N};
  weft_dtensor *dx = replicated_uniform(mesh, 2, xs, &s), *da = replicated_uniform(mesh, 2, as, &s);
  weft_dtensor *dw[4], *db[3], *dr = replicated_uniform(mesh, 2, ys, &s);
  for (int j = 0; j < 4; j++) dw[j] = replicated_uniform(mesh, 2, ws, &s);
  for (int j = 0; j < 3; j++) db[j] = replicated_uniform(mesh, 1, bs, &s);
  weft_graph *g;
  OK(weft_graph_create(&g));
  weft_var *vx, *va, *vw[4], *vb[3], *p, *pieces[3], *t, *y = NULL;
  OK(weft_graph_input(g, dx, true, &vx));
  OK(weft_graph_input(g, da, true, &va));
  for (int j = 0; j < 4; j++) OK(weft_graph_input(g, dw[j], true, &vw[j]));
  for (int j = 0; j < 3; j++) OK(weft_graph_input(g, db[j], true, &vb[j]));
  const weft_op_stats before = weft_op_stats_get();
  OK(weft_op_scale(vx, 1.5, &p));
  const int64_t sizes[3] = {C, C, C};
  OK(weft_op_split(p, 1, 3, sizes, pieces));
  OK(weft_op_scale(va, 0.5, &t));
  OK(weft_op_transpose(t, 0, 1, &t));
  cr_assert(!weft_tensor_is_contiguous(weft_dtensor_local(weft_var_value(t))));
  for (int j = 0; j < 4; j++) {
    weft_var *yj;
    OK(weft_op_linear(j < 3 ? pieces[j] : t, vw[j], j < 3 ? vb[j] : NULL, &yj));
    if (y)
      OK(weft_op_add(y, yj, &y));
    else
      y = yj;
  }
  OK(weft_backward_grad(y, dr));
  const weft_op_stats after = weft_op_stats_get();
  cr_expect_eq(after.copies - before.copies, 3, "%lld copies, want 3 (split's backward)",
               (long long)(after.copies - before.copies));
  int64_t n;
  double *hx, *ha, *hr, *hw[4], *hb[3];
  OK(oc_full_values(dx, &hx, &n));
  OK(oc_full_values(da, &ha, &n));
  OK(oc_full_values(dr, &hr, &n));
  for (int j = 0; j < 4; j++) OK(oc_full_values(dw[j], &hw[j], &n));
  for (int j = 0; j < 3; j++) OK(oc_full_values(db[j], &hb[j], &n));
  /* in[j][r][c]: linear j's input */
  double in[4][R][C], want_y[R][N] = {{0}}, gin[4][R][C] = {{{0}}}, gw[4][N][C] = {{{0}}},
                      gb[3][N] = {{0}};
  for (int r = 0; r < R; r++)
    for (int c = 0; c < C; c++) {
      for (int j = 0; j < 3; j++) in[j][r][c] = 1.5 * hx[r * 3 * C + j * C + c];
      in[3][r][c] = 0.5 * ha[c * R + r];
    }
  for (int j = 0; j < 4; j++)
    for (int r = 0; r < R; r++)
      for (int o = 0; o < N; o++) {
        double acc = j < 3 ? hb[j][o] : 0;
        for (int c = 0; c < C; c++) {
          acc += in[j][r][c] * hw[j][o * C + c];
          gin[j][r][c] += hr[r * N + o] * hw[j][o * C + c];
          gw[j][o][c] += hr[r * N + o] * in[j][r][c];
        }
        want_y[r][o] += acc;
        if (j < 3) gb[j][o] += hr[r * N + o];
      }
  double *got;
  OK(oc_full_values(weft_var_value(y), &got, &n));
  for (int i = 0; i < R * N; i++)
    cr_assert_float_eq(got[i], want_y[i / N][i % N], 1e-5, "y[%d]", i);
  free(got);
  OK(oc_full_values(weft_var_grad(vx), &got, &n));
  for (int r = 0; r < R; r++)
    for (int j = 0; j < 3; j++)
      for (int c = 0; c < C; c++)
        cr_assert_float_eq(got[r * 3 * C + j * C + c], 1.5 * gin[j][r][c], 1e-5, "dx[%d][%d]", r,
                           j * C + c);
  free(got);
  OK(oc_full_values(weft_var_grad(va), &got, &n));
  for (int c = 0; c < C; c++)
    for (int r = 0; r < R; r++)
      cr_assert_float_eq(got[c * R + r], 0.5 * gin[3][r][c], 1e-5, "da[%d][%d]", c, r);
  free(got);
  for (int j = 0; j < 4; j++) {
    OK(oc_full_values(weft_var_grad(vw[j]), &got, &n));
    for (int i = 0; i < N * C; i++)
      cr_assert_float_eq(got[i], gw[j][i / C][i % C], 1e-5, "dW%d[%d]", j, i);
    free(got);
  }
  for (int j = 0; j < 3; j++) {
    OK(oc_full_values(weft_var_grad(vb[j]), &got, &n));
    for (int i = 0; i < N; i++) cr_assert_float_eq(got[i], gb[j][i], 1e-5, "db%d[%d]", j, i);
    free(got);
  }
  free(hx);
  free(ha);
  free(hr);
  for (int j = 0; j < 4; j++) {
    free(hw[j]);
    weft_dtensor_destroy(dw[j]);
  }
  for (int j = 0; j < 3; j++) {
    free(hb[j]);
    weft_dtensor_destroy(db[j]);
  }
  weft_graph_destroy(g);
  weft_dtensor_destroy(dx);
  weft_dtensor_destroy(da);
  weft_dtensor_destroy(dr);
  weft_mesh_destroy(mesh);
  weft_finalize();
}
Test(ops_shape, linear_reads_split_pieces_and_transposes_in_place) { linear_strided_case(false); }
Test(ops_shape, linear_reads_split_pieces_and_transposes_in_place_on_device) {
  linear_strided_case(true);
}

/* ------------------------------------------- transpose as a view (issue 42) */

/* A Replicate f32 DTensor on mesh with non-zero values in +-[0.5, 1.5)
 * from the rng state s; *host (when non-NULL) gets them as doubles. */
static weft_dtensor *replicated_nonzero(weft_mesh *mesh, int ndim, const int64_t *shape,
                                        uint64_t *s, double **host) {
  weft_tensor *h;
  OK(weft_tensor_create(WEFT_F32, WEFT_CPU, ndim, shape, &h));
  const int64_t n = weft_tensor_numel(h);
  if (host) *host = malloc(sizeof(double) * (size_t)n);
  for (int64_t i = 0; i < n; i++) {
    double v = 0.5 + weft_test_rng_unit(s);
    if (weft_test_rng_u64(s) & 1) v = -v;
    ((float *)h->data)[i] = (float)v;
    if (host) (*host)[i] = (double)(float)v;
  }
  weft_placement r = weft_replicate();
  weft_dtensor *d;
  OK(weft_dtensor_distribute(mesh, h, WEFT_DTENSOR_ALL_RANKS, &r, 1, &d));
  weft_tensor_destroy(h);
  return d;
}

static double gelu_ref(double x) { return 0.5 * x * (1.0 + erf(x / sqrt(2.0))); }
static double gelu_grad_ref(double x) {
  return 0.5 * (1.0 + erf(x / sqrt(2.0))) + x * exp(-0.5 * x * x) / sqrt(2.0 * M_PI);
}

static const void *data_of(const weft_var *v) {
  return weft_dtensor_local(weft_var_value(v))->data;
}
static int64_t copies_now(void) { return weft_op_stats_get().copies; }

/* torch's transpose is a view: of an op's output (a graph buffer) and of a
 * view of one it shares the storage with swapped strides, no copy; of the
 * caller's input it copies. A reshape of a transposed view is a view where
 * the strides allow one and one copy where not. Values and the input's
 * grad against float64, on two steps of one graph:
 *   h = gelu(x) (4, 6), t = h^T, tt = t^T, xt = x^T,
 *   y = reshape(reshape(t, (3, 2, 4))) + reshape(reshape(t, (24)))
 *       + xt * tt^T = (2h + x h)^T,
 * backward from R (6, 4): with S = R^T, dx = S h + gelu'(x) S (2 + x).
 * h's only consumer is t, so h's grad is a transposed view of t's: gelu's
 * backward, which reads its grad packed, gets it through run_node's
 * packed copy. */
static void transpose_view_case(bool on_device) {
  if (on_device) WEFT_TEST_REQUIRE_CUDA_DEVICE();
  weft_mesh *mesh;
  OK(oc_one_rank_mesh(on_device, &mesh));
  enum { M = 4, N = 6 };
  uint64_t s = weft_test_rng_state(45);
  int64_t xs[2] = {M, N}, ts[2] = {N, M};
  double *hx, *hr;
  weft_dtensor *x = replicated_nonzero(mesh, 2, xs, &s, &hx);
  weft_dtensor *dr = replicated_nonzero(mesh, 2, ts, &s, &hr);
  weft_graph *g;
  OK(weft_graph_create(&g));
  for (int step = 0; step < 2; step++) {
    weft_var *vx, *h, *t, *tt, *xt, *r1, *r2, *a1, *b2, *sum, *ttt, *m, *y;
    OK(weft_graph_input(g, x, true, &vx));
    OK(weft_op_gelu(vx, false, &h));
    int64_t c0 = copies_now();
    OK(weft_op_transpose(h, 0, 1, &t));
    cr_assert_eq(data_of(t), data_of(h), "transpose of a buffer copied");
    cr_assert_eq(copies_now(), c0, "transpose of a buffer counted a copy");
    const weft_tensor *tl = weft_dtensor_local(weft_var_value(t));
    cr_assert(tl->shape[0] == N && tl->shape[1] == M && tl->strides[0] == 1 && tl->strides[1] == N);
    OK(weft_op_transpose(t, 1, 0, &tt));
    cr_assert_eq(data_of(tt), data_of(h), "transpose of a view copied");
    cr_assert(weft_tensor_is_contiguous(weft_dtensor_local(weft_var_value(tt))));
    cr_assert_eq(copies_now(), c0);
    OK(weft_op_transpose(vx, -1, 0, &xt));
    cr_assert_neq(data_of(xt), weft_dtensor_local(x)->data, "transpose of the input is a view");
    cr_assert_eq(copies_now(), c0 + 1, "transpose of the input: one copy");
    c0 = copies_now();
    OK(weft_op_reshape(t, 3, (const int64_t[]){3, 2, M}, &r1));
    cr_assert_eq(data_of(r1), data_of(h), "a reshape a view can give copied");
    cr_assert_eq(copies_now(), c0);
    OK(weft_op_reshape(t, 1, (const int64_t[]){N * M}, &r2));
    cr_assert_eq(copies_now(), c0 + 1, "a reshape no view can give: one copy");
    OK(weft_op_reshape(r1, 2, ts, &a1));
    OK(weft_op_reshape(r2, 2, ts, &b2));
    cr_assert_eq(copies_now(), c0 + 1);
    OK(weft_op_add(a1, b2, &sum));
    OK(weft_op_transpose(tt, 0, 1, &ttt));
    OK(weft_op_mul(xt, ttt, &m));
    OK(weft_op_add(sum, m, &y));
    OK(weft_backward_grad(y, dr));
    int64_t n;
    double *yv, *gx;
    OK(oc_full_values(weft_var_value(y), &yv, &n));
    cr_assert_eq(n, M * N);
    OK(oc_full_values(weft_var_grad(vx), &gx, &n));
    cr_assert_eq(n, M * N);
    for (int i = 0; i < M; i++)
      for (int j = 0; j < N; j++) {
        const double xv = hx[i * N + j], hv = gelu_ref(xv), sv = hr[j * M + i];
        cr_assert_float_eq(yv[j * M + i], 2 * hv + xv * hv, 1e-5, "step %d: y[%d][%d]", step, j, i);
        const double want = sv * hv + gelu_grad_ref(xv) * sv * (2 + xv);
        cr_assert_float_eq(gx[i * N + j], want, 1e-5 * (1 + fabs(want)),
                           "step %d: grad x[%d][%d]: %.9g, want %.9g", step, i, j, gx[i * N + j],
                           want);
      }
    free(yv);
    free(gx);
    OK(weft_graph_reset(g));
  }
  weft_graph_destroy(g);
  weft_dtensor_destroy(x);
  weft_dtensor_destroy(dr);
  free(hx);
  free(hr);
  weft_mesh_destroy(mesh);
  weft_finalize();
}
Test(ops_shape, transpose_of_a_graph_buffer_is_a_view_and_of_an_input_a_copy) {
  transpose_view_case(false);
}
Test(ops_shape, transpose_of_a_graph_buffer_is_a_view_and_of_an_input_a_copy_on_device) {
  transpose_view_case(true);
}

/* The smallest graph where a strided grad meets a backward that reads its
 * grad packed: y = gelu(x)^T, backward from R. transpose's backward hands
 * gelu a transposed view of R's buffer; run_node packs it, so
 * dx = gelu'(x) R^T (read as packed, the view would give R's elements in
 * the wrong order). */
static void transposed_grad_packed_case(bool on_device) {
  if (on_device) WEFT_TEST_REQUIRE_CUDA_DEVICE();
  weft_mesh *mesh;
  OK(oc_one_rank_mesh(on_device, &mesh));
  enum { M = 3, N = 5 };
  uint64_t s = weft_test_rng_state(46);
  int64_t xs[2] = {M, N}, ts[2] = {N, M};
  double *hx, *hr;
  weft_dtensor *x = replicated_nonzero(mesh, 2, xs, &s, &hx);
  weft_dtensor *dr = replicated_nonzero(mesh, 2, ts, &s, &hr);
  weft_graph *g;
  OK(weft_graph_create(&g));
  weft_var *vx, *h, *y;
  OK(weft_graph_input(g, x, true, &vx));
  OK(weft_op_gelu(vx, false, &h));
  OK(weft_op_transpose(h, 0, 1, &y));
  OK(weft_backward_grad(y, dr));
  int64_t n;
  double *gx;
  OK(oc_full_values(weft_var_grad(vx), &gx, &n));
  cr_assert_eq(n, M * N);
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) {
      const double want = gelu_grad_ref(hx[i * N + j]) * hr[j * M + i];
      cr_assert_float_eq(gx[i * N + j], want, 1e-5 * (1 + fabs(want)), "grad x[%d][%d]", i, j);
    }
  free(gx);
  weft_graph_destroy(g);
  weft_dtensor_destroy(x);
  weft_dtensor_destroy(dr);
  free(hx);
  free(hr);
  weft_mesh_destroy(mesh);
  weft_finalize();
}
Test(ops_shape, a_transposed_grad_reaches_a_packed_backward_packed) {
  transposed_grad_packed_case(false);
}
Test(ops_shape, a_transposed_grad_reaches_a_packed_backward_packed_on_device) {
  transposed_grad_packed_case(true);
}

/* ---------------------------- matmul reads transposed views (issue 42) */

static void expect_close(const double *got, const double *want, int64_t n, const char *what,
                         int mode) {
  for (int64_t i = 0; i < n; i++)
    cr_assert_float_eq(got[i], want[i], 1e-5 * (1 + fabs(want[i])),
                       "mode %d: %s[%lld]: %.9g, want %.9g", mode, what, (long long)i, got[i],
                       want[i]);
}

/* matmul on transposed views of graph buffers, against float64, counting
 * the copies from the views' making through backward:
 *   mode 0: y = matmul(1.5 x, (0.5 w)^T), x (2, 3, 4), w (5, 4) (linear's
 *           layout): b is read with the GEMM's transpose flag, no copy;
 *   mode 1: y = matmul((1.5 a)^T, 0.5 b)^T, a (4, 3), b (4, 5): a is read
 *           transposed, and so is y's grad (a transposed view) in
 *           matmul's backward, no copy;
 *   mode 2: y = matmul((1.5 x)^T(1, 2), 0.5 b), x (2, 4, 3): the view's
 *           rows (2 x 3) are no single stride apart, so it is copied
 *           once.
 * Backward from R; each input's grad flows back through transpose's view
 * and scale's backward (which reads it strided). */
static void matmul_transposed_case(bool on_device, int mode) {
  if (on_device) WEFT_TEST_REQUIRE_CUDA_DEVICE();
  weft_mesh *mesh;
  OK(oc_one_rank_mesh(on_device, &mesh));
  uint64_t s = weft_test_rng_state(47 + (uint64_t)mode);
  enum { BT = 2, T = 3, K = 4, N = 5, M = 3 };
  /* shapes: input 0, input 1, R */
  static const int64_t shp[3][3][3] = {
      {{BT, T, K}, {N, K}, {BT, T, N}}, {{K, M}, {K, N}, {N, M}}, {{BT, K, T}, {K, N}, {BT, T, N}}};
  static const int nds[3][3] = {{3, 2, 3}, {2, 2, 2}, {3, 2, 3}};
  const int64_t want_copies[3] = {0, 0, 1};
  double *h0, *h1, *hr;
  weft_dtensor *d0 = replicated_nonzero(mesh, nds[mode][0], shp[mode][0], &s, &h0);
  weft_dtensor *d1 = replicated_nonzero(mesh, nds[mode][1], shp[mode][1], &s, &h1);
  weft_dtensor *dr = replicated_nonzero(mesh, nds[mode][2], shp[mode][2], &s, &hr);
  const int64_t n0 = oc_numel(nds[mode][0], shp[mode][0]),
                n1 = oc_numel(nds[mode][1], shp[mode][1]),
                ny = oc_numel(nds[mode][2], shp[mode][2]);
  double *wy = calloc((size_t)ny, sizeof(double)), *w0 = calloc((size_t)n0, sizeof(double)),
         *w1 = calloc((size_t)n1, sizeof(double));
  /* the float64 reference: p = 1.5 * input 0, q = 0.5 * input 1 */
  if (mode == 0) {
    for (int r = 0; r < BT * T; r++)
      for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++) {
          const double p = 1.5 * h0[r * K + k], q = 0.5 * h1[n * K + k], R = hr[r * N + n];
          wy[r * N + n] += p * q;
          w0[r * K + k] += 1.5 * R * q;
          w1[n * K + k] += 0.5 * R * p;
        }
  } else if (mode == 1) {
    for (int i = 0; i < M; i++)
      for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++) {
          const double p = 1.5 * h0[k * M + i], q = 0.5 * h1[k * N + n], R = hr[n * M + i];
          wy[n * M + i] += p * q;
          w0[k * M + i] += 1.5 * R * q;
          w1[k * N + n] += 0.5 * R * p;
        }
  } else {
    for (int b = 0; b < BT; b++)
      for (int t = 0; t < T; t++)
        for (int n = 0; n < N; n++)
          for (int k = 0; k < K; k++) {
            const int64_t xi = (b * K + k) * T + t, ri = (b * T + t) * N + n;
            const double p = 1.5 * h0[xi], q = 0.5 * h1[k * N + n], R = hr[ri];
            wy[ri] += p * q;
            w0[xi] += 1.5 * R * q;
            w1[k * N + n] += 0.5 * R * p;
          }
  }
  weft_graph *g;
  OK(weft_graph_create(&g));
  for (int step = 0; step < 2; step++) {
    weft_var *v0, *v1, *p, *q, *y;
    OK(weft_graph_input(g, d0, true, &v0));
    OK(weft_graph_input(g, d1, true, &v1));
    OK(weft_op_scale(v0, 1.5, &p));
    OK(weft_op_scale(v1, 0.5, &q));
    const int64_t c0 = copies_now();
    if (mode == 0) {
      OK(weft_op_transpose(q, 0, 1, &q));
      OK(weft_op_matmul(p, q, &y));
    } else if (mode == 1) {
      OK(weft_op_transpose(p, 0, 1, &p));
      OK(weft_op_matmul(p, q, &y));
      OK(weft_op_transpose(y, 0, 1, &y));
    } else {
      OK(weft_op_transpose(p, 1, 2, &p));
      OK(weft_op_matmul(p, q, &y));
    }
    OK(weft_backward_grad(y, dr));
    cr_assert_eq(copies_now() - c0, want_copies[mode], "mode %d: %lld copies, want %lld", mode,
                 (long long)(copies_now() - c0), (long long)want_copies[mode]);
    int64_t n;
    double *got;
    OK(oc_full_values(weft_var_value(y), &got, &n));
    cr_assert_eq(n, ny);
    expect_close(got, wy, ny, "y", mode);
    free(got);
    OK(oc_full_values(weft_var_grad(v0), &got, &n));
    cr_assert_eq(n, n0);
    expect_close(got, w0, n0, "grad 0", mode);
    free(got);
    OK(oc_full_values(weft_var_grad(v1), &got, &n));
    cr_assert_eq(n, n1);
    expect_close(got, w1, n1, "grad 1", mode);
    free(got);
    OK(weft_graph_reset(g));
  }
  weft_graph_destroy(g);
  weft_dtensor_destroy(d0);
  weft_dtensor_destroy(d1);
  weft_dtensor_destroy(dr);
  free(h0), free(h1), free(hr), free(wy), free(w0), free(w1);
  weft_mesh_destroy(mesh);
  weft_finalize();
}
Test(ops_shape, matmul_of_a_transposed_weight_uses_the_gemm_flag_without_a_copy) {
  matmul_transposed_case(false, 0);
}
Test(ops_shape, matmul_of_a_transposed_weight_uses_the_gemm_flag_without_a_copy_on_device) {
  matmul_transposed_case(true, 0);
}
Test(ops_shape, matmul_of_a_transposed_input_and_grad_uses_the_gemm_flags_without_a_copy) {
  matmul_transposed_case(false, 1);
}
Test(ops_shape,
     matmul_of_a_transposed_input_and_grad_uses_the_gemm_flags_without_a_copy_on_device) {
  matmul_transposed_case(true, 1);
}
Test(ops_shape, matmul_of_a_view_no_gemm_reads_copies_it_once) { matmul_transposed_case(false, 2); }
Test(ops_shape, matmul_of_a_view_no_gemm_reads_copies_it_once_on_device) {
  matmul_transposed_case(true, 2);
}
