/* tests/fsdp/test_fsdp.c — the fsdp suite. Cases that need ranks run in
 * fsdp_worker under mpiexec (1..8 ranks, oversubscribed); argument checks
 * that need no MPI run here. The *_on_device variants run the same worker
 * cases with every mesh on WEFT_CUDA (the worker's device mode,
 * WEFT_TEST_DEVICE=cuda) and the same tolerances; they skip, saying why,
 * where this process sees no CUDA device. */
#include <criterion/criterion.h>
#include <string.h>

#include "backend.h"
#include "fsdp.h"
#include "harness.h"

#define FSDP_WORKER WORKER("fsdp_worker")

/* ------------------------------------------------------- through workers */

Test(fsdp, parity_dp2_matches_one_rank_with_deferred_init_and_offload, .timeout = 90) {
  cr_assert_eq(weft_test_mpiexec(2, FSDP_WORKER, "parity_fsdp", 80), 0);
}

Test(fsdp, parity_dp4_matches_one_rank_exact_comm_and_memory, .timeout = 90) {
  cr_assert_eq(weft_test_mpiexec(4, FSDP_WORKER, "parity_fsdp", 80), 0);
}

Test(fsdp, uneven_dim0_sizes_dp4_and_2d_match_one_rank, .timeout = 120) {
  cr_assert_eq(weft_test_mpiexec(4, FSDP_WORKER, "parity_uneven", 110), 0);
}

Test(fsdp, offload_params_keeps_sharded_state_on_the_host_with_the_same_losses, .timeout = 90) {
  cr_assert_eq(weft_test_mpiexec(2, FSDP_WORKER, "offload", 80), 0);
}

#ifdef FSDP_TEST_HAVE_TP
Test(fsdp, parity_2d_dp2_tp2_with_and_without_sequence_parallel, .timeout = 120) {
  cr_assert_eq(weft_test_mpiexec(4, FSDP_WORKER, "parity_2d", 110), 0);
}

Test(fsdp, parity_3d_replicate2_shard2_tp2_on_8_ranks, .timeout = 150) {
  cr_assert_eq(weft_test_mpiexec(8, FSDP_WORKER, "parity_3d", 140), 0);
}
#endif

Test(fsdp, parity_hsdp_2x2_reduce_scatter_then_all_reduce, .timeout = 90) {
  cr_assert_eq(weft_test_mpiexec(4, FSDP_WORKER, "parity_hsdp", 80), 0);
}

Test(fsdp, reshard_after_forward_true_false_2_identical_numbers_and_comm, .timeout = 120) {
  cr_assert_eq(weft_test_mpiexec(4, FSDP_WORKER, "reshard_modes", 110), 0);
}

Test(fsdp, gradient_accumulation_without_sync_equals_big_batch, .timeout = 90) {
  cr_assert_eq(weft_test_mpiexec(2, FSDP_WORKER, "accumulate", 80), 0);
}

Test(fsdp, prefetch_and_reduce_scatter_overlap_in_trace_controls_work, .timeout = 90) {
  cr_assert_eq(weft_test_mpiexec(2, FSDP_WORKER, "overlap", 80), 0);
}

Test(fsdp, bf16_mixed_precision_tracks_fp32_loss_within_2_percent, .timeout = 120) {
  cr_assert_eq(weft_test_mpiexec(2, FSDP_WORKER, "bf16", 110), 0);
}

Test(fsdp, bad_input_gives_clear_errors_and_changes_nothing, .timeout = 90) {
  cr_assert_eq(weft_test_mpiexec(2, FSDP_WORKER, "bad", 80), 0);
}

#ifdef FSDP_TEST_HAVE_GPT2
Test(fsdp, tied_weight_only_in_a_common_ancestor_group_and_trains_like_one_rank, .timeout = 90) {
  cr_assert_eq(weft_test_mpiexec(2, FSDP_WORKER, "tied", 80), 0);
}
#endif

/* ------------------------------------------- the same on the device */

#define RUN_ON_DEVICE(n, c, secs) weft_test_mpiexec_on_device((n), FSDP_WORKER, (c), (secs), NULL)

Test(fsdp, parity_dp2_matches_one_rank_on_device, .timeout = 90) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  cr_assert_eq(RUN_ON_DEVICE(2, "parity_fsdp", 80), 0);
}

Test(fsdp, uneven_dim0_sizes_dp4_and_2d_match_one_rank_on_device, .timeout = 120) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  cr_assert_eq(RUN_ON_DEVICE(4, "parity_uneven", 110), 0);
}

Test(fsdp, offload_params_moves_sharded_state_off_the_device_on_device, .timeout = 90) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  cr_assert_eq(RUN_ON_DEVICE(2, "offload", 80), 0);
}

