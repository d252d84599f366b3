/* tests/nn/ops_check.c — see ops_check.h. */
#include "ops_check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

int64_t oc_numel(int ndim, const int64_t *shape) {
  int64_t n = 1;
  for (int d = 0; d < ndim; d++) n *= shape[d];
  return n;
}

double oc_maxrel(const float *a, const float *b, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; i++) {
    double e = fabs((double)a[i] - (double)b[i]) / (1.0 + fabs((double)b[i]));
    if (!(e <= m)) m = e; /* NaN wins */
  }
  return m;
}

/* Non-zero values in +-[0.5, 1.5), exactly representable in f32. */
static void fill_random(double *v, int64_t n, uint64_t *s) {
  for (int64_t i = 0; i < n; i++) {
    double u = weft_test_rng_unit(s);
    double x = 0.5 + u;
    if (weft_test_rng_u64(s) & 1) x = -x;
    v[i] = (double)(float)x;
  }
}

/* ------------------------------------------------------------ references */

static int64_t ne_in(const oc_case *c, int a) { return oc_numel(c->ndim[a], c->shape[a]); }
static int64_t ne_out(const oc_case *c, int j) { return oc_numel(c->ondim[j], c->oshape[j]); }
static int ndim_norm(int d, int nd) { return d < 0 ? d + nd : d; }

static void ref_matmul(const oc_case *c, double *const *in, double *const *out) {
  int na = c->ndim[0];
  int64_t K = c->shape[0][na - 1], N = c->shape[1][1], rows = ne_in(c, 0) / K;
  for (int64_t r = 0; r < rows; r++)
    for (int64_t n = 0; n < N; n++) {
      double s = 0;
      for (int64_t k = 0; k < K; k++) s += in[0][r * K + k] * in[1][k * N + n];
      out[0][r * N + n] = s;
    }
}

static void ref_linear(const oc_case *c, double *const *in, double *const *out) {
  int na = c->ndim[0];
  int64_t K = c->shape[0][na - 1], N = c->shape[1][0], rows = ne_in(c, 0) / K;
  for (int64_t r = 0; r < rows; r++)
    for (int64_t n = 0; n < N; n++) {
      double s = c->nin > 2 ? in[2][n] : 0.0;
      for (int64_t k = 0; k < K; k++) s += in[0][r * K + k] * in[1][n * K + k];
      out[0][r * N + n] = s;
    }
}

static void ref_copy(const oc_case *c, double *const *in, double *const *out) {
  memcpy(out[0], in[0], sizeof(double) * (size_t)ne_in(c, 0));
}

static void ref_transpose(const oc_case *c, double *const *in, double *const *out) {
  int nd = c->ndim[0], d0 = ndim_norm(c->iarg[0], nd), d1 = ndim_norm(c->iarg[1], nd);
  int64_t n = ne_out(c, 0), idx[WEFT_MAX_DIMS];
  for (int64_t o = 0; o < n; o++) {
    int64_t r = o;
    for (int d = nd - 1; d >= 0; d--) {
      idx[d] = r % c->oshape[0][d];
      r /= c->oshape[0][d];
    }
    int64_t t = idx[d0];
    idx[d0] = idx[d1];
    idx[d1] = t;
    int64_t lin = 0;
    for (int d = 0; d < nd; d++) lin = lin * c->shape[0][d] + idx[d];
    out[0][o] = in[0][lin];
  }
}

/* outer x D x inner views of a shape around dim */
static void around(const int64_t *shape, int nd, int dim, int64_t *outer, int64_t *inner) {
  *outer = 1;
  *inner = 1;
  for (int d = 0; d < dim; d++) *outer *= shape[d];
  for (int d = dim + 1; d < nd; d++) *inner *= shape[d];
}

static void ref_split(const oc_case *c, double *const *in, double *const *out) {
  int nd = c->ndim[0], dim = ndim_norm(c->iarg[0], nd);
  int64_t outer, inner, D = c->shape[0][dim];
  around(c->shape[0], nd, dim, &outer, &inner);
  int64_t off = 0;
  for (int j = 0; j < c->nout; j++) {
    int64_t L = c->sizes[j];
    for (int64_t o = 0; o < outer; o++)
      for (int64_t t = 0; t < L; t++)
        for (int64_t i = 0; i < inner; i++)
          out[j][(o * L + t) * inner + i] = in[0][(o * D + off + t) * inner + i];
    off += L;
  }
}

