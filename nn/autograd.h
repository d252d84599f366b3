/* weft/autograd.h — ops on DTensors with autograd: a graph (the tape of one
 * forward), variables, the op library, and running
 * modules whose forward is written with ops.
 *
 * A tour (SPMD: every rank of the mesh runs this):
 *
 *     weft_graph *g;
 *     weft_graph_create(&g);
 *     for (step...) {
 *       weft_var *x, *h, *loss;
 *       weft_graph_input(g, x_dt, false, &x);          // x_dt: a DTensor (borrowed)
 *       weft_var *w = weft_graph_param(g, w_param);    // a parameter (nn.h)
 *       weft_op_linear(x, w, NULL, &h);                // y = x w^T, placements by rule
 *       weft_op_gelu(h, true, &h);
 *       weft_op_cross_entropy(h, targets, -100, &loss);
 *       printf("%f\n", weft_var_item(loss));
 *       weft_backward(loss);                           // grads into w_param->grad
 *       weft_graph_reset(g);                           // next step reuses the buffers
 *     }
 *     weft_graph_destroy(g);
 *
 * ------------------------------------------------------------- semantics
 * A var is a DTensor in a graph: an op's output, an input the user passed
 * (weft_graph_input) or a parameter (weft_graph_param). An op takes vars,
 * picks its output placements per mesh dim from its inputs' placements by
 * its sharding rule (the strategies PyTorch's DTensor lists for the op;
 * when the inputs fit none, the inputs are redistributed to the strategy
 * that moves the fewest bytes, ties to the one listed first), computes on
 * the local shards through the backend (backend.h) and, when an input
 * requires grad, records a node with what its backward needs.
 *
 * weft_backward runs the nodes in reverse order. A var's grad has the
 * var's global shape and placements its consumers' backwards produced (a
 * grad may be Partial(sum) where the value is Replicate: not yet reduced);
 * grads from several consumers are summed. Every backward accepts, per
 * mesh dim, an output grad with the output's placement, or Partial(sum)
 * where the output is Replicate, or Replicate where the output is Partial;
 * any other grad is redistributed first (as DTensor autograd does). A
 * parameter's grad is reduced to the parameter's placements (all-reduce or
 * reduce-scatter of a partial grad) and accumulated into param->grad,
 * read from param->data at backward time (FSDP swaps data between forward
 * and backward through module hooks; nn.h).
 *
 * Modules (nn.h) run inside a graph with weft_module_call: the module's
 * hooks fire around its forward, and its backward boundaries are nodes of
 * the graph, so pre-backward hooks fire before the first node of the
 * module runs in backward and post-backward hooks after the last one (when
 * its parameter grads are final). The built-in modules with a hand-written
 * backward record one node.
 *
 * Ownership: vars, their values and grads belong to the graph and stay
 * valid until weft_graph_reset or destroy. DTensors passed to
 * weft_graph_input are borrowed (the caller keeps them alive until reset).
 * Buffers are pooled by spec: from the second step on, a step of the same
 * shapes allocates no tensors for activations or grads.
 *
 * Collectives: ops, backward and reset follow the DTensor rules: every
 * rank of the mesh calls the same ops in the same order with the same
 * shapes and placements. Errors found from shapes and placements are
 * reported on every rank alike before any communication; they name the op,
 * the inputs' shapes and placements. With WEFT_DEBUG=1 every op first
 * checks that every rank of its mesh calls the same op at the same
 * position of the graph (an inconsistent model names the ranks and ops).
 */
#ifndef WEFT_AUTOGRAD_H
#define WEFT_AUTOGRAD_H

#include <stdbool.h>
#include <stdint.h>

#include "dtensor.h"
#include "nn.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- graphs */

typedef struct weft_graph weft_graph;
typedef struct weft_var weft_var;

/* An empty graph: training mode (dropout active), seed 0, step 0. Local. */
WEFT_API weft_status weft_graph_create(weft_graph **out);
/* Frees the graph, its vars and pooled buffers. NULL: no-op. Local. */
WEFT_API void weft_graph_destroy(weft_graph *g);
/* Bytes of this rank's local tensors in the graph's buffers in use now:
 * after a forward, the activations kept for backward and the outputs (not
 * the spare buffers of earlier steps); after backward, what is still read
 * (values, kept grads), since backward returns each grad, redistributed
 * copy and temporary to the pool once nothing refers to it. Local. */
