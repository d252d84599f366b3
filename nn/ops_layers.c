/* nn/ops_layers.c — the layer ops of autograd.h: embedding, RMSNorm and
 * LayerNorm, pointwise activations (gelu, silu, relu), swiglu, softmax,
 * rotary embedding, scaled dot-product attention, cross-entropy and
 * dropout: forward next to backward, sharding rules per mesh dim.
 *
 * They follow the pattern of nn/ops_linear.c:
 *   1. nn_check_vars, shape checks (nn_op_error names the op and inputs);
 *   2. the options per mesh dim and nn_choose;
 *   3. nn_graph_bring each input to its target, nn_graph_tensor the
 *      output (and what the backward needs: row statistics, rope tables,
 *      the attention's log-sum-exp, dropout's uniforms) with the chosen
 *      placements, compute on local shards through the backend;
 *   4. nn_node_new with the inputs as used (NULL when nothing needs grad),
 *      redistributed inputs, saved[] for graph buffers the backward reads,
 *      nn_var_new for the output;
 *   5. the backward derives each input grad's placements from the
 *      placements the forward used and the output grad's.
 *
 * Rules per mesh dim (inputs -> output; grads):
 *   embedding   ids R with w R -> R; w S(0) -> P(sum) (vocab range: rows
 *               of other ranks give 0); w S(1) -> S(last); ids S(r) with
 *               w R -> S(r). dW: S(0) / S(1) as w; for w R: P(sum) where
 *               dy is P or rows are split (ids S(r)), else R.
 *   rms_norm,   x R or S(r) for r not the last dim (sequence parallel),
 *   layer_norm  weight and bias R -> y like x. dx like dy; dW, db P(sum)
 *               where x is S(r) or dy is P, else R. A P(sum) x or a shard
 *               of the last dim is redistributed first.
 *   gelu, silu, x R, S(d) or x's own strided shard -> y like x (P(sum) is
 *   relu,       reduced first: the op is not linear). dx like dy.
 *   swiglu      a and b alike (R, S(d), a's strided shard); da, db like dy.
 *   softmax     x R or S(d) for d not the last dim; dx like dy.
 *   rope        x (B, T, NH, hd) R, S(0) or S(2) (T and hd whole); dx
 *               like dy. The cos/sin tables of positions [0, pos0 + T)
 *               are a graph buffer made at each call.
 *   sdpa        q, k, v all R, all S(0), or all S(2) when the mesh dim's
 *               size divides Hkv (each rank holds whole kv groups). dq,
 *               dk, dv like dy. lse (B, H, T) is a graph buffer kept for
 *               backward; the kernel's scratch one that forward and
 *               backward each take from the pool and give back.
 *   cross_      logits R (plain), S(r) for r not last (rows split: the
 *   entropy     local loss sum is all-reduced), S(last) (loss parallel:
 *               the row max, target logit and sum of exponentials are
 *               all-reduced over the vocab-sharded mesh dims) -> a (1)
 *               Replicate loss. dlogits like logits.
 *   dropout     any placements (the mask depends on global indices only,
 *               so a P(sum) input works as is); dx like dy.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "autograd_internal.h"

static void all_r(int k, weft_placement *p) {
  for (int i = 0; i < k; i++) p[i] = nn_r();
}

static bool any_psum(const weft_placement *p, int k) {
  for (int i = 0; i < k; i++)
    if (nn_is_psum(p[i])) return true;
  return false;
}

/* A graph buffer of x's leading dims (x (..., C) -> (...)) whose local
 * box is x's rows: x's placements with shards of the last dim as R. A 1-D
 * x gives shape (1). */
static weft_status row_buffer(weft_graph *g, const weft_dtensor *x, weft_dtype dtype,
                              weft_dtensor **out) {
  const weft_dtensor_spec *s = weft_dtensor_get_spec(x);
  int last = s->ndim - 1;
  weft_placement p[WEFT_MESH_MAX_DIMS];
  for (int i = 0; i < s->mesh_ndim; i++)
    p[i] = nn_is_shard_any(s->placements[i]) && s->placements[i].dim == last ? nn_r()
                                                                             : s->placements[i];
  int64_t one = 1;
  if (last == 0) {
    all_r(s->mesh_ndim, p);
    return nn_graph_tensor(g, weft_dtensor_mesh(x), dtype, 1, &one, p, out);
  }
  return nn_graph_tensor(g, weft_dtensor_mesh(x), dtype, last, s->shape, p, out);
}

/* A 1-D f32 Replicate graph buffer of at least `floats` floats (>= 1). */
static weft_status flat_buffer_of(weft_graph *g, weft_mesh *mesh, weft_dtype dt, int64_t count,
                                  weft_dtensor **out) {
  weft_placement p[WEFT_MESH_MAX_DIMS];
  all_r(weft_mesh_ndim(mesh), p);
  int64_t n = count > 0 ? count : 1;
  return nn_graph_tensor(g, mesh, dt, 1, &n, p, out);
}

static weft_status flat_buffer(weft_graph *g, weft_mesh *mesh, int64_t floats, weft_dtensor **out) {
  return flat_buffer_of(g, mesh, WEFT_F32, floats, out);
}

/* Options for an op that keeps one input's placements (pointwise or
 * row-wise): R, S(d) for d < dlim, and the input's own strided shard of
 * such a dim. nin inputs take the same placement. */
static int keep_options(weft_sharding_option *o, int nin, int dlim, weft_placement own) {
  int c = 0;
  weft_sharding_option r;
  memset(&r, 0, sizeof r);
  for (int j = 0; j < nin; j++) r.in[j] = nn_r();
  r.out = nn_r();
  o[c++] = r;
  for (int d = 0; d < dlim && c < NN_OPT_CAP - 1; d++) {
    weft_sharding_option s = r;
    for (int j = 0; j < nin; j++) s.in[j] = nn_s(d);
    s.out = nn_s(d);
    o[c++] = s;
  }
  if (own.kind == WEFT_PLACE_STRIDED_SHARD && own.dim < dlim) {
    weft_sharding_option s = r;
    for (int j = 0; j < nin; j++) s.in[j] = own;
    s.out = own;
    o[c++] = s;
  }
  return c;
}

/* -------------------------------------------------------------- embedding */

static weft_status embedding_backward(nn_node *n, const weft_dtensor *const *dout,
                                      weft_dtensor **din) {
  if (!nn_node_wants(n, 1)) return WEFT_OK;
  weft_graph *g = nn_node_graph(n);
  const weft_dtensor *dy = dout[0], *ids = nn_node_input(n, 0), *w = nn_node_input(n, 1);
  const weft_placement *W = weft_dtensor_placements(w), *D = weft_dtensor_placements(dy),
                       *I = weft_dtensor_placements(ids);
  int k = weft_mesh_ndim(weft_dtensor_mesh(w));
  weft_placement p[WEFT_MESH_MAX_DIMS];
  for (int i = 0; i < k; i++) {
    if (nn_is_shard_any(W[i]))
      p[i] = W[i];
    else if (nn_is_psum(D[i]) || nn_is_shard_any(I[i]))
      p[i] = nn_psum();
    else
      p[i] = nn_r();
  }
  weft_dtensor *dw;
  WEFT_CHECK(nn_graph_zeros(g, weft_dtensor_mesh(w), WEFT_F32, 2, weft_dtensor_shape(w), p, &dw));
  const weft_tensor *wl = nn_local(w), *il = nn_local(ids), *dl = nn_local(dy);
  int64_t off[WEFT_MAX_DIMS] = {0};
  weft_dtensor_local_offset(w, off);
  int64_t nv = wl->shape[0], c = wl->shape[1], ntok = weft_tensor_numel(il);
  if (ntok > 0 && nv > 0 && c > 0)
    WEFT_CHECK(weft_backend_embedding_range_backward_dt(dl->device, dl->dtype, nn_f32(dw), il->data,
                                                        dl->data, ntok, off[0], nv, c));
  /* summed in f32; a 16-bit weight's grad is that sum rounded once, as
   * where the op ran widened */
  if (wl->dtype != WEFT_F32) {
    weft_dtensor *low;
    WEFT_CHECK(nn_graph_converted(g, dw, wl->dtype, &low));
    nn_graph_discard(g, dw);
    dw = low;
  }
  din[1] = dw;
  return WEFT_OK;
}

