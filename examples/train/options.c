/* examples/train/options.c — weft-train's command line: the defaults, the
 * --help text, the flags and their validation (pure: no MPI, every rank
 * parses the same argv and finds the same errors). Model presets are in
 * model.c; checks that need the world size (the mesh, divisibility by tp
 * and dp) are in setup.c. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "train_internal.h"

#define perr train_perr

void train_opts_default(train_opts *o) {
  memset(o, 0, sizeof *o);
  train_model_preset("demo", &o->model);
  snprintf(o->model_name, sizeof o->model_name, "demo");
  o->steps = 20;
  o->batch = 8;
  o->grad_accum = 1;
  o->warmup = 2;
  o->lr = 3e-3;
  o->min_lr = -1; /* lr / 10 */
  o->weight_decay = 0.0;
  o->beta1 = 0.9; /* torch.optim.AdamW's (WEFT_ADAMW_DEFAULT) */
  o->beta2 = 0.999;
  o->eps = 1e-8;
  o->clip = 1.0;
  o->seed = 1234;
  o->reshard_after_forward = WEFT_FSDP_RESHARD_DEFAULT;
  o->loss_parallel = true;
  o->val_every = 10;
  o->val_batches = 2;
  o->keep_checkpoints = 2;
  o->max_skipped = 5;
  o->peak_flops = 100e9; /* ~ one core's SGEMM (docs/DESIGN.md: 95 GF/s) */
}

