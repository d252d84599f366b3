/* dcp/reader.c — reading checkpoints: metadata.json, data-file headers,
 * and boxes of tensors assembled from the saved chunks that overlap them.
 *
 * Checksums are per block of a chunk (FORMAT.md): to read bytes [s, e) of
 * a chunk the reader reads the blocks that hold them and verifies each
 * block it reads. Two paths:
 * - a run of >= 2 blocks whose destination is contiguous (a same-layout
 *   reload, a row split): whole blocks are pread straight into the
 *   destination and verified there; partial first/last blocks go through
 *   the stage buffer;
 * - short runs (a column split: one run per row) are gathered into windows
 *   of consecutive blocks, each window read with one pread into the stage,
 *   verified, and the runs copied out. A window ends at a gap of at least
 *   one untouched block, so blocks holding no needed byte are not read.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dcp_internal.h"

#define STAGE_MIN ((size_t)8 << 20)
#define DIRECT_GROUP ((uint64_t)1 << 20)
#define MAX_PENDING 4096
#define PIECE ((uint64_t)256 << 10)

weft_status dcp_read_metadata_file(const char *dir, char **text, size_t *len) {
  *text = NULL;
  *len = 0;
  if (!dir || !dir[0]) return weft_error(WEFT_ERR_INVALID, "checkpoint directory is NULL or empty");
  struct stat sb;
  if (stat(dir, &sb) != 0) {
    if (errno == ENOENT)
      return weft_error(WEFT_ERR_NOT_FOUND, "checkpoint directory '%s' does not exist", dir);
    return weft_error(WEFT_ERR_IO, "checkpoint directory '%s': %s", dir, strerror(errno));
  }
  if (!S_ISDIR(sb.st_mode))
    return weft_error(WEFT_ERR_NOT_FOUND, "'%s' is not a directory (a checkpoint is a directory)",
                      dir);
  char *path = dcp_path_join(dir, DCP_METADATA);
  if (!path) return weft_error(WEFT_ERR_OOM, "path");
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    weft_status st;
    if (e == ENOENT) {
      char *tmp = dcp_path_join(dir, DCP_METADATA_TMP);
      bool interrupted = tmp && access(tmp, F_OK) == 0;
      free(tmp);
      if (interrupted)
        st = weft_error(WEFT_ERR_NOT_FOUND,
                        "checkpoint '%s' is incomplete: it has no %s, only %s "
                        "(the save was interrupted before it committed)",
                        dir, DCP_METADATA, DCP_METADATA_TMP);
      else
        st = weft_error(WEFT_ERR_NOT_FOUND,
                        "checkpoint '%s' is incomplete or not a checkpoint: "
                        "it has no %s (a save that never finished leaves none)",
                        dir, DCP_METADATA);
    } else {
      st = weft_error(WEFT_ERR_IO, "cannot open '%s': %s", path, strerror(e));
    }
    free(path);
    return st;
  }
  weft_status st = WEFT_OK;
  char *buf = NULL;
  if (fstat(fd, &sb) != 0) {
    st = weft_error(WEFT_ERR_IO, "%s: fstat: %s", path, strerror(errno));
    goto done;
  }
  if (sb.st_size > ((off_t)1 << 31)) {
    st = weft_error(WEFT_ERR_CORRUPT, "%s: %lld bytes is too large for metadata", path,
                    (long long)sb.st_size);
    goto done;
  }
  size_t n = (size_t)sb.st_size;
  buf = malloc(n + 1);
  if (!buf) {
    st = weft_error(WEFT_ERR_OOM, "%s: %zu bytes", path, n);
    goto done;
  }
  WEFT_CHECK_GOTO(dcp_pread_full(fd, buf, n, 0, path, "the metadata"), st, done);
  buf[n] = '\0';
  *text = buf;
  *len = n;
  buf = NULL;
done:
  free(buf);
  close(fd);
  free(path);
  return st;
}

weft_status dcp_ck_from_text(const char *dir, const char *text, size_t len,
                             weft_dcp_checkpoint **out) {
  *out = NULL;
  weft_dcp_checkpoint *ck = calloc(1, sizeof *ck);
  if (!ck) return weft_error(WEFT_ERR_OOM, "checkpoint reader");
  ck->dir = dcp_strdup(dir);
  char *where = dcp_path_join(dir, DCP_METADATA);
  if (!ck->dir || !where) {
    free(where);
    weft_dcp_close(ck);
    return weft_error(WEFT_ERR_OOM, "path");
  }
  weft_status st = dcp_meta_parse(text, len, where, &ck->m);
  free(where);
  if (st != WEFT_OK) {
    weft_dcp_close(ck);
    return weft_error_trace(st, __func__);
  }
  int nf = ck->m.nfiles;
  ck->fd = malloc((size_t)nf * sizeof *ck->fd);
  ck->fsize = calloc((size_t)nf, sizeof *ck->fsize);
  ck->ferr = calloc((size_t)nf, sizeof *ck->ferr);
  ck->ferrmsg = calloc((size_t)nf, sizeof *ck->ferrmsg);
  if (!ck->fd || !ck->fsize || !ck->ferr || !ck->ferrmsg) {
    weft_dcp_close(ck);
    return weft_error(WEFT_ERR_OOM, "checkpoint reader");
  }
  for (int i = 0; i < nf; i++) ck->fd[i] = -1;
  *out = ck;
  return WEFT_OK;
}

weft_status weft_dcp_open(const char *dir, weft_dcp_checkpoint **out) {
  if (!out) return weft_error(WEFT_ERR_INVALID, "out is NULL");
  *out = NULL;
  char *text;
  size_t len;
  WEFT_CHECK(dcp_read_metadata_file(dir, &text, &len));
  weft_status st = dcp_ck_from_text(dir, text, len, out);
  free(text);
  return st;
}

void weft_dcp_close(weft_dcp_checkpoint *ck) {
  if (!ck) return;
  for (int i = 0; ck->fd && i < ck->m.nfiles; i++)
    if (ck->fd[i] >= 0) close(ck->fd[i]);
  for (int i = 0; ck->ferrmsg && i < ck->m.nfiles; i++) free(ck->ferrmsg[i]);
  free(ck->fd);
  free(ck->fsize);
  free(ck->ferr);
  free(ck->ferrmsg);
  free(ck->stage);
  dcp_meta_free(&ck->m);
  free(ck->dir);
  free(ck);
}

/* Opens data file f and checks its header; errors are sticky per file. */
static weft_status open_file(weft_dcp_checkpoint *ck, int f) {
  if (ck->fd[f] >= 0) return WEFT_OK;
  if (ck->ferr[f]) return weft_error(ck->ferr[f], "%s", ck->ferrmsg[f]);
  const dcp_fmeta *fm = &ck->m.files[f];
  char *path = dcp_path_join(ck->dir, fm->name);
  if (!path) return weft_error(WEFT_ERR_OOM, "path");
  char msg[1024];
  weft_status st = WEFT_OK;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    st = errno == ENOENT ? WEFT_ERR_NOT_FOUND : WEFT_ERR_IO;
    snprintf(msg, sizeof msg, "data file '%s' (written by rank %d) %s", path, fm->rank,
             errno == ENOENT ? "is missing" : strerror(errno));
    goto done;
  }
  struct stat sb;
  uint8_t h[DCP_FILE_HEADER];
  if (fstat(fd, &sb) != 0) {
    st = WEFT_ERR_IO;
    snprintf(msg, sizeof msg, "data file '%s': fstat: %s", path, strerror(errno));
    goto done;
  }
  if (sb.st_size < DCP_FILE_HEADER) {
    st = WEFT_ERR_CORRUPT;
    snprintf(msg, sizeof msg,
             "data file '%s' is truncated: %lld bytes, not even its %d-byte header", path,
             (long long)sb.st_size, DCP_FILE_HEADER);
    goto done;
  }
  ssize_t r = pread(fd, h, DCP_FILE_HEADER, 0);
  if (r != DCP_FILE_HEADER) {
    st = WEFT_ERR_IO;
    snprintf(msg, sizeof msg, "data file '%s': cannot read its header", path);
    goto done;
  }
  uint8_t want[DCP_FILE_HEADER];
  uint32_t hcrc;
  memcpy(&hcrc, h + 60, 4);
  uint64_t id;
  uint32_t rank;
  memcpy(&id, h + 16, 8);
  memcpy(&rank, h + 12, 4);
  if (memcmp(h, DCP_FILE_MAGIC, 8) != 0) {
    st = WEFT_ERR_CORRUPT;
    snprintf(msg, sizeof msg, "'%s' is not a weft checkpoint data file (bad magic)", path);
  } else if (hcrc != weft_crc32c(0, h, 60)) {
    st = WEFT_ERR_CORRUPT;
    snprintf(msg, sizeof msg, "data file '%s': header checksum mismatch (corrupt header)", path);
  } else if (id != ck->m.id || rank != (uint32_t)fm->rank) {
    st = WEFT_ERR_CORRUPT;
    snprintf(msg, sizeof msg,
             "data file '%s' belongs to another save (id %016" PRIx64
             " rank %u; the "
             "metadata says id %016" PRIx64 " rank %d)",
             path, id, rank, ck->m.id, fm->rank);
  } else {
    dcp_file_header(fm->rank, ck->m.id, ck->m.world_size, want);
    if (memcmp(h, want, 8 + 4) != 0) {
      st = WEFT_ERR_UNSUPPORTED;
      snprintf(msg, sizeof msg, "data file '%s': unknown data file version", path);
    } else if ((uint64_t)sb.st_size != fm->bytes) {
      /* every byte is accounted for: bytes appended to a file are
       * corruption too, not only bytes missing from it */
      st = WEFT_ERR_CORRUPT;
      snprintf(msg, sizeof msg,
               "data file '%s' is %lld bytes but the metadata says %" PRIu64 " (%s)", path,
               (long long)sb.st_size, fm->bytes,
               (uint64_t)sb.st_size < fm->bytes ? "truncated" : "bytes appended after the save");
    }
  }
  if (st != WEFT_OK) goto done;
  ck->fsize[f] = (uint64_t)sb.st_size;
  ck->fd[f] = fd;
  fd = -1;
