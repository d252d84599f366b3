/* weft-generate: text generation (token ids) from a GPT-2 or Llama, on one
 * rank or tensor-parallel over all ranks.
 *
 *     mpiexec -n 2 build/examples/weft-generate --model gpt2 --vocab 50257 \
 *         --init-from model.safetensors --prompt "464 3290 286" --max-new-tokens 20
 *
 * The model's shape is a weft-train preset (--model) with the same shape
 * flags over it; the weights come from --init-from (a safetensors file in
 * weft's or Hugging Face transformers' layout, told apart as weft-train
 * does) or --resume (a weft-train checkpoint directory: its model state).
 * Every rank is one tp rank (a 1-D mesh "tp" over the world, the model's
 * own TP plan). Each new token runs the model over the whole sequence so
 * far (no KV cache; the last max-positions tokens when it grows longer),
 * gathers the last position's logits to every rank, and picks the next
 * token alike on every rank:
 *   --temperature 0 (default)  greedy: the first id of the largest logit
 *                              (as torch.argmax);
 *   --temperature T > 0        sampled from softmax(logits / T), over the
 *                              --top-k K largest (0: all), with a counter-
 *                              based random stream from --seed (the same
 *                              draw on every rank).
 * Rank 0 prints the generated ids (not the prompt) on one line. Errors are
 * one line on every rank, exit code 2. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"
#include "train_internal.h"
#include "weft.h"

#define MAX_TOKENS 65536

typedef struct gen_opts {
  weft_llama_config shape; /* from the preset and the shape flags */
  bool gpt2;
  int64_t positions; /* GPT-2 learned positions (--max-positions; 0: --seq-len) */
  const char *init_from, *resume;
  int32_t prompt[MAX_TOKENS];
  int64_t nprompt, max_new, top_k;
  double temperature;
  uint64_t seed;
} gen_opts;

