/* weft/mesh.h — process setup, the N-dimensional DeviceMesh and collectives
 * over one mesh dimension (MPI; NCCL on GPU builds).
 *
 * A tour (every rank runs this, SPMD):
 *
 *     weft_init(&argc, &argv);
 *     int shape[2] = {2, 2};
 *     const char *names[2] = {"dp", "tp"};
 *     weft_mesh *mesh;
 *     if (weft_mesh_create(2, shape, names, &mesh)) { puts(weft_last_error()); ... }
 *     int tp;  weft_mesh_dim_index(mesh, "tp", &tp);
 *     // sum a buffer over the tp ranks that share this rank's dp coordinate
 *     weft_all_reduce(mesh, tp, buf, buf, n, WEFT_F32, WEFT_OP_SUM, NULL);
 *     weft_mesh_destroy(mesh);
 *     weft_finalize();
 *
 * Semantics follow torch.distributed.DeviceMesh: ranks are laid out row-major
 * (arange(prod(shape)).view(shape); weft_mesh_create_ordered lays the dims
 * onto world ranks in another order, e.g. tp outermost so that tp spans
 * nodes); the group of mesh dim d for a rank is
 * the ranks whose coordinates differ from it only in d; dim names are
 * unique. Sub-meshes and flattened dims reuse the communicators made once by
 * the root mesh.
 *
 * Contracts for every collective below:
 * - every rank of the dim's group calls it, in the same order as the other
 *   collectives on that mesh (SPMD), with the same count, dtype and op;
 * - async (work != NULL): the call returns at once with a handle; buffers
 *   must stay untouched until weft_work_wait/test reports completion;
 * - blocking (work == NULL): returns when this rank's part is complete;
 * - waiting polls with MPI_Test and backs off (spin, then sleep) so that
 *   more ranks than cores stays fast; after WEFT_TIMEOUT seconds (default
 *   300) the wait fails with WEFT_ERR_TIMEOUT naming the collective, the
 *   mesh dim and its sequence number;
 * - under WEFT_DEBUG=1 the ranks first exchange a fingerprint (op, dim,
 *   dtype, count, sequence number); a mismatch fails with WEFT_ERR_MISMATCH
 *   on every rank of the group and names the ranks that differ; a rank that
 *   never arrives is named in the timeout message, and when it is itself
 *   stuck waiting for another rank (a timed-out rank tells every rank whom
 *   it waited for), the message follows the chain to the rank that stopped
 *   (this costs up to min(2 s, WEFT_TIMEOUT / 2) more at a timeout).
 * - in place: all_reduce and all_to_all with send == recv; all_gather with
 *   send == recv + coord * count (this rank's block); reduce_scatter with
 *   send == recv (the result lands in its first count elements, as
 *   MPI_IN_PLACE does). Any other overlap of send and recv is
 *   WEFT_ERR_INVALID; all_to_all_v has no in-place form;
 * - arguments are checked locally first (dim, dtype, op, count, root,
 *   buffers): a bad one fails on the rank that passed it, before any
 *   communication and without using a sequence number;
 * - after a timeout the dim's group is unusable: later collectives on it
 *   fail at once with WEFT_ERR_STATE (MPI cannot cancel a collective);
 *   other dims keep working;
 * - one thread at a time per mesh (counters and sequence numbers are not
 *   atomic).
 * - Buffers are host memory or device memory (WEFT_CUDA, backend.h), see
 *   below.
 *
 * Device buffers. A collective whose buffers are device memory
 * (weft_ptr_device of send and recv) runs on them directly:
 * - All buffers of one call are host memory or all device memory; a call
 *   that mixes them is WEFT_ERR_INVALID (local, "send is device memory but
 *   recv is host memory"). An empty buffer (0 bytes or NULL) does not count.
 *   Every rank of the dim passes device buffers, or none does (else the
 *   ranks that do wait for the others and fail with WEFT_ERR_TIMEOUT).
 * - Backend: chosen per mesh dim (and per flattened dim) at its first
 *   device collective, identically on every rank of the dim from facts
 *   all-gathered over the dim: NCCL (one communicator per dim, made then
 *   from an id broadcast by the dim's coordinate 0, ncclCommInitRank),
 *   unless the build has no NCCL (WEFT_HAVE_NCCL 0 in weft_config.h),
 *   WEFT_NCCL=0 (or off/false/no) is set on some rank, a rank has no device
 *   (weft_cuda_init not called), or two ranks of the dim on one node use
 *   the same device ordinal (NCCL refuses duplicate GPUs). Then the call
 *   goes through the MPI collective above with host staging (device ->
 *   pinned host bounce buffer, MPI, host -> device), and the dim's
 *   coordinate 0 prints once to stderr:
 *   "weft: mesh dim 'dp': NCCL not used (world ranks 0 and 1 share GPU 0
 *   on node x); collectives on device buffers go through MPI with host
 *   staging".
 * - NCCL ordering: the call runs on the calling thread's communication
 *   stream (weft_comm_stream_set below; WEFT_STREAM_COMM unless changed:
 *   FSDP puts its all-gathers and reduce-scatters on streams of their own
 *   so that neither queues behind the other or behind TP's collectives)
 *   after an event recorded on the compute stream
 *   (WEFT_STREAM_COMPUTE), so it sees every kernel queued before it there.
 *   Blocking (work == NULL): the compute stream then waits (on the device)
 *   for an event recorded after the NCCL call; the host does not wait, so
 *   the result is ready for later compute-stream work, and for the host
 *   after weft_cuda_synchronize. Async: the work handle holds that event;
 *   weft_work_wait makes the compute stream wait for it (no host block,
 *   never hangs); weft_work_test polls the event and fails with
 *   WEFT_ERR_TIMEOUT after WEFT_TIMEOUT seconds (the dim is then unusable)
 *   or WEFT_ERR_NCCL on an NCCL async error (ncclCommGetAsyncError).
 *   Buffers must stay untouched until the compute stream passed the wait.
 * - Staged ordering: the same streams and events. The device -> host copy
 *   runs on the communication stream after an event of the compute stream
 *   and the host waits for it at the call; the host -> device copy is
 *   queued on the communication stream when the call (blocking) or
 *   weft_work_wait/test (async) completes, and the compute stream waits
 *   for it on the device (no host block). The MPI part waits with the
 *   usual backoff and timeout.
 * - Same contracts as for host buffers otherwise: arguments, in-place
 *   forms, WEFT_DEBUG fingerprints, sequence numbers and comm accounting
 *   count a device collective exactly like a host one. NCCL dtypes: f32,
 *   f64, bf16, f16, i32, i64, u8; ops sum, avg (ncclAvg: floats multiply
 *   by 1/n before summing, so they may differ from the host's sum-then-
 *   divide in the last bit; integers divide after, truncating), max, min.
 *   all_gather_v is a group of ncclBroadcast, all_to_all(_v) a group of
 *   ncclSend/ncclRecv (in-place all_to_all sends from a stream-ordered
 *   copy); the _v forms keep their int limits.
 * - Meshes with NCCL communicators free them in weft_mesh_destroy (abort
 *   after a failure); destroy meshes before weft_cuda_shutdown.
 */