WEFT_API int64_t weft_graph_bytes_in_use(const weft_graph *g);
/* The most bytes weft_graph_bytes_in_use reached since the last reset (the
 * graph's share of a step's peak memory: read it before the reset). 0 for
 * NULL. Local. */
WEFT_API int64_t weft_graph_bytes_peak(const weft_graph *g);
/* Drops the vars and nodes of the last forward/backward (their buffers
 * return to the pool) and advances the step counter (dropout masks differ
 * per step). Local. */
WEFT_API weft_status weft_graph_reset(weft_graph *g);
/* Training mode: dropout active (true, the default) or identity. */
WEFT_API void weft_graph_set_training(weft_graph *g, bool training);
/* The RNG seed of dropout masks and the step they are keyed by (reset
 * increments the step; set it when resuming). */
WEFT_API void weft_graph_set_seed(weft_graph *g, uint64_t seed);
WEFT_API void weft_graph_set_step(weft_graph *g, int64_t step);
WEFT_API int64_t weft_graph_step(const weft_graph *g);
/* Data parallel: this rank's batch is rows [row0, row0 + B) of a global
 * batch of total_rows rows (its dp group's slice). Random ops (dropout)
 * then take dim 0 of their input as the batch dim and key each element by
 * its row in the global batch, so a run on any dp x tp mesh draws the masks
 * one rank with the whole batch draws. total_rows 0 (the default): the
 * graph's tensors are the whole batch. WEFT_ERR_INVALID for a row0 outside
 * [0, total_rows); a dropout input whose dim 0 does not fit is an error of
 * that op. Local. */
WEFT_API weft_status weft_graph_set_batch_slice(weft_graph *g, int64_t row0, int64_t total_rows);
/* Grad recording on (default) or off (inference: ops record nothing). */
WEFT_API void weft_graph_set_grad_enabled(weft_graph *g, bool enabled);

/* What the op layer did, to see where a step's time goes (weft-train
 * --profile prints the difference over each step). Counts since the
 * process started, over every graph and thread; read before and after a
 * step and subtract. */
typedef struct weft_op_stats {
  /* op functions run: each forward op call (weft_op_*, the built-in
   * layers' ops) and each backward of a recorded op node */
  int64_t ops;
  /* bf16 / f16 tensors widened into an f32 copy so that an f32 kernel can
   * run an op on them (forward inputs, and a mixed node's grads, inputs,
   * outputs and saved buffers in backward); ops with a storage-dtype
   * kernel on the device widen nothing */
  int64_t widened;
  /* copies that shape ops make where a view would do: one per reshape
   * that no view can express, transpose of a parameter or the caller's
   * input, and each piece that split or cat moves, forward and backward
   * alike; one per input of the output's shape to which add's backward
   * hands a copy of the output grad; and one per strided value (a split
   * piece, a transpose) first handed to an op whose kernels read
   * contiguous tensors only, or reaching such an op's backward as its
   * output grad */
  int64_t copies;
  /* host allocations of >= 64 KiB that reached the system allocator
   * (weft_mem_stats.large_system_allocs of WEFT_CPU) */
  int64_t mallocs;
} weft_op_stats;
/* The counters now. Local, thread-safe, never fails. */
WEFT_API weft_op_stats weft_op_stats_get(void);

/* A var for a DTensor the caller owns (borrowed until reset). With
 * requires_grad its grad is kept after backward (weft_var_grad). */
WEFT_API weft_status weft_graph_input(weft_graph *g, const weft_dtensor *t, bool requires_grad,
                                      weft_var **out);
/* The var of a parameter: its current data (must be materialised); the
 * grad goes to p->grad (when p->requires_grad). One var per parameter and
 * graph position: calling it twice gives two vars whose grads both reach
 * p->grad. NULL on error (the error is set: weft_last_error). */
WEFT_API weft_var *weft_graph_param(weft_graph *g, weft_param *p);

/* The var's value and (after backward) grad; the grad is NULL when none
 * reached it. Owned by the graph. The local tensor of either may be a
 * strided view (split's pieces, transposes, reshapes of them): read it
 * through its strides, or take a contiguous copy (weft_dtensor_to_local). */
