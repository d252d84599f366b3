/* nn/ops_shape.c — matmul, reshape, transpose, split, cat, sum and mean:
 * forward next to backward, sharding rules per mesh dim (the pattern of
 * ops_linear.c).
 *
 * The shape ops move no data between ranks when the input's shards survive
 * them. reshape, transpose and split's pieces are views (torch's) of an
 * op's output (a graph buffer) or of a view of one: the local shard's
 * storage with a new shape and strides, no copy. Of a parameter, the
 * caller's input or an FSDP-gathered weight, whose storage may go before
 * backward, they copy the local shard, and so does a reshape that no view
 * can express. Their backwards return views of the output grad the same
 * way (graph.c's run_node packs a strided grad for a backward that reads
 * it packed). Partial values pass through them (they are linear).
 * Backward maps each output grad's placements back to the input's: a
 * shard goes back to the placement the forward used, Partial and
 * Replicate stay. matmul reads a transposed operand (or output grad) in
 * place through its GEMM's transpose flags (nn_gemm_operand).
 */
#include <string.h>

#include "autograd_internal.h"

/* A GEMM leading dim (>= 1, as BLAS wants even for empty operands). */
/* A view of t's storage (t's dtype) starting `off` elements in, with the
 * given shape and strides (NULL: contiguous). An empty view points at t's
 * data. */
static weft_status view_at(weft_tensor *v, const weft_tensor *t, int64_t off, int ndim,
                           const int64_t *shape, const int64_t *strides) {
  char *p = (char *)t->data;
  if (p && nn_prod(shape, 0, ndim) > 0) p += (size_t)off * weft_dtype_size(t->dtype);
  return weft_tensor_view_init(v, p, t->dtype, t->device, ndim, shape, strides);
}

/* dst = src over the narrow [off, off + dst's size) of src's dim `dim`
 * (from_src) or src into that narrow of dst (!from_src). Both contiguous
 * locals of the same ndim. */
static weft_status copy_narrow(weft_tensor *whole, const weft_tensor *part, int dim, int64_t off,
                               bool into_whole) {
  if (weft_tensor_numel(part) == 0) return WEFT_OK;
  weft_tensor v;
  WEFT_CHECK(
      view_at(&v, whole, off * whole->strides[dim], whole->ndim, part->shape, whole->strides));
  nn_count_copies(1);
  if (into_whole) return weft_tensor_copy(&v, part);
  return weft_tensor_copy((weft_tensor *)part, &v);
}

static weft_status normalize_dim(const char *name, weft_var *const *in, int nin, int dim, int nd,
                                 int *out) {
  if (dim < -nd || dim >= nd)
    return nn_op_error(WEFT_ERR_INVALID, name, in, nin, "dim %d out of range for %d dims", dim, nd);
  *out = dim < 0 ? dim + nd : dim;
  return WEFT_OK;
}

/* ------------------------------------------------------------------ matmul */

/* The backward reads a, b and dy through nn_gemm_operand (transposed views
 * by the GEMM's transpose flags): da = dy b^T, db = a^T dy. */
static weft_status matmul_backward(nn_node *n, const weft_dtensor *const *dout,
                                   weft_dtensor **din) {
  weft_graph *g = nn_node_graph(n);
  const weft_dtensor *dy = dout[0];
  if (!dy) return WEFT_OK;
  const weft_dtensor *a = nn_node_input(n, 0), *b = nn_node_input(n, 1);
  const weft_placement *A = weft_dtensor_placements(a), *B = weft_dtensor_placements(b),
                       *D = weft_dtensor_placements(dy);
  int k = weft_mesh_ndim(weft_dtensor_mesh(a)), last = weft_dtensor_ndim(a) - 1;
  nn_gemm_operand oa, ob, od;
  WEFT_CHECK(nn_gemm_operand_packed(g, &a, &oa));
  WEFT_CHECK(nn_gemm_operand_packed(g, &b, &ob));
  WEFT_CHECK(nn_gemm_operand_packed(g, &dy, &od));
  const weft_tensor *al = nn_local(a);
  int64_t rows = oa.rows, kl = oa.cols, nl = ob.cols;
  if (od.rows != rows || od.cols != nl || ob.rows != kl)
    return weft_error(WEFT_ERR_INTERNAL, "matmul backward: local shapes disagree");
  weft_device dev = al->device;
  if (nn_node_wants(n, 0)) {
    /* da = dy b^T */
    weft_placement p[WEFT_MESH_MAX_DIMS];
    for (int i = 0; i < k; i++) {
      if (nn_is_psum(D[i]))
        p[i] = nn_psum();
      else if (nn_is_shard_any(A[i]))
        p[i] = A[i];
      else if (nn_is_shard_any(B[i]) && B[i].dim == 1)
        p[i] = nn_psum();
      else if (nn_is_psum(B[i]))
        p[i] = nn_psum();
      else
        p[i] = nn_r();
    }
    weft_dtensor *da;
    WEFT_CHECK(nn_graph_like(g, a, p, &da));
    WEFT_CHECK(weft_backend_gemm_dt(dev, od.trans, !ob.trans, rows, kl, nl, 1.0f, al->dtype,
                                    od.data, od.ld, ob.data, ob.ld, 0.0f, al->dtype,
                                    nn_local(da)->data, nn_ld(kl), NULL));
    din[0] = da;
  }
  if (nn_node_wants(n, 1)) {
    /* db = a^T dy, summed over a's leading dims */
    weft_placement p[WEFT_MESH_MAX_DIMS];
    for (int i = 0; i < k; i++) {
      if (nn_is_psum(D[i]))
        p[i] = nn_psum();
      else if (nn_is_shard_any(A[i]) && A[i].dim < last)
        p[i] = nn_psum();
      else if (nn_is_psum(A[i]))
        p[i] = nn_psum();
      else if (nn_is_shard_any(B[i]))
        p[i] = B[i];
      else
        p[i] = nn_r();
    }
    weft_dtensor *db;
    WEFT_CHECK(nn_graph_like(g, b, p, &db));
    WEFT_CHECK(weft_backend_gemm_dt(dev, !oa.trans, od.trans, kl, nl, rows, 1.0f, al->dtype,
                                    oa.data, oa.ld, od.data, od.ld, 0.0f, al->dtype,
                                    nn_local(db)->data, nn_ld(nl), NULL));
    din[1] = db;
  }
  return WEFT_OK;
}

