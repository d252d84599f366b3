/* dcp/util.c — box messages and tiling checks (the geometry itself is
 * dtensor's weft_box_* and weft_dtensor_local_boxes), byte strides, byte
 * buffers for the blobs ranks exchange, file helpers and fault injection. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend.h"
#include "dcp_internal.h"

/* ------------------------------------------------------------ boxes */

void dcp_box_describe(const weft_box *b, int ndim, char *buf, size_t cap) {
  size_t at = 0;
  if (!cap) return;
  buf[0] = '\0';
  at += (size_t)snprintf(buf + at, cap - at, "[");
  for (int d = 0; d < ndim && at < cap; d++)
    at += (size_t)snprintf(buf + at, cap - at, "%s%" PRId64 ":%" PRId64, d ? ", " : "", b->off[d],
                           b->off[d] + b->size[d]);
  if (at < cap) snprintf(buf + at, cap - at, "]");
}

static int cmp_off0(const void *a, const void *b, void *ctx) {
  const weft_box *const *bx = ctx;
  int64_t x = bx[*(const int64_t *)a]->off[0], y = bx[*(const int64_t *)b]->off[0];
  if (x != y) return x < y ? -1 : 1;
  return *(const int64_t *)a < *(const int64_t *)b ? -1 : 1;
}

static const char *label(const char *(*owner)(int64_t, void *), void *ctx, int64_t i, char *buf,
                         size_t cap) {
  if (owner)
    snprintf(buf, cap, "%s", owner(i, ctx));
  else
    snprintf(buf, cap, "chunk %" PRId64, i);
  return buf;
}

weft_status dcp_check_tiling(const char *where, const char *tensor, int ndim, const int64_t *shape,
                             const weft_box *const *boxes, int64_t n,
                             const char *(*owner)(int64_t i, void *ctx), void *ctx) {
  char bs[256], bs2[256], la[96], lb[96];
  int64_t numel = 1;
  for (int d = 0; d < ndim; d++) numel *= shape[d];
  for (int64_t i = 0; i < n; i++) {
    const weft_box *b = boxes[i];
    for (int d = 0; d < ndim; d++)
      if (b->size[d] <= 0 || b->off[d] < 0 || b->off[d] > shape[d] - b->size[d]) {
        dcp_box_describe(b, ndim, bs, sizeof bs);
        return weft_error(WEFT_ERR_CORRUPT,
                          "%s: tensor '%s': %s %s %s the tensor's shape (dim %d "
                          "has size %" PRId64 ")",
                          where, tensor, label(owner, ctx, i, la, sizeof la), bs,
                          b->size[d] <= 0 ? "is empty in" : "lies outside", d, shape[d]);
      }
  }
  if (ndim == 0) {
    if (n > 1) {
      return weft_error(WEFT_ERR_CORRUPT, "%s: tensor '%s' (a scalar): %s overlaps %s", where,
                        tensor, label(owner, ctx, 1, lb, sizeof lb),
                        label(owner, ctx, 0, la, sizeof la));
    }
  } else if (n > 1) {
    int64_t *ord = malloc((size_t)n * sizeof *ord);
    if (!ord) return weft_error(WEFT_ERR_OOM, "tiling check of %" PRId64 " chunks", n);
    for (int64_t i = 0; i < n; i++) ord[i] = i;
    qsort_r(ord, (size_t)n, sizeof *ord, cmp_off0, (void *)boxes);
    for (int64_t i = 0; i < n; i++) {
      const weft_box *a = boxes[ord[i]];
      for (int64_t j = i + 1; j < n; j++) {
        const weft_box *b = boxes[ord[j]];
        if (b->off[0] >= a->off[0] + a->size[0]) break;
        if (weft_box_intersect(a, b, ndim, NULL)) {
          dcp_box_describe(a, ndim, bs, sizeof bs);
          dcp_box_describe(b, ndim, bs2, sizeof bs2);
          weft_status st = weft_error(WEFT_ERR_CORRUPT, "%s: tensor '%s': %s %s overlaps %s %s",
                                      where, tensor, label(owner, ctx, ord[j], lb, sizeof lb), bs2,
                                      label(owner, ctx, ord[i], la, sizeof la), bs);
          free(ord);
          return st;
        }
      }
    }
    free(ord);
  }
  int64_t sum = 0;
  for (int64_t i = 0; i < n; i++) sum += weft_box_volume(boxes[i], ndim);
  if (sum != numel)
    return weft_error(WEFT_ERR_CORRUPT,
                      "%s: tensor '%s': its chunks cover %" PRId64 " of its %" PRId64
                      " elements (a hole: some part of the tensor was never saved)",
                      where, tensor, sum, numel);
  return WEFT_OK;
}

