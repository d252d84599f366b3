/* nn/graph.c — the autograd graph: vars, nodes, the buffer pool, backward,
 * and module boundaries (weft_module_call).
 *
 * The graph is a tape: nodes are appended in forward order and run in
 * reverse, which is a topological order of the data flow. A module call
 * appends a BEGIN node (its input after the pre-forward hooks) and an END
 * node (its output after the post-forward hooks) around the nodes of its
 * forward, so in backward END runs the pre-backward hooks before any node
 * of the module and BEGIN the post-backward hooks after all of them.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd_internal.h"

typedef struct pool_entry {
  weft_dtensor *dt;
  bool used;      /* handed out since the last reset */
  bool used_last; /* handed out in the step before */
} pool_entry;

struct weft_graph {
  weft_var **vars;
  int nvars, cap_vars;
  nn_node **nodes;
  int nnodes, cap_nodes;
  pool_entry *pool;
  int npool, cap_pool;
  bool training;
  bool grad_enabled;
  bool backward_done;
  uint64_t seed;
  int64_t step;
  int64_t op_index;
  int64_t batch_row0, batch_rows; /* weft_graph_set_batch_slice; rows 0: unset */
};

static weft_status grow(void **v, int *cap, int need, size_t elem) {
  if (need <= *cap) return WEFT_OK;
  int nc = *cap ? *cap * 2 : 64;
  while (nc < need) nc *= 2;
  void *p = realloc(*v, (size_t)nc * elem);
  if (!p) return weft_error(WEFT_ERR_OOM, "graph: out of memory");
  *v = p;
  *cap = nc;
  return WEFT_OK;
}

/* ---------------------------------------------------------------- create */

weft_status weft_graph_create(weft_graph **out) {
  if (!out) return weft_error(WEFT_ERR_INVALID, "graph_create: out is NULL");
  weft_graph *g = calloc(1, sizeof *g);
  if (!g) return weft_error(WEFT_ERR_OOM, "graph_create: out of memory");
  g->training = true;
  g->grad_enabled = true;
  *out = g;
  return WEFT_OK;
}

static void drop_step(weft_graph *g) {
  for (int i = 0; i < g->nvars; i++) free(g->vars[i]);
  for (int i = 0; i < g->nnodes; i++) free(g->nodes[i]);
  g->nvars = g->nnodes = 0;
  g->backward_done = false;
  g->op_index = 0;
}

void weft_graph_destroy(weft_graph *g) {
  if (!g) return;
  drop_step(g);
  for (int i = 0; i < g->npool; i++) weft_dtensor_destroy(g->pool[i].dt);
  free(g->pool);
  free(g->vars);
  free(g->nodes);
  free(g);
}

weft_status weft_graph_reset(weft_graph *g) {
  if (!g) return weft_error(WEFT_ERR_INVALID, "graph_reset: graph is NULL");
  drop_step(g);
  /* keep what this step used; free what two steps in a row did not use */
  int k = 0;
  for (int i = 0; i < g->npool; i++) {
    pool_entry e = g->pool[i];
    if (!e.used && !e.used_last) {
      weft_dtensor_destroy(e.dt);
      continue;
    }
    e.used_last = e.used;
    e.used = false;
    g->pool[k++] = e;
  }
  g->npool = k;
  g->step++;
  return WEFT_OK;
}

void weft_graph_set_training(weft_graph *g, bool training) {
  if (g) g->training = training;
}
weft_status weft_graph_set_batch_slice(weft_graph *g, int64_t row0, int64_t total_rows) {
  if (!g) return weft_error(WEFT_ERR_INVALID, "graph_set_batch_slice: graph is NULL");
  if (total_rows < 0 || row0 < 0 || (total_rows == 0 && row0 != 0) ||
      (total_rows > 0 && row0 >= total_rows))
    return weft_error(WEFT_ERR_INVALID,
                      "graph_set_batch_slice: row0 %lld is not a row of a batch of %lld rows",
                      (long long)row0, (long long)total_rows);
  g->batch_row0 = row0;
  g->batch_rows = total_rows;
  return WEFT_OK;
}