static void ref_cat(const oc_case *c, double *const *in, double *const *out) {
  int nd = c->ndim[0], dim = ndim_norm(c->iarg[0], nd);
  int64_t outer, inner, D = c->oshape[0][dim];
  around(c->oshape[0], nd, dim, &outer, &inner);
  int64_t off = 0;
  for (int a = 0; a < c->nin; a++) {
    int64_t L = c->shape[a][dim];
    for (int64_t o = 0; o < outer; o++)
      for (int64_t t = 0; t < L; t++)
        for (int64_t i = 0; i < inner; i++)
          out[0][(o * D + off + t) * inner + i] = in[a][(o * L + t) * inner + i];
    off += L;
  }
}

static void ref_reduce(const oc_case *c, double *const *in, double *const *out) {
  int nd = c->ndim[0], dim = ndim_norm(c->iarg[0], nd);
  int64_t outer, inner, D = c->shape[0][dim];
  around(c->shape[0], nd, dim, &outer, &inner);
  for (int64_t o = 0; o < outer; o++)
    for (int64_t i = 0; i < inner; i++) {
      double s = 0;
      for (int64_t t = 0; t < D; t++) s += in[0][(o * D + t) * inner + i];
      out[0][o * inner + i] = c->iarg[2] ? s / (double)D : s;
    }
}

static void ref_add(const oc_case *c, double *const *in, double *const *out) {
  int64_t n = ne_in(c, 0), nb = ne_in(c, 1);
  for (int64_t i = 0; i < n; i++) out[0][i] = in[0][i] + in[1][i % nb];
}

static void ref_mul(const oc_case *c, double *const *in, double *const *out) {
  int64_t n = ne_in(c, 0);
  for (int64_t i = 0; i < n; i++) out[0][i] = in[0][i] * in[1][i];
}

static void ref_scale(const oc_case *c, double *const *in, double *const *out) {
  int64_t n = ne_in(c, 0);
  for (int64_t i = 0; i < n; i++) out[0][i] = c->farg * in[0][i];
}

/* ------------------------------------------------------------------ runs */

static weft_status run_matmul(const oc_case *c, weft_var *const *in, weft_var **out) {
  (void)c;
  return weft_op_matmul(in[0], in[1], out);
}
static weft_status run_linear(const oc_case *c, weft_var *const *in, weft_var **out) {
  return weft_op_linear(in[0], in[1], c->nin > 2 ? in[2] : NULL, out);
}
static weft_status run_reshape(const oc_case *c, weft_var *const *in, weft_var **out) {
  return weft_op_reshape(in[0], c->iarg[0], c->sizes, out);
}
static weft_status run_transpose(const oc_case *c, weft_var *const *in, weft_var **out) {
  return weft_op_transpose(in[0], c->iarg[0], c->iarg[1], out);
}
static weft_status run_split(const oc_case *c, weft_var *const *in, weft_var **out) {
  return weft_op_split(in[0], c->iarg[0], c->nout, c->sizes, out);
}
static weft_status run_cat(const oc_case *c, weft_var *const *in, weft_var **out) {
  return weft_op_cat(in, c->nin, c->iarg[0], out);
}
static weft_status run_reduce(const oc_case *c, weft_var *const *in, weft_var **out) {
  return c->iarg[2] ? weft_op_mean(in[0], c->iarg[0], c->iarg[1] != 0, out)
                    : weft_op_sum(in[0], c->iarg[0], c->iarg[1] != 0, out);
}
static weft_status run_add(const oc_case *c, weft_var *const *in, weft_var **out) {
  (void)c;
  return weft_op_add(in[0], in[1], out);
}
static weft_status run_mul(const oc_case *c, weft_var *const *in, weft_var **out) {
  (void)c;
  return weft_op_mul(in[0], in[1], out);
}
static weft_status run_scale(const oc_case *c, weft_var *const *in, weft_var **out) {
  return weft_op_scale(in[0], c->farg, out);
}

/* ----------------------------------------------------------------- cases */

#define S(...) \
  { __VA_ARGS__ }
