/* MPI side of tests/cuda/test_device_comm.c (mesh device collectives).
 *
 * No GPU is needed: a fake "device" stands in for device memory. Blocks
 * from fake_alloc are host memory that the test's hooks (mesh/device_comm.h)
 * report as device memory; the fake copy checks the direction of every copy
 * (D2H must read fake memory into host memory, H2D the reverse) and counts
 * them. The real staging code of mesh/device_comm.c runs on top.
 *
 * Cases (argv[2], else $DC_SHAPE, is the mesh shape, "2", "4" or "2x2";
 * world size = product):
 *   id_exchange SHAPE  every rank of each dim (and of the flattened dim on
 *                      2-D meshes) ends with coordinate 0's 128-byte blob
 *   staged SHAPE       every collective x f32/bf16 x blocking/async (and
 *                      in place, ops) on fake device buffers, bitwise equal
 *                      to the same call on host buffers; accounting counts
 *                      the device call like the host one; the backend is
 *                      MPI staging
 *   mixed SHAPE        host send + device recv (and the reverse) fail with
 *                      WEFT_ERR_INVALID naming which, on every rank, without
 *                      using a sequence number
 *   log_once SHAPE     hooks that allow NCCL, every rank on fake GPU 0 of
 *                      one node: fallback, one log line per dim on its
 *                      coordinate 0 only, naming the ranks that share
 *   env_off SHAPE      hooks that allow NCCL, distinct fake GPUs, WEFT_NCCL=0
 *                      in the environment: fallback with that reason
 *   streams            the real WEFT_CUDA device (the emulator, or a GPU
 *                      the ranks share): staged all-reduces on each comm
 *                      stream are exact; on the emulator, with the stream
 *                      orderings left out they must come out wrong
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "device_comm.h"
#include "mesh.h"
#include "mesh_internal.h"
#include "weft_config.h"
#include "worker.h"

/* ------------------------------------------------------------ fake device */

#define FAKE_MAX 64
static struct {
  char *p;
  size_t n;
} fake[FAKE_MAX];
static int64_t fake_d2h, fake_h2d;
static int fake_ordinal;

static void *fake_alloc(size_t n) {
  for (int i = 0; i < FAKE_MAX; i++)
    if (!fake[i].p) {
      fake[i].p = malloc(n ? n : 1);
      fake[i].n = n ? n : 1;
      return fake[i].p;
    }
  return NULL;
}

static void fake_free(void *p) {
  for (int i = 0; i < FAKE_MAX; i++)
    if (p && fake[i].p == p) {
      free(p);
      fake[i].p = NULL;
    }
}

static bool fake_is_device(const void *p) {
  const char *c = p;
  for (int i = 0; i < FAKE_MAX; i++)
    if (fake[i].p && c >= fake[i].p && c < fake[i].p + fake[i].n) return true;
  return false;
}

static weft_status fake_copy(void *dst, const void *src, size_t bytes, weft_copy_kind kind,
                             weft_stream_id s) {
  WCHECK(s == weft_comm_stream(), "copy on stream %d, not the comm stream %d", (int)s,
         (int)weft_comm_stream());
  bool ok = kind == WEFT_COPY_D2H ? fake_is_device(src) && !fake_is_device(dst) &&
                                        fake_is_device((const char *)src + bytes - 1)
            : kind == WEFT_COPY_H2D ? fake_is_device(dst) && !fake_is_device(src) &&
                                          fake_is_device((char *)dst + bytes - 1)
                                    : false;
  WCHECK(ok, "copy of %zu bytes kind %d: wrong direction or outside a fake block", bytes,
         (int)kind);
  if (!ok) return weft_error(WEFT_ERR_INVALID, "fake copy in the wrong direction");
  memcpy(dst, src, bytes);
  if (kind == WEFT_COPY_D2H)
    fake_d2h++;
  else
    fake_h2d++;
  return WEFT_OK;
}

static int fake_device(void) { return fake_ordinal; }

static void use_fake(bool nccl, int ordinal) {
  fake_ordinal = ordinal;
  /* no streams: copies are done at the call */
  weft_device_hooks h = {
      .is_device = fake_is_device, .copy = fake_copy, .device = fake_device, .nccl = nccl};
  weft__device_hooks_set(&h);
}

