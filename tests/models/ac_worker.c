/* tests/models/ac_worker.c — MPI worker cases for activation checkpointing
 * (weft_module_set_checkpoint, nn/graph.c), started by test_ac.c under
 * mpiexec. GPT-2 (models/gpt2) from the golden init or from
 * weft_module_init_weights, run with and without checkpointing: losses
 * and gradients must be bitwise equal (dropout on, several steps, on one
 * rank and with FSDP per block on two ranks), match PyTorch's float64
 * golden gradients, and the graph's peak memory must go down.
 *
 * Device mode (WEFT_TEST_DEVICE=cuda, worker.h): every root mesh is
 * put on WEFT_CUDA, so the models run there; memory is measured on the
 * mesh's device and grads are read through host copies. Unset, everything
 * stays on the CPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd.h"
#include "fsdp.h"
#include "golden.h"
#include "gpt2_golden.h"
#include "gpt2.h"
#include "kernels.h"
#include "model_device.h"
#include "tp.h"
#include "worker.h"

#define MAXP 96
#define MAXSTEPS 4

enum ac_mode {
  AC_NONE = 0,
  AC_BLOCKS, /* every transformer.h.<i> (torchtitan's full per-block AC) */
  AC_SUB,    /* every block's attn and mlp */
  AC_DEEP,   /* model, transformer, h, every block, attn, mlp (nested) */
};
static const char *mode_name[] = {"none", "blocks", "attn+mlp", "nested"};

typedef struct result {
  int steps, np;
  double loss[MAXSTEPS];
  uint32_t loss_bits[MAXSTEPS][2];
  char fqn[MAXP][128];
  int64_t n[MAXP];
  float *grad[MAXSTEPS][MAXP]; /* this rank's local grad (the FSDP shard) */
  int64_t peak, held;          /* step 0: peak over the step, pool kept after it */
  int64_t steady_allocs;       /* allocations in the last step */
} result;

static void result_free(result *r) {
  for (int s = 0; s < MAXSTEPS; s++)
    for (int i = 0; i < MAXP; i++) free(r->grad[s][i]);
  memset(r, 0, sizeof *r);
}

/* A (B, T) int32 tensor of pseudo-random ids in [0, vocab) (LCG, seed). */
static weft_tensor *random_ids(int64_t B, int64_t T, int64_t vocab, uint64_t seed) {
  int64_t shape[2] = {B, T};
  weft_tensor *t = NULL;
  if (weft_tensor_create(WEFT_I32, WEFT_CPU, 2, shape, &t) != WEFT_OK) return NULL;
  uint64_t x = seed * 6364136223846793005ull + 1442695040888963407ull;
  for (int64_t i = 0; i < B * T; i++) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    ((int32_t *)t->data)[i] = (int32_t)((x >> 33) % (uint64_t)vocab);
  }
  return t;
}

static void apply_ac(weft_module *model, int mode) {
  if (mode == AC_NONE) return;
  weft_module *h = NULL, *tr = NULL;
  WOK(weft_module_find(model, "transformer.h", &h));
  WOK(weft_module_find(model, "transformer", &tr));
  if (!h || !tr) return;
  for (int i = 0; i < weft_module_num_children(h); i++) {
    weft_module *b = weft_module_child(h, i), *a = NULL, *f = NULL;
    WOK(weft_module_find(b, "attn", &a));
    WOK(weft_module_find(b, "mlp", &f));
    if (mode == AC_BLOCKS || mode == AC_DEEP) WOK(weft_module_set_checkpoint(b, true));
    if (mode == AC_SUB || mode == AC_DEEP) {
      WOK(weft_module_set_checkpoint(a, true));
      WOK(weft_module_set_checkpoint(f, true));
    }
    WCHECK(weft_module_checkpoint(b) == (mode == AC_BLOCKS || mode == AC_DEEP),
           "block %d: checkpoint flag", i);
  }
  if (mode == AC_DEEP) {
    WOK(weft_module_set_checkpoint(h, true));
    WOK(weft_module_set_checkpoint(tr, true));
    WOK(weft_module_set_checkpoint(model, true));
  }
}

