/* MPI side of tests/mesh: every case runs on every rank (see worker.h).
 *
 * Data: element i contributed by world rank r is val(r, i, salt, dt), an
 * integer from a hash of (seed, r, i, salt) in a range where every sum over
 * at most 8 ranks is exact in dt (bf16 [-8, 8), f16 [-64, 64), u8 [0, 16),
 * f32 [-2^16, 2^16), i32 [-10^6, 10^6), i64 and f64 [-2^40, 2^40)). Each rank
 * computes every other rank's contribution itself, so the expected result
 * of a collective is a direct loop over the group's members, whose world
 * ranks come from the row-major layout formula here (not from the library).
 *
 * Cases:
 *   collectives SHAPE   every collective on every dim (and sub-meshes,
 *                       flattened dims, accounting) of a mesh of SHAPE
 *                       ("2x2x2"; world size = product)
 *   errors              bad inputs, WEFT_DEBUG mismatches, timeouts (2x2)
 *   big_count           count > INT_MAX (2 ranks)
 */
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <time.h>

#include "mesh.h"
#include "worker.h"

static unsigned long seed = 12345;

/* ------------------------------------------------------------ values */

static int64_t val(int wr, int64_t i, int salt, weft_dtype dt) {
  uint64_t h =
      weft_test_mix64(seed ^ weft_test_mix64((uint64_t)wr * 1000003u + (uint64_t)salt * 7919u) ^
                      weft_test_mix64((uint64_t)i));
  int64_t lo, span;
  switch (dt) {
    case WEFT_BF16:
      lo = -8, span = 16;
      break;
    case WEFT_F16:
      lo = -64, span = 128;
      break;
    case WEFT_U8:
      lo = 0, span = 16;
      break;
    case WEFT_F32:
      lo = -(1 << 16), span = 1 << 17;
      break;
    case WEFT_I32:
      lo = -1000000, span = 2000000;
      break;
    default:
      lo = -(1ll << 40), span = 1ll << 41;
      break;
  }
  return lo + (int64_t)(h % (uint64_t)span);
}

static void put(void *b, weft_dtype dt, int64_t i, double v) {
  switch (dt) {
    case WEFT_F32:
      ((float *)b)[i] = (float)v;
      break;
    case WEFT_F64:
      ((double *)b)[i] = v;
      break;
    case WEFT_BF16:
      ((uint16_t *)b)[i] = weft_f32_to_bf16((float)v);
      break;
    case WEFT_F16:
      ((uint16_t *)b)[i] = weft_f32_to_f16((float)v);
      break;
    case WEFT_I32:
      ((int32_t *)b)[i] = (int32_t)v;
      break;
    case WEFT_I64:
      ((int64_t *)b)[i] = (int64_t)v;
      break;
    case WEFT_U8:
      ((uint8_t *)b)[i] = (uint8_t)v;
      break;
    default:
      break;
  }
}

static double get(const void *b, weft_dtype dt, int64_t i) {
  switch (dt) {
    case WEFT_F32:
      return ((const float *)b)[i];
    case WEFT_F64:
      return ((const double *)b)[i];
    case WEFT_BF16:
      return weft_bf16_to_f32(((const uint16_t *)b)[i]);
    case WEFT_F16:
      return weft_f16_to_f32(((const uint16_t *)b)[i]);
    case WEFT_I32:
      return ((const int32_t *)b)[i];
    case WEFT_I64:
      return (double)((const int64_t *)b)[i];
    case WEFT_U8:
      return ((const uint8_t *)b)[i];
    default:
      return NAN;
  }
}

/* Reference reduction of the members' values (exact in double), then
 * AVG with the dtype's own arithmetic, as weft does: sum / n in dt. */
static double ref_reduce(const int *members, int n, int64_t i, int salt, weft_dtype dt,
                         weft_reduce_op op) {
  double acc = (double)val(members[0], i, salt, dt);
  for (int j = 1; j < n; j++) {
    double x = (double)val(members[j], i, salt, dt);
    if (op == WEFT_OP_MAX)
      acc = x > acc ? x : acc;
    else if (op == WEFT_OP_MIN)
      acc = x < acc ? x : acc;
    else
      acc += x;
  }
  if (op != WEFT_OP_AVG) return acc;
  switch (dt) {
    case WEFT_F32:
      return (float)acc / (float)n;
    case WEFT_F64:
      return acc / n;
    case WEFT_BF16:
      return weft_bf16_to_f32(weft_f32_to_bf16((float)acc / (float)n));
    case WEFT_F16:
      return weft_f16_to_f32(weft_f32_to_f16((float)acc / (float)n));
    default:
      return (double)((int64_t)acc / n); /* C truncation, as integer AVG does */
  }
}

static void *xalloc(int64_t elems, weft_dtype dt) {
  size_t b = (size_t)(elems > 0 ? elems : 1) * weft_dtype_size(dt);
  void *p = malloc(b);
  if (p) memset(p, 0xA5, b); /* garbage, never zeros */
  return p;
}

static const weft_dtype all_dtypes[] = {WEFT_F32, WEFT_F64, WEFT_BF16, WEFT_F16,
                                        WEFT_I32, WEFT_I64, WEFT_U8};
#define NDT ((int)(sizeof all_dtypes / sizeof all_dtypes[0]))

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ------------------------------------------------------------ layout */

/* The expected group of a rank: its members' world ranks in coordinate
 * order and its own position, from the row-major formula. */
typedef struct grp {
  int n, me;
  int members[64];
} grp;

static void unravel(int r, int ndim, const int *shape, int *c) {
  for (int d = ndim - 1; d >= 0; d--) {
    c[d] = r % shape[d];
    r /= shape[d];
  }
}
static int ravel(int ndim, const int *shape, const int *c) {
  int r = 0;
  for (int d = 0; d < ndim; d++) r = r * shape[d] + c[d];
  return r;
}

/* Group spanning root dims src[0..k) (row-major over them) through `rank`. */
static grp expect_group(int rank, int ndim, const int *shape, int k, const int *src) {
  grp g = {1, 0, {0}};
  int c[8], mine[8];
  unravel(rank, ndim, shape, mine);
  for (int i = 0; i < k; i++) {
    g.n *= shape[src[i]];
    g.me = g.me * shape[src[i]] + mine[src[i]];
  }
  for (int f = 0; f < g.n; f++) {
    memcpy(c, mine, sizeof c);
    int t = f;
    for (int i = k - 1; i >= 0; i--) {
      c[src[i]] = t % shape[src[i]];
      t /= shape[src[i]];
    }
    g.members[f] = ravel(ndim, shape, c);
  }
  return g;
}

/* The library's view of a group must be the expected one: size, coord,
 * and the world ranks of its communicator. */
static void check_group_matches(const weft_mesh *m, int dim, const grp *g, const char *label) {
  WCHECK(weft_mesh_dim_size(m, dim) == g->n, "%s: dim size %d want %d", label,
         weft_mesh_dim_size(m, dim), g->n);
  WCHECK(weft_mesh_coord(m, dim) == g->me, "%s: coord %d want %d", label, weft_mesh_coord(m, dim),
         g->me);
  MPI_Comm c = weft_mesh_dim_comm(m, dim);
  WREQUIRE(c != MPI_COMM_NULL, "%s: no communicator", label);
  int n = 0;
  MPI_Comm_size(c, &n);
  WREQUIRE(n == g->n, "%s: comm size %d want %d", label, n, g->n);
  MPI_Group cg, wg;
  MPI_Comm_group(c, &cg);
  MPI_Comm_group(MPI_COMM_WORLD, &wg);
  int ids[64], wr[64];
  for (int i = 0; i < n; i++) ids[i] = i;
  MPI_Group_translate_ranks(cg, n, ids, wg, wr);
  MPI_Group_free(&cg);
  MPI_Group_free(&wg);
  for (int i = 0; i < n; i++)
    WCHECK(wr[i] == g->members[i], "%s: comm rank %d is world rank %d, want %d", label, i, wr[i],
           g->members[i]);
}

/* ------------------------------------------------ collectives on a group */

#define CHECKV(got, want, ...)                                                     \
  do {                                                                             \
    double got_ = (got), want_ = (want);                                           \
    if (got_ != want_) {                                                           \
      WCHECK(got_ == want_, __VA_ARGS__);                                          \
      fprintf(stderr, "    got %.17g want %.17g (seed %lu)\n", got_, want_, seed); \
      bad++;                                                                       \
    }                                                                              \
  } while (0)

/* Stops checking a buffer after a few failures so a broken collective does
 * not flood the log. */
#define TOO_BAD (bad > 3)

static int salt_counter = 0;

static void t_all_gather(const weft_mesh *m, int dim, const grp *g, weft_dtype dt, int64_t c,
                         bool async, bool in_place, const char *label) {
  int salt = ++salt_counter, bad = 0;
  void *recv = xalloc(g->n * c, dt), *send = in_place ? NULL : xalloc(c, dt);
  void *s = in_place ? (char *)recv + (size_t)(g->me * c) * weft_dtype_size(dt) : send;
  for (int64_t i = 0; i < c; i++) put(s, dt, i, (double)val(weft_world_rank(), i, salt, dt));
  weft_work *w = NULL;
  WOK(weft_all_gather(m, dim, s, recv, c, dt, async ? &w : NULL));
  if (async) WOK(weft_work_wait(w));
  for (int j = 0; j < g->n && !TOO_BAD; j++)
    for (int64_t i = 0; i < c && !TOO_BAD; i++)
      CHECKV(get(recv, dt, j * c + i), (double)val(g->members[j], i, salt, dt),
             "%s all_gather %s c=%" PRId64 "%s%s: block %d elem %" PRId64, label,
             weft_dtype_name(dt), c, async ? " async" : "", in_place ? " in-place" : "", j, i);
  free(recv);
  free(send);
}

