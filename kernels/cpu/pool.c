/* kernels/cpu/pool.c — the CPU kernels' thread pool (pool.h): attention's
 * (batch, head) items, the row / element chunks of the non-GEMM kernels and
 * the blocks of a large GEMM (gemm.c).
 * OpenBLAS runs on 1 thread: on first use the pool takes OpenBLAS's thread
 * count (OPENBLAS_NUM_THREADS, the pthreads build) as weft's and sets
 * OpenBLAS to 1. Why: OpenBLAS's workers spin in sched_yield for a while
 * after each call, and on 2 cores they took the second core from the
 * pool's worker running the elementwise work in between (perf of a
 * gpt2-tiny step: ~20% of the cycles in sched_yield and the scheduler);
 * OpenBLAS also splits attention's small GEMMs (64 query rows x at most T
 * keys x hd) with a synchronisation per call, which measured here made
 * 2-thread attention slower than 1 thread (4x512x12x64 forward 35 -> 45
 * ms). So the pool runs every parallel loop on N threads of its own (the
 * caller and N - 1 workers, started on first use, each with its own
 * scratch block, sleeping on a condition variable between jobs). One
 * caller at a time uses the pool; a concurrent or nested caller (a GEMM
 * inside an attention item) runs serially. After fork() the child starts a
 * new pool (the workers do not survive it). Without BLAS the loops are
 * serial. */
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

#include "backend.h" /* weft_cpu_set_num_threads */
#include "kernels.h" /* weft_alloc */
#include "pool.h"
#include "status.h"
#include "weft_config.h"

/* The partial-sums block (weft_cpu_partials_get_): plain malloc like the
 * pool's scratch blocks, grown on demand and kept, so a steady-state step
 * allocates nothing; one caller holds it at a time. */
static atomic_flag partials_held = ATOMIC_FLAG_INIT;
static double *partials_block;
static int64_t partials_cap;

weft_status weft_cpu_partials_get_(int64_t n, double **out) {
  if (n < 1) n = 1;
  if (!atomic_flag_test_and_set(&partials_held)) {
    if (partials_cap >= n) {
      *out = partials_block;
      return WEFT_OK;
    }
    double *p = malloc((size_t)n * sizeof(double));
    if (p) {
      free(partials_block);
      partials_block = p;
      partials_cap = n;
      *out = p;
      return WEFT_OK;
    }
    atomic_flag_clear(&partials_held);
  }
  return weft_alloc(WEFT_CPU, (size_t)n * sizeof(double), (void **)out);
}

void weft_cpu_partials_put_(double *p) {
  if (!p) return;
  if (p == partials_block) {
    atomic_flag_clear(&partials_held);
    return;
  }
  weft_free(p);
}

#if WEFT_HAVE_BLAS
#include <cblas.h>
#include <pthread.h>

#define PAR_MAX 64 /* threads at most, the caller included */

static struct {
  pthread_mutex_t call; /* held by the caller for a whole job */
  pthread_mutex_t mu;   /* guards the fields below */
  pthread_cond_t wake, idle;
  int nworkers; /* started workers, ids 1..nworkers */
  uint64_t gen; /* job generation */
  int want;     /* workers 1..want take part in the current job */
  int busy;     /* of those, still working */
  weft_cpu_par_fn fn;
  void *ctx;
  int64_t n;
  atomic_llong next;           /* next item to take */
  uint64_t start_gen[PAR_MAX]; /* the generation before the job a worker was started for */
  float *scratch[PAR_MAX];
  int64_t scratch_cap[PAR_MAX];
} par = {.call = PTHREAD_MUTEX_INITIALIZER,
         .mu = PTHREAD_MUTEX_INITIALIZER,
         .wake = PTHREAD_COND_INITIALIZER,
         .idle = PTHREAD_COND_INITIALIZER};
static pthread_once_t par_once = PTHREAD_ONCE_INIT;