done:
  if (fd >= 0) close(fd);
  free(path);
  if (st != WEFT_OK) {
    ck->ferr[f] = st;
    free(ck->ferrmsg[f]);
    ck->ferrmsg[f] = dcp_strdup(msg);
    return weft_error(st, "%s", msg);
  }
  return WEFT_OK;
}

weft_status dcp_ck_prepare_chunk(weft_dcp_checkpoint *ck, const dcp_tmeta *t, const dcp_chunk *c) {
  char bs[256];
  if (open_file(ck, c->file) != WEFT_OK) {
    char msg[1200];
    snprintf(msg, sizeof msg, "%s", dcp_last_msg());
    return weft_error(weft_last_status(), "tensor '%s': %s", t->name, msg);
  }
  const dcp_fmeta *fm = &ck->m.files[c->file];
  if (c->byte_off + c->length > ck->fsize[c->file]) {
    dcp_box_describe(&c->box, t->ndim, bs, sizeof bs);
    return weft_error(WEFT_ERR_CORRUPT,
                      "tensor '%s': chunk %s needs bytes [%" PRIu64 ", %" PRIu64
                      ") of data file '%s/%s', which has only %" PRIu64 " bytes (truncated)",
                      t->name, bs, c->byte_off, c->byte_off + c->length, ck->dir, fm->name,
                      ck->fsize[c->file]);
  }
  return WEFT_OK;
}

