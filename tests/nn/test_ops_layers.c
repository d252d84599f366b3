/* tests/nn/test_ops_layers.c — the layer ops of autograd.h (embedding,
 * norms, activations, swiglu, softmax, rope, sdpa, cross_entropy, dropout;
 * nn/ops_layers.c) against double-precision references and finite
 * differences. The cases need a mesh, so they run in ops_layers_worker
 * under mpiexec (see tests/harness/harness.h).
 * The *_on_device variants run the same worker cases with every mesh on
 * WEFT_CUDA (the worker's device mode, WEFT_TEST_DEVICE=cuda) and the same
 * tolerances; they skip, saying why, where this process sees no CUDA
 * device. */
#include <criterion/criterion.h>

#include "backend.h"
#include "harness.h"

#define OPS_WORKER WORKER("ops_layers_worker")

Test(nn_ops_layers, one_rank_forward_backward_dropout_and_bad_input, .timeout = 120) {
  cr_assert_eq(weft_test_mpiexec(1, OPS_WORKER, "ops1", 100), 0);
}

Test(nn_ops_layers, two_ranks_sharded_inputs_give_the_unsharded_results, .timeout = 120) {
  cr_assert_eq(weft_test_mpiexec(2, OPS_WORKER, "ops2", 100), 0);
}

/* bf16 inputs: the output and grads are the f32 run's rounded to bf16 */
Test(nn_ops_layers, bf16_inputs_give_the_f32_results_rounded, .timeout = 120) {
  cr_assert_eq(weft_test_mpiexec(1, OPS_WORKER, "bf16_1", 100), 0);
}

Test(nn_ops_layers, bf16_sharded_inputs_give_the_f32_results_rounded, .timeout = 120) {
  cr_assert_eq(weft_test_mpiexec(2, OPS_WORKER, "bf16_2", 100), 0);
}

/* ------------------------------------------- the same on the device */

Test(nn_ops_layers, one_rank_forward_backward_dropout_and_bad_input_on_device, .timeout = 120) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  cr_assert_eq(weft_test_mpiexec_on_device(1, OPS_WORKER, "ops1", 100, NULL), 0);
}

Test(nn_ops_layers, two_ranks_sharded_inputs_give_the_unsharded_results_on_device, .timeout = 120) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  cr_assert_eq(weft_test_mpiexec_on_device(2, OPS_WORKER, "ops2", 100, NULL), 0);
}

Test(nn_ops_layers, bf16_inputs_give_the_f32_results_rounded_on_device, .timeout = 120) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  cr_assert_eq(weft_test_mpiexec_on_device(1, OPS_WORKER, "bf16_1", 100, NULL), 0);
}

Test(nn_ops_layers, bf16_sharded_inputs_give_the_f32_results_rounded_on_device, .timeout = 120) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  cr_assert_eq(weft_test_mpiexec_on_device(2, OPS_WORKER, "bf16_2", 100, NULL), 0);
}

/* cross-entropy reduced over a data-parallel batch (WEFT_REDUCTION_MEAN_GLOBAL)
 * gives the one-rank loss and gradients with ignored positions on one rank
 * only; SUM; a bad target on one rank fails on both */
Test(nn_ops_layers, cross_entropy_global_mean_over_the_batch_mesh_is_the_one_rank_mean,
     .timeout = 60) {
  cr_assert_eq(weft_test_mpiexec(2, OPS_WORKER, "ce_global", 50), 0);
}
