/* Elementwise add/mul/scale/axpy and the reductions against references
 * computed element by element in double through weft_tensor_get: random
 * shapes with odd and empty sizes, randomly strided operands, aliasing
 * outputs, every float dtype, the contiguous f32 fast paths, and bad input. */
#include <stdio.h>
#include <stdlib.h>

#include "kernels_testutil.h"

static const weft_dtype float_dtypes[4] = {WEFT_F32, WEFT_F64, WEFT_BF16, WEFT_F16};

/* Rounds v to dtype dt (through f32 for the 16-bit types). */
static double round_to(weft_dtype dt, double v) {
  switch (dt) {
    case WEFT_F32:
      return (float)v;
    case WEFT_BF16:
      return weft_bf16_to_f32(weft_f32_to_bf16((float)v));
    case WEFT_F16:
      return weft_f16_to_f32(weft_f32_to_f16((float)v));
    case WEFT_I32:
      return (double)(int32_t)v;
    case WEFT_I64:
      return (double)(int64_t)v;
    default:
      return v;
  }
}

/* What one op computes: f32/f64 in their own precision, 16-bit types in f32
 * rounded once (one add or multiply of two floats computed in double and rounded
 * to float is the float result: double has more than 2p + 2 bits). */
static weft_dtype compute_dt(weft_dtype dt) { return dt == WEFT_F64 ? WEFT_F64 : WEFT_F32; }

static void random_shape(uint64_t *r, int *ndim, int64_t *shape) {
  static const int64_t sz[] = {0, 1, 2, 3, 5, 17, 33};
  *ndim = (int)weft_test_rng_int(r, 0, 4);
  for (int d = 0; d < *ndim; d++) shape[d] = sz[weft_test_rng_int(r, 1, 6)];
  if (*ndim > 0 && weft_test_rng_int(r, 0, 9) == 0) shape[weft_test_rng_int(r, 0, *ndim - 1)] = 0;
}

typedef enum { OP_ADD, OP_MUL } bin_op;

Test(ops, add_mul_match_reference_for_any_strides_and_aliasing) {
  uint64_t r = weft_test_rng_state(weft_test_seed(201));
  const unsigned long seed = weft_test_seed(201);
  for (int di = 0; di < 4; di++)
    for (int op = 0; op < 2; op++)
      for (int rep = 0; rep < 30; rep++) {
        const weft_dtype dt = float_dtypes[di];
        int ndim;
        int64_t shape[WEFT_MAX_DIMS];
        random_shape(&r, &ndim, shape);
        weft_tensor a, b, o;
        weft_tensor *ba = make_strided(dt, ndim, shape, &r, &a);
        weft_tensor *bb = make_strided(dt, ndim, shape, &r, &b);
        weft_tensor *bo = make_strided(dt, ndim, shape, &r, &o);
        const int alias = rep % 3; /* 0: separate out, 1: out = a, 2: out = b */
        weft_tensor *out = alias == 0 ? &o : alias == 1 ? &a : &b;
        weft_tensor *ca, *cb;
        OK(weft_tensor_clone(&a, &ca));
        OK(weft_tensor_clone(&b, &cb));
        OK(op == OP_ADD ? weft_add(out, &a, &b) : weft_mul(out, &a, &b));
        if (weft_tensor_numel(&a) > 0) {
          int64_t idx[WEFT_MAX_DIMS] = {0};
          do {
            double x = weft_tensor_get(ca, idx), y = weft_tensor_get(cb, idx);
            double want = round_to(dt, round_to(compute_dt(dt), op == OP_ADD ? x + y : x * y));
            double got = weft_tensor_get(out, idx);
            cr_assert_eq(got, want,
                         "%s %s ndim %d alias %d: %.9g %s %.9g = %.9g, want %.9g (seed %lu)",
                         weft_dtype_name(dt), op == OP_ADD ? "add" : "mul", ndim, alias, x,
                         op == OP_ADD ? "+" : "*", y, got, want, seed);
          } while (idx_next(idx, ndim, shape));
        }
        weft_tensor_destroy(ca);
        weft_tensor_destroy(cb);
        weft_tensor_destroy(ba);
        weft_tensor_destroy(bb);
        weft_tensor_destroy(bo);
      }
}

