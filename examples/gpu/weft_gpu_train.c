/* weft-gpu-train: trains the reference model on the CUDA backend (one GPU
 * per rank; several ranks form a 1-D data-parallel mesh "dp").
 *
 *     weft-gpu-train --config gpt2s --steps 20 --precision bf16
 *     weft-gpu-train --golden tests/data/golden/tiny_gqa      # parity check
 *     mpiexec -n 2 weft-gpu-train --config gpt2s --batch 16   # data parallel
 *     weft-gpu-train --help
 *
 * --golden DIR loads the config, hyper-parameters, init weights and batch of
 * a golden folder (tests/data/golden/README.md), runs one step and compares
 * with PyTorch's float64 results: loss (1e-6 relative), every gradient
 * (1e-5 relative by norm), the gradient norm (1e-5) and the AdamW update
 * after - init (1e-3); beyond any of them it exits 1. Golden checks are f32
 * mode only.
 *
 * Timing: CUDA events on the compute stream around each step (forward,
 * backward, dp all-reduce, clip, AdamW), the slowest rank's time; steps after
 * --warmup are averaged. MFU = model FLOPs per second (gpu_model_step_flops:
 * 6 (P - embedding) tokens + 6 L B T^2 D, llm.c's causal-halved attention
 * term) over 989e12 (H200 dense bf16 peak) times the GPUs in use. The last
 * line is machine-readable:
 *   RESULT config=... precision=... dp=... tokens_per_s=... mfu=... step_ms=...
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda.h"
#include "gpu_golden.h"
#include "gpu_model.h"
#include "safetensors.h"

#define PEAK_FLOPS 989e12 /* H200 SXM dense bf16 tensor-core peak */

typedef struct opts {
  const char *config;
  const char *golden;
  long steps, warmup;
  long batch; /* 0: the config's */
  const char *precision;
  unsigned long long seed;
  double lr, clip, wd;
} opts;

static void usage(FILE *f) {
  fprintf(f,
          "usage: weft-gpu-train [options]\n"
          "  --config NAME       tiny_mha | tiny_gqa | gpt2s (default gpt2s)\n"
          "  --golden DIR        config, weights and batch from a golden folder; check one\n"
          "                      step against it (f32 only), exit 1 beyond tolerance\n"
          "  --steps N           timed steps (default 10; with --golden 0)\n"
          "  --warmup N          untimed steps first (default 2; with --golden 0)\n"
          "  --batch B           global batch (sequences per step; default the config's)\n"
          "  --precision P       f32 | tf32 | bf16 matmuls (default f32)\n"
          "  --seed N            weight init and batch seed (default 1234)\n"
          "  --lr X --clip X --weight-decay X   AdamW (3e-4, 1.0, 0.1; golden: its own)\n"
          "Under mpiexec -n K the K ranks train data-parallel (B %% K == 0).\n");
}

static bool parse_long(const char *s, long *out) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || *end || end == s || v < 0) return false;
  *out = v;
  return true;
}
static bool parse_double(const char *s, double *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || *end || end == s || !isfinite(v)) return false;
  *out = v;
  return true;
}

