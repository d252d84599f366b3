/* bench/fsdp.c — training steps of the reference model under weft's
 * parallelisms: one rank, FSDP (dp = ranks), TP (tp = ranks) and 2-D
 * (dp x tp), with the same global batch in every mode.
 *
 *     mpiexec -n R weft-bench-fsdp --config tiny|small --mode single|fsdp|tp|2d
 *                                  [--steps N] [--warmup W] [--dp D]
 *
 * Modes (R ranks): single (R = 1), fsdp (dp = R), tp (tp = R), 2d (dp = D,
 * default 2, tp = R / D; the torchtitan plan with sequence and loss
 * parallel). The model is built with shapes only, parallelised, then
 * initialised (deferred init: each rank allocates only its shards). Each
 * step: forward, backward, clip_grad_norm(1.0), AdamW (bench/step.c's
 * hyper-parameters), zero_grad. Each dp rank trains on its B / dp rows of
 * the global batch (B sequences of T tokens).
 *
 * Reported after W warmup steps, over N timed steps: tokens/s of the
 * global batch (B * T / the median step time, the slowest rank's), the
 * per-rank peak of weft's allocator over the whole run (weft_mem_get; the
 * largest rank) and the process's peak RSS (getrusage), and the bus bytes
 * per step on each mesh dim (weft_comm_stats, nccl-tests convention: what
 * one rank sends) split by collective. The last line of each run is
 * machine-readable for bench/fsdp.sh:
 *   RESULT config=.. mode=.. ranks=.. tokens_per_s=.. step_s=.. peak_bytes=..
 *          rss_bytes=.. loss=.. comm=<dim>:<ag>/<rs>/<ar>/<other>,...
 */
#include "bench_util.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "weft.h"

