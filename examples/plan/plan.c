/* weft-plan: mesh-topology experiments. For a model, a global batch and a
 * cluster, enumerates every factorisation of the world into
 * dp_replicate x dp_shard x tp and predicts, per rank, memory (parameters,
 * gradients, optimizer state, FSDP's unsharded buffers, activations) and,
 * per step, communication (bytes, calls and time per mesh dim) from the
 * collectives FSDP and TP issue, then a step time; prints them ranked.
 *
 *     weft-plan --model llama70b --nodes 128 --gpus-per-node 8 --batch 1024
 *     mpiexec -n 4 weft-plan --validate          # runs the fitting meshes here
 *
 * --validate runs weft-train's very step (examples/train/, linked
 * in) on every factorisation that fits this world and compares: predicted
 * communication bytes must equal the measured accounting exactly (per mesh
 * dim and collective), predicted memory within 10% of the measured peak.
 *
 * The model of a step (per micro-batch; N = B/dp * T tokens on a rank, t =
 * tp, S = dp_shard, R = dp_replicate, f32 activations, payloads as mesh.h
 * counts them: all-gather output, reduce-scatter input, all-reduce buffer):
 *   TP without sequence parallel (torchtitan's plan, tp.h):
 *     forward  all-reduce N*D: tok_embeddings (rowwise) + 2 per block (wo, w2)
 *     backward all-reduce N*D: 2 per block (the colwise inputs' grads),
 *              all-reduce D for each norm weight grad (2 per block + final)
 *   TP with sequence parallel:
 *     forward  reduce-scatter N*D: embeddings + wo, w2 per block; all-gather
 *              N*D: attention and feed-forward inputs per block + output's input
 *     backward the mirror (every all-gather becomes a reduce-scatter and the
 *              other way round) + the norm weight grads' all-reduces of D
 *   loss parallel: all-reduce (max) of N floats, all-reduce (sum) of 2N;
 *   without it: all-gather of the logits N*V.
 *   FSDP, per group (each block, [norm, output], the root = tok_embeddings):
 *     all-gather of the group's padded flat buffer (param dtype) in forward,
 *     again in backward for groups resharded after forward (not the root),
 *     reduce-scatter of the grads (reduce dtype) once per step, and with
 *     HSDP an all-reduce of the reduced shard over dp_replicate.
 *   grad clipping: one all-reduce of one double per (placement group,
 *     sharded mesh dim) (nn's clip_grad_norm).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "train.h"

typedef struct cluster {
  int nodes, gpn;
  double intra_bw, inter_bw;   /* bytes/s per rank (bus bandwidth) */
  double intra_lat, inter_lat; /* s */
  double mem;                  /* bytes per device */
  double flops;                /* FLOP/s per device (achievable) */
} cluster;

typedef struct plan_opts {
  weft_llama_config m;
  char model_name[32];
  int64_t batch, grad_accum;
  cluster c;
  bool sp, lp, bf16, tp_across, validate, all;
  int raf;
  int top;
  int64_t steps;
} plan_opts;

/* One factorisation and its predictions. */
typedef struct config {
  int rep, shard, tp;
  bool valid;
  char why[96];
  /* memory per rank, bytes */
  double m_params, m_grads, m_optim, m_unsharded, m_act, m_total;
  bool fits;
  /* comm per step: bytes and calls per (dim: 0 rep, 1 shard, 2 tp; kind) */
  double bytes[3][WEFT_COLL_KIND_COUNT];
  double calls[3][WEFT_COLL_KIND_COUNT];
  double t_comm[3], t_compute, t_step;
} config;

static const char *const DIMN[3] = {"dp_replicate", "dp_shard", "tp"};

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* torch.chunk: rows of chunk 0 (the largest) of n split k ways. */
static int64_t chunk0(int64_t n, int64_t k) { return cdiv(n, k); }

/* A parameter's tp-local shape (rank 0, the largest shard). */
typedef struct pshape {
  int64_t rows, cols;
} pshape;

/* tp placement of each parameter in torchtitan's plan: 0 replicate,
 * 1 Shard(0), 2 Shard(1). */
