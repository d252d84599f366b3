/* dcp/model_sd.c — model and optimizer state dicts (get/set), with
 * torch.distributed.checkpoint.state_dict's options: full_state_dict,
 * cpu_offload, broadcast_from_rank0, strict. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dcp_internal.h"

static weft_status get_opts(const weft_state_dict_opts *o, weft_state_dict_opts *out) {
  weft_state_dict_opts d = WEFT_STATE_DICT_OPTS_INIT;
  if (o && o->version != WEFT_STATE_DICT_OPTS_VERSION)
    return weft_error(WEFT_ERR_INVALID, "weft_state_dict_opts version %d (this library: %d)",
                      o->version, WEFT_STATE_DICT_OPTS_VERSION);
  *out = o ? *o : d;
  return WEFT_OK;
}

static weft_status params_of(weft_module *model, weft_param ***ps, int *n) {
  *ps = NULL;
  *n = 0;
  if (!model) return weft_error(WEFT_ERR_INVALID, "model is NULL");
  int count;
  WEFT_CHECK(weft_module_parameters(model, NULL, 0, &count));
  weft_param **p = malloc((size_t)(count ? count : 1) * sizeof *p);
  if (!p) return weft_error(WEFT_ERR_OOM, "parameter list");
  weft_status st = weft_module_parameters(model, p, count, &count);
  if (st != WEFT_OK) {
    free(p);
    return weft_error_trace(st, __func__);
  }
  *ps = p;
  *n = count;
  return WEFT_OK;
}

/* Adds one DTensor under name according to the options. Collective over
 * dt's mesh with full_state_dict. */
static weft_status add_state_tensor(weft_state_dict *sd, const char *name, weft_dtensor *dt,
                                    const weft_state_dict_opts *o) {
  if (o->full_state_dict) {
    weft_tensor *full;
    WEFT_CHECK(weft_dtensor_full_tensor(dt, &full));
    if (o->cpu_offload && weft_world_rank() != 0) {
      weft_tensor_destroy(full);
      return WEFT_OK;
    }
    weft_status st = weft_state_dict_add_tensor(sd, name, full, WEFT_LOCAL_TAKE);
    if (st != WEFT_OK) weft_tensor_destroy(full);
    return st;
  }
  bool host = weft_dtensor_local(dt)->device == WEFT_CPU;
  return weft_state_dict_add_dtensor(sd, name, dt, host ? WEFT_LOCAL_VIEW : WEFT_LOCAL_COPY);
}

weft_status weft_get_model_state_dict(weft_module *model, const weft_state_dict_opts *opts,
                                      weft_state_dict *sd) {
  weft_state_dict_opts o;
  WEFT_CHECK(get_opts(opts, &o));
  if (!sd) return weft_error(WEFT_ERR_INVALID, "state dict is NULL");
  weft_param **ps;
  int n;
  WEFT_CHECK(params_of(model, &ps, &n));
  weft_status st = WEFT_OK;
  for (int i = 0; i < n && st == WEFT_OK; i++)
    if (!ps[i]->data)
      st = weft_error(WEFT_ERR_STATE, "model state dict: parameter '%s' has no storage (initialise "
                      "or materialise the model first)", ps[i]->fqn);
  for (int i = 0; i < n && st == WEFT_OK; i++) st = add_state_tensor(sd, ps[i]->fqn, ps[i]->data, &o);
  free(ps);
  return st;
}

weft_status weft_get_optimizer_state_dict(weft_module *model, weft_optimizer *opt,
                                          const weft_state_dict_opts *opts,
                                          weft_state_dict *sd) {
  weft_state_dict_opts o;
  WEFT_CHECK(get_opts(opts, &o));
  if (!sd || !opt) return weft_error(WEFT_ERR_INVALID, "state dict or optimizer is NULL");
  weft_param **ps;
  int n;
  WEFT_CHECK(params_of(model, &ps, &n));
  weft_status st = WEFT_OK;
  int ns = weft_optimizer_state_count(opt);
  for (int i = 0; i < ns && st == WEFT_OK; i++) {
    const char *name;
    weft_dtensor *dt;
    st = weft_optimizer_state_get(opt, i, &name, &dt);
    if (st == WEFT_OK) st = add_state_tensor(sd, name, dt, &o);
  }
  if (st == WEFT_OK) st = weft_state_dict_set_int(sd, "state.num_steps", weft_optimizer_num_steps(opt));
  char key[4200];
  for (int i = 0; i < n && st == WEFT_OK; i++) {
    int64_t step;
    if (weft_optimizer_get_param_step(opt, ps[i]->fqn, &step) != WEFT_OK) {
      weft_clear_error(); /* not in this optimizer (requires_grad false) */
      continue;
    }
    snprintf(key, sizeof key, "state.%s.step", ps[i]->fqn);
    st = weft_state_dict_set_int(sd, key, step);
    snprintf(key, sizeof key, "param_groups.%s.lr", ps[i]->fqn);
    if (st == WEFT_OK) st = weft_state_dict_set_double(sd, key, (double)weft_optimizer_get_lr(opt));
  }
  free(ps);
  return st;
}

