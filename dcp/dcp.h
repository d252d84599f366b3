/* weft/dcp.h — distributed checkpoints: state dicts, sharded save and load
 * with resharding, async save, safetensors import/export, and a reader for
 * inspecting checkpoints (torch.distributed.checkpoint in C).
 *
 * A tour (SPMD: every rank runs this):
 *
 *     // one flat state dict: model, optimizer and any other values
 *     weft_state_dict *sd;
 *     weft_state_dict_create(&sd);
 *     weft_get_model_state_dict(model, NULL, sd);      // views of the parameters
 *     weft_get_optimizer_state_dict(model, opt, NULL, sd);
 *     weft_state_dict_set_int(sd, "train.step", step);
 *     weft_state_dict_set_json(sd, "model.config", "{\"dim\": 768}");
 *     weft_dcp_save(sd, "ckpt/step-100", NULL);         // every rank writes its shards
 *     ...
 *     // later, on any mesh and placements: load in place into the views
 *     weft_dcp_load(sd, "ckpt/step-100", NULL, NULL);
 *     weft_state_dict_destroy(sd);                     // views: the model keeps its data
 *
 *     // or without blocking training for the writes:
 *     weft_dcp_async *h;
 *     weft_dcp_async_save(sd, "ckpt/step-200", NULL, &h);  // stages copies, returns
 *     ... train ...
 *     weft_dcp_async_wait(h);                          // collective; checkpoint committed
 *
 * ---------------------------------------------------------------- keys
 * A state dict is a flat map from names to entries, kept in insertion
 * order. Names are the canonical qualified names PyTorch uses:
 *   model:      the parameter FQNs ("layers.0.attention.wq.weight");
 *   model:      a tied parameter (weft_module_tie_param) once, under its
 *               owner's FQN ("transformer.wte.weight", not "lm_head.weight");
 *   optimizer:  "state.<fqn>.exp_avg", "state.<fqn>.exp_avg_sq",
 *               "state.<fqn>.max_exp_avg_sq" (amsgrad),
 *               "state.<fqn>.momentum_buffer" (SGD), "state.<fqn>.step"
 *               (an int value), and the hyper-parameters of the
 *               parameter's group as torch's flattened param_groups:
 *               "param_groups.<fqn>.lr", ".eps", ".weight_decay" (double
 *               values), ".betas" (JSON [beta1, beta2]), ".amsgrad" (JSON
 *               bool) and ".group" (int: the group's index, torch's
 *               position in param_groups) — SGD: ".lr" only —, and
 *               "state.num_steps" (the optimizer's step count, which
 *               drives its learning-rate schedule) and, for AdamW,
 *               "param_groups.num_groups".
 * The optimizer namespace is every key that starts with "state." or
 * "param_groups."; the model functions ignore it and the optimizer
 * functions look at nothing else, so one state dict may hold both (and any
 * other values) and be saved as one checkpoint.
 *
 * Entries are one of:
 *   DTensor  each rank holds its shard (any mesh, any placements except
 *            Partial: reduce it first);
 *   tensor   a plain local tensor that stands for the whole value; every
 *            rank that holds it holds the same bytes (a full state dict);
 *   value    a JSON value: int (exact 64-bit), double (exact, incl. inf
 *            and NaN), string, or any JSON text (objects, arrays, bools):
 *            step counters, RNG state, data loader position, the model
 *            config. Values may differ between ranks only under different
 *            names (save checks that ranks agree on each name they share).
 * A state dict never communicates; it is a plain container.
 *
 * ---------------------------------------------------------------- format
 * A checkpoint is a directory with one data file per rank and one
 * metadata.json (dcp/FORMAT.md has the byte-level tables and the version
 * rule). Save writes every chunk once: chunks held by several ranks
 * (replicas) are spread over their holders by bytes. Rank 0 writes the
 * metadata last — after every rank's data is fsync'ed — to a temporary
 * name and renames it into place, then fsyncs the directory: a checkpoint
 * is complete or it is not loaded. Data files carry the checkpoint's id in
 * their names and headers, so saving over an existing checkpoint leaves it
 * intact (and loadable) until the new metadata is committed; stale files
 * are removed after the commit.
 *
 * Checksums are CRC32C per fixed-size block of each chunk (block_bytes,
 * default 1 MiB, recorded in the metadata): block k of a chunk covers its
 * bytes [k*B, min((k+1)*B, length)). A load reads, for each piece of a
 * local shard, the blocks of the saved chunks that hold its bytes, and
 * verifies every block it reads.
 *
 * ---------------------------------------------------------------- errors
 * Save, load and the collective state-dict functions agree on the outcome
 * with one small all-reduce of a status over the group (and one broadcast
 * of the message on failure), so every rank returns the same status and a
 * message naming the rank, the tensor and the file; no rank hangs on bad
 * input. Everything that can be checked before data moves (keys, shapes,
 * dtypes, metadata, file headers and sizes) is checked on every rank first,
 * so such an error leaves the state dict untouched. A checksum mismatch is
 * found while reading: the call fails on every rank, and the tensors named
 * may have been partly overwritten (never reported as loaded).
 *
 * ---------------------------------------------------------------- collectives
 * "Collective over the group" means every rank of opts->group (default:
 * MPI_COMM_WORLD) calls it, in the same order as the group's other
 * checkpoint calls. DCP communicates on its own duplicate of the group's
 * communicator, with nonblocking calls and a backoff wait (weft_settings'
 * timeout applies).
 */
