/* tests/harness/golden.c — see golden.h. */
#include "golden.h"
#include "tokens.h"

#include "harness.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void golden_path(const golden *g, const char *file, char *buf, size_t cap) {
  snprintf(buf, cap, "%s/%s", g->dir, file);
}

static double jnum(const cJSON *o, const char *k) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

/* The first B T + 1 tokens of the llm.c token file (models/data/tokens.h)
 * as g->tokens and their next-token targets g->targets, (B, T) int32. */
static weft_status golden_read_tokens(const char *path, golden *g) {
  int64_t n = g->B * g->T;
  weft_token_file *f = NULL;
  WEFT_CHECK(weft_token_file_open(path, &f));
  int32_t *t = NULL;
  weft_status st = WEFT_OK;
  if (weft_token_file_count(f) < n + 1)
    st = weft_error(WEFT_ERR_CORRUPT, "%s: %lld tokens, need %lld (batch x seq + 1)", path,
                    (long long)weft_token_file_count(f), (long long)(n + 1));
  if (!st && !(t = malloc((size_t)(n + 1) * sizeof *t)))
    st = weft_error(WEFT_ERR_OOM, "golden tokens");
  if (!st) st = weft_token_file_read(f, 0, n + 1, t);
  weft_token_file_close(f);
  int64_t shape[2] = {g->B, g->T};
  if (!st) st = weft_tensor_create(WEFT_I32, WEFT_CPU, 2, shape, &g->tokens);
  if (!st) st = weft_tensor_create(WEFT_I32, WEFT_CPU, 2, shape, &g->targets);
  if (!st) {
    memcpy(g->tokens->data, t, (size_t)n * sizeof *t);
    memcpy(g->targets->data, t + 1, (size_t)n * sizeof *t);
  } else {
    golden_free(g);
  }
  free(t);
  return st;
}

weft_status golden_load(const char *name, golden *g) {
  memset(g, 0, sizeof *g);
  snprintf(g->dir, sizeof g->dir, "%s/golden/%s", WEFT_TEST_DATA_DIR, name);
  char path[600];
  golden_path(g, "expected.json", path, sizeof path);
  char *txt = weft_test_slurp(path, NULL);
  if (!txt) return weft_error(WEFT_ERR_IO, "cannot read %s", path);
  cJSON *j = cJSON_Parse(txt);
  free(txt);
  if (!j) return weft_error(WEFT_ERR_CORRUPT, "%s is not JSON", path);
  const cJSON *c = cJSON_GetObjectItemCaseSensitive(j, "config");
  const cJSON *h = cJSON_GetObjectItemCaseSensitive(j, "hyperparameters");
  weft_llama_config cfg = WEFT_LLAMA_CONFIG_INIT;
  cfg.dim = (int64_t)jnum(c, "dim");
  cfg.n_layers = (int64_t)jnum(c, "layers");
  cfg.n_heads = (int64_t)jnum(c, "heads");
  /* GPT-2's config has no kv_heads (every head its own) and gives the
   * number of learned positions */
  double kv = jnum(c, "kv_heads"), pos = jnum(c, "positions");
  cfg.n_kv_heads = isnan(kv) ? cfg.n_heads : (int64_t)kv;
  g->positions = isnan(pos) ? 0 : (int64_t)pos;
  cfg.ffn_dim = (int64_t)jnum(c, "ffn");
  cfg.vocab = (int64_t)jnum(c, "vocab");
  cfg.max_seq_len = (int64_t)jnum(c, "seq");
  g->cfg = cfg;
  g->T = cfg.max_seq_len;
  g->B = (int64_t)jnum(c, "batch");
  g->hp = WEFT_ADAMW_DEFAULT;
  g->hp.lr = (float)jnum(h, "lr");
  g->hp.beta1 = (float)jnum(h, "beta1");
  g->hp.beta2 = (float)jnum(h, "beta2");
  g->hp.eps = (float)jnum(h, "eps");
  g->hp.weight_decay = (float)jnum(h, "weight_decay");
  g->clip = jnum(h, "clip");
  g->loss = jnum(j, "loss");
  g->grad_norm = jnum(j, "grad_norm_before_clip");
  cJSON_Delete(j);

  golden_path(g, "tokens.bin", path, sizeof path);
  return golden_read_tokens(path, g);
}

void golden_free(golden *g) {
  weft_tensor_destroy(g->tokens);
  weft_tensor_destroy(g->targets);
  g->tokens = g->targets = NULL;
}

