/* nn/module.c — the module tree (names, FQNs, children, parameters), hooks,
 * the forward/backward dispatcher that runs them, parameter layout changes,
 * initialisation and loading. */
#include <stdlib.h>
#include <string.h>

#include "nn_internal.h"

/* ----------------------------------------------------------------- names */

static const char *const kind_names[WEFT_MODULE_KIND_COUNT] = {
    "container", "linear", "embedding", "rmsnorm",   "attention", "feed_forward",
    "block",     "loss",   "model",     "layernorm", "custom"};

const char *weft_module_kind_name(weft_module_kind kind) {
  if ((int)kind < 0 || kind >= WEFT_MODULE_KIND_COUNT) return "?";
  return kind_names[kind];
}

static char *dup_str(const char *s) {
  size_t n = strlen(s) + 1;
  char *d = malloc(n);
  if (d) memcpy(d, s, n);
  return d;
}

/* "<prefix>.<name>", or name when prefix is empty. */
static char *join_name(const char *prefix, const char *name) {
  size_t a = strlen(prefix), b = strlen(name);
  char *d = malloc(a + b + 2);
  if (!d) return NULL;
  if (a) {
    memcpy(d, prefix, a);
    d[a] = '.';
    memcpy(d + a + 1, name, b + 1);
  } else {
    memcpy(d, name, b + 1);
  }
  return d;
}

static weft_status check_name(const char *name) {
  if (!name) return weft_error(WEFT_ERR_INVALID, "name is NULL");
  if (!name[0]) return weft_error(WEFT_ERR_INVALID, "name is empty");
  if (strchr(name, '.'))
    return weft_error(WEFT_ERR_INVALID, "name '%s' contains '.' (FQNs join names with '.')", name);
  return WEFT_OK;
}

/* ---------------------------------------------------------- construction */

weft_status nn_module_new(weft_mesh *mesh, weft_module_kind kind, const char *name,
                          const nn_ops *ops, void *impl, weft_module **out) {
  weft_module *m = NULL;
  weft_status st = WEFT_OK;
  if (out) *out = NULL;
  if (!out) {
    st = weft_error(WEFT_ERR_INVALID, "out is NULL");
    goto fail;
  }
  if (!mesh) {
    st = weft_error(WEFT_ERR_INVALID, "mesh is NULL");
    goto fail;
  }
  WEFT_CHECK_GOTO(check_name(name), st, fail);
  m = calloc(1, sizeof *m);
  if (!m) {
    st = weft_error(WEFT_ERR_OOM, "module header");
    goto fail;
  }
  m->magic = NN_MODULE_LIVE;
  m->kind = kind;
  m->ops = ops;
  m->impl = impl;
  m->name = dup_str(name);
  m->fqn = dup_str("");
  m->next_hook_id = 1;
  if (!m->name || !m->fqn) {
    st = weft_error(WEFT_ERR_OOM, "module name");
    goto fail;
  }
  m->mesh = mesh;
  weft_mesh_retain(mesh);
  *out = m;
  return WEFT_OK;
fail:
  if (m) {
    free(m->name);
    free(m->fqn);
    free(m);
  }
  /* the impl is ours even on failure */
  if (ops && ops->destroy && impl) {
    weft_module tmp;
    memset(&tmp, 0, sizeof tmp);
    tmp.impl = impl;
    ops->destroy(&tmp);
  }
  return st;
}

static void param_free(weft_param *p) {
  if (!p) return;
  weft_dtensor_destroy(p->data);
  weft_dtensor_destroy(p->grad);
  if (p->mesh) weft_mesh_release(p->mesh);
  free((char *)p->fqn);
  free((char *)p->name);
  free(p);
}

/* Destroyed roots: emptied structs, kept (a handle kept by mistake then
 * still finds NN_MODULE_DEAD). */
static weft_module *destroyed_modules;

static void module_release(weft_module *m);

/* Frees m and its subtree. */
static void module_free(weft_module *m) {
  if (!m) return;
  module_release(m);
  free(m);
}

/* Frees what m holds (its subtree included), not m itself. */
static void module_release(weft_module *m) {
  for (int i = 0; i < m->nchildren; i++) module_free(m->children[i]);
  free(m->children);
  if (m->ops && m->ops->destroy) m->ops->destroy(m);
  for (int i = 0; i < m->nparams; i++) param_free(m->params[i]);
  free(m->params);
  for (int i = 0; i < m->ntied; i++) free(m->tied_names[i]);
  free(m->tied_names);
  free(m->tied);
  for (int k = 0; k < WEFT_HOOK_KIND_COUNT; k++) {
    for (int i = 0; i < m->owned[k].n; i++) weft_dtensor_destroy(m->owned[k].v[i]);
    free(m->owned[k].v);
  }
  free(m->hooks);
  weft_mesh_release(m->mesh);
  free(m->name);
  free(m->fqn);
}

