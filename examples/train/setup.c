/* examples/train/setup.c — everything a run builds before its first step,
 * in order: the mesh layout from --mesh (dp_replicate, dp_shard, tp; tp
 * innermost in world-rank order, or outermost with --tp-across-nodes;
 * --tp-inside-node checks the nodes) checked against the world size and
 * the model, the data, the
 * meshes (the root, its dp sub-mesh, the model's tp mesh), the model (its
 * shapes, then TP placements, then FSDP on the dp dims, then its weights)
 * and the optimizer; and teardown, which frees them in reverse. Collective
 * over the world: every rank builds the same things. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"
#include "train_internal.h"

/* The root mesh's dims from --mesh (default: dp = the world). HSDP needs a
 * (replicate, shard) pair: a dp_shard dim of 1 is added when absent. */
static int layout_mesh(run_state *s) {
  const train_mesh_spec *m = &s->o->mesh;
  int nd = 0;
  if (!m->given) {
    s->shape[nd] = s->world;
    s->names[nd++] = "dp";
    s->ndp = 1;
  } else {
    if (m->dp_replicate) {
      s->shape[nd] = m->dp_replicate;
      s->names[nd++] = "dp_replicate";
      s->shape[nd] = m->dp_shard ? m->dp_shard : 1;
      s->names[nd++] = "dp_shard";
    } else if (m->dp_shard) {
      s->shape[nd] = m->dp_shard;
      s->names[nd++] = "dp";
    }
    s->ndp = nd;
    if (m->tp) {
      s->shape[nd] = m->tp;
      s->names[nd++] = "tp";
    }
  }
  s->ndim = nd;
  int64_t prod = 1;
  char desc[256] = "";
  for (int d = 0; d < nd; d++) {
    prod *= s->shape[d];
    size_t l = strlen(desc);
    snprintf(desc + l, sizeof desc - l, "%s%s=%d", d ? "," : "", s->names[d], s->shape[d]);
  }
  if (prod != s->world)
    return train_fail_all("--mesh %s needs %lld ranks but the world has %d (mpiexec -n %d)", desc,
                          (long long)prod, s->world, s->world);
  s->tp_size = m->tp ? m->tp : 1;
  s->dp_total = (int)(prod / s->tp_size);
  return 0;
}

/* The options against the mesh (found alike on every rank). */
static int check_fit(const run_state *s) {
  const train_opts *o = s->o;
  const weft_llama_config *c = &s->cfg;
  if (o->gpt2 && !o->loss_parallel)
    return train_fail_all(
        "--no-loss-parallel: GPT-2's tied lm_head always makes vocab-sharded logits "
        "under TP (its loss is loss parallel)");
  if (s->tp_size > 1) {
    if (c->n_heads % s->tp_size || c->n_kv_heads % s->tp_size)
      return train_fail_all("model: heads %lld and kv-heads %lld must be divisible by tp=%d",
                            (long long)c->n_heads, (long long)c->n_kv_heads, s->tp_size);
    if (o->sequence_parallel && c->max_seq_len % s->tp_size)
      return train_fail_all("--sequence-parallel: seq-len %lld must be divisible by tp=%d",
                            (long long)c->max_seq_len, s->tp_size);
  }
  if (o->batch % s->dp_total)
    return train_fail_all("--batch %lld must be divisible by the data-parallel size %d",
                          (long long)o->batch, s->dp_total);
  if (o->bf16 && !s->ndp)
    return train_fail_all(
        "--dtype bf16: bf16 is FSDP's mixed precision and needs a dp dim (dp=1 will do: one "
        "rank's FSDP group keeps f32 master weights and bf16 unsharded parameters)");
  if (o->cpu_offload && s->dp_total < 2)
    return train_fail_all(
        "--cpu-offload: offloading is FSDP's (its sharded state) and needs a dp dim > 1");
  if (o->reshard_after_forward >= 2 && s->ndp &&
      o->reshard_after_forward != WEFT_FSDP_RESHARD_DEFAULT &&
      s->shape[s->ndp - 1] % o->reshard_after_forward)
    return train_fail_all("--reshard-after-forward=%d must divide the dp shard size %d",
                          o->reshard_after_forward, s->shape[s->ndp - 1]);
  return 0;
}

/* --tp-inside-node: with the default layout (tp innermost) a tp group is
 * tp consecutive world ranks; it lies on one node when tp divides the
 * ranks per node, every node holds as many ranks and ranks are placed node
 * by node. Checked from one all-gather of (node index, local size) of
 * every rank, so every rank finds the same verdict (rank 0 prints it).
 * Collective over the world. */