/* What a run is made of. */
typedef struct setup {
  weft_gpt2_config cfg;
  const golden *g; /* weights from its init.safetensors; NULL: init_weights(seed) */
  uint64_t seed;
  const weft_tensor *ids, *tgt; /* (B, T) int32, the whole batch */
  bool fsdp;                    /* world of 2 ranks: FSDP per block + root over dp = 2 */
  int steps;
  bool measure;    /* peak memory of step 0 (param grads made beforehand) */
  bool tp_sp;      /* world of 2 ranks: tensor parallel + sequence parallel */
  bool fsdp_inner; /* with fsdp: fully_shard each block's attn and mlp, not blocks */
  bool bf16;       /* with fsdp: mixed precision (bf16 parameters and activations) */
} setup;

/* Trains nothing: `steps` forward/backward passes (grads zeroed before
 * each, the graph reset after) of GPT-2 with AC mode `mode`, recording
 * each step's loss and this rank's local parameter grads. */
static void run(const setup *S, int mode, result *r) {
  memset(r, 0, sizeof *r);
  r->steps = S->steps;
  weft_mesh *root = NULL, *dp = NULL, *mesh = NULL;
  int64_t B = S->ids->shape[0], nb = B, r0 = 0;
  if (S->fsdp) {
    int shape[2] = {weft_world_size(), 1};
    const char *names[2] = {"dp", "tp"};
    WOK(weft_mesh_create(2, shape, names, &root));
    weft_worker_mesh_on_device(root);
    WOK(weft_mesh_submesh(root, 1, &names[0], &dp));
    WOK(weft_mesh_submesh(root, 1, &names[1], &mesh));
    nb = B / weft_world_size();
    r0 = weft_worker_rank * nb;
  } else if (S->tp_sp) {
    int n = weft_world_size();
    const char *mn[1] = {"tp"};
    WOK(weft_mesh_create(1, &n, mn, &mesh));
    weft_worker_mesh_on_device(mesh);
  } else {
    int one = 1;
    const char *mn[1] = {"tp"};
    WOK(weft_mesh_create_from_comm(MPI_COMM_SELF, 1, &one, mn, &mesh));
    weft_worker_mesh_on_device(mesh);
  }
  weft_device dev = weft_mesh_device(mesh); /* where the memory is measured */
  weft_module *model = NULL;
  WOK(weft_gpt2_create(&S->cfg, mesh, &model));
  if (!model) return;
  if (S->g) {
    char path[700];
    golden_path(S->g, "init.safetensors", path, sizeof path);
    WOK(load_params(model, path));
  } else {
    WOK(weft_module_init_weights(model, S->seed));
  }
  apply_ac(model, mode);
  weft_tp *tp = NULL;
  if (S->tp_sp) WOK(weft_gpt2_apply_tp(model, mesh, true, &tp));
  if (S->fsdp) {
    weft_fsdp *f = NULL;
    weft_module *h = NULL;
    weft_fsdp_options o = WEFT_FSDP_OPTIONS_INIT;
    if (S->bf16) o.mp = (weft_fsdp_mixed_precision){WEFT_BF16, WEFT_F32, WEFT_DTYPE_COUNT, true};
    WOK(weft_module_find(model, "transformer.h", &h));
    for (int i = 0; h && i < weft_module_num_children(h); i++) {
      weft_module *b = weft_module_child(h, i), *a = NULL, *m = NULL;
      if (!S->fsdp_inner) {
        WOK(weft_fully_shard(b, dp, &o, &f));
        continue;
      }
      WOK(weft_module_find(b, "attn", &a));
      WOK(weft_module_find(b, "mlp", &m));
      WOK(weft_fully_shard(a, dp, &o, &f));
      WOK(weft_fully_shard(m, dp, &o, &f));
    }
    WOK(weft_fully_shard(model, dp, &o, &f));
  }
  weft_dtensor *ids = NULL, *tgt = NULL;
  WOK(golden_rows(mesh, S->ids, r0, nb, &ids));
  WOK(golden_rows(mesh, S->tgt, r0, nb, &tgt));
  weft_var *loss = NULL;
  if (S->measure) { /* the parameter grads exist before the measured step */
    weft_graph *w = NULL;
    WOK(weft_graph_create(&w));
    WOK(weft_gpt2_loss(model, w, ids, tgt, &loss, NULL));
    WOK(weft_backward(loss));
    weft_graph_destroy(w);
  }
  weft_graph *gr = NULL;
  WOK(weft_graph_create(&gr));
  weft_graph_set_seed(gr, 4321);
  if (S->fsdp) WOK(weft_graph_set_batch_slice(gr, r0, B));
  weft_param *ps[MAXP];
  int np = 0;
  WOK(weft_module_parameters(model, ps, MAXP, &np));
  r->np = np;
  for (int s = 0; s < S->steps; s++) {
    WOK(weft_module_zero_grad(model, false));
    int64_t before = weft_mem_get(dev).current_bytes;
    int64_t a0 = weft_mem_get(dev).alloc_count;
    weft_mem_reset_peak(dev);
    WOK(weft_gpt2_loss(model, gr, ids, tgt, &loss, NULL));
    WOK(weft_backward(loss));
    if (s == 0) {
      weft_mem_stats m = weft_mem_get(dev);
      r->peak = m.peak_bytes - before;
      r->held = m.current_bytes - before;
    }
    r->steady_allocs = weft_mem_get(dev).alloc_count - a0;
    if (s == 0) model_check_params_on_device(model, mode_name[mode]);
    double lv = weft_var_item(loss);
    if (S->fsdp) {
      double sum = 0;
      MPI_Allreduce(&lv, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
      lv = sum / weft_world_size();
    }
    r->loss[s] = lv;
    memcpy(r->loss_bits[s], &lv, sizeof lv);
    for (int i = 0; i < np; i++) {
      snprintf(r->fqn[i], sizeof r->fqn[i], "%s", ps[i]->fqn);
      if (!ps[i]->grad) {
        WCHECK(ps[i]->grad, "%s: %s has no grad", mode_name[mode], ps[i]->fqn);
        continue;
      }
      weft_tensor *hl = NULL;
      const weft_tensor *l = weft_worker_host_copy(weft_dtensor_local(ps[i]->grad), &hl);
      WREQUIRE(l && l->dtype == WEFT_F32 && weft_tensor_is_contiguous(l), "%s: grad layout",
               ps[i]->fqn);
      int64_t n = weft_tensor_numel(l);
      /* after backward every FSDP group is resharded (the recompute's
       * forward hooks and prefetches left nothing gathered) */
      WCHECK(!S->fsdp || weft_tensor_numel(weft_dtensor_local(ps[i]->data)) == n,
             "%s: step %d: %s still gathered after backward (%lld local elements, grad %lld)",
             mode_name[mode], s, ps[i]->fqn,
             (long long)weft_tensor_numel(weft_dtensor_local(ps[i]->data)), (long long)n);
      r->n[i] = n;
      r->grad[s][i] = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
      if (n > 0) memcpy(r->grad[s][i], l->data, (size_t)n * sizeof(float));
      weft_tensor_destroy(hl);
    }
    WOK(weft_graph_reset(gr));
  }
  weft_graph_destroy(gr);
  weft_dtensor_destroy(ids);
  weft_dtensor_destroy(tgt);
  if (S->fsdp) WOK(weft_fsdp_destroy_all(model));
  weft_tp_destroy(tp);
  WOK(weft_module_destroy(model));
  WOK(weft_mesh_destroy(mesh));
  if (dp) WOK(weft_mesh_destroy(dp));
  if (root) WOK(weft_mesh_destroy(root));
}

/* Losses and every grad of every step bitwise equal; returns the number
 * of grad elements compared. */
static int64_t same_bits(const result *a, const result *b, const char *what) {
  int64_t n = 0;
  WCHECK(a->np == b->np && a->steps == b->steps, "%s: %d/%d params, %d/%d steps", what, a->np,
         b->np, a->steps, b->steps);
  for (int s = 0; s < a->steps && s < b->steps; s++) {
    WCHECK(memcmp(a->loss_bits[s], b->loss_bits[s], sizeof a->loss_bits[s]) == 0,
           "%s: step %d loss %.17g vs %.17g", what, s, a->loss[s], b->loss[s]);
    for (int i = 0; i < a->np && i < b->np; i++) {
      if (!a->grad[s][i] || !b->grad[s][i]) continue;
      WCHECK(a->n[i] == b->n[i], "%s: %s sizes", what, a->fqn[i]);
      int64_t first = -1;
      for (int64_t k = 0; k < a->n[i] && first < 0; k++)
        if (memcmp(&a->grad[s][i][k], &b->grad[s][i][k], sizeof(float)) != 0) first = k;
      WCHECK(first < 0, "%s: step %d grad %s differs at %lld: %.9g vs %.9g", what, s, a->fqn[i],
             (long long)first, first < 0 ? 0.0 : (double)a->grad[s][i][first],
             first < 0 ? 0.0 : (double)b->grad[s][i][first]);
      n += a->n[i];
    }
  }
  return n;
}

/* The grads of step 0 (gathered: full tensors) against PyTorch float64. */
static double vs_golden(const golden *g, const result *r, bool sharded, const char *what) {
  char path[700];
  golden_path(g, "grads.safetensors", path, sizeof path);
  weft_safetensors *fg = NULL;
  WOK(weft_safetensors_open(path, &fg));
  if (!fg) return INFINITY;
  double worst = 0;
  for (int i = 0; i < r->np; i++) {
    double *ref = NULL;
    int64_t n = 0;
    WOK(read_f64(fg, r->fqn[i], &ref, &n));
    if (!ref) continue;
    float *full = r->grad[0][i];
    float *gathered = NULL;
    if (sharded) { /* FSDP shards dim 0 evenly over the world: gather rank order */
      int world = weft_world_size();
      gathered = malloc((size_t)n * sizeof(float));
      WCHECK(r->n[i] * world == n, "%s: shard %lld x %d != %lld", r->fqn[i], (long long)r->n[i],
             world, (long long)n);
      if (r->n[i] * world == n)
        MPI_Allgather(r->grad[0][i], (int)r->n[i], MPI_FLOAT, gathered, (int)r->n[i], MPI_FLOAT,
                      MPI_COMM_WORLD);
      full = gathered;
    } else {
      WCHECK(r->n[i] == n, "%s: size %lld want %lld", r->fqn[i], (long long)r->n[i], (long long)n);
    }
    if (full && (sharded || r->n[i] == n)) {
      double e = weft_test_rel_norm_f32_f64(full, ref, n);
      if (e > worst) worst = e;
      WCHECK(e < 1e-5, "%s: grad %s rel err %.3g vs PyTorch float64", what, r->fqn[i], e);
    }
    free(gathered);
    free(ref);
  }
  weft_safetensors_close(fg);
  return worst;
}

/* ------------------------------------------------------------------ cases */

/* One rank, golden init, no dropout: checkpointing every block gives
 * PyTorch's float64 loss and gradients, and the same bits as no AC. */
static void case_golden(void) {
  golden g;
  WOK(golden_load("gpt2_tiny", &g));
  setup S = {.cfg = gpt2_golden_config(&g, 0.0f),
             .g = &g,
             .seed = 0,
             .ids = g.tokens,
             .tgt = g.targets,
             .steps = 1};
  result plain, ac;
  run(&S, AC_NONE, &plain);
  run(&S, AC_BLOCKS, &ac);
  double lerr = fabs(ac.loss[0] - g.loss) / fabs(g.loss);
  WCHECK(lerr < 1e-6, "AC loss %.9f want %.9f", ac.loss[0], g.loss);
  double worst = vs_golden(&g, &ac, false, "AC blocks");
  int64_t n = same_bits(&plain, &ac, "AC blocks vs none");
  printf(
      "ac golden (1 rank, AC on every block): loss rel err %.3g, worst grad rel err %.3g vs "
      "PyTorch float64; %lld grad elements bitwise equal to no AC\n",
      lerr, worst, (long long)n);
  result_free(&plain);
  result_free(&ac);
  golden_free(&g);
}

/* One rank, golden init, dropout 0.1, three steps (masks differ per
 * step): every AC mode gives the bits of no AC; dropout is on (the loss
 * differs from p = 0). */
static void case_dropout_bitwise(void) {
  golden g;
  WOK(golden_load("gpt2_tiny", &g));
  setup S = {.cfg = gpt2_golden_config(&g, 0.1f),
             .g = &g,
             .seed = 0,
             .ids = g.tokens,
             .tgt = g.targets,
             .steps = 3};
  result plain, nodrop;
  run(&S, AC_NONE, &plain);
  setup S0 = S;
  S0.cfg.dropout = 0.0f;
  S0.steps = 1;
  run(&S0, AC_NONE, &nodrop);
  double moved = fabs(plain.loss[0] - nodrop.loss[0]) / fabs(nodrop.loss[0]);
  WCHECK(moved > 1e-3, "dropout 0.1 moved the loss by only %.3g", moved);
  WCHECK(plain.loss[0] != plain.loss[1], "steps 0 and 1 drew the same masks");
  for (int mode = AC_BLOCKS; mode <= AC_DEEP; mode++) {
    result ac;
    run(&S, mode, &ac);
    char what[64];
    snprintf(what, sizeof what, "dropout 0.1, AC %s vs none", mode_name[mode]);
    int64_t n = same_bits(&plain, &ac, what);
    printf(
        "ac %s: 3 steps, losses %.9f %.9f %.9f and %lld grad elements bitwise equal to no "
        "AC (dropout moves the loss by %.3g)\n",
        what, ac.loss[0], ac.loss[1], ac.loss[2], (long long)n, moved);
    result_free(&ac);
  }
  result_free(&plain);
  result_free(&nodrop);
  golden_free(&g);
}

/* One rank, a 4-layer GPT-2 (init_weights), dropout 0.1: the peak memory
 * of a forward + backward goes down with AC on every block, the grads
 * stay bitwise, and a steady step allocates nothing. */
static void case_memory(void) {
  weft_gpt2_config c = WEFT_GPT2_CONFIG_INIT;
  c.vocab = 96;
  c.dim = 64;
  c.n_layers = 4;
  c.n_heads = 4;
  c.ffn_dim = 256;
  c.max_seq_len = 64;
  c.dropout = 0.1f;
  weft_tensor *ids = random_ids(4, 64, c.vocab, 11), *tgt = random_ids(4, 64, c.vocab, 12);
  WREQUIRE(ids && tgt, "ids");
  setup S = {.cfg = c, .seed = 99, .ids = ids, .tgt = tgt, .steps = 3, .measure = true};
  result plain, ac;
  run(&S, AC_NONE, &plain);
  run(&S, AC_BLOCKS, &ac);
  int64_t n = same_bits(&plain, &ac, "4 layers, AC blocks vs none");
  double ratio = (double)ac.peak / (double)plain.peak;
  WCHECK(ratio < 0.6, "AC peak %lld bytes, no AC %lld (ratio %.3f)", (long long)ac.peak,
         (long long)plain.peak, ratio);
  WCHECK(ac.steady_allocs == 0 && plain.steady_allocs == 0,
         "steady step allocations: AC %lld, none %lld", (long long)ac.steady_allocs,
         (long long)plain.steady_allocs);
  printf(
      "ac memory (GPT-2 4 layers, B=4 T=64 D=64 ffn=256, dropout 0.1, forward + backward): "
      "peak above start %lld bytes without AC, %lld with AC on every block (%.3f); graph "
      "buffers kept after the step %lld vs %lld; %lld grad elements bitwise equal over 3 "
      "steps; steady step allocations %lld / %lld\n",
      (long long)plain.peak, (long long)ac.peak, ratio, (long long)plain.held, (long long)ac.held,
      (long long)n, (long long)plain.steady_allocs, (long long)ac.steady_allocs);
  result_free(&plain);
  result_free(&ac);
  weft_tensor_destroy(ids);
  weft_tensor_destroy(tgt);
}

/* Two ranks, FSDP per block + root over dp = 2 (each rank its batch row),
 * AC on every block (FSDP x AC): the recompute runs on the parameters the
 * pre-backward hook gathered; grads (the local shards) bitwise those of
 * FSDP without AC over two dropout steps, and PyTorch's float64 without
 * dropout. */
static void case_fsdp(void) {
  golden g;
  WOK(golden_load("gpt2_tiny", &g));
  WREQUIRE(weft_world_size() == 2, "fsdp runs on 2 ranks");
  setup S = {.cfg = gpt2_golden_config(&g, 0.1f),
             .g = &g,
             .seed = 0,
             .ids = g.tokens,
             .tgt = g.targets,
             .fsdp = true,
             .steps = 2,
             .measure = true};
  result plain, ac;
  run(&S, AC_NONE, &plain);
  run(&S, AC_BLOCKS, &ac);
  int64_t n = same_bits(&plain, &ac, "FSDP dp=2, dropout 0.1, AC blocks vs none");
  /* the recompute really ran: the activations were dropped */
  WCHECK(ac.peak < plain.peak, "FSDP x AC peak %lld bytes, without AC %lld", (long long)ac.peak,
         (long long)plain.peak);
  result deep;
  run(&S, AC_DEEP, &deep);
  int64_t n2 = same_bits(&plain, &deep, "FSDP dp=2, dropout 0.1, AC nested vs none");
  result_free(&deep);
  setup S0 = S;
  S0.cfg.dropout = 0.0f;
  S0.steps = 1;
  result ac0;
  run(&S0, AC_BLOCKS, &ac0);
  double lerr = fabs(ac0.loss[0] - g.loss) / fabs(g.loss);
  WCHECK(lerr < 1e-6, "FSDP x AC loss %.9f want %.9f", ac0.loss[0], g.loss);
  double worst = vs_golden(&g, &ac0, true, "FSDP x AC");
  if (weft_worker_rank == 0)
    printf(
        "ac fsdp dp=2 x AC per block: %lld local grad elements (2 dropout steps) bitwise "
        "equal to FSDP without AC (%lld with nested AC); without dropout loss rel err %.3g, "
        "worst grad rel err %.3g vs PyTorch float64; rank 0 peak %lld bytes without AC, "
        "%lld with\n",
        (long long)n, (long long)n2, lerr, worst, (long long)plain.peak, (long long)ac.peak);
  result_free(&plain);
  result_free(&ac);
  result_free(&ac0);
  golden_free(&g);
}

/* FSDP bf16 mixed precision (nn/mixed.c under the recompute): AC per block
 * and nested give bitwise the grads of the bf16 run without AC (dropout
 * on, 2 steps), and AC still lowers the peak. */
static void case_fsdp_bf16(void) {
  golden g;
  WOK(golden_load("gpt2_tiny", &g));
  WREQUIRE(weft_world_size() == 2, "fsdp_bf16 runs on 2 ranks");
  setup S = {.cfg = gpt2_golden_config(&g, 0.1f),
             .g = &g,
             .ids = g.tokens,
             .tgt = g.targets,
             .fsdp = true,
             .bf16 = true,
             .steps = 2,
             .measure = true};
  result plain, ac, deep;
  run(&S, AC_NONE, &plain);
  run(&S, AC_BLOCKS, &ac);
  run(&S, AC_DEEP, &deep);
  int64_t n = same_bits(&plain, &ac, "FSDP bf16 dp=2, dropout 0.1, AC blocks vs none");
  int64_t n2 = same_bits(&plain, &deep, "FSDP bf16 dp=2, dropout 0.1, AC nested vs none");
  WCHECK(ac.peak < plain.peak, "bf16 FSDP x AC peak %lld bytes, without AC %lld",
         (long long)ac.peak, (long long)plain.peak);
  WCHECK(fabs(plain.loss[0] - g.loss) < 0.02 * g.loss, "bf16 loss %.6g, PyTorch f64 %.6g",
         plain.loss[0], g.loss);
  if (weft_worker_rank == 0)
    printf(
        "ac fsdp bf16 dp=2: %lld local grad elements (2 dropout steps) bitwise equal with AC "
        "per block (%lld nested); rank 0 peak %lld bytes without AC, %lld with\n",
        (long long)n, (long long)n2, (long long)plain.peak, (long long)ac.peak);
  result_free(&plain);
  result_free(&ac);
  result_free(&deep);
  golden_free(&g);
}

/* Two ranks, tensor parallel with sequence parallel (children's TP hooks
 * redistribute inputs and outputs: they fire again in the recompute),
 * dropout 0.1, AC on every block and nested: the local grads bitwise
 * those without AC. */
static void case_tp_sp(void) {
  golden g;
  WOK(golden_load("gpt2_tiny", &g));
  WREQUIRE(weft_world_size() == 2, "tp_sp runs on 2 ranks");
  setup S = {.cfg = gpt2_golden_config(&g, 0.1f),
             .g = &g,
             .seed = 0,
             .ids = g.tokens,
             .tgt = g.targets,
             .steps = 2,
             .tp_sp = true};
  result plain, ac, deep;
  run(&S, AC_NONE, &plain);
  run(&S, AC_BLOCKS, &ac);
  run(&S, AC_DEEP, &deep);
  int64_t n = same_bits(&plain, &ac, "TP=2 SP, dropout 0.1, AC blocks vs none");
  int64_t n2 = same_bits(&plain, &deep, "TP=2 SP, dropout 0.1, AC nested vs none");
  if (weft_worker_rank == 0)
    printf(
        "ac tp=2 sp x AC: %lld local grad elements (2 dropout steps) bitwise equal to no AC "
        "with AC per block, %lld with nested AC\n",
        (long long)n, (long long)n2);
  result_free(&plain);
  result_free(&ac);
  result_free(&deep);
  golden_free(&g);
}

/* Two ranks, FSDP on each block's attn and mlp (groups inside the
 * checkpointed block: their forward hooks fire again in the recompute,
 * all-gathering their parameters once more), AC on every block: local
 * grads bitwise those without AC over two dropout steps, also after an
 * optimizer-free second step (the groups are resharded between steps). */
static void case_fsdp_inner(void) {
  golden g;
  WOK(golden_load("gpt2_tiny", &g));
  WREQUIRE(weft_world_size() == 2, "fsdp_inner runs on 2 ranks");
  setup S = {.cfg = gpt2_golden_config(&g, 0.1f),
             .g = &g,
             .seed = 0,
             .ids = g.tokens,
             .tgt = g.targets,
             .fsdp = true,
             .steps = 2,
             .fsdp_inner = true};
  result plain, ac;
  run(&S, AC_NONE, &plain);
  run(&S, AC_BLOCKS, &ac);
  int64_t n = same_bits(&plain, &ac, "FSDP on attn/mlp, AC blocks vs none");
  if (weft_worker_rank == 0)
    printf(
        "ac fsdp on attn+mlp x AC per block: %lld local grad elements (2 dropout steps) "
        "bitwise equal to no AC\n",
        (long long)n);
  result_free(&plain);
  result_free(&ac);
  golden_free(&g);
}

/* A forward whose output shape changes on its second run (not
 * deterministic) and a forward that is fine, for the error cases. */
typedef struct flaky_ctx {
  int calls;
} flaky_ctx;

static weft_status flaky_forward(weft_module *m, void *ctx, weft_var *const *in, int nin,
                                 weft_var **out, int nout) {
  (void)m, (void)nin, (void)nout;
  flaky_ctx *c = ctx;
  weft_var *w = weft_module_param_var(m, weft_var_graph(in[0]), "weight");
  if (!w) return weft_last_status();
  weft_var *h;
  WEFT_CHECK(weft_op_mul(in[0], w, &h));
  if (c->calls++ == 0) return weft_op_scale(h, 2.0, out);
  return weft_op_sum(h, 0, true, out); /* (1, 3) instead of (2, 3) */
}

static void case_errors(void) {
  WCHECK(weft_module_set_checkpoint(NULL, true) == WEFT_ERR_INVALID, "NULL module accepted");
  WCHECK(!weft_module_checkpoint(NULL), "NULL module checkpointed");
  int one = 1;
  const char *mn[1] = {"tp"};
  weft_mesh *mesh = NULL;
  WOK(weft_mesh_create_from_comm(MPI_COMM_SELF, 1, &one, mn, &mesh));
  weft_worker_mesh_on_device(mesh);
  static const weft_module_def def = {"flaky", flaky_forward, free};
  flaky_ctx *fc = calloc(1, sizeof *fc);
  weft_module *m = NULL;
  WOK(weft_module_create(mesh, "flaky", &def, fc, &m));
  WREQUIRE(m, "module");
  int64_t shape[2] = {2, 3};
  weft_param *p = NULL;
  WOK(weft_module_add_param(m, "weight", 2, shape,
                            (weft_param_init){WEFT_INIT_NORMAL, 0.0f, 1.0f, 0.0f}, &p));
  WOK(weft_module_init_weights(m, 5));
  WOK(weft_module_set_checkpoint(m, true));
  WCHECK(weft_module_checkpoint(m), "flag not set");
  weft_tensor *xt = NULL;
  WOK(weft_tensor_create(WEFT_F32, WEFT_CPU, 2, shape, &xt));
  for (int i = 0; i < 6; i++) ((float *)xt->data)[i] = 0.25f * (float)(i + 1);
  weft_placement pl[1] = {weft_replicate()};
  weft_dtensor *x = NULL;
  WOK(weft_dtensor_distribute(mesh, xt, WEFT_DTENSOR_ALL_RANKS, pl, 1, &x));
  weft_graph *g = NULL;
  WOK(weft_graph_create(&g));
  weft_var *xv = NULL, *y = NULL, *s = NULL, *l = NULL;
  WOK(weft_graph_input(g, x, true, &xv));
  WOK(weft_module_call1(m, xv, &y));
  WOK(weft_op_sum(y, 1, false, &s));
  WOK(weft_op_sum(s, 0, false, &l));
  weft_status st = weft_backward(l);
  WCHECK(st == WEFT_ERR_STATE, "a recompute of another shape gave %s", weft_status_str(st));
  WCHECK(strstr(weft_last_error(), "flaky") && strstr(weft_last_error(), "recomputed"),
         "the error does not name the module and the recompute: %s", weft_last_error());
  if (weft_worker_rank == 0) printf("ac error: %s\n", weft_last_error());
  /* the same module, deterministic now (calls > 0: y = sum over dim 0 of
   * x * w every time), checkpointed: l = sum(x * w), so dl/dx = w and
   * dl/dw = x exactly */
  WOK(weft_graph_reset(g));
  fc->calls = 1;
  WOK(weft_module_zero_grad(m, false));
  WOK(weft_graph_input(g, x, true, &xv));
  WOK(weft_module_call1(m, xv, &y));
  WOK(weft_op_sum(y, 1, false, &s));
  WOK(weft_op_sum(s, 0, false, &l));
  WOK(weft_backward(l));
  const weft_dtensor *gx = weft_var_grad(xv);
  WREQUIRE(gx && p->grad, "no grads");
  weft_tensor *h[3] = {NULL, NULL, NULL};
  const weft_tensor *hx = weft_worker_host_copy(weft_dtensor_local(gx), &h[0]),
                    *hw = weft_worker_host_copy(weft_dtensor_local(p->grad), &h[1]),
                    *hp = weft_worker_host_copy(weft_dtensor_local(p->data), &h[2]);
  WREQUIRE(hx && hw && hp, "host copies");
  const float *dx = hx->data, *dw = hw->data, *w = hp->data, *xs = xt->data;
  for (int i = 0; i < 6; i++) {
    WCHECK(dx[i] == w[i], "dx[%d] %g want %g", i, (double)dx[i], (double)w[i]);
    WCHECK(dw[i] == xs[i], "dw[%d] %g want %g", i, (double)dw[i], (double)xs[i]);
  }
  for (int i = 0; i < 3; i++) weft_tensor_destroy(h[i]);
  weft_graph_destroy(g);
  weft_dtensor_destroy(x);
  weft_tensor_destroy(xt);
  WOK(weft_module_destroy(m));
  WOK(weft_mesh_destroy(mesh));
}

static const weft_worker_case cases[] = {
    {"golden", case_golden},
    {"dropout_bitwise", case_dropout_bitwise},
    {"memory", case_memory},
    {"fsdp", case_fsdp},
    {"tp_sp", case_tp_sp},
    {"fsdp_inner", case_fsdp_inner},
    {"errors", case_errors},
    {"fsdp_bf16", case_fsdp_bf16},
    {0, 0},
};

int main(int argc, char **argv) { return weft_worker_main(argc, argv, cases); }