void nn_graph_batch_slice(const weft_graph *g, int64_t *row0, int64_t *total_rows) {
  *row0 = g->batch_row0;
  *total_rows = g->batch_rows;
}

void weft_graph_set_seed(weft_graph *g, uint64_t seed) {
  if (g) g->seed = seed;
}
void weft_graph_set_step(weft_graph *g, int64_t step) {
  if (g) g->step = step;
}
int64_t weft_graph_step(const weft_graph *g) { return g ? g->step : 0; }
void weft_graph_set_grad_enabled(weft_graph *g, bool enabled) {
  if (g) g->grad_enabled = enabled;
}
bool nn_graph_training(const weft_graph *g) { return g->training; }
uint64_t nn_graph_seed(const weft_graph *g) { return g->seed; }
int64_t nn_graph_step(const weft_graph *g) { return g->step; }
int64_t nn_graph_next_op_index(weft_graph *g) { return g->op_index++; }

/* ------------------------------------------------------------------ pool */

static bool same_key(const weft_dtensor *d, weft_mesh *mesh, weft_dtype dtype, int ndim,
                     const int64_t *shape, const weft_placement *pl) {
  if (weft_dtensor_mesh(d) != mesh) return false;
  const weft_dtensor_spec *s = weft_dtensor_get_spec(d);
  if (s->dtype != dtype || s->ndim != ndim) return false;
  for (int i = 0; i < ndim; i++)
    if (s->shape[i] != shape[i]) return false;
  return nn_pl_equal(s->placements, pl, s->mesh_ndim);
}

weft_status nn_graph_tensor(weft_graph *g, weft_mesh *mesh, weft_dtype dtype, int ndim,
                            const int64_t *shape, const weft_placement *pl, weft_dtensor **out) {
  for (int i = 0; i < g->npool; i++) {
    pool_entry *e = &g->pool[i];
    if (!e->used && same_key(e->dt, mesh, dtype, ndim, shape, pl)) {
      e->used = true;
      *out = e->dt;
      return WEFT_OK;
    }
  }
  WEFT_CHECK(grow((void **)&g->pool, &g->cap_pool, g->npool + 1, sizeof *g->pool));
  weft_dtensor *d;
  WEFT_CHECK(weft_dtensor_empty(mesh, dtype, ndim, shape, pl, weft_mesh_ndim(mesh), &d));
  g->pool[g->npool++] = (pool_entry){d, true, false};
  *out = d;
  return WEFT_OK;
}

/* Whether d is a buffer this graph handed out in this step. */
static bool pool_holds(const weft_graph *g, const weft_dtensor *d) {
  for (int i = 0; i < g->npool; i++)
    if (g->pool[i].dt == d) return g->pool[i].used;
  return false;
}

weft_status nn_graph_zeros(weft_graph *g, weft_mesh *mesh, weft_dtype dtype, int ndim,
                           const int64_t *shape, const weft_placement *pl, weft_dtensor **out) {
  WEFT_CHECK(nn_graph_tensor(g, mesh, dtype, ndim, shape, pl, out));
  weft_tensor *l = weft_dtensor_local(*out);
  if (weft_tensor_numel(l) > 0) WEFT_CHECK(weft_tensor_fill(l, 0.0));
  return WEFT_OK;
}

weft_status nn_graph_like(weft_graph *g, const weft_dtensor *x, const weft_placement *pl,
                          weft_dtensor **out) {
  const weft_dtensor_spec *s = weft_dtensor_get_spec(x);
  return nn_graph_tensor(g, weft_dtensor_mesh(x), s->dtype, s->ndim, s->shape,
                         pl ? pl : s->placements, out);
}

