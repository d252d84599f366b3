/* tp/parallelize.c — weft_parallelize_module: matches a plan against the
 * module tree, shards parameters, and registers the hooks that move
 * activations (forward) and their gradients (backward) between layouts.
 *
 * One application = one (module, style) pair. All applications on one
 * module share one dispatcher per hook point, so that input/output moves
 * run in plan order in forward and in reverse order in backward (nn runs
 * hooks of one point in registration order). */
#include <stdlib.h>
#include <string.h>

#include "tp.h"

/* What one application does, resolved from its style and module kind,
 * plus what its last forward did (for the backward). */
typedef struct tp_app {
  weft_tp_style style;
  int entry; /* plan entry index */
  weft_module *m;
  /* input side */
  bool in_active; /* has an input move */
  bool in_check;  /* the input must arrive as in_decl */
  weft_placement in_decl;
  weft_placement in_want;
  /* output side */
  bool out_active;
  bool out_check;
  weft_placement out_decl;
  weft_placement out_want;
  /* parameter placement (colwise/rowwise/sequence parallel) */
  bool sets_param;
  weft_placement param_pl; /* "weight" (sequence parallel: every parameter) */
  weft_placement bias_pl;  /* the module's other parameters (bias) */
  /* state of the last forward */
  bool in_moved, out_moved;
  weft_placement in_src, out_src;
} tp_app;

/* Per module: its applications in plan order and its hooks. */
typedef struct tp_mod {
  weft_tp *tp;
  weft_module *m;
  int *apps; /* indices into tp->apps */
  int napps;
  bool reg[WEFT_HOOK_KIND_COUNT];
  weft_hook_handle h[WEFT_HOOK_KIND_COUNT];
} tp_mod;

/* A parameter whose placements were changed (for rollback). */
typedef struct tp_moved_param {
  weft_param *p;
  weft_placement old;
} tp_moved_param;

struct weft_tp {
  weft_mesh *mesh;
  tp_app *apps;
  int napps;
  tp_mod *mods;
  int nmods;
  tp_moved_param *moved;
  int nmoved;
  weft_module *loss_module; /* loss parallel installed here */
  weft_tp_loss *loss;
};

static const char *fqn_of(const weft_module *m) {
  const char *f = weft_module_fqn(m);
  return f[0] ? f : "(root)";
}

/* ----------------------------------------------------------- placements */

/* Normalises a layout for an activation of `ndim` dims. */
static weft_status norm_layout(const tp_app *a, const char *what, weft_placement p, int ndim,
                               weft_placement *out) {
  *out = p;
  if (p.kind != WEFT_PLACE_SHARD && p.kind != WEFT_PLACE_STRIDED_SHARD) return WEFT_OK;
  int d = p.dim < 0 ? p.dim + ndim : p.dim;
  if (d < 0 || d >= ndim) {
    char s[96];
    weft_tp_style_describe(&a->style, s, sizeof s);
    return weft_error(
        WEFT_ERR_INVALID, "tp: module '%s' (%s): %s layout %s(%d) does not fit a %d-dim tensor",
        fqn_of(a->m), s, what, p.kind == WEFT_PLACE_SHARD ? "S" : "StridedShard", p.dim, ndim);
  }
  out->dim = d;
  return WEFT_OK;
}

/* The placement a gradient is moved back to: the forward source, with a
 * Partial source taken as Replicate (the grad of a partial value is
 * replicated: Redistribute's backward in DTensor). */
static weft_placement grad_target(weft_placement src) {
  return src.kind == WEFT_PLACE_PARTIAL ? weft_replicate() : src;
}

/* Redistributes t to placement p (1-D mesh) into *out; *out NULL when t is
 * already there. */
static weft_status move(const weft_dtensor *t, weft_placement p, weft_dtensor **out) {
  *out = NULL;
  if (weft_placement_equal(weft_dtensor_placements(t)[0], p)) return WEFT_OK;
  return weft_dtensor_redistribute(t, &p, 1, out);
}

/* ---------------------------------------------------------------- moves */

/* One side (input or output) of an application, forward: checks that t
 * arrives as the declared layout (when `check`), then moves it to `want`;
 * *moved / *src remember the move for the backward. `verb` and `hint` word
 * the mismatch error ("input arrives as X but the plan declares
 * input_layouts Y (hint)"). */
