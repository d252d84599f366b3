/* tests/nn/test_ops_custom.c — user-defined ops (weft_op_custom,
 * autograd.h): ops written here with local forward / backward and a
 * sharding rule (tests/nn/ops_custom_worker.c) against double references
 * and central finite differences on 1 rank, random placements on 2 and 4
 * ranks (and a 2x2 mesh) equal to the 1-rank results, shardings the rules
 * keep, bad input with errors naming the op, and repeated steps. The cases
 * need a mesh, so they run in ops_custom_worker under mpiexec (see
 * tests/harness/harness.h).
 * The *_on_device variants run the same worker cases with every mesh on
 * WEFT_CUDA (the worker's device mode, WEFT_TEST_DEVICE=cuda) and the same
 * tolerances; they skip, saying why, where this process sees no CUDA
 * device. */
#include <criterion/criterion.h>

#include "backend.h"
#include "harness.h"

#define OPS_WORKER WORKER("ops_custom_worker")

Test(nn_ops_custom, one_rank_forward_and_grads_match_double_reference_and_finite_differences,
     .timeout = 120) {
  cr_assert_eq(weft_test_mpiexec(1, OPS_WORKER, "one", 100), 0);
}

Test(nn_ops_custom, two_ranks_random_placements_equal_one_rank, .timeout = 240) {
  const char *extra[] = {"6", NULL};
  cr_assert_eq(weft_test_mpiexec_args(2, OPS_WORKER, "random", 200, extra), 0);
}

Test(nn_ops_custom, four_ranks_random_placements_on_1d_and_2x2_meshes_equal_one_rank,
     .timeout = 400) {
  const char *extra[] = {"4", NULL};
  cr_assert_eq(weft_test_mpiexec_args(4, OPS_WORKER, "random", 360, extra), 0);
}

Test(nn_ops_custom, eight_ranks_random_placements_on_8_and_2x4_meshes_equal_one_rank,
     .timeout = 400) {
  const char *extra[] = {"2", NULL};
  cr_assert_eq(weft_test_mpiexec_args(8, OPS_WORKER, "random", 360, extra), 0);
}

Test(nn_ops_custom, two_ranks_directed_shardings_are_kept, .timeout = 120) {
  cr_assert_eq(weft_test_mpiexec(2, OPS_WORKER, "directed", 100), 0);
}

Test(nn_ops_custom, four_ranks_directed_shardings_are_kept, .timeout = 120) {
  cr_assert_eq(weft_test_mpiexec(4, OPS_WORKER, "directed", 100), 0);
}

Test(nn_ops_custom, bad_input_fails_naming_the_op_alike_on_every_rank, .timeout = 120) {
  cr_assert_eq(weft_test_mpiexec(1, OPS_WORKER, "bad", 100), 0);
  cr_assert_eq(weft_test_mpiexec(2, OPS_WORKER, "bad", 100), 0);
}

Test(nn_ops_custom, two_ranks_repeated_steps_reuse_buffers_and_repeat_the_grads, .timeout = 120) {
  cr_assert_eq(weft_test_mpiexec(2, OPS_WORKER, "steps", 100), 0);
}

/* ------------------------------------------- the same on the device */

Test(nn_ops_custom,
     one_rank_forward_and_grads_match_double_reference_and_finite_differences_on_device,
     .timeout = 120) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  cr_assert_eq(weft_test_mpiexec_on_device(1, OPS_WORKER, "one", 100, NULL), 0);
}

Test(nn_ops_custom, two_ranks_random_placements_equal_one_rank_on_device, .timeout = 240) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  const char *extra[] = {"6", NULL};
  cr_assert_eq(weft_test_mpiexec_on_device(2, OPS_WORKER, "random", 200, extra), 0);
}

Test(nn_ops_custom, four_ranks_random_placements_on_1d_and_2x2_meshes_equal_one_rank_on_device,
     .timeout = 400) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  const char *extra[] = {"4", NULL};
  cr_assert_eq(weft_test_mpiexec_on_device(4, OPS_WORKER, "random", 360, extra), 0);
}

Test(nn_ops_custom, eight_ranks_random_placements_on_8_and_2x4_meshes_equal_one_rank_on_device,
     .timeout = 400) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  const char *extra[] = {"2", NULL};
  cr_assert_eq(weft_test_mpiexec_on_device(8, OPS_WORKER, "random", 360, extra), 0);
}

Test(nn_ops_custom, two_ranks_directed_shardings_are_kept_on_device, .timeout = 120) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  cr_assert_eq(weft_test_mpiexec_on_device(2, OPS_WORKER, "directed", 100, NULL), 0);
}

Test(nn_ops_custom, four_ranks_directed_shardings_are_kept_on_device, .timeout = 120) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  cr_assert_eq(weft_test_mpiexec_on_device(4, OPS_WORKER, "directed", 100, NULL), 0);
}

Test(nn_ops_custom, bad_input_fails_naming_the_op_alike_on_every_rank_on_device, .timeout = 120) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  cr_assert_eq(weft_test_mpiexec_on_device(1, OPS_WORKER, "bad", 100, NULL), 0);
  cr_assert_eq(weft_test_mpiexec_on_device(2, OPS_WORKER, "bad", 100, NULL), 0);
}

Test(nn_ops_custom, two_ranks_repeated_steps_reuse_buffers_and_repeat_the_grads_on_device,
     .timeout = 120) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  cr_assert_eq(weft_test_mpiexec_on_device(2, OPS_WORKER, "steps", 100, NULL), 0);
}
