/* weft-tour: the README's API tour, compiled so it cannot rot. A 2-D mesh
 * (dp=2 x tp=2 on 4 ranks), the reference model split by TP and sharded by
 * FSDP, a few AdamW steps, and a resharding checkpoint.
 *     mpiexec -n 4 build/examples/weft-tour /tmp/weft-tour-ckpt */
#include <stdio.h>
#include <stdlib.h>
#include "weft.h"

#define TRY(x) do { if ((x) != WEFT_OK) { fprintf(stderr, "%s\n", weft_last_error()); return 1; } } while (0)

int main(int argc, char **argv) {
  TRY(weft_init(&argc, &argv));
  int shape[2] = {2, 2};
  const char *names[2] = {"dp", "tp"};
  weft_mesh *mesh, *dp, *tp_mesh;
  TRY(weft_mesh_create(2, shape, names, &mesh));     /* ranks row-major: [[0,1],[2,3]] */
  TRY(weft_mesh_submesh(mesh, 1, &names[0], &dp));
  TRY(weft_mesh_submesh(mesh, 1, &names[1], &tp_mesh));

  weft_llama_config cfg = WEFT_LLAMA_CONFIG_INIT;
  cfg.dim = 64; cfg.n_layers = 2; cfg.n_heads = 4; cfg.n_kv_heads = 2;
  cfg.ffn_dim = 172; cfg.vocab = 96; cfg.max_seq_len = 16;
  weft_module *model;
  TRY(weft_llama_create(&cfg, tp_mesh, &model));          /* shapes only, no storage yet */
  weft_tp *tp;
  TRY(weft_tp_apply_llama_plan(model, tp_mesh, /*sequence_parallel=*/true,
                               /*loss_parallel=*/true, &tp));
  weft_fsdp_options fo = WEFT_FSDP_OPTIONS_INIT;
  for (int i = 0; i < cfg.n_layers; i++) {                /* FSDP bottom-up: blocks ... */
    char fqn[32]; snprintf(fqn, sizeof fqn, "layers.%d", i);
    weft_module *block; TRY(weft_module_find(model, fqn, &block));
    TRY(weft_fully_shard(block, dp, &fo, NULL));
  }
  weft_module *last[2];                                    /* ... then [norm, output] ... */
  TRY(weft_module_find(model, "norm", &last[0]));
  TRY(weft_module_find(model, "output", &last[1]));
  TRY(weft_fully_shard_modules(last, 2, dp, &fo, NULL));
  TRY(weft_fully_shard(model, dp, &fo, NULL));             /* ... then the root */
  TRY(weft_module_init_weights(model, 1234));              /* local shards only, mesh-independent */

  weft_adamw_params hp = WEFT_ADAMW_DEFAULT;
  weft_optimizer *opt;
  TRY(weft_adamw_create(model, &hp, &opt));                /* after sharding: steps the shards */
  int64_t tshape[2] = {2, 16};                             /* this dp rank's micro-batch */
  weft_tensor *tokens, *targets;
  TRY(weft_tensor_create(WEFT_I32, WEFT_CPU, 2, tshape, &tokens));
  TRY(weft_tensor_create(WEFT_I32, WEFT_CPU, 2, tshape, &targets));
  int dp_rank = weft_mesh_coord(mesh, 0);
  for (int i = 0; i < 32; i++) {                           /* dp ranks see different data */
    ((int32_t *)tokens->data)[i] = (i * 7 + dp_rank * 3) % 96;
    ((int32_t *)targets->data)[i] = (i * 7 + dp_rank * 3 + 1) % 96;
  }
  for (int step = 0; step < 3; step++) {
    double loss, norm;
    TRY(weft_llama_forward(model, tokens, targets, &loss));
    TRY(weft_llama_backward(model));                       /* grads reduce-scattered over dp */
    TRY(weft_clip_grad_norm(model, 1.0, &norm));           /* the single-rank norm everywhere */
    TRY(weft_optimizer_step(opt));
    TRY(weft_module_zero_grad(model, false));
    if (weft_world_rank() == 0) printf("step %d loss %.4f grad norm %.4f\n", step, loss, norm);
  }

  weft_state_dict *sd;                                     /* checkpoint: each rank its shards */
  TRY(weft_state_dict_create(&sd));
  weft_state_dict_opts so = WEFT_STATE_DICT_OPTS_INIT;
  TRY(weft_get_model_state_dict(model, &so, sd));
  TRY(weft_get_optimizer_state_dict(model, opt, &so, sd));
  TRY(weft_dcp_save(sd, argc > 1 ? argv[1] : "weft-tour-ckpt", NULL));  /* loads on any mesh */
  if (weft_world_rank() == 0) printf("saved checkpoint\n");

  weft_state_dict_destroy(sd);
  weft_tensor_destroy(tokens); weft_tensor_destroy(targets);
  weft_optimizer_destroy(opt);
  weft_fsdp_destroy_all(model);                            /* FSDP, then TP, then the model */
  weft_tp_destroy(tp);
  weft_module_destroy(model);
  weft_mesh_destroy(tp_mesh); weft_mesh_destroy(dp); weft_mesh_destroy(mesh);
  weft_finalize();
  return 0;
}
