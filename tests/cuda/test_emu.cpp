/* tests/cuda/test_emu.cpp — the CUDA emulator itself (kernels/cuda/emu),
 * through its CUDA runtime API (cuda_emu.h): fiber barriers, shuffles
 * (checked against CUDA's documented semantics), shared memory, atomics,
 * misuse and deadlock aborts, launch validation, the runtime API's memory
 * registry, devices, streams and events (the backend's events too, on
 * every stream and from a thread of their own), the cuBLAS GEMMs against a
 * double-precision reference on seeded random inputs, and the two honest
 * modes (cuda_emu.h): strict device memory (host access aborts) and
 * deferred per-stream work (a missing synchronization gives a stale
 * result). Everything runs in the default modes (strict + deferred) unless
 * a test says otherwise: the host never touches device memory directly,
 * and work is synchronized before its results are read. */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <algorithm>
#include <set>
#include <vector>

#include <pthread.h>

#include "backend.h" /* the WEFT_CUDA table's events */
#include "cuda_compat.h"
#include "harness.h"
#include "kernels.h" /* weft_f32_to_bf16 */

namespace {

/* A seeded 64-bit LCG (Knuth's MMIX constants). */
struct Lcg {
  uint64_t s;
  explicit Lcg(uint64_t seed) : s(seed * 2862933555777941757ull + 3037000493ull) {}
  uint32_t next() {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(s >> 32);
  }
  float uni(float lo, float hi) {
    return lo + (hi - lo) * (float)(next() >> 8) * (1.0f / 16777216.0f);
  }
  int range(int lo, int hi) { return lo + (int)(next() % (uint32_t)(hi - lo + 1)); }
};

template <class T>
T *dev_alloc(size_t n) {
  T *p = nullptr;
  cr_assert_eq(cudaMalloc(&p, n * sizeof(T)), cudaSuccess, "cudaMalloc(%zu)", n * sizeof(T));
  return p;
}
template <class T>
void to_dev(T *d, const std::vector<T> &h) {
  cr_assert_eq(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
}
template <class T>
std::vector<T> from_dev(const T *d, size_t n) {
  std::vector<T> h(n);
  cr_assert_eq(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return h;
}

/* Runs f in a child whose stderr comes back; asserts it died of SIGABRT
 * and that stderr holds every one of the strings. */
template <class F>
void expect_abort(F f, std::vector<const char *> needles) {
  static char err[1 << 16];
  int st = weft_test_capture_stderr([](void *p) { (*static_cast<F *>(p))(); }, &f, err, sizeof err);
  cr_assert(st != -1, "cannot start a child process");
  cr_assert(weft_test_died_of_abort(st), "the child should abort; status 0x%x, stderr: %s", st,
            err);
  for (const char *n : needles)
    cr_assert(strstr(err, n) != NULL, "stderr should mention '%s': %s", n, err);
}

/* ------------------------------------------------------------- kernels */

__global__ void block_sum_k(const float *x, float *out) {
  __shared__ float s[1024];
  unsigned nt = blockDim.x * blockDim.y * blockDim.z;
  unsigned t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  unsigned b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  s[t] = x[b * nt + t];
  __syncthreads();
  for (unsigned w = 1; w < nt; w *= 2) {
    if (t % (2 * w) == 0 && t + w < nt) s[t] += s[t + w];
    __syncthreads();
  }
  if (t == 0) out[b] = s[0];
}

__global__ void geometry_k(unsigned *out) {
  unsigned nt = blockDim.x * blockDim.y * blockDim.z;
  unsigned t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  unsigned b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  unsigned *o = out + 8 * (b * nt + t);
  o[0] = threadIdx.x, o[1] = threadIdx.y, o[2] = threadIdx.z;
  o[3] = blockIdx.x, o[4] = blockIdx.y, o[5] = blockIdx.z;
  o[6] = blockDim.x * 10000 + blockDim.y * 100 + blockDim.z;
  o[7] = gridDim.x * 10000 + gridDim.y * 100 + gridDim.z;
}

/* kind 0 idx, 1 up, 2 down, 3 xor; perlane: idx / xor operand differs per
 * lane (idx: also negative and >= 32). */
template <class T>
__global__ void shfl_k(const T *in, T *out, int kind, int arg, int width, int perlane) {
  int t = threadIdx.x + blockIdx.x * blockDim.x;
  int lane = threadIdx.x % 32;
  int a = arg;
  if (perlane) a = kind == 0 ? (lane * 7 + 3) % 45 - 6 : (lane * 5 + 1) % 32;
  T v = in[t], r;
  switch (kind) {
    case 0:
      r = __shfl_sync(0xffffffffu, v, a, width);
      break;
    case 1:
      r = __shfl_up_sync(0xffffffffu, v, (unsigned)a, width);
      break;
    case 2:
      r = __shfl_down_sync(0xffffffffu, v, (unsigned)a, width);
      break;
    default:
      r = __shfl_xor_sync(0xffffffffu, v, a, width);
      break;
  }
  out[t] = r;
}

/* The source lane CUDA's programming guide gives for each shuffle. */
int ref_src(int kind, int lane, int a, int w) {
  int seg = lane / w * w;
  switch (kind) {
    case 0:
      return seg + (a & (w - 1)); /* srcLane modulo width */
    case 1:
      return lane - seg >= a ? lane - a : lane;
    case 2:
      return lane - seg + a < w ? lane + a : lane;
    default: {
      int j = lane ^ a;
      return j < seg + w ? j : lane; /* no reading from a higher segment */
    }
  }
}

/* Warp sums three ways, per warp of a 2-warp block. */
__global__ void warp_sum_k(const int *in, int *out) {
  int t = threadIdx.x + blockIdx.x * blockDim.x;
  int v = in[t], d = v, x = v;
  for (int o = 16; o > 0; o /= 2) d += __shfl_down_sync(0xffffffffu, d, (unsigned)o);
  for (int o = 16; o > 0; o /= 2) x += __shfl_xor_sync(0xffffffffu, x, o);
  int incl = v; /* inclusive scan with shfl_up */
  for (int o = 1; o < 32; o *= 2) {
    int y = __shfl_up_sync(0xffffffffu, incl, (unsigned)o);
    if ((int)(threadIdx.x % 32) >= o) incl += y;
  }
  int total = __shfl_sync(0xffffffffu, d, 0);
  out[4 * t + 0] = d, out[4 * t + 1] = x, out[4 * t + 2] = incl, out[4 * t + 3] = total;
}

/* Half-warps synchronize separately with __syncwarp(mask). */
/* out[2t] = the ballot of in > 0 over the full warp, out[2t + 1] = the
 * ballot over the even lanes (odd lanes skip it), each then through __ffs. */
__global__ void ballot_k(const int *in, unsigned *out, int *first) {
  const unsigned t = blockIdx.x * blockDim.x + threadIdx.x;
  const unsigned b = __ballot_sync(0xffffffffu, in[t] > 0);
  out[2 * t] = b;
  out[2 * t + 1] = threadIdx.x % 2 == 0 ? __ballot_sync(0x55555555u, in[t] > 0) : 0u;
  first[t] = __ffs((int)b);
}

/* *sum += x[blockIdx.x] (one float atomic per block: the result depends
 * on the blocks' order); order[i] = the i-th block to run. */
__global__ void order_sum_k(const float *x, float *sum, unsigned *order, unsigned *next) {
  atomicAdd(sum, x[blockIdx.x]);
  order[atomicAdd(next, 1u)] = blockIdx.x;
}

__global__ void partial_warp_ballot_k(float *o) {
  o[threadIdx.x] = (float)__ballot_sync(0xffffffffu, threadIdx.x % 3 == 0);
}

__global__ void syncwarp_k(const float *in, float *out) {
  __shared__ float s[64];
  unsigned t = threadIdx.x, lane = t % 32;
  unsigned mask = lane < 16 ? 0x0000ffffu : 0xffff0000u;
  s[t] = in[t];
  __syncwarp(mask);
  unsigned half = t & ~15u;
  out[t] = s[half + (t + 1) % 16];
  __syncwarp(mask);
  s[t] = 2.0f * out[t];
  __syncwarp();
  out[64 + t] = s[t ^ 31];
}

/* Reverses each block's slice through dynamic shared memory. */
__global__ void dyn_smem_k(const float *in, float *out, unsigned *info) {
  WEFT_DYN_SMEM(float, dyn_rev);
  unsigned t = threadIdx.x, n = blockDim.x, b = blockIdx.x;
  if (t == 0) {
    unsigned nan = 0;
    for (unsigned i = 0; i < 2 * n; i++) nan += std::isnan(dyn_rev[i]) ? 1u : 0u;
    info[2 * b] = nan;
    info[2 * b + 1] = (unsigned)((uintptr_t)dyn_rev % 16);
  }
  __syncthreads();
  dyn_rev[n + t] = in[b * n + t];
  __syncthreads();
  out[b * n + t] = dyn_rev[n + (n - 1 - t)];
}

__global__ void atomics_k(float *fsum, double *dsum, int *isum, int *olds, int *imax,
                          unsigned *umax, unsigned *cas_counter, const int *vals) {
  int t = threadIdx.x + blockIdx.x * blockDim.x;
  atomicAdd(fsum, (float)vals[t]);
  atomicAdd(dsum, vals[t] * 0.125);
  olds[t] = atomicAdd(isum, 1);
  atomicMax(imax, vals[t]);
  atomicMax(umax, (unsigned)vals[t] * 2654435761u);
  unsigned old = *cas_counter, seen;
  while ((seen = atomicCAS(cas_counter, old, old + 3)) != old) old = seen;
}

/* Every thread keeps a stack array across barriers: fibers' stacks must
 * not overlap. */
__global__ void stacks_k(unsigned *bad) {
  volatile unsigned local[512];
  unsigned t = threadIdx.x;
  for (unsigned i = 0; i < 512; i++) local[i] = t * 1000 + i;
  __syncthreads();
  for (unsigned i = 0; i < 512; i++) local[i] += 1;
  __syncthreads();
  unsigned b = 0;
  for (unsigned i = 0; i < 512; i++) b += local[i] != t * 1000 + i + 1;
  bad[blockIdx.x * blockDim.x + t] = b;
}

__global__ void two_barriers_k(float *out) {
  __shared__ float s[256];
  unsigned t = threadIdx.x;
  s[t] = (float)t;
  __syncthreads();
  float v = s[(t + 1) % blockDim.x];
  __syncthreads();
  out[blockIdx.x * blockDim.x + t] = v;
}

__global__ void mark_k(int *p) { p[threadIdx.x] = 7; }

/* Threads past n return early; the others keep using barriers. */
__global__ void early_exit_k(const float *in, float *out, unsigned n) {
  __shared__ float s[128];
  unsigned t = threadIdx.x;
  if (t >= n) return;
  s[t] = in[t];
  __syncthreads();
  out[t] = s[n - 1 - t];
}

/* ---- misuse */

__global__ void deadlock_k(float *o) {
  float v = (float)threadIdx.x;
  if (threadIdx.x % 32 < 16) v = __shfl_xor_sync(0xffffffffu, v, 1);
  __syncthreads();
  o[threadIdx.x] = v;
}

__global__ void partial_warp_shfl_k(float *o) {
  float v = (float)threadIdx.x;
  v += __shfl_down_sync(0xffffffffu, v, 1);
  o[threadIdx.x] = v;
}

__global__ void exit_in_shfl_k(float *o) {
  float v = (float)threadIdx.x;
  if (threadIdx.x == 5) return;
  v += __shfl_down_sync(0xffffffffu, v, 1);
  o[threadIdx.x] = v;
}

__global__ void mixed_warp_ops_k(float *o) {
  float v = (float)threadIdx.x;
  if (threadIdx.x < 16)
    __syncwarp();
  else
    v = __shfl_xor_sync(0xffffffffu, v, 1);
  o[threadIdx.x] = v;
}

/* Recursion with 1 KiB frames touched every 64 bytes: walks into the guard
 * page below the fiber stack page by page (no frame jumps over it, with or
 * without -fstack-clash-protection). */
[[maybe_unused]] __device__ __noinline__ unsigned deep_rec(unsigned d) {
  volatile char buf[1024];
  for (unsigned i = 0; i < sizeof buf; i += 64) buf[i] = (char)d;
  unsigned r = d ? deep_rec(d - 1) : 0;
  return r + (unsigned)buf[(d * 64) % sizeof buf];
}

[[maybe_unused]] __global__ void big_stack_k(unsigned *o) {
  __syncthreads();
  o[threadIdx.x] = deep_rec(8192); /* 8 MiB of frames: over the fiber stack */
}

void launch_deadlock(void) {
  float *o = nullptr;
  cudaMalloc(&o, 64 * sizeof(float));
  WEFT_LAUNCH(deadlock_k, 2, 32, 0, 0, o);
  cudaDeviceSynchronize(); /* deferred: the launch runs here */
}

}  // namespace

/* ================================================================ tests */

TestSuite(emu, .timeout = 60);

Test(emu, block_reduction_shared_syncthreads) {
  const dim3 blocks[] = {dim3(1),    dim3(7),       dim3(32),     dim3(33),
                         dim3(100),  dim3(256),     dim3(513),    dim3(1000),
                         dim3(1024), dim3(8, 4, 3), dim3(32, 32), dim3(5, 1, 7)};
  const dim3 grid(3, 2, 1);
  Lcg rng(11);
  for (dim3 b : blocks) {
    unsigned nt = b.x * b.y * b.z, nb = grid.x * grid.y * grid.z;
    std::vector<float> h(nt * nb);
    for (float &v : h) v = (float)rng.range(-50, 50); /* integers: sums are exact */
    float *x = dev_alloc<float>(h.size()), *out = dev_alloc<float>(nb);
    to_dev(x, h);
    WEFT_LAUNCH(block_sum_k, grid, b, 0, 0, x, out);
    cr_assert_eq(cudaGetLastError(), cudaSuccess);
    std::vector<float> got = from_dev(out, nb);
    for (unsigned blk = 0; blk < nb; blk++) {
      double ref = 0;
      for (unsigned t = 0; t < nt; t++) ref += h[blk * nt + t];
      cr_assert_eq(got[blk], (float)ref, "block (%u,%u,%u) #%u: %g, expected %g", b.x, b.y, b.z,
                   blk, got[blk], ref);
    }
    cudaFree(x);
    cudaFree(out);
  }
}

Test(emu, thread_geometry_3d) {
  dim3 grid(3, 2, 2), block(4, 3, 2);
  unsigned nt = 24, nb = 12;
  unsigned *out = dev_alloc<unsigned>(8 * nt * nb);
  WEFT_LAUNCH(geometry_k, grid, block, 0, 0, out);
  std::vector<unsigned> h = from_dev(out, 8 * nt * nb);
  for (unsigned bz = 0; bz < 2; bz++)
    for (unsigned by = 0; by < 2; by++)
      for (unsigned bx = 0; bx < 3; bx++)
        for (unsigned tz = 0; tz < 2; tz++)
          for (unsigned ty = 0; ty < 3; ty++)
            for (unsigned tx = 0; tx < 4; tx++) {
              unsigned b = bx + 3 * (by + 2 * bz), t = tx + 4 * (ty + 3 * tz);
              const unsigned *o = &h[8 * (b * nt + t)];
              cr_assert(o[0] == tx && o[1] == ty && o[2] == tz && o[3] == bx && o[4] == by &&
                            o[5] == bz && o[6] == 40302 && o[7] == 30202,
                        "thread (%u,%u,%u) of block (%u,%u,%u) saw (%u,%u,%u) (%u,%u,%u) %u %u", tx,
                        ty, tz, bx, by, bz, o[0], o[1], o[2], o[3], o[4], o[5], o[6], o[7]);
            }
  cudaFree(out);
}

template <class T>
static void check_shuffles(T (*gen)(Lcg &), const char *tname) {
  const int nthreads = 64, nblocks = 2, n = nthreads * nblocks;
  Lcg rng(77);
  std::vector<T> h(n);
  for (T &v : h) v = gen(rng);
  T *in = dev_alloc<T>(n), *out = dev_alloc<T>(n);
  to_dev(in, h);
  const char *names[] = {"__shfl_sync", "__shfl_up_sync", "__shfl_down_sync", "__shfl_xor_sync"};
  int checked = 0;
  for (int kind = 0; kind < 4; kind++)
    for (int width = 32; width >= 1; width /= 2)
      for (int arg : {0, 1, 2, 3, 5, 8, 13, 16, 17, 31, -1}) {
        for (int perlane = 0; perlane < 2; perlane++) {
          if (perlane && kind != 0 && kind != 3) continue;
          if (perlane && arg != 0) continue;
          if (arg < 0 && kind != 0) continue; /* negative srcLane only for __shfl_sync */
          WEFT_LAUNCH(shfl_k<T>, nblocks, nthreads, 0, 0, (const T *)in, out, kind, arg, width,
                      perlane);
          cr_assert_eq(cudaGetLastError(), cudaSuccess);
          std::vector<T> got = from_dev(out, n);
          for (int t = 0; t < n; t++) {
            int lane = t % 32, warp0 = t - lane;
            int a = perlane ? (kind == 0 ? (lane * 7 + 3) % 45 - 6 : (lane * 5 + 1) % 32) : arg;
            T want = h[warp0 + ref_src(kind, lane, a, width)];
            cr_assert(std::memcmp(&got[t], &want, sizeof(T)) == 0,
                      "%s<%s>(arg %d%s, width %d): thread %d got a different value than lane %d's",
                      names[kind], tname, a, perlane ? " per lane" : "", width, t,
                      ref_src(kind, lane, a, width));
          }
          checked++;
        }
      }
  cr_assert_gt(checked, 100);
  cudaFree(in);
  cudaFree(out);
}

Test(emu, shuffles_float) {
  check_shuffles<float>([](Lcg &r) { return r.uni(-100.0f, 100.0f); }, "float");
}
Test(emu, shuffles_double) {
  check_shuffles<double>([](Lcg &r) { return (double)r.uni(-1, 1) + 1e-12 * r.next(); }, "double");
}
Test(emu, shuffles_int) {
  check_shuffles<int>([](Lcg &r) { return (int)r.next(); }, "int");
}
Test(emu, shuffles_unsigned) {
  check_shuffles<unsigned>([](Lcg &r) { return r.next() | 0x80000000u; }, "unsigned");
}

Test(emu, ballot_and_ffs) {
  const int n = 2 * 32;
  Lcg rng(11);
  std::vector<int> h(n);
  for (int &v : h) v = rng.range(-3, 3);
  for (int l = 32; l < 64; l++) h[l] = 0; /* the second warp: no lane's predicate holds */
  int *in = dev_alloc<int>(n), *first = dev_alloc<int>(n);
  unsigned *out = dev_alloc<unsigned>(2 * n);
  to_dev(in, h);
  WEFT_LAUNCH(ballot_k, 2, 32, 0, 0, (const int *)in, out, first);
  std::vector<unsigned> got = from_dev(out, 2 * n);
  std::vector<int> f = from_dev(first, n);
  for (int t = 0; t < n; t++) {
    const int w0 = t - t % 32;
    unsigned all = 0, even = 0;
    for (int l = 0; l < 32; l++)
      if (h[w0 + l] > 0) all |= 1u << l, even |= l % 2 == 0 ? 1u << l : 0u;
    cr_assert_eq(got[2 * t], all, "thread %d: ballot 0x%08x, want 0x%08x", t, got[2 * t], all);
    if (t % 2 == 0)
      cr_assert_eq(got[2 * t + 1], even, "thread %d: even-lane ballot 0x%08x, want 0x%08x", t,
                   got[2 * t + 1], even);
    cr_assert_eq(f[t], all ? __builtin_ctz(all) + 1 : 0, "thread %d: __ffs", t);
  }
  cudaFree(in), cudaFree(out), cudaFree(first);
}

/* Blocks run in an order drawn per launch (a GPU promises none): every
 * block once, different orders under different seeds and launches, z, y, x
 * order when shuffling is off, and an order-dependent float atomic sum that
 * changes with the seed (as from run to run on a GPU). */
Test(emu, blocks_run_once_each_in_a_drawn_order) {
  const unsigned n = 97;
  std::vector<float> h(n);
  /* 1e8 + 1 rounds to 1e8: the sum is 1e8 plus the ones added before it */
  for (unsigned i = 0; i < n; i++) h[i] = i == 40 ? 1e8f : 1.0f;
  float *x = dev_alloc<float>(n), *sum = dev_alloc<float>(1);
  unsigned *order = dev_alloc<unsigned>(n), *next = dev_alloc<unsigned>(1);
  to_dev(x, h);
  const unsigned long long prev = weft_emu_set_shuffle(0);
  std::set<std::vector<unsigned>> orders;
  std::set<float> sums;
  for (unsigned long long seed = 0; seed < 6; seed++) {
    weft_emu_set_shuffle(seed);
    for (int rep = 0; rep < 2; rep++) {
      cudaMemset(sum, 0, sizeof(float));
      cudaMemset(next, 0, sizeof(unsigned));
      WEFT_LAUNCH(order_sum_k, n, 1, 0, 0, (const float *)x, sum, order, next);
      std::vector<unsigned> o = from_dev(order, n);
      std::vector<unsigned> sorted = o;
      std::sort(sorted.begin(), sorted.end());
      for (unsigned i = 0; i < n; i++)
        cr_assert_eq(sorted[i], i, "seed %llu: block %u ran %s", seed, i,
                     sorted[i] < i ? "twice" : "never");
      if (seed == 0)
        for (unsigned i = 0; i < n; i++)
          cr_assert_eq(o[i], i, "unshuffled: block %u ran %u-th", o[i], i);
      orders.insert(o);
      sums.insert(from_dev(sum, 1)[0]);
    }
  }
  weft_emu_set_shuffle(prev);
  cr_assert_geq(orders.size(), 10u, "%zu distinct block orders in 12 launches", orders.size());
  cr_assert_geq(sums.size(), 2u, "an order-dependent atomic sum gave one value under 6 seeds");
  cudaFree(x), cudaFree(sum), cudaFree(order), cudaFree(next);
}

Test(emu, warp_reductions_and_scan) {
  const int n = 3 * 64;
  Lcg rng(5);
  std::vector<int> h(n);
  for (int &v : h) v = rng.range(-1000, 1000);
  int *in = dev_alloc<int>(n), *out = dev_alloc<int>(4 * n);
  to_dev(in, h);
  WEFT_LAUNCH(warp_sum_k, 3, 64, 0, 0, (const int *)in, out);
  std::vector<int> got = from_dev(out, 4 * n);
  for (int t = 0; t < n; t++) {
    int lane = t % 32, w0 = t - lane;
    int down = 0, all = 0, incl = 0;
    for (int l = lane; l < 32; l++) down += h[w0 + l]; /* shfl_down keeps lanes past the end */
    for (int l = 0; l < 32; l++) all += h[w0 + l];
    for (int l = 0; l <= lane; l++) incl += h[w0 + l];
    /* shfl_down tree: lane L sums lanes L..L+31 clipped at the warp, each
     * lane past the end counted as itself repeatedly: only lane 0's is the
     * warp total; compare lane 0 and check the others by simulation. */
    int sim[32];
    for (int l = 0; l < 32; l++) sim[l] = h[w0 + l];
    for (int o = 16; o > 0; o /= 2) {
      int nxt[32];
      for (int l = 0; l < 32; l++) nxt[l] = sim[l] + (l + o < 32 ? sim[l + o] : sim[l]);
      std::memcpy(sim, nxt, sizeof sim);
    }
    (void)down;
    cr_assert_eq(got[4 * t + 0], sim[lane], "shfl_down tree, thread %d", t);
    cr_assert_eq(got[4 * t + 1], all, "xor butterfly gives every lane the total, thread %d", t);
    cr_assert_eq(got[4 * t + 2], incl, "shfl_up inclusive scan, thread %d", t);
    cr_assert_eq(got[4 * t + 3], all, "broadcast of lane 0's total, thread %d", t);
  }
  cudaFree(in);
  cudaFree(out);
}

Test(emu, syncwarp_masks) {
  Lcg rng(9);
  std::vector<float> h(64);
  for (float &v : h) v = rng.uni(-5, 5);
  float *in = dev_alloc<float>(64), *out = dev_alloc<float>(128);
  to_dev(in, h);
  WEFT_LAUNCH(syncwarp_k, 1, 64, 0, 0, (const float *)in, out);
  std::vector<float> got = from_dev(out, 128);
  std::vector<float> first(64);
  for (unsigned t = 0; t < 64; t++) first[t] = h[(t & ~15u) + (t + 1) % 16];
  for (unsigned t = 0; t < 64; t++) {
    cr_assert_eq(got[t], first[t], "thread %u", t);
    cr_assert_eq(got[64 + t], 2.0f * first[t ^ 31], "thread %u", t);
  }
  cudaFree(in);
  cudaFree(out);
}

Test(emu, dynamic_shared_memory) {
  const unsigned nb = 5, nt = 96;
  Lcg rng(3);
  std::vector<float> h(nb * nt);
  for (float &v : h) v = rng.uni(-1, 1);
  float *in = dev_alloc<float>(nb * nt), *out = dev_alloc<float>(nb * nt);
  unsigned *info = dev_alloc<unsigned>(2 * nb);
  to_dev(in, h);
  WEFT_LAUNCH(dyn_smem_k, nb, nt, 2 * nt * sizeof(float), 0, (const float *)in, out, info);
  cr_assert_eq(cudaGetLastError(), cudaSuccess);
  std::vector<float> got = from_dev(out, nb * nt);
  std::vector<unsigned> inf = from_dev(info, 2 * nb);
  for (unsigned b = 0; b < nb; b++) {
    cr_assert_eq(inf[2 * b], 2 * nt, "block %u: fresh dynamic shared memory reads as NaN", b);
    cr_assert_eq(inf[2 * b + 1], 0u, "block %u: 16-byte aligned", b);
    for (unsigned t = 0; t < nt; t++)
      cr_assert_eq(got[b * nt + t], h[b * nt + nt - 1 - t], "block %u thread %u", b, t);
  }
  cudaFree(in);
  cudaFree(out);
  cudaFree(info);
}

Test(emu, atomics_from_many_blocks) {
  const int nb = 40, nt = 128, n = nb * nt;
  Lcg rng(21);
  std::vector<int> vals(n);
  for (int &v : vals) v = rng.range(-3000, 3000);
  int *dv = dev_alloc<int>(n), *olds = dev_alloc<int>(n), *isum = dev_alloc<int>(1),
      *imax = dev_alloc<int>(1);
  float *fsum = dev_alloc<float>(1);
  double *dsum = dev_alloc<double>(1);
  unsigned *umax = dev_alloc<unsigned>(1), *cas = dev_alloc<unsigned>(1);
  to_dev(dv, vals);
  cudaMemset(fsum, 0, 4), cudaMemset(dsum, 0, 8), cudaMemset(isum, 0, 4), cudaMemset(umax, 0, 4),
      cudaMemset(cas, 0, 4);
  to_dev(imax, std::vector<int>{INT32_MIN});
  WEFT_LAUNCH(atomics_k, nb, nt, 0, 0, fsum, dsum, isum, olds, imax, umax, cas, (const int *)dv);
  double fref = 0, dref = 0;
  int mref = INT32_MIN;
  unsigned uref = 0;
  for (int v : vals) {
    fref += v, dref += v * 0.125, mref = v > mref ? v : mref;
    unsigned u = (unsigned)v * 2654435761u;
    uref = u > uref ? u : uref;
  }
  cr_assert_eq(from_dev(fsum, 1)[0], (float)fref); /* integer sums: exact */
  cr_assert_eq(from_dev(dsum, 1)[0], dref);
  cr_assert_eq(from_dev(isum, 1)[0], n);
  cr_assert_eq(from_dev(imax, 1)[0], mref);
  cr_assert_eq(from_dev(umax, 1)[0], uref);
  cr_assert_eq(from_dev(cas, 1)[0], 3u * n);
  std::vector<int> o = from_dev(olds, n);
  std::vector<char> seen(n, 0);
  for (int v : o) {
    cr_assert(v >= 0 && v < n && !seen[v], "atomicAdd returns each old value once (%d)", v);
    seen[v] = 1;
  }
  for (void *p : {(void *)dv, (void *)olds, (void *)isum, (void *)imax, (void *)fsum, (void *)dsum,
                  (void *)umax, (void *)cas})
    cudaFree(p);
}

Test(emu, fiber_stacks_are_private) {
  unsigned *bad = dev_alloc<unsigned>(2 * 256);
  WEFT_LAUNCH(stacks_k, 2, 256, 0, 0, bad);
  std::vector<unsigned> h = from_dev(bad, 2 * 256);
  for (unsigned t = 0; t < 512; t++) cr_assert_eq(h[t], 0u, "thread %u's stack changed", t);
  cudaFree(bad);
}

Test(emu, returned_threads_count_as_arrived) {
  Lcg rng(8);
  std::vector<float> h(128);
  for (float &v : h) v = rng.uni(0, 1);
  float *in = dev_alloc<float>(128), *out = dev_alloc<float>(128);
  to_dev(in, h);
  WEFT_LAUNCH(early_exit_k, 1, 128, 0, 0, (const float *)in, out, 77u);
  std::vector<float> got = from_dev(out, 128);
  for (unsigned t = 0; t < 77; t++) cr_assert_eq(got[t], h[76 - t]);
  for (unsigned t = 77; t < 128; t++) cr_assert(std::isnan(got[t]), "untouched: still NaN fill");
  cudaFree(in);
  cudaFree(out);
}

Test(emu, launch_time_64x256_two_barriers) {
  float *out = dev_alloc<float>(64 * 256);
  WEFT_LAUNCH(two_barriers_k, 64, 256, 0, 0, out); /* warm the stack pool */
  cudaDeviceSynchronize();
  double best = 1e9;
  for (int rep = 0; rep < 5; rep++) {
    auto t0 = std::chrono::steady_clock::now();
    WEFT_LAUNCH(two_barriers_k, 64, 256, 0, 0, out);
    cudaDeviceSynchronize(); /* the launch runs here */
    auto t1 = std::chrono::steady_clock::now();
    double ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
    best = ms < best ? ms : best;
  }
  std::vector<float> h = from_dev(out, 64 * 256);
  for (unsigned i = 0; i < 64 * 256; i++) cr_assert_eq(h[i], (float)((i % 256 + 1) % 256));
  fprintf(stderr, "[emu] 64 blocks x 256 threads, 2 barriers: %.2f ms (best of 5)\n", best);
  cr_assert_lt(best, 50.0, "a 64x256 launch with 2 barriers took %.2f ms (target well under 10)",
               best);
  cudaFree(out);
}

Test(emu, deadlock_aborts, .signal = SIGABRT) { launch_deadlock(); }

/* A function that launches kernel(o) as one block of threads over a fresh
 * float buffer and synchronizes (for expect_abort). */
#define ONE_BLOCK(kernel, threads)              \
  [] {                                          \
    float *o = nullptr;                         \
    cudaMalloc(&o, (threads) * sizeof(float));  \
    WEFT_LAUNCH(kernel, 1, (threads), 0, 0, o); \
    cudaDeviceSynchronize();                    \
  }

Test(emu, misuse_messages) {
  expect_abort(launch_deadlock, {"deadlock", "the kernel launch deadlock_k", "launch_deadlock",
                                 "__syncthreads", "__shfl_xor_sync", "shared memory; block ("});
  expect_abort(ONE_BLOCK(partial_warp_shfl_k, 48),
               {"__shfl_down_sync", "has only lanes 0x0000ffff", "block of 48 threads"});
  expect_abort(ONE_BLOCK(partial_warp_ballot_k, 48),
               {"__ballot_sync", "has only lanes 0x0000ffff", "block of 48 threads"});
  expect_abort(ONE_BLOCK(exit_in_shfl_k, 32),
               {"returned while lane", "__shfl_down_sync", "thread (5,0,0)"});
  expect_abort(ONE_BLOCK(mixed_warp_ops_k, 32),
               {"different warp operations", "__syncwarp", "__shfl_xor_sync"});
  expect_abort([] { __syncthreads(); }, {"__syncthreads called outside a kernel"});
}

#if !defined(__SANITIZE_ADDRESS__) /* ASan reports the overflow itself */
Test(emu, fiber_stack_overflow_is_reported) {
  expect_abort(
      [] {
        unsetenv("WEFT_EMU_STACK_KB");
        unsigned *o = nullptr;
        cudaMalloc(&o, 64 * sizeof(unsigned));
        WEFT_LAUNCH(big_stack_k, 1, 64, 0, 0, o);
        cudaDeviceSynchronize();
      },
      {"fiber stack overflow", "WEFT_EMU_STACK_KB"});
}
#endif

Test(emu, launch_validation) {
  int *p = dev_alloc<int>(1024);
  cudaMemset(p, 0, 1024 * sizeof(int));
  struct {
    dim3 grid, block;
    size_t smem;
  } bad[] = {{dim3(1), dim3(1025), 0},
             {dim3(1), dim3(32, 33), 0},
             {dim3(0), dim3(32), 0},
             {dim3(1, 0), dim3(32), 0},
             {dim3(1), dim3(1, 1, 65), 0},
             {dim3(1, 65536), dim3(32), 0},
             {dim3(1), dim3(32), 227 * 1024 + 1}};
  for (auto &b : bad) {
    WEFT_LAUNCH(mark_k, b.grid, b.block, b.smem, 0, p);
    cr_assert_eq(cudaPeekAtLastError(), cudaErrorInvalidConfiguration);
    cr_assert_eq(cudaGetLastError(), cudaErrorInvalidConfiguration);
    cr_assert_eq(cudaGetLastError(), cudaSuccess, "GetLastError resets");
  }
  std::vector<int> h = from_dev(p, 1024);
  for (int v : h) cr_assert_eq(v, 0, "a rejected launch runs nothing");
  WEFT_LAUNCH(mark_k, 1, 1024, 227 * 1024, 0, p);
  cr_assert_eq(cudaGetLastError(), cudaSuccess);
  cr_assert_eq(from_dev(p, 1024)[1023], 7);
  cudaStream_t s;
  cr_assert_eq(cudaStreamCreate(&s), cudaSuccess);
  cr_assert_eq(cudaStreamDestroy(s), cudaSuccess);
  WEFT_LAUNCH(mark_k, 1, 1, 0, s, p);
  cr_assert_eq(cudaGetLastError(), cudaErrorInvalidResourceHandle, "launch on a destroyed stream");
  cudaFree(p);
}

Test(emu, bf16_matches_weft_conversion) {
  Lcg rng(99);
  std::vector<uint32_t> bits = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u,
                                0x7f800001u, 0xffbfffffu, 0x00000001u, 0x807fffffu, 0x3f808000u,
                                0x3f818000u, 0x3f80ffffu, 0x7f7fffffu, 0x7f7f8000u};
  for (int i = 0; i < 200000; i++) bits.push_back(rng.next());
  for (uint32_t u : bits) {
    float f;
    std::memcpy(&f, &u, 4);
    __nv_bfloat16 h = __float2bfloat16(f);
    uint16_t raw;
    std::memcpy(&raw, &h, 2);
    cr_assert_eq(raw, weft_f32_to_bf16(f), "0x%08x -> 0x%04x, weft 0x%04x", u, raw,
                 weft_f32_to_bf16(f));
    float back = __bfloat162float(h), wback = weft_bf16_to_f32(raw);
    cr_assert(std::memcmp(&back, &wback, 4) == 0, "bf16 0x%04x back to float", raw);
    cr_assert_eq(__float2bfloat16_rn(f).__x, raw);
  }
}

/* ------------------------------------------------------------ runtime API */

Test(emu, memcpy_kinds_and_nan_fill) {
  const size_t n = 1000;
  float *d = dev_alloc<float>(n), *d2 = dev_alloc<float>(n);
  std::vector<float> fresh = from_dev(d, n);
  for (float v : fresh) {
    uint32_t u;
    std::memcpy(&u, &v, 4);
    cr_assert_eq(u, 0xffffffffu, "new device memory is 0xFF bytes (NaN)");
  }
  Lcg rng(1);
  std::vector<float> h(n), back(n, 0.0f);
  for (float &v : h) v = rng.uni(-1, 1);
  size_t B = n * 4;
  cr_assert_eq(cudaMemcpy(d, h.data(), B, cudaMemcpyHostToDevice), cudaSuccess);
  cr_assert_eq(cudaMemcpy(back.data(), d, B, cudaMemcpyHostToDevice), cudaErrorInvalidValue,
               "H2D with a host dst");
  cr_assert_eq(cudaGetLastError(), cudaErrorInvalidValue);
  cr_assert_eq(cudaMemcpy(d2, h.data(), B, cudaMemcpyDeviceToHost), cudaErrorInvalidValue,
               "D2H with a host src");
  cr_assert_eq(cudaMemcpy(d2, h.data(), B, cudaMemcpyDeviceToDevice), cudaErrorInvalidValue);
  cr_assert_eq(cudaMemcpy(back.data(), d, B, cudaMemcpyHostToHost), cudaErrorInvalidValue);
  cr_assert_eq(cudaMemcpy(d2, d, B + 4, cudaMemcpyDeviceToDevice), cudaErrorInvalidValue,
               "runs past the allocation");
  cr_assert_eq(cudaMemcpy(d2, d, B, (cudaMemcpyKind)7), cudaErrorInvalidMemcpyDirection);
  cr_assert_eq(cudaMemcpy(d2, d, B, cudaMemcpyDeviceToDevice), cudaSuccess);
  cr_assert_eq(cudaMemcpy(back.data(), d2, B, cudaMemcpyDefault), cudaSuccess);
  cr_assert(back == h);
  cr_assert_eq(cudaMemcpyAsync(d + 10, h.data(), 40, cudaMemcpyDefault, 0), cudaSuccess,
               "interior device pointer");
  std::vector<float> h2(n, 0.0f);
  cr_assert_eq(cudaMemcpy(h2.data(), back.data(), B, cudaMemcpyHostToHost), cudaSuccess);
  cr_assert(h2 == h);
  cr_assert_eq(cudaMemset(h2.data(), 0, B), cudaErrorInvalidValue, "memset of host memory");
  cr_assert_eq(cudaMemset(d, 0, B + 1), cudaErrorInvalidValue);
  cr_assert_eq(cudaMemsetAsync(d + 1, 0, B - 4, 0), cudaSuccess);
  cr_assert_eq(cudaMemcpy(back.data(), d, B, cudaMemcpyDeviceToHost), cudaSuccess);
  cr_assert_eq(back[0], h[0]);
  for (size_t i = 1; i < n; i++) cr_assert_eq(back[i], 0.0f);
  cr_assert_eq(cudaFree(d + 1), cudaErrorInvalidValue, "interior pointer");
  cr_assert_eq(cudaFree(h.data()), cudaErrorInvalidValue, "unknown pointer");
  cr_assert_eq(cudaFree(d), cudaSuccess);
  cr_assert_eq(cudaFree(d), cudaErrorInvalidValue, "double free");
  cr_assert_eq(cudaFree(nullptr), cudaSuccess);
  cr_assert_eq(cudaFree(d2), cudaSuccess);
  cudaGetLastError();
}

Test(emu, pointer_attributes_and_mem_info) {
  size_t free0, total;
  cr_assert_eq(cudaMemGetInfo(&free0, &total), cudaSuccess);
  cr_assert_eq(total, (size_t)16 << 30);
  char *d = dev_alloc<char>(4096);
  size_t free1;
  cudaMemGetInfo(&free1, &total);
  cr_assert_eq(free0 - free1, 4096u);
  void *ph = nullptr;
  cr_assert_eq(cudaMallocHost(&ph, 100), cudaSuccess);
  int stack_var = 0;
  cudaPointerAttributes a;
  for (size_t off : {(size_t)0, (size_t)1, (size_t)2048, (size_t)4095}) {
    cr_assert_eq(cudaPointerGetAttributes(&a, d + off), cudaSuccess);
    cr_assert_eq(a.type, cudaMemoryTypeDevice, "offset %zu", off);
    cr_assert_eq(a.device, 0);
  }
  cr_assert_eq(cudaPointerGetAttributes(&a, (char *)ph + 50), cudaSuccess);
  cr_assert_eq(a.type, cudaMemoryTypeHost);
  cr_assert_eq(cudaPointerGetAttributes(&a, &stack_var), cudaSuccess);
  cr_assert_eq(a.type, cudaMemoryTypeUnregistered);
  std::vector<int> heap(10);
  cr_assert_eq(cudaPointerGetAttributes(&a, heap.data()), cudaSuccess);
  cr_assert_eq(a.type, cudaMemoryTypeUnregistered);
  cr_assert_eq(cudaFreeHost(d), cudaErrorInvalidValue, "device memory is not pinned host memory");
  cr_assert_eq(cudaFree(ph), cudaErrorInvalidValue);
  cr_assert_eq(cudaFreeHost(ph), cudaSuccess);
  cr_assert_eq(cudaFree(d), cudaSuccess);
  cudaPointerGetAttributes(&a, d);
  cr_assert_eq(a.type, cudaMemoryTypeUnregistered, "freed");
  cudaMemGetInfo(&free1, &total);
  cr_assert_eq(free1, free0);
  int v = 0;
  cr_assert_eq(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  cr_assert_eq(v, 4);
  cr_assert_eq(cudaDeviceGetAttribute(&v, cudaDevAttrWarpSize, 0), cudaSuccess);
  cr_assert_eq(v, 32);
  cr_assert_eq(cudaDeviceGetAttribute(&v, cudaDevAttrWarpSize, 1), cudaErrorInvalidDevice);
  cudaGetLastError();
}

Test(emu, device_count_env) {
  int n = -1, d = -1;
  cr_assert_eq(cudaGetDeviceCount(&n), cudaSuccess);
  cr_assert_eq(n, 1);
  cr_assert_eq(cudaSetDevice(1), cudaErrorInvalidDevice);
  cr_assert_eq(cudaSetDevice(-1), cudaErrorInvalidDevice);
  setenv("WEFT_EMU_DEVICES", "3", 1);
  cr_assert_eq(cudaGetDeviceCount(&n), cudaSuccess);
  cr_assert_eq(n, 3);
  cr_assert_eq(cudaSetDevice(2), cudaSuccess);
  cr_assert_eq(cudaGetDevice(&d), cudaSuccess);
  cr_assert_eq(d, 2);
  void *p = nullptr;
  cr_assert_eq(cudaMalloc(&p, 64), cudaSuccess);
  cudaPointerAttributes a;
  cudaPointerGetAttributes(&a, p);
  cr_assert_eq(a.device, 2);
  cudaFree(p);
  cr_assert_eq(cudaSetDevice(3), cudaErrorInvalidDevice);
  cudaSetDevice(0);
  setenv("WEFT_EMU_DEVICES", "0", 1);
  cr_assert_eq(cudaGetDeviceCount(&n), cudaErrorNoDevice);
  cr_assert_eq(n, 0);
  cr_assert_eq(cudaMalloc(&p, 64), cudaErrorNoDevice);
  cr_assert_eq(cudaSetDevice(0), cudaErrorNoDevice);
  cudaStream_t s;
  cr_assert_eq(cudaStreamCreate(&s), cudaErrorNoDevice);
  cublasHandle_t h;
  cr_assert_eq(cublasCreate(&h), CUBLAS_STATUS_NOT_INITIALIZED);
  cudaGetLastError();
  int x = 0, *px = &x; /* (arguments are evaluated inside the launch's lambda) */
  WEFT_LAUNCH(mark_k, 1, 1, 0, 0, px);
  cr_assert_eq(cudaGetLastError(), cudaErrorNoDevice);
  cr_assert_eq(x, 0, "no device: the kernel did not run");
  unsetenv("WEFT_EMU_DEVICES");
  cr_assert_eq(cudaGetDeviceCount(&n), cudaSuccess);
  cr_assert_eq(n, 1);
  cr_assert_str_eq(cudaGetErrorString(cudaErrorNoDevice), "no CUDA-capable device is detected");
  cr_assert_str_eq(cudaGetErrorName(cudaErrorInvalidValue), "cudaErrorInvalidValue");
}

/* What a thread other than weft_device_init's sees of the backend's events
 * (mesh's watchdog polls NCCL calls' events on its own thread). */
struct other_thread_view {
  weft_event *ev[WEFT_STREAM_COUNT];
  weft_status st[WEFT_STREAM_COUNT];
  bool done[WEFT_STREAM_COUNT];
  int device;
};

static void *query_on_another_thread(void *arg) {
  auto *v = (other_thread_view *)arg;
  for (int s = 0; s < WEFT_STREAM_COUNT; s++) {
    v->st[s] = weft_event_query(WEFT_CUDA, v->ev[s], &v->done[s]);
    weft_event_destroy(WEFT_CUDA, v->ev[s]);
  }
  v->device = -1;
  (void)cudaGetDevice(&v->device);
  return nullptr;
}

Test(emu, backend_events_work_on_every_stream_and_from_any_thread) {
  /* two devices, this process on device 1: a fresh thread starts on 0 */
  setenv("WEFT_EMU_DEVICES", "2", 1);
  int ord = -1;
  cr_assert_eq(weft_device_init(WEFT_CUDA, 1, &ord), WEFT_OK, "%s", weft_last_error());
  cr_assert_eq(ord, 1);
  other_thread_view v = {};
  for (int s = 0; s < WEFT_STREAM_COUNT; s++)
    cr_assert_eq(weft_event_record(WEFT_CUDA, (weft_stream_id)s, &v.ev[s]), WEFT_OK,
                 "stream %s: %s", weft_stream_name((weft_stream_id)s), weft_last_error());
  cr_assert_eq(weft_device_synchronize(WEFT_CUDA), WEFT_OK, "%s", weft_last_error());
  pthread_t t;
  cr_assert_eq(pthread_create(&t, nullptr, query_on_another_thread, &v), 0);
  pthread_join(t, nullptr);
  for (int s = 0; s < WEFT_STREAM_COUNT; s++) {
    cr_expect_eq(v.st[s], WEFT_OK, "query on stream %s", weft_stream_name((weft_stream_id)s));
    cr_expect(v.done[s], "stream %s passed its event", weft_stream_name((weft_stream_id)s));
  }
  cr_expect_eq(v.device, 1, "the querying thread was moved to the process's device, got %d",
               v.device);
  weft_event *bad = nullptr;
  cr_expect_eq(weft_event_record(WEFT_CUDA, WEFT_STREAM_COUNT, &bad), WEFT_ERR_INVALID);
  cr_expect_null(bad);
  weft_device_shutdown(WEFT_CUDA);
  unsetenv("WEFT_EMU_DEVICES");
}

Test(emu, streams_and_events) {
  cudaStream_t s1, s2;
  cr_assert_eq(cudaStreamCreate(&s1), cudaSuccess);
  cr_assert_eq(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking), cudaSuccess);
  cr_assert_eq(cudaStreamCreateWithFlags(&s2, 0x10), cudaErrorInvalidValue);
  cudaEvent_t e0, e1, ent;
  cr_assert_eq(cudaEventCreate(&e0), cudaSuccess);
  cr_assert_eq(cudaEventCreate(&e1), cudaSuccess);
  cr_assert_eq(cudaEventCreateWithFlags(&ent, cudaEventDisableTiming), cudaSuccess);
  float ms = -1;
  cr_assert_eq(cudaEventElapsedTime(&ms, e0, e1), cudaErrorInvalidResourceHandle, "not recorded");
  cr_assert_eq(cudaEventQuery(e0), cudaSuccess);
  cr_assert_eq(cudaEventRecord(e0, s1), cudaSuccess);
  float *out = dev_alloc<float>(64 * 256);
  WEFT_LAUNCH(two_barriers_k, 64, 256, 0, s1, out);
  cr_assert_eq(cudaEventRecord(e1, s1), cudaSuccess);
  cr_assert_eq(cudaEventRecord(ent, s1), cudaSuccess);
  cr_assert_eq(cudaStreamWaitEvent(s2, ent, 0), cudaSuccess);
  cr_assert_eq(cudaEventSynchronize(e1), cudaSuccess);
  cr_assert_eq(cudaEventQuery(e1), cudaSuccess);
  cr_assert_eq(cudaEventElapsedTime(&ms, e0, e1), cudaSuccess);
  cr_assert(ms > 0.0f && ms < 10000.0f, "elapsed %g ms", ms);
  cr_assert_eq(cudaEventElapsedTime(&ms, e0, ent), cudaErrorInvalidResourceHandle, "no timing");
  cr_assert_eq(cudaStreamSynchronize(s2), cudaSuccess);
  cr_assert_eq(cudaDeviceSynchronize(), cudaSuccess);
  cr_assert_eq(cudaEventDestroy(e0), cudaSuccess);
  cr_assert_eq(cudaEventRecord(e0, s1), cudaErrorInvalidResourceHandle, "destroyed event");
  cr_assert_eq(cudaStreamDestroy(s2), cudaSuccess);
  cr_assert_eq(cudaStreamSynchronize(s2), cudaErrorInvalidResourceHandle);
  cr_assert_eq(cudaMemcpyAsync(out, out, 4, cudaMemcpyDeviceToDevice, s2),
               cudaErrorInvalidResourceHandle);
  cudaEventDestroy(e1), cudaEventDestroy(ent), cudaStreamDestroy(s1), cudaFree(out);
  cudaGetLastError();
}

/* ----------------------------------------------------------------- cuBLAS */

namespace {

/* TF32 rounding written differently from the emulator's: keep 11
 * significant bits with nearbyint (ties to even). */
float ref_tf32(float x) {
  if (!std::isfinite(x) || x == 0.0f) return x;
  int e;
  double m = std::frexp((double)x, &e); /* 0.5 <= |m| < 1 */
  return (float)std::ldexp(std::nearbyint(std::ldexp(m, 11)), e - 11);
}
float ref_bf16(float x) { return weft_bf16_to_f32(weft_f32_to_bf16(x)); }

struct GemmCase {
  cublasOperation_t ta, tb;
  int m, n, k, lda, ldb, ldc;
};

/* Column-major op(X)(r, c) of a matrix stored with leading dim ld. */
inline float at(const std::vector<float> &X, cublasOperation_t t, int r, int c, int ld) {
  return t == CUBLAS_OP_N ? X[(size_t)r + (size_t)c * ld] : X[(size_t)c + (size_t)r * ld];
}

std::vector<GemmCase> gemm_cases() {
  std::vector<GemmCase> v;
  for (cublasOperation_t ta : {CUBLAS_OP_N, CUBLAS_OP_T})
    for (cublasOperation_t tb : {CUBLAS_OP_N, CUBLAS_OP_T}) {
      int m = 7, n = 5, k = 9;
      int arows = ta == CUBLAS_OP_N ? m : k, brows = tb == CUBLAS_OP_N ? k : n;
      v.push_back({ta, tb, m, n, k, arows + 3, brows + 2, m + 4});
      v.push_back({ta, tb, 33, 17, 40, arows == m ? 33 : 40, brows == k ? 40 : 17, 33});
    }
  return v;
}

enum RefRound { REF_EXACT, REF_TF32, REF_BF16 };

/* Checks C (column-major m x n, ldc; padding must keep `pad`) against the
 * double reference alpha op(A) op(B) + beta C0 with rounded operands. */
void check_gemm(const GemmCase &g, float alpha, float beta, const std::vector<float> &A,
                const std::vector<float> &B, const std::vector<float> &C0,
                const std::vector<float> &C, RefRound rr, const char *what, double rel_tol) {
  for (int i = 0; i < g.ldc; i++)
    for (int j = 0; j < g.n; j++) {
      size_t ci = (size_t)i + (size_t)j * g.ldc;
      if (i >= g.m) {
        cr_assert(std::memcmp(&C[ci], &C0[ci], 4) == 0, "%s: padding row %d col %d written", what,
                  i, j);
        continue;
      }
      double ref = 0, mag = 0;
      for (int l = 0; l < g.k; l++) {
        float a = at(A, g.ta, i, l, g.lda), b = at(B, g.tb, l, j, g.ldb);
        if (rr == REF_TF32) a = ref_tf32(a), b = ref_tf32(b);
        if (rr == REF_BF16) a = ref_bf16(a), b = ref_bf16(b);
        ref += (double)a * b;
        mag += std::fabs((double)a * b);
      }
      ref = alpha * ref + (beta != 0.0f ? beta * (double)C0[ci] : 0.0);
      mag = std::fabs(alpha) * mag + std::fabs(beta * (double)(beta != 0.0f ? C0[ci] : 0.0f));
      double err = std::fabs((double)C[ci] - ref);
      cr_assert(err <= rel_tol * mag + 1e-30,
                "%s: ta %d tb %d m %d n %d k %d: C(%d,%d) = %.9g, "
                "reference %.9g (err %.3g, tol %.3g)",
                what, g.ta, g.tb, g.m, g.n, g.k, i, j, C[ci], ref, err, rel_tol * mag);
    }
}

std::vector<float> rand_vec(Lcg &rng, size_t n) {
  std::vector<float> v(n);
  for (float &x : v) x = rng.uni(-2, 2);
  return v;
}

struct Blas {
  cublasHandle_t h;
  Blas() { cr_assert_eq(cublasCreate(&h), CUBLAS_STATUS_SUCCESS); }
  ~Blas() { cublasDestroy(h); }
};

}  // namespace

Test(emu, sgemm_all_transposes_padded) {
  Blas b;
  Lcg rng(123);
  for (const GemmCase &g : gemm_cases())
    for (float beta : {0.0f, -0.5f}) {
      int acols = g.ta == CUBLAS_OP_N ? g.k : g.m, bcols = g.tb == CUBLAS_OP_N ? g.n : g.k;
      std::vector<float> A = rand_vec(rng, (size_t)g.lda * acols),
                         B = rand_vec(rng, (size_t)g.ldb * bcols),
                         C0 = rand_vec(rng, (size_t)g.ldc * g.n);
      if (beta == 0.0f)
        for (int j = 0; j < g.n; j++) C0[(size_t)j * g.ldc] = NAN; /* must not propagate */
      float *dA = dev_alloc<float>(A.size()), *dB = dev_alloc<float>(B.size()),
            *dC = dev_alloc<float>(C0.size());
      to_dev(dA, A), to_dev(dB, B), to_dev(dC, C0);
      float alpha = 0.75f;
      cr_assert_eq(cublasSgemm(b.h, g.ta, g.tb, g.m, g.n, g.k, &alpha, dA, g.lda, dB, g.ldb, &beta,
                               dC, g.ldc),
                   CUBLAS_STATUS_SUCCESS);
      check_gemm(g, alpha, beta, A, B, C0, from_dev(dC, C0.size()), REF_EXACT, "sgemm", 1e-6);
      cudaFree(dA), cudaFree(dB), cudaFree(dC);
    }
}

Test(emu, sgemm_beta_nan_and_errors) {
  Blas b;
  Lcg rng(5);
  const int m = 4, n = 3, k = 6;
  std::vector<float> A = rand_vec(rng, m * k), B = rand_vec(rng, k * n), C0(m * n, NAN);
  float *dA = dev_alloc<float>(A.size()), *dB = dev_alloc<float>(B.size()),
        *dC = dev_alloc<float>(C0.size());
  to_dev(dA, A), to_dev(dB, B), to_dev(dC, C0);
  float one = 1.0f, zero = 0.0f, half = 0.5f;
  cr_assert_eq(
      cublasSgemm(b.h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, dA, m, dB, k, &zero, dC, m),
      CUBLAS_STATUS_SUCCESS);
  for (float v : from_dev(dC, C0.size())) cr_assert(!std::isnan(v), "beta = 0 reads no C");
  to_dev(dC, C0);
  cr_assert_eq(
      cublasSgemm(b.h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, dA, m, dB, k, &half, dC, m),
      CUBLAS_STATUS_SUCCESS);
  for (float v : from_dev(dC, C0.size())) cr_assert(std::isnan(v), "beta != 0 reads C");
  struct {
    cublasOperation_t ta, tb;
    int m, n, k, lda, ldb, ldc;
  } bad[] = {
      {CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, m - 1, k, m},
      {CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, k - 1, k, m},
      {CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, m, k - 1, m},
      {CUBLAS_OP_N, CUBLAS_OP_T, m, n, k, m, n - 1, m},
      {CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, m, k, m - 1},
      {CUBLAS_OP_N, CUBLAS_OP_N, -1, n, k, m, k, m},
      {CUBLAS_OP_N, CUBLAS_OP_N, m, -1, k, m, k, m},
      {CUBLAS_OP_N, CUBLAS_OP_N, m, n, -1, m, k, m},
      {(cublasOperation_t)3, CUBLAS_OP_N, m, n, k, m, k, m}, /* CUBLAS_OP_CONJG */
      {CUBLAS_OP_N, CUBLAS_OP_N, 0, n, k, 0, k, 0},          /* ld >= max(1, rows) */
  };
  std::vector<float> before = from_dev(dC, C0.size());
  for (auto &x : bad) {
    cr_assert_eq(
        cublasSgemm(b.h, x.ta, x.tb, x.m, x.n, x.k, &one, dA, x.lda, dB, x.ldb, &zero, dC, x.ldc),
        CUBLAS_STATUS_INVALID_VALUE, "m %d n %d k %d lda %d ldb %d ldc %d", x.m, x.n, x.k, x.lda,
        x.ldb, x.ldc);
  }
  std::vector<float> after = from_dev(dC, C0.size());
  cr_assert(std::memcmp(before.data(), after.data(), 4 * before.size()) == 0, "C untouched");
  cr_assert_eq(
      cublasSgemm(b.h, CUBLAS_OP_N, CUBLAS_OP_N, 0, n, k, &one, dA, 1, dB, k, &zero, dC, 1),
      CUBLAS_STATUS_SUCCESS, "m = 0 is a no-op");
  cr_assert_eq(
      cublasSgemm(b.h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, A.data(), m, dB, k, &zero, dC, m),
      CUBLAS_STATUS_EXECUTION_FAILED, "a host pointer as A");
  cr_assert_eq(
      cublasSgemm(nullptr, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, dA, m, dB, k, &zero, dC, m),
      CUBLAS_STATUS_NOT_INITIALIZED);
  /* k = 0: C = beta C */
  std::vector<float> Ck(A.begin(), A.begin() + m * n);
  to_dev(dC, Ck);
  cr_assert_eq(
      cublasSgemm(b.h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, 0, &one, dA, m, dB, 1, &half, dC, m),
      CUBLAS_STATUS_SUCCESS);
  std::vector<float> kc = from_dev(dC, (size_t)m * n);
  for (int i = 0; i < m * n; i++) cr_assert_eq(kc[i], (float)(0.5 * (double)A[i]));
  cr_assert_str_eq(cublasGetStatusString(CUBLAS_STATUS_INVALID_VALUE),
                   "an invalid numeric value was used as an argument");
  cudaFree(dA), cudaFree(dB), cudaFree(dC);
}

Test(emu, sgemm_strided_batched) {
  Blas b;
  Lcg rng(31);
  const int batch = 3;
  for (const GemmCase &g : gemm_cases()) {
    int acols = g.ta == CUBLAS_OP_N ? g.k : g.m, bcols = g.tb == CUBLAS_OP_N ? g.n : g.k;
    long long sA = (long long)g.lda * acols + 5, sB = (long long)g.ldb * bcols + 3,
              sC = (long long)g.ldc * g.n + 7;
    std::vector<float> A = rand_vec(rng, (size_t)sA * batch), B = rand_vec(rng, (size_t)sB * batch),
                       C0 = rand_vec(rng, (size_t)sC * batch);
    float *dA = dev_alloc<float>(A.size()), *dB = dev_alloc<float>(B.size()),
          *dC = dev_alloc<float>(C0.size());
    to_dev(dA, A), to_dev(dB, B), to_dev(dC, C0);
    float alpha = -1.25f, beta = 0.25f;
    cr_assert_eq(cublasSgemmStridedBatched(b.h, g.ta, g.tb, g.m, g.n, g.k, &alpha, dA, g.lda, sA,
                                           dB, g.ldb, sB, &beta, dC, g.ldc, sC, batch),
                 CUBLAS_STATUS_SUCCESS);
    std::vector<float> C = from_dev(dC, C0.size());
    for (int q = 0; q < batch; q++) {
      auto sl = [](const std::vector<float> &v, long long off, long long len) {
        return std::vector<float>(v.begin() + off, v.begin() + off + len);
      };
      long long clen = (long long)g.ldc * g.n;
      check_gemm(g, alpha, beta, sl(A, q * sA, sA), sl(B, q * sB, sB), sl(C0, q * sC, clen),
                 sl(C, q * sC, clen), REF_EXACT, "strided batched", 1e-6);
      for (long long i = q * sC + clen; i < (q + 1) * sC; i++)
        cr_assert(std::memcmp(&C[i], &C0[i], 4) == 0, "gap between batches written");
    }
    cudaFree(dA), cudaFree(dB), cudaFree(dC);
  }
}

static void gemm_ex_case(RefRound rr, cublasComputeType_t ct, cublasMath_t math, bool use_sgemm,
                         const char *what) {
  Blas b;
  cr_assert_eq(cublasSetMathMode(b.h, math), CUBLAS_STATUS_SUCCESS);
  Lcg rng(777);
  int differs = 0;
  for (const GemmCase &g : gemm_cases()) {
    int acols = g.ta == CUBLAS_OP_N ? g.k : g.m, bcols = g.tb == CUBLAS_OP_N ? g.n : g.k;
    std::vector<float> A = rand_vec(rng, (size_t)g.lda * acols),
                       B = rand_vec(rng, (size_t)g.ldb * bcols),
                       C0 = rand_vec(rng, (size_t)g.ldc * g.n);
    float *dA = dev_alloc<float>(A.size()), *dB = dev_alloc<float>(B.size()),
          *dC = dev_alloc<float>(C0.size());
    to_dev(dA, A), to_dev(dB, B), to_dev(dC, C0);
    float alpha = 1.5f, beta = 0.5f;
    cublasStatus_t st = use_sgemm ? cublasSgemm(b.h, g.ta, g.tb, g.m, g.n, g.k, &alpha, dA, g.lda,
                                                dB, g.ldb, &beta, dC, g.ldc)
                                  : cublasGemmEx(b.h, g.ta, g.tb, g.m, g.n, g.k, &alpha, dA,
                                                 CUDA_R_32F, g.lda, dB, CUDA_R_32F, g.ldb, &beta,
                                                 dC, CUDA_R_32F, g.ldc, ct, CUBLAS_GEMM_DEFAULT);
    cr_assert_eq(st, CUBLAS_STATUS_SUCCESS, "%s", what);
    std::vector<float> C = from_dev(dC, C0.size());
    check_gemm(g, alpha, beta, A, B, C0, C, rr, what, 1e-6);
    if (rr != REF_EXACT) {
      /* the rounding is really applied: the exact-operand result differs */
      for (int i = 0; i < g.m; i++) {
        double ex = 0;
        for (int l = 0; l < g.k; l++)
          ex += (double)at(A, g.ta, i, l, g.lda) * at(B, g.tb, l, 0, g.ldb);
        ex = alpha * ex + beta * (double)C0[i];
        differs += std::fabs(ex - C[i]) > 1e-5 * std::fabs(ex) + 1e-6;
      }
    }
    cudaFree(dA), cudaFree(dB), cudaFree(dC);
  }
  if (rr != REF_EXACT) cr_assert_gt(differs, 10, "%s: rounded operands change results", what);
}

Test(emu, gemm_ex_f32) {
  gemm_ex_case(REF_EXACT, CUBLAS_COMPUTE_32F, CUBLAS_DEFAULT_MATH, false, "GemmEx 32F");
}
Test(emu, gemm_ex_tf32) {
  gemm_ex_case(REF_TF32, CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_DEFAULT_MATH, false,
               "GemmEx FAST_TF32");
  gemm_ex_case(REF_TF32, CUBLAS_COMPUTE_32F, CUBLAS_TF32_TENSOR_OP_MATH, false,
               "GemmEx 32F in TF32 math mode");
  gemm_ex_case(REF_TF32, CUBLAS_COMPUTE_32F, CUBLAS_TF32_TENSOR_OP_MATH, true,
               "Sgemm in TF32 math mode");
  gemm_ex_case(REF_EXACT, CUBLAS_COMPUTE_32F_PEDANTIC, CUBLAS_TF32_TENSOR_OP_MATH, false,
               "GemmEx PEDANTIC in TF32 math mode");
  gemm_ex_case(REF_EXACT, CUBLAS_COMPUTE_32F, CUBLAS_PEDANTIC_MATH, true, "Sgemm pedantic");
}
Test(emu, gemm_ex_fast_16bf) {
  gemm_ex_case(REF_BF16, CUBLAS_COMPUTE_32F_FAST_16BF, CUBLAS_DEFAULT_MATH, false,
               "GemmEx FAST_16BF");
}

Test(emu, gemm_ex_bf16_inputs) {
  Blas b;
  Lcg rng(4242);
  for (cudaDataType ctype : {CUDA_R_32F, CUDA_R_16BF})
    for (const GemmCase &g : gemm_cases()) {
      int acols = g.ta == CUBLAS_OP_N ? g.k : g.m, bcols = g.tb == CUBLAS_OP_N ? g.n : g.k;
      /* values exactly representable in bf16 */
      std::vector<float> A = rand_vec(rng, (size_t)g.lda * acols),
                         B = rand_vec(rng, (size_t)g.ldb * bcols),
                         C0 = rand_vec(rng, (size_t)g.ldc * g.n);
      for (float &x : A) x = ref_bf16(x);
      for (float &x : B) x = ref_bf16(x);
      for (float &x : C0) x = ref_bf16(x);
      auto pack = [](const std::vector<float> &v) {
        std::vector<uint16_t> h(v.size());
        for (size_t i = 0; i < v.size(); i++) h[i] = weft_f32_to_bf16(v[i]);
        return h;
      };
      std::vector<uint16_t> hA = pack(A), hB = pack(B), hC = pack(C0);
      uint16_t *dA = dev_alloc<uint16_t>(hA.size()), *dB = dev_alloc<uint16_t>(hB.size());
      to_dev(dA, hA), to_dev(dB, hB);
      void *dC;
      if (ctype == CUDA_R_16BF) {
        uint16_t *c = dev_alloc<uint16_t>(hC.size());
        to_dev(c, hC);
        dC = c;
      } else {
        float *c = dev_alloc<float>(C0.size());
        to_dev(c, C0);
        dC = c;
      }
      float alpha = 0.5f, beta = -1.0f;
      cr_assert_eq(cublasGemmEx(b.h, g.ta, g.tb, g.m, g.n, g.k, &alpha, dA, CUDA_R_16BF, g.lda, dB,
                                CUDA_R_16BF, g.ldb, &beta, dC, ctype, g.ldc, CUBLAS_COMPUTE_32F,
                                CUBLAS_GEMM_DEFAULT_TENSOR_OP),
                   CUBLAS_STATUS_SUCCESS);
      std::vector<float> C(C0.size());
      if (ctype == CUDA_R_16BF) {
        std::vector<uint16_t> r = from_dev((uint16_t *)dC, hC.size());
        for (size_t i = 0; i < r.size(); i++) C[i] = weft_bf16_to_f32(r[i]);
      } else {
        C = from_dev((float *)dC, C0.size());
      }
      /* bf16 output: within half a bf16 ulp (2^-9 relative) of the exact */
      check_gemm(g, alpha, beta, A, B, C0, C, REF_EXACT,
                 ctype == CUDA_R_16BF ? "GemmEx bf16 -> bf16" : "GemmEx bf16 -> f32",
                 ctype == CUDA_R_16BF ? 1.0 / 256 : 1e-6);
      cudaFree(dA), cudaFree(dB), cudaFree(dC);
    }
  float one = 1, zero = 0;
  float *d = dev_alloc<float>(64);
  cr_assert_eq(
      cublasGemmEx(b.h, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &one, d, CUDA_R_16BF, 2, d, CUDA_R_16BF,
                   2, &zero, d, CUDA_R_32F, 2, CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT),
      CUBLAS_STATUS_NOT_SUPPORTED);
  cr_assert_eq(
      cublasGemmEx(b.h, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &one, d, CUDA_R_16BF, 2, d, CUDA_R_32F,
                   2, &zero, d, CUDA_R_32F, 2, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
      CUBLAS_STATUS_NOT_SUPPORTED, "A and B types differ");
  cr_assert_eq(
      cublasGemmEx(b.h, CUBLAS_OP_N, CUBLAS_OP_T, 2, 2, 3, &one, d, CUDA_R_32F, 1, d, CUDA_R_32F, 2,
                   &zero, d, CUDA_R_32F, 2, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
      CUBLAS_STATUS_INVALID_VALUE);
  cudaFree(d);
}

Test(emu, gemm_strided_batched_ex_bf16_and_speed) {
  Blas b;
  Lcg rng(8);
  /* batched bf16 -> f32 */
  const int m = 16, n = 12, k = 24, batch = 4;
  std::vector<float> A = rand_vec(rng, (size_t)m * k * batch),
                     B = rand_vec(rng, (size_t)k * n * batch);
  std::vector<uint16_t> hA(A.size()), hB(B.size());
  for (size_t i = 0; i < A.size(); i++)
    hA[i] = weft_f32_to_bf16(A[i]), A[i] = weft_bf16_to_f32(hA[i]);
  for (size_t i = 0; i < B.size(); i++)
    hB[i] = weft_f32_to_bf16(B[i]), B[i] = weft_bf16_to_f32(hB[i]);
  uint16_t *dA = dev_alloc<uint16_t>(hA.size()), *dB = dev_alloc<uint16_t>(hB.size());
  float *dC = dev_alloc<float>((size_t)m * n * batch);
  to_dev(dA, hA), to_dev(dB, hB);
  float one = 1, zero = 0;
  cr_assert_eq(cublasGemmStridedBatchedEx(
                   b.h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, dA, CUDA_R_16BF, k,
                   (long long)m * k, dB, CUDA_R_16BF, k, (long long)k * n, &zero, dC, CUDA_R_32F, m,
                   (long long)m * n, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               CUBLAS_STATUS_SUCCESS);
  std::vector<float> C = from_dev(dC, (size_t)m * n * batch);
  for (int q = 0; q < batch; q++) {
    GemmCase g{CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, k, k, m};
    std::vector<float> Aq(A.begin() + q * m * k, A.begin() + (q + 1) * m * k),
        Bq(B.begin() + q * k * n, B.begin() + (q + 1) * k * n),
        Cq(C.begin() + q * m * n, C.begin() + (q + 1) * m * n), C0(m * n, 0.0f);
    check_gemm(g, 1.0f, 0.0f, Aq, Bq, C0, Cq, REF_EXACT, "strided batched Ex bf16", 1e-6);
  }
  cudaFree(dA), cudaFree(dB), cudaFree(dC);
  /* speed: (64 x 64) x (64 x 512) as in a tiny training step */
  const int M = 64, K = 64, N = 512;
  std::vector<float> X = rand_vec(rng, (size_t)M * K), W = rand_vec(rng, (size_t)K * N);
  float *dX = dev_alloc<float>(X.size()), *dW = dev_alloc<float>(W.size()),
        *dY = dev_alloc<float>((size_t)M * N);
  to_dev(dX, X), to_dev(dW, W);
  auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < 10; r++)
    cr_assert_eq(
        cublasSgemm(b.h, CUBLAS_OP_N, CUBLAS_OP_N, M, N, K, &one, dX, M, dW, K, &zero, dY, M),
        CUBLAS_STATUS_SUCCESS);
  cudaDeviceSynchronize(); /* the GEMMs run here */
  double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / 10;
  fprintf(stderr, "[emu] sgemm 64x512x64: %.2f ms\n", ms);
  cr_assert_lt(ms, 100.0, "sgemm 64x512x64 took %.1f ms", ms);
  cudaFree(dX), cudaFree(dW), cudaFree(dY);
}

/* ------------------------------------------- strict memory, deferred work */

namespace {

__global__ void fill_k(float *x, float v, unsigned n) {
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = v + (float)i;
}

__global__ void twice_k(const float *x, float *y, unsigned n) {
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = 2.0f * x[i];
}

__global__ void add_one_k(float *x, unsigned n) {
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] += 1.0f;
}

__global__ void digit_k(int *x, int d) {
  if (threadIdx.x == 0) *x = *x * 10 + d;
}

__global__ void arg_k(int *out, int i) {
  if (threadIdx.x == 0) out[i] = i;
}

__global__ void tiny_k(float *x) { x[threadIdx.x] += 1.0f; }

/* A little work per thread, so that elapsed times are measurable. */
__global__ void busy_k(float *x, int iters) {
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  float v = x[i];
  for (int r = 0; r < iters; r++) v = v * 0.999f + 0.001f;
  x[i] = v;
}

const unsigned kN = 256;

cudaStream_t nonblocking_stream() {
  cudaStream_t s;
  cr_assert_eq(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  return s;
}

bool all_nan(const std::vector<float> &v) {
  for (float f : v)
    if (!std::isnan(f)) return false;
  return true;
}

/* Both modes on (the default), whatever the environment says. */
void honest_modes() {
  weft_emu_set_strict(1);
  weft_emu_set_defer(1);
}

/* "%p" of p, as the emulator prints addresses */
std::string addr(const void *p) {
  char b[32];
  snprintf(b, sizeof b, "%p", p);
  return b;
}

}  // namespace

Test(emu, strict_host_read_of_device_memory_aborts) {
  honest_modes();
  float *d = dev_alloc<float>(16);
  std::string at = addr(d + 3), base = addr(d);
  expect_abort(
      [d] {
        volatile float *p = d + 3;
        float v = *p; /* host code reading device memory */
        fprintf(stderr, "read %g\n", (double)v);
      },
      {"weft CUDA emulator: host code read device memory at", at.c_str(),
       "inside the 64-byte allocation at", base.c_str(), "outside a kernel launch or a copy",
       "copy it to the host first"});
  /* still closed after device work ran */
  WEFT_LAUNCH(fill_k, 1, 16, 0, 0, d, 1.0f, 16u);
  cr_assert_eq(cudaDeviceSynchronize(), cudaSuccess);
  expect_abort([d] { fprintf(stderr, "%g\n", (double)*(volatile float *)d); },
               {"host code read device memory at"});
  std::vector<float> h = from_dev(d, 16);
  for (unsigned i = 0; i < 16; i++) cr_assert_eq(h[i], 1.0f + (float)i, "copies still work");
  cudaFree(d);
}

Test(emu, strict_host_write_and_freed_memory_abort) {
  honest_modes();
  int *d = dev_alloc<int>(1000);
  std::string at = addr(d + 999);
  expect_abort([d] { *(volatile int *)(d + 999) = 1; },
               {"host code wrote device memory at", at.c_str(), "inside the 4000-byte allocation"});
  cudaFree(d);
  expect_abort([d] { fprintf(stderr, "%d\n", *(volatile int *)d); },
               {"host code read device memory at", "outside every live allocation"});
}

Test(emu, strict_kernel_touching_freed_memory_aborts) {
  honest_modes();
  float *keep = dev_alloc<float>(16), *gone = dev_alloc<float>(16);
  cudaFree(gone);
  expect_abort(
      [gone] {
        WEFT_LAUNCH(fill_k, 1, 16, 0, 0, gone, 1.0f, 16u);
        cudaDeviceSynchronize();
      },
      {"weft CUDA emulator: the kernel launch", "fill_k", "wrote device memory at",
       "outside every live allocation"});
  WEFT_LAUNCH(fill_k, 1, 16, 0, 0, keep, 1.0f, 16u);
  cr_assert_eq(from_dev(keep, 16)[15], 16.0f);
  cudaFree(keep);
}

Test(emu, strict_off_lets_the_host_touch_device_memory) {
  /* before any other call in this process: the environment decides */
  setenv("WEFT_EMU_STRICT", "0", 1);
  float *d = dev_alloc<float>(8);
  d[0] = 5.0f; /* fine without strict mode */
  cr_assert(std::isnan(d[1]), "new memory reads as NaN");
  cr_assert_eq(from_dev(d, 1)[0], 5.0f);
  cr_assert_eq(weft_emu_set_strict(1), 0, "the hook reports the previous setting");
  expect_abort([d] { d[0] = 1.0f; }, {"host code wrote device memory"});
  cr_assert_eq(weft_emu_set_strict(0), 1);
  WEFT_LAUNCH(fill_k, 1, 8, 0, 0, d, 2.0f, 8u);
  cudaDeviceSynchronize();
  cr_assert_eq(d[7], 9.0f);
  cudaFree(d);
  unsetenv("WEFT_EMU_STRICT");
}

Test(emu, missing_event_between_streams_gives_a_stale_result) {
  honest_modes();
  cudaStream_t A = nonblocking_stream(), B = nonblocking_stream();
  float *x = dev_alloc<float>(kN), *y = dev_alloc<float>(kN);
  /* producer on A, consumer on B, nothing orders them: only B is synced */
  WEFT_LAUNCH(fill_k, 2, 128, 0, A, x, 1.0f, kN);
  WEFT_LAUNCH(twice_k, 2, 128, 0, B, (const float *)x, y, kN);
  cr_assert_eq(cudaStreamSynchronize(B), cudaSuccess);
  cr_assert(all_nan(from_dev(y, kN)), "the consumer ran before the producer: stale (NaN) input");
  cr_assert_eq(cudaStreamSynchronize(A), cudaSuccess);
  cr_assert_eq(from_dev(x, kN)[5], 6.0f);

  /* the same through cudaDeviceSynchronize: the consumer still runs first */
  float *x2 = dev_alloc<float>(kN), *y2 = dev_alloc<float>(kN);
  WEFT_LAUNCH(fill_k, 2, 128, 0, A, x2, 1.0f, kN);
  WEFT_LAUNCH(twice_k, 2, 128, 0, B, (const float *)x2, y2, kN);
  cr_assert_eq(cudaDeviceSynchronize(), cudaSuccess);
  cr_assert(all_nan(from_dev(y2, kN)), "no order between the streams: stale every time");

  /* with the event: record on A, wait on B */
  float *x3 = dev_alloc<float>(kN), *y3 = dev_alloc<float>(kN);
  cudaEvent_t e;
  cr_assert_eq(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), cudaSuccess);
  WEFT_LAUNCH(fill_k, 2, 128, 0, A, x3, 1.0f, kN);
  cr_assert_eq(cudaEventRecord(e, A), cudaSuccess);
  cr_assert_eq(cudaStreamWaitEvent(B, e, 0), cudaSuccess);
  WEFT_LAUNCH(twice_k, 2, 128, 0, B, (const float *)x3, y3, kN);
  cr_assert_eq(cudaEventDestroy(e), cudaSuccess, "the queued wait outlives the event");
  cr_assert_eq(cudaStreamSynchronize(B), cudaSuccess);
  std::vector<float> h = from_dev(y3, kN);
  for (unsigned i = 0; i < kN; i++) cr_assert_eq(h[i], 2.0f * (1.0f + (float)i), "y[%u]", i);
  /* a wait on a later record of the producer does not cover work queued after it */
  cr_assert_eq(cudaEventCreate(&e), cudaSuccess);
  cr_assert_eq(cudaEventRecord(e, A), cudaSuccess);
  WEFT_LAUNCH(add_one_k, 2, 128, 0, A, x3, kN);
  cr_assert_eq(cudaStreamWaitEvent(B, e, 0), cudaSuccess);
  WEFT_LAUNCH(twice_k, 2, 128, 0, B, (const float *)x3, y3, kN);
  cr_assert_eq(cudaStreamSynchronize(B), cudaSuccess);
  cr_assert_eq(from_dev(y3, kN)[0], 2.0f, "y from x before the add");
  cudaEventDestroy(e);
  for (float *p : {x, y, x2, y2, x3, y3}) cudaFree(p);
  cudaStreamDestroy(A), cudaStreamDestroy(B);
}

Test(emu, without_deferral_the_missing_event_goes_unnoticed) {
  setenv("WEFT_EMU_DEFER", "0", 1);
  cudaStream_t A = nonblocking_stream(), B = nonblocking_stream();
  float *x = dev_alloc<float>(kN), *y = dev_alloc<float>(kN);
  WEFT_LAUNCH(fill_k, 2, 128, 0, A, x, 1.0f, kN);
  WEFT_LAUNCH(twice_k, 2, 128, 0, B, (const float *)x, y, kN);
  cr_assert_eq(from_dev(y, kN)[3], 8.0f, "every call runs at once: the bug hides");
  cr_assert_eq(weft_emu_set_defer(1), 0);
  WEFT_LAUNCH(fill_k, 2, 128, 0, A, x, 5.0f, kN);
  cr_assert_eq(from_dev(x, kN)[0], 1.0f, "deferred again: A was not synchronized");
  cudaFree(x), cudaFree(y);
  cudaStreamDestroy(A), cudaStreamDestroy(B);
  unsetenv("WEFT_EMU_DEFER");
}

Test(emu, legacy_stream_and_blocking_streams) {
  honest_modes();
  cudaStream_t nb = nonblocking_stream(), bl;
  cr_assert_eq(cudaStreamCreate(&bl), cudaSuccess);
  float *x = dev_alloc<float>(kN), *y = dev_alloc<float>(kN);
  /* a plain cudaMemcpy waits for blocking streams, not for non-blocking ones */
  WEFT_LAUNCH(fill_k, 2, 128, 0, nb, x, 1.0f, kN);
  cr_assert(all_nan(from_dev(x, kN)), "non-blocking stream not synchronized: stale");
  cr_assert_eq(cudaStreamSynchronize(nb), cudaSuccess);
  cr_assert_eq(from_dev(x, kN)[0], 1.0f);
  WEFT_LAUNCH(fill_k, 2, 128, 0, bl, y, 3.0f, kN);
  cr_assert_eq(from_dev(y, kN)[1], 4.0f, "the legacy stream waits for a blocking stream");
  /* and the other way: cudaMemset is queued on the legacy stream */
  cr_assert_eq(cudaMemset(x, 0, kN * sizeof(float)), cudaSuccess);
  WEFT_LAUNCH(add_one_k, 2, 128, 0, bl, x, kN);
  cr_assert_eq(cudaStreamSynchronize(bl), cudaSuccess);
  cr_assert_eq(from_dev(x, kN)[9], 1.0f, "a blocking stream waits for the legacy stream");
  cr_assert_eq(cudaMemset(y, 0, kN * sizeof(float)), cudaSuccess);
  WEFT_LAUNCH(add_one_k, 2, 128, 0, nb, y, kN);
  cr_assert_eq(cudaStreamSynchronize(nb), cudaSuccess);
  /* the add ran on the old y (4 + i), then the legacy memset zeroed it */
  std::vector<float> h = from_dev(y, kN);
  cr_assert_eq(h[9], 0.0f, "the non-blocking stream did not wait for the memset");
  cudaFree(x), cudaFree(y);
  cudaStreamDestroy(nb), cudaStreamDestroy(bl);
}

Test(emu, deferred_work_runs_in_stream_order_at_synchronization) {
  honest_modes();
  cudaStream_t s = nonblocking_stream();
  int *x = dev_alloc<int>(1), *out = dev_alloc<int>(32);
  int *pinned = nullptr;
  cr_assert_eq(cudaMallocHost(&pinned, 2 * sizeof(int)), cudaSuccess);
  pinned[0] = -1;
  cr_assert_eq(cudaMemsetAsync(x, 0, sizeof(int), s), cudaSuccess);
  for (int d = 1; d <= 9; d++) WEFT_LAUNCH(digit_k, 1, 32, 0, s, x, d);
  cr_assert_eq(cudaMemcpyAsync(pinned, x, sizeof(int), cudaMemcpyDeviceToHost, s), cudaSuccess);
  cr_assert_eq(pinned[0], -1, "nothing ran yet");
  cr_assert_eq(cudaStreamSynchronize(s), cudaSuccess);
  cr_assert_eq(pinned[0], 123456789, "the launches ran in order");
  /* arguments are captured at the launch */
  for (int i = 0; i < 32; i++) WEFT_LAUNCH(arg_k, 1, 1, 0, s, out, i);
  cr_assert_eq(cudaStreamSynchronize(s), cudaSuccess);
  std::vector<int> h = from_dev(out, 32);
  for (int i = 0; i < 32; i++) cr_assert_eq(h[i], i);
  /* host sources: pageable memory is staged at the call, pinned is read when the copy runs */
  std::vector<int> page = {10, 20};
  pinned[0] = 30, pinned[1] = 40;
  cr_assert_eq(cudaMemcpyAsync(out, page.data(), 8, cudaMemcpyHostToDevice, s), cudaSuccess);
  cr_assert_eq(cudaMemcpyAsync(out + 2, pinned, 8, cudaMemcpyHostToDevice, s), cudaSuccess);
  page[0] = 11, pinned[0] = 31;
  /* host destinations are written when the copy runs */
  std::vector<int> back(4, -7);
  cr_assert_eq(cudaMemcpyAsync(back.data(), out, 16, cudaMemcpyDeviceToHost, s), cudaSuccess);
  cr_assert_eq(back[0], -7);
  cr_assert_eq(cudaStreamSynchronize(s), cudaSuccess);
  cr_assert(back[0] == 10 && back[1] == 20 && back[2] == 31 && back[3] == 40, "got %d %d %d %d",
            back[0], back[1], back[2], back[3]);
  cudaFreeHost(pinned);
  cudaFree(x), cudaFree(out);
  cudaStreamDestroy(s);
}

Test(emu, a_full_stream_queue_runs) {
  honest_modes();
  cudaStream_t s = nonblocking_stream();
  int *x = dev_alloc<int>(1), *pinned = nullptr;
  cr_assert_eq(cudaMallocHost(&pinned, sizeof(int)), cudaSuccess);
  *pinned = -1;
  cudaMemsetAsync(x, 0, sizeof(int), s);
  cudaMemcpyAsync(pinned, x, sizeof(int), cudaMemcpyDeviceToHost, s);
  /* CUDA blocks the host when a stream's queue is full; the emulator runs it at 65536 */
  int i = 2;
  for (; i < 65535; i++) cudaMemsetAsync(x, i & 0xff, 1, s);
  cr_assert_eq(*pinned, -1, "%d operations queued: nothing ran", i);
  cudaMemsetAsync(x, 1, 1, s);
  cr_assert_eq(*pinned, 0, "the 65536th operation ran the queue");
  cudaFreeHost(pinned);
  cudaFree(x);
  cudaStreamDestroy(s);
}

Test(emu, free_and_destroy_with_pending_work_are_safe) {
  honest_modes();
  cudaStream_t s = nonblocking_stream();
  float *x = dev_alloc<float>(kN), *y = dev_alloc<float>(kN);
  WEFT_LAUNCH(fill_k, 2, 128, 0, s, x, 1.0f, kN);
  WEFT_LAUNCH(twice_k, 2, 128, 0, s, (const float *)x, y, kN);
  cr_assert_eq(cudaFree(x), cudaSuccess, "cudaFree synchronizes the device first");
  cr_assert_eq(from_dev(y, kN)[2], 6.0f, "the pending work ran before the free");
  WEFT_LAUNCH(add_one_k, 2, 128, 0, s, y, kN);
  cr_assert_eq(cudaStreamDestroy(s), cudaSuccess, "returns at once, the work still runs");
  cr_assert_eq(cudaStreamSynchronize(s), cudaErrorInvalidResourceHandle);
  cudaGetLastError();
  cr_assert_eq(cudaDeviceSynchronize(), cudaSuccess);
  cr_assert_eq(from_dev(y, kN)[2], 7.0f);
  cudaFree(y);
}

Test(emu, event_query_and_elapsed_time) {
  honest_modes();
  cudaStream_t s = nonblocking_stream();
  float *x = dev_alloc<float>(64 * 256);
  cudaMemsetAsync(x, 0, 64 * 256 * sizeof(float), s);
  cudaEvent_t e0, e1;
  cr_assert_eq(cudaEventCreate(&e0), cudaSuccess);
  cr_assert_eq(cudaEventCreate(&e1), cudaSuccess);
  cr_assert_eq(cudaEventRecord(e0, s), cudaSuccess);
  WEFT_LAUNCH(busy_k, 64, 256, 0, s, x, 200);
  cr_assert_eq(cudaEventRecord(e1, s), cudaSuccess);
  float ms = -1;
  cr_assert_eq(cudaEventQuery(e1), cudaErrorNotReady, "queued, not run");
  cr_assert_eq(cudaEventElapsedTime(&ms, e0, e1), cudaErrorNotReady);
  cr_assert_eq(cudaGetLastError(), cudaSuccess, "NotReady is not a sticky error");
  auto t0 = std::chrono::steady_clock::now();
  cr_assert_eq(cudaEventSynchronize(e1), cudaSuccess);
  double host_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  cr_assert_eq(cudaEventQuery(e0), cudaSuccess);
  cr_assert_eq(cudaEventQuery(e1), cudaSuccess);
  cr_assert_eq(cudaEventElapsedTime(&ms, e0, e1), cudaSuccess);
  cr_assert(ms > 0.0f && ms <= host_ms + 0.01, "elapsed %g ms, the sync took %g ms", ms, host_ms);
  fprintf(stderr, "[emu] busy_k 64x256: %.3f ms between the events\n", ms);
  /* a poll loop ends: the device catches up */
  WEFT_LAUNCH(busy_k, 1, 32, 0, s, x, 1);
  cr_assert_eq(cudaEventRecord(e1, s), cudaSuccess);
  long polls = 0;
  while (cudaEventQuery(e1) == cudaErrorNotReady) polls++;
  cr_assert(polls > 1000 && polls < 1000000, "%ld polls", polls);
  cr_assert_eq(cudaStreamSynchronize(s), cudaSuccess);
  cudaEventDestroy(e0), cudaEventDestroy(e1);
  cudaFree(x);
  cudaStreamDestroy(s);
}

Test(emu, cublas_gemm_runs_on_the_handle_stream) {
  honest_modes();
  cudaStream_t s = nonblocking_stream();
  cublasHandle_t h;
  cr_assert_eq(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
  cr_assert_eq(cublasSetStream(h, s), CUBLAS_STATUS_SUCCESS);
  std::vector<float> A = {1, 2, 3, 4}, B = {1, 0, 0, 1}, C0 = {9, 9, 9, 9};
  float *dA = dev_alloc<float>(4), *dB = dev_alloc<float>(4), *dC = dev_alloc<float>(4);
  to_dev(dA, A), to_dev(dB, B), to_dev(dC, C0);
  float one = 1, zero = 0;
  cr_assert_eq(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &one, dA, 2, dB, 2, &zero, dC, 2),
               CUBLAS_STATUS_SUCCESS);
  one = 100; /* alpha was read at the call */
  cr_assert(from_dev(dC, 4) == C0, "not synchronized: C is stale");
  cr_assert_eq(cudaStreamSynchronize(s), cudaSuccess);
  cr_assert(from_dev(dC, 4) == A);
  /* device pointer mode: alpha and beta are read when the GEMM runs */
  float *dab = dev_alloc<float>(2);
  to_dev(dab, std::vector<float>{1.0f, 0.0f});
  cr_assert_eq(cublasSetPointerMode(h, CUBLAS_POINTER_MODE_DEVICE), CUBLAS_STATUS_SUCCESS);
  cr_assert_eq(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, dab, dA, 2, dB, 2, dab + 1, dC, 2),
               CUBLAS_STATUS_SUCCESS);
  cr_assert_eq(
      cudaMemcpyAsync(dab, std::vector<float>{3.0f, 0.0f}.data(), 8, cudaMemcpyHostToDevice, 0),
      cudaSuccess);
  cr_assert_eq(cudaStreamSynchronize(s), cudaSuccess);
  /* the legacy stream's copy is not ordered before s's GEMM: alpha is still 1 */
  cr_assert(from_dev(dC, 4) == A);
  cublasDestroy(h);
  cudaFree(dA), cudaFree(dB), cudaFree(dC), cudaFree(dab);
  cudaStreamDestroy(s);
}

/* The cost of the two modes on a launch-heavy loop (printed; the bound is
 * loose: CI machines vary). */
Test(emu, launch_heavy_loop_cost) {
  const int n = 10000;
  float *x = dev_alloc<float>(32);
  cudaMemset(x, 0, 32 * sizeof(float));
  cudaStream_t s = nonblocking_stream();
  double ms[2][2];
  for (int strict = 0; strict < 2; strict++)
    for (int defer = 0; defer < 2; defer++) {
      weft_emu_set_strict(strict);
      weft_emu_set_defer(defer);
      WEFT_LAUNCH(tiny_k, 1, 32, 0, s, x); /* warm */
      cudaStreamSynchronize(s);
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < n; i++) {
        WEFT_LAUNCH(tiny_k, 1, 32, 0, s, x);
        if (i % 100 == 99) cudaStreamSynchronize(s); /* a sync every 100 launches */
      }
      cudaStreamSynchronize(s);
      ms[strict][defer] =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    }
  weft_emu_set_strict(1);
  weft_emu_set_defer(1);
  cr_assert_eq(from_dev(x, 32)[7], 4.0f * (n + 1), "every launch ran");
  fprintf(stderr,
          "[emu] %d launches of 32 threads (sync every 100): %.1f ms plain, %.1f ms deferred, "
          "%.1f ms strict, %.1f ms strict + deferred\n",
          n, ms[0][0], ms[0][1], ms[1][0], ms[1][1]);
  cr_assert_lt(ms[1][1], 10000.0);
  cudaFree(x);
  cudaStreamDestroy(s);
}

/* A kernel given a pointer to ordinary host memory would fault on a GPU
 * (illegal address): the launch aborts naming the kernel and argument;
 * pinned host memory (cudaMallocHost) is mapped and fine. */
Test(emu, strict_launch_with_a_host_pointer_aborts) {
  honest_modes();
  expect_abort(
      [] {
        static int host[4];
        WEFT_LAUNCH(mark_k, 1, 1, 0, 0, host);
        cudaDeviceSynchronize();
      },
      {"weft CUDA emulator: kernel mark_k: argument 1", "neither device memory nor pinned"});
  int *pinned = nullptr;
  cr_assert_eq(cudaMallocHost((void **)&pinned, 4 * sizeof(int)), cudaSuccess);
  pinned[0] = 0;
  WEFT_LAUNCH(mark_k, 1, 1, 0, 0, pinned);
  cr_assert_eq(cudaDeviceSynchronize(), cudaSuccess);
  cr_assert_eq(pinned[0], 7, "pinned host memory is mapped: the kernel wrote it");
  cudaFreeHost(pinned);
}
