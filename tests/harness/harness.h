/* tests/harness — running MPI worker programs from Criterion.
 *
 * Criterion re-executes each test in a child process, so a Criterion binary
 * cannot itself be an MPI program (the children lose PMI_FD). Instead a
 * Criterion test starts a worker through mpiexec:
 *
 *     Test(mesh, all_gather_2x2, .timeout = 60) {
 *       cr_assert_eq(weft_test_mpiexec(4, WORKER("mesh_worker"), "all_gather", 50), 0);
 *     }
 *
 * MPIEXEC_TIMEOUT is set to the given seconds (below the Criterion timeout),
 * so a hang becomes a failure and no rank is left behind. The worker checks
 * on every rank and exits non-zero on any mismatch (see worker.h).
 */
#ifndef WEFT_TEST_HARNESS_H
#define WEFT_TEST_HARNESS_H

/* Path of a worker binary built next to the test (meson passes
 * WEFT_TEST_BUILD_DIR as the test's build directory). */
#define WORKER(name) WEFT_TEST_BUILD_DIR "/" name

/* Runs `mpiexec -n nranks worker case [extra args...]` with MPIEXEC_TIMEOUT =
 * timeout_s and waits for it. Returns the exit status (0 = every rank
 * passed), 128+signal if it was killed, or -1 if it could not start. Output
 * goes to this process's stdout/stderr. `extra` may be NULL; else a
 * NULL-terminated list of further arguments. */
int weft_test_mpiexec_args(int nranks, const char *worker, const char *case_name,
                           int timeout_s, const char *const *extra);
int weft_test_mpiexec(int nranks, const char *worker, const char *case_name, int timeout_s);

/* Same, with extra environment variables ("NAME=value", NULL-terminated)
 * added to the environment mpiexec passes to the ranks. */
int weft_test_mpiexec_env(int nranks, const char *worker, const char *case_name, int timeout_s,
                          const char *const *env_extra);

/* Seed for randomized tests: WEFT_TEST_SEED if set, else `fallback`. Tests
 * print the seed on failure. */
unsigned long weft_test_seed(unsigned long fallback);

#endif
