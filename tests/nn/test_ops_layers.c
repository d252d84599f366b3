/* tests/nn/test_ops_layers.c — the layer ops of autograd.h (embedding,
 * norms, activations, swiglu, softmax, rope, sdpa, cross_entropy, dropout;
 * nn/ops_layers.c) against double-precision references and finite
 * differences. The cases need a mesh, so they run in ops_layers_worker
 * under mpiexec (see tests/harness/harness.h). */
#include <criterion/criterion.h>

#include "harness.h"

#define OPS_WORKER WORKER("ops_layers_worker")

Test(nn_ops_layers, one_rank_forward_backward_dropout_and_bad_input, .timeout = 120) {
  cr_assert_eq(weft_test_mpiexec(1, OPS_WORKER, "ops1", 100), 0);
}

Test(nn_ops_layers, two_ranks_sharded_inputs_give_the_unsharded_results, .timeout = 120) {
  cr_assert_eq(weft_test_mpiexec(2, OPS_WORKER, "ops2", 100), 0);
}
