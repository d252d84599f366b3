/* weft/safetensors.h — reading and writing the safetensors format, for
 * interchange with PyTorch / Hugging Face.
 *
 * The format (https://github.com/huggingface/safetensors, "Format"):
 *
 *   offset        size   contents
 *   0             8      N: header length, unsigned little-endian 64-bit
 *   8             N      header: a UTF-8 JSON object (may be padded at the
 *                        end with spaces, 0x20)
 *   8 + N         rest   data buffer: every tensor's bytes, row-major,
 *                        little-endian
 *
 *   header = { "__metadata__": {"key": "value", ...},          (optional)
 *              "<name>": {"dtype": "F32", "shape": [2, 3],
 *                         "data_offsets": [begin, end]}, ... }
 *
 * data_offsets are byte offsets relative to the start of the data buffer;
 * end - begin must equal prod(shape) * dtype size (a scalar has shape []).
 * dtypes handled here: F32, F64, BF16, F16, I32, I64, U8.
 *
 * Reading is strict: a header length past the end of the file, a header
 * that is not a JSON object, an unknown dtype, a bad shape, offsets out of
 * the data buffer, overlapping tensors, a byte length that disagrees with
 * shape and dtype, or a duplicate name each fail with WEFT_ERR_CORRUPT and a
 * message naming the file and the tensor. Gaps between tensors are accepted.
 * Tensors are read with pread, whole or as a sub-box (a rank reads only its
 * rows or columns), converting between float dtypes on the way if asked.
 *
 * Writing produces what the reference implementation accepts: tensors laid
 * out back to back with no gaps, larger elements first (so each tensor is
 * aligned to its element size, as the reference writer arranges), the
 * header padded with spaces to a multiple of 8 bytes, written to a
 * temporary file and renamed into place.
 *
 *     weft_safetensors *f;
 *     WEFT_CHECK(weft_safetensors_open("init.safetensors", &f));
 *     weft_safetensors_info info;
 *     WEFT_CHECK(weft_safetensors_find(f, "tok_embeddings.weight", &info));
 *     // rows [r0, r0 + n) of a [V, D] table, as f32
 *     WEFT_CHECK(weft_safetensors_read_rows(f, "tok_embeddings.weight", r0, n,
 *                                           WEFT_F32, buf, n * info.shape[1]));
 *     weft_safetensors_close(f);
 *
 * note: assumes a little-endian host (checked at compile time).
 * Thread safety: a reader may be used from several threads at once for
 * reads (pread has no shared file position); open/close are not concurrent
 * with anything.
 */
#ifndef WEFT_SAFETENSORS_H
#define WEFT_SAFETENSORS_H

#include <stdint.h>

#include "kernels.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* An open safetensors file: the parsed, validated header and a file
 * descriptor. Opaque. */
typedef struct weft_safetensors weft_safetensors;

/* What the header says about one tensor. `name` points into the reader and
 * lives until weft_safetensors_close. */
typedef struct weft_safetensors_info {
  const char *name;
  weft_dtype dtype;
  int ndim; /* 0 for a scalar */
  int64_t shape[WEFT_MAX_DIMS];
  int64_t numel;
  uint64_t offset; /* absolute byte offset of the data in the file */
  uint64_t nbytes; /* = numel * weft_dtype_size(dtype) */
} weft_safetensors_info;

/* Opens and validates `path` (see the top of this file). On success *out
 * owns a file descriptor and the header until weft_safetensors_close.
 * Errors: WEFT_ERR_IO (cannot open or read), WEFT_ERR_CORRUPT (any
 * validation failure), WEFT_ERR_UNSUPPORTED (more than WEFT_MAX_DIMS dims),
 * WEFT_ERR_OOM. Any rank may call it; it communicates with nobody. */
WEFT_API weft_status weft_safetensors_open(const char *path, weft_safetensors **out);
/* Closes the file and frees the reader. NULL is a no-op. */
WEFT_API void weft_safetensors_close(weft_safetensors *f);

