/* examples/train/train_internal.h — what the rooms of weft-train's core
 * share (not installed, not part of train.h's interface):
 *
 *   options.c     flags, validation, --help                    (train.h)
 *   agree.c       how a failure reaches every rank
 *   model.c       Llama and GPT-2: presets, counts, one micro-step each
 *   data.c        token sources (embedded, llm.c .bin, text) and batches
 *   setup.c       mesh, model (TP, FSDP), optimizer; teardown
 *   loop.c        train_run: the steps, validation, logging, the summary
 *   checkpoint.c  DCP save / resume, safetensors export
 *
 * Error convention (train.h): a failure every rank finds alike is printed by
 * rank 0 (train_fail_all); a failure only some ranks may see is agreed
 * (train_agree_fail) and printed once; a failure in the middle of a
 * collective (a step, a reporting all-reduce) is printed by each rank that
 * sees it, which then stops (the others stop at their next collective). */
#ifndef WEFT_EXAMPLES_TRAIN_INTERNAL_H
#define WEFT_EXAMPLES_TRAIN_INTERNAL_H

#include <stdio.h>

#include "tokens.h"
#include "train.h"

/* ---------------------------------------------------------------- agree.c */

/* Prints "weft-train: error: [<what>: ]<msg>" on this rank as one line: the
 * first line of msg; the library's breadcrumb lines after it ("  in f")
 * only with WEFT_DEBUG set (not "0"). Local. */
