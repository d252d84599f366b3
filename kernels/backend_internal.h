/* kernels/backend_internal.h — private to kernels/: the built-in tables and
 * the helpers the entry points and the backends share, so that every
 * "not on this device" error is made the same way (C and C++). */
#ifndef WEFT_BACKEND_INTERNAL_H
#define WEFT_BACKEND_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The built-in tables: kernels/cpu/backend.c, kernels/cuda/backend.cu
 * (only in builds with the CUDA backend, real or emulated). */
const weft_backend *weft_cpu_backend_(void);
const weft_backend *weft_cuda_backend_(void);

/* The table of dev holding the member at `offset` (offsetof(weft_backend,
 * m)); NULL with *st set (and the error message) when dev has no table or
 * the table lacks the member. op names the operation in the message. */
const weft_backend *weft_backend_find_(weft_device dev, size_t offset, const char *op,
                                       weft_status *st);
/* WEFT_ERR_UNSUPPORTED "<op>: no backend for device <dev> in this build". */
weft_status weft_backend_no_table_(weft_device dev, const char *op);
/* WEFT_ERR_UNSUPPORTED "<op>: <op> is not supported on <dev> (backend ...)". */
weft_status weft_backend_unsupported_(const weft_backend *be, const char *op);
/* Adds "in <op> on <device>" to a failed status' message; returns st. */
weft_status weft_backend_trace_(weft_status st, const weft_backend *be, const char *op);
/* Makes `func` the head of the current error message (status.c), as
 * weft_error_trace does for a public function but without a breadcrumb:
 * the dispatchers name weft_backend_<op>, whatever the table's functions
 * are called, so a failure reads alike on every backend. */
void weft_error_set_head_(const char *func);

/* For the tensor entry points of kernels.h: every tensor of the op must be
 * on one device (NULL entries are skipped) whose table has the member at
 * offset. On error the message names the op, the device and the tensor:
 * "add: a is on cpu (f32[4]) but out is on cuda (f32[4] on cuda): the
 * tensors of one op must be on one device". */
const weft_backend *weft_backend_for_tensors_(const char *op, size_t offset, int n,
                                              const weft_tensor *const *ts,
                                              const char *const *names, weft_status *st);
/* WEFT_ERR_UNSUPPORTED "<op>: <name> is <dtype> on <device> (<tensor>): <device>
 * supports <what>" — a backend's refusal of a dtype. */
weft_status weft_backend_dtype_unsupported_(const char *op, const char *name, const weft_tensor *t,
                                            const char *what);

/* takes_dtype of the built-in backends, the CPU's and the CUDA backend's
 * (kernels/ops.c): add, mul and scale implement kernels.h's contract for
 * every float dtype (f32, f64 in their precision; bf16, f16 in f32 rounded
 * once), the _dt layer members take f32, bf16 and f16. */
bool weft_builtin_takes_dtype_(weft_kernel_op op, weft_dtype dt);

/* The device backend's counters (weft_device_stats, backend.h;
 * device_stats.c): kernels/cuda adds n to counter c where it makes the call
 * (relaxed atomics, any thread). WEFT_LAUNCH (cuda_compat.h, which declares
 * it again for code that includes only that header) counts each launch
 * through weft_device_count_launch_. */
typedef enum weft_device_counter_ {
  WEFT_DEV_LAUNCHES_,
  WEFT_DEV_BLAS_,
  WEFT_DEV_HOST_SYNCS_,
  WEFT_DEV_MALLOCS_,
  WEFT_DEV_BYTES_H2D_,
  WEFT_DEV_BYTES_D2H_,
  WEFT_DEV_COUNTERS_
} weft_device_counter_;
void weft_device_count_(weft_device_counter_ c, int64_t n);
/* One launch of `kernel` (a name with static storage, WEFT_LAUNCH's
 * #kernel) on a grid of `blocks` thread blocks: counts it and records its
 * cost (weft_kernel_cost, backend.h) from the hint that
 * weft_device_cost_next_ left on this thread (then cleared); without one,
 * the call is recorded as uncosted. */
void weft_device_count_launch_(const char *kernel, double blocks);
/* The cost of the next launch on this thread (WEFT_COST in cuda_compat.h):
 * f32 FLOPs on the CUDA cores and device bytes read plus written. */
void weft_device_cost_next_(double flops, double bytes);
/* A cuBLAS call's cost (gemm.cu): recorded as "cublas gemm <engine>" or
 * "... batched", and counted in weft_device_stats.blas. */
void weft_device_cost_blas_(int engine, bool batched, double flops, double bytes);
/* A memset's or copy's bytes (runtime.cu), under `what` (static storage);
 * host_link: they cross the host link rather than device memory. */
void weft_device_cost_copy_(const char *what, double bytes, bool host_link);

#ifdef __cplusplus
}
#endif
#endif /* WEFT_BACKEND_INTERNAL_H */
