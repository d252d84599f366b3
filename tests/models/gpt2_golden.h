/* tests/models/gpt2_golden.h — GPT-2's config for the golden folder
 * gpt2_tiny (tests/data/golden), shared by the workers of tests/models. */
#ifndef WEFT_TESTS_MODELS_GPT2_GOLDEN_H
#define WEFT_TESTS_MODELS_GPT2_GOLDEN_H

#include "golden.h"
#include "gpt2.h"

/* The golden model's shape (positions = its max_seq_len) with dropout p. */
static inline weft_gpt2_config gpt2_golden_config(const golden *g, float dropout) {
  weft_gpt2_config c = WEFT_GPT2_CONFIG_INIT;
  c.vocab = g->cfg.vocab;
  c.dim = g->cfg.dim;
  c.n_layers = g->cfg.n_layers;
  c.n_heads = g->cfg.n_heads;
  c.ffn_dim = g->cfg.ffn_dim;
  c.max_seq_len = g->positions;
  c.dropout = dropout;
  return c;
}

#endif
