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
