/* models/llama/llama.c — Llama on weft's public API (see llama.h). Each
 * module kind is a forward written with ops; backward, tensor parallelism,
 * FSDP and checkpoints come from the library. */
#include "llama.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char model_kind[] = "llama_ops";

/* ------------------------------------------------------------- attention */

typedef struct attn_ctx {
  int64_t n_heads, n_kv_heads, head_dim;
  double rope_theta;
  weft_module *wq, *wk, *wv, *wo;
} attn_ctx;

/* (B, T, n * hd) -> (B, T, n, hd): a view; a feature shard (TP colwise)
 * becomes a head shard. */
static weft_status heads(weft_var *x, int64_t n, int64_t hd, weft_var **out) {
  const int64_t *s = weft_dtensor_shape(weft_var_value(x));
  int64_t shape[4] = {s[0], s[1], n, hd};
  return weft_op_reshape(x, 4, shape, out);
}

/* y = wo(sdpa(rope(wq x), rope(wk x), wv x)), causal, grouped-query */
static weft_status attn_forward(weft_module *m, void *ctx, weft_var *const *in, int nin,
                                weft_var **out, int nout) {
  (void)m, (void)nin, (void)nout;
  attn_ctx *a = ctx;
  weft_var *q, *k, *v, *y;
  WEFT_CHECK(weft_module_call1(a->wq, in[0], &q));
  WEFT_CHECK(weft_module_call1(a->wk, in[0], &k));
  WEFT_CHECK(weft_module_call1(a->wv, in[0], &v));
  WEFT_CHECK(heads(q, a->n_heads, a->head_dim, &q));
  WEFT_CHECK(heads(k, a->n_kv_heads, a->head_dim, &k));
  WEFT_CHECK(heads(v, a->n_kv_heads, a->head_dim, &v));
  WEFT_CHECK(weft_op_rope(q, a->rope_theta, 0, &q));
  WEFT_CHECK(weft_op_rope(k, a->rope_theta, 0, &k));
  WEFT_CHECK(weft_op_sdpa(q, k, v, true, &y));
  const int64_t *s = weft_dtensor_shape(weft_var_value(y));
  int64_t back[3] = {s[0], s[1], a->n_heads * a->head_dim};
  WEFT_CHECK(weft_op_reshape(y, 3, back, &y));
  return weft_module_call1(a->wo, y, out);
}

/* ---------------------------------------------------------- feed forward */

typedef struct ff_ctx {
  weft_module *w1, *w2, *w3;
} ff_ctx;

/* w2(silu(w1 x) * w3 x) */
static weft_status ff_forward(weft_module *m, void *ctx, weft_var *const *in, int nin,
                              weft_var **out, int nout) {
  (void)m, (void)nin, (void)nout;
  ff_ctx *f = ctx;
  weft_var *a, *b, *h;
  WEFT_CHECK(weft_module_call1(f->w1, in[0], &a));
  WEFT_CHECK(weft_module_call1(f->w3, in[0], &b));
  WEFT_CHECK(weft_op_swiglu(a, b, &h));
  return weft_module_call1(f->w2, h, out);
}

/* ----------------------------------------------------------------- block */

typedef struct block_ctx {
  weft_module *attention_norm, *attention, *ffn_norm, *feed_forward;
} block_ctx;

/* h = x + attention(attention_norm(x)); out = h + feed_forward(ffn_norm(h)) */
static weft_status block_forward(weft_module *m, void *ctx, weft_var *const *in, int nin,
                                 weft_var **out, int nout) {
  (void)m, (void)nin, (void)nout;
  block_ctx *b = ctx;
  weft_var *x = in[0], *h;
  WEFT_CHECK(weft_module_call1(b->attention_norm, x, &h));
  WEFT_CHECK(weft_module_call1(b->attention, h, &h));
  WEFT_CHECK(weft_op_add(x, h, &x));
  WEFT_CHECK(weft_module_call1(b->ffn_norm, x, &h));
  WEFT_CHECK(weft_module_call1(b->feed_forward, h, &h));
  return weft_op_add(x, h, out);
}

/* ----------------------------------------------------------------- model */

