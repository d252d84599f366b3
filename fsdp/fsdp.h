/* weft/fsdp.h — fully sharded data parallelism: weft_fully_shard, parameter
 * groups, unshard/reshard, gradient reduce-scatter, mixed precision,
 * prefetch (PyTorch FSDP2's fully_shard in C).
 *
 * A tour (SPMD: every rank of the mesh runs this; 2-D: dp x tp):
 *
 *     int shape[2] = {dp, tp};
 *     const char *names[2] = {"dp", "tp"};
 *     weft_mesh *mesh, *dp_mesh, *tp_mesh;
 *     weft_mesh_create(2, shape, names, &mesh);
 *     weft_mesh_submesh(mesh, 1, &names[0], &dp_mesh);
 *     weft_mesh_submesh(mesh, 1, &names[1], &tp_mesh);
 *     weft_module *model;
 *     weft_llama_create(&cfg, tp_mesh, &model);        // shapes only (deferred init)
 *     weft_tp_apply_llama_plan(model, tp_mesh, true, true, &tp);   // optional TP
 *     weft_fsdp_options o = WEFT_FSDP_OPTIONS_INIT;
 *     for (i = 0; i < L; i++)                            // bottom-up
 *       weft_fully_shard(block_i, dp_mesh, &o, NULL);
 *     weft_module *last[2] = {norm, output};
 *     weft_fully_shard_modules(last, 2, dp_mesh, &o, NULL);
 *     weft_fsdp *root;
 *     weft_fully_shard(model, dp_mesh, &o, &root);
 *     weft_module_init_weights(model, seed);           // fills only the local shards
 *     weft_adamw_create(model, &hp, &opt);             // after sharding: steps the shards
 *     for (step...) {                                  // each dp rank: its own micro-batch
 *       weft_llama_forward(model, tokens, targets, &loss);
 *       weft_llama_backward(model);                    // grads: reduce-scattered, averaged
 *       weft_clip_grad_norm(model, 1.0, &norm);        // reduces over dp and tp shards
 *       weft_optimizer_step(opt);
 *       weft_module_zero_grad(model, false);
 *     }
 *     weft_optimizer_destroy(opt);
 *     weft_fsdp_destroy_all(model);                    // before the model (and before tp)
 *     weft_tp_destroy(tp); weft_module_destroy(model);
 *
 * ------------------------------------------------------------ layouts
 * Modules compute on DTensors over their model mesh (the tp mesh, or a
 * 1-rank mesh without TP); data parallelism is invisible to them. Each
 * weft_fully_shard call makes one parameter group: the parameters of the
 * module's subtree that no earlier call took (so: shard children first).
 * Outside forward/backward, a parameter's `data` is its *sharded* DTensor:
 *   - without TP (model mesh of size 1): on the dp mesh, placements
 *     (Shard(0)) on a 1-D mesh, (Replicate, Shard(0)) on a 2-D
 *     (replicate, shard) mesh (HSDP);
 *   - with TP: on the root mesh of the dp and tp meshes, which must have
 *     exactly the dims (dp dims..., tp dims...) in that order (PyTorch
 *     2.4's requirement: FSDP and TP meshes share one parent); placements
 *     are the dp ones followed by the parameter's TP placements, except
 *     that where TP already shards dim 0 the dp shard is
 *     StridedShard(0, split) with split = the product of those tp dims'
 *     sizes (dtensor.h): dp then splits each rank's TP shard.
 * Either way this rank's shard is torch.chunk(tp_local, shard_size,
 * dim=0)[shard_coord] of the tensor the parameter has on the model mesh
 * (tp_local: the whole tensor without TP), so full_tensor, redistribute,
 * clipping and checkpoints see the true global tensor. Uneven dim-0 sizes
 * follow torch.chunk (trailing shards smaller or empty); the group's flat
 * communication buffer pads every parameter to ceil(rows / n) rows per rank,
 * so one all-gather and one reduce-scatter of equal blocks serve the group.
 * The sharded DTensors own their storage (exactly the local rows); the
 * module destroys them with the parameters.
 *
 * ---------------------------------------------------------- a step
 * Hooks (nn.h) on the group's modules drive everything; a group of several
 * modules ([norm, output]) acts when the first of them starts and when the
 * last of them ends, as PyTorch's grouped hooks do.
 *   pre-forward   unshard: copy-in of the local shards into one flat buffer
 *                 (converted to param_dtype), one all-gather over the shard
 *                 dim, copy-out into unsharded parameters (f32 DTensors on
 *                 the model mesh with the TP placements); `data` is swapped
 *                 to them. Then the next group in forward order is
 *                 prefetched (its all-gather posted, async), then the module
 *                 computes.
 *   post-forward  reshard (reshard_after_forward): `data` back to the
 *                 sharded DTensor, unsharded storage freed; with a group
 *                 size k the rank first keeps 1/k of the gathered buffer so
 *                 that the backward all-gather runs over k ranks only.
 *   pre-backward  unshard (if resharded), prefetch the group that runs
 *                 backward next, and move the sharded grad aside: nn then
 *                 accumulates into an unsharded grad on the model mesh.
 *   post-backward reshard (reshard_after_backward) and, with gradient sync
 *                 on, copy-in of the unsharded grads into one flat buffer
 *                 (reduce_dtype), one async reduce-scatter (sum) over the
 *                 shard dim, which runs while the next group computes; it
 *                 is finished at the next group's post-backward (or at the
 *                 root's): HSDP then all-reduces (sum) over the replicate
 *                 dim, and the result times 1 / (dp size) — the average over
 *                 data-parallel ranks, as PyTorch — is added to the sharded
 *                 grad (created if there is none). With sync off the
 *                 unsharded grads are kept and accumulate across backwards
 *                 until a backward with sync on reduces them all.
 * The root group (the first one whose forward runs: normally the one of
 * the model) finishes every pending reduction at its post-backward when
 * this is the last backward (set_is_last_backward, default true).
 * After backward every parameter's `data` and `grad` are sharded again (on
 * default settings), so optimizers created after sharding step only the
 * local shards, and weft_clip_grad_norm reduces over the mesh dims where
 * they are sharded.
 *
 * ---------------------------------------------------------- init
 * Deferred initialisation: a parameter without storage when fully_shard
 * runs gets zero-filled local rows only; weft_module_init_weights(root,
 * seed) afterwards fills them from the counter RNG by global index, which
 * is bitwise what eager initialisation (init, then shard) gives. A
 * parameter with storage is sliced (no communication) and its old storage
 * freed; its grad is dropped.
 *
 * ---------------------------------------------------------- precision
 * Mixed precision (MixedPrecisionPolicy): param_dtype is the dtype of the
 * all-gather and of the unsharded parameters' values, reduce_dtype the
 * dtype of the gradient reduce-scatter / all-reduce (default: param_dtype),
 * output_dtype casts a module's forward output, cast_forward_inputs casts
 * floating inputs to param_dtype. The sharded master parameters, their
 * grads and optimizer state stay f32.
 * Where a parameter's module runs on the op graph (weft_module_on_graph:
 * models written with autograd.h, as models/gpt2) its unsharded data is a
 * param_dtype tensor, and cast_forward_inputs / output_dtype convert the
 * module's input / output to that dtype, so activations are bf16 too: the
 * ops compute in f32 on widened inputs and round their outputs (autograd.h,
 * "dtypes"); the unsharded grads are f32 (from bf16-rounded contributions),
 * reduced in reduce_dtype into the f32 sharded grads.
 * The hand-written layers of the built-in Llama take f32 only: there the
 * unsharded parameters are f32 tensors holding bf16-rounded values (and
 * the casts round activations to bf16 values in f32 storage), so the
 * all-gather moves bf16 and the numbers are those of bf16 parameters, but
 * storage and arithmetic stay f32.
 *
 * ---------------------------------------------------------- ownership
 * weft_fully_shard returns a weft_fsdp (the group's state; also found with
 * weft_fsdp_of). It keeps pointers to the module's parameters and hooks:
 * destroy every group (weft_fsdp_destroy_all(root)) before destroying the
 * module, and before weft_tp_destroy. After that the parameters keep their
 * sharded DTensors (so they can still be saved), but the module can no
 * longer run forward.
 *
 * ---------------------------------------------------------- collectives
 * weft_fully_shard is collective over the dp mesh only where it must be
 * (a reshard_after_forward group size k creates a k-rank communicator);
 * forward/backward hooks communicate over the shard (and replicate) dims
 * of the dp mesh: every rank runs the same groups in the same order.
 * Argument errors are found from modules, meshes, options, shapes and
 * placements, alike on every rank, before anything changes, so a failed
 * call leaves the module as it was and never hangs.
 * Not thread-safe: one thread drives all groups.
 */
