/* tests/fsdp/fsdp_worker.c — MPI worker cases of the fsdp suite (started by
 * test_fsdp.c through mpiexec; see tests/harness/worker.h). Every rank
 * checks. The reference for every parallel run is the same model on a
 * 1-rank mesh over MPI_COMM_SELF with the whole global batch, computed on
 * each rank (the models are tiny). Expected communication volumes are
 * computed from the config (independently of fsdp's own bookkeeping).
 *
 * Device mode: with WEFT_TEST_DEVICE=cuda every root mesh the worker makes
 * (the 1-rank reference meshes included) is put on WEFT_CUDA as it is made
 * (weft_worker_mesh_on_device; the dp and tp sub-meshes inherit), so every model
 * computes there; the worker reads numbers only through host copies
 * (weft_worker_host_copy). Unset, everything stays on the CPU and no copy is made. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsdp.h"
#include "nn.h"
#ifdef FSDP_TEST_HAVE_TP
#include "tp.h"
#endif
#ifdef FSDP_TEST_HAVE_GPT2
#include "autograd.h"
#include "gpt2.h"
#endif
#include "worker.h"

#define TOL 1e-5
#define MAXP 128
#define MAXSTEPS 64

static int rank0(void) { return weft_world_rank() == 0; }

/* ------------------------------------------------------------- meshes */

/* The root mesh ([replicate,] shard|dp [, tp]), the dp sub-mesh and the
 * model mesh (the tp sub-mesh, or a 1-rank mesh over MPI_COMM_SELF). */
typedef struct setup {
  int rep, shard, tp;
  weft_mesh *root, *dp, *model;
  bool model_is_self;
  int dp_index, dp_total;
} setup;

static weft_mesh *mesh_self(void) {
  int one = 1;
  const char *names[1] = {"tp"};
  weft_mesh *m = NULL;
  WOK(weft_mesh_create_from_comm(MPI_COMM_SELF, 1, &one, names, &m));
  return weft_worker_mesh_on_device(m);
}

static bool setup_make(setup *s, int rep, int shard, int tp, bool self_model) {
  memset(s, 0, sizeof *s);
  s->rep = rep;
  s->shard = shard;
  s->tp = tp;
  int shape[3], nd = 0;
  const char *names[3];
  if (rep > 0) {
    shape[nd] = rep;
    names[nd++] = "replicate";
  }
  shape[nd] = shard;
  names[nd++] = rep > 0 ? "shard" : "dp";
  int ndp = nd;
  if (!self_model) {
    shape[nd] = tp;
    names[nd++] = "tp";
  }
  WOK(weft_mesh_create(nd, shape, names, &s->root));
  if (!s->root) return false;
  weft_worker_mesh_on_device(s->root);
  WOK(weft_mesh_submesh(s->root, ndp, names, &s->dp));
  if (self_model) {
    s->model = mesh_self();
    s->model_is_self = true;
  } else {
    WOK(weft_mesh_submesh(s->root, 1, &names[ndp], &s->model));
  }
  if (!s->dp || !s->model) return false;
  s->dp_total = (rep > 0 ? rep : 1) * shard;
  int sc = weft_mesh_coord(s->dp, ndp - 1), rc = rep > 0 ? weft_mesh_coord(s->dp, 0) : 0;
  s->dp_index = rc * shard + sc;
  return true;
}

static void setup_free(setup *s) {
  WOK(weft_mesh_destroy(s->model));
  WOK(weft_mesh_destroy(s->dp));
  WOK(weft_mesh_destroy(s->root));
  memset(s, 0, sizeof *s);
}

/* --------------------------------------------------------------- data */

/* Rows [row0, row0 + rows) of the global batch of `step`: tokens and
 * targets (B, T) int32 in [0, V). */
static void make_batch(const weft_llama_config *c, int T, int step, uint64_t seed, int row0,
                       int rows, weft_tensor **tok, weft_tensor **tgt) {
  int64_t shape[2] = {rows, T};
  WOK(weft_tensor_create(WEFT_I32, WEFT_CPU, 2, shape, tok));
  WOK(weft_tensor_create(WEFT_I32, WEFT_CPU, 2, shape, tgt));
  int32_t *a = (*tok)->data, *b = (*tgt)->data;
  for (int r = 0; r < rows; r++)
    for (int t = 0; t < T; t++) {
      uint64_t k = seed * 1000003ULL + (uint64_t)step * 7919ULL + (uint64_t)(row0 + r) * 131ULL +
                   (uint64_t)t;
      a[r * T + t] = (int32_t)(weft_test_mix64(k) % (uint64_t)c->vocab);
      b[r * T + t] = (int32_t)(weft_test_mix64(k ^ 0x5555555555ULL) % (uint64_t)c->vocab);
    }
}

/* -------------------------------------------------------------- models */

typedef struct mopt {
  bool fsdp, tp, sp, lp, deferred;
  weft_fsdp_options blocks, last, root;
} mopt;

static mopt mopt_default(void) {
  mopt o;
  memset(&o, 0, sizeof o);
  weft_fsdp_options d = WEFT_FSDP_OPTIONS_INIT;
  o.blocks = o.last = o.root = d;
  return o;
}

static weft_module *find(weft_module *m, const char *fqn) {
  weft_module *r = NULL;
  WOK(weft_module_find(m, fqn, &r));
  return r;
}

static void shard_model(weft_module *m, weft_mesh *dp, const mopt *o) {
  const weft_llama_config *c = weft_llama_get_config(m);
  for (int64_t i = 0; i < c->n_layers; i++) {
    char name[32];
    snprintf(name, sizeof name, "layers.%lld", (long long)i);
    WOK(weft_fully_shard(find(m, name), dp, &o->blocks, NULL));
  }
  weft_module *last[2] = {find(m, "norm"), find(m, "output")};
  WOK(weft_fully_shard_modules(last, 2, dp, &o->last, NULL));
  WOK(weft_fully_shard(m, dp, &o->root, NULL));
}

typedef struct model {
  weft_module *m;
  void *tp; /* weft_tp */
  weft_optimizer *opt;
} model;

static bool build(model *md, const weft_llama_config *cfg, weft_mesh *mesh, weft_mesh *dp,
                  const mopt *o, uint64_t seed) {
  memset(md, 0, sizeof *md);
  WOK(weft_llama_create(cfg, mesh, &md->m));
  if (!md->m) return false;
#ifdef FSDP_TEST_HAVE_TP
  if (o->tp) {
    weft_tp *tp = NULL;
    WOK(weft_tp_apply_llama_plan(md->m, mesh, o->sp, o->lp, &tp));
    md->tp = tp;
  }
#else
  if (o->tp) {
    WCHECK(!o->tp, "the fsdp tests were built without tp");
    return false;
  }
#endif
  if (!o->deferred) WOK(weft_module_init_weights(md->m, seed));
  if (o->fsdp) shard_model(md->m, dp, o);
  if (o->deferred) WOK(weft_module_init_weights(md->m, seed));
  weft_adamw_params hp = WEFT_ADAMW_DEFAULT;
  hp.lr = getenv("FSDP_TEST_LR") ? (float)atof(getenv("FSDP_TEST_LR")) : 1e-3f;
  hp.weight_decay = 0.1f;
  WOK(weft_adamw_create(md->m, &hp, &md->opt));
  return md->opt != NULL;
}

static void model_free(model *md);

/* Frees a reference model and its 1-rank mesh. */
static void ref_free(model *md) {
  weft_mesh *m = md->m ? weft_module_mesh(md->m) : NULL;
  model_free(md);
  WOK(weft_mesh_destroy(m));
}

static void model_free(model *md) {
  weft_optimizer_destroy(md->opt);
  if (md->m) WOK(weft_fsdp_destroy_all(md->m));
#ifdef FSDP_TEST_HAVE_TP
  weft_tp_destroy(md->tp);
#endif
  WOK(weft_module_destroy(md->m));
  memset(md, 0, sizeof *md);
}

/* ---------------------------------------------------------------- runs */

typedef struct result {
  int steps;
  double loss[MAXSTEPS], norm[MAXSTEPS];
  int np;
  weft_tensor *p[MAXP];
  char *name[MAXP];
} result;

static void result_free(result *r) {
  for (int i = 0; i < r->np; i++) {
    weft_tensor_destroy(r->p[i]);
    free(r->name[i]);
  }
  memset(r, 0, sizeof *r);
}

/* Full tensors of every parameter (collective over their meshes), on the
 * host. */
static void snapshot(weft_module *m, result *r) {
  weft_param *ps[MAXP];
  int n = 0;
  WOK(weft_module_parameters(m, ps, MAXP, &n));
  r->np = n;
  for (int i = 0; i < n; i++) {
    r->p[i] = NULL;
    r->name[i] = strdup(ps[i]->fqn);
    WOK(weft_dtensor_full_tensor(ps[i]->data, &r->p[i]));
    if (r->p[i] && r->p[i]->device != WEFT_CPU) { /* keep a host copy only */
      weft_tensor *dev = r->p[i];
      weft_worker_host_copy(dev, &r->p[i]);
      weft_tensor_destroy(dev);
    }
  }
}

/* Global mean of a per-dp-rank value (equal local batches). */
static double dp_mean(const setup *s, double v) {
  if (!s) return v;
  for (int d = 0; d < weft_mesh_ndim(s->dp); d++)
    WOK(weft_all_reduce(s->dp, d, &v, &v, 1, WEFT_F64, WEFT_OP_AVG, NULL));
  return v;
}

typedef struct train {
  int B, T, steps;
  double clip;
  uint64_t data_seed;
  bool fixed_batch;
} train;

/* One step: forward/backward on this dp rank's rows, clip, AdamW. */
static double step_once(model *md, const setup *s, const train *tr, int step, double *norm) {
  const weft_llama_config *c = weft_llama_get_config(md->m);
  int rows = s ? tr->B / s->dp_total : tr->B, row0 = s ? s->dp_index * rows : 0;
  weft_tensor *tok = NULL, *tgt = NULL;
  make_batch(c, tr->T, tr->fixed_batch ? 0 : step, tr->data_seed, row0, rows, &tok, &tgt);
  double loss = 0, nrm = 0;
  WOK(weft_llama_forward(md->m, tok, tgt, &loss));
  WOK(weft_llama_backward(md->m));
  WOK(weft_clip_grad_norm(md->m, tr->clip, &nrm));
  WOK(weft_optimizer_step(md->opt));
  WOK(weft_module_zero_grad(md->m, false));
  weft_tensor_destroy(tok);
  weft_tensor_destroy(tgt);
  if (norm) *norm = nrm;
  return loss;
}

static void run(model *md, const setup *s, const train *tr, result *r) {
  r->steps = tr->steps;
  for (int i = 0; i < tr->steps; i++) r->loss[i] = dp_mean(s, step_once(md, s, tr, i, &r->norm[i]));
  snapshot(md->m, r);
}

