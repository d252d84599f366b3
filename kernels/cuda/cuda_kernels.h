/* kernels/cuda/cuda_kernels.h — private to the CUDA backend: its compute
 * members, defined in the .cu sources and put in the WEFT_CUDA table by
 * backend.cu. Each has the argument list of the backend.h member of the same
 * name (weft_cuda_<op> is member <op>), and the semantics, shapes and
 * formulas of the CPU kernel of that name (layers.h, kernels.h); pointers
 * are device pointers, work is queued on the compute stream. Errors name
 * the operation as the CPU's do (arg_checks.h's weft_op_name_). Every entry
 * returns WEFT_ERR_NO_DEVICE before weft_device_init(WEFT_CUDA, ...). */
#ifndef WEFT_CUDA_KERNELS_H
#define WEFT_CUDA_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- tensor operations (tensor.cu; arguments checked by kernels.h's
 * entry points) */
weft_status weft_cuda_copy(weft_tensor *dst, const weft_tensor *src);
weft_status weft_cuda_fill(weft_tensor *t, double v);
weft_status weft_cuda_fill_random(weft_tensor *t, weft_random_kind kind, uint64_t seed,
                                  uint64_t key, const weft_rng_region *region, float a, float b);
weft_status weft_cuda_gemm(bool trans_a, bool trans_b, float alpha, const weft_tensor *a,
                           const weft_tensor *b, float beta, weft_tensor *c);
weft_status weft_cuda_add(weft_tensor *out, const weft_tensor *a, const weft_tensor *b);
weft_status weft_cuda_mul(weft_tensor *out, const weft_tensor *a, const weft_tensor *b);
weft_status weft_cuda_scale(weft_tensor *t, double alpha);
weft_status weft_cuda_div_scalar(weft_tensor *t, double divisor);
weft_status weft_cuda_axpy(weft_tensor *y, double alpha, const weft_tensor *x);
weft_status weft_cuda_reduce(const weft_tensor *t, weft_reduce_kind kind, int dim,
                             weft_tensor *out);
weft_status weft_cuda_reduce_all(const weft_tensor *t, weft_reduce_kind kind, double *out);

/* ---- GEMMs (gemm.cu: cuBLAS, row-major) and the matmul precision */
weft_status weft_cuda_set_matmul_precision_(weft_matmul_precision p);
weft_matmul_precision weft_cuda_matmul_precision_(void);
weft_status weft_cuda_sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                            float alpha, const float *a, int64_t lda, const float *b, int64_t ldb,
                            float beta, float *c, int64_t ldc);
weft_status weft_cuda_sgemm_strided_batched(bool trans_a, bool trans_b, int64_t m, int64_t n,
                                            int64_t k, float alpha, const float *a, int64_t lda,
                                            int64_t stride_a, const float *b, int64_t ldb,
                                            int64_t stride_b, float beta, float *c, int64_t ldc,
                                            int64_t stride_c, int64_t count);
weft_status weft_cuda_gemm_bf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                                float alpha, const uint16_t *a, int64_t lda, const uint16_t *b,
                                int64_t ldb, float beta, float *c, int64_t ldc);
/* n-element casts between device arrays, rounding as weft_f32_to_bf16 */
weft_status weft_cuda_cast_f32_to_bf16(uint16_t *out, const float *in, int64_t n);
weft_status weft_cuda_cast_bf16_to_f32(float *out, const uint16_t *in, int64_t n);

/* ---- layer kernels (layers.cu), forward next to backward */
weft_status weft_cuda_embedding_forward(float *out, const int32_t *tokens, const float *weight,
                                        int64_t N, int64_t V, int64_t C);
weft_status weft_cuda_embedding_backward(float *dweight, const int32_t *tokens, const float *dout,
                                         int64_t N, int64_t V, int64_t C);
weft_status weft_cuda_embedding_range_forward(float *out, const int32_t *tokens,
                                              const float *weight_local, int64_t N, int64_t v0,
                                              int64_t nv, int64_t C);
