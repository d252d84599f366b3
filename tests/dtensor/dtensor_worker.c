/* tests/dtensor/dtensor_worker.c — the MPI side of the dtensor suite.
 * Cases (argv[1]) take mesh shapes and counts from argv[2..]; every rank
 * draws the same random cases from the same seed.
 *
 * Device mode: with WEFT_TEST_DEVICE=cuda every mesh is put on WEFT_CUDA
 * (weft_mesh_set_device), so every DTensor keeps its local tensor there.
 * The cases property, partial, ops, fill, into_cache, errors and partition
 * support it: they check that what the library makes is on the mesh's
 * device, pass `full` inputs of distribute on the host or on the device,
 * from_local inputs on the device, and read results only through host
 * copies (the emulated device's memory is PROT_NONE to the host). Unset,
 * everything stays on the CPU and no copy is made. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ref.h"
#include "dtensor.h"
#include "worker.h"

static const weft_dtype all_dtypes[] = {WEFT_F32, WEFT_F64, WEFT_BF16, WEFT_F16,
                                        WEFT_I32, WEFT_I64, WEFT_U8};

/* Parses "2x2" into shape; returns ndim. */
static int parse_mesh(const char *s, int *shape) {
  int n = 0;
  while (*s && n < 8) {
    shape[n++] = (int)strtol(s, (char **)&s, 10);
    if (*s == 'x') s++;
  }
  return n;
}

static weft_mesh *make_mesh(int k, const int *shape) {
  static const char *names[8] = {"a", "b", "c", "d", "e", "f", "g", "h"};
  weft_mesh *m = NULL;
  weft_status st = weft_mesh_create(k, shape, names, &m);
  WCHECK(st == WEFT_OK, "mesh_create: %s", weft_last_error());
  weft_worker_mesh_on_device(m);
  return m;
}

/* t on dev: t itself when it is there, else a new copy on dev left in *tmp
 * for the caller to destroy (*tmp is NULL when no copy was made). NULL t
 * gives NULL; a failed copy is a failed check and gives NULL. */
static const weft_tensor *tensor_on(const weft_tensor *t, weft_device dev, weft_tensor **tmp) {
  *tmp = NULL;
  if (!t || t->device == dev) return t;
  weft_status st = weft_tensor_to(t, dev, tmp);
  WCHECK(st == WEFT_OK, "tensor_to(%s -> %s): %s", weft_device_name(t->device),
         weft_device_name(dev), weft_last_error());
  return *tmp;
}

/* Replaces the owned tensor *t by its copy on dev (the old one destroyed);
 * nothing when it is already there. A failed copy leaves NULL. */
static void move_to(weft_tensor **t, weft_device dev) {
  weft_tensor *moved = NULL;
  if (!*t || tensor_on(*t, dev, &moved) == *t) return;
  weft_tensor_destroy(*t);
  *t = moved;
}

/* A tensor the library made for a DTensor on mesh is on the mesh's device. */
static bool check_device(const weft_tensor *t, const weft_mesh *mesh, const char *what,
                         const char *desc) {
  weft_device want = weft_mesh_device(mesh);
  bool ok = t && t->device == want;
  WCHECK(ok, "%s: %s is on %s, the mesh on %s", desc, what, t ? weft_device_name(t->device) : "-",
         weft_device_name(want));
  return ok;
}
static bool check_dtensor_device(const weft_dtensor *dt, const char *what, const char *desc) {
  return check_device(weft_dtensor_local(dt), weft_dtensor_mesh(dt), what, desc);
}

/* full_tensor(dt), checked to be on the mesh's device, brought to the
 * host; NULL (reported) on failure. The caller destroys it. */
static weft_tensor *full_on_host(const weft_dtensor *dt, const char *desc) {
  weft_tensor *full = NULL;
  weft_status st = weft_dtensor_full_tensor(dt, &full);
  WCHECK(st == WEFT_OK, "%s: full_tensor: %s", desc, weft_last_error());
  if (full) check_device(full, weft_dtensor_mesh(dt), "full_tensor", desc);
  move_to(&full, WEFT_CPU);
  return full;
}

static void my_coords(const weft_mesh *m, int *c) {
  for (int i = 0; i < weft_mesh_ndim(m); i++) c[i] = weft_mesh_coord(m, i);
}

/* Compares dt's local tensor to the reference slice of x for its spec. */
static bool check_local(const weft_dtensor *dt, const weft_tensor *x, const char *what,
                        const char *desc) {
  int c[8];
  my_coords(weft_dtensor_mesh(dt), c);
  weft_tensor *want = ref_local(weft_dtensor_get_spec(dt), c, x);
  const weft_tensor *got = weft_dtensor_local(dt);
  check_dtensor_device(dt, what, desc);
  weft_tensor *got_host = NULL;
  bool ok = weft_tensor_equal(tensor_on(got, WEFT_CPU, &got_host), want);
  weft_tensor_destroy(got_host);
  if (!ok) {
    char g[128], w[128];
    weft_tensor_describe(got, g, sizeof g);
    weft_tensor_describe(want, w, sizeof w);
    WCHECK(ok, "%s: %s: local %s differs from the reference %s", desc, what, g, w);
  }
  /* the geometry API agrees with what was produced */
  int64_t ls[8], off[8];
  weft_dtensor_spec_local_shape(weft_dtensor_get_spec(dt), c, ls, off, NULL);
  for (int d = 0; d < got->ndim; d++) {
    WCHECK(ls[d] == got->shape[d], "%s: %s: geometry says %lld on dim %d, local has %lld", desc,
           what, (long long)ls[d], d, (long long)got->shape[d]);
    int64_t n;
    int64_t *idx = ref_indices(weft_dtensor_get_spec(dt), c, d, &n);
    int64_t want_off = n ? idx[0] : weft_dtensor_shape(dt)[d];
    WCHECK(off[d] == want_off, "%s: %s: geometry offset %lld on dim %d, the shard starts at %lld",
           desc, what, (long long)off[d], d, (long long)want_off);
    free(idx);
  }
  weft_tensor_destroy(want);
  return ok;
}

/* ------------------------------------------------------------ property */

/* redistribute(distribute(x, a), b) has exactly the shards of
 * distribute(x, b), and full_tensor gives back x, for random cases. */
static void case_property(void) {
  WREQUIRE(weft_worker_argc >= 5, "usage: property MESHES NCASES SEED");
  int ncases = atoi(weft_worker_argv[3]);
  uint64_t seed = strtoull(weft_worker_argv[4], NULL, 10);
  char meshes[256];
  snprintf(meshes, sizeof meshes, "%s", weft_worker_argv[2]);
  int done = 0;
  for (char *tok = strtok(meshes, ","); tok; tok = strtok(NULL, ",")) {
    int mshape[8];
    int k = parse_mesh(tok, mshape);
    weft_mesh *mesh = make_mesh(k, mshape);
    if (!mesh) return;
    int msize = weft_mesh_size(mesh);
    ref_rng r;
    ref_rng_seed(&r, seed + (uint64_t)k * 1000 + (uint64_t)msize);
    for (int it = 0; it < ncases; it++) {
      int nd = ref_rng_int(&r, 0, 3);
      int64_t shape[4];
      for (int d = 0; d < nd; d++)
        shape[d] = ref_rng_int(&r, 0, 5) == 0 ? ref_rng_int(&r, 0, 2) : ref_rng_int(&r, 0, 11);
      weft_dtype dt = all_dtypes[ref_rng_int(&r, 0, 6)];
      weft_placement a[8], b[8];
      ref_random_placements(&r, k, mshape, nd, a);
      ref_random_placements(&r, k, mshape, nd, b);
      int src = ref_rng_int(&r, -1, msize - 1);
      uint64_t xseed = ref_rng_next(&r);
      weft_tensor *x = NULL;
      weft_tensor_create(dt, WEFT_CPU, nd, shape, &x);
      ref_fill_bytes(x, xseed);
      weft_dtensor_spec sa;
      weft_status st = weft_dtensor_spec_init_mesh(&sa, mesh, a, k, dt, nd, shape);
      WCHECK(st == WEFT_OK, "spec: %s", weft_last_error());
      char desc[768], base[600];
      ref_case_describe(&sa, b, base, sizeof base);
      snprintf(desc, sizeof desc, "[seed %llu mesh %s case %d src %d] %s", (unsigned long long)seed,
               tok, it, src, base);
      weft_dtensor *da = NULL, *db = NULL;
      /* the source may pass the tensor; others pass NULL half of the time */
      const weft_tensor *arg = x;
      if (src >= 0 && weft_mesh_rank(mesh) != src && (it & 1)) arg = NULL;
      /* on a device mesh x goes in from the host, from the device, or from
       * the device on even ranks only (cases it/2 = 0, 1, 2 mod 3) */
      weft_tensor *xd = NULL;
      int how = (it / 2) % 3;
      if (weft_mesh_device(mesh) != WEFT_CPU &&
          (how == 1 || (how == 2 && weft_mesh_rank(mesh) % 2 == 0)))
        arg = tensor_on(arg, weft_mesh_device(mesh), &xd);
      st = weft_dtensor_distribute(mesh, arg, src, a, k, &da);
      WCHECK(st == WEFT_OK, "%s: distribute (x on %s): %s", desc,
             arg ? weft_device_name(arg->device) : "-", weft_last_error());
      weft_tensor_destroy(xd);
      if (st == WEFT_OK) {
        check_local(da, x, "distribute(x, a)", desc);
        st = weft_dtensor_redistribute(da, b, k, &db);
        WCHECK(st == WEFT_OK, "%s: redistribute: %s", desc, weft_last_error());
      }
      if (st == WEFT_OK) {
        check_local(db, x, "redistribute(.., b)", desc);
        weft_tensor *full = full_on_host(db, desc);
        if (full) WCHECK(weft_tensor_equal(full, x), "%s: full_tensor differs from x", desc);
        weft_tensor_destroy(full);
      }
      weft_dtensor_destroy(db);
      weft_dtensor_destroy(da);
      weft_tensor_destroy(x);
      done++;
    }
    WCHECK(weft_mesh_destroy(mesh) == WEFT_OK, "mesh_destroy: %s", weft_last_error());
  }
  if (weft_worker_rank == 0) printf("property: %d cases\n", done);
}