static weft_status embedding_body(weft_var *ids, weft_var *w, weft_var **out) {
  const char *name = "embedding";
  if (!out) return weft_error(WEFT_ERR_INVALID, "embedding: out is NULL");
  *out = NULL;
  weft_var *in[2] = {ids, w};
  weft_graph *g;
  WEFT_CHECK(nn_check_vars(name, in, 2, &g));
  const weft_dtensor *iv = nn_var_now(ids), *wv = nn_var_now(w);
  const weft_dtensor_spec *is = weft_dtensor_get_spec(iv), *ws = weft_dtensor_get_spec(wv);
  if (is->dtype != WEFT_I32)
    return nn_op_error(WEFT_ERR_INVALID, name, in, 2, "ids are %s (int32 needed)",
                       weft_dtype_name(is->dtype));
  if (!weft_tensor_is_contiguous(nn_local(iv)))
    return nn_op_error(WEFT_ERR_INVALID, name, in, 2, "ids: local tensor not contiguous");
  WEFT_CHECK(nn_check_kernel_contig(name, in, 2, wv, "weight", WEFT_KERNEL_EMBEDDING));
  if (ws->ndim != 2 || is->ndim < 1 || is->ndim + 1 > WEFT_MAX_DIMS)
    return nn_op_error(WEFT_ERR_INVALID, name, in, 2,
                       "need ids (...) with at least one dim and weight (V, D)");
  int64_t V = ws->shape[0];
  /* ids are checked where they are (every rank holds the same ids when
   * they are Replicate, so every rank reports the same error) */
  {
    const weft_tensor *il = nn_local(iv);
    int64_t nt = weft_tensor_numel(il);
    const void *h;
    void *tmp;
    WEFT_CHECK(nn_host_get(il->device, il->data, (size_t)nt * sizeof(int32_t), &h, &tmp));
    const int32_t *t = h;
    for (int64_t i = 0; i < nt; i++)
      if (t[i] < 0 || t[i] >= V) {
        int32_t bad = t[i];
        weft_free(tmp);
        return nn_op_error(WEFT_ERR_INVALID, name, in, 2,
                           "id %d at flat index %lld is outside [0, %lld)", bad, (long long)i,
                           (long long)V);
      }
    weft_free(tmp);
  }
  int k = ws->mesh_ndim, nd = is->ndim;
  weft_sharding_option opts[WEFT_MESH_MAX_DIMS * NN_OPT_CAP];
  int nopt[WEFT_MESH_MAX_DIMS];
  for (int i = 0; i < k; i++) {
    weft_sharding_option *o = &opts[i * NN_OPT_CAP];
    int c = 0;
    o[c++] = (weft_sharding_option){{nn_r(), nn_r()}, nn_r()};
    o[c++] = (weft_sharding_option){{nn_r(), nn_s(0)}, nn_psum()};
    o[c++] = (weft_sharding_option){{nn_r(), nn_s(1)}, nn_s(nd)};
    for (int r = 0; r < nd; r++) o[c++] = (weft_sharding_option){{nn_s(r), nn_r()}, nn_s(r)};
    nopt[i] = c;
  }
  weft_placement tgt[2 * WEFT_MESH_MAX_DIMS], opl[WEFT_MESH_MAX_DIMS];
  WEFT_CHECK(nn_choose(name, in, 2, opts, NN_OPT_CAP, nopt, false, tgt, opl));
  const weft_dtensor *iu, *wu;
  WEFT_CHECK(nn_graph_bring(g, iv, tgt, false, &iu));
  WEFT_CHECK(nn_graph_bring(g, wv, tgt + k, false, &wu));
  int64_t oshape[WEFT_MAX_DIMS];
  memcpy(oshape, is->shape, sizeof(int64_t) * (size_t)nd);
  oshape[nd] = ws->shape[1];
  weft_dtensor *y;
  WEFT_CHECK(nn_graph_tensor(g, weft_dtensor_mesh(wv), ws->dtype, nd + 1, oshape, opl, &y));
  const weft_tensor *il = nn_local(iu), *wl = nn_local(wu);
  int64_t off[WEFT_MAX_DIMS] = {0};
  if (!weft_dtensor_local_offset(wu, off))
    return nn_op_error(WEFT_ERR_UNSUPPORTED, name, in, 2, "weight shard is not one box");
  int64_t nv = wl->shape[0], c = wl->shape[1], ntok = weft_tensor_numel(il);
  if (ntok > 0 && c > 0)
    WEFT_CHECK(weft_backend_embedding_range_forward_dt(wl->device, wl->dtype, nn_local(y)->data,
                                                       il->data, wl->data, ntok, nv ? off[0] : 0,
                                                       nv, c));
  nn_node *node;
  WEFT_CHECK(nn_node_new(g, name, in, 2, (const weft_dtensor *const[]){iu, wu}, embedding_backward,
                         &node));
  WEFT_CHECK(nn_var_new(g, y, node, out));
  return WEFT_OK;
}

/* ------------------------------------------------------ rms_norm, layer_norm */

/* in[0] = x, in[1] = weight or NULL, in[2] = bias or NULL; saved[0] =
 * rstd, saved[1] = mean (layer_norm), saved[2] = the weight of ones that
 * stood in for a NULL weight (rms_norm). i[0]: 1 for layer_norm. */
static weft_status norm_backward(nn_node *n, const weft_dtensor *const *dout, weft_dtensor **din) {
  weft_graph *g = nn_node_graph(n);
  bool layer = n->i[0] != 0;
  const weft_dtensor *dy = dout[0], *x = nn_node_input(n, 0);
  const weft_dtensor *w = n->in[1] ? nn_node_input(n, 1) : NULL;
  const weft_dtensor *b = n->in[2] ? nn_node_input(n, 2) : NULL;
  const weft_placement *X = weft_dtensor_placements(x), *D = weft_dtensor_placements(dy);
  int k = weft_mesh_ndim(weft_dtensor_mesh(x));
  const weft_tensor *xl = nn_local(x);
  int64_t C = xl->shape[xl->ndim - 1], N = nn_rows(xl);
  weft_device dev = xl->device;
  weft_placement pw[WEFT_MESH_MAX_DIMS];
  for (int i = 0; i < k; i++)
    pw[i] = (nn_is_shard_any(X[i]) || nn_is_psum(D[i])) ? nn_psum() : nn_r();
  weft_dtensor *dx = NULL, *dw = NULL, *db = NULL;
  if (nn_node_wants(n, 0)) WEFT_CHECK(nn_graph_like(g, x, D, &dx));
  if (w && nn_node_wants(n, 1))
    WEFT_CHECK(
        nn_graph_zeros(g, weft_dtensor_mesh(w), WEFT_F32, 1, weft_dtensor_shape(w), pw, &dw));
  if (b && nn_node_wants(n, 2))
    WEFT_CHECK(
        nn_graph_zeros(g, weft_dtensor_mesh(b), WEFT_F32, 1, weft_dtensor_shape(b), pw, &db));
  if (N > 0 && C > 0) {
    if (layer) {
      if (dx || dw || db)
        WEFT_CHECK(weft_backend_layernorm_backward_dt(
            dev, xl->dtype, dx ? nn_local(dx)->data : NULL, dw ? nn_f32(dw) : NULL,
            db ? nn_f32(db) : NULL, nn_local(dy)->data, xl->data, w ? nn_local(w)->data : NULL,
            nn_f32(n->saved[1]), nn_f32(n->saved[0]), N, C, false));
    } else {
      /* the RMSNorm kernel writes both dinp and dweight: scratch for the
       * one not wanted, ones for a NULL weight */
      void *pdx;
      float *pdw;
      weft_dtensor *t;
      if (dx)
        pdx = nn_local(dx)->data;
      else {
        WEFT_CHECK(nn_graph_like(g, x, NULL, &t));
        pdx = nn_local(t)->data;
      }
      if (dw)
        pdw = nn_f32(dw);
      else {
        WEFT_CHECK(flat_buffer(g, weft_dtensor_mesh(x), C, &t));
        WEFT_CHECK(weft_tensor_fill(weft_dtensor_local(t), 0.0));
        pdw = nn_f32(t);
      }
      const void *wp = w ? nn_local(w)->data : nn_local(n->saved[2])->data;
      WEFT_CHECK(weft_backend_rmsnorm_backward_dt(dev, xl->dtype, pdx, pdw, nn_local(dy)->data,
                                                  xl->data, wp, nn_f32(n->saved[0]), N, C, false));
    }
  } else if (dx && nn_numel(dx) > 0) {
    WEFT_CHECK(weft_tensor_fill(weft_dtensor_local(dx), 0.0));
  }
  /* the weight and bias grads are summed in f32; a 16-bit weight's grad
   * is that sum rounded once, as where the op ran widened */
  weft_dtensor **grads[2] = {&dw, &db};
  for (int j = 0; j < 2 && xl->dtype != WEFT_F32; j++) {
    if (!*grads[j]) continue;
    weft_dtensor *low;
    WEFT_CHECK(nn_graph_converted(g, *grads[j], xl->dtype, &low));
    nn_graph_discard(g, *grads[j]);
    *grads[j] = low;
  }
  din[0] = dx;
  din[1] = dw;
  din[2] = db;
  return WEFT_OK;
}

