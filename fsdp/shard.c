/* fsdp/shard.c — weft_fully_shard: argument checks, the sharded layout of
 * every parameter (placements on the dp (+ tp) mesh, rows this rank keeps,
 * offsets in the group's flat buffer), the registry of groups, queries,
 * settings and destruction. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsdp_internal.h"

weft_fsdp *fsdp__registry = NULL;

/* ------------------------------------------------------------- helpers */

bool fsdp__module_within(const weft_module *m, const weft_module *anc) {
  for (const weft_module *a = m; a; a = weft_module_parent(a))
    if (a == anc) return true;
  return false;
}

bool fsdp__group_within(const weft_fsdp *g, const weft_fsdp *f) {
  for (int i = 0; i < g->nmodules; i++) {
    bool in = false;
    for (int j = 0; j < f->nmodules && !in; j++)
      in = fsdp__module_within(g->modules[i], f->modules[j]);
    if (!in) return false;
  }
  return true;
}

static const char *mname(const weft_module *m) {
  const char *f = weft_module_fqn(m);
  return f[0] ? f : weft_module_name(m);
}

weft_fsdp *weft_fsdp_of(const weft_module *m) {
  if (!m) return NULL;
  for (weft_fsdp *f = fsdp__registry; f; f = f->next)
    for (int i = 0; i < f->nmodules; i++)
      if (f->modules[i] == m) return f;
  return NULL;
}

/* The group that holds parameter p, or NULL. */
static weft_fsdp *owner_of(const weft_param *p) {
  for (weft_fsdp *f = fsdp__registry; f; f = f->next)
    for (int i = 0; i < f->nparams; i++)
      if (f->params[i].p == p) return f;
  return NULL;
}

static bool dtype_ok(weft_dtype d) {
  return d == WEFT_DTYPE_COUNT || d == WEFT_F32 || d == WEFT_BF16 || d == WEFT_F16;
}

static weft_status check_opts(const weft_fsdp_options *o) {
  if (o->version != WEFT_FSDP_OPTIONS_VERSION)
    return weft_error(WEFT_ERR_INVALID,
                      "fsdp options version %d, this library has %d (start from "
                      "WEFT_FSDP_OPTIONS_INIT)",
                      o->version, WEFT_FSDP_OPTIONS_VERSION);
  if (o->reshard_after_forward < -1)
    return weft_error(WEFT_ERR_INVALID,
                      "reshard_after_forward %d: use -1 (default), 0 (false), 1 (true) or a group "
                      "size >= 2",
                      o->reshard_after_forward);
  const struct {
    const char *n;
    weft_dtype d;
  } ds[3] = {{"param_dtype", o->mp.param_dtype},
             {"reduce_dtype", o->mp.reduce_dtype},
             {"output_dtype", o->mp.output_dtype}};
  for (int i = 0; i < 3; i++)
    if (!dtype_ok(ds[i].d))
      return weft_error(WEFT_ERR_INVALID,
                        "mixed precision %s is %s: use f32, bf16, f16 or WEFT_DTYPE_COUNT (unset)",
                        ds[i].n, weft_dtype_name(ds[i].d));
  return WEFT_OK;
}

/* Checks a reshard_after_forward value against the shard dim size and
 * normalises it: k >= n is true (1). */
static weft_status resolve_raf(int value, int nshard, int *out) {
  if (value <= 1) {
    *out = value;
    return WEFT_OK;
  }
  if (value >= nshard) {
    if (value > nshard)
      return weft_error(WEFT_ERR_INVALID,
                        "reshard_after_forward group size %d is larger than the shard dim (%d "
                        "ranks): use a divisor of %d",
                        value, nshard, nshard);
    *out = 1;
    return WEFT_OK;
  }
  if (nshard % value)
    return weft_error(WEFT_ERR_INVALID,
                      "reshard_after_forward group size %d does not divide the shard dim size %d",
                      value, nshard);
  *out = value;
  return WEFT_OK;
}

/* The private (n/k, k) mesh over the shard dim's communicator. Collective
 * over the shard dim. */
static weft_status make_small_mesh(weft_fsdp *f, int k) {
  if (f->small_mesh && weft_mesh_dim_size(f->small_mesh, 1) == k) return WEFT_OK;
  if (f->small_mesh) {
    fsdp__drop_small(f);
    WEFT_CHECK(weft_mesh_destroy(f->small_mesh));
    f->small_mesh = NULL;
  }
  int shape[2] = {f->nshard / k, k};
  const char *names[2] = {"fsdp_post_forward_rep", "fsdp_post_forward_shard"};
  return weft_mesh_create_from_comm(weft_mesh_dim_comm(f->dp_mesh, f->shard_dim), 2, shape, names,
                                    &f->small_mesh);
}

/* ----------------------------------------------------------- layouts */

/* The sharded placements of a parameter whose model-mesh placements are
 * tp_pl (ntp entries), into out: the dp placements, then tp's (with TP). */
static int sharded_placements(const weft_fsdp *f, bool with_tp, const weft_placement *tp_pl,
                              const int *tp_shape, int ntp, weft_placement *out) {
  int split = 1;
  if (with_tp)
    for (int i = 0; i < ntp; i++)
      if (weft_placement_is_shard(tp_pl[i]) && tp_pl[i].dim == 0)
        split *=
            tp_shape[i] * (tp_pl[i].kind == WEFT_PLACE_STRIDED_SHARD ? tp_pl[i].split_factor : 1);
  int k = 0;
  if (f->rep_dim >= 0) out[k++] = weft_replicate();
  /* dp splits the TP shard: StridedShard(0, split) where TP split dim 0 */
  out[k++] = split > 1 ? weft_strided_shard(0, split) : weft_shard(0);
  if (with_tp)
    for (int i = 0; i < ntp; i++) out[k++] = tp_pl[i];
  return k;
}

