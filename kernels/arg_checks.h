/* kernels/arg_checks.h — private: the argument checks of the kernels,
 * shared by the CPU kernels (kernels/cpu/) and the CUDA backend
 * (kernels/cuda/), so every backend rejects the same inputs with the same
 * message (C and C++). Messages name the operation, not the C function:
 * weft_op_name_("weft_cuda_linear_forward") and
 * weft_op_name_("weft_linear_forward") are both "linear_forward". */
#ifndef WEFT_ARG_CHECKS_H
#define WEFT_ARG_CHECKS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "layers.h"
#include "status.h"

/* The operation a kernel function implements: its name without the
 * "weft_cuda_", "weft_cpu_" or "weft_" prefix (and a trailing '_'s stay). */
static inline const char *weft_op_name_(const char *func) {
  if (strncmp(func, "weft_cuda_", 10) == 0) return func + 10;
  if (strncmp(func, "weft_cpu_", 9) == 0) return func + 9;
  if (strncmp(func, "weft_", 5) == 0) return func + 5;
  return func;
}

/* Every size must be >= 0 (the enclosing function returns the error). The
 * _AT forms take the operation's name (for helpers shared by several). */
#define CHECK_SIZES_AT(op, ...)                                                              \
  do {                                                                                       \
    const int64_t sizes_[] = {__VA_ARGS__};                                                  \
    for (size_t i_ = 0; i_ < sizeof sizes_ / sizeof sizes_[0]; i_++)                         \
      if (sizes_[i_] < 0)                                                                    \
        return weft_error_at(WEFT_ERR_INVALID, (op), "size argument %zu is negative (%lld)", \
                             i_ + 1, (long long)sizes_[i_]);                                 \
  } while (0)
#define CHECK_SIZES(...) CHECK_SIZES_AT(weft_op_name_(__func__), __VA_ARGS__)

