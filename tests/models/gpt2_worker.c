/* tests/models/gpt2_worker.c — MPI worker cases for models/gpt2 (started
 * by test_models.c under mpiexec): PyTorch float64 golden parity of loss,
 * gradients (the tied wte grad includes lm_head's use) and one AdamW step
 * with nanoGPT's two parameter groups, on one rank and sharded. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd.h"
#include "fsdp.h"
#include "golden.h"
#include "gpt2.h"
#include "worker.h"

static weft_gpt2_config gpt2_config(const golden *g) {
  weft_gpt2_config c = WEFT_GPT2_CONFIG_INIT;
  c.vocab = g->cfg.vocab;
  c.dim = g->cfg.dim;
  c.n_layers = g->cfg.n_layers;
  c.n_heads = g->cfg.n_heads;
  c.ffn_dim = g->cfg.ffn_dim;
  c.max_seq_len = g->positions;
  return c;
}

/* Rows [r0, r0 + n) of a (B, T) int32 tensor as a Replicate DTensor. */
static weft_status rows_dt(weft_mesh *mesh, const weft_tensor *t, int64_t r0, int64_t n,
                           weft_dtensor **out) {
  weft_tensor *v;
  WEFT_CHECK(weft_tensor_narrow(t, 0, r0, n, &v));
  weft_placement pl[WEFT_MESH_MAX_DIMS];
  for (int i = 0; i < weft_mesh_ndim(mesh); i++) pl[i] = weft_replicate();
  weft_status st = weft_dtensor_distribute(mesh, v, WEFT_DTENSOR_ALL_RANKS, pl,
                                           weft_mesh_ndim(mesh), out);
  weft_tensor_destroy(v);
  return st;
}

/* mode 0: every rank the whole batch, model all-Replicate on a 1-D mesh of
 * the world; mode 1: FSDP over a dp mesh of the world, each rank a slice
 * of the batch (B divisible by the world size). */
