/* nn/util.c — activation buffers, placement checks, gradient coercion and
 * the reductions that bring locally computed gradients to their
 * parameters' placements. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn_internal.h"

void nn_describe_pl(const weft_placement *pl, int n, char *buf, size_t cap) {
  weft_placements_describe(pl, n, buf, cap);
}

bool nn_pl_equal(const weft_placement *a, const weft_placement *b, int n) {
  for (int i = 0; i < n; i++)
    if (!weft_placement_equal(a[i], b[i])) return false;
  return true;
}

static const char *mname(const weft_module *m) { return m->fqn[0] ? m->fqn : m->name; }

weft_status nn_unsupported(const weft_module *m, int mesh_dim, const char *fmt, ...) {
  char msg[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  const char *dn = weft_mesh_dim_name(m->mesh, mesh_dim);
  return weft_error(WEFT_ERR_UNSUPPORTED, "%s '%s', mesh dim %d (%s): %s",
                    weft_module_kind_name(m->kind), mname(m), mesh_dim, dn ? dn : "?", msg);
}

static bool mesh_shape_matches(const weft_module *m, const weft_dtensor_spec *s) {
  int nd = weft_mesh_ndim(m->mesh);
  if (s->mesh_ndim != nd) return false;
  for (int i = 0; i < nd; i++)
    if (s->mesh_shape[i] != weft_mesh_dim_size(m->mesh, i)) return false;
  return true;
}

weft_status nn_check_input(const weft_module *m, const weft_dtensor *x, const char *what,
                           weft_dtype dtype, int min_ndim) {
  if (!x)
    return weft_error(WEFT_ERR_INVALID, "%s '%s': %s is NULL", weft_module_kind_name(m->kind),
                      mname(m), what);
  const weft_dtensor_spec *s = weft_dtensor_get_spec(x);
  char d[256];
  if (s->dtype != dtype || s->ndim < min_ndim) {
    weft_dtensor_spec_describe(s, d, sizeof d);
    return weft_error(WEFT_ERR_INVALID, "%s '%s': %s is %s, expected %s with >= %d dims",
                      weft_module_kind_name(m->kind), mname(m), what, d, weft_dtype_name(dtype),
                      min_ndim);
  }
  if (!mesh_shape_matches(m, s)) {
    weft_dtensor_spec_describe(s, d, sizeof d);
    return weft_error(WEFT_ERR_INVALID, "%s '%s': %s (%s) is not on a mesh of the module's shape",
                      weft_module_kind_name(m->kind), mname(m), what, d);
  }
  if (!weft_tensor_is_contiguous(weft_dtensor_local(x)))
    return weft_error(WEFT_ERR_UNSUPPORTED, "%s '%s': %s has a non-contiguous local tensor",
                      weft_module_kind_name(m->kind), mname(m), what);
  return WEFT_OK;
}

weft_status nn_ensure(weft_dtensor **slot, weft_mesh *mesh, weft_dtype dtype, int ndim,
                      const int64_t *shape, const weft_placement *pl) {
  int nd = weft_mesh_ndim(mesh);
  if (*slot) {
    const weft_dtensor_spec *s = weft_dtensor_get_spec(*slot);
    bool same = weft_dtensor_mesh(*slot) == mesh && s->dtype == dtype && s->ndim == ndim &&
                nn_pl_equal(s->placements, pl, nd);
    for (int d = 0; same && d < ndim; d++) same = s->shape[d] == shape[d];
    if (same) return WEFT_OK;
    weft_dtensor_destroy(*slot);
    *slot = NULL;
  }
  return weft_dtensor_empty(mesh, dtype, ndim, shape, pl, nd, slot);
}

weft_status nn_host_get(weft_device dev, const void *src, size_t bytes, const void **h,
                        void **tmp) {
  *tmp = NULL;
  if (dev == WEFT_CPU || bytes == 0) {
    *h = src;
    return WEFT_OK;
  }
  WEFT_CHECK(weft_alloc(WEFT_CPU, bytes, tmp));
  weft_status st = weft_memcpy(dev, *tmp, src, bytes, WEFT_COPY_D2H);
  if (st != WEFT_OK) {
    weft_free(*tmp);
    *tmp = NULL;
    return st;
  }
  *h = *tmp;
  return WEFT_OK;
}

weft_status nn_host_put(weft_device dev, void *dst, const void *src, size_t bytes) {
  if (bytes == 0) return WEFT_OK;
  if (dev == WEFT_CPU) {
    memmove(dst, src, bytes);
    return WEFT_OK;
  }
  return weft_memcpy(dev, dst, src, bytes, WEFT_COPY_H2D);
}

bool nn_scalar_load(weft_dtype dt, const void *p, double *out) {
  switch (dt) {
    case WEFT_F32:
      *out = *(const float *)p;
      return true;
    case WEFT_F64:
      *out = *(const double *)p;
      return true;
    case WEFT_BF16:
      *out = weft_bf16_to_f32(*(const uint16_t *)p);
      return true;
    case WEFT_F16:
      *out = weft_f16_to_f32(*(const uint16_t *)p);
      return true;
    default:
      return false;
  }
}

bool nn_scalar_store(weft_dtype dt, void *p, float v) {
  switch (dt) {
    case WEFT_F32:
      *(float *)p = v;
      return true;
    case WEFT_F64:
      *(double *)p = v;
      return true;
    case WEFT_BF16:
      *(uint16_t *)p = weft_f32_to_bf16(v);
      return true;
    case WEFT_F16:
      *(uint16_t *)p = weft_f32_to_f16(v);
      return true;
    default:
      return false;
  }
}

weft_status nn_scratch_reserve(nn_scratch *s, weft_device dev, int64_t floats) {
  if (floats <= s->cap && dev == s->dev) return WEFT_OK;
  void *p;
  WEFT_CHECK(weft_alloc(dev, (size_t)floats * sizeof(float), &p));
  weft_free(s->p);
  s->p = p;
  s->cap = floats;
  s->dev = dev;
  return WEFT_OK;
}

void nn_scratch_free(nn_scratch *s) {
  weft_free(s->p);
  s->p = NULL;
  s->cap = 0;
}

weft_status nn_coerce_grad(const weft_module *m, const weft_dtensor *dout,
                           const weft_dtensor_spec *out_spec, bool partial_ok,
                           const weft_dtensor **use, weft_dtensor **tmp) {
  *use = NULL;
  if (!dout)
    return weft_error(WEFT_ERR_INVALID, "%s '%s': grad is NULL", weft_module_kind_name(m->kind),
                      mname(m));
  const weft_dtensor_spec *g = weft_dtensor_get_spec(dout);
  bool ok = g->dtype == WEFT_F32 && g->ndim == out_spec->ndim && mesh_shape_matches(m, g);
  for (int d = 0; ok && d < g->ndim; d++) ok = g->shape[d] == out_spec->shape[d];
  if (!ok) {
    char a[256], b[256];
    weft_dtensor_spec_describe(g, a, sizeof a);
    weft_dtensor_spec_describe(out_spec, b, sizeof b);
    return weft_error(WEFT_ERR_INVALID, "%s '%s': grad %s does not match the output %s",
                      weft_module_kind_name(m->kind), mname(m), a, b);
  }
  bool accept = weft_tensor_is_contiguous(weft_dtensor_local(dout));
  weft_placement want[WEFT_MESH_MAX_DIMS];
  for (int i = 0; i < g->mesh_ndim; i++) {
    weft_placement o = out_spec->placements[i], p = g->placements[i];
    want[i] = nn_is_psum(o) ? weft_replicate() : o;
    /* note: the grad of a Partial value is Replicate (every partial term
     * gets the whole gradient); a Partial grad of it must be reduced. */
    if (nn_is_psum(o)) {
      if (!nn_is_r(p)) accept = false;
      continue;
    }
    if (weft_placement_equal(o, p)) continue;
    if (partial_ok && nn_is_r(o) && nn_is_psum(p)) continue;
    accept = false;
  }
  if (accept) {
    *use = dout;
    return WEFT_OK;
  }
  weft_dtensor_destroy(*tmp);
  *tmp = NULL;
  WEFT_CHECK(weft_dtensor_redistribute(dout, want, g->mesh_ndim, tmp));
  *use = *tmp;
  return WEFT_OK;
}