static weft_status matmul_body(weft_var *a, weft_var *b, weft_var **out) {
  const char *name = "matmul";
  if (!out) return weft_error(WEFT_ERR_INVALID, "matmul: out is NULL");
  *out = NULL;
  weft_var *in[2] = {a, b};
  weft_graph *g;
  /* a strided operand (a transpose, a split piece) is read in place where
   * a GEMM can (nn_gemm_operand_of), else through its contiguous copy */
  WEFT_CHECK(nn_check_vars_views(name, in, 2, &g));
  for (int i = 0; i < 2; i++) WEFT_CHECK(nn_var_gemm_ready(in[i]));
  const weft_dtensor *av = nn_var_now(a), *bv = nn_var_now(b);
  const weft_dtensor_spec *as = weft_dtensor_get_spec(av), *bs = weft_dtensor_get_spec(bv);
  WEFT_CHECK(nn_check_kernel_dtype(name, in, 2, av, "a", WEFT_KERNEL_GEMM));
  WEFT_CHECK(nn_check_kernel_dtype(name, in, 2, bv, "b", WEFT_KERNEL_GEMM));
  int na = as->ndim, last = na - 1;
  if (na < 2 || bs->ndim != 2 || as->shape[last] != bs->shape[0])
    return nn_op_error(WEFT_ERR_INVALID, name, in, 2,
                       "need a (..., M, K) and b (K, N) with the same K");
  int k = as->mesh_ndim;
  weft_sharding_option opts[WEFT_MESH_MAX_DIMS * NN_OPT_CAP];
  int nopt[WEFT_MESH_MAX_DIMS];
  for (int i = 0; i < k; i++) {
    weft_sharding_option *o = &opts[i * NN_OPT_CAP];
    int c = 0;
    weft_placement pa = as->placements[i], pb = bs->placements[i];
    o[c++] = (weft_sharding_option){{nn_r(), nn_r()}, nn_r()};
    for (int r = 0; r < last && c < NN_OPT_CAP - 8; r++)
      o[c++] = (weft_sharding_option){{nn_s(r), nn_r()}, nn_s(r)};
    o[c++] = (weft_sharding_option){{nn_r(), nn_s(1)}, nn_s(last)};
    o[c++] = (weft_sharding_option){{nn_s(last), nn_s(0)}, nn_psum()};
    if (pa.kind == WEFT_PLACE_STRIDED_SHARD && pa.dim < last)
      o[c++] = (weft_sharding_option){{pa, nn_r()}, pa};
    if (pb.kind == WEFT_PLACE_STRIDED_SHARD && pb.dim == 1)
      o[c++] = (weft_sharding_option){{nn_r(), pb}, weft_strided_shard(last, pb.split_factor)};
    if (pa.kind == WEFT_PLACE_STRIDED_SHARD && pa.dim == last &&
        pb.kind == WEFT_PLACE_STRIDED_SHARD && pb.dim == 0 && pa.split_factor == pb.split_factor)
      o[c++] = (weft_sharding_option){{pa, pb}, nn_psum()};
    o[c++] = (weft_sharding_option){{nn_psum(), nn_r()}, nn_psum()};
    o[c++] = (weft_sharding_option){{nn_r(), nn_psum()}, nn_psum()};
    nopt[i] = c;
  }
  weft_placement tgt[2 * WEFT_MESH_MAX_DIMS], opl[WEFT_MESH_MAX_DIMS];
  WEFT_CHECK(nn_choose(name, in, 2, opts, NN_OPT_CAP, nopt, false, tgt, opl));
  const weft_dtensor *au, *bu;
  WEFT_CHECK(nn_graph_bring(g, av, tgt, false, &au));
  WEFT_CHECK(nn_graph_bring(g, bv, tgt + k, false, &bu));
  int64_t oshape[WEFT_MAX_DIMS];
  memcpy(oshape, as->shape, sizeof(int64_t) * (size_t)na);
  oshape[last] = bs->shape[1];
  weft_dtensor *y;
  WEFT_CHECK(nn_graph_tensor(g, weft_dtensor_mesh(av), as->dtype, na, oshape, opl, &y));
  nn_gemm_operand oa, ob;
  WEFT_CHECK(nn_gemm_operand_packed(g, &au, &oa)); /* in place: contig copies made above */
  WEFT_CHECK(nn_gemm_operand_packed(g, &bu, &ob));
  const weft_tensor *al = nn_local(au);
  int64_t rows = oa.rows, kl = oa.cols, nl = ob.cols;
  if (rows * nl != nn_numel(y) || ob.rows != kl)
    return nn_op_error(WEFT_ERR_INTERNAL, name, in, 2, "local shapes disagree");
  WEFT_CHECK(weft_backend_gemm_dt(al->device, oa.trans, ob.trans, rows, nl, kl, 1.0f, al->dtype,
                                  oa.data, oa.ld, ob.data, ob.ld, 0.0f, al->dtype,
                                  nn_local(y)->data, nn_ld(nl), NULL));
  nn_node *node;
  WEFT_CHECK(
      nn_node_new(g, name, in, 2, (const weft_dtensor *const[]){au, bu}, matmul_backward, &node));
  if (node) node->reads_strided_grads = true; /* dy as a GEMM operand, or packed */
  WEFT_CHECK(nn_var_new(g, y, node, out));
  return WEFT_OK;
}

/* ----------------------------------------------------------------- reshape */

/* The grad of a pure relayout op (reshape, transpose): per mesh dim the
 * output grad's Partial/Replicate stays, a shard goes back to the
 * placement the input had in forward. */
static void back_placements(const weft_placement *X, const weft_placement *D, int k,
                            weft_placement *p) {
  for (int i = 0; i < k; i++) p[i] = nn_is_shard_any(D[i]) ? X[i] : D[i];
}

/* dst = src's elements in order, in dst's shape (a reshape's copy); the
 * local sizes must agree. */
static weft_status relayout_copy(const char *what, weft_tensor *dst, const weft_tensor *src) {
  if (weft_tensor_numel(dst) != weft_tensor_numel(src))
    return weft_error(WEFT_ERR_INTERNAL, "%s: local sizes %lld vs %lld", what,
                      (long long)weft_tensor_numel(dst), (long long)weft_tensor_numel(src));
  if (weft_tensor_numel(dst) == 0) return WEFT_OK;
  weft_tensor v;
  WEFT_CHECK(view_at(&v, src, 0, dst->ndim, dst->shape, NULL));
  WEFT_CHECK(weft_tensor_copy(dst, &v));
  nn_count_copies(1);
  return WEFT_OK;
}