static weft_status side_forward(tp_app *a, const char *side, bool check, weft_placement decl_in,
                                weft_placement want_in, const char *verb, const char *hint,
                                const weft_dtensor *t, bool *moved, weft_placement *src,
                                weft_dtensor **res) {
  *res = NULL;
  *moved = false;
  if (weft_mesh_ndim(weft_dtensor_mesh(t)) != 1)
    return weft_error(WEFT_ERR_INVALID, "tp: module '%s': %s is not on a 1-D mesh", fqn_of(a->m),
                      side);
  int nd = weft_dtensor_ndim(t);
  weft_placement have = weft_dtensor_placements(t)[0], want;
  if (check) {
    weft_placement decl;
    WEFT_CHECK(norm_layout(a, side, decl_in, nd, &decl));
    if (!weft_placement_equal(have, decl)) {
      char s[96], h[32], d[32];
      weft_tp_style_describe(&a->style, s, sizeof s);
      weft_placement_describe(have, h, sizeof h);
      weft_placement_describe(decl, d, sizeof d);
      return weft_error(WEFT_ERR_INVALID,
                        "tp: module '%s' (%s): %s %s %s but the plan declares %s_layouts %s%s",
                        fqn_of(a->m), s, side, verb, h, side, d, hint);
    }
  }
  WEFT_CHECK(norm_layout(a, side, want_in, nd, &want));
  WEFT_CHECK(move(t, want, res));
  if (*res) {
    *moved = true;
    *src = have;
  }
  return WEFT_OK;
}

/* Backward of a side: moves the grad back to the layout the forward's
 * input had (grad_target), when the forward moved it. */
static weft_status side_backward(bool moved, weft_placement src, const weft_dtensor *g,
                                 weft_dtensor **res) {
  *res = NULL;
  if (!moved || !g) return WEFT_OK;
  return move(g, grad_target(src), res);
}

static weft_status app_input_forward(tp_app *a, const weft_dtensor *x, weft_dtensor **res) {
  return side_forward(a, "input", a->in_check, a->in_decl, a->in_want, "arrives as",
                      " (fix the plan: declare the layout the previous module leaves)", x,
                      &a->in_moved, &a->in_src, res);
}

static weft_status app_input_backward(tp_app *a, const weft_dtensor *g, weft_dtensor **res) {
  return side_backward(a->in_moved, a->in_src, g, res);
}

static weft_status app_output_forward(tp_app *a, const weft_dtensor *y, weft_dtensor **res) {
  return side_forward(a, "output", a->out_check, a->out_decl, a->out_want, "is", "", y,
                      &a->out_moved, &a->out_src, res);
}

static weft_status app_output_backward(tp_app *a, const weft_dtensor *g, weft_dtensor **res) {
  return side_backward(a->out_moved, a->out_src, g, res);
}

/* ------------------------------------------------------------ dispatcher */

typedef weft_status (*app_step_fn)(tp_app *a, const weft_dtensor *t, weft_dtensor **res);

/* Runs `fn` of the module's applications (forward order or reverse) on
 * t, chaining replacements; intermediate results are freed here, the last
 * one goes to nn through *replace. */
static weft_status run_chain(tp_mod *md, bool reverse, bool input_side, app_step_fn fn,
                             const weft_dtensor *t, weft_dtensor **replace) {
  weft_dtensor *cur = NULL; /* ours, not yet handed over */
  for (int k = 0; k < md->napps; k++) {
    tp_app *a = &md->tp->apps[md->apps[reverse ? md->napps - 1 - k : k]];
    if (input_side ? !a->in_active : !a->out_active) continue;
    weft_dtensor *res = NULL;
    weft_status st = fn(a, cur ? cur : t, &res);
    if (st) {
      weft_dtensor_destroy(cur);
      return weft_error_trace(st, __func__);
    }
    if (res) {
      weft_dtensor_destroy(cur);
      cur = res;
    }
  }
  *replace = cur;
  return WEFT_OK;
}