weft_status weft_cuda_embedding_range_backward(float *dweight_local, const int32_t *tokens,
                                               const float *dout, int64_t N, int64_t v0, int64_t nv,
                                               int64_t C);
weft_status weft_cuda_linear_forward(float *out, const float *inp, const float *weight,
                                     const float *bias, int64_t N, int64_t IC, int64_t OC);
weft_status weft_cuda_linear_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                                      const float *inp, const float *weight, int64_t N, int64_t IC,
                                      int64_t OC, bool accumulate_dinp, bool accumulate_dweight);
weft_status weft_cuda_rmsnorm_forward(float *out, float *rstd, const float *inp,
                                      const float *weight, int64_t N, int64_t C, float eps);
weft_status weft_cuda_rmsnorm_backward(float *dinp, float *dweight, const float *dout,
                                       const float *inp, const float *weight, const float *rstd,
                                       int64_t N, int64_t C, bool accumulate_dinp);
/* computed on the host (weft_rope_tables) and copied */
weft_status weft_cuda_rope_tables(float *cosb, float *sinb, int64_t max_pos, int64_t hd,
                                  double theta);
weft_status weft_cuda_rope_forward(float *out, const float *inp, const float *cosb,
                                   const float *sinb, int64_t max_pos, int64_t B, int64_t T,
                                   int64_t NH, int64_t hd, int64_t pos0);
weft_status weft_cuda_rope_backward(float *dinp, const float *dout, const float *cosb,
                                    const float *sinb, int64_t max_pos, int64_t B, int64_t T,
                                    int64_t NH, int64_t hd, int64_t pos0);
weft_status weft_cuda_swiglu_forward(float *out, const float *a, const float *b, int64_t n);
weft_status weft_cuda_swiglu_backward(float *da, float *db, const float *dout, const float *a,
                                      const float *b, int64_t n);
weft_status weft_cuda_residual_forward(float *out, const float *a, const float *b, int64_t n);
weft_status weft_cuda_residual_backward(float *da, float *db, const float *dout, int64_t n);
/* *loss is host memory (the call waits for it) */
weft_status weft_cuda_cross_entropy_forward(double *loss, float *lse, const float *logits,
                                            const int32_t *targets, int64_t N, int64_t V);
weft_status weft_cuda_cross_entropy_backward(float *dlogits, const float *logits, const float *lse,
                                             const int32_t *targets, int64_t N, int64_t V,
                                             float scale);
weft_status weft_cuda_cross_entropy_local_max(float *row_max, const float *logits_local, int64_t N,
                                              int64_t nv);
weft_status weft_cuda_cross_entropy_local_target(float *target_logit, const float *logits_local,
                                                 const int32_t *targets, int64_t N, int64_t v0,
                                                 int64_t nv);
weft_status weft_cuda_cross_entropy_local_sumexp(float *sumexp, const float *logits_local,
                                                 const float *gmax, int64_t N, int64_t nv);
weft_status weft_cuda_cross_entropy_finish(double *loss, float *lse, const float *gmax,
                                           const float *gsum, const float *gtarget, int64_t N);
weft_status weft_cuda_cross_entropy_backward_local(float *dlogits_local, const float *logits_local,
                                                   const float *lse, const int32_t *targets,
                                                   int64_t N, int64_t v0, int64_t nv, float scale);

/* ---- LayerNorm, activations, softmax, dropout (norm_act.cu; backend
 * version 2). Deterministic: row sums in a fixed tree, the weight and bias
 * gradients as per-column sums over row chunks added in order (no atomics) */
weft_status weft_cuda_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                                        const float *weight, const float *bias, int64_t N,
                                        int64_t C, float eps);
weft_status weft_cuda_layernorm_backward(float *dinp, float *dweight, float *dbias,
                                         const float *dout, const float *inp, const float *weight,
                                         const float *mean, const float *rstd, int64_t N, int64_t C,
                                         bool accumulate_dinp);
weft_status weft_cuda_activation_forward(weft_activation act, float *out, const float *inp,
                                         int64_t n);
