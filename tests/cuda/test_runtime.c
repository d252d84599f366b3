/* The WEFT_CUDA device through the public API (backend.h, cuda.h): what a
 * program sees without a GPU or without the backend (clear errors, no
 * crash) and, with a device (a GPU, or the emulated one of -Dcuda=emulated
 * builds), device memory, accounting, the cache, copies and events. */
#include <criterion/criterion.h>
#include <string.h>

#include "backend.h"
#include "cuda.h"
#include "weft_config.h"

static bool have_gpu(void) { return weft_cuda_device_count() > 0; }

Test(cuda_runtime, without_a_gpu_every_entry_fails_clearly) {
  if (have_gpu()) cr_skip_test("a GPU is visible: the no-GPU paths do not apply");
  cr_assert_eq(weft_cuda_current_device(), -1);
  int dev = 7;
  weft_status st = weft_cuda_init(0, &dev);
  weft_status want = WEFT_HAVE_CUDA ? WEFT_ERR_NO_DEVICE : WEFT_ERR_UNSUPPORTED;
  cr_assert_eq(st, want, "%s", weft_last_error());
  cr_assert(strstr(weft_last_error(),
                   WEFT_HAVE_CUDA ? "no CUDA device" : "no backend for device cuda") != NULL,
            "%s", weft_last_error());
  cr_assert_eq(weft_backend_get(WEFT_CUDA) != NULL, WEFT_HAVE_CUDA != 0,
               "a CPU-only build registers no CUDA table");
  void *p = (void *)1;
  cr_assert_eq(weft_alloc(WEFT_CUDA, 1024, &p), want, "%s", weft_last_error());
  cr_assert_null(p);
  weft_tensor *t = NULL;
  int64_t shape[1] = {4};
  cr_assert_neq(weft_tensor_create(WEFT_F32, WEFT_CUDA, 1, shape, &t), WEFT_OK);
  cr_assert_null(t);
  float host[4] = {1, 2, 3, 4};
  cr_assert_eq(weft_memcpy(WEFT_CUDA, host, host, sizeof host, WEFT_COPY_H2D), want, "%s",
               weft_last_error());
  cr_assert_eq(weft_device_synchronize(WEFT_CUDA), want, "%s", weft_last_error());
  cr_assert_eq(weft_ptr_device(host), WEFT_CPU);
  cr_assert_null(weft_device_stream_handle(WEFT_CUDA, WEFT_STREAM_COMPUTE));
  weft_event *ev = NULL;
  cr_assert_eq(weft_event_record(WEFT_CUDA, WEFT_STREAM_COMPUTE, &ev), want, "%s",
               weft_last_error());
  cr_assert_null(ev);
  weft_cuda_cache_stats cs = weft_cuda_cache_get();
  cr_assert_eq(cs.reserved_bytes, 0);
  cr_assert_eq(weft_mem_get(WEFT_CUDA).current_bytes, 0);
  weft_cuda_shutdown(); /* no-op, must not crash */
  weft_free(NULL);
}

Test(cuda_runtime, kernels_refuse_without_init) {
  if (have_gpu()) cr_skip_test("a GPU is visible");
  float x[8];
  weft_status st = weft_backend_rmsnorm_forward(WEFT_CUDA, x, x, x, x, 2, 4, 1e-5f);
  cr_assert_neq(st, WEFT_OK);
  cr_assert(st == WEFT_ERR_NO_DEVICE || st == WEFT_ERR_UNSUPPORTED, "%s", weft_last_error());
  cr_assert(strstr(weft_last_error(), "rmsnorm_forward") != NULL, "names the op: %s",
            weft_last_error());
}

Test(cuda_runtime, a_cuda_tensor_without_a_backend_names_op_device_and_tensor) {
  if (WEFT_HAVE_CUDA) cr_skip_test("this build has a CUDA backend");
  float host[4] = {1, 2, 3, 4};
  weft_tensor t;
  int64_t shape[1] = {4};
  cr_assert_eq(weft_tensor_view_init(&t, host, WEFT_F32, WEFT_CUDA, 1, shape, NULL), WEFT_OK);
  cr_assert_eq(weft_add(&t, &t, &t), WEFT_ERR_UNSUPPORTED);
  const char *e = weft_last_error();
  cr_assert(strstr(e, "weft_add") && strstr(e, "cuda") && strstr(e, "f32[4]"), "%s", e);
}

Test(cuda_runtime, init_rejects_a_negative_local_rank) {
  if (!WEFT_HAVE_CUDA) cr_skip_test("CPU-only build");
  cr_assert_eq(weft_cuda_init(-1, NULL), WEFT_ERR_INVALID);
}

