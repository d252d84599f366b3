/* examples/train/train.h — the training program's core, shared by weft-train
 * (examples/train/main.c) and weft-plan --validate (examples/plan/plan.c).
 *
 * Everything here uses the public weft API exactly as a user program would:
 * an N-D mesh (dp_replicate, dp_shard, tp) over the world, the Llama model
 * (nn.h) with torchtitan's TP plan (tp.h) or GPT-2 (models/gpt2, written on
 * the op layer) with its plan on the tp dim, FSDP (fsdp.h) on the dp dims, AdamW with warmup +
 * cosine, gradient clipping, DCP checkpoints and safetensors (dcp.h).
 *
 * SPMD: every rank parses the same argv and calls train_run. Errors in the
 * options, the mesh, the model or the data are found alike on every rank
 * (or agreed by an all-reduce) so that every rank returns non-zero and
 * rank 0 prints one line.
 */
#ifndef WEFT_EXAMPLES_TRAIN_H
#define WEFT_EXAMPLES_TRAIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpt2.h"
#include "weft.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TRAIN_MAX_DIMS 4

/* A mesh given as name=size pairs ("dp=2,tp=2"). The root mesh's dims are
 * in the canonical order dp_replicate, dp_shard, tp (as FSDP + TP need: the
 * dp dims come first). "dp" is dp_shard. Onto world ranks they are laid
 * out tp innermost (tp peers are neighbouring world ranks, on one node
 * when nodes hold consecutive ranks), or with tp_across_nodes tp
 * outermost (weft_mesh_create_ordered: tp peers as far apart in world
 * rank as possible, so across nodes). */
typedef struct train_mesh_spec {
  int dp_replicate;     /* 0 = absent */
  int dp_shard;         /* 0 = absent ("dp" sets this) */
  int tp;               /* 0 = absent */
  bool given;           /* false: dp_shard = world size */
  bool tp_across_nodes; /* --tp-across-nodes: tp outermost in world-rank order */
  /* --tp-inside-node: the default layout, checked at setup: tp divides
   * weft_local_size(), every node holds as many ranks and every tp group
   * lies on one node (else an error on every rank) */
  bool tp_inside_node;
} train_mesh_spec;

typedef struct train_opts {
  train_mesh_spec mesh;
  weft_llama_config model; /* the shape (GPT-2: n_kv_heads = n_heads) */
  char model_name[32];     /* preset name or "custom" */
  bool gpt2;               /* --model gpt2-*: models/gpt2 instead of the Llama */
  double dropout;          /* GPT-2's dropout (0) */
  int64_t steps, batch, grad_accum, warmup;
  double lr, min_lr, weight_decay, clip;
  double beta1, beta2, eps; /* AdamW (--beta1, --beta2, --eps): torch's 0.9, 0.999, 1e-8 */
  uint64_t seed;
  bool bf16;                 /* --dtype bf16: FSDP param_dtype bf16 */
  int reshard_after_forward; /* WEFT_FSDP_RESHARD_DEFAULT, 0, 1 or k */
  bool cpu_offload;          /* --cpu-offload: FSDP offload_params */
  int64_t max_positions;     /* --max-positions: GPT-2's learned positions (0: --seq-len) */
  bool export_hf;
  bool fixed_batch;
  /* --fixed-batch: every step trains on the first step's batch */ /* --hf: --export-safetensors
                                                                      in transformers' GPT-2
                                                                      layout */
  bool sequence_parallel;
  bool loss_parallel; /* default true with tp > 1 */
  bool cuda;          /* --device cuda */
  int matmul;         /* --matmul: weft_matmul_precision of the device's fp32 GEMMs */
  const char *data, *val_data, *text;
  int64_t val_every, val_batches;
  const char *save_dir, *resume_dir, *export_path, *init_from, *log_json;
  int64_t save_every;
  /* --keep-checkpoints K: DIR holds the newest checkpoint, DIR.step-N the
   * K - 1 before it (highest N kept); an older one is removed only after a
   * newer save has committed */
  int64_t keep_checkpoints;
  /* --on-nonfinite stop|skip: a non-finite loss or gradient norm stops the
   * run before the optimizer step (stop), or drops that step's update
   * (skip) and stops after max_skipped of them in a row */
  bool skip_nonfinite;
  int64_t max_skipped;       /* --max-skipped-steps */
  bool save_errors_continue; /* --save-errors continue: a failed save warns, the run goes on */
  double peak_flops;         /* per rank, for MFU */
  bool peak_given;           /* --peak-tflops (else the CPU default, or the GPU's from its model) */
  bool quiet;                /* no per-step lines (summary only) */
  bool profile;              /* rank 0: the op layer's counters per step (weft_op_stats) */
  const weft_gpu_spec *predict; /* --predict h100|h200: the modeled step (implies profile) */
  bool silent;                  /* nothing on stdout (weft-plan --validate); errors still print */
} train_opts;

