/* nn/layers.c — the leaf layers: Linear, Embedding, RMSNorm. Each computes
 * on local shards with the layers.h kernels and derives its output (and, in
 * backward, its grads') placements per mesh dim from the rules in nn.h. */
#include <stdlib.h>
#include <string.h>

#include "nn_internal.h"

static weft_param_init normal_init(float std) {
  weft_param_init i = {WEFT_INIT_NORMAL, 0.0f, std, 0.0f};
  return i;
}

static void pl_str(weft_placement p, char *b, size_t cap) { weft_placement_describe(p, b, cap); }

/* Rows of a contiguous local tensor whose last dim is `cols` (0 when empty). */
static int64_t rows_of(const weft_dtensor *d, int64_t cols) {
  int64_t n = nn_numel(d);
  return cols ? n / cols : 0;
}

/* =================================================================== Linear */

typedef struct linear_impl {
  int64_t in, out;
  weft_param *w;
  const weft_dtensor *x; /* saved input (owned elsewhere) */
  weft_dtensor_spec xs;  /* its spec at forward */
  weft_placement pw[WEFT_MESH_MAX_DIMS];
  weft_dtensor *y, *dx, *dy_tmp;
  nn_scratch dw;
} linear_impl;

/* Forward rule per mesh dim (x, w -> y), see nn.h. last = x's last dim. */
static weft_status linear_rule(const weft_module *m, const weft_placement *px,
                               const weft_placement *pw, int nd, int last, weft_placement *py) {
  for (int i = 0; i < nd; i++) {
    weft_placement x = px[i], w = pw[i];
    bool ok = true;
    if (nn_is_r(w)) {
      if (nn_is_r(x))
        py[i] = weft_replicate();
      else if (x.kind == WEFT_PLACE_SHARD && x.dim != last)
        py[i] = x;
      else if (nn_is_psum(x))
        py[i] = x;
      else
        ok = false;
    } else if (nn_is_s(w, 0) && nn_is_r(x)) {
      py[i] = weft_shard(last);
    } else if (nn_is_s(w, 1) && nn_is_s(x, last)) {
      py[i] = weft_partial(WEFT_OP_SUM);
    } else {
      ok = false;
    }
    if (ok) continue;
    char a[32], b[32];
    pl_str(x, a, sizeof a);
    pl_str(w, b, sizeof b);
    return nn_unsupported(m, i,
                          "input %s with weight %s is not supported; per mesh dim (input, "
                          "weight -> output): (R, R -> R), (S(r), R -> S(r)) for r not the "
                          "last dim, (P(sum), R -> P(sum)), (R, S(0) -> S(-1)) colwise, "
                          "(S(-1), S(1) -> P(sum)) rowwise",
                          a, b);
  }
  return WEFT_OK;
}

/* Backward rule per mesh dim: with forward placements px, pw and the
 * (coerced) output grad placement g, the placements of dx and dW. */
static void linear_grad_rule(weft_placement px, weft_placement pw, weft_placement g,
                             weft_placement *dx, weft_placement *dw) {
  if (nn_is_r(pw)) {
    if (nn_is_r(px)) { /* y R; g R or P */
      *dx = g;
      *dw = g;
    } else if (nn_is_psum(px)) { /* y P; g R */
      *dx = weft_replicate();
      *dw = weft_partial(WEFT_OP_SUM);
    } else { /* x S(r): rows split; g S(r) */
      *dx = px;
      *dw = weft_partial(WEFT_OP_SUM);
    }
  } else if (nn_is_s(pw, 0)) { /* colwise: g S(last) */
    *dx = weft_partial(WEFT_OP_SUM);
    *dw = pw;
  } else { /* rowwise: x S(last), g R */
    *dx = px;
    *dw = pw;
  }
}

