/* models/gpt2/gpt2.h — GPT-2 written as a user of weft would write it: a
 * few module kinds of its own (weft_module_create) whose forwards are ops
 * on DTensors (autograd.h), the built-in Linear / LayerNorm / Embedding
 * layers, and the lm_head tied to the token embedding.
 *
 * Names and layouts follow nanoGPT / llm.c (and so Hugging Face's GPT-2
 * checkpoints): transformer.wte.weight (V, D), transformer.wpe.weight
 * (P, D), transformer.h.<i>.ln_1.{weight,bias}, .attn.c_attn.{weight,bias}
 * (3D, D) fused q|k|v, .attn.c_proj.{weight,bias}, .ln_2, .mlp.c_fc (F, D),
 * .mlp.c_proj (D, F), transformer.ln_f, lm_head.weight = transformer.wte.weight
 * (tied: one storage, saved once). LayerNorm eps 1e-5, GELU tanh, causal
 * attention, dropout after the attention and MLP projections and after
 * the embeddings (p = cfg.dropout; 0 by default).
 *
 * Every rank of the model mesh runs the same calls (collective when
 * placements call for communication, as every op). */
#ifndef WEFT_MODELS_GPT2_H
#define WEFT_MODELS_GPT2_H

#include <stdbool.h>
#include <stdint.h>

#include "autograd.h"
#include "nn.h"
#include "tp.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct weft_gpt2_config {
  int64_t vocab;       /* V (50304 in llm.c's padded GPT-2) */
  int64_t max_seq_len; /* P: positions (1024) */
  int64_t dim;         /* D (768) */
  int64_t n_layers;    /* L (12) */
  int64_t n_heads;     /* H (12); D % H == 0 */
  int64_t ffn_dim;     /* F (4 D) */
  float norm_eps;      /* 1e-5 */
  float dropout;       /* 0 */
  float init_std;      /* 0.02 */
} weft_gpt2_config;
#define WEFT_GPT2_CONFIG_INIT ((weft_gpt2_config){0, 0, 0, 0, 0, 0, 1e-5f, 0.0f, 0.02f})

/* Checks sizes >= 1, D % H == 0, eps > 0, 0 <= dropout < 1, std >= 0:
 * WEFT_ERR_INVALID naming the field. */
WEFT_API weft_status weft_gpt2_config_validate(const weft_gpt2_config *cfg);

/* The model: a root module with children "transformer" (wte, wpe, h.<i>,
 * ln_f) and "lm_head" (tied to transformer.wte.weight). Parameters have
 * shapes only: weft_module_init_weights or load them. */
WEFT_API weft_status weft_gpt2_create(const weft_gpt2_config *cfg, weft_mesh *mesh,
                                      weft_module **out);
WEFT_API const weft_gpt2_config *weft_gpt2_get_config(const weft_module *model);

/* logits (B, T, V) of ids (B, T) int32 (a Replicate DTensor on the model
 * mesh, T <= max_seq_len) in graph g, through weft_module_call on the
 * model (every module's hooks fire). */
WEFT_API weft_status weft_gpt2_logits(weft_module *model, weft_graph *g, const weft_dtensor *ids,
                                      weft_var **logits);
/* The mean cross-entropy loss against targets (B, T) int32 (Replicate;
 * ignore_index -100), and (may be NULL) the logits. */
WEFT_API weft_status weft_gpt2_loss(weft_module *model, weft_graph *g, const weft_dtensor *ids,
                                    const weft_dtensor *targets, weft_var **loss,
                                    weft_var **logits);

/* nanoGPT's AdamW parameter groups: weight decay on parameters of 2 or
 * more dims (linear weights, wte, wpe), none on biases and LayerNorm
 * parameters. */
WEFT_API weft_status weft_gpt2_adamw_create(weft_module *model, const weft_adamw_params *hp,
                                            weft_optimizer **out);