void train_print_help(const char *prog) {
  printf(
      "usage: mpiexec -n N %s [flags]\n"
      "Trains the weft reference model (Llama-style) with FSDP on the dp dims and\n"
      "tensor parallelism on tp, over an N-D mesh of the world.\n"
      "\n"
      "mesh\n"
      "  --mesh SPEC             name=size pairs, e.g. dp=2,tp=2 or "
      "dp_replicate=2,dp_shard=2,tp=2;\n"
      "                          names: dp (= dp_shard), dp_replicate, dp_shard, tp; the product\n"
      "                          must be the world size (default: dp=<world size>). Laid out\n"
      "                          dp_replicate, dp_shard, tp (tp innermost: tp peers are\n"
      "                          neighbouring ranks, on one node when nodes hold consecutive\n"
      "                          ranks).\n"
      "  --tp-inside-node        keep that layout, and check it: tp must divide the ranks per\n"
      "                          node, every node must hold as many ranks, and every tp group\n"
      "                          must lie on one node (else an error)\n"
      "  --tp-across-nodes       lay tp outermost (world-rank order tp, dp_replicate, dp_shard):\n"
      "                          tp peers as far apart as possible, i.e. on different nodes\n"
      "                          (to measure TP over the network); the dims and the loss curve\n"
      "                          stay the same\n"
      "model (a preset, then any flag overrides it)\n"
      "  --model NAME            Llama: demo (default: D=64 L=2 H=4 F=176 V=64 T=32),\n"
      "                          tiny (D=256 L=4 H=8 F=688 V=256 T=256),\n"
      "                          small (D=768 L=12 H=12 F=2048 V=8192 T=512);\n"
      "                          GPT-2 (models/gpt2: LayerNorm, GELU, learned positions, tied\n"
      "                          lm_head, nanoGPT's weight-decay groups): gpt2-demo (D=64 L=2\n"
      "                          H=4 F=256 V=64 T=32), gpt2-tiny (D=256 L=4 H=8 F=1024 V=256\n"
      "                          T=256), gpt2 = gpt2-small (124M: D=768 L=12 H=12 F=3072\n"
      "                          V=50304 T=1024)\n"
      "  --dim D  --layers L  --heads H  --kv-heads HKV  --ffn-dim F  --vocab V  --seq-len T\n"
      "  --dropout P             GPT-2 dropout (0); masks do not depend on the mesh\n"
      "  --max-positions P       GPT-2: learned positions (wpe rows), from --seq-len up (default\n"
      "                          --seq-len; a pretrained GPT-2 has 1024)\n"
      "training\n"
      "  --steps N               optimizer steps (20)\n"
      "  --batch B               global batch in sequences per micro-step, split over dp (8)\n"
      "  --grad-accum K          micro-steps per optimizer step (1)\n"
      "  --fixed-batch           debug: every step trains on the first step's batch (and\n"
      "                          micro-batches), so the loss should fall towards 0\n"
      "  --lr X                  peak learning rate (3e-3); --min-lr X (lr/10): cosine floor\n"
      "  --warmup N              linear warmup steps (2), then cosine decay to min-lr\n"
      "  --weight-decay X        AdamW decoupled weight decay (0)\n"
      "  --beta1 X, --beta2 X    AdamW's moment decays (0.9, 0.999; nanoGPT uses 0.95 for\n"
      "                          beta2), in [0, 1)\n"
      "  --eps X                 AdamW's denominator term (1e-8). On --resume the\n"
      "                          checkpoint's betas and eps apply, as in torch\n"
      "  --clip X                gradient clipping max norm (1.0; 0 = no clipping)\n"
      "  --seed N                init seed (1234): same weights on every mesh\n"
      "  --on-nonfinite stop|skip  a step whose loss or gradient norm is NaN or Inf: stop\n"
      "                          (default) ends the run with an error naming the step, before\n"
      "                          its optimizer update and with no further checkpoint; skip\n"
      "                          drops that step's update (parameters and optimizer state stay\n"
      "                          as they were), counts it, and goes on\n"
      "  --max-skipped-steps K   with skip: stop with an error after K skipped steps in a\n"
      "                          row (5)\n"
      "  --dtype fp32|bf16       bf16: FSDP mixed precision (bf16 all-gathers, f32\n"
      "                          master weights, f32 reduce): unsharded parameters and\n"
      "                          activations in bf16 (ops accumulate in f32); needs a dp\n"
      "                          dim (dp=1 will do: FSDP over one rank)\n"
      "  --reshard-after-forward[=true|false|K]  FSDP reshard after forward for blocks\n"
      "                          and [norm, output] (default: PyTorch's)\n"
      "  --cpu-offload           FSDP's CPUOffloadPolicy: sharded parameters, grads and\n"
      "                          AdamW state in host memory, the optimizer steps on the\n"
      "                          CPU (for --device cuda; nothing moves on the CPU);\n"
      "                          needs a dp dim\n"
      "  --sequence-parallel     TP with sequence parallelism (norms sharded on T)\n"
      "  --no-loss-parallel      gather the logits instead of vocab-parallel loss\n"
      "  --device cpu|cuda       cuda: every rank on the GPU of its node-local rank (NCCL\n"
      "                          between GPUs where built; the emulated device in a\n"
      "                          -Dcuda=emulated build)\n"
      "  --matmul fp32|tf32|bf16 the device's fp32 matrix products: exact fp32 (default),\n"
      "                          TF32 tensor cores, or bf16 operands with fp32\n"
      "                          accumulation (torch's set_float32_matmul_precision);\n"
      "                          needs --device cuda\n"
      "data (default: an embedded synthetic language, generated in the program)\n"
      "  --data FILE             llm.c token file (.bin: 256 int32 header, magic 20240520,\n"
      "                          then uint16 tokens); --val-data FILE held-out tokens\n"
      "                          (default: the last 10%% of --data)\n"
      "  --text FILE             plain text, byte-level tokens (needs --vocab >= 256);\n"
      "                          the last 10%% is held out\n"
      "  --val-every N           validate every N steps and at the end (10; 0 = end only)\n"
      "  --val-batches N         held-out batches per validation (2)\n"
      "checkpoints\n"
      "  --save DIR              DCP checkpoint (model + optimizer + step) at the end, and\n"
      "  --save-every N          every N steps (async: training continues while it writes)\n"
      "  --keep-checkpoints K    keep the last K checkpoints (2): DIR is always the newest;\n"
      "                          before a save replaces it, it moves to DIR.step-N (N: its\n"
      "                          step; hard links, no copy); the oldest DIR.step-N is removed\n"
      "                          only after the new save has committed (1: DIR only)\n"
      "  --save-errors stop|continue  a save that fails (a full disk, an I/O error) stops\n"
      "                          the run (stop), or (continue) warns, keeps the previous\n"
      "                          checkpoint and trains on; the last save's failure stops\n"
      "  --resume DIR            continue from a checkpoint (any mesh): DIR is the newest;\n"
      "                          DIR.step-N an earlier one\n"
      "  --export-safetensors F  write the model as one safetensors file at the end\n"
      "  --hf                    export in Hugging Face transformers' layout (GPT-2: names\n"
      "                          without 'transformer.', Conv1D weights [in, out]; Llama:\n"
      "                          model.layers.N..., q/k rows for rotate_half)\n"
      "  --init-from F           initial weights from a safetensors file in weft's or\n"
      "                          transformers' layout (told apart by the names and shapes)\n"
      "output\n"
      "  --log-json FILE         one JSON object per step (rank 0)\n"
      "  --peak-tflops X         per-rank peak for MFU (0.1; with --device cuda the GPU's\n"
      "                          dense bf16 peak where its model is known: H100/H200 989,\n"
      "                          A100 312)\n"
      "  --profile               after each step but the first, what the op layer did on\n"
      "                          rank 0: op graph per step: ops N, widened N, copies N,\n"
      "                          mallocs N (weft_op_stats in <weft/autograd.h>), peak X\n"
      "                          MiB (weft_graph_bytes_peak: the graph's buffers); with\n"
      "                          --device cuda also device calls per step: launches N,\n"
      "                          blas N, host syncs N, mallocs N, bytes copied N\n"
      "                          (weft_device_stats in <weft/backend.h>)\n"
      "  --predict h100|h200     with --device cuda: --profile, and each step's time and\n"
      "                          MFU on that GPU from a roofline per kernel\n"
      "                          (weft_kernel_cost in <weft/backend.h>); the ten\n"
      "                          costliest kernels at the end\n"
      "  --quiet                 no per-step lines, only validation and the summary\n"
      "  --help                  this text\n",
      prog);
}

