/* models/llama/llama.h — the Llama of docs/DESIGN.md ("The reference models")
 * written as a user of weft would write it: module kinds of its own
 * (weft_module_create) whose forwards are ops on DTensors (autograd.h), the
 * built-in Linear / Embedding / RMSNorm layers as children, and a
 * tensor-parallel plan by FQN pattern (tp.h).
 *
 * It is the same model as nn.h's built-in weft_llama_create (which keeps
 * its hand-written layers): the same config (weft_llama_config), the same
 * parameter FQNs, shapes, order and initialisation, so
 * weft_module_init_weights(model, seed) gives both the same weights and a
 * checkpoint or golden file of one loads into the other:
 *   tok_embeddings.weight (V, D)                     Normal(0, init_std)
 *   layers.<i>.attention_norm.weight (D)             ones
 *   layers.<i>.attention.wq.weight (H hd, D)         Normal(0, init_std)
 *   layers.<i>.attention.wk.weight, .wv (Hkv hd, D)  Normal(0, init_std)
 *   layers.<i>.attention.wo.weight (D, H hd)         Normal(0, init_std)
 *   layers.<i>.ffn_norm.weight (D)                   ones
 *   layers.<i>.feed_forward.w1.weight, .w3 (F, D)    Normal(0, init_std)
 *   layers.<i>.feed_forward.w2.weight (D, F)         Normal(0, init_std)
 *   norm.weight (D)                                  ones
 *   output.weight (V, D) (not tied)                  Normal(0, init_std)
 * with hd = D / H. Forward: h = x + wo(sdpa(rope(wq(n)), rope(wk(n)),
 * wv(n))) with n = attention_norm(x) (RoPE interleaved pairs, theta from
 * the config, causal grouped-query attention); out = h + w2(silu(w1(m)) *
 * w3(m)) with m = ffn_norm(h); logits = output(norm(layers(tok_embeddings(
 * ids)))).
 *
 * The names are weft_llama_ops_* ("Llama written with ops") so as not to
 * clash with the built-in model's weft_llama_* of nn.h; the config is the
 * built-in's weft_llama_config (one config for both: golden data and
 * benchmarks drive either with the same struct).
 *
 * Every rank of the model mesh runs the same calls (collective when
 * placements call for communication, as every op). */
#ifndef WEFT_MODELS_LLAMA_H
#define WEFT_MODELS_LLAMA_H

#include <stdbool.h>
#include <stdint.h>

#include "autograd.h"
#include "nn.h"
#include "tp.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The model: a root module ("model", kind name "llama_ops") on mesh (the
 * model mesh: the tp mesh, or a 1-rank mesh), with children
 * tok_embeddings, layers (a Sequential of blocks "0".."L-1"), norm and
 * output. cfg is checked with weft_llama_config_validate (WEFT_ERR_INVALID
 * naming the field) and copied. Parameters have shapes only (all
 * Replicate): apply a TP plan first if any, then weft_module_init_weights
 * or load them. *out is the caller's (weft_module_destroy). Local. */
WEFT_API weft_status weft_llama_ops_create(const weft_llama_config *cfg, weft_mesh *mesh,
                                           weft_module **out);
/* The config of a model made by weft_llama_ops_create; NULL for any other
 * module. */
WEFT_API const weft_llama_config *weft_llama_ops_get_config(const weft_module *model);

/* logits (B, T, V) of ids (B, T) int32 (a Replicate DTensor on the model
 * mesh, borrowed until the graph is reset; 1 <= T <= max_seq_len, ids in
 * [0, V)) in graph g, through weft_module_call on the model (every
 * module's hooks fire: TP, FSDP). Under the TP plan below with loss
 * parallel the logits are vocab-sharded (Shard(-1)), else Replicate.
 * Errors: NULL arguments, a model not made by weft_llama_ops_create, ids
 * of another dtype, rank or length (WEFT_ERR_INVALID, alike on every
 * rank), an id out of range (the embedding op names it). Collective. */
WEFT_API weft_status weft_llama_ops_logits(weft_module *model, weft_graph *g,
                                           const weft_dtensor *ids, weft_var **logits);
/* The mean cross-entropy (weft_op_cross_entropy, ignore_index -100)
 * against targets (B, T) int32 (Replicate, the ids' shape; borrowed), and
 * (logits may be NULL) the logits. Vocab-sharded logits take the loss
 * parallel path of the op (no rank gathers the vocab). Collective. */
WEFT_API weft_status weft_llama_ops_loss(weft_module *model, weft_graph *g, const weft_dtensor *ids,
                                         const weft_dtensor *targets, weft_var **loss,
                                         weft_var **logits);