/* Parameters of m's tree whose data (or grad) pointer was set to another
 * parameter's (see weft_graph_param): each shared DTensor is left to its
 * first holder, so module_free frees it once, and the status names the
 * two parameters. */
static weft_status unshare_storage(weft_module *m) {
  int n = 0;
  if (weft_module_parameters(m, NULL, 0, &n) != WEFT_OK || n < 2) return WEFT_OK;
  weft_param **ps = malloc((size_t)n * sizeof *ps);
  if (!ps) return WEFT_OK; /* no memory to look: free as before */
  weft_status st = WEFT_OK;
  if (weft_module_parameters(m, ps, n, &n) == WEFT_OK)
    for (int i = 1; i < n; i++)
      for (int j = 0; j < i; j++) {
        bool data = ps[i]->data && ps[i]->data == ps[j]->data;
        bool grad = ps[i]->grad && ps[i]->grad == ps[j]->grad;
        if (!data && !grad) continue;
        if (!st)
          st = weft_error(WEFT_ERR_INVALID,
                          "parameters '%s' and '%s' shared one %s (a parameter's data was set "
                          "to another's); freed once (tie parameters with "
                          "weft_module_tie_param)",
                          ps[j]->fqn, ps[i]->fqn, data ? "storage" : "gradient");
        if (data) ps[i]->data = NULL;
        if (grad) ps[i]->grad = NULL;
      }
  free(ps);
  return st;
}

void weft_module_retain(weft_module *m, const char *by) {
  if (!m) return;
  m->retains++;
  m->retained_by = by;
}
void weft_module_release(weft_module *m) {
  if (m && m->retains > 0) m->retains--;
}

/* The first module of m's subtree (m first, then its children in order)
 * that is retained, or NULL. */
static const weft_module *first_retained(const weft_module *m) {
  if (m->retains > 0) return m;
  for (int i = 0; i < m->nchildren; i++) {
    const weft_module *r = first_retained(m->children[i]);
    if (r) return r;
  }
  return NULL;
}

weft_status weft_module_destroy(weft_module *m) {
  if (!m) return WEFT_OK;
  if (m->magic == NN_MODULE_DEAD)
    return weft_error(WEFT_ERR_INVALID,
                      "weft_module_destroy: this module was already destroyed (twice?)");
  if (m->parent)
    return weft_error(WEFT_ERR_BUSY, "module '%s' belongs to '%s': destroy the root", m->fqn,
                      m->parent->fqn[0] ? m->parent->fqn : "(root)");
  if (m->running) return weft_error(WEFT_ERR_BUSY, "module '%s' is running", m->fqn);
  const weft_module *r = first_retained(m);
  if (r)
    return weft_error(WEFT_ERR_BUSY,
                      "module '%s' is still used by %s (retained %d time(s)): destroy that first "
                      "(for fully_shard: weft_fsdp_destroy_all on the root)",
                      r->fqn[0] ? r->fqn : r->name,
                      r->retained_by ? r->retained_by : "another object", r->retains);
  weft_status st = unshare_storage(m);
  module_release(m);
  *m = (weft_module){
      .magic = NN_MODULE_DEAD, .name = (char *)"(destroyed module)", .fqn = (char *)""};
  m->impl = destroyed_modules; /* the list of destroyed roots */
  destroyed_modules = m;
  return st;
}

/* Recomputes the FQNs of m's subtree below `prefix` (m's own FQN is
 * prefix.name, or name for an attached module whose parent is a root). */
static weft_status refqn(weft_module *m, const char *fqn) {
  char *f = dup_str(fqn);
  if (!f) return weft_error(WEFT_ERR_OOM, "FQN");
  free(m->fqn);
  m->fqn = f;
  for (int i = 0; i < m->nparams; i++) {
    char *pf = join_name(m->fqn, m->params[i]->name);
    if (!pf) return weft_error(WEFT_ERR_OOM, "FQN");
    free((char *)m->params[i]->fqn);
    m->params[i]->fqn = pf;
  }
  for (int i = 0; i < m->nchildren; i++) {
    char *cf = join_name(m->fqn, m->children[i]->name);
    if (!cf) return weft_error(WEFT_ERR_OOM, "FQN");
    weft_status st = refqn(m->children[i], cf);
    free(cf);
    WEFT_CHECK(st);
  }
  return WEFT_OK;
}