static weft_status linear_forward(weft_module *m, const weft_dtensor *x, const weft_dtensor **out) {
  linear_impl *L = m->impl;
  if (m->nparams > 1)
    return weft_error(WEFT_ERR_UNSUPPORTED,
                      "linear '%s' has a bias: run it in a graph (weft_module_call)", m->fqn);
  for (int i = 0; i < m->params[0]->spec.mesh_ndim; i++)
    if (m->params[0]->spec.placements[i].kind == WEFT_PLACE_STRIDED_SHARD)
      return weft_error(WEFT_ERR_UNSUPPORTED,
                        "linear '%s' has a StridedShard weight (a fused projection): run it in "
                        "a graph (weft_module_call)",
                        m->fqn);
  WEFT_CHECK(nn_check_input(m, x, "input", WEFT_F32, 1));
  const weft_dtensor_spec *xs = weft_dtensor_get_spec(x);
  int last = xs->ndim - 1;
  if (xs->shape[last] != L->in)
    return weft_error(WEFT_ERR_INVALID, "linear '%s': input has %lld features, expected %lld",
                      m->fqn, (long long)xs->shape[last], (long long)L->in);
  const weft_dtensor *w;
  WEFT_CHECK(nn_param_data(m, L->w, &w));
  int nd = xs->mesh_ndim;
  const weft_placement *pw = weft_dtensor_placements(w);
  weft_placement py[WEFT_MESH_MAX_DIMS];
  WEFT_CHECK(linear_rule(m, xs->placements, pw, nd, last, py));
  int64_t yshape[WEFT_MAX_DIMS];
  memcpy(yshape, xs->shape, sizeof(int64_t) * (size_t)xs->ndim);
  yshape[last] = L->out;
  WEFT_CHECK(nn_ensure(&L->y, m->mesh, WEFT_F32, xs->ndim, yshape, py));
  const weft_tensor *xl = weft_dtensor_local(x), *wl = weft_dtensor_local(w),
                    *yl = weft_dtensor_local(L->y);
  int64_t ic = xl->shape[last], oc = wl->shape[0];
  if (wl->shape[1] != ic || yl->shape[last] != oc || rows_of(x, ic) != rows_of(L->y, oc))
    return weft_error(WEFT_ERR_INTERNAL,
                      "linear '%s': local shards disagree (x %lld features, w %lldx%lld, y %lld)",
                      m->fqn, (long long)ic, (long long)wl->shape[0], (long long)wl->shape[1],
                      (long long)yl->shape[last]);
  int64_t n = rows_of(x, ic);
  if (ic == 0) n = rows_of(L->y, oc);
  if (ic == 0)
    WEFT_CHECK(weft_memset(yl->device, yl->data, 0, weft_tensor_nbytes(yl)));
  else
    WEFT_CHECK(
        weft_backend_linear_forward(yl->device, yl->data, xl->data, wl->data, NULL, n, ic, oc));
  L->x = x;
  L->xs = *xs;
  memcpy(L->pw, pw, sizeof(weft_placement) * (size_t)nd);
  *out = L->y;
  return WEFT_OK;
}

static weft_status linear_backward(weft_module *m, const weft_dtensor *dy_in,
                                   const weft_dtensor **din) {
  linear_impl *L = m->impl;
  const weft_dtensor *dy, *w;
  WEFT_CHECK(nn_coerce_grad(m, dy_in, weft_dtensor_get_spec(L->y), true, &dy, &L->dy_tmp));
  WEFT_CHECK(nn_param_data(m, L->w, &w));
  int nd = L->xs.mesh_ndim;
  if (!nn_pl_equal(weft_dtensor_placements(w), L->pw, nd))
    return weft_error(WEFT_ERR_STATE, "linear '%s': weight placements changed since forward",
                      m->fqn);
  const weft_placement *g = weft_dtensor_placements(dy);
  weft_placement pdx[WEFT_MESH_MAX_DIMS], pdw[WEFT_MESH_MAX_DIMS];
  for (int i = 0; i < nd; i++)
    linear_grad_rule(L->xs.placements[i], L->pw[i], g[i], &pdx[i], &pdw[i]);
  WEFT_CHECK(nn_ensure(&L->dx, m->mesh, WEFT_F32, L->xs.ndim, L->xs.shape, pdx));
  const weft_tensor *xl = weft_dtensor_local(L->x), *wl = weft_dtensor_local(w);
  int64_t ic = wl->shape[1], oc = wl->shape[0];
  int64_t n = rows_of(dy, oc);
  if (oc == 0) n = rows_of(L->x, ic);
  if (nn_numel(L->dx) != n * ic)
    return weft_error(WEFT_ERR_INTERNAL, "linear '%s': dx local size %lld != %lld x %lld", m->fqn,
                      (long long)nn_numel(L->dx), (long long)n, (long long)ic);
  /* dx = dy @ w */
  const weft_device dev = nn_dev(dy);
  if (oc == 0)
    WEFT_CHECK(weft_memset(dev, nn_f32(L->dx), 0, (size_t)(n * ic) * sizeof(float)));
  else
    WEFT_CHECK(weft_backend_linear_backward(dev, nn_f32(L->dx), NULL, NULL, nn_f32(dy), xl->data,
                                            wl->data, n, ic, oc, false, false));
  if (L->w->requires_grad) {
    if (nn_pl_equal(pdw, L->pw, nd)) {
      /* the local dW is exact for the weight's placements: accumulate in place */
      weft_dtensor *gr;
      WEFT_CHECK(nn_grad_get(m, L->w, &gr));
      if (n > 0)
        WEFT_CHECK(weft_backend_linear_backward(dev, NULL, nn_f32(gr), NULL, nn_f32(dy), xl->data,
                                                wl->data, n, ic, oc, false, true));
    } else {
      WEFT_CHECK(nn_scratch_reserve(&L->dw, dev, oc * ic));
      if (n > 0)
        WEFT_CHECK(weft_backend_linear_backward(dev, NULL, L->dw.p, NULL, nn_f32(dy), xl->data,
                                                wl->data, n, ic, oc, false, false));
      else
        WEFT_CHECK(weft_memset(dev, L->dw.p, 0, (size_t)(oc * ic) * sizeof(float)));
      WEFT_CHECK(nn_grad_accumulate(m, L->w, L->dw.p, pdw));
    }
  }
  *din = L->dx;
  return WEFT_OK;
}

