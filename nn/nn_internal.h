/* nn/nn_internal.h — shared between the nn sources only: the module object,
 * the per-kind vtable (a layer's raw forward/backward, reachable only
 * through weft_module_forward/_backward so hooks always run) and helpers
 * for buffers, placement rules and gradient reductions. */
#ifndef WEFT_NN_INTERNAL_H
#define WEFT_NN_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "backend.h"
#include "nn.h"

typedef struct weft_var weft_var;

/* The raw computation of one module kind. forward/backward receive the
 * tensors after the pre-hooks and return tensors they own (or a child
 * owns); the dispatcher runs the post-hooks. backward may set *din = NULL
 * (no input grad). destroy frees `impl` (buffers included), never the
 * children or the parameters (the dispatcher does). */
typedef struct nn_ops {
  weft_status (*forward)(weft_module *m, const weft_dtensor *in, const weft_dtensor **out);
  weft_status (*backward)(weft_module *m, const weft_dtensor *dout, const weft_dtensor **din);
  void (*destroy)(weft_module *m);
  /* The forward written with ops (autograd.h), run by weft_module_call
   * between the hooks; NULL for layers with only a hand-written
   * forward/backward (then forward/backward above serve both paths). */
  weft_status (*graph_forward)(weft_module *m, weft_var *const *in, int nin, weft_var **out,
                               int nout);
} nn_ops;

typedef struct nn_hook {
  weft_hook_kind kind;
  weft_hook_fn fn;
  void *ctx;
  uint64_t id;
  bool removed; /* removed while the module was running: dropped afterwards */
} nn_hook;

/* DTensors a module took over from hook replacements (freed at the next
 * run of the same hook point; a backward one in a graph as soon as the
 * graph consumed it: nn_module_drop_replacements). Heap array that only
 * grows. */
typedef struct nn_owned {
  weft_dtensor **v;
  int n;
  int cap;
} nn_owned;

/* weft_module.magic: a live module, or a root that weft_module_destroy
 * freed (its struct kept, emptied, so a second destroy or a run of it is
 * an error rather than a use of freed memory). */
#define NN_MODULE_LIVE 0x4d4f4431u /* "MOD1" */
#define NN_MODULE_DEAD 0x44454144u /* "DEAD" */

struct weft_module {
  uint32_t magic;
  weft_module_kind kind;
  char *name;
  char *fqn;
  weft_module *parent;
  weft_module **children;
  int nchildren;
  int cap_children;
  weft_param **params;
  int nparams;
  weft_param **tied; /* parameters of other modules used here (not owned) */
  char **tied_names; /* their local names here */
  int ntied;
  weft_mesh *mesh; /* retained */
  const nn_ops *ops;
  void *impl;
  nn_hook *hooks;
  int nhooks;
  int cap_hooks;
  uint64_t next_hook_id;
  nn_owned owned[WEFT_HOOK_KIND_COUNT];
  bool running;               /* inside forward or backward (re-entry and hook removal checks) */
  bool fwd_pending;           /* a forward ran and its backward has not */
  bool in_graph_forward;      /* inside weft_module_call's forward (re-entry check) */
  bool checkpoint;            /* weft_module_set_checkpoint: activations recomputed in backward */
  int retains;                /* weft_module_retain count: destroy is refused while > 0 */
  const char *retained_by;    /* who retained it last (a static string) */
  weft_dtensor_spec out_spec; /* what the last forward returned (after post-hooks) */
};

/* ------------------------------------------------------------ module.c */

/* A new root module of `kind` on mesh (retained) with the given impl and
 * ops; *out owns impl from here on (ops->destroy frees it, also on error). */
weft_status nn_module_new(weft_mesh *mesh, weft_module_kind kind, const char *name,
                          const nn_ops *ops, void *impl, weft_module **out);
/* Adds a child (any parent kind; the public add_child allows containers
 * only). Recomputes the child's FQNs. */
