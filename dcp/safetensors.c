/* safetensors reader and writer. The format is a table at the top of
 * safetensors.h; validation follows the reference implementation's rules
 * (huggingface/safetensors, safetensors/src/tensor.rs: Metadata::validate),
 * except that gaps between tensors are accepted on read. */
#include "safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c assumes a little-endian host (the format is little-endian)"
#endif

/* The reference implementation refuses headers above 100 MB. */
#define ST_MAX_HEADER (100u * 1000u * 1000u)
/* Staging buffer for dtype conversion and merged reads. */
#define ST_STAGE ((size_t)4 << 20)
/* JSON numbers are doubles in cJSON: integers are exact up to 2^53. */
#define ST_MAX_INT 9007199254740992.0

typedef struct st_tensor {
  char *name;
  weft_dtype dtype;
  int ndim;
  int64_t shape[WEFT_MAX_DIMS];
  int64_t numel;
  uint64_t begin, end; /* relative to the data buffer */
} st_tensor;

struct weft_safetensors {
  int fd;
  char *path;
  uint64_t data_start; /* 8 + header length */
  uint64_t data_len;
  st_tensor *t; /* sorted by name */
  int64_t n;
  char **meta_keys, **meta_vals;
  int64_t nmeta;
};

static const struct {
  const char *name;
  weft_dtype dtype;
} st_dtypes[] = {
    {"F32", WEFT_F32}, {"F64", WEFT_F64}, {"BF16", WEFT_BF16}, {"F16", WEFT_F16},
    {"I32", WEFT_I32}, {"I64", WEFT_I64}, {"U8", WEFT_U8},
};

static const char *st_dtype_name(weft_dtype dt) {
  for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++)
    if (st_dtypes[i].dtype == dt) return st_dtypes[i].name;
  return NULL;
}

static char *st_strdup(const char *s) {
  size_t n = strlen(s) + 1;
  char *p = malloc(n);
  if (p) memcpy(p, s, n);
  return p;
}

/* ---------------------------------------------------------------- reading */

static weft_status pread_full(const weft_safetensors *f, void *buf, size_t len, uint64_t off,
                              const char *what) {
  char *p = buf;
  while (len > 0) {
    ssize_t r = pread(f->fd, p, len, (off_t)off);
    if (r < 0) {
      if (errno == EINTR) continue;
      return weft_error(WEFT_ERR_IO, "%s: reading %s at byte %" PRIu64 ": %s", f->path, what, off,
                        strerror(errno));
    }
    if (r == 0)
      return weft_error(WEFT_ERR_IO,
                        "%s: unexpected end of file reading %s at byte %" PRIu64
                        " (file changed since open?)",
                        f->path, what, off);
    p += r;
    len -= (size_t)r;
    off += (uint64_t)r;
  }
  return WEFT_OK;
}

/* A JSON number that is a non-negative integer (exact in a double). */
static bool json_uint(const cJSON *it, uint64_t *out) {
  if (!cJSON_IsNumber(it)) return false;
  double d = it->valuedouble;
  if (!(d >= 0.0) || d > ST_MAX_INT || d != (double)(uint64_t)d) return false;
  *out = (uint64_t)d;
  return true;
}

#define CORRUPT(...) weft_error(WEFT_ERR_CORRUPT, __VA_ARGS__)

