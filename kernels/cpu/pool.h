/* kernels/cpu/pool.h — private to kernels/cpu/: the small thread pool that
 * runs the independent (batch, head) items of CPU attention (attention.c)
 * on OpenBLAS's thread count; pool.c says when it threads and why. Not
 * installed. */
#ifndef WEFT_CPU_POOL_H
#define WEFT_CPU_POOL_H

#include <stdint.h>

/* One item of a parallel loop: item in [0, n), scratch the calling
 * thread's own block of the `floats` floats given to weft_cpu_par_for_. */
typedef void (*weft_cpu_par_fn)(void *ctx, int64_t item, float *scratch);

/* Calls fn(ctx, i, scratch) once for every i in [0, n), in no set order,
 * and returns when all are done. Local (no MPI), called by attention.c.
 * With the pthreads OpenBLAS set to N > 1 threads, OpenBLAS is set to 1
 * thread meanwhile and the items run on N threads: this one, with `own`
 * as its scratch, and N - 1 pool workers, each with a scratch of `floats`
 * floats that the pool owns (allocated on first use, kept for the next
 * call). Otherwise, or when the pool is busy with another caller or cannot
 * grow, the items run here in order with `own`. Items must not depend on
 * each other; each then gives the same bits as in a serial loop. Does not
 * fail: a worker or scratch block that cannot be had means fewer threads. */
void weft_cpu_par_for_(int64_t n, weft_cpu_par_fn fn, void *ctx, float *own, int64_t floats);

#endif /* WEFT_CPU_POOL_H */
