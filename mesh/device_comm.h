/* mesh/device_comm.h — private: collectives on device buffers.
 *
 * collectives.c checks a call's arguments, then asks weft__device_route
 * whether its buffers are device memory; if so the call goes to the
 * weft__device_<coll> function here, which picks the dim's backend once
 * (lazily, at the first device collective on that dim; every rank of the
 * dim makes that call, so the choice is collective-safe) and runs:
 *
 * - NCCL (builds with WEFT_HAVE_NCCL): one ncclComm_t per mesh_dim, made
 *   from an ncclUniqueId that coordinate 0 creates and broadcasts over the
 *   dim's control communicator (ctl), then ncclCommInitRank. The call runs
 *   on WEFT_STREAM_COMM after an event of WEFT_STREAM_COMPUTE; the compute
 *   stream then waits for an event recorded after it (blocking call), or
 *   the work handle holds that event (async: weft_work_wait makes the
 *   compute stream wait; no host block).
 * - MPI with host staging: device -> host bounce buffer, the host
 *   collective of collectives.c (same checks, sequence number, debug
 *   fingerprint and accounting), host -> device. The copies run on the
 *   call's comm stream, ordered by events as NCCL's call: the device -> host
 *   copy after the compute stream's work (the host waits for it), the host
 *   -> device copy queued at completion, the compute stream then waits for
 *   it on the device. Bounce buffers are pinned host memory from a pool,
 *   reused once the stream passed the copy that last read them. Used when the build has no
 *   NCCL, when WEFT_NCCL=0, when a rank has no device selected, or when two
 *   ranks of the dim share one GPU (NCCL refuses duplicate devices). The
 *   dim's coordinate 0 prints one line to stderr saying why.
 *
 * Both run on the calling thread's comm stream (weft_comm_stream_set;
 * WEFT_STREAM_COMM unless changed).
 *
 * Device access goes through a hook table (is_device, copies, stream
 * ordering, device ordinal) so tests can stand in host memory marked as
 * "device" and run the real staging code without a GPU.
 */
#ifndef WEFT_DEVICE_COMM_H
#define WEFT_DEVICE_COMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "mesh_internal.h"

/* ------------------------------------------------------------ hooks */

typedef struct weft_device_hooks {
  /* true when p is device memory (weft_ptr_device(p) == WEFT_CUDA) */
  bool (*is_device)(const void *p);
  /* a copy queued on stream s, kinds H2D and D2H (weft_memcpy_async(
   * WEFT_CUDA, ...)): it runs when s reaches it */
  weft_status (*copy)(void *dst, const void *src, size_t bytes, weft_copy_kind kind,
                      weft_stream_id s);
  /* Stream ordering (NULL: the "device" has no streams, its copies are done
   * at the call). order: stream waiter waits, on the device, for the work
   * queued on signaler so far (an event). sync: the host waits for stream
   * s. mark: an event recorded on s now (NULL if none is needed);
   * mark_done: whether s passed it; mark_release frees it. */
  weft_status (*order)(weft_stream_id waiter, weft_stream_id signaler);
  weft_status (*sync)(weft_stream_id s);
  void *(*mark)(weft_stream_id s);
  bool (*mark_done)(void *m);
  void (*mark_release)(void *m);
  /* this rank's device ordinal, -1 if none (weft_device_current(WEFT_CUDA)) */
  int (*device)(void);
  /* whether NCCL may be used on such buffers (WEFT_HAVE_NCCL for the real
   * hooks; a fake "device" of host memory must say false, or rely on the
   * choice falling back) */
  bool nccl;
} weft_device_hooks;

/* Replaces the hooks (tests); NULL restores the CUDA backend's. Call with
 * no device collective in flight. */
void weft__device_hooks_set(const weft_device_hooks *h);
const weft_device_hooks *weft__device_hooks(void);

/* For tests only: when true the staged path leaves out its two stream
 * orderings (comm stream after compute before the device -> host copy,
 * compute after comm behind the host -> device copy), the dependency bug
 * the emulator's deferred streams must catch (tests/cuda/test_emu_strict.c). */
extern bool weft__device_skip_order;

/* The bounce pool's slots holding memory and their bytes (bytes may be
 * NULL), for tests. Local. */
int weft__device_bounce_slots(size_t *bytes);

/* Frees the staged path's pinned bounce buffers (after letting the comm
 * streams pass the copies still queued from them). weft_finalize calls it;
 * local. */
void weft__device_bounce_release(void);

/* ------------------------------------------------------------ routing */

/* Sets *device to whether the call's buffers are device memory. A buffer
 * with 0 bytes (or NULL) does not count; if a and b both count and differ,
 * WEFT_ERR_INVALID naming which is which ("send is device memory but recv
 * is host memory"). b may be NULL/0 (broadcast). */
weft_status weft__device_route(const char *func, const char *aname, const void *a, int64_t abytes,
                               const char *bname, const void *b, int64_t bbytes, bool *device);

