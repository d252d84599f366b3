/* weft/nn.h — modules with qualified names, parameters (DTensors) and their
 * gradients, forward/backward through hooks, the layers of the Llama-style
 * reference model, the model itself with its loss, optimizers (AdamW, SGD),
 * a learning-rate schedule and gradient clipping.
 *
 * A tour (SPMD: every rank of the model mesh runs this):
 *
 *     weft_llama_config cfg = WEFT_LLAMA_CONFIG_INIT;
 *     cfg.dim = 256; cfg.n_layers = 4; cfg.n_heads = 8; cfg.n_kv_heads = 8;
 *     cfg.ffn_dim = 688; cfg.vocab = 256; cfg.max_seq_len = 256;
 *     weft_module *model;
 *     weft_llama_create(&cfg, mesh, &model);        // parameters: shapes only
 *     // ... tp/ may change placements here (weft_param_set_placements) ...
 *     weft_module_init_weights(model, 1234);        // storage + RNG init by FQN
 *     weft_optimizer *opt;
 *     weft_adamw_create(model, &hp, &opt);
 *     for (step...) {
 *       double loss, norm;
 *       weft_llama_forward(model, tokens, targets, &loss);   // tokens (B, T) int32
 *       weft_llama_backward(model);                          // grads accumulate
 *       weft_clip_grad_norm(model, 1.0, &norm);
 *       weft_optimizer_step(opt);
 *       weft_module_zero_grad(model, false);
 *     }
 *     weft_optimizer_destroy(opt);
 *     weft_module_destroy(model);
 *
 * ---------------------------------------------------------------- modules
 * A module is a node of a tree. It has a local name ("wq", "3"), a fully
 * qualified name (FQN) made of the names from the root down
 * ("layers.3.attention.wq"; the root's FQN is ""), a kind, children, and
 * parameters (FQN "<module fqn>.weight"). Names follow torchtitan's Llama,
 * so FQNs are the keys of a PyTorch state dict of the same model.
 *
 * A module computes on DTensors over its *model mesh* — the tensor-parallel
 * mesh, or a 1-rank mesh (a 1-D mesh of size 1) without TP. Data
 * parallelism is not visible here: each dp rank runs its own micro-batch,
 * and FSDP swaps parameters and reduces gradients through hooks. Batch and
 * sequence dims of activations are (B, T, ...).
 *
 * The only way to run a module is weft_module_forward/_backward, which run
 * its hooks around the layer's own computation (the layer's raw forward and
 * backward are private), so a hook cannot be bypassed:
 *
 *     forward:  pre-forward hooks (may replace the input)
 *               -> the module's computation (children run through
 *                  weft_module_forward, so their hooks fire, nested)
 *               -> post-forward hooks (may replace the output)
 *     backward: pre-backward hooks (may replace the incoming output grad)
 *               -> the module's backward (children in reverse order)
 *               -> post-backward hooks (may replace the input grad; the
 *                  module's parameter grads are final for this backward)
 *
 * Hooks of one kind run in registration order, each seeing the previous
 * one's replacement.
 *
 * ---------------------------------------------------------- layer rules
 * Each layer computes on local shards and derives its output placements
 * from its input and weight placements, per mesh dim, with the rules of
 * dtensor's linear propagation (weft_dtensor_linear). In backward the same
 * local math gives the input grad and the weight grad with derived
 * placements; a weight grad that comes out Partial(sum) where the weight is
 * Replicate (rows of the input sharded, or an output grad that is Partial)
 * is all-reduced over that mesh dim before it is accumulated, so grads
 * always have their parameter's placements. Supported combinations, per
 * mesh dim (r is any dim but the last; "last" is the feature dim):
 *
 *   linear (x (..., in), weight (out, in) -> y (..., out))
 *     x R,       w R     -> y R          dx R (or P if dy is P), dW R (or P -> all-reduce)
 *     x S(r),    w R     -> y S(r)       sequence parallel: dx S(r), dW P -> all-reduce
 *     x P(sum),  w R     -> y P(sum)     dx R, dW P -> all-reduce
 *     x R,       w S(0)  -> y S(last)    colwise: dx P(sum), dW S(0)
 *     x S(last), w S(1)  -> y P(sum)     rowwise: dx S(last), dW S(1)
 *   embedding (tokens (B, T) int32 R, weight (V, D) -> y (B, T, D))
 *     w R    -> y R          dW R (P -> all-reduce if dy is P)
 *     w S(0) -> y P(sum)     rowwise (vocab-range lookup: other rows give 0)
 *     w S(1) -> y S(last)    colwise
 *   rmsnorm (x (..., D), weight (D))
 *     x R,    w R -> y R     dx like dy (R or P), dW R (P -> all-reduce)
 *     x S(r), w R -> y S(r)  sequence parallel: dW P -> all-reduce
 *   attention (x (B, T, D); wq wk wv wo are linears with the rules above)
 *     q = wq(x), k = wk(x), v = wv(x) must each be R, or all S(last) on
 *     the same mesh dims (heads split: local heads = local features / head
 *     dim; a shard that splits a head, or a kv head whose query heads are
 *     not all local, is WEFT_ERR_UNSUPPORTED). The attention output has q's
 *     placements and feeds wo. The sequence must be whole (R on T).
 *   feed_forward: w2(silu(w1(x)) * w3(x)); w1(x) and w3(x) must have the
 *     same placements (R, S(last) colwise, or S(r)).
 *   residual adds (blocks): the branch output is redistributed to the
 *     residual stream's placements when they differ (e.g. P(sum) -> R).
 *   loss (logits (B, T, V), targets (B, T) int32 on every rank)
 *     logits R         -> plain cross-entropy
 *     logits S(last)   -> loss parallel: vocab-sharded logits, the row max,
 *                         target logit and sum of exponentials are
 *                         all-reduced over the sharded mesh dims
 *                         (torch's loss_parallel); dlogits stay sharded
 *     logits S(0|1)    -> rows sharded: the loss sum is all-reduced
 *   StridedShard, Partial(avg|max|min) and every other combination give
 *   WEFT_ERR_UNSUPPORTED naming the module, the mesh dim and the placements.
 *
 * A module's backward accepts an output grad whose placements are the
 * output's, or Partial(sum) where the output is Replicate (a grad not yet
 * reduced), or Replicate where the output is Partial(sum) (the grad of a
 * partial value); any other grad is first redistributed to the output's
 * placements (Partial -> Replicate), as DTensor autograd does.
 *
 * ---------------------------------------------------------- ownership
 * A module owns its children, parameters (each param's data and grad,
 * whatever DTensors they point to when the module is destroyed), hooks'
 * records (not their ctx) and activation buffers. The output of
 * weft_module_forward and the input grad of weft_module_backward are owned
 * by the module (or by a hook replacement the module took over) and stay
 * valid until that module's next forward (resp. backward) or destroy.
 * Activations are allocated on the first step and reused: a steady-state
 * step on one rank allocates nothing (weft_mem_get(WEFT_CPU).alloc_count
 * is unchanged); redistributes (TP) allocate their results.
 *
 * ---------------------------------------------------------- collectives
 * Forward, backward, clipping, weft_param_set_placements and optimizer
 * steps may communicate over the model mesh (or a parameter's mesh): every
 * rank of it calls them in the same order with the same shapes. Argument
 * errors detected from shapes and placements are found on every rank
 * alike, before any communication, so bad input never hangs.
 *
 * Arithmetic is fp32 (the device's layer kernels, through backend.h);
 * parameters and activations are WEFT_F32 DTensors.
 */
