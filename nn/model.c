/* nn/model.c — the sequential container, the transformer block, the
 * cross-entropy loss module (plain, loss-parallel and row-sharded) and the
 * Llama-style reference model. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "nn_internal.h"

/* ================================================================ Sequential */

static weft_status seq_forward(weft_module *m, const weft_dtensor *x, const weft_dtensor **out) {
  const weft_dtensor *cur = x;
  for (int i = 0; i < m->nchildren; i++) WEFT_CHECK(weft_module_forward(m->children[i], cur, &cur));
  *out = cur;
  return WEFT_OK;
}

static weft_status seq_backward(weft_module *m, const weft_dtensor *dy, const weft_dtensor **din) {
  const weft_dtensor *cur = dy;
  for (int i = m->nchildren - 1; i >= 0 && cur; i--)
    WEFT_CHECK(weft_module_backward(m->children[i], cur, &cur));
  *din = cur;
  return WEFT_OK;
}

static void seq_destroy(weft_module *m) { (void)m; }

static const nn_ops seq_ops = {seq_forward, seq_backward, seq_destroy, nn_seq_graph_forward};

weft_status weft_sequential_create(weft_mesh *mesh, const char *name, weft_module **out) {
  WEFT_CHECK(nn_module_new(mesh, WEFT_MODULE_CONTAINER, name, &seq_ops, NULL, out));
  return WEFT_OK;
}

/* ==================================================================== Block */

typedef struct block_impl {
  weft_module *attention_norm, *attention, *ffn_norm, *feed_forward;
  weft_dtensor *h, *out; /* h = x + attn(norm(x)); out = h + ff(norm(h)) */
  weft_dtensor *dh, *dx, *dout_tmp, *tmp[4];
} block_impl;

static weft_status block_forward(weft_module *m, const weft_dtensor *x, const weft_dtensor **out) {
  block_impl *K = m->impl;
  WEFT_CHECK(nn_check_input(m, x, "input", WEFT_F32, 1));
  const weft_dtensor_spec *xs = weft_dtensor_get_spec(x);
  const weft_dtensor *n1, *a, *n2, *f;
  WEFT_CHECK(weft_module_forward(K->attention_norm, x, &n1));
  WEFT_CHECK(weft_module_forward(K->attention, n1, &a));
  WEFT_CHECK(nn_ensure(&K->h, m->mesh, WEFT_F32, xs->ndim, xs->shape, xs->placements));
  WEFT_CHECK(nn_add(K->h, x, a, &K->tmp[0]));
  WEFT_CHECK(weft_module_forward(K->ffn_norm, K->h, &n2));
  WEFT_CHECK(weft_module_forward(K->feed_forward, n2, &f));
  WEFT_CHECK(nn_ensure(&K->out, m->mesh, WEFT_F32, xs->ndim, xs->shape, xs->placements));
  WEFT_CHECK(nn_add(K->out, K->h, f, &K->tmp[1]));
  *out = K->out;
  return WEFT_OK;
}

static weft_status block_backward(weft_module *m, const weft_dtensor *dy0,
                                  const weft_dtensor **din) {
  block_impl *K = m->impl;
  const weft_dtensor *dy, *df, *dn2, *da, *dn1;
  WEFT_CHECK(nn_coerce_grad(m, dy0, weft_dtensor_get_spec(K->out), true, &dy, &K->dout_tmp));
  const weft_dtensor_spec *ds = weft_dtensor_get_spec(dy);
  /* out = h + f: dh = dout + d(ffn_norm input) */
  WEFT_CHECK(weft_module_backward(K->feed_forward, dy, &df));
  WEFT_CHECK(weft_module_backward(K->ffn_norm, df, &dn2));
  WEFT_CHECK(nn_ensure(&K->dh, m->mesh, WEFT_F32, ds->ndim, ds->shape, ds->placements));
  WEFT_CHECK(nn_add(K->dh, dy, dn2, &K->tmp[2]));
  /* h = x + a: dx = dh + d(attention_norm input) */
  WEFT_CHECK(weft_module_backward(K->attention, K->dh, &da));
  WEFT_CHECK(weft_module_backward(K->attention_norm, da, &dn1));
  WEFT_CHECK(nn_ensure(&K->dx, m->mesh, WEFT_F32, ds->ndim, ds->shape, ds->placements));
  WEFT_CHECK(nn_add(K->dx, K->dh, dn1, &K->tmp[3]));
  *din = K->dx;
  return WEFT_OK;
}