static weft_status norm_op(const char *name, bool layer, weft_var *x, weft_var *w, weft_var *b,
                           float eps, weft_var **out) {
  if (!out) return weft_error(WEFT_ERR_INVALID, "%s: out is NULL", name);
  *out = NULL;
  weft_var *in[3] = {x, w, b}, *nonnull[3];
  int nn = 0;
  if (!x) return weft_error(WEFT_ERR_INVALID, "%s: input 0 (x) is NULL", name);
  for (int j = 0; j < 3; j++)
    if (in[j]) nonnull[nn++] = in[j];
  weft_graph *g;
  WEFT_CHECK(nn_check_vars(name, nonnull, nn, &g));
  const weft_dtensor *xv = nn_var_now(x);
  const weft_dtensor_spec *xs = weft_dtensor_get_spec(xv);
  /* both have storage-dtype kernels (x, weight, bias of one dtype) */
  const weft_kernel_op kop = layer ? WEFT_KERNEL_LAYERNORM : WEFT_KERNEL_RMSNORM;
  WEFT_CHECK(nn_check_kernel_contig(name, in, 3, xv, "input", kop));
  if (xs->ndim < 1)
    return nn_op_error(WEFT_ERR_INVALID, name, in, 3, "need x (..., C) with at least one dim");
  int last = xs->ndim - 1;
  int64_t C = xs->shape[last];
  const char *what[3] = {"input", "weight", "bias"};
  for (int j = 1; j < 3; j++) {
    if (!in[j]) continue;
    const weft_dtensor *v = nn_var_now(in[j]);
    WEFT_CHECK(nn_check_kernel_contig(name, in, 3, v, what[j], kop));
    if (weft_dtensor_dtype(v) != xs->dtype)
      return nn_op_error(WEFT_ERR_INVALID, name, in, 3, "%s is %s but the input is %s", what[j],
                         weft_dtype_name(weft_dtensor_dtype(v)), weft_dtype_name(xs->dtype));
    const weft_dtensor_spec *s = weft_dtensor_get_spec(v);
    if (s->ndim != 1 || s->shape[0] != C)
      return nn_op_error(WEFT_ERR_INVALID, name, in, 3, "%s must be (%lld), x's last dim", what[j],
                         (long long)C);
  }
  if (layer ? !(eps > 0.0f) : !(eps >= 0.0f))
    return nn_op_error(WEFT_ERR_INVALID, name, in, 3, "eps = %g must be %s 0", (double)eps,
                       layer ? ">" : ">=");
  int k = xs->mesh_ndim;
  weft_sharding_option opts[WEFT_MESH_MAX_DIMS * NN_OPT_CAP];
  int nopt[WEFT_MESH_MAX_DIMS];
  for (int i = 0; i < k; i++) {
    weft_sharding_option *o = &opts[i * NN_OPT_CAP];
    int c = keep_options(o, 1, last, xs->placements[i]);
    for (int j = 0; j < c; j++) o[j].in[1] = o[j].in[2] = nn_r();
    nopt[i] = c;
  }
  weft_placement tgt[3 * WEFT_MESH_MAX_DIMS], opl[WEFT_MESH_MAX_DIMS];
  WEFT_CHECK(nn_choose(name, in, 3, opts, NN_OPT_CAP, nopt, false, tgt, opl));
  const weft_dtensor *u[3] = {NULL, NULL, NULL};
  for (int j = 0; j < 3; j++)
    if (in[j]) WEFT_CHECK(nn_graph_bring(g, nn_var_now(in[j]), tgt + j * k, false, &u[j]));
  weft_mesh *mesh = weft_dtensor_mesh(xv);
  weft_dtensor *y, *rstd, *mean = NULL, *ones = NULL;
  WEFT_CHECK(nn_graph_tensor(g, mesh, xs->dtype, xs->ndim, xs->shape, opl, &y));
  WEFT_CHECK(row_buffer(g, u[0], WEFT_F32, &rstd));
  if (layer) WEFT_CHECK(row_buffer(g, u[0], WEFT_F32, &mean));
  const weft_tensor *xl = nn_local(u[0]);
  int64_t N = nn_rows(xl);
  weft_device dev = xl->device;
  const void *wp = u[1] ? nn_local(u[1])->data : NULL;
  if (!layer && !wp) {
    WEFT_CHECK(flat_buffer_of(g, mesh, xs->dtype, C, &ones));
    WEFT_CHECK(weft_tensor_fill(weft_dtensor_local(ones), 1.0));
    wp = nn_local(ones)->data;
  }
  if (N > 0 && C > 0) {
    if (layer)
      WEFT_CHECK(weft_backend_layernorm_forward_dt(dev, xs->dtype, nn_local(y)->data, nn_f32(mean),
                                                   nn_f32(rstd), xl->data, wp,
                                                   u[2] ? nn_local(u[2])->data : NULL, N, C, eps));
    else
      WEFT_CHECK(weft_backend_rmsnorm_forward_dt(dev, xs->dtype, nn_local(y)->data, nn_f32(rstd),
                                                 xl->data, wp, N, C, eps));
  }
  nn_node *node;
  WEFT_CHECK(nn_node_new(g, name, in, 3, u, norm_backward, &node));
  if (node) {
    node->i[0] = layer;
    node->saved[0] = rstd;
    node->saved[1] = mean;
    node->saved[2] = ones;
  }
  return nn_var_new(g, y, node, out);
}

static weft_status rms_norm_f32(weft_var *x, weft_var *w, float eps, weft_var **out) {
  WEFT_CHECK(norm_op("rms_norm", false, x, w, NULL, eps, out));
  return WEFT_OK;
}

static weft_status layer_norm_f32(weft_var *x, weft_var *w, weft_var *b, float eps,
                                  weft_var **out) {
  WEFT_CHECK(norm_op("layer_norm", true, x, w, b, eps, out));
  return WEFT_OK;
}

/* ---------------------------------------------------- gelu, silu, relu */

static weft_status act_backward(nn_node *n, const weft_dtensor *const *dout, weft_dtensor **din) {
  const weft_dtensor *dy = dout[0], *x = nn_node_input(n, 0);
  weft_dtensor *dx;
  WEFT_CHECK(nn_graph_like(nn_node_graph(n), x, weft_dtensor_placements(dy), &dx));
  int64_t cnt = nn_numel(x);
  if (cnt > 0)
    WEFT_CHECK(weft_backend_activation_backward_dt(
        nn_dev(x), (weft_activation)n->i[0], weft_dtensor_dtype(x), nn_local(dx)->data,
        nn_local(dy)->data, nn_local(x)->data, cnt, false));
  din[0] = dx;
  return WEFT_OK;
}

static weft_status act_op(const char *name, weft_activation act, weft_var *x, weft_var **out) {
  if (!out) return weft_error(WEFT_ERR_INVALID, "%s: out is NULL", name);
  *out = NULL;
  weft_graph *g;
  WEFT_CHECK(nn_check_vars(name, &x, 1, &g));
  const weft_dtensor *xv = nn_var_now(x);
  const weft_dtensor_spec *xs = weft_dtensor_get_spec(xv);
  WEFT_CHECK(nn_check_kernel_contig(name, &x, 1, xv, "input", WEFT_KERNEL_ACTIVATION));
  int k = xs->mesh_ndim;
  weft_sharding_option opts[WEFT_MESH_MAX_DIMS * NN_OPT_CAP];
  int nopt[WEFT_MESH_MAX_DIMS];
  for (int i = 0; i < k; i++)
    nopt[i] = keep_options(&opts[i * NN_OPT_CAP], 1, xs->ndim, xs->placements[i]);
  weft_placement tgt[WEFT_MESH_MAX_DIMS], opl[WEFT_MESH_MAX_DIMS];
  WEFT_CHECK(nn_choose(name, &x, 1, opts, NN_OPT_CAP, nopt, false, tgt, opl));
  const weft_dtensor *xu;
  WEFT_CHECK(nn_graph_bring(g, xv, tgt, false, &xu));
  weft_dtensor *y;
  WEFT_CHECK(nn_graph_like(g, xu, opl, &y));
  int64_t cnt = nn_numel(xu);
  if (cnt > 0)
    WEFT_CHECK(weft_backend_activation_forward_dt(nn_dev(xu), act, weft_dtensor_dtype(xu),
                                                  nn_local(y)->data, nn_local(xu)->data, cnt));
  nn_node *node;
  WEFT_CHECK(nn_node_new(g, name, &x, 1, (const weft_dtensor *const[]){xu}, act_backward, &node));
  if (node) {
    node->i[0] = act;
  }
  return nn_var_new(g, y, node, out);
}

static weft_status gelu_body(weft_var *x, bool tanh_approximate, weft_var **out) {
  WEFT_CHECK(act_op("gelu", tanh_approximate ? WEFT_ACT_GELU_TANH : WEFT_ACT_GELU_ERF, x, out));
  return WEFT_OK;
}
static weft_status silu_body(weft_var *x, weft_var **out) {
  WEFT_CHECK(act_op("silu", WEFT_ACT_SILU, x, out));
  return WEFT_OK;
}
static weft_status relu_body(weft_var *x, weft_var **out) {
  WEFT_CHECK(act_op("relu", WEFT_ACT_RELU, x, out));
  return WEFT_OK;
}

/* ------------------------------------------------------------------ swiglu */

static weft_status swiglu_backward(nn_node *n, const weft_dtensor *const *dout,
                                   weft_dtensor **din) {
  weft_graph *g = nn_node_graph(n);
  const weft_dtensor *dy = dout[0], *a = nn_node_input(n, 0), *b = nn_node_input(n, 1);
  const weft_placement *D = weft_dtensor_placements(dy);
  weft_dtensor *da, *db; /* the kernel writes both */
  WEFT_CHECK(nn_graph_like(g, a, D, &da));
  WEFT_CHECK(nn_graph_like(g, b, D, &db));
  int64_t cnt = nn_numel(a);
  if (cnt > 0)
    WEFT_CHECK(weft_backend_swiglu_backward_dt(nn_dev(a), weft_dtensor_dtype(a), nn_local(da)->data,
                                               nn_local(db)->data, nn_local(dy)->data,
                                               nn_local(a)->data, nn_local(b)->data, cnt));
  if (nn_node_wants(n, 0)) din[0] = da;
  if (nn_node_wants(n, 1)) din[1] = db;
  return WEFT_OK;
}

static weft_status swiglu_body(weft_var *a, weft_var *b, weft_var **out) {
  const char *name = "swiglu";
  if (!out) return weft_error(WEFT_ERR_INVALID, "swiglu: out is NULL");
  *out = NULL;
  weft_var *in[2] = {a, b};
  weft_graph *g;
  WEFT_CHECK(nn_check_vars(name, in, 2, &g));
  const weft_dtensor *av = nn_var_now(a), *bv = nn_var_now(b);
  const weft_dtensor_spec *as = weft_dtensor_get_spec(av), *bs = weft_dtensor_get_spec(bv);
  WEFT_CHECK(nn_check_kernel_contig(name, in, 2, av, "a", WEFT_KERNEL_SWIGLU));
  WEFT_CHECK(nn_check_kernel_contig(name, in, 2, bv, "b", WEFT_KERNEL_SWIGLU));
  if (as->dtype != bs->dtype)
    return nn_op_error(WEFT_ERR_INVALID, name, in, 2, "a is %s but b is %s",
                       weft_dtype_name(as->dtype), weft_dtype_name(bs->dtype));
  bool ok = as->ndim == bs->ndim;
  for (int d = 0; ok && d < as->ndim; d++) ok = as->shape[d] == bs->shape[d];
  if (!ok) return nn_op_error(WEFT_ERR_INVALID, name, in, 2, "a and b must have the same shape");
  int k = as->mesh_ndim;
  weft_sharding_option opts[WEFT_MESH_MAX_DIMS * NN_OPT_CAP];
  int nopt[WEFT_MESH_MAX_DIMS];
  for (int i = 0; i < k; i++)
    nopt[i] = keep_options(&opts[i * NN_OPT_CAP], 2, as->ndim, as->placements[i]);
  weft_placement tgt[2 * WEFT_MESH_MAX_DIMS], opl[WEFT_MESH_MAX_DIMS];
  WEFT_CHECK(nn_choose(name, in, 2, opts, NN_OPT_CAP, nopt, false, tgt, opl));
  const weft_dtensor *au, *bu;
  WEFT_CHECK(nn_graph_bring(g, av, tgt, false, &au));
  WEFT_CHECK(nn_graph_bring(g, bv, tgt + k, false, &bu));
  weft_dtensor *y;
  WEFT_CHECK(nn_graph_like(g, au, opl, &y));
  int64_t cnt = nn_numel(au);
  if (cnt > 0)
    WEFT_CHECK(weft_backend_swiglu_forward_dt(nn_dev(au), weft_dtensor_dtype(au), nn_local(y)->data,
                                              nn_local(au)->data, nn_local(bu)->data, cnt));
  nn_node *node;
  WEFT_CHECK(
      nn_node_new(g, name, in, 2, (const weft_dtensor *const[]){au, bu}, swiglu_backward, &node));
  WEFT_CHECK(nn_var_new(g, y, node, out));
  return WEFT_OK;
}