typedef struct build_param {
  fsdp_param fp;
  weft_placement pl[WEFT_MESH_MAX_DIMS];
  int npl;
  weft_dtensor *sharded; /* made before anything changes */
} build_param;

/* Collects the parameters of m's subtree that no group inside `self`
 * (already registered) took. */
static weft_status collect_params(weft_module *m, const weft_fsdp *self, weft_param ***ps, int *n,
                                  int *cap) {
  for (int i = 0; i < weft_module_num_params(m); i++) {
    weft_param *p = weft_module_param(m, i);
    weft_fsdp *g = owner_of(p);
    if (g) {
      if (fsdp__group_within(g, self)) continue; /* a child group (bottom-up) */
      return weft_error(WEFT_ERR_INVALID,
                        "parameter '%s' already belongs to the FSDP group '%s', which is not "
                        "inside this group: a parameter can be in one group only (shared "
                        "parameters must be sharded with the module that owns them)",
                        p->fqn, g->name);
    }
    for (int j = 0; j < *n; j++)
      if ((*ps)[j] == p)
        return weft_error(WEFT_ERR_INVALID,
                          "parameter '%s' is reached twice in this group: a parameter can be "
                          "in one group only",
                          p->fqn);
    if (*n == *cap) {
      int c = *cap ? 2 * *cap : 16;
      weft_param **q = realloc(*ps, (size_t)c * sizeof *q);
      if (!q) return weft_error(WEFT_ERR_OOM, "parameter list");
      *ps = q;
      *cap = c;
    }
    (*ps)[(*n)++] = p;
  }
  for (int i = 0; i < weft_module_num_children(m); i++)
    WEFT_CHECK(collect_params(weft_module_child(m, i), self, ps, n, cap));
  return WEFT_OK;
}

/* ------------------------------------------------------ tied parameters
 * A tied parameter (weft_module_tie_param: GPT-2's lm_head.weight =
 * transformer.wte.weight) is one parameter used by several modules: its
 * owner and the modules holding an alias. As in FSDP2, it must sit in the
 * group of a common ancestor of all of them (the lowest one, normally),
 * whose unshard spans every use: a group of the owner alone would reshard
 * it after the owner's forward, before the alias's module reads it. So a
 * group may take a parameter only when every module that uses it lies in
 * the group's subtrees. (The alias's own group, e.g. fully_shard(lm_head),
 * takes nothing for it: the alias is not its parameter.) */

typedef struct tie_use {
  weft_module *user; /* the module holding the alias */
  const char *alias; /* its local name there */
  weft_param *p;
} tie_use;

typedef struct tie_list {
  tie_use *u;
  int n, cap;
} tie_list;

static weft_status collect_ties(weft_module *m, void *ctx) {
  tie_list *l = ctx;
  for (int i = 0; i < weft_module_num_tied(m); i++) {
    if (l->n == l->cap) {
      int c = l->cap ? 2 * l->cap : 8;
      tie_use *u = realloc(l->u, (size_t)c * sizeof *u);
      if (!u) return weft_error(WEFT_ERR_OOM, "tied parameter list");
      l->u = u;
      l->cap = c;
    }
    tie_use *t = &l->u[l->n++];
    t->user = m;
    t->p = weft_module_tied(m, i, &t->alias);
  }
  return WEFT_OK;
}

static weft_module *tree_root(weft_module *m) {
  while (weft_module_parent(m)) m = weft_module_parent(m);
  return m;
}

/* The lowest module whose subtree holds both a and b. */
static weft_module *common_ancestor(weft_module *a, const weft_module *b) {
  for (weft_module *x = a; x; x = weft_module_parent(x))
    if (fsdp__module_within(b, x)) return x;
  return NULL;
}

static bool within_any(const weft_module *m, weft_module *const *mods, int n) {
  for (int i = 0; i < n; i++)
    if (fsdp__module_within(m, mods[i])) return true;
  return false;
}

/* Every parameter of ps[0..np) that is tied must have all its users inside
 * the group's modules; else WEFT_ERR_INVALID naming the parameter, the
 * alias's FQN and the module to shard instead. Local, no changes. */
static weft_status check_tied(weft_module *const *mods, int nmods, const char *group,
                              weft_param *const *ps, int np) {
  tie_list l = {0};
  weft_status st = weft_module_visit(tree_root(mods[0]), collect_ties, &l);
  for (int k = 0; st == WEFT_OK && k < l.n; k++) {
    const tie_use *t = &l.u[k];
    bool mine = false;
    for (int i = 0; i < np && !mine; i++) mine = ps[i] == t->p;
    if (!mine || within_any(t->user, mods, nmods)) continue;
    /* the lowest common ancestor of the owner and every user */
    weft_module *lca = t->p->module;
    for (int j = 0; j < l.n && lca; j++)
      if (l.u[j].p == t->p) lca = common_ancestor(lca, l.u[j].user);
    const char *uf = weft_module_fqn(t->user);
    char alias[1024];
    snprintf(alias, sizeof alias, "%s%s%s", uf, uf[0] ? "." : "", t->alias);
    st = weft_error(WEFT_ERR_INVALID,
                    "fully_shard('%s'): parameter '%s' is tied: module '%s' uses it as '%s', "
                    "outside this group; FSDP keeps a shared parameter in the group of the "
                    "lowest common ancestor of the modules that use it: apply fully_shard to "
                    "'%s' instead (after its other children) and leave '%s' to it",
                    group, t->p->fqn, mname(t->user), alias, lca ? mname(lca) : "?", t->p->fqn);
  }
  free(l.u);
  return st;
}

