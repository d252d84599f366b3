/* dcp/dcp_internal.h — shared pieces of weft_dcp: the metadata model and
 * its parser/serialiser, the private communicator, the checkpoint reader
 * and box geometry. Not installed. */
#ifndef WEFT_DCP_INTERNAL_H
#define WEFT_DCP_INTERNAL_H

#include <cjson/cJSON.h>
#include <mpi.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dcp.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "weft_dcp assumes a little-endian host (data files are little-endian)"
#endif

#define DCP_FORMAT_NAME "weft-dcp"
#define DCP_FORMAT_VERSION 1
#define DCP_METADATA "metadata.json"
#define DCP_METADATA_TMP "metadata.json.tmp"
#define DCP_FILE_MAGIC "WEFTDCPD"
#define DCP_FILE_HEADER 64 /* bytes before the first chunk of a data file */
#define DCP_ALIGN 64       /* chunks start at multiples of this */
#define DCP_DEFAULT_BLOCK ((int64_t)1 << 20)
#define DCP_MIN_BLOCK 64
#define DCP_MAX_BLOCK ((int64_t)64 << 20)
#define DCP_MAX_INT 9007199254740992.0 /* JSON numbers are exact below 2^53 */
#define DCP_FAULT_EXIT 70

/* ------------------------------------------------------------ geometry */

/* Boxes are dtensor's weft_box (weft_box_volume, _equal, _intersect) and a
 * shard's pieces weft_dtensor_local_boxes: one copy of that geometry. */
/* "[0:4, 2:6]" */
void dcp_box_describe(const weft_box *b, int ndim, char *buf, size_t cap);
/* Checks that boxes[0..n) lie inside shape, have no zero size, do not
 * overlap and together cover every element. On failure the message names
 * `tensor` and `where`, and the two boxes that overlap (owner(i) gives a
 * label for box i, may be NULL). */
weft_status dcp_check_tiling(const char *where, const char *tensor, int ndim, const int64_t *shape,
                             const weft_box *const *boxes, int64_t n,
                             const char *(*owner)(int64_t i, void *ctx), void *ctx);

/* (n-d box copies: kernels' weft_tensor_copy_region / weft_tensor_copy) */
/* Element strides -> byte strides. */
void dcp_byte_strides(const weft_tensor *t, int64_t *out);
/* Host staging of tensors that live on a device (files are read and
 * written on the host). dcp_host_of: *host is t itself on the CPU, else a
 * new host copy of it (*owned, the caller destroys it; waits for the
 * device). dcp_stage_begin: *host is dst itself on the CPU, else a
 * contiguous host tensor of dst's shape to fill (over the kept pinned
 * block, so the copy up is a pinned one; a staging begun while another is
 * open gets ordinary memory); dcp_stage_end then copies it into dst when st
 * is WEFT_OK and frees it, returning the first error. */
weft_status dcp_host_of(const weft_tensor *t, const weft_tensor **host, weft_tensor **owned);
/* weft_dtensor_full_tensor, brought to the host (collective like it). */
weft_status dcp_full_on_host(const weft_dtensor *dt, weft_tensor **out);
weft_status dcp_stage_begin(weft_tensor *dst, weft_tensor **host);
weft_status dcp_stage_end(weft_tensor *dst, weft_tensor *host, weft_status st);
/* The pinned block kept between saves and loads: take gives it (or a new
 * one when it is smaller than bytes or on another device; *cap its size),
 * give hands a block back (the larger of it and the kept one stays),
 * release frees the kept one. Not thread-safe: the caller's thread only. */
weft_status dcp_pinned_take(weft_device dev, size_t bytes, char **p, size_t *cap);
void dcp_pinned_give(weft_device dev, char *p, size_t cap);
void dcp_pinned_release(void);
/* Contiguous row-major byte strides of shape. */
void dcp_contig_strides(const int64_t *shape, int ndim, size_t esz, int64_t *out);

/* ------------------------------------------------------------ metadata */

typedef struct dcp_chunk {
  weft_box box;
  int file;          /* index into files */
  uint64_t byte_off; /* in the file */
  uint64_t length;   /* = volume * dtype size */
  uint32_t *crc;     /* one per block */
  int64_t ncrc;
} dcp_chunk;

typedef struct dcp_tmeta {
  char *name;
  weft_dtype dtype;
  int ndim;
  int64_t shape[WEFT_MAX_DIMS];
  char *layout;
  dcp_chunk *chunks;
  int64_t nchunks;
} dcp_tmeta;

/* A value: its type and canonical text (int: decimal digits; double: C99
 * hex float "%a" or inf/-inf/nan; string: the raw text; json: normalised
 * JSON text). */