#ifndef WEFT_NN_H
#define WEFT_NN_H

#include <stdbool.h>
#include <stdint.h>

#include "dtensor.h"
#include "kernels.h"
#include "mesh.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------- parameters */

typedef struct weft_module weft_module;

/* How weft_module_init_weights fills a parameter. */
typedef enum weft_init_kind {
  WEFT_INIT_NORMAL = 0, /* Normal(mean, std) from the counter RNG */
  WEFT_INIT_CONSTANT,   /* every element = value (norms: 1) */
} weft_init_kind;

typedef struct weft_param_init {
  weft_init_kind kind;
  float mean;  /* normal */
  float std;   /* normal */
  float value; /* constant */
} weft_param_init;

/* A parameter. Fields are public so that tp/, fsdp/ and dcp/ can work with
 * them; the comments say who may write what.
 * note: `data` and `grad` are owned by the parameter and destroyed with its
 * module, whatever they point to then. Code that swaps them (FSDP swaps
 * `data` between its sharded and unsharded DTensors) keeps them valid.
 * A layer reads `data` at its forward and again at its backward (so the
 * unsharded data must be back by then: a pre-backward hook), and
 * accumulates into `grad`, which at that moment must be NULL (then created
 * zero with data's spec) or have exactly data's spec (WEFT_ERR_STATE
 * otherwise): whoever swaps `data` swaps `grad` along with it. */