/* 0: ok, 1: --help printed, -1: error (printed) */
static int parse_args(int argc, char **argv, opts *o, bool print) {
  *o = (opts){.config = "gpt2s",
              .steps = -1,
              .warmup = -1,
              .precision = "f32",
              .seed = 1234,
              .lr = 3e-4,
              .clip = 1.0,
              .wd = 0.1};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      if (print) usage(stdout);
      return 1;
    }
    if (i + 1 >= argc) {
      if (print) fprintf(stderr, "weft-gpu-train: error: %s needs a value (or is unknown)\n", a);
      return -1;
    }
    const char *v = argv[++i];
    long n;
    double d;
    bool ok = true;
    if (!strcmp(a, "--config"))
      o->config = v;
    else if (!strcmp(a, "--golden"))
      o->golden = v;
    else if (!strcmp(a, "--precision"))
      o->precision = v;
    else if (!strcmp(a, "--steps"))
      ok = parse_long(v, &o->steps);
    else if (!strcmp(a, "--warmup"))
      ok = parse_long(v, &o->warmup);
    else if (!strcmp(a, "--batch"))
      ok = parse_long(v, &o->batch) && o->batch > 0;
    else if (!strcmp(a, "--seed"))
      ok = parse_long(v, &n) && ((o->seed = (unsigned long long)n), 1);
    else if (!strcmp(a, "--lr"))
      ok = parse_double(v, &o->lr);
    else if (!strcmp(a, "--clip"))
      ok = parse_double(v, &o->clip);
    else if (!strcmp(a, "--weight-decay"))
      ok = parse_double(v, &d) && ((o->wd = d), 1);
    else {
      if (print) fprintf(stderr, "weft-gpu-train: error: unknown option %s (see --help)\n", a);
      return -1;
    }
    if (!ok) {
      if (print) fprintf(stderr, "weft-gpu-train: error: bad value '%s' for %s\n", v, a);
      return -1;
    }
  }
  if (o->steps < 0) o->steps = o->golden ? 0 : 10;
  if (o->warmup < 0) o->warmup = o->golden ? 0 : 2;
  return 0;
}

/* ------------------------------------------------------------ golden data */

/* Reads tensor i of the model from f as f64 into *buf (grown as needed). */
static weft_status read_ref(weft_safetensors *f, const gpu_model *m, int i, double **buf) {
  int64_t n = gpu_model_tensor_numel(m, i);
  double *nb = realloc(*buf, (size_t)n * sizeof **buf);
  if (!nb) return weft_error(WEFT_ERR_OOM, "reference buffer");
  *buf = nb;
  return weft_safetensors_read(f, gpu_model_tensor_name(m, i), WEFT_F64, *buf, n);
}

