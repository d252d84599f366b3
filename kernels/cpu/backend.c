/* The CPU backend's table (backend.h): host memory through weft_alloc's
 * header scheme, the layer kernels of layers.h (cpu/: embedding.c,
 * linear.c, rmsnorm.c, rope.c, attention.c, pointwise.c, cross_entropy.c,
 * optim.c, norm_act.c), the tensor operations of kernels.h, and the multi-tensor
 * and flat-buffer operations here (loops over the single-tensor kernels, so
 * their numbers are those kernels').
 * Everything is synchronous: no streams, no events. */
#include <stdlib.h>
#include <string.h>

#include "arg_checks.h"
#include "backend_internal.h"
#include "cpu_internal.h"
#include "kernels.h"
#include "layers.h"
#include "tensor_internal.h"

/* ------------------------------------------------------------------ memory */

static int cpu_device_count(void) { return 1; }
static weft_status cpu_synchronize(void) { return WEFT_OK; }

static weft_status cpu_memset(void *dst, int value, size_t bytes) {
  if (bytes == 0) return WEFT_OK;
  if (!dst) return weft_error_at(WEFT_ERR_INVALID, "memset", "dst is NULL");
  memset(dst, value, bytes);
  return WEFT_OK;
}

static weft_status cpu_memcpy(void *dst, const void *src, size_t bytes, weft_copy_kind kind) {
  if ((unsigned)kind > WEFT_COPY_D2D)
    return weft_error_at(WEFT_ERR_INVALID, "memcpy", "unknown copy kind %d", (int)kind);
  if (bytes == 0) return WEFT_OK;
  if (!dst || !src) return weft_error_at(WEFT_ERR_INVALID, "memcpy", "NULL pointer");
  const char *d = dst, *s = src;
  if (d < s + bytes && s < d + bytes && d != s)
    return weft_error_at(WEFT_ERR_INVALID, "memcpy", "the %zu bytes at %p and %p overlap", bytes,
                         dst, src);
  memcpy(dst, src, bytes);
  return WEFT_OK;
}

/* ---------------------------------------------------------- raw GEMMs */

static weft_status cpu_sgemm_strided_batched(bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                                             float alpha, const float *a, int64_t lda,
                                             int64_t stride_a, const float *b, int64_t ldb,
                                             int64_t stride_b, float beta, float *c, int64_t ldc,
                                             int64_t stride_c, int64_t count) {
  WEFT_CHECK(weft_check_gemm_dims_("sgemm_strided_batched", ta, tb, m, n, k, lda, ldb, ldc));
  if (count < 0)
    return weft_error_at(WEFT_ERR_INVALID, "sgemm_strided_batched", "negative batch count %lld",
                         (long long)count);
  if (stride_a < 0 || stride_b < 0 || stride_c < 0)
    return weft_error_at(WEFT_ERR_INVALID, "sgemm_strided_batched",
                         "negative batch stride: stride_a %lld, stride_b %lld, stride_c %lld",
                         (long long)stride_a, (long long)stride_b, (long long)stride_c);
  if (count > 1 && m > 0 && n > 0 && stride_c < (m - 1) * ldc + n)
    return weft_error_at(WEFT_ERR_INVALID, "sgemm_strided_batched",
                         "stride_c %lld < %lld: the %lld x %lld C matrices (ldc %lld) of the "
                         "batch would overlap",
                         (long long)stride_c, (long long)((m - 1) * ldc + n), (long long)m,
                         (long long)n, (long long)ldc);
  for (int64_t i = 0; i < count; i++)
    WEFT_CHECK(weft_cpu_sgemm_(ta, tb, m, n, k, alpha, a ? a + i * stride_a : NULL, lda,
                               b ? b + i * stride_b : NULL, ldb, beta, c ? c + i * stride_c : NULL,
                               ldc));
  return WEFT_OK;
}

/* bf16 operands widened to f32 (exact), then one f32 GEMM: fp32 products
 * and accumulation, as the device's bf16 GEMM. */