#ifndef WEFT_DCP_H
#define WEFT_DCP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dtensor.h"
#include "kernels.h"
#include "mesh.h"
#include "nn.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------- CRC32C */

/* CRC32C (Castagnoli, reflected polynomial 0x82F63B78), zlib-style
 * chaining: crc = weft_crc32c(crc, data, len), starting from 0;
 * weft_crc32c(0, "123456789", 9) == 0xE3069283. Uses the fastest of:
 * carry-less multiply folding (AVX2 + VPCLMULQDQ), the SSE4.2 crc32
 * instruction (three interleaved streams), slicing-by-8 tables, that the
 * CPU has; all give the same values. Thread-safe. */
WEFT_API uint32_t weft_crc32c(uint32_t crc, const void *data, size_t len);
/* The table-driven version alone (tests compare the two). */
WEFT_API uint32_t weft_crc32c_sw(uint32_t crc, const void *data, size_t len);
/* One named implementation, for tests and benchmarks: impl is "sw",
 * "sse4.2" or "vpclmulqdq". Sets *out and returns true, or returns false
 * when this CPU lacks it (or impl is unknown). */
WEFT_API bool weft_crc32c_impl(const char *impl, uint32_t crc, const void *data, size_t len,
                               uint32_t *out);

/* --------------------------------------------------------- state dicts */

typedef struct weft_state_dict weft_state_dict;

typedef enum weft_sd_kind {
  WEFT_SD_DTENSOR = 0, /* a DTensor: each rank holds its shard */
  WEFT_SD_TENSOR = 1,  /* a plain tensor standing for the whole value */
  WEFT_SD_VALUE = 2,   /* a JSON value */
} weft_sd_kind;

typedef enum weft_sd_value_type {
  WEFT_VALUE_INT = 0,    /* int64_t, exact */
  WEFT_VALUE_DOUBLE = 1, /* double, exact (inf and NaN included) */
  WEFT_VALUE_STRING = 2, /* UTF-8 text */
  WEFT_VALUE_JSON = 3,   /* any JSON value, kept as text */
} weft_sd_value_type;

/* One entry as seen from outside. Pointers are owned by the state dict
 * (or by whoever lent them, for views) and stay valid until the entry is
 * removed or the state dict destroyed. */
typedef struct weft_sd_entry {
  const char *name;
  weft_sd_kind kind;
  weft_dtensor *dtensor;         /* WEFT_SD_DTENSOR */
  weft_tensor *tensor;           /* WEFT_SD_TENSOR */
  weft_sd_value_type value_type; /* WEFT_SD_VALUE */
} weft_sd_entry;

/* An empty state dict. Local. */
WEFT_API weft_status weft_state_dict_create(weft_state_dict **out);
/* Frees the entries it owns (views are left alone) and the container.
 * NULL: no-op. */
WEFT_API void weft_state_dict_destroy(weft_state_dict *sd);