weft_status dcp_ck_prepare_region(weft_dcp_checkpoint *ck, const dcp_tmeta *t,
                                  const weft_box *region) {
  for (int64_t i = 0; i < t->nchunks; i++)
    if (weft_box_intersect(region, &t->chunks[i].box, t->ndim, NULL))
      WEFT_CHECK(dcp_ck_prepare_chunk(ck, t, &t->chunks[i]));
  return WEFT_OK;
}

static weft_status ensure_stage(weft_dcp_checkpoint *ck) {
  /* a short run (< 2 blocks) spans at most 3 blocks; 4 always fit */
  size_t want = STAGE_MIN > 4 * (size_t)ck->m.block ? STAGE_MIN : 4 * (size_t)ck->m.block;
  if (ck->stage_cap >= want) return WEFT_OK;
  free(ck->stage);
  ck->stage = malloc(want);
  ck->stage_cap = ck->stage ? want : 0;
  if (!ck->stage) return weft_error(WEFT_ERR_OOM, "read stage of %zu bytes", want);
  return WEFT_OK;
}

/* One chunk being read. */
typedef struct creader {
  weft_dcp_checkpoint *ck;
  const dcp_tmeta *t;
  const dcp_chunk *c;
  int fd;
  const char *fname;
  uint64_t B;
} creader;