typedef struct weft_param {
  const char *fqn;     /* read-only: "layers.0.attention.wq.weight" (changes when
                          the module is added to a parent) */
  const char *name;    /* read-only: "weight" */
  weft_module *module; /* read-only: the owner */
  /* What forward reads: an F32 DTensor with the layout below. NULL until
   * materialised (weft_module_init_weights, weft_module_materialize or
   * weft_param_load). FSDP may swap the pointer. Never another parameter's
   * DTensor (weft_graph_param refuses it): tie with weft_module_tie_param. */
  weft_dtensor *data;
  /* The gradient: same spec as data; NULL until the first backward that
   * reaches this parameter; accumulated (+=) across backwards until
   * weft_module_zero_grad. */
  weft_dtensor *grad;
  /* While FSDP has swapped an unsharded copy into `data` (between its
   * unshard and reshard; in param_dtype under mixed precision): the
   * sharded f32 DTensor that copy stands for, which state dicts save and
   * load (weft_param_state). NULL otherwise. Written by FSDP only. */
  weft_dtensor *master;
  bool requires_grad;   /* default true; false: no grad, optimizers skip it */
  weft_param_init init; /* read-write: used by weft_module_init_weights */
  /* read-only: the layout the parameter has or will have: mesh shape,
   * placements, global shape and dtype. Set at creation (all Replicate on
   * the module's mesh) and by weft_param_set_placements; equals
   * data's spec whenever data is set by nn. */
  weft_mesh *mesh;
  weft_dtensor_spec spec;
} weft_param;

/* The DTensor that holds the parameter's state: what checkpoints save and
 * load (dcp). Its sharded master while FSDP has an unsharded copy in data,
 * else data. (dcp refuses to load into a model with unsharded groups: the
 * copy forward reads would go stale; reshard first. A weft_dcp_load into a
 * view state dict taken while unsharded cannot tell, so reshard before
 * taking it for a load.) Local. */
static inline weft_dtensor *weft_param_state(const weft_param *p) {
  return p->master ? p->master : p->data;
}

/* Changes a parameter's placements on its mesh (nplacements = mesh ndim;
 * no Partial; StridedShard for a fused projection, which only graph
 * forwards take: tp.h's colwise split_factor). Without storage (deferred
 * init) it only records the layout. With storage it redistributes data to the new
 * placements, keeping the global values (Replicate -> Shard is a local
 * slice, no communication; collective over the parameter's mesh in
 * general), and drops the grad (set to NULL). Called by tp/ before
 * weft_module_init_weights, or after loading. */
WEFT_API weft_status weft_param_set_placements(weft_param *p, const weft_placement *placements,
                                               int nplacements);
/* Loads the parameter from `full`, its whole global tensor (same shape; any
 * float dtype, converted to f32), passed on every rank: each rank keeps its
 * own slice (no communication). Creates the storage if needed. */
WEFT_API weft_status weft_param_load(weft_param *p, const weft_tensor *full);

/* ----------------------------------------------------------------- modules */

typedef enum weft_module_kind {
  WEFT_MODULE_CONTAINER = 0, /* runs its children in order ("layers") */
  WEFT_MODULE_LINEAR,
  WEFT_MODULE_EMBEDDING,
  WEFT_MODULE_RMSNORM,
  WEFT_MODULE_ATTENTION,
  WEFT_MODULE_FEED_FORWARD,
  WEFT_MODULE_BLOCK,
  WEFT_MODULE_LOSS,      /* cross-entropy of logits against targets */
  WEFT_MODULE_MODEL,     /* the Llama model (root) */
  WEFT_MODULE_LAYERNORM, /* torch.nn.LayerNorm (runs in a graph only) */
  WEFT_MODULE_CUSTOM,    /* a user's module (weft_module_create, autograd.h) */
  WEFT_MODULE_KIND_COUNT
} weft_module_kind;

/* "linear", "embedding", ...; "?" for an invalid kind. */
WEFT_API const char *weft_module_kind_name(weft_module_kind kind);

/* Whether m and every module above it compute on the op graph (each has a
 * graph forward: containers, Linear, Embedding, RMSNorm, LayerNorm, a
 * user's module), so m's parameters may hold 16-bit data: the ops take it
 * (autograd.h, "dtypes"), where the hand-written layers of the built-in Llama
 * (attention, feed-forward, block, loss, model) take f32 only. FSDP's
 * param_dtype stores unsharded parameters in that dtype where this holds.
 * Local; false for NULL. */
WEFT_API bool weft_module_on_graph(const weft_module *m);

/* Destroys a root module and everything it owns (children, parameters,
 * buffers, hook records). A module that has a parent returns WEFT_ERR_BUSY
 * (destroy the root). NULL: no-op. Local (no communication). Parameters
 * whose `data` (or `grad`) was set to another parameter's are freed once
 * and the module is destroyed, returning WEFT_ERR_INVALID naming them. */
