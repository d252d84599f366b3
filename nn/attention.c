/* nn/attention.c — the composite layers of a block: Attention (wq, wk, wv,
 * RoPE, causal grouped-query attention on the local heads, wo) and the
 * SwiGLU FeedForward (w1, w3, silu gate, w2). Children run through
 * weft_module_forward/_backward, so their hooks fire. */
#include <stdlib.h>
#include <string.h>

#include "nn_internal.h"

/* ================================================================ Attention */

typedef struct attention_impl {
  int64_t dim, H, Hkv, hd, max_seq;
  weft_module *wq, *wk, *wv, *wo;
  nn_scratch cosb, sinb; /* RoPE tables (max_seq, hd/2) */
  /* forward state */
  const weft_dtensor *v; /* wv's output */
  weft_dtensor *q, *k;   /* q, k after RoPE: (B, T, Hl*hd), (B, T, Hkvl*hd) */
  weft_dtensor *att;     /* (B, T, H*hd) with q's placements */
  nn_scratch lse, scratch;
  int64_t B, T, Hl, Hkvl;
  /* backward state */
  weft_dtensor *dq, *dk, *dv, *dx, *datt_tmp, *add_tmp[2];
} attention_impl;

static weft_status head_geometry(const weft_module *m, const attention_impl *A,
                                 const weft_dtensor *t, const char *what, int64_t *nheads,
                                 int64_t *h0) {
  int64_t off[WEFT_MAX_DIMS];
  if (!weft_dtensor_local_offset(t, off))
    return weft_error(WEFT_ERR_UNSUPPORTED, "attention '%s': %s shard is not contiguous", m->fqn,
                      what);
  const weft_tensor *l = weft_dtensor_local(t);
  int64_t f = l->shape[2];
  if (f % A->hd != 0 || (f > 0 && off[2] % A->hd != 0))
    return weft_error(WEFT_ERR_UNSUPPORTED,
                      "attention '%s': the local %s features [%lld, %lld) split a head of "
                      "dim %lld (shard heads, not head dims: tp must divide the head counts)",
                      m->fqn, what, (long long)(f ? off[2] : 0), (long long)((f ? off[2] : 0) + f),
                      (long long)A->hd);
  *nheads = f / A->hd;
  *h0 = f ? off[2] / A->hd : 0;
  return WEFT_OK;
}