static int fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int fail(const char *fmt, ...) {
  char buf[1400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  /* the library's trail of callers ("  at ...") only with WEFT_DEBUG set */
  const char *debug = getenv("WEFT_DEBUG");
  if (!(debug && *debug && strcmp(debug, "0") != 0)) buf[strcspn(buf, "\n")] = 0;
  if (weft_world_rank() == 0) fprintf(stderr, "weft-generate: error: %s\n", buf);
  return 2;
}

static bool parse_int(const char *s, int64_t lo, int64_t hi, int64_t *out) {
  char *end = NULL;
  long long v = strtoll(s, &end, 10);
  if (!s[0] || *end || v < lo || v > hi) return false;
  *out = v;
  return true;
}

static int usage(void) {
  if (weft_world_rank() == 0)
    printf(
        "usage: mpiexec -n N weft-generate --model NAME [shape flags] (--init-from F | --resume "
        "DIR)\n"
        "                     --prompt \"ID ID ...\" [--max-new-tokens N] [--temperature T]\n"
        "                     [--top-k K] [--seed S]\n"
        "  --model NAME            a weft-train preset: demo, tiny, small (Llama), gpt2-demo,\n"
        "                          gpt2-tiny, gpt2 (GPT-2)\n"
        "  --dim D --layers L --heads H --kv-heads HKV --ffn-dim F --vocab V --seq-len T\n"
        "  --max-positions P       GPT-2: learned positions (default --seq-len)\n"
        "  --init-from F           weights: safetensors in weft's or transformers' layout\n"
        "  --resume DIR            weights: a weft-train checkpoint\n"
        "  --prompt \"IDS\"          token ids, space-separated (at least one)\n"
        "  --max-new-tokens N      tokens to generate (16)\n"
        "  --temperature T         0: greedy (default); > 0: sample from softmax(logits / T)\n"
        "  --top-k K               sample among the K largest logits (0: all; default 0)\n"
        "  --seed S                the sampling stream (0)\n"
        "Every rank is a tp rank; rank 0 prints the generated ids on one line.\n");
  return 0;
}

static int parse(int argc, char **argv, gen_opts *o) {
  const char *model = "demo";
  static const char *const shape_flags[] = {"--dim",     "--layers", "--heads",  "--kv-heads",
                                            "--ffn-dim", "--vocab",  "--seq-len"};
  int64_t shape[7] = {-1, -1, -1, -1, -1, -1, -1};
  o->max_new = 16;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) return usage() - 1;
    if (i + 1 >= argc) return fail("%s needs a value (see --help)", a);
    const char *v = argv[++i];
    int64_t iv = 0;
    int k = -1;
    for (int j = 0; j < 7; j++)
      if (!strcmp(a, shape_flags[j])) k = j;
    if (k >= 0) {
      if (!parse_int(v, 1, 1 << 24, &iv)) return fail("%s: want an integer >= 1 (got '%s')", a, v);
      shape[k] = iv;
    } else if (!strcmp(a, "--model")) {
      model = v;
    } else if (!strcmp(a, "--max-positions")) {
      if (!parse_int(v, 1, 1 << 20, &o->positions)) return fail("%s: bad value '%s'", a, v);
    } else if (!strcmp(a, "--init-from")) {
      o->init_from = v;
    } else if (!strcmp(a, "--resume")) {
      o->resume = v;
    } else if (!strcmp(a, "--max-new-tokens")) {
      if (!parse_int(v, 0, MAX_TOKENS, &o->max_new))
        return fail("%s: want an integer in [0, %d] (got '%s')", a, MAX_TOKENS, v);
    } else if (!strcmp(a, "--top-k")) {
      if (!parse_int(v, 0, 1 << 24, &o->top_k)) return fail("%s: bad value '%s'", a, v);
    } else if (!strcmp(a, "--seed")) {
      int64_t s = 0;
      if (!parse_int(v, 0, INT64_MAX, &s)) return fail("%s: bad value '%s'", a, v);
      o->seed = (uint64_t)s;
    } else if (!strcmp(a, "--temperature")) {
      char *end = NULL;
      o->temperature = strtod(v, &end);
      if (!v[0] || *end || !(o->temperature >= 0) || o->temperature > 1e6)
        return fail("%s: want a number in [0, 1e6] (got '%s')", a, v);
    } else if (!strcmp(a, "--prompt")) {
      const char *p = v;
      o->nprompt = 0;
      while (*p) {
        while (*p == ' ' || *p == ',') p++;
        if (!*p) break;
        char *end = NULL;
        long long t = strtoll(p, &end, 10);
        if (end == p || t < 0 || t > INT32_MAX)
          return fail("--prompt: '%s' is not a list of token ids (non-negative integers)", v);
        if (o->nprompt == MAX_TOKENS) return fail("--prompt: more than %d ids", MAX_TOKENS);
        o->prompt[o->nprompt++] = (int32_t)t;
        p = end;
      }
    } else {
      return fail("unknown flag '%s' (see --help)", a);
    }
  }
  o->shape = WEFT_LLAMA_CONFIG_INIT;
  o->gpt2 = !train_model_preset(model, &o->shape);
  if (o->gpt2 && !train_gpt2_preset(model, &o->shape))
    return fail("--model %s: no such preset (see --help)", model);
  int64_t *fields[7] = {&o->shape.dim,        &o->shape.n_layers, &o->shape.n_heads,
                        &o->shape.n_kv_heads, &o->shape.ffn_dim,  &o->shape.vocab,
                        &o->shape.max_seq_len};
  for (int k = 0; k < 7; k++)
    if (shape[k] > 0) *fields[k] = shape[k];
  if (shape[2] > 0 && shape[3] < 0) o->shape.n_kv_heads = o->shape.n_heads;
  if (!o->init_from == !o->resume) return fail("give the weights: --init-from F or --resume DIR");
  if (o->nprompt == 0) return fail("--prompt: give at least one token id");
  for (int64_t i = 0; i < o->nprompt; i++)
    if (o->prompt[i] >= o->shape.vocab)
      return fail("--prompt: id %d at position %lld is not below the vocabulary size %lld",
                  o->prompt[i], (long long)i, (long long)o->shape.vocab);
  if (o->top_k > o->shape.vocab) o->top_k = o->shape.vocab;
  if (o->positions && !o->gpt2)
    return fail("--max-positions: the Llama model has no learned positions (RoPE)");
  return 1;
}

