/* Counter-based RNG: Philox4x32-10 known answers (Random123 kat_vectors),
 * FNV-1a keys, the documented element recipe, shard fills equal to slices of
 * the full fill (1-D and 2-D shards, uneven and empty chunks, strided
 * destinations), distribution moments, stream independence, and bad input. */
#include "kernels_testutil.h"
#include "weft_config.h"

Test(rng, philox4x32_10_matches_random123_known_answers) {
  const philox_kat *kat = philox_kats();
  for (int i = 0; i < N_PHILOX_KATS; i++) {
    uint64_t lo = (uint64_t)kat[i].ctr[0] | (uint64_t)kat[i].ctr[1] << 32;
    uint64_t hi = (uint64_t)kat[i].ctr[2] | (uint64_t)kat[i].ctr[3] << 32;
    uint64_t key = (uint64_t)kat[i].key[0] | (uint64_t)kat[i].key[1] << 32;
    uint32_t out[4];
    weft_philox4x32(lo, hi, key, out);
    for (int w = 0; w < 4; w++)
      cr_expect_eq(out[w], kat[i].out[w], "vector %d word %d: 0x%08x, want 0x%08x", i, w, out[w],
                   kat[i].out[w]);
  }
}

Test(rng, key_is_fnv1a_64) {
  cr_expect_eq(weft_rng_key(""), 0xcbf29ce484222325ULL);
  cr_expect_eq(weft_rng_key("a"), 0xaf63dc4c8601ec8cULL);
  cr_expect_eq(weft_rng_key("foobar"), 0x85944171f73967e8ULL);
  cr_expect_eq(weft_rng_key(NULL), 0xcbf29ce484222325ULL);
  cr_expect_neq(weft_rng_key("layers.0.attention.wq.weight"),
                weft_rng_key("layers.0.attention.wk.weight"));
}

/* The recipe documented in kernels/rng.c, recomputed here. */
static double recipe(uint64_t seed, uint64_t key, uint64_t e, bool normal, double a, double b) {
  uint32_t x[4];
  weft_philox4x32(e / 2, key, seed, x);
  uint64_t w0 = (uint64_t)x[0] | (uint64_t)x[1] << 32, w1 = (uint64_t)x[2] | (uint64_t)x[3] << 32;
  if (!normal) return a + (b - a) * ldexp((double)((e % 2 ? w1 : w0) >> 11), -53);
  double u1 = ldexp((double)((w0 >> 11) + 1), -53), u2 = ldexp((double)(w1 >> 11), -53);
  double r = sqrt(-2.0 * log(u1));
  return a + b * (e % 2 ? r * sin(2.0 * M_PI * u2) : r * cos(2.0 * M_PI * u2));
}

Test(rng, elements_follow_the_documented_recipe) {
  int64_t shape[2] = {5, 7};
  weft_tensor *t;
  OK(weft_tensor_create(WEFT_F64, WEFT_CPU, 2, shape, &t));
  const uint64_t seed = 1234, key = weft_rng_key("w");
  for (int normal = 0; normal < 2; normal++) {
    if (normal)
      OK(weft_tensor_fill_normal(t, seed, key, NULL, 0.25f, 2.0f));
    else
      OK(weft_tensor_fill_uniform(t, seed, key, NULL, -1.0f, 3.0f));
    const double *p = t->data;
    for (int64_t e = 0; e < 35; e++) {
      double want = normal ? recipe(seed, key, (uint64_t)e, true, 0.25, 2.0)
                           : recipe(seed, key, (uint64_t)e, false, -1.0, 3.0);
      cr_assert(fabs(p[e] - want) <= 1e-12 * (1 + fabs(want)),
                "element %" PRId64 ": %.17g vs %.17g", e, p[e], want);
    }
  }
  weft_tensor_destroy(t);
}

/* Fills `local` (shape of the shard) with region (full shape, offsets), and
 * checks it equals the narrowed full fill bit for bit. */
