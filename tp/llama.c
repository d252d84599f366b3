/* tp/llama.c — torchtitan's tensor-parallel plan for the reference Llama
 * model (torchtitan/models/llama/parallelize_llama.py, apply_tp), with and
 * without sequence parallel, and loss parallel on vocab-sharded logits. */
#include <string.h>

#include "tp.h"

weft_status weft_tp_llama_plan(bool sp, bool lp, weft_tp_plan_entry *out, int cap, int *n) {
  if (!n || (cap > 0 && !out)) return weft_error(WEFT_ERR_INVALID, "tp: NULL argument");
  weft_tp_plan_entry e[16];
  int k = 0;
  weft_placement seq = weft_shard(1), r = weft_replicate();
  /* tokens are Replicate; the embedding's partial sums are all-reduced, or
   * reduce-scattered onto the sequence shards */
  e[k++] = (weft_tp_plan_entry){"tok_embeddings", weft_tp_rowwise_ex(r, sp ? seq : r, true)};
  if (sp) e[k++] = (weft_tp_plan_entry){"norm", weft_tp_sequence_parallel()};
  /* vocab-sharded logits stay sharded for loss parallel, else are gathered */
  e[k++] = (weft_tp_plan_entry){"output",
                                weft_tp_colwise_ex(sp ? seq : r, lp ? weft_shard(-1) : r, !lp)};
  if (sp) {
    e[k++] = (weft_tp_plan_entry){"layers.*.attention_norm", weft_tp_sequence_parallel()};
    e[k++] = (weft_tp_plan_entry){"layers.*.attention", weft_tp_prepare_input(seq, r, false)};
  }
  e[k++] = (weft_tp_plan_entry){"layers.*.attention.wq", weft_tp_colwise()};
  e[k++] = (weft_tp_plan_entry){"layers.*.attention.wk", weft_tp_colwise()};
  e[k++] = (weft_tp_plan_entry){"layers.*.attention.wv", weft_tp_colwise()};
  e[k++] = (weft_tp_plan_entry){"layers.*.attention.wo",
                                weft_tp_rowwise_ex(weft_shard(-1), sp ? seq : r, true)};
  if (sp) {
    e[k++] = (weft_tp_plan_entry){"layers.*.ffn_norm", weft_tp_sequence_parallel()};
    e[k++] = (weft_tp_plan_entry){"layers.*.feed_forward", weft_tp_prepare_input(seq, r, false)};
  }
  e[k++] = (weft_tp_plan_entry){"layers.*.feed_forward.w1", weft_tp_colwise()};
  e[k++] = (weft_tp_plan_entry){"layers.*.feed_forward.w2",
                                weft_tp_rowwise_ex(weft_shard(-1), sp ? seq : r, true)};
  e[k++] = (weft_tp_plan_entry){"layers.*.feed_forward.w3", weft_tp_colwise()};
  for (int i = 0; i < k && i < cap; i++) out[i] = e[i];
  *n = k;
  return WEFT_OK;
}

weft_status weft_tp_apply_llama_plan(weft_module *model, weft_mesh *tp_mesh, bool sp, bool lp,
                                     weft_tp **out) {
  if (out) *out = NULL;
  if (!model || !tp_mesh || !out)
    return weft_error(WEFT_ERR_INVALID, "tp: model, tp_mesh or out is NULL");
  if (weft_module_get_kind(model) != WEFT_MODULE_MODEL)
    return weft_error(WEFT_ERR_INVALID, "tp: '%s' is a %s module, not the Llama model",
                      weft_module_fqn(model)[0] ? weft_module_fqn(model) : "(root)",
                      weft_module_kind_name(weft_module_get_kind(model)));
  if (weft_mesh_ndim(tp_mesh) != 1)
    return weft_error(WEFT_ERR_INVALID, "tp: tp_mesh must be 1-D, it has %d dims",
                      weft_mesh_ndim(tp_mesh));
  const weft_llama_config *cfg = weft_llama_get_config(model);
  if (!cfg) return weft_error(WEFT_ERR_INVALID, "tp: model has no Llama config");
  int tp = weft_mesh_dim_size(tp_mesh, 0);
  if (cfg->n_heads % tp != 0 || cfg->n_kv_heads % tp != 0)
    return weft_error(WEFT_ERR_INVALID,
                      "tp: n_heads = %lld and n_kv_heads = %lld must both be divisible by the "
                      "tp size %d (heads are split across tp ranks)",
                      (long long)cfg->n_heads, (long long)cfg->n_kv_heads, tp);
  weft_module *loss = NULL;
  if (lp) WEFT_CHECK(weft_module_find(model, "loss", &loss)); /* before changing anything */
  weft_tp_plan_entry plan[16];
  int n;
  WEFT_CHECK(weft_tp_llama_plan(sp, lp, plan, 16, &n));
  weft_tp *t;
  WEFT_CHECK(weft_parallelize_module(model, tp_mesh, plan, n, &t));
  if (lp) {
    weft_status st = weft_tp_enable_loss_parallel(t, loss);
    if (st) { /* only out of memory here */
      weft_tp_destroy(t);
      return weft_error_trace(st, __func__);
    }
  }
  *out = t;
  return WEFT_OK;
}