WEFT_API weft_status weft_module_destroy(weft_module *m);
/* Marks m as used by another library's object that keeps a pointer to it
 * (`by`, a static string naming it, such as "fully_shard"): while m is
 * retained, weft_module_destroy of m or of a module containing it returns
 * WEFT_ERR_BUSY naming m and `by`, instead of leaving that object with a
 * dangling module. Each retain is undone by one release. Called by fsdp/
 * for the modules of an FSDP group; not collective. NULL: no-op. */
WEFT_API void weft_module_retain(weft_module *m, const char *by);
WEFT_API void weft_module_release(weft_module *m);

WEFT_API weft_module_kind weft_module_get_kind(const weft_module *m);
WEFT_API const char *weft_module_name(const weft_module *m); /* local name */
WEFT_API const char *weft_module_fqn(const weft_module *m);  /* "" for a root */
WEFT_API weft_module *weft_module_parent(const weft_module *m);
WEFT_API weft_mesh *weft_module_mesh(const weft_module *m); /* the model mesh */
WEFT_API int weft_module_num_children(const weft_module *m);
WEFT_API weft_module *weft_module_child(const weft_module *m, int i); /* NULL if out of range */
/* The module's own parameters (not its children's). */
WEFT_API int weft_module_num_params(const weft_module *m);
WEFT_API weft_param *weft_module_param(const weft_module *m, int i);

/* Finds a descendant (or root itself for "") by FQN relative to root:
 * for root = the model, "layers.1.attention.wq". WEFT_ERR_NOT_FOUND. */
WEFT_API weft_status weft_module_find(weft_module *root, const char *rel_fqn, weft_module **out);
/* Same for a parameter ("layers.1.attention.wq.weight"). */
WEFT_API weft_status weft_module_find_param(weft_module *root, const char *rel_fqn,
                                            weft_param **out);
/* All parameters of the subtree, depth-first in module order (the order of
 * named_parameters()): writes min(cap, count) pointers, *count = total. */
WEFT_API weft_status weft_module_parameters(weft_module *root, weft_param **out, int cap,
                                            int *count);
/* Calls fn on root and every descendant, pre-order (named_modules()).
 * Stops at the first error and returns it. */
typedef weft_status (*weft_module_visit_fn)(weft_module *m, void *ctx);
WEFT_API weft_status weft_module_visit(weft_module *root, weft_module_visit_fn fn, void *ctx);

/* Materialises every parameter of the subtree that has no storage yet
 * (zeros, with its recorded placements) and fills every parameter by its
 * `init`: Normal(mean, std) keyed by weft_rng_key(fqn) with global element
 * indices (weft_dtensor_fill_normal), so one seed gives the same global
 * weights on any mesh and placements; constants for norms. Linears and
 * embeddings default to Normal(0, 0.02) (the config's init_std), norms to
 * 1. No communication. */
WEFT_API weft_status weft_module_init_weights(weft_module *root, uint64_t seed);
/* Allocates zero-filled storage for every parameter without one (deferred
 * init: shapes and placements first, storage later). No communication. */
WEFT_API weft_status weft_module_materialize(weft_module *root);
/* Zeroes every gradient of the subtree (set_to_none false: keeps the
 * storage, so a steady-state step does not allocate) or drops them
 * (set_to_none true, torch's default). */
WEFT_API weft_status weft_module_zero_grad(weft_module *root, bool set_to_none);

/* Runs the module: hooks, then its computation, then hooks (see the top).
 * `in` is the input DTensor on a mesh of the module's mesh shape (tokens,
 * int32, for embeddings and the model; activations, f32, else). *out is
 * owned by the module until its next forward. Collective over the mesh
 * (when placements call for it). Errors: bad shapes or placements
 * (WEFT_ERR_INVALID / WEFT_ERR_UNSUPPORTED naming the module), parameters
 * not materialised (WEFT_ERR_STATE), re-entering a running module
 * (WEFT_ERR_STATE), and whatever a hook returns. */
WEFT_API weft_status weft_module_forward(weft_module *m, const weft_dtensor *in,
                                         const weft_dtensor **out);
/* Back-propagates grad_out (the gradient of the loss with respect to the
 * output of the last forward: same global shape) through the module:
 * accumulates its parameters' grads and sets *grad_in to the gradient with
 * respect to the forward input, owned by the module until its next
 * backward (NULL when the input has no gradient: tokens). A backward must
 * follow a forward (WEFT_ERR_STATE otherwise); one backward per forward. */
WEFT_API weft_status weft_module_backward(weft_module *m, const weft_dtensor *grad_out,
                                          const weft_dtensor **grad_in);

/* ------------------------------------------------------------------- hooks */

typedef enum weft_hook_kind {
  WEFT_HOOK_PRE_FORWARD = 0, /* t = the input */
  WEFT_HOOK_POST_FORWARD,    /* t = the output */
  WEFT_HOOK_PRE_BACKWARD,    /* t = the grad of the output */
  WEFT_HOOK_POST_BACKWARD,   /* t = the grad of the input (may be NULL) */
  WEFT_HOOK_KIND_COUNT
} weft_hook_kind;