weft_status nn_graph_bring(weft_graph *g, const weft_dtensor *x, const weft_placement *to,
                           bool allow_partial, const weft_dtensor **use) {
  const weft_dtensor_spec *s = weft_dtensor_get_spec(x);
  if (nn_pl_equal(s->placements, to, s->mesh_ndim)) {
    *use = x;
    return WEFT_OK;
  }
  weft_dtensor *d;
  WEFT_CHECK(nn_graph_like(g, x, to, &d));
  weft_redistribute_opts o = WEFT_REDISTRIBUTE_OPTS_INIT;
  o.allow_partial = allow_partial;
  WEFT_CHECK(weft_dtensor_redistribute_into(x, d, &o));
  *use = d;
  return WEFT_OK;
}

/* ------------------------------------------------------------------ vars */

static weft_status var_push(weft_graph *g, weft_var **out) {
  WEFT_CHECK(grow((void **)&g->vars, &g->cap_vars, g->nvars + 1, sizeof *g->vars));
  weft_var *v = calloc(1, sizeof *v);
  if (!v) return weft_error(WEFT_ERR_OOM, "graph: out of memory");
  v->g = g;
  v->index = g->nvars;
  g->vars[g->nvars++] = v;
  *out = v;
  return WEFT_OK;
}

weft_status weft_graph_input(weft_graph *g, const weft_dtensor *t, bool requires_grad,
                             weft_var **out) {
  if (!g || !t || !out)
    return weft_error(WEFT_ERR_INVALID, "graph_input: graph, tensor or out is NULL");
  if (g->backward_done)
    return weft_error(WEFT_ERR_STATE, "graph_input: the graph ran backward; reset it first");
  weft_var *v;
  WEFT_CHECK(var_push(g, &v));
  v->value = t;
  v->requires_grad = requires_grad && g->grad_enabled && weft_dtype_is_float(weft_dtensor_dtype(t));
  v->keep_grad = v->requires_grad;
  *out = v;
  return WEFT_OK;
}

weft_var *weft_graph_param(weft_graph *g, weft_param *p) {
  if (!g || !p) {
    weft_error(WEFT_ERR_INVALID, "graph_param: graph or parameter is NULL");
    return NULL;
  }
  if (!p->data) {
    weft_error(WEFT_ERR_STATE, "parameter '%s' has no storage (init_weights or load first)",
               p->fqn);
    return NULL;
  }
  weft_var *v;
  if (var_push(g, &v) != WEFT_OK) return NULL;
  v->value = p->data;
  v->param = p;
  v->requires_grad = p->requires_grad && g->grad_enabled;
  return v;
}

weft_status nn_var_new(weft_graph *g, const weft_dtensor *value, nn_node *node, weft_var **out) {
  weft_var *v;
  WEFT_CHECK(var_push(g, &v));
  v->value = value;
  if (node) {
    if (node->nout >= NN_MAX_OUT)
      return weft_error(WEFT_ERR_INTERNAL, "%s: more than %d outputs", node->name, NN_MAX_OUT);
    node->out[node->nout++] = v;
    v->requires_grad = true;
  }
  *out = v;
  return WEFT_OK;
}

const weft_dtensor *weft_var_value(const weft_var *v) { return v ? nn_var_now(v) : NULL; }
const weft_dtensor *weft_var_grad(const weft_var *v) { return v ? v->grad : NULL; }
weft_graph *weft_var_graph(const weft_var *v) { return v ? v->g : NULL; }
bool weft_var_requires_grad(const weft_var *v) { return v && v->requires_grad; }
const weft_dtensor *nn_var_now(const weft_var *v) {
  return v->param && v->param->data ? v->param->data : v->value;
}