/* counts[j] = (j * 5 + k) % 4: zeros at some ranks, all-zero when k = -1 */
static void t_all_gather_v(const weft_mesh *m, int dim, const grp *g, weft_dtype dt, int k,
                           bool async, bool in_place, const char *label) {
  int salt = ++salt_counter, bad = 0;
  int64_t counts[64], displ[64], total = 0;
  for (int j = 0; j < g->n; j++) {
    counts[j] = k < 0 ? 0 : (j * 5 + k) % 4;
    displ[j] = total;
    total += counts[j];
  }
  int64_t mine = counts[g->me];
  void *recv = xalloc(total, dt), *send = in_place ? NULL : xalloc(mine, dt);
  void *s = in_place ? (char *)recv + (size_t)displ[g->me] * weft_dtype_size(dt) : send;
  for (int64_t i = 0; i < mine; i++) put(s, dt, i, (double)val(weft_world_rank(), i, salt, dt));
  weft_work *w = NULL;
  WOK(weft_all_gather_v(m, dim, s, recv, counts, dt, async ? &w : NULL));
  if (async) WOK(weft_work_wait(w));
  for (int j = 0; j < g->n && !TOO_BAD; j++)
    for (int64_t i = 0; i < counts[j] && !TOO_BAD; i++)
      CHECKV(get(recv, dt, displ[j] + i), (double)val(g->members[j], i, salt, dt),
             "%s all_gather_v %s k=%d%s: block %d elem %" PRId64, label, weft_dtype_name(dt), k,
             in_place ? " in-place" : "", j, i);
  free(recv);
  free(send);
}

static void t_reduce_scatter(const weft_mesh *m, int dim, const grp *g, weft_dtype dt, int64_t c,
                             weft_reduce_op op, bool async, bool in_place, const char *label) {
  int salt = ++salt_counter, bad = 0;
  void *send = xalloc(g->n * c, dt), *recv = in_place ? send : xalloc(c, dt);
  for (int64_t i = 0; i < g->n * c; i++)
    put(send, dt, i, (double)val(weft_world_rank(), i, salt, dt));
  weft_work *w = NULL;
  WOK(weft_reduce_scatter(m, dim, send, recv, c, dt, op, async ? &w : NULL));
  if (async) WOK(weft_work_wait(w));
  for (int64_t i = 0; i < c && !TOO_BAD; i++)
    CHECKV(get(recv, dt, i), ref_reduce(g->members, g->n, g->me * c + i, salt, dt, op),
           "%s reduce_scatter %s %s c=%" PRId64 "%s%s: elem %" PRId64, label, weft_dtype_name(dt),
           weft_reduce_op_name(op), c, async ? " async" : "", in_place ? " in-place" : "", i);
  free(send);
  if (!in_place) free(recv);
}

static void t_all_reduce(const weft_mesh *m, int dim, const grp *g, weft_dtype dt, int64_t c,
                         weft_reduce_op op, bool async, bool in_place, const char *label) {
  int salt = ++salt_counter, bad = 0;
  void *send = xalloc(c, dt), *recv = in_place ? send : xalloc(c, dt);
  for (int64_t i = 0; i < c; i++) put(send, dt, i, (double)val(weft_world_rank(), i, salt, dt));
  weft_work *w = NULL;
  WOK(weft_all_reduce(m, dim, send, recv, c, dt, op, async ? &w : NULL));
  if (async) {
    /* poll with weft_work_test (it frees the handle when done) */
    bool done = false;
    while (!done) {
      weft_status st = weft_work_test(w, &done);
      WREQUIRE(st == WEFT_OK, "work_test: %s", weft_last_error());
    }
  }
  for (int64_t i = 0; i < c && !TOO_BAD; i++)
    CHECKV(get(recv, dt, i), ref_reduce(g->members, g->n, i, salt, dt, op),
           "%s all_reduce %s %s c=%" PRId64 "%s%s: elem %" PRId64, label, weft_dtype_name(dt),
           weft_reduce_op_name(op), c, async ? " async" : "", in_place ? " in-place" : "", i);
  free(send);
  if (!in_place) free(recv);
}

static void t_broadcast(const weft_mesh *m, int dim, const grp *g, weft_dtype dt, int64_t c,
                        int root, bool async, const char *label) {
  int salt = ++salt_counter, bad = 0;
  void *buf = xalloc(c, dt);
  if (g->me == root)
    for (int64_t i = 0; i < c; i++) put(buf, dt, i, (double)val(weft_world_rank(), i, salt, dt));
  weft_work *w = NULL;
  WOK(weft_broadcast(m, dim, buf, c, dt, root, async ? &w : NULL));
  if (async) WOK(weft_work_wait(w));
  for (int64_t i = 0; i < c && !TOO_BAD; i++)
    CHECKV(get(buf, dt, i), (double)val(g->members[root], i, salt, dt),
           "%s broadcast %s root %d: elem %" PRId64, label, weft_dtype_name(dt), root, i);
  free(buf);
}

static void t_all_to_all(const weft_mesh *m, int dim, const grp *g, weft_dtype dt, int64_t c,
                         bool async, bool in_place, const char *label) {
  int salt = ++salt_counter, bad = 0;
  void *send = xalloc(g->n * c, dt), *recv = in_place ? send : xalloc(g->n * c, dt);
  /* block j, element i of rank r: val(r, j*c + i) */
  for (int64_t i = 0; i < g->n * c; i++)
    put(send, dt, i, (double)val(weft_world_rank(), i, salt, dt));
  weft_work *w = NULL;
  WOK(weft_all_to_all(m, dim, send, recv, c, dt, async ? &w : NULL));
  if (async) WOK(weft_work_wait(w));
  for (int j = 0; j < g->n && !TOO_BAD; j++)
    for (int64_t i = 0; i < c && !TOO_BAD; i++)
      CHECKV(get(recv, dt, j * c + i), (double)val(g->members[j], g->me * c + i, salt, dt),
             "%s all_to_all %s c=%" PRId64 "%s: block %d elem %" PRId64, label, weft_dtype_name(dt),
             c, in_place ? " in-place" : "", j, i);
  free(send);
  if (!in_place) free(recv);
}

/* Rank a sends cnt(a, b) = (a + 2b) % 3 elements to rank b, values
 * val(a, b*1000 + i); blocks are laid out with a one-element gap. */
static int64_t a2av_cnt(int a, int b) { return (a + 2 * b) % 3; }

static void t_all_to_all_v(const weft_mesh *m, int dim, const grp *g, weft_dtype dt, bool async,
                           const char *label) {
  int salt = ++salt_counter, bad = 0;
  int64_t sc[64], sd[64], rc[64], rd[64], so = 0, ro = 0;
  for (int j = 0; j < g->n; j++) {
    sc[j] = a2av_cnt(g->me, j);
    rc[j] = a2av_cnt(j, g->me);
    sd[j] = so;
    rd[j] = ro;
    so += sc[j] + 1;
    ro += rc[j] + 1;
  }
  void *send = xalloc(so, dt), *recv = xalloc(ro, dt);
  for (int j = 0; j < g->n; j++)
    for (int64_t i = 0; i < sc[j]; i++)
      put(send, dt, sd[j] + i, (double)val(weft_world_rank(), j * 1000 + i, salt, dt));
  weft_work *w = NULL;
  WOK(weft_all_to_all_v(m, dim, send, sc, sd, recv, rc, rd, dt, async ? &w : NULL));
  if (async) WOK(weft_work_wait(w));
  for (int j = 0; j < g->n && !TOO_BAD; j++)
    for (int64_t i = 0; i < rc[j] && !TOO_BAD; i++)
      CHECKV(get(recv, dt, rd[j] + i), (double)val(g->members[j], g->me * 1000 + i, salt, dt),
             "%s all_to_all_v %s: from %d elem %" PRId64, label, weft_dtype_name(dt), j, i);
  free(send);
  free(recv);
}