static bool same_mesh_shape(const weft_mesh *a, const weft_mesh *b) {
  int n = weft_mesh_ndim(a);
  if (n != weft_mesh_ndim(b)) return false;
  for (int i = 0; i < n; i++)
    if (weft_mesh_dim_size(a, i) != weft_mesh_dim_size(b, i)) return false;
  return true;
}

weft_status nn_module_attach(weft_module *parent, weft_module *child) {
  if (!parent || !child) return weft_error(WEFT_ERR_INVALID, "parent or child is NULL");
  if (child->parent)
    return weft_error(WEFT_ERR_INVALID, "module '%s' already has a parent", child->name);
  if (child == parent) return weft_error(WEFT_ERR_INVALID, "a module cannot contain itself");
  for (weft_module *a = parent; a; a = a->parent)
    if (a == child)
      return weft_error(WEFT_ERR_INVALID, "adding '%s' would make a cycle", child->name);
  for (int i = 0; i < parent->nchildren; i++)
    if (strcmp(parent->children[i]->name, child->name) == 0)
      return weft_error(WEFT_ERR_INVALID, "'%s' already has a child named '%s'",
                        parent->fqn[0] ? parent->fqn : parent->name, child->name);
  if (!same_mesh_shape(parent->mesh, child->mesh))
    return weft_error(WEFT_ERR_INVALID, "child '%s' is on a mesh of another shape than '%s'",
                      child->name, parent->name);
  if (parent->nchildren == parent->cap_children) {
    int cap = parent->cap_children ? 2 * parent->cap_children : 4;
    weft_module **c = realloc(parent->children, (size_t)cap * sizeof *c);
    if (!c) return weft_error(WEFT_ERR_OOM, "children");
    parent->children = c;
    parent->cap_children = cap;
  }
  char *f = join_name(parent->fqn, child->name);
  if (!f) return weft_error(WEFT_ERR_OOM, "FQN");
  weft_status st = refqn(child, f);
  free(f);
  WEFT_CHECK(st);
  parent->children[parent->nchildren++] = child;
  child->parent = parent;
  return WEFT_OK;
}

weft_status weft_module_add_child(weft_module *parent, weft_module *child) {
  if (!parent || !child) return weft_error(WEFT_ERR_INVALID, "parent or child is NULL");
  if (parent->kind != WEFT_MODULE_CONTAINER && parent->kind != WEFT_MODULE_CUSTOM)
    return weft_error(
        WEFT_ERR_INVALID, "'%s' is a %s: children can only be added to containers and user modules",
        parent->fqn[0] ? parent->fqn : parent->name, weft_module_kind_name(parent->kind));
  if (parent->running) return weft_error(WEFT_ERR_BUSY, "'%s' is running", parent->name);
  WEFT_CHECK(nn_module_attach(parent, child));
  return WEFT_OK;
}

weft_status nn_param_add(weft_module *m, const char *name, int ndim, const int64_t *shape,
                         weft_param_init init, weft_param **out) {
  WEFT_CHECK(check_name(name));
  weft_param *p = calloc(1, sizeof *p);
  if (!p) return weft_error(WEFT_ERR_OOM, "parameter");
  p->name = dup_str(name);
  p->fqn = join_name(m->fqn, name);
  p->module = m;
  p->requires_grad = true;
  p->init = init;
  p->mesh = m->mesh;
  weft_mesh_retain(m->mesh);
  weft_placement pl[WEFT_MESH_MAX_DIMS];
  int nd = weft_mesh_ndim(m->mesh);
  for (int i = 0; i < nd; i++) pl[i] = weft_replicate();
  weft_status st = WEFT_OK;
  if (!p->name || !p->fqn) st = weft_error(WEFT_ERR_OOM, "parameter name");
  if (!st) st = weft_dtensor_spec_init_mesh(&p->spec, m->mesh, pl, nd, WEFT_F32, ndim, shape);
  if (!st) {
    weft_param **ps = realloc(m->params, (size_t)(m->nparams + 1) * sizeof *ps);
    if (!ps)
      st = weft_error(WEFT_ERR_OOM, "parameters");
    else {
      m->params = ps;
      m->params[m->nparams++] = p;
    }
  }
  if (st) {
    param_free(p);
    return weft_error_trace(st, __func__);
  }
  if (out) *out = p;
  return WEFT_OK;
}

