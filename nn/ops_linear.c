/* nn/ops_linear.c — linear, add (with broadcast of a suffix), mul, scale:
 * forward next to backward, sharding rules per mesh dim.
 *
 * The pattern every op of nn/ follows:
 *   1. nn_check_vars, shape checks (nn_op_error names the op and inputs);
 *   2. the options per mesh dim and nn_choose;
 *   3. nn_graph_bring each input to its target, nn_graph_tensor the
 *      output with the chosen placements, compute on local shards through
 *      the backend;
 *   4. nn_node_new with the inputs as used (NULL when nothing needs grad),
 *      redistributed inputs, nn_var_new for the outputs;
 *   5. the backward derives each input grad's placements from the
 *      placements the forward used and the output grad's, computes
 *      locally, and hands graph buffers back (the graph reduces them at
 *      parameters and sums them at vars).
 */
#include <string.h>

#include "autograd_internal.h"

static bool is_ss(weft_placement p, int dim) {
  return p.kind == WEFT_PLACE_STRIDED_SHARD && p.dim == dim;
}

/* ------------------------------------------------------------------ linear */

/* out (contiguous f32, numel C) = the sum of the `rows` rows of dy's local
 * data viewed as (rows, C) (weft_reduce: double, rows in order): a
 * broadcast operand's grad (add's b, linear's bias). */
static weft_status sum_rows(const weft_tensor *dy, int64_t rows, weft_tensor *out) {
  const int64_t C = weft_tensor_numel(out);
  if (rows == 0) return weft_tensor_fill(out, 0.0);
  weft_tensor v2, o2;
  int64_t s2[2] = {rows, C}, so[2] = {1, C};
  /* in dy's dtype: a 16-bit grad (add in bf16 / f16) gets the double sums
   * rounded once (widening dy first rounded them to f32, then again) */
  WEFT_CHECK(weft_tensor_view_init(&v2, dy->data, dy->dtype, dy->device, 2, s2, NULL));
  WEFT_CHECK(weft_tensor_view_init(&o2, out->data, out->dtype, out->device, 2, so, NULL));
  return weft_reduce(&v2, WEFT_REDUCE_SUM, 0, &o2);
}