static uint64_t blen(const creader *r, int64_t b) {
  uint64_t s = (uint64_t)b * r->B;
  return r->c->length - s < r->B ? r->c->length - s : r->B;
}

static weft_status bad_crc(const creader *r, int64_t b, uint32_t got) {
  char bs[256];
  dcp_box_describe(&r->c->box, r->t->ndim, bs, sizeof bs);
  return weft_error(WEFT_ERR_CORRUPT,
                    "tensor '%s': checksum mismatch in chunk %s of data file "
                    "'%s/%s', block %" PRId64 " (file bytes [%" PRIu64 ", +%" PRIu64
                    ")): stored "
                    "%08x, computed %08x (the file is corrupt)",
                    r->t->name, bs, r->ck->dir, r->fname, b, r->c->byte_off + (uint64_t)b * r->B,
                    blen(r, b), r->c->crc[b], got);
}

/* Reads blocks [b0, b1] into buf and verifies them. The read goes in
 * pieces of at most PIECE bytes, each checksummed (CRC32C chains) right
 * after its pread while it is still in the cache. */
static weft_status read_blocks(const creader *r, int64_t b0, int64_t b1, char *buf) {
  char what[64];
  snprintf(what, sizeof what, "tensor '%s'", r->t->name);
  for (int64_t b = b0; b <= b1; b++) {
    uint64_t bs = (uint64_t)(b - b0) * r->B, n = blen(r, b);
    uint32_t got = 0;
    for (uint64_t at = 0; at < n; at += PIECE) {
      uint64_t m = n - at < PIECE ? n - at : PIECE;
      weft_status st = dcp_pread_full(r->fd, buf + bs + at, m,
                                      r->c->byte_off + (uint64_t)b * r->B + at, r->fname, what);
      if (st != WEFT_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", dcp_last_msg());
        return weft_error(st, "tensor '%s': %s (in '%s')", r->t->name, msg, r->ck->dir);
      }
      got = weft_crc32c(got, buf + bs + at, m);
    }
    if (got != r->c->crc[b]) return bad_crc(r, b, got);
  }
  return WEFT_OK;
}

/* Bytes [src, src + n) of the chunk into contiguous dst: n >= 2 blocks, or
 * whole blocks (whole_blocks()). */
static weft_status read_large(const creader *r, uint64_t src, uint64_t n, char *dst) {
  const uint64_t B = r->B, e = src + n;
  int64_t b = (int64_t)(src / B);
  char *stage = r->ck->stage;
  if (src % B) {
    WEFT_CHECK(read_blocks(r, b, b, stage));
    uint64_t bs = (uint64_t)b * B, hi = bs + blen(r, b) < e ? bs + blen(r, b) : e;
    memcpy(dst, stage + (src - bs), hi - src);
    b++;
  }
  while ((uint64_t)b * B < e) {
    uint64_t bs = (uint64_t)b * B;
    if (bs + blen(r, b) <= e) {
      int64_t b1 = b;
      while ((uint64_t)(b1 + 1) * B < e && (uint64_t)(b1 + 1) * B + blen(r, b1 + 1) <= e &&
             (uint64_t)(b1 + 2 - b) * B <= DIRECT_GROUP)
        b1++;
      WEFT_CHECK(read_blocks(r, b, b1, dst + (bs - src)));
      b = b1 + 1;
    } else {
      WEFT_CHECK(read_blocks(r, b, b, stage));
      memcpy(dst + (bs - src), stage, e - bs);
      break;
    }
  }
  return WEFT_OK;
}

typedef struct prun {
  uint64_t src, n;
  char *dst;
} prun;

typedef struct window {
  int64_t w0, w1;
  int np;
  prun p[MAX_PENDING];
} window;

static weft_status flush(const creader *r, window *w) {
  if (!w->np) return WEFT_OK;
  WEFT_CHECK(read_blocks(r, w->w0, w->w1, r->ck->stage));
  uint64_t base = (uint64_t)w->w0 * r->B;
  for (int i = 0; i < w->np; i++)
    memcpy(w->p[i].dst, r->ck->stage + (w->p[i].src - base), w->p[i].n);
  w->np = 0;
  return WEFT_OK;
}

