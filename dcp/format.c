/* dcp/format.c — the checkpoint metadata (metadata.json): parsing with
 * every validation rule of dcp/FORMAT.md, and serialisation. Integers are
 * written as exact JSON integers (cJSON raw text) and must be below 2^53
 * when read (JSON numbers are doubles in cJSON). */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dcp_internal.h"

#define CORRUPT(...) weft_error(WEFT_ERR_CORRUPT, __VA_ARGS__)

static const char *vtype_names[] = {"int", "double", "string", "json"};

const char *dcp_value_type_name(weft_sd_value_type t) {
  return (unsigned)t < 4 ? vtype_names[t] : "?";
}

void dcp_file_name(int rank, uint64_t id, char *buf, size_t cap) {
  snprintf(buf, cap, "r%05d-%016" PRIx64 ".data", rank, id);
}

void dcp_file_header(int rank, uint64_t id, int world_size, uint8_t out[DCP_FILE_HEADER]) {
  memset(out, 0, DCP_FILE_HEADER);
  memcpy(out, DCP_FILE_MAGIC, 8);
  uint32_t v = DCP_FORMAT_VERSION, r = (uint32_t)rank, w = (uint32_t)world_size;
  memcpy(out + 8, &v, 4);
  memcpy(out + 12, &r, 4);
  memcpy(out + 16, &id, 8);
  memcpy(out + 24, &w, 4);
  uint32_t crc = weft_crc32c(0, out, 60);
  memcpy(out + 60, &crc, 4);
}

/* ------------------------------------------------------------ freeing */

void dcp_meta_free(dcp_meta *m) {
  if (!m) return;
  for (int i = 0; i < m->nfiles; i++) free(m->files[i].name);
  free(m->files);
  for (int64_t i = 0; i < m->nt; i++) {
    dcp_tmeta *t = &m->t[i];
    free(t->name);
    free(t->layout);
    for (int64_t c = 0; c < t->nchunks; c++) free(t->chunks[c].crc);
    free(t->chunks);
  }
  free(m->t);
  for (int64_t i = 0; i < m->nv; i++) {
    free(m->v[i].name);
    free(m->v[i].text);
    free(m->v[i].json);
  }
  free(m->v);
  memset(m, 0, sizeof *m);
}

/* ------------------------------------------------------------ parsing */

/* A JSON number that is an integer in [0, 2^53]. */
static bool json_u64(const cJSON *it, uint64_t *out) {
  if (!cJSON_IsNumber(it)) return false;
  double d = it->valuedouble;
  if (!(d >= 0.0) || d > DCP_MAX_INT || d != floor(d)) return false;
  *out = (uint64_t)d;
  return true;
}

static bool json_i64(const cJSON *it, int64_t *out) {
  uint64_t u;
  if (!json_u64(it, &u)) return false;
  *out = (int64_t)u;
  return true;
}

static int cmp_tmeta(const void *a, const void *b) {
  return strcmp(((const dcp_tmeta *)a)->name, ((const dcp_tmeta *)b)->name);
}
static int cmp_vmeta(const void *a, const void *b) {
  return strcmp(((const dcp_vmeta *)a)->name, ((const dcp_vmeta *)b)->name);
}

const dcp_tmeta *dcp_meta_find_tensor(const dcp_meta *m, const char *name) {
  dcp_tmeta key;
  key.name = (char *)name;
  return m->nt ? bsearch(&key, m->t, (size_t)m->nt, sizeof key, cmp_tmeta) : NULL;
}

const dcp_vmeta *dcp_meta_find_value(const dcp_meta *m, const char *name) {
  dcp_vmeta key;
  key.name = (char *)name;
  return m->nv ? bsearch(&key, m->v, (size_t)m->nv, sizeof key, cmp_vmeta) : NULL;
}

static bool valid_file_name(const char *s) {
  size_t n = strlen(s);
  if (n == 0 || n > 255 || strcmp(s, ".") == 0 || strcmp(s, "..") == 0) return false;
  return strchr(s, '/') == NULL;
}

