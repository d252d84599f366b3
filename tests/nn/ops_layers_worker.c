/* tests/nn/ops_layers_worker.c — MPI worker of tests/nn/test_ops_layers.c:
 * the layer ops of autograd.h (nn/ops_layers.c) against double-precision
 * references. Every case builds its inputs on the host, runs the op in a
 * graph, compares the output with the reference and the input grads of
 * sum(out * R) (weft_backward_grad with a random R) with central finite
 * differences of the reference. Case "ops1" runs on a 1-rank mesh, "ops2"
 * on a 2-rank mesh with sharded inputs (the same references: a sharded
 * run must give the unsharded result).
 *
 * Device mode (WEFT_TEST_DEVICE=cuda): the mesh is put on WEFT_CUDA as it
 * is made (weft_worker_mesh_on_device), inputs are distributed from host
 * tensors and results are read through host copies (weft_worker_host_copy),
 * with the same references and tolerances. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd.h"
#include "worker.h"

#define MAXIN 4

/* ------------------------------------------------------------- helpers */

static uint64_t rng_state = 0x243f6a8885a308d3ULL;
static double urand(void) { /* [0, 1) */
  rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
  return (double)(rng_state >> 11) * (1.0 / 9007199254740992.0);
}
static double srand1(void) { return (double)(float)(2.0 * urand() - 1.0); } /* [-1, 1), f32 */

static int64_t numel(int ndim, const int64_t *shape) {
  int64_t n = 1;
  for (int d = 0; d < ndim; d++) n *= shape[d];
  return n;
}

/* A DTensor on mesh (1-D) from host values, distributed with placement pl. */
static weft_dtensor *mk_dt(weft_mesh *mesh, weft_dtype dt, int ndim, const int64_t *shape,
                           const double *h, weft_placement pl) {
  weft_tensor *full = NULL;
  weft_dtensor *out = NULL;
  if (weft_tensor_create(dt, WEFT_CPU, ndim, shape, &full) != WEFT_OK) return NULL;
  int64_t n = numel(ndim, shape);
  for (int64_t i = 0; i < n; i++) {
    if (dt == WEFT_I32)
      ((int32_t *)full->data)[i] = (int32_t)h[i];
    else
      ((float *)full->data)[i] = (float)h[i];
  }
  /* a Partial(sum) input: distributed Replicate, then partitioned */
  weft_placement dpl = pl.kind == WEFT_PLACE_PARTIAL ? weft_replicate() : pl;
  weft_status st = weft_dtensor_distribute(mesh, full, WEFT_DTENSOR_ALL_RANKS, &dpl, 1, &out);
  WCHECK(st == WEFT_OK, "distribute: %s", weft_last_error());
  weft_tensor_destroy(full);
  if (st == WEFT_OK && pl.kind == WEFT_PLACE_PARTIAL) {
    weft_redistribute_opts o = WEFT_REDISTRIBUTE_OPTS_INIT;
    o.allow_partial = true;
    weft_dtensor *p = NULL;
    WOK(weft_dtensor_redistribute_ex(out, &pl, 1, &o, &p));
    weft_dtensor_destroy(out);
    out = p;
  }
  return out;
}

/* The full value of a DTensor as doubles (collective). */
static double *fetch(const weft_dtensor *d, int64_t *n) {
  weft_tensor *full = NULL;
  weft_status st = weft_dtensor_full_tensor(d, &full);
  WCHECK(st == WEFT_OK, "full_tensor: %s", weft_last_error());
  if (st != WEFT_OK) return NULL;
  *n = weft_tensor_numel(full);
  weft_tensor *tmp = NULL;
  const weft_tensor *hf = weft_worker_host_copy(full, &tmp);
  double *h = hf ? calloc((size_t)(*n > 0 ? *n : 1), sizeof(double)) : NULL;
  for (int64_t i = 0; h && i < *n; i++)
    h[i] = hf->dtype == WEFT_BF16 ? weft_bf16_to_f32(((const uint16_t *)hf->data)[i])
                                  : ((const float *)hf->data)[i];
  weft_tensor_destroy(tmp);
  weft_tensor_destroy(full);
  return h;
}

/* ------------------------------------------------------ the case runner */

/* When set, the placement every case's output must have (the sharding rule
 * kept the inputs' sharding instead of replicating them). */
static const weft_placement *expect_pl;

typedef struct opcase {
  const char *name;
  int nin;
  int ndim[MAXIN];
  int64_t shape[MAXIN][5];
  bool absent[MAXIN]; /* the op gets a NULL var there */
  bool isint[MAXIN];  /* int32 values from gen */
  bool grad[MAXIN];
  weft_placement pl[MAXIN]; /* placement on the 1-D mesh (zero: Replicate) */
  int out_ndim;
  int64_t out_shape[5];
  weft_status (*run)(weft_var *const *in, weft_var **out, const void *ctx);
  void (*ref)(double *const *in, double *out, const void *ctx);
  void (*gen)(int i, double *h, int64_t n); /* optional: values of input i */
  const void *ctx;
  double fwd_tol, bwd_tol;
  bool chain; /* run() is more than one op (a bf16 rounding in between) */
} opcase;

static bool verbose; /* OPS_VERBOSE=1: print every error measured */

/* Cases "bf16_1" / "bf16_2": every float input and the output grad R hold
 * bf16 values, and after the f32 checks the op runs again on the same
 * values as bf16 DTensors (autograd.h "dtypes"). Its output and input
 * grads must be bf16. The output of a single op must equal the f32 run's
 * rounded to bf16 (bitwise on the CPU; within one bf16 step on a device,
 * whose f32 sums may differ in the last bit between runs). Grads, and
 * outputs of the cases that scale their input first (a bf16 rounding in
 * between), use what PyTorch's bf16 backward uses (bf16 saved inputs and
 * outputs, bf16 intermediate grads), so they must agree with the f32 run
 * only to bf16 precision: largest error within 1/64 of the largest value. */
static bool bf16_mode;
static double bf16r(double x) { return weft_bf16_to_f32(weft_f32_to_bf16((float)x)); }

/* A DTensor with d's spec but dtype dt, holding d's local values converted. */
static weft_dtensor *as_dtype(const weft_dtensor *d, weft_dtype dt) {
  const weft_dtensor_spec *s = weft_dtensor_get_spec(d);
  weft_dtensor *o = NULL;
  WOK(weft_dtensor_empty(weft_dtensor_mesh(d), dt, s->ndim, s->shape, s->placements, s->mesh_ndim,
                         &o));
  if (o) WOK(weft_tensor_copy(weft_dtensor_local(o), weft_dtensor_local(d)));
  return o;
}

/* `got` (a bf16 var's value or grad) against `want` (the f32 run's):
 * bitwise equal to it rounded when `rounded`, else to bf16 precision. */
static void bf16_compare(const char *what, const char *name, const weft_dtensor *got,
                         const weft_dtensor *want, bool rounded) {
  WCHECK(weft_dtensor_dtype(got) == WEFT_BF16, "%s: bf16 %s is %s", name, what,
         weft_dtype_name(weft_dtensor_dtype(got)));
  int64_t n1, n2;
  double *a = fetch(got, &n1), *b = fetch(want, &n2);
  WCHECK(a && b && n1 == n2, "%s: bf16 %s: %lld elements, f32 %lld", name, what, (long long)n1,
         (long long)n2);
  if (a && b && n1 == n2 && rounded) {
    bool exact = weft_dtensor_local(got)->device == WEFT_CPU;
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < n1; i++) {
      double r = bf16r(b[i]);
      bool ok = exact ? a[i] == r : fabs(a[i] - r) <= fabs(r) * (1.0 / 128) + 1e-30;
      if (!ok && first < 0) first = i;
      bad += !ok;
    }
    WCHECK(bad == 0,
           "%s: bf16 %s is not the rounded f32 one at %lld of %lld (first %lld: %g vs %g)", name,
           what, (long long)bad, (long long)n1, (long long)first, first >= 0 ? a[first] : 0.0,
           first >= 0 ? bf16r(b[first]) : 0.0);
  } else if (a && b && n1 == n2) {
    double e = weft_test_rel_max_f64(a, b, n1);
    if (verbose && weft_worker_rank == 0) printf("%-24s bf16 %s rel err %.3g\n", name, what, e);
    WCHECK(e <= 1.0 / 64, "%s: bf16 %s: rel err %.3g > 1/64", name, what, e);
  }
  free(a);
  free(b);
}