WEFT_API const weft_dtensor *weft_var_value(const weft_var *v);
WEFT_API const weft_dtensor *weft_var_grad(const weft_var *v);
WEFT_API weft_graph *weft_var_graph(const weft_var *v);
WEFT_API bool weft_var_requires_grad(const weft_var *v);
/* The value of a one-element var as a double (reduces a Partial value:
 * collective then). NAN on error. */
WEFT_API double weft_var_item(const weft_var *v);

/* Backward from a one-element var (loss): d loss = 1. Runs every node of
 * the graph in reverse and accumulates parameter grads. An intermediate
 * var's grad lives only until the node that made the var has run
 * backward: its buffer then goes back to the graph's pool for the grads of
 * the nodes still to run (values stay readable until reset). Once per forward:
 * a second call before reset is WEFT_ERR_STATE. Collective. */
WEFT_API weft_status weft_backward(weft_var *loss);
/* Backward from `out` with an explicit grad (same global shape, any
 * placements; borrowed). */
WEFT_API weft_status weft_backward_grad(weft_var *out, const weft_dtensor *grad);

/* -------------------------------------------------------------------- ops
 * Shapes are global; "(..., C)" means any number of leading dims. Each
 * returns the new var in *out (or outs).
 *
 * dtypes: float inputs are f32, bf16 or f16 (ids and targets int32). A
 * 16-bit input computes as PyTorch's ops do for it: widened to f32 (exact),
 * computed with f32 accumulation, the output rounded once to the result
 * dtype: the 16-bit dtype when every float input has it, f32 when any is
 * f32 (add, mul, swiglu promote); linear, matmul, sdpa and the norms take
 * their operands in one dtype (a mix is WEFT_ERR_INVALID, as in PyTorch),
 * and bf16 with f16 in one op is WEFT_ERR_UNSUPPORTED. What the graph keeps
 * for backward stays 16-bit (half the activation memory of f32; the f32
 * copies live only while an op runs). Where the device's kernel computes
 * in the 16-bit dtype itself (backend.h weft_kernel_op: every op here but
 * mean on the CPU and CUDA backends), an op whose float inputs all have
 * that dtype makes no f32 copy at all, with the result of the widened path
 * (bitwise, but for a GEMM whose products a backend blocks or orders
 * differently, and a biased linear on CUDA, which adds the bias before it
 * rounds the product instead of after). A 16-bit var's grad is 16-bit, and a
 * 16-bit parameter's grad accumulates in f32 (nn.h) from bf16-rounded
 * contributions. Row statistics an op keeps (norms' rstd, attention's and
 * cross-entropy's log-sum-exp) and dropout's uniforms stay f32. The
 * cross-entropy of bf16 logits is a bf16 loss, as PyTorch's. */

/* x converted to dtype (f32, f64, bf16, f16; rounding to nearest even):
 * tensor.to(dtype). Keeps placements; the grad is converted back to x's
 * dtype. x itself (no copy, no node) when it already has that dtype. */
WEFT_API weft_status weft_op_to(weft_var *x, weft_dtype dtype, weft_var **out);

/* y = x w^T (+ b): torch.nn.functional.linear. x (..., K), w (N, K), b (N)
 * or NULL. Per mesh dim (x, w -> y): R,R -> R; S(r),R -> S(r) for a
 * leading dim r; R,S(0) -> S(last) (colwise); S(last),S(1) -> P(sum)
 * (rowwise); P,R -> P; R,StridedShard(0,k) -> StridedShard(last,k)
 * (fused q|k|v split per rank). The bias is added as weft_op_add does: on
 * a P(sum) output it is added once (Replicate -> Partial puts it on one
 * rank). A strided x whose rows one stride steps through (a split piece)
 * or a transposed 2-D view is read in place by the GEMM, forward and
 * backward; another strided x is copied once. */
WEFT_API weft_status weft_op_linear(weft_var *x, weft_var *w, weft_var *b, weft_var **out);
/* a @ b: a (..., M, K), b (K, N); the rules of weft_dtensor_matmul. A
 * transposed view (weft_op_transpose of an op's output, as b = w^T) is
 * read in place through the GEMM's transpose flag, forward and backward;
 * another strided operand whose rows no single stride steps through is
 * copied once. */
WEFT_API weft_status weft_op_matmul(weft_var *a, weft_var *b, weft_var **out);
/* a + b where b's shape equals a's or a suffix of it (broadcast over a's
 * leading dims: a bias, a position embedding). Shards must agree on the
 * dims they share; P(sum)+P(sum) -> P(sum), a Replicate side of a partial
 * sum is partitioned (no communication). */
