/* The backend registry and the dispatchers of backend.h: find the table of
 * a device, call its member, and make every "not here" error in one place
 * (no table for the device, a missing optional member). */
#include "backend.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "backend_internal.h"
#include "weft_config.h"

/* The registered tables, copied in full size: members a smaller (older)
 * table lacks read as NULL. tables[d] is &copies[d] or NULL. */
static weft_backend copies[WEFT_DEVICE_COUNT];
static const weft_backend *tables[WEFT_DEVICE_COUNT];
static pthread_once_t builtin_once = PTHREAD_ONCE_INIT;

static void install(const weft_backend *be) {
  weft_backend *c = &copies[be->device];
  memset(c, 0, sizeof *c);
  memcpy(c, be, be->size < sizeof *c ? be->size : sizeof *c);
  c->size = sizeof *c;
  /* before version 3 the attention members had no `causal` argument:
   * calling them through this header's types would be undefined, so they
   * read as absent (WEFT_ERR_UNSUPPORTED) */
  if (be->version < 3) {
    c->attention_forward = NULL;
    c->attention_backward = NULL;
  }
  /* before version 6 the _dt attention members had no row strides */
  if (be->version < 6) {
    c->attention_forward_dt = NULL;
    c->attention_backward_dt = NULL;
  }
  /* takes_dtype and everything after it came with version 5 */
  if (be->version < 5)
    memset((char *)c + offsetof(weft_backend, takes_dtype), 0,
           sizeof *c - offsetof(weft_backend, takes_dtype));
  tables[be->device] = c;
}

/* The built-in tables of this build (the CUDA one only where it is built). */
static const weft_backend *builtin(weft_device dev) {
  if (dev == WEFT_CPU) return weft_cpu_backend_();
#if WEFT_HAVE_CUDA
  if (dev == WEFT_CUDA) return weft_cuda_backend_();
#endif
  return NULL;
}

static void register_builtin(void) {
  for (int d = 0; d < WEFT_DEVICE_COUNT; d++) {
    const weft_backend *be = builtin((weft_device)d);
    if (be) install(be);
  }
}