static weft_status linear_backward(nn_node *n, const weft_dtensor *const *dout,
                                   weft_dtensor **din) {
  weft_graph *g = nn_node_graph(n);
  const weft_dtensor *dy = dout[0], *x = nn_node_input(n, 0), *w = nn_node_input(n, 1);
  const weft_placement *X = weft_dtensor_placements(x), *W = weft_dtensor_placements(w),
                       *D = weft_dtensor_placements(dy);
  int k = weft_mesh_ndim(weft_dtensor_mesh(x)), last = weft_dtensor_ndim(x) - 1;
  nn_gemm_operand ox; /* x as the forward read it: maybe strided */
  WEFT_CHECK(nn_gemm_operand_packed(g, &x, &ox));
  const weft_tensor *xl = nn_local(x), *wl = nn_local(w), *dyl = nn_local(dy);
  int64_t rows = ox.rows, kl = ox.cols, nl = wl->shape[0];
  weft_device dev = xl->device;
  /* f32: the linear member; bf16 / f16 (and dw of a strided x): gemm_dt in
   * that dtype, grads rounded once */
  const weft_dtype dt = xl->dtype;
  const bool packed_x = weft_tensor_is_contiguous(xl);
  const int64_t ldk = kl > 0 ? kl : 1, ldn = nl > 0 ? nl : 1;
  if (nn_node_wants(n, 0)) {
    weft_placement p[WEFT_MESH_MAX_DIMS];
    for (int i = 0; i < k; i++) {
      if (nn_is_psum(D[i]))
        p[i] = nn_psum();
      else if (nn_is_shard_any(X[i]) && X[i].dim < last)
        p[i] = X[i];
      else if (nn_is_shard_any(W[i]) && W[i].dim == 0)
        p[i] = nn_psum();
      else if (nn_is_s(W[i], 1))
        p[i] = nn_s(last);
      else
        p[i] = nn_r();
    }
    weft_dtensor *dx;
    WEFT_CHECK(nn_graph_like(g, x, p, &dx));
    if (dt == WEFT_F32)
      WEFT_CHECK(weft_backend_linear_backward(dev, nn_f32(dx), NULL, NULL, dyl->data, xl->data,
                                              wl->data, rows, kl, nl, false, false));
    else if (rows * kl > 0) /* dx (rows, K) = dy (rows, N) @ w (N, K) */
      WEFT_CHECK(weft_backend_gemm_dt(dev, false, false, rows, kl, nl, 1.0f, dt, dyl->data, ldn,
                                      wl->data, ldk, 0.0f, dt, nn_local(dx)->data, ldk, NULL));
    din[0] = dx;
  }
  if (nn_node_wants(n, 1)) {
    weft_placement p[WEFT_MESH_MAX_DIMS];
    for (int i = 0; i < k; i++) {
      if (nn_is_psum(D[i]))
        p[i] = nn_psum();
      else if (nn_is_shard_any(X[i]) && X[i].dim < last)
        p[i] = nn_psum();
      else if (X[i].kind == WEFT_PLACE_PARTIAL)
        p[i] = nn_psum();
      else if (nn_is_shard_any(W[i]))
        p[i] = W[i];
      else
        p[i] = nn_r();
    }
    weft_dtensor *dw;
    WEFT_CHECK(nn_graph_like(g, w, p, &dw));
    if (dt == WEFT_F32 && packed_x)
      WEFT_CHECK(weft_backend_linear_backward(dev, NULL, nn_f32(dw), NULL, dyl->data, xl->data,
                                              wl->data, rows, kl, nl, false, false));
    else if (nl * kl > 0) /* dw (N, K) = dy^T (N, rows) @ x (rows, K) */
      WEFT_CHECK(weft_backend_gemm_dt(dev, true, ox.trans, nl, kl, rows, 1.0f, dt, dyl->data, ldn,
                                      ox.data, ox.ld, 0.0f, dt, nn_local(dw)->data, ldk, NULL));
    din[1] = dw;
  }
  if (n->nin == 3 && nn_node_wants(n, 2)) {
    /* the bias (fused, linear_impl): db = dy summed over its rows, as add's
     * backward sums a broadcast operand (the same weft_reduce, the same bits) */
    const weft_dtensor *bu = nn_node_input(n, 2);
    const weft_placement *B = weft_dtensor_placements(bu);
    weft_placement p[WEFT_MESH_MAX_DIMS];
    for (int i = 0; i < k; i++) {
      if (nn_is_psum(D[i]) || (nn_is_shard_any(D[i]) && D[i].dim < last))
        p[i] = nn_psum();
      else if (nn_is_shard_any(D[i]))
        p[i] = B[i];
      else
        p[i] = nn_r();
    }
    weft_dtensor *db;
    WEFT_CHECK(nn_graph_like(g, bu, p, &db));
    WEFT_CHECK(sum_rows(dyl, rows, weft_dtensor_local(db)));
    din[2] = db;
  }
  return WEFT_OK;
}

/* y = x w^T (+ b). With a bias the op is one node whose kernel adds it
 * (weft_backend_linear_forward's bias) and whose backward sums db, instead
 * of a linear and a broadcast add (one op, buffer and dy copy fewer per
 * call), when the output is not Partial; a Partial output (rowwise: x
 * sharded on K) must get the bias once, after the reduction, so there it
 * stays linear + add, whose sharding rule does that. */