#define CHECK(x)                                                           \
  do {                                                                     \
    weft_status st_ = (x);                                                 \
    if (st_ != WEFT_OK) {                                                  \
      fprintf(stderr, "weft-bench-fsdp: %s: %s\n", #x, weft_last_error()); \
      exit(1);                                                             \
    }                                                                      \
  } while (0)

typedef struct bench_config {
  const char *name;
  int64_t D, L, H, Hkv, F, V, T, B;
} bench_config;

static const bench_config configs[] = {
    {"tiny", 256, 4, 8, 8, 688, 256, 256, 8},
    {"small", 768, 12, 12, 12, 2048, 8192, 512, 4},
};

static uint64_t splitmix64(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* Rows [row0, row0 + rows) of step `step`'s global batch. */
static void make_batch(const bench_config *c, int step, int64_t row0, int64_t rows, weft_tensor *in,
                       weft_tensor *tgt) {
  int32_t *a = in->data, *b = tgt->data;
  for (int64_t r = 0; r < rows; r++) {
    uint64_t s = 0x746f6b656e73ull ^ ((uint64_t)step << 32) ^ (uint64_t)(row0 + r);
    int32_t prev = (int32_t)(splitmix64(&s) % (uint64_t)c->V);
    for (int64_t t = 0; t < c->T; t++) {
      int32_t next = (int32_t)(splitmix64(&s) % (uint64_t)c->V);
      a[r * c->T + t] = prev;
      b[r * c->T + t] = next;
      prev = next;
    }
  }
}

static double max_over(weft_mesh *world, double v) {
  CHECK(weft_all_reduce(world, 0, &v, &v, 1, WEFT_F64, WEFT_OP_MAX, NULL));
  return v;
}

int main(int argc, char **argv) {
  const char *cname = "tiny", *mode = "fsdp";
  int steps = 3, warmup = 1, dp2 = 2;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--config") == 0 && i + 1 < argc)
      cname = argv[++i];
    else if (strcmp(argv[i], "--mode") == 0 && i + 1 < argc)
      mode = argv[++i];
    else if (strcmp(argv[i], "--steps") == 0 && i + 1 < argc)
      steps = atoi(argv[++i]);
    else if (strcmp(argv[i], "--warmup") == 0 && i + 1 < argc)
      warmup = atoi(argv[++i]);
    else if (strcmp(argv[i], "--dp") == 0 && i + 1 < argc)
      dp2 = atoi(argv[++i]);
    else {
      fprintf(stderr,
              "usage: weft-bench-fsdp --config tiny|small --mode single|fsdp|tp|2d "
              "[--steps N] [--warmup W] [--dp D]\n");
      return 2;
    }
  }
  const bench_config *c = NULL;
  for (size_t i = 0; i < sizeof configs / sizeof *configs; i++)
    if (strcmp(configs[i].name, cname) == 0) c = &configs[i];
  if (!c || steps < 1 || warmup < 0) {
    fprintf(stderr, "weft-bench-fsdp: unknown config '%s' or bad step counts\n", cname);
    return 2;
  }
  CHECK(weft_init(&argc, &argv));
  int R = weft_world_size(), me = weft_world_rank();
  int dp, tp;
  if (strcmp(mode, "single") == 0)
    dp = 1, tp = 1;
  else if (strcmp(mode, "fsdp") == 0)
    dp = R, tp = 1;
  else if (strcmp(mode, "tp") == 0)
    dp = 1, tp = R;
  else if (strcmp(mode, "2d") == 0)
    dp = dp2, tp = dp2 > 0 ? R / dp2 : 0;
  else
    dp = tp = 0;
  if (dp < 1 || tp < 1 || dp * tp != R || (strcmp(mode, "single") == 0 && R != 1) || c->B % dp) {
    if (me == 0)
      fprintf(stderr, "weft-bench-fsdp: mode %s does not fit %d ranks (B = %lld)\n", mode, R,
              (long long)c->B);
    weft_finalize();
    return 2;
  }
  /* meshes: root (dp, tp); the model computes on tp (a 1-rank mesh without TP) */
  int shape[2] = {dp, tp};
  const char *names[2] = {"dp", "tp"};
  weft_mesh *root, *dpm, *tpm;
  CHECK(weft_mesh_create(2, shape, names, &root));
  CHECK(weft_mesh_submesh(root, 1, &names[0], &dpm));
  CHECK(weft_mesh_submesh(root, 1, &names[1], &tpm));
  int wshape[1] = {R};
  const char *wname[1] = {"world"};
  weft_mesh *world;
  CHECK(weft_mesh_create(1, wshape, wname, &world));
  weft_llama_config lc = WEFT_LLAMA_CONFIG_INIT;
  lc.dim = c->D;
  lc.n_layers = c->L;
  lc.n_heads = c->H;
  lc.n_kv_heads = c->Hkv;
  lc.ffn_dim = c->F;
  lc.vocab = c->V;
  lc.max_seq_len = c->T;
  weft_module *model;
  CHECK(weft_llama_create(&lc, tpm, &model));
  weft_tp *tps = NULL;
  if (tp > 1) CHECK(weft_tp_apply_llama_plan(model, tpm, true, true, &tps));
  if (dp > 1) {
    weft_fsdp_options o = WEFT_FSDP_OPTIONS_INIT;
    for (int64_t i = 0; i < c->L; i++) {
      char n[32];
      weft_module *b;
      snprintf(n, sizeof n, "layers.%lld", (long long)i);
      CHECK(weft_module_find(model, n, &b));
      CHECK(weft_fully_shard(b, dpm, &o, NULL));
    }
    weft_module *last[2];
    CHECK(weft_module_find(model, "norm", &last[0]));
    CHECK(weft_module_find(model, "output", &last[1]));
    CHECK(weft_fully_shard_modules(last, 2, dpm, &o, NULL));
    CHECK(weft_fully_shard(model, dpm, &o, NULL));
  }
  CHECK(weft_module_init_weights(model, 1234));
  weft_adamw_params hp = {3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, false, false};
  weft_optimizer *opt;
  CHECK(weft_adamw_create(model, &hp, &opt));
  int64_t rows = c->B / dp, row0 = (int64_t)weft_mesh_coord(dpm, 0) * rows;
  int64_t bt[2] = {rows, c->T};
  weft_tensor *in, *tgt;
  CHECK(weft_tensor_create(WEFT_I32, WEFT_CPU, 2, bt, &in));
  CHECK(weft_tensor_create(WEFT_I32, WEFT_CPU, 2, bt, &tgt));
  double *times = calloc((size_t)steps, sizeof *times);
  weft_comm_count comm[2][WEFT_COLL_KIND_COUNT];
  memset(comm, 0, sizeof comm);
  double loss = 0;
  if (me == 0)
    printf(
        "weft %s, config %s (D=%lld L=%lld H=%lld F=%lld V=%lld T=%lld B=%lld), %d ranks "
        "(dp=%d x tp=%d), %d warmup + %d timed steps\n",
        mode, c->name, (long long)c->D, (long long)c->L, (long long)c->H, (long long)c->F,
        (long long)c->V, (long long)c->T, (long long)c->B, R, dp, tp, warmup, steps);
  for (int s = 0; s < warmup + steps; s++) {
    if (s == warmup) weft_comm_stats_reset(root);
    make_batch(c, s, row0, rows, in, tgt);
    CHECK(weft_barrier(world, 0, NULL));
    double t0 = bench_now_s(), norm;
    CHECK(weft_llama_forward(model, in, tgt, &loss));
    CHECK(weft_llama_backward(model));
    CHECK(weft_clip_grad_norm(model, 1.0, &norm));
    CHECK(weft_optimizer_step(opt));
    CHECK(weft_module_zero_grad(model, false));
    double dt = max_over(world, bench_now_s() - t0);
    if (s >= warmup) times[s - warmup] = dt;
    if (me == 0)
      printf("  step %d%s: %.3f s, loss %.5f, grad norm %.4f\n", s, s < warmup ? " (warmup)" : "",
             dt, loss, norm);
  }
  for (int d = 0; d < 2; d++)
    for (int k = 0; k < WEFT_COLL_KIND_COUNT; k++) comm[d][k] = weft_comm_stats(root, d, k);
  qsort(times, (size_t)steps, sizeof *times, bench_cmp_double);
  double med = steps % 2 ? times[steps / 2] : 0.5 * (times[steps / 2 - 1] + times[steps / 2]);
  double peak = max_over(world, (double)weft_mem_get(WEFT_CPU).peak_bytes);
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  double rss = max_over(world, (double)ru.ru_maxrss * 1024.0);
  double tok_s = (double)(c->B * c->T) / med;
  if (me == 0) {
    printf(
        "median step %.3f s -> %.0f tokens/s; per-rank peak: weft allocator %.1f MiB, RSS "
        "%.1f MiB\n",
        med, tok_s, peak / 1048576.0, rss / 1048576.0);
    char ctext[512];
    size_t len = 0;
    ctext[0] = '\0';
    for (int d = 0; d < 2; d++) {
      int64_t ag = comm[d][WEFT_COLL_ALL_GATHER].bus_bytes / steps,
              rs = comm[d][WEFT_COLL_REDUCE_SCATTER].bus_bytes / steps,
              ar = comm[d][WEFT_COLL_ALL_REDUCE].bus_bytes / steps, other = 0;
      for (int k = 0; k < WEFT_COLL_KIND_COUNT; k++)
        if (k != WEFT_COLL_ALL_GATHER && k != WEFT_COLL_REDUCE_SCATTER && k != WEFT_COLL_ALL_REDUCE)
          other += comm[d][k].bus_bytes / steps;
      printf(
          "  comm per step on %s (size %d): all-gather %.2f MB, reduce-scatter %.2f MB, "
          "all-reduce %.2f MB, other %.2f MB (bus bytes)\n",
          names[d], shape[d], ag * 1e-6, rs * 1e-6, ar * 1e-6, other * 1e-6);
      len += (size_t)snprintf(ctext + len, sizeof ctext - len, "%s%s:%lld/%lld/%lld/%lld",
                              d ? "," : "", names[d], (long long)ag, (long long)rs, (long long)ar,
                              (long long)other);
    }
    printf(
        "RESULT config=%s mode=%s ranks=%d tokens_per_s=%.3f step_s=%.6f peak_bytes=%.0f "
        "rss_bytes=%.0f loss=%.6f comm=%s\n",
        c->name, mode, R, tok_s, med, peak, rss, loss, ctext);
    fflush(stdout);
  }
  free(times);
  weft_tensor_destroy(in);
  weft_tensor_destroy(tgt);
  weft_optimizer_destroy(opt);
  CHECK(weft_fsdp_destroy_all(model));
  weft_tp_destroy(tps);
  CHECK(weft_module_destroy(model));
  CHECK(weft_mesh_destroy(world));
  CHECK(weft_mesh_destroy(tpm));
  CHECK(weft_mesh_destroy(dpm));
  CHECK(weft_mesh_destroy(root));
  CHECK(weft_finalize());
  return 0;
}
