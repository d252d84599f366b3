/* models/gpt2/gpt2.c — GPT-2 on weft's public API (see gpt2.h). Each
 * module kind is a forward written with ops; backward, tensor parallelism,
 * FSDP and checkpoints come from the library. */
#include "gpt2.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------- attention */

typedef struct attn_ctx {
  int64_t n_heads, head_dim;
  float dropout;
  weft_module *c_attn, *c_proj;
} attn_ctx;

/* q, k, v = split(c_attn(x)); y = c_proj(sdpa(q, k, v)) */
static weft_status attn_forward(weft_module *m, void *ctx, weft_var *const *in, int nin,
                                weft_var **out, int nout) {
  (void)m, (void)nin, (void)nout;
  attn_ctx *a = ctx;
  const int64_t *xs = weft_dtensor_shape(weft_var_value(in[0]));
  int64_t B = xs[0], T = xs[1], D = xs[2];
  weft_var *qkv, *parts[3], *heads[3], *y;
  WEFT_CHECK(weft_module_call1(a->c_attn, in[0], &qkv));
  int64_t sizes[3] = {D, D, D};
  WEFT_CHECK(weft_op_split(qkv, 2, 3, sizes, parts));
  int64_t hshape[4] = {B, T, a->n_heads, a->head_dim};
  for (int i = 0; i < 3; i++) WEFT_CHECK(weft_op_reshape(parts[i], 4, hshape, &heads[i]));
  WEFT_CHECK(weft_op_sdpa(heads[0], heads[1], heads[2], true, &y));
  int64_t back[3] = {B, T, D};
  WEFT_CHECK(weft_op_reshape(y, 3, back, &y));
  WEFT_CHECK(weft_module_call1(a->c_proj, y, &y));
  if (a->dropout > 0) WEFT_CHECK(weft_op_dropout(y, a->dropout, &y));
  out[0] = y;
  return WEFT_OK;
}

/* ------------------------------------------------------------------- mlp */

typedef struct mlp_ctx {
  float dropout;
  weft_module *c_fc, *c_proj;
} mlp_ctx;

static weft_status mlp_forward(weft_module *m, void *ctx, weft_var *const *in, int nin,
                               weft_var **out, int nout) {
  (void)m, (void)nin, (void)nout;
  mlp_ctx *c = ctx;
  weft_var *h;
  WEFT_CHECK(weft_module_call1(c->c_fc, in[0], &h));
  WEFT_CHECK(weft_op_gelu(h, true, &h));
  WEFT_CHECK(weft_module_call1(c->c_proj, h, &h));
  if (c->dropout > 0) WEFT_CHECK(weft_op_dropout(h, c->dropout, &h));
  out[0] = h;
  return WEFT_OK;
}

/* ----------------------------------------------------------------- block */

typedef struct block_ctx {
  weft_module *ln_1, *attn, *ln_2, *mlp;
} block_ctx;

/* x = x + attn(ln_1(x)); x = x + mlp(ln_2(x)) */
static weft_status block_forward(weft_module *m, void *ctx, weft_var *const *in, int nin,
                                 weft_var **out, int nout) {
  (void)m, (void)nin, (void)nout;
  block_ctx *b = ctx;
  weft_var *x = in[0], *h;
  WEFT_CHECK(weft_module_call1(b->ln_1, x, &h));
  WEFT_CHECK(weft_module_call1(b->attn, h, &h));
  WEFT_CHECK(weft_op_add(x, h, &x));
  WEFT_CHECK(weft_module_call1(b->ln_2, x, &h));
  WEFT_CHECK(weft_module_call1(b->mlp, h, &h));
  WEFT_CHECK(weft_op_add(x, h, &x));
  out[0] = x;
  return WEFT_OK;
}

/* ------------------------------------------------------------ transformer */

typedef struct transformer_ctx {
  float dropout;
  weft_module *wte, *wpe, *h, *ln_f;
  weft_dtensor *positions; /* (T) int32 0..T-1, Replicate; remade when T changes */
} transformer_ctx;

