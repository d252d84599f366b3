/* Meshes laid onto world ranks in a chosen order (weft_mesh_create_ordered),
 * node identity (weft_node_count / weft_node_index) and the time accounted
 * to collectives (weft_comm_count.seconds). Cases:
 *
 *   ordered   every order of a 2-D and a 3-D mesh over the world (4 or 8
 *             ranks): coordinates, mesh ranks, world_rank_of and each dim's
 *             communicator against the formula; all-gather and all-reduce
 *             along every dim (and a flattened pair of dims) against the
 *             members' random values; bad orders fail on every rank.
 *   nodes     node count / index and local rank / size against $MESH_RPN
 *             ranks per node (default: the world is one node), or against
 *             $MESH_LR / $MESH_LS when LOCAL_RANK / LOCAL_WORLD_SIZE are set;
 *             on 4+ ranks, weft_mesh_dim_nodes of an (n/2 x 2) mesh in both
 *             layouts and of the world as one dim, and a 128 KiB blocking
 *             all-reduce along each dim (the world's dim presyncs across
 *             nodes): exact, accounted as one call.
 *   seconds   a collective with one slow rank (0.2 s late): the ranks that
 *             wait for it account >= 0.15 s to that (dim, kind), blocking,
 *             async + weft_work_wait, async + weft_work_test; calls and
 *             bytes as without timing; reset zeroes.
 */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mesh.h"
#include "worker.h"

/* ------------------------------------------------------------ ordered */

/* World rank of mesh coordinate c under `order` (slowest dim first). */
static int world_of_coord(int ndim, const int *shape, const int *order, const int *c) {
  int w = 0;
  for (int i = 0; i < ndim; i++) w = w * shape[order[i]] + c[order[i]];
  return w;
}

/* Coordinates of world rank w under `order`. */
static void coord_of_world(int w, int ndim, const int *shape, const int *order, int *c) {
  for (int i = ndim - 1; i >= 0; i--) {
    c[order[i]] = w % shape[order[i]];
    w /= shape[order[i]];
  }
}

/* Row-major rank over the mesh's own dims. */
static int ravel(int ndim, const int *shape, const int *c) {
  int r = 0;
  for (int d = 0; d < ndim; d++) r = r * shape[d] + c[d];
  return r;
}

/* This rank's random value k (never zero), and everyone else's alike. */
static double value_of(int world_rank, int k, uint64_t seed) {
  double v = weft_test_sym(weft_test_mix64(seed ^ ((uint64_t)world_rank << 20) ^ (uint64_t)k));
  return v >= 0 ? v + 0.25 : v - 0.25;
}

/* The world ranks of a communicator, in its rank order. */
static int comm_world_ranks(MPI_Comm c, int *out, int cap) {
  int n = 0;
  MPI_Comm_size(c, &n);
  if (n > cap) return -1;
  MPI_Group cg, wg;
  MPI_Comm_group(c, &cg);
  MPI_Comm_group(MPI_COMM_WORLD, &wg);
  int ids[64];
  for (int i = 0; i < n; i++) ids[i] = i;
  MPI_Group_translate_ranks(cg, n, ids, wg, out);
  MPI_Group_free(&cg);
  MPI_Group_free(&wg);
  return n;
}

/* Checks one group: its communicator's world ranks are `members` (n), and
 * an all-gather and an all-reduce over it give the members' values. */
static void check_group(const weft_mesh *m, int dim, const int *members, int n, int me,
                        uint64_t seed, const char *label) {
  int wr[64];
  int got = comm_world_ranks(weft_mesh_dim_comm(m, dim), wr, 64);
  WCHECK(got == n, "%s: comm size %d want %d", label, got, n);
  for (int i = 0; i < n && i < got; i++)
    WCHECK(wr[i] == members[i], "%s: comm rank %d is world rank %d, want %d", label, i, wr[i],
           members[i]);
  WCHECK(weft_mesh_dim_size(m, dim) == n, "%s: size %d want %d", label, weft_mesh_dim_size(m, dim),
         n);
  WCHECK(weft_mesh_coord(m, dim) == me, "%s: coord %d want %d", label, weft_mesh_coord(m, dim), me);
  enum { K = 5 };
  double mine[K], all[64 * K], sum[K];
  for (int k = 0; k < K; k++) mine[k] = value_of(weft_world_rank(), k, seed);
  WOK(weft_all_gather(m, dim, mine, all, K, WEFT_F64, NULL));
  WOK(weft_all_reduce(m, dim, mine, sum, K, WEFT_F64, WEFT_OP_SUM, NULL));
  for (int k = 0; k < K; k++) {
    long double acc = 0; /* the reference, above the f64 sum's precision */
    for (int i = 0; i < n; i++) {
      double v = value_of(members[i], k, seed);
      WCHECK(all[i * K + k] == v, "%s: all_gather block %d elem %d: %.17g want %.17g", label, i, k,
             all[i * K + k], v);
      acc += v;
    }
    double ref = (double)acc;
    WCHECK(fabs(sum[k] - ref) <= 1e-14 * n, "%s: all_reduce elem %d: %.17g want %.17g", label, k,
           sum[k], ref);
  }
}