static void run_golden(int mode) {
  golden g;
  WOK(golden_load("gpt2_tiny", &g));
  weft_gpt2_config cfg = gpt2_config(&g);
  int world = weft_world_size(), rank = weft_worker_rank;
  int shape1[1] = {world};
  const char *names[1] = {mode == 1 ? "dp" : "tp"};
  weft_mesh *world_mesh = NULL, *model_mesh = NULL;
  WOK(weft_mesh_create(1, shape1, names, &world_mesh));
  int one = 1;
  const char *mn[1] = {"tp"};
  if (mode == 1) WOK(weft_mesh_create_from_comm(MPI_COMM_SELF, 1, &one, mn, &model_mesh));
  weft_mesh *mesh = mode == 1 ? model_mesh : world_mesh;
  weft_module *model = NULL;
  WOK(weft_gpt2_create(&cfg, mesh, &model));
  char path[700];
  golden_path(&g, "init.safetensors", path, sizeof path);
  WOK(load_params(model, path));
  if (mode == 1) {
    weft_fsdp *f = NULL;
    weft_module *h;
    WOK(weft_module_find(model, "transformer.h", &h));
    for (int i = 0; i < weft_module_num_children(h); i++)
      WOK(weft_fully_shard(weft_module_child(h, i), world_mesh, NULL, &f));
    WOK(weft_fully_shard(model, world_mesh, NULL, &f));
  }
  int64_t B = g.B, r0 = 0, nb = B;
  if (mode == 1) {
    WREQUIRE(B % world == 0, "batch %lld over %d ranks", (long long)B, world);
    nb = B / world;
    r0 = rank * nb;
  }
  weft_dtensor *ids = NULL, *tgt = NULL;
  WOK(rows_dt(mesh, g.tokens, r0, nb, &ids));
  WOK(rows_dt(mesh, g.targets, r0, nb, &tgt));
  weft_graph *gr = NULL;
  WOK(weft_graph_create(&gr));
  weft_var *loss = NULL;
  WOK(weft_gpt2_loss(model, gr, ids, tgt, &loss, NULL));
  double lv = weft_var_item(loss);
  if (mode == 1) {
    double sum = 0;
    MPI_Allreduce(&lv, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    lv = sum / world;
  }
  double lerr = fabs(lv - g.loss) / fabs(g.loss);
  WCHECK(lerr < 1e-6, "mode %d: loss %.9f want %.9f (rel %.3g)", mode, lv, g.loss, lerr);
  WOK(weft_backward(loss));

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
  WCHECK(np == 2 + 12 * (int)cfg.n_layers + 2, "param count %d (tied lm_head counted once)", np);
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
    WCHECK(e < 1e-5, "mode %d: grad %s rel err %.3g", mode, ps[i]->fqn, e);
    free(ref);
    weft_tensor_destroy(full);
  }
  double norm = 0;
  WOK(weft_clip_grad_norm(model, g.clip, &norm));
  double nerr = fabs(norm - g.grad_norm) / g.grad_norm;
  WCHECK(nerr < 1e-5, "mode %d: grad norm %.9f want %.9f", mode, norm, g.grad_norm);
  weft_optimizer *opt = NULL;
  WOK(weft_gpt2_adamw_create(model, &g.hp, &opt));
  WCHECK(weft_optimizer_num_groups(opt) == 2, "groups %d", weft_optimizer_num_groups(opt));
  WOK(weft_optimizer_step(opt));
  double worst_u = 0;
  int64_t nzero = 0;
  for (int i = 0; i < np; i++) {
    weft_tensor *full = NULL;
    WOK(weft_dtensor_full_tensor(ps[i]->data, &full));
    double *after = NULL, *init = NULL, *gref = NULL;
    int64_t n = 0, n2 = 0, n3 = 0;
    WOK(read_f64(fa, ps[i]->fqn, &after, &n));
    WOK(read_f64(fi, ps[i]->fqn, &init, &n2));
    WOK(read_f64(fg, ps[i]->fqn, &gref, &n3));
    WREQUIRE(full && after && init && gref && n == n2 && n == n3 &&
                 n == weft_tensor_numel(full), "size");
    const float *p = full->data;
    float *du = malloc((size_t)n * sizeof(float));
    double *dref = malloc((size_t)n * sizeof(double));
    /* Elements whose exact gradient is zero (the key bias: softmax is
     * invariant to it; float64 gives ~1e-19) get lr * noise / (|noise| +
     * eps) from the first Adam step in any precision: compared as
     * "weight decay only" instead, i.e. both sides' update without them. */
    for (int64_t k = 0; k < n; k++) {
      bool zero_grad = fabs(gref[k]) < 1e-12;
      du[k] = zero_grad ? 0.0f : (float)((double)p[k] - init[k]);
      dref[k] = zero_grad ? 0.0 : after[k] - init[k];
      if (zero_grad) {
        nzero++;
        WCHECK(fabs((double)p[k] - init[k]) <= 2.0 * g.hp.lr, "%s[%lld]: moved %.3g with a zero "
               "gradient", ps[i]->fqn, (long long)k, fabs((double)p[k] - init[k]));
      }
    }
    free(gref);
    double e = rel_err_f32_f64(du, dref, n);
    if (e > worst_u) worst_u = e;
    WCHECK(e < 1e-3, "mode %d: update of %s rel err %.3g", mode, ps[i]->fqn, e);
    free(du);
    free(dref);
    free(after);
    free(init);
    weft_tensor_destroy(full);
  }
  /* a few more steps: from the second on, the graph reuses its buffers */
  int64_t allocs[4] = {0};
  for (int s = 0; s < 4; s++) {
    WOK(weft_graph_reset(gr));
    WOK(weft_module_zero_grad(model, false));
    WOK(weft_gpt2_loss(model, gr, ids, tgt, &loss, NULL));
    WOK(weft_backward(loss));
      WOK(weft_clip_grad_norm(model, g.clip, NULL));
    WOK(weft_optimizer_step(opt));
    allocs[s] = weft_mem_get(WEFT_CPU).alloc_count;
  }
  WCHECK(mode != 0 || allocs[3] == allocs[2], "mode %d: %lld allocations in a steady step", mode,
         (long long)(allocs[3] - allocs[2]));
  if (rank == 0)
    printf("gpt2 golden mode %d ranks %d: loss rel err %.3g, worst grad rel err %.3g, norm rel "
           "err %.3g, worst update rel err %.3g (%lld elements with an exactly zero gradient "
           "compared by bound)\n",
           mode, world, lerr, worst_g, nerr, worst_u, (long long)nzero);
  weft_optimizer_destroy(opt);
  weft_graph_destroy(gr);
  weft_dtensor_destroy(ids);
  weft_dtensor_destroy(tgt);
  weft_safetensors_close(fg);
  weft_safetensors_close(fa);
  weft_safetensors_close(fi);
  if (mode == 1) WOK(weft_fsdp_destroy_all(model));
  WOK(weft_module_destroy(model));
  WOK(weft_mesh_destroy(world_mesh));
  if (model_mesh) WOK(weft_mesh_destroy(model_mesh));
  golden_free(&g);
}

static void case_golden(void) { run_golden(0); }
static void case_golden_fsdp(void) { run_golden(1); }

/* AdamW parameter groups: every trainable parameter in exactly one group,
 * per-group hyper-parameters readable and settable (amsgrad fixed). */
