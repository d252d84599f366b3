/* kernels/cuda/emu/cuda_emu.h — the CUDA emulator's view of CUDA: what
 * kernels/cuda/cuda_compat.h lets device code use, plus the subset of the
 * CUDA runtime and cuBLAS APIs the backend calls, so that the .cu sources
 * compile as host C++17 (g++ -DWEFT_CUDA_EMU) and run on the CPU. In a
 * -Dcuda=emulated build they are compiled into libweft_kernels with
 * emu.cpp and ARE the WEFT_CUDA backend (same weft_cuda_* names).
 *
 * The emulator is meant to be honest: code that would crash or race on a
 * GPU should fail here too, deterministically. Two modes do that, both on
 * by default:
 *
 * - Strict memory (WEFT_EMU_STRICT=0 turns it off). Device memory
 *   (cudaMalloc) lives in one reserved virtual arena that is PROT_NONE to
 *   the host except while the emulator itself runs device work (a kernel
 *   launch, an emulated copy or memset, a cuBLAS GEMM: the blocks that
 *   work touches open for it). A host read or write of a device pointer
 *   anywhere else faults; the emulator's SIGSEGV handler aborts with
 *   "weft CUDA emulator: host code read device memory at P (inside the
 *   N-byte allocation at Q) outside a kernel launch or a copy: copy it to
 *   the host first" (under AddressSanitizer, if ASan keeps the signal, its
 *   SEGV report kills the process instead). Device work touching a freed
 *   block aborts too, naming the launch. Pinned host memory
 *   (cudaMallocHost) is ordinary host memory. The other way round, a
 *   kernel launched with a pointer argument to other host memory (the
 *   stack, malloc, weft_alloc(WEFT_CPU)) aborts at the launch, naming the
 *   kernel and the argument: on a GPU it is an illegal address.
 *
 * - Deferred work (WEFT_EMU_DEFER=0 turns it off: everything then runs at
 *   the call). Launches, cudaMemcpyAsync, cudaMemsetAsync, cudaMemset,
 *   device-to-device cudaMemcpy, cuBLAS GEMMs (on the handle's stream) and
 *   event records are queued per stream and run only when something needs
 *   them:
 *     cudaStreamSynchronize(s)    runs s's queue;
 *     cudaEventSynchronize(e)     runs e's stream up to e's last record;
 *     cudaEventQuery(e)           runs nothing: cudaErrorNotReady (not a
 *                                 sticky error) while the record has not
 *                                 run, cudaSuccess once it has (or if e
 *                                 was never recorded). After 65536 NotReady
 *                                 answers in a row for the same record the
 *                                 device "catches up" (runs it), so a poll
 *                                 loop ends;
 *     cudaStreamWaitEvent(s, e)   queues a wait: when s reaches it, e's
 *                                 stream runs up to the record first;
 *     cudaDeviceSynchronize,      run every stream, the one whose oldest
 *     cudaFree, cudaFreeHost      pending work is newest first (a consumer
 *                                 before its producer unless an event or
 *                                 the legacy stream orders them);
 *     cudaMemcpy (any kind but    is queued on the legacy default stream
 *     device to device)           and the legacy stream runs through it.
 *   The legacy default stream (0, cudaStreamLegacy) waits for the work
 *   queued before on every blocking stream (cudaStreamCreate, flags 0, and
 *   cudaStreamPerThread, one per device here) and they wait for it;
 *   cudaStreamNonBlocking streams (all of weft's) never sync with it: a
 *   result computed on one and read with a plain cudaMemcpy without
 *   synchronizing that stream comes out stale. Host sources of async
 *   copies: pageable memory is copied at the call (CUDA stages it), pinned
 *   memory (cudaMallocHost) is read when the copy runs; host destinations
 *   are written when the copy runs. Launch arguments are captured at the
 *   launch. A launch's validation errors (geometry, no device, a destroyed
 *   stream) are reported at the launch, faults in the kernel abort when it
 *   runs, naming the launch. cudaEventElapsedTime is the host time between
 *   the two records' execution (cudaErrorNotReady until both ran). A
 *   stream with 65536 queued operations runs them (CUDA blocks the host
 *   when its queue is full).
 *
 * How work runs (emu.cpp):
 * - A launch runs its blocks one after another on the OS thread that runs
 *   the queue, in an order drawn per launch from a per-process seed (a GPU
 *   promises no order, so a result that depends on it, such as float
 *   atomics adding across blocks, changes from run to run here too;
 *   WEFT_EMU_SHUFFLE=<seed> repeats one run's orders, =0 runs blocks in z,
 *   y, x order, and a fault names the seed); the threads of a block are cooperative
 *   fibers (each its own stack), so __syncthreads, __syncwarp and the
 *   shuffles are real barriers. Fibers never preempt each other: atomics
 *   are plain read-modify-writes. Host threads share the queues; one runs
 *   device work at a time.
 * - `__shared__` is `static thread_local`: one instance per OS thread,
 *   shared by the fibers of the block that runs (blocks never overlap).
 *   Dynamic shared memory (WEFT_DYN_SMEM) is a fresh 16-byte aligned buffer
 *   of the launch's smem bytes, filled with 0xFF bytes (NaN) per block.
 * - A thread that returned counts as arrived at __syncthreads and
 *   __syncwarp (as on Volta and later). A shuffle must be called by every
 *   lane of its mask with the same mask, kind and width; a lane of the mask
 *   that does not exist (partial last warp) or returned is misuse. Misuse
 *   and deadlocks (no thread can run, some have not returned) abort with a
 *   message naming the launch, the block and what each thread waits for.
 * - Device allocations are page-aligned blocks of the arena (so 256-byte
 *   aligned as CUDA's) with a registry: copies check their kind against
 *   the pointers, frees check the pointer, new allocations are filled with
 *   0xFF bytes (NaN), freed pages go back to the system.
 * - Environment: WEFT_EMU_STRICT, WEFT_EMU_DEFER, WEFT_EMU_SHUFFLE (above;
 *   read at first use), WEFT_EMU_DEVICES=n (default 1; 0 tests the no-GPU paths),
 *   WEFT_EMU_STACK_KB (fiber stack size, default 64, 256 under ASan),
 *   WEFT_EMU_COST_ONLY=1 (launches and GEMMs queued but not run, new
 *   allocations zeroed: a real run's host path and cost records, for
 *   weft-train --predict at full size; device results meaningless).
 * - cuBLAS GEMMs are column-major as the real library, accumulate in double
 *   and round once; TF32 / BF16 compute modes round the operands first.
 *
 * The host API functions have C++ linkage (unlike libcudart's C symbols);
 * the test hooks at the end (weft_emu_set_strict / _defer / _shuffle) are C.
 */
