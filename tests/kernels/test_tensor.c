/* weft_tensor: constructors, properties, views (narrow/view/transpose/chunk),
 * cat, copy between every dtype pair for any strides, fill, get/set, equal,
 * and the error message of every bad argument. References are computed
 * element by element through weft_tensor_get/set (plain index arithmetic),
 * independent of the strided iterator the kernels use. */
#include <stdio.h>
#include <stdlib.h>

#include "backend.h"
#include "kernels_testutil.h"
#include "weft_config.h"

static const weft_dtype all_dtypes[] = {WEFT_F32, WEFT_F64, WEFT_BF16, WEFT_F16,
                                        WEFT_I32, WEFT_I64, WEFT_U8};
#define N_DTYPES 7

/* f64 tensor with element (i, j, ...) = its row-major linear index. */
static weft_tensor *iota(int ndim, const int64_t *shape) {
  weft_tensor *t;
  cr_assert_eq(weft_tensor_create(WEFT_F64, WEFT_CPU, ndim, shape, &t), WEFT_OK);
  double *p = t->data;
  for (int64_t i = 0; i < weft_tensor_numel(t); i++) p[i] = (double)i;
  return t;
}

Test(tensor, create_properties_and_describe) {
  int64_t shape[2] = {4, 6};
  for (int i = 0; i < N_DTYPES; i++) {
    weft_tensor *t;
    OK(weft_tensor_create(all_dtypes[i], WEFT_CPU, 2, shape, &t));
    cr_expect_eq(t->dtype, all_dtypes[i]);
    cr_expect_eq(t->ndim, 2);
    cr_expect_eq(t->strides[0], 6);
    cr_expect_eq(t->strides[1], 1);
    cr_expect_eq(weft_tensor_numel(t), 24);
    cr_expect_eq(weft_tensor_nbytes(t), 24 * weft_dtype_size(all_dtypes[i]));
    cr_expect(weft_tensor_is_contiguous(t));
    cr_expect_eq((uintptr_t)t->data % 64, 0);
    char buf[64], want[64];
    weft_tensor_describe(t, buf, sizeof buf);
    snprintf(want, sizeof want, "%s[4, 6]", weft_dtype_name(all_dtypes[i]));
    cr_expect_str_eq(buf, want);
    weft_tensor_destroy(t);
  }
  weft_tensor *s;
  OK(weft_tensor_create(WEFT_F64, WEFT_CPU, 0, NULL, &s));
  cr_expect_eq(weft_tensor_numel(s), 1);
  cr_expect_eq(weft_tensor_nbytes(s), 8);
  char buf[64];
  weft_tensor_describe(s, buf, sizeof buf);
  cr_expect_str_eq(buf, "f64[]");
  weft_tensor_describe(NULL, buf, sizeof buf);
  cr_expect_str_eq(buf, "(null tensor)");
  weft_tensor_describe(s, buf, 4); /* truncates, stays terminated */
  cr_expect_str_eq(buf, "f64");
  weft_tensor_destroy(s);
  int64_t eight[8] = {1, 2, 1, 3, 1, 2, 1, 2};
  OK(weft_tensor_create(WEFT_U8, WEFT_CPU, 8, eight, &s));
  cr_expect_eq(weft_tensor_numel(s), 24);
  cr_expect_eq(s->strides[0], 24);
  cr_expect_eq(s->strides[3], 4);
  weft_tensor_destroy(s);
  weft_tensor_destroy(NULL);
}

Test(tensor, zeros_are_zero_even_on_reused_memory) {
  int64_t shape[2] = {33, 17};
  for (int rep = 0; rep < 3; rep++) {
    weft_tensor *d;
    OK(weft_tensor_create(WEFT_F32, WEFT_CPU, 2, shape, &d));
    memset(d->data, 0x5a, weft_tensor_nbytes(d));
    weft_tensor_destroy(d);
    weft_tensor *z;
    OK(weft_tensor_zeros(WEFT_F32, WEFT_CPU, 2, shape, &z));
    const unsigned char *p = z->data;
    for (size_t i = 0; i < weft_tensor_nbytes(z); i++) cr_assert_eq(p[i], 0, "byte %zu", i);
    weft_tensor_destroy(z);
  }
}