typedef struct dcp_vmeta {
  char *name;
  weft_sd_value_type type;
  char *text;
  char *json; /* the JSON rendering for users (weft_state_dict_get_json) */
} dcp_vmeta;

typedef struct dcp_fmeta {
  char *name;
  int rank;
  uint64_t bytes; /* whole file, header included */
} dcp_fmeta;

typedef struct dcp_meta {
  int version;
  uint64_t id;
  int world_size;
  int64_t block;
  dcp_fmeta *files;
  int nfiles;
  dcp_tmeta *t; /* sorted by name */
  int64_t nt;
  dcp_vmeta *v; /* sorted by name */
  int64_t nv;
} dcp_meta;

weft_status dcp_meta_parse(const char *text, size_t len, const char *where, dcp_meta *out);
void dcp_meta_free(dcp_meta *m);
/* JSON text (malloc'ed) ending with its "checksum" member (FORMAT.md), or
 * NULL on OOM. dcp_meta_parse verifies that checksum where there is one. */
char *dcp_meta_serialize(const dcp_meta *m);
const dcp_tmeta *dcp_meta_find_tensor(const dcp_meta *m, const char *name);
const dcp_vmeta *dcp_meta_find_value(const dcp_meta *m, const char *name);
const char *dcp_value_type_name(weft_sd_value_type t);
/* Fills v->json from type and text (malloc). */
weft_status dcp_value_render_json(dcp_vmeta *v);

/* Data file name for (rank, id): "r00003-0123456789abcdef.data". */
void dcp_file_name(int rank, uint64_t id, char *buf, size_t cap);
/* The 64-byte header of a data file. */
void dcp_file_header(int rank, uint64_t id, int world_size, uint8_t out[DCP_FILE_HEADER]);

/* -------------------------------------------------------------- reader */

struct weft_dcp_checkpoint {
  char *dir;
  dcp_meta m;
  int *fd;           /* per file, -1 until opened */
  uint64_t *fsize;   /* actual size */
  weft_status *ferr; /* sticky open/header error per file */
  char **ferrmsg;
  char *stage;
  size_t stage_cap;
};

/* Builds a reader over dir from metadata text (already read). */
weft_status dcp_ck_from_text(const char *dir, const char *text, size_t len,
                             weft_dcp_checkpoint **out);
/* Reads dir/metadata.json into a malloc'ed NUL-terminated buffer. Errors
 * say whether the directory is missing or the save was interrupted. */
weft_status dcp_read_metadata_file(const char *dir, char **text, size_t *len);
/* Opens (once) and checks data file f for a read of tensor t's chunk c:
 * header (magic, version, rank, checkpoint id) and that the file holds
 * the chunk's bytes. */
weft_status dcp_ck_prepare_chunk(weft_dcp_checkpoint *ck, const dcp_tmeta *t, const dcp_chunk *c);
/* Prepares every chunk of t that overlaps region. */
weft_status dcp_ck_prepare_region(weft_dcp_checkpoint *ck, const dcp_tmeta *t,
                                  const weft_box *region);
/* Reads the global box `region` of t into dst (byte strides dst_strides,
 * dst points at the region's first element), from every chunk that
 * overlaps it, verifying each block read. */
weft_status dcp_ck_read_region(weft_dcp_checkpoint *ck, const dcp_tmeta *t, const weft_box *region,
                               char *dst, const int64_t *dst_strides);

/* ------------------------------------------------------- communication */

typedef struct dcp_comm {
  MPI_Comm comm;
  int rank, size;
} dcp_comm;

/* Duplicates the group's communicator (MPI_Comm_idup + backoff wait). */
weft_status dcp_comm_open(const weft_mesh *group, dcp_comm *c);
void dcp_comm_close(dcp_comm *c);
/* Waits for r with MPI_Test and a backoff, up to weft's timeout. */
weft_status dcp_wait(MPI_Request *r, const char *what);
/* All-gather of variable-size byte blobs: *recv (malloc'ed) holds rank
 * i's blob at displs[i], of length displs[i+1] - displs[i]; displs has
 * size+1 entries (malloc'ed). */
weft_status dcp_allgatherv(const dcp_comm *c, const void *send, int64_t n, char **recv,
                           int64_t **displs);
/* Broadcast of n bytes from root (pieces of at most 1 GiB). */
weft_status dcp_bcast(const dcp_comm *c, void *buf, int64_t n, int root);
/* Agreement: every rank passes its status (message in weft_last_error());
 * returns WEFT_OK everywhere or the lowest failing rank's status, with its
 * message, on every rank. */
weft_status dcp_agree(const dcp_comm *c, weft_status st, const char *what);
/* Whether MPI runs with MPI_THREAD_MULTIPLE. */
bool dcp_thread_multiple(void);