/* Every collective, dtype and op on dim `dim` of m, whose expected group is g. */
static void check_collectives(const weft_mesh *m, int dim, const grp *g, const char *label) {
  for (int t = 0; t < NDT; t++) {
    weft_dtype dt = all_dtypes[t];
    for (int op = 0; op < WEFT_OP_COUNT; op++) {
      t_all_reduce(m, dim, g, dt, 7, (weft_reduce_op)op, false, false, label);
      t_reduce_scatter(m, dim, g, dt, 5, (weft_reduce_op)op, false, false, label);
    }
    t_all_gather(m, dim, g, dt, 6, false, false, label);
    t_all_gather_v(m, dim, g, dt, t % 4, false, false, label);
    t_all_to_all(m, dim, g, dt, 3, false, false, label);
    t_all_to_all_v(m, dim, g, dt, false, label);
    t_broadcast(m, dim, g, dt, 9, t % g->n, false, label);
  }
  /* every root, async and in-place forms, empty and larger buffers */
  for (int r = 0; r < g->n; r++) t_broadcast(m, dim, g, WEFT_F32, 4, r, r % 2 == 1, label);
  t_all_reduce(m, dim, g, WEFT_F32, 7, WEFT_OP_SUM, true, false, label);
  t_all_reduce(m, dim, g, WEFT_BF16, 7, WEFT_OP_AVG, true, true, label);
  t_all_reduce(m, dim, g, WEFT_I64, 7, WEFT_OP_MAX, false, true, label);
  t_all_reduce(m, dim, g, WEFT_F32, 0, WEFT_OP_SUM, false, false, label);
  t_all_reduce(m, dim, g, WEFT_F32, 100003, WEFT_OP_SUM, false, false, label);
  t_reduce_scatter(m, dim, g, WEFT_F32, 5, WEFT_OP_SUM, true, false, label);
  t_reduce_scatter(m, dim, g, WEFT_I32, 5, WEFT_OP_MIN, false, true, label);
  t_reduce_scatter(m, dim, g, WEFT_F64, 0, WEFT_OP_SUM, false, false, label);
  t_reduce_scatter(m, dim, g, WEFT_F32, 30011, WEFT_OP_AVG, true, false, label);
  t_all_gather(m, dim, g, WEFT_F16, 6, true, false, label);
  t_all_gather(m, dim, g, WEFT_I32, 6, false, true, label);
  t_all_gather(m, dim, g, WEFT_U8, 0, false, false, label);
  t_all_gather(m, dim, g, WEFT_F32, 65537, true, false, label);
  t_all_gather_v(m, dim, g, WEFT_F64, 1, true, true, label);
  t_all_gather_v(m, dim, g, WEFT_F32, -1, false, false, label); /* every count zero */
  t_all_to_all(m, dim, g, WEFT_I64, 3, true, false, label);
  t_all_to_all(m, dim, g, WEFT_F32, 4, false, true, label);
  t_all_to_all(m, dim, g, WEFT_F32, 0, false, false, label);
  t_all_to_all_v(m, dim, g, WEFT_I32, true, label);
  WOK(weft_barrier(m, dim, NULL));
  weft_work *w = NULL;
  WOK(weft_barrier(m, dim, &w));
  WOK(weft_work_wait(w));
}

/* Two collectives in flight at once on different dims (or twice on one
 * dim of a 1-D mesh), completed in reverse order. */
static void check_async_overlap(const weft_mesh *m, const grp *g0, const grp *g1, int d1,
                                const char *label) {
  int bad = 0, n = 4099;
  int s0 = ++salt_counter, s1 = ++salt_counter;
  float *a = xalloc(n, WEFT_F32), *b = xalloc(n, WEFT_F32),
        *gat = xalloc((int64_t)g1->n * n, WEFT_F32);
  for (int i = 0; i < n; i++) {
    a[i] = (float)val(weft_world_rank(), i, s0, WEFT_F32);
    b[i] = (float)val(weft_world_rank(), i, s1, WEFT_F32);
  }
  weft_work *w0 = NULL, *w1 = NULL;
  WOK(weft_all_reduce(m, 0, a, a, n, WEFT_F32, WEFT_OP_SUM, &w0));
  WOK(weft_all_gather(m, d1, b, gat, n, WEFT_F32, &w1));
  WOK(weft_work_wait(w1));
  WOK(weft_work_wait(w0));
  for (int i = 0; i < n && !TOO_BAD; i++)
    CHECKV(a[i], ref_reduce(g0->members, g0->n, i, s0, WEFT_F32, WEFT_OP_SUM),
           "%s overlap all_reduce elem %d", label, i);
  for (int j = 0; j < g1->n && !TOO_BAD; j++)
    for (int i = 0; i < n && !TOO_BAD; i++)
      CHECKV(gat[(int64_t)j * n + i], (double)val(g1->members[j], i, s1, WEFT_F32),
             "%s overlap all_gather block %d elem %d", label, j, i);
  free(a);
  free(b);
  free(gat);
}

/* ------------------------------------------------------- accounting */

static void check_count(weft_comm_count c, int64_t calls, int64_t bytes, int64_t bus,
                        const char *what) {
  WCHECK(c.calls == calls && c.bytes == bytes && c.bus_bytes == bus,
         "%s: calls/bytes/bus %" PRId64 "/%" PRId64 "/%" PRId64 " want %" PRId64 "/%" PRId64
         "/%" PRId64,
         what, c.calls, c.bytes, c.bus_bytes, calls, bytes, bus);
}

/* Known calls on dim `dim` of m (n ranks); exact counters on that row,
 * zero on every other row of `root` (rows named by root_rows of root). */
static void check_accounting(weft_mesh *root, const weft_mesh *m, int dim, int n,
                             const char *label) {
  weft_comm_stats_reset(root);
  int64_t c = 10;
  double *buf = calloc((size_t)(n * c + 64), sizeof *buf),
         *out = calloc((size_t)(n * c + 64), sizeof *out);
  int64_t counts[64];
  for (int j = 0; j < n; j++) counts[j] = j % 3;
  int64_t vtotal = 0;
  for (int j = 0; j < n; j++) vtotal += counts[j];
  int me = weft_mesh_coord(m, dim);
  int64_t sc[64], sd[64], rc[64], rd[64];
  int64_t stot = 0;
  for (int j = 0; j < n; j++) {
    sc[j] = 1 + (me + j) % 2;
    rc[j] = 1 + (j + me) % 2;
    sd[j] = 2 * j;
    rd[j] = 2 * j;
    stot += sc[j];
  }
  for (int i = 0; i < n * c; i++) buf[i] = i;
  weft_work *w;
  WOK(weft_all_gather(m, dim, buf, out, c, WEFT_F64, NULL));
  WOK(weft_all_gather_v(m, dim, buf, out, counts, WEFT_F64, NULL));
  WOK(weft_reduce_scatter(m, dim, buf, out, c, WEFT_F64, WEFT_OP_SUM, NULL));
  WOK(weft_all_reduce(m, dim, buf, out, c, WEFT_F64, WEFT_OP_MAX, NULL));
  WOK(weft_all_reduce(m, dim, buf, out, 3, WEFT_BF16, WEFT_OP_SUM, &w));
  WOK(weft_work_wait(w));
  WOK(weft_broadcast(m, dim, buf, c, WEFT_F64, 0, NULL));
  WOK(weft_all_to_all(m, dim, buf, out, c, WEFT_F64, NULL));
  WOK(weft_all_to_all_v(m, dim, buf, sc, sd, out, rc, rd, WEFT_F64, NULL));
  WOK(weft_barrier(m, dim, NULL));
  char what[160];
  int64_t e = 8, ag = n * c * e, agv = vtotal * e;
  /* bus = floor(P (n-1) / n), nccl-tests convention */
  snprintf(what, sizeof what, "%s all_gather (+_v)", label);
  check_count(weft_comm_stats(m, dim, WEFT_COLL_ALL_GATHER), 2, ag + agv,
              ag * (n - 1) / n + agv * (n - 1) / n, what);
  snprintf(what, sizeof what, "%s reduce_scatter", label);
  check_count(weft_comm_stats(m, dim, WEFT_COLL_REDUCE_SCATTER), 1, ag, ag * (n - 1) / n, what);
  snprintf(what, sizeof what, "%s all_reduce", label);
  int64_t ar = c * e + 3 * 2;
  check_count(weft_comm_stats(m, dim, WEFT_COLL_ALL_REDUCE), 2, ar,
              2 * c * e * (n - 1) / n + 2 * 6 * (n - 1) / n, what);
  snprintf(what, sizeof what, "%s broadcast", label);
  check_count(weft_comm_stats(m, dim, WEFT_COLL_BROADCAST), 1, c * e, c * e, what);
  snprintf(what, sizeof what, "%s all_to_all (+_v)", label);
  check_count(weft_comm_stats(m, dim, WEFT_COLL_ALL_TO_ALL), 2, ag + stot * e,
              ag * (n - 1) / n + stot * e * (n - 1) / n, what);
  snprintf(what, sizeof what, "%s barrier", label);
  check_count(weft_comm_stats(m, dim, WEFT_COLL_BARRIER), 1, 0, 0, what);
  weft_comm_count tot = weft_comm_stats_dim(m, dim);
  WCHECK(tot.calls == 9, "%s: total calls %" PRId64 " want 9", label, tot.calls);
  /* reset clears it */
  weft_comm_stats_reset(root);
  tot = weft_comm_stats_dim(m, dim);
  WCHECK(tot.calls == 0 && tot.bytes == 0 && tot.bus_bytes == 0, "%s: reset left %" PRId64 " calls",
         label, tot.calls);
  free(buf);
  free(out);
}

/* Every row of root other than the group behind (m, dim) must be zero. */
static void check_other_rows_zero(const weft_mesh *root, const weft_mesh *m, int dim,
                                  const char *label) {
  MPI_Comm mine = weft_mesh_dim_comm(m, dim);
  for (int d = 0; d < weft_mesh_ndim(root); d++) {
    if (weft_mesh_dim_comm(root, d) == mine) continue;
    weft_comm_count c = weft_comm_stats_dim(root, d);
    WCHECK(c.calls == 0, "%s: root dim %s has %" PRId64 " calls, want 0", label,
           weft_mesh_dim_name(root, d), c.calls);
  }
}

/* ------------------------------------------------------------- cases */

static int parse_shape(const char *s, int *shape) {
  int n = 0;
  while (s && *s && n < 8) {
    shape[n++] = (int)strtol(s, (char **)&s, 10);
    if (*s == 'x') s++;
  }
  return n;
}

static const char *dim_names[4][3] = {{0}, {"x"}, {"dp", "tp"}, {"dp_replicate", "dp_shard", "tp"}};