static weft_status reshape_backward(nn_node *n, const weft_dtensor *const *dout,
                                    weft_dtensor **din) {
  const weft_dtensor *dy = dout[0];
  if (!dy || !nn_node_wants(n, 0)) return WEFT_OK;
  const weft_dtensor *x = nn_node_input(n, 0);
  int k = weft_mesh_ndim(weft_dtensor_mesh(x));
  weft_placement p[WEFT_MESH_MAX_DIMS];
  back_placements(weft_dtensor_placements(x), weft_dtensor_placements(dy), k, p);
  /* a view of dy when dy is a graph buffer (the graph adopts it as x's
   * grad but never adds into it in place: graph.c accumulate) */
  weft_graph *g = nn_node_graph(n);
  const weft_dtensor_spec *xs = weft_dtensor_get_spec(x);
  weft_dtensor *dx;
  WEFT_CHECK(nn_graph_view(g, dy, xs->ndim, xs->shape, p, &dx));
  if (!dx) {
    WEFT_CHECK(nn_graph_packed(g, dy, &dy)); /* a strided grad (sdpa's dq) no view takes */
    WEFT_CHECK(nn_graph_like(g, x, p, &dx));
    WEFT_CHECK(relayout_copy("reshape backward", weft_dtensor_local(dx), nn_local(dy)));
  }
  din[0] = dx;
  return WEFT_OK;
}

typedef struct rs_group {
  int i0, i1, o0, o1; /* input dims [i0, i1) hold the elements of output dims [o0, o1) */
} rs_group;

static int rs_groups(const int64_t *in, int n, const int64_t *out, int m, rs_group *gr) {
  int i = 0, o = 0, c = 0;
  while (i < n || o < m) {
    rs_group g = {i, i, o, o};
    int64_t pi = 1, po = 1;
    if (i < n) pi *= in[i++];
    if (o < m) po *= out[o++];
    while (pi != po) {
      if (pi < po) {
        if (i >= n) return -1;
        pi *= in[i++];
      } else {
        if (o >= m) return -1;
        po *= out[o++];
      }
    }
    g.i1 = i;
    g.o1 = o;
    gr[c++] = g;
  }
  return c;
}

/* Where a shard of input dim d lands in the output: the output dim, or -1
 * (must be replicated). M: the product of the mesh sizes sharding d. */
static int rs_shard_target(const int64_t *in, const int64_t *out, const rs_group *gr, int ng, int d,
                           int64_t M, bool strided) {
  for (int j = 0; j < ng; j++) {
    const rs_group *G = &gr[j];
    if (d < G->i0 || d >= G->i1) continue;
    int fi = -1, fo = -1;
    for (int e = G->i0; e < G->i1 && fi < 0; e++)
      if (in[e] != 1) fi = e;
    for (int e = G->o0; e < G->o1 && fo < 0; e++)
      if (out[e] != 1) fo = e;
    if (fi != d || fo < 0) return -1;
    int64_t inner_in = nn_prod(in, d + 1, G->i1), inner_out = nn_prod(out, fo + 1, G->o1);
    if (in[d] == out[fo] && inner_in == 1 && inner_out == 1) return fo; /* untouched */
    if (strided || M <= 0 || in[d] % M != 0) return -1;
    if (((in[d] / M) * inner_in) % inner_out != 0) return -1;
    return fo;
  }
  return -1;
}

static weft_status reshape_body(weft_var *x, int ndim, const int64_t *shape, weft_var **out) {
  const char *name = "reshape";
  if (!out) return weft_error(WEFT_ERR_INVALID, "reshape: out is NULL");
  *out = NULL;
  weft_graph *g;
  WEFT_CHECK(nn_check_vars_views(name, &x, 1, &g));
  const weft_dtensor *xv = nn_var_now(x);
  const weft_dtensor_spec *xs = weft_dtensor_get_spec(xv);
  WEFT_CHECK(nn_check_kernel_dtype(name, &x, 1, xv, "input", WEFT_KERNEL_COPY));
  if (ndim < 0 || ndim > WEFT_MAX_DIMS || (ndim > 0 && !shape))
    return nn_op_error(WEFT_ERR_INVALID, name, &x, 1, "bad new shape (%d dims)", ndim);
  int64_t numel = nn_prod(xs->shape, 0, xs->ndim), known = 1;
  int64_t oshape[WEFT_MAX_DIMS];
  int infer = -1;
  for (int d = 0; d < ndim; d++) {
    oshape[d] = shape[d];
    if (shape[d] == -1) {
      if (infer >= 0)
        return nn_op_error(WEFT_ERR_INVALID, name, &x, 1, "more than one -1 in the new shape");
      infer = d;
    } else if (shape[d] < 0) {
      return nn_op_error(WEFT_ERR_INVALID, name, &x, 1, "size %lld on dim %d", (long long)shape[d],
                         d);
    } else {
      known *= shape[d];
    }
  }
  if (infer >= 0) {
    if (known == 0 || numel % known != 0)
      return nn_op_error(WEFT_ERR_INVALID, name, &x, 1, "cannot infer dim %d (%lld elements)",
                         infer, (long long)numel);
    oshape[infer] = numel / known;
  }
  if (nn_prod(oshape, 0, ndim) != numel)
    return nn_op_error(WEFT_ERR_INVALID, name, &x, 1,
                       "the new shape has %lld elements, the input %lld",
                       (long long)nn_prod(oshape, 0, ndim), (long long)numel);
  rs_group gr[2 * WEFT_MAX_DIMS + 2];
  int ng = numel > 0 ? rs_groups(xs->shape, xs->ndim, oshape, ndim, gr) : -1;
  int k = xs->mesh_ndim;
  weft_sharding_option opts[WEFT_MESH_MAX_DIMS * NN_OPT_CAP];
  int nopt[WEFT_MESH_MAX_DIMS];
  for (int i = 0; i < k; i++) {
    weft_sharding_option *o = &opts[i * NN_OPT_CAP];
    int c = 0;
    weft_placement p = xs->placements[i];
    o[c++] = (weft_sharding_option){{nn_r()}, nn_r()};
    if (nn_is_linear_partial(p)) {
      o[c++] = (weft_sharding_option){{p}, p};
    } else if (nn_is_shard_any(p) && ng > 0) {
      int64_t M = 1;
      for (int j = 0; j < k; j++)
        if (nn_is_shard_any(xs->placements[j]) && xs->placements[j].dim == p.dim)
          M *= xs->mesh_shape[j];
      int to =
          rs_shard_target(xs->shape, oshape, gr, ng, p.dim, M, p.kind == WEFT_PLACE_STRIDED_SHARD);
      if (to >= 0) {
        weft_placement q = p;
        q.dim = to;
        o[c++] = (weft_sharding_option){{p}, q};
      }
    }
    nopt[i] = c;
  }
  weft_placement tgt[WEFT_MESH_MAX_DIMS], opl[WEFT_MESH_MAX_DIMS];
  WEFT_CHECK(nn_choose(name, &x, 1, opts, NN_OPT_CAP, nopt, false, tgt, opl));
  const weft_dtensor *xu;
  WEFT_CHECK(nn_graph_bring(g, xv, tgt, false, &xu));
  /* a view of a graph buffer or of a view of one (torch's view, also of
   * strided data where the new shape allows one): no copy; a parameter, an
   * input of the caller's or an FSDP-gathered weight, whose storage may go
   * before backward, is copied, and so is a strided value that no view
   * can reshape (through its contiguous copy) */
  weft_dtensor *y;
  WEFT_CHECK(nn_graph_view(g, xu, ndim, oshape, opl, &y));
  if (!y && !weft_tensor_is_contiguous(nn_local(xu))) {
    WEFT_CHECK(nn_var_contig(x));
    xu = nn_var_now(x);
    WEFT_CHECK(nn_graph_view(g, xu, ndim, oshape, opl, &y)); /* of that copy (a graph buffer) */
  }
  if (!y) {
    WEFT_CHECK(nn_graph_tensor(g, weft_dtensor_mesh(xv), xs->dtype, ndim, oshape, opl, &y));
    WEFT_CHECK(relayout_copy(name, weft_dtensor_local(y), nn_local(xu)));
  }
  nn_node *node;
  WEFT_CHECK(
      nn_node_new(g, name, &x, 1, (const weft_dtensor *const[]){xu}, reshape_backward, &node));
  if (node) node->reads_strided_grads = true; /* a view of dy, or its packed copy */
  WEFT_CHECK(nn_var_new(g, y, node, out));
  return WEFT_OK;
}

