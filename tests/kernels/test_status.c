/* tests/kernels/test_status.c — the thread-local error message (status.h):
 * the head names the public function the caller called (the outermost
 * weft_* function a failure passed through), "at" where it was raised, the
 * trail every function on the way out; internal names (weft__x, x_) never
 * become the head; an error that wraps weft_last_error() reads it intact;
 * a long trail is cut, never overflows. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "status.h"

static weft_status raise_inner(void) {
  return weft_error_at(WEFT_ERR_INVALID, "check_args", "bad %d", 7);
}

Test(status, head_is_the_outermost_public_function_origin_and_trail_follow) {
  weft_error_set_rank(-1);
  weft_status st = raise_inner();
  cr_assert_str_eq(weft_last_error(), "check_args: bad 7");
  st = weft_error_trace(st, "helper");
  cr_assert_str_eq(weft_last_error(), "check_args: bad 7\n  in helper");
  st = weft_error_trace(st, "weft_mesh_create_from_comm");
  cr_assert_str_eq(weft_last_error(),
                   "weft_mesh_create_from_comm: bad 7\n  at check_args\n  in helper\n"
                   "  in weft_mesh_create_from_comm");
  st = weft_error_trace(st, "weft_mesh_create");
  cr_assert_str_eq(weft_last_error(),
                   "weft_mesh_create: bad 7\n  at check_args\n  in helper\n"
                   "  in weft_mesh_create_from_comm\n  in weft_mesh_create");
  cr_assert_eq(st, WEFT_ERR_INVALID);
  cr_assert_eq(weft_last_status(), WEFT_ERR_INVALID);
  weft_clear_error();
  cr_assert_str_eq(weft_last_error(), "");
  cr_assert_eq(weft_last_status(), WEFT_OK);
}

Test(status, internal_names_never_head_the_message) {
  weft_error_set_rank(3);
  weft_status st = weft_error_at(WEFT_ERR_MPI, "weft_all_reduce", "lost");
  st = weft_error_trace(st, "weft__coll_start");
  st = weft_error_trace(st, "weft_cpu_gemm_");
  st = weft_error_trace(st, "run_hooks");
  cr_assert_str_eq(weft_last_error(),
                   "[rank 3] weft_all_reduce: lost\n  in weft__coll_start\n  in weft_cpu_gemm_\n"
                   "  in run_hooks");
  weft_error_set_rank(-1);
  weft_clear_error();
}

Test(status, wrapping_the_last_error_reads_it_intact) {
  weft_error_set_rank(-1);
  weft_error_at(WEFT_ERR_IO, "read_file", "short read of '%s'", "x.bin");
  weft_error_trace(WEFT_ERR_IO, "weft_dcp_load");
  weft_status st =
      weft_error_at(WEFT_ERR_IO, "weft_dcp_agree", "load failed on rank 1: %s", weft_last_error());
  cr_assert_eq(st, WEFT_ERR_IO);
  cr_assert_str_eq(weft_last_error(),
                   "weft_dcp_agree: load failed on rank 1: weft_dcp_load: short read of 'x.bin'\n"
                   "  at read_file\n  in weft_dcp_load");
  weft_clear_error();
}

Test(status, trace_without_a_message_still_says_something) {
  weft_clear_error();
  weft_status st = weft_error_trace(WEFT_ERR_TIMEOUT, "weft_wait_requests");
  cr_assert_eq(st, WEFT_ERR_TIMEOUT);
  cr_assert_str_eq(weft_last_error(), "weft_wait_requests: timed out");
  weft_clear_error();
}

Test(status, a_long_trail_is_cut_not_overflowed) {
  weft_error_set_rank(-1);
  char big[4000];
  memset(big, 'x', sizeof big - 1);
  big[sizeof big - 1] = '\0';
  weft_status st = weft_error_at(WEFT_ERR_INVALID, "origin_fn", "%s", big);
  for (int i = 0; i < 1000; i++) st = weft_error_trace(st, i % 2 ? "weft_public_fn" : "inner_fn");
  size_t n = strlen(weft_last_error());
  cr_assert(n > 0 && n < 2048, "length %zu", n);
  cr_assert(strncmp(weft_last_error(), "weft_public_fn: xxx", 19) == 0, "%.40s", weft_last_error());
  weft_clear_error();
}