const oc_case oc_cases[] = {
    {.name = "matmul",
     .nin = 2,
     .ndim = {3, 2},
     .shape = {S(2, 3, 4), S(4, 5)},
     .nout = 1,
     .ondim = {3},
     .oshape = {S(2, 3, 5)},
     .ref = ref_matmul,
     .run = run_matmul},
    {.name = "matmul_2d",
     .nin = 2,
     .ndim = {2, 2},
     .shape = {S(3, 4), S(4, 6)},
     .nout = 1,
     .ondim = {2},
     .oshape = {S(3, 6)},
     .ref = ref_matmul,
     .run = run_matmul},
    {.name = "reshape_split_heads",
     .nin = 1,
     .ndim = {3},
     .shape = {S(2, 3, 8)},
     .nout = 1,
     .ondim = {4},
     .oshape = {S(2, 3, 2, 4)},
     .iarg = {4},
     .sizes = {2, 3, 2, 4},
     .ref = ref_copy,
     .run = run_reshape},
    {.name = "reshape_split_heads4",
     .nin = 1,
     .ndim = {3},
     .shape = {S(2, 3, 16)},
     .nout = 1,
     .ondim = {4},
     .oshape = {S(2, 3, 4, 4)},
     .iarg = {4},
     .sizes = {2, 3, 4, 4},
     .ref = ref_copy,
     .run = run_reshape},
    {.name = "reshape_merge_heads",
     .nin = 1,
     .ndim = {4},
     .shape = {S(2, 3, 2, 4)},
     .nout = 1,
     .ondim = {3},
     .oshape = {S(2, 3, 8)},
     .iarg = {3},
     .sizes = {2, 3, 8},
     .ref = ref_copy,
     .run = run_reshape},
    {.name = "reshape_flatten",
     .nin = 1,
     .ndim = {3},
     .shape = {S(2, 3, 8)},
     .nout = 1,
     .ondim = {2},
     .oshape = {S(6, 8)},
     .iarg = {2},
     .sizes = {-1, 8},
     .ref = ref_copy,
     .run = run_reshape},
    {.name = "reshape_regroup",
     .nin = 1,
     .ndim = {3},
     .shape = {S(2, 6, 4)},
     .nout = 1,
     .ondim = {3},
     .oshape = {S(2, 4, 6)},
     .iarg = {3},
     .sizes = {2, 4, -1},
     .ref = ref_copy,
     .run = run_reshape},
    {.name = "transpose",
     .nin = 1,
     .ndim = {3},
     .shape = {S(2, 3, 4)},
     .nout = 1,
     .ondim = {3},
     .oshape = {S(2, 4, 3)},
     .iarg = {1, 2},
     .ref = ref_transpose,
     .run = run_transpose},
    {.name = "transpose_heads",
     .nin = 1,
     .ndim = {4},
     .shape = {S(2, 3, 2, 4)},
     .nout = 1,
     .ondim = {4},
     .oshape = {S(2, 2, 3, 4)},
     .iarg = {1, -2},
     .ref = ref_transpose,
     .run = run_transpose},
    {.name = "split_qkv",
     .nin = 1,
     .ndim = {3},
     .shape = {S(2, 3, 12)},
     .nout = 3,
     .ondim = {3, 3, 3},
     .oshape = {S(2, 3, 4), S(2, 3, 4), S(2, 3, 4)},
     .iarg = {-1},
     .sizes = {4, 4, 4},
     .ref = ref_split,
     .run = run_split},
    {.name = "split_uneven",
     .nin = 1,
     .ndim = {3},
     .shape = {S(2, 3, 12)},
     .nout = 2,
     .ondim = {3, 3},
     .oshape = {S(2, 3, 3), S(2, 3, 9)},
     .iarg = {2},
     .sizes = {3, 9},
     .ref = ref_split,
     .run = run_split},
    {.name = "split_dim1",
     .nin = 1,
     .ndim = {3},
     .shape = {S(2, 4, 3)},
     .nout = 2,
     .ondim = {3, 3},
     .oshape = {S(2, 1, 3), S(2, 3, 3)},
     .iarg = {1},
     .sizes = {1, 3},
     .ref = ref_split,
     .run = run_split},
    {.name = "cat_last",
     .nin = 2,
     .ndim = {3, 3},
     .shape = {S(2, 3, 4), S(2, 3, 2)},
     .nout = 1,
     .ondim = {3},
     .oshape = {S(2, 3, 6)},
     .iarg = {-1},
     .ref = ref_cat,
     .run = run_cat},
    {.name = "cat_dim0",
     .nin = 3,
     .ndim = {3, 3, 3},
     .shape = {S(1, 3, 4), S(2, 3, 4), S(1, 3, 4)},
     .nout = 1,
     .ondim = {3},
     .oshape = {S(4, 3, 4)},
     .iarg = {0},
     .ref = ref_cat,
     .run = run_cat},
    {.name = "cat_qkv",
     .nin = 3,
     .ndim = {3, 3, 3},
     .shape = {S(2, 3, 4), S(2, 3, 4), S(2, 3, 4)},
     .nout = 1,
     .ondim = {3},
     .oshape = {S(2, 3, 12)},
     .iarg = {2},
     .ref = ref_cat,
     .run = run_cat},
    {.name = "sum_dim1",
     .nin = 1,
     .ndim = {3},
     .shape = {S(2, 3, 4)},
     .nout = 1,
     .ondim = {2},
     .oshape = {S(2, 4)},
     .iarg = {1, 0, 0},
     .ref = ref_reduce,
     .run = run_reduce},
    {.name = "sum_keepdim_last",
     .nin = 1,
     .ndim = {3},
     .shape = {S(2, 3, 4)},
     .nout = 1,
     .ondim = {3},
     .oshape = {S(2, 3, 1)},
     .iarg = {-1, 1, 0},
     .ref = ref_reduce,
     .run = run_reduce},
    {.name = "mean_last",
     .nin = 1,
     .ndim = {3},
     .shape = {S(2, 3, 4)},
     .nout = 1,
     .ondim = {2},
     .oshape = {S(2, 3)},
     .iarg = {-1, 0, 1},
     .ref = ref_reduce,
     .run = run_reduce},
    {.name = "mean_dim0_keepdim",
     .nin = 1,
     .ndim = {3},
     .shape = {S(3, 2, 4)},
     .nout = 1,
     .ondim = {3},
     .oshape = {S(1, 2, 4)},
     .iarg = {0, 1, 1},
     .ref = ref_reduce,
     .run = run_reduce},
    {.name = "linear",
     .nin = 2,
     .ndim = {3, 2},
     .shape = {S(2, 3, 4), S(6, 4)},
     .nout = 1,
     .ondim = {3},
     .oshape = {S(2, 3, 6)},
     .ref = ref_linear,
     .run = run_linear},
    {.name = "linear_bias",
     .nin = 3,
     .ndim = {3, 2, 1},
     .shape = {S(2, 3, 4), S(6, 4), S(6)},
     .nout = 1,
     .ondim = {3},
     .oshape = {S(2, 3, 6)},
     .ref = ref_linear,
     .run = run_linear},
    {.name = "add",
     .nin = 2,
     .ndim = {3, 3},
     .shape = {S(2, 3, 4), S(2, 3, 4)},
     .nout = 1,
     .ondim = {3},
     .oshape = {S(2, 3, 4)},
     .ref = ref_add,
     .run = run_add},
    {.name = "add_bias",
     .nin = 2,
     .ndim = {3, 1},
     .shape = {S(2, 3, 4), S(4)},
     .nout = 1,
     .ondim = {3},
     .oshape = {S(2, 3, 4)},
     .ref = ref_add,
     .run = run_add},
    {.name = "add_pos",
     .nin = 2,
     .ndim = {3, 2},
     .shape = {S(2, 3, 4), S(3, 4)},
     .nout = 1,
     .ondim = {3},
     .oshape = {S(2, 3, 4)},
     .ref = ref_add,
     .run = run_add},
    {.name = "mul",
     .nin = 2,
     .ndim = {3, 3},
     .shape = {S(2, 3, 4), S(2, 3, 4)},
     .nout = 1,
     .ondim = {3},
     .oshape = {S(2, 3, 4)},
     .ref = ref_mul,
     .run = run_mul},
    {.name = "scale",
     .nin = 1,
     .ndim = {3},
     .shape = {S(2, 3, 4)},
     .nout = 1,
     .ondim = {3},
     .oshape = {S(2, 3, 4)},
     .farg = -1.75,
     .ref = ref_scale,
     .run = run_scale},
    {0},
};
#undef S

