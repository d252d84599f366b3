/* dcp/load.c — collective load with resharding.
 *
 * Rank 0 reads metadata.json and broadcasts its text (or its error), so
 * every rank parses the same bytes and finds the same metadata errors.
 * Each rank then checks its own entries against the metadata (keys,
 * dtypes, global shapes, value types) and opens the data files its shards
 * need (header and size checks); one agreement all-reduce later every
 * rank knows whether anyone failed, before any entry is written. Then each
 * rank reads, for each local box of each entry, the overlapping parts of
 * the saved chunks (dcp_ck_read_region: only the blocks holding needed
 * bytes, each verified), and a second agreement settles the outcome. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dcp_internal.h"

/* Rank 0's metadata text to every rank. */
static weft_status share_metadata(const dcp_comm *c, const char *dir, char **text, size_t *len) {
  *text = NULL;
  *len = 0;
  int64_t hdr[2] = {0, 0};
  char msg[2048] = "";
  weft_status st = WEFT_OK;
  if (c->rank == 0) {
    st = dcp_read_metadata_file(dir, text, len);
    if (st != WEFT_OK) {
      snprintf(msg, sizeof msg, "%s", dcp_last_msg());
      hdr[0] = -(int64_t)st;
    } else {
      hdr[0] = (int64_t)*len;
    }
  }
  WEFT_CHECK(dcp_bcast(c, hdr, sizeof hdr, 0));
  if (hdr[0] < 0) {
    WEFT_CHECK(dcp_bcast(c, msg, sizeof msg, 0));
    if (c->rank == 0) return weft_error(st, "%s", msg);
    return weft_error((weft_status)(-hdr[0]), "load: %s", msg);
  }
  if (c->rank != 0) {
    *text = malloc((size_t)hdr[0] + 1);
    if (!*text) return weft_error(WEFT_ERR_OOM, "load: metadata of %" PRId64 " bytes", hdr[0]);
    *len = (size_t)hdr[0];
  }
  WEFT_CHECK(dcp_bcast(c, *text, hdr[0], 0));
  (*text)[*len] = '\0';
  return WEFT_OK;
}