static pshape tp_local(int64_t r, int64_t c, int how, int t) {
  pshape p = {r, c};
  if (how == 1) p.rows = chunk0(r, t);
  if (how == 2) p.cols = chunk0(c, t);
  return p;
}

/* FSDP group sizes: tp-local numel and padded per-rank numel. */
typedef struct group {
  double numel, padded;
} group;

static void add_param(group *g, pshape p, int S) {
  g->numel += (double)p.rows * (double)p.cols;
  g->padded += (double)chunk0(p.rows, S) * (double)p.cols;
}

static void predict(const plan_opts *o, config *k) {
  const weft_llama_config *m = &o->m;
  int t = k->tp, S = k->shard, R = k->rep;
  int dp = S * R;
  int64_t D = m->dim, F = m->ffn_dim, V = m->vocab, T = m->max_seq_len, L = m->n_layers;
  int64_t hd = D / m->n_heads, H = m->n_heads, Hk = m->n_kv_heads;
  memset(k->bytes, 0, sizeof k->bytes);
  memset(k->calls, 0, sizeof k->calls);
  k->valid = true;
  k->why[0] = 0;
  if (t > 1 && (H % t || Hk % t)) {
    k->valid = false;
    snprintf(k->why, sizeof k->why, "heads %lld/%lld not divisible by tp", (long long)H,
             (long long)Hk);
  } else if (o->batch % dp) {
    k->valid = false;
    snprintf(k->why, sizeof k->why, "batch %lld not divisible by dp %d", (long long)o->batch, dp);
  } else if (o->sp && t > 1 && T % t) {
    k->valid = false;
    snprintf(k->why, sizeof k->why, "seq-len not divisible by tp (SP)");
  }
  double N = (double)(o->batch / (dp ? dp : 1)) * (double)T; /* tokens per rank per micro-batch */
  double acc = (double)o->grad_accum;
  /* --- parameters: tp-local shapes and FSDP groups */
  bool fsdp = dp > 1;
  int Sg = fsdp ? S : 1;
  group blk = {0, 0}, last = {0, 0}, root = {0, 0};
  pshape wq = tp_local(H * hd, D, 1, t), wk = tp_local(Hk * hd, D, 1, t),
         wo = tp_local(D, H * hd, 2, t);
  pshape w1 = tp_local(F, D, 1, t), w2 = tp_local(D, F, 2, t), nrm = {D, 1};
  add_param(&blk, nrm, Sg);
  add_param(&blk, wq, Sg);
  add_param(&blk, wk, Sg);
  add_param(&blk, wk, Sg);
  add_param(&blk, wo, Sg);
  add_param(&blk, nrm, Sg);
  add_param(&blk, w1, Sg);
  add_param(&blk, w2, Sg);
  add_param(&blk, w1, Sg);
  add_param(&last, nrm, Sg);
  add_param(&last, tp_local(V, D, 1, t), Sg);
  add_param(&root, tp_local(V, D, 1, t), Sg);
  double local_numel = L * blk.numel + last.numel + root.numel; /* tp-local */
  double shard_numel = fsdp ? (L * blk.padded + last.padded + root.padded) : local_numel;
  /* memory: fp32 master params and grads, AdamW exp_avg + exp_avg_sq */
  double pdt = o->bf16 ? 2 : 4, rdt = 4;
  k->m_params = 4 * shard_numel;
  k->m_grads = 4 * shard_numel;
  k->m_optim = 8 * shard_numel;
  /* FSDP's unsharded buffers at the step's peak (the backward of the
   * largest group): its all-gather buffer and unsharded f32 params, its
   * unsharded grads and reduce-scatter buffer (checked against the
   * allocator's peak with --validate) */
  double gmax = blk.numel > last.numel ? blk.numel : last.numel;
  double gpad = blk.padded > last.padded ? blk.padded : last.padded;
  k->m_unsharded = fsdp ? (gpad * S * pdt + 4 * gmax) + (gpad * S * rdt + 4 * gmax) : 0;
  /* activations kept for backward and the grads of the inputs, per rank
   * (f32): per block the outputs of each module and the grads of their
   * inputs; s = t for the tensors sequence parallel shards. */
  double s = (o->sp && t > 1) ? t : 1;
  double qkv = (double)(H + 2 * Hk) * hd / t, att = (double)H * hd / t;
  double per_tok_block = 9.0 * D / s + (t > 1 ? 2.0 * D : 0) + (o->sp && t > 1 ? 4.5 * D : 0) +
                         qkv + att + 3.0 * F / t + (double)H / t;
  double act = 2.0 * 4.0 * N * (L * per_tok_block + 3.0 * D / s + 2.0 * (double)V / t);
  k->m_act = act;
  k->m_total = k->m_params + k->m_grads + k->m_optim + k->m_unsharded + k->m_act;
  k->fits = k->m_total <= o->c.mem;

  /* --- communication per step */
  enum { AG = WEFT_COLL_ALL_GATHER, RS = WEFT_COLL_REDUCE_SCATTER, AR = WEFT_COLL_ALL_REDUCE };
#define ADD(dim, kind, n, b)          \
  do {                                \
    k->calls[dim][kind] += (n);       \
    k->bytes[dim][kind] += (n) * (b); \
  } while (0)
  if (t > 1) {
    double ND = 4 * N * D;
    if (!o->sp) {
      ADD(2, AR, acc * (1 + 2 * L), ND); /* forward */
      ADD(2, AR, acc * (2 * L + 1), ND); /* backward (+ the final norm's input grad) */
    } else {
      ADD(2, RS, acc * (1 + 2 * L), ND);
      ADD(2, AG, acc * (2 * L + 1), ND);
      ADD(2, AG, acc * (1 + 2 * L), ND);
      ADD(2, RS, acc * (2 * L + 1), ND);
    }
    ADD(2, AR, acc * (2 * L + 1), 4.0 * D); /* norm weight grads */
    if (o->lp) {
      ADD(2, AR, acc, 4 * N);
      ADD(2, AR, acc, 8 * N);
    } else {
      ADD(2, AG, acc, 4 * N * V);
    }
  }
  if (fsdp) {
    int sd = 1; /* shard dim row */
    group gs[3] = {blk, last, root};
    double cnt[3] = {(double)L, 1, 1};
    for (int g = 0; g < 3; g++) {
      double ag = gs[g].padded * S * pdt;
      bool is_root = g == 2;
      bool raf = !is_root && o->raf != 0;
      ADD(sd, AG, cnt[g] * acc, ag);                        /* forward */
      if (raf && o->raf < 2) ADD(sd, AG, cnt[g] * acc, ag); /* backward re-gather */
      ADD(sd, RS, cnt[g], gs[g].padded * S * rdt);
      if (R > 1) ADD(0, AR, cnt[g], gs[g].padded * rdt);
    }
  }
  /* clip_grad_norm: one double per (placement group, sharded dim) */
  if (fsdp && t > 1) {
    if (S > 1) ADD(1, AR, 2, 8);
    ADD(2, AR, 1, 8);
  } else if (fsdp) {
    if (S > 1) ADD(1, AR, 1, 8);
  } else if (t > 1) {
    ADD(2, AR, 1, 8);
  }
#undef ADD
  /* --- time: ring collectives, bus bytes / bandwidth + latency * steps */
  int gpn = o->c.gpn;
  /* ranks are row-major (rep, shard, tp): tp innermost. A dim's group is
   * inside a node when its stride * size <= gpus per node. */
  int stride[3] = {S * t, t, 1}, size[3] = {R, S, t};
  double comp_flops =
      6.0 * (double)(L * blk.numel * t + last.numel * t) * (double)o->batch * T * acc +
      12.0 * L * D * (double)T * (double)o->batch * T * acc;
  k->t_compute = comp_flops / ((double)R * S * t * o->c.flops);
  double tc = 0;
  for (int d = 0; d < 3; d++) {
    int n = size[d];
    k->t_comm[d] = 0;
    if (n <= 1) continue;
    bool intra = (double)stride[d] * n <= gpn;
    double bw = intra ? o->c.intra_bw : o->c.inter_bw,
           lat = intra ? o->c.intra_lat : o->c.inter_lat;
    for (int kind = 0; kind < WEFT_COLL_KIND_COUNT; kind++) {
      double b = k->bytes[d][kind] * (n - 1) / n * (kind == AR ? 2 : 1);
      k->t_comm[d] += b / bw + k->calls[d][kind] * lat * (n - 1);
    }
    tc += k->t_comm[d];
  }
  /* FSDP's collectives overlap compute (prefetch, async reduce-scatter);
   * TP's sit on the critical path */
  double fsdp_t = k->t_comm[0] + k->t_comm[1];
  k->t_step = k->t_compute + k->t_comm[2] + (fsdp_t > k->t_compute ? fsdp_t - k->t_compute : 0);
  (void)tc;
}