static bool parse_i64(const char *s, int64_t lo, int64_t *out) {
  if (!s || !*s) return false;
  char *end = NULL;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (errno || *end || v < lo) return false;
  *out = v;
  return true;
}

static bool parse_f64(const char *s, double *out) {
  if (!s || !*s) return false;
  char *end = NULL;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || *end || !isfinite(v)) return false;
  *out = v;
  return true;
}

/* The slot of one --mesh dim name in m, or NULL with the error in err. */
static int *mesh_slot(train_mesh_spec *m, const char *name, bool *seen_dp, bool *seen_shard,
                      char *err, size_t cap) {
  int *slot = NULL;
  if (!strcmp(name, "dp") || !strcmp(name, "dp_shard")) {
    bool dp = !strcmp(name, "dp");
    if (dp ? *seen_shard : *seen_dp) {
      perr(err, cap, "--mesh: give dp or dp_shard, not both");
      return NULL;
    }
    *(dp ? seen_dp : seen_shard) = true;
    slot = &m->dp_shard;
  } else if (!strcmp(name, "dp_replicate")) {
    slot = &m->dp_replicate;
  } else if (!strcmp(name, "tp")) {
    slot = &m->tp;
  } else {
    perr(err, cap, "--mesh: unknown dim '%s' (dims: dp, dp_replicate, dp_shard, tp)", name);
    return NULL;
  }
  if (*slot) {
    perr(err, cap, "--mesh: dim '%s' given twice", name);
    return NULL;
  }
  return slot;
}

static int parse_mesh(const char *s, train_mesh_spec *m, char *err, size_t cap) {
  /* the layout flags may come before --mesh */
  train_mesh_spec layout = {.tp_across_nodes = m->tp_across_nodes,
                            .tp_inside_node = m->tp_inside_node};
  *m = layout;
  m->given = true;
  char buf[256];
  if (strlen(s) >= sizeof buf) return perr(err, cap, "--mesh: too long");
  snprintf(buf, sizeof buf, "%s", s);
  bool seen_dp = false, seen_shard = false;
  char *save = NULL;
  int n = 0;
  for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    char *eq = strchr(tok, '=');
    if (!eq) return perr(err, cap, "--mesh: '%s' is not name=size", tok);
    *eq = 0;
    int64_t v;
    if (!parse_i64(eq + 1, 1, &v) || v > 1 << 20)
      return perr(err, cap, "--mesh: size of '%s' must be an integer >= 1 (got '%s')", tok, eq + 1);
    int *slot = mesh_slot(m, tok, &seen_dp, &seen_shard, err, cap);
    if (!slot) return -1;
    *slot = (int)v;
    n++;
  }
  if (n == 0) return perr(err, cap, "--mesh: empty (e.g. --mesh dp=2,tp=2)");
  return 0;
}

