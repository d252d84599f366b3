/* tests/nn/test_nn.c — the nn suite. Cases that need a mesh run in
 * nn_worker under mpiexec (1 or 2 ranks); pure functions are tested here.
 * The *_on_device variants run the same worker cases with every mesh on
 * WEFT_CUDA (the worker's device mode, WEFT_TEST_DEVICE=cuda) and the same
 * tolerances; they skip, saying why, where this process sees no CUDA
 * device. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "backend.h"
#include "harness.h"
#include "nn.h"

#define NN_WORKER WORKER("nn_worker")

/* ------------------------------------------------------- through workers */

Test(nn, golden_one_rank_matches_pytorch_loss_grads_clip_adamw, .timeout = 60) {
  cr_assert_eq(weft_test_mpiexec(1, NN_WORKER, "golden", 50), 0);
}

Test(nn, golden_two_ranks_tp_and_sequence_parallel_match_pytorch, .timeout = 60) {
  cr_assert_eq(weft_test_mpiexec(2, NN_WORKER, "golden_tp", 50), 0);
}

Test(nn, hooks_fire_in_documented_order_and_replacements_are_honoured, .timeout = 60) {
  cr_assert_eq(weft_test_mpiexec(1, NN_WORKER, "hooks", 50), 0);
}

Test(nn, optimizers_match_torch_formulas_and_schedule_state_names, .timeout = 60) {
  cr_assert_eq(weft_test_mpiexec(1, NN_WORKER, "optim", 50), 0);
}

Test(nn, steady_state_step_allocates_nothing, .timeout = 60) {
  cr_assert_eq(weft_test_mpiexec(1, NN_WORKER, "steady", 50), 0);
}

Test(nn, bad_input_gives_clear_errors_and_leaves_state_intact, .timeout = 60) {
  cr_assert_eq(weft_test_mpiexec(1, NN_WORKER, "bad", 50), 0);
}

Test(nn, init_is_bitwise_identical_sharded_or_replicated, .timeout = 60) {
  cr_assert_eq(weft_test_mpiexec(2, NN_WORKER, "init", 50), 0);
}

Test(nn, clip_grad_norm_over_sharded_replicated_partial_grads_equals_one_rank, .timeout = 60) {
  cr_assert_eq(weft_test_mpiexec(2, NN_WORKER, "clip", 50), 0);
}

Test(nn, unsupported_tp_placements_fail_cleanly_on_every_rank, .timeout = 60) {
  cr_assert_eq(weft_test_mpiexec(2, NN_WORKER, "tp_errors", 50), 0);
}

Test(nn, visit_order_grad_accumulation_requires_grad_and_custom_loss, .timeout = 60) {
  cr_assert_eq(weft_test_mpiexec(1, NN_WORKER, "misc", 50), 0);
}

/* ------------------------------------------- the same on the device */

#define RUN_ON_DEVICE(n, c) weft_test_mpiexec_on_device((n), NN_WORKER, (c), 50, NULL)

Test(nn, golden_one_rank_matches_pytorch_loss_grads_clip_adamw_on_device, .timeout = 60) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  cr_assert_eq(RUN_ON_DEVICE(1, "golden"), 0);
}

Test(nn, golden_two_ranks_tp_and_sequence_parallel_match_pytorch_on_device, .timeout = 60) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  cr_assert_eq(RUN_ON_DEVICE(2, "golden_tp"), 0);
}

Test(nn, hooks_fire_in_documented_order_and_replacements_are_honoured_on_device, .timeout = 60) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  cr_assert_eq(RUN_ON_DEVICE(1, "hooks"), 0);
}

Test(nn, optimizers_match_torch_formulas_and_schedule_state_names_on_device, .timeout = 60) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  cr_assert_eq(RUN_ON_DEVICE(1, "optim"), 0);
}

Test(nn, steady_state_step_allocates_nothing_on_device, .timeout = 60) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  cr_assert_eq(RUN_ON_DEVICE(1, "steady"), 0);
}

Test(nn, bad_input_gives_clear_errors_and_leaves_state_intact_on_device, .timeout = 60) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  cr_assert_eq(RUN_ON_DEVICE(1, "bad"), 0);
}

Test(nn, init_is_bitwise_identical_sharded_or_replicated_on_device, .timeout = 60) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  cr_assert_eq(RUN_ON_DEVICE(2, "init"), 0);
}

Test(nn, clip_grad_norm_over_sharded_replicated_partial_grads_equals_one_rank_on_device,
     .timeout = 60) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  cr_assert_eq(RUN_ON_DEVICE(2, "clip"), 0);
}

Test(nn, unsupported_tp_placements_fail_cleanly_on_every_rank_on_device, .timeout = 60) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  cr_assert_eq(RUN_ON_DEVICE(2, "tp_errors"), 0);
}

Test(nn, visit_order_grad_accumulation_requires_grad_and_custom_loss_on_device, .timeout = 60) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  cr_assert_eq(RUN_ON_DEVICE(1, "misc"), 0);
}

/* ------------------------------------------------------------ in process */

