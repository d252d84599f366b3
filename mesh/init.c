/* Process setup: MPI init/finalize, node-local rank, settings from the
 * environment (the one place they are read), bf16/f16 reduction ops. */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "device_comm.h"
#include "mesh_internal.h"
#include "watchdog.h"

weft_runtime weft__rt = {
    .world_rank = 0,
    .world_size = 1,
    .local_rank = 0,
    .local_size = 1,
    .node_count = 1,
    .node_index = 0,
    .settings = {.timeout_s = 300.0,
                 .debug = false,
                 .backoff = -1,
                 .chunk_bytes = 1 << 30,
                 .mpi_finalize = -1},
    .sleep_waits = true,
};

bool weft_is_initialized(void) { return weft__rt.initialized; }
int weft_world_rank(void) { return weft__rt.world_rank; }
int weft_world_size(void) { return weft__rt.world_size; }
int weft_local_rank(void) { return weft__rt.local_rank; }
int weft_local_size(void) { return weft__rt.local_size; }
int weft_node_count(void) { return weft__rt.node_count; }
int weft_node_index(void) { return weft__rt.node_index; }

weft_status weft__node_facts(const int *world_ranks, int n, int *span, bool *whole) {
  const int *of = weft__rt.node_of;
  int k = weft__rt.node_count;
  *span = 1;
  *whole = true;
  if (!of || k <= 1) return WEFT_OK;
  /* in[x]: the set's ranks on node x; all[x]: the world's */
  int *in = calloc(2 * (size_t)k, sizeof *in), *all = in + k;
  if (!in) return weft_error(WEFT_ERR_OOM, "no memory to count the nodes of %d ranks", n);
  for (int i = 0; i < n; i++) in[of[world_ranks[i]]]++;
  for (int r = 0; r < weft__rt.world_size; r++) all[of[r]]++;
  *span = 0;
  for (int x = 0; x < k; x++) {
    *span += in[x] > 0;
    if (in[x] > 0 && in[x] < all[x]) *whole = false;
  }
  if (*span == 0) *span = 1;
  free(in);
  return WEFT_OK;
}

const weft_settings *weft_get_settings(void) { return &weft__rt.settings; }
void weft_set_timeout(double seconds) {
  if (seconds > 0 && isfinite(seconds)) weft__rt.settings.timeout_s = seconds;
}
void weft_set_debug(bool on) { weft__rt.settings.debug = on; }

weft_status weft__require_init(const char *func) {
  if (weft__rt.initialized) return WEFT_OK;
  return weft_error_at(WEFT_ERR_STATE, func, "weft_init has not been called");
}

/* ------------------------------------------------------------ settings */

/* Parses a whole-string integer; false if s is not one. */
static bool parse_int(const char *s, long *out) {
  if (!s || !*s) return false;
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  while (*end && isspace((unsigned char)*end)) end++;
  if (errno || *end) return false;
  *out = v;
  return true;
}

static bool word_is(const char *s, const char *const *words) {
  for (int i = 0; words[i]; i++)
    if (strcasecmp(s, words[i]) == 0) return true;
  return false;
}

/* An auto / 0 / 1 setting: *out = -1 (unset, empty or auto), 0 or 1. */
static weft_status read_auto01(const char *name, int *out) {
  static const char *const yes[] = {"1", "true", "yes", "on", NULL};
  static const char *const no[] = {"0", "false", "no", "off", NULL};
  static const char *const aut[] = {"-1", "auto", NULL};
  const char *v = getenv(name);
  *out = -1;
  if (!v || !*v || word_is(v, aut)) return WEFT_OK;
  if (word_is(v, no))
    *out = 0;
  else if (word_is(v, yes))
    *out = 1;
  else
    return weft_error(WEFT_ERR_INVALID, "%s='%s' (expected auto, 0 or 1)", name, v);
  return WEFT_OK;
}

/* WEFT_TIMEOUT (seconds, > 0), WEFT_DEBUG (0/1), WEFT_BACKOFF (auto/0/1),
 * WEFT_CHUNK_BYTES (64..2^30, default 2^30), WEFT_MPI_FINALIZE (auto/0/1),
 * WEFT_PRESYNC_BYTES (0..2^40, default 65536), WEFT_TCP_EAGER (auto/0/1). */
