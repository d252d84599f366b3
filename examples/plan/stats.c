/* Ranks and Spearman's rank correlation for weft-plan --measure (pure C,
 * no MPI: tests/examples/test_plan_stats.c links this file alone). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "stats.h"

void plan_ranks(const double *x, int n, double *rank) {
  /* O(n^2): n is the number of factorisations (tens at most). rank of x[i]
   * = 1 + #{x[j] < x[i]} + (#{x[j] == x[i]} - 1) / 2, the mean position of
   * its tie group. */
  for (int i = 0; i < n; i++) {
    int less = 0, equal = 0;
    for (int j = 0; j < n; j++) {
      if (x[j] < x[i]) less++;
      if (x[j] == x[i]) equal++;
    }
    rank[i] = 1.0 + less + (equal - 1) / 2.0;
  }
}

double plan_spearman(const double *x, const double *y, int n) {
  if (n < 2) return NAN;
  double *rx = malloc(sizeof *rx * (size_t)n), *ry = malloc(sizeof *ry * (size_t)n);
  if (!rx || !ry) {
    free(rx);
    free(ry);
    return NAN;
  }
  plan_ranks(x, n, rx);
  plan_ranks(y, n, ry);
  double mx = 0, my = 0;
  for (int i = 0; i < n; i++) {
    mx += rx[i];
    my += ry[i];
  }
  mx /= n;
  my /= n;
  double sxy = 0, sxx = 0, syy = 0;
  for (int i = 0; i < n; i++) {
    sxy += (rx[i] - mx) * (ry[i] - my);
    sxx += (rx[i] - mx) * (rx[i] - mx);
    syy += (ry[i] - my) * (ry[i] - my);
  }
  free(rx);
  free(ry);
  if (sxx == 0 || syy == 0) return NAN;
  return sxy / sqrt(sxx * syy);
}

double plan_median(const double *x, int n) {
  if (n < 1) return NAN;
  double *v = malloc(sizeof *v * (size_t)n);
  if (!v) return NAN;
  memcpy(v, x, sizeof *v * (size_t)n);
  for (int i = 1; i < n; i++) /* insertion sort: n is small */
    for (int j = i; j > 0 && v[j - 1] > v[j]; j--) {
      double t = v[j];
      v[j] = v[j - 1];
      v[j - 1] = t;
    }
  double m = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  free(v);
  return m;
}