/* "--flag=value" or "--flag" (value NULL) into flag (cap 64). */
static int split_flag(const char *a, char flag[64], const char **val, char *err, size_t cap) {
  const char *eq = strchr(a, '=');
  *val = NULL;
  if (strncmp(a, "--", 2) != 0) return perr(err, cap, "unexpected argument '%s' (see --help)", a);
  if (!eq) {
    snprintf(flag, 64, "%s", a);
    return 0;
  }
  size_t len = (size_t)(eq - a);
  if (len >= 64) return perr(err, cap, "unknown flag '%s' (see --help)", a);
  memcpy(flag, a, len);
  flag[len] = 0;
  *val = eq + 1;
  return 0;
}

/* The flags without a value, each setting a bool to `on` ("--quiet");
 * "--quiet=true" / "=1" is the same, "=false" / "=0" leaves the default. */
typedef struct switch_flag {
  const char *name;
  size_t off; /* of the bool in train_opts */
  bool on;
} switch_flag;
static const switch_flag switches[] = {
    {"--sequence-parallel", offsetof(train_opts, sequence_parallel), true},
    {"--no-loss-parallel", offsetof(train_opts, loss_parallel), false},
    {"--cpu-offload", offsetof(train_opts, cpu_offload), true},
    {"--hf", offsetof(train_opts, export_hf), true},
    {"--fixed-batch", offsetof(train_opts, fixed_batch), true},
    {"--profile", offsetof(train_opts, profile), true},
    {"--quiet", offsetof(train_opts, quiet), true},
    {"--tp-across-nodes", offsetof(train_opts, mesh.tp_across_nodes), true},
    {"--tp-inside-node", offsetof(train_opts, mesh.tp_inside_node), true},
    {NULL, 0, false}};

/* The flags without a value (and --reshard-after-forward, whose value is
 * optional): 1 when flag is one of them, 0 when not, -1 on a bad value. */
static int parse_switch(const char *flag, const char *val, train_opts *o, char *err, size_t cap) {
  for (const switch_flag *w = switches; w->name; w++) {
    if (strcmp(flag, w->name) != 0) continue;
    if (!val || !strcmp(val, "true") || !strcmp(val, "1"))
      *(bool *)((char *)o + w->off) = w->on;
    else if (strcmp(val, "false") != 0 && strcmp(val, "0") != 0)
      return perr(err, cap, "%s takes no value, or true / false (got '%s')", flag, val);
    return 1;
  }
  if (strcmp(flag, "--reshard-after-forward") != 0) return 0;
  if (!val || !strcmp(val, "true") || !strcmp(val, "1")) {
    o->reshard_after_forward = 1;
  } else if (!strcmp(val, "false") || !strcmp(val, "0")) {
    o->reshard_after_forward = 0;
  } else {
    int64_t k;
    if (!parse_i64(val, 2, &k) || k > INT_MAX)
      return perr(err, cap,
                  "--reshard-after-forward: want true, false or a group size >= 2 (got '%s')", val);
    o->reshard_after_forward = (int)k;
  }
  return 1;
}

/* The model-shape flags, applied after the preset, and their largest
 * values. */
#define N_SHAPE_FLAGS 7
static const char *const shape_flags[N_SHAPE_FLAGS] = {
    "--dim", "--layers", "--heads", "--kv-heads", "--ffn-dim", "--vocab", "--seq-len"};
static const int64_t shape_max[N_SHAPE_FLAGS] = {1 << 16, 1 << 12, 1 << 12, 1 << 12,
                                                 1 << 20, 1 << 24, 1 << 20};

/* Flags with a number or a path, by their field in train_opts. */
/* Every number has a range [lo, hi]: far past what a run can use, but
 * small enough that the products the run forms (steps x batch x seq-len
 * tokens, the model's parameter count and memory) stay in 64 bits, and
 * floats stay finite as floats (a learning rate of 1e39 became inf). */