static weft_status parse_tensor(const char *path, const cJSON *obj, uint64_t data_len,
                                st_tensor *t) {
  const char *name = obj->string;
  if (!cJSON_IsObject(obj))
    return CORRUPT("%s: tensor '%s': header entry is not a JSON object", path, name);
  const cJSON *dt = cJSON_GetObjectItemCaseSensitive(obj, "dtype");
  const cJSON *sh = cJSON_GetObjectItemCaseSensitive(obj, "shape");
  const cJSON *offs = cJSON_GetObjectItemCaseSensitive(obj, "data_offsets");
  if (!cJSON_IsString(dt))
    return CORRUPT("%s: tensor '%s': missing or non-string \"dtype\"", path, name);
  bool known = false;
  for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++)
    if (strcmp(dt->valuestring, st_dtypes[i].name) == 0) {
      t->dtype = st_dtypes[i].dtype;
      known = true;
    }
  if (!known)
    return CORRUPT(
        "%s: tensor '%s': unknown or unsupported dtype \"%s\" (F32, F64, BF16, F16, "
        "I32, I64, U8 are read)",
        path, name, dt->valuestring);
  if (!cJSON_IsArray(sh))
    return CORRUPT("%s: tensor '%s': missing or non-array \"shape\"", path, name);
  int nd = cJSON_GetArraySize(sh);
  if (nd > WEFT_MAX_DIMS)
    return weft_error(WEFT_ERR_UNSUPPORTED, "%s: tensor '%s': %d dims (weft handles up to %d)",
                      path, name, nd, WEFT_MAX_DIMS);
  t->ndim = nd;
  int64_t numel = 1;
  bool overflow = false;
  for (int d = 0; d < nd; d++) {
    uint64_t s;
    if (!json_uint(cJSON_GetArrayItem(sh, d), &s))
      return CORRUPT("%s: tensor '%s': shape[%d] is not a non-negative integer", path, name, d);
    t->shape[d] = (int64_t)s;
    if (s != 0 && numel > INT64_MAX / (int64_t)s)
      overflow = true;
    else
      numel *= (int64_t)s;
  }
  for (int d = 0; d < nd; d++)
    if (t->shape[d] == 0) {
      numel = 0;
      overflow = false;
    }
  if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2)
    return CORRUPT("%s: tensor '%s': \"data_offsets\" is not an array of two integers", path, name);
  uint64_t b, e;
  if (!json_uint(cJSON_GetArrayItem(offs, 0), &b) || !json_uint(cJSON_GetArrayItem(offs, 1), &e))
    return CORRUPT("%s: tensor '%s': \"data_offsets\" are not non-negative integers", path, name);
  if (e < b)
    return CORRUPT("%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] end before they begin",
                   path, name, b, e);
  if (e > data_len)
    return CORRUPT("%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
                   "] run past the data "
                   "buffer (%" PRIu64 " bytes)",
                   path, name, b, e, data_len);
  size_t esz = weft_dtype_size(t->dtype);
  if (overflow || (uint64_t)numel > (e - b) / esz + 1 || (uint64_t)numel * esz != e - b)
    return CORRUPT("%s: tensor '%s': shape and dtype %s give %s%" PRIu64
                   " bytes but data_offsets "
                   "[%" PRIu64 ", %" PRIu64 "] hold %" PRIu64,
                   path, name, dt->valuestring, overflow ? "more than " : "",
                   overflow ? (uint64_t)INT64_MAX : (uint64_t)numel * esz, b, e, e - b);
  t->numel = numel;
  t->begin = b;
  t->end = e;
  return WEFT_OK;
}

static int cmp_name(const void *a, const void *b) {
  return strcmp(((const st_tensor *)a)->name, ((const st_tensor *)b)->name);
}
static int cmp_begin(const void *a, const void *b) {
  const st_tensor *x = *(const st_tensor *const *)a, *y = *(const st_tensor *const *)b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  return x->end < y->end ? -1 : x->end > y->end;
}

