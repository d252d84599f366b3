/* kernels/ops.c — the device-generic entry points of kernels.h for dense
 * tensor math: weft_gemm, weft_add, weft_mul, weft_scale, weft_div_scalar,
 * weft_axpy, weft_reduce_all, weft_reduce. Each checks its arguments the
 * same way for every device, then calls the member of the tensors' device
 * table (backend.h): the CPU's are in kernels/cpu (weft_cpu_*_), the
 * CUDA backend's in kernels/cuda. Local, no allocation of their own.
 * Also weft_sgemm (host pointers: the CPU table's sgemm member) and the
 * helpers of the layer kernels' parameters (weft_activation_name,
 * weft_clip_coef), so that kernels/cpu defines no function of kernels.h. */
#include <inttypes.h>
#include <stddef.h>
#include <string.h>

#include "backend_internal.h"
#include "kernels.h"
#include "kernels_internal.h"

/* ----------------------------------------------------------- checks */
static weft_status check_float(const char *func, const weft_tensor *t, const char *name) {
  if (!t) return weft_error_at(WEFT_ERR_INVALID, func, "%s is NULL", name);
  char desc[256];
  weft_tensor_describe(t, desc, sizeof desc);
  if (t->ndim < 0 || t->ndim > WEFT_MAX_DIMS)
    return weft_error_at(WEFT_ERR_INVALID, func, "%s has invalid ndim %d", name, t->ndim);
  if ((unsigned)t->device >= WEFT_DEVICE_COUNT)
    return weft_error_at(WEFT_ERR_INVALID, func, "%s is on unknown device %d", name,
                         (int)t->device);
  if (!weft_dtype_is_float(t->dtype))
    return weft_error_at(WEFT_ERR_INVALID, func,
                         "%s %s: elementwise ops need a float dtype (f32, f64, bf16, f16)", name,
                         desc);
  return WEFT_OK;
}

static weft_status check_pair(const char *func, const weft_tensor *t, const char *tn,
                              const weft_tensor *r, const char *rn) {
  char dt[256], dr[256];
  weft_tensor_describe(t, dt, sizeof dt);
  weft_tensor_describe(r, dr, sizeof dr);
  if (t->dtype != r->dtype)
    return weft_error_at(WEFT_ERR_INVALID, func, "dtype mismatch: %s %s, %s %s", rn, dr, tn, dt);
  if (!weft_tensor_same_shape(t, r))
    return weft_error_at(WEFT_ERR_INVALID, func, "shape mismatch: %s %s, %s %s", rn, dr, tn, dt);
  return WEFT_OK;
}

static weft_status check_reduce_input(const char *func, const weft_tensor *t,
                                      weft_reduce_kind kind) {
  if (!t) return weft_error_at(WEFT_ERR_INVALID, func, "tensor is NULL");
  if (t->ndim < 0 || t->ndim > WEFT_MAX_DIMS || (unsigned)t->dtype >= WEFT_DTYPE_COUNT)
    return weft_error_at(WEFT_ERR_INVALID, func, "not a valid tensor (ndim %d, dtype %d)", t->ndim,
                         (int)t->dtype);
  if ((unsigned)t->device >= WEFT_DEVICE_COUNT)
    return weft_error_at(WEFT_ERR_INVALID, func, "tensor is on unknown device %d", (int)t->device);
  if ((unsigned)kind > WEFT_REDUCE_MAX)
    return weft_error_at(WEFT_ERR_INVALID, func, "unknown reduction kind %d", (int)kind);
  return WEFT_OK;
}

/* ---------------------------------------------------------------- gemm */