/* max |a - b| / max |b| of two f32 tensors (inf if either is missing or
 * the sizes differ); read on the host wherever they live */
static double rel_max(const weft_tensor *a, const weft_tensor *b) {
  if (!a || !b || weft_tensor_numel(a) != weft_tensor_numel(b)) return INFINITY;
  weft_tensor *ta = NULL, *tb = NULL;
  const weft_tensor *ha = weft_worker_host_copy(a, &ta), *hb = weft_worker_host_copy(b, &tb);
  double e = ha && hb ? weft_test_rel_max_f32(ha->data, hb->data, weft_tensor_numel(a)) : INFINITY;
  weft_tensor_destroy(ta);
  weft_tensor_destroy(tb);
  return e;
}

/* ||a - b|| / ||b|| (the tensor relative error of the tp and nn suites);
 * read on the host wherever they live */
static double rel_norm(const weft_tensor *a, const weft_tensor *b) {
  if (!a || !b || weft_tensor_numel(a) != weft_tensor_numel(b)) return INFINITY;
  weft_tensor *ta = NULL, *tb = NULL;
  const weft_tensor *ha = weft_worker_host_copy(a, &ta), *hb = weft_worker_host_copy(b, &tb);
  double e = ha && hb ? weft_test_rel_norm_f32(ha->data, hb->data, weft_tensor_numel(a)) : INFINITY;
  weft_tensor_destroy(ta);
  weft_tensor_destroy(tb);
  return e;
}

/* Compares a run with the reference; prints the worst errors (rank 0). */
static void compare(const char *what, const result *a, const result *ref, double tol) {
  double worst_loss = 0, worst_norm = 0, worst_p = 0, worst_max = 0;
  const char *worst_name = "";
  for (int i = 0; i < ref->steps; i++) {
    double e = weft_test_rel_scalar(a->loss[i], ref->loss[i]),
           en = weft_test_rel_scalar(a->norm[i], ref->norm[i]);
    WCHECK(e <= tol, "%s: step %d loss %.9g vs ref %.9g (rel %.3g)", what, i, a->loss[i],
           ref->loss[i], e);
    WCHECK(en <= tol, "%s: step %d grad norm %.9g vs ref %.9g (rel %.3g)", what, i, a->norm[i],
           ref->norm[i], en);
    if (e > worst_loss) worst_loss = e;
    if (en > worst_norm) worst_norm = en;
    if (rank0() && getenv("FSDP_TEST_VERBOSE"))
      printf("  step %d: loss %.9g vs %.9g (%.2e), norm %.9g vs %.9g (%.2e)\n", i, a->loss[i],
             ref->loss[i], e, a->norm[i], ref->norm[i], en);
  }
  WREQUIRE(a->np == ref->np, "%s: %d params vs %d", what, a->np, ref->np);
  for (int i = 0; i < ref->np; i++) {
    WCHECK(strcmp(a->name[i], ref->name[i]) == 0, "%s: param %d is %s vs %s", what, i, a->name[i],
           ref->name[i]);
    double e = rel_norm(a->p[i], ref->p[i]), em = rel_max(a->p[i], ref->p[i]);
    WCHECK(e <= tol, "%s: final %s rel err %.3g (max-abs %.3g)", what, ref->name[i], e, em);
    if (e > worst_p) {
      worst_p = e;
      worst_name = ref->name[i];
    }
    if (em > worst_max) worst_max = em;
  }
  if (rank0())
    printf("parity %-36s loss %.2e  grad norm %.2e  params %.2e (%s; max-abs %.2e)\n", what,
           worst_loss, worst_norm, worst_p, worst_name, worst_max);
}

/* The grads of the first backward (step 0's batch, this rank's rows)
 * against the reference's (full tensors, max-abs relative); then zeroed. */
static void compare_first_grads(const char *what, model *md, const setup *s, const train *tr,
                                weft_module *ref) {
  const weft_llama_config *c = weft_llama_get_config(md->m);
  int rows = tr->B / s->dp_total;
  weft_tensor *tok = NULL, *tgt = NULL;
  make_batch(c, tr->T, 0, tr->data_seed, s->dp_index * rows, rows, &tok, &tgt);
  double l;
  WOK(weft_llama_forward(md->m, tok, tgt, &l));
  WOK(weft_llama_backward(md->m));
  weft_tensor_destroy(tok);
  weft_tensor_destroy(tgt);
  weft_param *pa[MAXP], *pb[MAXP];
  int na = 0, nb = 0;
  WOK(weft_module_parameters(md->m, pa, MAXP, &na));
  WOK(weft_module_parameters(ref, pb, MAXP, &nb));
  WREQUIRE(na == nb, "%s: %d params vs %d", what, na, nb);
  double worst = 0;
  const char *wn = "";
  for (int i = 0; i < na; i++) {
    WREQUIRE(pa[i]->grad && pb[i]->grad, "%s: %s has no grad after backward", what, pa[i]->fqn);
    weft_tensor *g = NULL;
    WOK(weft_dtensor_full_tensor(pa[i]->grad, &g));
    double e = rel_max(g, weft_dtensor_local(pb[i]->grad));
    WCHECK(e <= TOL, "%s: first grad of %s: max-abs rel err %.3g", what, pa[i]->fqn, e);
    if (e > worst) {
      worst = e;
      wn = pb[i]->fqn;
    }
    weft_tensor_destroy(g);
  }
  WOK(weft_module_zero_grad(md->m, false));
  if (rank0()) printf("grads  %-36s first backward max-abs rel err %.2e (%s)\n", what, worst, wn);
}

/* Initial parameters equal the reference bitwise (deferred or eager init). */
static void compare_init(const char *what, weft_module *m, weft_module *ref) {
  result a = {0}, b = {0};
  snapshot(m, &a);
  snapshot(ref, &b);
  WREQUIRE(a.np == b.np, "%s: %d params vs %d", what, a.np, b.np);
  for (int i = 0; i < a.np; i++)
    WCHECK(a.p[i] && b.p[i] && weft_tensor_equal(a.p[i], b.p[i]),
           "%s: initial %s differs from the 1-rank eager init", what, b.name[i]);
  result_free(&a);
  result_free(&b);
}

/* ------------------------------------------------------ expected sizes */

/* Numel of the groups on one rank's model mesh (tp-local, even sizes):
 * block, [norm, output], root (tok_embeddings). */
typedef struct groups {
  int64_t block, last, root;
} groups;

static groups group_numel(const weft_llama_config *c, int tp) {
  int64_t D = c->dim, hd = c->dim / c->n_heads, H = c->n_heads, K = c->n_kv_heads, F = c->ffn_dim,
          V = c->vocab;
  groups g;
  g.block = (D * H * hd + 2 * D * K * hd + H * hd * D + 3 * D * F) / tp + 2 * D;
  g.last = D + V * D / tp;
  g.root = V * D / tp;
  return g;
}

static int64_t total_params(const weft_llama_config *c) {
  groups g = group_numel(c, 1);
  return c->n_layers * g.block + g.last + g.root;
}

/* Checks the dp-dim counters of one step against the formulas:
 * all-gather bus = (forward + backward unshards) x group bytes x (n-1)/n,
 * reduce-scatter bus = grad bytes x (n-1)/n, HSDP all-reduce bus =
 * 2 x (r-1)/r x shard bytes. Default settings: the root unshards once,
 * the others twice. */
static void check_comm_step(const char *what, const setup *s, const weft_llama_config *c,
                            int64_t esize, bool sync, int ag_root, int ag_other) {
  groups g = group_numel(c, s->tp);
  int64_t n = s->shard, r = s->rep > 0 ? s->rep : 1;
  int shard_dim = weft_mesh_ndim(s->dp) - 1;
  int64_t L = c->n_layers;
  int64_t ag = (ag_root * g.root + ag_other * (L * g.block + g.last)) * esize * (n - 1) / n;
  int64_t rs = sync ? (g.root + L * g.block + g.last) * 4 * (n - 1) / n : 0;
  weft_comm_count a = weft_comm_stats(s->dp, shard_dim, WEFT_COLL_ALL_GATHER);
  weft_comm_count b = weft_comm_stats(s->dp, shard_dim, WEFT_COLL_REDUCE_SCATTER);
  int64_t ngroups = L + 2;
  WCHECK(a.bus_bytes == ag, "%s: all-gather bus bytes %lld, expected %lld", what,
         (long long)a.bus_bytes, (long long)ag);
  WCHECK(a.calls == ag_root + ag_other * (L + 1), "%s: all-gather calls %lld", what,
         (long long)a.calls);
  WCHECK(b.bus_bytes == rs, "%s: reduce-scatter bus bytes %lld, expected %lld", what,
         (long long)b.bus_bytes, (long long)rs);
  WCHECK(b.calls == (sync ? ngroups : 0), "%s: reduce-scatter calls %lld", what,
         (long long)b.calls);
  if (s->rep > 0) {
    weft_comm_count ar = weft_comm_stats(s->dp, 0, WEFT_COLL_ALL_REDUCE);
    int64_t per = 0;
    /* one all-reduce of each group's shard (S elements); clipping adds f64
     * scalars on the shard dim only (grads are Replicate on replicate) */
    per = sync ? 2 * (g.root / n + L * (g.block / n) + g.last / n) * 4 * (r - 1) / r : 0;
    WCHECK(ar.bus_bytes == per, "%s: replicate all-reduce bus bytes %lld, expected %lld", what,
           (long long)ar.bus_bytes, (long long)per);
  }
  if (rank0() && sync)
    printf(
        "comm %-38s per step: all-gather %lld B (%lld calls), reduce-scatter %lld B "
        "(%lld calls)\n",
        what, (long long)a.bus_bytes, (long long)a.calls, (long long)b.bus_bytes,
        (long long)b.calls);
}

