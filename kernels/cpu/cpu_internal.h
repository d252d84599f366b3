/* kernels/cpu/cpu_internal.h — private to kernels/: the CPU backend's
 * members that kernels.h's generic entry points also reach (the tensor
 * operations, after their checks), and the CPU table (cpu/backend.c). The
 * raw-pointer layer kernels are layers.h's public functions. */
#ifndef WEFT_CPU_INTERNAL_H
#define WEFT_CPU_INTERNAL_H

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* kernels/alloc.c */
weft_status weft_cpu_alloc_(size_t bytes, void **out);
size_t weft_cpu_free_(void *ptr);
/* the host cache of large blocks (alloc.c's top says which) */
weft_status weft_cpu_cache_stats_(weft_cache_stats *out);
weft_status weft_cpu_empty_cache_(void);
/* kernels/tensor.c */
weft_status weft_cpu_copy_(weft_tensor *dst, const weft_tensor *src);
weft_status weft_cpu_fill_(weft_tensor *t, double v);
/* kernels/rng.c */
weft_status weft_cpu_fill_random_(weft_tensor *t, weft_random_kind kind, uint64_t seed,
                                  uint64_t key, const weft_rng_region *region, float a, float b);
/* kernels/cpu/gemm.c */
weft_status weft_cpu_gemm_(bool trans_a, bool trans_b, float alpha, const weft_tensor *a,
                           const weft_tensor *b, float beta, weft_tensor *c);
weft_status weft_cpu_sgemm_(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                            float alpha, const float *a, int64_t lda, const float *b, int64_t ldb,
                            float beta, float *c, int64_t ldc);
/* weft_sgemm's body on host pointers (its contract, kernels.h): bad sizes
 * set weft_last_error() and leave C untouched, no status. The CPU layer
 * kernels call it directly; weft_sgemm (kernels/ops.c) reaches it through
 * the CPU table's sgemm member (weft_cpu_sgemm_). */
void weft_cpu_sgemm_run_(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                         const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                         float *c, int64_t ldc);
/* kernels/cpu/gemm_dt.c: the gemm_dt member (backend.h) */
weft_status weft_cpu_gemm_dt_(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                              weft_dtype ab_dt, const void *a, int64_t lda, const void *b,
                              int64_t ldb, float beta, weft_dtype c_dt, void *c, int64_t ldc,
                              const void *bias);
/* kernels/cpu/attention.c: the attention_*_dt members (backend.h) */
weft_status weft_cpu_attention_forward_dt_(weft_dtype dt, void *out, float *lse, const void *q,
                                           const void *k, const void *v, int64_t B, int64_t T,
                                           int64_t H, int64_t Hkv, int64_t hd, bool causal,
                                           const weft_attention_rows *rows, void *scratch);
weft_status weft_cpu_attention_backward_dt_(weft_dtype dt, void *dq, void *dk, void *dv,
                                            const void *dout, const void *q, const void *k,
                                            const void *v, const float *lse, const void *out,
                                            int64_t B, int64_t T, int64_t H, int64_t Hkv,
                                            int64_t hd, bool causal,
                                            const weft_attention_rows *rows, void *scratch);
/* kernels/cpu/convert.c: contiguous conversions, element for element the
 * bits of weft_bf16_to_f32_i_ / weft_f32_to_bf16_i_ (vectorised) */
void weft_cpu_bf16_to_f32_(float *dst, const uint16_t *src, int64_t n);
void weft_cpu_f32_to_bf16_(uint16_t *dst, const float *src, int64_t n);
/* n elements of dtype dt (f32, bf16 or f16) to f32 and back (rounding to
 * nearest even as weft_tensor_copy): the tiles of the storage-dtype
 * kernels, which widen a tile, run the f32 kernel on it and round */
