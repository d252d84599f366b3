/* dcp/state_dict.c — the state dict container: named DTensors, plain
 * tensors and JSON values in insertion order, with a hash index on names.
 * Local; nothing here communicates. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dcp_internal.h"

static uint64_t fnv(const char *s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

static weft_status rehash(weft_state_dict *sd, int64_t cap) {
  int64_t *h = calloc((size_t)cap, sizeof *h);
  if (!h) return weft_error(WEFT_ERR_OOM, "state dict index");
  for (int64_t i = 0; i < sd->n; i++) {
    int64_t k = (int64_t)(fnv(sd->e[i].name) & (uint64_t)(cap - 1));
    while (h[k]) k = (k + 1) & (cap - 1);
    h[k] = i + 1;
  }
  free(sd->hash);
  sd->hash = h;
  sd->hcap = cap;
  return WEFT_OK;
}

int64_t dcp_sd_index(const weft_state_dict *sd, const char *name) {
  if (!sd || !name || !sd->hcap) return -1;
  int64_t k = (int64_t)(fnv(name) & (uint64_t)(sd->hcap - 1));
  while (sd->hash[k]) {
    int64_t i = sd->hash[k] - 1;
    if (strcmp(sd->e[i].name, name) == 0) return i;
    k = (k + 1) & (sd->hcap - 1);
  }
  return -1;
}

bool dcp_is_optimizer_key(const char *name) {
  return strncmp(name, "state.", 6) == 0 || strncmp(name, "param_groups.", 13) == 0;
}

weft_status weft_state_dict_create(weft_state_dict **out) {
  if (!out) return weft_error(WEFT_ERR_INVALID, "out is NULL");
  weft_state_dict *sd = calloc(1, sizeof *sd);
  if (!sd) return weft_error(WEFT_ERR_OOM, "state dict");
  if (rehash(sd, 16) != WEFT_OK) {
    free(sd);
    return weft_error_trace(WEFT_ERR_OOM, __func__);
  }
  *out = sd;
  return WEFT_OK;
}

static void free_entry(dcp_sd_ent *e) {
  if (e->owned) {
    weft_dtensor_destroy(e->dt);
    weft_tensor_destroy(e->t);
  }
  free(e->name);
  free(e->val.text);
  free(e->val.json);
  memset(e, 0, sizeof *e);
}

void weft_state_dict_destroy(weft_state_dict *sd) {
  if (!sd) return;
  for (int64_t i = 0; i < sd->nal; i++) {
    free(sd->al[i].alias);
    free(sd->al[i].name);
  }
  free(sd->al);
  for (int64_t i = 0; i < sd->n; i++) free_entry(&sd->e[i]);
  free(sd->e);
  free(sd->hash);
  free(sd);
}

static weft_status check_name(const weft_state_dict *sd, const char *name) {
  if (!sd) return weft_error(WEFT_ERR_INVALID, "state dict is NULL");
  if (!name || !name[0]) return weft_error(WEFT_ERR_INVALID, "entry name is NULL or empty");
  if (strlen(name) > 4096) return weft_error(WEFT_ERR_INVALID, "entry name longer than 4096 bytes");
  return WEFT_OK;
}

/* Appends an entry (name copied); *idx its index. */
static weft_status append(weft_state_dict *sd, const char *name, int64_t *idx) {
  if (dcp_sd_index(sd, name) >= 0)
    return weft_error(WEFT_ERR_INVALID, "state dict already has an entry '%s'", name);
  if (sd->n == sd->cap) {
    int64_t cap = sd->cap ? 2 * sd->cap : 16;
    dcp_sd_ent *e = realloc(sd->e, (size_t)cap * sizeof *e);
    if (!e) return weft_error(WEFT_ERR_OOM, "state dict of %" PRId64 " entries", cap);
    sd->e = e;
    sd->cap = cap;
  }
  dcp_sd_ent *e = &sd->e[sd->n];
  memset(e, 0, sizeof *e);
  e->name = dcp_strdup(name);
  if (!e->name) return weft_error(WEFT_ERR_OOM, "entry name");
  sd->n++;
  if (2 * sd->n > sd->hcap) {
    weft_status st = rehash(sd, 2 * sd->hcap);
    if (st != WEFT_OK) {
      free(e->name);
      sd->n--;
      return st;
    }
  } else {
    int64_t k = (int64_t)(fnv(name) & (uint64_t)(sd->hcap - 1));
    while (sd->hash[k]) k = (k + 1) & (sd->hcap - 1);
    sd->hash[k] = sd->n;
  }
  *idx = sd->n - 1;
  return WEFT_OK;
}