/* The bf16 run of case c on the inputs dt (as the f32 run had them). */
static void bf16_twin(const opcase *c, weft_dtensor *const *dt, weft_var *const *v32, weft_var *y32,
                      const weft_dtensor *R32) {
  weft_graph *g = NULL;
  weft_dtensor *lo[MAXIN] = {0}, *R = NULL;
  weft_var *v[MAXIN] = {0}, *y = NULL;
  WOK(weft_graph_create(&g));
  for (int i = 0; i < c->nin; i++) {
    if (!dt[i]) continue;
    lo[i] = c->isint[i] ? NULL : as_dtype(dt[i], WEFT_BF16);
    WOK(weft_graph_input(g, lo[i] ? lo[i] : dt[i], c->grad[i], &v[i]));
  }
  weft_status st = c->run(v, &y, c->ctx);
  WCHECK(st == WEFT_OK && y, "%s (bf16): forward: %s", c->name, weft_last_error());
  if (st == WEFT_OK && y) {
    bf16_compare("output", c->name, weft_var_value(y), weft_var_value(y32), !c->chain);
    R = as_dtype(R32, WEFT_BF16);
    st = weft_backward_grad(y, R);
    WCHECK(st == WEFT_OK, "%s (bf16): backward: %s", c->name, weft_last_error());
    for (int i = 0; st == WEFT_OK && i < c->nin; i++) {
      if (!c->grad[i] || !dt[i]) continue;
      const weft_dtensor *g16 = weft_var_grad(v[i]), *g32 = weft_var_grad(v32[i]);
      WCHECK(g16 && g32, "%s (bf16): input %d has no grad", c->name, i);
      if (g16 && g32) bf16_compare("grad", c->name, g16, g32, false);
    }
  }
  weft_graph_destroy(g);
  weft_dtensor_destroy(R);
  for (int i = 0; i < c->nin; i++) weft_dtensor_destroy(lo[i]);
}

static void run_case(weft_mesh *mesh, const opcase *c) {
  double *h[MAXIN] = {0};
  weft_dtensor *dt[MAXIN] = {0};
  weft_var *v[MAXIN] = {0}, *y = NULL;
  weft_graph *g = NULL;
  int64_t nout = numel(c->out_ndim, c->out_shape);
  double *ref = calloc((size_t)nout, sizeof(double)), *R = calloc((size_t)nout, sizeof(double));
  double *refp = calloc((size_t)nout, sizeof(double));
  weft_dtensor *Rdt = NULL;
  WOK(weft_graph_create(&g));
  for (int i = 0; i < c->nin; i++) {
    if (c->absent[i]) continue;
    int64_t n = numel(c->ndim[i], c->shape[i]);
    h[i] = calloc((size_t)(n > 0 ? n : 1), sizeof(double));
    if (c->gen)
      c->gen(i, h[i], n);
    else
      for (int64_t j = 0; j < n; j++) h[i][j] = srand1();
    if (bf16_mode && !c->isint[i])
      for (int64_t j = 0; j < n; j++) h[i][j] = bf16r(h[i][j]);
    dt[i] = mk_dt(mesh, c->isint[i] ? WEFT_I32 : WEFT_F32, c->ndim[i], c->shape[i], h[i], c->pl[i]);
    if (dt[i]) WOK(weft_graph_input(g, dt[i], c->grad[i], &v[i]));
  }
  weft_status st = c->run(v, &y, c->ctx);
  WCHECK(st == WEFT_OK && y, "%s: forward: %s", c->name, weft_last_error());
  if (st != WEFT_OK || !y) goto done;
  if (expect_pl) {
    weft_placement have = weft_dtensor_placements(weft_var_value(y))[0];
    char a[32], b[32];
    weft_placement_describe(have, a, sizeof a);
    weft_placement_describe(*expect_pl, b, sizeof b);
    WCHECK(weft_placement_equal(have, *expect_pl), "%s: output placement %s, want %s", c->name, a,
           b);
  }
  c->ref(h, ref, c->ctx);
  int64_t n;
  double *got = fetch(weft_var_value(y), &n);
  if (got) {
    WCHECK(n == nout, "%s: output has %lld elements, want %lld", c->name, (long long)n,
           (long long)nout);
    if (n == nout) {
      double e = weft_test_rel_max_f64(got, ref, n);
      if (verbose && weft_worker_rank == 0) printf("%-24s forward rel err %.3g\n", c->name, e);
      WCHECK(e <= c->fwd_tol, "%s: forward rel err %.3g > %.3g", c->name, e, c->fwd_tol);
    }
    free(got);
  }
  /* backward of sum(out * R) */
  for (int64_t j = 0; j < nout; j++) R[j] = bf16_mode ? bf16r(srand1()) : srand1();
  Rdt = mk_dt(mesh, WEFT_F32, c->out_ndim, c->out_shape, R, weft_replicate());
  st = weft_backward_grad(y, Rdt);
  WCHECK(st == WEFT_OK, "%s: backward: %s", c->name, weft_last_error());
  if (st != WEFT_OK) goto done;
  for (int i = 0; i < c->nin; i++) {
    if (!c->grad[i] || c->absent[i]) continue;
    int64_t ni = numel(c->ndim[i], c->shape[i]);
    double *fd = calloc((size_t)(ni > 0 ? ni : 1), sizeof(double));
    const double eps = 1e-5;
    for (int64_t j = 0; j < ni; j++) {
      double x0 = h[i][j], fp = 0, fm = 0;
      h[i][j] = x0 + eps;
      c->ref(h, refp, c->ctx);
      for (int64_t o = 0; o < nout; o++) fp += refp[o] * R[o];
      h[i][j] = x0 - eps;
      c->ref(h, refp, c->ctx);
      for (int64_t o = 0; o < nout; o++) fm += refp[o] * R[o];
      h[i][j] = x0;
      fd[j] = (fp - fm) / (2 * eps);
    }
    const weft_dtensor *gr = weft_var_grad(v[i]);
    WCHECK(gr, "%s: input %d has no grad", c->name, i);
    if (gr) {
      int64_t ng;
      double *gg = fetch(gr, &ng);
      if (gg && ng == ni) {
        double e = weft_test_rel_max_f64(gg, fd, ni);
        if (verbose && weft_worker_rank == 0)
          printf("%-24s grad %d   rel err %.3g\n", c->name, i, e);
        WCHECK(e <= c->bwd_tol, "%s: grad of input %d: rel err %.3g > %.3g", c->name, i, e,
               c->bwd_tol);
      }
      free(gg);
    }
    free(fd);
  }
  if (bf16_mode) bf16_twin(c, dt, v, y, Rdt);
done:
  weft_graph_destroy(g);
  weft_dtensor_destroy(Rdt);
  for (int i = 0; i < c->nin; i++) {
    weft_dtensor_destroy(dt[i]);
    free(h[i]);
  }
  free(ref);
  free(refp);
  free(R);
}

/* ------------------------------------------------------- the references */

typedef struct emb_ctx {
  int64_t N, V, D; /* ids (N) flattened */
} emb_ctx;
static void ref_embedding(double *const *in, double *out, const void *ctx) {
  const emb_ctx *e = ctx;
  for (int64_t n = 0; n < e->N; n++) {
    int64_t id = (int64_t)in[0][n];
    for (int64_t d = 0; d < e->D; d++) out[n * e->D + d] = in[1][id * e->D + d];
  }
}
static void gen_ids(int i, double *h, int64_t n) {
  for (int64_t j = 0; j < n; j++) h[j] = i == 0 ? (double)((j * 5 + 3) % 7) : srand1();
  if (i == 0 && n > 2) h[2] = h[0]; /* a repeated id: its grad rows add up */
}
static weft_status run_embedding(weft_var *const *in, weft_var **out, const void *ctx) {
  (void)ctx;
  return weft_op_embedding(in[0], in[1], out);
}

typedef struct norm_ctx {
  int64_t rows, C;
  double eps;
} norm_ctx;
static void ref_rms(double *const *in, double *out, const void *ctx) {
  const norm_ctx *c = ctx;
  for (int64_t r = 0; r < c->rows; r++) {
    const double *x = in[0] + r * c->C;
    double ss = 0;
    for (int64_t i = 0; i < c->C; i++) ss += x[i] * x[i];
    double rs = 1.0 / sqrt(ss / (double)c->C + c->eps);
    for (int64_t i = 0; i < c->C; i++) out[r * c->C + i] = x[i] * rs * (in[1] ? in[1][i] : 1.0);
  }
}
static void ref_layer(double *const *in, double *out, const void *ctx) {
  const norm_ctx *c = ctx;
  for (int64_t r = 0; r < c->rows; r++) {
    const double *x = in[0] + r * c->C;
    double m = 0, var = 0;
    for (int64_t i = 0; i < c->C; i++) m += x[i];
    m /= (double)c->C;
    for (int64_t i = 0; i < c->C; i++) var += (x[i] - m) * (x[i] - m);
    double rs = 1.0 / sqrt(var / (double)c->C + c->eps);
    for (int64_t i = 0; i < c->C; i++)
      out[r * c->C + i] = (x[i] - m) * rs * (in[1] ? in[1][i] : 1.0) + (in[2] ? in[2][i] : 0.0);
  }
}
static weft_status run_rms(weft_var *const *in, weft_var **out, const void *ctx) {
  return weft_op_rms_norm(in[0], in[1], (float)((const norm_ctx *)ctx)->eps, out);
}
static weft_status run_layer(weft_var *const *in, weft_var **out, const void *ctx) {
  return weft_op_layer_norm(in[0], in[1], in[2], (float)((const norm_ctx *)ctx)->eps, out);
}