static void linear_destroy(weft_module *m) {
  linear_impl *L = m->impl;
  if (!L) return;
  weft_dtensor_destroy(L->y);
  weft_dtensor_destroy(L->dx);
  weft_dtensor_destroy(L->dy_tmp);
  nn_scratch_free(&L->dw);
  free(L);
}

static const nn_ops linear_ops = {linear_forward, linear_backward, linear_destroy,
                                  nn_linear_graph_forward};

weft_status nn_linear_new(weft_mesh *mesh, const char *name, int64_t in, int64_t out,
                          float init_std, weft_module **m) {
  if (m) *m = NULL;
  if (in < 1 || out < 1)
    return weft_error(WEFT_ERR_INVALID, "linear '%s': sizes in=%lld out=%lld must be >= 1",
                      name ? name : "?", (long long)in, (long long)out);
  linear_impl *L = calloc(1, sizeof *L);
  if (!L) return weft_error(WEFT_ERR_OOM, "linear");
  L->in = in;
  L->out = out;
  WEFT_CHECK(nn_module_new(mesh, WEFT_MODULE_LINEAR, name, &linear_ops, L, m));
  int64_t shape[2] = {out, in};
  weft_status st = nn_param_add(*m, "weight", 2, shape, normal_init(init_std), &L->w);
  if (st) {
    weft_module_destroy(*m);
    *m = NULL;
    return weft_error_trace(st, __func__);
  }
  return WEFT_OK;
}

weft_status weft_linear_create(weft_mesh *mesh, const char *name, int64_t in_features,
                               int64_t out_features, weft_module **out) {
  WEFT_CHECK(nn_linear_new(mesh, name, in_features, out_features, 0.02f, out));
  return WEFT_OK;
}

/* ================================================================ Embedding */

typedef struct embedding_impl {
  int64_t num, dim;
  weft_param *w;
  const weft_dtensor *tokens;
  weft_placement pw[WEFT_MESH_MAX_DIMS];
  int64_t v0, nv; /* local rows of the table */
  weft_dtensor *y, *dy_tmp;
  nn_scratch dw;
  nn_scratch ids_host; /* device token ids read back for the range check */
} embedding_impl;

