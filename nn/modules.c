/* nn/modules.c — open modules: a user's module kind (weft_module_create),
 * parameters registered by name, tied (shared) parameters, and the graph
 * forwards of the built-in layers (linear with an optional bias,
 * embedding, RMSNorm, LayerNorm, sequential), written with ops. */
#include <stdlib.h>
#include <string.h>

#include "autograd_internal.h"

static char *dup_str(const char *s) {
  size_t n = strlen(s) + 1;
  char *d = malloc(n);
  if (d) memcpy(d, s, n);
  return d;
}

/* ------------------------------------------------------------ parameters */

weft_param *weft_module_get_param(const weft_module *m, const char *name) {
  if (!m || !name) return NULL;
  for (int i = 0; i < m->nparams; i++)
    if (strcmp(m->params[i]->name, name) == 0) return m->params[i];
  for (int i = 0; i < m->ntied; i++)
    if (strcmp(m->tied_names[i], name) == 0) return m->tied[i];
  return NULL;
}

int weft_module_num_tied(const weft_module *m) { return m ? m->ntied : 0; }

weft_param *weft_module_tied(const weft_module *m, int i, const char **name) {
  if (!m || i < 0 || i >= m->ntied) return NULL;
  if (name) *name = m->tied_names[i];
  return m->tied[i];
}

static weft_status name_free(const weft_module *m, const char *name, const char *what) {
  if (!name || !name[0] || strchr(name, '.'))
    return weft_error(WEFT_ERR_INVALID, "module '%s': bad %s name '%s' (non-empty, no dots)",
                      m->fqn, what, name ? name : "(null)");
  if (weft_module_get_param(m, name))
    return weft_error(WEFT_ERR_INVALID, "module '%s' already has a parameter '%s'",
                      m->fqn[0] ? m->fqn : m->name, name);
  for (int i = 0; i < m->nchildren; i++)
    if (strcmp(m->children[i]->name, name) == 0)
      return weft_error(WEFT_ERR_INVALID, "module '%s' already has a child '%s'",
                        m->fqn[0] ? m->fqn : m->name, name);
  return WEFT_OK;
}

weft_status weft_module_add_param(weft_module *m, const char *name, int ndim, const int64_t *shape,
                                  weft_param_init init, weft_param **out) {
  if (out) *out = NULL;
  if (!m) return weft_error(WEFT_ERR_INVALID, "add_param: module is NULL");
  WEFT_CHECK(name_free(m, name, "parameter"));
  if (ndim < 0 || ndim > WEFT_MAX_DIMS || (ndim > 0 && !shape))
    return weft_error(WEFT_ERR_INVALID, "module '%s': parameter '%s' has %d dims", m->fqn, name,
                      ndim);
  for (int d = 0; d < ndim; d++)
    if (shape[d] < 1)
      return weft_error(WEFT_ERR_INVALID, "module '%s': parameter '%s' has size %lld on dim %d",
                        m->fqn, name, (long long)shape[d], d);
  if (init.kind == WEFT_INIT_NORMAL && !(init.std >= 0))
    return weft_error(WEFT_ERR_INVALID, "module '%s': parameter '%s' init std %g", m->fqn, name,
                      (double)init.std);
  WEFT_CHECK(nn_param_add(m, name, ndim, shape, init, out));
  return WEFT_OK;
}

weft_status weft_module_tie_param(weft_module *m, const char *name, weft_param *shared) {
  if (!m || !shared) return weft_error(WEFT_ERR_INVALID, "tie_param: module or parameter is NULL");
  WEFT_CHECK(name_free(m, name, "tied parameter"));
  if (shared->module == m)
    return weft_error(WEFT_ERR_INVALID, "module '%s': '%s' is already its own parameter", m->fqn,
                      shared->fqn);
  const weft_mesh *a = m->mesh, *b = shared->module->mesh;
  bool same = weft_mesh_ndim(a) == weft_mesh_ndim(b);
  for (int i = 0; same && i < weft_mesh_ndim(a); i++)
    same = weft_mesh_dim_size(a, i) == weft_mesh_dim_size(b, i);
  if (!same)
    return weft_error(WEFT_ERR_INVALID,
                      "tie_param: '%s' lives on a mesh of another shape than "
                      "module '%s'",
                      shared->fqn, m->fqn);
  weft_param **t = realloc(m->tied, (size_t)(m->ntied + 1) * sizeof *t);
  if (!t) return weft_error(WEFT_ERR_OOM, "tie_param");
  m->tied = t;
  char **n = realloc(m->tied_names, (size_t)(m->ntied + 1) * sizeof *n);
  if (!n) return weft_error(WEFT_ERR_OOM, "tie_param");
  m->tied_names = n;
  char *d = dup_str(name);
  if (!d) return weft_error(WEFT_ERR_OOM, "tie_param");
  m->tied[m->ntied] = shared;
  m->tied_names[m->ntied] = d;
  m->ntied++;
  return WEFT_OK;
}

