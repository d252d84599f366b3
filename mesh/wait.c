/* Waiting for MPI requests: MPI_Test with an adaptive backoff and a timeout.
 *
 * Why: MPICH 4.0.2 busy-polls inside blocking calls. With more ranks than
 * cores every waiting rank burns the timeslice the rank it waits for needs
 * (2000 blocking barriers: 0.003 s on 2 ranks, 16 s on 3, 50 s on 6 over 2
 * cores). Sleeping between tests gives the CPU away; but when each rank has
 * its own core sleeping only adds latency (200 1-MiB MPI_Iallgathers on 2
 * ranks: 0.07 s blocking, 0.16 s with a 20 us sleep between tests; on 4
 * ranks over 2 cores 4.51 s blocking, 0.67 s with the sleep).
 *
 * Policy (weft__rt.sleep_waits, chosen at weft_init from node processes vs
 * CPUs, or WEFT_BACKOFF):
 * - sleep_waits: test a few times, then sleep between tests, starting short
 *   and doubling up to a cap;
 * - otherwise: spin on MPI_Test; a wait that lasts longer than SPIN_LIMIT_S
 *   yields between tests (a 64 MiB all-reduce takes ~50-100 ms here and
 *   must keep polling: sleeping after 10 ms made it 0.65-0.8x of MPI's), and
 *   only a wait past YIELD_LIMIT_S (a peer still computing) sleeps, so a
 *   waiting rank does not hold a core for seconds.
 * - sleep_waits and a payload of at least YIELD_BYTES: between tests call
 *   sched_yield instead of sleeping (for up to YIELD_LIMIT_S, then sleep).
 *   A large transfer advances only inside MPI calls on both sides (the
 *   shared-memory pipeline copies fragment by fragment), so a sleeping rank
 *   stalls its peer; yielding hands the core to whoever is runnable and
 *   comes straight back. Measured on 4 ranks over 2 cores (bench, 64 MiB):
 *   weft/MPI 0.72-0.79 with sleeps, 0.98-1.08 with yields; at 1-4 MiB sleeps
 *   win (1 MiB all-gather 0.35 vs 0.16 GB/s), hence the threshold.
 * Tuning (2 cores; 900 small all-reduces over the dims of a 2x2x2 mesh,
 * 150 1-MiB all-gathers, 100 whole-mesh barriers; 8 ranks): spinning
 * (WEFT_BACKOFF=0) 5.3 s, this backoff 1.2-1.5 s. Among backoffs (first
 * sleep 1-20 us, cap 32-1000 us, 4-100 tests first) the differences were
 * within the noise of a shared machine, except that caps above ~100 us
 * were slower on 4 ranks (1.3 s vs 0.8 s at 64 us) and a 1 us timer slack
 * (prctl) was slower, not faster (more wake-ups). note: with the default
 * 50 us timer slack a 1 us sleep lasts ~55 us, so the sleeps run ~55 to
 * ~115 us.
 */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mesh_internal.h"

/* note: MPICH's mpi.h marks the status arguments with access attributes,
 * and gcc 12 then flags MPI_STATUSES_IGNORE (a null pointer constant) as
 * a zero-size region. */
#pragma GCC diagnostic ignored "-Wstringop-overflow"

/* Oversubscribed: tests before the first sleep, first sleep, cap. */
#define SLEEP_SPIN_TESTS 4
#define SLEEP_MIN_NS 1000L
#define SLEEP_MAX_NS 64000L
/* Oversubscribed and large: yield between tests for this long at most. */
#define YIELD_BYTES (8ll << 20)
#define YIELD_LIMIT_S 1.0
/* One core per rank: spin this long before backing off, then sleep up to. */
#define SPIN_LIMIT_S 0.010
#define SPIN_SLEEP_MAX_NS 100000L

double weft__now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Tests the pending requests once (completed ones become MPI_REQUEST_NULL);
 * returns how many are still pending, or -1 on an MPI error. */
static int test_pending(int n, MPI_Request *reqs, int *indices, int pending, int *rc) {
  if (n == 1) {
    int flag = 0;
    if ((*rc = MPI_Test(&reqs[0], &flag, MPI_STATUS_IGNORE)) != MPI_SUCCESS) return -1;
    return flag ? 0 : 1;
  }
  int outcount = 0;
  if ((*rc = MPI_Testsome(n, reqs, &outcount, indices, MPI_STATUSES_IGNORE)) != MPI_SUCCESS)
    return -1;
  if (outcount == MPI_UNDEFINED) return 0; /* none active */
  return pending - outcount;
}

weft_status weft__wait_all(int n, MPI_Request *reqs, double timeout_s) {
  return weft__wait_all_sized(n, reqs, timeout_s, 0);
}