static weft_status embedding_forward(weft_module *m, const weft_dtensor *tok,
                                     const weft_dtensor **out) {
  embedding_impl *E = m->impl;
  WEFT_CHECK(nn_check_input(m, tok, "tokens", WEFT_I32, 1));
  const weft_dtensor_spec *ts = weft_dtensor_get_spec(tok);
  int nd = ts->mesh_ndim;
  for (int i = 0; i < nd; i++)
    if (!nn_is_r(ts->placements[i])) {
      char a[32];
      pl_str(ts->placements[i], a, sizeof a);
      return nn_unsupported(m, i, "tokens must be Replicate, got %s", a);
    }
  const weft_dtensor *w;
  WEFT_CHECK(nn_param_data(m, E->w, &w));
  const weft_placement *pw = weft_dtensor_placements(w);
  weft_placement py[WEFT_MESH_MAX_DIMS];
  for (int i = 0; i < nd; i++) {
    if (nn_is_r(pw[i]))
      py[i] = weft_replicate();
    else if (nn_is_s(pw[i], 0))
      py[i] = weft_partial(WEFT_OP_SUM);
    else if (nn_is_s(pw[i], 1))
      py[i] = weft_shard(ts->ndim);
    else {
      char a[32];
      pl_str(pw[i], a, sizeof a);
      return nn_unsupported(m, i,
                            "weight %s is not supported; per mesh dim: R -> output R, S(0) "
                            "(rowwise, vocab range) -> P(sum), S(1) (colwise) -> S(-1)",
                            a);
    }
  }
  const weft_tensor *tl = weft_dtensor_local(tok), *wl = weft_dtensor_local(w);
  int64_t ntok = weft_tensor_numel(tl);
  const int32_t *ids = tl->data, *hids = ids;
  if (tl->device != WEFT_CPU && ntok > 0) {
    /* read back into a host scratch kept across steps (int32 ids in its
     * float slots): the steady state allocates nothing on the host */
    WEFT_CHECK(nn_scratch_reserve(&E->ids_host, WEFT_CPU, ntok));
    WEFT_CHECK(
        weft_memcpy(tl->device, E->ids_host.p, ids, (size_t)ntok * sizeof(int32_t), WEFT_COPY_D2H));
    hids = (const int32_t *)(const void *)E->ids_host.p;
  }
  for (int64_t i = 0; i < ntok; i++)
    if (hids[i] < 0 || hids[i] >= E->num) {
      int32_t bad = hids[i];
      return weft_error(WEFT_ERR_INVALID,
                        "embedding '%s': token %d at flat index %lld is outside [0, %lld)", m->fqn,
                        bad, (long long)i, (long long)E->num);
    }
  int64_t yshape[WEFT_MAX_DIMS];
  memcpy(yshape, ts->shape, sizeof(int64_t) * (size_t)ts->ndim);
  yshape[ts->ndim] = E->dim;
  WEFT_CHECK(nn_ensure(&E->y, m->mesh, WEFT_F32, ts->ndim + 1, yshape, py));
  int64_t off[WEFT_MAX_DIMS];
  if (!weft_dtensor_local_offset(w, off))
    return nn_unsupported(m, 0, "weight shard is not one contiguous box");
  E->nv = wl->shape[0];
  E->v0 = E->nv ? off[0] : 0;
  int64_t c = wl->shape[1];
  if (nn_numel(E->y) != ntok * c)
    return weft_error(WEFT_ERR_INTERNAL, "embedding '%s': local output size", m->fqn);
  WEFT_CHECK(weft_backend_embedding_range_forward(wl->device, nn_f32(E->y), ids, wl->data, ntok,
                                                  E->v0, E->nv, c));
  E->tokens = tok;
  memcpy(E->pw, pw, sizeof(weft_placement) * (size_t)nd);
  *out = E->y;
  return WEFT_OK;
}

static weft_status embedding_backward(weft_module *m, const weft_dtensor *dy_in,
                                      const weft_dtensor **din) {
  embedding_impl *E = m->impl;
  const weft_dtensor *dy, *w;
  WEFT_CHECK(nn_coerce_grad(m, dy_in, weft_dtensor_get_spec(E->y), true, &dy, &E->dy_tmp));
  WEFT_CHECK(nn_param_data(m, E->w, &w));
  int nd = weft_dtensor_get_spec(dy)->mesh_ndim;
  if (!nn_pl_equal(weft_dtensor_placements(w), E->pw, nd))
    return weft_error(WEFT_ERR_STATE, "embedding '%s': weight placements changed since forward",
                      m->fqn);
  *din = NULL; /* tokens have no gradient */
  if (!E->w->requires_grad) return WEFT_OK;
  const weft_placement *g = weft_dtensor_placements(dy);
  weft_placement pdw[WEFT_MESH_MAX_DIMS];
  for (int i = 0; i < nd; i++) pdw[i] = nn_is_r(E->pw[i]) ? g[i] : E->pw[i];
  const weft_tensor *tl = weft_dtensor_local(E->tokens), *wl = weft_dtensor_local(w);
  int64_t ntok = weft_tensor_numel(tl), c = wl->shape[1];
  if (nn_pl_equal(pdw, E->pw, nd)) {
    weft_dtensor *gr;
    WEFT_CHECK(nn_grad_get(m, E->w, &gr));
    WEFT_CHECK(weft_backend_embedding_range_backward(nn_dev(dy), nn_f32(gr), tl->data, nn_f32(dy),
                                                     ntok, E->v0, E->nv, c));
  } else {
    WEFT_CHECK(nn_scratch_reserve(&E->dw, nn_dev(dy), E->nv * c));
    WEFT_CHECK(weft_memset(nn_dev(dy), E->dw.p, 0, (size_t)(E->nv * c) * sizeof(float)));
    WEFT_CHECK(weft_backend_embedding_range_backward(nn_dev(dy), E->dw.p, tl->data, nn_f32(dy),
                                                     ntok, E->v0, E->nv, c));
    WEFT_CHECK(nn_grad_accumulate(m, E->w, E->dw.p, pdw));
  }
  return WEFT_OK;
}

