#include "harness.h"

#include <math.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

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

int weft_test_mpiexec_args(int nranks, const char *worker, const char *case_name, int timeout_s,
                           const char *const *extra) {
  return run(nranks, worker, case_name, timeout_s, extra, NULL);
}

int weft_test_mpiexec(int nranks, const char *worker, const char *case_name, int timeout_s) {
  return run(nranks, worker, case_name, timeout_s, NULL, NULL);
}

int weft_test_mpiexec_on_device(int nranks, const char *worker, const char *case_name,
                                int timeout_s, const char *const *extra) {
  const char *const env[] = {"WEFT_TEST_DEVICE=cuda", NULL};
  return run(nranks, worker, case_name, timeout_s, extra, env);
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

/* ---------------------------------------------------- relative errors */

/* Element i of an f32 (f64 = false) or f64 array, as double. */
static double at(const void *p, bool f64, int64_t i) {
  return f64 ? ((const double *)p)[i] : (double)((const float *)p)[i];
}

/* ||(got - base) - (want - base)|| / ||want - base||; base NULL: 0. */
static double rel_norm(const void *got, bool got64, const void *want, bool want64,
                       const float *base, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; i++) {
    double b = base ? (double)base[i] : 0, w = at(want, want64, i) - b;
    double e = at(got, got64, i) - b - w;
    num += e * e;
    den += w * w;
  }
  return den > 0 ? sqrt(num / den) : sqrt(num);
}

static double rel_max(const void *got, bool got64, const void *want, bool want64, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; i++) {
    double w = at(want, want64, i), d = fabs(at(got, got64, i) - w);
    if (isnan(d)) d = INFINITY;
    if (d > num) num = d;
    if (fabs(w) > den) den = fabs(w);
  }
  return den > 0 ? num / den : num;
}

double weft_test_rel_norm_f32(const float *got, const float *want, int64_t n) {
  return rel_norm(got, false, want, false, NULL, n);
}

double weft_test_rel_norm_f32_f64(const float *got, const double *want, int64_t n) {
  return rel_norm(got, false, want, true, NULL, n);
}

double weft_test_rel_change_f32(const float *got, const float *want, const float *base, int64_t n) {
  return rel_norm(got, false, want, false, base, n);
}

double weft_test_rel_max_f32(const float *got, const float *want, int64_t n) {
  return rel_max(got, false, want, false, n);
}

double weft_test_rel_max_f32_f64(const float *got, const double *want, int64_t n) {
  return rel_max(got, false, want, true, n);
}

double weft_test_rel_max_f64(const double *got, const double *want, int64_t n) {
  return rel_max(got, true, want, true, n);
}

double weft_test_rel_scalar(double got, double want) {
  return fabs(got - want) / (fabs(want) > 0 ? fabs(want) : 1);
}

/* ---------------------------------------------------------------- files */

char *weft_test_slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  long n = -1;
  if (fseek(f, 0, SEEK_END) == 0) n = ftell(f);
  char *b = n >= 0 && fseek(f, 0, SEEK_SET) == 0 ? malloc((size_t)n + 1) : NULL;
  if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
    free(b);
    b = NULL;
  }
  fclose(f);
  if (!b) return NULL;
  b[n] = '\0';
  if (len) *len = (size_t)n;
  return b;
}

/* ------------------------------------------------------ child processes */

int weft_test_capture_stderr(void (*fn)(void *), void *arg, char *err, size_t cap) {
  if (cap) err[0] = '\0';
  int pfd[2];
  if (pipe(pfd) != 0) return -1;
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid < 0) {
    close(pfd[0]);
    close(pfd[1]);
    return -1;
  }
  if (pid == 0) {
    dup2(pfd[1], 2);
    close(pfd[0]);
    close(pfd[1]);
    fn(arg);
    _exit(0);
  }
  close(pfd[1]);
  size_t n = 0;
  char drop[4096];
  for (;;) {
    bool room = n + 1 < cap;
    ssize_t r = room ? read(pfd[0], err + n, cap - 1 - n) : read(pfd[0], drop, sizeof drop);
    if (r <= 0) break;
    if (room) n += (size_t)r;
  }
  if (cap) err[n] = '\0';
  close(pfd[0]);
  int st = 0;
  if (waitpid(pid, &st, 0) < 0) return -1;
  return st;
}

bool weft_test_died_of_abort(int status) {
  return status != -1 && WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT;
}