/* ------------------------------------------------------------- user kinds */

typedef struct custom_impl {
  weft_module_def def;
  void *ctx;
} custom_impl;

static weft_status custom_forward(weft_module *m, const weft_dtensor *in,
                                  const weft_dtensor **out) {
  (void)in;
  *out = NULL;
  return weft_error(WEFT_ERR_UNSUPPORTED,
                    "module '%s' (%s) is written with ops: run it in a graph (weft_module_call)",
                    m->fqn[0] ? m->fqn : m->name, ((custom_impl *)m->impl)->def.kind_name);
}

static weft_status custom_backward(weft_module *m, const weft_dtensor *dout,
                                   const weft_dtensor **din) {
  (void)dout;
  *din = NULL;
  return weft_error(WEFT_ERR_UNSUPPORTED, "module '%s': its backward runs in the graph", m->fqn);
}

static void custom_destroy(weft_module *m) {
  custom_impl *c = m->impl;
  if (c && c->def.destroy) c->def.destroy(c->ctx);
  free(c);
}

static weft_status custom_graph_forward(weft_module *m, weft_var *const *in, int nin,
                                        weft_var **out, int nout) {
  custom_impl *c = m->impl;
  return c->def.forward(m, c->ctx, in, nin, out, nout);
}

static const nn_ops custom_ops = {custom_forward, custom_backward, custom_destroy,
                                  custom_graph_forward};

weft_status weft_module_create(weft_mesh *mesh, const char *name, const weft_module_def *def,
                               void *ctx, weft_module **out) {
  if (out) *out = NULL;
  if (!mesh || !def || !def->forward || !out)
    return weft_error(WEFT_ERR_INVALID, "module_create: mesh, def, def->forward or out is NULL");
  custom_impl *c = calloc(1, sizeof *c);
  if (!c) return weft_error(WEFT_ERR_OOM, "module_create");
  c->def = *def;
  if (!c->def.kind_name) c->def.kind_name = "custom";
  c->def.destroy = NULL; /* on failure the caller keeps ctx */
  c->ctx = ctx;
  WEFT_CHECK(nn_module_new(mesh, WEFT_MODULE_CUSTOM, name, &custom_ops, c, out));
  c->def.destroy = def->destroy;
  return WEFT_OK;
}

void *weft_module_ctx(const weft_module *m) {
  if (!m || m->kind != WEFT_MODULE_CUSTOM) return NULL;
  return ((custom_impl *)m->impl)->ctx;
}

const char *weft_module_def_name(const weft_module *m) {
  if (!m) return "?";
  if (m->kind != WEFT_MODULE_CUSTOM) return weft_module_kind_name(m->kind);
  return ((custom_impl *)m->impl)->def.kind_name;
}

weft_var *weft_module_param_var(weft_module *m, weft_graph *g, const char *name) {
  weft_param *p = weft_module_get_param(m, name);
  if (!p) {
    weft_error(WEFT_ERR_NOT_FOUND, "module '%s' has no parameter '%s'",
               m ? (m->fqn[0] ? m->fqn : m->name) : "?", name ? name : "(null)");
    return NULL;
  }
  return weft_graph_param(g, p);
}

/* ---------------------------------------------------- built-in graph paths */

static weft_status one_in_out(const weft_module *m, int nin, int nout) {
  if (nin != 1 || nout != 1)
    return weft_error(WEFT_ERR_INVALID, "%s '%s' takes one input and one output (got %d, %d)",
                      weft_module_kind_name(m->kind), m->fqn, nin, nout);
  return WEFT_OK;
}

static weft_status param_var(weft_module *m, weft_graph *g, const char *name, weft_var **v) {
  *v = NULL;
  weft_param *p = weft_module_get_param(m, name);
  if (!p) return WEFT_OK;
  *v = weft_graph_param(g, p);
  if (!*v) return weft_error_trace(weft_last_status(), m->fqn);
  return WEFT_OK;
}

weft_status nn_linear_graph_forward(weft_module *m, weft_var *const *in, int nin, weft_var **out,
                                    int nout) {
  WEFT_CHECK(one_in_out(m, nin, nout));
  weft_graph *g = weft_var_graph(in[0]);
  weft_var *w, *b;
  WEFT_CHECK(param_var(m, g, "weight", &w));
  WEFT_CHECK(param_var(m, g, "bias", &b));
  return weft_op_linear(in[0], w, b, out);
}

