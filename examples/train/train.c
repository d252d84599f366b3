/* examples/train/train.c — weft-train's core: options, data, the hybrid
 * (FSDP x TP) model, the training loop, validation, logging, checkpoints.
 * See train.h. */
#include "train.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------ options */

bool train_model_preset(const char *name, weft_llama_config *c) {
  weft_llama_config d = WEFT_LLAMA_CONFIG_INIT;
  if (!strcmp(name, "demo")) {
    /* trains in seconds on 2 cores with 4 ranks */
    d.dim = 64; d.n_layers = 2; d.n_heads = 4; d.n_kv_heads = 4;
    d.ffn_dim = 176; d.vocab = 64; d.max_seq_len = 32;
  } else if (!strcmp(name, "tiny")) {
    d.dim = 256; d.n_layers = 4; d.n_heads = 8; d.n_kv_heads = 8;
    d.ffn_dim = 688; d.vocab = 256; d.max_seq_len = 256;
  } else if (!strcmp(name, "small")) {
    d.dim = 768; d.n_layers = 12; d.n_heads = 12; d.n_kv_heads = 12;
    d.ffn_dim = 2048; d.vocab = 8192; d.max_seq_len = 512;
  } else {
    return false;
  }
  *c = d;
  return true;
}

bool train_gpt2_preset(const char *name, weft_llama_config *c) {
  weft_llama_config d = WEFT_LLAMA_CONFIG_INIT;
  if (!strcmp(name, "gpt2-demo")) {
    /* trains in seconds on 2 cores with 4 ranks */
    d.dim = 64; d.n_layers = 2; d.n_heads = 4; d.ffn_dim = 256; d.vocab = 64; d.max_seq_len = 32;
  } else if (!strcmp(name, "gpt2-tiny")) {
    d.dim = 256; d.n_layers = 4; d.n_heads = 8; d.ffn_dim = 1024; d.vocab = 256;
    d.max_seq_len = 256;
  } else if (!strcmp(name, "gpt2") || !strcmp(name, "gpt2-small")) {
    /* GPT-2 124M as llm.c trains it (vocab padded to 50304) */
    d.dim = 768; d.n_layers = 12; d.n_heads = 12; d.ffn_dim = 3072; d.vocab = 50304;
    d.max_seq_len = 1024;
  } else {
    return false;
  }
  d.n_kv_heads = d.n_heads;
  *c = d;
  return true;
}

weft_gpt2_config train_gpt2_config(const train_opts *o) {
  weft_gpt2_config g = WEFT_GPT2_CONFIG_INIT;
  g.vocab = o->model.vocab;
  g.max_seq_len = o->model.max_seq_len;
  g.dim = o->model.dim;
  g.n_layers = o->model.n_layers;
  g.n_heads = o->model.n_heads;
  g.ffn_dim = o->model.ffn_dim;
  g.dropout = (float)o->dropout;
  return g;
}

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
  o->clip = 1.0;
  o->seed = 1234;
  o->reshard_after_forward = WEFT_FSDP_RESHARD_DEFAULT;
  o->loss_parallel = true;
  o->val_every = 10;
  o->val_batches = 2;
  o->peak_flops = 100e9; /* ~ one core's SGEMM (docs/DESIGN.md: 95 GF/s) */
}

void train_print_help(const char *prog) {
  printf(
      "usage: mpiexec -n N %s [flags]\n"
      "Trains the weft reference model (Llama-style) with FSDP on the dp dims and\n"
      "tensor parallelism on tp, over an N-D mesh of the world.\n"
      "\n"
      "mesh\n"
      "  --mesh SPEC             name=size pairs, e.g. dp=2,tp=2 or dp_replicate=2,dp_shard=2,tp=2;\n"
      "                          names: dp (= dp_shard), dp_replicate, dp_shard, tp; the product\n"
      "                          must be the world size (default: dp=<world size>). Laid out\n"
      "                          dp_replicate, dp_shard, tp (tp innermost).\n"
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
      "training\n"
      "  --steps N               optimizer steps (20)\n"
      "  --batch B               global batch in sequences per micro-step, split over dp (8)\n"
      "  --grad-accum K          micro-steps per optimizer step (1)\n"
      "  --lr X                  peak learning rate (3e-3); --min-lr X (lr/10): cosine floor\n"
      "  --warmup N              linear warmup steps (2), then cosine decay to min-lr\n"
      "  --weight-decay X        AdamW decoupled weight decay (0)\n"
      "  --clip X                gradient clipping max norm (1.0; 0 = no clipping)\n"
      "  --seed N                init seed (1234): same weights on every mesh\n"
      "  --dtype fp32|bf16       bf16: FSDP all-gathers bf16 parameters (mixed precision;\n"
      "                          math stays f32); needs a dp dim\n"
      "  --reshard-after-forward[=true|false|K]  FSDP reshard after forward for blocks\n"
      "                          and [norm, output] (default: PyTorch's)\n"
      "  --sequence-parallel     TP with sequence parallelism (norms sharded on T)\n"
      "  --no-loss-parallel      gather the logits instead of vocab-parallel loss\n"
      "  --device cpu|cuda       cuda: not supported yet (the layers compute on the CPU)\n"
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
      "  --resume DIR            continue from a checkpoint (any mesh)\n"
      "  --export-safetensors F  write the model as one safetensors file at the end\n"
      "  --init-from F           initial weights from a safetensors file\n"
      "output\n"
      "  --log-json FILE         one JSON object per step (rank 0)\n"
      "  --peak-tflops X         per-rank peak for MFU (0.1)\n"
      "  --quiet                 no per-step lines, only validation and the summary\n"
      "  --help                  this text\n",
      prog);
}

static int perr(char *err, size_t cap, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, cap, fmt, ap);
  va_end(ap);
  return -1;
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

static int parse_mesh(const char *s, train_mesh_spec *m, char *err, size_t cap) {
  memset(m, 0, sizeof *m);
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
    int *slot = NULL;
    if (!strcmp(tok, "dp")) {
      if (seen_shard) return perr(err, cap, "--mesh: give dp or dp_shard, not both");
      seen_dp = true;
      slot = &m->dp_shard;
    } else if (!strcmp(tok, "dp_shard")) {
      if (seen_dp) return perr(err, cap, "--mesh: give dp or dp_shard, not both");
      seen_shard = true;
      slot = &m->dp_shard;
    } else if (!strcmp(tok, "dp_replicate")) {
      slot = &m->dp_replicate;
    } else if (!strcmp(tok, "tp")) {
      slot = &m->tp;
    } else {
      return perr(err, cap, "--mesh: unknown dim '%s' (dims: dp, dp_replicate, dp_shard, tp)", tok);
    }
    if (*slot) return perr(err, cap, "--mesh: dim '%s' given twice", tok);
    *slot = (int)v;
    n++;
  }
  if (n == 0) return perr(err, cap, "--mesh: empty (e.g. --mesh dp=2,tp=2)");
  return 0;
}

