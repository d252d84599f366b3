/* The backend conformance suite: every operation of backend.h (and the
 * tensor operations of kernels.h that dispatch through it) on every
 * registered backend, against double-precision references computed here,
 * never against another backend's kernel.
 *
 * Layout. Each BACKEND_TEST(name) is two Criterion tests, backend_cpu::name
 * and backend_cuda::name; the second skips, saying why, where the build has
 * no WEFT_CUDA table ("no backend in this build") or no device is visible.
 * In a -Dcuda=emulated build backend_cuda runs the device code on the CPU
 * emulator. The registry and dispatch tests (suites registry, dispatch) and
 * finite-difference checks of the backward references (attention;
 * LayerNorm, activations, softmax, dropout: suite reference) run once.
 *
 * Method. Inputs are seeded random (splitmix64; WEFT_TEST_SEED overrides the
 * per-test default, every failure prints the seed) with odd sizes, made on
 * the host and copied to the device with weft_memcpy; tensors are strided
 * views inside larger device buffers laid out here (padded rows, dims
 * stored in reverse = transposed views, odd offsets). Every output is
 * poisoned with 0xFF bytes (NaN) on the device first, so an element the op
 * fails to write fails the comparison, and bytes around a view must still
 * be 0xFF afterwards.
 *
 * Tolerances. ||got - ref|| / ||ref|| <= 1e-5 for fp32 paths, 1e-2 for bf16
 * (1e-3 f16, 1e-12 f64), and no element off by more than 50x that times
 * rms(ref). Bitwise where the contract fixes the bits: copies and casts
 * (round to nearest even; f64 -> bf16/f16 via f32), fills, the elementwise
 * ops (computed in the dtype's precision, bf16/f16 in f32, rounded once;
 * note: a device must not contract y + alpha*x into an FMA), flat
 * pack/split/accumulate, scale_multi, residual, embedding lookups. A NaN
 * the reference expects may have any payload; on a device, copies and the
 * elementwise ops are also compared byte for byte (NaN payloads too) with
 * the CPU backend's results on the same inputs.
 * Philox fills follow kernels.h's recipe bit for bit on the CPU and the
 * emulator; on a real GPU the normal fill (log, sqrt, sin, cos of the
 * device's libm) may differ by 1e-6 relative.
 *
 * Errors. The same bad arguments must give the same status and the same
 * first line of weft_last_error() on every backend (device names in tensor
 * descriptions aside); the dispatcher's second line names the device. */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "harness.h"
#include "kernels.h"
#include "kernels_testutil.h"

/* ================================================================ set-up */

static weft_device g_dev = WEFT_CPU; /* the backend under test */
static unsigned long g_seed;
static uint64_t g_rng;

/* OK (harness.h) with the backend under test and the seed in the message */
#undef OK
#define OK(expr) WEFT_TEST_OK_MSG(expr, " (on %s, seed %lu)", weft_backend_name(g_dev), g_seed)

static const char *dev_label(weft_device dev) { return dev == WEFT_CPU ? "WEFT_CPU" : "WEFT_CUDA"; }

/* Makes dev the backend under test, or skips with the reason. */
static void need(weft_device dev) {
  g_dev = dev;
  if (!weft_backend_get(dev)) cr_skip_test("%s: no backend in this build", dev_label(dev));
  const int n = weft_device_count(dev);
  if (n <= 0)
    cr_skip_test("%s: no device visible (backend '%s' reports %d devices)", dev_label(dev),
                 weft_backend_name(dev), n);
  OK(weft_device_init(dev, 0, NULL));
}

TestSuite(backend_cpu, .timeout = 120);
TestSuite(backend_cuda, .timeout = 300);

/* One body, one test per backend. */
#define BACKEND_TEST(name)           \
  static void name(weft_device dev); \
  Test(backend_cpu, name) {          \
    need(WEFT_CPU);                  \
    name(WEFT_CPU);                  \
  }                                  \
  Test(backend_cuda, name) {         \
    need(WEFT_CUDA);                 \
    name(WEFT_CUDA);                 \
  }                                  \
  static void name(weft_device dev)

/* Exactness of the Philox normal fill: the CPU and the emulator share the
 * host's libm; a real GPU's may differ in the last bits. */
static bool exact_transcendentals(weft_device dev) {
  return dev == WEFT_CPU || strstr(weft_backend_name(dev), "emulated") != NULL;
}

/* ================================================================ random */