static void block_destroy(weft_module *m) {
  block_impl *K = m->impl;
  if (!K) return;
  weft_dtensor *d[] = {K->h,      K->out,    K->dh,     K->dx,    K->dout_tmp,
                       K->tmp[0], K->tmp[1], K->tmp[2], K->tmp[3]};
  for (size_t i = 0; i < sizeof d / sizeof d[0]; i++) weft_dtensor_destroy(d[i]);
  free(K);
}

static const nn_ops block_ops = {block_forward, block_backward, block_destroy, NULL};

/* Attaches *child (just made by a constructor that returned st) to parent,
 * destroying it if that fails. Takes a pointer so that *child is read after
 * the constructor ran (argument evaluation order is unspecified). */
static weft_status attach_new(weft_module *parent, weft_module **child, weft_status st) {
  if (st) return st;
  st = nn_module_attach(parent, *child);
  if (st) {
    weft_module_destroy(*child);
    *child = NULL;
  }
  return st;
}

weft_status weft_block_create(weft_mesh *mesh, const char *name, const weft_llama_config *cfg,
                              weft_module **out) {
  if (out) *out = NULL;
  if (!cfg) return weft_error(WEFT_ERR_INVALID, "cfg is NULL");
  WEFT_CHECK(weft_llama_config_validate(cfg));
  block_impl *K = calloc(1, sizeof *K);
  if (!K) return weft_error(WEFT_ERR_OOM, "block");
  weft_module *m;
  WEFT_CHECK(nn_module_new(mesh, WEFT_MODULE_BLOCK, name, &block_ops, K, &m));
  weft_status st;
  weft_module *c = NULL;
  st = attach_new(m, &c, weft_rmsnorm_create(mesh, "attention_norm", cfg->dim, cfg->norm_eps, &c));
  if (!st) K->attention_norm = c;
  if (!st) st = attach_new(m, &c, weft_attention_create(mesh, "attention", cfg, &c));
  if (!st) K->attention = c;
  if (!st)
    st = attach_new(m, &c, weft_rmsnorm_create(mesh, "ffn_norm", cfg->dim, cfg->norm_eps, &c));
  if (!st) K->ffn_norm = c;
  if (!st)
    st = attach_new(
        m, &c,
        nn_feed_forward_new(mesh, "feed_forward", cfg->dim, cfg->ffn_dim, cfg->init_std, &c));
  if (!st) K->feed_forward = c;
  if (st) {
    weft_module_destroy(m);
    return weft_error_trace(st, __func__);
  }
  *out = m;
  return WEFT_OK;
}

/* ===================================================================== Loss */

typedef struct loss_impl {
  weft_tensor *targets; /* (B, T) int32, owned copy */
  bool has_targets;
  weft_loss_impl impl;
  void *ctx;
  const weft_dtensor *logits;
  weft_dtensor *out, *dlogits, *dl_tmp;
  double loss;
  /* default implementation's state */
  nn_scratch lse, rows; /* lse (N); gmax, gtarget, gsum (3N) */
  int32_t *tl;          /* local targets (N), gathered on the host */
  int64_t tl_cap;
  nn_scratch tl_dev; /* the same on the logits' device (not the CPU) */
  const int32_t *tk; /* where the kernels read them: tl or tl_dev */
  int64_t n_local, total, v0, nv;
  bool vocab_sharded;
} loss_impl;

/* The default loss: see nn.h's rules. Local rows are the positions of
 * this rank's logits box; targets are gathered for them. */