weft_status nn_align(const weft_dtensor *src, const weft_placement *want, const weft_dtensor **use,
                     weft_dtensor **tmp) {
  const weft_dtensor_spec *s = weft_dtensor_get_spec(src);
  if (nn_pl_equal(s->placements, want, s->mesh_ndim) &&
      weft_tensor_is_contiguous(weft_dtensor_local(src))) {
    *use = src;
    return WEFT_OK;
  }
  weft_dtensor_destroy(*tmp);
  *tmp = NULL;
  weft_redistribute_opts o = WEFT_REDISTRIBUTE_OPTS_INIT;
  o.allow_partial = true;
  WEFT_CHECK(weft_dtensor_redistribute_ex(src, want, s->mesh_ndim, &o, tmp));
  *use = *tmp;
  return WEFT_OK;
}

weft_status nn_add(weft_dtensor *dst, const weft_dtensor *a, const weft_dtensor *b,
                   weft_dtensor **tmp) {
  const weft_dtensor_spec *ds = weft_dtensor_get_spec(dst);
  const weft_dtensor_spec *bs = weft_dtensor_get_spec(b);
  bool ok = bs->ndim == ds->ndim;
  for (int d = 0; ok && d < ds->ndim; d++) ok = bs->shape[d] == ds->shape[d];
  if (!ok) {
    char x[256], y[256];
    weft_dtensor_spec_describe(ds, x, sizeof x);
    weft_dtensor_spec_describe(bs, y, sizeof y);
    return weft_error(WEFT_ERR_INVALID, "cannot add %s to %s", y, x);
  }
  const weft_dtensor *bb;
  WEFT_CHECK(nn_align(b, ds->placements, &bb, tmp));
  int64_t n = nn_numel(dst);
  if (nn_numel(a) != n || nn_numel(bb) != n)
    return weft_error(WEFT_ERR_INTERNAL, "add: local sizes %lld, %lld, %lld differ", (long long)n,
                      (long long)nn_numel(a), (long long)nn_numel(bb));
  return weft_backend_residual_forward(nn_dev(dst), nn_f32(dst), nn_f32(a), nn_f32(bb), n);
}

