/* tests/fsdp/test_diverge.c — a rank that skips its backward (see
 * diverge_worker.c): named by WEFT_DEBUG=1, bounded by WEFT_TIMEOUT on every
 * rank without it. */
#include <criterion/criterion.h>

#include "harness.h"

#define DIVERGE_WORKER WORKER("diverge_worker")

Test(fsdp_diverge, skipped_backward_is_named_on_both_ranks_under_weft_debug, .timeout = 90) {
  const char *env[] = {"WEFT_DEBUG=1", "WEFT_TIMEOUT=30", NULL};
  cr_assert_eq(weft_test_mpiexec_env(2, DIVERGE_WORKER, "skip_backward_debug", 80, env), 0);
}

Test(fsdp_diverge, skipped_backward_ends_on_every_rank_within_weft_timeout, .timeout = 90) {
  const char *env[] = {"WEFT_DEBUG=0", "WEFT_TIMEOUT=4", NULL};
  cr_assert_eq(weft_test_mpiexec_env(2, DIVERGE_WORKER, "skip_backward_timeout", 60, env), 0);
}