/* A Megatron-style tensor-parallel plan for this GPT-2 (FQNs relative to
 * the model), into out[0..*n) (writes min(cap, count); *n = count):
 *   transformer.wte             rowwise (vocab-sharded: input R, output R,
 *                               or S(1) with sequence parallel); the tied
 *                               lm_head then computes vocab-sharded logits
 *                               S(-1) that weft_op_cross_entropy takes
 *                               without gathering them (loss parallel)
 *   transformer.h.*.attn.c_attn colwise fused x3: weight and bias
 *                               StridedShard(0, 3), each rank holds its
 *                               heads of q, k and v (Megatron's layout)
 *   transformer.h.*.attn.c_proj rowwise (output R, or S(1) with sp)
 *   transformer.h.*.mlp.c_fc    colwise
 *   transformer.h.*.mlp.c_proj  rowwise (output R, or S(1) with sp)
 * with sequence parallel also: ln_1, ln_2, ln_f sequence parallel, and
 * attn, mlp and lm_head prepare input S(1) -> R. wpe stays Replicate. */
WEFT_API weft_status weft_gpt2_tp_plan(bool sequence_parallel, weft_tp_plan_entry *out, int cap,
                                       int *n);
/* Checks that the heads divide over tp_mesh (WEFT_ERR_INVALID naming
 * n_heads and the tp size), then weft_parallelize_module(model, tp_mesh,
 * weft_gpt2_tp_plan(...)); *out as there (destroy it before the model).
 * Collective over tp_mesh where materialised parameters move. */
WEFT_API weft_status weft_gpt2_apply_tp(weft_module *model, weft_mesh *tp_mesh,
                                        bool sequence_parallel, weft_tp **out);

/* ---------------------------------------------- Hugging Face weights */

/* GPT-2 weights in Hugging Face transformers' layout, file to file
 * (safetensors), so that a pretrained GPT-2 (the hub's gpt2/model.safetensors,
 * or GPT2LMHeadModel.save_pretrained's) loads with
 * weft_safetensors_import_model and a trained model goes back:
 *   names     transformers: "wte.weight", "h.N.attn.c_attn.weight", ...
 *             (GPT2LMHeadModel: the same under "transformer."); weft:
 *             always under "transformer." (nanoGPT's names);
 *   Conv1D    attn.c_attn, attn.c_proj, mlp.c_fc and mlp.c_proj hold their
 *             weight as [in, out] in transformers (y = x W + b) and as
 *             [out, in] in weft (y = x W^T + b): transposed;
 *   buffers   transformers' causal masks "h.N.attn.bias" and
 *             "h.N.attn.masked_bias" are not parameters: dropped;
 *   lm_head   tied to wte: weft_gpt2_weft_to_hf writes no "lm_head.weight";
 *             from HF it is kept under that name (the import reads it as
 *             wte's alias and refuses a file whose two copies differ).
 * hf_path may also be a sharded set's index ("model.safetensors.index.json":
 * its weight_map's files, beside it, are read; one file is written).
 * Dtypes and values are kept bit for bit. The vocabulary is the file's
 * (the hub's GPT-2 has 50257 rows: create the model with that vocab).
 * Local: one rank calls it (the whole file is read into memory); the
 * output is written to a temporary file and renamed into place
 * (weft_safetensors_write). Errors name the file and the tensor. */
WEFT_API weft_status weft_gpt2_hf_to_weft(const char *hf_path, const char *weft_path);
WEFT_API weft_status weft_gpt2_weft_to_hf(const char *weft_path, const char *hf_path);
/* *is_hf = whether the safetensors file at path holds GPT-2 in
 * transformers' layout ("wte.weight" without the prefix, or c_attn's
 * weight [D, 3 D]) rather than weft's; a sharded set's index (a path
 * ending in ".json") is transformers'. Local. */
WEFT_API weft_status weft_gpt2_file_is_hf(const char *path, bool *is_hf);

#ifdef __cplusplus
}
#endif
#endif
