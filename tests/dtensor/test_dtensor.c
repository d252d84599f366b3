/* tests/dtensor/test_dtensor.c — multi-rank DTensor tests: each starts
 * dtensor_worker under mpiexec (see tests/harness). Seeds come from
 * WEFT_TEST_SEED when set; the worker prints every failing case in full.
 * The *_on_device_* variants run the same cases with the meshes on
 * WEFT_CUDA (the worker's device mode, WEFT_TEST_DEVICE=cuda); they skip,
 * saying why, where this process sees no CUDA device. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>

#include "backend.h"
#include "harness.h"

static int run(int n, const char *cname, const char *meshes, int ncases, int secs) {
  char cases[32], seed[32];
  snprintf(cases, sizeof cases, "%d", ncases);
  snprintf(seed, sizeof seed, "%lu", weft_test_seed(1234567));
  const char *extra[] = {meshes, cases, seed, NULL};
  return weft_test_mpiexec_args(n, WORKER("dtensor_worker"), cname, secs, extra);
}

/* run() in the worker's device mode. extra: NULL-terminated worker
 * arguments, or NULL. */
static int run_on_device(int n, const char *cname, const char *const *extra, int secs) {
  return weft_test_mpiexec_on_device(n, WORKER("dtensor_worker"), cname, secs, extra);
}
static int run_cases_on_device(int n, const char *cname, const char *meshes, int ncases, int secs) {
  char cases[32], seed[32];
  snprintf(cases, sizeof cases, "%d", ncases);
  snprintf(seed, sizeof seed, "%lu", weft_test_seed(1234567));
  const char *extra[] = {meshes, cases, seed, NULL};
  return run_on_device(n, cname, extra, secs);
}

/* redistribute(distribute(x, a), b) == distribute(x, b) bitwise and
 * full_tensor == x, random shapes (zero and tiny dims), dtypes, placements
 * incl. nested and strided shards, random source ranks. */
Test(dtensor, redistribute_roundtrips_on_1_rank, .timeout = 60) {
  cr_assert_eq(run(1, "property", "1", 300, 50), 0);
}
Test(dtensor, redistribute_roundtrips_on_2_ranks, .timeout = 90) {
  cr_assert_eq(run(2, "property", "2,1x2", 300, 80), 0);
}
Test(dtensor, redistribute_roundtrips_on_4_ranks_1d_and_2d, .timeout = 120) {
  cr_assert_eq(run(4, "property", "4,1x4,2x2", 200, 110), 0);
}
Test(dtensor, redistribute_roundtrips_on_2x3, .timeout = 120) {
  cr_assert_eq(run(6, "property", "2x3", 200, 110), 0);
}
Test(dtensor, redistribute_roundtrips_on_2x2x2, .timeout = 150) {
  cr_assert_eq(run(8, "property", "2x2x2", 150, 140), 0);
}

/* Partial sources (sum, avg, max, min) from integer pieces: exact. */
Test(dtensor, partial_reductions_are_exact_on_2_ranks, .timeout = 60) {
  cr_assert_eq(run(2, "partial", "2", 200, 50), 0);
}
Test(dtensor, partial_reductions_are_exact_on_4_ranks, .timeout = 90) {
  cr_assert_eq(run(4, "partial", "4,2x2", 150, 80), 0);
}
Test(dtensor, partial_reductions_are_exact_on_2x3, .timeout = 90) {
  cr_assert_eq(run(6, "partial", "2x3", 100, 80), 0);
}

/* Single-dim moves make one collective with the minimal payload; R -> P. */
Test(dtensor, single_dim_moves_send_minimal_bytes, .timeout = 60) {
  cr_assert_eq(weft_test_mpiexec(4, WORKER("dtensor_worker"), "comm", 50), 0);
}
Test(dtensor, single_dim_moves_send_minimal_bytes_3_ranks, .timeout = 60) {
  cr_assert_eq(weft_test_mpiexec(3, WORKER("dtensor_worker"), "comm", 50), 0);
}

/* Sharding propagation: matmul/linear/add/mul/sum/mean strategies give the
 * single-rank result and the expected output placements. */
Test(dtensor, propagation_matches_single_rank_on_2_ranks, .timeout = 60) {
  cr_assert_eq(weft_test_mpiexec(2, WORKER("dtensor_worker"), "ops", 50), 0);
}
Test(dtensor, propagation_matches_single_rank_on_2x2, .timeout = 60) {
  cr_assert_eq(weft_test_mpiexec(4, WORKER("dtensor_worker"), "ops", 50), 0);
}

