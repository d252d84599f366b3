/* weft-demo: builds a 2-D mesh over the world (default dp=2 x tp=2 on 4
 * ranks), prints it, runs every collective on every mesh dim, checks each
 * result exactly, and prints the comm accounting.
 *
 *     mpiexec -n 4 build/examples/weft-demo            # 2x2 (dp, tp)
 *     mpiexec -n 6 build/examples/weft-demo 2 3        # 2x3
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "weft.h"

static int failures = 0;

#define DEMO_CHECK(cond, ...)                                         \
  do {                                                                \
    if (!(cond)) {                                                    \
      failures++;                                                     \
      fprintf(stderr, "[rank %d] check failed: ", weft_world_rank()); \
      fprintf(stderr, __VA_ARGS__);                                   \
      fprintf(stderr, "\n");                                          \
    }                                                                 \
  } while (0)

static int demo_status(weft_status st, const char *what) {
  if (st != WEFT_OK) {
    fprintf(stderr, "%s failed: %s\n", what, weft_last_error());
    failures++;
    return 1;
  }
  return 0;
}

/* Value contributed by group member `member` at element i: distinct and
 * exactly representable, so sums check exactly. */
static float value(int member, int64_t i) { return (float)(member * 1000 + i); }

static void run_dim(weft_mesh *mesh, int dim) {
  const int64_t count = 1024;
  int n = weft_mesh_dim_size(mesh, dim);
  int me = weft_mesh_coord(mesh, dim);
  float *send = malloc(sizeof(float) * count * n);
  float *recv = malloc(sizeof(float) * count * n);

  /* all-gather: block j of the result comes from member j */
  for (int64_t i = 0; i < count; i++) send[i] = value(me, i);
  if (!demo_status(weft_all_gather(mesh, dim, send, recv, count, WEFT_F32, NULL), "all_gather"))
    for (int j = 0; j < n; j++)
      for (int64_t i = 0; i < count; i++)
        DEMO_CHECK(recv[j * count + i] == value(j, i), "all_gather[%d][%lld]", j, (long long)i);

  /* reduce-scatter (sum): member me receives sum over members of block me */
  for (int j = 0; j < n; j++)
    for (int64_t i = 0; i < count; i++) send[j * count + i] = value(me, j * count + i);
  if (!demo_status(weft_reduce_scatter(mesh, dim, send, recv, count, WEFT_F32, WEFT_OP_SUM, NULL),
                   "reduce_scatter"))
    for (int64_t i = 0; i < count; i++) {
      double want = 0;
      for (int m = 0; m < n; m++) want += value(m, me * count + i);
      DEMO_CHECK(recv[i] == (float)want, "reduce_scatter[%lld]", (long long)i);
    }

  /* all-reduce (max) in place */
  for (int64_t i = 0; i < count; i++) send[i] = value(me, i);
  if (!demo_status(weft_all_reduce(mesh, dim, send, send, count, WEFT_F32, WEFT_OP_MAX, NULL),
                   "all_reduce"))
    for (int64_t i = 0; i < count; i++)
      DEMO_CHECK(send[i] == value(n - 1, i), "all_reduce max[%lld]", (long long)i);

  /* broadcast from the last member */
  for (int64_t i = 0; i < count; i++) send[i] = value(me, i);
  if (!demo_status(weft_broadcast(mesh, dim, send, count, WEFT_F32, n - 1, NULL), "broadcast"))
    for (int64_t i = 0; i < count; i++)
      DEMO_CHECK(send[i] == value(n - 1, i), "broadcast[%lld]", (long long)i);

  /* all-to-all: block j goes to member j */
  for (int j = 0; j < n; j++)
    for (int64_t i = 0; i < count; i++) send[j * count + i] = value(me, j * count + i);
  if (!demo_status(weft_all_to_all(mesh, dim, send, recv, count, WEFT_F32, NULL), "all_to_all"))
    for (int j = 0; j < n; j++)
      for (int64_t i = 0; i < count; i++)
        DEMO_CHECK(recv[j * count + i] == value(j, me * count + i), "all_to_all[%d][%lld]", j,
                   (long long)i);

  demo_status(weft_barrier(mesh, dim, NULL), "barrier");
  free(send);
  free(recv);
}

int main(int argc, char **argv) {
  if (weft_init(&argc, &argv) != WEFT_OK) {
    fprintf(stderr, "weft_init: %s\n", weft_last_error());
    return 1;
  }
  int shape[2] = {2, 2};
  if (argc == 3) {
    shape[0] = atoi(argv[1]);
    shape[1] = atoi(argv[2]);
  }
  const char *names[2] = {"dp", "tp"};
  weft_mesh *mesh = NULL;
  if (weft_mesh_create(2, shape, names, &mesh) != WEFT_OK) {
    /* every rank sees the same error: no hang */
    fprintf(stderr, "%s\n", weft_last_error());
    weft_finalize();
    return 1;
  }
  if (weft_world_rank() == 0) {
    char buf[1024];
    weft_mesh_describe(mesh, buf, sizeof buf);
    printf("weft %s demo: %s\n", WEFT_VERSION, buf);
  }
  for (int d = 0; d < 2; d++) run_dim(mesh, d);

  int total = 0;
  MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (weft_world_rank() == 0) {
    printf("%-6s %-16s %8s %12s %12s\n", "dim", "collective", "calls", "bytes", "bus bytes");
    for (int d = 0; d < 2; d++)
      for (int k = 0; k < WEFT_COLL_KIND_COUNT; k++) {
        weft_comm_count c = weft_comm_stats(mesh, d, (weft_coll_kind)k);
        printf("%-6s %-16s %8lld %12lld %12lld\n", weft_mesh_dim_name(mesh, d),
               weft_coll_kind_name((weft_coll_kind)k), (long long)c.calls, (long long)c.bytes,
               (long long)c.bus_bytes);
      }
    printf("collectives on every dim: %s (%d failed checks)\n", total ? "FAILED" : "all correct",
           total);
  }
  weft_mesh_destroy(mesh);
  weft_finalize();
  return total ? 1 : 0;
}