/* Sharded state <= 1.1 x 16 P / (shard x tp) for fp32 AdamW. */
static void check_memory(const char *what, const setup *s, const weft_llama_config *c, model *md) {
  weft_fsdp_memory mm;
  WOK(weft_fsdp_memory_get(&mm));
  int64_t P = total_params(c);
  double bound = 1.1 * 16.0 * (double)P / (double)(s->shard * s->tp);
  int64_t state = mm.sharded_params.peak + mm.sharded_grads.peak + mm.optimizer.peak;
  WCHECK((double)state <= bound, "%s: sharded state %lld B > 1.1 x 16P/(dp tp) = %.0f B", what,
         (long long)state, bound);
  /* unsharded parameters: the root group plus at most the two largest
   * others (current + prefetched), each with its all-gather buffer */
  groups g = group_numel(c, s->tp);
  int64_t largest = g.block > g.last ? g.block : g.last;
  int64_t ub = 4 * (g.root + 3 * largest + c->dim);
  WCHECK(mm.unsharded_params.peak <= ub, "%s: unsharded peak %lld B > %lld B", what,
         (long long)mm.unsharded_params.peak, (long long)ub);
  WCHECK(mm.unsharded_params.current == 0, "%s: %lld unsharded bytes left after the step", what,
         (long long)mm.unsharded_params.current);
  if (rank0())
    printf(
        "memory %-36s P=%lld: sharded params %lld + grads %lld + adam %lld = %lld B "
        "(bound %.0f); unsharded peak %lld B, grads peak %lld B, other peak %lld B, "
        "total peak %lld B\n",
        what, (long long)P, (long long)mm.sharded_params.peak, (long long)mm.sharded_grads.peak,
        (long long)mm.optimizer.peak, (long long)state, bound, (long long)mm.unsharded_params.peak,
        (long long)mm.unsharded_grads.peak, (long long)mm.other.peak, (long long)mm.total.peak);
  (void)md;
}

/* Replays the trace: at no time more than two non-root groups are
 * unsharded or being unsharded. */
static void check_at_most_two_unsharded(const char *what) {
  const weft_fsdp *live[64];
  int nlive = 0, worst = 0;
  for (int i = 0; i < weft_fsdp_trace_count(); i++) {
    weft_fsdp_event e;
    WOK(weft_fsdp_trace_get(i, &e));
    if (weft_fsdp_is_root(e.group)) continue;
    if (e.kind == WEFT_FSDP_EV_UNSHARD_START) {
      bool have = false;
      for (int k = 0; k < nlive; k++) have |= live[k] == e.group;
      if (!have && nlive < 64) live[nlive++] = e.group;
    } else if (e.kind == WEFT_FSDP_EV_RESHARD) {
      int k2 = 0;
      for (int k = 0; k < nlive; k++)
        if (live[k] != e.group) live[k2++] = live[k];
      nlive = k2;
    }
    if (nlive > worst) worst = nlive;
  }
  WCHECK(worst <= 2, "%s: %d non-root groups unsharded at once", what, worst);
  WCHECK(worst >= 1, "%s: the trace shows no unshard", what);
}

/* ----------------------------------------------------------- configs */

static weft_llama_config tiny(int64_t D, int64_t L, int64_t H, int64_t K, int64_t F, int64_t V) {
  weft_llama_config c = WEFT_LLAMA_CONFIG_INIT;
  c.dim = D;
  c.n_layers = L;
  c.n_heads = H;
  c.n_kv_heads = K;
  c.ffn_dim = F;
  c.vocab = V;
  c.max_seq_len = 16;
  return c;
}

static const train TRAIN5 = {.B = 4, .T = 8, .steps = 5, .clip = 0.5, .data_seed = 7};

/* The reference: the same model on one rank with the global batch. */
static void reference(const weft_llama_config *c, const train *tr, uint64_t seed, result *r,
                      model *keep) {
  weft_mesh *self = mesh_self();
  model md;
  mopt o = mopt_default();
  if (!build(&md, c, self, NULL, &o, seed)) {
    WOK(weft_mesh_destroy(self));
    return;
  }
  if (keep) {
    /* the grads of step 0's global batch, for parity of the first backward */
    weft_tensor *tok = NULL, *tgt = NULL;
    make_batch(c, tr->T, 0, tr->data_seed, 0, tr->B, &tok, &tgt);
    double l;
    WOK(weft_llama_forward(md.m, tok, tgt, &l));
    WOK(weft_llama_backward(md.m));
    weft_tensor_destroy(tok);
    weft_tensor_destroy(tgt);
    *keep = md;
    return;
  }
  run(&md, NULL, tr, r);
  model_free(&md);
  WOK(weft_mesh_destroy(self));
}

/* Every parameter's sharded data and grad (after a step) live on want:
 * the mesh's device, or the host under offload_params. */
static void check_state_device(const char *what, weft_module *m, weft_device want) {
  weft_param *ps[MAXP];
  int n = 0;
  WOK(weft_module_parameters(m, ps, MAXP, &n));
  for (int i = 0; i < n; i++) {
    weft_device d = weft_dtensor_local(ps[i]->data)->device;
    weft_device g = ps[i]->grad ? weft_dtensor_local(ps[i]->grad)->device : want;
    WCHECK(d == want && g == want, "%s: %s's shard on %s, its grad on %s, want %s", what,
           ps[i]->fqn, weft_device_name(d), weft_device_name(g), weft_device_name(want));
    if (d != want || g != want) return;
  }
}

/* A parallel run against the reference: parity, optional exact comm per
 * step, memory, and the initial values (deferred init). */
typedef struct pcase {
  const char *name;
  int rep, shard, tp;
  bool self_model, sp, deferred, check_comm, check_mem, offload;
} pcase;

static void parity(const pcase *pc, const weft_llama_config *c, const train *tr, const result *ref,
                   weft_module *ref_init) {
  setup s;
  if (!setup_make(&s, pc->rep, pc->shard, pc->tp, pc->self_model)) return;
  mopt o = mopt_default();
  o.fsdp = true;
  o.tp = pc->tp > 1;
  o.sp = pc->sp;
  o.lp = pc->tp > 1;
  o.deferred = pc->deferred;
  o.blocks.offload_params = o.last.offload_params = o.root.offload_params = pc->offload;
  model md;
  weft_fsdp_memory_reset_peak();
  if (build(&md, c, s.model, s.dp, &o, 1234)) {
    if (ref_init) {
      compare_init(pc->name, md.m, ref_init);
      compare_first_grads(pc->name, &md, &s, tr, ref_init);
    }
    weft_fsdp_memory_track(md.opt);
    weft_fsdp_trace_clear();
    weft_fsdp_trace_enable(pc->check_mem);
    result r = {0};
    r.steps = tr->steps;
    for (int i = 0; i < tr->steps; i++) {
      weft_comm_stats_reset(s.root);
      r.loss[i] = step_once(&md, &s, tr, i, &r.norm[i]);
      if (pc->check_comm) check_comm_step(pc->name, &s, c, 4, true, 1, 2);
      r.loss[i] = dp_mean(&s, r.loss[i]);
    }
    weft_fsdp_trace_enable(false);
    if (pc->check_mem) {
      check_memory(pc->name, &s, c, &md);
      check_at_most_two_unsharded(pc->name);
    }
    weft_fsdp_memory_track(NULL);
    check_state_device(pc->name, md.m, pc->offload ? WEFT_CPU : weft_mesh_device(s.root));
    snapshot(md.m, &r);
    compare(pc->name, &r, ref, TOL);
    result_free(&r);
  }
  weft_fsdp_trace_clear();
  model_free(&md);
  setup_free(&s);
}

/* ------------------------------------------------------------- cases */

/* FSDP only, dp = world size (2: model on a 1-rank MPI_COMM_SELF mesh,
 * offload on; 4: model on the root's tp dim of size 1); deferred init. */
static void case_parity_fsdp(void) {
  weft_llama_config c = tiny(32, 2, 4, 2, 64, 64);
  result ref = {0};
  model ri;
  reference(&c, &TRAIN5, 1234, NULL, &ri);
  reference(&c, &TRAIN5, 1234, &ref, NULL);
  int w = weft_world_size();
  char name[64];
  snprintf(name, sizeof name, "fsdp dp=%d%s", w, w == 2 ? " (offload)" : "");
  pcase pc = {.name = name,
              .rep = 0,
              .shard = w,
              .tp = 1,
              .self_model = w == 2,
              .deferred = true,
              .check_comm = true,
              .check_mem = true,
              .offload = w == 2};
  parity(&pc, &c, &TRAIN5, &ref, ri.m);
  ref_free(&ri);
  result_free(&ref);
}

/* offload_params (CPUOffloadPolicy) on dp = world: the losses of the run
 * without it (bitwise on a CPU mesh, where nothing moves; within TOL on a
 * device mesh, where the optimizer steps on the CPU), sharded parameters
 * and grads in host memory, and on a device mesh a device peak (model
 * build and training steps) lower than without offload by at least the
 * sharded state it keeps on the host: parameters, grads and AdamW's two
 * moments. */
static void case_offload(void) {
  weft_llama_config c = tiny(32, 2, 4, 2, 64, 64);
  const train *tr = &TRAIN5;
  double loss[2][MAXSTEPS] = {{0}};
  int64_t peak[2] = {0, 0}, shard_bytes = 0;
  weft_device dev = WEFT_CPU;
  for (int k = 0; k < 2; k++) {
    setup s;
    if (!setup_make(&s, 0, weft_world_size(), 1, true)) return;
    dev = weft_mesh_device(s.root);
    mopt o = mopt_default();
    o.fsdp = true;
    o.blocks.offload_params = o.last.offload_params = o.root.offload_params = k == 1;
    model md;
    weft_mem_reset_peak(dev);
    int64_t before = weft_mem_get(dev).current_bytes;
    if (build(&md, &c, s.model, s.dp, &o, 1234)) {
      for (int i = 0; i < tr->steps; i++) loss[k][i] = step_once(&md, &s, tr, i, NULL);
      peak[k] = weft_mem_get(dev).peak_bytes - before;
      check_state_device(k ? "offload" : "no offload", md.m, k ? WEFT_CPU : dev);
      if (k == 1) {
        weft_param *ps[MAXP];
        int n = 0;
        WOK(weft_module_parameters(md.m, ps, MAXP, &n));
        for (int i = 0; i < n; i++)
          shard_bytes += (int64_t)weft_tensor_nbytes(weft_dtensor_local(ps[i]->data));
      }
    }
    model_free(&md);
    setup_free(&s);
  }
  double worst = 0;
  for (int i = 0; i < tr->steps; i++) {
    double e = fabs(loss[1][i] - loss[0][i]) / fabs(loss[0][i]);
    if (e > worst) worst = e;
    if (dev == WEFT_CPU)
      WCHECK(loss[1][i] == loss[0][i], "step %d: loss %.9g with offload, %.9g without", i,
             loss[1][i], loss[0][i]);
  }
  WCHECK(worst <= TOL, "offload changes the losses by %.3g relative", worst);
  if (dev != WEFT_CPU)
    WCHECK(peak[0] - peak[1] >= 4 * shard_bytes,
           "%s peak %lld B with offload, %lld B without: want at least %lld B "
           "(4 x %lld B of sharded state) less",
           weft_device_name(dev), (long long)peak[1], (long long)peak[0],
           (long long)(4 * shard_bytes), (long long)shard_bytes);
  if (rank0())
    printf(
        "offload dp=%d on %s: losses rel %.3g apart; peak %lld B with offload, %lld B "
        "without (sharded params %lld B per rank)\n",
        weft_world_size(), weft_device_name(dev), worst, (long long)peak[1], (long long)peak[0],
        (long long)shard_bytes);
}