#ifndef WEFT_FSDP_H
#define WEFT_FSDP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "dtensor.h"
#include "mesh.h"
#include "nn.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ----------------------------------------------------------------- options */

/* MixedPrecisionPolicy. WEFT_DTYPE_COUNT means "not set". */
typedef struct weft_fsdp_mixed_precision {
  weft_dtype param_dtype;   /* all-gather / unsharded values: f32, bf16 or f16; unset: f32 */
  weft_dtype reduce_dtype;  /* gradient reduction: f32, bf16 or f16; unset: param_dtype */
  weft_dtype output_dtype;  /* forward outputs rounded to it (f32 storage); unset: none */
  bool cast_forward_inputs; /* floating inputs rounded to param_dtype (default true) */
} weft_fsdp_mixed_precision;

/* reshard_after_forward values: -1 = PyTorch's default (false for the root
 * group, true for the others), 0 = false, 1 = true, k >= 2 = reshard to
 * groups of k consecutive ranks of the shard dim (k must divide it; k = the
 * shard dim size is the same as true). */
#define WEFT_FSDP_RESHARD_DEFAULT (-1)

typedef struct weft_fsdp_options {
  int version;               /* WEFT_FSDP_OPTIONS_VERSION */
  int reshard_after_forward; /* see above */
  weft_fsdp_mixed_precision mp;
  /* CPUOffloadPolicy: keep sharded parameters, grads and optimizer state in
   * host memory. On a device mesh the sharded parameters and grads are
   * offloaded DTensors (host locals on the device mesh; the optimizer makes
   * its state next to them and steps on the CPU); an unshard packs the
   * shard on the host and copies it to the device before the all-gather,
   * and the reduce-scattered gradient block is copied back to the host
   * before it is accumulated. On a CPU mesh everything is already in host
   * memory: the flag changes nothing there. */
  bool offload_params;
} weft_fsdp_options;
#define WEFT_FSDP_OPTIONS_VERSION 1
#define WEFT_FSDP_OPTIONS_INIT                                              \
  {                                                                         \
    WEFT_FSDP_OPTIONS_VERSION, WEFT_FSDP_RESHARD_DEFAULT,                   \
        {WEFT_DTYPE_COUNT, WEFT_DTYPE_COUNT, WEFT_DTYPE_COUNT, true}, false \
  }

