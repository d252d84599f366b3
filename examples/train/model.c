/* examples/train/model.c — the two model families weft-train trains, both
 * written on the op layer as a user would (a graph forward whose loss is
 * backpropagated through the tape): the Llama (models/llama; its
 * checkpoints are the FQNs nn.h's built-in weft_llama_* wrote, so theirs
 * load) and GPT-2 (models/gpt2). Here are their presets, GPT-2's config,
 * their parameter and FLOP counts (for MFU), and one micro-step: forward
 * (+ backward when training) on this rank's rows. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "llama.h"
#include "train_internal.h"

/* A preset's shape: D, L, H, Hkv (0: = H), F, V, T. */
typedef struct model_preset {
  const char *name;
  int64_t dim, n_layers, n_heads, n_kv_heads, ffn_dim, vocab, max_seq_len;
} model_preset;

/* demo and gpt2-demo train in seconds on 2 cores with 4 ranks; gpt2 is
 * GPT-2 124M as llm.c trains it (vocab padded to 50304) */
static const model_preset llama_presets[] = {{"demo", 64, 2, 4, 4, 176, 64, 32},
                                             {"tiny", 256, 4, 8, 8, 688, 256, 256},
                                             {"small", 768, 12, 12, 12, 2048, 8192, 512},
                                             {NULL, 0, 0, 0, 0, 0, 0, 0}};
static const model_preset gpt2_presets[] = {{"gpt2-demo", 64, 2, 4, 0, 256, 64, 32},
                                            {"gpt2-tiny", 256, 4, 8, 0, 1024, 256, 256},
                                            {"gpt2", 768, 12, 12, 0, 3072, 50304, 1024},
                                            {"gpt2-small", 768, 12, 12, 0, 3072, 50304, 1024},
                                            {NULL, 0, 0, 0, 0, 0, 0, 0}};

static bool find_preset(const model_preset *t, const char *name, weft_llama_config *c) {
  for (; t->name; t++) {
    if (strcmp(t->name, name) != 0) continue;
    weft_llama_config d = WEFT_LLAMA_CONFIG_INIT;
    d.dim = t->dim;
    d.n_layers = t->n_layers;
    d.n_heads = t->n_heads;
    d.n_kv_heads = t->n_kv_heads ? t->n_kv_heads : t->n_heads;
    d.ffn_dim = t->ffn_dim;
    d.vocab = t->vocab;
    d.max_seq_len = t->max_seq_len;
    *c = d;
    return true;
  }
  return false;
}

bool train_model_preset(const char *name, weft_llama_config *c) {
  return find_preset(llama_presets, name, c);
}

bool train_gpt2_preset(const char *name, weft_llama_config *c) {
  return find_preset(gpt2_presets, name, c);
}

weft_gpt2_config train_gpt2_config(const train_opts *o) {
  weft_gpt2_config g = WEFT_GPT2_CONFIG_INIT;
  g.vocab = o->model.vocab;
  g.max_seq_len = train_positions(o);
  g.dim = o->model.dim;
  g.n_layers = o->model.n_layers;
  g.n_heads = o->model.n_heads;
  g.ffn_dim = o->model.ffn_dim;
  g.dropout = (float)o->dropout;
  return g;
}

int64_t train_count_params(const train_opts *o, const weft_llama_config *c, bool with_embedding) {
  if (o->gpt2) {
    /* wte (tied to lm_head), wpe, blocks (ln_1, c_attn, c_proj, ln_2, c_fc,
     * c_proj, with biases), ln_f; without embedding: without wpe (nanoGPT's
     * count: wte works as the output layer) */
    int64_t D = c->dim, F = c->ffn_dim;
    int64_t per = 2 * D + 3 * D * D + 3 * D + D * D + D + 2 * D + F * D + F + D * F + D;
    int64_t n = c->vocab * D + c->n_layers * per + 2 * D;
    return with_embedding ? n + train_positions(o) * D : n;
  }
  int64_t D = c->dim, hd = c->dim / c->n_heads, H = c->n_heads, Hk = c->n_kv_heads;
  int64_t per = D + H * hd * D + 2 * Hk * hd * D + D * H * hd + D + 3 * c->ffn_dim * D;
  int64_t n = c->n_layers * per + D + c->vocab * D;
  if (with_embedding) n += c->vocab * D;
  return n;
}

int64_t train_positions(const train_opts *o) {
  return o->gpt2 && o->max_positions ? o->max_positions : o->model.max_seq_len;
}

double train_flops_per_token(const train_opts *o, const weft_llama_config *c, int64_t T) {
  return 6.0 * (double)train_count_params(o, c, false) +
         12.0 * (double)c->n_layers * (double)c->dim * (double)T;
}

/* A model on the op graph (GPT-2, or Llama as models/llama writes it): the
 * graph's inputs are Replicate DTensors of this rank's rows on the model
 * mesh, kept until the next reset (the tape refers to them). */
static weft_status graph_step(run_state *s, bool train, int64_t key, double *loss,
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
  WEFT_CHECK(
      weft_dtensor_distribute(s->model_mesh, s->tok_t, WEFT_DTENSOR_ALL_RANKS, &r, 1, &s->ids));
  WEFT_CHECK(
      weft_dtensor_distribute(s->model_mesh, s->tgt_t, WEFT_DTENSOR_ALL_RANKS, &r, 1, &s->targets));
  weft_var *l = NULL, *z = NULL;
  if (s->o->gpt2)
    WEFT_CHECK(weft_gpt2_loss(s->model, g, s->ids, s->targets, &l, &z));
  else
    WEFT_CHECK(weft_llama_ops_loss(s->model, g, s->ids, s->targets, &l, &z));
  *loss = weft_var_item(l);
  if (train) WEFT_CHECK(weft_backward(l));
  if (logits) *logits = weft_var_value(z);
  return WEFT_OK;
}

weft_status train_model_step(run_state *s, bool train, int64_t key, double *loss,
                             const weft_dtensor **logits) {
  return graph_step(s, train, key, loss, logits);
}

weft_status train_import_weights(weft_module *model, const char *path, bool gpt2,
                                 const weft_llama_config *cfg, bool *hf, char *why, size_t cap) {
  bool is_hf = false;
  char conv[600] = "";
  weft_status st = gpt2 ? weft_gpt2_file_is_hf(path, &is_hf) : weft_llama_file_is_hf(path, &is_hf);
  if (st == WEFT_OK && is_hf) {
    const char *tmp = getenv("TMPDIR");
    snprintf(conv, sizeof conv, "%s/weft-hf-%d-%d.safetensors", tmp && *tmp ? tmp : "/tmp",
             (int)getpid(), weft_world_rank());
    st = gpt2 ? weft_gpt2_hf_to_weft(path, conv) : weft_llama_hf_to_weft(path, conv, cfg);
  }
  st = weft_agree_status(MPI_COMM_WORLD, st, NULL, "the conversion", NULL);
  if (st == WEFT_OK)
    st = weft_safetensors_import_model(model, is_hf ? conv : path, NULL, NULL, NULL);
  if (conv[0]) remove(conv);
  if (hf) *hf = is_hf;
  if (st == WEFT_OK) return WEFT_OK;
  /* the import names the converted file: name the user's instead */
  const char *m = weft_last_error(), *at = conv[0] ? strstr(m, conv) : NULL;
  if (at)
    snprintf(why, cap, "%.*s%s%s", (int)(at - m), m, path, at + strlen(conv));
  else
    snprintf(why, cap, "%s", m);
  return st;
}