static weft_status attention_forward(weft_module *m, const weft_dtensor *x,
                                     const weft_dtensor **out) {
  attention_impl *A = m->impl;
  WEFT_CHECK(nn_check_input(m, x, "input", WEFT_F32, 3));
  const weft_dtensor_spec *xs = weft_dtensor_get_spec(x);
  if (xs->ndim != 3 || xs->shape[2] != A->dim)
    return weft_error(WEFT_ERR_INVALID, "attention '%s': input must be (B, T, %lld)", m->fqn,
                      (long long)A->dim);
  int64_t B = xs->shape[0], T = xs->shape[1];
  if (T > A->max_seq)
    return weft_error(WEFT_ERR_INVALID, "attention '%s': sequence length %lld > max_seq_len %lld",
                      m->fqn, (long long)T, (long long)A->max_seq);
  const weft_dtensor *q0, *k0, *v0;
  WEFT_CHECK(weft_module_forward(A->wq, x, &q0));
  WEFT_CHECK(weft_module_forward(A->wk, x, &k0));
  WEFT_CHECK(weft_module_forward(A->wv, x, &v0));
  const weft_placement *pq = weft_dtensor_placements(q0), *pk = weft_dtensor_placements(k0),
                       *pv = weft_dtensor_placements(v0);
  int nd = xs->mesh_ndim;
  for (int i = 0; i < nd; i++) {
    bool all_r = nn_is_r(pq[i]) && nn_is_r(pk[i]) && nn_is_r(pv[i]);
    bool all_s = nn_is_s(pq[i], 2) && nn_is_s(pk[i], 2) && nn_is_s(pv[i], 2);
    if (!all_r && !all_s) {
      char a[32], b[32], c[32];
      weft_placement_describe(pq[i], a, sizeof a);
      weft_placement_describe(pk[i], b, sizeof b);
      weft_placement_describe(pv[i], c, sizeof c);
      return nn_unsupported(m, i,
                            "q %s, k %s, v %s: q, k and v must all be R or all S(-1) (heads "
                            "split); the sequence and batch must be whole (redistribute a "
                            "sequence-sharded input to Replicate before attention)",
                            a, b, c);
    }
  }
  int64_t Hl, h0, Hkvl, k0h, Hvl, v0h;
  WEFT_CHECK(head_geometry(m, A, q0, "q", &Hl, &h0));
  WEFT_CHECK(head_geometry(m, A, k0, "k", &Hkvl, &k0h));
  WEFT_CHECK(head_geometry(m, A, v0, "v", &Hvl, &v0h));
  int64_t g = A->H / A->Hkv;
  if (Hvl != Hkvl || v0h != k0h || Hl != Hkvl * g || (Hl > 0 && h0 != k0h * g))
    return weft_error(WEFT_ERR_UNSUPPORTED,
                      "attention '%s': local query heads [%lld, %lld) do not match local kv "
                      "heads [%lld, %lld) (group size %lld; v [%lld, %lld)): shard q heads and "
                      "kv heads alike",
                      m->fqn, (long long)h0, (long long)(h0 + Hl), (long long)k0h,
                      (long long)(k0h + Hkvl), (long long)g, (long long)v0h,
                      (long long)(v0h + Hvl));
  const weft_dtensor_spec *qs = weft_dtensor_get_spec(q0), *ks = weft_dtensor_get_spec(k0);
  WEFT_CHECK(nn_ensure(&A->q, m->mesh, WEFT_F32, 3, qs->shape, qs->placements));
  WEFT_CHECK(nn_ensure(&A->k, m->mesh, WEFT_F32, 3, ks->shape, ks->placements));
  WEFT_CHECK(nn_ensure(&A->att, m->mesh, WEFT_F32, 3, qs->shape, qs->placements));
  WEFT_CHECK(weft_backend_rope_forward(nn_dev(q0), nn_f32(A->q), nn_f32(q0), A->cosb.p, A->sinb.p,
                                       A->max_seq, B, T, Hl, A->hd, 0));
  WEFT_CHECK(weft_backend_rope_forward(nn_dev(k0), nn_f32(A->k), nn_f32(k0), A->cosb.p, A->sinb.p,
                                       A->max_seq, B, T, Hkvl, A->hd, 0));
  WEFT_CHECK(nn_scratch_reserve(&A->lse, nn_dev(q0), B * Hl * T > 0 ? B * Hl * T : 1));
  size_t sbytes = weft_backend_attention_scratch_bytes(nn_dev(q0), B, T, Hl, Hkvl, A->hd);
  WEFT_CHECK(nn_scratch_reserve(&A->scratch, nn_dev(q0),
                                (int64_t)((sbytes + sizeof(float) - 1) / sizeof(float))));
  if (Hl > 0)
    WEFT_CHECK(weft_backend_attention_forward(nn_dev(q0), nn_f32(A->att), A->lse.p, nn_f32(A->q),
                                              nn_f32(A->k), nn_f32(v0), B, T, Hl, Hkvl, A->hd, true,
                                              A->scratch.p));
  A->v = v0;
  A->B = B;
  A->T = T;
  A->Hl = Hl;
  A->Hkvl = Hkvl;
  return weft_module_forward(A->wo, A->att, out);
}