/* One seeded stream (harness.h) for the whole test. */
static void seed_tests(unsigned long fallback) {
  g_seed = weft_test_seed(fallback);
  g_rng = weft_test_rng_state(g_seed);
}
static uint64_t rnd_u64(void) { return weft_test_rng_u64(&g_rng); }
static double rnd_unif(void) { return weft_test_rng_unit(&g_rng); }
static double rnd_range(double lo, double hi) { return lo + (hi - lo) * rnd_unif(); }
static int64_t rnd_int(int64_t lo, int64_t hi) { return weft_test_rng_int(&g_rng, lo, hi); }
static double rnd_normal(void) {
  double u = rnd_unif(), v = rnd_unif();
  if (u < 1e-300) u = 1e-300;
  return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

/* ========================================================== host buffers */

static void *xmalloc(size_t bytes) {
  void *p = malloc(bytes > 0 ? bytes : 8);
  cr_assert_not_null(p, "out of host memory");
  return p;
}
static float *h_normal(int64_t n, double sd) {
  float *x = xmalloc((size_t)n * sizeof(float));
  for (int64_t i = 0; i < n; i++) x[i] = (float)(sd * rnd_normal());
  return x;
}
static float *h_unif(int64_t n, double lo, double hi) {
  float *x = xmalloc((size_t)n * sizeof(float));
  for (int64_t i = 0; i < n; i++) x[i] = (float)rnd_range(lo, hi);
  return x;
}
static float *h_copy(const float *x, int64_t n) {
  float *y = xmalloc((size_t)n * sizeof(float));
  if (n > 0) memcpy(y, x, (size_t)n * sizeof(float));
  return y;
}
static int32_t *h_ids(int64_t n, int64_t lo, int64_t hi) { /* [lo, hi) */
  int32_t *t = xmalloc((size_t)n * sizeof(int32_t));
  for (int64_t i = 0; i < n; i++) t[i] = (int32_t)rnd_int(lo, hi - 1);
  return t;
}
static double *h_dbl(int64_t n) { return xmalloc((size_t)n * sizeof(double)); }

/* ======================================================== device buffers */

static void *dalloc(weft_device dev, size_t bytes) {
  void *p = NULL;
  OK(weft_alloc(dev, bytes, &p));
  cr_assert_not_null(p, "weft_alloc(%s, %zu) gave NULL", weft_device_name(dev), bytes);
  return p;
}
/* Every byte of [d, d + bytes) = 0xFF: NaN in every float dtype. */
static void dpoison(weft_device dev, void *d, size_t bytes) {
  if (bytes > 0) OK(weft_memset(dev, d, 0xFF, bytes));
}
static void *dnan(weft_device dev, size_t bytes) {
  void *d = dalloc(dev, bytes);
  dpoison(dev, d, bytes);
  return d;
}
static void *dup_h(weft_device dev, const void *h, size_t bytes) {
  void *d = dalloc(dev, bytes);
  if (bytes > 0) OK(weft_memcpy(dev, d, h, bytes, WEFT_COPY_H2D));
  return d;
}
static float *dupf(weft_device dev, const float *h, int64_t n) {
  return dup_h(dev, h, (size_t)n * sizeof(float));
}
static int32_t *dupi(weft_device dev, const int32_t *h, int64_t n) {
  return dup_h(dev, h, (size_t)n * sizeof(int32_t));
}
static void upf(weft_device dev, float *d, const float *h, int64_t n) {
  if (n > 0) OK(weft_memcpy(dev, d, h, (size_t)n * sizeof(float), WEFT_COPY_H2D));
}
/* A host copy of device bytes (waits for the device first). */
static void *down(weft_device dev, const void *d, size_t bytes) {
  void *h = xmalloc(bytes);
  OK(weft_device_synchronize(dev));
  if (bytes > 0) OK(weft_memcpy(dev, h, d, bytes, WEFT_COPY_D2H));
  return h;
}
static float *downf(weft_device dev, const float *d, int64_t n) {
  return down(dev, d, (size_t)n * sizeof(float));
}

/* ============================================================ comparison */

/* ||got - ref|| / ||ref|| (the absolute norm when ref is 0) <= tol, and no
 * single element off by more than 50 tol rms(ref) (one wrong element of a
 * long output hides in the norm); a NaN or inf where the reference is
 * finite fails outright. */
static void expect_close_dd(const char *what, const double *got, const double *ref, int64_t n,
                            double tol, const char *file, int line) {
  double num = 0.0, den = 0.0, worst = -1.0;
  int64_t wi = 0;
  for (int64_t i = 0; i < n; i++) {
    if (!isfinite(got[i]) && isfinite(ref[i]))
      cr_assert_fail("%s on %s (%s:%d): element %lld is %g, want %.9g (n %lld, seed %lu)", what,
                     weft_backend_name(g_dev), file, line, (long long)i, got[i], ref[i],
                     (long long)n, g_seed);
    const double d = got[i] - ref[i];
    num += d * d;
    den += ref[i] * ref[i];
    if (fabs(d) > worst) worst = fabs(d), wi = i;
  }
  const double err = den > 0.0 ? sqrt(num / den) : sqrt(num);
  cr_assert(err <= tol,
            "%s on %s (%s:%d): normalised error %.3g > %.1g; worst element %lld: got %.9g, want "
            "%.9g (n %lld, seed %lu)",
            what, weft_backend_name(g_dev), file, line, err, tol, (long long)wi,
            n > 0 ? got[wi] : 0.0, n > 0 ? ref[wi] : 0.0, (long long)n, g_seed);
  const double rms = n > 0 ? sqrt(den / (double)n) : 0.0;
  cr_assert(rms == 0.0 || worst <= 50.0 * tol * rms,
            "%s on %s (%s:%d): element %lld is %.9g, want %.9g: off by %.3g > 50 tol rms(ref) = "
            "%.3g (n %lld, seed %lu)",
            what, weft_backend_name(g_dev), file, line, (long long)wi, got[wi], ref[wi], worst,
            50.0 * tol * rms, (long long)n, g_seed);
}
static void expect_close_at(const char *what, const float *got, const double *ref, int64_t n,
                            double tol, const char *file, int line) {
  double *g = xmalloc((size_t)n * sizeof(double));
  for (int64_t i = 0; i < n; i++) g[i] = got[i];
  expect_close_dd(what, g, ref, n, tol, file, line);
  free(g);
}
#define expect_close(what, got, ref, n, tol) \
  expect_close_at(what, got, ref, n, tol, __FILE__, __LINE__)

/* Relative error of one double. */
static void expect_rel(const char *what, double got, double want, double tol) {
  const double err = fabs(got - want) / (fabs(want) > 0.0 ? fabs(want) : 1.0);
  cr_assert(err <= tol, "%s on %s: got %.17g, want %.17g (relative error %.3g > %.1g, seed %lu)",
            what, weft_backend_name(g_dev), got, want, err, tol, g_seed);
}

/* Fails naming element i of n (es bytes each) and both bit patterns. */
static void fail_bits_differ(const char *what, int64_t i, int64_t n, const void *got,
                             const void *want, size_t es) {
  uint64_t gb = 0, wb = 0;
  memcpy(&gb, got, es);
  memcpy(&wb, want, es);
  cr_assert_fail("%s on %s: element %lld of %lld is 0x%0*llx, want 0x%0*llx (seed %lu)", what,
                 weft_backend_name(g_dev), (long long)i, (long long)n, (int)(2 * es),
                 (unsigned long long)gb, (int)(2 * es), (unsigned long long)wb, g_seed);
}

/* The same bytes; reports the first differing element of size es. */
static void expect_same_bytes(const char *what, const void *got, const void *want, int64_t n,
                              size_t es) {
  const unsigned char *g = got, *w = want;
  for (int64_t i = 0; i < n; i++)
    if (memcmp(g + (size_t)i * es, w + (size_t)i * es, es) != 0)
      fail_bits_differ(what, i, n, g + (size_t)i * es, w + (size_t)i * es, es);
}

/* The same values bit for bit, except that any NaN equals any NaN: IEEE
 * 754 leaves a new NaN's sign and payload to the machine (x86 makes
 * 0xffc00000 of inf - inf, a GPU 0x7fffffff), and torch makes no promise. */
static double dec(const void *p, weft_dtype dt);
static void expect_same_floats(const char *what, const void *got, const void *want, int64_t n,
                               weft_dtype dt) {
  const size_t es = weft_dtype_size(dt);
  const unsigned char *g = got, *w = want;
  for (int64_t i = 0; i < n; i++) {
    const void *gi = g + (size_t)i * es, *wi = w + (size_t)i * es;
    if (memcmp(gi, wi, es) != 0 && !(isnan(dec(gi, dt)) && isnan(dec(wi, dt))))
      fail_bits_differ(what, i, n, gi, wi, es);
  }
}

/* ========================================== reference number formats
 * Written from IEEE 754, independent of weft's conversion code. */

/* x rounded to nearest, ties to even, into a binary format with p bits of
 * precision, minimum normal exponent emin and maximum exponent emax
 * (subnormals included; a result past the largest finite value is inf). */
static double rne(double x, int p, int emin, int emax) {
  if (x != x || isinf(x) || x == 0.0) return x;
  const double a = fabs(x);
  int e;
  frexp(a, &e); /* a = f 2^e, f in [0.5, 1): the leading bit is 2^(e-1) */
  const int E = e - 1 < emin ? emin : e - 1;
  const double q = ldexp(1.0, E - (p - 1)); /* the spacing at a */
  double r = nearbyint(a / q) * q;          /* default mode: ties to even */
  if (r >= ldexp(1.0, emax + 1)) r = INFINITY;
  return copysign(r, x);
}

/* x rounded once to dt (floats), or truncated and saturated (i32, NaN -> 0). */
static double round_once(weft_dtype dt, double x) {
  switch (dt) {
    case WEFT_F64:
      return x;
    case WEFT_F32:
      return rne(x, 24, -126, 127);
    case WEFT_BF16:
      return rne(x, 8, -126, 127);
    case WEFT_F16:
      return rne(x, 11, -14, 15);
    case WEFT_I32:
      if (x != x) return 0.0;
      if (x <= -2147483648.0) return -2147483648.0;
      if (x >= 2147483647.0) return 2147483647.0;
      return trunc(x) + 0.0; /* an integer has no -0 */
    default:
      cr_assert_fail("round_once: dtype %d", (int)dt);
  }
  return 0.0;
}
/* A double converted to dt as weft_tensor_copy does: bf16 / f16 via f32. */
static double conv(weft_dtype dt, double x) {
  if (dt == WEFT_BF16 || dt == WEFT_F16) return round_once(dt, round_once(WEFT_F32, x));
  return round_once(dt, x);
}

static size_t esz(weft_dtype dt) { return weft_dtype_size(dt); }

static uint16_t f16_bits(double v) {
  const uint16_t s = signbit(v) ? 0x8000u : 0u;
  if (v != v) return 0x7e00u;
  const double a = fabs(v);
  if (isinf(a)) return s | 0x7c00u;
  if (a < 0x1p-14) return s | (uint16_t)(a * 0x1p24);
  int e;
  const double f = frexp(a, &e); /* a = 2f 2^(e-1), 2f in [1, 2) */
  return s | (uint16_t)((e - 1 + 15) << 10) | (uint16_t)((2.0 * f - 1.0) * 1024.0);
}
static double f16_value(uint16_t h) {
  const int ex = (h >> 10) & 31, m = h & 1023;
  double v;
  if (ex == 31)
    v = m ? NAN : INFINITY;
  else if (ex == 0)
    v = m * 0x1p-24;
  else
    v = (1.0 + m / 1024.0) * ldexp(1.0, ex - 15);
  return (h & 0x8000u) ? -v : v;
}

/* Stores v (representable in dt) at p. */
static void enc(void *p, weft_dtype dt, double v) {
  switch (dt) {
    case WEFT_F32: {
      float f = (float)v;
      memcpy(p, &f, 4);
      return;
    }
    case WEFT_F64:
      memcpy(p, &v, 8);
      return;
    case WEFT_BF16: {
      float f = (float)v;
      uint32_t u;
      memcpy(&u, &f, 4);
      uint16_t h = v != v ? (uint16_t)0x7fc0u : (uint16_t)(u >> 16);
      memcpy(p, &h, 2);
      return;
    }
    case WEFT_F16: {
      uint16_t h = f16_bits(v);
      memcpy(p, &h, 2);
      return;
    }
    case WEFT_I32: {
      int32_t i = (int32_t)v;
      memcpy(p, &i, 4);
      return;
    }
    default:
      cr_assert_fail("enc: dtype %d", (int)dt);
  }
}
static double dec(const void *p, weft_dtype dt) {
  switch (dt) {
    case WEFT_F32: {
      float f;
      memcpy(&f, p, 4);
      return f;
    }
    case WEFT_F64: {
      double d;
      memcpy(&d, p, 8);
      return d;
    }
    case WEFT_BF16: {
      uint16_t h;
      memcpy(&h, p, 2);
      uint32_t u = (uint32_t)h << 16;
      float f;
      memcpy(&f, &u, 4);
      return f;
    }
    case WEFT_F16: {
      uint16_t h;
      memcpy(&h, p, 2);
      return f16_value(h);
    }
    case WEFT_I32: {
      int32_t i;
      memcpy(&i, p, 4);
      return i;
    }
    default:
      cr_assert_fail("dec: dtype %d", (int)dt);
  }
  return 0.0;
}

/* got (n contiguous elements of dt) holds exactly the values want (already
 * rounded to dt): bitwise, except that a NaN may have any payload. */
static void expect_values(const char *what, const void *got, weft_dtype dt, const double *want,
                          int64_t n) {
  const size_t es = esz(dt);
  for (int64_t i = 0; i < n; i++) {
    const char *g = (const char *)got + (size_t)i * es;
    const double gv = dec(g, dt);
    if (want[i] != want[i]) {
      cr_assert(gv != gv, "%s on %s (%s): element %lld is %.9g, want NaN (seed %lu)", what,
                weft_backend_name(g_dev), weft_dtype_name(dt), (long long)i, gv, g_seed);
      continue;
    }
    char w[8];
    enc(w, dt, want[i]);
    if (memcmp(g, w, es) != 0) {
      uint64_t gb = 0, wb = 0;
      memcpy(&gb, g, es);
      memcpy(&wb, w, es);
      cr_assert_fail("%s on %s (%s): element %lld is %.9g (0x%llx), want %.9g (0x%llx) (seed %lu)",
                     what, weft_backend_name(g_dev), weft_dtype_name(dt), (long long)i, gv,
                     (unsigned long long)gb, want[i], (unsigned long long)wb, g_seed);
    }
  }
}

/* ============================================= strided device views
 * A tensor view of `shape` inside a larger buffer on dev, laid out here:
 * layout 0 contiguous; 1 row-major with every dim padded by 1-2 elements
 * and an offset of 1-3; 2 the dims stored in reverse order (a transposed
 * view; column-major for 2-D), padded, offset. The bytes outside the view
 * are 0xFF and must stay so. */

typedef struct sview {
  weft_device dev;
  weft_dtype dt;
  int ndim;
  int64_t shape[WEFT_MAX_DIMS], strides[WEFT_MAX_DIMS];
  int64_t off, nbase, numel; /* elements */
  char *base;                /* dev memory, nbase elements */
  int64_t *pos;              /* element i (row-major) at base + pos[i] */
  weft_tensor t;
} sview;

static void sv_init(sview *s, weft_device dev, weft_dtype dt, int ndim, const int64_t *shape,
                    int layout) {
  memset(s, 0, sizeof *s);
  s->dev = dev, s->dt = dt, s->ndim = ndim;
  int perm[WEFT_MAX_DIMS];
  int64_t ext[WEFT_MAX_DIMS], sst[WEFT_MAX_DIMS];
  for (int j = 0; j < ndim; j++) {
    perm[j] = layout == 2 ? ndim - 1 - j : j;
    s->shape[j] = shape[j];
  }
  for (int j = 0; j < ndim; j++) ext[j] = shape[perm[j]] + (layout ? rnd_int(1, 2) : 0);
  int64_t st = 1;
  for (int j = ndim - 1; j >= 0; j--) {
    sst[j] = st;
    st *= ext[j] > 0 ? ext[j] : 1;
  }
  for (int j = 0; j < ndim; j++) s->strides[perm[j]] = sst[j];
  s->off = layout ? rnd_int(1, 3) : 0;
  s->nbase = s->off + st;
  s->numel = 1;
  for (int d = 0; d < ndim; d++) s->numel *= shape[d];
  s->base = dnan(dev, (size_t)s->nbase * esz(dt));
  s->pos = xmalloc((size_t)(s->numel > 0 ? s->numel : 1) * sizeof(int64_t));
  int64_t idx[WEFT_MAX_DIMS] = {0};
  for (int64_t i = 0; i < s->numel; i++) {
    int64_t p = s->off;
    for (int d = 0; d < ndim; d++) p += idx[d] * s->strides[d];
    s->pos[i] = p;
    for (int d = ndim - 1; d >= 0; d--) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
  OK(weft_tensor_view_init(&s->t, s->base + (size_t)s->off * esz(dt), dt, dev, ndim, shape,
                           s->strides));
}
static void sv_free(sview *s) {
  weft_free(s->base);
  free(s->pos);
  s->base = NULL;
  s->pos = NULL;
}
/* Writes vals (row-major, representable in dt) into the view; the rest of
 * the buffer becomes 0xFF. */
static void sv_upload(sview *s, const double *vals) {
  const size_t es = esz(s->dt);
  char *hb = xmalloc((size_t)s->nbase * es);
  memset(hb, 0xFF, (size_t)s->nbase * es);
  for (int64_t i = 0; i < s->numel; i++) enc(hb + (size_t)s->pos[i] * es, s->dt, vals[i]);
  OK(weft_memcpy(s->dev, s->base, hb, (size_t)s->nbase * es, WEFT_COPY_H2D));
  free(hb);
}
static void sv_poison(sview *s) { dpoison(s->dev, s->base, (size_t)s->nbase * esz(s->dt)); }
/* The view's elements, contiguous (bytes of dt); checks that every byte
 * outside the view is still 0xFF. */
static void *sv_fetch(const sview *s, const char *what) {
  const size_t es = esz(s->dt);
  char *hb = down(s->dev, s->base, (size_t)s->nbase * es);
  char *out = xmalloc((size_t)s->numel * es);
  bool *in = xmalloc((size_t)s->nbase * sizeof(bool));
  memset(in, 0, (size_t)s->nbase * sizeof(bool));
  for (int64_t i = 0; i < s->numel; i++) {
    memcpy(out + (size_t)i * es, hb + (size_t)s->pos[i] * es, es);
    in[s->pos[i]] = true;
  }
  for (int64_t p = 0; p < s->nbase; p++) {
    if (in[p]) continue;
    for (size_t b = 0; b < es; b++)
      cr_assert_eq((unsigned char)hb[(size_t)p * es + b], 0xFF,
                   "%s on %s: byte %zu of element %lld outside the view was written (0x%02x; "
                   "seed %lu)",
                   what, weft_backend_name(g_dev), b, (long long)p,
                   (unsigned char)hb[(size_t)p * es + b], g_seed);
  }
  free(hb);
  free(in);
  return out;
}
/* Values (doubles) of contiguous dt bytes. */
static double *vals_of(const void *bytes, weft_dtype dt, int64_t n) {
  double *v = h_dbl(n);
  for (int64_t i = 0; i < n; i++) v[i] = dec((const char *)bytes + (size_t)i * esz(dt), dt);
  return v;
}

/* A device (or CPU) tensor call refused for a dtype: allowed on a device
 * other than the CPU when the error is WEFT_ERR_UNSUPPORTED and names the
 * op, the device and the dtype (kernels.h); then logged and false. */
static bool done_or_refused2(weft_status st, weft_device dev, const char *op, weft_dtype dt,
                             weft_dtype dt2, const char *expr) {
  if (st == WEFT_OK) return true;
  const char *msg = weft_last_error();
  cr_assert(dev != WEFT_CPU && st == WEFT_ERR_UNSUPPORTED, "%s on %s failed (%s): %s (seed %lu)",
            expr, weft_backend_name(dev), weft_status_str(st), msg, g_seed);
  cr_assert(strstr(msg, op) && strstr(msg, weft_device_name(dev)) &&
                (strstr(msg, weft_dtype_name(dt)) || strstr(msg, weft_dtype_name(dt2))),
            "%s: an unsupported dtype must be named with the op '%s', the device '%s' and the "
            "tensor (%s): '%s'",
            expr, op, weft_device_name(dev), weft_dtype_name(dt), msg);
  cr_log_info("%s: %s refuses %s: %s", weft_backend_name(dev), op, weft_dtype_name(dt), msg);
  return false;
}
static bool done_or_refused(weft_status st, weft_device dev, const char *op, weft_dtype dt,
                            const char *expr) {
  return done_or_refused2(st, dev, op, dt, dt, expr);
}
#define DONE(dev, op, dt, expr) done_or_refused((expr), (dev), (op), (dt), #expr)

static const weft_dtype float_dtypes[4] = {WEFT_F32, WEFT_F64, WEFT_BF16, WEFT_F16};

/* Random values of dt in [lo, hi). */
static double *rand_vals(weft_dtype dt, int64_t n, double lo, double hi) {
  double *v = h_dbl(n);
  for (int64_t i = 0; i < n; i++) v[i] = conv(dt, rnd_range(lo, hi));
  return v;
}

/* =========================================================== device set-up */

BACKEND_TEST(device_init_count_alloc_and_options_behave_as_documented) {
  const weft_backend *be = weft_backend_get(dev);
  cr_assert_eq(be->device, dev, "table for %s says device %d", weft_device_name(dev), be->device);
  cr_assert_eq(be->version, WEFT_BACKEND_VERSION);
  cr_assert_str_eq(weft_backend_name(dev), be->name);
  int ord = -7, ord2 = -7;
  OK(weft_device_init(dev, 0, &ord));
  OK(weft_device_init(dev, 0, &ord2)); /* idempotent */
  cr_assert(ord >= 0 && ord == ord2, "ordinal %d then %d", ord, ord2);
  cr_assert_eq(weft_device_current(dev), ord, "current device %d, init chose %d",
               weft_device_current(dev), ord);
  OK(weft_device_synchronize(dev));

  /* allocation: counted exactly, 0 bytes is a unique pointer, the pointer
   * belongs to the device */
  const weft_mem_stats m0 = weft_mem_get(dev);
  void *p = dalloc(dev, 1000), *z1 = dalloc(dev, 0), *z2 = dalloc(dev, 0);
  cr_assert(z1 != z2, "two 0-byte allocations share the pointer %p", z1);
  const weft_mem_stats m1 = weft_mem_get(dev);
  cr_assert_eq(m1.current_bytes - m0.current_bytes, 1000, "counted %lld bytes for 1000",
               (long long)(m1.current_bytes - m0.current_bytes));
  cr_assert_eq(m1.alloc_count - m0.alloc_count, 3);
  if (dev == WEFT_CPU || be->contains)
    cr_assert_eq(weft_ptr_device(p), dev, "weft_ptr_device of a %s block is %s",
                 weft_device_name(dev), weft_device_name(weft_ptr_device(p)));
  else
    cr_log_info("%s: no 'contains' member: weft_ptr_device cannot route its pointers", be->name);
  cr_assert_eq(weft_ptr_device(NULL), WEFT_CPU);
  weft_free(p), weft_free(z1), weft_free(z2);
  const weft_mem_stats m2 = weft_mem_get(dev);
  cr_assert_eq(m2.current_bytes, m0.current_bytes, "after free %lld bytes, before %lld",
               (long long)m2.current_bytes, (long long)m0.current_bytes);

  /* options: supported, or WEFT_ERR_UNSUPPORTED naming the op and device */
  cr_assert_eq(weft_device_matmul_precision(dev), WEFT_MATMUL_F32, "default precision %d",
               (int)weft_device_matmul_precision(dev));
  weft_clear_error();
  weft_status st = weft_device_set_matmul_precision(dev, WEFT_MATMUL_TF32);
  if (be->set_matmul_precision) {
    cr_assert_eq(st, WEFT_OK, "%s", weft_last_error());
    if (be->matmul_precision) cr_assert_eq(weft_device_matmul_precision(dev), WEFT_MATMUL_TF32);
    OK(weft_device_set_matmul_precision(dev, WEFT_MATMUL_F32));
  } else {
    cr_assert_eq(st, WEFT_ERR_UNSUPPORTED, "status %d: %s", (int)st, weft_last_error());
    cr_assert(strstr(weft_last_error(), "set_matmul_precision is not supported on") &&
                  strstr(weft_last_error(), weft_device_name(dev)),
              "message: %s", weft_last_error());
  }
  cr_assert_eq(weft_device_set_matmul_precision(dev, (weft_matmul_precision)9), WEFT_ERR_INVALID);
  weft_cache_stats cs;
  st = weft_device_cache_stats(dev, &cs);
  cr_assert(be->cache_stats ? st == WEFT_OK : st == WEFT_ERR_UNSUPPORTED, "cache_stats: %d %s",
            (int)st, weft_last_error());
  st = weft_device_empty_cache(dev);
  cr_assert(be->empty_cache ? st == WEFT_OK : st == WEFT_ERR_UNSUPPORTED, "empty_cache: %d %s",
            (int)st, weft_last_error());
  if (dev == WEFT_CPU)
    cr_assert_null(weft_device_stream_handle(dev, WEFT_STREAM_COMPUTE), "the CPU has no streams");
  else if (be->stream_handle)
    cr_assert_not_null(weft_device_stream_handle(dev, WEFT_STREAM_COMPUTE),
                       "no compute stream handle after init");

  /* shut down and start again: the device works as before */
  weft_device_shutdown(dev);
  OK(weft_device_init(dev, 0, &ord2));
  cr_assert_eq(ord2, ord, "ordinal %d after re-init, %d before", ord2, ord);
  const char msg[] = "after shutdown and init";
  char *d = dalloc(dev, sizeof msg), back[sizeof msg];
  OK(weft_memcpy(dev, d, msg, sizeof msg, WEFT_COPY_H2D));
  OK(weft_device_synchronize(dev));
  OK(weft_memcpy(dev, back, d, sizeof msg, WEFT_COPY_D2H));
  cr_assert_str_eq(back, msg);
  weft_free(d);
}

/* kernels.h: a dtype an op cannot do is WEFT_ERR_UNSUPPORTED naming the
 * op, the device and the tensor (gemm has no integer form anywhere). */
BACKEND_TEST(an_unsupported_dtype_is_refused_naming_op_device_and_tensor) {
  const int64_t shape[2] = {3, 4}, shape_t[2] = {4, 3}, shape_c[2] = {3, 3};
  int32_t *d = dnan(dev, 64 * sizeof(int32_t));
  weft_tensor a, b, c;
  OK(weft_tensor_view_init(&a, d, WEFT_I32, dev, 2, shape, NULL));
  OK(weft_tensor_view_init(&b, d + 16, WEFT_I32, dev, 2, shape_t, NULL));
  OK(weft_tensor_view_init(&c, d + 32, WEFT_I32, dev, 2, shape_c, NULL));
  weft_clear_error();
  const weft_status st = weft_gemm(false, false, 1.0f, &a, &b, 0.0f, &c);
  const char *msg = weft_last_error();
  cr_assert_eq(st, WEFT_ERR_UNSUPPORTED, "weft_gemm on i32: %s (%d): %s", weft_status_str(st),
               (int)st, msg);
  cr_assert(strstr(msg, "gemm") && strstr(msg, weft_device_name(dev)) && strstr(msg, "i32[3, 4]"),
            "the message must name the op (gemm), the device (%s) and the tensor (i32[3, 4]): '%s'",
            weft_device_name(dev), msg);
  weft_free(d);
}

/* =============================================================== memory */

BACKEND_TEST(memset_writes_exactly_the_byte_range) {
  seed_tests(101);
  const size_t n = 1031;
  unsigned char *want = xmalloc(n);
  memset(want, 0xFF, n);
  unsigned char *d = dnan(dev, n);
  const struct {
    size_t off, len;
    int value;
  } cases[] = {{0, 1, 0},      {1, 13, 0x5A},    {3, 257, 0x1A5 /* (unsigned char) 0xA5 */},
               {300, 0, 0x11}, {517, 514, 0x00}, {1030, 1, 0x7F}};
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    OK(weft_memset(dev, d + cases[c].off, cases[c].value, cases[c].len));
    memset(want + cases[c].off, (unsigned char)cases[c].value, cases[c].len);
  }
  OK(weft_memset(dev, NULL, 0, 0)); /* nothing to write: NULL is fine */
  unsigned char *got = down(dev, d, n);
  expect_same_bytes("memset", got, want, (int64_t)n, 1);
  free(want), free(got);
  weft_free(d);
}

BACKEND_TEST(memcpy_moves_bytes_in_every_direction) {
  seed_tests(102);
  const size_t n = 777;
  unsigned char *src = xmalloc(n), *want = xmalloc(n);
  for (size_t i = 0; i < n; i++) src[i] = (unsigned char)rnd_u64();
  unsigned char *a = dnan(dev, n), *b = dnan(dev, n);
  /* host -> device at odd offsets, device -> device between and within
   * buffers, device -> host at an odd offset */
  OK(weft_memcpy(dev, a + 3, src + 5, 501, WEFT_COPY_H2D));
  OK(weft_memcpy(dev, b + 1, a + 3, 501, WEFT_COPY_D2D));
  OK(weft_memcpy(dev, b + 600, b + 1, 101, WEFT_COPY_D2D)); /* same buffer, no overlap */
  OK(weft_memcpy(dev, b, a, 0, WEFT_COPY_D2D));
  OK(weft_memcpy(dev, NULL, NULL, 0, WEFT_COPY_H2D));
  memset(want, 0xFF, n);
  memcpy(want + 1, src + 5, 501);
  memcpy(want + 600, src + 5, 101);
  unsigned char *got = xmalloc(n + 2);
  memset(got, 0x33, n + 2);
  OK(weft_device_synchronize(dev));
  OK(weft_memcpy(dev, got + 1, b, n, WEFT_COPY_D2H));
  expect_same_bytes("memcpy H2D, D2D, D2H", got + 1, want, (int64_t)n, 1);
  cr_assert(got[0] == 0x33 && got[n + 1] == 0x33, "D2H wrote outside its destination");

  /* the optional asynchronous copy, or a clear refusal */
  const weft_backend *be = weft_backend_get(dev);
  weft_clear_error();
  weft_status st = weft_memcpy_async(dev, a, src, 64, WEFT_COPY_H2D, WEFT_STREAM_COMPUTE);
  if (be->memcpy_async) {
    cr_assert_eq(st, WEFT_OK, "memcpy_async: %s", weft_last_error());
    unsigned char *g2 = down(dev, a, 64);
    expect_same_bytes("memcpy_async H2D", g2, src, 64, 1);
    free(g2);
  } else {
    cr_assert_eq(st, WEFT_ERR_UNSUPPORTED, "memcpy_async status %d: %s", (int)st,
                 weft_last_error());
    cr_assert(strstr(weft_last_error(), "memcpy_async is not supported on cpu") || dev != WEFT_CPU,
              "message: %s", weft_last_error());
  }
  free(src), free(want), free(got);
  weft_free(a), weft_free(b);
}

/* weft_alloc_pinned: page-locked memory where the device has it (an async
 * device-to-host copy into it lands by the time an event recorded after it
 * completes), ordinary host memory on the CPU; freed by weft_free_pinned. */
BACKEND_TEST(pinned_host_memory_takes_an_async_device_to_host_copy) {
  seed_tests(108);
  const weft_backend *be = weft_backend_get(dev);
  const size_t n = 3001;
  unsigned char *src = xmalloc(n), *pin = NULL;
  for (size_t i = 0; i < n; i++) src[i] = (unsigned char)rnd_u64();
  OK(weft_alloc_pinned(dev, n, (void **)&pin));
  cr_assert_not_null(pin);
  cr_assert_eq(weft_ptr_device(pin), WEFT_CPU, "pinned memory is host memory");
  memset(pin, 0x5A, n); /* the host may write it */
  unsigned char *d = dnan(dev, n);
  OK(weft_memcpy(dev, d, src, n, WEFT_COPY_H2D));
  if (be->memcpy_async && be->event_record) {
    weft_event *e = NULL;
    OK(weft_memcpy_async(dev, pin, d, n, WEFT_COPY_D2H, WEFT_STREAM_COMPUTE));
    OK(weft_event_record(dev, WEFT_STREAM_COMPUTE, &e));
    OK(weft_event_synchronize(dev, e));
    weft_event_destroy(dev, e);
  } else {
    OK(weft_memcpy(dev, pin, d, n, WEFT_COPY_D2H));
  }
  expect_same_bytes("D2H into pinned memory", pin, src, (int64_t)n, 1);
  cr_assert_eq(weft_alloc_pinned(dev, 16, NULL), WEFT_ERR_INVALID);
  weft_free_pinned(dev, pin);
  weft_free_pinned(dev, NULL);
  weft_free(d);
  free(src);
}

/* weft_device_model names the device ("cpu", the GPU's model, the
 * emulator) or says the backend cannot. */
BACKEND_TEST(device_model_names_the_device_or_is_unsupported) {
  const weft_backend *be = weft_backend_get(dev);
  char model[128] = "x";
  weft_clear_error();
  weft_status st = weft_device_model(dev, model, sizeof model);
  if (dev == WEFT_CPU || be->device_model) {
    cr_assert_eq(st, WEFT_OK, "device_model: %s", weft_last_error());
    cr_assert(model[0] != '\0', "an empty model name");
    if (dev == WEFT_CPU) cr_assert_str_eq(model, "cpu");
  } else {
    cr_assert_eq(st, WEFT_ERR_UNSUPPORTED, "status %d: %s", (int)st, weft_last_error());
  }
  cr_assert_eq(weft_device_model(dev, NULL, 8), WEFT_ERR_INVALID);
}

BACKEND_TEST(events_order_streams_or_are_unsupported_by_name) {
  seed_tests(103);
  const weft_backend *be = weft_backend_get(dev);
  weft_event *e0 = NULL, *e1 = NULL;
  weft_clear_error();
  weft_status st = weft_event_record(dev, WEFT_STREAM_COMPUTE, &e0);
  if (!be->event_record) {
    cr_assert_eq(st, WEFT_ERR_UNSUPPORTED, "event_record status %d: %s", (int)st,
                 weft_last_error());
    char want[128];
    snprintf(want, sizeof want, "event_record is not supported on %s", weft_device_name(dev));
    cr_assert(strstr(weft_last_error(), want), "message '%s' lacks '%s'", weft_last_error(), want);
    cr_assert_null(e0);
    cr_assert_eq(weft_record_stream(dev, NULL, WEFT_STREAM_COMM) == WEFT_OK,
                 be->record_stream != NULL);
    weft_event_destroy(dev, NULL);
    return;
  }
  cr_assert_eq(st, WEFT_OK, "%s", weft_last_error());
  cr_assert_str_eq(weft_stream_name(WEFT_STREAM_FSDP_RS), "fsdp_reduce_scatter");
  cr_assert_str_eq(weft_stream_name(WEFT_STREAM_COUNT), "?");
  const size_t n = 4099;
  unsigned char *h = xmalloc(n);
  for (size_t i = 0; i < n; i++) h[i] = (unsigned char)rnd_u64();
  unsigned char *d = dnan(dev, n), *d2 = dnan(dev, n);
  OK(weft_memcpy(dev, d, h, n, WEFT_COPY_H2D));
  OK(weft_event_record(dev, WEFT_STREAM_COMPUTE, &e1));
  /* the comm stream waits for the compute stream's copy, then copies on */
  OK(weft_stream_wait_event(dev, WEFT_STREAM_COMM, e1));
  OK(weft_memcpy_async(dev, d2, d, n, WEFT_COPY_D2D, WEFT_STREAM_COMM));
  OK(weft_record_stream(dev, d, WEFT_STREAM_COMM));
  OK(weft_event_synchronize(dev, e1));
  bool done = false;
  OK(weft_event_query(dev, e1, &done));
  cr_assert(done, "event not done after event_synchronize");
  float ms = -1.0f;
  OK(weft_event_elapsed_ms(dev, e0, e1, &ms));
  cr_assert(ms >= 0.0f, "elapsed %g ms", (double)ms);
  unsigned char *got = down(dev, d2, n);
  expect_same_bytes("copy on the comm stream after waiting for the compute stream", got, h,
                    (int64_t)n, 1);
  /* every communication stream exists and is ordered the same way */
  for (int s = WEFT_STREAM_FSDP_AG; s < WEFT_STREAM_COUNT; s++) {
    weft_event *es = NULL, *ed = NULL;
    OK(weft_memset(dev, d2, 0, n));
    OK(weft_event_record(dev, WEFT_STREAM_COMPUTE, &es));
    OK(weft_stream_wait_event(dev, (weft_stream_id)s, es));
    OK(weft_memcpy_async(dev, d2, d, n, WEFT_COPY_D2D, (weft_stream_id)s));
    OK(weft_event_record(dev, (weft_stream_id)s, &ed));
    OK(weft_event_synchronize(dev, ed));
    unsigned char *g2 = down(dev, d2, n);
    expect_same_bytes(weft_stream_name((weft_stream_id)s), g2, h, (int64_t)n, 1);
    free(g2);
    weft_event_destroy(dev, es);
    weft_event_destroy(dev, ed);
  }
  free(h), free(got);
  weft_event_destroy(dev, e0);
  weft_event_destroy(dev, e1);
  weft_free(d), weft_free(d2);
}

/* ======================================================== copies and casts */

/* Source values: random, then the cases rounding is made of (ties to even
 * at bf16's and f16's precision, f16 overflow and subnormals, f32
 * subnormals, values that round twice on the way f64 -> f32 -> bf16),
 * each rounded to the source dtype first. */
static double *cast_sources(weft_dtype sdt, int64_t n) {
  // clang-format off
  const double specials[] = {NAN, -NAN, INFINITY, -INFINITY, 0.0, -0.0,
                             1.0 + 0x1p-8,                 /* bf16 tie -> 1 (even) */
                             1.0 + 3 * 0x1p-8,             /* bf16 tie -> 1 + 2^-6 */
                             -(1.0 + 0x1p-8),
                             1.0 + 0x1p-11,                /* f16 tie -> 1 */
                             1.0 + 3 * 0x1p-11,            /* f16 tie -> 1 + 2^-9 */
                             65519.0, 65520.0, -70000.0,   /* f16: 65504, inf, -inf */
                             3e-6, 0x1p-25, 3 * 0x1p-25,   /* f16 subnormals and ties */
                             1e-40, 0x1p-149, -1e-39,      /* f32 subnormals */
                             3e38, 3.4028234663852886e38, 1e300, -1e-300,
                             1.0 + 0x1p-8 + 0x1p-30,       /* f64->f32->bf16: 1; once: 1+2^-7 */
                             1.0 + 0x1p-11 + 0x1p-40,      /* likewise for f16 */
                             1.0 / 3.0, -2.0 / 3.0, 1e5, 123456.789};
  // clang-format on
  double *v = h_dbl(n);
  for (int64_t i = 0; i < n; i++) v[i] = rnd_normal() * pow(10.0, (double)rnd_int(-3, 3));
  const int64_t ns = (int64_t)(sizeof specials / sizeof specials[0]);
  for (int64_t i = 0; i < ns && 5 * i + 2 < n; i++) v[5 * i + 2] = specials[i];
  if (sdt == WEFT_I32) /* integers: some beyond f32's 2^24 and bf16's 2^8 */
    for (int64_t i = 0; i < n; i += 3) v[i] = (double)rnd_int(-2147483647 - 1, 2147483647);
  for (int64_t i = 0; i < n; i++) v[i] = conv(sdt, v[i]);
  return v;
}

/* dst (dt ddt, layout dl on ddev) = src (sdt, layout sl on sdev) through
 * weft_tensor_copy; returns dst's elements (bytes) after checking them
 * against conv(). */
static void *copy_case(weft_device sdev, int sl, weft_dtype sdt, weft_device ddev, int dl,
                       weft_dtype ddt, int ndim, const int64_t *shape, const double *src,
                       const char *what) {
  sview s, d;
  sv_init(&s, sdev, sdt, ndim, shape, sl);
  sv_init(&d, ddev, ddt, ndim, shape, dl);
  sv_upload(&s, src);
  char label[160];
  snprintf(label, sizeof label, "%s %s(%s) -> %s(%s)", what, weft_dtype_name(sdt),
           weft_device_name(sdev), weft_dtype_name(ddt), weft_device_name(ddev));
  void *got = NULL;
  const weft_device cdev = sdev != WEFT_CPU ? sdev : ddev;
  if (done_or_refused2(weft_tensor_copy(&d.t, &s.t), cdev, "copy", sdt, ddt, label)) {
    got = sv_fetch(&d, label);
    double *want = h_dbl(d.numel);
    for (int64_t i = 0; i < d.numel; i++) want[i] = conv(ddt, src[i]);
    expect_values(label, got, ddt, want, d.numel);
    free(want);
  }
  sv_free(&s);
  sv_free(&d);
  return got;
}

/* The float pairs, and i32 to and from them (float -> int truncates toward
 * zero and saturates, NaN -> 0); a device may refuse a pair, naming it. */
BACKEND_TEST(tensor_copy_converts_every_float_pair_on_strided_views_bit_exactly) {
  seed_tests(111);
  const int64_t shape[2] = {7, 33};
  const weft_dtype dts[5] = {WEFT_F32, WEFT_F64, WEFT_BF16, WEFT_F16, WEFT_I32};
  for (int si = 0; si < 5; si++)
    for (int di = 0; di < 5; di++) {
      const weft_dtype sdt = dts[si], ddt = dts[di];
      double *src = cast_sources(sdt, 7 * 33);
      /* on the device; host -> device; device -> host (the CPU: all host) */
      const uint64_t keep = g_rng;
      void *on = copy_case(dev, 2, sdt, dev, 1, ddt, 2, shape, src, "copy on the device");
      void *up = copy_case(WEFT_CPU, 2, sdt, dev, 1, ddt, 2, shape, src, "copy host -> device");
      void *dn = copy_case(dev, 1, sdt, WEFT_CPU, 2, ddt, 2, shape, src, "copy device -> host");
      if (dev != WEFT_CPU && on) { /* NaN payloads too: the CPU's bytes */
        g_rng = keep;
        void *cpu = copy_case(WEFT_CPU, 2, sdt, WEFT_CPU, 1, ddt, 2, shape, src, "copy on the cpu");
        expect_same_bytes("device copy vs the cpu's bytes", on, cpu, 7 * 33, esz(ddt));
        free(cpu);
      }
      free(on), free(up), free(dn), free(src);
    }
}

BACKEND_TEST(tensor_to_moves_strided_tensors_between_host_and_device) {
  seed_tests(112);
  const int64_t shape[3] = {3, 5, 7};
  for (int k = 0; k < 4; k++) {
    const weft_dtype dt = float_dtypes[k];
    double *v = cast_sources(dt, 105);
    sview h;
    sv_init(&h, WEFT_CPU, dt, 3, shape, 2);
    sv_upload(&h, v);
    weft_tensor *d = NULL, *back = NULL;
    OK(weft_tensor_to(&h.t, dev, &d));
    cr_assert(d->device == dev && weft_tensor_is_contiguous(d), "weft_tensor_to made %s %s",
              weft_device_name(d->device), weft_tensor_is_contiguous(d) ? "" : "(strided)");
    /* a transposed device view back to the host */
    weft_tensor *tv = NULL;
    OK(weft_tensor_transpose(d, 0, 2, &tv));
    OK(weft_tensor_to(tv, WEFT_CPU, &back));
    cr_assert_eq(back->shape[0], 7);
    double *want = h_dbl(105);
    for (int64_t a = 0; a < 7; a++)
      for (int64_t b = 0; b < 5; b++)
        for (int64_t c = 0; c < 3; c++) want[(a * 5 + b) * 3 + c] = v[(c * 5 + b) * 7 + a];
    expect_values("weft_tensor_to there and back (transposed)", back->data, dt, want, 105);
    weft_tensor_destroy(tv), weft_tensor_destroy(d), weft_tensor_destroy(back);
    sv_free(&h);
    free(v), free(want);
  }
}

/* ================================================================= fills */

BACKEND_TEST(fill_and_zeros_set_every_element_of_a_strided_view) {
  seed_tests(121);
  // clang-format off
  const double values[] = {1.0 / 3.0, -2.5, NAN, INFINITY, -INFINITY, 1e10, -0.0,
                           1.0 + 0x1p-8 + 0x1p-30 /* bf16 via f32: 1.0 */, 65519.0, 3e9, -7.9};
  // clang-format on
  const weft_dtype dts[5] = {WEFT_F32, WEFT_F64, WEFT_BF16, WEFT_F16, WEFT_I32};
  const int64_t shape2[2] = {7, 33}, shape1[1] = {130};
  for (int k = 0; k < 5; k++)
    for (int sh = 0; sh < 2; sh++)
      for (size_t vi = 0; vi < sizeof values / sizeof values[0]; vi++) {
        const weft_dtype dt = dts[k];
        sview s;
        sv_init(&s, dev, dt, sh ? 1 : 2, sh ? shape1 : shape2, sh ? 0 : 2);
        if (!DONE(dev, "fill", dt, weft_tensor_fill(&s.t, values[vi]))) {
          sv_free(&s);
          break;
        }
        char what[96];
        snprintf(what, sizeof what, "fill(%.17g)", values[vi]);
        void *got = sv_fetch(&s, what);
        double *want = h_dbl(s.numel);
        for (int64_t i = 0; i < s.numel; i++) want[i] = conv(dt, values[vi]);
        expect_values(what, got, dt, want, s.numel);
        free(got), free(want);
        sv_free(&s);
      }
  for (int k = 0; k < 4; k++) {
    weft_tensor *z = NULL;
    OK(weft_tensor_zeros(float_dtypes[k], dev, 2, shape2, &z));
    void *got = down(dev, z->data, weft_tensor_nbytes(z));
    void *want = xmalloc(weft_tensor_nbytes(z));
    memset(want, 0, weft_tensor_nbytes(z));
    expect_same_bytes("weft_tensor_zeros", got, want, 7 * 33, esz(float_dtypes[k]));
    free(got), free(want);
    weft_tensor_destroy(z);
  }
}

/* ----------------------------------------------------------- Philox */

/* Philox4x32-10 from Salmon et al., SC 2011 (Random123's philox.h). */
static void ref_philox(uint64_t ctr_lo, uint64_t ctr_hi, uint64_t key, uint32_t out[4]) {
  uint32_t c[4] = {(uint32_t)ctr_lo, (uint32_t)(ctr_lo >> 32), (uint32_t)ctr_hi,
                   (uint32_t)(ctr_hi >> 32)};
  uint32_t k0 = (uint32_t)key, k1 = (uint32_t)(key >> 32);
  for (int r = 0; r < 10; r++) {
    const uint64_t p0 = (uint64_t)0xD2511F53u * c[0], p1 = (uint64_t)0xCD9E8D57u * c[2];
    const uint32_t n0 = (uint32_t)(p1 >> 32) ^ c[1] ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c[3] ^ k1;
    c[0] = n0, c[1] = (uint32_t)p1, c[2] = n2, c[3] = (uint32_t)p0;
    k0 += 0x9E3779B9u, k1 += 0xBB67AE85u;
  }
  memcpy(out, c, sizeof c);
}

/* kernels.h's recipe for global element e, in double. */
static double ref_philox_value(uint64_t seed, uint64_t key, uint64_t e, weft_random_kind kind,
                               double a, double b) {
  uint32_t x[4];
  ref_philox(e >> 1, key, seed, x);
  const uint64_t A = (uint64_t)x[0] | (uint64_t)x[1] << 32,
                 B = (uint64_t)x[2] | (uint64_t)x[3] << 32;
  if (kind == WEFT_RANDOM_UNIFORM)
    return a + (b - a) * ((double)(((e & 1) ? B : A) >> 11) * 0x1p-53);
  const double u1 = (double)((A >> 11) + 1) * 0x1p-53, u2 = (double)(B >> 11) * 0x1p-53;
  const double r = sqrt(-2.0 * log(u1)), th = 6.283185307179586476925 * u2;
  return a + b * (r * ((e & 1) ? sin(th) : cos(th)));
}

/* The largest value of dt strictly below hi. */
static double below(weft_dtype dt, double hi) {
  double v = round_once(dt, hi);
  while (v >= hi) {
    switch (dt) {
      case WEFT_F64:
        v = nextafter(v, -INFINITY);
        break;
      case WEFT_F32:
        v = nextafterf((float)v, -INFINITY);
        break;
      default: { /* 16-bit sign-magnitude patterns */
        char p[2];
        uint16_t h;
        enc(p, dt, v);
        memcpy(&h, p, 2);
        h = h == 0 ? 0x8001u : (h & 0x8000u) ? (uint16_t)(h + 1) : (uint16_t)(h - 1);
        memcpy(p, &h, 2);
        v = dec(p, dt);
      }
    }
  }
  return v;
}

/* The value the recipe gives element e: computed in double, rounded to dt
 * as weft_tensor_copy converts a double (kernels.h: bf16 / f16 through f32,
 * as torch), uniform values that round up to hi replaced. */
static double ref_fill(weft_dtype dt, uint64_t seed, uint64_t key, uint64_t e,
                       weft_random_kind kind, float a, float b) {
  double v = conv(dt, ref_philox_value(seed, key, e, kind, a, b));
  if (kind == WEFT_RANDOM_UNIFORM && v >= (double)b) v = below(dt, b);
  return v;
}

static void expect_fill(const char *what, weft_device dev, const void *got, weft_dtype dt,
                        const double *want, int64_t n, weft_random_kind kind) {
  if (kind == WEFT_RANDOM_UNIFORM || exact_transcendentals(dev)) {
    expect_values(what, got, dt, want, n);
    return;
  }
  /* a GPU's libm: 1e-6 relative (the rounding to dt may move by one step) */
  const double step = dt == WEFT_BF16 ? 0x1p-7 : dt == WEFT_F16 ? 0x1p-10 : 1e-6;
  for (int64_t i = 0; i < n; i++) {
    const double g = dec((const char *)got + (size_t)i * esz(dt), dt);
    cr_assert(fabs(g - want[i]) <= step * fabs(want[i]) + 1e-30,
              "%s on %s: element %lld is %.9g, want %.9g (seed %lu)", what, weft_backend_name(dev),
              (long long)i, g, want[i], g_seed);
  }
}

Test(reference, philox_reference_matches_random123_known_answers) {
  const philox_kat *kat = philox_kats();
  for (int i = 0; i < N_PHILOX_KATS; i++) {
    uint32_t out[4];
    ref_philox((uint64_t)kat[i].ctr[0] | (uint64_t)kat[i].ctr[1] << 32,
               (uint64_t)kat[i].ctr[2] | (uint64_t)kat[i].ctr[3] << 32,
               (uint64_t)kat[i].key[0] | (uint64_t)kat[i].key[1] << 32, out);
    for (int w = 0; w < 4; w++)
      cr_assert_eq(out[w], kat[i].out[w], "vector %d word %d: 0x%08x, want 0x%08x", i, w, out[w],
                   kat[i].out[w]);
  }
}

BACKEND_TEST(philox_fills_follow_the_recipe_and_a_shard_is_the_slice_of_the_full_fill) {
  seed_tests(122);
  const uint64_t seed = rnd_u64(), key = weft_rng_key("layers.0.attention.wq.weight");
  const int64_t G[2] = {5, 37}, L[2] = {2, 11}, O[2] = {3, 20};
  for (int k = 0; k < 4; k++)
    for (int kind = 0; kind < 2; kind++) {
      const weft_dtype dt = float_dtypes[k];
      const weft_random_kind rk = kind ? WEFT_RANDOM_UNIFORM : WEFT_RANDOM_NORMAL;
      const float a = kind ? -1.0f : 0.5f, b = kind ? 3.0f : 2.0f;
      char what[96];
      /* the full tensor as a transposed-layout view */
      sview full;
      sv_init(&full, dev, dt, 2, G, 2);
      weft_status st = kind ? weft_tensor_fill_uniform(&full.t, seed, key, NULL, a, b)
                            : weft_tensor_fill_normal(&full.t, seed, key, NULL, a, b);
      if (!DONE(dev, kind ? "fill_uniform" : "fill_normal", dt, st)) {
        sv_free(&full);
        continue;
      }
      snprintf(what, sizeof what, "%s fill, full (5, 37)", kind ? "uniform" : "normal");
      void *got = sv_fetch(&full, what);
      double *want = h_dbl(5 * 37);
      for (int64_t e = 0; e < 5 * 37; e++) want[e] = ref_fill(dt, seed, key, (uint64_t)e, rk, a, b);
      expect_fill(what, dev, got, dt, want, 5 * 37, rk);
      free(got);
      /* a 2-D shard at offset (3, 20), row-padded */
      weft_rng_region reg = {.ndim = 2, .global_shape = {5, 37}, .offset = {3, 20}};
      sview sh;
      sv_init(&sh, dev, dt, 2, L, 1);
      OK(kind ? weft_tensor_fill_uniform(&sh.t, seed, key, &reg, a, b)
              : weft_tensor_fill_normal(&sh.t, seed, key, &reg, a, b));
      snprintf(what, sizeof what, "%s fill, shard (2, 11) at (3, 20)", kind ? "uniform" : "normal");
      got = sv_fetch(&sh, what);
      double *ws = h_dbl(2 * 11);
      for (int64_t i = 0; i < 2; i++)
        for (int64_t j = 0; j < 11; j++) ws[i * 11 + j] = want[(O[0] + i) * 37 + O[1] + j];
      expect_fill(what, dev, got, dt, ws, 22, rk);
      free(got), free(ws), free(want);
      /* a 1-D shard starting at an odd global index (the second of a pair) */
      const int64_t n1[1] = {130};
      weft_rng_region r1 = {.ndim = 1, .global_shape = {1001}, .offset = {871}};
      sview s1;
      sv_init(&s1, dev, dt, 1, n1, 0);
      OK(kind ? weft_tensor_fill_uniform(&s1.t, seed, key, &r1, a, b)
              : weft_tensor_fill_normal(&s1.t, seed, key, &r1, a, b));
      got = sv_fetch(&s1, "1-D shard at 871");
      double *w1 = h_dbl(130);
      for (int64_t e = 0; e < 130; e++)
        w1[e] = ref_fill(dt, seed, key, (uint64_t)(871 + e), rk, a, b);
      expect_fill("1-D shard at offset 871 of 1001", dev, got, dt, w1, 130, rk);
      free(got), free(w1);
      sv_free(&full), sv_free(&sh), sv_free(&s1);
    }
}

/* kernels.h: computed in double, rounded to the dtype as a copy of the
 * double is, i.e. through f32 for bf16 / f16 (as torch). That differs from
 * rounding once when the f32 value lands on a bf16 / f16 tie (about 1 in
 * 10^5 bf16, 6 in 10^5 f16 normals), so this needs many elements to pin
 * which rounding a backend does. */
BACKEND_TEST(philox_16_bit_fills_round_through_f32_like_a_copy_on_a_large_tensor) {
  seed_tests(123);
  const uint64_t seed = rnd_u64(), key = weft_rng_key("tok_embeddings.weight");
  const int64_t n = (int64_t)1 << 18;
  const int64_t shape[1] = {n};
  for (int k = 2; k < 4; k++) {
    const weft_dtype dt = float_dtypes[k];
    weft_tensor *t = NULL;
    OK(weft_tensor_create(dt, dev, 1, shape, &t));
    if (!DONE(dev, "fill_normal", dt, weft_tensor_fill_normal(t, seed, key, NULL, 0.5f, 2.0f))) {
      weft_tensor_destroy(t);
      continue;
    }
    void *got = down(dev, t->data, weft_tensor_nbytes(t));
    double *want = h_dbl(n);
    int64_t via_f32 = 0;
    for (int64_t e = 0; e < n; e++) {
      want[e] = ref_fill(dt, seed, key, (uint64_t)e, WEFT_RANDOM_NORMAL, 0.5f, 2.0f);
      const double v = ref_philox_value(seed, key, (uint64_t)e, WEFT_RANDOM_NORMAL, 0.5, 2.0);
      if (round_once(dt, v) != want[e]) via_f32++;
    }
    cr_log_info("%s: %lld of %lld values would round differently straight from double",
                weft_dtype_name(dt), (long long)via_f32, (long long)n);
    expect_fill("normal fill of 2^18 elements", dev, got, dt, want, n, WEFT_RANDOM_NORMAL);
    free(got), free(want);
    weft_tensor_destroy(t);
  }
}

/* =========================================================== elementwise */

typedef enum { EW_ADD, EW_MUL, EW_ADD_INPLACE, EW_SCALE, EW_AXPY, EW_DIV, EW_COUNT } ew_op;
static const char *const ew_names[EW_COUNT] = {"add",   "mul",  "add (out is a)",
                                               "scale", "axpy", "div_scalar"};
#define EW_ALPHA_SCALE 0.3
#define EW_ALPHA_AXPY (-1.7)
#define EW_DIVISOR 3.0 /* Partial(sum) on a mesh dim of 3: x / 3, not x * fl(1/3) */

/* The contract of kernels.h: f32 and f64 in their own precision, bf16 and
 * f16 in f32 rounded once; alpha rounded to the compute precision first.
 * Sums and products of two floats computed in double and rounded to f32
 * are the f32 operation's result (53 >= 2 * 24 + 2). */
static double ew_ref(ew_op op, weft_dtype dt, double a, double b) {
  const bool dbl = dt == WEFT_F64;
  const double al_s = dbl ? EW_ALPHA_SCALE : (double)(float)EW_ALPHA_SCALE;
  const double al_a = dbl ? EW_ALPHA_AXPY : (double)(float)EW_ALPHA_AXPY;
  double r;
  switch (op) {
    case EW_ADD:
    case EW_ADD_INPLACE:
      r = a + b;
      break;
    case EW_MUL:
      r = a * b;
      break;
    case EW_SCALE:
      r = a * al_s;
      break;
    case EW_DIV:
      r = a / EW_DIVISOR;
      break; /* division: double rounding is innocuous too */
    default:
      r = dbl ? a + al_a * b : a + (double)(float)(al_a * b);
      break; /* y = a, x = b */
  }
  return dbl ? r : round_once(dt, (double)(float)r);
}

/* Runs op on dev over views of a and b (layouts lay[3]: a, b, out) and
 * returns out's elements (bytes), or NULL when the device refuses dt. */
static void *ew_run(weft_device dev, ew_op op, weft_dtype dt, int ndim, const int64_t *shape,
                    const int *lay, const double *a, const double *b) {
  sview sa, sb, so;
  sv_init(&sa, dev, dt, ndim, shape, lay[0]);
  sv_init(&sb, dev, dt, ndim, shape, lay[1]);
  sv_init(&so, dev, dt, ndim, shape, lay[2]);
  sv_upload(&sa, a);
  sv_upload(&sb, b);
  const sview *res = &so;
  weft_status st = WEFT_OK;
  switch (op) {
    case EW_ADD:
      st = weft_add(&so.t, &sa.t, &sb.t);
      break;
    case EW_MUL:
      st = weft_mul(&so.t, &sa.t, &sb.t);
      break;
    case EW_ADD_INPLACE:
      st = weft_add(&sa.t, &sa.t, &sb.t), res = &sa;
      break;
    case EW_SCALE:
      st = weft_scale(&sa.t, EW_ALPHA_SCALE), res = &sa;
      break;
    case EW_DIV:
      st = weft_div_scalar(&sa.t, EW_DIVISOR), res = &sa;
      break;
    default:
      st = weft_axpy(&sa.t, EW_ALPHA_AXPY, &sb.t), res = &sa;
      break;
  }
  void *got = NULL;
  if (done_or_refused(st, dev, op == EW_ADD_INPLACE ? "add" : ew_names[op], dt, ew_names[op]))
    got = sv_fetch(res, ew_names[op]);
  sv_free(&sa), sv_free(&sb), sv_free(&so);
  return got;
}

BACKEND_TEST(add_mul_scale_axpy_div_round_once_in_every_float_dtype_on_strided_views) {
  seed_tests(131);
  const int64_t s2[2] = {7, 33}, s1[1] = {130};
  const int lay2[3] = {2, 1, 2}, lay1[3] = {0, 0, 0}; /* strided; contiguous (f32 fast path) */
  for (int k = 0; k < 4; k++)
    for (int sh = 0; sh < 2; sh++) {
      const weft_dtype dt = float_dtypes[k];
      const int nd = sh ? 1 : 2;
      const int64_t *shape = sh ? s1 : s2;
      const int64_t n = sh ? 130 : 231;
      double *a = rand_vals(dt, n, -4.0, 4.0), *b = rand_vals(dt, n, -4.0, 4.0);
      /* inf - inf = NaN, NaN propagates, -0 + -0 = -0, overflow in the dtype */
      a[1] = INFINITY, b[1] = -INFINITY;
      a[5] = NAN;
      a[9] = -0.0, b[9] = -0.0;
      a[12] = b[12] = conv(dt, dt == WEFT_F16 ? 60000.0 : dt == WEFT_F64 ? 1e308 : 3e38);
      for (int op = 0; op < EW_COUNT; op++) {
        void *got = ew_run(dev, (ew_op)op, dt, nd, shape, sh ? lay1 : lay2, a, b);
        if (!got) continue;
        double *want = h_dbl(n);
        for (int64_t i = 0; i < n; i++) want[i] = ew_ref((ew_op)op, dt, a[i], b[i]);
        char what[96];
        snprintf(what, sizeof what, "%s %s[%s]", ew_names[op], weft_dtype_name(dt),
                 sh ? "130" : "7, 33 strided");
        expect_values(what, got, dt, want, n);
        if (dev != WEFT_CPU) {
          void *cpu = ew_run(WEFT_CPU, (ew_op)op, dt, nd, shape, sh ? lay1 : lay2, a, b);
          expect_same_floats(what, got, cpu, n, dt);
          free(cpu);
        }
        free(got), free(want);
      }
      free(a), free(b);
    }
}

/* weft_tensor_copy_region: a box of a strided view into a box of another
 * (padded / transposed layouts, dtype conversion as weft_tensor_copy); the
 * rest of dst and every byte outside the views stay as they were. */
/* The op layer runs add, mul and scale in a 16-bit dtype only where the
 * backend says its kernel takes it (backend.h takes_dtype); what the
 * kernels compute for each dtype is the test above. Both built-in backends
 * take every float dtype for these three, no integer dtype, no unknown op. */
BACKEND_TEST(add_mul_scale_say_they_take_every_float_dtype_and_nothing_else) {
  const weft_kernel_op ops[3] = {WEFT_KERNEL_ADD, WEFT_KERNEL_MUL, WEFT_KERNEL_SCALE};
  for (int o = 0; o < 3; o++)
    for (int d = 0; d < WEFT_DTYPE_COUNT; d++) {
      bool want = weft_dtype_is_float((weft_dtype)d);
      cr_expect_eq(weft_backend_takes_dtype(dev, ops[o], (weft_dtype)d), want,
                   "op %d in %s on %s: takes_dtype should say %d", (int)ops[o],
                   weft_dtype_name((weft_dtype)d), weft_backend_name(dev), want);
    }
  cr_expect_not(weft_backend_takes_dtype(dev, WEFT_KERNEL_OP_COUNT, WEFT_BF16));
  cr_expect_not(weft_backend_takes_dtype(dev, (weft_kernel_op)-1, WEFT_BF16));
  cr_expect_not(weft_backend_takes_dtype(dev, WEFT_KERNEL_ADD, WEFT_DTYPE_COUNT));
}

BACKEND_TEST(copy_region_copies_one_box_between_strided_views_converting_dtypes) {
  seed_tests(733);
  static const weft_dtype pairs[][2] = {{WEFT_F32, WEFT_F32},
                                        {WEFT_BF16, WEFT_F32},
                                        {WEFT_F64, WEFT_F32},
                                        {WEFT_F16, WEFT_F16},
                                        {WEFT_I32, WEFT_I32}};
  const int64_t ss[3] = {5, 7, 6}, dsh[3] = {4, 9, 5}, box[3] = {3, 4, 2};
  const int64_t soff[3] = {1, 2, 3}, doff[3] = {0, 5, 1};
  for (size_t k = 0; k < sizeof pairs / sizeof pairs[0]; k++)
    for (int lay = 0; lay < 3; lay++) {
      const weft_dtype ddt = pairs[k][0], sdt = pairs[k][1];
      sview sv, dv;
      sv_init(&sv, dev, sdt, 3, ss, lay);
      sv_init(&dv, dev, ddt, 3, dsh, 2 - lay);
      double *a = rand_vals(sdt, sv.numel, -100.0, 100.0),
             *b = rand_vals(ddt, dv.numel, -100.0, 100.0);
      sv_upload(&sv, a);
      sv_upload(&dv, b);
      char what[96];
      snprintf(what, sizeof what, "copy_region %s <- %s (layouts %d, %d)", weft_dtype_name(ddt),
               weft_dtype_name(sdt), 2 - lay, lay);
      if (done_or_refused2(weft_tensor_copy_region(&dv.t, doff, &sv.t, soff, box), dev,
                           "weft_tensor_copy", ddt, sdt, what)) {
        void *got = sv_fetch(&dv, what);
        double *want = h_dbl(dv.numel);
        for (int64_t i = 0; i < dv.numel; i++) {
          const int64_t x = i / (dsh[1] * dsh[2]), y = (i / dsh[2]) % dsh[1], z = i % dsh[2];
          const bool in = x >= doff[0] && x < doff[0] + box[0] && y >= doff[1] &&
                          y < doff[1] + box[1] && z >= doff[2] && z < doff[2] + box[2];
          const int64_t j = ((x - doff[0] + soff[0]) * ss[1] + (y - doff[1] + soff[1])) * ss[2] +
                            (z - doff[2] + soff[2]);
          want[i] = in ? conv(ddt, a[j]) : b[i];
        }
        expect_values(what, got, ddt, want, dv.numel);
        free(got), free(want);
      }
      free(a), free(b);
      sv_free(&sv), sv_free(&dv);
    }
  /* a box outside a tensor, and tensors of different ndim: refused, named */
  sview a, b;
  sv_init(&a, dev, WEFT_F32, 3, ss, 0);
  sv_init(&b, dev, WEFT_F32, 3, dsh, 0);
  const int64_t far[3] = {0, 6, 0};
  cr_assert_eq(weft_tensor_copy_region(&b.t, far, &a.t, NULL, box), WEFT_ERR_INVALID);
  cr_assert(strstr(weft_last_error(), "dim 1") && strstr(weft_last_error(), "dst"), "%s",
            weft_last_error());
  cr_assert_eq(weft_tensor_copy_region(&b.t, NULL, &a.t, far, box), WEFT_ERR_INVALID);
  cr_assert(strstr(weft_last_error(), "src"), "%s", weft_last_error());
  weft_tensor two;
  OK(weft_tensor_view_init(&two, b.t.data, WEFT_F32, dev, 2, dsh, NULL));
  cr_assert_eq(weft_tensor_copy_region(&two, NULL, &a.t, NULL, box), WEFT_ERR_INVALID);
  sv_free(&a), sv_free(&b);
}

/* ============================================================ reductions */

/* kernels.h: accumulated in double; max propagates NaN. */
static double red_step(weft_reduce_kind kind, double acc, double v) {
  switch (kind) {
    case WEFT_REDUCE_SUM:
      return acc + v;
    case WEFT_REDUCE_SUMSQ:
      return acc + v * v;
    default:
      return (acc != acc || v != v) ? NAN : (v > acc ? v : acc);
  }
}
static const char *const red_names[3] = {"sum", "sumsq", "max"};

static double red_tol(weft_dtype dt) {
  switch (dt) {
    case WEFT_F64:
      return 1e-12;
    case WEFT_F32:
      return 1e-6;
    case WEFT_F16:
      return 2e-3;
    case WEFT_BF16:
      return 1e-2;
    default:
      return 0.0; /* i32: exact */
  }
}

/* got (values) against want: exact for max (an element) and integers,
 * else by normalised error; NaN where want is NaN. */
static void expect_reduced(const char *what, const double *got, const double *want, int64_t n,
                           weft_reduce_kind kind, weft_dtype dt) {
  double num = 0.0, den = 0.0;
  for (int64_t i = 0; i < n; i++) {
    if (want[i] != want[i]) {
      cr_assert(got[i] != got[i], "%s on %s: [%lld] is %.9g, want NaN (seed %lu)", what,
                weft_backend_name(g_dev), (long long)i, got[i], g_seed);
      continue;
    }
    if (kind == WEFT_REDUCE_MAX || dt == WEFT_I32) {
      cr_assert(got[i] == want[i], "%s on %s: [%lld] is %.17g, want %.17g (seed %lu)", what,
                weft_backend_name(g_dev), (long long)i, got[i], want[i], g_seed);
      continue;
    }
    cr_assert(isfinite(got[i]), "%s on %s: [%lld] is %g, want %.9g (seed %lu)", what,
              weft_backend_name(g_dev), (long long)i, got[i], want[i], g_seed);
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  const double err = den > 0.0 ? sqrt(num / den) : sqrt(num);
  cr_assert(err <= red_tol(dt), "%s on %s: normalised error %.3g > %.1g (seed %lu)", what,
            weft_backend_name(g_dev), err, red_tol(dt), g_seed);
}

BACKEND_TEST(reduce_over_each_dim_and_everything_accumulates_in_double) {
  seed_tests(141);
  const int64_t shape[3] = {7, 33, 3}, n = 7 * 33 * 3;
  const weft_dtype dts[5] = {WEFT_F32, WEFT_F64, WEFT_BF16, WEFT_F16, WEFT_I32};
  for (int k = 0; k < 5; k++)
    for (int withnan = 0; withnan < (dts[k] == WEFT_I32 ? 1 : 2); withnan++) {
      const weft_dtype dt = dts[k];
      double *v = dt == WEFT_I32 ? h_dbl(n) : rand_vals(dt, n, -2.0, 3.0);
      if (dt == WEFT_I32)
        for (int64_t i = 0; i < n; i++) v[i] = (double)rnd_int(-1000, 1000);
      if (withnan) v[(2 * 33 + 5) * 3 + 1] = NAN;
      sview in;
      sv_init(&in, dev, dt, 3, shape, 2);
      sv_upload(&in, v);
      bool refused = false;
      for (int kind = 0; kind < 3 && !refused; kind++)
        for (int dim = -1; dim < 3 && !refused; dim++) {
          const int d = dim < 0 ? dim + 3 : dim;
          int64_t os[3] = {7, 33, 3};
          os[d] = 1;
          sview out;
          sv_init(&out, dev, dt, 3, os, 0);
          if (!DONE(dev, "reduce", dt, weft_reduce(&in.t, (weft_reduce_kind)kind, dim, &out.t))) {
            refused = true;
            sv_free(&out);
            break;
          }
          char what[96];
          snprintf(what, sizeof what, "reduce %s over dim %d of %s[7, 33, 3]%s", red_names[kind],
                   dim, weft_dtype_name(dt), withnan ? " with a NaN" : "");
          void *gb = sv_fetch(&out, what);
          double *got = vals_of(gb, dt, out.numel), *want = h_dbl(out.numel);
          int64_t oi = 0;
          for (int64_t i0 = 0; i0 < os[0]; i0++)
            for (int64_t i1 = 0; i1 < os[1]; i1++)
              for (int64_t i2 = 0; i2 < os[2]; i2++) {
                double acc = kind == WEFT_REDUCE_MAX ? -INFINITY : 0.0;
                for (int64_t r = 0; r < shape[d]; r++) {
                  int64_t idx[3] = {i0, i1, i2};
                  idx[d] = r;
                  acc =
                      red_step((weft_reduce_kind)kind, acc, v[(idx[0] * 33 + idx[1]) * 3 + idx[2]]);
                }
                want[oi++] = conv(dt, acc);
              }
          expect_reduced(what, got, want, out.numel, (weft_reduce_kind)kind, dt);
          free(gb), free(got), free(want);
          sv_free(&out);
        }
      for (int kind = 0; kind < 3 && !refused; kind++) {
        double got = -1.0, want = kind == WEFT_REDUCE_MAX ? -INFINITY : 0.0;
        if (!DONE(dev, "reduce_all", dt, weft_reduce_all(&in.t, (weft_reduce_kind)kind, &got)))
          break;
        for (int64_t i = 0; i < n; i++) want = red_step((weft_reduce_kind)kind, want, v[i]);
        char what[96];
        snprintf(what, sizeof what, "reduce_all %s of %s%s", red_names[kind], weft_dtype_name(dt),
                 withnan ? " with a NaN" : "");
        if (want != want)
          cr_assert(got != got, "%s: got %g, want NaN (seed %lu)", what, got, g_seed);
        else if (kind == WEFT_REDUCE_MAX)
          cr_assert(got == want, "%s: %.17g, want %.17g", what, got, want);
        else
          expect_rel(what, got, want, 1e-12);
      }
      sv_free(&in);
      free(v);
    }
  /* a 0-d tensor; an empty dim sums to 0 */
  float x = 2.5f, y = NAN;
  float *dx = dupf(dev, &x, 1), *dy = dupf(dev, &y, 1);
  weft_tensor t0, o0;
  OK(weft_tensor_view_init(&t0, dx, WEFT_F32, dev, 0, NULL, NULL));
  OK(weft_tensor_view_init(&o0, dy, WEFT_F32, dev, 0, NULL, NULL));
  OK(weft_reduce(&t0, WEFT_REDUCE_SUMSQ, -1, &o0));
  float *g = downf(dev, dy, 1);
  cr_assert_eq(*g, 6.25f, "0-d sumsq of 2.5: %g", (double)*g);
  const int64_t es[2] = {4, 0}, eo[2] = {4, 1};
  sview e, eout;
  sv_init(&e, dev, WEFT_F32, 2, es, 1);
  sv_init(&eout, dev, WEFT_F32, 2, eo, 0);
  OK(weft_reduce(&e.t, WEFT_REDUCE_SUM, 1, &eout.t));
  void *eb = sv_fetch(&eout, "sum over an empty dim");
  const double zeros[4] = {0, 0, 0, 0};
  expect_values("sum over an empty dim", eb, WEFT_F32, zeros, 4);
  cr_assert_eq(weft_reduce(&e.t, WEFT_REDUCE_MAX, 1, &eout.t), WEFT_ERR_INVALID,
               "max over an empty dim: %s", weft_last_error());
  free(g), free(eb);
  weft_free(dx), weft_free(dy);
  sv_free(&e), sv_free(&eout);
}

/* ================================================================= GEMMs */

/* op(A)[i][p] of a row-major matrix with leading dim ld. */
static double mat_at(const float *a, bool t, int64_t ld, int64_t i, int64_t p) {
  return t ? a[p * ld + i] : a[i * ld + p];
}
/* out (m x n, ld n) = alpha op(A) op(B) + beta C0 (C0 ld ldc; unread when beta == 0) */
static void gemm_ref(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha,
                     const float *a, int64_t lda, const float *b, int64_t ldb, double beta,
                     const float *c0, int64_t ldc, double *out) {
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < n; j++) {
      double s = 0.0;
      for (int64_t p = 0; p < k; p++) s += mat_at(a, ta, lda, i, p) * mat_at(b, tb, ldb, p, j);
      out[i * n + j] = alpha * s + (beta != 0.0 ? beta * (double)c0[i * ldc + j] : 0.0);
    }
}
static double gemm_tol(weft_dtype dt) {
  return dt == WEFT_F64 ? 1e-12 : dt == WEFT_F32 ? 1e-5 : dt == WEFT_F16 ? 1e-3 : 1e-2;
}

BACKEND_TEST(weft_gemm_matches_double_reference_for_every_transpose_layout_and_dtype) {
  seed_tests(151);
  const int64_t M = 33, N = 7, K = 130;
  for (int k = 0; k < 4; k++) {
    const weft_dtype dt = float_dtypes[k];
    bool refused = false;
    for (int t = 0; t < 8 && !refused; t++) {
      const bool ta = t & 1, tb = t & 2, swap = t & 4;
      /* A is (M, K) or (K, M) when ta; stored row-padded (layout 1) or as a
       * transposed view (layout 2), and B the other way round */
      const int64_t as[2] = {ta ? K : M, ta ? M : K}, bs[2] = {tb ? N : K, tb ? K : N},
                    cs[2] = {M, N};
      sview A, B, C;
      sv_init(&A, dev, dt, 2, as, swap ? 2 : 1);
      sv_init(&B, dev, dt, 2, bs, swap ? 1 : 2);
      sv_init(&C, dev, dt, 2, cs, 1);
      double *av = rand_vals(dt, M * K, -1.0, 1.0), *bv = rand_vals(dt, K * N, -1.0, 1.0);
      double *cv = rand_vals(dt, M * N, -1.0, 1.0);
      sv_upload(&A, av);
      sv_upload(&B, bv);
      for (int pass = 0; pass < 2; pass++) {
        /* pass 0: beta = 0 over NaN (C is not read); pass 1: beta = -0.5 */
        const float beta = pass ? -0.5f : 0.0f;
        if (pass)
          sv_upload(&C, cv);
        else
          sv_poison(&C);
        if (!DONE(dev, "gemm", dt, weft_gemm(ta, tb, 0.75f, &A.t, &B.t, beta, &C.t))) {
          refused = true;
          break;
        }
        char what[128];
        snprintf(what, sizeof what, "weft_gemm %s ta=%d tb=%d A %s B %s beta %g",
                 weft_dtype_name(dt), ta, tb, swap ? "transposed view" : "row-padded",
                 swap ? "row-padded" : "transposed view", (double)beta);
        void *gb = sv_fetch(&C, what);
        double *got = vals_of(gb, dt, M * N), *want = h_dbl(M * N);
        for (int64_t i = 0; i < M; i++)
          for (int64_t j = 0; j < N; j++) {
            double s = 0.0;
            for (int64_t p = 0; p < K; p++)
              s += (ta ? av[p * M + i] : av[i * K + p]) * (tb ? bv[j * K + p] : bv[p * N + j]);
            want[i * N + j] = 0.75 * s + (pass ? -0.5 * cv[i * N + j] : 0.0);
          }
        expect_close_dd(what, got, want, M * N, gemm_tol(dt), __FILE__, __LINE__);
        free(gb), free(got), free(want);
      }
      sv_free(&A), sv_free(&B), sv_free(&C);
      free(av), free(bv), free(cv);
    }
  }
}

/* One raw sgemm with padded leading dims against the double reference;
 * the padding between C's rows must stay as it was. */
static void sgemm_case(weft_device dev, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                       float alpha, float beta) {
  const int64_t lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 1, ldc = n + 2;
  const int64_t na = (ta ? k : m) * lda, nb = (tb ? n : k) * ldb, nc = m * ldc;
  float *a = h_normal(na, 1.0), *b = h_normal(nb, 1.0), *c0 = h_normal(nc, 1.0);
  float *da = dupf(dev, a, na), *db = dupf(dev, b, nb), *dc = dupf(dev, c0, nc);
  if (beta == 0.0f) { /* C is not read: NaN inside must not propagate */
    float *nanc = h_copy(c0, nc);
    for (int64_t i = 0; i < m; i++)
      for (int64_t j = 0; j < n; j++) nanc[i * ldc + j] = NAN;
    upf(dev, dc, nanc, nc);
    free(nanc);
  }
  OK(weft_backend_sgemm(dev, ta, tb, m, n, k, alpha, da, lda, db, ldb, beta, dc, ldc));
  float *c = downf(dev, dc, nc), *got = xmalloc((size_t)(m * n) * sizeof(float));
  for (int64_t i = 0; i < m; i++) memcpy(got + i * n, c + i * ldc, (size_t)n * sizeof(float));
  double *want = h_dbl(m * n);
  gemm_ref(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c0, ldc, want);
  char what[96];
  snprintf(what, sizeof what, "sgemm ta=%d tb=%d %lldx%lldx%lld beta %g", ta, tb, (long long)m,
           (long long)n, (long long)k, (double)beta);
  expect_close(what, got, want, m * n, 1e-5);
  for (int64_t i = 0; i < m; i++)
    expect_same_bytes("sgemm: C's row padding", c + i * ldc + n, c0 + i * ldc + n, ldc - n, 4);
  free(a), free(b), free(c0), free(c), free(got), free(want);
  weft_free(da), weft_free(db), weft_free(dc);
}

BACKEND_TEST(sgemm_strided_batched_and_gemm_bf16_match_double_references) {
  seed_tests(152);
  for (int t = 0; t < 4; t++) {
    sgemm_case(dev, t & 1, t & 2, 33, 17, 70, 0.75f, -0.5f);
    sgemm_case(dev, t & 1, t & 2, 7, 130, 9, 1.0f, 0.0f);
    /* over 2^22 multiply-adds: the emulator's dgemm path (EMU_DGEMM_MIN) */
    sgemm_case(dev, t & 1, t & 2, 130, 257, 129, 0.75f, t & 1 ? 0.0f : -0.5f);
  }
  /* K = 0: C = beta C (A and B not read); M = 0: nothing, NULL pointers */
  {
    const int64_t m = 5, n = 7;
    float *c0 = h_normal(m * n, 1.0), *dc = dupf(dev, c0, m * n);
    OK(weft_backend_sgemm(dev, false, false, m, n, 0, 1.0f, NULL, 1, NULL, n, 2.0f, dc, n));
    float *c = downf(dev, dc, m * n);
    double *want = h_dbl(m * n);
    for (int64_t i = 0; i < m * n; i++) want[i] = 2.0 * c0[i];
    expect_close("sgemm k = 0: C = beta C", c, want, m * n, 0.0);
    OK(weft_backend_sgemm(dev, false, false, 0, n, 3, 1.0f, NULL, 3, NULL, n, 0.0f, NULL, n));
    free(c0), free(c), free(want);
    weft_free(dc);
  }
  /* a batch of 3 with gaps between the matrices and B broadcast (stride 0) */
  {
    const int64_t m = 13, n = 9, k = 11, count = 3, lda = k, ldb = k + 2, ldc = n;
    const int64_t sa = m * lda + 5, sc = m * ldc + 3;
    float *a = h_normal(count * sa, 1.0), *b = h_normal(n * ldb, 1.0);
    float *c0 = h_normal(count * sc, 1.0);
    float *da = dupf(dev, a, count * sa), *db = dupf(dev, b, n * ldb),
          *dc = dupf(dev, c0, count * sc);
    OK(weft_backend_sgemm_strided_batched(dev, false, true, m, n, k, 1.5f, da, lda, sa, db, ldb, 0,
                                          1.0f, dc, ldc, sc, count));
    float *c = downf(dev, dc, count * sc);
    double *want = h_dbl(m * n);
    float *got = xmalloc((size_t)(m * n) * sizeof(float));
    for (int64_t i = 0; i < count; i++) {
      gemm_ref(false, true, m, n, k, 1.5, a + i * sa, lda, b, ldb, 1.0, c0 + i * sc, ldc, want);
      memcpy(got, c + i * sc, (size_t)(m * n) * sizeof(float));
      expect_close("sgemm_strided_batched (B broadcast)", got, want, m * n, 1e-5);
      expect_same_bytes("sgemm_strided_batched: gap after C", c + i * sc + m * ldc,
                        c0 + i * sc + m * ldc, sc - m * ldc, 4);
    }
    free(a), free(b), free(c0), free(c), free(want), free(got);
    weft_free(da), weft_free(db), weft_free(dc);
  }
  /* bf16 operands, fp32 accumulation and output */
  for (int t = 0; t < 4; t++) {
    const bool ta = t & 1, tb = t & 2;
    const int64_t m = 19, n = 31, k = 53, lda = (ta ? m : k) + 1, ldb = tb ? k : n;
    const int64_t na = (ta ? k : m) * lda, nb = (tb ? n : k) * ldb;
    float *a = h_normal(na, 1.0), *b = h_normal(nb, 1.0), *c0 = h_normal(m * n, 1.0);
    uint16_t *ha = xmalloc((size_t)na * 2), *hb = xmalloc((size_t)nb * 2);
    for (int64_t i = 0; i < na; i++) {
      a[i] = (float)round_once(WEFT_BF16, a[i]);
      enc(&ha[i], WEFT_BF16, a[i]);
    }
    for (int64_t i = 0; i < nb; i++) {
      b[i] = (float)round_once(WEFT_BF16, b[i]);
      enc(&hb[i], WEFT_BF16, b[i]);
    }
    uint16_t *da = dup_h(dev, ha, (size_t)na * 2), *db = dup_h(dev, hb, (size_t)nb * 2);
    float *dc = dupf(dev, c0, m * n);
    OK(weft_backend_gemm_bf16(dev, ta, tb, m, n, k, 1.0f, da, lda, db, ldb, 0.25f, dc, n));
    float *got = downf(dev, dc, m * n);
    double *want = h_dbl(m * n);
    gemm_ref(ta, tb, m, n, k, 1.0, a, lda, b, ldb, 0.25, c0, n, want);
    char what[64];
    snprintf(what, sizeof what, "gemm_bf16 ta=%d tb=%d", ta, tb);
    expect_close(what, got, want, m * n, 1e-5);
    free(a), free(b), free(c0), free(ha), free(hb), free(got), free(want);
    weft_free(da), weft_free(db), weft_free(dc);
  }
}

/* ======================================================== layer kernels */

BACKEND_TEST(embedding_and_embedding_range_forward_backward_match_references) {
  seed_tests(161);
  const int64_t N = 37, V = 23, C = 45, v0 = 5, nv = 10;
  int32_t *tok = h_ids(N, 0, V);
  tok[3] = tok[7] = tok[20] = 6; /* repeated tokens add up */
  tok[0] = 0, tok[1] = (int32_t)V - 1;
  float *w = h_normal(V * C, 1.0), *dout = h_normal(N * C, 1.0), *dw0 = h_normal(V * C, 1.0);
  int32_t *dtok = dupi(dev, tok, N);
  float *dwt = dupf(dev, w, V * C), *ddout = dupf(dev, dout, N * C);
  float *dout_d = dnan(dev, (size_t)(N * C) * 4), *ddw = dupf(dev, dw0, V * C);
  double *want = h_dbl(N * C > V * C ? N * C : V * C);

  OK(weft_backend_embedding_forward(dev, dout_d, dtok, dwt, N, V, C));
  float *got = downf(dev, dout_d, N * C);
  for (int64_t n = 0; n < N; n++)
    for (int64_t c = 0; c < C; c++) want[n * C + c] = w[tok[n] * C + c];
  expect_values("embedding_forward (a copy: exact)", got, WEFT_F32, want, N * C);
  free(got);

  OK(weft_backend_embedding_backward(dev, ddw, dtok, ddout, N, V, C));
  for (int64_t i = 0; i < V * C; i++) want[i] = dw0[i];
  for (int64_t n = 0; n < N; n++)
    for (int64_t c = 0; c < C; c++) want[tok[n] * C + c] += dout[n * C + c];
  got = downf(dev, ddw, V * C);
  expect_close("embedding_backward (accumulates, repeated tokens add)", got, want, V * C, 1e-5);
  free(got);

  /* the vocab range [v0, v0 + nv): other tokens give zero rows */
  dpoison(dev, dout_d, (size_t)(N * C) * 4);
  OK(weft_backend_embedding_range_forward(dev, dout_d, dtok, dwt + v0 * C, N, v0, nv, C));
  got = downf(dev, dout_d, N * C);
  for (int64_t n = 0; n < N; n++)
    for (int64_t c = 0; c < C; c++)
      want[n * C + c] = (tok[n] >= v0 && tok[n] < v0 + nv) ? w[tok[n] * C + c] : 0.0;
  expect_values("embedding_range_forward", got, WEFT_F32, want, N * C);
  free(got);

  upf(dev, ddw, dw0, V * C);
  OK(weft_backend_embedding_range_backward(dev, ddw + v0 * C, dtok, ddout, N, v0, nv, C));
  for (int64_t i = 0; i < V * C; i++) want[i] = dw0[i];
  for (int64_t n = 0; n < N; n++)
    if (tok[n] >= v0 && tok[n] < v0 + nv)
      for (int64_t c = 0; c < C; c++) want[tok[n] * C + c] += dout[n * C + c];
  got = downf(dev, ddw, V * C);
  expect_close("embedding_range_backward (rows outside the range untouched)", got, want, V * C,
               1e-5);
  free(got);
  free(tok), free(w), free(dout), free(dw0), free(want);
  weft_free(dtok), weft_free(dwt), weft_free(ddout), weft_free(dout_d), weft_free(ddw);
}

/* Repeated tokens add up in increasing n, as the CPU adds them: every
 * backend gives the CPU's bits, on every run (a GPU scatter with atomics
 * would add each row's hundreds of repeats in a different order per run). */
BACKEND_TEST(embedding_backward_adds_repeats_in_token_order_the_cpus_bits_every_run) {
  seed_tests(167);
  const int64_t N = 4099, V = 7, C = 300, v0 = 2, nv = 4; /* C: 2 column tiles on cuda */
  int32_t *tok = h_ids(N, 0, V);
  float *dout = h_normal(N * C, 1.0), *dw0 = h_normal(V * C, 1.0);
  int32_t *dtok = dupi(dev, tok, N);
  float *ddout = dupf(dev, dout, N * C);
  for (int range = 0; range < 2; range++) {
    float *cpu = malloc((size_t)(V * C) * sizeof(float));
    memcpy(cpu, dw0, (size_t)(V * C) * sizeof(float));
    if (range)
      OK(weft_backend_embedding_range_backward(WEFT_CPU, cpu + v0 * C, tok, dout, N, v0, nv, C));
    else
      OK(weft_backend_embedding_backward(WEFT_CPU, cpu, tok, dout, N, V, C));
    for (int run = 0; run < 3; run++) {
      float *ddw = dupf(dev, dw0, V * C);
      if (range)
        OK(weft_backend_embedding_range_backward(dev, ddw + v0 * C, dtok, ddout, N, v0, nv, C));
      else
        OK(weft_backend_embedding_backward(dev, ddw, dtok, ddout, N, V, C));
      float *got = downf(dev, ddw, V * C);
      char what[96];
      snprintf(what, sizeof what, "embedding%s_backward, run %d, against the CPU",
               range ? "_range" : "", run + 1);
      expect_same_bytes(what, got, cpu, V * C, sizeof(float));
      free(got);
      weft_free(ddw);
    }
    free(cpu);
  }
  free(tok), free(dout), free(dw0);
  weft_free(dtok), weft_free(ddout);
}

BACKEND_TEST(linear_forward_backward_with_bias_and_accumulate_flags_match_references) {
  seed_tests(162);
  const int64_t N = 37, IC = 45, OC = 29;
  float *x = h_normal(N * IC, 1.0), *w = h_normal(OC * IC, 0.3), *bias = h_normal(OC, 1.0);
  float *dout = h_normal(N * OC, 1.0);
  float *dx = dupf(dev, x, N * IC), *dwt = dupf(dev, w, OC * IC), *db = dupf(dev, bias, OC);
  float *ddout = dupf(dev, dout, N * OC), *dy = dnan(dev, (size_t)(N * OC) * 4);
  double *want = h_dbl(N * IC > OC * IC ? N * IC : OC * IC);
  for (int with_bias = 0; with_bias < 2; with_bias++) {
    dpoison(dev, dy, (size_t)(N * OC) * 4);
    OK(weft_backend_linear_forward(dev, dy, dx, dwt, with_bias ? db : NULL, N, IC, OC));
    for (int64_t n = 0; n < N; n++)
      for (int64_t o = 0; o < OC; o++) {
        double s = with_bias ? bias[o] : 0.0;
        for (int64_t i = 0; i < IC; i++) s += (double)x[n * IC + i] * w[o * IC + i];
        want[n * OC + o] = s;
      }
    float *got = downf(dev, dy, N * OC);
    expect_close(with_bias ? "linear_forward with bias" : "linear_forward", got, want, N * OC,
                 1e-5);
    free(got);
  }
  float *gi0 = h_normal(N * IC, 1.0), *gw0 = h_normal(OC * IC, 1.0), *gb0 = h_normal(OC, 1.0);
  for (int flags = 0; flags < 6; flags++) {
    /* 0-3: accumulate (dinp, dweight); 4: dinp NULL; 5: dweight and dbias NULL */
    const bool acc_i = flags & 1, acc_w = flags & 2;
    const bool skip_i = flags == 4, skip_w = flags == 5;
    float *dgi = acc_i ? dupf(dev, gi0, N * IC) : dnan(dev, (size_t)(N * IC) * 4);
    float *dgw = acc_w ? dupf(dev, gw0, OC * IC) : dnan(dev, (size_t)(OC * IC) * 4);
    float *dgb = acc_w ? dupf(dev, gb0, OC) : dnan(dev, (size_t)OC * 4);
    OK(weft_backend_linear_backward(dev, skip_i ? NULL : dgi, skip_w ? NULL : dgw,
                                    skip_w ? NULL : dgb, ddout, dx, dwt, N, IC, OC, acc_i, acc_w));
    char what[96];
    if (!skip_i) {
      for (int64_t n = 0; n < N; n++)
        for (int64_t i = 0; i < IC; i++) {
          double s = acc_i ? gi0[n * IC + i] : 0.0;
          for (int64_t o = 0; o < OC; o++) s += (double)dout[n * OC + o] * w[o * IC + i];
          want[n * IC + i] = s;
        }
      float *got = downf(dev, dgi, N * IC);
      snprintf(what, sizeof what, "linear_backward dinp (accumulate %d, %d)", acc_i, acc_w);
      expect_close(what, got, want, N * IC, 1e-5);
      free(got);
    }
    if (!skip_w) {
      for (int64_t o = 0; o < OC; o++)
        for (int64_t i = 0; i < IC; i++) {
          double s = acc_w ? gw0[o * IC + i] : 0.0;
          for (int64_t n = 0; n < N; n++) s += (double)dout[n * OC + o] * x[n * IC + i];
          want[o * IC + i] = s;
        }
      float *got = downf(dev, dgw, OC * IC);
      snprintf(what, sizeof what, "linear_backward dweight (accumulate %d, %d)", acc_i, acc_w);
      expect_close(what, got, want, OC * IC, 1e-5);
      free(got);
      for (int64_t o = 0; o < OC; o++) {
        double s = acc_w ? gb0[o] : 0.0;
        for (int64_t n = 0; n < N; n++) s += dout[n * OC + o];
        want[o] = s;
      }
      got = downf(dev, dgb, OC);
      snprintf(what, sizeof what, "linear_backward dbias (accumulate %d, %d)", acc_i, acc_w);
      expect_close(what, got, want, OC, 1e-5);
      free(got);
    }
    weft_free(dgi), weft_free(dgw), weft_free(dgb);
  }
  free(x), free(w), free(bias), free(dout), free(gi0), free(gw0), free(gb0), free(want);
  weft_free(dx), weft_free(dwt), weft_free(db), weft_free(ddout), weft_free(dy);
}

BACKEND_TEST(rmsnorm_forward_backward_match_references) {
  seed_tests(163);
  const int64_t N = 37, C = 45;
  const float eps = 1e-5f;
  float *x = h_normal(N * C, 2.0), *w = h_normal(C, 1.0), *dout = h_normal(N * C, 1.0);
  float *dwt0 = h_normal(C, 1.0), *dinp0 = h_normal(N * C, 1.0);
  float *dx = dupf(dev, x, N * C), *dwt = dupf(dev, w, C), *ddout = dupf(dev, dout, N * C);
  float *dy = dnan(dev, (size_t)(N * C) * 4), *drstd = dnan(dev, (size_t)N * 4);
  OK(weft_backend_rmsnorm_forward(dev, dy, drstd, dx, dwt, N, C, eps));
  double *r = h_dbl(N), *want = h_dbl(N * C);
  for (int64_t n = 0; n < N; n++) {
    double ss = 0.0;
    for (int64_t c = 0; c < C; c++) ss += (double)x[n * C + c] * x[n * C + c];
    r[n] = 1.0 / sqrt(ss / (double)C + (double)eps);
    for (int64_t c = 0; c < C; c++) want[n * C + c] = x[n * C + c] * r[n] * w[c];
  }
  float *got = downf(dev, dy, N * C);
  expect_close("rmsnorm_forward out", got, want, N * C, 1e-5);
  free(got);
  got = downf(dev, drstd, N);
  expect_close("rmsnorm_forward rstd", got, r, N, 1e-5);
  free(got);
  for (int acc = 0; acc < 2; acc++) {
    float *dgi = acc ? dupf(dev, dinp0, N * C) : dnan(dev, (size_t)(N * C) * 4);
    float *dgw = dupf(dev, dwt0, C);
    OK(weft_backend_rmsnorm_backward(dev, dgi, dgw, ddout, dx, dwt, drstd, N, C, acc));
    double *wdw = h_dbl(C);
    for (int64_t c = 0; c < C; c++) wdw[c] = dwt0[c];
    for (int64_t n = 0; n < N; n++) {
      double gx = 0.0;
      for (int64_t c = 0; c < C; c++) gx += (double)dout[n * C + c] * w[c] * x[n * C + c];
      for (int64_t c = 0; c < C; c++) {
        const double g = (double)dout[n * C + c] * w[c];
        want[n * C + c] = (acc ? dinp0[n * C + c] : 0.0) +
                          r[n] * (g - x[n * C + c] * r[n] * r[n] * gx / (double)C);
        wdw[c] += (double)dout[n * C + c] * x[n * C + c] * r[n];
      }
    }
    got = downf(dev, dgi, N * C);
    expect_close(acc ? "rmsnorm_backward dinp (+=)" : "rmsnorm_backward dinp (=)", got, want, N * C,
                 1e-5);
    free(got);
    got = downf(dev, dgw, C);
    expect_close("rmsnorm_backward dweight (+=)", got, wdw, C, 1e-5);
    free(got), free(wdw);
    weft_free(dgi), weft_free(dgw);
  }
  free(x), free(w), free(dout), free(dwt0), free(dinp0), free(r), free(want);
  weft_free(dx), weft_free(dwt), weft_free(ddout), weft_free(dy), weft_free(drstd);
}

BACKEND_TEST(rope_tables_forward_backward_with_pos0_and_in_place_match_references) {
  seed_tests(164);
  const int64_t max_pos = 40, hd = 6, half = 3, B = 2, T = 9, NH = 3, pos0 = 31;
  const double theta = 10000.0;
  const int64_t nt = max_pos * half, n = B * T * NH * hd;
  float *dcos = dnan(dev, (size_t)nt * 4), *dsin = dnan(dev, (size_t)nt * 4);
  OK(weft_backend_rope_tables(dev, dcos, dsin, max_pos, hd, theta));
  double *wc = h_dbl(nt), *ws = h_dbl(nt);
  for (int64_t p = 0; p < max_pos; p++)
    for (int64_t j = 0; j < half; j++) {
      const double a = (double)p * pow(theta, -2.0 * (double)j / (double)hd);
      wc[p * half + j] = cos(a), ws[p * half + j] = sin(a);
    }
  float *got = downf(dev, dcos, nt);
  expect_close("rope_tables cos", got, wc, nt, 1e-6);
  free(got);
  got = downf(dev, dsin, nt);
  expect_close("rope_tables sin", got, ws, nt, 1e-6);
  free(got);
  float *x = h_normal(n, 1.0);
  double *want = h_dbl(n);
  for (int dir = 0; dir < 2; dir++) /* forward, backward (the transpose rotation) */
    for (int inplace = 0; inplace < 2; inplace++) {
      float *din = dupf(dev, x, n), *dout = inplace ? din : dnan(dev, (size_t)n * 4);
      if (dir == 0)
        OK(weft_backend_rope_forward(dev, dout, din, dcos, dsin, max_pos, B, T, NH, hd, pos0));
      else
        OK(weft_backend_rope_backward(dev, dout, din, dcos, dsin, max_pos, B, T, NH, hd, pos0));
      for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++)
          for (int64_t h = 0; h < NH; h++)
            for (int64_t j = 0; j < half; j++) {
              const int64_t o = ((b * T + t) * NH + h) * hd + 2 * j;
              const double c = wc[(pos0 + t) * half + j],
                           s = (dir ? -1.0 : 1.0) * ws[(pos0 + t) * half + j];
              want[o] = x[o] * c - x[o + 1] * s;
              want[o + 1] = x[o] * s + x[o + 1] * c;
            }
      got = downf(dev, dout, n);
      char what[64];
      snprintf(what, sizeof what, "rope_%s%s (pos0 %lld)", dir ? "backward" : "forward",
               inplace ? " in place" : "", (long long)pos0);
      expect_close(what, got, want, n, 1e-5);
      free(got);
      weft_free(din);
      if (!inplace) weft_free(dout);
    }
  free(x), free(wc), free(ws), free(want);
  weft_free(dcos), weft_free(dsin);
}