/* Dim-0 sizes not divisible by dp (vocab 61, ffn 90): FSDP dp=4 and, with
 * TP, 2-D dp=2 x tp=2 (TP splits 61 into 31/30, dp then 16/15 and 15/15). */
static void case_parity_uneven(void) {
  weft_llama_config c = tiny(32, 2, 4, 2, 90, 61);
  result ref = {0};
  model ri;
  reference(&c, &TRAIN5, 1234, NULL, &ri);
  reference(&c, &TRAIN5, 1234, &ref, NULL);
  pcase a = {.name = "uneven fsdp dp=4", .rep = 0, .shard = 4, .tp = 1, .deferred = true};
  parity(&a, &c, &TRAIN5, &ref, ri.m);
#ifdef FSDP_TEST_HAVE_TP
  pcase b = {.name = "uneven 2-D dp=2 x tp=2 (sp)",
             .rep = 0,
             .shard = 2,
             .tp = 2,
             .sp = true,
             .deferred = true};
  parity(&b, &c, &TRAIN5, &ref, ri.m);
#endif
  ref_free(&ri);
  result_free(&ref);
}

#ifdef FSDP_TEST_HAVE_TP
/* Redistribute of a strided-sharded parameter: to all-Replicate (the
 * global tensor) and to (Replicate, Shard(0)) (the TP shard). */
static void check_redistribute(weft_module *m, const setup *s, const weft_module *ref) {
  weft_param *p = NULL, *q = NULL;
  WOK(weft_module_find_param(m, "layers.0.attention.wq.weight", &p));
  WOK(weft_module_find_param((weft_module *)ref, "layers.0.attention.wq.weight", &q));
  if (!p || !q) return;
  const weft_placement *pl = weft_dtensor_placements(p->data);
  WCHECK(pl[0].kind == WEFT_PLACE_STRIDED_SHARD && pl[0].split_factor == 2 &&
             pl[1].kind == WEFT_PLACE_SHARD && pl[1].dim == 0,
         "wq placements are not (SS(0,2), S(0))");
  weft_placement rr[2] = {weft_replicate(), weft_replicate()};
  weft_placement rs[2] = {weft_replicate(), weft_shard(0)};
  weft_dtensor *full = NULL, *tps = NULL;
  WOK(weft_dtensor_redistribute(p->data, rr, 2, &full));
  WOK(weft_dtensor_redistribute(p->data, rs, 2, &tps));
  if (full && tps) {
    const weft_tensor *want = weft_dtensor_local(q->data);
    WCHECK(weft_worker_equal_on_host(weft_dtensor_local(full), want),
           "redistribute to (R, R) is not the global tensor");
    int64_t start, len;
    weft_chunk_range(want->shape[0], s->tp, weft_mesh_coord(s->model, 0), &start, &len);
    weft_tensor *rows = NULL;
    WOK(weft_tensor_narrow(want, 0, start, len, &rows));
    weft_tensor *rowsc = NULL;
    WOK(weft_tensor_clone(rows, &rowsc));
    WCHECK(rowsc && weft_worker_equal_on_host(weft_dtensor_local(tps), rowsc),
           "redistribute to (R, S(0)) is not the TP shard");
    weft_tensor_destroy(rowsc);
    weft_tensor_destroy(rows);
  }
  weft_dtensor_destroy(full);
  weft_dtensor_destroy(tps);
}

/* 2-D dp=2 x tp=2 with the torchtitan plan, without and with sequence
 * parallel (loss parallel on); exact dp-dim comm; memory; redistribute. */
static void case_parity_2d(void) {
  weft_llama_config c = tiny(32, 2, 4, 2, 64, 64);
  result ref = {0};
  model ri;
  reference(&c, &TRAIN5, 1234, NULL, &ri);
  reference(&c, &TRAIN5, 1234, &ref, NULL);
  pcase a = {.name = "2-D dp=2 x tp=2",
             .rep = 0,
             .shard = 2,
             .tp = 2,
             .check_comm = true,
             .check_mem = true};
  parity(&a, &c, &TRAIN5, &ref, ri.m);
  pcase b = {.name = "2-D dp=2 x tp=2 (sp, deferred)",
             .rep = 0,
             .shard = 2,
             .tp = 2,
             .sp = true,
             .deferred = true,
             .check_comm = true};
  parity(&b, &c, &TRAIN5, &ref, ri.m);
  /* redistribute of the sharded layout, on a fresh model */
  setup s;
  if (setup_make(&s, 0, 2, 2, false)) {
    mopt o = mopt_default();
    o.fsdp = o.tp = o.lp = true;
    model md;
    if (build(&md, &c, s.model, s.dp, &o, 1234)) check_redistribute(md.m, &s, ri.m);
    model_free(&md);
    setup_free(&s);
  }
  ref_free(&ri);
  result_free(&ref);
}

/* 3-D: replicate=2 x shard=2 x tp=2 on 8 ranks (sequence parallel). */
static void case_parity_3d(void) {
  weft_llama_config c = tiny(32, 2, 4, 2, 64, 64);
  result ref = {0};
  train tr = TRAIN5;
  tr.B = 4;
  model ri;
  reference(&c, &tr, 1234, NULL, &ri);
  reference(&c, &tr, 1234, &ref, NULL);
  pcase a = {.name = "3-D rep=2 x shard=2 x tp=2 (sp)",
             .rep = 2,
             .shard = 2,
             .tp = 2,
             .sp = true,
             .deferred = true,
             .check_comm = true};
  parity(&a, &c, &tr, &ref, ri.m);
  ref_free(&ri);
  result_free(&ref);
}
#endif

/* HSDP: replicate=2 x shard=2 on 4 ranks. */
static void case_parity_hsdp(void) {
  weft_llama_config c = tiny(32, 2, 4, 2, 64, 64);
  result ref = {0};
  model ri;
  reference(&c, &TRAIN5, 1234, NULL, &ri);
  reference(&c, &TRAIN5, 1234, &ref, NULL);
  pcase a = {.name = "hsdp rep=2 x shard=2",
             .rep = 2,
             .shard = 2,
             .tp = 1,
             .self_model = true,
             .deferred = true,
             .check_comm = true};
  parity(&a, &c, &TRAIN5, &ref, ri.m);
  ref_free(&ri);
  result_free(&ref);
}

/* reshard_after_forward true / false / 2 on dp=4 give bitwise identical
 * numbers; all-gathers: forward on the dp dim for every group, backward
 * for the non-root ones on the dp dim (true), nowhere (false) or on the
 * 2-rank groups (2). */
static void case_reshard_modes(void) {
  weft_llama_config c = tiny(32, 2, 4, 2, 64, 64);
  setup s;
  if (!setup_make(&s, 0, 4, 1, true)) return;
  const int modes[3] = {1, 0, 2};
  result r[3];
  memset(r, 0, sizeof r);
  groups g = group_numel(&c, 1);
  int64_t L = c.n_layers, n = 4;
  for (int k = 0; k < 3; k++) {
    mopt o = mopt_default();
    o.fsdp = true;
    o.blocks.reshard_after_forward = o.last.reshard_after_forward = modes[k];
    model md;
    if (!build(&md, &c, s.model, s.dp, &o, 99)) break;
    weft_fsdp *root = weft_fsdp_of(md.m);
    r[k].steps = TRAIN5.steps;
    for (int i = 0; i < TRAIN5.steps; i++) {
      weft_comm_stats_reset(s.root);
      WOK(weft_fsdp_comm_reset(root, true));
      r[k].loss[i] = dp_mean(&s, step_once(&md, &s, &TRAIN5, i, &r[k].norm[i]));
      weft_comm_count a = weft_comm_stats(s.dp, 0, WEFT_COLL_ALL_GATHER);
      weft_fsdp_comm fc;
      WOK(weft_fsdp_comm_get(root, true, &fc));
      int64_t fwd = (g.root + L * g.block + g.last) * 4 * (n - 1) / n;
      int64_t bwd_dp = modes[k] == 1 ? (L * g.block + g.last) * 4 * (n - 1) / n : 0;
      WCHECK(a.bus_bytes == fwd + bwd_dp, "raf=%d: dp all-gather bus %lld, expected %lld", modes[k],
             (long long)a.bus_bytes, (long long)(fwd + bwd_dp));
      WCHECK(fc.all_gather.bus_bytes == a.bus_bytes, "raf=%d: fsdp counts %lld, mesh %lld",
             modes[k], (long long)fc.all_gather.bus_bytes, (long long)a.bus_bytes);
      int64_t small = modes[k] == 2 ? (L * g.block + g.last) * 4 * (2 - 1) / 2 : 0;
      WCHECK(fc.small_all_gather.bus_bytes == small &&
                 fc.small_all_gather.calls == (modes[k] == 2 ? L + 1 : 0),
             "raf=%d: small all-gather %lld B in %lld calls, expected %lld B", modes[k],
             (long long)fc.small_all_gather.bus_bytes, (long long)fc.small_all_gather.calls,
             (long long)small);
      if (i == 0 && rank0())
        printf(
            "reshard_after_forward=%d: all-gather per step %lld B on dp + %lld B on 2-rank "
            "groups\n",
            modes[k], (long long)a.bus_bytes, (long long)fc.small_all_gather.bus_bytes);
    }
    snapshot(md.m, &r[k]);
    model_free(&md);
  }
  for (int k = 1; k < 3; k++) {
    for (int i = 0; i < TRAIN5.steps; i++)
      WCHECK(r[k].loss[i] == r[0].loss[i], "raf=%d step %d loss %.17g vs %.17g (raf=1)", modes[k],
             i, r[k].loss[i], r[0].loss[i]);
    for (int i = 0; i < r[0].np && i < r[k].np; i++)
      WCHECK(weft_tensor_equal(r[k].p[i], r[0].p[i]), "raf=%d: %s differs from raf=1", modes[k],
             r[0].name[i]);
  }
  for (int k = 0; k < 3; k++) result_free(&r[k]);
  setup_free(&s);
}

/* Gradient accumulation: 4 micro-batches with gradient sync off for the
 * first 3 give the grads of one batch 4x larger (times 4), with no
 * reduce-scatter until the last; then one AdamW step on grads / 4 equals
 * the big batch's step. Also: reshard_after_backward(false) during
 * accumulation skips the next forward's all-gather. */
