/* tests/nodes — the MPI side of the multi-node tests: started by
 * test_nodes.c through scripts/nodes.sh, on emulated nodes (one network,
 * UTS and IPC namespace each) or, for comparison, on one host.
 *
 *   identity R      node count, node index, local rank/size and the
 *                   shared-memory groups MPI reports agree with R ranks per
 *                   node; all-reduce and all-gather along both dims of a
 *                   (nodes x R) mesh, laid out node-major and transposed
 *   bandwidth BPS   one rank's point-to-point bandwidth to a rank on its node
 *                   and to one on another node; the latter cannot beat the
 *                   link's rate BPS (bits/s), so the traffic crosses the
 *                   shaped link and not shared memory
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "mesh.h"
#include "worker.h"

#define VALS 5

/* Rank r's inputs: VALS random values from a stream keyed by r. */
static void inputs_of(int r, double *v) {
  uint64_t s = weft_test_rng_state(0x5eed0000u + (uint64_t)r);
  for (int i = 0; i < VALS; i++) v[i] = weft_test_rng_sym(&s);
}

/* All-reduce and all-gather along each dim of mesh; expected values from
 * the world ranks weft_mesh_world_rank_of names for the dim's group. */
static void check_collectives(weft_mesh *mesh, const char *what) {
  int nd = weft_mesh_ndim(mesh);
  double mine[VALS];
  inputs_of(weft_world_rank(), mine);
  for (int d = 0; d < nd; d++) {
    int n = weft_mesh_dim_size(mesh, d);
    double sum[VALS], *gathered = malloc(sizeof(double) * VALS * (size_t)n);
    WOK(weft_all_reduce(mesh, d, mine, sum, VALS, WEFT_F64, WEFT_OP_SUM, NULL));
    WOK(weft_all_gather(mesh, d, mine, gathered, VALS, WEFT_F64, NULL));
    int coords[8];
    for (int k = 0; k < nd; k++) coords[k] = weft_mesh_coord(mesh, k);
    double want_sum[VALS] = {0};
    for (int j = 0; j < n; j++) {
      coords[d] = j;
      double theirs[VALS];
      inputs_of(weft_mesh_world_rank_of(mesh, coords), theirs);
      for (int i = 0; i < VALS; i++) {
        want_sum[i] += theirs[i];
        WCHECK(gathered[j * VALS + i] == theirs[i], "%s dim %d: gathered[%d][%d] %g want %g", what,
               d, j, i, gathered[j * VALS + i], theirs[i]);
      }
    }
    for (int i = 0; i < VALS; i++)
      WCHECK(fabs(sum[i] - want_sum[i]) <= 1e-14 * n, "%s dim %d: sum[%d] %.17g want %.17g", what,
             d, i, sum[i], want_sum[i]);
    free(gathered);
  }
}

