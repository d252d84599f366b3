/* kernels/cpu/embedding.c — CPU fp32 embedding lookups (layers.h): the
 * whole-table forward (a row copy per token) and backward (scatter-add of
 * dout rows into dweight, in token order, so repeated tokens add up in a
 * fixed order), and the vocab-sharded range forms used by tensor-parallel
 * rowwise embeddings (rows outside this rank's [v0, v0 + nv) give zeros
 * and no gradient). Token ids are checked before anything is written. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "arg_checks.h"
#include "cpu_internal.h"
#include "layers.h"
#include "simd.h"

/* Errors name the operation, as every backend's do (arg_checks.h):
 * "embedding_forward: ...", not the C function. */
#undef weft_error
#define weft_error(st, ...) weft_error_at((st), weft_op_name_(__func__), __VA_ARGS__)

weft_status weft_embedding_forward(float *out, const int32_t *tokens, const float *weight,
                                   int64_t N, int64_t V, int64_t C) {
  CHECK_SIZES(N, V, C);
  CHECK_PTR(out, N * C);
  CHECK_PTR(tokens, N);
  CHECK_PTR(weight, V * C);
  for (int64_t n = 0; n < N; n++)
    if (tokens[n] < 0 || tokens[n] >= V)
      return weft_error(WEFT_ERR_INVALID, "tokens[%lld] = %d is outside the vocabulary [0, %lld)",
                        (long long)n, tokens[n], (long long)V);
  for (int64_t n = 0; n < N; n++)
    memcpy(out + n * C, weight + (int64_t)tokens[n] * C, (size_t)C * sizeof(float));
  return WEFT_OK;
}

weft_status weft_embedding_backward(float *dweight, const int32_t *tokens, const float *dout,
                                    int64_t N, int64_t V, int64_t C) {
  CHECK_SIZES(N, V, C);
  CHECK_PTR(dweight, V * C);
  CHECK_PTR(tokens, N);
  CHECK_PTR(dout, N * C);
  for (int64_t n = 0; n < N; n++)
    if (tokens[n] < 0 || tokens[n] >= V)
      return weft_error(WEFT_ERR_INVALID, "tokens[%lld] = %d is outside the vocabulary [0, %lld)",
                        (long long)n, tokens[n], (long long)V);
  for (int64_t n = 0; n < N; n++) row_add(dweight + (int64_t)tokens[n] * C, dout + n * C, C);
  return WEFT_OK;
}

/* The range forms take any token >= 0 (ids of other shards give zeros). */
static weft_status check_tokens_nonneg(const char *op, const int32_t *tokens, int64_t N) {
  for (int64_t n = 0; n < N; n++)
    if (tokens[n] < 0)
      return weft_error_at(WEFT_ERR_INVALID, op, "tokens[%lld] = %d is negative", (long long)n,
                           tokens[n]);
  return WEFT_OK;
}

/* The range forms for rows of element size es (dtype dt):
 * the forward copies rows as they are (exact in any dtype); the backward
 * adds each dout row, widened to f32, into the f32 dweight with the f32
 * member's row_add in the same token order, so a bf16 / f16 dout gives
 * the f32 member's bits on the widened values. */
static weft_status range_forward(const char *op, weft_dtype dt, void *out, const int32_t *tokens,
                                 const void *weight_local, int64_t N, int64_t v0, int64_t nv,
                                 int64_t C) {
  CHECK_SIZES_AT(op, N, v0, nv, C);
  CHECK_PTR_AT(op, out, N * C);
  CHECK_PTR_AT(op, tokens, N);
  CHECK_PTR_AT(op, weight_local, nv * C);
  WEFT_CHECK(check_tokens_nonneg(op, tokens, N));
  const size_t row = (size_t)C * weft_dtype_size(dt);
  for (int64_t n = 0; n < N; n++) {
    int64_t r = (int64_t)tokens[n] - v0;
    char *o = (char *)out + (size_t)n * row;
    if (r >= 0 && r < nv)
      memcpy(o, (const char *)weight_local + (size_t)r * row, row);
    else
      memset(o, 0, row); /* +0.0 in f32, bf16 and f16 alike */
  }
  return WEFT_OK;
}

static weft_status range_backward(const char *op, weft_dtype dt, float *dweight_local,
                                  const int32_t *tokens, const void *dout, int64_t N, int64_t v0,
                                  int64_t nv, int64_t C) {
  CHECK_SIZES_AT(op, N, v0, nv, C);
  CHECK_PTR_AT(op, dweight_local, nv * C);
  CHECK_PTR_AT(op, tokens, N);
  CHECK_PTR_AT(op, dout, N * C);
  WEFT_CHECK(check_tokens_nonneg(op, tokens, N));
  float *wide = NULL;
  if (dt != WEFT_F32 && N > 0 && C > 0) {
    wide = malloc(sizeof(float) * (size_t)C);
    if (!wide)
      return weft_error_at(WEFT_ERR_OOM, op, "no memory for a row of %lld floats", (long long)C);
  }
  const size_t es = weft_dtype_size(dt);
  for (int64_t n = 0; n < N; n++) {
    int64_t r = (int64_t)tokens[n] - v0;
    if (r < 0 || r >= nv) continue;
    const void *g = (const char *)dout + (size_t)(n * C) * es;
    if (wide) weft_cpu_to_f32_(wide, g, dt, C);
    row_add(dweight_local + r * C, wide ? wide : (const float *)g, C);
  }
  free(wide);
  return WEFT_OK;
}

weft_status weft_embedding_range_forward(float *out, const int32_t *tokens,
                                         const float *weight_local, int64_t N, int64_t v0,
                                         int64_t nv, int64_t C) {
  return range_forward(weft_op_name_(__func__), WEFT_F32, out, tokens, weight_local, N, v0, nv, C);
}

weft_status weft_embedding_range_backward(float *dweight_local, const int32_t *tokens,
                                          const float *dout, int64_t N, int64_t v0, int64_t nv,
                                          int64_t C) {
  return range_backward(weft_op_name_(__func__), WEFT_F32, dweight_local, tokens, dout, N, v0, nv,
                        C);
}

/* bf16 / f16 (backend.h embedding_range_*_dt); f32 is the members above */
weft_status weft_cpu_embedding_range_forward_dt_(weft_dtype dt, void *out, const int32_t *tokens,
                                                 const void *weight_local, int64_t N, int64_t v0,
                                                 int64_t nv, int64_t C) {
  const char *op = "embedding_range_forward_dt";
  WEFT_CHECK_STORAGE_DT_(op, dt);
  return range_forward(op, dt, out, tokens, weight_local, N, v0, nv, C);
}

weft_status weft_cpu_embedding_range_backward_dt_(weft_dtype dt, float *dweight_local,
                                                  const int32_t *tokens, const void *dout,
                                                  int64_t N, int64_t v0, int64_t nv, int64_t C) {
  const char *op = "embedding_range_backward_dt";
  WEFT_CHECK_STORAGE_DT_(op, dt);
  return range_backward(op, dt, dweight_local, tokens, dout, N, v0, nv, C);
}