weft_status nn_module_attach(weft_module *parent, weft_module *child);
/* A parameter "<name>" of m with the given global shape, all-Replicate on
 * m's mesh, no storage. */
weft_status nn_param_add(weft_module *m, const char *name, int ndim, const int64_t *shape,
                         weft_param_init init, weft_param **out);
/* The parameter's data, checked to be materialised, f32, contiguous, on a
 * mesh of m's mesh shape. */
weft_status nn_param_data(const weft_module *m, const weft_param *p, const weft_dtensor **out);

/* Runs m's hooks of one kind on *t (graph module boundaries, autograd.c):
 * the replacements of the previous run of that point are freed first. */
weft_status nn_module_hooks(weft_module *m, weft_hook_kind kind, const weft_dtensor **t);

/* Frees the replacements m's hooks of one kind made at their last run
 * (graph backward, once the grad they replaced has been consumed). */
void nn_module_drop_replacements(weft_module *m, weft_hook_kind kind);

/* ------------------------------------------------------------ util.c */

/* Placements list of a DTensor as text, for messages. */
void nn_describe_pl(const weft_placement *pl, int n, char *buf, size_t cap);

/* Checks an activation: non-NULL, dtype, ndim (>= min_ndim), mesh shape
 * equal to m's mesh, contiguous local tensor. `what` names it. */
weft_status nn_check_input(const weft_module *m, const weft_dtensor *x, const char *what,
                           weft_dtype dtype, int min_ndim);

/* Makes *slot a DTensor with exactly this global shape and placements on
 * mesh (f32 unless dtype says otherwise), reusing the existing one when it
 * already matches (the steady state: no allocation). Contents undefined. */
weft_status nn_ensure(weft_dtensor **slot, weft_mesh *mesh, weft_dtype dtype, int ndim,
                      const int64_t *shape, const weft_placement *pl);
/* A scratch buffer of at least `floats` floats on `dev` (grows, never
 * shrinks; moves when asked for on another device). */
typedef struct nn_scratch {
  float *p;
  int64_t cap;
  weft_device dev;
} nn_scratch;
weft_status nn_scratch_reserve(nn_scratch *s, weft_device dev, int64_t floats);
/* Host access to a local tensor's memory on `dev`. nn_host_get: *h points
 * at `bytes` host bytes with src's contents (src itself on the CPU, else a
 * copy in *tmp, which the caller frees with weft_free; waits for the
 * device). nn_host_put copies `bytes` host bytes to dst on dev. */
weft_status nn_host_get(weft_device dev, const void *src, size_t bytes, const void **h, void **tmp);
weft_status nn_host_put(weft_device dev, void *dst, const void *src, size_t bytes);
/* One host element of a float dtype (f32, f64, bf16, f16): nn_scalar_load
 * reads it as a double, nn_scalar_store writes v rounded once to dt (as
 * nn/mixed.c rounds an f32 result). Both false for any other dtype. */
bool nn_scalar_load(weft_dtype dt, const void *p, double *out);
bool nn_scalar_store(weft_dtype dt, void *p, float v);
void nn_scratch_free(nn_scratch *s);

/* The device of a DTensor's local tensor: the kernels run through its
 * backend (backend.h). */
static inline weft_device nn_dev(const weft_dtensor *d) { return weft_dtensor_local(d)->device; }
static inline float *nn_f32(const weft_dtensor *d) { return (float *)weft_dtensor_local(d)->data; }
static inline int64_t nn_numel(const weft_dtensor *d) {
  return weft_tensor_numel(weft_dtensor_local(d));
}

/* Checks an output grad against the forward output's spec (global shape,
 * mesh shape, f32) and brings it to a layout the layer's backward accepts:
 * per mesh dim equal to the output's placement, or Partial(sum) where the
 * output is Replicate (when partial_ok; the layer is linear in the grad),
 * or Replicate where the output is Partial(sum). Anything else is
 * redistributed to the output's placements with Partial -> Replicate
 * (stored in *tmp, replacing what was there). *use is the tensor to use. */