const oc_case *oc_find(const char *name) {
  for (const oc_case *c = oc_cases; c->name; c++)
    if (strcmp(c->name, name) == 0) return c;
  return NULL;
}

void oc_random_placements(const oc_case *c, int k, uint64_t *state, weft_placement *pl) {
  for (int a = 0; a < c->nin; a++)
    for (int i = 0; i < k; i++) {
      int nd = c->ndim[a];
      uint64_t r = weft_test_rng_u64(state) % (uint64_t)(nd + 3);
      weft_placement p;
      if (r == 0)
        p = weft_replicate();
      else if (r == 1)
        p = weft_partial(WEFT_OP_SUM);
      else if (r == 2)
        p = weft_strided_shard((int)(weft_test_rng_u64(state) % (uint64_t)nd),
                               2 + (int)(weft_test_rng_u64(state) % 2));
      else
        p = weft_shard((int)(r - 3));
      if (strcmp(c->name, "split_qkv") == 0 && (weft_test_rng_u64(state) & 1))
        p = weft_strided_shard(2, 3);
      pl[a * k + i] = p;
    }
}

void oc_random_grad_placements(int ndim, int k, uint64_t *state, weft_placement *pl) {
  for (int i = 0; i < k; i++) {
    uint64_t r = weft_test_rng_u64(state) % (uint64_t)(ndim + 2);
    pl[i] = r == 0   ? weft_replicate()
            : r == 1 ? weft_partial(WEFT_OP_SUM)
                     : weft_shard((int)(r - 2));
  }
}