/* ------------------------------------------------------------ mesh */

static weft_mesh *make_mesh(int *ndim) {
  const char *shape = weft_worker_argc > 2 ? weft_worker_argv[2] : getenv("DC_SHAPE");
  if (!shape) shape = "2";
  int s[2] = {1, 1}, nd = sscanf(shape, "%dx%d", &s[0], &s[1]);
  const char *names[2] = {"dp", "tp"};
  weft_mesh *m = NULL;
  weft_status st = weft_mesh_create(nd, s, names, &m);
  WCHECK(st == WEFT_OK, "mesh %s: %s", shape, weft_last_error());
  *ndim = nd;
  return st ? NULL : m;
}

/* The meshes to test: each root dim as a 1-D sub-mesh, and on 2-D meshes
 * the flattened dim. Returns how many (n <= 3). */
static int test_meshes(weft_mesh *root, int ndim, weft_mesh **out) {
  int k = 0;
  const char *names[2] = {"dp", "tp"};
  for (int d = 0; d < ndim; d++) {
    WOK(weft_mesh_submesh(root, 1, &names[d], &out[k]));
    k++;
  }
  if (ndim == 2) {
    WOK(weft_mesh_flatten(root, 2, names, "dp_tp", &out[k]));
    k++;
  }
  return k;
}

/* Random values in [-1, 1) of dtype dt (f32 or bf16). */
static void fill(void *b, int64_t n, weft_dtype dt, uint64_t salt) {
  for (int64_t i = 0; i < n; i++) {
    float v = (float)weft_test_sym(weft_test_mix64(salt * 1000003u + (uint64_t)i));
    if (dt == WEFT_BF16)
      ((uint16_t *)b)[i] = weft_f32_to_bf16(v);
    else
      ((float *)b)[i] = v;
  }
}

/* ------------------------------------------------------------ id_exchange */

static void fill_blob(unsigned char *b, size_t n, int wr, int salt) {
  for (size_t i = 0; i < n; i++)
    b[i] = (unsigned char)(weft_test_mix64((uint64_t)wr * 131 + salt * 7 + i) >> 7);
}

static void case_id_exchange(void) {
  int ndim;
  weft_mesh *root = make_mesh(&ndim);
  WREQUIRE(root, "no mesh");
  weft_mesh *ms[3];
  int k = test_meshes(root, ndim, ms);
  for (int t = 0; t < k; t++) {
    mesh_dim *g = weft__mesh_group(ms[t], 0, "test");
    WREQUIRE(g, "no group");
    unsigned char blob[128], want[128];
    fill_blob(blob, sizeof blob, weft_world_rank(), t);
    fill_blob(want, sizeof want, g->members[0], t);
    WOK(weft__comm_id_exchange(g, blob, sizeof blob));
    WCHECK(memcmp(blob, want, sizeof blob) == 0,
           "mesh %d (dim '%s', coord %d): blob is not "
           "coordinate 0's (world rank %d)",
           t, g->name, g->coord, g->members[0]);
    /* a second exchange on the same dim, another blob */
    fill_blob(blob, 40, weft_world_rank() + 100, t);
    fill_blob(want, 40, g->members[0] + 100, t);
    WOK(weft__comm_id_exchange(g, blob, 40));
    WCHECK(memcmp(blob, want, 40) == 0, "second exchange on dim '%s'", g->name);
  }
  /* bad arguments fail locally */
  mesh_dim *g = weft__mesh_group(ms[0], 0, "test");
  unsigned char b1[4];
  WCHECK(weft__comm_id_exchange(g, b1, 0) == WEFT_ERR_INVALID, "0 bytes accepted");
  WCHECK(weft__comm_id_exchange(g, NULL, 4) == WEFT_ERR_INVALID, "NULL blob accepted");
  for (int t = 0; t < k; t++) WOK(weft_mesh_destroy(ms[t]));
  WOK(weft_mesh_destroy(root));
}

/* ------------------------------------------------------------ staged */