#ifndef WEFT_MESH_H
#define WEFT_MESH_H

#include <mpi.h>
#include <stdbool.h>
#include <stdint.h>

#include "backend.h"
#include "kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------ process setup */

/* Initialises MPI (MPI_Init_thread, MPI_THREAD_MULTIPLE if available, else
 * the highest level offered), reads the settings (weft_settings below),
 * finds the node-local rank and sets the error-message rank. Collective
 * over MPI_COMM_WORLD.
 * - Node-local rank: the rank among the world ranks with the same processor
 *   name (one nonblocking all-gather; why not MPI_Comm_split_type: see
 *   docs/DESIGN.md "MPICH notes").
 * - RANK / WORLD_SIZE in the environment (torchrun's names), when set, must
 *   agree with MPI; a disagreement on any rank fails weft_init on every rank
 *   with WEFT_ERR_INVALID naming the ranks. LOCAL_RANK / LOCAL_WORLD_SIZE,
 *   when set, override the node-local rank and size (to pick a GPU).
 * - A bad setting (WEFT_TIMEOUT=abc) is WEFT_ERR_INVALID before MPI starts.
 * - On failure MPI is finalised again if weft_init started it.
 * - When it starts MPI, it sets MPIR_CVAR_IREDUCE_SCATTER_BLOCK_INTRA_ALGORITHM
 *   =sched_pairwise unless already set (why: docs/DESIGN.md "MPICH notes").
 * Safe to call if MPI is already initialised (then weft_finalize does not
 * finalise it). A second call without weft_finalize is WEFT_ERR_STATE.
 * argc/argv may be NULL. */