/* A hook sees the tensor of its point, `t`. To replace it, it sets
 * *replace to a new DTensor (same global shape; dtype and mesh shape as
 * t's) whose ownership passes to the module: the module destroys it at the
 * next run of the same point, or at destroy. Leaving *replace NULL keeps t.
 * A hook must not destroy or resize t. Returning an error aborts the
 * forward/backward with that error. Hooks may call collectives (the
 * module's run is collective anyway). */
typedef weft_status (*weft_hook_fn)(weft_module *m, weft_hook_kind kind, const weft_dtensor *t,
                                    weft_dtensor **replace, void *ctx);

/* Identifies a registered hook; a plain value. */
typedef struct weft_hook_handle {
  weft_module *module;
  uint64_t id;
} weft_hook_handle;

/* Registers fn(ctx) at point `kind` of m; the caller keeps ctx alive until
 * the hook is removed or m destroyed. *handle (may be NULL) identifies it. */
WEFT_API weft_status weft_module_register_hook(weft_module *m, weft_hook_kind kind, weft_hook_fn fn,
                                               void *ctx, weft_hook_handle *handle);
/* Removes a hook. WEFT_ERR_NOT_FOUND if it was already removed;
 * WEFT_ERR_BUSY while its module is running. */
WEFT_API weft_status weft_hook_remove(weft_hook_handle handle);

/* ------------------------------------------------------------------ layers */

/* Layer constructors. `mesh` is the model mesh (retained); `name` the local
 * name. Parameters are created all-Replicate on the mesh without storage
 * (see weft_module_init_weights). The new module is a root until added to
 * a container. */

/* torch.nn.Linear(in, out, bias=False): weight (out, in), y = x w^T. */
WEFT_API weft_status weft_linear_create(weft_mesh *mesh, const char *name, int64_t in_features,
                                        int64_t out_features, weft_module **out);
/* torch.nn.Embedding(num, dim): weight (num, dim); input int32 (B, T). */
WEFT_API weft_status weft_embedding_create(weft_mesh *mesh, const char *name,
                                           int64_t num_embeddings, int64_t dim, weft_module **out);
/* RMSNorm(dim, eps): weight (dim), initialised to ones. */
WEFT_API weft_status weft_rmsnorm_create(weft_mesh *mesh, const char *name, int64_t dim, float eps,
                                         weft_module **out);
/* torch.nn.Linear(in, out, bias): weight (out, in) Normal(0, 0.02), and
 * with bias a "bias" (out) initialised to zeros. A linear with a bias runs
 * in a graph only (weft_module_call); without, on both paths. */
WEFT_API weft_status weft_linear_create_ex(weft_mesh *mesh, const char *name, int64_t in_features,
                                           int64_t out_features, bool bias, weft_module **out);
/* torch.nn.LayerNorm(dim, eps, bias): weight (dim) ones, bias (dim) zeros
 * when `bias`. Runs in a graph (weft_module_call) with weft_op_layer_norm;
 * tp/'s sequence parallel applies to it as to RMSNorm. */
WEFT_API weft_status weft_layernorm_create(weft_mesh *mesh, const char *name, int64_t dim,
                                           float eps, bool bias, weft_module **out);

/* Registers a parameter "name" of module m (torch's register_parameter):
 * global shape, all-Replicate on m's mesh, no storage until
 * weft_module_init_weights / materialize / load; *out (may be NULL) is
 * owned by m. Errors: a bad name, a name m already has (parameter or tied
 * alias), a child of that name. Local. */
WEFT_API weft_status weft_module_add_param(weft_module *m, const char *name, int ndim,
                                           const int64_t *shape, weft_param_init init,
                                           weft_param **out);
/* Makes `shared` (a parameter of another module of the same tree, e.g.
 * transformer.wte.weight) also m's parameter "name" (GPT-2's lm_head
 * weight tied to wte): one storage, one grad (uses from both modules sum
 * into it). It keeps its owner's FQN: weft_module_parameters, optimizers,
 * FSDP and checkpoints see it once, under that name; weft_module_find_param
 * also finds it by the alias ("lm_head.weight"). FSDP requires it to be in
 * the group of a common ancestor of every module that uses it. Local. */
WEFT_API weft_status weft_module_tie_param(weft_module *m, const char *name, weft_param *shared);
/* m's parameter (own or tied) by local name; NULL if none. */
WEFT_API weft_param *weft_module_get_param(const weft_module *m, const char *name);
/* Aliases (tied parameters) of m: count, and i-th name and parameter. */
WEFT_API int weft_module_num_tied(const weft_module *m);
WEFT_API weft_param *weft_module_tied(const weft_module *m, int i, const char **name);