static int check_tp_inside_node(const run_state *s) {
  int n = s->world, tp = s->tp_size;
  int mine[2] = {weft_node_index(), weft_local_size()};
  int *all = malloc(sizeof(int) * 2 * (size_t)n);
  int nodes = weft_node_count();
  int *count = calloc((size_t)nodes, sizeof *count);
  if (train_agree_fail(!all || !count, "--tp-inside-node: out of memory")) {
    free(all);
    free(count);
    return 2;
  }
  MPI_Request req;
  weft_status st = WEFT_OK;
  if (MPI_Iallgather(mine, 2, MPI_INT, all, 2, MPI_INT, MPI_COMM_WORLD, &req) != MPI_SUCCESS)
    st = weft_error(WEFT_ERR_MPI, "MPI_Iallgather failed");
  else
    st = weft_wait_requests(1, &req, "--tp-inside-node: gathering the nodes");
  if (st != WEFT_OK) {
    free(all);
    free(count);
    return train_fail_here("--tp-inside-node");
  }
  char msg[512] = "";
  for (int r = 0; r < n; r++)
    if (all[2 * r] >= 0 && all[2 * r] < nodes) count[all[2 * r]]++;
  bool equal = true;
  for (int k = 1; k < nodes; k++) equal = equal && count[k] == count[0];
  if (!equal) {
    int len =
        snprintf(msg, sizeof msg, "--tp-inside-node: nodes hold different numbers of ranks (");
    for (int k = 0; k < nodes && len < (int)sizeof msg - 32; k++)
      len += snprintf(msg + len, sizeof msg - (size_t)len, "%snode %d: %d", k ? ", " : "", k,
                      count[k]);
    snprintf(msg + len, sizeof msg - (size_t)len, ")");
  }
  for (int r = 0; !msg[0] && r < n; r++)
    if (all[2 * r + 1] % tp)
      snprintf(msg, sizeof msg, "--tp-inside-node: tp=%d does not divide the %d ranks per node", tp,
               all[2 * r + 1]);
  for (int r = 0; !msg[0] && r < n; r++)
    if (all[2 * r] != all[2 * (r - r % tp)])
      snprintf(msg, sizeof msg,
               "--tp-inside-node: the tp group of world ranks %d..%d spans nodes %d and %d (ranks "
               "are not placed node by node)",
               r - r % tp, r - r % tp + tp - 1, all[2 * (r - r % tp)], all[2 * r]);
  free(all);
  free(count);
  if (msg[0]) return train_fail_all("%s", msg);
  return 0;
}

/* The root mesh: tp innermost in world-rank order (weft_mesh_create), or
 * outermost with --tp-across-nodes (order tp, then the dp dims). */
static weft_status make_root(run_state *s) {
  if (!s->o->mesh.tp_across_nodes) {
    WEFT_CHECK(weft_mesh_create(s->ndim, s->shape, s->names, &s->root));
    return WEFT_OK;
  }
  int order[TRAIN_MAX_DIMS], k = 0;
  order[k++] = s->ndim - 1; /* tp is the last dim (check_options: tp is given) */
  for (int d = 0; d < s->ndim - 1; d++) order[k++] = d;
  WEFT_CHECK(weft_mesh_create_ordered(s->ndim, s->shape, s->names, order, &s->root));
  return WEFT_OK;
}

/* Under the root mesh: its dp sub-mesh and the model's tp mesh (a 1-rank
 * mesh of its own without tp); this rank's index among the dp ranks. */
static weft_status make_meshes(run_state *s) {
  if (s->ndp) WEFT_CHECK(weft_mesh_submesh(s->root, s->ndp, s->names, &s->dp));
  if (s->o->mesh.tp) {
    WEFT_CHECK(weft_mesh_submesh(s->root, 1, &s->names[s->ndp], &s->model_mesh));
  } else {
    int one = 1;
    const char *tn[1] = {"tp"};
    WEFT_CHECK(weft_mesh_create_from_comm(MPI_COMM_SELF, 1, &one, tn, &s->model_mesh));
    if (s->o->cuda) WEFT_CHECK(weft_mesh_set_device(s->model_mesh, WEFT_CUDA));
  }
  if (s->ndp == 2)
    s->dp_index = weft_mesh_coord(s->dp, 0) * s->shape[1] + weft_mesh_coord(s->dp, 1);
  else if (s->ndp == 1)
    s->dp_index = weft_mesh_coord(s->dp, 0);
  return WEFT_OK;
}