WEFT_API weft_status weft_init(int *argc, char ***argv);
/* Releases weft's global state (the host blocks kernels' allocator keeps
 * cached, weft_device_empty_cache(WEFT_CPU), included) and finalises MPI if weft_init started it
 * (after a backoff barrier, so oversubscribed ranks do not spin in
 * MPI_Finalize's own barrier). Collective over MPI_COMM_WORLD. No-op if
 * weft is not initialised. Meshes should be destroyed first.
 * When the job spans nodes (weft_node_count() > 1) it does not call
 * MPI_Finalize after that barrier unless WEFT_MPI_FINALIZE=1: MPICH 4.0.2's
 * MPI_Finalize over UCX 1.13's TCP transport deadlocks in its endpoint
 * teardown in about half of the runs (docs/DESIGN.md "MPICH notes");
 * every message has been delivered once all ranks met in the barrier; it
 * then tells the process manager it finalised (PMI-1's finalize exchange
 * on PMI_FD, as MPI_Finalize ends), so the exit counts as a clean one.
 * WEFT_MPI_FINALIZE=0 skips it on one node too (weft_settings). */
WEFT_API weft_status weft_finalize(void);
WEFT_API bool weft_is_initialized(void);

WEFT_API int weft_world_rank(void);
WEFT_API int weft_world_size(void);
WEFT_API int weft_local_rank(void); /* rank among the processes on this node */
WEFT_API int weft_local_size(void); /* processes on this node */
/* Nodes, from the host names weft_init all-gathers (MPI_Get_processor_name;
 * ranks with the same name are on one node). Local queries, valid after
 * weft_init; before it (or after weft_finalize) count 1 and index 0.
 * Not affected by LOCAL_RANK / LOCAL_WORLD_SIZE (those override only
 * weft_local_rank / weft_local_size, e.g. to pick a GPU). */
WEFT_API int weft_node_count(void); /* distinct host names among the world's ranks */
/* This rank's node, 0..weft_node_count()-1; nodes are numbered in the order
 * of their lowest world rank (the node of world rank 0 is 0). */
WEFT_API int weft_node_index(void);

/* ------------------------------------------------------------------- mesh */

#define WEFT_MESH_MAX_DIMS 8
#define WEFT_MESH_NAME_MAX 32

typedef struct weft_mesh weft_mesh;

/* A mesh over all ranks of MPI_COMM_WORLD. Collective over the world.
 * Errors, on every rank alike: WEFT_ERR_INVALID for ndim outside 1..8, a
 * size < 1, product of shape != world size, a name NULL, empty, longer than
 * WEFT_MESH_NAME_MAX - 1 or repeated; WEFT_ERR_MISMATCH when ranks pass
 * different arguments (compared first, so no rank is left waiting);
 * WEFT_ERR_TIMEOUT when not every rank calls it within WEFT_TIMEOUT.
 * Communicators are made here, once per dim (MPI_Comm_create_group over
 * each dim's group, plus a duplicate of each for weft's control messages). */
WEFT_API weft_status weft_mesh_create(int ndim, const int *shape, const char *const *names,
                                      weft_mesh **out);
/* Like weft_mesh_create, but lays the mesh dims onto world ranks in the
 * given order: order[0] is the dim whose coordinate changes slowest along
 * world ranks, order[ndim-1] the fastest (innermost). weft_mesh_create is
 * order = {0, 1, ..., ndim-1}. Example: shape {dp=2, tp=2}, order {1, 0}
 * (tp outermost): world ranks 0, 1 have tp coordinate 0 and ranks 2, 3 tp
 * coordinate 1, so the tp groups are {0, 2} and {1, 3}. The mesh's dims,
 * names and coordinates (and weft_mesh_rank, which stays row-major over the
 * mesh's own dims) behave as for any mesh; only which world rank sits at
 * which coordinate changes (weft_mesh_world_rank_of reports it). The
 * arguments are compared first (one nonblocking all-gather over the world,
 * so a missing rank times out instead of hanging); then, unless order is
 * the identity, the world ranks are reordered into a communicator of
 * their own (MPI_Comm_create_group, computed locally: no MPI_Comm_split)
 * and the mesh is made over it as by weft_mesh_create_from_comm.
 * Collective over the world; the
 * caller owns *out (weft_mesh_destroy). Errors, on every rank alike: those
 * of weft_mesh_create, and WEFT_ERR_INVALID when order is NULL or not a
 * permutation of 0..ndim-1 (the message names the bad entry);
 * WEFT_ERR_MISMATCH when ranks pass different orders. */