static weft_status cpu_gemm_bf16(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                                 const uint16_t *a, int64_t lda, const uint16_t *b, int64_t ldb,
                                 float beta, float *c, int64_t ldc) {
  WEFT_CHECK(weft_check_gemm_dims_("gemm_bf16", ta, tb, m, n, k, lda, ldb, ldc));
  if (m == 0 || n == 0) return WEFT_OK;
  if (!c || (k > 0 && alpha != 0.0f && (!a || !b)))
    return weft_error_at(WEFT_ERR_INVALID, "gemm_bf16", "NULL matrix pointer");
  if (k == 0 || alpha == 0.0f)
    return weft_cpu_sgemm_(ta, tb, m, n, k, alpha, NULL, lda, NULL, ldb, beta, c, ldc);
  const int64_t ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
  float *fa = NULL, *fb = NULL;
  weft_status st = weft_alloc(WEFT_CPU, (size_t)(ar * ac) * sizeof(float), (void **)&fa);
  if (!st) st = weft_alloc(WEFT_CPU, (size_t)(br * bc) * sizeof(float), (void **)&fb);
  if (!st) {
    for (int64_t r = 0; r < ar; r++)
      for (int64_t j = 0; j < ac; j++) fa[r * ac + j] = weft_bf16_to_f32(a[r * lda + j]);
    for (int64_t r = 0; r < br; r++)
      for (int64_t j = 0; j < bc; j++) fb[r * bc + j] = weft_bf16_to_f32(b[r * ldb + j]);
    st = weft_cpu_sgemm_(ta, tb, m, n, k, alpha, fa, ac, fb, bc, beta, c, ldc);
  }
  weft_free(fa);
  weft_free(fb);
  return st;
}

/* ------------------------------------------------------------ attention */

static size_t cpu_attention_scratch_bytes(int64_t B, int64_t T, int64_t H, int64_t Hkv,
                                          int64_t hd) {
  (void)B, (void)H, (void)Hkv, (void)hd;
  return (size_t)weft_attention_scratch_floats(T) * sizeof(float);
}

static weft_status cpu_attention_forward(float *out, float *lse, const float *q, const float *k,
                                         const float *v, int64_t B, int64_t T, int64_t H,
                                         int64_t Hkv, int64_t hd, bool causal, void *scratch) {
  return weft_attention_forward(out, lse, q, k, v, B, T, H, Hkv, hd, causal, scratch);
}

/* out is not read here (the CPU recomputes rowsum(P * dP) per block), but
 * it is part of the one argument list: it is checked where every backend
 * checks it (after lse, before scratch), so a NULL out fails alike. */
static weft_status cpu_attention_backward(float *dq, float *dk, float *dv, const float *dout,
                                          const float *q, const float *k, const float *v,
                                          const float *lse, const float *out, int64_t B, int64_t T,
                                          int64_t H, int64_t Hkv, int64_t hd, bool causal,
                                          void *scratch) {
  const bool sizes_ok =
      B >= 0 && T >= 0 && H >= 0 && Hkv >= 0 && hd >= 0 && !(H > 0 && (Hkv == 0 || H % Hkv != 0));
  const int64_t nq = B * T * H * hd, nkv = B * T * Hkv * hd;
  const bool earlier_ok = (dq || !nq) && (dk || !nkv) && (dv || !nkv) && (dout || !nq) &&
                          (q || !nq) && (k || !nkv) && (v || !nkv) && (lse || B * H * T == 0);
  if (sizes_ok && earlier_ok) CHECK_PTR_AT("attention_backward", out, nq);
  return weft_attention_backward(dq, dk, dv, dout, q, k, v, lse, B, T, H, Hkv, hd, causal, scratch);
}

/* ------------------------------------------------------ optimizer steps */