/* A container that runs its children in order (nn.Sequential); children
 * are added with weft_module_add_child. */
WEFT_API weft_status weft_sequential_create(weft_mesh *mesh, const char *name, weft_module **out);
/* Appends root module `child` to container `parent`, which takes ownership;
 * the FQNs of child's subtree and parameters become "<parent fqn>.<name>".
 * Errors: parent not a container, child already has a parent, a sibling
 * with the same name, different mesh shapes. */
WEFT_API weft_status weft_module_add_child(weft_module *parent, weft_module *child);

/* -------------------------------------------------------- reference model */

/* The Llama-style model of docs/DESIGN.md ("The reference models"). */
typedef struct weft_llama_config {
  int64_t dim;         /* D */
  int64_t n_layers;    /* L */
  int64_t n_heads;     /* H; head dim = D / H */
  int64_t n_kv_heads;  /* Hkv; H % Hkv == 0 */
  int64_t ffn_dim;     /* F */
  int64_t vocab;       /* V */
  int64_t max_seq_len; /* T <= max_seq_len (RoPE tables) */
  float norm_eps;      /* 1e-5 */
  double rope_theta;   /* 10000 */
  float init_std;      /* 0.02: std of linears and embeddings */
} weft_llama_config;
#define WEFT_LLAMA_CONFIG_INIT ((weft_llama_config){0, 0, 0, 0, 0, 0, 0, 1e-5f, 10000.0, 0.02f})

/* Checks a config: sizes >= 1, D % H == 0, even head dim, H % Hkv == 0,
 * eps > 0, theta > 0, init_std >= 0; WEFT_ERR_INVALID naming the field. */
WEFT_API weft_status weft_llama_config_validate(const weft_llama_config *cfg);

/* The pieces, for building other models (names as torchtitan's). */
/* Attention "name" with children wq (H*hd, D), wk, wv (Hkv*hd, D), wo (D,
 * H*hd); forward x (B, T, D) -> (B, T, D) with RoPE and causal GQA. */
WEFT_API weft_status weft_attention_create(weft_mesh *mesh, const char *name,
                                           const weft_llama_config *cfg, weft_module **out);
/* FeedForward with children w1 (F, D), w2 (D, F), w3 (F, D). */
WEFT_API weft_status weft_feed_forward_create(weft_mesh *mesh, const char *name, int64_t dim,
                                              int64_t ffn_dim, weft_module **out);
/* TransformerBlock: attention_norm, attention, ffn_norm, feed_forward;
 * h = x + attention(attention_norm(x)); out = h + feed_forward(ffn_norm(h)). */
WEFT_API weft_status weft_block_create(weft_mesh *mesh, const char *name,
                                       const weft_llama_config *cfg, weft_module **out);
/* Cross-entropy loss module "name": forward(logits (B, T, V)) -> an f32 [1]
 * Replicate DTensor holding the mean loss over all B*T positions, against
 * the targets set with weft_loss_set_targets; backward(grad [1]) ->
 * dlogits. */
WEFT_API weft_status weft_loss_create(weft_mesh *mesh, const char *name, weft_module **out);
/* Sets the targets (B, T) int32, the same on every rank (copied). Ids are
 * checked against V at forward. */
WEFT_API weft_status weft_loss_set_targets(weft_module *loss, const weft_tensor *targets);
/* The last forward's loss in double precision. */
WEFT_API double weft_loss_value(const weft_module *loss);

/* A replacement loss computation (tp/ may install one; the default covers
 * Replicate, vocab-sharded (loss parallel) and row-sharded logits, see the
 * rules above). forward: the mean loss over every position, the same on
 * every rank; backward: dlogits (preallocated, logits' spec) = dloss *
 * d loss / d logits. Both collective over the mesh if they communicate. */
typedef struct weft_loss_impl {
  weft_status (*forward)(void *ctx, const weft_dtensor *logits, const weft_tensor *targets,
                         double *loss);
  weft_status (*backward)(void *ctx, const weft_dtensor *logits, const weft_tensor *targets,
                          double dloss, weft_dtensor *dlogits);
} weft_loss_impl;
/* Installs impl (copied; ctx kept by the caller) on a loss module; NULL
 * restores the default. */
WEFT_API weft_status weft_loss_set_impl(weft_module *loss, const weft_loss_impl *impl, void *ctx);