/* ------------------------------------------------------------- partial */

/* Integer piece of the partial value at global linear index g for the
 * linear coordinate pc over the Partial mesh dims (pc1: coordinate on the
 * first Partial mesh dim, which alone varies for avg). */
static int64_t piece(weft_reduce_op op, uint64_t seed, int64_t g, int pc, int pc1, int npc1,
                     bool is_unsigned) {
  ref_rng r;
  ref_rng_seed(&r, seed ^ (uint64_t)g * 0x9E37ULL);
  int64_t base = ref_rng_int(&r, is_unsigned ? 24 : -20, 40);
  switch (op) {
    case WEFT_OP_SUM: {
      ref_rng q;
      ref_rng_seed(&q, seed ^ (uint64_t)g * 0x9E37ULL ^ (uint64_t)(pc + 1) * 0x51ED27ULL);
      return ref_rng_int(&q, is_unsigned ? 0 : -7, 7);
    }
    case WEFT_OP_AVG: {
      /* zero-sum perturbation along the first Partial dim only: every
       * staged average is exact */
      int64_t sum = 0, e = 0;
      for (int c = 0; c < npc1; c++) {
        ref_rng q;
        ref_rng_seed(&q, seed ^ (uint64_t)g * 0x9E37ULL ^ (uint64_t)(c + 7) * 0x77ULL);
        int64_t v = c + 1 < npc1 ? ref_rng_int(&q, -3, 3) : -sum;
        sum += v;
        if (c == pc1) e = v;
      }
      return base + e;
    }
    case WEFT_OP_MAX:
    case WEFT_OP_MIN: {
      ref_rng q;
      ref_rng_seed(&q, seed ^ (uint64_t)g * 0x9E37ULL ^ (uint64_t)(pc + 3) * 0x1234567ULL);
      int64_t d = ref_rng_int(&q, 0, 5);
      return op == WEFT_OP_MAX ? base - d : base + d;
    }
    default:
      return 0;
  }
}

/* Partial DTensors made with from_local from integer pieces: redistribute
 * to random targets gives the shards of distribute(x, b) where x is the
 * exact reduction of the pieces. */
static void case_partial(void) {
  WREQUIRE(weft_worker_argc >= 5, "usage: partial MESHES NCASES SEED");
  int ncases = atoi(weft_worker_argv[3]);
  uint64_t seed = strtoull(weft_worker_argv[4], NULL, 10);
  char meshes[256];
  snprintf(meshes, sizeof meshes, "%s", weft_worker_argv[2]);
  static const weft_dtype dts[] = {WEFT_F32, WEFT_F64, WEFT_BF16, WEFT_I32, WEFT_I64, WEFT_U8};
  int done = 0;
  for (char *tok = strtok(meshes, ","); tok; tok = strtok(NULL, ",")) {
    int mshape[8];
    int k = parse_mesh(tok, mshape);
    weft_mesh *mesh = make_mesh(k, mshape);
    if (!mesh) return;
    int me[8];
    my_coords(mesh, me);
    ref_rng r;
    ref_rng_seed(&r, seed * 31 + (uint64_t)k);
    for (int it = 0; it < ncases; it++) {
      int nd = ref_rng_int(&r, 1, 3);
      int64_t shape[4];
      for (int d = 0; d < nd; d++) shape[d] = ref_rng_int(&r, 0, 9);
      weft_dtype dt = dts[ref_rng_int(&r, 0, 5)];
      weft_reduce_op op = (weft_reduce_op)ref_rng_int(&r, 0, 3);
      if (dt == WEFT_U8 && op == WEFT_OP_AVG) op = WEFT_OP_MAX;
      weft_placement a[8], b[8];
      ref_random_placements(&r, k, mshape, nd, a);
      ref_random_placements(&r, k, mshape, nd, b);
      /* at least one Partial mesh dim in the source */
      int np = 0;
      for (int i = 0; i < k; i++)
        if (ref_rng_int(&r, 0, 2) == 0 || (i == k - 1 && np == 0)) {
          a[i] = weft_partial(op);
          np++;
        }
      /* the target may keep a Partial where the source has it */
      for (int i = 0; i < k; i++)
        if (a[i].kind == WEFT_PLACE_PARTIAL && ref_rng_int(&r, 0, 4) == 0) b[i] = a[i];
      uint64_t pseed = ref_rng_next(&r);
      weft_dtensor_spec sa, sr;
      WCHECK(weft_dtensor_spec_init_mesh(&sa, mesh, a, k, dt, nd, shape) == WEFT_OK, "%s",
             weft_last_error());
      /* sr: the source with Partial replaced by Replicate, for the geometry */
      sr = sa;
      int pdims[8], npd = 0;
      for (int i = 0; i < k; i++)
        if (sa.placements[i].kind == WEFT_PLACE_PARTIAL) {
          sr.placements[i] = weft_replicate();
          pdims[npd++] = i;
        }
      int npc = 1;
      for (int q = 0; q < npd; q++) npc *= mshape[pdims[q]];
      char desc[768], base[600];
      ref_case_describe(&sa, b, base, sizeof base);
      snprintf(desc, sizeof desc, "[seed %llu mesh %s case %d] %s", (unsigned long long)seed, tok,
               it, base);
      /* x = exact reduction of the pieces over every Partial coordinate */
      weft_tensor *x = NULL;
      weft_tensor_create(dt, WEFT_CPU, nd, shape, &x);
      int64_t total = weft_tensor_numel(x);
      bool uns = dt == WEFT_U8;
      for (int64_t g = 0; g < total; g++) {
        double acc = op == WEFT_OP_MAX ? -1e300 : op == WEFT_OP_MIN ? 1e300 : 0;
        for (int pc = 0; pc < npc; pc++) {
          int pc1 = pc / (npc / mshape[pdims[0]]);
          double v = (double)piece(op, pseed, g, pc, pc1, mshape[pdims[0]], uns);
          if (op == WEFT_OP_MAX)
            acc = v > acc ? v : acc;
          else if (op == WEFT_OP_MIN)
            acc = v < acc ? v : acc;
          else
            acc += v;
        }
        if (op == WEFT_OP_AVG) acc /= npc;
        int64_t idx[4], rem = g;
        for (int d = nd - 1; d >= 0; d--) {
          idx[d] = rem % shape[d];
          rem /= shape[d];
        }
        weft_tensor_set(x, idx, acc);
      }
      /* this rank's piece of its shard */
      int mypc = 0;
      for (int q = 0; q < npd; q++) mypc = mypc * mshape[pdims[q]] + me[pdims[q]];
      int mypc1 = me[pdims[0]];
      int64_t *gi[4], gl[4];
      int64_t lshape[4];
      for (int d = 0; d < nd; d++) {
        gi[d] = ref_indices(&sr, me, d, &gl[d]);
        lshape[d] = gl[d];
      }
      weft_tensor *loc = NULL;
      weft_tensor_create(dt, WEFT_CPU, nd, lshape, &loc);
      int64_t ln = weft_tensor_numel(loc);
      for (int64_t e = 0; e < ln; e++) {
        int64_t li[4], rem = e, g = 0;
        for (int d = nd - 1; d >= 0; d--) {
          li[d] = rem % lshape[d];
          rem /= lshape[d];
        }
        for (int d = 0; d < nd; d++) g = g * shape[d] + gi[d][li[d]];
        weft_tensor_set(loc, li, (double)piece(op, pseed, g, mypc, mypc1, mshape[pdims[0]], uns));
      }
      for (int d = 0; d < nd; d++) free(gi[d]);
      move_to(&loc, weft_mesh_device(mesh)); /* from_local takes it on the mesh's device */
      weft_dtensor *da = NULL, *db = NULL;
      weft_status st = weft_dtensor_from_local(mesh, loc, WEFT_LOCAL_TAKE, a, k, shape, &da);
      WCHECK(st == WEFT_OK, "%s: from_local: %s", desc, weft_last_error());
      if (st != WEFT_OK) weft_tensor_destroy(loc);
      if (st == WEFT_OK) {
        check_dtensor_device(da, "from_local", desc);
        st = weft_dtensor_redistribute(da, b, k, &db);
        WCHECK(st == WEFT_OK, "%s: redistribute: %s", desc, weft_last_error());
      }
      if (st == WEFT_OK) {
        bool keeps_partial = false;
        for (int i = 0; i < k; i++)
          if (weft_dtensor_placements(db)[i].kind == WEFT_PLACE_PARTIAL) keeps_partial = true;
        if (keeps_partial)
          check_dtensor_device(db, "redistribute(partial, b)", desc);
        else
          check_local(db, x, "redistribute(partial, b)", desc);
        weft_tensor *full = full_on_host(db, desc);
        if (full && !weft_tensor_equal(full, x)) {
          int64_t bad = -1;
          for (int64_t g = 0; g < total && bad < 0; g++) {
            int64_t idx[4], rem = g;
            for (int d = nd - 1; d >= 0; d--) {
              idx[d] = rem % shape[d];
              rem /= shape[d];
            }
            if (weft_tensor_get(full, idx) != weft_tensor_get(x, idx)) bad = g;
          }
          WCHECK(false, "%s: full_tensor differs from the exact reduction (first at element %lld)",
                 desc, (long long)bad);
        }
        weft_tensor_destroy(full);
      }
      weft_dtensor_destroy(db);
      weft_dtensor_destroy(da);
      weft_tensor_destroy(x);
      done++;
    }
    WCHECK(weft_mesh_destroy(mesh) == WEFT_OK, "mesh_destroy: %s", weft_last_error());
  }
  if (weft_worker_rank == 0) printf("partial: %d cases\n", done);
}

