/* fsdp/hooks.c — the hooks that drive a group (pre/post forward and
 * backward, grouped over several modules), the root's lazy init and
 * forward order, implicit and explicit prefetch, pending reductions, and
 * the mixed-precision casts of inputs and outputs. */
#include <stdlib.h>
#include <string.h>

#include "fsdp_internal.h"

/* --------------------------------------------------------------- lists */

static weft_status push(weft_fsdp ***v, int *n, int *cap, weft_fsdp *g) {
  if (*n == *cap) {
    int c = *cap ? 2 * *cap : 8;
    weft_fsdp **q = realloc(*v, (size_t)c * sizeof *q);
    if (!q) return weft_error(WEFT_ERR_OOM, "fsdp list");
    *v = q;
    *cap = c;
  }
  (*v)[(*n)++] = g;
  return WEFT_OK;
}

static void drop(weft_fsdp **v, int *n, const weft_fsdp *g) {
  int k = 0;
  for (int i = 0; i < *n; i++)
    if (v[i] != g) v[k++] = v[i];
  *n = k;
}

void fsdp__forget(weft_fsdp *f) {
  for (weft_fsdp *g = fsdp__registry; g; g = g->next) {
    if (g == f) continue;
    if (g->root == f) {
      g->root = NULL;
      g->order_index = -1;
    }
    int before = g->norder;
    drop(g->order, &g->norder, f);
    if (g->norder != before)
      for (int i = 0; i < g->norder; i++) g->order[i]->order_index = i;
    drop(g->pending, &g->npending, f);
    if (g->nfwd_prefetch > 0) drop(g->fwd_prefetch, &g->nfwd_prefetch, f);
    if (g->nbwd_prefetch > 0) drop(g->bwd_prefetch, &g->nbwd_prefetch, f);
  }
}

weft_status fsdp__finish_pending(weft_fsdp *root, const weft_fsdp *keep) {
  weft_status st = WEFT_OK;
  int k = 0;
  for (int i = 0; i < root->npending; i++) {
    weft_fsdp *g = root->pending[i];
    if (g == keep) {
      root->pending[k++] = g;
      continue;
    }
    weft_status s2 = fsdp__reduce_finish(g);
    if (s2 && !st) st = s2;
  }
  root->npending = k;
  return st;
}

/* ----------------------------------------------------------- lazy init */

/* The first group whose forward starts with no root known becomes the
 * root of every group inside it that has none (PyTorch's lazy_init), and
 * the defaults resolve: reshard_after_forward false for the root, true
 * for the others. */
static void lazy_init(weft_fsdp *f) {
  if (f->root) return;
  f->root = f;
  f->is_root = true;
  f->norder = 0;
  f->order_done = false;
  if (!f->raf_explicit) f->raf = 0;
  for (weft_fsdp *g = fsdp__registry; g; g = g->next) {
    if (g == f || g->root || !fsdp__group_within(g, f)) continue;
    g->root = f;
    if (!g->raf_explicit) g->raf = 1;
  }
}

/* reshard_after_forward as used now (a group run with no root yet acts
 * with the non-root default). */
static int raf_now(const weft_fsdp *f) { return f->raf < 0 ? 1 : f->raf; }

/* ------------------------------------------------------------ prefetch */

static weft_status prefetch(weft_fsdp *f, bool backward) {
  int n = backward ? f->nbwd_prefetch : f->nfwd_prefetch;
  weft_fsdp **list = backward ? f->bwd_prefetch : f->fwd_prefetch;
  if (n >= 0) {
    for (int i = 0; i < n; i++)
      if (list[i] != f) WEFT_CHECK(fsdp__unshard_start(list[i], true));
    return WEFT_OK;
  }
  /* implicit: the next group in forward order, or the one whose backward
   * comes next (the reverse forward order; the root's backward starts
   * first, so it prefetches the last group) */
  weft_fsdp *r = f->root;
  if (!r || !r->order_done || f->order_index < 0) return WEFT_OK;
  weft_fsdp *t = NULL;
  if (!backward) {
    if (f->order_index + 1 < r->norder) t = r->order[f->order_index + 1];
  } else if (f == r) {
    if (r->norder > 1) t = r->order[r->norder - 1];
  } else if (f->order_index - 1 >= 0) {
    t = r->order[f->order_index - 1];
    if (t == r) t = NULL; /* the root is unsharded for the whole backward */
  }
  if (t && t->dp_mesh == f->dp_mesh) WEFT_CHECK(fsdp__unshard_start(t, true));
  return WEFT_OK;
}