weft_status nn_embedding_graph_forward(weft_module *m, weft_var *const *in, int nin, weft_var **out,
                                       int nout) {
  WEFT_CHECK(one_in_out(m, nin, nout));
  weft_var *w;
  WEFT_CHECK(param_var(m, weft_var_graph(in[0]), "weight", &w));
  return weft_op_embedding(in[0], w, out);
}

weft_status nn_rmsnorm_graph_forward(weft_module *m, weft_var *const *in, int nin, weft_var **out,
                                     int nout) {
  WEFT_CHECK(one_in_out(m, nin, nout));
  weft_var *w;
  WEFT_CHECK(param_var(m, weft_var_graph(in[0]), "weight", &w));
  return weft_op_rms_norm(in[0], w, nn_rmsnorm_eps(m), out);
}

weft_status nn_seq_graph_forward(weft_module *m, weft_var *const *in, int nin, weft_var **out,
                                 int nout) {
  WEFT_CHECK(one_in_out(m, nin, nout));
  weft_var *x = in[0];
  for (int i = 0; i < m->nchildren; i++) WEFT_CHECK(weft_module_call1(m->children[i], x, &x));
  *out = x;
  return WEFT_OK;
}

weft_status weft_linear_create_ex(weft_mesh *mesh, const char *name, int64_t in_features,
                                  int64_t out_features, bool bias, weft_module **out) {
  WEFT_CHECK(weft_linear_create(mesh, name, in_features, out_features, out));
  if (!bias) return WEFT_OK;
  weft_param_init zero = {WEFT_INIT_CONSTANT, 0, 0, 0};
  weft_status st = nn_param_add(*out, "bias", 1, &out_features, zero, NULL);
  if (st != WEFT_OK) {
    weft_module_destroy(*out);
    *out = NULL;
  }
  return st;
}

/* LayerNorm: graph only. */
typedef struct layernorm_impl {
  float eps;
} layernorm_impl;

static weft_status layernorm_legacy(weft_module *m, const weft_dtensor *in,
                                    const weft_dtensor **out) {
  (void)in;
  *out = NULL;
  return weft_error(WEFT_ERR_UNSUPPORTED, "layernorm '%s' runs in a graph (weft_module_call)",
                    m->fqn);
}
static weft_status layernorm_legacy_bwd(weft_module *m, const weft_dtensor *dout,
                                        const weft_dtensor **din) {
  (void)dout;
  *din = NULL;
  return weft_error(WEFT_ERR_UNSUPPORTED, "layernorm '%s' runs in a graph (weft_module_call)",
                    m->fqn);
}
static void layernorm_destroy(weft_module *m) { free(m->impl); }

static weft_status layernorm_graph_forward(weft_module *m, weft_var *const *in, int nin,
                                           weft_var **out, int nout) {
  WEFT_CHECK(one_in_out(m, nin, nout));
  weft_graph *g = weft_var_graph(in[0]);
  weft_var *w, *b;
  WEFT_CHECK(param_var(m, g, "weight", &w));
  WEFT_CHECK(param_var(m, g, "bias", &b));
  return weft_op_layer_norm(in[0], w, b, ((layernorm_impl *)m->impl)->eps, out);
}

static const nn_ops layernorm_ops = {layernorm_legacy, layernorm_legacy_bwd, layernorm_destroy,
                                     layernorm_graph_forward};

weft_status weft_layernorm_create(weft_mesh *mesh, const char *name, int64_t dim, float eps,
                                  bool bias, weft_module **out) {
  if (out) *out = NULL;
  if (!out) return weft_error(WEFT_ERR_INVALID, "layernorm_create: out is NULL");
  if (dim < 1 || !(eps > 0))
    return weft_error(WEFT_ERR_INVALID, "layernorm '%s': dim %lld and eps %g (need >= 1, > 0)",
                      name ? name : "?", (long long)dim, (double)eps);
  layernorm_impl *L = calloc(1, sizeof *L);
  if (!L) return weft_error(WEFT_ERR_OOM, "layernorm");
  L->eps = eps;
  WEFT_CHECK(nn_module_new(mesh, WEFT_MODULE_LAYERNORM, name, &layernorm_ops, L, out));
  weft_param_init one = {WEFT_INIT_CONSTANT, 0, 0, 1}, zero = {WEFT_INIT_CONSTANT, 0, 0, 0};
  weft_status st = nn_param_add(*out, "weight", 1, &dim, one, NULL);
  if (st == WEFT_OK && bias) st = nn_param_add(*out, "bias", 1, &dim, zero, NULL);
  if (st != WEFT_OK) {
    weft_module_destroy(*out);
    *out = NULL;
  }
  return st;
}