static void transformer_destroy(void *ctx) {
  transformer_ctx *t = ctx;
  if (t) weft_dtensor_destroy(t->positions);
  free(t);
}

static weft_status positions_for(transformer_ctx *t, weft_mesh *mesh, int64_t T) {
  if (t->positions && weft_dtensor_shape(t->positions)[0] == T) return WEFT_OK;
  weft_dtensor_destroy(t->positions);
  t->positions = NULL;
  weft_tensor *p;
  WEFT_CHECK(weft_tensor_create(WEFT_I32, WEFT_CPU, 1, &T, &p));
  for (int64_t i = 0; i < T; i++) ((int32_t *)p->data)[i] = (int32_t)i;
  weft_placement pl[WEFT_MESH_MAX_DIMS];
  for (int i = 0; i < weft_mesh_ndim(mesh); i++) pl[i] = weft_replicate();
  weft_status st = weft_dtensor_distribute(mesh, p, WEFT_DTENSOR_ALL_RANKS, pl,
                                           weft_mesh_ndim(mesh), &t->positions);
  weft_tensor_destroy(p);
  return st;
}

/* h = drop(wte(ids) + wpe(0..T-1)); h = blocks(h); ln_f(h) */
static weft_status transformer_forward(weft_module *m, void *ctx, weft_var *const *in, int nin,
                                       weft_var **out, int nout) {
  (void)nin, (void)nout;
  transformer_ctx *t = ctx;
  weft_graph *g = weft_var_graph(in[0]);
  int64_t T = weft_dtensor_shape(weft_var_value(in[0]))[1];
  WEFT_CHECK(positions_for(t, weft_module_mesh(m), T));
  weft_var *pos, *tok, *pe, *x;
  WEFT_CHECK(weft_graph_input(g, t->positions, false, &pos));
  WEFT_CHECK(weft_module_call1(t->wte, in[0], &tok));
  WEFT_CHECK(weft_module_call1(t->wpe, pos, &pe));
  WEFT_CHECK(weft_op_add(tok, pe, &x));
  if (t->dropout > 0) WEFT_CHECK(weft_op_dropout(x, t->dropout, &x));
  WEFT_CHECK(weft_module_call1(t->h, x, &x));
  WEFT_CHECK(weft_module_call1(t->ln_f, x, &x));
  out[0] = x;
  return WEFT_OK;
}

/* --------------------------------------------------------------- lm_head */

/* logits = x wte^T (the tied weight) */
static weft_status lm_head_forward(weft_module *m, void *ctx, weft_var *const *in, int nin,
                                   weft_var **out, int nout) {
  (void)ctx, (void)nin, (void)nout;
  weft_var *w = weft_module_param_var(m, weft_var_graph(in[0]), "weight");
  if (!w) return weft_last_status();
  return weft_op_linear(in[0], w, NULL, out);
}

/* ----------------------------------------------------------------- model */

typedef struct model_ctx {
  weft_gpt2_config cfg;
  weft_module *transformer, *lm_head;
} model_ctx;

static weft_status model_forward(weft_module *m, void *ctx, weft_var *const *in, int nin,
                                 weft_var **out, int nout) {
  (void)m, (void)nin, (void)nout;
  model_ctx *c = ctx;
  weft_var *x;
  WEFT_CHECK(weft_module_call1(c->transformer, in[0], &x));
  return weft_module_call1(c->lm_head, x, out);
}

static const weft_module_def attn_def = {"gpt2_attention", attn_forward, free};
static const weft_module_def mlp_def = {"gpt2_mlp", mlp_forward, free};
static const weft_module_def block_def = {"gpt2_block", block_forward, free};
static const weft_module_def transformer_def = {"gpt2_transformer", transformer_forward,
                                                transformer_destroy};
static const weft_module_def lm_head_def = {"gpt2_lm_head", lm_head_forward, NULL};
static const weft_module_def model_def = {"gpt2", model_forward, free};