static void case_identity(void) {
  WREQUIRE(weft_worker_argc >= 3, "usage: identity RANKS_PER_NODE");
  int per = atoi(weft_worker_argv[2]), rank = weft_world_rank(), world = weft_world_size();
  WREQUIRE(per >= 1 && world % per == 0, "world %d is not a multiple of %d", world, per);
  WCHECK(weft_node_count() == world / per, "node count %d want %d", weft_node_count(), world / per);
  WCHECK(weft_node_index() == rank / per, "node index %d want %d", weft_node_index(), rank / per);
  WCHECK(weft_local_rank() == rank % per, "local rank %d want %d", weft_local_rank(), rank % per);
  WCHECK(weft_local_size() == per, "local size %d want %d", weft_local_size(), per);
  /* the ranks MPI says share memory with this one are exactly its node */
  MPI_Comm shared;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &shared);
  int ns = 0;
  MPI_Comm_size(shared, &ns);
  WCHECK(ns == per, "shared-memory group has %d ranks want %d", ns, per);
  int *members = malloc(sizeof(int) * (size_t)ns);
  MPI_Request req;
  MPI_Iallgather(&rank, 1, MPI_INT, members, 1, MPI_INT, shared, &req);
  WOK(weft_wait_requests(1, &req, "shared-memory members"));
  for (int i = 0; i < ns; i++)
    WCHECK(members[i] / per == rank / per, "rank %d shares memory with rank %d of another node",
           rank, members[i]);
  free(members);
  MPI_Comm_free(&shared);
  /* a job across nodes on hosts without RDMA sends UCX messages eagerly
   * (weft_settings.tcp_eager), unless the environment chose otherwise */
  const char *user = getenv("UCX_RNDV_THRESH");
  bool auto_eager = !getenv("WEFT_TCP_EAGER") && world > per;
  bool rdma = access("/sys/class/infiniband", F_OK) == 0;
  WCHECK(!auto_eager || rdma || user || weft_get_settings()->tcp_eager_applied,
         "tcp_eager not applied across %d nodes (UCX_RNDV_THRESH unset)", world / per);
  if (weft_get_settings()->tcp_eager_applied)
    WCHECK(user && strcmp(user, "inf") == 0, "tcp_eager applied but UCX_RNDV_THRESH=%s",
           user ? user : "(unset)");
  char host[MPI_MAX_PROCESSOR_NAME];
  int hl = 0;
  MPI_Get_processor_name(host, &hl);
  printf("[rank %d] host %s node %d/%d local %d/%d\n", rank, host, weft_node_index(),
         weft_node_count(), weft_local_rank(), weft_local_size());
  /* a (node, local) mesh node-major, then transposed: local outermost */
  int shape[2] = {world / per, per};
  const char *names[2] = {"node", "local"};
  int order[2] = {1, 0};
  weft_mesh *m = NULL;
  WOK(weft_mesh_create(2, shape, names, &m));
  if (m) {
    check_collectives(m, "node-major");
    WOK(weft_mesh_destroy(m));
  }
  m = NULL;
  WOK(weft_mesh_create_ordered(2, shape, names, order, &m));
  if (m) {
    check_collectives(m, "local-major");
    WOK(weft_mesh_destroy(m));
  }
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Seconds for `reps` messages of `bytes` from rank 0 to `peer` (acknowledged). */
static double send_time(int peer, char *buf, int bytes, int reps) {
  int rank = weft_world_rank();
  MPI_Request req;
  MPI_Ibarrier(MPI_COMM_WORLD, &req);
  WOK(weft_wait_requests(1, &req, "barrier"));
  double t0 = now_s();
  for (int i = 0; i < reps; i++) {
    if (rank == 0)
      MPI_Isend(buf, bytes, MPI_BYTE, peer, 7, MPI_COMM_WORLD, &req);
    else if (rank == peer)
      MPI_Irecv(buf, bytes, MPI_BYTE, 0, 7, MPI_COMM_WORLD, &req);
    if (rank == 0 || rank == peer) WOK(weft_wait_requests(1, &req, "bandwidth message"));
  }
  char ack = 0;
  if (rank == peer) MPI_Isend(&ack, 1, MPI_BYTE, 0, 8, MPI_COMM_WORLD, &req);
  if (rank == 0) MPI_Irecv(&ack, 1, MPI_BYTE, peer, 8, MPI_COMM_WORLD, &req);
  if (rank == 0 || rank == peer) WOK(weft_wait_requests(1, &req, "bandwidth ack"));
  return now_s() - t0;
}

static void case_bandwidth(void) {
  WREQUIRE(weft_worker_argc >= 3, "usage: bandwidth LINK_BITS_PER_S");
  double link = atof(weft_worker_argv[2]) / 8; /* bytes/s */
  int per = weft_local_size(), world = weft_world_size();
  WREQUIRE(per >= 2 && world >= 2 * per, "needs 2 nodes of >= 2 ranks (local size %d, world %d)",
           per, world);
  int bytes = 4 << 20, reps = 4;
  char *buf = calloc((size_t)bytes, 1);
  (void)send_time(1, buf, bytes, 1); /* connect */
  (void)send_time(per, buf, bytes, 1);
  double intra = (double)bytes * reps / send_time(1, buf, bytes, reps);
  double inter = (double)bytes * reps / send_time(per, buf, bytes, reps);
  if (weft_world_rank() == 0) {
    printf("bandwidth: same node %.1f MB/s, across nodes %.1f MB/s, link %.1f MB/s\n", intra / 1e6,
           inter / 1e6, link / 1e6);
    WCHECK(inter <= 1.25 * link, "across nodes %.1f MB/s beats the %.1f MB/s link", inter / 1e6,
           link / 1e6);
    WCHECK(inter >= 0.2 * link, "across nodes %.1f MB/s is under a fifth of the %.1f MB/s link",
           inter / 1e6, link / 1e6);
  }
  free(buf);
}

static const weft_worker_case cases[] = {
    {"identity", case_identity},
    {"bandwidth", case_bandwidth},
    {0},
};

int main(int argc, char **argv) { return weft_worker_main(argc, argv, cases); }