typedef struct act_ctx {
  int kind; /* 0 gelu tanh, 1 gelu erf, 2 relu, 3 silu */
  int64_t n;
} act_ctx;
static double act(int kind, double x) {
  switch (kind) {
    case 0:
      return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
    case 1:
      return 0.5 * x * (1 + erf(x / sqrt(2.0)));
    case 2:
      return x > 0 ? x : 0;
    default:
      return x / (1 + exp(-x));
  }
}
static void ref_act(double *const *in, double *out, const void *ctx) {
  const act_ctx *a = ctx;
  for (int64_t i = 0; i < a->n; i++) out[i] = act(a->kind, 3 * in[0][i]);
}
/* values in [-3, 3) away from 0 (relu's kink) */
static void gen_act(int i, double *h, int64_t n) {
  (void)i;
  for (int64_t j = 0; j < n; j++) {
    double x = srand1();
    if (fabs(x) < 0.05) x += x < 0 ? -0.1 : 0.1;
    h[j] = (double)(float)x;
  }
}
static weft_status run_act(weft_var *const *in, weft_var **out, const void *ctx) {
  const act_ctx *a = ctx;
  /* inputs scaled by 3 through weft_op_scale: a wider range of the curve */
  weft_var *x3;
  WEFT_CHECK(weft_op_scale(in[0], 3.0, &x3));
  switch (a->kind) {
    case 0:
      return weft_op_gelu(x3, true, out);
    case 1:
      return weft_op_gelu(x3, false, out);
    case 2:
      return weft_op_relu(x3, out);
    default:
      return weft_op_silu(x3, out);
  }
}

static void ref_swiglu(double *const *in, double *out, const void *ctx) {
  int64_t n = *(const int64_t *)ctx;
  for (int64_t i = 0; i < n; i++) out[i] = act(3, 2 * in[0][i]) * in[1][i];
}
static weft_status run_swiglu(weft_var *const *in, weft_var **out, const void *ctx) {
  (void)ctx;
  weft_var *a2;
  WEFT_CHECK(weft_op_scale(in[0], 2.0, &a2));
  return weft_op_swiglu(a2, in[1], out);
}

static void ref_softmax(double *const *in, double *out, const void *ctx) {
  const norm_ctx *c = ctx;
  for (int64_t r = 0; r < c->rows; r++) {
    const double *x = in[0] + r * c->C;
    double m = -INFINITY, s = 0;
    for (int64_t i = 0; i < c->C; i++) m = fmax(m, 4 * x[i]);
    for (int64_t i = 0; i < c->C; i++) s += exp(4 * x[i] - m);
    for (int64_t i = 0; i < c->C; i++) out[r * c->C + i] = exp(4 * x[i] - m) / s;
  }
}
static weft_status run_softmax(weft_var *const *in, weft_var **out, const void *ctx) {
  (void)ctx;
  weft_var *x4;
  WEFT_CHECK(weft_op_scale(in[0], 4.0, &x4));
  return weft_op_softmax(x4, out);
}

typedef struct rope_ctx {
  int64_t B, T, NH, hd, pos0;
  double theta;
} rope_ctx;
static void ref_rope(double *const *in, double *out, const void *ctx) {
  const rope_ctx *c = ctx;
  for (int64_t b = 0; b < c->B; b++)
    for (int64_t t = 0; t < c->T; t++)
      for (int64_t h = 0; h < c->NH; h++)
        for (int64_t j = 0; j < c->hd / 2; j++) {
          int64_t o = ((b * c->T + t) * c->NH + h) * c->hd + 2 * j;
          double f = pow(c->theta, -2.0 * (double)j / (double)c->hd);
          double a = (double)(c->pos0 + t) * f, cs = cos(a), sn = sin(a);
          double x0 = in[0][o], x1 = in[0][o + 1];
          out[o] = x0 * cs - x1 * sn;
          out[o + 1] = x0 * sn + x1 * cs;
        }
}
static weft_status run_rope(weft_var *const *in, weft_var **out, const void *ctx) {
  const rope_ctx *c = ctx;
  return weft_op_rope(in[0], c->theta, c->pos0, out);
}

typedef struct sdpa_ctx {
  int64_t B, T, H, Hkv, hd;
  bool noncausal; /* every query sees all T keys (default: causal) */
} sdpa_ctx;
static void ref_sdpa(double *const *in, double *out, const void *ctx) {
  const sdpa_ctx *c = ctx;
  int64_t T = c->T, hd = c->hd, grp = c->H / c->Hkv;
  double sc = 1.0 / sqrt((double)hd), p[64];
  for (int64_t b = 0; b < c->B; b++)
    for (int64_t h = 0; h < c->H; h++) {
      int64_t kh = h / grp;
      for (int64_t t = 0; t < T; t++) {
        const double *q = in[0] + ((b * T + t) * c->H + h) * hd;
        const int64_t nk = c->noncausal ? T : t + 1; /* keys seen */
        double m = -INFINITY, s = 0;
        for (int64_t j = 0; j < nk; j++) {
          const double *k = in[1] + ((b * T + j) * c->Hkv + kh) * hd;
          double d = 0;
          for (int64_t e = 0; e < hd; e++) d += q[e] * k[e];
          p[j] = d * sc;
          m = fmax(m, p[j]);
        }
        for (int64_t j = 0; j < nk; j++) s += (p[j] = exp(p[j] - m));
        double *o = out + ((b * T + t) * c->H + h) * hd;
        for (int64_t e = 0; e < hd; e++) {
          double a = 0;
          for (int64_t j = 0; j < nk; j++)
            a += p[j] / s * in[2][((b * T + j) * c->Hkv + kh) * hd + e];
          o[e] = a;
        }
      }
    }
}
static weft_status run_sdpa(weft_var *const *in, weft_var **out, const void *ctx) {
  const sdpa_ctx *c = ctx;
  weft_var *q2;
  WEFT_CHECK(weft_op_scale(in[0], 2.0, &q2)); /* sharper attention */
  return weft_op_sdpa(q2, in[1], in[2], !c->noncausal, out);
}
static void ref_sdpa2(double *const *in, double *out, const void *ctx) {
  const sdpa_ctx *c = ctx;
  int64_t nq = c->B * c->T * c->H * c->hd;
  double *q2 = malloc((size_t)nq * sizeof(double));
  for (int64_t i = 0; i < nq; i++) q2[i] = 2 * in[0][i];
  double *ins[3] = {q2, in[1], in[2]};
  ref_sdpa(ins, out, ctx);
  free(q2);
}

typedef struct ce_ctx {
  int64_t N, V;
  const int32_t *t;
  int32_t ignore;
  const weft_dtensor *targets;
} ce_ctx;
static void ref_ce(double *const *in, double *out, const void *ctx) {
  const ce_ctx *c = ctx;
  double s = 0;
  int64_t cnt = 0;
  for (int64_t n = 0; n < c->N; n++) {
    if (c->t[n] == c->ignore) continue;
    const double *x = in[0] + n * c->V;
    double m = -INFINITY, z = 0;
    for (int64_t v = 0; v < c->V; v++) m = fmax(m, 3 * x[v]);
    for (int64_t v = 0; v < c->V; v++) z += exp(3 * x[v] - m);
    s += m + log(z) - 3 * x[c->t[n]];
    cnt++;
  }
  out[0] = s / (double)cnt;
}
static weft_status run_ce(weft_var *const *in, weft_var **out, const void *ctx) {
  const ce_ctx *c = ctx;
  weft_var *x3;
  WEFT_CHECK(weft_op_scale(in[0], 3.0, &x3));
  return weft_op_cross_entropy(x3, c->targets, c->ignore, out);
}

/* ----------------------------------------------------------- the cases */

#define F 1e-5 /* forward: f32 against double */
#define G 2e-5 /* grads against finite differences of the double reference */

/* pl: the placement of the first input ("sharded" runs); pl_w: of the
 * weight-like second input. */
static void cases_embedding(weft_mesh *mesh, weft_placement pids, weft_placement pw) {
  static const emb_ctx e = {6, 7, 5};
  opcase c = {.name = "embedding",
              .nin = 2,
              .ndim = {2, 2},
              .shape = {{2, 3}, {7, 5}},
              .isint = {true, false},
              .grad = {false, true},
              .pl = {pids, pw},
              .out_ndim = 3,
              .out_shape = {2, 3, 5},
              .run = run_embedding,
              .ref = ref_embedding,
              .gen = gen_ids,
              .ctx = &e,
              .fwd_tol = 1e-7,
              .bwd_tol = 1e-6};
  run_case(mesh, &c);
}