/* ------------------------------------------------------------ attention */

/* layers.h's GQA attention in double: out (B,T,H,hd), lse (B,H,T); query t
 * sees keys 0..t when causal, all T keys otherwise. */
static void att_ref_forward(const double *q, const double *k, const double *v, int64_t B, int64_t T,
                            int64_t H, int64_t Hkv, int64_t hd, bool causal, double *out,
                            double *lse) {
  const double sc = 1.0 / sqrt((double)hd);
  double *s = h_dbl(T);
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < H; h++) {
      const int64_t g = h / (H / Hkv);
      for (int64_t t = 0; t < T; t++) {
        const double *qr = q + ((b * T + t) * H + h) * hd;
        const int64_t nk = causal ? t + 1 : T;
        double mx = -INFINITY;
        for (int64_t j = 0; j < nk; j++) {
          const double *kr = k + ((b * T + j) * Hkv + g) * hd;
          double d = 0.0;
          for (int64_t c = 0; c < hd; c++) d += qr[c] * kr[c];
          s[j] = d * sc;
          if (s[j] > mx) mx = s[j];
        }
        double sum = 0.0;
        for (int64_t j = 0; j < nk; j++) sum += exp(s[j] - mx);
        const double l = mx + log(sum);
        lse[(b * H + h) * T + t] = l;
        double *o = out + ((b * T + t) * H + h) * hd;
        for (int64_t c = 0; c < hd; c++) o[c] = 0.0;
        for (int64_t j = 0; j < nk; j++) {
          const double p = exp(s[j] - l);
          const double *vr = v + ((b * T + j) * Hkv + g) * hd;
          for (int64_t c = 0; c < hd; c++) o[c] += p * vr[c];
        }
      }
    }
  free(s);
}