weft_status weft_state_dict_add_dtensor(weft_state_dict *sd, const char *name, weft_dtensor *dt,
                                        weft_local_ownership own) {
  WEFT_CHECK(check_name(sd, name));
  if (!dt) return weft_error(WEFT_ERR_INVALID, "'%s': DTensor is NULL", name);
  if (own != WEFT_LOCAL_COPY && own != WEFT_LOCAL_TAKE && own != WEFT_LOCAL_VIEW)
    return weft_error(WEFT_ERR_INVALID, "'%s': bad ownership %d", name, (int)own);
  weft_dtensor *mine = dt;
  if (own == WEFT_LOCAL_COPY) {
    const weft_dtensor_spec *s = weft_dtensor_get_spec(dt);
    WEFT_CHECK(weft_dtensor_empty(weft_dtensor_mesh(dt), s->dtype, s->ndim, s->shape, s->placements,
                                  s->mesh_ndim, &mine));
    weft_status st = weft_tensor_copy(weft_dtensor_local(mine), weft_dtensor_local(dt));
    if (st != WEFT_OK) {
      weft_dtensor_destroy(mine);
      return weft_error_trace(st, __func__);
    }
  }
  int64_t i;
  weft_status st = append(sd, name, &i);
  if (st != WEFT_OK) {
    if (own == WEFT_LOCAL_COPY) weft_dtensor_destroy(mine);
    return weft_error_trace(st, __func__);
  }
  sd->e[i].kind = WEFT_SD_DTENSOR;
  sd->e[i].dt = mine;
  sd->e[i].owned = own != WEFT_LOCAL_VIEW;
  return WEFT_OK;
}

weft_status weft_state_dict_add_tensor(weft_state_dict *sd, const char *name, weft_tensor *t,
                                       weft_local_ownership own) {
  WEFT_CHECK(check_name(sd, name));
  if (!t) return weft_error(WEFT_ERR_INVALID, "'%s': tensor is NULL", name);
  if (own != WEFT_LOCAL_COPY && own != WEFT_LOCAL_TAKE && own != WEFT_LOCAL_VIEW)
    return weft_error(WEFT_ERR_INVALID, "'%s': bad ownership %d", name, (int)own);
  if (t->device != WEFT_CPU)
    return weft_error(WEFT_ERR_UNSUPPORTED, "'%s': plain tensor entries must be CPU tensors", name);
  weft_tensor *mine = t;
  if (own == WEFT_LOCAL_COPY) WEFT_CHECK(weft_tensor_clone(t, &mine));
  int64_t i;
  weft_status st = append(sd, name, &i);
  if (st != WEFT_OK) {
    if (own == WEFT_LOCAL_COPY) weft_tensor_destroy(mine);
    return weft_error_trace(st, __func__);
  }
  sd->e[i].kind = WEFT_SD_TENSOR;
  sd->e[i].t = mine;
  sd->e[i].owned = own != WEFT_LOCAL_VIEW;
  return WEFT_OK;
}

weft_status dcp_sd_set_value(weft_state_dict *sd, const char *name, weft_sd_value_type type,
                             const char *text) {
  WEFT_CHECK(check_name(sd, name));
  dcp_vmeta v = {0};
  v.name = (char *)name;
  v.type = type;
  v.text = dcp_strdup(text);
  if (!v.text) return weft_error(WEFT_ERR_OOM, "value '%s'", name);
  weft_status st = dcp_value_render_json(&v);
  if (st != WEFT_OK) {
    free(v.text);
    return weft_error_trace(st, __func__);
  }
  int64_t i = dcp_sd_index(sd, name);
  if (i >= 0 && sd->e[i].kind != WEFT_SD_VALUE) {
    free(v.text);
    free(v.json);
    return weft_error(WEFT_ERR_INVALID, "state dict entry '%s' is a tensor, not a value", name);
  }
  if (i < 0) {
    st = append(sd, name, &i);
    if (st != WEFT_OK) {
      free(v.text);
      free(v.json);
      return weft_error_trace(st, __func__);
    }
  }
  dcp_sd_ent *e = &sd->e[i];
  free(e->val.text);
  free(e->val.json);
  e->kind = WEFT_SD_VALUE;
  e->val.type = type;
  e->val.text = v.text;
  e->val.json = v.json;
  return WEFT_OK;
}

