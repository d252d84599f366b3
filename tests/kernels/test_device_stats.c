/* The device backend's counters (weft_device_stats_get, backend.h): a known
 * sequence of backend calls moves each counter by what it should, on the
 * emulated device (-Dcuda=emulated) and on a GPU alike (the counting code is
 * the same); CPU work moves none, and a build without the CUDA backend reads
 * zeros. weft-train --profile's "device calls per step" line is pinned for
 * a whole gpt2-demo step by tests/examples. */
#include "backend.h"
#include "kernels_testutil.h"

/* b - a, counter by counter */
static weft_device_stats delta(weft_device_stats a, weft_device_stats b) {
  return (weft_device_stats){b.launches - a.launches,     b.blas - a.blas,
                             b.host_syncs - a.host_syncs, b.mallocs - a.mallocs,
                             b.bytes_h2d - a.bytes_h2d,   b.bytes_d2h - a.bytes_d2h};
}

/* Checks what `what` moved the counters by since *before, then moves *before
 * to now. */
static void expect_moved(weft_device_stats *before, weft_device_stats want, const char *what) {
  const weft_device_stats now = weft_device_stats_get(), d = delta(*before, now);
  cr_expect(d.launches == want.launches && d.blas == want.blas && d.host_syncs == want.host_syncs &&
                d.mallocs == want.mallocs && d.bytes_h2d == want.bytes_h2d &&
                d.bytes_d2h == want.bytes_d2h,
            "%s: moved launches %lld, blas %lld, host syncs %lld, mallocs %lld, bytes h2d %lld, "
            "d2h %lld; want %lld, %lld, %lld, %lld, %lld, %lld",
            what, (long long)d.launches, (long long)d.blas, (long long)d.host_syncs,
            (long long)d.mallocs, (long long)d.bytes_h2d, (long long)d.bytes_d2h,
            (long long)want.launches, (long long)want.blas, (long long)want.host_syncs,
            (long long)want.mallocs, (long long)want.bytes_h2d, (long long)want.bytes_d2h);
  *before = now;
}

Test(device_stats, cpu_work_moves_no_counter_and_a_build_without_cuda_reads_zeros) {
  weft_device_stats s = weft_device_stats_get();
  if (!weft_backend_get(WEFT_CUDA))
    cr_expect(s.launches == 0 && s.blas == 0 && s.host_syncs == 0 && s.mallocs == 0 &&
                  s.bytes_h2d == 0 && s.bytes_d2h == 0,
              "a build without the CUDA backend counted device calls");
  float a[16], b[16], c[16];
  for (int i = 0; i < 16; i++) a[i] = b[i] = (float)i;
  OK(weft_backend_sgemm(WEFT_CPU, false, false, 4, 4, 4, 1.0f, a, 4, b, 4, 0.0f, c, 4));
  OK(weft_backend_residual_forward(WEFT_CPU, c, a, b, 16));
  OK(weft_memcpy(WEFT_CPU, c, a, sizeof a, WEFT_COPY_H2D));
  OK(weft_device_synchronize(WEFT_CPU));
  void *p;
  OK(weft_alloc(WEFT_CPU, (size_t)1 << 20, &p));
  weft_free(p);
  expect_moved(&s, (weft_device_stats){0, 0, 0, 0, 0, 0}, "CPU work");
}