WEFT_API weft_status weft_op_add(weft_var *a, weft_var *b, weft_var **out);
/* a * b, same shapes; matching placements or P(sum) * R -> P(sum). */
WEFT_API weft_status weft_op_mul(weft_var *a, weft_var *b, weft_var **out);
/* alpha * x (keeps placements). */
WEFT_API weft_status weft_op_scale(weft_var *x, double alpha, weft_var **out);
/* A view with a new shape (same element count; one dim may be -1). A
 * sharded dim must map to the first dim of the dims it splits into (or
 * merge from a group whose first dim is sharded, evenly): (B,T,D) S(2)
 * -> (B,T,H,hd) S(2). Otherwise the input is replicated first. */
WEFT_API weft_status weft_op_reshape(weft_var *x, int ndim, const int64_t *shape, weft_var **out);
/* Swaps dims d0 and d1 (shards follow their dims). torch's transpose: a
 * view of an op's output (its storage with the two strides swapped), a
 * copy of the caller's input or a parameter. The grad is a view too.
 * matmul reads a transposed 2-D view without a copy; ops without strided
 * kernels copy it once. */
WEFT_API weft_status weft_op_transpose(weft_var *x, int d0, int d1, weft_var **out);
/* Splits dim into n pieces of sizes[i] (sum = the dim's size). A dim
 * StridedShard(dim, n) with equal sizes splits locally (each piece comes
 * out Shard(dim)); other shards of `dim` are replicated first. The pieces
 * of an op's output are views (torch's split): slices of its storage with
 * its strides, which sdpa reads in place (the fused q|k|v projection) and
 * other ops copy once; pieces of the caller's input or a parameter are
 * copies. */
WEFT_API weft_status weft_op_split(weft_var *x, int dim, int n, const int64_t *sizes,
                                   weft_var **outs);
/* Concatenates along dim (inputs equal elsewhere; `dim` replicated). */
WEFT_API weft_status weft_op_cat(weft_var *const *xs, int n, int dim, weft_var **out);
/* Sum / mean over dim (keepdim): a shard of dim becomes P(sum). */
WEFT_API weft_status weft_op_sum(weft_var *x, int dim, bool keepdim, weft_var **out);
WEFT_API weft_status weft_op_mean(weft_var *x, int dim, bool keepdim, weft_var **out);

/* Embedding lookup: ids (...) int32 Replicate input var (no grad), w (V,
 * D) -> (..., D). w R -> R; w S(0) -> P(sum) (vocab ranges); w S(1) ->
 * S(last). Ids out of [0, V) are WEFT_ERR_INVALID naming index and value. */
WEFT_API weft_status weft_op_embedding(weft_var *ids, weft_var *w, weft_var **out);
/* RMSNorm / LayerNorm over the last dim (weight, bias (N) or NULL): the
 * last dim must be whole; other dims may be sharded (sequence parallel:
 * the weight grad is P(sum) there and reduced at the parameter). */
WEFT_API weft_status weft_op_rms_norm(weft_var *x, weft_var *w, float eps, weft_var **out);
WEFT_API weft_status weft_op_layer_norm(weft_var *x, weft_var *w, weft_var *b, float eps,
                                        weft_var **out);
/* Pointwise (placements kept; P(sum) inputs are reduced first). */
WEFT_API weft_status weft_op_gelu(weft_var *x, bool tanh_approximate, weft_var **out);
WEFT_API weft_status weft_op_silu(weft_var *x, weft_var **out);
WEFT_API weft_status weft_op_relu(weft_var *x, weft_var **out);
/* silu(a) * b (Llama's gate): a and b the same shapes and placements. */
WEFT_API weft_status weft_op_swiglu(weft_var *a, weft_var *b, weft_var **out);
/* softmax over the last dim (must be whole). */
WEFT_API weft_status weft_op_softmax(weft_var *x, weft_var **out);
/* Rotary embedding of x (B, T, NH, hd) at positions pos0 + t, theta: the
 * interleaved-pair form of the backend's rope members. T whole, heads may
 * be sharded. */