static void cases_norms(weft_mesh *mesh, weft_placement px) {
  static const norm_ctx nc = {10, 8, 1e-5};
  for (int variant = 0; variant < 2; variant++) {
    opcase c = {.name = variant ? "rms_norm (no weight)" : "rms_norm",
                .nin = 2,
                .ndim = {3, 1},
                .shape = {{2, 5, 8}, {8}},
                .absent = {false, variant == 1},
                .grad = {true, true},
                .pl = {px},
                .out_ndim = 3,
                .out_shape = {2, 5, 8},
                .run = run_rms,
                .ref = ref_rms,
                .ctx = &nc,
                .fwd_tol = F,
                .bwd_tol = G};
    run_case(mesh, &c);
  }
  for (int variant = 0; variant < 3; variant++) {
    opcase c = {.name = "layer_norm",
                .nin = 3,
                .ndim = {3, 1, 1},
                .shape = {{2, 5, 8}, {8}, {8}},
                .grad = {true, true, true},
                .pl = {px},
                .out_ndim = 3,
                .out_shape = {2, 5, 8},
                .run = run_layer,
                .ref = ref_layer,
                .ctx = &nc,
                .fwd_tol = F,
                .bwd_tol = G};
    if (variant == 1) c.name = "layer_norm (no bias)", c.absent[2] = true;
    if (variant == 2) c.name = "layer_norm (no affine)", c.absent[1] = c.absent[2] = true;
    run_case(mesh, &c);
  }
}

static void cases_pointwise(weft_mesh *mesh, weft_placement px) {
  static const char *const names[4] = {"gelu tanh", "gelu erf", "relu", "silu"};
  static act_ctx ac[4];
  for (int k = 0; k < 4; k++) {
    ac[k] = (act_ctx){k, 4 * 7};
    opcase c = {.name = names[k],
                .nin = 1,
                .ndim = {2},
                .shape = {{4, 7}},
                .grad = {true},
                .pl = {px},
                .out_ndim = 2,
                .out_shape = {4, 7},
                .run = run_act,
                .ref = ref_act,
                .gen = gen_act,
                .ctx = &ac[k],
                .chain = true,
                .fwd_tol = F,
                .bwd_tol = G};
    run_case(mesh, &c);
  }
  static const int64_t n = 4 * 7;
  opcase s = {.name = "swiglu",
              .nin = 2,
              .ndim = {2, 2},
              .shape = {{4, 7}, {4, 7}},
              .grad = {true, true},
              .pl = {px, px},
              .out_ndim = 2,
              .out_shape = {4, 7},
              .run = run_swiglu,
              .ref = ref_swiglu,
              .ctx = &n,
              .fwd_tol = F,
              .bwd_tol = G};
  run_case(mesh, &s);
}

static void cases_softmax(weft_mesh *mesh, weft_placement px) {
  static const norm_ctx nc = {6, 6, 0};
  opcase c = {.name = "softmax",
              .nin = 1,
              .ndim = {3},
              .shape = {{2, 3, 6}},
              .grad = {true},
              .pl = {px},
              .out_ndim = 3,
              .out_shape = {2, 3, 6},
              .run = run_softmax,
              .chain = true,
              .ref = ref_softmax,
              .ctx = &nc,
              .fwd_tol = F,
              .bwd_tol = G};
  run_case(mesh, &c);
}

static void cases_rope(weft_mesh *mesh, weft_placement px) {
  static const rope_ctx r0 = {2, 5, 4, 6, 0, 10000.0}, r3 = {2, 5, 4, 6, 3, 500.0};
  const rope_ctx *rs[2] = {&r0, &r3};
  for (int i = 0; i < 2; i++) {
    opcase c = {.name = i ? "rope (pos0 3)" : "rope",
                .nin = 1,
                .ndim = {4},
                .shape = {{2, 5, 4, 6}},
                .grad = {true},
                .pl = {px},
                .out_ndim = 4,
                .out_shape = {2, 5, 4, 6},
                .run = run_rope,
                .ref = ref_rope,
                .ctx = rs[i],
                .fwd_tol = F,
                .bwd_tol = G};
    run_case(mesh, &c);
  }
}

static void cases_sdpa(weft_mesh *mesh, weft_placement px) {
  /* causal, then non-causal (every query sees all T keys) */
  static const sdpa_ctx sc[2] = {{2, 5, 4, 2, 4, false}, {2, 5, 4, 2, 4, true}};
  static const sdpa_ctx mha[2] = {{1, 3, 2, 2, 2, false}, {1, 3, 2, 2, 2, true}};
  for (int nc = 0; nc < 2; nc++) {
    opcase c = {.name = nc ? "sdpa non-causal" : "sdpa",
                .nin = 3,
                .ndim = {4, 4, 4},
                .shape = {{2, 5, 4, 4}, {2, 5, 2, 4}, {2, 5, 2, 4}},
                .grad = {true, true, true},
                .pl = {px, px, px},
                .out_ndim = 4,
                .out_shape = {2, 5, 4, 4},
                .run = run_sdpa,
                .ref = ref_sdpa2,
                .ctx = &sc[nc],
                .fwd_tol = F,
                .bwd_tol = G};
    run_case(mesh, &c);
    opcase d = {.name = nc ? "sdpa non-causal (mha)" : "sdpa (mha)",
                .nin = 3,
                .ndim = {4, 4, 4},
                .shape = {{1, 3, 2, 2}, {1, 3, 2, 2}, {1, 3, 2, 2}},
                .grad = {true, false, true},
                .pl = {px, px, px},
                .out_ndim = 4,
                .out_shape = {1, 3, 2, 2},
                .run = run_sdpa,
                .ref = ref_sdpa2,
                .ctx = &mha[nc],
                .fwd_tol = F,
                .bwd_tol = G};
    run_case(mesh, &d);
  }
}

/* causal and non-causal differ (the flag reaches the kernel): query 0
 * sees key 0 alone when causal, so its output is v's row 0 */
static void case_sdpa_causal_flag(weft_mesh *mesh) {
  int64_t sq[4] = {1, 4, 2, 4};
  double hq[32], hk[32], hv[32];
  for (int i = 0; i < 32; i++) hq[i] = srand1(), hk[i] = srand1(), hv[i] = srand1();
  weft_dtensor *q = mk_dt(mesh, WEFT_F32, 4, sq, hq, weft_replicate()),
               *k = mk_dt(mesh, WEFT_F32, 4, sq, hk, weft_replicate()),
               *v = mk_dt(mesh, WEFT_F32, 4, sq, hv, weft_replicate());
  weft_graph *g;
  WOK(weft_graph_create(&g));
  weft_var *Q, *K, *V, *y[2] = {NULL, NULL};
  WOK(weft_graph_input(g, q, false, &Q));
  WOK(weft_graph_input(g, k, false, &K));
  WOK(weft_graph_input(g, v, false, &V));
  WOK(weft_op_sdpa(Q, K, V, true, &y[0]));
  WOK(weft_op_sdpa(Q, K, V, false, &y[1]));
  if (y[0] && y[1]) {
    int64_t n;
    double *c = fetch(weft_var_value(y[0]), &n), *nc = fetch(weft_var_value(y[1]), &n);
    double diff = 0;
    for (int e = 0; c && nc && e < 8; e++) { /* row t = 0, both heads */
      WCHECK(fabs(c[e] - hv[e]) <= 1e-6, "causal row 0 [%d] = %g, v %g", e, c[e], hv[e]);
      diff = fmax(diff, fabs(c[e] - nc[e]));
    }
    WCHECK(diff > 1e-3, "row 0 is the same causal and non-causal (max diff %g)", diff);
    free(c);
    free(nc);
  }
  weft_graph_destroy(g);
  weft_dtensor_destroy(q);
  weft_dtensor_destroy(k);
  weft_dtensor_destroy(v);
}

static void cases_ce(weft_mesh *mesh, weft_placement px, int64_t V) {
  /* logits (2, 4, V), targets (2, 4) with two ignored positions */
  int32_t t[8];
  double th[8];
  for (int i = 0; i < 8; i++) t[i] = (int32_t)((i * 3 + 1) % V);
  t[2] = -100;
  t[5] = -100;
  for (int i = 0; i < 8; i++) th[i] = t[i];
  int64_t ts[2] = {2, 4};
  weft_dtensor *tdt = mk_dt(mesh, WEFT_I32, 2, ts, th, weft_replicate());
  ce_ctx cc = {8, V, t, -100, tdt};
  opcase c = {.name = "cross_entropy",
              .nin = 1,
              .ndim = {3},
              .shape = {{2, 4, V}},
              .grad = {true},
              .pl = {px},
              .out_ndim = 1,
              .out_shape = {1},
              .run = run_ce,
              .chain = true,
              .ref = ref_ce,
              .ctx = &cc,
              .fwd_tol = F,
              .bwd_tol = G};
  run_case(mesh, &c);
  weft_dtensor_destroy(tdt);
}

