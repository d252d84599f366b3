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
  int argc = 0;
  char **argv = NULL;
  OK(weft_init(&argc, &argv));
  int shape[1] = {1};
  const char *names[1] = {"tp"};
  weft_mesh *mesh;
  OK(weft_mesh_create(1, shape, names, &mesh));
  if (on_device) OK(weft_mesh_set_device(mesh, WEFT_CUDA));
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
