/* dtensor/placement.c — placements and specs: construction, validation,
 * normalisation, printing and parsing. */
#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtensor_internal.h"

bool weft_placement_is_shard(weft_placement p) {
  return p.kind == WEFT_PLACE_SHARD || p.kind == WEFT_PLACE_STRIDED_SHARD;
}

bool weft_placement_equal(weft_placement a, weft_placement b) {
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case WEFT_PLACE_REPLICATE:
      return true;
    case WEFT_PLACE_SHARD:
      return a.dim == b.dim;
    case WEFT_PLACE_STRIDED_SHARD:
      return a.dim == b.dim && a.split_factor == b.split_factor;
    case WEFT_PLACE_PARTIAL:
      return a.op == b.op;
  }
  return false;
}

bool dt_placements_equal(const weft_placement *a, const weft_placement *b, int n) {
  for (int i = 0; i < n; i++)
    if (!weft_placement_equal(a[i], b[i])) return false;
  return true;
}

static const char *op_name(weft_reduce_op op) {
  switch (op) {
    case WEFT_OP_SUM:
      return "sum";
    case WEFT_OP_AVG:
      return "avg";
    case WEFT_OP_MAX:
      return "max";
    case WEFT_OP_MIN:
      return "min";
    default:
      return "?";
  }
}

void weft_placement_describe(weft_placement p, char *buf, size_t cap) {
  if (!buf || cap == 0) return;
  switch (p.kind) {
    case WEFT_PLACE_REPLICATE:
      snprintf(buf, cap, "R");
      break;
    case WEFT_PLACE_SHARD:
      snprintf(buf, cap, "S(%d)", p.dim);
      break;
    case WEFT_PLACE_STRIDED_SHARD:
      snprintf(buf, cap, "SS(%d,%d)", p.dim, p.split_factor);
      break;
    case WEFT_PLACE_PARTIAL:
      snprintf(buf, cap, "P(%s)", op_name(p.op));
      break;
    default:
      snprintf(buf, cap, "?");
      break;
  }
}

void weft_placements_describe(const weft_placement *p, int n, char *buf, size_t cap) {
  if (!buf || cap == 0) return;
  size_t at = 0;
  buf[0] = '\0';
  at += (size_t)snprintf(buf + at, at < cap ? cap - at : 0, "(");
  for (int i = 0; i < n; i++) {
    char one[32];
    weft_placement_describe(p[i], one, sizeof one);
    at += (size_t)snprintf(buf + (at < cap ? at : cap - 1), at < cap ? cap - at : 1, "%s%s",
                           i ? ", " : "", one);
  }
  snprintf(buf + (at < cap ? at : cap - 1), at < cap ? cap - at : 1, ")");
}

/* ------------------------------------------------------------------ parse */

static void skip_ws(const char **s) {
  while (**s && isspace((unsigned char)**s)) (*s)++;
}

static bool eat(const char **s, const char *word) {
  size_t n = strlen(word);
  if (strncmp(*s, word, n) == 0) {
    *s += n;
    return true;
  }
  return false;
}

static bool parse_int(const char **s, int *v) {
  skip_ws(s);
  char *end;
  long x = strtol(*s, &end, 10);
  if (end == *s) return false;
  *v = (int)x;
  *s = end;
  skip_ws(s);
  return true;
}