weft_status weft_read_settings(weft_settings *s) {
  static const char *const yes[] = {"1", "true", "yes", "on", NULL};
  static const char *const no[] = {"0", "false", "no", "off", "", NULL};
  s->timeout_s = 300.0;
  s->debug = false;
  s->backoff = -1;
  s->chunk_bytes = 1 << 30;
  s->presync_bytes = 65536;
  s->tcp_eager_applied = false;
  const char *v = getenv("WEFT_TIMEOUT");
  if (v && *v) {
    char *end;
    double t = strtod(v, &end);
    if (*end || !(t > 0) || !isfinite(t))
      return weft_error(WEFT_ERR_INVALID, "WEFT_TIMEOUT='%s' is not a positive number of seconds",
                        v);
    s->timeout_s = t;
  }
  v = getenv("WEFT_DEBUG");
  if (v) {
    if (word_is(v, yes))
      s->debug = true;
    else if (!word_is(v, no))
      return weft_error(WEFT_ERR_INVALID, "WEFT_DEBUG='%s' (expected 0 or 1)", v);
  }
  static const char *const aut[] = {"-1", "auto", NULL};
  v = getenv("WEFT_BACKOFF");
  if (v && *v) {
    static const char *const never[] = {"0", "never", "spin", NULL};
    static const char *const always[] = {"1", "always", "sleep", NULL};
    if (word_is(v, never))
      s->backoff = 0;
    else if (word_is(v, always))
      s->backoff = 1;
    else if (!word_is(v, aut))
      return weft_error(WEFT_ERR_INVALID, "WEFT_BACKOFF='%s' (expected auto, 0 or 1)", v);
  }
  WEFT_CHECK(read_auto01("WEFT_MPI_FINALIZE", &s->mpi_finalize));
  v = getenv("WEFT_CHUNK_BYTES");
  if (v && *v) {
    long x;
    if (!parse_int(v, &x) || x < 64 || x > (1l << 30))
      return weft_error(WEFT_ERR_INVALID, "WEFT_CHUNK_BYTES='%s' (expected 64..2^30)", v);
    s->chunk_bytes = x;
  }
  v = getenv("WEFT_PRESYNC_BYTES");
  if (v && *v) {
    long x;
    if (!parse_int(v, &x) || x < 0 || x > (1l << 40))
      return weft_error(WEFT_ERR_INVALID, "WEFT_PRESYNC_BYTES='%s' (expected 0..2^40; 0 = never)",
                        v);
    s->presync_bytes = x;
  }
  WEFT_CHECK(read_auto01("WEFT_TCP_EAGER", &s->tcp_eager));
  return WEFT_OK;
}

/* Whether, before MPI_Init, the launcher says this job spans nodes: hydra
 * (MPICH's mpiexec) sets MPI_LOCALNRANKS (ranks on this node) and PMI_SIZE,
 * Slurm SLURM_JOB_NUM_NODES. Unknown counts as one node. */
static bool launcher_spans_nodes(void) {
  long local, size, nodes;
  const char *l = getenv("MPI_LOCALNRANKS"), *n = getenv("PMI_SIZE");
  if (l && n && parse_int(l, &local) && parse_int(n, &size)) return local > 0 && local < size;
  const char *sn = getenv("SLURM_JOB_NUM_NODES");
  return sn && parse_int(sn, &nodes) && nodes > 1;
}

/* Whether this host has an RDMA device (InfiniBand, RoCE, iWARP: anything
 * under /sys/class/infiniband); without one, UCX's only way to another
 * node is TCP. */
static bool host_has_rdma(void) {
  DIR *d = opendir("/sys/class/infiniband");
  if (!d) return false;
  bool any = false;
  for (struct dirent *e; !any && (e = readdir(d));) any = e->d_name[0] != '.';
  closedir(d);
  return any;
}

/* ------------------------------------------------------- bf16/f16 ops */

/* MPI has no bf16/f16 types: they travel as MPI_UINT16_T and reduce with
 * user ops that widen to float, combine and round back (nearest even), as
 * NCCL does per step. Each op is tied to one format and one operation. */