enum { C_AG, C_AGV, C_RS, C_AR, C_BC, C_A2A, C_A2AV, C_N };
static const char *const cname[C_N] = {"all_gather", "all_gather_v", "reduce_scatter", "all_reduce",
                                       "broadcast",  "all_to_all",   "all_to_all_v"};
static const weft_coll_kind ckind[C_N] = {
    WEFT_COLL_ALL_GATHER, WEFT_COLL_ALL_GATHER, WEFT_COLL_REDUCE_SCATTER, WEFT_COLL_ALL_REDUCE,
    WEFT_COLL_BROADCAST,  WEFT_COLL_ALL_TO_ALL, WEFT_COLL_ALL_TO_ALL};

typedef struct layout {
  int64_t count;
  int64_t cnt[16], sc[16], sd[16], rc[16], rd[16];
  size_t sbytes, rbytes; /* send and recv buffer sizes (in place: rbytes only) */
  size_t result;         /* bytes of recv that hold the result */
} layout;

static void make_layout(layout *L, int which, int n, int me, size_t es, uint64_t salt,
                        bool in_place) {
  memset(L, 0, sizeof *L);
  L->count = 3 + (int64_t)(salt % 5);
  int64_t c = L->count;
  switch (which) {
    case C_AG:
      L->sbytes = in_place ? 0 : (size_t)c * es;
      L->rbytes = L->result = (size_t)(n * c) * es;
      break;
    case C_AGV: {
      int64_t total = 0;
      for (int i = 0; i < n; i++) total += L->cnt[i] = (int64_t)((i * 3 + salt) % 4);
      L->sbytes = (size_t)L->cnt[me] * es;
      L->rbytes = L->result = (size_t)total * es;
    } break;
    case C_RS:
      L->sbytes = in_place ? 0 : (size_t)(n * c) * es;
      L->rbytes = (size_t)(in_place ? n * c : c) * es;
      L->result = (size_t)c * es;
      break;
    case C_AR:
    case C_BC:
      L->sbytes = in_place || which == C_BC ? 0 : (size_t)c * es;
      L->rbytes = L->result = (size_t)c * es;
      break;
    case C_A2A:
      L->sbytes = in_place ? 0 : (size_t)(n * c) * es;
      L->rbytes = L->result = (size_t)(n * c) * es;
      break;
    case C_A2AV: {
      /* elements a -> b: (2a + 3b + salt) % 4; send blocks 1 apart, recv
       * blocks 2 apart (gaps must stay untouched) */
      int64_t so = 0, ro = 1;
      for (int j = 0; j < n; j++) {
        L->sc[j] = (int64_t)((2 * me + 3 * j + salt) % 4);
        L->sd[j] = so;
        so += L->sc[j] + 1;
        L->rc[j] = (int64_t)((2 * j + 3 * me + salt) % 4);
        L->rd[j] = ro;
        ro += L->rc[j] + 2;
      }
      L->sbytes = (size_t)so * es;
      L->rbytes = L->result = (size_t)ro * es;
    } break;
  }
}

/* One call on (send, recv) bases; in place derives send from recv. */
static weft_status call(weft_mesh *m, int which, const layout *L, weft_dtype dt, weft_reduce_op op,
                        bool in_place, void *sb, void *rb, weft_work **w) {
  size_t es = weft_dtype_size(dt);
  int me = weft_mesh_coord(m, 0);
  int64_t c = L->count;
  switch (which) {
    case C_AG:
      return weft_all_gather(m, 0, in_place ? (char *)rb + (size_t)(me * c) * es : sb, rb, c, dt,
                             w);
    case C_AGV:
      return weft_all_gather_v(m, 0, sb, rb, L->cnt, dt, w);
    case C_RS:
      return weft_reduce_scatter(m, 0, in_place ? rb : sb, rb, c, dt, op, w);
    case C_AR:
      return weft_all_reduce(m, 0, in_place ? rb : sb, rb, c, dt, op, w);
    case C_BC:
      return weft_broadcast(m, 0, rb, c, dt, weft_mesh_dim_size(m, 0) - 1, w);
    case C_A2A:
      return weft_all_to_all(m, 0, in_place ? rb : sb, rb, c, dt, w);
    default:
      return weft_all_to_all_v(m, 0, sb, L->sc, L->sd, rb, L->rc, L->rd, dt, w);
  }
}