weft_status load_params(weft_module *root, const char *path) {
  weft_safetensors *f;
  WEFT_CHECK(weft_safetensors_open(path, &f));
  weft_param *ps[512];
  int n;
  weft_status st = weft_module_parameters(root, ps, 512, &n);
  for (int i = 0; !st && i < n; i++) {
    weft_tensor *t = NULL;
    st = weft_tensor_create(WEFT_F32, WEFT_CPU, ps[i]->spec.ndim, ps[i]->spec.shape, &t);
    if (!st) st = weft_safetensors_read_tensor(f, ps[i]->fqn, t);
    if (!st) st = weft_param_load(ps[i], t);
    weft_tensor_destroy(t);
  }
  weft_safetensors_close(f);
  return st;
}

weft_status golden_rows(weft_mesh *mesh, const weft_tensor *t, int64_t r0, int64_t n,
                        weft_dtensor **out) {
  weft_tensor *v;
  WEFT_CHECK(weft_tensor_narrow(t, 0, r0, n, &v));
  weft_placement pl[WEFT_MESH_MAX_DIMS];
  for (int i = 0; i < weft_mesh_ndim(mesh); i++) pl[i] = weft_replicate();
  weft_status st =
      weft_dtensor_distribute(mesh, v, WEFT_DTENSOR_ALL_RANKS, pl, weft_mesh_ndim(mesh), out);
  weft_tensor_destroy(v);
  return st;
}

/* full_tensor(d) on the host: on a device mesh the full tensor is made
 * there, then copied over (and the device copy freed); on the host it is
 * returned as it is. *out is left NULL on error. */
static weft_status full_on_host(const weft_dtensor *d, weft_tensor **out) {
  weft_tensor *full = NULL;
  *out = NULL;
  WEFT_CHECK(weft_dtensor_full_tensor(d, &full));
  if (full->device == WEFT_CPU) {
    *out = full;
    return WEFT_OK;
  }
  weft_status st = weft_tensor_to(full, WEFT_CPU, out);
  weft_tensor_destroy(full);
  return st;
}

weft_status golden_worst_grad_err(const golden *g, weft_param *const *ps, int np, double *worst,
                                  const char **worst_fqn) {
  char path[700];
  golden_path(g, "grads.safetensors", path, sizeof path);
  weft_safetensors *f;
  WEFT_CHECK(weft_safetensors_open(path, &f));
  *worst = 0;
  if (worst_fqn) *worst_fqn = np > 0 ? ps[0]->fqn : "";
  weft_status st = WEFT_OK;
  for (int i = 0; i < np && !st; i++) {
    if (!ps[i]->grad) {
      st = weft_error(WEFT_ERR_INVALID, "golden: parameter '%s' has no grad", ps[i]->fqn);
      break;
    }
    weft_tensor *full = NULL;
    double *ref = NULL;
    int64_t n = 0;
    st = full_on_host(ps[i]->grad, &full);
    if (!st) st = read_f64(f, ps[i]->fqn, &ref, &n);
    if (!st && n != weft_tensor_numel(full))
      st = weft_error(WEFT_ERR_INVALID, "golden: '%s' has %lld elements, the file %lld", ps[i]->fqn,
                      (long long)weft_tensor_numel(full), (long long)n);
    if (!st) {
      double e = weft_test_rel_norm_f32_f64(full->data, ref, n);
      if (e > *worst || i == 0) {
        *worst = e;
        if (worst_fqn) *worst_fqn = ps[i]->fqn;
      }
    }
    free(ref);
    weft_tensor_destroy(full);
  }
  weft_safetensors_close(f);
  return st;
}