/* note: chunked collectives (collectives.c) reduce over a contiguous run of
 * uint16 resized to a larger extent, so an "element" of *dt is `size / 2`
 * values at a stride of `extent` bytes. */
#define WEFT_OP16_BODY(conv_in, conv_out, combine)                     \
  int size_ = 2;                                                       \
  MPI_Aint lb_ = 0, extent_ = 2;                                       \
  if (*dt != MPI_UINT16_T) {                                           \
    MPI_Type_size(*dt, &size_);                                        \
    MPI_Type_get_extent(*dt, &lb_, &extent_);                          \
  }                                                                    \
  for (int k = 0; k < *len; k++) {                                     \
    uint16_t *a = (uint16_t *)((char *)in + (MPI_Aint)k * extent_);    \
    uint16_t *b = (uint16_t *)((char *)inout + (MPI_Aint)k * extent_); \
    for (int i = 0; i < size_ / 2; i++) {                              \
      float x = conv_in(a[i]), y = conv_in(b[i]);                      \
      b[i] = conv_out(combine);                                        \
    }                                                                  \
  }

/* NaN propagates through max/min, as torch.maximum does. */
static inline float max_nan(float x, float y) { return isnan(x) || x > y ? x : y; }
static inline float min_nan(float x, float y) { return isnan(x) || x < y ? x : y; }

static void bf16_sum(void *in, void *inout, int *len, MPI_Datatype *dt) {
  WEFT_OP16_BODY(weft_bf16_to_f32, weft_f32_to_bf16, x + y)
}
static void bf16_max(void *in, void *inout, int *len, MPI_Datatype *dt) {
  WEFT_OP16_BODY(weft_bf16_to_f32, weft_f32_to_bf16, max_nan(x, y))
}
static void bf16_min(void *in, void *inout, int *len, MPI_Datatype *dt) {
  WEFT_OP16_BODY(weft_bf16_to_f32, weft_f32_to_bf16, min_nan(x, y))
}
static void f16_sum(void *in, void *inout, int *len, MPI_Datatype *dt) {
  WEFT_OP16_BODY(weft_f16_to_f32, weft_f32_to_f16, x + y)
}
static void f16_max(void *in, void *inout, int *len, MPI_Datatype *dt) {
  WEFT_OP16_BODY(weft_f16_to_f32, weft_f32_to_f16, max_nan(x, y))
}
static void f16_min(void *in, void *inout, int *len, MPI_Datatype *dt){
    WEFT_OP16_BODY(weft_f16_to_f32, weft_f32_to_f16, min_nan(x, y))}
/* Native types, for chunked reduce-scatter: same loop over the chunk type's
 * layout as above, combining in the type itself. */
#define WEFT_OPN(name, T, combine)                                        \
  static void name(void *in, void *inout, int *len, MPI_Datatype *dt) {   \
    int size_;                                                            \
    MPI_Aint lb_, extent_;                                                \
    MPI_Type_size(*dt, &size_);                                           \
    MPI_Type_get_extent(*dt, &lb_, &extent_);                             \
    int per = size_ / (int)sizeof(T);                                     \
    for (int k = 0; k < *len; k++) {                                      \
      const T *a = (const T *)((const char *)in + (MPI_Aint)k * extent_); \
      T *b = (T *)((char *)inout + (MPI_Aint)k * extent_);                \
      for (int i = 0; i < per; i++) {                                     \
        T x = a[i], y = b[i];                                             \
        b[i] = (T)(combine);                                              \
      }                                                                   \
    }                                                                     \
  }