static void submesh_and_flatten(weft_mesh *mesh, int ndim, const int *shape);

static void case_collectives(void) {
  double t0 = now();
  int shape[8];
  /* SHAPE from argv, or $MESH_SHAPE (the harness's env form takes no args) */
  const char *shape_s = weft_worker_argc > 2 ? weft_worker_argv[2] : getenv("MESH_SHAPE");
  WREQUIRE(shape_s, "usage: collectives SHAPE (or MESH_SHAPE=...)");
  int ndim = parse_shape(shape_s, shape);
  WREQUIRE(ndim >= 1 && ndim <= 3, "shape '%s'", shape_s);
  int me = weft_world_rank(), n = weft_world_size();
  WCHECK(weft_local_rank() == me && weft_local_size() == n, "local rank/size %d/%d want %d/%d",
         weft_local_rank(), weft_local_size(), me, n);
  weft_mesh *mesh = NULL;
  WOK(weft_mesh_create(ndim, shape, dim_names[ndim], &mesh));
  WREQUIRE(mesh, "no mesh");
  WCHECK(weft_mesh_ndim(mesh) == ndim && weft_mesh_size(mesh) == n, "ndim/size");
  WCHECK(weft_mesh_rank(mesh) == me, "mesh rank %d want %d", weft_mesh_rank(mesh), me);
  int c[8];
  unravel(me, ndim, shape, c);
  WCHECK(weft_mesh_world_rank_of(mesh, c) == me, "world_rank_of own coords");

  grp groups[3];
  for (int d = 0; d < ndim; d++) {
    char label[64];
    snprintf(label, sizeof label, "[%s dim %s]", shape_s, dim_names[ndim][d]);
    groups[d] = expect_group(me, ndim, shape, 1, &d);
    int idx = -1;
    WOK(weft_mesh_dim_index(mesh, dim_names[ndim][d], &idx));
    WCHECK(idx == d, "dim_index %d want %d", idx, d);
    check_group_matches(mesh, d, &groups[d], label);
    check_collectives(mesh, d, &groups[d], label);
    check_accounting(mesh, mesh, d, groups[d].n, label);
  }
  /* whole mesh */
  WOK(weft_barrier(mesh, -1, NULL));
  WCHECK(weft_comm_stats(mesh, -1, WEFT_COLL_BARRIER).calls == 1, "whole-mesh barrier row");
  MPI_Comm wc = weft_mesh_comm(mesh);
  int wcs = 0;
  if (wc != MPI_COMM_NULL) MPI_Comm_size(wc, &wcs);
  WCHECK(wcs == n, "mesh comm size %d want %d", wcs, n);
  /* overlap: dim 0 with the last dim (the same dim twice when 1-D) */
  check_async_overlap(mesh, &groups[0], &groups[ndim - 1], ndim - 1, "[overlap]");

  if (ndim >= 2) submesh_and_flatten(mesh, ndim, shape);
  WOK(weft_mesh_destroy(mesh));
  if (me == 0)
    printf("mesh_worker collectives %s on %d ranks%s: %.2f s\n", shape_s, n,
           weft_get_settings()->debug ? " (WEFT_DEBUG)" : "", now() - t0);
}

/* Sub-meshes by name, flattening, and destroy semantics. */
static void submesh_and_flatten(weft_mesh *mesh, int ndim, const int *shape) {
  int me = weft_world_rank();
  const char *const *names = dim_names[ndim];
  /* single-dim sub-meshes reuse the parent's communicator */
  for (int d = 0; d < ndim; d++) {
    weft_mesh *sub = NULL;
    WOK(weft_mesh_submesh(mesh, 1, &names[d], &sub));
    WREQUIRE(sub, "submesh %s", names[d]);
    WCHECK(weft_mesh_ndim(sub) == 1, "sub ndim");
    WCHECK(weft_mesh_root(sub) == mesh && weft_mesh_root(mesh) == mesh, "weft_mesh_root");
    WCHECK(weft_mesh_dim_comm(sub, 0) == weft_mesh_dim_comm(mesh, d), "sub %s comm not reused",
           names[d]);
    WCHECK(weft_mesh_comm(sub) == weft_mesh_dim_comm(mesh, d), "1-D sub mesh comm");
    grp g = expect_group(me, ndim, shape, 1, &d);
    check_group_matches(sub, 0, &g, "[sub]");
    /* a sub-mesh's collectives count on the root's row */
    weft_comm_stats_reset(mesh);
    t_all_reduce(sub, 0, &g, WEFT_I32, 7, WEFT_OP_SUM, false, false, "[sub]");
    check_count(weft_comm_stats(mesh, d, WEFT_COLL_ALL_REDUCE), 1, 28, 2 * 28 * (g.n - 1) / g.n,
                "sub all_reduce on root row");
    check_other_rows_zero(mesh, sub, 0, "[sub]");
    /* busy while the sub-mesh lives */
    WCHECK(weft_mesh_destroy(mesh) == WEFT_ERR_BUSY, "destroy root with live sub-mesh");
    WOK(weft_mesh_destroy(sub));
  }
  /* reversed order: (last, first) */
  {
    const char *rev[2] = {names[ndim - 1], names[0]};
    weft_mesh *sub = NULL;
    WOK(weft_mesh_submesh(mesh, 2, rev, &sub));
    WREQUIRE(sub, "reversed submesh");
    int c[8];
    unravel(me, ndim, shape, c);
    int sc[2] = {c[ndim - 1], c[0]};
    WCHECK(weft_mesh_rank(sub) == sc[0] * shape[0] + sc[1], "reversed sub rank %d",
           weft_mesh_rank(sub));
    /* the member at (j, k) of the reversed sub-mesh: last dim j, first k */
    for (int j = 0; j < shape[ndim - 1]; j++)
      for (int k = 0; k < shape[0]; k++) {
        int cc[8];
        memcpy(cc, c, sizeof cc);
        cc[ndim - 1] = j;
        cc[0] = k;
        int want = ravel(ndim, shape, cc), q[2] = {j, k};
        WCHECK(weft_mesh_world_rank_of(sub, q) == want, "reversed sub (%d,%d) -> %d want %d", j, k,
               weft_mesh_world_rank_of(sub, q), want);
      }
    /* no communicator spans it (not in root order): blocking barrier chains dims */
    WCHECK(weft_mesh_comm(sub) == MPI_COMM_NULL || ndim == 2, "reversed sub has no comm");
    WOK(weft_barrier(sub, -1, NULL));
    WOK(weft_mesh_destroy(sub));
  }
  if (ndim == 3) {
    /* dp = flatten(dp_replicate, dp_shard): group of 4, coord 2*c0 + c1 */
    const char *dpn[2] = {"dp_replicate", "dp_shard"};
    weft_mesh *sub01 = NULL, *dp = NULL, *dp2 = NULL, *dptp = NULL, *rt = NULL, *sub02 = NULL;
    WOK(weft_mesh_submesh(mesh, 2, dpn, &sub01));
    WCHECK(weft_mesh_comm(sub01) == MPI_COMM_NULL, "no comm over (dp_replicate, dp_shard) yet");
    weft_work *w = NULL;
    WCHECK(weft_barrier(sub01, -1, &w) == WEFT_ERR_UNSUPPORTED, "async chained barrier");
    WOK(weft_mesh_flatten(sub01, 2, dpn, "dp", &dp));
    WREQUIRE(dp, "flatten");
    int src01[2] = {0, 1};
    grp g = expect_group(me, ndim, shape, 2, src01);
    check_group_matches(dp, 0, &g, "[flat dp]");
    WCHECK(strcmp(weft_mesh_dim_name(dp, 0), "dp") == 0, "flat name");
    WCHECK(weft_mesh_comm(sub01) == weft_mesh_dim_comm(dp, 0), "sub (dp_r, dp_s) comm = flat comm");
    /* a whole-(sub)mesh barrier now runs on the flat group and counts there */
    weft_comm_stats_reset(mesh);
    WOK(weft_barrier(sub01, -1, NULL));
    check_count(weft_comm_stats(dp, 0, WEFT_COLL_BARRIER), 1, 0, 0, "sub01 barrier on flat row");
    check_count(weft_comm_stats(sub01, -1, WEFT_COLL_BARRIER), 1, 0, 0, "sub01 row -1");
    check_count(weft_comm_stats(mesh, -1, WEFT_COLL_BARRIER), 0, 0, 0, "root row -1 untouched");
    check_collectives(dp, 0, &g, "[flat dp]");
    check_accounting(mesh, dp, 0, g.n, "[flat dp]");
    /* collectives on the flat dim count on its own row, not the root dims */
    weft_comm_stats_reset(mesh);
    t_all_gather(dp, 0, &g, WEFT_F32, 4, false, false, "[flat dp]");
    check_count(weft_comm_stats(dp, 0, WEFT_COLL_ALL_GATHER), 1, 64, 48, "flat row");
    check_other_rows_zero(mesh, dp, 0, "[flat dp]");
    /* flattening again is free and returns the same group */
    WOK(weft_mesh_flatten(mesh, 2, dpn, "dp", &dp2));
    WCHECK(dp2 && weft_mesh_dim_comm(dp2, 0) == weft_mesh_dim_comm(dp, 0), "re-flatten reuses");
    /* the root finds the flat name: mesh["dp", "tp"] */
    const char *dt_names[2] = {"dp", "tp"};
    WOK(weft_mesh_submesh(mesh, 2, dt_names, &dptp));
    WREQUIRE(dptp, "submesh dp,tp");
    WCHECK(weft_mesh_dim_comm(dptp, 0) == weft_mesh_dim_comm(dp, 0), "dp,tp reuses flat comm");
    WCHECK(weft_mesh_dim_comm(dptp, 1) == weft_mesh_dim_comm(mesh, 2), "dp,tp reuses tp comm");
    WCHECK(weft_mesh_comm(dptp) == weft_mesh_comm(mesh), "dp,tp spans the root in order");
    WCHECK(weft_mesh_rank(dptp) == me, "dp,tp rank %d want %d", weft_mesh_rank(dptp), me);
    int idx = -1;
    WCHECK(weft_mesh_dim_index(mesh, "dp", &idx) == WEFT_ERR_NOT_FOUND &&
               strstr(weft_last_error(), "flattened"),
           "dim_index of a flat name: %s", weft_last_error());
    /* errors */
    const char *bad1[2] = {"dp", "dp_shard"};
    WCHECK(weft_mesh_submesh(mesh, 2, bad1, &rt) == WEFT_ERR_INVALID &&
               strstr(weft_last_error(), "overlaps"),
           "overlapping submesh: %s", weft_last_error());
    const char *tpn[1] = {"tp"};
    WCHECK(weft_mesh_flatten(mesh, 1, tpn, "dp", &rt) == WEFT_ERR_INVALID &&
               strstr(weft_last_error(), "already exists"),
           "flat name reused for other dims: %s", weft_last_error());
    WCHECK(weft_mesh_flatten(mesh, 1, tpn, "dp_shard", &rt) == WEFT_ERR_INVALID,
           "flat name = root dim");
    const char *unk[1] = {"pp"};
    WCHECK(weft_mesh_submesh(mesh, 1, unk, &rt) == WEFT_ERR_NOT_FOUND &&
               strstr(weft_last_error(), "'pp'"),
           "unknown dim: %s", weft_last_error());
    WCHECK(weft_mesh_submesh(sub01, 1, tpn, &rt) == WEFT_ERR_NOT_FOUND,
           "tp is not a dim of sub-mesh (dp_replicate, dp_shard)");
    /* non-adjacent flatten (dp_replicate, tp) */
    const char *rt_names[2] = {"dp_replicate", "tp"};
    WOK(weft_mesh_flatten(mesh, 2, rt_names, "rt", &rt));
    int src02[2] = {0, 2};
    grp g02 = expect_group(me, ndim, shape, 2, src02);
    if (rt) {
      check_group_matches(rt, 0, &g02, "[flat rt]");
      t_all_reduce(rt, 0, &g02, WEFT_F32, 7, WEFT_OP_SUM, false, false, "[flat rt]");
      t_all_to_all_v(rt, 0, &g02, WEFT_F32, false, "[flat rt]");
    }
    WOK(weft_mesh_submesh(mesh, 2, rt_names, &sub02));
    WCHECK(sub02 && weft_mesh_comm(sub02) == weft_mesh_dim_comm(rt, 0),
           "sub (dp_r, tp) -> rt comm");
    /* retain makes destroy busy */
    weft_mesh_retain(dp);
    WCHECK(weft_mesh_destroy(dp) == WEFT_ERR_BUSY && strstr(weft_last_error(), "retained"),
           "destroy retained: %s", weft_last_error());
    weft_mesh_release(dp);
    WCHECK(weft_mesh_destroy(mesh) == WEFT_ERR_BUSY, "root busy with flat meshes alive");
    WOK(weft_mesh_destroy(dp));
    WOK(weft_mesh_destroy(dp2));
    WOK(weft_mesh_destroy(dptp));
    WOK(weft_mesh_destroy(rt));
    WOK(weft_mesh_destroy(sub02));
    WOK(weft_mesh_destroy(sub01));
    weft_mesh_retain(mesh);
    WCHECK(weft_mesh_destroy(mesh) == WEFT_ERR_BUSY, "root busy while retained");
    weft_mesh_release(mesh);
  }
  if (ndim == 2 && shape[0] == 2 && shape[1] == 2) {
    char buf[128];
    weft_mesh_describe(mesh, buf, sizeof buf);
    WCHECK(strcmp(buf, "mesh (dp=2, tp=2): [[0, 1], [2, 3]]") == 0, "describe: '%s'", buf);
  }
  if (ndim == 2 && shape[0] == 2 && shape[1] == 3) {
    char buf[128];
    weft_mesh *tp = NULL;
    const char *tpn[1] = {"tp"};
    WOK(weft_mesh_submesh(mesh, 1, tpn, &tp));
    weft_mesh_describe(tp, buf, sizeof buf);
    const char *want = me < 3 ? "mesh (tp=3): [0, 1, 2]" : "mesh (tp=3): [3, 4, 5]";
    WCHECK(strcmp(buf, want) == 0, "describe tp: '%s' want '%s'", buf, want);
    WOK(weft_mesh_destroy(tp));
  }
}