Test(ops, scale_and_axpy_match_reference) {
  uint64_t r = weft_test_rng_state(weft_test_seed(202));
  const unsigned long seed = weft_test_seed(202);
  for (int di = 0; di < 4; di++)
    for (int rep = 0; rep < 30; rep++) {
      const weft_dtype dt = float_dtypes[di];
      int ndim;
      int64_t shape[WEFT_MAX_DIMS];
      random_shape(&r, &ndim, shape);
      const double alpha = 3.0 * weft_test_rng_sym(&r);
      weft_tensor y, x;
      weft_tensor *by = make_strided(dt, ndim, shape, &r, &y),
                  *bx = make_strided(dt, ndim, shape, &r, &x);
      weft_tensor *y0;
      OK(weft_tensor_clone(&y, &y0));
      OK(weft_axpy(&y, alpha, &x));
      const double al = round_to(compute_dt(dt), alpha);
      /* two roundings in the compute precision: t = al * x, then y + t */
      const double eps = dt == WEFT_F64    ? 0x1p-52
                         : dt == WEFT_F32  ? 0x1p-23
                         : dt == WEFT_BF16 ? 0x1p-7
                                           : 0x1p-10;
      if (weft_tensor_numel(&y) > 0) {
        int64_t idx[WEFT_MAX_DIMS] = {0};
        do {
          double yv = weft_tensor_get(y0, idx), xv = weft_tensor_get(&x, idx);
          double want = yv + al * xv, got = weft_tensor_get(&y, idx);
          cr_assert(fabs(got - want) <= eps * (fabs(yv) + fabs(al * xv)),
                    "%s axpy: %.9g + %.9g * %.9g = %.9g, want %.9g (seed %lu)", weft_dtype_name(dt),
                    yv, al, xv, got, want, seed);
        } while (idx_next(idx, ndim, shape));
      }
      /* scale x in place */
      weft_tensor *x0;
      OK(weft_tensor_clone(&x, &x0));
      OK(weft_scale(&x, alpha));
      if (weft_tensor_numel(&x) > 0) {
        int64_t idx[WEFT_MAX_DIMS] = {0};
        do {
          double xv = weft_tensor_get(x0, idx);
          double want = round_to(dt, round_to(compute_dt(dt), xv * al)),
                 got = weft_tensor_get(&x, idx);
          cr_assert_eq(got, want, "%s scale: %.9g * %.9g = %.9g, want %.9g (seed %lu)",
                       weft_dtype_name(dt), xv, al, got, want, seed);
        } while (idx_next(idx, ndim, shape));
      }
      weft_tensor_destroy(x0);
      weft_tensor_destroy(y0);
      weft_tensor_destroy(by);
      weft_tensor_destroy(bx);
    }
}

Test(ops, contiguous_f32_fast_paths_are_exact) {
  uint64_t r = weft_test_rng_state(weft_test_seed(203));
  int64_t n[2] = {313, 331};
  weft_tensor *a, *b, *o, *a0, *b0;
  OK(weft_tensor_create(WEFT_F32, WEFT_CPU, 2, n, &a));
  OK(weft_tensor_create(WEFT_F32, WEFT_CPU, 2, n, &b));
  OK(weft_tensor_create(WEFT_F32, WEFT_CPU, 2, n, &o));
  float *pa = a->data, *pb = b->data, *po = o->data;
  const int64_t N = n[0] * n[1];
  for (int64_t i = 0; i < N; i++) {
    pa[i] = (float)weft_test_rng_sym(&r);
    pb[i] = (float)(4.0 * weft_test_rng_sym(&r));
  }
  OK(weft_add(o, a, b));
  for (int64_t i = 0; i < N; i++) cr_assert_eq(po[i], pa[i] + pb[i], "add %" PRId64, i);
  OK(weft_mul(o, a, b));
  for (int64_t i = 0; i < N; i++) cr_assert_eq(po[i], pa[i] * pb[i], "mul %" PRId64, i);
  OK(weft_tensor_clone(a, &a0));
  const float *pa0 = a0->data;
  OK(weft_axpy(a, -0.5, b));
  for (int64_t i = 0; i < N; i++) cr_assert_eq(pa[i], pa0[i] + -0.5f * pb[i], "axpy %" PRId64, i);
  OK(weft_tensor_clone(b, &b0));
  const float *pb0 = b0->data;
  OK(weft_scale(b, 1.0 / 3.0));
  for (int64_t i = 0; i < N; i++)
    cr_assert_eq(pb[i], pb0[i] * (float)(1.0 / 3.0), "scale %" PRId64, i);
  OK(weft_tensor_copy(a0, a));
  OK(weft_add(a, a, a)); /* full aliasing */
  for (int64_t i = 0; i < N; i++) cr_assert_eq(pa[i], pa0[i] + pa0[i], "a + a %" PRId64, i);
  OK(weft_mul(b, a, b)); /* out aliases the second input */
  for (int64_t i = 0; i < N; i++)
    cr_assert_eq(pb[i], pa[i] * (pb0[i] * (float)(1.0 / 3.0)), "a * b %" PRId64, i);
  weft_tensor *list[] = {a, b, o, a0, b0};
  for (int i = 0; i < 5; i++) weft_tensor_destroy(list[i]);
}