static void embedding_destroy(weft_module *m) {
  embedding_impl *E = m->impl;
  if (!E) return;
  weft_dtensor_destroy(E->y);
  weft_dtensor_destroy(E->dy_tmp);
  nn_scratch_free(&E->dw);
  nn_scratch_free(&E->ids_host);
  free(E);
}

static const nn_ops embedding_ops = {embedding_forward, embedding_backward, embedding_destroy,
                                     nn_embedding_graph_forward};

weft_status nn_embedding_new(weft_mesh *mesh, const char *name, int64_t num, int64_t dim,
                             float init_std, weft_module **m) {
  if (m) *m = NULL;
  if (num < 1 || dim < 1)
    return weft_error(WEFT_ERR_INVALID, "embedding '%s': sizes num=%lld dim=%lld must be >= 1",
                      name ? name : "?", (long long)num, (long long)dim);
  if (num > INT32_MAX)
    return weft_error(WEFT_ERR_INVALID, "embedding '%s': %lld rows exceed int32 token ids",
                      name ? name : "?", (long long)num);
  embedding_impl *E = calloc(1, sizeof *E);
  if (!E) return weft_error(WEFT_ERR_OOM, "embedding");
  E->num = num;
  E->dim = dim;
  WEFT_CHECK(nn_module_new(mesh, WEFT_MODULE_EMBEDDING, name, &embedding_ops, E, m));
  int64_t shape[2] = {num, dim};
  weft_status st = nn_param_add(*m, "weight", 2, shape, normal_init(init_std), &E->w);
  if (st) {
    weft_module_destroy(*m);
    *m = NULL;
    return weft_error_trace(st, __func__);
  }
  return WEFT_OK;
}

weft_status weft_embedding_create(weft_mesh *mesh, const char *name, int64_t num_embeddings,
                                  int64_t dim, weft_module **out) {
  WEFT_CHECK(nn_embedding_new(mesh, name, num_embeddings, dim, 0.02f, out));
  return WEFT_OK;
}

/* ================================================================== RMSNorm */

typedef struct rmsnorm_impl {
  int64_t dim;
  float eps;
  weft_param *w;
  const weft_dtensor *x;
  weft_dtensor_spec xs;
  weft_dtensor *y, *dx, *dy_tmp;
  nn_scratch rstd, dw;
} rmsnorm_impl;

static weft_status rmsnorm_forward(weft_module *m, const weft_dtensor *x,
                                   const weft_dtensor **out) {
  rmsnorm_impl *R = m->impl;
  WEFT_CHECK(nn_check_input(m, x, "input", WEFT_F32, 1));
  const weft_dtensor_spec *xs = weft_dtensor_get_spec(x);
  int last = xs->ndim - 1, nd = xs->mesh_ndim;
  if (xs->shape[last] != R->dim)
    return weft_error(WEFT_ERR_INVALID, "rmsnorm '%s': input has %lld features, expected %lld",
                      m->fqn, (long long)xs->shape[last], (long long)R->dim);
  const weft_dtensor *w;
  WEFT_CHECK(nn_param_data(m, R->w, &w));
  const weft_placement *pw = weft_dtensor_placements(w);
  for (int i = 0; i < nd; i++) {
    weft_placement p = xs->placements[i];
    bool ok = nn_is_r(pw[i]) && (nn_is_r(p) || (p.kind == WEFT_PLACE_SHARD && p.dim != last));
    if (!ok) {
      char a[32], b[32];
      pl_str(p, a, sizeof a);
      pl_str(pw[i], b, sizeof b);
      return nn_unsupported(m, i,
                            "input %s with weight %s is not supported; per mesh dim: (R, R -> R) "
                            "or (S(r), R -> S(r)) with r not the normalised (last) dim",
                            a, b);
    }
  }
  WEFT_CHECK(nn_ensure(&R->y, m->mesh, WEFT_F32, xs->ndim, xs->shape, xs->placements));
  int64_t n = rows_of(x, R->dim);
  WEFT_CHECK(nn_scratch_reserve(&R->rstd, nn_dev(x), n > 0 ? n : 1));
  WEFT_CHECK(weft_backend_rmsnorm_forward(nn_dev(x), nn_f32(R->y), R->rstd.p, nn_f32(x), nn_f32(w),
                                          n, R->dim, R->eps));
  R->x = x;
  R->xs = *xs;
  *out = R->y;
  return WEFT_OK;
}

