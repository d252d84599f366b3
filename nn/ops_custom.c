/* nn/ops_custom.c — user-defined ops (autograd.h "user-defined ops"): a
 * forward and a backward on local tensors and a sharding rule, run like
 * the built-in ops of nn/ops_linear.c:
 *   1. nn_check_vars, the def and the arity, the outputs' specs (infer);
 *   2. the rule's options per mesh dim (checked) and nn_choose;
 *   3. nn_graph_bring each input to its target, nn_graph_tensor the
 *      outputs with the chosen placements, the user's forward;
 *   4. nn_node_new with the inputs as used, nn_var_new for the outputs;
 *   5. the backward gives each input grad the placements the built-in ops
 *      would (from the placements forward used and the output grads'),
 *      zero-filled, and lets the user's backward write them.
 * node->p[0] = the def, node->ctx = the caller's ctx (both borrowed).
 */
#include <stdio.h>
#include <string.h>

#include "autograd_internal.h"

/* ------------------------------------------------------------ ready rules */

static int pointwise_rule(const weft_dtensor_spec *const *in, int nin, int mesh_dim,
                          weft_sharding_option *opts, int cap, bool linear) {
  if (nin < 1 || nin > WEFT_SHARDING_MAX_INPUTS || !in || !in[0] || cap < 1) return 0;
  int nd = in[0]->ndim;
  for (int a = 1; a < nin; a++)
    if (in[a] && in[a]->ndim < nd) nd = in[a]->ndim;
  weft_sharding_option o;
  memset(&o, 0, sizeof o);
  int c = 0;
  for (int a = 0; a < nin; a++) o.in[a] = nn_r();
  o.out = nn_r();
  opts[c++] = o;
  for (int d = 0; d < nd && c < cap; d++) {
    for (int a = 0; a < nin; a++) o.in[a] = nn_s(d);
    o.out = nn_s(d);
    opts[c++] = o;
  }
  weft_placement own =
      mesh_dim >= 0 && mesh_dim < in[0]->mesh_ndim ? in[0]->placements[mesh_dim] : nn_r();
  if (own.kind == WEFT_PLACE_STRIDED_SHARD && own.dim < nd && c < cap) {
    for (int a = 0; a < nin; a++) o.in[a] = own;
    o.out = own;
    opts[c++] = o;
  }
  if (linear && c < cap) {
    for (int a = 0; a < nin; a++) o.in[a] = nn_psum();
    o.out = nn_psum();
    opts[c++] = o;
  }
  return c;
}

int weft_op_rule_pointwise(const weft_dtensor_spec *const *in, int nin, int mesh_dim,
                           weft_sharding_option *opts, int cap, void *ctx) {
  (void)ctx;
  return pointwise_rule(in, nin, mesh_dim, opts, cap, false);
}

int weft_op_rule_pointwise_linear(const weft_dtensor_spec *const *in, int nin, int mesh_dim,
                                  weft_sharding_option *opts, int cap, void *ctx) {
  (void)ctx;
  return pointwise_rule(in, nin, mesh_dim, opts, cap, true);
}

/* --------------------------------------------------------------- checks */

/* A callback's message without the "[rank r] " weft_error put in front of
 * it (the op's own message has one), so it reads alike on every rank. */
static const char *callback_message(weft_status st) {
  const char *m = weft_last_error();
  if (!m[0]) return weft_status_str(st);
  if (strncmp(m, "[rank ", 6) == 0) {
    const char *e = strstr(m, "] ");
    if (e) return e + 2;
  }
  return m;
}

static const char *op_name(const weft_op_def *def) {
  return def && def->name && def->name[0] ? def->name : "custom op";
}