/* JSON text for a value (what weft_state_dict_get_json returns). */
weft_status dcp_value_render_json(dcp_vmeta *v) {
  free(v->json);
  v->json = NULL;
  cJSON *j = NULL;
  switch (v->type) {
    case WEFT_VALUE_INT:
      v->json = dcp_strdup(v->text);
      break;
    case WEFT_VALUE_DOUBLE: {
      double d = strtod(v->text, NULL);
      if (isfinite(d)) {
        char buf[64];
        snprintf(buf, sizeof buf, "%.17g", d);
        v->json = dcp_strdup(buf);
      } else {
        j = cJSON_CreateString(v->text);
      }
      break;
    }
    case WEFT_VALUE_STRING:
      j = cJSON_CreateString(v->text);
      break;
    case WEFT_VALUE_JSON:
      v->json = dcp_strdup(v->text);
      break;
  }
  if (j) {
    v->json = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
  }
  if (!v->json) return weft_error(WEFT_ERR_OOM, "value '%s'", v->name);
  return WEFT_OK;
}

static weft_status parse_value(const char *where, const cJSON *obj, dcp_vmeta *v) {
  const char *name = obj->string;
  if (!cJSON_IsObject(obj)) return CORRUPT("%s: value '%s' is not an object", where, name);
  const cJSON *ty = cJSON_GetObjectItemCaseSensitive(obj, "type");
  const cJSON *val = cJSON_GetObjectItemCaseSensitive(obj, "value");
  if (!cJSON_IsString(ty) || !val)
    return CORRUPT("%s: value '%s' needs a string \"type\" and a \"value\"", where, name);
  int t = -1;
  for (int i = 0; i < 4; i++)
    if (strcmp(ty->valuestring, vtype_names[i]) == 0) t = i;
  if (t < 0) return CORRUPT("%s: value '%s' has unknown type \"%s\"", where, name, ty->valuestring);
  v->type = (weft_sd_value_type)t;
  if (t == WEFT_VALUE_JSON) {
    v->text = cJSON_PrintUnformatted(val);
    if (!v->text) return weft_error(WEFT_ERR_OOM, "value '%s'", name);
  } else {
    if (!cJSON_IsString(val))
      return CORRUPT("%s: value '%s' of type %s must be stored as a string", where, name,
                     ty->valuestring);
    const char *s = val->valuestring;
    if (t == WEFT_VALUE_INT) {
      char *end;
      errno = 0;
      long long x = strtoll(s, &end, 10);
      (void)x;
      if (!*s || *end || errno == ERANGE)
        return CORRUPT("%s: value '%s': \"%s\" is not a 64-bit integer", where, name, s);
    } else if (t == WEFT_VALUE_DOUBLE) {
      char *end;
      (void)strtod(s, &end);
      if (!*s || *end) return CORRUPT("%s: value '%s': \"%s\" is not a number", where, name, s);
    }
    v->text = dcp_strdup(s);
    if (!v->text) return weft_error(WEFT_ERR_OOM, "value '%s'", name);
  }
  return dcp_value_render_json(v);
}

