/* tests/models/llama_worker.c — MPI worker cases for models/llama (the
 * Llama written with ops; started by test_llama.c under mpiexec):
 *   golden          1 rank: PyTorch float64 golden parity (tiny_mha,
 *                   tiny_gqa) of loss, gradients, grad norm and one AdamW
 *                   step; FQNs, shapes, order and init as the built-in
 *                   model's; argument errors
 *   golden_tp       2 ranks, tp = 2: the same golden parity under
 *                   torchtitan's plan (plain, loss parallel, sequence +
 *                   loss parallel); a plan on heads tp does not divide
 *   golden_fsdp_tp  4 ranks, dp = 2 x tp = 2: FSDP per block and root over
 *                   dp, TP over tp, each dp rank half the batch
 *   builtin         1 rank: the same seed gives both models the same
 *                   weights, and three training steps the same losses,
 *                   grads and weights as the built-in weft_llama_*
 *   bench [cfg] [steps] [ops|builtin]  1 rank: step time (forward,
 *                   backward, clip, AdamW, zero_grad) of the built-in and
 *                   the op-based model on one config, alternated step by
 *                   step (or one of them only); cfg "golden" (default),
 *                   "tiny" or "small" (bench/step.c's); not in the suite
 *
 * Device mode (WEFT_TEST_DEVICE=cuda, worker.h): every root mesh is
 * put on WEFT_CUDA, so the models train there; the comparisons read host
 * copies. Unset, everything stays on the CPU.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "autograd.h"
#include "dcp.h"
#include "fsdp.h"
#include "golden.h"
#include "llama.h"
#include "model_device.h"
#include "tp.h"
#include "worker.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static weft_placement reps[WEFT_MESH_MAX_DIMS];

static weft_mesh *mesh_self(void) {
  int one = 1;
  const char *names[1] = {"tp"};
  weft_mesh *m = NULL;
  WOK(weft_mesh_create_from_comm(MPI_COMM_SELF, 1, &one, names, &m));
  return weft_worker_mesh_on_device(m);
}

/* The meshes of a run: mode 0 a 1-rank model mesh; mode 1 tp over the
 * world; mode 2 (dp, tp) = (world / 2, 2) with the model on tp. */
typedef struct meshes {
  weft_mesh *root, *dp, *tp;
  int dp_size, dp_index;
} meshes;

static bool meshes_make(meshes *m, int mode) {
  memset(m, 0, sizeof *m);
  int world = weft_world_size();
  m->dp_size = 1;
  if (mode == 0) {
    m->tp = mesh_self();
    return m->tp != NULL;
  }
  if (mode == 1) {
    const char *n[1] = {"tp"};
    WOK(weft_mesh_create(1, &world, n, &m->tp));
    return weft_worker_mesh_on_device(m->tp) != NULL;
  }
  int shape[2] = {world / 2, 2};
  const char *names[2] = {"dp", "tp"};
  WOK(weft_mesh_create(2, shape, names, &m->root));
  if (!weft_worker_mesh_on_device(m->root)) return false;
  WOK(weft_mesh_submesh(m->root, 1, &names[0], &m->dp));
  WOK(weft_mesh_submesh(m->root, 1, &names[1], &m->tp));
  if (!m->dp || !m->tp) return false;
  m->dp_size = shape[0];
  m->dp_index = weft_mesh_coord(m->dp, 0);
  return true;
}

static void meshes_free(meshes *m) {
  WOK(weft_mesh_destroy(m->tp));
  WOK(weft_mesh_destroy(m->dp));
  WOK(weft_mesh_destroy(m->root));
}

/* ---------------------------------------------------------------- golden */

/* FSDP as torchtitan applies it: one group per block, then the root
 * (norm, output, tok_embeddings). */
static void shard(weft_module *model, weft_mesh *dp) {
  weft_module *layers = NULL;
  WOK(weft_module_find(model, "layers", &layers));
  if (!layers) return;
  for (int i = 0; i < weft_module_num_children(layers); i++)
    WOK(weft_fully_shard(weft_module_child(layers, i), dp, NULL, NULL));
  WOK(weft_fully_shard(model, dp, NULL, NULL));
}

/* Records the tp-dim placement of the tensor a hook sees. */
typedef struct seen {
  weft_placement p;
  int hits;
} seen;

static weft_status record(weft_module *m, weft_hook_kind kind, const weft_dtensor *t,
                          weft_dtensor **replace, void *ctx) {
  (void)m, (void)kind, (void)replace;
  seen *s = ctx;
  s->p = weft_dtensor_placements(t)[weft_dtensor_get_spec(t)->mesh_ndim - 1];
  s->hits++;
  return WEFT_OK;
}

static bool is_shard(weft_placement p, int dim) {
  return p.kind == WEFT_PLACE_SHARD && p.dim == dim;
}

/* mode: 0 one rank, 1 tp over the world, 2 dp x tp (FSDP x TP); sp, lp:
 * sequence / loss parallel in the TP plan (modes 1 and 2). */
/* Hugging Face weights (models/llama/hf.c): with hf_mode, run_golden
 * loads <golden>/init_hf.safetensors (transformers' layout, q/k rows
 * permuted for rotate_half, inv_freq buffers; written and checked by
 * tests/data/golden/make_llama_hf.py) converted on rank 0, and, before the
 * optimizer step, exports the model and converts it back: every tensor
 * but the buffers must equal the HF file's bit for bit. */