weft_status weft_gpt2_config_validate(const weft_gpt2_config *c) {
  if (!c) return weft_error(WEFT_ERR_INVALID, "gpt2: config is NULL");
#define NEED(cond, field) \
  if (!(cond)) return weft_error(WEFT_ERR_INVALID, "gpt2 config: bad %s", field)
  NEED(c->vocab >= 1 && c->vocab <= INT32_MAX, "vocab");
  NEED(c->max_seq_len >= 1, "max_seq_len");
  NEED(c->dim >= 1, "dim");
  NEED(c->n_layers >= 1, "n_layers");
  NEED(c->n_heads >= 1 && c->dim % c->n_heads == 0, "n_heads (must divide dim)");
  NEED(c->ffn_dim >= 1, "ffn_dim");
  NEED(c->norm_eps > 0, "norm_eps");
  NEED(c->dropout >= 0 && c->dropout < 1, "dropout");
  NEED(c->init_std >= 0, "init_std");
#undef NEED
  return WEFT_OK;
}

/* Adds child to parent, destroying the child if that fails. */
static weft_status adopt(weft_module *parent, weft_module *child) {
  weft_status st = weft_module_add_child(parent, child);
  if (st != WEFT_OK) weft_module_destroy(child);
  return st;
}

static weft_status set_std(weft_module *m, float std) {
  weft_param *p = weft_module_get_param(m, "weight");
  if (!p) return weft_error(WEFT_ERR_INTERNAL, "gpt2: '%s' has no weight", weft_module_fqn(m));
  p->init = (weft_param_init){WEFT_INIT_NORMAL, 0.0f, std, 0.0f};
  return WEFT_OK;
}

static weft_status linear(weft_mesh *mesh, weft_module *parent, const char *name, int64_t in,
                          int64_t out, float std, weft_module **m) {
  WEFT_CHECK(weft_linear_create_ex(mesh, name, in, out, true, m));
  WEFT_CHECK(adopt(parent, *m));
  return set_std(*m, std);
}

static weft_status custom(weft_mesh *mesh, weft_module *parent, const char *name,
                          const weft_module_def *def, void *ctx, weft_module **m) {
  weft_status st = weft_module_create(mesh, name, def, ctx, m);
  if (st != WEFT_OK) {
    if (def->destroy) def->destroy(ctx);
    return st;
  }
  return parent ? adopt(parent, *m) : WEFT_OK;
}

static weft_status build_block(const weft_gpt2_config *c, weft_mesh *mesh, weft_module *h, int i) {
  char name[32];
  snprintf(name, sizeof name, "%d", i);
  block_ctx *b = calloc(1, sizeof *b);
  attn_ctx *a = calloc(1, sizeof *a);
  mlp_ctx *f = calloc(1, sizeof *f);
  if (!b || !a || !f) {
    free(b), free(a), free(f);
    return weft_error(WEFT_ERR_OOM, "gpt2 block");
  }
  weft_module *blk, *attn, *mlp;
  weft_status st = custom(mesh, h, name, &block_def, b, &blk);
  if (st != WEFT_OK) {
    free(a), free(f);
    return st;
  }
  float proj_std = c->init_std / sqrtf(2.0f * (float)c->n_layers); /* nanoGPT's c_proj init */
  WEFT_CHECK(weft_layernorm_create(mesh, "ln_1", c->dim, c->norm_eps, true, &b->ln_1));
  WEFT_CHECK(adopt(blk, b->ln_1));
  a->n_heads = c->n_heads;
  a->head_dim = c->dim / c->n_heads;
  a->dropout = c->dropout;
  st = custom(mesh, blk, "attn", &attn_def, a, &attn);
  if (st != WEFT_OK) {
    free(f);
    return st;
  }
  b->attn = attn;
  WEFT_CHECK(linear(mesh, attn, "c_attn", c->dim, 3 * c->dim, c->init_std, &a->c_attn));
  WEFT_CHECK(linear(mesh, attn, "c_proj", c->dim, c->dim, proj_std, &a->c_proj));
  WEFT_CHECK(weft_layernorm_create(mesh, "ln_2", c->dim, c->norm_eps, true, &b->ln_2));
  WEFT_CHECK(adopt(blk, b->ln_2));
  f->dropout = c->dropout;
  WEFT_CHECK(custom(mesh, blk, "mlp", &mlp_def, f, &mlp));
  b->mlp = mlp;
  WEFT_CHECK(linear(mesh, mlp, "c_fc", c->dim, c->ffn_dim, c->init_std, &f->c_fc));
  WEFT_CHECK(linear(mesh, mlp, "c_proj", c->ffn_dim, c->dim, proj_std, &f->c_proj));
  return WEFT_OK;
}