/* The whole model, a root module of kind WEFT_MODULE_MODEL with children
 * tok_embeddings, layers (a container of blocks "0".."L-1"), norm, output
 * and loss (a loss module, no parameters). Parameters (docs/DESIGN.md):
 * tok_embeddings.weight [V, D], layers.i.attention_norm.weight [D],
 * layers.i.attention.{wq,wk,wv,wo}.weight, layers.i.ffn_norm.weight [D],
 * layers.i.feed_forward.{w1,w2,w3}.weight, norm.weight [D],
 * output.weight [V, D] (not tied). Created without storage: call
 * weft_module_init_weights (after any placement changes) or load. */
WEFT_API weft_status weft_llama_create(const weft_llama_config *cfg, weft_mesh *mesh,
                                       weft_module **out);
WEFT_API const weft_llama_config *weft_llama_get_config(const weft_module *model);

/* Forward of the model on tokens (B, T) int32 with 1 <= T <= max_seq_len,
 * ids in [0, V), identical on every rank; targets the same shape and range
 * (the next tokens), or NULL to compute only the logits. Runs
 * weft_module_forward on the model (its hooks fire) with the tokens as a
 * Replicate int32 DTensor. *loss (may be NULL) = the mean cross-entropy
 * over the B*T positions (0 without targets). Errors name the bad shape or
 * token (index and value) before anything runs. Collective over the mesh. */
WEFT_API weft_status weft_llama_forward(weft_module *model, const weft_tensor *tokens,
                                        const weft_tensor *targets, double *loss);
/* Backward from the loss of the last forward (dloss = 1): accumulates the
 * gradients of every parameter. Needs a forward with targets. */
WEFT_API weft_status weft_llama_backward(weft_module *model);
/* The logits (B, T, V) of the last forward, as the output module produced
 * them (after its hooks); owned by the model. NULL before a forward. */
WEFT_API const weft_dtensor *weft_llama_logits(const weft_module *model);

/* -------------------------------------------------------------- optimizers */

typedef struct weft_optimizer weft_optimizer;

/* torch.optim.AdamW / torch.optim.SGD over every parameter of `root` with
 * requires_grad (the backend's adamw_multi / sgd_multi, torch's formulas, on each local
 * shard). State per parameter: exp_avg and exp_avg_sq (AdamW, zeros) or
 * momentum_buffer (SGD with momentum) as DTensors with the parameter's
 * current spec, and a step count. Named like torch's optimizer state_dict
 * flattened with FQNs: "state.<fqn>.exp_avg", "state.<fqn>.exp_avg_sq",
 * "state.<fqn>.momentum_buffer".
 * note: the optimizer reads each parameter's data and grad pointers at
 * step time (FSDP swaps them), and its state has the spec the data had at
 * creation: create the optimizer after sharding (tp/, fsdp/); a step that
 * finds a parameter whose data's spec changed fails with WEFT_ERR_STATE.
 * Parameters must be materialised. Local (no communication). */
WEFT_API weft_status weft_adamw_create(weft_module *root, const weft_adamw_params *hp,
                                       weft_optimizer **out);
WEFT_API weft_status weft_sgd_create(weft_module *root, const weft_sgd_params *hp,
                                     weft_optimizer **out);
/* torch.optim.AdamW with parameter groups: every trainable parameter of
 * root in exactly one group (WEFT_ERR_INVALID naming a parameter in none,
 * in two, or listed but not root's), each group with its own
 * hyper-parameters (lr, betas, eps, weight_decay, amsgrad). State names as
 * without groups; one multi-tensor launch per run of parameters of one
 * group. set_lr and schedules set every group's lr. */
typedef struct weft_adamw_group {
  weft_param *const *params;
  int nparams;
  weft_adamw_params hp;
} weft_adamw_group;
WEFT_API weft_status weft_adamw_create_groups(weft_module *root, const weft_adamw_group *groups,
                                              int ngroups, weft_optimizer **out);
/* The usual two groups (nanoGPT's configure_optimizers): group 0 with
 * hp->weight_decay holds every trainable parameter of 2 or more dims
 * (linear weights, and the embedding tables unless decay_embeddings is
 * false), group 1 with weight decay 0 the rest (biases, norm weights;
 * embeddings when decay_embeddings is false). A tied parameter is one
 * parameter (its owner's kind decides). Otherwise as
 * weft_adamw_create_groups (create it after sharding). Local. */
WEFT_API weft_status weft_adamw_create_decay_groups(weft_module *root, const weft_adamw_params *hp,
                                                    bool decay_embeddings, weft_optimizer **out);
/* Number of groups (1 without groups), and a group's hyper-parameters
 * (read for checkpoints; set on restore: amsgrad cannot change). */
WEFT_API int weft_optimizer_num_groups(const weft_optimizer *opt);
WEFT_API weft_status weft_optimizer_group_get(const weft_optimizer *opt, int group,
                                              weft_adamw_params *hp);