int train_parse_args(int argc, char **argv, train_opts *o, char *err, size_t cap,
                     bool print_help) {
  /* model overrides, applied after the preset */
  int64_t ov[7];
  for (int i = 0; i < 7; i++) ov[i] = -1;
  static const char *const ov_names[7] = {"--dim",     "--layers", "--heads",  "--kv-heads",
                                          "--ffn-dim", "--vocab",  "--seq-len"};
  const char *preset = NULL;
  for (int i = 1; i < argc; i++) {
    char flag[64];
    const char *a = argv[i];
    const char *val = NULL;
    const char *eq = strchr(a, '=');
    if (strncmp(a, "--", 2) != 0) return perr(err, cap, "unexpected argument '%s' (see --help)", a);
    if (eq) {
      size_t len = (size_t)(eq - a);
      if (len >= sizeof flag) return perr(err, cap, "unknown flag '%s' (see --help)", a);
      memcpy(flag, a, len);
      flag[len] = 0;
      val = eq + 1;
    } else {
      snprintf(flag, sizeof flag, "%s", a);
    }
    /* flags without a value */
    if (!strcmp(flag, "--help") || !strcmp(flag, "-h")) {
      if (print_help) train_print_help(argv[0]);
      return 1;
    }
    if (!strcmp(flag, "--sequence-parallel") && !val) { o->sequence_parallel = true; continue; }
    if (!strcmp(flag, "--no-loss-parallel") && !val) { o->loss_parallel = false; continue; }
    if (!strcmp(flag, "--quiet") && !val) { o->quiet = true; continue; }
    if (!strcmp(flag, "--reshard-after-forward")) {
      if (!val || !strcmp(val, "true") || !strcmp(val, "1")) {
        o->reshard_after_forward = 1;
      } else if (!strcmp(val, "false") || !strcmp(val, "0")) {
        o->reshard_after_forward = 0;
      } else {
        int64_t k;
        if (!parse_i64(val, 2, &k) || k > INT_MAX)
          return perr(err, cap, "--reshard-after-forward: want true, false or a group size >= 2 (got '%s')", val);
        o->reshard_after_forward = (int)k;
      }
      continue;
    }
    /* flags with a value */
    static const char *const value_flags[] = {
        "--dim", "--layers", "--heads", "--kv-heads", "--ffn-dim", "--vocab", "--seq-len",
        "--steps", "--batch", "--grad-accum", "--warmup", "--val-every", "--val-batches",
        "--save-every", "--lr", "--min-lr", "--weight-decay", "--clip", "--peak-tflops", "--dropout",
        "--seed", "--mesh", "--model", "--dtype", "--device", "--data", "--val-data", "--text",
        "--save", "--resume", "--export-safetensors", "--init-from", "--log-json", NULL};
    bool known = false;
    for (int k = 0; value_flags[k]; k++) known = known || !strcmp(flag, value_flags[k]);
    if (!known) return perr(err, cap, "unknown flag '%s' (see --help)", flag);
    if (!val) {
      if (i + 1 >= argc) return perr(err, cap, "%s needs a value (see --help)", flag);
      val = argv[++i];
    }
    int64_t iv;
    double dv;
    bool matched = false;
    for (int k = 0; k < 7; k++)
      if (!strcmp(flag, ov_names[k])) {
        if (!parse_i64(val, 1, &iv)) return perr(err, cap, "%s: want an integer >= 1 (got '%s')", flag, val);
        ov[k] = iv;
        matched = true;
      }
    if (matched) continue;
#define INTFLAG(name, field, lo)                                                            \
  if (!strcmp(flag, name)) {                                                                \
    if (!parse_i64(val, lo, &iv)) return perr(err, cap, "%s: want an integer >= %d (got '%s')", name, lo, val); \
    o->field = iv;                                                                          \
    continue;                                                                               \
  }
#define DBLFLAG(name, field, lo)                                                              \
  if (!strcmp(flag, name)) {                                                                  \
    if (!parse_f64(val, &dv) || dv < (lo)) return perr(err, cap, "%s: want a number >= %g (got '%s')", name, (double)(lo), val); \
    o->field = dv;                                                                            \
    continue;                                                                                 \
  }
    INTFLAG("--steps", steps, 0)
    INTFLAG("--batch", batch, 1)
    INTFLAG("--grad-accum", grad_accum, 1)
    INTFLAG("--warmup", warmup, 0)
    INTFLAG("--val-every", val_every, 0)
    INTFLAG("--val-batches", val_batches, 0)
    INTFLAG("--save-every", save_every, 0)
    DBLFLAG("--lr", lr, 0)
    DBLFLAG("--min-lr", min_lr, 0)
    DBLFLAG("--weight-decay", weight_decay, 0)
    DBLFLAG("--clip", clip, 0)
    DBLFLAG("--dropout", dropout, 0)
#undef INTFLAG
#undef DBLFLAG
    if (!strcmp(flag, "--peak-tflops")) {
      if (!parse_f64(val, &dv) || dv <= 0) return perr(err, cap, "--peak-tflops: want a number > 0 (got '%s')", val);
      o->peak_flops = dv * 1e12;
      continue;
    }
    if (!strcmp(flag, "--seed")) {
      if (!parse_i64(val, 0, &iv)) return perr(err, cap, "--seed: want an integer >= 0 (got '%s')", val);
      o->seed = (uint64_t)iv;
      continue;
    }
    if (!strcmp(flag, "--mesh")) {
      if (parse_mesh(val, &o->mesh, err, cap)) return -1;
      continue;
    }
    if (!strcmp(flag, "--model")) {
      weft_llama_config tmp;
      if (!train_model_preset(val, &tmp) && !train_gpt2_preset(val, &tmp))
        return perr(err, cap,
                    "--model: unknown preset '%s' (demo, tiny, small, gpt2-demo, gpt2-tiny, gpt2)",
                    val);
      preset = val;
      continue;
    }
    if (!strcmp(flag, "--dtype")) {
      if (!strcmp(val, "fp32") || !strcmp(val, "f32") || !strcmp(val, "float32")) o->bf16 = false;
      else if (!strcmp(val, "bf16") || !strcmp(val, "bfloat16")) o->bf16 = true;
      else return perr(err, cap, "--dtype: want fp32 or bf16 (got '%s')", val);
      continue;
    }
    if (!strcmp(flag, "--device")) {
      if (!strcmp(val, "cpu")) o->cuda = false;
      else if (!strcmp(val, "cuda")) o->cuda = true;
      else return perr(err, cap, "--device: want cpu or cuda (got '%s')", val);
      continue;
    }
#define STRFLAG(name, field)   \
  if (!strcmp(flag, name)) {   \
    if (!*val) return perr(err, cap, "%s: empty value", name); \
    o->field = val;            \
    continue;                  \
  }
    STRFLAG("--data", data)
    STRFLAG("--val-data", val_data)
    STRFLAG("--text", text)
    STRFLAG("--save", save_dir)
    STRFLAG("--resume", resume_dir)
    STRFLAG("--export-safetensors", export_path)
    STRFLAG("--init-from", init_from)
    STRFLAG("--log-json", log_json)
#undef STRFLAG
    return perr(err, cap, "unknown flag '%s' (see --help)", flag);
  }
  if (preset) {
    o->gpt2 = !train_model_preset(preset, &o->model);
    if (o->gpt2) train_gpt2_preset(preset, &o->model);
    snprintf(o->model_name, sizeof o->model_name, "%s", preset);
  }
  int64_t *fields[7] = {&o->model.dim, &o->model.n_layers, &o->model.n_heads,
                        &o->model.n_kv_heads, &o->model.ffn_dim, &o->model.vocab,
                        &o->model.max_seq_len};
  bool custom = false;
  for (int k = 0; k < 7; k++)
    if (ov[k] > 0) {
      *fields[k] = ov[k];
      custom = true;
    }
  if (ov[2] > 0 && ov[3] < 0) o->model.n_kv_heads = o->model.n_heads;
  if (o->gpt2 && o->model.n_kv_heads != o->model.n_heads)
    return perr(err, cap, "--kv-heads: GPT-2 has no grouped-query attention (kv-heads = heads)");
  if (!o->gpt2 && o->dropout > 0)
    return perr(err, cap, "--dropout: the Llama model has no dropout (use a gpt2 preset)");
  if (o->dropout >= 1) return perr(err, cap, "--dropout %g: want a probability in [0, 1)", o->dropout);
  if (custom) {
    char tmp[16];
    snprintf(tmp, sizeof tmp, "%.8s", o->model_name);
    snprintf(o->model_name, sizeof o->model_name, "%s+flags", tmp);
  }
  if (o->data && o->text) return perr(err, cap, "give --data or --text, not both");
  if (o->val_data && !o->data) return perr(err, cap, "--val-data needs --data");
  if (o->save_every > 0 && !o->save_dir) return perr(err, cap, "--save-every needs --save DIR");
  if (o->min_lr < 0) o->min_lr = o->lr / 10;
  if (o->warmup > o->steps) o->warmup = o->steps;
  weft_llama_config c = o->model;
  if (o->gpt2) {
    weft_gpt2_config g = train_gpt2_config(o);
    if (weft_gpt2_config_validate(&g) != WEFT_OK) return perr(err, cap, "model: %s", weft_last_error());
    return 0;
  }
  if (c.dim % c.n_heads) return perr(err, cap, "model: dim %lld is not divisible by heads %lld", (long long)c.dim, (long long)c.n_heads);
  if ((c.dim / c.n_heads) % 2) return perr(err, cap, "model: head dim %lld (dim / heads) must be even for RoPE", (long long)(c.dim / c.n_heads));
  if (c.n_heads % c.n_kv_heads) return perr(err, cap, "model: heads %lld is not divisible by kv-heads %lld", (long long)c.n_heads, (long long)c.n_kv_heads);
  if (weft_llama_config_validate(&c) != WEFT_OK) return perr(err, cap, "model: %s", weft_last_error());
  return 0;
}