Test(tensor, bad_geometry_is_rejected_with_the_values) {
  weft_tensor *t = (weft_tensor *)1;
  int64_t s9[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
  EXPECT_ERR(weft_tensor_create(WEFT_F32, WEFT_CPU, 9, s9, &t), WEFT_ERR_INVALID, "ndim 9");
  cr_expect_null(t);
  EXPECT_ERR(weft_tensor_create(WEFT_F32, WEFT_CPU, -1, s9, &t), WEFT_ERR_INVALID, "ndim -1");
  int64_t neg[3] = {4, -3, 2};
  EXPECT_ERR(weft_tensor_create(WEFT_F32, WEFT_CPU, 3, neg, &t), WEFT_ERR_INVALID,
             "negative size -3 in dim 1 of shape [4, -3, 2]");
  EXPECT_ERR(weft_tensor_zeros(WEFT_F32, WEFT_CPU, 3, neg, &t), WEFT_ERR_INVALID, "-3");
  int64_t ok[2] = {2, 2};
  EXPECT_ERR(weft_tensor_create((weft_dtype)42, WEFT_CPU, 2, ok, &t), WEFT_ERR_INVALID, "dtype 42");
  EXPECT_ERR(weft_tensor_create(WEFT_F32, (weft_device)5, 2, ok, &t), WEFT_ERR_INVALID, "device 5");
  EXPECT_ERR(weft_tensor_create(WEFT_F32, WEFT_CPU, 2, NULL, &t), WEFT_ERR_INVALID, "NULL");
  EXPECT_ERR(weft_tensor_create(WEFT_F32, WEFT_CPU, 2, ok, NULL), WEFT_ERR_INVALID, "out is NULL");
  int64_t huge[2] = {(int64_t)1 << 40, (int64_t)1 << 40};
  EXPECT_ERR(weft_tensor_create(WEFT_F32, WEFT_CPU, 2, huge, &t), WEFT_ERR_INVALID, "too many");
  int64_t big[1] = {(int64_t)1 << 62};
  EXPECT_ERR(weft_tensor_create(WEFT_F64, WEFT_CPU, 1, big, &t), WEFT_ERR_INVALID, "too many");
}

Test(tensor, wrap_and_view_init_alias_caller_memory) {
  float buf[12];
  for (int i = 0; i < 12; i++) buf[i] = (float)i * 0.5f;
  int64_t shape[2] = {3, 4};
  weft_tensor *w;
  OK(weft_tensor_wrap(buf, WEFT_F32, WEFT_CPU, 2, shape, &w));
  cr_expect_eq(w->data, buf);
  int64_t idx[2] = {2, 1};
  cr_expect_eq(weft_tensor_get(w, idx), 4.5);
  weft_tensor_set(w, idx, -7.0);
  cr_expect_eq(buf[9], -7.0f);
  weft_tensor_destroy(w); /* must not free buf */
  cr_expect_eq(buf[9], -7.0f);

  /* a column view with explicit strides */
  weft_tensor col;
  int64_t cs[1] = {3}, cst[1] = {4};
  OK(weft_tensor_view_init(&col, buf + 2, WEFT_F32, WEFT_CPU, 1, cs, cst));
  cr_expect(!weft_tensor_is_contiguous(&col));
  for (int64_t i = 0; i < 3; i++) cr_expect_eq(weft_tensor_get(&col, &i), buf[2 + 4 * i]);

  EXPECT_ERR(weft_tensor_view_init(&col, NULL, WEFT_F32, WEFT_CPU, 1, cs, NULL), WEFT_ERR_INVALID,
             "data is NULL for 3 elements");
  int64_t zero[1] = {0};
  OK(weft_tensor_view_init(&col, NULL, WEFT_F32, WEFT_CPU, 1, zero, NULL));
  EXPECT_ERR(weft_tensor_view_init(&col, (char *)buf + 2, WEFT_F32, WEFT_CPU, 1, cs, NULL),
             WEFT_ERR_INVALID, "not aligned to the 4-byte f32");
  EXPECT_ERR(weft_tensor_wrap(buf, WEFT_F32, WEFT_CPU, 2, shape, NULL), WEFT_ERR_INVALID, "out");
  EXPECT_ERR(weft_tensor_view_init(NULL, buf, WEFT_F32, WEFT_CPU, 2, shape, NULL), WEFT_ERR_INVALID,
             "view is NULL");
}

Test(tensor, contiguity_follows_torch) {
  int64_t shape[3] = {2, 3, 4};
  weft_tensor *t = iota(3, shape), *v;
  OK(weft_tensor_transpose(t, 1, 2, &v));
  cr_expect(!weft_tensor_is_contiguous(v));
  weft_tensor_destroy(v);
  OK(weft_tensor_narrow(t, 0, 1, 1, &v));
  cr_expect(weft_tensor_is_contiguous(v), "narrow of dim 0 stays contiguous");
  weft_tensor_destroy(v);
  OK(weft_tensor_narrow(t, 2, 1, 2, &v));
  cr_expect(!weft_tensor_is_contiguous(v));
  weft_tensor_destroy(v);
  OK(weft_tensor_narrow(t, 2, 1, 0, &v));
  cr_expect(weft_tensor_is_contiguous(v), "an empty view is contiguous");
  weft_tensor_destroy(v);
  /* size-1 dims may carry any stride */
  weft_tensor one;
  int64_t s1[3] = {1, 3, 1}, st1[3] = {999, 1, -5};
  OK(weft_tensor_view_init(&one, t->data, WEFT_F64, WEFT_CPU, 3, s1, st1));
  cr_expect(weft_tensor_is_contiguous(&one));
  weft_tensor_destroy(t);
}

Test(tensor, narrow_selects_the_right_elements) {
  int64_t shape[3] = {3, 5, 4};
  weft_tensor *t = iota(3, shape);
  struct {
    int dim;
    int64_t start, len;
  } cases[] = {{0, 1, 2}, {1, 0, 5}, {1, 2, 3}, {2, 3, 1}, {-1, 1, 2}, {-3, 2, 1}, {1, 5, 0}};
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    weft_tensor *v;
    OK(weft_tensor_narrow(t, cases[c].dim, cases[c].start, cases[c].len, &v));
    int d = cases[c].dim < 0 ? cases[c].dim + 3 : cases[c].dim;
    cr_expect_eq(v->shape[d], cases[c].len);
    cr_expect_null(v->base_);
    int64_t idx[3] = {0, 0, 0};
    if (weft_tensor_numel(v) > 0) do {
        int64_t src[3] = {idx[0], idx[1], idx[2]};
        src[d] += cases[c].start;
        double want = (double)((src[0] * 5 + src[1]) * 4 + src[2]);
        cr_assert_eq(weft_tensor_get(v, idx), want,
                     "case %zu at (%" PRId64 ",%" PRId64 ",%" PRId64 ")", c, idx[0], idx[1],
                     idx[2]);
      } while (idx_next(idx, 3, v->shape));
    weft_tensor_destroy(v);
  }
  weft_tensor *v = (weft_tensor *)1;
  EXPECT_ERR(weft_tensor_narrow(t, 1, 3, 4, &v), WEFT_ERR_INVALID,
             "narrow(dim 1, start 3, len 4) is outside [0, 5) of f64[3, 5, 4]");
  cr_expect_null(v);
  EXPECT_ERR(weft_tensor_narrow(t, 0, -1, 1, &v), WEFT_ERR_INVALID, "start -1");
  EXPECT_ERR(weft_tensor_narrow(t, 0, 0, -2, &v), WEFT_ERR_INVALID, "len -2");
  EXPECT_ERR(weft_tensor_narrow(t, 3, 0, 1, &v), WEFT_ERR_INVALID,
             "dim 3 out of range for f64[3, 5, 4] (expected -3..2)");
  EXPECT_ERR(weft_tensor_narrow(t, -4, 0, 1, &v), WEFT_ERR_INVALID, "dim -4");
  EXPECT_ERR(weft_tensor_narrow(t, 0, INT64_MAX, INT64_MAX, &v), WEFT_ERR_INVALID, "start");
  EXPECT_ERR(weft_tensor_narrow(NULL, 0, 0, 1, &v), WEFT_ERR_INVALID, "NULL");
  weft_tensor_destroy(t);
}