/* Layout of one parameter: tp-local shape, this rank's rows, sharded
 * placements and spec, checked against dtensor's geometry. */
static weft_status layout_param(weft_fsdp *f, bool with_tp, weft_param *p, build_param *b) {
  const weft_dtensor_spec *ps = &p->spec;
  char pd[128];
  int nblocks = 1, nstrided = 0;
  for (int i = 0; i < ps->mesh_ndim; i++) {
    weft_placement q = ps->placements[i];
    if (q.kind == WEFT_PLACE_STRIDED_SHARD) {
      nblocks = q.split_factor;
      nstrided++;
    }
    if (q.kind == WEFT_PLACE_PARTIAL ||
        (q.kind == WEFT_PLACE_STRIDED_SHARD && (q.dim != 0 || nstrided > 1))) {
      weft_placements_describe(ps->placements, ps->mesh_ndim, pd, sizeof pd);
      return weft_error(WEFT_ERR_INVALID,
                        "parameter '%s' has placements %s: FSDP shards parameters that are "
                        "Shard or Replicate on the model mesh, or StridedShard on dim 0 on one "
                        "mesh dim (a fused projection)",
                        p->fqn, pd);
    }
  }
  if (ps->dtype != WEFT_F32)
    return weft_error(WEFT_ERR_UNSUPPORTED, "parameter '%s' is %s: FSDP keeps f32 parameters",
                      p->fqn, weft_dtype_name(ps->dtype));
  if (ps->ndim < 1)
    return weft_error(WEFT_ERR_UNSUPPORTED, "parameter '%s' is 0-d: nothing to shard on dim 0",
                      p->fqn);
  if (p->data && !weft_dtensor_spec_equal(weft_dtensor_get_spec(p->data), ps)) {
    char a[256], c[256];
    weft_dtensor_spec_describe(weft_dtensor_get_spec(p->data), a, sizeof a);
    weft_dtensor_spec_describe(ps, c, sizeof c);
    return weft_error(WEFT_ERR_STATE,
                      "parameter '%s' holds %s but its recorded layout is %s (is it already "
                      "sharded by something else?)",
                      p->fqn, a, c);
  }
  if (p->data && !weft_tensor_is_contiguous(weft_dtensor_local(p->data)))
    return weft_error(WEFT_ERR_UNSUPPORTED, "parameter '%s' has a non-contiguous local shard",
                      p->fqn);
  fsdp_param *fp = &b->fp;
  memset(fp, 0, sizeof *fp);
  fp->p = p;
  fp->ndim = ps->ndim;
  int tpc[WEFT_MESH_MAX_DIMS], tps[WEFT_MESH_MAX_DIMS];
  for (int i = 0; i < ps->mesh_ndim; i++) {
    tpc[i] = weft_mesh_coord(p->mesh, i);
    tps[i] = ps->mesh_shape[i];
  }
  WEFT_CHECK(weft_dtensor_spec_local_shape(ps, tpc, fp->local_shape, NULL, NULL));
  fp->rows = fp->local_shape[0];
  fp->rest = 1;
  for (int d = 1; d < fp->ndim; d++) fp->rest *= fp->local_shape[d];
  int64_t n = f->nshard;
  fp->nblocks = nblocks;
  fp->block_rows = fp->rows / nblocks;
  if (nblocks > 1 && (fp->rows % nblocks != 0 || fp->block_rows % n != 0))
    return weft_error(WEFT_ERR_UNSUPPORTED,
                      "parameter '%s': its tp-local rows are %d fused blocks of %lld rows, "
                      "which FSDP splits over %lld ranks only when they divide evenly",
                      p->fqn, nblocks, (long long)(fp->rows / nblocks), (long long)n);
  fp->pad_rows = (fp->rows + n - 1) / n;
  weft_chunk_range(fp->rows, n, f->coord, &fp->shard_start, &fp->shard_len);
  if (nblocks > 1) fp->shard_start = f->coord * (fp->block_rows / n); /* of block 0 */
  b->npl = sharded_placements(f, with_tp, ps->placements, tps, ps->mesh_ndim, b->pl);
  /* dtensor's geometry must give exactly chunk(tp_local, n)[coord] */
  weft_dtensor_spec ss;
  WEFT_CHECK(
      weft_dtensor_spec_init_mesh(&ss, f->spmd_mesh, b->pl, b->npl, WEFT_F32, ps->ndim, ps->shape));
  int sc[WEFT_MESH_MAX_DIMS];
  for (int i = 0; i < b->npl; i++) sc[i] = weft_mesh_coord(f->spmd_mesh, i);
  int64_t ls[WEFT_MAX_DIMS], off[WEFT_MAX_DIMS];
  bool contiguous = true;
  WEFT_CHECK(weft_dtensor_spec_local_shape(&ss, sc, ls, off, &contiguous));
  /* (a fused projection's shard is one run per block: not contiguous) */
  bool ok = (contiguous || nblocks > 1) && ls[0] == fp->shard_len;
  for (int d = 1; ok && d < fp->ndim; d++) ok = ls[d] == fp->local_shape[d];
  if (!ok) {
    weft_placements_describe(b->pl, b->npl, pd, sizeof pd);
    return weft_error(WEFT_ERR_INTERNAL,
                      "parameter '%s': sharded placements %s give a local shard of %lld rows "
                      "(%s) where FSDP keeps rows [%lld, %lld) of the tp-local tensor",
                      p->fqn, pd, (long long)ls[0], contiguous ? "contiguous" : "not contiguous",
                      (long long)fp->shard_start, (long long)(fp->shard_start + fp->shard_len));
  }
  return WEFT_OK;
}