static void fmt_b(double b, char *buf, size_t cap) {
  const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int i = 0;
  while (b >= 1024 && i < 5) {
    b /= 1024;
    i++;
  }
  snprintf(buf, cap, i ? "%.1f%s" : "%.0f%s", b, u[i]);
}

static int cmp_cfg(const void *a, const void *b) {
  const config *x = a, *y = b;
  if (x->valid != y->valid) return x->valid ? -1 : 1;
  if (x->fits != y->fits) return x->fits ? -1 : 1;
  return x->t_step < y->t_step ? -1 : x->t_step > y->t_step;
}

static bool preset(const char *name, weft_llama_config *c) {
  if (train_model_preset(name, c)) return true;
  weft_llama_config d = WEFT_LLAMA_CONFIG_INIT;
  if (!strcmp(name, "llama8b")) {
    d.dim = 4096;
    d.n_layers = 32;
    d.n_heads = 32;
    d.n_kv_heads = 8;
    d.ffn_dim = 14336;
    d.vocab = 128256;
    d.max_seq_len = 4096;
  } else if (!strcmp(name, "llama70b")) {
    d.dim = 8192;
    d.n_layers = 80;
    d.n_heads = 64;
    d.n_kv_heads = 8;
    d.ffn_dim = 28672;
    d.vocab = 128256;
    d.max_seq_len = 4096;
  } else {
    return false;
  }
  *c = d;
  return true;
}

