/* fsdp/comm.c — a group's communication: unshard (copy-in, all-gather,
 * copy-out), reshard (free, or keep 1/k for a post-forward group of k
 * ranks), and the gradient reduction (copy-in, reduce-scatter, HSDP
 * all-reduce, average, accumulate into the sharded grads). The flat
 * layout is described in fsdp_internal.h. */
#include <stdlib.h>
#include <string.h>

#include "fsdp_internal.h"

/* FSDP's device collectives run on streams of their own (mesh.h,
 * weft_comm_stream_set): use_stream(s) switches to s and returns the
 * caller's, which the caller puts back with use_stream(prev). */
static weft_stream_id use_stream(weft_stream_id s) {
  weft_stream_id prev = WEFT_STREAM_COMM;
  (void)weft_comm_stream_set(s, &prev); /* cannot fail for FSDP's streams */
  return prev;
}

static char *elem(void *base, int64_t i, weft_dtype dt) {
  return (char *)base + (size_t)i * weft_dtype_size(dt);
}

/* f->nparams pieces (freed by the caller), or NULL with an error set. */
static weft_flat_piece *pieces_new(const weft_fsdp *f, int64_t per_param) {
  int64_t n = (int64_t)f->nparams * per_param;
  weft_flat_piece *p = calloc((size_t)(n > 0 ? n : 1), sizeof *p);
  if (!p) weft_error(WEFT_ERR_OOM, "fsdp: %lld flat pieces", (long long)n);
  return p;
}

/* Block r of the flat layout (S elements of dt at dst): each parameter's
 * rows chunk r taken from src(fp) (the tp-local tensor: f32, or the
 * unsharded param_dtype copy; NULL for zeros), padding zeroed; one flat_pack on dev, where dst and
 * the sources live (the group's device; the host for an offloaded shard). from_shard: src is this
 * rank's shard (r must be f->coord), whose row 0 is the chunk's first row. */
typedef const weft_tensor *(*src_fn)(const fsdp_param *fp);

static weft_status pack_block(const weft_fsdp *f, weft_device dev, int r, void *dst, weft_dtype dt,
                              src_fn src, bool from_shard) {
  weft_flat_piece *pc = pieces_new(f, f->max_blocks);
  if (!pc) return weft_last_status();
  int npc = 0;
  for (int i = 0; i < f->nparams; i++) {
    const fsdp_param *fp = &f->params[i];
    const weft_tensor *t = src(fp);
    const char *s = t ? t->data : NULL;
    size_t es = t ? weft_dtype_size(t->dtype) : 0;
    int64_t done = 0; /* rows of the chunk so far */
    for (int b = 0; b < fp->nblocks; b++) {
      int64_t start, len;
      fsdp__chunk_run(fp, f->nshard, r, b, &start, &len);
      weft_flat_piece *q = &pc[npc++];
      q->data = s ? (void *)(s + (size_t)((from_shard ? done : start) * fp->rest) * es) : NULL;
      q->dtype = t ? t->dtype : WEFT_F32;
      q->offset = fp->offset + done * fp->rest;
      q->count = len * fp->rest;
      done += len;
      q->pad = b == fp->nblocks - 1 ? (fp->pad_rows - done) * fp->rest : 0;
    }
  }
  weft_status st = weft_backend_flat_pack(dev, dst, dt, pc, npc);
  free(pc);
  return st;
}

static const weft_tensor *src_sharded(const fsdp_param *fp) {
  return weft_dtensor_local(fp->sharded);
}
static const weft_tensor *src_unsharded(const fsdp_param *fp) {
  return weft_dtensor_local(fp->unsharded);
}
/* the unsharded grad taken at post-backward (NULL = no grad: zeros) */
static const weft_tensor *src_grad(const fsdp_param *fp) {
  return fp->acc_grad ? weft_dtensor_local(fp->acc_grad) : NULL;
}

/* The offloaded group's pinned host staging buffer of at least `bytes`
 * (one block): made once and reused every step, so the copies to and from
 * the device run from page-locked memory (at full speed, no staging by the
 * driver) and the step allocates nothing on the host. */
static weft_status offload_stage(weft_fsdp *f, size_t bytes, void **out) {
  if (f->stage_bytes < bytes) {
    weft_free_pinned(f->dev, f->stage);
    f->stage = NULL;
    f->stage_bytes = 0;
    WEFT_CHECK(weft_alloc_pinned(f->dev, bytes, &f->stage));
    f->stage_bytes = bytes;
  }
  *out = f->stage;
  return WEFT_OK;
}

/* This rank's block of the flat layout from its shards into dst (S
 * elements of dt on the group's device). Offloaded shards are packed on the
 * host into the pinned staging buffer and copied over (a blocking copy:
 * the buffer is free again when it returns). */