static void case_accumulate(void) {
  weft_llama_config c = tiny(32, 2, 4, 2, 64, 64);
  setup s;
  if (!setup_make(&s, 0, weft_world_size(), 1, true)) return;
  int n = s.dp_total, micro = 4, Bm = 2 * n; /* micro-batch rows (global) */
  mopt o = mopt_default();
  o.fsdp = true;
  model big, acc;
  if (!build(&big, &c, s.model, s.dp, &o, 5) || !build(&acc, &c, s.model, s.dp, &o, 5)) return;
  int rows = Bm / n;
  const weft_llama_config *cc = weft_llama_get_config(big.m);
  /* the big batch: this rank's rows of all micro-batches together */
  weft_tensor *tok[4], *tgt[4];
  for (int k = 0; k < micro; k++)
    make_batch(cc, 8, k, 11, s.dp_index * rows, rows, &tok[k], &tgt[k]);
  weft_tensor *btok = NULL, *btgt = NULL;
  WOK(weft_tensor_cat(tok, micro, 0, &btok));
  WOK(weft_tensor_cat(tgt, micro, 0, &btgt));
  double l;
  WOK(weft_llama_forward(big.m, btok, btgt, &l));
  WOK(weft_llama_backward(big.m));
  weft_fsdp *root = weft_fsdp_of(acc.m);
  for (int k = 0; k < micro; k++) {
    bool last = k == micro - 1;
    WOK(weft_fsdp_set_requires_gradient_sync(root, last, true));
    WOK(weft_fsdp_set_reshard_after_backward(root, last, true));
    weft_comm_stats_reset(s.root);
    WOK(weft_llama_forward(acc.m, tok[k], tgt[k], &l));
    WOK(weft_llama_backward(acc.m));
    weft_comm_count rs = weft_comm_stats(s.dp, 0, WEFT_COLL_REDUCE_SCATTER);
    weft_comm_count ag = weft_comm_stats(s.dp, 0, WEFT_COLL_ALL_GATHER);
    WCHECK((rs.calls == 0) == !last && (rs.bus_bytes == 0) == !last,
           "micro-batch %d: %lld reduce-scatters (%lld B) with sync %s", k, (long long)rs.calls,
           (long long)rs.bus_bytes, last ? "on" : "off");
    /* the first micro-batch all-gathers in forward and backward; the groups
     * stay unsharded after backward, so later ones skip the forward
     * all-gather (reshard_after_forward still reshards the non-root ones) */
    int64_t want_ag = k == 0 ? 2 * c.n_layers + 3 : c.n_layers + 1;
    WCHECK(ag.calls == want_ag, "micro-batch %d: %lld all-gathers, expected %lld", k,
           (long long)ag.calls, (long long)want_ag);
    if (!last) {
      weft_param *ps[MAXP];
      int np = 0;
      WOK(weft_module_parameters(acc.m, ps, MAXP, &np));
      for (int i = 0; i < np; i++)
        WCHECK(ps[i]->grad == NULL, "micro-batch %d: %s has a sharded grad before sync", k,
               ps[i]->fqn);
    }
  }
  weft_param *pb[MAXP], *pa[MAXP];
  int nb = 0, na = 0;
  WOK(weft_module_parameters(big.m, pb, MAXP, &nb));
  WOK(weft_module_parameters(acc.m, pa, MAXP, &na));
  double worst = 0;
  for (int i = 0; i < nb && i < na; i++) {
    weft_tensor *gb = NULL, *ga = NULL;
    WREQUIRE(pb[i]->grad && pa[i]->grad, "%s: no grad", pb[i]->fqn);
    WOK(weft_scale(weft_dtensor_local(pa[i]->grad), 1.0 / micro));
    WOK(weft_dtensor_full_tensor(pb[i]->grad, &gb));
    WOK(weft_dtensor_full_tensor(pa[i]->grad, &ga));
    double e = rel_max(ga, gb);
    WCHECK(e <= TOL, "%s: accumulated grad / 4 vs big batch rel err %.3g", pb[i]->fqn, e);
    if (e > worst) worst = e;
    weft_tensor_destroy(gb);
    weft_tensor_destroy(ga);
  }
  WOK(weft_optimizer_step(big.opt));
  WOK(weft_optimizer_step(acc.opt));
  result rb = {0}, ra = {0};
  snapshot(big.m, &rb);
  snapshot(acc.m, &ra);
  double worstp = 0;
  for (int i = 0; i < rb.np; i++) {
    double e = rel_max(ra.p[i], rb.p[i]);
    WCHECK(e <= TOL, "%s after the step: rel err %.3g", rb.name[i], e);
    if (e > worstp) worstp = e;
  }
  if (rank0())
    printf("accumulation dp=%d, 4 micro-batches: grads rel err %.2e, params after step %.2e\n", n,
           worst, worstp);
  result_free(&rb);
  result_free(&ra);
  for (int k = 0; k < micro; k++) {
    weft_tensor_destroy(tok[k]);
    weft_tensor_destroy(tgt[k]);
  }
  weft_tensor_destroy(btok);
  weft_tensor_destroy(btgt);
  model_free(&big);
  model_free(&acc);
  setup_free(&s);
}

/* Index of the first event (kind, group) at or after `from`; -1 if none. */
static int ev_find(weft_fsdp_event_kind kind, const weft_fsdp *g, int from) {
  for (int i = from < 0 ? 0 : from; i < weft_fsdp_trace_count(); i++) {
    weft_fsdp_event e;
    WOK(weft_fsdp_trace_get(i, &e));
    if (e.kind == kind && e.group == g) return i;
  }
  return -1;
}

static int ev_count(weft_fsdp_event_kind kind, bool prefetch_only) {
  int n = 0;
  for (int i = 0; i < weft_fsdp_trace_count(); i++) {
    weft_fsdp_event e;
    WOK(weft_fsdp_trace_get(i, &e));
    if (e.kind == kind && (!prefetch_only || e.prefetch)) n++;
  }
  return n;
}

/* Overlap: in forward the next group's all-gather is posted before the
 * current group computes and waited only after it; in backward the group
 * whose backward comes next is prefetched, and a group's reduce-scatter is
 * in flight while the next group computes. Explicit prefetch lists,
 * explicit async unshard / reshard, and set_is_last_backward(false). */
