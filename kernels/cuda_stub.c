/* CPU-only builds: the CUDA hooks of kernels_internal.h, reporting clearly
 * that this build has no GPU backend. */
#include "kernels_internal.h"

weft_status weft_cuda_alloc_(size_t bytes, void **out) {
  (void)bytes;
  *out = NULL;
  return weft_error(WEFT_ERR_UNSUPPORTED,
                    "weft was built without the CUDA backend (meson -Dcuda=enabled needs nvcc)");
}
bool weft_cuda_owns_(const void *ptr) {
  (void)ptr;
  return false;
}
size_t weft_cuda_free_(void *ptr) {
  (void)ptr;
  return 0;
}