/* The members every table must have, by offset, for weft_backend_register. */
#define REQUIRED_(m) \
  { offsetof(weft_backend, m), #m }
static const struct {
  size_t offset;
  const char *name;
} required[] = {
    REQUIRED_(device_count), REQUIRED_(synchronize), REQUIRED_(alloc), REQUIRED_(free),
    REQUIRED_(memset),       REQUIRED_(memcpy),      REQUIRED_(copy),  REQUIRED_(fill),
};

weft_status weft_backend_register(const weft_backend *be) {
  if (!be) return weft_error(WEFT_ERR_INVALID, "backend table is NULL");
  if (be->version < 1 || be->version > WEFT_BACKEND_VERSION)
    return weft_error(WEFT_ERR_INVALID, "backend table version %d: this weft knows 1..%d",
                      be->version, WEFT_BACKEND_VERSION);
  if (be->size < offsetof(weft_backend, gemm) || be->size > sizeof(weft_backend))
    return weft_error(WEFT_ERR_INVALID, "backend table size %zu is not a weft_backend (%zu bytes)",
                      be->size, sizeof(weft_backend));
  if ((unsigned)be->device >= WEFT_DEVICE_COUNT)
    return weft_error(WEFT_ERR_INVALID, "backend table for unknown device %d", (int)be->device);
  if (!be->name || !be->name[0])
    return weft_error(WEFT_ERR_INVALID, "backend table for %s has no name",
                      weft_device_name(be->device));
  for (size_t i = 0; i < sizeof required / sizeof required[0]; i++) {
    void *fn;
    memcpy(&fn, (const char *)be + required[i].offset, sizeof fn);
    if (!fn)
      return weft_error(WEFT_ERR_INVALID, "backend '%s' for %s lacks the required member %s",
                        be->name, weft_device_name(be->device), required[i].name);
  }
  pthread_once(&builtin_once, register_builtin);
  install(be);
  return WEFT_OK;
}

void weft_backend_reset(weft_device dev) {
  if ((unsigned)dev >= WEFT_DEVICE_COUNT) return;
  pthread_once(&builtin_once, register_builtin);
  tables[dev] = NULL;
  const weft_backend *be = builtin(dev);
  if (be) install(be);
}

const weft_backend *weft_backend_get(weft_device dev) {
  if ((unsigned)dev >= WEFT_DEVICE_COUNT) return NULL;
  pthread_once(&builtin_once, register_builtin);
  return tables[dev];
}

const char *weft_backend_name(weft_device dev) {
  const weft_backend *be = weft_backend_get(dev);
  return be ? be->name : "none";
}

bool weft_backend_takes_dtype(weft_device dev, weft_kernel_op op, weft_dtype dt) {
  const weft_backend *be = weft_backend_get(dev);
  if (!be || (unsigned)op >= WEFT_KERNEL_OP_COUNT || (unsigned)dt >= WEFT_DTYPE_COUNT) return false;
  if (dt == WEFT_F32) return true;
  /* a version-5 table's attention _dt members were dropped (install) */
  if (op == WEFT_KERNEL_ATTENTION && !be->attention_forward_dt) return false;
  return be->takes_dtype && be->takes_dtype(op, dt);
}

static bool has_member(const weft_backend *be, size_t offset) {
  void *fn;
  memcpy(&fn, (const char *)be + offset, sizeof fn);
  return fn != NULL;
}

weft_status weft_backend_no_table_(weft_device dev, const char *op) {
  if ((unsigned)dev >= WEFT_DEVICE_COUNT)
    return weft_error_at(WEFT_ERR_INVALID, op, "%d is not a device", (int)dev);
#if WEFT_HAVE_CUDA
  const char *how = "";
#else
  const char *how = dev == WEFT_CUDA ? " (weft was built without the CUDA backend: meson "
                                       "-Dcuda=enabled needs nvcc and cuBLAS; -Dcuda=emulated "
                                       "runs it on the CPU)"
                                     : "";
#endif
  return weft_error_at(WEFT_ERR_UNSUPPORTED, op, "no backend for device %s in this build%s",
                       weft_device_name(dev), how);
}

weft_status weft_backend_unsupported_(const weft_backend *be, const char *op) {
  return weft_error_at(WEFT_ERR_UNSUPPORTED, op, "%s is not supported on %s (backend '%s')", op,
                       weft_device_name(be->device), be->name);
}

const weft_backend *weft_backend_find_(weft_device dev, size_t offset, const char *op,
                                       weft_status *st) {
  const weft_backend *be = weft_backend_get(dev);
  if (!be) {
    *st = weft_backend_no_table_(dev, op);
    return NULL;
  }
  if (!has_member(be, offset)) {
    *st = weft_backend_unsupported_(be, op);
    return NULL;
  }
  *st = WEFT_OK;
  return be;
}

weft_status weft_backend_trace_(weft_status st, const weft_backend *be, const char *op) {
  if (st == WEFT_OK) return st;
  char where[96];
  snprintf(where, sizeof where, "%s on %s", op, weft_device_name(be->device));
  weft_error_trace(st, where);
  char head[96];
  snprintf(head, sizeof head, "weft_backend_%s", op);
  weft_error_set_head_(head);
  return st;
}

/* Looks up member `op` of dev's table or returns the error; then calls it
 * and adds "in <op> on <device>" to a failure. */
#define DISPATCH(dev, op, ...)                                                                  \
  do {                                                                                          \
    weft_status st_;                                                                            \
    const weft_backend *be_ = weft_backend_find_((dev), offsetof(weft_backend, op), #op, &st_); \
    if (!be_) return st_;                                                                       \
    return weft_backend_trace_(be_->op(__VA_ARGS__), be_, #op);                                 \
  } while (0)

/* ------------------------------------------------------------ device set-up */

int weft_device_count(weft_device dev) {
  const weft_backend *be = weft_backend_get(dev);
  return be ? be->device_count() : 0;
}

weft_status weft_device_init(weft_device dev, int local_rank, int *ordinal) {
  if (local_rank < 0) return weft_error(WEFT_ERR_INVALID, "local rank %d is negative", local_rank);
  weft_status st;
  const weft_backend *be =
      weft_backend_find_(dev, offsetof(weft_backend, device_count), "device init", &st);
  if (!be) return st;
  if (!has_member(be, offsetof(weft_backend, init))) {
    if (ordinal) *ordinal = 0;
    return WEFT_OK; /* nothing to prepare (the CPU) */
  }
  return weft_backend_trace_(be->init(local_rank, ordinal), be, "device init");
}

void weft_device_shutdown(weft_device dev) {
  const weft_backend *be = weft_backend_get(dev);
  if (be && has_member(be, offsetof(weft_backend, shutdown))) be->shutdown();
}

int weft_device_current(weft_device dev) {
  const weft_backend *be = weft_backend_get(dev);
  if (!be) return -1;
  return has_member(be, offsetof(weft_backend, current_device)) ? be->current_device() : 0;
}

weft_status weft_device_synchronize(weft_device dev) { DISPATCH(dev, synchronize); }

weft_device weft_ptr_device(const void *ptr) {
  if (!ptr) return WEFT_CPU;
  for (int d = 0; d < WEFT_DEVICE_COUNT; d++) {
    const weft_backend *be = weft_backend_get((weft_device)d);
    if (d != WEFT_CPU && be && has_member(be, offsetof(weft_backend, contains)) &&
        be->contains(ptr))
      return (weft_device)d;
  }
  return WEFT_CPU;
}

/* ------------------------------------------------------------------ memory */

weft_status weft_memset(weft_device dev, void *dst, int value, size_t bytes) {
  DISPATCH(dev, memset, dst, value, bytes);
}

weft_status weft_memcpy(weft_device dev, void *dst, const void *src, size_t bytes,
                        weft_copy_kind kind) {
  DISPATCH(dev, memcpy, dst, src, bytes, kind);
}

weft_status weft_memcpy_async(weft_device dev, void *dst, const void *src, size_t bytes,
                              weft_copy_kind kind, weft_stream_id s) {
  DISPATCH(dev, memcpy_async, dst, src, bytes, kind, s);
}

weft_status weft_record_stream(weft_device dev, void *ptr, weft_stream_id s) {
  DISPATCH(dev, record_stream, ptr, s);
}

weft_status weft_alloc_pinned(weft_device dev, size_t bytes, void **out) {
  if (!out) return weft_error(WEFT_ERR_INVALID, "alloc_pinned: out is NULL");
  *out = NULL;
  const weft_backend *be = weft_backend_get(dev);
  if (be && has_member(be, offsetof(weft_backend, host_alloc_pinned)))
    return be->host_alloc_pinned(bytes, out);
  return weft_alloc(WEFT_CPU, bytes, out);
}

weft_status weft_device_model(weft_device dev, char *buf, size_t cap) {
  if (!buf || cap == 0) return weft_error(WEFT_ERR_INVALID, "device_model: no buffer");
  buf[0] = '\0';
  if (dev == WEFT_CPU) {
    snprintf(buf, cap, "cpu");
    return WEFT_OK;
  }
  DISPATCH(dev, device_model, buf, cap);
}

void weft_free_pinned(weft_device dev, void *ptr) {
  if (!ptr) return;
  const weft_backend *be = weft_backend_get(dev);
  if (be && has_member(be, offsetof(weft_backend, host_free_pinned)))
    be->host_free_pinned(ptr);
  else
    weft_free(ptr);
}

/* ------------------------------------------------------------------ events */

weft_status weft_event_record(weft_device dev, weft_stream_id s, weft_event **ev) {
  if (ev) *ev = NULL;
  DISPATCH(dev, event_record, s, ev);
}
weft_status weft_stream_wait_event(weft_device dev, weft_stream_id s, weft_event *ev) {
  DISPATCH(dev, stream_wait_event, s, ev);
}
weft_status weft_event_synchronize(weft_device dev, weft_event *ev) {
  DISPATCH(dev, event_synchronize, ev);
}
weft_status weft_event_query(weft_device dev, weft_event *ev, bool *done) {
  DISPATCH(dev, event_query, ev, done);
}
weft_status weft_event_elapsed_ms(weft_device dev, weft_event *start, weft_event *end, float *ms) {
  DISPATCH(dev, event_elapsed_ms, start, end, ms);
}
void weft_event_destroy(weft_device dev, weft_event *ev) {
  const weft_backend *be = weft_backend_get(dev);
  if (ev && be && has_member(be, offsetof(weft_backend, event_destroy))) be->event_destroy(ev);
}
const char *weft_stream_name(weft_stream_id s) {
  static const char *const names[WEFT_STREAM_COUNT] = {"compute", "comm", "fsdp_all_gather",
                                                       "fsdp_reduce_scatter"};
  return (unsigned)s < WEFT_STREAM_COUNT ? names[s] : "?";
}

void *weft_device_stream_handle(weft_device dev, weft_stream_id s) {
  const weft_backend *be = weft_backend_get(dev);
  if (!be || !has_member(be, offsetof(weft_backend, stream_handle))) return NULL;
  return be->stream_handle(s);
}

/* ----------------------------------------------------------------- options */

weft_status weft_device_set_matmul_precision(weft_device dev, weft_matmul_precision p) {
  if ((unsigned)p > WEFT_MATMUL_BF16)
    return weft_error(WEFT_ERR_INVALID, "unknown matmul precision %d", (int)p);
  DISPATCH(dev, set_matmul_precision, p);
}
weft_matmul_precision weft_device_matmul_precision(weft_device dev) {
  const weft_backend *be = weft_backend_get(dev);
  if (!be || !has_member(be, offsetof(weft_backend, matmul_precision))) return WEFT_MATMUL_F32;
  return be->matmul_precision();
}
weft_status weft_device_cache_stats(weft_device dev, weft_cache_stats *out) {
  if (!out) return weft_error(WEFT_ERR_INVALID, "out is NULL");
  memset(out, 0, sizeof *out);
  DISPATCH(dev, cache_stats, out);
}
weft_status weft_device_empty_cache(weft_device dev) { DISPATCH(dev, empty_cache); }

/* ----------------------------------------------------------------- compute */

weft_status weft_backend_sgemm(weft_device dev, bool trans_a, bool trans_b, int64_t m, int64_t n,
                               int64_t k, float alpha, const float *a, int64_t lda, const float *b,
                               int64_t ldb, float beta, float *c, int64_t ldc) {
  DISPATCH(dev, sgemm, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
weft_status weft_backend_sgemm_strided_batched(weft_device dev, bool trans_a, bool trans_b,
                                               int64_t m, int64_t n, int64_t k, float alpha,
                                               const float *a, int64_t lda, int64_t stride_a,
                                               const float *b, int64_t ldb, int64_t stride_b,
                                               float beta, float *c, int64_t ldc, int64_t stride_c,
                                               int64_t count) {
  DISPATCH(dev, sgemm_strided_batched, trans_a, trans_b, m, n, k, alpha, a, lda, stride_a, b, ldb,
           stride_b, beta, c, ldc, stride_c, count);
}
weft_status weft_backend_gemm_bf16(weft_device dev, bool trans_a, bool trans_b, int64_t m,
                                   int64_t n, int64_t k, float alpha, const uint16_t *a,
                                   int64_t lda, const uint16_t *b, int64_t ldb, float beta,
                                   float *c, int64_t ldc) {
  DISPATCH(dev, gemm_bf16, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

weft_status weft_backend_embedding_forward(weft_device dev, float *out, const int32_t *tokens,
                                           const float *weight, int64_t N, int64_t V, int64_t C) {
  DISPATCH(dev, embedding_forward, out, tokens, weight, N, V, C);
}
weft_status weft_backend_embedding_backward(weft_device dev, float *dweight, const int32_t *tokens,
                                            const float *dout, int64_t N, int64_t V, int64_t C) {
  DISPATCH(dev, embedding_backward, dweight, tokens, dout, N, V, C);
}
weft_status weft_backend_embedding_range_forward(weft_device dev, float *out, const int32_t *tokens,
                                                 const float *weight_local, int64_t N, int64_t v0,
                                                 int64_t nv, int64_t C) {
  DISPATCH(dev, embedding_range_forward, out, tokens, weight_local, N, v0, nv, C);
}
weft_status weft_backend_embedding_range_backward(weft_device dev, float *dweight_local,
                                                  const int32_t *tokens, const float *dout,
                                                  int64_t N, int64_t v0, int64_t nv, int64_t C) {
  DISPATCH(dev, embedding_range_backward, dweight_local, tokens, dout, N, v0, nv, C);
}
weft_status weft_backend_linear_forward(weft_device dev, float *out, const float *inp,
                                        const float *weight, const float *bias, int64_t N,
                                        int64_t IC, int64_t OC) {
  DISPATCH(dev, linear_forward, out, inp, weight, bias, N, IC, OC);
}
weft_status weft_backend_linear_backward(weft_device dev, float *dinp, float *dweight, float *dbias,
                                         const float *dout, const float *inp, const float *weight,
                                         int64_t N, int64_t IC, int64_t OC, bool accumulate_dinp,
                                         bool accumulate_dweight) {
  DISPATCH(dev, linear_backward, dinp, dweight, dbias, dout, inp, weight, N, IC, OC,
           accumulate_dinp, accumulate_dweight);
}
weft_status weft_backend_rmsnorm_forward(weft_device dev, float *out, float *rstd, const float *inp,
                                         const float *weight, int64_t N, int64_t C, float eps) {
  DISPATCH(dev, rmsnorm_forward, out, rstd, inp, weight, N, C, eps);
}
weft_status weft_backend_rmsnorm_backward(weft_device dev, float *dinp, float *dweight,
                                          const float *dout, const float *inp, const float *weight,
                                          const float *rstd, int64_t N, int64_t C,
                                          bool accumulate_dinp) {
  DISPATCH(dev, rmsnorm_backward, dinp, dweight, dout, inp, weight, rstd, N, C, accumulate_dinp);
}
weft_status weft_backend_rope_tables(weft_device dev, float *cosb, float *sinb, int64_t max_pos,
                                     int64_t hd, double theta) {
  DISPATCH(dev, rope_tables, cosb, sinb, max_pos, hd, theta);
}
weft_status weft_backend_rope_forward(weft_device dev, float *out, const float *inp,
                                      const float *cosb, const float *sinb, int64_t max_pos,
                                      int64_t B, int64_t T, int64_t NH, int64_t hd, int64_t pos0) {
  DISPATCH(dev, rope_forward, out, inp, cosb, sinb, max_pos, B, T, NH, hd, pos0);
}
weft_status weft_backend_rope_backward(weft_device dev, float *dinp, const float *dout,
                                       const float *cosb, const float *sinb, int64_t max_pos,
                                       int64_t B, int64_t T, int64_t NH, int64_t hd, int64_t pos0) {
  DISPATCH(dev, rope_backward, dinp, dout, cosb, sinb, max_pos, B, T, NH, hd, pos0);
}
size_t weft_backend_attention_scratch_bytes(weft_device dev, int64_t B, int64_t T, int64_t H,
                                            int64_t Hkv, int64_t hd) {
  const weft_backend *be = weft_backend_get(dev);
  if (!be || !has_member(be, offsetof(weft_backend, attention_scratch_bytes))) return 0;
  return be->attention_scratch_bytes(B, T, H, Hkv, hd);
}
weft_status weft_backend_attention_forward(weft_device dev, float *out, float *lse, const float *q,
                                           const float *k, const float *v, int64_t B, int64_t T,
                                           int64_t H, int64_t Hkv, int64_t hd, bool causal,
                                           void *scratch) {
  DISPATCH(dev, attention_forward, out, lse, q, k, v, B, T, H, Hkv, hd, causal, scratch);
}
weft_status weft_backend_attention_backward(weft_device dev, float *dq, float *dk, float *dv,
                                            const float *dout, const float *q, const float *k,
                                            const float *v, const float *lse, const float *out,
                                            int64_t B, int64_t T, int64_t H, int64_t Hkv,
                                            int64_t hd, bool causal, void *scratch) {
  DISPATCH(dev, attention_backward, dq, dk, dv, dout, q, k, v, lse, out, B, T, H, Hkv, hd, causal,
           scratch);
}
weft_status weft_backend_swiglu_forward(weft_device dev, float *out, const float *a, const float *b,
                                        int64_t n) {
  DISPATCH(dev, swiglu_forward, out, a, b, n);
}
weft_status weft_backend_swiglu_backward(weft_device dev, float *da, float *db, const float *dout,
                                         const float *a, const float *b, int64_t n) {
  DISPATCH(dev, swiglu_backward, da, db, dout, a, b, n);
}
weft_status weft_backend_residual_forward(weft_device dev, float *out, const float *a,
                                          const float *b, int64_t n) {
  DISPATCH(dev, residual_forward, out, a, b, n);
}
weft_status weft_backend_residual_backward(weft_device dev, float *da, float *db, const float *dout,
                                           int64_t n) {
  DISPATCH(dev, residual_backward, da, db, dout, n);
}
weft_status weft_backend_cross_entropy_forward(weft_device dev, double *loss, float *lse,
                                               const float *logits, const int32_t *targets,
                                               int64_t N, int64_t V) {
  DISPATCH(dev, cross_entropy_forward, loss, lse, logits, targets, N, V);
}
weft_status weft_backend_cross_entropy_backward(weft_device dev, float *dlogits,
                                                const float *logits, const float *lse,
                                                const int32_t *targets, int64_t N, int64_t V,
                                                float scale) {
  DISPATCH(dev, cross_entropy_backward, dlogits, logits, lse, targets, N, V, scale);
}
weft_status weft_backend_cross_entropy_local_max(weft_device dev, float *row_max,
                                                 const float *logits_local, int64_t N, int64_t nv) {
  DISPATCH(dev, cross_entropy_local_max, row_max, logits_local, N, nv);
}
weft_status weft_backend_cross_entropy_local_target(weft_device dev, float *target_logit,
                                                    const float *logits_local,
                                                    const int32_t *targets, int64_t N, int64_t v0,
                                                    int64_t nv) {
  DISPATCH(dev, cross_entropy_local_target, target_logit, logits_local, targets, N, v0, nv);
}
weft_status weft_backend_cross_entropy_local_sumexp(weft_device dev, float *sumexp,
                                                    const float *logits_local, const float *gmax,
                                                    int64_t N, int64_t nv) {
  DISPATCH(dev, cross_entropy_local_sumexp, sumexp, logits_local, gmax, N, nv);
}
weft_status weft_backend_cross_entropy_finish(weft_device dev, double *loss, float *lse,
                                              const float *gmax, const float *gsum,
                                              const float *gtarget, int64_t N) {
  DISPATCH(dev, cross_entropy_finish, loss, lse, gmax, gsum, gtarget, N);
}
weft_status weft_backend_cross_entropy_backward_local(weft_device dev, float *dlogits_local,
                                                      const float *logits_local, const float *lse,
                                                      const int32_t *targets, int64_t N, int64_t v0,
                                                      int64_t nv, float scale) {
  DISPATCH(dev, cross_entropy_backward_local, dlogits_local, logits_local, lse, targets, N, v0, nv,
           scale);
}

weft_status weft_backend_adamw_multi(weft_device dev, float *const *param, const float *const *grad,
                                     float *const *m, float *const *v, float *const *vmax,
                                     const int64_t *n, int ntensors, int64_t step,
                                     const weft_adamw_params *hp) {
  DISPATCH(dev, adamw_multi, param, grad, m, v, vmax, n, ntensors, step, hp);
}
weft_status weft_backend_sgd_multi(weft_device dev, float *const *param, const float *const *grad,
                                   float *const *buf, const int64_t *n, int ntensors, int64_t step,
                                   const weft_sgd_params *hp) {
  DISPATCH(dev, sgd_multi, param, grad, buf, n, ntensors, step, hp);
}
weft_status weft_backend_sumsq_multi(weft_device dev, const float *const *x, const int64_t *n,
                                     int ntensors, double *out) {
  DISPATCH(dev, sumsq_multi, x, n, ntensors, out);
}
weft_status weft_backend_scale_multi(weft_device dev, float *const *x, const int64_t *n,
                                     int ntensors, float alpha) {
  DISPATCH(dev, scale_multi, x, n, ntensors, alpha);
}

weft_status weft_backend_flat_pack(weft_device dev, void *flat, weft_dtype flat_dtype,
                                   const weft_flat_piece *pieces, int npieces) {
  DISPATCH(dev, flat_pack, flat, flat_dtype, pieces, npieces);
}
weft_status weft_backend_flat_split(weft_device dev, const void *flat, weft_dtype flat_dtype,
                                    const weft_flat_piece *pieces, int npieces) {
  DISPATCH(dev, flat_split, flat, flat_dtype, pieces, npieces);
}
weft_status weft_backend_flat_accumulate(weft_device dev, const void *flat, weft_dtype flat_dtype,
                                         const weft_flat_piece *pieces, int npieces, float scale) {
  DISPATCH(dev, flat_accumulate, flat, flat_dtype, pieces, npieces, scale);
}

weft_status weft_backend_layernorm_forward(weft_device dev, float *out, float *mean, float *rstd,
                                           const float *inp, const float *weight, const float *bias,
                                           int64_t N, int64_t C, float eps) {
  DISPATCH(dev, layernorm_forward, out, mean, rstd, inp, weight, bias, N, C, eps);
}
weft_status weft_backend_layernorm_backward(weft_device dev, float *dinp, float *dweight,
                                            float *dbias, const float *dout, const float *inp,
                                            const float *weight, const float *mean,
                                            const float *rstd, int64_t N, int64_t C,
                                            bool accumulate_dinp) {
  DISPATCH(dev, layernorm_backward, dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C,
           accumulate_dinp);
}
weft_status weft_backend_activation_forward(weft_device dev, weft_activation act, float *out,
                                            const float *inp, int64_t n) {
  DISPATCH(dev, activation_forward, act, out, inp, n);
}
weft_status weft_backend_activation_backward(weft_device dev, weft_activation act, float *dinp,
                                             const float *dout, const float *inp, int64_t n,
                                             bool accumulate) {
  DISPATCH(dev, activation_backward, act, dinp, dout, inp, n, accumulate);
}

weft_status weft_backend_activation_forward_dt(weft_device dev, weft_activation act, weft_dtype dt,
                                               void *out, const void *inp, int64_t n) {
  if (dt == WEFT_F32) DISPATCH(dev, activation_forward, act, (float *)out, (const float *)inp, n);
  DISPATCH(dev, activation_forward_dt, act, dt, out, inp, n);
}

weft_status weft_backend_activation_backward_dt(weft_device dev, weft_activation act, weft_dtype dt,
                                                void *dinp, const void *dout, const void *inp,
                                                int64_t n, bool accumulate) {
  if (dt == WEFT_F32)
    DISPATCH(dev, activation_backward, act, (float *)dinp, (const float *)dout, (const float *)inp,
             n, accumulate);
  DISPATCH(dev, activation_backward_dt, act, dt, dinp, dout, inp, n, accumulate);
}

weft_status weft_backend_swiglu_forward_dt(weft_device dev, weft_dtype dt, void *out, const void *a,
                                           const void *b, int64_t n) {
  if (dt == WEFT_F32)
    DISPATCH(dev, swiglu_forward, (float *)out, (const float *)a, (const float *)b, n);
  DISPATCH(dev, swiglu_forward_dt, dt, out, a, b, n);
}

weft_status weft_backend_swiglu_backward_dt(weft_device dev, weft_dtype dt, void *da, void *db,
                                            const void *dout, const void *a, const void *b,
                                            int64_t n) {
  if (dt == WEFT_F32)
    DISPATCH(dev, swiglu_backward, (float *)da, (float *)db, (const float *)dout, (const float *)a,
             (const float *)b, n);
  DISPATCH(dev, swiglu_backward_dt, dt, da, db, dout, a, b, n);
}

weft_status weft_backend_layernorm_forward_dt(weft_device dev, weft_dtype dt, void *out,
                                              float *mean, float *rstd, const void *inp,
                                              const void *weight, const void *bias, int64_t N,
                                              int64_t C, float eps) {
  if (dt == WEFT_F32)
    DISPATCH(dev, layernorm_forward, (float *)out, mean, rstd, (const float *)inp,
             (const float *)weight, (const float *)bias, N, C, eps);
  DISPATCH(dev, layernorm_forward_dt, dt, out, mean, rstd, inp, weight, bias, N, C, eps);
}

weft_status weft_backend_layernorm_backward_dt(weft_device dev, weft_dtype dt, void *dinp,
                                               float *dweight, float *dbias, const void *dout,
                                               const void *inp, const void *weight,
                                               const float *mean, const float *rstd, int64_t N,
                                               int64_t C, bool accumulate_dinp) {
  if (dt == WEFT_F32)
    DISPATCH(dev, layernorm_backward, (float *)dinp, dweight, dbias, (const float *)dout,
             (const float *)inp, (const float *)weight, mean, rstd, N, C, accumulate_dinp);
  DISPATCH(dev, layernorm_backward_dt, dt, dinp, dweight, dbias, dout, inp, weight, mean, rstd, N,
           C, accumulate_dinp);
}

weft_status weft_backend_softmax_forward_dt(weft_device dev, weft_dtype dt, void *out,
                                            const void *inp, int64_t N, int64_t C) {
  if (dt == WEFT_F32) DISPATCH(dev, softmax_forward, (float *)out, (const float *)inp, N, C);
  DISPATCH(dev, softmax_forward_dt, dt, out, inp, N, C);
}

weft_status weft_backend_softmax_backward_dt(weft_device dev, weft_dtype dt, void *dinp,
                                             const void *dout, const void *out, int64_t N,
                                             int64_t C, bool accumulate) {
  if (dt == WEFT_F32)
    DISPATCH(dev, softmax_backward, (float *)dinp, (const float *)dout, (const float *)out, N, C,
             accumulate);
  DISPATCH(dev, softmax_backward_dt, dt, dinp, dout, out, N, C, accumulate);
}

weft_status weft_backend_rmsnorm_forward_dt(weft_device dev, weft_dtype dt, void *out, float *rstd,
                                            const void *inp, const void *weight, int64_t N,
                                            int64_t C, float eps) {
  if (dt == WEFT_F32)
    DISPATCH(dev, rmsnorm_forward, (float *)out, rstd, (const float *)inp, (const float *)weight, N,
             C, eps);
  DISPATCH(dev, rmsnorm_forward_dt, dt, out, rstd, inp, weight, N, C, eps);
}

weft_status weft_backend_rmsnorm_backward_dt(weft_device dev, weft_dtype dt, void *dinp,
                                             float *dweight, const void *dout, const void *inp,
                                             const void *weight, const float *rstd, int64_t N,
                                             int64_t C, bool accumulate_dinp) {
  if (dt == WEFT_F32)
    DISPATCH(dev, rmsnorm_backward, (float *)dinp, dweight, (const float *)dout, (const float *)inp,
             (const float *)weight, rstd, N, C, accumulate_dinp);
  DISPATCH(dev, rmsnorm_backward_dt, dt, dinp, dweight, dout, inp, weight, rstd, N, C,
           accumulate_dinp);
}

weft_status weft_backend_cross_entropy_forward_dt(weft_device dev, weft_dtype dt, double *loss,
                                                  float *lse, const void *logits,
                                                  const int32_t *targets, int64_t N, int64_t V) {
  if (dt == WEFT_F32)
    DISPATCH(dev, cross_entropy_forward, loss, lse, (const float *)logits, targets, N, V);
  DISPATCH(dev, cross_entropy_forward_dt, dt, loss, lse, logits, targets, N, V);
}

weft_status weft_backend_cross_entropy_backward_dt(weft_device dev, weft_dtype dt, void *dlogits,
                                                   const void *logits, const float *lse,
                                                   const int32_t *targets, int64_t N, int64_t V,
                                                   float scale) {
  if (dt == WEFT_F32)
    DISPATCH(dev, cross_entropy_backward, (float *)dlogits, (const float *)logits, lse, targets, N,
             V, scale);
  DISPATCH(dev, cross_entropy_backward_dt, dt, dlogits, logits, lse, targets, N, V, scale);
}

weft_status weft_backend_cross_entropy_local_max_dt(weft_device dev, weft_dtype dt, float *row_max,
                                                    const void *logits_local, int64_t N,
                                                    int64_t nv) {
  if (dt == WEFT_F32)
    DISPATCH(dev, cross_entropy_local_max, row_max, (const float *)logits_local, N, nv);
  DISPATCH(dev, cross_entropy_local_max_dt, dt, row_max, logits_local, N, nv);
}

weft_status weft_backend_cross_entropy_local_target_dt(weft_device dev, weft_dtype dt,
                                                       float *target_logit,
                                                       const void *logits_local,
                                                       const int32_t *targets, int64_t N,
                                                       int64_t v0, int64_t nv) {
  if (dt == WEFT_F32)
    DISPATCH(dev, cross_entropy_local_target, target_logit, (const float *)logits_local, targets, N,
             v0, nv);
  DISPATCH(dev, cross_entropy_local_target_dt, dt, target_logit, logits_local, targets, N, v0, nv);
}

weft_status weft_backend_cross_entropy_local_sumexp_dt(weft_device dev, weft_dtype dt,
                                                       float *sumexp, const void *logits_local,
                                                       const float *gmax, int64_t N, int64_t nv) {
  if (dt == WEFT_F32)
    DISPATCH(dev, cross_entropy_local_sumexp, sumexp, (const float *)logits_local, gmax, N, nv);
  DISPATCH(dev, cross_entropy_local_sumexp_dt, dt, sumexp, logits_local, gmax, N, nv);
}

weft_status weft_backend_cross_entropy_backward_local_dt(weft_device dev, weft_dtype dt,
                                                         void *dlogits_local,
                                                         const void *logits_local, const float *lse,
                                                         const int32_t *targets, int64_t N,
                                                         int64_t v0, int64_t nv, float scale) {
  if (dt == WEFT_F32)
    DISPATCH(dev, cross_entropy_backward_local, (float *)dlogits_local, (const float *)logits_local,
             lse, targets, N, v0, nv, scale);
  DISPATCH(dev, cross_entropy_backward_local_dt, dt, dlogits_local, logits_local, lse, targets, N,
           v0, nv, scale);
}

weft_status weft_backend_embedding_range_forward_dt(weft_device dev, weft_dtype dt, void *out,
                                                    const int32_t *tokens, const void *weight_local,
                                                    int64_t N, int64_t v0, int64_t nv, int64_t C) {
  if (dt == WEFT_F32)
    DISPATCH(dev, embedding_range_forward, (float *)out, tokens, (const float *)weight_local, N, v0,
             nv, C);
  DISPATCH(dev, embedding_range_forward_dt, dt, out, tokens, weight_local, N, v0, nv, C);
}

weft_status weft_backend_embedding_range_backward_dt(weft_device dev, weft_dtype dt,
                                                     float *dweight_local, const int32_t *tokens,
                                                     const void *dout, int64_t N, int64_t v0,
                                                     int64_t nv, int64_t C) {
  if (dt == WEFT_F32)
    DISPATCH(dev, embedding_range_backward, dweight_local, tokens, (const float *)dout, N, v0, nv,
             C);
  DISPATCH(dev, embedding_range_backward_dt, dt, dweight_local, tokens, dout, N, v0, nv, C);
}

weft_status weft_backend_rope_forward_dt(weft_device dev, weft_dtype dt, void *out, const void *inp,
                                         const float *cosb, const float *sinb, int64_t max_pos,
                                         int64_t B, int64_t T, int64_t NH, int64_t hd,
                                         int64_t pos0) {
  if (dt == WEFT_F32)
    DISPATCH(dev, rope_forward, (float *)out, (const float *)inp, cosb, sinb, max_pos, B, T, NH, hd,
             pos0);
  DISPATCH(dev, rope_forward_dt, dt, out, inp, cosb, sinb, max_pos, B, T, NH, hd, pos0);
}

weft_status weft_backend_rope_backward_dt(weft_device dev, weft_dtype dt, void *dinp,
                                          const void *dout, const float *cosb, const float *sinb,
                                          int64_t max_pos, int64_t B, int64_t T, int64_t NH,
                                          int64_t hd, int64_t pos0) {
  if (dt == WEFT_F32)
    DISPATCH(dev, rope_backward, (float *)dinp, (const float *)dout, cosb, sinb, max_pos, B, T, NH,
             hd, pos0);
  DISPATCH(dev, rope_backward_dt, dt, dinp, dout, cosb, sinb, max_pos, B, T, NH, hd, pos0);
}

weft_status weft_backend_gemm_dt(weft_device dev, bool trans_a, bool trans_b, int64_t m, int64_t n,
                                 int64_t k, float alpha, weft_dtype ab_dt, const void *a,
                                 int64_t lda, const void *b, int64_t ldb, float beta,
                                 weft_dtype c_dt, void *c, int64_t ldc, const void *bias) {
  if (ab_dt == WEFT_F32 && c_dt == WEFT_F32 && !bias)
    DISPATCH(dev, sgemm, trans_a, trans_b, m, n, k, alpha, (const float *)a, lda, (const float *)b,
             ldb, beta, (float *)c, ldc);
  DISPATCH(dev, gemm_dt, trans_a, trans_b, m, n, k, alpha, ab_dt, a, lda, b, ldb, beta, c_dt, c,
           ldc, bias);
}

/* rows checked against the operands' widths (0: packed); *packed says
 * whether all six are packed. */
static weft_status check_attention_rows(const weft_attention_rows *rows, int64_t H, int64_t Hkv,
                                        int64_t hd, bool *packed) {
  *packed = true;
  if (!rows) return WEFT_OK;
  const int64_t ld[6] = {rows->q, rows->k, rows->v, rows->dq, rows->dk, rows->dv};
  const char *names[6] = {"q", "k", "v", "dq", "dk", "dv"};
  for (int i = 0; i < 6; i++) {
    const int64_t w = (i % 3 == 0 ? H : Hkv) * hd;
    if (ld[i] != 0 && ld[i] < w)
      return weft_error(WEFT_ERR_INVALID,
                        "attention: row stride of %s is %lld, below its %lld packed elements",
                        names[i], (long long)ld[i], (long long)w);
    if (ld[i] != 0 && ld[i] != w) *packed = false;
  }
  return WEFT_OK;
}

bool weft_backend_attention_takes_rows(weft_device dev) {
  const weft_backend *be = weft_backend_get(dev);
  return be && has_member(be, offsetof(weft_backend, attention_forward_dt)) &&
         has_member(be, offsetof(weft_backend, attention_backward_dt));
}

weft_status weft_backend_attention_forward_dt(weft_device dev, weft_dtype dt, void *out, float *lse,
                                              const void *q, const void *k, const void *v,
                                              int64_t B, int64_t T, int64_t H, int64_t Hkv,
                                              int64_t hd, bool causal,
                                              const weft_attention_rows *rows, void *scratch) {
  bool packed;
  WEFT_CHECK(check_attention_rows(rows, H, Hkv, hd, &packed));
  if (dt == WEFT_F32 && packed)
    return weft_backend_attention_forward(dev, (float *)out, lse, (const float *)q,
                                          (const float *)k, (const float *)v, B, T, H, Hkv, hd,
                                          causal, scratch);
  DISPATCH(dev, attention_forward_dt, dt, out, lse, q, k, v, B, T, H, Hkv, hd, causal,
           packed ? NULL : rows, scratch);
}

weft_status weft_backend_attention_backward_dt(weft_device dev, weft_dtype dt, void *dq, void *dk,
                                               void *dv, const void *dout, const void *q,
                                               const void *k, const void *v, const float *lse,
                                               const void *out, int64_t B, int64_t T, int64_t H,
                                               int64_t Hkv, int64_t hd, bool causal,
                                               const weft_attention_rows *rows, void *scratch) {
  bool packed;
  WEFT_CHECK(check_attention_rows(rows, H, Hkv, hd, &packed));
  if (dt == WEFT_F32 && packed)
    return weft_backend_attention_backward(dev, (float *)dq, (float *)dk, (float *)dv,
                                           (const float *)dout, (const float *)q, (const float *)k,
                                           (const float *)v, lse, (const float *)out, B, T, H, Hkv,
                                           hd, causal, scratch);
  DISPATCH(dev, attention_backward_dt, dt, dq, dk, dv, dout, q, k, v, lse, out, B, T, H, Hkv, hd,
           causal, packed ? NULL : rows, scratch);
}

weft_status weft_backend_dropout_apply_dt(weft_device dev, weft_dtype dt, void *out,
                                          const void *inp, const float *uniform, float p,
                                          int64_t n) {
  if (dt == WEFT_F32) DISPATCH(dev, dropout_apply, (float *)out, (const float *)inp, uniform, p, n);
  DISPATCH(dev, dropout_apply_dt, dt, out, inp, uniform, p, n);
}
weft_status weft_backend_softmax_forward(weft_device dev, float *out, const float *inp, int64_t N,
                                         int64_t C) {
  DISPATCH(dev, softmax_forward, out, inp, N, C);
}
weft_status weft_backend_softmax_backward(weft_device dev, float *dinp, const float *dout,
                                          const float *out, int64_t N, int64_t C, bool accumulate) {
  DISPATCH(dev, softmax_backward, dinp, dout, out, N, C, accumulate);
}
weft_status weft_backend_dropout_apply(weft_device dev, float *out, const float *inp,
                                       const float *uniform, float p, int64_t n) {
  DISPATCH(dev, dropout_apply, out, inp, uniform, p, n);
}

/* ------------------------------------------------- tensor entry points */

const weft_backend *weft_backend_for_tensors_(const char *op, size_t offset, int n,
                                              const weft_tensor *const *ts,
                                              const char *const *names, weft_status *st) {
  int first = -1;
  for (int i = 0; i < n; i++) {
    if (!ts[i]) continue;
    if (first < 0) {
      first = i;
      continue;
    }
    if (ts[i]->device != ts[first]->device) {
      char a[128], b[128];
      weft_tensor_describe(ts[first], a, sizeof a);
      weft_tensor_describe(ts[i], b, sizeof b);
      *st = weft_error_at(WEFT_ERR_INVALID, op,
                          "%s is on %s (%s) but %s is on %s (%s): the tensors of one op must be "
                          "on one device",
                          names[first], weft_device_name(ts[first]->device), a, names[i],
                          weft_device_name(ts[i]->device), b);
      return NULL;
    }
  }
  if (first < 0) {
    *st = weft_error_at(WEFT_ERR_INVALID, op, "no tensor given");
    return NULL;
  }
  weft_device dev = ts[first]->device;
  const weft_backend *be = weft_backend_get(dev);
  if (be && has_member(be, offset)) { /* the common case: no message built */
    *st = WEFT_OK;
    return be;
  }
  char a[128];
  weft_tensor_describe(ts[first], a, sizeof a);
  if (!be) {
    weft_backend_no_table_(dev, op);
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", weft_last_error());
    *st = weft_error_at(WEFT_ERR_UNSUPPORTED, op, "%s is %s, and there is %s", names[first], a,
                        strstr(msg, "no backend") ? strstr(msg, "no backend") : msg);
    return NULL;
  }
  *st =
      weft_error_at(WEFT_ERR_UNSUPPORTED, op, "%s is not supported on %s (backend '%s'; %s is %s)",
                    op, weft_device_name(dev), be->name, names[first], a);
  return NULL;
}

weft_status weft_backend_dtype_unsupported_(const char *op, const char *name, const weft_tensor *t,
                                            const char *what) {
  char a[128];
  weft_tensor_describe(t, a, sizeof a);
  return weft_error_at(WEFT_ERR_UNSUPPORTED, op, "%s is %s (%s): %s supports %s", name,
                       weft_dtype_name(t->dtype), a, weft_device_name(t->device), what);
}
