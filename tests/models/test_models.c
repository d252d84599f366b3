/* tests/models/test_models.c — the models suite: GPT-2 (models/gpt2) on the
 * public API against PyTorch float64 golden data, run by gpt2_worker under
 * mpiexec. The *_on_device variants run the same cases with the meshes on
 * WEFT_CUDA (the worker's device mode, WEFT_TEST_DEVICE=cuda) and the same
 * tolerances; they skip, saying why, where no CUDA device is visible. */
#include <criterion/criterion.h>

#include "backend.h"
#include "harness.h"

#define GPT2_WORKER WORKER("gpt2_worker")

Test(models, gpt2_one_rank_matches_pytorch_loss_grads_adamw_groups, .timeout = 120) {
  cr_assert_eq(weft_test_mpiexec(1, GPT2_WORKER, "golden", 100), 0);
}

Test(models, gpt2_fsdp_two_ranks_matches_pytorch, .timeout = 120) {
  cr_assert_eq(weft_test_mpiexec(2, GPT2_WORKER, "golden_fsdp", 100), 0);
}

/* FSDP bf16 mixed precision on the op graph: bf16 unsharded parameters and
 * activations; 100 steps within 2% of fp32; half the bytes */
Test(models, gpt2_fsdp_bf16_tracks_fp32_with_half_the_param_and_activation_bytes, .timeout = 120) {
  cr_assert_eq(weft_test_mpiexec(2, GPT2_WORKER, "bf16_curve", 100), 0);
}

Test(models, state_dict_of_an_unsharded_bf16_group_holds_the_f32_masters, .timeout = 120) {
  cr_assert_eq(weft_test_mpiexec(2, GPT2_WORKER, "bf16_state_dict", 100), 0);
}

Test(models, gpt2_fsdp_x_tp_bf16_2x2_tracks_fp32_with_half_the_bytes, .timeout = 180) {
  cr_assert_eq(weft_test_mpiexec(4, GPT2_WORKER, "bf16_curve", 160), 0);
}

Test(models, adamw_parameter_groups_cover_each_parameter_once_and_keep_their_settings,
     .timeout = 60) {
  cr_assert_eq(weft_test_mpiexec(1, GPT2_WORKER, "groups", 50), 0);
}

Test(models, gpt2_tp_two_ranks_matches_pytorch, .timeout = 120) {
  cr_assert_eq(weft_test_mpiexec(2, GPT2_WORKER, "golden_tp", 100), 0);
}

Test(models, gpt2_tp_sequence_parallel_two_ranks_matches_pytorch, .timeout = 120) {
  cr_assert_eq(weft_test_mpiexec(2, GPT2_WORKER, "golden_tp_sp", 100), 0);
}

Test(models, gpt2_fsdp_x_tp_2x2_matches_pytorch, .timeout = 180) {
  cr_assert_eq(weft_test_mpiexec(4, GPT2_WORKER, "golden_2d", 160), 0);
}

Test(models, gpt2_fsdp_x_tp_sequence_parallel_2x2_matches_pytorch, .timeout = 180) {
  cr_assert_eq(weft_test_mpiexec(4, GPT2_WORKER, "golden_2d_sp", 160), 0);
}

Test(models, gpt2_hsdp_x_tp_2x2x2_matches_pytorch, .timeout = 240) {
  cr_assert_eq(weft_test_mpiexec(8, GPT2_WORKER, "golden_3d", 220), 0);
}

Test(models, gpt2_dropout_loss_curve_on_2x2_equals_one_rank, .timeout = 180) {
  cr_assert_eq(weft_test_mpiexec(4, GPT2_WORKER, "dropout_curve", 160), 0);
}

Test(models, gpt2_one_rank_matches_pytorch_on_device, .timeout = 120) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  cr_assert_eq(weft_test_mpiexec_on_device(1, GPT2_WORKER, "golden", 100, NULL), 0);
}

Test(models, gpt2_fsdp_bf16_tracks_fp32_with_half_the_param_and_activation_bytes_on_device,
     .timeout = 180) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  cr_assert_eq(weft_test_mpiexec_on_device(2, GPT2_WORKER, "bf16_curve", 150, NULL), 0);
}

Test(models, gpt2_fsdp_two_ranks_matches_pytorch_on_device, .timeout = 120) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  cr_assert_eq(weft_test_mpiexec_on_device(2, GPT2_WORKER, "golden_fsdp", 100, NULL), 0);
}

Test(models, adamw_parameter_groups_on_device, .timeout = 60) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  cr_assert_eq(weft_test_mpiexec_on_device(1, GPT2_WORKER, "groups", 50, NULL), 0);
}

Test(models, gpt2_tp_two_ranks_matches_pytorch_on_device, .timeout = 120) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  cr_assert_eq(weft_test_mpiexec_on_device(2, GPT2_WORKER, "golden_tp", 100, NULL), 0);
}

Test(models, gpt2_tp_sequence_parallel_two_ranks_matches_pytorch_on_device, .timeout = 120) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  cr_assert_eq(weft_test_mpiexec_on_device(2, GPT2_WORKER, "golden_tp_sp", 100, NULL), 0);
}

Test(models, gpt2_fsdp_x_tp_2x2_matches_pytorch_on_device, .timeout = 180) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  cr_assert_eq(weft_test_mpiexec_on_device(4, GPT2_WORKER, "golden_2d", 160, NULL), 0);
}

Test(models, gpt2_fsdp_x_tp_sequence_parallel_2x2_matches_pytorch_on_device, .timeout = 180) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  cr_assert_eq(weft_test_mpiexec_on_device(4, GPT2_WORKER, "golden_2d_sp", 160, NULL), 0);
}

Test(models, gpt2_hsdp_x_tp_2x2x2_matches_pytorch_on_device, .timeout = 240) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  cr_assert_eq(weft_test_mpiexec_on_device(8, GPT2_WORKER, "golden_3d", 220, NULL), 0);
}

Test(models, gpt2_dropout_loss_curve_on_2x2_equals_one_rank_on_device, .timeout = 180) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  cr_assert_eq(weft_test_mpiexec_on_device(4, GPT2_WORKER, "dropout_curve", 160, NULL), 0);
}

/* Hugging Face transformers' GPT-2 layout (tests/data/golden/make_gpt2_hf.py):
 * converted and imported, PyTorch's loss and gradients; exported back, the
 * same bytes */
Test(models, gpt2_from_hugging_face_layout_matches_pytorch_and_exports_back_bitwise,
     .timeout = 120) {
  cr_assert_eq(weft_test_mpiexec(1, GPT2_WORKER, "hf", 100), 0);
}

Test(models, gpt2_from_hugging_face_layout_on_fsdp_x_tp_2x2_matches_pytorch, .timeout = 180) {
  cr_assert_eq(weft_test_mpiexec(4, GPT2_WORKER, "hf_2d", 160), 0);
}

Test(models, gpt2_from_hugging_face_layout_on_fsdp_x_tp_2x2_on_device, .timeout = 180) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  cr_assert_eq(weft_test_mpiexec_on_device(4, GPT2_WORKER, "hf_2d", 160, NULL), 0);
}