/* --------------------------------------------------------- fully_shard */

static void group_free(weft_fsdp *f) {
  if (!f) return;
  if (f->step_comm_ready) MPI_Comm_free(&f->step_comm);
  weft_free_pinned(f->dev, f->stage);
  free(f->modules);
  free(f->name);
  free(f->params);
  free(f->hooks);
  free(f->order);
  free(f->pending);
  free(f->fwd_prefetch);
  free(f->bwd_prefetch);
  free(f);
}

static char *group_name(weft_module *const *mods, int n) {
  size_t len = 1;
  for (int i = 0; i < n; i++) len += strlen(mname(mods[i])) + 1;
  char *s = malloc(len);
  if (!s) return NULL;
  s[0] = '\0';
  for (int i = 0; i < n; i++) {
    if (i) strcat(s, "+");
    strcat(s, mname(mods[i]));
  }
  return s;
}

static bool mesh_same_shape(const weft_mesh *a, const weft_mesh *b) {
  if (weft_mesh_ndim(a) != weft_mesh_ndim(b)) return false;
  for (int i = 0; i < weft_mesh_ndim(a); i++)
    if (weft_mesh_dim_size(a, i) != weft_mesh_dim_size(b, i)) return false;
  return true;
}

static void dims_text(const weft_mesh *m, char *buf, size_t cap) {
  size_t len = 0;
  buf[0] = '\0';
  for (int i = 0; i < weft_mesh_ndim(m) && len < cap; i++)
    len += (size_t)snprintf(buf + len, cap - len, "%s%s=%d", i ? ", " : "",
                            weft_mesh_dim_name(m, i), weft_mesh_dim_size(m, i));
}

/* Chooses the mesh sharded parameters live on: the dp mesh without TP,
 * else the common root, which must be exactly (dp dims..., tp dims...). */
static weft_status choose_spmd_mesh(weft_fsdp *f, weft_mesh *model_mesh, bool *with_tp) {
  *with_tp = weft_mesh_size(model_mesh) > 1;
  if (!*with_tp) {
    f->spmd_mesh = f->dp_mesh;
    return WEFT_OK;
  }
  weft_mesh *root = weft_mesh_root(f->dp_mesh);
  char a[256], b[256], c[256];
  dims_text(f->dp_mesh, a, sizeof a);
  dims_text(model_mesh, b, sizeof b);
  if (weft_mesh_root(model_mesh) != root)
    return weft_error(WEFT_ERR_INVALID,
                      "the dp mesh (%s) and the model mesh (%s) come from different root meshes: "
                      "create one mesh with the dp dims followed by the tp dims and take both as "
                      "its sub-meshes",
                      a, b);
  int nd = weft_mesh_ndim(f->dp_mesh), nt = weft_mesh_ndim(model_mesh);
  bool ok = weft_mesh_ndim(root) == nd + nt;
  for (int i = 0; ok && i < nd; i++)
    ok = strcmp(weft_mesh_dim_name(root, i), weft_mesh_dim_name(f->dp_mesh, i)) == 0;
  for (int i = 0; ok && i < nt; i++)
    ok = strcmp(weft_mesh_dim_name(root, nd + i), weft_mesh_dim_name(model_mesh, i)) == 0;
  if (!ok) {
    dims_text(root, c, sizeof c);
    return weft_error(WEFT_ERR_INVALID,
                      "FSDP over TP lays parameters out on the root mesh, which must have exactly "
                      "the dp dims (%s) followed by the tp dims (%s); it has (%s)",
                      a, b, c);
  }
  f->spmd_mesh = root;
  return WEFT_OK;
}