weft_status nn_param_data(const weft_module *m, const weft_param *p, const weft_dtensor **out) {
  if (!p->data)
    return weft_error(WEFT_ERR_STATE,
                      "parameter '%s' has no storage yet: call weft_module_init_weights, "
                      "weft_module_materialize or weft_param_load",
                      p->fqn);
  const weft_dtensor_spec *s = weft_dtensor_get_spec(p->data);
  if (s->dtype != WEFT_F32)
    return weft_error(WEFT_ERR_UNSUPPORTED, "parameter '%s' is %s; layers compute on f32", p->fqn,
                      weft_dtype_name(s->dtype));
  int nd = weft_mesh_ndim(m->mesh);
  bool ok = s->mesh_ndim == nd;
  for (int i = 0; ok && i < nd; i++) ok = s->mesh_shape[i] == weft_mesh_dim_size(m->mesh, i);
  if (!ok)
    return weft_error(WEFT_ERR_INVALID,
                      "parameter '%s' is on a mesh of another shape than module '%s' (at "
                      "forward, parameters must be on the model mesh)",
                      p->fqn, m->fqn);
  if (!weft_mesh_same_ranks(weft_dtensor_mesh(p->data), m->mesh)) {
    char a[192], b[192];
    weft_mesh_describe(weft_dtensor_mesh(p->data), a, sizeof a);
    weft_mesh_describe(m->mesh, b, sizeof b);
    return weft_error(WEFT_ERR_INVALID,
                      "parameter '%s' is on %s, but module '%s' is on %s (same shape, other "
                      "ranks; at forward, parameters must be on the model mesh)",
                      p->fqn, a, m->fqn, b);
  }
  if (s->ndim != p->spec.ndim)
    return weft_error(WEFT_ERR_INVALID, "parameter '%s' data has %d dims, expected %d", p->fqn,
                      s->ndim, p->spec.ndim);
  for (int d = 0; d < s->ndim; d++)
    if (s->shape[d] != p->spec.shape[d])
      return weft_error(WEFT_ERR_INVALID,
                        "parameter '%s' data has size %lld in dim %d, expected %lld", p->fqn,
                        (long long)s->shape[d], d, (long long)p->spec.shape[d]);
  if (!weft_tensor_is_contiguous(weft_dtensor_local(p->data)))
    return weft_error(WEFT_ERR_UNSUPPORTED, "parameter '%s' has a non-contiguous local shard",
                      p->fqn);
  *out = p->data;
  return WEFT_OK;
}

/* ------------------------------------------------------------ accessors */

weft_module_kind weft_module_get_kind(const weft_module *m) {
  return m ? m->kind : WEFT_MODULE_KIND_COUNT;
}
const char *weft_module_name(const weft_module *m) { return m ? m->name : ""; }
const char *weft_module_fqn(const weft_module *m) { return m ? m->fqn : ""; }
weft_module *weft_module_parent(const weft_module *m) { return m ? m->parent : NULL; }
weft_mesh *weft_module_mesh(const weft_module *m) { return m ? m->mesh : NULL; }
int weft_module_num_children(const weft_module *m) { return m ? m->nchildren : 0; }
weft_module *weft_module_child(const weft_module *m, int i) {
  return (m && i >= 0 && i < m->nchildren) ? m->children[i] : NULL;
}
int weft_module_num_params(const weft_module *m) { return m ? m->nparams : 0; }
weft_param *weft_module_param(const weft_module *m, int i) {
  return (m && i >= 0 && i < m->nparams) ? m->params[i] : NULL;
}

/* Walks the FQN relative to root, one name at a time. */
weft_status weft_module_find(weft_module *root, const char *rel, weft_module **out) {
  if (!root || !rel || !out) return weft_error(WEFT_ERR_INVALID, "NULL argument");
  *out = NULL;
  weft_module *m = root;
  const char *s = rel;
  while (*s) {
    const char *dot = strchr(s, '.');
    size_t len = dot ? (size_t)(dot - s) : strlen(s);
    weft_module *next = NULL;
    for (int i = 0; i < m->nchildren && !next; i++)
      if (strlen(m->children[i]->name) == len && strncmp(m->children[i]->name, s, len) == 0)
        next = m->children[i];
    if (!next) return weft_error(WEFT_ERR_NOT_FOUND, "no module '%s' under '%s'", rel, root->fqn);
    m = next;
    s += len;
    if (*s == '.') s++;
  }
  *out = m;
  return WEFT_OK;
}