static weft_status tp_hook(weft_module *m, weft_hook_kind kind, const weft_dtensor *t,
                           weft_dtensor **replace, void *ctx) {
  (void)m;
  tp_mod *md = ctx;
  switch (kind) {
    case WEFT_HOOK_PRE_FORWARD:
      return run_chain(md, false, true, app_input_forward, t, replace);
    case WEFT_HOOK_POST_FORWARD:
      return run_chain(md, false, false, app_output_forward, t, replace);
    case WEFT_HOOK_PRE_BACKWARD:
      return run_chain(md, true, false, app_output_backward, t, replace);
    case WEFT_HOOK_POST_BACKWARD:
      return run_chain(md, true, true, app_input_backward, t, replace);
    default:
      return weft_error(WEFT_ERR_INTERNAL, "tp: hook kind %d", (int)kind);
  }
}

/* ---------------------------------------------------------------- planning */

typedef struct mod_list {
  weft_module **v;
  int n, cap;
} mod_list;

static weft_status collect_visit(weft_module *m, void *ctx) {
  mod_list *l = ctx;
  if (l->n == l->cap) {
    int cap = l->cap ? 2 * l->cap : 64;
    weft_module **v = realloc(l->v, (size_t)cap * sizeof *v);
    if (!v) return weft_error(WEFT_ERR_OOM, "tp: module list");
    l->v = v;
    l->cap = cap;
  }
  l->v[l->n++] = m;
  return WEFT_OK;
}

/* FQN of m relative to root ("" for root itself). */
static const char *rel_fqn(const weft_module *root, const weft_module *m) {
  if (m == root) return "";
  const char *rf = weft_module_fqn(root), *f = weft_module_fqn(m);
  size_t n = strlen(rf);
  return n ? f + n + 1 : f;
}

static weft_param *find_weight(weft_module *m) {
  for (int i = 0; i < weft_module_num_params(m); i++) {
    weft_param *p = weft_module_param(m, i);
    if (strcmp(p->name, "weight") == 0) return p;
  }
  return NULL;
}

static weft_status check_layout(int entry, const char *pattern, const weft_tp_style *s,
                                const char *what, bool has, weft_placement p, bool required) {
  char d[96];
  weft_tp_style_describe(s, d, sizeof d);
  if (!has) {
    if (required)
      return weft_error(WEFT_ERR_INVALID, "tp: plan entry %d '%s' (%s): %s is required", entry,
                        pattern, d, what);
    return WEFT_OK;
  }
  if (p.kind != WEFT_PLACE_REPLICATE && p.kind != WEFT_PLACE_SHARD) {
    char b[32];
    weft_placement_describe(p, b, sizeof b);
    return weft_error(WEFT_ERR_INVALID,
                      "tp: plan entry %d '%s' (%s): %s %s must be Replicate or Shard", entry,
                      pattern, d, what, b);
  }
  if (p.kind == WEFT_PLACE_SHARD && (p.dim < -WEFT_MAX_DIMS || p.dim >= WEFT_MAX_DIMS))
    return weft_error(WEFT_ERR_INVALID, "tp: plan entry %d '%s' (%s): %s S(%d) is out of range",
                      entry, pattern, d, what, p.dim);
  return WEFT_OK;
}

/* Checks an entry's style on its own (before matching). */
static weft_status check_style(int e, const weft_tp_plan_entry *pe) {
  const weft_tp_style *s = &pe->style;
  if ((int)s->kind < 0 || s->kind >= WEFT_TP_STYLE_COUNT)
    return weft_error(WEFT_ERR_INVALID, "tp: plan entry %d '%s': style kind %d is invalid", e,
                      pe->pattern, (int)s->kind);
  bool prep_in = s->kind == WEFT_TP_PREPARE_INPUT, prep_out = s->kind == WEFT_TP_PREPARE_OUTPUT;
  WEFT_CHECK(check_layout(e, pe->pattern, s, "input_layouts", s->has_input_layout, s->input_layout,
                          prep_in));
  WEFT_CHECK(check_layout(e, pe->pattern, s, "desired_input_layouts", s->has_desired_input_layout,
                          s->desired_input_layout, prep_in));
  WEFT_CHECK(check_layout(e, pe->pattern, s, "output_layouts", s->has_output_layout,
                          s->output_layout, prep_out));
  WEFT_CHECK(check_layout(e, pe->pattern, s, "desired_output_layouts", s->has_desired_output_layout,
                          s->desired_output_layout, prep_out));
  if (s->split_factor < 0 || (s->split_factor > 1 && s->kind != WEFT_TP_COLWISE))
    return weft_error(WEFT_ERR_INVALID,
                      "tp: plan entry %d '%s': split_factor %d (a fused projection) is for "
                      "colwise only, and >= 0",
                      e, pe->pattern, s->split_factor);
  if (s->kind == WEFT_TP_SEQUENCE_PARALLEL &&
      (s->sequence_dim < -WEFT_MAX_DIMS || s->sequence_dim >= WEFT_MAX_DIMS))
    return weft_error(WEFT_ERR_INVALID, "tp: plan entry %d '%s': sequence_dim %d out of range", e,
                      pe->pattern, s->sequence_dim);
  return WEFT_OK;
}

