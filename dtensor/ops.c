/* dtensor/ops.c — sharding propagation for the ops the transformer needs.
 *
 * Like PyTorch's op strategies (torch/distributed/tensor/_ops/_matrix_ops.py,
 * _pointwise_ops.py, _math_ops.py): every mesh dim picks one of a short list
 * of (input placements -> output placement) options. The combination the
 * inputs already satisfy costs nothing; otherwise the combination whose
 * input redistributions the planner prices lowest (bytes sent per rank) is
 * taken, the inputs are redistributed, and the op runs on the local shards.
 */
#include <stdlib.h>
#include <string.h>

#include "dtensor_internal.h"

#define MAX_OPTS 24
#define MAX_COMBOS 65536

typedef struct opt {
  weft_placement a, b, out;
} opt;

static weft_status same_inputs(const weft_dtensor *a, const weft_dtensor *b, const char *op) {
  if (!a || !b) return weft_error(WEFT_ERR_INVALID, "%s: input is NULL", op);
  if (!dt_same_mesh(a->mesh, b->mesh)) {
    char ma[256], mb[256];
    weft_mesh_describe(a->mesh, ma, sizeof ma);
    weft_mesh_describe(b->mesh, mb, sizeof mb);
    return weft_error(WEFT_ERR_INVALID, "%s: inputs live on different meshes (%s vs %s)", op, ma,
                      mb);
  }
  if (a->spec.dtype != b->spec.dtype)
    return weft_error(WEFT_ERR_INVALID, "%s: dtypes differ (%s vs %s)", op,
                      weft_dtype_name(a->spec.dtype), weft_dtype_name(b->spec.dtype));
  return WEFT_OK;
}

static bool is_linear_partial(weft_placement p) {
  return p.kind == WEFT_PLACE_PARTIAL && (p.op == WEFT_OP_SUM || p.op == WEFT_OP_AVG);
}

weft_status weft_sharding_choose(const weft_dtensor_spec *const *in, int nin, int k,
                                 const weft_sharding_option *opts, int cap, const int *nopt,
                                 bool allow_partial, weft_placement *targets,
                                 weft_placement *out_best) {
  if (nin < 0 || nin > WEFT_SHARDING_MAX_INPUTS || k < 0 || k > WEFT_MESH_MAX_DIMS || !opts ||
      !nopt || !out_best || (nin > 0 && (!in || !targets)))
    return weft_error(WEFT_ERR_INVALID, "sharding_choose: bad arguments (nin %d, mesh dims %d)",
                      nin, k);
  int best[WEFT_MESH_MAX_DIMS] = {0};
  int64_t total = 1;
  for (int i = 0; i < k; i++) {
    if (nopt[i] < 1 || nopt[i] > cap)
      return weft_error(WEFT_ERR_INVALID, "sharding_choose: mesh dim %d has %d options (1..%d)", i,
                        nopt[i], cap);
    total *= nopt[i];
  }
  if (total > MAX_COMBOS)
    return weft_error(WEFT_ERR_UNSUPPORTED, "%lld sharding combinations to price (limit %d)",
                      (long long)total, MAX_COMBOS);
  double best_cost = 1e300;
  int idx[WEFT_MESH_MAX_DIMS] = {0};
  bool found = false;
  for (int64_t c = 0; c < total; c++) {
    int64_t r = c;
    for (int i = k - 1; i >= 0; i--) {
      idx[i] = (int)(r % nopt[i]);
      r /= nopt[i];
    }
    int op = -1;
    bool mixed = false;
    for (int i = 0; i < k; i++) {
      weft_placement o = opts[i * cap + idx[i]].out;
      if (o.kind == WEFT_PLACE_PARTIAL) {
        if (op >= 0 && op != (int)o.op) mixed = true;
        op = (int)o.op;
      }
    }
    if (mixed) continue;
    double cost = 0;
    bool ok = true;
    for (int a = 0; a < nin && ok; a++) {
      if (!in[a]) continue;
      weft_placement t[WEFT_MESH_MAX_DIMS];
      for (int i = 0; i < k; i++) t[i] = opts[i * cap + idx[i]].in[a];
      double ca = 0;
      if (dt_plan_cost(in[a], t, allow_partial, &ca) != WEFT_OK) ok = false;
      cost += ca;
    }
    if (ok && cost < best_cost) {
      best_cost = cost;
      memcpy(best, idx, sizeof idx);
      found = true;
    }
  }
  weft_clear_error();
  if (!found) return weft_error(WEFT_ERR_UNSUPPORTED, "no sharding strategy applies");
  for (int i = 0; i < k; i++) {
    const weft_sharding_option *o = &opts[i * cap + best[i]];
    for (int a = 0; a < nin; a++) targets[a * k + i] = o->in[a];
    out_best[i] = o->out;
  }
  return WEFT_OK;
}