static bool cluster_preset(const char *name, cluster *c) {
  if (!strcmp(name, "h100-nvlink-ib")) {
    /* NVLink 4: ~450 GB/s bus bandwidth per GPU; one 400 Gb/s IB NIC per
     * GPU: ~50 GB/s; 80 GB HBM; ~400 TFLOP/s achievable bf16 (of 989) */
    *c = (cluster){16, 8, 450e9, 50e9, 3e-6, 10e-6, 80e9, 400e12};
  } else if (!strcmp(name, "cpu-local")) {
    /* this kind of machine: ranks share memory, ~5 GB/s through MPICH
     * shared memory, ~1 us; 8 GiB per rank; ~50 GFLOP/s per rank */
    *c = (cluster){1, 4, 5e9, 5e9, 1e-6, 1e-6, 8.0 * (1 << 30), 50e9};
  } else {
    return false;
  }
  return true;
}

static void help(void) {
  printf(
      "usage: weft-plan [flags]            (mpiexec -n N weft-plan --validate)\n"
      "Predicts per-rank memory and per-step communication and time for every\n"
      "factorisation of the world into dp_replicate x dp_shard x tp, ranked.\n"
      "model\n"
      "  --model NAME       demo (default), tiny, small, llama8b, llama70b\n"
      "  --dim --layers --heads --kv-heads --ffn-dim --vocab --seq-len   override the preset\n"
      "  --batch B          global batch in sequences (default 8)\n"
      "  --grad-accum K     micro-batches per step (1)\n"
      "  --sequence-parallel, --no-loss-parallel, --dtype fp32|bf16 (bf16 FSDP all-gathers)\n"
      "  --reshard-after-forward=true|false   FSDP for blocks and [norm, output] (true)\n"
      "cluster (a preset, then flags override it)\n"
      "  --cluster NAME     h100-nvlink-ib (16 x 8, default) or cpu-local (1 x 4)\n"
      "  --nodes N --gpus-per-node G\n"
      "  --intra-bw GB/s --inter-bw GB/s --intra-lat us --inter-lat us\n"
      "  --mem GiB          per-device memory\n"
      "  --tflops X         achievable per-device FLOP rate\n"
      "  --tp-across-nodes  also consider tp groups that span nodes\n"
      "output\n"
      "  --top N            print the best N (default 30; 0 = all)\n"
      "  --validate         run weft-train's step on every factorisation of this\n"
      "                     world (mpiexec -n) and compare predicted and measured\n"
      "                     comm bytes (exact) and memory (within 10%%)\n"
      "  --steps N          steps per validation run (3)\n"
      "  --help\n");
}