typedef struct model_ctx {
  weft_llama_config cfg;
  weft_module *tok_embeddings, *layers, *norm, *output;
} model_ctx;

static weft_status model_forward(weft_module *m, void *ctx, weft_var *const *in, int nin,
                                 weft_var **out, int nout) {
  (void)m, (void)nin, (void)nout;
  model_ctx *c = ctx;
  weft_var *x;
  WEFT_CHECK(weft_module_call1(c->tok_embeddings, in[0], &x));
  WEFT_CHECK(weft_module_call1(c->layers, x, &x));
  WEFT_CHECK(weft_module_call1(c->norm, x, &x));
  return weft_module_call1(c->output, x, out);
}

static const weft_module_def attn_def = {"llama_ops_attention", attn_forward, free};
static const weft_module_def ff_def = {"llama_ops_feed_forward", ff_forward, free};
static const weft_module_def block_def = {"llama_ops_block", block_forward, free};
static const weft_module_def model_def = {model_kind, model_forward, free};

/* ----------------------------------------------------------- construction */

/* Adds child to parent, destroying the child if that fails. */
static weft_status adopt(weft_module *parent, weft_module *child) {
  weft_status st = weft_module_add_child(parent, child);
  if (st != WEFT_OK) weft_module_destroy(child);
  return st;
}

/* The built-in model draws linears and embeddings from Normal(0,
 * init_std); weft_linear_create / weft_embedding_create default to 0.02. */
static weft_status set_std(weft_module *m, float std) {
  weft_param *p = weft_module_get_param(m, "weight");
  if (!p) return weft_error(WEFT_ERR_INTERNAL, "llama: '%s' has no weight", weft_module_fqn(m));
  p->init = (weft_param_init){WEFT_INIT_NORMAL, 0.0f, std, 0.0f};
  return WEFT_OK;
}

static weft_status linear(weft_mesh *mesh, weft_module *parent, const char *name, int64_t in,
                          int64_t out, float std, weft_module **m) {
  WEFT_CHECK(weft_linear_create(mesh, name, in, out, m));
  WEFT_CHECK(adopt(parent, *m));
  return set_std(*m, std);
}

static weft_status rmsnorm(weft_mesh *mesh, weft_module *parent, const char *name,
                           const weft_llama_config *c, weft_module **m) {
  WEFT_CHECK(weft_rmsnorm_create(mesh, name, c->dim, c->norm_eps, m));
  return adopt(parent, *m);
}

/* A module of kind def owning ctx (freed here if creation fails), added
 * to parent when there is one. */
static weft_status custom(weft_mesh *mesh, weft_module *parent, const char *name,
                          const weft_module_def *def, void *ctx, weft_module **m) {
  weft_status st = weft_module_create(mesh, name, def, ctx, m);
  if (st != WEFT_OK) {
    if (def->destroy) def->destroy(ctx);
    return st;
  }
  return parent ? adopt(parent, *m) : WEFT_OK;
}

/* layers.<i>: attention_norm, attention {wq, wk, wv, wo}, ffn_norm,
 * feed_forward {w1, w2, w3}, created in the built-in model's order (so
 * weft_module_parameters lists them alike). */
