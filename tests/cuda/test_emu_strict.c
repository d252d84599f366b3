/* tests/cuda/test_emu_strict.c — the emulated WEFT_CUDA device's honest
 * modes (kernels/cuda/emu/cuda_emu.h), through weft's public API
 * (-Dcuda=emulated builds only, where WEFT_CUDA is the emulator):
 *
 * - strict memory: host code reading a device tensor's data aborts with the
 *   emulator's message (checked in a child process), and works with strict
 *   mode off;
 * - deferred work: a kernel on the compute stream and a copy on the
 *   communication stream without an event between them give a stale result,
 *   deterministically; with weft_event_record + weft_stream_wait_event the
 *   right one; queued work runs in stream order at synchronization; freeing
 *   with work pending is safe; elapsed times need synchronized events.
 *
 * The modes are set explicitly (weft_emu_set_strict / _defer, the
 * emulator's C test hooks), whatever WEFT_EMU_STRICT / WEFT_EMU_DEFER say. */
#include <criterion/criterion.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backend.h"
#include "harness.h"
#include "kernels.h"

/* the emulator's test hooks (cuda_emu.h, C linkage); return the previous setting */
int weft_emu_set_strict(int on);
int weft_emu_set_defer(int on);

enum { N = 1024 };

static void setup(void) {
  weft_emu_set_strict(1);
  weft_emu_set_defer(1);
  OK(weft_device_init(WEFT_CUDA, 0, NULL));
}

static weft_tensor *dev_vec(double fill) {
  int64_t shape[1] = {N};
  weft_tensor *t = NULL;
  OK(weft_tensor_create(WEFT_F32, WEFT_CUDA, 1, shape, &t));
  OK(weft_tensor_fill(t, fill));
  return t;
}

/* The whole of t, copied to the host (waits for the compute stream). */
static float *host_copy(const weft_tensor *t) {
  float *h = malloc(N * sizeof *h);
  cr_assert(h);
  OK(weft_memcpy(WEFT_CUDA, h, t->data, N * sizeof *h, WEFT_COPY_D2H));
  return h;
}

static void assert_all(const float *h, float want, const char *what) {
  for (int i = 0; i < N; i++)
    cr_assert_eq(h[i], want, "%s: [%d] = %g, want %g", what, i, (double)h[i], (double)want);
}

/* Runs f(arg) in a child with stderr captured (harness.h); true if it died
 * of SIGABRT and stderr holds needle. */
static bool child_aborts_with(void (*f)(void *), void *arg, const char *needle, char *err,
                              size_t cap) {
  int st = weft_test_capture_stderr(f, arg, err, cap);
  cr_assert(st != -1, "cannot start a child process");
  return weft_test_died_of_abort(st) && strstr(err, needle) != NULL;
}

static void read_device_data(void *arg) {
  const weft_tensor *t = arg;
  volatile const float *p = (volatile const float *)t->data;
  fprintf(stderr, "read %g\n", (double)p[3]); /* host code reading device memory */
}

TestSuite(emu_strict, .timeout = 120);

Test(emu_strict, host_read_of_a_device_tensor_aborts) {
  setup();
  weft_tensor *t = dev_vec(1.5);
  OK(weft_device_synchronize(WEFT_CUDA));
  char err[4096];
  cr_assert(
      child_aborts_with(read_device_data, t, "host code read device memory at", err, sizeof err),
      "stderr: %s", err);
  cr_assert(strstr(err, "outside a kernel launch or a copy: copy it to the host first"), "%s", err);
  cr_assert(strstr(err, "-byte allocation at"), "%s", err);
  /* the right way: a copy */
  int64_t i3 = 3;
  cr_assert_eq(weft_tensor_get(t, &i3), 1.5);
  /* strict off: the same read works */
  cr_assert_eq(weft_emu_set_strict(0), 1);
  cr_assert_eq(((const float *)t->data)[3], 1.5f);
  cr_assert_eq(weft_emu_set_strict(1), 0);
  weft_tensor_destroy(t);
  weft_device_shutdown(WEFT_CUDA);
}

/* x = 1 (synchronized); then x = 3 on the compute stream and y <- x on the
 * communication stream; the communication stream synchronized, y read. */