weft_status weft_module_find_param(weft_module *root, const char *rel, weft_param **out) {
  if (!root || !rel || !out) return weft_error(WEFT_ERR_INVALID, "NULL argument");
  *out = NULL;
  const char *dot = strrchr(rel, '.');
  weft_module *m = root;
  const char *pname = rel;
  if (dot) {
    size_t len = (size_t)(dot - rel);
    char *mod = malloc(len + 1);
    if (!mod) return weft_error(WEFT_ERR_OOM, "name");
    memcpy(mod, rel, len);
    mod[len] = '\0';
    weft_status st = weft_module_find(root, mod, &m);
    free(mod);
    if (st) {
      weft_clear_error();
      return weft_error(WEFT_ERR_NOT_FOUND, "no parameter '%s' under '%s'", rel, root->fqn);
    }
    pname = dot + 1;
  }
  weft_param *p = weft_module_get_param(m, pname);
  if (p) {
    *out = p;
    return WEFT_OK;
  }
  return weft_error(WEFT_ERR_NOT_FOUND, "no parameter '%s' under '%s'", rel, root->fqn);
}

static void collect(weft_module *m, weft_param **out, int cap, int *n) {
  for (int i = 0; i < m->nparams; i++) {
    if (*n < cap) out[*n] = m->params[i];
    (*n)++;
  }
  for (int i = 0; i < m->nchildren; i++) collect(m->children[i], out, cap, n);
}

weft_status weft_module_parameters(weft_module *root, weft_param **out, int cap, int *count) {
  if (!root || !count) return weft_error(WEFT_ERR_INVALID, "NULL argument");
  if (cap > 0 && !out) return weft_error(WEFT_ERR_INVALID, "out is NULL with cap %d", cap);
  *count = 0;
  collect(root, out, cap < 0 ? 0 : cap, count);
  return WEFT_OK;
}

weft_status weft_module_visit(weft_module *root, weft_module_visit_fn fn, void *ctx) {
  if (!root || !fn) return weft_error(WEFT_ERR_INVALID, "NULL argument");
  WEFT_CHECK(fn(root, ctx));
  for (int i = 0; i < root->nchildren; i++)
    WEFT_CHECK(weft_module_visit(root->children[i], fn, ctx));
  return WEFT_OK;
}

/* ------------------------------------------------------------------ hooks */

weft_status weft_module_register_hook(weft_module *m, weft_hook_kind kind, weft_hook_fn fn,
                                      void *ctx, weft_hook_handle *handle) {
  if (!m || !fn) return weft_error(WEFT_ERR_INVALID, "module or fn is NULL");
  if ((int)kind < 0 || kind >= WEFT_HOOK_KIND_COUNT)
    return weft_error(WEFT_ERR_INVALID, "hook kind %d out of range", (int)kind);
  if (m->nhooks == m->cap_hooks) {
    int cap = m->cap_hooks ? 2 * m->cap_hooks : 4;
    nn_hook *h = realloc(m->hooks, (size_t)cap * sizeof *h);
    if (!h) return weft_error(WEFT_ERR_OOM, "hooks");
    m->hooks = h;
    m->cap_hooks = cap;
  }
  nn_hook *h = &m->hooks[m->nhooks++];
  h->kind = kind;
  h->fn = fn;
  h->ctx = ctx;
  h->id = m->next_hook_id++;
  h->removed = false;
  if (handle) {
    handle->module = m;
    handle->id = h->id;
  }
  return WEFT_OK;
}

weft_status weft_hook_remove(weft_hook_handle handle) {
  weft_module *m = handle.module;
  if (!m) return weft_error(WEFT_ERR_INVALID, "handle has no module");
  for (int i = 0; i < m->nhooks; i++) {
    if (m->hooks[i].id != handle.id || m->hooks[i].removed) continue;
    if (m->running)
      return weft_error(WEFT_ERR_BUSY, "module '%s' is running: remove its hooks afterwards",
                        m->fqn);
    memmove(&m->hooks[i], &m->hooks[i + 1], (size_t)(m->nhooks - i - 1) * sizeof *m->hooks);
    m->nhooks--;
    return WEFT_OK;
  }
  return weft_error(WEFT_ERR_NOT_FOUND, "hook %llu of module '%s' is not registered",
                    (unsigned long long)handle.id, m->fqn);
}