/* The two-input form the ops below use. */
static weft_status choose(const weft_dtensor *a, const weft_dtensor *b, int k, opt opts[][MAX_OPTS],
                          const int *nopt, bool allow_partial, weft_placement *ta_best,
                          weft_placement *tb_best, weft_placement *to_best) {
  static __thread weft_sharding_option so[WEFT_MESH_MAX_DIMS * MAX_OPTS];
  for (int i = 0; i < k; i++)
    for (int j = 0; j < nopt[i]; j++) {
      so[i * MAX_OPTS + j].in[0] = opts[i][j].a;
      so[i * MAX_OPTS + j].in[1] = opts[i][j].b;
      so[i * MAX_OPTS + j].out = opts[i][j].out;
    }
  const weft_dtensor_spec *specs[2] = {&a->spec, b ? &b->spec : NULL};
  weft_placement t[2 * WEFT_MESH_MAX_DIMS];
  WEFT_CHECK(weft_sharding_choose(specs, 2, k, so, MAX_OPTS, nopt, allow_partial, t, to_best));
  memcpy(ta_best, t, (size_t)k * sizeof *t);
  memcpy(tb_best, t + k, (size_t)k * sizeof *t);
  return WEFT_OK;
}

/* Redistributes `in` to placements `to` unless it already has them; *tmp
 * receives a new DTensor to destroy (or NULL), *use the one to compute on. */
static weft_status bring(const weft_dtensor *in, const weft_placement *to, bool allow_partial,
                         weft_dtensor **tmp, const weft_dtensor **use) {
  *tmp = NULL;
  *use = in;
  if (dt_placements_equal(in->spec.placements, to, in->spec.mesh_ndim)) return WEFT_OK;
  weft_redistribute_opts o = WEFT_REDISTRIBUTE_OPTS_INIT;
  o.allow_partial = allow_partial;
  WEFT_CHECK(weft_dtensor_redistribute_ex(in, to, in->spec.mesh_ndim, &o, tmp));
  *use = *tmp;
  return WEFT_OK;
}

static weft_status contiguous_local(const weft_tensor *t, weft_tensor **tmp,
                                    const weft_tensor **use) {
  *tmp = NULL;
  *use = t;
  if (weft_tensor_is_contiguous(t)) return WEFT_OK;
  WEFT_CHECK(weft_tensor_clone(t, tmp));
  *use = *tmp;
  return WEFT_OK;
}

/* Wraps a local result as a DTensor after checking its shape against the
 * geometry of the output spec (an internal invariant). */
static weft_status finish(weft_mesh *mesh, const weft_dtensor_spec *spec, weft_tensor *local,
                          weft_dtensor **out) {
  int me[WEFT_MESH_MAX_DIMS];
  int64_t want[WEFT_MAX_DIMS];
  dt_my_coords(mesh, me);
  weft_status st = weft_dtensor_spec_local_shape(spec, me, want, NULL, NULL);
  for (int d = 0; st == WEFT_OK && d < spec->ndim; d++)
    if (want[d] != local->shape[d])
      st = weft_error(WEFT_ERR_INTERNAL,
                      "op result has local size %lld on dim %d, geometry says %lld",
                      (long long)local->shape[d], d, (long long)want[d]);
  if (st == WEFT_OK) st = dt_wrap(mesh, spec, local, true, out);
  if (st != WEFT_OK) weft_tensor_destroy(local);
  return st;
}