/* ------------------------------------------------- comm accounting, R->P */

static weft_comm_count delta(const weft_mesh *m, int dim, weft_coll_kind kind,
                             weft_comm_count before) {
  weft_comm_count now = weft_comm_stats(m, dim, kind);
  weft_comm_count d = {now.calls - before.calls, now.bytes - before.bytes,
                       now.bus_bytes - before.bus_bytes, now.seconds - before.seconds};
  return d;
}

/* One redistribute on a fresh DTensor, checking the collectives it made. */
static void expect_move(weft_mesh *mesh, const char *from, const char *to, int64_t rows,
                        int64_t cols, weft_coll_kind kind, int64_t bytes) {
  int k = weft_mesh_ndim(mesh);
  weft_placement a[8], b[8];
  int na, nb;
  weft_placements_parse(from, a, 8, &na);
  weft_placements_parse(to, b, 8, &nb);
  int64_t shape[2] = {rows, cols};
  weft_tensor *x;
  weft_tensor_create(WEFT_F32, WEFT_CPU, 2, shape, &x);
  ref_fill_bytes(x, 99);
  weft_dtensor *da = NULL, *db = NULL;
  bool partial = a[0].kind == WEFT_PLACE_PARTIAL;
  if (partial) {
    /* a Partial source: every rank holds x (values unchecked here) */
    weft_tensor_fill(x, 1.0);
    WOK(weft_dtensor_from_local(mesh, x, WEFT_LOCAL_COPY, a, k, shape, &da));
  } else {
    WOK(weft_dtensor_distribute(mesh, x, WEFT_DTENSOR_ALL_RANKS, a, k, &da));
  }
  weft_comm_count tot0 = weft_comm_stats_dim(mesh, 0);
  weft_comm_count c0 = weft_comm_stats(mesh, 0, kind);
  if (da) WOK(weft_dtensor_redistribute(da, b, k, &db));
  weft_comm_count c = delta(mesh, 0, kind, c0);
  weft_comm_count all = weft_comm_stats_dim(mesh, 0);
  if (kind == WEFT_COLL_KIND_COUNT) {
    WCHECK(all.calls == tot0.calls, "%s -> %s: expected no communication, got %lld calls", from, to,
           (long long)(all.calls - tot0.calls));
  } else {
    WCHECK(
        c.calls == 1 && c.bytes == bytes && all.calls - tot0.calls == 1,
        "%s -> %s [%lld x %lld]: %lld calls / %lld bytes of %s (want 1 / %lld), %lld calls in all",
        from, to, (long long)rows, (long long)cols, (long long)c.calls, (long long)c.bytes,
        weft_coll_kind_name(kind), (long long)bytes, (long long)(all.calls - tot0.calls));
  }
  if (db && !partial) check_local(db, x, "move", from);
  weft_dtensor_destroy(db);
  weft_dtensor_destroy(da);
  weft_tensor_destroy(x);
}

static void case_comm(void) {
  int n = weft_world_size();
  int shape[1] = {n};
  weft_mesh *mesh = make_mesh(1, shape);
  if (!mesh) return;
  int64_t f = 4; /* f32 */
  /* even: payloads are the minimal ones */
  expect_move(mesh, "S(0)", "R", 8 * n, 12, WEFT_COLL_ALL_GATHER, 8 * n * 12 * f);
  expect_move(mesh, "S(1)", "R", 8, 3 * n, WEFT_COLL_ALL_GATHER, 8 * 3 * n * f);
  expect_move(mesh, "S(0)", "S(1)", 4 * n, 2 * n, WEFT_COLL_ALL_TO_ALL, 4 * 2 * n * f);
  expect_move(mesh, "S(1)", "S(0)", 4 * n, 2 * n, WEFT_COLL_ALL_TO_ALL, 4 * n * 2 * f);
  expect_move(mesh, "P(sum)", "R", 5, 7, WEFT_COLL_ALL_REDUCE, 5 * 7 * f);
  expect_move(mesh, "P(sum)", "S(0)", 2 * n, 7, WEFT_COLL_REDUCE_SCATTER, 2 * n * 7 * f);
  expect_move(mesh, "R", "S(1)", 5, 7, WEFT_COLL_KIND_COUNT, 0);
  /* uneven all-gather moves exactly the data (no padding) */
  expect_move(mesh, "S(0)", "R", 2 * n + 1, 3, WEFT_COLL_ALL_GATHER, (2 * n + 1) * 3 * f);
  /* uneven all-to-all: this rank sends its whole shard minus nothing padded */
  {
    int64_t rows = 2 * n + 1, cols = n + 1;
    int64_t my0, l0;
    weft_chunk_range(rows, n, weft_mesh_coord(mesh, 0), &my0, &l0);
    expect_move(mesh, "S(0)", "S(1)", rows, cols, WEFT_COLL_ALL_TO_ALL, l0 * cols * f);
  }
  /* Replicate -> Partial (internal): sum divides by n on floats (PyTorch's
   * _partition_value); integers keep the value on coordinate 0; avg, max,
   * min keep it everywhere */
  {
    int64_t s1[1] = {6};
    weft_tensor *x;
    weft_tensor_create(WEFT_F32, WEFT_CPU, 1, s1, &x);
    for (int64_t i = 0; i < 6; i++) weft_tensor_set(x, &i, (double)(i * n));
    weft_placement r[1] = {weft_replicate()}, p[1] = {weft_partial(WEFT_OP_SUM)};
    weft_dtensor *dr = NULL, *dp = NULL, *back = NULL;
    WOK(weft_dtensor_distribute(mesh, x, WEFT_DTENSOR_ALL_RANKS, r, 1, &dr));
    WCHECK(weft_dtensor_redistribute(dr, p, 1, &dp) == WEFT_ERR_INVALID,
           "R -> P must be refused by the public redistribute");
    weft_redistribute_opts o = WEFT_REDISTRIBUTE_OPTS_INIT;
    o.allow_partial = true;
    WOK(weft_dtensor_redistribute_ex(dr, p, 1, &o, &dp));
    if (dp) {
      for (int64_t i = 0; i < 6; i++)
        WCHECK(weft_tensor_get(weft_dtensor_local(dp), &i) == (double)i, "R->P(sum) elem %lld: %g",
               (long long)i, weft_tensor_get(weft_dtensor_local(dp), &i));
      WOK(weft_dtensor_redistribute(dp, r, 1, &back));
      if (back) WCHECK(weft_tensor_equal(weft_dtensor_local(back), x), "P->R after R->P");
    }
    weft_dtensor_destroy(back);
    weft_dtensor_destroy(dp);
    weft_dtensor_destroy(dr);
    weft_tensor_destroy(x);
    /* integer sum */
    weft_tensor_create(WEFT_I32, WEFT_CPU, 1, s1, &x);
    for (int64_t i = 0; i < 6; i++) weft_tensor_set(x, &i, (double)(3 * i + 1));
    dr = dp = back = NULL;
    WOK(weft_dtensor_distribute(mesh, x, WEFT_DTENSOR_ALL_RANKS, r, 1, &dr));
    WOK(weft_dtensor_redistribute_ex(dr, p, 1, &o, &dp));
    if (dp) {
      int64_t i0 = 1;
      double v = weft_tensor_get(weft_dtensor_local(dp), &i0);
      WCHECK(v == (weft_mesh_coord(mesh, 0) == 0 ? 4.0 : 0.0), "int R->P(sum): %g on coord %d", v,
             weft_mesh_coord(mesh, 0));
      WOK(weft_dtensor_redistribute(dp, r, 1, &back));
      if (back) WCHECK(weft_tensor_equal(weft_dtensor_local(back), x), "int P->R after R->P");
    }
    weft_dtensor_destroy(back);
    weft_dtensor_destroy(dp);
    weft_dtensor_destroy(dr);
    /* max keeps the value */
    weft_placement pm[1] = {weft_partial(WEFT_OP_MAX)};
    dr = dp = back = NULL;
    WOK(weft_dtensor_distribute(mesh, x, WEFT_DTENSOR_ALL_RANKS, r, 1, &dr));
    WOK(weft_dtensor_redistribute_ex(dr, pm, 1, &o, &dp));
    if (dp) WCHECK(weft_tensor_equal(weft_dtensor_local(dp), x), "R->P(max) keeps the value");
    weft_dtensor_destroy(dp);
    weft_dtensor_destroy(dr);
    weft_tensor_destroy(x);
  }
  /* plans are reused across calls */
  {
    weft_redistribute_plan_cache_clear();
    int64_t s2[2] = {4 * n, 4};
    weft_tensor *x;
    weft_tensor_create(WEFT_F32, WEFT_CPU, 2, s2, &x);
    ref_fill_bytes(x, 5);
    weft_placement a[1] = {weft_shard(0)}, b[1] = {weft_shard(1)};
    for (int i = 0; i < 3; i++) {
      weft_dtensor *da = NULL, *db = NULL;
      WOK(weft_dtensor_distribute(mesh, x, WEFT_DTENSOR_ALL_RANKS, a, 1, &da));
      if (da) WOK(weft_dtensor_redistribute(da, b, 1, &db));
      weft_dtensor_destroy(db);
      weft_dtensor_destroy(da);
    }
    weft_plan_cache_stats cs = weft_redistribute_plan_cache_stats();
    WCHECK(cs.misses == 1 && cs.hits == 2, "plan cache: %lld misses %lld hits",
           (long long)cs.misses, (long long)cs.hits);
    weft_tensor_destroy(x);
  }
  WOK(weft_mesh_destroy(mesh));
}