WEFT_API weft_status weft_mesh_create_ordered(int ndim, const int *shape, const char *const *names,
                                              const int *order, weft_mesh **out);
/* Same over the ranks of `comm` (duplicated; the caller keeps comm). */
WEFT_API weft_status weft_mesh_create_from_comm(MPI_Comm comm, int ndim, const int *shape,
                                                const char *const *names, weft_mesh **out);
/* Destroys a mesh or sub-mesh. A root mesh with live sub-meshes (or
 * flattened meshes) or async collectives in flight, or any mesh still
 * referenced (weft_mesh_retain, e.g. by DTensors), returns WEFT_ERR_BUSY and
 * stays valid. NULL: no-op. Frees the communicators of a root (no
 * communication). The handle then stays readable until weft_finalize, so
 * that a second destroy, a collective, a sub-mesh or flatten on it return
 * WEFT_ERR_INVALID ("the mesh was destroyed") instead of touching freed
 * memory; its shape, names and ranks can still be described. */
WEFT_API weft_status weft_mesh_destroy(weft_mesh *mesh);
/* Reference counting for objects that hold a mesh (DTensors, modules):
 * while retained, destroy returns WEFT_ERR_BUSY. release never destroys;
 * the owner still calls weft_mesh_destroy. NULL: no-op. */
WEFT_API void weft_mesh_retain(weft_mesh *mesh);
WEFT_API void weft_mesh_release(weft_mesh *mesh);

WEFT_API int weft_mesh_ndim(const weft_mesh *mesh);
WEFT_API int weft_mesh_size(const weft_mesh *mesh);              /* product of the shape */
WEFT_API int weft_mesh_dim_size(const weft_mesh *mesh, int dim); /* 0 if dim out of range */
WEFT_API const char *weft_mesh_dim_name(const weft_mesh *mesh, int dim);
/* Index of a dim by name; WEFT_ERR_NOT_FOUND naming the dim and listing the
 * mesh's dims otherwise. */
WEFT_API weft_status weft_mesh_dim_index(const weft_mesh *mesh, const char *name, int *dim);
/* This rank's coordinate along dim (its rank within that dim's group); -1
 * if dim is out of range. */
WEFT_API int weft_mesh_coord(const weft_mesh *mesh, int dim);
/* This rank's rank within the mesh (row-major linear index of its coords). */
WEFT_API int weft_mesh_rank(const weft_mesh *mesh);
/* World rank of the mesh member with the given coordinates (ndim entries;
 * for a sub-mesh, the member that shares this rank's other root
 * coordinates); -1 if a coordinate is out of range. */
WEFT_API int weft_mesh_world_rank_of(const weft_mesh *mesh, const int *coords);
/* Whether a and b lay out the same world ranks the same way: the same
 * shape and, at every coordinate, the same world rank (a == b, a mesh made
 * twice alike, or the same sub-mesh taken twice). A DTensor of one can be
 * used where the other is expected; the `tp` and `dp` sub-meshes of a 2x2
 * mesh are not the same even though their shapes are. Local (no MPI); on
 * every rank of a mesh made the same way on all ranks the answer is the
 * same. NULL is the same as nothing. Called by the op layer (nn/) to check
 * that an op's inputs live on one mesh. */
WEFT_API bool weft_mesh_same_ranks(const weft_mesh *a, const weft_mesh *b);
/* Writes a readable picture of the mesh ("mesh (dp=2, tp=2): [[0, 1], [2, 3]]"). */
WEFT_API void weft_mesh_describe(const weft_mesh *mesh, char *buf, size_t cap);
/* How many nodes the group of `dim` spans (distinct host names among its
 * members, as weft_node_index numbers them): 1 when the group lies on one
 * node. Local; -1 (and an error) for a bad dim. */
