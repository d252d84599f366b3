/* models/gpt2/hf.c — GPT-2 weights between Hugging Face transformers'
 * layout and weft's (nanoGPT's / llm.c's), file to file (gpt2.h). */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpt2.h"
#include "hf_file.h"

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

/* to_hf (ctx non-NULL): strip "transformer.", drop the tied lm_head; from
 * HF: drop the mask buffers, put names under "transformer." (lm_head
 * stays: weft's import reads it as wte's alias and checks it equals wte).
 * Conv1D weights are transposed both ways. */
static weft_status map(const weft_safetensors_info *in, void *to_hf, hf_rule *r) {
  const char *name = in->name;
  if (!strncmp(name, PREFIX, strlen(PREFIX))) name += strlen(PREFIX);
  r->skip = to_hf ? !strcmp(name, "lm_head.weight") : is_mask_buffer(name);
  r->op = is_conv1d_weight(name) ? HF_TRANSPOSE : HF_KEEP;
  int w = to_hf || !strcmp(name, "lm_head.weight")
              ? snprintf(r->name, sizeof r->name, "%s", name)
              : snprintf(r->name, sizeof r->name, PREFIX "%s", name);
  if (w < 0 || (size_t)w >= sizeof r->name)
    return weft_error(WEFT_ERR_INVALID, "tensor name '%.80s...' is too long", in->name);
  return WEFT_OK;
}

weft_status weft_gpt2_hf_to_weft(const char *hf_path, const char *weft_path) {
  return models_hf_convert("weft_gpt2_hf_to_weft", hf_path, weft_path, map, NULL);
}

weft_status weft_gpt2_weft_to_hf(const char *weft_path, const char *hf_path) {
  static int to_hf;
  return models_hf_convert("weft_gpt2_weft_to_hf", weft_path, hf_path, map, &to_hf);
}

weft_status weft_gpt2_file_is_hf(const char *path, bool *is_hf) {
  if (!is_hf) return weft_error(WEFT_ERR_INVALID, "weft_gpt2_file_is_hf: is_hf is NULL");
  weft_safetensors *f = NULL;
  WEFT_CHECK(models_hf_open_probe(path, &f));
  *is_hf = !f; /* a sharded set's index: transformers' */
  weft_safetensors_info a, w;
  if (!f) return WEFT_OK;
  if (weft_safetensors_find(f, "wte.weight", &w) == WEFT_OK) {
    *is_hf = true; /* weft's names all start with "transformer." */
  } else if (weft_safetensors_find(f, PREFIX "wte.weight", &w) == WEFT_OK &&
             weft_safetensors_find(f, PREFIX "h.0.attn.c_attn.weight", &a) == WEFT_OK) {
    /* GPT2LMHeadModel's names: told apart by c_attn's [in, 3 in] */
    *is_hf = a.ndim == 2 && w.ndim == 2 && a.shape[0] == w.shape[1] && a.shape[1] != w.shape[1];
  }
  weft_clear_error(); /* a name not found is an answer, not a failure */
  weft_safetensors_close(f);
  return WEFT_OK;
}