WEFT_API weft_status weft_optimizer_group_set(weft_optimizer *opt, int group,
                                              const weft_adamw_params *hp);

/* Frees the optimizer's state. NULL: no-op. The handle stays readable (its
 * struct is kept, emptied): a second destroy, or a step on it, returns
 * WEFT_ERR_INVALID instead of touching freed memory. */
WEFT_API weft_status weft_optimizer_destroy(weft_optimizer *opt);

/* One step over every parameter whose grad is set (torch skips grad None;
 * a skipped parameter's step count does not advance). Sets the learning
 * rate from the schedule first if one is set. Local shards only: no
 * communication, no allocation. */
WEFT_API weft_status weft_optimizer_step(weft_optimizer *opt);
/* Learning rate (for the following steps). */
WEFT_API void weft_optimizer_set_lr(weft_optimizer *opt, float lr);
WEFT_API float weft_optimizer_get_lr(const weft_optimizer *opt);
/* Number of weft_optimizer_step calls so far. */
WEFT_API int64_t weft_optimizer_num_steps(const weft_optimizer *opt);
/* Sets that count (checkpoint restore, so that a schedule resumes where it
 * was); n >= 0, WEFT_ERR_INVALID otherwise. */
WEFT_API weft_status weft_optimizer_set_num_steps(weft_optimizer *opt, int64_t n);

/* Named state tensors (for checkpoints): count, i-th, by name. The DTensors
 * are owned by the optimizer; a checkpoint loader may overwrite their
 * elements. */
WEFT_API int weft_optimizer_state_count(const weft_optimizer *opt);
WEFT_API weft_status weft_optimizer_state_get(const weft_optimizer *opt, int i, const char **name,
                                              weft_dtensor **t);
WEFT_API weft_status weft_optimizer_state_find(const weft_optimizer *opt, const char *name,
                                               weft_dtensor **t);
/* "state.<fqn>.step": the parameter's step count, read and restored. */
WEFT_API weft_status weft_optimizer_get_param_step(const weft_optimizer *opt, const char *fqn,
                                                   int64_t *step);
WEFT_API weft_status weft_optimizer_set_param_step(weft_optimizer *opt, const char *fqn,
                                                   int64_t step);
/* The index of the group that holds parameter fqn (0 without groups):
 * what a checkpoint records as the parameter's place in torch's
 * param_groups. WEFT_ERR_NOT_FOUND when the optimizer does not step it. */
WEFT_API weft_status weft_optimizer_param_group(const weft_optimizer *opt, const char *fqn,
                                                int *group);

/* Linear warmup then cosine decay (llm.c's get_lr), for 0-based step s:
 *   s < warmup:          lr = lr_max * (s + 1) / warmup
 *   s >= total:          lr = lr_min
 *   else: r = (s - warmup) / (total - warmup),
 *         lr = lr_min + 0.5 * (1 + cos(pi r)) * (lr_max - lr_min). */
typedef struct weft_lr_schedule {
  float lr_max;
  float lr_min;
  int64_t warmup_steps; /* >= 0 */
  int64_t total_steps;  /* >= warmup_steps */
} weft_lr_schedule;
/* The rate at 0-based step s (s < 0 counts as 0). Invalid schedules
 * (warmup < 0, total < warmup): lr_max. */
WEFT_API float weft_lr_schedule_at(const weft_lr_schedule *s, int64_t step);
/* Makes every weft_optimizer_step set lr = schedule(num_steps) before
 * updating (NULL removes it). WEFT_ERR_INVALID for a bad schedule. */
WEFT_API weft_status weft_optimizer_set_schedule(weft_optimizer *opt, const weft_lr_schedule *s);

/* ---------------------------------------------------------------- clipping */

/* torch.nn.utils.clip_grad_norm_(parameters, max_norm): total = the 2-norm
 * of all gradients together, coef = min(1, max_norm / (total + 1e-6)),
 * every gradient *= coef (skipped when coef == 1). Each parameter's local
 * sum of squares is all-reduced over the mesh dims where its grad is
 * sharded (Shard/StridedShard), not where it is Replicate; a Partial grad
 * is reduced to Replicate first (it replaces p->grad). So *total_norm is
 * the same on every rank and equals the norm on one rank. Parameters
 * without grad are skipped. Collective over every parameter's mesh, in
 * parameter order. *total_norm may be NULL. max_norm must be > 0. */
WEFT_API weft_status weft_clip_grad_norm(weft_module *root, double max_norm, double *total_norm);
/* Same over an explicit list of parameters (any meshes). */
WEFT_API weft_status weft_clip_grad_norm_params(weft_param *const *params, int n, double max_norm,
                                                double *total_norm);

#ifdef __cplusplus
}
#endif
#endif /* WEFT_NN_H */