#ifndef WEFT_CUDA_EMU_H
#define WEFT_CUDA_EMU_H

#ifndef __cplusplus
#error "cuda_emu.h is C++ (the .cu sources compiled as host C++17)"
#endif

#include <math.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <typeinfo>
#include <utility>

/* ------------------------------------------------------------ qualifiers */

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
/* per OS thread = per block: blocks of a launch run one after another */
#define __shared__ static thread_local

/* ------------------------------------------------------- thread geometry */

struct uint3 {
  unsigned int x, y, z;
};

struct dim3 {
  unsigned int x, y, z;
  constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1)
      : x(vx), y(vy), z(vz) {}
  constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
  constexpr operator uint3() const { return uint3{x, y, z}; }
};

#define WEFT_EMU_TLS_ __attribute__((tls_model("initial-exec")))
namespace weft_emu {
/* Set by the scheduler before it resumes each fiber. */
extern __thread uint3 threadIdx WEFT_EMU_TLS_;
extern __thread uint3 blockIdx WEFT_EMU_TLS_;
extern __thread dim3 blockDim WEFT_EMU_TLS_;
extern __thread dim3 gridDim WEFT_EMU_TLS_;
}  // namespace weft_emu
using weft_emu::blockDim;
using weft_emu::blockIdx;
using weft_emu::gridDim;
using weft_emu::threadIdx;
static constexpr int warpSize = 32;

/* ------------------------------------------------------------ barriers */

enum weft_emu_shfl_mode_ {
  WEFT_EMU_SHFL_IDX_ = 0,
  WEFT_EMU_SHFL_UP_ = 1,
  WEFT_EMU_SHFL_DOWN_ = 2,
  WEFT_EMU_SHFL_BFLY_ = 3,
  WEFT_EMU_BALLOT_ = 4, /* __ballot_sync: a warp operation like the shuffles */
};