weft_status weft_cuda_activation_backward(weft_activation act, float *dinp, const float *dout,
                                          const float *inp, int64_t n, bool accumulate);
weft_status weft_cuda_activation_forward_dt(weft_activation act, weft_dtype dt, void *out,
                                            const void *inp, int64_t n);
weft_status weft_cuda_activation_backward_dt(weft_activation act, weft_dtype dt, void *dinp,
                                             const void *dout, const void *inp, int64_t n,
                                             bool accumulate);
weft_status weft_cuda_swiglu_forward_dt(weft_dtype dt, void *out, const void *a, const void *b,
                                        int64_t n);
weft_status weft_cuda_swiglu_backward_dt(weft_dtype dt, void *da, void *db, const void *dout,
                                         const void *a, const void *b, int64_t n);
weft_status weft_cuda_layernorm_forward_dt(weft_dtype dt, void *out, float *mean, float *rstd,
                                           const void *inp, const void *weight, const void *bias,
                                           int64_t N, int64_t C, float eps);
weft_status weft_cuda_layernorm_backward_dt(weft_dtype dt, void *dinp, float *dweight, float *dbias,
                                            const void *dout, const void *inp, const void *weight,
                                            const float *mean, const float *rstd, int64_t N,
                                            int64_t C, bool accumulate_dinp);
weft_status weft_cuda_softmax_forward_dt(weft_dtype dt, void *out, const void *inp, int64_t N,
                                         int64_t C);
weft_status weft_cuda_softmax_backward_dt(weft_dtype dt, void *dinp, const void *dout,
                                          const void *out, int64_t N, int64_t C, bool accumulate);
weft_status weft_cuda_rmsnorm_forward_dt(weft_dtype dt, void *out, float *rstd, const void *inp,
                                         const void *weight, int64_t N, int64_t C, float eps);
weft_status weft_cuda_rmsnorm_backward_dt(weft_dtype dt, void *dinp, float *dweight,
                                          const void *dout, const void *inp, const void *weight,
                                          const float *rstd, int64_t N, int64_t C,
                                          bool accumulate_dinp);
weft_status weft_cuda_cross_entropy_forward_dt(weft_dtype dt, double *loss, float *lse,
                                               const void *logits, const int32_t *targets,
                                               int64_t N, int64_t V);
weft_status weft_cuda_cross_entropy_backward_dt(weft_dtype dt, void *dlogits, const void *logits,
                                                const float *lse, const int32_t *targets, int64_t N,
                                                int64_t V, float scale);
weft_status weft_cuda_cross_entropy_local_max_dt(weft_dtype dt, float *row_max,
                                                 const void *logits_local, int64_t N, int64_t nv);
weft_status weft_cuda_cross_entropy_local_target_dt(weft_dtype dt, float *target_logit,
                                                    const void *logits_local,
                                                    const int32_t *targets, int64_t N, int64_t v0,
                                                    int64_t nv);
weft_status weft_cuda_cross_entropy_local_sumexp_dt(weft_dtype dt, float *sumexp,
                                                    const void *logits_local, const float *gmax,
                                                    int64_t N, int64_t nv);
weft_status weft_cuda_cross_entropy_backward_local_dt(weft_dtype dt, void *dlogits_local,
                                                      const void *logits_local, const float *lse,
                                                      const int32_t *targets, int64_t N, int64_t v0,
                                                      int64_t nv, float scale);
weft_status weft_cuda_embedding_range_forward_dt(weft_dtype dt, void *out, const int32_t *tokens,
                                                 const void *weight_local, int64_t N, int64_t v0,
                                                 int64_t nv, int64_t C);
weft_status weft_cuda_embedding_range_backward_dt(weft_dtype dt, float *dweight_local,
                                                  const int32_t *tokens, const void *dout,
                                                  int64_t N, int64_t v0, int64_t nv, int64_t C);
weft_status weft_cuda_rope_forward_dt(weft_dtype dt, void *out, const void *inp, const float *cosb,
                                      const float *sinb, int64_t max_pos, int64_t B, int64_t T,
                                      int64_t NH, int64_t hd, int64_t pos0);