Test(device_stats, each_device_call_moves_its_counter_by_one, .timeout = 60) {
  if (!weft_backend_get(WEFT_CUDA)) cr_skip_test("this build has no CUDA backend");
  if (weft_device_count(WEFT_CUDA) <= 0)
    cr_skip_test(
        "no WEFT_CUDA device visible (backend '%s'): runs on the emulated device "
        "(-Dcuda=emulated) and on GPUs",
        weft_backend_name(WEFT_CUDA));
  OK(weft_device_init(WEFT_CUDA, 0, NULL));
  enum { N = 64 }; /* 8 x 8 matrices */
  const size_t bytes = N * sizeof(float);
  float host[N], back[N];
  for (int i = 0; i < N; i++) host[i] = (float)(i % 7) - 3.0f;
  float *a, *b, *c;
  OK(weft_alloc(WEFT_CUDA, bytes, (void **)&a));
  OK(weft_alloc(WEFT_CUDA, bytes, (void **)&b));
  OK(weft_alloc(WEFT_CUDA, bytes, (void **)&c));
  weft_device_stats s = weft_device_stats_get();

  /* a blocking copy each way: the bytes, and one wait each */
  OK(weft_memcpy(WEFT_CUDA, a, host, bytes, WEFT_COPY_H2D));
  expect_moved(&s, (weft_device_stats){0, 0, 1, 0, (int64_t)bytes, 0}, "weft_memcpy H2D");
  OK(weft_memcpy(WEFT_CUDA, b, host, bytes, WEFT_COPY_H2D));
  s = weft_device_stats_get();
  /* one GEMM: one cuBLAS call, no kernel of weft's own */
  OK(weft_backend_sgemm(WEFT_CUDA, false, true, 8, 8, 8, 1.0f, a, 8, b, 8, 0.0f, c, 8));
  expect_moved(&s, (weft_device_stats){0, 1, 0, 0, 0, 0}, "one sgemm");
  /* one elementwise kernel */
  OK(weft_backend_residual_forward(WEFT_CUDA, c, c, a, N));
  expect_moved(&s, (weft_device_stats){1, 0, 0, 0, 0, 0}, "residual_forward");
  OK(weft_memcpy(WEFT_CUDA, back, c, bytes / 2, WEFT_COPY_D2H));
  expect_moved(&s, (weft_device_stats){0, 0, 1, 0, 0, (int64_t)bytes / 2}, "weft_memcpy D2H");
  /* device-to-device and async copies: no host<->device bytes, no wait */
  OK(weft_memcpy_async(WEFT_CUDA, b, a, bytes, WEFT_COPY_D2D, WEFT_STREAM_COMPUTE));
  expect_moved(&s, (weft_device_stats){0, 0, 0, 0, 0, 0}, "an async D2D copy");
  /* waits: a device synchronize (one, whatever the number of streams) and
   * an event wait on the host */
  OK(weft_device_synchronize(WEFT_CUDA));
  expect_moved(&s, (weft_device_stats){0, 0, 1, 0, 0, 0}, "weft_device_synchronize");
  weft_event *ev;
  OK(weft_event_record(WEFT_CUDA, WEFT_STREAM_COMPUTE, &ev));
  bool done;
  OK(weft_event_query(WEFT_CUDA, ev, &done)); /* a query does not wait */
  OK(weft_event_synchronize(WEFT_CUDA, ev));
  weft_event_destroy(WEFT_CUDA, ev);
  expect_moved(&s, (weft_device_stats){0, 0, 1, 0, 0, 0}, "event record, query, synchronize");

  /* a block larger than anything cached reaches the driver once; freed, it
   * waits in the cache and serves the same request again */
  const size_t big = ((size_t)48 << 20) + 4096;
  void *p;
  OK(weft_alloc(WEFT_CUDA, big, &p));
  expect_moved(&s, (weft_device_stats){0, 0, 0, 1, 0, 0}, "a fresh 48 MiB allocation");
  weft_free(p);
  OK(weft_alloc(WEFT_CUDA, big, &p));
  weft_free(p);
  expect_moved(&s, (weft_device_stats){0, 0, 0, 0, 0, 0}, "the same allocation from the cache");

  /* pinned host memory: cudaMallocHost is a driver allocation; an async
   * copy from it counts its bytes without a wait; cudaFreeHost waits */
  float *pinned;
  OK(weft_alloc_pinned(WEFT_CUDA, bytes, (void **)&pinned));
  expect_moved(&s, (weft_device_stats){0, 0, 0, 1, 0, 0}, "weft_alloc_pinned");
  memcpy(pinned, host, bytes);
  OK(weft_memcpy_async(WEFT_CUDA, a, pinned, bytes, WEFT_COPY_H2D, WEFT_STREAM_COMPUTE));
  expect_moved(&s, (weft_device_stats){0, 0, 0, 0, (int64_t)bytes, 0}, "an async H2D copy");
  weft_free_pinned(WEFT_CUDA, pinned);
  expect_moved(&s, (weft_device_stats){0, 0, 1, 0, 0, 0}, "weft_free_pinned");

  /* the GEMM and the kernel ran: c = a b^T + a */
  for (int i = 0; i < 4; i++) /* the rows copied back */
    for (int j = 0; j < 8; j++) {
      double want = host[i * 8 + j];
      for (int k = 0; k < 8; k++) want += (double)host[i * 8 + k] * host[j * 8 + k];
      cr_expect_float_eq(back[i * 8 + j], (float)want, 1e-4, "c[%d][%d]", i, j);
    }
  weft_free(a), weft_free(b), weft_free(c);
}

/* The record of `name` among the cost records (NULL when none). */
static const weft_kernel_cost *find_cost(const weft_kernel_cost *all, int n, const char *name) {
  for (int i = 0; i < n; i++)
    if (!strcmp(all[i].name, name)) return &all[i];
  return NULL;
}

/* The roofline model (weft_kernel_cost, backend.h): a GEMM, an elementwise
 * kernel, a memset and a copy record the FLOPs and bytes of their formulas,
 * and each call's modeled time is max(FLOPs / peak, bytes / bandwidth) on
 * its share of the SMs plus the launch cost, under the spec set; reset
 * forgets, and no spec leaves the time at 0. */