static weft_status run(weft_mesh *m, int which, const layout *L, weft_dtype dt, weft_reduce_op op,
                       bool in_place, void *sb, void *rb, int mode) {
  if (mode == 0) return call(m, which, L, dt, op, in_place, sb, rb, NULL);
  weft_work *w = NULL;
  weft_status st = call(m, which, L, dt, op, in_place, sb, rb, &w);
  if (st) return st;
  if (mode == 1) return weft_work_wait(w);
  bool done = false;
  for (int i = 0; i < 2000000 && !done; i++) {
    st = weft_work_test(w, &done);
    if (st) return st;
  }
  return done ? WEFT_OK : weft_error(WEFT_ERR_TIMEOUT, "weft_work_test never done");
}

static void one(weft_mesh *m, int which, weft_dtype dt, weft_reduce_op op, bool in_place, int mode,
                uint64_t salt) {
  int n = weft_mesh_dim_size(m, 0), me = weft_mesh_coord(m, 0);
  size_t es = weft_dtype_size(dt);
  layout L;
  make_layout(&L, which, n, me, es, salt, in_place);
  uint64_t s = salt * 31 + (uint64_t)weft_world_rank() * 7 + 1;
  /* the same initial contents for the host and the device run */
  unsigned char *s0 = malloc(L.sbytes + 1), *r0 = malloc(L.rbytes + 1);
  fill(s0, (int64_t)(L.sbytes / es), dt, s);
  fill(r0, (int64_t)(L.rbytes / es), dt, s ^ 0xabcdef);
  unsigned char *hs = malloc(L.sbytes + 1), *hr = malloc(L.rbytes + 1);
  unsigned char *ds = fake_alloc(L.sbytes), *dr = fake_alloc(L.rbytes);
  memcpy(hs, s0, L.sbytes);
  memcpy(hr, r0, L.rbytes);
  memcpy(ds, s0, L.sbytes);
  memcpy(dr, r0, L.rbytes);
  void *hsb = L.sbytes ? hs : NULL, *dsb = L.sbytes ? ds : NULL;
  char what[160];
  snprintf(what, sizeof what, "%s %s op %s%s mode %d on '%s' (n %d, count %" PRId64 ")",
           cname[which], weft_dtype_name(dt), weft_reduce_op_name(op), in_place ? " in place" : "",
           mode, weft_mesh_dim_name(m, 0), n, L.count);

  weft_comm_count c0 = weft_comm_stats(m, 0, ckind[which]);
  weft_status st = run(m, which, &L, dt, op, in_place, hsb, hr, mode);
  WCHECK(st == WEFT_OK, "host %s: %s", what, weft_last_error());
  weft_comm_count c1 = weft_comm_stats(m, 0, ckind[which]);
  int64_t d2h = fake_d2h, h2d = fake_h2d;
  st = run(m, which, &L, dt, op, in_place, dsb, dr, mode);
  WCHECK(st == WEFT_OK, "device %s: %s", what, weft_last_error());
  weft_comm_count c2 = weft_comm_stats(m, 0, ckind[which]);

  WCHECK(memcmp(hr, dr, L.result) == 0, "%s: device result differs from the host result", what);
  if (which == C_A2AV) /* gaps of recv untouched: whole buffer equal */
    WCHECK(memcmp(hr, dr, L.rbytes) == 0, "%s: gaps differ", what);
  if (!in_place && L.sbytes)
    WCHECK(memcmp(ds, s0, L.sbytes) == 0, "%s: the device send buffer changed", what);
  WCHECK(c1.calls - c0.calls == 1 && c2.calls - c1.calls == 1,
         "%s: calls counted %" PRId64 " (host) and %" PRId64 " (device)", what, c1.calls - c0.calls,
         c2.calls - c1.calls);
  WCHECK(c2.bytes - c1.bytes == c1.bytes - c0.bytes &&
             c2.bus_bytes - c1.bus_bytes == c1.bus_bytes - c0.bus_bytes,
         "%s: device bytes %" PRId64 " vs host %" PRId64, what, c2.bytes - c1.bytes,
         c1.bytes - c0.bytes);
  bool reads = L.sbytes || in_place || which == C_BC, writes = true;
  if (which == C_BC) {
    reads = me == n - 1;
    writes = me != n - 1;
  }
  if (which == C_AGV && L.cnt[me] == 0) reads = false;
  if (L.result == 0) writes = false;
  if (reads) WCHECK(fake_d2h > d2h, "%s: nothing copied device -> host", what);
  if (writes) WCHECK(fake_h2d > h2d, "%s: nothing copied host -> device", what);
  if (!reads) WCHECK(fake_d2h == d2h, "%s: copied device -> host needlessly", what);
  mesh_dim *g = weft__mesh_group(m, 0, "test");
  WCHECK(weft__device_dim_backend(g) == WEFT_COMM_MPI_STAGED, "%s: backend %d", what,
         (int)weft__device_dim_backend(g));
  free(s0);
  free(r0);
  free(hs);
  free(hr);
  fake_free(ds);
  fake_free(dr);
}

