/* models/hf/hf_file.c — file-to-file conversion between transformers'
 * layouts and weft's (hf_file.h). */
#include "hf_file.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

weft_status models_hf_convert(const char *func, const char *src, const char *dst, hf_map_fn map,
                              void *ctx) {
  if (!src || !dst) return weft_error(WEFT_ERR_INVALID, "%s: a path is NULL", func);
  weft_safetensors *f = NULL;
  WEFT_CHECK(weft_safetensors_open(src, &f));
  int64_t n = weft_safetensors_count(f), m = 0;
  out_tensor *t = calloc((size_t)(n ? n : 1), sizeof *t);
  weft_safetensors_entry *e = calloc((size_t)(n ? n : 1), sizeof *e);
  weft_status st = t && e ? WEFT_OK : weft_error(WEFT_ERR_OOM, "%s: %" PRId64 " tensors", func, n);
  for (int64_t i = 0; i < n && st == WEFT_OK; i++) {
    weft_safetensors_info in;
    if ((st = weft_safetensors_get(f, i, &in)) != WEFT_OK) break;
    out_tensor *o = &t[m];
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
    m++;
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
  weft_safetensors_close(f);
  for (int64_t i = 0; i < m; i++)
    e[i] = (weft_safetensors_entry){t[i].rule.name, t[i].dtype, t[i].ndim, t[i].shape, t[i].data};
  static const char *const meta[] = {"format", "pt", NULL};
  if (st == WEFT_OK) st = weft_safetensors_write(dst, e, m, meta);
  for (int64_t i = 0; i < m; i++) free(t[i].data);
  free(t);
  free(e);
  if (st != WEFT_OK) return weft_error_trace(st, func);
  return WEFT_OK;
}