/* Resolves one application of entry e's style on module m. */
static weft_status resolve(int e, const weft_tp_plan_entry *pe, weft_module *m, tp_app *a) {
  const weft_tp_style *s = &pe->style;
  weft_module_kind k = weft_module_get_kind(m);
  memset(a, 0, sizeof *a);
  a->style = *s;
  a->entry = e;
  a->m = m;
  char d[96];
  weft_tp_style_describe(s, d, sizeof d);
  bool lin = k == WEFT_MODULE_LINEAR, emb = k == WEFT_MODULE_EMBEDDING;
  switch (s->kind) {
    case WEFT_TP_COLWISE:
    case WEFT_TP_ROWWISE: {
      bool col = s->kind == WEFT_TP_COLWISE;
      if (!lin && !emb)
        return weft_error(WEFT_ERR_INVALID,
                          "tp: plan entry %d '%s' (%s) matches '%s', a %s module: %s applies to "
                          "linear and embedding modules",
                          e, pe->pattern, d, fqn_of(m), weft_module_kind_name(k),
                          weft_tp_style_kind_name(s->kind));
      weft_param *w = find_weight(m);
      if (!w)
        return weft_error(WEFT_ERR_INVALID, "tp: module '%s' has no parameter 'weight'", fqn_of(m));
      int fused = s->split_factor > 1 ? s->split_factor : 0;
      if (fused && !lin)
        return weft_error(WEFT_ERR_INVALID,
                          "tp: plan entry %d '%s' (%s) matches '%s', a %s module: a fused "
                          "colwise (split_factor %d) applies to linear modules",
                          e, pe->pattern, d, fqn_of(m), weft_module_kind_name(k), fused);
      if (fused && w->spec.shape[0] % fused != 0)
        return weft_error(WEFT_ERR_INVALID,
                          "tp: module '%s' (%s): %lld out features are not %d equal blocks",
                          fqn_of(m), d, (long long)w->spec.shape[0], fused);
      a->sets_param = true;
      /* Linear weight (out, in): colwise S(0), rowwise S(1); bias (out):
       * colwise S(0), rowwise R. Embedding weight (V, D): colwise S(1),
       * rowwise S(0). A fused colwise splits each block: StridedShard. */
      a->param_pl = fused ? weft_strided_shard(0, fused) : weft_shard((col == lin) ? 0 : 1);
      a->bias_pl = col && lin ? a->param_pl : weft_replicate();
      a->in_active = true;
      a->in_check = true;
      if (s->has_input_layout)
        a->in_decl = s->input_layout;
      else
        a->in_decl = (col || emb) ? weft_replicate() : weft_shard(-1);
      /* what the layer computes on: colwise R (Linear x, Embedding tokens);
       * rowwise Linear S(-1), Embedding tokens R */
      a->in_want = (col || emb) ? weft_replicate() : weft_shard(-1);
      a->out_active = true;
      a->out_check = false;
      if (s->has_output_layout)
        a->out_want = s->output_layout;
      else
        a->out_want = col ? weft_shard(-1) : weft_replicate();
      if (fused && a->out_want.kind == WEFT_PLACE_SHARD)
        a->out_want = weft_strided_shard(a->out_want.dim, fused);
      break;
    }
    case WEFT_TP_SEQUENCE_PARALLEL:
      if (k != WEFT_MODULE_RMSNORM && k != WEFT_MODULE_LAYERNORM)
        return weft_error(WEFT_ERR_INVALID,
                          "tp: plan entry %d '%s' (%s) matches '%s', a %s module: "
                          "sequence_parallel applies to rmsnorm and layernorm modules",
                          e, pe->pattern, d, fqn_of(m), weft_module_kind_name(k));
      a->sets_param = true;
      a->param_pl = a->bias_pl = weft_replicate();
      a->in_active = true;
      a->in_check = false; /* any input is redistributed to the sequence shard */
      a->in_want = weft_shard(s->sequence_dim);
      break;
    case WEFT_TP_PREPARE_INPUT:
      a->in_active = true;
      a->in_check = true;
      a->in_decl = s->input_layout;
      a->in_want = s->desired_input_layout;
      break;
    case WEFT_TP_PREPARE_OUTPUT:
      a->out_active = true;
      a->out_check = true;
      a->out_decl = s->output_layout;
      a->out_want = s->desired_output_layout;
      break;
    default:
      return weft_error(WEFT_ERR_INTERNAL, "tp: style kind %d", (int)s->kind);
  }
  return WEFT_OK;
}