/* ------------------------------------------------------------ set */

typedef weft_status (*value_fn)(void *ctx, const char *key, weft_sd_value_type type,
                                const char *text);

typedef struct target {
  char *key;
  weft_dtensor *dt; /* tensor target; NULL for a value */
  value_fn set;
  void *ctx;
  bool want_int; /* value: an int (else any number) */
} target;

typedef struct tlist {
  target *t;
  int64_t n, cap;
} tlist;

static weft_status tl_push(tlist *l, const char *key, weft_dtensor *dt, value_fn fn, void *ctx,
                           bool want_int) {
  if (l->n == l->cap) {
    int64_t cap = l->cap ? 2 * l->cap : 32;
    target *t = realloc(l->t, (size_t)cap * sizeof *t);
    if (!t) return weft_error(WEFT_ERR_OOM, "targets");
    l->t = t;
    l->cap = cap;
  }
  target *t = &l->t[l->n];
  t->key = dcp_strdup(key);
  if (!t->key) return weft_error(WEFT_ERR_OOM, "targets");
  t->dt = dt;
  t->set = fn;
  t->ctx = ctx;
  t->want_int = want_int;
  l->n++;
  return WEFT_OK;
}

static void tl_free(tlist *l) {
  for (int64_t i = 0; i < l->n; i++) free(l->t[i].key);
  free(l->t);
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static weft_status keys_push(weft_key_list *l, const char *k) {
  char **n = realloc(l->keys, (size_t)(l->count + 1) * sizeof *n);
  if (!n) return weft_error(WEFT_ERR_OOM, "key list");
  l->keys = n;
  l->keys[l->count] = dcp_strdup(k);
  if (!l->keys[l->count]) return weft_error(WEFT_ERR_OOM, "key list");
  l->count++;
  return WEFT_OK;
}

/* Copies the full value `full` into dt's local shard (each local box is a
 * slice of full; dtypes convert). No communication. */
static weft_status slice_full_into(weft_dtensor *dt, const weft_tensor *full) {
  dcp_lbox *lb;
  int64_t n;
  WEFT_CHECK(dcp_local_boxes(dt, &lb, &n));
  weft_tensor *lt = weft_dtensor_local(dt);
  size_t fe = weft_dtype_size(full->dtype), le = weft_dtype_size(lt->dtype);
  weft_status st = WEFT_OK;
  for (int64_t k = 0; k < n && st == WEFT_OK; k++) {
    const char *s = full->data;
    char *d = lt->data;
    for (int i = 0; i < full->ndim; i++) {
      s += lb[k].g.off[i] * full->strides[i] * (int64_t)fe;
      d += lb[k].lstart[i] * lt->strides[i] * (int64_t)le;
    }
    weft_tensor sv, dv;
    st = weft_tensor_view_init(&sv, (void *)s, full->dtype, WEFT_CPU, full->ndim, lb[k].g.size,
                               full->strides);
    if (st == WEFT_OK)
      st = weft_tensor_view_init(&dv, d, lt->dtype, lt->device, lt->ndim, lb[k].g.size, lt->strides);
    if (st == WEFT_OK) st = weft_tensor_copy(&dv, &sv);
  }
  free(lb);
  return st;
}

/* Copies entry e into target dt (see weft_set_model_state_dict). */
static weft_status copy_into(weft_dtensor *dt, const dcp_sd_ent *e) {
  if (e->kind == WEFT_SD_TENSOR) return slice_full_into(dt, e->t);
  if (e->dt == dt) return WEFT_OK;
  const weft_dtensor_spec *a = weft_dtensor_get_spec(dt), *b = weft_dtensor_get_spec(e->dt);
  bool same_mesh = weft_dtensor_mesh(dt) == weft_dtensor_mesh(e->dt);
  bool same_layout = same_mesh && a->mesh_ndim == b->mesh_ndim;
  for (int d = 0; same_layout && d < a->mesh_ndim; d++)
    same_layout = weft_placement_equal(a->placements[d], b->placements[d]);
  if (same_layout) return weft_tensor_copy(weft_dtensor_local(dt), weft_dtensor_local(e->dt));
  weft_status st;
  if (same_mesh) {
    weft_dtensor *tmp;
    WEFT_CHECK(weft_dtensor_redistribute(e->dt, a->placements, a->mesh_ndim, &tmp));
    st = weft_tensor_copy(weft_dtensor_local(dt), weft_dtensor_local(tmp));
    weft_dtensor_destroy(tmp);
    return st;
  }
  weft_tensor *full;
  WEFT_CHECK(weft_dtensor_full_tensor(e->dt, &full));
  st = slice_full_into(dt, full);
  weft_tensor_destroy(full);
  return st;
}

static void describe_shape(int nd, const int64_t *shape, char *buf, size_t cap) {
  dcp_box x = {{0}, {0}};
  for (int d = 0; d < nd; d++) x.size[d] = shape[d];
  dcp_box_describe(&x, nd, buf, cap);
}

/* Checks one present entry against its target. */
static weft_status check_pair(const target *t, weft_sd_kind kind, weft_sd_value_type vtype,
                              int nd, const int64_t *shape) {
  char a[256], b[256];
  if (t->dt) {
    if (kind == WEFT_SD_VALUE)
      return weft_error(WEFT_ERR_INVALID, "set state dict: '%s' is a value; a tensor was expected",
                        t->key);
    const weft_dtensor_spec *s = weft_dtensor_get_spec(t->dt);
    bool same = nd == s->ndim;
    for (int d = 0; same && d < nd; d++) same = shape[d] == s->shape[d];
    if (!same) {
      describe_shape(nd, shape, a, sizeof a);
      describe_shape(s->ndim, s->shape, b, sizeof b);
      return weft_error(WEFT_ERR_INVALID, "set state dict: '%s' has shape %s in the state dict but "
                        "%s in the model", t->key, a, b);
    }
    return WEFT_OK;
  }
  if (kind != WEFT_SD_VALUE)
    return weft_error(WEFT_ERR_INVALID, "set state dict: '%s' is a tensor; a value was expected", t->key);
  if (vtype != WEFT_VALUE_INT && (t->want_int || vtype != WEFT_VALUE_DOUBLE))
    return weft_error(WEFT_ERR_INVALID, "set state dict: '%s' is a %s; %s was expected", t->key,
                      dcp_value_type_name(vtype), t->want_int ? "an int" : "a number");
  return WEFT_OK;
}

static bool in_namespace(const dcp_sd_ent *e, bool optimizer) {
  if (optimizer) return dcp_is_optimizer_key(e->name);
  return e->kind != WEFT_SD_VALUE && !dcp_is_optimizer_key(e->name);
}

/* Finds missing and unexpected keys of sd against targets (sorted keys in
 * `sorted`). */
static weft_status find_keys(const tlist *tl, char **sorted, const weft_state_dict *sd,
                             bool optimizer, weft_key_list *miss, weft_key_list *unexp) {
  for (int64_t i = 0; i < tl->n; i++)
    if (dcp_sd_index(sd, tl->t[i].key) < 0) WEFT_CHECK(keys_push(miss, tl->t[i].key));
  for (int64_t i = 0; i < sd->n; i++) {
    const dcp_sd_ent *e = &sd->e[i];
    if (!in_namespace(e, optimizer)) continue;
    const char *k = e->name;
    if (!tl->n || !bsearch(&k, sorted, (size_t)tl->n, sizeof *sorted, cmp_str))
      WEFT_CHECK(keys_push(unexp, e->name));
  }
  return WEFT_OK;
}

static weft_status strict_error(const weft_key_list *miss, const weft_key_list *unexp) {
  if (miss->count)
    return weft_error(WEFT_ERR_NOT_FOUND, "set state dict (strict): missing key '%s'%s", miss->keys[0],
                      miss->count > 1 ? " and others" : "");
  return weft_error(WEFT_ERR_INVALID, "set state dict (strict): unexpected key '%s'%s",
                    unexp->keys[0], unexp->count > 1 ? " and others" : "");
}

static weft_status apply_local(const tlist *tl, char **sorted, const weft_state_dict *sd,
                               const weft_state_dict_opts *o, bool optimizer, weft_key_list *miss,
                               weft_key_list *unexp) {
  WEFT_CHECK(find_keys(tl, sorted, sd, optimizer, miss, unexp));
  if (o->strict && (miss->count || unexp->count)) return strict_error(miss, unexp);
  for (int64_t i = 0; i < tl->n; i++) {
    int64_t k = dcp_sd_index(sd, tl->t[i].key);
    if (k < 0) continue;
    const dcp_sd_ent *e = &sd->e[k];
    int nd = 0;
    const int64_t *shape = NULL;
    if (e->kind == WEFT_SD_DTENSOR) {
      nd = weft_dtensor_ndim(e->dt);
      shape = weft_dtensor_shape(e->dt);
    } else if (e->kind == WEFT_SD_TENSOR) {
      nd = e->t->ndim;
      shape = e->t->shape;
    }
    WEFT_CHECK(check_pair(&tl->t[i], e->kind, e->val.type, nd, shape));
  }
  for (int64_t i = 0; i < tl->n; i++) {
    int64_t k = dcp_sd_index(sd, tl->t[i].key);
    if (k < 0) continue;
    const dcp_sd_ent *e = &sd->e[k];
    if (tl->t[i].dt) WEFT_CHECK(copy_into(tl->t[i].dt, e));
    else WEFT_CHECK(tl->t[i].set(tl->t[i].ctx, e->name, e->val.type, e->val.text));
  }
  return WEFT_OK;
}

/* broadcast_from_rank0: rank 0 describes what it has, then sends each
 * tensor in target order; every rank keeps its slices. */
static weft_status apply_bcast(const tlist *tl, char **sorted, const weft_state_dict *sd,
                               const weft_state_dict_opts *o, bool optimizer, weft_key_list *miss,
                               weft_key_list *unexp) {
  dcp_comm c;
  WEFT_CHECK(dcp_comm_open(NULL, &c));
  weft_status st = WEFT_OK;
  dcp_buf hb = {0};
  int64_t hlen = 0;
  char *hdr = NULL;
  if (c.rank == 0) {
    weft_key_list m0 = {0, NULL}, u0 = {0, NULL};
    weft_status s0 = sd ? find_keys(tl, sorted, sd, optimizer, &m0, &u0)
                        : weft_error(WEFT_ERR_INVALID, "broadcast_from_rank0: rank 0's state dict is NULL");
    for (int64_t i = 0; s0 == WEFT_OK && i < tl->n; i++) {
      int64_t k = dcp_sd_index(sd, tl->t[i].key);
      if (k >= 0 && sd->e[k].kind == WEFT_SD_DTENSOR)
        s0 = weft_error(WEFT_ERR_INVALID, "broadcast_from_rank0: rank 0's entry '%s' is a DTensor; "
                        "it must hold full plain tensors (full_state_dict)", tl->t[i].key);
    }
    dcp_buf_u32(&hb, (uint32_t)s0);
    dcp_buf_str(&hb, s0 ? dcp_last_msg() : "");
    for (int64_t i = 0; s0 == WEFT_OK && i < tl->n; i++) {
      int64_t k = dcp_sd_index(sd, tl->t[i].key);
      dcp_buf_u32(&hb, k >= 0);
      if (k < 0) continue;
      const dcp_sd_ent *e = &sd->e[k];
      dcp_buf_u32(&hb, (uint32_t)e->kind);
      if (e->kind == WEFT_SD_TENSOR) {
        dcp_buf_u32(&hb, (uint32_t)e->t->dtype);
        dcp_buf_u32(&hb, (uint32_t)e->t->ndim);
        for (int d = 0; d < e->t->ndim; d++) dcp_buf_u64(&hb, (uint64_t)e->t->shape[d]);
      } else {
        dcp_buf_u32(&hb, (uint32_t)e->val.type);
        dcp_buf_str(&hb, e->val.text);
      }
    }
    dcp_buf_u64(&hb, (uint64_t)u0.count);
    for (int64_t i = 0; i < u0.count; i++) dcp_buf_str(&hb, u0.keys[i]);
    weft_key_list_clear(&m0);
    weft_key_list_clear(&u0);
    if (hb.oom) hlen = -1;
    else hlen = (int64_t)hb.len;
  }
  WEFT_CHECK_GOTO(dcp_bcast(&c, &hlen, sizeof hlen, 0), st, done);
  if (hlen < 0) {
    st = dcp_agree(&c, c.rank == 0 ? weft_error(WEFT_ERR_OOM, "broadcast header") : WEFT_OK,
                   "set state dict");
    goto done;
  }
  hdr = c.rank == 0 ? hb.p : malloc((size_t)(hlen ? hlen : 1));
  if (c.rank == 0) hb.p = NULL;
  if (!hdr) {
    st = weft_error(WEFT_ERR_OOM, "broadcast header");
    goto done; /* note: rank 0's broadcast then fails on timeout; OOM of a few KB only */
  }
  WEFT_CHECK_GOTO(dcp_bcast(&c, hdr, hlen, 0), st, done);
  /* decode: identical on every rank */
  dcp_rd rd = {hdr, (size_t)hlen, 0, false};
  weft_status s0 = (weft_status)dcp_rd_u32(&rd);
  char *m0 = dcp_rd_str(&rd);
  if (s0 != WEFT_OK) {
    st = c.rank == 0 ? weft_error(s0, "%s", m0 ? m0 : "?")
                     : weft_error(s0, "set state dict failed on rank 0: %s", m0 ? m0 : "?");
    free(m0);
    goto done;
  }
  free(m0);
  typedef struct pres {
    bool present;
    weft_sd_kind kind;
    weft_dtype dtype;
    int ndim;
    int64_t shape[WEFT_MAX_DIMS];
    weft_sd_value_type vtype;
    char *text;
  } pres;
  pres *p = calloc((size_t)(tl->n ? tl->n : 1), sizeof *p);
  if (!p) {
    st = weft_error(WEFT_ERR_OOM, "broadcast header");
    goto done;
  }
  for (int64_t i = 0; i < tl->n && !rd.bad; i++) {
    p[i].present = dcp_rd_u32(&rd) != 0;
    if (!p[i].present) continue;
    p[i].kind = (weft_sd_kind)dcp_rd_u32(&rd);
    if (p[i].kind == WEFT_SD_TENSOR) {
      p[i].dtype = (weft_dtype)dcp_rd_u32(&rd);
      p[i].ndim = (int)dcp_rd_u32(&rd);
      if (p[i].ndim > WEFT_MAX_DIMS) rd.bad = true;
      for (int d = 0; d < p[i].ndim && !rd.bad; d++) p[i].shape[d] = (int64_t)dcp_rd_u64(&rd);
    } else {
      p[i].vtype = (weft_sd_value_type)dcp_rd_u32(&rd);
      p[i].text = dcp_rd_str(&rd);
    }
  }
  uint64_t nu = dcp_rd_u64(&rd);
  for (int64_t i = 0; i < tl->n; i++)
    if (!p[i].present && st == WEFT_OK) st = keys_push(miss, tl->t[i].key);
  for (uint64_t i = 0; i < nu && !rd.bad && st == WEFT_OK; i++) {
    char *k = dcp_rd_str(&rd);
    if (k) st = keys_push(unexp, k);
    free(k);
  }
  if (rd.bad && st == WEFT_OK) st = weft_error(WEFT_ERR_INTERNAL, "malformed broadcast header");
  if (st == WEFT_OK && o->strict && (miss->count || unexp->count)) st = strict_error(miss, unexp);
  for (int64_t i = 0; i < tl->n && st == WEFT_OK; i++)
    if (p[i].present) st = check_pair(&tl->t[i], p[i].kind, p[i].vtype, p[i].ndim, p[i].shape);
  if (st != WEFT_OK) goto free_p; /* the same on every rank: no data moves */
  /* data, one tensor at a time */
  weft_status local = WEFT_OK;
  for (int64_t i = 0; i < tl->n && st == WEFT_OK; i++) {
    if (!p[i].present) continue;
    if (!tl->t[i].dt) {
      if (local == WEFT_OK) local = tl->t[i].set(tl->t[i].ctx, tl->t[i].key, p[i].vtype, p[i].text);
      continue;
    }
    int64_t numel = 1;
    for (int d = 0; d < p[i].ndim; d++) numel *= p[i].shape[d];
    int64_t nbytes = numel * (int64_t)weft_dtype_size(p[i].dtype);
    weft_tensor *buf = NULL;
    if (c.rank == 0) {
      const weft_tensor *src = sd->e[dcp_sd_index(sd, tl->t[i].key)].t;
      if (weft_tensor_is_contiguous(src)) {
        st = dcp_bcast(&c, src->data, nbytes, 0);
        if (st == WEFT_OK && local == WEFT_OK) local = slice_full_into(tl->t[i].dt, src);
        continue;
      }
      if (local == WEFT_OK) local = weft_tensor_clone(src, &buf);
      if (!buf) {
        /* cannot stage: send zeros so that nobody hangs; the error is agreed below */
        local = local ? local : weft_error(WEFT_ERR_OOM, "broadcast of '%s'", tl->t[i].key);
        weft_tensor_zeros(p[i].dtype, WEFT_CPU, p[i].ndim, p[i].shape, &buf);
      }
    } else {
      if (weft_tensor_create(p[i].dtype, WEFT_CPU, p[i].ndim, p[i].shape, &buf) != WEFT_OK) {
        if (local == WEFT_OK) local = weft_last_status();
        buf = NULL;
      }
    }
    if (!buf) {
      /* receive into a scratch piece by piece */
      char *scratch = malloc((size_t)1 << 20);
      for (int64_t at = 0; scratch && at < nbytes && st == WEFT_OK; at += (int64_t)1 << 20)
        st = dcp_bcast(&c, scratch, nbytes - at < ((int64_t)1 << 20) ? nbytes - at : ((int64_t)1 << 20), 0);
      free(scratch);
      continue;
    }
    st = dcp_bcast(&c, buf->data, nbytes, 0);
    if (st == WEFT_OK && local == WEFT_OK) local = slice_full_into(tl->t[i].dt, buf);
    weft_tensor_destroy(buf);
  }
  if (st == WEFT_OK) st = dcp_agree(&c, local, "set state dict");
free_p:
  for (int64_t i = 0; i < tl->n; i++) free(p[i].text);
  free(p);
done:
  free(hdr);
  free(hb.p);
  dcp_comm_close(&c);
  return st;
}

static weft_status apply(tlist *tl, const weft_state_dict *sd, const weft_state_dict_opts *o,
                         bool optimizer, weft_key_list *missing, weft_key_list *unexpected) {
  weft_key_list miss = {0, NULL}, unexp = {0, NULL};
  if (missing) memset(missing, 0, sizeof *missing);
  if (unexpected) memset(unexpected, 0, sizeof *unexpected);
  char **sorted = malloc((size_t)(tl->n ? tl->n : 1) * sizeof *sorted);
  if (!sorted) return weft_error(WEFT_ERR_OOM, "key table");
  for (int64_t i = 0; i < tl->n; i++) sorted[i] = tl->t[i].key;
  qsort(sorted, (size_t)tl->n, sizeof *sorted, cmp_str);
  weft_status st;
  if (o->broadcast_from_rank0) st = apply_bcast(tl, sorted, sd, o, optimizer, &miss, &unexp);
  else if (!sd) st = weft_error(WEFT_ERR_INVALID, "state dict is NULL");
  else st = apply_local(tl, sorted, sd, o, optimizer, &miss, &unexp);
  free(sorted);
  if (st == WEFT_OK && missing) *missing = miss;
  else weft_key_list_clear(&miss);
  if (st == WEFT_OK && unexpected) *unexpected = unexp;
  else weft_key_list_clear(&unexp);
  return st;
}

weft_status weft_set_model_state_dict(weft_module *model, const weft_state_dict *sd,
                                      const weft_state_dict_opts *opts, weft_key_list *missing,
                                      weft_key_list *unexpected) {
  weft_state_dict_opts o;
  WEFT_CHECK(get_opts(opts, &o));
  weft_param **ps;
  int n;
  WEFT_CHECK(params_of(model, &ps, &n));
  weft_status st = WEFT_OK;
  bool need = false;
  for (int i = 0; i < n; i++) need |= ps[i]->data == NULL;
  if (need) st = weft_module_materialize(model);
  tlist tl = {0};
  for (int i = 0; i < n && st == WEFT_OK; i++) st = tl_push(&tl, ps[i]->fqn, ps[i]->data, NULL, NULL, false);
  free(ps);
  if (st == WEFT_OK) st = apply(&tl, sd, &o, false, missing, unexpected);
  tl_free(&tl);
  return st;
}

typedef struct opt_ctx {
  weft_optimizer *opt;
  const char *fqn;
} opt_ctx;

static weft_status set_step(void *ctx, const char *key, weft_sd_value_type type, const char *text) {
  (void)type;
  opt_ctx *c = ctx;
  int64_t v = strtoll(text, NULL, 10);
  weft_status st = weft_optimizer_set_param_step(c->opt, c->fqn, v);
  if (st != WEFT_OK) return weft_error(st, "'%s': %s", key, dcp_last_msg());
  return WEFT_OK;
}

static weft_status set_num_steps(void *ctx, const char *key, weft_sd_value_type type,
                                 const char *text) {
  (void)type;
  weft_status st = weft_optimizer_set_num_steps(ctx, strtoll(text, NULL, 10));
  if (st != WEFT_OK) return weft_error(st, "'%s': %s", key, dcp_last_msg());
  return WEFT_OK;
}

static weft_status set_nothing(void *ctx, const char *key, weft_sd_value_type type,
                               const char *text) {
  (void)ctx;
  (void)key;
  (void)type;
  (void)text;
  return WEFT_OK;
}

static weft_status set_lr(void *ctx, const char *key, weft_sd_value_type type, const char *text) {
  (void)key;
  (void)type;
  opt_ctx *c = ctx;
  weft_optimizer_set_lr(c->opt, (float)strtod(text, NULL));
  return WEFT_OK;
}

weft_status weft_set_optimizer_state_dict(weft_module *model, weft_optimizer *opt,
                                          const weft_state_dict *sd,
                                          const weft_state_dict_opts *opts,
                                          weft_key_list *missing, weft_key_list *unexpected) {
  weft_state_dict_opts o;
  WEFT_CHECK(get_opts(opts, &o));
  if (!opt) return weft_error(WEFT_ERR_INVALID, "optimizer is NULL");
  weft_param **ps;
  int n;
  WEFT_CHECK(params_of(model, &ps, &n));
  tlist tl = {0};
  opt_ctx *ctx = calloc((size_t)(n ? n : 1), sizeof *ctx);
  weft_status st = ctx ? WEFT_OK : weft_error(WEFT_ERR_OOM, "optimizer targets");
  int ns = weft_optimizer_state_count(opt);
  for (int i = 0; i < ns && st == WEFT_OK; i++) {
    const char *name;
    weft_dtensor *dt;
    st = weft_optimizer_state_get(opt, i, &name, &dt);
    if (st == WEFT_OK) st = tl_push(&tl, name, dt, NULL, NULL, false);
  }
  if (st == WEFT_OK) st = tl_push(&tl, "state.num_steps", NULL, set_num_steps, opt, true);
  char key[4200];
  bool lr_done = false;
  for (int i = 0; i < n && st == WEFT_OK; i++) {
    int64_t step;
    if (weft_optimizer_get_param_step(opt, ps[i]->fqn, &step) != WEFT_OK) {
      weft_clear_error();
      continue;
    }
    ctx[i].opt = opt;
    ctx[i].fqn = ps[i]->fqn;
    snprintf(key, sizeof key, "state.%s.step", ps[i]->fqn);
    st = tl_push(&tl, key, NULL, set_step, &ctx[i], true);
    snprintf(key, sizeof key, "param_groups.%s.lr", ps[i]->fqn);
    /* one learning rate: the first parameter's entry sets it, the others
     * are accepted (not unexpected) and must merely be numbers */
    if (st == WEFT_OK) st = tl_push(&tl, key, NULL, lr_done ? set_nothing : set_lr, &ctx[i], false);
    if (st == WEFT_OK && !lr_done) lr_done = true;
  }
  if (st == WEFT_OK) st = apply(&tl, sd, &o, true, missing, unexpected);
  tl_free(&tl);
  free(ctx);
  free(ps);
  return st;
}