/* ----------------------------------------------------------------- ops */

/* x (B, T, K) or (M, K); w as given; out compared with double loops. */
static void matmul_case(weft_mesh *mesh, bool linear, int nd_a, const int64_t *ashape,
                        const char *pa, const char *pb, const char *want_out) {
  int k = weft_mesh_ndim(mesh);
  int64_t K = ashape[nd_a - 1], N = 6, M = 1;
  for (int d = 0; d < nd_a - 1; d++) M *= ashape[d];
  int64_t bshape[2] = {linear ? N : K, linear ? K : N};
  weft_tensor *A, *B;
  weft_tensor_create(WEFT_F32, WEFT_CPU, nd_a, ashape, &A);
  weft_tensor_create(WEFT_F32, WEFT_CPU, 2, bshape, &B);
  weft_tensor_fill_normal(A, 7, 1, NULL, 0, 1);
  weft_tensor_fill_normal(B, 7, 2, NULL, 0, 1);
  double *want = calloc((size_t)(M * N) + 1, sizeof *want);
  const float *a = A->data, *b = B->data;
  for (int64_t i = 0; i < M; i++)
    for (int64_t j = 0; j < N; j++) {
      double s = 0;
      for (int64_t q = 0; q < K; q++)
        s += (double)a[i * K + q] * (linear ? (double)b[j * K + q] : (double)b[q * N + j]);
      want[i * N + j] = s;
    }
  weft_placement la[8], lb[8], lo[8];
  int n;
  weft_placements_parse(pa, la, 8, &n);
  weft_placements_parse(pb, lb, 8, &n);
  weft_placements_parse(want_out, lo, 8, &n);
  char desc[160];
  snprintf(desc, sizeof desc, "%s %s x %s", linear ? "linear" : "matmul", pa, pb);
  weft_dtensor *da = NULL, *db = NULL, *dc = NULL;
  /* A goes in from the host, B from the mesh's device */
  weft_tensor *Bd = NULL;
  WOK(weft_dtensor_distribute(mesh, A, 0, la, k, &da));
  WOK(weft_dtensor_distribute(mesh, tensor_on(B, weft_mesh_device(mesh), &Bd), 0, lb, k, &db));
  weft_tensor_destroy(Bd);
  if (da && db) {
    weft_status st = linear ? weft_dtensor_linear(da, db, &dc) : weft_dtensor_matmul(da, db, &dc);
    WCHECK(st == WEFT_OK, "%s: %s", desc, weft_last_error());
  }
  if (dc) {
    char got[128], exp[128];
    weft_placements_describe(weft_dtensor_placements(dc), k, got, sizeof got);
    weft_placements_describe(lo, k, exp, sizeof exp);
    WCHECK(strcmp(got, exp) == 0, "%s: output placements %s, want %s", desc, got, exp);
    check_dtensor_device(dc, "the output", desc);
    weft_tensor *full = full_on_host(dc, desc);
    if (full) {
      double e = weft_test_rel_max_f32_f64(full->data, want, M * N);
      WCHECK(e <= 1e-6, "%s: rel err %g", desc, e);
    }
    weft_tensor_destroy(full);
  }
  weft_dtensor_destroy(dc);
  weft_dtensor_destroy(da);
  weft_dtensor_destroy(db);
  weft_tensor_destroy(A);
  weft_tensor_destroy(B);
  free(want);
}

static void elementwise_case(weft_mesh *mesh, bool add, const char *pa, const char *pb,
                             const char *want_out, bool partial_a) {
  int k = weft_mesh_ndim(mesh);
  int64_t shape[2] = {6, 5};
  weft_tensor *A, *B;
  weft_tensor_create(WEFT_F32, WEFT_CPU, 2, shape, &A);
  weft_tensor_create(WEFT_F32, WEFT_CPU, 2, shape, &B);
  for (int64_t i = 0; i < 30; i++) {
    ((float *)A->data)[i] = (float)(i % 7) - 3;
    ((float *)B->data)[i] = (float)(i % 5) + 1;
  }
  weft_placement la[8], lb[8], lo[8];
  int n;
  weft_placements_parse(pa, la, 8, &n);
  weft_placements_parse(pb, lb, 8, &n);
  weft_placements_parse(want_out, lo, 8, &n);
  weft_dtensor *da = NULL, *db = NULL, *dc = NULL;
  if (partial_a) {
    /* a Partial(sum) a: coordinate 0 of that dim holds A, the others 0 */
    weft_placement lr[8];
    memcpy(lr, la, sizeof lr);
    int pdim = -1;
    for (int i = 0; i < k; i++)
      if (la[i].kind == WEFT_PLACE_PARTIAL) {
        lr[i] = weft_replicate();
        pdim = i;
      }
    weft_dtensor *tmp = NULL;
    WOK(weft_dtensor_distribute(mesh, A, WEFT_DTENSOR_ALL_RANKS, lr, k, &tmp));
    if (tmp) {
      weft_tensor *loc = weft_dtensor_local(tmp); /* on the mesh's device, as from_local wants */
      if (weft_mesh_coord(mesh, pdim) != 0) WOK(weft_tensor_fill(loc, 0));
      WOK(weft_dtensor_from_local(mesh, loc, WEFT_LOCAL_COPY, la, k, shape, &da));
    }
    weft_dtensor_destroy(tmp);
  } else {
    WOK(weft_dtensor_distribute(mesh, A, WEFT_DTENSOR_ALL_RANKS, la, k, &da));
  }
  WOK(weft_dtensor_distribute(mesh, B, WEFT_DTENSOR_ALL_RANKS, lb, k, &db));
  if (da && db) WOK(add ? weft_dtensor_add(da, db, &dc) : weft_dtensor_mul(da, db, &dc));
  if (dc) {
    char got[128], exp[128];
    weft_placements_describe(weft_dtensor_placements(dc), k, got, sizeof got);
    weft_placements_describe(lo, k, exp, sizeof exp);
    WCHECK(strcmp(got, exp) == 0, "%s %s, %s: output %s, want %s", add ? "add" : "mul", pa, pb, got,
           exp);
    char desc[160];
    snprintf(desc, sizeof desc, "%s %s, %s", add ? "add" : "mul", pa, pb);
    check_dtensor_device(dc, "the output", desc);
    weft_tensor *full = full_on_host(dc, desc);
    for (int64_t i = 0; full && i < 30; i++) {
      float a = ((float *)A->data)[i], b = ((float *)B->data)[i];
      float w = add ? a + b : a * b, g = ((float *)full->data)[i];
      WCHECK(g == w, "%s %s, %s: elem %lld %g want %g", add ? "add" : "mul", pa, pb, (long long)i,
             g, w);
    }
    weft_tensor_destroy(full);
  }
  weft_dtensor_destroy(dc);
  weft_dtensor_destroy(da);
  weft_dtensor_destroy(db);
  weft_tensor_destroy(A);
  weft_tensor_destroy(B);
}

