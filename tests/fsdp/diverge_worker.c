/* tests/fsdp/diverge_worker.c — ranks that stop running the same program.
 *
 * A tiny GPT-2 (models/gpt2) fully sharded over 2 ranks, one block per FSDP
 * group, trained for two steps. In the first step rank 1 skips its backward
 * and goes straight on to the next step's forward, while rank 0 runs
 * backward: rank 1's forward all-gathers parameters while rank 0's backward
 * all-gathers and reduce-scatters. Cases (run under mpiexec -n 2 by test_diverge.c):
 *
 * skip_backward_debug:   with WEFT_DEBUG=1, both ranks fail with
 *                        WEFT_ERR_MISMATCH, and the message names both
 *                        ranks and what each called (backward vs the
 *                        model's forward).
 * skip_backward_timeout: without the debug check and with WEFT_TIMEOUT=4,
 *                        both ranks come back with an error within a few
 *                        timeouts: rank 0 from its backward's all-gather,
 *                        rank 1 from FSDP's step check at the start of its
 *                        second forward (without that check rank 1's
 *                        all-gathers met rank 0's backward ones and it
 *                        went on with wrong numbers).
 */
#include <inttypes.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <string.h>

#include "fsdp.h"
#include "gpt2.h"
#include "worker.h"

typedef struct diverge {
  weft_mesh *root, *dp, *mesh; /* mesh: the model's (tp) */
  weft_module *model;
  weft_dtensor *ids, *tgt;
  weft_graph *g;
} diverge;

/* ids (2, 8) int32 Replicate, values < V, different per rank (data parallel) */
static weft_dtensor *ids_of(weft_mesh *mesh, int64_t V, uint64_t seed) {
  int64_t shape[2] = {2, 8};
  weft_tensor *t = NULL;
  if (weft_tensor_create(WEFT_I32, WEFT_CPU, 2, shape, &t) != WEFT_OK) return NULL;
  uint64_t s = weft_test_rng_state(seed + 977u * (uint64_t)weft_worker_rank);
  for (int i = 0; i < 16; i++) ((int32_t *)t->data)[i] = (int32_t)weft_test_rng_int(&s, 0, V - 1);
  weft_placement r = weft_replicate();
  weft_dtensor *d = NULL;
  weft_status st = weft_dtensor_from_local(mesh, t, WEFT_LOCAL_TAKE, &r, 1, shape, &d);
  if (st != WEFT_OK) weft_tensor_destroy(t);
  return d;
}

static bool ok(weft_status st, const char *what) {
  WCHECK(st == WEFT_OK, "%s: %s: %s", what, weft_status_str(st), weft_last_error());
  return st == WEFT_OK;
}

static bool setup(diverge *D) {
  memset(D, 0, sizeof *D);
  /* FSDP's layout: a (dp, tp) root; the model lives on the tp sub-mesh
   * (1 rank here), FSDP shards it over dp */
  int shape[2] = {2, 1};
  const char *names[2] = {"dp", "tp"};
  if (!ok(weft_mesh_create(2, shape, names, &D->root), "setup")) return false;
  if (!ok(weft_mesh_submesh(D->root, 1, &names[0], &D->dp), "setup")) return false;
  if (!ok(weft_mesh_submesh(D->root, 1, &names[1], &D->mesh), "setup")) return false;
  weft_gpt2_config cfg = WEFT_GPT2_CONFIG_INIT;
  cfg.vocab = 32, cfg.max_seq_len = 8, cfg.dim = 16, cfg.n_layers = 2, cfg.n_heads = 2,
  cfg.ffn_dim = 32;
  if (!ok(weft_gpt2_create(&cfg, D->mesh, &D->model), "setup")) return false;
  weft_module *h = NULL;
  weft_fsdp *f = NULL;
  if (!ok(weft_module_find(D->model, "transformer.h", &h), "setup")) return false;
  for (int i = 0; i < weft_module_num_children(h); i++)
    if (!ok(weft_fully_shard(weft_module_child(h, i), D->dp, NULL, &f), "setup")) return false;
  if (!ok(weft_fully_shard(D->model, D->dp, NULL, &f), "setup")) return false;
  D->ids = ids_of(D->mesh, cfg.vocab, 11);
  D->tgt = ids_of(D->mesh, cfg.vocab, 12);
  if (!ok(weft_graph_create(&D->g), "setup")) return false;
  return D->ids && D->tgt;
}