/* -------------------------------------------------- dropout (1 rank or 2) */

static double *dropout_out(weft_mesh *mesh, const double *xh, int64_t n, weft_placement px,
                           uint64_t seed, int64_t step, int nskip, float p, double **grad,
                           const double *R) {
  weft_graph *g = NULL;
  double *res = NULL;
  int64_t shape[2] = {n / 50, 50}, m;
  weft_dtensor *x = mk_dt(mesh, WEFT_F32, 2, shape, xh, px), *Rdt = NULL;
  WOK(weft_graph_create(&g));
  weft_graph_set_seed(g, seed);
  weft_graph_set_step(g, step);
  weft_var *xv, *y = NULL;
  WOK(weft_graph_input(g, x, grad != NULL, &xv));
  for (int i = 0; i < nskip; i++) WOK(weft_op_dropout(xv, p, &y)); /* earlier op indices */
  WOK(weft_op_dropout(xv, p, &y));
  if (y) res = fetch(weft_var_value(y), &m);
  if (grad && y) {
    Rdt = mk_dt(mesh, WEFT_F32, 2, shape, R, weft_replicate());
    WOK(weft_backward_grad(y, Rdt));
    *grad = weft_var_grad(xv) ? fetch(weft_var_grad(xv), &m) : NULL;
  }
  weft_graph_destroy(g);
  weft_dtensor_destroy(x);
  weft_dtensor_destroy(Rdt);
  return res;
}

static void cases_dropout(weft_mesh *mesh, weft_placement px) {
  const int64_t n = 20000;
  const float p = 0.3f;
  double *xh = malloc(n * sizeof(double)), *R = malloc(n * sizeof(double));
  for (int64_t i = 0; i < n; i++) {
    xh[i] = srand1();
    if (xh[i] == 0) xh[i] = 0.5;
    R[i] = srand1();
  }
  double *gr = NULL;
  double *a = dropout_out(mesh, xh, n, px, 7, 3, 0, p, &gr, R);
  double *b = dropout_out(mesh, xh, n, weft_replicate(), 7, 3, 0, p, NULL, NULL);
  double *c = dropout_out(mesh, xh, n, px, 7, 4, 0, p, NULL, NULL);
  double *d = dropout_out(mesh, xh, n, px, 7, 3, 1, p, NULL, NULL);
  double *e = dropout_out(mesh, xh, n, px, 8, 3, 0, p, NULL, NULL);
  double *z = dropout_out(mesh, xh, n, px, 7, 3, 0, 0.0f, NULL, NULL);
  WREQUIRE(a && b && c && d && e && z && gr, "dropout runs");
  int64_t kept = 0, same_b = 0, same_c = 0, same_d = 0, same_e = 0, bad = 0, badg = 0;
  double s = (double)(1.0f / (1.0f - p));
  for (int64_t i = 0; i < n; i++) {
    bool k = a[i] != 0;
    kept += k;
    if (k && fabs(a[i] - xh[i] * s) > 1e-6) bad++;
    double gw = k ? R[i] * s : 0.0;
    if (fabs(gr[i] - gw) > 1e-6) badg++;
    same_b += a[i] == b[i];
    same_c += (a[i] != 0) == (c[i] != 0);
    same_d += (a[i] != 0) == (d[i] != 0);
    same_e += (a[i] != 0) == (e[i] != 0);
    if (z[i] != xh[i]) bad++;
  }
  double frac = (double)kept / (double)n;
  WCHECK(fabs(frac - (1 - p)) < 0.015, "dropout: kept fraction %.4f, want ~%.2f", frac, 1 - p);
  WCHECK(bad == 0, "dropout: %lld kept values not x/(1-p) (or p = 0 not identity)", (long long)bad);
  WCHECK(badg == 0, "dropout: %lld grads not mask * R / (1-p)", (long long)badg);
  WCHECK(same_b == n, "dropout: the mask depends on the placement (%lld of %lld equal)",
         (long long)same_b, (long long)n);
  /* another step, op index or seed: a different mask (agreement ~ p^2 + (1-p)^2 = 0.58) */
  WCHECK(same_c < n * 0.7, "dropout: step 4 mask equals step 3's (%lld)", (long long)same_c);
  WCHECK(same_d < n * 0.7, "dropout: op index 1 mask equals op index 0's (%lld)",
         (long long)same_d);
  WCHECK(same_e < n * 0.7, "dropout: seed 8 mask equals seed 7's (%lld)", (long long)same_e);
  free(a), free(b), free(c), free(d), free(e), free(z), free(gr), free(xh), free(R);
}

/* eval mode and p = 0 return the input itself; the same (seed, step, op
 * index) gives the same mask in two graphs */
static void case_dropout_modes(weft_mesh *mesh) {
  int64_t shape[1] = {64};
  double h[64];
  for (int i = 0; i < 64; i++) h[i] = srand1();
  weft_dtensor *x = mk_dt(mesh, WEFT_F32, 1, shape, h, weft_replicate());
  weft_graph *g;
  WOK(weft_graph_create(&g));
  weft_var *xv, *y;
  WOK(weft_graph_input(g, x, true, &xv));
  WOK(weft_op_dropout(xv, 0.0f, &y));
  WCHECK(y == xv, "dropout p = 0 is not the identity");
  weft_graph_set_training(g, false);
  WOK(weft_op_dropout(xv, 0.5f, &y));
  WCHECK(y == xv, "dropout in eval mode is not the identity");
  weft_graph_set_training(g, true);
  WCHECK(weft_op_dropout(xv, 1.0f, &y) == WEFT_ERR_INVALID, "p = 1 accepted");
  WCHECK(strstr(weft_last_error(), "dropout"), "error does not name the op: %s", weft_last_error());
  WCHECK(weft_op_dropout(xv, -0.1f, &y) == WEFT_ERR_INVALID, "p < 0 accepted");
  WCHECK(weft_op_dropout(xv, NAN, &y) == WEFT_ERR_INVALID, "p = nan accepted");
  weft_graph_destroy(g);
  weft_dtensor_destroy(x);
}

/* ------------------------------------------------------ cross-entropy extra */

static void case_ce_all_ignored(weft_mesh *mesh) {
  int64_t ls[2] = {3, 4}, ts[1] = {3};
  double lh[12], th[3] = {-1, -1, -1};
  for (int i = 0; i < 12; i++) lh[i] = srand1();
  weft_dtensor *l = mk_dt(mesh, WEFT_F32, 2, ls, lh, weft_replicate()),
               *t = mk_dt(mesh, WEFT_I32, 1, ts, th, weft_replicate());
  weft_graph *g;
  WOK(weft_graph_create(&g));
  weft_var *lv, *y = NULL;
  WOK(weft_graph_input(g, l, true, &lv));
  WOK(weft_op_cross_entropy(lv, t, -1, &y));
  if (y) {
    WCHECK(isnan(weft_var_item(y)), "all ignored: loss %g, want nan (torch)", weft_var_item(y));
    WOK(weft_backward(y));
    int64_t n;
    double *gr = weft_var_grad(lv) ? fetch(weft_var_grad(lv), &n) : NULL;
    WCHECK(gr, "no grad");
    for (int64_t i = 0; gr && i < n; i++)
      WCHECK(gr[i] == 0, "grad[%lld] = %g", (long long)i, gr[i]);
    free(gr);
  }
  weft_graph_destroy(g);
  weft_dtensor_destroy(l);
  weft_dtensor_destroy(t);
}

/* weft_op_cross_entropy_ex's reductions on a data-parallel batch: the
 * world is the batch mesh ("dp"), each rank a model mesh of its own with
 * its rows of a global batch of 6 rows x 5 classes; rank 0's rows have 2
 * of 3 targets ignored, rank 1's none. Against the one-rank float64
 * reference over the 6 rows: the mean over ranks of MEAN_GLOBAL's loss is
 * the global mean, and each rank's logits grad / R is the global mean's
 * grad of its rows (what gradient averaging gives); SUM is the local sum
 * with unscaled grads; a bad target on one rank is an error on every rank.
 * (MEAN, the per-rank mean, differs here: 1 kept row on rank 0, 3 on 1.) */
