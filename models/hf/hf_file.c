/* models/hf/hf_file.c — file-to-file conversion between transformers'
 * layouts and weft's (hf_file.h). */
#include "hf_file.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

/* One output tensor: its name, shape and bytes (owned). */
typedef struct out_tensor {
  hf_rule rule;
  weft_dtype dtype;
  int ndim;
  int64_t shape[WEFT_MAX_DIMS];
  char *data;
} out_tensor;

/* dst = src with rule's layout change; src [rows, cols] of es bytes. */
static void apply(char *dst, const char *src, hf_op op, int64_t heads, int64_t rows, int64_t cols,
                  size_t es) {
  const size_t row = (size_t)cols * es;
  if (op == HF_TRANSPOSE) {
    for (int64_t r = 0; r < rows; r++)
      for (int64_t c = 0; c < cols; c++)
        memcpy(dst + (size_t)(c * rows + r) * es, src + (size_t)(r * cols + c) * es, es);
    return;
  }
  const int64_t hd = rows / heads, half = hd / 2;
  for (int64_t h = 0; h < heads; h++)
    for (int64_t j = 0; j < half; j++)
      for (int64_t s = 0; s < 2; s++) {
        int64_t pair = h * hd + 2 * j + s, halves = h * hd + s * half + j;
        int64_t from = op == HF_PAIRS_TO_HALVES ? pair : halves;
        int64_t to = op == HF_PAIRS_TO_HALVES ? halves : pair;
        memcpy(dst + (size_t)to * row, src + (size_t)from * row, row);
      }
}

/* Whether rule's layout change fits a tensor of this shape (else an error
 * naming it). */
static weft_status check_rule(const char *func, const char *src, const weft_safetensors_info *in,
                              const hf_rule *r) {
  if (r->op == HF_KEEP) return WEFT_OK;
  if (in->ndim != 2)
    return weft_error(WEFT_ERR_INVALID, "%s: '%s' in '%s' has %d dims (a 2-D weight is needed)",
                      func, in->name, src, in->ndim);
  if (r->op == HF_TRANSPOSE) return WEFT_OK;
  if (r->heads < 1 || in->shape[0] % r->heads || (in->shape[0] / r->heads) % 2)
    return weft_error(WEFT_ERR_INVALID,
                      "%s: '%s' in '%s' has %" PRId64 " rows, which %" PRId64
                      " heads of an even head dim cannot split "
                      "(a model of another shape?)",
                      func, in->name, src, in->shape[0], r->heads);
  return WEFT_OK;
}

/* The tensors of one open file src through map into t[*m...]. */
static weft_status convert_file(const char *func, const char *src, weft_safetensors *f,
                                hf_map_fn map, void *ctx, out_tensor *t, int64_t *m) {
  weft_status st = WEFT_OK;
  int64_t n = weft_safetensors_count(f);
  for (int64_t i = 0; i < n && st == WEFT_OK; i++) {
    weft_safetensors_info in;
    if ((st = weft_safetensors_get(f, i, &in)) != WEFT_OK) break;
    out_tensor *o = &t[*m];
    memset(&o->rule, 0, sizeof o->rule);
    snprintf(o->rule.name, sizeof o->rule.name, "%s", in.name);
    if ((st = map(&in, ctx, &o->rule)) != WEFT_OK) break;
    if (o->rule.skip) continue;
    if ((st = check_rule(func, src, &in, &o->rule)) != WEFT_OK) break;
    o->dtype = in.dtype;
    o->ndim = in.ndim;
    memcpy(o->shape, in.shape, sizeof o->shape);
    const bool change = o->rule.op != HF_KEEP;
    char *raw = malloc(in.nbytes ? in.nbytes : 1);
    o->data = change ? malloc(in.nbytes ? in.nbytes : 1) : raw;
    if (!raw || !o->data) {
      if (change) free(raw);
      st = weft_error(WEFT_ERR_OOM, "%s: '%s' (%" PRIu64 " bytes)", func, in.name, in.nbytes);
      break;
    }
    (*m)++;
    st = weft_safetensors_read(f, in.name, in.dtype, raw, in.numel);
    if (st == WEFT_OK && change) {
      apply(o->data, raw, o->rule.op, o->rule.heads, in.shape[0], in.shape[1],
            weft_dtype_size(in.dtype));
      if (o->rule.op == HF_TRANSPOSE) {
        o->shape[0] = in.shape[1];
        o->shape[1] = in.shape[0];
      }
    }
    if (change) free(raw);
  }
  return st;
}

bool models_hf_is_index(const char *path) {
  size_t n = path ? strlen(path) : 0;
  return n > 5 && !strcmp(path + n - 5, ".json");
}