weft_status weft_safetensors_open(const char *path, weft_safetensors **out) {
  if (!path || !out) return weft_error(WEFT_ERR_INVALID, "path or out is NULL");
  *out = NULL;
  weft_status st = WEFT_OK;
  char *hdr = NULL;
  cJSON *root = NULL;
  st_tensor **order = NULL;
  weft_safetensors *f = calloc(1, sizeof *f);
  if (!f) return weft_error(WEFT_ERR_OOM, "safetensors reader");
  f->fd = -1;
  f->path = st_strdup(path);
  if (!f->path) {
    st = weft_error(WEFT_ERR_OOM, "path");
    goto fail;
  }
  f->fd = open(path, O_RDONLY | O_CLOEXEC);
  if (f->fd < 0) {
    st = weft_error(WEFT_ERR_IO, "cannot open '%s': %s", path, strerror(errno));
    goto fail;
  }
  struct stat sb;
  if (fstat(f->fd, &sb) != 0) {
    st = weft_error(WEFT_ERR_IO, "%s: fstat: %s", path, strerror(errno));
    goto fail;
  }
  uint64_t size = (uint64_t)sb.st_size;
  if (size < 8) {
    st =
        CORRUPT("%s: file is %" PRIu64 " bytes, shorter than the 8-byte header length", path, size);
    goto fail;
  }
  uint8_t lenb[8];
  WEFT_CHECK_GOTO(pread_full(f, lenb, 8, 0, "the header length"), st, fail);
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | lenb[i];
  if (hlen > size - 8) {
    st = CORRUPT("%s: header length %" PRIu64 " runs past the end of the file (%" PRIu64 " bytes)",
                 path, hlen, size);
    goto fail;
  }
  if (hlen > ST_MAX_HEADER) {
    st = CORRUPT("%s: header length %" PRIu64 " exceeds the format's limit of %u bytes", path, hlen,
                 ST_MAX_HEADER);
    goto fail;
  }
  f->data_start = 8 + hlen;
  f->data_len = size - 8 - hlen;
  hdr = malloc(hlen + 1);
  if (!hdr) {
    st = weft_error(WEFT_ERR_OOM, "%s: header of %" PRIu64 " bytes", path, hlen);
    goto fail;
  }
  WEFT_CHECK_GOTO(pread_full(f, hdr, hlen, 8, "the header"), st, fail);
  hdr[hlen] = '\0';
  if (hlen == 0 || hdr[0] != '{' || memchr(hdr, '\0', hlen)) {
    st = CORRUPT("%s: header is not a JSON object (must start with '{', no NUL bytes)", path);
    goto fail;
  }
  const char *end = NULL;
  root = cJSON_ParseWithLengthOpts(hdr, hlen, &end, false);
  if (!root || !cJSON_IsObject(root)) {
    st = CORRUPT("%s: header is not valid JSON (error near header byte %td)", path,
                 end ? end - hdr : (ptrdiff_t)-1);
    goto fail;
  }
  for (const char *p = end; p < hdr + hlen; p++)
    if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
      st = CORRUPT("%s: header has trailing bytes after the JSON object (at byte %td)", path,
                   p - hdr);
      goto fail;
    }
  /* count entries */
  int64_t nt = 0, nm = 0;
  const cJSON *meta = NULL;
  for (const cJSON *c = root->child; c; c = c->next) {
    if (strcmp(c->string, "__metadata__") == 0) {
      if (meta) {
        st = CORRUPT("%s: duplicate \"__metadata__\"", path);
        goto fail;
      }
      meta = c;
      if (!cJSON_IsObject(c)) {
        st = CORRUPT("%s: \"__metadata__\" is not an object", path);
        goto fail;
      }
      for (const cJSON *m = c->child; m; m = m->next) {
        if (!cJSON_IsString(m)) {
          st = CORRUPT("%s: __metadata__ value of '%s' is not a string", path, m->string);
          goto fail;
        }
        nm++;
      }
    } else {
      nt++;
    }
  }
  f->t = calloc((size_t)(nt ? nt : 1), sizeof *f->t);
  f->meta_keys = calloc((size_t)(nm ? nm : 1), sizeof(char *));
  f->meta_vals = calloc((size_t)(nm ? nm : 1), sizeof(char *));
  if (!f->t || !f->meta_keys || !f->meta_vals) {
    st = weft_error(WEFT_ERR_OOM, "%s: header tables", path);
    goto fail;
  }
  for (const cJSON *c = root->child; c; c = c->next) {
    if (c == meta) continue;
    st_tensor *t = &f->t[f->n];
    WEFT_CHECK_GOTO(parse_tensor(path, c, f->data_len, t), st, fail);
    t->name = st_strdup(c->string);
    if (!t->name) {
      st = weft_error(WEFT_ERR_OOM, "name");
      goto fail;
    }
    f->n++;
  }
  if (meta)
    for (const cJSON *m = meta->child; m; m = m->next) {
      f->meta_keys[f->nmeta] = st_strdup(m->string);
      f->meta_vals[f->nmeta] = st_strdup(m->valuestring);
      f->nmeta++;
      if (!f->meta_keys[f->nmeta - 1] || !f->meta_vals[f->nmeta - 1]) {
        st = weft_error(WEFT_ERR_OOM, "metadata");
        goto fail;
      }
    }
  qsort(f->t, (size_t)f->n, sizeof *f->t, cmp_name);
  for (int64_t i = 1; i < f->n; i++)
    if (strcmp(f->t[i - 1].name, f->t[i].name) == 0) {
      st = CORRUPT("%s: tensor '%s' appears twice in the header", path, f->t[i].name);
      goto fail;
    }
  /* no two non-empty tensors may share a byte */
  order = malloc((size_t)(f->n ? f->n : 1) * sizeof *order);
  if (!order) {
    st = weft_error(WEFT_ERR_OOM, "order");
    goto fail;
  }
  int64_t ne = 0;
  for (int64_t i = 0; i < f->n; i++)
    if (f->t[i].end > f->t[i].begin) order[ne++] = &f->t[i];
  qsort(order, (size_t)ne, sizeof *order, cmp_begin);
  for (int64_t i = 1; i < ne; i++)
    if (order[i]->begin < order[i - 1]->end) {
      st = CORRUPT("%s: tensor '%s' (bytes [%" PRIu64 ", %" PRIu64
                   ")) overlaps tensor '%s' (bytes [%" PRIu64 ", %" PRIu64 "))",
                   path, order[i]->name, order[i]->begin, order[i]->end, order[i - 1]->name,
                   order[i - 1]->begin, order[i - 1]->end);
      goto fail;
    }
  free(order);
  cJSON_Delete(root);
  free(hdr);
  *out = f;
  return WEFT_OK;