static int bad(const char *fmt, const char *a) {
  fprintf(stderr, "weft-plan: error: ");
  fprintf(stderr, fmt, a);
  fprintf(stderr, "\n");
  return 2;
}

static int parse(int argc, char **argv, plan_opts *o) {
  memset(o, 0, sizeof *o);
  preset("demo", &o->m);
  snprintf(o->model_name, sizeof o->model_name, "demo");
  cluster_preset("h100-nvlink-ib", &o->c);
  o->batch = 8;
  o->grad_accum = 1;
  o->lp = true;
  o->raf = 1;
  o->top = 30;
  o->steps = 3;
  int64_t ov[7] = {-1, -1, -1, -1, -1, -1, -1};
  static const char *const ovn[7] = {"--dim",     "--layers", "--heads",  "--kv-heads",
                                     "--ffn-dim", "--vocab",  "--seq-len"};
  const char *mp = NULL, *cp = NULL;
  double cov[8];
  bool has[8] = {0};
  static const char *const covn[8] = {"--nodes",     "--gpus-per-node", "--intra-bw", "--inter-bw",
                                      "--intra-lat", "--inter-lat",     "--mem",      "--tflops"};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      help();
      return 1;
    }
    if (!strcmp(a, "--sequence-parallel")) {
      o->sp = true;
      continue;
    }
    if (!strcmp(a, "--no-loss-parallel")) {
      o->lp = false;
      continue;
    }
    if (!strcmp(a, "--tp-across-nodes")) {
      o->tp_across = true;
      continue;
    }
    if (!strcmp(a, "--validate")) {
      o->validate = true;
      continue;
    }
    if (!strcmp(a, "--reshard-after-forward=false")) {
      o->raf = 0;
      continue;
    }
    if (!strcmp(a, "--reshard-after-forward") || !strcmp(a, "--reshard-after-forward=true")) {
      o->raf = 1;
      continue;
    }
    if (i + 1 >= argc || strncmp(a, "--", 2))
      return bad("unknown flag or missing value: '%s' (see --help)", a);
    const char *v = argv[++i];
    char *end = NULL;
    double x = strtod(v, &end);
    bool num = end && !*end && *v;
    bool done = false;
    for (int k = 0; k < 7; k++)
      if (!strcmp(a, ovn[k])) {
        if (!num || x < 1 || x != floor(x)) return bad("want an integer >= 1 after %s", a);
        ov[k] = (int64_t)x;
        done = true;
      }
    for (int k = 0; k < 8; k++)
      if (!strcmp(a, covn[k])) {
        if (!num || x <= 0) return bad("want a number > 0 after %s", a);
        cov[k] = x;
        has[k] = true;
        done = true;
      }
    if (done) continue;
    if (!strcmp(a, "--model")) {
      mp = v;
      continue;
    }
    if (!strcmp(a, "--cluster")) {
      cp = v;
      continue;
    }
    if (!strcmp(a, "--dtype")) {
      if (!strcmp(v, "bf16"))
        o->bf16 = true;
      else if (!strcmp(v, "fp32"))
        o->bf16 = false;
      else
        return bad("--dtype: want fp32 or bf16, not '%s'", v);
      continue;
    }
    if (!strcmp(a, "--batch") || !strcmp(a, "--grad-accum") || !strcmp(a, "--top") ||
        !strcmp(a, "--steps")) {
      if (!num || x < 0 || x != floor(x)) return bad("want an integer after %s", a);
      if (!strcmp(a, "--batch"))
        o->batch = (int64_t)x;
      else if (!strcmp(a, "--grad-accum"))
        o->grad_accum = (int64_t)x;
      else if (!strcmp(a, "--top"))
        o->top = (int)x;
      else
        o->steps = (int64_t)x;
      if (o->batch < 1 || o->grad_accum < 1) return bad("%s must be >= 1", a);
      continue;
    }
    return bad("unknown flag '%s' (see --help)", a);
  }
  if (mp) {
    if (!preset(mp, &o->m))
      return bad("--model: unknown preset '%s' (demo, tiny, small, llama8b, llama70b)", mp);
    snprintf(o->model_name, sizeof o->model_name, "%s", mp);
  }
  if (cp && !cluster_preset(cp, &o->c))
    return bad("--cluster: unknown preset '%s' (h100-nvlink-ib, cpu-local)", cp);
  int64_t *f[7] = {&o->m.dim,     &o->m.n_layers, &o->m.n_heads,    &o->m.n_kv_heads,
                   &o->m.ffn_dim, &o->m.vocab,    &o->m.max_seq_len};
  for (int k = 0; k < 7; k++)
    if (ov[k] > 0) *f[k] = ov[k];
  if (ov[2] > 0 && ov[3] < 0) o->m.n_kv_heads = o->m.n_heads;
  if (weft_llama_config_validate(&o->m) != WEFT_OK) return bad("model: %s", weft_last_error());
  if (has[0]) o->c.nodes = (int)cov[0];
  if (has[1]) o->c.gpn = (int)cov[1];
  if (has[2]) o->c.intra_bw = cov[2] * 1e9;
  if (has[3]) o->c.inter_bw = cov[3] * 1e9;
  if (has[4]) o->c.intra_lat = cov[4] * 1e-6;
  if (has[5]) o->c.inter_lat = cov[5] * 1e-6;
  if (has[6]) o->c.mem = cov[6] * (double)(1 << 30);
  if (has[7]) o->c.flops = cov[7] * 1e12;
  return 0;
}

