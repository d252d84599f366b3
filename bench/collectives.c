/* weft-bench-collectives: weft's all-gather, reduce-scatter and all-reduce
 * against the same MPI call made directly, in one run.
 *
 *     mpiexec -n 2 build/bench/weft-bench-collectives [--json FILE] [--quick]
 *
 * For each payload size S (4 KiB .. 64 MiB, the full logical buffer as in
 * weft's comm accounting: all-gather output, reduce-scatter input,
 * all-reduce buffer; f32, integer-valued so every sum is exact):
 *   - one warm-up call of each, whose results must be identical;
 *   - R rounds (7..31, as many as fit in ~1.6 s per row); each times
 *     `iters` (>= 1, ~4 ms worth) back-to-back calls of weft (blocking,
 *     work = NULL) and right after (or before: the order alternates) the
 *     same number of MPI calls (MPI_Allgather / MPI_Reduce_scatter_block /
 *     MPI_Allreduce on a duplicate of MPI_COMM_WORLD). The time of a batch
 *     is the slowest rank's. Other load on the machine hits both halves of
 *     a round alike, so the reported ratio is the median over rounds of
 *     t_MPI / t_weft within each round; bandwidths are from each side's
 *     median batch; "best" is the ratio of the two sides' fastest batches
 *     (what each achieves when nothing else runs).
 * Bus bandwidth follows nccl-tests (doc/PERFORMANCE.md): algbw = S / t,
 * busbw = algbw * (n-1)/n for all-gather and reduce-scatter, 2(n-1)/n for
 * all-reduce. ratio = weft busbw / MPI busbw (> 1: weft faster). The last
 * line is "min ratio from 1 MiB: R" over every collective and S >= 1 MiB.
 * --json FILE writes one JSON object per row.
 *
 * note: MPICH allocates temporary buffers per call (reduce-scatter, the
 * all-reduce algorithms); glibc serves large ones with fresh mmaps, and a
 * page fault on these VMs costs ~30 us, so each 64 MiB call paid ~0.5 s of
 * faults, on both sides alike. The bench turns mmap-backed malloc off
 * (mallopt) so those buffers are reused, as a long training run would.
 */
#include "bench_util.h"
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mesh.h"

enum { AG, RS, AR, NCOLL };
static const char *const coll_name[NCOLL] = {"all_gather", "reduce_scatter", "all_reduce"};

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct ctx {
  weft_mesh *mesh;
  MPI_Comm comm;
  int n, rank;
  float *send, *recv, *check;
} ctx;

/* One call of collective c with `count` elements per block (AG/RS) or in
 * total (AR). */
static int run_one(ctx *x, int c, bool use_weft, int64_t count, float *out) {
  if (use_weft) {
    weft_status st;
    if (c == AG)
      st = weft_all_gather(x->mesh, 0, x->send, out, count, WEFT_F32, NULL);
    else if (c == RS)
      st = weft_reduce_scatter(x->mesh, 0, x->send, out, count, WEFT_F32, WEFT_OP_SUM, NULL);
    else
      st = weft_all_reduce(x->mesh, 0, x->send, out, count, WEFT_F32, WEFT_OP_SUM, NULL);
    if (st != WEFT_OK) {
      fprintf(stderr, "%s\n", weft_last_error());
      return 1;
    }
    return 0;
  }
  int rc;
  if (c == AG)
    rc = MPI_Allgather(x->send, (int)count, MPI_FLOAT, out, (int)count, MPI_FLOAT, x->comm);
  else if (c == RS)
    rc = MPI_Reduce_scatter_block(x->send, out, (int)count, MPI_FLOAT, MPI_SUM, x->comm);
  else
    rc = MPI_Allreduce(x->send, out, (int)count, MPI_FLOAT, MPI_SUM, x->comm);
  return rc != MPI_SUCCESS;
}

/* Slowest rank's value (through weft, so that the bench's own
 * synchronisation does not busy-poll). */
