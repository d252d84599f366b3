/* tests/nn/nn_util.h — helpers for the nn worker cases. Golden data
 * loading (expected.json, llm.c token file, safetensors) and error norms
 * are shared with the tp suite in tests/harness/golden.h. */
#ifndef WEFT_TEST_NN_UTIL_H
#define WEFT_TEST_NN_UTIL_H

#include "golden.h"
#include "nn.h"

/* Builds a 1-D mesh "tp" of the world's size (on WEFT_CUDA in the
 * worker's device mode: weft_worker_mesh_on_device). */
weft_status mesh_world(weft_mesh **out);

#endif
