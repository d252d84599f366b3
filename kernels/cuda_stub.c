/* CPU-only builds: every function of cuda.h and the CUDA hooks of
 * kernels_internal.h, reporting clearly that this build has no GPU backend
 * (weft_cuda_device_count() is 0, so callers can test for it first). */
#include <stddef.h>

#include "cuda.h"
#include "kernels_internal.h"

static weft_status no_backend(const char *func) {
  return weft_error(WEFT_ERR_UNSUPPORTED,
                    "%s: weft was built without the CUDA backend (meson -Dcuda=enabled needs "
                    "nvcc and cuBLAS)",
                    func);
}

weft_status weft_cuda_alloc_(size_t bytes, void **out) {
  (void)bytes;
  *out = NULL;
  return no_backend("weft_alloc(WEFT_CUDA)");
}
bool weft_cuda_owns_(const void *ptr) {
  (void)ptr;
  return false;
}
size_t weft_cuda_free_(void *ptr) {
  (void)ptr;
  return 0;
}

int weft_cuda_device_count(void) {
  return 0;
}
weft_status weft_cuda_init(int local_rank, int *device) {
  return no_backend("weft_cuda_init");
}
void weft_cuda_shutdown(void) {
}
int weft_cuda_current_device(void) {
  return -1;
}
weft_status weft_cuda_synchronize(void) {
  return no_backend("weft_cuda_synchronize");
}
bool weft_cuda_is_device_ptr(const void *ptr) {
  return false;
}
weft_status weft_cuda_malloc(size_t bytes, void **out) {
  if (out) *out = NULL;
  return no_backend("weft_cuda_malloc");
}
void weft_cuda_free(void *ptr) {
}
weft_status weft_cuda_event_record(weft_cuda_stream_id s, weft_cuda_event **ev) {
  return no_backend("weft_cuda_event_record");
}
weft_status weft_cuda_stream_wait_event(weft_cuda_stream_id s, weft_cuda_event *ev) {
  return no_backend("weft_cuda_stream_wait_event");
}
weft_status weft_cuda_event_synchronize(weft_cuda_event *ev) {
  return no_backend("weft_cuda_event_synchronize");
}
weft_status weft_cuda_event_elapsed_ms(weft_cuda_event *start, weft_cuda_event *end, float *ms) {
  return no_backend("weft_cuda_event_elapsed_ms");
}
void weft_cuda_event_destroy(weft_cuda_event *ev) {
}
void *weft_cuda_stream_handle(weft_cuda_stream_id s) {
  return NULL;
}
weft_status weft_cuda_memcpy(void *dst, const void *src, size_t bytes, weft_copy_kind kind) {
  return no_backend("weft_cuda_memcpy");
}
weft_status weft_cuda_memcpy_async(void *dst, const void *src, size_t bytes, weft_copy_kind kind, weft_cuda_stream_id s) {
  return no_backend("weft_cuda_memcpy_async");
}
weft_status weft_cuda_memset_zero(void *dst, size_t bytes) {
  return no_backend("weft_cuda_memset_zero");
}
weft_status weft_cuda_tensor_to(const weft_tensor *src, weft_device dev, weft_tensor **out) {
  return no_backend("weft_cuda_tensor_to");
}
weft_cuda_cache_stats weft_cuda_cache_get(void) {
  return (weft_cuda_cache_stats){0};
}
weft_status weft_cuda_empty_cache(void) {
  return no_backend("weft_cuda_empty_cache");
}
void weft_cuda_set_matmul_precision(weft_matmul_precision p) {
}
weft_matmul_precision weft_cuda_matmul_precision(void) {
  return WEFT_MATMUL_F32;
}
weft_status weft_cuda_sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
  return no_backend("weft_cuda_sgemm");
}
weft_status weft_cuda_sgemm_strided_batched(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda, int64_t stride_a, const float *b, int64_t ldb, int64_t stride_b, float beta, float *c, int64_t ldc, int64_t stride_c, int64_t count) {
  return no_backend("weft_cuda_sgemm_strided_batched");
}
weft_status weft_cuda_gemm_bf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t *a, int64_t lda, const uint16_t *b, int64_t ldb, float beta, float *c, int64_t ldc) {
  return no_backend("weft_cuda_gemm_bf16");
}
weft_status weft_cuda_embedding_forward(float *out, const int32_t *tokens, const float *weight, int64_t N, int64_t V, int64_t C) {
  return no_backend("weft_cuda_embedding_forward");
}
weft_status weft_cuda_embedding_backward(float *dweight, const int32_t *tokens, const float *dout, int64_t N, int64_t V, int64_t C) {
  return no_backend("weft_cuda_embedding_backward");
}
weft_status weft_cuda_embedding_range_forward(float *out, const int32_t *tokens, const float *weight_local, int64_t N, int64_t v0, int64_t nv, int64_t C) {
  return no_backend("weft_cuda_embedding_range_forward");
}
weft_status weft_cuda_embedding_range_backward(float *dweight_local, const int32_t *tokens, const float *dout, int64_t N, int64_t v0, int64_t nv, int64_t C) {
  return no_backend("weft_cuda_embedding_range_backward");
}
weft_status weft_cuda_linear_forward(float *out, const float *inp, const float *weight, const float *bias, int64_t N, int64_t IC, int64_t OC) {
  return no_backend("weft_cuda_linear_forward");
}
weft_status weft_cuda_linear_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp, const float *weight, int64_t N, int64_t IC, int64_t OC, bool accumulate_dinp, bool accumulate_dweight) {
  return no_backend("weft_cuda_linear_backward");
}
weft_status weft_cuda_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, int64_t N, int64_t C, float eps) {
  return no_backend("weft_cuda_rmsnorm_forward");
}
weft_status weft_cuda_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp, const float *weight, const float *rstd, int64_t N, int64_t C, bool accumulate_dinp) {
  return no_backend("weft_cuda_rmsnorm_backward");
}
weft_status weft_cuda_rope_tables(float *cosb, float *sinb, int64_t max_pos, int64_t hd, double theta) {
  return no_backend("weft_cuda_rope_tables");
}
weft_status weft_cuda_rope_forward(float *out, const float *inp, const float *cosb, const float *sinb, int64_t max_pos, int64_t B, int64_t T, int64_t NH, int64_t hd, int64_t pos0) {
  return no_backend("weft_cuda_rope_forward");
}
weft_status weft_cuda_rope_backward(float *dinp, const float *dout, const float *cosb, const float *sinb, int64_t max_pos, int64_t B, int64_t T, int64_t NH, int64_t hd, int64_t pos0) {
  return no_backend("weft_cuda_rope_backward");
}
size_t weft_cuda_attention_scratch_bytes(int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t hd) {
  return 0;
}
weft_status weft_cuda_attention_forward(float *out, float *lse, const float *q, const float *k, const float *v, int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t hd, void *scratch) {
  return no_backend("weft_cuda_attention_forward");
}
weft_status weft_cuda_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k, const float *v, const float *lse, const float *out, int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t hd, void *scratch) {
  return no_backend("weft_cuda_attention_backward");
}
weft_status weft_cuda_swiglu_forward(float *out, const float *a, const float *b, int64_t n) {
  return no_backend("weft_cuda_swiglu_forward");
}
weft_status weft_cuda_swiglu_backward(float *da, float *db, const float *dout, const float *a, const float *b, int64_t n) {
  return no_backend("weft_cuda_swiglu_backward");
}
weft_status weft_cuda_residual_forward(float *out, const float *a, const float *b, int64_t n) {
  return no_backend("weft_cuda_residual_forward");
}
weft_status weft_cuda_residual_backward(float *da, float *db, const float *dout, int64_t n) {
  return no_backend("weft_cuda_residual_backward");
}
weft_status weft_cuda_cross_entropy_forward(double *loss, float *lse, const float *logits, const int32_t *targets, int64_t N, int64_t V) {
  return no_backend("weft_cuda_cross_entropy_forward");
}
weft_status weft_cuda_cross_entropy_backward(float *dlogits, const float *logits, const float *lse, const int32_t *targets, int64_t N, int64_t V, float scale) {
  return no_backend("weft_cuda_cross_entropy_backward");
}
weft_status weft_cuda_cross_entropy_local_max(float *row_max, const float *logits_local, int64_t N, int64_t nv) {
  return no_backend("weft_cuda_cross_entropy_local_max");
}
weft_status weft_cuda_cross_entropy_local_target(float *target_logit, const float *logits_local, const int32_t *targets, int64_t N, int64_t v0, int64_t nv) {
  return no_backend("weft_cuda_cross_entropy_local_target");
}
weft_status weft_cuda_cross_entropy_local_sumexp(float *sumexp, const float *logits_local, const float *gmax, int64_t N, int64_t nv) {
  return no_backend("weft_cuda_cross_entropy_local_sumexp");
}
weft_status weft_cuda_cross_entropy_finish(double *loss, float *lse, const float *gmax, const float *gsum, const float *gtarget, int64_t N) {
  return no_backend("weft_cuda_cross_entropy_finish");
}
weft_status weft_cuda_cross_entropy_backward_local(float *dlogits_local, const float *logits_local, const float *lse, const int32_t *targets, int64_t N, int64_t v0, int64_t nv, float scale) {
  return no_backend("weft_cuda_cross_entropy_backward_local");
}
weft_status weft_cuda_adamw_multi(float *const *param, const float *const *grad, float *const *m, float *const *v, float *const *vmax, const int64_t *n, int ntensors, int64_t step, const weft_adamw_params *hp) {
  return no_backend("weft_cuda_adamw_multi");
}
weft_status weft_cuda_sumsq_multi(const float *const *x, const int64_t *n, int ntensors, double *out) {
  return no_backend("weft_cuda_sumsq_multi");
}
weft_status weft_cuda_scale_multi(float *const *x, const int64_t *n, int ntensors, float alpha) {
  return no_backend("weft_cuda_scale_multi");
}
weft_status weft_cuda_cast_f32_to_bf16(uint16_t *out, const float *in, int64_t n) {
  return no_backend("weft_cuda_cast_f32_to_bf16");
}
weft_status weft_cuda_cast_bf16_to_f32(float *out, const uint16_t *in, int64_t n) {
  return no_backend("weft_cuda_cast_bf16_to_f32");
}