/* Its gradients: dS = P (dP - rowsum(P dP)), dP = dout v^T; dq = dS k / sqrt(hd),
 * dk = dS^T q / sqrt(hd), dv = P^T dout (layers.h). */
static void att_ref_backward(const double *q, const double *k, const double *v, const double *dout,
                             const double *lse, int64_t B, int64_t T, int64_t H, int64_t Hkv,
                             int64_t hd, bool causal, double *dq, double *dk, double *dv) {
  const double sc = 1.0 / sqrt((double)hd);
  memset(dq, 0, (size_t)(B * T * H * hd) * sizeof(double));
  memset(dk, 0, (size_t)(B * T * Hkv * hd) * sizeof(double));
  memset(dv, 0, (size_t)(B * T * Hkv * hd) * sizeof(double));
  double *p = h_dbl(T), *dp = h_dbl(T);
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < H; h++) {
      const int64_t g = h / (H / Hkv);
      for (int64_t t = 0; t < T; t++) {
        const double *qr = q + ((b * T + t) * H + h) * hd, *dor = dout + ((b * T + t) * H + h) * hd;
        const double l = lse[(b * H + h) * T + t];
        const int64_t nk = causal ? t + 1 : T;
        double rs = 0.0;
        for (int64_t j = 0; j < nk; j++) {
          const double *kr = k + ((b * T + j) * Hkv + g) * hd,
                       *vr = v + ((b * T + j) * Hkv + g) * hd;
          double d = 0.0, e = 0.0;
          for (int64_t c = 0; c < hd; c++) d += qr[c] * kr[c], e += dor[c] * vr[c];
          p[j] = exp(d * sc - l);
          dp[j] = e;
          rs += p[j] * dp[j];
        }
        double *dqr = dq + ((b * T + t) * H + h) * hd;
        for (int64_t j = 0; j < nk; j++) {
          const double ds = p[j] * (dp[j] - rs);
          const double *kr = k + ((b * T + j) * Hkv + g) * hd;
          double *dkr = dk + ((b * T + j) * Hkv + g) * hd, *dvr = dv + ((b * T + j) * Hkv + g) * hd;
          for (int64_t c = 0; c < hd; c++) {
            dqr[c] += ds * kr[c] * sc;
            dkr[c] += ds * qr[c] * sc;
            dvr[c] += p[j] * dor[c];
          }
        }
      }
    }
  free(p), free(dp);
}

static double *to_dbl(const float *x, int64_t n) {
  double *d = h_dbl(n);
  for (int64_t i = 0; i < n; i++) d[i] = x[i];
  return d;
}

/* The backward reference is the gradient of sum(dout * out): central
 * differences in double on a small case check the reference itself. */
Test(reference, attention_backward_reference_matches_finite_differences) {
  seed_tests(170);
  for (int causal = 1; causal >= 0; causal--) {
    const int64_t B = 1, T = 6, H = 4, Hkv = 2, hd = 3;
    const int64_t nq = B * T * H * hd, nkv = B * T * Hkv * hd, nl = B * H * T;
    double *in[3] = {h_dbl(nq), h_dbl(nkv), h_dbl(nkv)}, *dout = h_dbl(nq);
    for (int64_t i = 0; i < nq; i++) in[0][i] = rnd_normal(), dout[i] = rnd_normal();
    for (int64_t i = 0; i < nkv; i++) in[1][i] = rnd_normal(), in[2][i] = rnd_normal();
    double *out = h_dbl(nq), *lse = h_dbl(nl), *g[3] = {h_dbl(nq), h_dbl(nkv), h_dbl(nkv)};
    att_ref_forward(in[0], in[1], in[2], B, T, H, Hkv, hd, causal, out, lse);
    att_ref_backward(in[0], in[1], in[2], dout, lse, B, T, H, Hkv, hd, causal, g[0], g[1], g[2]);
    const int64_t sizes[3] = {nq, nkv, nkv};
    for (int a = 0; a < 3; a++)
      for (int64_t i = 0; i < sizes[a]; i++) {
        double f[2];
        const double x0 = in[a][i], h = 1e-5;
        for (int sgn = 0; sgn < 2; sgn++) {
          in[a][i] = x0 + (sgn ? -h : h);
          att_ref_forward(in[0], in[1], in[2], B, T, H, Hkv, hd, causal, out, lse);
          f[sgn] = 0.0;
          for (int64_t j = 0; j < nq; j++) f[sgn] += dout[j] * out[j];
        }
        in[a][i] = x0;
        const double fd = (f[0] - f[1]) / (2 * h);
        cr_assert(fabs(fd - g[a][i]) <= 1e-6 * (1.0 + fabs(fd)),
                  "d%s[%lld] (causal %d): reference %.12g, finite difference %.12g (seed %lu)",
                  &"q\0k\0v"[2 * a], (long long)i, causal, g[a][i], fd, g_seed);
      }
    for (int a = 0; a < 3; a++) free(in[a]), free(g[a]);
    free(dout), free(out), free(lse);
  }
}

static void attention_case(weft_device dev, int64_t B, int64_t T, int64_t H, int64_t Hkv,
                           int64_t hd, bool causal, const char *label, double tol) {
  const int64_t nq = B * T * H * hd, nkv = B * T * Hkv * hd, nl = B * H * T;
  float *q = h_normal(nq, 1.0), *k = h_normal(nkv, 1.0), *v = h_normal(nkv, 1.0);
  float *dout = h_normal(nq, 1.0);
  double *qd = to_dbl(q, nq), *kd = to_dbl(k, nkv), *vd = to_dbl(v, nkv), *dod = to_dbl(dout, nq);
  double *out = h_dbl(nq), *lse = h_dbl(nl), *gq = h_dbl(nq), *gk = h_dbl(nkv), *gv = h_dbl(nkv);
  att_ref_forward(qd, kd, vd, B, T, H, Hkv, hd, causal, out, lse);
  att_ref_backward(qd, kd, vd, dod, lse, B, T, H, Hkv, hd, causal, gq, gk, gv);
  const size_t sb = weft_backend_attention_scratch_bytes(dev, B, T, H, Hkv, hd);
  void *scratch = dnan(dev, sb);
  float *dq = dupf(dev, q, nq), *dk = dupf(dev, k, nkv), *dv = dupf(dev, v, nkv);
  float *ddout = dupf(dev, dout, nq);
  float *dO = dnan(dev, (size_t)nq * 4), *dL = dnan(dev, (size_t)nl * 4);
  OK(weft_backend_attention_forward(dev, dO, dL, dq, dk, dv, B, T, H, Hkv, hd, causal, scratch));
  char what[128];
  float *got = downf(dev, dO, nq);
  snprintf(what, sizeof what, "attention_forward out, %s", label);
  expect_close(what, got, out, nq, tol);
  free(got);
  got = downf(dev, dL, nl);
  snprintf(what, sizeof what, "attention_forward lse, %s", label);
  expect_close(what, got, lse, nl, tol);
  free(got);
  float *g1 = dnan(dev, (size_t)nq * 4), *g2 = dnan(dev, (size_t)nkv * 4),
        *g3 = dnan(dev, (size_t)nkv * 4);
  dpoison(dev, scratch, sb);
  OK(weft_backend_attention_backward(dev, g1, g2, g3, ddout, dq, dk, dv, dL, dO, B, T, H, Hkv, hd,
                                     causal, scratch));
  const float *gs[3] = {g1, g2, g3};
  const double *refs[3] = {gq, gk, gv};
  const int64_t ns[3] = {nq, nkv, nkv};
  for (int i = 0; i < 3; i++) {
    got = downf(dev, gs[i], ns[i]);
    snprintf(what, sizeof what, "attention_backward d%s, %s", &"q\0k\0v"[2 * i], label);
    expect_close(what, got, refs[i], ns[i], tol);
    free(got);
  }
  free(q), free(k), free(v), free(dout), free(qd), free(kd), free(vd), free(dod);
  free(out), free(lse), free(gq), free(gk), free(gv);
  weft_free(scratch), weft_free(dq), weft_free(dk), weft_free(dv), weft_free(ddout);
  weft_free(dO), weft_free(dL), weft_free(g1), weft_free(g2), weft_free(g3);
}

BACKEND_TEST(attention_forward_backward_gqa_over_three_query_blocks_match_double_reference) {
  seed_tests(171);
  attention_case(dev, 2, 130, 4, 2, 8, true, "GQA B=2 T=130 H=4 Hkv=2 hd=8", 1e-5);
}

BACKEND_TEST(attention_forward_backward_mha_and_mqa_match_double_reference) {
  seed_tests(172);
  attention_case(dev, 1, 67, 3, 3, 6, true, "MHA B=1 T=67 H=3 hd=6", 1e-5);
  attention_case(dev, 2, 20, 4, 1, 4, true, "MQA B=2 T=20 H=4 Hkv=1 hd=4", 1e-5);
  attention_case(dev, 1, 1, 2, 1, 5, true, "T=1", 1e-5);
}

/* Non-causal (every query sees all T keys): over three query blocks of
 * the CPU (64 rows) and two of the device (128), so a block's keys reach
 * past its own rows; GQA, MHA, MQA and T = 1. */
BACKEND_TEST(non_causal_attention_forward_backward_match_double_reference) {
  seed_tests(173);
  attention_case(dev, 2, 130, 4, 2, 8, false, "non-causal GQA B=2 T=130 H=4 Hkv=2 hd=8", 1e-5);
  attention_case(dev, 1, 67, 3, 3, 6, false, "non-causal MHA B=1 T=67 H=3 hd=6", 1e-5);
  attention_case(dev, 2, 20, 4, 1, 4, false, "non-causal MQA B=2 T=20 H=4 Hkv=1 hd=4", 1e-5);
  attention_case(dev, 1, 1, 2, 1, 5, false, "non-causal T=1", 1e-5);
}

/* The causal and non-causal results differ (the flag reaches the kernel):
 * the first query row sees only key 0 when causal, so its output is v's
 * row 0 exactly; non-causal it is a mix of all rows. */
BACKEND_TEST(causal_flag_changes_the_result_and_causal_row_zero_is_v_row_zero) {
  seed_tests(174);
  const int64_t B = 1, T = 5, H = 2, Hkv = 1, hd = 4;
  const int64_t nq = B * T * H * hd, nkv = B * T * Hkv * hd, nl = B * H * T;
  float *q = h_normal(nq, 1.0), *k = h_normal(nkv, 1.0), *v = h_normal(nkv, 1.0);
  const size_t sb = weft_backend_attention_scratch_bytes(dev, B, T, H, Hkv, hd);
  void *scratch = dnan(dev, sb);
  float *dq = dupf(dev, q, nq), *dk = dupf(dev, k, nkv), *dv = dupf(dev, v, nkv);
  float *o[2], *dL = dnan(dev, (size_t)nl * 4);
  for (int c = 0; c < 2; c++) {
    float *dO = dnan(dev, (size_t)nq * 4);
    OK(weft_backend_attention_forward(dev, dO, dL, dq, dk, dv, B, T, H, Hkv, hd, c == 0, scratch));
    o[c] = downf(dev, dO, nq);
    weft_free(dO);
  }
  for (int64_t h = 0; h < H; h++)
    for (int64_t e = 0; e < hd; e++)
      cr_assert_eq(o[0][h * hd + e], v[e], "causal row 0 head %lld [%lld]: %g, v %g", (long long)h,
                   (long long)e, (double)o[0][h * hd + e], (double)v[e]);
  double diff = 0;
  for (int64_t i = 0; i < H * hd; i++) diff = fmax(diff, fabs((double)o[0][i] - (double)o[1][i]));
  cr_assert(diff > 1e-3, "row 0 is the same causal and non-causal (max diff %g)", diff);
  free(q), free(k), free(v), free(o[0]), free(o[1]);
  weft_free(scratch), weft_free(dq), weft_free(dk), weft_free(dv), weft_free(dL);
}

/* hd = 0: every score is 0, so each row's lse is the log of the number of
 * keys it sees: t + 1 causal, T otherwise. */
BACKEND_TEST(attention_without_features_gives_lse_of_the_key_count) {
  const int64_t B = 1, T = 4, H = 2, Hkv = 1, hd = 0, nl = B * H * T;
  for (int c = 0; c < 2; c++) {
    const bool causal = c == 0;
    float *dL = dnan(dev, (size_t)nl * 4), *f = dnan(dev, 64);
    OK(weft_backend_attention_forward(dev, f, dL, f, f, f, B, T, H, Hkv, hd, causal, f));
    float *got = downf(dev, dL, nl);
    for (int64_t i = 0; i < nl; i++) {
      const double want = log((double)(causal ? i % T + 1 : T));
      cr_assert(fabs((double)got[i] - want) <= 1e-6, "causal %d lse[%lld] = %g, want %g", c,
                (long long)i, (double)got[i], want);
    }
    free(got);
    weft_free(dL), weft_free(f);
  }
}

BACKEND_TEST(matmul_precision_bf16_rounds_operands_or_is_unsupported) {
  seed_tests(153);
  const weft_backend *be = weft_backend_get(dev);
  if (!be->set_matmul_precision) {
    weft_clear_error();
    cr_assert_eq(weft_device_set_matmul_precision(dev, WEFT_MATMUL_BF16), WEFT_ERR_UNSUPPORTED);
    cr_assert_eq(weft_device_matmul_precision(dev), WEFT_MATMUL_F32);
    return;
  }
  const int64_t m = 23, n = 41, k = 37;
  float *a = h_normal(m * k, 1.0), *b = h_normal(k * n, 1.0);
  float *da = dupf(dev, a, m * k), *db = dupf(dev, b, k * n), *dc = dnan(dev, (size_t)(m * n) * 4);
  OK(weft_device_set_matmul_precision(dev, WEFT_MATMUL_BF16));
  OK(weft_backend_sgemm(dev, false, false, m, n, k, 1.0f, da, k, db, n, 0.0f, dc, n));
  OK(weft_device_set_matmul_precision(dev, WEFT_MATMUL_F32));
  float *got = downf(dev, dc, m * n);
  double *want = h_dbl(m * n);
  gemm_ref(false, false, m, n, k, 1.0, a, k, b, n, 0.0, NULL, n, want);
  expect_close("sgemm at BF16 precision vs the exact product", got, want, m * n, 1e-2);
  for (int64_t i = 0; i < m * k; i++) a[i] = (float)round_once(WEFT_BF16, a[i]);
  for (int64_t i = 0; i < k * n; i++) b[i] = (float)round_once(WEFT_BF16, b[i]);
  gemm_ref(false, false, m, n, k, 1.0, a, k, b, n, 0.0, NULL, n, want);
  expect_close("sgemm at BF16 precision vs the bf16-rounded operands", got, want, m * n, 1e-5);
  free(got);
  /* TF32: 10-bit mantissas, close to the exact product */
  float *a0 = downf(dev, da, m * k), *b0 = downf(dev, db, k * n);
  gemm_ref(false, false, m, n, k, 1.0, a0, k, b0, n, 0.0, NULL, n, want);
  OK(weft_device_set_matmul_precision(dev, WEFT_MATMUL_TF32));
  OK(weft_backend_sgemm(dev, false, false, m, n, k, 1.0f, da, k, db, n, 0.0f, dc, n));
  got = downf(dev, dc, m * n);
  expect_close("sgemm at TF32 precision vs the exact product", got, want, m * n, 5e-3);
  /* attention's products at BF16 precision */
  OK(weft_device_set_matmul_precision(dev, WEFT_MATMUL_BF16));
  attention_case(dev, 2, 70, 4, 2, 8, true, "GQA B=2 T=70 H=4 Hkv=2 hd=8 at BF16 precision", 1e-2);
  attention_case(dev, 2, 70, 4, 2, 8, false,
                 "non-causal GQA B=2 T=70 H=4 Hkv=2 hd=8 at BF16 precision", 1e-2);
  OK(weft_device_set_matmul_precision(dev, WEFT_MATMUL_F32));
  free(a), free(b), free(got), free(want), free(a0), free(b0);
  weft_free(da), weft_free(db), weft_free(dc);
}

/* ------------------------------------------------- swiglu and residual */

BACKEND_TEST(swiglu_and_residual_forward_backward_match_references_in_place_too) {
  seed_tests(181);
  const int64_t n = 1003;
  float *a = h_unif(n, -8.0, 8.0), *b = h_normal(n, 1.0), *dout = h_normal(n, 1.0);
  double *wo = h_dbl(n), *wa = h_dbl(n), *wb = h_dbl(n);
  for (int64_t i = 0; i < n; i++) {
    const double s = 1.0 / (1.0 + exp(-(double)a[i])), silu = a[i] * s;
    wo[i] = silu * b[i];
    wa[i] = (double)dout[i] * b[i] * s * (1.0 + a[i] * (1.0 - s));
    wb[i] = (double)dout[i] * silu;
  }
  for (int inplace = 0; inplace < 2; inplace++) {
    float *da = dupf(dev, a, n), *db = dupf(dev, b, n), *dd = dupf(dev, dout, n);
    float *o = inplace ? da : dnan(dev, (size_t)n * 4);
    OK(weft_backend_swiglu_forward(dev, o, da, db, n));
    float *got = downf(dev, o, n);
    expect_close(inplace ? "swiglu_forward (out is a)" : "swiglu_forward", got, wo, n, 1e-5);
    free(got);
    upf(dev, da, a, n);
    float *ga = inplace ? da : dnan(dev, (size_t)n * 4),
          *gb = inplace ? db : dnan(dev, (size_t)n * 4);
    OK(weft_backend_swiglu_backward(dev, ga, gb, dd, da, db, n));
    got = downf(dev, ga, n);
    expect_close(inplace ? "swiglu_backward da (da is a)" : "swiglu_backward da", got, wa, n, 1e-5);
    free(got);
    got = downf(dev, gb, n);
    expect_close(inplace ? "swiglu_backward db (db is b)" : "swiglu_backward db", got, wb, n, 1e-5);
    free(got);
    if (!inplace) weft_free(o), weft_free(ga), weft_free(gb);
    weft_free(da), weft_free(db), weft_free(dd);
  }
  /* residual: one f32 add per element, exact */
  float *x = h_normal(n, 1.0), *y = h_normal(n, 1.0);
  double *w = h_dbl(n);
  for (int inplace = 0; inplace < 2; inplace++) {
    float *dx = dupf(dev, x, n), *dy = dupf(dev, y, n),
          *o = inplace ? dx : dnan(dev, (size_t)n * 4);
    OK(weft_backend_residual_forward(dev, o, dx, dy, n));
    for (int64_t i = 0; i < n; i++) w[i] = (float)((double)x[i] + y[i]);
    float *got = downf(dev, o, n);
    expect_values(inplace ? "residual_forward (out is a)" : "residual_forward", got, WEFT_F32, w,
                  n);
    free(got);
    if (!inplace) weft_free(o);
    weft_free(dx), weft_free(dy);
  }
  for (int which = 0; which < 3; which++) { /* both, da only, db only */
    float *dx = dupf(dev, x, n), *dy = dupf(dev, y, n), *dd = dupf(dev, dout, n);
    OK(weft_backend_residual_backward(dev, which == 2 ? NULL : dx, which == 1 ? NULL : dy, dd, n));
    float *gx = downf(dev, dx, n), *gy = downf(dev, dy, n);
    for (int64_t i = 0; i < n; i++) w[i] = which == 2 ? x[i] : (float)((double)x[i] + dout[i]);
    expect_values("residual_backward da (+=)", gx, WEFT_F32, w, n);
    for (int64_t i = 0; i < n; i++) w[i] = which == 1 ? y[i] : (float)((double)y[i] + dout[i]);
    expect_values("residual_backward db (+=)", gy, WEFT_F32, w, n);
    free(gx), free(gy);
    weft_free(dx), weft_free(dy), weft_free(dd);
  }
  free(a), free(b), free(dout), free(wo), free(wa), free(wb), free(x), free(y), free(w);
}

/* ------------------------- layernorm, activations, softmax, dropout
 * (backend version 2). References in double; each backward reference is
 * checked against central differences of its forward (suite reference). */

/* LayerNorm in double (torch's formula, biased variance): out (N, C), mean
 * and rstd (N, either may be NULL); w and b may be NULL (1 and 0). */
static void ln_ref_forward(const double *x, const double *w, const double *b, int64_t N, int64_t C,
                           double eps, double *out, double *mean, double *rstd) {
  for (int64_t n = 0; n < N; n++) {
    const double *xr = x + n * C;
    double s = 0.0, v = 0.0;
    for (int64_t c = 0; c < C; c++) s += xr[c];
    const double m = s / (double)C;
    for (int64_t c = 0; c < C; c++) v += (xr[c] - m) * (xr[c] - m);
    const double r = 1.0 / sqrt(v / (double)C + eps);
    if (mean) mean[n] = m;
    if (rstd) rstd[n] = r;
    for (int64_t c = 0; c < C; c++)
      out[n * C + c] = (xr[c] - m) * r * (w ? w[c] : 1.0) + (b ? b[c] : 0.0);
  }
}

/* The gradients of sum(dout * out) by the documented formulas: dinp (N, C),
 * dw and db (C), all overwritten. */
static void ln_ref_backward(const double *x, const double *w, const double *dout, int64_t N,
                            int64_t C, double eps, double *dinp, double *dw, double *db) {
  double *xh = h_dbl(C);
  for (int64_t c = 0; c < C; c++) dw[c] = db[c] = 0.0;
  for (int64_t n = 0; n < N; n++) {
    const double *xr = x + n * C, *dy = dout + n * C;
    double s = 0.0, v = 0.0;
    for (int64_t c = 0; c < C; c++) s += xr[c];
    const double m = s / (double)C;
    for (int64_t c = 0; c < C; c++) v += (xr[c] - m) * (xr[c] - m);
    const double r = 1.0 / sqrt(v / (double)C + eps);
    double sg = 0.0, sgx = 0.0;
    for (int64_t c = 0; c < C; c++) {
      xh[c] = (xr[c] - m) * r;
      const double g = dy[c] * (w ? w[c] : 1.0);
      sg += g;
      sgx += g * xh[c];
    }
    for (int64_t c = 0; c < C; c++) {
      const double g = dy[c] * (w ? w[c] : 1.0);
      dinp[n * C + c] = r * (g - sg / (double)C - xh[c] * sgx / (double)C);
      dw[c] += dy[c] * xh[c];
      db[c] += dy[c];
    }
  }
  free(xh);
}

#define GELU_K_D 0.79788456080286535588 /* sqrt(2 / pi) */
#define INV_SQRT_2PI_D 0.39894228040143267794

static double act_ref(weft_activation a, double x) {
  switch (a) {
    case WEFT_ACT_GELU_TANH:
      return 0.5 * x * (1.0 + tanh(GELU_K_D * (x + 0.044715 * x * x * x)));
    case WEFT_ACT_GELU_ERF:
      return 0.5 * x * (1.0 + erf(x / sqrt(2.0)));
    case WEFT_ACT_RELU:
      return x > 0.0 ? x : 0.0;
    case WEFT_ACT_SILU:
      return x / (1.0 + exp(-x));
    default:
      cr_assert_fail("act_ref: activation %d", (int)a);
  }
  return 0.0;
}
static double act_ref_grad(weft_activation a, double x) {
  switch (a) {
    case WEFT_ACT_GELU_TANH: {
      const double t = tanh(GELU_K_D * (x + 0.044715 * x * x * x));
      return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * GELU_K_D * (1.0 + 3.0 * 0.044715 * x * x);
    }
    case WEFT_ACT_GELU_ERF:
      return 0.5 * (1.0 + erf(x / sqrt(2.0))) + x * exp(-0.5 * x * x) * INV_SQRT_2PI_D;
    case WEFT_ACT_RELU:
      return x > 0.0 ? 1.0 : 0.0;
    case WEFT_ACT_SILU: {
      const double s = 1.0 / (1.0 + exp(-x));
      return s * (1.0 + x * (1.0 - s));
    }
    default:
      cr_assert_fail("act_ref_grad: activation %d", (int)a);
  }
  return 0.0;
}

static void softmax_ref(const double *x, int64_t N, int64_t C, double *y) {
  for (int64_t n = 0; n < N; n++) {
    double mx = -INFINITY, s = 0.0;
    for (int64_t c = 0; c < C; c++) mx = fmax(mx, x[n * C + c]);
    for (int64_t c = 0; c < C; c++) s += exp(x[n * C + c] - mx);
    for (int64_t c = 0; c < C; c++) y[n * C + c] = exp(x[n * C + c] - mx) / s;
  }
}
/* dx = y * (dy - rowsum(dy * y)), overwritten. */
static void softmax_ref_backward(const double *y, const double *dy, int64_t N, int64_t C,
                                 double *dx) {
  for (int64_t n = 0; n < N; n++) {
    double s = 0.0;
    for (int64_t c = 0; c < C; c++) s += dy[n * C + c] * y[n * C + c];
    for (int64_t c = 0; c < C; c++) dx[n * C + c] = y[n * C + c] * (dy[n * C + c] - s);
  }
}

static void dropout_ref(const double *x, const float *u, double p, int64_t n, double *out) {
  for (int64_t i = 0; i < n; i++) out[i] = (double)u[i] >= p ? x[i] / (1.0 - p) : 0.0;
}

/* Central differences of f = sum(dout * forward(x)) at x[i], in double. */
typedef void (*fd_forward)(const double *x, void *ctx, double *out);
static double fd_at(double *x, int64_t i, const double *dout, int64_t nout, fd_forward fwd,
                    void *ctx, double *scratch) {
  const double x0 = x[i], h = 1e-5;
  double f[2];
  for (int sgn = 0; sgn < 2; sgn++) {
    x[i] = x0 + (sgn ? -h : h);
    fwd(x, ctx, scratch);
    f[sgn] = 0.0;
    for (int64_t j = 0; j < nout; j++) f[sgn] += dout[j] * scratch[j];
  }
  x[i] = x0;
  return (f[0] - f[1]) / (2 * h);
}
static void expect_fd(const char *what, int64_t i, double ref, double fd) {
  cr_assert(fabs(fd - ref) <= 1e-6 * (1.0 + fabs(fd)),
            "%s[%lld]: reference %.12g, finite difference %.12g (seed %lu)", what, (long long)i,
            ref, fd, g_seed);
}

/* LayerNorm as a function of one of x, w, b (which), the others fixed. */
typedef struct ln_ctx {
  const double *x, *w, *b;
  int which;
  int64_t N, C;
} ln_ctx;
static void ln_fd_forward(const double *v, void *ctx, double *out) {
  const ln_ctx *c = ctx;
  ln_ref_forward(c->which == 0 ? v : c->x, c->which == 1 ? v : c->w, c->which == 2 ? v : c->b, c->N,
                 c->C, 1e-5, out, NULL, NULL);
}
typedef struct act_ctx {
  weft_activation a;
  int64_t n;
} act_ctx;
static void act_fd_forward(const double *v, void *ctx, double *out) {
  const act_ctx *c = ctx;
  for (int64_t i = 0; i < c->n; i++) out[i] = act_ref(c->a, v[i]);
}
typedef struct sm_ctx {
  int64_t N, C;
} sm_ctx;
static void sm_fd_forward(const double *v, void *ctx, double *out) {
  const sm_ctx *c = ctx;
  softmax_ref(v, c->N, c->C, out);
}
typedef struct drop_ctx {
  const float *u;
  double p;
  int64_t n;
} drop_ctx;
static void drop_fd_forward(const double *v, void *ctx, double *out) {
  const drop_ctx *c = ctx;
  dropout_ref(v, c->u, c->p, c->n, out);
}

Test(reference, layernorm_activation_softmax_dropout_backward_references_match_finite_differences) {
  seed_tests(190);
  /* LayerNorm: d/dx with and without the affine, d/dw, d/db */
  const int64_t N = 3, C = 5, NC = N * C;
  double *x = h_dbl(NC), *w = h_dbl(C), *b = h_dbl(C), *dout = h_dbl(NC), *scratch = h_dbl(NC);
  double *gi = h_dbl(NC), *gw = h_dbl(C), *gb = h_dbl(C);
  for (int64_t i = 0; i < NC; i++) x[i] = 1.0 + 2.0 * rnd_normal(), dout[i] = rnd_normal();
  for (int64_t c = 0; c < C; c++) w[c] = rnd_normal(), b[c] = rnd_normal();
  for (int affine = 0; affine < 2; affine++) {
    ln_ctx ctx = {x, affine ? w : NULL, affine ? b : NULL, 0, N, C};
    ln_ref_backward(x, ctx.w, dout, N, C, 1e-5, gi, gw, gb);
    for (int64_t i = 0; i < NC; i++)
      expect_fd(affine ? "layernorm dinp" : "layernorm dinp (no affine)", i, gi[i],
                fd_at(x, i, dout, NC, ln_fd_forward, &ctx, scratch));
    if (!affine) continue;
    for (int which = 1; which < 3; which++) {
      ctx.which = which;
      double *v = which == 1 ? w : b;
      for (int64_t c = 0; c < C; c++)
        expect_fd(which == 1 ? "layernorm dweight" : "layernorm dbias", c,
                  which == 1 ? gw[c] : gb[c], fd_at(v, c, dout, NC, ln_fd_forward, &ctx, scratch));
    }
  }
  /* activations, away from relu's kink */
  const int64_t n = 41;
  double *ax = h_dbl(n), *ad = h_dbl(n), *as = h_dbl(n);
  for (int64_t i = 0; i < n; i++) {
    ax[i] = rnd_range(-5.0, 5.0);
    if (fabs(ax[i]) < 1e-3) ax[i] = 0.5;
    ad[i] = rnd_normal();
  }
  for (int a = 0; a < WEFT_ACT_COUNT; a++) {
    act_ctx ctx = {(weft_activation)a, n};
    char what[64];
    snprintf(what, sizeof what, "%s'", weft_activation_name((weft_activation)a));
    for (int64_t i = 0; i < n; i++)
      expect_fd(what, i, ad[i] * act_ref_grad((weft_activation)a, ax[i]),
                fd_at(ax, i, ad, n, act_fd_forward, &ctx, as));
  }
  /* softmax */
  {
    sm_ctx ctx = {N, C};
    double *y = h_dbl(NC);
    softmax_ref(x, N, C, y);
    softmax_ref_backward(y, dout, N, C, gi);
    for (int64_t i = 0; i < NC; i++)
      expect_fd("softmax dinp", i, gi[i], fd_at(x, i, dout, NC, sm_fd_forward, &ctx, scratch));
    free(y);
  }
  /* dropout: the backward is the forward applied to dout */
  {
    float *u = h_unif(NC, 0.0, 1.0);
    drop_ctx ctx = {u, 0.4, NC};
    dropout_ref(dout, u, 0.4, NC, gi);
    for (int64_t i = 0; i < NC; i++)
      expect_fd("dropout dinp", i, gi[i], fd_at(x, i, dout, NC, drop_fd_forward, &ctx, scratch));
    free(u);
  }
  free(x), free(w), free(b), free(dout), free(scratch), free(gi), free(gw), free(gb);
  free(ax), free(ad), free(as);
}

Test(reference, activation_names_are_torch_like_and_unknown_is_a_question_mark) {
  cr_assert_str_eq(weft_activation_name(WEFT_ACT_GELU_TANH), "gelu_tanh");
  cr_assert_str_eq(weft_activation_name(WEFT_ACT_GELU_ERF), "gelu_erf");
  cr_assert_str_eq(weft_activation_name(WEFT_ACT_RELU), "relu");
  cr_assert_str_eq(weft_activation_name(WEFT_ACT_SILU), "silu");
  cr_assert_str_eq(weft_activation_name(WEFT_ACT_COUNT), "?");
  cr_assert_str_eq(weft_activation_name((weft_activation)-1), "?");
}

/* The bytes at d (n floats on dev) are still those of h. */
static void expect_untouched(weft_device dev, const char *what, const float *d, const float *h,
                             int64_t n) {
  float *got = downf(dev, d, n);
  expect_same_bytes(what, got, h, n, sizeof(float));
  free(got);
}
static float *h_nan(int64_t n) {
  float *x = xmalloc((size_t)n * sizeof(float));
  memset(x, 0xFF, (size_t)n * sizeof(float));
  return x;
}