Test(tensor, view_reshapes_contiguous_tensors_and_strided_ones_where_torch_can) {
  int64_t shape[2] = {4, 6};
  weft_tensor *t = iota(2, shape), *v;
  int64_t s[3] = {2, -1, 3};
  OK(weft_tensor_view(t, 3, s, &v));
  cr_expect_eq(v->shape[1], 4);
  cr_expect_eq(v->data, t->data);
  int64_t idx[3] = {1, 2, 1};
  cr_expect_eq(weft_tensor_get(v, idx), (double)(12 + 6 + 1));
  weft_tensor_destroy(v);
  int64_t flat[1] = {-1};
  OK(weft_tensor_view(t, 1, flat, &v));
  cr_expect_eq(v->shape[0], 24);
  weft_tensor_destroy(v);

  weft_tensor *tr;
  OK(weft_tensor_transpose(t, 0, 1, &tr));
  EXPECT_ERR(weft_tensor_view(tr, 1, flat, &v), WEFT_ERR_INVALID, "f64[6, 4] is strided");
  /* the transpose's last dim (stride 6) splits: [6, 2, 2] with strides
   * [1, 12, 6], element (i, j, k) = t[2j + k][i] */
  int64_t split_last[3] = {6, 2, 2};
  OK(weft_tensor_view(tr, 3, split_last, &v));
  cr_expect(v->strides[0] == 1 && v->strides[1] == 12 && v->strides[2] == 6);
  for (int64_t i = 0; i < 6; i++)
    for (int64_t j = 0; j < 2; j++)
      for (int64_t k = 0; k < 2; k++) {
        int64_t a[3] = {i, j, k}, b[2] = {2 * j + k, i};
        cr_expect_eq(weft_tensor_get(v, a), weft_tensor_get(t, b));
      }
  weft_tensor_destroy(v);
  weft_tensor_destroy(tr);
  /* a column slice (rows of stride 6): its rows split and its columns
   * split, but rows and columns do not merge */
  weft_tensor *cols;
  OK(weft_tensor_narrow(t, 1, 1, 4, &cols)); /* [4, 4], strides [6, 1] */
  int64_t heads[3] = {4, 2, 2}, rows2[3] = {2, 2, 4}, ones[4] = {4, 1, 4, 1};
  OK(weft_tensor_view(cols, 3, heads, &v));
  cr_expect(v->strides[0] == 6 && v->strides[1] == 2 && v->strides[2] == 1);
  int64_t a[3] = {3, 1, 0}, b[2] = {3, 1 + 2};
  cr_expect_eq(weft_tensor_get(v, a), weft_tensor_get(t, b));
  weft_tensor_destroy(v);
  OK(weft_tensor_view(cols, 3, rows2, &v));
  cr_expect(v->strides[0] == 12 && v->strides[1] == 6 && v->strides[2] == 1);
  weft_tensor_destroy(v);
  OK(weft_tensor_view(cols, 4, ones, &v));
  cr_expect(v->strides[0] == 6 && v->strides[2] == 1);
  weft_tensor_destroy(v);
  EXPECT_ERR(weft_tensor_view(cols, 1, flat, &v), WEFT_ERR_INVALID,
             "view shape [16]: f64[4, 4] is strided");
  int64_t straddle[2] = {2, 8};
  EXPECT_ERR(weft_tensor_view(cols, 2, straddle, &v), WEFT_ERR_INVALID, "is strided");
  int64_t st[3];
  cr_expect_not(weft_tensor_view_strides(cols, 2, straddle, st));
  cr_expect(weft_tensor_view_strides(cols, 3, heads, st));
  weft_tensor_destroy(cols);
  int64_t bad[2] = {5, 5};
  EXPECT_ERR(weft_tensor_view(t, 2, bad, &v), WEFT_ERR_INVALID,
             "view shape [5, 5] has 25 elements, f64[4, 6] has 24");
  int64_t two[2] = {-1, -1};
  EXPECT_ERR(weft_tensor_view(t, 2, two, &v), WEFT_ERR_INVALID, "more than one -1");
  int64_t nodiv[2] = {-1, 5};
  EXPECT_ERR(weft_tensor_view(t, 2, nodiv, &v), WEFT_ERR_INVALID, "cannot hold the 24 elements");
  int64_t negs[2] = {-3, 8};
  EXPECT_ERR(weft_tensor_view(t, 2, negs, &v), WEFT_ERR_INVALID, "negative size -3");
  EXPECT_ERR(weft_tensor_view(t, 9, negs, &v), WEFT_ERR_INVALID, "ndim 9");
  weft_tensor_destroy(t);

  int64_t one[1] = {1};
  t = iota(1, one);
  OK(weft_tensor_view(t, 0, NULL, &v));
  cr_expect_eq(v->ndim, 0);
  cr_expect_eq(weft_tensor_get(v, NULL), 0.0);
  weft_tensor_destroy(v);
  weft_tensor_destroy(t);
}