Test(ops, elementwise_bad_input) {
  int64_t s23[2] = {2, 3}, s32[2] = {3, 2};
  weft_tensor *a, *b, *c, *i, *j;
  OK(weft_tensor_create(WEFT_F32, WEFT_CPU, 2, s23, &a));
  OK(weft_tensor_create(WEFT_F32, WEFT_CPU, 2, s32, &b));
  OK(weft_tensor_create(WEFT_BF16, WEFT_CPU, 2, s23, &c));
  OK(weft_tensor_create(WEFT_I32, WEFT_CPU, 2, s23, &i));
  OK(weft_tensor_create(WEFT_I32, WEFT_CPU, 2, s23, &j));
  EXPECT_ERR(weft_add(a, a, b), WEFT_ERR_INVALID, "shape mismatch: out f32[2, 3], b f32[3, 2]");
  EXPECT_ERR(weft_mul(a, c, a), WEFT_ERR_INVALID, "dtype mismatch: out f32[2, 3], a bf16[2, 3]");
  EXPECT_ERR(weft_add(i, i, j), WEFT_ERR_INVALID,
             "out i32[2, 3]: elementwise ops need a float dtype");
  EXPECT_ERR(weft_axpy(a, 1.0, b), WEFT_ERR_INVALID, "shape mismatch: y f32[2, 3], x f32[3, 2]");
  EXPECT_ERR(weft_axpy(a, 1.0, NULL), WEFT_ERR_INVALID, "x is NULL");
  EXPECT_ERR(weft_scale(i, 2.0), WEFT_ERR_INVALID, "i32");
  EXPECT_ERR(weft_scale(NULL, 2.0), WEFT_ERR_INVALID, "NULL");
  float buf[6];
  weft_tensor g;
  OK(weft_tensor_view_init(&g, buf, WEFT_F32, WEFT_CUDA, 2, s23, NULL));
  /* one op, one device: a mixed call is refused naming both */
  EXPECT_ERR(weft_add(a, a, &g), WEFT_ERR_INVALID, "b is on cuda (f32[2, 3] on cuda)");
  weft_tensor *list[] = {a, b, c, i, j};
  for (int k = 0; k < 5; k++) weft_tensor_destroy(list[k]);
}

static const char *kind_str(weft_reduce_kind k) {
  return k == WEFT_REDUCE_SUM ? "sum" : k == WEFT_REDUCE_SUMSQ ? "sumsq" : "max";
}

