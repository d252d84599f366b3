/* tests/dtensor/ref.c — see ref.h. */
#include "ref.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void ref_rng_seed(ref_rng *r, uint64_t seed) { r->s = seed * 0x9E3779B97F4A7C15ULL + 12345; }

uint64_t ref_rng_next(ref_rng *r) {
  uint64_t x = r->s;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  r->s = x;
  return x * 0x2545F4914F6CDD1DULL;
}

int ref_rng_int(ref_rng *r, int lo, int hi) {
  return lo + (int)(ref_rng_next(r) % (uint64_t)(hi - lo + 1));
}

/* ------------------------------------------------------------ blocks */

typedef struct iblock {
  int64_t n;
  int64_t *v;
} iblock;

typedef struct iblocks {
  int n;
  iblock *b;
} iblocks;

static void ib_free(iblocks *b) {
  for (int i = 0; i < b->n; i++) free(b->b[i].v);
  free(b->b);
  b->b = NULL;
  b->n = 0;
}

/* torch.chunk(v, k)[c]: chunk size ceil(n/k) */
static iblock take_chunk(const iblock *v, int64_t k, int64_t c) {
  int64_t q = (v->n + k - 1) / k;
  int64_t lo = c * q, hi = (c + 1) * q;
  if (lo > v->n) lo = v->n;
  if (hi > v->n) hi = v->n;
  iblock o;
  o.n = hi - lo;
  o.v = malloc((size_t)(o.n + 1) * sizeof *o.v);
  memcpy(o.v, v->v + lo, (size_t)o.n * sizeof *o.v);
  return o;
}

static iblock flatten(const iblocks *b) {
  iblock o;
  o.n = 0;
  for (int i = 0; i < b->n; i++) o.n += b->b[i].n;
  o.v = malloc((size_t)(o.n + 1) * sizeof *o.v);
  int64_t at = 0;
  for (int i = 0; i < b->n; i++) {
    memcpy(o.v + at, b->b[i].v, (size_t)b->b[i].n * sizeof *o.v);
    at += b->b[i].n;
  }
  return o;
}

/* every block split into k chunks, block-major */
static iblocks split_all(const iblocks *in, int64_t k) {
  iblocks o;
  o.n = in->n * (int)k;
  o.b = malloc((size_t)o.n * sizeof *o.b);
  for (int i = 0; i < in->n; i++)
    for (int64_t c = 0; c < k; c++) o.b[i * k + c] = take_chunk(&in->b[i], k, c);
  return o;
}

int64_t *ref_indices(const weft_dtensor_spec *s, const int *coords, int dim, int64_t *n) {
  iblocks cur;
  cur.n = 1;
  cur.b = malloc(sizeof *cur.b);
  cur.b[0].n = s->shape[dim];
  cur.b[0].v = malloc((size_t)(s->shape[dim] + 1) * sizeof(int64_t));
  for (int64_t i = 0; i < s->shape[dim]; i++) cur.b[0].v[i] = i;
  for (int i = 0; i < s->mesh_ndim; i++) {
    weft_placement p = s->placements[i];
    if (!(p.kind == WEFT_PLACE_SHARD || p.kind == WEFT_PLACE_STRIDED_SHARD) || p.dim != dim)
      continue;
    int64_t m = s->mesh_shape[i], c = coords[i];
    iblocks next;
    if (p.kind == WEFT_PLACE_SHARD) {
      if (cur.n > 1 && cur.n % m == 0) {
        int64_t per = cur.n / m;
        next.n = (int)per;
        next.b = malloc((size_t)per * sizeof *next.b);
        for (int64_t j = 0; j < per; j++) {
          iblock *src = &cur.b[c * per + j];
          next.b[j].n = src->n;
          next.b[j].v = malloc((size_t)(src->n + 1) * sizeof(int64_t));
          memcpy(next.b[j].v, src->v, (size_t)src->n * sizeof(int64_t));
        }
      } else {
        iblock f = flatten(&cur);
        next.n = 1;
        next.b = malloc(sizeof *next.b);
        next.b[0] = take_chunk(&f, m, c);
        free(f.v);
      }
    } else {
      int64_t sf = p.split_factor, prod = 1;
      iblocks virt;
      virt.n = 1;
      virt.b = malloc(sizeof *virt.b);
      virt.b[0] = flatten(&cur);
      for (int j = i + 1; j < s->mesh_ndim; j++) {
        weft_placement q = s->placements[j];
        if (!(q.kind == WEFT_PLACE_SHARD || q.kind == WEFT_PLACE_STRIDED_SHARD) || q.dim != dim)
          continue;
        if (q.kind != WEFT_PLACE_SHARD) break;
        int64_t mj = s->mesh_shape[j];
        if (sf % (prod * mj)) break;
        prod *= mj;
        iblocks t = split_all(&virt, mj);
        ib_free(&virt);
        virt = t;
      }
      if (sf / prod > 1) {
        iblocks t = split_all(&virt, sf / prod);
        ib_free(&virt);
        virt = t;
      }
      next.n = virt.n;
      next.b = malloc((size_t)virt.n * sizeof *next.b);
      for (int j = 0; j < virt.n; j++) next.b[j] = take_chunk(&virt.b[j], m, c);
      ib_free(&virt);
    }
    ib_free(&cur);
    cur = next;
  }
  iblock f = flatten(&cur);
  ib_free(&cur);
  *n = f.n;
  return f.v;
}