static weft_status linear_impl(weft_var *x, weft_var *w, weft_var *b, weft_var **out) {
  const char *name = "linear";
  weft_var *in[3] = {x, w, b};
  const int nin = b ? 3 : 2;
  weft_graph *g;
  /* x may be strided where a GEMM reads it in place (a split piece's rows,
   * a transpose: nn_gemm_operand_of); the weight, the bias and any other x
   * through their contiguous copies */
  WEFT_CHECK(nn_check_vars_views(name, in, nin, &g));
  for (int i = 1; i < nin; i++) WEFT_CHECK(nn_var_contig(in[i]));
  WEFT_CHECK(nn_var_gemm_ready(x));
  const weft_dtensor *xv = nn_var_now(x), *wv = nn_var_now(w);
  const weft_dtensor_spec *xs = weft_dtensor_get_spec(xv), *ws = weft_dtensor_get_spec(wv);
  WEFT_CHECK(nn_check_kernel_dtype(name, in, nin, xv, "input", WEFT_KERNEL_GEMM));
  WEFT_CHECK(nn_check_kernel_contig(name, in, nin, wv, "weight", WEFT_KERNEL_GEMM));
  int na = xs->ndim, last = na - 1;
  if (na < 1 || ws->ndim != 2 || xs->shape[last] != ws->shape[1])
    return nn_op_error(WEFT_ERR_INVALID, name, in, nin,
                       "need x (..., K) and weight (N, K) with the same K");
  const weft_dtensor *bv = b ? nn_var_now(b) : NULL;
  if (bv) {
    WEFT_CHECK(nn_check_kernel_contig(name, in, nin, bv, "bias", WEFT_KERNEL_GEMM));
    const weft_dtensor_spec *bs = weft_dtensor_get_spec(bv);
    if (bs->ndim != 1 || bs->shape[0] != ws->shape[0])
      return nn_op_error(WEFT_ERR_INVALID, name, in, nin, "need bias (N,) for weight (N, K)");
  }
  int k = xs->mesh_ndim;
  weft_sharding_option opts[WEFT_MESH_MAX_DIMS * NN_OPT_CAP];
  int nopt[WEFT_MESH_MAX_DIMS];
  for (int i = 0; i < k; i++) {
    weft_sharding_option *o = &opts[i * NN_OPT_CAP];
    int c = 0;
    weft_placement pw = ws->placements[i], px = xs->placements[i];
    o[c++] = (weft_sharding_option){{nn_r(), nn_r()}, nn_r()};
    for (int r = 0; r < last; r++) o[c++] = (weft_sharding_option){{nn_s(r), nn_r()}, nn_s(r)};
    o[c++] = (weft_sharding_option){{nn_r(), nn_s(0)}, nn_s(last)};
    o[c++] = (weft_sharding_option){{nn_s(last), nn_s(1)}, nn_psum()};
    o[c++] = (weft_sharding_option){{nn_psum(), nn_r()}, nn_psum()};
    if (is_ss(pw, 0))
      o[c++] = (weft_sharding_option){{nn_r(), pw}, weft_strided_shard(last, pw.split_factor)};
    if (px.kind == WEFT_PLACE_STRIDED_SHARD && px.dim < last)
      o[c++] = (weft_sharding_option){{px, nn_r()}, px};
    nopt[i] = c;
  }
  weft_placement tgt[2 * WEFT_MESH_MAX_DIMS], opl[WEFT_MESH_MAX_DIMS];
  WEFT_CHECK(nn_choose(name, in, 2, opts, NN_OPT_CAP, nopt, false, tgt, opl));
  /* the bias follows the output's last dim: sharded with it, else whole */
  weft_placement bpl[WEFT_MESH_MAX_DIMS];
  for (int i = 0; bv && i < k; i++) {
    if (opl[i].kind == WEFT_PLACE_PARTIAL) { /* the bias must come after the sum */
      weft_var *y;
      WEFT_CHECK(linear_impl(x, w, NULL, &y));
      return weft_op_add(y, b, out);
    }
    bpl[i] = nn_is_shard_any(opl[i]) && opl[i].dim == last ? opl[i] : nn_r();
    bpl[i].dim = nn_is_shard_any(bpl[i]) ? 0 : bpl[i].dim;
  }
  const weft_dtensor *xu, *wu, *bu = NULL;
  WEFT_CHECK(nn_graph_bring(g, xv, tgt, false, &xu));
  WEFT_CHECK(nn_graph_bring(g, wv, tgt + k, false, &wu));
  if (bv) WEFT_CHECK(nn_graph_bring(g, bv, bpl, false, &bu));
  int64_t oshape[WEFT_MAX_DIMS];
  memcpy(oshape, xs->shape, sizeof(int64_t) * (size_t)na);
  oshape[last] = ws->shape[0];
  weft_dtensor *y;
  WEFT_CHECK(nn_graph_tensor(g, weft_dtensor_mesh(xv), xs->dtype, na, oshape, opl, &y));
  nn_gemm_operand ox;
  WEFT_CHECK(nn_gemm_operand_packed(g, &xu, &ox)); /* in place: copies made above */
  const weft_tensor *xl = nn_local(xu), *wl = nn_local(wu);
  const int64_t rows = ox.rows, K = ox.cols, N = wl->shape[0];
  if (xs->dtype == WEFT_F32 && weft_tensor_is_contiguous(xl))
    WEFT_CHECK(weft_backend_linear_forward(xl->device, nn_f32(y), xl->data, wl->data,
                                           bu ? nn_f32(bu) : NULL, rows, K, N));
  else /* bf16 / f16 or a strided x: one GEMM in that dtype, the bias added
        * before it rounds */
    WEFT_CHECK(weft_backend_gemm_dt(xl->device, ox.trans, true, rows, N, K, 1.0f, xs->dtype,
                                    ox.data, ox.ld, wl->data, K > 0 ? K : 1, 0.0f, xs->dtype,
                                    nn_local(y)->data, N > 0 ? N : 1,
                                    bu ? nn_local(bu)->data : NULL));
  nn_node *node;
  WEFT_CHECK(nn_node_new(g, name, in, nin, (const weft_dtensor *const[]){xu, wu, bu},
                         linear_backward, &node));
  return nn_var_new(g, y, node, out);
}

