/* dcp/model_sd.c — model and optimizer state dicts (get/set), with
 * torch.distributed.checkpoint.state_dict's options: full_state_dict,
 * cpu_offload, broadcast_from_rank0, strict. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dcp_internal.h"

static weft_status get_opts(const weft_state_dict_opts *o, weft_state_dict_opts *out) {
  weft_state_dict_opts d = WEFT_STATE_DICT_OPTS_INIT;
  if (o && o->version != WEFT_STATE_DICT_OPTS_VERSION)
    return weft_error(WEFT_ERR_INVALID, "weft_state_dict_opts version %d (this library: %d)",
                      o->version, WEFT_STATE_DICT_OPTS_VERSION);
  *out = o ? *o : d;
  return WEFT_OK;
}

weft_status dcp_check_resharded(weft_param *const *ps, int n, const char *what) {
  for (int i = 0; i < n; i++)
    if (ps[i]->master)
      return weft_error(WEFT_ERR_STATE,
                        "%s: parameter '%s' is unsharded by FSDP (its group ran a forward with "
                        "reshard_after_forward off, or weft_fsdp_unshard): reshard it "
                        "(weft_fsdp_reshard) before loading",
                        what, ps[i]->fqn);
  return WEFT_OK;
}

static weft_status params_of(weft_module *model, weft_param ***ps, int *n) {
  *ps = NULL;
  *n = 0;
  if (!model) return weft_error(WEFT_ERR_INVALID, "model is NULL");
  int count;
  WEFT_CHECK(weft_module_parameters(model, NULL, 0, &count));
  weft_param **p = malloc((size_t)(count ? count : 1) * sizeof *p);
  if (!p) return weft_error(WEFT_ERR_OOM, "parameter list");
  weft_status st = weft_module_parameters(model, p, count, &count);
  if (st != WEFT_OK) {
    free(p);
    return weft_error_trace(st, __func__);
  }
  *ps = p;
  *n = count;
  return WEFT_OK;
}

/* Adds one DTensor under name according to the options. Collective over
 * dt's mesh with full_state_dict. */
static weft_status add_state_tensor(weft_state_dict *sd, const char *name, weft_dtensor *dt,
                                    const weft_state_dict_opts *o) {
  if (o->full_state_dict) {
    weft_tensor *full;
    WEFT_CHECK(dcp_full_on_host(dt, &full));
    if (o->cpu_offload && weft_world_rank() != 0) {
      weft_tensor_destroy(full);
      return WEFT_OK;
    }
    weft_status st = weft_state_dict_add_tensor(sd, name, full, WEFT_LOCAL_TAKE);
    if (st != WEFT_OK) weft_tensor_destroy(full);
    return st;
  }
  /* a view on any device: loads write into the model, saves stage device
   * locals through the host (save.c) */
  return weft_state_dict_add_dtensor(sd, name, dt, WEFT_LOCAL_VIEW);
}

weft_status weft_get_model_state_dict(weft_module *model, const weft_state_dict_opts *opts,
                                      weft_state_dict *sd) {
  weft_state_dict_opts o;
  WEFT_CHECK(get_opts(opts, &o));
  if (!sd) return weft_error(WEFT_ERR_INVALID, "state dict is NULL");
  weft_param **ps;
  int n;
  WEFT_CHECK(params_of(model, &ps, &n));
  weft_status st = WEFT_OK;
  for (int i = 0; i < n && st == WEFT_OK; i++)
    if (!weft_param_state(ps[i]))
      st = weft_error(WEFT_ERR_STATE,
                      "model state dict: parameter '%s' has no storage (initialise "
                      "or materialise the model first)",
                      ps[i]->fqn);
  for (int i = 0; i < n && st == WEFT_OK; i++)
    st = add_state_tensor(sd, ps[i]->fqn, weft_param_state(ps[i]), &o);
  free(ps);
  /* tied parameters: saved once under the owner's FQN; their other names
   * become aliases, so a load also accepts a checkpoint that has only the
   * alias ("lm_head.weight") */
  dcp_tie *ties = NULL;
  int nt = 0;
  if (st == WEFT_OK) st = dcp_model_ties(model, &ties, &nt);
  for (int i = 0; i < nt && st == WEFT_OK; i++)
    st = weft_state_dict_add_alias(sd, ties[i].alias, ties[i].p->fqn);
  dcp_ties_free(ties, nt);
  return st;
}

/* ------------------------------------------------------------ tied */

static weft_status ties_visit(weft_module *m, void *ctx) {
  struct {
    dcp_tie *t;
    int n;
    weft_param **ps;
    int np;
  } *c = ctx;
  for (int i = 0; i < weft_module_num_tied(m); i++) {
    const char *name;
    weft_param *p = weft_module_tied(m, i, &name);
    bool ours = false;
    for (int k = 0; k < c->np && !ours; k++) ours = c->ps[k] == p;
    if (!ours) continue; /* owned outside this model: not one of its entries */
    dcp_tie *t = realloc(c->t, (size_t)(c->n + 1) * sizeof *t);
    if (!t) return weft_error(WEFT_ERR_OOM, "tied parameters");
    c->t = t;
    const char *mf = weft_module_fqn(m);
    size_t len = strlen(mf) + strlen(name) + 2;
    char *a = malloc(len);
    if (!a) return weft_error(WEFT_ERR_OOM, "tied parameters");
    snprintf(a, len, "%s%s%s", mf, mf[0] ? "." : "", name);
    c->t[c->n].alias = a;
    c->t[c->n].p = p;
    c->n++;
  }
  return WEFT_OK;
}

weft_status dcp_model_ties(weft_module *model, dcp_tie **out, int *n) {
  *out = NULL;
  *n = 0;
  struct {
    dcp_tie *t;
    int n;
    weft_param **ps;
    int np;
  } c = {NULL, 0, NULL, 0};
  WEFT_CHECK(params_of(model, &c.ps, &c.np));
  weft_status st = weft_module_visit(model, ties_visit, &c);
  free(c.ps);
  if (st != WEFT_OK) {
    dcp_ties_free(c.t, c.n);
    return st;
  }
  *out = c.t;
  *n = c.n;
  return WEFT_OK;
}

void dcp_ties_free(dcp_tie *t, int n) {
  for (int i = 0; t && i < n; i++) free(t[i].alias);
  free(t);
}