/* The model's shapes (no storage yet), then its TP plan on the tp mesh. */
static weft_status make_model(run_state *s) {
  const train_opts *o = s->o;
  if (o->gpt2) {
    weft_gpt2_config g = train_gpt2_config(o);
    WEFT_CHECK(weft_gpt2_create(&g, s->model_mesh, &s->model));
  } else {
    WEFT_CHECK(weft_llama_ops_create(&s->cfg, s->model_mesh, &s->model));
  }
  WEFT_CHECK(weft_graph_create(&s->graph));
  weft_graph_set_seed(s->graph, o->seed);
  /* dropout masks of the global batch: this rank's rows are its slice */
  WEFT_CHECK(weft_graph_set_batch_slice(s->graph, (int64_t)s->dp_index * (o->batch / s->dp_total),
                                        o->batch));
  if (s->tp_size > 1 && o->gpt2)
    WEFT_CHECK(weft_gpt2_apply_tp(s->model, s->model_mesh, o->sequence_parallel, &s->tp));
  else if (s->tp_size > 1)
    WEFT_CHECK(weft_llama_ops_parallelize(s->model, s->model_mesh, o->sequence_parallel,
                                          o->loss_parallel, &s->tp));
  return WEFT_OK;
}

/* The per-rank peak MFU is measured against: --peak-tflops; else, on the
 * device, the dense bf16 tensor-core peak of a known GPU model (NVIDIA's
 * datasheets); else the CPU default, which on a GPU the summary flags. */
static void choose_peak(run_state *s) {
  const train_opts *o = s->o;
  s->peak_flops = o->peak_flops;
  snprintf(s->peak_why, sizeof s->peak_why, "%s",
           o->peak_given ? "--peak-tflops" : "the CPU default; --peak-tflops sets it");
  if (o->peak_given || !o->cuda) return;
  static const struct {
    const char *name; /* a substring of the model name */
    double tflops;
  } known[] = {{"H200", 989.4}, {"GH200", 989.4}, {"H100 PCIe", 756.0}, {"H100 NVL", 835.0},
               {"H100", 989.4}, {"A100", 312.0},  {"L40S", 362.1},      {NULL, 0}};
  char model[128];
  if (weft_device_model(WEFT_CUDA, model, sizeof model) != WEFT_OK) {
    snprintf(s->peak_why, sizeof s->peak_why, "no GPU model known; --peak-tflops sets it");
    return;
  }
  for (int i = 0; known[i].name; i++)
    if (strstr(model, known[i].name)) {
      s->peak_flops = known[i].tflops * 1e12;
      snprintf(s->peak_why, sizeof s->peak_why, "%.100s dense bf16", model);
      return;
    }
  snprintf(s->peak_why, sizeof s->peak_why, "no peak known for '%.80s'; --peak-tflops sets it",
           model);
}

/* FSDP on the dp dims: one group per block, the Llama's [norm, output]
 * together, the rest in the root group. */
static weft_status shard_model(run_state *s) {
  const train_opts *o = s->o;
  weft_fsdp_options blk = WEFT_FSDP_OPTIONS_INIT, rootopt = WEFT_FSDP_OPTIONS_INIT;
  blk.reshard_after_forward = o->reshard_after_forward;
  blk.offload_params = rootopt.offload_params = o->cpu_offload;
  if (o->bf16) {
    blk.mp.param_dtype = WEFT_BF16;
    blk.mp.reduce_dtype = WEFT_F32;
    rootopt.mp = blk.mp;
  }
  for (int64_t i = 0; i < s->cfg.n_layers; i++) {
    char name[32];
    weft_module *b = NULL;
    snprintf(name, sizeof name, o->gpt2 ? "transformer.h.%lld" : "layers.%lld", (long long)i);
    WEFT_CHECK(weft_module_find(s->model, name, &b));
    WEFT_CHECK(weft_fully_shard(b, s->dp, &blk, NULL));
  }
  if (!o->gpt2) { /* GPT-2: ln_f and the tied wte / lm_head stay in the root group */
    weft_module *last[2];
    WEFT_CHECK(weft_module_find(s->model, "norm", &last[0]));
    WEFT_CHECK(weft_module_find(s->model, "output", &last[1]));
    WEFT_CHECK(weft_fully_shard_modules(last, 2, s->dp, &blk, NULL));
  }
  WEFT_CHECK(weft_fully_shard(s->model, s->dp, &rootopt, &s->root_fsdp));
  return WEFT_OK;
}

static weft_status make_optimizer(run_state *s) {
  weft_adamw_params hp = WEFT_ADAMW_DEFAULT;
  hp.lr = (float)s->o->lr;
  hp.weight_decay = (float)s->o->weight_decay;
  hp.beta1 = (float)s->o->beta1;
  hp.beta2 = (float)s->o->beta2;
  hp.eps = (float)s->o->eps;
  if (s->o->gpt2)
    WEFT_CHECK(weft_gpt2_adamw_create(s->model, &hp, &s->opt));
  else
    WEFT_CHECK(weft_adamw_create(s->model, &hp, &s->opt));
  if (s->root_fsdp) weft_fsdp_memory_track(s->opt);
  return WEFT_OK;
}