static weft_status build(const weft_gpt2_config *c, weft_mesh *mesh, weft_module *root,
                         model_ctx *mc) {
  transformer_ctx *t = calloc(1, sizeof *t);
  if (!t) return weft_error(WEFT_ERR_OOM, "gpt2");
  t->dropout = c->dropout;
  WEFT_CHECK(custom(mesh, root, "transformer", &transformer_def, t, &mc->transformer));
  weft_module *tr = mc->transformer;
  WEFT_CHECK(weft_embedding_create(mesh, "wte", c->vocab, c->dim, &t->wte));
  WEFT_CHECK(adopt(tr, t->wte));
  WEFT_CHECK(set_std(t->wte, c->init_std));
  WEFT_CHECK(weft_embedding_create(mesh, "wpe", c->max_seq_len, c->dim, &t->wpe));
  WEFT_CHECK(adopt(tr, t->wpe));
  WEFT_CHECK(set_std(t->wpe, c->init_std));
  WEFT_CHECK(weft_sequential_create(mesh, "h", &t->h));
  WEFT_CHECK(adopt(tr, t->h));
  for (int i = 0; i < c->n_layers; i++) WEFT_CHECK(build_block(c, mesh, t->h, i));
  WEFT_CHECK(weft_layernorm_create(mesh, "ln_f", c->dim, c->norm_eps, true, &t->ln_f));
  WEFT_CHECK(adopt(tr, t->ln_f));
  WEFT_CHECK(custom(mesh, root, "lm_head", &lm_head_def, NULL, &mc->lm_head));
  return weft_module_tie_param(mc->lm_head, "weight", weft_module_get_param(t->wte, "weight"));
}

weft_status weft_gpt2_create(const weft_gpt2_config *cfg, weft_mesh *mesh, weft_module **out) {
  if (!out) return weft_error(WEFT_ERR_INVALID, "gpt2_create: out is NULL");
  *out = NULL;
  WEFT_CHECK(weft_gpt2_config_validate(cfg));
  model_ctx *mc = calloc(1, sizeof *mc);
  if (!mc) return weft_error(WEFT_ERR_OOM, "gpt2");
  mc->cfg = *cfg;
  weft_module *root;
  WEFT_CHECK(custom(mesh, NULL, "model", &model_def, mc, &root));
  weft_status st = build(cfg, mesh, root, mc);
  if (st != WEFT_OK) {
    weft_module_destroy(root);
    return st;
  }
  *out = root;
  return WEFT_OK;
}

const weft_gpt2_config *weft_gpt2_get_config(const weft_module *model) {
  model_ctx *mc = weft_module_ctx(model);
  return mc ? &mc->cfg : NULL;
}

weft_status weft_gpt2_logits(weft_module *model, weft_graph *g, const weft_dtensor *ids,
                             weft_var **logits) {
  const weft_gpt2_config *c = weft_gpt2_get_config(model);
  if (!c || !g || !ids || !logits)
    return weft_error(WEFT_ERR_INVALID, "gpt2_logits: model, graph, ids or out is NULL");
  if (weft_dtensor_ndim(ids) != 2 || weft_dtensor_dtype(ids) != WEFT_I32)
    return weft_error(WEFT_ERR_INVALID, "gpt2: ids must be (B, T) int32");
  if (weft_dtensor_shape(ids)[1] > c->max_seq_len)
    return weft_error(WEFT_ERR_INVALID, "gpt2: T = %lld exceeds max_seq_len %lld",
                      (long long)weft_dtensor_shape(ids)[1], (long long)c->max_seq_len);
  weft_var *x;
  WEFT_CHECK(weft_graph_input(g, ids, false, &x));
  WEFT_CHECK(weft_module_call1(model, x, logits));
  return WEFT_OK;
}