#define MAX_STEPS 1000000000LL /* 10^9 */
#define MAX_ROWS (1LL << 20)   /* batch, grad-accum, val-batches */
#define MAX_FLOAT_OPT 1e30     /* --lr and the other float settings */
typedef struct field_flag {
  const char *name;
  size_t off;
  double lo, hi;
} field_flag;
#define FIELD(name, field, lo, hi) \
  { name, offsetof(train_opts, field), lo, hi }
static const field_flag int_flags[] = {FIELD("--steps", steps, 0, MAX_STEPS),
                                       FIELD("--batch", batch, 1, MAX_ROWS),
                                       FIELD("--grad-accum", grad_accum, 1, MAX_ROWS),
                                       FIELD("--warmup", warmup, 0, MAX_STEPS),
                                       FIELD("--val-every", val_every, 0, MAX_STEPS),
                                       FIELD("--val-batches", val_batches, 0, MAX_ROWS),
                                       FIELD("--save-every", save_every, 0, MAX_STEPS),
                                       FIELD("--keep-checkpoints", keep_checkpoints, 1, 1000),
                                       FIELD("--max-skipped-steps", max_skipped, 1, MAX_STEPS),
                                       FIELD("--max-positions", max_positions, 1, 1 << 20),
                                       {NULL, 0, 0, 0}};
static const field_flag dbl_flags[] = {FIELD("--lr", lr, 0, MAX_FLOAT_OPT),
                                       FIELD("--min-lr", min_lr, 0, MAX_FLOAT_OPT),
                                       FIELD("--weight-decay", weight_decay, 0, MAX_FLOAT_OPT),
                                       FIELD("--beta1", beta1, 0, 1),
                                       FIELD("--beta2", beta2, 0, 1),
                                       FIELD("--eps", eps, 0, 1),
                                       FIELD("--clip", clip, 0, MAX_FLOAT_OPT),
                                       FIELD("--dropout", dropout, 0, 1),
                                       {NULL, 0, 0, 0}};
static const field_flag str_flags[] = {FIELD("--data", data, 0, 0),
                                       FIELD("--val-data", val_data, 0, 0),
                                       FIELD("--text", text, 0, 0),
                                       FIELD("--save", save_dir, 0, 0),
                                       FIELD("--resume", resume_dir, 0, 0),
                                       FIELD("--export-safetensors", export_path, 0, 0),
                                       FIELD("--init-from", init_from, 0, 0),
                                       FIELD("--log-json", log_json, 0, 0),
                                       {NULL, 0, 0, 0}};
#undef FIELD
static const char *const other_flags[] = {
    "--peak-tflops", "--seed",         "--mesh",        "--model",   "--dtype", "--device",
    "--matmul",      "--on-nonfinite", "--save-errors", "--predict", NULL};

static const field_flag *find_field(const field_flag *t, const char *flag) {
  for (; t->name; t++)
    if (!strcmp(t->name, flag)) return t;
  return NULL;
}

static int find_name(const char *const *names, int n, const char *flag) {
  for (int k = 0; k < n && names[k]; k++)
    if (!strcmp(names[k], flag)) return k;
  return -1;
}

static bool is_value_flag(const char *flag) {
  return find_name(shape_flags, N_SHAPE_FLAGS, flag) >= 0 || find_field(int_flags, flag) ||
         find_field(dbl_flags, flag) || find_field(str_flags, flag) ||
         find_name(other_flags, INT_MAX, flag) >= 0;
}

typedef struct parse_ctx {
  int64_t shape[N_SHAPE_FLAGS]; /* -1 when not given */
  const char *preset;           /* --model */
} parse_ctx;

/* A flag whose value is a number or a path (by the tables): 1 when
 * handled, 0 when flag is another one, -1 on a bad value. */
