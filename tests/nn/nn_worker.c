/* tests/nn/nn_worker.c — MPI worker cases of the nn suite (started by
 * test_nn.c through mpiexec). Every rank checks; see tests/harness/worker.h. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nn_util.h"
#include "worker.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static bool ends_with(const char *s, const char *suf) {
  size_t a = strlen(s), b = strlen(suf);
  return a >= b && strcmp(s + a - b, suf) == 0;
}

/* ------------------------------------------------- a test-side TP plan */

/* What tp/ will do, written out by hand: colwise wq wk wv w1 w3 output,
 * rowwise wo w2 tok_embeddings; with sp, sequence-parallel norms and the
 * redistributes around attention / feed_forward / output as hooks. */
typedef struct redist_ctx {
  int n;
  weft_placement pl[WEFT_MESH_MAX_DIMS];
} redist_ctx;

static weft_status hook_redistribute(weft_module *m, weft_hook_kind kind, const weft_dtensor *t,
                                     weft_dtensor **replace, void *ctx) {
  (void)m;
  (void)kind;
  const redist_ctx *c = ctx;
  const weft_placement *have = weft_dtensor_placements(t);
  bool same = true;
  for (int i = 0; i < c->n; i++) same &= weft_placement_equal(have[i], c->pl[i]);
  if (same) return WEFT_OK;
  return weft_dtensor_redistribute(t, c->pl, c->n, replace);
}

static redist_ctx ctx_r = {1, {{WEFT_PLACE_REPLICATE, 0, 1, WEFT_OP_SUM}}};
static redist_ctx ctx_s1 = {1, {{WEFT_PLACE_SHARD, 1, 1, WEFT_OP_SUM}}};

static weft_status plan_visit(weft_module *m, void *ctx) {
  bool sp = *(bool *)ctx;
  const char *f = weft_module_fqn(m);
  weft_placement s0 = weft_shard(0), s1 = weft_shard(1);
  weft_param *w = weft_module_num_params(m) ? weft_module_param(m, 0) : NULL;
  if (weft_module_get_kind(m) == WEFT_MODULE_LINEAR) {
    bool col = ends_with(f, ".wq") || ends_with(f, ".wk") || ends_with(f, ".wv") ||
               ends_with(f, ".w1") || ends_with(f, ".w3") || strcmp(f, "output") == 0;
    WEFT_CHECK(weft_param_set_placements(w, col ? &s0 : &s1, 1));
  }
  if (strcmp(f, "tok_embeddings") == 0) {
    WEFT_CHECK(weft_param_set_placements(w, &s0, 1));
    WEFT_CHECK(weft_module_register_hook(m, WEFT_HOOK_POST_FORWARD, hook_redistribute,
                                         sp ? &ctx_s1 : &ctx_r, NULL));
  }
  if (sp) {
    weft_module_kind k = weft_module_get_kind(m);
    if (k == WEFT_MODULE_ATTENTION || k == WEFT_MODULE_FEED_FORWARD) {
      WEFT_CHECK(weft_module_register_hook(m, WEFT_HOOK_PRE_FORWARD, hook_redistribute, &ctx_r, NULL));
      WEFT_CHECK(weft_module_register_hook(m, WEFT_HOOK_POST_FORWARD, hook_redistribute, &ctx_s1, NULL));
    }
    if (strcmp(f, "output") == 0)
      WEFT_CHECK(weft_module_register_hook(m, WEFT_HOOK_PRE_FORWARD, hook_redistribute, &ctx_r, NULL));
  }
  return WEFT_OK;
}

/* ------------------------------------------------------------- golden */