static weft_status pack_shard(weft_fsdp *f, void *dst, weft_dtype dt) {
  if (!f->offload) return pack_block(f, f->dev, f->coord, dst, dt, src_sharded, true);
  size_t bytes = (size_t)f->block * weft_dtype_size(dt);
  void *host;
  WEFT_CHECK(offload_stage(f, bytes, &host));
  WEFT_CHECK(pack_block(f, WEFT_CPU, f->coord, host, dt, src_sharded, true));
  return weft_memcpy(f->dev, dst, host, bytes, WEFT_COPY_H2D);
}

static int64_t dt_bytes(const weft_dtensor *d) {
  return d ? (int64_t)weft_tensor_nbytes(weft_dtensor_local(d)) : 0;
}

/* ------------------------------------------------------------- unshard */

weft_status fsdp__unshard_start(weft_fsdp *f, bool prefetch) {
  if (f->state != FSDP_SHARDED) return WEFT_OK;
  int64_t n = f->nshard, S = f->block;
  weft_dtype dt = f->ag_dtype;
  size_t bytes = (size_t)(n * S) * weft_dtype_size(dt);
  void *buf;
  const weft_device dev = f->dev;
  WEFT_CHECK(weft_alloc(dev, bytes, &buf));
  fsdp__mem_add_unsharded_params((int64_t)bytes);
  weft_status st;
  weft_work *w = NULL;
  weft_stream_id prev = use_stream(fsdp__collective_stream(false));
  if (f->small_buf) {
    /* the post-forward 1/k: part j = blocks [j n/k, (j+1) n/k), gathered over k ranks */
    int k = weft_mesh_dim_size(f->small_mesh, 1);
    int j = weft_mesh_coord(f->small_mesh, 1);
    int64_t L = (n / k) * S;
    st = weft_memcpy(dev, elem(buf, j * L, dt), f->small_buf, f->small_bytes, WEFT_COPY_D2D);
    fsdp__drop_small(f);
    if (!st) st = weft_all_gather(f->small_mesh, 1, elem(buf, j * L, dt), buf, L, dt, &w);
    if (!st) fsdp__comm_add(&f->comm.small_all_gather, (int64_t)bytes, k, false);
    f->ag_small = true;
  } else {
    st = pack_shard(f, elem(buf, f->coord * S, dt), dt);
    if (!st)
      st = weft_all_gather(f->dp_mesh, f->shard_dim, elem(buf, f->coord * S, dt), buf, S, dt, &w);
    if (!st) fsdp__comm_add(&f->comm.all_gather, (int64_t)bytes, (int)n, false);
    f->ag_small = false;
  }
  use_stream(prev);
  if (st) {
    weft_free(buf);
    fsdp__mem_add_unsharded_params(-(int64_t)bytes);
    return weft_error_trace(st, __func__);
  }
  f->ag_buf = buf;
  f->ag_bytes = bytes;
  f->ag_work = w;
  f->state = FSDP_UNSHARDING;
  f->unshard_epoch++;
  fsdp__event(WEFT_FSDP_EV_UNSHARD_START, f, prefetch, f->root ? f->root->in_backward : false);
  return WEFT_OK;
}

static void free_ag(weft_fsdp *f) {
  if (!f->ag_buf) return;
  weft_free(f->ag_buf);
  fsdp__mem_add_unsharded_params(-(int64_t)f->ag_bytes);
  f->ag_buf = NULL;
  f->ag_bytes = 0;
}