Test(ops, reduce_over_a_dim_matches_reference) {
  uint64_t r = weft_test_rng_state(weft_test_seed(204));
  const unsigned long seed = weft_test_seed(204);
  const weft_dtype dts[5] = {WEFT_F32, WEFT_F64, WEFT_BF16, WEFT_F16, WEFT_I32};
  for (int di = 0; di < 5; di++)
    for (int kind = 0; kind < 3; kind++)
      for (int rep = 0; rep < 25; rep++) {
        const weft_dtype dt = dts[di];
        int ndim;
        int64_t shape[WEFT_MAX_DIMS];
        random_shape(&r, &ndim, shape);
        const int nd = ndim > 0 ? ndim : 1;
        const int dim = (int)weft_test_rng_int(&r, -nd, nd - 1), d = dim < 0 ? dim + nd : dim;
        if (kind == WEFT_REDUCE_MAX && ndim > 0 && shape[d] == 0) shape[d] = 3;
        weft_tensor t, o;
        weft_tensor *bt = make_strided(dt, ndim, shape, &r, &t);
        int64_t oshape[WEFT_MAX_DIMS];
        memcpy(oshape, shape, sizeof oshape);
        if (ndim > 0) oshape[d] = 1;
        weft_tensor *bo = make_strided(dt, ndim, oshape, &r, &o);
        OK(weft_reduce(&t, (weft_reduce_kind)kind, dim, &o));
        if (weft_tensor_numel(&o) > 0) {
          int64_t idx[WEFT_MAX_DIMS] = {0};
          do {
            double acc = kind == WEFT_REDUCE_MAX ? -INFINITY : 0.0, mag = 0;
            int64_t len = ndim > 0 ? shape[d] : 1, src[WEFT_MAX_DIMS];
            memcpy(src, idx, sizeof src);
            for (int64_t k = 0; k < len; k++) {
              if (ndim > 0) src[d] = k;
              double v = weft_tensor_get(&t, src);
              if (kind == WEFT_REDUCE_SUM)
                acc += v;
              else if (kind == WEFT_REDUCE_SUMSQ)
                acc += v * v;
              else if (v > acc)
                acc = v;
              mag += kind == WEFT_REDUCE_SUMSQ ? v * v : fabs(v);
            }
            double want = round_to(dt, acc), got = weft_tensor_get(&o, idx);
            double tol = 1e-12 * mag + (dt == WEFT_BF16  ? 0x1p-8
                                        : dt == WEFT_F16 ? 0x1p-11
                                                         : 0x1p-24) *
                                           fabs(acc);
            if (dt == WEFT_F64) tol = 1e-12 * mag;
            if (dt == WEFT_I32 || kind == WEFT_REDUCE_MAX) tol = 0;
            cr_assert(fabs(got - want) <= tol,
                      "%s %s dim %d of ndim %d: %.17g, want %.17g (seed %lu)", weft_dtype_name(dt),
                      kind_str((weft_reduce_kind)kind), dim, ndim, got, want, seed);
          } while (idx_next(idx, ndim, oshape));
        }
        weft_tensor_destroy(bt);
        weft_tensor_destroy(bo);
      }
}

Test(ops, reduce_all_matches_reference_and_fast_path) {
  uint64_t r = weft_test_rng_state(weft_test_seed(205));
  for (int kind = 0; kind < 3; kind++) {
    /* contiguous f32 fast path */
    int64_t n[1] = {100003};
    weft_tensor *t;
    OK(weft_tensor_create(WEFT_F32, WEFT_CPU, 1, n, &t));
    float *p = t->data;
    double acc = kind == WEFT_REDUCE_MAX ? -INFINITY : 0;
    for (int64_t i = 0; i < n[0]; i++) {
      p[i] = (float)(weft_test_rng_sym(&r) + 0.25);
      double v = p[i];
      acc = kind == WEFT_REDUCE_SUM     ? acc + v
            : kind == WEFT_REDUCE_SUMSQ ? acc + v * v
                                        : (v > acc ? v : acc);
    }
    double got;
    OK(weft_reduce_all(t, (weft_reduce_kind)kind, &got));
    cr_expect(fabs(got - acc) <= 1e-12 * (fabs(acc) + n[0]), "%s: %.17g vs %.17g",
              kind_str((weft_reduce_kind)kind), got, acc);
    weft_tensor_destroy(t);
    /* strided, every float dtype and i64 */
    const weft_dtype dts[5] = {WEFT_F32, WEFT_F64, WEFT_BF16, WEFT_F16, WEFT_I64};
    for (int di = 0; di < 5; di++) {
      int64_t shape[3] = {17, 3, 33};
      weft_tensor v;
      weft_tensor *b = make_strided(dts[di], 3, shape, &r, &v);
      double ref = kind == WEFT_REDUCE_MAX ? -INFINITY : 0;
      int64_t idx[3] = {0, 0, 0};
      do {
        double x = weft_tensor_get(&v, idx);
        ref = kind == WEFT_REDUCE_SUM     ? ref + x
              : kind == WEFT_REDUCE_SUMSQ ? ref + x * x
                                          : (x > ref ? x : ref);
      } while (idx_next(idx, 3, shape));
      OK(weft_reduce_all(&v, (weft_reduce_kind)kind, &got));
      cr_expect(fabs(got - ref) <= 1e-9 * fabs(ref), "%s %s: %.17g vs %.17g",
                weft_dtype_name(dts[di]), kind_str((weft_reduce_kind)kind), got, ref);
      weft_tensor_destroy(b);
    }
  }
}