weft_status nn_reduce_to(weft_mesh *mesh, float *buf, const weft_dtensor_spec *like,
                         const weft_placement *have, const weft_placement *want) {
  int nd = like->mesh_ndim;
  bool only_pr = true;
  for (int i = 0; i < nd; i++) {
    if (weft_placement_equal(have[i], want[i])) continue;
    if (nn_is_psum(have[i]) && nn_is_r(want[i])) continue;
    only_pr = false;
  }
  int coords[WEFT_MESH_MAX_DIMS];
  for (int i = 0; i < nd; i++) coords[i] = weft_mesh_coord(mesh, i);
  weft_dtensor_spec hs;
  WEFT_CHECK(weft_dtensor_spec_init(&hs, nd, like->mesh_shape, have, nd, like->dtype, like->ndim,
                                    like->shape));
  int64_t lshape[WEFT_MAX_DIMS], n = 1;
  WEFT_CHECK(weft_dtensor_spec_local_shape(&hs, coords, lshape, NULL, NULL));
  for (int d = 0; d < like->ndim; d++) n *= lshape[d];
  if (only_pr) {
    for (int i = 0; i < nd; i++)
      if (!weft_placement_equal(have[i], want[i]) && like->mesh_shape[i] > 1)
        WEFT_CHECK(weft_all_reduce(mesh, i, buf, buf, n, WEFT_F32, WEFT_OP_SUM, NULL));
    return WEFT_OK;
  }
  /* general case: through redistribute, then back into buf */
  weft_tensor *view = NULL, *got = NULL;
  weft_dtensor *src = NULL, *dst = NULL;
  weft_status st;
  weft_device dev = weft_mesh_device(mesh);
  WEFT_CHECK_GOTO(weft_tensor_wrap(buf, WEFT_F32, dev, like->ndim, lshape, &view), st, done);
  WEFT_CHECK_GOTO(weft_dtensor_from_local(mesh, view, WEFT_LOCAL_VIEW, have, nd, like->shape, &src),
                  st, done);
  weft_redistribute_opts o = WEFT_REDISTRIBUTE_OPTS_INIT;
  o.allow_partial = true;
  WEFT_CHECK_GOTO(weft_dtensor_redistribute_ex(src, want, nd, &o, &dst), st, done);
  got = weft_dtensor_local(dst);
  if (weft_tensor_numel(got) != n) {
    st = weft_error(WEFT_ERR_INTERNAL, "reduce_to: local size changed (%lld -> %lld)", (long long)n,
                    (long long)weft_tensor_numel(got));
    goto done;
  }
  {
    weft_tensor *outv = NULL;
    WEFT_CHECK_GOTO(weft_tensor_wrap(buf, WEFT_F32, dev, like->ndim, got->shape, &outv), st, done);
    st = weft_tensor_copy(outv, got);
    weft_tensor_destroy(outv);
  }
done:
  weft_dtensor_destroy(dst);
  weft_dtensor_destroy(src);
  weft_tensor_destroy(view);
  return st;
}

