/* nn/autograd_internal.h — what the op files of nn/ share: vars, nodes,
 * the graph's buffer pool and the helpers every op uses (choose a
 * strategy, bring an input to placements, make an output, record the
 * backward). Not installed. */
#ifndef WEFT_AUTOGRAD_INTERNAL_H
#define WEFT_AUTOGRAD_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "autograd.h"
#include "backend.h"
#include "nn_internal.h"

#define NN_MAX_IN WEFT_OP_MAX_INPUTS
#define NN_MAX_OUT 8
#define NN_MAX_SAVED 4

struct weft_var {
  weft_graph *g;
  int index;                 /* position in the graph's var list */
  const weft_dtensor *value; /* pooled, borrowed (input) or module-owned */
  weft_param *param;         /* parameter vars: grads go to param->grad */
  bool requires_grad;
  bool keep_grad;     /* input vars with requires_grad: grad stays readable */
  weft_dtensor *grad; /* pooled */
  /* grad is shared with another var (an op's backward handed one buffer to
   * several inputs, add's): never added into in place; the first
   * accumulation makes the var its own buffer (graph.c accumulate) */
  bool grad_shared;
  /* value is a strided view (split's pieces): the contiguous copy that ops
   * without strided kernels read, made by the first of them
   * (nn_check_vars), NULL until then */
  const weft_dtensor *contig;
};

typedef struct nn_node nn_node;
/* Computes din[i] for every input i with nn_node_wants(n, i) from the
 * output grads dout[j] (already brought to placements the op accepts: the
 * output's, Partial where the output is Replicate, Replicate where it is
 * Partial; NULL when no grad reached output j). din[i] must be a DTensor
 * from the graph (nn_graph_tensor) or NULL (no grad); the graph takes a
 * fresh one over as the input's grad, so the backward must not keep or
 * reuse it. */
typedef weft_status (*nn_backward_fn)(nn_node *n, const weft_dtensor *const *dout,
                                      weft_dtensor **din);

typedef enum nn_node_kind {
  NN_NODE_OP = 0,
  NN_NODE_MODULE_BEGIN, /* backward: post-backward hooks of `module` */
  NN_NODE_MODULE_END,   /* backward: pre-backward hooks of `module` */
} nn_node_kind;

struct nn_node {
  const char *name;
  nn_node_kind kind;
  int nin, nout;
  weft_var *in[NN_MAX_IN];
  weft_var *out[NN_MAX_OUT];
  /* The inputs as the forward used them when they were redistributed
   * (graph buffers); NULL: the var's value (a parameter's data is re-read
   * at backward: nn_node_input). */
  const weft_dtensor *in_used[NN_MAX_IN];
  weft_dtensor *saved[NN_MAX_SAVED]; /* graph buffers the backward needs */
  bool mixed; /* made from bf16/f16 inputs: the backward runs widened (mixed.c) */
  /* The backward reads strided output grads (a view from transpose's or
   * reshape's backward, sdpa's column slices) through their strides.
   * false (the default): graph.c run_node hands it packed copies
   * (nn_graph_packed) of any that are strided. */
  bool reads_strided_grads;
  /* Its backward has run (graph.c run_node): what it saved or redistributed
   * is no longer kept for it. */
  bool ran_backward;
  nn_backward_fn backward;
  double f[4]; /* op arguments */
  int64_t i[8];
  const void *p[2];
  weft_module *module; /* module nodes */
  void *ctx;
  /* Activation checkpointing (graph.c): on the END node of a module run
   * with weft_module_set_checkpoint, its BEGIN node (whose outputs are the
   * forward's inputs) and the state its forward drew dropout masks from;
   * NULL / unused on every other node. */
  nn_node *ac_begin;
  int64_t ac_op_index, ac_step;
  bool ac_training;
};

/* ---------------------------------------------------------------- graph.c */

/* A buffer of the graph with this mesh, dtype, global shape and
 * placements: reused from the pool when one of that spec is free, else
 * new. Contents undefined. Valid until reset. */
weft_status nn_graph_tensor(weft_graph *g, weft_mesh *mesh, weft_dtype dtype, int ndim,
                            const int64_t *shape, const weft_placement *pl, weft_dtensor **out);
/* Same, zero-filled. */
weft_status nn_graph_zeros(weft_graph *g, weft_mesh *mesh, weft_dtype dtype, int ndim,
                           const int64_t *shape, const weft_placement *pl, weft_dtensor **out);
/* A buffer with x's mesh, dtype and shape and placements pl (NULL: x's). */
weft_status nn_graph_like(weft_graph *g, const weft_dtensor *x, const weft_placement *pl,
                          weft_dtensor **out);