fail:
  free(order);
  cJSON_Delete(root);
  free(hdr);
  weft_safetensors_close(f);
  return st;
}

void weft_safetensors_close(weft_safetensors *f) {
  if (!f) return;
  if (f->fd >= 0) close(f->fd);
  for (int64_t i = 0; f->t && i < f->n; i++) free(f->t[i].name);
  free(f->t);
  for (int64_t i = 0; i < f->nmeta; i++) {
    free(f->meta_keys[i]);
    free(f->meta_vals[i]);
  }
  free(f->meta_keys);
  free(f->meta_vals);
  free(f->path);
  free(f);
}

int64_t weft_safetensors_count(const weft_safetensors *f) { return f ? f->n : 0; }

static void fill_info(const weft_safetensors *f, const st_tensor *t, weft_safetensors_info *out) {
  memset(out, 0, sizeof *out);
  out->name = t->name;
  out->dtype = t->dtype;
  out->ndim = t->ndim;
  memcpy(out->shape, t->shape, sizeof t->shape);
  out->numel = t->numel;
  out->offset = f->data_start + t->begin;
  out->nbytes = t->end - t->begin;
}

weft_status weft_safetensors_get(const weft_safetensors *f, int64_t i, weft_safetensors_info *out) {
  if (!f || !out) return weft_error(WEFT_ERR_INVALID, "reader or out is NULL");
  if (i < 0 || i >= f->n)
    return weft_error(WEFT_ERR_INVALID, "%s: tensor index %lld out of range [0, %lld)", f->path,
                      (long long)i, (long long)f->n);
  fill_info(f, &f->t[i], out);
  return WEFT_OK;
}

static const st_tensor *lookup(const weft_safetensors *f, const char *name) {
  st_tensor key;
  key.name = (char *)name;
  return f->n ? bsearch(&key, f->t, (size_t)f->n, sizeof *f->t, cmp_name) : NULL;
}

weft_status weft_safetensors_find(const weft_safetensors *f, const char *name,
                                  weft_safetensors_info *out) {
  if (!f || !name || !out) return weft_error(WEFT_ERR_INVALID, "reader, name or out is NULL");
  const st_tensor *t = lookup(f, name);
  if (!t) return weft_error(WEFT_ERR_NOT_FOUND, "%s: no tensor '%s'", f->path, name);
  fill_info(f, t, out);
  return WEFT_OK;
}

const char *weft_safetensors_metadata(const weft_safetensors *f, const char *key) {
  if (!f || !key) return NULL;
  for (int64_t i = 0; i < f->nmeta; i++)
    if (strcmp(f->meta_keys[i], key) == 0) return f->meta_vals[i];
  return NULL;
}

/* Element conversion between float dtypes (through double; bf16/f16 widen
 * exactly to f32 and narrow with round-to-nearest-even). */
static inline double load_f(const void *src, weft_dtype dt, int64_t i) {
  switch (dt) {
    case WEFT_F32:
      return ((const float *)src)[i];
    case WEFT_F64:
      return ((const double *)src)[i];
    case WEFT_BF16:
      return weft_bf16_to_f32(((const uint16_t *)src)[i]);
    case WEFT_F16:
      return weft_f16_to_f32(((const uint16_t *)src)[i]);
    default:
      return 0.0;
  }
}
static inline void store_f(void *dst, weft_dtype dt, int64_t i, double x) {
  switch (dt) {
    case WEFT_F32:
      ((float *)dst)[i] = (float)x;
      break;
    case WEFT_F64:
      ((double *)dst)[i] = x;
      break;
    case WEFT_BF16:
      ((uint16_t *)dst)[i] = weft_f32_to_bf16((float)x);
      break;
    case WEFT_F16:
      ((uint16_t *)dst)[i] = weft_f32_to_f16((float)x);
      break;
    default:
      break;
  }
}
static void convert(void *dst, weft_dtype ddt, const void *src, weft_dtype sdt, int64_t n) {
  if (ddt == sdt) {
    memcpy(dst, src, (size_t)n * weft_dtype_size(sdt));
    return;
  }
  if (sdt == WEFT_F64 && ddt == WEFT_F32) {
    for (int64_t i = 0; i < n; i++) ((float *)dst)[i] = (float)((const double *)src)[i];
    return;
  }
  for (int64_t i = 0; i < n; i++) store_f(dst, ddt, i, load_f(src, sdt, i));
}