/* -------------------------------------------------------------- matmul */

static weft_status mm(const weft_dtensor *a, const weft_dtensor *b, bool trans_b, const char *name,
                      weft_dtensor **out) {
  if (!out) return weft_error(WEFT_ERR_INVALID, "%s: out is NULL", name);
  *out = NULL;
  WEFT_CHECK(same_inputs(a, b, name));
  int na = a->spec.ndim;
  if (na < (trans_b ? 1 : 2) || b->spec.ndim != 2)
    return weft_error(WEFT_ERR_INVALID, "%s: need a of >= %d dims and a 2-d %s, got %d and %d dims",
                      name, trans_b ? 1 : 2, trans_b ? "weight" : "b", na, b->spec.ndim);
  int ka = na - 1, kb = trans_b ? 1 : 0, nb = trans_b ? 0 : 1;
  if (a->spec.shape[ka] != b->spec.shape[kb])
    return weft_error(WEFT_ERR_INVALID, "%s: contracting sizes differ (%lld vs %lld)", name,
                      (long long)a->spec.shape[ka], (long long)b->spec.shape[kb]);
  weft_dtype dt = a->spec.dtype;
  if (dt != WEFT_F32 && dt != WEFT_F64 && dt != WEFT_BF16)
    return weft_error(WEFT_ERR_UNSUPPORTED, "%s: dtype %s (f32, f64, bf16 only)", name,
                      weft_dtype_name(dt));
  int k = a->spec.mesh_ndim;
  static __thread opt opts[WEFT_MESH_MAX_DIMS][MAX_OPTS];
  int nopt[WEFT_MESH_MAX_DIMS] = {0};
  for (int i = 0; i < k; i++) {
    int n = 0;
    weft_placement pa = a->spec.placements[i], pb = b->spec.placements[i];
    opts[i][n++] = (opt){weft_replicate(), weft_replicate(), weft_replicate()};
    for (int r = 0; r < na - 1; r++)
      opts[i][n++] = (opt){weft_shard(r), weft_replicate(), weft_shard(r)};
    opts[i][n++] = (opt){weft_replicate(), weft_shard(nb), weft_shard(na - 1)};
    opts[i][n++] = (opt){weft_shard(ka), weft_shard(kb), weft_partial(WEFT_OP_SUM)};
    /* the inputs' own strided shards */
    if (pa.kind == WEFT_PLACE_STRIDED_SHARD && pa.dim < na - 1)
      opts[i][n++] = (opt){pa, weft_replicate(), pa};
    if (pb.kind == WEFT_PLACE_STRIDED_SHARD && pb.dim == nb)
      opts[i][n++] = (opt){weft_replicate(), pb, weft_strided_shard(na - 1, pb.split_factor)};
    if (pa.kind == WEFT_PLACE_STRIDED_SHARD && pa.dim == ka &&
        pb.kind == WEFT_PLACE_STRIDED_SHARD && pb.dim == kb && pa.split_factor == pb.split_factor)
      opts[i][n++] = (opt){pa, pb, weft_partial(WEFT_OP_SUM)};
    /* partial inputs stay partial through a linear op */
    if (is_linear_partial(pa)) opts[i][n++] = (opt){pa, weft_replicate(), pa};
    if (is_linear_partial(pb)) opts[i][n++] = (opt){weft_replicate(), pb, pb};
    nopt[i] = n;
  }
  weft_placement ta[WEFT_MESH_MAX_DIMS], tb[WEFT_MESH_MAX_DIMS], to[WEFT_MESH_MAX_DIMS];
  WEFT_CHECK(choose(a, b, k, opts, nopt, false, ta, tb, to));
  int64_t oshape[WEFT_MAX_DIMS];
  for (int d = 0; d < na - 1; d++) oshape[d] = a->spec.shape[d];
  oshape[na - 1] = b->spec.shape[nb];
  weft_dtensor_spec ospec;
  WEFT_CHECK(weft_dtensor_spec_init(&ospec, k, a->spec.mesh_shape, to, k, dt, na, oshape));
  weft_dtensor *ra = NULL, *rb = NULL;
  const weft_dtensor *ua, *ub;
  weft_tensor *ca = NULL, *cb = NULL, *res = NULL;
  const weft_tensor *la, *lb;
  weft_status st;
  WEFT_CHECK_GOTO(bring(a, ta, false, &ra, &ua), st, done);
  WEFT_CHECK_GOTO(bring(b, tb, false, &rb, &ub), st, done);
  WEFT_CHECK_GOTO(contiguous_local(ua->local, &ca, &la), st, done);
  WEFT_CHECK_GOTO(contiguous_local(ub->local, &cb, &lb), st, done);
  {
    int64_t rows = 1;
    for (int d = 0; d < na - 1; d++) rows *= la->shape[d];
    int64_t kl = la->shape[na - 1], nl = lb->shape[nb];
    int64_t rshape[WEFT_MAX_DIMS];
    for (int d = 0; d < na - 1; d++) rshape[d] = la->shape[d];
    rshape[na - 1] = nl;
    WEFT_CHECK_GOTO(weft_tensor_zeros(dt, la->device, na, rshape, &res), st, done);
    if (rows > 0 && nl > 0 && kl > 0) {
      weft_tensor a2, c2;
      int64_t as[2] = {rows, kl}, cs[2] = {rows, nl};
      WEFT_CHECK_GOTO(weft_tensor_view_init(&a2, la->data, dt, la->device, 2, as, NULL), st, done);
      WEFT_CHECK_GOTO(weft_tensor_view_init(&c2, res->data, dt, res->device, 2, cs, NULL), st,
                      done);
      WEFT_CHECK_GOTO(weft_gemm(false, trans_b, 1.0f, &a2, lb, 0.0f, &c2), st, done);
    }
  }
  st = finish(a->mesh, &ospec, res, out);
  res = NULL;
done:
  weft_tensor_destroy(res);
  weft_tensor_destroy(ca);
  weft_tensor_destroy(cb);
  weft_dtensor_destroy(ra);
  weft_dtensor_destroy(rb);
  if (st != WEFT_OK) weft_error_trace(st, __func__);
  return st;
}