static weft_status attention_backward(weft_module *m, const weft_dtensor *dy,
                                      const weft_dtensor **din) {
  attention_impl *A = m->impl;
  const weft_dtensor *datt0, *datt;
  WEFT_CHECK(weft_module_backward(A->wo, dy, &datt0));
  WEFT_CHECK(nn_coerce_grad(m, datt0, weft_dtensor_get_spec(A->att), true, &datt, &A->datt_tmp));
  const weft_placement *g = weft_dtensor_placements(datt);
  const weft_dtensor_spec *qs = weft_dtensor_get_spec(A->q), *ks = weft_dtensor_get_spec(A->k);
  WEFT_CHECK(nn_ensure(&A->dq, m->mesh, WEFT_F32, 3, qs->shape, g));
  WEFT_CHECK(nn_ensure(&A->dk, m->mesh, WEFT_F32, 3, ks->shape, g));
  WEFT_CHECK(nn_ensure(&A->dv, m->mesh, WEFT_F32, 3, ks->shape, g));
  if (A->Hl > 0) {
    WEFT_CHECK(weft_backend_attention_backward(
        nn_dev(datt), nn_f32(A->dq), nn_f32(A->dk), nn_f32(A->dv), nn_f32(datt), nn_f32(A->q),
        nn_f32(A->k), nn_f32(A->v), A->lse.p, nn_f32(A->att), A->B, A->T, A->Hl, A->Hkvl, A->hd,
        true, A->scratch.p));
    WEFT_CHECK(weft_backend_rope_backward(nn_dev(A->dq), nn_f32(A->dq), nn_f32(A->dq), A->cosb.p,
                                          A->sinb.p, A->max_seq, A->B, A->T, A->Hl, A->hd, 0));
    WEFT_CHECK(weft_backend_rope_backward(nn_dev(A->dk), nn_f32(A->dk), nn_f32(A->dk), A->cosb.p,
                                          A->sinb.p, A->max_seq, A->B, A->T, A->Hkvl, A->hd, 0));
  }
  const weft_dtensor *dxq, *dxk, *dxv;
  WEFT_CHECK(weft_module_backward(A->wq, A->dq, &dxq));
  WEFT_CHECK(weft_module_backward(A->wk, A->dk, &dxk));
  WEFT_CHECK(weft_module_backward(A->wv, A->dv, &dxv));
  const weft_dtensor_spec *s = weft_dtensor_get_spec(dxq);
  WEFT_CHECK(nn_ensure(&A->dx, m->mesh, WEFT_F32, s->ndim, s->shape, s->placements));
  WEFT_CHECK(nn_add(A->dx, dxq, dxk, &A->add_tmp[0]));
  WEFT_CHECK(nn_add(A->dx, A->dx, dxv, &A->add_tmp[1]));
  *din = A->dx;
  return WEFT_OK;
}

static void attention_destroy(weft_module *m) {
  attention_impl *A = m->impl;
  if (!A) return;
  nn_scratch_free(&A->cosb);
  nn_scratch_free(&A->sinb);
  nn_scratch_free(&A->lse);
  nn_scratch_free(&A->scratch);
  weft_dtensor *d[] = {A->q,  A->k,  A->att,      A->dq,         A->dk,
                       A->dv, A->dx, A->datt_tmp, A->add_tmp[0], A->add_tmp[1]};
  for (size_t i = 0; i < sizeof d / sizeof d[0]; i++) weft_dtensor_destroy(d[i]);
  free(A);
}

static const nn_ops attention_ops = {attention_forward, attention_backward, attention_destroy,
                                     NULL};

/* A Linear child (no bias) of a module: name, in -> out features, and the
 * impl field that keeps it. */
typedef struct linear_child {
  const char *n;
  int64_t in, out;
  weft_module **slot;
} linear_child;

/* Creates the n Linear children in order and attaches them to m, setting
 * each slot (attention's wq/wk/wv/wo, feed-forward's w1/w2/w3). On error the
 * child being created is freed; those already attached stay owned by m. */
