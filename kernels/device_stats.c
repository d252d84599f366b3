/* kernels/device_stats.c — the device backend's counters (weft_device_stats,
 * backend.h): kernels/cuda bumps them where it makes the call (WEFT_LAUNCH
 * in cuda_compat.h, the GEMMs of gemm.cu, the runtime's syncs, driver
 * allocations and copies in runtime.cu), the same code in the real and the
 * emulated build. Built in every build, so that a build without the CUDA
 * backend reads zeros. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "backend_internal.h"

static _Atomic int64_t counters[WEFT_DEV_COUNTERS_];

void weft_device_count_(weft_device_counter_ c, int64_t n) {
  atomic_fetch_add_explicit(&counters[c], n, memory_order_relaxed);
}

/* ------------------------------------------------------------ cost model */

/* Datasheet figures (NVIDIA H100 and H200 SXM): dense f32 on CUDA cores,
 * dense tf32 and bf16 on tensor cores, HBM bandwidth. The host link (PCIe
 * Gen5 x16, ~64 GB/s each way, taken at 50), launch_s and sync_s are this
 * model's choices: about what back-to-back small kernels and a host round
 * trip cost on those parts. */
static const weft_gpu_spec specs[] = {
    {"H100 SXM", {67e12, 494.7e12, 989.4e12}, 3.35e12, 50e9, 132, 3e-6, 10e-6},
    {"H200 SXM", {67e12, 494.7e12, 989.4e12}, 4.8e12, 50e9, 132, 3e-6, 10e-6},
};

const weft_gpu_spec *weft_gpu_spec_find(const char *name) {
  if (!name) return NULL;
  if (!strcasecmp(name, "h100")) return &specs[0];
  if (!strcasecmp(name, "h200")) return &specs[1];
  return NULL;
}

static pthread_mutex_t cost_mu = PTHREAD_MUTEX_INITIALIZER;
static weft_kernel_cost costs[WEFT_KERNEL_COSTS_MAX];
static int ncosts;
static const weft_gpu_spec *model;
static _Thread_local struct {
  bool set;
  double flops, bytes;
} hint;

static const char *const blas_names[2][WEFT_ENGINE_COUNT] = {
    {"cublas gemm fp32", "cublas gemm tf32", "cublas gemm bf16"},
    {"cublas gemm fp32 batched", "cublas gemm tf32 batched", "cublas gemm bf16 batched"}};

/* Under cost_mu. The entry of name: found by pointer (one literal per
 * launch site), else by contents (the same kernel from two files). */
static weft_kernel_cost *entry(const char *name, int engine) {
  for (int i = 0; i < ncosts; i++)
    if (costs[i].name == name) return &costs[i];
  for (int i = 0; i < ncosts; i++)
    if (!strcmp(costs[i].name, name)) return &costs[i];
  /* the last slot takes every name past the others (backend.h) */
  if (ncosts == WEFT_KERNEL_COSTS_MAX - 1) name = "(other kernels)";
  if (ncosts == WEFT_KERNEL_COSTS_MAX) return &costs[WEFT_KERNEL_COSTS_MAX - 1];
  weft_kernel_cost *e = &costs[ncosts++];
  memset(e, 0, sizeof *e);
  e->name = name;
  e->engine = engine;
  return e;
}

/* blocks: the launch's thread blocks (0: a whole-GPU call, BLAS or copy) */
static void record(const char *name, int engine, bool costed, double flops, double bytes,
                   bool host_link, double blocks) {
  pthread_mutex_lock(&cost_mu);
  weft_kernel_cost *e = entry(name, engine);
  e->calls++;
  e->uncosted += !costed;
  e->flops += flops;
  e->bytes += bytes;
  if (model) {
    /* a grid of fewer blocks than SMs gets that share of the GPU */
    const double share = blocks > 0 && blocks < model->sms ? blocks / model->sms : 1.0;
    double tc = flops / (model->peak_flops[engine] * share),
           tm = bytes / (host_link ? model->link_bytes_s : model->mem_bytes_s * share);
    e->model_s += (tc > tm ? tc : tm) + model->launch_s;
  }
  pthread_mutex_unlock(&cost_mu);
}

void weft_device_cost_next_(double flops, double bytes) {
  hint.set = true;
  hint.flops = flops;
  hint.bytes = bytes;
}

void weft_device_count_launch_(const char *kernel, double blocks) {
  weft_device_count_(WEFT_DEV_LAUNCHES_, 1);
  record(kernel, WEFT_ENGINE_FP32, hint.set, hint.set ? hint.flops : 0, hint.set ? hint.bytes : 0,
         false, blocks);
  hint.set = false;
}

void weft_device_cost_blas_(int engine, bool batched, double flops, double bytes) {
  weft_device_count_(WEFT_DEV_BLAS_, 1);
  if (engine < 0 || engine >= WEFT_ENGINE_COUNT) engine = WEFT_ENGINE_FP32;
  record(blas_names[batched][engine], engine, true, flops, bytes, false, 0);
}

void weft_device_cost_copy_(const char *what, double bytes, bool host_link) {
  record(what, WEFT_ENGINE_FP32, true, 0, bytes, host_link, 0);
}

void weft_device_cost_model_set(const weft_gpu_spec *spec) {
  pthread_mutex_lock(&cost_mu);
  model = spec;
  pthread_mutex_unlock(&cost_mu);
}

void weft_device_costs_reset(void) {
  pthread_mutex_lock(&cost_mu);
  ncosts = 0;
  pthread_mutex_unlock(&cost_mu);
}

static int by_model_time(const void *pa, const void *pb) {
  const weft_kernel_cost *a = pa, *b = pb;
  if (a->model_s != b->model_s) return a->model_s < b->model_s ? 1 : -1;
  if (a->bytes != b->bytes) return a->bytes < b->bytes ? 1 : -1;
  return strcmp(a->name, b->name);
}

int weft_device_costs_get(weft_kernel_cost *out, int cap) {
  pthread_mutex_lock(&cost_mu);
  weft_kernel_cost all[WEFT_KERNEL_COSTS_MAX];
  int n = ncosts;
  memcpy(all, costs, (size_t)n * sizeof *all);
  pthread_mutex_unlock(&cost_mu);
  qsort(all, (size_t)n, sizeof *all, by_model_time);
  for (int i = 0; i < n && i < cap && out; i++) out[i] = all[i];
  return n;
}

weft_device_stats weft_device_stats_get(void) {
  int64_t v[WEFT_DEV_COUNTERS_];
  for (int i = 0; i < WEFT_DEV_COUNTERS_; i++)
    v[i] = atomic_load_explicit(&counters[i], memory_order_relaxed);
  weft_device_stats s = {v[WEFT_DEV_LAUNCHES_], v[WEFT_DEV_BLAS_],      v[WEFT_DEV_HOST_SYNCS_],
                         v[WEFT_DEV_MALLOCS_],  v[WEFT_DEV_BYTES_H2D_], v[WEFT_DEV_BYTES_D2H_]};
  return s;
}