double weft_var_item(const weft_var *v) {
  if (!v) {
    weft_error(WEFT_ERR_INVALID, "var_item: var is NULL");
    return NAN;
  }
  const weft_dtensor *d = nn_var_now(v);
  const weft_dtensor_spec *s = weft_dtensor_get_spec(d);
  int64_t n = 1;
  for (int i = 0; i < s->ndim; i++) n *= s->shape[i];
  if (n != 1) {
    weft_error(WEFT_ERR_INVALID, "var_item: the var has %lld elements (1 needed)", (long long)n);
    return NAN;
  }
  weft_tensor *full = NULL;
  if (weft_dtensor_full_tensor(d, &full) != WEFT_OK) return NAN;
  weft_tensor *h = NULL;
  double r = NAN;
  if (weft_tensor_to(full, WEFT_CPU, &h) == WEFT_OK) {
    switch (h->dtype) {
      case WEFT_F32: r = *(const float *)h->data; break;
      case WEFT_F64: r = *(const double *)h->data; break;
      default: weft_error(WEFT_ERR_UNSUPPORTED, "var_item: dtype %s", weft_dtype_name(h->dtype));
    }
  }
  weft_tensor_destroy(h);
  weft_tensor_destroy(full);
  return r;
}

/* ----------------------------------------------------------------- nodes */

weft_graph *nn_node_graph(const nn_node *n) { return n->in[0] ? n->in[0]->g : n->out[0]->g; }

bool nn_node_wants(const nn_node *n, int i) {
  return i >= 0 && i < n->nin && n->in[i] && n->in[i]->requires_grad;
}

const weft_dtensor *nn_node_input(const nn_node *n, int i) {
  return n->in_used[i] ? n->in_used[i] : nn_var_now(n->in[i]);
}

static weft_status node_push(weft_graph *g, nn_node **out) {
  WEFT_CHECK(grow((void **)&g->nodes, &g->cap_nodes, g->nnodes + 1, sizeof *g->nodes));
  nn_node *n = calloc(1, sizeof *n);
  if (!n) return weft_error(WEFT_ERR_OOM, "graph: out of memory");
  g->nodes[g->nnodes++] = n;
  *out = n;
  return WEFT_OK;
}

weft_status nn_node_new(weft_graph *g, const char *name, weft_var *const *in, int nin,
                        const weft_dtensor *const *used, nn_backward_fn backward,
                        nn_node **out) {
  *out = NULL;
  if (nin > NN_MAX_IN) return weft_error(WEFT_ERR_INTERNAL, "%s: %d inputs", name, nin);
  if (!g->grad_enabled) return WEFT_OK;
  bool any = false;
  for (int i = 0; i < nin; i++) any = any || (in[i] && in[i]->requires_grad);
  if (!any) return WEFT_OK;
  if (g->backward_done)
    return weft_error(WEFT_ERR_STATE, "%s: the graph ran backward; reset it first", name);
  nn_node *n;
  WEFT_CHECK(node_push(g, &n));
  n->name = name;
  n->kind = NN_NODE_OP;
  n->nin = nin;
  for (int i = 0; i < nin; i++) {
    n->in[i] = in[i];
    /* a redistributed copy is kept; the var's own value is re-read */
    if (used && used[i] && in[i] && used[i] != in[i]->value) n->in_used[i] = used[i];
  }
  n->backward = backward;
  *out = n;
  return WEFT_OK;
}

/* ---------------------------------------------------------------- checks */

static void describe_vars(weft_var *const *in, int nin, char *buf, size_t cap) {
  size_t len = 0;
  buf[0] = 0;
  for (int i = 0; i < nin && len + 8 < cap; i++) {
    char d[384];
    if (!in[i]) snprintf(d, sizeof d, "(none)");
    else weft_dtensor_spec_describe(weft_dtensor_get_spec(nn_var_now(in[i])), d, sizeof d);
    int w = snprintf(buf + len, cap - len, "%s%s", i ? ", " : "", d);
    if (w < 0) break;
    len += (size_t)w;
    if (len >= cap) break;
  }
}

weft_status nn_op_error(weft_status code, const char *name, weft_var *const *in, int nin,
                        const char *fmt, ...) {
  char why[512], ins[1536];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, sizeof why, fmt, ap);
  va_end(ap);
  describe_vars(in, nin, ins, sizeof ins);
  return weft_error(code, "%s: %s (inputs: %s)", name, why, ins);
}