Test(tensor, transpose_swaps_dims) {
  int64_t shape[3] = {2, 3, 5};
  weft_tensor *t = iota(3, shape), *v;
  OK(weft_tensor_transpose(t, 0, -1, &v));
  cr_expect_eq(v->shape[0], 5);
  cr_expect_eq(v->shape[2], 2);
  int64_t idx[3] = {0, 0, 0};
  do {
    int64_t src[3] = {idx[2], idx[1], idx[0]};
    cr_assert_eq(weft_tensor_get(v, idx), weft_tensor_get(t, src));
  } while (idx_next(idx, 3, v->shape));
  weft_tensor_destroy(v);
  OK(weft_tensor_transpose(t, 1, 1, &v));
  cr_expect(weft_tensor_equal(v, t));
  weft_tensor_destroy(v);
  EXPECT_ERR(weft_tensor_transpose(t, 0, 3, &v), WEFT_ERR_INVALID, "dim 3 out of range");
  weft_tensor_destroy(t);
}

Test(tensor, chunk_range_matches_torch_chunk) {
  /* torch.chunk(arange(n), k) sizes, with empty trailing chunks kept */
  const struct {
    int64_t n, k, lens[6];
  } cases[] = {
      {10, 3, {4, 4, 2}}, {5, 4, {2, 2, 1, 0}},  {2, 5, {1, 1, 0, 0, 0}},     {0, 3, {0, 0, 0}},
      {7, 1, {7}},        {12, 4, {3, 3, 3, 3}}, {13, 6, {3, 3, 3, 3, 1, 0}},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    int64_t expect_start = 0;
    for (int64_t i = 0; i < cases[c].k; i++) {
      int64_t s, l;
      weft_chunk_range(cases[c].n, cases[c].k, i, &s, &l);
      cr_expect_eq(l, cases[c].lens[i],
                   "n %" PRId64 " k %" PRId64 " chunk %" PRId64 ": len %" PRId64, cases[c].n,
                   cases[c].k, i, l);
      cr_expect_eq(s, expect_start, "n %" PRId64 " k %" PRId64 " chunk %" PRId64 ": start %" PRId64,
                   cases[c].n, cases[c].k, i, s);
      expect_start += l;
    }
  }
  /* random n, k: chunks tile [0, n) in order with size ceil(n/k) or less */
  uint64_t r = weft_test_rng_state(weft_test_seed(21));
  for (int it = 0; it < 2000; it++) {
    int64_t n = weft_test_rng_int(&r, 0, 300), k = weft_test_rng_int(&r, 1, 40),
            c = (n + k - 1) / k, pos = 0;
    for (int64_t i = 0; i < k; i++) {
      int64_t s, l;
      weft_chunk_range(n, k, i, &s, &l);
      cr_assert_eq(s, pos < n ? pos : n);
      cr_assert(l == (c < n - s ? c : n - s), "n %" PRId64 " k %" PRId64 " i %" PRId64, n, k, i);
      pos = s + l;
    }
    cr_assert_eq(pos, n);
  }
  int64_t s = 7, l = 7;
  weft_chunk_range(5, 0, 0, &s, &l);
  cr_expect(s == 0 && l == 0, "k = 0 gives empty");
  weft_chunk_range(5, 2, 2, &s, &l);
  cr_expect(s == 0 && l == 0, "i >= k gives empty");
}