static weft_status cpu_adamw_multi(float *const *param, const float *const *grad, float *const *m,
                                   float *const *v, float *const *vmax, const int64_t *n,
                                   int ntensors, int64_t step, const weft_adamw_params *hp) {
  WEFT_CHECK_ADAMW_HP_("adamw_multi", hp, step);
  const char *names[5] = {"param", "grad", "m", "v", "vmax"};
  const void *const *arrays[5] = {(const void *const *)param, (const void *const *)grad,
                                  (const void *const *)m, (const void *const *)v,
                                  (const void *const *)vmax};
  const bool required[5] = {true, true, true, true, hp->amsgrad};
  WEFT_CHECK(weft_check_multi_("adamw_multi", ntensors, n, 5, names, arrays, required));
  for (int i = 0; i < ntensors; i++)
    if (n[i] > 0)
      WEFT_CHECK(
          weft_adamw_step(param[i], grad[i], m[i], v[i], vmax ? vmax[i] : NULL, n[i], step, hp));
  return WEFT_OK;
}

static weft_status cpu_sgd_multi(float *const *param, const float *const *grad, float *const *buf,
                                 const int64_t *n, int ntensors, int64_t step,
                                 const weft_sgd_params *hp) {
  WEFT_CHECK_SGD_HP_("sgd_multi", hp, step);
  const char *names[3] = {"param", "grad", "buf"};
  const void *const *arrays[3] = {(const void *const *)param, (const void *const *)grad,
                                  (const void *const *)buf};
  const bool required[3] = {true, true, hp->momentum != 0.0f};
  WEFT_CHECK(weft_check_multi_("sgd_multi", ntensors, n, 3, names, arrays, required));
  for (int i = 0; i < ntensors; i++)
    if (n[i] > 0) WEFT_CHECK(weft_sgd_step(param[i], grad[i], buf ? buf[i] : NULL, n[i], step, hp));
  return WEFT_OK;
}

static weft_status cpu_sumsq_multi(const float *const *x, const int64_t *n, int ntensors,
                                   double *out) {
  const char *names[1] = {"x"};
  const void *const *arrays[1] = {(const void *const *)x};
  const bool required[1] = {true};
  WEFT_CHECK(weft_check_multi_("sumsq_multi", ntensors, n, 1, names, arrays, required));
  if (ntensors > 0 && !out) return weft_error_at(WEFT_ERR_INVALID, "sumsq_multi", "out is NULL");
  for (int i = 0; i < ntensors; i++) out[i] = n[i] > 0 ? weft_sumsq(x[i], n[i]) : 0.0;
  return WEFT_OK;
}

static weft_status cpu_scale_multi(float *const *x, const int64_t *n, int ntensors, float alpha) {
  const char *names[1] = {"x"};
  const void *const *arrays[1] = {(const void *const *)x};
  const bool required[1] = {true};
  WEFT_CHECK(weft_check_multi_("scale_multi", ntensors, n, 1, names, arrays, required));
  for (int i = 0; i < ntensors; i++)
    if (n[i] > 0) weft_scale_f32(x[i], n[i], alpha);
  return WEFT_OK;
}

/* -------------------------------------------------------- flat buffers */

/* dst[0..n) = src[0..n) between float dtypes (f32, bf16, f16): the
 * conversions weft_tensor_copy runs for contiguous tensors (convert.c). */
static void convert(void *dst, weft_dtype ddt, const void *src, weft_dtype sdt, int64_t n) {
  if (n <= 0) return;
  if (ddt == sdt) {
    memcpy(dst, src, (size_t)n * weft_dtype_size(ddt));
  } else if (sdt == WEFT_F32) {
    weft_cpu_from_f32_(dst, ddt, src, n);
  } else if (ddt == WEFT_F32) {
    weft_cpu_to_f32_(dst, src, sdt, n);
  } else { /* bf16 <-> f16: through f32, as weft_tensor_copy */
    const size_t ds = weft_dtype_size(ddt), ss = weft_dtype_size(sdt);
    for (int64_t i = 0; i < n; i++)
      weft_convert_elem_((char *)dst + (size_t)i * ds, ddt, (const char *)src + (size_t)i * ss,
                         sdt);
  }
}

static char *flat_at(const void *flat, weft_dtype dt, int64_t i) {
  return (char *)flat + (size_t)i * weft_dtype_size(dt);
}