static weft_status parse_chunk(const char *where, const dcp_meta *m, dcp_tmeta *t, const cJSON *c,
                               int64_t ci, dcp_chunk *ch) {
  const char *name = t->name;
  if (!cJSON_IsObject(c))
    return CORRUPT("%s: tensor '%s': chunk %" PRId64 " is not an object", where, name, ci);
  const cJSON *offs = cJSON_GetObjectItemCaseSensitive(c, "offsets");
  const cJSON *sizes = cJSON_GetObjectItemCaseSensitive(c, "sizes");
  if (!cJSON_IsArray(offs) || !cJSON_IsArray(sizes) || cJSON_GetArraySize(offs) != t->ndim ||
      cJSON_GetArraySize(sizes) != t->ndim)
    return CORRUPT("%s: tensor '%s': chunk %" PRId64
                   ": \"offsets\" and \"sizes\" must be arrays of "
                   "%d integers",
                   where, name, ci, t->ndim);
  for (int d = 0; d < t->ndim; d++) {
    if (!json_i64(cJSON_GetArrayItem(offs, d), &ch->box.off[d]) ||
        !json_i64(cJSON_GetArrayItem(sizes, d), &ch->box.size[d]))
      return CORRUPT("%s: tensor '%s': chunk %" PRId64
                     ": offsets/sizes[%d] is not a non-negative "
                     "integer",
                     where, name, ci, d);
    if (ch->box.size[d] > t->shape[d] || ch->box.off[d] > t->shape[d])
      return CORRUPT("%s: tensor '%s': chunk %" PRId64 " dim %d: [%" PRId64 ", +%" PRId64
                     ") lies outside the tensor's size %" PRId64,
                     where, name, ci, d, ch->box.off[d], ch->box.size[d], t->shape[d]);
  }
  uint64_t file, off, length;
  if (!json_u64(cJSON_GetObjectItemCaseSensitive(c, "file"), &file) || file >= (uint64_t)m->nfiles)
    return CORRUPT("%s: tensor '%s': chunk %" PRId64 ": \"file\" must be an index below %d", where,
                   name, ci, m->nfiles);
  ch->file = (int)file;
  const char *fname = m->files[file].name;
  if (!json_u64(cJSON_GetObjectItemCaseSensitive(c, "offset"), &off) ||
      !json_u64(cJSON_GetObjectItemCaseSensitive(c, "length"), &length))
    return CORRUPT("%s: tensor '%s': chunk %" PRId64
                   ": \"offset\" and \"length\" must be "
                   "non-negative integers",
                   where, name, ci);
  /* sizes are each <= the shape, whose byte size was checked to fit */
  uint64_t want = (uint64_t)weft_box_volume(&ch->box, t->ndim) * weft_dtype_size(t->dtype);
  if (length != want)
    return CORRUPT("%s: tensor '%s': chunk %" PRId64 " in '%s' has length %" PRIu64
                   " bytes; its "
                   "sizes and dtype %s give %" PRIu64,
                   where, name, ci, fname, length, weft_dtype_name(t->dtype), want);
  if (off < DCP_FILE_HEADER || off > m->files[file].bytes || length > m->files[file].bytes - off)
    return CORRUPT("%s: tensor '%s': chunk %" PRId64 " bytes [%" PRIu64 ", +%" PRIu64
                   ") lie outside "
                   "the data of file '%s' (%" PRIu64 " bytes, header %d)",
                   where, name, ci, off, length, fname, m->files[file].bytes, DCP_FILE_HEADER);
  ch->byte_off = off;
  ch->length = length;
  const cJSON *crc = cJSON_GetObjectItemCaseSensitive(c, "crc32c");
  int64_t nb = (int64_t)((length + (uint64_t)m->block - 1) / (uint64_t)m->block);
  if (!cJSON_IsArray(crc) || cJSON_GetArraySize(crc) != nb)
    return CORRUPT("%s: tensor '%s': chunk %" PRId64 " in '%s': \"crc32c\" must list %" PRId64
                   " block checksums (length %" PRIu64 ", block %" PRId64 ")",
                   where, name, ci, fname, nb, length, m->block);
  ch->crc = malloc((size_t)(nb ? nb : 1) * sizeof *ch->crc);
  if (!ch->crc) return weft_error(WEFT_ERR_OOM, "checksums");
  ch->ncrc = nb;
  int64_t k = 0;
  for (const cJSON *e = crc->child; e; e = e->next, k++) {
    uint64_t v;
    if (!json_u64(e, &v) || v > 0xffffffffu)
      return CORRUPT("%s: tensor '%s': chunk %" PRId64 ": crc32c[%" PRId64
                     "] is not a 32-bit "
                     "unsigned integer",
                     where, name, ci, k);
    ch->crc[k] = (uint32_t)v;
  }
  return WEFT_OK;
}

static const char *chunk_label(int64_t i, void *ctx) {
  static _Thread_local char buf[96];
  const dcp_meta *m = ((const void **)ctx)[0];
  const dcp_tmeta *t = ((const void **)ctx)[1];
  snprintf(buf, sizeof buf, "chunk %" PRId64 " (file '%s')", i, m->files[t->chunks[i].file].name);
  return buf;
}