static weft_status check_modules(weft_module *const *mods, int n, weft_mesh *mesh) {
  if (n < 1) return weft_error(WEFT_ERR_INVALID, "fully_shard: %d modules (need >= 1)", n);
  if (!mods) return weft_error(WEFT_ERR_INVALID, "fully_shard: modules is NULL");
  for (int i = 0; i < n; i++)
    if (!mods[i]) return weft_error(WEFT_ERR_INVALID, "fully_shard: module %d is NULL", i);
  if (!mesh) return weft_error(WEFT_ERR_INVALID, "fully_shard: mesh is NULL");
  int nd = weft_mesh_ndim(mesh);
  if (nd != 1 && nd != 2) {
    char a[256];
    dims_text(mesh, a, sizeof a);
    return weft_error(WEFT_ERR_INVALID,
                      "fully_shard: the dp mesh (%s) has %d dims; pass a 1-D mesh (FSDP) or a "
                      "2-D (replicate, shard) mesh (HSDP); tensor-parallel dims come from the "
                      "model mesh (weft_parallelize_module), not from here",
                      a, nd);
  }
  for (int i = 0; i < n; i++) {
    for (int j = 0; j < n; j++) {
      if (i == j) continue;
      if (mods[i] == mods[j])
        return weft_error(WEFT_ERR_INVALID, "fully_shard: module '%s' is listed twice",
                          mname(mods[i]));
      if (fsdp__module_within(mods[i], mods[j]))
        return weft_error(WEFT_ERR_INVALID,
                          "fully_shard: module '%s' is inside '%s', also in this list: its "
                          "parameters would be shared; list only '%s' (or shard '%s' first, on "
                          "its own)",
                          mname(mods[i]), mname(mods[j]), mname(mods[j]), mname(mods[i]));
    }
    if (!mesh_same_shape(weft_module_mesh(mods[i]), weft_module_mesh(mods[0])))
      return weft_error(WEFT_ERR_INVALID,
                        "fully_shard: modules '%s' and '%s' are on model meshes of different "
                        "shapes",
                        mname(mods[0]), mname(mods[i]));
    weft_fsdp *g = weft_fsdp_of(mods[i]);
    if (g)
      return weft_error(WEFT_ERR_INVALID,
                        "fully_shard called twice on '%s' (it is already in the group '%s'): "
                        "call fully_shard once per module",
                        mname(mods[i]), g->name);
  }
  /* top-down order: an ancestor already sharded */
  for (weft_fsdp *g = fsdp__registry; g; g = g->next)
    for (int j = 0; j < g->nmodules; j++)
      for (int i = 0; i < n; i++)
        if (fsdp__module_within(mods[i], g->modules[j]))
          return weft_error(WEFT_ERR_INVALID,
                            "fully_shard: '%s' was sharded before its descendant '%s': apply "
                            "fully_shard bottom-up (each block, then [norm, output], then the "
                            "root)",
                            mname(g->modules[j]), mname(mods[i]));
  return WEFT_OK;
}

weft_status weft_fully_shard_modules(weft_module *const *mods, int n, weft_mesh *mesh,
                                     const weft_fsdp_options *opts, weft_fsdp **out) {
  if (out) *out = NULL;
  weft_fsdp_options o = WEFT_FSDP_OPTIONS_INIT;
  if (opts) o = *opts;
  WEFT_CHECK(check_opts(&o));
  WEFT_CHECK(check_modules(mods, n, mesh));
  weft_fsdp *f = calloc(1, sizeof *f);
  weft_param **ps = NULL;
  build_param *bs = NULL;
  int np = 0, cap = 0;
  weft_status st = WEFT_OK;
  if (!f) return weft_error(WEFT_ERR_OOM, "fsdp group");
  f->modules = malloc((size_t)n * sizeof *f->modules);
  f->name = group_name(mods, n);
  if (!f->modules || !f->name) {
    st = weft_error(WEFT_ERR_OOM, "fsdp group");
    goto fail;
  }
  memcpy(f->modules, mods, (size_t)n * sizeof *mods);
  f->nmodules = n;
  for (int i = 0; i < n; i++) {
    const weft_module *m = mods[i];
    for (weft_fsdp *g = fsdp__registry; g; g = g->next)
      if (g->ran) {
        bool inside = false;
        for (int j = 0; j < g->nmodules && !inside; j++)
          inside = fsdp__module_within(g->modules[j], m);
        if (inside) {
          st = weft_error(WEFT_ERR_STATE,
                          "fully_shard('%s'): the group '%s' inside it already ran forward: "
                          "shard every module before the first forward",
                          mname(m), g->name);
          goto fail;
        }
      }
  }
  f->opts = o;
  f->dp_mesh = mesh;
  f->shard_dim = weft_mesh_ndim(mesh) - 1;
  f->rep_dim = weft_mesh_ndim(mesh) == 2 ? 0 : -1;
  f->nshard = weft_mesh_dim_size(mesh, f->shard_dim);
  f->coord = weft_mesh_coord(mesh, f->shard_dim);
  f->nrep = f->rep_dim >= 0 ? weft_mesh_dim_size(mesh, f->rep_dim) : 1;
  f->ag_dtype = o.mp.param_dtype == WEFT_DTYPE_COUNT ? WEFT_F32 : o.mp.param_dtype;
  f->rs_dtype = o.mp.reduce_dtype == WEFT_DTYPE_COUNT ? f->ag_dtype : o.mp.reduce_dtype;
  f->sync = true;
  f->reshard_after_backward = true;
  f->is_last_backward = true;
  f->nfwd_prefetch = f->nbwd_prefetch = -1;
  f->order_index = -1;
  f->raf_explicit = o.reshard_after_forward != WEFT_FSDP_RESHARD_DEFAULT;
  f->raf = -1;
  if (f->raf_explicit)
    WEFT_CHECK_GOTO(resolve_raf(o.reshard_after_forward, f->nshard, &f->raf), st, fail);
  for (int i = 0; i < n; i++)
    if (weft_mesh_ndim(weft_module_mesh(mods[i])) + weft_mesh_ndim(mesh) > WEFT_MESH_MAX_DIMS) {
      st = weft_error(WEFT_ERR_INVALID, "fully_shard: dp + model mesh dims exceed %d",
                      WEFT_MESH_MAX_DIMS);
      goto fail;
    }
  bool with_tp;
  WEFT_CHECK_GOTO(choose_spmd_mesh(f, weft_module_mesh(mods[0]), &with_tp), st, fail);
  for (int i = 0; i < n; i++) WEFT_CHECK_GOTO(collect_params(mods[i], f, &ps, &np, &cap), st, fail);
  WEFT_CHECK_GOTO(check_tied(mods, n, f->name, ps, np), st, fail);
  bs = calloc((size_t)(np ? np : 1), sizeof *bs);
  f->params = calloc((size_t)(np ? np : 1), sizeof *f->params);
  f->hooks = calloc((size_t)(4 * n), sizeof *f->hooks);
  if (!bs || !f->params || !f->hooks) {
    st = weft_error(WEFT_ERR_OOM, "fsdp parameters");
    goto fail;
  }
  int64_t off = 0;
  for (int i = 0; i < np; i++) {
    WEFT_CHECK_GOTO(layout_param(f, with_tp, ps[i], &bs[i]), st, fail);
    bs[i].fp.offset = off;
    off += bs[i].fp.pad_rows * bs[i].fp.rest;
    f->numel += bs[i].fp.rows * bs[i].fp.rest;
  }
  f->block = off;
  /* allocations (nothing changed yet) */
  f->dev = weft_mesh_device(f->spmd_mesh);
  f->offload = o.offload_params && f->dev != WEFT_CPU;
  for (int i = 0; i < np; i++)
    WEFT_CHECK_GOTO(weft_dtensor_zeros_on(f->spmd_mesh, f->offload ? WEFT_CPU : f->dev, WEFT_F32,
                                          ps[i]->spec.ndim, ps[i]->spec.shape, bs[i].pl, bs[i].npl,
                                          &bs[i].sharded),
                    st, fail);
  if (f->raf > 1) WEFT_CHECK_GOTO(make_small_mesh(f, f->raf), st, fail);
  f->nparams = np;
  f->max_blocks = 1;
  for (int i = 0; i < np; i++) {
    f->params[i] = bs[i].fp;
    if (bs[i].fp.nblocks > f->max_blocks) f->max_blocks = bs[i].fp.nblocks;
    f->params[i].unsharded_dtype =
        weft_module_on_graph(f->params[i].p->module) ? f->ag_dtype : WEFT_F32;
  }
  WEFT_CHECK_GOTO(fsdp__register_hooks(f), st, fail_hooks);
  /* commit: slice eager data into the shards, swap, drop grads */
  for (int i = 0; i < np; i++) {
    fsdp_param *fp = &f->params[i];
    weft_param *p = fp->p;
    fp->sharded = bs[i].sharded;
    bs[i].sharded = NULL;
    if (p->data) {
      const weft_tensor *sl = weft_dtensor_local(p->data);
      const float *src = sl->data;
      float *dst = weft_dtensor_local(fp->sharded)->data;
      /* note: the shard is on the eager tensor's device, or on the host
       * (offload); a failed copy leaves the (allocated) shard unfilled, as
       * an OOM would */
      int64_t done = 0;
      for (int b = 0; b < fp->nblocks && !st; b++) {
        int64_t start, len;
        fsdp__chunk_run(fp, f->nshard, f->coord, b, &start, &len);
        size_t cnt = (size_t)(len * fp->rest);
        if (cnt)
          st = weft_memcpy(sl->device, dst + done * fp->rest, src + start * fp->rest,
                           cnt * sizeof(float),
                           f->offload && sl->device != WEFT_CPU ? WEFT_COPY_D2H : WEFT_COPY_D2D);
        done += len;
      }
      weft_dtensor_destroy(p->data);
    }
    p->data = fp->sharded;
    weft_dtensor_destroy(p->grad);
    p->grad = NULL;
  }
  free(bs);
  free(ps);
  /* the modules may not be destroyed under the group (weft_fsdp_destroy releases) */
  for (int i = 0; i < f->nmodules; i++) weft_module_retain(f->modules[i], "fully_shard");
  f->next = fsdp__registry;
  fsdp__registry = f;
  if (out) *out = f;
  return st ? weft_error_trace(st, __func__) : WEFT_OK;
fail_hooks:
  f->nparams = 0;
fail:
  if (bs)
    for (int i = 0; i < np; i++) weft_dtensor_destroy(bs[i].sharded);
  free(bs);
  free(ps);
  if (f && f->small_mesh) weft_mesh_destroy(f->small_mesh);
  group_free(f);
  return weft_error_trace(st, __func__);
}