/* The def itself (before any var is looked at). */
static weft_status check_def(const weft_op_def *def) {
  if (!def) return weft_error(WEFT_ERR_INVALID, "op_custom: def is NULL");
  const char *name = op_name(def);
  if (!def->name || !def->name[0])
    return weft_error(WEFT_ERR_INVALID, "op_custom: the def has no name");
  if (def->nin < 1 || def->nin > WEFT_OP_MAX_INPUTS)
    return weft_error(WEFT_ERR_INVALID, "%s: the def's nin = %d is outside 1..%d", name, def->nin,
                      WEFT_OP_MAX_INPUTS);
  if (def->nout < 1 || def->nout > WEFT_OP_CUSTOM_MAX_OUTPUTS)
    return weft_error(WEFT_ERR_INVALID, "%s: the def's nout = %d is outside 1..%d", name, def->nout,
                      WEFT_OP_CUSTOM_MAX_OUTPUTS);
  if (!def->forward) return weft_error(WEFT_ERR_INVALID, "%s: the def has no forward", name);
  if (!def->rule && (!def->options || def->noptions < 1))
    return weft_error(WEFT_ERR_INVALID, "%s: the def has neither a rule nor options", name);
  return WEFT_OK;
}

static bool is_float(weft_dtype t) { return weft_dtype_is_float(t); }

/* Whether placement p names a dim a tensor of nd dims has. */
static bool pl_fits(weft_placement p, int nd) {
  if (!nn_is_shard_any(p)) return true;
  return p.dim >= 0 && p.dim < nd && (p.kind != WEFT_PLACE_STRIDED_SHARD || p.split_factor >= 1);
}

/* The options of every mesh dim into opts (cap WEFT_OP_RULE_CAP each),
 * checked against the inputs' and outputs' dims. */
static weft_status list_options(const weft_op_def *def, void *ctx, weft_var *const *in, int nin,
                                const weft_dtensor_spec *const *specs, int k,
                                const weft_op_out_spec *os, weft_sharding_option *opts, int *nopt) {
  const char *name = def->name;
  for (int i = 0; i < k; i++) {
    weft_sharding_option *o = &opts[i * WEFT_OP_RULE_CAP];
    memset(o, 0, sizeof *o * WEFT_OP_RULE_CAP);
    int c;
    if (def->rule) {
      c = def->rule(specs, nin, i, o, WEFT_OP_RULE_CAP, ctx);
    } else {
      c = def->noptions;
      if (c <= WEFT_OP_RULE_CAP) memcpy(o, def->options, sizeof *o * (size_t)c);
    }
    if (c < 1 || c > WEFT_OP_RULE_CAP)
      return nn_op_error(WEFT_ERR_INVALID, name, in, nin,
                         "the sharding rule lists %d options for mesh dim %d (1..%d)", c, i,
                         WEFT_OP_RULE_CAP);
    for (int j = 0; j < c; j++) {
      char d[64];
      for (int a = 0; a < nin; a++)
        if (!pl_fits(o[j].in[a], specs[a]->ndim)) {
          weft_placement_describe(o[j].in[a], d, sizeof d);
          return nn_op_error(WEFT_ERR_INVALID, name, in, nin,
                             "option %d of mesh dim %d puts input %d at %s, which has %d dims", j,
                             i, a, d, specs[a]->ndim);
        }
      for (int b = 0; b < def->nout; b++)
        if (!pl_fits(o[j].out, os[b].ndim)) {
          weft_placement_describe(o[j].out, d, sizeof d);
          return nn_op_error(WEFT_ERR_INVALID, name, in, nin,
                             "option %d of mesh dim %d puts output %d at %s, which has %d dims", j,
                             i, b, d, os[b].ndim);
        }
      for (int a = 0; a < nin; a++)
        if (o[j].in[a].kind == WEFT_PLACE_PARTIAL && o[j].out.kind != WEFT_PLACE_PARTIAL) {
          weft_placement_describe(o[j].out, d, sizeof d);
          return nn_op_error(WEFT_ERR_INVALID, name, in, nin,
                             "option %d of mesh dim %d takes input %d Partial but gives %s (a "
                             "local op keeps a pending sum pending: the output must be Partial)",
                             j, i, a, d);
        }
    }
    nopt[i] = c;
  }
  return WEFT_OK;
}

/* ------------------------------------------------------------- backward */

