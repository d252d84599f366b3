/* models/data/tokens.c — llm.c token files (see tokens.h for the format):
 * one header check, and reads of any token range with pread. */
#include "tokens.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct weft_token_file {
  int fd;
  int64_t count;
  char *path;
};

/* A little-endian int32 of the header (llm.c writes the host's order, and
 * every host it runs on is little-endian). */
static int32_t le32(const uint8_t *p) {
  return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                   (uint32_t)p[3] << 24);
}

/* pread of exactly len bytes at off (retrying short reads and EINTR);
 * returns the number of bytes read, fewer only at the end of the file, or
 * -1 with errno. */
static ssize_t pread_full(int fd, void *buf, size_t len, off_t off) {
  size_t done = 0;
  while (done < len) {
    ssize_t got = pread(fd, (uint8_t *)buf + done, len - done, off + (off_t)done);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return -1;
    if (got == 0) break;
    done += (size_t)got;
  }
  return (ssize_t)done;
}

/* Checks the header and the size of the open file f->fd; sets f->count.
 * Its errors are reported as weft_token_file_open's. */
#define OPEN "weft_token_file_open"
static weft_status check_header(weft_token_file *f) {
  const char *p = f->path;
  uint8_t h[12];
  struct stat st;
  if (fstat(f->fd, &st) != 0)
    return weft_error_at(WEFT_ERR_IO, OPEN, "cannot read data file '%s': %s", p, strerror(errno));
  ssize_t got = pread_full(f->fd, h, sizeof h, 0);
  if (got < 0)
    return weft_error_at(WEFT_ERR_IO, OPEN, "cannot read data file '%s': %s", p, strerror(errno));
  int64_t size = (int64_t)st.st_size;
  if (size < WEFT_TOKEN_FILE_HEADER_BYTES)
    return weft_error_at(WEFT_ERR_CORRUPT, OPEN,
                         "data file '%s': %lld bytes, shorter than the %d-byte llm.c header", p,
                         (long long)size, WEFT_TOKEN_FILE_HEADER_BYTES);
  int32_t magic = le32(h), version = le32(h + 4), count = le32(h + 8);
  if (magic != WEFT_TOKEN_FILE_MAGIC)
    return weft_error_at(WEFT_ERR_CORRUPT, OPEN,
                         "data file '%s': bad magic %d (want %d: llm.c .bin)", p, magic,
                         WEFT_TOKEN_FILE_MAGIC);
  if (version != WEFT_TOKEN_FILE_VERSION)
    return weft_error_at(WEFT_ERR_CORRUPT, OPEN,
                         "data file '%s': version %d (want %d: uint16 tokens)", p, version,
                         WEFT_TOKEN_FILE_VERSION);
  if (count < 1)
    return weft_error_at(WEFT_ERR_CORRUPT, OPEN,
                         "data file '%s': header says %d tokens (want >= 1)", p, count);
  int64_t want = WEFT_TOKEN_FILE_HEADER_BYTES + 2 * (int64_t)count;
  int64_t held = (size - WEFT_TOKEN_FILE_HEADER_BYTES) / 2;
  if (size < want)
    return weft_error_at(WEFT_ERR_CORRUPT, OPEN,
                         "data file '%s': truncated: the header says %d tokens but the file "
                         "holds %lld (%lld bytes, want %lld)",
                         p, count, (long long)held, (long long)size, (long long)want);
  if (size > want)
    return weft_error_at(WEFT_ERR_CORRUPT, OPEN,
                         "data file '%s': %lld bytes after the %d tokens of its header (file of "
                         "%lld bytes, want %lld)",
                         p, (long long)(size - want), count, (long long)size, (long long)want);
  f->count = count;
  return WEFT_OK;
}
#undef OPEN

weft_status weft_token_file_open(const char *path, weft_token_file **out) {
  if (!out) return weft_error(WEFT_ERR_INVALID, "out is NULL");
  *out = NULL;
  if (!path || !*path) return weft_error(WEFT_ERR_INVALID, "data file path is NULL or empty");
  weft_token_file *f = calloc(1, sizeof *f);
  if (f) f->path = strdup(path);
  if (!f || !f->path) {
    free(f);
    return weft_error(WEFT_ERR_OOM, "data file '%s': handle", path);
  }
  f->fd = open(path, O_RDONLY | O_CLOEXEC);
  if (f->fd < 0) {
    weft_status st =
        weft_error(WEFT_ERR_IO, "cannot open data file '%s': %s", path, strerror(errno));
    weft_token_file_close(f);
    return st;
  }
  weft_status st = check_header(f);
  if (st != WEFT_OK) {
    weft_token_file_close(f);
    return st;
  }
  *out = f;
  return WEFT_OK;
}

int64_t weft_token_file_count(const weft_token_file *f) { return f ? f->count : 0; }

const char *weft_token_file_path(const weft_token_file *f) { return f ? f->path : ""; }

weft_status weft_token_file_read(const weft_token_file *f, int64_t first, int64_t n, int32_t *out) {
  if (!f) return weft_error(WEFT_ERR_INVALID, "token file is NULL");
  if (first < 0 || n < 0)
    return weft_error(WEFT_ERR_INVALID, "data file '%s': read of %lld tokens at %lld (want >= 0)",
                      f->path, (long long)n, (long long)first);
  if (n > f->count - first)
    return weft_error(WEFT_ERR_INVALID,
                      "read of tokens [%lld, %lld) past the end of data file '%s' (%lld tokens)",
                      (long long)first, (long long)first + n, f->path, (long long)f->count);
  if (n > 0 && !out) return weft_error(WEFT_ERR_INVALID, "out is NULL");
  uint8_t buf[8192];
  int64_t done = 0;
  while (done < n) {
    int64_t k = n - done;
    if (2 * k > (int64_t)sizeof buf) k = (int64_t)sizeof buf / 2;
    off_t off = (off_t)(WEFT_TOKEN_FILE_HEADER_BYTES + 2 * (first + done));
    ssize_t got = pread_full(f->fd, buf, (size_t)(2 * k), off);
    if (got != (ssize_t)(2 * k))
      return weft_error(WEFT_ERR_IO, "reading data file '%s' failed at token %lld: %s", f->path,
                        (long long)(first + done),
                        got < 0 ? strerror(errno) : "the file is shorter than at open");
    for (int64_t i = 0; i < k; i++)
      out[done + i] = (int32_t)((uint32_t)buf[2 * i] | (uint32_t)buf[2 * i + 1] << 8);
    done += k;
  }
  return WEFT_OK;
}

void weft_token_file_close(weft_token_file *f) {
  if (!f) return;
  if (f->fd >= 0) close(f->fd);
  free(f->path);
  free(f);
}