static void reduce_case(weft_mesh *mesh, bool mean, const char *pa, int dim, bool keepdim,
                        const char *want_out) {
  int k = weft_mesh_ndim(mesh);
  int64_t shape[3] = {5, 4, 3};
  weft_tensor *A;
  weft_tensor_create(WEFT_F32, WEFT_CPU, 3, shape, &A);
  for (int64_t i = 0; i < 60; i++) ((float *)A->data)[i] = (float)((i * 7) % 11) - 5;
  weft_placement la[8], lo[8];
  int n;
  weft_placements_parse(pa, la, 8, &n);
  weft_placements_parse(want_out, lo, 8, &n);
  weft_dtensor *da = NULL, *dc = NULL;
  WOK(weft_dtensor_distribute(mesh, A, WEFT_DTENSOR_ALL_RANKS, la, k, &da));
  if (da)
    WOK(mean ? weft_dtensor_mean(da, dim, keepdim, &dc) : weft_dtensor_sum(da, dim, keepdim, &dc));
  if (dc) {
    char got[128], exp[128];
    weft_placements_describe(weft_dtensor_placements(dc), k, got, sizeof got);
    weft_placements_describe(lo, k, exp, sizeof exp);
    WCHECK(strcmp(got, exp) == 0, "%s %s dim %d: output %s, want %s", mean ? "mean" : "sum", pa,
           dim, got, exp);
    char desc[160];
    snprintf(desc, sizeof desc, "%s %s dim %d", mean ? "mean" : "sum", pa, dim);
    check_dtensor_device(dc, "the output", desc);
    weft_tensor *full = full_on_host(dc, desc);
    int d = dim < 0 ? dim + 3 : dim;
    WCHECK(full && full->ndim == (keepdim ? 3 : 2), "%s: result ndim", pa);
    for (int64_t i = 0; full && i < 5; i++)
      for (int64_t j = 0; j < 4; j++)
        for (int64_t l = 0; l < 3; l++) {
          int64_t idx[3] = {i, j, l};
          if (idx[d] != 0) continue;
          double s = 0;
          for (int64_t q = 0; q < shape[d]; q++) {
            int64_t t[3] = {i, j, l};
            t[d] = q;
            s += ((float *)A->data)[(t[0] * 4 + t[1]) * 3 + t[2]];
          }
          if (mean) s /= (double)shape[d];
          int64_t o[3];
          int on = 0;
          for (int e = 0; e < 3; e++)
            if (e != d || keepdim) o[on++] = e == d ? 0 : idx[e];
          double g = weft_tensor_get(full, o);
          WCHECK(fabs(g - s) <= 1e-6 * fmax(1, fabs(s)), "%s %s dim %d: got %g want %g",
                 mean ? "mean" : "sum", pa, dim, g, s);
        }
    weft_tensor_destroy(full);
  }
  weft_dtensor_destroy(dc);
  weft_dtensor_destroy(da);
  weft_tensor_destroy(A);
}

static void case_ops(void) {
  int n = weft_world_size();
  if (n == 2) {
    int s[1] = {2};
    weft_mesh *mesh = make_mesh(1, s);
    if (!mesh) return;
    int64_t a2[2] = {8, 5}, a3[3] = {4, 3, 6};
    /* matmul: row shard of the left input, column shard of the right, the
     * contracting dim, batch dims, partial pass-through, replicate */
    matmul_case(mesh, false, 2, a2, "S(0)", "R", "S(0)");
    matmul_case(mesh, false, 2, a2, "R", "S(1)", "S(1)");
    matmul_case(mesh, false, 2, a2, "S(1)", "S(0)", "P(sum)");
    matmul_case(mesh, false, 2, a2, "R", "R", "R");
    matmul_case(mesh, false, 3, a3, "S(0)", "R", "S(0)");
    matmul_case(mesh, false, 3, a3, "S(1)", "R", "S(1)");
    matmul_case(mesh, false, 3, a3, "S(2)", "S(0)", "P(sum)");
    /* linear (w is [out, in]): colwise w S(0), rowwise x S(-1) w S(1) */
    matmul_case(mesh, true, 3, a3, "R", "S(0)", "S(2)");
    matmul_case(mesh, true, 3, a3, "S(2)", "S(1)", "P(sum)");
    matmul_case(mesh, true, 3, a3, "S(0)", "R", "S(0)");
    /* incompatible placements: the cheapest redistribution wins (slicing b
     * locally; an all-to-all of a rather than an all-gather of b) */
    matmul_case(mesh, false, 2, a2, "S(1)", "R", "P(sum)");
    matmul_case(mesh, false, 2, a2, "S(0)", "S(0)", "P(sum)"); /* a2a of a beats gathering b */
    elementwise_case(mesh, true, "S(0)", "S(0)", "S(0)", false);
    elementwise_case(mesh, true, "S(0)", "S(1)", "S(0)", false);
    elementwise_case(mesh, false, "S(1)", "S(1)", "S(1)", false);
    elementwise_case(mesh, true, "P(sum)", "R", "P(sum)", true);
    elementwise_case(mesh, false, "P(sum)", "R", "P(sum)", true);
    elementwise_case(mesh, true, "R", "R", "R", false);
    reduce_case(mesh, false, "S(0)", 0, true, "P(sum)");
    reduce_case(mesh, true, "S(0)", 0, false, "P(sum)");
    reduce_case(mesh, false, "S(1)", 0, false, "S(0)");
    reduce_case(mesh, true, "S(2)", -1, true, "P(sum)");
    reduce_case(mesh, true, "R", 1, false, "R");
    WOK(weft_mesh_destroy(mesh));
  } else if (n == 4) {
    int s[2] = {2, 2};
    weft_mesh *mesh = make_mesh(2, s);
    if (!mesh) return;
    int64_t a2[2] = {9, 8}, a3[3] = {4, 5, 8};
    /* 2-D: dp batch shard + tp colwise / rowwise, nested row shards */
    matmul_case(mesh, true, 3, a3, "(S(0), R)", "(R, S(0))", "(S(0), S(2))");
    matmul_case(mesh, true, 3, a3, "(S(0), S(2))", "(R, S(1))", "(S(0), P(sum))");
    matmul_case(mesh, false, 2, a2, "(S(0), S(0))", "(R, R)", "(S(0), S(0))");
    matmul_case(mesh, false, 2, a2, "(S(1), S(1))", "(S(0), S(0))", "(P(sum), P(sum))");
    matmul_case(mesh, false, 2, a2, "(S(0), R)", "(R, S(1))", "(S(0), S(1))");
    /* FSDP over TP weight: (SS(0,2), S(0)) colwise */
    matmul_case(mesh, true, 2, a2, "(R, R)", "(SS(0,2), S(0))", "(SS(1,2), S(1))");
    elementwise_case(mesh, true, "(S(0), S(1))", "(S(0), S(1))", "(S(0), S(1))", false);
    elementwise_case(mesh, false, "(S(0), R)", "(R, S(1))", "(S(0), S(1))", false);
    reduce_case(mesh, false, "(S(0), S(1))", 1, false, "(S(0), P(sum))");
    reduce_case(mesh, true, "(S(2), S(0))", 0, true, "(S(2), P(sum))");
    WOK(weft_mesh_destroy(mesh));
  }
}

/* ------------------------------------------------------------ bad input */

static void expect_err(weft_status got, weft_status want, const char *what, const char *needle) {
  WCHECK(got == want, "%s: got %s (%s), want %s", what, weft_status_str(got), weft_last_error(),
         weft_status_str(want));
  if (needle && got == want)
    WCHECK(strstr(weft_last_error(), needle) != NULL, "%s: message '%s' lacks '%s'", what,
           weft_last_error(), needle);
}