/* Every (rep, shard, tp) with rep * shard * tp = world. */
static int enumerate(const plan_opts *o, int world, config **out) {
  int cap = 64, n = 0;
  config *v = malloc(sizeof *v * (size_t)cap);
  for (int t = 1; t <= world; t++) {
    if (world % t) continue;
    if (!o->tp_across && t > o->c.gpn) continue;
    if (!o->tp_across && o->c.gpn % t) continue;
    int dp = world / t;
    for (int r = 1; r <= dp; r++) {
      if (dp % r) continue;
      if (n == cap) v = realloc(v, sizeof *v * (size_t)(cap *= 2));
      memset(&v[n], 0, sizeof v[n]);
      v[n].rep = r;
      v[n].shard = dp / r;
      v[n].tp = t;
      predict(o, &v[n]);
      n++;
    }
  }
  *out = v;
  return n;
}

static void print_table(const plan_opts *o, config *v, int n, int world) {
  qsort(v, (size_t)n, sizeof *v, cmp_cfg);
  printf(
      "weft-plan: model %s (D=%lld L=%lld H=%lld Hkv=%lld F=%lld V=%lld T=%lld), batch %lld x %lld "
      "accum,\n"
      "  %d ranks = %d nodes x %d, intra %.0f GB/s, inter %.0f GB/s, %.0f GiB and %.3g TFLOP/s per "
      "device%s%s\n",
      o->model_name, (long long)o->m.dim, (long long)o->m.n_layers, (long long)o->m.n_heads,
      (long long)o->m.n_kv_heads, (long long)o->m.ffn_dim, (long long)o->m.vocab,
      (long long)o->m.max_seq_len, (long long)o->batch, (long long)o->grad_accum, world, o->c.nodes,
      o->c.gpn, o->c.intra_bw / 1e9, o->c.inter_bw / 1e9, o->c.mem / (1 << 30), o->c.flops / 1e12,
      o->sp ? ", SP" : "", o->bf16 ? ", bf16 all-gathers" : "");
  printf("%4s %6s %6s %4s | %9s %9s %9s %9s %9s %9s %4s | %10s %10s %10s | %8s %8s %8s %9s\n",
         "rank", "dp_rep", "dp_shd", "tp", "params", "grads", "optim", "unshard", "activ", "total",
         "fit", "dp_rep B", "dp_shd B", "tp B", "dp_rep s", "dp_shd s", "tp s", "step s");
  int shown = 0;
  for (int i = 0; i < n; i++) {
    config *k = &v[i];
    if (o->top && shown >= o->top) break;
    shown++;
    if (!k->valid) {
      printf("%4d %6d %6d %4d | invalid: %s\n", i + 1, k->rep, k->shard, k->tp, k->why);
      continue;
    }
    char b[9][16];
    fmt_b(k->m_params, b[0], 16);
    fmt_b(k->m_grads, b[1], 16);
    fmt_b(k->m_optim, b[2], 16);
    fmt_b(k->m_unsharded, b[3], 16);
    fmt_b(k->m_act, b[4], 16);
    fmt_b(k->m_total, b[5], 16);
    double db[3] = {0, 0, 0};
    for (int d = 0; d < 3; d++)
      for (int kk = 0; kk < WEFT_COLL_KIND_COUNT; kk++) db[d] += k->bytes[d][kk];
    for (int d = 0; d < 3; d++) fmt_b(db[d], b[6 + d], 16);
    printf(
        "%4d %6d %6d %4d | %9s %9s %9s %9s %9s %9s %4s | %10s %10s %10s | %8.4f %8.4f %8.4f "
        "%9.4f\n",
        i + 1, k->rep, k->shard, k->tp, b[0], b[1], b[2], b[3], b[4], b[5], k->fits ? "yes" : "NO",
        b[6], b[7], b[8], k->t_comm[0], k->t_comm[1], k->t_comm[2], k->t_step);
  }
  if (shown < n) printf("(%d more; --top 0 prints all)\n", n - shown);
}