#ifdef FSDP_TEST_HAVE_TP
Test(fsdp, parity_2d_dp2_tp2_on_device, .timeout = 120) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  cr_assert_eq(RUN_ON_DEVICE(4, "parity_2d", 110), 0);
}

Test(fsdp, parity_3d_replicate2_shard2_tp2_on_8_ranks_on_device, .timeout = 150) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  cr_assert_eq(RUN_ON_DEVICE(8, "parity_3d", 140), 0);
}
#endif

Test(fsdp, parity_hsdp_2x2_on_device, .timeout = 90) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  cr_assert_eq(RUN_ON_DEVICE(4, "parity_hsdp", 80), 0);
}

Test(fsdp, reshard_after_forward_modes_on_device, .timeout = 120) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  cr_assert_eq(RUN_ON_DEVICE(4, "reshard_modes", 110), 0);
}

Test(fsdp, gradient_accumulation_without_sync_on_device, .timeout = 90) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  cr_assert_eq(RUN_ON_DEVICE(2, "accumulate", 80), 0);
}

Test(fsdp, prefetch_and_reduce_scatter_overlap_in_trace_on_device, .timeout = 90) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  cr_assert_eq(RUN_ON_DEVICE(2, "overlap", 80), 0);
}

Test(fsdp, bf16_mixed_precision_tracks_fp32_loss_on_device, .timeout = 120) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  cr_assert_eq(RUN_ON_DEVICE(2, "bf16", 110), 0);
}

Test(fsdp, bad_input_gives_clear_errors_on_device, .timeout = 90) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  cr_assert_eq(RUN_ON_DEVICE(2, "bad", 80), 0);
}

#ifdef FSDP_TEST_HAVE_GPT2
Test(fsdp, tied_weight_trains_like_one_rank_on_device, .timeout = 90) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  cr_assert_eq(RUN_ON_DEVICE(2, "tied", 80), 0);
}
#endif

/* ------------------------------------------------------------ in process */

Test(fsdp, null_arguments_fail_without_mpi) {
  cr_assert_eq(weft_fully_shard(NULL, NULL, NULL, NULL), WEFT_ERR_INVALID);
  cr_assert(strstr(weft_last_error(), "NULL") != NULL, "%s", weft_last_error());
  cr_assert_eq(weft_fully_shard_modules(NULL, 0, NULL, NULL, NULL), WEFT_ERR_INVALID);
  cr_assert_eq(weft_fsdp_destroy(NULL), WEFT_OK);
  cr_assert_eq(weft_fsdp_handle_wait(NULL), WEFT_OK);
  cr_assert_eq(weft_fsdp_of(NULL), NULL);
  cr_assert_eq(weft_fsdp_reshard(NULL), WEFT_ERR_INVALID);
  cr_assert_eq(weft_fsdp_unshard(NULL, false, NULL), WEFT_ERR_INVALID);
  cr_assert_eq(weft_fsdp_set_is_last_backward(NULL, true), WEFT_ERR_INVALID);
  cr_assert_eq(weft_fsdp_get_info(NULL, NULL), WEFT_ERR_INVALID);
  weft_fsdp_memory m;
  cr_assert_eq(weft_fsdp_memory_get(NULL), WEFT_ERR_INVALID);
  cr_assert_eq(weft_fsdp_memory_get(&m), WEFT_OK);
  cr_assert_eq(m.unsharded_params.current, 0);
}

Test(fsdp, event_names_and_trace_bounds) {
  cr_assert_str_eq(weft_fsdp_event_kind_name(WEFT_FSDP_EV_UNSHARD_START), "unshard_start");
  cr_assert_str_eq(weft_fsdp_event_kind_name(WEFT_FSDP_EV_REDUCE_DONE), "reduce_done");
  cr_assert_str_eq(weft_fsdp_event_kind_name(WEFT_FSDP_EV_KIND_COUNT), "?");
  weft_fsdp_trace_clear();
  cr_assert_eq(weft_fsdp_trace_count(), 0);
  weft_fsdp_event e;
  cr_assert_eq(weft_fsdp_trace_get(0, &e), WEFT_ERR_INVALID);
  cr_assert_eq(weft_fsdp_trace_get(-1, &e), WEFT_ERR_INVALID);
}

Test(fsdp, options_init_is_pytorch_default) {
  weft_fsdp_options o = WEFT_FSDP_OPTIONS_INIT;
  cr_assert_eq(o.version, WEFT_FSDP_OPTIONS_VERSION);
  cr_assert_eq(o.reshard_after_forward, WEFT_FSDP_RESHARD_DEFAULT);
  cr_assert_eq(o.mp.param_dtype, WEFT_DTYPE_COUNT);
  cr_assert_eq(o.mp.reduce_dtype, WEFT_DTYPE_COUNT);
  cr_assert(o.mp.cast_forward_inputs);
  cr_assert(!o.offload_params);
}