static void par_items(weft_cpu_par_fn fn, void *ctx, int64_t n, float *scratch) {
  for (;;) {
    int64_t i = atomic_fetch_add(&par.next, 1);
    if (i >= n) break;
    fn(ctx, i, scratch);
  }
}

static void *par_worker(void *arg) {
  const int id = (int)(intptr_t)arg;
  pthread_mutex_lock(&par.mu);
  uint64_t seen = par.start_gen[id]; /* so it joins the job it was started for */
  for (;;) {
    while (par.gen == seen) pthread_cond_wait(&par.wake, &par.mu);
    seen = par.gen;
    if (id > par.want) continue;
    weft_cpu_par_fn fn = par.fn;
    void *ctx = par.ctx;
    int64_t n = par.n;
    float *scratch = par.scratch[id];
    pthread_mutex_unlock(&par.mu);
    par_items(fn, ctx, n, scratch);
    pthread_mutex_lock(&par.mu);
    if (--par.busy == 0) pthread_cond_signal(&par.idle);
  }
  return NULL;
}

static void par_prepare(void) {
  pthread_mutex_lock(&par.call);
  pthread_mutex_lock(&par.mu);
}
static void par_parent(void) {
  pthread_mutex_unlock(&par.mu);
  pthread_mutex_unlock(&par.call);
}
static void par_child(void) {
  /* the workers are gone; the scratch blocks stay this process's */
  par.nworkers = 0;
  par.want = par.busy = 0;
  pthread_mutex_unlock(&par.mu);
  pthread_mutex_unlock(&par.call);
}
static void par_init(void) { pthread_atfork(par_prepare, par_parent, par_child); }

/* weft's thread count (weft_cpu_set_num_threads). On first use it takes
 * OpenBLAS's setting (OPENBLAS_NUM_THREADS), when OpenBLAS is the pthreads
 * build (with the OpenMP build a setting made here would not reach the
 * pool's threads; then 1), and sets OpenBLAS itself to 1 thread for good:
 * weft splits its GEMMs over the pool (gemm.c), so OpenBLAS's own workers,
 * which spin in sched_yield between calls, never compete with the pool's
 * for the cores. */
static atomic_int par_nt;
static pthread_once_t par_nt_once = PTHREAD_ONCE_INIT;

static void par_nt_init(void) {
  int nt = 1;
  if (openblas_get_parallel() == 1) {
    nt = openblas_get_num_threads();
    openblas_set_num_threads(1);
  }
  atomic_store(&par_nt, nt < 1 ? 1 : nt > PAR_MAX ? PAR_MAX : nt);
}

static int par_threads(void) {
  pthread_once(&par_nt_once, par_nt_init);
  return atomic_load(&par_nt);
}

/* fn(ctx, i, scratch) for i in [0, n) on up to nt threads (this one
 * included); each thread passes its own scratch of `floats` floats (the
 * caller's is `own`). Falls back to this thread alone when the pool is
 * busy or cannot grow. */
static void par_run(int64_t n, int nt, weft_cpu_par_fn fn, void *ctx, float *own, int64_t floats) {
  if (nt > 1 && n > 1 && pthread_mutex_trylock(&par.call) == 0) {
    pthread_once(&par_once, par_init);
    int want = nt - 1 < n - 1 ? nt - 1 : (int)(n - 1);
    for (int id = 1; id <= want; id++) {
      if (par.scratch_cap[id] < floats) {
        float *p = malloc((size_t)(floats > 0 ? floats : 1) * sizeof(float));
        if (!p) {
          want = id - 1;
          break;
        }
        free(par.scratch[id]);
        par.scratch[id] = p;
        par.scratch_cap[id] = floats;
      }
    }
    pthread_mutex_lock(&par.mu);
    while (par.nworkers < want) {
      pthread_t t;
      par.start_gen[par.nworkers + 1] = par.gen;
      if (pthread_create(&t, NULL, par_worker, (void *)(intptr_t)(par.nworkers + 1)) != 0) break;
      pthread_detach(t);
      par.nworkers++;
    }
    if (want > par.nworkers) want = par.nworkers;
    par.fn = fn;
    par.ctx = ctx;
    par.n = n;
    atomic_store(&par.next, 0);
    par.want = par.busy = want;
    par.gen++;
    pthread_cond_broadcast(&par.wake);
    pthread_mutex_unlock(&par.mu);
    par_items(fn, ctx, n, own);
    pthread_mutex_lock(&par.mu);
    while (par.busy > 0) pthread_cond_wait(&par.idle, &par.mu);
    pthread_mutex_unlock(&par.mu);
    pthread_mutex_unlock(&par.call);
    return;
  }
  for (int64_t i = 0; i < n; i++) fn(ctx, i, own);
}

