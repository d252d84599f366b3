/* dtype table, parsing, and bf16/f16 conversions against independent
 * references: exhaustive round trips over all 2^16 patterns, and
 * round-to-nearest-even checked by comparing distances to both neighbours. */
#include "kernels_testutil.h"

static uint32_t fbits(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  return u;
}
static float bitsf(uint32_t u) {
  float x;
  memcpy(&x, &u, 4);
  return x;
}

Test(dtype, table_names_sizes_and_parse_roundtrip) {
  const struct {
    weft_dtype dt;
    const char *name, *alias;
    size_t size;
    bool is_float;
  } want[] = {
      {.dt = WEFT_F32, .name = "f32", .alias = "float32", .size = 4, .is_float = true},
      {.dt = WEFT_F64, .name = "f64", .alias = "float64", .size = 8, .is_float = true},
      {.dt = WEFT_BF16, .name = "bf16", .alias = "bfloat16", .size = 2, .is_float = true},
      {.dt = WEFT_F16, .name = "f16", .alias = "float16", .size = 2, .is_float = true},
      {.dt = WEFT_I32, .name = "i32", .alias = "int32", .size = 4, .is_float = false},
      {.dt = WEFT_I64, .name = "i64", .alias = "int64", .size = 8, .is_float = false},
      {.dt = WEFT_U8, .name = "u8", .alias = "uint8", .size = 1, .is_float = false},
  };
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    cr_expect_eq(weft_dtype_size(want[i].dt), want[i].size, "%s", want[i].name);
    cr_expect_str_eq(weft_dtype_name(want[i].dt), want[i].name);
    cr_expect_eq(weft_dtype_is_float(want[i].dt), want[i].is_float, "%s", want[i].name);
    weft_dtype p = WEFT_DTYPE_COUNT;
    cr_expect_eq(weft_dtype_parse(want[i].name, &p), WEFT_OK);
    cr_expect_eq(p, want[i].dt);
    p = WEFT_DTYPE_COUNT;
    cr_expect_eq(weft_dtype_parse(want[i].alias, &p), WEFT_OK);
    cr_expect_eq(p, want[i].dt);
  }
  cr_expect_eq(weft_dtype_size(WEFT_DTYPE_COUNT), 0);
  cr_expect_str_eq(weft_dtype_name((weft_dtype)99), "?");
  cr_expect(!weft_dtype_is_float((weft_dtype)-1));
}

Test(dtype, parse_unknown_names_the_input) {
  weft_dtype p;
  EXPECT_ERR(weft_dtype_parse("float8", &p), WEFT_ERR_INVALID, "float8");
  EXPECT_ERR(weft_dtype_parse(NULL, &p), WEFT_ERR_INVALID, "(null)");
}

Test(dtype, bf16_all_patterns_roundtrip) {
  for (uint32_t h = 0; h < 65536; h++) {
    float f = weft_bf16_to_f32((uint16_t)h);
    cr_assert_eq(fbits(f), h << 16, "bf16 0x%04x decodes to bits 0x%08x", h, fbits(f));
    uint16_t back = weft_f32_to_bf16(f);
    if (isnan(f))
      cr_assert(isnan(weft_bf16_to_f32(back)), "NaN 0x%04x -> 0x%04x not NaN", h, back);
    else
      cr_assert_eq(back, h, "bf16 0x%04x -> f32 -> 0x%04x", h, back);
  }
}

/* Reference: x lies between the truncated pattern t and t + 1 (towards
 * larger magnitude); pick the closer, ties to the even pattern. */
static uint16_t ref_bf16(float x) {
  uint32_t u = fbits(x);
  uint16_t t = (uint16_t)(u >> 16);
  uint16_t up = (uint16_t)(t + 1);
  double ax = fabs((double)x);
  double v0 = fabs((double)weft_bf16_to_f32(t));
  double v1 = (up & 0x7fff) == 0x7f80 ? ldexp(1.0, 128) : fabs((double)weft_bf16_to_f32(up));
  double d0 = ax - v0, d1 = v1 - ax;
  if (d0 < d1) return t;
  if (d1 < d0) return up;
  return (t & 1) ? up : t;
}