weft_status nn_coerce_grad(const weft_module *m, const weft_dtensor *dout,
                           const weft_dtensor_spec *out_spec, bool partial_ok,
                           const weft_dtensor **use, weft_dtensor **tmp);

/* Brings `src` to `want` placements: returns src itself when equal, else a
 * redistribute (Replicate -> Partial allowed) stored in *tmp. */
weft_status nn_align(const weft_dtensor *src, const weft_placement *want, const weft_dtensor **use,
                     weft_dtensor **tmp);
/* dst (its local) = a + b, where a has dst's placements and b is aligned
 * to them first (*tmp as for nn_align). Global shapes must match. */
weft_status nn_add(weft_dtensor *dst, const weft_dtensor *a, const weft_dtensor *b,
                   weft_dtensor **tmp);

/* A locally computed tensor `buf` (n floats, the local shard of a tensor of
 * spec `like` but with placements `have`) is turned in place into
 * placements `want`: Partial(sum) -> Replicate differences are in-place
 * all-reduces over those mesh dims of `mesh` (skipped for size-1 dims);
 * any other difference goes through weft_dtensor_redistribute and is
 * copied back (local shapes must then agree). */
weft_status nn_reduce_to(weft_mesh *mesh, float *buf, const weft_dtensor_spec *like,
                         const weft_placement *have, const weft_placement *want);

/* Accumulates a weight gradient computed locally with placements `have`
 * (dw: local floats, the shape of p->data's local) into p->grad (created
 * zero on first use with data's spec), reducing to the param's placements
 * first (nn_reduce_to). dw may be overwritten. */
weft_status nn_grad_accumulate(const weft_module *m, weft_param *p, float *dw,
                               const weft_placement *have);
/* p->grad, created (zeros, data's spec) if NULL; checked to match data. */
weft_status nn_grad_get(const weft_module *m, weft_param *p, weft_dtensor **out);

/* Placement predicates. */
static inline bool nn_is_r(weft_placement p) { return p.kind == WEFT_PLACE_REPLICATE; }
static inline bool nn_is_s(weft_placement p, int dim) {
  return p.kind == WEFT_PLACE_SHARD && p.dim == dim;
}
static inline bool nn_is_psum(weft_placement p) {
  return p.kind == WEFT_PLACE_PARTIAL && p.op == WEFT_OP_SUM;
}
bool nn_pl_equal(const weft_placement *a, const weft_placement *b, int n);

/* The error for an unsupported placement combination of module m. */
weft_status nn_unsupported(const weft_module *m, int mesh_dim, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ------------------------------------------------------------ modules.c */

/* Graph forwards of the built-in layers (nn_ops.graph_forward). */
weft_status nn_linear_graph_forward(weft_module *m, weft_var *const *in, int nin, weft_var **out,
                                    int nout);
weft_status nn_embedding_graph_forward(weft_module *m, weft_var *const *in, int nin, weft_var **out,
                                       int nout);
weft_status nn_rmsnorm_graph_forward(weft_module *m, weft_var *const *in, int nin, weft_var **out,
                                     int nout);
weft_status nn_seq_graph_forward(weft_module *m, weft_var *const *in, int nin, weft_var **out,
                                 int nout);
/* The eps of an RMSNorm module (layers.c). */
float nn_rmsnorm_eps(const weft_module *m);

/* -------------------------------------------------- constructors (impls) */

weft_status nn_linear_new(weft_mesh *mesh, const char *name, int64_t in, int64_t out,
                          float init_std, weft_module **m);
weft_status nn_embedding_new(weft_mesh *mesh, const char *name, int64_t num, int64_t dim,
                             float init_std, weft_module **m);
weft_status nn_feed_forward_new(weft_mesh *mesh, const char *name, int64_t dim, int64_t ffn,
                                float init_std, weft_module **m);

#endif
