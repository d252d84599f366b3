/* tests/harness — running MPI worker programs from Criterion.
 *
 * Criterion re-executes each test in a child process, so a Criterion binary
 * cannot itself be an MPI program (the children lose PMI_FD). Instead a
 * Criterion test starts a worker through mpiexec:
 *
 *     Test(mesh, all_gather_2x2, .timeout = 60) {
 *       cr_assert_eq(weft_test_mpiexec(4, WORKER("mesh_worker"), "all_gather", 50), 0);
 *     }
 *
 * MPIEXEC_TIMEOUT is set to the given seconds (below the Criterion timeout),
 * so a hang becomes a failure and no rank is left behind. The worker checks
 * on every rank and exits non-zero on any mismatch (see worker.h).
 */
#ifndef WEFT_TEST_HARNESS_H
#define WEFT_TEST_HARNESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Path of a worker binary built next to the test (meson passes
 * WEFT_TEST_BUILD_DIR as the test's build directory). */
#define WORKER(name) WEFT_TEST_BUILD_DIR "/" name

/* Runs `mpiexec -n nranks worker case [extra args...]` with MPIEXEC_TIMEOUT =
 * timeout_s and waits for it. Returns the exit status (0 = every rank
 * passed), 128+signal if it was killed, or -1 if it could not start. Output
 * goes to this process's stdout/stderr. `extra` may be NULL; else a
 * NULL-terminated list of further arguments. */
int weft_test_mpiexec_args(int nranks, const char *worker, const char *case_name, int timeout_s,
                           const char *const *extra);
int weft_test_mpiexec(int nranks, const char *worker, const char *case_name, int timeout_s);

/* Same, with extra environment variables ("NAME=value", NULL-terminated)
 * added to the environment mpiexec passes to the ranks. */
int weft_test_mpiexec_env(int nranks, const char *worker, const char *case_name, int timeout_s,
                          const char *const *env_extra);

/* The same in the workers' device mode: WEFT_TEST_DEVICE=cuda is added to
 * the ranks' environment, so every root mesh a worker makes goes on
 * WEFT_CUDA (weft_worker_mesh_on_device). extra as in
 * weft_test_mpiexec_args (may be NULL). */
int weft_test_mpiexec_on_device(int nranks, const char *worker, const char *case_name,
                                int timeout_s, const char *const *extra);

/* WEFT_TEST_REQUIRE_CUDA_DEVICE(): skips the calling Criterion test, saying
 * why, unless this process sees a WEFT_CUDA device (a worker's ranks run on
 * this machine and see the same ones): a build without the CUDA backend,
 * or one whose backend reports no device (nvcc-built, no GPU). A macro
 * (cr_skip_test); the test file includes <criterion/criterion.h> and
 * backend.h. */
#define WEFT_TEST_REQUIRE_CUDA_DEVICE()                                                          \
  do {                                                                                           \
    if (!weft_backend_get(WEFT_CUDA))                                                            \
      cr_skip_test(                                                                              \
          "this build has no CUDA backend (-Dcuda=disabled, or no nvcc at configure time): the " \
          "device variants need one (-Dcuda=emulated runs them on the CPU emulator)");           \
    if (weft_device_count(WEFT_CUDA) <= 0)                                                       \
      cr_skip_test("no CUDA device visible: the '%s' backend reports %d devices",                \
                   weft_backend_name(WEFT_CUDA), weft_device_count(WEFT_CUDA));                  \
  } while (0)

/* Seed for randomized tests: WEFT_TEST_SEED if set, else `fallback`. Tests
 * print the seed on failure. */
unsigned long weft_test_seed(unsigned long fallback);

/* ------------------------------------------------------------ OK macro
 *
 * OK(expr): a Criterion assertion that `expr` (a weft_status) is WEFT_OK;
 * on failure it names the expression, the status and weft_last_error().
 * WEFT_TEST_OK_MSG(expr, fmt, ...) appends more context to that message
 * (printf format and arguments, evaluated only on failure); a suite that
 * wants its context in every check defines its own OK through it, e.g.
 *     #undef OK
 *     #define OK(expr) WEFT_TEST_OK_MSG(expr, " (seed %lu)", seed)
 * Both need <criterion/criterion.h> and the weft headers where they are
 * used (macros: harness.h itself includes neither). MPI workers use WOK
 * (worker.h) instead. */
#define WEFT_TEST_OK_MSG(expr, fmt, ...)                                                    \
  do {                                                                                      \
    weft_status ok_st_ = (expr);                                                            \
    if (ok_st_ != WEFT_OK)                                                                  \
      cr_assert_fail("%s -> %s: %s" fmt, #expr, weft_status_str(ok_st_), weft_last_error(), \
                     __VA_ARGS__);                                                          \
  } while (0)
#define OK(expr) WEFT_TEST_OK_MSG(expr, "%s", "")