/* Adds a DTensor under `name` (non-empty, unique in sd; WEFT_ERR_INVALID
 * otherwise). own: WEFT_LOCAL_VIEW — sd refers to dt, the caller keeps it
 * alive (loads write into it); WEFT_LOCAL_TAKE — sd destroys it (only on
 * success); WEFT_LOCAL_COPY — sd keeps its own copy of the local shard on
 * the same mesh. */
WEFT_API weft_status weft_state_dict_add_dtensor(weft_state_dict *sd, const char *name,
                                                 weft_dtensor *dt, weft_local_ownership own);
/* Adds a plain CPU tensor (any dtype, any strides for VIEW; COPY makes a
 * contiguous copy) under `name`, with the same ownership rules. */
WEFT_API weft_status weft_state_dict_add_tensor(weft_state_dict *sd, const char *name,
                                                weft_tensor *t, weft_local_ownership own);

/* Values: set (adds, or replaces an existing value entry of that name; a
 * tensor entry of that name is WEFT_ERR_INVALID) and get (WEFT_ERR_NOT_FOUND
 * if absent, WEFT_ERR_INVALID if the entry is not a value of that type;
 * get_double also reads an int value). set_json validates the text
 * (WEFT_ERR_INVALID naming the position of the first error) and keeps a
 * normalised copy. */
WEFT_API weft_status weft_state_dict_set_int(weft_state_dict *sd, const char *name, int64_t v);
WEFT_API weft_status weft_state_dict_set_double(weft_state_dict *sd, const char *name, double v);
WEFT_API weft_status weft_state_dict_set_string(weft_state_dict *sd, const char *name,
                                                const char *v);
WEFT_API weft_status weft_state_dict_set_json(weft_state_dict *sd, const char *name,
                                              const char *json);
WEFT_API weft_status weft_state_dict_get_int(const weft_state_dict *sd, const char *name,
                                             int64_t *v);
WEFT_API weft_status weft_state_dict_get_double(const weft_state_dict *sd, const char *name,
                                                double *v);
/* *v is owned by sd (valid until the entry changes). */
WEFT_API weft_status weft_state_dict_get_string(const weft_state_dict *sd, const char *name,
                                                const char **v);
/* The JSON text of any value entry (an int as digits, a string quoted). */
WEFT_API weft_status weft_state_dict_get_json(const weft_state_dict *sd, const char *name,
                                              const char **json);

/* The model config as a JSON value (its fields by name) and back. */
WEFT_API weft_status weft_state_dict_set_llama_config(weft_state_dict *sd, const char *name,
                                                      const weft_llama_config *cfg);
WEFT_API weft_status weft_state_dict_get_llama_config(const weft_state_dict *sd, const char *name,
                                                      weft_llama_config *cfg);

WEFT_API int64_t weft_state_dict_count(const weft_state_dict *sd);
/* Entry i in insertion order; WEFT_ERR_INVALID out of range. */
WEFT_API weft_status weft_state_dict_get(const weft_state_dict *sd, int64_t i, weft_sd_entry *out);
/* The entry called `name`; WEFT_ERR_NOT_FOUND if absent. out may be NULL
 * (a membership test). */
WEFT_API weft_status weft_state_dict_find(const weft_state_dict *sd, const char *name,
                                          weft_sd_entry *out);
/* Removes (and frees, if owned) the entry; WEFT_ERR_NOT_FOUND if absent. */
WEFT_API weft_status weft_state_dict_remove(weft_state_dict *sd, const char *name);
/* Records `alias` as another name of entry `name` (both non-empty,
 * different; an alias has one name: WEFT_ERR_INVALID otherwise): a tied
 * parameter's other FQN ("lm_head.weight" for "transformer.wte.weight"),
 * as weft_get_model_state_dict records for every tied parameter. An alias
 * is no entry (count, get, find and save ignore it: the value is saved once,
 * under `name`). weft_dcp_load reads entry `name` from the alias when the
 * checkpoint has no `name` (Hugging Face GPT-2 files may hold only
 * lm_head.weight); a checkpoint that has both must hold the same bytes
 * under both (WEFT_ERR_CORRUPT naming both keys otherwise). Local. */