static void case_errors(void) {
  int s[2] = {2, 2};
  weft_mesh *mesh = make_mesh(2, s);
  if (!mesh) return;
  int64_t shape[2] = {4, 6};
  weft_tensor *x;
  weft_tensor_create(WEFT_F32, WEFT_CPU, 2, shape, &x);
  weft_tensor_fill(x, 2.0);
  weft_dtensor *d = NULL, *e = NULL;
  weft_placement bad_dim[2] = {weft_shard(2), weft_replicate()};
  expect_err(weft_dtensor_distribute(mesh, x, 0, bad_dim, 2, &d), WEFT_ERR_INVALID,
             "shard dim out of range", "out of range");
  WCHECK(d == NULL, "no DTensor on error");
  weft_placement one[1] = {weft_shard(0)};
  expect_err(weft_dtensor_distribute(mesh, x, 0, one, 1, &d), WEFT_ERR_INVALID,
             "one placement for a 2-d mesh", "one placement per mesh dim");
  weft_placement part[2] = {weft_partial(WEFT_OP_SUM), weft_replicate()};
  expect_err(weft_dtensor_distribute(mesh, x, 0, part, 2, &d), WEFT_ERR_INVALID,
             "distribute to Partial", "Partial");
  expect_err(weft_dtensor_distribute(mesh, x, 9, one, 1, &d), WEFT_ERR_INVALID, "src rank", NULL);
  /* the source passes NULL: every rank fails, nobody hangs */
  weft_placement ok[2] = {weft_shard(0), weft_shard(1)};
  const weft_tensor *arg = weft_mesh_rank(mesh) == 1 ? NULL : x;
  expect_err(weft_dtensor_distribute(mesh, arg, 1, ok, 2, &d), WEFT_ERR_INVALID,
             "source passes NULL", "source");
  /* one non-source rank passes a tensor of the wrong shape */
  weft_tensor *wrong;
  int64_t ws[2] = {4, 5};
  weft_tensor_create(WEFT_F32, WEFT_CPU, 2, ws, &wrong);
  expect_err(weft_dtensor_distribute(mesh, weft_mesh_rank(mesh) == 3 ? wrong : x, 0, ok, 2, &d),
             WEFT_ERR_MISMATCH, "shape differs from the source's", NULL);
  WOK(weft_dtensor_distribute(mesh, x, 0, ok, 2, &d));
  if (d) {
    check_dtensor_device(d, "distribute", "errors");
    weft_placement p3[3] = {weft_replicate(), weft_replicate(), weft_replicate()};
    expect_err(weft_dtensor_redistribute(d, p3, 3, &e), WEFT_ERR_INVALID, "3 placements", NULL);
    weft_placement tp[2] = {weft_partial(WEFT_OP_SUM), weft_shard(0)};
    expect_err(weft_dtensor_redistribute(d, tp, 2, &e), WEFT_ERR_INVALID,
               "Partial as a redistribute target", "Partial");
    weft_placement bd[2] = {weft_shard(0), weft_shard(-3)};
    expect_err(weft_dtensor_redistribute(d, bd, 2, &e), WEFT_ERR_INVALID,
               "redistribute shard dim out of range", "out of range");
    /* the mesh is held: destroy says busy and the mesh stays usable */
    expect_err(weft_mesh_destroy(mesh), WEFT_ERR_BUSY, "destroy a mesh in use", NULL);
    /* mismatched meshes */
    weft_mesh *other = make_mesh(2, s);
    weft_dtensor *o = NULL, *r = NULL;
    if (other) WOK(weft_dtensor_distribute(other, x, WEFT_DTENSOR_ALL_RANKS, ok, 2, &o));
    if (o) {
      expect_err(weft_dtensor_add(d, o, &r), WEFT_ERR_INVALID, "add on different meshes",
                 "different meshes");
      expect_err(weft_dtensor_matmul(d, o, &r), WEFT_ERR_INVALID, "matmul on different meshes",
                 "different meshes");
    }
    weft_dtensor_destroy(o);
    if (other) WOK(weft_mesh_destroy(other));
    /* shape errors of ops */
    expect_err(weft_dtensor_matmul(d, d, &r), WEFT_ERR_INVALID, "matmul 4x6 @ 4x6", "contracting");
    expect_err(weft_dtensor_sum(d, 2, false, &r), WEFT_ERR_INVALID, "sum dim 2", "out of range");
    /* from_local with a wrong local shape (no debug): this rank's own check */
    weft_tensor *l3;
    int64_t s3[2] = {3, 3};
    weft_tensor_create(WEFT_F32, WEFT_CPU, 2, s3, &l3);
    move_to(&l3, weft_mesh_device(mesh));
    expect_err(weft_dtensor_from_local(mesh, l3, WEFT_LOCAL_COPY, ok, 2, shape, &r),
               WEFT_ERR_INVALID, "from_local wrong local shape", "local shard has size");
    weft_tensor_destroy(l3);
    /* a device mesh: from_local of a host local (of the right shape) is an
     * offloaded DTensor (FSDP's CPUOffloadPolicy): its local stays on the
     * host and its full tensor is the global one */
    if (weft_mesh_device(mesh) == WEFT_CUDA) {
      weft_tensor *lh;
      int64_t sh[2] = {2, 3};
      weft_tensor_create(WEFT_F32, WEFT_CPU, 2, sh, &lh);
      weft_tensor_fill(lh, 1.0);
      r = NULL;
      WOK(weft_dtensor_from_local(mesh, lh, WEFT_LOCAL_COPY, ok, 2, shape, &r));
      WCHECK(r && weft_dtensor_local(r)->device == WEFT_CPU,
             "an offloaded DTensor's local left the host");
      weft_tensor *full = NULL;
      if (r) WOK(weft_dtensor_full_tensor(r, &full));
      bool ones = full != NULL;
      weft_tensor *fh = NULL;
      const weft_tensor *fr = full ? weft_worker_host_copy(full, &fh) : NULL;
      for (int64_t i = 0; fr && i < weft_tensor_numel(fr); i++)
        if (((const float *)fr->data)[i] != 1.0f) ones = false;
      WCHECK(ones, "full_tensor of an offloaded DTensor is not the global ones");
      weft_tensor_destroy(fh);
      weft_tensor_destroy(full);
      weft_dtensor_destroy(r);
      weft_tensor_destroy(lh);
    }
  }
  weft_dtensor_destroy(d);
  weft_tensor_destroy(wrong);
  weft_tensor_destroy(x);
  WOK(weft_mesh_destroy(mesh));
}

/* Under WEFT_DEBUG=1: one rank's local shape disagrees (globally
 * consistent with its own view, inconsistent with the others): every rank
 * gets WEFT_ERR_MISMATCH naming it; a consistent call passes. */
static void case_debug_from_local(void) {
  WCHECK(weft_get_settings()->debug, "run with WEFT_DEBUG=1");
  int s[2] = {2, 2};
  weft_mesh *mesh = make_mesh(2, s);
  if (!mesh) return;
  weft_placement pl[2] = {weft_shard(0), weft_replicate()};
  int64_t ls[2] = {3, 4};
  int me = weft_mesh_rank(mesh);
  if (me == 2) ls[0] = 2; /* derives a global shape of 4 rows, the others 6 */
  weft_tensor *loc;
  weft_tensor_create(WEFT_F32, WEFT_CPU, 2, ls, &loc);
  weft_tensor_fill(loc, 1);
  weft_dtensor *d = NULL;
  weft_status st = weft_dtensor_from_local(mesh, loc, WEFT_LOCAL_COPY, pl, 2, NULL, &d);
  expect_err(st, WEFT_ERR_MISMATCH, "inconsistent from_local under WEFT_DEBUG", "mesh rank 2");
  WCHECK(d == NULL, "no DTensor on error");
  weft_tensor_destroy(loc);
  /* uneven but consistent with an explicit global shape: 5 rows = 3 + 2 */
  ls[0] = weft_mesh_coord(mesh, 0) == 0 ? 3 : 2;
  weft_tensor_create(WEFT_F32, WEFT_CPU, 2, ls, &loc);
  weft_tensor_fill(loc, 1);
  int64_t gs[2] = {5, 4};
  WOK(weft_dtensor_from_local(mesh, loc, WEFT_LOCAL_VIEW, pl, 2, gs, &d));
  if (d) {
    WCHECK(weft_dtensor_local(d)->data == loc->data, "VIEW shares the memory");
    WOK(weft_dtensor_check(d));
  }
  weft_dtensor_destroy(d);
  weft_tensor_destroy(loc);
  /* a rank with a bad placement count: reported everywhere */
  ls[0] = 3;
  weft_tensor_create(WEFT_F32, WEFT_CPU, 2, ls, &loc);
  st = weft_dtensor_from_local(mesh, loc, WEFT_LOCAL_COPY, pl, me == 1 ? 1 : 2, NULL, &d);
  expect_err(st, me == 1 ? WEFT_ERR_INVALID : WEFT_ERR_MISMATCH, "bad placement count on rank 1",
             "mesh rank 1");
  weft_dtensor_destroy(d);
  weft_tensor_destroy(loc);
  WOK(weft_mesh_destroy(mesh));
}