static void case_staged(void) {
  use_fake(false, 0);
  int ndim;
  weft_mesh *root = make_mesh(&ndim);
  WREQUIRE(root, "no mesh");
  weft_mesh *ms[3];
  int k = test_meshes(root, ndim, ms);
  const weft_dtype dts[2] = {WEFT_F32, WEFT_BF16};
  uint64_t salt = 1;
  for (int t = 0; t < k; t++)
    for (int di = 0; di < 2; di++)
      for (int which = 0; which < C_N; which++)
        for (int mode = 0; mode < 3; mode++) {
          bool reduces = which == C_RS || which == C_AR;
          bool has_in_place = which == C_AG || which == C_RS || which == C_AR || which == C_A2A;
          for (int ip = 0; ip < (has_in_place ? 2 : 1); ip++)
            for (int op = 0; op < (reduces ? WEFT_OP_COUNT : 1); op++)
              one(ms[t], which, dts[di], (weft_reduce_op)op, ip == 1, mode, salt++);
        }
  for (int t = 0; t < k; t++) WOK(weft_mesh_destroy(ms[t]));
  WOK(weft_mesh_destroy(root));
  weft__device_hooks_set(NULL);
}

/* ------------------------------------------------------------ mixed */

static void expect_mixed(weft_status st, const char *what, const char *needle) {
  WCHECK(st == WEFT_ERR_INVALID, "%s: status %s", what, weft_status_str(st));
  WCHECK(strstr(weft_last_error(), needle) != NULL, "%s: message '%s' lacks '%s'", what,
         weft_last_error(), needle);
}

static void case_mixed(void) {
  use_fake(false, 0);
  int ndim;
  weft_mesh *m = make_mesh(&ndim);
  WREQUIRE(m, "no mesh");
  int n = weft_mesh_dim_size(m, 0);
  mesh_dim *g = weft__mesh_group(m, 0, "test");
  uint64_t seq = g->seq;
  weft_comm_count c0 = weft_comm_stats_dim(m, 0);
  float *h = calloc((size_t)(4 * n), sizeof *h), *d = fake_alloc((size_t)(4 * n) * sizeof *d);
  const char *hd = "send is host memory but recv is device memory";
  const char *dh = "send is device memory but recv is host memory";
  expect_mixed(weft_all_reduce(m, 0, h, d, 4, WEFT_F32, WEFT_OP_SUM, NULL), "all_reduce", hd);
  expect_mixed(weft_all_gather(m, 0, d, h, 4, WEFT_F32, NULL), "all_gather", dh);
  weft_work *w = (weft_work *)0x1;
  expect_mixed(weft_reduce_scatter(m, 0, d, h, 4, WEFT_F32, WEFT_OP_AVG, &w), "reduce_scatter", dh);
  WCHECK(w == NULL, "work handle not cleared on error");
  expect_mixed(weft_all_to_all(m, 0, h, d, 4, WEFT_F32, NULL), "all_to_all", hd);
  int64_t cnt[16], dsp[16];
  for (int i = 0; i < n; i++) cnt[i] = 1, dsp[i] = i;
  expect_mixed(weft_all_gather_v(m, 0, d, h, cnt, WEFT_F32, NULL), "all_gather_v", dh);
  expect_mixed(weft_all_to_all_v(m, 0, h, cnt, dsp, d, cnt, dsp, WEFT_F32, NULL), "all_to_all_v",
               hd);
  WCHECK(g->seq == seq, "a failed mixed call used a sequence number (%" PRIu64 " -> %" PRIu64 ")",
         seq, g->seq);
  weft_comm_count c1 = weft_comm_stats_dim(m, 0);
  WCHECK(c1.calls == c0.calls, "a failed mixed call was accounted");
  WCHECK(weft__device_dim_backend(g) == WEFT_COMM_UNDECIDED, "a failed mixed call chose a backend");
  /* a zero-byte buffer does not vote: device recv with an empty host send */
  for (int i = 0; i < n; i++) cnt[i] = i == weft_mesh_coord(m, 0) ? 0 : 1;
  for (int i = 0; i < n; i++) d[i] = -1.0f;
  WOK(weft_all_gather_v(m, 0, NULL, d, cnt, WEFT_F32, NULL));
  /* the group still works */
  for (int i = 0; i < 4; i++) h[i] = (float)(weft_world_rank() + i);
  WOK(weft_all_reduce(m, 0, h, h, 4, WEFT_F32, WEFT_OP_SUM, NULL));
  fake_free(d);
  free(h);
  WOK(weft_mesh_destroy(m));
  weft__device_hooks_set(NULL);
}