/* The model on the tp mesh, its TP plan, its weights. */
static weft_status make_model(const gen_opts *o, weft_mesh *tp, weft_module **model,
                              weft_tp **plan) {
  int world = weft_mesh_dim_size(tp, 0);
  if (o->gpt2) {
    weft_gpt2_config g = WEFT_GPT2_CONFIG_INIT;
    g.vocab = o->shape.vocab;
    g.max_seq_len = o->positions ? o->positions : o->shape.max_seq_len;
    g.dim = o->shape.dim;
    g.n_layers = o->shape.n_layers;
    g.n_heads = o->shape.n_heads;
    g.ffn_dim = o->shape.ffn_dim;
    WEFT_CHECK(weft_gpt2_create(&g, tp, model));
    if (world > 1) WEFT_CHECK(weft_gpt2_apply_tp(*model, tp, false, plan));
  } else {
    WEFT_CHECK(weft_llama_ops_create(&o->shape, tp, model));
    if (world > 1) WEFT_CHECK(weft_llama_ops_parallelize(*model, tp, false, false, plan));
  }
  return WEFT_OK;
}

static int load_weights(const gen_opts *o, weft_module *model) {
  if (o->resume) {
    weft_state_dict *sd = NULL;
    weft_status st = weft_state_dict_create(&sd);
    if (st == WEFT_OK) st = weft_module_materialize(model);
    if (st == WEFT_OK) st = weft_get_model_state_dict(model, NULL, sd);
    if (st == WEFT_OK) st = weft_dcp_load(sd, o->resume, NULL, NULL);
    weft_state_dict_destroy(sd);
    return st == WEFT_OK ? 0 : fail("--resume %s: %s", o->resume, weft_last_error());
  }
  char why[1024];
  if (train_import_weights(model, o->init_from, o->gpt2, &o->shape, NULL, why, sizeof why) ==
      WEFT_OK)
    return 0;
  return fail("--init-from %s: %s", o->init_from, why);
}

/* The next token from the last position's logits (V floats), alike on
 * every rank. */
static int32_t pick(const gen_opts *o, const float *z, int64_t V, int64_t step, double *p) {
  if (o->temperature == 0) {
    int64_t best = 0;
    for (int64_t v = 1; v < V; v++)
      if (z[v] > z[best]) best = v;
    return (int32_t)best;
  }
  /* the top-k threshold: the k-th largest logit */
  float cut = -INFINITY;
  if (o->top_k > 0 && o->top_k < V) {
    for (int64_t v = 0; v < V; v++) p[v] = z[v];
    for (int64_t k = 0; k < o->top_k; k++) { /* k selections of the max: K is small */
      int64_t m = -1;
      for (int64_t v = 0; v < V; v++)
        if (p[v] != -INFINITY && (m < 0 || p[v] > p[m])) m = v;
      cut = (float)p[m];
      p[m] = -INFINITY;
    }
  }
  double mx = -INFINITY, sum = 0;
  for (int64_t v = 0; v < V; v++)
    if (z[v] >= cut && z[v] > mx) mx = z[v];
  for (int64_t v = 0; v < V; v++) {
    p[v] = z[v] >= cut ? exp(((double)z[v] - mx) / o->temperature) : 0;
    sum += p[v];
  }
  uint32_t r[4];
  weft_philox4x32((uint64_t)step, 0, o->seed ^ weft_rng_key("weft-generate"), r);
  double u = ((double)r[0] * 4294967296.0 + r[1]) / 18446744073709551616.0 * sum, acc = 0;
  int64_t last = 0;
  for (int64_t v = 0; v < V; v++) {
    if (p[v] == 0) continue;
    last = v;
    acc += p[v];
    if (u < acc) return (int32_t)v;
  }
  return (int32_t)last;
}