/* Number of tensors (not counting __metadata__). */
WEFT_API int64_t weft_safetensors_count(const weft_safetensors *f);
/* Tensor i in name order (strcmp), 0 <= i < count; WEFT_ERR_INVALID else. */
WEFT_API weft_status weft_safetensors_get(const weft_safetensors *f, int64_t i,
                                          weft_safetensors_info *out);
/* The tensor called `name`; WEFT_ERR_NOT_FOUND if absent. */
WEFT_API weft_status weft_safetensors_find(const weft_safetensors *f, const char *name,
                                           weft_safetensors_info *out);
/* The __metadata__ value for `key`, or NULL if absent. Owned by the reader. */
WEFT_API const char *weft_safetensors_metadata(const weft_safetensors *f, const char *key);

/* Reads the whole tensor `name` into dst as `dtype` (dst_numel elements of
 * room, which must be >= the tensor's numel). The stored dtype and `dtype`
 * must be equal, or both floating-point (F32/F64/BF16/F16: converted, via
 * weft's round-to-nearest-even for BF16/F16); else WEFT_ERR_UNSUPPORTED.
 * Errors: WEFT_ERR_NOT_FOUND, WEFT_ERR_INVALID (dst too small), WEFT_ERR_IO
 * (short read: the file changed since open). */
WEFT_API weft_status weft_safetensors_read(const weft_safetensors *f, const char *name,
                                           weft_dtype dtype, void *dst, int64_t dst_numel);
/* Reads the box start[d] <= i_d < start[d] + len[d] (ndim must equal the
 * tensor's ndim) into dst as a contiguous row-major (len[0], ..., len[nd-1])
 * array of `dtype`. Only the needed byte ranges are read (nearby ranges are
 * merged into one pread). A box outside the tensor is WEFT_ERR_INVALID. */
WEFT_API weft_status weft_safetensors_read_slice(const weft_safetensors *f, const char *name,
                                                 int ndim, const int64_t *start, const int64_t *len,
                                                 weft_dtype dtype, void *dst, int64_t dst_numel);
/* Rows [row0, row0 + nrows) along dim 0 (all of the other dims): one pread. */
WEFT_API weft_status weft_safetensors_read_rows(const weft_safetensors *f, const char *name,
                                                int64_t row0, int64_t nrows, weft_dtype dtype,
                                                void *dst, int64_t dst_numel);
/* Reads tensor `name` into dst, a contiguous CPU weft_tensor of the same
 * shape, converting to dst->dtype as weft_safetensors_read does. */
WEFT_API weft_status weft_safetensors_read_tensor(const weft_safetensors *f, const char *name,
                                                  weft_tensor *dst);

/* One tensor to write: `data` holds prod(shape) elements of `dtype`,
 * contiguous row-major. The writer does not keep any pointer. */
typedef struct weft_safetensors_entry {
  const char *name; /* unique, non-empty, not "__metadata__" */
  weft_dtype dtype;
  int ndim;             /* 0..WEFT_MAX_DIMS */
  const int64_t *shape; /* ndim sizes >= 0 (may be NULL when ndim == 0) */
  const void *data;     /* may be NULL when the tensor is empty */
} weft_safetensors_entry;

/* Writes n tensors to `path` (header entries in the given order; data back
 * to back, 8-byte dtypes first, then 4, 2, 1, the given order within each), with
 * optional metadata: `metadata` is NULL or a NULL-terminated list of
 * alternating keys and values ("format", "pt", NULL). The file is written
 * as `path`.tmp.<pid>, flushed to disk and renamed onto `path`, so `path` is
 * either the old file or the complete new one. Errors: WEFT_ERR_INVALID
 * (bad entry: message names it), WEFT_ERR_IO. */
WEFT_API weft_status weft_safetensors_write(const char *path, const weft_safetensors_entry *tensors,
                                            int64_t n, const char *const *metadata);

#ifdef __cplusplus
}
#endif
#endif /* WEFT_SAFETENSORS_H */