static double max_over_ranks(ctx *x, double v) {
  double out = v;
  if (weft_all_reduce(x->mesh, 0, &v, &out, 1, WEFT_F64, WEFT_OP_MAX, NULL) != WEFT_OK) {
    fprintf(stderr, "%s\n", weft_last_error());
    exit(1);
  }
  return out;
}

#define MAX_ROUNDS 31

/* Seconds per call for `iters` calls, slowest rank. */
static double timed(ctx *x, int c, bool use_weft, int64_t count, int iters) {
  weft_barrier(x->mesh, 0, NULL);
  double t0 = now();
  for (int i = 0; i < iters; i++)
    if (run_one(x, c, use_weft, count, x->recv)) exit(1);
  double t = now() - t0;
  return max_over_ranks(x, t) / iters;
}

int main(int argc, char **argv) {
  const char *json = NULL;
  bool quick = false;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--json") == 0 && i + 1 < argc)
      json = argv[++i];
    else if (strcmp(argv[i], "--quick") == 0)
      quick = true;
    else {
      fprintf(stderr, "usage: %s [--json FILE] [--quick]\n", argv[0]);
      return 2;
    }
  }
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, -1);
  if (weft_init(&argc, &argv) != WEFT_OK) {
    fprintf(stderr, "weft_init: %s\n", weft_last_error());
    return 1;
  }
  ctx x = {0};
  x.n = weft_world_size();
  x.rank = weft_world_rank();
  int shape[1] = {x.n};
  const char *names[1] = {"x"};
  if (weft_mesh_create(1, shape, names, &x.mesh) != WEFT_OK) {
    fprintf(stderr, "%s\n", weft_last_error());
    return 1;
  }
  MPI_Comm_dup(MPI_COMM_WORLD, &x.comm);
  const int64_t max_bytes = 64ll << 20;
  x.send = malloc((size_t)max_bytes);
  x.recv = malloc((size_t)max_bytes);
  x.check = malloc((size_t)max_bytes);
  if (!x.send || !x.recv || !x.check) {
    fprintf(stderr, "no memory\n");
    return 1;
  }
  for (int64_t i = 0; i < max_bytes / 4; i++) x.send[i] = (float)((i * 7 + x.rank * 13) % 64);
  memset(x.recv, 0, (size_t)max_bytes);
  memset(x.check, 0, (size_t)max_bytes);

  FILE *jf = NULL;
  if (json && x.rank == 0 && !(jf = fopen(json, "w"))) {
    fprintf(stderr, "cannot write %s\n", json);
    return 1;
  }
  const char *sleepy = getenv("WEFT_BACKOFF");
  if (x.rank == 0) {
    printf("weft-bench-collectives: %d ranks, f32 sum, WEFT_BACKOFF=%s\n", x.n,
           sleepy ? sleepy : "auto");
    printf("%-15s %10s %9s %10s %10s %12s %7s %7s\n", "collective", "bytes", "rnd x it",
           "weft GB/s", "MPI GB/s", "weft us/MiB", "ratio", "best");
  }
  double min_ratio = 1e30, t_start = now();
  const double target = 0.004;                 /* seconds per timed batch */
  const double row_budget = quick ? 0.5 : 1.6; /* seconds of timed rounds per row */
  for (int64_t bytes = 4096; bytes <= max_bytes; bytes *= 4) {
    for (int c = 0; c < NCOLL; c++) {
      /* elements per block (AG, RS) or in total (AR); payload = bytes rounded down */
      int64_t count = c == AR ? bytes / 4 : bytes / 4 / x.n;
      int64_t payload = (c == AR ? count : count * x.n) * 4;
      /* warm-up and check: both must give the same bytes; the second
       * call of each estimates the time per call */
      if (run_one(&x, c, true, count, x.recv)) return 1;
      if (run_one(&x, c, false, count, x.check)) return 1;
      double tw = now();
      if (run_one(&x, c, true, count, x.recv)) return 1;
      tw = now() - tw;
      double tm = now();
      if (run_one(&x, c, false, count, x.check)) return 1;
      tm = now() - tm;
      size_t outb = (size_t)(c == AG ? payload : c == RS ? count * 4 : payload);
      int same = memcmp(x.recv, x.check, outb) == 0, all_same = same;
      double s = max_over_ranks(&x, same ? 0.0 : 1.0);
      all_same = s == 0.0;
      if (!all_same) {
        if (x.rank == 0)
          fprintf(stderr, "%s %lld bytes: weft and MPI results differ\n", coll_name[c],
                  (long long)payload);
        return 1;
      }
      double t1 = max_over_ranks(&x, tw > tm ? tw : tm);
      int iters = (int)(target / (t1 > 1e-6 ? t1 : 1e-6));
      if (iters < 1) iters = 1;
      if (iters > 2000) iters = 2000;
      int rounds = (int)(row_budget / (2 * iters * (t1 > 1e-6 ? t1 : 1e-6)));
      if (rounds < 7) rounds = 7;
      if (rounds > MAX_ROUNDS) rounds = MAX_ROUNDS;
      double tws[MAX_ROUNDS], tms[MAX_ROUNDS], ratios[MAX_ROUNDS], best[2], fast[2] = {1e30, 1e30};
      for (int r = 0; r < rounds; r++) {
        for (int k = 0; k < 2; k++) {
          bool use_weft = (r + k) % 2 == 0;
          double t = timed(&x, c, use_weft, count, iters);
          (use_weft ? tws : tms)[r] = t;
          if (t < fast[use_weft ? 0 : 1]) fast[use_weft ? 0 : 1] = t;
        }
        ratios[r] = tms[r] / tws[r];
      }
      best[0] = bench_median(tws, rounds);
      best[1] = bench_median(tms, rounds);
      double factor = c == AR ? 2.0 * (x.n - 1) / x.n : (double)(x.n - 1) / x.n;
      if (x.n == 1) factor = 1.0;
      double bw_w = (double)payload / best[0] * factor / 1e9;
      double bw_m = (double)payload / best[1] * factor / 1e9;
      double ratio = bench_median(ratios, rounds), ratio_best = fast[1] / fast[0];
      double us_per_mib = best[0] * 1e6 / ((double)payload / (1 << 20));
      if (bytes >= (1 << 20) && ratio < min_ratio) min_ratio = ratio;
      if (x.rank == 0) {
        printf("%-15s %10lld %4d x %-3d %10.3f %10.3f %12.1f %7.3f %7.3f\n", coll_name[c],
               (long long)payload, rounds, iters, bw_w, bw_m, us_per_mib, ratio, ratio_best);
        fflush(stdout);
        if (jf)
          fprintf(jf,
                  "{\"collective\": \"%s\", \"ranks\": %d, \"bytes\": %lld, \"iters\": %d, "
                  "\"rounds\": %d, \"weft_s\": %.9g, \"mpi_s\": %.9g, \"weft_busbw_gbs\": %.6g, "
                  "\"mpi_busbw_gbs\": %.6g, \"weft_us_per_mib\": %.6g, \"ratio\": %.6g, "
                  "\"ratio_best\": %.6g}\n",
                  coll_name[c], x.n, (long long)payload, iters, rounds, best[0], best[1], bw_w,
                  bw_m, us_per_mib, ratio, ratio_best);
      }
    }
  }
  if (x.rank == 0) {
    printf("total %.1f s\n", now() - t_start);
    printf("min ratio from 1 MiB: %.3f\n", min_ratio);
  }
  if (jf) fclose(jf);
  free(x.send);
  free(x.recv);
  free(x.check);
  MPI_Comm_free(&x.comm);
  weft_mesh_destroy(x.mesh);
  weft_finalize();
  return 0;
}