WEFT_API weft_status weft_op_rope(weft_var *x, double theta, int64_t pos0, weft_var **out);
/* Scaled dot-product attention (fused, flash style: saves the row
 * log-sum-exp, recomputes probabilities in backward): torch's
 * scaled_dot_product_attention(q, k, v, is_causal=causal) with scale
 * 1/sqrt(hd) and no dropout. q (B, T, H, hd), k and v (B, T, Hkv, hd),
 * H % Hkv == 0 (grouped-query: query head h reads kv head h / (H/Hkv)).
 * causal: query t attends to keys 0..t; false: to all T keys (an encoder,
 * a bidirectional block). Per mesh dim q, k, v all R, all S(0) (batch) or
 * all S(2) (heads, when the mesh dim's size divides Hkv: each rank holds
 * whole kv groups) -> the output alike; other placements (a sequence
 * shard, P(sum)) are redistributed first. q, k, v may be split's pieces
 * of one projection, reshaped to heads: read in place where the device
 * takes strided rows (weft_backend_attention_takes_rows), and their grads
 * written into one buffer that split's backward hands on whole. */
WEFT_API weft_status weft_op_sdpa(weft_var *q, weft_var *k, weft_var *v, bool causal,
                                  weft_var **out);
/* Mean cross-entropy of logits (..., V) against targets (...) int32 (a
 * DTensor, Replicate), ignoring positions whose target equals
 * ignore_index (torch's default -100): loss = sum over kept positions /
 * their count. Logits Replicate, row-sharded (the sum is all-reduced) or
 * vocab-sharded S(last) (loss parallel: no rank gathers the vocab).
 * Output: a one-element Replicate var. */
WEFT_API weft_status weft_op_cross_entropy(weft_var *logits, const weft_dtensor *targets,
                                           int32_t ignore_index, weft_var **out);
/* How weft_op_cross_entropy_ex reduces the per-position losses of the kept
 * positions. */
typedef enum weft_reduction {
  WEFT_REDUCTION_MEAN = 0, /* sum / their count (torch's 'mean'; nan when none is kept) */
  WEFT_REDUCTION_SUM,      /* the sum (torch's 'sum'; 0 when none is kept) */
  /* The mean over a data-parallel global batch whose other rows live on the
   * other ranks of batch_mesh (each rank its own rows, e.g. FSDP's dp
   * mesh): loss = this rank's sum x R / C, where C is the kept positions
   * over all of batch_mesh's ranks (one all-reduce of two integers over
   * it: collective) and R its number of ranks. The mean of the loss over
   * batch_mesh's ranks, which is what data-parallel gradient averaging
   * (FSDP, HSDP, DDP) and a loss averaged over the ranks compute, is then
   * the global batch's mean, however the ignored positions fall on the
   * ranks: the one-rank loss and gradients. */
  WEFT_REDUCTION_MEAN_GLOBAL,
} weft_reduction;
typedef struct weft_cross_entropy_opts {
  int32_t ignore_index;     /* -100 */
  weft_reduction reduction; /* WEFT_REDUCTION_MEAN */
  weft_mesh *batch_mesh;    /* WEFT_REDUCTION_MEAN_GLOBAL: the data-parallel mesh (borrowed) */
} weft_cross_entropy_opts;
#define WEFT_CROSS_ENTROPY_OPTS_INIT ((weft_cross_entropy_opts){-100, WEFT_REDUCTION_MEAN, NULL})
/* weft_op_cross_entropy with a reduction (opts NULL: the defaults above,
 * which is weft_op_cross_entropy(..., -100, ...)). With
 * WEFT_REDUCTION_MEAN_GLOBAL every rank of batch_mesh must call it in the
 * same step; a target outside [0, V) on any of them is an error on all of
 * them (the rank that has it names it), not a hang. */
WEFT_API weft_status weft_op_cross_entropy_ex(weft_var *logits, const weft_dtensor *targets,
                                              const weft_cross_entropy_opts *opts, weft_var **out);
/* Inverted dropout with probability p in [0, 1): the mask of element e is
 * uniform(seed, key(step, op index in the graph), global index of e) >= p,
 * so it is the same on any mesh and placements. Identity when p == 0 or
 * the graph is not training. */
WEFT_API weft_status weft_op_dropout(weft_var *x, float p, weft_var **out);

#define WEFT_OP_MAX_INPUTS 4

/* ------------------------------------------------------ modules in graphs */