/* One step of the golden check; *bad counts the tolerances exceeded. */
static weft_status golden_step(gpu_model *m, const char *dir, const gpu_golden *g, bool print,
                               int *bad) {
  char path[1100];
  const int np = gpu_model_num_tensors(m);
  int64_t maxn = 0;
  for (int i = 0; i < np; i++)
    if (gpu_model_tensor_numel(m, i) > maxn) maxn = gpu_model_tensor_numel(m, i);
  float *got = malloc((size_t)maxn * sizeof *got);
  float **init = calloc((size_t)np, sizeof *init);
  double *ref = NULL;
  weft_safetensors *f = NULL;
  weft_status st = WEFT_OK;
  if (!got || !init) {
    st = weft_error(WEFT_ERR_OOM, "golden buffers");
    goto out;
  }
  for (int i = 0; i < np; i++) {
    init[i] = malloc((size_t)gpu_model_tensor_numel(m, i) * sizeof **init);
    if (!init[i]) {
      st = weft_error(WEFT_ERR_OOM, "golden buffers");
      goto out;
    }
    WEFT_CHECK_GOTO(gpu_model_read_param(m, i, init[i]), st, out);
  }
  double loss;
  WEFT_CHECK_GOTO(gpu_model_forward(m, &loss), st, out);
  const double lerr = fabs(loss - g->loss) / fabs(g->loss);
  *bad += lerr > 1e-6;
  if (print)
    printf("golden loss %.10f  expected %.10f  rel err %.2e  (tol 1e-6)%s\n", loss, g->loss, lerr,
           lerr > 1e-6 ? "  FAIL" : "");
  WEFT_CHECK_GOTO(gpu_model_backward(m), st, out);
  snprintf(path, sizeof path, "%s/grads.safetensors", dir);
  WEFT_CHECK_GOTO(weft_safetensors_open(path, &f), st, out);
  double worst = 0;
  int worst_i = 0;
  for (int i = 0; i < np; i++) {
    WEFT_CHECK_GOTO(gpu_model_read_grad(m, i, got), st, out);
    WEFT_CHECK_GOTO(read_ref(f, m, i, &ref), st, out);
    double r = gpu_golden_rel_err(got, ref, NULL, gpu_model_tensor_numel(m, i));
    if (r > 1e-5) {
      (*bad)++;
      if (print)
        printf("golden grad %s: rel err %.2e > 1e-5  FAIL\n", gpu_model_tensor_name(m, i), r);
    }
    if (r > worst) {
      worst = r;
      worst_i = i;
    }
  }
  weft_safetensors_close(f);
  f = NULL;
  if (print)
    printf("golden grads: worst rel err %.2e (%s) over %d tensors  (tol 1e-5)\n", worst,
           gpu_model_tensor_name(m, worst_i), np);
  double norm;
  WEFT_CHECK_GOTO(gpu_model_clip_grads(m, g->clip, &norm), st, out);
  const double nerr = fabs(norm - g->grad_norm) / g->grad_norm;
  *bad += nerr > 1e-5;
  if (print)
    printf("golden grad norm %.10f  expected %.10f  rel err %.2e  (tol 1e-5)%s\n", norm,
           g->grad_norm, nerr, nerr > 1e-5 ? "  FAIL" : "");
  WEFT_CHECK_GOTO(gpu_model_adamw_step(m, &g->hp), st, out);
  snprintf(path, sizeof path, "%s/after_step.safetensors", dir);
  WEFT_CHECK_GOTO(weft_safetensors_open(path, &f), st, out);
  double worst_u = 0;
  int worst_ui = 0;
  for (int i = 0; i < np; i++) {
    WEFT_CHECK_GOTO(gpu_model_read_param(m, i, got), st, out);
    WEFT_CHECK_GOTO(read_ref(f, m, i, &ref), st, out);
    double r = gpu_golden_rel_err(got, ref, init[i], gpu_model_tensor_numel(m, i));
    if (r > 1e-3) {
      (*bad)++;
      if (print)
        printf("golden AdamW update %s: rel err %.2e > 1e-3  FAIL\n", gpu_model_tensor_name(m, i),
               r);
    }
    if (r > worst_u) {
      worst_u = r;
      worst_ui = i;
    }
  }
  if (print)
    printf("golden AdamW update: worst rel err %.2e (%s)  (tol 1e-3)\n", worst_u,
           gpu_model_tensor_name(m, worst_ui));
out:
  weft_safetensors_close(f);
  free(ref);
  free(got);
  if (init)
    for (int i = 0; i < np; i++) free(init[i]);
  free(init);
  return st;
}

/* ------------------------------------------------------------------- main */

static void fail_msg(const char *what) {
  fprintf(stderr, "weft-gpu-train: error: %s: %s\n", what, weft_last_error());
  fflush(stderr);
}

static weft_status timed_step(gpu_model *m, const weft_adamw_params *hp, double clip, double *loss,
                              double *norm, float *ms) {
  weft_event *e0 = NULL, *e1 = NULL;
  weft_status st = WEFT_OK;
  WEFT_CHECK_GOTO(weft_event_record(WEFT_CUDA, WEFT_STREAM_COMPUTE, &e0), st, out);
  WEFT_CHECK_GOTO(gpu_model_train_step(m, hp, clip, loss, norm), st, out);
  WEFT_CHECK_GOTO(weft_event_record(WEFT_CUDA, WEFT_STREAM_COMPUTE, &e1), st, out);
  WEFT_CHECK_GOTO(weft_event_synchronize(WEFT_CUDA, e1), st, out);
  WEFT_CHECK_GOTO(weft_event_elapsed_ms(WEFT_CUDA, e0, e1, ms), st, out);
out:
  weft_event_destroy(WEFT_CUDA, e0);
  weft_event_destroy(WEFT_CUDA, e1);
  return st;
}