static void owned_clear(nn_owned *o) {
  for (int i = 0; i < o->n; i++) weft_dtensor_destroy(o->v[i]);
  o->n = 0;
}

static weft_status owned_push(nn_owned *o, weft_dtensor *d) {
  if (o->n == o->cap) {
    int cap = o->cap ? 2 * o->cap : 2;
    weft_dtensor **v = realloc(o->v, (size_t)cap * sizeof *v);
    if (!v) return weft_error(WEFT_ERR_OOM, "hook replacements");
    o->v = v;
    o->cap = cap;
  }
  o->v[o->n++] = d;
  return WEFT_OK;
}

/* A replacement must describe the same global tensor shape (placements may
 * differ: that is the point). */
static weft_status check_replacement(const weft_module *m, weft_hook_kind kind,
                                     const weft_dtensor *was, const weft_dtensor *rep) {
  if (!was) return WEFT_OK; /* a NULL grad replaced by a tensor: nothing to compare */
  const weft_dtensor_spec *a = weft_dtensor_get_spec(was), *b = weft_dtensor_get_spec(rep);
  bool ok = a->ndim == b->ndim && a->dtype == b->dtype && a->mesh_ndim == b->mesh_ndim;
  for (int d = 0; ok && d < a->ndim; d++) ok = a->shape[d] == b->shape[d];
  for (int d = 0; ok && d < a->mesh_ndim; d++) ok = a->mesh_shape[d] == b->mesh_shape[d];
  if (!ok) {
    char x[256], y[256];
    weft_dtensor_spec_describe(a, x, sizeof x);
    weft_dtensor_spec_describe(b, y, sizeof y);
    return weft_error(WEFT_ERR_INVALID,
                      "a hook (kind %d) of module '%s' replaced %s by %s: global shape, dtype "
                      "and mesh shape must stay",
                      (int)kind, m->fqn, x, y);
  }
  return WEFT_OK;
}

/* Runs the hooks of one point on *t, taking over replacements. */
static weft_status run_hooks(weft_module *m, weft_hook_kind kind, const weft_dtensor **t) {
  for (int i = 0; i < m->nhooks; i++) {
    nn_hook *h = &m->hooks[i];
    if (h->kind != kind || h->removed) continue;
    weft_dtensor *rep = NULL;
    weft_status st = h->fn(m, kind, *t, &rep, h->ctx);
    if (st != WEFT_OK) {
      weft_dtensor_destroy(rep);
      return weft_error_trace(st, __func__);
    }
    if (rep) {
      st = check_replacement(m, kind, *t, rep);
      if (!st) st = owned_push(&m->owned[kind], rep);
      if (st) {
        weft_dtensor_destroy(rep);
        return weft_error_trace(st, __func__);
      }
      *t = rep;
    }
  }
  return WEFT_OK;
}

weft_status nn_module_hooks(weft_module *m, weft_hook_kind kind, const weft_dtensor **t) {
  owned_clear(&m->owned[kind]);
  return run_hooks(m, kind, t);
}

void nn_module_drop_replacements(weft_module *m, weft_hook_kind kind) {
  owned_clear(&m->owned[kind]);
}

weft_status weft_module_forward(weft_module *m, const weft_dtensor *in, const weft_dtensor **out) {
  if (!m || !out) return weft_error(WEFT_ERR_INVALID, "module or out is NULL");
  *out = NULL;
  if (m->magic != NN_MODULE_LIVE)
    return weft_error(WEFT_ERR_INVALID, "the module was destroyed (weft_module_destroy)");
  if (!in) return weft_error(WEFT_ERR_INVALID, "module '%s': input is NULL", m->fqn);
  if (m->running)
    return weft_error(WEFT_ERR_STATE, "module '%s' is already running (re-entered)", m->fqn);
  if (!weft_mesh_same_ranks(weft_dtensor_mesh(in), m->mesh)) {
    char a[192], b[192];
    weft_mesh_describe(weft_dtensor_mesh(in), a, sizeof a);
    weft_mesh_describe(m->mesh, b, sizeof b);
    return weft_error(WEFT_ERR_INVALID,
                      "module '%s': the input lives on %s, the module on %s (redistribute the "
                      "input onto the module's mesh first)",
                      m->fqn[0] ? m->fqn : m->name, a, b);
  }
  m->running = true;
  m->fwd_pending = false;
  owned_clear(&m->owned[WEFT_HOOK_PRE_FORWARD]);
  owned_clear(&m->owned[WEFT_HOOK_POST_FORWARD]);
  const weft_dtensor *x = in, *y = NULL;
  weft_status st;
  WEFT_CHECK_GOTO(run_hooks(m, WEFT_HOOK_PRE_FORWARD, &x), st, done);
  WEFT_CHECK_GOTO(m->ops->forward(m, x, &y), st, done);
  WEFT_CHECK_GOTO(run_hooks(m, WEFT_HOOK_POST_FORWARD, &y), st, done);
  if (!y) {
    st = weft_error(WEFT_ERR_INTERNAL, "module '%s' produced no output", m->fqn);
    goto done;
  }
  m->out_spec = *weft_dtensor_get_spec(y);
  m->fwd_pending = true;
  *out = y;
done:
  m->running = false;
  return st;
}