static int parse_field(parse_ctx *c, const char *flag, const char *val, train_opts *o, char *err,
                       size_t cap) {
  int64_t iv;
  double dv;
  int k = find_name(shape_flags, N_SHAPE_FLAGS, flag);
  if (k >= 0) {
    if (!parse_i64(val, 1, &iv) || iv > shape_max[k])
      return perr(err, cap, "%s: want an integer in [1, %lld] (got '%s')", flag,
                  (long long)shape_max[k], val);
    c->shape[k] = iv;
    return 1;
  }
  const field_flag *f = find_field(int_flags, flag);
  if (f) {
    if (!parse_i64(val, (int64_t)f->lo, &iv) || iv > (int64_t)f->hi)
      return perr(err, cap, "%s: want an integer in [%lld, %lld] (got '%s')", flag,
                  (long long)f->lo, (long long)f->hi, val);
    *(int64_t *)((char *)o + f->off) = iv;
    return 1;
  }
  if ((f = find_field(dbl_flags, flag))) {
    if (!parse_f64(val, &dv) || dv < f->lo || dv > f->hi)
      return perr(err, cap, "%s: want a number in [%g, %g] (got '%s')", flag, f->lo, f->hi, val);
    *(double *)((char *)o + f->off) = dv;
    return 1;
  }
  if ((f = find_field(str_flags, flag))) {
    if (!*val) return perr(err, cap, "%s: empty value", flag);
    *(const char **)((char *)o + f->off) = val;
    return 1;
  }
  return 0;
}

/* --peak-tflops, --seed, --mesh, --model, --dtype, --device, --matmul: 0 or -1. */
static int parse_other(parse_ctx *c, const char *flag, const char *val, train_opts *o, char *err,
                       size_t cap) {
  double dv;
  if (!strcmp(flag, "--peak-tflops")) {
    if (!parse_f64(val, &dv) || dv <= 0 || dv > 1e9)
      return perr(err, cap, "--peak-tflops: want a number in (0, 1e9] (got '%s')", val);
    o->peak_flops = dv * 1e12;
    o->peak_given = true;
  } else if (!strcmp(flag, "--seed")) {
    char *end = NULL;
    errno = 0;
    unsigned long long u = strtoull(val, &end, 10);
    if (!*val || *val == '-' || *val == '+' || errno || *end)
      return perr(err, cap, "--seed: want an integer in [0, 2^64 - 1] (got '%s')", val);
    o->seed = (uint64_t)u;
  } else if (!strcmp(flag, "--mesh")) {
    return parse_mesh(val, &o->mesh, err, cap);
  } else if (!strcmp(flag, "--model")) {
    weft_llama_config tmp;
    if (!train_model_preset(val, &tmp) && !train_gpt2_preset(val, &tmp))
      return perr(err, cap,
                  "--model: unknown preset '%s' (demo, tiny, small, gpt2-demo, gpt2-tiny, gpt2)",
                  val);
    c->preset = val;
  } else if (!strcmp(flag, "--dtype")) {
    if (!strcmp(val, "fp32") || !strcmp(val, "f32") || !strcmp(val, "float32"))
      o->bf16 = false;
    else if (!strcmp(val, "bf16") || !strcmp(val, "bfloat16"))
      o->bf16 = true;
    else
      return perr(err, cap, "--dtype: want fp32 or bf16 (got '%s')", val);
  } else if (!strcmp(flag, "--matmul")) {
    if (!strcmp(val, "fp32"))
      o->matmul = WEFT_MATMUL_F32;
    else if (!strcmp(val, "tf32"))
      o->matmul = WEFT_MATMUL_TF32;
    else if (!strcmp(val, "bf16"))
      o->matmul = WEFT_MATMUL_BF16;
    else
      return perr(err, cap, "--matmul: want fp32, tf32 or bf16 (got '%s')", val);
  } else if (!strcmp(flag, "--save-errors")) {
    if (!strcmp(val, "stop"))
      o->save_errors_continue = false;
    else if (!strcmp(val, "continue"))
      o->save_errors_continue = true;
    else
      return perr(err, cap, "--save-errors: want stop or continue (got '%s')", val);
  } else if (!strcmp(flag, "--on-nonfinite")) {
    if (!strcmp(val, "stop"))
      o->skip_nonfinite = false;
    else if (!strcmp(val, "skip"))
      o->skip_nonfinite = true;
    else
      return perr(err, cap, "--on-nonfinite: want stop or skip (got '%s')", val);
  } else if (!strcmp(flag, "--predict")) {
    o->predict = weft_gpu_spec_find(val);
    if (!o->predict) return perr(err, cap, "--predict: want h100 or h200 (got '%s')", val);
    o->profile = true;
  } else if (!strcmp(flag, "--device")) {
    if (!strcmp(val, "cpu"))
      o->cuda = false;
    else if (!strcmp(val, "cuda"))
      o->cuda = true;
    else
      return perr(err, cap, "--device: want cpu or cuda (got '%s')", val);
  } else {
    return perr(err, cap, "unknown flag '%s' (see --help)", flag);
  }
  return 0;
}