void weft_cpu_to_f32_(float *dst, const void *src, weft_dtype dt, int64_t n);
void weft_cpu_from_f32_(void *dst, weft_dtype dt, const float *src, int64_t n);
/* A heap copy of src's n elements (dtype dt) widened to f32, for free();
 * *out is NULL when src is NULL (the norms' weights and biases).
 * WEFT_ERR_OOM naming op. */
weft_status weft_cpu_widened_copy_(const char *op, weft_dtype dt, const void *src, int64_t n,
                                   float **out);
/* The storage-dtype layer kernels' driver: n elements of dtype dt (bf16
 * or f16) in tiles of at most 1024, split over the CPU threads; per tile
 * the nin inputs (and with read_out the nout outputs) are widened into f32
 * on the stack, fn computes the tile in f32 (at: the tile's first index,
 * for arrays of other dtypes in ctx; o[k]: output k, holding its widened
 * values with read_out), and the outputs are rounded once. nin, nout <= 3.
 * The result is fn's f32 bits on the widened values, rounded: fn must
 * compute each element independently of the tile bounds. */
typedef void (*weft_cpu_tile_fn)(void *ctx, int64_t at, int64_t m, float *const *o,
                                 const float *const *in);
void weft_cpu_tiled_(weft_dtype dt, int64_t n, int nout, void *const *out, bool read_out, int nin,
                     const void *const *in, weft_cpu_tile_fn fn, void *ctx);
/* The same for row kernels: rows [0, N) of C elements in chunks of grain
 * rows (the f32 kernel's own chunks, so chunk-indexed partial sums come
 * out the same), split over the CPU threads; per chunk the nin inputs
 * (and with read_out the outputs) are widened into one f32 block (heap),
 * fn computes rows [lo, hi) with in[k] and o[k] pointing at row lo (o[k]
 * NULL where out[k] is NULL), and the outputs are rounded once. nin, nout
 * <= 3. WEFT_ERR_OOM naming op when a chunk's block cannot be had. */
typedef void (*weft_cpu_rows_fn)(void *ctx, int64_t lo, int64_t hi, float *const *o,
                                 const float *const *in);
weft_status weft_cpu_rows_dt_(const char *op, weft_dtype dt, int64_t N, int64_t C, int64_t grain,
                              int nout, void *const *out, bool read_out, int nin,
                              const void *const *in, weft_cpu_rows_fn fn, void *ctx);
/* kernels/cpu/norm_act.c, pointwise.c: the _dt members (backend.h) */
weft_status weft_cpu_activation_forward_dt_(weft_activation act, weft_dtype dt, void *out,
                                            const void *inp, int64_t n);
weft_status weft_cpu_activation_backward_dt_(weft_activation act, weft_dtype dt, void *dinp,
                                             const void *dout, const void *inp, int64_t n,
                                             bool accumulate);
weft_status weft_cpu_swiglu_forward_dt_(weft_dtype dt, void *out, const void *a, const void *b,
                                        int64_t n);
weft_status weft_cpu_swiglu_backward_dt_(weft_dtype dt, void *da, void *db, const void *dout,
                                         const void *a, const void *b, int64_t n);
weft_status weft_cpu_layernorm_forward_dt_(weft_dtype dt, void *out, float *mean, float *rstd,
                                           const void *inp, const void *weight, const void *bias,
                                           int64_t N, int64_t C, float eps);
weft_status weft_cpu_layernorm_backward_dt_(weft_dtype dt, void *dinp, float *dweight, float *dbias,
                                            const void *dout, const void *inp, const void *weight,
                                            const float *mean, const float *rstd, int64_t N,
                                            int64_t C, bool accumulate_dinp);
weft_status weft_cpu_softmax_forward_dt_(weft_dtype dt, void *out, const void *inp, int64_t N,
                                         int64_t C);
weft_status weft_cpu_softmax_backward_dt_(weft_dtype dt, void *dinp, const void *dout,
                                          const void *out, int64_t N, int64_t C, bool accumulate);
weft_status weft_cpu_rmsnorm_forward_dt_(weft_dtype dt, void *out, float *rstd, const void *inp,
                                         const void *weight, int64_t N, int64_t C, float eps);