/* A contiguous copy of t converted to dtype. */
static weft_status convert(const weft_tensor *t, weft_dtype dtype, weft_tensor **out) {
  WEFT_CHECK(weft_tensor_create(dtype, WEFT_CPU, t->ndim, t->shape, out));
  weft_status st = weft_tensor_copy(*out, t);
  if (st != WEFT_OK) {
    weft_tensor_destroy(*out);
    *out = NULL;
  }
  return st;
}

weft_status dcp_tensors_equal(const weft_tensor *a, const weft_tensor *b, weft_dtype dtype,
                              bool *equal) {
  *equal = false;
  if (!weft_tensor_same_shape(a, b)) return WEFT_OK;
  weft_tensor *x = NULL, *y = NULL;
  weft_status st = convert(a, dtype, &x);
  if (st == WEFT_OK) st = convert(b, dtype, &y);
  if (st == WEFT_OK) *equal = memcmp(x->data, y->data, weft_tensor_nbytes(x)) == 0;
  weft_tensor_destroy(x);
  weft_tensor_destroy(y);
  return st;
}

/* Whether opt has AdamW parameter groups (weft_optimizer_group_get works). */
static bool has_groups(const weft_optimizer *opt) {
  weft_adamw_params hp;
  if (weft_optimizer_group_get(opt, 0, &hp) == WEFT_OK) return true;
  weft_clear_error(); /* SGD: one learning rate, no groups */
  return false;
}

weft_status weft_get_optimizer_state_dict(weft_module *model, weft_optimizer *opt,
                                          const weft_state_dict_opts *opts, weft_state_dict *sd) {
  weft_state_dict_opts o;
  WEFT_CHECK(get_opts(opts, &o));
  if (!sd || !opt) return weft_error(WEFT_ERR_INVALID, "state dict or optimizer is NULL");
  weft_param **ps;
  int n;
  WEFT_CHECK(params_of(model, &ps, &n));
  weft_status st = WEFT_OK;
  int ns = weft_optimizer_state_count(opt);
  for (int i = 0; i < ns && st == WEFT_OK; i++) {
    const char *name;
    weft_dtensor *dt;
    st = weft_optimizer_state_get(opt, i, &name, &dt);
    if (st == WEFT_OK) st = add_state_tensor(sd, name, dt, &o);
  }
  if (st == WEFT_OK)
    st = weft_state_dict_set_int(sd, "state.num_steps", weft_optimizer_num_steps(opt));
  const bool adam = has_groups(opt);
  if (st == WEFT_OK && adam)
    st = weft_state_dict_set_int(sd, "param_groups.num_groups", weft_optimizer_num_groups(opt));
  char key[4200], json[128];
  for (int i = 0; i < n && st == WEFT_OK; i++) {
    int64_t step;
    if (weft_optimizer_get_param_step(opt, ps[i]->fqn, &step) != WEFT_OK) {
      weft_clear_error(); /* not in this optimizer (requires_grad false) */
      continue;
    }
    const char *f = ps[i]->fqn;
    snprintf(key, sizeof key, "state.%s.step", f);
    st = weft_state_dict_set_int(sd, key, step);
    if (!adam) {
      snprintf(key, sizeof key, "param_groups.%s.lr", f);
      if (st == WEFT_OK)
        st = weft_state_dict_set_double(sd, key, (double)weft_optimizer_get_lr(opt));
      continue;
    }
    /* torch's flattened param_groups: the parameter's group's values */
    int g = 0;
    weft_adamw_params hp;
    if (st == WEFT_OK) st = weft_optimizer_param_group(opt, f, &g);
    if (st == WEFT_OK) st = weft_optimizer_group_get(opt, g, &hp);
    snprintf(key, sizeof key, "param_groups.%s.group", f);
    if (st == WEFT_OK) st = weft_state_dict_set_int(sd, key, g);
    snprintf(key, sizeof key, "param_groups.%s.lr", f);
    if (st == WEFT_OK) st = weft_state_dict_set_double(sd, key, (double)hp.lr);
    snprintf(key, sizeof key, "param_groups.%s.betas", f);
    snprintf(json, sizeof json, "[%.17g, %.17g]", (double)hp.beta1, (double)hp.beta2);
    if (st == WEFT_OK) st = weft_state_dict_set_json(sd, key, json);
    snprintf(key, sizeof key, "param_groups.%s.eps", f);
    if (st == WEFT_OK) st = weft_state_dict_set_double(sd, key, (double)hp.eps);
    snprintf(key, sizeof key, "param_groups.%s.weight_decay", f);
    if (st == WEFT_OK) st = weft_state_dict_set_double(sd, key, (double)hp.weight_decay);
    snprintf(key, sizeof key, "param_groups.%s.amsgrad", f);
    if (st == WEFT_OK) st = weft_state_dict_set_json(sd, key, hp.amsgrad ? "true" : "false");
  }
  free(ps);
  return st;
}

/* ------------------------------------------------------------ set */

typedef weft_status (*value_fn)(void *ctx, const char *key, weft_sd_value_type type,
                                const char *text);

/* What a value target accepts. */
typedef enum want_kind {
  WANT_NUMBER = 0, /* an int or a double */
  WANT_INT,        /* an int */
  WANT_JSON,       /* any value (parsed by the setter) */
} want_kind;

typedef struct target {
  char *key;
  weft_dtensor *dt; /* tensor target; NULL for a value */
  value_fn set;     /* value targets: stages the value (see apply's finish) */
  void *ctx;
  want_kind want;
  char **alias; /* other names of a tied parameter (tensor targets) */
  int nalias;
} target;

typedef struct tlist {
  target *t;
  int64_t n, cap;
} tlist;

static weft_status tl_push(tlist *l, const char *key, weft_dtensor *dt, value_fn fn, void *ctx,
                           want_kind want) {
  if (l->n == l->cap) {
    int64_t cap = l->cap ? 2 * l->cap : 32;
    target *t = realloc(l->t, (size_t)cap * sizeof *t);
    if (!t) return weft_error(WEFT_ERR_OOM, "targets");
    l->t = t;
    l->cap = cap;
  }
  target *t = &l->t[l->n];
  t->key = dcp_strdup(key);
  if (!t->key) return weft_error(WEFT_ERR_OOM, "targets");
  t->dt = dt;
  t->set = fn;
  t->ctx = ctx;
  t->want = want;
  t->alias = NULL;
  t->nalias = 0;
  l->n++;
  return WEFT_OK;
}