WEFT_API int weft_mesh_dim_nodes(const weft_mesh *mesh, int dim);
/* The MPI communicator of one dim (owned by the mesh). */
WEFT_API MPI_Comm weft_mesh_dim_comm(const weft_mesh *mesh, int dim);
/* The communicator spanning the whole mesh, ranks in its row-major order
 * (owned by the mesh): the root's, a 1-D mesh's dim, or a flattened dim over
 * the same root dims in the same order. MPI_COMM_NULL for a sub-mesh of
 * several dims that no such communicator spans (weft_mesh_flatten makes
 * one). */
WEFT_API MPI_Comm weft_mesh_comm(const weft_mesh *mesh);

/* Sub-mesh of the dims named (in the given order, like mesh["dp","tp"];
 * another order transposes it). Names are dims of `mesh`, or flattened dims
 * registered on the root by weft_mesh_flatten whose dims all belong to
 * `mesh`. Errors: WEFT_ERR_NOT_FOUND for an unknown name (the message lists
 * the mesh's dims), WEFT_ERR_INVALID for a repeated name or two names that
 * share a root dim ("dp" and "dp_shard"). The result reuses the parent's
 * communicators (no communication) and must be destroyed before the root.
 * Not collective. */
WEFT_API weft_status weft_mesh_submesh(weft_mesh *mesh, int n, const char *const *names,
                                       weft_mesh **out);
/* The root mesh that `mesh` was taken from (mesh itself for a root), as
 * DeviceMesh's _mesh_resources.get_root_mesh: fsdp/ lays a parameter out
 * over the dp dims and the tp dims of that one mesh. Not retained; NULL
 * for NULL. Not collective. */
WEFT_API weft_mesh *weft_mesh_root(const weft_mesh *mesh);
/* Flattens the named dims (adjacent or not, in order) into one dim called
 * `flat_name`, as DeviceMesh._flatten: returns a 1-D mesh over that group
 * (coordinate = row-major index over the named dims) and registers the name
 * on the root so later submesh calls find it. The first call creates the
 * flattened communicator and is collective over the root mesh (every rank
 * calls it; arguments are compared as in weft_mesh_create); later calls
 * with the same dims are free and local. flat_name must not be a root dim
 * name, nor a flattened name registered over other dims (WEFT_ERR_INVALID).
 * Destroy the result like a sub-mesh. */
WEFT_API weft_status weft_mesh_flatten(weft_mesh *mesh, int n, const char *const *names,
                                       const char *flat_name, weft_mesh **out);

/* The device of a mesh, as DeviceMesh("cuda", ...): every DTensor made on
 * the mesh or on any of its sub-meshes and flattened meshes keeps its local
 * tensor on it, and the collectives behind them run on its memory (NCCL
 * where it can, else MPI with host staging; see "Device buffers" above).
 * A new mesh is on WEFT_CPU. Set it on the root mesh (WEFT_ERR_INVALID on
 * a sub-mesh: they inherit the root's), before DTensors are made on it.
 * For WEFT_CUDA this rank's device is chosen here if weft_device_init has
 * not chosen it (the node-local rank modulo the devices the node has).
 * Collective over the mesh: every rank passes the same device (else
 * WEFT_ERR_MISMATCH on every rank); a rank that cannot use it (a build
 * without that backend: WEFT_ERR_UNSUPPORTED; no device: WEFT_ERR_NO_DEVICE)
 * makes every rank fail with its message, and the mesh keeps its device. */
WEFT_API weft_status weft_mesh_set_device(weft_mesh *mesh, weft_device dev);
/* The device of mesh's root (WEFT_CPU for NULL). Not collective. */
WEFT_API weft_device weft_mesh_device(const weft_mesh *mesh);

/* ------------------------------------------------------------ collectives */

typedef enum weft_reduce_op {
  WEFT_OP_SUM = 0,
  WEFT_OP_AVG = 1, /* sum, then divide by the group size (integers: truncated) */
  WEFT_OP_MAX = 2,
  WEFT_OP_MIN = 3,
  WEFT_OP_COUNT
} weft_reduce_op;
WEFT_API const char *weft_reduce_op_name(weft_reduce_op op);