/* ----------------------------------------------------------------- softmax */

/* saved[0] = the output */
static weft_status softmax_backward(nn_node *n, const weft_dtensor *const *dout,
                                    weft_dtensor **din) {
  const weft_dtensor *dy = dout[0], *y = n->saved[0];
  weft_dtensor *dx;
  WEFT_CHECK(nn_graph_like(nn_node_graph(n), y, weft_dtensor_placements(dy), &dx));
  const weft_tensor *yl = nn_local(y);
  int64_t C = yl->shape[yl->ndim - 1], N = nn_rows(yl);
  if (N > 0 && C > 0)
    WEFT_CHECK(weft_backend_softmax_backward_dt(yl->device, yl->dtype, nn_local(dx)->data,
                                                nn_local(dy)->data, yl->data, N, C, false));
  din[0] = dx;
  return WEFT_OK;
}

static weft_status softmax_body(weft_var *x, weft_var **out) {
  const char *name = "softmax";
  if (!out) return weft_error(WEFT_ERR_INVALID, "softmax: out is NULL");
  *out = NULL;
  weft_graph *g;
  WEFT_CHECK(nn_check_vars(name, &x, 1, &g));
  const weft_dtensor *xv = nn_var_now(x);
  const weft_dtensor_spec *xs = weft_dtensor_get_spec(xv);
  WEFT_CHECK(nn_check_kernel_contig(name, &x, 1, xv, "input", WEFT_KERNEL_SOFTMAX));
  if (xs->ndim < 1)
    return nn_op_error(WEFT_ERR_INVALID, name, &x, 1, "need x (..., C) with at least one dim");
  int k = xs->mesh_ndim, last = xs->ndim - 1;
  weft_sharding_option opts[WEFT_MESH_MAX_DIMS * NN_OPT_CAP];
  int nopt[WEFT_MESH_MAX_DIMS];
  for (int i = 0; i < k; i++)
    nopt[i] = keep_options(&opts[i * NN_OPT_CAP], 1, last, xs->placements[i]);
  weft_placement tgt[WEFT_MESH_MAX_DIMS], opl[WEFT_MESH_MAX_DIMS];
  WEFT_CHECK(nn_choose(name, &x, 1, opts, NN_OPT_CAP, nopt, false, tgt, opl));
  const weft_dtensor *xu;
  WEFT_CHECK(nn_graph_bring(g, xv, tgt, false, &xu));
  weft_dtensor *y;
  WEFT_CHECK(nn_graph_like(g, xu, opl, &y));
  const weft_tensor *xl = nn_local(xu);
  int64_t C = xl->shape[last], N = nn_rows(xl);
  if (N > 0 && C > 0)
    WEFT_CHECK(
        weft_backend_softmax_forward_dt(xl->device, xl->dtype, nn_local(y)->data, xl->data, N, C));
  nn_node *node;
  WEFT_CHECK(
      nn_node_new(g, name, &x, 1, (const weft_dtensor *const[]){xu}, softmax_backward, &node));
  if (node) {
    node->saved[0] = y;
  }
  WEFT_CHECK(nn_var_new(g, y, node, out));
  return WEFT_OK;
}

/* -------------------------------------------------------------------- rope */

/* saved[0] = the tables (cos then sin, i[0] * hd/2 each; the graph's,
 * nn_graph_rope_tables, not a pool buffer); i[0] = the positions they
 * cover (>= pos0 + T), i[1] = pos0. */
static weft_status rope_backward(nn_node *n, const weft_dtensor *const *dout, weft_dtensor **din) {
  const weft_dtensor *dy = dout[0];
  weft_dtensor *dx;
  WEFT_CHECK(nn_graph_like(nn_node_graph(n), dy, NULL, &dx));
  const weft_tensor *l = nn_local(dy);
  int64_t max_pos = n->i[0], pos0 = n->i[1], hd = l->shape[3];
  const float *cosb = nn_f32(n->saved[0]), *sinb = cosb + max_pos * (hd / 2);
  if (weft_tensor_numel(l) > 0)
    WEFT_CHECK(weft_backend_rope_backward_dt(l->device, l->dtype, nn_local(dx)->data, l->data, cosb,
                                             sinb, max_pos, l->shape[0], l->shape[1], l->shape[2],
                                             hd, pos0));
  din[0] = dx;
  return WEFT_OK;
}

static weft_status rope_body(weft_var *x, double theta, int64_t pos0, weft_var **out) {
  const char *name = "rope";
  if (!out) return weft_error(WEFT_ERR_INVALID, "rope: out is NULL");
  *out = NULL;
  weft_graph *g;
  WEFT_CHECK(nn_check_vars(name, &x, 1, &g));
  const weft_dtensor *xv = nn_var_now(x);
  const weft_dtensor_spec *xs = weft_dtensor_get_spec(xv);
  WEFT_CHECK(nn_check_kernel_contig(name, &x, 1, xv, "input", WEFT_KERNEL_ROPE));
  if (xs->ndim != 4 || xs->shape[3] % 2 != 0 || xs->shape[3] < 2)
    return nn_op_error(WEFT_ERR_INVALID, name, &x, 1,
                       "need x (B, T, NH, hd) with an even head dim hd >= 2");
  if (!(theta > 0.0) || pos0 < 0)
    return nn_op_error(WEFT_ERR_INVALID, name, &x, 1, "theta = %g must be > 0 and pos0 = %lld >= 0",
                       theta, (long long)pos0);
  int k = xs->mesh_ndim;
  weft_sharding_option opts[WEFT_MESH_MAX_DIMS * NN_OPT_CAP];
  int nopt[WEFT_MESH_MAX_DIMS];
  for (int i = 0; i < k; i++) {
    weft_sharding_option *o = &opts[i * NN_OPT_CAP];
    int c = 0;
    o[c++] = (weft_sharding_option){{nn_r()}, nn_r()};
    o[c++] = (weft_sharding_option){{nn_s(0)}, nn_s(0)};
    o[c++] = (weft_sharding_option){{nn_s(2)}, nn_s(2)};
    nopt[i] = c;
  }
  weft_placement tgt[WEFT_MESH_MAX_DIMS], opl[WEFT_MESH_MAX_DIMS];
  WEFT_CHECK(nn_choose(name, &x, 1, opts, NN_OPT_CAP, nopt, false, tgt, opl));
  const weft_dtensor *xu;
  WEFT_CHECK(nn_graph_bring(g, xv, tgt, false, &xu));
  weft_dtensor *y;
  WEFT_CHECK(nn_graph_like(g, xu, opl, &y));
  int64_t T = xs->shape[1], hd = xs->shape[3], max_pos = pos0 + T;
  const weft_tensor *xl = nn_local(xu);
  weft_device dev = xl->device;
  const weft_dtensor *tab;
  int64_t tab_pos;
  WEFT_CHECK(nn_graph_rope_tables(g, weft_dtensor_mesh(xv), max_pos, hd, theta, &tab, &tab_pos));
  const float *cosb = nn_f32(tab), *sinb = cosb + tab_pos * (hd / 2);
  if (weft_tensor_numel(xl) > 0)
    WEFT_CHECK(weft_backend_rope_forward_dt(dev, xl->dtype, nn_local(y)->data, xl->data, cosb, sinb,
                                            tab_pos, xl->shape[0], T, xl->shape[2], hd, pos0));
  nn_node *node;
  WEFT_CHECK(nn_node_new(g, name, &x, 1, (const weft_dtensor *const[]){xu}, rope_backward, &node));
  if (node) {
    node->saved[0] = (weft_dtensor *)tab;
    node->i[0] = tab_pos;
    node->i[1] = pos0;
  }
  WEFT_CHECK(nn_var_new(g, y, node, out));
  return WEFT_OK;
}

/* -------------------------------------------------------------------- sdpa */

/* The row stride of a local (B, T, heads, hd) operand as attention reads
 * it (backend.h weft_attention_rows): 0 when packed, -1 when its strides
 * are not rows of one stride (each row's heads * hd elements packed). */
static int64_t attention_row_stride(const weft_tensor *t) {
  if (weft_tensor_is_contiguous(t)) return 0;
  const int64_t B = t->shape[0], T = t->shape[1], heads = t->shape[2], hd = t->shape[3];
  const int64_t ld = T > 1 ? t->strides[1] : t->strides[0];
  bool ok = ld >= heads * hd && (hd <= 1 || t->strides[3] == 1) &&
            (heads <= 1 || t->strides[2] == hd) && (B <= 1 || t->strides[0] == T * ld) &&
            (T <= 1 || t->strides[1] == ld);
  return ok ? ld : -1;
}

/* Whether q, k, v (views of base) are disjoint column ranges of the same
 * rows: the same strides, and each one's heads * hd elements of a row
 * apart from the others' (the pieces of split, not one view thrice).
 * lo: where each starts in base's storage, in elements. */
static bool disjoint_columns(const weft_dtensor *const *qkv, const weft_dtensor *base,
                             int64_t *lo) {
  const char *b0 = nn_local(base)->data;
  const size_t es = weft_dtype_size(nn_local(base)->dtype);
  int64_t hi[3];
  for (int i = 0; i < 3; i++) {
    const weft_tensor *l = nn_local(qkv[i]), *l0 = nn_local(qkv[0]);
    if (l->ndim != 4 || l->strides[0] != l0->strides[0] || l->strides[1] != l0->strides[1])
      return false;
    lo[i] = (int64_t)(((const char *)l->data - b0) / (ptrdiff_t)es);
    hi[i] = lo[i] + l->shape[2] * l->shape[3];
  }
  const int64_t row = nn_local(qkv[0])->strides[1];
  for (int i = 0; i < 3; i++) {
    if (lo[i] < 0 || hi[i] > row) return false; /* not within the first row's columns */
    for (int j = 0; j < i; j++)
      if (lo[i] < hi[j] && lo[j] < hi[i]) return false;
  }
  return true;
}