WEFT_API weft_status weft_state_dict_add_alias(weft_state_dict *sd, const char *alias,
                                               const char *name);

/* A list of keys returned by the functions below (missing or unexpected
 * keys). Owned by the caller: weft_key_list_clear frees and zeroes it. */
typedef struct weft_key_list {
  int64_t count;
  char **keys;
} weft_key_list;
WEFT_API void weft_key_list_clear(weft_key_list *l);

/* Options as torch.distributed.checkpoint.state_dict.StateDictOptions.
 * Versioned so the ABI can grow; NULL means WEFT_STATE_DICT_OPTS_INIT. */
typedef struct weft_state_dict_opts {
  int version; /* WEFT_STATE_DICT_OPTS_VERSION */
  /* get: gather every DTensor into a plain full tensor (collective over
   * each DTensor's mesh, in parameter order). */
  bool full_state_dict;
  /* get: host copies; with full_state_dict only world rank 0 keeps the
   * gathered tensors (the other ranks' state dicts get no tensor entries,
   * values are added everywhere). */
  bool cpu_offload;
  /* set: world rank 0 holds a full state dict (plain tensors and values);
   * the other ranks' state dicts are ignored (may be empty). Each tensor is
   * broadcast from rank 0 in turn and every rank keeps its shard.
   * Collective over MPI_COMM_WORLD. */
  bool broadcast_from_rank0;
  /* set: a missing key (a parameter / optimizer state with no entry) or an
   * unexpected key (a tensor entry in the namespace that matches nothing)
   * is an error; false: they are skipped and returned. */
  bool strict;
} weft_state_dict_opts;
#define WEFT_STATE_DICT_OPTS_VERSION 1
#define WEFT_STATE_DICT_OPTS_INIT \
  { WEFT_STATE_DICT_OPTS_VERSION, false, false, false, true }

/* Adds the model's parameters to sd under their FQNs (relative to model's
 * root); a tied parameter once, under its owner's FQN, with its other FQNs
 * recorded as aliases (weft_state_dict_add_alias). Default: views of each
 * parameter's data DTensor (loads write into the model directly). full_state_dict: plain full
 * tensors (owned by sd), gathered with weft_dtensor_full_tensor; collective over every parameter's
 * mesh. Every parameter must have storage (WEFT_ERR_STATE naming it otherwise). On error sd keeps
 * the entries added before it. */
WEFT_API weft_status weft_get_model_state_dict(weft_module *model, const weft_state_dict_opts *opts,
                                               weft_state_dict *sd);
/* Copies sd's entries into the model's parameters (keeping their
 * placements): a DTensor entry that is the parameter's own data is left
 * as it is; one with the same spec is copied locally; one on the same mesh
 * with other placements is redistributed; one on another mesh is gathered
 * (weft_dtensor_full_tensor, collective over its mesh) and sliced. A plain
 * tensor entry is the full value: each rank copies its slice (no
 * communication). dtypes convert (weft_tensor_copy); global shapes must
 * match (WEFT_ERR_INVALID naming the key and both shapes, before anything
 * is written). A tied parameter is read from its FQN or, when sd has no
 * entry of that name, from one of its aliases ("lm_head.weight"); sd with
 * both must hold equal values under both (as the parameter's dtype;
 * WEFT_ERR_INVALID naming both keys, before anything is written; DTensor
 * entries are gathered for that, collective over their meshes); an alias
 * is never "unexpected". Parameters without storage are materialised first.
 * missing / unexpected (either may be NULL) receive the keys skipped when
 * strict is false. Collective over the parameters' meshes when
 * redistribution or gathering is needed, over MPI_COMM_WORLD with
 * broadcast_from_rank0 (and then the outcome is agreed on every rank). */
WEFT_API weft_status weft_set_model_state_dict(weft_module *model, const weft_state_dict *sd,
                                               const weft_state_dict_opts *opts,
                                               weft_key_list *missing, weft_key_list *unexpected);