/* One ordered mesh: layout against the formula, every dim's group, a
 * flattened pair of dims, and weft_mesh_world_rank_of everywhere. */
static void check_ordered(int ndim, const int *shape, const int *order, uint64_t seed) {
  static const char *const names3[3] = {"a", "b", "c"};
  char label[96];
  int n = snprintf(label, sizeof label, "shape");
  for (int d = 0; d < ndim; d++)
    n += snprintf(label + n, sizeof label - (size_t)n, " %d", shape[d]);
  n += snprintf(label + n, sizeof label - (size_t)n, " order");
  for (int d = 0; d < ndim; d++)
    n += snprintf(label + n, sizeof label - (size_t)n, " %d", order[d]);
  weft_mesh *m = NULL;
  WOK(weft_mesh_create_ordered(ndim, shape, names3, order, &m));
  WREQUIRE(m, "%s: no mesh", label);
  int me = weft_world_rank(), c[3];
  coord_of_world(me, ndim, shape, order, c);
  for (int d = 0; d < ndim; d++) {
    WCHECK(weft_mesh_coord(m, d) == c[d], "%s: coord[%d] %d want %d", label, d,
           weft_mesh_coord(m, d), c[d]);
    WCHECK(!strcmp(weft_mesh_dim_name(m, d), names3[d]), "%s: dim %d named %s", label, d,
           weft_mesh_dim_name(m, d));
  }
  WCHECK(weft_mesh_rank(m) == ravel(ndim, shape, c), "%s: mesh rank %d want %d", label,
         weft_mesh_rank(m), ravel(ndim, shape, c));
  /* every coordinate's world rank */
  int size = weft_mesh_size(m);
  for (int r = 0; r < size; r++) {
    int x[3];
    for (int d = ndim - 1, t = r; d >= 0; d--) {
      x[d] = t % shape[d];
      t /= shape[d];
    }
    int want = world_of_coord(ndim, shape, order, x);
    WCHECK(weft_mesh_world_rank_of(m, x) == want, "%s: world_rank_of(mesh rank %d) %d want %d",
           label, r, weft_mesh_world_rank_of(m, x), want);
  }
  /* the whole mesh's communicator is in mesh-rank order */
  int wr[64];
  int got = comm_world_ranks(weft_mesh_comm(m), wr, 64);
  WCHECK(got == size, "%s: whole comm size %d", label, got);
  for (int r = 0; r < got; r++) {
    int x[3];
    for (int d = ndim - 1, t = r; d >= 0; d--) {
      x[d] = t % shape[d];
      t /= shape[d];
    }
    WCHECK(wr[r] == world_of_coord(ndim, shape, order, x), "%s: whole comm rank %d is %d", label, r,
           wr[r]);
  }
  for (int d = 0; d < ndim; d++) {
    int members[64], x[3];
    memcpy(x, c, sizeof x);
    for (int i = 0; i < shape[d]; i++) {
      x[d] = i;
      members[i] = world_of_coord(ndim, shape, order, x);
    }
    char dl[128];
    snprintf(dl, sizeof dl, "%s dim %d", label, d);
    check_group(m, d, members, shape[d], c[d], seed + (uint64_t)d, dl);
  }
  /* a sub-mesh of the last dims in reverse order, and a flattened pair */
  if (ndim >= 2) {
    const char *pair[2] = {names3[ndim - 1], names3[0]};
    weft_mesh *sub = NULL, *flat = NULL;
    WOK(weft_mesh_submesh(m, 2, pair, &sub));
    WOK(weft_mesh_flatten(m, 2, pair, "flat", &flat));
    if (sub && flat) {
      int x[3], members[64], k = 0;
      memcpy(x, c, sizeof x);
      for (int i = 0; i < shape[ndim - 1]; i++)
        for (int j = 0; j < shape[0]; j++) {
          x[ndim - 1] = i;
          x[0] = j;
          members[k++] = world_of_coord(ndim, shape, order, x);
        }
      char dl[128];
      snprintf(dl, sizeof dl, "%s flat(%s,%s)", label, pair[0], pair[1]);
      check_group(flat, 0, members, k, c[ndim - 1] * shape[0] + c[0], seed + 17, dl);
      int sc[2] = {c[ndim - 1], c[0]};
      WCHECK(weft_mesh_world_rank_of(sub, sc) == me, "%s: sub-mesh world_rank_of(own) %d", label,
             weft_mesh_world_rank_of(sub, sc));
    }
    WOK(weft_mesh_destroy(flat));
    WOK(weft_mesh_destroy(sub));
  }
  WOK(weft_mesh_destroy(m));
}

