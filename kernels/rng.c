/* Counter-based random numbers: Philox4x32-10 (Salmon, Moraes, Dror, Shaw,
 * "Parallel random numbers: as easy as 1, 2, 3", SC 2011), and tensor fills
 * whose every element is a pure function of (seed, key, global index).
 *
 * Element e of a tensor filled under (seed, key), where e is the element's
 * row-major linear index in the region's global shape; elements 2j and 2j+1
 * share one Philox call:
 *
 *     x[0..3] = philox4x32(counter_lo = e >> 1, counter_hi = key, key = seed)
 *     a = x[0] | x[1] << 32,  b = x[2] | x[3] << 32         (64-bit words)
 *     uniform:  u = ((e even ? a : b) >> 11) * 2^-53 in [0, 1);
 *               v = lo + (hi - lo) * u
 *     normal:   u1 = ((a >> 11) + 1) * 2^-53 in (0, 1],  u2 = (b >> 11) * 2^-53,
 *               r = sqrt(-2 ln u1),  z = r cos(2 pi u2) for even e, r sin(2 pi u2)
 *               for odd e (both Box-Muller outputs);  v = mean + std * z
 *
 * computed in double and rounded to the tensor's dtype as a copy of a
 * double is (bf16/f16 through f32, as torch). note: the
 * stream key goes into the counter's high half, not into the Philox key:
 * Philox is a bijection of the 128-bit counter for a fixed key, so distinct
 * (key, index) pairs under one seed can never collide. A CUDA fill must
 * follow the same recipe to give the same numbers.
 */
#include <inttypes.h>
#include <math.h>
#include <string.h>

#include "backend_internal.h"
#include "cpu/cpu_internal.h"
#include "kernels.h"
#include "kernels_internal.h"
#include "tensor_internal.h"

/* FNV-1a, 64-bit (offset basis 0xcbf29ce484222325, prime 0x100000001b3). */
uint64_t weft_rng_key(const char *name) {
  uint64_t h = 0xcbf29ce484222325ULL;
  if (!name) return h;
  for (const unsigned char *p = (const unsigned char *)name; *p; p++) {
    h ^= *p;
    h *= 0x100000001b3ULL;
  }
  return h;
}

void weft_philox4x32(uint64_t counter_lo, uint64_t counter_hi, uint64_t key, uint32_t out[4]) {
  weft_philox_rounds_((uint32_t)counter_lo, (uint32_t)(counter_lo >> 32), (uint32_t)counter_hi,
                      (uint32_t)(counter_hi >> 32), (uint32_t)key, (uint32_t)(key >> 32), out);
}

typedef enum { DIST_NORMAL, DIST_UNIFORM } dist_kind;

typedef struct dist {
  dist_kind kind;
  uint64_t seed, key;
  double a, b;               /* normal: mean, std; uniform: lo, hi */
  unsigned char below_hi[8]; /* uniform: largest value of the dtype < hi */
  bool have_below;
} dist;

/* The two values of counter c = e >> 1 (elements 2c and 2c + 1), cached so
 * that a row computes each pair once. */
typedef struct pair_cache {
  uint64_t counter;
  bool valid;
  double v[2];
} pair_cache;

static inline double sample(const dist *d, uint64_t e, pair_cache *pc) {
  const uint64_t c = e >> 1;
  if (!pc->valid || pc->counter != c) {
    uint32_t x[4];
    weft_philox4x32(c, d->key, d->seed, x);
    const uint64_t a = (uint64_t)x[0] | (uint64_t)x[1] << 32;
    const uint64_t b = (uint64_t)x[2] | (uint64_t)x[3] << 32;
    const double two_m53 = 1.0 / 9007199254740992.0; /* 2^-53 */
    if (d->kind == DIST_UNIFORM) {
      pc->v[0] = d->a + (d->b - d->a) * ((double)(a >> 11) * two_m53);
      pc->v[1] = d->a + (d->b - d->a) * ((double)(b >> 11) * two_m53);
    } else {
      const double u1 = (double)((a >> 11) + 1) * two_m53;
      const double u2 = (double)(b >> 11) * two_m53;
      const double r = sqrt(-2.0 * log(u1)), th = 6.283185307179586476925 * u2;
      pc->v[0] = d->a + d->b * (r * cos(th));
      pc->v[1] = d->a + d->b * (r * sin(th));
    }
    pc->counter = c;
    pc->valid = true;
  }
  return pc->v[e & 1];
}