static weft_status build_block(const weft_llama_config *c, weft_mesh *mesh, weft_module *layers,
                               int64_t i) {
  char name[32];
  snprintf(name, sizeof name, "%lld", (long long)i);
  block_ctx *b = calloc(1, sizeof *b);
  attn_ctx *a = calloc(1, sizeof *a);
  ff_ctx *f = calloc(1, sizeof *f);
  if (!b || !a || !f) {
    free(b), free(a), free(f);
    return weft_error(WEFT_ERR_OOM, "llama block %lld", (long long)i);
  }
  int64_t hd = c->dim / c->n_heads, q = c->n_heads * hd, kv = c->n_kv_heads * hd;
  a->n_heads = c->n_heads;
  a->n_kv_heads = c->n_kv_heads;
  a->head_dim = hd;
  a->rope_theta = c->rope_theta;
  /* custom() takes each ctx over (freeing it on failure): a and f are
   * cleared once handed over, so `fail` frees only what is still ours */
  attn_ctx *aa = a;
  ff_ctx *ff = f;
  weft_module *blk;
  weft_status st = custom(mesh, layers, name, &block_def, b, &blk);
  if (st) goto fail;
  if ((st = rmsnorm(mesh, blk, "attention_norm", c, &b->attention_norm))) goto fail;
  a = NULL;
  if ((st = custom(mesh, blk, "attention", &attn_def, aa, &b->attention))) goto fail;
  if ((st = linear(mesh, b->attention, "wq", c->dim, q, c->init_std, &aa->wq))) goto fail;
  if ((st = linear(mesh, b->attention, "wk", c->dim, kv, c->init_std, &aa->wk))) goto fail;
  if ((st = linear(mesh, b->attention, "wv", c->dim, kv, c->init_std, &aa->wv))) goto fail;
  if ((st = linear(mesh, b->attention, "wo", q, c->dim, c->init_std, &aa->wo))) goto fail;
  if ((st = rmsnorm(mesh, blk, "ffn_norm", c, &b->ffn_norm))) goto fail;
  f = NULL;
  if ((st = custom(mesh, blk, "feed_forward", &ff_def, ff, &b->feed_forward))) goto fail;
  if ((st = linear(mesh, b->feed_forward, "w1", c->dim, c->ffn_dim, c->init_std, &ff->w1)))
    goto fail;
  if ((st = linear(mesh, b->feed_forward, "w2", c->ffn_dim, c->dim, c->init_std, &ff->w2)))
    goto fail;
  if ((st = linear(mesh, b->feed_forward, "w3", c->dim, c->ffn_dim, c->init_std, &ff->w3)))
    goto fail;
  return WEFT_OK;
fail:
  free(a), free(f);
  return st;
}

static weft_status build(const weft_llama_config *c, weft_mesh *mesh, weft_module *root,
                         model_ctx *mc) {
  WEFT_CHECK(weft_embedding_create(mesh, "tok_embeddings", c->vocab, c->dim, &mc->tok_embeddings));
  WEFT_CHECK(adopt(root, mc->tok_embeddings));
  WEFT_CHECK(set_std(mc->tok_embeddings, c->init_std));
  WEFT_CHECK(weft_sequential_create(mesh, "layers", &mc->layers));
  WEFT_CHECK(adopt(root, mc->layers));
  for (int64_t i = 0; i < c->n_layers; i++) WEFT_CHECK(build_block(c, mesh, mc->layers, i));
  WEFT_CHECK(rmsnorm(mesh, root, "norm", c, &mc->norm));
  return linear(mesh, root, "output", c->dim, c->vocab, c->init_std, &mc->output);
}

weft_status weft_llama_ops_create(const weft_llama_config *cfg, weft_mesh *mesh,
                                  weft_module **out) {
  if (!out) return weft_error(WEFT_ERR_INVALID, "llama_ops_create: out is NULL");
  *out = NULL;
  if (!mesh) return weft_error(WEFT_ERR_INVALID, "llama_ops_create: mesh is NULL");
  WEFT_CHECK(weft_llama_config_validate(cfg));
  model_ctx *mc = calloc(1, sizeof *mc);
  if (!mc) return weft_error(WEFT_ERR_OOM, "llama");
  mc->cfg = *cfg;
  weft_module *root;
  WEFT_CHECK(custom(mesh, NULL, "model", &model_def, mc, &root));
  weft_status st = build(cfg, mesh, root, mc);
  if (st != WEFT_OK) {
    weft_module_destroy(root);
    return weft_error_trace(st, __func__);
  }
  *out = root;
  return WEFT_OK;
}

const weft_llama_config *weft_llama_ops_get_config(const weft_module *model) {
  if (!model || weft_module_get_kind(model) != WEFT_MODULE_CUSTOM ||
      strcmp(weft_module_def_name(model), model_kind) != 0)
    return NULL;
  model_ctx *mc = weft_module_ctx(model);
  return mc ? &mc->cfg : NULL;
}

/* ---------------------------------------------------------------- running */