Test(dtype, bf16_rounds_to_nearest_even) {
  uint64_t r = weft_test_rng_state(weft_test_seed(11));
  for (int i = 0; i < 300000; i++) {
    uint32_t u = (uint32_t)weft_test_rng_u64(&r);
    if ((u & 0x7f800000u) == 0x7f800000u) continue;  /* inf/NaN below */
    if (i % 4 == 0) u = (u & 0xffff0000u) | 0x8000u; /* exact ties */
    float x = bitsf(u);
    uint16_t got = weft_f32_to_bf16(x), want = ref_bf16(x);
    cr_assert_eq(got, want, "bf16(%a = 0x%08x) = 0x%04x, want 0x%04x (seed %lu)", (double)x, u, got,
                 want, weft_test_seed(11));
  }
  cr_expect_eq(weft_f32_to_bf16(bitsf(0x3f808000u)), 0x3f80, "tie at 1 + 2^-8 goes to even 1.0");
  cr_expect_eq(weft_f32_to_bf16(bitsf(0x3f818000u)), 0x3f82, "tie goes up to the even pattern");
  cr_expect_eq(weft_f32_to_bf16(bitsf(0x3f808001u)), 0x3f81, "just above a tie rounds up");
  cr_expect_eq(weft_f32_to_bf16(-0.0f), 0x8000);
  cr_expect_eq(weft_f32_to_bf16(INFINITY), 0x7f80);
  cr_expect_eq(weft_f32_to_bf16(-INFINITY), 0xff80);
  cr_expect_eq(weft_f32_to_bf16(bitsf(0x7f7fffffu)), 0x7f80, "FLT_MAX rounds to inf in bf16");
  cr_expect(isnan(weft_bf16_to_f32(weft_f32_to_bf16(NAN))));
  cr_expect(isnan(weft_bf16_to_f32(weft_f32_to_bf16(bitsf(0x7f800001u)))),
            "signalling NaN with a low payload stays NaN");
}

Test(dtype, f16_all_patterns_roundtrip) {
  for (uint32_t h = 0; h < 65536; h++) {
    float f = weft_f16_to_f32((uint16_t)h);
    uint16_t back = weft_f32_to_f16(f);
    if ((h & 0x7c00u) == 0x7c00u && (h & 0x3ffu)) {
      cr_assert(isnan(f), "f16 NaN 0x%04x decodes to %g", h, (double)f);
      cr_assert(isnan(weft_f16_to_f32(back)));
    } else {
      cr_assert_eq(back, h, "f16 0x%04x -> %a -> 0x%04x", h, (double)f, back);
    }
  }
  /* decoded values against the definition */
  cr_expect_eq(weft_f16_to_f32(0x3c00), 1.0f);
  cr_expect_eq(weft_f16_to_f32(0x7bff), 65504.0f);
  cr_expect_eq(weft_f16_to_f32(0x0001), ldexpf(1.0f, -24));
  cr_expect_eq(weft_f16_to_f32(0x0400), ldexpf(1.0f, -14));
  cr_expect_eq(weft_f16_to_f32(0xc000), -2.0f);
  cr_expect(isinf(weft_f16_to_f32(0x7c00)));
}

/* Reference: binary search over the monotonic positive patterns
 * 0x0000..0x7bff, then nearest of the two neighbours, ties to even. */