weft_status nn_check_f32_contig(const char *name, weft_var *const *in, int nin,
                                const weft_dtensor *d, const char *what) {
  if (weft_dtensor_dtype(d) != WEFT_F32)
    return nn_op_error(WEFT_ERR_UNSUPPORTED, name, in, nin, "%s is %s (f32 only)", what,
                       weft_dtype_name(weft_dtensor_dtype(d)));
  if (!weft_tensor_is_contiguous(weft_dtensor_local(d)))
    return nn_op_error(WEFT_ERR_INVALID, name, in, nin, "%s: local tensor not contiguous", what);
  return WEFT_OK;
}

weft_status nn_check_vars(const char *name, weft_var *const *in, int nin, weft_graph **g) {
  weft_graph *gg = NULL;
  const weft_dtensor_spec *s0 = NULL;
  for (int i = 0; i < nin; i++) {
    if (!in[i]) return weft_error(WEFT_ERR_INVALID, "%s: input %d is NULL", name, i);
    if (gg && in[i]->g != gg)
      return weft_error(WEFT_ERR_INVALID, "%s: inputs belong to different graphs", name);
    gg = in[i]->g;
    const weft_dtensor_spec *s = weft_dtensor_get_spec(nn_var_now(in[i]));
    if (s0) {
      bool same = s->mesh_ndim == s0->mesh_ndim;
      for (int d = 0; same && d < s->mesh_ndim; d++) same = s->mesh_shape[d] == s0->mesh_shape[d];
      if (!same)
        return nn_op_error(WEFT_ERR_INVALID, name, in, nin, "inputs live on meshes of different shapes");
    }
    s0 = s;
  }
  if (gg && gg->backward_done)
    return weft_error(WEFT_ERR_STATE, "%s: the graph ran backward; reset it first", name);
  if (g) *g = gg;
  return WEFT_OK;
}

weft_status nn_choose(const char *name, weft_var *const *in, int nin,
                      const weft_sharding_option *opts, int cap, const int *nopt,
                      bool allow_partial, weft_placement *targets, weft_placement *out_pl) {
  const weft_dtensor_spec *specs[WEFT_SHARDING_MAX_INPUTS] = {0};
  int k = 0;
  for (int i = 0; i < nin; i++)
    if (in[i]) {
      specs[i] = weft_dtensor_get_spec(nn_var_now(in[i]));
      k = specs[i]->mesh_ndim;
    }
  weft_status st = weft_sharding_choose(specs, nin, k, opts, cap, nopt, allow_partial, targets,
                                        out_pl);
  if (st != WEFT_OK) {
    char why[512];
    snprintf(why, sizeof why, "%s", weft_last_error());
    return nn_op_error(st, name, in, nin, "%s", why);
  }
  return WEFT_OK;
}

void nn_grad_placements(const weft_placement *out, const weft_placement *grad, int n,
                        weft_placement *want) {
  for (int i = 0; i < n; i++) {
    if (nn_is_r(out[i])) want[i] = nn_is_psum(grad[i]) ? grad[i] : nn_r();
    else if (out[i].kind == WEFT_PLACE_PARTIAL) want[i] = nn_r();
    else want[i] = out[i];
  }
}

/* -------------------------------------------------------------- backward */

/* Adds `d` (a grad of v's global shape) into what v has accumulated. */
static weft_status accumulate(weft_graph *g, weft_var *v, const weft_dtensor *d) {
  if (v->param) {
    weft_param *p = v->param;
    if (!p->requires_grad) return WEFT_OK;
    const weft_dtensor_spec *ds = weft_dtensor_get_spec(p->data);
    const weft_dtensor *use;
    WEFT_CHECK(nn_graph_bring(g, d, ds->placements, false, &use));
    weft_dtensor *gr;
    WEFT_CHECK(nn_grad_get(p->module, p, &gr));
    return weft_add(weft_dtensor_local(gr), weft_dtensor_local(gr), weft_dtensor_local(use));
  }
  if (!v->grad) {
    /* The grad is added into later, so it must be a graph buffer: an op's
     * backward hands one over (adopted as is); a hook's replacement, a
     * built-in layer's grad or the caller's tensor is copied into one. */
    if (pool_holds(g, d)) {
      v->grad = (weft_dtensor *)d;
      return WEFT_OK;
    }
    weft_dtensor *own;
    WEFT_CHECK(nn_graph_like(g, d, NULL, &own));
    WEFT_CHECK(weft_tensor_copy(weft_dtensor_local(own), weft_dtensor_local(d)));
    v->grad = own;
    return WEFT_OK;
  }
  const weft_dtensor *use;
  WEFT_CHECK(nn_graph_bring(g, d, weft_dtensor_placements(v->grad), true, &use));
  return weft_add(weft_dtensor_local(v->grad), weft_dtensor_local(v->grad),
                  weft_dtensor_local(use));
}