void dcp_byte_strides(const weft_tensor *t, int64_t *out) {
  size_t esz = weft_dtype_size(t->dtype);
  for (int d = 0; d < t->ndim; d++) out[d] = t->strides[d] * (int64_t)esz;
}

weft_status dcp_host_of(const weft_tensor *t, const weft_tensor **host, weft_tensor **owned) {
  *owned = NULL;
  *host = t;
  if (t->device == WEFT_CPU) return WEFT_OK;
  WEFT_CHECK(weft_tensor_to(t, WEFT_CPU, owned));
  *host = *owned;
  return WEFT_OK;
}

weft_status dcp_full_on_host(const weft_dtensor *dt, weft_tensor **out) {
  weft_tensor *full;
  WEFT_CHECK(weft_dtensor_full_tensor(dt, &full));
  if (full->device == WEFT_CPU) {
    *out = full;
    return WEFT_OK;
  }
  weft_status st = weft_tensor_to(full, WEFT_CPU, out);
  weft_tensor_destroy(full);
  return st;
}

/* The one pinned block kept between saves and loads (on g_pinned_dev). */
static char *g_pinned;
static size_t g_pinned_cap;
static weft_device g_pinned_dev;

weft_status dcp_pinned_take(weft_device dev, size_t bytes, char **p, size_t *cap) {
  if (g_pinned && g_pinned_cap >= bytes && g_pinned_dev == dev) {
    *p = g_pinned;
    *cap = g_pinned_cap;
    g_pinned = NULL;
    g_pinned_cap = 0;
    return WEFT_OK;
  }
  WEFT_CHECK(weft_alloc_pinned(dev, bytes ? bytes : 1, (void **)p));
  *cap = bytes;
  return WEFT_OK;
}

void dcp_pinned_give(weft_device dev, char *p, size_t cap) {
  if (!p) return;
  if (g_pinned && g_pinned_cap >= cap) {
    weft_free_pinned(dev, p);
    return;
  }
  weft_free_pinned(g_pinned_dev, g_pinned);
  g_pinned = p;
  g_pinned_cap = cap;
  g_pinned_dev = dev;
}

void dcp_pinned_release(void) {
  weft_free_pinned(g_pinned_dev, g_pinned);
  g_pinned = NULL;
  g_pinned_cap = 0;
}

/* The pinned block of the staging open now (one at a time: a nested one
 * gets plain memory). */
static char *g_open;
static size_t g_open_cap;
static weft_device g_open_dev;

weft_status dcp_stage_begin(weft_tensor *dst, weft_tensor **host) {
  *host = dst;
  if (dst->device == WEFT_CPU) return WEFT_OK;
  *host = NULL;
  size_t bytes = weft_tensor_nbytes(dst);
  if (g_open || bytes == 0)
    return weft_tensor_create(dst->dtype, WEFT_CPU, dst->ndim, dst->shape, host);
  WEFT_CHECK(dcp_pinned_take(dst->device, bytes, &g_open, &g_open_cap));
  g_open_dev = dst->device;
  weft_status st = weft_tensor_wrap(g_open, dst->dtype, WEFT_CPU, dst->ndim, dst->shape, host);
  if (st) {
    dcp_pinned_give(g_open_dev, g_open, g_open_cap);
    g_open = NULL;
  }
  return st;
}