/* --validate: run each factorisation of this world with weft-train's core. */
static int validate(const plan_opts *o, int world) {
  config *v = NULL;
  plan_opts q = *o;
  q.tp_across = true;
  q.c.gpn = world;
  int n = enumerate(&q, world, &v);
  int rank = weft_world_rank(), failed = 0, ran = 0;
  if (rank == 0)
    printf(
        "weft-plan --validate on %d ranks, model %s, batch %lld: predicted vs measured (last of "
        "%lld steps)\n",
        world, o->model_name, (long long)o->batch, (long long)o->steps);
  for (int i = 0; i < n; i++) {
    config *k = &v[i];
    if (!k->valid) {
      if (rank == 0) printf("  %d x %d x %d: skipped (%s)\n", k->rep, k->shard, k->tp, k->why);
      continue;
    }
    train_opts t;
    train_opts_default(&t);
    t.model = o->m;
    snprintf(t.model_name, sizeof t.model_name, "%s", o->model_name);
    t.steps = o->steps;
    t.batch = o->batch;
    t.grad_accum = o->grad_accum;
    t.val_every = 0;
    t.val_batches = 0;
    t.quiet = true;
    t.sequence_parallel = o->sp;
    t.loss_parallel = o->lp;
    t.bf16 = o->bf16 && k->rep * k->shard > 1;
    t.reshard_after_forward = o->raf ? WEFT_FSDP_RESHARD_DEFAULT : 0;
    t.mesh.given = true;
    t.mesh.dp_replicate = k->rep > 1 ? k->rep : 0;
    t.mesh.dp_shard = k->shard > 1 || k->rep > 1 ? k->shard : 0;
    t.mesh.tp = k->tp > 1 ? k->tp : 0;
    if (!t.mesh.dp_replicate && !t.mesh.dp_shard && !t.mesh.tp) t.mesh.dp_shard = 1;
    t.silent = true;
    train_result r;
    int rc = train_run(&t, &r);
    if (rc) {
      failed++;
      if (rank == 0) printf("  %d x %d x %d: the training run failed\n", k->rep, k->shard, k->tp);
      continue;
    }
    ran++;
    /* map the run's mesh dims to (rep, shard, tp) rows */
    double meas[3][WEFT_COLL_KIND_COUNT], mcalls[3][WEFT_COLL_KIND_COUNT];
    memset(meas, 0, sizeof meas);
    memset(mcalls, 0, sizeof mcalls);
    for (int d = 0; d < r.ndim; d++) {
      int row = !strcmp(r.dim_names[d], "tp") ? 2 : !strcmp(r.dim_names[d], "dp_replicate") ? 0 : 1;
      for (int kk = 0; kk < WEFT_COLL_KIND_COUNT; kk++) {
        meas[row][kk] += (double)r.comm_kind_bytes[d][kk];
        mcalls[row][kk] += (double)r.comm_kind_calls[d][kk];
      }
    }
    bool comm_ok = true;
    char line[1024];
    int len = 0;
    for (int d = 0; d < 3; d++)
      for (int kk = 0; kk < WEFT_COLL_KIND_COUNT; kk++) {
        if (meas[d][kk] == 0 && k->bytes[d][kk] == 0 && mcalls[d][kk] == 0 && k->calls[d][kk] == 0)
          continue;
        bool ok = meas[d][kk] == k->bytes[d][kk] && mcalls[d][kk] == k->calls[d][kk];
        comm_ok = comm_ok && ok;
        len += snprintf(
            line + len, sizeof line - (size_t)len,
            "    %-12s %-15s predicted %12.0f B %4.0f calls, measured %12.0f B %4.0f calls %s\n",
            DIMN[d], weft_coll_kind_name((weft_coll_kind)kk), k->bytes[d][kk], k->calls[d][kk],
            meas[d][kk], mcalls[d][kk], ok ? "ok" : "MISMATCH");
        if (len >= (int)sizeof line - 200) len = (int)sizeof line - 200;
      }
    /* memory: the max over ranks of each rank's peak */
    int64_t mm[6] = {r.peak_bytes,
                     r.param_bytes,
                     r.grad_bytes,
                     r.optim_bytes,
                     r.unsharded_param_peak + r.unsharded_grad_peak,
                     r.other_peak};
    MPI_Allreduce(MPI_IN_PLACE, mm, 6, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
    double ratio = k->m_total / (double)mm[0];
    bool mem_ok = fabs(ratio - 1) <= 0.10;
    if (!comm_ok || !mem_ok) failed++;
    if (rank == 0) {
      char pb[4][16];
      fmt_b(k->m_total, pb[0], 16);
      fmt_b((double)mm[0], pb[1], 16);
      fmt_b(k->m_params + k->m_grads + k->m_optim, pb[2], 16);
      fmt_b((double)(mm[1] + mm[2] + mm[3]), pb[3], 16);
      char ub[4][16];
      fmt_b(k->m_unsharded, ub[0], 16);
      fmt_b((double)mm[4], ub[1], 16);
      fmt_b(k->m_act, ub[2], 16);
      fmt_b((double)mm[5], ub[3], 16);
      printf(
          "  dp_replicate=%d dp_shard=%d tp=%d: comm %s, memory %s (predicted peak %s, measured "
          "%s, ratio %.3f)\n"
          "    memory: params+grads+optim predicted %s measured %s; unsharded %s vs %s; "
          "activations etc. %s vs %s\n%s",
          k->rep, k->shard, k->tp, comm_ok ? "exact" : "MISMATCH",
          mem_ok ? "within 10%" : "OFF BY > 10%", pb[0], pb[1], ratio, pb[2],
          r.param_bytes ? pb[3] : "n/a (no FSDP)", ub[0], r.param_bytes ? ub[1] : "n/a", ub[2],
          r.param_bytes ? ub[3] : "n/a", line);
    }
  }
  free(v);
  if (rank == 0) printf("validate: %d runs, %d failed\n", ran, failed);
  return failed ? 1 : 0;
}

int main(int argc, char **argv) {
  plan_opts o;
  int p = parse(argc, argv, &o);
  if (p) return p == 1 ? 0 : p;
  if (o.validate) {
    if (weft_init(&argc, &argv) != WEFT_OK) {
      fprintf(stderr, "weft-plan: error: %s\n", weft_last_error());
      return 1;
    }
    int rc = validate(&o, weft_world_size());
    weft_finalize();
    return rc;
  }
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  int world = o.c.nodes * o.c.gpn;
  config *v = NULL;
  int n = enumerate(&o, world, &v);
  print_table(&o, v, n, world);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  printf("%d factorisations of %d ranks in %.3f ms\n", n, world,
         1e3 * ((double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec)));
  free(v);
  return 0;
}