/* Whether bytes [src, src + n) of the chunk are whole blocks (the last may
 * be the chunk's short one): those are read straight into dst. */
static bool whole_blocks(const creader *r, uint64_t src, uint64_t n) {
  if (!n || src % r->B) return false;
  int64_t last = (int64_t)((src + n - 1) / r->B);
  return (uint64_t)last * r->B + blen(r, last) == src + n;
}

static weft_status add_run(const creader *r, window *w, uint64_t src, uint64_t n, char *dst) {
  const uint64_t B = r->B;
  if (n >= 2 * B || whole_blocks(r, src, n)) {
    WEFT_CHECK(flush(r, w));
    return read_large(r, src, n, dst);
  }
  int64_t b0 = (int64_t)(src / B), b1 = (int64_t)((src + n - 1) / B);
  if (w->np &&
      (b0 > w->w1 + 1 || (uint64_t)(b1 - w->w0 + 1) * B > r->ck->stage_cap || w->np == MAX_PENDING))
    WEFT_CHECK(flush(r, w));
  if (!w->np) {
    w->w0 = b0;
    w->w1 = b1;
  } else if (b1 > w->w1) {
    w->w1 = b1;
  }
  w->p[w->np].src = src;
  w->p[w->np].n = n;
  w->p[w->np].dst = dst;
  w->np++;
  return WEFT_OK;
}

weft_status dcp_ck_read_region(weft_dcp_checkpoint *ck, const dcp_tmeta *t, const weft_box *region,
                               char *dst, const int64_t *ds) {
  const int nd = t->ndim;
  const size_t esz = weft_dtype_size(t->dtype);
  if (weft_box_volume(region, nd) == 0) return WEFT_OK;
  WEFT_CHECK(ensure_stage(ck));
  window *w = malloc(sizeof *w);
  if (!w) return weft_error(WEFT_ERR_OOM, "read window");
  w->np = 0;
  weft_status st = WEFT_OK;
  for (int64_t ci = 0; ci < t->nchunks && st == WEFT_OK; ci++) {
    const dcp_chunk *c = &t->chunks[ci];
    weft_box in;
    if (!weft_box_intersect(region, &c->box, nd, &in)) continue;
    WEFT_CHECK_GOTO(dcp_ck_prepare_chunk(ck, t, c), st, done);
    creader r = {ck, t, c, ck->fd[c->file], ck->m.files[c->file].name, (uint64_t)ck->m.block};
    int64_t cs[WEFT_MAX_DIMS];
    dcp_contig_strides(c->box.size, nd, esz, cs);
    uint64_t src0 = 0;
    char *dst0 = dst;
    for (int d = 0; d < nd; d++) {
      src0 += (uint64_t)((in.off[d] - c->box.off[d]) * cs[d]);
      dst0 += (in.off[d] - region->off[d]) * ds[d];
    }
    /* merge trailing dims contiguous in both the chunk and dst */
    int k = nd;
    uint64_t run = esz;
    if (nd > 0 && ds[nd - 1] == (int64_t)esz) {
      run = (uint64_t)in.size[nd - 1] * esz;
      k = nd - 1;
      while (k > 0 && in.size[k] == c->box.size[k] && cs[k - 1] == (int64_t)run &&
             ds[k - 1] == (int64_t)run) {
        run *= (uint64_t)in.size[k - 1];
        k--;
      }
    }
    int64_t idx[WEFT_MAX_DIMS] = {0};
    for (;;) {
      uint64_t so = src0;
      char *dp = dst0;
      for (int d = 0; d < k; d++) {
        so += (uint64_t)(idx[d] * cs[d]);
        dp += idx[d] * ds[d];
      }
      WEFT_CHECK_GOTO(add_run(&r, w, so, run, dp), st, done);
      int d = k - 1;
      while (d >= 0 && ++idx[d] == in.size[d]) idx[d--] = 0;
      if (d < 0) break;
    }
    WEFT_CHECK_GOTO(flush(&r, w), st, done);
  }
done:
  free(w);
  return st;
}

/* ------------------------------------------------------------ public */

weft_status weft_dcp_get_info(const weft_dcp_checkpoint *ck, weft_dcp_info *out) {
  if (!ck || !out) return weft_error(WEFT_ERR_INVALID, "checkpoint or out is NULL");
  out->format_version = ck->m.version;
  out->id = ck->m.id;
  out->world_size = ck->m.world_size;
  out->block_bytes = ck->m.block;
  out->num_tensors = ck->m.nt;
  out->num_values = ck->m.nv;
  out->num_files = ck->m.nfiles;
  return WEFT_OK;
}