static weft_status rmsnorm_backward(weft_module *m, const weft_dtensor *dy_in,
                                    const weft_dtensor **din) {
  rmsnorm_impl *R = m->impl;
  const weft_dtensor *dy, *w;
  WEFT_CHECK(nn_coerce_grad(m, dy_in, weft_dtensor_get_spec(R->y), true, &dy, &R->dy_tmp));
  WEFT_CHECK(nn_param_data(m, R->w, &w));
  int nd = R->xs.mesh_ndim;
  const weft_placement *g = weft_dtensor_placements(dy);
  /* dx is linear in dy: it takes dy's placements. dW sums over rows: P
   * where rows are split (x sharded) or where dy is partial. */
  weft_placement pdw[WEFT_MESH_MAX_DIMS];
  for (int i = 0; i < nd; i++)
    pdw[i] = nn_is_r(R->xs.placements[i]) ? g[i] : weft_partial(WEFT_OP_SUM);
  WEFT_CHECK(nn_ensure(&R->dx, m->mesh, WEFT_F32, R->xs.ndim, R->xs.shape, g));
  int64_t n = rows_of(R->x, R->dim), c = R->dim;
  float *dwp;
  bool direct = nn_pl_equal(pdw, weft_dtensor_placements(w), nd);
  if (direct && R->w->requires_grad) {
    weft_dtensor *gr;
    WEFT_CHECK(nn_grad_get(m, R->w, &gr));
    dwp = nn_f32(gr);
  } else {
    WEFT_CHECK(nn_scratch_reserve(&R->dw, nn_dev(dy), c));
    WEFT_CHECK(weft_memset(nn_dev(dy), R->dw.p, 0, (size_t)c * sizeof(float)));
    dwp = R->dw.p;
  }
  WEFT_CHECK(weft_backend_rmsnorm_backward(nn_dev(dy), nn_f32(R->dx), dwp, nn_f32(dy), nn_f32(R->x),
                                           nn_f32(w), R->rstd.p, n, c, false));
  if (!direct && R->w->requires_grad) WEFT_CHECK(nn_grad_accumulate(m, R->w, R->dw.p, pdw));
  *din = R->dx;
  return WEFT_OK;
}

static void rmsnorm_destroy(weft_module *m) {
  rmsnorm_impl *R = m->impl;
  if (!R) return;
  weft_dtensor_destroy(R->y);
  weft_dtensor_destroy(R->dx);
  weft_dtensor_destroy(R->dy_tmp);
  nn_scratch_free(&R->rstd);
  nn_scratch_free(&R->dw);
  free(R);
}

static const nn_ops rmsnorm_ops = {rmsnorm_forward, rmsnorm_backward, rmsnorm_destroy,
                                   nn_rmsnorm_graph_forward};

weft_status weft_rmsnorm_create(weft_mesh *mesh, const char *name, int64_t dim, float eps,
                                weft_module **out) {
  if (out) *out = NULL;
  if (dim < 1 || !(eps > 0.0f))
    return weft_error(WEFT_ERR_INVALID, "rmsnorm '%s': dim=%lld must be >= 1 and eps=%g > 0",
                      name ? name : "?", (long long)dim, (double)eps);
  rmsnorm_impl *R = calloc(1, sizeof *R);
  if (!R) return weft_error(WEFT_ERR_OOM, "rmsnorm");
  R->dim = dim;
  R->eps = eps;
  WEFT_CHECK(nn_module_new(mesh, WEFT_MODULE_RMSNORM, name, &rmsnorm_ops, R, out));
  int64_t shape[1] = {dim};
  weft_param_init ones = {WEFT_INIT_CONSTANT, 0.0f, 0.0f, 1.0f};
  weft_status st = nn_param_add(*out, "weight", 1, shape, ones, &R->w);
  if (st) {
    weft_module_destroy(*out);
    *out = NULL;
    return weft_error_trace(st, __func__);
  }
  return WEFT_OK;
}

float nn_rmsnorm_eps(const weft_module *m) { return ((const rmsnorm_impl *)m->impl)->eps; }