BACKEND_TEST(layernorm_forward_backward_with_and_without_affine_match_references) {
  seed_tests(185);
  const int64_t shapes[3][2] = {{7, 37}, {3, 1}, {300, 45}}; /* 300 rows: 2 chunks on a device */
  const float eps = 1e-5f;
  static const char *const aff_names[4] = {"weight and bias", "weight only", "bias only",
                                           "no affine"};
  char what[192];
  for (int si = 0; si < 3; si++) {
    const int64_t N = shapes[si][0], C = shapes[si][1], NC = N * C;
    float *x = h_normal(NC, 2.0), *w = h_normal(C, 1.0), *b = h_normal(C, 1.0);
    for (int64_t i = 0; i < NC; i++) x[i] += 3.0f; /* rows with a mean away from 0 */
    float *dout = h_normal(NC, 1.0), *dinp0 = h_normal(NC, 1.0);
    float *dw0 = h_normal(C, 1.0), *db0 = h_normal(C, 1.0), *nan_nc = h_nan(NC);
    double *xd = to_dbl(x, NC), *wd = to_dbl(w, C), *bd = to_dbl(b, C), *dod = to_dbl(dout, NC);
    double *ref = h_dbl(NC), *rm = h_dbl(N), *rr = h_dbl(N);
    double *gi = h_dbl(NC), *gw = h_dbl(C), *gb = h_dbl(C), *want = h_dbl(NC);
    float *dx = dupf(dev, x, NC), *dwt = dupf(dev, w, C), *dbs = dupf(dev, b, C);
    float *ddout = dupf(dev, dout, NC), *dy = dnan(dev, (size_t)NC * 4);
    float *dmean = dnan(dev, (size_t)N * 4), *drstd = dnan(dev, (size_t)N * 4);
    for (int aff = 0; aff < 4; aff++) {
      const bool hw = aff <= 1, hb = aff == 0 || aff == 2;
      const float *pw = hw ? dwt : NULL, *pb = hb ? dbs : NULL;
      ln_ref_forward(xd, hw ? wd : NULL, hb ? bd : NULL, N, C, eps, ref, rm, rr);
      dpoison(dev, dy, (size_t)NC * 4);
      dpoison(dev, dmean, (size_t)N * 4);
      dpoison(dev, drstd, (size_t)N * 4);
      OK(weft_backend_layernorm_forward(dev, dy, dmean, drstd, dx, pw, pb, N, C, eps));
      float *got = downf(dev, dy, NC);
      snprintf(what, sizeof what, "layernorm_forward out (N %lld, C %lld, %s)", (long long)N,
               (long long)C, aff_names[aff]);
      expect_close(what, got, ref, NC, 1e-5);
      free(got);
      got = downf(dev, dmean, N);
      expect_close("layernorm_forward mean", got, rm, N, 1e-5);
      free(got);
      got = downf(dev, drstd, N);
      expect_close("layernorm_forward rstd", got, rr, N, 1e-5);
      free(got);
      if (aff == 0) { /* in place: out is inp */
        float *io = dupf(dev, x, NC), *m2 = dnan(dev, (size_t)N * 4);
        float *r2 = dnan(dev, (size_t)N * 4);
        OK(weft_backend_layernorm_forward(dev, io, m2, r2, io, pw, pb, N, C, eps));
        got = downf(dev, io, NC);
        expect_close("layernorm_forward (out is inp)", got, ref, NC, 1e-5);
        free(got);
        weft_free(io), weft_free(m2), weft_free(r2);
      }

      /* backward from this forward's mean and rstd: = and +=; with every
       * output, dinp only, dweight and dbias only (the affine ones only) */
      ln_ref_backward(xd, hw ? wd : NULL, dod, N, C, eps, gi, gw, gb);
      for (int acc = 0; acc < 2; acc++)
        for (int outs = 0; outs < (aff == 0 ? 3 : 1); outs++) {
          const bool want_i = outs != 2, want_p = outs != 1;
          float *gdi = acc ? dupf(dev, dinp0, NC) : dnan(dev, (size_t)NC * 4);
          float *gdw = dupf(dev, dw0, C), *gdb = dupf(dev, db0, C);
          OK(weft_backend_layernorm_backward(dev, want_i ? gdi : NULL, want_p ? gdw : NULL,
                                             want_p ? gdb : NULL, ddout, dx, pw, dmean, drstd, N, C,
                                             acc));
          snprintf(what, sizeof what, "layernorm_backward dinp (%s, %s, N %lld, C %lld)",
                   acc ? "+=" : "=", aff_names[aff], (long long)N, (long long)C);
          if (want_i) {
            for (int64_t i = 0; i < NC; i++) want[i] = (acc ? dinp0[i] : 0.0) + gi[i];
            got = downf(dev, gdi, NC);
            expect_close(what, got, want, NC, 1e-5);
            free(got);
          } else {
            expect_untouched(dev, "layernorm_backward dinp (NULL: untouched)", gdi,
                             acc ? dinp0 : nan_nc, NC);
          }
          if (want_p) {
            for (int64_t c = 0; c < C; c++) want[c] = dw0[c] + gw[c];
            got = downf(dev, gdw, C);
            expect_close("layernorm_backward dweight (+=)", got, want, C, 1e-5);
            free(got);
            for (int64_t c = 0; c < C; c++) want[c] = db0[c] + gb[c];
            got = downf(dev, gdb, C);
            expect_close("layernorm_backward dbias (+=)", got, want, C, 1e-5);
            free(got);
          } else {
            expect_untouched(dev, "layernorm_backward dweight (NULL: untouched)", gdw, dw0, C);
            expect_untouched(dev, "layernorm_backward dbias (NULL: untouched)", gdb, db0, C);
          }
          if (aff == 0 && acc && outs == 0) { /* deterministic: the same bits again */
            float *h1[3] = {downf(dev, gdi, NC), downf(dev, gdw, C), downf(dev, gdb, C)};
            upf(dev, gdi, dinp0, NC), upf(dev, gdw, dw0, C), upf(dev, gdb, db0, C);
            OK(weft_backend_layernorm_backward(dev, gdi, gdw, gdb, ddout, dx, pw, dmean, drstd, N,
                                               C, true));
            expect_untouched(dev, "layernorm_backward dinp (second run)", gdi, h1[0], NC);
            expect_untouched(dev, "layernorm_backward dweight (second run)", gdw, h1[1], C);
            expect_untouched(dev, "layernorm_backward dbias (second run)", gdb, h1[2], C);
            free(h1[0]), free(h1[1]), free(h1[2]);
          }
          weft_free(gdi), weft_free(gdw), weft_free(gdb);
        }
    }
    OK(weft_backend_layernorm_forward(dev, NULL, NULL, NULL, NULL, NULL, NULL, 0, C, eps));
    OK(weft_backend_layernorm_backward(dev, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0, C,
                                       false));
    free(x), free(w), free(b), free(dout), free(dinp0), free(dw0), free(db0), free(nan_nc);
    free(xd), free(wd), free(bd), free(dod), free(ref), free(rm), free(rr);
    free(gi), free(gw), free(gb), free(want);
    weft_free(dx), weft_free(dwt), weft_free(dbs), weft_free(ddout), weft_free(dy);
    weft_free(dmean), weft_free(drstd);
  }
}

BACKEND_TEST(activation_forward_backward_every_kind_match_references_in_place_too) {
  seed_tests(186);
  const int64_t n = 1003;
  float *x = h_unif(n, -6.0, 6.0), *dout = h_normal(n, 1.0), *dinp0 = h_normal(n, 1.0);
  /* relu'(0) = 0; saturated tails (tanh = 1, exp overflow); tiny values */
  const float special[8] = {0.0f, -0.0f, 1e-4f, -1e-4f, 30.0f, -30.0f, 100.0f, -100.0f};
  for (int i = 0; i < 8; i++) x[i * 97] = special[i];
  double *wf = h_dbl(n), *wb = h_dbl(n), *want = h_dbl(n);
  float *dx = dupf(dev, x, n), *ddout = dupf(dev, dout, n);
  char what[128];
  for (int a = 0; a < WEFT_ACT_COUNT; a++) {
    const weft_activation act = (weft_activation)a;
    const char *name = weft_activation_name(act);
    for (int64_t i = 0; i < n; i++) {
      wf[i] = act_ref(act, x[i]);
      wb[i] = (double)dout[i] * act_ref_grad(act, x[i]);
    }
    for (int inplace = 0; inplace < 2; inplace++) {
      float *io = inplace ? dupf(dev, x, n) : NULL, *o = inplace ? io : dnan(dev, (size_t)n * 4);
      OK(weft_backend_activation_forward(dev, act, o, inplace ? io : dx, n));
      float *got = downf(dev, o, n);
      snprintf(what, sizeof what, "activation_forward %s%s", name, inplace ? " (out is inp)" : "");
      expect_close(what, got, wf, n, 1e-5);
      free(got);
      weft_free(o);
    }
    for (int mode = 0; mode < 3; mode++) { /* =, +=, = with dinp aliasing dout */
      float *g = mode == 0 ? dnan(dev, (size_t)n * 4) : dupf(dev, mode == 1 ? dinp0 : dout, n);
      OK(weft_backend_activation_backward(dev, act, g, mode == 2 ? g : ddout, dx, n, mode == 1));
      for (int64_t i = 0; i < n; i++) want[i] = (mode == 1 ? dinp0[i] : 0.0) + wb[i];
      float *got = downf(dev, g, n);
      snprintf(what, sizeof what, "activation_backward %s (%s)", name,
               mode == 0   ? "="
               : mode == 1 ? "+="
                           : "dinp is dout");
      expect_close(what, got, want, n, 1e-5);
      free(got);
      weft_free(g);
    }
    OK(weft_backend_activation_forward(dev, act, NULL, NULL, 0));
    OK(weft_backend_activation_backward(dev, act, NULL, NULL, NULL, 0, true));
  }
  expect_untouched(dev, "activation inputs", dx, x, n);
  free(x), free(dout), free(dinp0), free(wf), free(wb), free(want);
  weft_free(dx), weft_free(ddout);
}

/* The storage-dtype activations (activation_forward_dt / _backward_dt):
 * in bf16 and f16, the bits of this device's f32 member on the widened
 * values, rounded once (the op layer runs them instead of widening; a
 * device whose takes_dtype says so must keep to it). Sizes across the
 * CPU's 1024-element tiles and 16384-element thread chunks; f32 through
 * the _dt entry is the f32 member itself. */
static void *h_round(const float *x, weft_dtype dt, int64_t n) {
  uint16_t *h = xmalloc((size_t)n * 2);
  for (int64_t i = 0; i < n; i++)
    h[i] = dt == WEFT_BF16 ? weft_f32_to_bf16(x[i]) : weft_f32_to_f16(x[i]);
  return h;
}
static float *h_widen(const uint16_t *h, weft_dtype dt, int64_t n) {
  float *x = xmalloc((size_t)n * 4);
  for (int64_t i = 0; i < n; i++)
    x[i] = dt == WEFT_BF16 ? weft_bf16_to_f32(h[i]) : weft_f16_to_f32(h[i]);
  return x;
}

BACKEND_TEST(activation_dt_in_bf16_and_f16_is_the_f32_member_on_widened_values_rounded_once) {
  seed_tests(431);
  cr_assert(weft_backend_takes_dtype(dev, WEFT_KERNEL_ACTIVATION, WEFT_BF16));
  cr_assert(weft_backend_takes_dtype(dev, WEFT_KERNEL_ACTIVATION, WEFT_F16));
  cr_assert_not(weft_backend_takes_dtype(dev, WEFT_KERNEL_ACTIVATION, WEFT_F64));
  const int64_t n = 16384 + 1030;
  const weft_dtype dts[2] = {WEFT_BF16, WEFT_F16};
  char what[160];
  for (int k = 0; k < 2; k++) {
    const weft_dtype dt = dts[k];
    float *x0 = h_normal(n, 3.0), *g0 = h_normal(n, 1.0), *a0 = h_normal(n, 1.0);
    uint16_t *hx = h_round(x0, dt, n), *hg = h_round(g0, dt, n), *ha = h_round(a0, dt, n);
    float *x = h_widen(hx, dt, n), *g = h_widen(hg, dt, n), *a = h_widen(ha, dt, n);
    void *dx = dup_h(dev, hx, (size_t)n * 2), *dg = dup_h(dev, hg, (size_t)n * 2);
    float *fx = dupf(dev, x, n), *fg = dupf(dev, g, n);
    for (int act = 0; act < WEFT_ACT_COUNT; act++) {
      const char *name = weft_activation_name((weft_activation)act);
      /* forward */
      void *o = dnan(dev, (size_t)n * 2);
      float *fo = dnan(dev, (size_t)n * 4);
      OK(weft_backend_activation_forward_dt(dev, (weft_activation)act, dt, o, dx, n));
      OK(weft_backend_activation_forward(dev, (weft_activation)act, fo, fx, n));
      uint16_t *got = down(dev, o, (size_t)n * 2);
      float *ref = downf(dev, fo, n);
      void *want = h_round(ref, dt, n);
      snprintf(what, sizeof what, "activation_forward_dt %s %s", name, weft_dtype_name(dt));
      expect_same_floats(what, got, want, n, dt);
      free(got), free(ref), free(want);
      weft_free(o), weft_free(fo);
      /* backward, = and += */
      for (int acc = 0; acc < 2; acc++) {
        void *d = acc ? dup_h(dev, ha, (size_t)n * 2) : dnan(dev, (size_t)n * 2);
        float *fd = acc ? dupf(dev, a, n) : dnan(dev, (size_t)n * 4);
        OK(weft_backend_activation_backward_dt(dev, (weft_activation)act, dt, d, dg, dx, n, acc));
        OK(weft_backend_activation_backward(dev, (weft_activation)act, fd, fg, fx, n, acc));
        got = down(dev, d, (size_t)n * 2);
        ref = downf(dev, fd, n);
        want = h_round(ref, dt, n);
        snprintf(what, sizeof what, "activation_backward_dt %s %s (%s)", name, weft_dtype_name(dt),
                 acc ? "+=" : "=");
        expect_same_floats(what, got, want, n, dt);
        free(got), free(ref), free(want);
        weft_free(d), weft_free(fd);
      }
    }
    free(x0), free(g0), free(a0), free(hx), free(hg), free(ha), free(x), free(g), free(a);
    weft_free(dx), weft_free(dg), weft_free(fx), weft_free(fg);
  }
  /* f32 through the _dt entry; dtypes it does not take */
  float one = 1.0f, out = 0.0f;
  if (dev == WEFT_CPU) {
    OK(weft_backend_activation_forward_dt(dev, WEFT_ACT_RELU, WEFT_F32, &out, &one, 1));
    cr_assert_eq(out, 1.0f);
  }
  weft_clear_error();
  cr_assert_eq(weft_backend_activation_forward_dt(dev, WEFT_ACT_RELU, WEFT_F64, &out, &one, 1),
               WEFT_ERR_UNSUPPORTED);
  cr_assert(strstr(weft_last_error(), "activation_forward_dt: dtype f64: takes f32, bf16 or f16"),
            "message: %s", weft_last_error());
}

/* SwiGLU and dropout the same way as the activations above. */
BACKEND_TEST(swiglu_and_dropout_dt_in_bf16_and_f16_are_the_f32_members_on_widened_values) {
  seed_tests(433);
  const int64_t n = 16384 + 1030;
  const weft_dtype dts[2] = {WEFT_BF16, WEFT_F16};
  char what[160];
  for (int k = 0; k < 2; k++) {
    const weft_dtype dt = dts[k];
    cr_assert(weft_backend_takes_dtype(dev, WEFT_KERNEL_SWIGLU, dt));
    cr_assert(weft_backend_takes_dtype(dev, WEFT_KERNEL_DROPOUT, dt));
    float *a0 = h_normal(n, 3.0), *b0 = h_normal(n, 1.0), *g0 = h_normal(n, 1.0);
    float *u = xmalloc((size_t)n * 4);
    for (int64_t i = 0; i < n; i++) u[i] = (float)(0.5 + 0.5 * tanh(rnd_normal()));
    uint16_t *ha = h_round(a0, dt, n), *hb = h_round(b0, dt, n), *hg = h_round(g0, dt, n);
    float *a = h_widen(ha, dt, n), *b = h_widen(hb, dt, n), *g = h_widen(hg, dt, n);
    void *da = dup_h(dev, ha, (size_t)n * 2), *db = dup_h(dev, hb, (size_t)n * 2),
         *dg = dup_h(dev, hg, (size_t)n * 2);
    float *fa = dupf(dev, a, n), *fb = dupf(dev, b, n), *fg = dupf(dev, g, n),
          *du = dupf(dev, u, n);
    void *o = dnan(dev, (size_t)n * 2), *o2 = dnan(dev, (size_t)n * 2);
    float *fo = dnan(dev, (size_t)n * 4), *fo2 = dnan(dev, (size_t)n * 4);
    /* swiglu forward */
    OK(weft_backend_swiglu_forward_dt(dev, dt, o, da, db, n));
    OK(weft_backend_swiglu_forward(dev, fo, fa, fb, n));
    snprintf(what, sizeof what, "swiglu_forward_dt %s", weft_dtype_name(dt));
    uint16_t *got = down(dev, o, (size_t)n * 2);
    float *ref = downf(dev, fo, n);
    void *want = h_round(ref, dt, n);
    expect_same_floats(what, got, want, n, dt);
    free(got), free(ref), free(want);
    /* swiglu backward: both grads */
    OK(weft_backend_swiglu_backward_dt(dev, dt, o, o2, dg, da, db, n));
    OK(weft_backend_swiglu_backward(dev, fo, fo2, fg, fa, fb, n));
    for (int j = 0; j < 2; j++) {
      snprintf(what, sizeof what, "swiglu_backward_dt %s: d%c", weft_dtype_name(dt), j ? 'b' : 'a');
      got = down(dev, j ? o2 : o, (size_t)n * 2);
      ref = downf(dev, j ? fo2 : fo, n);
      want = h_round(ref, dt, n);
      expect_same_floats(what, got, want, n, dt);
      free(got), free(ref), free(want);
    }
    /* dropout, p = 0.3, the uniforms f32 */
    OK(weft_backend_dropout_apply_dt(dev, dt, o, da, du, 0.3f, n));
    OK(weft_backend_dropout_apply(dev, fo, fa, du, 0.3f, n));
    snprintf(what, sizeof what, "dropout_apply_dt %s", weft_dtype_name(dt));
    got = down(dev, o, (size_t)n * 2);
    ref = downf(dev, fo, n);
    want = h_round(ref, dt, n);
    expect_same_floats(what, got, want, n, dt);
    int64_t zeros = 0;
    for (int64_t i = 0; i < n; i++) zeros += got[i] == 0 || got[i] == 0x8000;
    cr_expect(zeros > n / 5 && zeros < n / 2, "dropout zeroed %lld of %lld", (long long)zeros,
              (long long)n);
    free(got), free(ref), free(want);
    free(a0), free(b0), free(g0), free(u), free(ha), free(hb), free(hg), free(a), free(b), free(g);
    weft_free(da), weft_free(db), weft_free(dg), weft_free(fa), weft_free(fb), weft_free(fg);
    weft_free(du), weft_free(o), weft_free(o2), weft_free(fo), weft_free(fo2);
  }
}

/* LayerNorm the same way: outputs and dinp bitwise the f32 member's on
 * the widened values, rounded once; mean, rstd, dweight and dbias (f32)
 * bitwise the f32 member's. */
BACKEND_TEST(layernorm_dt_in_bf16_and_f16_is_the_f32_member_on_widened_values) {
  seed_tests(437);
  const int64_t N = 300, C = 77; /* several CPU chunks, a ragged last one */
  const int64_t NC = N * C;
  const weft_dtype dts[2] = {WEFT_BF16, WEFT_F16};
  char what[160];
  for (int k = 0; k < 2; k++) {
    const weft_dtype dt = dts[k];
    cr_assert(weft_backend_takes_dtype(dev, WEFT_KERNEL_LAYERNORM, dt));
    float *x0 = h_normal(NC, 2.0), *g0 = h_normal(NC, 1.0), *w0 = h_normal(C, 1.0),
          *b0 = h_normal(C, 1.0), *a0 = h_normal(NC, 1.0);
    uint16_t *hx = h_round(x0, dt, NC), *hg = h_round(g0, dt, NC), *hw = h_round(w0, dt, C),
             *hb = h_round(b0, dt, C), *ha = h_round(a0, dt, NC);
    float *x = h_widen(hx, dt, NC), *g = h_widen(hg, dt, NC), *w = h_widen(hw, dt, C),
          *b = h_widen(hb, dt, C), *a = h_widen(ha, dt, NC);
    void *dx = dup_h(dev, hx, (size_t)NC * 2), *dg = dup_h(dev, hg, (size_t)NC * 2),
         *dw = dup_h(dev, hw, (size_t)C * 2), *db = dup_h(dev, hb, (size_t)C * 2);
    float *fx = dupf(dev, x, NC), *fg = dupf(dev, g, NC), *fw = dupf(dev, w, C),
          *fb = dupf(dev, b, C);
    void *o = dnan(dev, (size_t)NC * 2);
    float *fo = dnan(dev, (size_t)NC * 4), *m1 = dnan(dev, (size_t)N * 4),
          *r1 = dnan(dev, (size_t)N * 4), *m2 = dnan(dev, (size_t)N * 4),
          *r2 = dnan(dev, (size_t)N * 4);
    OK(weft_backend_layernorm_forward_dt(dev, dt, o, m1, r1, dx, dw, db, N, C, 1e-5f));
    OK(weft_backend_layernorm_forward(dev, fo, m2, r2, fx, fw, fb, N, C, 1e-5f));
    snprintf(what, sizeof what, "layernorm_forward_dt %s", weft_dtype_name(dt));
    uint16_t *got = down(dev, o, (size_t)NC * 2);
    float *ref = downf(dev, fo, NC);
    void *want = h_round(ref, dt, NC);
    expect_same_floats(what, got, want, NC, dt);
    free(got), free(ref), free(want);
    float *s1 = downf(dev, m1, N), *s2 = downf(dev, m2, N);
    expect_same_floats("layernorm_forward_dt mean", s1, s2, N, WEFT_F32);
    free(s1), free(s2);
    s1 = downf(dev, r1, N), s2 = downf(dev, r2, N);
    expect_same_floats("layernorm_forward_dt rstd", s1, s2, N, WEFT_F32);
    free(s1), free(s2);
    for (int acc = 0; acc < 2; acc++) {
      void *di = acc ? dup_h(dev, ha, (size_t)NC * 2) : dnan(dev, (size_t)NC * 2);
      float *fdi = acc ? dupf(dev, a, NC) : dnan(dev, (size_t)NC * 4);
      float zeros[77] = {0};
      float *gw1 = dupf(dev, zeros, C), *gb1 = dupf(dev, zeros, C), *gw2 = dupf(dev, zeros, C),
            *gb2 = dupf(dev, zeros, C);
      OK(weft_backend_layernorm_backward_dt(dev, dt, di, gw1, gb1, dg, dx, dw, m2, r2, N, C, acc));
      OK(weft_backend_layernorm_backward(dev, fdi, gw2, gb2, fg, fx, fw, m2, r2, N, C, acc));
      snprintf(what, sizeof what, "layernorm_backward_dt %s dinp (%s)", weft_dtype_name(dt),
               acc ? "+=" : "=");
      got = down(dev, di, (size_t)NC * 2);
      ref = downf(dev, fdi, NC);
      want = h_round(ref, dt, NC);
      expect_same_floats(what, got, want, NC, dt);
      free(got), free(ref), free(want);
      s1 = downf(dev, gw1, C), s2 = downf(dev, gw2, C);
      expect_same_floats("layernorm_backward_dt dweight", s1, s2, C, WEFT_F32);
      free(s1), free(s2);
      s1 = downf(dev, gb1, C), s2 = downf(dev, gb2, C);
      expect_same_floats("layernorm_backward_dt dbias", s1, s2, C, WEFT_F32);
      free(s1), free(s2);
      weft_free(di), weft_free(fdi), weft_free(gw1), weft_free(gb1), weft_free(gw2), weft_free(gb2);
    }
    free(x0), free(g0), free(w0), free(b0), free(a0), free(hx), free(hg), free(hw), free(hb);
    free(ha), free(x), free(g), free(w), free(b), free(a);
    weft_free(dx), weft_free(dg), weft_free(dw), weft_free(db), weft_free(fx), weft_free(fg);
    weft_free(fw), weft_free(fb), weft_free(o), weft_free(fo), weft_free(m1), weft_free(r1);
    weft_free(m2), weft_free(r2);
  }
}

/* Softmax the same way. */
BACKEND_TEST(softmax_dt_in_bf16_and_f16_is_the_f32_member_on_widened_values) {
  seed_tests(439);
  const int64_t N = 300, C = 77, NC = N * C;
  const weft_dtype dts[2] = {WEFT_BF16, WEFT_F16};
  char what[160];
  for (int k = 0; k < 2; k++) {
    const weft_dtype dt = dts[k];
    cr_assert(weft_backend_takes_dtype(dev, WEFT_KERNEL_SOFTMAX, dt));
    float *x0 = h_normal(NC, 3.0), *g0 = h_normal(NC, 1.0), *a0 = h_normal(NC, 1.0);
    uint16_t *hx = h_round(x0, dt, NC), *hg = h_round(g0, dt, NC), *ha = h_round(a0, dt, NC);
    float *x = h_widen(hx, dt, NC), *g = h_widen(hg, dt, NC), *a = h_widen(ha, dt, NC);
    void *dx = dup_h(dev, hx, (size_t)NC * 2), *dg = dup_h(dev, hg, (size_t)NC * 2);
    float *fx = dupf(dev, x, NC), *fg = dupf(dev, g, NC);
    void *o = dnan(dev, (size_t)NC * 2);
    float *fo = dnan(dev, (size_t)NC * 4);
    OK(weft_backend_softmax_forward_dt(dev, dt, o, dx, N, C));
    OK(weft_backend_softmax_forward(dev, fo, fx, N, C));
    snprintf(what, sizeof what, "softmax_forward_dt %s", weft_dtype_name(dt));
    uint16_t *got = down(dev, o, (size_t)NC * 2);
    float *ref = downf(dev, fo, NC);
    void *want = h_round(ref, dt, NC);
    expect_same_floats(what, got, want, NC, dt);
    free(ref), free(want);
    /* backward from the 16-bit output (the op keeps it), widened for f32 */
    float *yw = h_widen(got, dt, NC), *fy = dupf(dev, yw, NC);
    for (int acc = 0; acc < 2; acc++) {
      void *di = acc ? dup_h(dev, ha, (size_t)NC * 2) : dnan(dev, (size_t)NC * 2);
      float *fdi = acc ? dupf(dev, a, NC) : dnan(dev, (size_t)NC * 4);
      OK(weft_backend_softmax_backward_dt(dev, dt, di, dg, o, N, C, acc));
      OK(weft_backend_softmax_backward(dev, fdi, fg, fy, N, C, acc));
      snprintf(what, sizeof what, "softmax_backward_dt %s (%s)", weft_dtype_name(dt),
               acc ? "+=" : "=");
      uint16_t *gd = down(dev, di, (size_t)NC * 2);
      ref = downf(dev, fdi, NC);
      want = h_round(ref, dt, NC);
      expect_same_floats(what, gd, want, NC, dt);
      free(gd), free(ref), free(want);
      weft_free(di), weft_free(fdi);
    }
    free(got), free(yw), free(x0), free(g0), free(a0), free(hx), free(hg), free(ha);
    free(x), free(g), free(a);
    weft_free(dx), weft_free(dg), weft_free(fx), weft_free(fg), weft_free(o), weft_free(fo);
    weft_free(fy);
  }
}

/* RMSNorm the same way; C = 64 takes a device's vectorised grouping, 77
 * its scalar one. */
BACKEND_TEST(rmsnorm_dt_in_bf16_and_f16_is_the_f32_member_on_widened_values) {
  seed_tests(441);
  const int64_t N = 300, Cs[2] = {77, 64};
  const weft_dtype dts[2] = {WEFT_BF16, WEFT_F16};
  char what[160];
  for (int k = 0; k < 4; k++) {
    const weft_dtype dt = dts[k % 2];
    const int64_t C = Cs[k / 2], NC = N * C;
    cr_assert(weft_backend_takes_dtype(dev, WEFT_KERNEL_RMSNORM, dt));
    float *x0 = h_normal(NC, 2.0), *g0 = h_normal(NC, 1.0), *w0 = h_normal(C, 1.0),
          *a0 = h_normal(NC, 1.0);
    uint16_t *hx = h_round(x0, dt, NC), *hg = h_round(g0, dt, NC), *hw = h_round(w0, dt, C),
             *ha = h_round(a0, dt, NC);
    float *x = h_widen(hx, dt, NC), *g = h_widen(hg, dt, NC), *w = h_widen(hw, dt, C),
          *a = h_widen(ha, dt, NC);
    void *dx = dup_h(dev, hx, (size_t)NC * 2), *dg = dup_h(dev, hg, (size_t)NC * 2),
         *dw = dup_h(dev, hw, (size_t)C * 2);
    float *fx = dupf(dev, x, NC), *fg = dupf(dev, g, NC), *fw = dupf(dev, w, C);
    void *o = dnan(dev, (size_t)NC * 2);
    float *fo = dnan(dev, (size_t)NC * 4), *r1 = dnan(dev, (size_t)N * 4),
          *r2 = dnan(dev, (size_t)N * 4);
    OK(weft_backend_rmsnorm_forward_dt(dev, dt, o, r1, dx, dw, N, C, 1e-6f));
    OK(weft_backend_rmsnorm_forward(dev, fo, r2, fx, fw, N, C, 1e-6f));
    snprintf(what, sizeof what, "rmsnorm_forward_dt %s C %lld", weft_dtype_name(dt), (long long)C);
    uint16_t *got = down(dev, o, (size_t)NC * 2);
    float *ref = downf(dev, fo, NC);
    void *want = h_round(ref, dt, NC);
    expect_same_floats(what, got, want, NC, dt);
    free(got), free(ref), free(want);
    float *s1 = downf(dev, r1, N), *s2 = downf(dev, r2, N);
    expect_same_floats("rmsnorm_forward_dt rstd", s1, s2, N, WEFT_F32);
    free(s1), free(s2);
    for (int acc = 0; acc < 2; acc++) {
      void *di = acc ? dup_h(dev, ha, (size_t)NC * 2) : dnan(dev, (size_t)NC * 2);
      float *fdi = acc ? dupf(dev, a, NC) : dnan(dev, (size_t)NC * 4);
      float zeros[77] = {0};
      float *gw1 = dupf(dev, zeros, C), *gw2 = dupf(dev, zeros, C);
      OK(weft_backend_rmsnorm_backward_dt(dev, dt, di, gw1, dg, dx, dw, r2, N, C, acc));
      OK(weft_backend_rmsnorm_backward(dev, fdi, gw2, fg, fx, fw, r2, N, C, acc));
      snprintf(what, sizeof what, "rmsnorm_backward_dt %s C %lld dinp (%s)", weft_dtype_name(dt),
               (long long)C, acc ? "+=" : "=");
      got = down(dev, di, (size_t)NC * 2);
      ref = downf(dev, fdi, NC);
      want = h_round(ref, dt, NC);
      expect_same_floats(what, got, want, NC, dt);
      free(got), free(ref), free(want);
      s1 = downf(dev, gw1, C), s2 = downf(dev, gw2, C);
      expect_same_floats("rmsnorm_backward_dt dweight", s1, s2, C, WEFT_F32);
      free(s1), free(s2);
      weft_free(di), weft_free(fdi), weft_free(gw1), weft_free(gw2);
    }
    free(x0), free(g0), free(w0), free(a0), free(hx), free(hg), free(hw), free(ha);
    free(x), free(g), free(w), free(a);
    weft_free(dx), weft_free(dg), weft_free(dw), weft_free(fx), weft_free(fg), weft_free(fw);
    weft_free(o), weft_free(fo), weft_free(r1), weft_free(r2);
  }
}

/* Cross-entropy the same way: the whole-vocabulary forward and backward
 * and the vocab-sharded pieces (v0 13: some targets fall outside the
 * shard) read bf16 / f16 logits as this device's f32 members read the
 * widened ones; the loss, lse and row statistics are those bits, each
 * dlogits element that f32 gradient rounded once. V = 64 takes a device's
 * four-wide path, 77 its scalar one; 300 rows span several CPU chunks. */
BACKEND_TEST(cross_entropy_dt_in_bf16_and_f16_is_the_f32_member_on_widened_logits) {
  seed_tests(447);
  const int64_t N = 300, Vs[2] = {77, 64}, v0 = 13;
  const weft_dtype dts[2] = {WEFT_BF16, WEFT_F16};
  char what[160];
  for (int k = 0; k < 4; k++) {
    const weft_dtype dt = dts[k % 2];
    const int64_t V = Vs[k / 2], NV = N * V;
    cr_assert(weft_backend_takes_dtype(dev, WEFT_KERNEL_CROSS_ENTROPY, dt));
    float *x0 = h_normal(NV, 3.0);
    uint16_t *hx = h_round(x0, dt, NV);
    float *x = h_widen(hx, dt, NV);
    int32_t *tg = xmalloc((size_t)N * sizeof(int32_t));
    for (int64_t n = 0; n < N; n++) tg[n] = (int32_t)((n * 37 + 5) % V);
    void *dx = dup_h(dev, hx, (size_t)NV * 2);
    float *fx = dupf(dev, x, NV);
    int32_t *dt_tg = dup_h(dev, tg, (size_t)N * sizeof(int32_t));
    /* whole vocabulary: loss and lse */
    double l1 = NAN, l2 = NAN;
    float *lse1 = dnan(dev, (size_t)N * 4), *lse2 = dnan(dev, (size_t)N * 4);
    OK(weft_backend_cross_entropy_forward_dt(dev, dt, &l1, lse1, dx, dt_tg, N, V));
    OK(weft_backend_cross_entropy_forward(dev, &l2, lse2, fx, dt_tg, N, V));
    cr_assert(l1 == l2 && isfinite(l1),
              "cross_entropy_forward_dt %s V %lld: loss %.17g, want %.17g", weft_dtype_name(dt),
              (long long)V, l1, l2);
    float *s1 = downf(dev, lse1, N), *s2 = downf(dev, lse2, N);
    expect_same_floats("cross_entropy_forward_dt lse", s1, s2, N, WEFT_F32);
    free(s1), free(s2);
    /* the vocab-sharded pieces */
    float *m1 = dnan(dev, (size_t)N * 4), *m2 = dnan(dev, (size_t)N * 4);
    OK(weft_backend_cross_entropy_local_max_dt(dev, dt, m1, dx, N, V));
    OK(weft_backend_cross_entropy_local_max(dev, m2, fx, N, V));
    s1 = downf(dev, m1, N), s2 = downf(dev, m2, N);
    expect_same_floats("cross_entropy_local_max_dt", s1, s2, N, WEFT_F32);
    free(s1), free(s2);
    float *t1 = dnan(dev, (size_t)N * 4), *t2 = dnan(dev, (size_t)N * 4);
    OK(weft_backend_cross_entropy_local_target_dt(dev, dt, t1, dx, dt_tg, N, v0, V));
    OK(weft_backend_cross_entropy_local_target(dev, t2, fx, dt_tg, N, v0, V));
    s1 = downf(dev, t1, N), s2 = downf(dev, t2, N);
    expect_same_floats("cross_entropy_local_target_dt", s1, s2, N, WEFT_F32);
    free(s1), free(s2);
    float *e1 = dnan(dev, (size_t)N * 4), *e2 = dnan(dev, (size_t)N * 4);
    OK(weft_backend_cross_entropy_local_sumexp_dt(dev, dt, e1, dx, m2, N, V));
    OK(weft_backend_cross_entropy_local_sumexp(dev, e2, fx, m2, N, V));
    s1 = downf(dev, e1, N), s2 = downf(dev, e2, N);
    expect_same_floats("cross_entropy_local_sumexp_dt", s1, s2, N, WEFT_F32);
    free(s1), free(s2);
    /* backward, whole and local */
    for (int local = 0; local < 2; local++) {
      void *d1 = dnan(dev, (size_t)NV * 2);
      float *d2 = dnan(dev, (size_t)NV * 4);
      if (local) {
        OK(weft_backend_cross_entropy_backward_local_dt(dev, dt, d1, dx, lse2, dt_tg, N, v0, V,
                                                        0.37f));
        OK(weft_backend_cross_entropy_backward_local(dev, d2, fx, lse2, dt_tg, N, v0, V, 0.37f));
      } else {
        OK(weft_backend_cross_entropy_backward_dt(dev, dt, d1, dx, lse2, dt_tg, N, V, 0.37f));
        OK(weft_backend_cross_entropy_backward(dev, d2, fx, lse2, dt_tg, N, V, 0.37f));
      }
      snprintf(what, sizeof what, "cross_entropy_backward%s_dt %s V %lld", local ? "_local" : "",
               weft_dtype_name(dt), (long long)V);
      uint16_t *got = down(dev, d1, (size_t)NV * 2);
      float *ref = downf(dev, d2, NV);
      void *want = h_round(ref, dt, NV);
      expect_same_floats(what, got, want, NV, dt);
      free(got), free(ref), free(want);
      weft_free(d1), weft_free(d2);
    }
    /* a target outside the vocabulary is refused as by the f32 member */
    int32_t bad[1] = {(int32_t)V};
    int32_t *dbad = dup_h(dev, bad, sizeof bad);
    weft_clear_error();
    cr_assert_eq(weft_backend_cross_entropy_forward_dt(dev, dt, &l1, NULL, dx, dbad, 1, V),
                 WEFT_ERR_INVALID);
    cr_assert(strstr(weft_last_error(), "outside the vocabulary"), "message: %s",
              weft_last_error());
    weft_free(dbad);
    free(x0), free(hx), free(x), free(tg);
    weft_free(dx), weft_free(fx), weft_free(dt_tg), weft_free(lse1), weft_free(lse2);
    weft_free(m1), weft_free(m2), weft_free(t1), weft_free(t2), weft_free(e1), weft_free(e2);
  }
}

