#include "harness.h"

#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

extern char **environ;

#ifndef WEFT_MPIEXEC
#define WEFT_MPIEXEC "mpiexec"
#endif

static int run(int nranks, const char *worker, const char *case_name, int timeout_s,
               const char *const *extra, const char *const *env_extra) {
  char nbuf[16], tbuf[64];
  snprintf(nbuf, sizeof nbuf, "%d", nranks);
  snprintf(tbuf, sizeof tbuf, "MPIEXEC_TIMEOUT=%d", timeout_s);

  const char *argv[64];
  int argc = 0;
  argv[argc++] = WEFT_MPIEXEC;
  argv[argc++] = "-n";
  argv[argc++] = nbuf;
  argv[argc++] = worker;
  argv[argc++] = case_name;
  for (int i = 0; extra && extra[i] && argc < 63; i++) argv[argc++] = extra[i];
  argv[argc] = NULL;

  /* Environment: ours, minus any MPIEXEC_TIMEOUT, plus ours and env_extra. */
  size_t n = 0;
  while (environ[n]) n++;
  size_t n_extra = 0;
  while (env_extra && env_extra[n_extra]) n_extra++;
  char **envp = calloc(n + n_extra + 2, sizeof *envp);
  if (!envp) return -1;
  size_t k = 0;
  for (size_t i = 0; i < n; i++)
    if (strncmp(environ[i], "MPIEXEC_TIMEOUT=", 16) != 0) envp[k++] = environ[i];
  envp[k++] = tbuf;
  for (size_t i = 0; i < n_extra; i++) envp[k++] = (char *)env_extra[i];
  envp[k] = NULL;

  fflush(stdout);
  fflush(stderr);
  pid_t pid;
  int rc = posix_spawnp(&pid, WEFT_MPIEXEC, NULL, NULL, (char *const *)argv, envp);
  free(envp);
  if (rc != 0) {
    fprintf(stderr, "harness: cannot start %s: %s\n", WEFT_MPIEXEC, strerror(rc));
    return -1;
  }
  int status = 0;
  if (waitpid(pid, &status, 0) < 0) return -1;
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

int weft_test_mpiexec_args(int nranks, const char *worker, const char *case_name,
                           int timeout_s, const char *const *extra) {
  return run(nranks, worker, case_name, timeout_s, extra, NULL);
}

int weft_test_mpiexec(int nranks, const char *worker, const char *case_name, int timeout_s) {
  return run(nranks, worker, case_name, timeout_s, NULL, NULL);
}

int weft_test_mpiexec_env(int nranks, const char *worker, const char *case_name, int timeout_s,
                          const char *const *env_extra) {
  return run(nranks, worker, case_name, timeout_s, NULL, env_extra);
}

unsigned long weft_test_seed(unsigned long fallback) {
  const char *s = getenv("WEFT_TEST_SEED");
  if (s && *s) return strtoul(s, NULL, 0);
  return fallback;
}