weft_status models_hf_index_files(const char *path, char ***files, int *n) {
  *files = NULL;
  *n = 0;
  FILE *f = fopen(path, "rb");
  if (!f) return weft_error(WEFT_ERR_IO, "cannot open the index '%s'", path);
  char *text = NULL;
  size_t len = 0, cap = 0;
  for (;;) {
    if (len + 4096 + 1 > cap) {
      cap = cap ? 2 * cap : 65536;
      char *t = realloc(text, cap);
      if (!t) {
        free(text);
        fclose(f);
        return weft_error(WEFT_ERR_OOM, "reading the index '%s'", path);
      }
      text = t;
    }
    size_t r = fread(text + len, 1, 4096, f);
    len += r;
    if (r < 4096) break;
  }
  fclose(f);
  text[len] = 0;
  cJSON *j = cJSON_Parse(text);
  free(text);
  const cJSON *map = j ? cJSON_GetObjectItemCaseSensitive(j, "weight_map") : NULL;
  if (!cJSON_IsObject(map)) {
    cJSON_Delete(j);
    return weft_error(WEFT_ERR_CORRUPT,
                      "'%s' is not a safetensors index (a JSON object with a \"weight_map\")",
                      path);
  }
  const char *slash = strrchr(path, '/');
  int dir = slash ? (int)(slash - path) + 1 : 0;
  int cnt = cJSON_GetArraySize(map);
  char **out = calloc((size_t)(cnt ? cnt : 1), sizeof *out);
  weft_status st = out ? WEFT_OK : weft_error(WEFT_ERR_OOM, "index '%s'", path);
  int m = 0;
  const cJSON *e;
  cJSON_ArrayForEach(e, map) {
    if (st != WEFT_OK) break;
    if (!cJSON_IsString(e) || !e->valuestring[0] || strchr(e->valuestring, '/')) {
      st = weft_error(WEFT_ERR_CORRUPT, "index '%s': tensor '%s' maps to %s%s%s", path,
                      e->string ? e->string : "?", cJSON_IsString(e) ? "'" : "no file name",
                      cJSON_IsString(e) ? e->valuestring : "", cJSON_IsString(e) ? "'" : "");
      break;
    }
    bool seen = false;
    for (int k = 0; k < m && !seen; k++) seen = !strcmp(out[k] + dir, e->valuestring);
    if (seen) continue;
    size_t need = (size_t)dir + strlen(e->valuestring) + 1;
    out[m] = malloc(need);
    if (!out[m]) {
      st = weft_error(WEFT_ERR_OOM, "index '%s'", path);
      break;
    }
    snprintf(out[m], need, "%.*s%s", dir, path, e->valuestring);
    m++;
  }
  cJSON_Delete(j);
  if (st == WEFT_OK && m == 0)
    st = weft_error(WEFT_ERR_CORRUPT, "index '%s' names no tensor", path);
  if (st != WEFT_OK) {
    for (int k = 0; k < m; k++) free(out[k]);
    free(out);
    return st;
  }
  *files = out;
  *n = m;
  return WEFT_OK;
}

static void free_files(char **files, int n) {
  for (int k = 0; k < n; k++) free(files[k]);
  free(files);
}

weft_status models_hf_open_probe(const char *path, weft_safetensors **f) {
  *f = NULL;
  if (!models_hf_is_index(path)) return weft_safetensors_open(path, f);
  char **files = NULL;
  int n = 0;
  WEFT_CHECK(models_hf_index_files(path, &files, &n));
  free_files(files, n);
  return WEFT_OK;
}

weft_status models_hf_convert(const char *func, const char *src, const char *dst, hf_map_fn map,
                              void *ctx) {
  if (!src || !dst) return weft_error(WEFT_ERR_INVALID, "%s: a path is NULL", func);
  char **files = NULL;
  int nf = 1;
  if (models_hf_is_index(src)) WEFT_CHECK(models_hf_index_files(src, &files, &nf));
  /* every tensor of every file: counted first */
  int64_t n = 0, m = 0;
  weft_status st = WEFT_OK;
  for (int k = 0; k < nf && st == WEFT_OK; k++) {
    weft_safetensors *f = NULL;
    st = weft_safetensors_open(files ? files[k] : src, &f);
    if (st == WEFT_OK) n += weft_safetensors_count(f);
    weft_safetensors_close(f);
  }
  out_tensor *t = st == WEFT_OK ? calloc((size_t)(n ? n : 1), sizeof *t) : NULL;
  weft_safetensors_entry *e = st == WEFT_OK ? calloc((size_t)(n ? n : 1), sizeof *e) : NULL;
  if (st == WEFT_OK && (!t || !e))
    st = weft_error(WEFT_ERR_OOM, "%s: %" PRId64 " tensors", func, n);
  for (int k = 0; k < nf && st == WEFT_OK; k++) {
    const char *path = files ? files[k] : src;
    weft_safetensors *f = NULL;
    if ((st = weft_safetensors_open(path, &f)) != WEFT_OK) break;
    st = convert_file(func, path, f, map, ctx, t, &m);
    weft_safetensors_close(f);
  }
  /* a name twice (two files of a set): the writer names it */
  for (int64_t i = 0; i < m; i++)
    e[i] = (weft_safetensors_entry){t[i].rule.name, t[i].dtype, t[i].ndim, t[i].shape, t[i].data};
  static const char *const meta[] = {"format", "pt", NULL};
  if (st == WEFT_OK) st = weft_safetensors_write(dst, e, m, meta);
  for (int64_t i = 0; i < m; i++) free(t[i].data);
  free(t);
  free(e);
  if (files) free_files(files, nf);
  if (st != WEFT_OK) return weft_error_trace(st, func);
  return WEFT_OK;
}