/* The preset, then the shape flags over it; names the model. */
static void apply_model(const parse_ctx *c, train_opts *o) {
  if (c->preset) {
    o->gpt2 = !train_model_preset(c->preset, &o->model);
    if (o->gpt2) train_gpt2_preset(c->preset, &o->model);
    snprintf(o->model_name, sizeof o->model_name, "%s", c->preset);
  }
  int64_t *fields[N_SHAPE_FLAGS] = {&o->model.dim,        &o->model.n_layers, &o->model.n_heads,
                                    &o->model.n_kv_heads, &o->model.ffn_dim,  &o->model.vocab,
                                    &o->model.max_seq_len};
  bool custom = false;
  for (int k = 0; k < N_SHAPE_FLAGS; k++)
    if (c->shape[k] > 0) {
      *fields[k] = c->shape[k];
      custom = true;
    }
  if (c->shape[2] > 0 && c->shape[3] < 0) o->model.n_kv_heads = o->model.n_heads;
  if (custom) {
    char tmp[16];
    snprintf(tmp, sizeof tmp, "%.8s", o->model_name);
    snprintf(o->model_name, sizeof o->model_name, "%s+flags", tmp);
  }
}

/* What the numbers imply, checked before anything is allocated: the rows
 * of a step (batch x seq-len x grad-accum x the mesh) fit in 64 bits, and
 * on the CPU the parameters with their gradients and AdamW moments (16
 * bytes each, over the dp_shard x tp ranks that split them), the logits
 * and the layers' activations of one micro-batch fit in this machine's
 * memory. A lower bound of the need: --layers 100000000 grew memory with
 * no output until the process was killed. */
static int check_size(const train_opts *o, char *err, size_t cap) {
  const train_mesh_spec *m = &o->mesh;
  const int64_t ranks = (int64_t)(m->dp_replicate ? m->dp_replicate : 1) *
                        (m->dp_shard ? m->dp_shard : 1) * (m->tp ? m->tp : 1);
  int64_t tokens;
  if (__builtin_mul_overflow(o->batch, o->model.max_seq_len, &tokens) ||
      __builtin_mul_overflow(tokens, o->grad_accum, &tokens) ||
      __builtin_mul_overflow(tokens, ranks, &tokens) || tokens > (1LL << 62))
    return perr(err, cap,
                "--batch %lld x --seq-len %lld x --grad-accum %lld over %lld ranks: more tokens "
                "per step than weft counts (2^62)",
                (long long)o->batch, (long long)o->model.max_seq_len, (long long)o->grad_accum,
                (long long)ranks);
  if (o->cuda) return 0; /* the device's memory is checked where it is allocated */
  const double split = (double)(m->dp_shard ? m->dp_shard : 1) * (m->tp ? m->tp : 1);
  const weft_llama_config *c = &o->model;
  const double rows = (double)o->batch * (double)c->max_seq_len;
  const double need = 16.0 * (double)train_count_params(o, c, true) / split +
                      4.0 * rows * ((double)c->vocab + 4.0 * (double)c->dim * (double)c->n_layers);
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  const double have = pages > 0 && page > 0 ? (double)pages * (double)page : 0;
  if (have > 0 && need > have)
    return perr(err, cap,
                "model and batch need at least %.1f GiB per rank (parameters, gradients and "
                "AdamW moments of %lld parameters, and one micro-batch's activations), more "
                "than this machine's %.1f GiB: use a smaller model or --batch",
                need / 1073741824.0, (long long)train_count_params(o, c, true),
                have / 1073741824.0);
  return 0;
}