static weft_status linear_body(weft_var *x, weft_var *w, weft_var *b, weft_var **out) {
  if (!out) return weft_error(WEFT_ERR_INVALID, "linear: out is NULL");
  *out = NULL;
  return linear_impl(x, w, b, out);
}

/* --------------------------------------------------------------------- add */

/* The placement of b's grad given the output grad's placement on one mesh
 * dim (sums over the broadcast leading dims `off`). */
static weft_placement bcast_grad_pl(weft_placement d, int off) {
  if (nn_is_psum(d)) return nn_psum();
  if (nn_is_shard_any(d)) {
    if (d.dim < off) return nn_psum();
    weft_placement p = d;
    p.dim -= off;
    return p;
  }
  return nn_r();
}

static weft_status add_backward(nn_node *n, const weft_dtensor *const *dout, weft_dtensor **din) {
  weft_graph *g = nn_node_graph(n);
  const weft_dtensor *dy = dout[0];
  const weft_dtensor *a = nn_node_input(n, 0), *b = nn_node_input(n, 1);
  int off = weft_dtensor_ndim(a) - weft_dtensor_ndim(b);
  int k = weft_mesh_ndim(weft_dtensor_mesh(a));
  /* d(a + b) = dy for both: each input is handed dy itself, no copy (the
   * graph adds into a grad handed to two inputs out of place: graph.c
   * accumulate); a dy of another dtype than the input's (a 16-bit var
   * under a mixed op) or a broadcast b still gets a buffer of its own */
  if (nn_node_wants(n, 0)) {
    if (weft_dtensor_dtype(dy) == weft_dtensor_dtype(a)) {
      din[0] = (weft_dtensor *)dy;
    } else {
      weft_dtensor *da;
      WEFT_CHECK(nn_graph_like(g, a, weft_dtensor_placements(dy), &da));
      WEFT_CHECK(weft_tensor_copy(weft_dtensor_local(da), nn_local(dy)));
      nn_count_copies(1);
      din[0] = da;
    }
  }
  if (nn_node_wants(n, 1)) {
    weft_placement p[WEFT_MESH_MAX_DIMS];
    for (int i = 0; i < k; i++) p[i] = bcast_grad_pl(weft_dtensor_placements(dy)[i], off);
    if (off == 0 && weft_dtensor_dtype(dy) == weft_dtensor_dtype(b) &&
        nn_pl_equal(p, weft_dtensor_placements(dy), k)) {
      din[1] = (weft_dtensor *)dy;
      return WEFT_OK;
    }
    weft_dtensor *db;
    WEFT_CHECK(nn_graph_like(g, b, p, &db));
    const weft_tensor *dyl = nn_local(dy);
    weft_tensor *dbl = weft_dtensor_local(db);
    if (off == 0) {
      WEFT_CHECK(weft_tensor_copy(dbl, dyl));
      nn_count_copies(1);
    } else {
      int64_t lead = 1;
      for (int d = 0; d < off; d++) lead *= dyl->shape[d];
      WEFT_CHECK(sum_rows(dyl, lead, dbl));
    }
    din[1] = db;
  }
  return WEFT_OK;
}