#define WEFT_OPN3(tag, T)               \
  WEFT_OPN(tag##_sum, T, x + y)         \
  WEFT_OPN(tag##_max, T, x > y ? x : y) \
  WEFT_OPN(tag##_min, T, x < y ? x : y)
WEFT_OPN3(blk_f32, float) WEFT_OPN3(blk_f64, double) WEFT_OPN3(blk_i32, int32_t)
    WEFT_OPN3(blk_i64, int64_t) WEFT_OPN3(blk_u8, uint8_t)

        static void free_ops(void) {
  for (int f = 0; f < 2; f++)
    for (int o = 0; o < 3; o++)
      if (weft__rt.ops16[f][o] != MPI_OP_NULL) MPI_Op_free(&weft__rt.ops16[f][o]);
  for (int d = 0; d < WEFT_DTYPE_COUNT; d++)
    for (int o = 0; o < 3; o++) {
      if (d != WEFT_BF16 && d != WEFT_F16 && weft__rt.ops_blk[d][o] != MPI_OP_NULL)
        MPI_Op_free(&weft__rt.ops_blk[d][o]);
      weft__rt.ops_blk[d][o] = MPI_OP_NULL;
    }
}

static weft_status create_ops(void) {
  MPI_User_function *fns[2][3] = {{bf16_sum, bf16_max, bf16_min}, {f16_sum, f16_max, f16_min}};
  MPI_User_function *blk[WEFT_DTYPE_COUNT][3] = {
      [WEFT_F32] = {blk_f32_sum, blk_f32_max, blk_f32_min},
      [WEFT_F64] = {blk_f64_sum, blk_f64_max, blk_f64_min},
      [WEFT_I32] = {blk_i32_sum, blk_i32_max, blk_i32_min},
      [WEFT_I64] = {blk_i64_sum, blk_i64_max, blk_i64_min},
      [WEFT_U8] = {blk_u8_sum, blk_u8_max, blk_u8_min},
  };
  for (int f = 0; f < 2; f++)
    for (int o = 0; o < 3; o++) weft__rt.ops16[f][o] = MPI_OP_NULL;
  for (int d = 0; d < WEFT_DTYPE_COUNT; d++)
    for (int o = 0; o < 3; o++) weft__rt.ops_blk[d][o] = MPI_OP_NULL;
  for (int f = 0; f < 2; f++)
    for (int o = 0; o < 3; o++)
      if (MPI_Op_create(fns[f][o], 1, &weft__rt.ops16[f][o]) != MPI_SUCCESS) goto fail;
  for (int d = 0; d < WEFT_DTYPE_COUNT; d++)
    for (int o = 0; o < 3; o++) {
      if (d == WEFT_BF16 || d == WEFT_F16) {
        weft__rt.ops_blk[d][o] = weft__rt.ops16[d == WEFT_F16][o];
        continue;
      }
      if (MPI_Op_create(blk[d][o], 1, &weft__rt.ops_blk[d][o]) != MPI_SUCCESS) goto fail;
    }
  return WEFT_OK;
fail:
  free_ops();
  return weft_error(WEFT_ERR_MPI, "MPI_Op_create failed for weft's reductions");
}

/* -------------------------------------------------------------- init */

/* What each rank tells the others at init (one nonblocking all-gather). */
typedef struct init_record {
  char host[MPI_MAX_PROCESSOR_NAME + 1];
  int env_rank, env_size; /* -1 unset, -2 not an integer */
  int env_local_rank, env_local_size;
  unsigned char cpus[sizeof(cpu_set_t)];
} init_record;

static int env_int(const char *name) {
  const char *v = getenv(name);
  if (!v || !*v) return -1;
  long x;
  if (!parse_int(v, &x) || x < 0 || x > 1 << 30) return -2;
  return (int)x;
}

/* Appends one env complaint to buf for every rank whose value disagrees. */
static int check_env(const init_record *recs, int n, char *buf, size_t cap) {
  size_t len = strlen(buf);
  int bad = 0;
  for (int r = 0; r < n; r++) {
    const init_record *x = &recs[r];
    char one[192] = "";
    if (x->env_rank == -2 || x->env_size == -2 || x->env_local_rank == -2 ||
        x->env_local_size == -2)
      snprintf(one, sizeof one,
               "world rank %d: RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE "
               "is not a non-negative integer",
               r);
    else if (x->env_rank >= 0 && x->env_rank != r)
      snprintf(one, sizeof one, "world rank %d: RANK=%d disagrees with MPI rank %d", r, x->env_rank,
               r);
    else if (x->env_size >= 0 && x->env_size != n)
      snprintf(one, sizeof one, "world rank %d: WORLD_SIZE=%d disagrees with MPI size %d", r,
               x->env_size, n);
    else if (x->env_local_rank >= 0 && x->env_local_size >= 0 &&
             x->env_local_rank >= x->env_local_size)
      snprintf(one, sizeof one, "world rank %d: LOCAL_RANK=%d is not below LOCAL_WORLD_SIZE=%d", r,
               x->env_local_rank, x->env_local_size);
    if (!one[0]) continue;
    if (bad < 4 && len + strlen(one) + 3 < cap) {
      len += (size_t)snprintf(buf + len, cap - len, "%s%s", bad ? "; " : "", one);
    }
    bad++;
  }
  if (bad > 4 && len + 32 < cap) snprintf(buf + len, cap - len, "; and %d more", bad - 4);
  return bad;
}

weft_status weft_init(int *argc, char ***argv) {
  if (weft__rt.initialized)
    return weft_error(WEFT_ERR_STATE, "weft_init called twice (call weft_finalize first)");
  weft_settings s;
  WEFT_CHECK(weft_read_settings(&s));
  weft__rt.settings = s;

  int inited = 0;
  MPI_Initialized(&inited);
  weft__rt.finalize_mpi = false;
  if (!inited) {
    /* note: MPICH 4.0.2 picks recursive halving for MPI_Ireduce_scatter_block
     * where its blocking call uses pairwise exchange above 512 KiB: on 2
     * ranks a 1 MiB nonblocking reduce-scatter took 1.2-2x the blocking one,
     * with sched_pairwise 1.00x (0.87-1.19x from 4 KiB to 16 MiB). A value
     * the user set wins; other MPIs ignore the variable. */
    setenv("MPIR_CVAR_IREDUCE_SCATTER_BLOCK_INTRA_ALGORITHM", "sched_pairwise", 0);
    /* note: over TCP, UCX's rendezvous (above its eager threshold) waits
     * for a handshake that queues behind bulk data in the same stream, so
     * when two ranks send to each other the directions run one after the
     * other (weft_settings.tcp_eager; docs/DESIGN.md "MPICH notes"). Only
     * for jobs that span nodes: MPICH 4.0.2 here also moves intra-node
     * data through UCX, and eager there made 4 ranks on 2 cores' 16 MiB
     * all-reduce 1.5 -> 1.1 GB/s. */
    int eager = s.tcp_eager < 0 ? launcher_spans_nodes() && !host_has_rdma() : s.tcp_eager;
    if (eager && !getenv("UCX_RNDV_THRESH")) {
      setenv("UCX_RNDV_THRESH", "inf", 1);
      weft__rt.settings.tcp_eager_applied = true;
    }
    int provided;
    if (MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS)
      return weft_error(WEFT_ERR_MPI, "MPI_Init_thread failed");
    weft__rt.finalize_mpi = true;
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &weft__rt.world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &weft__rt.world_size);
  weft_error_set_rank(weft__rt.world_rank);
  int n = weft__rt.world_size, me = weft__rt.world_rank;

  /* note: the node-local rank comes from an all-gather of host names rather
   * than MPI_Comm_split_type(MPI_COMM_TYPE_SHARED): with MPICH 4.0.2 the
   * latter is a blocking, busy-polling collective that took 0.25 s on 8
   * ranks over 2 cores, the nonblocking all-gather with backoff a few ms.
   * The same record carries the env checks and CPU affinity. */
  weft_status st = WEFT_OK;
  init_record mine;
  memset(&mine, 0, sizeof mine);
  int hlen = 0;
  MPI_Get_processor_name(mine.host, &hlen);
  mine.env_rank = env_int("RANK");
  mine.env_size = env_int("WORLD_SIZE");
  mine.env_local_rank = env_int("LOCAL_RANK");
  mine.env_local_size = env_int("LOCAL_WORLD_SIZE");
  cpu_set_t cs;
  CPU_ZERO(&cs);
  if (sched_getaffinity(0, sizeof cs, &cs) != 0) CPU_SET(0, &cs);
  memcpy(mine.cpus, &cs, sizeof cs);

  init_record *recs = malloc((size_t)n * sizeof *recs);
  if (!recs) {
    st = weft_error(WEFT_ERR_OOM, "no memory for %d init records", n);
    goto fail;
  }
  weft__rt.sleep_waits = true; /* policy unknown until the records are in */
  MPI_Request req;
  MPI_Iallgather(&mine, (int)sizeof mine, MPI_BYTE, recs, (int)sizeof mine, MPI_BYTE,
                 MPI_COMM_WORLD, &req);
  st = weft__wait_all(1, &req, s.timeout_s);
  if (st == WEFT_ERR_TIMEOUT) {
    st = weft_error(WEFT_ERR_TIMEOUT, "weft_init: not every rank reached weft_init within %g s",
                    s.timeout_s);
    free(recs);
    weft_error_set_rank(-1);
    return st; /* MPI cannot be finalised with the all-gather pending */
  }
  if (st != WEFT_OK) goto fail;

  char msg[1024] = "";
  if (check_env(recs, n, msg, sizeof msg)) {
    st = weft_error(WEFT_ERR_INVALID, "environment disagrees with MPI: %s", msg);
    goto fail;
  }
  int local = 0, nlocal = 0;
  cpu_set_t node;
  CPU_ZERO(&node);
  for (int r = 0; r < n; r++) {
    if (strcmp(recs[r].host, mine.host) != 0) continue;
    if (r < me) local++;
    nlocal++;
    cpu_set_t c;
    memcpy(&c, recs[r].cpus, sizeof c);
    CPU_OR(&node, &node, &c);
  }
  /* Nodes: a rank opens a node when no lower rank shares its host name;
   * nodes are numbered in that order. O(n^2) name compares, once. */
  free(weft__rt.node_of);
  weft__rt.node_of = malloc((size_t)n * sizeof *weft__rt.node_of);
  if (!weft__rt.node_of) {
    st = weft_error(WEFT_ERR_OOM, "no memory for the nodes of %d ranks", n);
    goto fail;
  }
  int nodes = 0;
  for (int r = 0; r < n; r++) {
    int q = 0;
    while (q < r && strcmp(recs[q].host, recs[r].host) != 0) q++;
    weft__rt.node_of[r] = q < r ? weft__rt.node_of[q] : nodes++;
  }
  int my_node = weft__rt.node_of[me];
  weft__rt.node_count = nodes;
  weft__rt.node_index = my_node;
  weft__rt.node_procs = nlocal;
  weft__rt.node_cpus = CPU_COUNT(&node) > 0 ? CPU_COUNT(&node) : 1;
  weft__rt.local_rank = mine.env_local_rank >= 0 ? mine.env_local_rank : local;
  weft__rt.local_size = mine.env_local_size >= 0 ? mine.env_local_size : nlocal;
  /* Backoff policy: sleep between tests when this node runs more of our
   * processes than it gives them CPUs (see wait.c for the measurements). */
  if (s.backoff >= 0)
    weft__rt.sleep_waits = s.backoff == 1;
  else
    weft__rt.sleep_waits = weft__rt.node_procs > weft__rt.node_cpus;
  free(recs);
  recs = NULL;

  WEFT_CHECK_GOTO(create_ops(), st, fail);
  MPI_Comm_idup(MPI_COMM_WORLD, &weft__rt.notice, &req);
  if (weft__wait_all(1, &req, s.timeout_s) != WEFT_OK) {
    st = weft_error(WEFT_ERR_TIMEOUT, "weft_init: duplicating the world communicator timed out");
    goto fail;
  }
  weft__rt.initialized = true;
  return WEFT_OK;

fail:
  free(recs);
  if (weft__rt.finalize_mpi) MPI_Finalize();
  weft__rt.finalize_mpi = false;
  weft__rt.world_rank = 0;
  weft__rt.world_size = 1;
  weft__rt.node_count = 1;
  weft__rt.node_index = 0;
  free(weft__rt.node_of);
  weft__rt.node_of = NULL;
  return st;
}

/* The PMI-1 finalize exchange MPI_Finalize ends with ("cmd=finalize" on
 * the fd hydra passes as PMI_FD, answered by "cmd=finalize_ack"), for a
 * process that does not call MPI_Finalize. Best effort: without PMI_FD, or
 * with PMI-2, or when no answer comes within timeout_s, it does nothing. */
static void pmi_finalize(double timeout_s) {
  const char *fd_s = getenv("PMI_FD"), *ver = getenv("MPIR_CVAR_PMI_VERSION");
  if (!fd_s || (ver && strcmp(ver, "1"))) return;
  char *end = NULL;
  long fd = strtol(fd_s, &end, 10);
  if (!end || *end || fd < 0) return;
  static const char msg[] = "cmd=finalize\n";
  if (write((int)fd, msg, sizeof msg - 1) != (ssize_t)(sizeof msg - 1)) return;
  char line[128];
  size_t n = 0;
  struct pollfd p = {.fd = (int)fd, .events = POLLIN};
  while (n + 1 < sizeof line && poll(&p, 1, (int)(timeout_s * 1000)) == 1) {
    if (read((int)fd, &line[n], 1) != 1 || line[n] == '\n') break;
    n++;
  }
}

/* Seconds weft_finalize waits for the other ranks after a wait timed out. */
#define FINALIZE_GRACE_S 1.0

weft_status weft_finalize(void) {
  if (!weft__rt.initialized) return WEFT_OK;
  weft__watch_shutdown(); /* the device collectives' watchdog (watchdog.h) */
  weft__device_bounce_release();
  (void)weft_device_empty_cache(WEFT_CPU); /* the host cache's free blocks (kernels/alloc.c) */
  weft__mesh_free_destroyed();             /* the structs of destroyed meshes (mesh.c) */
  int fin = weft__rt.settings.mpi_finalize;
  bool call_finalize = fin < 0 ? weft__rt.node_count == 1 : fin == 1;
  free_ops();
  weft_status st = WEFT_OK;
  /* note: MPI_Comm_free is local in MPICH; notices nobody received are
   * dropped with the communicator */
  MPI_Comm_free(&weft__rt.notice);
  if (weft__rt.finalize_mpi) {
    /* note: MPI_Finalize synchronises with a busy-polling barrier; meeting
     * first in a backoff barrier keeps oversubscribed ranks from spinning
     * against each other while the slowest one arrives. */
    /* note: after a wait that timed out, a rank may be gone: waiting the
     * whole timeout again here made a stopped rank end the others only
     * after twice WEFT_TIMEOUT, so then the barrier gets a short grace */
    const double wait_s = weft__rt.timed_out && weft__rt.settings.timeout_s > FINALIZE_GRACE_S
                              ? FINALIZE_GRACE_S
                              : weft__rt.settings.timeout_s;
    MPI_Request req;
    MPI_Ibarrier(MPI_COMM_WORLD, &req);
    if (weft__wait_all(1, &req, wait_s) != WEFT_OK) {
      st = weft_error(WEFT_ERR_TIMEOUT,
                      "weft_finalize: not every rank reached weft_finalize within %g s%s", wait_s,
                      wait_s < weft__rt.settings.timeout_s
                          ? " (a wait timed out before: another rank may be gone)"
                          : "");
      weft__rt.initialized = false;
      return st;
    }
    /* note: across nodes, MPICH 4.0.2 (ch4:ucx) with UCX 1.13.1's TCP
     * transport hangs in MPI_Finalize: a rank's endpoint close waits for a
     * peer that already closed its own and sits in the PMI barrier. A
     * program of 20 all-reduces hung in 13 of 20 runs on emulated nodes
     * (scripts/nodes.sh: 2 nodes x 2 ranks and 4 x 1), still in 1 of 8
     * with an all-pairs exchange first; UCX settings (TCP put off, eager
     * only, protocol v2) did not cure it. After the barrier above nothing
     * is in flight, so the process ends without it, but tells the process
     * manager it finalised: hydra kills the job's other processes when one
     * exits unfinalised (seen: rank 1 of 4 killed with signal 9 as rank 0
     * exited). */
    if (call_finalize) {
      MPI_Finalize();
    } else {
      fflush(NULL);
      pmi_finalize(weft__rt.settings.timeout_s);
    }
  }
  weft__rt.initialized = false;
  weft__rt.finalize_mpi = false;
  weft__rt.timed_out = false;
  weft__rt.node_count = 1;
  weft__rt.node_index = 0;
  free(weft__rt.node_of);
  weft__rt.node_of = NULL;
  weft_error_set_rank(-1);
  return st;
}