/* Reads n elements of tensor t at file offset off into dst (as ddt). */
static weft_status read_run(const weft_safetensors *f, const st_tensor *t, uint64_t off, int64_t n,
                            weft_dtype ddt, char *dst, char *stage) {
  const size_t esz = weft_dtype_size(t->dtype), dsz = weft_dtype_size(ddt);
  if (ddt == t->dtype) return pread_full(f, dst, (size_t)n * esz, off, t->name);
  const int64_t chunk = (int64_t)(ST_STAGE / esz);
  for (int64_t i = 0; i < n; i += chunk) {
    int64_t m = n - i < chunk ? n - i : chunk;
    WEFT_CHECK(pread_full(f, stage, (size_t)m * esz, off + (uint64_t)i * esz, t->name));
    convert(dst + i * (int64_t)dsz, ddt, stage, t->dtype, m);
  }
  return WEFT_OK;
}

weft_status weft_safetensors_read_slice(const weft_safetensors *f, const char *name, int ndim,
                                        const int64_t *start, const int64_t *len, weft_dtype dtype,
                                        void *dst, int64_t dst_numel) {
  if (!f || !name) return weft_error(WEFT_ERR_INVALID, "reader or name is NULL");
  const st_tensor *t = lookup(f, name);
  if (!t) return weft_error(WEFT_ERR_NOT_FOUND, "%s: no tensor '%s'", f->path, name);
  if (ndim != t->ndim)
    return weft_error(WEFT_ERR_INVALID, "%s: tensor '%s' has %d dims, slice gives %d", f->path,
                      name, t->ndim, ndim);
  if (ndim > 0 && (!start || !len))
    return weft_error(WEFT_ERR_INVALID, "%s: tensor '%s': start or len is NULL", f->path, name);
  int64_t count = 1;
  for (int d = 0; d < ndim; d++) {
    if (start[d] < 0 || len[d] < 0 || start[d] > t->shape[d] - len[d])
      return weft_error(WEFT_ERR_INVALID,
                        "%s: tensor '%s': slice [%lld, %lld) of dim %d is outside "
                        "[0, %lld)",
                        f->path, name, (long long)start[d], (long long)(start[d] + len[d]), d,
                        (long long)t->shape[d]);
    count *= len[d];
  }
  if ((unsigned)dtype >= WEFT_DTYPE_COUNT)
    return weft_error(WEFT_ERR_INVALID, "%s: tensor '%s': invalid destination dtype %d", f->path,
                      name, (int)dtype);
  if (dtype != t->dtype && !(weft_dtype_is_float(dtype) && weft_dtype_is_float(t->dtype)))
    return weft_error(WEFT_ERR_UNSUPPORTED,
                      "%s: tensor '%s' is %s; cannot read it as %s (only "
                      "float-to-float conversions)",
                      f->path, name, st_dtype_name(t->dtype), weft_dtype_name(dtype));
  if (dst_numel < count)
    return weft_error(WEFT_ERR_INVALID,
                      "%s: tensor '%s': destination holds %lld elements, slice "
                      "has %lld",
                      f->path, name, (long long)dst_numel, (long long)count);
  if (count == 0) return WEFT_OK;
  if (!dst) return weft_error(WEFT_ERR_INVALID, "%s: tensor '%s': dst is NULL", f->path, name);

  const size_t esz = weft_dtype_size(t->dtype), dsz = weft_dtype_size(dtype);
  /* Merge trailing dims read whole into one contiguous run: dims > dd are
   * full, so a run is len[dd] * inner elements. */
  int dd = ndim > 0 ? ndim - 1 : 0;
  while (dd > 0 && start[dd] == 0 && len[dd] == t->shape[dd]) dd--;
  int64_t stride[WEFT_MAX_DIMS], inner = 1;
  for (int d = ndim - 1; d >= 0; d--) {
    stride[d] = inner;
    inner *= t->shape[d];
  }
  const int64_t run = ndim > 0 ? len[dd] * stride[dd] : 1;
  int64_t nruns = 1;
  for (int d = 0; d < dd; d++) nruns *= len[d];
  const uint64_t run_bytes = (uint64_t)run * esz;
  const uint64_t base =
      f->data_start + t->begin + (ndim > 0 ? (uint64_t)(start[dd] * stride[dd]) * esz : 0);

  char *stage = NULL;
  uint64_t *pend = NULL;
  weft_status st = WEFT_OK;
  const bool need_stage = dtype != t->dtype || (nruns > 1 && run_bytes < ST_STAGE / 2);
  if (need_stage) {
    stage = malloc(ST_STAGE);
    if (!stage) return weft_error(WEFT_ERR_OOM, "staging buffer");
  }
  int64_t idx[WEFT_MAX_DIMS];
  for (int d = 0; d < dd; d++) idx[d] = start[d];
  char *out = dst;
  if (nruns == 1 || run_bytes >= ST_STAGE / 2) {
    /* large runs: one read (or conversion loop) each */
    for (int64_t r = 0; r < nruns; r++) {
      uint64_t off = base;
      for (int d = 0; d < dd; d++) off += (uint64_t)(idx[d] * stride[d]) * esz;
      WEFT_CHECK_GOTO(read_run(f, t, off, run, dtype, out + r * run * (int64_t)dsz, stage), st,
                      done);
      for (int d = dd - 1; d >= 0 && ++idx[d] == start[d] + len[d]; d--) idx[d] = start[d];
    }
    goto done;
  }
  /* small runs: merge neighbours into windows read with one pread, as long
   * as the window fits the stage and at most ~3/4 of it is skipped bytes */
  const int64_t maxp = (int64_t)(ST_STAGE / run_bytes);
  pend = malloc((size_t)maxp * sizeof *pend);
  if (!pend) {
    st = weft_error(WEFT_ERR_OOM, "read plan");
    goto done;
  }
  int64_t np = 0, done_runs = 0;
  uint64_t wstart = 0, wend = 0;
  for (int64_t r = 0; r <= nruns; r++) {
    uint64_t off = 0;
    if (r < nruns) {
      off = base;
      for (int d = 0; d < dd; d++) off += (uint64_t)(idx[d] * stride[d]) * esz;
      for (int d = dd - 1; d >= 0 && ++idx[d] == start[d] + len[d]; d--) idx[d] = start[d];
    }
    bool flush = np > 0 && (r == nruns || np == maxp || off + run_bytes - wstart > ST_STAGE ||
                            off + run_bytes - wstart > 4 * (uint64_t)(np + 1) * run_bytes + 65536);
    if (flush) {
      WEFT_CHECK_GOTO(pread_full(f, stage, (size_t)(wend - wstart), wstart, t->name), st, done);
      for (int64_t i = 0; i < np; i++)
        convert(out + (done_runs + i) * run * (int64_t)dsz, dtype, stage + (pend[i] - wstart),
                t->dtype, run);
      done_runs += np;
      np = 0;
    }
    if (r == nruns) break;
    if (np == 0) wstart = off;
    pend[np++] = off;
    wend = off + run_bytes;
  }
done:
  free(pend);
  free(stage);
  return st;
}