/* add, mul, scale: f32, or the inputs' 16-bit dtype where the device
 * computes the op in it (nn_mixed_begin_kernel left them unwidened). */
static weft_status same_dtype(const char *name, weft_var **in, const weft_dtensor *av,
                              const weft_dtensor *bv) {
  if (weft_dtensor_dtype(av) == weft_dtensor_dtype(bv)) return WEFT_OK;
  return nn_op_error(WEFT_ERR_INVALID, name, in, 2, "a is %s but b is %s",
                     weft_dtype_name(weft_dtensor_dtype(av)),
                     weft_dtype_name(weft_dtensor_dtype(bv)));
}

static weft_status add_body(weft_var *a, weft_var *b, weft_var **out) {
  const char *name = "add";
  if (!out) return weft_error(WEFT_ERR_INVALID, "add: out is NULL");
  *out = NULL;
  weft_var *in[2] = {a, b};
  weft_graph *g;
  WEFT_CHECK(nn_check_vars(name, in, 2, &g));
  const weft_dtensor *av = nn_var_now(a), *bv = nn_var_now(b);
  const weft_dtensor_spec *as = weft_dtensor_get_spec(av), *bs = weft_dtensor_get_spec(bv);
  WEFT_CHECK(nn_check_kernel_contig(name, in, 2, av, "a", WEFT_KERNEL_ADD));
  WEFT_CHECK(nn_check_kernel_contig(name, in, 2, bv, "b", WEFT_KERNEL_ADD));
  WEFT_CHECK(same_dtype(name, in, av, bv));
  const weft_dtype dt = weft_dtensor_dtype(av);
  int na = as->ndim, nb = bs->ndim, off = na - nb;
  bool ok = nb >= 1 && off >= 0;
  for (int d = 0; ok && d < nb; d++) ok = as->shape[off + d] == bs->shape[d];
  if (!ok)
    return nn_op_error(WEFT_ERR_INVALID, name, in, 2,
                       "b's shape must equal a's or a suffix of it (broadcast)");
  int k = as->mesh_ndim;
  weft_sharding_option opts[WEFT_MESH_MAX_DIMS * NN_OPT_CAP];
  int nopt[WEFT_MESH_MAX_DIMS];
  for (int i = 0; i < k; i++) {
    weft_sharding_option *o = &opts[i * NN_OPT_CAP];
    int c = 0;
    weft_placement pa = as->placements[i];
    o[c++] = (weft_sharding_option){{nn_r(), nn_r()}, nn_r()};
    for (int d = 0; d < na && c < NN_OPT_CAP - 3; d++)
      o[c++] = (weft_sharding_option){{nn_s(d), d < off ? nn_r() : nn_s(d - off)}, nn_s(d)};
    if (pa.kind == WEFT_PLACE_STRIDED_SHARD) {
      weft_placement pb = pa;
      pb.dim -= off;
      o[c++] = (weft_sharding_option){{pa, pa.dim < off ? nn_r() : pb}, pa};
    }
    o[c++] = (weft_sharding_option){{nn_psum(), nn_psum()}, nn_psum()};
    nopt[i] = c;
  }
  weft_placement tgt[2 * WEFT_MESH_MAX_DIMS], opl[WEFT_MESH_MAX_DIMS];
  WEFT_CHECK(nn_choose(name, in, 2, opts, NN_OPT_CAP, nopt, true, tgt, opl));
  const weft_dtensor *au, *bu;
  WEFT_CHECK(nn_graph_bring(g, av, tgt, true, &au));
  WEFT_CHECK(nn_graph_bring(g, bv, tgt + k, true, &bu));
  weft_dtensor *y;
  WEFT_CHECK(nn_graph_tensor(g, weft_dtensor_mesh(av), dt, na, as->shape, opl, &y));
  const weft_tensor *al = nn_local(au), *bl = nn_local(bu);
  weft_tensor bb;
  int64_t st[WEFT_MAX_DIMS];
  for (int d = 0; d < na; d++) st[d] = d < off ? 0 : bl->strides[d - off];
  WEFT_CHECK(weft_tensor_view_init(&bb, bl->data, dt, bl->device, na, al->shape, st));
  WEFT_CHECK(weft_add(weft_dtensor_local(y), al, &bb));
  nn_node *node;
  WEFT_CHECK(
      nn_node_new(g, name, in, 2, (const weft_dtensor *const[]){au, bu}, add_backward, &node));
  WEFT_CHECK(nn_var_new(g, y, node, out));
  return WEFT_OK;
}