/* --------------------------------------------------------- errors */

static void expect_err(weft_status got, weft_status want, const char *needle, const char *what) {
  WCHECK(got == want, "%s: status %s want %s (%s)", what, weft_status_str(got),
         weft_status_str(want), weft_last_error());
  if (needle)
    WCHECK(strstr(weft_last_error(), needle) != NULL, "%s: message '%s' lacks '%s'", what,
           weft_last_error(), needle);
}

static void case_errors(void) {
  double t0 = now();
  int me = weft_world_rank();
  WREQUIRE(weft_world_size() == 4, "errors runs on 4 ranks");
  weft_mesh *m = NULL;
  const char *dt[2] = {"dp", "tp"};
  /* mesh_create: bad shapes and names, same on every rank, no hang */
  int s23[2] = {2, 3}, s22[2] = {2, 2}, s0[2] = {0, 4};
  expect_err(weft_mesh_create(2, s23, dt, &m), WEFT_ERR_INVALID,
             "product of shape (2x3=6) != group size 4", "wrong product");
  const char *dup[2] = {"dp", "dp"};
  expect_err(weft_mesh_create(2, s22, dup, &m), WEFT_ERR_INVALID, "repeated", "duplicate names");
  const char *empty[2] = {"dp", ""};
  expect_err(weft_mesh_create(2, s22, empty, &m), WEFT_ERR_INVALID, "empty", "empty name");
  const char *longn[2] = {"dp", "a_name_that_is_far_too_long_for_a_dim"};
  expect_err(weft_mesh_create(2, s22, longn, &m), WEFT_ERR_INVALID, "longer", "long name");
  expect_err(weft_mesh_create(2, s0, dt, &m), WEFT_ERR_INVALID, "shape[0] = 0", "zero size");
  int s1[9] = {4, 1, 1, 1, 1, 1, 1, 1, 1};
  const char *n9[9] = {"a", "b", "c", "d", "e", "f", "g", "h", "i"};
  expect_err(weft_mesh_create(0, s1, n9, &m), WEFT_ERR_INVALID, "ndim 0 outside 1..8", "ndim 0");
  expect_err(weft_mesh_create(9, s1, n9, &m), WEFT_ERR_INVALID, "ndim 9 outside 1..8", "ndim 9");
  WCHECK(m == NULL, "no mesh on error");
  /* 8 dims is fine */
  WOK(weft_mesh_create(8, s1, n9, &m));
  WOK(weft_mesh_destroy(m));
  m = NULL;
  /* ranks passing different arguments: MISMATCH on every rank */
  const char *other[2] = {"dp", me == 2 ? "cp" : "tp"};
  expect_err(weft_mesh_create(2, s22, other, &m), WEFT_ERR_MISMATCH, "world ranks 2 differ",
             "different args");

  WOK(weft_mesh_create(2, s22, dt, &m));
  WREQUIRE(m, "mesh");
  int idx;
  expect_err(weft_mesh_dim_index(m, "pp", &idx), WEFT_ERR_NOT_FOUND,
             "no dim named 'pp' in mesh (dp, tp)", "unknown dim");
  float buf[64] = {1}, out[64];
  expect_err(weft_all_reduce(m, 2, buf, out, 4, WEFT_F32, WEFT_OP_SUM, NULL), WEFT_ERR_INVALID,
             "dim 2 out of range", "dim out of range");
  expect_err(weft_all_reduce(m, 0, buf, out, -1, WEFT_F32, WEFT_OP_SUM, NULL), WEFT_ERR_INVALID,
             "count -1", "negative count");
  expect_err(weft_all_reduce(m, 0, buf, out, 4, (weft_dtype)42, WEFT_OP_SUM, NULL),
             WEFT_ERR_INVALID, "dtype", "bad dtype");
  expect_err(weft_all_reduce(m, 0, buf, out, 4, WEFT_F32, (weft_reduce_op)9, NULL),
             WEFT_ERR_INVALID, "reduce op", "bad op");
  expect_err(weft_broadcast(m, 1, buf, 4, WEFT_F32, 2, NULL), WEFT_ERR_INVALID, "root 2",
             "bad root");
  expect_err(weft_all_gather(m, 1, NULL, out, 4, WEFT_F32, NULL), WEFT_ERR_INVALID, "NULL",
             "null send");
  expect_err(weft_all_gather(m, 1, buf + 1, buf, 4, WEFT_F32, NULL), WEFT_ERR_INVALID, "overlaps",
             "overlapping buffers");
  expect_err(weft_all_reduce(NULL, 0, buf, out, 4, WEFT_F32, WEFT_OP_SUM, NULL), WEFT_ERR_INVALID,
             "mesh is NULL", "null mesh");
  WOK(weft_work_wait(NULL));

  /* WEFT_DEBUG: a mismatched collective fails on every rank of the group
   * (tp group {0,1}: rank 1 calls all_gather where rank 0 calls
   * all_reduce), and the group stays usable; the other tp group is fine. */
  weft_set_debug(true);
  int tp = 1;
  weft_status st;
  if (me == 1)
    st = weft_all_gather(m, tp, buf, out, 4, WEFT_F32, NULL);
  else
    st = weft_all_reduce(m, tp, buf, out, 4, WEFT_F32, WEFT_OP_SUM, NULL);
  if (me < 2) {
    expect_err(st, WEFT_ERR_MISMATCH, "world rank 0 called all_reduce(f32, count 4, sum",
               "op mismatch");
    WCHECK(strstr(weft_last_error(), "world rank 1 called all_gather(f32, count 4") != NULL,
           "mismatch names rank 1: %s", weft_last_error());
  } else {
    WOK(st);
  }
  /* count mismatch, dtype mismatch, root mismatch */
  st = weft_all_reduce(m, tp, buf, out, me == 3 ? 5 : 4, WEFT_F32, WEFT_OP_SUM, NULL);
  if (me >= 2)
    expect_err(st, WEFT_ERR_MISMATCH, "world rank 3 called all_reduce(f32, count 5",
               "count mismatch");
  else
    WOK(st);
  st = weft_all_reduce(m, 0, buf, out, 4, me == 0 ? WEFT_F64 : WEFT_F32, WEFT_OP_MAX, NULL);
  if (me % 2 == 0)
    expect_err(st, WEFT_ERR_MISMATCH, "world rank 0 called all_reduce(f64", "dtype mismatch");
  else
    WOK(st);
  st = weft_broadcast(m, 0, buf, 4, WEFT_F32, me == 3 ? 1 : 0, NULL);
  if (me % 2 == 1)
    expect_err(st, WEFT_ERR_MISMATCH, "root 1", "root mismatch");
  else
    WOK(st);
  int64_t counts[2] = {1, me == 1 ? 3 : 2};
  st = weft_all_gather_v(m, tp, buf, out, counts, WEFT_F32, NULL);
  if (me < 2)
    expect_err(st, WEFT_ERR_MISMATCH, "counts hash", "all_gather_v counts mismatch");
  else
    WOK(st);
  /* all_to_all_v: rank 0 sends 2 to rank 1, which expects 1 */
  int64_t sc[2] = {1, 1}, sd[2] = {0, 2}, rc[2] = {1, 1}, rd[2] = {0, 2};
  if (me == 0) sc[1] = 2;
  st = weft_all_to_all_v(m, tp, buf, sc, sd, out, rc, rd, WEFT_F32, NULL);
  if (me < 2)
    expect_err(st, WEFT_ERR_MISMATCH, "world rank 0 sends 2 to world rank 1, which expects 1",
               "all_to_all_v pair mismatch");
  else
    WOK(st);
  /* the groups still work after mismatches */
  for (int i = 0; i < 4; i++) buf[i] = (float)(me + 1);
  WOK(weft_all_reduce(m, tp, buf, out, 4, WEFT_F32, WEFT_OP_SUM, NULL));
  float want = me < 2 ? 3.0f : 7.0f;
  WCHECK(out[0] == want && out[3] == want, "all_reduce after mismatch: %g want %g", out[0], want);

  /* A rank that skips a collective: its peer times out naming it (debug
   * on: the fingerprint exchange knows who never arrived). dp group of
   * rank 3 is {1, 3}; rank 1 skips. */
  weft_set_timeout(2.0);
  double ts = now();
  if (me != 1) {
    st = weft_all_reduce(m, 0, buf, out, 4, WEFT_F32, WEFT_OP_SUM, NULL);
    if (me == 3) {
      expect_err(st, WEFT_ERR_TIMEOUT, "never arrived", "skipped collective (debug)");
      WCHECK(strstr(weft_last_error(), "all_reduce(f32, count 4, sum") &&
                 strstr(weft_last_error(), "'dp'") && strstr(weft_last_error(), ": 1"),
             "timeout message names op, dim, rank 1: %s", weft_last_error());
      double el = now() - ts;
      WCHECK(el >= 1.9 && el < 10, "timed out after %.2f s, want ~2", el);
      /* the group is unusable now, and says so */
      expect_err(weft_barrier(m, 0, NULL), WEFT_ERR_STATE, "unusable", "broken group");
    } else {
      WOK(st);
    }
  }
  /* Without debug: rank 3 skips an all_reduce on tp (group {2, 3}); rank 2
   * times out with the collective, dim and sequence number. Then rank 3
   * makes the call late, so nothing stays pending at finalize. */
  weft_set_debug(false);
  weft_set_timeout(1.0);
  if (me == 2) {
    st = weft_all_reduce(m, tp, buf, out, 4, WEFT_F32, WEFT_OP_SUM, NULL);
    expect_err(st, WEFT_ERR_TIMEOUT, "all_reduce(f32, count 4, sum, seq ", "skipped collective");
    WCHECK(strstr(weft_last_error(), "on mesh dim 'tp'") && strstr(weft_last_error(), "within 1 s"),
           "timeout message: %s", weft_last_error());
  }
  weft_set_timeout(30.0);
  MPI_Barrier(MPI_COMM_WORLD);
  if (me == 3) WOK(weft_all_reduce(m, tp, buf, out, 4, WEFT_F32, WEFT_OP_SUM, NULL));
  if (me == 2)
    expect_err(weft_barrier(m, tp, NULL), WEFT_ERR_STATE, "timed out", "broken tp group");
  MPI_Barrier(MPI_COMM_WORLD);
  /* destroy semantics with a retained mesh and in-flight work */
  weft_mesh_retain(m);
  expect_err(weft_mesh_destroy(m), WEFT_ERR_BUSY, "retained", "destroy retained");
  weft_mesh_release(m);
  WOK(weft_mesh_destroy(m));
  WOK(weft_mesh_destroy(NULL));
  if (me == 0) printf("mesh_worker errors on 4 ranks: %.2f s\n", now() - t0);
}

