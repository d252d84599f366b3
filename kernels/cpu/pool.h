/* kernels/cpu/pool.h — private to kernels/cpu/: the small thread pool that
 * runs the independent (batch, head) items of CPU attention (attention.c)
 * and the fixed chunks of the non-GEMM kernels (elementwise ops,
 * activations, norms, softmax, cross-entropy) and the blocks of a large
 * GEMM on weft's thread count; pool.c says when it threads and why. Not installed. */
#ifndef WEFT_CPU_POOL_H
#define WEFT_CPU_POOL_H

#include <stdint.h>

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

#endif /* WEFT_CPU_POOL_H */