static bool same_shape(const weft_mesh *a, const weft_mesh *b) {
  if (weft_mesh_ndim(a) != weft_mesh_ndim(b)) return false;
  for (int i = 0; i < weft_mesh_ndim(a); i++)
    if (weft_mesh_dim_size(a, i) != weft_mesh_dim_size(b, i)) return false;
  return true;
}

static void tp_unhook(weft_tp *tp) {
  for (int i = 0; i < tp->nmods; i++) {
    tp_mod *md = &tp->mods[i];
    for (int k = 0; k < WEFT_HOOK_KIND_COUNT; k++)
      if (md->reg[k]) {
        (void)weft_hook_remove(md->h[k]);
        md->reg[k] = false;
      }
  }
}

/* Puts changed parameters back (failure path). */
static void tp_rollback_params(weft_tp *tp) {
  for (int i = tp->nmoved - 1; i >= 0; i--) {
    weft_placement p = tp->moved[i].old;
    (void)weft_param_set_placements(tp->moved[i].p, &p, 1);
  }
  tp->nmoved = 0;
}

static void tp_free(weft_tp *tp) {
  if (!tp) return;
  for (int i = 0; i < tp->nmods; i++) free(tp->mods[i].apps);
  free(tp->mods);
  free(tp->apps);
  free(tp->moved);
  weft_tp_loss_destroy(tp->loss);
  free(tp);
}