static void case_overlap(void) {
  weft_llama_config c = tiny(32, 3, 4, 2, 64, 64);
  setup s;
  if (!setup_make(&s, 0, weft_world_size(), 1, true)) return;
  mopt o = mopt_default();
  o.fsdp = true;
  model md;
  if (!build(&md, &c, s.model, s.dp, &o, 3)) return;
  weft_fsdp *g[5];
  g[0] = weft_fsdp_of(md.m);
  for (int i = 0; i < 3; i++) {
    char name[32];
    snprintf(name, sizeof name, "layers.%d", i);
    g[1 + i] = weft_fsdp_of(find(md.m, name));
  }
  g[4] = weft_fsdp_of(find(md.m, "norm"));
  WREQUIRE(g[0] && g[1] && g[2] && g[3] && g[4] && g[4] == weft_fsdp_of(find(md.m, "output")),
           "groups");
  WCHECK(strcmp(weft_fsdp_name(g[4]), "norm+output") == 0, "group name '%s'", weft_fsdp_name(g[4]));
  train tr = TRAIN5;
  step_once(&md, &s, &tr, 0, NULL); /* the first step records the forward order */
  WCHECK(weft_fsdp_is_root(g[0]) && !weft_fsdp_is_root(g[1]), "root detection");
  WCHECK(weft_fsdp_reshard_after_forward(g[0]) == 0 && weft_fsdp_reshard_after_forward(g[1]) == 1,
         "default reshard_after_forward: root %d, block %d", weft_fsdp_reshard_after_forward(g[0]),
         weft_fsdp_reshard_after_forward(g[1]));
  weft_fsdp_trace_clear();
  weft_fsdp_trace_enable(true);
  step_once(&md, &s, &tr, 1, NULL);
  weft_fsdp_trace_enable(false);
  if (rank0() && getenv("FSDP_TEST_PRINT_TRACE")) weft_fsdp_trace_print(stdout);
  /* forward: order root, 0, 1, 2, norm+output */
  for (int k = 0; k < 4; k++) {
    int begin = ev_find(WEFT_FSDP_EV_FORWARD_BEGIN, g[k], 0);
    int end = ev_find(WEFT_FSDP_EV_FORWARD_END, g[k], begin);
    int post = ev_find(WEFT_FSDP_EV_UNSHARD_START, g[k + 1], 0);
    int done = ev_find(WEFT_FSDP_EV_UNSHARD_DONE, g[k + 1], 0);
    weft_fsdp_event e = {0};
    if (post >= 0) WOK(weft_fsdp_trace_get(post, &e));
    WCHECK(begin >= 0 && post >= 0 && post < begin && e.prefetch,
           "forward: %s's all-gather (event %d) is not prefetched before %s computes (%d)",
           weft_fsdp_name(g[k + 1]), post, weft_fsdp_name(g[k]), begin);
    /* waited at its own pre-forward: after g[k] finished (the root's
     * forward contains the others: after it began) */
    int after = k == 0 ? begin : end;
    WCHECK(done > after, "forward: %s's all-gather waited (%d) before %s computed (%d)",
           weft_fsdp_name(g[k + 1]), done, weft_fsdp_name(g[k]), after);
  }
  /* backward order: root, norm+output, 2, 1, 0 */
  const weft_fsdp *bo[5] = {g[0], g[4], g[3], g[2], g[1]};
  int fwd_end = ev_find(WEFT_FSDP_EV_FORWARD_END, g[0], 0);
  for (int k = 0; k + 1 < 5; k++) {
    int begin = ev_find(WEFT_FSDP_EV_BACKWARD_BEGIN, bo[k], fwd_end);
    int post = ev_find(WEFT_FSDP_EV_UNSHARD_START, bo[k + 1], fwd_end);
    WCHECK(begin >= 0 && post >= 0 && post < begin,
           "backward: %s not prefetched (event %d) before %s's backward (%d)",
           weft_fsdp_name(bo[k + 1]), post, weft_fsdp_name(bo[k]), begin);
  }
  for (int k = 1; k + 1 < 5; k++) {
    int rs = ev_find(WEFT_FSDP_EV_REDUCE_START, bo[k], fwd_end);
    int next_begin = ev_find(WEFT_FSDP_EV_BACKWARD_BEGIN, bo[k + 1], fwd_end);
    int next_end = ev_find(WEFT_FSDP_EV_BACKWARD_END, bo[k + 1], fwd_end);
    int done = ev_find(WEFT_FSDP_EV_REDUCE_DONE, bo[k], fwd_end);
    WCHECK(rs >= 0 && rs < next_begin && done > next_end,
           "backward: %s's reduce-scatter (%d .. %d) does not span %s's backward (%d .. %d)",
           weft_fsdp_name(bo[k]), rs, done, weft_fsdp_name(bo[k + 1]), next_begin, next_end);
  }
  /* streams: on a device the all-gathers and reductions are queued on
   * FSDP's own streams and the trace counts those that ran beside another
   * group's compute (4 forward prefetches, 4 backward ones, the
   * reduce-scatters of norm+output, 2 and 1); on the CPU nothing is on a
   * device stream */
  bool on_dev = weft_mesh_device(s.dp) != WEFT_CPU;
  for (int i = 0; i < weft_fsdp_trace_count(); i++) {
    weft_fsdp_event e;
    WOK(weft_fsdp_trace_get(i, &e));
    weft_stream_id want = !on_dev                                ? WEFT_STREAM_COMPUTE
                          : e.kind == WEFT_FSDP_EV_UNSHARD_START ? WEFT_STREAM_FSDP_AG
                          : e.kind == WEFT_FSDP_EV_REDUCE_START  ? WEFT_STREAM_FSDP_RS
                                                                 : WEFT_STREAM_COMPUTE;
    WCHECK(e.stream == want, "event %d (%s): stream %s, want %s", i,
           weft_fsdp_event_kind_name(e.kind), weft_stream_name(e.stream), weft_stream_name(want));
  }
  int ov_ag = -1, ov_rs = -1;
  weft_fsdp_trace_overlaps(&ov_ag, &ov_rs);
  if (rank0() && getenv("FSDP_TEST_PRINT_TRACE"))
    printf("beside compute: %d of %d all-gathers, %d of %d reductions\n", ov_ag,
           ev_count(WEFT_FSDP_EV_UNSHARD_START, false), ov_rs,
           ev_count(WEFT_FSDP_EV_REDUCE_START, false));
  WCHECK(on_dev ? ov_ag >= 8 && ov_rs >= 3 : ov_ag == 0 && ov_rs == 0,
         "overlaps on %s: %d all-gathers, %d reductions beside compute",
         on_dev ? "the device" : "the CPU", ov_ag, ov_rs);
  /* explicit lists: no prefetch at all, then a forward list */
  for (int k = 0; k < 5; k++) {
    WOK(weft_fsdp_set_modules_to_forward_prefetch(g[k], NULL, 0));
    WOK(weft_fsdp_set_modules_to_backward_prefetch(g[k], NULL, 0));
  }
  weft_fsdp_trace_clear();
  weft_fsdp_trace_enable(true);
  step_once(&md, &s, &tr, 2, NULL);
  WCHECK(ev_count(WEFT_FSDP_EV_UNSHARD_START, true) == 0, "prefetch off: %d prefetches",
         ev_count(WEFT_FSDP_EV_UNSHARD_START, true));
  weft_fsdp *two[2] = {g[2], g[3]};
  WOK(weft_fsdp_set_modules_to_forward_prefetch(g[1], two, 2));
  weft_fsdp_trace_clear();
  step_once(&md, &s, &tr, 3, NULL);
  int b1 = ev_find(WEFT_FSDP_EV_FORWARD_BEGIN, g[1], 0);
  int p2 = ev_find(WEFT_FSDP_EV_UNSHARD_START, g[2], 0),
      p3 = ev_find(WEFT_FSDP_EV_UNSHARD_START, g[3], 0);
  WCHECK(
      p2 >= 0 && p3 >= 0 && p2 < b1 && p3 < b1 && ev_count(WEFT_FSDP_EV_UNSHARD_START, true) == 2,
      "explicit forward prefetch of layers.1 and layers.2 from layers.0: %d %d before %d", p2, p3,
      b1);
  weft_fsdp_trace_enable(false);
  for (int k = 0; k < 5; k++) {
    WOK(weft_fsdp_set_modules_to_forward_prefetch(g[k], NULL, -1));
    WOK(weft_fsdp_set_modules_to_backward_prefetch(g[k], NULL, -1));
  }
  /* explicit async unshard / reshard: exact unsharded accounting */
  weft_fsdp_memory m0, m1, m2;
  WOK(weft_fsdp_memory_get(&m0));
  weft_fsdp_handle *h = NULL;
  WOK(weft_fsdp_unshard(g[2], true, &h));
  WCHECK(h != NULL && !weft_fsdp_is_unsharded(g[2]), "async unshard: handle %p", (void *)h);
  WOK(weft_fsdp_handle_wait(h));
  WCHECK(weft_fsdp_is_unsharded(g[2]), "unsharded after the wait");
  weft_param *wq = NULL, *ref = NULL;
  WOK(weft_module_find_param(md.m, "layers.1.attention.wq.weight", &wq));
  WOK(weft_fsdp_memory_get(&m1));
  int64_t wbytes = (int64_t)(c.dim * c.dim) * 4;
  weft_fsdp_group_info gi;
  WOK(weft_fsdp_get_info(g[2], &gi));
  WCHECK(m1.unsharded_params.current - m0.unsharded_params.current == gi.numel * 4,
         "unsharded bytes %lld, the group has %lld",
         (long long)(m1.unsharded_params.current - m0.unsharded_params.current),
         (long long)gi.numel * 4);
  if (wq) {
    const weft_tensor *l = weft_dtensor_local(wq->data);
    WCHECK((int64_t)weft_tensor_nbytes(l) == wbytes, "unsharded wq local is %lld B",
           (long long)weft_tensor_nbytes(l));
    weft_tensor *full = NULL;
    WOK(weft_fsdp_reshard(g[2]));
    WOK(weft_dtensor_full_tensor(wq->data, &full));
    WOK(weft_fsdp_unshard(g[2], false, NULL));
    WCHECK(full && weft_worker_equal_on_host(full, weft_dtensor_local(wq->data)),
           "unsharded wq is not the full tensor");
    weft_tensor_destroy(full);
  }
  (void)ref;
  WOK(weft_fsdp_reshard(g[2]));
  WOK(weft_fsdp_memory_get(&m2));
  WCHECK(m2.unsharded_params.current == m0.unsharded_params.current &&
             m2.total.current == m0.total.current,
         "reshard did not free: unsharded %lld -> %lld, total %lld -> %lld",
         (long long)m0.unsharded_params.current, (long long)m2.unsharded_params.current,
         (long long)m0.total.current, (long long)m2.total.current);
  /* set_is_last_backward(false): the last reductions stay in flight */
  WOK(weft_fsdp_set_is_last_backward(g[0], false));
  weft_fsdp_trace_clear();
  weft_fsdp_trace_enable(true);
  const weft_llama_config *cc = weft_llama_get_config(md.m);
  weft_tensor *tok = NULL, *tgt = NULL;
  make_batch(cc, 8, 9, 7, s.dp_index * 2, 2, &tok, &tgt);
  double l;
  WOK(weft_llama_forward(md.m, tok, tgt, &l));
  WOK(weft_llama_backward(md.m));
  WCHECK(ev_find(WEFT_FSDP_EV_REDUCE_DONE, g[0], 0) < 0 &&
             ev_find(WEFT_FSDP_EV_REDUCE_START, g[0], 0) >= 0,
         "is_last_backward(false): the root's reduction finished at its post-backward");
  WOK(weft_fsdp_wait_reductions(g[0]));
  WCHECK(ev_find(WEFT_FSDP_EV_REDUCE_DONE, g[0], 0) >= 0, "wait_reductions finished nothing");
  weft_fsdp_trace_enable(false);
  WOK(weft_fsdp_set_is_last_backward(g[0], true));
  weft_param *tokw = NULL;
  WOK(weft_module_find_param(md.m, "tok_embeddings.weight", &tokw));
  WCHECK(tokw && tokw->grad && weft_dtensor_mesh(tokw->grad) == s.dp,
         "tok_embeddings has no sharded grad after wait_reductions");
  weft_tensor_destroy(tok);
  weft_tensor_destroy(tgt);
  weft_fsdp_trace_clear();
  model_free(&md);
  setup_free(&s);
}

/* bf16 mixed precision (bf16 all-gather and parameters, fp32 master
 * parameters and fp32 reduce) tracks the fp32 loss curve within 2% over
 * 50 steps; the all-gather moves half the bytes. */
static void case_bf16(void) {
  weft_llama_config c = tiny(32, 2, 4, 2, 64, 64);
  setup s;
  if (!setup_make(&s, 0, weft_world_size(), 1, true)) return;
  train tr = {.B = 4, .T = 16, .steps = 50, .clip = 1.0, .data_seed = 21, .fixed_batch = true};
  double loss[2][50];
  int64_t agb[2] = {0, 0};
  for (int k = 0; k < 2; k++) {
    mopt o = mopt_default();
    o.fsdp = true;
    if (k == 1) {
      weft_fsdp_mixed_precision mp = {WEFT_BF16, WEFT_F32, WEFT_DTYPE_COUNT, true};
      o.blocks.mp = o.last.mp = o.root.mp = mp;
    }
    model md;
    if (!build(&md, &c, s.model, s.dp, &o, 77)) break;
    if (k == 1) {
      weft_fsdp_group_info gi;
      WOK(weft_fsdp_get_info(weft_fsdp_of(md.m), &gi));
      WCHECK(gi.param_dtype == WEFT_BF16 && gi.reduce_dtype == WEFT_F32, "dtypes %s %s",
             weft_dtype_name(gi.param_dtype), weft_dtype_name(gi.reduce_dtype));
    }
    for (int i = 0; i < tr.steps; i++) {
      weft_comm_stats_reset(s.root);
      loss[k][i] = step_once(&md, &s, &tr, i, NULL);
      if (i == 0) agb[k] = weft_comm_stats(s.dp, 0, WEFT_COLL_ALL_GATHER).bus_bytes;
      loss[k][i] = dp_mean(&s, loss[k][i]);
    }
    model_free(&md);
  }
  double worst = 0;
  for (int i = 0; i < tr.steps; i++) {
    double e = weft_test_rel_scalar(loss[1][i], loss[0][i]);
    WCHECK(e <= 0.02, "step %d: bf16 loss %.6g vs fp32 %.6g (%.2f%%)", i, loss[1][i], loss[0][i],
           100 * e);
    if (e > worst) worst = e;
  }
  WCHECK(loss[0][tr.steps - 1] < 0.8 * loss[0][0], "fp32 loss did not fall: %.4g -> %.4g",
         loss[0][0], loss[0][tr.steps - 1]);
  WCHECK(2 * agb[1] == agb[0], "bf16 all-gather %lld B vs fp32 %lld B", (long long)agb[1],
         (long long)agb[0]);
  /* output_dtype: the logits of a [norm, output] group with output_dtype
   * bf16 hold bf16 values (f32 storage); without it they do not */
  for (int k = 0; k < 2; k++) {
    mopt o = mopt_default();
    o.fsdp = true;
    if (k == 1) o.last.mp.output_dtype = WEFT_BF16;
    model md;
    if (!build(&md, &c, s.model, s.dp, &o, 77)) break;
    weft_tensor *tok = NULL, *tgt = NULL;
    make_batch(&c, 8, 0, 3, s.dp_index * 2, 2, &tok, &tgt);
    double l;
    WOK(weft_llama_forward(md.m, tok, NULL, &l));
    const weft_dtensor *lg = weft_llama_logits(md.m);
    int64_t off = 0;
    weft_tensor *tmp = NULL;
    const weft_tensor *t = lg ? weft_worker_host_copy(weft_dtensor_local(lg), &tmp) : NULL;
    if (t) {
      const float *x = t->data;
      for (int64_t i = 0; i < weft_tensor_numel(t); i++)
        if (weft_bf16_to_f32(weft_f32_to_bf16(x[i])) != x[i]) off++;
      WCHECK(k == 1 ? off == 0 : off > 0, "output_dtype %s: %lld of %lld logits not bf16 values",
             k ? "bf16" : "unset", (long long)off, (long long)weft_tensor_numel(t));
    }
    weft_tensor_destroy(tmp);
    weft_tensor_destroy(tok);
    weft_tensor_destroy(tgt);
    model_free(&md);
  }
  if (rank0())
    printf(
        "bf16 mixed precision: loss %.4f -> %.4f (fp32 %.4f -> %.4f), worst gap %.3f%%, "
        "all-gather %lld B vs %lld B per step\n",
        loss[1][0], loss[1][tr.steps - 1], loss[0][0], loss[0][tr.steps - 1], 100 * worst,
        (long long)agb[1], (long long)agb[0]);
  setup_free(&s);
}