/* Heap's algorithm: every permutation of p[0..n). */
static void each_order(int ndim, const int *shape, int *p, int k, uint64_t seed, int *count) {
  if (k == 1) {
    check_ordered(ndim, shape, p, seed + (uint64_t)*count * 101);
    (*count)++;
    return;
  }
  for (int i = 0; i < k; i++) {
    each_order(ndim, shape, p, k - 1, seed, count);
    int j = k % 2 ? 0 : i;
    int t = p[j];
    p[j] = p[k - 1];
    p[k - 1] = t;
  }
}

static void expect_invalid(weft_status st, weft_status want, const char *needle, const char *what) {
  WCHECK(st == want, "%s: got %s want %s (%s)", what, weft_status_str(st), weft_status_str(want),
         weft_last_error());
  WCHECK(strstr(weft_last_error(), needle) != NULL, "%s: message '%s' lacks '%s'", what,
         weft_last_error(), needle);
}

static void case_ordered(void) {
  int n = weft_world_size();
  uint64_t seed = weft_test_seed(4242);
  int s2[2], s3[3];
  if (n == 4) {
    s2[0] = 2, s2[1] = 2;
    s3[0] = 2, s3[1] = 1, s3[2] = 2;
  } else if (n == 8) {
    s2[0] = 2, s2[1] = 4;
    s3[0] = 2, s3[1] = 2, s3[2] = 2;
  } else {
    s2[0] = 1, s2[1] = n;
    s3[0] = 1, s3[1] = n, s3[2] = 1;
  }
  int p2[2] = {0, 1}, p3[3] = {0, 1, 2}, count = 0;
  each_order(2, s2, p2, 2, seed, &count);
  each_order(3, s3, p3, 3, seed, &count);
  WCHECK(count == 8, "%d orders checked, want 2 + 6", count);
  if (weft_world_rank() == 0)
    printf("ordered: %d orders of %dx%d and %dx%dx%d on %d ranks checked (seed %llu)\n", count,
           s2[0], s2[1], s3[0], s3[1], s3[2], n, (unsigned long long)seed);

  /* {dp=2, tp=2}, order {1, 0}: the example of mesh.h */
  if (n == 4) {
    const char *nm[2] = {"dp", "tp"};
    int shape[2] = {2, 2}, order[2] = {1, 0};
    weft_mesh *m = NULL;
    WOK(weft_mesh_create_ordered(2, shape, nm, order, &m));
    int me = weft_world_rank();
    WCHECK(weft_mesh_coord(m, 1) == me / 2, "tp coord %d", weft_mesh_coord(m, 1));
    int tpw[4];
    comm_world_ranks(weft_mesh_dim_comm(m, 1), tpw, 4);
    WCHECK(tpw[0] == me % 2 && tpw[1] == me % 2 + 2, "tp group {%d, %d}", tpw[0], tpw[1]);
    char buf[128];
    weft_mesh_describe(m, buf, sizeof buf);
    WCHECK(!strcmp(buf, "mesh (dp=2, tp=2): [[0, 2], [1, 3]]"), "describe: %s", buf);
    WOK(weft_mesh_destroy(m));
  }

  /* bad orders: every rank fails alike, nothing is left waiting */
  const char *nm[2] = {"x", "y"};
  int shape[2] = {1, n};
  weft_mesh *m = (weft_mesh *)0x1;
  int dup[2] = {0, 0}, out[2] = {0, 2}, neg[2] = {-1, 0};
  expect_invalid(weft_mesh_create_ordered(2, shape, nm, NULL, &m), WEFT_ERR_INVALID,
                 "order is NULL", "NULL order");
  WCHECK(m == NULL, "out not cleared on error");
  expect_invalid(weft_mesh_create_ordered(2, shape, nm, dup, &m), WEFT_ERR_INVALID,
                 "order[1] = 0 repeats a dim", "repeated dim");
  expect_invalid(weft_mesh_create_ordered(2, shape, nm, out, &m), WEFT_ERR_INVALID,
                 "order[1] = 2 is not a dim", "dim out of range");
  expect_invalid(weft_mesh_create_ordered(2, shape, nm, neg, &m), WEFT_ERR_INVALID,
                 "order[0] = -1 is not a dim", "negative dim");
  int bad_shape[2] = {2, n};
  int ok_order[2] = {1, 0};
  expect_invalid(weft_mesh_create_ordered(2, bad_shape, nm, ok_order, &m), WEFT_ERR_INVALID,
                 "product of shape", "shape product");
  /* ranks disagreeing on the order: a mismatch everywhere, not a hang */
  if (n > 1) {
    int mine[2] = {weft_world_rank() == n - 1 ? 0 : 1, weft_world_rank() == n - 1 ? 1 : 0};
    char needle[64];
    snprintf(needle, sizeof needle, "world ranks %d differ", n - 1);
    expect_invalid(weft_mesh_create_ordered(2, shape, nm, mine, &m), WEFT_ERR_MISMATCH, needle,
                   "orders differ");
  }
  /* the identity order is weft_mesh_create's layout; the world still works */
  WOK(weft_mesh_create_ordered(2, shape, nm, (int[2]){0, 1}, &m));
  WCHECK(m && weft_mesh_coord(m, 1) == weft_world_rank(), "identity order: coord %d",
         weft_mesh_coord(m, 1));
  WOK(weft_mesh_destroy(m));
}