static void teardown(diverge *D) {
  weft_graph_destroy(D->g);
  weft_dtensor_destroy(D->ids);
  weft_dtensor_destroy(D->tgt);
  weft_fsdp_destroy_all(D->model);
  weft_module_destroy(D->model);
  weft_mesh_destroy(D->mesh);
  weft_mesh_destroy(D->dp);
  weft_mesh_destroy(D->root);
}

/* Two training steps where rank 1 skips the first backward: rank 0 runs
 * forward, backward, forward, backward; rank 1 forward, forward, backward.
 * Each rank stops at its first failure and returns it. */
static weft_status two_steps_one_skipped(diverge *D) {
  for (int step = 0; step < 2; step++) {
    weft_var *loss = NULL;
    weft_status st = weft_graph_reset(D->g);
    if (st == WEFT_OK) st = weft_gpt2_loss(D->model, D->g, D->ids, D->tgt, &loss, NULL);
    if (st == WEFT_OK && !(step == 0 && weft_worker_rank == 1)) st = weft_backward(loss);
    if (st != WEFT_OK) return st;
  }
  return WEFT_OK;
}

static void case_skip_backward_debug(void) {
  WREQUIRE(weft_get_settings()->debug, "run with WEFT_DEBUG=1");
  diverge D;
  WREQUIRE(setup(&D), "setup");
  weft_status st = two_steps_one_skipped(&D);
  const char *msg = weft_last_error();
  WCHECK(st == WEFT_ERR_MISMATCH, "status %s: %s", weft_status_str(st), msg);
  WCHECK(strstr(msg, weft_worker_rank == 0 ? "weft_backward: " : "weft_gpt2_loss: ") &&
             strstr(msg, "rank 0 calls 'backward'") && strstr(msg, "rank 1 calls 'model'"),
         "the message does not name both ranks and both calls: %s", msg);
  if (weft_worker_rank == 0) printf("skip backward, WEFT_DEBUG=1: %s\n", msg);
  teardown(&D);
}

static void case_skip_backward_timeout(void) {
  WREQUIRE(!weft_get_settings()->debug, "run without WEFT_DEBUG");
  double limit = weft_get_settings()->timeout_s;
  WREQUIRE(limit > 0 && limit <= 10, "run with WEFT_TIMEOUT=4 (have %g)", limit);
  diverge D;
  WREQUIRE(setup(&D), "setup");
  double t0 = MPI_Wtime();
  weft_status st = two_steps_one_skipped(&D);
  /* Rank 1's collectives may all have met rank 0's (same kinds and sizes:
   * nothing but WEFT_DEBUG tells them apart); then its next collective, the
   * clip's all-reduce, finds no partner and times out. */
  if (st == WEFT_OK) st = weft_clip_grad_norm(D.model, 1.0, NULL);
  double dt = MPI_Wtime() - t0;
  const char *msg = weft_last_error();
  printf("[rank %d] skip backward, no debug: %s after %.1f s: %.200s\n", weft_worker_rank,
         weft_status_str(st), dt, msg);
  WCHECK(st == WEFT_ERR_TIMEOUT || st == WEFT_ERR_MPI || st == WEFT_ERR_MISMATCH,
         "rank %d: status %s: %s", weft_worker_rank, weft_status_str(st), msg);
  /* rank 0 waits inside its backward's collectives; rank 1 in the step
   * check at the start of its second forward */
  if (weft_worker_rank == 0)
    WCHECK(st == WEFT_ERR_TIMEOUT && strstr(msg, "weft_backward: ") &&
               strstr(msg, "did not complete within") && strstr(msg, "'dp'"),
           "rank 0: the timeout does not name the call, the collective and the mesh dim: %s", msg);
  else
    WCHECK(st == WEFT_ERR_TIMEOUT && strstr(msg, "weft_gpt2_loss: ") &&
               strstr(msg, "starts forward #2 (after 0 backwards)"),
           "rank 1: the timeout does not name the call, the forward and the backwards: %s", msg);
  WCHECK(dt < 3 * limit, "rank %d: took %.1f s with WEFT_TIMEOUT=%g", weft_worker_rank, dt, limit);
  /* only the local part of the teardown: the ranks no longer agree on
   * which collective comes next, so FSDP's and the mesh's (collective)
   * teardown would be one more mismatch */
  weft_graph_destroy(D.g);
  weft_dtensor_destroy(D.ids);
  weft_dtensor_destroy(D.tgt);
}

static const weft_worker_case cases[] = {
    {"skip_backward_debug", case_skip_backward_debug},
    {"skip_backward_timeout", case_skip_backward_timeout},
    {NULL, NULL},
};

int main(int argc, char **argv) { return weft_worker_main(argc, argv, cases); }