weft_status weft_gemm(bool trans_a, bool trans_b, float alpha, const weft_tensor *a,
                      const weft_tensor *b, float beta, weft_tensor *c) {
  const char *names[3] = {"A", "B", "C"};
  const weft_tensor *ts[3] = {a, b, c};
  for (int i = 0; i < 3; i++) {
    if (!ts[i]) return weft_error(WEFT_ERR_INVALID, "%s is NULL", names[i]);
    char desc[256];
    weft_tensor_describe(ts[i], desc, sizeof desc);
    if (ts[i]->ndim != 2)
      return weft_error(WEFT_ERR_INVALID, "%s must be 2-D, got %s", names[i], desc);
  }
  char da[256], db[256], dc[256];
  weft_tensor_describe(a, da, sizeof da);
  weft_tensor_describe(b, db, sizeof db);
  weft_tensor_describe(c, dc, sizeof dc);
  if (a->dtype != b->dtype || a->dtype != c->dtype)
    return weft_error(WEFT_ERR_INVALID, "dtype mismatch: A %s, B %s, C %s", da, db, dc);
  const weft_dtype dt = a->dtype;
  if (dt != WEFT_F32 && dt != WEFT_F64 && dt != WEFT_BF16 && dt != WEFT_F16)
    return weft_backend_dtype_unsupported_(__func__, "A", a, "gemm on f32, f64, bf16 and f16");
  const int64_t m = trans_a ? a->shape[1] : a->shape[0];
  const int64_t ka = trans_a ? a->shape[0] : a->shape[1];
  const int64_t kb = trans_b ? b->shape[1] : b->shape[0];
  const int64_t n = trans_b ? b->shape[0] : b->shape[1];
  if (ka != kb)
    return weft_error(WEFT_ERR_INVALID,
                      "inner dims differ: op(A) is %" PRId64 " x %" PRId64
                      " (A %s%s), op(B) is %" PRId64 " x %" PRId64 " (B %s%s)",
                      m, ka, da, trans_a ? ", transposed" : "", kb, n, db,
                      trans_b ? ", transposed" : "");
  if (c->shape[0] != m || c->shape[1] != n)
    return weft_error(WEFT_ERR_INVALID,
                      "C is %s but op(A) @ op(B) is %" PRId64 " x %" PRId64 " (A %s, B %s)", dc, m,
                      n, da, db);
  weft_status st;
  const weft_backend *be =
      weft_backend_for_tensors_(__func__, offsetof(weft_backend, gemm), 3, ts, names, &st);
  if (!be) return st;
  if (m == 0 || n == 0) return WEFT_OK;
  if (dt == WEFT_F32 || dt == WEFT_F64) {
    /* layouts: the same requirement on every device */
    int64_t ld;
    bool flip;
    WEFT_CHECK(weft_gemm_layout_(__func__, a, "A", true, &ld, &flip));
    WEFT_CHECK(weft_gemm_layout_(__func__, b, "B", true, &ld, &flip));
    WEFT_CHECK(weft_gemm_layout_(__func__, c, "C", false, &ld, &flip));
  }
  return weft_backend_trace_(be->gemm(trans_a, trans_b, alpha, a, b, beta, c), be, __func__);
}

/* weft_sgemm's contract is the sgemm member's on host memory; its errors
 * (set, not returned) are headed by weft_sgemm as the other entry points'. */