/* Counts above INT_MAX: int64 counts, split into chunks of at most
 * WEFT_CHUNK_BYTES (MPICH's nonblocking large-count calls fail).
 * big_count_full moves 2 GiB + 77 bytes and checks a byte every 4 KiB; on
 * one rank it runs every even collective, on more ranks broadcast and
 * all-reduce (the others need n-fold buffers). note: it is slow on these
 * VMs (a page fault costs ~30 us: touching 2 GiB took 16 s), so the suite
 * runs big_count: one rank, an untouched 2 GiB buffer with sentinel bytes,
 * broadcast and in-place all-reduce (no data moves on one rank), the
 * accounting, and the _v limit; the chunked data paths themselves are
 * checked with WEFT_CHUNK_BYTES=64 by collectives_chunked_exact_on_2x2. */
static void case_big_count(void) {
  int bad = 0;
  int shape[1] = {1};
  const char *x[1] = {"x"};
  weft_mesh *m = NULL;
  WOK(weft_mesh_create_from_comm(MPI_COMM_SELF, 1, shape, x, &m));
  WREQUIRE(m, "mesh");
  int64_t n = (int64_t)INT_MAX + 77;
  uint8_t *b = malloc((size_t)n);
  WREQUIRE(b, "no memory for %" PRId64 " bytes", n);
  b[0] = 17;
  b[(int64_t)INT_MAX] = 18;
  b[n - 1] = 19;
  WOK(weft_broadcast(m, 0, b, n, WEFT_U8, 0, NULL));
  WOK(weft_all_reduce(m, 0, b, b, n, WEFT_U8, WEFT_OP_MAX, NULL));
  weft_work *w = NULL;
  WOK(weft_all_reduce(m, 0, b, b, n, WEFT_U8, WEFT_OP_SUM, &w));
  WOK(weft_work_wait(w));
  CHECKV(b[0], 17, "first byte");
  CHECKV(b[(int64_t)INT_MAX], 18, "byte INT_MAX");
  CHECKV(b[n - 1], 19, "last byte");
  check_count(weft_comm_stats(m, 0, WEFT_COLL_BROADCAST), 1, n, n, "big broadcast accounting");
  check_count(weft_comm_stats(m, 0, WEFT_COLL_ALL_REDUCE), 2, 2 * n, 0,
              "big all_reduce accounting");
  int64_t cnt[1] = {n};
  WCHECK(weft_all_gather_v(m, 0, b, b, cnt, WEFT_U8, NULL) == WEFT_ERR_UNSUPPORTED,
         "all_gather_v above INT_MAX is unsupported");
  free(b);
  WOK(weft_mesh_destroy(m));
}