static weft_status parse_tensor(const char *where, const dcp_meta *m, const cJSON *obj,
                                dcp_tmeta *t) {
  const char *name = obj->string;
  if (!cJSON_IsObject(obj)) return CORRUPT("%s: tensor '%s' is not an object", where, name);
  const cJSON *dt = cJSON_GetObjectItemCaseSensitive(obj, "dtype");
  const cJSON *sh = cJSON_GetObjectItemCaseSensitive(obj, "shape");
  const cJSON *lay = cJSON_GetObjectItemCaseSensitive(obj, "layout");
  const cJSON *chunks = cJSON_GetObjectItemCaseSensitive(obj, "chunks");
  if (!cJSON_IsString(dt) || weft_dtype_parse(dt->valuestring, &t->dtype) != WEFT_OK) {
    weft_clear_error();
    return CORRUPT("%s: tensor '%s': missing or unknown \"dtype\"", where, name);
  }
  if (!cJSON_IsArray(sh)) return CORRUPT("%s: tensor '%s': \"shape\" is not an array", where, name);
  int nd = cJSON_GetArraySize(sh);
  if (nd > WEFT_MAX_DIMS)
    return CORRUPT("%s: tensor '%s' has %d dims (at most %d)", where, name, nd, WEFT_MAX_DIMS);
  t->ndim = nd;
  /* numel * dtype size must stay below 2^62 */
  uint64_t limit = ((uint64_t)1 << 62) / weft_dtype_size(t->dtype), numel = 1;
  bool big = false;
  for (int d = 0; d < nd; d++) {
    uint64_t s;
    if (!json_u64(cJSON_GetArrayItem(sh, d), &s))
      return CORRUPT("%s: tensor '%s': shape[%d] is not a non-negative integer", where, name, d);
    t->shape[d] = (int64_t)s;
    if (s && numel > limit / s)
      big = true;
    else
      numel *= s;
  }
  for (int d = 0; d < nd; d++)
    if (t->shape[d] == 0) big = false;
  if (big) return CORRUPT("%s: tensor '%s' is too large (more than 2^62 bytes)", where, name);
  if (lay && !cJSON_IsString(lay))
    return CORRUPT("%s: tensor '%s': \"layout\" is not a string", where, name);
  t->layout = dcp_strdup(lay ? lay->valuestring : "");
  if (!t->layout) return weft_error(WEFT_ERR_OOM, "layout");
  if (!cJSON_IsArray(chunks))
    return CORRUPT("%s: tensor '%s': \"chunks\" is not an array", where, name);
  int64_t nc = cJSON_GetArraySize(chunks);
  t->chunks = calloc((size_t)(nc ? nc : 1), sizeof *t->chunks);
  if (!t->chunks) return weft_error(WEFT_ERR_OOM, "chunks");
  int64_t ci = 0;
  for (const cJSON *c = chunks->child; c; c = c->next, ci++) {
    t->nchunks = ci + 1;
    WEFT_CHECK(parse_chunk(where, m, t, c, ci, &t->chunks[ci]));
  }
  t->nchunks = ci;
  const weft_box **boxes = malloc((size_t)(ci ? ci : 1) * sizeof *boxes);
  if (!boxes) return weft_error(WEFT_ERR_OOM, "chunk list");
  for (int64_t i = 0; i < ci; i++) boxes[i] = &t->chunks[i].box;
  const void *ctx[2] = {m, t};
  weft_status st = dcp_check_tiling(where, name, t->ndim, t->shape, boxes, ci, chunk_label, ctx);
  free(boxes);
  return st;
}

typedef struct byte_range {
  int file;
  uint64_t off, len;
  const char *tensor;
} byte_range;

static int cmp_range(const void *a, const void *b) {
  const byte_range *x = a, *y = b;
  if (x->file != y->file) return x->file < y->file ? -1 : 1;
  if (x->off != y->off) return x->off < y->off ? -1 : 1;
  return 0;
}

static int cmp_fname(const void *a, const void *b) {
  return strcmp(((const dcp_fmeta *)a)->name, ((const dcp_fmeta *)b)->name);
}