weft_status dcp_stage_end(weft_tensor *dst, weft_tensor *host, weft_status st) {
  if (host == dst || !host) return st;
  /* a blocking copy: the pinned block is free again when it returns */
  if (st == WEFT_OK) st = weft_tensor_copy(dst, host);
  if (g_open && host->data == g_open) {
    dcp_pinned_give(g_open_dev, g_open, g_open_cap);
    g_open = NULL;
  }
  weft_tensor_destroy(host);
  return st;
}

void dcp_contig_strides(const int64_t *shape, int ndim, size_t esz, int64_t *out) {
  int64_t s = (int64_t)esz;
  for (int d = ndim - 1; d >= 0; d--) {
    out[d] = s;
    s *= shape[d];
  }
}

/* ------------------------------------------------------------ buffers */

void dcp_buf_put(dcp_buf *b, const void *data, size_t n) {
  if (b->oom) return;
  if (b->len + n > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + n) cap *= 2;
    char *q = realloc(b->p, cap);
    if (!q) {
      b->oom = true;
      return;
    }
    b->p = q;
    b->cap = cap;
  }
  if (n) memcpy(b->p + b->len, data, n);
  b->len += n;
}
void dcp_buf_u32(dcp_buf *b, uint32_t v) { dcp_buf_put(b, &v, 4); }
void dcp_buf_u64(dcp_buf *b, uint64_t v) { dcp_buf_put(b, &v, 8); }
void dcp_buf_str(dcp_buf *b, const char *s) {
  size_t n = s ? strlen(s) : 0;
  dcp_buf_u32(b, (uint32_t)n);
  dcp_buf_put(b, s, n);
}

void dcp_rd_get(dcp_rd *r, void *out, size_t n) {
  if (r->bad || r->len - r->at < n) {
    r->bad = true;
    memset(out, 0, n);
    return;
  }
  memcpy(out, r->p + r->at, n);
  r->at += n;
}
uint32_t dcp_rd_u32(dcp_rd *r) {
  uint32_t v;
  dcp_rd_get(r, &v, 4);
  return v;
}
uint64_t dcp_rd_u64(dcp_rd *r) {
  uint64_t v;
  dcp_rd_get(r, &v, 8);
  return v;
}
const char *dcp_rd_bytes(dcp_rd *r, size_t n) {
  if (r->bad || r->len - r->at < n) {
    r->bad = true;
    return NULL;
  }
  const char *p = r->p + r->at;
  r->at += n;
  return p;
}
char *dcp_rd_str(dcp_rd *r) {
  uint32_t n = dcp_rd_u32(r);
  const char *p = dcp_rd_bytes(r, n);
  if (!p) return NULL;
  char *s = malloc((size_t)n + 1);
  if (!s) {
    r->bad = true;
    return NULL;
  }
  memcpy(s, p, n);
  s[n] = '\0';
  return s;
}

/* ------------------------------------------------------------ files */

char *dcp_strdup(const char *s) {
  if (!s) return NULL;
  size_t n = strlen(s) + 1;
  char *p = malloc(n);
  if (p) memcpy(p, s, n);
  return p;
}

char *dcp_path_join(const char *dir, const char *name) {
  size_t a = strlen(dir), b = strlen(name);
  char *p = malloc(a + b + 2);
  if (!p) return NULL;
  memcpy(p, dir, a);
  size_t at = a;
  if (a && dir[a - 1] != '/') p[at++] = '/';
  memcpy(p + at, name, b + 1);
  return p;
}

weft_status dcp_write_full(int fd, const void *buf, size_t n, uint64_t off, const char *path) {
  const char *p = buf;
  while (n > 0) {
    size_t piece = n > ((size_t)1 << 30) ? ((size_t)1 << 30) : n;
    ssize_t w = pwrite(fd, p, piece, (off_t)off);
    if (w < 0) {
      if (errno == EINTR) continue;
      return weft_error(WEFT_ERR_IO, "%s: write of %zu bytes at %" PRIu64 ": %s", path, piece, off,
                        strerror(errno));
    }
    p += w;
    n -= (size_t)w;
    off += (uint64_t)w;
  }
  return WEFT_OK;
}