static bool hf_mode;
static char hf_dir[64];

static void hf_path_of(const golden *g, char *path, size_t cap) {
  golden_path(g, "init_hf.safetensors", path, cap);
}

/* The init file run_golden loads: the golden one, or (hf_mode) the HF
 * file converted into a temporary weft-layout file. */
static void init_file(const golden *g, char *path, size_t cap) {
  if (!hf_mode) {
    golden_path(g, "init.safetensors", path, cap);
    return;
  }
  char hf[700];
  hf_path_of(g, hf, sizeof hf);
  bool is_hf = false;
  WOK(weft_llama_file_is_hf(hf, &is_hf));
  WCHECK(is_hf, "init_hf.safetensors not taken for transformers' layout");
  snprintf(hf_dir, sizeof hf_dir, "/tmp/weft-llama-hf-XXXXXX");
  if (weft_worker_rank == 0) WREQUIRE(mkdtemp(hf_dir), "mkdtemp");
  MPI_Bcast(hf_dir, sizeof hf_dir, MPI_CHAR, 0, MPI_COMM_WORLD);
  snprintf(path, cap, "%s/weft.safetensors", hf_dir);
  if (weft_worker_rank == 0) WOK(weft_llama_hf_to_weft(hf, path, &g->cfg));
  MPI_Barrier(MPI_COMM_WORLD);
  WOK(weft_llama_file_is_hf(path, &is_hf));
  WCHECK(!is_hf, "the converted file is still taken for transformers' layout");
}

