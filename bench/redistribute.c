/* bench/redistribute.c — weft_dtensor_redistribute against the raw MPI
 * collective a hand-written program would use for the same move, in one
 * run, interleaved repetition by repetition:
 *
 *   S(0) -> R      MPI_Allgather
 *   P    -> R      MPI_Allreduce
 *   P    -> S(0)   MPI_Reduce_scatter_block
 *   S(0) -> S(1)   pack (n column blocks) + MPI_Alltoall
 *
 * on a 1-D mesh over all ranks, for f32 tensors of SIZE MiB (default 64,
 * global [rows, 4096]). Each time is the slowest rank's, after a barrier;
 * the table gives median times and the throughput ratio weft/MPI =
 * t_mpi / t_weft (median over the repetitions of the ratio within each
 * repetition, so load from other processes hits both sides alike) for: redistribute returning a new
 * DTensor per call (as DTensor.redistribute) with the buffer cache off, the same with the cache on
 * (weft_dtensor_set_buffer_cache, like PyTorch's caching allocator: results reuse freed blocks
 * instead of faulting in fresh pages), and redistribute_into a preallocated DTensor (a hand-written
 * program's buffer reuse). The MPI baseline reuses its buffers. The last
 * line is the minimum ratio over the moves of redistribute with the cache.
 *
 *     mpiexec -n 2 build/bench/weft-bench-redistribute [--no-mallopt] [SIZE_MIB] [REPS]
 */
#include "bench_util.h"
#include <malloc.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtensor.h"