/* Where dq, dk, dv go: when q, k, v are slices of one buffer (split's
 * pieces of the fused projection) read in place, the same slices of one
 * new buffer like it, so that split's backward takes that buffer whole as
 * the projection's grad (ops_shape.c sliced_grad); else three packed
 * buffers. D: the grads' placements. rows gets their strides. */
static weft_status sdpa_grads(weft_graph *g, const weft_dtensor *const *qkv,
                              const weft_placement *D, weft_dtensor **dqkv,
                              weft_attention_rows *rows) {
  const weft_dtensor *base = nn_graph_view_base(g, qkv[0]);
  for (int i = 1; base && i < 3; i++)
    if (nn_graph_view_base(g, qkv[i]) != base) base = NULL;
  int64_t off[3];
  if (base && !disjoint_columns(qkv, base, off)) base = NULL; /* sdpa(q, q, q): one storage */
  if (base) {
    const weft_dtensor_spec *bs = weft_dtensor_get_spec(base);
    weft_placement bpl[WEFT_MESH_MAX_DIMS];
    for (int i = 0; i < bs->mesh_ndim; i++)
      bpl[i] = nn_is_r(bs->placements[i]) && nn_is_psum(D[i]) ? D[i] : bs->placements[i];
    weft_dtensor *gb;
    WEFT_CHECK(nn_graph_like(g, base, bpl, &gb));
    for (int i = 0; i < 3; i++) {
      WEFT_CHECK(nn_graph_as_strided(g, gb, weft_dtensor_ndim(qkv[i]), weft_dtensor_shape(qkv[i]),
                                     D, off[i], nn_local(qkv[i])->strides, &dqkv[i]));
      if (!dqkv[i]) return weft_error(WEFT_ERR_INTERNAL, "sdpa backward: no view of the grad");
    }
    rows->dq = rows->q, rows->dk = rows->k, rows->dv = rows->v;
    return WEFT_OK;
  }
  for (int i = 0; i < 3; i++) WEFT_CHECK(nn_graph_like(g, qkv[i], D, &dqkv[i]));
  rows->dq = rows->dk = rows->dv = 0;
  return WEFT_OK;
}

/* saved[0] = lse (B, H, T), saved[1] = the output; i[0] = causal, i[1] =
 * the kernel's scratch in floats (a pool buffer taken here and returned
 * after the node, not kept from forward: the kernel only works in it). q,
 * k, v may be row-strided slices (attention_row_stride). */
static weft_status sdpa_backward(nn_node *n, const weft_dtensor *const *dout, weft_dtensor **din) {
  weft_graph *g = nn_node_graph(n);
  const weft_dtensor *dy = dout[0];
  const weft_dtensor *qkv[3] = {nn_node_input(n, 0), nn_node_input(n, 1), nn_node_input(n, 2)};
  const weft_dtensor *q = qkv[0], *k = qkv[1], *v = qkv[2];
  const weft_placement *D = weft_dtensor_placements(dy);
  weft_attention_rows rows = {attention_row_stride(nn_local(q)),
                              attention_row_stride(nn_local(k)),
                              attention_row_stride(nn_local(v)),
                              0,
                              0,
                              0};
  if (rows.q < 0 || rows.k < 0 || rows.v < 0)
    return weft_error(WEFT_ERR_INTERNAL, "sdpa backward: q, k or v is not in rows");
  weft_dtensor *dqkv[3]; /* the kernel writes all three */
  WEFT_CHECK(sdpa_grads(g, qkv, D, dqkv, &rows));
  weft_dtensor *dq = dqkv[0], *dk = dqkv[1], *dv = dqkv[2];
  const weft_tensor *ql = nn_local(q), *kl = nn_local(k);
  int64_t B = ql->shape[0], T = ql->shape[1], H = ql->shape[2], Hkv = kl->shape[2],
          hd = ql->shape[3];
  if (B > 0 && T > 0 && H > 0 && hd > 0) {
    weft_dtensor *scratch;
    WEFT_CHECK(flat_buffer(g, weft_dtensor_mesh(q), n->i[1], &scratch));
    WEFT_CHECK(weft_backend_attention_backward_dt(
        ql->device, ql->dtype, nn_local(dq)->data, nn_local(dk)->data, nn_local(dv)->data,
        nn_local(dy)->data, ql->data, kl->data, nn_local(v)->data, nn_f32(n->saved[0]),
        nn_local(n->saved[1])->data, B, T, H, Hkv, hd, n->i[0] != 0, &rows, nn_f32(scratch)));
  } else {
    if (nn_numel(dq) > 0) WEFT_CHECK(weft_tensor_fill(weft_dtensor_local(dq), 0.0));
    if (nn_numel(dk) > 0) WEFT_CHECK(weft_tensor_fill(weft_dtensor_local(dk), 0.0));
    if (nn_numel(dv) > 0) WEFT_CHECK(weft_tensor_fill(weft_dtensor_local(dv), 0.0));
  }
  if (nn_node_wants(n, 0)) din[0] = dq;
  if (nn_node_wants(n, 1)) din[1] = dk;
  if (nn_node_wants(n, 2)) din[2] = dv;
  return WEFT_OK;
}

static weft_status sdpa_body(weft_var *q, weft_var *k, weft_var *v, bool causal, weft_var **out) {
  const char *name = "sdpa";
  if (!out) return weft_error(WEFT_ERR_INVALID, "sdpa: out is NULL");
  *out = NULL;
  weft_var *in[3] = {q, k, v};
  weft_graph *g;
  WEFT_CHECK(nn_check_vars_views(name, in, 3, &g));
  const weft_dtensor *qv = nn_var_now(q), *kv = nn_var_now(k), *vv = nn_var_now(v);
  WEFT_CHECK(nn_check_kernel_dtype(name, in, 3, qv, "q", WEFT_KERNEL_ATTENTION));
  WEFT_CHECK(nn_check_kernel_dtype(name, in, 3, kv, "k", WEFT_KERNEL_ATTENTION));
  WEFT_CHECK(nn_check_kernel_dtype(name, in, 3, vv, "v", WEFT_KERNEL_ATTENTION));
  const weft_dtensor_spec *qs = weft_dtensor_get_spec(qv), *ks = weft_dtensor_get_spec(kv),
                          *vs = weft_dtensor_get_spec(vv);
  bool ok = qs->ndim == 4 && ks->ndim == 4 && vs->ndim == 4;
  for (int d = 0; ok && d < 4; d++) ok = ks->shape[d] == vs->shape[d];
  ok = ok && qs->shape[0] == ks->shape[0] && qs->shape[1] == ks->shape[1] &&
       qs->shape[3] == ks->shape[3] && ks->shape[2] >= 1 && qs->shape[2] % ks->shape[2] == 0;
  if (!ok)
    return nn_op_error(WEFT_ERR_INVALID, name, in, 3,
                       "need q (B, T, H, hd), k and v (B, T, Hkv, hd) with H %% Hkv == 0");
  int64_t B = qs->shape[0], T = qs->shape[1], H = qs->shape[2], Hkv = ks->shape[2],
          hd = qs->shape[3];
  int nk = qs->mesh_ndim;
  weft_sharding_option opts[WEFT_MESH_MAX_DIMS * NN_OPT_CAP];
  int nopt[WEFT_MESH_MAX_DIMS];
  weft_placement tgt[3 * WEFT_MESH_MAX_DIMS], opl[WEFT_MESH_MAX_DIMS];
  int64_t pb = 1, ph = 1;
  /* heads may be split where the mesh dim's size divides Hkv; when the
   * chosen head shards together do not divide it (nested over several
   * mesh dims), choose again without head shards (replicated heads) */
  for (int heads = 1; heads >= 0; heads--) {
    for (int i = 0; i < nk; i++) {
      weft_sharding_option *o = &opts[i * NN_OPT_CAP];
      int c = 0;
      o[c++] = (weft_sharding_option){{nn_r(), nn_r(), nn_r()}, nn_r()};
      o[c++] = (weft_sharding_option){{nn_s(0), nn_s(0), nn_s(0)}, nn_s(0)};
      if (heads && Hkv % qs->mesh_shape[i] == 0)
        o[c++] = (weft_sharding_option){{nn_s(2), nn_s(2), nn_s(2)}, nn_s(2)};
      nopt[i] = c;
    }
    WEFT_CHECK(nn_choose(name, in, 3, opts, NN_OPT_CAP, nopt, false, tgt, opl));
    pb = ph = 1;
    for (int i = 0; i < nk; i++) {
      if (nn_is_s(opl[i], 0)) pb *= qs->mesh_shape[i];
      if (nn_is_s(opl[i], 2)) ph *= qs->mesh_shape[i];
    }
    if (Hkv % ph == 0) break;
  }
  const weft_dtensor *use[3];
  weft_attention_rows rows = {0, 0, 0, 0, 0, 0};
  int64_t *ld[3] = {&rows.q, &rows.k, &rows.v};
  for (int i = 0; i < 3; i++) {
    WEFT_CHECK(nn_graph_bring(g, nn_var_now(in[i]), tgt + i * nk, false, &use[i]));
    /* rows of a fused projection are read in place where the device
     * takes row strides; any other strided value is copied first (a
     * strided value was not moved: moves give packed buffers) */
    *ld[i] = attention_row_stride(nn_local(use[i]));
    if (*ld[i] > 0 && !weft_backend_attention_takes_rows(nn_local(use[i])->device)) *ld[i] = -1;
    if (*ld[i] < 0) {
      WEFT_CHECK(nn_var_contig(in[i]));
      use[i] = nn_var_now(in[i]);
      *ld[i] = 0;
    }
  }
  const weft_dtensor *qu = use[0], *ku = use[1], *vu = use[2];
  weft_mesh *mesh = weft_dtensor_mesh(qv);
  weft_dtensor *y, *lse, *scratch;
  WEFT_CHECK(nn_graph_like(g, qu, opl, &y));
  weft_placement lpl[WEFT_MESH_MAX_DIMS];
  for (int i = 0; i < nk; i++) lpl[i] = nn_is_s(opl[i], 2) ? nn_s(1) : opl[i];
  int64_t lshape[3] = {B, H, T};
  WEFT_CHECK(nn_graph_tensor(g, mesh, WEFT_F32, 3, lshape, lpl, &lse));
  const weft_tensor *ql = nn_local(qu), *kl = nn_local(ku);
  weft_device dev = ql->device;
  int64_t Bl = ql->shape[0], Hl = ql->shape[2], Hkvl = kl->shape[2];
  /* the scratch is sized for the largest local batch so that every rank
   * asks the pool for the same spec */
  size_t sbytes =
      weft_backend_attention_scratch_bytes(dev, (B + pb - 1) / pb, T, H / ph, Hkv / ph, hd);
  const int64_t sfloats = (int64_t)((sbytes + sizeof(float) - 1) / sizeof(float));
  WEFT_CHECK(flat_buffer(g, mesh, sfloats, &scratch));
  if (Bl > 0 && T > 0 && Hl > 0 && hd > 0)
    WEFT_CHECK(weft_backend_attention_forward_dt(dev, ql->dtype, nn_local(y)->data, nn_f32(lse),
                                                 ql->data, kl->data, nn_local(vu)->data, Bl, T, Hl,
                                                 Hkvl, hd, causal, &rows, nn_f32(scratch)));
  /* the next layer's attention works in the same scratch (on a device
   * after this kernel: one stream) */
  nn_graph_release(g, scratch);
  nn_node *node;
  WEFT_CHECK(
      nn_node_new(g, name, in, 3, (const weft_dtensor *const[]){qu, ku, vu}, sdpa_backward, &node));
  if (node) {
    node->saved[0] = lse;
    node->saved[1] = y;
    node->i[0] = causal;
    node->i[1] = sfloats;
  }
  WEFT_CHECK(nn_var_new(g, y, node, out));
  return WEFT_OK;
}