/* The optimizer's state under the optimizer namespace (see the top): its
 * state DTensors (views or, with full_state_dict, gathered full tensors),
 * each parameter's step count as an int value, the hyper-parameters of
 * each parameter's group with the group's index (AdamW: lr, betas, eps,
 * weight_decay, amsgrad, as torch's param_groups flattened by FQN; SGD:
 * the learning rate), the optimizer's step count ("state.num_steps") and,
 * for AdamW, the number of groups ("param_groups.num_groups"). model is
 * the module the optimizer was created on. Same options as the model
 * version. */
WEFT_API weft_status weft_get_optimizer_state_dict(weft_module *model, weft_optimizer *opt,
                                                   const weft_state_dict_opts *opts,
                                                   weft_state_dict *sd);
/* Restores the optimizer from sd: state tensors as in
 * weft_set_model_state_dict, step counts (per parameter, and the
 * optimizer's through weft_optimizer_set_num_steps) and the parameter
 * groups' hyper-parameters (weft_optimizer_group_set; SGD: the learning
 * rate of the first parameter). The groups must match the optimizer's, as
 * torch requires of optimizer.load_state_dict: the same number of groups
 * ("param_groups.num_groups"), every parameter in the group of the same
 * index (".group"), one value per group and hyper-parameter (the
 * parameters of one optimizer group saved alike) and the same amsgrad;
 * otherwise WEFT_ERR_INVALID naming the group (and the parameter), with
 * nothing changed: every value is checked before the optimizer or a state
 * tensor is written. Keys of the optimizer namespace that match nothing are
 * "unexpected". */
WEFT_API weft_status weft_set_optimizer_state_dict(weft_module *model, weft_optimizer *opt,
                                                   const weft_state_dict *sd,
                                                   const weft_state_dict_opts *opts,
                                                   weft_key_list *missing,
                                                   weft_key_list *unexpected);

/* ------------------------------------------------------- save and load */

/* Options for save and load; NULL means WEFT_DCP_OPTS_INIT. */
typedef struct weft_dcp_opts {
  int version; /* WEFT_DCP_OPTS_VERSION */
  /* The ranks that save/load together; NULL: MPI_COMM_WORLD. Data files
   * are numbered by rank in this group. */
  const weft_mesh *group;
  /* save: bytes per checksum block (a multiple of 8 in [64, 64 MiB]);
   * 0: 1 MiB. */
  int64_t block_bytes;
  /* load: keys of sd absent from the checkpoint are skipped (returned in
   * `missing`) instead of failing. */
  bool allow_partial;
  /* async save: do the metadata exchange and commit in
   * weft_dcp_async_wait on the calling thread even when MPI offers
   * MPI_THREAD_MULTIPLE (it always does so without it). */
  bool commit_in_wait;
} weft_dcp_opts;
#define WEFT_DCP_OPTS_VERSION 1
#define WEFT_DCP_OPTS_INIT \
  { WEFT_DCP_OPTS_VERSION, NULL, 0, false, false }

/* Saves sd to directory `dir` (created if needed, parents included).
 * Collective over the group. Each rank writes the chunks the plan gives it
 * (its shards; replicas once, spread by bytes) to its own data file and
 * fsyncs it; rank 0 then writes metadata.json (via a temporary name,
 * rename, directory fsync). Errors: a Partial DTensor, a non-CPU tensor,
 * ranks disagreeing on a tensor's dtype or global shape or on a value's
 * contents, shards that overlap without being equal or leave elements
 * uncovered, I/O errors — WEFT_ERR_INVALID / WEFT_ERR_MISMATCH /
 * WEFT_ERR_IO on every rank; a failed save removes the files it wrote
 * and leaves the previous checkpoint in dir as it was. A pending async
 * save is completed first. The environment variable
 * WEFT_DCP_FAULT="rank:stage" (stage: plan, write, synced, commit) makes
 * that rank _exit(70) at that point, and "rank:write:enospc" makes its
 * data-file writes fail with ENOSPC (fault-injection tests). */
WEFT_API weft_status weft_dcp_save(const weft_state_dict *sd, const char *dir,
                                   const weft_dcp_opts *opts);