static void case_groups(void) {
  golden g;
  WOK(golden_load("gpt2_tiny", &g));
  weft_gpt2_config cfg = gpt2_config(&g);
  int one = 1;
  const char *mn[1] = {"tp"};
  weft_mesh *mesh = NULL;
  WOK(weft_mesh_create_from_comm(MPI_COMM_SELF, 1, &one, mn, &mesh));
  weft_module *model = NULL;
  WOK(weft_gpt2_create(&cfg, mesh, &model));
  WOK(weft_module_init_weights(model, 7));
  weft_param *ps[256];
  int np = 0;
  WOK(weft_module_parameters(model, ps, 256, &np));
  weft_adamw_params hp = WEFT_ADAMW_DEFAULT;
  weft_optimizer *opt = NULL;
  /* one parameter left out */
  weft_adamw_group g1[1] = {{ps + 1, np - 1, hp}};
  WCHECK(weft_adamw_create_groups(model, g1, 1, &opt) == WEFT_ERR_INVALID && !opt,
         "a parameter in no group was accepted");
  WCHECK(strstr(weft_last_error(), ps[0]->fqn), "error does not name '%s': %s", ps[0]->fqn,
         weft_last_error());
  /* one parameter in two groups */
  weft_adamw_group g2[2] = {{ps, np, hp}, {ps, 1, hp}};
  WCHECK(weft_adamw_create_groups(model, g2, 2, &opt) == WEFT_ERR_INVALID && !opt,
         "a parameter in two groups was accepted");
  /* a parameter of another model */
  weft_module *other = NULL;
  WOK(weft_gpt2_create(&cfg, mesh, &other));
  WOK(weft_module_init_weights(other, 7));
  weft_param *foreign = NULL;
  WOK(weft_module_find_param(other, "transformer.ln_f.bias", &foreign));
  weft_adamw_group g3[2] = {{ps, np, hp}, {&foreign, 1, hp}};
  WCHECK(weft_adamw_create_groups(model, g3, 2, &opt) == WEFT_ERR_INVALID && !opt,
         "a foreign parameter was accepted");
  /* bad hyper-parameters name the group */
  weft_adamw_group g4[2] = {{ps, np - 1, hp}, {ps + np - 1, 1, hp}};
  g4[1].hp.beta1 = 1.5f;
  WCHECK(weft_adamw_create_groups(model, g4, 2, &opt) == WEFT_ERR_INVALID && !opt,
         "beta1 1.5 accepted");
  WCHECK(strstr(weft_last_error(), "group 1"), "error does not name the group: %s",
         weft_last_error());
  /* a good split: get, set, amsgrad fixed, set_lr reaches every group */
  g4[1].hp = hp;
  g4[1].hp.weight_decay = 0.0f;
  g4[1].hp.lr = 5e-4f;
  WOK(weft_adamw_create_groups(model, g4, 2, &opt));
  WCHECK(weft_optimizer_num_groups(opt) == 2, "groups %d", weft_optimizer_num_groups(opt));
  weft_adamw_params got;
  WOK(weft_optimizer_group_get(opt, 1, &got));
  WCHECK(got.lr == 5e-4f && got.weight_decay == 0.0f, "group 1 reads lr %g wd %g",
         (double)got.lr, (double)got.weight_decay);
  got.beta2 = 0.95f;
  WOK(weft_optimizer_group_set(opt, 1, &got));
  weft_adamw_params again;
  WOK(weft_optimizer_group_get(opt, 1, &again));
  WCHECK(again.beta2 == 0.95f, "group_set did not stick");
  got.amsgrad = true;
  WCHECK(weft_optimizer_group_set(opt, 1, &got) == WEFT_ERR_INVALID, "amsgrad changed");
  WCHECK(weft_optimizer_group_get(opt, 2, &got) == WEFT_ERR_INVALID, "group 2 of 2 read");
  weft_optimizer_set_lr(opt, 1e-2f);
  WOK(weft_optimizer_group_get(opt, 0, &got));
  WOK(weft_optimizer_group_get(opt, 1, &again));
  WCHECK(got.lr == 1e-2f && again.lr == 1e-2f, "set_lr: groups at %g and %g", (double)got.lr,
         (double)again.lr);
  weft_optimizer_destroy(opt);
  WOK(weft_module_destroy(other));
  WOK(weft_module_destroy(model));
  WOK(weft_mesh_destroy(mesh));
  golden_free(&g);
}

static const weft_worker_case cases[] = {
    {"golden", case_golden},
    {"golden_fsdp", case_golden_fsdp},
    {"groups", case_groups},
    {0, 0},
};

int main(int argc, char **argv) { return weft_worker_main(argc, argv, cases); }