static weft_status tl_add_alias(target *t, const char *alias) {
  char **a = realloc(t->alias, (size_t)(t->nalias + 1) * sizeof *a);
  if (!a) return weft_error(WEFT_ERR_OOM, "targets");
  t->alias = a;
  t->alias[t->nalias] = dcp_strdup(alias);
  if (!t->alias[t->nalias]) return weft_error(WEFT_ERR_OOM, "targets");
  t->nalias++;
  return WEFT_OK;
}

static void tl_free(tlist *l) {
  for (int64_t i = 0; i < l->n; i++) {
    free(l->t[i].key);
    for (int k = 0; k < l->t[i].nalias; k++) free(l->t[i].alias[k]);
    free(l->t[i].alias);
  }
  free(l->t);
}

/* The entry of sd that target t reads: its key, else the first of its
 * aliases present; -1 if none. *other (may be NULL): an alias entry
 * present besides the one read (then both name the same tied parameter and
 * must hold equal values), else -1. */
static int64_t t_index(const weft_state_dict *sd, const target *t, int64_t *other) {
  int64_t at = dcp_sd_index(sd, t->key), o = -1;
  for (int k = 0; k < t->nalias && o < 0; k++) {
    int64_t j = dcp_sd_index(sd, t->alias[k]);
    if (j < 0) continue;
    if (at < 0)
      at = j;
    else
      o = j;
  }
  if (other) *other = o;
  return at;
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static weft_status keys_push(weft_key_list *l, const char *k) {
  char **n = realloc(l->keys, (size_t)(l->count + 1) * sizeof *n);
  if (!n) return weft_error(WEFT_ERR_OOM, "key list");
  l->keys = n;
  l->keys[l->count] = dcp_strdup(k);
  if (!l->keys[l->count]) return weft_error(WEFT_ERR_OOM, "key list");
  l->count++;
  return WEFT_OK;
}

/* Copies the full value `full` into dt's local shard (each local box is a
 * slice of full; dtypes convert). No communication. */
static weft_status slice_full_into(weft_dtensor *dt, const weft_tensor *full) {
  weft_local_box *lb;
  int64_t n;
  WEFT_CHECK(weft_dtensor_local_boxes(dt, &lb, &n));
  weft_tensor *lt = weft_dtensor_local(dt);
  weft_status st = WEFT_OK;
  for (int64_t k = 0; k < n && st == WEFT_OK; k++)
    st = weft_tensor_copy_region(lt, lb[k].local_start, full, lb[k].global.off, lb[k].global.size);
  free(lb);
  return st;
}

/* Copies entry e into target dt (see weft_set_model_state_dict). */
static weft_status copy_into(weft_dtensor *dt, const dcp_sd_ent *e) {
  if (e->kind == WEFT_SD_TENSOR) return slice_full_into(dt, e->t);
  if (e->dt == dt) return WEFT_OK;
  const weft_dtensor_spec *a = weft_dtensor_get_spec(dt), *b = weft_dtensor_get_spec(e->dt);
  bool same_mesh = weft_dtensor_mesh(dt) == weft_dtensor_mesh(e->dt);
  bool same_layout = same_mesh && a->mesh_ndim == b->mesh_ndim;
  for (int d = 0; same_layout && d < a->mesh_ndim; d++)
    same_layout = weft_placement_equal(a->placements[d], b->placements[d]);
  if (same_layout) return weft_tensor_copy(weft_dtensor_local(dt), weft_dtensor_local(e->dt));
  weft_status st;
  if (same_mesh) {
    weft_dtensor *tmp;
    WEFT_CHECK(weft_dtensor_redistribute(e->dt, a->placements, a->mesh_ndim, &tmp));
    st = weft_tensor_copy(weft_dtensor_local(dt), weft_dtensor_local(tmp));
    weft_dtensor_destroy(tmp);
    return st;
  }
  weft_tensor *full;
  WEFT_CHECK(weft_dtensor_full_tensor(e->dt, &full));
  st = slice_full_into(dt, full);
  weft_tensor_destroy(full);
  return st;
}

static void describe_shape(int nd, const int64_t *shape, char *buf, size_t cap) {
  weft_box x = {{0}, {0}};
  for (int d = 0; d < nd; d++) x.size[d] = shape[d];
  dcp_box_describe(&x, nd, buf, cap);
}

/* Checks one present entry against its target. */
static weft_status check_pair(const target *t, weft_sd_kind kind, weft_sd_value_type vtype, int nd,
                              const int64_t *shape) {
  char a[256], b[256];
  if (t->dt) {
    if (kind == WEFT_SD_VALUE)
      return weft_error(WEFT_ERR_INVALID, "set state dict: '%s' is a value; a tensor was expected",
                        t->key);
    const weft_dtensor_spec *s = weft_dtensor_get_spec(t->dt);
    bool same = nd == s->ndim;
    for (int d = 0; same && d < nd; d++) same = shape[d] == s->shape[d];
    if (!same) {
      describe_shape(nd, shape, a, sizeof a);
      describe_shape(s->ndim, s->shape, b, sizeof b);
      return weft_error(WEFT_ERR_INVALID,
                        "set state dict: '%s' has shape %s in the state dict but "
                        "%s in the model",
                        t->key, a, b);
    }
    return WEFT_OK;
  }
  if (kind != WEFT_SD_VALUE)
    return weft_error(WEFT_ERR_INVALID, "set state dict: '%s' is a tensor; a value was expected",
                      t->key);
  if (t->want == WANT_JSON) return WEFT_OK;
  if (vtype != WEFT_VALUE_INT && (t->want == WANT_INT || vtype != WEFT_VALUE_DOUBLE))
    return weft_error(WEFT_ERR_INVALID, "set state dict: '%s' is a %s; %s was expected", t->key,
                      dcp_value_type_name(vtype), t->want == WANT_INT ? "an int" : "a number");
  return WEFT_OK;
}

/* The whole value of a tensor entry: a DTensor is gathered (collective
 * over its mesh), a plain tensor is itself (*owned false). */
static weft_status entry_full(const dcp_sd_ent *e, weft_tensor **out, bool *owned) {
  *owned = e->kind == WEFT_SD_DTENSOR;
  if (!*owned) {
    *out = e->t;
    return WEFT_OK;
  }
  return dcp_full_on_host(e->dt, out);
}

/* Entries a and b name one tied parameter (target t): their values must be
 * equal (as the parameter's dtype). Collective over the meshes of DTensor
 * entries (every rank holding this state dict runs the same checks). */
static weft_status check_tied_pair(const target *t, const dcp_sd_ent *a, const dcp_sd_ent *b) {
  weft_tensor *x = NULL, *y = NULL;
  bool ox = false, oy = false, eq = false;
  weft_status st = entry_full(a, &x, &ox);
  if (st == WEFT_OK) st = entry_full(b, &y, &oy);
  if (st == WEFT_OK) st = dcp_tensors_equal(x, y, weft_dtensor_dtype(t->dt), &eq);
  if (ox) weft_tensor_destroy(x);
  if (oy) weft_tensor_destroy(y);
  if (st == WEFT_OK && !eq)
    st = weft_error(WEFT_ERR_INVALID,
                    "set state dict: '%s' and '%s' name one tied parameter but "
                    "hold different values (keep one of them)",
                    a->name, b->name);
  return st;
}

static bool in_namespace(const dcp_sd_ent *e, bool optimizer) {
  if (optimizer) return dcp_is_optimizer_key(e->name);
  return e->kind != WEFT_SD_VALUE && !dcp_is_optimizer_key(e->name);
}

/* Finds missing and unexpected keys of sd against targets (sorted keys in
 * `sorted`). */
static weft_status find_keys(const tlist *tl, char **sorted, int64_t nsorted,
                             const weft_state_dict *sd, bool optimizer, weft_key_list *miss,
                             weft_key_list *unexp) {
  for (int64_t i = 0; i < tl->n; i++)
    if (t_index(sd, &tl->t[i], NULL) < 0) WEFT_CHECK(keys_push(miss, tl->t[i].key));
  for (int64_t i = 0; i < sd->n; i++) {
    const dcp_sd_ent *e = &sd->e[i];
    if (!in_namespace(e, optimizer)) continue;
    const char *k = e->name;
    if (!nsorted || !bsearch(&k, sorted, (size_t)nsorted, sizeof *sorted, cmp_str))
      WEFT_CHECK(keys_push(unexp, e->name));
  }
  return WEFT_OK;
}

static weft_status strict_error(const weft_key_list *miss, const weft_key_list *unexp) {
  if (miss->count)
    return weft_error(WEFT_ERR_NOT_FOUND, "set state dict (strict): missing key '%s'%s",
                      miss->keys[0], miss->count > 1 ? " and others" : "");
  return weft_error(WEFT_ERR_INVALID, "set state dict (strict): unexpected key '%s'%s",
                    unexp->keys[0], unexp->count > 1 ? " and others" : "");
}

/* Checks entry e against target t (kind, value type, shape). */
static weft_status check_entry_pair(const target *t, const dcp_sd_ent *e) {
  int nd = 0;
  const int64_t *shape = NULL;
  if (e->kind == WEFT_SD_DTENSOR) {
    nd = weft_dtensor_ndim(e->dt);
    shape = weft_dtensor_shape(e->dt);
  } else if (e->kind == WEFT_SD_TENSOR) {
    nd = e->t->ndim;
    shape = e->t->shape;
  }
  return check_pair(t, e->kind, e->val.type, nd, shape);
}

/* Stages the values (value targets' setters), then `finish` checks and
 * commits them; only then do tensors move. */
typedef weft_status (*finish_fn)(void *ctx);

static weft_status apply_local(const tlist *tl, char **sorted, int64_t nsorted,
                               const weft_state_dict *sd, const weft_state_dict_opts *o,
                               bool optimizer, finish_fn finish, void *fctx, weft_key_list *miss,
                               weft_key_list *unexp) {
  WEFT_CHECK(find_keys(tl, sorted, nsorted, sd, optimizer, miss, unexp));
  if (o->strict && (miss->count || unexp->count)) return strict_error(miss, unexp);
  for (int64_t i = 0; i < tl->n; i++) {
    int64_t other, k = t_index(sd, &tl->t[i], &other);
    if (k < 0) continue;
    WEFT_CHECK(check_entry_pair(&tl->t[i], &sd->e[k]));
    if (other >= 0) WEFT_CHECK(check_entry_pair(&tl->t[i], &sd->e[other]));
  }
  /* tied parameters given under two names: equal values (collective) */
  for (int64_t i = 0; i < tl->n; i++) {
    int64_t other, k = t_index(sd, &tl->t[i], &other);
    if (k >= 0 && other >= 0) WEFT_CHECK(check_tied_pair(&tl->t[i], &sd->e[k], &sd->e[other]));
  }
  for (int64_t i = 0; i < tl->n; i++) {
    int64_t k = t_index(sd, &tl->t[i], NULL);
    if (k < 0 || tl->t[i].dt) continue;
    const dcp_sd_ent *e = &sd->e[k];
    WEFT_CHECK(tl->t[i].set(tl->t[i].ctx, e->name, e->val.type, e->val.text));
  }
  if (finish) WEFT_CHECK(finish(fctx));
  for (int64_t i = 0; i < tl->n; i++) {
    int64_t k = t_index(sd, &tl->t[i], NULL);
    if (k >= 0 && tl->t[i].dt) WEFT_CHECK(copy_into(tl->t[i].dt, &sd->e[k]));
  }
  return WEFT_OK;
}

/* broadcast_from_rank0: rank 0 describes what it has, then sends each
 * tensor in target order; every rank keeps its slices. */
static weft_status apply_bcast(const tlist *tl, char **sorted, int64_t nsorted,
                               const weft_state_dict *sd, const weft_state_dict_opts *o,
                               bool optimizer, finish_fn finish, void *fctx, weft_key_list *miss,
                               weft_key_list *unexp) {
  dcp_comm c;
  WEFT_CHECK(dcp_comm_open(NULL, &c));
  weft_status st = WEFT_OK;
  dcp_buf hb = {0};
  int64_t hlen = 0;
  char *hdr = NULL;
  if (c.rank == 0) {
    weft_key_list m0 = {0, NULL}, u0 = {0, NULL};
    weft_status s0 =
        sd ? find_keys(tl, sorted, nsorted, sd, optimizer, &m0, &u0)
           : weft_error(WEFT_ERR_INVALID, "broadcast_from_rank0: rank 0's state dict is NULL");
    for (int64_t i = 0; s0 == WEFT_OK && i < tl->n; i++) {
      int64_t other, k = t_index(sd, &tl->t[i], &other);
      for (int r = 0; r < 2 && s0 == WEFT_OK; r++) {
        int64_t j = r ? other : k;
        if (j >= 0 && sd->e[j].kind == WEFT_SD_DTENSOR)
          s0 = weft_error(WEFT_ERR_INVALID,
                          "broadcast_from_rank0: rank 0's entry '%s' is a "
                          "DTensor; it must hold full plain tensors (full_state_dict)",
                          sd->e[j].name);
      }
      /* a tied parameter under two names: plain tensors, compared here */
      if (s0 == WEFT_OK && k >= 0 && other >= 0 && tl->t[i].dt) {
        s0 = check_entry_pair(&tl->t[i], &sd->e[other]);
        if (s0 == WEFT_OK && sd->e[k].kind == WEFT_SD_TENSOR)
          s0 = check_tied_pair(&tl->t[i], &sd->e[k], &sd->e[other]);
      }
    }
    dcp_buf_u32(&hb, (uint32_t)s0);
    dcp_buf_str(&hb, s0 ? dcp_last_msg() : "");
    for (int64_t i = 0; s0 == WEFT_OK && i < tl->n; i++) {
      int64_t k = t_index(sd, &tl->t[i], NULL);
      dcp_buf_u32(&hb, k >= 0);
      if (k < 0) continue;
      const dcp_sd_ent *e = &sd->e[k];
      dcp_buf_u32(&hb, (uint32_t)e->kind);
      if (e->kind == WEFT_SD_TENSOR) {
        dcp_buf_u32(&hb, (uint32_t)e->t->dtype);
        dcp_buf_u32(&hb, (uint32_t)e->t->ndim);
        for (int d = 0; d < e->t->ndim; d++) dcp_buf_u64(&hb, (uint64_t)e->t->shape[d]);
      } else {
        dcp_buf_u32(&hb, (uint32_t)e->val.type);
        dcp_buf_str(&hb, e->val.text);
      }
    }
    dcp_buf_u64(&hb, (uint64_t)u0.count);
    for (int64_t i = 0; i < u0.count; i++) dcp_buf_str(&hb, u0.keys[i]);
    weft_key_list_clear(&m0);
    weft_key_list_clear(&u0);
    if (hb.oom)
      hlen = -1;
    else
      hlen = (int64_t)hb.len;
  }
  WEFT_CHECK_GOTO(dcp_bcast(&c, &hlen, sizeof hlen, 0), st, done);
  if (hlen < 0) {
    st = dcp_agree(&c, c.rank == 0 ? weft_error(WEFT_ERR_OOM, "broadcast header") : WEFT_OK,
                   "set state dict");
    goto done;
  }
  hdr = c.rank == 0 ? hb.p : malloc((size_t)(hlen ? hlen : 1));
  if (c.rank == 0) hb.p = NULL;
  if (!hdr) {
    st = weft_error(WEFT_ERR_OOM, "broadcast header");
    goto done; /* note: rank 0's broadcast then fails on timeout; OOM of a few KB only */
  }
  WEFT_CHECK_GOTO(dcp_bcast(&c, hdr, hlen, 0), st, done);
  /* decode: identical on every rank */
  dcp_rd rd = {hdr, (size_t)hlen, 0, false};
  weft_status s0 = (weft_status)dcp_rd_u32(&rd);
  char *m0 = dcp_rd_str(&rd);
  if (s0 != WEFT_OK) {
    st = c.rank == 0 ? weft_error(s0, "%s", m0 ? m0 : "?")
                     : weft_error(s0, "set state dict failed on rank 0: %s", m0 ? m0 : "?");
    free(m0);
    goto done;
  }
  free(m0);
  typedef struct pres {
    bool present;
    weft_sd_kind kind;
    weft_dtype dtype;
    int ndim;
    int64_t shape[WEFT_MAX_DIMS];
    weft_sd_value_type vtype;
    char *text;
  } pres;
  pres *p = calloc((size_t)(tl->n ? tl->n : 1), sizeof *p);
  if (!p) {
    st = weft_error(WEFT_ERR_OOM, "broadcast header");
    goto done;
  }
  for (int64_t i = 0; i < tl->n && !rd.bad; i++) {
    p[i].present = dcp_rd_u32(&rd) != 0;
    if (!p[i].present) continue;
    p[i].kind = (weft_sd_kind)dcp_rd_u32(&rd);
    if (p[i].kind == WEFT_SD_TENSOR) {
      p[i].dtype = (weft_dtype)dcp_rd_u32(&rd);
      p[i].ndim = (int)dcp_rd_u32(&rd);
      if (p[i].ndim > WEFT_MAX_DIMS) rd.bad = true;
      for (int d = 0; d < p[i].ndim && !rd.bad; d++) p[i].shape[d] = (int64_t)dcp_rd_u64(&rd);
    } else {
      p[i].vtype = (weft_sd_value_type)dcp_rd_u32(&rd);
      p[i].text = dcp_rd_str(&rd);
    }
  }
  uint64_t nu = dcp_rd_u64(&rd);
  for (int64_t i = 0; i < tl->n; i++)
    if (!p[i].present && st == WEFT_OK) st = keys_push(miss, tl->t[i].key);
  for (uint64_t i = 0; i < nu && !rd.bad && st == WEFT_OK; i++) {
    char *k = dcp_rd_str(&rd);
    if (k) st = keys_push(unexp, k);
    free(k);
  }
  if (rd.bad && st == WEFT_OK) st = weft_error(WEFT_ERR_INTERNAL, "malformed broadcast header");
  if (st == WEFT_OK && o->strict && (miss->count || unexp->count)) st = strict_error(miss, unexp);
  for (int64_t i = 0; i < tl->n && st == WEFT_OK; i++)
    if (p[i].present) st = check_pair(&tl->t[i], p[i].kind, p[i].vtype, p[i].ndim, p[i].shape);
  if (st != WEFT_OK) goto free_p; /* the same on every rank: no data moves */
  /* values (the same text on every rank), checked and committed before
   * any tensor moves */
  weft_status local = WEFT_OK;
  for (int64_t i = 0; i < tl->n && local == WEFT_OK; i++)
    if (p[i].present && !tl->t[i].dt)
      local = tl->t[i].set(tl->t[i].ctx, tl->t[i].key, p[i].vtype, p[i].text);
  if (local == WEFT_OK && finish) local = finish(fctx);
  st = dcp_agree(&c, local, "set state dict");
  if (st != WEFT_OK) goto free_p;
  /* data, one tensor at a time */
  for (int64_t i = 0; i < tl->n && st == WEFT_OK; i++) {
    if (!p[i].present || !tl->t[i].dt) continue;
    int64_t numel = 1;
    for (int d = 0; d < p[i].ndim; d++) numel *= p[i].shape[d];
    int64_t nbytes = numel * (int64_t)weft_dtype_size(p[i].dtype);
    weft_tensor *buf = NULL;
    if (c.rank == 0) {
      const weft_tensor *src = sd->e[t_index(sd, &tl->t[i], NULL)].t;
      if (weft_tensor_is_contiguous(src)) {
        st = dcp_bcast(&c, src->data, nbytes, 0);
        if (st == WEFT_OK && local == WEFT_OK) local = slice_full_into(tl->t[i].dt, src);
        continue;
      }
      if (local == WEFT_OK) local = weft_tensor_clone(src, &buf);
      if (!buf) {
        /* cannot stage: send zeros so that nobody hangs; the error is agreed below */
        local = local ? local : weft_error(WEFT_ERR_OOM, "broadcast of '%s'", tl->t[i].key);
        weft_tensor_zeros(p[i].dtype, WEFT_CPU, p[i].ndim, p[i].shape, &buf);
      }
    } else {
      if (weft_tensor_create(p[i].dtype, WEFT_CPU, p[i].ndim, p[i].shape, &buf) != WEFT_OK) {
        if (local == WEFT_OK) local = weft_last_status();
        buf = NULL;
      }
    }
    if (!buf) {
      /* receive into a scratch piece by piece */
      char *scratch = malloc((size_t)1 << 20);
      for (int64_t at = 0; scratch && at < nbytes && st == WEFT_OK; at += (int64_t)1 << 20)
        st = dcp_bcast(&c, scratch,
                       nbytes - at < ((int64_t)1 << 20) ? nbytes - at : ((int64_t)1 << 20), 0);
      free(scratch);
      continue;
    }
    st = dcp_bcast(&c, buf->data, nbytes, 0);
    if (st == WEFT_OK && local == WEFT_OK) local = slice_full_into(tl->t[i].dt, buf);
    weft_tensor_destroy(buf);
  }
  if (st == WEFT_OK) st = dcp_agree(&c, local, "set state dict");
free_p:
  for (int64_t i = 0; i < tl->n; i++) free(p[i].text);
  free(p);
done:
  free(hdr);
  free(hb.p);
  dcp_comm_close(&c);
  return st;
}

static weft_status apply(tlist *tl, const weft_state_dict *sd, const weft_state_dict_opts *o,
                         bool optimizer, finish_fn finish, void *fctx, weft_key_list *missing,
                         weft_key_list *unexpected) {
  weft_key_list miss = {0, NULL}, unexp = {0, NULL};
  if (missing) memset(missing, 0, sizeof *missing);
  if (unexpected) memset(unexpected, 0, sizeof *unexpected);
  /* the names a target accepts: keys and aliases (not unexpected) */
  int64_t ns = tl->n;
  for (int64_t i = 0; i < tl->n; i++) ns += tl->t[i].nalias;
  char **sorted = malloc((size_t)(ns ? ns : 1) * sizeof *sorted);
  if (!sorted) return weft_error(WEFT_ERR_OOM, "key table");
  ns = 0;
  for (int64_t i = 0; i < tl->n; i++) {
    sorted[ns++] = tl->t[i].key;
    for (int k = 0; k < tl->t[i].nalias; k++) sorted[ns++] = tl->t[i].alias[k];
  }
  qsort(sorted, (size_t)ns, sizeof *sorted, cmp_str);
  weft_status st;
  if (o->broadcast_from_rank0)
    st = apply_bcast(tl, sorted, ns, sd, o, optimizer, finish, fctx, &miss, &unexp);
  else if (!sd)
    st = weft_error(WEFT_ERR_INVALID, "state dict is NULL");
  else
    st = apply_local(tl, sorted, ns, sd, o, optimizer, finish, fctx, &miss, &unexp);
  free(sorted);
  if (st == WEFT_OK && missing)
    *missing = miss;
  else
    weft_key_list_clear(&miss);
  if (st == WEFT_OK && unexpected)
    *unexpected = unexp;
  else
    weft_key_list_clear(&unexp);
  return st;
}

weft_status weft_set_model_state_dict(weft_module *model, const weft_state_dict *sd,
                                      const weft_state_dict_opts *opts, weft_key_list *missing,
                                      weft_key_list *unexpected) {
  weft_state_dict_opts o;
  WEFT_CHECK(get_opts(opts, &o));
  weft_param **ps;
  int n;
  WEFT_CHECK(params_of(model, &ps, &n));
  weft_status st = dcp_check_resharded(ps, n, "set_model_state_dict");
  bool need = false;
  for (int i = 0; i < n; i++) need |= weft_param_state(ps[i]) == NULL;
  if (need && st == WEFT_OK) st = weft_module_materialize(model);
  tlist tl = {0};
  for (int i = 0; i < n && st == WEFT_OK; i++)
    st = tl_push(&tl, ps[i]->fqn, weft_param_state(ps[i]), NULL, NULL, WANT_NUMBER);
  /* a tied parameter also answers to its aliases ("lm_head.weight") */
  dcp_tie *ties = NULL;
  int nt = 0;
  if (st == WEFT_OK) st = dcp_model_ties(model, &ties, &nt);
  for (int k = 0; k < nt && st == WEFT_OK; k++)
    for (int i = 0; i < n; i++)
      if (ps[i] == ties[k].p) st = tl_add_alias(&tl.t[i], ties[k].alias);
  dcp_ties_free(ties, nt);
  free(ps);
  if (st == WEFT_OK) st = apply(&tl, sd, &o, false, NULL, NULL, missing, unexpected);
  tl_free(&tl);
  return st;
}

/* Restoring an optimizer: every value is first staged here (the setters
 * only parse), then opt_finish checks the parameter groups against the
 * optimizer's and commits everything, before any state tensor is copied.
 * So a checkpoint whose groups do not match changes nothing. */
enum { F_STEP = 0, F_GROUP, F_LR, F_BETAS, F_EPS, F_WD, F_AMSGRAD, F_NFIELDS };
static const char *const field_name[F_NFIELDS] = {"step", "group",        "lr",     "betas",
                                                  "eps",  "weight_decay", "amsgrad"};

typedef struct pg_saved {
  const char *fqn;
  int group; /* the optimizer's group of this parameter */
  bool has[F_NFIELDS];
  double v[F_NFIELDS]; /* int fields as doubles (exact below 2^53); amsgrad 0/1 */
  double beta2;        /* betas: v[F_BETAS] is beta1 */
} pg_saved;

typedef struct opt_stage {
  weft_optimizer *opt;
  bool adam;
  pg_saved *p;
  int n;
  bool has_num_steps, has_num_groups;
  int64_t num_steps, num_groups;
} opt_stage;

typedef struct field_ctx {
  opt_stage *s;
  int param; /* -1: an optimizer-wide value */
  int field; /* F_*, or -1 num_steps, -2 num_groups */
} field_ctx;

static weft_status stage_value(void *ctx, const char *key, weft_sd_value_type type,
                               const char *text) {
  field_ctx *c = ctx;
  if (c->param < 0) {
    int64_t v = strtoll(text, NULL, 10);
    if (c->field == -1) {
      c->s->has_num_steps = true;
      c->s->num_steps = v;
    } else {
      c->s->has_num_groups = true;
      c->s->num_groups = v;
    }
    return WEFT_OK;
  }
  pg_saved *p = &c->s->p[c->param];
  switch (c->field) {
    case F_STEP:
    case F_GROUP:
      p->v[c->field] = (double)strtoll(text, NULL, 10);
      break;
    case F_LR:
    case F_EPS:
    case F_WD:
      p->v[c->field] = strtod(text, NULL);
      break;
    case F_BETAS: {
      cJSON *j = type == WEFT_VALUE_JSON ? cJSON_Parse(text) : NULL;
      bool ok = j && cJSON_IsArray(j) && cJSON_GetArraySize(j) == 2 &&
                cJSON_IsNumber(cJSON_GetArrayItem(j, 0)) &&
                cJSON_IsNumber(cJSON_GetArrayItem(j, 1));
      if (ok) {
        p->v[F_BETAS] = cJSON_GetArrayItem(j, 0)->valuedouble;
        p->beta2 = cJSON_GetArrayItem(j, 1)->valuedouble;
      }
      cJSON_Delete(j);
      if (!ok)
        return weft_error(WEFT_ERR_INVALID,
                          "set optimizer state dict: '%s' is %s, not [beta1, "
                          "beta2]",
                          key, text);
      break;
    }
    case F_AMSGRAD: {
      bool t = type == WEFT_VALUE_JSON && strcmp(text, "true") == 0;
      bool f = type == WEFT_VALUE_JSON && strcmp(text, "false") == 0;
      if (!t && !f)
        return weft_error(WEFT_ERR_INVALID,
                          "set optimizer state dict: '%s' is %s, not true or "
                          "false",
                          key, text);
      p->v[F_AMSGRAD] = t;
      break;
    }
    default:
      return weft_error(WEFT_ERR_INTERNAL, "optimizer field %d", c->field);
  }
  p->has[c->field] = true;
  return WEFT_OK;
}

/* The first parameter of group g with field f saved, or -1. */
static int first_with(const opt_stage *s, int g, int f) {
  for (int i = 0; i < s->n; i++)
    if (s->p[i].fqn && s->p[i].group == g && s->p[i].has[f]) return i;
  return -1;
}

static void hp_set_field(weft_adamw_params *hp, const pg_saved *p, int f) {
  switch (f) {
    case F_LR:
      hp->lr = (float)p->v[F_LR];
      break;
    case F_BETAS:
      hp->beta1 = (float)p->v[F_BETAS];
      hp->beta2 = (float)p->beta2;
      break;
    case F_EPS:
      hp->eps = (float)p->v[F_EPS];
      break;
    case F_WD:
      hp->weight_decay = (float)p->v[F_WD];
      break;
    default:
      break;
  }
}

static weft_status opt_finish(void *ctx) {
  opt_stage *s = ctx;
  weft_optimizer *opt = s->opt;
  const int ng = weft_optimizer_num_groups(opt);
  /* the groups: their number, and each parameter in the same one */
  if (s->adam && s->has_num_groups && s->num_groups != ng)
    return weft_error(WEFT_ERR_INVALID,
                      "set optimizer state dict: the checkpoint has %lld "
                      "parameter groups, the optimizer %d: group %d is in only one of them (make "
                      "the optimizer with the same groups as the one saved)",
                      (long long)s->num_groups, ng, (int)(s->num_groups < ng ? s->num_groups : ng));
  for (int i = 0; i < s->n; i++) {
    const pg_saved *p = &s->p[i];
    if (!p->fqn) continue;
    if (p->has[F_GROUP] && (!s->adam || p->v[F_GROUP] != (double)p->group))
      return weft_error(WEFT_ERR_INVALID,
                        "set optimizer state dict: parameter '%s' is in "
                        "parameter group %lld in the checkpoint but in group %d of the optimizer "
                        "(the groups hold other parameters)",
                        p->fqn, (long long)p->v[F_GROUP], p->group);
    if (p->has[F_STEP] && p->v[F_STEP] < 0)
      return weft_error(WEFT_ERR_INVALID, "set optimizer state dict: 'state.%s.step' is %lld",
                        p->fqn, (long long)p->v[F_STEP]);
  }
  if (s->has_num_steps && s->num_steps < 0)
    return weft_error(WEFT_ERR_INVALID, "set optimizer state dict: 'state.num_steps' is %lld",
                      (long long)s->num_steps);
  /* one value per group: every parameter of a group saved the same */
  for (int g = 0; g < ng; g++)
    for (int f = F_LR; f < F_NFIELDS; f++) {
      int r = first_with(s, g, f);
      if (r < 0) continue;
      for (int i = r + 1; i < s->n; i++) {
        const pg_saved *p = &s->p[i];
        if (!p->fqn || p->group != g || !p->has[f]) continue;
        if (p->v[f] == s->p[r].v[f] && (f != F_BETAS || p->beta2 == s->p[r].beta2)) continue;
        return weft_error(WEFT_ERR_INVALID,
                          "set optimizer state dict: parameter group %d: "
                          "'%s' and '%s' have different saved %s (%.9g vs %.9g): the "
                          "checkpoint's groups hold other parameters than the optimizer's",
                          g, s->p[r].fqn, p->fqn, field_name[f], s->p[r].v[f], p->v[f]);
      }
    }
  /* commit: hyper-parameters per group (rolled back if one is refused) */
  if (s->adam) {
    weft_adamw_params *old = malloc((size_t)ng * sizeof *old);
    if (!old) return weft_error(WEFT_ERR_OOM, "optimizer groups");
    weft_status st = WEFT_OK;
    for (int g = 0; g < ng && st == WEFT_OK; g++) st = weft_optimizer_group_get(opt, g, &old[g]);
    int g = 0;
    for (; g < ng && st == WEFT_OK; g++) {
      weft_adamw_params hp = old[g];
      for (int f = F_LR; f < F_NFIELDS; f++) {
        int r = first_with(s, g, f);
        if (r >= 0) hp_set_field(&hp, &s->p[r], f);
      }
      int r = first_with(s, g, F_AMSGRAD);
      if (r >= 0 && (s->p[r].v[F_AMSGRAD] != 0) != old[g].amsgrad)
        st = weft_error(WEFT_ERR_INVALID,
                        "set optimizer state dict: parameter group %d has "
                        "amsgrad %s in the checkpoint but %s in the optimizer (its "
                        "max_exp_avg_sq state cannot be added or dropped)",
                        g, old[g].amsgrad ? "false" : "true", old[g].amsgrad ? "true" : "false");
      if (st == WEFT_OK && weft_optimizer_group_set(opt, g, &hp) != WEFT_OK)
        st = weft_error(WEFT_ERR_INVALID, "set optimizer state dict: parameter group %d: %s", g,
                        dcp_last_msg());
    }
    if (st != WEFT_OK)
      for (int k = 0; k < g; k++) (void)weft_optimizer_group_set(opt, k, &old[k]);
    free(old);
    WEFT_CHECK(st);
  } else {
    for (int i = 0; i < s->n; i++)
      if (s->p[i].fqn && s->p[i].has[F_LR]) {
        weft_optimizer_set_lr(opt, (float)s->p[i].v[F_LR]); /* one rate: the first */
        break;
      }
  }
  for (int i = 0; i < s->n; i++)
    if (s->p[i].fqn && s->p[i].has[F_STEP])
      WEFT_CHECK(weft_optimizer_set_param_step(opt, s->p[i].fqn, (int64_t)s->p[i].v[F_STEP]));
  if (s->has_num_steps) WEFT_CHECK(weft_optimizer_set_num_steps(opt, s->num_steps));
  return WEFT_OK;
}

weft_status weft_set_optimizer_state_dict(weft_module *model, weft_optimizer *opt,
                                          const weft_state_dict *sd,
                                          const weft_state_dict_opts *opts, weft_key_list *missing,
                                          weft_key_list *unexpected) {
  weft_state_dict_opts o;
  WEFT_CHECK(get_opts(opts, &o));
  if (!opt) return weft_error(WEFT_ERR_INVALID, "optimizer is NULL");
  weft_param **ps;
  int n;
  WEFT_CHECK(params_of(model, &ps, &n));
  tlist tl = {0};
  opt_stage stage = {opt, has_groups(opt), NULL, n, false, false, 0, 0};
  stage.p = calloc((size_t)(n ? n : 1), sizeof *stage.p);
  /* one ctx per value target: at most F_NFIELDS per parameter and 2 more */
  field_ctx *ctx = calloc((size_t)n * F_NFIELDS + 2, sizeof *ctx);
  int nctx = 0;
  weft_status st = stage.p && ctx ? WEFT_OK : weft_error(WEFT_ERR_OOM, "optimizer targets");
  int ns = weft_optimizer_state_count(opt);
  for (int i = 0; i < ns && st == WEFT_OK; i++) {
    const char *name;
    weft_dtensor *dt;
    st = weft_optimizer_state_get(opt, i, &name, &dt);
    if (st == WEFT_OK) st = tl_push(&tl, name, dt, NULL, NULL, WANT_NUMBER);
  }
  if (st == WEFT_OK) {
    ctx[nctx] = (field_ctx){&stage, -1, -1};
    st = tl_push(&tl, "state.num_steps", NULL, stage_value, &ctx[nctx++], WANT_INT);
  }
  if (st == WEFT_OK && stage.adam) {
    ctx[nctx] = (field_ctx){&stage, -1, -2};
    st = tl_push(&tl, "param_groups.num_groups", NULL, stage_value, &ctx[nctx++], WANT_INT);
  }
  char key[4200];
  for (int i = 0; i < n && st == WEFT_OK; i++) {
    int64_t step;
    if (weft_optimizer_get_param_step(opt, ps[i]->fqn, &step) != WEFT_OK) {
      weft_clear_error();
      continue;
    }
    stage.p[i].fqn = ps[i]->fqn;
    if (stage.adam) st = weft_optimizer_param_group(opt, ps[i]->fqn, &stage.p[i].group);
    for (int f = 0; f < F_NFIELDS && st == WEFT_OK; f++) {
      if (!stage.adam && f != F_STEP && f != F_LR) continue;
      if (f == F_STEP)
        snprintf(key, sizeof key, "state.%s.step", ps[i]->fqn);
      else
        snprintf(key, sizeof key, "param_groups.%s.%s", ps[i]->fqn, field_name[f]);
      want_kind w = f == F_STEP || f == F_GROUP      ? WANT_INT
                    : f == F_BETAS || f == F_AMSGRAD ? WANT_JSON
                                                     : WANT_NUMBER;
      ctx[nctx] = (field_ctx){&stage, i, f};
      st = tl_push(&tl, key, NULL, stage_value, &ctx[nctx++], w);
    }
  }
  if (st == WEFT_OK) st = apply(&tl, sd, &o, true, opt_finish, &stage, missing, unexpected);
  tl_free(&tl);
  free(ctx);
  free(stage.p);
  free(ps);
  return st;
}