static weft_status run_node(weft_graph *g, nn_node *n) {
  const weft_dtensor *dout[NN_MAX_OUT] = {0};
  bool any = n->kind != NN_NODE_OP; /* module boundaries always run (their hooks) */
  for (int j = 0; j < n->nout; j++) {
    weft_var *o = n->out[j];
    if (!o->grad) continue;
    const weft_dtensor_spec *os = weft_dtensor_get_spec(o->value);
    weft_placement want[WEFT_MESH_MAX_DIMS];
    nn_grad_placements(os->placements, weft_dtensor_placements(o->grad), os->mesh_ndim, want);
    WEFT_CHECK(nn_graph_bring(g, o->grad, want, false, &dout[j]));
    any = true;
  }
  if (!any) return WEFT_OK;
  weft_dtensor *din[NN_MAX_IN] = {0};
  weft_status st = n->backward(n, dout, din);
  if (st != WEFT_OK) return weft_error_trace(st, n->name);
  for (int i = 0; i < n->nin; i++) {
    if (!din[i] || !nn_node_wants(n, i)) continue;
    st = accumulate(g, n->in[i], din[i]);
    if (st != WEFT_OK) return weft_error_trace(st, n->name);
  }
  /* outputs' grads are consumed (kept only where the user asked) */
  for (int j = 0; j < n->nout; j++)
    if (!n->out[j]->keep_grad) n->out[j]->grad = NULL;
  return WEFT_OK;
}

weft_status weft_backward_grad(weft_var *out, const weft_dtensor *grad) {
  if (!out || !grad) return weft_error(WEFT_ERR_INVALID, "backward: var or grad is NULL");
  weft_graph *g = out->g;
  if (g->backward_done)
    return weft_error(WEFT_ERR_STATE,
                      "backward: this graph already ran backward (once per forward; reset it)");
  const weft_dtensor_spec *vs = weft_dtensor_get_spec(out->value),
                          *gs = weft_dtensor_get_spec(grad);
  bool ok = vs->ndim == gs->ndim && vs->mesh_ndim == gs->mesh_ndim;
  for (int d = 0; ok && d < vs->ndim; d++) ok = vs->shape[d] == gs->shape[d];
  if (!ok) {
    char a[384], b[384];
    weft_dtensor_spec_describe(gs, a, sizeof a);
    weft_dtensor_spec_describe(vs, b, sizeof b);
    return weft_error(WEFT_ERR_INVALID, "backward: grad %s does not match the var %s", a, b);
  }
  if (!out->requires_grad)
    return weft_error(WEFT_ERR_INVALID,
                      "backward: the var does not require grad (no parameter or input with "
                      "requires_grad reaches it)");
  g->backward_done = true;
  WEFT_CHECK(accumulate(g, out, grad));
  for (int i = g->nnodes - 1; i >= 0; i--) WEFT_CHECK(run_node(g, g->nodes[i]));
  return WEFT_OK;
}