/* ---------------------------------------------------------- step check */

/* Every forward of the root first checks that every rank of the root mesh
 * has run as many forwards and backwards of this model as this one, over a
 * communicator of its own (a duplicate of the root mesh's, so the check can
 * never meet a data collective). A rank that skips its backward or runs an
 * extra forward is then named on every rank; and a rank whose check is left
 * waiting (the others are inside backward collectives that its skipped
 * backward never joins) stops after WEFT_TIMEOUT instead of matching their
 * collectives with its own and computing wrong numbers. Without it the
 * all-gathers of the next forward meet those of the others' backward
 * (same kinds and sizes) and pass. Cost: one all-gather of two integers a
 * step; WEFT_DEBUG checks every op (nn) and collective (mesh) on top. */
static weft_status step_check(weft_fsdp *r) {
  if (!r->step_comm_ready) {
    MPI_Request q = MPI_REQUEST_NULL;
    if (MPI_Comm_idup(weft_mesh_comm(weft_mesh_root(r->dp_mesh)), &r->step_comm, &q) != MPI_SUCCESS)
      return weft_error(WEFT_ERR_MPI, "fully_shard '%s': MPI_Comm_idup failed", r->name);
    WEFT_CHECK(weft_wait_requests(1, &q, "fully_shard: the step check's communicator"));
    r->step_comm_ready = true;
  }
  int n = 0, me = 0;
  MPI_Comm_size(r->step_comm, &n);
  MPI_Comm_rank(r->step_comm, &me);
  /* both buffers outlive this call: after a timeout MPI may still complete
   * the abandoned all-gather into them */
  int64_t *mine = r->step_mine;
  mine[0] = r->nforward, mine[1] = r->nbackward;
  int64_t *all = malloc(2 * (size_t)n * sizeof *all);
  if (!all) return weft_error(WEFT_ERR_OOM, "fully_shard '%s': step check", r->name);
  MPI_Request q = MPI_REQUEST_NULL;
  weft_status st = WEFT_OK;
  if (MPI_Iallgather(mine, 2, MPI_INT64_T, all, 2, MPI_INT64_T, r->step_comm, &q) != MPI_SUCCESS)
    st = weft_error(WEFT_ERR_MPI, "fully_shard '%s': MPI_Iallgather failed", r->name);
  if (!st && (st = weft_wait_requests(1, &q, "step check")) == WEFT_ERR_TIMEOUT)
    st = weft_error(WEFT_ERR_TIMEOUT,
                    "the FSDP model '%s' starts forward #%lld (after %lld backwards) but the "
                    "other ranks did not start it within %g s: a rank that skipped its backward "
                    "leaves the others waiting inside backward collectives (WEFT_DEBUG=1 names "
                    "the ranks and calls)",
                    r->name, (long long)r->nforward + 1, (long long)r->nbackward,
                    weft_get_settings()->timeout_s);
  int other = -1;
  for (int j = 0; !st && j < n && other < 0; j++)
    if (all[2 * j] != mine[0] || all[2 * j + 1] != mine[1]) other = j;
  if (other >= 0) {
    int w_me = 0, w_other = 0;
    MPI_Group g, world;
    MPI_Comm_group(r->step_comm, &g);
    MPI_Comm_group(MPI_COMM_WORLD, &world);
    MPI_Group_translate_ranks(g, 1, &me, world, &w_me);
    MPI_Group_translate_ranks(g, 1, &other, world, &w_other);
    MPI_Group_free(&g);
    MPI_Group_free(&world);
    st = weft_error(WEFT_ERR_MISMATCH,
                    "the ranks ran different steps of the FSDP model '%s': rank %d has run %lld "
                    "forwards and %lld backwards, rank %d %lld and %lld (every rank must run "
                    "the same forwards and backwards; did a rank skip its backward?)",
                    r->name, w_me, (long long)mine[0], (long long)mine[1], w_other,
                    (long long)all[2 * other], (long long)all[2 * other + 1]);
  }
  if (st != WEFT_ERR_TIMEOUT) free(all); /* else leaked on purpose: see above */
  return st;
}