/* ------------------------------------------------------------ log line */

/* Runs a few device all-reduces on each test mesh with stderr captured;
 * checks the result against host, the backend, and the captured lines. */
static void fallback_run(const char *needle_reason) {
  int ndim;
  weft_mesh *root = make_mesh(&ndim);
  WREQUIRE(root, "no mesh");
  weft_mesh *ms[3];
  int k = test_meshes(root, ndim, ms);
  fflush(stderr);
  int saved = dup(2);
  FILE *tf = tmpfile();
  WREQUIRE(tf && saved >= 0, "no tmpfile");
  dup2(fileno(tf), 2);
  for (int rep = 0; rep < 3; rep++)
    for (int t = 0; t < k; t++) {
      one(ms[t], C_AR, WEFT_F32, WEFT_OP_SUM, false, rep % 2, 1000 + (uint64_t)rep);
      one(ms[t], C_AG, WEFT_BF16, WEFT_OP_SUM, false, 0, 2000 + (uint64_t)rep);
    }
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  fseek(tf, 0, SEEK_END);
  long len = ftell(tf);
  rewind(tf);
  char *text = calloc((size_t)len + 1, 1);
  if (len > 0 && fread(text, 1, (size_t)len, tf) != (size_t)len) text[0] = 0;
  fclose(tf);
  for (int t = 0; t < k; t++) {
    mesh_dim *g = weft__mesh_group(ms[t], 0, "test");
    char head[96];
    snprintf(head, sizeof head, "weft: mesh dim '%s': NCCL not used (", g->name);
    int lines = 0;
    const char *first = NULL;
    for (const char *p = strstr(text, head); p; p = strstr(p + 1, head)) {
      lines++;
      if (!first) first = p;
    }
    WCHECK(lines == (g->coord == 0 ? 1 : 0), "dim '%s' coord %d: %d log lines:\n%s", g->name,
           g->coord, lines, text);
    WCHECK(weft__device_dim_backend(g) == WEFT_COMM_MPI_STAGED, "dim '%s': backend %d", g->name,
           (int)weft__device_dim_backend(g));
    const char *reason = weft__device_dim_reason(g);
    char want[128];
    if (needle_reason)
      snprintf(want, sizeof want, "%s", needle_reason);
    else /* the first duplicate pair: coordinates 0 and 1 */
      snprintf(want, sizeof want, "world ranks %d and %d share GPU 0 on node", g->members[0],
               g->members[1]);
    WCHECK(strstr(reason, want) != NULL, "dim '%s': reason '%s' lacks '%s'", g->name, reason, want);
    if (first) {
      WCHECK(strstr(first, want) != NULL, "dim '%s': log line lacks '%s': %s", g->name, want,
             first);
      WCHECK(
          strstr(first, "collectives on device buffers go through MPI with host staging") != NULL,
          "dim '%s': log line %s", g->name, first);
    }
  }
  free(text);
  for (int t = 0; t < k; t++) WOK(weft_mesh_destroy(ms[t]));
  WOK(weft_mesh_destroy(root));
}

