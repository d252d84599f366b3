/* models/llama/hf.c — Llama weights between Hugging Face transformers'
 * layout and weft's (Meta's names and RoPE pairs), file to file
 * (llama.h). */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hf_file.h"
#include "llama.h"

/* weft's name inside layers.N -> transformers' inside model.layers.N */
static const char *const block_names[][2] = {
    {"attention_norm.weight", "input_layernorm.weight"},
    {"attention.wq.weight", "self_attn.q_proj.weight"},
    {"attention.wk.weight", "self_attn.k_proj.weight"},
    {"attention.wv.weight", "self_attn.v_proj.weight"},
    {"attention.wo.weight", "self_attn.o_proj.weight"},
    {"ffn_norm.weight", "post_attention_layernorm.weight"},
    {"feed_forward.w1.weight", "mlp.gate_proj.weight"},
    {"feed_forward.w3.weight", "mlp.up_proj.weight"},
    {"feed_forward.w2.weight", "mlp.down_proj.weight"},
};
static const char *const top_names[][2] = {
    {"tok_embeddings.weight", "model.embed_tokens.weight"},
    {"norm.weight", "model.norm.weight"},
    {"output.weight", "lm_head.weight"},
};
#define NBLOCK (int)(sizeof block_names / sizeof block_names[0])
#define NTOP (int)(sizeof top_names / sizeof top_names[0])

typedef struct conv_ctx {
  bool to_hf;
  int64_t heads, kv_heads;
} conv_ctx;

/* "<prefix>N.<rest>": N's digits and rest, or NULL. */
static const char *layer_rest(const char *name, const char *prefix, long *layer) {
  size_t n = strlen(prefix);
  if (strncmp(name, prefix, n) != 0) return NULL;
  const char *p = name + n;
  char *end = NULL;
  if (*p < '0' || *p > '9') return NULL;
  *layer = strtol(p, &end, 10);
  return *end == '.' ? end + 1 : NULL;
}

/* Renames between the layouts; q and k rows go from RoPE pairs (weft,
 * Meta) to halves (transformers' rotate_half) and back; transformers'
 * rotary_emb.inv_freq buffers are dropped; other names pass unchanged (the
 * import then calls them unexpected). */
static weft_status map(const weft_safetensors_info *in, void *vctx, hf_rule *r) {
  const conv_ctx *c = vctx;
  const int from = c->to_hf ? 0 : 1, to = 1 - from;
  for (int i = 0; i < NTOP; i++)
    if (!strcmp(in->name, top_names[i][from])) {
      snprintf(r->name, sizeof r->name, "%s", top_names[i][to]);
      return WEFT_OK;
    }
  long layer = -1;
  const char *rest = layer_rest(in->name, c->to_hf ? "layers." : "model.layers.", &layer);
  if (!rest) return WEFT_OK;
  if (!c->to_hf && !strcmp(rest, "self_attn.rotary_emb.inv_freq")) {
    r->skip = true;
    return WEFT_OK;
  }
  for (int i = 0; i < NBLOCK; i++) {
    if (strcmp(rest, block_names[i][from]) != 0) continue;
    snprintf(r->name, sizeof r->name, "%s%ld.%s", c->to_hf ? "model.layers." : "layers.", layer,
             block_names[i][to]);
    if (i == 1 || i == 2) { /* q, k */
      r->op = c->to_hf ? HF_PAIRS_TO_HALVES : HF_HALVES_TO_PAIRS;
      r->heads = i == 1 ? c->heads : c->kv_heads;
    }
    return WEFT_OK;
  }
  return WEFT_OK;
}

static weft_status convert(const char *func, const char *src, const char *dst,
                           const weft_llama_config *cfg, bool to_hf) {
  if (!cfg) return weft_error(WEFT_ERR_INVALID, "%s: cfg is NULL", func);
  if (cfg->n_heads < 1 || cfg->n_kv_heads < 1)
    return weft_error(WEFT_ERR_INVALID, "%s: cfg has %lld heads and %lld kv heads", func,
                      (long long)cfg->n_heads, (long long)cfg->n_kv_heads);
  conv_ctx c = {to_hf, cfg->n_heads, cfg->n_kv_heads};
  return models_hf_convert(func, src, dst, map, &c);
}

weft_status weft_llama_hf_to_weft(const char *hf_path, const char *weft_path,
                                  const weft_llama_config *cfg) {
  return convert("weft_llama_hf_to_weft", hf_path, weft_path, cfg, false);
}

weft_status weft_llama_weft_to_hf(const char *weft_path, const char *hf_path,
                                  const weft_llama_config *cfg) {
  return convert("weft_llama_weft_to_hf", weft_path, hf_path, cfg, true);
}

weft_status weft_llama_file_is_hf(const char *path, bool *is_hf) {
  if (!is_hf) return weft_error(WEFT_ERR_INVALID, "weft_llama_file_is_hf: is_hf is NULL");
  weft_safetensors *f = NULL;
  WEFT_CHECK(models_hf_open_probe(path, &f));
  weft_safetensors_info w;
  *is_hf = !f || weft_safetensors_find(f, "model.embed_tokens.weight", &w) == WEFT_OK;
  weft_clear_error(); /* a name not found is an answer, not a failure */
  weft_safetensors_close(f);
  return WEFT_OK;
}