/* ---------------------------------------------------------- group steps */

static weft_status group_pre_forward(weft_fsdp *f) {
  lazy_init(f);
  weft_fsdp *r = f->root;
  if (f == r && !r->in_backward) { /* not an activation-checkpoint recompute */
    WEFT_CHECK(step_check(r));
    r->nforward++;
  }
  if (f == r) WEFT_CHECK(fsdp__finish_pending(r, NULL)); /* left by is_last_backward(false) */
  if (!r->order_done && f->order_index < 0) {
    WEFT_CHECK(push(&r->order, &r->norder, &r->cap_order, f));
    f->order_index = r->norder - 1;
  }
  f->in_forward = true;
  weft_status st = fsdp__unshard_wait(f);
  if (!st) st = prefetch(f, false);
  if (st) {
    f->in_forward = false;
    return weft_error_trace(st, __func__);
  }
  fsdp__event(WEFT_FSDP_EV_FORWARD_BEGIN, f, false, false);
  return WEFT_OK;
}

static weft_status group_post_forward(weft_fsdp *f) {
  fsdp__event(WEFT_FSDP_EV_FORWARD_END, f, false, false);
  f->in_forward = false;
  f->ran = true;
  int raf = raf_now(f);
  if (raf == 1)
    WEFT_CHECK(fsdp__reshard(f, false));
  else if (raf > 1)
    WEFT_CHECK(fsdp__reshard(f, true));
  if (f->root == f) f->order_done = true;
  return WEFT_OK;
}

static weft_status group_pre_backward(weft_fsdp *f) {
  f->in_backward = true;
  weft_status st = fsdp__unshard_wait(f);
  if (!st) st = prefetch(f, true);
  if (st) {
    f->in_backward = false;
    return weft_error_trace(st, __func__);
  }
  /* the sharded grads step aside; nn accumulates into unsharded ones
   * (those kept from backwards without sync, or new ones it creates) */
  for (int i = 0; i < f->nparams; i++) {
    fsdp_param *fp = &f->params[i];
    fp->held_grad = fp->p->grad;
    fp->p->grad = fp->acc_grad;
    fp->acc_grad = NULL;
  }
  fsdp__event(WEFT_FSDP_EV_BACKWARD_BEGIN, f, false, true);
  return WEFT_OK;
}

static weft_status group_post_backward(weft_fsdp *f) {
  fsdp__event(WEFT_FSDP_EV_BACKWARD_END, f, false, true);
  weft_status st = fsdp__post_backward_grads(f);
  if (!st && f->reshard_after_backward) {
    st = fsdp__reshard(f, false);
    fsdp__drop_small(f);
  }
  f->in_backward = false;
  if (st) return weft_error_trace(st, __func__);
  weft_fsdp *r = f->root ? f->root : f;
  if (f->rs_pending) WEFT_CHECK(push(&r->pending, &r->npending, &r->cap_pending, f));
  /* the previous group's reduce-scatter ran while this group computed */
  WEFT_CHECK(fsdp__finish_pending(r, f));
  if (f == r && r->is_last_backward) WEFT_CHECK(fsdp__finish_pending(r, NULL));
  if (f == r) r->nbackward++;
  return WEFT_OK;
}

/* -------------------------------------------------------------- casts */

/* The cast of module m's forward input (cast_forward_inputs: to
 * param_dtype) or output (output_dtype) to dt, in *out (NULL: none
 * needed). On a module of the op graph (weft_module_on_graph) a real
 * conversion, PyTorch's; for the hand-written layers (f32 only) an f32 copy
 * holding t's values rounded to a 16-bit dt. Non-float inputs (tokens) and
 * strided views are left alone. */
