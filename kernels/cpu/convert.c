/* kernels/cpu/convert.c — contiguous f32 <-> bf16 conversion on the CPU,
 * sixteen elements a step in AVX2 where the CPU has it, else eight with
 * GCC/Clang vector extensions (gcc 12 at -O2 does not vectorise the plain
 * loops: their trip count is unknown). The
 * bits are those of weft_f32_to_bf16_i_ / weft_bf16_to_f32_i_
 * (tensor_internal.h) element by element: widening is exact (the bf16
 * bits in the high half), rounding is to nearest even with a NaN kept
 * quiet and its sign and high payload bits kept. Used by weft_cpu_copy_
 * (the op layer's widening and rounding of 16-bit tensors) and by the
 * bf16 elementwise kernels (cpu/ops.c). Local, no allocation. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_internal.h"
#include "pool.h"
#include "simd.h"
#include "tensor_internal.h"

typedef uint16_t v8h __attribute__((vector_size(16)));
typedef uint32_t v8u __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));

#ifdef HAVE_AVX2_PATH
/* The same integer operations 16 elements a step in AVX2 registers (gcc's
 * baseline-x86-64 code for the vector-extension loops below splits them
 * into SSE halves and does the NaN compare one lane at a time): the same
 * bits, chosen at run time where the CPU has AVX2. */
AVX2_FN static int64_t bf16_to_f32_avx2(float *dst, const uint16_t *src, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm256_loadu_si256((const __m256i *)(src + i));
    const __m256i lo = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_castsi256_si128(h)), 16);
    const __m256i hi = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_extracti128_si256(h, 1)), 16);
    _mm256_storeu_si256((__m256i *)(dst + i), lo);
    _mm256_storeu_si256((__m256i *)(dst + i + 8), hi);
  }
  return i;
}

/* 8 floats to their bf16 bits in 32-bit lanes: rounded to nearest even, a
 * NaN quieted (sign and high payload kept) */
AVX2_FN static inline __m256i bf16_bits_avx2(const float *src) {
  const __m256i u = _mm256_loadu_si256((const __m256i *)src);
  const __m256i one = _mm256_set1_epi32(1);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), one);
  const __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
  const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x0040));
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                         _mm256_set1_epi32(0x7f800000));
  return _mm256_blendv_epi8(rounded, quiet, nan);
}

AVX2_FN static int64_t f32_to_bf16_avx2(uint16_t *dst, const float *src, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    /* packus interleaves the 128-bit lanes: a0-3 b0-3 a4-7 b4-7; the
     * permute puts them back in order (every value fits 16 bits) */
    const __m256i p = _mm256_packus_epi32(bf16_bits_avx2(src + i), bf16_bits_avx2(src + i + 8));
    _mm256_storeu_si256((__m256i *)(dst + i), _mm256_permute4x64_epi64(p, 0xd8));
  }
  return i;
}
#endif

void weft_cpu_bf16_to_f32_(float *dst, const uint16_t *src, int64_t n) {
  int64_t i = 0;
#ifdef HAVE_AVX2_PATH
  if (use_avx2()) i = bf16_to_f32_avx2(dst, src, n);
#endif
  for (; i + 8 <= n; i += 8) {
    v8h h;
    memcpy(&h, src + i, sizeof h);
    v8u u = __builtin_convertvector(h, v8u) << 16;
    memcpy(dst + i, &u, sizeof u);
  }
  for (; i < n; i++) dst[i] = weft_bf16_to_f32_i_(src[i]);
}

void weft_cpu_f32_to_bf16_(uint16_t *dst, const float *src, int64_t n) {
  int64_t i = 0;
#ifdef HAVE_AVX2_PATH
  if (use_avx2()) i = f32_to_bf16_avx2(dst, src, n);
#endif
  const v8u inf = {0x7f800000u, 0x7f800000u, 0x7f800000u, 0x7f800000u,
                   0x7f800000u, 0x7f800000u, 0x7f800000u, 0x7f800000u};
  for (; i + 8 <= n; i += 8) {
    v8u u;
    memcpy(&u, src + i, sizeof u);
    v8u rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    v8u quiet = (u >> 16) | 0x0040u;
    /* |x| > inf bits: NaN (both below 2^31, so a signed compare is right) */
    v8u nan = (v8u)((v8i)(u & 0x7fffffffu) > (v8i)inf);
    v8u r = (rounded & ~nan) | (quiet & nan);
    v8h h = __builtin_convertvector(r, v8h);
    memcpy(dst + i, &h, sizeof h);
  }
  for (; i < n; i++) dst[i] = weft_f32_to_bf16_i_(src[i]);
}

void weft_cpu_to_f32_(float *dst, const void *src, weft_dtype dt, int64_t n) {
  if (dt == WEFT_BF16) {
    weft_cpu_bf16_to_f32_(dst, src, n);
  } else if (dt == WEFT_F16) {
    const uint16_t *s = src;
    for (int64_t i = 0; i < n; i++) dst[i] = weft_f16_to_f32_i_(s[i]);
  } else {
    memcpy(dst, src, (size_t)n * sizeof(float));
  }
}