weft_status weft_state_dict_set_int(weft_state_dict *sd, const char *name, int64_t v) {
  char buf[32];
  snprintf(buf, sizeof buf, "%" PRId64, v);
  WEFT_CHECK(dcp_sd_set_value(sd, name, WEFT_VALUE_INT, buf));
  return WEFT_OK;
}

weft_status weft_state_dict_set_double(weft_state_dict *sd, const char *name, double v) {
  char buf[64];
  if (isnan(v))
    snprintf(buf, sizeof buf, "nan");
  else if (isinf(v))
    snprintf(buf, sizeof buf, v > 0 ? "inf" : "-inf");
  else
    snprintf(buf, sizeof buf, "%a", v);
  WEFT_CHECK(dcp_sd_set_value(sd, name, WEFT_VALUE_DOUBLE, buf));
  return WEFT_OK;
}

weft_status weft_state_dict_set_string(weft_state_dict *sd, const char *name, const char *v) {
  if (!v) return weft_error(WEFT_ERR_INVALID, "'%s': string is NULL", name ? name : "(null)");
  WEFT_CHECK(dcp_sd_set_value(sd, name, WEFT_VALUE_STRING, v));
  return WEFT_OK;
}

weft_status weft_state_dict_set_json(weft_state_dict *sd, const char *name, const char *json) {
  if (!json) return weft_error(WEFT_ERR_INVALID, "'%s': JSON text is NULL", name ? name : "(null)");
  const char *end = NULL;
  cJSON *j = cJSON_ParseWithOpts(json, &end, true);
  if (!j)
    return weft_error(WEFT_ERR_INVALID, "'%s': not valid JSON (error near byte %td)",
                      name ? name : "(null)", end ? end - json : (ptrdiff_t)0);
  char *text = cJSON_PrintUnformatted(j);
  cJSON_Delete(j);
  if (!text) return weft_error(WEFT_ERR_OOM, "JSON value");
  weft_status st = dcp_sd_set_value(sd, name, WEFT_VALUE_JSON, text);
  free(text);
  return st;
}

static weft_status get_value(const weft_state_dict *sd, const char *name, const dcp_vmeta **v) {
  if (!sd || !name) return weft_error(WEFT_ERR_INVALID, "state dict or name is NULL");
  int64_t i = dcp_sd_index(sd, name);
  if (i < 0) return weft_error(WEFT_ERR_NOT_FOUND, "state dict has no entry '%s'", name);
  if (sd->e[i].kind != WEFT_SD_VALUE)
    return weft_error(WEFT_ERR_INVALID, "state dict entry '%s' is a tensor, not a value", name);
  *v = &sd->e[i].val;
  return WEFT_OK;
}

weft_status weft_state_dict_get_int(const weft_state_dict *sd, const char *name, int64_t *out) {
  const dcp_vmeta *v;
  WEFT_CHECK(get_value(sd, name, &v));
  if (!out) return weft_error(WEFT_ERR_INVALID, "out is NULL");
  if (v->type != WEFT_VALUE_INT)
    return weft_error(WEFT_ERR_INVALID, "value '%s' is a %s, not an int", name,
                      dcp_value_type_name(v->type));
  *out = strtoll(v->text, NULL, 10);
  return WEFT_OK;
}

weft_status weft_state_dict_get_double(const weft_state_dict *sd, const char *name, double *out) {
  const dcp_vmeta *v;
  WEFT_CHECK(get_value(sd, name, &v));
  if (!out) return weft_error(WEFT_ERR_INVALID, "out is NULL");
  if (v->type == WEFT_VALUE_INT)
    *out = (double)strtoll(v->text, NULL, 10);
  else if (v->type == WEFT_VALUE_DOUBLE)
    *out = strtod(v->text, NULL);
  else
    return weft_error(WEFT_ERR_INVALID, "value '%s' is a %s, not a number", name,
                      dcp_value_type_name(v->type));
  return WEFT_OK;
}