/* -------------------------------------------------------------- checking */

#define FAIL(...)                      \
  do {                                 \
    fprintf(stderr, "[%s] ", c->name); \
    fprintf(stderr, __VA_ARGS__);      \
    fprintf(stderr, "\n");             \
    fails++;                           \
  } while (0)

/* A DTensor of global values v (doubles, f32-exact) with placements pl
 * (Partial allowed: distributed Replicate, then partitioned). */
static weft_status make_dt(weft_mesh *mesh, const double *v, int nd, const int64_t *shape,
                           const weft_placement *pl, weft_dtensor **out) {
  int k = weft_mesh_ndim(mesh);
  int64_t n = oc_numel(nd, shape);
  weft_tensor *full;
  WEFT_CHECK(weft_tensor_create(WEFT_F32, WEFT_CPU, nd, shape, &full));
  for (int64_t i = 0; i < n; i++) ((float *)full->data)[i] = (float)v[i];
  weft_placement p0[WEFT_MESH_MAX_DIMS];
  bool partial = false;
  for (int i = 0; i < k; i++) {
    p0[i] = pl ? pl[i] : weft_replicate();
    if (p0[i].kind == WEFT_PLACE_PARTIAL) {
      p0[i] = weft_replicate();
      partial = true;
    }
  }
  weft_dtensor *d;
  weft_status st = weft_dtensor_distribute(mesh, full, WEFT_DTENSOR_ALL_RANKS, p0, k, &d);
  weft_tensor_destroy(full);
  if (st != WEFT_OK) return st;
  if (partial) {
    weft_redistribute_opts o = WEFT_REDISTRIBUTE_OPTS_INIT;
    o.allow_partial = true;
    weft_dtensor *e;
    st = weft_dtensor_redistribute_ex(d, pl, k, &o, &e);
    weft_dtensor_destroy(d);
    if (st != WEFT_OK) return st;
    d = e;
  }
  *out = d;
  return WEFT_OK;
}

/* The full tensor of d as host floats; on a device mesh the full tensor is
 * copied to the host first (the runs read numbers only on the host). */
static float *full_floats(const weft_dtensor *d) {
  weft_tensor *f = NULL;
  if (weft_dtensor_full_tensor(d, &f) != WEFT_OK) return NULL;
  if (f->device != WEFT_CPU) {
    weft_tensor *h = NULL;
    weft_status st = weft_tensor_to(f, WEFT_CPU, &h);
    weft_tensor_destroy(f);
    if (st != WEFT_OK) return NULL;
    f = h;
  }
  int64_t n = weft_tensor_numel(f);
  float *r = malloc(sizeof(float) * (size_t)(n ? n : 1));
  if (r && n) memcpy(r, f->data, sizeof(float) * (size_t)n);
  weft_tensor_destroy(f);
  return r;
}

static double loss_of(const oc_case *c, double *const *out, double *const *R, int mode) {
  double L = 0;
  for (int j = 0; j < c->nout; j++) {
    if (mode >= 0 && j != mode) continue;
    const double *r = R[j];
    double w = mode >= 0 ? 1.0 : (double)(j + 1), s = 0;
    for (int64_t i = 0; i < ne_out(c, j); i++) s += out[j][i] * r[i];
    L += w * s;
  }
  return L;
}