/* A view: a DTensor of global `shape` and placements `pl` over the storage
 * of x (weft_dtensor_view), when x is a buffer of this step or a view of
 * one; *out NULL otherwise (the caller copies). The view lives until reset,
 * and its base buffer stays in use as long: activation checkpointing keeps
 * the base of every view it keeps, and nn_graph_discard leaves a base in
 * the pool. Local; reshape's forward (ops_shape.c) is the caller. */
weft_status nn_graph_view(weft_graph *g, const weft_dtensor *x, int ndim, const int64_t *shape,
                          const weft_placement *pl, weft_dtensor **out);
/* The same for weft_dtensor_as_strided (offset and strides into x's local
 * storage): split's pieces. */
weft_status nn_graph_as_strided(weft_graph *g, const weft_dtensor *x, int ndim,
                                const int64_t *shape, const weft_placement *pl, int64_t offset,
                                const int64_t *strides, weft_dtensor **out);
/* The buffer whose storage d shares when d is a view of this step, else
 * NULL. */
const weft_dtensor *nn_graph_view_base(const weft_graph *g, const weft_dtensor *d);
/* x itself when it has placements `to`, else a graph buffer holding x
 * redistributed (allow_partial: Replicate -> Partial targets). */
weft_status nn_graph_bring(weft_graph *g, const weft_dtensor *x, const weft_placement *to,
                           bool allow_partial, const weft_dtensor **use);

/* A graph buffer with d's mesh, shape and placements in `dtype`, holding
 * d's values converted (weft_tensor_copy: rounding to nearest even). */
weft_status nn_graph_converted(weft_graph *g, const weft_dtensor *d, weft_dtype dtype,
                               weft_dtensor **out);
/* The RoPE tables (weft_backend_rope_tables: tab_pos * hd/2 cosines, then
 * as many sines) of `mesh`'s device for head dim hd and theta, covering at
 * least positions [0, max_pos): built on the first request and kept by the
 * graph across steps, so each shape's tables are computed once, not in
 * every layer of every step. *tab (Replicate, f32, 1-D) is borrowed: valid
 * until weft_graph_destroy, or the reset after a larger request replaced
 * it. Local; called by the rope op (ops_layers.c). */
weft_status nn_graph_rope_tables(weft_graph *g, weft_mesh *mesh, int64_t max_pos, int64_t hd,
                                 double theta, const weft_dtensor **tab, int64_t *tab_pos);
/* Frees a buffer of this step now (removed from the pool; no-op for one the
 * pool does not hold): for short-lived copies (mixed.c), which would
 * otherwise stay in the pool as spare buffers of their spec. */
void nn_graph_discard(weft_graph *g, const weft_dtensor *d);
/* Returns a buffer of this step to the pool now, for the ops that follow
 * (same stream order on a device): an op's temporary that no node keeps,
 * such as sdpa's scratch. The caller drops d. No-op for a buffer a view
 * reads or one the pool does not hold. */
void nn_graph_release(weft_graph *g, const weft_dtensor *d);
/* The graph's vars and nodes so far, and each by position. */
int nn_graph_nvars(const weft_graph *g);
int nn_graph_nnodes(const weft_graph *g);
weft_var *nn_graph_var(const weft_graph *g, int i);
nn_node *nn_graph_node(const weft_graph *g, int i);

/* Argument checks shared by ops: non-NULL vars of one graph on meshes of
 * one shape. `name` is the op. An input whose value is a strided view
 * gets its contiguous copy here (weft_var.contig, counted in copies), so
 * the op's kernels see contiguous tensors through nn_var_now. */
weft_status nn_check_vars(const char *name, weft_var *const *in, int nin, weft_graph **g);
/* The same checks without the copies: for ops that read strided values
 * (reshape, sdpa), which call nn_var_contig themselves where they
 * cannot. */
weft_status nn_check_vars_views(const char *name, weft_var *const *in, int nin, weft_graph **g);
/* d itself when its local tensor is contiguous, else a graph buffer
 * holding a contiguous copy of it (counted in copies). */
weft_status nn_graph_packed(weft_graph *g, const weft_dtensor *d, const weft_dtensor **out);
/* Makes v's contiguous copy (weft_var.contig) when its value is strided
 * and it has none yet; counted in copies. */
weft_status nn_var_contig(weft_var *v);
/* A local tensor as a GEMM operand: the rows x cols matrix of its dims
 * [0, split) and [split, ndim), each group collapsed into one dim, at
 * data with BLAS's leading dim ld: not trans, stride 1 along cols and ld
 * between rows (row-major, a row-strided slice among them); trans, stored
 * as its transpose, stride 1 along rows and ld between cols (a transposed
 * view: the GEMM's transpose flag reads it in place). matmul and linear
 * (ops_shape.c, ops_linear.c) read strided operands through it. */