weft_status weft_parallelize_module(weft_module *module, weft_mesh *tp_mesh,
                                    const weft_tp_plan_entry *plan, int nentries, weft_tp **out) {
  if (out) *out = NULL;
  if (!module || !tp_mesh || !out)
    return weft_error(WEFT_ERR_INVALID, "tp: module, tp_mesh or out is NULL");
  if (nentries < 0 || (nentries > 0 && !plan))
    return weft_error(WEFT_ERR_INVALID, "tp: plan is NULL or nentries %d < 0", nentries);
  if (weft_mesh_ndim(tp_mesh) != 1)
    return weft_error(WEFT_ERR_INVALID, "tp: tp_mesh must be 1-D, it has %d dims",
                      weft_mesh_ndim(tp_mesh));
  if (!same_shape(weft_module_mesh(module), tp_mesh)) {
    char a[128], b[128];
    weft_mesh_describe(weft_module_mesh(module), a, sizeof a);
    weft_mesh_describe(tp_mesh, b, sizeof b);
    return weft_error(WEFT_ERR_INVALID,
                      "tp: module '%s' is on %s but tp_mesh is %s (build the model on the tp "
                      "mesh)",
                      fqn_of(module), a, b);
  }
  for (int e = 0; e < nentries; e++) {
    if (!plan[e].pattern)
      return weft_error(WEFT_ERR_INVALID, "tp: plan entry %d has a NULL pattern", e);
    WEFT_CHECK(check_style(e, &plan[e]));
  }

  weft_status st = WEFT_OK;
  mod_list all = {0};
  weft_tp *tp = NULL;
  int *napps_of = NULL; /* per module in `all` */
  int *param_entry = NULL;
  WEFT_CHECK_GOTO(weft_module_visit(module, collect_visit, &all), st, fail);
  napps_of = calloc((size_t)all.n, sizeof *napps_of);
  param_entry = malloc((size_t)all.n * sizeof *param_entry);
  tp = calloc(1, sizeof *tp);
  if (!napps_of || !param_entry || !tp) {
    st = weft_error(WEFT_ERR_OOM, "tp: state");
    goto fail;
  }
  for (int i = 0; i < all.n; i++) param_entry[i] = -1;
  tp->mesh = tp_mesh;

  /* 1. match and resolve everything (no change yet) */
  int total = 0;
  for (int e = 0; e < nentries; e++) {
    int hits = 0;
    for (int i = 0; i < all.n; i++)
      if (weft_tp_fqn_match(plan[e].pattern, rel_fqn(module, all.v[i]))) hits++;
    if (hits == 0) {
      st = weft_error(WEFT_ERR_NOT_FOUND,
                      "tp: plan entry %d: pattern '%s' matches no module under '%s'", e,
                      plan[e].pattern, fqn_of(module));
      goto fail;
    }
    total += hits;
  }
  tp->apps = calloc(total > 0 ? (size_t)total : 1, sizeof *tp->apps);
  if (!tp->apps) {
    st = weft_error(WEFT_ERR_OOM, "tp: applications");
    goto fail;
  }
  /* module index of each application (parallel to tp->apps) */
  int *mod_of = malloc((total > 0 ? (size_t)total : 1) * sizeof *mod_of);
  if (!mod_of) {
    st = weft_error(WEFT_ERR_OOM, "tp: applications");
    goto fail;
  }
  for (int e = 0; e < nentries && !st; e++)
    for (int i = 0; i < all.n && !st; i++) {
      if (!weft_tp_fqn_match(plan[e].pattern, rel_fqn(module, all.v[i]))) continue;
      tp_app *a = &tp->apps[tp->napps];
      st = resolve(e, &plan[e], all.v[i], a);
      if (st) break;
      if (a->sets_param) {
        if (param_entry[i] >= 0) {
          st = weft_error(WEFT_ERR_INVALID,
                          "tp: module '%s' gets two parameter styles: entry %d '%s' (%s) and "
                          "entry %d '%s' (%s)",
                          fqn_of(all.v[i]), param_entry[i], plan[param_entry[i]].pattern,
                          weft_tp_style_kind_name(plan[param_entry[i]].style.kind), e,
                          plan[e].pattern, weft_tp_style_kind_name(plan[e].style.kind));
          break;
        }
        param_entry[i] = e;
      }
      mod_of[tp->napps++] = i;
      napps_of[i]++;
    }
  if (st) {
    free(mod_of);
    goto fail;
  }

  /* 2. per-module dispatch records */
  int nm = 0;
  for (int i = 0; i < all.n; i++) nm += napps_of[i] > 0;
  tp->mods = calloc(nm > 0 ? (size_t)nm : 1, sizeof *tp->mods);
  int nparams = 0; /* parameters a style may move (weight and bias) */
  for (int k = 0; k < tp->napps; k++) nparams += weft_module_num_params(tp->apps[k].m);
  tp->moved = calloc(nparams > 0 ? (size_t)nparams : 1, sizeof *tp->moved);
  if (!tp->mods || !tp->moved) {
    free(mod_of);
    st = weft_error(WEFT_ERR_OOM, "tp: module records");
    goto fail;
  }
  for (int i = 0; i < all.n && !st; i++) {
    if (!napps_of[i]) continue;
    tp_mod *md = &tp->mods[tp->nmods++];
    md->tp = tp;
    md->m = all.v[i];
    md->apps = malloc((size_t)napps_of[i] * sizeof *md->apps);
    if (!md->apps) {
      st = weft_error(WEFT_ERR_OOM, "tp: module records");
      break;
    }
    for (int k = 0; k < tp->napps; k++)
      if (mod_of[k] == i) md->apps[md->napps++] = k;
  }
  free(mod_of);
  if (st) goto fail;

  /* 3. apply: parameter placements, then hooks */
  for (int k = 0; k < tp->napps; k++) {
    tp_app *a = &tp->apps[k];
    if (!a->sets_param) continue;
    for (int j = 0; j < weft_module_num_params(a->m); j++) {
      weft_param *p = weft_module_param(a->m, j);
      weft_placement want = strcmp(p->name, "weight") == 0 ? a->param_pl : a->bias_pl;
      weft_placement old = p->spec.placements[0];
      if (weft_placement_equal(old, want)) continue;
      WEFT_CHECK_GOTO(weft_param_set_placements(p, &want, 1), st, fail);
      tp->moved[tp->nmoved].p = p;
      tp->moved[tp->nmoved].old = old;
      tp->nmoved++;
    }
  }
  for (int i = 0; i < tp->nmods; i++) {
    tp_mod *md = &tp->mods[i];
    bool need[WEFT_HOOK_KIND_COUNT] = {false};
    for (int k = 0; k < md->napps; k++) {
      const tp_app *a = &tp->apps[md->apps[k]];
      if (a->in_active) need[WEFT_HOOK_PRE_FORWARD] = need[WEFT_HOOK_POST_BACKWARD] = true;
      if (a->out_active) need[WEFT_HOOK_POST_FORWARD] = need[WEFT_HOOK_PRE_BACKWARD] = true;
    }
    for (int h = 0; h < WEFT_HOOK_KIND_COUNT; h++) {
      if (!need[h]) continue;
      WEFT_CHECK_GOTO(weft_module_register_hook(md->m, (weft_hook_kind)h, tp_hook, md, &md->h[h]),
                      st, fail);
      md->reg[h] = true;
    }
  }
  free(all.v);
  free(napps_of);
  free(param_entry);
  *out = tp;
  return WEFT_OK;

fail:
  if (tp) {
    tp_unhook(tp);
    tp_rollback_params(tp);
    tp_free(tp);
  }
  free(all.v);
  free(napps_of);
  free(param_entry);
  return st;
}