/* A grad's spec against its parameter's: equal but for the dtype, f32
 * (also for 16-bit parameter data: FSDP's unsharded param_dtype). */
static bool grad_spec_matches(const weft_dtensor_spec *grad, const weft_dtensor_spec *data) {
  weft_dtensor_spec d = *data;
  d.dtype = WEFT_F32;
  return weft_dtensor_spec_equal(grad, &d);
}

weft_status nn_grad_get(const weft_module *m, weft_param *p, weft_dtensor **out) {
  const weft_dtensor_spec *ds = weft_dtensor_get_spec(p->data);
  if (!p->grad) {
    WEFT_CHECK(weft_dtensor_zeros(weft_dtensor_mesh(p->data), WEFT_F32, ds->ndim, ds->shape,
                                  ds->placements, ds->mesh_ndim, &p->grad));
  } else if (!grad_spec_matches(weft_dtensor_get_spec(p->grad), ds) ||
             !weft_tensor_is_contiguous(weft_dtensor_local(p->grad))) {
    char a[256], b[256];
    weft_dtensor_spec_describe(weft_dtensor_get_spec(p->grad), a, sizeof a);
    weft_dtensor_spec_describe(ds, b, sizeof b);
    return weft_error(WEFT_ERR_STATE,
                      "%s '%s': grad of '%s' is %s but its data is %s (zero_grad(set_to_none) "
                      "after changing a parameter's layout)",
                      weft_module_kind_name(m->kind), mname(m), p->fqn, a, b);
  }
  *out = p->grad;
  return WEFT_OK;
}

weft_status nn_grad_accumulate(const weft_module *m, weft_param *p, float *dw,
                               const weft_placement *have) {
  const weft_dtensor_spec *ds = weft_dtensor_get_spec(p->data);
  if (!nn_pl_equal(have, ds->placements, ds->mesh_ndim))
    WEFT_CHECK(nn_reduce_to(weft_dtensor_mesh(p->data), dw, ds, have, ds->placements));
  weft_dtensor *g;
  WEFT_CHECK(nn_grad_get(m, p, &g));
  return weft_backend_residual_forward(nn_dev(g), nn_f32(g), nn_f32(g), dw, nn_numel(g));
}