typedef enum weft_coll_kind {
  WEFT_COLL_ALL_GATHER = 0,
  WEFT_COLL_REDUCE_SCATTER,
  WEFT_COLL_ALL_REDUCE,
  WEFT_COLL_BROADCAST,
  WEFT_COLL_ALL_TO_ALL,
  WEFT_COLL_BARRIER,
  WEFT_COLL_KIND_COUNT
} weft_coll_kind;
WEFT_API const char *weft_coll_kind_name(weft_coll_kind kind);

/* An in-flight async collective. */
typedef struct weft_work weft_work;
/* Waits for completion (with backoff and timeout), then frees the handle.
 * On error the handle is freed too. NULL: no-op returning WEFT_OK. For an
 * NCCL collective on device buffers it makes the compute stream wait for
 * the collective instead and returns at once (see "Device buffers"). */
WEFT_API weft_status weft_work_wait(weft_work *work);
/* Non-blocking check: *done = true when complete (the handle is then freed
 * and must not be used again); false otherwise. */
WEFT_API weft_status weft_work_test(weft_work *work, bool *done);

/* Waits for `n` MPI requests of the caller's own nonblocking MPI calls
 * (entries already MPI_REQUEST_NULL are skipped; completed ones become
 * MPI_REQUEST_NULL) with the same MPI_Test backoff weft's collectives use
 * (mesh/wait.c: spin, then yield or sleep, so that more ranks than cores
 * do not starve each other as MPICH's busy-polling blocking calls do).
 * For code outside weft's collectives: dcp's communicator, examples/train.
 * Local (no communication of its own; it only completes the caller's
 * requests). Thread-safe under MPI_THREAD_MULTIPLE. The caller owns reqs.
 * Times out after the settings' timeout_s (WEFT_TIMEOUT; 300 s default).
 * `what` names the operation in error messages (NULL: "MPI wait").
 * Errors: WEFT_ERR_INVALID (n < 0, or reqs NULL with n > 0), WEFT_ERR_MPI
 * (MPI_Test failed: "<what>: <MPI's message>"), WEFT_ERR_TIMEOUT ("<what>:
 * no answer from the other ranks after N s ..."), WEFT_ERR_OOM. */
WEFT_API weft_status weft_wait_requests(int n, MPI_Request *reqs, const char *what);

/* Agrees on a failure: every rank of `comm` passes its own status `st`
 * (and, when it failed, its message `msg`; NULL: weft_last_error()) and
 * gets the same verdict. Returns WEFT_OK on every rank when every rank
 * passed WEFT_OK; otherwise the status of the lowest failing rank (rank in
 * `comm`) on every rank: that rank keeps its own weft_last_error(), the
 * others get "<what> failed on rank R: <its message>" (messages are cut at
 * 2043 characters). *failed_rank (may be NULL) is set to that rank, or -1
 * when no rank failed or the agreement itself failed.
 * For code outside weft's collectives that must not leave ranks behind
 * after a local failure (dcp's save/load, examples/train). Collective over
 * `comm` (every rank must call it); nonblocking MPI calls waited with
 * weft_wait_requests, so it is thread-safe under MPI_THREAD_MULTIPLE on a
 * communicator of the caller's own. The caller owns comm.
 * Errors of its own: WEFT_ERR_INVALID (comm is MPI_COMM_NULL), WEFT_ERR_MPI
 * and WEFT_ERR_TIMEOUT (messages name `what`; *failed_rank = -1). */
WEFT_API weft_status weft_agree_status(MPI_Comm comm, weft_status st, const char *msg,
                                       const char *what, int *failed_rank);

/* The communication stream of the calling thread's device collectives from
 * here on (as torch.cuda.stream(s) around a collective): WEFT_STREAM_COMM
 * (the default; TP, DTensor), WEFT_STREAM_FSDP_AG or WEFT_STREAM_FSDP_RS
 * (fsdp/ sets them around its own calls and restores the previous one).
 * Each call still starts after the compute stream's work so far and the
 * compute stream still waits for its result (see "NCCL ordering" above);
 * calls on different streams may run at the same time on the device.
 * *previous (may be NULL) gets the stream it replaces. Local, per thread;
 * no effect on host-buffer collectives. WEFT_ERR_INVALID for the compute
 * stream or an unknown one. */
