/* tp/loss.c — loss parallel: mean cross-entropy on vocab-sharded logits
 * without gathering them (torch.distributed.tensor.parallel.loss_parallel,
 * Megatron-LM's vocab-parallel cross-entropy). The local pieces are
 * layers.h's weft_cross_entropy_local_* kernels; the reductions are
 * all-reduces over the mesh dims that shard the vocab. */
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "tp.h"

struct weft_tp_loss {
  float *buf;      /* gmax (N) | sumexp (N) | target (N) | lse (N), on `dev` */
  int64_t cap;     /* floats in buf */
  int32_t *y;      /* the targets on `dev` when it is not the CPU (N) */
  int64_t ycap;    /* int32s in y */
  weft_device dev; /* where buf and y live: the logits' device */
  bool valid;      /* a forward ran and its state is here */
  bool sharded;    /* vocab sharded on some mesh dim */
  int64_t n, v0, nv, V;
  weft_dtensor_spec spec; /* the logits' spec at forward */
};

weft_status weft_tp_loss_create(weft_tp_loss **out) {
  if (!out) return weft_error(WEFT_ERR_INVALID, "tp loss: out is NULL");
  *out = calloc(1, sizeof **out);
  if (!*out) return weft_error(WEFT_ERR_OOM, "tp loss");
  return WEFT_OK;
}

void weft_tp_loss_destroy(weft_tp_loss *l) {
  if (!l) return;
  weft_free(l->buf);
  weft_free(l->y);
  free(l);
}

/* buf of at least `floats` floats and, off the CPU, y of n int32s, on dev. */
static weft_status reserve(weft_tp_loss *l, weft_device dev, int64_t floats, int64_t n) {
  if (dev != l->dev) {
    weft_free(l->buf);
    weft_free(l->y);
    l->buf = NULL;
    l->y = NULL;
    l->cap = l->ycap = 0;
    l->dev = dev;
  }
  if (floats > l->cap) {
    void *p;
    WEFT_CHECK(weft_alloc(dev, (size_t)floats * sizeof(float), &p));
    weft_free(l->buf);
    l->buf = p;
    l->cap = floats;
  }
  if (dev != WEFT_CPU && n > l->ycap) {
    void *p;
    WEFT_CHECK(weft_alloc(dev, (size_t)n * sizeof(int32_t), &p));
    weft_free(l->y);
    l->y = p;
    l->ycap = n;
  }
  return WEFT_OK;
}

/* Checks logits and targets; finds which mesh dims shard the vocab and this
 * rank's columns. Everything here depends only on specs and the (identical)
 * targets, so every rank reaches the same verdict. */
static weft_status check_inputs(const weft_dtensor *logits, const weft_tensor *targets,
                                bool *vocab_dim, int64_t *n, int64_t *v0, int64_t *nv) {
  if (!logits || !targets)
    return weft_error(WEFT_ERR_INVALID, "tp loss: logits or targets is NULL");
  const weft_dtensor_spec *s = weft_dtensor_get_spec(logits);
  if (s->dtype != WEFT_F32)
    return weft_error(WEFT_ERR_INVALID, "tp loss: logits are %s, expected f32",
                      weft_dtype_name(s->dtype));
  if (s->ndim < 2) return weft_error(WEFT_ERR_INVALID, "tp loss: logits need >= 2 dims (..., V)");
  int last = s->ndim - 1;
  for (int i = 0; i < s->mesh_ndim; i++) {
    weft_placement p = s->placements[i];
    vocab_dim[i] = p.kind == WEFT_PLACE_SHARD && p.dim == last;
    if (p.kind != WEFT_PLACE_REPLICATE && !vocab_dim[i]) {
      char b[32];
      weft_placement_describe(p, b, sizeof b);
      return weft_error(WEFT_ERR_UNSUPPORTED,
                        "tp loss: logits placement %s on mesh dim %d: loss parallel needs "
                        "Replicate or Shard(-1) (vocab) on every mesh dim (rows whole)",
                        b, i);
    }
  }
  if (targets->dtype != WEFT_I32 || targets->ndim != last || !weft_tensor_is_contiguous(targets) ||
      targets->device != WEFT_CPU)
    return weft_error(WEFT_ERR_INVALID,
                      "tp loss: targets must be a contiguous int32 host tensor of %d dims (the "
                      "logits' rows)",
                      last);
  for (int d = 0; d < last; d++)
    if (targets->shape[d] != s->shape[d])
      return weft_error(WEFT_ERR_INVALID, "tp loss: targets dim %d is %lld, logits dim %d is %lld",
                        d, (long long)targets->shape[d], d, (long long)s->shape[d]);
  const weft_tensor *ll = weft_dtensor_local(logits);
  if (!weft_tensor_is_contiguous(ll))
    return weft_error(WEFT_ERR_UNSUPPORTED, "tp loss: local logits are not contiguous");
  int64_t V = s->shape[last], rows = 1;
  for (int d = 0; d < last; d++) rows *= s->shape[d];
  const int32_t *t = targets->data;
  for (int64_t r = 0; r < rows; r++)
    if (t[r] < 0 || t[r] >= V)
      return weft_error(WEFT_ERR_INVALID,
                        "tp loss: target %d at flat index %lld is outside "
                        "[0, %lld)",
                        t[r], (long long)r, (long long)V);
  int64_t off[WEFT_MAX_DIMS];
  if (!weft_dtensor_local_offset(logits, off))
    return weft_error(WEFT_ERR_UNSUPPORTED, "tp loss: logits shard is not one box");
  *n = rows;
  *nv = ll->shape[last];
  *v0 = *nv ? off[last] : 0;
  return WEFT_OK;
}