/* ----------------------------------------------------------- cross_entropy */

/* saved[0] = lse (rows, f32), saved[1] = the local rows' targets with
 * ignored ones as 0 (int32), saved[2] = 1 where the row counts, 0 where
 * ignored (int32); f[0] = the divisor of the sum (the count of kept
 * positions for the mean, 1 for the sum, C / R for the global mean:
 * weft_reduction); i[0] = 1 when loss
 * parallel (vocab-sharded logits). The logits and their gradient are of
 * one dtype (f32, or bf16 / f16 when the device computes cross-entropy in
 * it: backend.h cross_entropy_*_dt), the statistics f32. */
static weft_status ce_backward(nn_node *n, const weft_dtensor *const *dout, weft_dtensor **din) {
  weft_graph *g = nn_node_graph(n);
  const weft_dtensor *dl = dout[0], *logits = nn_node_input(n, 0);
  int k = weft_mesh_ndim(weft_dtensor_mesh(dl));
  if (any_psum(weft_dtensor_placements(dl), k)) {
    weft_placement r[WEFT_MESH_MAX_DIMS];
    all_r(k, r);
    WEFT_CHECK(nn_graph_bring(g, dl, r, false, &dl));
  }
  double dloss = 0.0;
  {
    const weft_tensor *t = nn_local(dl);
    const void *h;
    void *tmp;
    WEFT_CHECK(nn_host_get(t->device, t->data, weft_dtype_size(t->dtype), &h, &tmp));
    bool ok = nn_scalar_load(t->dtype, h, &dloss);
    weft_free(tmp);
    if (!ok)
      return weft_error(WEFT_ERR_UNSUPPORTED, "cross_entropy backward: the loss gradient is %s",
                        weft_dtype_name(t->dtype));
  }
  double divisor = n->f[0];
  float scale = divisor > 0 ? (float)((double)(float)dloss / divisor) : 0.0f;
  weft_dtensor *dlog;
  WEFT_CHECK(nn_graph_like(g, logits, NULL, &dlog));
  const weft_tensor *ll = nn_local(logits);
  int last = ll->ndim - 1;
  int64_t N = nn_rows(ll), nv = ll->shape[last];
  weft_device dev = ll->device;
  if (N > 0 && nv > 0) {
    const int32_t *tl = (const int32_t *)nn_local(n->saved[1])->data;
    const float *lse = nn_f32(n->saved[0]);
    void *dl_data = nn_local(dlog)->data;
    if (n->i[0]) {
      int64_t off[WEFT_MAX_DIMS] = {0};
      weft_dtensor_local_offset(logits, off);
      WEFT_CHECK(weft_backend_cross_entropy_backward_local_dt(dev, ll->dtype, dl_data, ll->data,
                                                              lse, tl, N, off[last], nv, scale));
    } else {
      WEFT_CHECK(weft_backend_cross_entropy_backward_dt(dev, ll->dtype, dl_data, ll->data, lse, tl,
                                                        N, nv, scale));
    }
    const size_t es = weft_dtype_size(ll->dtype);
    /* ignored rows get no gradient */
    const void *h;
    void *tmp;
    WEFT_CHECK(
        nn_host_get(dev, nn_local(n->saved[2])->data, (size_t)N * sizeof(int32_t), &h, &tmp));
    const int32_t *keep = h;
    weft_status st = WEFT_OK;
    for (int64_t r = 0; r < N && st == WEFT_OK; r++) {
      if (keep[r]) continue;
      int64_t r1 = r;
      while (r1 + 1 < N && !keep[r1 + 1]) r1++;
      st = weft_memset(dev, (char *)dl_data + (size_t)(r * nv) * es, 0,
                       (size_t)((r1 - r + 1) * nv) * es);
      r = r1;
    }
    weft_free(tmp);
    WEFT_CHECK(st);
  } else if (nn_numel(dlog) > 0) {
    WEFT_CHECK(weft_tensor_fill(weft_dtensor_local(dlog), 0.0));
  }
  din[0] = dlog;
  return WEFT_OK;
}