Test(device_stats, cost_model_records_flops_bytes_and_roofline_time, .timeout = 60) {
  cr_expect_null(weft_gpu_spec_find("a100"));
  cr_expect_null(weft_gpu_spec_find(NULL));
  const weft_gpu_spec *h100 = weft_gpu_spec_find("H100"), *h200 = weft_gpu_spec_find("h200");
  cr_assert(h100 && h200);
  cr_expect(h200->mem_bytes_s > h100->mem_bytes_s, "H200's HBM is faster");
  if (!weft_backend_get(WEFT_CUDA)) cr_skip_test("this build has no CUDA backend");
  if (weft_device_count(WEFT_CUDA) <= 0)
    cr_skip_test("no WEFT_CUDA device visible (backend '%s'): runs on the emulated device",
                 weft_backend_name(WEFT_CUDA));
  OK(weft_device_init(WEFT_CUDA, 0, NULL));
  enum { M = 96, K = 64, NN = 80, E = 1 << 20 };
  float *a, *b, *c, *x;
  OK(weft_alloc(WEFT_CUDA, (size_t)M * K * 4, (void **)&a));
  OK(weft_alloc(WEFT_CUDA, (size_t)K * NN * 4, (void **)&b));
  OK(weft_alloc(WEFT_CUDA, (size_t)M * NN * 4, (void **)&c));
  OK(weft_alloc(WEFT_CUDA, (size_t)E * 4, (void **)&x));
  OK(weft_memset(WEFT_CUDA, a, 0, (size_t)M * K * 4));
  OK(weft_memset(WEFT_CUDA, b, 0, (size_t)K * NN * 4));
  OK(weft_memset(WEFT_CUDA, x, 0, (size_t)E * 4));
  OK(weft_device_synchronize(WEFT_CUDA));

  weft_device_cost_model_set(h100);
  weft_device_costs_reset();
  cr_expect_eq(weft_device_costs_get(NULL, 0), 0, "reset forgets every record");
  OK(weft_backend_sgemm(WEFT_CUDA, false, false, M, NN, K, 1.0f, a, K, b, NN, 0.0f, c, NN));
  OK(weft_backend_sgemm(WEFT_CUDA, false, false, M, NN, K, 1.0f, a, K, b, NN, 1.0f, c, NN));
  OK(weft_backend_residual_forward(WEFT_CUDA, x, x, x, E));
  OK(weft_memset(WEFT_CUDA, c, 0, 4096));
  OK(weft_device_synchronize(WEFT_CUDA));
  weft_kernel_cost all[64];
  const int n = weft_device_costs_get(all, 64);
  cr_assert_geq(n, 3);
  for (int i = 1; i < n && i < 64; i++)
    cr_expect_geq(all[i - 1].model_s, all[i].model_s, "sorted by modeled time");

  /* the GEMMs: 2mnk each; A, B read, C written (and read when beta != 0) */
  const weft_kernel_cost *g = find_cost(all, n, "cublas gemm fp32");
  cr_assert(g, "no record of the two GEMMs");
  const double fl = 2.0 * M * NN * K, by0 = 4.0 * (M * K + K * NN) + 4.0 * M * NN,
               by1 = by0 + 4.0 * M * NN;
  cr_expect_eq(g->calls, 2);
  cr_expect_eq(g->uncosted, 0);
  cr_expect_eq(g->engine, WEFT_ENGINE_FP32, "default matmul precision: CUDA cores");
  cr_expect_float_eq(g->flops, 2 * fl, 1e-9);
  cr_expect_float_eq(g->bytes, by0 + by1, 1e-9);
  const double t0 = fmax(fl / h100->peak_flops[WEFT_ENGINE_FP32], by0 / h100->mem_bytes_s),
               t1 = fmax(fl / h100->peak_flops[WEFT_ENGINE_FP32], by1 / h100->mem_bytes_s);
  cr_expect_float_eq(g->model_s, t0 + t1 + 2 * h100->launch_s, 1e-15, "GEMM time %g, want %g",
                     g->model_s, t0 + t1 + 2 * h100->launch_s);

  /* the residual add: one kernel, 3 x 4 bytes per element; a grid of at
   * least as many blocks as SMs gets the whole bandwidth */
  const weft_kernel_cost *r = NULL;
  for (int i = 0; i < n; i++)
    if (strstr(all[i].name, "add_kernel")) r = &all[i];
  cr_assert(r, "no record of the residual add");
  cr_expect_eq(r->calls, 1);
  cr_expect_eq(r->uncosted, 0);
  cr_expect_float_eq(r->bytes, 12.0 * E, 1e-9);
  cr_expect_float_eq(r->model_s, 12.0 * E / h100->mem_bytes_s + h100->launch_s, 1e-15);

  const weft_kernel_cost *ms = find_cost(all, n, "cudaMemsetAsync");
  cr_assert(ms);
  cr_expect_eq(ms->calls, 1);
  cr_expect_float_eq(ms->bytes, 4096.0, 1e-9);

  /* no spec: counted, not timed */
  weft_device_cost_model_set(NULL);
  weft_device_costs_reset();
  OK(weft_backend_residual_forward(WEFT_CUDA, x, x, x, E));
  cr_assert_eq(weft_device_costs_get(all, 64), 1);
  cr_expect_eq(all[0].calls, 1);
  cr_expect_eq(all[0].model_s, 0.0);
  weft_free(a);
  weft_free(b);
  weft_free(c);
  weft_free(x);
}