static void case_log_once(void) {
  use_fake(true, 0); /* NCCL allowed, but every rank on GPU 0 of this node */
  fallback_run(NULL);
  weft__device_hooks_set(NULL);
}

static void case_env_off(void) {
  use_fake(true, weft_world_rank()); /* distinct GPUs: only WEFT_NCCL=0 stops NCCL */
  fallback_run("WEFT_NCCL=0 is set");
  weft__device_hooks_set(NULL);
}

/* ------------------------------------------------------------ streams */

/* One staged all-reduce (in place, on the calling thread's comm stream) of
 * d between a host -> device copy on the compute stream that writes d and
 * a device -> device copy on the compute stream that reads it; returns how
 * many of the n results differ from the exact sum. */
static int64_t stream_round(weft_mesh *m, float *d, float *d2, float *pin, float *host, int64_t n,
                            bool async, int round) {
  int w = weft_mesh_dim_size(m, 0);
  size_t bytes = (size_t)n * sizeof(float);
  /* pinned source: the emulator reads it when the copy runs */
  for (int64_t i = 0; i < n; i++) pin[i] = (float)((weft_world_rank() + 1) * (i % 97 + round));
  WOK(weft_memcpy_async(WEFT_CUDA, d, pin, bytes, WEFT_COPY_H2D, WEFT_STREAM_COMPUTE));
  weft_work *wk = NULL;
  WOK(weft_all_reduce(m, 0, d, d, n, WEFT_F32, WEFT_OP_SUM, async ? &wk : NULL));
  if (async) WOK(weft_work_wait(wk));
  WOK(weft_memcpy_async(WEFT_CUDA, d2, d, bytes, WEFT_COPY_D2D, WEFT_STREAM_COMPUTE));
  WOK(weft_memcpy(WEFT_CUDA, host, d2, bytes, WEFT_COPY_D2H)); /* syncs the compute stream */
  int64_t bad = 0;
  for (int64_t i = 0; i < n; i++)
    bad += host[i] != (float)((int64_t)w * (w + 1) / 2 * (i % 97 + round));
  return bad;
}

/* The real device (the emulator with deferred streams in CI, or a GPU whose
 * ranks share it): a staged all-reduce on each communication stream,
 * blocking and async, gives the exact sum; on the emulator, with
 * weft__device_skip_order (the stream orderings left out, a missing
 * dependency) the deferred streams must give wrong answers. */