/* ------------------------------------------------------ on a GPU only */

Test(cuda_runtime, device_memory_accounting_and_cache) {
  if (!have_gpu()) cr_skip_test("no GPU: %d CUDA devices visible", weft_cuda_device_count());
  int dev = -1;
  cr_assert_eq(weft_cuda_init(0, &dev), WEFT_OK, "%s", weft_last_error());
  cr_assert_eq(dev, 0);
  cr_assert_eq(weft_cuda_init(0, NULL), WEFT_OK, "idempotent");
  weft_mem_stats m0 = weft_mem_get(WEFT_CUDA);
  void *p;
  cr_assert_eq(weft_alloc(WEFT_CUDA, 3000, &p), WEFT_OK, "%s", weft_last_error());
  cr_assert_eq(weft_ptr_device(p), WEFT_CUDA);
  cr_assert_eq(weft_ptr_device((char *)p + 2999), WEFT_CUDA, "interior pointer");
  cr_assert_eq(weft_mem_get(WEFT_CUDA).current_bytes, m0.current_bytes + 3000);
  weft_free(p);
  cr_assert_eq(weft_mem_get(WEFT_CUDA).current_bytes, m0.current_bytes);
  weft_cuda_cache_stats s = weft_cuda_cache_get();
  cr_assert_geq(s.cached_bytes, 3072);
  void *q;
  cr_assert_eq(weft_alloc(WEFT_CUDA, 3000, &q), WEFT_OK);
  cr_assert_eq(q, p, "same class, same stream: reused");
  cr_assert_eq(weft_cuda_cache_get().hits, s.hits + 1);
  weft_free(q);
  cr_assert_eq(weft_cuda_empty_cache(), WEFT_OK);
  cr_assert_eq(weft_cuda_cache_get().cached_bytes, 0);
}

Test(cuda_runtime, copies_events_and_tensors) {
  if (!have_gpu()) cr_skip_test("no GPU: %d CUDA devices visible", weft_cuda_device_count());
  cr_assert_eq(weft_cuda_init(0, NULL), WEFT_OK, "%s", weft_last_error());
  int64_t shape[2] = {3, 5};
  weft_tensor *h, *d, *back;
  cr_assert_eq(weft_tensor_create(WEFT_F32, WEFT_CPU, 2, shape, &h), WEFT_OK);
  cr_assert_eq(weft_tensor_fill_normal(h, 3, weft_rng_key("x"), NULL, 0.f, 1.f), WEFT_OK);
  weft_event *e0, *e1;
  cr_assert_eq(weft_event_record(WEFT_CUDA, WEFT_STREAM_COMPUTE, &e0), WEFT_OK);
  cr_assert_eq(weft_tensor_to(h, WEFT_CUDA, &d), WEFT_OK, "%s", weft_last_error());
  cr_assert_eq(d->device, WEFT_CUDA);
  cr_assert_eq(weft_tensor_to(d, WEFT_CPU, &back), WEFT_OK, "%s", weft_last_error());
  cr_assert_eq(weft_event_record(WEFT_CUDA, WEFT_STREAM_COMPUTE, &e1), WEFT_OK);
  cr_assert_eq(weft_event_synchronize(WEFT_CUDA, e1), WEFT_OK);
  float ms = -1;
  cr_assert_eq(weft_event_elapsed_ms(WEFT_CUDA, e0, e1, &ms), WEFT_OK);
  cr_assert_geq(ms, 0.f);
  cr_assert(weft_tensor_equal(h, back), "H2D then D2H returns the same bytes");
  /* a zeroed device tensor via memset */
  cr_assert_eq(weft_memset(WEFT_CUDA, d->data, 0, weft_tensor_nbytes(d)), WEFT_OK);
  weft_tensor_destroy(back);
  cr_assert_eq(weft_tensor_to(d, WEFT_CPU, &back), WEFT_OK);
  cr_assert_eq(weft_tensor_get(back, (int64_t[]){2, 4}), 0.0);
  cr_assert_eq(weft_tensor_get(d, (int64_t[]){2, 4}), 0.0, "one element read from the device");
  weft_event_destroy(WEFT_CUDA, e0);
  weft_event_destroy(WEFT_CUDA, e1);
  weft_tensor_destroy(back);
  weft_tensor_destroy(d);
  weft_tensor_destroy(h);
  cr_assert_eq(weft_cuda_synchronize(), WEFT_OK);
}