weft_status weft_fully_shard(weft_module *module, weft_mesh *mesh, const weft_fsdp_options *opts,
                             weft_fsdp **out) {
  if (out) *out = NULL;
  if (!module) return weft_error(WEFT_ERR_INVALID, "fully_shard: module is NULL");
  WEFT_CHECK(weft_fully_shard_modules(&module, 1, mesh, opts, out));
  return WEFT_OK;
}

/* ------------------------------------------------------------- destroy */

bool fsdp__live(const weft_fsdp *f) {
  if (!f) return false;
  for (weft_fsdp *g = fsdp__registry; g; g = g->next)
    if (g == f) return true;
  return false;
}

weft_status weft_fsdp_destroy(weft_fsdp *f) {
  if (!f) return WEFT_OK;
  if (!fsdp__live(f)) return weft_error(WEFT_ERR_INVALID, "fsdp_destroy: not a live FSDP group");
  if (f->in_forward || f->in_backward)
    return weft_error(WEFT_ERR_BUSY, "fsdp group '%s' is inside a forward or backward", f->name);
  weft_status st = WEFT_OK, s2;
  if (f->rs_pending && (s2 = fsdp__reduce_finish(f)) != WEFT_OK && !st) st = s2;
  if ((s2 = fsdp__reshard(f, false)) != WEFT_OK && !st) st = s2;
  fsdp__drop_small(f);
  for (int i = 0; i < f->nparams; i++) {
    weft_dtensor_destroy(f->params[i].acc_grad);
    f->params[i].acc_grad = NULL;
  }
  fsdp__remove_hooks(f);
  fsdp__forget(f);
  if (f->small_mesh && (s2 = weft_mesh_destroy(f->small_mesh)) != WEFT_OK && !st) st = s2;
  for (weft_fsdp **pp = &fsdp__registry; *pp; pp = &(*pp)->next)
    if (*pp == f) {
      *pp = f->next;
      break;
    }
  for (int i = 0; i < f->nmodules; i++) weft_module_release(f->modules[i]);
  group_free(f);
  return st;
}