weft_status weft_gpt2_loss(weft_module *model, weft_graph *g, const weft_dtensor *ids,
                           const weft_dtensor *targets, weft_var **loss, weft_var **logits) {
  weft_var *z;
  WEFT_CHECK(weft_gpt2_logits(model, g, ids, &z));
  if (logits) *logits = z;
  WEFT_CHECK(weft_op_cross_entropy(z, targets, -100, loss));
  return WEFT_OK;
}

weft_status weft_gpt2_adamw_create(weft_module *model, const weft_adamw_params *hp,
                                   weft_optimizer **out) {
  return weft_adamw_create_decay_groups(model, hp, true, out);
}

/* ------------------------------------------------------- tensor parallel */

weft_status weft_gpt2_tp_plan(bool sp, weft_tp_plan_entry *out, int cap, int *n) {
  if (!n || (cap > 0 && !out)) return weft_error(WEFT_ERR_INVALID, "gpt2_tp_plan: NULL argument");
  weft_tp_plan_entry e[16];
  int k = 0;
  weft_placement seq = weft_shard(1), r = weft_replicate(), after = sp ? seq : r;
  e[k++] = (weft_tp_plan_entry){"transformer.wte", weft_tp_rowwise_ex(r, after, true)};
  e[k++] = (weft_tp_plan_entry){"transformer.h.*.attn.c_attn", weft_tp_colwise_fused(3)};
  e[k++] = (weft_tp_plan_entry){"transformer.h.*.attn.c_proj",
                                weft_tp_rowwise_ex(weft_shard(-1), after, true)};
  e[k++] = (weft_tp_plan_entry){"transformer.h.*.mlp.c_fc", weft_tp_colwise()};
  e[k++] = (weft_tp_plan_entry){"transformer.h.*.mlp.c_proj",
                                weft_tp_rowwise_ex(weft_shard(-1), after, true)};
  if (sp) {
    e[k++] = (weft_tp_plan_entry){"transformer.h.*.ln_1", weft_tp_sequence_parallel()};
    e[k++] = (weft_tp_plan_entry){"transformer.h.*.ln_2", weft_tp_sequence_parallel()};
    e[k++] = (weft_tp_plan_entry){"transformer.ln_f", weft_tp_sequence_parallel()};
    e[k++] = (weft_tp_plan_entry){"transformer.h.*.attn", weft_tp_prepare_input(seq, r, false)};
    e[k++] = (weft_tp_plan_entry){"transformer.h.*.mlp", weft_tp_prepare_input(seq, r, false)};
    e[k++] = (weft_tp_plan_entry){"lm_head", weft_tp_prepare_input(seq, r, false)};
  }
  for (int i = 0; i < k && i < cap; i++) out[i] = e[i];
  *n = k;
  return WEFT_OK;
}

weft_status weft_gpt2_apply_tp(weft_module *model, weft_mesh *tp_mesh, bool sp, weft_tp **out) {
  if (out) *out = NULL;
  const weft_gpt2_config *c = model ? weft_gpt2_get_config(model) : NULL;
  if (!c || !tp_mesh || !out)
    return weft_error(WEFT_ERR_INVALID, "gpt2_apply_tp: model (a GPT-2), tp_mesh or out is NULL");
  if (weft_mesh_ndim(tp_mesh) != 1)
    return weft_error(WEFT_ERR_INVALID, "gpt2_apply_tp: tp_mesh must be 1-D, it has %d dims",
                      weft_mesh_ndim(tp_mesh));
  int tp = weft_mesh_dim_size(tp_mesh, 0);
  if (c->n_heads % tp != 0)
    return weft_error(WEFT_ERR_INVALID,
                      "gpt2_apply_tp: n_heads = %lld is not divisible by the tp size %d (heads "
                      "are split across tp ranks)",
                      (long long)c->n_heads, tp);
  weft_tp_plan_entry plan[16];
  int n;
  WEFT_CHECK(weft_gpt2_tp_plan(sp, plan, 16, &n));
  return weft_parallelize_module(model, tp_mesh, plan, n, out);
}