weft_status fsdp__unshard_wait(weft_fsdp *f) {
  if (f->state == FSDP_UNSHARDED) return WEFT_OK;
  if (f->state == FSDP_SHARDED) WEFT_CHECK(fsdp__unshard_start(f, false));
  weft_status st = weft_work_wait(f->ag_work);
  f->ag_work = NULL;
  if (st) {
    /* the all-gather failed: nothing was swapped; back to sharded */
    free_ag(f);
    f->state = FSDP_SHARDED;
    return weft_error_trace(st, __func__);
  }
  /* copy-out into unsharded parameters on the model mesh: chunk r of each
   * parameter from block r, one flat_split on the group's device */
  int64_t n = f->nshard, S = f->block;
  weft_dtype dt = f->ag_dtype;
  weft_flat_piece *pc = pieces_new(f, n * f->max_blocks);
  int npc = 0;
  if (!pc) st = weft_last_status();
  for (int i = 0; i < f->nparams && !st; i++) {
    fsdp_param *fp = &f->params[i];
    const weft_dtensor_spec *ps = &fp->p->spec;
    st = weft_dtensor_empty(fp->p->mesh, fp->unsharded_dtype, ps->ndim, ps->shape, ps->placements,
                            ps->mesh_ndim, &fp->unsharded);
    if (st) break;
    fsdp__mem_add_unsharded_params(dt_bytes(fp->unsharded));
    char *u = weft_dtensor_local(fp->unsharded)->data;
    size_t es = weft_dtype_size(fp->unsharded_dtype);
    for (int64_t r = 0; r < n; r++) {
      int64_t done = 0;
      for (int b = 0; b < fp->nblocks; b++) {
        int64_t start, len;
        fsdp__chunk_run(fp, n, r, b, &start, &len);
        weft_flat_piece *q = &pc[npc++];
        q->data = u + (size_t)(start * fp->rest) * es;
        q->dtype = fp->unsharded_dtype;
        q->offset = r * S + fp->offset + done * fp->rest;
        q->count = len * fp->rest;
        done += len;
      }
    }
  }
  if (!st) st = weft_backend_flat_split(f->dev, f->ag_buf, dt, pc, npc);
  free(pc);
  free_ag(f);
  if (st) {
    for (int i = 0; i < f->nparams; i++) {
      fsdp__mem_add_unsharded_params(-dt_bytes(f->params[i].unsharded));
      weft_dtensor_destroy(f->params[i].unsharded);
      f->params[i].unsharded = NULL;
    }
    f->state = FSDP_SHARDED;
    return weft_error_trace(st, __func__);
  }
  for (int i = 0; i < f->nparams; i++) {
    f->params[i].p->data = f->params[i].unsharded;
    f->params[i].p->master = f->params[i].sharded;
  }
  f->state = FSDP_UNSHARDED;
  fsdp__event(WEFT_FSDP_EV_UNSHARD_DONE, f, false, f->root ? f->root->in_backward : false);
  return WEFT_OK;
}

void fsdp__drop_small(weft_fsdp *f) {
  if (!f->small_buf) return;
  weft_free(f->small_buf);
  fsdp__mem_add_unsharded_params(-(int64_t)f->small_bytes);
  f->small_buf = NULL;
  f->small_bytes = 0;
}

weft_status fsdp__reshard(weft_fsdp *f, bool small) {
  if (f->state == FSDP_UNSHARDING) WEFT_CHECK(fsdp__unshard_wait(f));
  if (f->state != FSDP_UNSHARDED) return WEFT_OK;
  int k = (small && f->raf > 1 && f->small_mesh) ? weft_mesh_dim_size(f->small_mesh, 1) : 0;
  if (k > 1) {
    /* keep part j = blocks [j n/k, (j+1) n/k) for the k-rank backward all-gather */
    int64_t n = f->nshard, S = f->block, per = n / k;
    int j = weft_mesh_coord(f->small_mesh, 1);
    weft_dtype dt = f->ag_dtype;
    size_t bytes = (size_t)(per * S) * weft_dtype_size(dt);
    fsdp__drop_small(f);
    void *buf;
    WEFT_CHECK(weft_alloc(f->dev, bytes, &buf));
    fsdp__mem_add_unsharded_params((int64_t)bytes);
    weft_status st = WEFT_OK;
    for (int64_t b = 0; b < per && !st; b++)
      st =
          pack_block(f, f->dev, (int)(j * per + b), elem(buf, b * S, dt), dt, src_unsharded, false);
    if (st) {
      weft_free(buf);
      fsdp__mem_add_unsharded_params(-(int64_t)bytes);
      return weft_error_trace(st, __func__);
    }
    f->small_buf = buf;
    f->small_bytes = bytes;
  }
  for (int i = 0; i < f->nparams; i++) {
    fsdp_param *fp = &f->params[i];
    fp->p->data = fp->sharded;
    fp->p->master = NULL;
    fsdp__mem_add_unsharded_params(-dt_bytes(fp->unsharded));
    weft_dtensor_destroy(fp->unsharded);
    fp->unsharded = NULL;
  }
  f->state = FSDP_SHARDED;
  fsdp__event(WEFT_FSDP_EV_RESHARD, f, false, f->root ? f->root->in_backward : false);
  return WEFT_OK;
}

/* ----------------------------------------------------------- gradients */

