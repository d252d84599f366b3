/* weft/tp.h — tensor parallelism: parallel styles, weft_parallelize_module
 * and loss parallel (torch.distributed.tensor.parallel in C).
 *
 * A tour (SPMD: every rank of the tp mesh runs this):
 *
 *     weft_module *model;
 *     weft_llama_create(&cfg, tp_mesh, &model);           // model mesh = tp mesh
 *     weft_tp *tp;
 *     // torchtitan's plan: heads split over tp, norms sequence parallel,
 *     // vocab-sharded logits fed to loss parallel
 *     weft_tp_apply_llama_plan(model, tp_mesh, true, true, &tp);
 *     weft_module_init_weights(model, 1234);              // or load: same global values
 *     weft_adamw_create(model, &hp, &opt);                // after sharding
 *     ... weft_llama_forward / _backward / weft_clip_grad_norm / step ...
 *     weft_optimizer_destroy(opt);
 *     weft_tp_destroy(tp);                                // before the model
 *     weft_module_destroy(model);
 *
 * Or with an explicit plan (patterns match FQNs relative to the module;
 * `*` matches any characters inside one dot-separated name):
 *
 *     weft_tp_plan_entry plan[] = {
 *       {"layers.*.attention.wq", weft_tp_colwise()},
 *       {"layers.*.attention.wo", weft_tp_rowwise()},
 *     };
 *     weft_parallelize_module(model, tp_mesh, plan, 2, &tp);
 *
 * ------------------------------------------------------------- semantics
 * A style is applied to a module by changing its parameters' placements
 * (weft_param_set_placements, keeping their global values) and by hooks
 * (nn.h) that redistribute its input before it runs and its output after
 * it ran, as PyTorch's ParallelStyle._apply does with distribute_module.
 * The backward hooks do the matching redistribute of the gradients, as
 * DTensor autograd does for Redistribute: the grad of a forward move
 * src -> dst is moved dst -> src, with a Partial src taken as Replicate
 * (the grad of a partial value is replicated), e.g.
 *   forward R -> S      (local slice)      backward S -> R   (all-gather)
 *   forward S(1) -> R   (all-gather)       backward P -> S(1) (reduce-scatter)
 *   forward P -> R      (all-reduce)       backward R -> R   (nothing)
 *   forward P -> S(1)   (reduce-scatter)   backward S(1) -> R (all-gather)
 *   forward S(-1) -> R  (all-gather)       backward R -> S(-1) (local slice)
 * A grad that arrives Partial(sum) where the forward value was Replicate
 * (an unreduced grad, nn.h) is reduced by the same move (P -> S is a
 * reduce-scatter, P -> R an all-reduce).
 *
 * Styles (PyTorch defaults; layouts are placements on the 1-D tp mesh;
 * negative shard dims count from the end of the activation's dims):
 *   colwise   Linear: weight Shard(0), bias Shard(0) (a fused projection:
 *             StridedShard(0, n), see split_factor); Embedding: weight
 *             Shard(1).
 *             input_layouts Replicate, output_layouts Shard(-1),
 *             use_local_output true. The module computes on a Replicate
 *             input and produces Shard(-1); the output is redistributed to
 *             output_layouts (Replicate: all-gather).
 *   rowwise   Linear: weight Shard(1), bias Replicate (added once to the
 *             partial sums), computes on an input Shard(-1);
 *             Embedding: weight Shard(0) (each rank looks up its vocab
 *             range, other rows give 0), computes on Replicate tokens.
 *             The module produces Partial(sum), redistributed to
 *             output_layouts: Replicate (all-reduce, the default) or
 *             Shard(1) for sequence parallel (reduce-scatter).
 *             input_layouts default: Shard(-1) for Linear (PyTorch's),
 *             Replicate for Embedding (tokens are always Replicate in weft;
 *             PyTorch needs input_layouts=Replicate() there).
 *   sequence parallel  RMSNorm or LayerNorm: weight (and bias) Replicate, runs on an input sharded
 *             on sequence_dim (1); an input in other placements is
 *             redistributed to Shard(sequence_dim) (as PyTorch does for a
 *             DTensor input). Its weight grad, computed from the local rows,
 *             is all-reduced to Replicate by nn. use_local_output false.
 *   prepare input / prepare output  Any module kind; parameters untouched.
 *             The input (output) arrives in the declared layout and is
 *             redistributed to the desired layout (PrepareModuleInput /
 *             PrepareModuleOutput with one tensor).
 * input_layouts are checked: an input that arrives in other placements
 * than the style declares is WEFT_ERR_INVALID naming the module and both
 * layouts (PyTorch's PrepareModuleInput means to assert the same; with a
 * plain tensor it would reinterpret the local data). The check is made on
 * placements alone, so every rank finds it alike, before communicating.
 * use_local_output is kept for plan parity with PyTorch: weft's modules
 * always exchange DTensors (never plain local tensors), so it changes
 * nothing in the computation.
 *
 * Composing styles: a module may get at most one parameter style
 * (colwise, rowwise, sequence parallel) and any number of prepare
 * input/output styles from one plan. On one module, input and output
 * moves run in plan order in forward and in reverse order in backward.
 * tp/ knows nothing of FSDP: FSDP composes by reading the placements tp
 * leaves on the parameters and by its own hooks.
 *
 * Loss parallel (torch.distributed.tensor.parallel.loss_parallel):
 * cross-entropy on logits sharded on the vocab dim without gathering them.
 * For N rows and this rank's columns [v0, v0 + nv) of V:
 *   m_n   = max over ranks of max_j z[n, j]                 (all-reduce MAX, N)
 *   s_n   = sum over ranks of sum_j exp(z[n, j] - m_n)      (all-reduce SUM)
 *   t_n   = sum over ranks of z[n, y_n] if y_n is local else 0   (same SUM)
 *   loss  = (1/N) sum_n (m_n + log s_n - t_n)
 *   dz[n, j] = dloss/N * (exp(z[n, j] - m_n - log s_n) - [v0 + j == y_n])
 * (s and t travel in one all-reduce of 2N floats.) No rank ever holds more
 * than its (N, nv) slice of the logits; the backward needs no
 * communication.
 *
 * Collectives: weft_parallelize_module and weft_tp_apply_llama_plan change
 * placements (Replicate -> Shard is a local slice: no communication for a
 * model built all-Replicate) and are called by every rank of the tp mesh
 * with the same plan. Argument and plan errors are detected from names,
 * kinds, shapes and placements, identical on every rank, before anything
 * changes: a failed call leaves the module as it was. The hooks
 * communicate inside forward/backward, which are collective anyway.
 */