/* ------------------------------------------------------- backend choice */

typedef enum weft_comm_backend {
  WEFT_COMM_UNDECIDED = 0,
  WEFT_COMM_NCCL = 1,
  WEFT_COMM_MPI_STAGED = 2
} weft_comm_backend;

/* One rank's facts, all-gathered over the dim at the choice. */
typedef struct weft_comm_facts {
  uint64_t host_hash; /* FNV-1a of the processor name */
  int32_t device;     /* device ordinal, -1 none */
  int32_t world_rank;
  int32_t have_nccl;    /* build has NCCL and the hooks allow it */
  int32_t env_disabled; /* WEFT_NCCL=0 on that rank */
  char host[64];        /* processor name (truncated), for messages */
} weft_comm_facts;

/* This rank's facts (hooks' device, WEFT_NCCL, the processor name). */
void weft__comm_facts_local(weft_comm_facts *f);

/* The backend for a group of n ranks with these facts (entry i = group
 * coordinate i). Pure: same facts, same answer on every rank. NCCL unless,
 * in this order: some rank's build or hooks have no NCCL; WEFT_NCCL=0 on
 * some rank; some rank has no device; two ranks on one host (same
 * host_hash) use the same device ordinal. reason (cap bytes, may be NULL)
 * says why, naming world ranks, GPU and node ("world ranks 0 and 1 share
 * GPU 0 on node x"); for NCCL it says so ("n ranks on distinct GPUs"). */
weft_comm_backend weft__comm_backend_choose(int n, const weft_comm_facts *facts, char *reason,
                                            size_t cap);

/* Makes every rank of g hold coordinate 0's `bytes` bytes of blob (an
 * ncclUniqueId, opaque here): a broadcast over g->ctl, waited with backoff
 * and WEFT_TIMEOUT (then WEFT_ERR_TIMEOUT, the dim marked unusable).
 * Collective over g. */
weft_status weft__comm_id_exchange(mesh_dim *g, void *blob, size_t bytes);

/* The dim's backend, choosing it at the first call (collective over g:
 * all-gather of the facts over g->ctl; for NCCL the id exchange and
 * ncclCommInitRank). Fallback prints the log line on coordinate 0. */
weft_status weft__device_backend(mesh_dim *g, weft_comm_backend *out);
/* The backend chosen for g (UNDECIDED before the first device collective)
 * and its reason (""), for tests and messages. */
weft_comm_backend weft__device_dim_backend(const mesh_dim *g);
const char *weft__device_dim_reason(const mesh_dim *g);

/* Releases g's device state (ncclCommDestroy). No communication. */
void weft__device_dim_free(mesh_dim *g);

/* -------------------------------------------------------- collectives */
/* Same contracts as the mesh.h functions; called by them once their local
 * checks passed and the buffers are device memory. g is dim's group. */

weft_status weft__device_all_gather(const weft_mesh *mesh, int dim, mesh_dim *g, const void *send,
                                    void *recv, int64_t count, weft_dtype dt, weft_work **work);
weft_status weft__device_all_gather_v(const weft_mesh *mesh, int dim, mesh_dim *g, const void *send,
                                      void *recv, const int64_t *counts, weft_dtype dt,
                                      weft_work **work);
weft_status weft__device_reduce_scatter(const weft_mesh *mesh, int dim, mesh_dim *g,
                                        const void *send, void *recv, int64_t count, weft_dtype dt,
                                        weft_reduce_op op, weft_work **work);
weft_status weft__device_all_reduce(const weft_mesh *mesh, int dim, mesh_dim *g, const void *send,
                                    void *recv, int64_t count, weft_dtype dt, weft_reduce_op op,
                                    weft_work **work);
weft_status weft__device_broadcast(const weft_mesh *mesh, int dim, mesh_dim *g, void *buf,
                                   int64_t count, weft_dtype dt, int root, weft_work **work);
weft_status weft__device_all_to_all(const weft_mesh *mesh, int dim, mesh_dim *g, const void *send,
                                    void *recv, int64_t count, weft_dtype dt, weft_work **work);
weft_status weft__device_all_to_all_v(const weft_mesh *mesh, int dim, mesh_dim *g, const void *send,
                                      const int64_t *send_counts, const int64_t *send_displs,
                                      void *recv, const int64_t *recv_counts,
                                      const int64_t *recv_displs, weft_dtype dt, weft_work **work);

/* weft_work_wait / weft_work_test for a work with w->dev set (they free w
 * afterwards). Staged: the MPI wait, then host -> device. NCCL: the compute
 * stream waits on the work's event (no host block); test polls the event
 * and reports WEFT_ERR_TIMEOUT past WEFT_TIMEOUT, an NCCL async error as
 * WEFT_ERR_NCCL. */
weft_status weft__device_work_wait(weft_work *w);
weft_status weft__device_work_test(weft_work *w, bool *done);

#endif /* WEFT_DEVICE_COMM_H */