static float comm_copy_result(bool with_event) {
  weft_tensor *x = dev_vec(1.0), *y = dev_vec(-1.0);
  OK(weft_device_synchronize(WEFT_CUDA));
  OK(weft_tensor_fill(x, 3.0)); /* producer: a kernel on the compute stream */
  if (with_event) {
    weft_event *ev = NULL;
    OK(weft_event_record(WEFT_CUDA, WEFT_STREAM_COMPUTE, &ev));
    OK(weft_stream_wait_event(WEFT_CUDA, WEFT_STREAM_COMM, ev));
    weft_event_destroy(WEFT_CUDA, ev);
  }
  /* consumer: a copy on the communication stream */
  OK(weft_memcpy_async(WEFT_CUDA, y->data, x->data, N * sizeof(float), WEFT_COPY_D2D,
                       WEFT_STREAM_COMM));
  weft_event *done = NULL;
  OK(weft_event_record(WEFT_CUDA, WEFT_STREAM_COMM, &done));
  OK(weft_event_synchronize(WEFT_CUDA, done));
  weft_event_destroy(WEFT_CUDA, done);
  float *h = host_copy(y); /* also runs the compute stream, too late for y */
  float v = h[0];
  for (int i = 1; i < N; i++) cr_assert_eq(h[i], v, "y is uniform");
  free(h);
  float *hx = host_copy(x);
  assert_all(hx, 3.0f, "x after the compute stream ran");
  free(hx);
  weft_tensor_destroy(x);
  weft_tensor_destroy(y);
  return v;
}

Test(emu_strict, missing_event_between_compute_and_comm_gives_a_stale_result) {
  setup();
  cr_assert_eq(comm_copy_result(false), 1.0f,
               "without the event the copy ran before the kernel: stale x, every time");
  cr_assert_eq(comm_copy_result(false), 1.0f, "deterministic");
  cr_assert_eq(comm_copy_result(true), 3.0f, "with the event: the kernel's x");
  weft_device_shutdown(WEFT_CUDA);
}

Test(emu_strict, queued_work_runs_in_stream_order_when_synchronized) {
  setup();
  weft_tensor *x = dev_vec(1.0);
  OK(weft_scale(x, 3.0));   /* 3 */
  OK(weft_axpy(x, 2.0, x)); /* 3 + 6 = 9 */
  OK(weft_scale(x, 0.5));   /* 4.5 */
  weft_event *ev = NULL;
  OK(weft_event_record(WEFT_CUDA, WEFT_STREAM_COMPUTE, &ev));
  bool done = true;
  OK(weft_event_query(WEFT_CUDA, ev, &done));
  cr_assert(!done, "deferred: nothing ran before a synchronization");
  OK(weft_event_synchronize(WEFT_CUDA, ev));
  OK(weft_event_query(WEFT_CUDA, ev, &done));
  cr_assert(done);
  weft_event_destroy(WEFT_CUDA, ev);
  float *h = host_copy(x);
  assert_all(h, 4.5f, "fill, scale, axpy, scale in order");
  free(h);
  weft_tensor_destroy(x);
  weft_device_shutdown(WEFT_CUDA);
}

Test(emu_strict, freeing_with_pending_work_is_safe) {
  setup();
  weft_tensor *x = dev_vec(2.0), *y = dev_vec(0.0);
  OK(weft_add(y, x, x));
  weft_tensor_destroy(x);                 /* back to the cache while the add is queued */
  weft_tensor *z = dev_vec(7.0);          /* may reuse x's block, after the add in stream order */
  OK(weft_device_empty_cache(WEFT_CUDA)); /* cudaFree: the device synchronizes first */
  float *h = host_copy(y);
  assert_all(h, 4.0f, "y = x + x");
  free(h);
  h = host_copy(z);
  assert_all(h, 7.0f, "z");
  free(h);
  weft_tensor_destroy(y);
  weft_tensor_destroy(z);
  weft_device_shutdown(WEFT_CUDA); /* with nothing pending */
}

Test(emu_strict, elapsed_time_needs_synchronized_events) {
  setup();
  weft_tensor *x = dev_vec(0.0);
  weft_event *e0 = NULL, *e1 = NULL;
  OK(weft_event_record(WEFT_CUDA, WEFT_STREAM_COMPUTE, &e0));
  for (int r = 0; r < 20; r++) OK(weft_scale(x, 1.5));
  OK(weft_event_record(WEFT_CUDA, WEFT_STREAM_COMPUTE, &e1));
  float ms = -1;
  cr_assert_neq(weft_event_elapsed_ms(WEFT_CUDA, e0, e1, &ms), WEFT_OK,
                "the records have not run yet");
  OK(weft_event_synchronize(WEFT_CUDA, e1));
  OK(weft_event_elapsed_ms(WEFT_CUDA, e0, e1, &ms));
  cr_assert(ms >= 0.0f && ms < 10000.0f, "%g ms", (double)ms);
  weft_event_destroy(WEFT_CUDA, e0);
  weft_event_destroy(WEFT_CUDA, e1);
  weft_tensor_destroy(x);
  weft_device_shutdown(WEFT_CUDA);
}
