/* tests/nn/ops_errors_worker.c — bad input of the op layer (autograd.h)
 * and WEFT_DEBUG's check that every rank runs the same ops, in an MPI
 * worker started by test_ops_errors.c (2 ranks, 1-D mesh of the world).
 *
 * shapes:    ops given shapes they cannot take fail with WEFT_ERR_INVALID
 *            on every rank, with the same message, naming the op and every
 *            input's shape and placements; the graph stays usable.
 * params:    a parameter registered twice (or under a tied alias's name)
 *            is refused naming the module and the name; nothing changes.
 *            A parameter whose data is set to another's storage is refused
 *            by weft_graph_param and freed once by weft_module_destroy.
 * backward:  backward twice on one graph is WEFT_ERR_STATE, so is an op
 *            after backward; after reset the graph works and the grads
 *            equal the double reference.
 * tied:      a tied weight has one layout for both its users: placements
 *            set through the alias are the owner's; sharded (S(0), vocab)
 *            the embedding + tied head model gives the double reference's
 *            loss and gradient (both uses summed into one grad).
 * debug:     (run with WEFT_DEBUG=1) a rank that skips an op, calls
 *            another op, passes other shapes or goes to backward early
 *            fails on both ranks with WEFT_ERR_MISMATCH naming both ranks
 *            and both calls, instead of hanging or computing wrong numbers;
 *            a consistent graph gives bitwise the numbers of a run without
 *            the check, which communicates nothing there.
 *
 * Device mode (WEFT_TEST_DEVICE=cuda): the mesh is put on WEFT_CUDA as it is
 * made (weft_worker_mesh_on_device); inputs are distributed from host
 * tensors and results read through host copies (full_host). */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd.h"
#include "worker.h"

/* Uniform in [-1, 1), the same on every rank for one key. */
static double urand(uint64_t key, int64_t i) {
  return weft_test_sym(weft_test_mix64(key * 0x100000001b3ULL + (uint64_t)i));
}

static weft_mesh *world_mesh(void) {
  int n = weft_world_size();
  const char *names[1] = {"tp"};
  weft_mesh *m = NULL;
  WOK(weft_mesh_create(1, &n, names, &m));
  return weft_worker_mesh_on_device(m);
}

/* weft_dtensor_full_tensor, read on the host: on a device mesh the full
 * tensor is replaced by its host copy. Collective. */
static weft_status full_host(const weft_dtensor *d, weft_tensor **out) {
  weft_tensor *f = NULL, *h = NULL;
  WEFT_CHECK(weft_dtensor_full_tensor(d, &f));
  if (f->device == WEFT_CPU) {
    *out = f;
    return WEFT_OK;
  }
  weft_status st = weft_tensor_to(f, WEFT_CPU, &h);
  weft_tensor_destroy(f);
  if (st == WEFT_OK) *out = h;
  return st;
}

/* A random f32 DTensor of global shape `shape` with placement pl on the
 * 1-D mesh (every rank passes the same full tensor). */
static weft_dtensor *rand_dt(weft_mesh *mesh, int ndim, const int64_t *shape, weft_placement pl,
                             uint64_t key) {
  weft_tensor *t = NULL;
  weft_dtensor *d = NULL;
  WOK(weft_tensor_create(WEFT_F32, WEFT_CPU, ndim, shape, &t));
  if (!t) return NULL;
  for (int64_t i = 0; i < weft_tensor_numel(t); i++) ((float *)t->data)[i] = (float)urand(key, i);
  WOK(weft_dtensor_distribute(mesh, t, WEFT_DTENSOR_ALL_RANKS, &pl, 1, &d));
  weft_tensor_destroy(t);
  return d;
}

static weft_dtensor *int_dt(weft_mesh *mesh, int ndim, const int64_t *shape, int32_t range,
                            uint64_t key) {
  weft_tensor *t = NULL;
  weft_dtensor *d = NULL;
  WOK(weft_tensor_create(WEFT_I32, WEFT_CPU, ndim, shape, &t));
  if (!t) return NULL;
  for (int64_t i = 0; i < weft_tensor_numel(t); i++)
    ((int32_t *)t->data)[i] = (int32_t)(weft_test_mix64(key + (uint64_t)i) % (uint64_t)range);
  weft_placement r = weft_replicate();
  WOK(weft_dtensor_distribute(mesh, t, WEFT_DTENSOR_ALL_RANKS, &r, 1, &d));
  weft_tensor_destroy(t);
  return d;
}

/* The message without its "[rank N] function: " prefix and breadcrumbs. */
static void message_body(char *buf, size_t cap) {
  const char *m = weft_last_error();
  const char *p = strstr(m, "] ");
  p = p ? p + 2 : m;
  snprintf(buf, cap, "%s", p);
  char *nl = strchr(buf, '\n');
  if (nl) *nl = '\0';
}