/* --------------------------------------------------------------- MPI helpers */

/* Nonblocking collective wait with weft's backoff (MPICH busy-polls; more
 * ranks than cores make blocking collectives crawl, docs/DESIGN.md "MPICH
 * notes"). A failure
 * (an MPI error, or no answer within WEFT_TIMEOUT: a rank died) cannot be
 * agreed on any more, so it ends the job. */
static void wait_req(MPI_Request *r) {
  if (weft_wait_requests(1, r, "weft-train collective") != WEFT_OK) {
    fprintf(stderr, "weft-train: error: %s\n", weft_last_error());
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
}

static void allreduce_d(double *v, int n, MPI_Op op) {
  MPI_Request r;
  MPI_Iallreduce(MPI_IN_PLACE, v, n, MPI_DOUBLE, op, MPI_COMM_WORLD, &r);
  wait_req(&r);
}

static void allreduce_i64(int64_t *v, int n, MPI_Op op) {
  MPI_Request r;
  MPI_Iallreduce(MPI_IN_PLACE, v, n, MPI_INT64_T, op, MPI_COMM_WORLD, &r);
  wait_req(&r);
}

/* Agrees on a failure (weft_agree_status): returns true on every rank if
 * any rank failed; the lowest failing rank prints its message (one line).
 * If the agreement itself fails every rank prints why. */
static bool agree_fail(bool failed, const char *msg) {
  int who = -1;
  weft_status st = weft_agree_status(MPI_COMM_WORLD, failed ? WEFT_ERR_INVALID : WEFT_OK,
                                     msg ? msg : "(unknown)", "weft-train", &who);
  if (st == WEFT_OK) return false;
  if (who < 0 || who == weft_world_rank()) {
    const char *m = who < 0 ? weft_last_error() : msg ? msg : "(unknown)";
    fprintf(stderr, "weft-train: error: %s\n", m);
    fflush(stderr);
  }
  return true;
}

/* A failure every rank finds alike: rank 0 prints. */
static int fail_all(const char *fmt, ...) {
  if (weft_world_rank() == 0) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "weft-train: error: %s\n", buf);
    fflush(stderr);
  }
  return 2;
}

/* ----------------------------------------------------------------- data */

/* Token sources: the embedded synthetic language (in memory), an llm.c
 * .bin file or a text file (read with pread: each rank reads only the rows
 * of its part of the batch). A split is a token range [lo, hi). */
typedef struct token_src {
  int fd;            /* -1: in memory */
  const uint16_t *mem;
  int64_t base;      /* byte offset of token 0 in the file */
  int width;         /* bytes per token: 2 (.bin) or 1 (text) */
  int64_t lo, hi;    /* the split */
  char path[512];
} token_src;

static uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

/* The embedded synthetic language over tokens [0, V) (V >= 16), a fixed
 * stream (independent of --seed):
 *   - 32 words, word w = 2..5 tokens drawn from [3, V);
 *   - a sentence is 4..9 words where each word is followed by one of 2
 *     successors fixed per word (a sparse Markov chain), then token 0;
 *   - one sentence in four is a counting run instead: token 1, then
 *     a, a+1, ..., a+7 (wrapping within [3, V)), then token 0.
 * Within a word and a run the next token is determined by the context; at
 * word boundaries it is one of two. A model that learns this reaches a
 * held-out accuracy well above the 1/V of chance (and loss far below
 * ln V). */
#define SYN_WORDS 32
static uint16_t *synth_generate(int64_t V, int64_t n) {
  uint16_t *out = malloc(sizeof(uint16_t) * (size_t)n);
  if (!out) return NULL;
  uint16_t words[SYN_WORDS][5];
  int wlen[SYN_WORDS], succ[SYN_WORDS][2];
  const uint64_t S = 20240520;
  for (int w = 0; w < SYN_WORDS; w++) {
    wlen[w] = 2 + (int)(mix64(S * 31 + (uint64_t)w) % 4);
    for (int k = 0; k < wlen[w]; k++)
      words[w][k] = (uint16_t)(3 + mix64(S * 17 + (uint64_t)(w * 8 + k)) % (uint64_t)(V - 3));
    succ[w][0] = (int)(mix64(S * 7 + (uint64_t)w) % SYN_WORDS);
    succ[w][1] = (int)(mix64(S * 11 + (uint64_t)w) % SYN_WORDS);
  }
  int64_t i = 0;
  uint64_t r = S;
  while (i < n) {
    r = mix64(r);
    if (r % 4 == 0) {
      out[i++] = 1;
      int64_t a = (int64_t)((r >> 8) % (uint64_t)(V - 3));
      for (int k = 0; k < 8 && i < n; k++) out[i++] = (uint16_t)(3 + (a + k) % (V - 3));
    } else {
      int nw = 4 + (int)((r >> 8) % 6);
      int w = (int)((r >> 16) % SYN_WORDS);
      for (int j = 0; j < nw && i < n; j++) {
        for (int k = 0; k < wlen[w] && i < n; k++) out[i++] = words[w][k];
        r = mix64(r);
        w = succ[w][r & 1];
      }
    }
    if (i < n) out[i++] = 0;
  }
  return out;
}

/* Opens an llm.c .bin token file: 256 int32 header (magic 20240520,
 * version 1, token count), then uint16 tokens. */
static int open_bin(const char *path, token_src *s, char *err, size_t cap) {
  memset(s, 0, sizeof *s);
  snprintf(s->path, sizeof s->path, "%s", path);
  s->fd = open(path, O_RDONLY);
  if (s->fd < 0) return perr(err, cap, "cannot open data file '%s': %s", path, strerror(errno));
  int32_t h[256];
  ssize_t got = pread(s->fd, h, sizeof h, 0);
  struct stat st;
  fstat(s->fd, &st);
  if (got != (ssize_t)sizeof h) return perr(err, cap, "data file '%s': shorter than the 1024-byte header", path);
  if (h[0] != 20240520) return perr(err, cap, "data file '%s': bad magic %d (want 20240520: llm.c .bin)", path, h[0]);
  if (h[1] != 1) return perr(err, cap, "data file '%s': version %d (want 1)", path, h[1]);
  int64_t n = h[2];
  if (n < 0 || 1024 + 2 * n > (int64_t)st.st_size)
    return perr(err, cap, "data file '%s': header says %lld tokens but the file holds %lld", path,
                (long long)n, (long long)((st.st_size - 1024) / 2));
  s->base = 1024;
  s->width = 2;
  s->lo = 0;
  s->hi = n;
  return 0;
}

static int open_text(const char *path, token_src *s, char *err, size_t cap) {
  memset(s, 0, sizeof *s);
  snprintf(s->path, sizeof s->path, "%s", path);
  s->fd = open(path, O_RDONLY);
  if (s->fd < 0) return perr(err, cap, "cannot open text file '%s': %s", path, strerror(errno));
  struct stat st;
  fstat(s->fd, &st);
  s->width = 1;
  s->lo = 0;
  s->hi = st.st_size;
  return 0;
}

/* Reads tokens [pos, pos + n) of the split into out. */
static int src_read(const token_src *s, int64_t pos, int64_t n, int32_t *out, int64_t V,
                    char *err, size_t cap) {
  int64_t at = s->lo + pos;
  if (s->fd < 0) {
    for (int64_t i = 0; i < n; i++) out[i] = s->mem[at + i];
  } else {
    uint8_t buf[8192];
    int64_t done = 0;
    while (done < n) {
      int64_t k = n - done;
      if (k * s->width > (int64_t)sizeof buf) k = (int64_t)sizeof buf / s->width;
      ssize_t got = pread(s->fd, buf, (size_t)(k * s->width), (off_t)(s->base + (at + done) * s->width));
      if (got != (ssize_t)(k * s->width)) return perr(err, cap, "reading '%s' failed at token %lld", s->path, (long long)(at + done));
      for (int64_t i = 0; i < k; i++)
        out[done + i] = s->width == 2 ? (int32_t)((uint16_t)(buf[2 * i] | (buf[2 * i + 1] << 8))) : (int32_t)buf[i];
      done += k;
    }
  }
  for (int64_t i = 0; i < n; i++)
    if (out[i] >= V)
      return perr(err, cap, "'%s': token %d at %lld is >= the model's vocab %lld (use --vocab)",
                  s->fd < 0 ? "embedded data" : s->path, out[i], (long long)(at + i), (long long)V);
  return 0;
}