static weft_status cpu_flat_pack(void *flat, weft_dtype flat_dtype, const weft_flat_piece *pieces,
                                 int npieces) {
  WEFT_CHECK_FLAT_("flat_pack", flat, flat_dtype, pieces, npieces, true, false);
  const size_t es = weft_dtype_size(flat_dtype);
  for (int i = 0; i < npieces; i++) {
    const weft_flat_piece *p = &pieces[i];
    char *d = flat_at(flat, flat_dtype, p->offset);
    if (p->data)
      convert(d, flat_dtype, p->data, p->dtype, p->count);
    else if (p->count > 0)
      memset(d, 0, (size_t)p->count * es);
    if (p->pad > 0) memset(d + (size_t)p->count * es, 0, (size_t)p->pad * es);
  }
  return WEFT_OK;
}

static weft_status cpu_flat_split(const void *flat, weft_dtype flat_dtype,
                                  const weft_flat_piece *pieces, int npieces) {
  WEFT_CHECK_FLAT_("flat_split", flat, flat_dtype, pieces, npieces, false, false);
  for (int i = 0; i < npieces; i++) {
    const weft_flat_piece *p = &pieces[i];
    convert(p->data, p->dtype, flat_at(flat, flat_dtype, p->offset), flat_dtype, p->count);
  }
  return WEFT_OK;
}

static weft_status cpu_flat_accumulate(const void *flat, weft_dtype flat_dtype,
                                       const weft_flat_piece *pieces, int npieces, float scale) {
  WEFT_CHECK_FLAT_("flat_accumulate", flat, flat_dtype, pieces, npieces, false, true);
  for (int i = 0; i < npieces; i++) {
    const weft_flat_piece *p = &pieces[i];
    float *dst = p->data;
    const char *src = flat_at(flat, flat_dtype, p->offset);
    const int64_t n = p->count;
    if (flat_dtype == WEFT_F32) {
      const float *s = (const float *)src;
      for (int64_t j = 0; j < n; j++) dst[j] += scale * s[j];
    } else if (flat_dtype == WEFT_BF16) {
      const uint16_t *s = (const uint16_t *)src;
      for (int64_t j = 0; j < n; j++) dst[j] += scale * weft_bf16_to_f32_i_(s[j]);
    } else {
      const uint16_t *s = (const uint16_t *)src;
      for (int64_t j = 0; j < n; j++) dst[j] += scale * weft_f16_to_f32_i_(s[j]);
    }
  }
  return WEFT_OK;
}

/* ----------------------------------------------------------------- table */

