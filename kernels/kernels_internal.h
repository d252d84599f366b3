/* Private to kernels/: hooks between the generic code and the backends. */
#ifndef WEFT_KERNELS_INTERNAL_H
#define WEFT_KERNELS_INTERNAL_H

#include <stdbool.h>

#include "kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

void weft_mem_account_alloc_(weft_device dev, int64_t bytes);
void weft_mem_account_free_(weft_device dev, int64_t bytes);

/* A 2-D tensor operand of weft_gemm as a row-major matrix: *ld its row
 * stride; *flip set when it is column-major (a transposed view), which a
 * GEMM handles by flipping the operand's transpose flag (not allowed for
 * C). WEFT_ERR_INVALID naming func and the tensor when neither. Every
 * backend's gemm member reads its operands this way (kernels/cpu/gemm.c). */
weft_status weft_gemm_layout_(const char *func, const weft_tensor *t, const char *name,
                              bool allow_flip, int64_t *ld, bool *flip);

/* weft_gemm of bf16 / f16 tensors on any device, as every backend's gemm
 * member does it: operands converted (any strides) to f32 temporaries on
 * C's device, one f32 GEMM there (weft_backend_sgemm), C rounded back once.
 * Arguments checked by weft_gemm (kernels/ops.c). */
weft_status weft_gemm_via_f32_(bool trans_a, bool trans_b, float alpha, const weft_tensor *a,
                               const weft_tensor *b, float beta, weft_tensor *c);

/* Uniform fills on [lo, hi): the largest value of dtype dt below hi (its
 * bytes in out), which replaces a draw that rounds up to hi; true when
 * that value is >= lo (else keep the rounded draw). kernels/rng.c. */
bool weft_rng_uniform_below_(weft_dtype dt, float lo, float hi, unsigned char out[8]);

#ifdef __cplusplus
}
#endif
#endif