/* Loads the checkpoint in `dir` into sd in place: for each DTensor entry
 * this rank's shard, for each plain tensor the whole value, for each value
 * entry its saved value. The saving mesh, placements and world size may be
 * anything: each local piece is read from the saved chunks that overlap
 * it, only the blocks holding its bytes (pread), each verified. An entry
 * with aliases (weft_state_dict_add_alias) is read from an alias when the
 * checkpoint lacks its name. Collective
 * over the group. Errors (every rank): no directory, no or corrupt
 * metadata (an interrupted save is named as such), a key missing from the
 * checkpoint (unless allow_partial; `missing`, may be NULL, gets them),
 * dtype or global shape different from sd's entry, a value of another
 * type, a data file missing, from another checkpoint, truncated, or a
 * checksum mismatch — each naming the tensor and the file. */
WEFT_API weft_status weft_dcp_load(weft_state_dict *sd, const char *dir, const weft_dcp_opts *opts,
                                   weft_key_list *missing);

/* An async save in flight. */
typedef struct weft_dcp_async weft_dcp_async;

/* Starts saving sd to dir: plans (collective), copies every chunk this
 * rank writes from host memory into host staging buffers and queues the
 * copies of device locals into pinned host memory on the device's compute
 * stream (weft_alloc_pinned; ahead of any work queued later, so training
 * may go on at once), then returns; a background thread waits for those
 * copies, computes checksums, writes and fsyncs. With MPI_THREAD_MULTIPLE (and not
 * opts->commit_in_wait) the thread also exchanges checksums and commits
 * the metadata on a private communicator; else weft_dcp_async_wait does
 * that. sd may change as soon as this returns. At most one save is in
 * flight per process: a new save (async or not) first completes the
 * pending one (whose handle then reports its result). Collective over the
 * group. Staging buffers are kept for the next async save (see
 * weft_dcp_release_staging). Wait for the handle before weft_finalize.
 * The environment variable WEFT_DCP_FAULT applies here too. */
WEFT_API weft_status weft_dcp_async_save(const weft_state_dict *sd, const char *dir,
                                         const weft_dcp_opts *opts, weft_dcp_async **out);
/* Waits for the save to finish (commits it when that is left to wait) and
 * frees the handle; returns the save's outcome (the same on every rank).
 * Collective over the save's group. NULL: WEFT_OK. */
WEFT_API weft_status weft_dcp_async_wait(weft_dcp_async *h);
/* *done = true when the background part has finished (local; nothing is
 * freed: call wait). */
WEFT_API weft_status weft_dcp_async_test(weft_dcp_async *h, bool *done);
/* Frees the staging buffers (host and pinned) kept between saves and
 * loads (none in flight: WEFT_ERR_BUSY otherwise). */
WEFT_API weft_status weft_dcp_release_staging(void);

/* ------------------------------------------------- reading checkpoints */

/* An opened checkpoint for inspection and plain (non-collective) reads:
 * the parsed, validated metadata and the data files, opened on first use.
 * Any process may use it without MPI (weft-ckpt does). */
typedef struct weft_dcp_checkpoint weft_dcp_checkpoint;

/* Opens dir/metadata.json and validates it (every rule of FORMAT.md:
 * version, dtypes, shapes, chunks inside the tensor and tiling it with no
 * overlap and no hole, byte ranges inside their files and disjoint,
 * checksum counts). Errors: WEFT_ERR_NOT_FOUND (no directory, no metadata:
 * incomplete checkpoint), WEFT_ERR_CORRUPT (invalid metadata, naming the
 * tensor), WEFT_ERR_UNSUPPORTED (a newer format version), WEFT_ERR_IO. */
WEFT_API weft_status weft_dcp_open(const char *dir, weft_dcp_checkpoint **out);
WEFT_API void weft_dcp_close(weft_dcp_checkpoint *ck); /* NULL: no-op */

/* Checks metadata text as weft_dcp_open does, without files (the fuzz
 * target). `name` appears in messages. */
WEFT_API weft_status weft_dcp_metadata_check(const char *text, size_t len, const char *name);

typedef struct weft_dcp_info {
  int format_version;
  uint64_t id;         /* random per save; in every data file's name and header */
  int world_size;      /* ranks that saved */
  int64_t block_bytes; /* checksum block */
  int64_t num_tensors;
  int64_t num_values;
  int num_files;
} weft_dcp_info;
WEFT_API weft_status weft_dcp_get_info(const weft_dcp_checkpoint *ck, weft_dcp_info *out);

