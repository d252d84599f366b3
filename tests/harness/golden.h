/* tests/harness/golden.h — golden-data helpers shared by the test suites
 * (nn, tp): the tests/data/golden/<name> files written by
 * the scripts in tests/data/golden (expected.json, llm.c token file, safetensors),
 * loading parameters by FQN (relative errors: harness.h). Built as the
 * weft_test_golden static library (tests/meson.build). */
#ifndef WEFT_TEST_GOLDEN_H
#define WEFT_TEST_GOLDEN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "nn.h"
#include "safetensors.h"

typedef struct golden {
  char dir[512];
  weft_llama_config cfg;
  int64_t B, T;
  int64_t positions; /* learned positions (GPT-2's config.positions); 0 if absent */
  weft_adamw_params hp;
  double clip;
  double loss;
  double grad_norm;
  weft_tensor *tokens;  /* (B, T) int32: tokens[0:BT] */
  weft_tensor *targets; /* (B, T) int32: tokens[1:BT+1] */
} golden;

/* Loads <data_dir>/golden/<name>: expected.json (config, hyper-parameters,
 * loss, grad norm) and tokens.bin (llm.c token file: 256 int32 header
 * (magic 20240520, version 1, count), then uint16 tokens). On error g
 * holds no tensors. */
weft_status golden_load(const char *name, golden *g);
/* Frees the tensors; g may be zeroed. */
void golden_free(golden *g);
/* "<dir>/<file>" */
void golden_path(const golden *g, const char *file, char *buf, size_t cap);

/* Two safetensors files of one model, tensor by tensor (a Hugging Face
 * file against the one a model exported back): *same = a's tensors found
 * in b with the same name, dtype, shape and bytes; *buffers = a's
 * transformers buffers, which are no parameters and are not compared
 * (GPT-2's h.N.attn.bias / attn.masked_bias, Llama's rotary_emb.inv_freq);
 * *nb = b's tensor count; first_diff[cap] = the name of a's first other
 * tensor that is missing from b or differs ("" if none). Local. */
weft_status golden_same_params(const char *a, const char *b, int64_t *same, int64_t *buffers,
                               int64_t *nb, char *first_diff, size_t cap);

/* Loads every parameter of `root` from a safetensors file (names = FQNs),
 * each rank keeping its slice (weft_param_load). */
weft_status load_params(weft_module *root, const char *path);
/* Rows [r0, r0 + n) of a (B, T) tensor (a golden batch's tokens or
 * targets) as a DTensor Replicate on every dim of mesh: a dp group's slice
 * of the batch. Collective over mesh. */
weft_status golden_rows(weft_mesh *mesh, const weft_tensor *t, int64_t r0, int64_t n,
                        weft_dtensor **out);

/* Reads tensor `name` of file f as f64 into a new malloc'd array of
 * *n elements. */
weft_status read_f64(weft_safetensors *f, const char *name, double **out, int64_t *n);

/* Each of ps[0..np)'s grad (its full tensor: collective over the
 * parameter's mesh, in this order on every rank; copied to the host when
 * the mesh is on a device) against the golden
 * grads.safetensors under the parameter's FQN: *worst is the largest
 * relative error (rel_err_f32_f64) and *worst_fqn (may be NULL) the
 * parameter it belongs to. WEFT_ERR_INVALID naming a parameter without a
 * grad or whose size differs from the file's. */
weft_status golden_worst_grad_err(const golden *g, weft_param *const *ps, int np, double *worst,
                                  const char **worst_fqn);

/* After one optimizer step from the golden init: each parameter's update
 * (data - init; full tensors, collective as above) against the golden
 * (after_step - init), *worst / *worst_fqn as above. With zero_grads set,
 * elements whose golden gradient is exactly zero (|g| < 1e-12: float64
 * gives ~1e-19 where the true gradient is 0, e.g. a key bias under
 * softmax) are left out of the comparison, since Adam's first step turns
 * float32 noise there into up to lr in any precision; *nzero (may be NULL)
 * counts them and *zero_move (may be NULL) is their largest |update|, for
 * the caller to bound. */
weft_status golden_worst_update_err(const golden *g, weft_param *const *ps, int np, bool zero_grads,
                                    double *worst, const char **worst_fqn, int64_t *nzero,
                                    double *zero_move);

#endif