static weft_status parse_root(const char *where, const cJSON *root, dcp_meta *m) {
  if (!cJSON_IsObject(root)) return CORRUPT("%s: not a JSON object", where);
  const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(root, "format");
  if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, DCP_FORMAT_NAME) != 0)
    return CORRUPT("%s: not weft checkpoint metadata (\"format\" is not \"%s\")", where,
                   DCP_FORMAT_NAME);
  uint64_t u;
  if (!json_u64(cJSON_GetObjectItemCaseSensitive(root, "version"), &u) || u == 0)
    return CORRUPT("%s: \"version\" is not a positive integer", where);
  if (u > DCP_FORMAT_VERSION)
    return weft_error(WEFT_ERR_UNSUPPORTED,
                      "%s: format version %" PRIu64
                      " was written by a newer "
                      "weft; this one reads version %d",
                      where, u, DCP_FORMAT_VERSION);
  m->version = (int)u;
  const cJSON *id = cJSON_GetObjectItemCaseSensitive(root, "id");
  char *end = NULL;
  if (!cJSON_IsString(id) || strlen(id->valuestring) != 16)
    return CORRUPT("%s: \"id\" is not a 16-digit hex string", where);
  m->id = strtoull(id->valuestring, &end, 16);
  if (*end) return CORRUPT("%s: \"id\" is not a 16-digit hex string", where);
  if (!json_u64(cJSON_GetObjectItemCaseSensitive(root, "world_size"), &u) || u < 1 || u > 1u << 30)
    return CORRUPT("%s: \"world_size\" is not an integer in [1, 2^30]", where);
  m->world_size = (int)u;
  if (!json_u64(cJSON_GetObjectItemCaseSensitive(root, "block_bytes"), &u) || u < DCP_MIN_BLOCK ||
      u > (uint64_t)DCP_MAX_BLOCK || u % 8 != 0)
    return CORRUPT("%s: \"block_bytes\" must be a multiple of 8 in [%d, %" PRId64 "]", where,
                   DCP_MIN_BLOCK, DCP_MAX_BLOCK);
  m->block = (int64_t)u;

  const cJSON *files = cJSON_GetObjectItemCaseSensitive(root, "files");
  if (!cJSON_IsArray(files) || cJSON_GetArraySize(files) < 1)
    return CORRUPT("%s: \"files\" is not a non-empty array", where);
  int nf = cJSON_GetArraySize(files);
  m->files = calloc((size_t)nf, sizeof *m->files);
  if (!m->files) return weft_error(WEFT_ERR_OOM, "files");
  int fi = 0;
  for (const cJSON *f = files->child; f; f = f->next, fi++) {
    m->nfiles = fi + 1;
    const cJSON *fn = cJSON_GetObjectItemCaseSensitive(f, "name");
    if (!cJSON_IsObject(f) || !cJSON_IsString(fn) || !valid_file_name(fn->valuestring))
      return CORRUPT("%s: files[%d] needs a \"name\" that is a plain file name", where, fi);
    m->files[fi].name = dcp_strdup(fn->valuestring);
    if (!m->files[fi].name) return weft_error(WEFT_ERR_OOM, "file name");
    if (!json_u64(cJSON_GetObjectItemCaseSensitive(f, "rank"), &u) || u >= (uint64_t)m->world_size)
      return CORRUPT("%s: file '%s': \"rank\" must be below world_size %d", where,
                     m->files[fi].name, m->world_size);
    m->files[fi].rank = (int)u;
    if (!json_u64(cJSON_GetObjectItemCaseSensitive(f, "bytes"), &u) || u < DCP_FILE_HEADER)
      return CORRUPT("%s: file '%s': \"bytes\" must be an integer >= %d", where, m->files[fi].name,
                     DCP_FILE_HEADER);
    m->files[fi].bytes = u;
  }
  {
    dcp_fmeta *sorted = malloc((size_t)nf * sizeof *sorted);
    if (!sorted) return weft_error(WEFT_ERR_OOM, "files");
    memcpy(sorted, m->files, (size_t)nf * sizeof *sorted);
    qsort(sorted, (size_t)nf, sizeof *sorted, cmp_fname);
    for (int i = 1; i < nf; i++)
      if (strcmp(sorted[i - 1].name, sorted[i].name) == 0) {
        weft_status st = CORRUPT("%s: file '%s' is listed twice", where, sorted[i].name);
        free(sorted);
        return st;
      }
    free(sorted);
  }

  const cJSON *tensors = cJSON_GetObjectItemCaseSensitive(root, "tensors");
  if (!cJSON_IsObject(tensors)) return CORRUPT("%s: \"tensors\" is not an object", where);
  int64_t nt = cJSON_GetArraySize(tensors);
  m->t = calloc((size_t)(nt ? nt : 1), sizeof *m->t);
  if (!m->t) return weft_error(WEFT_ERR_OOM, "tensors");
  int64_t nranges = 0;
  for (const cJSON *c = tensors->child; c; c = c->next) {
    dcp_tmeta *t = &m->t[m->nt++];
    if (!c->string || !c->string[0]) return CORRUPT("%s: a tensor has an empty name", where);
    t->name = dcp_strdup(c->string);
    if (!t->name) return weft_error(WEFT_ERR_OOM, "name");
    WEFT_CHECK(parse_tensor(where, m, c, t));
    nranges += t->nchunks;
  }
  qsort(m->t, (size_t)m->nt, sizeof *m->t, cmp_tmeta);
  for (int64_t i = 1; i < m->nt; i++)
    if (strcmp(m->t[i - 1].name, m->t[i].name) == 0)
      return CORRUPT("%s: tensor '%s' is listed twice", where, m->t[i].name);

  /* no two chunks share a byte of a file */
  byte_range *br = malloc((size_t)(nranges ? nranges : 1) * sizeof *br);
  if (!br) return weft_error(WEFT_ERR_OOM, "byte ranges");
  int64_t k = 0;
  for (int64_t i = 0; i < m->nt; i++)
    for (int64_t c = 0; c < m->t[i].nchunks; c++) {
      const dcp_chunk *ch = &m->t[i].chunks[c];
      if (ch->length == 0) continue;
      br[k].file = ch->file;
      br[k].off = ch->byte_off;
      br[k].len = ch->length;
      br[k].tensor = m->t[i].name;
      k++;
    }
  qsort(br, (size_t)k, sizeof *br, cmp_range);
  for (int64_t i = 1; i < k; i++)
    if (br[i].file == br[i - 1].file && br[i].off < br[i - 1].off + br[i - 1].len) {
      weft_status st = CORRUPT("%s: tensor '%s': a chunk's bytes [%" PRIu64 ", +%" PRIu64
                               ") in file "
                               "'%s' overlap a chunk of tensor '%s'",
                               where, br[i].tensor, br[i].off, br[i].len, m->files[br[i].file].name,
                               br[i - 1].tensor);
      free(br);
      return st;
    }
  free(br);

  const cJSON *values = cJSON_GetObjectItemCaseSensitive(root, "values");
  if (values) {
    if (!cJSON_IsObject(values)) return CORRUPT("%s: \"values\" is not an object", where);
    int64_t nv = cJSON_GetArraySize(values);
    m->v = calloc((size_t)(nv ? nv : 1), sizeof *m->v);
    if (!m->v) return weft_error(WEFT_ERR_OOM, "values");
    for (const cJSON *c = values->child; c; c = c->next) {
      dcp_vmeta *v = &m->v[m->nv++];
      if (!c->string || !c->string[0]) return CORRUPT("%s: a value has an empty name", where);
      v->name = dcp_strdup(c->string);
      if (!v->name) return weft_error(WEFT_ERR_OOM, "name");
      WEFT_CHECK(parse_value(where, c, v));
    }
    qsort(m->v, (size_t)m->nv, sizeof *m->v, cmp_vmeta);
    for (int64_t i = 1; i < m->nv; i++)
      if (strcmp(m->v[i - 1].name, m->v[i].name) == 0)
        return CORRUPT("%s: value '%s' is listed twice", where, m->v[i].name);
  }
  return WEFT_OK;
}

