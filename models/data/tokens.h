/* models/data/tokens.h — llm.c's token files (.bin), read by any program
 * that trains on them: weft-train's --data and the golden folders of the
 * tests.
 *
 *     weft_token_file *f = NULL;
 *     if (weft_token_file_open("train.bin", &f) != WEFT_OK) ...;  // checks the header
 *     int64_t n = weft_token_file_count(f);
 *     int32_t row[T + 1];
 *     weft_token_file_read(f, pos, T + 1, row);                   // tokens [pos, pos + T + 1)
 *     weft_token_file_close(f);
 *
 * The format, as llm.c writes it (dev/data/data_common.py, "gpt-2") and
 * reads it (llmc/dataloader.h), all little-endian:
 *
 *     offset  size        field
 *     0       4 (int32)   magic 20240520
 *     4       4 (int32)   version 1
 *     8       4 (int32)   token count N (>= 1)
 *     12      1012        the rest of the 256 int32 header (unused, zeros)
 *     1024    2 N         N uint16 tokens
 *
 * and nothing after them: like llm.c, a file whose size is not exactly
 * 1024 + 2 N bytes is rejected (truncated, or not what its header says).
 * (llm.c's Llama 3 files, magic 20240801 with uint32 tokens, are not read.)
 *
 * Everything here is local (no MPI, no collective): each rank that calls
 * open checks the file itself; SPMD programs agree on the outcome if ranks
 * may see different files (weft_agree_status). Errors are weft_error
 * messages naming the file. */
#ifndef WEFT_MODELS_DATA_TOKENS_H
#define WEFT_MODELS_DATA_TOKENS_H

#include <stdint.h>

#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define WEFT_TOKEN_FILE_MAGIC 20240520
#define WEFT_TOKEN_FILE_VERSION 1
#define WEFT_TOKEN_FILE_HEADER_BYTES 1024 /* 256 int32 */

/* An open llm.c token file: the path, the token count and an open file
 * descriptor. Reads use pread, so one handle may serve several threads. */
typedef struct weft_token_file weft_token_file;

/* Opens `path` and checks its header and size. On success *out is a new
 * handle owned by the caller (weft_token_file_close); on failure *out is
 * NULL and nothing is left open. Local.
 * Errors (each message names the file):
 *   WEFT_ERR_INVALID  path or out NULL, or path empty;
 *   WEFT_ERR_IO       the file cannot be opened or read ("cannot open data
 *                     file '<path>': <strerror>");
 *   WEFT_ERR_CORRUPT  shorter than the 1024-byte header, bad magic ("bad
 *                     magic M (want 20240520 ...)"), bad version ("version V
 *                     (want 1)"), a token count < 1, or a size other than
 *                     1024 + 2 N bytes (truncated, or trailing bytes);
 *   WEFT_ERR_OOM. */
WEFT_API weft_status weft_token_file_open(const char *path, weft_token_file **out);

/* The number of tokens N (from the checked header); 0 for NULL. Local. */
WEFT_API int64_t weft_token_file_count(const weft_token_file *f);

/* The path given to open (a copy owned by f, valid until close); "" for
 * NULL. */
WEFT_API const char *weft_token_file_path(const weft_token_file *f);

/* Reads tokens [first, first + n) into out[0 .. n) (caller-owned, n
 * int32), widened from uint16 (so 0 <= out[i] < 65536). n == 0 reads
 * nothing. Local; thread-safe on one handle (pread).
 * Errors: WEFT_ERR_INVALID (f NULL, out NULL with n > 0, first or n < 0,
 * or first + n past the end: "read of tokens [a, b) past the end of data
 * file '<path>' (N tokens)"), WEFT_ERR_IO (the read failed or came short:
 * the file changed since open; out is then partly written). */
WEFT_API weft_status weft_token_file_read(const weft_token_file *f, int64_t first, int64_t n,
                                          int32_t *out);

/* Closes the file and frees the handle. NULL is a no-op. */
WEFT_API void weft_token_file_close(weft_token_file *f);

#ifdef __cplusplus
}
#endif
#endif