void weft_emu_syncthreads_(void);
void weft_emu_syncwarp_(unsigned mask);
/* One lane's part of a shuffle: its value's bits (size 4 or 8 bytes), the
 * PTX operands b (lane or offset) and c ((32 - width) << 8 | clamp); the
 * value of the source lane that PTX's shfl.sync picks. */
uint64_t weft_emu_shfl_(unsigned mask, uint64_t bits, int size, int mode, int b, int c, int width);

inline void __syncthreads(void) { weft_emu_syncthreads_(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { weft_emu_syncwarp_(mask); }

template <class T>
inline T weft_emu_shfl_t_(unsigned mask, T v, int mode, int b, int width) {
  static_assert(std::is_arithmetic<T>::value && (sizeof(T) == 4 || sizeof(T) == 8),
                "shuffles move 4- or 8-byte arithmetic values");
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  int c = ((32 - width) << 8) | (mode == WEFT_EMU_SHFL_UP_ ? 0 : 0x1f);
  bits = weft_emu_shfl_(mask, bits, (int)sizeof(T), mode, b, c, width);
  T r;
  std::memcpy(&r, &bits, sizeof(T));
  return r;
}

/* Overloads as in CUDA's sm_30_intrinsics.h (not a template: arguments
 * convert as they do under nvcc). */
#define WEFT_EMU_SHFL_DEFS_(T)                                                                \
  inline T __shfl_sync(unsigned mask, T var, int srcLane, int width = warpSize) {             \
    return weft_emu_shfl_t_<T>(mask, var, WEFT_EMU_SHFL_IDX_, srcLane, width);                \
  }                                                                                           \
  inline T __shfl_up_sync(unsigned mask, T var, unsigned int delta, int width = warpSize) {   \
    return weft_emu_shfl_t_<T>(mask, var, WEFT_EMU_SHFL_UP_, (int)delta, width);              \
  }                                                                                           \
  inline T __shfl_down_sync(unsigned mask, T var, unsigned int delta, int width = warpSize) { \
    return weft_emu_shfl_t_<T>(mask, var, WEFT_EMU_SHFL_DOWN_, (int)delta, width);            \
  }                                                                                           \
  inline T __shfl_xor_sync(unsigned mask, T var, int laneMask, int width = warpSize) {        \
    return weft_emu_shfl_t_<T>(mask, var, WEFT_EMU_SHFL_BFLY_, laneMask, width);              \
  }
WEFT_EMU_SHFL_DEFS_(int)
WEFT_EMU_SHFL_DEFS_(unsigned int)
WEFT_EMU_SHFL_DEFS_(long)
WEFT_EMU_SHFL_DEFS_(unsigned long)
WEFT_EMU_SHFL_DEFS_(long long)
WEFT_EMU_SHFL_DEFS_(unsigned long long)
WEFT_EMU_SHFL_DEFS_(float)
WEFT_EMU_SHFL_DEFS_(double)
#undef WEFT_EMU_SHFL_DEFS_

/* Bit l of the result: lane l's predicate, for the lanes of mask (each
 * must call it with the same mask, as __shfl_sync). */
inline unsigned __ballot_sync(unsigned mask, int predicate) {
  return (unsigned)weft_emu_shfl_(mask, predicate != 0, 4, WEFT_EMU_BALLOT_, 0, 0x1f, warpSize);
}
/* Position of the least significant set bit, 1-based; 0 for 0. */
inline int __ffs(int x) { return __builtin_ffs(x); }

/* ------------------------------------------------------------- atomics */
/* Fibers never preempt: a plain read-modify-write is atomic. Each returns
 * the old value. */

inline float atomicAdd(float *a, float v) {
  float o = *a;
  *a = o + v;
  return o;
}
inline double atomicAdd(double *a, double v) {
  double o = *a;
  *a = o + v;
  return o;
}
inline int atomicAdd(int *a, int v) {
  int o = *a;
  *a = (int)((unsigned)o + (unsigned)v); /* wraps as the hardware does */
  return o;
}
inline unsigned int atomicAdd(unsigned int *a, unsigned int v) {
  unsigned o = *a;
  *a = o + v;
  return o;
}
inline unsigned long long atomicAdd(unsigned long long *a, unsigned long long v) {
  unsigned long long o = *a;
  *a = o + v;
  return o;
}
inline int atomicMax(int *a, int v) {
  int o = *a;
  *a = o > v ? o : v;
  return o;
}
inline unsigned int atomicMax(unsigned int *a, unsigned int v) {
  unsigned o = *a;
  *a = o > v ? o : v;
  return o;
}
inline int atomicMin(int *a, int v) {
  int o = *a;
  *a = o < v ? o : v;
  return o;
}
inline unsigned int atomicMin(unsigned int *a, unsigned int v) {
  unsigned o = *a;
  *a = o < v ? o : v;
  return o;
}
inline int atomicExch(int *a, int v) {
  int o = *a;
  *a = v;
  return o;
}
inline unsigned int atomicExch(unsigned int *a, unsigned int v) {
  unsigned o = *a;
  *a = v;
  return o;
}
inline float atomicExch(float *a, float v) {
  float o = *a;
  *a = v;
  return o;
}
inline int atomicCAS(int *a, int cmp, int v) {
  int o = *a;
  if (o == cmp) *a = v;
  return o;
}
inline unsigned int atomicCAS(unsigned int *a, unsigned int cmp, unsigned int v) {
  unsigned o = *a;
  if (o == cmp) *a = v;
  return o;
}
inline unsigned long long atomicCAS(unsigned long long *a, unsigned long long cmp,
                                    unsigned long long v) {
  unsigned long long o = *a;
  if (o == cmp) *a = v;
  return o;
}

/* ---------------------------------------------------------------- math */
/* The float functions of <math.h> (expf, fmaxf, ...) are the host's. The
 * fast intrinsics are computed exactly here (the hardware's are within a
 * few ulp of these). */

inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __log2f(float x) { return log2f(x); }
inline float __powf(float x, float y) { return powf(x, y); }
inline float __sinf(float x) { return sinf(x); }
inline float __cosf(float x) { return cosf(x); }
inline float __tanf(float x) { return tanf(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fsqrt_rn(float x) { return sqrtf(x); }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline float __saturatef(float x) { return x != x ? 0.0f : x < 0.0f ? 0.0f : x > 1.0f ? 1.0f : x; }

/* ---------------------------------------------------------------- bf16 */

/* bfloat16: the top half of a float's bits. Trivially copyable, 2 bytes;
 * convert with __float2bfloat16 / __bfloat162float (as cuda_compat.h
 * says; the raw member is not portable). */
struct __nv_bfloat16 {
  unsigned short __x;
};
static_assert(sizeof(__nv_bfloat16) == 2, "bf16 is 2 bytes");
static_assert(std::is_trivially_copyable<__nv_bfloat16>::value, "bf16 is trivially copyable");

/* Round to nearest, ties to even; NaN stays (quiet) NaN: bit for bit
 * weft_f32_to_bf16 (kernels/dtype.c). */
inline __nv_bfloat16 __float2bfloat16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  __nv_bfloat16 r;
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    r.__x = (unsigned short)((u >> 16) | 0x0040u);
    return r;
  }
  u += 0x7fffu + ((u >> 16) & 1u);
  r.__x = (unsigned short)(u >> 16);
  return r;
}
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __float2bfloat16(f); }
inline float __bfloat162float(__nv_bfloat16 h) {
  uint32_t u = (uint32_t)h.__x << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

/* ------------------------------------------------- CUDA runtime: types */
/* Names and values as in CUDA 13's driver_types.h. */

enum cudaError {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInitializationError = 3,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidPitchValue = 12,
  cudaErrorInvalidDevicePointer = 17,
  cudaErrorInvalidMemcpyDirection = 21,
  cudaErrorInvalidDeviceFunction = 98,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidDevice = 101,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorNotReady = 600,
  cudaErrorIllegalAddress = 700,
  cudaErrorLaunchOutOfResources = 701,
  cudaErrorLaunchFailure = 719,
  cudaErrorNotSupported = 801,
  cudaErrorUnknown = 999
};
typedef enum cudaError cudaError_t;

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4
};

enum cudaMemoryType {
  cudaMemoryTypeUnregistered = 0,
  cudaMemoryTypeHost = 1,
  cudaMemoryTypeDevice = 2,
  cudaMemoryTypeManaged = 3
};

struct cudaPointerAttributes {
  enum cudaMemoryType type;
  int device;
  void *devicePointer;
  void *hostPointer;
  long reserved[8];
};

enum cudaDeviceAttr {
  cudaDevAttrMaxThreadsPerBlock = 1,
  cudaDevAttrMaxBlockDimX = 2,
  cudaDevAttrMaxBlockDimY = 3,
  cudaDevAttrMaxBlockDimZ = 4,
  cudaDevAttrMaxGridDimX = 5,
  cudaDevAttrMaxGridDimY = 6,
  cudaDevAttrMaxGridDimZ = 7,
  cudaDevAttrMaxSharedMemoryPerBlock = 8,
  cudaDevAttrWarpSize = 10,
  cudaDevAttrMultiProcessorCount = 16,
  cudaDevAttrComputeCapabilityMajor = 75,
  cudaDevAttrComputeCapabilityMinor = 76,
  cudaDevAttrMaxSharedMemoryPerBlockOptin = 97
};

struct CUstream_st;
typedef struct CUstream_st *cudaStream_t;
struct CUevent_st;
typedef struct CUevent_st *cudaEvent_t;

#define cudaStreamLegacy ((cudaStream_t)0x1)
#define cudaStreamPerThread ((cudaStream_t)0x2)
#define cudaStreamDefault 0x00
#define cudaStreamNonBlocking 0x01
#define cudaEventDefault 0x00
#define cudaEventBlockingSync 0x01
#define cudaEventDisableTiming 0x02

/* --------------------------------------------- CUDA runtime: functions */
/* Signatures as in cuda_runtime_api.h; C++ linkage (see the top). */

const char *cudaGetErrorString(cudaError_t error);
const char *cudaGetErrorName(cudaError_t error);
/* The last error of this host thread; GetLastError also resets it. */
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);