/* --------------------------------------------------------------- transpose */

static void swap_pl(weft_placement *p, int k, int d0, int d1) {
  for (int i = 0; i < k; i++)
    if (nn_is_shard_any(p[i])) {
      if (p[i].dim == d0)
        p[i].dim = d1;
      else if (p[i].dim == d1)
        p[i].dim = d0;
    }
}

/* t's shape and strides with dims d0 and d1 swapped. */
static void swapped(const weft_tensor *t, int d0, int d1, int64_t *sh, int64_t *st) {
  for (int d = 0; d < t->ndim; d++) {
    sh[d] = t->shape[d];
    st[d] = t->strides[d];
  }
  int64_t u = sh[d0];
  sh[d0] = sh[d1];
  sh[d1] = u;
  u = st[d0];
  st[d0] = st[d1];
  st[d1] = u;
}

/* dst (contiguous) = src (any strides) with dims d0 and d1 swapped. */
static weft_status copy_transposed(weft_tensor *dst, const weft_tensor *src, int d0, int d1) {
  if (weft_tensor_numel(dst) == 0) return WEFT_OK;
  int64_t sh[WEFT_MAX_DIMS], st[WEFT_MAX_DIMS];
  swapped(src, d0, d1, sh, st);
  weft_tensor v;
  WEFT_CHECK(view_at(&v, src, 0, src->ndim, sh, st));
  nn_count_copies(1);
  return weft_tensor_copy(dst, &v);
}

/* x with dims d0 and d1 swapped, global `shape` and placements pl: a view
 * (the swapped strides over x's storage) when x is a graph buffer or a
 * view of one, else a new buffer holding the copy. */
static weft_status transposed(weft_graph *g, const weft_dtensor *x, int d0, int d1,
                              const int64_t *shape, const weft_placement *pl, weft_dtensor **out) {
  const weft_tensor *xl = nn_local(x);
  int64_t sh[WEFT_MAX_DIMS], st[WEFT_MAX_DIMS];
  swapped(xl, d0, d1, sh, st);
  const int nd = xl->ndim;
  WEFT_CHECK(nn_graph_as_strided(g, x, nd, shape, pl, 0, st, out));
  if (*out) return WEFT_OK;
  WEFT_CHECK(nn_graph_tensor(g, weft_dtensor_mesh(x), weft_dtensor_dtype(x), nd, shape, pl, out));
  return copy_transposed(weft_dtensor_local(*out), xl, d0, d1);
}

/* dy (maybe strided: the backward reads it through its strides) goes back
 * swapped: a view of it when it is a graph buffer or a view of one (the
 * graph adopts a view as x's grad without adding into it in place:
 * graph.c accumulate). */
static weft_status transpose_backward(nn_node *n, const weft_dtensor *const *dout,
                                      weft_dtensor **din) {
  const weft_dtensor *dy = dout[0];
  if (!dy || !nn_node_wants(n, 0)) return WEFT_OK;
  const weft_dtensor *x = nn_node_input(n, 0);
  int k = weft_mesh_ndim(weft_dtensor_mesh(x)), d0 = (int)n->i[0], d1 = (int)n->i[1];
  weft_placement p[WEFT_MESH_MAX_DIMS];
  memcpy(p, weft_dtensor_placements(dy), sizeof(weft_placement) * (size_t)k);
  swap_pl(p, k, d0, d1);
  const weft_dtensor_spec *xs = weft_dtensor_get_spec(x);
  weft_dtensor *dx;
  WEFT_CHECK(transposed(nn_node_graph(n), dy, d0, d1, xs->shape, p, &dx));
  din[0] = dx;
  return WEFT_OK;
}

static weft_status transpose_body(weft_var *x, int d0, int d1, weft_var **out) {
  const char *name = "transpose";
  if (!out) return weft_error(WEFT_ERR_INVALID, "transpose: out is NULL");
  *out = NULL;
  weft_graph *g;
  WEFT_CHECK(nn_check_vars_views(name, &x, 1, &g));
  const weft_dtensor *xv = nn_var_now(x);
  const weft_dtensor_spec *xs = weft_dtensor_get_spec(xv);
  WEFT_CHECK(nn_check_kernel_dtype(name, &x, 1, xv, "input", WEFT_KERNEL_COPY));
  int nd = xs->ndim, k = xs->mesh_ndim;
  WEFT_CHECK(normalize_dim(name, &x, 1, d0, nd, &d0));
  WEFT_CHECK(normalize_dim(name, &x, 1, d1, nd, &d1));
  /* every placement has an image (shards follow their dims): no choice */
  weft_placement opl[WEFT_MESH_MAX_DIMS];
  memcpy(opl, xs->placements, sizeof(weft_placement) * (size_t)k);
  swap_pl(opl, k, d0, d1);
  int64_t oshape[WEFT_MAX_DIMS];
  memcpy(oshape, xs->shape, sizeof(int64_t) * (size_t)nd);
  oshape[d0] = xs->shape[d1];
  oshape[d1] = xs->shape[d0];
  /* torch's transpose: a view of a graph buffer or of a view of one (a
   * strided value too); a parameter, the caller's input or an
   * FSDP-gathered weight, whose storage may go before backward, is
   * copied (a strided copy) */
  weft_dtensor *y;
  WEFT_CHECK(transposed(g, xv, d0, d1, oshape, opl, &y));
  nn_node *node;
  WEFT_CHECK(nn_node_new(g, name, &x, 1, NULL, transpose_backward, &node));
  if (node) {
    node->i[0] = d0;
    node->i[1] = d1;
    node->reads_strided_grads = true; /* dy's view or strided copy */
  }
  WEFT_CHECK(nn_var_new(g, y, node, out));
  return WEFT_OK;
}