static void fill_tinfo(const dcp_tmeta *t, weft_dcp_tensor_info *out) {
  memset(out, 0, sizeof *out);
  out->name = t->name;
  out->dtype = t->dtype;
  out->ndim = t->ndim;
  memcpy(out->shape, t->shape, sizeof t->shape);
  out->layout = t->layout;
  out->num_chunks = t->nchunks;
}

weft_status weft_dcp_tensor_get(const weft_dcp_checkpoint *ck, int64_t i,
                                weft_dcp_tensor_info *out) {
  if (!ck || !out) return weft_error(WEFT_ERR_INVALID, "checkpoint or out is NULL");
  if (i < 0 || i >= ck->m.nt)
    return weft_error(WEFT_ERR_INVALID, "tensor index %" PRId64 " outside [0, %" PRId64 ")", i,
                      ck->m.nt);
  fill_tinfo(&ck->m.t[i], out);
  return WEFT_OK;
}

weft_status weft_dcp_tensor_find(const weft_dcp_checkpoint *ck, const char *name,
                                 weft_dcp_tensor_info *out) {
  if (!ck || !name || !out) return weft_error(WEFT_ERR_INVALID, "NULL argument");
  const dcp_tmeta *t = dcp_meta_find_tensor(&ck->m, name);
  if (!t)
    return weft_error(WEFT_ERR_NOT_FOUND, "checkpoint '%s' has no tensor '%s'", ck->dir, name);
  fill_tinfo(t, out);
  return WEFT_OK;
}

weft_status weft_dcp_chunk_get(const weft_dcp_checkpoint *ck, int64_t tensor, int64_t chunk,
                               weft_dcp_chunk_info *out) {
  if (!ck || !out) return weft_error(WEFT_ERR_INVALID, "checkpoint or out is NULL");
  if (tensor < 0 || tensor >= ck->m.nt)
    return weft_error(WEFT_ERR_INVALID, "tensor index %" PRId64 " out of range", tensor);
  const dcp_tmeta *t = &ck->m.t[tensor];
  if (chunk < 0 || chunk >= t->nchunks)
    return weft_error(WEFT_ERR_INVALID,
                      "tensor '%s': chunk index %" PRId64 " outside [0, %" PRId64 ")", t->name,
                      chunk, t->nchunks);
  const dcp_chunk *c = &t->chunks[chunk];
  memset(out, 0, sizeof *out);
  memcpy(out->offsets, c->box.off, sizeof c->box.off);
  memcpy(out->sizes, c->box.size, sizeof c->box.size);
  out->file = ck->m.files[c->file].name;
  out->rank = ck->m.files[c->file].rank;
  out->byte_offset = c->byte_off;
  out->length = c->length;
  out->num_blocks = c->ncrc;
  return WEFT_OK;
}

weft_status weft_dcp_value_get(const weft_dcp_checkpoint *ck, int64_t i, const char **name,
                               weft_sd_value_type *type, const char **json) {
  if (!ck) return weft_error(WEFT_ERR_INVALID, "checkpoint is NULL");
  if (i < 0 || i >= ck->m.nv)
    return weft_error(WEFT_ERR_INVALID, "value index %" PRId64 " outside [0, %" PRId64 ")", i,
                      ck->m.nv);
  if (name) *name = ck->m.v[i].name;
  if (type) *type = ck->m.v[i].type;
  if (json) *json = ck->m.v[i].json;
  return WEFT_OK;
}