/* Bad input: a clear error on every rank, no hang. */
Test(dtensor, bad_input_fails_on_every_rank, .timeout = 60) {
  cr_assert_eq(weft_test_mpiexec(4, WORKER("dtensor_worker"), "errors", 50), 0);
}
Test(dtensor, from_local_mismatch_under_debug_fails_on_every_rank, .timeout = 60) {
  const char *env[] = {"WEFT_DEBUG=1", NULL};
  cr_assert_eq(weft_test_mpiexec_env(4, WORKER("dtensor_worker"), "debug_from_local", 50, env), 0);
}

/* RNG fills by global index agree with filling the full tensor. */
Test(dtensor, fill_by_global_index_matches_full_fill, .timeout = 60) {
  cr_assert_eq(weft_test_mpiexec(4, WORKER("dtensor_worker"), "fill", 50), 0);
}

/* weft_dtensor_as_strided and weft_dtensor_view over strided shards
 * (column slices of a fused projection, nn's split and reshape). */
Test(dtensor, strided_views_of_shards_behave_as_dtensors, .timeout = 60) {
  cr_assert_eq(weft_test_mpiexec(4, WORKER("dtensor_worker"), "views", 50), 0);
}

/* redistribute_into a preallocated / VIEW DTensor equals redistribute; the
 * opt-in buffer cache reuses blocks and frees them when turned off. */
/* R/S -> Partial(sum) divides (x / 3 bitwise on each rank of a 1x3 mesh,
 * f32 and f64); P -> R sums back within 1 ulp (see the worker). */
Test(dtensor, replicate_to_partial_divides_on_1x3, .timeout = 60) {
  char seed[32];
  snprintf(seed, sizeof seed, "%lu", weft_test_seed(2718));
  const char *extra[] = {seed, "4096", NULL};
  cr_assert_eq(weft_test_mpiexec_args(3, WORKER("dtensor_worker"), "partition", 50, extra), 0);
}

Test(dtensor, redistribute_into_and_buffer_cache, .timeout = 60) {
  cr_assert_eq(weft_test_mpiexec(4, WORKER("dtensor_worker"), "into_cache", 50), 0);
}

/* ------------------------------------------------------- on the device
 *
 * The same properties with the meshes on WEFT_CUDA: every DTensor the
 * library makes (distribute, from_local, redistribute, ops, full_tensor)
 * is on the device; distribute takes `full` from the host or the device
 * (mixed across ranks too), from_local only from the device. */
Test(dtensor, redistribute_roundtrips_on_device_2_ranks, .timeout = 90) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  cr_assert_eq(run_cases_on_device(2, "property", "2", 60, 80), 0);
}
Test(dtensor, redistribute_roundtrips_on_device_4_ranks_1d_and_2x2, .timeout = 120) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  cr_assert_eq(run_cases_on_device(4, "property", "4,2x2", 60, 110), 0);
}
Test(dtensor, partial_reductions_are_exact_on_device_4_ranks, .timeout = 120) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  cr_assert_eq(run_cases_on_device(4, "partial", "4,2x2", 60, 110), 0);
}
Test(dtensor, propagation_matches_single_rank_on_device_2x2, .timeout = 90) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  cr_assert_eq(run_on_device(4, "ops", NULL, 80), 0);
}
Test(dtensor, fill_by_global_index_matches_full_fill_on_device, .timeout = 90) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  cr_assert_eq(run_on_device(4, "fill", NULL, 80), 0);
}
Test(dtensor, redistribute_into_and_buffer_cache_on_device, .timeout = 90) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  cr_assert_eq(run_on_device(4, "into_cache", NULL, 80), 0);
}
Test(dtensor, replicate_to_partial_divides_on_device_1x3, .timeout = 90) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  char seed[32];
  snprintf(seed, sizeof seed, "%lu", weft_test_seed(2718));
  const char *extra[] = {seed, "4096", NULL};
  cr_assert_eq(run_on_device(3, "partition", extra, 80), 0);
}
/* Bad input on a device mesh, plus: from_local of a host local fails on
 * every rank with a message naming both devices. */
Test(dtensor, bad_input_fails_on_every_rank_on_device, .timeout = 90) {
  WEFT_TEST_REQUIRE_CUDA_DEVICE();
  cr_assert_eq(run_on_device(4, "errors", NULL, 80), 0);
}