/* -------------------------------------------------------------- nodes */

static int env_int(const char *name, int fallback) {
  const char *v = getenv(name);
  return v && *v ? atoi(v) : fallback;
}

static void case_nodes(void) {
  int me = weft_world_rank(), n = weft_world_size();
  int rpn = env_int("MESH_RPN", n);
  WREQUIRE(rpn > 0 && n % rpn == 0, "MESH_RPN=%d does not divide %d", rpn, n);
  int want_count = n / rpn, want_index = me / rpn;
  WCHECK(weft_node_count() == want_count, "node count %d want %d", weft_node_count(), want_count);
  WCHECK(weft_node_index() == want_index, "node index %d want %d", weft_node_index(), want_index);
  int lr = env_int("MESH_LR", me % rpn), ls = env_int("MESH_LS", rpn);
  WCHECK(weft_local_rank() == lr, "local rank %d want %d", weft_local_rank(), lr);
  WCHECK(weft_local_size() == ls, "local size %d want %d", weft_local_size(), ls);
  char host[MPI_MAX_PROCESSOR_NAME + 1] = "";
  int len = 0;
  MPI_Get_processor_name(host, &len);
  printf("[rank %d] host %s: node %d of %d, local rank %d of %d\n", me, host, weft_node_index(),
         weft_node_count(), weft_local_rank(), weft_local_size());
  if (n % 2 == 0 && n >= 4) {
    /* (n/2 x 2) in both layouts, and the whole world as one dim: each dim
     * spans the nodes its group's world ranks lie on (rank r on node
     * r / rpn); the world's dim holds every rank of its nodes (presync) */
    int shape[2] = {n / 2, 2}, order[2] = {1, 0};
    const char *names[2] = {"a", "b"};
    for (int layout = 0; layout < 3; layout++) {
      weft_mesh *m = NULL;
      int nd = layout < 2 ? 2 : 1;
      if (layout == 2) shape[0] = n;
      WOK(layout == 0   ? weft_mesh_create(2, shape, names, &m)
          : layout == 1 ? weft_mesh_create_ordered(2, shape, names, order, &m)
                        : weft_mesh_create(1, shape, names, &m));
      if (!m) continue;
      for (int d = 0; d < nd; d++) {
        int coords[2] = {weft_mesh_coord(m, 0), nd > 1 ? weft_mesh_coord(m, 1) : 0}, want = 0;
        bool seen[64] = {false};
        for (int j = 0; j < shape[d]; j++) {
          coords[d] = j;
          int node = weft_mesh_world_rank_of(m, coords) / rpn;
          if (node >= 0 && node < 64 && !seen[node]) want++, seen[node] = true;
        }
        WCHECK(weft_mesh_dim_nodes(m, d) == want, "layout %d dim %s spans %d nodes want %d", layout,
               names[d], weft_mesh_dim_nodes(m, d), want);
        /* a blocking all-reduce above WEFT_PRESYNC_BYTES (the group meets
         * first when it spans nodes): exact, and accounted as one call */
        enum { BIG = 1 << 15 }; /* 128 KiB of f32 */
        float *buf = malloc(sizeof(float) * BIG);
        WREQUIRE(buf != NULL, "no memory");
        for (int i = 0; i < BIG; i++) buf[i] = (float)((me + 1) * (i % 7));
        weft_comm_stats_reset(m);
        WOK(weft_all_reduce(m, d, buf, buf, BIG, WEFT_F32, WEFT_OP_SUM, NULL));
        float ranks_sum = 0;
        for (int j = 0; j < shape[d]; j++) {
          coords[d] = j;
          ranks_sum += (float)(weft_mesh_world_rank_of(m, coords) + 1);
        }
        int bad = 0;
        for (int i = 0; i < BIG; i++) bad += buf[i] != ranks_sum * (float)(i % 7);
        WCHECK(bad == 0, "layout %d dim %s: %d of %d sums wrong", layout, names[d], bad, BIG);
        weft_comm_count c = weft_comm_stats(m, d, WEFT_COLL_ALL_REDUCE);
        WCHECK(c.calls == 1 && c.bytes == (int64_t)sizeof(float) * BIG,
               "layout %d dim %s: accounted %lld calls %lld bytes", layout, names[d],
               (long long)c.calls, (long long)c.bytes);
        free(buf);
      }
      WCHECK(weft_mesh_dim_nodes(m, nd) == -1, "dim %d of a %d-D mesh gave %d", nd, nd,
             weft_mesh_dim_nodes(m, nd));
      WOK(weft_mesh_destroy(m));
    }
  }
}