weft_status weft_tp_loss_forward(weft_tp_loss *l, const weft_dtensor *logits,
                                 const weft_tensor *targets, double *loss) {
  if (!l || !loss) return weft_error(WEFT_ERR_INVALID, "tp loss: state or loss is NULL");
  l->valid = false;
  bool vocab_dim[WEFT_MESH_MAX_DIMS];
  int64_t n = 0, v0 = 0, nv = 0;
  WEFT_CHECK(check_inputs(logits, targets, vocab_dim, &n, &v0, &nv));
  const weft_dtensor_spec *s = weft_dtensor_get_spec(logits);
  weft_mesh *mesh = weft_dtensor_mesh(logits);
  bool sharded = false;
  for (int i = 0; i < s->mesh_ndim; i++) sharded |= vocab_dim[i] && s->mesh_shape[i] > 1;
  const weft_device dev = weft_dtensor_local(logits)->device;
  WEFT_CHECK(reserve(l, dev, 4 * (n > 0 ? n : 1), n));
  float *gmax = l->buf, *st = gmax + n, *lse = gmax + 3 * n;
  const float *z = weft_dtensor_local(logits)->data;
  const int32_t *y = targets->data;
  if (dev != WEFT_CPU && n > 0) { /* the kernels read the targets on the device */
    WEFT_CHECK(weft_memcpy(dev, l->y, y, (size_t)n * sizeof(int32_t), WEFT_COPY_H2D));
    y = l->y;
  }
  double mean = 0.0;
  if (n == 0) {
    mean = 0.0; /* no positions: torch's mean over nothing is nan; 0 keeps the sums finite */
  } else if (!sharded) {
    WEFT_CHECK(weft_backend_cross_entropy_forward(dev, &mean, lse, z, y, n, nv));
  } else {
    /* 1. row max over the vocab shards */
    WEFT_CHECK(weft_backend_cross_entropy_local_max(dev, gmax, z, n, nv));
    for (int i = 0; i < s->mesh_ndim; i++)
      if (vocab_dim[i] && s->mesh_shape[i] > 1)
        WEFT_CHECK(weft_all_reduce(mesh, i, gmax, gmax, n, WEFT_F32, WEFT_OP_MAX, NULL));
    /* 2. sum of exponentials and target logit, summed together (2N floats) */
    WEFT_CHECK(weft_backend_cross_entropy_local_sumexp(dev, st, z, gmax, n, nv));
    WEFT_CHECK(weft_backend_cross_entropy_local_target(dev, st + n, z, y, n, v0, nv));
    for (int i = 0; i < s->mesh_ndim; i++)
      if (vocab_dim[i] && s->mesh_shape[i] > 1)
        WEFT_CHECK(weft_all_reduce(mesh, i, st, st, 2 * n, WEFT_F32, WEFT_OP_SUM, NULL));
    /* 3. lse = max + log(sum), loss = mean(lse - target) */
    WEFT_CHECK(weft_backend_cross_entropy_finish(dev, &mean, lse, gmax, st, st + n, n));
  }
  l->sharded = sharded;
  l->n = n;
  l->v0 = v0;
  l->nv = nv;
  l->V = s->shape[s->ndim - 1];
  l->spec = *s;
  l->valid = true;
  *loss = mean;
  return WEFT_OK;
}

weft_status weft_tp_loss_backward(weft_tp_loss *l, const weft_dtensor *logits,
                                  const weft_tensor *targets, double dloss, weft_dtensor *dlogits) {
  if (!l || !logits || !targets || !dlogits)
    return weft_error(WEFT_ERR_INVALID, "tp loss: NULL argument");
  if (!l->valid || !weft_dtensor_spec_equal(&l->spec, weft_dtensor_get_spec(logits)))
    return weft_error(WEFT_ERR_STATE, "tp loss: backward needs a forward on these logits");
  if (!weft_dtensor_spec_equal(&l->spec, weft_dtensor_get_spec(dlogits)))
    return weft_error(WEFT_ERR_INVALID, "tp loss: dlogits must have the logits' spec");
  if (targets->dtype != WEFT_I32 || weft_tensor_numel(targets) != l->n)
    return weft_error(WEFT_ERR_INVALID, "tp loss: targets differ from the forward's");
  const weft_tensor *dl = weft_dtensor_local(dlogits);
  if (!weft_tensor_is_contiguous(dl))
    return weft_error(WEFT_ERR_INVALID, "tp loss: dlogits local tensor is not contiguous");
  if (l->n == 0) return WEFT_OK;
  /* d mean / d z[n, v] = (softmax(z)[n, v] - [v == y_n]) / N */
  float scale = (float)(dloss / (double)l->n);
  const float *z = weft_dtensor_local(logits)->data, *lse = l->buf + 3 * l->n;
  const int32_t *y = l->dev != WEFT_CPU ? l->y : targets->data; /* as the forward's */
  if (!l->sharded)
    return weft_backend_cross_entropy_backward(dl->device, dl->data, z, lse, y, l->n, l->nv, scale);
  return weft_backend_cross_entropy_backward_local(dl->device, dl->data, z, lse, y, l->n, l->v0,
                                                   l->nv, scale);
}

static weft_status impl_forward(void *ctx, const weft_dtensor *logits, const weft_tensor *targets,
                                double *loss) {
  return weft_tp_loss_forward(ctx, logits, targets, loss);
}

static weft_status impl_backward(void *ctx, const weft_dtensor *logits, const weft_tensor *targets,
                                 double dloss, weft_dtensor *dlogits) {
  return weft_tp_loss_backward(ctx, logits, targets, dloss, dlogits);
}

static const weft_loss_impl tp_loss_impl = {impl_forward, impl_backward};

const weft_loss_impl *weft_tp_loss_impl(void) { return &tp_loss_impl; }
