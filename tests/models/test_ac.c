/* tests/models/test_ac.c — the models_ac suite: activation checkpointing
 * (weft_module_set_checkpoint) on GPT-2, run by ac_worker under mpiexec:
 * gradients bitwise equal to the run without checkpointing (dropout on,
 * nested, FSDP per block on two ranks), PyTorch float64 parity, lower
 * peak memory, and the error of a non-deterministic recompute. The
 * *_on_device variants run the same cases with the meshes on WEFT_CUDA
 * (the worker's device mode, WEFT_TEST_DEVICE=cuda: memory measured on the
 * device); they skip, saying why, where no CUDA device is visible. */
#include <criterion/criterion.h>

#include "backend.h"
#include "harness.h"

#define AC_WORKER WORKER("ac_worker")

Test(models_ac, every_block_checkpointed_matches_pytorch_and_no_ac_bitwise, .timeout = 120) {
  cr_assert_eq(weft_test_mpiexec(1, AC_WORKER, "golden", 100), 0);
}

Test(models_ac, dropout_grads_bitwise_equal_for_block_sub_and_nested_ac, .timeout = 120) {
  cr_assert_eq(weft_test_mpiexec(1, AC_WORKER, "dropout_bitwise", 100), 0);
}

Test(models_ac, ac_lowers_peak_memory_and_allocates_nothing_in_a_steady_step, .timeout = 120) {
  cr_assert_eq(weft_test_mpiexec(1, AC_WORKER, "memory", 100), 0);
}

Test(models_ac, fsdp_per_block_x_ac_two_ranks_bitwise_and_matches_pytorch, .timeout = 180) {
  cr_assert_eq(weft_test_mpiexec(2, AC_WORKER, "fsdp", 160), 0);
}

Test(models_ac, fsdp_bf16_x_ac_two_ranks_bitwise, .timeout = 180) {
  cr_assert_eq(weft_test_mpiexec(2, AC_WORKER, "fsdp_bf16", 160), 0);
}

Test(models_ac, fsdp_groups_inside_a_checkpointed_block_two_ranks_bitwise, .timeout = 180) {
  cr_assert_eq(weft_test_mpiexec(2, AC_WORKER, "fsdp_inner", 160), 0);
}

Test(models_ac, tp_sequence_parallel_x_ac_two_ranks_bitwise, .timeout = 180) {
  cr_assert_eq(weft_test_mpiexec(2, AC_WORKER, "tp_sp", 160), 0);
}

Test(models_ac, non_deterministic_recompute_is_an_error_naming_the_module, .timeout = 60) {
  cr_assert_eq(weft_test_mpiexec(1, AC_WORKER, "errors", 50), 0);
}

Test(models_ac, every_block_checkpointed_matches_pytorch_and_no_ac_bitwise_on_device,
     .timeout = 120) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  cr_assert_eq(weft_test_mpiexec_on_device(1, AC_WORKER, "golden", 100, NULL), 0);
}

Test(models_ac, dropout_grads_bitwise_equal_for_block_sub_and_nested_ac_on_device, .timeout = 120) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  cr_assert_eq(weft_test_mpiexec_on_device(1, AC_WORKER, "dropout_bitwise", 100, NULL), 0);
}

Test(models_ac, ac_lowers_device_peak_memory_and_allocates_nothing_in_a_steady_step_on_device,
     .timeout = 120) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  cr_assert_eq(weft_test_mpiexec_on_device(1, AC_WORKER, "memory", 100, NULL), 0);
}

Test(models_ac, fsdp_per_block_x_ac_two_ranks_bitwise_and_matches_pytorch_on_device,
     .timeout = 180) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  cr_assert_eq(weft_test_mpiexec_on_device(2, AC_WORKER, "fsdp", 160, NULL), 0);
}

Test(models_ac, fsdp_bf16_x_ac_two_ranks_bitwise_on_device, .timeout = 180) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  cr_assert_eq(weft_test_mpiexec_on_device(2, AC_WORKER, "fsdp_bf16", 160, NULL), 0);
}

Test(models_ac, fsdp_groups_inside_a_checkpointed_block_two_ranks_bitwise_on_device,
     .timeout = 180) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  cr_assert_eq(weft_test_mpiexec_on_device(2, AC_WORKER, "fsdp_inner", 160, NULL), 0);
}

Test(models_ac, tp_sequence_parallel_x_ac_two_ranks_bitwise_on_device, .timeout = 180) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  cr_assert_eq(weft_test_mpiexec_on_device(2, AC_WORKER, "tp_sp", 160, NULL), 0);
}

Test(models_ac, non_deterministic_recompute_is_an_error_naming_the_module_on_device,
     .timeout = 60) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  cr_assert_eq(weft_test_mpiexec_on_device(1, AC_WORKER, "errors", 50, NULL), 0);
}