static bool value_compatible(weft_sd_value_type want, weft_sd_value_type have) {
  return want == have || want == WEFT_VALUE_JSON ||
         (want == WEFT_VALUE_DOUBLE && have == WEFT_VALUE_INT);
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

/* The saved tensor that entry `name` reads: its own, else the first of its
 * aliases (weft_state_dict_add_alias: a tied parameter's other FQN) that
 * the checkpoint has; NULL if none. *other: an alias saved as well (then
 * both must hold the same values). */
static const dcp_tmeta *source_of(const weft_dcp_checkpoint *ck, const weft_state_dict *sd,
                                  const char *name, const dcp_tmeta **other) {
  const dcp_tmeta *t = dcp_meta_find_tensor(&ck->m, name);
  *other = NULL;
  const char *a;
  for (int i = 0; (a = dcp_sd_alias_of(sd, name, i)) != NULL; i++) {
    const dcp_tmeta *x = dcp_meta_find_tensor(&ck->m, a);
    if (!x) continue;
    if (!t)
      t = x;
    else if (!*other)
      *other = x;
  }
  return t;
}

/* A tied parameter saved under two names (t and o): the region of this
 * rank's shard must hold the same bytes in both (each rank compares its
 * own regions; the agreement after the checks spreads a mismatch). */
static weft_status compare_tied(weft_dcp_checkpoint *ck, const dcp_tmeta *t, const dcp_tmeta *o,
                                const weft_box *region) {
  char a[256], b[256];
  bool same = t->dtype == o->dtype && t->ndim == o->ndim;
  for (int d = 0; same && d < t->ndim; d++) same = t->shape[d] == o->shape[d];
  if (!same) {
    weft_box x = {{0}, {0}}, y = {{0}, {0}};
    memcpy(x.size, t->shape, sizeof x.size);
    memcpy(y.size, o->shape, sizeof y.size);
    dcp_box_describe(&x, t->ndim, a, sizeof a);
    dcp_box_describe(&y, o->ndim, b, sizeof b);
    return weft_error(WEFT_ERR_CORRUPT,
                      "load: checkpoint '%s' has the tied parameter as '%s' "
                      "(%s%s) and as '%s' (%s%s)",
                      ck->dir, t->name, weft_dtype_name(t->dtype), a, o->name,
                      weft_dtype_name(o->dtype), b);
  }
  WEFT_CHECK(dcp_ck_prepare_region(ck, o, region));
  size_t esz = weft_dtype_size(t->dtype);
  int64_t n = weft_box_volume(region, t->ndim);
  if (n == 0) return WEFT_OK;
  char *x = malloc((size_t)n * esz), *y = malloc((size_t)n * esz);
  weft_status st = x && y ? WEFT_OK : weft_error(WEFT_ERR_OOM, "load: tied parameter compare");
  int64_t cs[WEFT_MAX_DIMS];
  dcp_contig_strides(region->size, t->ndim, esz, cs);
  if (st == WEFT_OK) st = dcp_ck_read_region(ck, t, region, x, cs);
  if (st == WEFT_OK) st = dcp_ck_read_region(ck, o, region, y, cs);
  if (st == WEFT_OK && memcmp(x, y, (size_t)n * esz) != 0) {
    dcp_box_describe(region, t->ndim, a, sizeof a);
    st = weft_error(WEFT_ERR_CORRUPT,
                    "load: checkpoint '%s' has '%s' and '%s', which name one "
                    "tied parameter, with different values (in %s)",
                    ck->dir, t->name, o->name, a);
  }
  free(x);
  free(y);
  return st;
}

/* Checks entry e against the metadata; opens what its shard needs. */
static weft_status check_entry(weft_dcp_checkpoint *ck, const weft_state_dict *sd,
                               const dcp_sd_ent *e, bool *absent) {
  *absent = false;
  char a[256], b[256];
  if (e->kind == WEFT_SD_VALUE) {
    const dcp_vmeta *v = dcp_meta_find_value(&ck->m, e->name);
    if (!v) {
      *absent = true;
      return WEFT_OK;
    }
    if (!value_compatible(e->val.type, v->type))
      return weft_error(WEFT_ERR_INVALID,
                        "load: value '%s' is a %s in checkpoint '%s' but the state "
                        "dict expects a %s",
                        e->name, dcp_value_type_name(v->type), ck->dir,
                        dcp_value_type_name(e->val.type));
    return WEFT_OK;
  }
  const dcp_tmeta *other;
  const dcp_tmeta *t = source_of(ck, sd, e->name, &other);
  if (!t) {
    *absent = true;
    if (dcp_meta_find_value(&ck->m, e->name))
      return weft_error(WEFT_ERR_INVALID, "load: '%s' is a value in checkpoint '%s', not a tensor",
                        e->name, ck->dir);
    return WEFT_OK;
  }
  const weft_tensor *lt = e->kind == WEFT_SD_DTENSOR ? weft_dtensor_local(e->dt) : e->t;
  weft_dtype dt = e->kind == WEFT_SD_DTENSOR ? weft_dtensor_dtype(e->dt) : e->t->dtype;
  int nd = e->kind == WEFT_SD_DTENSOR ? weft_dtensor_ndim(e->dt) : e->t->ndim;
  const int64_t *shape = e->kind == WEFT_SD_DTENSOR ? weft_dtensor_shape(e->dt) : e->t->shape;
  bool same = nd == t->ndim;
  for (int d = 0; same && d < nd; d++) same = shape[d] == t->shape[d];
  if (!same || dt != t->dtype) {
    weft_box x = {{0}, {0}}, y = {{0}, {0}};
    memcpy(x.size, t->shape, sizeof x.size);
    for (int d = 0; d < nd && d < WEFT_MAX_DIMS; d++) y.size[d] = shape[d];
    dcp_box_describe(&x, t->ndim, a, sizeof a);
    dcp_box_describe(&y, nd, b, sizeof b);
    return weft_error(WEFT_ERR_INVALID,
                      "load: tensor '%s' is %s%s in checkpoint '%s' but %s%s in "
                      "the state dict%s%s%s",
                      t->name, weft_dtype_name(t->dtype), a, ck->dir, weft_dtype_name(dt), b,
                      strcmp(t->name, e->name) ? " (as '" : "",
                      strcmp(t->name, e->name) ? e->name : "",
                      strcmp(t->name, e->name) ? "')" : "");
  }
  if (!lt) return weft_error(WEFT_ERR_INVALID, "load: tensor '%s' has no local tensor", e->name);
  if (e->kind == WEFT_SD_DTENSOR) {
    const weft_dtensor_spec *s = weft_dtensor_get_spec(e->dt);
    for (int d = 0; d < s->mesh_ndim; d++)
      if (s->placements[d].kind == WEFT_PLACE_PARTIAL)
        return weft_error(WEFT_ERR_UNSUPPORTED,
                          "load: tensor '%s' has a Partial placement (a "
                          "partial value cannot be loaded into)",
                          e->name);
    weft_local_box *lb;
    int64_t n;
    WEFT_CHECK(weft_dtensor_local_boxes(e->dt, &lb, &n));
    weft_status st = WEFT_OK;
    for (int64_t k = 0; k < n && st == WEFT_OK; k++) {
      st = dcp_ck_prepare_region(ck, t, &lb[k].global);
      if (st == WEFT_OK && other) st = compare_tied(ck, t, other, &lb[k].global);
    }
    free(lb);
    return st;
  }
  weft_box whole = {{0}, {0}};
  memcpy(whole.size, t->shape, sizeof whole.size);
  WEFT_CHECK(dcp_ck_prepare_region(ck, t, &whole));
  return other ? compare_tied(ck, t, other, &whole) : WEFT_OK;
}

static weft_status read_entry(weft_dcp_checkpoint *ck, weft_state_dict *sd, int64_t i) {
  dcp_sd_ent *e = &sd->e[i];
  if (e->kind == WEFT_SD_VALUE) {
    const dcp_vmeta *v = dcp_meta_find_value(&ck->m, e->name);
    if (!v) return WEFT_OK;
    if (e->val.type == WEFT_VALUE_JSON)
      return dcp_sd_set_value(sd, e->name, WEFT_VALUE_JSON, v->json);
    if (e->val.type == WEFT_VALUE_DOUBLE && v->type == WEFT_VALUE_INT) {
      char buf[64];
      snprintf(buf, sizeof buf, "%a", (double)strtoll(v->text, NULL, 10));
      return dcp_sd_set_value(sd, e->name, WEFT_VALUE_DOUBLE, buf);
    }
    return dcp_sd_set_value(sd, e->name, v->type, v->text);
  }
  const dcp_tmeta *other;
  const dcp_tmeta *t = source_of(ck, sd, e->name, &other);
  if (!t) return WEFT_OK;
  int64_t bs[WEFT_MAX_DIMS];
  weft_tensor *host = NULL; /* the destination, or its host staging on a device */
  if (e->kind == WEFT_SD_TENSOR) {
    weft_box whole = {{0}, {0}};
    memcpy(whole.size, t->shape, sizeof whole.size);
    WEFT_CHECK(dcp_stage_begin(e->t, &host));
    dcp_byte_strides(host, bs);
    return dcp_stage_end(e->t, host, dcp_ck_read_region(ck, t, &whole, host->data, bs));
  }
  weft_tensor *lt = weft_dtensor_local(e->dt);
  weft_local_box *lb;
  int64_t n;
  WEFT_CHECK(weft_dtensor_local_boxes(e->dt, &lb, &n));
  weft_status st = dcp_stage_begin(lt, &host);
  if (st == WEFT_OK) dcp_byte_strides(host, bs);
  for (int64_t k = 0; k < n && st == WEFT_OK; k++) {
    char *dst = host->data;
    for (int d = 0; d < t->ndim; d++) dst += lb[k].local_start[d] * bs[d];
    st = dcp_ck_read_region(ck, t, &lb[k].global, dst, bs);
  }
  if (host) st = dcp_stage_end(lt, host, st);
  free(lb);
  return st;
}

weft_status weft_dcp_load(weft_state_dict *sd, const char *dir, const weft_dcp_opts *opts,
                          weft_key_list *missing) {
  if (missing) memset(missing, 0, sizeof *missing);
  if (opts && opts->version != WEFT_DCP_OPTS_VERSION)
    return weft_error(WEFT_ERR_INVALID, "weft_dcp_opts version %d (this library: %d)",
                      opts->version, WEFT_DCP_OPTS_VERSION);
  if (!sd) return weft_error(WEFT_ERR_INVALID, "load: state dict is NULL");
  if (!dir || !dir[0]) return weft_error(WEFT_ERR_INVALID, "load: directory is NULL or empty");
  dcp_complete_pending();
  dcp_comm c;
  WEFT_CHECK(dcp_comm_open(opts ? opts->group : NULL, &c));
  char *text = NULL;
  size_t len = 0;
  weft_dcp_checkpoint *ck = NULL;
  weft_key_list miss = {0, NULL};
  weft_status st = share_metadata(&c, dir, &text, &len);
  /* identical text on every rank: a parse error is the same everywhere */
  if (st == WEFT_OK) st = dcp_ck_from_text(dir, text, len, &ck);
  free(text);
  if (st != WEFT_OK) goto done;
  const bool partial = opts && opts->allow_partial;
  weft_status local = WEFT_OK;
  for (int64_t i = 0; i < sd->n && local == WEFT_OK; i++) {
    bool absent;
    local = check_entry(ck, sd, &sd->e[i], &absent);
    if (local == WEFT_OK && absent) local = push_key(&miss, sd->e[i].name);
  }
  if (local == WEFT_OK && miss.count && !partial)
    local = weft_error(WEFT_ERR_NOT_FOUND, "load: checkpoint '%s' has no entry '%s'%s%s", dir,
                       miss.keys[0], miss.count > 1 ? " (and other keys of the state dict: " : "",
                       miss.count > 1 ? "use allow_partial to skip them)" : "");
  st = dcp_agree(&c, local, "load");
  if (st != WEFT_OK) goto done;
  local = WEFT_OK;
  for (int64_t i = 0; i < sd->n && local == WEFT_OK; i++) local = read_entry(ck, sd, i);
  st = dcp_agree(&c, local, "load");
done:
  weft_dcp_close(ck);
  dcp_comm_close(&c);
  if (st == WEFT_OK && missing)
    *missing = miss;
  else
    weft_key_list_clear(&miss);
  /* the message's head names the function the caller called, not the
   * helper deep inside that found the fault */
  return st == WEFT_OK ? st : weft_error_trace(st, __func__);
}