/* The metadata checksum: the last member of the object, exactly as written
 * here, covering every byte before its comma (FORMAT.md, "Metadata
 * checksum"). */
#define META_SUM_KEY "checksum"
#define META_SUM_FMT ",\"" META_SUM_KEY "\":\"crc32c:%08" PRIx32 "\"}"
#define META_SUM_LEN 30 /* strlen of META_SUM_FMT printed */

/* A "checksum" member must be the last one, as dcp_meta_serialize writes
 * it, and match the CRC32C of every byte before its comma. Metadata
 * without one (written before weft checksummed it) is accepted: a byte
 * change that only renames the key changes no value, and any other change
 * breaks the sum. */
static weft_status check_sum(const char *where, const cJSON *root, const char *text, size_t len) {
  const cJSON *sum = cJSON_GetObjectItemCaseSensitive(root, META_SUM_KEY);
  if (!sum) return WEFT_OK;
  size_t n = len;
  while (n > 0 &&
         (text[n - 1] == ' ' || text[n - 1] == '\n' || text[n - 1] == '\t' || text[n - 1] == '\r'))
    n--;
  char want[META_SUM_LEN + 1];
  unsigned stored = 0;
  bool placed = cJSON_IsString(sum) && strlen(sum->valuestring) == 15 &&
                sscanf(sum->valuestring, "crc32c:%8x", &stored) == 1 && n > META_SUM_LEN;
  if (placed) {
    snprintf(want, sizeof want, META_SUM_FMT, (uint32_t)stored);
    placed = memcmp(text + n - META_SUM_LEN, want, META_SUM_LEN) == 0;
  }
  if (!placed)
    return CORRUPT(
        "%s: the metadata checksum is not a \"crc32c:<8 hex digits>\" last member as "
        "weft writes it",
        where);
  const uint32_t got = weft_crc32c(0, text, n - META_SUM_LEN);
  if (got != (uint32_t)stored)
    return CORRUPT("%s: metadata checksum mismatch (stored %08x, computed %08" PRIx32
                   "): the metadata was changed after it was written",
                   where, stored, got);
  return WEFT_OK;
}