static weft_status cross_entropy_body(weft_var *logits, const weft_dtensor *targets,
                                      const weft_cross_entropy_opts *o, weft_var **out) {
  const char *name = "cross_entropy";
  if (!out) return weft_error(WEFT_ERR_INVALID, "cross_entropy: out is NULL");
  *out = NULL;
  const int32_t ignore_index = o->ignore_index;
  if (o->reduction != WEFT_REDUCTION_MEAN && o->reduction != WEFT_REDUCTION_SUM &&
      o->reduction != WEFT_REDUCTION_MEAN_GLOBAL)
    return weft_error(WEFT_ERR_INVALID, "cross_entropy: reduction %d is not a weft_reduction",
                      (int)o->reduction);
  if (o->reduction == WEFT_REDUCTION_MEAN_GLOBAL && !o->batch_mesh)
    return weft_error(WEFT_ERR_INVALID,
                      "cross_entropy: WEFT_REDUCTION_MEAN_GLOBAL needs the batch_mesh (the "
                      "data-parallel mesh whose ranks hold the other rows)");
  weft_graph *g;
  WEFT_CHECK(nn_check_vars(name, &logits, 1, &g));
  if (!targets) return weft_error(WEFT_ERR_INVALID, "cross_entropy: targets are NULL");
  const weft_dtensor *lv = nn_var_now(logits);
  const weft_dtensor_spec *ls = weft_dtensor_get_spec(lv), *ts = weft_dtensor_get_spec(targets);
  WEFT_CHECK(nn_check_kernel_contig(name, &logits, 1, lv, "logits", WEFT_KERNEL_CROSS_ENTROPY));
  char tdesc[384];
  weft_dtensor_spec_describe(ts, tdesc, sizeof tdesc);
  if (ts->dtype != WEFT_I32)
    return nn_op_error(WEFT_ERR_INVALID, name, &logits, 1, "targets %s must be int32", tdesc);
  int last = ls->ndim - 1;
  bool ok = ls->ndim >= 2 && ts->ndim == last && ts->mesh_ndim == ls->mesh_ndim;
  for (int d = 0; ok && d < last; d++) ok = ts->shape[d] == ls->shape[d];
  for (int i = 0; ok && i < ls->mesh_ndim; i++) ok = ts->mesh_shape[i] == ls->mesh_shape[i];
  if (!ok)
    return nn_op_error(WEFT_ERR_INVALID, name, &logits, 1,
                       "targets %s must have the logits' shape without the last (class) dim, on "
                       "a mesh of the same shape",
                       tdesc);
  if (!weft_mesh_same_ranks(weft_dtensor_mesh(targets), weft_dtensor_mesh(lv))) {
    char a[192], b[192];
    weft_mesh_describe(weft_dtensor_mesh(targets), a, sizeof a);
    weft_mesh_describe(weft_dtensor_mesh(lv), b, sizeof b);
    return nn_op_error(WEFT_ERR_INVALID, name, &logits, 1,
                       "targets %s live on %s, the logits on %s: other ranks", tdesc, a, b);
  }
  int k = ls->mesh_ndim;
  int64_t V = ls->shape[last];
  /* targets: brought to Replicate (they are documented Replicate; then
   * no communication), checked and counted on the host */
  weft_placement rep[WEFT_MESH_MAX_DIMS];
  all_r(k, rep);
  const weft_dtensor *tr;
  WEFT_CHECK(nn_graph_bring(g, targets, rep, false, &tr));
  const weft_tensor *tl = nn_local(tr);
  if (!weft_tensor_is_contiguous(tl))
    return nn_op_error(WEFT_ERR_INVALID, name, &logits, 1, "targets: local tensor not contiguous");
  int64_t nt = weft_tensor_numel(tl), count = 0;
  const void *th;
  void *ttmp;
  WEFT_CHECK(nn_host_get(tl->device, tl->data, (size_t)nt * sizeof(int32_t), &th, &ttmp));
  const int32_t *tg = th;
  int64_t bad_at = -1;
  for (int64_t i = 0; i < nt && bad_at < 0; i++) {
    if (tg[i] == ignore_index) continue;
    if (tg[i] < 0 || tg[i] >= V) bad_at = i;
    count++;
  }
  /* the divisor of the sum: the kept positions (mean), 1 (sum), or the
   * batch mesh's kept positions over its ranks (global mean); the batch
   * mesh's ranks learn of a bad target on any of them in the same call */
  double divisor = (double)count;
  if (o->reduction == WEFT_REDUCTION_SUM) divisor = 1.0;
  if (o->reduction == WEFT_REDUCTION_MEAN_GLOBAL) {
    int64_t both[2] = {count, bad_at >= 0}, ranks = 1;
    weft_status cs = WEFT_OK;
    for (int d = 0; d < weft_mesh_ndim(o->batch_mesh) && cs == WEFT_OK; d++) {
      ranks *= weft_mesh_dim_size(o->batch_mesh, d);
      cs = weft_all_reduce(o->batch_mesh, d, both, both, 2, WEFT_I64, WEFT_OP_SUM, NULL);
    }
    if (cs != WEFT_OK) {
      weft_free(ttmp);
      return cs;
    }
    divisor = (double)both[0] / (double)ranks;
    if (bad_at < 0 && both[1] > 0) {
      weft_free(ttmp);
      return nn_op_error(WEFT_ERR_INVALID, name, &logits, 1,
                         "%lld other rank(s) of the batch mesh have a target outside [0, %lld) "
                         "(ignore_index %d); their errors name it",
                         (long long)both[1], (long long)V, ignore_index);
    }
  }
  if (bad_at >= 0) {
    int32_t bad = tg[bad_at];
    weft_free(ttmp);
    return nn_op_error(WEFT_ERR_INVALID, name, &logits, 1,
                       "target %d at flat index %lld is outside [0, %lld) (ignore_index %d)", bad,
                       (long long)bad_at, (long long)V, ignore_index);
  }
  weft_sharding_option opts[WEFT_MESH_MAX_DIMS * NN_OPT_CAP];
  int nopt[WEFT_MESH_MAX_DIMS];
  for (int i = 0; i < k; i++) {
    weft_sharding_option *o = &opts[i * NN_OPT_CAP];
    int c = 0;
    o[c++] = (weft_sharding_option){{nn_r()}, nn_r()};
    o[c++] = (weft_sharding_option){{nn_s(last)}, nn_r()};
    for (int r = 0; r < last; r++) o[c++] = (weft_sharding_option){{nn_s(r)}, nn_r()};
    nopt[i] = c;
  }
  weft_placement tgt[WEFT_MESH_MAX_DIMS], opl[WEFT_MESH_MAX_DIMS];
  weft_status st = nn_choose(name, &logits, 1, opts, NN_OPT_CAP, nopt, false, tgt, opl);
  const weft_dtensor *lu = NULL;
  if (st == WEFT_OK) st = nn_graph_bring(g, lv, tgt, false, &lu);
  if (st != WEFT_OK) {
    weft_free(ttmp);
    return st;
  }
  bool vocab_dim[WEFT_MESH_MAX_DIMS], row_dim[WEFT_MESH_MAX_DIMS], vocab = false;
  for (int i = 0; i < k; i++) {
    vocab_dim[i] = nn_is_s(tgt[i], last) && ls->mesh_shape[i] > 1;
    row_dim[i] = nn_is_shard_any(tgt[i]) && tgt[i].dim < last && ls->mesh_shape[i] > 1;
    vocab = vocab || nn_is_s(tgt[i], last);
  }
  const weft_tensor *ll = nn_local(lu);
  weft_device dev = ll->device;
  int64_t off[WEFT_MAX_DIMS] = {0};
  weft_dtensor_local_offset(lu, off);
  int64_t N = nn_rows(ll), nv = ll->shape[last], v0 = nv ? off[last] : 0;
  weft_dtensor *tsafe = NULL, *keep = NULL, *lse, *gmax, *gtgt, *gsum, *y;
  weft_mesh *mesh = weft_dtensor_mesh(lv);
  /* the local rows' targets (row-major over the logits' local box) */
  st = row_buffer(g, lu, WEFT_I32, &tsafe);
  if (st == WEFT_OK) st = row_buffer(g, lu, WEFT_I32, &keep);
  int32_t *hsafe = NULL, *hkeep = NULL;
  bool host_tmp = dev != WEFT_CPU;
  if (st == WEFT_OK) {
    if (host_tmp) {
      void *p = NULL;
      st = weft_alloc(WEFT_CPU, (size_t)(2 * (N > 0 ? N : 1)) * sizeof(int32_t), &p);
      hsafe = p;
      hkeep = hsafe ? hsafe + (N > 0 ? N : 1) : NULL;
    } else {
      hsafe = (int32_t *)nn_local(tsafe)->data;
      hkeep = (int32_t *)nn_local(keep)->data;
    }
  }
  if (st == WEFT_OK) {
    for (int64_t r = 0; r < N; r++) {
      int64_t rem = r, flat = 0, stride = 1;
      for (int d = last - 1; d >= 0; d--) {
        int64_t sz = ll->shape[d];
        flat += (off[d] + rem % sz) * stride;
        rem /= sz;
        stride *= ls->shape[d];
      }
      int32_t t = tg[flat];
      hkeep[r] = t != ignore_index;
      hsafe[r] = t != ignore_index ? t : 0;
    }
    if (host_tmp) {
      st = nn_host_put(dev, nn_local(tsafe)->data, hsafe, (size_t)N * sizeof(int32_t));
      if (st == WEFT_OK)
        st = nn_host_put(dev, nn_local(keep)->data, hkeep, (size_t)N * sizeof(int32_t));
    }
  }
  weft_free(ttmp);
  if (host_tmp) weft_free(hsafe);
  WEFT_CHECK(st);
  WEFT_CHECK(row_buffer(g, lu, WEFT_F32, &lse));
  WEFT_CHECK(row_buffer(g, lu, WEFT_F32, &gtgt));
  const int32_t *dts = (const int32_t *)nn_local(tsafe)->data;
  const weft_dtype ldt = ll->dtype; /* the logits' and the loss's: f32, or bf16 / f16 */
  if (!vocab) {
    if (N > 0 && nv > 0) {
      double mean;
      WEFT_CHECK(weft_backend_cross_entropy_forward_dt(dev, ldt, &mean, nn_f32(lse), ll->data, dts,
                                                       N, nv));
      WEFT_CHECK(weft_backend_cross_entropy_local_target_dt(dev, ldt, nn_f32(gtgt), ll->data, dts,
                                                            N, 0, nv));
    }
  } else {
    WEFT_CHECK(row_buffer(g, lu, WEFT_F32, &gmax));
    WEFT_CHECK(row_buffer(g, lu, WEFT_F32, &gsum));
    float *pmax = nn_f32(gmax), *ptgt = nn_f32(gtgt), *psum = nn_f32(gsum);
    WEFT_CHECK(weft_backend_cross_entropy_local_max_dt(dev, ldt, pmax, ll->data, N, nv));
    WEFT_CHECK(
        weft_backend_cross_entropy_local_target_dt(dev, ldt, ptgt, ll->data, dts, N, v0, nv));
    for (int i = 0; i < k; i++)
      if (vocab_dim[i]) {
        WEFT_CHECK(weft_all_reduce(mesh, i, pmax, pmax, N, WEFT_F32, WEFT_OP_MAX, NULL));
        WEFT_CHECK(weft_all_reduce(mesh, i, ptgt, ptgt, N, WEFT_F32, WEFT_OP_SUM, NULL));
      }
    WEFT_CHECK(weft_backend_cross_entropy_local_sumexp_dt(dev, ldt, psum, ll->data, pmax, N, nv));
    for (int i = 0; i < k; i++)
      if (vocab_dim[i])
        WEFT_CHECK(weft_all_reduce(mesh, i, psum, psum, N, WEFT_F32, WEFT_OP_SUM, NULL));
    if (N > 0) {
      double mean;
      WEFT_CHECK(weft_backend_cross_entropy_finish(dev, &mean, nn_f32(lse), pmax, psum, ptgt, N));
    }
  }
  /* the sum over kept rows, then over the row shards */
  double sum = 0.0;
  if (N > 0) {
    const void *hl, *ht, *hk;
    void *t1, *t2, *t3;
    WEFT_CHECK(nn_host_get(dev, nn_f32(lse), (size_t)N * sizeof(float), &hl, &t1));
    st = nn_host_get(dev, nn_f32(gtgt), (size_t)N * sizeof(float), &ht, &t2);
    if (st == WEFT_OK)
      st = nn_host_get(dev, nn_local(keep)->data, (size_t)N * sizeof(int32_t), &hk, &t3);
    if (st == WEFT_OK) {
      const float *a = hl, *b = ht;
      const int32_t *kp = hk;
      for (int64_t r = 0; r < N; r++)
        if (kp[r]) sum += (double)a[r] - (double)b[r];
      weft_free(t3);
    }
    weft_free(t1);
    weft_free(t2);
    WEFT_CHECK(st);
  }
  for (int i = 0; i < k; i++)
    if (row_dim[i])
      WEFT_CHECK(weft_all_reduce(mesh, i, &sum, &sum, 1, WEFT_F64, WEFT_OP_SUM, NULL));
  /* torch: the mean over no position is 0/0 = nan */
  /* the loss in the logits' dtype, as PyTorch's: the f32 mean rounded once */
  float loss = (float)(sum / divisor);
  int64_t one = 1;
  uint64_t cell = 0;
  nn_scalar_store(ldt, &cell, loss);
  WEFT_CHECK(nn_graph_tensor(g, mesh, ldt, 1, &one, rep, &y));
  WEFT_CHECK(nn_host_put(nn_dev(y), nn_local(y)->data, &cell, weft_dtype_size(ldt)));
  nn_node *node;
  WEFT_CHECK(
      nn_node_new(g, name, &logits, 1, (const weft_dtensor *const[]){lu}, ce_backward, &node));
  if (node) {
    node->saved[0] = lse;
    node->saved[1] = tsafe;
    node->saved[2] = keep;
    node->f[0] = divisor;
    node->i[0] = vocab;
  }
  WEFT_CHECK(nn_var_new(g, y, node, out));
  return WEFT_OK;
}