/* ---------------------------------------------------------------- sharding */

/* One parameter group's state (FSDPModule / FSDPParamGroup). */
typedef struct weft_fsdp weft_fsdp;

/* fully_shard(module, mesh=dp_mesh, ...): makes the parameters of module's
 * subtree that no earlier call took into one group, shards them (see the
 * top) and registers the hooks. mesh is the dp mesh: 1-D (shard) or 2-D
 * (replicate, shard) for HSDP; it must not share dims with the model mesh.
 * opts NULL = defaults. *out (may be NULL) is the group's state, owned by
 * the registry until weft_fsdp_destroy.
 * Errors (WEFT_ERR_INVALID or WEFT_ERR_STATE, nothing changed): NULL
 * module or mesh, a mesh that is not 1-D or 2-D, bad options (version,
 * reshard_after_forward, non-float dtypes), the module already in a group
 * (fully_shard twice), an ancestor already sharded (top-down order: shard
 * bottom-up), a running module or one that already ran under FSDP, a
 * parameter already in another group (shared parameters), a tied
 * parameter (weft_module_tie_param) that a module outside the group uses
 * (PyTorch's rule: a shared parameter belongs to the group of the lowest
 * common ancestor of its users; the message names the parameter, the
 * alias's FQN and the module to shard instead: for GPT-2, fully_shard of
 * transformer.wte or transformer alone fails, the root or [wte, lm_head]
 * takes it, and fully_shard(lm_head) takes nothing for the alias),
 * placements that are Partial or StridedShard, a dp mesh and tp mesh that do not come from
 * one root of dims (dp..., tp...), a group with no parameters is allowed
 * (it only joins the hook order). Collective over the dp shard dim only
 * for reshard_after_forward = k (see the top). */
