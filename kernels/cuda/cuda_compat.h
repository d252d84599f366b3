/* kernels/cuda/cuda_compat.h — private: what the .cu sources may use, so the
 * same source compiles two ways, both into libweft_kernels as the WEFT_CUDA
 * backend (kernels/cuda/meson.build):
 *
 *   nvcc (-Dcuda=enabled/auto: the real backend), or
 *   a host C++ compiler with -DWEFT_CUDA_EMU (-Dcuda=emulated: the CPU
 *   emulator in emu/, which runs every block's threads as fibers; the test
 *   suites run the device code that way on machines without a GPU). The
 *   names are the same in both builds (weft_cuda_*); a process has one or
 *   the other.
 *
 * The emulator is strict by default (emu/cuda_emu.h explains): device
 * memory faults when host code touches it outside the emulator's own
 * device work (WEFT_EMU_STRICT=0 turns that off), and launches, async
 * copies, memsets, GEMMs and event records are deferred per stream until a
 * synchronization needs them (WEFT_EMU_DEFER=0 runs them at the call), so
 * a missing cudaStreamSynchronize / event wait gives a stale result there
 * as it would race on a GPU. weft's streams are cudaStreamNonBlocking: a
 * plain cudaMemcpy does not wait for them. Include system headers before
 * this one in emulated builds (cuda_emu.h defines __noinline__ and other
 * CUDA qualifiers as macros).
 *
 * Rules for device code (the emulator supports exactly this):
 * - launches only through WEFT_LAUNCH(kernel, grid, block, smem, stream, ...);
 * - thread geometry: threadIdx, blockIdx, blockDim, gridDim (x, y, z),
 *   warpSize (32); blocks of at most 1024 threads;
 * - __syncthreads(), __syncwarp(); every thread of the block (warp) must
 *   reach each barrier, or have returned;
 * - shared memory: static `__shared__ T name[N];` arrays, and dynamic
 *   memory through WEFT_DYN_SMEM(T, name) (size = the launch's smem bytes,
 *   16-byte aligned; give each kernel's its own name: CUDA requires one
 *   type per extern __shared__ name);
 * - warp shuffles __shfl_sync, __shfl_xor_sync, __shfl_down_sync,
 *   __shfl_up_sync on float, double, int, unsigned (masks naming the lanes
 *   that take part, as CUDA); __syncwarp(mask);
 * - atomicAdd on float, double and int, atomicMax/atomicMin on int and
 *   unsigned, atomicCAS, atomicExch;
 * - math: the float functions of <math.h> plus rsqrtf, __expf, __logf,
 *   __fdividef;
 * - bf16: __nv_bfloat16 with __float2bfloat16 (round to nearest even) and
 *   __bfloat162float;
 * - host API: cudaMalloc/Free, cudaMemcpy(Async), cudaMemset(Async),
 *   streams, events (record, wait, synchronize, elapsed time),
 *   cudaGetDeviceCount/SetDevice/GetDevice, cudaPointerGetAttributes,
 *   cudaMemGetInfo, cudaGetLastError/GetErrorString, and cuBLAS:
 *   cublasCreate/Destroy/SetStream/SetMathMode, cublasSgemm,
 *   cublasSgemmStridedBatched, cublasGemmEx, cublasGemmStridedBatchedEx
 *   (column-major, as the real library).
 * Anything else is a compile error in one of the two builds.
 */
#ifndef WEFT_CUDA_COMPAT_H
#define WEFT_CUDA_COMPAT_H

#ifdef WEFT_CUDA_EMU
#include "emu/cuda_emu.h"
#else
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#endif

/* Every WEFT_LAUNCH counts one launch in weft_device_stats (backend.h;
 * kernels/device_stats.c, also declared in backend_internal.h) and records
 * its cost for the roofline model (weft_kernel_cost), in both builds
 * alike, before it launches. The cost is what WEFT_COST(flops, bytes) said
 * just before on the same thread: f32 FLOPs and the device bytes the
 * kernel reads plus writes at least. */
extern "C" void weft_device_count_launch_(const char *kernel, double blocks);
extern "C" void weft_device_cost_next_(double flops, double bytes);
#define WEFT_COST(flops, bytes) weft_device_cost_next_((double)(flops), (double)(bytes))
/* Thread blocks of a launch's grid (the model scales a kernel with fewer
 * blocks than the GPU has SMs to that share of the GPU). */
static inline double weft_grid_blocks_(dim3 g) { return (double)g.x * g.y * g.z; }

#ifdef WEFT_CUDA_EMU
/* weft_emu_launch_ queues the body on the stream, to run for every block
 * and thread (emu/emu.cpp). The arguments are evaluated once, at the
 * launch, and copied by value into the body (a heap copy that lives until
 * the launch ran), as a CUDA launch does; #kernel names it in messages.
 * Pointer arguments must be device or pinned memory (checked at the
 * launch: weft_emu_check_launch_args_). */
#define WEFT_LAUNCH(kernel, grid, block, smem, stream, ...)                                   \
  (weft_device_count_launch_(#kernel, weft_grid_blocks_(grid)),                               \
   weft_emu_launch_(#kernel, (grid), (block), (size_t)(smem), (stream), [](auto... weft_a_) { \
     weft_emu_check_launch_args_(#kernel, weft_a_...);                                        \
     return [=]() { kernel(weft_a_...); };                                                    \
   }(__VA_ARGS__)))
#define WEFT_DYN_SMEM(T, name) T *name = (T *)weft_emu_dyn_smem_()
#else
#define WEFT_LAUNCH(kernel, grid, block, smem, stream, ...)     \
  (weft_device_count_launch_(#kernel, weft_grid_blocks_(grid)), \
   kernel<<<(grid), (block), (size_t)(smem), (stream)>>>(__VA_ARGS__))
#define WEFT_DYN_SMEM(T, name) extern __shared__ __align__(16) T name[]
#endif

#endif /* WEFT_CUDA_COMPAT_H */
