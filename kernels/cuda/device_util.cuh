/* kernels/cuda/device_util.cuh — private helpers shared by the .cu sources
 * (each includes it once; everything here is internal to that source). */
#ifndef WEFT_DEVICE_UTIL_CUH
#define WEFT_DEVICE_UTIL_CUH

#include <stdint.h>

#include "cuda.h"
#include "cuda_compat.h"

namespace {

/* The compute stream every kernel launches on. */
inline cudaStream_t compute_stream() {
  return (cudaStream_t)weft_cuda_stream_handle(WEFT_STREAM_COMPUTE);
}

/* Blocks for `work` items at `per_block` items per block, at least 1 and at
 * most `cap` (kernels loop over the rest with a grid stride). */
inline unsigned grid_for(int64_t work, int64_t per_block, int64_t cap = 65535) {
  int64_t g = (work + per_block - 1) / per_block;
  if (g < 1) g = 1;
  if (g > cap) g = cap;
  return (unsigned)g;
}

/* Four floats loaded or stored as one 16-byte access. */
struct alignas(16) f4 {
  float x, y, z, w;
};

}  // namespace

#endif /* WEFT_DEVICE_UTIL_CUH */