int weft_cpu_num_threads(void) { return par_threads(); }

weft_status weft_cpu_set_num_threads(int n) {
  if (n < 1 || n > PAR_MAX)
    return weft_error(WEFT_ERR_INVALID, "weft_cpu_set_num_threads: %d threads (want 1..%d)", n,
                      PAR_MAX);
  if (openblas_get_parallel() != 1 && n > 1)
    return weft_error(WEFT_ERR_UNSUPPORTED,
                      "weft_cpu_set_num_threads: this OpenBLAS is not the pthreads build, so the "
                      "CPU kernels run on 1 thread");
  pthread_once(&par_nt_once, par_nt_init);
  atomic_store(&par_nt, n);
  return WEFT_OK;
}

typedef struct range_job {
  weft_cpu_range_fn fn;
  void *ctx;
  int64_t n, grain;
} range_job;

static void range_item(void *c, int64_t i, float *scratch) {
  (void)scratch;
  const range_job *j = c;
  const int64_t lo = i * j->grain, hi = j->n - lo < j->grain ? j->n : lo + j->grain;
  j->fn(j->ctx, lo, hi);
}

void weft_cpu_par_range_(int64_t n, int64_t grain, weft_cpu_range_fn fn, void *ctx) {
  if (n <= 0) return;
  if (grain < 1) grain = 1;
  range_job j = {fn, ctx, n, grain};
  const int64_t chunks = (n - 1) / grain + 1;
  const int nt = par_threads();
  if (nt > 1 && chunks > 1) {
    par_run(chunks, nt, range_item, &j, NULL, 0);
    return;
  }
  for (int64_t i = 0; i < chunks; i++) range_item(&j, i, NULL);
}

/* Runs fn over the n items on weft's thread count (OpenBLAS is at 1
 * thread: par_nt_init). */
void weft_cpu_par_for_(int64_t n, weft_cpu_par_fn fn, void *ctx, float *own, int64_t floats) {
  const int nt = par_threads();
  if (nt <= 1 || n <= 1) {
    for (int64_t i = 0; i < n; i++) fn(ctx, i, own);
    return;
  }
  par_run(n, nt, fn, ctx, own, floats);
}
#else  /* no BLAS: the items run here, in order */
void weft_cpu_par_for_(int64_t n, weft_cpu_par_fn fn, void *ctx, float *own, int64_t floats) {
  (void)floats;
  for (int64_t i = 0; i < n; i++) fn(ctx, i, own);
}

int weft_cpu_num_threads(void) { return 1; }

weft_status weft_cpu_set_num_threads(int n) {
  if (n < 1)
    return weft_error(WEFT_ERR_INVALID, "weft_cpu_set_num_threads: %d threads (want >= 1)", n);
  if (n == 1) return WEFT_OK;
  return weft_error(WEFT_ERR_UNSUPPORTED,
                    "weft_cpu_set_num_threads: %d threads, but this build has no BLAS and its CPU "
                    "kernels run on 1 thread",
                    n);
}

void weft_cpu_par_range_(int64_t n, int64_t grain, weft_cpu_range_fn fn, void *ctx) {
  if (grain < 1) grain = 1;
  for (int64_t lo = 0; lo < n; lo += grain) fn(ctx, lo, n - lo < grain ? n : lo + grain);
}
#endif /* WEFT_HAVE_BLAS */