weft_status weft_backward(weft_var *loss) {
  if (!loss) return weft_error(WEFT_ERR_INVALID, "backward: loss is NULL");
  const weft_dtensor *v = loss->value;
  const weft_dtensor_spec *s = weft_dtensor_get_spec(v);
  int64_t n = 1;
  for (int i = 0; i < s->ndim; i++) n *= s->shape[i];
  if (n != 1)
    return weft_error(WEFT_ERR_INVALID,
                      "backward: the loss has %lld elements (one needed; use weft_backward_grad)",
                      (long long)n);
  weft_placement rep[WEFT_MESH_MAX_DIMS];
  for (int i = 0; i < s->mesh_ndim; i++) rep[i] = nn_r();
  weft_dtensor *one;
  WEFT_CHECK(nn_graph_tensor(loss->g, weft_dtensor_mesh(v), s->dtype, s->ndim, s->shape, rep,
                             &one));
  WEFT_CHECK(weft_tensor_fill(weft_dtensor_local(one), 1.0));
  return weft_backward_grad(loss, one);
}

/* ------------------------------------------------------- module boundaries */

static weft_status begin_backward(nn_node *n, const weft_dtensor *const *dout,
                                  weft_dtensor **din) {
  const weft_dtensor *t = dout[0];
  WEFT_CHECK(nn_module_hooks(n->module, WEFT_HOOK_POST_BACKWARD, &t));
  if (t && nn_node_wants(n, 0)) din[0] = (weft_dtensor *)t; /* copied by accumulate */
  for (int i = 1; i < n->nin && i < n->nout; i++)
    if (dout[i] && nn_node_wants(n, i)) din[i] = (weft_dtensor *)dout[i];
  return WEFT_OK;
}

static weft_status end_backward(nn_node *n, const weft_dtensor *const *dout, weft_dtensor **din) {
  weft_graph *g = nn_node_graph(n);
  const weft_dtensor *t = dout[0];
  if (!t && n->in[0] && n->in[0]->requires_grad) {
    weft_dtensor *z;
    WEFT_CHECK(nn_graph_zeros(g, weft_dtensor_mesh(n->out[0]->value),
                              weft_dtensor_dtype(n->out[0]->value),
                              weft_dtensor_ndim(n->out[0]->value),
                              weft_dtensor_shape(n->out[0]->value),
                              weft_dtensor_placements(n->out[0]->value), &z));
    t = z;
  }
  WEFT_CHECK(nn_module_hooks(n->module, WEFT_HOOK_PRE_BACKWARD, &t));
  if (t && nn_node_wants(n, 0)) din[0] = (weft_dtensor *)t;
  for (int i = 1; i < n->nin && i < n->nout; i++)
    if (dout[i] && nn_node_wants(n, i)) din[i] = (weft_dtensor *)dout[i];
  return WEFT_OK;
}

/* A boundary node: out[i] are new vars over values vals[i] (in[i]'s value
 * unless a hook replaced it). Recorded even when nothing requires grad so
 * that the module's backward hooks fire. */
static weft_status boundary(weft_graph *g, weft_module *m, nn_node_kind kind, weft_var *const *in,
                            int n, const weft_dtensor *val0, weft_var **out) {
  nn_node *node = NULL;
  if (g->grad_enabled) {
    WEFT_CHECK(node_push(g, &node));
    node->name = kind == NN_NODE_MODULE_BEGIN ? "module_begin" : "module_end";
    node->kind = kind;
    node->module = m;
    node->nin = n;
    for (int i = 0; i < n; i++) node->in[i] = in[i];
    node->backward = kind == NN_NODE_MODULE_BEGIN ? begin_backward : end_backward;
  }
  for (int i = 0; i < n; i++) {
    const weft_dtensor *val = i == 0 ? val0 : in[i]->value;
    if (node) {
      WEFT_CHECK(nn_var_new(g, val, node, &out[i]));
      out[i]->requires_grad = in[i]->requires_grad;
    } else {
      WEFT_CHECK(nn_var_new(g, val, NULL, &out[i]));
    }
  }
  return WEFT_OK;
}

/* A built-in layer without a graph forward: its forward and hand-written
 * backward (with its hooks) as one node. */
