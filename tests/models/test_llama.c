/* tests/models/test_llama.c — the models_llama suite: Llama written with
 * ops (models/llama) against PyTorch float64 golden data on 1 rank, tp = 2
 * and dp = 2 x tp = 2 (FSDP x TP), and against the built-in weft_llama_*
 * model from the same seed; run by llama_worker under mpiexec. The
 * *_on_device variants run the same cases with the meshes on WEFT_CUDA
 * (the worker's device mode, WEFT_TEST_DEVICE=cuda) and the same
 * tolerances; they skip, saying why, where no CUDA device is visible. */
#include <criterion/criterion.h>

#include "backend.h"
#include "harness.h"

#define LLAMA_WORKER WORKER("llama_worker")

Test(models_llama, one_rank_matches_pytorch_loss_grads_adamw_and_builtin_layout, .timeout = 120) {
  cr_assert_eq(weft_test_mpiexec(1, LLAMA_WORKER, "golden", 100), 0);
}

Test(models_llama, tp2_plain_loss_parallel_and_sequence_parallel_match_pytorch, .timeout = 180) {
  cr_assert_eq(weft_test_mpiexec(2, LLAMA_WORKER, "golden_tp", 160), 0);
}

Test(models_llama, fsdp_dp2_x_tp2_matches_pytorch, .timeout = 240) {
  cr_assert_eq(weft_test_mpiexec(4, LLAMA_WORKER, "golden_fsdp_tp", 220), 0);
}

Test(models_llama, same_seed_same_weights_and_steps_as_builtin_llama, .timeout = 120) {
  cr_assert_eq(weft_test_mpiexec(1, LLAMA_WORKER, "builtin", 100), 0);
}

Test(models_llama, one_rank_matches_pytorch_and_builtin_layout_on_device, .timeout = 120) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  cr_assert_eq(weft_test_mpiexec_on_device(1, LLAMA_WORKER, "golden", 100, NULL), 0);
}

Test(models_llama, tp2_plain_loss_parallel_and_sequence_parallel_match_pytorch_on_device,
     .timeout = 180) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  cr_assert_eq(weft_test_mpiexec_on_device(2, LLAMA_WORKER, "golden_tp", 160, NULL), 0);
}

Test(models_llama, fsdp_dp2_x_tp2_matches_pytorch_on_device, .timeout = 240) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  cr_assert_eq(weft_test_mpiexec_on_device(4, LLAMA_WORKER, "golden_fsdp_tp", 220, NULL), 0);
}

Test(models_llama, same_seed_same_weights_and_steps_as_builtin_llama_on_device, .timeout = 120) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  cr_assert_eq(weft_test_mpiexec_on_device(1, LLAMA_WORKER, "builtin", 100, NULL), 0);
}

/* Hugging Face transformers' Llama layout (tests/data/golden/make_llama_hf.py:
 * q/k rows permuted for rotate_half): converted and imported, PyTorch's loss,
 * gradients and AdamW step (MHA and GQA); exported back, the same bytes */
Test(models_llama, from_hugging_face_layout_matches_pytorch_and_exports_back_bitwise,
     .timeout = 120) {
  cr_assert_eq(weft_test_mpiexec(1, LLAMA_WORKER, "hf", 100), 0);
}

Test(models_llama, from_hugging_face_layout_on_fsdp_x_tp_2x2_matches_pytorch, .timeout = 180) {
  cr_assert_eq(weft_test_mpiexec(4, LLAMA_WORKER, "hf_2d", 160), 0);
}

Test(models_llama, from_hugging_face_layout_matches_pytorch_on_device, .timeout = 120) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  cr_assert_eq(weft_test_mpiexec_on_device(1, LLAMA_WORKER, "hf", 100, NULL), 0);
}