typedef struct nn_gemm_operand {
  const void *data;
  int64_t rows, cols, ld;
  bool trans;
} nn_gemm_operand;
/* *o for t split at dim `split` when a GEMM can read t in place: the cols
 * (or rows) packed and the other group one stride apart, no less than a
 * packed matrix's. false otherwise (the caller packs t). */
bool nn_gemm_operand_of(const weft_tensor *t, int split, nn_gemm_operand *o);
/* The operand of d's local tensor, split before its last dim; *d is
 * replaced by its packed copy first (a graph buffer, counted in copies)
 * when no GEMM reads it in place. */
weft_status nn_gemm_operand_packed(weft_graph *g, const weft_dtensor **d, nn_gemm_operand *o);
/* Makes v's contiguous copy (nn_var_contig) unless a GEMM reads its value
 * in place, split before the last dim: matmul's and linear's forward,
 * after nn_check_vars_views. */
weft_status nn_var_gemm_ready(weft_var *v);
/* An error naming the op and its inputs' shapes and placements, with a
 * reason, raised as from `func` (nn_op_error: the calling function, so an
 * op's own checks head the message with weft_op_<name>). Returns `code`. */
weft_status nn_op_error_at(const char *func, weft_status code, const char *name,
                           weft_var *const *in, int nin, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
#define nn_op_error(...) nn_op_error_at(__func__, __VA_ARGS__)
/* weft_sharding_choose over the vars' values (NULL vars: not priced),
 * with an error naming the op and inputs when nothing applies. */
weft_status nn_choose(const char *name, weft_var *const *in, int nin,
                      const weft_sharding_option *opts, int cap, const int *nopt,
                      bool allow_partial, weft_placement *targets, weft_placement *out_pl);

/* A node for an op of inputs in[0..nin): *out is NULL (nothing to record)
 * when grad recording is off or no input requires grad. used (may be NULL,
 * entries may be NULL) are the inputs as the forward used them: where one
 * differs from the var's value (a redistributed copy) the backward gets
 * that copy from nn_node_input; else the var's value as it is then. */
weft_status nn_node_new(weft_graph *g, const char *name, weft_var *const *in, int nin,
                        const weft_dtensor *const *used, nn_backward_fn backward, nn_node **out);
/* A var for an op's output (a graph buffer, or any DTensor that stays
 * valid until reset): the node's output j when node is non-NULL. */
weft_status nn_var_new(weft_graph *g, const weft_dtensor *value, nn_node *node, weft_var **out);
/* Whether the backward must produce din[i]. */
bool nn_node_wants(const nn_node *n, int i);
/* Input i as the forward used it (a parameter's data as it is now). */
const weft_dtensor *nn_node_input(const nn_node *n, int i);
/* The var's current value: a parameter's data now, else its contiguous
 * copy when one was made, else value (which may be a strided view: only
 * ops that read strided operands see it, through nn_check_vars_views). */
const weft_dtensor *nn_var_now(const weft_var *v);
weft_graph *nn_node_graph(const nn_node *n);
/* Training flag, seed, step of the graph; a fresh op index per call. */
bool nn_graph_training(const weft_graph *g);
uint64_t nn_graph_seed(const weft_graph *g);
int64_t nn_graph_step(const weft_graph *g);
/* weft_graph_set_batch_slice's values (total_rows 0: not set). */
void nn_graph_batch_slice(const weft_graph *g, int64_t *row0, int64_t *total_rows);
int64_t nn_graph_next_op_index(weft_graph *g);

/* The output placements a backward may receive for an output of
 * placements `out` (see nn_backward_fn); used to coerce dout. */
void nn_grad_placements(const weft_placement *out, const weft_placement *grad, int n,
                        weft_placement *want);

/* ---------------------------------------------------------------- stats.c */

/* weft_op_stats's counters: n more of each (relaxed atomics). */
void nn_count_ops(int64_t n);
void nn_count_widened(int64_t n);
void nn_count_copies(int64_t n);

/* ------------------------------------------------------------- mixed.c */

/* bf16 / f16 inputs of a built-in op (mixed.c): compute in f32, keep the
 * low dtype. Every built-in op runs as
 *     nn_mixed mx;
 *     WEFT_CHECK(nn_mixed_begin(&mx, name, in, nin, same_dtype));
 *     weft_status st = <the f32 op on in[]>;
 *     return nn_mixed_end(&mx, st, outs, nout);
 * begin replaces the low-precision vars of in[] by f32 proxies (and
 * rejects two 16-bit dtypes, or, with same_dtype, f32 mixed with 16-bit);
 * end rounds what the op made to the result dtype (16-bit unless an input
 * is f32), points its nodes back at the original vars and marks them
 * mixed. Both do nothing when no input is 16-bit. */
typedef struct nn_mixed {
  char func[48]; /* the public entry, "weft_op_<name>": heads the op's errors */
  weft_graph *g;
  bool active;
  weft_dtype dtype; /* the op's result dtype */
  int v0, n0;       /* vars and nodes of the graph before the op */
  int nin;
  weft_var *orig[NN_MAX_IN], *proxy[NN_MAX_IN];
} nn_mixed;
weft_status nn_mixed_begin(nn_mixed *mx, const char *name, weft_var **in, int nin, bool same_dtype);
/* The same for an op with a storage-dtype kernel (backend.h
 * weft_kernel_op): where every input has one 16-bit dtype and the inputs'
 * device computes kop in it (weft_backend_takes_dtype), nothing is widened
 * and the op runs in that dtype, its node not mixed (the kernel computes
 * in f32 and rounds once: the widened path's bits, except that a sum over
 * rows, as a broadcast add's backward, rounds its double once instead of
 * through f32). Otherwise as nn_mixed_begin. */
weft_status nn_mixed_begin_kernel(nn_mixed *mx, const char *name, weft_var **in, int nin,
                                  bool same_dtype, weft_kernel_op kop);
weft_status nn_mixed_end(nn_mixed *mx, weft_status st, weft_var **out, int nout);

/* The backward of a mixed node (graph.c run_node): begin widens its dout,
 * inputs, outputs and saved buffers to f32 (graph buffers, swapped in for
 * the call); end swaps the originals back, rounds din[i] to input i's
 * dtype and returns the f32 buffers. */
typedef struct nn_mixed_bwd {
  const weft_dtensor *in_used[NN_MAX_IN];
  const weft_dtensor *out_value[NN_MAX_OUT];
  weft_dtensor *saved[NN_MAX_SAVED];
  weft_dtensor *temp[NN_MAX_IN + 2 * NN_MAX_OUT + NN_MAX_SAVED];
  int ntemp;
} nn_mixed_bwd;
weft_status nn_mixed_backward_begin(nn_node *n, const weft_dtensor **dout, nn_mixed_bwd *b);
weft_status nn_mixed_backward_end(nn_node *n, weft_status st, weft_dtensor **din, nn_mixed_bwd *b);

/* ---------------------------------------------------------------- ops */

/* Room for the sharding options one mesh dim of an op may list. */
#define NN_OPT_CAP 24

/* The op's input `d` (named `what` in messages) must be f32 with a
 * contiguous local tensor (what the kernels take): WEFT_ERR_UNSUPPORTED /
 * WEFT_ERR_INVALID naming the op and its inputs otherwise. */
weft_status nn_check_f32_contig(const char *name, weft_var *const *in, int nin,
                                const weft_dtensor *d, const char *what);
/* The same, but d may also have a 16-bit dtype in which its device
 * computes kop (an op that nn_mixed_begin_kernel left unwidened). */
weft_status nn_check_kernel_contig(const char *name, weft_var *const *in, int nin,
                                   const weft_dtensor *d, const char *what, weft_kernel_op kop);
/* Only the dtype half of nn_check_kernel_contig (ops that read strided
 * values). */
weft_status nn_check_kernel_dtype(const char *name, weft_var *const *in, int nin,
                                  const weft_dtensor *d, const char *what, weft_kernel_op kop);

/* Per mesh dim placement helpers. */
static inline bool nn_is_shard_any(weft_placement p) {
  return p.kind == WEFT_PLACE_SHARD || p.kind == WEFT_PLACE_STRIDED_SHARD;
}
/* A pending sum or average: it passes through linear ops. */
static inline bool nn_is_linear_partial(weft_placement p) {
  return p.kind == WEFT_PLACE_PARTIAL && (p.op == WEFT_OP_SUM || p.op == WEFT_OP_AVG);
}
/* The product of shape dims [a, b) (1 when empty). */
static inline int64_t nn_prod(const int64_t *s, int a, int b) {
  int64_t r = 1;
  for (int d = a; d < b; d++) r *= s[d];
  return r;
}
/* A GEMM leading dim (>= 1, as BLAS wants even for empty operands). */
static inline int64_t nn_ld(int64_t n) { return n > 1 ? n : 1; }
/* Rows of a local tensor: the product of all dims but the last. */
static inline int64_t nn_rows(const weft_tensor *t) {
  int64_t r = 1;
  for (int d = 0; d < t->ndim - 1; d++) r *= t->shape[d];
  return r;
}
static inline weft_placement nn_r(void) { return weft_replicate(); }
static inline weft_placement nn_s(int d) { return weft_shard(d); }
static inline weft_placement nn_psum(void) { return weft_partial(WEFT_OP_SUM); }

/* Local tensor of a DTensor (contiguous f32 is what the kernels take). */
static inline const weft_tensor *nn_local(const weft_dtensor *d) { return weft_dtensor_local(d); }

#endif