static void check_shard(const weft_tensor *full, int ndim, const int64_t *off, const int64_t *len,
                        bool normal, uint64_t seed, uint64_t key, bool strided_dst) {
  weft_tensor *view = NULL, *tmp;
  OK(weft_tensor_narrow(full, 0, off[0], len[0], &view));
  for (int d = 1; d < ndim; d++) {
    OK(weft_tensor_narrow(view, d, off[d], len[d], &tmp));
    weft_tensor_destroy(view);
    view = tmp;
  }
  weft_rng_region reg = {.ndim = ndim};
  for (int d = 0; d < ndim; d++) {
    reg.global_shape[d] = full->shape[d];
    reg.offset[d] = off[d];
  }
  weft_tensor *local, *holder = NULL, lv;
  if (strided_dst) { /* a transposed destination: same logical shard */
    int64_t ts[WEFT_MAX_DIMS];
    for (int d = 0; d < ndim; d++) ts[d] = len[ndim - 1 - d];
    OK(weft_tensor_create(full->dtype, WEFT_CPU, ndim, ts, &holder));
    int64_t st[WEFT_MAX_DIMS];
    for (int d = 0; d < ndim; d++) st[d] = holder->strides[ndim - 1 - d];
    OK(weft_tensor_view_init(&lv, holder->data, full->dtype, WEFT_CPU, ndim, len, st));
    local = &lv;
  } else {
    OK(weft_tensor_create(full->dtype, WEFT_CPU, ndim, len, &holder));
    local = holder;
  }
  if (normal)
    OK(weft_tensor_fill_normal(local, seed, key, &reg, 0.0f, 1.0f));
  else
    OK(weft_tensor_fill_uniform(local, seed, key, &reg, -2.0f, 5.0f));
  char desc[64];
  weft_tensor_describe(view, desc, sizeof desc);
  cr_assert(weft_tensor_equal(local, view),
            "shard %s at offset (%" PRId64 ", %" PRId64 ") differs from the full fill (%s, %s)",
            desc, off[0], ndim > 1 ? off[1] : 0, normal ? "normal" : "uniform",
            strided_dst ? "strided" : "contiguous");
  weft_tensor_destroy(holder);
  weft_tensor_destroy(view);
}

Test(rng, shard_fills_equal_slices_of_the_full_fill) {
  const weft_dtype dts[3] = {WEFT_F32, WEFT_BF16, WEFT_F64};
  const uint64_t seed = 42, key = weft_rng_key("layers.3.feed_forward.w1.weight");
  for (int di = 0; di < 3; di++)
    for (int normal = 0; normal < 2; normal++) {
      int64_t shape[2] = {7, 10};
      weft_tensor *full;
      OK(weft_tensor_create(dts[di], WEFT_CPU, 2, shape, &full));
      if (normal)
        OK(weft_tensor_fill_normal(full, seed, key, NULL, 0.0f, 1.0f));
      else
        OK(weft_tensor_fill_uniform(full, seed, key, NULL, -2.0f, 5.0f));
      /* Shard(0) over 3 and 8 ranks (uneven, then empty), Shard(1) over 4,
       * and 2-D (Shard(0), Shard(1)) over a 2 x 3 mesh */
      const int64_t ks[4][2] = {{3, 1}, {8, 1}, {1, 4}, {2, 3}};
      for (int c = 0; c < 4; c++)
        for (int64_t i = 0; i < ks[c][0]; i++)
          for (int64_t j = 0; j < ks[c][1]; j++) {
            int64_t off[2], len[2];
            weft_chunk_range(7, ks[c][0], i, &off[0], &len[0]);
            weft_chunk_range(10, ks[c][1], j, &off[1], &len[1]);
            check_shard(full, 2, off, len, normal, seed, key, (i + j) % 2 == 1);
          }
      weft_tensor_destroy(full);
    }
  /* 3-D, sharded in the middle and last dims */
  int64_t s3[3] = {3, 5, 6};
  weft_tensor *full;
  OK(weft_tensor_create(WEFT_F32, WEFT_CPU, 3, s3, &full));
  OK(weft_tensor_fill_normal(full, 7, 9, NULL, 0.0f, 1.0f));
  for (int64_t i = 0; i < 2; i++)
    for (int64_t j = 0; j < 4; j++) {
      int64_t off[3] = {0, 0, 0}, len[3] = {3, 0, 0};
      weft_chunk_range(5, 2, i, &off[1], &len[1]);
      weft_chunk_range(6, 4, j, &off[2], &len[2]);
      check_shard(full, 3, off, len, true, 7, 9, j == 1);
    }
  weft_tensor_destroy(full);
}

