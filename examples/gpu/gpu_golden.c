/* examples/gpu/gpu_golden.c — golden folders (tests/data/golden/README.md)
 * for gpu_model: expected.json through cJSON and the llm.c token file.
 * Shared by weft-gpu-train --golden and tests/cuda/test_emu_train.c. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_golden.h"
#include "tokens.h"

static char *slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  if (fseek(f, 0, SEEK_END) != 0) {
    fclose(f);
    return NULL;
  }
  long n = ftell(f);
  if (n < 0 || fseek(f, 0, SEEK_SET) != 0) {
    fclose(f);
    return NULL;
  }
  char *buf = malloc((size_t)n + 1);
  size_t got = buf ? fread(buf, 1, (size_t)n, f) : 0;
  fclose(f);
  if (!buf) return NULL;
  buf[got] = '\0';
  if (len) *len = got;
  return buf;
}

static bool json_get(const cJSON *obj, const char *key, double *out) {
  const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, key);
  if (!cJSON_IsNumber(it)) return false;
  *out = it->valuedouble;
  return true;
}

/* The first B T + 1 tokens of the golden folder's token file as inputs
 * and next-token targets (g->inp, g->tgt: B T int32 each). */
static weft_status read_tokens(const char *path, gpu_golden *g) {
  const int64_t n = g->cfg.B * g->cfg.T;
  weft_token_file *f = NULL;
  WEFT_CHECK(weft_token_file_open(path, &f));
  weft_status st = WEFT_OK;
  int32_t *t = NULL;
  if (weft_token_file_count(f) < n + 1)
    st = weft_error(WEFT_ERR_CORRUPT, "%s: %lld tokens, need %lld (batch x seq + 1)", path,
                    (long long)weft_token_file_count(f), (long long)(n + 1));
  if (st == WEFT_OK) {
    t = malloc((size_t)(n + 1) * sizeof *t);
    g->inp = malloc((size_t)n * sizeof *g->inp);
    g->tgt = malloc((size_t)n * sizeof *g->tgt);
    if (!t || !g->inp || !g->tgt) st = weft_error(WEFT_ERR_OOM, "golden tokens");
  }
  if (st == WEFT_OK) st = weft_token_file_read(f, 0, n + 1, t);
  if (st == WEFT_OK) {
    memcpy(g->inp, t, (size_t)n * sizeof *t);
    memcpy(g->tgt, t + 1, (size_t)n * sizeof *t);
  }
  free(t);
  weft_token_file_close(f);
  return st;
}

weft_status gpu_golden_load(const char *dir, gpu_golden *g) {
  memset(g, 0, sizeof *g);
  if (strlen(dir) >= sizeof g->dir)
    return weft_error(WEFT_ERR_INVALID, "golden folder path longer than %zu bytes: %s",
                      sizeof g->dir - 1, dir);
  snprintf(g->dir, sizeof g->dir, "%s", dir);
  char path[1100];
  snprintf(path, sizeof path, "%s/expected.json", dir);
  char *text = slurp(path, NULL);
  if (!text) return weft_error(WEFT_ERR_IO, "cannot read %s", path);
  cJSON *j = cJSON_Parse(text);
  free(text);
  if (!j) return weft_error(WEFT_ERR_CORRUPT, "%s: not JSON", path);
  const cJSON *cf = cJSON_GetObjectItemCaseSensitive(j, "config");
  const cJSON *hp = cJSON_GetObjectItemCaseSensitive(j, "hyperparameters");
  double D, L, H, Hkv, F, V, T, B, lr, b1, b2, eps, wd;
  bool ok = cf && hp && json_get(cf, "dim", &D) && json_get(cf, "layers", &L) &&
            json_get(cf, "heads", &H) && json_get(cf, "kv_heads", &Hkv) &&
            json_get(cf, "ffn", &F) && json_get(cf, "vocab", &V) && json_get(cf, "seq", &T) &&
            json_get(cf, "batch", &B) && json_get(hp, "lr", &lr) && json_get(hp, "beta1", &b1) &&
            json_get(hp, "beta2", &b2) && json_get(hp, "eps", &eps) &&
            json_get(hp, "weight_decay", &wd) && json_get(hp, "clip", &g->clip) &&
            json_get(j, "loss", &g->loss) && json_get(j, "grad_norm_before_clip", &g->grad_norm);
  cJSON_Delete(j);
  if (!ok) return weft_error(WEFT_ERR_CORRUPT, "%s: missing config / hyperparameters / loss", path);
  g->cfg = (gpu_model_config){.D = (int64_t)D,
                              .L = (int64_t)L,
                              .H = (int64_t)H,
                              .Hkv = (int64_t)Hkv,
                              .F = (int64_t)F,
                              .V = (int64_t)V,
                              .T = (int64_t)T,
                              .B = (int64_t)B,
                              .rope_theta = 10000.0,
                              .norm_eps = 1e-5f};
  g->hp = (weft_adamw_params){.lr = (float)lr,
                              .beta1 = (float)b1,
                              .beta2 = (float)b2,
                              .eps = (float)eps,
                              .weight_decay = (float)wd};
  /* llm.c token file (models/data/tokens.h): inputs tokens[0:BT], targets
   * tokens[1:BT+1] */
  snprintf(path, sizeof path, "%s/tokens.bin", dir);
  return read_tokens(path, g);
}

double gpu_golden_rel_err(const float *got, const double *want, const float *base, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; i++) {
    double b = base ? (double)base[i] : 0.0, w = want[i] - b, e = (double)got[i] - b - w;
    num += e * e;
    den += w * w;
  }
  return den > 0 ? sqrt(num / den) : sqrt(num);
}

void gpu_golden_free(gpu_golden *g) {
  free(g->inp);
  free(g->tgt);
  g->inp = g->tgt = NULL;
}
