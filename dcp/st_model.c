/* dcp/st_model.c — a model's parameters to and from one safetensors file
 * (interchange with PyTorch / Hugging Face): export gathers each parameter
 * and world rank 0 writes the file; import has every rank read only the
 * slices of its own shards. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dcp_internal.h"
#include "safetensors.h"

static weft_status model_params(weft_module *model, weft_param ***ps, int *n) {
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

weft_status weft_safetensors_export_model(weft_module *model, const char *path, weft_dtype dtype) {
  if (!path || !path[0]) return weft_error(WEFT_ERR_INVALID, "export: path is NULL or empty");
  if (!weft_dtype_is_float(dtype))
    return weft_error(WEFT_ERR_INVALID,
                      "export: dtype %s is not a floating-point dtype (f32, bf16, "
                      "f16, f64)",
                      weft_dtype_name(dtype));
  weft_param **ps;
  int n;
  WEFT_CHECK(model_params(model, &ps, &n));
  for (int i = 0; i < n; i++)
    if (!weft_param_state(ps[i])) {
      weft_status st =
          weft_error(WEFT_ERR_STATE, "export: parameter '%s' has no storage", ps[i]->fqn);
      free(ps);
      return st;
    }
  dcp_comm c;
  weft_status st = dcp_comm_open(NULL, &c);
  if (st != WEFT_OK) {
    free(ps);
    return weft_error_trace(st, __func__);
  }
  const bool writer = c.rank == 0;
  weft_tensor **keep = calloc((size_t)(n ? n : 1), sizeof *keep);
  weft_safetensors_entry *ent = calloc((size_t)(n ? n : 1), sizeof *ent);
  weft_status local = keep && ent ? WEFT_OK : weft_error(WEFT_ERR_OOM, "export tables");
  /* every rank takes part in every gather, even after a local error */
  for (int i = 0; i < n; i++) {
    weft_tensor *full = NULL;
    weft_status g = dcp_full_on_host(weft_param_state(ps[i]), &full);
    if (g != WEFT_OK && local == WEFT_OK) local = g;
    if (full && writer && local == WEFT_OK) {
      if (full->dtype == dtype) {
        keep[i] = full;
        full = NULL;
      } else {
        local = weft_cast(full, dtype, &keep[i]);
      }
    }
    weft_tensor_destroy(full);
  }
  if (writer && local == WEFT_OK) {
    for (int i = 0; i < n; i++) {
      ent[i].name = ps[i]->fqn;
      ent[i].dtype = dtype;
      ent[i].ndim = keep[i]->ndim;
      ent[i].shape = keep[i]->shape;
      ent[i].data = keep[i]->data;
    }
    const char *meta[] = {"format", "pt", NULL};
    local = weft_safetensors_write(path, ent, n, meta);
  }
  for (int i = 0; keep && i < n; i++) weft_tensor_destroy(keep[i]);
  free(keep);
  free(ent);
  free(ps);
  st = dcp_agree(&c, local, "safetensors export");
  dcp_comm_close(&c);
  return st;
}

static weft_status push_key(weft_key_list *l, const char *k) {
  char **n = realloc(l->keys, (size_t)(l->count + 1) * sizeof *n);
  if (!n) return weft_error(WEFT_ERR_OOM, "key list");
  l->keys = n;
  l->keys[l->count] = dcp_strdup(k);
  if (!l->keys[l->count]) return weft_error(WEFT_ERR_OOM, "key list");
  l->count++;
  return WEFT_OK;
}

/* Reads this rank's slices of parameter p from f's tensor `name` (the FQN,
 * or a tied parameter's alias). */
