/* examples/gpu/gpu_golden.h — a golden folder (tests/data/golden/<cfg>/,
 * README.md there) loaded for gpu_model: the config, AdamW
 * hyper-parameters, clip, loss and grad norm of expected.json, and the batch
 * of tokens.bin. init/grads/after_step.safetensors are read by the caller
 * from g->dir. */
#ifndef WEFT_EXAMPLES_GPU_GOLDEN_H
#define WEFT_EXAMPLES_GPU_GOLDEN_H

#include <stdint.h>

#include "gpu_model.h"

typedef struct gpu_golden {
  char dir[512];        /* the folder (a longer path is WEFT_ERR_INVALID) */
  gpu_model_config cfg; /* rope theta 10000, eps 1e-5 as the reference */
  weft_adamw_params hp;
  double clip, loss, grad_norm;
  int32_t *inp, *tgt; /* (B, T): tokens[0:BT] and tokens[1:BT+1] */
} gpu_golden;

/* Loads <dir>/expected.json and <dir>/tokens.bin. WEFT_ERR_INVALID for a
 * path of 512 bytes or more, WEFT_ERR_IO for a missing
 * file, WEFT_ERR_CORRUPT naming the file for bad JSON, missing keys or a bad
 * llm.c header (magic 20240520, version 1, at least B*T+1 tokens). On error
 * g holds no arrays. */
weft_status gpu_golden_load(const char *dir, gpu_golden *g);
void gpu_golden_free(gpu_golden *g);

/* ||got - base - (want - base)|| / ||want - base|| over n elements (base
 * NULL: 0; sqrt(num) when the denominator is 0), accumulated in double. */
double gpu_golden_rel_err(const float *got, const double *want, const float *base, int64_t n);

#endif