static weft_status cast_copy(const weft_module *m, const weft_dtensor *t, weft_dtype dt,
                             weft_dtensor **out) {
  *out = NULL;
  if (!t || dt == WEFT_DTYPE_COUNT) return WEFT_OK;
  const weft_dtensor_spec *s = weft_dtensor_get_spec(t);
  const weft_tensor *l = weft_dtensor_local(t);
  if (!weft_dtype_is_float(s->dtype) || s->dtype == dt || !weft_tensor_is_contiguous(l))
    return WEFT_OK;
  bool real = weft_module_on_graph(m);
  if (!real && (dt == WEFT_F32 || s->dtype != WEFT_F32)) return WEFT_OK;
  weft_dtensor *c;
  WEFT_CHECK(weft_dtensor_empty(weft_dtensor_mesh(t), real ? dt : WEFT_F32, s->ndim, s->shape,
                                s->placements, s->mesh_ndim, &c));
  weft_tensor *low = NULL;
  weft_status st = WEFT_OK;
  if (real) {
    st = weft_tensor_copy(weft_dtensor_local(c), l);
  } else {
    st = weft_tensor_create(dt, l->device, l->ndim, l->shape, &low);
    if (!st) st = weft_tensor_copy(low, l);
    if (!st) st = weft_tensor_copy(weft_dtensor_local(c), low);
  }
  weft_tensor_destroy(low);
  if (st) {
    weft_dtensor_destroy(c);
    return st;
  }
  *out = c;
  return WEFT_OK;
}

/* --------------------------------------------------------------- hooks */

static weft_status hook_pre_forward(weft_module *m, weft_hook_kind kind, const weft_dtensor *t,
                                    weft_dtensor **replace, void *ctx) {
  (void)m;
  (void)kind;
  weft_fsdp *f = ctx;
  if (f->fwd_seen == 0 && !f->in_forward) WEFT_CHECK(group_pre_forward(f));
  if (f->opts.mp.cast_forward_inputs) WEFT_CHECK(cast_copy(m, t, f->opts.mp.param_dtype, replace));
  return WEFT_OK;
}

static weft_status hook_post_forward(weft_module *m, weft_hook_kind kind, const weft_dtensor *t,
                                     weft_dtensor **replace, void *ctx) {
  (void)m;
  (void)kind;
  weft_fsdp *f = ctx;
  WEFT_CHECK(cast_copy(m, t, f->opts.mp.output_dtype, replace));
  if (++f->fwd_seen >= f->nmodules) {
    f->fwd_seen = 0;
    WEFT_CHECK(group_post_forward(f));
  }
  return WEFT_OK;
}

static weft_status hook_pre_backward(weft_module *m, weft_hook_kind kind, const weft_dtensor *t,
                                     weft_dtensor **replace, void *ctx) {
  (void)m;
  (void)kind;
  (void)t;
  (void)replace;
  weft_fsdp *f = ctx;
  if (!f->in_backward) WEFT_CHECK(group_pre_backward(f));
  return WEFT_OK;
}

static weft_status hook_post_backward(weft_module *m, weft_hook_kind kind, const weft_dtensor *t,
                                      weft_dtensor **replace, void *ctx) {
  (void)m;
  (void)kind;
  (void)t;
  (void)replace;
  weft_fsdp *f = ctx;
  if (++f->bwd_seen >= f->nmodules) {
    f->bwd_seen = 0;
    WEFT_CHECK(group_post_backward(f));
  }
  return WEFT_OK;
}

weft_status fsdp__register_hooks(weft_fsdp *f) {
  static const weft_hook_kind kinds[4] = {WEFT_HOOK_PRE_FORWARD, WEFT_HOOK_POST_FORWARD,
                                          WEFT_HOOK_PRE_BACKWARD, WEFT_HOOK_POST_BACKWARD};
  static const weft_hook_fn fns[4] = {hook_pre_forward, hook_post_forward, hook_pre_backward,
                                      hook_post_backward};
  f->nhooks = 0;
  for (int i = 0; i < f->nmodules; i++)
    for (int k = 0; k < 4; k++) {
      weft_status st =
          weft_module_register_hook(f->modules[i], kinds[k], fns[k], f, &f->hooks[f->nhooks]);
      if (st) {
        fsdp__remove_hooks(f);
        return weft_error_trace(st, __func__);
      }
      f->nhooks++;
    }
  return WEFT_OK;
}

void fsdp__remove_hooks(weft_fsdp *f) {
  for (int i = 0; i < f->nhooks; i++) {
    weft_hook_remove(f->hooks[i]);
    weft_clear_error();
  }
  f->nhooks = 0;
}