weft_status dcp_pread_full(int fd, void *buf, size_t n, uint64_t off, const char *path,
                           const char *what) {
  char *p = buf;
  while (n > 0) {
    size_t piece = n > ((size_t)1 << 30) ? ((size_t)1 << 30) : n;
    ssize_t r = pread(fd, p, piece, (off_t)off);
    if (r < 0) {
      if (errno == EINTR) continue;
      return weft_error(WEFT_ERR_IO, "%s: reading %s at byte %" PRIu64 ": %s", path, what, off,
                        strerror(errno));
    }
    if (r == 0)
      return weft_error(WEFT_ERR_CORRUPT,
                        "%s: file ends at byte %" PRIu64
                        " while reading %s "
                        "(truncated)",
                        path, off, what);
    p += r;
    n -= (size_t)r;
    off += (uint64_t)r;
  }
  return WEFT_OK;
}

weft_status dcp_fsync_dir(const char *dir) {
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    return weft_error(WEFT_ERR_IO, "cannot open directory '%s': %s", dir, strerror(errno));
  int rc = fsync(fd);
  int e = errno;
  close(fd);
  if (rc != 0 && e != EINVAL) /* some file systems cannot fsync directories */
    return weft_error(WEFT_ERR_IO, "fsync of directory '%s': %s", dir, strerror(e));
  return WEFT_OK;
}

weft_status dcp_mkdirs(const char *dir) {
  char *p = dcp_strdup(dir);
  if (!p) return weft_error(WEFT_ERR_OOM, "path");
  size_t n = strlen(p);
  for (size_t i = 1; i <= n; i++) {
    if (p[i] != '/' && p[i] != '\0') continue;
    char c = p[i];
    p[i] = '\0';
    if (mkdir(p, 0755) != 0 && errno != EEXIST) {
      weft_status st =
          weft_error(WEFT_ERR_IO, "cannot create directory '%s': %s", p, strerror(errno));
      free(p);
      return st;
    }
    p[i] = c;
  }
  struct stat sb;
  weft_status st = WEFT_OK;
  if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
    st = weft_error(WEFT_ERR_IO, "'%s' exists and is not a directory", dir);
  free(p);
  return st;
}

/* ------------------------------------------------------------ messages */

const char *dcp_last_msg(void) {
  static _Thread_local char buf[2048];
  const char *m = weft_last_error();
  if (m[0] == '[') {
    const char *e = strstr(m, "] ");
    if (e) m = e + 2;
  }
  const char *p = m;
  while ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
         *p == '_')
    p++;
  if (p > m && p[0] == ':' && p[1] == ' ') m = p + 2;
  size_t n = strcspn(m, "\n");
  if (n >= sizeof buf) n = sizeof buf - 1;
  memmove(buf, m, n);
  buf[n] = '\0';
  return buf;
}

/* ------------------------------------------------------------ faults */

/* WEFT_DCP_FAULT=<rank>:<stage> (the process exits there) or
 * <rank>:<stage>:enospc (the I/O there fails with ENOSPC, every save). */
static int fault_rank = -1, fault_errno = 0;
static char fault_stage[32];

static void fault_parse(void) {
  static int parsed = 0;
  if (parsed) return;
  parsed = 1;
  const char *e = getenv("WEFT_DCP_FAULT");
  if (!e || !*e) return;
  char *end;
  long r = strtol(e, &end, 10);
  if (end == e || *end != ':' || r < 0) return;
  fault_rank = (int)r;
  snprintf(fault_stage, sizeof fault_stage, "%s", end + 1);
  char *mode = strchr(fault_stage, ':');
  if (mode) {
    *mode = '\0';
    if (!strcmp(mode + 1, "enospc")) fault_errno = ENOSPC;
  }
}

void dcp_fault_point(int rank, const char *stage) {
  fault_parse();
  if (fault_rank == rank && !fault_errno && strcmp(fault_stage, stage) == 0) {
    fprintf(stderr, "[rank %d] WEFT_DCP_FAULT: exiting at stage '%s'\n", rank, stage);
    fflush(stderr);
    _exit(DCP_FAULT_EXIT);
  }
}

int dcp_fault_errno(int rank, const char *stage) {
  fault_parse();
  return fault_rank == rank && strcmp(fault_stage, stage) == 0 ? fault_errno : 0;
}
