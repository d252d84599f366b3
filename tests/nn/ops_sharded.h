/* tests/nn/ops_sharded.h — the sharding-rule property check the op
 * workers share (ops_shape_worker, ops_custom_worker): an op case run on
 * given placements against the same case all-Replicate on the same mesh
 * (and both against the double reference of ops_check.h). Worker-only: it
 * reports through worker.h's WCHECK. */
#ifndef WEFT_TESTS_NN_OPS_SHARDED_H
#define WEFT_TESTS_NN_OPS_SHARDED_H

#include "ops_check.h"

/* Runs c with input placements pl (nin x mesh ndim, in input order) and
 * output-grad placements gpl (NULL: Replicate) in the given mode and seed,
 * and checks outputs and input grads equal the all-Replicate run within
 * 1e-5, and (expect non-NULL) every output's placements equal expect.
 * Collective over mesh. */
void oc_against_replicate(const oc_case *c, weft_mesh *mesh, const weft_placement *pl,
                          const weft_placement *gpl, int mode, uint64_t seed,
                          const weft_placement *expect);
/* A mesh of the world: 1-D "tp" (shape[0]) or 2-D "dp" x "tp"; on WEFT_CUDA
 * in the worker's device mode (weft_worker_mesh_on_device). */
weft_mesh *oc_make_mesh(int ndim, const int *shape);

#endif
