/* nn/graph.c — the autograd graph: vars, nodes, the buffer pool, backward,
 * and module boundaries (weft_module_call).
 *
 * The graph is a tape: nodes are appended in forward order and run in
 * reverse, which is a topological order of the data flow. A module call
 * appends a BEGIN node (its input after the pre-forward hooks) and an END
 * node (its output after the post-forward hooks) around the nodes of its
 * forward, so in backward END runs the pre-backward hooks before any node
 * of the module and BEGIN the post-backward hooks after all of them.
 * A checkpointed module (weft_module_set_checkpoint) keeps only BEGIN and
 * END; its END node rebuilds the nodes between in backward (see
 * "activation checkpointing" below).
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd_internal.h"

typedef struct pool_entry {
  weft_dtensor *dt;
  bool used;       /* handed out since the last reset (and not returned: checkpointing) */
  bool used_last;  /* handed out in the step before */
  uint64_t handed; /* g->hand_seq when last handed out (activation checkpointing) */
} pool_entry;

/* A view of a pool buffer's storage (nn_graph_view), destroyed at reset. */
typedef struct view_entry {
  weft_dtensor *view;
  const weft_dtensor *base; /* the pool buffer that owns the storage */
} view_entry;

/* RoPE cos/sin tables for positions [0, max_pos) on one mesh (and its
 * device), head dim and theta. One that a larger request superseded stays
 * until the next reset: this step's nodes may still read it. */
typedef struct rope_entry {
  weft_mesh *mesh;
  weft_device device;
  int64_t max_pos, hd;
  double theta;
  weft_dtensor *tab;
  bool stale;
} rope_entry;

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
  int64_t debug_seq;              /* WEFT_DEBUG: checks made in this step (debug_check) */
  int64_t batch_row0, batch_rows; /* weft_graph_set_batch_slice; rows 0: unset */
  uint64_t hand_seq;              /* pool hand-outs so far (activation checkpointing) */
  uint64_t hand_step0;            /* hand_seq at the last reset */
  int64_t bytes_now, bytes_peak;  /* local bytes of the buffers handed out now, and the most */
  weft_param **params;            /* the distinct parameters read this step (weft_graph_param) */
  int nparams, cap_params;
  rope_entry *ropes; /* RoPE tables kept across steps (nn_graph_rope_tables) */
  int nropes, cap_ropes;
  weft_tensor *widen_scratch; /* add_widened's f32 chunk, kept (on one device) */
  view_entry *views;          /* this step's views (nn_graph_view) */
  int nviews, cap_views;
};

static bool is_view_base(const weft_graph *g, const weft_dtensor *d);
static const weft_dtensor *view_base(const weft_graph *g, const weft_dtensor *d);

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
  for (int i = 0; i < g->nviews; i++) weft_dtensor_destroy(g->views[i].view);
  g->nviews = 0;
  for (int i = 0; i < g->nvars; i++) free(g->vars[i]);
  for (int i = 0; i < g->nnodes; i++) free(g->nodes[i]);
  g->nvars = g->nnodes = g->nparams = 0;
  g->backward_done = false;
  g->op_index = 0;
  g->debug_seq = 0;
}

void weft_graph_destroy(weft_graph *g) {
  if (!g) return;
  drop_step(g);
  for (int i = 0; i < g->npool; i++) weft_dtensor_destroy(g->pool[i].dt);
  for (int i = 0; i < g->nropes; i++) weft_dtensor_destroy(g->ropes[i].tab);
  free(g->ropes);
  free(g->pool);
  free(g->views);
  weft_tensor_destroy(g->widen_scratch);
  free(g->vars);
  free(g->nodes);
  free(g->params);
  free(g);
}

