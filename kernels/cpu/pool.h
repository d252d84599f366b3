/* kernels/cpu/pool.h — private to kernels/cpu/: the small thread pool that
 * runs the independent (batch, head) items of CPU attention (attention.c)
 * and the fixed chunks of the non-GEMM kernels (elementwise ops,
 * activations, norms, softmax, cross-entropy) and the blocks of a large
 * GEMM on weft's thread count; pool.c says when it threads and why. Not installed. */
#ifndef WEFT_CPU_POOL_H
#define WEFT_CPU_POOL_H

#include <stdint.h>

#include "status.h"

/* One item of a parallel loop: item in [0, n), scratch the calling
 * thread's own block of the `floats` floats given to weft_cpu_par_for_. */
typedef void (*weft_cpu_par_fn)(void *ctx, int64_t item, float *scratch);

/* Calls fn(ctx, i, scratch) once for every i in [0, n), in no set order,
 * and returns when all are done. Local (no MPI), called by attention.c
 * and gemm.c. With N = weft_cpu_num_threads() (backend.h) > 1 the items
 * run on N threads (OpenBLAS stays at 1 thread, so an item may call
 * BLAS): this one, with `own` as its scratch, and N - 1 pool workers, each with a scratch of
 * `floats` floats that the pool owns (allocated on first use, kept for the next call). Otherwise,
 * or when the pool is busy with another caller or cannot grow, the items run here in order with
 * `own`. Items must not depend on each other; each then gives the same bits as in a serial loop.
 * Does not fail: a worker or scratch block that cannot be had means fewer threads. */
void weft_cpu_par_for_(int64_t n, weft_cpu_par_fn fn, void *ctx, float *own, int64_t floats);

/* One chunk of a parallel range: elements (or rows, columns) [lo, hi). */
typedef void (*weft_cpu_range_fn)(void *ctx, int64_t lo, int64_t hi);

/* Calls fn(ctx, lo, hi) once for every chunk [i * grain, min(n, (i + 1) *
 * grain)) of [0, n), in no set order, and returns when all are done; on
 * weft_cpu_num_threads() (backend.h) threads (the caller and pool
 * workers), else here in order. The chunks do not depend on the thread count, so a kernel whose
 * chunks write disjoint outputs, each computed from its own inputs, gives
 * the same bits on any number of threads; a reduction keeps one partial
 * per chunk and combines them in chunk order. Unlike weft_cpu_par_for_ it
 * has no scratch blocks. Local, does not fail (a pool that cannot run it
 * runs it here). */
void weft_cpu_par_range_(int64_t n, int64_t grain, weft_cpu_range_fn fn, void *ctx);

/* Elements a chunk of elementwise work should hold at least (64 KiB of
 * f32): below that a thread's wake-up costs more than the work. */
#define WEFT_CPU_GRAIN 16384

/* Rows per chunk of a kernel whose row holds `per_row` floats of work:
 * about WEFT_CPU_GRAIN floats a chunk, at least one row. */
static inline int64_t weft_cpu_row_grain_(int64_t per_row) {
  return per_row >= WEFT_CPU_GRAIN ? 1 : WEFT_CPU_GRAIN / (per_row > 0 ? per_row : 1);
}

/* At most this many chunks for a row kernel that keeps one partial result
 * per chunk (a loss, or column sums of C doubles): the partials stay small
 * and their in-order combination cheap, and the chunking still does not
 * depend on the thread count. */
#define WEFT_CPU_MAX_PARTIALS 64

/* Rows per chunk of such a kernel over n rows of `per_row` floats: the
 * larger of weft_cpu_row_grain_(per_row) and ceil(n / WEFT_CPU_MAX_PARTIALS). */
static inline int64_t weft_cpu_partial_grain_(int64_t n, int64_t per_row) {
  const int64_t g = weft_cpu_row_grain_(per_row);
  const int64_t least = (n + WEFT_CPU_MAX_PARTIALS - 1) / WEFT_CPU_MAX_PARTIALS;
  return g > least ? g : least > 0 ? least : 1;
}

/* A block of at least n doubles for one kernel call's partial sums: the
 * process's kept block (grown on demand, never given back, so a steady
 * state allocates nothing), or, while another call holds that, a fresh
 * weft_alloc block. Contents undefined. Give it back with
 * weft_cpu_partials_put_. Local; fails only when out of memory. */
weft_status weft_cpu_partials_get_(int64_t n, double **out);
void weft_cpu_partials_put_(double *p);

/* out[c] = (float)((double)out[c] + the sum of part[k * C + c] over the
 * chunks k < nchunks, added in chunk order), for c < C: the column sums of
 * a row kernel's chunks (norm backward passes) accumulated into a gradient. */
static inline void weft_cpu_add_partials_(float *out, const double *part, int64_t nchunks,
                                          int64_t C) {
  for (int64_t c = 0; c < C; c++) {
    double s = 0.0;
    for (int64_t k = 0; k < nchunks; k++) s += part[k * C + c];
    out[c] = (float)((double)out[c] + s);
  }
}

#endif /* WEFT_CPU_POOL_H */
