/* tests/nn/test_ops_errors.c — bad input of the op layer (autograd.h):
 * shapes an op cannot take, a parameter registered twice, backward twice,
 * a tied weight's one layout for both users, and WEFT_DEBUG's check that
 * every rank runs the same ops. The cases need a mesh of 2 ranks, so they
 * run in ops_errors_worker under mpiexec (see tests/harness/harness.h).
 * The *_on_device variants run the same worker cases with every mesh on
 * WEFT_CUDA (the worker's device mode, WEFT_TEST_DEVICE=cuda) and the same
 * tolerances; they skip, saying why, where this process sees no CUDA
 * device. */
#include <criterion/criterion.h>

#include "backend.h"
#include "harness.h"

#define ERR_WORKER WORKER("ops_errors_worker")

Test(nn_ops_errors, bad_shapes_name_op_shapes_placements_alike_on_every_rank, .timeout = 60) {
  cr_assert_eq(weft_test_mpiexec(2, ERR_WORKER, "shapes", 50), 0);
}

Test(nn_ops_errors, parameter_registered_twice_or_over_an_alias_is_refused, .timeout = 60) {
  cr_assert_eq(weft_test_mpiexec(2, ERR_WORKER, "params", 50), 0);
}

Test(nn_ops_errors, backward_twice_and_op_after_backward_are_state_errors, .timeout = 60) {
  cr_assert_eq(weft_test_mpiexec(2, ERR_WORKER, "backward", 50), 0);
}

Test(nn_ops_errors, tied_weight_has_one_layout_and_sums_both_grads_sharded, .timeout = 60) {
  cr_assert_eq(weft_test_mpiexec(2, ERR_WORKER, "tied", 50), 0);
}

/* Issue 34 finding 3: a tensor-parallel linear on the tp sub-mesh took a
 * DTensor of the dp sub-mesh (same shape, other ranks) and returned wrong
 * numbers with status OK. Needs a 2x2 mesh. */
Test(nn_ops_errors, inputs_on_sub_meshes_of_one_shape_but_other_ranks_are_refused, .timeout = 60) {
  cr_assert_eq(weft_test_mpiexec(4, ERR_WORKER, "meshes", 50), 0);
}

/* WEFT_TIMEOUT bounds a wait if the check itself failed to meet. */
Test(nn_ops_errors, weft_debug_names_ranks_and_ops_that_diverge_instead_of_hanging, .timeout = 90) {
  const char *env[] = {"WEFT_DEBUG=1", "WEFT_TIMEOUT=30", NULL};
  cr_assert_eq(weft_test_mpiexec_env(2, ERR_WORKER, "debug", 80, env), 0);
}

/* ------------------------------------------- the same on the device */

#define RUN_ON_DEVICE(c) weft_test_mpiexec_on_device(2, ERR_WORKER, (c), 50, NULL)

Test(nn_ops_errors, bad_shapes_name_op_shapes_placements_alike_on_every_rank_on_device,
     .timeout = 60) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  cr_assert_eq(RUN_ON_DEVICE("shapes"), 0);
}

Test(nn_ops_errors, parameter_registered_twice_or_over_an_alias_is_refused_on_device,
     .timeout = 60) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  cr_assert_eq(RUN_ON_DEVICE("params"), 0);
}

Test(nn_ops_errors, backward_twice_and_op_after_backward_are_state_errors_on_device,
     .timeout = 60) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  cr_assert_eq(RUN_ON_DEVICE("backward"), 0);
}

Test(nn_ops_errors, tied_weight_has_one_layout_and_sums_both_grads_sharded_on_device,
     .timeout = 60) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  cr_assert_eq(RUN_ON_DEVICE("tied"), 0);
}

/* weft_test_mpiexec_on_device takes no environment: the device mode's
 * WEFT_TEST_DEVICE=cuda is passed with WEFT_DEBUG's. */
Test(nn_ops_errors, weft_debug_names_ranks_and_ops_that_diverge_instead_of_hanging_on_device,
     .timeout = 90) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  const char *env[] = {"WEFT_DEBUG=1", "WEFT_TIMEOUT=30", "WEFT_TEST_DEVICE=cuda", NULL};
  cr_assert_eq(weft_test_mpiexec_env(2, ERR_WORKER, "debug", 80, env), 0);
}