/* --------------------------------------------------- random test inputs
 *
 * One generator for every suite: SplitMix64 (Steele, Lea, Flood 2014).
 * Suites differ only in how they start the state and how they turn the 64
 * bits into a value; both are spelled out below, so a suite keeps its exact
 * inputs by choosing the same start and the same conversion.
 *
 *   stream:    uint64_t s = weft_test_rng_state(seed);   (or any start value)
 *              weft_test_rng_u64(&s), _unit(&s), _sym(&s), _int(&s, lo, hi)
 *   hash:      weft_test_mix64(key)  -- the same function of a counter or key,
 *              for values every rank computes alike without a shared stream;
 *              weft_test_unit(bits), weft_test_sym(bits) convert its output.
 *
 * weft_test_rng_u64(&s) returns weft_test_mix64(s) and then advances s by
 * WEFT_TEST_GOLDEN_GAMMA: a stream is the hash of s, s + G, s + 2G, ...
 * Header-only (static inline): local, no state beyond the caller's. */
#define WEFT_TEST_GOLDEN_GAMMA 0x9E3779B97F4A7C15ULL

/* SplitMix64's output function of x (x + G, then the two xor-multiply
 * rounds): a 64-bit hash with every input bit reaching every output bit. */
static inline uint64_t weft_test_mix64(uint64_t x) {
  uint64_t z = x + WEFT_TEST_GOLDEN_GAMMA;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

/* Bits to a double in [0, 1): the top 53 bits, times 2^-53 (exact). */
static inline double weft_test_unit(uint64_t bits) { return (double)(bits >> 11) * 0x1.0p-53; }
/* Bits to a double in [-1, 1): 2 * weft_test_unit(bits) - 1. */
static inline double weft_test_sym(uint64_t bits) { return 2.0 * weft_test_unit(bits) - 1.0; }

/* The start state of a seeded stream: seed * G + 1. */
static inline uint64_t weft_test_rng_state(uint64_t seed) {
  return seed * WEFT_TEST_GOLDEN_GAMMA + 1;
}
/* Next 64 bits of the stream at *s (advances *s). */
static inline uint64_t weft_test_rng_u64(uint64_t *s) {
  uint64_t z = weft_test_mix64(*s);
  *s += WEFT_TEST_GOLDEN_GAMMA;
  return z;
}
/* Next value in [0, 1). */
static inline double weft_test_rng_unit(uint64_t *s) {
  return weft_test_unit(weft_test_rng_u64(s));
}
/* Next value in [-1, 1). */
static inline double weft_test_rng_sym(uint64_t *s) { return weft_test_sym(weft_test_rng_u64(s)); }
/* Next integer in [lo, hi] (lo <= hi; modulo, so slightly biased). */
static inline int64_t weft_test_rng_int(uint64_t *s, int64_t lo, int64_t hi) {
  return lo + (int64_t)(weft_test_rng_u64(s) % (uint64_t)(hi - lo + 1));
}

/* ---------------------------------------------------- relative errors
 *
 * The measures the suites compare results with, accumulated in double.
 * `got` is the value under test, `want` the reference; n elements each.
 * A NaN anywhere in got - want makes the result NaN or +inf, so that every
 * `err < tol` check fails on it. All local, no allocation. */

/* Norm-wise: ||got - want||_2 / ||want||_2 (||got - want|| if want is all
 * zero). f32 against f32, and f32 against an f64 reference. */
double weft_test_rel_norm_f32(const float *got, const float *want, int64_t n);
double weft_test_rel_norm_f32_f64(const float *got, const double *want, int64_t n);
/* Norm-wise relative error of a change: ||(got - base) - (want - base)|| /
 * ||want - base||, e.g. of an optimizer update from the weights `base`.
 * base NULL: zero (then equal to weft_test_rel_norm_f32). */
double weft_test_rel_change_f32(const float *got, const float *want, const float *base, int64_t n);

/* Max-wise: max|got - want| / max|want| (max|got - want| if want is all
 * zero). f32/f32, f32 against f64, and f64/f64. */
double weft_test_rel_max_f32(const float *got, const float *want, int64_t n);
double weft_test_rel_max_f32_f64(const float *got, const double *want, int64_t n);
double weft_test_rel_max_f64(const double *got, const double *want, int64_t n);

/* One number: |got - want| / |want| (|got - want| if want is 0). */
double weft_test_rel_scalar(double got, double want);

/* ---------------------------------------------------------------- files */

/* Reads the whole file at `path` into a new malloc'd buffer with a NUL
 * after the last byte (so text can be used as a string; the caller frees).
 * *len (if not NULL) gets the byte count. NULL, *len untouched, when the
 * file cannot be opened or read. Local. */
char *weft_test_slurp(const char *path, size_t *len);

/* ------------------------------------------------------ child processes */

/* Runs fn(arg) in a forked child whose stderr goes to a pipe, and waits
 * for it; the child exits 0 if fn returns. The first cap - 1 bytes the
 * child writes to stderr go to err (NUL-terminated; the rest is read and
 * dropped, so a chatty child never blocks). Returns the child's wait status
 * (as from waitpid), or -1 if no child could be started (err is then "").
 * For checks that a call aborts with a message (e.g. the CUDA emulator's
 * strict mode); stdout and stderr are flushed before the fork. */
int weft_test_capture_stderr(void (*fn)(void *), void *arg, char *err, size_t cap);
/* True if a wait status from weft_test_capture_stderr says SIGABRT. */
bool weft_test_died_of_abort(int status);

#ifdef __cplusplus
}
#endif

#endif