/* ----------------------------------------------------------------- dropout */

static uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

/* A graph buffer of d's mesh, shape and placements pl, in dtype dt. */
static weft_status shaped_like(weft_graph *g, const weft_dtensor *d, weft_dtype dt,
                               const weft_placement *pl, weft_dtensor **out) {
  const weft_dtensor_spec *s = weft_dtensor_get_spec(d);
  return nn_graph_tensor(g, weft_dtensor_mesh(d), dt, s->ndim, s->shape, pl ? pl : s->placements,
                         out);
}

/* saved[0] = the uniforms (x's spec, f32); f[0] = p. */
static weft_status dropout_backward(nn_node *n, const weft_dtensor *const *dout,
                                    weft_dtensor **din) {
  const weft_dtensor *dy = dout[0], *u = n->saved[0];
  weft_dtensor *dx;
  WEFT_CHECK(
      shaped_like(nn_node_graph(n), u, weft_dtensor_dtype(dy), weft_dtensor_placements(dy), &dx));
  int64_t cnt = nn_numel(u);
  if (cnt > 0)
    WEFT_CHECK(weft_backend_dropout_apply_dt(nn_dev(u), weft_dtensor_dtype(dy), nn_local(dx)->data,
                                             nn_local(dy)->data, nn_f32(u), (float)n->f[0], cnt));
  din[0] = dx;
  return WEFT_OK;
}

static weft_status dropout_body(weft_var *x, float p, weft_var **out) {
  const char *name = "dropout";
  if (!out) return weft_error(WEFT_ERR_INVALID, "dropout: out is NULL");
  *out = NULL;
  weft_graph *g;
  WEFT_CHECK(nn_check_vars(name, &x, 1, &g));
  const weft_dtensor *xv = nn_var_now(x);
  WEFT_CHECK(nn_check_kernel_contig(name, &x, 1, xv, "input", WEFT_KERNEL_DROPOUT));
  if (!(p >= 0.0f && p < 1.0f))
    return nn_op_error(WEFT_ERR_INVALID, name, &x, 1, "p = %g must be in [0, 1)", (double)p);
  /* identity: no mask drawn (as torch, which draws no random numbers then) */
  if (p == 0.0f || !nn_graph_training(g)) {
    *out = x;
    return WEFT_OK;
  }
  uint64_t key =
      splitmix64((uint64_t)nn_graph_step(g) * 1000003ULL + (uint64_t)nn_graph_next_op_index(g));
  weft_dtensor *u, *y;
  WEFT_CHECK(shaped_like(g, xv, WEFT_F32, NULL, &u));
  int64_t row0, rows;
  nn_graph_batch_slice(g, &row0, &rows);
  if (rows > 0)
    WEFT_CHECK(weft_dtensor_fill_uniform_rows(u, nn_graph_seed(g), key, 0.0f, 1.0f, row0, rows));
  else
    WEFT_CHECK(weft_dtensor_fill_uniform(u, nn_graph_seed(g), key, 0.0f, 1.0f));
  WEFT_CHECK(nn_graph_like(g, xv, NULL, &y));
  int64_t cnt = nn_numel(xv);
  if (cnt > 0)
    WEFT_CHECK(weft_backend_dropout_apply_dt(nn_dev(xv), weft_dtensor_dtype(xv), nn_local(y)->data,
                                             nn_local(xv)->data, nn_f32(u), p, cnt));
  nn_node *node;
  WEFT_CHECK(nn_node_new(g, name, &x, 1, NULL, dropout_backward, &node));
  if (node) {
    node->saved[0] = u;
    node->f[0] = p;
  }
  WEFT_CHECK(nn_var_new(g, y, node, out));
  return WEFT_OK;
}

/* ------------------------------------------- the ops as callers see them
 * Each runs its f32 body above through nn/mixed.c, so bf16 / f16 inputs
 * compute in f32 and keep their dtype (autograd.h, "dtypes"). */

weft_status weft_op_embedding(weft_var *ids, weft_var *w, weft_var **out) {
  weft_var *in[2] = {ids, w};
  nn_mixed mx;
  WEFT_CHECK(nn_mixed_begin_kernel(&mx, "embedding", in, 2, false, WEFT_KERNEL_EMBEDDING));
  return nn_mixed_end(&mx, embedding_body(in[0], in[1], out), out, out ? 1 : 0);
}

weft_status weft_op_rms_norm(weft_var *x, weft_var *w, float eps, weft_var **out) {
  weft_var *in[2] = {x, w};
  nn_mixed mx;
  WEFT_CHECK(nn_mixed_begin_kernel(&mx, "rms_norm", in, 2, true, WEFT_KERNEL_RMSNORM));
  return nn_mixed_end(&mx, rms_norm_f32(in[0], in[1], eps, out), out, out ? 1 : 0);
}

weft_status weft_op_layer_norm(weft_var *x, weft_var *w, weft_var *b, float eps, weft_var **out) {
  weft_var *in[3] = {x, w, b};
  nn_mixed mx;
  WEFT_CHECK(nn_mixed_begin_kernel(&mx, "layer_norm", in, 3, true, WEFT_KERNEL_LAYERNORM));
  return nn_mixed_end(&mx, layer_norm_f32(in[0], in[1], in[2], eps, out), out, out ? 1 : 0);
}

weft_status weft_op_gelu(weft_var *x, bool tanh_approximate, weft_var **out) {
  weft_var *in[1] = {x};
  nn_mixed mx;
  WEFT_CHECK(nn_mixed_begin_kernel(&mx, "gelu", in, 1, false, WEFT_KERNEL_ACTIVATION));
  return nn_mixed_end(&mx, gelu_body(in[0], tanh_approximate, out), out, out ? 1 : 0);
}

weft_status weft_op_silu(weft_var *x, weft_var **out) {
  weft_var *in[1] = {x};
  nn_mixed mx;
  WEFT_CHECK(nn_mixed_begin_kernel(&mx, "silu", in, 1, false, WEFT_KERNEL_ACTIVATION));
  return nn_mixed_end(&mx, silu_body(in[0], out), out, out ? 1 : 0);
}

weft_status weft_op_relu(weft_var *x, weft_var **out) {
  weft_var *in[1] = {x};
  nn_mixed mx;
  WEFT_CHECK(nn_mixed_begin_kernel(&mx, "relu", in, 1, false, WEFT_KERNEL_ACTIVATION));
  return nn_mixed_end(&mx, relu_body(in[0], out), out, out ? 1 : 0);
}

weft_status weft_op_swiglu(weft_var *a, weft_var *b, weft_var **out) {
  weft_var *in[2] = {a, b};
  nn_mixed mx;
  WEFT_CHECK(nn_mixed_begin_kernel(&mx, "swiglu", in, 2, false, WEFT_KERNEL_SWIGLU));
  return nn_mixed_end(&mx, swiglu_body(in[0], in[1], out), out, out ? 1 : 0);
}

weft_status weft_op_softmax(weft_var *x, weft_var **out) {
  weft_var *in[1] = {x};
  nn_mixed mx;
  WEFT_CHECK(nn_mixed_begin_kernel(&mx, "softmax", in, 1, false, WEFT_KERNEL_SOFTMAX));
  return nn_mixed_end(&mx, softmax_body(in[0], out), out, out ? 1 : 0);
}

weft_status weft_op_rope(weft_var *x, double theta, int64_t pos0, weft_var **out) {
  weft_var *in[1] = {x};
  nn_mixed mx;
  WEFT_CHECK(nn_mixed_begin_kernel(&mx, "rope", in, 1, false, WEFT_KERNEL_ROPE));
  return nn_mixed_end(&mx, rope_body(in[0], theta, pos0, out), out, out ? 1 : 0);
}

weft_status weft_op_sdpa(weft_var *q, weft_var *k, weft_var *v, bool causal, weft_var **out) {
  weft_var *in[3] = {q, k, v};
  nn_mixed mx;
  WEFT_CHECK(nn_mixed_begin_kernel(&mx, "sdpa", in, 3, true, WEFT_KERNEL_ATTENTION));
  return nn_mixed_end(&mx, sdpa_body(in[0], in[1], in[2], causal, out), out, out ? 1 : 0);
}

weft_status weft_op_cross_entropy_ex(weft_var *logits, const weft_dtensor *targets,
                                     const weft_cross_entropy_opts *opts, weft_var **out) {
  weft_cross_entropy_opts o = opts ? *opts : WEFT_CROSS_ENTROPY_OPTS_INIT;
  weft_var *in[1] = {logits};
  nn_mixed mx;
  WEFT_CHECK(nn_mixed_begin_kernel(&mx, "cross_entropy", in, 1, false, WEFT_KERNEL_CROSS_ENTROPY));
  return nn_mixed_end(&mx, cross_entropy_body(in[0], targets, &o, out), out, out ? 1 : 0);
}

weft_status weft_op_cross_entropy(weft_var *logits, const weft_dtensor *targets,
                                  int32_t ignore_index, weft_var **out) {
  weft_cross_entropy_opts o = WEFT_CROSS_ENTROPY_OPTS_INIT;
  o.ignore_index = ignore_index;
  return weft_op_cross_entropy_ex(logits, targets, &o, out);
}

weft_status weft_op_dropout(weft_var *x, float p, weft_var **out) {
  weft_var *in[1] = {x};
  nn_mixed mx;
  WEFT_CHECK(nn_mixed_begin_kernel(&mx, "dropout", in, 1, false, WEFT_KERNEL_DROPOUT));
  return nn_mixed_end(&mx, dropout_body(in[0], p, out), out, out ? 1 : 0);
}
