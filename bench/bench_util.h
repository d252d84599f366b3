/* bench/bench_util.h — timing and statistics shared by the benchmarks. */
#ifndef WEFT_BENCH_UTIL_H
#define WEFT_BENCH_UTIL_H

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Monotonic wall-clock seconds. */
static inline double bench_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* qsort comparator for doubles, ascending. */
static inline int bench_cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Median of v[0..n) (v is left as it is); NaN for n <= 0. */
static inline double bench_median(const double *v, int n) {
  double *c = n > 0 ? malloc(sizeof(double) * (size_t)n) : NULL;
  if (!c) return NAN;
  memcpy(c, v, sizeof(double) * (size_t)n);
  qsort(c, (size_t)n, sizeof *c, bench_cmp_double);
  double m = n % 2 ? c[n / 2] : 0.5 * (c[n / 2 - 1] + c[n / 2]);
  free(c);
  return m;
}

#endif
