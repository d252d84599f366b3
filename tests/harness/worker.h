/* tests/harness/worker.h — the MPI side of a multi-rank test.
 *
 * A worker program is an ordinary MPI program with a table of cases:
 *
 *     static void case_all_gather(void) {
 *       ...
 *       WCHECK(got == want, "elem %d: got %g want %g", i, got, want);
 *     }
 *     static const weft_worker_case cases[] = {{"all_gather", case_all_gather}, {0}};
 *     int main(int argc, char **argv) { return weft_worker_main(argc, argv, cases); }
 *
 * Every rank runs the case; WCHECK prints a failure with the rank and keeps
 * going (so all ranks reach the same collectives and nothing hangs); at the
 * end each rank exits non-zero if any check failed on any rank (the failure
 * count is summed over the world). A case that must stop early on a failure
 * uses WREQUIRE, which returns from the case function.
 */
#ifndef WEFT_TEST_WORKER_H
#define WEFT_TEST_WORKER_H

#include <stdbool.h>
#include <stdio.h>

/* Workers also get the harness's shared helpers (random inputs, relative
 * errors, files); worker_dep links them. */
#include "harness.h"

typedef struct weft_worker_case {
  const char *name;
  void (*fn)(void);
} weft_worker_case;

extern int weft_worker_failures;
extern int weft_worker_rank;

#define WCHECK(cond, ...)                                                                          \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      weft_worker_failures++;                                                                      \
      fprintf(stderr, "[rank %d] %s:%d: check failed: %s: ", weft_worker_rank, __FILE__, __LINE__, \
              #cond);                                                                              \
      fprintf(stderr, __VA_ARGS__);                                                                \
      fprintf(stderr, "\n");                                                                       \
    }                                                                                              \
  } while (0)

#define WREQUIRE(cond, ...)      \
  do {                           \
    if (!(cond)) {               \
      WCHECK(cond, __VA_ARGS__); \
      return;                    \
    }                            \
  } while (0)

/* Checks a weft_status is WEFT_OK, printing weft_last_error otherwise. */
#define WOK(expr)                                                               \
  do {                                                                          \
    weft_status wok_st_ = (expr);                                               \
    WCHECK(wok_st_ == WEFT_OK, "%s -> %s: %s", #expr, weft_status_str(wok_st_), \
           weft_last_error());                                                  \
  } while (0)

/* Runs the case named argv[1] (weft_init/weft_finalize around it); the case
 * may read argv[2..] through weft_worker_argc/argv. Returns the exit code. */
int weft_worker_main(int argc, char **argv, const weft_worker_case *cases);
extern int weft_worker_argc;
extern char **weft_worker_argv;

/* ------------------------------------------------------ device mode
 *
 * A worker run with WEFT_TEST_DEVICE=cuda in its environment (what
 * weft_test_mpiexec_on_device sets) runs its case with every root mesh on
 * WEFT_CUDA: the worker passes each root mesh it makes through
 * weft_worker_mesh_on_device (sub-meshes inherit the device) and reads
 * numbers only through weft_worker_host_copy. Unset, everything stays on
 * the CPU and no copy is made: the host mode is the suites' plain run. */

/* True under WEFT_TEST_DEVICE=cuda; any other non-empty value is a failed
 * check, so a typo cannot quietly run the host mode. Local. */
bool weft_worker_device_mode(void);

/* Puts root, a root mesh the worker just made, on WEFT_CUDA in device mode
 * (collective over the mesh, like its creation; a failure is a failed
 * check); nothing in host mode or for NULL. Returns root. */
struct weft_mesh *weft_worker_mesh_on_device(struct weft_mesh *root);

/* t readable on the host: t itself when it is there, else a new host copy
 * left in *tmp for the caller to destroy (*tmp is NULL when no copy was
 * made). NULL t gives NULL; a failed copy is a failed check and gives
 * NULL. Local (a device-to-host copy). */
const struct weft_tensor *weft_worker_host_copy(const struct weft_tensor *t,
                                                struct weft_tensor **tmp);

/* a and b (each on any device) equal bitwise, as weft_tensor_equal, read
 * through host copies; NULL is never equal. Local. */
bool weft_worker_equal_on_host(const struct weft_tensor *a, const struct weft_tensor *b);

#endif