/* torchtitan's tensor-parallel plan for this model (apply_tp in
 * parallelize_llama.py), into out[0..*n) (writes min(cap, count); *n =
 * count; the patterns are static strings):
 *   tok_embeddings               rowwise (input R; output R, or S(1) with sp)
 *   norm                         sequence parallel (sp only)
 *   output                       colwise (input R, or S(1) with sp; output
 *                                S(-1) with loss parallel, else R)
 *   layers.*.attention_norm      sequence parallel (sp only)
 *   layers.*.attention           prepare input S(1) -> R (sp only)
 *   layers.*.attention.wq wk wv  colwise (heads split over tp)
 *   layers.*.attention.wo        rowwise (output R, or S(1) with sp)
 *   layers.*.ffn_norm            sequence parallel (sp only)
 *   layers.*.feed_forward        prepare input S(1) -> R (sp only)
 *   layers.*.feed_forward.w1 w3  colwise
 *   layers.*.feed_forward.w2     rowwise (output R, or S(1) with sp)
 * Loss parallel needs no loss module here: weft_llama_ops_loss hands the
 * vocab-sharded logits to weft_op_cross_entropy. Pure; WEFT_ERR_INVALID
 * for a NULL n (or out with cap > 0). */
WEFT_API weft_status weft_llama_ops_tp_plan(bool sequence_parallel, bool loss_parallel,
                                            weft_tp_plan_entry *out, int cap, int *n);
/* Checks that the heads divide over tp_mesh (n_heads % tp == 0 and
 * n_kv_heads % tp == 0; WEFT_ERR_INVALID naming the counts), then
 * weft_parallelize_module(model, tp_mesh, weft_llama_ops_tp_plan(...)).
 * Call it before weft_module_init_weights / load (or after: materialised
 * parameters are resharded keeping their values) and before FSDP and the
 * optimizer; weft_tp_destroy(*out) after FSDP's groups and before the
 * model. Errors as weft_parallelize_module's, every rank alike, nothing
 * changed on failure. Collective over tp_mesh only where materialised
 * parameters move. */
WEFT_API weft_status weft_llama_ops_parallelize(weft_module *model, weft_mesh *tp_mesh,
                                                bool sequence_parallel, bool loss_parallel,
                                                weft_tp **out);

/* ---------------------------------------------- Hugging Face weights */

/* Llama weights in Hugging Face transformers' layout, file to file
 * (safetensors), so a transformers Llama checkpoint loads with
 * weft_safetensors_import_model (into this model or nn.h's built-in one:
 * the same FQNs) and a trained model goes back:
 *   names  transformers: model.embed_tokens.weight, model.norm.weight,
 *          lm_head.weight, model.layers.N.{input_layernorm,
 *          post_attention_layernorm}.weight, .self_attn.{q,k,v,o}_proj.weight,
 *          .mlp.{gate,up,down}_proj.weight; weft: the FQNs above (w1 = gate,
 *          w3 = up, w2 = down);
 *   RoPE   weft rotates interleaved pairs (x[2j], x[2j+1]) as Meta's code;
 *          transformers rotates halves (x[j], x[j + hd/2]), so its q_proj
 *          and k_proj rows are permuted per head (as its
 *          convert_llama_weights_to_hf.py does): row h hd + 2j + s of weft's
 *          wq (wk) is row h hd + s hd/2 + j of q_proj (k_proj); cfg gives
 *          the heads (n_heads for q, n_kv_heads for k);
 *   buffers  transformers' model.layers.N.self_attn.rotary_emb.inv_freq is
 *          not a parameter: dropped.
 * hf_path may also be a sharded set's index ("model.safetensors.index.json":
 * its weight_map's files, beside it, are read; one file is written).
 * Dtypes and values are kept bit for bit; other names pass unchanged (the
 * import then reports them). Local: one rank calls it (the whole file is
 * read into memory); the output is written to a temporary file and renamed
 * into place. Errors name the file and the tensor (a q_proj whose rows the
 * heads do not split: a config that is not the file's). */
WEFT_API weft_status weft_llama_hf_to_weft(const char *hf_path, const char *weft_path,
                                           const weft_llama_config *cfg);
WEFT_API weft_status weft_llama_weft_to_hf(const char *weft_path, const char *hf_path,
                                           const weft_llama_config *cfg);
/* *is_hf = whether the file holds transformers' names
 * ("model.embed_tokens.weight"); a sharded set's index (a path ending in
 * ".json") is transformers'. Local. */
WEFT_API weft_status weft_llama_file_is_hf(const char *path, bool *is_hf);

#ifdef __cplusplus
}
#endif
#endif