/* Fill by global index: a DTensor's shards get the values of the full tensor. */
static void case_fill(void) {
  int s[2] = {2, 2};
  weft_mesh *mesh = make_mesh(2, s);
  if (!mesh) return;
  int64_t shape[2] = {7, 5};
  weft_placement cases[3][2] = {{weft_shard(0), weft_shard(1)},
                                {weft_strided_shard(0, 2), weft_replicate()},
                                {weft_replicate(), weft_shard(-1)}};
  weft_tensor *full;
  weft_tensor_create(WEFT_F32, WEFT_CPU, 2, shape, &full);
  weft_tensor_fill_normal(full, 3, 11, NULL, 0, 1);
  for (int c = 0; c < 3; c++) {
    weft_dtensor *d = NULL;
    WOK(weft_dtensor_empty(mesh, WEFT_F32, 2, shape, cases[c], 2, &d));
    if (d) {
      WOK(weft_dtensor_fill_normal(d, 3, 11, 0, 1));
      check_local(d, full, "fill_normal", "fill");
      char buf[1024];
      WOK(weft_dtensor_visualize_str(d, buf, sizeof buf));
      WCHECK(strstr(buf, "rows") != NULL, "visualize: %s", buf);
    }
    weft_dtensor_destroy(d);
  }
  weft_tensor_destroy(full);
  WOK(weft_mesh_destroy(mesh));
}

/* Views over a shard's storage: as_strided hands out a column slice of a
 * (S(0), R) tensor (rows strided by the full width), weft_dtensor_view
 * splits that slice's last dim without copying, and both behave as
 * DTensors (their shards, full_tensor, redistribute); an element outside
 * the shard's span is refused. */
static void case_views(void) {
  int s[2] = {2, 2};
  weft_mesh *mesh = make_mesh(2, s);
  if (!mesh) return;
  int64_t shape[2] = {6, 8}, cshape[2] = {6, 4}, hshape[3] = {6, 2, 2};
  weft_tensor *full, *cols, *colsc, *heads;
  weft_tensor_create(WEFT_F32, WEFT_CPU, 2, shape, &full);
  weft_tensor_fill_normal(full, 5, 0, NULL, 0, 1);
  weft_tensor_narrow(full, 1, 2, 4, &cols);
  weft_tensor_clone(cols, &colsc);
  weft_tensor_view(colsc, 3, hshape, &heads);
  weft_placement pl[2] = {weft_shard(0), weft_replicate()},
                 rr[2] = {weft_replicate(), weft_replicate()};
  weft_dtensor *x = NULL, *c = NULL, *h = NULL, *hr = NULL;
  WOK(weft_dtensor_distribute(mesh, full, WEFT_DTENSOR_ALL_RANKS, pl, 2, &x));
  if (x) {
    const int64_t st[2] = {8, 1};
    WOK(weft_dtensor_as_strided(x, 2, cshape, pl, 2, st, &c));
  }
  if (c) {
    WCHECK(!weft_tensor_is_contiguous(weft_dtensor_local(c)), "the slice is strided");
    WCHECK((char *)weft_dtensor_local(c)->data ==
               (char *)weft_dtensor_local(x)->data + 2 * sizeof(float),
           "the slice shares x's storage");
    check_local(c, colsc, "as_strided column slice", "views");
    WOK(weft_dtensor_view(c, 3, hshape, pl, &h));
  }
  if (h) {
    const weft_tensor *hl = weft_dtensor_local(h);
    WCHECK(hl->strides[0] == 8 && hl->strides[1] == 2 && hl->strides[2] == 1,
           "view strides %lld %lld %lld", (long long)hl->strides[0], (long long)hl->strides[1],
           (long long)hl->strides[2]);
    check_local(h, heads, "view of the slice", "views");
    weft_tensor *got = NULL;
    WOK(weft_dtensor_full_tensor(h, &got));
    if (got) WCHECK(weft_tensor_equal(got, heads), "full_tensor of a strided view");
    weft_tensor_destroy(got);
    WOK(weft_dtensor_redistribute(h, rr, 2, &hr));
    if (hr) check_local(hr, heads, "redistribute of a strided view", "views");
    /* merging the slice's rows and columns is no view */
    int64_t flat[1] = {24};
    weft_dtensor *bad = NULL;
    expect_err(weft_dtensor_view(c, 1, flat, pl, &bad), WEFT_ERR_INVALID,
               "view of a strided slice as one dim", "no view has the local shape");
    weft_dtensor_destroy(bad);
  }
  if (x) {
    const int64_t st[2] = {8, 1};
    weft_dtensor *bad = NULL;
    expect_err(weft_dtensor_as_strided(x, 2, cshape, pl, 5, st, &bad), WEFT_ERR_INVALID,
               "a slice past the shard's last element", "outside the 24 the local tensor spans");
    WCHECK(bad == NULL, "no DTensor on error");
  }
  weft_dtensor_destroy(hr);
  weft_dtensor_destroy(h);
  weft_dtensor_destroy(c);
  weft_dtensor_destroy(x);
  weft_tensor_destroy(heads);
  weft_tensor_destroy(colsc);
  weft_tensor_destroy(cols);
  weft_tensor_destroy(full);
  WOK(weft_mesh_destroy(mesh));
}

/* redistribute_into (preallocated and VIEW outputs) equals redistribute;
 * the buffer cache reuses blocks and gives them back when turned off. */
static void case_into_cache(void) {
  int s[2] = {2, 2};
  weft_mesh *mesh = make_mesh(2, s);
  if (!mesh) return;
  ref_rng r;
  ref_rng_seed(&r, 77);
  int64_t shape[2] = {403, 197}; /* shards of 80-320 KiB: above the cache's 64 KiB floor */
  weft_tensor *x;
  weft_tensor_create(WEFT_F32, WEFT_CPU, 2, shape, &x);
  ref_fill_bytes(x, 3);
  int mshape[2] = {2, 2};
  for (int it = 0; it < 40; it++) {
    weft_placement a[2], b[2];
    ref_random_placements(&r, 2, mshape, 2, a);
    ref_random_placements(&r, 2, mshape, 2, b);
    weft_dtensor *da = NULL, *want = NULL, *into = NULL;
    WOK(weft_dtensor_distribute(mesh, x, WEFT_DTENSOR_ALL_RANKS, a, 2, &da));
    if (!da) continue;
    WOK(weft_dtensor_redistribute(da, b, 2, &want));
    /* half the time the output is a VIEW of caller memory */
    if (it & 1) {
      weft_dtensor *tmp = NULL;
      WOK(weft_dtensor_zeros(mesh, WEFT_F32, 2, shape, b, 2, &tmp));
      weft_tensor *mem = NULL;
      if (tmp) weft_tensor_clone(weft_dtensor_local(tmp), &mem);
      weft_dtensor_destroy(tmp);
      if (mem) WOK(weft_dtensor_from_local(mesh, mem, WEFT_LOCAL_TAKE, b, 2, shape, &into));
    } else {
      WOK(weft_dtensor_empty(mesh, WEFT_F32, 2, shape, b, 2, &into));
    }
    if (into && want) {
      WOK(weft_dtensor_redistribute_into(da, into, NULL));
      weft_tensor *hi = NULL, *hw = NULL;
      WCHECK(weft_tensor_equal(tensor_on(weft_dtensor_local(into), WEFT_CPU, &hi),
                               tensor_on(weft_dtensor_local(want), WEFT_CPU, &hw)),
             "case %d: into differs from redistribute", it);
      weft_tensor_destroy(hi);
      weft_tensor_destroy(hw);
      check_dtensor_device(want, "redistribute", "into");
      check_local(into, x, "redistribute_into", "into");
    }
    weft_dtensor_destroy(into);
    weft_dtensor_destroy(want);
    weft_dtensor_destroy(da);
  }
  /* errors: a different shape; the input itself */
  {
    weft_placement rr[2] = {weft_replicate(), weft_replicate()};
    int64_t other[2] = {403, 196};
    weft_dtensor *da = NULL, *o = NULL;
    WOK(weft_dtensor_distribute(mesh, x, WEFT_DTENSOR_ALL_RANKS, rr, 2, &da));
    WOK(weft_dtensor_empty(mesh, WEFT_F32, 2, other, rr, 2, &o));
    if (da && o) {
      WCHECK(weft_dtensor_redistribute_into(da, o, NULL) == WEFT_ERR_INVALID, "shape mismatch");
      WCHECK(weft_dtensor_redistribute_into(da, da, NULL) == WEFT_ERR_INVALID, "into itself");
    }
    weft_dtensor_destroy(o);
    weft_dtensor_destroy(da);
  }
  /* cache: repeated same-size redistributes reuse blocks (of the mesh's
   * device, where the DTensors' memory is) */
  const weft_device dev = weft_mesh_device(mesh);
  weft_mem_stats m0 = weft_mem_get(dev);
  weft_dtensor_set_buffer_cache((size_t)64 << 20);
  weft_placement S0[2] = {weft_shard(0), weft_replicate()},
                 S1[2] = {weft_replicate(), weft_shard(1)};
  weft_dtensor *da = NULL;
  WOK(weft_dtensor_distribute(mesh, x, WEFT_DTENSOR_ALL_RANKS, S0, 2, &da));
  int64_t allocs_first = 0;
  for (int it = 0; it < 6 && da; it++) {
    weft_mem_stats before = weft_mem_get(dev);
    weft_dtensor *db = NULL;
    WOK(weft_dtensor_redistribute(da, S1, 2, &db));
    if (db) check_local(db, x, "cached redistribute", "cache");
    weft_dtensor_destroy(db);
    weft_mem_stats after = weft_mem_get(dev);
    int64_t n = after.alloc_count - before.alloc_count;
    if (it == 0) allocs_first = n;
    if (it >= 2 && dev == WEFT_CPU) /* a device's own caching allocator reuses its blocks */
      WCHECK(n < allocs_first, "call %d made %lld allocations on %s, the first %lld", it,
             (long long)n, weft_device_name(dev), (long long)allocs_first);
  }
  weft_dtensor_destroy(da);
  weft_dtensor_set_buffer_cache(0);
  weft_mem_stats m1 = weft_mem_get(dev);
  WCHECK(m1.current_bytes == m0.current_bytes, "cache off leaves %lld bytes on %s (before %lld)",
         (long long)m1.current_bytes, weft_device_name(dev), (long long)m0.current_bytes);
  weft_tensor_destroy(x);
  WOK(weft_mesh_destroy(mesh));
}