/* The lookups the same way: embedding_range_forward_dt copies bf16 / f16
 * rows as they are (ids of other shards give +0), embedding_range_
 * backward_dt adds the widened dout rows into the f32 grad as the f32
 * member adds them (repeated ids in id order); rope_*_dt are the f32
 * members' bits on the widened values, rounded once, also in place.
 * C = 64 takes a device's four-wide path, 77 its scalar one; hd 6 a RoPE
 * row with an odd number of pairs. */
BACKEND_TEST(embedding_and_rope_dt_in_bf16_and_f16_are_the_f32_members_on_widened_values) {
  seed_tests(449);
  const int64_t N = 150, nv = 40, v0 = 10, Cs[2] = {77, 64};
  const weft_dtype dts[2] = {WEFT_BF16, WEFT_F16};
  char what[160];
  int32_t tg[150];
  for (int64_t n = 0; n < N; n++) tg[n] = (int32_t)((n * 7 + 3) % 60); /* some outside */
  int32_t *dtg = dup_h(dev, tg, sizeof tg);
  for (int k = 0; k < 4; k++) {
    const weft_dtype dt = dts[k % 2];
    const int64_t C = Cs[k / 2];
    cr_assert(weft_backend_takes_dtype(dev, WEFT_KERNEL_EMBEDDING, dt));
    cr_assert(weft_backend_takes_dtype(dev, WEFT_KERNEL_ROPE, dt));
    float *w0 = h_normal(nv * C, 1.0), *g0 = h_normal(N * C, 1.0), *a0 = h_normal(nv * C, 1.0);
    uint16_t *hw = h_round(w0, dt, nv * C), *hg = h_round(g0, dt, N * C);
    float *g = h_widen(hg, dt, N * C);
    void *dw = dup_h(dev, hw, (size_t)(nv * C) * 2), *dg = dup_h(dev, hg, (size_t)(N * C) * 2);
    float *fg = dupf(dev, g, N * C);
    /* forward: the rows as they are */
    void *o = dnan(dev, (size_t)(N * C) * 2);
    OK(weft_backend_embedding_range_forward_dt(dev, dt, o, dtg, dw, N, v0, nv, C));
    uint16_t *got = down(dev, o, (size_t)(N * C) * 2);
    for (int64_t n = 0; n < N; n++)
      for (int64_t c = 0; c < C; c++) {
        const int64_t r = tg[n] - v0;
        const uint16_t want = r >= 0 && r < nv ? hw[r * C + c] : 0;
        cr_assert_eq(got[n * C + c], want, "embedding_range_forward_dt %s C %lld [%lld, %lld]",
                     weft_dtype_name(dt), (long long)C, (long long)n, (long long)c);
      }
    free(got);
    /* backward into a grad that already holds values (it accumulates) */
    float *gw1 = dupf(dev, a0, nv * C), *gw2 = dupf(dev, a0, nv * C);
    OK(weft_backend_embedding_range_backward_dt(dev, dt, gw1, dtg, dg, N, v0, nv, C));
    OK(weft_backend_embedding_range_backward(dev, gw2, dtg, fg, N, v0, nv, C));
    float *s1 = downf(dev, gw1, nv * C), *s2 = downf(dev, gw2, nv * C);
    snprintf(what, sizeof what, "embedding_range_backward_dt %s C %lld", weft_dtype_name(dt),
             (long long)C);
    expect_same_floats(what, s1, s2, nv * C, WEFT_F32);
    free(s1), free(s2);
    weft_free(gw1), weft_free(gw2), weft_free(o);
    /* RoPE: (B 2, T 5, NH 3, hd 6) from position 4 of 12 */
    const int64_t B = 2, T = 5, NH = 3, hd = 6, pos0 = 4, maxp = 12, nr = B * T * NH * hd;
    float *cb = dnan(dev, (size_t)(maxp * hd / 2) * 4),
          *sb = dnan(dev, (size_t)(maxp * hd / 2) * 4);
    OK(weft_backend_rope_tables(dev, cb, sb, maxp, hd, 10000.0));
    float *x0 = h_normal(nr, 2.0);
    uint16_t *hx = h_round(x0, dt, nr);
    float *x = h_widen(hx, dt, nr);
    void *dx = dup_h(dev, hx, (size_t)nr * 2);
    float *fx = dupf(dev, x, nr);
    for (int bwd = 0; bwd < 2; bwd++) {
      void *ro = dnan(dev, (size_t)nr * 2), *io = dup_h(dev, hx, (size_t)nr * 2);
      float *fo = dnan(dev, (size_t)nr * 4);
      if (bwd) {
        OK(weft_backend_rope_backward_dt(dev, dt, ro, dx, cb, sb, maxp, B, T, NH, hd, pos0));
        OK(weft_backend_rope_backward_dt(dev, dt, io, io, cb, sb, maxp, B, T, NH, hd, pos0));
        OK(weft_backend_rope_backward(dev, fo, fx, cb, sb, maxp, B, T, NH, hd, pos0));
      } else {
        OK(weft_backend_rope_forward_dt(dev, dt, ro, dx, cb, sb, maxp, B, T, NH, hd, pos0));
        OK(weft_backend_rope_forward_dt(dev, dt, io, io, cb, sb, maxp, B, T, NH, hd, pos0));
        OK(weft_backend_rope_forward(dev, fo, fx, cb, sb, maxp, B, T, NH, hd, pos0));
      }
      float *ref = downf(dev, fo, nr);
      void *want = h_round(ref, dt, nr);
      uint16_t *r1 = down(dev, ro, (size_t)nr * 2), *r2 = down(dev, io, (size_t)nr * 2);
      snprintf(what, sizeof what, "rope_%s_dt %s", bwd ? "backward" : "forward",
               weft_dtype_name(dt));
      expect_same_floats(what, r1, want, nr, dt);
      expect_same_floats(what, r2, want, nr, dt);
      free(ref), free(want), free(r1), free(r2);
      weft_free(ro), weft_free(io), weft_free(fo);
    }
    free(x0), free(hx), free(x), free(w0), free(g0), free(a0), free(hw), free(hg), free(g);
    weft_free(cb), weft_free(sb), weft_free(dx), weft_free(fx), weft_free(dw), weft_free(dg);
    weft_free(fg);
  }
  weft_free(dtg);
}

/* gemm_dt: bf16 / f16 operands, C f32 or 16-bit, a bias or beta. Each
 * case is bitwise this device's sgemm on the widened operands (with the
 * bias as C's rows and beta 1; a 16-bit C widened), rounded once to C's
 * dtype: both sum each element in f32 (CPU: one OpenBLAS sgemm over the
 * whole k) or once from double (the emulator). On the CPU a product of
 * several row and column blocks (kernels/cpu/gemm_dt.c) is checked against
 * a double reference only (not bitwise: OpenBLAS sums an element of a
 * 64-row block in another order than of the whole 130 rows). */
static void gemm_dt_case(weft_device dev, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                         weft_dtype dt, weft_dtype c_dt, bool bias, float beta, bool bitwise) {
  const int64_t lda = (ta ? m : k) + (ta ? 1 : 0), ldb = tb ? k : n + 2, ldc = n + 1;
  const int64_t na = (ta ? k : m) * lda, nb = (tb ? n : k) * ldb, nc = m * ldc;
  float *a0 = h_normal(na, 1.0), *b0 = h_normal(nb, 1.0), *c0 = h_normal(nc, 1.0),
        *bias0 = h_normal(n, 1.0);
  uint16_t *ha = h_round(a0, dt, na), *hb = h_round(b0, dt, nb), *hbias = h_round(bias0, dt, n);
  float *a = h_widen(ha, dt, na), *b = h_widen(hb, dt, nb), *bw = h_widen(hbias, dt, n);
  /* C's start: f32, or 16-bit (and its widened values for the reference) */
  void *hc = c_dt == WEFT_F32 ? (void *)c0 : h_round(c0, c_dt, nc);
  float *cw = c_dt == WEFT_F32 ? c0 : h_widen(hc, c_dt, nc);
  const size_t ces = weft_dtype_size(c_dt);
  void *da = dup_h(dev, ha, (size_t)na * 2), *db = dup_h(dev, hb, (size_t)nb * 2),
       *dc = dup_h(dev, hc, (size_t)nc * ces);
  void *dbias = NULL;
  if (bias) dbias = c_dt == WEFT_F32 ? (void *)dupf(dev, bw, n) : dup_h(dev, hbias, (size_t)n * 2);
  OK(weft_backend_gemm_dt(dev, ta, tb, m, n, k, 0.75f, dt, da, lda, db, ldb, beta, c_dt, dc, ldc,
                          dbias));
  /* the reference: widened f32 sgemm on this device, rounded once */
  float *rc = xmalloc((size_t)nc * sizeof(float));
  memcpy(rc, cw, (size_t)nc * sizeof(float));
  if (bias)
    for (int64_t i = 0; i < m; i++) memcpy(rc + i * ldc, bw, (size_t)n * sizeof(float));
  float *fa = dupf(dev, a, na), *fb = dupf(dev, b, nb), *fc = dupf(dev, rc, nc);
  OK(weft_backend_sgemm(dev, ta, tb, m, n, k, 0.75f, fa, lda, fb, ldb, bias ? 1.0f : beta, fc,
                        ldc));
  float *ref = downf(dev, fc, nc);
  void *want = c_dt == WEFT_F32 ? (void *)ref : h_round(ref, c_dt, nc);
  void *got = down(dev, dc, (size_t)nc * ces);
  char what[160];
  snprintf(what, sizeof what, "gemm_dt %s -> %s ta %d tb %d %lldx%lldx%lld%s beta %g",
           weft_dtype_name(dt), weft_dtype_name(c_dt), ta, tb, (long long)m, (long long)n,
           (long long)k, bias ? " bias" : "", (double)beta);
  if (bitwise) expect_same_floats(what, got, want, nc, c_dt); /* the gaps (ldc > n): untouched */
  /* and close to the double sum */
  double *dref = h_dbl(m * n);
  float *bf = xmalloc((size_t)(m * n) * sizeof(float)), *gf = xmalloc((size_t)(m * n) * 4);
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < n; j++) {
      bf[i * n + j] = bias ? bw[j] : cw[i * ldc + j];
      const void *gp = (const char *)got + (size_t)(i * ldc + j) * ces;
      const uint16_t h16 = c_dt == WEFT_F32 ? 0 : *(const uint16_t *)gp;
      gf[i * n + j] = c_dt == WEFT_F32    ? *(const float *)gp
                      : c_dt == WEFT_BF16 ? weft_bf16_to_f32(h16)
                                          : weft_f16_to_f32(h16);
    }
  gemm_ref(ta, tb, m, n, k, 0.75, a, lda, b, ldb, bias ? 1.0 : beta, bf, n, dref);
  expect_close(what, gf, dref, m * n, c_dt == WEFT_F32 ? (k > 4096 ? 1e-3 : 1e-4) : 1.0 / 128);
  free(a0), free(b0), free(c0), free(bias0), free(ha), free(hb), free(hbias), free(a), free(b);
  free(bw), free(rc), free(ref), free(got), free(dref), free(bf), free(gf);
  if (c_dt != WEFT_F32) free(hc), free(cw), free(want);
  weft_free(da), weft_free(db), weft_free(dc), weft_free(dbias), weft_free(fa), weft_free(fb);
  weft_free(fc);
}

BACKEND_TEST(gemm_dt_in_bf16_and_f16_is_the_widened_sgemm_rounded_once) {
  seed_tests(451);
  const weft_dtype dts[2] = {WEFT_BF16, WEFT_F16};
  for (int d = 0; d < 2; d++) {
    cr_assert(weft_backend_takes_dtype(dev, WEFT_KERNEL_GEMM, dts[d]));
    for (int t = 0; t < 4; t++) {
      const bool ta = t & 1, tb = t & 2;
      gemm_dt_case(dev, ta, tb, 37, 29, 41, dts[d], dts[d], false, 0.0f, true);
      gemm_dt_case(dev, ta, tb, 37, 29, 41, dts[d], WEFT_F32, false, -0.5f, true);
      gemm_dt_case(dev, ta, tb, 19, 23, 17, dts[d], dts[d], true, 0.0f, true);
      gemm_dt_case(dev, ta, tb, 19, 23, 17, dts[d], dts[d], false, 0.5f, true);
    }
    gemm_dt_case(dev, false, true, 11, 13, 0, dts[d], dts[d], true, 0.0f, true); /* k 0: the bias */
  }
  /* several row and column blocks of the CPU's blocked widening (k 65536:
   * 64-row blocks of A, 256-column blocks of B) */
  if (dev == WEFT_CPU) {
    gemm_dt_case(dev, false, true, 130, 300, 65536, WEFT_BF16, WEFT_BF16, true, 0.0f, false);
    gemm_dt_case(dev, true, false, 130, 300, 65536, WEFT_BF16, WEFT_F32, false, 0.5f, false);
  }
  /* refused: C of another 16-bit dtype, f64 operands, a bias with beta */
  uint16_t x[4] = {0};
  weft_clear_error();
  cr_assert_eq(weft_backend_gemm_dt(dev, false, false, 2, 2, 2, 1.0f, WEFT_BF16, x, 2, x, 2, 0.0f,
                                    WEFT_F16, x, 2, NULL),
               WEFT_ERR_UNSUPPORTED);
  cr_assert(strstr(weft_last_error(), "gemm_dt: C of dtype f16 with bf16 operands"), "%s",
            weft_last_error());
  cr_assert_eq(weft_backend_gemm_dt(dev, false, false, 2, 2, 2, 1.0f, WEFT_F64, x, 2, x, 2, 0.0f,
                                    WEFT_F64, x, 2, NULL),
               WEFT_ERR_UNSUPPORTED);
  cr_assert_eq(weft_backend_gemm_dt(dev, false, false, 2, 2, 2, 1.0f, WEFT_BF16, x, 2, x, 2, 1.0f,
                                    WEFT_BF16, x, 2, x),
               WEFT_ERR_INVALID);
  cr_assert(strstr(weft_last_error(), "a bias needs beta = 0"), "%s", weft_last_error());
}

/* Attention the same way: forward (out; lse as the f32 member's) and
 * backward (dq, dk, dv) on bf16 / f16 q, k, v, dout are this device's f32
 * members on the widened values, rounded once; grouped-query (4 heads on
 * 2 kv heads), causal and not, T 70 across the CPU's 64-row blocks. */
BACKEND_TEST(attention_dt_in_bf16_and_f16_is_the_f32_member_on_widened_values) {
  seed_tests(453);
  const int64_t B = 2, T = 70, H = 4, Hkv = 2, hd = 8;
  const int64_t nq = B * T * H * hd, nkv = B * T * Hkv * hd;
  const weft_dtype dts[2] = {WEFT_BF16, WEFT_F16};
  const size_t sb = weft_backend_attention_scratch_bytes(dev, B, T, H, Hkv, hd);
  void *scratch = dnan(dev, sb);
  char what[160];
  for (int k = 0; k < 4; k++) {
    const weft_dtype dt = dts[k % 2];
    const bool causal = k / 2 == 0;
    cr_assert(weft_backend_takes_dtype(dev, WEFT_KERNEL_ATTENTION, dt));
    float *q0 = h_normal(nq, 1.0), *k0 = h_normal(nkv, 1.0), *v0 = h_normal(nkv, 1.0),
          *g0 = h_normal(nq, 1.0);
    uint16_t *hq = h_round(q0, dt, nq), *hk = h_round(k0, dt, nkv), *hv = h_round(v0, dt, nkv),
             *hg = h_round(g0, dt, nq);
    float *q = h_widen(hq, dt, nq), *kk = h_widen(hk, dt, nkv), *v = h_widen(hv, dt, nkv),
          *g = h_widen(hg, dt, nq);
    void *dq16 = dup_h(dev, hq, (size_t)nq * 2), *dk16 = dup_h(dev, hk, (size_t)nkv * 2),
         *dv16 = dup_h(dev, hv, (size_t)nkv * 2), *dg16 = dup_h(dev, hg, (size_t)nq * 2);
    float *fq = dupf(dev, q, nq), *fk = dupf(dev, kk, nkv), *fv = dupf(dev, v, nkv),
          *fg = dupf(dev, g, nq);
    /* forward */
    void *o16 = dnan(dev, (size_t)nq * 2);
    float *fo = dnan(dev, (size_t)nq * 4), *l1 = dnan(dev, (size_t)(B * H * T) * 4),
          *l2 = dnan(dev, (size_t)(B * H * T) * 4);
    OK(weft_backend_attention_forward_dt(dev, dt, o16, l1, dq16, dk16, dv16, B, T, H, Hkv, hd,
                                         causal, NULL, scratch));
    OK(weft_backend_attention_forward(dev, fo, l2, fq, fk, fv, B, T, H, Hkv, hd, causal, scratch));
    snprintf(what, sizeof what, "attention_forward_dt %s%s", weft_dtype_name(dt),
             causal ? " causal" : "");
    uint16_t *got = down(dev, o16, (size_t)nq * 2);
    float *ref = downf(dev, fo, nq);
    void *want = h_round(ref, dt, nq);
    expect_same_floats(what, got, want, nq, dt);
    float *s1 = downf(dev, l1, B * H * T), *s2 = downf(dev, l2, B * H * T);
    expect_same_floats("attention_forward_dt lse", s1, s2, B * H * T, WEFT_F32);
    free(s1), free(s2), free(ref), free(want);
    /* backward: from the 16-bit output (the op keeps it), widened for f32 */
    float *ow = h_widen(got, dt, nq), *fow = dupf(dev, ow, nq);
    void *gq = dnan(dev, (size_t)nq * 2), *gk = dnan(dev, (size_t)nkv * 2),
         *gv = dnan(dev, (size_t)nkv * 2);
    float *fgq = dnan(dev, (size_t)nq * 4), *fgk = dnan(dev, (size_t)nkv * 4),
          *fgv = dnan(dev, (size_t)nkv * 4);
    OK(weft_backend_attention_backward_dt(dev, dt, gq, gk, gv, dg16, dq16, dk16, dv16, l2, o16, B,
                                          T, H, Hkv, hd, causal, NULL, scratch));
    OK(weft_backend_attention_backward(dev, fgq, fgk, fgv, fg, fq, fk, fv, l2, fow, B, T, H, Hkv,
                                       hd, causal, scratch));
    void *const outs[3] = {gq, gk, gv};
    float *const refs[3] = {fgq, fgk, fgv};
    const int64_t ns[3] = {nq, nkv, nkv};
    const char *names[3] = {"dq", "dk", "dv"};
    for (int j = 0; j < 3; j++) {
      snprintf(what, sizeof what, "attention_backward_dt %s %s%s", names[j], weft_dtype_name(dt),
               causal ? " causal" : "");
      uint16_t *gj = down(dev, outs[j], (size_t)ns[j] * 2);
      float *rj = downf(dev, refs[j], ns[j]);
      void *wj = h_round(rj, dt, ns[j]);
      expect_same_floats(what, gj, wj, ns[j], dt);
      free(gj), free(rj), free(wj);
    }
    free(q0), free(k0), free(v0), free(g0), free(hq), free(hk), free(hv), free(hg), free(q);
    free(kk), free(v), free(g), free(got), free(ow);
    weft_free(dq16), weft_free(dk16), weft_free(dv16), weft_free(dg16), weft_free(fq);
    weft_free(fk), weft_free(fv), weft_free(fg), weft_free(o16), weft_free(fo), weft_free(l1);
    weft_free(l2), weft_free(fow), weft_free(gq), weft_free(gk), weft_free(gv), weft_free(fgq);
    weft_free(fgk), weft_free(fgv);
  }
  weft_free(scratch);
}

/* q, k, v as column slices of one fused (B, T, W) projection output
 * (weft_attention_rows), and dq, dk, dv written into the same columns of
 * a fused gradient: the packed call's bits, f32 and bf16, GQA, causal and
 * not, with W padded so rows are and are not 16-byte multiples; the
 * padding columns keep their poison (nothing written outside the slices),
 * and a stride below an operand's width is refused. */
BACKEND_TEST(attention_reads_and_writes_column_slices_of_fused_rows) {
  seed_tests(454);
  const int64_t B = 2, T = 70, H = 4, Hkv = 2, hd = 8;
  const int64_t nq = B * T * H * hd, nkv = B * T * Hkv * hd, wq = H * hd, wk = Hkv * hd;
  const size_t sb = weft_backend_attention_scratch_bytes(dev, B, T, H, Hkv, hd);
  void *scratch = dnan(dev, sb);
  cr_assert(weft_backend_attention_takes_rows(dev));
  char what[160];
  for (int c = 0; c < 8; c++) {
    const weft_dtype dt = c % 2 ? WEFT_BF16 : WEFT_F32;
    const bool causal = (c / 2) % 2 == 0;
    const int64_t W = wq + 2 * wk + (c / 4 ? 5 : 4);
    const size_t es = weft_dtype_size(dt);
    float *src[4] = {h_normal(nq, 1.0), h_normal(nkv, 1.0), h_normal(nkv, 1.0), h_normal(nq, 1.0)};
    const int64_t n[4] = {nq, nkv, nkv, nq}, width[4] = {wq, wk, wk, wq};
    const int64_t col[3] = {0, wq, wq + wk}; /* q | k | v | padding */
    void *packed[4];
    unsigned char *fused = xmalloc((size_t)(B * T * W) * es);
    memset(fused, 0xff, (size_t)(B * T * W) * es); /* NaN in both dtypes */
    for (int j = 0; j < 4; j++) {
      void *h = dt == WEFT_F32 ? (void *)src[j] : h_round(src[j], dt, n[j]);
      packed[j] = dup_h(dev, h, (size_t)n[j] * es);
      if (j < 3)
        for (int64_t r = 0; r < B * T; r++)
          memcpy(fused + (size_t)(r * W + col[j]) * es,
                 (const unsigned char *)h + (size_t)(r * width[j]) * es, (size_t)width[j] * es);
      if (h != src[j]) free(h);
    }
    unsigned char *df = dup_h(dev, fused, (size_t)(B * T * W) * es);
    unsigned char *fq = df, *fk = df + (size_t)col[1] * es, *fv = df + (size_t)col[2] * es;
    const weft_attention_rows rows = {W, W, W, W, W, W};
    void *o1 = dnan(dev, (size_t)nq * es), *o2 = dnan(dev, (size_t)nq * es);
    float *l1 = dnan(dev, (size_t)(B * H * T) * 4), *l2 = dnan(dev, (size_t)(B * H * T) * 4);
    OK(weft_backend_attention_forward_dt(dev, dt, o1, l1, packed[0], packed[1], packed[2], B, T, H,
                                         Hkv, hd, causal, NULL, scratch));
    OK(weft_backend_attention_forward_dt(dev, dt, o2, l2, fq, fk, fv, B, T, H, Hkv, hd, causal,
                                         &rows, scratch));
    snprintf(what, sizeof what, "strided attention forward %s%s W=%lld", weft_dtype_name(dt),
             causal ? " causal" : "", (long long)W);
    void *a = down(dev, o1, (size_t)nq * es), *b = down(dev, o2, (size_t)nq * es);
    expect_same_floats(what, b, a, nq, dt);
    free(a), free(b);
    a = downf(dev, l1, B * H * T), b = downf(dev, l2, B * H * T);
    expect_same_floats(what, b, a, B * H * T, WEFT_F32);
    free(a), free(b);
    /* backward: packed grads vs the columns of a poisoned fused grad */
    void *g1[3] = {dnan(dev, (size_t)nq * es), dnan(dev, (size_t)nkv * es),
                   dnan(dev, (size_t)nkv * es)};
    unsigned char *gf = dup_h(dev, fused, (size_t)(B * T * W) * es);
    OK(weft_backend_attention_backward_dt(dev, dt, g1[0], g1[1], g1[2], packed[3], packed[0],
                                          packed[1], packed[2], l1, o1, B, T, H, Hkv, hd, causal,
                                          NULL, scratch));
    OK(weft_backend_attention_backward_dt(dev, dt, gf, gf + (size_t)col[1] * es,
                                          gf + (size_t)col[2] * es, packed[3], fq, fk, fv, l1, o1,
                                          B, T, H, Hkv, hd, causal, &rows, scratch));
    unsigned char *hg = down(dev, gf, (size_t)(B * T * W) * es);
    for (int j = 0; j < 3; j++) {
      unsigned char *want = down(dev, g1[j], (size_t)n[j] * es), *got = xmalloc((size_t)n[j] * es);
      for (int64_t r = 0; r < B * T; r++)
        memcpy(got + (size_t)(r * width[j]) * es, hg + (size_t)(r * W + col[j]) * es,
               (size_t)width[j] * es);
      snprintf(what, sizeof what, "strided attention backward d%c %s%s W=%lld", "qkv"[j],
               weft_dtype_name(dt), causal ? " causal" : "", (long long)W);
      expect_same_floats(what, got, want, n[j], dt);
      free(want), free(got);
    }
    for (int64_t r = 0; r < B * T; r++)
      for (int64_t x = wq + 2 * wk; x < W; x++)
        for (size_t e = 0; e < es; e++)
          cr_assert_eq(hg[(size_t)(r * W + x) * es + e], 0xff,
                       "padding column %lld of row %lld was written", (long long)x, (long long)r);
    free(hg);
    for (int j = 0; j < 4; j++) free(src[j]), weft_free(packed[j]);
    for (int j = 0; j < 3; j++) weft_free(g1[j]);
    free(fused), weft_free(df), weft_free(gf), weft_free(o1), weft_free(o2), weft_free(l1);
    weft_free(l2);
  }
  const weft_attention_rows narrow = {wq - 1, 0, 0, 0, 0, 0};
  cr_assert_eq(weft_backend_attention_forward_dt(dev, WEFT_F32, scratch, scratch, scratch, scratch,
                                                 scratch, B, T, H, Hkv, hd, true, &narrow, scratch),
               WEFT_ERR_INVALID);
  cr_assert(strstr(weft_last_error(), "row stride of q is 31"), "%s", weft_last_error());
  weft_free(scratch);
}

BACKEND_TEST(softmax_forward_backward_match_references_in_place_too) {
  seed_tests(187);
  /* sd 40: logits far past exp's range, so the max must be subtracted */
  const struct {
    int64_t N, C;
    double sd;
    bool backward;
  } cases[4] = {
      {.N = 7, .C = 37, .sd = 2.0, .backward = true},
      {.N = 3, .C = 1, .sd = 2.0, .backward = true},
      {.N = 5, .C = 300, .sd = 1.0, .backward = true},
      {.N = 4, .C = 50, .sd = 40.0, .backward = false},
  };
  char what[160];
  for (int k = 0; k < 4; k++) {
    const int64_t N = cases[k].N, C = cases[k].C, NC = N * C;
    float *x = h_normal(NC, cases[k].sd), *dout = h_normal(NC, 1.0), *dinp0 = h_normal(NC, 1.0);
    double *xd = to_dbl(x, NC), *y = h_dbl(NC), *gy = h_dbl(NC), *want = h_dbl(NC);
    softmax_ref(xd, N, C, y);
    float *dx = dupf(dev, x, NC), *dy = dnan(dev, (size_t)NC * 4);
    OK(weft_backend_softmax_forward(dev, dy, dx, N, C));
    float *got = downf(dev, dy, NC);
    snprintf(what, sizeof what, "softmax_forward (N %lld, C %lld, sd %g)", (long long)N,
             (long long)C, cases[k].sd);
    expect_close(what, got, y, NC, 1e-5);
    free(got);
    float *io = dupf(dev, x, NC);
    OK(weft_backend_softmax_forward(dev, io, io, N, C));
    got = downf(dev, io, NC);
    expect_close("softmax_forward (out is inp)", got, y, NC, 1e-5);
    free(got);
    weft_free(io);
    if (cases[k].backward) {
      /* from the device's own forward output, as a caller would */
      float *yf = downf(dev, dy, NC);
      double *yfd = to_dbl(yf, NC), *dod = to_dbl(dout, NC);
      softmax_ref_backward(yfd, dod, N, C, gy);
      float *ddout = dupf(dev, dout, NC);
      for (int mode = 0; mode < 4; mode++) { /* =, +=, dinp is dout, dinp is out */
        float *g = mode == 0   ? dnan(dev, (size_t)NC * 4)
                   : mode == 1 ? dupf(dev, dinp0, NC)
                   : mode == 2 ? dupf(dev, dout, NC)
                               : dupf(dev, yf, NC);
        OK(weft_backend_softmax_backward(dev, g, mode == 2 ? g : ddout, mode == 3 ? g : dy, N, C,
                                         mode == 1));
        for (int64_t i = 0; i < NC; i++) want[i] = (mode == 1 ? dinp0[i] : 0.0) + gy[i];
        got = downf(dev, g, NC);
        snprintf(what, sizeof what, "softmax_backward (%s, N %lld, C %lld)",
                 mode == 0   ? "="
                 : mode == 1 ? "+="
                 : mode == 2 ? "dinp is dout"
                             : "dinp is out",
                 (long long)N, (long long)C);
        expect_close(what, got, want, NC, 1e-5);
        free(got);
        weft_free(g);
      }
      free(yf), free(yfd), free(dod);
      weft_free(ddout);
    }
    OK(weft_backend_softmax_forward(dev, NULL, NULL, 0, C));
    OK(weft_backend_softmax_backward(dev, NULL, NULL, NULL, 0, C, false));
    free(x), free(dout), free(dinp0), free(xd), free(y), free(gy), free(want);
    weft_free(dx), weft_free(dy);
  }
}

BACKEND_TEST(dropout_apply_keeps_uniforms_at_or_above_p_scaled_and_zeros_the_rest) {
  seed_tests(188);
  const int64_t n = 1003;
  const float ps[4] = {0.0f, 0.1f, 0.5f, 0.9f};
  float *x = h_normal(n, 1.0);
  double *xd = to_dbl(x, n), *want = h_dbl(n);
  float *dx = dupf(dev, x, n);
  char what[128];
  for (int k = 0; k < 4; k++) {
    const float p = ps[k];
    float *u = h_unif(n, 0.0, 1.0);
    u[0] = p;                                     /* kept: u >= p */
    u[1] = p > 0.0f ? nextafterf(p, 0.0f) : 0.5f; /* dropped just below p */
    u[2] = 0.0f;                                  /* dropped unless p = 0 */
    float *du = dupf(dev, u, n);
    dropout_ref(xd, u, p, n, want);
    for (int inplace = 0; inplace < 2; inplace++) {
      float *io = inplace ? dupf(dev, x, n) : NULL, *o = inplace ? io : dnan(dev, (size_t)n * 4);
      OK(weft_backend_dropout_apply(dev, o, inplace ? io : dx, du, p, n));
      float *got = downf(dev, o, n);
      snprintf(what, sizeof what, "dropout_apply (p %g%s)", (double)p,
               inplace ? ", out is inp" : "");
      if (p == 0.0f) {
        expect_values(what, got, WEFT_F32, want, n); /* the identity, bit for bit */
      } else {
        expect_close(what, got, want, n, 1e-6);
        for (int64_t i = 0; i < n; i++)
          cr_assert((want[i] == 0.0) == (got[i] == 0.0f),
                    "%s on %s: element %lld (u %.9g) is %.9g, want %.9g (seed %lu)", what,
                    weft_backend_name(dev), (long long)i, (double)u[i], (double)got[i], want[i],
                    g_seed);
      }
      free(got);
      weft_free(o);
    }
    OK(weft_backend_dropout_apply(dev, NULL, NULL, NULL, p, 0));
    free(u);
    weft_free(du);
  }
  free(x), free(xd), free(want);
  weft_free(dx);
}

/* --------------------------------------------------------- cross-entropy */

/* loss, lse (N) and dlogits (N, V) with the given scale, in double. */
static double ce_ref(const float *x, const int32_t *t, int64_t N, int64_t V, double scale,
                     double *lse, double *dx) {
  double total = 0.0;
  for (int64_t n = 0; n < N; n++) {
    double mx = -INFINITY, s = 0.0;
    for (int64_t v = 0; v < V; v++) mx = x[n * V + v] > mx ? x[n * V + v] : mx;
    for (int64_t v = 0; v < V; v++) s += exp(x[n * V + v] - mx);
    lse[n] = mx + log(s);
    total += lse[n] - x[n * V + t[n]];
    for (int64_t v = 0; v < V; v++)
      dx[n * V + v] = scale * (exp(x[n * V + v] - lse[n]) - (v == t[n] ? 1.0 : 0.0));
  }
  return total / (double)N;
}

BACKEND_TEST(cross_entropy_forward_backward_match_double_reference) {
  seed_tests(191);
  const int64_t N = 37, V = 101;
  float *x = h_normal(N * V, 3.0);
  int32_t *t = h_ids(N, 0, V);
  t[0] = 0, t[1] = (int32_t)V - 1;
  const float scale = 1.0f / (float)N;
  double *lse = h_dbl(N), *g = h_dbl(N * V);
  const double loss = ce_ref(x, t, N, V, scale, lse, g);
  float *dx = dupf(dev, x, N * V), *dl = dnan(dev, (size_t)N * 4),
        *dg = dnan(dev, (size_t)(N * V) * 4);
  int32_t *dt = dupi(dev, t, N);
  double got_loss = NAN;
  OK(weft_backend_cross_entropy_forward(dev, &got_loss, dl, dx, dt, N, V));
  expect_rel("cross_entropy_forward loss", got_loss, loss, 1e-5);
  float *got = downf(dev, dl, N);
  expect_close("cross_entropy_forward lse", got, lse, N, 1e-5);
  free(got);
  got_loss = NAN;
  OK(weft_backend_cross_entropy_forward(dev, &got_loss, NULL, dx, dt, N, V)); /* lse NULL */
  expect_rel("cross_entropy_forward loss without lse", got_loss, loss, 1e-5);
  OK(weft_backend_cross_entropy_backward(dev, dg, dx, dl, dt, N, V, scale));
  got = downf(dev, dg, N * V);
  expect_close("cross_entropy_backward", got, g, N * V, 1e-5);
  free(got);
  OK(weft_backend_cross_entropy_backward(dev, dx, dx, dl, dt, N, V, scale)); /* in place */
  got = downf(dev, dx, N * V);
  expect_close("cross_entropy_backward in place", got, g, N * V, 1e-5);
  free(got);
  free(x), free(t), free(lse), free(g);
  weft_free(dx), weft_free(dl), weft_free(dg), weft_free(dt);
}

/* The loss-parallel pieces over four vocab shards (one of them empty)
 * compose, with the reductions done here, to the full loss, lse and
 * gradient. */