static void hf_roundtrip(weft_module *model, const golden *g, const char *name) {
  char hf[700], out[128], back[128], conv[128];
  hf_path_of(g, hf, sizeof hf);
  snprintf(out, sizeof out, "%s/export.safetensors", hf_dir);
  snprintf(back, sizeof back, "%s/hf.safetensors", hf_dir);
  snprintf(conv, sizeof conv, "%s/weft.safetensors", hf_dir);
  WOK(weft_safetensors_export_model(model, out, WEFT_F32));
  if (weft_worker_rank == 0) {
    WOK(weft_llama_weft_to_hf(out, back, &g->cfg));
    int64_t same = 0, buffers = 0, nb = 0;
    char first[256];
    WOK(golden_same_params(hf, back, &same, &buffers, &nb, first, sizeof first));
    WCHECK(buffers == g->cfg.n_layers, "%s: %lld inv_freq buffers", name, (long long)buffers);
    WCHECK(!first[0], "%s: '%s' is missing or differs after export", name, first);
    WCHECK(same == nb, "%s: %lld tensors back bit for bit, the export has %lld", name,
           (long long)same, (long long)nb);
    /* a config whose heads do not split q_proj: named, nothing written */
    weft_llama_config bad = g->cfg;
    bad.n_heads = 3;
    weft_status st = weft_llama_hf_to_weft(hf, conv, &bad);
    WCHECK(st == WEFT_ERR_INVALID && strstr(weft_last_error(), "q_proj") &&
               strstr(weft_last_error(), "3 heads"),
           "%s: q_proj over 3 heads: %s", name, weft_last_error());
    weft_clear_error();
    remove(conv);
    remove(out);
    remove(back);
    rmdir(hf_dir);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

static void run_golden(const char *name, int mode, bool sp, bool lp) {
  golden g;
  WOK(golden_load(name, &g));
  meshes ms;
  WREQUIRE(meshes_make(&ms, mode), "meshes");
  int rank = weft_worker_rank, world = weft_world_size();
  weft_module *model = NULL;
  WOK(weft_llama_ops_create(&g.cfg, ms.tp, &model));
  WREQUIRE(model, "no model");
  weft_tp *tp = NULL;
  if (mode > 0) WOK(weft_llama_ops_parallelize(model, ms.tp, sp, lp, &tp));
  /* what the plan does to the activations: the residual stream leaves the
   * embedding and block 0 sequence-sharded with sp (the block itself has
   * no hooks: its adds keep S(1)), replicated without; wo computes on
   * heads split over tp (S(2) of (B, T, H hd)) */
  static seen emb_out, blk_out, wo_in;
  memset(&emb_out, 0, sizeof emb_out), memset(&blk_out, 0, sizeof blk_out);
  memset(&wo_in, 0, sizeof wo_in);
  weft_module *hm = NULL;
  WOK(weft_module_find(model, "tok_embeddings", &hm));
  if (hm) WOK(weft_module_register_hook(hm, WEFT_HOOK_POST_FORWARD, record, &emb_out, NULL));
  WOK(weft_module_find(model, "layers.0", &hm));
  if (hm) WOK(weft_module_register_hook(hm, WEFT_HOOK_POST_FORWARD, record, &blk_out, NULL));
  WOK(weft_module_find(model, "layers.0.attention.wo", &hm));
  if (hm) WOK(weft_module_register_hook(hm, WEFT_HOOK_PRE_FORWARD, record, &wo_in, NULL));
  weft_param *wq = NULL;
  WOK(weft_module_find_param(model, "layers.0.attention.wq.weight", &wq));
  WREQUIRE(wq, "no wq");
  WCHECK(mode == 0 ? wq->spec.placements[0].kind == WEFT_PLACE_REPLICATE
                   : is_shard(wq->spec.placements[0], 0),
         "%s mode %d: wq.weight not %s", name, mode, mode ? "Shard(0) (colwise)" : "Replicate");
  char path[700];
  init_file(&g, path, sizeof path);
  WOK(load_params(model, path));
  if (mode == 2) {
    shard(model, ms.dp);
    /* outside forward the data is the dp shard of the tp shard: norm
     * (S(0) over dp, R over tp), wq (dp splits each tp shard of dim 0) */
    weft_param *nw = NULL;
    WOK(weft_module_find_param(model, "norm.weight", &nw));
    WREQUIRE(nw && nw->data && wq->data, "no data");
    const weft_dtensor_spec *a = weft_dtensor_get_spec(nw->data),
                            *b = weft_dtensor_get_spec(wq->data);
    WCHECK(a->mesh_ndim == 2 && is_shard(a->placements[0], 0) &&
               a->placements[1].kind == WEFT_PLACE_REPLICATE,
           "norm.weight not (S(0), R) on the dp x tp mesh");
    WCHECK(b->mesh_ndim == 2 && b->placements[0].kind == WEFT_PLACE_STRIDED_SHARD &&
               b->placements[0].dim == 0 && is_shard(b->placements[1], 0),
           "wq.weight not (StridedShard(0), S(0)) on the dp x tp mesh");
  }
  int64_t nb = g.B / ms.dp_size, r0 = ms.dp_index * nb;
  WREQUIRE(g.B % ms.dp_size == 0, "batch %lld over dp %d", (long long)g.B, ms.dp_size);
  weft_dtensor *ids = NULL, *tgt = NULL;
  WOK(golden_rows(ms.tp, g.tokens, r0, nb, &ids));
  WOK(golden_rows(ms.tp, g.targets, r0, nb, &tgt));
  weft_graph *gr = NULL;
  WOK(weft_graph_create(&gr));
  weft_var *loss = NULL, *logits = NULL;
  double t0 = now_s();
  WOK(weft_llama_ops_loss(model, gr, ids, tgt, &loss, &logits));
  WREQUIRE(loss && logits, "no loss");
  /* the logits' placement shows the plan took effect */
  const weft_placement *lpl = weft_dtensor_placements(weft_var_value(logits));
  WCHECK(mode == 0 || !lp || (lpl[0].kind == WEFT_PLACE_SHARD && lpl[0].dim == 2),
         "%s mode %d: logits not vocab-sharded under loss parallel", name, mode);
  double lv = weft_var_item(loss);
  WOK(weft_backward(loss));
  double t1 = now_s();
  model_check_params_on_device(model, name);
  WCHECK(emb_out.hits == 1 && blk_out.hits == 1 && wo_in.hits == 1, "hooks ran %d %d %d times",
         emb_out.hits, blk_out.hits, wo_in.hits);
  if (mode > 0) {
    WCHECK(sp ? is_shard(emb_out.p, 1) : emb_out.p.kind == WEFT_PLACE_REPLICATE,
           "%s mode %d sp %d: embedding output placement kind %d dim %d", name, mode, sp,
           (int)emb_out.p.kind, emb_out.p.dim);
    WCHECK(sp ? is_shard(blk_out.p, 1) : blk_out.p.kind == WEFT_PLACE_REPLICATE,
           "%s mode %d sp %d: block output placement kind %d dim %d", name, mode, sp,
           (int)blk_out.p.kind, blk_out.p.dim);
    WCHECK(is_shard(wo_in.p, 2), "%s mode %d: wo input kind %d dim %d (heads not split)", name,
           mode, (int)wo_in.p.kind, wo_in.p.dim);
  }
  if (mode == 2) { /* each dp rank's mean over its rows; the tp ranks agree */
    double sum = 0;
    MPI_Allreduce(&lv, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    lv = sum / world;
  }
  double lerr = fabs(lv - g.loss) / fabs(g.loss);
  WCHECK(lerr < 1e-6, "%s mode %d sp %d lp %d: loss %.9f want %.9f (rel %.3g)", name, mode, sp, lp,
         lv, g.loss, lerr);

  weft_param *ps[256];
  int np = 0;
  WOK(weft_module_parameters(model, ps, 256, &np));
  WREQUIRE(np == 2 + 9 * (int)g.cfg.n_layers + 1, "param count %d", np);
  double worst_g = 0;
  const char *worst_p = "";
  WOK(golden_worst_grad_err(&g, ps, np, &worst_g, &worst_p));
  WCHECK(worst_g < 1e-5, "%s mode %d sp %d lp %d: grad %s rel err %.3g", name, mode, sp, lp,
         worst_p, worst_g);
  if (hf_mode) hf_roundtrip(model, &g, name);
  double norm = 0;
  WOK(weft_clip_grad_norm(model, g.clip, &norm));
  double nerr = fabs(norm - g.grad_norm) / g.grad_norm;
  WCHECK(nerr < 1e-5, "%s mode %d: grad norm %.9f want %.9f", name, mode, norm, g.grad_norm);
  weft_optimizer *opt = NULL;
  WOK(weft_adamw_create(model, &g.hp, &opt));
  WOK(weft_optimizer_step(opt));
  double worst_u = 0;
  const char *worst_up = "";
  WOK(golden_worst_update_err(&g, ps, np, false, &worst_u, &worst_up, NULL, NULL));
  WCHECK(worst_u < 1e-3, "%s mode %d sp %d lp %d: update of %s rel err %.3g", name, mode, sp, lp,
         worst_up, worst_u);
  /* more steps: the loss goes down on the same batch, and from the second
   * step on a one-rank step allocates nothing (the graph reuses buffers) */
  /* (allocations counted on the mesh's device; a loss on a device is read
   * through a full tensor and a host copy, which the count leaves out) */
  weft_device dev = weft_mesh_device(ms.tp);
  int64_t allocs[4] = {0}, item_allocs = 0;
  double l_last = lv;
  for (int s = 0; s < 4; s++) {
    WOK(weft_graph_reset(gr));
    WOK(weft_module_zero_grad(model, false));
    WOK(weft_llama_ops_loss(model, gr, ids, tgt, &loss, NULL));
    int64_t a0 = weft_mem_get(dev).alloc_count;
    l_last = weft_var_item(loss); /* a Replicate loss is read in place */
    if (dev != WEFT_CPU) item_allocs += weft_mem_get(dev).alloc_count - a0;
    WOK(weft_backward(loss));
    WOK(weft_clip_grad_norm(model, g.clip, NULL));
    WOK(weft_optimizer_step(opt));
    allocs[s] = weft_mem_get(dev).alloc_count - item_allocs;
  }
  if (mode == 2) {
    double sum = 0;
    MPI_Allreduce(&l_last, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    l_last = sum / world;
  }
  WCHECK(l_last < lv, "%s mode %d: loss at step 5 %.6f not below %.6f", name, mode, l_last, lv);
  WCHECK(mode != 0 || allocs[3] == allocs[2], "%s: %lld %s allocations in a steady step", name,
         (long long)(allocs[3] - allocs[2]), weft_device_name(dev));
  if (rank == 0)
    printf(
        "llama_ops golden %s mode %d (sp %d, lp %d) ranks %d: loss rel err %.3g, worst grad "
        "rel err %.3g, norm rel err %.3g, worst update rel err %.3g; first fwd+bwd %.2f ms; "
        "loss %.6f at step 1, %.6f at step 5\n",
        name, mode, sp, lp, world, lerr, worst_g, nerr, worst_u, 1e3 * (t1 - t0), lv, l_last);
  weft_optimizer_destroy(opt);
  weft_graph_destroy(gr);
  weft_dtensor_destroy(ids);
  weft_dtensor_destroy(tgt);
  if (mode == 2) WOK(weft_fsdp_destroy_all(model));
  weft_tp_destroy(tp);
  WOK(weft_module_destroy(model));
  meshes_free(&ms);
  golden_free(&g);
}

/* --------------------------------------------------------- bad arguments */

static void expect(weft_status got, weft_status want, const char *needle, const char *what) {
  WCHECK(got == want, "%s: got %s want %s (%s)", what, weft_status_str(got), weft_status_str(want),
         weft_last_error());
  if (needle)
    WCHECK(strstr(weft_last_error(), needle), "%s: error '%s' does not mention '%s'", what,
           weft_last_error(), needle);
}

/* The model's parameters against the built-in model's: the same FQNs in
 * the same order, shapes and init. */
static void check_layout(const weft_llama_config *cfg, weft_mesh *mesh) {
  weft_module *a = NULL, *b = NULL;
  WOK(weft_llama_ops_create(cfg, mesh, &a));
  WOK(weft_llama_create(cfg, mesh, &b));
  weft_param *pa[256], *pb[256];
  int na = 0, nb = 0;
  WOK(weft_module_parameters(a, pa, 256, &na));
  WOK(weft_module_parameters(b, pb, 256, &nb));
  WREQUIRE(na == nb && na <= 256, "params: %d (ops) vs %d (built-in)", na, nb);
  for (int i = 0; i < na; i++) {
    bool same = strcmp(pa[i]->fqn, pb[i]->fqn) == 0 && pa[i]->spec.ndim == pb[i]->spec.ndim &&
                pa[i]->init.kind == pb[i]->init.kind && pa[i]->init.std == pb[i]->init.std &&
                pa[i]->init.mean == pb[i]->init.mean && pa[i]->init.value == pb[i]->init.value;
    for (int d = 0; same && d < pa[i]->spec.ndim; d++)
      same = pa[i]->spec.shape[d] == pb[i]->spec.shape[d];
    WCHECK(same, "param %d: %s vs built-in %s (shape, init)", i, pa[i]->fqn, pb[i]->fqn);
  }
  WCHECK(weft_llama_ops_get_config(a) && !weft_llama_ops_get_config(b),
         "get_config tells the models apart");
  WOK(weft_module_destroy(a));
  WOK(weft_module_destroy(b));
}

static void check_errors(const golden *g, weft_mesh *mesh) {
  weft_llama_config bad = g->cfg;
  weft_module *m = NULL;
  bad.n_kv_heads = 3;
  expect(weft_llama_ops_create(&bad, mesh, &m), WEFT_ERR_INVALID, "n_kv_heads", "kv heads 3");
  WCHECK(!m, "a model from a bad config");
  expect(weft_llama_ops_create(&g->cfg, mesh, NULL), WEFT_ERR_INVALID, "NULL", "NULL out");
  WOK(weft_llama_ops_create(&g->cfg, mesh, &m));
  WOK(weft_module_init_weights(m, 3));
  weft_graph *gr = NULL;
  WOK(weft_graph_create(&gr));
  weft_var *lg = NULL, *loss = NULL;
  /* ids: a float tensor, too long a sequence, an id out of range */
  int64_t s2[2] = {1, 4}, slong[2] = {1, g->cfg.max_seq_len + 1};
  weft_dtensor *f = NULL, *lng = NULL, *oor = NULL, *ok = NULL;
  for (int i = 0; i < weft_mesh_ndim(mesh); i++) reps[i] = weft_replicate();
  WOK(weft_dtensor_zeros(mesh, WEFT_F32, 2, s2, reps, weft_mesh_ndim(mesh), &f));
  WOK(weft_dtensor_zeros(mesh, WEFT_I32, 2, slong, reps, weft_mesh_ndim(mesh), &lng));
  WOK(weft_dtensor_zeros(mesh, WEFT_I32, 2, s2, reps, weft_mesh_ndim(mesh), &oor));
  WOK(weft_dtensor_zeros(mesh, WEFT_I32, 2, s2, reps, weft_mesh_ndim(mesh), &ok));
  if (oor) {
    weft_tensor *l = weft_dtensor_local(oor), *h = NULL;
    if (l->device == WEFT_CPU) {
      ((int32_t *)l->data)[2] = (int32_t)g->cfg.vocab;
    } else { /* on a device mesh: set in a host copy, copied back */
      WOK(weft_tensor_to(l, WEFT_CPU, &h));
      if (h) ((int32_t *)h->data)[2] = (int32_t)g->cfg.vocab;
      if (h) WOK(weft_tensor_copy(l, h));
      weft_tensor_destroy(h);
    }
  }
  expect(weft_llama_ops_logits(m, gr, f, &lg), WEFT_ERR_INVALID, "int32", "float ids");
  expect(weft_llama_ops_logits(m, gr, lng, &lg), WEFT_ERR_INVALID, "max_seq_len", "long ids");
  WCHECK(weft_llama_ops_logits(m, gr, oor, &lg) != WEFT_OK, "an id = V was accepted");
  WCHECK(strstr(weft_last_error(), "96") || strstr(weft_last_error(), "vocab") ||
             strstr(weft_last_error(), "range"),
         "out-of-range id: error does not say which: %s", weft_last_error());
  WOK(weft_graph_reset(gr));
  expect(weft_llama_ops_loss(m, gr, ok, NULL, &loss, NULL), WEFT_ERR_INVALID, "targets",
         "NULL targets");
  expect(weft_llama_ops_logits(NULL, gr, ok, &lg), WEFT_ERR_INVALID, "NULL", "NULL model");
  /* a module that is not the model */
  weft_module *layers = NULL;
  WOK(weft_module_find(m, "layers", &layers));
  expect(weft_llama_ops_logits(layers, gr, ok, &lg), WEFT_ERR_INVALID, "weft_llama_ops_create",
         "not the model");
  weft_tp *tp = NULL;
  expect(weft_llama_ops_parallelize(layers, mesh, false, false, &tp), WEFT_ERR_INVALID,
         "weft_llama_ops_create", "parallelize a block");
  int n = 0;
  expect(weft_llama_ops_tp_plan(false, false, NULL, 4, &n), WEFT_ERR_INVALID, "NULL", "plan");
  WOK(weft_llama_ops_tp_plan(true, true, NULL, 0, &n));
  WCHECK(n == 14, "sp plan has %d entries", n);
  WOK(weft_llama_ops_tp_plan(false, false, NULL, 0, &n));
  WCHECK(n == 9, "plain plan has %d entries", n);
  weft_dtensor_destroy(f);
  weft_dtensor_destroy(lng);
  weft_dtensor_destroy(oor);
  weft_dtensor_destroy(ok);
  weft_graph_destroy(gr);
  WOK(weft_module_destroy(m));
}

static void case_golden(void) {
  run_golden("tiny_mha", 0, false, false);
  run_golden("tiny_gqa", 0, false, false);
  golden g;
  WOK(golden_load("tiny_gqa", &g));
  weft_mesh *mesh = mesh_self();
  check_layout(&g.cfg, mesh);
  weft_llama_config c = g.cfg;
  c.init_std = 0.05f; /* a non-default std reaches every linear and the embedding */
  check_layout(&c, mesh);
  check_errors(&g, mesh);
  WOK(weft_mesh_destroy(mesh));
  golden_free(&g);
}

static void case_golden_tp(void) {
  run_golden("tiny_mha", 1, false, false);
  run_golden("tiny_gqa", 1, false, false);
  run_golden("tiny_gqa", 1, false, true);
  run_golden("tiny_mha", 1, true, true);
  run_golden("tiny_gqa", 1, true, true);
  /* heads tp does not divide: named, nothing changed, on every rank */
  golden g;
  WOK(golden_load("tiny_gqa", &g));
  weft_llama_config c = g.cfg;
  c.n_kv_heads = 1;
  int world = weft_world_size();
  const char *n[1] = {"tp"};
  weft_mesh *tpm = NULL;
  WOK(weft_mesh_create(1, &world, n, &tpm));
  weft_worker_mesh_on_device(tpm);
  weft_module *m = NULL;
  WOK(weft_llama_ops_create(&c, tpm, &m));
  weft_tp *tp = NULL;
  expect(weft_llama_ops_parallelize(m, tpm, true, true, &tp), WEFT_ERR_INVALID, "n_kv_heads",
         "kv heads 1 over tp 2");
  WCHECK(!tp, "a tp state from a failed plan");
  weft_param *wq = NULL;
  WOK(weft_module_find_param(m, "layers.0.attention.wq.weight", &wq));
  WCHECK(wq && wq->spec.placements[0].kind == WEFT_PLACE_REPLICATE, "wq was sharded");
  WOK(weft_module_destroy(m));
  WOK(weft_mesh_destroy(tpm));
  golden_free(&g);
}

static void case_golden_fsdp_tp(void) {
  WREQUIRE(weft_world_size() % 2 == 0, "dp x tp needs an even world");
  run_golden("tiny_gqa", 2, false, false);
  run_golden("tiny_mha", 2, true, true);
  run_golden("tiny_gqa", 2, true, true);
}

/* ----------------------------------------------- against the built-in model */

/* Random tokens and next-token targets (B, T) of `step`. */
static void make_batch(const weft_llama_config *c, int64_t B, int64_t T, int step,
                       weft_tensor **tok, weft_tensor **tgt) {
  int64_t shape[2] = {B, T};
  WOK(weft_tensor_create(WEFT_I32, WEFT_CPU, 2, shape, tok));
  WOK(weft_tensor_create(WEFT_I32, WEFT_CPU, 2, shape, tgt));
  if (!*tok || !*tgt) return;
  int32_t *a = (*tok)->data, *b = (*tgt)->data;
  for (int64_t i = 0; i < B * T; i++) {
    uint64_t k = (uint64_t)step * 1000003ULL + (uint64_t)i;
    a[i] = (int32_t)(weft_test_mix64(k) % (uint64_t)c->vocab);
    b[i] = (int32_t)(weft_test_mix64(k ^ 0x5555555555ULL) % (uint64_t)c->vocab);
  }
}

typedef struct pair {
  weft_mesh *mesh;
  weft_module *ops, *builtin;
  weft_optimizer *opt_ops, *opt_builtin;
  weft_graph *g;
  int np;
  weft_param *pa[512], *pb[512];
} pair;

static bool pair_make(pair *p, const weft_llama_config *cfg, uint64_t seed) {
  memset(p, 0, sizeof *p);
  p->mesh = mesh_self();
  WOK(weft_llama_ops_create(cfg, p->mesh, &p->ops));
  WOK(weft_llama_create(cfg, p->mesh, &p->builtin));
  if (!p->ops || !p->builtin) return false;
  WOK(weft_module_init_weights(p->ops, seed));
  WOK(weft_module_init_weights(p->builtin, seed));
  weft_adamw_params hp = WEFT_ADAMW_DEFAULT;
  hp.lr = 1e-3f;
  hp.weight_decay = 0.1f;
  WOK(weft_adamw_create(p->ops, &hp, &p->opt_ops));
  WOK(weft_adamw_create(p->builtin, &hp, &p->opt_builtin));
  WOK(weft_graph_create(&p->g));
  int nb = 0;
  WOK(weft_module_parameters(p->ops, p->pa, 512, &p->np));
  WOK(weft_module_parameters(p->builtin, p->pb, 512, &nb));
  return p->opt_ops && p->opt_builtin && p->g && p->np == nb && nb <= 512;
}

static void pair_free(pair *p) {
  weft_optimizer_destroy(p->opt_ops);
  weft_optimizer_destroy(p->opt_builtin);
  weft_graph_destroy(p->g);
  WOK(weft_module_destroy(p->ops));
  WOK(weft_module_destroy(p->builtin));
  WOK(weft_mesh_destroy(p->mesh));
}

static double cpu_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Seconds of one step's phases: forward (with the loss), backward, the
 * rest (clip, AdamW, zero_grad, graph reset), and the process CPU time. */
typedef struct phases {
  double fwd, bwd, rest, cpu;
  long faults; /* minor page faults (fresh memory touched) */
} phases;

static long minflt(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_minflt;
}

/* One training step of either model; *loss its loss; *ph (may be NULL)
 * its phase times. */
static void step_builtin(pair *p, const weft_tensor *tok, const weft_tensor *tgt, double *loss,
                         phases *ph) {
  long f0 = minflt();
  double c0 = cpu_s(), t0 = now_s();
  WOK(weft_module_zero_grad(p->builtin, false));
  double t1 = now_s();
  WOK(weft_llama_forward(p->builtin, tok, tgt, loss));
  double t2 = now_s();
  WOK(weft_llama_backward(p->builtin));
  double t3 = now_s();
  WOK(weft_clip_grad_norm(p->builtin, 1.0, NULL));
  WOK(weft_optimizer_step(p->opt_builtin));
  double t4 = now_s();
  if (ph) *ph = (phases){t2 - t1, t3 - t2, (t1 - t0) + (t4 - t3), cpu_s() - c0, minflt() - f0};
}

static void step_ops(pair *p, const weft_dtensor *ids, const weft_dtensor *tgt, double *loss,
                     phases *ph) {
  weft_var *l = NULL;
  long f0 = minflt();
  double c0 = cpu_s(), t0 = now_s();
  WOK(weft_graph_reset(p->g));
  WOK(weft_module_zero_grad(p->ops, false));
  double t1 = now_s();
  WOK(weft_llama_ops_loss(p->ops, p->g, ids, tgt, &l, NULL));
  *loss = l ? weft_var_item(l) : NAN;
  double t2 = now_s();
  WOK(weft_backward(l));
  double t3 = now_s();
  WOK(weft_clip_grad_norm(p->ops, 1.0, NULL));
  WOK(weft_optimizer_step(p->opt_ops));
  double t4 = now_s();
  if (ph) *ph = (phases){t2 - t1, t3 - t2, (t1 - t0) + (t4 - t3), cpu_s() - c0, minflt() - f0};
}

/* worst relative difference over the parameters' data (grads: grad) */
static double worst_diff(pair *p, bool grads) {
  double worst = 0;
  for (int i = 0; i < p->np; i++) {
    const weft_dtensor *a = grads ? p->pa[i]->grad : p->pa[i]->data;
    const weft_dtensor *b = grads ? p->pb[i]->grad : p->pb[i]->data;
    if (!a || !b) return INFINITY;
    weft_tensor *ha = NULL, *hb = NULL;
    const weft_tensor *la = weft_worker_host_copy(weft_dtensor_local(a), &ha),
                      *lb = weft_worker_host_copy(weft_dtensor_local(b), &hb);
    double e =
        la && lb ? weft_test_rel_norm_f32(la->data, lb->data, weft_tensor_numel(lb)) : INFINITY;
    weft_tensor_destroy(ha);
    weft_tensor_destroy(hb);
    if (e > worst) worst = e;
  }
  return worst;
}

static void case_builtin(void) {
  weft_llama_config cfg = WEFT_LLAMA_CONFIG_INIT;
  cfg.dim = 64;
  cfg.n_layers = 3;
  cfg.n_heads = 8;
  cfg.n_kv_heads = 2;
  cfg.ffn_dim = 160;
  cfg.vocab = 120;
  cfg.max_seq_len = 24;
  cfg.rope_theta = 500.0; /* not the default: the theta must reach the op */
  cfg.init_std = 0.04f;
  pair p;
  WREQUIRE(pair_make(&p, &cfg, 1234), "pair");
  /* the same seed: bit-identical weights */
  double w0 = worst_diff(&p, false);
  WCHECK(w0 == 0.0, "init_weights(1234) differs between the models (rel %.3g)", w0);
  int64_t B = 3, T = 20;
  double worst_l = 0, worst_g = 0, worst_w = 0;
  for (int s = 0; s < 3; s++) {
    weft_tensor *tok = NULL, *tgt = NULL;
    make_batch(&cfg, B, T, s, &tok, &tgt);
    weft_dtensor *ids = NULL, *tg = NULL;
    WOK(golden_rows(p.mesh, tok, 0, B, &ids));
    WOK(golden_rows(p.mesh, tgt, 0, B, &tg));
    double la = 0, lb = 0;
    step_ops(&p, ids, tg, &la, NULL);
    step_builtin(&p, tok, tgt, &lb, NULL);
    model_check_params_on_device(p.ops, "ops model");
    model_check_params_on_device(p.builtin, "built-in model");
    double el = fabs(la - lb) / fabs(lb), eg = worst_diff(&p, true), ew = worst_diff(&p, false);
    WCHECK(el < 1e-6, "step %d: loss %.9f (ops) vs %.9f (built-in)", s, la, lb);
    WCHECK(eg < 1e-5, "step %d: grads differ (worst rel %.3g)", s, eg);
    WCHECK(ew < 1e-5, "step %d: weights differ (worst rel %.3g)", s, ew);
    if (el > worst_l) worst_l = el;
    if (eg > worst_g) worst_g = eg;
    if (ew > worst_w) worst_w = ew;
    weft_dtensor_destroy(ids);
    weft_dtensor_destroy(tg);
    weft_tensor_destroy(tok);
    weft_tensor_destroy(tgt);
  }
  printf("llama_ops vs built-in, 3 steps: worst loss rel diff %.3g, grads %.3g, weights %.3g\n",
         worst_l, worst_g, worst_w);
  pair_free(&p);
}

/* ------------------------------------------------------------------ bench */

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static void case_bench(void) {
  const char *which = weft_worker_argc > 2 ? weft_worker_argv[2] : "golden";
  int steps = weft_worker_argc > 3 ? atoi(weft_worker_argv[3]) : 5;
  if (steps < 1 || steps > 64) steps = 5;
  /* argv[4] "ops" / "builtin": time one model only (for a profiler) */
  const char *only = weft_worker_argc > 4 ? weft_worker_argv[4] : "";
  bool run_b = strcmp(only, "ops") != 0, run_a = strcmp(only, "builtin") != 0;
  weft_llama_config cfg = WEFT_LLAMA_CONFIG_INIT;
  int64_t B, T;
  if (strcmp(which, "small") == 0) { /* bench/step.c's configs */
    cfg.dim = 768, cfg.n_layers = 12, cfg.n_heads = 12, cfg.n_kv_heads = 12;
    cfg.ffn_dim = 2048, cfg.vocab = 8192, cfg.max_seq_len = 512, B = 4, T = 512;
  } else if (strcmp(which, "tiny") == 0) {
    cfg.dim = 256, cfg.n_layers = 4, cfg.n_heads = 8, cfg.n_kv_heads = 8;
    cfg.ffn_dim = 688, cfg.vocab = 256, cfg.max_seq_len = 256, B = 8, T = 256;
  } else { /* the golden tiny_gqa shape, scaled up */
    cfg.dim = 128, cfg.n_layers = 2, cfg.n_heads = 4, cfg.n_kv_heads = 2;
    cfg.ffn_dim = 344, cfg.vocab = 96, cfg.max_seq_len = 64, B = 4, T = 64;
  }
  pair p;
  WREQUIRE(pair_make(&p, &cfg, 7), "pair");
  weft_tensor *tok = NULL, *tgt = NULL;
  make_batch(&cfg, B, T, 0, &tok, &tgt);
  weft_dtensor *ids = NULL, *tg = NULL;
  WOK(golden_rows(p.mesh, tok, 0, B, &ids));
  WOK(golden_rows(p.mesh, tgt, 0, B, &tg));
  phases pa[64], pb[64];
  double la = 0, lb = 0;
  /* one warmup step each, then alternate, and which goes first too (load
   * from other processes hits both alike) */
  memset(pa, 0, sizeof pa), memset(pb, 0, sizeof pb);
  if (run_a) step_ops(&p, ids, tg, &la, NULL);
  if (run_b) step_builtin(&p, tok, tgt, &lb, NULL);
  for (int s = 0; s < steps; s++) {
    for (int k = 0; k < 2; k++) {
      if ((k + s) % 2 == 0) {
        if (run_b) step_builtin(&p, tok, tgt, &lb, &pb[s]);
      } else if (run_a) {
        step_ops(&p, ids, tg, &la, &pa[s]);
      }
    }
    printf(
        "bench %s step %d: built-in %.1f ms (fwd %.1f bwd %.1f rest %.1f, cpu %.1f, %ld "
        "page faults; loss %.6f), ops %.1f ms (fwd %.1f bwd %.1f rest %.1f, cpu %.1f, %ld page "
        "faults; loss %.6f)\n",
        which, s, 1e3 * (pb[s].fwd + pb[s].bwd + pb[s].rest), 1e3 * pb[s].fwd, 1e3 * pb[s].bwd,
        1e3 * pb[s].rest, 1e3 * pb[s].cpu, pb[s].faults, lb,
        1e3 * (pa[s].fwd + pa[s].bwd + pa[s].rest), 1e3 * pa[s].fwd, 1e3 * pa[s].bwd,
        1e3 * pa[s].rest, 1e3 * pa[s].cpu, pa[s].faults, la);
  }
  /* with one model only, the peak over the run differs from the other
   * model's run by what that model's steps hold (both models and their
   * AdamW states exist in either run) */
  printf("bench %s (%s): peak tensor bytes %.1f MiB\n", which,
         run_a && run_b ? "both models"
         : run_a        ? "ops only"
                        : "built-in only",
         (double)weft_mem_get(WEFT_CPU).peak_bytes / 1048576.0);
  WCHECK(!run_a || !run_b || fabs(la - lb) <= 1e-4 * fabs(lb), "losses diverged: %.6f vs %.6f", la,
         lb);
  /* medians of each phase (each sorted on its own) */
  double v[5][2][64];
  for (int s = 0; s < steps; s++)
    for (int m = 0; m < 2; m++) {
      const phases *q = m ? &pa[s] : &pb[s];
      v[0][m][s] = q->fwd + q->bwd + q->rest;
      v[1][m][s] = q->fwd;
      v[2][m][s] = q->bwd;
      v[3][m][s] = q->rest;
      v[4][m][s] = q->cpu;
    }
  double med[5][2];
  for (int i = 0; i < 5; i++)
    for (int m = 0; m < 2; m++) {
      qsort(v[i][m], (size_t)steps, sizeof(double), cmp_d);
      med[i][m] = v[i][m][steps / 2];
    }
  printf(
      "bench %s (D=%lld L=%lld H=%lld Hkv=%lld F=%lld V=%lld B=%lld T=%lld), %d steps, "
      "medians: step built-in %.1f ms, ops %.1f ms, ops/built-in %.3f; fwd %.1f / %.1f, bwd "
      "%.1f / %.1f, rest %.1f / %.1f, cpu %.1f / %.1f (ops/built-in %.3f)\n",
      which, (long long)cfg.dim, (long long)cfg.n_layers, (long long)cfg.n_heads,
      (long long)cfg.n_kv_heads, (long long)cfg.ffn_dim, (long long)cfg.vocab, (long long)B,
      (long long)T, steps, 1e3 * med[0][0], 1e3 * med[0][1], med[0][1] / med[0][0], 1e3 * med[1][0],
      1e3 * med[1][1], 1e3 * med[2][0], 1e3 * med[2][1], 1e3 * med[3][0], 1e3 * med[3][1],
      1e3 * med[4][0], 1e3 * med[4][1], med[4][1] / med[4][0]);
  weft_dtensor_destroy(ids);
  weft_dtensor_destroy(tg);
  weft_tensor_destroy(tok);
  weft_tensor_destroy(tgt);
  pair_free(&p);
}

static void case_hf(void) {
  hf_mode = true;
  run_golden("tiny_mha", 0, false, false);
  run_golden("tiny_gqa", 0, false, false);
}
static void case_hf_2d(void) {
  hf_mode = true;
  run_golden("tiny_gqa", 2, true, true);
}

static const weft_worker_case cases[] = {
    {"golden", case_golden},
    {"golden_tp", case_golden_tp},
    {"golden_fsdp_tp", case_golden_fsdp_tp},
    {"builtin", case_builtin},
    {"bench", case_bench},
    {"hf", case_hf},
    {"hf_2d", case_hf_2d},
    {0, 0},
};

int main(int argc, char **argv) { return weft_worker_main(argc, argv, cases); }