cudaError_t cudaGetDeviceCount(int *count);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int *device);
cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device);
/* Runs every stream's queued work (see the top). */
cudaError_t cudaDeviceSynchronize(void);
/* total: 16 GiB; free: total minus the live cudaMalloc bytes. */
cudaError_t cudaMemGetInfo(size_t *free, size_t *total);

cudaError_t cudaMalloc(void **devPtr, size_t size);
cudaError_t cudaFree(void *devPtr);
cudaError_t cudaMallocHost(void **ptr, size_t size);
cudaError_t cudaFreeHost(void *ptr);
cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attributes, const void *ptr);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t stream = 0);
cudaError_t cudaMemset(void *devPtr, int value, size_t count);
cudaError_t cudaMemsetAsync(void *devPtr, int value, size_t count, cudaStream_t stream = 0);

cudaError_t cudaStreamCreate(cudaStream_t *pStream);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags = 0);

cudaError_t cudaEventCreate(cudaEvent_t *event);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream = 0);
cudaError_t cudaEventQuery(cudaEvent_t event);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
/* Host clock between the two records' execution; cudaErrorNotReady while
 * either has not run (see the top). */
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end);
cudaError_t cudaEventDestroy(cudaEvent_t event);

/* The typed conveniences of cuda_runtime.h. */
template <class T>
inline cudaError_t cudaMalloc(T **devPtr, size_t size) {
  return cudaMalloc((void **)(void *)devPtr, size);
}
template <class T>
inline cudaError_t cudaMallocHost(T **ptr, size_t size) {
  return cudaMallocHost((void **)(void *)ptr, size);
}