/* Every rank has the same message body. */
static void same_on_every_rank(const char *what) {
  char body[2048];
  message_body(body, sizeof body);
  uint64_t h = 1469598103934665603ull, lo = 0, hi = 0;
  for (const char *c = body; *c; c++) h = (h ^ (unsigned char)*c) * 1099511628211ull;
  MPI_Allreduce(&h, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&h, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
  WCHECK(lo == hi, "%s: the message differs between ranks (this rank: %s)", what, body);
}

/* st must be `want`, the message must name the op and each input's spec
 * (weft_dtensor_spec_describe: dtype, shape, placements, mesh). */
static void expect_op_error(weft_status st, weft_status want, const char *op, weft_var *const *in,
                            int nin) {
  WCHECK(st == want, "%s: %s, expected %s (%s)", op, weft_status_str(st), weft_status_str(want),
         weft_last_error());
  char needle[128];
  snprintf(needle, sizeof needle, "%s:", op);
  WCHECK(strstr(weft_last_error(), needle), "%s: message does not name the op: %s", op,
         weft_last_error());
  /* headed by the function the caller called: "[rank N] weft_op_<op>: " */
  snprintf(needle, sizeof needle, "] weft_op_%s: ", op);
  WCHECK(strstr(weft_last_error(), needle), "%s: message not headed by weft_op_%s: %s", op, op,
         weft_last_error());
  for (int i = 0; i < nin; i++) {
    char d[384];
    weft_dtensor_spec_describe(weft_dtensor_get_spec(weft_var_value(in[i])), d, sizeof d);
    WCHECK(strstr(weft_last_error(), d), "%s: message lacks input %d '%s': %s", op, i, d,
           weft_last_error());
  }
  same_on_every_rank(op);
  if (weft_worker_rank == 0) printf("%s\n", weft_last_error());
  weft_clear_error();
}

/* ------------------------------------------------------------- shapes */

static weft_var *in_var(weft_graph *g, weft_dtensor *d) {
  weft_var *v = NULL;
  WOK(weft_graph_input(g, d, weft_dtype_is_float(weft_dtensor_dtype(d)), &v));
  return v;
}

/* Remembers d for destruction. */
static weft_dtensor *keep(weft_dtensor **list, int *n, weft_dtensor *d) {
  list[(*n)++] = d;
  return d;
}

static void case_shapes(void) {
  weft_mesh *mesh = world_mesh();
  WREQUIRE(mesh, "mesh");
  weft_graph *g = NULL;
  WOK(weft_graph_create(&g));
  weft_placement R = weft_replicate(), S0 = weft_shard(0), S1 = weft_shard(1);
  int64_t s235[3] = {2, 3, 5}, s46[2] = {4, 6}, s34[2] = {3, 4}, s52[2] = {5, 2}, s35[2] = {3, 5},
          s24[2] = {2, 4}, s25[2] = {2, 5}, s26[2] = {2, 6}, s8[1] = {7}, s28[2] = {2, 8},
          q[4] = {1, 4, 3, 2}, kv[4] = {1, 4, 2, 2}, s246[3] = {2, 4, 6}, s2x5[2] = {2, 5};
  weft_dtensor *dts[32] = {0};
  int nd = 0;
#define DT(nd_, shape_, pl_) keep(dts, &nd, rand_dt(mesh, nd_, shape_, pl_, 100u + (uint64_t)nd))
  weft_var *out = NULL, *outs[2] = {0};
  /* linear: in features 5 vs 6 */
  weft_var *lin[2] = {in_var(g, DT(3, s235, R)), in_var(g, DT(2, s46, S0))};
  expect_op_error(weft_op_linear(lin[0], lin[1], NULL, &out), WEFT_ERR_INVALID, "linear", lin, 2);
  /* matmul: K 4 vs 5 */
  weft_var *mm[2] = {in_var(g, DT(2, s34, S0)), in_var(g, DT(2, s52, R))};
  expect_op_error(weft_op_matmul(mm[0], mm[1], &out), WEFT_ERR_INVALID, "matmul", mm, 2);
  /* add: (3, 5) is not a suffix of (2, 3, 5)... it is; (2, 4) is not */
  weft_var *ad[2] = {in_var(g, DT(3, s235, S1)), in_var(g, DT(2, s24, R))};
  expect_op_error(weft_op_add(ad[0], ad[1], &out), WEFT_ERR_INVALID, "add", ad, 2);
  /* mul: shapes differ */
  weft_var *mu[2] = {in_var(g, DT(2, s24, S0)), in_var(g, DT(2, s25, R))};
  expect_op_error(weft_op_mul(mu[0], mu[1], &out), WEFT_ERR_INVALID, "mul", mu, 2);
  /* cat along 0: dim 1 differs */
  weft_var *ct[2] = {in_var(g, DT(2, s24, R)), in_var(g, DT(2, s26, S0))};
  expect_op_error(weft_op_cat(ct, 2, 0, &out), WEFT_ERR_INVALID, "cat", ct, 2);
  /* reshape (3, 5) -> (4, -1) */
  weft_var *rs[1] = {in_var(g, DT(2, s35, S0))};
  int64_t to[2] = {4, -1};
  expect_op_error(weft_op_reshape(rs[0], 2, to, &out), WEFT_ERR_INVALID, "reshape", rs, 1);
  /* transpose of dim 5 of a 2-d tensor */
  expect_op_error(weft_op_transpose(rs[0], 0, 5, &out), WEFT_ERR_INVALID, "transpose", rs, 1);
  /* split of 5 columns into 2 + 2 */
  int64_t sizes[2] = {2, 2};
  expect_op_error(weft_op_split(rs[0], 1, 2, sizes, outs), WEFT_ERR_INVALID, "split", rs, 1);
  /* layer_norm of 8 features with a weight of 7 */
  weft_var *ln[2] = {in_var(g, DT(2, s28, S0)), in_var(g, DT(1, s8, R))};
  expect_op_error(weft_op_layer_norm(ln[0], ln[1], NULL, 1e-5f, &out), WEFT_ERR_INVALID,
                  "layer_norm", ln, 2);
  /* sdpa: 3 query heads over 2 kv heads */
  weft_var *sd[3] = {in_var(g, DT(4, q, R)), in_var(g, DT(4, kv, R)), in_var(g, DT(4, kv, R))};
  expect_op_error(weft_op_sdpa(sd[0], sd[1], sd[2], true, &out), WEFT_ERR_INVALID, "sdpa", sd, 3);
  /* cross_entropy: targets (2, 5) for logits (2, 4, 6) */
  weft_var *ce[1] = {in_var(g, DT(3, s246, R))};
  weft_dtensor *tg = int_dt(mesh, 2, s2x5, 6, 3);
  expect_op_error(weft_op_cross_entropy(ce[0], tg, -100, &out), WEFT_ERR_INVALID, "cross_entropy",
                  ce, 1);
  /* embedding with float ids */
  weft_var *em[2] = {in_var(g, DT(2, s24, R)), in_var(g, DT(2, s46, R))};
  expect_op_error(weft_op_embedding(em[0], em[1], &out), WEFT_ERR_INVALID, "embedding", em, 2);
#undef DT
  /* the graph is still usable: a good op and backward (d sum(2 x) = 2) */
  weft_var *y = NULL, *s = NULL, *l = NULL;
  WOK(weft_op_scale(mu[0], 2.0, &y));
  WOK(weft_op_sum(y, 1, false, &s));
  WOK(weft_op_sum(s, 0, true, &l));
  if (l) WOK(weft_backward(l));
  weft_tensor *gx = NULL;
  const weft_dtensor *gd = weft_var_grad(mu[0]);
  WREQUIRE(gd, "no grad after the errors");
  WOK(full_host(gd, &gx));
  for (int64_t i = 0; gx && i < weft_tensor_numel(gx); i++)
    WCHECK(((float *)gx->data)[i] == 2.0f, "grad[%lld] = %g, want 2", (long long)i,
           (double)((float *)gx->data)[i]);
  weft_tensor_destroy(gx);
  weft_graph_destroy(g);
  for (int i = 0; i < nd; i++) weft_dtensor_destroy(dts[i]);
  weft_dtensor_destroy(tg);
  WOK(weft_mesh_destroy(mesh));
}

/* ------------------------------------------------------------- params */

static weft_status noop_forward(weft_module *m, void *ctx, weft_var *const *in, int nin,
                                weft_var **out, int nout) {
  (void)m, (void)ctx, (void)nin, (void)nout;
  out[0] = in[0];
  return WEFT_OK;
}

static const weft_module_def noop_def = {"noop", noop_forward, NULL};

static void expect_msg(weft_status st, weft_status want, const char *what, const char *n1,
                       const char *n2) {
  WCHECK(st == want, "%s: %s, expected %s (%s)", what, weft_status_str(st), weft_status_str(want),
         weft_last_error());
  WCHECK(strstr(weft_last_error(), n1) && (!n2 || strstr(weft_last_error(), n2)),
         "%s: message lacks '%s' / '%s': %s", what, n1, n2 ? n2 : "", weft_last_error());
  if (weft_worker_rank == 0) printf("%s: %s\n", what, weft_last_error());
  weft_clear_error();
}

static void case_params(void) {
  weft_mesh *mesh = world_mesh();
  weft_module *root = NULL, *a = NULL, *b = NULL;
  WOK(weft_module_create(mesh, "root", &noop_def, NULL, &root));
  WOK(weft_module_create(mesh, "a", &noop_def, NULL, &a));
  WOK(weft_module_create(mesh, "b", &noop_def, NULL, &b));
  WREQUIRE(root && a && b, "modules");
  WOK(weft_module_add_child(root, a));
  WOK(weft_module_add_child(root, b));
  int64_t shape[2] = {4, 3};
  weft_param_init init = {WEFT_INIT_NORMAL, 0.0f, 0.02f, 0.0f};
  weft_param *w = NULL, *w2 = NULL;
  WOK(weft_module_add_param(a, "w", 2, shape, init, &w));
  expect_msg(weft_module_add_param(a, "w", 2, shape, init, &w2), WEFT_ERR_INVALID,
             "add_param twice", "'a'", "'w'");
  WCHECK(!w2 && weft_module_num_params(a) == 1 && weft_module_get_param(a, "w") == w,
         "a refused add_param changed the module");
  expect_msg(weft_module_add_param(a, "x.y", 2, shape, init, NULL), WEFT_ERR_INVALID, "dotted name",
             "'x.y'", NULL);
  expect_msg(weft_module_add_param(a, "", 2, shape, init, NULL), WEFT_ERR_INVALID, "empty name",
             "name", NULL);
  /* b ties a.w as "tied"; its name is then taken for b's own parameters */
  WOK(weft_module_tie_param(b, "tied", w));
  expect_msg(weft_module_add_param(b, "tied", 2, shape, init, NULL), WEFT_ERR_INVALID,
             "add_param over a tied alias", "'b'", "'tied'");
  expect_msg(weft_module_tie_param(b, "tied", w), WEFT_ERR_INVALID, "tie twice", "'tied'", NULL);
  expect_msg(weft_module_tie_param(a, "again", w), WEFT_ERR_INVALID, "tie to its owner", "a.w",
             NULL);
  WCHECK(weft_module_num_params(b) == 0 && weft_module_num_tied(b) == 1 &&
             weft_module_get_param(b, "tied") == w,
         "b: %d params, %d tied", weft_module_num_params(b), weft_module_num_tied(b));
  int n = 0;
  WOK(weft_module_parameters(root, NULL, 0, &n));
  WCHECK(n == 1, "root has %d parameters (the tied one counts once)", n);
  WOK(weft_module_destroy(root));

  /* a parameter whose data is set to another's storage (instead of tying):
   * the graph refuses to read it, and destroy frees the storage once */
  WOK(weft_module_create(mesh, "root", &noop_def, NULL, &root));
  WOK(weft_module_create(mesh, "a", &noop_def, NULL, &a));
  WOK(weft_module_create(mesh, "b", &noop_def, NULL, &b));
  WOK(weft_module_add_child(root, a));
  WOK(weft_module_add_child(root, b));
  weft_param *pa = NULL, *pb = NULL;
  WOK(weft_module_add_param(a, "w", 2, shape, init, &pa));
  WOK(weft_module_add_param(b, "w", 2, shape, init, &pb));
  WOK(weft_module_init_weights(root, 5));
  WREQUIRE(pa && pb && pa->data && pb->data, "materialised parameters");
  weft_dtensor_destroy(pb->data);
  pb->data = pa->data; /* the mistake */
  weft_graph *g = NULL;
  WOK(weft_graph_create(&g));
  WCHECK(weft_graph_param(g, pa) != NULL, "the first holder reads fine: %s", weft_last_error());
  WCHECK(weft_graph_param(g, pb) == NULL, "a shared storage was read as a second parameter");
  expect_msg(weft_last_status(), WEFT_ERR_INVALID, "shared storage in a graph", "'a.w' and 'b.w'",
             "weft_module_tie_param");
  weft_graph_destroy(g);
  expect_msg(weft_module_destroy(root), WEFT_ERR_INVALID, "destroy with a shared storage",
             "'a.w' and 'b.w' shared one storage", "freed once");
  WOK(weft_mesh_destroy(mesh));
}

/* ----------------------------------------------------------- backward */

static void case_backward(void) {
  weft_mesh *mesh = world_mesh();
  weft_graph *g = NULL;
  WOK(weft_graph_create(&g));
  int64_t shape[2] = {4, 6};
  weft_dtensor *xd = rand_dt(mesh, 2, shape, weft_shard(0), 9);
  WREQUIRE(g && xd, "setup");
  for (int round = 0; round < 2; round++) {
    weft_var *x = in_var(g, xd), *y = NULL, *s = NULL, *l = NULL;
    /* l = sum(x * x * 0.5): dl/dx = x */
    WOK(weft_op_mul(x, x, &y));
    WOK(weft_op_scale(y, 0.5, &y));
    WOK(weft_op_sum(y, 1, false, &s));
    WOK(weft_op_sum(s, 0, true, &l));
    WREQUIRE(l, "loss");
    WOK(weft_backward(l));
    WCHECK(weft_backward(l) == WEFT_ERR_STATE, "second backward: %s", weft_last_error());
    WCHECK(strstr(weft_last_error(), "already ran backward"), "message: %s", weft_last_error());
    weft_clear_error();
    weft_dtensor *one = NULL;
    int64_t s1[1] = {1};
    weft_placement r = weft_replicate();
    weft_tensor *ot = NULL;
    WOK(weft_tensor_create(WEFT_F32, WEFT_CPU, 1, s1, &ot));
    if (ot) ((float *)ot->data)[0] = 1.0f;
    WOK(weft_dtensor_distribute(mesh, ot, WEFT_DTENSOR_ALL_RANKS, &r, 1, &one));
    WCHECK(weft_backward_grad(l, one) == WEFT_ERR_STATE, "backward_grad after backward accepted");
    weft_clear_error();
    weft_var *z = NULL;
    WCHECK(weft_op_scale(x, 3.0, &z) == WEFT_ERR_STATE && !z, "an op after backward accepted");
    WCHECK(strstr(weft_last_error(), "reset"), "message: %s", weft_last_error());
    weft_clear_error();
    /* the grad is x (double reference: x itself) */
    weft_tensor *gx = NULL, *xf = NULL;
    WOK(full_host(weft_var_grad(x), &gx));
    WOK(full_host(xd, &xf));
    double worst = 0;
    for (int64_t i = 0; gx && xf && i < weft_tensor_numel(gx); i++) {
      double e = fabs((double)((float *)gx->data)[i] - (double)((float *)xf->data)[i]);
      if (e > worst) worst = e;
    }
    WCHECK(gx && xf && worst <= 1e-6, "round %d: grad differs from x by %g", round, worst);
    weft_tensor_destroy(gx);
    weft_tensor_destroy(xf);
    weft_tensor_destroy(ot);
    weft_dtensor_destroy(one);
    WOK(weft_graph_reset(g)); /* and the graph runs again */
  }
  weft_graph_destroy(g);
  weft_dtensor_destroy(xd);
  WOK(weft_mesh_destroy(mesh));
}

/* --------------------------------------------------------------- tied */

typedef struct tied_ctx {
  weft_module *emb, *head;
} tied_ctx;

/* logits = emb(ids) W^T with W = emb.weight, read by head as its tied "weight" */
static weft_status head_forward(weft_module *m, void *ctx, weft_var *const *in, int nin,
                                weft_var **out, int nout) {
  (void)ctx, (void)nin, (void)nout;
  weft_var *w = weft_module_param_var(m, weft_var_graph(in[0]), "weight");
  if (!w) return weft_last_status();
  return weft_op_linear(in[0], w, NULL, out);
}

static weft_status root_forward(weft_module *m, void *ctx, weft_var *const *in, int nin,
                                weft_var **out, int nout) {
  (void)m, (void)nin, (void)nout;
  tied_ctx *c = ctx;
  weft_var *h = NULL;
  WEFT_CHECK(weft_module_call1(c->emb, in[0], &h));
  return weft_module_call1(c->head, h, out);
}

static const weft_module_def head_def = {"tied_head", head_forward, NULL};
static const weft_module_def root_def = {"tied_model", root_forward, NULL};

enum { TV = 6, TD = 4, TB = 2, TT = 3 };

/* Loss and dW in double: logits[p, v] = sum_d W[id_p, d] W[v, d], mean
 * cross-entropy over the B*T positions. */
static double tied_reference(const double *W, const int32_t *ids, const int32_t *tg, double *dW) {
  const int P = TB * TT;
  double loss = 0;
  memset(dW, 0, sizeof(double) * TV * TD);
  for (int p = 0; p < P; p++) {
    double z[TV], mx = -1e300, se = 0;
    for (int v = 0; v < TV; v++) {
      z[v] = 0;
      for (int d = 0; d < TD; d++) z[v] += W[ids[p] * TD + d] * W[v * TD + d];
      if (z[v] > mx) mx = z[v];
    }
    for (int v = 0; v < TV; v++) se += exp(z[v] - mx);
    loss += -(z[tg[p]] - mx - log(se)) / P;
    for (int v = 0; v < TV; v++) {
      double dz = (exp(z[v] - mx) / se - (v == tg[p])) / P;
      for (int d = 0; d < TD; d++) {
        dW[v * TD + d] += dz * W[ids[p] * TD + d]; /* the head's use */
        dW[ids[p] * TD + d] += dz * W[v * TD + d]; /* the embedding's use */
      }
    }
  }
  return loss;
}

static void case_tied(void) {
  weft_mesh *mesh = world_mesh();
  tied_ctx c = {0};
  weft_module *root = NULL;
  WOK(weft_module_create(mesh, "model", &root_def, &c, &root));
  WOK(weft_embedding_create(mesh, "emb", TV, TD, &c.emb));
  WOK(weft_module_create(mesh, "head", &head_def, NULL, &c.head));
  WREQUIRE(root && c.emb && c.head, "modules");
  WOK(weft_module_add_child(root, c.emb));
  WOK(weft_module_add_child(root, c.head));
  weft_param *w = weft_module_get_param(c.emb, "weight");
  WOK(weft_module_tie_param(c.head, "weight", w));
  /* one parameter, one layout: the alias is the owner's parameter */
  WCHECK(weft_module_get_param(c.head, "weight") == w, "the alias is another parameter");
  int64_t ids_shape[2] = {TB, TT};
  weft_dtensor *ids = int_dt(mesh, 2, ids_shape, TV, 5), *tgt = int_dt(mesh, 2, ids_shape, TV, 6);
  double W[TV * TD], dWref[TV * TD];
  for (int i = 0; i < TV * TD; i++) W[i] = (double)(float)urand(77, i);
  weft_tensor *wt = NULL;
  int64_t wshape[2] = {TV, TD};
  WOK(weft_tensor_create(WEFT_F32, WEFT_CPU, 2, wshape, &wt));
  for (int i = 0; wt && i < TV * TD; i++) ((float *)wt->data)[i] = (float)W[i];
  weft_tensor *it = NULL, *tt = NULL;
  WOK(full_host(ids, &it));
  WOK(full_host(tgt, &tt));
  WREQUIRE(wt && it && tt, "data");
  double lref = tied_reference(W, it->data, tt->data, dWref);
  /* Replicate, then vocab-sharded S(0) set through the alias */
  for (int mode = 0; mode < 2; mode++) {
    weft_placement pl = mode ? weft_shard(0) : weft_replicate();
    WOK(weft_param_set_placements(weft_module_get_param(c.head, "weight"), &pl, 1));
    WCHECK(weft_placement_equal(w->spec.placements[0], pl),
           "mode %d: owner's layout not the "
           "alias's",
           mode);
    WOK(weft_param_load(w, wt));
    weft_graph *g = NULL;
    WOK(weft_graph_create(&g));
    weft_var *x = NULL, *logits = NULL, *loss = NULL;
    WOK(weft_graph_input(g, ids, false, &x));
    WOK(weft_module_call1(root, x, &logits));
    WOK(weft_op_cross_entropy(logits, tgt, -100, &loss));
    WREQUIRE(loss, "loss");
    double l = weft_var_item(loss);
    WOK(weft_backward(loss));
    WCHECK(fabs(l - lref) <= 1e-6 * fabs(lref), "mode %d: loss %.9g, double %.9g", mode, l, lref);
    WREQUIRE(w->grad, "no grad");
    WCHECK(weft_placement_equal(weft_dtensor_get_spec(w->grad)->placements[0], pl),
           "mode %d: grad placements differ from the weight's", mode);
    weft_tensor *gf = NULL;
    WOK(full_host(w->grad, &gf));
    double rel = gf ? weft_test_rel_norm_f32_f64(gf->data, dWref, TV * TD) : INFINITY;
    WCHECK(gf && rel <= 1e-5, "mode %d: tied grad rel err %.3g against double", mode, rel);
    if (weft_worker_rank == 0)
      printf("tied %s: loss %.9f (double %.9f), grad rel err %.3g\n", mode ? "S(0)" : "R", l, lref,
             rel);
    weft_tensor_destroy(gf);
    weft_graph_destroy(g);
    WOK(weft_module_zero_grad(root, true));
  }
  weft_tensor_destroy(wt);
  weft_tensor_destroy(it);
  weft_tensor_destroy(tt);
  weft_dtensor_destroy(ids);
  weft_dtensor_destroy(tgt);
  WOK(weft_module_destroy(root));
  WOK(weft_mesh_destroy(mesh));
}

/* -------------------------------------------------------------- debug */

static void expect_mismatch(weft_status st, const char *op0, const char *op1, const char *extra) {
  const char *mine = weft_worker_rank == 0 ? op0 : op1, *theirs = weft_worker_rank == 0 ? op1 : op0;
  char a[128], b[128];
  snprintf(a, sizeof a, "rank %d calls '%s'", weft_worker_rank, mine);
  snprintf(b, sizeof b, "rank %d calls '%s'", 1 - weft_worker_rank, theirs);
  WCHECK(st == WEFT_ERR_MISMATCH, "%s vs %s: %s (%s)", op0, op1, weft_status_str(st),
         weft_last_error());
  WCHECK(strstr(weft_last_error(), a) && strstr(weft_last_error(), b) &&
             (!extra || strstr(weft_last_error(), extra)),
         "%s vs %s: message lacks '%s', '%s' or '%s': %s", op0, op1, a, b, extra ? extra : "",
         weft_last_error());
  if (weft_worker_rank == 0) printf("%s\n", weft_last_error());
  weft_clear_error();
}

/* scale, gelu, add, sum, sum, backward on x (2, 4): the values and grad. */
static void consistent(weft_mesh *mesh, weft_dtensor *xd, float *val, float *grad, int64_t *calls) {
  weft_graph *g = NULL;
  WOK(weft_graph_create(&g));
  weft_comm_stats_reset(mesh);
  weft_var *x = in_var(g, xd), *y = NULL, *h = NULL, *s = NULL, *l = NULL;
  WOK(weft_op_scale(x, 1.5, &y));
  WOK(weft_op_gelu(y, true, &h));
  WOK(weft_op_add(h, x, &h));
  WOK(weft_op_sum(h, 1, false, &s));
  WOK(weft_op_sum(s, 0, true, &l));
  if (l) WOK(weft_backward(l));
  *calls = weft_comm_stats_dim(mesh, 0).calls;
  weft_tensor *v = NULL, *gx = NULL;
  if (l) WOK(full_host(weft_var_value(l), &v));
  if (l) WOK(full_host(weft_var_grad(x), &gx));
  *val = v ? ((float *)v->data)[0] : NAN;
  for (int i = 0; i < 8; i++) grad[i] = gx ? ((float *)gx->data)[i] : NAN;
  weft_tensor_destroy(v);
  weft_tensor_destroy(gx);
  weft_graph_destroy(g);
}

static void case_debug(void) {
  WREQUIRE(weft_get_settings()->debug, "run with WEFT_DEBUG=1");
  WREQUIRE(weft_world_size() == 2, "2 ranks");
  weft_mesh *mesh = world_mesh();
  int r = weft_worker_rank;
  int64_t s24[2] = {2, 4}, s25[2] = {2, 5};
  weft_dtensor *xd = rand_dt(mesh, 2, s24, weft_replicate(), 31);
  weft_dtensor *xo = rand_dt(mesh, 2, r == 0 ? s24 : s25, weft_replicate(), 32);
  WREQUIRE(mesh && xd && xo, "setup");
  /* a consistent graph: the same numbers with and without the check; the
   * check is the only communication of this all-Replicate graph */
  float v_on, v_off, g_on[8], g_off[8];
  int64_t c_on = 0, c_off = 0;
  consistent(mesh, xd, &v_on, g_on, &c_on);
  weft_set_debug(false);
  consistent(mesh, xd, &v_off, g_off, &c_off);
  weft_set_debug(true);
  WCHECK(v_on == v_off && memcmp(g_on, g_off, sizeof g_on) == 0,
         "WEFT_DEBUG changed the numbers: %.9g vs %.9g", (double)v_on, (double)v_off);
  WCHECK(c_off == 0 && c_on > 0, "collectives: %lld with the check, %lld without", (long long)c_on,
         (long long)c_off);
  if (r == 0)
    printf("consistent graph: %lld collectives with WEFT_DEBUG, %lld without\n", (long long)c_on,
           (long long)c_off);

  weft_graph *g = NULL;
  WOK(weft_graph_create(&g));
  weft_var *x = in_var(g, xd), *h = NULL, *y = NULL;
  /* rank 1 skips an op: rank 0's gelu meets rank 1's add */
  weft_status st = WEFT_OK;
  if (r == 0) {
    st = weft_op_gelu(x, true, &h);
    if (st == WEFT_OK) st = weft_op_add(h, x, &y);
  } else {
    st = weft_op_add(x, x, &y);
  }
  expect_mismatch(st, "gelu", "add", "check #0");
  WOK(weft_graph_reset(g));
  /* another op */
  x = in_var(g, xd);
  st = r == 0 ? weft_op_relu(x, &h) : weft_op_silu(x, &h);
  expect_mismatch(st, "relu", "silu", NULL);
  WOK(weft_graph_reset(g));
  /* the same op on other shapes */
  x = in_var(g, xo);
  st = weft_op_gelu(x, true, &h);
  expect_mismatch(st, "gelu", "gelu", r == 0 ? "f32[2, 5]" : "f32[2, 4]");
  WOK(weft_graph_reset(g));
  /* rank 1 goes to backward while rank 0 still calls an op */
  x = in_var(g, xd);
  weft_var *s = NULL, *l = NULL;
  WOK(weft_op_sum(x, 1, false, &s));
  WOK(weft_op_sum(s, 0, true, &l));
  if (r == 0) {
    st = weft_op_scale(l, 2.0, &y);
    if (st == WEFT_OK) st = weft_backward(y);
  } else {
    st = weft_backward(l);
  }
  expect_mismatch(st, "scale", "backward", NULL);
  weft_graph_destroy(g);
  weft_dtensor_destroy(xd);
  weft_dtensor_destroy(xo);
  WOK(weft_mesh_destroy(mesh));
}

/* ------------------------------------------------------------- meshes */

/* st is WEFT_ERR_INVALID on this rank and every other, and the message
 * names the two meshes (their pictures differ between ranks: each rank's
 * own sub-mesh groups). */
static void expect_other_mesh(weft_status st, const char *what, const char *needle) {
  int bad = st != WEFT_ERR_INVALID, any = 0;
  MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  WCHECK(!bad, "%s: %s, expected invalid (%s)", what, weft_status_str(st), weft_last_error());
  WCHECK(!any || bad, "%s: another rank did not refuse", what);
  WCHECK(strstr(weft_last_error(), needle) && strstr(weft_last_error(), "mesh (tp=2)") &&
             strstr(weft_last_error(), "mesh (dp=2)"),
         "%s: message does not name both meshes: %s", what, weft_last_error());
  if (weft_worker_rank == 0) printf("%s\n", weft_last_error());
  weft_clear_error();
}

/* On a 2x2 (dp, tp) mesh the tp and dp sub-meshes have one shape but other
 * ranks: a DTensor of one is refused where the other is expected (an op's
 * inputs, a module's input, cross-entropy's targets), while a sub-mesh
 * taken twice and a mesh made twice alike are accepted. */
static void case_meshes(void) {
  const int shape[2] = {2, 2};
  const char *names[2] = {"dp", "tp"}, *tpn[1] = {"tp"}, *dpn[1] = {"dp"};
  weft_mesh *root = NULL, *tp = NULL, *tp2 = NULL, *dp = NULL;
  WOK(weft_mesh_create(2, shape, names, &root));
  WREQUIRE(root, "mesh");
  WOK(weft_mesh_submesh(root, 1, tpn, &tp));
  WOK(weft_mesh_submesh(root, 1, tpn, &tp2));
  WOK(weft_mesh_submesh(root, 1, dpn, &dp));
  WREQUIRE(tp && tp2 && dp, "sub-meshes");
  WCHECK(weft_mesh_same_ranks(tp, tp2) && weft_mesh_same_ranks(root, root), "same sub-mesh");
  WCHECK(!weft_mesh_same_ranks(tp, dp) && !weft_mesh_same_ranks(dp, tp), "tp vs dp");
  WCHECK(!weft_mesh_same_ranks(tp, root) && !weft_mesh_same_ranks(tp, NULL), "tp vs root");
  int64_t xs[2] = {3, 4}, ws[2] = {5, 4};
  weft_placement r = weft_replicate();
  weft_dtensor *x_dp = rand_dt(dp, 2, xs, r, 11), *x_tp = rand_dt(tp2, 2, xs, r, 11),
               *w_tp = rand_dt(tp, 2, ws, weft_shard(0), 12);
  weft_graph *g = NULL;
  WOK(weft_graph_create(&g));
  weft_var *X = in_var(g, x_dp), *W = in_var(g, w_tp), *y = NULL;
  expect_other_mesh(weft_op_linear(X, W, NULL, &y), "linear on dp and tp", "different meshes");
  WCHECK(y == NULL, "linear on two meshes gave an output");
  /* the same values on the tp mesh taken again: accepted, colwise output */
  weft_var *X2 = in_var(g, x_tp);
  WOK(weft_op_linear(X2, W, NULL, &y));
  WCHECK(y != NULL, "linear on the tp sub-mesh taken twice");
  /* cross-entropy's targets on the other sub-mesh */
  int64_t ts[1] = {3};
  weft_dtensor *t_dp = int_dt(dp, 1, ts, 4, 13);
  weft_var *L = in_var(g, x_tp), *loss = NULL;
  expect_other_mesh(weft_op_cross_entropy(L, t_dp, -100, &loss), "cross_entropy targets",
                    "other ranks");
  weft_graph_destroy(g);
  /* a module on the tp sub-mesh given an input on the dp sub-mesh */
  weft_module *lin = NULL;
  WOK(weft_linear_create(tp, "proj", 4, 5, &lin));
  WREQUIRE(lin, "linear module");
  WOK(weft_module_init_weights(lin, 7));
  const weft_dtensor *out = NULL;
  expect_other_mesh(weft_module_forward(lin, x_dp, &out), "module forward", "the module on");
  WOK(weft_module_forward(lin, x_tp, &out));
  WCHECK(out != NULL, "module forward on its own mesh");
  /* handles used after destroy (issue 34 finding 4): a second destroy of a
   * module or an optimizer, a forward of a destroyed module and a step of a
   * destroyed optimizer are errors, not double frees */
  weft_adamw_params hp = WEFT_ADAMW_DEFAULT;
  weft_optimizer *opt = NULL;
  WOK(weft_adamw_create(lin, &hp, &opt));
  WOK(weft_optimizer_destroy(opt));
  WCHECK(weft_optimizer_destroy(opt) == WEFT_ERR_INVALID &&
             strstr(weft_last_error(), "already destroyed"),
         "optimizer destroyed twice: %s", weft_last_error());
  WCHECK(weft_optimizer_step(opt) == WEFT_ERR_INVALID && strstr(weft_last_error(), "destroyed"),
         "step of a destroyed optimizer: %s", weft_last_error());
  WOK(weft_module_destroy(lin));
  WCHECK(weft_module_destroy(lin) == WEFT_ERR_INVALID &&
             strstr(weft_last_error(), "already destroyed"),
         "module destroyed twice: %s", weft_last_error());
  WCHECK(weft_module_forward(lin, x_tp, &out) == WEFT_ERR_INVALID &&
             strstr(weft_last_error(), "destroyed"),
         "forward of a destroyed module: %s", weft_last_error());
  weft_clear_error();
  lin = NULL;
  weft_dtensor *d[] = {x_dp, x_tp, w_tp, t_dp};
  for (size_t i = 0; i < sizeof d / sizeof d[0]; i++) weft_dtensor_destroy(d[i]);
  WOK(weft_mesh_destroy(dp));
  WOK(weft_mesh_destroy(tp2));
  WOK(weft_mesh_destroy(tp));
  WOK(weft_mesh_destroy(root));
}

static const weft_worker_case cases[] = {
    {"shapes", case_shapes},
    {"params", case_params},
    {"backward", case_backward},
    {"tied", case_tied},
    {"debug", case_debug},
    {"meshes", case_meshes},
    {NULL, NULL},
};

int main(int argc, char **argv) { return weft_worker_main(argc, argv, cases); }