/* Generates o->max_new tokens into out. Collective over tp. */
static weft_status generate(const gen_opts *o, weft_mesh *tp, weft_module *model, int32_t *seq,
                            int64_t *n) {
  const int64_t V = o->shape.vocab;
  const int64_t P = o->gpt2 && o->positions ? o->positions : o->shape.max_seq_len;
  double *prob = malloc((size_t)V * sizeof *prob);
  if (!prob) return weft_error(WEFT_ERR_OOM, "weft-generate: %lld probabilities", (long long)V);
  weft_status st = WEFT_OK;
  weft_placement r = weft_replicate();
  for (int64_t step = 0; step < o->max_new && st == WEFT_OK; step++) {
    int64_t T = *n < P ? *n : P, shape[2] = {1, T};
    weft_tensor *host = NULL, *full = NULL;
    weft_dtensor *ids = NULL;
    weft_graph *g = NULL;
    weft_var *logits = NULL;
    st = weft_tensor_wrap(seq + (*n - T), WEFT_I32, WEFT_CPU, 2, shape, &host);
    if (st == WEFT_OK) st = weft_dtensor_distribute(tp, host, WEFT_DTENSOR_ALL_RANKS, &r, 1, &ids);
    if (st == WEFT_OK) st = weft_graph_create(&g);
    if (st == WEFT_OK) {
      weft_graph_set_training(g, false);
      weft_graph_set_grad_enabled(g, false);
      st = o->gpt2 ? weft_gpt2_logits(model, g, ids, &logits)
                   : weft_llama_ops_logits(model, g, ids, &logits);
    }
    if (st == WEFT_OK) st = weft_dtensor_full_tensor(weft_var_value(logits), &full);
    if (st == WEFT_OK) {
      const float *z = (const float *)full->data + (T - 1) * V;
      seq[(*n)++] = pick(o, z, V, step, prob);
    }
    weft_tensor_destroy(full);
    weft_graph_destroy(g);
    weft_dtensor_destroy(ids);
    weft_tensor_destroy(host);
  }
  free(prob);
  return st;
}

int main(int argc, char **argv) {
  if (weft_init(&argc, &argv) != WEFT_OK) {
    fprintf(stderr, "weft-generate: error: %s\n", weft_last_error());
    return 2;
  }
  static gen_opts o;
  int rc = parse(argc, argv, &o);
  weft_mesh *tp = NULL;
  weft_module *model = NULL;
  weft_tp *plan = NULL;
  int32_t *seq = NULL;
  if (rc == 1) {
    rc = 0;
    int world = weft_world_size();
    const char *names[1] = {"tp"};
    if (weft_mesh_create(1, &world, names, &tp) != WEFT_OK || make_model(&o, tp, &model, &plan))
      rc = fail("%s", weft_last_error());
    if (!rc) rc = load_weights(&o, model);
    seq = malloc((size_t)(o.nprompt + o.max_new) * sizeof *seq);
    if (!rc && !seq) rc = fail("out of memory for %lld tokens", (long long)(o.nprompt + o.max_new));
    int64_t n = o.nprompt;
    if (!rc) {
      memcpy(seq, o.prompt, (size_t)n * sizeof *seq);
      if (generate(&o, tp, model, seq, &n) != WEFT_OK) rc = fail("%s", weft_last_error());
    }
    if (!rc && weft_world_rank() == 0) {
      for (int64_t i = o.nprompt; i < n; i++) printf(i > o.nprompt ? " %d" : "%d", seq[i]);
      printf("\n");
      fflush(stdout);
    }
  } else {
    rc = rc < 0 ? 0 : rc;
  }
  free(seq);
  weft_tp_destroy(plan);
  if (model) weft_module_destroy(model);
  if (tp) weft_mesh_destroy(tp);
  weft_finalize();
  return rc;
}