weft_status fsdp__post_backward_grads(weft_fsdp *f) {
  /* take the unsharded grads (nn accumulated them on the model mesh) and
   * give the parameters back their sharded grads */
  for (int i = 0; i < f->nparams; i++) {
    fsdp_param *fp = &f->params[i];
    weft_param *p = fp->p;
    fp->acc_grad = p->grad;
    p->grad = fp->held_grad;
    fp->held_grad = NULL;
  }
  if (!f->sync) return WEFT_OK; /* keep accumulating (no_sync) */
  if (f->rs_pending) WEFT_CHECK(fsdp__reduce_finish(f));
  int64_t n = f->nshard, S = f->block;
  weft_dtype dt = f->rs_dtype;
  size_t bytes = (size_t)(n * S) * weft_dtype_size(dt);
  void *buf;
  WEFT_CHECK(weft_alloc(f->dev, bytes, &buf));
  fsdp__mem_add_unsharded_grads((int64_t)bytes);
  weft_status st = WEFT_OK;
  for (int64_t r = 0; r < n && !st; r++)
    st = pack_block(f, f->dev, (int)r, elem(buf, r * S, dt), dt, src_grad, false);
  weft_work *w = NULL;
  weft_stream_id prev = use_stream(fsdp__collective_stream(true));
  if (!st) st = weft_reduce_scatter(f->dp_mesh, f->shard_dim, buf, buf, S, dt, WEFT_OP_SUM, &w);
  use_stream(prev);
  if (st) {
    weft_free(buf);
    fsdp__mem_add_unsharded_grads(-(int64_t)bytes);
    return weft_error_trace(st, __func__);
  }
  fsdp__comm_add(&f->comm.reduce_scatter, (int64_t)bytes, (int)n, false);
  /* the unsharded grads are in the buffer now: free them */
  for (int i = 0; i < f->nparams; i++) {
    weft_dtensor_destroy(f->params[i].acc_grad);
    f->params[i].acc_grad = NULL;
  }
  f->rs_buf = buf;
  f->rs_bytes = bytes;
  f->rs_work = w;
  f->rs_pending = true;
  fsdp__event(WEFT_FSDP_EV_REDUCE_START, f, false, true);
  return WEFT_OK;
}

weft_status fsdp__reduce_finish(weft_fsdp *f) {
  if (!f->rs_pending) return WEFT_OK;
  weft_status st = weft_work_wait(f->rs_work);
  f->rs_work = NULL;
  int64_t S = f->block;
  weft_dtype dt = f->rs_dtype;
  if (!st && f->nrep > 1) {
    weft_stream_id prev = use_stream(fsdp__collective_stream(true));
    st = weft_all_reduce(f->dp_mesh, f->rep_dim, f->rs_buf, f->rs_buf, S, dt, WEFT_OP_SUM, NULL);
    use_stream(prev);
    if (!st) fsdp__comm_add(&f->comm.all_reduce, S * (int64_t)weft_dtype_size(dt), f->nrep, true);
  }
  /* average over every data-parallel rank (shard x replicate), as
   * PyTorch's default gradient divide factor */
  float scale = 1.0f / (float)(f->nshard * f->nrep);
  weft_flat_piece *pc = st ? NULL : pieces_new(f, 1);
  int npc = 0;
  if (!st && !pc) st = weft_last_status();
  for (int i = 0; i < f->nparams && !st; i++) {
    fsdp_param *fp = &f->params[i];
    weft_param *p = fp->p;
    if (!p->requires_grad) continue;
    if (!p->grad) {
      st = weft_dtensor_zeros_like(fp->sharded, WEFT_F32, &p->grad);
      if (st) break;
    } else if (!weft_dtensor_spec_equal(weft_dtensor_get_spec(p->grad),
                                        weft_dtensor_get_spec(fp->sharded)) ||
               !weft_tensor_is_contiguous(weft_dtensor_local(p->grad))) {
      st = weft_error(WEFT_ERR_STATE, "parameter '%s': its grad is not its sharded grad", p->fqn);
      break;
    }
    pc[npc].data = weft_dtensor_local(p->grad)->data;
    pc[npc].dtype = WEFT_F32;
    pc[npc].offset = fp->offset;
    pc[npc].count = fp->shard_len * fp->rest;
    npc++;
  }
  if (!st && f->offload) { /* the host grads take the reduced block from the staging copy */
    size_t bytes = (size_t)S * weft_dtype_size(dt);
    void *host = NULL;
    st = offload_stage(f, bytes, &host);
    if (!st) st = weft_memcpy(f->dev, host, f->rs_buf, bytes, WEFT_COPY_D2H);
    if (!st) st = weft_backend_flat_accumulate(WEFT_CPU, host, dt, pc, npc, scale);
  } else if (!st) {
    st = weft_backend_flat_accumulate(f->dev, f->rs_buf, dt, pc, npc, scale);
  }
  free(pc);
  weft_free(f->rs_buf);
  fsdp__mem_add_unsharded_grads(-(int64_t)f->rs_bytes);
  f->rs_buf = NULL;
  f->rs_bytes = 0;
  f->rs_pending = false;
  if (st) return weft_error_trace(st, __func__);
  fsdp__event(WEFT_FSDP_EV_REDUCE_DONE, f, false, f->root ? f->root->in_backward : false);
  return WEFT_OK;
}
