/* bench/step.c — one training step on 1 rank: forward, backward,
 * clip_grad_norm(1.0), AdamW, zero_grad, timed by phase. Two models: the
 * reference Llama (nn.h's weft_llama_create: hand-written layers) and GPT-2
 * (models/gpt2: module kinds of its own whose forwards are ops in a graph).
 *
 *     weft-bench-step [tiny|small|gpt2-tiny|gpt2-small] [--steps N] [--warmup W]
 *                     [--seed S] [--dump FILE] [--serve]
 *
 * Configs (B sequences of T tokens):
 *   tiny        Llama  D=256 L=4  H=8  Hkv=8  F=688  V=256  T=256 B=8
 *   small       Llama  D=768 L=12 H=12 Hkv=12 F=2048 V=8192 T=512 B=4
 *   gpt2-tiny   GPT-2  D=256 L=4  H=8         F=1024 V=256  T=256 B=8
 *   gpt2-small  GPT-2  D=768 L=12 H=12        F=3072 V=8192 T=512 B=4
 * The GPT-2 configs have the Llama ones' sizes with GPT-2's MLP (F = 4 D,
 * two matrices instead of SwiGLU's three: about the same parameters),
 * LayerNorm with biases, biased linears, learned positions (P = T) and the
 * output layer tied to the token embedding; AdamW with nanoGPT's groups
 * (weight decay on matrices only, weft_gpt2_adamw_create). Each step runs in
 * a weft_graph (reset after the step, in the zero phase).
 *
 * Standalone it runs W warmup steps and N timed steps and prints the
 * median step time, tokens/s and the model FLOPs utilisation against the
 * OpenBLAS SGEMM rate measured in the same run (2048^3, the best of 3 runs
 * before and 3 after the steps: load from other processes only lowers it). Threads:
 * OPENBLAS_NUM_THREADS (GEMMs) and OMP_NUM_THREADS (weft's elementwise loops, when built with
 * OpenMP). The CPU time of each step (all threads) is printed too: with one thread it is the step
 * time less what other processes took.
 *
 * Model FLOPs per step (the PaLM / nanoGPT convention): 6 * P * B * T, with
 * P the parameters that take part in matrix products (every Linear,
 * including the output layer; not the embedding table, which is a lookup,
 * nor the norm weights), plus attention's score and value products:
 * forward 4 * T^2 * D per sequence and layer, times 3 for forward +
 * backward, halved for the causal mask: 12 * L * T^2 * D * B / 2.
 * Recomputation in backward (weft recomputes the probabilities) is not
 * counted.
 *
 * --dump FILE writes the initial weights (F32; torchtitan names, GPT-2:
 * nanoGPT names without the tied lm_head.weight) and the
 * tokens ("inputs", "targets": I32 [B, T]) as safetensors before the first
 * step, so that bench/step_torch.py can start PyTorch from the same state.
 * --serve then reads commands from stdin, one per line, and answers on
 * stdout (what bench/step_torch.py uses to interleave weft and torch steps
 * in one run, so that load from other processes hits both alike):
 *   step   -> "step <total s> <fwd> <bwd> <clip> <opt> <zero> <loss> <norm>"
 *   sgemm  -> "sgemm <GFLOP/s>" (one 2048^3 SGEMM)
 *   quit   -> exits
 * after printing "ready <matmul params> <model FLOPs per step>".
 */
#include "bench_util.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "autograd.h"
#include "backend.h"
#include "gpt2.h"
#include "nn.h"
#include "safetensors.h"