weft_status weft_safetensors_read(const weft_safetensors *f, const char *name, weft_dtype dtype,
                                  void *dst, int64_t dst_numel) {
  if (!f || !name) return weft_error(WEFT_ERR_INVALID, "reader or name is NULL");
  const st_tensor *t = lookup(f, name);
  if (!t) return weft_error(WEFT_ERR_NOT_FOUND, "%s: no tensor '%s'", f->path, name);
  int64_t zero[WEFT_MAX_DIMS] = {0};
  WEFT_CHECK(weft_safetensors_read_slice(f, name, t->ndim, zero, t->shape, dtype, dst, dst_numel));
  return WEFT_OK;
}

weft_status weft_safetensors_read_rows(const weft_safetensors *f, const char *name, int64_t row0,
                                       int64_t nrows, weft_dtype dtype, void *dst,
                                       int64_t dst_numel) {
  if (!f || !name) return weft_error(WEFT_ERR_INVALID, "reader or name is NULL");
  const st_tensor *t = lookup(f, name);
  if (!t) return weft_error(WEFT_ERR_NOT_FOUND, "%s: no tensor '%s'", f->path, name);
  if (t->ndim == 0)
    return weft_error(WEFT_ERR_INVALID, "%s: tensor '%s' is a scalar: it has no rows", f->path,
                      name);
  int64_t start[WEFT_MAX_DIMS] = {0}, len[WEFT_MAX_DIMS];
  memcpy(len, t->shape, sizeof len);
  start[0] = row0;
  len[0] = nrows;
  return weft_safetensors_read_slice(f, name, t->ndim, start, len, dtype, dst, dst_numel);
}