/* Bad input: each a clear error, nothing changed, nothing hangs. */
static void expect_err(weft_status st, weft_status want, const char *needle, const char *what) {
  WCHECK(st == want, "%s: status %s, expected %s (%s)", what, weft_status_str(st),
         weft_status_str(want), weft_last_error());
  WCHECK(strstr(weft_last_error(), needle) != NULL, "%s: message '%s' lacks '%s'", what,
         weft_last_error(), needle);
  weft_clear_error();
}

static void case_bad(void) {
  weft_llama_config c = tiny(32, 2, 4, 2, 64, 64);
  setup s;
  if (!setup_make(&s, 0, weft_world_size(), 1, true)) return;
  weft_module *m = NULL;
  WOK(weft_llama_create(&c, s.model, &m));
  WOK(weft_module_init_weights(m, 1));
  WREQUIRE(m, "model");
  weft_module *b0 = find(m, "layers.0"), *b1 = find(m, "layers.1");
  weft_param *wq = NULL;
  WOK(weft_module_find_param(m, "layers.0.attention.wq.weight", &wq));
  weft_dtensor *before = wq->data;
  /* a mesh that is neither 1-D nor 2-D */
  int shape3[3] = {1, 1, weft_world_size()};
  const char *n3[3] = {"a", "b", "c"};
  weft_mesh *m3 = NULL;
  WOK(weft_mesh_create(3, shape3, n3, &m3));
  weft_worker_mesh_on_device(m3);
  expect_err(weft_fully_shard(b0, m3, NULL, NULL), WEFT_ERR_INVALID, "1-D", "3-D mesh");
  WOK(weft_mesh_destroy(m3));
  expect_err(weft_fully_shard(NULL, s.dp, NULL, NULL), WEFT_ERR_INVALID, "NULL", "NULL module");
  expect_err(weft_fully_shard(b0, NULL, NULL, NULL), WEFT_ERR_INVALID, "NULL", "NULL mesh");
  weft_fsdp_options o = WEFT_FSDP_OPTIONS_INIT;
  o.version = 0;
  expect_err(weft_fully_shard(b0, s.dp, &o, NULL), WEFT_ERR_INVALID, "version", "version");
  o = (weft_fsdp_options)WEFT_FSDP_OPTIONS_INIT;
  o.reshard_after_forward = 2 * weft_world_size() + 1;
  expect_err(weft_fully_shard(b0, s.dp, &o, NULL), WEFT_ERR_INVALID, "reshard_after_forward",
             "raf too large");
  o = (weft_fsdp_options)WEFT_FSDP_OPTIONS_INIT;
  o.mp.param_dtype = WEFT_I32;
  expect_err(weft_fully_shard(b0, s.dp, &o, NULL), WEFT_ERR_INVALID, "param_dtype", "int dtype");
  /* a parameter in two groups: a module listed with one inside it */
  weft_module *att = find(m, "layers.0.attention");
  weft_module *pair[2] = {b0, att};
  expect_err(weft_fully_shard_modules(pair, 2, s.dp, NULL, NULL), WEFT_ERR_INVALID, "shared",
             "nested list");
  WCHECK(wq->data == before && weft_fsdp_of(b0) == NULL, "a failed call changed the module");
  /* top-down: the parent first */
  weft_module *layers = find(m, "layers");
  WOK(weft_fully_shard(layers, s.dp, NULL, NULL));
  expect_err(weft_fully_shard(b1, s.dp, NULL, NULL), WEFT_ERR_INVALID, "bottom-up", "top-down");
  /* twice on one module */
  expect_err(weft_fully_shard(layers, s.dp, NULL, NULL), WEFT_ERR_INVALID, "twice", "twice");
  /* destroying a module under a group is refused (issue 34: it returned OK
   * and a later weft_fsdp_memory_get read the freed module); the group
   * keeps working */
  expect_err(weft_module_destroy(m), WEFT_ERR_BUSY, "fully_shard", "destroy under fully_shard");
  weft_fsdp_memory mem;
  WOK(weft_fsdp_memory_get(&mem));
  WCHECK(weft_fsdp_of(layers) != NULL, "the group is gone after a refused destroy");
  WOK(weft_fsdp_destroy_all(m));
  WOK(weft_module_destroy(m));
  m = NULL;
  /* an optimizer created before sharding: the step says what to do */
  WOK(weft_llama_create(&c, s.model, &m));
  WOK(weft_module_init_weights(m, 1));
  weft_adamw_params hp = WEFT_ADAMW_DEFAULT;
  weft_optimizer *opt = NULL;
  WOK(weft_adamw_create(m, &hp, &opt));
  mopt mo = mopt_default();
  shard_model(m, s.dp, &mo);
  weft_tensor *tok = NULL, *tgt = NULL;
  make_batch(&c, 8, 0, 1, 0, 2, &tok, &tgt);
  double l;
  WOK(weft_llama_forward(m, tok, tgt, &l));
  WOK(weft_llama_backward(m));
  expect_err(weft_optimizer_step(opt), WEFT_ERR_STATE, "after sharding", "optimizer first");
  weft_optimizer_destroy(opt);
  /* sharding after the model ran */
  expect_err(weft_fully_shard(find(m, "layers.0.attention.wq"), s.dp, NULL, NULL), WEFT_ERR_INVALID,
             "bottom-up", "after the root");
  WOK(weft_fsdp_destroy_all(m));
  WOK(weft_module_destroy(m));
  m = NULL;
  WOK(weft_llama_create(&c, s.model, &m));
  WOK(weft_module_init_weights(m, 1));
  WOK(weft_fully_shard(find(m, "layers.1"), s.dp, NULL, NULL));
  WOK(weft_llama_forward(m, tok, tgt, &l)); /* layers.1 acts as its own root */
  expect_err(weft_fully_shard(m, s.dp, NULL, NULL), WEFT_ERR_STATE, "before the first forward",
             "shard after a forward");
  /* controls on bad arguments */
  expect_err(weft_fsdp_set_requires_gradient_sync(NULL, true, true), WEFT_ERR_INVALID, "NULL",
             "NULL group");
  weft_fsdp *g1 = weft_fsdp_of(find(m, "layers.1"));
  expect_err(weft_fsdp_unshard(g1, true, NULL), WEFT_ERR_INVALID, "handle", "async, no handle");
  expect_err(weft_fsdp_set_reshard_after_forward(g1, 3 * weft_world_size(), false),
             WEFT_ERR_INVALID, "reshard_after_forward", "raf setter");
  WOK(weft_fsdp_destroy_all(m));
  /* a destroyed group's handle (issue 34: handles that cannot be misused):
   * destroying it again and every call on it are errors or read as empty,
   * never a read of freed memory (ASan runs this suite) */
  expect_err(weft_fsdp_destroy(g1), WEFT_ERR_INVALID, "not a live FSDP group", "destroy twice");
  weft_fsdp_group_info gi;
  expect_err(weft_fsdp_get_info(g1, &gi), WEFT_ERR_INVALID, "not a live", "info after destroy");
  expect_err(weft_fsdp_reshard(g1), WEFT_ERR_INVALID, "not a live", "reshard after destroy");
  expect_err(weft_fsdp_unshard(g1, false, NULL), WEFT_ERR_INVALID, "not a live",
             "unshard after destroy");
  expect_err(weft_fsdp_set_requires_gradient_sync(g1, false, true), WEFT_ERR_INVALID, "not a live",
             "setter after destroy");
  weft_fsdp_comm gc;
  expect_err(weft_fsdp_comm_get(g1, false, &gc), WEFT_ERR_INVALID, "not a live",
             "comm after destroy");
  WCHECK(weft_fsdp_num_params(g1) == 0 && weft_fsdp_param(g1, 0) == NULL &&
             weft_fsdp_num_modules(g1) == 0 && weft_fsdp_module(g1, 0) == NULL &&
             weft_fsdp_dp_mesh(g1) == NULL && !weft_fsdp_is_root(g1) &&
             !weft_fsdp_is_unsharded(g1) && weft_fsdp_reshard_after_forward(g1) == -1 &&
             !strcmp(weft_fsdp_name(g1), ""),
         "a destroyed group does not read as empty");
  WOK(weft_module_destroy(m));
  weft_tensor_destroy(tok);
  weft_tensor_destroy(tgt);
#ifdef FSDP_TEST_HAVE_TP
  /* TP meshes that are not (dp..., tp...) of one root */
  if (weft_world_size() == 2) {
    int one_two[2] = {1, 2};
    const char *tn[2] = {"tp", "dp"};
    weft_mesh *root = NULL, *dpm = NULL;
    WOK(weft_mesh_create(2, one_two, tn, &root));
    weft_worker_mesh_on_device(root);
    WOK(weft_mesh_submesh(root, 1, &tn[1], &dpm));
    int world[1] = {2};
    const char *wn[1] = {"tpw"};
    weft_mesh *wtp = NULL;
    WOK(weft_mesh_create(1, world, wn, &wtp)); /* a tp mesh of 2 from another root */
    weft_worker_mesh_on_device(wtp);
    weft_module *mt = NULL;
    WOK(weft_llama_create(&c, wtp, &mt));
    expect_err(weft_fully_shard(find(mt, "layers.0"), dpm, NULL, NULL), WEFT_ERR_INVALID,
               "different root", "other roots");
    WOK(weft_module_destroy(mt));
    WOK(weft_mesh_destroy(dpm));
    WOK(weft_mesh_destroy(wtp));
    WOK(weft_mesh_destroy(root));
    /* a root with the tp dim first */
    int sh[2] = {2, 1};
    const char *nm[2] = {"tp", "dp"};
    weft_mesh *r3 = NULL, *t3 = NULL, *d3 = NULL;
    WOK(weft_mesh_create(2, sh, nm, &r3));
    weft_worker_mesh_on_device(r3);
    WOK(weft_mesh_submesh(r3, 1, &nm[0], &t3));
    WOK(weft_mesh_submesh(r3, 1, &nm[1], &d3));
    weft_module *m4 = NULL;
    WOK(weft_llama_create(&c, t3, &m4));
    expect_err(weft_fully_shard(find(m4, "layers.0"), d3, NULL, NULL), WEFT_ERR_INVALID,
               "followed by the tp dims", "tp first");
    WOK(weft_module_destroy(m4));
    WOK(weft_mesh_destroy(t3));
    WOK(weft_mesh_destroy(d3));
    WOK(weft_mesh_destroy(r3));
  }
#endif
  setup_free(&s);
}