weft_status weft_cuda_rope_backward_dt(weft_dtype dt, void *dinp, const void *dout,
                                       const float *cosb, const float *sinb, int64_t max_pos,
                                       int64_t B, int64_t T, int64_t NH, int64_t hd, int64_t pos0);
weft_status weft_cuda_gemm_dt(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                              float alpha, weft_dtype ab_dt, const void *a, int64_t lda,
                              const void *b, int64_t ldb, float beta, weft_dtype c_dt, void *c,
                              int64_t ldc, const void *bias);
weft_status weft_cuda_attention_forward_dt(weft_dtype dt, void *out, float *lse, const void *q,
                                           const void *k, const void *v, int64_t B, int64_t T,
                                           int64_t H, int64_t Hkv, int64_t hd, bool causal,
                                           const weft_attention_rows *rows, void *scratch);
weft_status weft_cuda_attention_backward_dt(weft_dtype dt, void *dq, void *dk, void *dv,
                                            const void *dout, const void *q, const void *k,
                                            const void *v, const float *lse, const void *out,
                                            int64_t B, int64_t T, int64_t H, int64_t Hkv,
                                            int64_t hd, bool causal,
                                            const weft_attention_rows *rows, void *scratch);
weft_status weft_cuda_dropout_apply_dt(weft_dtype dt, void *out, const void *inp,
                                       const float *uniform, float p, int64_t n);
weft_status weft_cuda_softmax_forward(float *out, const float *inp, int64_t N, int64_t C);
weft_status weft_cuda_softmax_backward(float *dinp, const float *dout, const float *out, int64_t N,
                                       int64_t C, bool accumulate);
weft_status weft_cuda_dropout_apply(float *out, const float *inp, const float *uniform, float p,
                                    int64_t n);

/* ---- attention (attention.cu): memory efficient, scores exist only for
 * one block of query rows at a time; scratch is device memory of
 * weft_cuda_attention_scratch_bytes bytes */
size_t weft_cuda_attention_scratch_bytes(int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t hd);
weft_status weft_cuda_attention_forward(float *out, float *lse, const float *q, const float *k,
                                        const float *v, int64_t B, int64_t T, int64_t H,
                                        int64_t Hkv, int64_t hd, bool causal, void *scratch);
weft_status weft_cuda_attention_backward(float *dq, float *dk, float *dv, const float *dout,
                                         const float *q, const float *k, const float *v,
                                         const float *lse, const float *out, int64_t B, int64_t T,
                                         int64_t H, int64_t Hkv, int64_t hd, bool causal,
                                         void *scratch);

/* ---- multi-tensor optimizer steps (optim.cu), one launch each */
weft_status weft_cuda_adamw_multi(float *const *param, const float *const *grad, float *const *m,
                                  float *const *v, float *const *vmax, const int64_t *n,
                                  int ntensors, int64_t step, const weft_adamw_params *hp);
weft_status weft_cuda_sgd_multi(float *const *param, const float *const *grad, float *const *buf,
                                const int64_t *n, int ntensors, int64_t step,
                                const weft_sgd_params *hp);
/* out: host array of ntensors (the call waits for it) */
weft_status weft_cuda_sumsq_multi(const float *const *x, const int64_t *n, int ntensors,
                                  double *out);
weft_status weft_cuda_scale_multi(float *const *x, const int64_t *n, int ntensors, float alpha);

/* ---- flat buffers (flat.cu), one launch each */
weft_status weft_cuda_flat_pack(void *flat, weft_dtype flat_dtype, const weft_flat_piece *pieces,
                                int npieces);
weft_status weft_cuda_flat_split(const void *flat, weft_dtype flat_dtype,
                                 const weft_flat_piece *pieces, int npieces);
weft_status weft_cuda_flat_accumulate(const void *flat, weft_dtype flat_dtype,
                                      const weft_flat_piece *pieces, int npieces, float scale);

#ifdef __cplusplus
}
#endif
#endif /* WEFT_CUDA_KERNELS_H */