weft_status dcp_meta_parse(const char *text, size_t len, const char *where, dcp_meta *out) {
  memset(out, 0, sizeof *out);
  if (!text) return weft_error(WEFT_ERR_INVALID, "%s: no text", where);
  if (memchr(text, '\0', len)) return CORRUPT("%s: contains a NUL byte (not JSON text)", where);
  const char *end = NULL;
  cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, false);
  if (!root) {
    size_t at = end ? (size_t)(end - text) : 0;
    return CORRUPT("%s: not valid JSON (error near byte %zu of %zu)", where, at, len);
  }
  for (const char *p = end; p && p < text + len; p++)
    if (*p != ' ' && *p != '\n' && *p != '\t' && *p != '\r') {
      cJSON_Delete(root);
      return CORRUPT("%s: trailing bytes after the JSON object (byte %td)", where, p - text);
    }
  weft_status st = check_sum(where, root, text, len);
  if (st == WEFT_OK) st = parse_root(where, root, out);
  cJSON_Delete(root);
  if (st != WEFT_OK) dcp_meta_free(out);
  return st;
}

weft_status weft_dcp_metadata_check(const char *text, size_t len, const char *name) {
  dcp_meta m;
  WEFT_CHECK(dcp_meta_parse(text, len, name ? name : "metadata", &m));
  dcp_meta_free(&m);
  return WEFT_OK;
}

/* ------------------------------------------------------------ writing */

static cJSON *raw_u64(uint64_t v) {
  char buf[32];
  snprintf(buf, sizeof buf, "%" PRIu64, v);
  return cJSON_CreateRaw(buf);
}

static bool add(cJSON *obj, const char *key, cJSON *item) {
  if (!item) return false;
  if (!cJSON_AddItemToObject(obj, key, item)) {
    cJSON_Delete(item);
    return false;
  }
  return true;
}
static bool push(cJSON *arr, cJSON *item) {
  if (!item) return false;
  if (!cJSON_AddItemToArray(arr, item)) {
    cJSON_Delete(item);
    return false;
  }
  return true;
}