void weft_cpu_from_f32_(void *dst, weft_dtype dt, const float *src, int64_t n) {
  if (dt == WEFT_BF16) {
    weft_cpu_f32_to_bf16_(dst, src, n);
  } else if (dt == WEFT_F16) {
    uint16_t *d = dst;
    for (int64_t i = 0; i < n; i++) d[i] = weft_f32_to_f16_i_(src[i]);
  } else {
    memcpy(dst, src, (size_t)n * sizeof(float));
  }
}

/* ------------------------------------------------ storage-dtype tiles */

#define TILE 1024
#define TILE_MAX_IO 3

typedef struct tiled_args {
  weft_dtype dt;
  size_t es;
  int nout, nin;
  bool read_out;
  void *const *out;
  const void *const *in;
  weft_cpu_tile_fn fn;
  void *ctx;
} tiled_args;

static void tiled_span(void *vctx, int64_t lo, int64_t hi) {
  const tiled_args *a = vctx;
  float buf[2 * TILE_MAX_IO][TILE];
  float *o[TILE_MAX_IO], *x[TILE_MAX_IO];
  for (int k = 0; k < a->nout; k++) o[k] = buf[k];
  for (int k = 0; k < a->nin; k++) x[k] = buf[TILE_MAX_IO + k];
  for (int64_t t = lo; t < hi; t += TILE) {
    const int64_t m = hi - t < TILE ? hi - t : TILE;
    const size_t at = (size_t)t * a->es;
    for (int k = 0; k < a->nin; k++) weft_cpu_to_f32_(x[k], (const char *)a->in[k] + at, a->dt, m);
    if (a->read_out)
      for (int k = 0; k < a->nout; k++)
        weft_cpu_to_f32_(o[k], (const char *)a->out[k] + at, a->dt, m);
    a->fn(a->ctx, t, m, o, (const float *const *)x);
    for (int k = 0; k < a->nout; k++) weft_cpu_from_f32_((char *)a->out[k] + at, a->dt, o[k], m);
  }
}

void weft_cpu_tiled_(weft_dtype dt, int64_t n, int nout, void *const *out, bool read_out, int nin,
                     const void *const *in, weft_cpu_tile_fn fn, void *ctx) {
  tiled_args a = {dt, weft_dtype_size(dt), nout, nin, read_out, out, in, fn, ctx};
  weft_cpu_par_range_(n, WEFT_CPU_GRAIN, tiled_span, &a);
}

/* ------------------------------------------------ storage-dtype row blocks */

typedef struct rows_args {
  weft_dtype dt;
  size_t es;
  int64_t C;
  int nout, nin;
  bool read_out;
  void *const *out;
  const void *const *in;
  weft_cpu_rows_fn fn;
  void *ctx;
  int failed; /* a chunk could not get its block (set atomically) */
} rows_args;

static void rows_span(void *vctx, int64_t lo, int64_t hi) {
  rows_args *a = vctx;
  const int64_t m = (hi - lo) * a->C;
  const size_t at = (size_t)(lo * a->C) * a->es;
  float *block = malloc(sizeof(float) * (size_t)m * (size_t)(a->nin + a->nout));
  if (!block) {
    __atomic_store_n(&a->failed, 1, __ATOMIC_RELAXED);
    return;
  }
  const float *x[TILE_MAX_IO];
  float *o[TILE_MAX_IO];
  for (int k = 0; k < a->nin; k++) {
    float *b = block + (size_t)k * (size_t)m;
    weft_cpu_to_f32_(b, (const char *)a->in[k] + at, a->dt, m);
    x[k] = b;
  }
  for (int k = 0; k < a->nout; k++) {
    o[k] = a->out[k] ? block + (size_t)(a->nin + k) * (size_t)m : NULL;
    if (o[k] && a->read_out) weft_cpu_to_f32_(o[k], (const char *)a->out[k] + at, a->dt, m);
  }
  a->fn(a->ctx, lo, hi, o, x);
  for (int k = 0; k < a->nout; k++)
    if (o[k]) weft_cpu_from_f32_((char *)a->out[k] + at, a->dt, o[k], m);
  free(block);
}

weft_status weft_cpu_rows_dt_(const char *op, weft_dtype dt, int64_t N, int64_t C, int64_t grain,
                              int nout, void *const *out, bool read_out, int nin,
                              const void *const *in, weft_cpu_rows_fn fn, void *ctx) {
  rows_args a = {dt, weft_dtype_size(dt), C, nout, nin, read_out, out, in, fn, ctx, 0};
  weft_cpu_par_range_(N, grain, rows_span, &a);
  if (a.failed)
    return weft_error_at(WEFT_ERR_OOM, op, "no memory for a chunk's rows widened to f32");
  return WEFT_OK;
}

weft_status weft_cpu_widened_copy_(const char *op, weft_dtype dt, const void *src, int64_t n,
                                   float **out) {
  *out = NULL;
  if (!src) return WEFT_OK;
  *out = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
  if (!*out)
    return weft_error_at(WEFT_ERR_OOM, op, "no memory for %lld floats of a widened copy",
                         (long long)n);
  weft_cpu_to_f32_(*out, src, dt, n);
  return WEFT_OK;
}