static uint16_t ref_f16(float x) {
  double ax = fabs((double)x);
  uint16_t sign = signbit(x) ? 0x8000 : 0;
  int lo = 0, hi = 0x7bff; /* largest pattern with value <= ax */
  if (ax >= 65504.0) {
    lo = 0x7bff;
  } else {
    while (lo < hi) {
      int mid = (lo + hi + 1) / 2;
      if ((double)weft_f16_to_f32((uint16_t)mid) <= ax)
        lo = mid;
      else
        hi = mid - 1;
    }
  }
  double v0 = weft_f16_to_f32((uint16_t)lo);
  double v1 = lo == 0x7bff ? 65536.0 : (double)weft_f16_to_f32((uint16_t)(lo + 1));
  double d0 = ax - v0, d1 = v1 - ax;
  uint16_t pick;
  if (d0 < d1)
    pick = (uint16_t)lo;
  else if (d1 < d0)
    pick = (uint16_t)(lo + 1);
  else
    pick = (lo & 1) ? (uint16_t)(lo + 1) : (uint16_t)lo;
  return sign | pick; /* lo + 1 == 0x7c00 is inf */
}

Test(dtype, f16_rounds_to_nearest_even_including_subnormals_and_overflow) {
  uint64_t r = weft_test_rng_state(weft_test_seed(12));
  for (int i = 0; i < 100000; i++) {
    double mag = ldexp(1.0 + weft_test_rng_unit(&r), (int)weft_test_rng_int(&r, -27, 16));
    float x = (float)(weft_test_rng_unit(&r) < 0.5 ? -mag : mag);
    if (i % 5 == 0) { /* exact ties between two f16 neighbours */
      uint16_t h = (uint16_t)weft_test_rng_int(&r, 0, 0x7bfe);
      x = (float)(((double)weft_f16_to_f32(h) + (double)weft_f16_to_f32((uint16_t)(h + 1))) / 2);
    }
    uint16_t got = weft_f32_to_f16(x), want = ref_f16(x);
    cr_assert_eq(got, want, "f16(%a) = 0x%04x, want 0x%04x (seed %lu)", (double)x, got, want,
                 weft_test_seed(12));
  }
  cr_expect_eq(weft_f32_to_f16(65519.0f), 0x7bff, "65519 rounds down to 65504");
  cr_expect_eq(weft_f32_to_f16(65520.0f), 0x7c00, "65520 ties to inf");
  cr_expect_eq(weft_f32_to_f16(ldexpf(1.0f, -25)), 0x0000, "2^-25 ties to zero");
  cr_expect_eq(weft_f32_to_f16(ldexpf(1.5f, -25)), 0x0001);
  cr_expect_eq(weft_f32_to_f16(-INFINITY), 0xfc00);
  cr_expect(isnan(weft_f16_to_f32(weft_f32_to_f16(NAN))));
}

/* The CPU's vectorised, threaded paths (kernels/cpu/convert.c and the
 * contiguous bf16 loops of cpu/ops.c) give, element for element, the
 * scalar conversion's bits: every f32 <-> bf16 copy of a dense tensor, and
 * add, mul and scale of dense bf16 tensors as f32 arithmetic rounded once.
 * Lengths around the 8- and 16-wide steps (the portable and the AVX2
 * loops) and across thread chunks (16384), starts
 * at odd offsets, and special values: NaNs with payloads (quiet and
 * signalling), infinities, ties, subnormals, values that round to inf. */
static float special_f32(uint64_t *s, int64_t i) {
  static const uint32_t bits[] = {0x7fc00001u, 0xffa00000u, 0x7f800001u, 0x7f800000u, 0xff800000u,
                                  0x3f808000u, 0x3f818000u, 0x00000001u, 0x80400000u, 0x7f7fffffu,
                                  0x7f7f8000u, 0x00000000u, 0x80000000u, 0x3f807fffu};
  if (i % 7 == 3) return bitsf(bits[(i / 7) % (sizeof bits / sizeof bits[0])]);
  return (float)(weft_test_rng_unit(s) * 6.0 - 3.0) * (i % 5 == 1 ? 1e-39f : 1.0f);
}