weft_status weft_safetensors_read_tensor(const weft_safetensors *f, const char *name,
                                         weft_tensor *dst) {
  if (!f || !name || !dst) return weft_error(WEFT_ERR_INVALID, "reader, name or dst is NULL");
  const st_tensor *t = lookup(f, name);
  if (!t) return weft_error(WEFT_ERR_NOT_FOUND, "%s: no tensor '%s'", f->path, name);
  if (dst->device != WEFT_CPU || !weft_tensor_is_contiguous(dst))
    return weft_error(WEFT_ERR_INVALID,
                      "%s: tensor '%s': destination must be a contiguous CPU "
                      "tensor",
                      f->path, name);
  bool same = dst->ndim == t->ndim;
  for (int d = 0; same && d < t->ndim; d++) same = dst->shape[d] == t->shape[d];
  if (!same) {
    char buf[128];
    weft_tensor_describe(dst, buf, sizeof buf);
    return weft_error(WEFT_ERR_INVALID,
                      "%s: tensor '%s' has %d dims (shape[0] = %lld); "
                      "destination is %s",
                      f->path, name, t->ndim, (long long)(t->ndim ? t->shape[0] : 1), buf);
  }
  return weft_safetensors_read(f, name, dst->dtype, dst->data, weft_tensor_numel(dst));
}

/* ---------------------------------------------------------------- writing */

typedef struct sbuf {
  char *p;
  size_t len, cap;
  bool oom;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n) {
  if (b->oom) return;
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 1024;
    while (cap < b->len + n + 1) cap *= 2;
    char *q = realloc(b->p, cap);
    if (!q) {
      b->oom = true;
      return;
    }
    b->p = q;
    b->cap = cap;
  }
  memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = '\0';
}
static void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }
/* A JSON string literal (RFC 8259 escapes). */
static void sb_json(sbuf *b, const char *s) {
  sb_put(b, "\"", 1);
  for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
    char esc[8];
    if (*c == '"' || *c == '\\') {
      esc[0] = '\\';
      esc[1] = (char)*c;
      sb_put(b, esc, 2);
    } else if (*c < 0x20) {
      snprintf(esc, sizeof esc, "\\u%04x", *c);
      sb_put(b, esc, 6);
    } else {
      sb_put(b, (const char *)c, 1);
    }
  }
  sb_put(b, "\"", 1);
}

static int cmp_str_ptr(const void *a, const void *b) {
  WEFT_CHECK(strcmp(*(const char *const *)a, *(const char *const *)b));
  return WEFT_OK;
}

static weft_status write_full(int fd, const void *buf, size_t len, const char *path) {
  const char *p = buf;
  while (len > 0) {
    ssize_t w = write(fd, p, len);
    if (w < 0) {
      if (errno == EINTR) continue;
      return weft_error(WEFT_ERR_IO, "%s: write: %s", path, strerror(errno));
    }
    p += w;
    len -= (size_t)w;
  }
  return WEFT_OK;
}

