/* models/hf/hf_file.h — internal to models/: converting a safetensors file
 * of one model between Hugging Face transformers' layout and weft's, tensor
 * by tensor (names, and an optional change of layout per tensor). The
 * models' public converters (gpt2.h, llama.h) are written on it. */
#ifndef WEFT_MODELS_HF_FILE_H
#define WEFT_MODELS_HF_FILE_H

#include <stdbool.h>
#include <stdint.h>

#include "safetensors.h"

/* What becomes of one tensor of [rows, cols] (ndim 2 unless HF_KEEP). */
typedef enum hf_op {
  HF_KEEP,            /* the bytes as they are */
  HF_TRANSPOSE,       /* [rows, cols] -> [cols, rows] */
  HF_PAIRS_TO_HALVES, /* per head of rows/heads rows: row 2j + s -> row s hd/2 + j */
  HF_HALVES_TO_PAIRS, /* its inverse */
} hf_op;

/* The fate of one input tensor, filled by the caller's map. */
typedef struct hf_rule {
  bool skip;      /* drop it (buffers that are not parameters, a tied copy) */
  char name[256]; /* its name in the output */
  hf_op op;
  int64_t heads; /* for the row permutations */
} hf_rule;

/* Sets *out for the tensor `info` (out->name starts as the input name,
 * op HF_KEEP, skip false); a non-OK status stops the conversion. */
typedef weft_status (*hf_map_fn)(const weft_safetensors_info *info, void *ctx, hf_rule *out);

/* Reads every tensor of src (one safetensors file, or a sharded set's
 * index: models_hf_is_index, every file it names), applies map's rule to
 * each and writes dst, one file (weft_safetensors_write: a temporary file
 * renamed into place), the tensors in each file's name order, dtypes kept.
 * Errors are headed by func and name the file and the tensor (a name in
 * two files of a set: the writer's duplicate-name error). Local. */
weft_status models_hf_convert(const char *func, const char *src, const char *dst, hf_map_fn map,
                              void *ctx);

/* Whether path names a sharded set's index (it ends in ".json"), as
 * transformers writes "model.safetensors.index.json": {"weight_map":
 * {"<tensor>": "<file>", ...}} with the files beside it. */
bool models_hf_is_index(const char *path);
/* The distinct files of the index at path, in first-mention order, as
 * paths beside it: *files (n of them; free each and the array). Errors
 * name the index: not JSON, no weight_map, a file name with a '/'. */
weft_status models_hf_index_files(const char *path, char ***files, int *n);
/* For the models' layout checks: a sharded set's index (models_hf_is_index,
 * read and checked: transformers' layout by definition) gives *f = NULL;
 * else *f = the open file (close it). Errors: the index's, or the file's
 * (it cannot be opened or is not safetensors). Local. */
weft_status models_hf_open_probe(const char *path, weft_safetensors **f);

#endif