/* ------------------------------------------------------------- launches */

/* Queues fn(ctx) for every thread of every block on stream (see the top);
 * validates the launch first (grid dims in 1..2^31-1 / 65535 / 65535,
 * block dims 1..1024 / 1024 / 64 and at most 1024 threads, smem <= 227
 * KiB, a live stream, a device) and records cudaErrorInvalidConfiguration
 * (or cudaErrorNoDevice / cudaErrorInvalidResourceHandle) instead. ctx is
 * a heap object the emulator owns from here: destroy(ctx) once the launch
 * ran or was rejected. name (the kernel as spelled at the launch) and
 * kernel (the body's type: it names the launching function) name the
 * launch in messages. Not callable from device code. */
void weft_emu_run_(dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                   void (*fn)(const void *ctx), void *ctx, void (*destroy)(void *ctx),
                   const char *name, const std::type_info &kernel);
/* The running launch's dynamic shared memory (16-byte aligned). */
void *weft_emu_dyn_smem_(void);

/* A launch's pointer arguments: each must be NULL, device memory
 * (cudaMalloc) or pinned host memory (cudaMallocHost, mapped on a GPU);
 * any other host pointer (stack, malloc, a weft_alloc(WEFT_CPU) block)
 * is what makes a GPU kernel fault with an illegal address, so the
 * emulator aborts at the launch naming the kernel and the argument.
 * Pointers inside structs passed by value are not seen. */