/* ---------------------------------------------------------- partition */

/* Replicate/Shard -> Partial(sum) divides by the mesh-dim size as
 * PyTorch's Partial._partition_value (`tensor / num_chunks`): on a 1x3 mesh
 * each rank's partial of random f32/f64 values is bitwise x / 3 computed in
 * the same precision (x * fl(1/3) differs from it for about two thirds of
 * f32 values). Partial -> Replicate then sums the three equal partials: the
 * result is bitwise fl(fl(q + q) + q) for q = x / 3, within 1 ulp of x
 * (IEEE division cannot make it exactly x for every x: the worker logs how
 * many differ), and a Replicate -> Shard -> Replicate trip stays bitwise. */
static double part_q(weft_dtype dt, double x) {
  return dt == WEFT_F32 ? (double)((float)x / 3.0f) : x / 3.0;
}
static double part_sum(weft_dtype dt, double q) {
  if (dt == WEFT_F32) {
    volatile float a = (float)q + (float)q; /* no contraction, no excess precision */
    volatile float b = a + (float)q;
    return (double)b;
  }
  volatile double a = q + q;
  volatile double b = a + q;
  return b;
}
static double part_ulp(weft_dtype dt, double x) {
  double ax = fabs(x);
  return dt == WEFT_F32 ? (double)(nextafterf((float)ax, INFINITY) - (float)ax)
                        : nextafter(ax, INFINITY) - ax;
}

static void case_partition(void) {
  WREQUIRE(weft_worker_argc >= 4, "usage: partition SEED NELEM");
  uint64_t seed = strtoull(weft_worker_argv[2], NULL, 10);
  int64_t n = atoll(weft_worker_argv[3]);
  int mshape[2] = {1, 3};
  weft_mesh *mesh = make_mesh(2, mshape);
  if (!mesh) return;
  WREQUIRE(weft_mesh_dim_size(mesh, 1) == 3, "needs 3 ranks");
  static const weft_dtype dts[2] = {WEFT_F32, WEFT_F64};
  const int64_t shape[2] = {n / 16, 16};
  const int64_t numel = shape[0] * shape[1];
  for (int t = 0; t < 2; t++) {
    const weft_dtype dt = dts[t];
    /* x: random values over many binades (never zero), the same on every rank */
    weft_tensor *x = NULL;
    WOK(weft_tensor_create(dt, WEFT_CPU, 2, shape, &x));
    if (!x) return;
    ref_rng r;
    ref_rng_seed(&r, seed + (uint64_t)t);
    for (int64_t e = 0; e < numel; e++) {
      double u = (double)(ref_rng_next(&r) >> 11) * 0x1p-53;
      double v =
          (0.5 + u) * ldexp(1.0, ref_rng_int(&r, -30, 30)) * (ref_rng_int(&r, 0, 1) ? 1 : -1);
      int64_t idx[2] = {e / shape[1], e % shape[1]};
      weft_tensor_set(x, idx, v);
    }
    const weft_placement srcs[2][2] = {{weft_replicate(), weft_replicate()},
                                       {weft_replicate(), weft_shard(0)}};
    const weft_placement P[2] = {weft_replicate(), weft_partial(WEFT_OP_SUM)};
    const weft_placement R[2] = {weft_replicate(), weft_replicate()};
    for (int s = 0; s < 2; s++) {
      const char *sname = s ? "(R, S(0))" : "(R, R)";
      weft_dtensor *a = NULL, *p = NULL, *back = NULL;
      WOK(weft_dtensor_distribute(mesh, x, WEFT_DTENSOR_ALL_RANKS, srcs[s], 2, &a));
      weft_redistribute_opts o = WEFT_REDISTRIBUTE_OPTS_INIT;
      o.allow_partial = true;
      if (a) WOK(weft_dtensor_redistribute_ex(a, P, 2, &o, &p));
      if (p) WOK(weft_dtensor_redistribute(p, R, 2, &back));
      if (!p || !back) {
        weft_dtensor_destroy(a);
        weft_dtensor_destroy(p);
        continue;
      }
      check_dtensor_device(p, "R -> P", sname);
      check_dtensor_device(back, "P -> R", sname);
      weft_tensor *pl_host = NULL, *bl_host = NULL;
      const weft_tensor *pl = tensor_on(weft_dtensor_local(p), WEFT_CPU, &pl_host);
      const weft_tensor *bl = tensor_on(weft_dtensor_local(back), WEFT_CPU, &bl_host);
      int64_t bad_q = 0, bad_sum = 0, off_ulp = 0, not_x = 0;
      for (int64_t e = 0; pl && bl && e < numel; e++) {
        int64_t idx[2] = {e / shape[1], e % shape[1]};
        double xv = weft_tensor_get(x, idx), q = part_q(dt, xv);
        double got = weft_tensor_get(pl, idx), rt = weft_tensor_get(bl, idx);
        if (memcmp(&got, &q, sizeof q) != 0) {
          if (bad_q++ < 3)
            WCHECK(false, "%s %s -> P: element %lld: partial %.17g, want x / 3 = %.17g (x = %.17g)",
                   weft_dtype_name(dt), sname, (long long)e, got, q, xv);
        }
        double want = part_sum(dt, q);
        if (memcmp(&rt, &want, sizeof rt) != 0 && bad_sum++ < 3)
          WCHECK(false, "%s %s -> P -> R: element %lld: %.17g, want the sum of partials %.17g",
                 weft_dtype_name(dt), sname, (long long)e, rt, want);
        if (fabs(rt - xv) > part_ulp(dt, xv) && off_ulp++ < 3)
          WCHECK(false, "%s %s -> P -> R: element %lld: %.17g is more than 1 ulp from x %.17g",
                 weft_dtype_name(dt), sname, (long long)e, rt, xv);
        if (rt != xv) not_x++;
      }
      WCHECK(bad_q == 0 && bad_sum == 0 && off_ulp == 0,
             "%s %s: %lld partials != x/3, %lld sums != reference, %lld off by > 1 ulp",
             weft_dtype_name(dt), sname, (long long)bad_q, (long long)bad_sum, (long long)off_ulp);
      if (weft_worker_rank == 0)
        printf(
            "partition %s %s on 1x3: %lld elements, partials == x/3: %lld, R->P->R != x "
            "(within 1 ulp): %lld\n",
            weft_dtype_name(dt), sname, (long long)numel, (long long)(numel - bad_q),
            (long long)not_x);
      weft_tensor_destroy(pl_host);
      weft_tensor_destroy(bl_host);
      weft_dtensor_destroy(a);
      weft_dtensor_destroy(p);
      weft_dtensor_destroy(back);
    }
    /* and the Shard round trip of the same values stays bitwise */
    weft_dtensor *a = NULL, *sh = NULL, *back = NULL;
    const weft_placement S1[2] = {weft_replicate(), weft_shard(1)};
    WOK(weft_dtensor_distribute(mesh, x, 0, R, 2, &a));
    if (a) WOK(weft_dtensor_redistribute(a, S1, 2, &sh));
    if (sh) WOK(weft_dtensor_redistribute(sh, R, 2, &back));
    if (back) {
      weft_tensor *bh = NULL;
      WCHECK(weft_tensor_equal(tensor_on(weft_dtensor_local(back), WEFT_CPU, &bh), x),
             "%s R -> S(1) -> R not bitwise", weft_dtype_name(dt));
      weft_tensor_destroy(bh);
    }
    weft_dtensor_destroy(a);
    weft_dtensor_destroy(sh);
    weft_dtensor_destroy(back);
    weft_tensor_destroy(x);
  }
  weft_mesh_destroy(mesh);
}

static const weft_worker_case cases[] = {{"property", case_property},
                                         {"partition", case_partition},
                                         {"into_cache", case_into_cache},
                                         {"partial", case_partial},
                                         {"comm", case_comm},
                                         {"ops", case_ops},
                                         {"errors", case_errors},
                                         {"debug_from_local", case_debug_from_local},
                                         {"fill", case_fill},
                                         {"views", case_views},
                                         {0}};

int main(int argc, char **argv) { return weft_worker_main(argc, argv, cases); }
