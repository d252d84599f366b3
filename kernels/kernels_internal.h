/* Private to kernels/: hooks between the generic code and the backends. */
#ifndef WEFT_KERNELS_INTERNAL_H
#define WEFT_KERNELS_INTERNAL_H

#include "kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

void weft_mem_account_alloc_(weft_device dev, int64_t bytes);
void weft_mem_account_free_(weft_device dev, int64_t bytes);

/* CUDA backend hooks (kernels/cuda/runtime.cu; stubs returning
 * WEFT_ERR_UNSUPPORTED or false in CPU-only builds, see kernels/cuda_stub.c).
 * weft_alloc(WEFT_CUDA) and weft_free of a device block go through
 * weft_cuda_malloc / weft_cuda_free (cuda.h), which count the bytes. */
weft_status weft_cuda_alloc_(size_t bytes, void **out); /* uncounted block */
bool weft_cuda_owns_(const void *ptr);                  /* start of a live block? */
size_t weft_cuda_free_(void *ptr);                      /* returns its requested size */

#ifdef __cplusplus
}
#endif
#endif