weft_status weft_graph_reset(weft_graph *g) {
  if (!g) return weft_error(WEFT_ERR_INVALID, "graph_reset: graph is NULL");
  drop_step(g);
  /* keep what this step used; free what two steps in a row did not use */
  int k = 0;
  for (int i = 0; i < g->npool; i++) {
    pool_entry e = g->pool[i];
    /* handed out this step, also when returned since (checkpointing) */
    bool used = e.used || e.handed >= g->hand_step0;
    if (!used && !e.used_last) {
      weft_dtensor_destroy(e.dt);
      continue;
    }
    e.used_last = used;
    e.used = false;
    g->pool[k++] = e;
  }
  g->npool = k;
  k = 0;
  for (int i = 0; i < g->nropes; i++) {
    if (g->ropes[i].stale)
      weft_dtensor_destroy(g->ropes[i].tab);
    else
      g->ropes[k++] = g->ropes[i];
  }
  g->nropes = k;
  g->hand_step0 = g->hand_seq;
  g->bytes_now = g->bytes_peak = 0;
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

static int64_t local_bytes(const weft_dtensor *d) {
  return (int64_t)weft_tensor_nbytes(weft_dtensor_local(d));
}

/* e is handed out now, or goes back to the pool (bytes_now, bytes_peak). */
static void pool_hand(weft_graph *g, pool_entry *e) {
  e->used = true;
  e->handed = g->hand_seq++;
  g->bytes_now += local_bytes(e->dt);
  if (g->bytes_now > g->bytes_peak) g->bytes_peak = g->bytes_now;
}
static void pool_return(weft_graph *g, pool_entry *e) {
  if (!e->used) return;
  e->used = false;
  g->bytes_now -= local_bytes(e->dt);
}

weft_status nn_graph_tensor(weft_graph *g, weft_mesh *mesh, weft_dtype dtype, int ndim,
                            const int64_t *shape, const weft_placement *pl, weft_dtensor **out) {
  for (int i = 0; i < g->npool; i++) {
    pool_entry *e = &g->pool[i];
    if (!e->used && same_key(e->dt, mesh, dtype, ndim, shape, pl)) {
      pool_hand(g, e);
      *out = e->dt;
      return WEFT_OK;
    }
  }
  WEFT_CHECK(grow((void **)&g->pool, &g->cap_pool, g->npool + 1, sizeof *g->pool));
  weft_dtensor *d;
  WEFT_CHECK(weft_dtensor_empty(mesh, dtype, ndim, shape, pl, weft_mesh_ndim(mesh), &d));
  pool_entry *e = &g->pool[g->npool++];
  *e = (pool_entry){d, false, false, 0};
  pool_hand(g, e);
  *out = d;
  return WEFT_OK;
}

weft_status nn_graph_rope_tables(weft_graph *g, weft_mesh *mesh, int64_t max_pos, int64_t hd,
                                 double theta, const weft_dtensor **tab, int64_t *tab_pos) {
  const weft_device dev = weft_mesh_device(mesh);
  rope_entry *have = NULL;
  for (int i = 0; i < g->nropes; i++) {
    rope_entry *e = &g->ropes[i];
    if (!e->stale && e->mesh == mesh && e->device == dev && e->hd == hd && e->theta == theta) {
      have = e;
      break;
    }
  }
  if (have && have->max_pos >= max_pos) {
    *tab = have->tab;
    *tab_pos = have->max_pos;
    return WEFT_OK;
  }
  /* grown at least twofold, so that positions that creep up one at a time
   * (generation) rebuild the tables only a logarithmic number of times */
  int64_t n = max_pos > 1 ? max_pos : 1;
  if (have && n < 2 * have->max_pos) n = 2 * have->max_pos;
  WEFT_CHECK(grow((void **)&g->ropes, &g->cap_ropes, g->nropes + 1, sizeof *g->ropes));
  weft_placement p[WEFT_MESH_MAX_DIMS];
  for (int i = 0; i < weft_mesh_ndim(mesh); i++) p[i] = nn_r();
  const int64_t floats = n * hd;
  weft_dtensor *d;
  WEFT_CHECK(weft_dtensor_empty(mesh, WEFT_F32, 1, &floats, p, weft_mesh_ndim(mesh), &d));
  float *cosb = weft_dtensor_local(d)->data;
  weft_status st = weft_backend_rope_tables(dev, cosb, cosb + n * (hd / 2), n, hd, theta);
  if (st != WEFT_OK) {
    weft_dtensor_destroy(d);
    return st;
  }
  if (have) have->stale = true;
  g->ropes[g->nropes++] = (rope_entry){mesh, dev, n, hd, theta, d, false};
  *tab = d;
  *tab_pos = n;
  return WEFT_OK;
}

int64_t weft_graph_bytes_in_use(const weft_graph *g) { return g ? g->bytes_now : 0; }
int64_t weft_graph_bytes_peak(const weft_graph *g) { return g ? g->bytes_peak : 0; }

void nn_graph_discard(weft_graph *g, const weft_dtensor *d) {
  if (is_view_base(g, d)) return; /* a view reads it until reset */
  for (int i = 0; i < g->npool; i++)
    if (g->pool[i].dt == d) {
      pool_return(g, &g->pool[i]);
      weft_dtensor_destroy(g->pool[i].dt);
      memmove(&g->pool[i], &g->pool[i + 1], sizeof *g->pool * (size_t)(g->npool - i - 1));
      g->npool--;
      return;
    }
}
void nn_graph_release(weft_graph *g, const weft_dtensor *d) {
  if (is_view_base(g, d)) return;
  for (int i = 0; i < g->npool; i++)
    if (g->pool[i].dt == d) {
      pool_return(g, &g->pool[i]);
      return;
    }
}

weft_status nn_graph_converted(weft_graph *g, const weft_dtensor *d, weft_dtype dtype,
                               weft_dtensor **out) {
  const weft_dtensor_spec *s = weft_dtensor_get_spec(d);
  WEFT_CHECK(
      nn_graph_tensor(g, weft_dtensor_mesh(d), dtype, s->ndim, s->shape, s->placements, out));
  return weft_tensor_copy(weft_dtensor_local(*out), weft_dtensor_local(d));
}

int nn_graph_nvars(const weft_graph *g) { return g->nvars; }
int nn_graph_nnodes(const weft_graph *g) { return g->nnodes; }
weft_var *nn_graph_var(const weft_graph *g, int i) { return g->vars[i]; }
nn_node *nn_graph_node(const weft_graph *g, int i) { return g->nodes[i]; }

/* Whether d is a buffer this graph handed out in this step. */
static bool pool_holds(const weft_graph *g, const weft_dtensor *d) {
  for (int i = 0; i < g->npool; i++)
    if (g->pool[i].dt == d) return g->pool[i].used;
  return false;
}

/* The pool buffer whose storage d shares when d is a view of this step,
 * else NULL. */
static const weft_dtensor *view_base(const weft_graph *g, const weft_dtensor *d) {
  for (int i = g->nviews - 1; i >= 0; i--)
    if (g->views[i].view == d) return g->views[i].base;
  return NULL;
}

/* Whether a view of this step shares d's storage. */
static bool is_view_base(const weft_graph *g, const weft_dtensor *d) {
  for (int i = 0; i < g->nviews; i++)
    if (g->views[i].base == d) return true;
  return false;
}

/* The buffer under x when x is a buffer of this step or a view of one
 * (NULL otherwise), with room for one more view entry. */
static weft_status view_room(weft_graph *g, const weft_dtensor *x, const weft_dtensor **base) {
  *base = pool_holds(g, x) ? x : view_base(g, x);
  if (*base) WEFT_CHECK(grow((void **)&g->views, &g->cap_views, g->nviews + 1, sizeof *g->views));
  return WEFT_OK;
}

weft_status nn_graph_view(weft_graph *g, const weft_dtensor *x, int ndim, const int64_t *shape,
                          const weft_placement *pl, weft_dtensor **out) {
  *out = NULL;
  const weft_dtensor *base;
  WEFT_CHECK(view_room(g, x, &base));
  if (!base) return WEFT_OK;
  /* a strided x whose elements no view can give in this shape: the
   * caller copies */
  weft_dtensor_spec spec;
  const weft_mesh *mesh = weft_dtensor_mesh(x);
  WEFT_CHECK(weft_dtensor_spec_init_mesh(&spec, mesh, pl, weft_mesh_ndim(mesh),
                                         weft_dtensor_dtype(x), ndim, shape));
  int me[WEFT_MESH_MAX_DIMS];
  for (int i = 0; i < weft_mesh_ndim(mesh); i++) me[i] = weft_mesh_coord(mesh, i);
  int64_t ls[WEFT_MAX_DIMS], st[WEFT_MAX_DIMS];
  WEFT_CHECK(weft_dtensor_spec_local_shape(&spec, me, ls, NULL, NULL));
  if (!weft_tensor_view_strides(weft_dtensor_local(x), ndim, ls, st)) return WEFT_OK;
  weft_dtensor *v;
  WEFT_CHECK(weft_dtensor_view(x, ndim, shape, pl, &v));
  g->views[g->nviews++] = (view_entry){v, base};
  *out = v;
  return WEFT_OK;
}

weft_status nn_graph_as_strided(weft_graph *g, const weft_dtensor *x, int ndim,
                                const int64_t *shape, const weft_placement *pl, int64_t offset,
                                const int64_t *strides, weft_dtensor **out) {
  *out = NULL;
  const weft_dtensor *base;
  WEFT_CHECK(view_room(g, x, &base));
  if (!base) return WEFT_OK;
  weft_dtensor *v;
  WEFT_CHECK(weft_dtensor_as_strided(x, ndim, shape, pl, offset, strides, &v));
  g->views[g->nviews++] = (view_entry){v, base};
  *out = v;
  return WEFT_OK;
}

const weft_dtensor *nn_graph_view_base(const weft_graph *g, const weft_dtensor *d) {
  return view_base(g, d);
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
  /* Two parameters must not share one storage (a `data` pointer assigned
   * from another parameter): each would get its own gradient and its own
   * optimizer step of the same numbers, and both would free it. Tying is
   * weft_module_tie_param: one parameter under two names. */
  bool seen = false;
  for (int i = 0; i < g->nparams && !seen; i++) {
    weft_param *q = g->params[i];
    if (q == p)
      seen = true;
    else if (q->data == p->data || (p->grad && q->grad == p->grad)) {
      weft_error(WEFT_ERR_INVALID,
                 "parameters '%s' and '%s' share one %s (a parameter's data was set to "
                 "another's): tie them with weft_module_tie_param instead",
                 q->fqn, p->fqn, q->data == p->data ? "storage" : "gradient");
      return NULL;
    }
  }
  if (!seen) {
    if (grow((void **)&g->params, &g->cap_params, g->nparams + 1, sizeof *g->params) != WEFT_OK)
      return NULL;
    g->params[g->nparams++] = p;
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
  if (v->param && v->param->data) return v->param->data;
  return v->contig ? v->contig : v->value;
}

weft_status nn_graph_packed(weft_graph *g, const weft_dtensor *d, const weft_dtensor **out) {
  *out = d;
  if (weft_tensor_is_contiguous(weft_dtensor_local(d))) return WEFT_OK;
  weft_dtensor *c;
  WEFT_CHECK(nn_graph_like(g, d, NULL, &c));
  WEFT_CHECK(weft_tensor_copy(weft_dtensor_local(c), weft_dtensor_local(d)));
  nn_count_copies(1);
  *out = c;
  return WEFT_OK;
}

weft_status nn_var_contig(weft_var *v) {
  if (v->contig || (v->param && v->param->data) || !v->value ||
      weft_tensor_is_contiguous(weft_dtensor_local(v->value)))
    return WEFT_OK;
  return nn_graph_packed(v->g, v->value, &v->contig);
}

/* ------------------------------------------------------ GEMM operands */

/* The stride of dims [a, b) of t collapsed into one (size-1 dims do not
 * count; 0 when no dim has more than one element), or -1 when no single
 * stride steps through them. t has no empty dim. */
static int64_t collapsed_stride(const weft_tensor *t, int a, int b) {
  int64_t st = 0, next = -1; /* next: the stride the next outer dim must have */
  for (int d = b - 1; d >= a; d--) {
    if (t->shape[d] == 1) continue;
    if (next >= 0 && t->strides[d] != next) return -1;
    if (next < 0) st = t->strides[d];
    next = t->strides[d] * t->shape[d];
  }
  return st;
}

bool nn_gemm_operand_of(const weft_tensor *t, int split, nn_gemm_operand *o) {
  o->data = t->data;
  o->rows = nn_prod(t->shape, 0, split);
  o->cols = nn_prod(t->shape, split, t->ndim);
  o->trans = false;
  o->ld = nn_ld(o->cols);
  if (o->rows == 0 || o->cols == 0) return true;
  const int64_t rs = collapsed_stride(t, 0, split), cs = collapsed_stride(t, split, t->ndim);
  if (rs < 0 || cs < 0) return false;
  if (o->cols == 1 || cs == 1) { /* row-major, rows rs apart */
    if (o->rows == 1) return true;
    o->ld = rs;
    return rs >= o->cols;
  }
  if (o->rows == 1 || rs == 1) { /* column-major: its transpose row-major */
    o->trans = true;
    o->ld = o->cols == 1 ? nn_ld(o->rows) : cs;
    return o->ld >= o->rows;
  }
  return false;
}

weft_status nn_gemm_operand_packed(weft_graph *g, const weft_dtensor **d, nn_gemm_operand *o) {
  const weft_tensor *l = nn_local(*d);
  if (nn_gemm_operand_of(l, l->ndim - 1, o)) return WEFT_OK;
  WEFT_CHECK(nn_graph_packed(g, *d, d));
  l = nn_local(*d);
  if (!nn_gemm_operand_of(l, l->ndim - 1, o))
    return weft_error(WEFT_ERR_INTERNAL, "a packed operand is no GEMM operand");
  return WEFT_OK;
}

weft_status nn_var_gemm_ready(weft_var *v) {
  const weft_tensor *l = nn_local(nn_var_now(v));
  nn_gemm_operand o;
  if (l->ndim >= 1 && nn_gemm_operand_of(l, l->ndim - 1, &o)) return WEFT_OK;
  return nn_var_contig(v);
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
  /* a Replicate scalar on the host (a loss): read in place, no allocation */
  bool replicated = true;
  for (int i = 0; i < s->mesh_ndim; i++)
    replicated = replicated && s->placements[i].kind == WEFT_PLACE_REPLICATE;
  const weft_tensor *l = weft_dtensor_local(d);
  if (replicated && l->device == WEFT_CPU) {
    if (l->dtype == WEFT_F32) return *(const float *)l->data;
    if (l->dtype == WEFT_F64) return *(const double *)l->data;
  }
  weft_tensor *full = NULL;
  if (weft_dtensor_full_tensor(d, &full) != WEFT_OK) return NAN;
  weft_tensor *h = NULL;
  double r = NAN;
  if (weft_tensor_to(full, WEFT_CPU, &h) == WEFT_OK && !nn_scalar_load(h->dtype, h->data, &r))
    weft_error(WEFT_ERR_UNSUPPORTED, "var_item: dtype %s", weft_dtype_name(h->dtype));
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
                        const weft_dtensor *const *used, nn_backward_fn backward, nn_node **out) {
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

/* ------------------------------------------------- WEFT_DEBUG: SPMD check
 * With WEFT_DEBUG=1 (weft_settings.debug) every op and module call (from
 * nn_check_vars, before the op communicates) and every backward first
 * exchange a record of themselves over every dim of their mesh: the name,
 * the position among the graph's checks since reset, and the inputs'
 * dtypes, shapes and placements. A model whose ranks do not call the same
 * ops in the same order (a rank skips an op, calls another, or passes
 * other shapes) then fails on every rank with WEFT_ERR_MISMATCH naming the
 * ranks and both calls, instead of hanging in the op's collectives or
 * computing wrong numbers. Cost: one all-gather of a fixed-size record and
 * one all-reduce of the verdict per mesh dim; without WEFT_DEBUG one
 * branch. */

#define DBG_NAME 64
#define DBG_IN 4

typedef struct dbg_record {
  char name[DBG_NAME];
  int64_t seq;
  int32_t nin, pad;
  struct {
    int32_t dtype, ndim, mesh_ndim, pad;
    int64_t shape[WEFT_MAX_DIMS];
    int32_t pl[WEFT_MESH_MAX_DIMS][4]; /* kind, dim, split factor, reduce op */
  } in[DBG_IN];
} dbg_record;

static void dbg_fill(dbg_record *r, const char *name, int64_t seq, weft_var *const *in, int nin) {
  memset(r, 0, sizeof *r);
  snprintf(r->name, sizeof r->name, "%s", name);
  r->seq = seq;
  r->nin = nin;
  for (int i = 0; i < nin && i < DBG_IN; i++) {
    if (!in[i]) continue;
    const weft_dtensor_spec *s = weft_dtensor_get_spec(nn_var_now(in[i]));
    r->in[i].dtype = (int32_t)s->dtype;
    r->in[i].ndim = s->ndim;
    r->in[i].mesh_ndim = s->mesh_ndim;
    for (int d = 0; d < s->ndim; d++) r->in[i].shape[d] = s->shape[d];
    for (int d = 0; d < s->mesh_ndim; d++) {
      r->in[i].pl[d][0] = (int32_t)s->placements[d].kind;
      r->in[i].pl[d][1] = s->placements[d].dim;
      r->in[i].pl[d][2] = s->placements[d].split_factor;
      r->in[i].pl[d][3] = (int32_t)s->placements[d].op;
    }
  }
}

/* "'gelu' (check #3 of the graph; inputs f32[2, 8] (S(0)), ...)" */
static void dbg_describe(const dbg_record *r, char *buf, size_t cap) {
  size_t len = (size_t)snprintf(buf, cap, "'%s' (check #%lld of the graph%s", r->name,
                                (long long)r->seq, r->nin > 0 ? "; inputs" : "");
  for (int i = 0; i < r->nin && i < DBG_IN && len < cap; i++) {
    char pl[256];
    weft_placement p[WEFT_MESH_MAX_DIMS];
    int mn = r->in[i].mesh_ndim < WEFT_MESH_MAX_DIMS ? r->in[i].mesh_ndim : WEFT_MESH_MAX_DIMS;
    for (int d = 0; d < mn; d++)
      p[d] = (weft_placement){(weft_placement_kind)r->in[i].pl[d][0], r->in[i].pl[d][1],
                              r->in[i].pl[d][2], (weft_reduce_op)r->in[i].pl[d][3]};
    weft_placements_describe(p, mn, pl, sizeof pl);
    len += (size_t)snprintf(buf + len, cap - len, "%s %s[", i ? "," : "",
                            weft_dtype_name((weft_dtype)r->in[i].dtype));
    for (int d = 0; d < r->in[i].ndim && d < WEFT_MAX_DIMS && len < cap; d++)
      len += (size_t)snprintf(buf + len, cap - len, "%s%lld", d ? ", " : "",
                              (long long)r->in[i].shape[d]);
    if (len < cap) len += (size_t)snprintf(buf + len, cap - len, "] %s", pl);
  }
  if (len < cap) snprintf(buf + len, cap - len, "%s)", r->nin > DBG_IN ? ", ..." : "");
}

/* Whether the root mesh's dim d is one of mesh's dims (by name). */
static bool dim_in_mesh(const weft_mesh *root, int d, const weft_mesh *mesh) {
  const char *name = weft_mesh_dim_name(root, d);
  for (int k = 0; k < weft_mesh_ndim(mesh); k++)
    if (strcmp(weft_mesh_dim_name(mesh, k), name) == 0) return true;
  return false;
}

/* The check of one call (see above); collective over the ROOT of the mesh
 * of the first non-NULL input, so that the ranks of other dims that share
 * collectives with this one (FSDP's dp dims under a TP model mesh) are
 * checked too: along the op's own mesh dims the whole record is compared,
 * along the other dims the name and position only (data-parallel ranks may
 * pass other shapes). */
static weft_status debug_check(weft_graph *g, const char *name, weft_var *const *in, int nin) {
  int64_t seq = g->debug_seq++;
  weft_mesh *mesh = NULL;
  for (int i = 0; i < nin && !mesh; i++)
    if (in[i]) mesh = weft_dtensor_mesh(nn_var_now(in[i]));
  weft_mesh *root = mesh ? weft_mesh_root(mesh) : NULL;
  if (!root || weft_mesh_size(root) <= 1) return WEFT_OK;
  const int nd = weft_mesh_ndim(root);
  int most = 1;
  for (int d = 0; d < nd; d++)
    if (weft_mesh_dim_size(root, d) > most) most = weft_mesh_dim_size(root, d);
  dbg_record mine, mine_call, theirs;
  dbg_fill(&mine, name, seq, in, nin);
  dbg_fill(&mine_call, name, seq, in, 0); /* name and position only */
  dbg_record *all = malloc((size_t)most * sizeof *all);
  if (!all) return weft_error(WEFT_ERR_OOM, "WEFT_DEBUG check of '%s'", name);
  int other = -1; /* world rank of the first rank found to differ */
  weft_status st = WEFT_OK;
  for (int d = 0; d < nd && st == WEFT_OK; d++) {
    int n = weft_mesh_dim_size(root, d);
    if (n <= 1) continue;
    const dbg_record *rec = dim_in_mesh(root, d, mesh) ? &mine : &mine_call;
    st = weft_all_gather(root, d, rec, all, (int64_t)sizeof mine, WEFT_U8, NULL);
    for (int j = 0; j < n && st == WEFT_OK && other < 0; j++) {
      if (memcmp(&all[j], rec, sizeof mine) == 0) continue;
      int c[WEFT_MESH_MAX_DIMS];
      for (int k = 0; k < nd; k++) c[k] = weft_mesh_coord(root, k);
      c[d] = j;
      other = weft_mesh_world_rank_of(root, c);
      theirs = all[j];
      if (rec == &mine_call) mine = mine_call; /* describe both alike */
    }
  }
  free(all);
  if (st != WEFT_OK) return weft_error_trace(st, name);
  int32_t bad = other >= 0;
  for (int d = 0; d < nd; d++)
    if (weft_mesh_dim_size(root, d) > 1)
      WEFT_CHECK(weft_all_reduce(root, d, &bad, &bad, 1, WEFT_I32, WEFT_OP_MAX, NULL));
  if (!bad) return WEFT_OK;
  char a[1536], b[1536];
  dbg_describe(&mine, a, sizeof a);
  if (other < 0)
    return weft_error(WEFT_ERR_MISMATCH,
                      "WEFT_DEBUG: the ranks of the mesh do not run the same ops (this rank, %d, "
                      "calls %s; the ranks that differ name each other)",
                      weft_world_rank(), a);
  dbg_describe(&theirs, b, sizeof b);
  return weft_error(WEFT_ERR_MISMATCH,
                    "WEFT_DEBUG: the ranks of the mesh do not run the same ops: rank %d calls %s "
                    "where rank %d calls %s (every rank must call the same ops in the same order "
                    "with the same shapes)",
                    weft_world_rank(), a, other, b);
}

/* ---------------------------------------------------------------- checks */

static void describe_vars(weft_var *const *in, int nin, char *buf, size_t cap) {
  size_t len = 0;
  buf[0] = 0;
  for (int i = 0; i < nin && len + 8 < cap; i++) {
    char d[384];
    if (!in[i])
      snprintf(d, sizeof d, "(none)");
    else
      weft_dtensor_spec_describe(weft_dtensor_get_spec(nn_var_now(in[i])), d, sizeof d);
    int w = snprintf(buf + len, cap - len, "%s%s", i ? ", " : "", d);
    if (w < 0) break;
    len += (size_t)w;
    if (len >= cap) break;
  }
}

weft_status nn_op_error_at(const char *func, weft_status code, const char *name,
                           weft_var *const *in, int nin, const char *fmt, ...) {
  char why[512], ins[1536];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, sizeof why, fmt, ap);
  va_end(ap);
  describe_vars(in, nin, ins, sizeof ins);
  return weft_error_at(code, func, "%s: %s (inputs: %s)", name, why, ins);
}

weft_status nn_check_f32_contig(const char *name, weft_var *const *in, int nin,
                                const weft_dtensor *d, const char *what) {
  return nn_check_kernel_contig(name, in, nin, d, what, WEFT_KERNEL_OP_COUNT);
}

weft_status nn_check_kernel_dtype(const char *name, weft_var *const *in, int nin,
                                  const weft_dtensor *d, const char *what, weft_kernel_op kop) {
  weft_dtype dt = weft_dtensor_dtype(d);
  if (dt != WEFT_F32 && !(dt != WEFT_F64 && kop < WEFT_KERNEL_OP_COUNT &&
                          weft_backend_takes_dtype(weft_dtensor_local(d)->device, kop, dt)))
    return nn_op_error(WEFT_ERR_UNSUPPORTED, name, in, nin, "%s is %s (f32 only)", what,
                       weft_dtype_name(dt));
  return WEFT_OK;
}

weft_status nn_check_kernel_contig(const char *name, weft_var *const *in, int nin,
                                   const weft_dtensor *d, const char *what, weft_kernel_op kop) {
  WEFT_CHECK(nn_check_kernel_dtype(name, in, nin, d, what, kop));
  if (!weft_tensor_is_contiguous(weft_dtensor_local(d)))
    return nn_op_error(WEFT_ERR_INVALID, name, in, nin, "%s: local tensor not contiguous", what);
  return WEFT_OK;
}

weft_status nn_check_vars(const char *name, weft_var *const *in, int nin, weft_graph **g) {
  WEFT_CHECK(nn_check_vars_views(name, in, nin, g));
  for (int i = 0; i < nin; i++) WEFT_CHECK(nn_var_contig(in[i]));
  return WEFT_OK;
}

weft_status nn_check_vars_views(const char *name, weft_var *const *in, int nin, weft_graph **g) {
  weft_graph *gg = NULL;
  const weft_dtensor_spec *s0 = NULL;
  const weft_mesh *m0 = NULL;
  for (int i = 0; i < nin; i++) {
    if (!in[i]) return weft_error(WEFT_ERR_INVALID, "%s: input %d is NULL", name, i);
    if (gg && in[i]->g != gg)
      return weft_error(WEFT_ERR_INVALID, "%s: inputs belong to different graphs", name);
    gg = in[i]->g;
    const weft_dtensor *v = nn_var_now(in[i]);
    const weft_dtensor_spec *s = weft_dtensor_get_spec(v);
    const weft_mesh *m = weft_dtensor_mesh(v);
    if (s0) {
      bool same = s->mesh_ndim == s0->mesh_ndim;
      for (int d = 0; same && d < s->mesh_ndim; d++) same = s->mesh_shape[d] == s0->mesh_shape[d];
      if (!same)
        return nn_op_error(WEFT_ERR_INVALID, name, in, nin,
                           "inputs live on meshes of different shapes");
      /* same shape is not enough: the tp and dp sub-meshes of a 2x2 mesh
       * have one shape but hold other ranks */
      if (!weft_mesh_same_ranks(m, m0)) {
        char a[192], b[192];
        weft_mesh_describe(m0, a, sizeof a);
        weft_mesh_describe(m, b, sizeof b);
        return nn_op_error(WEFT_ERR_INVALID, name, in, nin,
                           "inputs live on different meshes: input 0 on %s, input %d on %s "
                           "(redistribute one onto the other's mesh first)",
                           a, i, b);
      }
    } else {
      m0 = m;
    }
    s0 = s;
  }
  if (gg && gg->backward_done)
    return weft_error(WEFT_ERR_STATE, "%s: the graph ran backward; reset it first", name);
  if (gg && weft_get_settings()->debug) WEFT_CHECK(debug_check(gg, name, in, nin));
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
  weft_status st =
      weft_sharding_choose(specs, nin, k, opts, cap, nopt, allow_partial, targets, out_pl);
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
    if (nn_is_r(out[i]))
      want[i] = nn_is_psum(grad[i]) ? grad[i] : nn_r();
    else if (out[i].kind == WEFT_PLACE_PARTIAL)
      want[i] = nn_r();
    else
      want[i] = out[i];
  }
}

/* -------------------------------------------------------------- backward */

/* Elements per chunk of add_widened: 256 KiB of f32, cache-resident. */
#define WIDEN_CHUNK ((int64_t)1 << 16)

/* acc (f32) += src (bf16 / f16, as many elements), both contiguous: src is
 * widened a chunk at a time into the graph's kept scratch and added. The
 * sums are those of a whole widened copy (each element is widened exactly
 * and added once), without that copy: a pool buffer of the parameter's
 * size in f32 per 16-bit parameter per step, as much memory as the f32
 * model. Device work is in stream order, so reusing the scratch per chunk
 * is safe there too. */
static weft_status add_widened(weft_graph *g, weft_tensor *acc, const weft_tensor *src) {
  const int64_t n = weft_tensor_numel(acc);
  if (weft_tensor_numel(src) != n || !weft_tensor_is_contiguous(acc) ||
      !weft_tensor_is_contiguous(src) || acc->dtype != WEFT_F32)
    return weft_error(WEFT_ERR_INTERNAL, "add_widened: %lld f32 elements += %lld %s (contiguous)",
                      (long long)n, (long long)weft_tensor_numel(src), weft_dtype_name(src->dtype));
  if (n == 0) return WEFT_OK;
  const int64_t chunk = n < WIDEN_CHUNK ? n : WIDEN_CHUNK;
  weft_tensor *s = g->widen_scratch; /* always WIDEN_CHUNK elements */
  if (s && s->device != acc->device) {
    weft_tensor_destroy(s);
    s = g->widen_scratch = NULL;
  }
  if (!s) {
    const int64_t shape[1] = {WIDEN_CHUNK};
    WEFT_CHECK(weft_tensor_create(WEFT_F32, acc->device, 1, shape, &g->widen_scratch));
    s = g->widen_scratch;
  }
  const size_t es = weft_dtype_size(src->dtype);
  for (int64_t at = 0; at < n; at += chunk) {
    const int64_t m[1] = {n - at < chunk ? n - at : chunk};
    weft_tensor a, b, w;
    WEFT_CHECK(
        weft_tensor_view_init(&a, (float *)acc->data + at, WEFT_F32, acc->device, 1, m, NULL));
    WEFT_CHECK(weft_tensor_view_init(&b, (char *)src->data + (size_t)at * es, src->dtype,
                                     src->device, 1, m, NULL));
    WEFT_CHECK(weft_tensor_view_init(&w, s->data, WEFT_F32, s->device, 1, m, NULL));
    WEFT_CHECK(weft_tensor_copy(&w, &b));
    WEFT_CHECK(weft_add(&a, &a, &w));
  }
  return WEFT_OK;
}

/* Adds `d` (a grad of v's global shape) into what v has accumulated.
 * shared: d is also handed to another var or kept as an output's grad, so
 * it may be adopted as v's grad but never added into in place. */
static weft_status accumulate(weft_graph *g, weft_var *v, const weft_dtensor *d, bool shared) {
  if (v->param) {
    weft_param *p = v->param;
    if (!p->requires_grad) return WEFT_OK;
    const weft_dtensor_spec *ds = weft_dtensor_get_spec(p->data);
    const weft_dtensor *use;
    WEFT_CHECK(nn_graph_bring(g, d, ds->placements, false, &use));
    weft_dtensor *gr;
    WEFT_CHECK(nn_grad_get(p->module, p, &gr));
    const weft_dtype gdt = weft_dtensor_dtype(gr), udt = weft_dtensor_dtype(use);
    if (gdt == WEFT_F32 && (udt == WEFT_BF16 || udt == WEFT_F16)) { /* a 16-bit parameter's grad */
      WEFT_CHECK(nn_graph_packed(g, use, &use)); /* a view (transpose's backward) */
      return add_widened(g, weft_dtensor_local(gr), weft_dtensor_local(use));
    }
    if (udt != gdt) {
      weft_dtensor *c;
      WEFT_CHECK(nn_graph_converted(g, use, gdt, &c));
      use = c;
    }
    return weft_add(weft_dtensor_local(gr), weft_dtensor_local(gr), weft_dtensor_local(use));
  }
  weft_dtype want = weft_dtensor_dtype(nn_var_now(v));
  if (weft_dtensor_dtype(d) != want && weft_dtype_is_float(want)) {
    /* a grad from a hook's cast (FSDP's cast_forward_inputs): the var's dtype */
    weft_dtensor *c;
    WEFT_CHECK(nn_graph_converted(g, d, want, &c));
    d = c;
  }
  if (!v->grad) {
    /* The grad is added into later, so it must be a graph buffer: an op's
     * backward hands one over (adopted as is); a hook's replacement, a
     * built-in layer's grad or the caller's tensor is copied into one. A
     * view of a buffer (reshape's backward) is adopted as shared: its
     * storage may also be another var's grad, so a second contribution
     * goes out of place. */
    const bool view = view_base(g, d) != NULL;
    if (view || pool_holds(g, d)) {
      v->grad = (weft_dtensor *)d;
      /* a base of views (split's backward returns the buffer its pieces'
       * grads are column slices of) is read through them too */
      v->grad_shared = shared || view || is_view_base(g, d);
      return WEFT_OK;
    }
    weft_dtensor *own;
    WEFT_CHECK(nn_graph_like(g, d, NULL, &own));
    WEFT_CHECK(weft_tensor_copy(weft_dtensor_local(own), weft_dtensor_local(d)));
    v->grad = own;
    v->grad_shared = false;
    return WEFT_OK;
  }
  const weft_dtensor *use;
  WEFT_CHECK(nn_graph_bring(g, d, weft_dtensor_placements(v->grad), true, &use));
  if (v->grad_shared) { /* out of place: the sum in a buffer of v's own */
    weft_dtensor *own;
    WEFT_CHECK(nn_graph_like(g, v->grad, NULL, &own));
    WEFT_CHECK(
        weft_add(weft_dtensor_local(own), weft_dtensor_local(v->grad), weft_dtensor_local(use)));
    v->grad = own;
    v->grad_shared = false;
    return WEFT_OK;
  }
  return weft_add(weft_dtensor_local(v->grad), weft_dtensor_local(v->grad),
                  weft_dtensor_local(use));
}

typedef struct release_cand {
  const weft_dtensor *dt;
  int idx;
  bool keep;
} release_cand;

static int release_cand_cmp(const void *a, const void *b) {
  uintptr_t x = (uintptr_t)((const release_cand *)a)->dt,
            y = (uintptr_t)((const release_cand *)b)->dt;
  return x < y ? -1 : x > y;
}

/* The live views of a release (those whose base is still a buffer),
 * sorted by view: each reference resolves in a binary search, not a scan
 * of the graph's view list. */
typedef struct release_scan {
  release_cand *c; /* the candidates, sorted by buffer */
  int n;
  view_entry *views; /* sorted by view */
  int nviews;
} release_scan;

static int view_entry_cmp(const void *a, const void *b) {
  uintptr_t x = (uintptr_t)((const view_entry *)a)->view,
            y = (uintptr_t)((const view_entry *)b)->view;
  return x < y ? -1 : x > y;
}

static release_cand *release_find(const release_scan *r, const weft_dtensor *d) {
  release_cand key = {d, 0, false};
  return bsearch(&key, r->c, (size_t)r->n, sizeof *r->c, release_cand_cmp);
}

/* Keeps d, and the buffer under d when d is a view. */
static void release_keep(const release_scan *r, const weft_dtensor *d) {
  if (!d) return;
  view_entry key = {(weft_dtensor *)d, NULL};
  const view_entry *v = bsearch(&key, r->views, (size_t)r->nviews, sizeof key, view_entry_cmp);
  release_cand *hit = release_find(r, v ? v->base : d);
  if (hit) hit->keep = true;
}

/* Returns to the pool every buffer handed out since `since` that no var
 * (value, contiguous copy, grad) or node whose backward is still to run
 * (saved, redistributed input) of g refers to, directly or through a view;
 * the views of a returned buffer are dead and forgotten as views (they
 * stay allocated until reset). Activation checkpointing calls it after a
 * forward it dropped, backward after each node: a consumed grad, a
 * redistributed copy, a temporary, and what the node saved (statistics,
 * masks, moved inputs: not a var's value) go back at once, so the grads of
 * the next nodes reuse them. */
static weft_status release_unreferenced(weft_graph *g, uint64_t since) {
  int n = 0, nv = 0;
  for (int i = 0; i < g->npool; i++) n += g->pool[i].used && g->pool[i].handed >= since;
  if (n == 0) return WEFT_OK;
  for (int v = 0; v < g->nviews; v++) nv += g->views[v].base != NULL;
  release_scan r = {malloc((size_t)n * sizeof *r.c), 0, malloc((size_t)(nv + 1) * sizeof *r.views),
                    0};
  if (!r.c || !r.views) {
    free(r.c);
    free(r.views);
    return weft_error(WEFT_ERR_OOM, "backward: out of memory");
  }
  for (int i = 0; i < g->npool; i++)
    if (g->pool[i].used && g->pool[i].handed >= since)
      r.c[r.n++] = (release_cand){g->pool[i].dt, i, false};
  qsort(r.c, (size_t)r.n, sizeof *r.c, release_cand_cmp);
  for (int v = 0; v < g->nviews; v++)
    if (g->views[v].base) r.views[r.nviews++] = g->views[v];
  qsort(r.views, (size_t)r.nviews, sizeof *r.views, view_entry_cmp);
  for (int i = 0; i < g->nvars; i++) {
    release_keep(&r, g->vars[i]->value);
    release_keep(&r, g->vars[i]->contig);
    release_keep(&r, g->vars[i]->grad);
  }
  for (int i = 0; i < g->nnodes; i++) {
    const nn_node *nd = g->nodes[i];
    if (nd->ran_backward) continue;
    for (int k = 0; k < NN_MAX_SAVED; k++) release_keep(&r, nd->saved[k]);
    for (int k = 0; k < NN_MAX_IN; k++) release_keep(&r, nd->in_used[k]);
  }
  for (int i = 0; i < r.n; i++)
    if (!r.c[i].keep) pool_return(g, &g->pool[r.c[i].idx]);
  for (int v = 0; v < g->nviews; v++) {
    const release_cand *b = g->views[v].base ? release_find(&r, g->views[v].base) : NULL;
    if (b && !b->keep) g->views[v].base = NULL;
  }
  free(r.c);
  free(r.views);
  return WEFT_OK;
}

/* Whether din[i] must stay unwritten after node n: handed to another input
 * too, or the grad an output keeps (keep_grad). */
static bool din_shared(const nn_node *n, weft_dtensor *const *din, int i) {
  for (int k = 0; k < n->nin; k++)
    if (k != i && din[k] == din[i] && nn_node_wants(n, k)) return true;
  for (int j = 0; j < n->nout; j++)
    if (n->out[j]->keep_grad && n->out[j]->grad == din[i]) return true;
  return false;
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
    /* most backwards read dout packed; a mixed node's widening (mixed.c)
     * packs its 16-bit grads itself, module boundaries pass them on */
    const weft_dtype gdt = weft_dtensor_dtype(dout[j]);
    if (n->kind == NN_NODE_OP && !n->reads_strided_grads &&
        !(n->mixed && (gdt == WEFT_BF16 || gdt == WEFT_F16)))
      WEFT_CHECK(nn_graph_packed(g, dout[j], &dout[j]));
    any = true;
  }
  if (!any) return WEFT_OK;
  if (n->kind == NN_NODE_OP) nn_count_ops(1);
  weft_dtensor *din[NN_MAX_IN] = {0};
  nn_mixed_bwd mb;
  weft_status st = n->mixed ? nn_mixed_backward_begin(n, dout, &mb) : WEFT_OK;
  if (st == WEFT_OK) st = n->backward(n, dout, din);
  if (n->mixed) st = nn_mixed_backward_end(n, st, din, &mb);
  if (st != WEFT_OK) return weft_error_trace(st, n->name);
  for (int i = 0; i < n->nin; i++) {
    if (!din[i] || !nn_node_wants(n, i)) continue;
    st = accumulate(g, n->in[i], din[i], din_shared(n, din, i));
    if (st != WEFT_OK) return weft_error_trace(st, n->name);
  }
  /* note: a boundary's backward hooks may have replaced the grad (TP moves
   * it back to the forward input's layout); accumulate copied it into a
   * buffer of the pool, so the replacement is dead now. Left to the module,
   * it would stay allocated until the hook runs again in the next step's
   * backward: one grad per hooked module, held through the next forward. */
  if (n->kind == NN_NODE_MODULE_BEGIN)
    nn_module_drop_replacements(n->module, WEFT_HOOK_POST_BACKWARD);
  else if (n->kind == NN_NODE_MODULE_END)
    nn_module_drop_replacements(n->module, WEFT_HOOK_PRE_BACKWARD);
  /* outputs' grads are consumed (kept only where the user asked), and
   * every buffer of this step that nothing refers to any more (this
   * node's saved and redistributed inputs now among them, unless a var's
   * value or a node still to run reads them) goes back to the pool for
   * the nodes still to run */
  for (int j = 0; j < n->nout; j++)
    if (!n->out[j]->keep_grad) n->out[j]->grad = NULL;
  n->ran_backward = true;
  return release_unreferenced(g, g->hand_step0);
}