static weft_status default_loss_forward(void *ctx, const weft_dtensor *logits,
                                        const weft_tensor *targets, double *loss) {
  loss_impl *L = ctx;
  const weft_dtensor_spec *s = weft_dtensor_get_spec(logits);
  weft_mesh *mesh = weft_dtensor_mesh(logits);
  int nd = s->mesh_ndim, last = s->ndim - 1;
  bool vocab_dim[WEFT_MESH_MAX_DIMS], row_dim[WEFT_MESH_MAX_DIMS];
  L->vocab_sharded = false;
  for (int i = 0; i < nd; i++) {
    weft_placement p = s->placements[i];
    vocab_dim[i] = nn_is_s(p, last);
    row_dim[i] = p.kind == WEFT_PLACE_SHARD && p.dim != last;
    if (!nn_is_r(p) && !vocab_dim[i] && !row_dim[i]) {
      char a[32];
      weft_placement_describe(p, a, sizeof a);
      const char *dn = weft_mesh_dim_name(mesh, i);
      return weft_error(WEFT_ERR_UNSUPPORTED,
                        "loss: logits placement %s on mesh dim %d (%s) is not supported: R, "
                        "S(-1) (loss parallel) or a row shard",
                        a, i, dn ? dn : "?");
    }
    if (vocab_dim[i]) L->vocab_sharded = true;
  }
  const weft_tensor *ll = weft_dtensor_local(logits);
  int64_t off[WEFT_MAX_DIMS];
  if (!weft_dtensor_local_offset(logits, off))
    return weft_error(WEFT_ERR_UNSUPPORTED, "loss: logits shard is not contiguous");
  int64_t n = 1, total = 1;
  for (int d = 0; d < last; d++) {
    n *= ll->shape[d];
    total *= s->shape[d];
  }
  L->nv = ll->shape[last];
  L->v0 = L->nv ? off[last] : 0;
  L->n_local = n;
  L->total = total;
  if (n > L->tl_cap) {
    void *p;
    WEFT_CHECK(weft_alloc(WEFT_CPU, (size_t)n * sizeof(int32_t), &p));
    weft_free(L->tl);
    L->tl = p;
    L->tl_cap = n;
  }
  /* gather the targets of the local rows (row-major over the local box) */
  const int32_t *tg = targets->data;
  for (int64_t r = 0; r < n; r++) {
    int64_t rem = r, flat = 0, stride = 1;
    for (int d = last - 1; d >= 0; d--) {
      int64_t sz = ll->shape[d];
      int64_t i = rem % sz;
      rem /= sz;
      flat += (off[d] + i) * stride;
      stride *= s->shape[d];
    }
    L->tl[r] = tg[flat];
  }
  L->tk = L->tl;
  if (ll->device != WEFT_CPU) {
    WEFT_CHECK(nn_scratch_reserve(&L->tl_dev, ll->device, n > 0 ? n : 1));
    WEFT_CHECK(nn_host_put(ll->device, L->tl_dev.p, L->tl, (size_t)n * sizeof(int32_t)));
    L->tk = (const int32_t *)L->tl_dev.p;
  }
  WEFT_CHECK(nn_scratch_reserve(&L->lse, ll->device, n > 0 ? n : 1));
  double mean = 0.0;
  if (!L->vocab_sharded) {
    if (n > 0)
      WEFT_CHECK(weft_backend_cross_entropy_forward(ll->device, &mean, L->lse.p, ll->data, L->tk, n,
                                                    L->nv));
  } else {
    WEFT_CHECK(nn_scratch_reserve(&L->rows, ll->device, 3 * (n > 0 ? n : 1)));
    float *gmax = L->rows.p, *gtgt = gmax + n, *gsum = gtgt + n;
    WEFT_CHECK(weft_backend_cross_entropy_local_max(ll->device, gmax, ll->data, n, L->nv));
    WEFT_CHECK(weft_backend_cross_entropy_local_target(ll->device, gtgt, ll->data, L->tk, n, L->v0,
                                                       L->nv));
    for (int i = 0; i < nd; i++)
      if (vocab_dim[i] && s->mesh_shape[i] > 1) {
        WEFT_CHECK(weft_all_reduce(mesh, i, gmax, gmax, n, WEFT_F32, WEFT_OP_MAX, NULL));
        WEFT_CHECK(weft_all_reduce(mesh, i, gtgt, gtgt, n, WEFT_F32, WEFT_OP_SUM, NULL));
      }
    WEFT_CHECK(weft_backend_cross_entropy_local_sumexp(ll->device, gsum, ll->data, gmax, n, L->nv));
    for (int i = 0; i < nd; i++)
      if (vocab_dim[i] && s->mesh_shape[i] > 1)
        WEFT_CHECK(weft_all_reduce(mesh, i, gsum, gsum, n, WEFT_F32, WEFT_OP_SUM, NULL));
    if (n > 0)
      WEFT_CHECK(
          weft_backend_cross_entropy_finish(ll->device, &mean, L->lse.p, gmax, gsum, gtgt, n));
  }
  double sum = mean * (double)n;
  for (int i = 0; i < nd; i++)
    if (row_dim[i] && s->mesh_shape[i] > 1)
      WEFT_CHECK(weft_all_reduce(mesh, i, &sum, &sum, 1, WEFT_F64, WEFT_OP_SUM, NULL));
  *loss = total ? sum / (double)total : 0.0;
  return WEFT_OK;
}

