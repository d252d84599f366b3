/* fsdp/fsdp_internal.h — shared between the fsdp sources only: the group
 * state, its per-parameter layout, and the helpers each source provides.
 *
 * Flat buffer layout of a group (elements of the communication dtype),
 * with n = shard dim size and S = padded_block:
 *
 *   [ block 0 | block 1 | ... | block n-1 ]          n * S elements
 *   block r = [ p0 rows chunk r, padded to pr0 rows | p1 ... | ... ]
 *
 * where parameter p has `rows` rows (dim 0 of its model-mesh local tensor,
 * rest = elements per row), chunk r = weft_chunk_range(rows, n, r), pr =
 * ceil(rows / n) rows, and p's part of every block starts at p->offset.
 * The all-gather input is block `coord`; the reduce-scatter output too.
 */
#ifndef WEFT_FSDP_INTERNAL_H
#define WEFT_FSDP_INTERNAL_H

#include <mpi.h>
#include <stdbool.h>
#include <stdint.h>

#include "backend.h"
#include "fsdp.h"

typedef struct fsdp_param {
  weft_param *p;
  weft_dtensor *sharded;   /* the sharded data: in p->data while sharded, held here always */
  weft_dtensor *unsharded; /* while unsharded: the DTensor in p->data (owned here) */
  weft_dtensor *held_grad; /* during backward: the sharded grad moved out of p->grad */
  weft_dtensor *acc_grad;  /* unsharded grad kept for accumulation (sync off) */
  int ndim;
  int64_t local_shape[WEFT_MAX_DIMS]; /* on the model mesh (tp-local) */
  int64_t rows, rest;                 /* local_shape[0], product of the others */
  int64_t pad_rows;                   /* ceil(rows / n) */
  int64_t offset;                     /* in a block, elements */
  int64_t shard_start, shard_len;     /* this rank's rows of the tp-local tensor */
  /* A fused projection (TP StridedShard(0, k) on the model mesh): the
   * tp-local rows are nblocks equal blocks of block_rows, and chunk r of the
   * parameter is chunk r of every block, in block order, so that the
   * all-gathered tp-local keeps q|k|v apart (block_rows % n == 0 then).
   * Otherwise nblocks 1, block_rows = rows. */
  int nblocks;
  int64_t block_rows;
  /* dtype of the unsharded data: the all-gather dtype (param_dtype) where
   * the parameter's module runs on the op graph (weft_module_on_graph),
   * which computes on 16-bit tensors; f32 holding the all-gathered values
   * for the hand-written layers (f32 only) */
  weft_dtype unsharded_dtype;
} fsdp_param;

/* The device stream of FSDP's all-gathers (false) and of its reduce-scatters
 * and HSDP all-reduces (true): comm.c runs them there, trace.c records
 * their start events with it. */
static inline weft_stream_id fsdp__collective_stream(bool reduce) {
  return reduce ? WEFT_STREAM_FSDP_RS : WEFT_STREAM_FSDP_AG;
}

/* Run b (0 <= b < fp->nblocks) of chunk r of n of fp's tp-local rows:
 * [*start, *start + *len); the chunk holds its runs one after another. */
static inline void fsdp__chunk_run(const fsdp_param *fp, int64_t n, int64_t r, int b,
                                   int64_t *start, int64_t *len) {
  weft_chunk_range(fp->block_rows, n, r, start, len);
  *start += (int64_t)b * fp->block_rows;
}

typedef enum fsdp_state {
  FSDP_SHARDED = 0,
  FSDP_UNSHARDING, /* all-gather posted */
  FSDP_UNSHARDED,
} fsdp_state;

/* An unshard in flight (explicit handle). */
struct weft_fsdp_handle {
  weft_fsdp *f;
  uint64_t epoch; /* f->unshard_epoch when posted */
};