Test(tensor, chunk_yields_k_views) {
  int64_t shape[2] = {5, 3};
  weft_tensor *t = iota(2, shape), *ch[4];
  OK(weft_tensor_chunk(t, 4, 0, ch));
  int64_t want[4] = {2, 2, 1, 0}, row = 0;
  for (int i = 0; i < 4; i++) {
    cr_expect_eq(ch[i]->shape[0], want[i]);
    cr_expect_eq(ch[i]->shape[1], 3);
    for (int64_t a = 0; a < ch[i]->shape[0]; a++)
      for (int64_t b = 0; b < 3; b++) {
        int64_t idx[2] = {a, b};
        cr_assert_eq(weft_tensor_get(ch[i], idx), (double)((row + a) * 3 + b));
      }
    row += want[i];
    weft_tensor_destroy(ch[i]);
  }
  weft_tensor *c2[2];
  OK(weft_tensor_chunk(t, 2, -1, c2));
  cr_expect_eq(c2[0]->shape[1], 2);
  cr_expect_eq(c2[1]->shape[1], 1);
  int64_t idx[2] = {4, 0};
  cr_expect_eq(weft_tensor_get(c2[1], idx), 14.0);
  weft_tensor_destroy(c2[0]);
  weft_tensor_destroy(c2[1]);
  EXPECT_ERR(weft_tensor_chunk(t, 0, 0, ch), WEFT_ERR_INVALID, "k must be >= 1, got 0");
  EXPECT_ERR(weft_tensor_chunk(t, 2, 2, ch), WEFT_ERR_INVALID, "dim 2");
  EXPECT_ERR(weft_tensor_chunk(t, 2, 0, NULL), WEFT_ERR_INVALID, "out is NULL");
  weft_tensor_destroy(t);
}

Test(tensor, cat_concatenates_uneven_strided_and_empty_parts) {
  uint64_t r = weft_test_rng_state(weft_test_seed(31));
  for (int dt_i = 0; dt_i < N_DTYPES; dt_i++) {
    weft_dtype dt = all_dtypes[dt_i];
    for (int dim = 0; dim < 3; dim++) {
      int64_t sizes[4] = {3, 0, 1, 5};
      weft_tensor views[4], *bases[4], *ptrs[4];
      for (int i = 0; i < 4; i++) {
        int64_t shape[3] = {2, 3, 4};
        shape[dim] = sizes[i];
        bases[i] = make_strided(dt, 3, shape, &r, &views[i]);
        ptrs[i] = &views[i];
      }
      weft_tensor *out;
      OK(weft_tensor_cat(ptrs, 4, dim - 3 * (dim == 2), &out)); /* dim 2 passed as -1 */
      cr_expect(weft_tensor_is_contiguous(out));
      cr_expect_eq(out->shape[dim], 9);
      int64_t idx[3] = {0, 0, 0};
      do {
        int64_t pos = idx[dim], part = 0;
        while (pos >= sizes[part]) pos -= sizes[part++];
        int64_t src[3] = {idx[0], idx[1], idx[2]};
        src[dim] = pos;
        double got = weft_tensor_get(out, idx), want = weft_tensor_get(&views[part], src);
        cr_assert_eq(got, want, "%s dim %d: %g vs %g", weft_dtype_name(dt), dim, got, want);
      } while (idx_next(idx, 3, out->shape));
      weft_tensor_destroy(out);
      for (int i = 0; i < 4; i++) weft_tensor_destroy(bases[i]);
    }
  }
}

Test(tensor, cat_rejects_mismatches) {
  int64_t s23[2] = {2, 3}, s24[2] = {2, 4}, s3[1] = {3};
  weft_tensor *a, *b, *c, *d, *e, *out = (weft_tensor *)1;
  OK(weft_tensor_create(WEFT_F32, WEFT_CPU, 2, s23, &a));
  OK(weft_tensor_create(WEFT_BF16, WEFT_CPU, 2, s23, &b));
  OK(weft_tensor_create(WEFT_F32, WEFT_CPU, 2, s24, &c));
  OK(weft_tensor_create(WEFT_F32, WEFT_CPU, 1, s3, &d));
  OK(weft_tensor_create(WEFT_F32, WEFT_CPU, 0, NULL, &e));
  weft_tensor *ab[2] = {a, b}, *ac[2] = {a, c}, *ad[2] = {a, d}, *ee[2] = {e, e},
              *an[2] = {a, NULL};
  EXPECT_ERR(weft_tensor_cat(ab, 2, 0, &out), WEFT_ERR_INVALID, "tensor 1 is bf16[2, 3]");
  cr_expect_null(out);
  EXPECT_ERR(weft_tensor_cat(ac, 2, 0, &out), WEFT_ERR_INVALID,
             "shape mismatch outside dim 0: tensor 0 is f32[2, 3], tensor 1 is f32[2, 4]");
  OK(weft_tensor_cat(ac, 2, 1, &out));
  cr_expect_eq(out->shape[1], 7);
  weft_tensor_destroy(out);
  EXPECT_ERR(weft_tensor_cat(ad, 2, 0, &out), WEFT_ERR_INVALID, "f32[3]");
  EXPECT_ERR(weft_tensor_cat(ee, 2, 0, &out), WEFT_ERR_INVALID, "0-d");
  EXPECT_ERR(weft_tensor_cat(ac, 0, 0, &out), WEFT_ERR_INVALID, "n = 0");
  EXPECT_ERR(weft_tensor_cat(ac, 2, 2, &out), WEFT_ERR_INVALID, "dim 2 out of range");
  EXPECT_ERR(weft_tensor_cat(an, 2, 0, &out), WEFT_ERR_INVALID, "tensor 1 is NULL");
  EXPECT_ERR(weft_tensor_cat(NULL, 2, 0, &out), WEFT_ERR_INVALID, "NULL");
  weft_tensor *l1[1] = {a};
  OK(weft_tensor_cat(l1, 1, 0, &out));
  weft_tensor_destroy(out);
  weft_tensor_destroy(a);
  weft_tensor_destroy(b);
  weft_tensor_destroy(c);
  weft_tensor_destroy(d);
  weft_tensor_destroy(e);
}

