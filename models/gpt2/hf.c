/* models/gpt2/hf.c — GPT-2 weights between Hugging Face transformers'
 * layout and weft's (nanoGPT's / llm.c's), file to file (gpt2.h). */
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpt2.h"
#include "safetensors.h"

#define PREFIX "transformer."

/* The part of a block tensor's name after "h.N." (NULL if it is not one). */
static const char *block_rest(const char *name) {
  if (strncmp(name, "h.", 2) != 0) return NULL;
  const char *p = name + 2;
  if (*p < '0' || *p > '9') return NULL;
  while (*p >= '0' && *p <= '9') p++;
  return *p == '.' ? p + 1 : NULL;
}

/* Conv1D modules in transformers' GPT-2: weight [in, out]. */
static bool is_conv1d_weight(const char *name) {
  const char *r = block_rest(name);
  return r && (!strcmp(r, "attn.c_attn.weight") || !strcmp(r, "attn.c_proj.weight") ||
               !strcmp(r, "mlp.c_fc.weight") || !strcmp(r, "mlp.c_proj.weight"));
}

/* transformers' non-parameter buffers: the causal masks. */
static bool is_mask_buffer(const char *name) {
  const char *r = block_rest(name);
  return r && (!strcmp(r, "attn.bias") || !strcmp(r, "attn.masked_bias"));
}

/* src's [rows, cols] elements of es bytes, transposed into dst. */
static void transpose(char *dst, const char *src, int64_t rows, int64_t cols, size_t es) {
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c = 0; c < cols; c++)
      memcpy(dst + ((size_t)(c * rows + r)) * es, src + ((size_t)(r * cols + c)) * es, es);
}

/* One output tensor: its name, shape and bytes (owned). */
typedef struct out_tensor {
  char name[256];
  weft_dtype dtype;
  int ndim;
  int64_t shape[WEFT_MAX_DIMS];
  char *data;
} out_tensor;

/* Reads every tensor of `src`, renames (to_hf: strip "transformer.",
 * else add it to HF names), transposes the Conv1D weights and writes
 * `dst`. to_hf drops the tied "lm_head.weight"; from HF the mask buffers
 * are dropped and "lm_head.weight" is kept under its name (weft's import
 * reads it as the tied wte's alias and checks it equals wte). */
static weft_status convert(const char *func, const char *src, const char *dst, bool to_hf) {
  if (!src || !dst) return weft_error(WEFT_ERR_INVALID, "%s: a path is NULL", func);
  weft_safetensors *f = NULL;
  WEFT_CHECK(weft_safetensors_open(src, &f));
  int64_t n = weft_safetensors_count(f);
  out_tensor *t = calloc((size_t)(n ? n : 1), sizeof *t);
  weft_safetensors_entry *e = calloc((size_t)(n ? n : 1), sizeof *e);
  weft_status st = t && e ? WEFT_OK : weft_error(WEFT_ERR_OOM, "%s: %" PRId64 " tensors", func, n);
  int64_t m = 0;
  for (int64_t i = 0; i < n && st == WEFT_OK; i++) {
    weft_safetensors_info info;
    if ((st = weft_safetensors_get(f, i, &info)) != WEFT_OK) break;
    const char *name = info.name;
    if (!strncmp(name, PREFIX, strlen(PREFIX))) name += strlen(PREFIX);
    if (to_hf && !strcmp(name, "lm_head.weight")) continue;
    if (!to_hf && is_mask_buffer(name)) continue;
    out_tensor *o = &t[m];
    int w = !strcmp(name, "lm_head.weight") || to_hf
                ? snprintf(o->name, sizeof o->name, "%s", name)
                : snprintf(o->name, sizeof o->name, PREFIX "%s", name);
    if (w < 0 || (size_t)w >= sizeof o->name) {
      st = weft_error(WEFT_ERR_INVALID, "%s: tensor name '%.80s...' in '%s' is too long", func,
                      info.name, src);
      break;
    }
    bool conv = is_conv1d_weight(name);
    if (conv && info.ndim != 2) {
      st = weft_error(WEFT_ERR_INVALID, "%s: '%s' in '%s' has %d dims (a 2-D weight is needed)",
                      func, info.name, src, info.ndim);
      break;
    }
    o->dtype = info.dtype;
    o->ndim = info.ndim;
    memcpy(o->shape, info.shape, sizeof o->shape);
    char *raw = malloc(info.nbytes ? info.nbytes : 1);
    o->data = conv ? malloc(info.nbytes ? info.nbytes : 1) : raw;
    if (!raw || !o->data) {
      if (conv) free(raw);
      st = weft_error(WEFT_ERR_OOM, "%s: '%s' (%" PRIu64 " bytes)", func, info.name, info.nbytes);
      break;
    }
    m++;
    st = weft_safetensors_read(f, info.name, info.dtype, raw, info.numel);
    if (st == WEFT_OK && conv) {
      transpose(o->data, raw, info.shape[0], info.shape[1], weft_dtype_size(info.dtype));
      o->shape[0] = info.shape[1];
      o->shape[1] = info.shape[0];
    }
    if (conv) free(raw);
  }
  weft_safetensors_close(f);
  for (int64_t i = 0; i < m; i++)
    e[i] = (weft_safetensors_entry){t[i].name, t[i].dtype, t[i].ndim, t[i].shape, t[i].data};
  static const char *const meta[] = {"format", "pt", NULL};
  if (st == WEFT_OK) st = weft_safetensors_write(dst, e, m, meta);
  for (int64_t i = 0; i < m; i++) free(t[i].data);
  free(t);
  free(e);
  if (st != WEFT_OK) return weft_error_trace(st, func);
  return WEFT_OK;
}

weft_status weft_gpt2_hf_to_weft(const char *hf_path, const char *weft_path) {
  return convert("weft_gpt2_hf_to_weft", hf_path, weft_path, false);
}

weft_status weft_gpt2_weft_to_hf(const char *weft_path, const char *hf_path) {
  return convert("weft_gpt2_weft_to_hf", weft_path, hf_path, true);
}

weft_status weft_gpt2_file_is_hf(const char *path, bool *is_hf) {
  if (!is_hf) return weft_error(WEFT_ERR_INVALID, "weft_gpt2_file_is_hf: is_hf is NULL");
  *is_hf = false;
  weft_safetensors *f = NULL;
  WEFT_CHECK(weft_safetensors_open(path, &f));
  weft_safetensors_info a, w;
  weft_status st = WEFT_OK;
  if (weft_safetensors_find(f, "wte.weight", &w) == WEFT_OK) {
    *is_hf = true; /* weft's names all start with "transformer." */
  } else if (weft_safetensors_find(f, PREFIX "wte.weight", &w) == WEFT_OK &&
             weft_safetensors_find(f, PREFIX "h.0.attn.c_attn.weight", &a) == WEFT_OK) {
    /* GPT2LMHeadModel's names: told apart by c_attn's [in, 3 in] */
    *is_hf = a.ndim == 2 && w.ndim == 2 && a.shape[0] == w.shape[1] && a.shape[1] != w.shape[1];
  }
  weft_clear_error();
  weft_safetensors_close(f);
  return st;
}