static weft_status custom_backward(nn_node *n, const weft_dtensor *const *dout,
                                   weft_dtensor **din) {
  const weft_op_def *def = n->p[0];
  weft_graph *g = nn_node_graph(n);
  int nin = n->nin, nout = n->nout;
  const weft_dtensor *used[WEFT_OP_MAX_INPUTS];
  for (int a = 0; a < nin; a++) used[a] = nn_node_input(n, a);
  const weft_dtensor *y0 = n->out[0]->value;
  weft_mesh *mesh = weft_dtensor_mesh(y0);
  int k = weft_mesh_ndim(mesh);
  const weft_placement *O = weft_dtensor_placements(y0);
  /* mesh dims where every input is R: a P(sum) output grad passes there */
  bool all_r[WEFT_MESH_MAX_DIMS];
  for (int i = 0; i < k; i++) {
    all_r[i] = true;
    for (int a = 0; a < nin; a++)
      all_r[i] = all_r[i] && nn_is_r(weft_dtensor_placements(used[a])[i]);
  }
  const weft_dtensor *gout[WEFT_OP_CUSTOM_MAX_OUTPUTS];
  bool any_p[WEFT_MESH_MAX_DIMS] = {false};
  for (int j = 0; j < nout; j++) {
    const weft_dtensor *yj = n->out[j]->value;
    weft_placement want[WEFT_MESH_MAX_DIMS];
    if (!dout[j]) {
      /* no grad reached output j: zeros (R where the output is Partial) */
      nn_grad_placements(O, O, k, want);
      weft_dtensor *z;
      WEFT_CHECK(nn_graph_zeros(g, mesh, weft_dtensor_dtype(yj), weft_dtensor_ndim(yj),
                                weft_dtensor_shape(yj), want, &z));
      gout[j] = z;
      continue;
    }
    const weft_placement *D = weft_dtensor_placements(dout[j]);
    for (int i = 0; i < k; i++) want[i] = nn_is_psum(D[i]) && !all_r[i] ? nn_r() : D[i];
    WEFT_CHECK(nn_graph_bring(g, dout[j], want, false, &gout[j]));
    for (int i = 0; i < k; i++)
      any_p[i] = any_p[i] || weft_dtensor_placements(gout[j])[i].kind == WEFT_PLACE_PARTIAL;
  }
  weft_dtensor *gin[WEFT_OP_MAX_INPUTS] = {0};
  for (int a = 0; a < nin; a++) {
    if (!nn_node_wants(n, a)) continue;
    const weft_placement *I = weft_dtensor_placements(used[a]);
    weft_placement p[WEFT_MESH_MAX_DIMS];
    for (int i = 0; i < k; i++) {
      if (nn_is_shard_any(I[i]))
        p[i] = I[i];
      else if (I[i].kind == WEFT_PLACE_PARTIAL)
        p[i] = any_p[i] ? nn_psum() : nn_r();
      else
        p[i] = nn_is_r(O[i]) && !any_p[i] ? nn_r() : nn_psum();
    }
    WEFT_CHECK(nn_graph_zeros(g, mesh, weft_dtensor_dtype(used[a]), weft_dtensor_ndim(used[a]),
                              weft_dtensor_shape(used[a]), p, &gin[a]));
  }
  const weft_dtensor *kin[WEFT_OP_MAX_INPUTS] = {0}, *kout[WEFT_OP_CUSTOM_MAX_OUTPUTS] = {0};
  for (int a = 0; a < nin; a++) kin[a] = def->keep_input[a] ? used[a] : NULL;
  for (int j = 0; j < nout; j++) kout[j] = def->keep_output[j] ? n->out[j]->value : NULL;
  weft_clear_error();
  weft_status st = def->backward(kin, nin, kout, gout, nout, gin, n->ctx);
  if (st != WEFT_OK) {
    char why[1024];
    snprintf(why, sizeof why, "%s", callback_message(st));
    return weft_error(st, "%s: backward: %s", def->name, why);
  }
  for (int a = 0; a < nin; a++) din[a] = gin[a];
  return WEFT_OK;
}

/* ------------------------------------------------------------- forward */