static void case_big_count_full(void) {
  int me = weft_world_rank(), np = weft_world_size(), bad = 0;
  int shape[1] = {np};
  const char *x[1] = {"x"};
  weft_mesh *m = NULL;
  WOK(weft_mesh_create(1, shape, x, &m));
  WREQUIRE(m, "mesh");
  int64_t n = (int64_t)INT_MAX + 77;
  uint8_t *b = malloc((size_t)n), *c = np == 1 ? malloc((size_t)n) : NULL;
  WREQUIRE(b && (np > 1 || c), "no memory for %" PRId64 " bytes", n);
#define PAT(i) ((uint8_t)(((i) >> 12) * 7 + 1))
  for (int64_t i = 0; i < n; i += 4096) b[i] = me == 0 ? PAT(i) : 0;
  b[n - 1] = me == 0 ? 201 : 0;
  WOK(weft_broadcast(m, 0, b, n, WEFT_U8, 0, NULL));
  for (int64_t i = 0; i < n && !TOO_BAD; i += 4096)
    CHECKV(b[i], PAT(i), "big broadcast byte %" PRId64, i);
  CHECKV(b[n - 1], 201, "big broadcast last byte");
  check_count(weft_comm_stats(m, 0, WEFT_COLL_BROADCAST), 1, n, n, "big broadcast accounting");
  b[0] = (uint8_t)(10 + me);
  b[n - 1] = (uint8_t)(50 - me);
  if (np == 1) {
    memset(c, 0, (size_t)n);
    WOK(weft_all_reduce(m, 0, b, c, n, WEFT_U8, WEFT_OP_MAX, NULL));
    for (int64_t i = 4096; i < n - 1 && !TOO_BAD; i += 4096)
      CHECKV(c[i], PAT(i), "big all_reduce byte %" PRId64, i);
    CHECKV(c[0], 10, "big all_reduce first byte");
    CHECKV(c[n - 1], 50, "big all_reduce last byte");
    memset(c, 0, (size_t)n);
    WOK(weft_all_gather(m, 0, b, c, n, WEFT_U8, NULL));
    CHECKV(c[n - 1], 50, "big all_gather last byte");
    CHECKV(c[(int64_t)INT_MAX + 1 - 4096 * 3], b[(int64_t)INT_MAX + 1 - 4096 * 3],
           "big all_gather mid");
    memset(c, 0, (size_t)n);
    WOK(weft_reduce_scatter(m, 0, b, c, n, WEFT_U8, WEFT_OP_SUM, NULL));
    CHECKV(c[n - 1], 50, "big reduce_scatter last byte");
    CHECKV(c[4096 * 700], PAT(4096 * 700), "big reduce_scatter byte");
    memset(c, 0, (size_t)n);
    WOK(weft_all_to_all(m, 0, b, c, n, WEFT_U8, NULL));
    CHECKV(c[n - 1], 50, "big all_to_all last byte");
    int64_t cnt[1] = {n};
    WCHECK(weft_all_gather_v(m, 0, b, c, cnt, WEFT_U8, NULL) == WEFT_ERR_UNSUPPORTED,
           "all_gather_v above INT_MAX is unsupported");
  } else {
    WOK(weft_all_reduce(m, 0, b, b, n, WEFT_U8, WEFT_OP_MAX, NULL));
    CHECKV(b[0], 10 + np - 1, "big all_reduce first byte");
    CHECKV(b[n - 1], 50, "big all_reduce last byte");
  }
#undef PAT
  free(b);
  free(c);
  WOK(weft_mesh_destroy(m));
}

/* weft_wait_requests (the shared backoff wait for callers' own MPI
 * requests): three nonblocking all-reduces of random doubles waited
 * together match a double reference summed here from every rank's values;
 * an all-null set returns at once; a receive nobody sends times out with
 * the caller's name in the message; bad arguments are WEFT_ERR_INVALID. */
static double wait_val(int r, int k, int i) {
  uint64_t h = weft_test_mix64(seed ^ weft_test_mix64((uint64_t)r * 7919u + (uint64_t)k * 104729u) ^
                               weft_test_mix64((uint64_t)i + 1));
  return (double)(h >> 11) / 9007199254740992.0 * 2.0 - 1.0; /* [-1, 1) */
}

static void case_wait_requests(void) {
  int me = 0, np = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  MPI_Comm_size(MPI_COMM_WORLD, &np);
  enum { K = 3, N = 257 };
  double buf[K][N];
  MPI_Request reqs[K];
  for (int k = 0; k < K; k++) {
    for (int i = 0; i < N; i++) buf[k][i] = wait_val(me, k, i);
    WREQUIRE(MPI_Iallreduce(MPI_IN_PLACE, buf[k], N, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD,
                            &reqs[k]) == MPI_SUCCESS,
             "Iallreduce %d", k);
  }
  WOK(weft_wait_requests(K, reqs, "test all-reduce"));
  for (int k = 0; k < K; k++) {
    WCHECK(reqs[k] == MPI_REQUEST_NULL, "request %d not completed", k);
    int bad = 0;
    for (int i = 0; i < N && bad < 4; i++) {
      double want = 0;
      for (int r = 0; r < np; r++) want += wait_val(r, k, i);
      double err = fabs(buf[k][i] - want) / (fabs(want) > 1e-3 ? fabs(want) : 1e-3);
      if (err > 1e-13) bad++;
      WCHECK(err <= 1e-13, "reduce %d elem %d: got %.17g want %.17g (seed %lu)", k, i, buf[k][i],
             want, seed);
    }
  }
  WOK(weft_wait_requests(K, reqs, "all null"));
  WOK(weft_wait_requests(0, NULL, "none"));
  WCHECK(weft_wait_requests(-1, reqs, "negative") == WEFT_ERR_INVALID, "n = -1 accepted");
  WCHECK(strstr(weft_last_error(), "negative") != NULL, "message: %s", weft_last_error());
  WCHECK(weft_wait_requests(2, NULL, "null") == WEFT_ERR_INVALID, "NULL reqs accepted");
  /* A receive nobody sends: times out, names the operation, then cancel. */
  double t = 0;
  MPI_Request lone;
  WREQUIRE(MPI_Irecv(&t, 1, MPI_DOUBLE, me, 4242, MPI_COMM_WORLD, &lone) == MPI_SUCCESS, "Irecv");
  weft_set_timeout(0.3);
  double t0 = MPI_Wtime();
  weft_status st = weft_wait_requests(1, &lone, "lonely receive");
  double dt = MPI_Wtime() - t0;
  weft_set_timeout(30.0);
  WCHECK(st == WEFT_ERR_TIMEOUT, "status %s want timeout", weft_status_str(st));
  WCHECK(strstr(weft_last_error(), "lonely receive") != NULL, "message: %s", weft_last_error());
  WCHECK(dt >= 0.3 && dt < 10.0, "timed out after %.3f s, want 0.3 s", dt);
  MPI_Cancel(&lone);
  MPI_Wait(&lone, MPI_STATUS_IGNORE);
}

/* weft_agree_status: all OK -> OK everywhere; otherwise every rank gets
 * the lowest failing rank's status, that rank keeps its own message and the
 * others get "<what> failed on rank R: <message>" (explicit message or, for
 * NULL, weft_last_error()); ranks are ranks of the communicator passed (a
 * reversed duplicate); MPI_COMM_NULL is WEFT_ERR_INVALID. */
static void case_agree_status(void) {
  int me = 0, np = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  MPI_Comm_size(MPI_COMM_WORLD, &np);
  int who = 7;
  WOK(weft_agree_status(MPI_COMM_WORLD, WEFT_OK, NULL, "all fine", &who));
  WCHECK(who == -1, "failed rank %d want -1", who);
  /* ranks >= 1 fail, each with its own status and message */
  static const weft_status codes[] = {WEFT_ERR_INVALID, WEFT_ERR_STATE, WEFT_ERR_OOM};
  weft_status mine = me >= 1 ? codes[me % 3] : WEFT_OK;
  char msg[64];
  snprintf(msg, sizeof msg, "rank %d broke (%d)", me, me * 31 + 5);
  weft_status st = weft_agree_status(MPI_COMM_WORLD, mine, mine ? msg : NULL, "step", &who);
  if (np == 1) {
    WCHECK(st == WEFT_OK && who == -1, "1 rank: %s / %d", weft_status_str(st), who);
  } else {
    WCHECK(st == codes[1 % 3], "status %s want %s", weft_status_str(st),
           weft_status_str(codes[1 % 3]));
    WCHECK(who == 1, "failed rank %d want 1", who);
    if (me != 1) {
      char want[128];
      snprintf(want, sizeof want, "step failed on rank 1: rank 1 broke (36)");
      WCHECK(strstr(weft_last_error(), want) != NULL, "message '%s' lacks '%s'", weft_last_error(),
             want);
    }
  }
  /* msg NULL: the failing rank's weft_last_error() travels; ranks of a
   * reversed communicator (world rank np-1 is rank 0 there) */
  MPI_Comm rev;
  WREQUIRE(MPI_Comm_split(MPI_COMM_WORLD, 0, np - 1 - me, &rev) == MPI_SUCCESS, "split");
  int rr = 0;
  MPI_Comm_rank(rev, &rr);
  bool fail = rr == 0;
  if (fail) (void)weft_error(WEFT_ERR_NOT_FOUND, "no tensor 'w%d' here", me * 3 + 1);
  st = weft_agree_status(rev, fail ? WEFT_ERR_NOT_FOUND : WEFT_OK, NULL, "load", &who);
  WCHECK(st == WEFT_ERR_NOT_FOUND, "status %s want not found", weft_status_str(st));
  WCHECK(who == 0, "failed rank %d want 0", who);
  char want[64];
  snprintf(want, sizeof want, "no tensor 'w%d' here", (np - 1) * 3 + 1);
  WCHECK(strstr(weft_last_error(), want) != NULL, "message '%s' lacks '%s'", weft_last_error(),
         want);
  if (!fail)
    WCHECK(strstr(weft_last_error(), "load failed on rank 0") != NULL, "message '%s'",
           weft_last_error());
  MPI_Comm_free(&rev);
  WCHECK(weft_agree_status(MPI_COMM_NULL, WEFT_OK, NULL, "null", &who) == WEFT_ERR_INVALID,
         "MPI_COMM_NULL accepted");
  WCHECK(who == -1, "failed rank %d after invalid", who);
}