weft_status weft_module_backward(weft_module *m, const weft_dtensor *grad_out,
                                 const weft_dtensor **grad_in) {
  if (!m || !grad_in) return weft_error(WEFT_ERR_INVALID, "module or grad_in is NULL");
  *grad_in = NULL;
  if (!grad_out) return weft_error(WEFT_ERR_INVALID, "module '%s': grad_out is NULL", m->fqn);
  if (m->running)
    return weft_error(WEFT_ERR_STATE, "module '%s' is already running (re-entered)", m->fqn);
  if (!m->fwd_pending)
    return weft_error(WEFT_ERR_STATE,
                      "module '%s': backward needs a forward first (one backward per forward)",
                      m->fqn[0] ? m->fqn : m->name);
  /* The grad must describe the output the caller got. */
  const weft_dtensor_spec *g = weft_dtensor_get_spec(grad_out);
  bool ok = g->ndim == m->out_spec.ndim && g->mesh_ndim == m->out_spec.mesh_ndim;
  for (int d = 0; ok && d < g->ndim; d++) ok = g->shape[d] == m->out_spec.shape[d];
  if (!ok) {
    char a[256], b[256];
    weft_dtensor_spec_describe(g, a, sizeof a);
    weft_dtensor_spec_describe(&m->out_spec, b, sizeof b);
    return weft_error(WEFT_ERR_INVALID, "module '%s': grad_out %s does not match the output %s",
                      m->fqn[0] ? m->fqn : m->name, a, b);
  }
  m->running = true;
  owned_clear(&m->owned[WEFT_HOOK_PRE_BACKWARD]);
  owned_clear(&m->owned[WEFT_HOOK_POST_BACKWARD]);
  const weft_dtensor *dy = grad_out, *dx = NULL;
  weft_status st;
  WEFT_CHECK_GOTO(run_hooks(m, WEFT_HOOK_PRE_BACKWARD, &dy), st, done);
  WEFT_CHECK_GOTO(m->ops->backward(m, dy, &dx), st, done);
  WEFT_CHECK_GOTO(run_hooks(m, WEFT_HOOK_POST_BACKWARD, &dx), st, done);
  m->fwd_pending = false;
  *grad_in = dx;
done:
  m->running = false;
  return st;
}

/* ------------------------------------------------------- param layouts */

static weft_status check_param(const weft_param *p) {
  if (!p) return weft_error(WEFT_ERR_INVALID, "param is NULL");
  return WEFT_OK;
}

weft_status weft_param_set_placements(weft_param *p, const weft_placement *pl, int n) {
  WEFT_CHECK(check_param(p));
  if (!pl && n > 0) return weft_error(WEFT_ERR_INVALID, "placements is NULL");
  for (int i = 0; i < n; i++)
    if (pl[i].kind == WEFT_PLACE_PARTIAL) {
      char b[32];
      weft_placement_describe(pl[i], b, sizeof b);
      return weft_error(WEFT_ERR_INVALID,
                        "parameter '%s': placement %s on mesh dim %d (parameters are Shard, "
                        "StridedShard or Replicate)",
                        p->fqn, b, i);
    }
  weft_dtensor_spec spec;
  WEFT_CHECK(weft_dtensor_spec_init_mesh(&spec, p->mesh, pl, n, p->spec.dtype, p->spec.ndim,
                                         p->spec.shape));
  if (p->data) {
    weft_dtensor *nd;
    WEFT_CHECK(weft_dtensor_redistribute(p->data, pl, n, &nd));
    weft_dtensor_destroy(p->data);
    p->data = nd;
    weft_dtensor_destroy(p->grad);
    p->grad = NULL;
  }
  p->spec = spec;
  return WEFT_OK;
}