void weft_tp_destroy(weft_tp *tp) {
  if (!tp) return;
  tp_unhook(tp);
  if (tp->loss_module) (void)weft_loss_set_impl(tp->loss_module, NULL, NULL);
  tp_free(tp);
}

weft_mesh *weft_tp_mesh(const weft_tp *tp) { return tp ? tp->mesh : NULL; }

int weft_tp_num_applied(const weft_tp *tp) { return tp ? tp->napps : 0; }

size_t weft_tp_describe(const weft_tp *tp, char *buf, size_t cap) {
  size_t need = 0;
  if (buf && cap) buf[0] = '\0';
  if (!tp) return 0;
  for (int k = 0; k < tp->napps; k++) {
    char s[128], line[512];
    weft_tp_style_describe(&tp->apps[k].style, s, sizeof s);
    int n = snprintf(line, sizeof line, "%s: %s\n", fqn_of(tp->apps[k].m), s);
    if (n < 0) continue;
    if (buf && need + 1 < cap) {
      size_t room = cap - need - 1, len = (size_t)n < room ? (size_t)n : room;
      memcpy(buf + need, line, len);
      buf[need + len] = '\0';
    }
    need += (size_t)n;
  }
  return need;
}

weft_status weft_tp_enable_loss_parallel(weft_tp *tp, weft_module *loss_module) {
  if (!tp || !loss_module) return weft_error(WEFT_ERR_INVALID, "tp: tp or loss module is NULL");
  if (weft_module_get_kind(loss_module) != WEFT_MODULE_LOSS)
    return weft_error(WEFT_ERR_INVALID, "tp: '%s' is a %s module, not a loss", fqn_of(loss_module),
                      weft_module_kind_name(weft_module_get_kind(loss_module)));
  if (tp->loss_module && tp->loss_module != loss_module)
    return weft_error(WEFT_ERR_INVALID, "tp: loss parallel is already installed on '%s'",
                      fqn_of(tp->loss_module));
  if (!tp->loss) WEFT_CHECK(weft_tp_loss_create(&tp->loss));
  WEFT_CHECK(weft_loss_set_impl(loss_module, weft_tp_loss_impl(), tp->loss));
  tp->loss_module = loss_module;
  return WEFT_OK;
}