int main(int argc, char **argv) {
  if (weft_init(&argc, &argv) != WEFT_OK) {
    fail_msg("weft_init");
    return 1;
  }
  const int rank = weft_world_rank(), world = weft_world_size();
  const bool print = rank == 0;
  opts o;
  int p = parse_args(argc, argv, &o, print);
  if (p != 0) {
    weft_finalize();
    return p > 0 ? 0 : 2;
  }
  int rc = 1;
  weft_mesh *mesh = NULL;
  gpu_model *m = NULL;
  gpu_golden g = {0};
  int32_t *inp = NULL, *tgt = NULL;
  gpu_model_config cfg;
  weft_adamw_params hp = {
      .lr = (float)o.lr, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = (float)o.wd};
  double clip = o.clip;
  weft_matmul_precision prec;
  if (!strcmp(o.precision, "f32"))
    prec = WEFT_MATMUL_F32;
  else if (!strcmp(o.precision, "tf32"))
    prec = WEFT_MATMUL_TF32;
  else if (!strcmp(o.precision, "bf16"))
    prec = WEFT_MATMUL_BF16;
  else {
    if (print)
      fprintf(stderr, "weft-gpu-train: error: --precision %s: f32, tf32 or bf16\n", o.precision);
    rc = 2;
    goto done;
  }
  if (o.golden && prec != WEFT_MATMUL_F32) {
    if (print) fprintf(stderr, "weft-gpu-train: error: --golden checks f32 mode only\n");
    rc = 2;
    goto done;
  }

  int dev = -1;
  weft_status st = weft_cuda_init(weft_local_rank(), &dev);
  if (st != WEFT_OK) {
    if (print)
      fprintf(stderr, "weft-gpu-train: error: %s: %s\n",
              st == WEFT_ERR_UNSUPPORTED ? "this build has no CUDA backend"
                                         : "cannot start the CUDA backend",
              weft_last_error());
    goto done;
  }
  if (weft_cuda_set_matmul_precision(prec) != WEFT_OK && prec != WEFT_MATMUL_F32 && print)
    fprintf(stderr, "weft-gpu-train: warning: %s\n", weft_last_error());

  if (world > 1) {
    const char *names[1] = {"dp"};
    if (weft_mesh_create(1, &world, names, &mesh) != WEFT_OK) {
      fail_msg("mesh");
      goto done;
    }
  }
  if (o.golden) {
    if (gpu_golden_load(o.golden, &g) != WEFT_OK) {
      fail_msg("--golden");
      goto done;
    }
    cfg = g.cfg;
    hp = g.hp;
    clip = g.clip;
    inp = g.inp;
    tgt = g.tgt;
  } else {
    if (gpu_model_config_preset(o.config, &cfg) != WEFT_OK) {
      fail_msg("--config");
      rc = 2;
      goto done;
    }
    if (o.batch) cfg.B = o.batch;
  }
  if (gpu_model_create(&cfg, mesh, 0, &m) != WEFT_OK) {
    fail_msg("model");
    goto done;
  }
  if (o.golden) {
    char path[1100];
    snprintf(path, sizeof path, "%s/init.safetensors", o.golden);
    if (gpu_model_load_safetensors(m, path) != WEFT_OK) {
      fail_msg("--golden weights");
      goto done;
    }
  } else {
    if (gpu_model_init_weights(m, o.seed) != WEFT_OK) {
      fail_msg("init");
      goto done;
    }
    /* one fixed random batch (same on every rank; each takes its slice):
     * tokens uniform in [0, V) from Philox(seed), targets shifted by one */
    const int64_t n = cfg.B * cfg.T;
    inp = malloc((size_t)n * sizeof *inp);
    tgt = malloc((size_t)n * sizeof *tgt);
    if (!inp || !tgt) {
      fprintf(stderr, "weft-gpu-train: error: out of host memory for the batch\n");
      goto done;
    }
    for (int64_t i = 0; i <= n; i++) {
      uint32_t r[4];
      weft_philox4x32((uint64_t)i, 0x70c5, o.seed, r);
      int32_t tok = (int32_t)(r[0] % (uint32_t)cfg.V);
      if (i < n) inp[i] = tok;
      if (i > 0) tgt[i - 1] = tok;
    }
  }
  if (gpu_model_set_batch(m, inp, tgt) != WEFT_OK) {
    fail_msg("batch");
    goto done;
  }
  const int64_t tokens = cfg.B * cfg.T;
  const double flops = gpu_model_step_flops(&cfg, tokens);
  int gpus = weft_cuda_device_count();
  int per_node = weft_local_size() < gpus ? weft_local_size() : gpus;
  int ngpus = world / weft_local_size() * (per_node > 0 ? per_node : 1);
  if (ngpus < 1) ngpus = 1;
  if (print) {
    printf(
        "weft-gpu-train: %s D=%lld L=%lld H=%lld Hkv=%lld F=%lld V=%lld T=%lld B=%lld "
        "(%lld per rank), %lld params, dp=%d on %d GPU(s), precision %s\n",
        o.golden ? o.golden : o.config, (long long)cfg.D, (long long)cfg.L, (long long)cfg.H,
        (long long)cfg.Hkv, (long long)cfg.F, (long long)cfg.V, (long long)cfg.T, (long long)cfg.B,
        (long long)gpu_model_local_batch(m), (long long)gpu_model_param_count(m), world, ngpus,
        o.precision);
    printf("FLOPs/step %.4e (6 (P - embedding) tokens + 6 L B T^2 D)\n", flops);
    fflush(stdout);
  }

  int bad = 0;
  if (o.golden) {
    if (golden_step(m, o.golden, &g, print, &bad) != WEFT_OK) {
      fail_msg("golden step");
      goto done;
    }
    if (print) printf("golden: %s (%d check(s) beyond tolerance)\n", bad ? "FAIL" : "PASS", bad);
  }

  double sum_ms = 0, first_loss = NAN, last_loss = NAN;
  long timed = 0;
  for (long s = 0; s < o.warmup + o.steps; s++) {
    double loss, norm;
    float ms;
    if (timed_step(m, &hp, clip, &loss, &norm, &ms) != WEFT_OK) {
      fail_msg("step");
      goto done;
    }
    double dms = ms;
    if (mesh && weft_all_reduce(mesh, 0, &dms, &dms, 1, WEFT_F64, WEFT_OP_MAX, NULL) != WEFT_OK) {
      fail_msg("step time");
      goto done;
    }
    if (s == 0) first_loss = loss;
    last_loss = loss;
    const bool warm = s < o.warmup;
    if (!warm) {
      sum_ms += dms;
      timed++;
    }
    if (print) {
      printf("step %4ld  loss %.6f  grad norm %.4f  %8.3f ms  %10.0f tok/s  mfu %5.2f%%%s\n", s + 1,
             loss, norm, dms, tokens / (dms * 1e-3),
             100.0 * flops / (dms * 1e-3) / (PEAK_FLOPS * ngpus), warm ? "  (warmup)" : "");
      fflush(stdout);
    }
  }
  if (print && timed > 0) {
    const double step_ms = sum_ms / (double)timed, tps = tokens / (step_ms * 1e-3),
                 mfu = flops / (step_ms * 1e-3) / (PEAK_FLOPS * ngpus);
    printf(
        "RESULT config=%s precision=%s dp=%d gpus=%d batch=%lld seq=%lld steps=%ld "
        "step_ms=%.3f tokens_per_s=%.0f mfu=%.4f first_loss=%.6f last_loss=%.6f\n",
        o.golden ? "golden" : o.config, o.precision, world, ngpus, (long long)cfg.B,
        (long long)cfg.T, timed, step_ms, tps, mfu, first_loss, last_loss);
  }
  if (print && o.golden) printf("RESULT golden=%s bad=%d\n", bad ? "FAIL" : "PASS", bad);
  rc = bad ? 1 : 0;
done:
  fflush(stdout);
  gpu_model_destroy(m);
  if (!o.golden) {
    free(inp);
    free(tgt);
  }
  gpu_golden_free(&g);
  if (mesh) weft_mesh_destroy(mesh);
  weft_cuda_shutdown();
  weft_finalize();
  return rc;
}