weft_status weft_safetensors_write(const char *path, const weft_safetensors_entry *tensors,
                                   int64_t n, const char *const *metadata) {
  if (!path) return weft_error(WEFT_ERR_INVALID, "path is NULL");
  if (n < 0 || (n > 0 && !tensors))
    return weft_error(WEFT_ERR_INVALID, "%s: %lld tensors at %p", path, (long long)n,
                      (const void *)tensors);
  weft_status st = WEFT_OK;
  sbuf h = {0};
  char *tmp = NULL;
  int fd = -1;
  const char **names = malloc((size_t)(n ? n : 1) * sizeof *names);
  uint64_t *nbytes = malloc((size_t)(n ? n : 1) * sizeof *nbytes);
  uint64_t *start = malloc((size_t)(n ? n : 1) * sizeof *start);
  if (!names || !nbytes || !start) {
    st = weft_error(WEFT_ERR_OOM, "%s: writer tables", path);
    goto out;
  }
  /* validate */
  for (int64_t i = 0; i < n; i++) {
    const weft_safetensors_entry *e = &tensors[i];
    if (!e->name || !e->name[0] || strcmp(e->name, "__metadata__") == 0) {
      st = weft_error(WEFT_ERR_INVALID, "%s: tensor %lld has an empty, NULL or reserved name", path,
                      (long long)i);
      goto out;
    }
    if (!st_dtype_name(e->dtype)) {
      st = weft_error(WEFT_ERR_INVALID, "%s: tensor '%s': invalid dtype %d", path, e->name,
                      (int)e->dtype);
      goto out;
    }
    if (e->ndim < 0 || e->ndim > WEFT_MAX_DIMS || (e->ndim > 0 && !e->shape)) {
      st = weft_error(WEFT_ERR_INVALID, "%s: tensor '%s': bad ndim %d or NULL shape", path, e->name,
                      e->ndim);
      goto out;
    }
    uint64_t numel = 1;
    for (int d = 0; d < e->ndim; d++) {
      if (e->shape[d] < 0) {
        st = weft_error(WEFT_ERR_INVALID, "%s: tensor '%s': shape[%d] = %lld is negative", path,
                        e->name, d, (long long)e->shape[d]);
        goto out;
      }
      numel *= (uint64_t)e->shape[d];
    }
    nbytes[i] = numel * weft_dtype_size(e->dtype);
    if (nbytes[i] > 0 && !e->data) {
      st = weft_error(WEFT_ERR_INVALID, "%s: tensor '%s': data is NULL", path, e->name);
      goto out;
    }
    names[i] = e->name;
  }
  qsort(names, (size_t)n, sizeof *names, cmp_str_ptr);
  for (int64_t i = 1; i < n; i++)
    if (strcmp(names[i - 1], names[i]) == 0) {
      st = weft_error(WEFT_ERR_INVALID, "%s: tensor name '%s' given twice", path, names[i]);
      goto out;
    }
  /* header */
  sb_str(&h, "{");
  bool first = true;
  if (metadata && metadata[0]) {
    sb_str(&h, "\"__metadata__\":{");
    for (int i = 0; metadata[i]; i += 2) {
      if (!metadata[i + 1]) {
        st = weft_error(WEFT_ERR_INVALID, "%s: metadata key '%s' has no value", path, metadata[i]);
        goto out;
      }
      if (i) sb_str(&h, ",");
      sb_json(&h, metadata[i]);
      sb_str(&h, ":");
      sb_json(&h, metadata[i + 1]);
    }
    sb_str(&h, "}");
    first = false;
  }
  /* Data layout: larger elements first (8, 4, 2, 1 bytes; the given order
   * within a size), so each tensor starts at a multiple of its element size
   * as the reference writer arranges; the header lists tensors as given. */
  uint64_t off = 0;
  for (size_t esz = 8; esz >= 1; esz /= 2)
    for (int64_t i = 0; i < n; i++)
      if (weft_dtype_size(tensors[i].dtype) == esz) {
        start[i] = off;
        off += nbytes[i];
      }
  for (int64_t i = 0; i < n; i++) {
    const weft_safetensors_entry *e = &tensors[i];
    char num[64];
    if (!first) sb_str(&h, ",");
    first = false;
    sb_json(&h, e->name);
    sb_str(&h, ":{\"dtype\":\"");
    sb_str(&h, st_dtype_name(e->dtype));
    sb_str(&h, "\",\"shape\":[");
    for (int d = 0; d < e->ndim; d++) {
      snprintf(num, sizeof num, "%s%lld", d ? "," : "", (long long)e->shape[d]);
      sb_str(&h, num);
    }
    snprintf(num, sizeof num, "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}", start[i],
             start[i] + nbytes[i]);
    sb_str(&h, num);
  }
  sb_str(&h, "}");
  while (!h.oom && h.len % 8 != 0) sb_str(&h, " ");
  if (h.oom) {
    st = weft_error(WEFT_ERR_OOM, "%s: header", path);
    goto out;
  }
  /* file */
  size_t tl = strlen(path) + 32;
  tmp = malloc(tl);
  if (!tmp) {
    st = weft_error(WEFT_ERR_OOM, "%s: path", path);
    goto out;
  }
  snprintf(tmp, tl, "%s.tmp.%ld", path, (long)getpid());
  fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    st = weft_error(WEFT_ERR_IO, "cannot create '%s': %s", tmp, strerror(errno));
    goto out;
  }
  uint8_t lenb[8];
  for (int i = 0; i < 8; i++) lenb[i] = (uint8_t)((uint64_t)h.len >> (8 * i));
  WEFT_CHECK_GOTO(write_full(fd, lenb, 8, tmp), st, out);
  WEFT_CHECK_GOTO(write_full(fd, h.p, h.len, tmp), st, out);
  for (size_t esz = 8; esz >= 1; esz /= 2)
    for (int64_t i = 0; i < n; i++)
      if (weft_dtype_size(tensors[i].dtype) == esz && nbytes[i] > 0)
        WEFT_CHECK_GOTO(write_full(fd, tensors[i].data, (size_t)nbytes[i], tmp), st, out);
  if (fsync(fd) != 0) {
    st = weft_error(WEFT_ERR_IO, "%s: fsync: %s", tmp, strerror(errno));
    goto out;
  }
  if (close(fd) != 0) {
    fd = -1;
    st = weft_error(WEFT_ERR_IO, "%s: close: %s", tmp, strerror(errno));
    goto out;
  }
  fd = -1;
  if (rename(tmp, path) != 0) {
    st = weft_error(WEFT_ERR_IO, "rename '%s' -> '%s': %s", tmp, path, strerror(errno));
    goto out;
  }
out:
  if (fd >= 0) close(fd);
  if (st != WEFT_OK && tmp) unlink(tmp);
  free(tmp);
  free(h.p);
  free(names);
  free(nbytes);
  free(start);
  return st;
}