Test(rng, normal_moments_are_right) {
  int64_t n[1] = {100000};
  weft_tensor *t;
  OK(weft_tensor_create(WEFT_F64, WEFT_CPU, 1, n, &t));
  const uint64_t seed = weft_test_seed(5);
  OK(weft_tensor_fill_normal(t, seed, weft_rng_key("moments"), NULL, 0.5f, 2.0f));
  const double *p = t->data;
  double s = 0, s2 = 0, s4 = 0;
  int64_t in1 = 0;
  for (int64_t i = 0; i < n[0]; i++) s += p[i];
  double mean = s / n[0];
  for (int64_t i = 0; i < n[0]; i++) {
    double d = p[i] - mean;
    s2 += d * d;
    s4 += d * d * d * d;
    in1 += fabs(p[i] - 0.5) < 2.0;
  }
  double var = s2 / (n[0] - 1), sd = sqrt(var), kurt = (s4 / n[0]) / (var * var);
  /* 5-sigma bounds: mean sd/sqrt(n) = 0.0063; sd ~ sd/sqrt(2n) = 0.0045 */
  cr_expect(fabs(mean - 0.5) < 0.032, "mean %g (seed %lu)", mean, seed);
  cr_expect(fabs(sd - 2.0) < 0.023, "std %g (seed %lu)", sd, seed);
  cr_expect(fabs(kurt - 3.0) < 0.08, "kurtosis %g (seed %lu)", kurt, seed);
  cr_expect(fabs((double)in1 / n[0] - 0.682689) < 0.0074, "P(|z| < 1) = %g (seed %lu)",
            (double)in1 / n[0], seed);
  weft_tensor_destroy(t);
}

Test(rng, uniform_moments_and_range) {
  int64_t n[1] = {100000};
  weft_tensor *t;
  OK(weft_tensor_create(WEFT_F32, WEFT_CPU, 1, n, &t));
  const uint64_t seed = weft_test_seed(6);
  OK(weft_tensor_fill_uniform(t, seed, 3, NULL, -1.0f, 3.0f));
  const float *p = t->data;
  double s = 0, s2 = 0;
  int64_t bins[8] = {0};
  for (int64_t i = 0; i < n[0]; i++) {
    cr_assert(p[i] >= -1.0f && p[i] < 3.0f, "value %g outside [-1, 3)", (double)p[i]);
    s += p[i];
    s2 += (double)p[i] * p[i];
    bins[(int)((p[i] + 1.0f) * 2.0f)]++;
  }
  double mean = s / n[0], var = s2 / n[0] - mean * mean;
  cr_expect(fabs(mean - 1.0) < 0.019, "mean %g (seed %lu)", mean, seed);
  cr_expect(fabs(var - 4.0 / 3.0) < 0.02, "var %g (seed %lu)", var, seed);
  for (int b = 0; b < 8; b++)
    cr_expect(labs((long)bins[b] - 12500) < 520, "bin %d holds %" PRId64 " (seed %lu)", b, bins[b],
              seed);
  weft_tensor_destroy(t);
}