static weft_status attach_linears(weft_module *m, weft_mesh *mesh, const linear_child *lin, int n,
                                  float init_std) {
  for (int i = 0; i < n; i++) {
    weft_module *c;
    WEFT_CHECK(nn_linear_new(mesh, lin[i].n, lin[i].in, lin[i].out, init_std, &c));
    weft_status st = nn_module_attach(m, c);
    if (st) {
      weft_module_destroy(c);
      return st;
    }
    *lin[i].slot = c;
  }
  return WEFT_OK;
}

weft_status weft_attention_create(weft_mesh *mesh, const char *name, const weft_llama_config *cfg,
                                  weft_module **out) {
  if (out) *out = NULL;
  if (!cfg) return weft_error(WEFT_ERR_INVALID, "cfg is NULL");
  WEFT_CHECK(weft_llama_config_validate(cfg));
  attention_impl *A = calloc(1, sizeof *A);
  if (!A) return weft_error(WEFT_ERR_OOM, "attention");
  A->dim = cfg->dim;
  A->H = cfg->n_heads;
  A->Hkv = cfg->n_kv_heads;
  A->hd = cfg->dim / cfg->n_heads;
  A->max_seq = cfg->max_seq_len;
  weft_module *m;
  WEFT_CHECK(nn_module_new(mesh, WEFT_MODULE_ATTENTION, name, &attention_ops, A, &m));
  weft_status st;
  int64_t half = A->max_seq * (A->hd / 2);
  weft_device dev = weft_mesh_device(mesh); /* the tables live where the model computes */
  WEFT_CHECK_GOTO(nn_scratch_reserve(&A->cosb, dev, half), st, fail);
  WEFT_CHECK_GOTO(nn_scratch_reserve(&A->sinb, dev, half), st, fail);
  WEFT_CHECK_GOTO(
      weft_backend_rope_tables(dev, A->cosb.p, A->sinb.p, A->max_seq, A->hd, cfg->rope_theta), st,
      fail);
  const linear_child lin[4] = {{"wq", A->dim, A->H * A->hd, &A->wq},
                               {"wk", A->dim, A->Hkv * A->hd, &A->wk},
                               {"wv", A->dim, A->Hkv * A->hd, &A->wv},
                               {"wo", A->H * A->hd, A->dim, &A->wo}};
  WEFT_CHECK_GOTO(attach_linears(m, mesh, lin, 4, cfg->init_std), st, fail);
  *out = m;
  return WEFT_OK;
fail:
  weft_module_destroy(m);
  return st;
}

/* ============================================================== FeedForward */

typedef struct ff_impl {
  int64_t dim, ffn;
  weft_module *w1, *w2, *w3;
  const weft_dtensor *a, *b; /* w1(x), w3(x) */
  weft_dtensor *g;           /* silu(a) * b */
  weft_dtensor *da, *db, *dx, *dg_tmp, *add_tmp;
} ff_impl;

static weft_status ff_forward(weft_module *m, const weft_dtensor *x, const weft_dtensor **out) {
  ff_impl *F = m->impl;
  WEFT_CHECK(nn_check_input(m, x, "input", WEFT_F32, 1));
  const weft_dtensor *a, *b;
  WEFT_CHECK(weft_module_forward(F->w1, x, &a));
  WEFT_CHECK(weft_module_forward(F->w3, x, &b));
  const weft_dtensor_spec *as = weft_dtensor_get_spec(a), *bs = weft_dtensor_get_spec(b);
  if (!weft_dtensor_spec_equal(as, bs)) {
    char p[256], q[256];
    weft_dtensor_spec_describe(as, p, sizeof p);
    weft_dtensor_spec_describe(bs, q, sizeof q);
    return weft_error(WEFT_ERR_UNSUPPORTED,
                      "feed_forward '%s': w1(x) is %s but w3(x) is %s; the gate needs the same "
                      "placements (shard w1 and w3 alike)",
                      m->fqn, p, q);
  }
  WEFT_CHECK(nn_ensure(&F->g, m->mesh, WEFT_F32, as->ndim, as->shape, as->placements));
  WEFT_CHECK(
      weft_backend_swiglu_forward(nn_dev(a), nn_f32(F->g), nn_f32(a), nn_f32(b), nn_numel(a)));
  F->a = a;
  F->b = b;
  return weft_module_forward(F->w2, F->g, out);
}