/* --------------------------------------------------------------------- mul */

static weft_status mul_backward(nn_node *n, const weft_dtensor *const *dout, weft_dtensor **din) {
  weft_graph *g = nn_node_graph(n);
  const weft_dtensor *dy = dout[0];
  const weft_dtensor *ab[2] = {nn_node_input(n, 0), nn_node_input(n, 1)};
  int k = weft_mesh_ndim(weft_dtensor_mesh(ab[0]));
  const weft_placement *D = weft_dtensor_placements(dy);
  for (int s = 0; s < 2; s++) {
    if (!nn_node_wants(n, s)) continue;
    const weft_placement *O = weft_dtensor_placements(ab[1 - s]);
    const weft_placement *S = weft_dtensor_placements(ab[s]);
    weft_placement p[WEFT_MESH_MAX_DIMS];
    for (int i = 0; i < k; i++) {
      if (nn_is_psum(D[i]) || nn_is_psum(O[i]))
        p[i] = nn_psum();
      else if (nn_is_shard_any(S[i]))
        p[i] = S[i];
      else
        p[i] = nn_r();
    }
    weft_dtensor *d;
    WEFT_CHECK(nn_graph_like(g, ab[s], p, &d));
    WEFT_CHECK(weft_mul(weft_dtensor_local(d), nn_local(dy), nn_local(ab[1 - s])));
    din[s] = d;
  }
  return WEFT_OK;
}