/* A pointer to an array of `count` elements may be NULL only if count == 0. */
#define CHECK_PTR_AT(op, p, count)                                    \
  do {                                                                \
    if ((p) == NULL && (count) > 0)                                   \
      return weft_error_at(WEFT_ERR_INVALID, (op), "%s is NULL", #p); \
  } while (0)
#define CHECK_PTR(p, count) CHECK_PTR_AT(weft_op_name_(__func__), p, count)

/* Sizes and leading dims of a row-major GEMM C[m,n] = op(A) op(B) (lda,
 * ldb, ldc: row strides as stored). m or n = 0 needs no leading dims. */
static inline weft_status weft_check_gemm_dims_(const char *op, bool ta, bool tb, int64_t m,
                                                int64_t n, int64_t k, int64_t lda, int64_t ldb,
                                                int64_t ldc) {
  if (m < 0 || n < 0 || k < 0)
    return weft_error_at(WEFT_ERR_INVALID, op, "negative size: m %lld, n %lld, k %lld",
                         (long long)m, (long long)n, (long long)k);
  if (m == 0 || n == 0) return WEFT_OK;
  int64_t acols = ta ? m : k, bcols = tb ? k : n;
  /* k == 0: A and B are not read (C = beta C), their leading dims do not matter */
  if ((k > 0 && (lda < (acols > 1 ? acols : 1) || ldb < (bcols > 1 ? bcols : 1))) || ldc < n)
    return weft_error_at(WEFT_ERR_INVALID, op,
                         "leading dims too small: lda %lld (need >= %lld), ldb %lld (need >= "
                         "%lld), ldc %lld (need >= %lld)",
                         (long long)lda, (long long)acols, (long long)ldb, (long long)bcols,
                         (long long)ldc, (long long)n);
  return WEFT_OK;
}

/* The arrays of a multi-tensor call: ntensors >= 0, n[i] >= 0, and for
 * every required array k, arrays[k] and (when n[i] > 0) arrays[k][i]
 * non-NULL. */
static inline weft_status weft_check_multi_(const char *op, int ntensors, const int64_t *n,
                                            int narrays, const char *const *names,
                                            const void *const *const *arrays,
                                            const bool *required) {
  if (ntensors < 0)
    return weft_error_at(WEFT_ERR_INVALID, op, "ntensors = %d is negative", ntensors);
  if (ntensors == 0) return WEFT_OK;
  if (!n) return weft_error_at(WEFT_ERR_INVALID, op, "n is NULL");
  for (int k = 0; k < narrays; k++)
    if (required[k] && !arrays[k])
      return weft_error_at(WEFT_ERR_INVALID, op, "%s is NULL", names[k]);
  for (int i = 0; i < ntensors; i++) {
    if (n[i] < 0)
      return weft_error_at(WEFT_ERR_INVALID, op, "n[%d] = %lld is negative", i, (long long)n[i]);
    for (int k = 0; k < narrays; k++)
      if (required[k] && n[i] > 0 && !arrays[k][i])
        return weft_error_at(WEFT_ERR_INVALID, op, "%s[%d] is NULL (n[%d] = %lld)", names[k], i, i,
                             (long long)n[i]);
  }
  return WEFT_OK;
}

/* torch.optim.AdamW.__init__'s checks, and step >= 1 (hp is a
 * const weft_adamw_params *; layers.h). */
#define WEFT_CHECK_ADAMW_HP_(op, hp, step)                                                        \
  do {                                                                                            \
    if (!(hp)) return weft_error_at(WEFT_ERR_INVALID, op, "hyper-parameters are NULL");           \
    if ((step) < 1)                                                                               \
      return weft_error_at(WEFT_ERR_INVALID, op, "step = %lld must be >= 1", (long long)(step));  \
    if (!((hp)->lr >= 0.0f))                                                                      \
      return weft_error_at(WEFT_ERR_INVALID, op, "Invalid learning rate: %g", (double)(hp)->lr);  \
    if (!((hp)->eps >= 0.0f))                                                                     \
      return weft_error_at(WEFT_ERR_INVALID, op, "Invalid epsilon value: %g", (double)(hp)->eps); \
    if (!((hp)->beta1 >= 0.0f && (hp)->beta1 < 1.0f))                                             \
      return weft_error_at(WEFT_ERR_INVALID, op, "Invalid beta parameter at index 0: %g",         \
                           (double)(hp)->beta1);                                                  \
    if (!((hp)->beta2 >= 0.0f && (hp)->beta2 < 1.0f))                                             \
      return weft_error_at(WEFT_ERR_INVALID, op, "Invalid beta parameter at index 1: %g",         \
                           (double)(hp)->beta2);                                                  \
    if (!((hp)->weight_decay >= 0.0f))                                                            \
      return weft_error_at(WEFT_ERR_INVALID, op, "Invalid weight_decay value: %g",                \
                           (double)(hp)->weight_decay);                                           \
  } while (0)

/* torch.optim.SGD.__init__'s checks, and step >= 1. */
#define WEFT_CHECK_SGD_HP_(op, hp, step)                                                         \
  do {                                                                                           \
    if (!(hp)) return weft_error_at(WEFT_ERR_INVALID, op, "hyper-parameters are NULL");          \
    if ((step) < 1)                                                                              \
      return weft_error_at(WEFT_ERR_INVALID, op, "step = %lld must be >= 1", (long long)(step)); \
    if (!((hp)->lr >= 0.0f))                                                                     \
      return weft_error_at(WEFT_ERR_INVALID, op, "Invalid learning rate: %g", (double)(hp)->lr); \
    if (!((hp)->momentum >= 0.0f))                                                               \
      return weft_error_at(WEFT_ERR_INVALID, op, "Invalid momentum value: %g",                   \
                           (double)(hp)->momentum);                                              \
    if (!((hp)->weight_decay >= 0.0f))                                                           \
      return weft_error_at(WEFT_ERR_INVALID, op, "Invalid weight_decay value: %g",               \
                           (double)(hp)->weight_decay);                                          \
    if ((hp)->nesterov && ((hp)->momentum <= 0.0f || (hp)->dampening != 0.0f))                   \
      return weft_error_at(WEFT_ERR_INVALID, op,                                                 \
                           "Nesterov momentum requires a momentum and zero dampening");          \
  } while (0)

/* The pieces of a flat_pack / flat_split / flat_accumulate call: a float
 * flat dtype, npieces >= 0, each piece's dtype float (f32 for accumulate),
 * offset, count, pad >= 0, data non-NULL where count > 0 (pack allows NULL:
 * zeros). The flat buffer must not be NULL when any piece is non-empty.
 * pieces is a const weft_flat_piece * (backend.h). */
#define WEFT_CHECK_FLAT_(op, flat, flat_dtype, pieces, npieces, data_may_be_null, need_f32)        \
  do {                                                                                             \
    if ((flat_dtype) != WEFT_F32 && (flat_dtype) != WEFT_BF16 && (flat_dtype) != WEFT_F16)         \
      return weft_error_at(WEFT_ERR_UNSUPPORTED, op, "flat buffer dtype %s: f32, bf16 or f16",     \
                           weft_dtype_name(flat_dtype));                                           \
    if ((npieces) < 0)                                                                             \
      return weft_error_at(WEFT_ERR_INVALID, op, "npieces = %d is negative", (npieces));           \
    if ((npieces) > 0 && !(pieces)) return weft_error_at(WEFT_ERR_INVALID, op, "pieces is NULL");  \
    for (int i_ = 0; i_ < (npieces); i_++) {                                                       \
      const weft_flat_piece *p_ = &(pieces)[i_];                                                   \
      if (p_->offset < 0 || p_->count < 0 || p_->pad < 0)                                          \
        return weft_error_at(WEFT_ERR_INVALID, op,                                                 \
                             "piece %d: offset %lld, count %lld, pad %lld must be >= 0", i_,       \
                             (long long)p_->offset, (long long)p_->count, (long long)p_->pad);     \
      if ((need_f32) ? p_->dtype != WEFT_F32                                                       \
                     : (p_->dtype != WEFT_F32 && p_->dtype != WEFT_BF16 && p_->dtype != WEFT_F16)) \
        return weft_error_at(WEFT_ERR_UNSUPPORTED, op, "piece %d has dtype %s: %s", i_,            \
                             weft_dtype_name(p_->dtype),                                           \
                             (need_f32) ? "accumulation needs f32" : "f32, bf16 or f16");          \
      if (!p_->data && p_->count > 0 && !(data_may_be_null))                                       \
        return weft_error_at(WEFT_ERR_INVALID, op, "piece %d: data is NULL for %lld elements", i_, \
                             (long long)p_->count);                                                \
      if (!(flat) && p_->count + p_->pad > 0)                                                      \
        return weft_error_at(WEFT_ERR_INVALID, op, "flat is NULL");                                \
    }                                                                                              \
  } while (0)

/* Returns a failed check's status as it is: its message already names the
 * operation (WEFT_CHECK would add a line naming the C function). */
#define WEFT_CHECK_ARGS_(expr)                          \
  do {                                                  \
    weft_status weft_args_st_ = (expr);                 \
    if (weft_args_st_ != WEFT_OK) return weft_args_st_; \
  } while (0)

/* The checks of the norm, activation, softmax and dropout kernels
 * (layers.h), one function per operation, shared by every backend
 * (kernels/cpu/norm_act.c, kernels/cuda/norm_act.cu): sizes >= 0 (then
 * C >= 1 for the row ops), the operation's parameter, then the required
 * pointers in argument order. Optional pointers (weight, bias, the
 * backward's outputs) are not checked. op is the operation's name. */
#define WEFT_CHECK_ROWS_(op, N, C)                                                  \
  do {                                                                              \
    CHECK_SIZES_AT(op, N, C);                                                       \
    if ((C) < 1)                                                                    \
      return weft_error_at(WEFT_ERR_INVALID, op, "C = %lld: rows must have C >= 1", \
                           (long long)(C));                                         \
  } while (0)

/* Returns the status of a check that names its op itself (the functions
 * below), without the breadcrumb WEFT_CHECK would add. */
#define WEFT_RETURN_IF_BAD_(check)          \
  do {                                      \
    weft_status bad_st_ = (check);          \
    if (bad_st_ != WEFT_OK) return bad_st_; \
  } while (0)

/* Attention's sizes: all >= 0 and H a multiple of Hkv (grouped-query
 * attention). */
static inline weft_status weft_check_attention_shape_(const char *op, int64_t B, int64_t T,
                                                      int64_t H, int64_t Hkv, int64_t hd) {
  CHECK_SIZES_AT(op, B, T, H, Hkv, hd);
  if (H > 0 && (Hkv == 0 || H % Hkv != 0))
    return weft_error_at(WEFT_ERR_INVALID, op,
                         "H = %lld query heads is not a multiple of Hkv = %lld", (long long)H,
                         (long long)Hkv);
  return WEFT_OK;
}

/* RMSNorm forward: rows of C >= 1 elements (C = 0 with N > 0 refused),
 * eps >= 0. */
static inline weft_status weft_check_rmsnorm_forward_(const char *op, const float *out,
                                                      const float *rstd, const float *inp,
                                                      const float *weight, int64_t N, int64_t C,
                                                      float eps) {
  CHECK_SIZES_AT(op, N, C);
  if (C == 0 && N > 0)
    return weft_error_at(WEFT_ERR_INVALID, op, "C = 0: RMSNorm over an empty row");
  CHECK_PTR_AT(op, out, N * C);
  CHECK_PTR_AT(op, rstd, N);
  CHECK_PTR_AT(op, inp, N * C);
  CHECK_PTR_AT(op, weight, C);
  if (!(eps >= 0.0f))
    return weft_error_at(WEFT_ERR_INVALID, op, "eps = %g must be >= 0", (double)eps);
  return WEFT_OK;
}

/* RMSNorm backward: dinp, dout, inp (N, C), dweight and weight (C), rstd
 * (N), all required. */
static inline weft_status weft_check_rmsnorm_backward_(const char *op, const void *dinp,
                                                       const float *dweight, const void *dout,
                                                       const void *inp, const void *weight,
                                                       const float *rstd, int64_t N, int64_t C) {
  CHECK_SIZES_AT(op, N, C);
  CHECK_PTR_AT(op, dinp, N * C);
  CHECK_PTR_AT(op, dweight, C);
  CHECK_PTR_AT(op, dout, N * C);
  CHECK_PTR_AT(op, inp, N * C);
  CHECK_PTR_AT(op, weight, C);
  CHECK_PTR_AT(op, rstd, N);
  return WEFT_OK;
}

/* SwiGLU forward: three arrays of n elements. */
static inline weft_status weft_check_swiglu_forward_(const char *op, const float *out,
                                                     const float *a, const float *b, int64_t n) {
  CHECK_SIZES_AT(op, n);
  CHECK_PTR_AT(op, out, n);
  CHECK_PTR_AT(op, a, n);
  CHECK_PTR_AT(op, b, n);
  return WEFT_OK;
}

/* SwiGLU backward: five arrays of n elements. */
static inline weft_status weft_check_swiglu_backward_(const char *op, const float *da,
                                                      const float *db, const float *dout,
                                                      const float *a, const float *b, int64_t n) {
  CHECK_SIZES_AT(op, n);
  CHECK_PTR_AT(op, da, n);
  CHECK_PTR_AT(op, db, n);
  CHECK_PTR_AT(op, dout, n);
  CHECK_PTR_AT(op, a, n);
  CHECK_PTR_AT(op, b, n);
  return WEFT_OK;
}

static inline weft_status weft_check_layernorm_forward_(const char *op, const float *out,
                                                        const float *mean, const float *rstd,
                                                        const float *inp, int64_t N, int64_t C,
                                                        float eps) {
  WEFT_CHECK_ROWS_(op, N, C);
  if (!(eps > 0.0f))
    return weft_error_at(WEFT_ERR_INVALID, op, "eps = %g must be > 0", (double)eps);
  CHECK_PTR_AT(op, out, N * C);
  CHECK_PTR_AT(op, mean, N);
  CHECK_PTR_AT(op, rstd, N);
  CHECK_PTR_AT(op, inp, N * C);
  return WEFT_OK;
}

static inline weft_status weft_check_layernorm_backward_(const char *op, const float *dout,
                                                         const float *inp, const float *mean,
                                                         const float *rstd, int64_t N, int64_t C) {
  WEFT_CHECK_ROWS_(op, N, C);
  CHECK_PTR_AT(op, dout, N * C);
  CHECK_PTR_AT(op, inp, N * C);
  CHECK_PTR_AT(op, mean, N);
  CHECK_PTR_AT(op, rstd, N);
  return WEFT_OK;
}

/* act, then n, then the (n)-element arrays in argument order. */
#define WEFT_CHECK_ACT_(op, act)                                                            \
  do {                                                                                      \
    if ((unsigned)(act) >= (unsigned)WEFT_ACT_COUNT)                                        \
      return weft_error_at(WEFT_ERR_INVALID, op,                                            \
                           "activation %d is not one of gelu_tanh (0), gelu_erf (1), relu " \
                           "(2), silu (3)",                                                 \
                           (int)(act));                                                     \
  } while (0)

static inline weft_status weft_check_activation_forward_(const char *op, weft_activation act,
                                                         const float *out, const float *inp,
                                                         int64_t n) {
  WEFT_CHECK_ACT_(op, act);
  CHECK_SIZES_AT(op, n);
  CHECK_PTR_AT(op, out, n);
  CHECK_PTR_AT(op, inp, n);
  return WEFT_OK;
}

/* The storage dtype of the _dt kernels: f32, bf16 or f16. */
#define WEFT_CHECK_STORAGE_DT_(op, dt)                                                   \
  do {                                                                                   \
    if ((dt) != WEFT_F32 && (dt) != WEFT_BF16 && (dt) != WEFT_F16)                       \
      return weft_error_at(WEFT_ERR_UNSUPPORTED, op, "dtype %s: takes f32, bf16 or f16", \
                           weft_dtype_name(dt));                                         \
  } while (0)

/* gemm_dt (backend.h): the GEMM's dims as weft_check_gemm_dims_, operands
 * f32, bf16 or f16, C f32 or the operands' dtype, and a bias only with
 * beta == 0. */
static inline weft_status weft_check_gemm_dt_(const char *op, bool ta, bool tb, int64_t m,
                                              int64_t n, int64_t k, weft_dtype ab_dt, int64_t lda,
                                              int64_t ldb, float beta, weft_dtype c_dt, int64_t ldc,
                                              const void *bias) {
  WEFT_CHECK_STORAGE_DT_(op, ab_dt);
  if (c_dt != WEFT_F32 && c_dt != ab_dt)
    return weft_error_at(WEFT_ERR_UNSUPPORTED, op, "C of dtype %s with %s operands: f32 or %s",
                         weft_dtype_name(c_dt), weft_dtype_name(ab_dt), weft_dtype_name(ab_dt));
  if (bias && beta != 0.0f)
    return weft_error_at(WEFT_ERR_INVALID, op, "a bias with beta = %g (a bias needs beta = 0)",
                         (double)beta);
  return weft_check_gemm_dims_(op, ta, tb, m, n, k, lda, ldb, ldc);
}

static inline weft_status weft_check_activation_backward_(const char *op, weft_activation act,
                                                          const float *dinp, const float *dout,
                                                          const float *inp, int64_t n) {
  WEFT_CHECK_ACT_(op, act);
  CHECK_SIZES_AT(op, n);
  CHECK_PTR_AT(op, dinp, n);
  CHECK_PTR_AT(op, dout, n);
  CHECK_PTR_AT(op, inp, n);
  return WEFT_OK;
}

static inline weft_status weft_check_softmax_forward_(const char *op, const float *out,
                                                      const float *inp, int64_t N, int64_t C) {
  WEFT_CHECK_ROWS_(op, N, C);
  CHECK_PTR_AT(op, out, N * C);
  CHECK_PTR_AT(op, inp, N * C);
  return WEFT_OK;
}

static inline weft_status weft_check_softmax_backward_(const char *op, const float *dinp,
                                                       const float *dout, const float *out,
                                                       int64_t N, int64_t C) {
  WEFT_CHECK_ROWS_(op, N, C);
  CHECK_PTR_AT(op, dinp, N * C);
  CHECK_PTR_AT(op, dout, N * C);
  CHECK_PTR_AT(op, out, N * C);
  return WEFT_OK;
}

static inline weft_status weft_check_dropout_(const char *op, const float *out, const float *inp,
                                              const float *uniform, float p, int64_t n) {
  CHECK_SIZES_AT(op, n);
  if (!(p >= 0.0f && p < 1.0f))
    return weft_error_at(WEFT_ERR_INVALID, op, "p = %g must be in [0, 1)", (double)p);
  CHECK_PTR_AT(op, out, n);
  CHECK_PTR_AT(op, inp, n);
  CHECK_PTR_AT(op, uniform, n);
  return WEFT_OK;
}

#endif /* WEFT_ARG_CHECKS_H */