/* llm.c's get_lr: warmup (s+1)/W, then cosine from lr_max to lr_min. */
static double ref_lr(double mx, double mn, int64_t w, int64_t total, int64_t s) {
  if (s < w) return mx * (double)(s + 1) / (double)w;
  if (s >= total) return mn;
  double r = (double)(s - w) / (double)(total - w);
  return mn + 0.5 * (1 + cos(M_PI * r)) * (mx - mn);
}

Test(nn, lr_schedule_warmup_and_cosine_points) {
  weft_lr_schedule s = {6e-4f, 6e-5f, 10, 110};
  /* exact points: first warmup step, end of warmup, half-way, end, after */
  cr_assert_float_eq(weft_lr_schedule_at(&s, 0), 6e-5f, 1e-10);
  cr_assert_float_eq(weft_lr_schedule_at(&s, 4), 3e-4f, 1e-10);
  cr_assert_float_eq(weft_lr_schedule_at(&s, 9), 6e-4f, 1e-10);
  cr_assert_float_eq(weft_lr_schedule_at(&s, 10), 6e-4f, 1e-10);
  cr_assert_float_eq(weft_lr_schedule_at(&s, 60), 0.5f * (6e-4f + 6e-5f), 1e-9);
  cr_assert_float_eq(weft_lr_schedule_at(&s, 110), 6e-5f, 1e-10);
  cr_assert_float_eq(weft_lr_schedule_at(&s, 1000), 6e-5f, 1e-10);
  cr_assert_float_eq(weft_lr_schedule_at(&s, -3), 6e-5f, 1e-10);
  for (int64_t k = 0; k < 120; k++) {
    double want = ref_lr(6e-4, 6e-5, 10, 110, k);
    cr_assert(fabs(weft_lr_schedule_at(&s, k) - want) <= 1e-6 * want, "step %lld: %g want %g",
              (long long)k, (double)weft_lr_schedule_at(&s, k), want);
    if (k > 10 && k < 110)
      cr_assert(weft_lr_schedule_at(&s, k) < weft_lr_schedule_at(&s, k - 1),
                "not decreasing at %lld", (long long)k);
  }
  weft_lr_schedule nw = {1e-3f, 0.0f, 0, 4}; /* no warmup */
  cr_assert_float_eq(weft_lr_schedule_at(&nw, 0), 1e-3f, 1e-10);
  cr_assert_float_eq(weft_lr_schedule_at(&nw, 2), 5e-4f, 1e-9);
  weft_lr_schedule bad = {1e-3f, 0.0f, 5, 2};
  cr_assert_float_eq(weft_lr_schedule_at(&bad, 3), 1e-3f, 1e-10);
}

Test(nn, llama_config_validation_names_the_field) {
  weft_llama_config c = WEFT_LLAMA_CONFIG_INIT;
  cr_assert_eq(weft_llama_config_validate(&c), WEFT_ERR_INVALID);
  cr_assert(strstr(weft_last_error(), "dim"), "%s", weft_last_error());
  c.dim = 64, c.n_layers = 2, c.n_heads = 4, c.n_kv_heads = 4, c.ffn_dim = 172, c.vocab = 96;
  c.max_seq_len = 16;
  cr_assert_eq(weft_llama_config_validate(&c), WEFT_OK, "%s", weft_last_error());
  c.n_kv_heads = 3;
  cr_assert_eq(weft_llama_config_validate(&c), WEFT_ERR_INVALID);
  cr_assert(strstr(weft_last_error(), "n_kv_heads 3"), "%s", weft_last_error());
  c.n_kv_heads = 2;
  c.norm_eps = 0;
  cr_assert_eq(weft_llama_config_validate(&c), WEFT_ERR_INVALID);
  cr_assert(strstr(weft_last_error(), "norm_eps"), "%s", weft_last_error());
  c.norm_eps = 1e-5f;
  c.rope_theta = -1;
  cr_assert_eq(weft_llama_config_validate(&c), WEFT_ERR_INVALID);
  cr_assert(strstr(weft_last_error(), "rope_theta"), "%s", weft_last_error());
  cr_assert_eq(weft_llama_config_validate(NULL), WEFT_ERR_INVALID);
}

Test(nn, kind_names_and_null_accessors) {
  cr_assert_str_eq(weft_module_kind_name(WEFT_MODULE_LINEAR), "linear");
  cr_assert_str_eq(weft_module_kind_name(WEFT_MODULE_FEED_FORWARD), "feed_forward");
  cr_assert_str_eq(weft_module_kind_name(WEFT_MODULE_KIND_COUNT), "?");
  cr_assert_eq(weft_module_destroy(NULL), WEFT_OK);
  cr_assert_eq(weft_module_num_children(NULL), 0);
  cr_assert_null(weft_module_child(NULL, 0));
  cr_assert_null(weft_llama_get_config(NULL));
  cr_assert_eq(weft_clip_grad_norm(NULL, 1.0, NULL), WEFT_ERR_INVALID);
  weft_hook_handle h = {NULL, 1};
  cr_assert_eq(weft_hook_remove(h), WEFT_ERR_INVALID);
}