void weft_sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c,
                int64_t ldc) {
  weft_status st =
      weft_backend_sgemm(WEFT_CPU, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  if (st != WEFT_OK) weft_error_trace(st, __func__);
}

/* --------------------------------------------------------- elementwise */

static weft_status binary(const char *func, size_t member, weft_tensor *out, const weft_tensor *a,
                          const weft_tensor *b) {
  weft_status st;
  if ((st = check_float(func, out, "out")) != WEFT_OK) return st;
  if ((st = check_float(func, a, "a")) != WEFT_OK) return st;
  if ((st = check_float(func, b, "b")) != WEFT_OK) return st;
  if ((st = check_pair(func, a, "a", out, "out")) != WEFT_OK) return st;
  if ((st = check_pair(func, b, "b", out, "out")) != WEFT_OK) return st;
  const weft_tensor *ts[3] = {out, a, b};
  const char *names[3] = {"out", "a", "b"};
  const weft_backend *be = weft_backend_for_tensors_(func, member, 3, ts, names, &st);
  if (!be) return st;
  weft_status (*fn)(weft_tensor *, const weft_tensor *, const weft_tensor *);
  memcpy(&fn, (const char *)be + member, sizeof fn);
  return weft_backend_trace_(fn(out, a, b), be, func);
}

weft_status weft_add(weft_tensor *out, const weft_tensor *a, const weft_tensor *b) {
  WEFT_CHECK(binary(__func__, offsetof(weft_backend, add), out, a, b));
  return WEFT_OK;
}

weft_status weft_mul(weft_tensor *out, const weft_tensor *a, const weft_tensor *b) {
  WEFT_CHECK(binary(__func__, offsetof(weft_backend, mul), out, a, b));
  return WEFT_OK;
}

bool weft_builtin_takes_dtype_(weft_kernel_op op, weft_dtype dt) {
  if ((unsigned)dt >= WEFT_DTYPE_COUNT) return false;
  switch (op) {
    case WEFT_KERNEL_ADD:
    case WEFT_KERNEL_MUL:
    case WEFT_KERNEL_SCALE:
      return weft_dtype_is_float(dt);
    case WEFT_KERNEL_ACTIVATION:
    case WEFT_KERNEL_SWIGLU:
    case WEFT_KERNEL_DROPOUT:
    case WEFT_KERNEL_LAYERNORM:
    case WEFT_KERNEL_SOFTMAX:
    case WEFT_KERNEL_RMSNORM:
    case WEFT_KERNEL_CROSS_ENTROPY:
    case WEFT_KERNEL_EMBEDDING:
    case WEFT_KERNEL_ROPE:
    case WEFT_KERNEL_GEMM:
    case WEFT_KERNEL_ATTENTION:
    case WEFT_KERNEL_COPY:
    case WEFT_KERNEL_REDUCE:
      return dt == WEFT_F32 || dt == WEFT_BF16 || dt == WEFT_F16;
    default:
      return false;
  }
}

/* t op= v through member (scale or div_scalar) of t's device table. */
static weft_status scalar_op(const char *func, size_t member, weft_tensor *t, double v) {
  WEFT_CHECK(check_float(func, t, "t"));
  weft_status st;
  const weft_tensor *ts[1] = {t};
  const char *names[1] = {"t"};
  const weft_backend *be = weft_backend_for_tensors_(func, member, 1, ts, names, &st);
  if (!be) return st;
  weft_status (*fn)(weft_tensor *, double);
  memcpy(&fn, (const char *)be + member, sizeof fn);
  return weft_backend_trace_(fn(t, v), be, func);
}

weft_status weft_scale(weft_tensor *t, double alpha) {
  WEFT_CHECK(scalar_op(__func__, offsetof(weft_backend, scale), t, alpha));
  return WEFT_OK;
}

weft_status weft_div_scalar(weft_tensor *t, double divisor) {
  return scalar_op(__func__, offsetof(weft_backend, div_scalar), t, divisor);
}

weft_status weft_axpy(weft_tensor *y, double alpha, const weft_tensor *x) {
  WEFT_CHECK(check_float(__func__, y, "y"));
  WEFT_CHECK(check_float(__func__, x, "x"));
  WEFT_CHECK(check_pair(__func__, x, "x", y, "y"));
  weft_status st;
  const weft_tensor *ts[2] = {y, x};
  const char *names[2] = {"y", "x"};
  const weft_backend *be =
      weft_backend_for_tensors_(__func__, offsetof(weft_backend, axpy), 2, ts, names, &st);
  if (!be) return st;
  return weft_backend_trace_(be->axpy(y, alpha, x), be, __func__);
}

/* ---------------------------------------------------------- reductions */

weft_status weft_reduce_all(const weft_tensor *t, weft_reduce_kind kind, double *out) {
  if (!out) return weft_error(WEFT_ERR_INVALID, "out is NULL");
  WEFT_CHECK(check_reduce_input(__func__, t, kind));
  if (weft_tensor_numel(t) == 0 && kind == WEFT_REDUCE_MAX) {
    char desc[256];
    weft_tensor_describe(t, desc, sizeof desc);
    return weft_error(WEFT_ERR_INVALID, "max of the empty tensor %s is undefined", desc);
  }
  weft_status st;
  const weft_tensor *ts[1] = {t};
  const char *names[1] = {"t"};
  const weft_backend *be =
      weft_backend_for_tensors_(__func__, offsetof(weft_backend, reduce_all), 1, ts, names, &st);
  if (!be) return st;
  return weft_backend_trace_(be->reduce_all(t, kind, out), be, __func__);
}

weft_status weft_reduce(const weft_tensor *t, weft_reduce_kind kind, int dim, weft_tensor *out) {
  WEFT_CHECK(check_reduce_input(__func__, t, kind));
  if (!out) return weft_error(WEFT_ERR_INVALID, "out is NULL");
  char dt[256], dout[256];
  weft_tensor_describe(t, dt, sizeof dt);
  weft_tensor_describe(out, dout, sizeof dout);
  /* a 0-d tensor reduces like one of shape [1] (torch accepts dim 0 / -1) */
  const int nd = t->ndim > 0 ? t->ndim : 1;
  if (dim < -nd || dim >= nd)
    return weft_error(WEFT_ERR_INVALID, "dim %d out of range for %s (expected %d..%d)", dim, dt,
                      -nd, nd - 1);
  const int d = dim < 0 ? dim + nd : dim;
  if (out->dtype != t->dtype)
    return weft_error(WEFT_ERR_INVALID, "out %s must have the input's dtype (input %s)", dout, dt);
  bool shape_ok = out->ndim == t->ndim;
  for (int k = 0; shape_ok && k < t->ndim; k++)
    if (out->shape[k] != (k == d ? 1 : t->shape[k])) shape_ok = false;
  if (!shape_ok)
    return weft_error(WEFT_ERR_INVALID,
                      "out %s must be the input %s with dim %d of size 1 (keepdim)", dout, dt, d);
  weft_status st;
  const weft_tensor *ts[2] = {out, t};
  const char *names[2] = {"out", "t"};
  const weft_backend *be =
      weft_backend_for_tensors_(__func__, offsetof(weft_backend, reduce), 2, ts, names, &st);
  if (!be) return st;
  if (weft_tensor_numel(out) == 0) return WEFT_OK;
  if ((t->ndim > 0 ? t->shape[d] : 1) == 0 && kind == WEFT_REDUCE_MAX)
    return weft_error(WEFT_ERR_INVALID, "max over dim %d of size 0 in %s is undefined", d, dt);
  return weft_backend_trace_(be->reduce(t, kind, d, out), be, __func__);
}

/* ---------------------------------------- parameters of the layer kernels */

const char *weft_activation_name(weft_activation a) {
  switch (a) {
    case WEFT_ACT_GELU_TANH:
      return "gelu_tanh";
    case WEFT_ACT_GELU_ERF:
      return "gelu_erf";
    case WEFT_ACT_RELU:
      return "relu";
    case WEFT_ACT_SILU:
      return "silu";
    default:
      return "?";
  }
}

double weft_clip_coef(double total_norm, double max_norm) {
  double c = max_norm / (total_norm + 1e-6);
  return c < 1.0 ? c : 1.0;
}