static inline void store_sample(char *p, weft_dtype dt, const dist *d, double v) {
  weft_store_f_(p, dt, v);
  /* [lo, hi): rounding to the dtype may land on hi itself */
  if (d->kind == DIST_UNIFORM && d->have_below && weft_load_f_(p, dt) >= d->b)
    memcpy(p, d->below_hi, weft_dtype_size(dt));
}

/* One step towards -inf of a 16-bit sign-magnitude float pattern. */
static uint16_t step_down16(uint16_t h) {
  if (h == 0x0000u) return 0x8001u;
  return (h & 0x8000u) ? (uint16_t)(h + 1) : (uint16_t)(h - 1);
}

/* The largest value of dtype dt strictly below hi (hi finite). */
static void value_below(weft_dtype dt, double hi, unsigned char out[8]) {
  switch (dt) {
    case WEFT_F64: {
      double v = nextafter(hi, -INFINITY);
      memcpy(out, &v, 8);
      return;
    }
    case WEFT_F32: {
      float f = (float)hi;
      while ((double)f >= hi) f = nextafterf(f, -INFINITY);
      memcpy(out, &f, 4);
      return;
    }
    default: { /* bf16, f16 */
      char tmp[8] = {0};
      weft_store_f_(tmp, dt, hi);
      uint16_t h;
      memcpy(&h, tmp, 2);
      for (;;) {
        memcpy(tmp, &h, 2);
        if (weft_load_f_(tmp, dt) < hi) break;
        h = step_down16(h);
      }
      memcpy(out, &h, 2);
      return;
    }
  }
}

/* Global geometry of t under region: strides of the global row-major
 * index per dim and the global index of t's first element. */
static weft_status region_geometry(const char *func, const weft_tensor *t,
                                   const weft_rng_region *region, int64_t *gstride, int64_t *g0) {
  char desc[256];
  weft_tensor_describe(t, desc, sizeof desc);
  const int nd = t->ndim;
  int64_t gshape[WEFT_MAX_DIMS], goff[WEFT_MAX_DIMS];
  if (region) {
    if (region->ndim != nd)
      return weft_error_at(WEFT_ERR_INVALID, func, "region has ndim %d, tensor %s has %d",
                           region->ndim, desc, nd);
    for (int k = 0; k < nd; k++) {
      gshape[k] = region->global_shape[k];
      goff[k] = region->offset[k];
      if (gshape[k] < 0 || goff[k] < 0 || goff[k] > gshape[k] || t->shape[k] > gshape[k] - goff[k])
        return weft_error_at(WEFT_ERR_INVALID, func,
                             "region dim %d: offset %" PRId64 " + local size %" PRId64
                             " does not fit the global size %" PRId64 " (tensor %s)",
                             k, goff[k], t->shape[k], gshape[k], desc);
    }
  } else {
    for (int k = 0; k < nd; k++) {
      gshape[k] = t->shape[k];
      goff[k] = 0;
    }
  }
  int64_t gn = 1;
  for (int k = nd - 1; k >= 0; k--) {
    gstride[k] = gn;
    if (__builtin_mul_overflow(gn, gshape[k] > 0 ? gshape[k] : 1, &gn))
      return weft_error_at(WEFT_ERR_INVALID, func, "region global shape is too large");
  }
  *g0 = 0;
  for (int k = 0; k < nd; k++) *g0 += goff[k] * gstride[k];
  return WEFT_OK;
}

bool weft_rng_uniform_below_(weft_dtype dt, float lo, float hi, unsigned char out[8]) {
  memset(out, 0, 8);
  value_below(dt, hi, out);
  /* if no value of the dtype lies in [lo, hi), keep the rounded value */
  return weft_load_f_((const char *)out, dt) >= (double)lo;
}