static int compare(const oc_case *c, const char *what, const float *got, const double *want,
                   int64_t n, double tol) {
  int fails = 0;
  for (int64_t i = 0; i < n; i++) {
    double e = fabs((double)got[i] - want[i]);
    if (!(e <= tol * (1.0 + fabs(want[i])))) {
      FAIL("%s[%lld]: got %.9g want %.9g", what, (long long)i, (double)got[i], want[i]);
      if (fails > 4) break;
    }
  }
  return fails;
}

int oc_run(const oc_case *c, weft_mesh *mesh, const weft_placement *pl, const weft_placement *gpl,
           int mode, uint64_t seed, double tol, oc_result *res) {
  int fails = 0, k = weft_mesh_ndim(mesh);
  if (res) memset(res, 0, sizeof *res);
  uint64_t s = weft_test_rng_state(seed);
  double *in[OC_MAX_IN] = {0}, *out[OC_MAX_OUT] = {0}, *R[OC_MAX_OUT] = {0};
  for (int a = 0; a < c->nin; a++) {
    in[a] = malloc(sizeof(double) * (size_t)ne_in(c, a));
    fill_random(in[a], ne_in(c, a), &s);
  }
  for (int j = 0; j < c->nout; j++) {
    out[j] = malloc(sizeof(double) * (size_t)ne_out(c, j));
    R[j] = malloc(sizeof(double) * (size_t)ne_out(c, j));
    fill_random(R[j], ne_out(c, j), &s);
  }
  c->ref(c, in, out);

  weft_graph *g = NULL;
  weft_dtensor *dts[OC_MAX_IN] = {0}, *rdt = NULL;
  weft_var *vin[OC_MAX_IN] = {0}, *vout[OC_MAX_OUT] = {0};
  weft_status st = weft_graph_create(&g);
  for (int a = 0; st == WEFT_OK && a < c->nin; a++)
    st = make_dt(mesh, in[a], c->ndim[a], c->shape[a], pl ? pl + a * k : NULL, &dts[a]);
  for (int a = 0; st == WEFT_OK && a < c->nin; a++) st = weft_graph_input(g, dts[a], true, &vin[a]);
  if (st == WEFT_OK) st = c->run(c, vin, vout);
  if (st != WEFT_OK) {
    FAIL("forward: %s", weft_last_error());
    goto done;
  }
  for (int j = 0; j < c->nout; j++) {
    const weft_dtensor *y = weft_var_value(vout[j]);
    bool shape_ok = weft_dtensor_ndim(y) == c->ondim[j];
    for (int d = 0; shape_ok && d < c->ondim[j]; d++)
      shape_ok = weft_dtensor_shape(y)[d] == c->oshape[j][d];
    if (!shape_ok) {
      FAIL("output %d has the wrong shape", j);
      goto done;
    }
    float *f = full_floats(y);
    char what[32];
    snprintf(what, sizeof what, "out%d", j);
    if (!f)
      FAIL("full_tensor of output %d: %s", j, weft_last_error());
    else
      fails += compare(c, what, f, out[j], ne_out(c, j), tol);
    if (res) {
      res->out[j] = f;
      memcpy(res->opl[j], weft_dtensor_placements(y), sizeof(weft_placement) * (size_t)k);
    } else {
      free(f);
    }
  }
  /* backward */
  weft_var *root = mode >= 0 ? vout[mode] : vout[0];
  int rj = mode >= 0 ? mode : 0;
  if (mode < 0 && c->nout > 1) {
    /* several outputs (split): root = cat_j((j+1) out_j) along the split
     * dim, its grad the cat of the R_j */
    weft_var *sc[OC_MAX_OUT];
    for (int j = 0; st == WEFT_OK && j < c->nout; j++)
      st = weft_op_scale(vout[j], (double)(j + 1), &sc[j]);
    if (st == WEFT_OK) st = weft_op_cat(sc, c->nout, c->iarg[0], &root);
    /* the cat's shape: output 0's with the cat dim summed over the outputs
     * (a split's input shape) */
    oc_case cc = {.name = "grad cat", .nin = c->nout, .nout = 1, .ondim = {c->ondim[0]}};
    int cd = ndim_norm(c->iarg[0], c->ondim[0]);
    memcpy(cc.oshape[0], c->oshape[0], sizeof cc.oshape[0]);
    cc.oshape[0][cd] = 0;
    for (int j = 0; j < c->nout; j++) {
      cc.ndim[j] = c->ondim[j];
      memcpy(cc.shape[j], c->oshape[j], sizeof cc.shape[j]);
      cc.oshape[0][cd] += c->oshape[j][cd];
    }
    cc.iarg[0] = c->iarg[0];
    double *rc = malloc(sizeof(double) * (size_t)ne_out(&cc, 0));
    ref_cat(&cc, R, &rc);
    if (st == WEFT_OK) st = make_dt(mesh, rc, cc.ondim[0], cc.oshape[0], gpl, &rdt);
    free(rc);
  } else if (st == WEFT_OK) {
    st = make_dt(mesh, R[rj], c->ondim[rj], c->oshape[rj], gpl, &rdt);
  }
  if (st == WEFT_OK) st = weft_backward_grad(root, rdt);
  if (st != WEFT_OK) {
    FAIL("backward: %s", weft_last_error());
    goto done;
  }
  const double h = c->fd_h > 0 ? c->fd_h : 1.0 / 64;
  for (int a = 0; a < c->nin; a++) {
    int64_t n = ne_in(c, a);
    double *fd = malloc(sizeof(double) * (size_t)n);
    for (int64_t e = 0; e < n; e++) {
      double v = in[a][e];
      in[a][e] = v + h;
      c->ref(c, in, out);
      double lp = loss_of(c, out, R, mode);
      in[a][e] = v - h;
      c->ref(c, in, out);
      double lm = loss_of(c, out, R, mode);
      in[a][e] = v;
      fd[e] = (lp - lm) / (2 * h);
    }
    const weft_dtensor *gr = weft_var_grad(vin[a]);
    if (!gr) {
      FAIL("input %d got no grad", a);
    } else {
      float *f = full_floats(gr);
      char what[32];
      snprintf(what, sizeof what, "grad%d", a);
      if (!f)
        FAIL("full_tensor of grad %d: %s", a, weft_last_error());
      else
        fails += compare(c, what, f, fd, n, tol);
      if (res)
        res->grad[a] = f;
      else
        free(f);
    }
    free(fd);
  }
done:
  weft_graph_destroy(g);
  weft_dtensor_destroy(rdt);
  for (int a = 0; a < c->nin; a++) {
    weft_dtensor_destroy(dts[a]);
    free(in[a]);
  }
  for (int j = 0; j < c->nout; j++) {
    free(out[j]);
    free(R[j]);
  }
  return fails;
}