static weft_status default_loss_backward(void *ctx, const weft_dtensor *logits,
                                         const weft_tensor *targets, double dloss,
                                         weft_dtensor *dlogits) {
  loss_impl *L = ctx;
  (void)targets;
  if (L->n_local == 0) return WEFT_OK;
  float scale = (float)(dloss / (double)L->total);
  const float *lg = nn_f32(logits);
  if (!L->vocab_sharded)
    return weft_backend_cross_entropy_backward(nn_dev(logits), nn_f32(dlogits), lg, L->lse.p, L->tk,
                                               L->n_local, L->nv, scale);
  return weft_backend_cross_entropy_backward_local(nn_dev(logits), nn_f32(dlogits), lg, L->lse.p,
                                                   L->tk, L->n_local, L->v0, L->nv, scale);
}

static weft_status loss_forward(weft_module *m, const weft_dtensor *logits,
                                const weft_dtensor **out) {
  loss_impl *L = m->impl;
  WEFT_CHECK(nn_check_input(m, logits, "logits", WEFT_F32, 2));
  if (!L->has_targets)
    return weft_error(WEFT_ERR_STATE, "loss '%s': no targets (weft_loss_set_targets)",
                      m->fqn[0] ? m->fqn : m->name);
  const weft_dtensor_spec *s = weft_dtensor_get_spec(logits);
  const weft_tensor *t = L->targets;
  bool ok = t->ndim == s->ndim - 1;
  for (int d = 0; ok && d < t->ndim; d++) ok = t->shape[d] == s->shape[d];
  if (!ok) {
    char a[128], b[256];
    weft_tensor_describe(t, a, sizeof a);
    weft_dtensor_spec_describe(s, b, sizeof b);
    return weft_error(WEFT_ERR_INVALID, "loss '%s': targets %s do not match logits %s",
                      m->fqn[0] ? m->fqn : m->name, a, b);
  }
  int64_t V = s->shape[s->ndim - 1], nt = weft_tensor_numel(t);
  const int32_t *tg = t->data;
  for (int64_t i = 0; i < nt; i++)
    if (tg[i] < 0 || tg[i] >= V)
      return weft_error(WEFT_ERR_INVALID,
                        "loss '%s': target %d at flat index %lld is outside [0, %lld)",
                        m->fqn[0] ? m->fqn : m->name, tg[i], (long long)i, (long long)V);
  double loss;
  WEFT_CHECK(L->impl.forward(L->ctx, logits, t, &loss));
  weft_placement r[WEFT_MESH_MAX_DIMS];
  for (int i = 0; i < s->mesh_ndim; i++) r[i] = weft_replicate();
  int64_t one = 1;
  WEFT_CHECK(nn_ensure(&L->out, m->mesh, WEFT_F32, 1, &one, r));
  float lf = (float)loss;
  WEFT_CHECK(nn_host_put(nn_dev(L->out), nn_f32(L->out), &lf, sizeof lf));
  L->loss = loss;
  L->logits = logits;
  *out = L->out;
  return WEFT_OK;
}