#ifdef FSDP_TEST_HAVE_GPT2
/* ------------------------------------------------- tied parameters (GPT-2)
 * lm_head.weight is transformer.wte.weight. FSDP must keep it in the group
 * of a common ancestor of wte and lm_head: fully_shard(wte) or
 * fully_shard(transformer) alone fail (naming the parameter, the alias and
 * the module to shard instead, changing nothing); [wte, lm_head] as one
 * group, or the root (with lm_head's own group taking nothing), train
 * like the unsharded model: loss and every gradient (the tied one summing
 * both uses) equal the 1-rank run on the whole batch. */

static weft_gpt2_config tied_cfg(void) {
  weft_gpt2_config c = WEFT_GPT2_CONFIG_INIT;
  c.vocab = 40;
  c.max_seq_len = 16;
  c.dim = 16;
  c.n_layers = 2;
  c.n_heads = 2;
  c.ffn_dim = 32;
  return c;
}

/* ids and targets (rows, T) of the global batch rows [row0, row0 + rows). */
static void tied_batch(weft_mesh *mesh, int row0, int rows, int T, int V, weft_dtensor **ids,
                       weft_dtensor **tgt) {
  int64_t shape[2] = {rows, T};
  weft_tensor *a = NULL, *b = NULL;
  WOK(weft_tensor_create(WEFT_I32, WEFT_CPU, 2, shape, &a));
  WOK(weft_tensor_create(WEFT_I32, WEFT_CPU, 2, shape, &b));
  if (!a || !b) return;
  for (int r = 0; r < rows; r++)
    for (int t = 0; t < T; t++) {
      uint64_t k = (uint64_t)(row0 + r) * 131u + (uint64_t)t + 77u;
      ((int32_t *)a->data)[r * T + t] = (int32_t)(weft_test_mix64(k) % (uint64_t)V);
      ((int32_t *)b->data)[r * T + t] = (int32_t)(weft_test_mix64(k ^ 0x5555u) % (uint64_t)V);
    }
  weft_placement pl[1] = {weft_replicate()};
  WOK(weft_dtensor_distribute(mesh, a, WEFT_DTENSOR_ALL_RANKS, pl, 1, ids));
  WOK(weft_dtensor_distribute(mesh, b, WEFT_DTENSOR_ALL_RANKS, pl, 1, tgt));
  weft_tensor_destroy(a);
  weft_tensor_destroy(b);
}

/* Loss (averaged over dp ranks) and full grads of one forward/backward. */
static double tied_step(weft_module *m, weft_mesh *mesh, int row0, int rows, int ndp,
                        weft_tensor **grads, int *np) {
  const int T = 8;
  weft_dtensor *ids = NULL, *tgt = NULL;
  tied_batch(mesh, row0, rows, T, (int)tied_cfg().vocab, &ids, &tgt);
  weft_graph *g = NULL;
  WOK(weft_graph_create(&g));
  weft_var *loss = NULL;
  WOK(weft_gpt2_loss(m, g, ids, tgt, &loss, NULL));
  double l = loss ? weft_var_item(loss) : NAN;
  if (loss) WOK(weft_backward(loss));
  double sum = 0;
  MPI_Allreduce(&l, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  if (ndp > 1) l = sum / weft_world_size();
  weft_param *ps[MAXP];
  WOK(weft_module_parameters(m, ps, MAXP, np));
  for (int i = 0; i < *np; i++) {
    grads[i] = NULL;
    if (ps[i]->grad) WOK(weft_dtensor_full_tensor(ps[i]->grad, &grads[i]));
    WCHECK(grads[i], "%s: no grad", ps[i]->fqn);
  }
  weft_graph_destroy(g);
  weft_dtensor_destroy(ids);
  weft_dtensor_destroy(tgt);
  return l;
}

static void case_tied(void) {
  int world = weft_world_size(), rank = weft_world_rank();
  const int B = 4;
  WREQUIRE(B % world == 0, "batch %d over %d ranks", B, world);
  weft_gpt2_config c = tied_cfg();
  weft_mesh *self = mesh_self(), *dp = NULL;
  const char *dn[1] = {"dp"};
  WOK(weft_mesh_create(1, &world, dn, &dp));
  weft_worker_mesh_on_device(dp);
  WREQUIRE(self && dp, "meshes");
  /* the reference: one rank, the whole batch */
  weft_module *ref = NULL;
  WOK(weft_gpt2_create(&c, self, &ref));
  WOK(weft_module_init_weights(ref, 5));
  weft_tensor *gref[MAXP] = {0};
  int nref = 0;
  double lref = tied_step(ref, self, 0, B, 1, gref, &nref);
  WCHECK(nref == 2 + 12 * (int)c.n_layers + 2, "%d parameters (the tied one counted once)", nref);

  for (int mode = 0; mode < 2; mode++) {
    weft_module *m = NULL;
    WOK(weft_gpt2_create(&c, self, &m));
    WOK(weft_module_init_weights(m, 5));
    WREQUIRE(m, "model");
    weft_module *wte = find(m, "transformer.wte"), *tr = find(m, "transformer"),
                *head = find(m, "lm_head"), *h = find(m, "transformer.h");
    weft_param *w = NULL;
    WOK(weft_module_find_param(m, "transformer.wte.weight", &w));
    weft_dtensor *before = w ? w->data : NULL;
    /* the owner alone, or a subtree without lm_head: refused, nothing changes */
    weft_status st = weft_fully_shard(wte, dp, NULL, NULL);
    WCHECK(st == WEFT_ERR_INVALID && strstr(weft_last_error(), "'transformer.wte.weight'") &&
               strstr(weft_last_error(), "'lm_head.weight'") &&
               strstr(weft_last_error(), "apply fully_shard to 'model'"),
           "fully_shard(wte): %s: %s (want invalid naming the parameter, the alias and 'model')",
           weft_status_str(st), weft_last_error());
    if (rank == 0 && mode == 0) printf("fully_shard(wte): %s\n", weft_last_error());
    weft_clear_error();
    expect_err(weft_fully_shard(tr, dp, NULL, NULL), WEFT_ERR_INVALID,
               "apply fully_shard to 'model'", "fully_shard(transformer)");
    WCHECK(!weft_fsdp_of(wte) && !weft_fsdp_of(tr) && w && w->data == before,
           "a refused fully_shard changed the model");
    for (int i = 0; i < weft_module_num_children(h); i++)
      WOK(weft_fully_shard(weft_module_child(h, i), dp, NULL, NULL));
    weft_fsdp *tied_group = NULL;
    if (mode == 0) {
      /* one group over the owner and the alias's module */
      weft_module *two[2] = {wte, head};
      WOK(weft_fully_shard_modules(two, 2, dp, NULL, &tied_group));
    } else {
      /* lm_head's own group takes nothing: the root takes the weight */
      weft_fsdp *hg = NULL;
      WOK(weft_fully_shard(head, dp, NULL, &hg));
      WCHECK(weft_fsdp_num_params(hg) == 0, "lm_head's group took %d parameters",
             weft_fsdp_num_params(hg));
    }
    weft_fsdp *root = NULL;
    WOK(weft_fully_shard(m, dp, NULL, &root));
    if (mode == 1) tied_group = root;
    bool in = false;
    for (int i = 0; i < weft_fsdp_num_params(tied_group); i++)
      in |= weft_fsdp_param(tied_group, i) == w;
    WCHECK(in, "mode %d: the tied weight is not in group '%s'", mode, weft_fsdp_name(tied_group));
    weft_tensor *gg[MAXP] = {0};
    int np = 0;
    int rows = B / world;
    double l = tied_step(m, self, rank * rows, rows, world, gg, &np);
    WCHECK(fabs(l - lref) <= TOL * fabs(lref), "mode %d: loss %.9g, one rank %.9g", mode, l, lref);
    WCHECK(np == nref, "mode %d: %d parameters vs %d", mode, np, nref);
    weft_param *ps[MAXP];
    WOK(weft_module_parameters(m, ps, MAXP, &np));
    double worst = 0;
    for (int i = 0; i < np && i < nref; i++) {
      if (!gg[i] || !gref[i]) continue;
      double e = rel_norm(gg[i], gref[i]);
      if (e > worst) worst = e;
      WCHECK(e <= TOL, "mode %d: grad of %s differs from one rank by %.3g", mode, ps[i]->fqn, e);
      weft_tensor_destroy(gg[i]);
    }
    if (rank == 0)
      printf("tied mode %d (%s) on %d ranks: loss %.9f (one rank %.9f), worst grad rel err %.3g\n",
             mode, mode == 0 ? "[wte, lm_head] group" : "root group", world, l, lref, worst);
    WOK(weft_fsdp_destroy_all(m));
    WOK(weft_module_destroy(m));
  }
  for (int i = 0; i < nref; i++) weft_tensor_destroy(gref[i]);
  WOK(weft_module_destroy(ref));
  WOK(weft_mesh_destroy(dp));
  WOK(weft_mesh_destroy(self));
}
#endif

static const weft_worker_case cases[] = {
    {"parity_fsdp", case_parity_fsdp},
    {"parity_uneven", case_parity_uneven},
    {"offload", case_offload},
#ifdef FSDP_TEST_HAVE_TP
    {"parity_2d", case_parity_2d},
    {"parity_3d", case_parity_3d},
#endif
    {"parity_hsdp", case_parity_hsdp},
    {"reshard_modes", case_reshard_modes},
    {"accumulate", case_accumulate},
    {"overlap", case_overlap},
    {"bf16", case_bf16},
    {"bad", case_bad},
#ifdef FSDP_TEST_HAVE_GPT2
    {"tied", case_tied},
#endif
    {NULL, NULL},
};

int main(int argc, char **argv) { return weft_worker_main(argc, argv, cases); }
