/* kernels/cpu/embedding.c — CPU fp32 embedding lookups (layers.h): the
 * whole-table forward (a row copy per token) and backward (scatter-add of
 * dout rows into dweight, in token order, so repeated tokens add up in a
 * fixed order), and the vocab-sharded range forms used by tensor-parallel
 * rowwise embeddings (rows outside this rank's [v0, v0 + nv) give zeros
 * and no gradient). Token ids are checked before anything is written. */
#include <stdint.h>
#include <string.h>

#include "arg_checks.h"
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

weft_status weft_embedding_range_forward(float *out, const int32_t *tokens,
                                         const float *weight_local, int64_t N, int64_t v0,
                                         int64_t nv, int64_t C) {
  CHECK_SIZES(N, v0, nv, C);
  CHECK_PTR(out, N * C);
  CHECK_PTR(tokens, N);
  CHECK_PTR(weight_local, nv * C);
  WEFT_CHECK(check_tokens_nonneg(weft_op_name_(__func__), tokens, N));
  for (int64_t n = 0; n < N; n++) {
    int64_t r = (int64_t)tokens[n] - v0;
    if (r >= 0 && r < nv)
      memcpy(out + n * C, weight_local + r * C, (size_t)C * sizeof(float));
    else
      memset(out + n * C, 0, (size_t)C * sizeof(float));
  }
  return WEFT_OK;
}

weft_status weft_embedding_range_backward(float *dweight_local, const int32_t *tokens,
                                          const float *dout, int64_t N, int64_t v0, int64_t nv,
                                          int64_t C) {
  CHECK_SIZES(N, v0, nv, C);
  CHECK_PTR(dweight_local, nv * C);
  CHECK_PTR(tokens, N);
  CHECK_PTR(dout, N * C);
  WEFT_CHECK(check_tokens_nonneg(weft_op_name_(__func__), tokens, N));
  for (int64_t n = 0; n < N; n++) {
    int64_t r = (int64_t)tokens[n] - v0;
    if (r < 0 || r >= nv) continue;
    row_add(dweight_local + r * C, dout + n * C, C);
  }
  return WEFT_OK;
}