BACKEND_TEST(vocab_sharded_cross_entropy_pieces_compose_to_the_full_loss) {
  seed_tests(192);
  const int64_t N = 29, V = 101, cuts[5] = {0, 40, 40, 77, 101};
  float *x = h_normal(N * V, 2.0);
  int32_t *t = h_ids(N, 0, V);
  int32_t *dt = dupi(dev, t, N);
  const float scale = 0.5f / (float)N;
  double *lse = h_dbl(N), *g = h_dbl(N * V);
  const double loss = ce_ref(x, t, N, V, scale, lse, g);
  float *gmax = xmalloc((size_t)N * 4), *gtgt = xmalloc((size_t)N * 4),
        *gsum = xmalloc((size_t)N * 4);
  for (int64_t n = 0; n < N; n++) gmax[n] = -INFINITY, gtgt[n] = 0.0f, gsum[n] = 0.0f;
  float *dtmp = dnan(dev, (size_t)N * 4), *dsh[4];
  double *w = h_dbl(N);
  for (int s = 0; s < 4; s++) {
    const int64_t v0 = cuts[s], nv = cuts[s + 1] - cuts[s];
    float *sh = xmalloc((size_t)(N * nv + 1) * 4);
    for (int64_t n = 0; n < N; n++) memcpy(sh + n * nv, x + n * V + v0, (size_t)nv * 4);
    dsh[s] = dupf(dev, sh, N * nv > 0 ? N * nv : 1);
    dpoison(dev, dtmp, (size_t)N * 4);
    OK(weft_backend_cross_entropy_local_max(dev, dtmp, dsh[s], N, nv));
    float *h = downf(dev, dtmp, N);
    for (int64_t n = 0; n < N; n++) {
      w[n] = -INFINITY;
      for (int64_t j = 0; j < nv; j++) w[n] = sh[n * nv + j] > w[n] ? sh[n * nv + j] : w[n];
    }
    expect_values(
        nv ? "cross_entropy_local_max" : "cross_entropy_local_max of an empty shard (-inf)", h,
        WEFT_F32, w, N);
    for (int64_t n = 0; n < N; n++) gmax[n] = h[n] > gmax[n] ? h[n] : gmax[n];
    free(h);
    dpoison(dev, dtmp, (size_t)N * 4);
    OK(weft_backend_cross_entropy_local_target(dev, dtmp, dsh[s], dt, N, v0, nv));
    h = downf(dev, dtmp, N);
    for (int64_t n = 0; n < N; n++)
      w[n] = (t[n] >= v0 && t[n] < v0 + nv) ? sh[n * nv + t[n] - v0] : 0.0;
    expect_values("cross_entropy_local_target", h, WEFT_F32, w, N);
    for (int64_t n = 0; n < N; n++) gtgt[n] += h[n];
    free(h), free(sh);
  }
  float *dgmax = dupf(dev, gmax, N);
  for (int s = 0; s < 4; s++) {
    const int64_t v0 = cuts[s], nv = cuts[s + 1] - cuts[s];
    dpoison(dev, dtmp, (size_t)N * 4);
    OK(weft_backend_cross_entropy_local_sumexp(dev, dtmp, dsh[s], dgmax, N, nv));
    float *h = downf(dev, dtmp, N);
    for (int64_t n = 0; n < N; n++) {
      w[n] = 0.0;
      for (int64_t j = 0; j < nv; j++) w[n] += exp((double)x[n * V + v0 + j] - gmax[n]);
    }
    expect_close(nv ? "cross_entropy_local_sumexp" : "cross_entropy_local_sumexp of an empty shard",
                 h, w, N, 1e-5);
    for (int64_t n = 0; n < N; n++) gsum[n] += h[n];
    free(h);
  }
  float *dgsum = dupf(dev, gsum, N), *dgtgt = dupf(dev, gtgt, N), *dl = dnan(dev, (size_t)N * 4);
  double got_loss = NAN;
  OK(weft_backend_cross_entropy_finish(dev, &got_loss, dl, dgmax, dgsum, dgtgt, N));
  expect_rel("sharded loss vs the full loss", got_loss, loss, 1e-5);
  float *h = downf(dev, dl, N);
  expect_close("sharded lse vs the full lse", h, lse, N, 1e-5);
  free(h);
  for (int s = 0; s < 4; s++) {
    const int64_t v0 = cuts[s], nv = cuts[s + 1] - cuts[s];
    if (nv == 0) {
      OK(weft_backend_cross_entropy_backward_local(dev, NULL, NULL, dl, dt, N, v0, 0, scale));
      continue;
    }
    float *dgs = dnan(dev, (size_t)(N * nv) * 4);
    OK(weft_backend_cross_entropy_backward_local(dev, dgs, dsh[s], dl, dt, N, v0, nv, scale));
    double *want = h_dbl(N * nv);
    for (int64_t n = 0; n < N; n++)
      for (int64_t j = 0; j < nv; j++) want[n * nv + j] = g[n * V + v0 + j];
    h = downf(dev, dgs, N * nv);
    expect_close("cross_entropy_backward_local vs the full gradient's slice", h, want, N * nv,
                 1e-5);
    free(h), free(want);
    weft_free(dgs);
  }
  for (int s = 0; s < 4; s++) weft_free(dsh[s]);
  free(x), free(t), free(lse), free(g), free(gmax), free(gtgt), free(gsum), free(w);
  weft_free(dt), weft_free(dtmp), weft_free(dgmax);
  weft_free(dgsum), weft_free(dgtgt), weft_free(dl);
}

BACKEND_TEST(bad_ids_are_rejected_before_anything_is_written) {
  seed_tests(193);
  const int64_t N = 9, V = 7, C = 5;
  int32_t *tok = h_ids(N, 0, V);
  tok[4] = (int32_t)V;
  int32_t *dtok = dupi(dev, tok, N);
  float *w = h_normal(V * C, 1.0), *dw = dupf(dev, w, V * C), *out = dnan(dev, (size_t)(N * C) * 4);
  cr_assert_eq(weft_backend_embedding_forward(dev, out, dtok, dw, N, V, C), WEFT_ERR_INVALID);
  float *h = downf(dev, out, N * C);
  for (int64_t i = 0; i < N * C; i++)
    cr_assert(isnan(h[i]), "embedding_forward wrote out[%lld] = %g before failing", (long long)i,
              (double)h[i]);
  free(h);
  cr_assert_eq(weft_backend_embedding_backward(dev, dw, dtok, out, N, V, C), WEFT_ERR_INVALID);
  h = downf(dev, dw, V * C);
  expect_same_bytes("embedding_backward wrote dweight before failing", h, w, V * C, 4);
  free(h);
  float *x = h_normal(N * V, 1.0), *dx = dupf(dev, x, N * V), *dl = dnan(dev, (size_t)N * 4);
  double loss = 42.0;
  cr_assert_eq(weft_backend_cross_entropy_forward(dev, &loss, dl, dx, dtok, N, V),
               WEFT_ERR_INVALID);
  cr_assert_eq(loss, 42.0, "loss written before failing: %g", loss);
  h = downf(dev, dl, N);
  for (int64_t i = 0; i < N; i++)
    cr_assert(isnan(h[i]), "lse[%lld] written before failing", (long long)i);
  free(h);
  float *dg = dnan(dev, (size_t)(N * V) * 4);
  cr_assert_eq(weft_backend_cross_entropy_backward(dev, dg, dx, dl, dtok, N, V, 1.0f),
               WEFT_ERR_INVALID);
  h = downf(dev, dg, N * V);
  for (int64_t i = 0; i < N * V; i++)
    cr_assert(isnan(h[i]), "dlogits[%lld] written before failing", (long long)i);
  free(h), free(tok), free(w), free(x);
  weft_free(dtok), weft_free(dw), weft_free(out), weft_free(dx), weft_free(dl), weft_free(dg);
}

/* ============================================================ optimizers */

/* One torch.optim.AdamW step (layers.h) in double on one element. */
static void adamw_ref(double *p, double g, double *m, double *v, double *vmax, int64_t step,
                      const weft_adamw_params *hp) {
  if (hp->maximize) g = -g;
  *p *= 1.0 - (double)hp->lr * hp->weight_decay;
  *m = hp->beta1 * *m + (1.0 - hp->beta1) * g;
  *v = hp->beta2 * *v + (1.0 - hp->beta2) * g * g;
  double vv = *v;
  if (hp->amsgrad) vv = *vmax = *vmax > *v ? *vmax : *v;
  const double bc1 = 1.0 - pow(hp->beta1, (double)step), bc2 = 1.0 - pow(hp->beta2, (double)step);
  *p -= hp->lr / bc1 * *m / (sqrt(vv) / sqrt(bc2) + hp->eps);
}

BACKEND_TEST(adamw_multi_two_steps_match_torch_formula_with_amsgrad_maximize_and_empty_tensors) {
  seed_tests(201);
  enum { NT = 4 };
  const int64_t n[NT] = {1001, 37, 0, 130};
  for (int variant = 0; variant < 2; variant++) {
    weft_adamw_params hp = WEFT_ADAMW_DEFAULT;
    hp.lr = 0.05f, hp.weight_decay = 0.1f;
    if (variant) hp.amsgrad = hp.maximize = true, hp.beta2 = 0.95f;
    float *h[5][NT], *d[5][NT], *g2[NT]; /* param, grad (step 1), m, v, vmax; grad step 2 */
    double *r[5][NT];
    for (int i = 0; i < NT; i++) {
      const int off = i == 1; /* one tensor at an odd offset */
      h[0][i] = h_normal(n[i], 1.0), h[1][i] = h_normal(n[i], 1.0), h[2][i] = h_normal(n[i], 0.1);
      h[3][i] = h_unif(n[i], 0.0, 0.01), h[4][i] = h_unif(n[i], 0.0, 0.02);
      g2[i] = h_normal(n[i], 1.0);
      for (int a = 0; a < 5; a++) {
        r[a][i] = to_dbl(h[a][i], n[i]);
        if (n[i] == 0) { /* empty: NULL pointers are fine */
          d[a][i] = NULL;
          continue;
        }
        float *buf = dalloc(dev, (size_t)(n[i] + 1) * 4);
        d[a][i] = buf + off;
        upf(dev, d[a][i], h[a][i], n[i]);
      }
    }
    for (int64_t step = 1; step <= 2; step++) {
      if (step == 2)
        for (int i = 0; i < NT; i++) {
          upf(dev, d[1][i], g2[i], n[i]);
          for (int64_t j = 0; j < n[i]; j++) r[1][i][j] = g2[i][j];
        }
      OK(weft_backend_adamw_multi(dev, d[0], (const float *const *)d[1], d[2], d[3],
                                  variant ? d[4] : NULL, n, NT, step, &hp));
      for (int i = 0; i < NT; i++)
        for (int64_t j = 0; j < n[i]; j++)
          adamw_ref(&r[0][i][j], r[1][i][j], &r[2][i][j], &r[3][i][j], &r[4][i][j], step, &hp);
    }
    static const char *const names[5] = {"param", "grad", "exp_avg", "exp_avg_sq",
                                         "max_exp_avg_sq"};
    for (int i = 0; i < NT; i++) {
      for (int a = 0; a < 5; a++) {
        if (a == 1 || (a == 4 && !variant) || n[i] == 0) continue;
        float *got = downf(dev, d[a][i], n[i]);
        char what[128];
        snprintf(what, sizeof what, "adamw_multi%s tensor %d (n %lld) %s after 2 steps",
                 variant ? " amsgrad maximize" : "", i, (long long)n[i], names[a]);
        expect_close(what, got, r[a][i], n[i], 1e-5);
        if (a == 0) { /* the update itself, not only the decayed parameter */
          float *upd = xmalloc((size_t)n[i] * 4);
          double *want = h_dbl(n[i]);
          for (int64_t j = 0; j < n[i]; j++)
            upd[j] = (float)((double)got[j] - h[0][i][j]), want[j] = r[0][i][j] - h[0][i][j];
          snprintf(what, sizeof what, "adamw_multi%s tensor %d: param - param0",
                   variant ? " amsgrad maximize" : "", i);
          expect_close(what, upd, want, n[i], 1e-4);
          free(upd), free(want);
        }
        free(got);
      }
      for (int a = 0; a < 5; a++) {
        if (d[a][i]) weft_free(d[a][i] - (i == 1));
        free(h[a][i]), free(r[a][i]);
      }
      free(g2[i]);
    }
  }
}

BACKEND_TEST(sgd_multi_two_steps_match_torch_formula_for_momentum_nesterov_dampening) {
  seed_tests(202);
  enum { NT = 3 };
  const int64_t n[NT] = {1001, 0, 37};
  const weft_sgd_params variants[4] = {
      {.lr = 0.1f, .weight_decay = 0.01f},
      {.lr = 0.1f, .momentum = 0.9f, .dampening = 0.1f, .weight_decay = 0.01f},
      {.lr = 0.05f, .momentum = 0.9f, .nesterov = true},
      {.lr = 0.05f, .momentum = 0.5f, .maximize = true, .weight_decay = 0.1f},
  };
  for (int vi = 0; vi < 4; vi++) {
    const weft_sgd_params *hp = &variants[vi];
    const bool mom = hp->momentum != 0.0f;
    float *p[NT], *g[2][NT], *dp[NT], *dg[NT], *db[NT];
    double *rp[NT], *rb[NT];
    for (int i = 0; i < NT; i++) {
      p[i] = h_normal(n[i], 1.0), g[0][i] = h_normal(n[i], 1.0), g[1][i] = h_normal(n[i], 1.0);
      rp[i] = to_dbl(p[i], n[i]), rb[i] = h_dbl(n[i]);
      dp[i] = n[i] ? dupf(dev, p[i], n[i]) : NULL;
      dg[i] = n[i] ? dalloc(dev, (size_t)n[i] * 4) : NULL;
      db[i] = n[i] && mom ? dnan(dev, (size_t)n[i] * 4) : NULL; /* step 1 must not read it */
    }
    for (int64_t step = 1; step <= 2; step++) {
      for (int i = 0; i < NT; i++) upf(dev, dg[i], g[step - 1][i], n[i]);
      OK(weft_backend_sgd_multi(dev, dp, (const float *const *)dg, mom ? db : NULL, n, NT, step,
                                hp));
      for (int i = 0; i < NT; i++)
        for (int64_t j = 0; j < n[i]; j++) { /* torch.optim.SGD */
          double d = (hp->maximize ? -1.0 : 1.0) * g[step - 1][i][j] + hp->weight_decay * rp[i][j];
          if (mom) {
            rb[i][j] = step == 1 ? d : hp->momentum * rb[i][j] + (1.0 - hp->dampening) * d;
            d = hp->nesterov ? d + hp->momentum * rb[i][j] : rb[i][j];
          }
          rp[i][j] -= hp->lr * d;
        }
    }
    for (int i = 0; i < NT; i++) {
      if (n[i] == 0) continue;
      char what[96];
      snprintf(what, sizeof what, "sgd_multi variant %d tensor %d param", vi, i);
      float *got = downf(dev, dp[i], n[i]);
      expect_close(what, got, rp[i], n[i], 1e-5);
      free(got);
      if (mom) {
        snprintf(what, sizeof what, "sgd_multi variant %d tensor %d momentum buffer", vi, i);
        got = downf(dev, db[i], n[i]);
        expect_close(what, got, rb[i], n[i], 1e-5);
        free(got);
      }
      weft_free(dp[i]), weft_free(dg[i]), weft_free(db[i]);
    }
    for (int i = 0; i < NT; i++) free(p[i]), free(g[0][i]), free(g[1][i]), free(rp[i]), free(rb[i]);
  }
}

BACKEND_TEST(sumsq_multi_per_tensor_and_scale_multi_match_references) {
  seed_tests(203);
  enum { NT = 4 };
  const int64_t n[NT] = {1001, 0, 37, 5000};
  float *x[NT], *dx[NT];
  double out[NT], want[NT];
  for (int i = 0; i < NT; i++) {
    x[i] = h_normal(n[i], 1.0);
    dx[i] = n[i] ? (float *)dalloc(dev, (size_t)(n[i] + 1) * 4) + (i == 2) : NULL;
    upf(dev, dx[i], x[i], n[i]);
    want[i] = 0.0;
    for (int64_t j = 0; j < n[i]; j++) want[i] += (double)x[i][j] * x[i][j];
    out[i] = NAN;
  }
  OK(weft_backend_sumsq_multi(dev, (const float *const *)dx, n, NT, out));
  for (int i = 0; i < NT; i++) {
    char what[64];
    snprintf(what, sizeof what, "sumsq_multi tensor %d (n %lld)", i, (long long)n[i]);
    if (n[i] == 0)
      cr_assert_eq(out[i], 0.0, "%s: %g, want 0", what, out[i]);
    else
      expect_rel(what, out[i], want[i], 1e-12);
  }
  OK(weft_backend_sumsq_multi(dev, (const float *const *)dx, n, 0, NULL));
  OK(weft_backend_scale_multi(dev, dx, n, NT, 0.37f));
  for (int i = 0; i < NT; i++) {
    if (n[i] == 0) {
      free(x[i]);
      continue;
    }
    double *w = h_dbl(n[i]);
    for (int64_t j = 0; j < n[i]; j++) w[j] = (float)((double)x[i][j] * (double)0.37f);
    float *got = downf(dev, dx[i], n[i]);
    expect_values("scale_multi (one f32 multiply: exact)", got, WEFT_F32, w, n[i]);
    free(got), free(w);
    weft_free(dx[i] - (i == 2));
    free(x[i]);
  }
}

/* ========================================================= flat buffers */

BACKEND_TEST(flat_pack_split_accumulate_cast_pad_and_leave_gaps_alone) {
  seed_tests(211);
  const weft_dtype fdts[3] = {WEFT_F32, WEFT_BF16, WEFT_F16};
  /* four pieces: gaps between them and at the end of the flat buffer */
  enum { NP = 4, FLAT = 90 };
  const weft_dtype pdt[NP] = {WEFT_F32, WEFT_BF16, WEFT_F16, WEFT_F32};
  const int64_t off[NP] = {0, 45, 65, 80}, cnt[NP] = {37, 20, 13, 5}, pad[NP] = {3, 0, 2, 1};
  for (int f = 0; f < 3; f++) {
    const weft_dtype fdt = fdts[f];
    const size_t fes = esz(fdt);
    double *pv[NP];
    void *dd[NP];
    weft_flat_piece pc[NP];
    for (int i = 0; i < NP; i++) {
      pv[i] = cast_sources(pdt[i], cnt[i]);
      char *hb = xmalloc((size_t)cnt[i] * esz(pdt[i]));
      for (int64_t j = 0; j < cnt[i]; j++) enc(hb + (size_t)j * esz(pdt[i]), pdt[i], pv[i][j]);
      dd[i] = dup_h(dev, hb, (size_t)cnt[i] * esz(pdt[i]));
      free(hb);
      pc[i] = (weft_flat_piece){i == 3 ? NULL : dd[i], pdt[i], off[i], cnt[i], pad[i]};
    }
    /* pack: values cast to the flat dtype, pads zero, gaps untouched */
    char *flat = dnan(dev, FLAT * fes);
    OK(weft_backend_flat_pack(dev, flat, fdt, pc, NP));
    char *got = down(dev, flat, FLAT * fes);
    for (int i = 0; i < NP; i++) {
      double *want = h_dbl(cnt[i] + pad[i]);
      for (int64_t j = 0; j < cnt[i] + pad[i]; j++)
        want[j] = j < cnt[i] && i != 3 ? conv(fdt, pv[i][j]) : 0.0;
      char what[96];
      snprintf(what, sizeof what, "flat_pack %s piece %d (%s%s) and its pad", weft_dtype_name(fdt),
               i, weft_dtype_name(pdt[i]), i == 3 ? ", data NULL: zeros" : "");
      expect_values(what, got + (size_t)off[i] * fes, fdt, want, cnt[i] + pad[i]);
      free(want);
    }
    const int64_t gaps[2][2] = {{40, 45}, {86, FLAT}};
    for (int k = 0; k < 2; k++)
      for (int64_t j = gaps[k][0] * (int64_t)fes; j < gaps[k][1] * (int64_t)fes; j++)
        cr_assert_eq((unsigned char)got[j], 0xFF,
                     "flat_pack %s wrote byte %lld of a gap (seed %lu)", weft_dtype_name(fdt),
                     (long long)j, g_seed);
    free(got);

    /* split: a flat buffer of random values into the pieces, cast */
    double *fv = rand_vals(fdt, FLAT, -3.0, 3.0);
    char *hf = xmalloc(FLAT * fes);
    for (int64_t j = 0; j < FLAT; j++) enc(hf + (size_t)j * fes, fdt, fv[j]);
    OK(weft_memcpy(dev, flat, hf, FLAT * fes, WEFT_COPY_H2D));
    for (int i = 0; i < NP; i++) {
      dpoison(dev, dd[i], (size_t)cnt[i] * esz(pdt[i]));
      pc[i].data = dd[i];
    }
    OK(weft_backend_flat_split(dev, flat, fdt, pc, NP));
    for (int i = 0; i < NP; i++) {
      got = down(dev, dd[i], (size_t)cnt[i] * esz(pdt[i]));
      double *want = h_dbl(cnt[i]);
      for (int64_t j = 0; j < cnt[i]; j++) want[j] = conv(pdt[i], fv[off[i] + j]);
      char what[96];
      snprintf(what, sizeof what, "flat_split %s -> piece %d (%s)", weft_dtype_name(fdt), i,
               weft_dtype_name(pdt[i]));
      expect_values(what, got, pdt[i], want, cnt[i]);
      free(got), free(want);
    }

    /* accumulate: f32 pieces += scale * flat, in fp32 */
    const float scale = 0.37f;
    weft_flat_piece ac[2];
    float *acc_h[2], *acc_d[2];
    for (int i = 0; i < 2; i++) {
      const int64_t ai = i ? 3 : 0;
      acc_h[i] = h_normal(cnt[ai], 1.0);
      acc_d[i] = dupf(dev, acc_h[i], cnt[ai]);
      ac[i] = (weft_flat_piece){acc_d[i], WEFT_F32, off[ai], cnt[ai], 0};
    }
    OK(weft_backend_flat_accumulate(dev, flat, fdt, ac, 2, scale));
    for (int i = 0; i < 2; i++) {
      const int64_t ai = i ? 3 : 0;
      float *g = downf(dev, acc_d[i], cnt[ai]);
      double *want = h_dbl(cnt[ai]);
      for (int64_t j = 0; j < cnt[ai]; j++)
        want[j] = (float)((double)acc_h[i][j] + (double)(float)((double)scale * fv[off[ai] + j]));
      expect_values("flat_accumulate (+= scale * flat in fp32)", g, WEFT_F32, want, cnt[ai]);
      free(g), free(want), free(acc_h[i]);
      weft_free(acc_d[i]);
    }
    OK(weft_backend_flat_pack(dev, NULL, fdt, NULL, 0));
    for (int i = 0; i < NP; i++) free(pv[i]), weft_free(dd[i]);
    free(fv), free(hf);
    weft_free(flat);
  }
}

/* ======================================================= bad arguments
 * Each group runs the same bad calls on a backend and records status and
 * message; on a device the results must equal the CPU's: the same status
 * and the same first line (tensor descriptions may say "on cuda"), and the
 * raw-pointer calls' second line names the device. */

typedef struct ebufs {
  weft_device dev;
  float *f;         /* 4096 floats of 0.5 */
  float *gz;        /* {1, 1, 0, 1}: a sum of exponentials of 0 in row 2 */
  int32_t *tok_bad; /* 9 ids < 7, but [4] = 7 and [6] = -1 */
  int32_t *tok_ok;  /* 9 ids in [0, 7) */
} ebufs;

typedef struct eres {
  const char *expr, *needle, *op; /* op: the dispatched member (raw calls), or NULL */
  weft_status want, st;
  bool cmp_line; /* false: the message may differ (it prints pointers) */
  char line[512], msg[2048];
} eres;

static ebufs ebufs_make(weft_device dev) {
  ebufs b = {dev, NULL, NULL, NULL, NULL};
  float *h = xmalloc(4096 * 4);
  for (int i = 0; i < 4096; i++) h[i] = 0.5f;
  b.f = dupf(dev, h, 4096);
  const float gz[4] = {1.0f, 1.0f, 0.0f, 1.0f};
  b.gz = dupf(dev, gz, 4);
  const int32_t bad[9] = {1, 2, 3, 0, 7, 5, -1, 2, 3}, good[9] = {1, 2, 3, 0, 6, 5, 4, 2, 3};
  b.tok_bad = dupi(dev, bad, 9);
  b.tok_ok = dupi(dev, good, 9);
  free(h);
  return b;
}
static void ebufs_free(ebufs *b) {
  weft_free(b->f), weft_free(b->gz), weft_free(b->tok_bad), weft_free(b->tok_ok);
}

static void erecord(eres *r, const char *expr, const char *op, weft_status want, const char *needle,
                    bool cmp_line, weft_status st) {
  r->expr = expr, r->op = op, r->want = want, r->needle = needle, r->cmp_line = cmp_line;
  r->st = st;
  snprintf(r->msg, sizeof r->msg, "%s", weft_last_error());
  size_t l = strcspn(r->msg, "\n");
  if (l >= sizeof r->line) l = sizeof r->line - 1;
  memcpy(r->line, r->msg, l);
  r->line[l] = '\0';
}
/* E(op, want, needle, call): a dispatched raw call; T(...): a tensor entry
 * point; P(...): like E, but the message may differ between backends. */