/* ------------------------------------------------------------ seconds */

static void sleep_s(double s) {
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  nanosleep(&ts, NULL);
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Only (dim, kind) may have counted; the rest of the root's rows are 0. */
static void check_only(const weft_mesh *m, int dim, weft_coll_kind kind, int64_t calls,
                       int64_t bytes, const char *what) {
  for (int d = 0; d < weft_mesh_ndim(m); d++)
    for (int k = 0; k < WEFT_COLL_KIND_COUNT; k++) {
      weft_comm_count c = weft_comm_stats(m, d, (weft_coll_kind)k);
      bool on = d == dim && k == (int)kind;
      WCHECK(c.seconds >= 0, "%s: dim %d %s seconds %g < 0", what, d,
             weft_coll_kind_name((weft_coll_kind)k), c.seconds);
      WCHECK(c.calls == (on ? calls : 0) && c.bytes == (on ? bytes : 0),
             "%s: dim %d %s: calls %lld bytes %lld, want %lld / %lld", what, d,
             weft_coll_kind_name((weft_coll_kind)k), (long long)c.calls, (long long)c.bytes,
             (long long)(on ? calls : 0), (long long)(on ? bytes : 0));
      if (!on)
        WCHECK(c.seconds == 0, "%s: dim %d %s seconds %g", what, d,
               weft_coll_kind_name((weft_coll_kind)k), c.seconds);
    }
}

static void case_seconds(void) {
  int me = weft_world_rank(), n = weft_world_size();
  WREQUIRE(n == 4, "seconds: run on 4 ranks (got %d)", n);
  const double late = 0.2, floor = 0.15;
  const char *nm[2] = {"dp", "tp"};
  int shape[2] = {2, 2};
  weft_mesh *m = NULL;
  WOK(weft_mesh_create(2, shape, nm, &m));
  WREQUIRE(m, "no mesh");
  uint64_t seed = weft_test_seed(99);
  enum { K = 64 };
  double buf[K], gat[2 * K];
  for (int i = 0; i < K; i++) buf[i] = value_of(me, i, seed);
  /* tp groups are {0, 1} and {2, 3}: world rank 0 is late, rank 1 waits */
  bool waits = me == 1;

  /* blocking all-reduce over tp */
  weft_comm_stats_reset(m);
  if (me == 0) sleep_s(late);
  WOK(weft_all_reduce(m, 1, buf, buf, K, WEFT_F64, WEFT_OP_SUM, NULL));
  weft_comm_count c = weft_comm_stats(m, 1, WEFT_COLL_ALL_REDUCE);
  check_only(m, 1, WEFT_COLL_ALL_REDUCE, 1, K * 8, "blocking");
  if (waits) WCHECK(c.seconds >= floor, "blocking: waiting rank accounted %g s", c.seconds);
  double blocking_s = c.seconds;
  weft_comm_count sum = weft_comm_stats_dim(m, 1);
  WCHECK(sum.seconds == c.seconds, "stats_dim seconds %g, kind %g", sum.seconds, c.seconds);

  /* async all-gather + weft_work_wait: the wait holds the rank up */
  weft_comm_stats_reset(m);
  c = weft_comm_stats(m, 1, WEFT_COLL_ALL_REDUCE);
  WCHECK(c.seconds == 0 && c.calls == 0, "reset left %g s, %lld calls", c.seconds,
         (long long)c.calls);
  if (me == 0) sleep_s(late);
  weft_work *w = NULL;
  WOK(weft_all_gather(m, 1, buf, gat, K, WEFT_F64, &w));
  WOK(weft_work_wait(w));
  c = weft_comm_stats(m, 1, WEFT_COLL_ALL_GATHER);
  check_only(m, 1, WEFT_COLL_ALL_GATHER, 1, 2 * K * 8, "async + wait");
  if (waits) WCHECK(c.seconds >= floor, "async + wait: waiting rank accounted %g s", c.seconds);
  double wait_s = c.seconds;

  /* async all-gather + weft_work_test between slices of the rank's own
   * work: only the time inside the posting call and the tests counts */
  weft_comm_stats_reset(m);
  if (me == 0) sleep_s(late);
  WOK(weft_all_gather(m, 1, buf, gat, K, WEFT_F64, &w));
  double t0 = now();
  bool done = false;
  int tests = 0;
  while (!done) {
    sleep_s(0.002); /* overlapped work */
    WOK(weft_work_test(w, &done));
    tests++;
    if (now() - t0 > 30) break;
  }
  double span = now() - t0;
  c = weft_comm_stats(m, 1, WEFT_COLL_ALL_GATHER);
  check_only(m, 1, WEFT_COLL_ALL_GATHER, 1, 2 * K * 8, "async + test");
  if (waits) {
    WCHECK(span >= floor, "async + test: the collective completed after %g s only", span);
    WCHECK(c.seconds < 0.5 * span,
           "async + test: %g s accounted of %g s (%d tests): overlap "
           "counted",
           c.seconds, span, tests);
  }
  printf("[rank %d] seconds: blocking %.3f, async+wait %.3f, async+test %.4f of %.3f (%d tests)\n",
         me, blocking_s, wait_s, c.seconds, span, tests);

  /* a collective on dp counts on dp only; reset zeroes every row */
  weft_comm_stats_reset(m);
  WOK(weft_barrier(m, 0, NULL));
  check_only(m, 0, WEFT_COLL_BARRIER, 1, 0, "barrier");
  weft_comm_stats_reset(m);
  check_only(m, 0, WEFT_COLL_BARRIER, 0, 0, "after reset");
  WCHECK(weft_comm_stats(m, 0, WEFT_COLL_BARRIER).seconds == 0, "reset left seconds");
  WOK(weft_mesh_destroy(m));
}

static const weft_worker_case cases[] = {
    {"ordered", case_ordered},
    {"nodes", case_nodes},
    {"seconds", case_seconds},
    {NULL, NULL},
};

int main(int argc, char **argv) { return weft_worker_main(argc, argv, cases); }