weft_status weft_state_dict_get_string(const weft_state_dict *sd, const char *name,
                                       const char **out) {
  const dcp_vmeta *v;
  WEFT_CHECK(get_value(sd, name, &v));
  if (!out) return weft_error(WEFT_ERR_INVALID, "out is NULL");
  if (v->type != WEFT_VALUE_STRING)
    return weft_error(WEFT_ERR_INVALID, "value '%s' is a %s, not a string", name,
                      dcp_value_type_name(v->type));
  *out = v->text;
  return WEFT_OK;
}

weft_status weft_state_dict_get_json(const weft_state_dict *sd, const char *name,
                                     const char **out) {
  const dcp_vmeta *v;
  WEFT_CHECK(get_value(sd, name, &v));
  if (!out) return weft_error(WEFT_ERR_INVALID, "out is NULL");
  *out = v->json;
  return WEFT_OK;
}

weft_status weft_state_dict_set_llama_config(weft_state_dict *sd, const char *name,
                                             const weft_llama_config *c) {
  if (!c) return weft_error(WEFT_ERR_INVALID, "config is NULL");
  char buf[1024];
  snprintf(buf, sizeof buf,
           "{\"dim\":%" PRId64 ",\"n_layers\":%" PRId64 ",\"n_heads\":%" PRId64
           ",\"n_kv_heads\":%" PRId64 ",\"ffn_dim\":%" PRId64 ",\"vocab\":%" PRId64
           ",\"max_seq_len\":%" PRId64 ",\"norm_eps\":%.9g,\"rope_theta\":%.17g,\"init_std\":%.9g}",
           c->dim, c->n_layers, c->n_heads, c->n_kv_heads, c->ffn_dim, c->vocab, c->max_seq_len,
           (double)c->norm_eps, c->rope_theta, (double)c->init_std);
  return weft_state_dict_set_json(sd, name, buf);
}

weft_status weft_state_dict_get_llama_config(const weft_state_dict *sd, const char *name,
                                             weft_llama_config *c) {
  const char *json;
  WEFT_CHECK(weft_state_dict_get_json(sd, name, &json));
  if (!c) return weft_error(WEFT_ERR_INVALID, "config is NULL");
  cJSON *j = cJSON_Parse(json);
  if (!j || !cJSON_IsObject(j)) {
    cJSON_Delete(j);
    return weft_error(WEFT_ERR_INVALID, "value '%s' is not a JSON object", name);
  }
  weft_llama_config r = WEFT_LLAMA_CONFIG_INIT;
  struct {
    const char *key;
    int64_t *dst;
  } ints[] = {{"dim", &r.dim},
              {"n_layers", &r.n_layers},
              {"n_heads", &r.n_heads},
              {"n_kv_heads", &r.n_kv_heads},
              {"ffn_dim", &r.ffn_dim},
              {"vocab", &r.vocab},
              {"max_seq_len", &r.max_seq_len}};
  weft_status st = WEFT_OK;
  for (size_t i = 0; i < sizeof ints / sizeof ints[0] && !st; i++) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(j, ints[i].key);
    if (!cJSON_IsNumber(it) || it->valuedouble != floor(it->valuedouble) ||
        fabs(it->valuedouble) > DCP_MAX_INT)
      st = weft_error(WEFT_ERR_INVALID, "config '%s': \"%s\" is missing or not an integer", name,
                      ints[i].key);
    else
      *ints[i].dst = (int64_t)it->valuedouble;
  }
  const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "norm_eps");
  const cJSON *th = cJSON_GetObjectItemCaseSensitive(j, "rope_theta");
  const cJSON *sd_ = cJSON_GetObjectItemCaseSensitive(j, "init_std");
  if (!st && (!cJSON_IsNumber(e) || !cJSON_IsNumber(th) || !cJSON_IsNumber(sd_)))
    st =
        weft_error(WEFT_ERR_INVALID, "config '%s': norm_eps, rope_theta or init_std missing", name);
  if (!st) {
    r.norm_eps = (float)e->valuedouble;
    r.rope_theta = th->valuedouble;
    r.init_std = (float)sd_->valuedouble;
    *c = r;
  }
  cJSON_Delete(j);
  return st;
}