weft_status weft_placements_parse(const char *text, weft_placement *out, int cap, int *n) {
  if (!text || !out || !n) return weft_error(WEFT_ERR_INVALID, "NULL argument");
  const char *s = text;
  int count = 0;
  skip_ws(&s);
  bool paren = false;
  if (*s == '(' || *s == '[') {
    paren = true;
    s++;
  }
  for (;;) {
    skip_ws(&s);
    if (!*s || ((*s == ')' || *s == ']') && paren)) break;
    const char *tok = s;
    weft_placement p;
    if (eat(&s, "SS(") || eat(&s, "_S(") || eat(&s, "StridedShard(") || eat(&s, "_StridedShard(")) {
      int d, sf;
      if (!parse_int(&s, &d) || *s != ',') goto bad;
      s++;
      skip_ws(&s);
      (void)(eat(&s, "split_factor=") || eat(&s, "sf="));
      if (!parse_int(&s, &sf) || *s != ')') goto bad;
      s++;
      p = weft_strided_shard(d, sf);
    } else if (eat(&s, "S(") || eat(&s, "Shard(")) {
      int d;
      skip_ws(&s);
      (void)eat(&s, "dim=");
      if (!parse_int(&s, &d) || *s != ')') goto bad;
      s++;
      p = weft_shard(d);
    } else if (eat(&s, "Replicate()") || eat(&s, "R")) {
      p = weft_replicate();
    } else if (eat(&s, "P(") || eat(&s, "Partial(")) {
      skip_ws(&s);
      weft_reduce_op op;
      if (eat(&s, "sum"))
        op = WEFT_OP_SUM;
      else if (eat(&s, "avg"))
        op = WEFT_OP_AVG;
      else if (eat(&s, "max"))
        op = WEFT_OP_MAX;
      else if (eat(&s, "min"))
        op = WEFT_OP_MIN;
      else
        goto bad;
      skip_ws(&s);
      if (*s != ')') goto bad;
      s++;
      p = weft_partial(op);
    } else if (eat(&s, "P")) {
      p = weft_partial(WEFT_OP_SUM);
    } else {
      goto bad;
    }
    if (count >= cap)
      return weft_error(WEFT_ERR_INVALID, "more than %d placements in \"%s\"", cap, text);
    out[count++] = p;
    skip_ws(&s);
    if (*s == ',') {
      s++;
      continue;
    }
    if (!*s || ((*s == ')' || *s == ']') && paren)) break;
    tok = s;
  bad:
    return weft_error(WEFT_ERR_INVALID, "cannot parse placement at \"%.16s\" in \"%s\"", tok, text);
  }
  *n = count;
  return WEFT_OK;
}

/* ------------------------------------------------------------------- spec */

weft_status weft_dtensor_spec_init(weft_dtensor_spec *spec, int mesh_ndim, const int *mesh_shape,
                                   const weft_placement *placements, int nplacements,
                                   weft_dtype dtype, int ndim, const int64_t *shape) {
  if (!spec) return weft_error(WEFT_ERR_INVALID, "spec is NULL");
  if (mesh_ndim < 1 || mesh_ndim > WEFT_MESH_MAX_DIMS || !mesh_shape)
    return weft_error(WEFT_ERR_INVALID, "mesh ndim %d outside 1..%d", mesh_ndim,
                      WEFT_MESH_MAX_DIMS);
  if (nplacements != mesh_ndim)
    return weft_error(WEFT_ERR_INVALID,
                      "%d placements for a %d-dim mesh (need one placement per mesh dim)",
                      nplacements, mesh_ndim);
  if (nplacements > 0 && !placements) return weft_error(WEFT_ERR_INVALID, "placements is NULL");
  if (ndim < 0 || ndim > WEFT_MAX_DIMS)
    return weft_error(WEFT_ERR_INVALID, "tensor ndim %d outside 0..%d", ndim, WEFT_MAX_DIMS);
  if (ndim > 0 && !shape) return weft_error(WEFT_ERR_INVALID, "shape is NULL");
  if ((int)dtype < 0 || dtype >= WEFT_DTYPE_COUNT)
    return weft_error(WEFT_ERR_INVALID, "invalid dtype %d", (int)dtype);
  weft_dtensor_spec s;
  memset(&s, 0, sizeof s);
  s.mesh_ndim = mesh_ndim;
  s.ndim = ndim;
  s.dtype = dtype;
  for (int i = 0; i < mesh_ndim; i++) {
    if (mesh_shape[i] < 1)
      return weft_error(WEFT_ERR_INVALID, "mesh dim %d has size %d", i, mesh_shape[i]);
    s.mesh_shape[i] = mesh_shape[i];
  }
  for (int d = 0; d < ndim; d++) {
    if (shape[d] < 0)
      return weft_error(WEFT_ERR_INVALID, "shape[%d] = %lld < 0", d, (long long)shape[d]);
    s.shape[d] = shape[d];
  }
  int partial_op = -1;
  for (int i = 0; i < mesh_ndim; i++) {
    weft_placement p = placements[i];
    char desc[32];
    weft_placement_describe(p, desc, sizeof desc);
    switch (p.kind) {
      case WEFT_PLACE_REPLICATE:
        p = weft_replicate();
        break;
      case WEFT_PLACE_SHARD:
      case WEFT_PLACE_STRIDED_SHARD: {
        if (p.dim < -ndim || p.dim >= ndim)
          return weft_error(WEFT_ERR_INVALID,
                            "placement %d %s: shard dim %d out of range for a %d-dim tensor", i,
                            desc, p.dim, ndim);
        int d = p.dim < 0 ? p.dim + ndim : p.dim;
        if (p.kind == WEFT_PLACE_STRIDED_SHARD) {
          if (p.split_factor < 1)
            return weft_error(WEFT_ERR_INVALID, "placement %d %s: split_factor %d < 1", i, desc,
                              p.split_factor);
          p = p.split_factor == 1 ? weft_shard(d) : weft_strided_shard(d, p.split_factor);
        } else {
          p = weft_shard(d);
        }
        break;
      }
      case WEFT_PLACE_PARTIAL:
        if ((int)p.op < 0 || p.op >= WEFT_OP_COUNT)
          return weft_error(WEFT_ERR_INVALID, "placement %d: invalid reduce op %d", i, (int)p.op);
        if (partial_op >= 0 && partial_op != (int)p.op)
          return weft_error(WEFT_ERR_UNSUPPORTED,
                            "placement %d %s: mixing Partial ops (%s and %s) in one placement "
                            "list has no defined order of reduction",
                            i, desc, op_name((weft_reduce_op)partial_op), op_name(p.op));
        partial_op = (int)p.op;
        p = weft_partial(p.op);
        break;
      default:
        return weft_error(WEFT_ERR_INVALID, "placement %d: invalid kind %d", i, (int)p.kind);
    }
    s.placements[i] = p;
  }
  *spec = s;
  return WEFT_OK;
}