static weft_status loss_backward(weft_module *m, const weft_dtensor *dl0,
                                 const weft_dtensor **din) {
  loss_impl *L = m->impl;
  const weft_dtensor *dl;
  WEFT_CHECK(nn_coerce_grad(m, dl0, weft_dtensor_get_spec(L->out), false, &dl, &L->dl_tmp));
  const weft_dtensor_spec *s = weft_dtensor_get_spec(L->logits);
  WEFT_CHECK(nn_ensure(&L->dlogits, m->mesh, WEFT_F32, s->ndim, s->shape, s->placements));
  float dloss; /* read into this float: no host allocation per step */
  if (nn_dev(dl) == WEFT_CPU)
    dloss = *nn_f32(dl);
  else
    WEFT_CHECK(weft_memcpy(nn_dev(dl), &dloss, nn_f32(dl), sizeof dloss, WEFT_COPY_D2H));
  WEFT_CHECK(L->impl.backward(L->ctx, L->logits, L->targets, (double)dloss, L->dlogits));
  *din = L->dlogits;
  return WEFT_OK;
}

static void loss_destroy(weft_module *m) {
  loss_impl *L = m->impl;
  if (!L) return;
  weft_tensor_destroy(L->targets);
  weft_dtensor_destroy(L->out);
  weft_dtensor_destroy(L->dlogits);
  weft_dtensor_destroy(L->dl_tmp);
  nn_scratch_free(&L->lse);
  nn_scratch_free(&L->rows);
  nn_scratch_free(&L->tl_dev);
  weft_free(L->tl);
  free(L);
}

static const nn_ops loss_ops = {loss_forward, loss_backward, loss_destroy, NULL};

weft_status weft_loss_create(weft_mesh *mesh, const char *name, weft_module **out) {
  if (out) *out = NULL;
  loss_impl *L = calloc(1, sizeof *L);
  if (!L) return weft_error(WEFT_ERR_OOM, "loss");
  L->impl.forward = default_loss_forward;
  L->impl.backward = default_loss_backward;
  L->ctx = L;
  WEFT_CHECK(nn_module_new(mesh, WEFT_MODULE_LOSS, name, &loss_ops, L, out));
  return WEFT_OK;
}

static weft_status check_loss(const weft_module *m) {
  if (!m) return weft_error(WEFT_ERR_INVALID, "loss module is NULL");
  if (m->kind != WEFT_MODULE_LOSS)
    return weft_error(WEFT_ERR_INVALID, "'%s' is a %s, not a loss module", m->fqn,
                      weft_module_kind_name(m->kind));
  return WEFT_OK;
}

weft_status weft_loss_set_targets(weft_module *m, const weft_tensor *targets) {
  WEFT_CHECK(check_loss(m));
  loss_impl *L = m->impl;
  if (m->running) return weft_error(WEFT_ERR_BUSY, "loss '%s' is running", m->fqn);
  if (!targets) {
    L->has_targets = false;
    return WEFT_OK;
  }
  if (targets->dtype != WEFT_I32 || targets->ndim < 1)
    return weft_error(WEFT_ERR_INVALID, "loss '%s': targets must be int32 with >= 1 dims, got %s",
                      m->fqn, weft_dtype_name(targets->dtype));
  if (!L->targets || !weft_tensor_same_shape(L->targets, targets)) {
    weft_tensor_destroy(L->targets);
    L->targets = NULL;
    WEFT_CHECK(weft_tensor_create(WEFT_I32, WEFT_CPU, targets->ndim, targets->shape, &L->targets));
  }
  WEFT_CHECK(weft_tensor_copy(L->targets, targets));
  L->has_targets = true;
  return WEFT_OK;
}

double weft_loss_value(const weft_module *m) {
  if (!m || m->kind != WEFT_MODULE_LOSS) return 0.0;
  return ((const loss_impl *)m->impl)->loss;
}