/* Independent expectation of converting value v (exactly a src value) to dd. */
static double expect_convert(double v, weft_dtype sd, weft_dtype dd) {
  switch (dd) {
    case WEFT_F32:
      return (double)(float)v;
    case WEFT_F64:
      return v;
    case WEFT_BF16:
      return weft_bf16_to_f32(weft_f32_to_bf16((float)v));
    case WEFT_F16:
      return weft_f16_to_f32(weft_f32_to_f16((float)v));
    default:
      break;
  }
  int64_t iv;
  if (weft_dtype_is_float(sd)) { /* truncate, saturate */
    double t = trunc(v),
           lo = dd == WEFT_U8    ? 0
                : dd == WEFT_I32 ? -2147483648.0
                                 : -9223372036854775808.0,
           hi = dd == WEFT_U8    ? 255
                : dd == WEFT_I32 ? 2147483647.0
                                 : 9223372036854775807.0;
    return t < lo ? lo : t > hi ? hi : t;
  }
  iv = (int64_t)v; /* integers wrap */
  if (dd == WEFT_U8) return (double)(((iv % 256) + 256) % 256);
  return (double)iv; /* small values: i32/i64 exact */
}

/* Source values for the copy test: floats in [-300, 300) so that float -> int
 * truncates and u8 saturates; integers in their fill ranges. */
static void fill_copy_src(weft_tensor *t, uint64_t *r) {
  if (!weft_dtype_is_float(t->dtype)) {
    fill_rand(t, r);
    return;
  }
  if (weft_tensor_numel(t) == 0) return;
  int64_t idx[WEFT_MAX_DIMS] = {0};
  do weft_tensor_set(t, idx, 300.0 * weft_test_rng_sym(r));
  while (idx_next(idx, t->ndim, t->shape));
}

Test(tensor, copy_converts_every_dtype_pair_for_any_strides) {
  uint64_t r = weft_test_rng_state(weft_test_seed(41));
  for (int si = 0; si < N_DTYPES; si++)
    for (int di = 0; di < N_DTYPES; di++)
      for (int rep = 0; rep < 6; rep++) {
        int ndim = (int)weft_test_rng_int(&r, 0, rep < 3 ? 3 : 8);
        int64_t shape[WEFT_MAX_DIMS];
        for (int d = 0; d < ndim; d++)
          shape[d] = weft_test_rng_int(&r, ndim > 4 ? 1 : 0, ndim > 4 ? 3 : 6);
        if (rep == 0 && ndim > 0) shape[0] = 17 + si; /* longer rows */
        weft_tensor src, dst;
        weft_tensor *bs = make_strided(all_dtypes[si], ndim, shape, &r, &src);
        weft_tensor *bd = make_strided(all_dtypes[di], ndim, shape, &r, &dst);
        fill_copy_src(&src, &r);
        weft_tensor *before;
        OK(weft_tensor_clone(bd, &before));
        OK(weft_tensor_copy(&dst, &src));
        if (weft_tensor_numel(&src) > 0) {
          int64_t idx[WEFT_MAX_DIMS] = {0};
          do {
            double v = weft_tensor_get(&src, idx);
            double want = expect_convert(v, all_dtypes[si], all_dtypes[di]);
            double got = weft_tensor_get(&dst, idx);
            cr_assert(got == want || (isnan(got) && isnan(want)),
                      "%s -> %s ndim %d: %.17g -> %.17g, want %.17g (seed %lu)",
                      weft_dtype_name(all_dtypes[si]), weft_dtype_name(all_dtypes[di]), ndim, v,
                      got, want, weft_test_seed(41));
          } while (idx_next(idx, ndim, shape));
        }
        /* elements of the base outside the view are untouched */
        int64_t nb = weft_tensor_numel(bd), touched = 0;
        size_t es = weft_dtype_size(bd->dtype);
        for (int64_t i = 0; i < nb; i++)
          if (memcmp((char *)bd->data + i * (int64_t)es, (char *)before->data + i * (int64_t)es,
                     es))
            touched++;
        cr_assert_leq(touched, weft_tensor_numel(&dst), "copy wrote outside its view");
        weft_tensor_destroy(before);
        weft_tensor_destroy(bs);
        weft_tensor_destroy(bd);
      }
}