static weft_status import_param(const weft_safetensors *f, weft_param *p, const char *name) {
  weft_dtensor *dt = weft_param_state(p);
  weft_tensor *dev_local = weft_dtensor_local(dt), *lt; /* lt: on the host */
  size_t esz = weft_dtype_size(dev_local->dtype);
  weft_local_box *lb;
  int64_t nb;
  WEFT_CHECK(weft_dtensor_local_boxes(dt, &lb, &nb));
  weft_status st = dcp_stage_begin(dev_local, &lt);
  if (st != WEFT_OK) {
    free(lb);
    return st;
  }
  int64_t bs[WEFT_MAX_DIMS];
  dcp_byte_strides(lt, bs);
  char *tmp = NULL;
  for (int64_t k = 0; k < nb && st == WEFT_OK; k++) {
    const int nd = lt->ndim;
    char *dst = lt->data;
    for (int d = 0; d < nd; d++) dst += lb[k].local_start[d] * bs[d];
    int64_t cs[WEFT_MAX_DIMS];
    dcp_contig_strides(lb[k].global.size, nd, esz, cs);
    bool contig = true;
    for (int d = 0; d < nd; d++)
      if (lb[k].global.size[d] > 1 && bs[d] != cs[d]) contig = false;
    int64_t numel = weft_box_volume(&lb[k].global, nd);
    if (contig) {
      st = weft_safetensors_read_slice(f, name, nd, lb[k].global.off, lb[k].global.size, lt->dtype,
                                       dst, numel);
    } else {
      free(tmp);
      tmp = malloc((size_t)numel * esz);
      if (!tmp) {
        st = weft_error(WEFT_ERR_OOM, "import staging");
        break;
      }
      st = weft_safetensors_read_slice(f, name, nd, lb[k].global.off, lb[k].global.size, lt->dtype,
                                       tmp, numel);
      weft_tensor tv; /* the slice as read, dense: into its place in the local tensor */
      if (st == WEFT_OK)
        st = weft_tensor_view_init(&tv, tmp, lt->dtype, WEFT_CPU, nd, lb[k].global.size, NULL);
      if (st == WEFT_OK)
        st = weft_tensor_copy_region(lt, lb[k].local_start, &tv, NULL, lb[k].global.size);
    }
  }
  free(tmp);
  free(lb);
  return dcp_stage_end(dev_local, lt, st);
}

/* A tied parameter stored under two names a and b: this rank's slices of
 * p must be equal in both (read as p's dtype). */
static weft_status compare_tied(const weft_safetensors *f, const char *path, weft_param *p,
                                const char *a, const char *b) {
  const weft_dtensor *dt = weft_param_state(p);
  weft_dtype dtype = weft_dtensor_dtype(dt);
  size_t esz = weft_dtype_size(dtype);
  int nd = weft_dtensor_ndim(dt);
  weft_local_box *lb;
  int64_t nb;
  WEFT_CHECK(weft_dtensor_local_boxes(dt, &lb, &nb));
  weft_status st = WEFT_OK;
  for (int64_t k = 0; k < nb && st == WEFT_OK; k++) {
    int64_t numel = weft_box_volume(&lb[k].global, nd);
    char *x = malloc((size_t)numel * esz + 1), *y = malloc((size_t)numel * esz + 1);
    if (!x || !y) st = weft_error(WEFT_ERR_OOM, "import: tied parameter compare");
    if (st == WEFT_OK)
      st = weft_safetensors_read_slice(f, a, nd, lb[k].global.off, lb[k].global.size, dtype, x,
                                       numel);
    if (st == WEFT_OK)
      st = weft_safetensors_read_slice(f, b, nd, lb[k].global.off, lb[k].global.size, dtype, y,
                                       numel);
    if (st == WEFT_OK && memcmp(x, y, (size_t)numel * esz) != 0)
      st = weft_error(WEFT_ERR_CORRUPT,
                      "import: '%s' has '%s' and '%s', which name one tied "
                      "parameter, with different values",
                      path, a, b);
    free(x);
    free(y);
  }
  free(lb);
  return st;
}