void weft_emu_check_launch_ptr_(const char *name, int index, const void *p);
template <class T>
inline void weft_emu_check_launch_arg_(const char *name, int index, const T &v) {
  if constexpr (std::is_pointer<T>::value) weft_emu_check_launch_ptr_(name, index, (const void *)v);
}
template <class... A>
inline void weft_emu_check_launch_args_(const char *name, const A &...a) {
  int i = 0;
  (weft_emu_check_launch_arg_(name, i++, a), ...);
  (void)i;
}

/* What WEFT_LAUNCH expands to: body() is the kernel call with its
 * arguments captured by value; it is copied to the heap so that the launch
 * can run later. */
template <class F>
inline void weft_emu_launch_(const char *name, dim3 grid, dim3 block, size_t smem,
                             cudaStream_t stream, F &&body) {
  typedef typename std::decay<F>::type B;
  B *heap = new B(std::forward<F>(body));
  weft_emu_run_(
      grid, block, smem, stream, [](const void *p) { (*static_cast<const B *>(p))(); },
      static_cast<void *>(heap), [](void *p) { delete static_cast<B *>(p); }, name, typeid(B));
}

/* --------------------------------------------------------------- cuBLAS */
/* Names and values as in CUDA 13's cublas_api.h / library_types.h. */

struct cublasContext;
typedef struct cublasContext *cublasHandle_t;

typedef enum {
  CUBLAS_STATUS_SUCCESS = 0,
  CUBLAS_STATUS_NOT_INITIALIZED = 1,
  CUBLAS_STATUS_ALLOC_FAILED = 3,
  CUBLAS_STATUS_INVALID_VALUE = 7,
  CUBLAS_STATUS_ARCH_MISMATCH = 8,
  CUBLAS_STATUS_MAPPING_ERROR = 11,
  CUBLAS_STATUS_EXECUTION_FAILED = 13,
  CUBLAS_STATUS_INTERNAL_ERROR = 14,
  CUBLAS_STATUS_NOT_SUPPORTED = 15,
  CUBLAS_STATUS_LICENSE_ERROR = 16
} cublasStatus_t;

typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1, CUBLAS_OP_C = 2 } cublasOperation_t;
typedef enum { CUBLAS_POINTER_MODE_HOST = 0, CUBLAS_POINTER_MODE_DEVICE = 1 } cublasPointerMode_t;

typedef enum {
  CUBLAS_DEFAULT_MATH = 0,
  CUBLAS_TENSOR_OP_MATH = 1,
  CUBLAS_PEDANTIC_MATH = 2,
  CUBLAS_TF32_TENSOR_OP_MATH = 3,
  CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION = 16
} cublasMath_t;

typedef enum {
  CUBLAS_COMPUTE_32F = 68,
  CUBLAS_COMPUTE_32F_PEDANTIC = 69,
  CUBLAS_COMPUTE_32F_FAST_16F = 74,
  CUBLAS_COMPUTE_32F_FAST_16BF = 75,
  CUBLAS_COMPUTE_32F_FAST_TF32 = 77
} cublasComputeType_t;

typedef enum {
  CUBLAS_GEMM_DEFAULT = -1,
  CUBLAS_GEMM_DFALT = -1,
  CUBLAS_GEMM_DEFAULT_TENSOR_OP = 99,
  CUBLAS_GEMM_DFALT_TENSOR_OP = 99
} cublasGemmAlgo_t;

typedef enum cudaDataType_t {
  CUDA_R_32F = 0,
  CUDA_R_64F = 1,
  CUDA_R_16F = 2,
  CUDA_R_16BF = 14
} cudaDataType;