Test(tensor, copy_same_dtype_is_bit_exact_and_checks_shapes) {
  int64_t shape[2] = {3, 4};
  weft_tensor *a, *b, *c;
  OK(weft_tensor_create(WEFT_I64, WEFT_CPU, 2, shape, &a));
  OK(weft_tensor_create(WEFT_I64, WEFT_CPU, 2, shape, &b));
  int64_t *pa = a->data;
  for (int i = 0; i < 12; i++) pa[i] = INT64_MAX - i * 3; /* not representable as double */
  weft_tensor *ta, *tb;
  OK(weft_tensor_transpose(a, 0, 1, &ta));
  OK(weft_tensor_transpose(b, 0, 1, &tb));
  OK(weft_tensor_copy(tb, ta));
  cr_expect_eq(memcmp(a->data, b->data, 96), 0, "strided i64 copy is exact");
  float nanbits[12];
  uint32_t q = 0x7fc01234u;
  for (int i = 0; i < 12; i++) memcpy(&nanbits[i], &q, 4);
  weft_tensor *fa;
  OK(weft_tensor_wrap(nanbits, WEFT_F32, WEFT_CPU, 2, shape, &fa));
  OK(weft_tensor_clone(fa, &c));
  cr_expect_eq(memcmp(c->data, nanbits, 48), 0, "NaN payloads survive a copy");
  int64_t s43[2] = {4, 3};
  weft_tensor *w;
  OK(weft_tensor_create(WEFT_F32, WEFT_CPU, 2, s43, &w));
  EXPECT_ERR(weft_tensor_copy(w, c), WEFT_ERR_INVALID,
             "shape mismatch: dst f32[4, 3], src f32[3, 4]");
  EXPECT_ERR(weft_tensor_copy(NULL, c), WEFT_ERR_INVALID, "dst is NULL");
  weft_tensor *list[] = {a, b, c, ta, tb, fa, w};
  for (size_t i = 0; i < sizeof list / sizeof list[0]; i++) weft_tensor_destroy(list[i]);
}

Test(tensor, clone_and_cast_make_independent_copies) {
  uint64_t r = weft_test_rng_state(weft_test_seed(51));
  int64_t shape[3] = {3, 1, 7};
  weft_tensor v, *b = make_strided(WEFT_F32, 3, shape, &r, &v), *c, *h;
  fill_rand(&v, &r);
  OK(weft_tensor_clone(&v, &c));
  cr_expect(weft_tensor_is_contiguous(c));
  cr_expect_not_null(c->base_);
  cr_expect(weft_tensor_equal(c, &v));
  int64_t i0[3] = {0, 0, 0};
  weft_tensor_set(c, i0, 123.0);
  cr_expect_neq(weft_tensor_get(&v, i0), 123.0, "clone shares no storage");
  OK(weft_cast(&v, WEFT_BF16, &h));
  cr_expect_eq(h->dtype, WEFT_BF16);
  int64_t idx[3] = {0, 0, 0};
  do {
    double want = weft_bf16_to_f32(weft_f32_to_bf16((float)weft_tensor_get(&v, idx)));
    cr_assert_eq(weft_tensor_get(h, idx), want);
  } while (idx_next(idx, 3, shape));
  weft_tensor *x = (weft_tensor *)1;
  EXPECT_ERR(weft_cast(&v, (weft_dtype)77, &x), WEFT_ERR_INVALID, "dtype 77");
  cr_expect_null(x);
  weft_tensor_destroy(h);
  weft_tensor_destroy(c);
  weft_tensor_destroy(b);
}

Test(tensor, fill_converts_and_touches_only_the_view) {
  uint64_t r = weft_test_rng_state(weft_test_seed(61));
  const double vals[] = {1.0 / 3.0, -2.75, 1e30, -300.5};
  for (int di = 0; di < N_DTYPES; di++)
    for (size_t vi = 0; vi < sizeof vals / sizeof vals[0]; vi++) {
      int64_t shape[3] = {4, 3, 5};
      weft_tensor v, *b = make_strided(all_dtypes[di], 3, shape, &r, &v), *before;
      OK(weft_tensor_clone(b, &before));
      OK(weft_tensor_fill(&v, vals[vi]));
      double want = expect_convert(vals[vi], WEFT_F64, all_dtypes[di]);
      int64_t idx[3] = {0, 0, 0};
      do
        cr_assert_eq(weft_tensor_get(&v, idx), want, "%s fill %g", weft_dtype_name(all_dtypes[di]),
                     vals[vi]);
      while (idx_next(idx, 3, shape));
      /* count changed base elements: at most the view's 60 */
      int64_t changed = 0;
      size_t es = weft_dtype_size(all_dtypes[di]);
      for (int64_t i = 0; i < weft_tensor_numel(b); i++)
        changed += memcmp((char *)b->data + i * (int64_t)es, (char *)before->data + i * (int64_t)es,
                          es) != 0;
      cr_assert_leq(changed, 60);
      weft_tensor_destroy(before);
      weft_tensor_destroy(b);
    }
  weft_tensor *i32;
  int64_t s1[1] = {2};
  OK(weft_tensor_create(WEFT_I32, WEFT_CPU, 1, s1, &i32));
  OK(weft_tensor_fill(i32, NAN));
  int64_t i0 = 0;
  cr_expect_eq(weft_tensor_get(i32, &i0), 0.0, "NaN -> 0 for integers");
  OK(weft_tensor_fill(i32, 1e12));
  cr_expect_eq(weft_tensor_get(i32, &i0), 2147483647.0, "saturates");
  weft_tensor_destroy(i32);
  EXPECT_ERR(weft_tensor_fill(NULL, 1.0), WEFT_ERR_INVALID, "NULL");
}