int64_t weft_state_dict_count(const weft_state_dict *sd) { return sd ? sd->n : 0; }

static void fill_entry(const dcp_sd_ent *e, weft_sd_entry *out) {
  memset(out, 0, sizeof *out);
  out->name = e->name;
  out->kind = e->kind;
  out->dtensor = e->dt;
  out->tensor = e->t;
  out->value_type = e->val.type;
}

weft_status weft_state_dict_get(const weft_state_dict *sd, int64_t i, weft_sd_entry *out) {
  if (!sd || !out) return weft_error(WEFT_ERR_INVALID, "state dict or out is NULL");
  if (i < 0 || i >= sd->n)
    return weft_error(WEFT_ERR_INVALID, "entry %" PRId64 " outside [0, %" PRId64 ")", i, sd->n);
  fill_entry(&sd->e[i], out);
  return WEFT_OK;
}

weft_status weft_state_dict_find(const weft_state_dict *sd, const char *name, weft_sd_entry *out) {
  if (!sd || !name) return weft_error(WEFT_ERR_INVALID, "state dict or name is NULL");
  int64_t i = dcp_sd_index(sd, name);
  if (i < 0) return weft_error(WEFT_ERR_NOT_FOUND, "state dict has no entry '%s'", name);
  if (out) fill_entry(&sd->e[i], out);
  return WEFT_OK;
}

weft_status weft_state_dict_remove(weft_state_dict *sd, const char *name) {
  if (!sd || !name) return weft_error(WEFT_ERR_INVALID, "state dict or name is NULL");
  int64_t i = dcp_sd_index(sd, name);
  if (i < 0) return weft_error(WEFT_ERR_NOT_FOUND, "state dict has no entry '%s'", name);
  free_entry(&sd->e[i]);
  memmove(&sd->e[i], &sd->e[i + 1], (size_t)(sd->n - i - 1) * sizeof *sd->e);
  sd->n--;
  WEFT_CHECK(rehash(sd, sd->hcap));
  return WEFT_OK;
}

weft_status weft_state_dict_add_alias(weft_state_dict *sd, const char *alias, const char *name) {
  WEFT_CHECK(check_name(sd, alias));
  WEFT_CHECK(check_name(sd, name));
  if (strcmp(alias, name) == 0)
    return weft_error(WEFT_ERR_INVALID, "alias '%s' is the entry's own name", alias);
  for (int64_t i = 0; i < sd->nal; i++) {
    if (strcmp(sd->al[i].alias, alias) != 0) continue;
    if (strcmp(sd->al[i].name, name) == 0) return WEFT_OK; /* already there */
    return weft_error(WEFT_ERR_INVALID, "'%s' is already an alias of '%s' (not of '%s')", alias,
                      sd->al[i].name, name);
  }
  dcp_sd_alias *a = realloc(sd->al, (size_t)(sd->nal + 1) * sizeof *a);
  if (!a) return weft_error(WEFT_ERR_OOM, "state dict alias");
  sd->al = a;
  char *x = dcp_strdup(alias), *y = dcp_strdup(name);
  if (!x || !y) {
    free(x);
    free(y);
    return weft_error(WEFT_ERR_OOM, "state dict alias");
  }
  sd->al[sd->nal].alias = x;
  sd->al[sd->nal].name = y;
  sd->nal++;
  return WEFT_OK;
}

const char *dcp_sd_alias_of(const weft_state_dict *sd, const char *name, int i) {
  if (!sd) return NULL;
  for (int64_t k = 0; k < sd->nal; k++)
    if (strcmp(sd->al[k].name, name) == 0 && i-- == 0) return sd->al[k].alias;
  return NULL;
}

void weft_key_list_clear(weft_key_list *l) {
  if (!l) return;
  for (int64_t i = 0; i < l->count; i++) free(l->keys[i]);
  free(l->keys);
  l->keys = NULL;
  l->count = 0;
}
