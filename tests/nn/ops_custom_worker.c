/* tests/nn/ops_custom_worker.c — user-defined ops (weft_op_custom,
 * autograd.h) under mpiexec, started by tests/nn/test_ops_custom.c.
 *
 * The ops (local forward and backward written here, in f32):
 *   softplus    y = log(1 + exp(beta x)) / beta        pointwise rule
 *   mul_sin     y = a * b + sin(a)                      pointwise rule
 *   lin_comb    y = 2 a - 3 b                           pointwise_linear rule
 *                                                       (P(sum) stays P(sum))
 *   pos_scale   y[b, t, c] = x * (1 + t / T)            a fixed option list
 *               (t the global position: local offsets)  R, S(0..2), no strided
 *   scale_rows  y = x * w, x (B, T, C), w (C)           own rule: w R under row
 *                                                       shards (dw P(sum)), w
 *                                                       S(0) under x S(2), P x
 *   row_norm2   y[b, t] = sum_c x[b, t, c]^2            infer (B, T); S(2) ->
 *                                                       P(sum)
 *   sincos      (sin x, cos x)                          two outputs
 *   mlp         softplus(x w1^T) w2^T                   the op between built-in
 *                                                       linears (TP colwise /
 *                                                       rowwise)
 * Cases:
 *   one       1 rank: forward against a double reference, the input grads
 *             of sum(out * R) against central finite differences of the
 *             reference, all Replicate, each output alone, random
 *             placements (tests/nn/ops_check.c);
 *   random    2 / 4 ranks (and a 2x2 mesh on 4): random input and grad
 *             placements give the all-Replicate results (within 1e-5) and
 *             the reference;
 *   directed  2 / 4 ranks: shardings the rules keep are kept;
 *   bad       bad input fails with an error naming the op, the same text
 *             on every rank, and the graph works after it.
 *
 * Device mode (WEFT_TEST_DEVICE=cuda): every mesh is put on WEFT_CUDA as it
 * is made (oc_make_mesh), so the ops' local tensors live on the device; the
 * ops still compute on the host, through host copies staged around each
 * forward and backward (see "host staging" below), and the checks read
 * results through host copies. Same references, same tolerances.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops_check.h"
#include "ops_sharded.h"
#include "worker.h"

/* ------------------------------------------------------------- helpers */

/* ------------------------------------------------------ host staging
 *
 * The ops below compute with plain loops on the host. On a device mesh
 * their local tensors are device memory, so each forward and backward runs
 * through STAGED_FWD / STAGED_BWD: inside it lf() (read) and lfw() (write)
 * hand out a host copy of a local tensor, made on first use, and when the
 * callback returns the copies it wrote go back to the device and all are
 * freed. On the CPU they are the local tensor's own memory and nothing is
 * copied (the host mode). */
#define MAX_STAGED 16
static struct {
  weft_tensor *t, *h;
  bool write;
} staged[MAX_STAGED];
static int nstaged;

static float *stage_get(const weft_dtensor *d, bool write) {
  weft_tensor *t = weft_dtensor_local(d);
  if (t->device == WEFT_CPU) return t->data;
  for (int i = 0; i < nstaged; i++)
    if (staged[i].t == t) {
      staged[i].write = staged[i].write || write;
      return staged[i].h->data;
    }
  weft_tensor *h = NULL;
  weft_status st = nstaged < MAX_STAGED ? weft_tensor_to(t, WEFT_CPU, &h) : WEFT_ERR_INVALID;
  if (st != WEFT_OK) { /* the op cannot go on without its numbers */
    fprintf(stderr, "[rank %d] staging a local tensor on the host failed: %s\n", weft_worker_rank,
            nstaged < MAX_STAGED ? weft_last_error() : "too many tensors");
    abort();
  }
  staged[nstaged].t = t;
  staged[nstaged].h = h;
  staged[nstaged++].write = write;
  return h->data;
}

/* Ends a staged callback that returned st: written copies go back (when st
 * is WEFT_OK), all copies are freed. */
static weft_status stage_end(weft_status st) {
  for (int i = 0; i < nstaged; i++) {
    if (st == WEFT_OK && staged[i].write) st = weft_tensor_copy(staged[i].t, staged[i].h);
    weft_tensor_destroy(staged[i].h);
  }
  nstaged = 0;
  return st;
}

