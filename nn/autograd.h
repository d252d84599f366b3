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
#include "layers.h"
#include "nn.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- graphs */

typedef struct weft_graph weft_graph;
typedef struct weft_var weft_var;

/* An empty graph: training mode (dropout active), seed 0, step 0. Local. */
weft_status weft_graph_create(weft_graph **out);
/* Frees the graph, its vars and pooled buffers. NULL: no-op. Local. */
void weft_graph_destroy(weft_graph *g);
/* Drops the vars and nodes of the last forward/backward (their buffers
 * return to the pool) and advances the step counter (dropout masks differ
 * per step). Local. */
weft_status weft_graph_reset(weft_graph *g);
/* Training mode: dropout active (true, the default) or identity. */
void weft_graph_set_training(weft_graph *g, bool training);
/* The RNG seed of dropout masks and the step they are keyed by (reset
 * increments the step; set it when resuming). */
void weft_graph_set_seed(weft_graph *g, uint64_t seed);
void weft_graph_set_step(weft_graph *g, int64_t step);
int64_t weft_graph_step(const weft_graph *g);
/* Data parallel: this rank's batch is rows [row0, row0 + B) of a global
 * batch of total_rows rows (its dp group's slice). Random ops (dropout)
 * then take dim 0 of their input as the batch dim and key each element by
 * its row in the global batch, so a run on any dp x tp mesh draws the masks
 * one rank with the whole batch draws. total_rows 0 (the default): the
 * graph's tensors are the whole batch. WEFT_ERR_INVALID for a row0 outside
 * [0, total_rows); a dropout input whose dim 0 does not fit is an error of
 * that op. Local. */
weft_status weft_graph_set_batch_slice(weft_graph *g, int64_t row0, int64_t total_rows);
/* Grad recording on (default) or off (inference: ops record nothing). */
void weft_graph_set_grad_enabled(weft_graph *g, bool enabled);

/* A var for a DTensor the caller owns (borrowed until reset). With
 * requires_grad its grad is kept after backward (weft_var_grad). */
weft_status weft_graph_input(weft_graph *g, const weft_dtensor *t, bool requires_grad,
                             weft_var **out);
/* The var of a parameter: its current data (must be materialised); the
 * grad goes to p->grad (when p->requires_grad). One var per parameter and
 * graph position: calling it twice gives two vars whose grads both reach
 * p->grad. NULL on error (the error is set: weft_last_error). */
weft_var *weft_graph_param(weft_graph *g, weft_param *p);

/* The var's value and (after backward) grad; the grad is NULL when none
 * reached it. Owned by the graph. */
const weft_dtensor *weft_var_value(const weft_var *v);
const weft_dtensor *weft_var_grad(const weft_var *v);
weft_graph *weft_var_graph(const weft_var *v);
bool weft_var_requires_grad(const weft_var *v);
/* The value of a one-element var as a double (reduces a Partial value:
 * collective then). NAN on error. */
double weft_var_item(const weft_var *v);

/* Backward from a one-element var (loss): d loss = 1. Runs every node of
 * the graph in reverse and accumulates parameter grads. Once per forward:
 * a second call before reset is WEFT_ERR_STATE. Collective. */
weft_status weft_backward(weft_var *loss);
/* Backward from `out` with an explicit grad (same global shape, any
 * placements; borrowed). */
weft_status weft_backward_grad(weft_var *out, const weft_dtensor *grad);

/* -------------------------------------------------------------------- ops
 * Shapes are global; "(..., C)" means any number of leading dims. All
 * float ops are f32. Each returns the new var in *out (or outs). */

/* y = x w^T (+ b): torch.nn.functional.linear. x (..., K), w (N, K), b (N)
 * or NULL. Per mesh dim (x, w -> y): R,R -> R; S(r),R -> S(r) for a
 * leading dim r; R,S(0) -> S(last) (colwise); S(last),S(1) -> P(sum)
 * (rowwise); P,R -> P; R,StridedShard(0,k) -> StridedShard(last,k)
 * (fused q|k|v split per rank). The bias is added as weft_op_add does: on
 * a P(sum) output it is added once (Replicate -> Partial puts it on one
 * rank). */
weft_status weft_op_linear(weft_var *x, weft_var *w, weft_var *b, weft_var **out);
/* a @ b: a (..., M, K), b (K, N); the rules of weft_dtensor_matmul. */
weft_status weft_op_matmul(weft_var *a, weft_var *b, weft_var **out);
/* a + b where b's shape equals a's or a suffix of it (broadcast over a's
 * leading dims: a bias, a position embedding). Shards must agree on the
 * dims they share; P(sum)+P(sum) -> P(sum), a Replicate side of a partial
 * sum is partitioned (no communication). */
weft_status weft_op_add(weft_var *a, weft_var *b, weft_var **out);
/* a * b, same shapes; matching placements or P(sum) * R -> P(sum). */
weft_status weft_op_mul(weft_var *a, weft_var *b, weft_var **out);
/* alpha * x (keeps placements). */
weft_status weft_op_scale(weft_var *x, double alpha, weft_var **out);
/* A view with a new shape (same element count; one dim may be -1). A
 * sharded dim must map to the first dim of the dims it splits into (or
 * merge from a group whose first dim is sharded, evenly): (B,T,D) S(2)
 * -> (B,T,H,hd) S(2). Otherwise the input is replicated first. */
weft_status weft_op_reshape(weft_var *x, int ndim, const int64_t *shape, weft_var **out);
/* Swaps dims d0 and d1 (shards follow their dims). */
weft_status weft_op_transpose(weft_var *x, int d0, int d1, weft_var **out);
/* Splits dim into n pieces of sizes[i] (sum = the dim's size). A dim
 * StridedShard(dim, n) with equal sizes splits locally (each piece comes
 * out Shard(dim)); other shards of `dim` are replicated first. */