weft_status weft_fsdp_destroy_all(weft_module *root) {
  if (!root) return weft_error(WEFT_ERR_INVALID, "fsdp_destroy_all: root is NULL");
  weft_status st = WEFT_OK;
  for (;;) {
    weft_fsdp *victim = NULL;
    for (weft_fsdp *g = fsdp__registry; g && !victim; g = g->next)
      for (int j = 0; j < g->nmodules && !victim; j++)
        if (fsdp__module_within(g->modules[j], root)) victim = g;
    if (!victim) break;
    weft_status s2 = weft_fsdp_destroy(victim);
    if (s2 == WEFT_ERR_BUSY || s2 == WEFT_ERR_INVALID) return s2;
    if (s2 && !st) st = s2;
  }
  return st;
}

/* ------------------------------------------------------------- queries */

/* A destroyed (or never created) group reads as empty: no modules, no
 * parameters, name "", not unsharded, not a root, reshard_after_forward -1
 * (issue 34: a handle used after weft_fsdp_destroy read freed memory). */
int weft_fsdp_num_modules(const weft_fsdp *f) { return fsdp__live(f) ? f->nmodules : 0; }
weft_module *weft_fsdp_module(const weft_fsdp *f, int i) {
  return (fsdp__live(f) && i >= 0 && i < f->nmodules) ? f->modules[i] : NULL;
}
const char *weft_fsdp_name(const weft_fsdp *f) { return fsdp__live(f) ? f->name : ""; }
int weft_fsdp_num_params(const weft_fsdp *f) { return fsdp__live(f) ? f->nparams : 0; }
weft_param *weft_fsdp_param(const weft_fsdp *f, int i) {
  return (fsdp__live(f) && i >= 0 && i < f->nparams) ? f->params[i].p : NULL;
}
weft_mesh *weft_fsdp_dp_mesh(const weft_fsdp *f) { return fsdp__live(f) ? f->dp_mesh : NULL; }
bool weft_fsdp_is_unsharded(const weft_fsdp *f) {
  return fsdp__live(f) && f->state == FSDP_UNSHARDED;
}
bool weft_fsdp_is_root(const weft_fsdp *f) { return fsdp__live(f) && f->is_root; }
int weft_fsdp_reshard_after_forward(const weft_fsdp *f) { return fsdp__live(f) ? f->raf : -1; }

weft_status weft_fsdp_get_info(const weft_fsdp *f, weft_fsdp_group_info *out) {
  if (!f || !out) return weft_error(WEFT_ERR_INVALID, "fsdp_get_info: NULL argument");
  if (!fsdp__live(f)) return weft_error(WEFT_ERR_INVALID, "fsdp_get_info: not a live FSDP group");
  memset(out, 0, sizeof *out);
  out->nparams = f->nparams;
  out->shard_size = f->nshard;
  out->replicate_size = f->nrep;
  out->numel = f->numel;
  for (int i = 0; i < f->nparams; i++)
    out->shard_numel += f->params[i].shard_len * f->params[i].rest;
  out->padded_shard_numel = f->block;
  out->param_dtype = f->ag_dtype;
  out->reduce_dtype = f->rs_dtype;
  out->offload_params = f->opts.offload_params;
  return WEFT_OK;
}

/* ------------------------------------------------------------ settings */

typedef weft_status (*group_fn)(weft_fsdp *g, void *ctx);

/* f, and with recurse every group inside f's modules. */
static weft_status for_groups(weft_fsdp *f, bool recurse, group_fn fn, void *ctx) {
  if (!f) return weft_error(WEFT_ERR_INVALID, "fsdp group is NULL");
  if (!fsdp__live(f)) return weft_error(WEFT_ERR_INVALID, "not a live FSDP group");
  WEFT_CHECK(fn(f, ctx));
  if (recurse)
    for (weft_fsdp *g = fsdp__registry; g; g = g->next)
      if (g != f && fsdp__group_within(g, f)) WEFT_CHECK(fn(g, ctx));
  return WEFT_OK;
}

static weft_status set_sync(weft_fsdp *g, void *ctx) {
  g->sync = *(const bool *)ctx;
  return WEFT_OK;
}
weft_status weft_fsdp_set_requires_gradient_sync(weft_fsdp *f, bool sync, bool recurse) {
  WEFT_CHECK(for_groups(f, recurse, set_sync, &sync));
  return WEFT_OK;
}

static weft_status set_rab(weft_fsdp *g, void *ctx) {
  g->reshard_after_backward = *(const bool *)ctx;
  return WEFT_OK;
}
weft_status weft_fsdp_set_reshard_after_backward(weft_fsdp *f, bool reshard, bool recurse) {
  WEFT_CHECK(for_groups(f, recurse, set_rab, &reshard));
  return WEFT_OK;
}