/* --init-from: weights from a safetensors file (train_import_weights). */
static int import_weights(run_state *s) {
  char why[1024];
  bool hf = false;
  if (train_import_weights(s->model, s->o->init_from, s->o->gpt2, &s->cfg, &hf, why, sizeof why) ==
      WEFT_OK)
    return 0;
  return train_fail_all("--init-from %s%s: %s", s->o->init_from,
                        hf ? " (transformers' layout)" : "", why);
}

/* Library errors here come from arguments every rank passes alike: rank 0
 * prints. */
static int fail_setup(void) { return train_fail_all("%s", weft_last_error()); }

int train_setup(run_state *s, train_result *res) {
  const train_opts *o = s->o;
  char err[1024] = "";
  int rc = layout_mesh(s);
  if (!rc) rc = check_fit(s);
  if (!rc && o->mesh.tp_inside_node) rc = check_tp_inside_node(s);
  if (rc) return rc;
  /* every rank opens the files; failures agreed */
  int bad = train_data_open(o, s->cfg.vocab, s->cfg.max_seq_len, s->rank, s->world, &s->data, err,
                            sizeof err);
  if (train_agree_fail(bad != 0, err)) return 2;
  /* agreed: a failure may be one rank's */
  weft_status st = make_root(s);
  if (train_agree_fail(st != WEFT_OK, weft_last_error())) return 2;
  /* --device cuda: the root mesh on the GPU of this rank's node-local rank
   * (collective: a rank without one fails every rank, in one line) */
  if (o->cuda && weft_mesh_set_device(s->root, WEFT_CUDA) != WEFT_OK) {
    char why[512];
    snprintf(why, sizeof why, "--device cuda: %s", weft_last_error());
    why[strcspn(why, "\n")] = '\0';
    return train_fail_all("%s", why);
  }
  if (o->matmul != WEFT_MATMUL_F32 && !o->cuda)
    return train_fail_all("--matmul %s: needs --device cuda (the CPU computes in fp32)",
                          o->matmul == WEFT_MATMUL_TF32 ? "tf32" : "bf16");
  if (o->cuda && weft_device_set_matmul_precision(WEFT_CUDA, (weft_matmul_precision)o->matmul))
    return train_fail_all("--matmul: %s", weft_last_error());
  if (o->predict && !o->cuda)
    return train_fail_all("--predict: needs --device cuda (it models the device path)");
  weft_device_cost_model_set(o->predict);
  choose_peak(s);
  st = make_meshes(s);
  if (st == WEFT_OK) st = make_model(s);
  /* FSDP over the dp ranks; with --dtype bf16 also over a single one (its
   * mixed precision: bf16 unsharded parameters, f32 master weights) */
  if (st == WEFT_OK && (s->dp_total > 1 || (o->bf16 && s->ndp))) st = shard_model(s);
  if (st == WEFT_OK) st = weft_module_init_weights(s->model, o->seed);
  if (st != WEFT_OK) return fail_setup();
  if (o->init_from && (rc = import_weights(s))) return rc;
  if (make_optimizer(s) != WEFT_OK) return fail_setup();
  if (res) {
    res->ndim = s->ndim;
    for (int d = 0; d < s->ndim; d++) {
      snprintf(res->dim_names[d], sizeof res->dim_names[d], "%s", s->names[d]);
      res->dim_sizes[d] = s->shape[d];
    }
  }
  return 0;
}

weft_status train_teardown(run_state *s) {
  weft_status first = WEFT_OK, st;
#define KEEP(expr) ((st = (expr)) != WEFT_OK && first == WEFT_OK ? (void)(first = st) : (void)0)
  if (s->pending_save) KEEP(weft_dcp_async_wait(s->pending_save));
  s->pending_save = NULL;
  if (s->root_fsdp || s->dp_total > 1) weft_fsdp_memory_track(NULL);
  weft_optimizer_destroy(s->opt);
  weft_graph_destroy(s->graph);
  weft_dtensor_destroy(s->ids);
  weft_dtensor_destroy(s->targets);
  if (s->model) KEEP(weft_fsdp_destroy_all(s->model));
  weft_tp_destroy(s->tp);
  KEEP(weft_module_destroy(s->model));
  KEEP(weft_mesh_destroy(s->model_mesh));
  KEEP(weft_mesh_destroy(s->dp));
  KEEP(weft_mesh_destroy(s->root));
#undef KEEP
  train_data_close(&s->data);
  if (s->json && fclose(s->json) != 0) s->json_failed = true;
  s->json = NULL;
  return first;
}