/* Slowest rank's time. */
static double tmax(double t) {
  double m;
  MPI_Allreduce(&t, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return m;
}

static void die(const char *what) {
  fprintf(stderr, "[rank %d] %s: %s\n", weft_world_rank(), what, weft_last_error());
  MPI_Abort(MPI_COMM_WORLD, 1);
}

#define CHECK(x)                 \
  do {                           \
    if ((x) != WEFT_OK) die(#x); \
  } while (0)

enum { MOVE_S0_R, MOVE_P_R, MOVE_P_S0, MOVE_S0_S1, NMOVES };
static const char *move_name[NMOVES] = {"S(0) -> R", "P -> R", "P -> S(0)", "S(0) -> S(1)"};
static const char *mpi_name[NMOVES] = {"MPI_Allgather", "MPI_Allreduce", "MPI_Reduce_scatter_block",
                                       "pack + MPI_Alltoall"};

int main(int argc, char **argv) {
  /* As bench/collectives.c: MPICH allocates temporaries per call and a
   * fresh mmap'd 64 MiB block costs 16384 page faults (~30 us each on these
   * VMs); keep freed memory in the heap so both sides reuse it, as a long
   * training run would. --no-mallopt keeps glibc's defaults. */
  bool tune = !(argc > 1 && strcmp(argv[1], "--no-mallopt") == 0);
  if (!tune) {
    argc--;
    argv++;
  }
  if (tune) {
    mallopt(M_MMAP_MAX, 0);
    mallopt(M_TRIM_THRESHOLD, -1);
  }
  CHECK(weft_init(&argc, &argv));
  int rank = weft_world_rank(), n = weft_world_size();
  double mib = argc > 1 ? atof(argv[1]) : 64.0;
  int reps = argc > 2 ? atoi(argv[2]) : 10;
  if (reps < 1) reps = 1;
  const int64_t cols = 4096;
  int64_t rows = (int64_t)(mib * 1024 * 1024 / 4 / (double)cols);
  rows = rows / (n * n) * (n * n); /* even shards for every move */
  if (rows < n * n) rows = n * n;
  int64_t shape[2] = {rows, cols}, numel = rows * cols, lrows = rows / n;
  int mshape[1] = {n};
  const char *names[1] = {"world"};
  weft_mesh *mesh;
  CHECK(weft_mesh_create(1, mshape, names, &mesh));

  /* inputs */
  weft_placement S0[1] = {weft_shard(0)}, S1[1] = {weft_shard(1)}, R[1] = {weft_replicate()},
                 P[1] = {weft_partial(WEFT_OP_SUM)};
  weft_dtensor *ds0, *dp;
  CHECK(weft_dtensor_empty(mesh, WEFT_F32, 2, shape, S0, 1, &ds0));
  CHECK(weft_dtensor_fill_uniform(ds0, 1, 2, -1, 1));
  CHECK(weft_dtensor_empty(mesh, WEFT_F32, 2, shape, P, 1, &dp));
  CHECK(weft_dtensor_fill_uniform(dp, 1, 3, -1, 1));
  /* preallocated outputs for the _into variant */
  weft_dtensor *out_into[NMOVES];
  CHECK(weft_dtensor_empty(mesh, WEFT_F32, 2, shape, R, 1, &out_into[MOVE_S0_R]));
  CHECK(weft_dtensor_empty(mesh, WEFT_F32, 2, shape, R, 1, &out_into[MOVE_P_R]));
  CHECK(weft_dtensor_empty(mesh, WEFT_F32, 2, shape, S0, 1, &out_into[MOVE_P_S0]));
  CHECK(weft_dtensor_empty(mesh, WEFT_F32, 2, shape, S1, 1, &out_into[MOVE_S0_S1]));
  for (int m = 0; m < NMOVES; m++)
    CHECK(weft_tensor_fill(weft_dtensor_local(out_into[m]), 0)); /* touch the pages */
  /* MPI buffers, touched once like a hand-written program's */
  float *send_s0 = weft_dtensor_local(ds0)->data;
  float *send_p = weft_dtensor_local(dp)->data;
  float *recv_full = malloc((size_t)numel * 4);
  float *recv_shard = malloc((size_t)(numel / n) * 4);
  float *pack = malloc((size_t)(numel / n) * 4);
  if (!recv_full || !recv_shard || !pack) die("malloc");
  memset(recv_full, 0, (size_t)numel * 4);
  memset(recv_shard, 0, (size_t)(numel / n) * 4);
  memset(pack, 0, (size_t)(numel / n) * 4);

  /* tw: redistribute (new DTensor per call), cache off; tc: same with the
   * buffer cache on; ti: redistribute_into; tm / tm2: MPI in each loop */
  double *tw = calloc((size_t)(NMOVES * reps), sizeof *tw);
  double *tc = calloc((size_t)(NMOVES * reps), sizeof *tc);
  double *ti = calloc((size_t)(NMOVES * reps), sizeof *ti);
  double *tm = calloc((size_t)(NMOVES * reps), sizeof *tm);
  double *tm2 = calloc((size_t)(NMOVES * reps), sizeof *tm2);
  double *td = calloc((size_t)(NMOVES * reps), sizeof *td); /* weft's mesh collective alone */
  int64_t bcols = cols / n;
  bool verified = true;
  for (int loop = 0; loop < 2; loop++) {
    weft_dtensor_set_buffer_cache(loop == 1 ? (size_t)4 << 30 : 0);
    for (int rep = -1; rep < reps; rep++) { /* rep -1: warm-up (plans, pages, cache) */
      for (int m = 0; m < NMOVES; m++) {
        const weft_dtensor *in = (m == MOVE_P_R || m == MOVE_P_S0) ? dp : ds0;
        const weft_placement *to = m == MOVE_P_S0 ? S0 : m == MOVE_S0_S1 ? S1 : R;
        /* weft: a new DTensor per call, as DTensor.redistribute */
        weft_dtensor *out = NULL;
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        CHECK(weft_dtensor_redistribute(in, to, 1, &out));
        double t = tmax(MPI_Wtime() - t0);
        if (rep >= 0) (loop ? tc : tw)[m * reps + rep] = t;
        if (loop == 0) {
          /* weft: into a preallocated DTensor */
          MPI_Barrier(MPI_COMM_WORLD);
          t0 = MPI_Wtime();
          CHECK(weft_dtensor_redistribute_into(in, out_into[m], NULL));
          t = tmax(MPI_Wtime() - t0);
          if (rep >= 0) ti[m * reps + rep] = t;
        }
        if (rep == -1 &&
            !weft_tensor_equal(weft_dtensor_local(out), weft_dtensor_local(out_into[m])))
          verified = false;
        if (loop == 0) {
          /* the weft collective underneath, called directly (what the
           * DTensor layer adds is the difference to 'into') */
          MPI_Barrier(MPI_COMM_WORLD);
          t0 = MPI_Wtime();
          switch (m) {
            case MOVE_S0_R:
              CHECK(weft_all_gather(mesh, 0, send_s0, recv_full, numel / n, WEFT_F32, NULL));
              break;
            case MOVE_P_R:
              CHECK(
                  weft_all_reduce(mesh, 0, send_p, recv_full, numel, WEFT_F32, WEFT_OP_SUM, NULL));
              break;
            case MOVE_P_S0:
              CHECK(weft_reduce_scatter(mesh, 0, send_p, recv_shard, numel / n, WEFT_F32,
                                        WEFT_OP_SUM, NULL));
              break;
            case MOVE_S0_S1:
              for (int j = 0; j < n; j++)
                for (int64_t r = 0; r < lrows; r++)
                  memcpy(pack + ((size_t)j * (size_t)lrows + (size_t)r) * (size_t)bcols,
                         send_s0 + (size_t)r * (size_t)cols + (size_t)j * (size_t)bcols,
                         (size_t)bcols * 4);
              CHECK(weft_all_to_all(mesh, 0, pack, recv_shard, lrows * bcols, WEFT_F32, NULL));
              break;
          }
          t = tmax(MPI_Wtime() - t0);
          if (rep >= 0) td[m * reps + rep] = t;
        }
        weft_dtensor_destroy(out);
        /* raw MPI */
        MPI_Barrier(MPI_COMM_WORLD);
        t0 = MPI_Wtime();
        switch (m) {
          case MOVE_S0_R:
            MPI_Allgather(send_s0, (int)(numel / n), MPI_FLOAT, recv_full, (int)(numel / n),
                          MPI_FLOAT, MPI_COMM_WORLD);
            break;
          case MOVE_P_R:
            MPI_Allreduce(send_p, recv_full, (int)numel, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            break;
          case MOVE_P_S0:
            MPI_Reduce_scatter_block(send_p, recv_shard, (int)(numel / n), MPI_FLOAT, MPI_SUM,
                                     MPI_COMM_WORLD);
            break;
          case MOVE_S0_S1:
            /* block j = my rows x columns [j*bcols, (j+1)*bcols), contiguous */
            for (int j = 0; j < n; j++)
              for (int64_t r = 0; r < lrows; r++)
                memcpy(pack + ((size_t)j * (size_t)lrows + (size_t)r) * (size_t)bcols,
                       send_s0 + (size_t)r * (size_t)cols + (size_t)j * (size_t)bcols,
                       (size_t)bcols * 4);
            MPI_Alltoall(pack, (int)(lrows * bcols), MPI_FLOAT, recv_shard, (int)(lrows * bcols),
                         MPI_FLOAT, MPI_COMM_WORLD);
            break;
        }
        t = tmax(MPI_Wtime() - t0);
        if (rep >= 0) (loop ? tm2 : tm)[m * reps + rep] = t;
        if (rep == -1 && loop == 0) {
          /* the hand-written result is weft's */
          const float *w = weft_dtensor_local(out_into[m])->data;
          const float *h = (m == MOVE_P_S0 || m == MOVE_S0_S1) ? recv_shard : recv_full;
          int64_t cnt = (m == MOVE_P_S0 || m == MOVE_S0_S1) ? numel / n : numel;
          if (memcmp(w, h, (size_t)cnt * 4) != 0) verified = false;
        }
      }
    }
  }
  weft_dtensor_set_buffer_cache(0);
  int ok = verified, all_ok;
  MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  double min_ratio = 1e300, min_plain = 1e300, min_into = 1e300;
  if (rank == 0) {
    printf(
        "weft-bench-redistribute: %d ranks, f32[%lld, %lld] = %.1f MiB, %d reps (median of "
        "the slowest rank), malloc %s, results %s\n",
        n, (long long)rows, (long long)cols, (double)numel * 4 / (1024.0 * 1024.0), reps,
        tune ? "without mmap (mallopt)" : "glibc defaults",
        all_ok ? "identical to MPI's" : "DIFFER FROM MPI'S");
    printf(
        "ratio = t_mpi / t_weft; 'new' = redistribute returning a new DTensor (cache off), "
        "'cached' = the same with weft_dtensor_set_buffer_cache on, 'into' = "
        "redistribute_into a preallocated DTensor\n");
    printf(
        "'mesh' = the weft collective alone (weft_all_gather / _all_reduce / _reduce_scatter / "
        "pack + weft_all_to_all) on the same buffers\n");
    printf("%-13s %-25s %8s %8s %8s %8s %8s %7s %7s %7s %7s\n", "move", "baseline", "mpi ms",
           "mesh ms", "new ms", "cache ms", "into ms", "mesh", "new", "cached", "into");
  }
  double *rr = calloc((size_t)reps, sizeof *rr);
  for (int m = 0; m < NMOVES; m++) {
    /* ratios per repetition (MPI and weft ran back to back under the same
     * machine load), then their median */
    double rw, rc, ri, rd;
    for (int r = 0; r < reps; r++) rr[r] = tm[m * reps + r] / td[m * reps + r];
    rd = bench_median(rr, reps);
    for (int r = 0; r < reps; r++) rr[r] = tm[m * reps + r] / tw[m * reps + r];
    rw = bench_median(rr, reps);
    for (int r = 0; r < reps; r++) rr[r] = tm2[m * reps + r] / tc[m * reps + r];
    rc = bench_median(rr, reps);
    for (int r = 0; r < reps; r++) rr[r] = tm[m * reps + r] / ti[m * reps + r];
    ri = bench_median(rr, reps);
    double a = bench_median(&tm[m * reps], reps), a2 = bench_median(&tm2[m * reps], reps);
    double w = bench_median(&tw[m * reps], reps), c = bench_median(&tc[m * reps], reps),
           i = bench_median(&ti[m * reps], reps), dd = bench_median(&td[m * reps], reps);
    if (rc < min_ratio) min_ratio = rc;
    if (rw < min_plain) min_plain = rw;
    if (ri < min_into) min_into = ri;
    if (rank == 0)
      printf("%-13s %-25s %8.2f %8.2f %8.2f %8.2f %8.2f %7.3f %7.3f %7.3f %7.3f\n", move_name[m],
             mpi_name[m], 0.5 * (a + a2) * 1e3, dd * 1e3, w * 1e3, c * 1e3, i * 1e3, rd, rw, rc,
             ri);
  }
  free(rr);
  if (rank == 0) {
    printf("min ratio without the cache: %.3f; into a preallocated DTensor: %.3f\n", min_plain,
           min_into);
    printf("min redistribute ratio: %.3f\n", min_ratio);
  }
  free(tc);
  free(tm2);
  free(td);
  free(tw);
  free(ti);
  free(tm);
  free(recv_full);
  free(recv_shard);
  free(pack);
  for (int m = 0; m < NMOVES; m++) weft_dtensor_destroy(out_into[m]);
  weft_dtensor_destroy(ds0);
  weft_dtensor_destroy(dp);
  weft_mesh_destroy(mesh);
  weft_finalize();
  return all_ok ? 0 : 1;
}