static const weft_backend cpu_backend = {
    .size = sizeof(weft_backend),
    .version = WEFT_BACKEND_VERSION,
    .device = WEFT_CPU,
    .name = "cpu",
    .takes_dtype = weft_builtin_takes_dtype_,
    .activation_forward_dt = weft_cpu_activation_forward_dt_,
    .activation_backward_dt = weft_cpu_activation_backward_dt_,
    .swiglu_forward_dt = weft_cpu_swiglu_forward_dt_,
    .swiglu_backward_dt = weft_cpu_swiglu_backward_dt_,
    .dropout_apply_dt = weft_cpu_dropout_apply_dt_,
    .layernorm_forward_dt = weft_cpu_layernorm_forward_dt_,
    .layernorm_backward_dt = weft_cpu_layernorm_backward_dt_,
    .softmax_forward_dt = weft_cpu_softmax_forward_dt_,
    .softmax_backward_dt = weft_cpu_softmax_backward_dt_,
    .rmsnorm_forward_dt = weft_cpu_rmsnorm_forward_dt_,
    .rmsnorm_backward_dt = weft_cpu_rmsnorm_backward_dt_,
    .cross_entropy_forward_dt = weft_cpu_cross_entropy_forward_dt_,
    .cross_entropy_backward_dt = weft_cpu_cross_entropy_backward_dt_,
    .cross_entropy_local_max_dt = weft_cpu_cross_entropy_local_max_dt_,
    .cross_entropy_local_target_dt = weft_cpu_cross_entropy_local_target_dt_,
    .cross_entropy_local_sumexp_dt = weft_cpu_cross_entropy_local_sumexp_dt_,
    .cross_entropy_backward_local_dt = weft_cpu_cross_entropy_backward_local_dt_,
    .embedding_range_forward_dt = weft_cpu_embedding_range_forward_dt_,
    .embedding_range_backward_dt = weft_cpu_embedding_range_backward_dt_,
    .rope_forward_dt = weft_cpu_rope_forward_dt_,
    .rope_backward_dt = weft_cpu_rope_backward_dt_,
    .gemm_dt = weft_cpu_gemm_dt_,
    .attention_forward_dt = weft_cpu_attention_forward_dt_,
    .attention_backward_dt = weft_cpu_attention_backward_dt_,
    .device_count = cpu_device_count,
    .synchronize = cpu_synchronize,
    .alloc = weft_cpu_alloc_,
    .free = weft_cpu_free_,
    .cache_stats = weft_cpu_cache_stats_,
    .empty_cache = weft_cpu_empty_cache_,
    .memset = cpu_memset,
    .memcpy = cpu_memcpy,
    .copy = weft_cpu_copy_,
    .fill = weft_cpu_fill_,
    .fill_random = weft_cpu_fill_random_,
    .gemm = weft_cpu_gemm_,
    .add = weft_cpu_add_,
    .mul = weft_cpu_mul_,
    .scale = weft_cpu_scale_,
    .div_scalar = weft_cpu_div_scalar_,
    .axpy = weft_cpu_axpy_,
    .reduce = weft_cpu_reduce_,
    .reduce_all = weft_cpu_reduce_all_,
    .sgemm = weft_cpu_sgemm_,
    .sgemm_strided_batched = cpu_sgemm_strided_batched,
    .gemm_bf16 = cpu_gemm_bf16,
    .embedding_forward = weft_embedding_forward,
    .embedding_backward = weft_embedding_backward,
    .embedding_range_forward = weft_embedding_range_forward,
    .embedding_range_backward = weft_embedding_range_backward,
    .linear_forward = weft_linear_forward,
    .linear_backward = weft_linear_backward,
    .rmsnorm_forward = weft_rmsnorm_forward,
    .rmsnorm_backward = weft_rmsnorm_backward,
    .rope_tables = weft_rope_tables,
    .rope_forward = weft_rope_forward,
    .rope_backward = weft_rope_backward,
    .attention_scratch_bytes = cpu_attention_scratch_bytes,
    .attention_forward = cpu_attention_forward,
    .attention_backward = cpu_attention_backward,
    .swiglu_forward = weft_swiglu_forward,
    .swiglu_backward = weft_swiglu_backward,
    .residual_forward = weft_residual_forward,
    .residual_backward = weft_residual_backward,
    .cross_entropy_forward = weft_cross_entropy_forward,
    .cross_entropy_backward = weft_cross_entropy_backward,
    .cross_entropy_local_max = weft_cross_entropy_local_max,
    .cross_entropy_local_target = weft_cross_entropy_local_target,
    .cross_entropy_local_sumexp = weft_cross_entropy_local_sumexp,
    .cross_entropy_finish = weft_cross_entropy_finish,
    .cross_entropy_backward_local = weft_cross_entropy_backward_local,
    .adamw_multi = cpu_adamw_multi,
    .sgd_multi = cpu_sgd_multi,
    .sumsq_multi = cpu_sumsq_multi,
    .scale_multi = cpu_scale_multi,
    .flat_pack = cpu_flat_pack,
    .flat_split = cpu_flat_split,
    .flat_accumulate = cpu_flat_accumulate,
    /* version 2 (cpu/norm_act.c) */
    .layernorm_forward = weft_layernorm_forward,
    .layernorm_backward = weft_layernorm_backward,
    .activation_forward = weft_activation_forward,
    .activation_backward = weft_activation_backward,
    .softmax_forward = weft_softmax_forward,
    .softmax_backward = weft_softmax_backward,
    .dropout_apply = weft_dropout_apply,
};

const weft_backend *weft_cpu_backend_(void) { return &cpu_backend; }