weft_status weft_dtensor_matmul(const weft_dtensor *a, const weft_dtensor *b, weft_dtensor **out) {
  WEFT_CHECK(mm(a, b, false, "matmul", out));
  return WEFT_OK;
}

weft_status weft_dtensor_linear(const weft_dtensor *x, const weft_dtensor *w, weft_dtensor **out) {
  WEFT_CHECK(mm(x, w, true, "linear", out));
  return WEFT_OK;
}

/* ---------------------------------------------------------- elementwise */

static weft_status elementwise(const weft_dtensor *a, const weft_dtensor *b, bool is_add,
                               weft_dtensor **out) {
  const char *name = is_add ? "add" : "mul";
  if (!out) return weft_error(WEFT_ERR_INVALID, "%s: out is NULL", name);
  *out = NULL;
  WEFT_CHECK(same_inputs(a, b, name));
  if (a->spec.ndim != b->spec.ndim ||
      memcmp(a->spec.shape, b->spec.shape, (size_t)a->spec.ndim * sizeof(int64_t)) != 0) {
    char da[512], db[512];
    weft_dtensor_spec_describe(&a->spec, da, sizeof da);
    weft_dtensor_spec_describe(&b->spec, db, sizeof db);
    return weft_error(WEFT_ERR_INVALID, "%s: global shapes differ (%s vs %s)", name, da, db);
  }
  if (!weft_dtype_is_float(a->spec.dtype))
    return weft_error(WEFT_ERR_UNSUPPORTED, "%s: dtype %s (float dtypes only)", name,
                      weft_dtype_name(a->spec.dtype));
  int k = a->spec.mesh_ndim, nd = a->spec.ndim;
  static __thread opt opts[WEFT_MESH_MAX_DIMS][MAX_OPTS];
  int nopt[WEFT_MESH_MAX_DIMS] = {0};
  for (int i = 0; i < k; i++) {
    int n = 0;
    weft_placement pa = a->spec.placements[i], pb = b->spec.placements[i];
    opts[i][n++] = (opt){weft_replicate(), weft_replicate(), weft_replicate()};
    for (int d = 0; d < nd; d++) opts[i][n++] = (opt){weft_shard(d), weft_shard(d), weft_shard(d)};
    if (pa.kind == WEFT_PLACE_STRIDED_SHARD) opts[i][n++] = (opt){pa, pa, pa};
    if (pb.kind == WEFT_PLACE_STRIDED_SHARD && !weft_placement_equal(pa, pb))
      opts[i][n++] = (opt){pb, pb, pb};
    if (is_add) {
      /* P + P -> P for linear ops; a replicate side is partitioned (R -> P) */
      if (is_linear_partial(pa)) opts[i][n++] = (opt){pa, pa, pa};
      if (is_linear_partial(pb) && !weft_placement_equal(pa, pb)) opts[i][n++] = (opt){pb, pb, pb};
    } else {
      if (is_linear_partial(pa)) opts[i][n++] = (opt){pa, weft_replicate(), pa};
      if (is_linear_partial(pb)) opts[i][n++] = (opt){weft_replicate(), pb, pb};
    }
    nopt[i] = n;
  }
  weft_placement ta[WEFT_MESH_MAX_DIMS], tb[WEFT_MESH_MAX_DIMS], to[WEFT_MESH_MAX_DIMS];
  WEFT_CHECK(choose(a, b, k, opts, nopt, is_add, ta, tb, to));
  weft_dtensor_spec ospec;
  WEFT_CHECK(dt_spec_with(&a->spec, to, k, &ospec));
  weft_dtensor *ra = NULL, *rb = NULL;
  const weft_dtensor *ua, *ub;
  weft_tensor *res = NULL;
  weft_status st;
  WEFT_CHECK_GOTO(bring(a, ta, is_add, &ra, &ua), st, done);
  WEFT_CHECK_GOTO(bring(b, tb, is_add, &rb, &ub), st, done);
  WEFT_CHECK_GOTO(weft_tensor_create(ospec.dtype, ua->local->device, nd, ua->local->shape, &res),
                  st, done);
  if (is_add)
    WEFT_CHECK_GOTO(weft_add(res, ua->local, ub->local), st, done);
  else
    WEFT_CHECK_GOTO(weft_mul(res, ua->local, ub->local), st, done);
  st = finish(a->mesh, &ospec, res, out);
  res = NULL;
done:
  weft_tensor_destroy(res);
  weft_dtensor_destroy(ra);
  weft_dtensor_destroy(rb);
  if (st != WEFT_OK) weft_error_trace(st, __func__);
  return st;
}

