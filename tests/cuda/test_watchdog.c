/* tests/cuda/test_watchdog.c — the watchdog of device collectives
 * (mesh/watchdog.h), driven by fake completion events: NCCL's glue
 * (cudaEventQuery, ncclCommAbort) needs a GPU, the policy does not.
 * Part of the cuda_host suite (every build). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mesh_internal.h"
#include "watchdog.h"

typedef struct fake_ev {
  int state; /* what query answers: 1 done, 0 pending, -1 failed */
} fake_ev;

static int nreleased, naborted;
static mesh_dim *last_aborted;

static int fake_query(void *ev) {
  return __atomic_load_n(&((fake_ev *)ev)->state, __ATOMIC_ACQUIRE);
}
static void fake_release(void *ev) {
  nreleased++; /* (called with the watchdog's mutex held) */
  free(ev);
}
static void fake_abort(mesh_dim *g) {
  naborted++;
  last_aborted = g;
}
static const weft_watch_ops fake_ops = {fake_query, fake_release, fake_abort};

static fake_ev *ev_new(void) {
  fake_ev *e = calloc(1, sizeof *e);
  cr_assert_not_null(e);
  return e;
}
static void set_state(fake_ev *e, int s) { __atomic_store_n(&e->state, s, __ATOMIC_RELEASE); }

static void sleep_s(double s) {
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  nanosleep(&ts, NULL);
}

static mesh_dim dim_named(const char *name) {
  mesh_dim g;
  memset(&g, 0, sizeof g);
  snprintf(g.name, sizeof g.name, "%s", name);
  return g;
}

Test(watchdog, completed_calls_go_and_a_late_one_breaks_its_dim_naming_call_and_seq) {
  weft__rt.settings.timeout_s = 0.3;
  mesh_dim tp = dim_named("tp"), dp = dim_named("dp");
  fake_ev *a = ev_new(), *b = ev_new(), *c = ev_new(), *d = ev_new();
  cr_assert_eq(weft__watch(&tp, &fake_ops, a, "all_reduce(f32, count 16, sum, seq 7)"), WEFT_OK);
  cr_assert_eq(weft__watch(&tp, &fake_ops, b, "all_gather(f32, count 4, seq 8)"), WEFT_OK);
  cr_assert_eq(weft__watch(&tp, &fake_ops, c, "all_gather(f32, count 4, seq 9)"), WEFT_OK);
  cr_assert_eq(weft__watch(&dp, &fake_ops, d, "reduce_scatter(f32, count 8, sum, seq 3)"), WEFT_OK);
  set_state(a, 1);
  set_state(d, 1);
  cr_assert_eq(weft__watch_poll(), 2, "the two done calls are dropped, two pending stay");
  cr_assert(!tp.broken && !dp.broken, "nothing is late yet");
  /* the thread (not the test) finds b late: tp broken, b and c dropped,
   * tp's communicator aborted once; dp untouched */
  for (int i = 0; i < 100 && !__atomic_load_n(&tp.broken, __ATOMIC_ACQUIRE); i++) sleep_s(0.02);
  cr_assert(tp.broken, "the watchdog thread did not give up on tp after %g s",
            weft__rt.settings.timeout_s);
  cr_assert(strstr(tp.broken_msg, "seq 8) did not complete within") ||
                strstr(tp.broken_msg, "seq 9) did not complete within"),
            "message: %s", tp.broken_msg);
  cr_assert(strstr(tp.broken_msg, "NCCL"), "message: %s", tp.broken_msg);
  cr_assert_eq(weft__watch_poll(), 0);
  cr_assert_eq(naborted, 1);
  cr_assert_eq(last_aborted, &tp);
  cr_assert_eq(nreleased, 4);
  cr_assert(!dp.broken);
  weft__watch_shutdown();
}

Test(watchdog, a_failed_call_breaks_its_dim_and_forget_drops_without_judging) {
  weft__rt.settings.timeout_s = 300;
  mesh_dim tp = dim_named("tp"), dp = dim_named("dp");
  fake_ev *a = ev_new(), *b = ev_new();
  cr_assert_eq(weft__watch(&tp, &fake_ops, a, "broadcast(f32, count 2, root 0, seq 1)"), WEFT_OK);
  cr_assert_eq(weft__watch(&dp, &fake_ops, b, "all_reduce(f32, count 2, sum, seq 1)"), WEFT_OK);
  set_state(a, -1);
  cr_assert_eq(weft__watch_poll(), 1);
  cr_assert(tp.broken);
  cr_assert(strstr(tp.broken_msg, "broadcast(f32, count 2, root 0, seq 1) failed"), "message: %s",
            tp.broken_msg);
  cr_assert_eq(naborted, 1);
  /* a dim going away: its calls are released, nothing is judged */
  weft__watch_forget(&dp);
  cr_assert_eq(weft__watch_poll(), 0);
  cr_assert(!dp.broken);
  cr_assert_eq(naborted, 1);
  cr_assert_eq(nreleased, 2);
  weft__watch_shutdown();
}

Test(watchdog, shutdown_releases_what_is_still_watched) {
  weft__rt.settings.timeout_s = 300;
  mesh_dim tp = dim_named("tp");
  cr_assert_eq(weft__watch(&tp, &fake_ops, ev_new(), "all_reduce(f32, count 1, sum, seq 1)"),
               WEFT_OK);
  cr_assert_eq(weft__watch(&tp, &fake_ops, ev_new(), "all_reduce(f32, count 1, sum, seq 2)"),
               WEFT_OK);
  weft__watch_shutdown();
  cr_assert_eq(nreleased, 2);
  cr_assert_eq(naborted, 0);
  cr_assert(!tp.broken);
  /* and it starts again on the next call */
  cr_assert_eq(weft__watch(&tp, &fake_ops, ev_new(), "all_reduce(f32, count 1, sum, seq 3)"),
               WEFT_OK);
  weft__watch_shutdown();
  cr_assert_eq(nreleased, 3);
}