/* Rows [row0, row0 + rows) of a batch: tokens and targets (rows, T). Row g
 * of training step s is the window at (base_s + g (T + 1)) mod span, with
 * base_s pseudo-random per step; validation batch j takes evenly spaced
 * windows of the held-out split. Each dp rank reads only its own rows. */
static int make_batch(const token_src *s, bool train, uint64_t seed, int64_t step, int64_t B,
                      int64_t T, int64_t row0, int64_t rows, int32_t *tok, int32_t *tgt,
                      int32_t *scratch, int64_t V, char *err, size_t cap) {
  int64_t span = s->hi - s->lo - (T + 1);
  for (int64_t r = 0; r < rows; r++) {
    int64_t g = row0 + r, pos;
    if (train) {
      /* consecutive windows from a random start per step: the rows of one
       * step (and so the dp ranks' parts) are disjoint whenever the split
       * holds B * (T + 1) tokens */
      int64_t base = (int64_t)(mix64(seed * 0x100000001b3ULL ^ mix64((uint64_t)step * 1000003ULL)) %
                               (uint64_t)(span + 1));
      pos = (base + g * (T + 1)) % (span + 1);
    } else {
      int64_t slots = (span + 1);
      pos = ((step * B + g) * (T + 1)) % slots;
    }
    if (src_read(s, pos, T + 1, scratch, V, err, cap)) return -1;
    memcpy(tok + r * T, scratch, sizeof(int32_t) * (size_t)T);
    memcpy(tgt + r * T, scratch + 1, sizeof(int32_t) * (size_t)T);
  }
  return 0;
}

/* ---------------------------------------------------------------- the run */

typedef struct run_state {
  const train_opts *o;
  weft_llama_config cfg;
  int rank, world;
  int ndim;
  int shape[TRAIN_MAX_DIMS];
  const char *names[TRAIN_MAX_DIMS];
  int ndp, tp_size, dp_total, dp_index;
  weft_mesh *root, *dp, *model_mesh;
  weft_module *model;
  weft_tp *tp;
  weft_fsdp *root_fsdp;
  weft_optimizer *opt;
  token_src train_src, val_src;
  uint16_t *synth;
  FILE *json;
  weft_dcp_async *pending_save;
  weft_graph *graph; /* GPT-2: the tape its forward records */
  weft_dtensor *ids, *targets; /* GPT-2: the graph's inputs until its next reset */
} run_state;

/* GPT-2's mean loss on this rank's rows (tok, tgt: (rows, T) int32) as a
 * graph forward, then its backward when `train`. key numbers the
 * micro-step (it keys the dropout masks, the same on every mesh and on
 * resume). *logits (may be NULL): the logits DTensor (vocab-sharded with
 * TP), valid until the next call. Collective over the world (the model's
 * and FSDP's communication). */