WEFT_API weft_status weft_comm_stream_set(weft_stream_id s, weft_stream_id *previous);
WEFT_API weft_stream_id weft_comm_stream(void);

/* All-gather over `dim`: each rank contributes `count` elements; recv holds
 * group_size * count elements, rank i's at offset i * count. */
WEFT_API weft_status weft_all_gather(const weft_mesh *mesh, int dim, const void *send, void *recv,
                                     int64_t count, weft_dtype dt, weft_work **work);
/* Uneven all-gather: rank i contributes counts[i] elements (counts has
 * group_size entries, identical on all ranks; zeros allowed); recv is
 * contiguous, rank i's part at sum(counts[0..i)). Counts and their sum must
 * fit in an int (else WEFT_ERR_UNSUPPORTED). */
WEFT_API weft_status weft_all_gather_v(const weft_mesh *mesh, int dim, const void *send, void *recv,
                                       const int64_t *counts, weft_dtype dt, weft_work **work);
/* Reduce-scatter over `dim`: send holds group_size * count elements; rank i
 * receives the reduction of block i (count elements). */
WEFT_API weft_status weft_reduce_scatter(const weft_mesh *mesh, int dim, const void *send,
                                         void *recv, int64_t count, weft_dtype dt,
                                         weft_reduce_op op, weft_work **work);
/* All-reduce over `dim`; send == recv is allowed (in place). */
WEFT_API weft_status weft_all_reduce(const weft_mesh *mesh, int dim, const void *send, void *recv,
                                     int64_t count, weft_dtype dt, weft_reduce_op op,
                                     weft_work **work);
/* Broadcast from the rank whose coordinate along `dim` is `root`. */
WEFT_API weft_status weft_broadcast(const weft_mesh *mesh, int dim, void *buf, int64_t count,
                                    weft_dtype dt, int root, weft_work **work);
/* All-to-all: send holds group_size blocks of `count` elements, block j goes
 * to rank j; recv block i comes from rank i. */
WEFT_API weft_status weft_all_to_all(const weft_mesh *mesh, int dim, const void *send, void *recv,
                                     int64_t count, weft_dtype dt, weft_work **work);
/* Uneven all-to-all: send_counts[j] elements at send_displs[j] go to rank j;
 * recv_counts[i] from rank i land at recv_displs[i] (all in elements, each
 * fitting in an int). Under WEFT_DEBUG the pairwise counts are checked too
 * (my send_counts[j] == rank j's recv_counts[me]). */
WEFT_API weft_status weft_all_to_all_v(const weft_mesh *mesh, int dim, const void *send,
                                       const int64_t *send_counts, const int64_t *send_displs,
                                       void *recv, const int64_t *recv_counts,
                                       const int64_t *recv_displs, weft_dtype dt, weft_work **work);
/* Barrier over one dim; dim = -1 for the whole mesh (over
 * weft_mesh_comm's communicator; for a sub-mesh that has none, one barrier
 * per dim in turn, blocking only: async is WEFT_ERR_UNSUPPORTED). */
WEFT_API weft_status weft_barrier(const weft_mesh *mesh, int dim, weft_work **work);

/* ---------------------------------------------------- comm accounting */

/* Per (mesh dim, collective kind): number of calls, payload bytes (the full
 * logical buffer: all-gather output, reduce-scatter input, all-reduce and
 * broadcast buffer, all-to-all send buffer) and bus bytes (what one rank
 * sends in a ring/pairwise algorithm, nccl-tests convention: all-gather,
 * reduce-scatter and all-to-all payload*(n-1)/n, all-reduce 2*payload*(n-1)/n,
 * broadcast payload). Accounted at the call, per rank, for the root mesh's
 * dims (a sub-mesh's dims count on the root's dims; flattened dims have
 * their own rows; dim -1 is the row of weft_mesh_comm's group, where
 * whole-mesh barriers count). A call counts once its arguments passed the
 * local checks, even if it then fails (debug mismatch, timeout). */