static void case_ce_global(void) {
  const int R = weft_world_size(), rank = weft_worker_rank;
  WREQUIRE(R == 2, "ce_global runs on 2 ranks");
  const char *dn[1] = {"dp"}, *tn[1] = {"tp"};
  int one = 1;
  weft_mesh *dp = NULL, *self = NULL;
  WOK(weft_mesh_create(1, &R, dn, &dp));
  WOK(weft_mesh_create_from_comm(MPI_COMM_SELF, 1, &one, tn, &self));
  weft_worker_mesh_on_device(self);
  enum { ROWS = 6, V = 5, MINE = 3 };
  double z[ROWS * V], tg[ROWS] = {2, -100, -100, 0, 4, 1};
  for (int i = 0; i < ROWS * V; i++) z[i] = 3.0 * srand1();
  /* the reference: softmax rows, loss and grad of the global mean */
  double ref_loss = 0, ref_grad[ROWS * V] = {0}, sums[2] = {0, 0};
  int kept = 0;
  for (int r = 0; r < ROWS; r++) kept += tg[r] != -100;
  for (int r = 0; r < ROWS; r++) {
    if (tg[r] == -100) continue;
    double mx = -INFINITY, se = 0;
    for (int v = 0; v < V; v++) mx = fmax(mx, (double)(float)z[r * V + v]);
    for (int v = 0; v < V; v++) se += exp((double)(float)z[r * V + v] - mx);
    double l = mx + log(se) - (double)(float)z[r * V + (int)tg[r]];
    ref_loss += l / kept;
    sums[r / MINE] += l;
    for (int v = 0; v < V; v++)
      ref_grad[r * V + v] = (exp((double)(float)z[r * V + v] - mx) / se - (v == (int)tg[r])) / kept;
  }
  const int64_t ls[2] = {MINE, V}, ts[1] = {MINE};
  weft_dtensor *l = mk_dt(self, WEFT_F32, 2, ls, z + rank * MINE * V, weft_replicate()),
               *t = mk_dt(self, WEFT_I32, 1, ts, tg + rank * MINE, weft_replicate());
  for (int red = 0; red < 2; red++) {
    weft_graph *g;
    WOK(weft_graph_create(&g));
    weft_var *lv, *y = NULL;
    WOK(weft_graph_input(g, l, true, &lv));
    weft_cross_entropy_opts o = WEFT_CROSS_ENTROPY_OPTS_INIT;
    o.reduction = red ? WEFT_REDUCTION_SUM : WEFT_REDUCTION_MEAN_GLOBAL;
    o.batch_mesh = dp;
    WOK(weft_op_cross_entropy_ex(lv, t, &o, &y));
    double mine = weft_var_item(y), total = 0;
    MPI_Allreduce(&mine, &total, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    double want = red ? sums[rank] : ref_loss, got = red ? mine : total / R;
    WCHECK(fabs(got - want) <= 1e-6 * fabs(want), "%s: loss %.9f want %.9f",
           red ? "sum" : "mean_global", got, want);
    WOK(weft_backward(y));
    int64_t n = 0;
    double *gr = fetch(weft_var_grad(lv), &n), worst = 0;
    for (int64_t i = 0; gr && i < n; i++) {
      double w = ref_grad[rank * MINE * V + i] * (red ? (double)kept : 1.0);
      double gv = red ? gr[i] : gr[i] / R;
      worst = fmax(worst, fabs(gv - w));
    }
    WCHECK(gr && n == MINE * V && worst < 1e-6, "%s: grad max error %.3g",
           red ? "sum" : "mean_global", worst);
    free(gr);
    weft_graph_destroy(g);
  }
  /* per-rank means differ from the global mean here (the reason for it) */
  {
    weft_graph *g;
    WOK(weft_graph_create(&g));
    weft_var *lv, *y = NULL;
    WOK(weft_graph_input(g, l, true, &lv));
    WOK(weft_op_cross_entropy(lv, t, -100, &y));
    double mine = weft_var_item(y), total = 0;
    MPI_Allreduce(&mine, &total, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    WCHECK(fabs(total / R - ref_loss) > 1e-3, "the per-rank mean happens to be the global mean");
    weft_graph_destroy(g);
  }
  /* a bad target on rank 1 only: an error on both ranks, no hang */
  double tb[MINE] = {0, 1, 9};
  weft_dtensor *bt = mk_dt(self, WEFT_I32, 1, ts, rank ? tb : tg, weft_replicate());
  weft_graph *g;
  WOK(weft_graph_create(&g));
  weft_var *lv, *y = NULL;
  WOK(weft_graph_input(g, l, true, &lv));
  weft_cross_entropy_opts o = {-100, WEFT_REDUCTION_MEAN_GLOBAL, dp};
  weft_status st = weft_op_cross_entropy_ex(lv, bt, &o, &y);
  WCHECK(st == WEFT_ERR_INVALID &&
             strstr(weft_last_error(), rank ? "target 9 at flat index 2" : "1 other rank(s)"),
         "bad target on rank 1: %s", weft_last_error());
  weft_clear_error();
  o.batch_mesh = NULL;
  WCHECK(weft_op_cross_entropy_ex(lv, t, &o, &y) == WEFT_ERR_INVALID &&
             strstr(weft_last_error(), "batch_mesh"),
         "MEAN_GLOBAL without a batch mesh: %s", weft_last_error());
  weft_clear_error();
  o.reduction = (weft_reduction)7;
  WCHECK(weft_op_cross_entropy_ex(lv, t, &o, &y) == WEFT_ERR_INVALID, "reduction 7 accepted");
  weft_clear_error();
  weft_graph_destroy(g);
  weft_dtensor_destroy(bt);
  weft_dtensor_destroy(l);
  weft_dtensor_destroy(t);
  WOK(weft_mesh_destroy(self));
  WOK(weft_mesh_destroy(dp));
}

/* ------------------------------------------------------------ bad input */

static void expect_err(weft_status st, weft_status want, const char *what, const char *needle) {
  WCHECK(st == want, "%s: got %s, want %s (%s)", what, weft_status_str(st), weft_status_str(want),
         weft_last_error());
  if (st == want && needle)
    WCHECK(strstr(weft_last_error(), needle), "%s: error does not mention '%s': %s", what, needle,
           weft_last_error());
}

static void case_bad(weft_mesh *mesh) {
  weft_placement r = weft_replicate();
  double h[256];
  for (int i = 0; i < 256; i++) h[i] = srand1();
  double ids[6] = {0, 1, 9, 2, 3, 4};
  int64_t s_x[3] = {2, 3, 8}, s_w7[1] = {7}, s_w8[1] = {8}, s_ids[2] = {2, 3}, s_e[2] = {7, 5},
          s_q[4] = {1, 4, 2, 4}, s_odd[4] = {1, 4, 2, 5}, s_kbad[4] = {1, 4, 3, 4}, s_a[2] = {3, 4},
          s_b[2] = {4, 3}, s_t[2] = {2, 3}, s_tb[1] = {6};
  weft_dtensor *x = mk_dt(mesh, WEFT_F32, 3, s_x, h, r), *w7 = mk_dt(mesh, WEFT_F32, 1, s_w7, h, r),
               *w8 = mk_dt(mesh, WEFT_F32, 1, s_w8, h, r),
               *id = mk_dt(mesh, WEFT_I32, 2, s_ids, ids, r),
               *emb = mk_dt(mesh, WEFT_F32, 2, s_e, h, r), *q = mk_dt(mesh, WEFT_F32, 4, s_q, h, r),
               *odd = mk_dt(mesh, WEFT_F32, 4, s_odd, h, r),
               *kbad = mk_dt(mesh, WEFT_F32, 4, s_kbad, h, r),
               *a = mk_dt(mesh, WEFT_F32, 2, s_a, h, r), *b = mk_dt(mesh, WEFT_F32, 2, s_b, h, r);
  double tv[6] = {0, 1, 2, 3, 17, 5}, tok[6] = {0, 1, 2, 3, 4, 5};
  weft_dtensor *tbad = mk_dt(mesh, WEFT_I32, 2, s_t, tv, r),
               *tgood = mk_dt(mesh, WEFT_I32, 2, s_t, tok, r),
               *tshape = mk_dt(mesh, WEFT_I32, 1, s_tb, tok, r);
  weft_graph *g;
  WOK(weft_graph_create(&g));
  weft_var *X, *W7, *W8, *ID, *E, *Q, *ODD, *KB, *A, *B, *y;
  WOK(weft_graph_input(g, x, true, &X));
  WOK(weft_graph_input(g, w7, true, &W7));
  WOK(weft_graph_input(g, w8, true, &W8));
  WOK(weft_graph_input(g, id, false, &ID));
  WOK(weft_graph_input(g, emb, true, &E));
  WOK(weft_graph_input(g, q, true, &Q));
  WOK(weft_graph_input(g, odd, true, &ODD));
  WOK(weft_graph_input(g, kbad, true, &KB));
  WOK(weft_graph_input(g, a, true, &A));
  WOK(weft_graph_input(g, b, true, &B));
  expect_err(weft_op_layer_norm(X, W7, NULL, 1e-5f, &y), WEFT_ERR_INVALID, "layer_norm weight (7)",
             "layer_norm");
  expect_err(weft_op_rms_norm(X, W7, 1e-5f, &y), WEFT_ERR_INVALID, "rms_norm weight (7)",
             "rms_norm");
  expect_err(weft_op_layer_norm(X, W8, W7, 1e-5f, &y), WEFT_ERR_INVALID, "layer_norm bias (7)",
             "bias");
  expect_err(weft_op_layer_norm(X, W8, NULL, 0.0f, &y), WEFT_ERR_INVALID, "layer_norm eps 0",
             "eps");
  expect_err(weft_op_embedding(ID, E, &y), WEFT_ERR_INVALID, "embedding id 9",
             "id 9 at flat index 2");
  expect_err(weft_op_embedding(X, E, &y), WEFT_ERR_INVALID, "embedding float ids", "int32");
  expect_err(weft_op_rope(ODD, 10000.0, 0, &y), WEFT_ERR_INVALID, "rope odd hd", "rope");
  expect_err(weft_op_rope(X, 10000.0, 0, &y), WEFT_ERR_INVALID, "rope 3-D", "rope");
  expect_err(weft_op_rope(Q, -1.0, 0, &y), WEFT_ERR_INVALID, "rope theta", "theta");
  expect_err(weft_op_sdpa(Q, KB, KB, false, &y), WEFT_ERR_INVALID, "sdpa non-causal H % Hkv",
             "sdpa");
  expect_err(weft_op_sdpa(Q, KB, KB, true, &y), WEFT_ERR_INVALID, "sdpa H % Hkv", "sdpa");
  expect_err(weft_op_sdpa(Q, ODD, ODD, true, &y), WEFT_ERR_INVALID, "sdpa hd", "sdpa");
  expect_err(weft_op_swiglu(A, B, &y), WEFT_ERR_INVALID, "swiglu shapes", "swiglu");
  expect_err(weft_op_cross_entropy(X, tbad, -100, &y), WEFT_ERR_INVALID, "cross_entropy target 17",
             "target 17 at flat index 4");
  expect_err(weft_op_cross_entropy(X, tshape, -100, &y), WEFT_ERR_INVALID,
             "cross_entropy target shape", "cross_entropy");
  expect_err(weft_op_cross_entropy(X, NULL, -100, &y), WEFT_ERR_INVALID, "cross_entropy NULL",
             "cross_entropy");
  expect_err(weft_op_gelu(NULL, true, &y), WEFT_ERR_INVALID, "gelu NULL", "gelu");
  expect_err(weft_op_softmax(X, NULL), WEFT_ERR_INVALID, "softmax out NULL", "softmax");
  /* the graph still works after the errors */
  WOK(weft_op_cross_entropy(X, tgood, -100, &y));
  WOK(weft_op_layer_norm(X, W8, NULL, 1e-5f, &y));
  weft_graph_destroy(g);
  weft_dtensor *d[] = {x, w7, w8, id, emb, q, odd, kbad, a, b, tbad, tgood, tshape};
  for (size_t i = 0; i < sizeof d / sizeof d[0]; i++) weft_dtensor_destroy(d[i]);
}

/* the graph's pool: a second step of the same shapes reuses the buffers
 * and gives the same values */
static void case_two_steps(weft_mesh *mesh) {
  static const sdpa_ctx sc = {.B = 2, .T = 5, .H = 4, .Hkv = 2, .hd = 4, .noncausal = false};
  int64_t sq[4] = {2, 5, 4, 4}, sk[4] = {2, 5, 2, 4};
  double hq[160], hk[80], hv[80];
  for (int i = 0; i < 160; i++) hq[i] = srand1();
  for (int i = 0; i < 80; i++) hk[i] = srand1(), hv[i] = srand1();
  weft_dtensor *q = mk_dt(mesh, WEFT_F32, 4, sq, hq, weft_replicate()),
               *k = mk_dt(mesh, WEFT_F32, 4, sk, hk, weft_replicate()),
               *v = mk_dt(mesh, WEFT_F32, 4, sk, hv, weft_replicate());
  weft_graph *g;
  WOK(weft_graph_create(&g));
  double *first = NULL;
  for (int step = 0; step < 3; step++) {
    weft_var *Q, *K, *V, *y = NULL, *r, *n;
    WOK(weft_graph_input(g, q, true, &Q));
    WOK(weft_graph_input(g, k, true, &K));
    WOK(weft_graph_input(g, v, true, &V));
    WOK(weft_op_rope(Q, 10000.0, 0, &r));
    WOK(weft_op_sdpa(r, K, V, true, &y));
    WOK(weft_op_rms_norm(y, NULL, 1e-5f, &n));
    WOK(weft_op_dropout(n, 0.1f, &y));
    int64_t m;
    double *out = y ? fetch(weft_var_value(y), &m) : NULL;
    WREQUIRE(out, "step %d", step);
    if (!first)
      first = out;
    else {
      int64_t same = 0;
      for (int64_t i = 0; i < m; i++) same += out[i] == first[i];
      /* values equal where both kept: same math; the masks differ per step */
      WCHECK(same > m / 2, "step %d: only %lld of %lld equal", step, (long long)same, (long long)m);
      free(out);
    }
    int64_t os[4] = {2, 5, 4, 4};
    weft_dtensor *R = mk_dt(mesh, WEFT_F32, 4, os, hq, weft_replicate());
    WOK(weft_backward_grad(y, R));
    WCHECK(weft_var_grad(Q) && weft_var_grad(K) && weft_var_grad(V), "grads");
    WOK(weft_graph_reset(g));
    weft_dtensor_destroy(R);
  }
  (void)sc;
  free(first);
  weft_graph_destroy(g);
  weft_dtensor_destroy(q);
  weft_dtensor_destroy(k);
  weft_dtensor_destroy(v);
}

/* RoPE's tables are the graph's, kept across steps and grown when a later
 * call reaches further (generation): in each step rope at pos0 0, then at
 * a pos0 past the tables so far (the first call's node still reads the
 * old tables in backward), on the same input; y = both added. y and dx
 * match the double reference in every step. */
static void case_rope_tables_across_steps(weft_mesh *mesh) {
  int64_t shape[4] = {2, 5, 4, 6};
  const int64_t n = 2 * 5 * 4 * 6;
  double hx[240], hr[240], y0[240], y1[240], dx0[240], dx1[240];
  for (int i = 0; i < n; i++) hx[i] = srand1(), hr[i] = srand1();
  weft_dtensor *x = mk_dt(mesh, WEFT_F32, 4, shape, hx, weft_replicate()),
               *R = mk_dt(mesh, WEFT_F32, 4, shape, hr, weft_replicate());
  weft_graph *g;
  WOK(weft_graph_create(&g));
  const int64_t later[3] = {3, 11, 2}; /* tables of 5, 10, 20 positions, then reused */
  for (int step = 0; step < 3; step++) {
    rope_ctx c0 = {2, 5, 4, 6, 0, 10000.0}, c1 = c0;
    c1.pos0 = later[step];
    double *in[1] = {hx};
    ref_rope(in, y0, &c0);
    ref_rope(in, y1, &c1);
    /* dx = the transposed rotations applied to dy = R: rotate by -angle */
    for (int k = 0; k < 2; k++) {
      rope_ctx cn = k ? c1 : c0;
      double *dx = k ? dx1 : dx0;
      for (int64_t b = 0; b < 2; b++)
        for (int64_t t = 0; t < 5; t++)
          for (int64_t h = 0; h < 4; h++)
            for (int64_t j = 0; j < 3; j++) {
              int64_t o = ((b * 5 + t) * 4 + h) * 6 + 2 * j;
              double f = pow(cn.theta, -2.0 * (double)j / 6.0);
              double a = (double)(cn.pos0 + t) * f, cs = cos(a), sn = sin(a);
              dx[o] = hr[o] * cs + hr[o + 1] * sn;
              dx[o + 1] = -hr[o] * sn + hr[o + 1] * cs;
            }
    }
    weft_var *X, *a = NULL, *b = NULL, *y = NULL;
    WOK(weft_graph_input(g, x, true, &X));
    WOK(weft_op_rope(X, 10000.0, 0, &a));
    WOK(weft_op_rope(X, 10000.0, c1.pos0, &b));
    WOK(weft_op_add(a, b, &y));
    int64_t m = 0, mg = 0;
    double *out = y ? fetch(weft_var_value(y), &m) : NULL;
    WREQUIRE(out && m == n, "rope across steps: step %d: forward", step);
    double err = 0.0;
    for (int64_t i = 0; i < n; i++) err = fmax(err, fabs(out[i] - (y0[i] + y1[i])));
    WCHECK(err <= 1e-5, "rope across steps: step %d (pos0 %lld): y off by %.3g", step,
           (long long)c1.pos0, err);
    WOK(weft_backward_grad(y, R));
    double *gx = weft_var_grad(X) ? fetch(weft_var_grad(X), &mg) : NULL;
    WREQUIRE(gx && mg == n, "rope across steps: step %d: no dx", step);
    err = 0.0;
    for (int64_t i = 0; i < n; i++) err = fmax(err, fabs(gx[i] - (dx0[i] + dx1[i])));
    WCHECK(err <= 1e-5, "rope across steps: step %d (pos0 %lld): dx off by %.3g", step,
           (long long)c1.pos0, err);
    free(out);
    free(gx);
    WOK(weft_graph_reset(g));
  }
  weft_graph_destroy(g);
  weft_dtensor_destroy(x);
  weft_dtensor_destroy(R);
}

/* add's backward hands the output grad itself to both inputs (issue 42
 * step 5): no copy, and no grad is added into in place while another var
 * holds the same buffer. S = X + X (one var twice), T = S + W (S and W
 * share dT), y = T * X (X gets more grad after its shared one), against
 * the hand-derived dX = R T + 2 R X and dW = R X, in two steps; the op
 * layer's copies counter does not move. */
static void case_add_shares_its_grad(weft_mesh *mesh) {
  int64_t shape[2] = {3, 7};
  const int64_t n = 21;
  double hx[21], hw[21], hr[21];
  for (int i = 0; i < n; i++) hx[i] = srand1(), hw[i] = srand1(), hr[i] = srand1();
  weft_dtensor *x = mk_dt(mesh, WEFT_F32, 2, shape, hx, weft_replicate()),
               *w = mk_dt(mesh, WEFT_F32, 2, shape, hw, weft_replicate()),
               *R = mk_dt(mesh, WEFT_F32, 2, shape, hr, weft_replicate());
  weft_graph *g;
  WOK(weft_graph_create(&g));
  const int64_t copies0 = weft_op_stats_get().copies;
  for (int step = 0; step < 2; step++) {
    weft_var *X, *W, *S = NULL, *T = NULL, *y = NULL;
    WOK(weft_graph_input(g, x, true, &X));
    WOK(weft_graph_input(g, w, true, &W));
    WOK(weft_op_add(X, X, &S));
    WOK(weft_op_add(S, W, &T));
    WOK(weft_op_mul(T, X, &y));
    WOK(weft_backward_grad(y, R));
    int64_t m1 = 0, m2 = 0;
    double *gx = weft_var_grad(X) ? fetch(weft_var_grad(X), &m1) : NULL;
    double *gw = weft_var_grad(W) ? fetch(weft_var_grad(W), &m2) : NULL;
    WREQUIRE(gx && gw && m1 == n && m2 == n, "add shares its grad: step %d: no grads", step);
    double ex = 0, ew = 0;
    for (int64_t i = 0; i < n; i++) {
      const double T_ = 2 * hx[i] + hw[i];
      ex = fmax(ex, fabs(gx[i] - (hr[i] * T_ + 2 * hr[i] * hx[i])));
      ew = fmax(ew, fabs(gw[i] - hr[i] * hx[i]));
    }
    WCHECK(ex <= 1e-5 && ew <= 1e-5, "add shares its grad: step %d: dX off by %.3g, dW by %.3g",
           step, ex, ew);
    free(gx);
    free(gw);
    WOK(weft_graph_reset(g));
  }
  WCHECK(weft_op_stats_get().copies == copies0,
         "add's backward made %lld copies (want none: same shapes, same dtype)",
         (long long)(weft_op_stats_get().copies - copies0));
  weft_graph_destroy(g);
  weft_dtensor_destroy(x);
  weft_dtensor_destroy(w);
  weft_dtensor_destroy(R);
}

/* ------------------------------------------------------------- entries */

static weft_mesh *make_mesh(int n) {
  weft_mesh *m = NULL;
  int shape[1] = {n};
  const char *names[1] = {"tp"};
  WOK(weft_mesh_create(1, shape, names, &m));
  return weft_worker_mesh_on_device(m);
}

/* Every run_case case with Replicate inputs (cases ops1 and bf16_1). */
static void replicated_cases(weft_mesh *mesh) {
  weft_placement r = weft_replicate();
  cases_embedding(mesh, r, r);
  cases_norms(mesh, r);
  cases_pointwise(mesh, r);
  cases_softmax(mesh, r);
  cases_rope(mesh, r);
  cases_sdpa(mesh, r);
  cases_ce(mesh, r, 6);
  cases_dropout(mesh, r);
}

static void case_ops1(void) {
  verbose = getenv("OPS_VERBOSE") != NULL;
  weft_mesh *mesh = make_mesh(1);
  if (!mesh) return;
  replicated_cases(mesh);
  case_sdpa_causal_flag(mesh);
  case_ce_all_ignored(mesh);
  case_dropout_modes(mesh);
  case_bad(mesh);
  case_two_steps(mesh);
  case_rope_tables_across_steps(mesh);
  case_add_shares_its_grad(mesh);
  WOK(weft_mesh_destroy(mesh));
}

/* 2 ranks: sharded inputs give the unsharded results */
static void case_ops2(void) {
  verbose = getenv("OPS_VERBOSE") != NULL;
  weft_mesh *mesh = make_mesh(2);
  if (!mesh) return;
  weft_placement r = weft_replicate(), p = weft_partial(WEFT_OP_SUM), s0 = weft_shard(0),
                 s1 = weft_shard(1), s2 = weft_shard(2);
#define EXPECT(pl) (expect_pl = (pl))
  EXPECT(&p), cases_embedding(mesh, r, s0);  /* vocab ranges: output P(sum) */
  EXPECT(&s2), cases_embedding(mesh, r, s1); /* colwise: output S(last) */
  EXPECT(&s1), cases_embedding(mesh, s1, r); /* ids rows split: dW P(sum) */
  EXPECT(&s1), cases_norms(mesh, s1);        /* sequence parallel (5 rows: 3 / 2) */
  EXPECT(NULL), cases_norms(mesh, s2);       /* a shard of the normalised dim: moved */
  EXPECT(&s1), cases_pointwise(mesh, s1);    /* 7 columns: 4 / 3 */
  EXPECT(NULL), cases_pointwise(mesh, p);    /* P(sum) inputs: reduced first */
  cases_norms(mesh, p);                      /* P(sum) x: reduced first */
  EXPECT(&s0), cases_softmax(mesh, s0);
  EXPECT(NULL), cases_softmax(mesh, s2); /* the softmax dim: moved first */
  EXPECT(&s2), cases_rope(mesh, s2);     /* heads */
  EXPECT(&s0), cases_rope(mesh, s0);
  EXPECT(&s2), cases_sdpa(mesh, s2);  /* heads: whole kv groups per rank */
  EXPECT(&s0), cases_sdpa(mesh, s0);  /* batch */
  EXPECT(NULL), cases_sdpa(mesh, s1); /* sequence: moved first */
  EXPECT(&r), cases_ce(mesh, s2, 6);  /* loss parallel */
  cases_ce(mesh, s2, 7);              /* loss parallel, uneven vocab 4 / 3 */
  cases_ce(mesh, s0, 6);              /* rows split */
  cases_ce(mesh, s1, 5);              /* rows split */
  EXPECT(NULL);
#undef EXPECT
  cases_dropout(mesh, s0); /* the mask of R and S(0) inputs agree */
  cases_dropout(mesh, s1);
  cases_dropout(mesh, p); /* a P(sum) input: the same mask everywhere */
  WOK(weft_mesh_destroy(mesh));
}

/* The run_case cases again with bf16 twins (see bf16_mode). */
static void case_bf16_1(void) {
  bf16_mode = true;
  verbose = getenv("OPS_VERBOSE") != NULL;
  weft_mesh *mesh = make_mesh(1);
  if (!mesh) return;
  replicated_cases(mesh);
  WOK(weft_mesh_destroy(mesh));
}

static void case_bf16_2(void) {
  bf16_mode = true;
  verbose = getenv("OPS_VERBOSE") != NULL;
  weft_mesh *mesh = make_mesh(2);
  if (!mesh) return;
  weft_placement r = weft_replicate(), p = weft_partial(WEFT_OP_SUM), s0 = weft_shard(0),
                 s1 = weft_shard(1), s2 = weft_shard(2);
  cases_embedding(mesh, r, s0); /* vocab ranges: a P(sum) output */
  cases_embedding(mesh, r, s1); /* colwise */
  cases_norms(mesh, s1);        /* sequence parallel */
  cases_norms(mesh, p);         /* a P(sum) input, summed as f32 then kept as bf16 */
  cases_pointwise(mesh, s1);
  cases_softmax(mesh, s2); /* the softmax dim: moved first */
  cases_rope(mesh, s2);
  cases_sdpa(mesh, s2);
  cases_sdpa(mesh, s1);  /* sequence: moved first */
  cases_ce(mesh, s2, 7); /* loss parallel, uneven vocab */
  cases_dropout(mesh, s0);
  WOK(weft_mesh_destroy(mesh));
}

static const weft_worker_case cases[] = {{"ops1", case_ops1},           {"ops2", case_ops2},
                                         {"bf16_1", case_bf16_1},       {"bf16_2", case_bf16_2},
                                         {"ce_global", case_ce_global}, {0}};

int main(int argc, char **argv) { return weft_worker_main(argc, argv, cases); }