weft_status weft_cpu_fill_random_(weft_tensor *t, weft_random_kind kind, uint64_t seed,
                                  uint64_t key, const weft_rng_region *region, float a, float b) {
  int64_t gstride[WEFT_MAX_DIMS], g0;
  WEFT_CHECK(region_geometry(__func__, t, region, gstride, &g0));
  dist d = {kind == WEFT_RANDOM_NORMAL ? DIST_NORMAL : DIST_UNIFORM, seed, key, a, b, {0}, false};
  if (kind == WEFT_RANDOM_UNIFORM)
    d.have_below = weft_rng_uniform_below_(t->dtype, a, b, d.below_hi);
  if (weft_tensor_numel(t) == 0) return WEFT_OK;

  const int nd = t->ndim;
  const weft_dtype dt = t->dtype;
  const int64_t es = (int64_t)weft_dtype_size(dt);
  pair_cache pc = {0, false, {0, 0}};
  if (nd == 0) {
    store_sample((char *)t->data, dt, &d, sample(&d, 0, &pc));
    return WEFT_OK;
  }
  const int64_t n = t->shape[nd - 1], st = t->strides[nd - 1];
  int64_t idx[WEFT_MAX_DIMS] = {0};
  char *row = (char *)t->data;
  int64_t g = g0; /* global index of the row's first element */
  for (;;) {
    for (int64_t j = 0; j < n; j++)
      store_sample(row + j * st * es, dt, &d, sample(&d, (uint64_t)(g + j), &pc));
    int k = nd - 2;
    for (; k >= 0; k--) {
      idx[k]++;
      row += t->strides[k] * es;
      g += gstride[k];
      if (idx[k] < t->shape[k]) break;
      row -= t->strides[k] * t->shape[k] * es;
      g -= gstride[k] * t->shape[k];
      idx[k] = 0;
    }
    if (k < 0) break;
  }
  return WEFT_OK;
}

/* Checks for every device, then the fill member of t's device. */
static weft_status fill_random(const char *func, weft_tensor *t, const weft_rng_region *region,
                               weft_random_kind kind, uint64_t seed, uint64_t key, float a,
                               float b) {
  if (!t) return weft_error_at(WEFT_ERR_INVALID, func, "tensor is NULL");
  char desc[256];
  weft_tensor_describe(t, desc, sizeof desc);
  if (t->ndim < 0 || t->ndim > WEFT_MAX_DIMS)
    return weft_error_at(WEFT_ERR_INVALID, func, "tensor has invalid ndim %d", t->ndim);
  if (!weft_dtype_is_float(t->dtype))
    return weft_error_at(WEFT_ERR_INVALID, func,
                         "%s: random fills need a float dtype (f32, f64, bf16, f16)", desc);
  int64_t gstride[WEFT_MAX_DIMS], g0;
  WEFT_CHECK(region_geometry(func, t, region, gstride, &g0));
  weft_status st;
  const weft_tensor *ts[1] = {t};
  const char *names[1] = {"tensor"};
  const weft_backend *be =
      weft_backend_for_tensors_(func, offsetof(weft_backend, fill_random), 1, ts, names, &st);
  if (!be) return st;
  if (weft_tensor_numel(t) == 0) return WEFT_OK;
  return weft_backend_trace_(be->fill_random(t, kind, seed, key, region, a, b), be, func);
}

weft_status weft_tensor_fill_normal(weft_tensor *t, uint64_t seed, uint64_t key,
                                    const weft_rng_region *region, float mean, float std) {
  if (!isfinite(mean) || !isfinite(std) || std < 0.0f)
    return weft_error(WEFT_ERR_INVALID, "need finite mean and std >= 0, got mean %g, std %g",
                      (double)mean, (double)std);
  WEFT_CHECK(fill_random(__func__, t, region, WEFT_RANDOM_NORMAL, seed, key, mean, std));
  return WEFT_OK;
}

weft_status weft_tensor_fill_uniform(weft_tensor *t, uint64_t seed, uint64_t key,
                                     const weft_rng_region *region, float lo, float hi) {
  if (!isfinite(lo) || !isfinite(hi) || !(lo < hi))
    return weft_error(WEFT_ERR_INVALID, "need finite lo < hi, got lo %g, hi %g", (double)lo,
                      (double)hi);
  WEFT_CHECK(fill_random(__func__, t, region, WEFT_RANDOM_UNIFORM, seed, key, lo, hi));
  return WEFT_OK;
}