static double cpu_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#define CHECK(x)                                                           \
  do {                                                                     \
    weft_status st_ = (x);                                                 \
    if (st_ != WEFT_OK) {                                                  \
      fprintf(stderr, "weft-bench-step: %s: %s\n", #x, weft_last_error()); \
      exit(1);                                                             \
    }                                                                      \
  } while (0)

typedef struct bench_config {
  const char *name;
  bool gpt2; /* models/gpt2, else the Llama of nn.h */
  int64_t D, L, H, Hkv, F, V, T, B;
} bench_config;

static const bench_config configs[] = {
    {"tiny", false, 256, 4, 8, 8, 688, 256, 256, 8},
    {"small", false, 768, 12, 12, 12, 2048, 8192, 512, 4},
    {"gpt2-tiny", true, 256, 4, 8, 8, 1024, 256, 256, 8},
    {"gpt2-small", true, 768, 12, 12, 12, 3072, 8192, 512, 4},
};

/* Parameters in matrix products: per layer wq, wk, wv, wo, w1, w2, w3 (GPT-2:
 * c_attn (3D, D), attn.c_proj, c_fc, mlp.c_proj); the output layer (GPT-2:
 * the tied wte, counted once as the output layer's matrix). */
static double matmul_params(const bench_config *c) {
  double hd = (double)c->D / (double)c->H;
  double attn = 2.0 * c->D * c->H * hd + 2.0 * c->D * c->Hkv * hd;
  double ffn = (c->gpt2 ? 2.0 : 3.0) * c->D * c->F;
  return (double)c->L * (attn + ffn) + (double)c->V * c->D;
}

static double model_flops(const bench_config *c) {
  double tokens = (double)c->B * c->T;
  return 6.0 * matmul_params(c) * tokens + 12.0 * c->L * (double)c->T * c->T * c->D * c->B / 2.0;
}

/* ------------------------------------------------------------------ SGEMM */

typedef struct sgemm_bench {
  int64_t n;
  float *a, *b, *c;
} sgemm_bench;

static void sgemm_setup(sgemm_bench *s, int64_t n) {
  s->n = n;
  size_t bytes = sizeof(float) * (size_t)(n * n);
  s->a = malloc(bytes);
  s->b = malloc(bytes);
  s->c = malloc(bytes);
  if (!s->a || !s->b || !s->c) {
    fprintf(stderr, "weft-bench-step: out of memory for the SGEMM probe\n");
    exit(1);
  }
  for (int64_t i = 0; i < n * n; i++) {
    s->a[i] = (float)((i * 7919) % 1000) * 1e-3f - 0.5f;
    s->b[i] = (float)((i * 104729) % 1000) * 1e-3f - 0.5f;
    s->c[i] = 0.0f;
  }
}

/* GFLOP/s of one n^3 SGEMM (C = A B). */
static double sgemm_once(sgemm_bench *s) {
  double t0 = bench_now_s();
  (void)weft_backend_sgemm(WEFT_CPU, false, false, s->n, s->n, s->n, 1.0f, s->a, s->n, s->b, s->n,
                           0.0f, s->c, s->n);
  double dt = bench_now_s() - t0;
  return 2.0 * (double)s->n * s->n * s->n / dt * 1e-9;
}

static void sgemm_free(sgemm_bench *s) {
  free(s->a);
  free(s->b);
  free(s->c);
}

/* ------------------------------------------------------------------ model */

typedef struct bench {
  const bench_config *cfg;
  weft_mesh *mesh;
  weft_module *model;
  weft_optimizer *opt;
  weft_tensor *inputs, *targets;
  /* GPT-2 only: the graph of a step and the tokens as Replicate DTensors */
  weft_graph *graph;
  weft_dtensor *ids, *tgt;
} bench;

/* splitmix64: the token stream (any fixed sequence would do). */
static uint64_t splitmix64(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static void bench_setup(bench *b, const bench_config *c, uint64_t seed) {
  memset(b, 0, sizeof *b);
  b->cfg = c;
  int shape[1] = {1};
  const char *names[1] = {"model"};
  CHECK(weft_mesh_create(1, shape, names, &b->mesh));
  /* the same hyper-parameters on the torch side (bench/step_torch.py) */
  weft_adamw_params hp = {3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, false, false};
  if (c->gpt2) {
    weft_gpt2_config gc = WEFT_GPT2_CONFIG_INIT;
    gc.vocab = c->V;
    gc.max_seq_len = c->T;
    gc.dim = c->D;
    gc.n_layers = c->L;
    gc.n_heads = c->H;
    gc.ffn_dim = c->F;
    CHECK(weft_gpt2_create(&gc, b->mesh, &b->model));
    CHECK(weft_module_init_weights(b->model, seed));
    CHECK(weft_gpt2_adamw_create(b->model, &hp, &b->opt));
    CHECK(weft_graph_create(&b->graph));
  } else {
    weft_llama_config lc = WEFT_LLAMA_CONFIG_INIT;
    lc.dim = c->D;
    lc.n_layers = c->L;
    lc.n_heads = c->H;
    lc.n_kv_heads = c->Hkv;
    lc.ffn_dim = c->F;
    lc.vocab = c->V;
    lc.max_seq_len = c->T;
    CHECK(weft_llama_create(&lc, b->mesh, &b->model));
    CHECK(weft_module_init_weights(b->model, seed));
    CHECK(weft_adamw_create(b->model, &hp, &b->opt));
  }
  int64_t bt[2] = {c->B, c->T};
  CHECK(weft_tensor_create(WEFT_I32, WEFT_CPU, 2, bt, &b->inputs));
  CHECK(weft_tensor_create(WEFT_I32, WEFT_CPU, 2, bt, &b->targets));
  /* one stream of B*T + 1 tokens; targets are the inputs shifted by one */
  int64_t n = c->B * c->T;
  int32_t *stream = malloc(sizeof(int32_t) * (size_t)(n + 1));
  if (!stream) exit(1);
  uint64_t s = seed ^ 0x746f6b656e73ull;
  for (int64_t i = 0; i <= n; i++) stream[i] = (int32_t)(splitmix64(&s) % (uint64_t)c->V);
  memcpy(b->inputs->data, stream, sizeof(int32_t) * (size_t)n);
  memcpy(b->targets->data, stream + 1, sizeof(int32_t) * (size_t)n);
  free(stream);
  if (c->gpt2) {
    weft_placement rep = weft_replicate();
    CHECK(weft_dtensor_distribute(b->mesh, b->inputs, WEFT_DTENSOR_ALL_RANKS, &rep, 1, &b->ids));
    CHECK(weft_dtensor_distribute(b->mesh, b->targets, WEFT_DTENSOR_ALL_RANKS, &rep, 1, &b->tgt));
  }
}

static void bench_dump(const bench *b, const char *path) {
  int count;
  CHECK(weft_module_parameters(b->model, NULL, 0, &count));
  weft_param **ps = malloc(sizeof *ps * (size_t)count);
  weft_safetensors_entry *e = malloc(sizeof *e * (size_t)(count + 2));
  if (!ps || !e) exit(1);
  CHECK(weft_module_parameters(b->model, ps, count, &count));
  for (int i = 0; i < count; i++) {
    const weft_tensor *l = weft_dtensor_local(ps[i]->data);
    e[i] = (weft_safetensors_entry){ps[i]->fqn, WEFT_F32, l->ndim, l->shape, l->data};
  }
  e[count] = (weft_safetensors_entry){"inputs", WEFT_I32, 2, b->inputs->shape, b->inputs->data};
  e[count + 1] =
      (weft_safetensors_entry){"targets", WEFT_I32, 2, b->targets->shape, b->targets->data};
  CHECK(weft_safetensors_write(path, e, count + 2, NULL));
  free(e);
  free(ps);
}

/* One step; t[0] total, t[1..5] forward, backward, clip, optimizer, zero_grad
 * (GPT-2: and the graph's reset). */
static void bench_step(bench *b, double t[6], double *loss, double *norm) {
  double t0 = bench_now_s();
  weft_var *lv = NULL;
  if (b->cfg->gpt2) {
    CHECK(weft_gpt2_loss(b->model, b->graph, b->ids, b->tgt, &lv, NULL));
    *loss = weft_var_item(lv);
  } else {
    CHECK(weft_llama_forward(b->model, b->inputs, b->targets, loss));
  }
  double t1 = bench_now_s();
  CHECK(b->cfg->gpt2 ? weft_backward(lv) : weft_llama_backward(b->model));
  double t2 = bench_now_s();
  CHECK(weft_clip_grad_norm(b->model, 1.0, norm));
  double t3 = bench_now_s();
  CHECK(weft_optimizer_step(b->opt));
  double t4 = bench_now_s();
  CHECK(weft_module_zero_grad(b->model, false));
  if (b->cfg->gpt2) CHECK(weft_graph_reset(b->graph));
  double t5 = bench_now_s();
  t[0] = t5 - t0;
  t[1] = t1 - t0;
  t[2] = t2 - t1;
  t[3] = t3 - t2;
  t[4] = t4 - t3;
  t[5] = t5 - t4;
}

static void bench_free(bench *b) {
  weft_graph_destroy(b->graph);
  weft_dtensor_destroy(b->ids);
  weft_dtensor_destroy(b->tgt);
  weft_optimizer_destroy(b->opt);
  weft_module_destroy(b->model);
  weft_tensor_destroy(b->inputs);
  weft_tensor_destroy(b->targets);
  weft_mesh_destroy(b->mesh);
}

/* ------------------------------------------------------------------- main */

static int serve(bench *b, sgemm_bench *sg) {
  printf("ready %.0f %.6e\n", matmul_params(b->cfg), model_flops(b->cfg));
  fflush(stdout);
  char line[64];
  while (fgets(line, sizeof line, stdin)) {
    if (strncmp(line, "step", 4) == 0) {
      double t[6], loss, norm;
      bench_step(b, t, &loss, &norm);
      printf("step %.6f %.6f %.6f %.6f %.6f %.6f %.9g %.9g\n", t[0], t[1], t[2], t[3], t[4], t[5],
             loss, norm);
    } else if (strncmp(line, "sgemm", 5) == 0) {
      printf("sgemm %.3f\n", sgemm_once(sg));
    } else if (strncmp(line, "quit", 4) == 0) {
      break;
    } else {
      printf("error unknown command\n");
    }
    fflush(stdout);
  }
  return 0;
}

static void usage(void) {
  fprintf(stderr,
          "usage: weft-bench-step [tiny|small|gpt2-tiny|gpt2-small] [--steps N] [--warmup W] "
          "[--seed S] [--dump FILE] [--serve]\n");
  exit(2);
}

int main(int argc, char **argv) {
  const bench_config *cfg = &configs[0];
  int steps = 5, warmup = 1;
  uint64_t seed = 1234;
  const char *dump = NULL;
  bool serve_mode = false;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--steps") == 0 && i + 1 < argc)
      steps = atoi(argv[++i]);
    else if (strcmp(a, "--warmup") == 0 && i + 1 < argc)
      warmup = atoi(argv[++i]);
    else if (strcmp(a, "--seed") == 0 && i + 1 < argc)
      seed = strtoull(argv[++i], NULL, 10);
    else if (strcmp(a, "--dump") == 0 && i + 1 < argc)
      dump = argv[++i];
    else if (strcmp(a, "--serve") == 0)
      serve_mode = true;
    else {
      bool found = false;
      for (size_t k = 0; k < sizeof configs / sizeof configs[0]; k++)
        if (strcmp(a, configs[k].name) == 0) {
          cfg = &configs[k];
          found = true;
        }
      if (!found) usage();
    }
  }
  if (steps < 1 || warmup < 0) usage();
  CHECK(weft_init(&argc, &argv));
  bench b;
  bench_setup(&b, cfg, seed);
  if (dump) bench_dump(&b, dump);
  sgemm_bench sg;
  sgemm_setup(&sg, 2048);
  int rc = 0;
  if (serve_mode) {
    rc = serve(&b, &sg);
  } else {
    const char *bt = getenv("OPENBLAS_NUM_THREADS");
    printf(
        "weft step, config %s (%s D=%lld L=%lld H=%lld Hkv=%lld F=%lld V=%lld T=%lld B=%lld), "
        "OPENBLAS_NUM_THREADS=%s\n",
        cfg->name, cfg->gpt2 ? "GPT-2" : "Llama", (long long)cfg->D, (long long)cfg->L,
        (long long)cfg->H, (long long)cfg->Hkv, (long long)cfg->F, (long long)cfg->V,
        (long long)cfg->T, (long long)cfg->B, bt ? bt : "(unset)");
    double gf[6];
    for (int i = 0; i < 3; i++) gf[i] = sgemm_once(&sg);
    double *ts = calloc((size_t)steps * 7, sizeof(double));
    if (!ts) return 1;
    for (int i = 0; i < warmup + steps; i++) {
      double t[6], loss, norm;
      double c0 = cpu_s();
      bench_step(&b, t, &loss, &norm);
      double cpu = cpu_s() - c0;
      printf(
          "  step %d%s: %.1f ms (fwd %.1f bwd %.1f clip %.1f adamw %.1f zero %.1f; CPU time "
          "%.1f ms) loss %.6f norm %.4f\n",
          i, i < warmup ? " (warmup)" : "", t[0] * 1e3, t[1] * 1e3, t[2] * 1e3, t[3] * 1e3,
          t[4] * 1e3, t[5] * 1e3, cpu * 1e3, loss, norm);
      if (i >= warmup) {
        for (int k = 0; k < 6; k++) ts[k * steps + (i - warmup)] = t[k];
        ts[6 * steps + (i - warmup)] = cpu;
      }
    }
    for (int i = 3; i < 6; i++) gf[i] = sgemm_once(&sg);
    double med = bench_median(ts, steps), sgemm = gf[0];
    for (int i = 1; i < 6; i++) sgemm = gf[i] > sgemm ? gf[i] : sgemm; /* load only lowers it */
    double flops = model_flops(cfg), tokens = (double)cfg->B * cfg->T;
    printf(
        "median step %.1f ms (fwd %.1f bwd %.1f clip %.1f adamw %.1f zero %.1f; CPU time "
        "%.1f ms); %.0f tokens/s\n",
        med * 1e3, bench_median(ts + steps, steps) * 1e3, bench_median(ts + 2 * steps, steps) * 1e3,
        bench_median(ts + 3 * steps, steps) * 1e3, bench_median(ts + 4 * steps, steps) * 1e3,
        bench_median(ts + 5 * steps, steps) * 1e3, bench_median(ts + 6 * steps, steps) * 1e3,
        tokens / med);
    printf("model %.3f GFLOP/step -> %.1f GFLOP/s; SGEMM 2048^3 (best) %.1f GFLOP/s; MFU %.1f%%\n",
           flops * 1e-9, flops / med * 1e-9, sgemm, 100.0 * flops / med * 1e-9 / sgemm);
    free(ts);
  }
  sgemm_free(&sg);
  bench_free(&b);
  weft_finalize();
  return rc;
}