static weft_status materialize(weft_param *p) {
  if (p->data) return WEFT_OK;
  return weft_dtensor_zeros(p->mesh, p->spec.dtype, p->spec.ndim, p->spec.shape, p->spec.placements,
                            p->spec.mesh_ndim, &p->data);
}

weft_status weft_param_load(weft_param *p, const weft_tensor *full) {
  WEFT_CHECK(check_param(p));
  if (!full) return weft_error(WEFT_ERR_INVALID, "parameter '%s': tensor is NULL", p->fqn);
  bool ok = full->ndim == p->spec.ndim;
  for (int d = 0; ok && d < full->ndim; d++) ok = full->shape[d] == p->spec.shape[d];
  if (!ok) {
    char a[128], b[256];
    weft_tensor_describe(full, a, sizeof a);
    weft_dtensor_spec_describe(&p->spec, b, sizeof b);
    return weft_error(WEFT_ERR_INVALID, "parameter '%s': tensor %s does not match %s", p->fqn, a,
                      b);
  }
  if (!weft_dtype_is_float(full->dtype))
    return weft_error(WEFT_ERR_INVALID, "parameter '%s': tensor is %s, not a float type", p->fqn,
                      weft_dtype_name(full->dtype));
  WEFT_CHECK(materialize(p));
  /* the slice this rank holds, cut out of the full tensor and converted */
  int64_t off[WEFT_MAX_DIMS];
  if (!weft_dtensor_local_offset(p->data, off))
    return weft_error(WEFT_ERR_UNSUPPORTED, "parameter '%s': non-contiguous shard", p->fqn);
  weft_tensor *loc = weft_dtensor_local(p->data);
  weft_tensor box = *full;
  const weft_tensor *src = full;
  for (int d = 0; d < full->ndim; d++) {
    weft_tensor *v;
    int64_t start = loc->shape[d] ? off[d] : 0;
    WEFT_CHECK(weft_tensor_narrow(src, d, start, loc->shape[d], &v));
    box = *v;
    weft_tensor_destroy(v);
    src = &box;
  }
  return weft_tensor_copy(loc, src);
}

/* -------------------------------------------------------- init, grads */

static weft_status init_visit(weft_module *m, void *ctx) {
  uint64_t seed = *(const uint64_t *)ctx;
  for (int i = 0; i < m->nparams; i++) {
    weft_param *p = m->params[i];
    WEFT_CHECK(materialize(p));
    if (p->init.kind == WEFT_INIT_NORMAL)
      WEFT_CHECK(
          weft_dtensor_fill_normal(p->data, seed, weft_rng_key(p->fqn), p->init.mean, p->init.std));
    else
      WEFT_CHECK(weft_tensor_fill(weft_dtensor_local(p->data), p->init.value));
  }
  return WEFT_OK;
}

weft_status weft_module_init_weights(weft_module *root, uint64_t seed) {
  if (!root) return weft_error(WEFT_ERR_INVALID, "root is NULL");
  WEFT_CHECK(weft_module_visit(root, init_visit, &seed));
  return WEFT_OK;
}

static weft_status materialize_visit(weft_module *m, void *ctx) {
  (void)ctx;
  for (int i = 0; i < m->nparams; i++) WEFT_CHECK(materialize(m->params[i]));
  return WEFT_OK;
}

weft_status weft_module_materialize(weft_module *root) {
  if (!root) return weft_error(WEFT_ERR_INVALID, "root is NULL");
  WEFT_CHECK(weft_module_visit(root, materialize_visit, NULL));
  return WEFT_OK;
}

static weft_status zero_visit(weft_module *m, void *ctx) {
  bool to_none = *(const bool *)ctx;
  for (int i = 0; i < m->nparams; i++) {
    weft_param *p = m->params[i];
    if (!p->grad) continue;
    if (to_none) {
      weft_dtensor_destroy(p->grad);
      p->grad = NULL;
    } else {
      weft_tensor *g = weft_dtensor_local(p->grad);
      if (weft_tensor_is_contiguous(g))
        WEFT_CHECK(weft_memset(g->device, g->data, 0, weft_tensor_nbytes(g)));
      else
        WEFT_CHECK(weft_tensor_fill(g, 0.0));
    }
  }
  return WEFT_OK;
}

weft_status weft_module_zero_grad(weft_module *root, bool set_to_none) {
  if (!root) return weft_error(WEFT_ERR_INVALID, "root is NULL");
  WEFT_CHECK(weft_module_visit(root, zero_visit, &set_to_none));
  return WEFT_OK;
}