/* ------------------------------------------------------------ split / cat */

/* The placements (per mesh dim) the grads of several outputs of one
 * placement list `out` are brought to before a backward combines them:
 * where the output is Replicate, Partial(sum) if any grad is, else
 * Replicate; Replicate where the output is Partial; else the output's. */
static void common_grad_pl(const weft_placement *out, const weft_dtensor *const *dout, int n, int k,
                           weft_placement *want) {
  for (int i = 0; i < k; i++) {
    if (nn_is_r(out[i])) {
      want[i] = nn_r();
      for (int j = 0; j < n; j++)
        if (dout[j] && nn_is_psum(weft_dtensor_placements(dout[j])[i])) want[i] = nn_psum();
    } else if (out[i].kind == WEFT_PLACE_PARTIAL) {
      want[i] = nn_r();
    } else {
      want[i] = out[i];
    }
  }
}

/* The graph buffer whose slices along dim the pieces' grads use[0..np)
 * are, in order and covering it, when it has dx's spec (x's shape and
 * dtype, placements p): sdpa's backward writes dq, dk, dv so into one
 * buffer, which then is dx without a copy. NULL otherwise. */
static const weft_dtensor *sliced_grad(weft_graph *g, const weft_dtensor *x,
                                       const weft_placement *p, const weft_dtensor *const *use,
                                       int np, int dim) {
  const weft_dtensor *base = nn_graph_view_base(g, use[0]);
  if (!base) return NULL;
  const weft_dtensor_spec *bs = weft_dtensor_get_spec(base), *xs = weft_dtensor_get_spec(x);
  if (bs->dtype != xs->dtype || bs->ndim != xs->ndim ||
      !nn_pl_equal(bs->placements, p, bs->mesh_ndim))
    return NULL;
  for (int d = 0; d < bs->ndim; d++)
    if (bs->shape[d] != xs->shape[d]) return NULL;
  const weft_tensor *bl = nn_local(base);
  if (!weft_tensor_is_contiguous(bl)) return NULL;
  const size_t es = weft_dtype_size(bl->dtype);
  int64_t off = 0;
  for (int j = 0; j < np; j++) {
    if (nn_graph_view_base(g, use[j]) != base) return NULL;
    const weft_tensor *ul = nn_local(use[j]);
    if ((const char *)ul->data != (const char *)bl->data + (size_t)(off * bl->strides[dim]) * es)
      return NULL;
    for (int d = 0; d < bl->ndim; d++)
      if (ul->strides[d] != bl->strides[d] || (d != dim && ul->shape[d] != bl->shape[d]))
        return NULL;
    off += ul->shape[dim];
  }
  return off == bl->shape[dim] ? base : NULL;
}

static weft_status split_backward(nn_node *n, const weft_dtensor *const *dout, weft_dtensor **din) {
  if (!nn_node_wants(n, 0)) return WEFT_OK;
  weft_graph *g = nn_node_graph(n);
  const weft_dtensor *x = nn_node_input(n, 0);
  int k = weft_mesh_ndim(weft_dtensor_mesh(x)), dim = (int)n->i[0], np = n->nout;
  const weft_placement *X = weft_dtensor_placements(x);
  weft_placement G[WEFT_MESH_MAX_DIMS], p[WEFT_MESH_MAX_DIMS];
  common_grad_pl(weft_dtensor_placements(n->out[0]->value), dout, np, k, G);
  for (int i = 0; i < k; i++) p[i] = nn_is_shard_any(G[i]) ? X[i] : G[i];
  const weft_dtensor *use[NN_MAX_OUT];
  bool all = true;
  for (int j = 0; j < np; j++) {
    use[j] = NULL;
    if (dout[j]) WEFT_CHECK(nn_graph_bring(g, dout[j], G, true, &use[j]));
    all = all && use[j];
  }
  const weft_dtensor *whole = all ? sliced_grad(g, x, p, use, np, dim) : NULL;
  if (whole) {
    din[0] = (weft_dtensor *)whole;
    return WEFT_OK;
  }
  weft_dtensor *dx;
  WEFT_CHECK(nn_graph_like(g, x, p, &dx));
  weft_tensor *dxl = weft_dtensor_local(dx);
  int64_t off = 0;
  for (int j = 0; j < np; j++) {
    const weft_dtensor *o = n->out[j]->value;
    const weft_dtensor *piece = use[j];
    if (!piece) {
      /* no grad reached piece j: zeros of its local shape under G */
      weft_dtensor *z;
      WEFT_CHECK(nn_graph_zeros(g, weft_dtensor_mesh(o), weft_dtensor_dtype(o),
                                weft_dtensor_ndim(o), weft_dtensor_shape(o), G, &z));
      piece = z;
    }
    const weft_tensor *l = nn_local(piece);
    const int64_t len = l->shape[dim];
    if (off + len > dxl->shape[dim])
      return weft_error(WEFT_ERR_INTERNAL, "split backward: pieces exceed the input");
    WEFT_CHECK(copy_narrow(dxl, l, dim, off, true));
    off += len;
  }
  if (off != dxl->shape[dim])
    return weft_error(WEFT_ERR_INTERNAL, "split backward: pieces cover %lld of %lld",
                      (long long)off, (long long)dxl->shape[dim]);
  din[0] = dx;
  return WEFT_OK;
}