weft_status weft_loss_set_impl(weft_module *m, const weft_loss_impl *impl, void *ctx) {
  WEFT_CHECK(check_loss(m));
  loss_impl *L = m->impl;
  if (m->running) return weft_error(WEFT_ERR_BUSY, "loss '%s' is running", m->fqn);
  if (impl && (!impl->forward || !impl->backward))
    return weft_error(WEFT_ERR_INVALID, "loss impl needs both forward and backward");
  if (impl) {
    L->impl = *impl;
    L->ctx = ctx;
  } else {
    L->impl.forward = default_loss_forward;
    L->impl.backward = default_loss_backward;
    L->ctx = L;
  }
  m->fwd_pending = false; /* a backward must follow a forward of the new impl */
  return WEFT_OK;
}

/* ==================================================================== Llama */

typedef struct model_impl {
  weft_llama_config cfg;
  weft_module *tok_embeddings, *layers, *norm, *output, *loss;
  weft_dtensor *tokens; /* (B, T) int32 Replicate */
  weft_dtensor *one;    /* [1] = 1, the grad of the loss */
  const weft_dtensor *logits;
  bool with_loss; /* the last forward ran the loss */
} model_impl;

weft_status weft_llama_config_validate(const weft_llama_config *c) {
  if (!c) return weft_error(WEFT_ERR_INVALID, "config is NULL");
  struct {
    const char *n;
    int64_t v;
  } f[] = {{"dim", c->dim},
           {"n_layers", c->n_layers},
           {"n_heads", c->n_heads},
           {"n_kv_heads", c->n_kv_heads},
           {"ffn_dim", c->ffn_dim},
           {"vocab", c->vocab},
           {"max_seq_len", c->max_seq_len}};
  for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
    if (f[i].v < 1)
      return weft_error(WEFT_ERR_INVALID, "llama config: %s = %lld must be >= 1", f[i].n,
                        (long long)f[i].v);
  if (c->dim % c->n_heads)
    return weft_error(WEFT_ERR_INVALID, "llama config: dim %lld is not a multiple of n_heads %lld",
                      (long long)c->dim, (long long)c->n_heads);
  if ((c->dim / c->n_heads) % 2)
    return weft_error(WEFT_ERR_INVALID, "llama config: head dim %lld must be even (RoPE pairs)",
                      (long long)(c->dim / c->n_heads));
  if (c->n_heads % c->n_kv_heads)
    return weft_error(WEFT_ERR_INVALID,
                      "llama config: n_heads %lld is not a multiple of n_kv_heads %lld",
                      (long long)c->n_heads, (long long)c->n_kv_heads);
  if (c->vocab > INT32_MAX)
    return weft_error(WEFT_ERR_INVALID, "llama config: vocab %lld exceeds int32 ids",
                      (long long)c->vocab);
  if (!(c->norm_eps > 0.0f))
    return weft_error(WEFT_ERR_INVALID, "llama config: norm_eps %g must be > 0",
                      (double)c->norm_eps);
  if (!(c->rope_theta > 0.0))
    return weft_error(WEFT_ERR_INVALID, "llama config: rope_theta %g must be > 0", c->rope_theta);
  if (!(c->init_std >= 0.0f))
    return weft_error(WEFT_ERR_INVALID, "llama config: init_std %g must be >= 0",
                      (double)c->init_std);
  return WEFT_OK;
}

static weft_status model_forward(weft_module *m, const weft_dtensor *tok,
                                 const weft_dtensor **out) {
  model_impl *M = m->impl;
  const weft_dtensor *x, *h, *n, *logits;
  WEFT_CHECK(weft_module_forward(M->tok_embeddings, tok, &x));
  WEFT_CHECK(weft_module_forward(M->layers, x, &h));
  WEFT_CHECK(weft_module_forward(M->norm, h, &n));
  WEFT_CHECK(weft_module_forward(M->output, n, &logits));
  M->logits = logits;
  M->with_loss = ((loss_impl *)M->loss->impl)->has_targets;
  if (!M->with_loss) {
    *out = logits;
    return WEFT_OK;
  }
  return weft_module_forward(M->loss, logits, out);
}