WEFT_API weft_status weft_fully_shard(weft_module *module, weft_mesh *mesh,
                                      const weft_fsdp_options *opts, weft_fsdp **out);
/* fully_shard([m0, m1, ...]): one group over several modules (all on model
 * meshes of one shape), communicated as one collective; none may be inside
 * another. Same errors. */
WEFT_API weft_status weft_fully_shard_modules(weft_module *const *modules, int n, weft_mesh *mesh,
                                              const weft_fsdp_options *opts, weft_fsdp **out);

/* The group a module belongs to (as one of its modules), or NULL. */
WEFT_API weft_fsdp *weft_fsdp_of(const weft_module *module);

/* Destroys one group: waits for its in-flight communication (finishing a
 * pending gradient reduction), reshards, drops unsharded grads still kept
 * for accumulation, removes its hooks and frees its buffers. Parameters
 * keep their sharded data and grads. WEFT_ERR_BUSY while one of its
 * modules runs. NULL: no-op. Local (the waits complete collectives that
 * every rank started). */
WEFT_API weft_status weft_fsdp_destroy(weft_fsdp *f);
/* Destroys every group whose modules lie in root's subtree (the group of
 * root included). */
WEFT_API weft_status weft_fsdp_destroy_all(weft_module *root);

/* ----------------------------------------------------------------- queries */

WEFT_API int weft_fsdp_num_modules(const weft_fsdp *f);
WEFT_API weft_module *weft_fsdp_module(const weft_fsdp *f, int i);
/* "layers.0" or "norm+output": the modules' FQNs joined by '+' (a root
 * module, whose FQN is "", by its local name: "model"). */
WEFT_API const char *weft_fsdp_name(const weft_fsdp *f);
WEFT_API int weft_fsdp_num_params(const weft_fsdp *f);
WEFT_API weft_param *weft_fsdp_param(const weft_fsdp *f, int i);
/* The dp mesh passed to fully_shard (not retained beyond f's life). */
WEFT_API weft_mesh *weft_fsdp_dp_mesh(const weft_fsdp *f);
/* true while the group's parameters are unsharded (all-gather finished). */
WEFT_API bool weft_fsdp_is_unsharded(const weft_fsdp *f);
/* true for the group that acted as root (after the first forward). */
WEFT_API bool weft_fsdp_is_root(const weft_fsdp *f);
/* The resolved reshard_after_forward (0, 1 or k; -1 until the first forward
 * resolves the default). */
WEFT_API int weft_fsdp_reshard_after_forward(const weft_fsdp *f);

/* Sizes of one group on this rank. */
typedef struct weft_fsdp_group_info {
  int nparams;
  int shard_size;             /* ranks that split the group (the shard dim) */
  int replicate_size;         /* HSDP replicate dim (1 without) */
  int64_t numel;              /* sum of the parameters' model-mesh local numel (tp-local) */
  int64_t shard_numel;        /* this rank's sharded elements (unpadded) */
  int64_t padded_shard_numel; /* elements per rank in the flat buffer (padded) */
  weft_dtype param_dtype;     /* all-gather dtype */
  weft_dtype reduce_dtype;    /* gradient reduction dtype */
  bool offload_params;
} weft_fsdp_group_info;
WEFT_API weft_status weft_fsdp_get_info(const weft_fsdp *f, weft_fsdp_group_info *out);

/* ---------------------------------------------------------------- controls */

/* An explicit unshard in flight. */
typedef struct weft_fsdp_handle weft_fsdp_handle;

/* FSDPModule.unshard(async_op): all-gathers the group's parameters and
 * swaps them in. With async_op the all-gather is only posted and *handle
 * is set: weft_fsdp_handle_wait finishes it (or the group's next
 * pre-forward / pre-backward does; the handle must still be waited, which
 * is then free). Without async_op it completes here (*handle may be NULL
 * and is set NULL). Already unsharded: nothing to do. Collective over the
 * shard dim (every rank unshards the same groups in the same order). */
WEFT_API weft_status weft_fsdp_unshard(weft_fsdp *f, bool async_op, weft_fsdp_handle **handle);
/* Waits for an unshard posted by weft_fsdp_unshard and frees the handle.
 * NULL: no-op. */
WEFT_API weft_status weft_fsdp_handle_wait(weft_fsdp_handle *handle);
/* FSDPModule.reshard(): frees the unsharded parameters (waiting for an
 * in-flight all-gather first) and swaps the sharded ones back. Local. */