typedef struct weft_comm_count {
  int64_t calls;
  int64_t bytes;
  int64_t bus_bytes;
  /* Wall time this rank spent held up by these collectives, in seconds
   * (CLOCK_MONOTONIC): a blocking call from entry to completion; an async
   * one the time inside the posting call plus the time blocked in
   * weft_work_wait / weft_work_test until it completed (time overlapped
   * with the caller's own work does not count). Includes waiting for
   * slower ranks of the group; a wait that times out counts in full.
   * NCCL collectives on device buffers do not hold the host: they count
   * only the time spent in weft_work_wait / weft_work_test (0 when
   * blocking). weft_comm_stats_reset zeroes it. */
  double seconds;
} weft_comm_count;

/* Count for one dim of this mesh (dim indexes this mesh, sub-mesh or
 * flattened mesh; it is mapped to the root's row). */
WEFT_API weft_comm_count weft_comm_stats(const weft_mesh *mesh, int dim, weft_coll_kind kind);
/* Sum over every kind for one dim. */
WEFT_API weft_comm_count weft_comm_stats_dim(const weft_mesh *mesh, int dim);
/* Zeroes every counter of the root mesh (and its flattened dims). */
WEFT_API void weft_comm_stats_reset(weft_mesh *mesh);

/* ------------------------------------------------------------- settings */

/* Settings from the environment, read at weft_init (one place). */
typedef struct weft_settings {
  double timeout_s; /* WEFT_TIMEOUT, default 300 */
  bool debug;       /* WEFT_DEBUG=1 */
  int backoff;      /* WEFT_BACKOFF: -1 auto (default), 0 never sleep, 1 always back off */
  /* WEFT_CHUNK_BYTES (64 .. 2^30, default 2^30): a collective whose
   * per-rank block is larger is posted as several MPI calls of at most
   * this many bytes each (MPICH 4.0.2's nonblocking large-count calls
   * fail beyond 2 GiB: docs/DESIGN.md "MPICH notes").
   * Tests set it small to exercise the chunked paths. */
  int64_t chunk_bytes;
  /* WEFT_MPI_FINALIZE: -1 auto (default: call MPI_Finalize on one node
   * only, see weft_finalize), 0 never, 1 always */
  int mpi_finalize;
  /* WEFT_PRESYNC_BYTES (0 .. 2^40, default 65536; 0 = never): a blocking
   * collective with at least this payload on a dim whose group spans
   * nodes, and holds every rank of them, meets the group in a barrier
   * before it posts (collectives.c, "presync": MPI's rendezvous over TCP
   * otherwise can serialise the two directions when ranks arrive apart). */
  int64_t presync_bytes;
  /* WEFT_TCP_EAGER: -1 auto (default: on for a job that spans nodes, as
   * the launcher tells before MPI_Init (hydra's MPI_LOCALNRANKS < PMI_SIZE,
   * Slurm's SLURM_JOB_NUM_NODES > 1), on hosts without an RDMA device, i.e.
   * /sys/class/infiniband empty or absent, so MPI's UCX crosses nodes over
   * TCP), 0 never, 1 always. When on, and MPI is not yet initialized,
   * weft_init sets UCX_RNDV_THRESH=inf before MPI_Init unless the user set
   * it: UCX then sends every message eagerly
   * instead of by rendezvous, whose handshake over TCP queues behind bulk
   * data (2 nodes x 2 ranks at 200 Mbit/s: HSDP's step 141 -> 108 ms;
   * docs/DESIGN.md "MPICH notes"). tcp_eager_applied says whether it did. */
  int tcp_eager;
  bool tcp_eager_applied;
} weft_settings;
WEFT_API const weft_settings *weft_get_settings(void);
/* The settings the environment gives now, as weft_init reads them (local,
 * no MPI; callable before weft_init, e.g. by tools that predict what
 * weft will do). Every field gets its default first, so *out is usable
 * even when a variable is bad: then WEFT_ERR_INVALID naming it.
 * tcp_eager_applied is false (only weft_init applies it). */
WEFT_API weft_status weft_read_settings(weft_settings *out);
/* Overrides (tests); takes effect for later collectives. */
WEFT_API void weft_set_timeout(double seconds);
WEFT_API void weft_set_debug(bool on);

#ifdef __cplusplus
}
#endif
#endif /* WEFT_MESH_H */