static weft_status model_backward(weft_module *m, const weft_dtensor *dy,
                                  const weft_dtensor **din) {
  model_impl *M = m->impl;
  const weft_dtensor *dlogits = dy, *dn, *dh, *dx, *dt;
  if (M->with_loss) WEFT_CHECK(weft_module_backward(M->loss, dy, &dlogits));
  WEFT_CHECK(weft_module_backward(M->output, dlogits, &dn));
  WEFT_CHECK(weft_module_backward(M->norm, dn, &dh));
  WEFT_CHECK(weft_module_backward(M->layers, dh, &dx));
  WEFT_CHECK(weft_module_backward(M->tok_embeddings, dx, &dt));
  *din = NULL;
  return WEFT_OK;
}

static void model_destroy(weft_module *m) {
  model_impl *M = m->impl;
  if (!M) return;
  weft_dtensor_destroy(M->tokens);
  weft_dtensor_destroy(M->one);
  free(M);
}

static const nn_ops model_ops = {model_forward, model_backward, model_destroy, NULL};

weft_status weft_llama_create(const weft_llama_config *cfg, weft_mesh *mesh, weft_module **out) {
  if (out) *out = NULL;
  if (!out) return weft_error(WEFT_ERR_INVALID, "out is NULL");
  WEFT_CHECK(weft_llama_config_validate(cfg));
  model_impl *M = calloc(1, sizeof *M);
  if (!M) return weft_error(WEFT_ERR_OOM, "model");
  M->cfg = *cfg;
  weft_module *m;
  WEFT_CHECK(nn_module_new(mesh, WEFT_MODULE_MODEL, "model", &model_ops, M, &m));
  weft_status st;
  weft_module *c = NULL;
  st = attach_new(
      m, &c, nn_embedding_new(mesh, "tok_embeddings", cfg->vocab, cfg->dim, cfg->init_std, &c));
  if (!st) M->tok_embeddings = c;
  if (!st) st = attach_new(m, &c, weft_sequential_create(mesh, "layers", &c));
  if (!st) M->layers = c;
  for (int64_t i = 0; !st && i < cfg->n_layers; i++) {
    char name[24];
    snprintf(name, sizeof name, "%lld", (long long)i);
    st = attach_new(M->layers, &c, weft_block_create(mesh, name, cfg, &c));
  }
  if (!st) st = attach_new(m, &c, weft_rmsnorm_create(mesh, "norm", cfg->dim, cfg->norm_eps, &c));
  if (!st) M->norm = c;
  if (!st)
    st = attach_new(m, &c, nn_linear_new(mesh, "output", cfg->dim, cfg->vocab, cfg->init_std, &c));
  if (!st) M->output = c;
  if (!st) st = attach_new(m, &c, weft_loss_create(mesh, "loss", &c));
  if (!st) M->loss = c;
  if (st) {
    weft_module_destroy(m);
    return weft_error_trace(st, __func__);
  }
  *out = m;
  return WEFT_OK;
}

static weft_status check_model(const weft_module *m) {
  if (!m) return weft_error(WEFT_ERR_INVALID, "model is NULL");
  if (m->kind != WEFT_MODULE_MODEL)
    return weft_error(WEFT_ERR_INVALID, "'%s' is a %s, not a model from weft_llama_create", m->fqn,
                      weft_module_kind_name(m->kind));
  return WEFT_OK;
}

const weft_llama_config *weft_llama_get_config(const weft_module *m) {
  if (!m || m->kind != WEFT_MODULE_MODEL) return NULL;
  return &((const model_impl *)m->impl)->cfg;
}

const weft_dtensor *weft_llama_logits(const weft_module *m) {
  if (!m || m->kind != WEFT_MODULE_MODEL) return NULL;
  return ((const model_impl *)m->impl)->logits;
}