weft_status golden_worst_update_err(const golden *g, weft_param *const *ps, int np, bool zero_grads,
                                    double *worst, const char **worst_fqn, int64_t *nzero,
                                    double *zero_move) {
  const char *files[3] = {"after_step.safetensors", "init.safetensors", "grads.safetensors"};
  weft_safetensors *f[3] = {NULL, NULL, NULL};
  weft_status st = WEFT_OK;
  for (int j = 0; j < 3 && !st; j++) {
    char path[700];
    golden_path(g, files[j], path, sizeof path);
    st = weft_safetensors_open(path, &f[j]);
  }
  *worst = 0;
  if (worst_fqn) *worst_fqn = np > 0 ? ps[0]->fqn : "";
  if (nzero) *nzero = 0;
  if (zero_move) *zero_move = 0;
  for (int i = 0; i < np && !st; i++) {
    weft_tensor *full = NULL;
    double *ref[3] = {NULL, NULL, NULL}; /* after, init, grad */
    int64_t n[3] = {0, 0, 0};
    float *du = NULL;
    double *dref = NULL;
    st = full_on_host(ps[i]->data, &full);
    for (int j = 0; j < 3 && !st; j++) st = read_f64(f[j], ps[i]->fqn, &ref[j], &n[j]);
    int64_t m = full ? weft_tensor_numel(full) : 0;
    if (!st && (n[0] != m || n[1] != m || n[2] != m))
      st = weft_error(WEFT_ERR_INVALID, "golden: '%s' has %lld elements, the files %lld/%lld/%lld",
                      ps[i]->fqn, (long long)m, (long long)n[0], (long long)n[1], (long long)n[2]);
    if (!st) {
      du = malloc((size_t)(m ? m : 1) * sizeof *du);
      dref = malloc((size_t)(m ? m : 1) * sizeof *dref);
      if (!du || !dref) st = weft_error(WEFT_ERR_OOM, "golden: update of '%s'", ps[i]->fqn);
    }
    if (!st) {
      const float *p = full->data;
      for (int64_t k = 0; k < m; k++) {
        double move = (double)p[k] - ref[1][k];
        bool zero = zero_grads && fabs(ref[2][k]) < 1e-12;
        du[k] = zero ? 0.0f : (float)move;
        dref[k] = zero ? 0.0 : ref[0][k] - ref[1][k];
        if (zero) {
          if (nzero) (*nzero)++;
          if (zero_move && fabs(move) > *zero_move) *zero_move = fabs(move);
        }
      }
      double e = weft_test_rel_norm_f32_f64(du, dref, m);
      if (e > *worst || i == 0) {
        *worst = e;
        if (worst_fqn) *worst_fqn = ps[i]->fqn;
      }
    }
    free(du);
    free(dref);
    for (int j = 0; j < 3; j++) free(ref[j]);
    weft_tensor_destroy(full);
  }
  for (int j = 0; j < 3; j++) weft_safetensors_close(f[j]);
  return st;
}

weft_status read_f64(weft_safetensors *f, const char *name, double **out, int64_t *n) {
  weft_safetensors_info info;
  WEFT_CHECK(weft_safetensors_find(f, name, &info));
  double *d = malloc((size_t)(info.numel ? info.numel : 1) * sizeof(double));
  if (!d) return weft_error(WEFT_ERR_OOM, "f64 buffer");
  weft_status st = weft_safetensors_read(f, name, WEFT_F64, d, info.numel);
  if (st) {
    free(d);
    return st;
  }
  *out = d;
  *n = info.numel;
  return WEFT_OK;
}

weft_status golden_same_params(const char *a_path, const char *b_path, int64_t *same,
                               int64_t *buffers, int64_t *nb, char *first_diff, size_t cap) {
  *same = *buffers = *nb = 0;
  first_diff[0] = 0;
  weft_safetensors *a = NULL, *b = NULL;
  weft_status st = weft_safetensors_open(a_path, &a);
  if (st == WEFT_OK) st = weft_safetensors_open(b_path, &b);
  if (st == WEFT_OK) *nb = weft_safetensors_count(b);
  for (int64_t i = 0; st == WEFT_OK && i < weft_safetensors_count(a); i++) {
    weft_safetensors_info x, y;
    if ((st = weft_safetensors_get(a, i, &x)) != WEFT_OK) break;
    if (strstr(x.name, ".attn.bias") || strstr(x.name, ".attn.masked_bias") ||
        strstr(x.name, "rotary_emb.inv_freq")) {
      (*buffers)++;
      continue;
    }
    bool equal = weft_safetensors_find(b, x.name, &y) == WEFT_OK && x.nbytes == y.nbytes &&
                 x.dtype == y.dtype && x.ndim == y.ndim &&
                 !memcmp(x.shape, y.shape, sizeof x.shape[0] * (size_t)x.ndim);
    weft_clear_error();
    if (equal) {
      char *p = malloc(x.nbytes ? x.nbytes : 1), *q = malloc(y.nbytes ? y.nbytes : 1);
      if (!p || !q) st = weft_error(WEFT_ERR_OOM, "golden_same_params: '%s'", x.name);
      if (st == WEFT_OK) st = weft_safetensors_read(a, x.name, x.dtype, p, x.numel);
      if (st == WEFT_OK) st = weft_safetensors_read(b, y.name, y.dtype, q, y.numel);
      equal = st == WEFT_OK && !memcmp(p, q, x.nbytes);
      free(p);
      free(q);
    }
    if (equal)
      (*same)++;
    else if (!first_diff[0])
      snprintf(first_diff, cap, "%s", x.name);
  }
  weft_safetensors_close(a);
  weft_safetensors_close(b);
  return st;
}