static weft_status check_raf(weft_fsdp *g, void *ctx) {
  int v;
  return resolve_raf(*(const int *)ctx, g->nshard, &v);
}
static weft_status set_raf(weft_fsdp *g, void *ctx) {
  int v;
  WEFT_CHECK(resolve_raf(*(const int *)ctx, g->nshard, &v));
  if (v > 1) WEFT_CHECK(make_small_mesh(g, v));
  if (v <= 1) fsdp__drop_small(g);
  g->raf = v;
  g->raf_explicit = true;
  return WEFT_OK;
}
weft_status weft_fsdp_set_reshard_after_forward(weft_fsdp *f, int value, bool recurse) {
  if (value < 0)
    return weft_error(WEFT_ERR_INVALID,
                      "set_reshard_after_forward(%d): use 0 (false), 1 (true) or a group size",
                      value);
  WEFT_CHECK(for_groups(f, recurse, check_raf, &value));
  WEFT_CHECK(for_groups(f, recurse, set_raf, &value));
  return WEFT_OK;
}

static weft_status set_prefetch(weft_fsdp *f, weft_fsdp *const *gs, int n, bool fwd) {
  if (!f) return weft_error(WEFT_ERR_INVALID, "fsdp group is NULL");
  if (!fsdp__live(f)) return weft_error(WEFT_ERR_INVALID, "not a live FSDP group");
  if (n > 0 && !gs) return weft_error(WEFT_ERR_INVALID, "prefetch list is NULL with n = %d", n);
  for (int i = 0; i < n; i++) {
    if (!gs[i] || !fsdp__live(gs[i]))
      return weft_error(WEFT_ERR_INVALID, "prefetch list entry %d is not a live FSDP group", i);
    if (gs[i]->dp_mesh != f->dp_mesh)
      return weft_error(WEFT_ERR_INVALID,
                        "prefetch of '%s' from '%s': the groups are on different dp meshes",
                        gs[i]->name, f->name);
  }
  weft_fsdp ***list = fwd ? &f->fwd_prefetch : &f->bwd_prefetch;
  int *cnt = fwd ? &f->nfwd_prefetch : &f->nbwd_prefetch;
  free(*list);
  *list = NULL;
  *cnt = n < 0 ? -1 : n;
  if (n > 0) {
    *list = malloc((size_t)n * sizeof **list);
    if (!*list) {
      *cnt = -1;
      return weft_error(WEFT_ERR_OOM, "prefetch list");
    }
    memcpy(*list, gs, (size_t)n * sizeof **list);
  }
  return WEFT_OK;
}

weft_status weft_fsdp_set_modules_to_forward_prefetch(weft_fsdp *f, weft_fsdp *const *gs, int n) {
  WEFT_CHECK(set_prefetch(f, gs, n, true));
  return WEFT_OK;
}
weft_status weft_fsdp_set_modules_to_backward_prefetch(weft_fsdp *f, weft_fsdp *const *gs, int n) {
  WEFT_CHECK(set_prefetch(f, gs, n, false));
  return WEFT_OK;
}

weft_status weft_fsdp_set_is_last_backward(weft_fsdp *f, bool last) {
  if (!f) return weft_error(WEFT_ERR_INVALID, "fsdp group is NULL");
  if (!fsdp__live(f)) return weft_error(WEFT_ERR_INVALID, "not a live FSDP group");
  weft_fsdp *r = f->root ? f->root : f;
  r->is_last_backward = last;
  f->is_last_backward = last;
  return WEFT_OK;
}

weft_status weft_fsdp_wait_reductions(weft_fsdp *f) {
  if (!f) return weft_error(WEFT_ERR_INVALID, "fsdp group is NULL");
  if (!fsdp__live(f)) return weft_error(WEFT_ERR_INVALID, "not a live FSDP group");
  WEFT_CHECK(fsdp__finish_pending(f->root ? f->root : f, NULL));
  WEFT_CHECK(fsdp__reduce_finish(f));
  return WEFT_OK;
}

/* --------------------------------------------------------- unshard API */

weft_status weft_fsdp_unshard(weft_fsdp *f, bool async_op, weft_fsdp_handle **handle) {
  if (handle) *handle = NULL;
  if (!f) return weft_error(WEFT_ERR_INVALID, "fsdp group is NULL");
  if (!fsdp__live(f)) return weft_error(WEFT_ERR_INVALID, "not a live FSDP group");
  if (async_op && !handle)
    return weft_error(WEFT_ERR_INVALID, "fsdp_unshard(async_op): handle is NULL");
  if (!async_op) return fsdp__unshard_wait(f);
  WEFT_CHECK(fsdp__unshard_start(f, false));
  weft_fsdp_handle *h = malloc(sizeof *h);
  if (!h) {
    weft_status st = fsdp__unshard_wait(f);
    return st ? st : weft_error(WEFT_ERR_OOM, "unshard handle");
  }
  h->f = f;
  h->epoch = f->unshard_epoch;
  *handle = h;
  return WEFT_OK;
}

weft_status weft_fsdp_handle_wait(weft_fsdp_handle *h) {
  if (!h) return WEFT_OK;
  weft_status st = WEFT_OK;
  if (fsdp__live(h->f) && h->f->state == FSDP_UNSHARDING && h->f->unshard_epoch == h->epoch)
    st = fsdp__unshard_wait(h->f);
  free(h);
  return st;
}

weft_status weft_fsdp_reshard(weft_fsdp *f) {
  if (!f) return weft_error(WEFT_ERR_INVALID, "fsdp group is NULL");
  if (!fsdp__live(f)) return weft_error(WEFT_ERR_INVALID, "not a live FSDP group");
  if (f->in_forward || f->in_backward)
    return weft_error(WEFT_ERR_STATE, "fsdp_reshard('%s') inside its forward or backward", f->name);
  WEFT_CHECK(fsdp__reshard(f, false));
  fsdp__drop_small(f);
  return WEFT_OK;
}