static weft_status ff_backward(weft_module *m, const weft_dtensor *dy, const weft_dtensor **din) {
  ff_impl *F = m->impl;
  const weft_dtensor *dg0, *dg;
  WEFT_CHECK(weft_module_backward(F->w2, dy, &dg0));
  WEFT_CHECK(nn_coerce_grad(m, dg0, weft_dtensor_get_spec(F->g), true, &dg, &F->dg_tmp));
  const weft_dtensor_spec *gs = weft_dtensor_get_spec(dg);
  WEFT_CHECK(nn_ensure(&F->da, m->mesh, WEFT_F32, gs->ndim, gs->shape, gs->placements));
  WEFT_CHECK(nn_ensure(&F->db, m->mesh, WEFT_F32, gs->ndim, gs->shape, gs->placements));
  WEFT_CHECK(weft_backend_swiglu_backward(nn_dev(dg), nn_f32(F->da), nn_f32(F->db), nn_f32(dg),
                                          nn_f32(F->a), nn_f32(F->b), nn_numel(F->a)));
  const weft_dtensor *dx1, *dx3;
  WEFT_CHECK(weft_module_backward(F->w1, F->da, &dx1));
  WEFT_CHECK(weft_module_backward(F->w3, F->db, &dx3));
  const weft_dtensor_spec *s = weft_dtensor_get_spec(dx1);
  WEFT_CHECK(nn_ensure(&F->dx, m->mesh, WEFT_F32, s->ndim, s->shape, s->placements));
  WEFT_CHECK(nn_add(F->dx, dx1, dx3, &F->add_tmp));
  *din = F->dx;
  return WEFT_OK;
}

static void ff_destroy(weft_module *m) {
  ff_impl *F = m->impl;
  if (!F) return;
  weft_dtensor *d[] = {F->g, F->da, F->db, F->dx, F->dg_tmp, F->add_tmp};
  for (size_t i = 0; i < sizeof d / sizeof d[0]; i++) weft_dtensor_destroy(d[i]);
  free(F);
}

static const nn_ops ff_ops = {ff_forward, ff_backward, ff_destroy, NULL};

weft_status nn_feed_forward_new(weft_mesh *mesh, const char *name, int64_t dim, int64_t ffn,
                                float init_std, weft_module **out) {
  if (out) *out = NULL;
  if (dim < 1 || ffn < 1)
    return weft_error(WEFT_ERR_INVALID, "feed_forward '%s': dim=%lld ffn_dim=%lld must be >= 1",
                      name ? name : "?", (long long)dim, (long long)ffn);
  ff_impl *F = calloc(1, sizeof *F);
  if (!F) return weft_error(WEFT_ERR_OOM, "feed_forward");
  F->dim = dim;
  F->ffn = ffn;
  weft_module *m;
  WEFT_CHECK(nn_module_new(mesh, WEFT_MODULE_FEED_FORWARD, name, &ff_ops, F, &m));
  const linear_child lin[3] = {
      {"w1", dim, ffn, &F->w1}, {"w2", ffn, dim, &F->w2}, {"w3", dim, ffn, &F->w3}};
  weft_status st = attach_linears(m, mesh, lin, 3, init_std);
  if (st) {
    weft_module_destroy(m);
    return weft_error_trace(st, __func__);
  }
  *out = m;
  return WEFT_OK;
}

weft_status weft_feed_forward_create(weft_mesh *mesh, const char *name, int64_t dim,
                                     int64_t ffn_dim, weft_module **out) {
  WEFT_CHECK(nn_feed_forward_new(mesh, name, dim, ffn_dim, 0.02f, out));
  return WEFT_OK;
}