static weft_status gpt2_step(run_state *s, const weft_tensor *tok, const weft_tensor *tgt,
                             bool train, int64_t key, double *loss,
                             const weft_dtensor **logits) {
  weft_graph *g = s->graph;
  WEFT_CHECK(weft_graph_reset(g));
  weft_dtensor_destroy(s->ids);
  weft_dtensor_destroy(s->targets);
  s->ids = s->targets = NULL;
  weft_graph_set_training(g, train);
  weft_graph_set_grad_enabled(g, train);
  weft_graph_set_step(g, key);
  weft_placement r = weft_replicate();
  WEFT_CHECK(weft_dtensor_distribute(s->model_mesh, tok, WEFT_DTENSOR_ALL_RANKS, &r, 1, &s->ids));
  WEFT_CHECK(weft_dtensor_distribute(s->model_mesh, tgt, WEFT_DTENSOR_ALL_RANKS, &r, 1,
                                     &s->targets));
  weft_var *l = NULL, *z = NULL;
  WEFT_CHECK(weft_gpt2_loss(s->model, g, s->ids, s->targets, &l, &z));
  *loss = weft_var_item(l);
  if (train) WEFT_CHECK(weft_backward(l));
  if (logits) *logits = weft_var_value(z);
  return WEFT_OK;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void fmt_bytes(double b, char *buf, size_t cap) {
  const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int k = 0;
  while (b >= 1024 && k < 4) {
    b /= 1024;
    k++;
  }
  snprintf(buf, cap, k ? "%.1f %s" : "%.0f %s", b, u[k]);
}

static int64_t count_params(const weft_llama_config *c, bool gpt2, bool with_embedding) {
  if (gpt2) {
    /* wte (tied to lm_head), wpe, blocks (ln_1, c_attn, c_proj, ln_2, c_fc,
     * c_proj, with biases), ln_f; without embedding: without wpe (nanoGPT's
     * count: wte works as the output layer) */
    int64_t D = c->dim, F = c->ffn_dim;
    int64_t per = 2 * D + 3 * D * D + 3 * D + D * D + D + 2 * D + F * D + F + D * F + D;
    int64_t n = c->vocab * D + c->n_layers * per + 2 * D;
    return with_embedding ? n + c->max_seq_len * D : n;
  }
  int64_t D = c->dim, hd = c->dim / c->n_heads, H = c->n_heads, Hk = c->n_kv_heads;
  int64_t per = D + H * hd * D + 2 * Hk * hd * D + D * H * hd + D + 3 * c->ffn_dim * D;
  int64_t n = c->n_layers * per + D + c->vocab * D;
  if (with_embedding) n += c->vocab * D;
  return n;
}

/* Training FLOPs per token (PaLM appendix B): 6 N (N without the input
 * embedding, a lookup) + 12 L D T for attention scores and values. */
static double flops_per_token(const weft_llama_config *c, bool gpt2, int64_t T) {
  return 6.0 * (double)count_params(c, gpt2, false) + 12.0 * (double)c->n_layers * (double)c->dim * (double)T;
}

static weft_status set_model_sd(run_state *s, weft_state_dict *sd, int64_t step) {
  WEFT_CHECK(weft_get_model_state_dict(s->model, NULL, sd));
  WEFT_CHECK(weft_get_optimizer_state_dict(s->model, s->opt, NULL, sd));
  WEFT_CHECK(weft_state_dict_set_int(sd, "train.step", step));
  WEFT_CHECK(weft_state_dict_set_llama_config(sd, "model.config", &s->cfg));
  WEFT_CHECK(weft_state_dict_set_string(sd, "model.family", s->o->gpt2 ? "gpt2" : "llama"));
  return WEFT_OK;
}

/* Validation: val_batches held-out batches (B rows each, split over dp):
 * mean loss and next-token accuracy over all of them. */
static int validate(run_state *s, int32_t *tok, int32_t *tgt, int32_t *scratch, double *loss_out,
                    double *acc_out) {
  const train_opts *o = s->o;
  int64_t B = o->batch, T = s->cfg.max_seq_len, rows = B / s->dp_total, V = s->cfg.vocab;
  double acc[2] = {0, 0}; /* loss sum over (rank, batch), correct count */
  char err[512] = "";
  int64_t nb = o->val_batches > 0 ? o->val_batches : 1;
  weft_tensor *tt = NULL, *gt = NULL;
  int64_t shape[2] = {rows, T};
  weft_tensor_wrap(tok, WEFT_I32, WEFT_CPU, 2, shape, &tt);
  weft_tensor_wrap(tgt, WEFT_I32, WEFT_CPU, 2, shape, &gt);
  int rc = 0;
  for (int64_t j = 0; j < nb && !rc; j++) {
    int bad = make_batch(&s->val_src, false, o->seed, j, B, T, s->dp_index * rows, rows, tok, tgt,
                         scratch, V, err, sizeof err);
    if (agree_fail(bad != 0, err)) { rc = 2; break; }
    double l = 0;
    const weft_dtensor *lg = NULL;
    weft_status st = s->o->gpt2 ? gpt2_step(s, tt, gt, false, 0, &l, &lg)
                                : weft_llama_forward(s->model, tt, gt, &l);
    if (agree_fail(st != WEFT_OK, weft_last_error())) { rc = 2; break; }
    acc[0] += l;
    /* accuracy: argmax over the vocab of the logits, whose local shard on
     * the tp dim may be a vocab range (loss parallel) */
    if (!s->o->gpt2) lg = weft_llama_logits(s->model);
    weft_tensor *loc = NULL;
    if (weft_dtensor_to_local(lg, &loc) != WEFT_OK) { rc = fail_all("validation: %s", weft_last_error()); break; }
    int64_t v0 = 0, nv = loc->shape[2];
    const weft_placement *pl = weft_dtensor_placements(lg);
    if (pl[0].kind == WEFT_PLACE_SHARD && s->tp_size > 1) {
      int64_t len;
      weft_chunk_range(V, s->tp_size, weft_mesh_coord(s->model_mesh, 0), &v0, &len);
    }
    int64_t N = rows * T;
    float *best = malloc(sizeof(float) * (size_t)(2 * N));
    const float *z = loc->data;
    for (int64_t n = 0; n < N; n++) {
      float m = -INFINITY;
      int64_t arg = 0;
      for (int64_t k = 0; k < nv; k++) {
        float x = z[n * nv + k];
        if (x > m) { m = x; arg = v0 + k; }
      }
      best[n] = m;
      best[N + n] = (float)arg;
    }
    if (s->tp_size > 1 && pl[0].kind == WEFT_PLACE_SHARD) {
      /* global max, then the lowest index attaining it */
      float *mx = malloc(sizeof(float) * (size_t)N);
      memcpy(mx, best, sizeof(float) * (size_t)N);
      weft_all_reduce(s->model_mesh, 0, mx, mx, N, WEFT_F32, WEFT_OP_MAX, NULL);
      for (int64_t n = 0; n < N; n++) best[N + n] = best[n] == mx[n] ? best[N + n] : (float)V;
      weft_all_reduce(s->model_mesh, 0, best + N, best + N, N, WEFT_F32, WEFT_OP_MIN, NULL);
      free(mx);
    }
    for (int64_t n = 0; n < N; n++) acc[1] += (int32_t)best[N + n] == tgt[n];
    free(best);
    weft_tensor_destroy(loc);
  }
  weft_tensor_destroy(tt);
  weft_tensor_destroy(gt);
  if (rc) return rc;
  /* tp ranks hold the same numbers: sums over the world / tp = sums over dp */
  allreduce_d(acc, 2, MPI_SUM);
  *loss_out = acc[0] / ((double)nb * s->world);
  *acc_out = acc[1] / s->tp_size / ((double)nb * B * T);
  return 0;
}

static int setup(run_state *s, train_result *res) {
  const train_opts *o = s->o;
  char err[1024] = "";
  /* mesh */
  const train_mesh_spec *m = &o->mesh;
  int nd = 0;
  if (m->given) {
    if (m->dp_replicate) {
      s->shape[nd] = m->dp_replicate;
      s->names[nd++] = "dp_replicate";
      /* HSDP needs a (replicate, shard) pair: a shard dim of 1 if absent */
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
  } else {
    s->shape[nd] = s->world;
    s->names[nd++] = "dp";
    s->ndp = 1;
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
    return fail_all("--mesh %s needs %lld ranks but the world has %d (mpiexec -n %d)", desc,
                    (long long)prod, s->world, s->world);
  s->tp_size = m->tp ? m->tp : 1;
  s->dp_total = (int)(prod / s->tp_size);
  const weft_llama_config *c = &s->cfg;
  if (o->gpt2 && !o->loss_parallel)
    return fail_all("--no-loss-parallel: GPT-2's tied lm_head always makes vocab-sharded logits "
                    "under TP (its loss is loss parallel)");
  if (o->cuda)
    return fail_all("--device cuda: not supported yet (weft's layers compute on the CPU; %s)",
                    WEFT_HAVE_CUDA ? "this build has the CUDA kernels but nn does not use them" :
                                     "this build has no CUDA backend");
  if (s->tp_size > 1) {
    if (c->n_heads % s->tp_size || c->n_kv_heads % s->tp_size)
      return fail_all("model: heads %lld and kv-heads %lld must be divisible by tp=%d",
                      (long long)c->n_heads, (long long)c->n_kv_heads, s->tp_size);
    if (o->sequence_parallel && c->max_seq_len % s->tp_size)
      return fail_all("--sequence-parallel: seq-len %lld must be divisible by tp=%d",
                      (long long)c->max_seq_len, s->tp_size);
  }
  if (o->batch % s->dp_total)
    return fail_all("--batch %lld must be divisible by the data-parallel size %d",
                    (long long)o->batch, s->dp_total);
  if (o->bf16 && s->dp_total < 2)
    return fail_all("--dtype bf16: bf16 is FSDP's mixed precision (bf16 all-gathers) and needs a dp dim > 1; nn computes in fp32 only");
  if (o->reshard_after_forward >= 2 && s->ndp && o->reshard_after_forward != WEFT_FSDP_RESHARD_DEFAULT &&
      s->shape[s->ndp - 1] % o->reshard_after_forward)
    return fail_all("--reshard-after-forward=%d must divide the dp shard size %d",
                    o->reshard_after_forward, s->shape[s->ndp - 1]);
  /* data (every rank opens the files; failures agreed) */
  int bad = 0;
  int64_t V = c->vocab, T = c->max_seq_len;
  if (o->data) {
    bad = open_bin(o->data, &s->train_src, err, sizeof err);
    if (!bad) {
      if (o->val_data) {
        bad = open_bin(o->val_data, &s->val_src, err, sizeof err);
      } else {
        int64_t n = s->train_src.hi, cut = n - n / 10;
        s->val_src = s->train_src;
        s->val_src.fd = dup(s->train_src.fd);
        s->train_src.hi = cut;
        s->val_src.lo = cut;
      }
    }
  } else if (o->text) {
    if (V < 256) {
      bad = perr(err, sizeof err, "--text: byte-level tokens need --vocab >= 256 (model has %lld)", (long long)V);
    } else {
      bad = open_text(o->text, &s->train_src, err, sizeof err);
      if (!bad) {
        int64_t n = s->train_src.hi, cut = n - n / 10;
        s->val_src = s->train_src;
        s->val_src.fd = dup(s->train_src.fd);
        s->train_src.hi = cut;
        s->val_src.lo = cut;
      }
    }
  } else {
    if (V < 16) {
      bad = perr(err, sizeof err, "the embedded data needs --vocab >= 16 (model has %lld)", (long long)V);
    } else {
      int64_t n = (1 << 17) + (1 << 14);
      s->synth = synth_generate(V, n);
      memset(&s->train_src, 0, sizeof s->train_src);
      s->train_src.fd = -1;
      s->train_src.mem = s->synth;
      s->train_src.hi = 1 << 17;
      s->val_src = s->train_src;
      s->val_src.lo = 1 << 17;
      s->val_src.hi = n;
    }
  }
  if (!bad && (s->train_src.hi - s->train_src.lo < T + 1 || s->val_src.hi - s->val_src.lo < T + 1))
    bad = perr(err, sizeof err, "data: the train and held-out splits need at least seq-len + 1 = %lld tokens each (have %lld and %lld)",
               (long long)(T + 1), (long long)(s->train_src.hi - s->train_src.lo),
               (long long)(s->val_src.hi - s->val_src.lo));
  if (agree_fail(bad != 0, err)) return 2;

  /* meshes */
  weft_status st = weft_mesh_create(nd, s->shape, s->names, &s->root);
  if (agree_fail(st != WEFT_OK, weft_last_error())) return 2;
  if (s->ndp) WEFT_CHECK_GOTO(weft_mesh_submesh(s->root, s->ndp, s->names, &s->dp), st, fail);
  if (m->tp) {
    WEFT_CHECK_GOTO(weft_mesh_submesh(s->root, 1, &s->names[s->ndp], &s->model_mesh), st, fail);
  } else {
    int one = 1;
    const char *tn[1] = {"tp"};
    WEFT_CHECK_GOTO(weft_mesh_create_from_comm(MPI_COMM_SELF, 1, &one, tn, &s->model_mesh), st, fail);
  }
  if (s->ndp == 2)
    s->dp_index = weft_mesh_coord(s->dp, 0) * s->shape[1] + weft_mesh_coord(s->dp, 1);
  else if (s->ndp == 1)
    s->dp_index = weft_mesh_coord(s->dp, 0);

  /* model: shapes only, then TP placements, then FSDP, then storage */
  weft_gpt2_config gcfg = train_gpt2_config(o);
  if (o->gpt2) {
    WEFT_CHECK_GOTO(weft_gpt2_create(&gcfg, s->model_mesh, &s->model), st, fail);
    WEFT_CHECK_GOTO(weft_graph_create(&s->graph), st, fail);
    weft_graph_set_seed(s->graph, o->seed);
    WEFT_CHECK_GOTO(weft_graph_set_batch_slice(s->graph, (int64_t)s->dp_index * (o->batch / s->dp_total),
                                               o->batch),
                    st, fail);
  } else {
    WEFT_CHECK_GOTO(weft_llama_create(c, s->model_mesh, &s->model), st, fail);
  }
  if (s->tp_size > 1 && o->gpt2)
    WEFT_CHECK_GOTO(weft_gpt2_apply_tp(s->model, s->model_mesh, o->sequence_parallel, &s->tp),
                    st, fail);
  else if (s->tp_size > 1)
    WEFT_CHECK_GOTO(weft_tp_apply_llama_plan(s->model, s->model_mesh, o->sequence_parallel,
                                             o->loss_parallel, &s->tp), st, fail);
  if (s->dp_total > 1) {
    weft_fsdp_options blk = WEFT_FSDP_OPTIONS_INIT, rootopt = WEFT_FSDP_OPTIONS_INIT;
    blk.reshard_after_forward = o->reshard_after_forward;
    if (o->bf16) {
      blk.mp.param_dtype = WEFT_BF16;
      blk.mp.reduce_dtype = WEFT_F32;
      rootopt.mp = blk.mp;
    }
    for (int64_t i = 0; i < c->n_layers; i++) {
      char name[32];
      weft_module *b = NULL;
      snprintf(name, sizeof name, o->gpt2 ? "transformer.h.%lld" : "layers.%lld", (long long)i);
      WEFT_CHECK_GOTO(weft_module_find(s->model, name, &b), st, fail);
      WEFT_CHECK_GOTO(weft_fully_shard(b, s->dp, &blk, NULL), st, fail);
    }
    if (!o->gpt2) { /* GPT-2: ln_f and the tied wte / lm_head stay in the root group */
      weft_module *last[2];
      WEFT_CHECK_GOTO(weft_module_find(s->model, "norm", &last[0]), st, fail);
      WEFT_CHECK_GOTO(weft_module_find(s->model, "output", &last[1]), st, fail);
      WEFT_CHECK_GOTO(weft_fully_shard_modules(last, 2, s->dp, &blk, NULL), st, fail);
    }
    WEFT_CHECK_GOTO(weft_fully_shard(s->model, s->dp, &rootopt, &s->root_fsdp), st, fail);
  }
  WEFT_CHECK_GOTO(weft_module_init_weights(s->model, o->seed), st, fail);
  if (o->init_from) {
    weft_key_list missing = {0}, unexpected = {0};
    st = weft_safetensors_import_model(s->model, o->init_from, NULL, &missing, &unexpected);
    weft_key_list_clear(&missing);
    weft_key_list_clear(&unexpected);
    if (st != WEFT_OK) {
      if (s->rank == 0) fprintf(stderr, "weft-train: error: --init-from %s: %s\n", o->init_from, weft_last_error());
      return 2;
    }
  }
  weft_adamw_params hp = WEFT_ADAMW_DEFAULT;
  hp.lr = (float)o->lr;
  hp.weight_decay = (float)o->weight_decay;
  if (o->gpt2) WEFT_CHECK_GOTO(weft_gpt2_adamw_create(s->model, &hp, &s->opt), st, fail);
  else WEFT_CHECK_GOTO(weft_adamw_create(s->model, &hp, &s->opt), st, fail);
  if (s->root_fsdp) weft_fsdp_memory_track(s->opt);
  if (res) {
    res->ndim = nd;
    for (int d = 0; d < nd; d++) {
      snprintf(res->dim_names[d], sizeof res->dim_names[d], "%s", s->names[d]);
      res->dim_sizes[d] = s->shape[d];
    }
  }
  return 0;
fail:
  /* argument errors of the library are found alike on every rank */
  if (s->rank == 0) fprintf(stderr, "weft-train: error: %s\n", weft_last_error());
  return 2;
}

static void teardown(run_state *s) {
  if (s->pending_save) weft_dcp_async_wait(s->pending_save);
  s->pending_save = NULL;
  if (s->root_fsdp || s->dp_total > 1) weft_fsdp_memory_track(NULL);
  weft_optimizer_destroy(s->opt);
  weft_graph_destroy(s->graph);
  weft_dtensor_destroy(s->ids);
  weft_dtensor_destroy(s->targets);
  if (s->model) weft_fsdp_destroy_all(s->model);
  weft_tp_destroy(s->tp);
  weft_module_destroy(s->model);
  weft_mesh_destroy(s->model_mesh);
  weft_mesh_destroy(s->dp);
  weft_mesh_destroy(s->root);
  if (s->train_src.fd > 0) close(s->train_src.fd);
  if (s->val_src.fd > 0) close(s->val_src.fd);
  free(s->synth);
  if (s->json) fclose(s->json);
}

static void progress(int64_t step, int64_t total) {
  int w = 30, fill = total ? (int)(w * step / total) : w;
  printf("\r\033[K[");
  for (int i = 0; i < w; i++) putchar(i < fill ? '#' : '.');
  printf("] %lld/%lld", (long long)step, (long long)total);
  fflush(stdout);
}

int train_run(const train_opts *o, train_result *res) {
  run_state S, *s = &S;
  memset(s, 0, sizeof *s);
  s->o = o;
  s->cfg = o->model;
  s->rank = weft_world_rank();
  s->world = weft_world_size();
  s->train_src.fd = s->val_src.fd = -1;
  if (res) memset(res, 0, sizeof *res);
  int rc = setup(s, res);
  if (rc) {
    teardown(s);
    return rc;
  }
  const weft_llama_config *c = &s->cfg;
  int64_t B = o->batch, T = c->max_seq_len, V = c->vocab, rows = B / s->dp_total;
  int32_t *tok = malloc(sizeof(int32_t) * (size_t)(rows * T));
  int32_t *tgt = malloc(sizeof(int32_t) * (size_t)(rows * T));
  int32_t *scratch = malloc(sizeof(int32_t) * (size_t)(T + 1));
  weft_tensor *tt = NULL, *gt = NULL;
  int64_t shape[2] = {rows, T};
  weft_tensor_wrap(tok, WEFT_I32, WEFT_CPU, 2, shape, &tt);
  weft_tensor_wrap(tgt, WEFT_I32, WEFT_CPU, 2, shape, &gt);
  int nparams = 0;
  weft_module_parameters(s->model, NULL, 0, &nparams);
  weft_param **params = calloc((size_t)nparams + 1, sizeof *params);
  weft_module_parameters(s->model, params, nparams, &nparams);
  char err[1024] = "";
  bool tty = s->rank == 0 && isatty(STDOUT_FILENO) && !o->quiet;
  int64_t start_step = 0;
  weft_status st;

  if (o->log_json && s->rank == 0) s->json = fopen(o->log_json, "w");
  if (agree_fail(o->log_json && s->rank == 0 && !s->json, "cannot open the --log-json file")) {
    rc = 2;
    goto done;
  }

  /* resume: the config first (a checkpoint of another model is an error),
   * then the model and optimizer, resharded onto this mesh */
  if (o->resume_dir) {
    weft_state_dict *hdr = NULL;
    weft_state_dict_create(&hdr);
    weft_llama_config z = WEFT_LLAMA_CONFIG_INIT, saved = z;
    weft_state_dict_set_llama_config(hdr, "model.config", &z);
    weft_state_dict_set_int(hdr, "train.step", 0);
    weft_state_dict_set_string(hdr, "model.family", "llama"); /* older checkpoints: Llama */
    weft_dcp_opts lo = WEFT_DCP_OPTS_INIT;
    lo.allow_partial = true;
    st = weft_dcp_load(hdr, o->resume_dir, &lo, NULL);
    if (st == WEFT_OK) st = weft_state_dict_get_llama_config(hdr, "model.config", &saved);
    if (st == WEFT_OK) weft_state_dict_get_int(hdr, "train.step", &start_step);
    char family[16] = "llama";
    const char *fam = NULL;
    if (st == WEFT_OK && weft_state_dict_get_string(hdr, "model.family", &fam) == WEFT_OK)
      snprintf(family, sizeof family, "%s", fam);
    weft_state_dict_destroy(hdr);
    if (st != WEFT_OK) {
      rc = fail_all("--resume %s: %s", o->resume_dir, weft_last_error());
      goto done;
    }
    if (strcmp(family, o->gpt2 ? "gpt2" : "llama") != 0) {
      rc = fail_all("--resume %s: a checkpoint of a %s model; this run trains a %s model",
                    o->resume_dir, family, o->gpt2 ? "gpt2" : "llama");
      goto done;
    }
    if (saved.dim != c->dim || saved.n_layers != c->n_layers || saved.n_heads != c->n_heads ||
        saved.n_kv_heads != c->n_kv_heads || saved.ffn_dim != c->ffn_dim || saved.vocab != c->vocab) {
      rc = fail_all("--resume %s: checkpoint of another model (D=%lld L=%lld H=%lld Hkv=%lld F=%lld V=%lld; this run: D=%lld L=%lld H=%lld Hkv=%lld F=%lld V=%lld)",
                    o->resume_dir, (long long)saved.dim, (long long)saved.n_layers, (long long)saved.n_heads,
                    (long long)saved.n_kv_heads, (long long)saved.ffn_dim, (long long)saved.vocab,
                    (long long)c->dim, (long long)c->n_layers, (long long)c->n_heads,
                    (long long)c->n_kv_heads, (long long)c->ffn_dim, (long long)c->vocab);
      goto done;
    }
    weft_state_dict *sd = NULL;
    weft_state_dict_create(&sd);
    st = set_model_sd(s, sd, 0);
    if (st == WEFT_OK) st = weft_dcp_load(sd, o->resume_dir, NULL, NULL);
    /* the tensors were loaded in place (views); the optimizer's step counts
     * and learning rate are values: apply them */
    if (st == WEFT_OK) st = weft_set_optimizer_state_dict(s->model, s->opt, sd, NULL, NULL, NULL);
    weft_state_dict_destroy(sd);
    if (st != WEFT_OK) {
      rc = fail_all("--resume %s: %s", o->resume_dir, weft_last_error());
      goto done;
    }
    if (s->rank == 0 && !o->silent) printf("resumed from %s at step %lld\n", o->resume_dir, (long long)start_step);
  }

  weft_lr_schedule sched = {(float)o->lr, (float)o->min_lr, o->warmup, o->steps};
  int64_t tokens_per_step = B * T * o->grad_accum;
  double fpt = flops_per_token(c, o->gpt2, T);
  if (res) res->num_params = count_params(c, o->gpt2, true);
  if (s->rank == 0 && !o->quiet) {
    char buf[512];
    weft_mesh_describe(s->root, buf, sizeof buf);
    printf("weft-train: model %s (D=%lld L=%lld H=%lld Hkv=%lld F=%lld V=%lld T=%lld, %.2fM params), %s\n",
           o->model_name, (long long)c->dim, (long long)c->n_layers, (long long)c->n_heads,
           (long long)c->n_kv_heads, (long long)c->ffn_dim, (long long)V, (long long)T,
           count_params(c, o->gpt2, true) / 1e6, buf);
    printf("  FSDP on %s, TP %s%s%s, data: %s, batch %lld x %lld tokens x %lld accum, %lld steps\n",
           s->dp_total > 1 ? (s->ndp == 2 ? "dp_replicate x dp_shard (HSDP)" : "dp") : "nothing (dp=1)",
           s->tp_size > 1 ? "on tp" : "off", s->tp_size > 1 && o->sequence_parallel ? " + SP" : "",
           s->tp_size > 1 && o->loss_parallel ? " + loss parallel" : "",
           o->data ? o->data : o->text ? o->text : "embedded synthetic language", (long long)B,
           (long long)T, (long long)o->grad_accum, (long long)o->steps);
    fflush(stdout);
  }
  double total_time = 0, first_loss = NAN, last_loss = NAN, vloss = NAN, vacc = NAN, first_vloss = NAN;
  int64_t steps_run = 0, timed_steps = 0;
  double timed_time = 0;
  int64_t peak_max = 0;
  for (int64_t step = start_step; step < o->steps; step++) {
    weft_comm_stats_reset(s->root);
    weft_mem_reset_peak(WEFT_CPU);
    if (s->root_fsdp) weft_fsdp_memory_reset_peak();
    float lr = weft_lr_schedule_at(&sched, step);
    weft_optimizer_set_lr(s->opt, lr);
    double t0 = now_s();
    double loss_sum = 0;
    for (int64_t micro = 0; micro < o->grad_accum; micro++) {
      int bad = make_batch(&s->train_src, true, o->seed, step * o->grad_accum + micro, B, T,
                           s->dp_index * rows, rows, tok, tgt, scratch, V, err, sizeof err);
      if ((o->data || o->text) && agree_fail(bad != 0, err)) { rc = 2; goto done; }
      if (s->root_fsdp)
        weft_fsdp_set_requires_gradient_sync(s->root_fsdp, micro == o->grad_accum - 1, true);
      double l = 0;
      if (o->gpt2) {
        st = gpt2_step(s, tt, gt, true, step * o->grad_accum + micro, &l, NULL);
      } else {
        st = weft_llama_forward(s->model, tt, gt, &l);
        if (st == WEFT_OK) st = weft_llama_backward(s->model);
      }
      if (st != WEFT_OK) {
        fprintf(stderr, "weft-train: error: step %lld: %s\n", (long long)step, weft_last_error());
        rc = 3;
        goto done;
      }
      loss_sum += l;
    }
    if (o->grad_accum > 1)
      for (int i = 0; i < nparams; i++)
        if (params[i]->grad) weft_scale(weft_dtensor_local(params[i]->grad), 1.0 / (double)o->grad_accum);
    double norm = 0;
    st = weft_clip_grad_norm(s->model, o->clip > 0 ? o->clip : 1e30, &norm);
    if (st == WEFT_OK) st = weft_optimizer_step(s->opt);
    if (st == WEFT_OK) st = weft_module_zero_grad(s->model, false);
    if (st != WEFT_OK) {
      fprintf(stderr, "weft-train: error: step %lld: %s\n", (long long)step, weft_last_error());
      rc = 3;
      goto done;
    }
    double dt = now_s() - t0;
    /* this step's communication (before the reporting all-reduces, which
     * are plain MPI and not counted) */
    int64_t cb[TRAIN_MAX_DIMS] = {0}, cc[TRAIN_MAX_DIMS] = {0};
    for (int d = 0; d < s->ndim; d++) {
      weft_comm_count k = weft_comm_stats_dim(s->root, d);
      cb[d] = k.bytes;
      cc[d] = k.calls;
      if (res)
        for (int kk = 0; kk < WEFT_COLL_KIND_COUNT; kk++)
        {
          weft_comm_count kc = weft_comm_stats(s->root, d, (weft_coll_kind)kk);
          res->comm_kind_bytes[d][kk] = kc.bytes;
          res->comm_kind_calls[d][kk] = kc.calls;
        }
    }
    int64_t peak = weft_mem_get(WEFT_CPU).peak_bytes;
    if (res) {
      memcpy(res->comm_bytes, cb, sizeof cb);
      memcpy(res->comm_calls, cc, sizeof cc);
      res->peak_bytes = peak;
      if (s->root_fsdp) {
        weft_fsdp_memory fm;
        weft_fsdp_memory_get(&fm);
        res->param_bytes = fm.sharded_params.peak;
        res->grad_bytes = fm.sharded_grads.peak;
        res->optim_bytes = fm.optimizer.peak;
        res->unsharded_param_peak = fm.unsharded_params.peak;
        res->unsharded_grad_peak = fm.unsharded_grads.peak;
        res->other_peak = fm.other.peak;
      }
    }
    /* loss: mean over micro-batches and dp ranks (tp ranks agree) */
    double red[2] = {loss_sum / (double)o->grad_accum, dt};
    allreduce_d(red, 1, MPI_SUM);
    double dtmax = dt;
    allreduce_d(&dtmax, 1, MPI_MAX);
    int64_t pk[2] = {peak, -peak};
    allreduce_i64(pk, 2, MPI_MAX);
    double loss = red[0] / s->world;
    if (steps_run == 0) first_loss = loss;
    last_loss = loss;
    steps_run++;
    total_time += dtmax;
    if (step > start_step || o->steps - start_step == 1) {
      timed_time += dtmax;
      timed_steps++;
    }
    if (pk[0] > peak_max) peak_max = pk[0];
    double tps = tokens_per_step / dtmax;
    double mfu = tps * fpt / (s->world * o->peak_flops);
    bool do_val = (o->val_every > 0 && (step + 1) % o->val_every == 0) || step + 1 == o->steps;
    if (do_val) {
      rc = validate(s, tok, tgt, scratch, &vloss, &vacc);
      if (rc) goto done;
      if (isnan(first_vloss)) first_vloss = vloss;
    }
    if (s->rank == 0) {
      if (tty) printf("\r\033[K");
      if (!o->quiet) {
        char pbuf[32], line[512];
        fmt_bytes((double)pk[0], pbuf, sizeof pbuf);
        int n = snprintf(line, sizeof line,
                         "step %4lld/%lld | loss %.4f | lr %.2e | norm %.3f | %6.0f tok/s | mfu %5.2f%% | peak %s/rank |",
                         (long long)step + 1, (long long)o->steps, loss, lr, norm, tps, 100 * mfu, pbuf);
        for (int d = 0; d < s->ndim && n < (int)sizeof line; d++) {
          char bb[32];
          fmt_bytes((double)cb[d], bb, sizeof bb);
          n += snprintf(line + n, sizeof line - (size_t)n, " %s %s", s->names[d], bb);
        }
        printf("%s | %.0f ms\n", line, dtmax * 1e3);
      }
      if (do_val && !o->silent) printf("  validation after step %lld: held-out loss %.4f, next-token accuracy %.1f%%\n",
                         (long long)step + 1, vloss, 100 * vacc);
      if (tty) progress(step + 1, o->steps);
      fflush(stdout);
      if (s->json) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddNumberToObject(j, "step", (double)(step + 1));
        cJSON_AddNumberToObject(j, "loss", loss);
        cJSON_AddNumberToObject(j, "lr", lr);
        cJSON_AddNumberToObject(j, "grad_norm", norm);
        cJSON_AddNumberToObject(j, "tokens_per_s", tps);
        cJSON_AddNumberToObject(j, "mfu", mfu);
        cJSON_AddNumberToObject(j, "step_time_s", dtmax);
        cJSON_AddNumberToObject(j, "peak_bytes_max", (double)pk[0]);
        cJSON_AddNumberToObject(j, "peak_bytes_min", (double)-pk[1]);
        cJSON *cm = cJSON_AddObjectToObject(j, "comm_bytes");
        cJSON *cl = cJSON_AddObjectToObject(j, "comm_calls");
        for (int d = 0; d < s->ndim; d++) {
          cJSON_AddNumberToObject(cm, s->names[d], (double)cb[d]);
          cJSON_AddNumberToObject(cl, s->names[d], (double)cc[d]);
        }
        if (do_val) {
          cJSON_AddNumberToObject(j, "val_loss", vloss);
          cJSON_AddNumberToObject(j, "val_acc", vacc);
        }
        char *txt = cJSON_PrintUnformatted(j);
        fprintf(s->json, "%s\n", txt);
        fflush(s->json);
        cJSON_free(txt);
        cJSON_Delete(j);
      }
    }
    bool save_now = o->save_dir && ((o->save_every > 0 && (step + 1) % o->save_every == 0) ||
                                    step + 1 == o->steps);
    if (save_now) {
      if (s->pending_save) {
        st = weft_dcp_async_wait(s->pending_save);
        s->pending_save = NULL;
        if (st != WEFT_OK) {
          rc = fail_all("--save %s: %s", o->save_dir, weft_last_error());
          goto done;
        }
      }
      weft_state_dict *sd = NULL;
      weft_state_dict_create(&sd);
      st = set_model_sd(s, sd, step + 1);
      if (st == WEFT_OK) {
        if (step + 1 == o->steps) st = weft_dcp_save(sd, o->save_dir, NULL);
        else st = weft_dcp_async_save(sd, o->save_dir, NULL, &s->pending_save);
      }
      weft_state_dict_destroy(sd);
      if (st != WEFT_OK) {
        rc = fail_all("--save %s: %s", o->save_dir, weft_last_error());
        goto done;
      }
    }
  }
  if (s->pending_save) {
    st = weft_dcp_async_wait(s->pending_save);
    s->pending_save = NULL;
    if (st != WEFT_OK) {
      rc = fail_all("--save %s: %s", o->save_dir, weft_last_error());
      goto done;
    }
  }
  if (o->export_path) {
    st = weft_safetensors_export_model(s->model, o->export_path, WEFT_F32);
    if (st != WEFT_OK) {
      rc = fail_all("--export-safetensors %s: %s", o->export_path, weft_last_error());
      goto done;
    }
  }
  if (steps_run == 0 && o->val_batches > 0) {
    rc = validate(s, tok, tgt, scratch, &vloss, &vacc);
    if (rc) goto done;
    first_vloss = vloss;
  }
  double tps_avg = timed_steps ? tokens_per_step * timed_steps / timed_time : 0;
  double mfu_avg = tps_avg * fpt / (s->world * o->peak_flops);
  if (res) {
    res->steps_run = steps_run;
    res->first_loss = first_loss;
    res->final_loss = last_loss;
    res->val_loss = vloss;
    res->val_acc = vacc;
    res->first_val_loss = first_vloss;
    res->tokens_per_s = tps_avg;
    res->mfu = mfu_avg;
  }
  if (s->rank == 0 && !o->silent) {
    char pbuf[32];
    fmt_bytes((double)peak_max, pbuf, sizeof pbuf);
    printf("\nsummary\n");
    printf("  %-26s %s\n", "model", o->model_name);
    printf("  %-26s %.3fM\n", "parameters", count_params(c, o->gpt2, true) / 1e6);
    char mbuf[128] = "";
    for (int d = 0; d < s->ndim; d++) {
      size_t l = strlen(mbuf);
      snprintf(mbuf + l, sizeof mbuf - l, "%s%s=%d", d ? " x " : "", s->names[d], s->shape[d]);
    }
    printf("  %-26s %s (%d ranks)\n", "mesh", mbuf, s->world);
    printf("  %-26s %lld (of %lld)\n", "steps run", (long long)steps_run, (long long)o->steps);
    printf("  %-26s %.4f -> %.4f (ln V = %.4f)\n", "train loss", first_loss, last_loss, log((double)V));
    printf("  %-26s %.4f\n", "held-out loss", vloss);
    printf("  %-26s %.2f%% (chance %.2f%%)\n", "held-out accuracy", 100 * vacc, 100.0 / (double)V);
    printf("  %-26s %.0f\n", "tokens/s (after step 1)", tps_avg);
    printf("  %-26s %.2f%% of %.0f GFLOP/s per rank\n", "MFU", 100 * mfu_avg, o->peak_flops / 1e9);
    printf("  %-26s %s\n", "peak memory (max rank)", pbuf);
    printf("  %-26s %.2f s\n", "training time", total_time);
    fflush(stdout);
  }
done:
  weft_tensor_destroy(tt);
  weft_tensor_destroy(gt);
  free(tok);
  free(tgt);
  free(scratch);
  free(params);
  teardown(s);
  return rc;
}
