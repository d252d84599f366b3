/* Helpers shared by the kernels test files (test_dtype.c ... test_ops.c):
 * a seeded splitmix64 generator for inputs, multi-index iteration, random
 * tensor fills through weft_tensor_set (independent of the code under
 * test's copy paths), randomly strided views, and an error-expectation
 * macro. */
#ifndef WEFT_KERNELS_TESTUTIL_H
#define WEFT_KERNELS_TESTUTIL_H

#include <criterion/criterion.h>
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "harness.h"
#include "kernels.h"

typedef struct trng {
  uint64_t s;
} trng;

static inline trng trng_make(unsigned long fallback) {
  trng r = {weft_test_seed(fallback) * 0x9E3779B97F4A7C15ULL + 1};
  return r;
}
static inline uint64_t trng_next(trng *r) {
  uint64_t z = (r->s += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}
/* [0, 1) */
static inline double trng_unif(trng *r) { return (double)(trng_next(r) >> 11) * 0x1.0p-53; }
/* [-1, 1) */
static inline double trng_sym(trng *r) { return 2.0 * trng_unif(r) - 1.0; }
/* integer in [lo, hi] */
static inline int64_t trng_int(trng *r, int64_t lo, int64_t hi) {
  return lo + (int64_t)(trng_next(r) % (uint64_t)(hi - lo + 1));
}

/* Row-major multi-index increment; false once past the end. */
static inline bool idx_next(int64_t *idx, int ndim, const int64_t *shape) {
  for (int d = ndim - 1; d >= 0; d--) {
    if (++idx[d] < shape[d]) return true;
    idx[d] = 0;
  }
  return false;
}

/* Random values exactly representable in t's dtype: floats in [-1, 1)
 * (rounded to the dtype by set), integers in small ranges. */
static inline void fill_rand(weft_tensor *t, trng *r) {
  if (weft_tensor_numel(t) == 0) return;
  int64_t idx[WEFT_MAX_DIMS] = {0};
  do {
    double v;
    switch (t->dtype) {
      case WEFT_U8: v = (double)trng_int(r, 0, 255); break;
      case WEFT_I32:
      case WEFT_I64: v = (double)trng_int(r, -1000, 1000); break;
      default: v = trng_sym(r); break;
    }
    weft_tensor_set(t, idx, v);
  } while (idx_next(idx, t->ndim, t->shape));
}

/* A strided view of `shape` inside a larger contiguous base: dims permuted
 * in memory, each padded by 0..2 elements and offset inside the padding. */
static inline weft_tensor *make_strided(weft_dtype dt, int ndim, const int64_t *shape, trng *r,
                                 weft_tensor *view) {
  int perm[WEFT_MAX_DIMS], inv[WEFT_MAX_DIMS];
  for (int d = 0; d < ndim; d++) perm[d] = d;
  for (int d = ndim - 1; d > 0; d--) {
    int j = (int)trng_int(r, 0, d);
    int tmp = perm[d];
    perm[d] = perm[j];
    perm[j] = tmp;
  }
  for (int j = 0; j < ndim; j++) inv[perm[j]] = j;
  int64_t bs[WEFT_MAX_DIMS], off[WEFT_MAX_DIMS], bst[WEFT_MAX_DIMS];
  for (int j = 0; j < ndim; j++) {
    int64_t extra = trng_int(r, 0, 2);
    bs[j] = shape[perm[j]] + extra;
    off[j] = trng_int(r, 0, extra);
  }
  weft_tensor *base;
  cr_assert_eq(weft_tensor_create(dt, WEFT_CPU, ndim, bs, &base), WEFT_OK, "%s", weft_last_error());
  fill_rand(base, r); /* garbage around the view */
  int64_t s = 1;
  for (int j = ndim - 1; j >= 0; j--) {
    bst[j] = s;
    s *= bs[j];
  }
  int64_t st[WEFT_MAX_DIMS], o = 0;
  for (int d = 0; d < ndim; d++) {
    st[d] = bst[inv[d]];
    o += off[inv[d]] * bst[inv[d]];
  }
  char *p = (char *)base->data + o * (int64_t)weft_dtype_size(dt);
  cr_assert_eq(weft_tensor_view_init(view, p, dt, WEFT_CPU, ndim, shape, st), WEFT_OK, "%s",
               weft_last_error());
  return base;
}

/* Expects `expr` to fail with `code` and a message containing `substr`. */
#define EXPECT_ERR(expr, code, substr)                                                       \
  do {                                                                                       \
    weft_clear_error();                                                                      \
    weft_status st_ = (expr);                                                                \
    cr_expect_eq(st_, (code), "%s: status %d (%s), want %d; message: %s", #expr, (int)st_,   \
                 weft_status_str(st_), (int)(code), weft_last_error());                      \
    cr_expect(strstr(weft_last_error(), (substr)) != NULL, "%s: message '%s' lacks '%s'",    \
              #expr, weft_last_error(), (substr));                                           \
  } while (0)

#define EXPECT_OK(expr)                                                                      \
  do {                                                                                       \
    weft_status st_ = (expr);                                                                \
    cr_assert_eq(st_, WEFT_OK, "%s failed: %s", #expr, weft_last_error());                   \
  } while (0)

#endif