void train_print_error(const char *what, const char *msg);
/* Formats into err (cap bytes) and returns -1 (for parse-style errors). */
int train_perr(char *err, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Agrees on a failure over the world (weft_agree_status): true on every
 * rank if any rank failed; the lowest failing rank prints msg (one line).
 * If the agreement itself fails every rank prints why. Collective. */
bool train_agree_fail(bool failed, const char *msg);
/* A failure every rank finds alike: rank 0 prints it; returns 2. */
int train_fail_all(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* A failure of this rank inside collective work: this rank prints
 * "weft-train: error: <what>: <weft_last_error()>" and it returns 3. */
int train_fail_here(const char *what);

/* ----------------------------------------------------------------- data.c */

/* A token source: a split [lo, hi) of the embedded synthetic language (in
 * memory), of an llm.c .bin file or of a text file (one byte a token). The
 * sources borrow the memory and files of their train_data. */
typedef struct token_src {
  const uint16_t *mem;        /* embedded: the stream */
  const weft_token_file *bin; /* --data / --val-data */
  int text_fd;                /* --text; -1 otherwise */
  int64_t lo, hi;             /* the split */
  const char *name;           /* for messages: the path or "embedded data" */
} token_src;

/* The train and held-out sources and what they own. */
typedef struct train_data {
  token_src train, val;
  uint16_t *synth;         /* the embedded stream (owned) */
  weft_token_file *bin[2]; /* --data, --val-data (owned) */
  int text_fd;             /* --text (owned); -1 when none */
} train_data;

/* Opens the run's data (o->data, o->text or the embedded language) for a
 * model of vocab V and sequence length T, and splits it. Local: every rank
 * opens the files itself (the caller agrees on the outcome); of a bin
 * file's tokens, checked < V before step 1, rank `rank` of `world` checks
 * its share. On failure returns -1 with a one-line message in err; d is
 * left closable. */
int train_data_open(const train_opts *o, int64_t V, int64_t T, int rank, int world, train_data *d,
                    char *err, size_t cap);
/* Closes what d owns (every rank; idempotent). */
void train_data_close(train_data *d);

/* Rows [row0, row0 + rows) of a batch of B rows of T tokens: tokens and
 * targets (rows, T) int32, each row a window of T + 1 tokens (scratch:
 * T + 1 int32). train: step `step` of training (a pseudo-random start per
 * step from seed); else validation batch `step`. Every token must be < V.
 * Local. Returns -1 with a message in err on a read error or a token >= V. */
int train_data_batch(const token_src *s, bool train, uint64_t seed, int64_t step, int64_t B,
                     int64_t T, int64_t row0, int64_t rows, int32_t *tok, int32_t *tgt,
                     int32_t *scratch, int64_t V, char *err, size_t cap);

/* ---------------------------------------------------------- the run state */

typedef struct run_state {
  const train_opts *o;
  weft_llama_config cfg;
  int rank, world;
  /* the root mesh: ndim dims shape[d] named names[d]; the first ndp are dp */
  int ndim;
  int shape[TRAIN_MAX_DIMS];
  const char *names[TRAIN_MAX_DIMS];
  int ndp, tp_size, dp_total, dp_index;
  weft_mesh *root, *dp, *model_mesh;
  weft_module *model;
  weft_tp *tp;
  weft_fsdp *root_fsdp;
  weft_optimizer *opt;
  train_data data;
  FILE *json;       /* --log-json (rank 0) */
  bool json_failed; /* a write to it failed (agreed at the end) */
  weft_dcp_async *pending_save;
  bool stopped;         /* the non-finite guard stopped the run: nothing is saved after it */
  int64_t failed_saves; /* --save-errors continue: saves that failed */
  /* The model runs on the op graph: GPT-2, and the Llama under --dtype bf16
   * (models/llama: the built-in Llama's parameters and names, written with
   * ops, so FSDP keeps its parameters and activations in bf16). */
  weft_graph *graph;           /* the tape the model's forward records */
  weft_dtensor *ids, *targets; /* the graph's inputs until its next reset */
  /* this rank's batch: rows = B / dp_total rows of T tokens */
  int64_t rows;
  int32_t *tok, *tgt, *scratch;
  weft_tensor *tok_t, *tgt_t; /* views of tok, tgt: (rows, T) int32 */
  float *argmax;              /* validation: (2, rows T) max, argmax */
  float *argmax_max;          /* validation: rows T */
  weft_param **params;
  int nparams;
  double peak_flops;  /* per rank, for MFU: --peak-tflops, the GPU's, or the CPU default */
  char peak_why[160]; /* where peak_flops comes from (the summary says it) */
} run_state;

/* ---------------------------------------------------------------- setup.c */

/* Builds the meshes, checks the options against them, opens the data and
 * creates the model (TP, FSDP, weights) and the optimizer; fills res's mesh
 * fields. Collective. Returns 0, or non-zero with the error printed. */
int train_setup(run_state *s, train_result *res);
/* Frees everything setup made (every rank). Returns WEFT_OK, or the first
 * failure (a pending checkpoint write, a mesh still in use). */
weft_status train_teardown(run_state *s);

/* ----------------------------------------------------------- checkpoint.c */

/* --resume: checks the checkpoint's model family and shape against this run,
 * then loads the model and optimizer (resharded onto this mesh) and sets
 * *start_step. Collective. 0, or 2 with the error printed. */
int train_resume(run_state *s, int64_t *start_step);
/* --save: the directory made when absent and a file written and removed
 * in it, before step 1, so an unusable target fails at once. Collective.
 * 0, or 2 with the error printed. */
int train_save_check(run_state *s);
/* --save after optimizer step `done` (1-based) when it is due: async
 * between saves, synchronous at the last step. Collective. 0 or 2. */
int train_save_if_due(run_state *s, int64_t done);
/* Waits for an async save still in flight. Collective. 0 or 2. */
int train_save_wait(run_state *s);
/* --export-safetensors. Collective. 0 or 2. */
int train_export(run_state *s);

/* ---------------------------------------------------------------- model.c */

/* Parameters of the model (with or without the input embedding, a lookup
 * that costs no FLOPs) and training FLOPs per token (PaLM appendix B: 6 N
 * + 12 L D T for attention scores and values). */
int64_t train_count_params(const train_opts *o, const weft_llama_config *c, bool with_embedding);
/* --init-from of weft-train and weft-generate: the weights of a
 * safetensors file (or a sharded set's index) in weft's or transformers'
 * layout (weft_gpt2_file_is_hf, weft_llama_file_is_hf: GPT-2 when gpt2,
 * else the Llama of cfg) into model. A transformers file is converted by
 * each rank into a file of its own under $TMPDIR (no shared temporary
 * directory is assumed across nodes), the ranks agree on the conversion,
 * then it is imported and removed. *hf (may be NULL) = the layout found;
 * on error why[cap] holds the message, naming path, never the temporary
 * file. Collective over the world. */
weft_status train_import_weights(weft_module *model, const char *path, bool gpt2,
                                 const weft_llama_config *cfg, bool *hf, char *why, size_t cap);
/* GPT-2's learned positions: --max-positions, else --seq-len. */
int64_t train_positions(const train_opts *o);
double train_flops_per_token(const train_opts *o, const weft_llama_config *c, int64_t T);
/* One micro-step on this rank's rows (s->tok_t, s->tgt_t): the mean loss,
 * then the backward when `train`. key numbers the micro-step (GPT-2: it
 * keys the dropout masks, the same on every mesh and on resume). *logits
 * (may be NULL): the logits DTensor (vocab-sharded with TP), valid until
 * the next call. Collective over the world (the model's and FSDP's
 * communication). */
weft_status train_model_step(run_state *s, bool train, int64_t key, double *loss,
                             const weft_dtensor **logits);

#endif