/* A module kind of one's own (nn.Module subclass): its forward written
 * with ops on vars. forward gets the module, the ctx given at creation,
 * nin inputs and must set nout outputs (the counts the caller of
 * weft_module_call passes). Parameters come from weft_module_param_var;
 * children run through weft_module_call (so their hooks fire). destroy
 * (may be NULL) frees ctx when the module is destroyed. */
typedef struct weft_module_def {
  const char *kind_name; /* "gpt2_block": for messages */
  weft_status (*forward)(weft_module *m, void *ctx, weft_var *const *in, int nin, weft_var **out,
                         int nout);
  void (*destroy)(void *ctx);
} weft_module_def;

/* A root module of kind WEFT_MODULE_CUSTOM on mesh (retained) running
 * def (copied); add parameters (weft_module_add_param), tied parameters
 * and children (weft_module_add_child) after. weft_module_forward on it is
 * WEFT_ERR_UNSUPPORTED (it runs in a graph). On failure ctx stays the
 * caller's (destroy is not called). Local. */
WEFT_API weft_status weft_module_create(weft_mesh *mesh, const char *name,
                                        const weft_module_def *def, void *ctx, weft_module **out);
/* The ctx of a module made by weft_module_create (NULL for other kinds). */
WEFT_API void *weft_module_ctx(const weft_module *m);
/* The def's kind_name, or the built-in kind's name. */
WEFT_API const char *weft_module_def_name(const weft_module *m);
/* The var of m's parameter `name` (own or tied) in graph g; NULL with the
 * error set when m has none or it has no storage. */
WEFT_API weft_var *weft_module_param_var(weft_module *m, weft_graph *g, const char *name);

/* Runs module m in graph order: pre-forward hooks (on in[0]), m's forward,
 * post-forward hooks (on out[0]); records the boundaries so that its
 * backward hooks fire. For a module made with weft_module_create the
 * forward is the user's; a built-in layer (nn.h) runs its own forward and
 * records its hand-written backward as one node (nin = nout = 1). */
WEFT_API weft_status weft_module_call(weft_module *m, weft_var *const *in, int nin, weft_var **out,
                                      int nout);
/* One input, one output. */
WEFT_API weft_status weft_module_call1(weft_module *m, weft_var *in, weft_var **out);

/* Activation checkpointing of module m (torch.utils.checkpoint around a
 * module; torchtitan's per-block AC): with on, weft_module_call(m) keeps
 * only m's inputs, its outputs and the dropout state at entry (op index,
 * step, training); the vars and nodes m's forward made are dropped right
 * after it (their buffers return to the graph's pool, so later ops reuse
 * them). In backward, once m's pre-backward hooks ran (FSDP has
 * all-gathered m's parameters), m's forward runs again on the same inputs
 * with the same op indices, its nodes run backward and are dropped again;
 * then m's post-backward hooks fire. Gradients and dropout masks are
 * bitwise those of the run without checkpointing. m's own forward hooks
 * do not fire in the recompute (as FSDP2's do nothing in pre-backward
 * state); its children's do (they run through weft_module_call again).
 * Checkpointed modules may nest. m's forward must be deterministic and
 * take every var it reads as an input or parameter (a var captured from
 * outside through ctx is not saved): a recompute whose outputs differ in
 * shape or placements is WEFT_ERR_STATE in backward. Only m's outputs
 * stay readable: vars made inside its forward are freed. No effect when
 * grad recording is off. Costs one more forward of m per backward.
 * Errors: m NULL (WEFT_ERR_INVALID), a module without a graph forward
 * (WEFT_ERR_UNSUPPORTED), m running (WEFT_ERR_STATE). Local (every rank
 * must set the same modules: the recompute runs m's collectives). */
WEFT_API weft_status weft_module_set_checkpoint(weft_module *m, bool on);
/* Whether m is checkpointed (false for NULL). */
WEFT_API bool weft_module_checkpoint(const weft_module *m);