/* Checks across flags, then the model's shape. */
static int check_options(train_opts *o, char *err, size_t cap) {
  const train_mesh_spec *m = &o->mesh;
  if (m->tp_across_nodes && m->tp_inside_node)
    return perr(err, cap, "--tp-across-nodes and --tp-inside-node contradict each other: give one");
  if ((m->tp_across_nodes || m->tp_inside_node) && !m->tp)
    return perr(err, cap, "%s: --mesh has no tp dim (e.g. --mesh dp=2,tp=2)",
                m->tp_across_nodes ? "--tp-across-nodes" : "--tp-inside-node");
  if (o->gpt2 && o->model.n_kv_heads != o->model.n_heads)
    return perr(err, cap, "--kv-heads: GPT-2 has no grouped-query attention (kv-heads = heads)");
  if (!o->gpt2 && o->dropout > 0)
    return perr(err, cap, "--dropout: the Llama model has no dropout (use a gpt2 preset)");
  if (o->dropout >= 1)
    return perr(err, cap, "--dropout %g: want a probability in [0, 1)", o->dropout);
  if (o->max_positions && !o->gpt2)
    return perr(err, cap, "--max-positions: the Llama model has no learned positions (RoPE)");
  if (o->max_positions && o->max_positions < o->model.max_seq_len)
    return perr(err, cap,
                "--max-positions %lld is below --seq-len %lld: a sequence needs a position each",
                (long long)o->max_positions, (long long)o->model.max_seq_len);
  if (o->export_hf && !o->export_path)
    return perr(err, cap, "--hf: it sets the layout of --export-safetensors F, which is not given");
  if (o->beta1 >= 1 || o->beta2 >= 1)
    return perr(err, cap, "--beta%d %g: want a number in [0, 1)", o->beta1 >= 1 ? 1 : 2,
                o->beta1 >= 1 ? o->beta1 : o->beta2);
  if (o->data && o->text) return perr(err, cap, "give --data or --text, not both");
  if (o->val_data && !o->data) return perr(err, cap, "--val-data needs --data");
  if (o->save_every > 0 && !o->save_dir) return perr(err, cap, "--save-every needs --save DIR");
  if (o->min_lr < 0) o->min_lr = o->lr / 10;
  if (o->warmup > o->steps) o->warmup = o->steps;
  if (check_size(o, err, cap)) return -1;
  weft_llama_config c = o->model;
  if (o->gpt2) {
    weft_gpt2_config g = train_gpt2_config(o);
    if (weft_gpt2_config_validate(&g) != WEFT_OK)
      return perr(err, cap, "model: %s", weft_last_error());
    return 0;
  }
  if (c.dim % c.n_heads)
    return perr(err, cap, "model: dim %lld is not divisible by heads %lld", (long long)c.dim,
                (long long)c.n_heads);
  if ((c.dim / c.n_heads) % 2)
    return perr(err, cap, "model: head dim %lld (dim / heads) must be even for RoPE",
                (long long)(c.dim / c.n_heads));
  if (c.n_heads % c.n_kv_heads)
    return perr(err, cap, "model: heads %lld is not divisible by kv-heads %lld",
                (long long)c.n_heads, (long long)c.n_kv_heads);
  if (weft_llama_config_validate(&c) != WEFT_OK)
    return perr(err, cap, "model: %s", weft_last_error());
  return 0;
}

int train_parse_args(int argc, char **argv, train_opts *o, char *err, size_t cap, bool print_help) {
  parse_ctx c = {.preset = NULL};
  for (int k = 0; k < N_SHAPE_FLAGS; k++) c.shape[k] = -1;
  for (int i = 1; i < argc; i++) {
    char flag[64];
    const char *val = NULL;
    if (split_flag(argv[i], flag, &val, err, cap)) return -1;
    if (!strcmp(flag, "--help") || !strcmp(flag, "-h")) {
      if (print_help) train_print_help(argv[0]);
      return 1;
    }
    int r = parse_switch(flag, val, o, err, cap);
    if (r < 0) return -1;
    if (r > 0) continue;
    if (!is_value_flag(flag)) return perr(err, cap, "unknown flag '%s' (see --help)", flag);
    if (!val) {
      if (i + 1 >= argc) return perr(err, cap, "%s needs a value (see --help)", flag);
      val = argv[++i];
    }
    r = parse_field(&c, flag, val, o, err, cap);
    if (r < 0) return -1;
    if (r == 0 && parse_other(&c, flag, val, o, err, cap)) return -1;
  }
  apply_model(&c, o);
  return check_options(o, err, cap);
}