#ifndef WEFT_TP_H
#define WEFT_TP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dtensor.h"
#include "mesh.h"
#include "nn.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ styles */

typedef enum weft_tp_style_kind {
  WEFT_TP_COLWISE = 0,       /* ColwiseParallel */
  WEFT_TP_ROWWISE,           /* RowwiseParallel */
  WEFT_TP_SEQUENCE_PARALLEL, /* SequenceParallel */
  WEFT_TP_PREPARE_INPUT,     /* PrepareModuleInput (one input) */
  WEFT_TP_PREPARE_OUTPUT,    /* PrepareModuleOutput (one output) */
  WEFT_TP_STYLE_COUNT
} weft_tp_style_kind;

/* "colwise", "rowwise", "sequence_parallel", "prepare_input",
 * "prepare_output"; "?" for an invalid kind. */
WEFT_API const char *weft_tp_style_kind_name(weft_tp_style_kind kind);

/* A parallel style: a plain value; build it with the constructors below
 * (or fill it by hand: a layout whose has_ flag is false takes the style's
 * default). Layouts are Replicate or Shard(d) (no Partial, no
 * StridedShard). */
typedef struct weft_tp_style {
  weft_tp_style_kind kind;
  /* The layout the module's input arrives in (checked at forward).
   * colwise: R; rowwise: S(-1) for Linear, R for Embedding; prepare input:
   * required. Not used by sequence parallel and prepare output. */
  bool has_input_layout;
  weft_placement input_layout;
  /* prepare input only: the layout the module receives (required). */
  bool has_desired_input_layout;
  weft_placement desired_input_layout;
  /* colwise / rowwise: where the output is redistributed to (colwise
   * S(-1), rowwise R). prepare output: the layout the output is produced
   * in (checked; required). */
  bool has_output_layout;
  weft_placement output_layout;
  /* prepare output only: the layout the output is redistributed to
   * (required). */
  bool has_desired_output_layout;
  weft_placement desired_output_layout;
  /* Kept for parity with PyTorch (see the top): true for colwise, rowwise
   * and prepare output, false for sequence parallel and prepare input. */
  bool use_local_output;
  /* sequence parallel: the sequence dim of the activation (1). */
  int sequence_dim;
  /* colwise on a Linear only: the weight's rows are `split_factor` equal
   * blocks stacked (a fused q|k|v projection: 3), and each block is split
   * over tp on its own (Megatron's layout): every rank holds its heads of
   * q, of k and of v. Weight and bias become StridedShard(0, n) (so
   * full_tensor and checkpoints give the true tensor) and the output
   * StridedShard(-1, n), which weft_op_split turns into n tensors
   * sharded Shard(-1) with no communication. An output layout Shard(d)
   * then means StridedShard(d, n). 0 or 1: not fused. */
  int split_factor;
} weft_tp_style;