static void case_streams(void) {
  WOK(weft_device_init(WEFT_CUDA, weft_local_rank(), NULL));
  weft_mesh *m = NULL;
  int s = weft_world_size();
  const char *names[1] = {"dp"};
  WOK(weft_mesh_create(1, &s, names, &m));
  WREQUIRE(m, "no mesh");
  const int64_t n = 4096;
  size_t bytes = (size_t)n * sizeof(float);
  float *d = NULL, *d2 = NULL, *pin = NULL, *host = malloc(bytes);
  WOK(weft_alloc(WEFT_CUDA, bytes, (void **)&d));
  WOK(weft_alloc(WEFT_CUDA, bytes, (void **)&d2));
  WOK(weft_alloc_pinned(WEFT_CUDA, bytes, (void **)&pin));
  const weft_stream_id streams[3] = {WEFT_STREAM_COMM, WEFT_STREAM_FSDP_AG, WEFT_STREAM_FSDP_RS};
  int round = 0;
  for (int k = 0; k < 3; k++) {
    weft_stream_id prev;
    WOK(weft_comm_stream_set(streams[k], &prev));
    WCHECK(prev == WEFT_STREAM_COMM, "previous stream %d", (int)prev);
    WCHECK(weft_comm_stream() == streams[k], "stream not set");
    for (int async = 0; async < 2; async++) {
      int64_t bad = stream_round(m, d, d2, pin, host, n, async, ++round);
      WCHECK(bad == 0, "stream %s, %s: %lld of %lld wrong", weft_stream_name(streams[k]),
             async ? "async" : "blocking", (long long)bad, (long long)n);
#if WEFT_CUDA_EMULATED /* a GPU may happen to run the racing copies in order */
      weft__device_skip_order = true;
      bad = stream_round(m, d, d2, pin, host, n, async, ++round);
      weft__device_skip_order = false;
      WCHECK(bad > 0, "stream %s, %s: the missing dependency went unnoticed",
             weft_stream_name(streams[k]), async ? "async" : "blocking");
      WOK(weft_device_synchronize(WEFT_CUDA)); /* let the stray copies land */
#endif
    }
    /* a receive-only rank (broadcast from rank 0): the result lands after
     * the compute stream's earlier write of the buffer, not before it */
    for (int64_t i = 0; i < n; i++) pin[i] = weft_world_rank() == 0 ? (float)(i % 89 + k) : -1.0f;
    WOK(weft_memcpy_async(WEFT_CUDA, d, pin, bytes, WEFT_COPY_H2D, WEFT_STREAM_COMPUTE));
    WOK(weft_broadcast(m, 0, d, n, WEFT_F32, 0, NULL));
    /* the host waits for the comm stream (as the next collective on it
     * does): the emulator runs its queue, and the compute stream's write
     * only if an event orders the copy back after it */
    weft_event *ev = NULL;
    WOK(weft_event_record(WEFT_CUDA, streams[k], &ev));
    WOK(weft_event_synchronize(WEFT_CUDA, ev));
    weft_event_destroy(WEFT_CUDA, ev);
    WOK(weft_memcpy_async(WEFT_CUDA, d2, d, bytes, WEFT_COPY_D2D, WEFT_STREAM_COMPUTE));
    WOK(weft_memcpy(WEFT_CUDA, host, d2, bytes, WEFT_COPY_D2H));
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) bad += host[i] != (float)(i % 89 + k);
    WCHECK(bad == 0, "stream %s, broadcast: %lld of %lld wrong", weft_stream_name(streams[k]),
           (long long)bad, (long long)n);
    WOK(weft_comm_stream_set(WEFT_STREAM_COMM, NULL));
  }
  /* the pinned bounce buffers are reused: many calls, a few slots */
  WOK(weft_device_synchronize(WEFT_CUDA));
  int slots0 = weft__device_bounce_slots(NULL);
  for (int i = 0; i < 40; i++) {
    WOK(weft_comm_stream_set(streams[i % 3], NULL));
    WCHECK(stream_round(m, d, d2, pin, host, n, i % 2, 100 + i) == 0, "round %d wrong", i);
  }
  WOK(weft_comm_stream_set(WEFT_STREAM_COMM, NULL));
  size_t pool_bytes = 0;
  int slots = weft__device_bounce_slots(&pool_bytes);
  bool staged = weft__device_dim_backend(weft__mesh_group(m, 0, "streams")) == WEFT_COMM_MPI_STAGED;
  WCHECK(!staged || (slots >= 1 && slots <= 6 && slots <= slots0 + 3),
         "bounce pool: %d slots (%zu bytes) after 40 more calls, %d before", slots, pool_bytes,
         slots0);
  weft__device_bounce_release();
  WCHECK(weft__device_bounce_slots(NULL) == 0, "bounce pool not released");
  WCHECK(weft_comm_stream_set(WEFT_STREAM_COMPUTE, NULL) == WEFT_ERR_INVALID,
         "the compute stream accepted as a comm stream");
  WCHECK(strstr(weft_last_error(), "not a communication stream") != NULL, "message: %s",
         weft_last_error());
  weft_free_pinned(WEFT_CUDA, pin);
  weft_free(d);
  weft_free(d2);
  free(host);
  WOK(weft_mesh_destroy(m));
}

static const weft_worker_case cases[] = {{"id_exchange", case_id_exchange},
                                         {"staged", case_staged},
                                         {"mixed", case_mixed},
                                         {"log_once", case_log_once},
                                         {"env_off", case_env_off},
                                         {"streams", case_streams},
                                         {0}};

int main(int argc, char **argv) { return weft_worker_main(argc, argv, cases); }