Test(dtype, dense_bf16_copies_and_elementwise_ops_give_the_scalar_bits) {
  uint64_t s = weft_test_rng_state(weft_test_seed(31));
  const int64_t lens[] = {1, 7, 8, 9, 15, 16, 17, 31, 32, 33, 47, 1000, 16384 * 2 + 13};
  for (size_t k = 0; k < sizeof lens / sizeof lens[0]; k++) {
    const int64_t n = lens[k], off = (int64_t)(k % 3); /* views at odd element offsets */
    int64_t sh[1] = {n + off};
    weft_tensor *f, *h, *g, *hb, *o;
    OK(weft_tensor_create(WEFT_F32, WEFT_CPU, 1, sh, &f));
    OK(weft_tensor_create(WEFT_BF16, WEFT_CPU, 1, sh, &h));
    OK(weft_tensor_create(WEFT_F32, WEFT_CPU, 1, sh, &g));
    OK(weft_tensor_create(WEFT_BF16, WEFT_CPU, 1, sh, &hb));
    OK(weft_tensor_create(WEFT_BF16, WEFT_CPU, 1, sh, &o));
    float *fv = f->data;
    for (int64_t i = 0; i < n + off; i++) fv[i] = special_f32(&s, i);
    int64_t vs[1] = {n};
    weft_tensor fv1, hv1, gv1, bv1, ov1;
    OK(weft_tensor_view_init(&fv1, fv + off, WEFT_F32, WEFT_CPU, 1, vs, NULL));
    OK(weft_tensor_view_init(&hv1, (uint16_t *)h->data + off, WEFT_BF16, WEFT_CPU, 1, vs, NULL));
    OK(weft_tensor_view_init(&gv1, (float *)g->data + off, WEFT_F32, WEFT_CPU, 1, vs, NULL));
    OK(weft_tensor_view_init(&bv1, (uint16_t *)hb->data + off, WEFT_BF16, WEFT_CPU, 1, vs, NULL));
    OK(weft_tensor_view_init(&ov1, (uint16_t *)o->data + off, WEFT_BF16, WEFT_CPU, 1, vs, NULL));
    OK(weft_tensor_copy(&hv1, &fv1)); /* f32 -> bf16 */
    const uint16_t *hv = hv1.data;
    for (int64_t i = 0; i < n; i++)
      cr_assert_eq(hv[i], weft_f32_to_bf16(fv[off + i]), "n %lld: bf16 of %08x is %04x, want %04x",
                   (long long)n, fbits(fv[off + i]), hv[i], weft_f32_to_bf16(fv[off + i]));
    OK(weft_tensor_copy(&gv1, &hv1)); /* bf16 -> f32 */
    const float *gvv = gv1.data;
    for (int64_t i = 0; i < n; i++)
      cr_assert_eq(fbits(gvv[i]), fbits(weft_bf16_to_f32(hv[i])), "n %lld: f32 of %04x",
                   (long long)n, hv[i]);
    uint16_t *bv = bv1.data;
    for (int64_t i = 0; i < n; i++) bv[i] = weft_f32_to_bf16(special_f32(&s, i + 5));
    for (int op = 0; op < 3; op++) {
      if (op == 0) OK(weft_add(&ov1, &hv1, &bv1));
      if (op == 1) OK(weft_mul(&ov1, &hv1, &bv1));
      if (op == 2) {
        OK(weft_tensor_copy(&ov1, &hv1));
        OK(weft_scale(&ov1, -0.3));
      }
      const uint16_t *ov = ov1.data;
      for (int64_t i = 0; i < n; i++) {
        float x = weft_bf16_to_f32(hv[i]), y = weft_bf16_to_f32(bv[i]);
        float r = op == 0 ? x + y : op == 1 ? x * y : x * (float)-0.3;
        cr_assert_eq(ov[i], weft_f32_to_bf16(r), "n %lld, op %d, [%lld]: %04x, want %04x",
                     (long long)n, op, (long long)i, ov[i], weft_f32_to_bf16(r));
      }
    }
    weft_tensor_destroy(f);
    weft_tensor_destroy(h);
    weft_tensor_destroy(g);
    weft_tensor_destroy(hb);
    weft_tensor_destroy(o);
  }
}