WEFT_API weft_status weft_fsdp_reshard(weft_fsdp *f);

/* set_requires_gradient_sync: with false, backward keeps accumulating the
 * unsharded grads and does not reduce-scatter (no all-reduce either); the
 * first backward with true reduces what accumulated. recurse: also every
 * group inside f's modules' subtrees. */
WEFT_API weft_status weft_fsdp_set_requires_gradient_sync(weft_fsdp *f, bool sync, bool recurse);
/* set_reshard_after_backward: false keeps the parameters unsharded after
 * backward (saving the next forward's all-gather during accumulation);
 * reshard (true or weft_fsdp_reshard) before an optimizer step, which
 * needs the sharded parameters. */
WEFT_API weft_status weft_fsdp_set_reshard_after_backward(weft_fsdp *f, bool reshard, bool recurse);
/* set_reshard_after_forward (values as in the options, not -1). A group
 * size k >= 2 that f has no communicator for yet creates one: then
 * collective over the shard dim (every rank calls it alike). */
WEFT_API weft_status weft_fsdp_set_reshard_after_forward(weft_fsdp *f, int value, bool recurse);
/* set_modules_to_forward_prefetch / _backward_prefetch: the groups whose
 * all-gathers f posts after its own unshard in pre-forward (resp.
 * pre-backward), replacing the implicit prefetch of the next group. n = 0
 * turns prefetch off for f; n < 0 restores the implicit one. The groups
 * must share f's dp mesh. */
WEFT_API weft_status weft_fsdp_set_modules_to_forward_prefetch(weft_fsdp *f,
                                                               weft_fsdp *const *groups, int n);
WEFT_API weft_status weft_fsdp_set_modules_to_backward_prefetch(weft_fsdp *f,
                                                                weft_fsdp *const *groups, int n);
/* set_is_last_backward: with false the root's post-backward leaves the last
 * gradient reductions in flight (they finish at the next forward's root
 * pre-forward, the next post-backward, weft_fsdp_wait_reductions or
 * destroy): use it for micro-batches that are followed by more, never
 * right before an optimizer step. Applies to f's root (f itself before the
 * first forward has found the root: call it on the root group). */
WEFT_API weft_status weft_fsdp_set_is_last_backward(weft_fsdp *f, bool last);
/* Finishes every pending gradient reduction of f's root (waits). */
WEFT_API weft_status weft_fsdp_wait_reductions(weft_fsdp *f);

/* ----------------------------------------------------------- comm counters */

/* What FSDP itself communicated (this rank): payload bytes as mesh.h counts
 * them (all-gather output, reduce-scatter input, all-reduce buffer) and bus
 * bytes (payload * (n-1)/n; all-reduce 2 * payload * (n-1)/n). The
 * all-gathers of a reshard_after_forward group size k run over a k-rank
 * communicator FSDP owns and are counted in small_all_gather only; the
 * others also appear in weft_comm_stats of the dp mesh. */
typedef struct weft_fsdp_comm {
  weft_comm_count all_gather;       /* over the shard dim */
  weft_comm_count small_all_gather; /* over the post-forward k-rank groups */
  weft_comm_count reduce_scatter;   /* over the shard dim */
  weft_comm_count all_reduce;       /* HSDP: over the replicate dim */
} weft_fsdp_comm;
/* f's counters; recurse: summed with every group inside f's modules. */
WEFT_API weft_status weft_fsdp_comm_get(const weft_fsdp *f, bool recurse, weft_fsdp_comm *out);
/* Zeroes f's counters (recurse as above). */
WEFT_API weft_status weft_fsdp_comm_reset(weft_fsdp *f, bool recurse);

/* ------------------------------------------------------------------ memory */

typedef struct weft_fsdp_mem_count {
  int64_t current;
  int64_t peak;
} weft_fsdp_mem_count;

/* Per-rank bytes (weft_alloc accounting on the CPU). sharded_params and
 * sharded_grads: the local shards of every group's parameters; optimizer:
 * the state of the optimizer registered with weft_fsdp_memory_track;
 * unsharded_params: unsharded parameters plus all-gather buffers (and the
 * kept 1/k of a reshard_after_forward group size); unsharded_grads:
 * unsharded grads plus reduce-scatter buffers; other: everything else the
 * allocator holds (activations, layer buffers, TP temporaries); total:
 * the allocator's current and exact peak. unsharded_* peaks are exact
 * (updated at every allocation FSDP makes); the others are sampled at every
 * FSDP event (each hook, unshard, reshard, reduction) and at this call. */