/* ColwiseParallel(): input Replicate, output Shard(-1). */
WEFT_API weft_tp_style weft_tp_colwise(void);
/* ColwiseParallel(input_layouts, output_layouts, use_local_output). */
WEFT_API weft_tp_style weft_tp_colwise_ex(weft_placement input_layout, weft_placement output_layout,
                                          bool use_local_output);
/* ColwiseParallel() on a fused projection of n stacked blocks (see
 * split_factor): input Replicate, output StridedShard(-1, n). */
WEFT_API weft_tp_style weft_tp_colwise_fused(int n);
/* RowwiseParallel(): input Shard(-1) (Linear) / Replicate (Embedding),
 * output Replicate. */
WEFT_API weft_tp_style weft_tp_rowwise(void);
/* RowwiseParallel(input_layouts, output_layouts, use_local_output). */
WEFT_API weft_tp_style weft_tp_rowwise_ex(weft_placement input_layout, weft_placement output_layout,
                                          bool use_local_output);
/* SequenceParallel(sequence_dim=1, use_local_output=False). */
WEFT_API weft_tp_style weft_tp_sequence_parallel(void);
/* PrepareModuleInput(input_layouts, desired_input_layouts, use_local_output). */
WEFT_API weft_tp_style weft_tp_prepare_input(weft_placement input_layout,
                                             weft_placement desired_input_layout,
                                             bool use_local_output);
/* PrepareModuleOutput(output_layouts, desired_output_layouts, use_local_output). */
WEFT_API weft_tp_style weft_tp_prepare_output(weft_placement output_layout,
                                              weft_placement desired_output_layout,
                                              bool use_local_output);

/* "colwise(in R, out S(-1))" into buf (NUL-terminated). */
WEFT_API void weft_tp_style_describe(const weft_tp_style *style, char *buf, size_t cap);

/* -------------------------------------------------------------------- plans */

/* One plan entry: every module whose FQN (relative to the module passed to
 * weft_parallelize_module; "" is that module itself) matches `pattern`
 * gets `style`. */
typedef struct weft_tp_plan_entry {
  const char *pattern;
  weft_tp_style style;
} weft_tp_plan_entry;

/* Whether `fqn` matches `pattern`: both are split at '.', they must have
 * the same number of names, and each pattern name matches its name, where
 * '*' matches any run of characters (also empty) and every other character
 * itself (as PyTorch's parallelize_module matches each atom with fnmatch).
 * "" matches only "". Pure; NULL matches nothing. */
WEFT_API bool weft_tp_fqn_match(const char *pattern, const char *fqn);

/* The state of one parallelization: the hooks' contexts and the loss
 * parallel state. Owns nothing of the module. */
typedef struct weft_tp weft_tp;

/* torch.distributed.tensor.parallel.parallelize_module(module, tp_mesh,
 * plan). tp_mesh is 1-D; the module's mesh must have its shape (it is
 * the model mesh). Applies each entry's style to every module it matches
 * (see the top), and returns *out, to be destroyed with weft_tp_destroy
 * before the module. Parameters may be materialised or not: without
 * storage only their layouts change (initialise or load them afterwards);
 * with storage they are resharded keeping their values and their grads are
 * dropped. Create optimizers after this call.
 * Errors (every rank alike, nothing changed): NULL arguments, nentries < 0,
 * tp_mesh not 1-D or of another shape than the module's mesh, an entry
 * whose pattern matches no module (WEFT_ERR_NOT_FOUND naming it), a style
 * on a module kind it does not apply to (colwise/rowwise: linear or
 * embedding; sequence parallel: rmsnorm or layernorm; split_factor > 1:
 * colwise on a linear whose out features are n equal blocks), a module that gets two parameter
 * styles, a missing required layout or a Partial/StridedShard layout
 * (WEFT_ERR_INVALID naming the entry and module). Collective over tp_mesh
 * only where materialised parameters move (see the top). */
WEFT_API weft_status weft_parallelize_module(weft_module *module, weft_mesh *tp_mesh,
                                             const weft_tp_plan_entry *plan, int nentries,
                                             weft_tp **out);

/* Removes the hooks tp registered and restores the default loss of a loss
 * module it changed, then frees tp. The module must still exist (destroy
 * tp first); parameters keep their placements. NULL: no-op. Local. */
WEFT_API void weft_tp_destroy(weft_tp *tp);