Test(rng, uniform_never_reaches_hi_after_rounding) {
  const weft_dtype dts[2] = {WEFT_BF16, WEFT_F16};
  for (int di = 0; di < 2; di++) {
    int64_t n[1] = {100000};
    weft_tensor *t;
    OK(weft_tensor_create(dts[di], WEFT_CPU, 1, n, &t));
    OK(weft_tensor_fill_uniform(t, 11, 12, NULL, 0.0f, 1.0f));
    double mx = -1;
    int64_t top = 0;
    double below = dts[di] == WEFT_BF16 ? 1.0 - ldexp(1.0, -8) : 1.0 - ldexp(1.0, -11);
    for (int64_t i = 0; i < n[0]; i++) {
      double v = weft_tensor_get(t, &i);
      cr_assert(v >= 0.0 && v < 1.0, "%s value %g outside [0, 1)", weft_dtype_name(dts[di]), v);
      if (v > mx) mx = v;
      top += v == below;
    }
    /* the samples that would have rounded up to 1.0 land on the value below */
    cr_expect_eq(mx, below, "%s max %g", weft_dtype_name(dts[di]), mx);
    cr_expect_gt(top, 20, "%s: %" PRId64 " samples at the top value", weft_dtype_name(dts[di]),
                 top);
    weft_tensor_destroy(t);
  }
}

static double corr(const double *a, const double *b, int64_t n) {
  double sa = 0, sb = 0, sab = 0, saa = 0, sbb = 0;
  for (int64_t i = 0; i < n; i++) {
    sa += a[i];
    sb += b[i];
  }
  sa /= n;
  sb /= n;
  for (int64_t i = 0; i < n; i++) {
    sab += (a[i] - sa) * (b[i] - sb);
    saa += (a[i] - sa) * (a[i] - sa);
    sbb += (b[i] - sb) * (b[i] - sb);
  }
  return sab / sqrt(saa * sbb);
}

Test(rng, streams_differ_by_key_and_seed_and_repeat_exactly) {
  int64_t n[1] = {20000};
  weft_tensor *t[4], *again;
  for (int i = 0; i < 4; i++) OK(weft_tensor_create(WEFT_F64, WEFT_CPU, 1, n, &t[i]));
  OK(weft_tensor_create(WEFT_F64, WEFT_CPU, 1, n, &again));
  OK(weft_tensor_fill_normal(t[0], 1, weft_rng_key("a"), NULL, 0, 1));
  OK(weft_tensor_fill_normal(t[1], 1, weft_rng_key("b"), NULL, 0, 1));
  OK(weft_tensor_fill_normal(t[2], 2, weft_rng_key("a"), NULL, 0, 1));
  OK(weft_tensor_fill_normal(t[3], 1, weft_rng_key("a") + 1, NULL, 0, 1));
  OK(weft_tensor_fill_normal(again, 1, weft_rng_key("a"), NULL, 0, 1));
  cr_expect(weft_tensor_equal(t[0], again), "same (seed, key) repeats bit for bit");
  for (int i = 0; i < 4; i++)
    for (int j = i + 1; j < 4; j++) {
      const double *a = t[i]->data, *b = t[j]->data;
      int64_t same = 0;
      for (int64_t e = 0; e < n[0]; e++) same += a[e] == b[e];
      cr_expect_eq(same, 0, "streams %d and %d share %" PRId64 " values", i, j, same);
      double c = corr(a, b, n[0]);
      cr_expect(fabs(c) < 0.04, "streams %d and %d correlate: %g", i, j, c);
    }
  /* neighbouring elements of one stream are uncorrelated too */
  const double *a = t[0]->data;
  cr_expect(fabs(corr(a, a + 1, n[0] - 1)) < 0.04);
  for (int i = 0; i < 4; i++) weft_tensor_destroy(t[i]);
  weft_tensor_destroy(again);
}

