/* nn/stats.c — the op layer's counters (weft_op_stats, autograd.h): bumped
 * where the work happens (an op's entry in mixed.c, a node's backward in
 * graph.c, the widening copies of mixed.c, the copies of the shape ops);
 * the large host allocations are counted by the kernels' allocator. */
#include <stdatomic.h>

#include "autograd_internal.h"
#include "kernels.h"

static _Atomic int64_t n_ops, n_widened, n_copies;

void nn_count_ops(int64_t n) { atomic_fetch_add_explicit(&n_ops, n, memory_order_relaxed); }
void nn_count_widened(int64_t n) { atomic_fetch_add_explicit(&n_widened, n, memory_order_relaxed); }
void nn_count_copies(int64_t n) { atomic_fetch_add_explicit(&n_copies, n, memory_order_relaxed); }

weft_op_stats weft_op_stats_get(void) {
  weft_op_stats s;
  s.ops = atomic_load_explicit(&n_ops, memory_order_relaxed);
  s.widened = atomic_load_explicit(&n_widened, memory_order_relaxed);
  s.copies = atomic_load_explicit(&n_copies, memory_order_relaxed);
  s.mallocs = weft_mem_get(WEFT_CPU).large_system_allocs;
  return s;
}