weft_status weft_cpu_rmsnorm_backward_dt_(weft_dtype dt, void *dinp, float *dweight,
                                          const void *dout, const void *inp, const void *weight,
                                          const float *rstd, int64_t N, int64_t C,
                                          bool accumulate_dinp);
/* kernels/cpu/cross_entropy.c: the cross_entropy_*_dt members (backend.h) */
weft_status weft_cpu_cross_entropy_forward_dt_(weft_dtype dt, double *loss, float *lse,
                                               const void *logits, const int32_t *targets,
                                               int64_t N, int64_t V);
weft_status weft_cpu_cross_entropy_backward_dt_(weft_dtype dt, void *dlogits, const void *logits,
                                                const float *lse, const int32_t *targets, int64_t N,
                                                int64_t V, float scale);
weft_status weft_cpu_cross_entropy_local_max_dt_(weft_dtype dt, float *row_max,
                                                 const void *logits_local, int64_t N, int64_t nv);
weft_status weft_cpu_cross_entropy_local_target_dt_(weft_dtype dt, float *target_logit,
                                                    const void *logits_local,
                                                    const int32_t *targets, int64_t N, int64_t v0,
                                                    int64_t nv);
weft_status weft_cpu_cross_entropy_local_sumexp_dt_(weft_dtype dt, float *sumexp,
                                                    const void *logits_local, const float *gmax,
                                                    int64_t N, int64_t nv);
weft_status weft_cpu_cross_entropy_backward_local_dt_(weft_dtype dt, void *dlogits_local,
                                                      const void *logits_local, const float *lse,
                                                      const int32_t *targets, int64_t N, int64_t v0,
                                                      int64_t nv, float scale);
/* kernels/cpu/embedding.c, rope.c: the embedding_range_*_dt and rope_*_dt
 * members (backend.h) */
weft_status weft_cpu_embedding_range_forward_dt_(weft_dtype dt, void *out, const int32_t *tokens,
                                                 const void *weight_local, int64_t N, int64_t v0,
                                                 int64_t nv, int64_t C);
weft_status weft_cpu_embedding_range_backward_dt_(weft_dtype dt, float *dweight_local,
                                                  const int32_t *tokens, const void *dout,
                                                  int64_t N, int64_t v0, int64_t nv, int64_t C);
weft_status weft_cpu_rope_forward_dt_(weft_dtype dt, void *out, const void *inp, const float *cosb,
                                      const float *sinb, int64_t max_pos, int64_t B, int64_t T,
                                      int64_t NH, int64_t hd, int64_t pos0);
weft_status weft_cpu_rope_backward_dt_(weft_dtype dt, void *dinp, const void *dout,
                                       const float *cosb, const float *sinb, int64_t max_pos,
                                       int64_t B, int64_t T, int64_t NH, int64_t hd, int64_t pos0);
weft_status weft_cpu_dropout_apply_dt_(weft_dtype dt, void *out, const void *inp,
                                       const float *uniform, float p, int64_t n);
/* kernels/cpu/ops.c */
weft_status weft_cpu_add_(weft_tensor *out, const weft_tensor *a, const weft_tensor *b);
weft_status weft_cpu_mul_(weft_tensor *out, const weft_tensor *a, const weft_tensor *b);
weft_status weft_cpu_scale_(weft_tensor *t, double alpha);
weft_status weft_cpu_div_scalar_(weft_tensor *t, double divisor);
weft_status weft_cpu_axpy_(weft_tensor *y, double alpha, const weft_tensor *x);
weft_status weft_cpu_reduce_(const weft_tensor *t, weft_reduce_kind kind, int dim,
                             weft_tensor *out);
weft_status weft_cpu_reduce_all_(const weft_tensor *t, weft_reduce_kind kind, double *out);

#ifdef __cplusplus
}
#endif
#endif /* WEFT_CPU_INTERNAL_H */