#define E_(op, want, needle, cmp, expr)                      \
  do {                                                       \
    weft_clear_error();                                      \
    weft_status e_st_ = (expr);                              \
    erecord(&res[n++], #expr, op, want, needle, cmp, e_st_); \
  } while (0)
#define E(op, want, needle, expr) E_(op, want, needle, true, expr)
#define P(op, want, needle, expr) E_(op, want, needle, false, expr)
#define T(want, needle, expr) E_(NULL, want, needle, true, expr)
#define INV WEFT_ERR_INVALID
#define UNS WEFT_ERR_UNSUPPORTED

/* The first line with " on <device>" removed (tensor descriptions). */
static void strip_device(const char *in, const char *devname, char *out, size_t cap) {
  char pat[32];
  snprintf(pat, sizeof pat, " on %s", devname);
  size_t o = 0;
  for (const char *p = in; *p && o + 1 < cap;) {
    if (strncmp(p, pat, strlen(pat)) == 0) {
      p += strlen(pat);
      continue;
    }
    out[o++] = *p++;
  }
  out[o] = '\0';
}

typedef int (*egroup)(const ebufs *b, eres *res);

static void check_errors(weft_device dev, egroup group, const char *gname) {
  enum { MAXC = 48 };
  eres *res = xmalloc(MAXC * sizeof(eres)), *cpu = xmalloc(MAXC * sizeof(eres));
  ebufs b = ebufs_make(dev);
  const int n = group(&b, res);
  cr_assert(n <= MAXC);
  for (int i = 0; i < n; i++) {
    const eres *r = &res[i];
    cr_assert_eq(r->st, r->want, "%s on %s: %s gave %s (%d), want %s; message: %s", gname,
                 weft_backend_name(dev), r->expr, weft_status_str(r->st), (int)r->st,
                 weft_status_str(r->want), r->msg);
    cr_assert(strstr(r->line, r->needle) != NULL, "%s on %s: %s: first line '%s' lacks '%s'", gname,
              weft_backend_name(dev), r->expr, r->line, r->needle);
    if (r->op) {
      char where[96];
      snprintf(where, sizeof where, "\n  in %s on %s", r->op, weft_device_name(dev));
      cr_assert(strstr(r->msg, where) != NULL, "%s on %s: %s: message '%s' lacks the line '%s'",
                gname, weft_backend_name(dev), r->expr, r->msg, where + 1);
    }
  }
  if (dev != WEFT_CPU) {
    ebufs c = ebufs_make(WEFT_CPU);
    const int nc = group(&c, cpu);
    cr_assert_eq(nc, n);
    for (int i = 0; i < n; i++) {
      cr_assert_eq(res[i].st, cpu[i].st, "%s: %s: %s gives %s, the cpu %s (%s | %s)", gname,
                   weft_backend_name(dev), res[i].expr, weft_status_str(res[i].st),
                   weft_status_str(cpu[i].st), res[i].line, cpu[i].line);
      if (!res[i].cmp_line) continue;
      char a[512], bb[512];
      strip_device(res[i].line, weft_device_name(dev), a, sizeof a);
      strip_device(cpu[i].line, weft_device_name(WEFT_CPU), bb, sizeof bb);
      cr_assert_str_eq(a, bb, "%s: %s: first line on %s differs from the cpu's:\n  %s\n  %s", gname,
                       res[i].expr, weft_backend_name(dev), res[i].line, cpu[i].line);
    }
    ebufs_free(&c);
  }
  ebufs_free(&b);
  free(res), free(cpu);
}

static int errs_memory_and_gemm(const ebufs *b, eres *res) {
  int n = 0;
  const weft_device dev = b->dev;
  float *f = b->f;
  E("memset", INV, "dst is NULL", weft_memset(dev, NULL, 0, 16));
  E("memcpy", INV, "NULL", weft_memcpy(dev, NULL, f, 16, WEFT_COPY_D2D));
  E("memcpy", INV, "unknown copy kind 7", weft_memcpy(dev, f, f + 64, 16, (weft_copy_kind)7));
  P("memcpy", INV, "overlap", weft_memcpy(dev, f, f + 2, 64, WEFT_COPY_D2D));
  E("sgemm", INV, "negative size: m -1, n 2, k 2",
    weft_backend_sgemm(dev, false, false, -1, 2, 2, 1.0f, f, 2, f, 2, 0.0f, f, 2));
  E("sgemm", INV, "lda 3 (need >= 4)",
    weft_backend_sgemm(dev, false, false, 4, 4, 4, 1.0f, f, 3, f, 4, 0.0f, f, 4));
  E("sgemm", INV, "ldc 3 (need >= 4)",
    weft_backend_sgemm(dev, false, true, 4, 4, 4, 1.0f, f, 4, f, 4, 0.0f, f, 3));
  E("sgemm", INV, "NULL matrix pointer",
    weft_backend_sgemm(dev, false, false, 2, 2, 2, 1.0f, NULL, 2, f, 2, 0.0f, f, 2));
  E("sgemm_strided_batched", INV, "would overlap",
    weft_backend_sgemm_strided_batched(dev, false, false, 4, 4, 4, 1.0f, f, 4, 16, f, 4, 16, 0.0f,
                                       f + 100, 4, 8, 2));
  E("sgemm_strided_batched", INV, "negative batch count -1",
    weft_backend_sgemm_strided_batched(dev, false, false, 2, 2, 2, 1.0f, f, 2, 4, f, 2, 4, 0.0f,
                                       f + 100, 2, 4, -1));
  E("sgemm_strided_batched", INV, "negative batch stride",
    weft_backend_sgemm_strided_batched(dev, false, false, 2, 2, 2, 1.0f, f, 2, -4, f, 2, 4, 0.0f,
                                       f + 100, 2, 4, 2));
  E("gemm_bf16", INV, "lda 3 (need >= 4)",
    weft_backend_gemm_bf16(dev, true, false, 4, 4, 4, 1.0f, (const uint16_t *)f, 3,
                           (const uint16_t *)f, 4, 0.0f, f + 100, 4));
  E("gemm_bf16", INV, "NULL matrix pointer",
    weft_backend_gemm_bf16(dev, false, false, 2, 2, 2, 1.0f, (const uint16_t *)f, 2,
                           (const uint16_t *)f, 2, 0.0f, NULL, 2));
  return n;
}

static int errs_layers(const ebufs *b, eres *res) {
  int n = 0;
  const weft_device dev = b->dev;
  float *f = b->f;
  E("embedding_forward", INV, "tokens[4] = 7 is outside the vocabulary [0, 7)",
    weft_backend_embedding_forward(dev, f, b->tok_bad, f + 1024, 9, 7, 5));
  E("embedding_backward", INV, "tokens[4] = 7 is outside the vocabulary [0, 7)",
    weft_backend_embedding_backward(dev, f, b->tok_bad, f + 1024, 9, 7, 5));
  E("embedding_forward", INV, "size argument 1 is negative (-1)",
    weft_backend_embedding_forward(dev, f, b->tok_ok, f + 1024, -1, 7, 5));
  E("embedding_forward", INV, "tokens is NULL",
    weft_backend_embedding_forward(dev, f, NULL, f + 1024, 9, 7, 5));
  E("embedding_range_forward", INV, "tokens[6] = -1 is negative",
    weft_backend_embedding_range_forward(dev, f, b->tok_bad, f + 1024, 9, 0, 7, 5));
  E("embedding_range_backward", INV, "size argument 2 is negative (-2)",
    weft_backend_embedding_range_backward(dev, f, b->tok_ok, f + 1024, 9, -2, 7, 5));
  E("linear_forward", INV, "size argument 2 is negative (-3)",
    weft_backend_linear_forward(dev, f, f + 1024, f + 2048, NULL, 4, -3, 5));
  E("linear_forward", INV, "out is NULL",
    weft_backend_linear_forward(dev, NULL, f + 1024, f + 2048, NULL, 4, 3, 5));
  E("linear_backward", INV, "dout is NULL",
    weft_backend_linear_backward(dev, f, f + 512, NULL, NULL, f + 1024, f + 2048, 4, 3, 5, false,
                                 false));
  E("rmsnorm_forward", INV, "C = 0",
    weft_backend_rmsnorm_forward(dev, f, f + 512, f + 1024, f + 2048, 3, 0, 1e-5f));
  E("rmsnorm_forward", INV, "eps = -1 must be >= 0",
    weft_backend_rmsnorm_forward(dev, f, f + 512, f + 1024, f + 2048, 3, 4, -1.0f));
  E("rmsnorm_forward", INV, "eps = nan must be >= 0",
    weft_backend_rmsnorm_forward(dev, f, f + 512, f + 1024, f + 2048, 3, 4, NAN));
  E("rmsnorm_backward", INV, "rstd is NULL",
    weft_backend_rmsnorm_backward(dev, f, f + 512, f + 1024, f + 2048, f + 3000, NULL, 3, 4,
                                  false));
  E("rope_tables", INV, "head dim 5 must be even and > 0",
    weft_backend_rope_tables(dev, f, f + 512, 8, 5, 10000.0));
  E("rope_tables", INV, "theta = 0 must be > 0",
    weft_backend_rope_tables(dev, f, f + 512, 8, 4, 0.0));
  E("rope_forward", INV, "positions [38, 41) run past the tables' 40 rows",
    weft_backend_rope_forward(dev, f, f + 1024, f + 2048, f + 3000, 40, 1, 3, 2, 4, 38));
  E("rope_backward", INV, "size argument 6 is negative (-1)",
    weft_backend_rope_backward(dev, f, f + 1024, f + 2048, f + 3000, 40, 1, 3, 2, 4, -1));
  E("rope_forward", INV, "head dim 0 must be even and > 0",
    weft_backend_rope_forward(dev, f, f + 1024, f + 2048, f + 3000, 40, 1, 3, 2, 0, 0));
  E("attention_forward", INV, "H = 3 query heads is not a multiple of Hkv = 2",
    weft_backend_attention_forward(dev, f, f + 512, f + 1024, f + 2048, f + 3000, 1, 2, 3, 2, 4,
                                   true, f));
  E("attention_forward", INV, "H = 2 query heads is not a multiple of Hkv = 0",
    weft_backend_attention_forward(dev, f, f + 512, f + 1024, f + 2048, f + 3000, 1, 2, 2, 0, 4,
                                   true, f));
  E("attention_backward", INV, "size argument 2 is negative (-2)",
    weft_backend_attention_backward(dev, f, f + 256, f + 512, f + 1024, f + 1500, f + 2048,
                                    f + 2500, f + 3000, f + 3500, 1, -2, 2, 2, 4, true, f));
  E("attention_forward", INV, "scratch is NULL",
    weft_backend_attention_forward(dev, f, f + 512, f + 1024, f + 2048, f + 3000, 1, 2, 2, 2, 4,
                                   true, NULL));
  /* out (forward's output) is an input of every backend's backward */
  E("attention_backward", INV, "out is NULL",
    weft_backend_attention_backward(dev, f, f + 256, f + 512, f + 1024, f + 1500, f + 2048,
                                    f + 2500, f + 3000, NULL, 1, 2, 2, 2, 4, true, f));
  E("attention_forward", INV, "q is NULL",
    weft_backend_attention_forward(dev, f, f + 512, NULL, f + 2048, f + 3000, 1, 2, 2, 2, 4, true,
                                   f));
  return n;
}

static int errs_pointwise_and_loss(const ebufs *b, eres *res) {
  int n = 0;
  const weft_device dev = b->dev;
  float *f = b->f;
  double loss = 0.0;
  E("swiglu_forward", INV, "size argument 1 is negative (-1)",
    weft_backend_swiglu_forward(dev, f, f + 1024, f + 2048, -1));
  E("swiglu_backward", INV, "db is NULL",
    weft_backend_swiglu_backward(dev, f, NULL, f + 512, f + 1024, f + 2048, 8));
  E("residual_forward", INV, "b is NULL", weft_backend_residual_forward(dev, f, f + 1024, NULL, 8));
  E("residual_backward", INV, "dout is NULL",
    weft_backend_residual_backward(dev, f, f + 512, NULL, 8));
  E("cross_entropy_forward", INV, "targets[4] = 7 is outside the vocabulary [0, 7)",
    weft_backend_cross_entropy_forward(dev, &loss, f, f + 1024, b->tok_bad, 9, 7));
  E("cross_entropy_forward", INV, "V = 0: no classes",
    weft_backend_cross_entropy_forward(dev, &loss, f, f + 1024, b->tok_ok, 2, 0));
  E("cross_entropy_forward", INV, "loss is NULL",
    weft_backend_cross_entropy_forward(dev, NULL, f, f + 1024, b->tok_ok, 9, 7));
  E("cross_entropy_backward", INV, "targets[4] = 7 is outside the vocabulary [0, 7)",
    weft_backend_cross_entropy_backward(dev, f, f + 1024, f + 2048, b->tok_bad, 9, 7, 1.0f));
  E("cross_entropy_local_max", INV, "size argument 1 is negative (-1)",
    weft_backend_cross_entropy_local_max(dev, f, f + 1024, -1, 7));
  E("cross_entropy_local_target", INV, "targets[6] = -1 is negative",
    weft_backend_cross_entropy_local_target(dev, f, f + 1024, b->tok_bad, 9, 0, 7));
  E("cross_entropy_local_sumexp", INV, "gmax is NULL",
    weft_backend_cross_entropy_local_sumexp(dev, f, f + 1024, NULL, 9, 7));
  E("cross_entropy_finish", INV, "sum of exponentials of row 2 is 0 (must be > 0)",
    weft_backend_cross_entropy_finish(dev, &loss, f, b->gz, b->gz, b->gz, 4));
  E("cross_entropy_backward_local", INV, "targets[6] = -1 is negative",
    weft_backend_cross_entropy_backward_local(dev, f, f + 1024, f + 2048, b->tok_bad, 9, 0, 7,
                                              1.0f));
  return n;
}

static int errs_optim_and_flat(const ebufs *b, eres *res) {
  int n = 0;
  const weft_device dev = b->dev;
  float *f = b->f;
  float *p[3] = {f, f + 512, f + 1024}, *g[3] = {f + 1536, f + 2048, f + 2560};
  float *m[3] = {f + 3000, f + 3100, f + 3200}, *v[3] = {f + 3300, f + 3400, f + 3500};
  float *vm[3] = {f + 3600, f + 3700, f + 3800}, *gnull[3] = {g[0], g[1], NULL};
  const int64_t ns[3] = {8, 5, 5}, nneg[3] = {8, -1, 5};
  weft_adamw_params hp = WEFT_ADAMW_DEFAULT, hb1 = hp, hlr = hp, hams = hp;
  hb1.beta1 = 1.0f, hlr.lr = -1.0f, hams.amsgrad = true;
  const float *const *G = (const float *const *)g;
  E("adamw_multi", INV, "n[1] = -1 is negative",
    weft_backend_adamw_multi(dev, p, G, m, v, NULL, nneg, 3, 1, &hp));
  E("adamw_multi", INV, "grad[2] is NULL (n[2] = 5)",
    weft_backend_adamw_multi(dev, p, (const float *const *)gnull, m, v, NULL, ns, 3, 1, &hp));
  E("adamw_multi", INV, "step = 0 must be >= 1",
    weft_backend_adamw_multi(dev, p, G, m, v, NULL, ns, 3, 0, &hp));
  E("adamw_multi", INV, "vmax is NULL",
    weft_backend_adamw_multi(dev, p, G, m, v, NULL, ns, 3, 1, &hams));
  E("adamw_multi", INV, "Invalid beta parameter at index 0: 1",
    weft_backend_adamw_multi(dev, p, G, m, v, vm, ns, 3, 1, &hb1));
  E("adamw_multi", INV, "Invalid learning rate: -1",
    weft_backend_adamw_multi(dev, p, G, m, v, vm, ns, 3, 1, &hlr));
  E("adamw_multi", INV, "hyper-parameters are NULL",
    weft_backend_adamw_multi(dev, p, G, m, v, vm, ns, 3, 1, NULL));
  E("adamw_multi", INV, "ntensors = -1 is negative",
    weft_backend_adamw_multi(dev, p, G, m, v, vm, ns, -1, 1, &hp));
  weft_sgd_params s0 = {.lr = 0.1f, .momentum = 0.9f, .dampening = 0.1f, .nesterov = true};
  weft_sgd_params s1 = {.lr = 0.1f, .momentum = 0.9f}, s2 = {.lr = 0.1f, .weight_decay = -1.0f};
  E("sgd_multi", INV, "Nesterov momentum requires a momentum and zero dampening",
    weft_backend_sgd_multi(dev, p, G, m, ns, 3, 1, &s0));
  E("sgd_multi", INV, "buf is NULL", weft_backend_sgd_multi(dev, p, G, NULL, ns, 3, 1, &s1));
  E("sgd_multi", INV, "Invalid weight_decay value: -1",
    weft_backend_sgd_multi(dev, p, G, NULL, ns, 3, 1, &s2));
  double out[3];
  E("sumsq_multi", INV, "out is NULL", weft_backend_sumsq_multi(dev, G, ns, 3, NULL));
  E("sumsq_multi", INV, "n is NULL", weft_backend_sumsq_multi(dev, G, NULL, 3, out));
  float *xnull[2] = {f, NULL};
  const int64_t two[2] = {3, 4};
  E("scale_multi", INV, "x[1] is NULL (n[1] = 4)",
    weft_backend_scale_multi(dev, xnull, two, 2, 2.0f));
  E("scale_multi", INV, "ntensors = -1 is negative",
    weft_backend_scale_multi(dev, p, ns, -1, 2.0f));

  weft_flat_piece ok[2] = {{f + 1024, WEFT_F32, 0, 4, 0}, {f + 2048, WEFT_BF16, 4, 4, 0}};
  weft_flat_piece neg[1] = {{f + 1024, WEFT_F32, -1, 4, 0}};
  weft_flat_piece f64p[2] = {{f + 1024, WEFT_F32, 0, 4, 0}, {f + 2048, WEFT_F64, 4, 4, 0}};
  weft_flat_piece nul[1] = {{NULL, WEFT_F32, 0, 4, 0}};
  E("flat_pack", UNS, "flat buffer dtype i32: f32, bf16 or f16",
    weft_backend_flat_pack(dev, f, WEFT_I32, ok, 2));
  E("flat_pack", INV, "npieces = -1 is negative", weft_backend_flat_pack(dev, f, WEFT_F32, ok, -1));
  E("flat_pack", INV, "pieces is NULL", weft_backend_flat_pack(dev, f, WEFT_F32, NULL, 1));
  E("flat_pack", INV, "piece 0: offset -1, count 4, pad 0 must be >= 0",
    weft_backend_flat_pack(dev, f, WEFT_F32, neg, 1));
  E("flat_pack", UNS, "piece 1 has dtype f64: f32, bf16 or f16",
    weft_backend_flat_pack(dev, f, WEFT_F32, f64p, 2));
  E("flat_split", INV, "piece 0: data is NULL for 4 elements",
    weft_backend_flat_split(dev, f, WEFT_BF16, nul, 1));
  E("flat_split", INV, "flat is NULL", weft_backend_flat_split(dev, NULL, WEFT_F32, ok, 2));
  E("flat_accumulate", UNS, "piece 1 has dtype bf16: accumulation needs f32",
    weft_backend_flat_accumulate(dev, f, WEFT_F16, ok, 2, 1.0f));
  return n;
}

static int errs_norm_act(const ebufs *b, eres *res) {
  int n = 0;
  const weft_device dev = b->dev;
  float *f = b->f;
  E("layernorm_forward", INV, "C = 0: rows must have C >= 1",
    weft_backend_layernorm_forward(dev, f, f + 512, f + 600, f + 1024, f + 2048, NULL, 3, 0,
                                   1e-5f));
  E("layernorm_forward", INV, "size argument 1 is negative (-1)",
    weft_backend_layernorm_forward(dev, f, f + 512, f + 600, f + 1024, NULL, NULL, -1, 4, 1e-5f));
  E("layernorm_forward", INV, "eps = 0 must be > 0",
    weft_backend_layernorm_forward(dev, f, f + 512, f + 600, f + 1024, NULL, NULL, 3, 4, 0.0f));
  E("layernorm_forward", INV, "eps = nan must be > 0",
    weft_backend_layernorm_forward(dev, f, f + 512, f + 600, f + 1024, NULL, NULL, 3, 4, NAN));
  E("layernorm_forward", INV, "rstd is NULL",
    weft_backend_layernorm_forward(dev, f, f + 512, NULL, f + 1024, NULL, NULL, 3, 4, 1e-5f));
  E("layernorm_forward", INV, "inp is NULL",
    weft_backend_layernorm_forward(dev, f, f + 512, f + 600, NULL, f + 2048, f + 3000, 3, 4,
                                   1e-5f));
  E("layernorm_backward", INV, "dout is NULL",
    weft_backend_layernorm_backward(dev, f, f + 512, f + 600, NULL, f + 1024, NULL, f + 2048,
                                    f + 3000, 3, 4, false));
  E("layernorm_backward", INV, "mean is NULL",
    weft_backend_layernorm_backward(dev, NULL, NULL, NULL, f + 512, f + 1024, NULL, NULL, f + 3000,
                                    3, 4, false));
  E("layernorm_backward", INV, "C = 0: rows must have C >= 1",
    weft_backend_layernorm_backward(dev, f, f + 512, f + 600, f + 700, f + 1024, NULL, f + 2048,
                                    f + 3000, 3, 0, true));
  E("layernorm_backward", INV, "size argument 2 is negative (-4)",
    weft_backend_layernorm_backward(dev, f, f + 512, f + 600, f + 700, f + 1024, NULL, f + 2048,
                                    f + 3000, 3, -4, true));
  E("activation_forward", INV,
    "activation 4 is not one of gelu_tanh (0), gelu_erf (1), relu (2), silu (3)",
    weft_backend_activation_forward(dev, WEFT_ACT_COUNT, f, f + 1024, 8));
  E("activation_backward", INV, "activation -1 is not one of",
    weft_backend_activation_backward(dev, (weft_activation)-1, f, f + 512, f + 1024, 8, false));
  E("activation_forward", INV, "size argument 1 is negative (-2)",
    weft_backend_activation_forward(dev, WEFT_ACT_RELU, f, f + 1024, -2));
  E("activation_forward", INV, "inp is NULL",
    weft_backend_activation_forward(dev, WEFT_ACT_SILU, f, NULL, 8));
  E("activation_backward", INV, "dinp is NULL",
    weft_backend_activation_backward(dev, WEFT_ACT_GELU_ERF, NULL, f + 512, f + 1024, 8, true));
  E("activation_backward", INV, "dout is NULL",
    weft_backend_activation_backward(dev, WEFT_ACT_GELU_TANH, f, NULL, f + 1024, 8, false));
  E("softmax_forward", INV, "C = 0: rows must have C >= 1",
    weft_backend_softmax_forward(dev, f, f + 1024, 2, 0));
  E("softmax_forward", INV, "size argument 1 is negative (-5)",
    weft_backend_softmax_forward(dev, f, f + 1024, -5, 3));
  E("softmax_forward", INV, "out is NULL", weft_backend_softmax_forward(dev, NULL, f + 1024, 2, 3));
  E("softmax_backward", INV, "out is NULL",
    weft_backend_softmax_backward(dev, f, f + 512, NULL, 2, 3, false));
  E("softmax_backward", INV, "dinp is NULL",
    weft_backend_softmax_backward(dev, NULL, f + 512, f + 1024, 2, 3, true));
  E("dropout_apply", INV, "p = 1 must be in [0, 1)",
    weft_backend_dropout_apply(dev, f, f + 1024, f + 2048, 1.0f, 8));
  E("dropout_apply", INV, "p = -0.5 must be in [0, 1)",
    weft_backend_dropout_apply(dev, f, f + 1024, f + 2048, -0.5f, 8));
  E("dropout_apply", INV, "p = nan must be in [0, 1)",
    weft_backend_dropout_apply(dev, f, f + 1024, f + 2048, NAN, 8));
  E("dropout_apply", INV, "uniform is NULL",
    weft_backend_dropout_apply(dev, f, f + 1024, NULL, 0.5f, 8));
  E("dropout_apply", INV, "size argument 1 is negative (-1)",
    weft_backend_dropout_apply(dev, f, f + 1024, f + 2048, 0.5f, -1));
  return n;
}

/* Tensors over b->f on b->dev. */
static weft_tensor ev(const ebufs *b, weft_dtype dt, int nd, int64_t d0, int64_t d1, int64_t off) {
  const int64_t shape[2] = {d0, d1};
  weft_tensor t;
  OK(weft_tensor_view_init(&t, b->f + off, dt, b->dev, nd, shape, NULL));
  return t;
}

static int errs_tensor_ops(const ebufs *b, eres *res) {
  int n = 0;
  weft_tensor a = ev(b, WEFT_F32, 2, 3, 4, 0), c = ev(b, WEFT_F32, 2, 3, 4, 64);
  weft_tensor at = ev(b, WEFT_F32, 2, 4, 3, 128), h = ev(b, WEFT_BF16, 2, 3, 4, 256);
  weft_tensor i = ev(b, WEFT_I32, 2, 3, 4, 512), e = ev(b, WEFT_F32, 2, 3, 0, 768);
  weft_tensor r = ev(b, WEFT_F32, 2, 3, 1, 800), cm = ev(b, WEFT_F32, 2, 3, 3, 900);
  cm.strides[0] = 1, cm.strides[1] = 3; /* a column-major C is not allowed */
  double out;
  T(INV, "shape mismatch", weft_add(&c, &a, &at));
  T(INV, "dtype mismatch", weft_mul(&c, &a, &h));
  T(INV, "elementwise ops need a float dtype", weft_mul(&i, &i, &i));
  T(INV, "shape mismatch", weft_axpy(&c, 2.0, &at));
  T(INV, "dim 3 out of range", weft_reduce(&a, WEFT_REDUCE_SUM, 3, &r));
  T(INV, "must be the input", weft_reduce(&a, WEFT_REDUCE_SUM, 0, &r));
  T(INV, "max of the empty tensor", weft_reduce_all(&e, WEFT_REDUCE_MAX, &out));
  T(INV, "inner dims differ", weft_gemm(false, false, 1.0f, &a, &a, 0.0f, &c));
  T(INV, "gemm needs a unit-stride last dim", weft_gemm(false, false, 1.0f, &a, &at, 0.0f, &cm));
  T(INV, "need finite mean and std >= 0", weft_tensor_fill_normal(&a, 1, 2, NULL, 0.0f, -1.0f));
  T(INV, "need finite lo < hi", weft_tensor_fill_uniform(&a, 1, 2, NULL, 1.0f, 1.0f));
  weft_rng_region r1 = {.ndim = 1, .global_shape = {12}, .offset = {0}};
  weft_rng_region r2 = {.ndim = 2, .global_shape = {3, 6}, .offset = {0, 3}};
  T(INV, "region has ndim 1", weft_tensor_fill_uniform(&a, 1, 2, &r1, 0.0f, 1.0f));
  T(INV, "does not fit the global size", weft_tensor_fill_normal(&a, 1, 2, &r2, 0.0f, 1.0f));
  T(INV, "shape mismatch", weft_tensor_copy(&c, &at));
  return n;
}

BACKEND_TEST(bad_memory_and_gemm_arguments_fail_alike_on_every_backend) {
  check_errors(dev, errs_memory_and_gemm, "memory and gemm");
}
BACKEND_TEST(bad_layer_arguments_fail_alike_on_every_backend) {
  check_errors(dev, errs_layers, "layers");
}
BACKEND_TEST(bad_pointwise_and_loss_arguments_fail_alike_on_every_backend) {
  check_errors(dev, errs_pointwise_and_loss, "pointwise and loss");
}
BACKEND_TEST(bad_optimizer_and_flat_piece_arguments_fail_alike_on_every_backend) {
  check_errors(dev, errs_optim_and_flat, "optimizers and flat");
}
BACKEND_TEST(bad_norm_activation_softmax_dropout_arguments_fail_alike_on_every_backend) {
  check_errors(dev, errs_norm_act, "norm, activation, softmax, dropout");
}
BACKEND_TEST(bad_tensor_op_arguments_fail_alike_on_every_backend) {
  check_errors(dev, errs_tensor_ops, "tensor ops");
}

/* ======================================================= mixed devices */

Test(backend_cuda, add_of_a_cpu_and_a_cuda_tensor_fails_naming_both_devices) {
  need(WEFT_CUDA);
  const int64_t shape[1] = {4};
  float h[4] = {1, 2, 3, 4};
  float *d = dupf(WEFT_CUDA, h, 4);
  weft_tensor tc, td;
  OK(weft_tensor_view_init(&tc, h, WEFT_F32, WEFT_CPU, 1, shape, NULL));
  OK(weft_tensor_view_init(&td, d, WEFT_F32, WEFT_CUDA, 1, shape, NULL));
  weft_clear_error();
  cr_assert_eq(weft_add(&td, &tc, &td), WEFT_ERR_INVALID, "%s", weft_last_error());
  const char *msg = weft_last_error();
  cr_assert(strstr(msg, "add") && strstr(msg, "on cpu") && strstr(msg, "on cuda"),
            "the message must name the op and both devices: %s", msg);
  weft_free(d);
}

/* =============================================================== dispatch */

Test(dispatch, a_cuda_tensor_in_a_build_without_cuda_says_there_is_no_backend) {
  if (weft_backend_get(WEFT_CUDA))
    cr_skip_test("this build has a WEFT_CUDA backend ('%s')", weft_backend_name(WEFT_CUDA));
  cr_assert_eq(weft_device_count(WEFT_CUDA), 0);
  cr_assert_str_eq(weft_backend_name(WEFT_CUDA), "none");
  float h[4] = {1, 2, 3, 4};
  const int64_t shape[1] = {4};
  weft_tensor *t = NULL;
  OK(weft_tensor_wrap(h, WEFT_F32, WEFT_CUDA, 1, shape, &t));
  weft_clear_error();
  cr_assert_eq(weft_add(t, t, t), WEFT_ERR_UNSUPPORTED, "%s", weft_last_error());
  cr_assert(
      strstr(weft_last_error(), "add") && strstr(weft_last_error(), "no backend for device cuda"),
      "message: %s", weft_last_error());
  weft_clear_error();
  cr_assert_eq(weft_memcpy(WEFT_CUDA, h, h + 2, 8, WEFT_COPY_H2D), WEFT_ERR_UNSUPPORTED);
  cr_assert(strstr(weft_last_error(), "memcpy: no backend for device cuda in this build"),
            "message: %s", weft_last_error());
  weft_clear_error();
  cr_assert_eq(weft_backend_swiglu_forward(WEFT_CUDA, h, h, h, 4), WEFT_ERR_UNSUPPORTED);
  cr_assert(strstr(weft_last_error(), "swiglu_forward: no backend for device cuda"), "message: %s",
            weft_last_error());
  cr_assert_eq(weft_device_init(WEFT_CUDA, 0, NULL), WEFT_ERR_UNSUPPORTED);
  weft_tensor_destroy(t);
}

Test(dispatch, an_unknown_device_is_invalid) {
  float x = 0.0f;
  weft_clear_error();
  cr_assert_eq(weft_memset((weft_device)7, &x, 0, 4), WEFT_ERR_INVALID);
  cr_assert(strstr(weft_last_error(), "7 is not a device"), "message: %s", weft_last_error());
  cr_assert_null(weft_backend_get((weft_device)7));
  cr_assert_eq(weft_device_count((weft_device)7), 0);
}

/* =============================================================== registry */

static weft_status fake_memcpy(void *dst, const void *src, size_t bytes, weft_copy_kind kind) {
  (void)kind;
  if (bytes) memmove(dst, src, bytes);
  return WEFT_OK;
}

Test(registry, refuses_a_table_lacking_a_required_member_or_of_a_wrong_version_naming_it) {
  weft_backend t = *weft_backend_get(WEFT_CPU);
  t.name = "test-table";
  const struct {
    size_t off;
    const char *name;
  } req[] = {{offsetof(weft_backend, device_count), "device_count"},
             {offsetof(weft_backend, synchronize), "synchronize"},
             {offsetof(weft_backend, alloc), "alloc"},
             {offsetof(weft_backend, free), "free"},
             {offsetof(weft_backend, memset), "memset"},
             {offsetof(weft_backend, memcpy), "memcpy"},
             {offsetof(weft_backend, copy), "copy"},
             {offsetof(weft_backend, fill), "fill"}};
  for (size_t i = 0; i < sizeof req / sizeof req[0]; i++) {
    weft_backend bad = t;
    memset((char *)&bad + req[i].off, 0, sizeof(void *));
    weft_clear_error();
    cr_assert_eq(weft_backend_register(&bad), WEFT_ERR_INVALID, "a table without %s registered",
                 req[i].name);
    char want[96];
    snprintf(want, sizeof want, "lacks the required member %s", req[i].name);
    cr_assert(strstr(weft_last_error(), want) && strstr(weft_last_error(), "test-table"),
              "message '%s' lacks '%s' and the table's name", weft_last_error(), want);
  }
  weft_backend bad = t;
  bad.version = WEFT_BACKEND_VERSION + 1;
  weft_clear_error();
  cr_assert_eq(weft_backend_register(&bad), WEFT_ERR_INVALID);
  char want[64];
  snprintf(want, sizeof want, "version %d", WEFT_BACKEND_VERSION + 1);
  cr_assert(strstr(weft_last_error(), want), "message: %s", weft_last_error());
  bad = t, bad.version = 0;
  cr_assert_eq(weft_backend_register(&bad), WEFT_ERR_INVALID);
  bad = t, bad.size = 16;
  cr_assert_eq(weft_backend_register(&bad), WEFT_ERR_INVALID);
  cr_assert(strstr(weft_last_error(), "size 16"), "message: %s", weft_last_error());
  bad = t, bad.name = NULL;
  cr_assert_eq(weft_backend_register(&bad), WEFT_ERR_INVALID);
  bad = t, bad.device = (weft_device)5;
  cr_assert_eq(weft_backend_register(&bad), WEFT_ERR_INVALID);
  cr_assert_eq(weft_backend_register(NULL), WEFT_ERR_INVALID);
  cr_assert_str_eq(weft_backend_name(WEFT_CPU), "cpu", "a refused table must not be installed");
}

Test(registry, a_missing_optional_member_is_unsupported_naming_op_device_and_backend) {
  weft_backend t = *weft_backend_get(WEFT_CPU);
  t.name = "cpu-without-swiglu";
  t.swiglu_forward = NULL;
  t.add = NULL;
  t.memcpy = fake_memcpy; /* the installed table is used */
  OK(weft_backend_register(&t));
  cr_assert_str_eq(weft_backend_name(WEFT_CPU), "cpu-without-swiglu");
  float x[4] = {1, 2, 3, 4}, y[4];
  weft_clear_error();
  cr_assert_eq(weft_backend_swiglu_forward(WEFT_CPU, y, x, x, 4), WEFT_ERR_UNSUPPORTED);
  cr_assert(strstr(weft_last_error(),
                   "swiglu_forward: swiglu_forward is not supported on cpu (backend "
                   "'cpu-without-swiglu')"),
            "message: %s", weft_last_error());
  const int64_t shape[1] = {4};
  weft_tensor tx;
  OK(weft_tensor_view_init(&tx, x, WEFT_F32, WEFT_CPU, 1, shape, NULL));
  weft_clear_error();
  cr_assert_eq(weft_add(&tx, &tx, &tx), WEFT_ERR_UNSUPPORTED);
  cr_assert(strstr(weft_last_error(), "add is not supported on cpu") &&
                strstr(weft_last_error(), "f32[4]"),
            "the message must name the op, the device and the tensor: %s", weft_last_error());
  OK(weft_memcpy(WEFT_CPU, y, x, 16, WEFT_COPY_H2D));
  OK(weft_backend_residual_forward(WEFT_CPU, y, x, x, 4)); /* present members still work */
  cr_assert_eq(y[3], 8.0f);
  /* an older, smaller table: the members past its size read as absent */
  weft_backend old = *weft_backend_get(WEFT_CPU);
  old.size = offsetof(weft_backend, gemm);
  OK(weft_backend_register(&old));
  weft_clear_error();
  cr_assert_eq(weft_backend_sgemm(WEFT_CPU, false, false, 1, 1, 1, 1.0f, x, 1, x, 1, 0.0f, y, 1),
               WEFT_ERR_UNSUPPORTED, "%s", weft_last_error());
  cr_assert(strstr(weft_last_error(), "sgemm is not supported on cpu"), "message: %s",
            weft_last_error());
  weft_backend_reset(WEFT_CPU);
}

Test(registry, reset_restores_the_builtin_table) {
  weft_backend t = *weft_backend_get(WEFT_CPU);
  t.name = "replacement";
  t.residual_forward = NULL;
  OK(weft_backend_register(&t));
  cr_assert_str_eq(weft_backend_name(WEFT_CPU), "replacement");
  weft_backend_reset(WEFT_CPU);
  cr_assert_str_eq(weft_backend_name(WEFT_CPU), "cpu");
  float x[3] = {1, 2, 3}, y[3];
  OK(weft_backend_residual_forward(WEFT_CPU, y, x, x, 3));
  cr_assert_eq(y[2], 6.0f);
  /* the device table too: back to the build's own (or none) */
  const weft_backend *cuda0 = weft_backend_get(WEFT_CUDA);
  const char *name0 = weft_backend_name(WEFT_CUDA);
  char saved[64];
  snprintf(saved, sizeof saved, "%s", name0);
  weft_backend fake = *weft_backend_get(WEFT_CPU);
  fake.device = WEFT_CUDA;
  fake.name = "fake-cuda";
  OK(weft_backend_register(&fake));
  cr_assert_str_eq(weft_backend_name(WEFT_CUDA), "fake-cuda");
  weft_backend_reset(WEFT_CUDA);
  cr_assert_eq(weft_backend_get(WEFT_CUDA) != NULL, cuda0 != NULL);
  cr_assert_str_eq(weft_backend_name(WEFT_CUDA), saved);
}

Test(registry, a_version_1_table_has_no_version_2_members_and_says_so_by_name) {
  weft_backend t = *weft_backend_get(WEFT_CPU);
  t.name = "cpu-version-1";
  t.version = 1;
  t.size = offsetof(weft_backend, layernorm_forward); /* as compiled against version 1 */
  OK(weft_backend_register(&t));
  const weft_backend *got = weft_backend_get(WEFT_CPU);
  cr_assert_null(got->layernorm_forward);
  cr_assert_null(got->dropout_apply);
  float x[4] = {1, 2, 3, 4}, y[4], m[1], r[1];
  weft_clear_error();
  cr_assert_eq(weft_backend_layernorm_forward(WEFT_CPU, y, m, r, x, NULL, NULL, 1, 4, 1e-5f),
               WEFT_ERR_UNSUPPORTED);
  cr_assert(strstr(weft_last_error(),
                   "layernorm_forward: layernorm_forward is not supported on cpu (backend "
                   "'cpu-version-1')"),
            "message: %s", weft_last_error());
  weft_clear_error();
  cr_assert_eq(weft_backend_dropout_apply(WEFT_CPU, y, x, x, 0.5f, 4), WEFT_ERR_UNSUPPORTED);
  cr_assert(strstr(weft_last_error(), "dropout_apply is not supported on cpu"), "message: %s",
            weft_last_error());
  OK(weft_backend_swiglu_forward(WEFT_CPU, y, x, x, 4)); /* version 1 members still work */
  weft_backend_reset(WEFT_CPU);
  OK(weft_backend_layernorm_forward(WEFT_CPU, y, m, r, x, NULL, NULL, 1, 4, 1e-5f));
  cr_assert_eq(m[0], 2.5f, "mean %g", (double)m[0]);
  cr_assert(WEFT_BACKEND_VERSION >= 2);
}

/* Version 6 gave the _dt attention members row strides: a table built
 * for version 5 has them dropped, so its bf16 attention is widened by the
 * op layer (takes_dtype says no) and strided rows are not offered. */
Test(registry, a_version_5_table_has_no_strided_attention) {
  weft_backend t = *weft_backend_get(WEFT_CPU);
  t.name = "cpu-version-5";
  t.version = 5;
  OK(weft_backend_register(&t));
  cr_assert_null(weft_backend_get(WEFT_CPU)->attention_forward_dt);
  cr_assert_null(weft_backend_get(WEFT_CPU)->attention_backward_dt);
  cr_assert_not_null(weft_backend_get(WEFT_CPU)->gemm_dt);
  cr_assert_not(weft_backend_attention_takes_rows(WEFT_CPU));
  cr_assert_not(weft_backend_takes_dtype(WEFT_CPU, WEFT_KERNEL_ATTENTION, WEFT_BF16));
  cr_assert(weft_backend_takes_dtype(WEFT_CPU, WEFT_KERNEL_GEMM, WEFT_BF16));
  weft_backend_reset(WEFT_CPU);
  cr_assert(weft_backend_attention_takes_rows(WEFT_CPU));
  cr_assert(weft_backend_takes_dtype(WEFT_CPU, WEFT_KERNEL_ATTENTION, WEFT_BF16));
}

/* Version 5 added takes_dtype: a table built for version 4 reads it as
 * absent, so its device takes f32 only and the op layer widens 16-bit
 * inputs there; a device without a table takes nothing. */
Test(registry, a_version_4_table_takes_only_f32_and_has_no_dt_members) {
  weft_backend t = *weft_backend_get(WEFT_CPU);
  t.name = "cpu-version-4";
  t.version = 4;
  OK(weft_backend_register(&t));
  cr_assert_null(weft_backend_get(WEFT_CPU)->takes_dtype);
  cr_assert_null(weft_backend_get(WEFT_CPU)->activation_forward_dt);
  cr_assert_null(weft_backend_get(WEFT_CPU)->activation_backward_dt);
  cr_assert_null(weft_backend_get(WEFT_CPU)->swiglu_forward_dt);
  cr_assert_null(weft_backend_get(WEFT_CPU)->dropout_apply_dt);
  cr_assert_null(weft_backend_get(WEFT_CPU)->layernorm_backward_dt);
  cr_assert_null(weft_backend_get(WEFT_CPU)->softmax_backward_dt);
  cr_assert_null(weft_backend_get(WEFT_CPU)->rmsnorm_backward_dt);
  cr_assert_null(weft_backend_get(WEFT_CPU)->cross_entropy_forward_dt);
  cr_assert_null(weft_backend_get(WEFT_CPU)->cross_entropy_backward_local_dt);
  cr_assert_null(weft_backend_get(WEFT_CPU)->embedding_range_backward_dt);
  cr_assert_null(weft_backend_get(WEFT_CPU)->rope_backward_dt);
  cr_assert_null(weft_backend_get(WEFT_CPU)->gemm_dt);
  cr_assert_null(weft_backend_get(WEFT_CPU)->attention_backward_dt);
  uint16_t h = 0x3f80, o = 0;
  weft_clear_error();
  cr_assert_eq(weft_backend_activation_forward_dt(WEFT_CPU, WEFT_ACT_RELU, WEFT_BF16, &o, &h, 1),
               WEFT_ERR_UNSUPPORTED);
  cr_assert(strstr(weft_last_error(), "activation_forward_dt is not supported on cpu"),
            "message: %s", weft_last_error());
  cr_assert(weft_backend_takes_dtype(WEFT_CPU, WEFT_KERNEL_ADD, WEFT_F32));
  cr_assert_not(weft_backend_takes_dtype(WEFT_CPU, WEFT_KERNEL_ADD, WEFT_BF16));
  cr_assert_not(weft_backend_takes_dtype(WEFT_CPU, WEFT_KERNEL_SCALE, WEFT_F16));
  weft_backend_reset(WEFT_CPU);
  cr_assert(weft_backend_takes_dtype(WEFT_CPU, WEFT_KERNEL_ADD, WEFT_BF16));
  cr_assert_not(weft_backend_takes_dtype(WEFT_DEVICE_COUNT, WEFT_KERNEL_ADD, WEFT_F32));
  if (!weft_backend_get(WEFT_CUDA))
    cr_assert_not(weft_backend_takes_dtype(WEFT_CUDA, WEFT_KERNEL_ADD, WEFT_F32));
}

/* Version 3 added `causal` to the attention members' argument lists: a
 * table built for version 2 has the old ones, which are dropped (calling
 * them with the new arguments would be undefined), so attention is
 * unsupported there while its other members work. */
Test(registry, a_version_2_table_has_no_attention_and_says_so_by_name) {
  weft_backend t = *weft_backend_get(WEFT_CPU);
  t.name = "cpu-version-2";
  t.version = 2;
  OK(weft_backend_register(&t));
  const weft_backend *got = weft_backend_get(WEFT_CPU);
  cr_assert_null(got->attention_forward);
  cr_assert_null(got->attention_backward);
  cr_assert_not_null(got->layernorm_forward);
  float x[8] = {1, 2, 3, 4, 5, 6, 7, 8}, y[8], l[2], s[64];
  weft_clear_error();
  cr_assert_eq(weft_backend_attention_forward(WEFT_CPU, y, l, x, x, x, 1, 2, 1, 1, 4, true, s),
               WEFT_ERR_UNSUPPORTED);
  cr_assert(strstr(weft_last_error(),
                   "attention_forward is not supported on cpu (backend "
                   "'cpu-version-2')"),
            "message: %s", weft_last_error());
  weft_clear_error();
  cr_assert_eq(
      weft_backend_attention_backward(WEFT_CPU, y, y, y, x, x, x, x, l, x, 1, 2, 1, 1, 4, false, s),
      WEFT_ERR_UNSUPPORTED);
  weft_backend_reset(WEFT_CPU);
  OK(weft_backend_attention_forward(WEFT_CPU, y, l, x, x, x, 1, 2, 1, 1, 4, false, s));
  cr_assert(WEFT_BACKEND_VERSION >= 3);
}
