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

/* Online log-sum-exp: (m, s) with s = sum exp(x - m) over the values seen,
 * m = -inf and s = 0 before the first. lse_push adds one value,
 * lse_merge another pair (a warp's lanes combine theirs with shuffles). */
__device__ inline void lse_push(float &m, float &s, float x) {
  if (x > m) {
    s = (m == -INFINITY ? 0.0f : s * expf(m - x)) + 1.0f;
    m = x;
  } else {
    s += expf(x - m);
  }
}
/* (m, s) with s = sum exp(x - m): merges two such pairs. */
__device__ inline void lse_merge(float &m, float &s, float m2, float s2) {
  if (m2 == -INFINITY) return;
  if (m == -INFINITY) {
    m = m2;
    s = s2;
    return;
  }
  if (m2 > m) {
    s = s * expf(m - m2) + s2;
    m = m2;
  } else {
    s += s2 * expf(m2 - m);
  }
}

}  // namespace

#endif /* WEFT_DEVICE_UTIL_CUH */