weft_status weft_dcp_read(weft_dcp_checkpoint *ck, const char *name, const int64_t *start,
                          const int64_t *len, void *dst, size_t dst_bytes) {
  if (!ck || !name) return weft_error(WEFT_ERR_INVALID, "checkpoint or name is NULL");
  const dcp_tmeta *t = dcp_meta_find_tensor(&ck->m, name);
  if (!t)
    return weft_error(WEFT_ERR_NOT_FOUND, "checkpoint '%s' has no tensor '%s'", ck->dir, name);
  if (t->ndim > 0 && (!start || !len))
    return weft_error(WEFT_ERR_INVALID, "tensor '%s': start or len is NULL", name);
  weft_box region;
  for (int d = 0; d < t->ndim; d++) {
    if (start[d] < 0 || len[d] < 0 || start[d] > t->shape[d] - len[d])
      return weft_error(WEFT_ERR_INVALID,
                        "tensor '%s': box [%" PRId64 ", +%" PRId64
                        ") of dim %d lies "
                        "outside [0, %" PRId64 ")",
                        name, start[d], len[d], d, t->shape[d]);
    region.off[d] = start[d];
    region.size[d] = len[d];
  }
  const size_t esz = weft_dtype_size(t->dtype);
  uint64_t need = (uint64_t)weft_box_volume(&region, t->ndim) * esz;
  if (dst_bytes < need)
    return weft_error(WEFT_ERR_INVALID,
                      "tensor '%s': destination holds %zu bytes, the box %" PRIu64, name, dst_bytes,
                      need);
  if (need == 0) return WEFT_OK;
  if (!dst) return weft_error(WEFT_ERR_INVALID, "tensor '%s': dst is NULL", name);
  int64_t ds[WEFT_MAX_DIMS];
  dcp_contig_strides(region.size, t->ndim, esz, ds);
  WEFT_CHECK(dcp_ck_prepare_region(ck, t, &region));
  WEFT_CHECK(dcp_ck_read_region(ck, t, &region, dst, ds));
  return WEFT_OK;
}

weft_status weft_dcp_verify(weft_dcp_checkpoint *ck, int64_t *bad_blocks,
                            void (*report)(const char *msg, void *ctx), void *ctx) {
  if (!ck) return weft_error(WEFT_ERR_INVALID, "checkpoint is NULL");
  WEFT_CHECK(ensure_stage(ck));
  int64_t bad = 0;
  weft_status first = WEFT_OK;
  char first_msg[1500] = "";
#define NOTE(st_)                                                  \
  do {                                                             \
    bad++;                                                         \
    if (report) report(dcp_last_msg(), ctx);                       \
    if (first == WEFT_OK) {                                        \
      first = (st_);                                               \
      snprintf(first_msg, sizeof first_msg, "%s", dcp_last_msg()); \
    }                                                              \
  } while (0)
  for (int f = 0; f < ck->m.nfiles; f++) {
    weft_status st = open_file(ck, f);
    if (st != WEFT_OK) NOTE(st);
  }
  for (int64_t i = 0; i < ck->m.nt; i++) {
    const dcp_tmeta *t = &ck->m.t[i];
    for (int64_t ci = 0; ci < t->nchunks; ci++) {
      const dcp_chunk *c = &t->chunks[ci];
      if (ck->ferr[c->file]) continue; /* counted once above */
      weft_status st = dcp_ck_prepare_chunk(ck, t, c);
      if (st != WEFT_OK) {
        NOTE(st);
        continue;
      }
      creader r = {ck, t, c, ck->fd[c->file], ck->m.files[c->file].name, (uint64_t)ck->m.block};
      int64_t per = (int64_t)(ck->stage_cap / r.B);
      for (int64_t b = 0; b < c->ncrc; b += per) {
        int64_t b1 = b + per - 1 < c->ncrc - 1 ? b + per - 1 : c->ncrc - 1;
        /* verify block by block so that every bad block is counted */
        uint64_t s = (uint64_t)b * r.B, e = (uint64_t)b1 * r.B + blen(&r, b1);
        st = dcp_pread_full(r.fd, ck->stage, e - s, c->byte_off + s, r.fname, t->name);
        if (st != WEFT_OK) {
          NOTE(st);
          break;
        }
        for (int64_t k = b; k <= b1; k++) {
          uint32_t got = weft_crc32c(0, ck->stage + (uint64_t)(k - b) * r.B, blen(&r, k));
          if (got != c->crc[k]) {
            st = bad_crc(&r, k, got);
            NOTE(st);
          }
        }
      }
    }
  }
#undef NOTE
  if (bad_blocks) *bad_blocks = bad;
  if (first != WEFT_OK) {
    if (bad > 1)
      return weft_error(first, "%s (and %" PRId64 " more problem%s)", first_msg, bad - 1,
                        bad > 2 ? "s" : "");
    return weft_error(first, "%s", first_msg);
  }
  return WEFT_OK;
}