/* Defaults (the "demo" preset, 20 steps). */
void train_opts_default(train_opts *o);

/* Parses argv[1..argc) into o (after train_opts_default). Returns 0 on
 * success, 1 when --help was given (help printed to stdout if print_help),
 * -1 on a bad flag with a one-line message in err. Pure: no MPI. */
int train_parse_args(int argc, char **argv, train_opts *o, char *err, size_t cap, bool print_help);
void train_print_help(const char *prog);

/* Applies a model preset by name (demo, tiny, small); false if unknown. */
bool train_model_preset(const char *name, weft_llama_config *cfg);
/* A GPT-2 preset's shape (gpt2-demo, gpt2-tiny, gpt2 = gpt2-small, 124M
 * with llm.c's padded vocab) into cfg; false if unknown. */
bool train_gpt2_preset(const char *name, weft_llama_config *cfg);
/* GPT-2's config for a run's options (shape, dropout). */
weft_gpt2_config train_gpt2_config(const train_opts *o);

/* What one run measured (filled on every rank; memory is this rank's). */
typedef struct train_result {
  int64_t steps_run;
  int64_t skipped_steps; /* --on-nonfinite skip: steps whose update was dropped */
  double first_loss, final_loss, val_loss, val_acc, first_val_loss;
  double tokens_per_s, mfu;
  int64_t num_params;
  /* mesh dims of the root mesh, in order */
  int ndim;
  char dim_names[TRAIN_MAX_DIMS][WEFT_MESH_NAME_MAX];
  int dim_sizes[TRAIN_MAX_DIMS];
  /* communication of the last step, per dim: payload bytes (mesh.h
   * accounting) and calls */
  int64_t comm_bytes[TRAIN_MAX_DIMS];
  int64_t comm_calls[TRAIN_MAX_DIMS];
  /* the last step's bytes per (dim, collective kind) */
  int64_t comm_kind_bytes[TRAIN_MAX_DIMS][WEFT_COLL_KIND_COUNT];
  int64_t comm_kind_calls[TRAIN_MAX_DIMS][WEFT_COLL_KIND_COUNT];
  /* the last step's seconds per (dim, kind): this rank's time held up in
   * those collectives (weft_comm_count.seconds) */
  double comm_kind_seconds[TRAIN_MAX_DIMS][WEFT_COLL_KIND_COUNT];
  /* wall time of an optimizer step (forward + backward + optimizer; no
   * validation or checkpoint), the slowest rank's, over the timed steps
   * (every step after the first run; with one step, that step): median
   * (mean of the middle two for an even count) and minimum */
  double step_s_median, step_s_min;
  /* memory (this rank, bytes): allocator peak over the training steps, and
   * FSDP's categories (zero without FSDP) */
  int64_t peak_bytes;
  int64_t param_bytes, grad_bytes, optim_bytes, unsharded_param_peak, unsharded_grad_peak;
  int64_t other_peak; /* FSDP's "other": activations, layer buffers, TP temporaries */
} train_result;

/* Runs training with options o on the world (weft_init must have run).
 * Collective over MPI_COMM_WORLD. Returns 0 on success; on error every rank
 * returns non-zero and rank 0 has printed one line to stderr. res may be
 * NULL. */
int train_run(const train_opts *o, train_result *res);

#ifdef __cplusplus
}
#endif
#endif