Test(rng, scalars_empties_and_bad_input) {
  weft_tensor *s, *e, *i32, *t;
  OK(weft_tensor_create(WEFT_F64, WEFT_CPU, 0, NULL, &s));
  OK(weft_tensor_fill_uniform(s, 1, 2, NULL, 0.0f, 1.0f));
  cr_expect_eq(*(double *)s->data, recipe(1, 2, 0, false, 0.0, 1.0));
  int64_t z[2] = {0, 4}, s3[1] = {3}, s34[2] = {3, 4};
  OK(weft_tensor_create(WEFT_F32, WEFT_CPU, 2, z, &e));
  OK(weft_tensor_fill_normal(e, 1, 2, NULL, 0.0f, 1.0f));
  OK(weft_tensor_create(WEFT_I32, WEFT_CPU, 1, s3, &i32));
  EXPECT_ERR(weft_tensor_fill_normal(i32, 1, 2, NULL, 0.0f, 1.0f), WEFT_ERR_INVALID, "i32[3]");
  EXPECT_ERR(weft_tensor_fill_uniform(i32, 1, 2, NULL, 0.0f, 1.0f), WEFT_ERR_INVALID,
             "float dtype");
  OK(weft_tensor_create(WEFT_F32, WEFT_CPU, 2, s34, &t));
  weft_rng_region r1 = {.ndim = 1, .global_shape = {3}, .offset = {0}};
  EXPECT_ERR(weft_tensor_fill_normal(t, 1, 2, &r1, 0.0f, 1.0f), WEFT_ERR_INVALID,
             "region has ndim 1, tensor f32[3, 4] has 2");
  weft_rng_region r2 = {.ndim = 2, .global_shape = {7, 4}, .offset = {5, 0}};
  EXPECT_ERR(weft_tensor_fill_normal(t, 1, 2, &r2, 0.0f, 1.0f), WEFT_ERR_INVALID,
             "region dim 0: offset 5 + local size 3 does not fit the global size 7");
  weft_rng_region r3 = {.ndim = 2, .global_shape = {7, 4}, .offset = {-1, 0}};
  EXPECT_ERR(weft_tensor_fill_normal(t, 1, 2, &r3, 0.0f, 1.0f), WEFT_ERR_INVALID, "offset -1");
  EXPECT_ERR(weft_tensor_fill_normal(t, 1, 2, NULL, 0.0f, -1.0f), WEFT_ERR_INVALID, "std -1");
  EXPECT_ERR(weft_tensor_fill_normal(t, 1, 2, NULL, NAN, 1.0f), WEFT_ERR_INVALID, "mean nan");
  EXPECT_ERR(weft_tensor_fill_uniform(t, 1, 2, NULL, 2.0f, 1.0f), WEFT_ERR_INVALID, "lo 2, hi 1");
  EXPECT_ERR(weft_tensor_fill_uniform(t, 1, 2, NULL, 1.0f, 1.0f), WEFT_ERR_INVALID, "lo 1, hi 1");
  EXPECT_ERR(weft_tensor_fill_uniform(NULL, 1, 2, NULL, 0.0f, 1.0f), WEFT_ERR_INVALID, "NULL");
  float buf[4];
  weft_tensor g;
  int64_t s4[1] = {4};
  OK(weft_tensor_view_init(&g, buf, WEFT_F32, WEFT_CUDA, 1, s4, NULL));
  /* a CUDA tensor goes to the WEFT_CUDA table: none in a CPU-only build,
   * and no device selected (weft_cuda_init) in this test otherwise */
  EXPECT_ERR(weft_tensor_fill_normal(&g, 1, 2, NULL, 0.0f, 1.0f),
             WEFT_HAVE_CUDA ? WEFT_ERR_NO_DEVICE : WEFT_ERR_UNSUPPORTED, "cuda");
  weft_tensor_destroy(s);
  weft_tensor_destroy(e);
  weft_tensor_destroy(i32);
  weft_tensor_destroy(t);
}
