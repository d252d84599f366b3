/* examples/plan/stats.h — rank statistics for weft-plan --measure (pure C,
 * no MPI, no weft: tests/examples links stats.c on its own). */
#ifndef WEFT_EXAMPLES_PLAN_STATS_H
#define WEFT_EXAMPLES_PLAN_STATS_H

/* Ranks of x[0..n) (1 = smallest); tied values get the mean of the ranks
 * they span (1, 2.5, 2.5, 4). Local; rank has n entries (caller's). */
void plan_ranks(const double *x, int n, double *rank);
/* Spearman's rank correlation of x and y: Pearson's correlation of their
 * tie-averaged ranks, in [-1, 1]; NAN when n < 2, when either side is
 * constant, or out of memory. */
double plan_spearman(const double *x, const double *y, int n);

/* The median of x[0..n) (the mean of the middle two for even n); NAN when
 * n < 1 or out of memory. x is not changed. */
double plan_median(const double *x, int n);

#endif