static weft_status legacy_backward(nn_node *n, const weft_dtensor *const *dout,
                                   weft_dtensor **din) {
  if (!dout[0]) return WEFT_OK;
  const weft_dtensor *dx = NULL;
  WEFT_CHECK(weft_module_backward(n->module, dout[0], &dx));
  if (dx && nn_node_wants(n, 0)) din[0] = (weft_dtensor *)dx; /* copied by accumulate */
  return WEFT_OK;
}

weft_status weft_module_call(weft_module *m, weft_var *const *in, int nin, weft_var **out,
                             int nout) {
  if (!m || !out || nin < 1 || nin > NN_MAX_IN || nout < 1 || nout > NN_MAX_OUT)
    return weft_error(WEFT_ERR_INVALID, "module_call: module, inputs (1..%d) or outputs (1..%d) bad",
                      NN_MAX_IN, NN_MAX_OUT);
  for (int j = 0; j < nout; j++) out[j] = NULL;
  weft_graph *g;
  WEFT_CHECK(nn_check_vars(m->fqn[0] ? m->fqn : m->name, in, nin, &g));
  if (m->running || m->in_graph_forward)
    return weft_error(WEFT_ERR_STATE, "module '%s' is already running (re-entered)", m->fqn);
  if (!m->ops->graph_forward) {
    if (nin != 1 || nout != 1)
      return weft_error(WEFT_ERR_INVALID, "module '%s' (%s) takes one input and one output",
                        m->fqn, weft_module_kind_name(m->kind));
    const weft_dtensor *y;
    WEFT_CHECK(weft_module_forward(m, in[0]->value, &y));
    /* one node for its hand-written backward: needed when the input or
     * a parameter inside wants a grad */
    nn_node *node = NULL;
    int np = 0;
    WEFT_CHECK(weft_module_parameters(m, NULL, 0, &np));
    if (g->grad_enabled && (in[0]->requires_grad || np > 0)) {
      WEFT_CHECK(node_push(g, &node));
      node->name = weft_module_kind_name(m->kind);
      node->nin = 1;
      node->in[0] = in[0];
      node->backward = legacy_backward;
      node->module = m;
    }
    return nn_var_new(g, y, node, &out[0]);
  }
  m->running = true;
  weft_status st;
  weft_var *inner_in[NN_MAX_IN] = {0}, *inner_out[NN_MAX_OUT] = {0};
  const weft_dtensor *x0 = in[0]->value;
  WEFT_CHECK_GOTO(nn_module_hooks(m, WEFT_HOOK_PRE_FORWARD, &x0), st, fail);
  WEFT_CHECK_GOTO(boundary(g, m, NN_NODE_MODULE_BEGIN, in, nin, x0, inner_in), st, fail);
  m->running = false; /* re-entry of m itself is caught by in_graph_forward */
  m->in_graph_forward = true;
  st = m->ops->graph_forward(m, inner_in, nin, inner_out, nout);
  m->in_graph_forward = false;
  m->running = true;
  if (st != WEFT_OK) goto fail;
  for (int j = 0; j < nout; j++)
    if (!inner_out[j]) {
      st = weft_error(WEFT_ERR_INTERNAL, "module '%s' left output %d unset", m->fqn, j);
      goto fail;
    }
  const weft_dtensor *y0 = inner_out[0]->value;
  WEFT_CHECK_GOTO(nn_module_hooks(m, WEFT_HOOK_POST_FORWARD, &y0), st, fail);
  WEFT_CHECK_GOTO(boundary(g, m, NN_NODE_MODULE_END, inner_out, nout, y0, out), st, fail);
  m->out_spec = *weft_dtensor_get_spec(y0);
  m->running = false;
  return WEFT_OK;
fail:
  m->running = false;
  m->in_graph_forward = false;
  return weft_error_trace(st, m->fqn[0] ? m->fqn : m->name);
}

weft_status weft_module_call1(weft_module *m, weft_var *in, weft_var **out) {
  return weft_module_call(m, &in, 1, out, 1);
}