weft_status weft_dtensor_add(const weft_dtensor *a, const weft_dtensor *b, weft_dtensor **out) {
  WEFT_CHECK(elementwise(a, b, true, out));
  return WEFT_OK;
}

weft_status weft_dtensor_mul(const weft_dtensor *a, const weft_dtensor *b, weft_dtensor **out) {
  WEFT_CHECK(elementwise(a, b, false, out));
  return WEFT_OK;
}

/* ---------------------------------------------------------- reductions */

static weft_status reduce_dim(const weft_dtensor *x, int dim, bool keepdim, bool mean,
                              weft_dtensor **out) {
  const char *name = mean ? "mean" : "sum";
  if (!out) return weft_error(WEFT_ERR_INVALID, "%s: out is NULL", name);
  *out = NULL;
  if (!x) return weft_error(WEFT_ERR_INVALID, "%s: input is NULL", name);
  int nd = x->spec.ndim, k = x->spec.mesh_ndim;
  if (nd < 1 || dim < -nd || dim >= nd)
    return weft_error(WEFT_ERR_INVALID, "%s: dim %d out of range for a %d-dim tensor", name, dim,
                      nd);
  int d = dim < 0 ? dim + nd : dim;
  if (!weft_dtype_is_float(x->spec.dtype))
    return weft_error(WEFT_ERR_UNSUPPORTED, "%s: dtype %s (float dtypes only)", name,
                      weft_dtype_name(x->spec.dtype));
  /* input placements to compute on: P(max|min) cannot pass through a sum;
   * a P(avg) that would meet the P(sum) of a sharded dim is reduced too */
  weft_placement ti[WEFT_MESH_MAX_DIMS], to[WEFT_MESH_MAX_DIMS];
  bool shards_d = false;
  for (int i = 0; i < k; i++) {
    weft_placement p = x->spec.placements[i];
    if (weft_placement_is_shard(p) && p.dim == d) shards_d = true;
  }
  for (int i = 0; i < k; i++) {
    weft_placement p = x->spec.placements[i];
    if (p.kind == WEFT_PLACE_PARTIAL &&
        (!is_linear_partial(p) || (shards_d && p.op != WEFT_OP_SUM)))
      p = weft_replicate();
    ti[i] = p;
    if (weft_placement_is_shard(p) && p.dim == d) {
      to[i] = weft_partial(WEFT_OP_SUM);
    } else if (weft_placement_is_shard(p)) {
      to[i] = p;
      if (!keepdim && p.dim > d) to[i].dim--;
    } else {
      to[i] = p;
    }
  }
  int64_t oshape[WEFT_MAX_DIMS];
  int ond = 0;
  for (int e = 0; e < nd; e++) {
    if (e == d) {
      if (keepdim) oshape[ond++] = 1;
    } else {
      oshape[ond++] = x->spec.shape[e];
    }
  }
  weft_dtensor_spec ospec;
  WEFT_CHECK(
      weft_dtensor_spec_init(&ospec, k, x->spec.mesh_shape, to, k, x->spec.dtype, ond, oshape));
  weft_dtensor *rx = NULL;
  const weft_dtensor *ux;
  weft_tensor *kept = NULL, *res = NULL;
  weft_status st;
  WEFT_CHECK_GOTO(bring(x, ti, false, &rx, &ux), st, done);
  {
    int64_t ks[WEFT_MAX_DIMS];
    for (int e = 0; e < nd; e++) ks[e] = e == d ? 1 : ux->local->shape[e];
    WEFT_CHECK_GOTO(weft_tensor_create(x->spec.dtype, ux->local->device, nd, ks, &kept), st, done);
    WEFT_CHECK_GOTO(weft_reduce(ux->local, WEFT_REDUCE_SUM, d, kept), st, done);
    if (mean) WEFT_CHECK_GOTO(weft_scale(kept, 1.0 / (double)x->spec.shape[d]), st, done);
    if (keepdim) {
      res = kept;
      kept = NULL;
    } else {
      int64_t rs[WEFT_MAX_DIMS];
      int r = 0;
      for (int e = 0; e < nd; e++)
        if (e != d) rs[r++] = ks[e];
      WEFT_CHECK_GOTO(weft_tensor_create(x->spec.dtype, kept->device, r, rs, &res), st, done);
      WEFT_CHECK_GOTO(
          weft_memcpy(kept->device, res->data, kept->data, weft_tensor_nbytes(res), WEFT_COPY_D2D),
          st, done);
    }
  }
  st = finish(x->mesh, &ospec, res, out);
  res = NULL;
done:
  weft_tensor_destroy(res);
  weft_tensor_destroy(kept);
  weft_dtensor_destroy(rx);
  if (st != WEFT_OK) weft_error_trace(st, __func__);
  return st;
}

weft_status weft_dtensor_sum(const weft_dtensor *x, int dim, bool keepdim, weft_dtensor **out) {
  WEFT_CHECK(reduce_dim(x, dim, keepdim, false, out));
  return WEFT_OK;
}

weft_status weft_dtensor_mean(const weft_dtensor *x, int dim, bool keepdim, weft_dtensor **out) {
  WEFT_CHECK(reduce_dim(x, dim, keepdim, true, out));
  return WEFT_OK;
}