weft_status weft_op_custom(const weft_op_def *def, void *ctx, weft_var *const *in, int nin,
                           weft_var **out) {
  nn_count_ops(1);
  WEFT_CHECK(check_def(def));
  const char *name = def->name;
  if (!out) return weft_error(WEFT_ERR_INVALID, "%s: out is NULL", name);
  for (int j = 0; j < def->nout; j++) out[j] = NULL;
  if (!in) return weft_error(WEFT_ERR_INVALID, "%s: the inputs are NULL", name);
  if (nin != def->nin)
    return weft_error(WEFT_ERR_INVALID, "%s: takes %d input%s, got %d", name, def->nin,
                      def->nin == 1 ? "" : "s", nin);
  weft_graph *g;
  WEFT_CHECK(nn_check_vars(name, in, nin, &g));
  const weft_dtensor *v[WEFT_OP_MAX_INPUTS];
  const weft_dtensor_spec *specs[WEFT_OP_MAX_INPUTS];
  for (int a = 0; a < nin; a++) {
    v[a] = nn_var_now(in[a]);
    specs[a] = weft_dtensor_get_spec(v[a]);
    if (!weft_tensor_is_contiguous(nn_local(v[a])))
      return nn_op_error(WEFT_ERR_INVALID, name, in, nin, "input %d: local tensor not contiguous",
                         a);
  }
  /* the outputs' global specs */
  weft_op_out_spec os[WEFT_OP_CUSTOM_MAX_OUTPUTS];
  memset(os, 0, sizeof os);
  if (def->infer) {
    weft_clear_error();
    weft_status st = def->infer(specs, nin, os, def->nout, ctx);
    if (st != WEFT_OK) {
      char why[512];
      snprintf(why, sizeof why, "%s", callback_message(st));
      return nn_op_error(st, name, in, nin, "%s", why);
    }
  } else {
    for (int j = 0; j < def->nout; j++) {
      os[j].dtype = specs[0]->dtype;
      os[j].ndim = specs[0]->ndim;
      memcpy(os[j].shape, specs[0]->shape, sizeof(int64_t) * (size_t)specs[0]->ndim);
    }
  }
  for (int j = 0; j < def->nout; j++) {
    bool ok = os[j].ndim >= 0 && os[j].ndim <= WEFT_MAX_DIMS;
    for (int d = 0; ok && d < os[j].ndim; d++) ok = os[j].shape[d] >= 0;
    if (!ok)
      return nn_op_error(WEFT_ERR_INVALID, name, in, nin,
                         "infer gave output %d %d dims or a negative size", j, os[j].ndim);
    if (!is_float(os[j].dtype))
      return nn_op_error(WEFT_ERR_INVALID, name, in, nin,
                         "output %d is %s (outputs are float: they carry grads)", j,
                         weft_dtype_name(os[j].dtype));
  }
  /* the rule, the choice, the inputs brought there */
  int k = specs[0]->mesh_ndim;
  weft_sharding_option opts[WEFT_MESH_MAX_DIMS * WEFT_OP_RULE_CAP];
  int nopt[WEFT_MESH_MAX_DIMS];
  WEFT_CHECK(list_options(def, ctx, in, nin, specs, k, os, opts, nopt));
  weft_placement tgt[WEFT_OP_MAX_INPUTS * WEFT_MESH_MAX_DIMS], opl[WEFT_MESH_MAX_DIMS];
  WEFT_CHECK(nn_choose(name, in, nin, opts, WEFT_OP_RULE_CAP, nopt, false, tgt, opl));
  const weft_dtensor *u[WEFT_OP_MAX_INPUTS];
  for (int a = 0; a < nin; a++) WEFT_CHECK(nn_graph_bring(g, v[a], tgt + a * k, false, &u[a]));
  weft_mesh *mesh = weft_dtensor_mesh(v[0]);
  weft_dtensor *y[WEFT_OP_CUSTOM_MAX_OUTPUTS];
  for (int j = 0; j < def->nout; j++)
    WEFT_CHECK(nn_graph_tensor(g, mesh, os[j].dtype, os[j].ndim, os[j].shape, opl, &y[j]));
  weft_clear_error();
  weft_status st = def->forward(u, nin, y, def->nout, ctx);
  if (st != WEFT_OK) {
    char why[512];
    snprintf(why, sizeof why, "%s", callback_message(st));
    return nn_op_error(st, name, in, nin, "forward: %s", why);
  }
  nn_node *node = NULL;
  if (def->backward) WEFT_CHECK(nn_node_new(g, name, in, nin, u, custom_backward, &node));
  if (node) {
    node->p[0] = def;
    node->ctx = ctx;
  }
  for (int j = 0; j < def->nout; j++) WEFT_CHECK(nn_var_new(g, y[j], node, &out[j]));
  return WEFT_OK;
}
