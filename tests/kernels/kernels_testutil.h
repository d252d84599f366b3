/* Helpers shared by the kernels test files (test_dtype.c ... test_ops.c):
 * Philox known answers, multi-index iteration, random tensor fills
 * through weft_tensor_set (independent of the code under test's copy
 * paths), randomly strided views, and an error-expectation macro. Random values come from the
 * harness's seeded stream (harness.h): uint64_t r =
 * weft_test_rng_state(weft_test_seed(fallback)), then weft_test_rng_unit,
 * _sym, _int(&r, ...). */
#ifndef WEFT_KERNELS_TESTUTIL_H
#define WEFT_KERNELS_TESTUTIL_H

#include <criterion/criterion.h>
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "harness.h"
#include "kernels.h"

/* Philox4x32-10 known answers (Random123 kat_vectors): counter words
 * (low first), key words, the four output words. */
typedef struct philox_kat {
  uint32_t ctr[4], key[2], out[4];
} philox_kat;
enum { N_PHILOX_KATS = 3 };
static inline const philox_kat *philox_kats(void) {
  static const philox_kat kat[N_PHILOX_KATS] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
       {0xffffffff, 0xffffffff},
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
       {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  return kat;
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
static inline void fill_rand(weft_tensor *t, uint64_t *r) {
  if (weft_tensor_numel(t) == 0) return;
  int64_t idx[WEFT_MAX_DIMS] = {0};
  do {
    double v;
    switch (t->dtype) {
      case WEFT_U8:
        v = (double)weft_test_rng_int(r, 0, 255);
        break;
      case WEFT_I32:
      case WEFT_I64:
        v = (double)weft_test_rng_int(r, -1000, 1000);
        break;
      default:
        v = weft_test_rng_sym(r);
        break;
    }
    weft_tensor_set(t, idx, v);
  } while (idx_next(idx, t->ndim, t->shape));
}

/* A strided view of `shape` inside a larger contiguous base: dims permuted
 * in memory, each padded by 0..2 elements and offset inside the padding. */
static inline weft_tensor *make_strided(weft_dtype dt, int ndim, const int64_t *shape, uint64_t *r,
                                        weft_tensor *view) {
  int perm[WEFT_MAX_DIMS], inv[WEFT_MAX_DIMS];
  for (int d = 0; d < ndim; d++) perm[d] = d;
  for (int d = ndim - 1; d > 0; d--) {
    int j = (int)weft_test_rng_int(r, 0, d);
    int tmp = perm[d];
    perm[d] = perm[j];
    perm[j] = tmp;
  }
  for (int j = 0; j < ndim; j++) inv[perm[j]] = j;
  int64_t bs[WEFT_MAX_DIMS], off[WEFT_MAX_DIMS], bst[WEFT_MAX_DIMS];
  for (int j = 0; j < ndim; j++) {
    int64_t extra = weft_test_rng_int(r, 0, 2);
    bs[j] = shape[perm[j]] + extra;
    off[j] = weft_test_rng_int(r, 0, extra);
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
#define EXPECT_ERR(expr, code, substr)                                                           \
  do {                                                                                           \
    weft_clear_error();                                                                          \
    weft_status st_ = (expr);                                                                    \
    cr_expect_eq(st_, (code), "%s: status %d (%s), want %d; message: %s", #expr, (int)st_,       \
                 weft_status_str(st_), (int)(code), weft_last_error());                          \
    cr_expect(strstr(weft_last_error(), (substr)) != NULL, "%s: message '%s' lacks '%s'", #expr, \
              weft_last_error(), (substr));                                                      \
  } while (0)

#endif