weft_status weft_dtensor_spec_init_mesh(weft_dtensor_spec *spec, const weft_mesh *mesh,
                                        const weft_placement *placements, int nplacements,
                                        weft_dtype dtype, int ndim, const int64_t *shape) {
  if (!mesh) return weft_error(WEFT_ERR_INVALID, "mesh is NULL");
  int mshape[WEFT_MESH_MAX_DIMS];
  int mnd = weft_mesh_ndim(mesh);
  for (int i = 0; i < mnd && i < WEFT_MESH_MAX_DIMS; i++) mshape[i] = weft_mesh_dim_size(mesh, i);
  return weft_dtensor_spec_init(spec, mnd, mshape, placements, nplacements, dtype, ndim, shape);
}

bool weft_dtensor_spec_equal(const weft_dtensor_spec *a, const weft_dtensor_spec *b) {
  if (a->mesh_ndim != b->mesh_ndim || a->ndim != b->ndim || a->dtype != b->dtype) return false;
  for (int i = 0; i < a->mesh_ndim; i++)
    if (a->mesh_shape[i] != b->mesh_shape[i] ||
        !weft_placement_equal(a->placements[i], b->placements[i]))
      return false;
  for (int d = 0; d < a->ndim; d++)
    if (a->shape[d] != b->shape[d]) return false;
  return true;
}

weft_status dt_spec_with(const weft_dtensor_spec *base, const weft_placement *pl, int n,
                         weft_dtensor_spec *out) {
  return weft_dtensor_spec_init(out, base->mesh_ndim, base->mesh_shape, pl, n, base->dtype,
                                base->ndim, base->shape);
}

void weft_dtensor_spec_describe(const weft_dtensor_spec *spec, char *buf, size_t cap) {
  if (!buf || cap == 0) return;
  char pl[256], shp[160], msh[96];
  weft_placements_describe(spec->placements, spec->mesh_ndim, pl, sizeof pl);
  size_t at = 0;
  shp[0] = '\0';
  for (int d = 0; d < spec->ndim && at < sizeof shp; d++)
    at += (size_t)snprintf(shp + at, sizeof shp - at, "%s%lld", d ? ", " : "",
                           (long long)spec->shape[d]);
  at = 0;
  msh[0] = '\0';
  for (int i = 0; i < spec->mesh_ndim && at < sizeof msh; i++)
    at += (size_t)snprintf(msh + at, sizeof msh - at, "%s%d", i ? "x" : "", spec->mesh_shape[i]);
  snprintf(buf, cap, "%s[%s] %s on mesh %s", weft_dtype_name(spec->dtype), shp, pl, msh);
}

int dt_linear(const int *mesh_shape, int mesh_ndim, const int *coords) {
  int r = 0;
  for (int i = 0; i < mesh_ndim; i++) r = r * mesh_shape[i] + coords[i];
  return r;
}

void dt_unlinear(const int *mesh_shape, int mesh_ndim, int rank, int *coords) {
  for (int i = mesh_ndim - 1; i >= 0; i--) {
    coords[i] = rank % mesh_shape[i];
    rank /= mesh_shape[i];
  }
}
