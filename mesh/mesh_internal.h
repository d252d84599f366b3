/* mesh/mesh_internal.h — private state shared by the mesh sources.
 *
 * Layout of a mesh (every rank holds its own copy):
 *
 *   root weft_mesh ── dims[] ──► mesh_dim (one per root dim, then one per
 *        ▲                        flattened dim; stable pointers, owned by
 *        │ root                   the root; each owns its communicators)
 *   sub-mesh / flattened mesh: dim_id[i] indexes root->dims[]
 *
 * A mesh_dim is one communication group as seen from this rank: its
 * communicator (group ranks = coordinates along the dim), a second
 * communicator for weft's own control messages (debug fingerprints), the
 * world ranks of its members, a sequence number and the comm counters.
 */
#ifndef WEFT_MESH_INTERNAL_H
#define WEFT_MESH_INTERNAL_H

#include <stdint.h>

#include "mesh.h"

/* One communication group (a root dim, a flattened dim, or the whole mesh). */
typedef struct mesh_dim {
  char name[WEFT_MESH_NAME_MAX]; /* at most WEFT_MESH_NAME_MAX - 1 chars */
  int nsrc;                      /* root dims this group spans (1 for a root dim) */
  int src[WEFT_MESH_MAX_DIMS];   /* ... in flattening order (row-major over them) */
  int size;                      /* group size */
  int coord;                     /* this rank's rank in the group */
  MPI_Comm comm;                 /* collectives */
  MPI_Comm ctl;                  /* weft control messages (fingerprints) */
  int nodes;                     /* distinct nodes of the members (weft__node_facts) */
  bool whole_nodes;              /* it holds every rank of each of its nodes */
  int *members;                  /* world rank of each group rank (size entries) */
  uint64_t seq;                  /* collectives started on this group */
  weft_comm_count stats[WEFT_COLL_KIND_COUNT];
  bool broken; /* a collective timed out: the group is unusable */
  char broken_msg[192];
  /* device-buffer collectives (device_comm.c): backend chosen at the first
   * one on this group, NCCL communicator; NULL until then */
  struct weft_dev_dim *dev;
} mesh_dim;

/* weft_mesh.magic: a live mesh, and one weft_mesh_destroy released (its
 * communicators freed, the struct kept until weft_finalize so that a
 * second destroy or a collective on it is an error, not a use of freed
 * memory). */
#define WEFT_MESH_LIVE 0x4853454du /* "MESH" */
#define WEFT_MESH_DEAD 0x44414544u /* "DEAD" */

struct weft_mesh {
  uint32_t magic;         /* WEFT_MESH_LIVE or WEFT_MESH_DEAD */
  struct weft_mesh *dead; /* next on the list of destroyed meshes */
  struct weft_mesh *root; /* == this for a root mesh */
  int ndim;
  int shape[WEFT_MESH_MAX_DIMS];
  int dim_id[WEFT_MESH_MAX_DIMS]; /* index into root->dims */
  int refs;                       /* weft_mesh_retain count */
  /* root only */
  MPI_Comm comm;   /* duplicate of the creating communicator */
  int size, rank;  /* mesh size and this rank's mesh rank */
  int *world_of;   /* mesh rank -> world rank (size entries) */
  int nsubs;       /* live sub-meshes and flattened meshes */
  int inflight;    /* async works not yet completed */
  mesh_dim **dims; /* ndim root dims, then flattened dims */
  int ndims_all, dims_cap;
  mesh_dim whole;     /* the whole mesh (barrier over dim -1) */
  weft_device device; /* where DTensors on this mesh keep their locals */
};

/* ------------------------------------------------------------ init.c */