weft_status weft_safetensors_import_model(weft_module *model, const char *path,
                                          const weft_state_dict_opts *opts, weft_key_list *missing,
                                          weft_key_list *unexpected) {
  if (missing) memset(missing, 0, sizeof *missing);
  if (unexpected) memset(unexpected, 0, sizeof *unexpected);
  if (opts && opts->version != WEFT_STATE_DICT_OPTS_VERSION)
    return weft_error(WEFT_ERR_INVALID, "weft_state_dict_opts version %d", opts->version);
  const bool strict = opts ? opts->strict : true;
  if (!path) return weft_error(WEFT_ERR_INVALID, "import: path is NULL");
  weft_param **ps;
  int n;
  WEFT_CHECK(model_params(model, &ps, &n));
  weft_status st = dcp_check_resharded(ps, n, "safetensors_import_model");
  if (st != WEFT_OK) {
    free(ps);
    return st;
  }
  dcp_comm c;
  st = dcp_comm_open(NULL, &c);
  if (st != WEFT_OK) {
    free(ps);
    return weft_error_trace(st, __func__);
  }
  weft_safetensors *f = NULL;
  weft_key_list miss = {0, NULL}, unexp = {0, NULL};
  /* src[i]: the name parameter i is read from (its FQN or, for a tied
   * parameter, an alias such as "lm_head.weight"); NULL when absent */
  const char **src = calloc((size_t)(n ? n : 1), sizeof *src);
  dcp_tie *ties = NULL;
  int nt = 0;
  weft_status local = src ? WEFT_OK : weft_error(WEFT_ERR_OOM, "import");
  if (local == WEFT_OK) local = dcp_model_ties(model, &ties, &nt);
  bool need = false;
  for (int i = 0; i < n; i++) need |= weft_param_state(ps[i]) == NULL;
  if (local == WEFT_OK && need) local = weft_module_materialize(model);
  if (local == WEFT_OK) local = weft_safetensors_open(path, &f);
  char a[256], b[256];
  for (int i = 0; i < n && local == WEFT_OK; i++) {
    weft_safetensors_info info;
    const char *other = NULL;
    if (weft_safetensors_find(f, ps[i]->fqn, &info) == WEFT_OK)
      src[i] = ps[i]->fqn;
    else
      weft_clear_error();
    for (int k = 0; k < nt; k++) {
      if (ties[k].p != ps[i]) continue;
      if (weft_safetensors_find(f, ties[k].alias, &info) != WEFT_OK) {
        weft_clear_error();
        continue;
      }
      if (!src[i])
        src[i] = ties[k].alias;
      else if (!other)
        other = ties[k].alias;
    }
    if (!src[i]) {
      local = push_key(&miss, ps[i]->fqn);
      continue;
    }
    for (int r = 0; r < 2 && local == WEFT_OK; r++) {
      const char *nm = r ? other : src[i];
      if (!nm) continue;
      local = weft_safetensors_find(f, nm, &info);
      if (local != WEFT_OK) break;
      const weft_dtensor_spec *s = weft_dtensor_get_spec(weft_param_state(ps[i]));
      bool same = info.ndim == s->ndim;
      for (int d = 0; same && d < s->ndim; d++) same = info.shape[d] == s->shape[d];
      if (!same) {
        weft_box x = {{0}, {0}}, y = {{0}, {0}};
        memcpy(x.size, info.shape, sizeof x.size);
        memcpy(y.size, s->shape, sizeof y.size);
        dcp_box_describe(&x, info.ndim, a, sizeof a);
        dcp_box_describe(&y, s->ndim, b, sizeof b);
        local = weft_error(WEFT_ERR_INVALID,
                           "import: '%s' has shape %s in '%s' but %s in the model", nm, a, path, b);
      } else if (!weft_dtype_is_float(info.dtype)) {
        local = weft_error(WEFT_ERR_INVALID, "import: '%s' is %s in '%s' (a float dtype is needed)",
                           nm, weft_dtype_name(info.dtype), path);
      }
    }
    /* a tied parameter stored under two names: the same values */
    if (local == WEFT_OK && other) local = compare_tied(f, path, ps[i], src[i], other);
  }
  for (int64_t i = 0; local == WEFT_OK && i < weft_safetensors_count(f); i++) {
    weft_safetensors_info info;
    local = weft_safetensors_get(f, i, &info);
    bool known = false;
    for (int j = 0; j < n && !known; j++) known = strcmp(ps[j]->fqn, info.name) == 0;
    for (int k = 0; k < nt && !known; k++) known = strcmp(ties[k].alias, info.name) == 0;
    if (local == WEFT_OK && !known) local = push_key(&unexp, info.name);
  }
  if (local == WEFT_OK && strict && miss.count)
    local = weft_error(WEFT_ERR_NOT_FOUND, "import: '%s' has no tensor '%s'%s", path, miss.keys[0],
                       miss.count > 1 ? " (and others)" : "");
  if (local == WEFT_OK && strict && unexp.count)
    local = weft_error(WEFT_ERR_INVALID, "import: '%s' has tensor '%s' that matches no parameter%s",
                       path, unexp.keys[0], unexp.count > 1 ? " (and others)" : "");
  st = dcp_agree(&c, local, "safetensors import");
  if (st == WEFT_OK) {
    local = WEFT_OK;
    for (int i = 0; i < n && local == WEFT_OK; i++)
      if (src[i]) local = import_param(f, ps[i], src[i]);
    st = dcp_agree(&c, local, "safetensors import");
  }
  weft_safetensors_close(f);
  dcp_comm_close(&c);
  dcp_ties_free(ties, nt);
  free(src);
  free(ps);
  if (st == WEFT_OK && missing)
    *missing = miss;
  else
    weft_key_list_clear(&miss);
  if (st == WEFT_OK && unexpected)
    *unexpected = unexp;
  else
    weft_key_list_clear(&unexp);
  return st;
}