/* (B, T) int32 with 1 <= T <= max_seq_len and ids in [0, V). */
static weft_status check_ids(const weft_tensor *t, const char *what, const weft_llama_config *c,
                             const weft_tensor *like) {
  if (t->dtype != WEFT_I32 || t->ndim != 2) {
    char d[128];
    weft_tensor_describe(t, d, sizeof d);
    return weft_error(WEFT_ERR_INVALID, "llama: %s must be int32 (B, T), got %s", what, d);
  }
  if (like && !weft_tensor_same_shape(t, like)) {
    char a[128], b[128];
    weft_tensor_describe(t, a, sizeof a);
    weft_tensor_describe(like, b, sizeof b);
    return weft_error(WEFT_ERR_INVALID, "llama: %s %s do not match tokens %s", what, a, b);
  }
  if (t->shape[0] < 1 || t->shape[1] < 1 || t->shape[1] > c->max_seq_len)
    return weft_error(WEFT_ERR_INVALID,
                      "llama: %s shape (%lld, %lld): need B >= 1 and 1 <= T <= max_seq_len %lld",
                      what, (long long)t->shape[0], (long long)t->shape[1],
                      (long long)c->max_seq_len);
  weft_tensor *host = NULL; /* a device tensor's ids, read on the host */
  if (t->device != WEFT_CPU) {
    WEFT_CHECK(weft_tensor_to(t, WEFT_CPU, &host));
    t = host;
  }
  weft_status st = WEFT_OK;
  for (int64_t b = 0; st == WEFT_OK && b < t->shape[0]; b++)
    for (int64_t i = 0; st == WEFT_OK && i < t->shape[1]; i++) {
      int32_t v = *((const int32_t *)t->data + b * t->strides[0] + i * t->strides[1]);
      if (v < 0 || v >= c->vocab)
        st = weft_error(WEFT_ERR_INVALID, "llama: %s[%lld, %lld] = %d is outside [0, %lld)", what,
                        (long long)b, (long long)i, v, (long long)c->vocab);
    }
  weft_tensor_destroy(host);
  return st;
}

weft_status weft_llama_forward(weft_module *model, const weft_tensor *tokens,
                               const weft_tensor *targets, double *loss) {
  WEFT_CHECK(check_model(model));
  model_impl *M = model->impl;
  if (loss) *loss = 0.0;
  if (!tokens) return weft_error(WEFT_ERR_INVALID, "llama: tokens is NULL");
  WEFT_CHECK(check_ids(tokens, "tokens", &M->cfg, NULL));
  if (targets) WEFT_CHECK(check_ids(targets, "targets", &M->cfg, tokens));
  weft_placement r[WEFT_MESH_MAX_DIMS];
  for (int i = 0; i < weft_mesh_ndim(model->mesh); i++) r[i] = weft_replicate();
  WEFT_CHECK(nn_ensure(&M->tokens, model->mesh, WEFT_I32, 2, tokens->shape, r));
  WEFT_CHECK(weft_tensor_copy(weft_dtensor_local(M->tokens), tokens));
  WEFT_CHECK(weft_loss_set_targets(M->loss, targets));
  const weft_dtensor *out;
  WEFT_CHECK(weft_module_forward(model, M->tokens, &out));
  if (loss && M->with_loss) *loss = weft_loss_value(M->loss);
  return WEFT_OK;
}

weft_status weft_llama_backward(weft_module *model) {
  WEFT_CHECK(check_model(model));
  model_impl *M = model->impl;
  if (!model->fwd_pending || !M->with_loss)
    return weft_error(WEFT_ERR_STATE,
                      "llama: backward needs a forward with targets first (one backward per "
                      "forward)");
  weft_placement r[WEFT_MESH_MAX_DIMS];
  for (int i = 0; i < weft_mesh_ndim(model->mesh); i++) r[i] = weft_replicate();
  int64_t one = 1;
  WEFT_CHECK(nn_ensure(&M->one, model->mesh, WEFT_F32, 1, &one, r));
  const float one_f = 1.0f;
  WEFT_CHECK(nn_host_put(nn_dev(M->one), nn_f32(M->one), &one_f, sizeof one_f));
  const weft_dtensor *din;
  return weft_module_backward(model, M->one, &din);
}