Test(tensor, get_set_check_indices) {
  int64_t shape[2] = {2, 3};
  weft_tensor *t;
  OK(weft_tensor_zeros(WEFT_F16, WEFT_CPU, 2, shape, &t));
  int64_t idx[2] = {1, 2};
  weft_tensor_set(t, idx, 0.1);
  cr_expect_eq(weft_tensor_get(t, idx), (double)weft_f16_to_f32(weft_f32_to_f16(0.1f)));
  int64_t bad[2] = {1, 3};
  weft_clear_error();
  cr_expect(isnan(weft_tensor_get(t, bad)));
  cr_expect(strstr(weft_last_error(), "index 3 out of range for dim 1 of f16[2, 3]"), "%s",
            weft_last_error());
  weft_clear_error();
  weft_tensor_set(t, bad, 5.0);
  cr_expect_eq(weft_last_status(), WEFT_ERR_INVALID);
  int64_t negi[2] = {-1, 0};
  cr_expect(isnan(weft_tensor_get(t, negi)));
  cr_expect(isnan(weft_tensor_get(t, NULL)));
  cr_expect(strstr(weft_last_error(), "index is NULL"));
  uint16_t *p = t->data;
  for (int i = 0; i < 5; i++) cr_expect_eq(p[i], 0, "bad set wrote element %d", i);
  weft_tensor_destroy(t);
  weft_tensor *s;
  OK(weft_tensor_create(WEFT_I64, WEFT_CPU, 0, NULL, &s));
  weft_tensor_set(s, NULL, -42.9);
  cr_expect_eq(weft_tensor_get(s, NULL), -42.0);
  weft_tensor_destroy(s);
}

Test(tensor, equal_compares_dtype_shape_and_bytes) {
  uint64_t r = weft_test_rng_state(weft_test_seed(71));
  int64_t shape[2] = {5, 4};
  weft_tensor v, *b = make_strided(WEFT_BF16, 2, shape, &r, &v), *c, *f;
  fill_rand(&v, &r);
  OK(weft_tensor_clone(&v, &c));
  cr_expect(weft_tensor_equal(&v, c));
  cr_expect(weft_tensor_equal(c, &v));
  int64_t idx[2] = {4, 3};
  weft_tensor_set(c, idx, weft_tensor_get(c, idx) + 0.5);
  cr_expect(!weft_tensor_equal(&v, c), "one element differs");
  OK(weft_cast(&v, WEFT_F32, &f));
  cr_expect(!weft_tensor_equal(&v, f), "dtypes differ");
  weft_tensor *n;
  OK(weft_tensor_narrow(c, 0, 0, 4, &n));
  cr_expect(!weft_tensor_equal(n, c), "shapes differ");
  weft_tensor_fill(n, 0.0);
  weft_tensor *m;
  OK(weft_tensor_clone(n, &m));
  weft_tensor_fill(m, -0.0);
  cr_expect(!weft_tensor_equal(n, m), "-0.0 and 0.0 differ in bytes");
  cr_expect(!weft_tensor_equal(NULL, m));
  weft_tensor *list[] = {b, c, f, n, m};
  for (size_t i = 0; i < 5; i++) weft_tensor_destroy(list[i]);
}

Test(tensor, cuda_views_work_and_ops_without_a_device_say_why) {
  if (weft_device_count(WEFT_CUDA) > 0)
    cr_skip_test("a CUDA device is visible (%s): this test is about having none",
                 weft_backend_name(WEFT_CUDA));
  float buf[8];
  int64_t shape[2] = {2, 4};
  weft_tensor *g, *n, *c = NULL;
  OK(weft_tensor_wrap(buf, WEFT_F32, WEFT_CUDA, 2, shape, &g));
  OK(weft_tensor_narrow(g, 1, 1, 2, &n));
  cr_expect_eq(n->device, WEFT_CUDA);
  char d[64];
  weft_tensor_describe(n, d, sizeof d);
  cr_expect_str_eq(d, "f32[2, 2] on cuda");
  /* operations on a CUDA tensor go to the WEFT_CUDA table: a build without
   * one says so; a build with one but no device asks for weft_cuda_init */
  const weft_status no_dev = WEFT_HAVE_CUDA ? WEFT_ERR_NO_DEVICE : WEFT_ERR_UNSUPPORTED;
  const char *why = WEFT_HAVE_CUDA ? "weft_device_init(WEFT_CUDA" : "no backend for device cuda";
  EXPECT_ERR(weft_tensor_fill(g, 1.0), no_dev, why);
  EXPECT_ERR(weft_tensor_clone(g, &c), no_dev, why);
  cr_expect_null(c);
  weft_tensor *h;
  OK(weft_tensor_create(WEFT_F32, WEFT_CPU, 2, shape, &h));
  EXPECT_ERR(weft_tensor_copy(h, g), no_dev, why);
  weft_tensor *hn;
  OK(weft_tensor_narrow(h, 1, 1, 2, &hn));
  EXPECT_ERR(weft_tensor_copy(hn, n), no_dev, why); /* strided: staged, still needs the device */
  weft_tensor_destroy(hn);
  cr_expect(!weft_tensor_equal(h, g));
  weft_tensor_destroy(h);
  weft_tensor_destroy(n);
  weft_tensor_destroy(g);
}
