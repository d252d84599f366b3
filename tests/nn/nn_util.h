/* tests/nn/nn_util.h — helpers for the nn worker cases: golden data
 * loading (expected.json, llm.c token file, safetensors), error norms,
 * and DTensor comparisons. */
#ifndef WEFT_TEST_NN_UTIL_H
#define WEFT_TEST_NN_UTIL_H

#include <stdbool.h>
#include <stdint.h>

#include "nn.h"
#include "safetensors.h"

typedef struct golden {
  char dir[512];
  weft_llama_config cfg;
  int64_t B, T;
  weft_adamw_params hp;
  double clip;
  double loss;
  double grad_norm;
  weft_tensor *tokens;  /* (B, T) int32 */
  weft_tensor *targets; /* (B, T) int32 */
} golden;

/* Loads tests/data/golden/<name>: expected.json and tokens.bin. */
weft_status golden_load(const char *name, golden *g);
void golden_free(golden *g);
/* "<dir>/<file>" */
void golden_path(const golden *g, const char *file, char *buf, size_t cap);

/* Loads every parameter of `root` from a safetensors file (names = FQNs). */
weft_status load_params(weft_module *root, const char *path);

/* ||a - b|| / ||b|| over n elements (a f32, b f64). */
double rel_err_f32_f64(const float *a, const double *b, int64_t n);

/* Reads tensor `name` of file f as f64 into a new malloc'd array of
 * *n elements. */
weft_status read_f64(weft_safetensors *f, const char *name, double **out, int64_t *n);

/* Builds a 1-D mesh "tp" of the world's size. */
weft_status mesh_world(weft_mesh **out);

#endif