weft_status weft__wait_all_sized(int n, MPI_Request *reqs, double timeout_s, int64_t bytes) {
  int pending = 0;
  for (int i = 0; i < n; i++)
    if (reqs[i] != MPI_REQUEST_NULL) pending++;
  if (pending == 0) return WEFT_OK;
  int idx_stack[64];
  int *indices = idx_stack;
  if (n > 64 && !(indices = malloc((size_t)n * sizeof *indices)))
    return weft_error(WEFT_ERR_OOM, "no memory to wait for %d requests", n);
  weft_status st = WEFT_OK;
  bool sleepy = weft__rt.sleep_waits;
  bool yieldy = !sleepy || bytes >= YIELD_BYTES;
  double t0 = weft__now(), t = t0;
  long sleep_ns = SLEEP_MIN_NS;
  for (unsigned long iter = 0;; iter++) {
    int rc = MPI_SUCCESS;
    int left = test_pending(n, reqs, indices, pending, &rc);
    if (left < 0) {
      char msg[MPI_MAX_ERROR_STRING] = "";
      int len = 0;
      MPI_Error_string(rc, msg, &len);
      st = weft_error(WEFT_ERR_MPI, "MPI_Test failed while waiting: %s", msg);
      break;
    }
    if (left == 0) break;
    pending = left;
    bool nap;
    if (sleepy) {
      nap = iter >= SLEEP_SPIN_TESTS;
      if (nap || (iter & 7) == 0) t = weft__now();
    } else {
      if ((iter & 63) == 0) t = weft__now();
      nap = t - t0 > SPIN_LIMIT_S;
      if (nap && sleep_ns > SPIN_SLEEP_MAX_NS) sleep_ns = SPIN_SLEEP_MAX_NS;
    }
    if (t - t0 > timeout_s) {
      st = WEFT_ERR_TIMEOUT;
      weft__rt.timed_out = true; /* weft_finalize then waits only briefly */
      break;
    }
    if (nap && yieldy && t - t0 < YIELD_LIMIT_S) {
      sched_yield();
      t = weft__now();
      continue;
    }
    if (nap) {
      struct timespec ts = {0, sleep_ns};
      nanosleep(&ts, NULL);
      long cap = sleepy ? SLEEP_MAX_NS : SPIN_SLEEP_MAX_NS;
      sleep_ns = sleep_ns * 2 > cap ? cap : sleep_ns * 2;
      t = weft__now();
    }
  }
  if (indices != idx_stack) free(indices);
  return st;
}

weft_status weft_wait_requests(int n, MPI_Request *reqs, const char *what) {
  if (!what) what = "MPI wait";
  if (n < 0 || (n > 0 && !reqs))
    return weft_error(WEFT_ERR_INVALID, "%s: weft_wait_requests got %d requests at %p", what, n,
                      (void *)reqs);
  double timeout = weft__rt.settings.timeout_s; /* 300 s until set */
  weft_status st = weft__wait_all(n, reqs, timeout);
  if (st == WEFT_ERR_TIMEOUT)
    return weft_error(WEFT_ERR_TIMEOUT,
                      "%s: no answer from the other ranks after %.0f s "
                      "(a rank died or is not calling it)",
                      what, timeout);
  if (st != WEFT_OK) {
    char msg[512];
    snprintf(msg, sizeof msg, "%s", weft_last_error());
    return weft_error(st, "%s: %s", what, msg);
  }
  return WEFT_OK;
}

static weft_status agree_mpi_err(int rc, const char *what) {
  char s[MPI_MAX_ERROR_STRING] = "";
  int n = 0;
  MPI_Error_string(rc, s, &n);
  return weft_error(WEFT_ERR_MPI, "%s: %s", what, s);
}

weft_status weft_agree_status(MPI_Comm comm, weft_status st, const char *msg, const char *what,
                              int *failed_rank) {
  if (failed_rank) *failed_rank = -1;
  if (!what) what = "call";
  if (comm == MPI_COMM_NULL)
    return weft_error(WEFT_ERR_INVALID, "%s: status agreement over MPI_COMM_NULL", what);
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  int v = st != WEFT_OK ? rank : size, lowest = size;
  MPI_Request r;
  int rc = MPI_Iallreduce(&v, &lowest, 1, MPI_INT, MPI_MIN, comm, &r);
  if (rc != MPI_SUCCESS) return agree_mpi_err(rc, what);
  char name[160];
  snprintf(name, sizeof name, "%s (status agreement)", what);
  WEFT_CHECK(weft_wait_requests(1, &r, name));
  if (lowest == size) return WEFT_OK;
  struct {
    int32_t code;
    char msg[2044];
  } m;
  memset(&m, 0, sizeof m);
  if (rank == lowest) {
    m.code = (int32_t)st;
    snprintf(m.msg, sizeof m.msg, "%s", msg ? msg : weft_last_error());
  }
  rc = MPI_Ibcast(&m, (int)sizeof m, MPI_BYTE, lowest, comm, &r);
  if (rc != MPI_SUCCESS) return agree_mpi_err(rc, what);
  WEFT_CHECK(weft_wait_requests(1, &r, name));
  if (failed_rank) *failed_rank = lowest;
  /* the lowest failing rank keeps its own message (still the last error:
   * the waits above succeeded) */
  if (rank == lowest) return st;
  return weft_error((weft_status)m.code, "%s failed on rank %d: %s", what, lowest, m.msg);
}