/* A readable sentence for a status. */
const char *cublasGetStatusString(cublasStatus_t status);
/* NOT_INITIALIZED without a device. */
cublasStatus_t cublasCreate_v2(cublasHandle_t *handle);
cublasStatus_t cublasDestroy_v2(cublasHandle_t handle);
cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t streamId);
cublasStatus_t cublasGetStream_v2(cublasHandle_t handle, cudaStream_t *streamId);
cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t handle, void *workspace,
                                     size_t workspaceSizeInBytes);
cublasStatus_t cublasSetPointerMode_v2(cublasHandle_t handle, cublasPointerMode_t mode);
/* DEFAULT / TENSOR_OP: exact fp32 operands; TF32_TENSOR_OP: fp32 operands
 * rounded to TF32 in cublasSgemm* and cublasGemm*Ex with CUBLAS_COMPUTE_32F;
 * PEDANTIC: exact. DISALLOW_REDUCED_PRECISION_REDUCTION may be or-ed in. */
cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode);
cublasStatus_t cublasGetMathMode(cublasHandle_t handle, cublasMath_t *mode);

/* C = alpha op(A) op(B) + beta C, column-major, op(A) m x k, op(B) k x n.
 * INVALID_VALUE for m, n, k < 0, a bad op, lda < max(1, rows of A as
 * stored) (likewise ldb), ldc < max(1, m), batchCount < 0. beta == 0 does
 * not read C. Products are summed in double, in order, and rounded once. */
cublasStatus_t cublasSgemm_v2(cublasHandle_t handle, cublasOperation_t transa,
                              cublasOperation_t transb, int m, int n, int k, const float *alpha,
                              const float *A, int lda, const float *B, int ldb, const float *beta,
                              float *C, int ldc);
cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa,
                                         cublasOperation_t transb, int m, int n, int k,
                                         const float *alpha, const float *A, int lda,
                                         long long int strideA, const float *B, int ldb,
                                         long long int strideB, const float *beta, float *C,
                                         int ldc, long long int strideC, int batchCount);
/* Types (A = B): 32F with 32F C for every compute type; 16BF or 16F with
 * C of the same type or 32F for CUBLAS_COMPUTE_32F(_PEDANTIC). FAST_TF32
 * rounds fp32 operands to TF32 (round to nearest even), FAST_16BF to bf16,
 * FAST_16F to fp16. alpha and beta are floats. Others: NOT_SUPPORTED. */
cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void *alpha,
                            const void *A, cudaDataType Atype, int lda, const void *B,
                            cudaDataType Btype, int ldb, const void *beta, void *C,
                            cudaDataType Ctype, int ldc, cublasComputeType_t computeType,
                            cublasGemmAlgo_t algo);
cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa,
                                          cublasOperation_t transb, int m, int n, int k,
                                          const void *alpha, const void *A, cudaDataType Atype,
                                          int lda, long long int strideA, const void *B,
                                          cudaDataType Btype, int ldb, long long int strideB,
                                          const void *beta, void *C, cudaDataType Ctype, int ldc,
                                          long long int strideC, int batchCount,
                                          cublasComputeType_t computeType, cublasGemmAlgo_t algo);

/* as cublas_v2.h */
#define cublasCreate cublasCreate_v2
#define cublasDestroy cublasDestroy_v2
#define cublasSetStream cublasSetStream_v2
#define cublasGetStream cublasGetStream_v2
#define cublasSetWorkspace cublasSetWorkspace_v2
#define cublasSetPointerMode cublasSetPointerMode_v2
#define cublasSgemm cublasSgemm_v2

/* ----------------------------------------------------------- test hooks */
/* Turn strict memory / deferred work on (1) or off (0) from here on, over
 * what WEFT_EMU_STRICT / WEFT_EMU_DEFER said; return the previous setting.
 * Turning deferral off first runs all queued work. For tests. */
extern "C" int weft_emu_set_strict(int on);
extern "C" int weft_emu_set_defer(int on);
/* Launches from here on run their blocks in the order drawn from seed (0:
 * in z, y, x order); returns the previous seed (0 if it was off). */
extern "C" unsigned long long weft_emu_set_shuffle(unsigned long long seed);

#endif /* WEFT_CUDA_EMU_H */