/* ------------------------------------------------------- user-defined ops
 * An op of one's own (torch.autograd.Function plus a DTensor sharding
 * strategy, torch.distributed.tensor.experimental.register_sharding): a
 * forward and a backward on local tensors and a sharding rule. The op
 * then works on DTensors on any mesh, inside graphs, with autograd, like
 * the built-in ops:
 *
 *     // y = log(1 + exp(x)) (softplus): elementwise, not linear
 *     static weft_status sp_fwd(const weft_dtensor *const *in, int nin,
 *                               weft_dtensor *const *out, int nout, void *ctx) {
 *       const weft_tensor *x = weft_dtensor_local(in[0]);     // this rank's shard
 *       weft_tensor *y = weft_dtensor_local(out[0]);          // same local shape
 *       ... y[i] = log1p(exp(x[i])) over weft_tensor_numel(x) floats ...
 *     }
 *     static weft_status sp_bwd(const weft_dtensor *const *in, int nin,
 *                               const weft_dtensor *const *out,
 *                               const weft_dtensor *const *grad_out, int nout,
 *                               weft_dtensor *const *grad_in, void *ctx) {
 *       ... grad_in[0][i] = grad_out[0][i] * sigmoid(in[0][i]) (locals) ...
 *     }
 *     static const weft_op_def softplus = {
 *         .name = "softplus", .nin = 1, .nout = 1, .rule = weft_op_rule_pointwise,
 *         .forward = sp_fwd, .backward = sp_bwd, .keep_input = {true}};
 *     weft_op_custom(&softplus, NULL, &x, 1, &y);
 *
 * What happens in weft_op_custom, per call:
 *   1. the input count must be def->nin; the output specs (global shape,
 *      dtype) come from def->infer (NULL: each output is like input 0),
 *      which also rejects bad input shapes;
 *   2. the rule lists, per mesh dim, the options {in[0..nin), out}
 *      (weft_sharding_option, dtensor.h: the placement each input must
 *      have on that mesh dim and the one all outputs get); the op picks
 *      the combination the inputs already satisfy or else the one whose
 *      redistribution moves the fewest bytes (weft_sharding_choose; ties
 *      to the option listed first) and redistributes the inputs. An input
 *      reaches a Partial option only when it already has that Partial (no
 *      Replicate -> Partial partitioning);
 *   3. forward runs on every rank with the inputs as redistributed and
 *      the outputs allocated (graph buffers, contents undefined) with the
 *      chosen placements: it reads weft_dtensor_local(in[i]) and writes
 *      weft_dtensor_local(out[j]), whose local shapes follow from the
 *      global shapes and placements. Where the math needs positions, the
 *      DTensors give the global shape (weft_dtensor_shape) and this rank's
 *      global offset (weft_dtensor_local_offset; a StridedShard piece is
 *      not one box: weft_dtensor_ranges, or list no strided options);
 *   4. when an input requires grad (and def->backward is set) a node is
 *      recorded; its backward runs on the local tensors of: the inputs
 *      as forward used them where keep_input[i] (else NULL), the outputs
 *      where keep_output[j] (else NULL), the output grads grad_out[j]
 *      (zeros where no grad reached output j), and grad_in[i], zero-filled
 *      buffers of input i's global shape, to be written (or added into)
 *      with the local grad, NULL where input i needs no grad.
 *
 * Grad placements, per mesh dim, from the chosen option (input placement
 * I, output placement O) and the output grad's (the output's, or R where O
 * is P; P(sum) where O is R is passed on only when every input is R there,
 * else it is all-reduced first), the rules of the built-in ops:
 *   I = Shard / StridedShard   -> grad_in like I (each rank the grad of
 *                                 its own piece)
 *   I = R, O = R, grad_out R   -> grad_in R (every rank the same)
 *   I = R otherwise            -> grad_in P(sum) (each rank a share:
 *                                 O sharded or partial, grad_out partial)
 *   I = P (a linear op)        -> grad_in R
 * So a rule must be honest: an option {I...} -> O must hold for the local
 * forward (each rank's outputs computed from its pieces alone, with no
 * communication), and an option with a Partial input must be linear in it
 * and have a Partial output (checked: a Partial input with a non-Partial
 * output is WEFT_ERR_INVALID).
 *
 * Errors (every rank alike, before any communication, naming the op and
 * its inputs' shapes and placements): a NULL def, name, forward, or input,
 * a def with nin outside 1..WEFT_OP_MAX_INPUTS or nout outside
 * 1..WEFT_OP_CUSTOM_MAX_OUTPUTS, an input count other than def->nin,
 * a rule that lists no option (or more than WEFT_OP_RULE_CAP) for a mesh
 * dim or an option naming a dim an input or output does not have
 * (WEFT_ERR_INVALID); a rule none of whose combinations the inputs can
 * reach (WEFT_ERR_UNSUPPORTED, "no sharding strategy applies"); an error
 * from infer; an output of a non-float dtype. An error forward or backward
 * returns is passed on with the op's name in front ("<name>: forward:
 * <the callback's message>"); forward, backward and infer must decide
 * alike on every rank (a failure on one rank only leaves the others'
 * collectives unmatched). They must not communicate. */

