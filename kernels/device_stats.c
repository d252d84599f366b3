/* kernels/device_stats.c — the device backend's counters (weft_device_stats,
 * backend.h): kernels/cuda bumps them where it makes the call (WEFT_LAUNCH
 * in cuda_compat.h, the GEMMs of gemm.cu, the runtime's syncs, driver
 * allocations and copies in runtime.cu), the same code in the real and the
 * emulated build. Built in every build, so that a build without the CUDA
 * backend reads zeros. */
#include <stdatomic.h>

#include "backend_internal.h"

static _Atomic int64_t counters[WEFT_DEV_COUNTERS_];

void weft_device_count_(weft_device_counter_ c, int64_t n) {
  atomic_fetch_add_explicit(&counters[c], n, memory_order_relaxed);
}

void weft_device_count_launch_(void) { weft_device_count_(WEFT_DEV_LAUNCHES_, 1); }

weft_device_stats weft_device_stats_get(void) {
  int64_t v[WEFT_DEV_COUNTERS_];
  for (int i = 0; i < WEFT_DEV_COUNTERS_; i++)
    v[i] = atomic_load_explicit(&counters[i], memory_order_relaxed);
  weft_device_stats s = {v[WEFT_DEV_LAUNCHES_], v[WEFT_DEV_BLAS_],      v[WEFT_DEV_HOST_SYNCS_],
                         v[WEFT_DEV_MALLOCS_],  v[WEFT_DEV_BYTES_H2D_], v[WEFT_DEV_BYTES_D2H_]};
  return s;
}