weft_status weft_llama_ops_logits(weft_module *model, weft_graph *g, const weft_dtensor *ids,
                                  weft_var **logits) {
  if (logits) *logits = NULL;
  if (!model || !g || !ids || !logits)
    return weft_error(WEFT_ERR_INVALID, "llama_ops_logits: model, graph, ids or out is NULL");
  const weft_llama_config *c = weft_llama_ops_get_config(model);
  if (!c)
    return weft_error(WEFT_ERR_INVALID,
                      "llama_ops_logits: '%s' (%s) is not a model made by "
                      "weft_llama_ops_create",
                      weft_module_name(model), weft_module_def_name(model));
  if (weft_dtensor_ndim(ids) != 2 || weft_dtensor_dtype(ids) != WEFT_I32)
    return weft_error(WEFT_ERR_INVALID, "llama_ops: ids must be (B, T) int32, got %d dims of %s",
                      weft_dtensor_ndim(ids), weft_dtype_name(weft_dtensor_dtype(ids)));
  const int64_t *s = weft_dtensor_shape(ids);
  if (s[0] < 1 || s[1] < 1 || s[1] > c->max_seq_len)
    return weft_error(WEFT_ERR_INVALID,
                      "llama_ops: ids (%lld, %lld): need B >= 1 and 1 <= T <= max_seq_len %lld",
                      (long long)s[0], (long long)s[1], (long long)c->max_seq_len);
  weft_var *x;
  WEFT_CHECK(weft_graph_input(g, ids, false, &x));
  WEFT_CHECK(weft_module_call1(model, x, logits));
  return WEFT_OK;
}

weft_status weft_llama_ops_loss(weft_module *model, weft_graph *g, const weft_dtensor *ids,
                                const weft_dtensor *targets, weft_var **loss, weft_var **logits) {
  if (loss) *loss = NULL;
  if (logits) *logits = NULL;
  if (!loss || !targets)
    return weft_error(WEFT_ERR_INVALID, "llama_ops_loss: targets or loss is NULL");
  weft_var *z;
  WEFT_CHECK(weft_llama_ops_logits(model, g, ids, &z));
  if (logits) *logits = z;
  return weft_op_cross_entropy(z, targets, -100, loss);
}

/* ----------------------------------------------------- tensor parallelism */

weft_status weft_llama_ops_tp_plan(bool sp, bool lp, weft_tp_plan_entry *out, int cap, int *n) {
  /* the same FQNs as nn's built-in Llama: torchtitan's plan in tp/ */
  WEFT_CHECK(weft_tp_llama_plan(sp, lp, out, cap, n));
  return WEFT_OK;
}

weft_status weft_llama_ops_parallelize(weft_module *model, weft_mesh *tp_mesh, bool sp, bool lp,
                                       weft_tp **out) {
  if (out) *out = NULL;
  if (!model || !tp_mesh || !out)
    return weft_error(WEFT_ERR_INVALID, "llama_ops_parallelize: model, tp_mesh or out is NULL");
  const weft_llama_config *c = weft_llama_ops_get_config(model);
  if (!c)
    return weft_error(WEFT_ERR_INVALID,
                      "llama_ops_parallelize: '%s' (%s) is not a model made "
                      "by weft_llama_ops_create",
                      weft_module_name(model), weft_module_def_name(model));
  if (weft_mesh_ndim(tp_mesh) != 1)
    return weft_error(WEFT_ERR_INVALID,
                      "llama_ops_parallelize: tp_mesh must be 1-D, it has %d "
                      "dims",
                      weft_mesh_ndim(tp_mesh));
  int tp = weft_mesh_dim_size(tp_mesh, 0);
  if (c->n_heads % tp != 0 || c->n_kv_heads % tp != 0)
    return weft_error(WEFT_ERR_INVALID,
                      "llama_ops_parallelize: n_heads = %lld and n_kv_heads = %lld must both be "
                      "divisible by the tp size %d (heads are split across tp ranks)",
                      (long long)c->n_heads, (long long)c->n_kv_heads, tp);
  weft_tp_plan_entry plan[16];
  int n;
  WEFT_CHECK(weft_llama_ops_tp_plan(sp, lp, plan, 16, &n));
  return weft_parallelize_module(model, tp_mesh, plan, n, out);
}