#define WEFT_OP_CUSTOM_MAX_OUTPUTS 4
/* The most options a rule may list for one mesh dim. */
#define WEFT_OP_RULE_CAP 16

/* A sharding rule: writes the options of mesh dim `mesh_dim` for inputs
 * of global specs in[0..nin) into opts[0..cap) and returns how many (>= 1;
 * 0 or less: none, an error). Called on every rank with the same specs; a
 * pure function of them. */
typedef int (*weft_op_rule_fn)(const weft_dtensor_spec *const *in, int nin, int mesh_dim,
                               weft_sharding_option *opts, int cap, void *ctx);

/* An output's global shape and dtype (what infer fills). */
typedef struct weft_op_out_spec {
  weft_dtype dtype;
  int ndim;
  int64_t shape[WEFT_MAX_DIMS];
} weft_op_out_spec;

typedef struct weft_op_def {
  const char *name; /* in every message about the op */
  int nin;          /* inputs, 1..WEFT_OP_MAX_INPUTS */
  int nout;         /* outputs, 1..WEFT_OP_CUSTOM_MAX_OUTPUTS */
  /* The rule: rule() when set, else the same `options` (noptions of them)
   * on every mesh dim. */
  weft_op_rule_fn rule;
  const weft_sharding_option *options;
  int noptions;
  /* (optional) The outputs' global specs from the inputs' global specs;
   * returns an error (weft_error) for inputs the op does not take. NULL:
   * every output has input 0's shape and dtype. */
  weft_status (*infer)(const weft_dtensor_spec *const *in, int nin, weft_op_out_spec *out, int nout,
                       void *ctx);
  /* The forward on this rank's pieces (see above). Required. */
  weft_status (*forward)(const weft_dtensor *const *in, int nin, weft_dtensor *const *out, int nout,
                         void *ctx);
  /* The backward (see above); NULL: the op is not differentiable, its
   * outputs require no grad (no node is recorded). */
  weft_status (*backward)(const weft_dtensor *const *in, int nin, const weft_dtensor *const *out,
                          const weft_dtensor *const *grad_out, int nout,
                          weft_dtensor *const *grad_in, void *ctx);
  /* What the backward reads: inputs (as forward used them) and outputs. */
  bool keep_input[WEFT_OP_MAX_INPUTS];
  bool keep_output[WEFT_OP_CUSTOM_MAX_OUTPUTS];
} weft_op_def;

/* Runs the op of def on vars in[0..nin) of one graph and sets out[0..
 * def->nout) (see above). def and ctx are borrowed: they must stay valid
 * until the graph ran backward or was reset (the node reads them then);
 * ctx is passed to every callback as is. Collective (the redistributions,
 * every rank of the mesh calls it alike). */
WEFT_API weft_status weft_op_custom(const weft_op_def *def, void *ctx, weft_var *const *in, int nin,
                                    weft_var **out);

/* Ready-made rules (weft_op_rule_fn). Pointwise: the inputs have one
 * shape and the op works elementwise; every mesh dim lists all R -> R,
 * all S(d) -> S(d) for every dim d of input 0, and input 0's own
 * StridedShard of that mesh dim (all inputs alike). A Partial input is
 * reduced first (the op is not linear). */
WEFT_API int weft_op_rule_pointwise(const weft_dtensor_spec *const *in, int nin, int mesh_dim,
                                    weft_sharding_option *opts, int cap, void *ctx);
/* Pointwise and linear in all inputs jointly (f(a + b) = f(a) + f(b): a
 * scale, a difference): also all P(sum) -> P(sum). */
WEFT_API int weft_op_rule_pointwise_linear(const weft_dtensor_spec *const *in, int nin,
                                           int mesh_dim, weft_sharding_option *opts, int cap,
                                           void *ctx);

#ifdef __cplusplus
}
#endif
#endif /* WEFT_AUTOGRAD_H */