/* Settings and process facts (valid after weft_init). */
typedef struct weft_runtime {
  bool initialized;
  bool finalize_mpi; /* weft_init started MPI */
  int world_rank, world_size;
  int local_rank, local_size; /* as reported (LOCAL_RANK/LOCAL_WORLD_SIZE override) */
  int node_count, node_index; /* distinct host names; this rank's node (by lowest world rank) */
  int node_procs;             /* processes of this job on this node (measured) */
  int node_cpus;              /* CPUs those processes may use (union of affinities) */
  bool sleep_waits;           /* resolved backoff policy */
  bool timed_out; /* a wait for other ranks timed out (weft__wait_all): one may be gone */
  /* WEFT_DEBUG notices (debug.c): a duplicate of MPI_COMM_WORLD on which a
   * rank whose wait timed out tells the others whom it waited for */
  MPI_Comm notice;
  int *node_of; /* world rank -> node index (world_size entries; NULL before init) */
  weft_settings settings;
  MPI_Op ops16[2][3]; /* [bf16, f16][sum, max, min] user ops */
  /* [dtype][sum, max, min] user ops that accept the resized chunk types of
   * chunked reduce-scatter (MPICH's builtin ops reject derived types) */
  MPI_Op ops_blk[WEFT_DTYPE_COUNT][3];
} weft_runtime;
extern weft_runtime weft__rt;

/* Node facts of a set of n distinct world ranks: *span, how many nodes
 * they lie on; *whole, whether they include every world rank of each of
 * those nodes. Without node facts (one node, before init): 1 and true.
 * WEFT_ERR_OOM (message set) if the counts cannot be allocated. */
weft_status weft__node_facts(const int *world_ranks, int n, int *span, bool *whole);

/* WEFT_ERR_STATE unless weft_init has run. */
weft_status weft__require_init(const char *func);

/* ------------------------------------------------------------ wait.c */

/* Waits until all n requests completed (completed ones become
 * MPI_REQUEST_NULL), polling with MPI_Testsome and the backoff policy.
 * Returns WEFT_OK, WEFT_ERR_TIMEOUT after timeout_s seconds (no message set;
 * requests left pending) or WEFT_ERR_MPI (message set). */
weft_status weft__wait_all(int n, MPI_Request *reqs, double timeout_s);
/* Same, for a collective moving `bytes` of payload: large ones wait with
 * sched_yield instead of sleeps when oversubscribed (see wait.c). */
weft_status weft__wait_all_sized(int n, MPI_Request *reqs, double timeout_s, int64_t bytes);
double weft__now(void);

/* ---------------------------------------------------------- debug.c */

/* What a collective call looks like; compared across the group. */
typedef struct weft_fingerprint {
  int64_t magic;                  /* WEFT_FP_MAGIC */
  int64_t kind;                   /* weft_coll_kind */
  int64_t vflag;                  /* 1 for the _v variants */
  int64_t dim;                    /* index of the group in the root's dim table (-1: whole mesh) */
  int64_t dtype, count, op, root; /* -1 where not meaningful */
  int64_t seq;                    /* the group's sequence number */
  int64_t extra;                  /* all_gather_v: hash of the counts */
} weft_fingerprint;
#define WEFT_FP_MAGIC 0x7765667466707631LL /* "weftfpv1" */

/* Exchanges fingerprints with every member of d's group (point to point on
 * d->ctl) and compares them. For all_to_all_v, pair_send/pair_recv (group
 * size entries, or NULL) are this rank's send/recv counts, checked pairwise
 * with a second exchange so every rank learns the verdict. Returns
 * WEFT_ERR_MISMATCH (same verdict on every rank), WEFT_ERR_TIMEOUT naming
 * the ranks that never arrived (d is then marked broken), or WEFT_OK. */
weft_status weft__debug_check(mesh_dim *d, const weft_fingerprint *fp, const int64_t *pair_send,
                              const int64_t *pair_recv);
/* "all_reduce(f32, count 16, sum)" */
void weft__fingerprint_describe(const weft_fingerprint *fp, char *buf, size_t cap);

/* ----------------------------------------------------- collectives.c */

#define WORK_INLINE_REQS 2

/* An in-flight collective (on the caller's stack while blocking, malloc'd
 * once handed out). */