/* Issue 34 finding 4: a second weft_mesh_destroy was a double free and a
 * collective on a destroyed mesh read freed memory. Now both, and a
 * sub-mesh, flatten or set_device on a destroyed mesh, are
 * WEFT_ERR_INVALID naming the destroyed mesh; what describes the mesh
 * still works. On a 2x2 mesh (4 ranks) or 2 ranks. */
static void case_destroyed(void) {
  const int n = weft_world_size(), shape[2] = {2, n / 2};
  const char *names[2] = {"dp", "tp"}, *tpn[1] = {"tp"};
  weft_mesh *m = NULL, *sub = NULL, *m2 = NULL;
  WOK(weft_mesh_create(2, shape, names, &m));
  WREQUIRE(m, "mesh");
  WOK(weft_mesh_submesh(m, 1, tpn, &sub));
  WREQUIRE(sub, "sub-mesh");
  float x = 1.0f, y = 0.0f;
  WOK(weft_all_reduce(sub, 0, &x, &y, 1, WEFT_F32, WEFT_OP_SUM, NULL));
  WOK(weft_mesh_destroy(sub));
  expect_err(weft_mesh_destroy(sub), WEFT_ERR_INVALID, "already destroyed", "sub destroyed twice");
  expect_err(weft_all_reduce(sub, 0, &x, &y, 1, WEFT_F32, WEFT_OP_SUM, NULL), WEFT_ERR_INVALID,
             "destroyed", "all_reduce on a destroyed sub-mesh");
  /* the root still works, then goes */
  WOK(weft_all_reduce(m, 1, &x, &y, 1, WEFT_F32, WEFT_OP_SUM, NULL));
  WCHECK(y == (float)(n / 2), "all_reduce over tp: %g", (double)y);
  WOK(weft_mesh_destroy(m));
  expect_err(weft_mesh_destroy(m), WEFT_ERR_INVALID, "already destroyed", "root destroyed twice");
  expect_err(weft_all_reduce(m, 0, &x, &y, 1, WEFT_F32, WEFT_OP_SUM, NULL), WEFT_ERR_INVALID,
             "destroyed", "all_reduce on a destroyed mesh");
  expect_err(weft_barrier(m, -1, NULL), WEFT_ERR_INVALID, "destroyed",
             "barrier on a destroyed mesh");
  expect_err(weft_mesh_submesh(m, 1, tpn, &sub), WEFT_ERR_INVALID, "destroyed",
             "submesh of a destroyed mesh");
  expect_err(weft_mesh_flatten(m, 1, tpn, "flat", &sub), WEFT_ERR_INVALID, "destroyed",
             "flatten of a destroyed mesh");
  expect_err(weft_mesh_set_device(m, WEFT_CPU), WEFT_ERR_INVALID, "destroyed",
             "set_device of a destroyed mesh");
  char pic[128];
  weft_mesh_describe(m, pic, sizeof pic);
  WCHECK(strstr(pic, "dp=2"), "describe of a destroyed mesh: %s", pic);
  weft_clear_error();
  /* a new mesh works as before */
  WOK(weft_mesh_create(2, shape, names, &m2));
  WOK(weft_all_reduce(m2, 0, &x, &y, 1, WEFT_F32, WEFT_OP_SUM, NULL));
  WCHECK(y == 2.0f, "all_reduce over dp on a new mesh: %g", (double)y);
  WOK(weft_mesh_destroy(m2));
}

/* Issue 34 finding 7: a stopped rank ended the others only after twice
 * WEFT_TIMEOUT (the collective's wait, then weft_finalize's). Rank 1
 * stops (sleeps past both) while rank 0 all-reduces: rank 0's collective
 * times out after WEFT_TIMEOUT (4 s, from the test) and its weft_finalize
 * then returns within a short grace, not another 4 s. */
static void case_stalled(void) {
  weft_mesh *m = NULL;
  int n = weft_world_size();
  const char *names[1] = {"dp"};
  WOK(weft_mesh_create(1, &n, names, &m));
  if (weft_world_rank() == 1) {
    sleep(12); /* stopped: no collective, no finalize */
    _exit(0);
  }
  float x = 1.0f, y = 0.0f;
  const double t0 = now();
  weft_status st = weft_all_reduce(m, 0, &x, &y, 1, WEFT_F32, WEFT_OP_SUM, NULL);
  const double t1 = now();
  WCHECK(st == WEFT_ERR_TIMEOUT, "all_reduce without rank 1: %s", weft_status_str(st));
  weft_status fin = weft_finalize();
  const double t2 = now();
  WCHECK(fin == WEFT_ERR_TIMEOUT, "finalize without rank 1: %s", weft_status_str(fin));
  /* the test runs with WEFT_TIMEOUT=4: a second timeout would take >= 4 s,
   * the 1 s grace plus MPI's teardown far less on an idle machine; the
   * bound sits between the two (2.5 s failed once in a full-suite run on
   * 2 loaded cores) */
  WCHECK(t2 - t1 < 3.5, "weft_finalize waited %.1f s after the collective timed out (%.1f s)",
         t2 - t1, t1 - t0);
  printf("stalled rank: collective timed out after %.1f s, finalize returned %.1f s later\n",
         t1 - t0, t2 - t1);
  fflush(stdout);
  /* The verdict goes to a file, as case_blame's: rank 0 exits unfinalised
   * by MPI's count (rank 1 never comes), and hydra may then kill rank 1
   * with a hangup and report that, so mpiexec's status cannot carry it. */
  const char *dir = getenv("STALL_DIR");
  if (dir) {
    char path[512];
    snprintf(path, sizeof path, "%s/rank0", dir);
    FILE *f = fopen(path, "w");
    if (f) {
      fprintf(f, "%s\n", weft_worker_failures ? "fail" : "ok");
      fclose(f);
    }
  }
  /* the mesh's communicators outlive MPI here: nothing more to free */
  _exit(weft_worker_failures ? 1 : 0);
}

/* Issue 34 finding 7, second half: with WEFT_DEBUG=1 the blame goes to
 * the rank that stopped, not to a healthy rank stuck waiting for it. On a
 * 2x2 mesh (dp, tp) rank 3 stops. Rank 2 waits for it in a tp all-reduce
 * (group {2, 3}); rank 0 waits in a dp all-reduce (group {0, 2}) for rank
 * 2, which never comes since it is stuck: rank 0 must name 3, and say
 * that 2 is stuck. Rank 1 waits for 3 in dp directly. */
static void case_blame(void) {
  weft_mesh *m = NULL;
  int shape[2] = {2, 2};
  const char *names[2] = {"dp", "tp"};
  WOK(weft_mesh_create(2, shape, names, &m));
  weft_set_debug(true);
  const int me = weft_world_rank();
  if (me == 3) {
    sleep(14); /* stopped: no collective, no finalize */
    _exit(0);
  }
  float x = 1.0f, y = 0.0f;
  if (me == 0) usleep(200000); /* rank 2 is already stuck when rank 0 arrives */
  weft_status st = weft_all_reduce(m, me == 2 ? 1 : 0, &x, &y, 1, WEFT_F32, WEFT_OP_SUM, NULL);
  WCHECK(st == WEFT_ERR_TIMEOUT, "all_reduce: %s", weft_status_str(st));
  const char *e = weft_last_error();
  printf("[rank %d] %s\n", me, e);
  fflush(stdout);
  if (me == 0) {
    WCHECK(strstr(e, "never arrived (fingerprint exchange): 2 ("), "rank 0 sees 2 missing: %s", e);
    WCHECK(strstr(e, "world rank 2 is itself stuck: all_reduce(f32, count 1, sum") &&
               strstr(e, "on mesh dim 'tp', waiting for world ranks 3"),
           "rank 0 learns that 2 waits for 3 in tp: %s", e);
    WCHECK(strstr(e, "the ranks that stopped are: 3"), "rank 0 blames 3: %s", e);
  } else {
    WCHECK(strstr(e, "never arrived (fingerprint exchange): 3") && !strstr(e, "stopped are"),
           "rank %d names 3 directly: %s", me, e);
  }
  /* The verdict goes to a file: the first healthy rank to exit (unfinalised,
   * as rank 3 never comes) makes hydra kill the others, perhaps before
   * they exit themselves, so mpiexec's status cannot carry it. */
  const char *dir = getenv("BLAME_DIR");
  if (dir) {
    char path[512];
    snprintf(path, sizeof path, "%s/rank%d", dir, me);
    FILE *f = fopen(path, "w");
    if (f) {
      fprintf(f, "%s\n", weft_worker_failures ? "fail" : "ok");
      fclose(f);
    }
  }
  (void)weft_finalize();
  _exit(weft_worker_failures ? 1 : 0);
}

static const weft_worker_case cases[] = {
    {"collectives", case_collectives},
    {"errors", case_errors},
    {"wait_requests", case_wait_requests},
    {"agree_status", case_agree_status},
    {"big_count", case_big_count},
    {"big_count_full", case_big_count_full},
    {"destroyed", case_destroyed},
    {"stalled", case_stalled},
    {"blame", case_blame},
    {NULL, NULL},
};

int main(int argc, char **argv) {
  const char *s = getenv("WEFT_TEST_SEED");
  if (s && *s) seed = strtoul(s, NULL, 0);
  return weft_worker_main(argc, argv, cases);
}