/* plan 0: all Replicate; 1: TP; 2: TP + sequence parallel. */
static void run_golden(const char *name, int plan) {
  golden g;
  WOK(golden_load(name, &g));
  weft_mesh *mesh = NULL;
  WOK(mesh_world(&mesh));
  weft_module *model = NULL;
  WOK(weft_llama_create(&g.cfg, mesh, &model));
  WREQUIRE(model, "no model");
  if (plan) {
    bool sp = plan == 2;
    WOK(weft_module_visit(model, plan_visit, &sp));
  }
  char path[700];
  golden_path(&g, "init.safetensors", path, sizeof path);
  WOK(load_params(model, path));
  double loss = 0;
  double t0 = now_s();
  WOK(weft_llama_forward(model, g.tokens, g.targets, &loss));
  WOK(weft_llama_backward(model));
  double t1 = now_s();
  double lerr = fabs(loss - g.loss) / fabs(g.loss);
  WCHECK(lerr < 2e-6, "%s plan %d: loss %.9f want %.9f (rel %.3g)", name, plan, loss, g.loss, lerr);

  weft_safetensors *fg = NULL, *fa = NULL, *fi = NULL;
  golden_path(&g, "grads.safetensors", path, sizeof path);
  WOK(weft_safetensors_open(path, &fg));
  golden_path(&g, "after_step.safetensors", path, sizeof path);
  WOK(weft_safetensors_open(path, &fa));
  golden_path(&g, "init.safetensors", path, sizeof path);
  WOK(weft_safetensors_open(path, &fi));
  weft_param *ps[256];
  int np = 0;
  WOK(weft_module_parameters(model, ps, 256, &np));
  WCHECK(np == 2 + 9 * (int)g.cfg.n_layers + 1, "param count %d", np);
  double worst_g = 0;
  for (int i = 0; i < np; i++) {
    weft_tensor *full = NULL;
    WREQUIRE(ps[i]->grad, "%s: no grad", ps[i]->fqn);
    WOK(weft_dtensor_full_tensor(ps[i]->grad, &full));
    double *ref = NULL;
    int64_t n = 0;
    WOK(read_f64(fg, ps[i]->fqn, &ref, &n));
    WREQUIRE(ref && full && n == weft_tensor_numel(full), "%s: size", ps[i]->fqn);
    double e = rel_err_f32_f64(full->data, ref, n);
    if (e > worst_g) worst_g = e;
    WCHECK(e < 1e-5, "%s plan %d: grad %s rel err %.3g", name, plan, ps[i]->fqn, e);
    free(ref);
    weft_tensor_destroy(full);
  }
  /* clip + one AdamW step */
  double norm = 0;
  WOK(weft_clip_grad_norm(model, g.clip, &norm));
  double nerr = fabs(norm - g.grad_norm) / g.grad_norm;
  WCHECK(nerr < 1e-5, "%s plan %d: grad norm %.9f want %.9f", name, plan, norm, g.grad_norm);
  weft_optimizer *opt = NULL;
  WOK(weft_adamw_create(model, &g.hp, &opt));
  double t2 = now_s();
  WOK(weft_optimizer_step(opt));
  double t3 = now_s();
  double worst_u = 0;
  for (int i = 0; i < np; i++) {
    weft_tensor *full = NULL;
    WOK(weft_dtensor_full_tensor(ps[i]->data, &full));
    double *after = NULL, *init = NULL;
    int64_t n = 0, n2 = 0;
    WOK(read_f64(fa, ps[i]->fqn, &after, &n));
    WOK(read_f64(fi, ps[i]->fqn, &init, &n2));
    WREQUIRE(full && after && init && n == n2 && n == weft_tensor_numel(full), "size");
    const float *p = full->data;
    float *du = malloc((size_t)n * sizeof(float));
    double *dref = malloc((size_t)n * sizeof(double));
    for (int64_t k = 0; k < n; k++) {
      du[k] = (float)((double)p[k] - init[k]);
      dref[k] = after[k] - init[k];
    }
    double e = rel_err_f32_f64(du, dref, n);
    if (e > worst_u) worst_u = e;
    WCHECK(e < 1e-3, "%s plan %d: update of %s rel err %.3g", name, plan, ps[i]->fqn, e);
    free(du);
    free(dref);
    free(after);
    free(init);
    weft_tensor_destroy(full);
  }
  if (weft_worker_rank == 0)
    printf("golden %s plan %d ranks %d: loss rel err %.3g, worst grad rel err %.3g, norm rel err "
           "%.3g, worst update rel err %.3g; fwd+bwd %.2f ms, adamw %.2f ms\n",
           name, plan, weft_world_size(), lerr, worst_g, nerr, worst_u, 1e3 * (t1 - t0),
           1e3 * (t3 - t2));
  weft_optimizer_destroy(opt);
  weft_safetensors_close(fg);
  weft_safetensors_close(fa);
  weft_safetensors_close(fi);
  WOK(weft_module_destroy(model));
  WOK(weft_mesh_destroy(mesh));
  golden_free(&g);
}

static void case_golden(void) {
  run_golden("tiny_mha", 0);
  run_golden("tiny_gqa", 0);
}

static void case_golden_tp(void) {
  run_golden("tiny_mha", 1);
  run_golden("tiny_gqa", 1);
  run_golden("tiny_mha", 2);
  run_golden("tiny_gqa", 2);
}

static const weft_worker_case cases[] = {
    {"golden", case_golden},
    {"golden_tp", case_golden_tp},
    {0, 0},
};

int main(int argc, char **argv) { return weft_worker_main(argc, argv, cases); }