static weft_status ac_backward(weft_graph *g, nn_node *end);

/* Runs nodes [lo, hi) in reverse; the END node of a checkpointed module
 * recomputes its forward first (ac_backward). */
static weft_status run_range(weft_graph *g, int lo, int hi) {
  for (int i = hi - 1; i >= lo; i--) {
    nn_node *n = g->nodes[i];
    WEFT_CHECK(n->ac_begin ? ac_backward(g, n) : run_node(g, n));
  }
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
  if (weft_get_settings()->debug) WEFT_CHECK(debug_check(g, "backward", &out, 1));
  g->backward_done = true;
  WEFT_CHECK(accumulate(g, out, grad, false));
  WEFT_CHECK(run_range(g, 0, g->nnodes));
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
  WEFT_CHECK(
      nn_graph_tensor(loss->g, weft_dtensor_mesh(v), s->dtype, s->ndim, s->shape, rep, &one));
  WEFT_CHECK(weft_tensor_fill(weft_dtensor_local(one), 1.0));
  WEFT_CHECK(weft_backward_grad(loss, one));
  return WEFT_OK;
}

/* ------------------------------------------------------- module boundaries */

static weft_status begin_backward(nn_node *n, const weft_dtensor *const *dout, weft_dtensor **din) {
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
    WEFT_CHECK(
        nn_graph_zeros(g, weft_dtensor_mesh(n->out[0]->value), weft_dtensor_dtype(n->out[0]->value),
                       weft_dtensor_ndim(n->out[0]->value), weft_dtensor_shape(n->out[0]->value),
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

/* ------------------------------------------------ activation checkpointing
 * weft_module_set_checkpoint(m, true) (torch.utils.checkpoint around a
 * module, torchtitan's per-block AC). weft_module_call(m) runs m's forward
 * as usual, then drops the vars and nodes that forward made (their
 * buffers go back to the pool, so the next module's ops reuse them) and
 * keeps m's BEGIN node (its outputs are the forward's inputs), the
 * outputs, and the state dropout keyed its masks by (op index at entry,
 * step, training). In backward, m's END node runs first (pre-backward
 * hooks: FSDP all-gathers m's parameters there), then m's forward runs
 * again on the same inputs from the same op index, so it records the same
 * nodes over the same values and draws the same masks, and the rebuilt
 * nodes run in reverse (then are dropped too); m's BEGIN node fires the
 * post-backward hooks after them. m's own forward hooks do not fire again
 * (FSDP's post-forward would reshard what its pre-backward gathered;
 * FSDP2's forward hooks do nothing in the pre-backward state either);
 * children run through weft_module_call, so their hooks fire again, as
 * they do in PyTorch's recompute. */

typedef struct ac_mark {
  bool on;
  nn_node *begin;
  int v0, n0;     /* vars and nodes the forward appends start here */
  uint64_t since; /* pool hand-outs from here on are the forward's */
  int64_t op_index;
} ac_mark;

/* Called right after m's BEGIN node was recorded. */
static ac_mark ac_mark_begin(weft_graph *g, weft_module *m) {
  ac_mark k = {0};
  if (!m->checkpoint || !g->grad_enabled || g->nnodes == 0) return k;
  k.on = true;
  k.begin = g->nodes[g->nnodes - 1];
  k.v0 = g->nvars;
  k.n0 = g->nnodes;
  k.since = g->hand_seq;
  k.op_index = g->op_index;
  return k;
}

/* Frees vars [v0, v1) except keep[0..nkeep) and nodes [n0, n1); the
 * lists close up (var indices renumbered). */
static void ac_drop(weft_graph *g, int v0, int v1, weft_var *const *keep, int nkeep, int n0,
                    int n1) {
  int k = v0;
  for (int i = v0; i < g->nvars; i++) {
    weft_var *v = g->vars[i];
    bool kept = i >= v1;
    for (int j = 0; !kept && j < nkeep; j++) kept = keep[j] == v;
    if (!kept) {
      free(v);
      continue;
    }
    v->index = k;
    g->vars[k++] = v;
  }
  g->nvars = k;
  k = n0;
  for (int i = n0; i < g->nnodes; i++) {
    if (i < n1)
      free(g->nodes[i]);
    else
      g->nodes[k++] = g->nodes[i];
  }
  g->nnodes = k;
}

/* Called after m's END node was recorded (the last node; its outputs the
 * last nout vars): drops the forward's vars and nodes but the outputs
 * inner_out (the END node's inputs) and marks the END node. */
static weft_status ac_forward_done(weft_graph *g, const ac_mark *k, weft_var *const *inner_out,
                                   int nout) {
  nn_node *end = g->nodes[g->nnodes - 1];
  if (end->kind != NN_NODE_MODULE_END || g->nvars - nout < k->v0)
    return weft_error(WEFT_ERR_INTERNAL, "activation checkpointing: END node not last");
  /* An output made inside whose value is not a graph buffer (a child's
   * hook replacement, freed when that hook runs again in the recompute)
   * is copied into one, so the outputs stay valid until reset. */
  for (int j = 0; j < nout; j++) {
    weft_var *v = inner_out[j];
    if (v->index < k->v0 || v->param || pool_holds(g, v->value)) continue;
    const weft_dtensor *old = v->value;
    weft_dtensor *own;
    WEFT_CHECK(nn_graph_like(g, old, NULL, &own));
    WEFT_CHECK(weft_tensor_copy(weft_dtensor_local(own), weft_dtensor_local(old)));
    for (int i = 0; i < end->nout; i++)
      if (end->out[i]->value == old) end->out[i]->value = own;
    v->value = own;
  }
  end->ac_begin = k->begin;
  end->ac_op_index = k->op_index;
  end->ac_step = g->step;
  end->ac_training = g->training;
  ac_drop(g, k->v0, g->nvars - nout, inner_out, nout, k->n0, g->nnodes - 1);
  return release_unreferenced(g, k->since);
}

/* Backward of a checkpointed module's END node (see above). */
static weft_status ac_backward(weft_graph *g, nn_node *end) {
  WEFT_CHECK(run_node(g, end)); /* pre-backward hooks; grads into the old outputs */
  weft_module *m = end->module;
  nn_node *b = end->ac_begin;
  const char *who = m->fqn[0] ? m->fqn : m->name;
  int v0 = g->nvars, n0 = g->nnodes, nout = end->nin;
  uint64_t since = g->hand_seq;
  int64_t op = g->op_index, step = g->step;
  bool training = g->training;
  g->op_index = end->ac_op_index;
  g->step = end->ac_step;
  g->training = end->ac_training;
  g->backward_done = false; /* ops record again */
  weft_var *outs[NN_MAX_OUT] = {0};
  m->in_graph_forward = true;
  weft_status st = m->ops->graph_forward(m, b->out, b->nout, outs, nout);
  m->in_graph_forward = false;
  g->backward_done = true;
  g->op_index = op;
  g->step = step;
  g->training = training;
  for (int j = 0; st == WEFT_OK && j < nout; j++) {
    weft_var *old = end->in[j], *nw = outs[j];
    if (!nw) {
      st = weft_error(WEFT_ERR_INTERNAL, "module '%s' left output %d unset", who, j);
      break;
    }
    const weft_dtensor_spec *a = weft_dtensor_get_spec(nn_var_now(old)),
                            *c = weft_dtensor_get_spec(nn_var_now(nw));
    bool same = a->dtype == c->dtype && a->ndim == c->ndim && a->mesh_ndim == c->mesh_ndim &&
                nn_pl_equal(a->placements, c->placements, a->mesh_ndim);
    for (int d = 0; same && d < a->ndim; d++) same = a->shape[d] == c->shape[d];
    if (!same) {
      char x[384], y[384];
      weft_dtensor_spec_describe(a, x, sizeof x);
      weft_dtensor_spec_describe(c, y, sizeof y);
      st = weft_error(WEFT_ERR_STATE,
                      "module '%s': the recomputed forward (activation checkpointing) gave "
                      "output %d as %s, the forward gave %s (the forward must be deterministic)",
                      who, j, y, x);
      break;
    }
    if (old == nw || !old->grad) continue;
    weft_dtensor *gr = old->grad;
    const bool shared = old->grad_shared;
    old->grad = NULL;
    old->grad_shared = false;
    if (nw->requires_grad) st = accumulate(g, nw, gr, shared);
  }
  if (st == WEFT_OK) st = run_range(g, n0, g->nnodes);
  ac_drop(g, v0, g->nvars, NULL, 0, n0, g->nnodes);
  if (st == WEFT_OK) st = release_unreferenced(g, since);
  if (st != WEFT_OK) return weft_error_trace(st, who);
  return WEFT_OK;
}

weft_status weft_module_set_checkpoint(weft_module *m, bool on) {
  if (!m) return weft_error(WEFT_ERR_INVALID, "module_set_checkpoint: module is NULL");
  if (!m->ops->graph_forward)
    return weft_error(WEFT_ERR_UNSUPPORTED,
                      "module_set_checkpoint: module '%s' (%s) has no graph forward to recompute",
                      m->fqn, weft_module_kind_name(m->kind));
  if (m->running || m->in_graph_forward)
    return weft_error(WEFT_ERR_STATE, "module_set_checkpoint: module '%s' is running", m->fqn);
  m->checkpoint = on;
  return WEFT_OK;
}

bool weft_module_checkpoint(const weft_module *m) { return m && m->checkpoint; }

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

bool weft_module_on_graph(const weft_module *m) {
  if (!m) return false;
  for (; m; m = m->parent)
    if (!m->ops || !m->ops->graph_forward) return false;
  return true;
}

weft_status weft_module_call(weft_module *m, weft_var *const *in, int nin, weft_var **out,
                             int nout) {
  if (!m || !out || nin < 1 || nin > NN_MAX_IN || nout < 1 || nout > NN_MAX_OUT)
    return weft_error(WEFT_ERR_INVALID,
                      "module_call: module, inputs (1..%d) or outputs (1..%d) bad", NN_MAX_IN,
                      NN_MAX_OUT);
  for (int j = 0; j < nout; j++) out[j] = NULL;
  if (m->magic != NN_MODULE_LIVE)
    return weft_error(WEFT_ERR_INVALID,
                      "module_call: the module was destroyed (weft_module_destroy)");
  weft_graph *g;
  WEFT_CHECK(nn_check_vars(m->fqn[0] ? m->fqn : m->name, in, nin, &g));
  if (m->running || m->in_graph_forward)
    return weft_error(WEFT_ERR_STATE, "module '%s' is already running (re-entered)", m->fqn);
  if (!m->ops->graph_forward) {
    if (nin != 1 || nout != 1)
      return weft_error(WEFT_ERR_INVALID, "module '%s' (%s) takes one input and one output", m->fqn,
                        weft_module_kind_name(m->kind));
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
    WEFT_CHECK(nn_var_new(g, y, node, &out[0]));
    return WEFT_OK;
  }
  m->running = true;
  weft_status st;
  weft_var *inner_in[NN_MAX_IN] = {0}, *inner_out[NN_MAX_OUT] = {0};
  const weft_dtensor *x0 = in[0]->value;
  WEFT_CHECK_GOTO(nn_module_hooks(m, WEFT_HOOK_PRE_FORWARD, &x0), st, fail);
  WEFT_CHECK_GOTO(boundary(g, m, NN_NODE_MODULE_BEGIN, in, nin, x0, inner_in), st, fail);
  ac_mark mark = ac_mark_begin(g, m);
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
  if (mark.on) WEFT_CHECK_GOTO(ac_forward_done(g, &mark, inner_out, nout), st, fail);
  m->out_spec = *weft_dtensor_get_spec(y0);
  m->running = false;
  return WEFT_OK;
fail:
  m->running = false;
  m->in_graph_forward = false;
  return weft_error_trace(st, m->fqn[0] ? m->fqn : m->name);
}

weft_status weft_module_call1(weft_module *m, weft_var *in, weft_var **out) {
  WEFT_CHECK(weft_module_call(m, &in, 1, out, 1));
  return WEFT_OK;
}