struct weft_work {
  weft_mesh *root;
  mesh_dim *group;
  weft_fingerprint fp; /* what was called, for messages */
  int nreq;
  MPI_Request *reqs; /* reqs_inline or malloc'd */
  MPI_Request reqs_inline[WORK_INLINE_REQS];
  void *owned;           /* counts/displs MPI reads until completion */
  MPI_Datatype types[2]; /* chunk datatypes (freed at completion) */
  int ntypes;
  void *avg_buf; /* AVG: divide avg_count elements by the group size */
  int64_t avg_count;
  weft_dtype avg_dt;
  bool async;
  int64_t bytes; /* payload, for the wait policy */
  double t0;     /* weft__now() when the call began (comm seconds) */
  /* device-buffer work (device_comm.c): host staging to finish after the
   * MPI requests, or an NCCL completion event; NULL for host buffers */
  struct weft_dev_work *dev;
};

/* Takes the group's next sequence number, accounts `payload` bytes (as
 * weft__account) and prepares w (no requests yet); under WEFT_DEBUG
 * compares fingerprints over the group. The NCCL path of device_comm.c uses
 * it so that device collectives count, sequence and check like host ones.
 * extra: the fingerprint's extra word (all_gather_v's counts hash). */
weft_status weft__coll_start(weft_work *w, const weft_mesh *mesh, mesh_dim *g, weft_coll_kind kind,
                             bool v, weft_dtype dt, int64_t count, int op, int root, int64_t extra,
                             int64_t payload, const int64_t *pair_send, const int64_t *pair_recv);
/* Waits for w's MPI requests (backoff, timeout) and completes it, as
 * weft_work_wait does for a host collective, without freeing w. */
weft_status weft__work_wait_host(weft_work *w);
/* Non-blocking form; *done as weft_work_test. Does not free w. */
weft_status weft__work_test_host(weft_work *w, bool *done);

/* ----------------------------------------------------- accounting.c */

/* Adds one call to d's counters: payload bytes and bus bytes as mesh.h
 * documents them. */
void weft__account(mesh_dim *d, weft_coll_kind kind, int64_t payload);
/* Adds `seconds` (wall time this rank was held up) to d's row for `kind`;
 * ignores a NULL d, a kind out of range and seconds <= 0. */
void weft__account_seconds(mesh_dim *d, int64_t kind, double seconds);

/* ----------------------------------------------------------- mesh.c */

/* The group behind dim `dim` (0..ndim-1) of mesh; NULL with a message
 * naming the problem if mesh is NULL or dim out of range. */
mesh_dim *weft__mesh_group(const weft_mesh *mesh, int dim, const char *func);
/* Whether mesh is live (not destroyed, nor its root). */
static inline bool weft__mesh_live(const weft_mesh *mesh) {
  return mesh && mesh->magic == WEFT_MESH_LIVE && mesh->root->magic == WEFT_MESH_LIVE;
}
/* Frees the structs of every destroyed mesh (weft_finalize). */
void weft__mesh_free_destroyed(void);
/* The group spanning the whole mesh in its row-major order: the root's
 * whole group, the single dim of a 1-D mesh, or a flattened dim over the
 * same root dims in the same order; NULL when none exists. */
mesh_dim *weft__mesh_whole(const weft_mesh *mesh);
/* WEFT_DEBUG, at a timeout (debug.c). The ranks of `missing` never
 * arrived here; each of them may itself be stuck waiting for another rank
 * (a chain ending at the rank that stopped). Looks, for up to a short
 * grace, for the notices those ranks sent when their own wait timed out,
 * and writes into `roots` (capacity cap) the ranks at the ends of the
 * chains and into `why` (may be "") what the intermediate ranks reported;
 * returns how many roots. Then sends this rank's own notice (the roots,
 * and `what` it waited in) to every other world rank. Local apart from
 * nonblocking sends that nobody has to receive. */
int weft__notice_resolve(const int *missing, int nmissing, const char *what, int *roots, int cap,
                         char *why, size_t why_cap);
/* Formats world ranks "0, 2, 5" into buf. */
void weft__format_ranks(const int *ranks, int n, char *buf, size_t cap);

#endif /* WEFT_MESH_INTERNAL_H */