#define STAGED_FWD(name)                                                                    \
  static weft_status name(const weft_dtensor *const *in, int nin, weft_dtensor *const *out, \
                          int nout, void *ctx) {                                            \
    return stage_end(name##_host(in, nin, out, nout, ctx));                                 \
  }
#define STAGED_BWD(name)                                                                          \
  static weft_status name(const weft_dtensor *const *in, int nin, const weft_dtensor *const *out, \
                          const weft_dtensor *const *gout, int nout, weft_dtensor *const *gin,    \
                          void *ctx) {                                                            \
    return stage_end(name##_host(in, nin, out, gout, nout, gin, ctx));                            \
  }

static const float *lf(const weft_dtensor *d) { return stage_get(d, false); }
static float *lfw(const weft_dtensor *d) { return stage_get(d, true); }
static int64_t ln(const weft_dtensor *d) { return weft_tensor_numel(weft_dtensor_local(d)); }

static weft_status need_f32(const weft_dtensor_spec *const *in, int nin) {
  for (int a = 0; a < nin; a++)
    if (in[a]->dtype != WEFT_F32)
      return weft_error(WEFT_ERR_UNSUPPORTED, "input %d is %s (f32 only)", a,
                        weft_dtype_name(in[a]->dtype));
  return WEFT_OK;
}

static weft_status infer_like0(const weft_dtensor_spec *const *in, int nin, weft_op_out_spec *out,
                               int nout, void *ctx) {
  (void)ctx;
  WEFT_CHECK(need_f32(in, nin));
  for (int a = 1; a < nin; a++) {
    bool same = in[a]->ndim == in[0]->ndim;
    for (int d = 0; same && d < in[0]->ndim; d++) same = in[a]->shape[d] == in[0]->shape[d];
    if (!same) return weft_error(WEFT_ERR_INVALID, "input %d's shape differs from input 0's", a);
  }
  for (int j = 0; j < nout; j++) {
    out[j].dtype = WEFT_F32;
    out[j].ndim = in[0]->ndim;
    memcpy(out[j].shape, in[0]->shape, sizeof(int64_t) * (size_t)in[0]->ndim);
  }
  return WEFT_OK;
}

/* ------------------------------------------------------------ softplus */

typedef struct sp_ctx {
  double beta;
} sp_ctx;

static weft_status sp_fwd_host(const weft_dtensor *const *in, int nin, weft_dtensor *const *out,
                               int nout, void *ctx) {
  (void)nin, (void)nout;
  const float b = (float)((const sp_ctx *)ctx)->beta;
  const float *x = lf(in[0]);
  float *y = lfw(out[0]);
  for (int64_t i = 0; i < ln(in[0]); i++) y[i] = log1pf(expf(b * x[i])) / b;
  return WEFT_OK;
}
static weft_status sp_bwd_host(const weft_dtensor *const *in, int nin,
                               const weft_dtensor *const *out, const weft_dtensor *const *gout,
                               int nout, weft_dtensor *const *gin, void *ctx) {
  (void)nin, (void)nout, (void)out;
  const float b = (float)((const sp_ctx *)ctx)->beta;
  if (!gin[0]) return WEFT_OK;
  const float *x = lf(in[0]), *dy = lf(gout[0]);
  float *dx = lfw(gin[0]);
  for (int64_t i = 0; i < ln(in[0]); i++) dx[i] = dy[i] / (1.0f + expf(-b * x[i]));
  return WEFT_OK;
}
STAGED_FWD(sp_fwd)
STAGED_BWD(sp_bwd)
static const weft_op_def softplus_def = {.name = "softplus",
                                         .nin = 1,
                                         .nout = 1,
                                         .rule = weft_op_rule_pointwise,
                                         .infer = infer_like0,
                                         .forward = sp_fwd,
                                         .backward = sp_bwd,
                                         .keep_input = {true}};

/* ----------------------------------------------------------- mul_sin */

static weft_status ms_fwd_host(const weft_dtensor *const *in, int nin, weft_dtensor *const *out,
                               int nout, void *ctx) {
  (void)nin, (void)nout, (void)ctx;
  const float *a = lf(in[0]), *b = lf(in[1]);
  float *y = lfw(out[0]);
  for (int64_t i = 0; i < ln(in[0]); i++) y[i] = a[i] * b[i] + sinf(a[i]);
  return WEFT_OK;
}
static weft_status ms_bwd_host(const weft_dtensor *const *in, int nin,
                               const weft_dtensor *const *out, const weft_dtensor *const *gout,
                               int nout, weft_dtensor *const *gin, void *ctx) {
  (void)nin, (void)nout, (void)out, (void)ctx;
  const float *a = lf(in[0]), *b = lf(in[1]), *dy = lf(gout[0]);
  for (int64_t i = 0; i < ln(in[0]); i++) {
    if (gin[0]) lfw(gin[0])[i] = dy[i] * (b[i] + cosf(a[i]));
    if (gin[1]) lfw(gin[1])[i] = dy[i] * a[i];
  }
  return WEFT_OK;
}
STAGED_FWD(ms_fwd)
STAGED_BWD(ms_bwd)
static const weft_op_def mul_sin_def = {.name = "mul_sin",
                                        .nin = 2,
                                        .nout = 1,
                                        .rule = weft_op_rule_pointwise,
                                        .infer = infer_like0,
                                        .forward = ms_fwd,
                                        .backward = ms_bwd,
                                        .keep_input = {true, true}};

/* ----------------------------------------------------------- lin_comb */

static weft_status lc_fwd_host(const weft_dtensor *const *in, int nin, weft_dtensor *const *out,
                               int nout, void *ctx) {
  (void)nin, (void)nout, (void)ctx;
  const float *a = lf(in[0]), *b = lf(in[1]);
  float *y = lfw(out[0]);
  for (int64_t i = 0; i < ln(in[0]); i++) y[i] = 2.0f * a[i] - 3.0f * b[i];
  return WEFT_OK;
}
/* keeps nothing: in[] and out[] are NULL here */
static weft_status lc_bwd_host(const weft_dtensor *const *in, int nin,
                               const weft_dtensor *const *out, const weft_dtensor *const *gout,
                               int nout, weft_dtensor *const *gin, void *ctx) {
  (void)nout, (void)ctx;
  for (int a = 0; a < nin; a++)
    if (in[a]) return weft_error(WEFT_ERR_INTERNAL, "lin_comb keeps no input, got input %d", a);
  if (out[0]) return weft_error(WEFT_ERR_INTERNAL, "lin_comb keeps no output");
  const float *dy = lf(gout[0]);
  for (int64_t i = 0; i < ln(gout[0]); i++) {
    if (gin[0]) lfw(gin[0])[i] = 2.0f * dy[i];
    if (gin[1]) lfw(gin[1])[i] = -3.0f * dy[i];
  }
  return WEFT_OK;
}
STAGED_FWD(lc_fwd)
STAGED_BWD(lc_bwd)
static const weft_op_def lin_comb_def = {.name = "lin_comb",
                                         .nin = 2,
                                         .nout = 1,
                                         .rule = weft_op_rule_pointwise_linear,
                                         .infer = infer_like0,
                                         .forward = lc_fwd,
                                         .backward = lc_bwd};

/* ---------------------------------------------------------- pos_scale */

/* y = x * (1 + t / T) on x (B, T, C): the local box's global offset gives
 * t; the same factor for the grad. */
static weft_status pos_apply(const weft_dtensor *src, weft_dtensor *dst, const weft_dtensor *geo) {
  const weft_tensor *s = weft_dtensor_local(src);
  int64_t off[WEFT_MAX_DIMS] = {0};
  if (!weft_dtensor_local_offset(geo, off))
    return weft_error(WEFT_ERR_INVALID, "pos_scale: the local piece is not one box");
  const double T = (double)weft_dtensor_shape(geo)[1];
  const int64_t n0 = s->shape[0], n1 = s->shape[1], n2 = s->shape[2];
  const float *x = lf(src);
  float *y = lfw(dst);
  for (int64_t i = 0; i < n0; i++)
    for (int64_t t = 0; t < n1; t++) {
      const float f = (float)(1.0 + (double)(off[1] + t) / T);
      for (int64_t c = 0; c < n2; c++) y[(i * n1 + t) * n2 + c] = x[(i * n1 + t) * n2 + c] * f;
    }
  return WEFT_OK;
}
static weft_status pos_fwd_host(const weft_dtensor *const *in, int nin, weft_dtensor *const *out,
                                int nout, void *ctx) {
  (void)nin, (void)nout, (void)ctx;
  return pos_apply(in[0], out[0], out[0]);
}
static weft_status pos_bwd_host(const weft_dtensor *const *in, int nin,
                                const weft_dtensor *const *out, const weft_dtensor *const *gout,
                                int nout, weft_dtensor *const *gin, void *ctx) {
  (void)in, (void)nin, (void)out, (void)nout, (void)ctx;
  return gin[0] ? pos_apply(gout[0], gin[0], gin[0]) : WEFT_OK;
}
STAGED_FWD(pos_fwd)
STAGED_BWD(pos_bwd)
static weft_status pos_infer(const weft_dtensor_spec *const *in, int nin, weft_op_out_spec *out,
                             int nout, void *ctx) {
  if (in[0]->ndim != 3) return weft_error(WEFT_ERR_INVALID, "x must be (B, T, C)");
  return infer_like0(in, nin, out, nout, ctx);
}
/* the same options on every mesh dim (no rule function): R and plain
 * shards; a StridedShard input is moved to one of them */
#define PR \
  { WEFT_PLACE_REPLICATE, 0, 1, WEFT_OP_SUM }
#define PS(d) \
  { WEFT_PLACE_SHARD, d, 1, WEFT_OP_SUM }
static const weft_sharding_option pos_options[] = {
    {{PR}, PR}, {{PS(0)}, PS(0)}, {{PS(1)}, PS(1)}, {{PS(2)}, PS(2)}};
#undef PR
#undef PS
static const weft_op_def pos_scale_def = {.name = "pos_scale",
                                          .nin = 1,
                                          .nout = 1,
                                          .options = pos_options,
                                          .noptions = 4,
                                          .infer = pos_infer,
                                          .forward = pos_fwd,
                                          .backward = pos_bwd};

/* --------------------------------------------------------- scale_rows */

static int sr_rule(const weft_dtensor_spec *const *in, int nin, int mesh_dim,
                   weft_sharding_option *o, int cap, void *ctx) {
  (void)in, (void)nin, (void)mesh_dim, (void)ctx;
  weft_placement R = weft_replicate(), P = weft_partial(WEFT_OP_SUM);
  if (cap < 5) return 0;
  int c = 0;
  o[c++] = (weft_sharding_option){{R, R}, R};
  o[c++] = (weft_sharding_option){{weft_shard(0), R}, weft_shard(0)};
  o[c++] = (weft_sharding_option){{weft_shard(1), R}, weft_shard(1)};
  o[c++] = (weft_sharding_option){{weft_shard(2), weft_shard(0)}, weft_shard(2)};
  o[c++] = (weft_sharding_option){{P, R}, P}; /* linear in x */
  return c;
}
static weft_status sr_infer(const weft_dtensor_spec *const *in, int nin, weft_op_out_spec *out,
                            int nout, void *ctx) {
  (void)nout, (void)ctx;
  WEFT_CHECK(need_f32(in, nin));
  if (in[0]->ndim != 3 || in[1]->ndim != 1 || in[1]->shape[0] != in[0]->shape[2])
    return weft_error(WEFT_ERR_INVALID, "need x (B, T, C) and w (C)");
  out[0].dtype = WEFT_F32;
  out[0].ndim = 3;
  memcpy(out[0].shape, in[0]->shape, sizeof(int64_t) * 3);
  return WEFT_OK;
}
static weft_status sr_fwd_host(const weft_dtensor *const *in, int nin, weft_dtensor *const *out,
                               int nout, void *ctx) {
  (void)nin, (void)nout, (void)ctx;
  const int64_t C = ln(in[1]), n = ln(in[0]);
  const float *x = lf(in[0]), *w = lf(in[1]);
  float *y = lfw(out[0]);
  for (int64_t i = 0; i < n; i++) y[i] = x[i] * w[i % C];
  return WEFT_OK;
}
static weft_status sr_bwd_host(const weft_dtensor *const *in, int nin,
                               const weft_dtensor *const *out, const weft_dtensor *const *gout,
                               int nout, weft_dtensor *const *gin, void *ctx) {
  (void)nin, (void)out, (void)nout, (void)ctx;
  const int64_t C = ln(in[1]), n = ln(in[0]);
  const float *x = lf(in[0]), *w = lf(in[1]), *dy = lf(gout[0]);
  for (int64_t i = 0; i < n; i++) {
    if (gin[0]) lfw(gin[0])[i] = dy[i] * w[i % C];
    if (gin[1]) lfw(gin[1])[i % C] += dy[i] * x[i]; /* grad_in is zero-filled */
  }
  return WEFT_OK;
}
STAGED_FWD(sr_fwd)
STAGED_BWD(sr_bwd)
static const weft_op_def scale_rows_def = {.name = "scale_rows",
                                           .nin = 2,
                                           .nout = 1,
                                           .rule = sr_rule,
                                           .infer = sr_infer,
                                           .forward = sr_fwd,
                                           .backward = sr_bwd,
                                           .keep_input = {true, true}};

/* ---------------------------------------------------------- row_norm2 */

static int rn_rule(const weft_dtensor_spec *const *in, int nin, int mesh_dim,
                   weft_sharding_option *o, int cap, void *ctx) {
  (void)in, (void)nin, (void)mesh_dim, (void)ctx, (void)cap;
  o[0] = (weft_sharding_option){{weft_replicate()}, weft_replicate()};
  o[1] = (weft_sharding_option){{weft_shard(0)}, weft_shard(0)};
  o[2] = (weft_sharding_option){{weft_shard(1)}, weft_shard(1)};
  o[3] = (weft_sharding_option){{weft_shard(2)}, weft_partial(WEFT_OP_SUM)}; /* partial sums */
  return 4;
}
static weft_status rn_infer(const weft_dtensor_spec *const *in, int nin, weft_op_out_spec *out,
                            int nout, void *ctx) {
  (void)nout, (void)ctx;
  WEFT_CHECK(need_f32(in, nin));
  if (in[0]->ndim != 3) return weft_error(WEFT_ERR_INVALID, "x must be (B, T, C)");
  out[0].dtype = WEFT_F32;
  out[0].ndim = 2;
  out[0].shape[0] = in[0]->shape[0];
  out[0].shape[1] = in[0]->shape[1];
  return WEFT_OK;
}
static weft_status rn_fwd_host(const weft_dtensor *const *in, int nin, weft_dtensor *const *out,
                               int nout, void *ctx) {
  (void)nin, (void)nout, (void)ctx;
  const weft_tensor *xl = weft_dtensor_local(in[0]);
  const int64_t rows = xl->shape[0] * xl->shape[1], C = xl->shape[2];
  const float *x = lf(in[0]);
  float *y = lfw(out[0]);
  for (int64_t r = 0; r < rows; r++) {
    double s = 0;
    for (int64_t c = 0; c < C; c++) s += (double)x[r * C + c] * x[r * C + c];
    y[r] = (float)s;
  }
  return WEFT_OK;
}
static weft_status rn_bwd_host(const weft_dtensor *const *in, int nin,
                               const weft_dtensor *const *out, const weft_dtensor *const *gout,
                               int nout, weft_dtensor *const *gin, void *ctx) {
  (void)nin, (void)out, (void)nout, (void)ctx;
  if (!gin[0]) return WEFT_OK;
  const weft_tensor *xl = weft_dtensor_local(in[0]);
  const int64_t rows = xl->shape[0] * xl->shape[1], C = xl->shape[2];
  const float *x = lf(in[0]), *dy = lf(gout[0]);
  float *dx = lfw(gin[0]);
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c = 0; c < C; c++) dx[r * C + c] = 2.0f * x[r * C + c] * dy[r];
  return WEFT_OK;
}
STAGED_FWD(rn_fwd)
STAGED_BWD(rn_bwd)
static const weft_op_def row_norm2_def = {.name = "row_norm2",
                                          .nin = 1,
                                          .nout = 1,
                                          .rule = rn_rule,
                                          .infer = rn_infer,
                                          .forward = rn_fwd,
                                          .backward = rn_bwd,
                                          .keep_input = {true}};

/* ------------------------------------------------------------- sincos */

static weft_status sc_fwd_host(const weft_dtensor *const *in, int nin, weft_dtensor *const *out,
                               int nout, void *ctx) {
  (void)nin, (void)nout, (void)ctx;
  const float *x = lf(in[0]);
  for (int64_t i = 0; i < ln(in[0]); i++) {
    lfw(out[0])[i] = sinf(x[i]);
    lfw(out[1])[i] = cosf(x[i]);
  }
  return WEFT_OK;
}
/* reads the outputs only: d sin = cos dx, d cos = -sin dx */
static weft_status sc_bwd_host(const weft_dtensor *const *in, int nin,
                               const weft_dtensor *const *out, const weft_dtensor *const *gout,
                               int nout, weft_dtensor *const *gin, void *ctx) {
  (void)nin, (void)nout, (void)ctx;
  if (in[0]) return weft_error(WEFT_ERR_INTERNAL, "sincos keeps no input");
  if (!gin[0]) return WEFT_OK;
  const float *s = lf(out[0]), *c = lf(out[1]), *d0 = lf(gout[0]), *d1 = lf(gout[1]);
  for (int64_t i = 0; i < ln(gin[0]); i++) lfw(gin[0])[i] = d0[i] * c[i] - d1[i] * s[i];
  return WEFT_OK;
}
STAGED_FWD(sc_fwd)
STAGED_BWD(sc_bwd)
static const weft_op_def sincos_def = {.name = "sincos",
                                       .nin = 1,
                                       .nout = 2,
                                       .rule = weft_op_rule_pointwise,
                                       .infer = infer_like0,
                                       .forward = sc_fwd,
                                       .backward = sc_bwd,
                                       .keep_output = {true, true}};

/* ---------------------------------------------------- references, runs */

static int64_t ne(int nd, const int64_t *s) { return oc_numel(nd, s); }

static void ref_softplus(const oc_case *c, double *const *in, double *const *out) {
  for (int64_t i = 0; i < ne(c->ndim[0], c->shape[0]); i++)
    out[0][i] = log1p(exp(c->farg * in[0][i])) / c->farg;
}
static void ref_mul_sin(const oc_case *c, double *const *in, double *const *out) {
  for (int64_t i = 0; i < ne(c->ndim[0], c->shape[0]); i++)
    out[0][i] = in[0][i] * in[1][i] + sin(in[0][i]);
}
static void ref_lin_comb(const oc_case *c, double *const *in, double *const *out) {
  for (int64_t i = 0; i < ne(c->ndim[0], c->shape[0]); i++) out[0][i] = 2 * in[0][i] - 3 * in[1][i];
}
static void ref_pos_scale(const oc_case *c, double *const *in, double *const *out) {
  const int64_t *s = c->shape[0];
  for (int64_t i = 0; i < ne(3, s); i++) {
    int64_t t = (i / s[2]) % s[1];
    out[0][i] = in[0][i] * (1.0 + (double)t / (double)s[1]);
  }
}
static void ref_scale_rows(const oc_case *c, double *const *in, double *const *out) {
  const int64_t C = c->shape[1][0];
  for (int64_t i = 0; i < ne(3, c->shape[0]); i++) out[0][i] = in[0][i] * in[1][i % C];
}
static void ref_row_norm2(const oc_case *c, double *const *in, double *const *out) {
  const int64_t C = c->shape[0][2], rows = c->shape[0][0] * c->shape[0][1];
  for (int64_t r = 0; r < rows; r++) {
    double s = 0;
    for (int64_t k = 0; k < C; k++) s += in[0][r * C + k] * in[0][r * C + k];
    out[0][r] = s;
  }
}
static void ref_sincos(const oc_case *c, double *const *in, double *const *out) {
  for (int64_t i = 0; i < ne(c->ndim[0], c->shape[0]); i++) {
    out[0][i] = sin(in[0][i]);
    out[1][i] = cos(in[0][i]);
  }
}
/* softplus(x w1^T) w2^T, x (2, 3, 4), w1 (6, 4), w2 (5, 6) */
static void ref_mlp(const oc_case *c, double *const *in, double *const *out) {
  const int64_t rows = 6, K = 4, H = 6, N = 5;
  for (int64_t r = 0; r < rows; r++) {
    double h[6];
    for (int64_t j = 0; j < H; j++) {
      double s = 0;
      for (int64_t k = 0; k < K; k++) s += in[0][r * K + k] * in[1][j * K + k];
      h[j] = log1p(exp(c->farg * s)) / c->farg;
    }
    for (int64_t n = 0; n < N; n++) {
      double s = 0;
      for (int64_t j = 0; j < H; j++) s += h[j] * in[2][n * H + j];
      out[0][r * N + n] = s;
    }
  }
}

static sp_ctx g_sp = {1.5};

static weft_status run_softplus(const oc_case *c, weft_var *const *in, weft_var **out) {
  (void)c;
  return weft_op_custom(&softplus_def, &g_sp, in, 1, out);
}
static weft_status run_mul_sin(const oc_case *c, weft_var *const *in, weft_var **out) {
  (void)c;
  return weft_op_custom(&mul_sin_def, NULL, in, 2, out);
}
static weft_status run_lin_comb(const oc_case *c, weft_var *const *in, weft_var **out) {
  (void)c;
  return weft_op_custom(&lin_comb_def, NULL, in, 2, out);
}
static weft_status run_pos_scale(const oc_case *c, weft_var *const *in, weft_var **out) {
  (void)c;
  return weft_op_custom(&pos_scale_def, NULL, in, 1, out);
}
static weft_status run_scale_rows(const oc_case *c, weft_var *const *in, weft_var **out) {
  (void)c;
  return weft_op_custom(&scale_rows_def, NULL, in, 2, out);
}
static weft_status run_row_norm2(const oc_case *c, weft_var *const *in, weft_var **out) {
  (void)c;
  return weft_op_custom(&row_norm2_def, NULL, in, 1, out);
}
static weft_status run_sincos(const oc_case *c, weft_var *const *in, weft_var **out) {
  (void)c;
  return weft_op_custom(&sincos_def, NULL, in, 1, out);
}
static weft_status run_mlp(const oc_case *c, weft_var *const *in, weft_var **out) {
  (void)c;
  weft_var *h, *a;
  WEFT_CHECK(weft_op_linear(in[0], in[1], NULL, &h));
  WEFT_CHECK(weft_op_custom(&softplus_def, &g_sp, &h, 1, &a));
  return weft_op_linear(a, in[2], NULL, out);
}

#define S(...) \
  { __VA_ARGS__ }
static const oc_case cases[] = {
    {.name = "softplus",
     .nin = 1,
     .ndim = {3},
     .shape = {S(2, 3, 5)},
     .nout = 1,
     .ondim = {3},
     .oshape = {S(2, 3, 5)},
     .farg = 1.5,
     .fd_h = 1e-4,
     .ref = ref_softplus,
     .run = run_softplus},
    {.name = "mul_sin",
     .nin = 2,
     .ndim = {3, 3},
     .shape = {S(2, 3, 4), S(2, 3, 4)},
     .nout = 1,
     .ondim = {3},
     .oshape = {S(2, 3, 4)},
     .fd_h = 1e-4,
     .ref = ref_mul_sin,
     .run = run_mul_sin},
    {.name = "lin_comb",
     .nin = 2,
     .ndim = {3, 3},
     .shape = {S(3, 2, 5), S(3, 2, 5)},
     .nout = 1,
     .ondim = {3},
     .oshape = {S(3, 2, 5)},
     .ref = ref_lin_comb,
     .run = run_lin_comb},
    {.name = "pos_scale",
     .nin = 1,
     .ndim = {3},
     .shape = {S(2, 5, 3)},
     .nout = 1,
     .ondim = {3},
     .oshape = {S(2, 5, 3)},
     .ref = ref_pos_scale,
     .run = run_pos_scale},
    {.name = "scale_rows",
     .nin = 2,
     .ndim = {3, 1},
     .shape = {S(2, 3, 6), S(6)},
     .nout = 1,
     .ondim = {3},
     .oshape = {S(2, 3, 6)},
     .ref = ref_scale_rows,
     .run = run_scale_rows},
    {.name = "row_norm2",
     .nin = 1,
     .ndim = {3},
     .shape = {S(2, 3, 5)},
     .nout = 1,
     .ondim = {2},
     .oshape = {S(2, 3)},
     .fd_h = 1e-4,
     .ref = ref_row_norm2,
     .run = run_row_norm2},
    {.name = "sincos",
     .nin = 1,
     .ndim = {3},
     .shape = {S(2, 3, 4)},
     .nout = 2,
     .ondim = {3, 3},
     .oshape = {S(2, 3, 4), S(2, 3, 4)},
     .iarg = {-1},
     .fd_h = 1e-4,
     .ref = ref_sincos,
     .run = run_sincos},
    {.name = "mlp",
     .nin = 3,
     .ndim = {3, 2, 2},
     .shape = {S(2, 3, 4), S(6, 4), S(5, 6)},
     .nout = 1,
     .ondim = {3},
     .oshape = {S(2, 3, 5)},
     .farg = 1.5,
     .fd_h = 1e-4,
     .ref = ref_mlp,
     .run = run_mlp},
    {0},
};
#undef S

static const oc_case *find(const char *name) {
  for (const oc_case *c = cases; c->name; c++)
    if (strcmp(c->name, name) == 0) return c;
  return NULL;
}

/* ---------------------------------------------------------------- runs */

/* 1 rank: every case against the double reference and finite differences
 * (all Replicate, each output alone, random placements). */
static void case_one(void) {
  int shape[1] = {1};
  weft_mesh *mesh = oc_make_mesh(1, shape);
  if (!mesh) return;
  uint64_t seed = 1234, st = seed;
  int ncases = 0;
  for (const oc_case *c = cases; c->name; c++, ncases++) {
    int fails = oc_run(c, mesh, NULL, NULL, -1, seed, 1e-5, NULL);
    for (int j = 0; c->nout > 1 && j < c->nout; j++)
      fails += oc_run(c, mesh, NULL, NULL, j, seed + 1 + (uint64_t)j, 1e-5, NULL);
    for (int t = 0; t < 6; t++) {
      weft_placement pl[OC_MAX_IN], gpl[1];
      oc_random_placements(c, 1, &st, pl);
      oc_random_grad_placements(c->ondim[0], 1, &st, gpl);
      fails += oc_run(c, mesh, pl, gpl, -1, seed + 100 + (uint64_t)t, 1e-5, NULL);
    }
    WCHECK(fails == 0, "%s: %d failed checks on 1 rank (see above)", c->name, fails);
  }
  WCHECK(ncases == 8, "%d cases", ncases);
  weft_mesh_destroy(mesh);
}

/* random placements on a 1-D mesh of the world (and 2x2 on 4 ranks) */
static void case_random(void) {
  int world = weft_world_size();
  int trials = weft_worker_argc > 2 ? atoi(weft_worker_argv[2]) : 6;
  uint64_t st = 0xC0570Dull + (uint64_t)world;
  /* 1-D over the world, and 2 x world/2 when that is a 2-D mesh */
  int shapes[2][2] = {{world, 0}, {2, world / 2}};
  int nmesh = world >= 4 && world % 2 == 0 ? 2 : 1;
  for (int mi = 0; mi < nmesh; mi++) {
    int ndim = mi == 0 ? 1 : 2;
    weft_mesh *mesh = oc_make_mesh(ndim, shapes[mi]);
    if (!mesh) return;
    for (const oc_case *c = cases; c->name; c++)
      for (int t = 0; t < trials; t++) {
        weft_placement pl[OC_MAX_IN * WEFT_MESH_MAX_DIMS], gpl[WEFT_MESH_MAX_DIMS];
        oc_random_placements(c, ndim, &st, pl);
        int mode = -1;
        if (c->nout > 1 && (t & 1)) mode = t % c->nout;
        oc_random_grad_placements(c->ondim[mode >= 0 ? mode : 0], ndim, &st, gpl);
        oc_against_replicate(c, mesh, pl, gpl, mode, 500 + (uint64_t)t, NULL);
      }
    weft_mesh_destroy(mesh);
  }
}

typedef struct directed {
  const char *name;
  weft_placement in[OC_MAX_IN];
  bool check;          /* want is checked */
  weft_placement want; /* the output placement on a 1-D mesh of the world */
} directed;

static void case_directed(void) {
  int world = weft_world_size();
  weft_placement R = weft_replicate(), P = weft_partial(WEFT_OP_SUM);
#define SH(d) weft_shard(d)
  const directed ds[] = {
      /* pointwise keeps shards */
      {.name = "softplus", .in = {SH(1)}, .check = true, .want = SH(1)},
      {.name = "softplus",
       .in = {weft_strided_shard(2, 2)},
       .check = true,
       .want = weft_strided_shard(2, 2)},
      {.name = "softplus", .in = {P}, .check = false, .want = R}, /* not linear: reduced */
      {.name = "mul_sin", .in = {SH(2), SH(2)}, .check = true, .want = SH(2)},
      /* b sliced to a's shard */
      {.name = "mul_sin", .in = {SH(1), R}, .check = true, .want = SH(1)},
      {.name = "lin_comb", .in = {P, P}, .check = true, .want = P}, /* linear: stays pending */
      {.name = "lin_comb", .in = {SH(0), SH(0)}, .check = true, .want = SH(0)},
      {.name = "pos_scale", .in = {SH(1)}, .check = true, .want = SH(1)}, /* offsets of a T shard */
      /* not listed: moved */
      {.name = "pos_scale", .in = {weft_strided_shard(1, 2)}, .check = false, .want = R},
      /* dw P(sum), reduced */
      {.name = "scale_rows", .in = {SH(1), R}, .check = true, .want = SH(1)},
      {.name = "scale_rows", .in = {SH(2), SH(0)}, .check = true, .want = SH(2)},
      {.name = "scale_rows", .in = {P, R}, .check = true, .want = P},
      {.name = "row_norm2", .in = {SH(2)}, .check = true, .want = P}, /* partial sums of squares */
      {.name = "row_norm2", .in = {SH(0)}, .check = true, .want = SH(0)},
      {.name = "sincos", .in = {SH(2)}, .check = true, .want = SH(2)},
      {.name = "mlp", .in = {R, SH(0), SH(1)}, .check = true, .want = P}, /* colwise, op, rowwise */
  };
#undef SH
  int shape[1] = {world};
  weft_mesh *mesh = oc_make_mesh(1, shape);
  if (!mesh) return;
  for (size_t i = 0; i < sizeof ds / sizeof ds[0]; i++) {
    const oc_case *c = find(ds[i].name);
    WCHECK(c != NULL, "no case %s", ds[i].name);
    if (!c) continue;
    int nm = c->nout > 1 ? c->nout + 1 : 1;
    for (int m = 0; m < nm; m++) {
      /* the grad Replicate, and Partial(sum) where the output is R */
      for (int gp = 0; gp < 2; gp++) {
        weft_placement gpl[1] = {gp ? P : R};
        oc_against_replicate(c, mesh, ds[i].in, gpl, m - 1, 77 + i,
                             ds[i].check ? &ds[i].want : NULL);
      }
    }
  }
  weft_mesh_destroy(mesh);
}

/* ------------------------------------------------------------ bad input */

static int fail_forward_calls;

static weft_status failing_fwd(const weft_dtensor *const *in, int nin, weft_dtensor *const *out,
                               int nout, void *ctx) {
  (void)in, (void)nin, (void)out, (void)nout, (void)ctx;
  fail_forward_calls++;
  return weft_error(WEFT_ERR_INVALID, "the kernel refuses these values");
}
static weft_status failing_bwd(const weft_dtensor *const *in, int nin,
                               const weft_dtensor *const *out, const weft_dtensor *const *gout,
                               int nout, weft_dtensor *const *gin, void *ctx) {
  (void)in, (void)nin, (void)out, (void)gout, (void)nout, (void)gin, (void)ctx;
  return weft_error(WEFT_ERR_UNSUPPORTED, "no gradient here");
}
static int partial_only_rule(const weft_dtensor_spec *const *in, int nin, int mesh_dim,
                             weft_sharding_option *o, int cap, void *ctx) {
  (void)in, (void)nin, (void)mesh_dim, (void)cap, (void)ctx;
  o[0] = (weft_sharding_option){{weft_partial(WEFT_OP_SUM)}, weft_partial(WEFT_OP_SUM)};
  return 1;
}
static int no_rule(const weft_dtensor_spec *const *in, int nin, int mesh_dim,
                   weft_sharding_option *o, int cap, void *ctx) {
  (void)in, (void)nin, (void)mesh_dim, (void)o, (void)cap, (void)ctx;
  return 0;
}
static int far_dim_rule(const weft_dtensor_spec *const *in, int nin, int mesh_dim,
                        weft_sharding_option *o, int cap, void *ctx) {
  (void)in, (void)nin, (void)mesh_dim, (void)cap, (void)ctx;
  o[0] = (weft_sharding_option){{weft_replicate()}, weft_replicate()};
  o[1] = (weft_sharding_option){{weft_shard(7)}, weft_shard(7)};
  return 2;
}
static int partial_to_r_rule(const weft_dtensor_spec *const *in, int nin, int mesh_dim,
                             weft_sharding_option *o, int cap, void *ctx) {
  (void)in, (void)nin, (void)mesh_dim, (void)cap, (void)ctx;
  o[0] = (weft_sharding_option){{weft_partial(WEFT_OP_SUM)}, weft_replicate()};
  return 1;
}
static weft_status int_infer(const weft_dtensor_spec *const *in, int nin, weft_op_out_spec *out,
                             int nout, void *ctx) {
  WEFT_CHECK(infer_like0(in, nin, out, nout, ctx));
  out[0].dtype = WEFT_I32;
  return WEFT_OK;
}

/* The same text on every rank (but for the "[rank r] " tags weft_error
 * puts in front): an all-reduce of its hash (max, min). */
static void same_on_all_ranks(weft_mesh *mesh, const char *what, const char *msg) {
  uint64_t h = 1469598103934665603ull;
  for (const char *p = msg; *p; p++) {
    if (strncmp(p, "[rank ", 6) == 0 && strstr(p, "] ")) {
      p = strstr(p, "] ") + 1;
      continue;
    }
    h = (h ^ (unsigned char)*p) * 1099511628211ull;
  }
  int64_t v[2] = {(int64_t)(h >> 1), -(int64_t)(h >> 1)}, r[2];
  WOK(weft_all_reduce(mesh, 0, v, r, 2, WEFT_I64, WEFT_OP_MAX, NULL));
  WCHECK(r[0] == v[0] && r[1] == v[1], "%s: the error differs between ranks: %s", what, msg);
}

static void expect_err(weft_mesh *mesh, weft_status st, weft_status want, const char *what,
                       const char *n1, const char *n2) {
  const char *e = weft_last_error();
  WCHECK(st == want, "%s: got %s, want %s (%s)", what, weft_status_str(st), weft_status_str(want),
         e);
  if (st != want) return;
  if (getenv("OPS_VERBOSE") && weft_worker_rank == 0) printf("%-26s %s\n", what, e);
  if (n1) WCHECK(strstr(e, n1), "%s: error does not mention '%s': %s", what, n1, e);
  if (n2) WCHECK(strstr(e, n2), "%s: error does not mention '%s': %s", what, n2, e);
  same_on_all_ranks(mesh, what, e);
}

static void case_bad(void) {
  int world = weft_world_size();
  int shape[1] = {world};
  weft_mesh *mesh = oc_make_mesh(1, shape);
  if (!mesh) return;
  int64_t s3[3] = {2, 3, 4}, s2[2] = {3, 4}, s6[1] = {5};
  weft_placement r = weft_replicate(), s0 = weft_shard(0);
  weft_dtensor *x = NULL, *x2 = NULL, *w5 = NULL, *xs = NULL;
  WOK(weft_dtensor_zeros(mesh, WEFT_F32, 3, s3, &r, 1, &x));
  WOK(weft_dtensor_zeros(mesh, WEFT_F32, 2, s2, &r, 1, &x2));
  WOK(weft_dtensor_zeros(mesh, WEFT_F32, 1, s6, &r, 1, &w5));
  WOK(weft_dtensor_zeros(mesh, WEFT_F32, 3, s3, &s0, 1, &xs));
  WREQUIRE(x && x2 && w5 && xs, "inputs");
  WOK(weft_tensor_fill(weft_dtensor_local(x), 0.5));
  WOK(weft_tensor_fill(weft_dtensor_local(xs), 0.5));
  weft_graph *g;
  WOK(weft_graph_create(&g));
  weft_var *X, *X2, *W5, *XS, *y[4] = {0};
  WOK(weft_graph_input(g, x, true, &X));
  WOK(weft_graph_input(g, x2, true, &X2));
  WOK(weft_graph_input(g, w5, true, &W5));
  WOK(weft_graph_input(g, xs, true, &XS));
  weft_var *one[1] = {X}, *two[2] = {X, X2};

  /* arity and the def */
  expect_err(mesh, weft_op_custom(&mul_sin_def, NULL, one, 1, y), WEFT_ERR_INVALID, "wrong arity",
             "mul_sin", "takes 2 inputs, got 1");
  expect_err(mesh, weft_op_custom(NULL, NULL, one, 1, y), WEFT_ERR_INVALID, "NULL def", "def",
             NULL);
  weft_op_def d = softplus_def;
  d.nin = 5;
  expect_err(mesh, weft_op_custom(&d, &g_sp, one, 1, y), WEFT_ERR_INVALID, "nin 5", "softplus",
             "nin = 5");
  d = softplus_def, d.nout = 0;
  expect_err(mesh, weft_op_custom(&d, &g_sp, one, 1, y), WEFT_ERR_INVALID, "nout 0", "softplus",
             "nout = 0");
  d = softplus_def, d.forward = NULL;
  expect_err(mesh, weft_op_custom(&d, &g_sp, one, 1, y), WEFT_ERR_INVALID, "no forward", "softplus",
             "forward");
  d = softplus_def, d.rule = NULL;
  expect_err(mesh, weft_op_custom(&d, &g_sp, one, 1, y), WEFT_ERR_INVALID, "no rule", "softplus",
             "rule");
  weft_var *with_null[1] = {NULL};
  expect_err(mesh, weft_op_custom(&softplus_def, &g_sp, with_null, 1, y), WEFT_ERR_INVALID,
             "NULL input", "softplus", "input 0 is NULL");
  /* shapes infer rejects */
  expect_err(mesh, weft_op_custom(&mul_sin_def, NULL, two, 2, y), WEFT_ERR_INVALID, "shapes differ",
             "mul_sin", "input 1's shape differs");
  weft_var *xw[2] = {X, W5};
  expect_err(mesh, weft_op_custom(&scale_rows_def, NULL, xw, 2, y), WEFT_ERR_INVALID,
             "scale_rows w (5)", "scale_rows", "need x (B, T, C) and w (C)");
  /* rules */
  d = softplus_def, d.name = "partial_only", d.rule = partial_only_rule;
  expect_err(mesh, weft_op_custom(&d, &g_sp, one, 1, y), WEFT_ERR_UNSUPPORTED,
             "a rule no placement fits", "partial_only", "no sharding strategy applies");
  d = softplus_def, d.name = "no_options", d.rule = no_rule;
  expect_err(mesh, weft_op_custom(&d, &g_sp, one, 1, y), WEFT_ERR_INVALID, "a rule of 0 options",
             "no_options", "lists 0 options for mesh dim 0");
  d = softplus_def, d.name = "far_dim", d.rule = far_dim_rule;
  expect_err(mesh, weft_op_custom(&d, &g_sp, one, 1, y), WEFT_ERR_INVALID, "S(7) of a 3-D input",
             "far_dim", "puts input 0 at S(7), which has 3 dims");
  d = softplus_def, d.name = "partial_to_r", d.rule = partial_to_r_rule;
  expect_err(mesh, weft_op_custom(&d, &g_sp, one, 1, y), WEFT_ERR_INVALID, "P input, R output",
             "partial_to_r", "the output must be Partial");
  d = softplus_def, d.name = "int_out", d.infer = int_infer;
  expect_err(mesh, weft_op_custom(&d, &g_sp, one, 1, y), WEFT_ERR_INVALID, "int32 output",
             "int_out", "output 0 is i32");
  /* the user's forward fails: its message with the op's name */
  d = softplus_def, d.name = "failing", d.forward = failing_fwd;
  fail_forward_calls = 0;
  expect_err(mesh, weft_op_custom(&d, &g_sp, one, 1, y), WEFT_ERR_INVALID, "forward error",
             "failing: forward: ", "the kernel refuses these values");
  WCHECK(fail_forward_calls == 1, "the failing forward ran %d times", fail_forward_calls);
  WCHECK(y[0] == NULL, "a failed op set its output");
  /* the graph still works after the errors */
  weft_var *ok = NULL;
  WOK(weft_op_custom(&softplus_def, &g_sp, one, 1, &ok));
  WREQUIRE(ok, "softplus after errors");
  WCHECK(weft_var_requires_grad(ok), "the output requires grad");
  /* the user's backward fails: backward names the op */
  d = softplus_def, d.name = "bad_grad", d.backward = failing_bwd;
  weft_var *bg = NULL;
  WOK(weft_op_custom(&d, &g_sp, one, 1, &bg));
  WREQUIRE(bg, "bad_grad forward");
  expect_err(mesh, weft_backward_grad(bg, x), WEFT_ERR_UNSUPPORTED, "backward error",
             "bad_grad: backward: ", "no gradient here");
  weft_graph_reset(g);

  /* no backward: the outputs need no grad; no node */
  WOK(weft_graph_input(g, x, true, &X));
  d = softplus_def, d.name = "no_grad", d.backward = NULL;
  weft_var *ng = NULL;
  WOK(weft_op_custom(&d, &g_sp, &X, 1, &ng));
  WCHECK(ng && !weft_var_requires_grad(ng), "an op without backward gives a var needing grad");
  expect_err(mesh, weft_backward_grad(ng, x), WEFT_ERR_INVALID, "backward of no_grad",
             "does not require grad", NULL);
  weft_graph_reset(g);
  /* grad recording off: forward only */
  weft_graph_set_grad_enabled(g, false);
  WOK(weft_graph_input(g, xs, true, &XS));
  WOK(weft_op_custom(&softplus_def, &g_sp, &XS, 1, &ng));
  WCHECK(ng && !weft_var_requires_grad(ng), "grad disabled: the output needs no grad");
  if (ng) {
    weft_tensor *full = NULL, *tmp = NULL;
    WOK(weft_dtensor_full_tensor(weft_var_value(ng), &full));
    const weft_tensor *hf = weft_worker_host_copy(full, &tmp);
    if (hf) {
      double want = log1p(exp(1.5 * 0.5)) / 1.5;
      const float *f = hf->data;
      for (int64_t i = 0; i < weft_tensor_numel(hf); i++)
        WCHECK(fabs(f[i] - want) <= 1e-6, "softplus(0.5)[%lld] = %g, want %g", (long long)i,
               (double)f[i], want);
    }
    weft_tensor_destroy(tmp);
    weft_tensor_destroy(full);
  }
  weft_graph_destroy(g);
  weft_dtensor_destroy(x);
  weft_dtensor_destroy(x2);
  weft_dtensor_destroy(w5);
  weft_dtensor_destroy(xs);
  weft_mesh_destroy(mesh);
}

/* the graph's pool: steps of the same shapes give the same values */
static void case_steps(void) {
  int world = weft_world_size();
  int shape[1] = {world};
  weft_mesh *mesh = oc_make_mesh(1, shape);
  if (!mesh) return;
  int64_t s3[3] = {2, 3, 4};
  weft_placement s2 = weft_shard(2);
  weft_dtensor *a = NULL, *b = NULL;
  WOK(weft_dtensor_zeros(mesh, WEFT_F32, 3, s3, &s2, 1, &a));
  WOK(weft_dtensor_zeros(mesh, WEFT_F32, 3, s3, &s2, 1, &b));
  WREQUIRE(a && b, "inputs");
  WOK(weft_dtensor_fill_uniform(a, 7, 1, -1.0f, 1.0f));
  WOK(weft_dtensor_fill_uniform(b, 7, 2, -1.0f, 1.0f));
  weft_graph *g;
  WOK(weft_graph_create(&g));
  float *first = NULL;
  int64_t n0 = 0;
  for (int step = 0; step < 3; step++) {
    weft_var *A, *B, *y = NULL, *z = NULL;
    WOK(weft_graph_input(g, a, true, &A));
    WOK(weft_graph_input(g, b, true, &B));
    weft_var *ab[2] = {A, B};
    WOK(weft_op_custom(&mul_sin_def, NULL, ab, 2, &y));
    WREQUIRE(y, "step %d", step);
    WOK(weft_op_custom(&softplus_def, &g_sp, &y, 1, &z));
    WREQUIRE(z, "step %d", step);
    WCHECK(weft_placement_equal(weft_dtensor_placements(weft_var_value(z))[0], s2),
           "step %d: the output left S(2)", step);
    WOK(weft_backward_grad(z, a));
    const weft_dtensor *ga = weft_var_grad(A);
    WREQUIRE(ga, "step %d: no grad", step);
    weft_tensor *full = NULL, *tmp = NULL;
    WOK(weft_dtensor_full_tensor(ga, &full));
    WREQUIRE(full, "full");
    const weft_tensor *hf = weft_worker_host_copy(full, &tmp);
    if (hf && !first) {
      n0 = weft_tensor_numel(hf);
      first = malloc(sizeof(float) * (size_t)n0);
      memcpy(first, hf->data, sizeof(float) * (size_t)n0);
    } else if (hf) {
      WCHECK(memcmp(first, hf->data, sizeof(float) * (size_t)n0) == 0,
             "step %d: the grad differs from step 0", step);
    }
    weft_tensor_destroy(tmp);
    weft_tensor_destroy(full);
    WOK(weft_graph_reset(g));
  }
  free(first);
  weft_graph_destroy(g);
  weft_dtensor_destroy(a);
  weft_dtensor_destroy(b);
  weft_mesh_destroy(mesh);
}

static const weft_worker_case wcases[] = {
    {"one", case_one}, {"random", case_random}, {"directed", case_directed},
    {"bad", case_bad}, {"steps", case_steps},   {0},
};

int main(int argc, char **argv) { return weft_worker_main(argc, argv, wcases); }