typedef struct weft_dcp_tensor_info {
  const char *name; /* owned by ck */
  weft_dtype dtype;
  int ndim;
  int64_t shape[WEFT_MAX_DIMS];
  const char *layout; /* how the saver held it: "(S(0), R) on mesh 2x2" or "full" */
  int64_t num_chunks;
} weft_dcp_tensor_info;
/* Tensor i in name order; WEFT_ERR_INVALID out of range. */
WEFT_API weft_status weft_dcp_tensor_get(const weft_dcp_checkpoint *ck, int64_t i,
                                         weft_dcp_tensor_info *out);
WEFT_API weft_status weft_dcp_tensor_find(const weft_dcp_checkpoint *ck, const char *name,
                                          weft_dcp_tensor_info *out);

typedef struct weft_dcp_chunk_info {
  int64_t offsets[WEFT_MAX_DIMS]; /* global offset of the box */
  int64_t sizes[WEFT_MAX_DIMS];
  const char *file;             /* data file name (in the directory), owned by ck */
  int rank;                     /* the rank that wrote it */
  uint64_t byte_offset, length; /* bytes in the file */
  int64_t num_blocks;           /* checksum blocks */
} weft_dcp_chunk_info;
WEFT_API weft_status weft_dcp_chunk_get(const weft_dcp_checkpoint *ck, int64_t tensor,
                                        int64_t chunk, weft_dcp_chunk_info *out);

/* Values: count, i-th (name order) as JSON text and type. */
WEFT_API weft_status weft_dcp_value_get(const weft_dcp_checkpoint *ck, int64_t i, const char **name,
                                        weft_sd_value_type *type, const char **json);

/* Reads the box start[d] <= i_d < start[d] + len[d] of tensor `name`
 * into dst, a contiguous row-major array of the box (dst_bytes of room),
 * in the stored dtype; every block read is verified. */
WEFT_API weft_status weft_dcp_read(weft_dcp_checkpoint *ck, const char *name, const int64_t *start,
                                   const int64_t *len, void *dst, size_t dst_bytes);
/* Reads every block of every chunk and checks its checksum and the data
 * files' headers and sizes. Returns the first error (naming tensor, file
 * and byte offset); *bad_blocks (may be NULL) counts all bad blocks;
 * `report` (may be NULL) is called with each error message. */
WEFT_API weft_status weft_dcp_verify(weft_dcp_checkpoint *ck, int64_t *bad_blocks,
                                     void (*report)(const char *msg, void *ctx), void *ctx);

/* ------------------------------------------------------- safetensors */

/* Writes the model's parameters to one safetensors file at `path` (world
 * rank 0 writes; names are the FQNs; dtype WEFT_F32 or WEFT_BF16 (or
 * F16/F64), converted with round-to-nearest-even; "__metadata__" has
 * {"format": "pt"}), readable by safetensors / Hugging Face / PyTorch.
 * Gathers one parameter at a time (weft_dtensor_full_tensor, collective
 * over its mesh); only rank 0 keeps the full copies. Collective over
 * MPI_COMM_WORLD; the outcome is agreed on every rank. */
WEFT_API weft_status weft_safetensors_export_model(weft_module *model, const char *path,
                                                   weft_dtype dtype);
/* Loads the parameters from a safetensors file: every rank opens it and
 * reads only the slices of its shards (weft_safetensors_read_slice),
 * converting float dtypes to the parameters'. A tied parameter is read
 * from its FQN or, when the file has no tensor of that name, from one of
 * its aliases ("lm_head.weight"); a file with both must hold the same
 * values under both (WEFT_ERR_CORRUPT naming both, before anything is
 * written). Shapes must match; missing and unexpected names follow
 * opts->strict (opts may be NULL: strict; an alias is never unexpected).
 * Collective over MPI_COMM_WORLD (outcome agreed). */
WEFT_API weft_status weft_safetensors_import_model(weft_module *model, const char *path,
                                                   const weft_state_dict_opts *opts,
                                                   weft_key_list *missing,
                                                   weft_key_list *unexpected);

#ifdef __cplusplus
}
#endif
#endif /* WEFT_DCP_H */