static weft_status mul_body(weft_var *a, weft_var *b, weft_var **out) {
  const char *name = "mul";
  if (!out) return weft_error(WEFT_ERR_INVALID, "mul: out is NULL");
  *out = NULL;
  weft_var *in[2] = {a, b};
  weft_graph *g;
  WEFT_CHECK(nn_check_vars(name, in, 2, &g));
  const weft_dtensor *av = nn_var_now(a), *bv = nn_var_now(b);
  const weft_dtensor_spec *as = weft_dtensor_get_spec(av), *bs = weft_dtensor_get_spec(bv);
  WEFT_CHECK(nn_check_kernel_contig(name, in, 2, av, "a", WEFT_KERNEL_MUL));
  WEFT_CHECK(nn_check_kernel_contig(name, in, 2, bv, "b", WEFT_KERNEL_MUL));
  WEFT_CHECK(same_dtype(name, in, av, bv));
  bool ok = as->ndim == bs->ndim;
  for (int d = 0; ok && d < as->ndim; d++) ok = as->shape[d] == bs->shape[d];
  if (!ok) return nn_op_error(WEFT_ERR_INVALID, name, in, 2, "shapes differ");
  int k = as->mesh_ndim, na = as->ndim;
  weft_sharding_option opts[WEFT_MESH_MAX_DIMS * NN_OPT_CAP];
  int nopt[WEFT_MESH_MAX_DIMS];
  for (int i = 0; i < k; i++) {
    weft_sharding_option *o = &opts[i * NN_OPT_CAP];
    int c = 0;
    weft_placement pa = as->placements[i];
    o[c++] = (weft_sharding_option){{nn_r(), nn_r()}, nn_r()};
    for (int d = 0; d < na && c < NN_OPT_CAP - 3; d++)
      o[c++] = (weft_sharding_option){{nn_s(d), nn_s(d)}, nn_s(d)};
    if (pa.kind == WEFT_PLACE_STRIDED_SHARD) o[c++] = (weft_sharding_option){{pa, pa}, pa};
    o[c++] = (weft_sharding_option){{nn_psum(), nn_r()}, nn_psum()};
    o[c++] = (weft_sharding_option){{nn_r(), nn_psum()}, nn_psum()};
    nopt[i] = c;
  }
  weft_placement tgt[2 * WEFT_MESH_MAX_DIMS], opl[WEFT_MESH_MAX_DIMS];
  WEFT_CHECK(nn_choose(name, in, 2, opts, NN_OPT_CAP, nopt, false, tgt, opl));
  const weft_dtensor *au, *bu;
  WEFT_CHECK(nn_graph_bring(g, av, tgt, false, &au));
  WEFT_CHECK(nn_graph_bring(g, bv, tgt + k, false, &bu));
  weft_dtensor *y;
  WEFT_CHECK(
      nn_graph_tensor(g, weft_dtensor_mesh(av), weft_dtensor_dtype(av), na, as->shape, opl, &y));
  WEFT_CHECK(weft_mul(weft_dtensor_local(y), nn_local(au), nn_local(bu)));
  nn_node *node;
  WEFT_CHECK(
      nn_node_new(g, name, in, 2, (const weft_dtensor *const[]){au, bu}, mul_backward, &node));
  WEFT_CHECK(nn_var_new(g, y, node, out));
  return WEFT_OK;
}

/* ------------------------------------------------------------------- scale */

static weft_status scale_backward(nn_node *n, const weft_dtensor *const *dout, weft_dtensor **din) {
  weft_dtensor *dx;
  WEFT_CHECK(nn_graph_like(nn_node_graph(n), dout[0], NULL, &dx));
  WEFT_CHECK(weft_tensor_copy(weft_dtensor_local(dx), nn_local(dout[0])));
  WEFT_CHECK(weft_scale(weft_dtensor_local(dx), n->f[0]));
  din[0] = dx;
  return WEFT_OK;
}

static weft_status scale_body(weft_var *x, double alpha, weft_var **out) {
  const char *name = "scale";
  if (!out) return weft_error(WEFT_ERR_INVALID, "scale: out is NULL");
  *out = NULL;
  weft_graph *g;
  WEFT_CHECK(nn_check_vars(name, &x, 1, &g));
  const weft_dtensor *xv = nn_var_now(x);
  WEFT_CHECK(nn_check_kernel_contig(name, &x, 1, xv, "input", WEFT_KERNEL_SCALE));
  weft_dtensor *y;
  WEFT_CHECK(nn_graph_like(g, xv, NULL, &y));
  WEFT_CHECK(weft_tensor_copy(weft_dtensor_local(y), nn_local(xv)));
  WEFT_CHECK(weft_scale(weft_dtensor_local(y), alpha));
  nn_node *node;
  WEFT_CHECK(nn_node_new(g, name, &x, 1, NULL, scale_backward, &node));
  if (node) {
    node->f[0] = alpha;
    node->reads_strided_grads = true; /* weft_tensor_copy reads dy's strides */
  }
  WEFT_CHECK(nn_var_new(g, y, node, out));
  return WEFT_OK;
}