typedef struct weft_fsdp_memory {
  weft_fsdp_mem_count sharded_params;
  weft_fsdp_mem_count sharded_grads;
  weft_fsdp_mem_count optimizer;
  weft_fsdp_mem_count unsharded_params;
  weft_fsdp_mem_count unsharded_grads;
  weft_fsdp_mem_count other;
  weft_fsdp_mem_count total;
} weft_fsdp_memory;
/* The current numbers and peaks since the last reset. Local. */
WEFT_API weft_status weft_fsdp_memory_get(weft_fsdp_memory *out);
/* Starts a new peak window (sets every peak to its current value, the
 * allocator's too: weft_mem_reset_peak). */
WEFT_API void weft_fsdp_memory_reset_peak(void);
/* Counts opt's state as `optimizer` (NULL: none). Not retained: pass NULL
 * before destroying the optimizer. */
WEFT_API void weft_fsdp_memory_track(const weft_optimizer *opt);

/* ------------------------------------------------------------------- trace */

typedef enum weft_fsdp_event_kind {
  WEFT_FSDP_EV_UNSHARD_START = 0, /* all-gather posted (prefetch says whether ahead of need) */
  WEFT_FSDP_EV_UNSHARD_DONE,      /* all-gather waited, parameters swapped in */
  WEFT_FSDP_EV_RESHARD,           /* unsharded storage freed */
  WEFT_FSDP_EV_FORWARD_BEGIN,     /* the group's modules start computing */
  WEFT_FSDP_EV_FORWARD_END,
  WEFT_FSDP_EV_BACKWARD_BEGIN,
  WEFT_FSDP_EV_BACKWARD_END, /* its grads are final (before the reduction) */
  WEFT_FSDP_EV_REDUCE_START, /* reduce-scatter posted */
  WEFT_FSDP_EV_REDUCE_DONE,  /* reduction waited, sharded grads written */
  WEFT_FSDP_EV_KIND_COUNT
} weft_fsdp_event_kind;
/* "unshard_start", ...; "?" for an invalid kind. */
WEFT_API const char *weft_fsdp_event_kind_name(weft_fsdp_event_kind kind);

typedef struct weft_fsdp_event {
  weft_fsdp_event_kind kind;
  const weft_fsdp *group;
  bool prefetch; /* UNSHARD_START: posted as a prefetch (not by the group's own hook) */
  bool backward; /* happened during a backward */
  /* The device stream the event's work was queued on, for a group on a
   * device: UNSHARD_START WEFT_STREAM_FSDP_AG, REDUCE_START
   * WEFT_STREAM_FSDP_RS, the others WEFT_STREAM_COMPUTE (for a group on
   * the CPU always WEFT_STREAM_COMPUTE). Communication overlaps compute
   * where a group's FORWARD/BACKWARD_BEGIN comes between another group's
   * START and its DONE (weft_fsdp_trace_overlaps counts them). */
  weft_stream_id stream;
} weft_fsdp_event;

/* A process-wide debug trace of FSDP's events in the order they happened
 * (off by default; capped at 1 << 20 events). */
WEFT_API void weft_fsdp_trace_enable(bool on);
WEFT_API void weft_fsdp_trace_clear(void);
WEFT_API int weft_fsdp_trace_count(void);
/* Event i (0 <= i < count); WEFT_ERR_INVALID otherwise. */
WEFT_API weft_status weft_fsdp_trace_get(int i, weft_fsdp_event *out);
/* One line per event ("12 unshard_start layers.1 (prefetch) on
 * fsdp_all_gather") to f. */
WEFT_API void weft_fsdp_trace_print(FILE *f);
/* From the trace so far: how many all-gathers (UNSHARD_START .. DONE) and
 * reductions (REDUCE_START .. DONE) of a group were in flight on their own
 * device stream while another group's forward or backward began, i.e. ran
 * beside compute. Either pointer may be NULL. Local. */
WEFT_API void weft_fsdp_trace_overlaps(int *all_gathers, int *reductions);

#ifdef __cplusplus
}
#endif
#endif /* WEFT_FSDP_H */