static weft_status split_body(weft_var *x, int dim, int n, const int64_t *sizes, weft_var **outs) {
  const char *name = "split";
  if (!outs) return weft_error(WEFT_ERR_INVALID, "split: outs is NULL");
  if (n < 1 || n > NN_MAX_OUT || !sizes)
    return weft_error(WEFT_ERR_INVALID, "split: %d pieces (1..%d) or sizes NULL", n, NN_MAX_OUT);
  for (int j = 0; j < n; j++) outs[j] = NULL;
  weft_graph *g;
  WEFT_CHECK(nn_check_vars_views(name, &x, 1, &g));
  const weft_dtensor *xv = nn_var_now(x);
  const weft_dtensor_spec *xs = weft_dtensor_get_spec(xv);
  WEFT_CHECK(nn_check_kernel_dtype(name, &x, 1, xv, "input", WEFT_KERNEL_COPY));
  int nd = xs->ndim, k = xs->mesh_ndim;
  WEFT_CHECK(normalize_dim(name, &x, 1, dim, nd, &dim));
  int64_t total = 0;
  bool equal = true;
  for (int j = 0; j < n; j++) {
    if (sizes[j] < 0)
      return nn_op_error(WEFT_ERR_INVALID, name, &x, 1, "piece %d has size %lld", j,
                         (long long)sizes[j]);
    total += sizes[j];
    equal = equal && sizes[j] == sizes[0];
  }
  if (total != xs->shape[dim])
    return nn_op_error(WEFT_ERR_INVALID, name, &x, 1, "sizes sum to %lld, dim %d has %lld",
                       (long long)total, dim, (long long)xs->shape[dim]);
  weft_sharding_option opts[WEFT_MESH_MAX_DIMS * NN_OPT_CAP];
  int nopt[WEFT_MESH_MAX_DIMS];
  for (int i = 0; i < k; i++) {
    weft_sharding_option *o = &opts[i * NN_OPT_CAP];
    int c = 0;
    weft_placement p = xs->placements[i];
    o[c++] = (weft_sharding_option){{nn_r()}, nn_r()};
    if (p.kind == WEFT_PLACE_PARTIAL || (nn_is_shard_any(p) && p.dim != dim))
      o[c++] = (weft_sharding_option){{p}, p};
    else if (p.kind == WEFT_PLACE_STRIDED_SHARD && p.dim == dim && p.split_factor == n && equal &&
             n > 1)
      o[c++] = (weft_sharding_option){{p}, nn_s(dim)};
    else if (p.kind == WEFT_PLACE_SHARD && p.dim == dim && equal && n > 1)
      /* equal pieces of a dim sharded whole (a fused q|k|v projection under
       * colwise TP): an all-to-all to StridedShard(dim, n) leaves every
       * piece sharded, cheaper than gathering the input */
      o[c++] = (weft_sharding_option){{weft_strided_shard(dim, n)}, nn_s(dim)};
    nopt[i] = c;
  }
  weft_placement tgt[WEFT_MESH_MAX_DIMS], opl[WEFT_MESH_MAX_DIMS];
  WEFT_CHECK(nn_choose(name, &x, 1, opts, NN_OPT_CAP, nopt, false, tgt, opl));
  const weft_dtensor *xu;
  WEFT_CHECK(nn_graph_bring(g, xv, tgt, false, &xu));
  const weft_tensor *xl = nn_local(xu);
  weft_dtensor *ys[NN_MAX_OUT];
  int64_t off = 0;
  /* each piece is the local slice [off, off + len) of dim: a view of a
   * graph buffer (or of a view of one) with the input's strides, else
   * (the caller's input, a parameter) a copy */
  for (int j = 0; j < n; j++) {
    int64_t s[WEFT_MAX_DIMS];
    memcpy(s, xs->shape, sizeof(int64_t) * (size_t)nd);
    s[dim] = sizes[j];
    WEFT_CHECK(nn_graph_as_strided(g, xu, nd, s, opl, off * xl->strides[dim], xl->strides, &ys[j]));
    const bool view = ys[j] != NULL;
    if (!view) WEFT_CHECK(nn_graph_tensor(g, weft_dtensor_mesh(xv), xs->dtype, nd, s, opl, &ys[j]));
    weft_tensor *yl = weft_dtensor_local(ys[j]);
    if (off + yl->shape[dim] > xl->shape[dim])
      return nn_op_error(WEFT_ERR_INTERNAL, name, &x, 1, "local pieces exceed the input");
    if (!view) WEFT_CHECK(copy_narrow((weft_tensor *)xl, yl, dim, off, false));
    off += yl->shape[dim];
  }
  if (off != xl->shape[dim])
    return nn_op_error(WEFT_ERR_INTERNAL, name, &x, 1, "local pieces cover %lld of %lld",
                       (long long)off, (long long)xl->shape[dim]);
  nn_node *node;
  WEFT_CHECK(nn_node_new(g, name, &x, 1, (const weft_dtensor *const[]){xu}, split_backward, &node));
  if (node) {
    node->i[0] = dim;
    node->reads_strided_grads = true; /* sliced_grad, or strided copies into dx */
  }
  for (int j = 0; j < n; j++) WEFT_CHECK(nn_var_new(g, ys[j], node, &outs[j]));
  return WEFT_OK;
}

static weft_status cat_backward(nn_node *n, const weft_dtensor *const *dout, weft_dtensor **din) {
  const weft_dtensor *dy = dout[0];
  if (!dy) return WEFT_OK;
  weft_graph *g = nn_node_graph(n);
  int k = weft_mesh_ndim(weft_dtensor_mesh(dy)), dim = (int)n->i[0];
  const weft_placement *D = weft_dtensor_placements(dy);
  const weft_tensor *dyl = nn_local(dy);
  int64_t off = 0;
  for (int j = 0; j < n->nin; j++) {
    const weft_dtensor *x = nn_node_input(n, j);
    const weft_placement *X = weft_dtensor_placements(x);
    weft_placement p[WEFT_MESH_MAX_DIMS];
    for (int i = 0; i < k; i++) p[i] = nn_is_shard_any(D[i]) ? X[i] : D[i];
    weft_dtensor *dx;
    WEFT_CHECK(nn_graph_like(g, x, p, &dx));
    weft_tensor *l = weft_dtensor_local(dx);
    if (off + l->shape[dim] > dyl->shape[dim])
      return weft_error(WEFT_ERR_INTERNAL, "cat backward: pieces exceed the output");
    WEFT_CHECK(copy_narrow((weft_tensor *)dyl, l, dim, off, false));
    off += l->shape[dim];
    if (nn_node_wants(n, j)) din[j] = dx;
  }
  return WEFT_OK;
}