static bool build(const dcp_meta *m, cJSON *root) {
  char idb[32];
  snprintf(idb, sizeof idb, "%016" PRIx64, m->id);
  bool ok = add(root, "format", cJSON_CreateString(DCP_FORMAT_NAME)) &&
            add(root, "version", raw_u64((uint64_t)m->version)) &&
            add(root, "id", cJSON_CreateString(idb)) &&
            add(root, "world_size", raw_u64((uint64_t)m->world_size)) &&
            add(root, "block_bytes", raw_u64((uint64_t)m->block));
  if (!ok) return false;
  cJSON *files = cJSON_CreateArray();
  if (!add(root, "files", files)) return false;
  for (int i = 0; i < m->nfiles; i++) {
    cJSON *f = cJSON_CreateObject();
    if (!push(files, f)) return false;
    if (!add(f, "name", cJSON_CreateString(m->files[i].name)) ||
        !add(f, "rank", raw_u64((uint64_t)m->files[i].rank)) ||
        !add(f, "bytes", raw_u64(m->files[i].bytes)))
      return false;
  }
  cJSON *tensors = cJSON_CreateObject();
  if (!add(root, "tensors", tensors)) return false;
  for (int64_t i = 0; i < m->nt; i++) {
    const dcp_tmeta *t = &m->t[i];
    cJSON *o = cJSON_CreateObject(), *shape = cJSON_CreateArray(), *chunks = cJSON_CreateArray();
    if (!add(tensors, t->name, o)) {
      cJSON_Delete(shape);
      cJSON_Delete(chunks);
      return false;
    }
    if (!add(o, "dtype", cJSON_CreateString(weft_dtype_name(t->dtype))) ||
        !add(o, "shape", shape)) {
      cJSON_Delete(chunks);
      return false;
    }
    for (int d = 0; d < t->ndim; d++)
      if (!push(shape, raw_u64((uint64_t)t->shape[d]))) {
        cJSON_Delete(chunks);
        return false;
      }
    if (!add(o, "layout", cJSON_CreateString(t->layout ? t->layout : "")) ||
        !add(o, "chunks", chunks))
      return false;
    for (int64_t c = 0; c < t->nchunks; c++) {
      const dcp_chunk *ch = &t->chunks[c];
      cJSON *co = cJSON_CreateObject();
      if (!push(chunks, co)) return false;
      cJSON *offs = cJSON_CreateArray(), *sizes = cJSON_CreateArray(), *crc = cJSON_CreateArray();
      bool okc = add(co, "offsets", offs);
      if (!okc) {
        cJSON_Delete(sizes);
        cJSON_Delete(crc);
        return false;
      }
      if (!add(co, "sizes", sizes)) {
        cJSON_Delete(crc);
        return false;
      }
      for (int d = 0; d < t->ndim; d++)
        if (!push(offs, raw_u64((uint64_t)ch->box.off[d])) ||
            !push(sizes, raw_u64((uint64_t)ch->box.size[d]))) {
          cJSON_Delete(crc);
          return false;
        }
      if (!add(co, "file", raw_u64((uint64_t)ch->file)) ||
          !add(co, "offset", raw_u64(ch->byte_off)) || !add(co, "length", raw_u64(ch->length)) ||
          !add(co, "crc32c", crc))
        return false;
      for (int64_t b = 0; b < ch->ncrc; b++)
        if (!push(crc, raw_u64(ch->crc[b]))) return false;
    }
  }
  cJSON *values = cJSON_CreateObject();
  if (!add(root, "values", values)) return false;
  for (int64_t i = 0; i < m->nv; i++) {
    const dcp_vmeta *v = &m->v[i];
    cJSON *o = cJSON_CreateObject();
    if (!add(values, v->name, o)) return false;
    if (!add(o, "type", cJSON_CreateString(dcp_value_type_name(v->type)))) return false;
    cJSON *val = v->type == WEFT_VALUE_JSON ? cJSON_Parse(v->text) : cJSON_CreateString(v->text);
    if (!add(o, "value", val)) return false;
  }
  return true;
}

char *dcp_meta_serialize(const dcp_meta *m) {
  cJSON *root = cJSON_CreateObject();
  if (!root) return NULL;
  char *text = NULL, *out = NULL;
  if (build(m, root)) text = cJSON_PrintUnformatted(root);
  cJSON_Delete(root);
  size_t n = text ? strlen(text) : 0;
  if (n >= 2 && text[n - 1] == '}' && (out = malloc(n - 1 + META_SUM_LEN + 1))) {
    memcpy(out, text, n - 1);
    snprintf(out + n - 1, META_SUM_LEN + 1, META_SUM_FMT, weft_crc32c(0, text, n - 1));
  }
  cJSON_free(text);
  return out;
}