Test(ops, reductions_nan_empty_and_bad_input) {
  int64_t s23[2] = {2, 3}, s13[2] = {1, 3}, s21[2] = {2, 1}, s03[2] = {0, 3}, s3[1] = {3};
  weft_tensor *t, *o1, *o2, *e, *eo, *o3, *ob;
  OK(weft_tensor_create(WEFT_F32, WEFT_CPU, 2, s23, &t));
  OK(weft_tensor_create(WEFT_F32, WEFT_CPU, 2, s13, &o1));
  OK(weft_tensor_create(WEFT_F32, WEFT_CPU, 2, s21, &o2));
  OK(weft_tensor_create(WEFT_F32, WEFT_CPU, 2, s03, &e));
  OK(weft_tensor_create(WEFT_F32, WEFT_CPU, 2, s13, &eo));
  OK(weft_tensor_create(WEFT_F32, WEFT_CPU, 1, s3, &o3));
  OK(weft_tensor_create(WEFT_BF16, WEFT_CPU, 2, s13, &ob));
  float *p = t->data;
  for (int i = 0; i < 6; i++) p[i] = (float)i;
  p[4] = NAN;
  OK(weft_reduce(t, WEFT_REDUCE_MAX, 1, o2));
  float *q = o2->data;
  cr_expect_eq(q[0], 2.0f);
  cr_expect(isnan(q[1]), "max propagates NaN: %g", (double)q[1]);
  double all;
  OK(weft_reduce_all(t, WEFT_REDUCE_MAX, &all));
  cr_expect(isnan(all));
  OK(weft_reduce(t, WEFT_REDUCE_SUM, -2, o1));
  q = o1->data;
  cr_expect_eq(q[0], 3.0f);
  cr_expect(isnan(q[1]));
  cr_expect_eq(q[2], 7.0f);
  /* empty: sums are 0, max is an error */
  OK(weft_reduce(e, WEFT_REDUCE_SUMSQ, 0, eo));
  q = eo->data;
  for (int i = 0; i < 3; i++) cr_expect_eq(q[i], 0.0f);
  EXPECT_ERR(weft_reduce(e, WEFT_REDUCE_MAX, 0, eo), WEFT_ERR_INVALID,
             "max over dim 0 of size 0 in f32[0, 3]");
  OK(weft_reduce_all(e, WEFT_REDUCE_SUM, &all));
  cr_expect_eq(all, 0.0);
  EXPECT_ERR(weft_reduce_all(e, WEFT_REDUCE_MAX, &all), WEFT_ERR_INVALID, "empty tensor f32[0, 3]");
  /* 0-d */
  weft_tensor *s, *so;
  OK(weft_tensor_create(WEFT_F64, WEFT_CPU, 0, NULL, &s));
  OK(weft_tensor_create(WEFT_F64, WEFT_CPU, 0, NULL, &so));
  *(double *)s->data = -3.0;
  OK(weft_reduce(s, WEFT_REDUCE_SUMSQ, -1, so));
  cr_expect_eq(*(double *)so->data, 9.0);
  EXPECT_ERR(weft_reduce(s, WEFT_REDUCE_SUM, 1, so), WEFT_ERR_INVALID, "dim 1 out of range");
  /* bad arguments */
  EXPECT_ERR(weft_reduce(t, WEFT_REDUCE_SUM, 0, o2), WEFT_ERR_INVALID,
             "out f32[2, 1] must be the input f32[2, 3] with dim 0 of size 1");
  EXPECT_ERR(weft_reduce(t, WEFT_REDUCE_SUM, 0, o3), WEFT_ERR_INVALID, "keepdim");
  EXPECT_ERR(weft_reduce(t, WEFT_REDUCE_SUM, 2, o1), WEFT_ERR_INVALID,
             "dim 2 out of range for f32[2, 3] (expected -2..1)");
  EXPECT_ERR(weft_reduce(t, WEFT_REDUCE_SUM, 0, ob), WEFT_ERR_INVALID,
             "out bf16[1, 3] must have the input's dtype");
  EXPECT_ERR(weft_reduce(t, (weft_reduce_kind)9, 0, o1), WEFT_ERR_INVALID, "kind 9");
  EXPECT_ERR(weft_reduce(t, WEFT_REDUCE_SUM, 0, NULL), WEFT_ERR_INVALID, "out is NULL");
  EXPECT_ERR(weft_reduce_all(t, WEFT_REDUCE_SUM, NULL), WEFT_ERR_INVALID, "out is NULL");
  EXPECT_ERR(weft_reduce_all(NULL, WEFT_REDUCE_SUM, &all), WEFT_ERR_INVALID, "NULL");
  weft_tensor *list[] = {t, o1, o2, e, eo, o3, ob, s, so};
  for (int i = 0; i < 9; i++) weft_tensor_destroy(list[i]);
}