void oc_result_free(const oc_case *c, oc_result *r) {
  for (int j = 0; j < c->nout; j++) free(r->out[j]);
  for (int a = 0; a < c->nin; a++) free(r->grad[a]);
  memset(r, 0, sizeof *r);
}

weft_status oc_one_rank_mesh(bool on_device, weft_mesh **out) {
  int argc = 0;
  char **argv = NULL;
  WEFT_CHECK(weft_init(&argc, &argv));
  int shape[1] = {1};
  const char *names[1] = {"tp"};
  WEFT_CHECK(weft_mesh_create(1, shape, names, out));
  if (on_device) WEFT_CHECK(weft_mesh_set_device(*out, WEFT_CUDA));
  return WEFT_OK;
}

weft_status oc_full_values(const weft_dtensor *d, double **out, int64_t *n) {
  weft_tensor *full = NULL, *host = NULL, *f64 = NULL;
  weft_status st = weft_dtensor_full_tensor(d, &full);
  if (st == WEFT_OK) st = weft_tensor_to(full, WEFT_CPU, &host);
  if (st == WEFT_OK) st = weft_tensor_create(WEFT_F64, WEFT_CPU, host->ndim, host->shape, &f64);
  if (st == WEFT_OK) st = weft_tensor_copy(f64, host);
  if (st == WEFT_OK) {
    *n = weft_tensor_numel(f64);
    *out = malloc(sizeof(double) * (size_t)(*n > 0 ? *n : 1));
    if (*out)
      memcpy(*out, f64->data, sizeof(double) * (size_t)*n);
    else
      st = weft_error(WEFT_ERR_OOM, "oc_full_values: %lld doubles", (long long)*n);
  }
  weft_tensor_destroy(full);
  weft_tensor_destroy(host);
  weft_tensor_destroy(f64);
  return st;
}