/* ---------------------------------------------------------------------- to */

static weft_status to_backward(nn_node *n, const weft_dtensor *const *dout, weft_dtensor **din) {
  weft_graph *g = nn_node_graph(n);
  const weft_dtensor *x = nn_node_input(n, 0);
  weft_dtensor *dx;
  WEFT_CHECK(nn_graph_like(g, x, weft_dtensor_placements(dout[0]), &dx));
  WEFT_CHECK(weft_tensor_copy(weft_dtensor_local(dx), nn_local(dout[0])));
  din[0] = dx;
  return WEFT_OK;
}

weft_status weft_op_to(weft_var *x, weft_dtype dtype, weft_var **out) {
  const char *name = "to";
  nn_count_ops(1); /* the one op that does not enter through nn_mixed_begin */
  if (!out) return weft_error(WEFT_ERR_INVALID, "to: out is NULL");
  *out = NULL;
  weft_var *in[1] = {x};
  weft_graph *g;
  WEFT_CHECK(nn_check_vars(name, in, 1, &g));
  const weft_dtensor *xv = nn_var_now(x);
  weft_dtype from = weft_dtensor_dtype(xv);
  bool float_to = dtype == WEFT_F32 || dtype == WEFT_F64 || dtype == WEFT_BF16 || dtype == WEFT_F16;
  if (!float_to || !weft_dtype_is_float(from))
    return nn_op_error(WEFT_ERR_UNSUPPORTED, name, in, 1,
                       "converts between f32, f64, bf16 and f16 (asked: %s to %s)",
                       weft_dtype_name(from), weft_dtype_name(dtype));
  if (from == dtype) {
    *out = x;
    return WEFT_OK;
  }
  weft_dtensor *y;
  WEFT_CHECK(nn_graph_converted(g, xv, dtype, &y));
  nn_node *node;
  WEFT_CHECK(nn_node_new(g, name, in, 1, NULL, to_backward, &node));
  return nn_var_new(g, y, node, out);
}

/* ------------------------------------------- the ops as callers see them
 * Each runs its f32 body above through nn/mixed.c, so bf16 / f16 inputs
 * compute in f32 and keep their dtype (autograd.h, "dtypes"); add, mul and
 * scale run their body in the 16-bit dtype itself where the device's
 * kernel takes it (backend.h weft_kernel_op): the same bits, no copies. */

weft_status weft_op_linear(weft_var *x, weft_var *w, weft_var *b, weft_var **out) {
  weft_var *in[3] = {x, w, b};
  nn_mixed mx;
  WEFT_CHECK(nn_mixed_begin_kernel(&mx, "linear", in, 3, true, WEFT_KERNEL_GEMM));
  return nn_mixed_end(&mx, linear_body(in[0], in[1], in[2], out), out, out ? 1 : 0);
}

weft_status weft_op_add(weft_var *a, weft_var *b, weft_var **out) {
  weft_var *in[2] = {a, b};
  nn_mixed mx;
  WEFT_CHECK(nn_mixed_begin_kernel(&mx, "add", in, 2, false, WEFT_KERNEL_ADD));
  return nn_mixed_end(&mx, add_body(in[0], in[1], out), out, out ? 1 : 0);
}

weft_status weft_op_mul(weft_var *a, weft_var *b, weft_var **out) {
  weft_var *in[2] = {a, b};
  nn_mixed mx;
  WEFT_CHECK(nn_mixed_begin_kernel(&mx, "mul", in, 2, false, WEFT_KERNEL_MUL));
  return nn_mixed_end(&mx, mul_body(in[0], in[1], out), out, out ? 1 : 0);
}

weft_status weft_op_scale(weft_var *x, double alpha, weft_var **out) {
  weft_var *in[1] = {x};
  nn_mixed mx;
  WEFT_CHECK(nn_mixed_begin_kernel(&mx, "scale", in, 1, false, WEFT_KERNEL_SCALE));
  return nn_mixed_end(&mx, scale_body(in[0], alpha, out), out, out ? 1 : 0);
}