weft_tensor *ref_local(const weft_dtensor_spec *s, const int *coords, const weft_tensor *x) {
  int nd = s->ndim;
  int64_t *idx[WEFT_MAX_DIMS], len[WEFT_MAX_DIMS];
  for (int d = 0; d < nd; d++) idx[d] = ref_indices(s, coords, d, &len[d]);
  weft_tensor *t = NULL;
  if (weft_tensor_create(x->dtype, WEFT_CPU, nd, len, &t) != WEFT_OK) abort();
  size_t esz = weft_dtype_size(x->dtype);
  int64_t total = weft_tensor_numel(t);
  for (int64_t e = 0; e < total; e++) {
    int64_t rem = e, goff = 0, loff = 0;
    for (int d = nd - 1; d >= 0; d--) {
      int64_t i = rem % len[d];
      rem /= len[d];
      goff += idx[d][i] * x->strides[d];
      loff += i * t->strides[d];
    }
    memcpy((char *)t->data + loff * esz, (const char *)x->data + goff * esz, esz);
  }
  for (int d = 0; d < nd; d++) free(idx[d]);
  return t;
}

void ref_random_placements(ref_rng *r, int k, const int *mesh_shape, int ndim,
                           weft_placement *out) {
  for (int i = 0; i < k; i++) {
    int roll = ref_rng_int(r, 0, 99);
    if (ndim == 0 || roll < 30) {
      out[i] = weft_replicate();
    } else if (roll < 72) {
      int d = ref_rng_int(r, 0, ndim - 1);
      if (ref_rng_int(r, 0, 3) == 0) d -= ndim; /* negative dims are normalised */
      out[i] = weft_shard(d);
    } else {
      int d = ref_rng_int(r, 0, ndim - 1);
      int sf;
      if (i + 1 < k && ref_rng_int(r, 0, 1)) {
        /* FSDP over TP: the later mesh dims shard d plainly */
        sf = 1;
        for (int j = i + 1; j < k; j++) {
          if (ref_rng_int(r, 0, 2) == 0) continue;
          sf *= mesh_shape[j];
        }
        if (sf < 2) sf = 2;
      } else {
        sf = ref_rng_int(r, 2, 4);
      }
      out[i] = weft_strided_shard(d, sf);
    }
  }
  /* sometimes make the FSDP-over-TP pattern explicit: SS(d, later) + S(d) */
  if (k >= 2 && ndim > 0 && ref_rng_int(r, 0, 3) == 0) {
    int d = ref_rng_int(r, 0, ndim - 1);
    int sf = 1;
    for (int j = 1; j < k; j++) {
      out[j] = weft_shard(d);
      sf *= mesh_shape[j];
    }
    out[0] = sf > 1 ? weft_strided_shard(d, sf) : weft_shard(d);
  }
}

void ref_fill_bytes(weft_tensor *x, uint64_t seed) {
  ref_rng r;
  ref_rng_seed(&r, seed);
  size_t nb = weft_tensor_nbytes(x);
  unsigned char *p = x->data;
  for (size_t i = 0; i < nb; i++) p[i] = (unsigned char)(ref_rng_next(&r) >> 56);
}

void ref_case_describe(const weft_dtensor_spec *a, const weft_placement *b, char *buf,
                       unsigned cap) {
  char sa[512], pb[256];
  weft_dtensor_spec_describe(a, sa, sizeof sa);
  if (b) weft_placements_describe(b, a->mesh_ndim, pb, sizeof pb);
  snprintf(buf, cap, "%s%s%s", sa, b ? " -> " : "", b ? pb : "");
}