static weft_status cat_body(weft_var *const *xs, int n, int dim, weft_var **out) {
  const char *name = "cat";
  if (!out) return weft_error(WEFT_ERR_INVALID, "cat: out is NULL");
  *out = NULL;
  if (!xs || n < 1 || n > NN_MAX_IN)
    return weft_error(WEFT_ERR_INVALID, "cat: %d inputs (1..%d)", n, NN_MAX_IN);
  weft_graph *g;
  WEFT_CHECK(nn_check_vars(name, xs, n, &g));
  const weft_dtensor *v[NN_MAX_IN];
  const weft_dtensor_spec *s[NN_MAX_IN];
  for (int j = 0; j < n; j++) {
    v[j] = nn_var_now(xs[j]);
    s[j] = weft_dtensor_get_spec(v[j]);
    WEFT_CHECK(nn_check_kernel_contig(name, xs, n, v[j], "input", WEFT_KERNEL_COPY));
  }
  int nd = s[0]->ndim, k = s[0]->mesh_ndim;
  WEFT_CHECK(normalize_dim(name, xs, n, dim, nd, &dim));
  int64_t oshape[WEFT_MAX_DIMS];
  memcpy(oshape, s[0]->shape, sizeof(int64_t) * (size_t)nd);
  oshape[dim] = 0;
  bool equal = true;
  for (int j = 0; j < n; j++) {
    bool ok = s[j]->ndim == nd;
    for (int d = 0; ok && d < nd; d++) ok = d == dim || s[j]->shape[d] == s[0]->shape[d];
    if (!ok)
      return nn_op_error(WEFT_ERR_INVALID, name, xs, n,
                         "inputs must have equal shapes except on dim %d", dim);
    oshape[dim] += s[j]->shape[dim];
    equal = equal && s[j]->shape[dim] == s[0]->shape[dim];
  }
  weft_sharding_option opts[WEFT_MESH_MAX_DIMS * NN_OPT_CAP];
  int nopt[WEFT_MESH_MAX_DIMS];
  for (int i = 0; i < k; i++) {
    weft_sharding_option *o = &opts[i * NN_OPT_CAP];
    int c = 0;
    weft_sharding_option t;
    memset(&t, 0, sizeof t);
#define ALL(pl, outp)                               \
  do {                                              \
    for (int j_ = 0; j_ < n; j_++) t.in[j_] = (pl); \
    t.out = (outp);                                 \
    o[c++] = t;                                     \
  } while (0)
    ALL(nn_r(), nn_r());
    for (int d = 0; d < nd && c < NN_OPT_CAP - 4; d++)
      if (d != dim) ALL(nn_s(d), nn_s(d));
    for (int j = 0; j < n && c < NN_OPT_CAP - 2; j++) {
      weft_placement p = s[j]->placements[i];
      if (p.kind == WEFT_PLACE_STRIDED_SHARD && p.dim != dim) ALL(p, p);
    }
    /* the inverse of split's strided case: equal pieces each Shard(dim)
     * make the Megatron fused layout */
    if (equal && n > 1) ALL(nn_s(dim), weft_strided_shard(dim, n));
    ALL(nn_psum(), nn_psum());
#undef ALL
    nopt[i] = c;
  }
  weft_placement tgt[NN_MAX_IN * WEFT_MESH_MAX_DIMS], opl[WEFT_MESH_MAX_DIMS];
  WEFT_CHECK(nn_choose(name, xs, n, opts, NN_OPT_CAP, nopt, true, tgt, opl));
  const weft_dtensor *u[NN_MAX_IN];
  for (int j = 0; j < n; j++) WEFT_CHECK(nn_graph_bring(g, v[j], tgt + j * k, true, &u[j]));
  weft_dtensor *y;
  WEFT_CHECK(nn_graph_tensor(g, weft_dtensor_mesh(v[0]), s[0]->dtype, nd, oshape, opl, &y));
  weft_tensor *yl = weft_dtensor_local(y);
  int64_t off = 0;
  for (int j = 0; j < n; j++) {
    const weft_tensor *l = nn_local(u[j]);
    if (off + l->shape[dim] > yl->shape[dim])
      return nn_op_error(WEFT_ERR_INTERNAL, name, xs, n, "local pieces exceed the output");
    WEFT_CHECK(copy_narrow(yl, l, dim, off, true));
    off += l->shape[dim];
  }
  if (off != yl->shape[dim])
    return nn_op_error(WEFT_ERR_INTERNAL, name, xs, n, "local pieces cover %lld of %lld",
                       (long long)off, (long long)yl->shape[dim]);
  nn_node *node;
  WEFT_CHECK(nn_node_new(g, name, xs, n, u, cat_backward, &node));
  if (node) {
    node->i[0] = dim;
  }
  WEFT_CHECK(nn_var_new(g, y, node, out));
  return WEFT_OK;
}

/* -------------------------------------------------------------- sum / mean */

static weft_status reduce_backward(nn_node *n, const weft_dtensor *const *dout,
                                   weft_dtensor **din) {
  const weft_dtensor *dy = dout[0];
  if (!dy || !nn_node_wants(n, 0)) return WEFT_OK;
  const weft_dtensor *x = nn_node_input(n, 0);
  int k = weft_mesh_ndim(weft_dtensor_mesh(x)), d = (int)n->i[0];
  const weft_placement *X = weft_dtensor_placements(x), *D = weft_dtensor_placements(dy);
  weft_placement p[WEFT_MESH_MAX_DIMS];
  for (int i = 0; i < k; i++) {
    if (nn_is_shard_any(X[i]) && X[i].dim == d)
      p[i] = X[i]; /* the grad is broadcast */
    else if (nn_is_shard_any(D[i]))
      p[i] = X[i];
    else
      p[i] = D[i];
  }
  weft_dtensor *dx;
  WEFT_CHECK(nn_graph_like(nn_node_graph(n), x, p, &dx));
  weft_tensor *dxl = weft_dtensor_local(dx);
  if (weft_tensor_numel(dxl) > 0) {
    /* dy's local viewed with dim d kept (size 1) and broadcast (stride 0) */
    const weft_tensor *dyl = nn_local(dy);
    int64_t st[WEFT_MAX_DIMS], inner = 1;
    for (int e = dxl->ndim - 1; e >= 0; e--) {
      if (e == d) {
        st[e] = 0;
      } else {
        st[e] = inner;
        inner *= dxl->shape[e];
      }
    }
    if (inner != weft_tensor_numel(dyl))
      return weft_error(WEFT_ERR_INTERNAL, "%s backward: local sizes disagree", n->name);
    weft_tensor v;
    WEFT_CHECK(view_at(&v, dyl, 0, dxl->ndim, dxl->shape, st));
    WEFT_CHECK(weft_tensor_copy(dxl, &v));
    if (n->f[0] != 1.0) WEFT_CHECK(weft_scale(dxl, n->f[0]));
  }
  din[0] = dx;
  return WEFT_OK;
}