struct weft_fsdp {
  /* identity */
  weft_module **modules;
  int nmodules;
  char *name;
  weft_fsdp_options opts;
  weft_mesh *dp_mesh;   /* the caller's; 1-D (shard) or 2-D (replicate, shard) */
  int shard_dim;        /* index in dp_mesh */
  int rep_dim;          /* -1 without HSDP */
  int nshard, coord;    /* shard dim size and this rank's coordinate */
  int nrep;             /* replicate dim size (1 without) */
  weft_mesh *spmd_mesh; /* where sharded DTensors live (dp_mesh or the root) */
  weft_device dev;      /* the spmd mesh's device: flat buffers, casts, unsharded data */
  bool offload;         /* offload_params on a device mesh: sharded data and grads on the host */
  void *stage;          /* offload: pinned host staging of one block (comm.c), or NULL */
  size_t stage_bytes;
  weft_dtype ag_dtype, rs_dtype;
  /* parameters */
  fsdp_param *params;
  int nparams;
  int max_blocks; /* the largest fsdp_param.nblocks (1 without fused projections) */
  int64_t block;  /* S: padded elements per rank */
  int64_t numel;  /* sum of tp-local numel */
  /* settings */
  int raf;           /* resolved reshard_after_forward: 0, 1, k (-1: not yet) */
  bool raf_explicit; /* set by the caller (else the default resolves at root init) */
  bool sync;         /* requires_gradient_sync */
  bool reshard_after_backward;
  bool is_last_backward; /* root's */
  weft_fsdp **fwd_prefetch, **bwd_prefetch;
  int nfwd_prefetch, nbwd_prefetch; /* -1: implicit */
  /* state */
  fsdp_state state;
  uint64_t unshard_epoch;
  void *ag_buf; /* n * S elements of ag_dtype while an all-gather runs */
  size_t ag_bytes;
  weft_work *ag_work;
  bool ag_small; /* the in-flight all-gather is the k-rank one */
  /* reshard_after_forward = k (1 < k < n) */
  weft_mesh *small_mesh; /* private (n/k, k) mesh over the shard comm */
  void *small_buf;       /* this rank's 1/k of the flat buffer after forward */
  size_t small_bytes;
  /* reduction in flight */
  void *rs_buf; /* n * S elements of rs_dtype */
  size_t rs_bytes;
  weft_work *rs_work;
  bool rs_pending;
  /* hooks */
  weft_hook_handle *hooks;
  int nhooks;
  int fwd_seen, bwd_seen; /* members of a multi-module group done in this pass */
  bool in_forward, in_backward;
  bool ran; /* a forward has run under this group */
  /* root */
  bool is_root;
  weft_fsdp *root;   /* after lazy init: the root group (self for the root) */
  weft_fsdp **order; /* root: groups in forward order (first forward) */
  int norder, cap_order;
  bool order_done;
  weft_fsdp **pending; /* root: groups with a reduction in flight, oldest first */
  int npending, cap_pending;
  int order_index; /* index in root's order, -1 if not seen */
  /* root: the step check (hooks.c step_check) */
  MPI_Comm step_comm; /* a duplicate of the root mesh's communicator */
  bool step_comm_ready;
  int64_t nforward, nbackward; /* root forwards started, backwards finished */
  int64_t step_mine[2];        /* the step check's send buffer */
  /* counters */
  weft_fsdp_comm comm;
  /* registry */
  weft_fsdp *next;
};

/* -------------------------------------------------------------- shard.c */

/* The registry of live groups (singly linked). */
extern weft_fsdp *fsdp__registry;
/* true if f is in the registry (created and not yet destroyed); false for
 * NULL. Reads no field of f, so a stale handle is safe to pass. */
bool fsdp__live(const weft_fsdp *f);
/* true if `m` is `anc` or lies in its subtree. */
bool fsdp__module_within(const weft_module *m, const weft_module *anc);
/* true if every module of g lies in the subtree of one of f's modules. */
bool fsdp__group_within(const weft_fsdp *g, const weft_fsdp *f);

/* -------------------------------------------------------------- comm.c */

/* Posts the all-gather (copy-in first). Nothing when not sharded. */
weft_status fsdp__unshard_start(weft_fsdp *f, bool prefetch);
/* Completes an unshard (posting it first if needed): waits, copies out,
 * swaps p->data to the unsharded DTensors. */
weft_status fsdp__unshard_wait(weft_fsdp *f);
/* Frees the unsharded parameters (waiting for an in-flight all-gather);
 * small = keep this rank's 1/k for the post-forward (raf = k). */
weft_status fsdp__reshard(weft_fsdp *f, bool small);
/* Drops the kept 1/k (if any). */
void fsdp__drop_small(weft_fsdp *f);
/* Takes the unsharded grads out of p->grad (restoring the held sharded
 * ones) and, with sync, posts the reduce-scatter. */
weft_status fsdp__post_backward_grads(weft_fsdp *f);
/* Waits for f's reduction and writes the sharded grads. */
weft_status fsdp__reduce_finish(weft_fsdp *f);

/* -------------------------------------------------------------- hooks.c */

weft_status fsdp__register_hooks(weft_fsdp *f);
void fsdp__remove_hooks(weft_fsdp *f);
/* Finishes the pending reductions of f's root (or f), all of them or all
 * but `keep`. */
weft_status fsdp__finish_pending(weft_fsdp *root, const weft_fsdp *keep);
/* Removes f from its root's order and pending lists (destroy). */
void fsdp__forget(weft_fsdp *f);

/* -------------------------------------------------------------- trace.c */

void fsdp__event(weft_fsdp_event_kind kind, const weft_fsdp *f, bool prefetch, bool backward);
/* Allocation accounting of FSDP's own buffers (exact peaks). */
void fsdp__mem_add_unsharded_params(int64_t bytes);
void fsdp__mem_add_unsharded_grads(int64_t bytes);
/* Samples the other categories (at events). */
void fsdp__mem_sample(void);
void fsdp__comm_add(weft_comm_count *c, int64_t payload, int n, bool all_reduce);

#endif