/* Fault injection: _exit(DCP_FAULT_EXIT) when WEFT_DCP_FAULT is
 * "<rank>:<stage>" for this rank and stage. */
void dcp_fault_point(int rank, const char *stage);
/* The errno that WEFT_DCP_FAULT=<rank>:<stage>:enospc asks the I/O at
 * `stage` to fail with on `rank` (0: none). A test hook, like the above. */
int dcp_fault_errno(int rank, const char *stage);

/* Status blobs: encode status + message, decode the first failure. */
typedef struct dcp_buf {
  char *p;
  size_t len, cap;
  bool oom;
} dcp_buf;
void dcp_buf_put(dcp_buf *b, const void *data, size_t n);
void dcp_buf_u32(dcp_buf *b, uint32_t v);
void dcp_buf_u64(dcp_buf *b, uint64_t v);
void dcp_buf_str(dcp_buf *b, const char *s);
typedef struct dcp_rd {
  const char *p;
  size_t len, at;
  bool bad;
} dcp_rd;
void dcp_rd_get(dcp_rd *r, void *out, size_t n);
uint32_t dcp_rd_u32(dcp_rd *r);
uint64_t dcp_rd_u64(dcp_rd *r);
/* A pointer to n bytes inside the blob (NULL and bad set if short). */
const char *dcp_rd_bytes(dcp_rd *r, size_t n);
/* A string written by dcp_buf_str: malloc'ed copy. */
char *dcp_rd_str(dcp_rd *r);

/* ---------------------------------------------------------- state dict */

typedef struct dcp_sd_ent {
  char *name;
  weft_sd_kind kind;
  weft_dtensor *dt;
  weft_tensor *t;
  bool owned;
  dcp_vmeta val; /* values: type, canonical text, JSON (val.name unused) */
} dcp_sd_ent;

/* Another name of an entry (a tied parameter's alias FQN). */
typedef struct dcp_sd_alias {
  char *alias;
  char *name;
} dcp_sd_alias;

struct weft_state_dict {
  dcp_sd_ent *e;
  int64_t n, cap;
  int64_t *hash; /* open addressing: entry index + 1, 0 = empty */
  int64_t hcap;
  dcp_sd_alias *al; /* weft_state_dict_add_alias, in insertion order */
  int64_t nal;
};

/* Index of the entry called name, or -1. */
int64_t dcp_sd_index(const weft_state_dict *sd, const char *name);
/* Adds or replaces a value entry from its canonical text. */
weft_status dcp_sd_set_value(weft_state_dict *sd, const char *name, weft_sd_value_type type,
                             const char *text);
/* true for keys of the optimizer namespace ("state.", "param_groups."). */
bool dcp_is_optimizer_key(const char *name);

/* The i-th alias of entry `name` in sd (i = 0, 1, ...), NULL past the
 * last. */
const char *dcp_sd_alias_of(const weft_state_dict *sd, const char *name, int i);

/* Tied parameters of a model (weft_module_tie_param) whose parameter is
 * one of the model's: the alias FQN ("lm_head.weight") and the parameter
 * (whose fqn is the owner's, "transformer.wte.weight"). */
typedef struct dcp_tie {
  char *alias;
  weft_param *p;
} dcp_tie;
weft_status dcp_model_ties(weft_module *model, dcp_tie **out, int *n);
/* WEFT_ERR_STATE naming the first of ps[0..n) that FSDP holds unsharded
 * (weft_param.master set): a load would reach its sharded master while
 * forward keeps reading the stale unsharded copy. `what` names the call.
 * Alike on every rank (unsharding is collective). */
weft_status dcp_check_resharded(weft_param *const *ps, int n, const char *what);
void dcp_ties_free(dcp_tie *t, int n);
/* Whether two tensors hold the same values once converted to `dtype`
 * (bitwise; same shapes assumed). Local. */
weft_status dcp_tensors_equal(const weft_tensor *a, const weft_tensor *b, weft_dtype dtype,
                              bool *equal);

/* Completes a pending async save (if any) before another save or load. */
void dcp_complete_pending(void);

/* The last error's message without its "[rank N] function: " prefix and
 * breadcrumbs (for re-raising it inside another message). Thread-local
 * buffer, valid until the next call. */
const char *dcp_last_msg(void);

/* utility */
char *dcp_strdup(const char *s);
char *dcp_path_join(const char *dir, const char *name);
weft_status dcp_write_full(int fd, const void *buf, size_t n, uint64_t off, const char *path);
weft_status dcp_pread_full(int fd, void *buf, size_t n, uint64_t off, const char *path,
                           const char *what);
weft_status dcp_fsync_dir(const char *dir);
weft_status dcp_mkdirs(const char *dir);

#endif /* WEFT_DCP_INTERNAL_H */