/* The tp mesh (not retained beyond tp's life). */
WEFT_API weft_mesh *weft_tp_mesh(const weft_tp *tp);
/* Number of (module, style) applications. */
WEFT_API int weft_tp_num_applied(const weft_tp *tp);
/* One line per application, "layers.0.attention.wq: colwise(in R, out
 * S(-1))\n", into buf (NUL-terminated, truncated to cap). Returns the
 * length the full text needs (as snprintf). */
WEFT_API size_t weft_tp_describe(const weft_tp *tp, char *buf, size_t cap);

/* ------------------------------------------------------------ loss parallel */

/* The state of one cross-entropy (the row statistics the backward needs). */
typedef struct weft_tp_loss weft_tp_loss;

WEFT_API weft_status weft_tp_loss_create(weft_tp_loss **out);
WEFT_API void weft_tp_loss_destroy(weft_tp_loss *l); /* NULL: no-op */

/* Mean cross-entropy of logits (..., V) (f32 DTensor; rows = every dim but
 * the last, whole on every rank) against targets (the rows' shape, int32,
 * in [0, V), the same full host tensor on every rank; copied to the
 * logits' device when they live on one, where the row statistics are
 * kept too). Per mesh dim the logits
 * are Replicate, or Shard(last) = loss parallel (the formulas at the top;
 * all-reduces over those mesh dims). *loss is the same on every rank.
 * Errors (every rank alike, before communicating): NULL, dtype, shapes,
 * a target out of range, other placements (WEFT_ERR_UNSUPPORTED).
 * Collective over the sharded mesh dims. */
WEFT_API weft_status weft_tp_loss_forward(weft_tp_loss *l, const weft_dtensor *logits,
                                          const weft_tensor *targets, double *loss);
/* dlogits (same spec as logits; overwritten) = dloss * d loss / d logits
 * for the last forward (same logits and targets). Local, no communication.
 * WEFT_ERR_STATE without a matching forward. */
WEFT_API weft_status weft_tp_loss_backward(weft_tp_loss *l, const weft_dtensor *logits,
                                           const weft_tensor *targets, double dloss,
                                           weft_dtensor *dlogits);
/* The weft_loss_impl whose ctx is a weft_tp_loss (weft_loss_set_impl). */
WEFT_API const weft_loss_impl *weft_tp_loss_impl(void);

/* Installs loss parallel on a loss module (WEFT_MODULE_LOSS): its forward
 * and backward then run weft_tp_loss_forward/_backward with a state owned
 * by tp; weft_tp_destroy restores the default. Pair it with an output
 * style that leaves the logits Shard(-1). Local. */
WEFT_API weft_status weft_tp_enable_loss_parallel(weft_tp *tp, weft_module *loss_module);

/* ------------------------------------------------------- reference model */

/* torchtitan's plan for the Llama model (nn.h's weft_llama_create), into
 * out[0..*n) (writes min(cap, count); *n = count; patterns are static
 * strings):
 *   tok_embeddings               rowwise (input R; output R, or S(1) with sp)
 *   norm                         sequence parallel (sp only)
 *   output                       colwise (input R, or S(1) with sp; output
 *                                S(-1) with loss parallel, else R)
 *   layers.*.attention_norm      sequence parallel (sp only)
 *   layers.*.attention           prepare input S(1) -> R (sp only)
 *   layers.*.attention.wq wk wv  colwise
 *   layers.*.attention.wo        rowwise (output R, or S(1) with sp)
 *   layers.*.ffn_norm            sequence parallel (sp only)
 *   layers.*.feed_forward        prepare input S(1) -> R (sp only)
 *   layers.*.feed_forward.w1 w3  colwise
 *   layers.*.feed_forward.w2     rowwise (output R, or S(1) with sp) */
WEFT_API weft_status weft_tp_llama_plan(bool sequence_parallel, bool loss_parallel,
                                        weft_tp_plan_entry *out, int cap, int *n);

/* Checks that the model's heads divide over tp_mesh (n_heads % tp == 0 and
 * n_kv_heads % tp == 0; WEFT_ERR_INVALID naming the counts otherwise),
 * then weft_parallelize_module(model, tp_mesh, weft_tp_llama_plan(...))
 * and, with loss_parallel, weft_tp_enable_loss_parallel on its "loss"
 * child. Per block forward: 2 all-reduces of (B, T, D) without sequence
 * parallel; 2 all-gathers and 2 reduce-scatters with it. */
WEFT_API weft_status weft_tp_apply_llama_plan(weft_module *model, weft_mesh *tp_mesh,
                                              bool sequence_parallel, bool loss_parallel,
                                              weft_tp **out);

#ifdef __cplusplus
}
#endif
#endif /* WEFT_TP_H */