static weft_status reduce_op(weft_var *x, int dim, bool keepdim, bool mean, weft_var **out) {
  const char *name = mean ? "mean" : "sum";
  if (!out) return weft_error(WEFT_ERR_INVALID, "%s: out is NULL", name);
  *out = NULL;
  weft_graph *g;
  WEFT_CHECK(nn_check_vars(name, &x, 1, &g));
  const weft_dtensor *xv = nn_var_now(x);
  const weft_dtensor_spec *xs = weft_dtensor_get_spec(xv);
  /* sum: in the storage dtype (weft_reduce's double sums, rounded once as
   * the widened f32 sum then rounded is); mean widens (its scale after
   * the sum would round twice) */
  WEFT_CHECK(nn_check_kernel_contig(name, &x, 1, xv, "input",
                                    mean ? WEFT_KERNEL_OP_COUNT : WEFT_KERNEL_REDUCE));
  int nd = xs->ndim, k = xs->mesh_ndim, d = 0;
  if (nd < 1) return nn_op_error(WEFT_ERR_INVALID, name, &x, 1, "a 0-d input");
  WEFT_CHECK(normalize_dim(name, &x, 1, dim, nd, &d));
  weft_sharding_option opts[WEFT_MESH_MAX_DIMS * NN_OPT_CAP];
  int nopt[WEFT_MESH_MAX_DIMS];
  for (int i = 0; i < k; i++) {
    weft_sharding_option *o = &opts[i * NN_OPT_CAP];
    int c = 0;
    weft_placement p = xs->placements[i];
    o[c++] = (weft_sharding_option){{nn_r()}, nn_r()};
    if (nn_is_shard_any(p) && p.dim == d) {
      o[c++] = (weft_sharding_option){{p}, nn_psum()};
    } else if (nn_is_shard_any(p)) {
      weft_placement q = p;
      if (!keepdim && q.dim > d) q.dim--;
      o[c++] = (weft_sharding_option){{p}, q};
    } else if (nn_is_linear_partial(p)) {
      o[c++] = (weft_sharding_option){{p}, p};
    }
    nopt[i] = c;
  }
  weft_placement tgt[WEFT_MESH_MAX_DIMS], opl[WEFT_MESH_MAX_DIMS];
  WEFT_CHECK(nn_choose(name, &x, 1, opts, NN_OPT_CAP, nopt, false, tgt, opl));
  const weft_dtensor *xu;
  WEFT_CHECK(nn_graph_bring(g, xv, tgt, false, &xu));
  int64_t oshape[WEFT_MAX_DIMS];
  int ond = 0;
  for (int e = 0; e < nd; e++) {
    if (e != d)
      oshape[ond++] = xs->shape[e];
    else if (keepdim)
      oshape[ond++] = 1;
  }
  weft_dtensor *y;
  WEFT_CHECK(nn_graph_tensor(g, weft_dtensor_mesh(xv), xs->dtype, ond, oshape, opl, &y));
  weft_tensor *yl = weft_dtensor_local(y);
  const weft_tensor *xl = nn_local(xu);
  int64_t ks[WEFT_MAX_DIMS];
  for (int e = 0; e < nd; e++) ks[e] = e == d ? 1 : xl->shape[e];
  if (nn_prod(ks, 0, nd) != weft_tensor_numel(yl))
    return nn_op_error(WEFT_ERR_INTERNAL, name, &x, 1, "local sizes disagree");
  if (weft_tensor_numel(yl) > 0) {
    weft_tensor v;
    WEFT_CHECK(view_at(&v, yl, 0, nd, ks, NULL));
    WEFT_CHECK(weft_reduce(xl, WEFT_REDUCE_SUM, d, &v));
    if (mean) WEFT_CHECK(weft_scale(yl, 1.0 / (double)xs->shape[d]));
  }
  nn_node *node;
  WEFT_CHECK(
      nn_node_new(g, name, &x, 1, (const weft_dtensor *const[]){xu}, reduce_backward, &node));
  if (node) {
    node->i[0] = d;
    node->f[0] = mean ? 1.0 / (double)xs->shape[d] : 1.0;
  }
  return nn_var_new(g, y, node, out);
}

static weft_status sum_body(weft_var *x, int dim, bool keepdim, weft_var **out) {
  WEFT_CHECK(reduce_op(x, dim, keepdim, false, out));
  return WEFT_OK;
}

static weft_status mean_f32(weft_var *x, int dim, bool keepdim, weft_var **out) {
  WEFT_CHECK(reduce_op(x, dim, keepdim, true, out));
  return WEFT_OK;
}

/* ------------------------------------------- the ops as callers see them
 * Each runs its f32 body above through nn/mixed.c, so bf16 / f16 inputs
 * compute in f32 and keep their dtype (autograd.h, "dtypes"). */

weft_status weft_op_matmul(weft_var *a, weft_var *b, weft_var **out) {
  weft_var *in[2] = {a, b};
  nn_mixed mx;
  WEFT_CHECK(nn_mixed_begin_kernel(&mx, "matmul", in, 2, true, WEFT_KERNEL_GEMM));
  return nn_mixed_end(&mx, matmul_body(in[0], in[1], out), out, out ? 1 : 0);
}

weft_status weft_op_reshape(weft_var *x, int ndim, const int64_t *shape, weft_var **out) {
  weft_var *in[1] = {x};
  nn_mixed mx;
  WEFT_CHECK(nn_mixed_begin_kernel(&mx, "reshape", in, 1, false, WEFT_KERNEL_COPY));
  return nn_mixed_end(&mx, reshape_body(in[0], ndim, shape, out), out, out ? 1 : 0);
}

weft_status weft_op_transpose(weft_var *x, int d0, int d1, weft_var **out) {
  weft_var *in[1] = {x};
  nn_mixed mx;
  WEFT_CHECK(nn_mixed_begin_kernel(&mx, "transpose", in, 1, false, WEFT_KERNEL_COPY));
  return nn_mixed_end(&mx, transpose_body(in[0], d0, d1, out), out, out ? 1 : 0);
}

weft_status weft_op_split(weft_var *x, int dim, int n, const int64_t *sizes, weft_var **outs) {
  weft_var *in[1] = {x};
  nn_mixed mx;
  WEFT_CHECK(nn_mixed_begin_kernel(&mx, "split", in, 1, false, WEFT_KERNEL_COPY));
  return nn_mixed_end(&mx, split_body(in[0], dim, n, sizes, outs), outs,
                      outs && n >= 1 && n <= NN_MAX_OUT ? n : 0);
}

weft_status weft_op_sum(weft_var *x, int dim, bool keepdim, weft_var **out) {
  weft_var *in[1] = {x};
  nn_mixed mx;
  WEFT_CHECK(nn_mixed_begin_kernel(&mx, "sum", in, 1, false, WEFT_KERNEL_REDUCE));
  return nn_mixed_end(&mx, sum_body(in[0], dim, keepdim, out), out, out ? 1 : 0);
}

weft_status weft_op_mean(weft_var *x, int dim, bool keepdim, weft_var **out) {
  weft_var *in[1] = {x};
  nn_mixed mx;
  WEFT_CHECK(nn_mixed_begin(&mx, "mean", in, 1, false));
  return nn_mixed_end(&mx, mean_f32(in[0], dim, keepdim, out), out, out ? 1 : 0);
}

weft_status weft_op_cat(weft_var *const *xs, int n, int dim, weft_var **out) {
  if (!xs || n < 1 || n > NN_MAX_IN) return cat_body(xs, n, dim, out); /* its error */
  weft_var *in[NN_MAX_IN];
  memcpy(in, xs, sizeof *in * (size_t)n);
  nn_mixed mx;
  WEFT_CHECK(nn_mixed_begin_kernel(&mx, "cat", in, n, false, WEFT_KERNEL_COPY));
  return nn_mixed_end(&mx, cat_body(in, n, dim, out), out, out ? 1 : 0);
}