weft_status weft_op_split(weft_var *x, int dim, int n, const int64_t *sizes, weft_var **outs);
/* Concatenates along dim (inputs equal elsewhere; `dim` replicated). */
weft_status weft_op_cat(weft_var *const *xs, int n, int dim, weft_var **out);
/* Sum / mean over dim (keepdim): a shard of dim becomes P(sum). */
weft_status weft_op_sum(weft_var *x, int dim, bool keepdim, weft_var **out);
weft_status weft_op_mean(weft_var *x, int dim, bool keepdim, weft_var **out);

/* Embedding lookup: ids (...) int32 Replicate input var (no grad), w (V,
 * D) -> (..., D). w R -> R; w S(0) -> P(sum) (vocab ranges); w S(1) ->
 * S(last). Ids out of [0, V) are WEFT_ERR_INVALID naming index and value. */
weft_status weft_op_embedding(weft_var *ids, weft_var *w, weft_var **out);
/* RMSNorm / LayerNorm over the last dim (weight, bias (N) or NULL): the
 * last dim must be whole; other dims may be sharded (sequence parallel:
 * the weight grad is P(sum) there and reduced at the parameter). */
weft_status weft_op_rms_norm(weft_var *x, weft_var *w, float eps, weft_var **out);
weft_status weft_op_layer_norm(weft_var *x, weft_var *w, weft_var *b, float eps,
                               weft_var **out);
/* Pointwise (placements kept; P(sum) inputs are reduced first). */
weft_status weft_op_gelu(weft_var *x, bool tanh_approximate, weft_var **out);
weft_status weft_op_silu(weft_var *x, weft_var **out);
weft_status weft_op_relu(weft_var *x, weft_var **out);
/* silu(a) * b (Llama's gate): a and b the same shapes and placements. */
weft_status weft_op_swiglu(weft_var *a, weft_var *b, weft_var **out);
/* softmax over the last dim (must be whole). */
weft_status weft_op_softmax(weft_var *x, weft_var **out);
/* Rotary embedding of x (B, T, NH, hd) at positions pos0 + t, theta: the
 * interleaved-pair form of layers.h. T whole, heads may be sharded. */
weft_status weft_op_rope(weft_var *x, double theta, int64_t pos0, weft_var **out);
/* Scaled dot-product attention (fused, flash style: saves the row
 * log-sum-exp, recomputes probabilities in backward). q (B, T, H, hd),
 * k and v (B, T, Hkv, hd), H % Hkv == 0 (grouped-query); causal only (a
 * non-causal call is WEFT_ERR_UNSUPPORTED for now). Heads may be sharded
 * (S(2) on q, k and v alike, each rank holding whole kv groups). */
weft_status weft_op_sdpa(weft_var *q, weft_var *k, weft_var *v, bool causal, weft_var **out);
/* Mean cross-entropy of logits (..., V) against targets (...) int32 (a
 * DTensor, Replicate), ignoring positions whose target equals
 * ignore_index (torch's default -100): loss = sum over kept positions /
 * their count. Logits Replicate, row-sharded (the sum is all-reduced) or
 * vocab-sharded S(last) (loss parallel: no rank gathers the vocab).
 * Output: a one-element Replicate var. */
weft_status weft_op_cross_entropy(weft_var *logits, const weft_dtensor *targets,
                                  int32_t ignore_index, weft_var **out);
/* Inverted dropout with probability p in [0, 1): the mask of element e is
 * uniform(seed, key(step, op index in the graph), global index of e) >= p,
 * so it is the same on any mesh and placements. Identity when p == 0 or
 * the graph is not training. */
weft_status weft_op_dropout(weft_var *x, float p, weft_var **out);

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
  weft_status (*forward)(weft_module *m, void *ctx, weft_var *const *in, int nin,
                         weft_var **out, int nout);
  void (*destroy)(void *ctx);
} weft_module_def;

/* A root module of kind WEFT_MODULE_CUSTOM on mesh (retained) running
 * def (copied); add parameters (weft_module_add_param), tied parameters
 * and children (weft_module_add_child) after. weft_module_forward on it is
 * WEFT_ERR_UNSUPPORTED (it runs in a graph). On failure ctx stays the
 * caller's (destroy is not called). Local. */
weft_status weft_module_create(weft_mesh *mesh, const char *name, const weft_module_def *def,
                               void *ctx, weft_module **out);
/* The ctx of a module made by weft_module_create (NULL for other kinds). */
void *weft_module_ctx(const weft_module *m);
/* The def's kind_name, or the built-in kind's name. */
const char *weft_module_def_name(const weft_module *m);
/* The var of m's parameter `name` (own or tied) in graph g; NULL with the
 * error set when m has none or it has no storage. */
weft_var *weft_module_param_var(weft_module *m, weft_graph *g, const char *name);

/* Runs module m in graph order: pre-forward hooks (on in[0]), m's forward,
 * post-forward hooks (on out[0]); records the boundaries so that its
 * backward hooks fire. For a module made with weft_module_create the
 * forward is the user's; a built-in layer (nn.h) runs its own forward and
 * records its hand-written backward as one node (nin = nout = 1). */
weft_status weft_module_call(weft_module *m, weft_var *const *in, int nin, weft_var **out,
                             int nout);
/* One input, one output. */
weft_status weft_module_call1(weft_module *m, weft_var *in, weft_var **out);

#ifdef __cplusplus
}
#endif
#endif /* WEFT_AUTOGRAD_H */
