/* tests/nn/nn_worker.c — MPI worker cases of the nn suite (started by
 * test_nn.c through mpiexec). Every rank checks; see tests/harness/worker.h.
 *
 * Device mode: with WEFT_TEST_DEVICE=cuda every root mesh (the world, the
 * 2-D mesh of clip and the 1-rank reference mesh of init) is put on
 * WEFT_CUDA as it is made (weft_worker_mesh_on_device), so models,
 * optimizers and grads live there; the worker reads numbers only through
 * host copies (weft_worker_host_copy) and writes them by copying a host
 * tensor over (weft_tensor_copy). Memory checks look at the mesh's device.
 * Unset, everything stays on the CPU and no copy is made. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nn_util.h"
#include "worker.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static bool ends_with(const char *s, const char *suf) {
  size_t a = strlen(s), b = strlen(suf);
  return a >= b && strcmp(s + a - b, suf) == 0;
}

/* ------------------------------------------------------ host access */

/* The n floats of t (any device) in a new host array (free it); NULL,
 * with a failed check, when the copy fails. */
static float *host_floats(const weft_tensor *t, int64_t *n) {
  int64_t k = t ? weft_tensor_numel(t) : 0;
  if (n) *n = k;
  weft_tensor *tmp = NULL;
  const weft_tensor *h = weft_worker_host_copy(t, &tmp);
  float *c = h ? malloc((size_t)(k ? k : 1) * sizeof(float)) : NULL;
  if (c && k) memcpy(c, h->data, (size_t)k * sizeof(float));
  weft_tensor_destroy(tmp);
  return c;
}

/* Moves the host tensor *t to the mesh's device (nothing on a CPU mesh). */
static weft_status to_mesh_device(const weft_mesh *mesh, weft_tensor **t) {
  weft_device dev = weft_mesh_device(mesh);
  if ((*t)->device == dev) return WEFT_OK;
  weft_tensor *d = NULL;
  WEFT_CHECK(weft_tensor_to(*t, dev, &d));
  weft_tensor_destroy(*t);
  *t = d;
  return WEFT_OK;
}

/* ------------------------------------------------- a test-side TP plan */

/* What tp/ will do, written out by hand: colwise wq wk wv w1 w3 output,
 * rowwise wo w2 tok_embeddings; with sp, sequence-parallel norms and the
 * redistributes around attention / feed_forward / output as hooks. */
typedef struct redist_ctx {
  int n;
  weft_placement pl[WEFT_MESH_MAX_DIMS];
} redist_ctx;

static weft_status hook_redistribute(weft_module *m, weft_hook_kind kind, const weft_dtensor *t,
                                     weft_dtensor **replace, void *ctx) {
  (void)m;
  (void)kind;
  const redist_ctx *c = ctx;
  const weft_placement *have = weft_dtensor_placements(t);
  bool same = true;
  for (int i = 0; i < c->n; i++) same &= weft_placement_equal(have[i], c->pl[i]);
  if (same) return WEFT_OK;
  return weft_dtensor_redistribute(t, c->pl, c->n, replace);
}

static redist_ctx ctx_r = {1, {{WEFT_PLACE_REPLICATE, 0, 1, WEFT_OP_SUM}}};
static redist_ctx ctx_s1 = {1, {{WEFT_PLACE_SHARD, 1, 1, WEFT_OP_SUM}}};

static weft_status plan_visit(weft_module *m, void *ctx) {
  bool sp = *(bool *)ctx;
  const char *f = weft_module_fqn(m);
  weft_placement s0 = weft_shard(0), s1 = weft_shard(1);
  weft_param *w = weft_module_num_params(m) ? weft_module_param(m, 0) : NULL;
  if (weft_module_get_kind(m) == WEFT_MODULE_LINEAR) {
    bool col = ends_with(f, ".wq") || ends_with(f, ".wk") || ends_with(f, ".wv") ||
               ends_with(f, ".w1") || ends_with(f, ".w3") || strcmp(f, "output") == 0;
    WEFT_CHECK(weft_param_set_placements(w, col ? &s0 : &s1, 1));
  }
  if (strcmp(f, "tok_embeddings") == 0) {
    WEFT_CHECK(weft_param_set_placements(w, &s0, 1));
    WEFT_CHECK(weft_module_register_hook(m, WEFT_HOOK_POST_FORWARD, hook_redistribute,
                                         sp ? &ctx_s1 : &ctx_r, NULL));
  }
  if (sp) {
    weft_module_kind k = weft_module_get_kind(m);
    if (k == WEFT_MODULE_ATTENTION || k == WEFT_MODULE_FEED_FORWARD) {
      WEFT_CHECK(
          weft_module_register_hook(m, WEFT_HOOK_PRE_FORWARD, hook_redistribute, &ctx_r, NULL));
      WEFT_CHECK(
          weft_module_register_hook(m, WEFT_HOOK_POST_FORWARD, hook_redistribute, &ctx_s1, NULL));
    }
    if (strcmp(f, "output") == 0)
      WEFT_CHECK(
          weft_module_register_hook(m, WEFT_HOOK_PRE_FORWARD, hook_redistribute, &ctx_r, NULL));
  }
  return WEFT_OK;
}

/* ------------------------------------------------------------- golden */

/* plan 0: all Replicate; 1: TP; 2: TP + sequence parallel. */
static void run_golden(const char *name, int plan) {
  golden g;
  WOK(golden_load(name, &g));
  weft_mesh *mesh = NULL;
  WOK(mesh_world(&mesh));
  weft_module *model = NULL;
  WOK(weft_llama_create(&g.cfg, mesh, &model));
  WREQUIRE(model, "no model");
  if (plan) {
    bool sp = plan == 2;
    WOK(weft_module_visit(model, plan_visit, &sp));
  }
  char path[700];
  golden_path(&g, "init.safetensors", path, sizeof path);
  WOK(load_params(model, path));
  double loss = 0;
  double t0 = now_s();
  WOK(weft_llama_forward(model, g.tokens, g.targets, &loss));
  WOK(weft_llama_backward(model));
  double t1 = now_s();
  double lerr = fabs(loss - g.loss) / fabs(g.loss);
  WCHECK(lerr < 2e-6, "%s plan %d: loss %.9f want %.9f (rel %.3g)", name, plan, loss, g.loss, lerr);

  weft_param *ps[256];
  int np = 0;
  WOK(weft_module_parameters(model, ps, 256, &np));
  WCHECK(np == 2 + 9 * (int)g.cfg.n_layers + 1, "param count %d", np);
  double worst_g = 0;
  const char *worst_p = "";
  WOK(golden_worst_grad_err(&g, ps, np, &worst_g, &worst_p));
  WCHECK(worst_g < 1e-5, "%s plan %d: grad %s rel err %.3g", name, plan, worst_p, worst_g);
  /* clip + one AdamW step */
  double norm = 0;
  WOK(weft_clip_grad_norm(model, g.clip, &norm));
  double nerr = fabs(norm - g.grad_norm) / g.grad_norm;
  WCHECK(nerr < 1e-5, "%s plan %d: grad norm %.9f want %.9f", name, plan, norm, g.grad_norm);
  weft_optimizer *opt = NULL;
  WOK(weft_adamw_create(model, &g.hp, &opt));
  double t2 = now_s();
  WOK(weft_optimizer_step(opt));
  double t3 = now_s();
  double worst_u = 0;
  const char *worst_up = "";
  WOK(golden_worst_update_err(&g, ps, np, false, &worst_u, &worst_up, NULL, NULL));
  WCHECK(worst_u < 1e-3, "%s plan %d: update of %s rel err %.3g", name, plan, worst_up, worst_u);
  /* more steps: memory in use comes back to the same level each step
   * (redistributes under TP allocate, but nothing is left behind), on the
   * host and, in device mode, on the mesh's device */
  weft_device devs[2] = {WEFT_CPU, weft_mesh_device(mesh)};
  int ndev = devs[1] == WEFT_CPU ? 1 : 2;
  int64_t bytes[2][4] = {{0}}, allocs[2][4] = {{0}};
  for (int s = 0; s < 4; s++) {
    WOK(weft_module_zero_grad(model, false));
    WOK(weft_llama_forward(model, g.tokens, g.targets, NULL));
    WOK(weft_llama_backward(model));
    WOK(weft_clip_grad_norm(model, g.clip, NULL));
    WOK(weft_optimizer_step(opt));
    for (int d = 0; d < ndev; d++) {
      weft_mem_stats ms = weft_mem_get(devs[d]);
      bytes[d][s] = ms.current_bytes;
      allocs[d][s] = ms.alloc_count;
    }
  }
  for (int d = 0; d < ndev; d++) {
    const char *dn = weft_device_name(devs[d]);
    WCHECK(bytes[d][3] == bytes[d][2] && bytes[d][2] == bytes[d][1],
           "%s plan %d: %s bytes in use %lld %lld %lld", name, plan, dn, (long long)bytes[d][1],
           (long long)bytes[d][2], (long long)bytes[d][3]);
    WCHECK(plan != 0 || allocs[d][3] == allocs[d][2],
           "%s: %lld %s allocations in a replicated step", name,
           (long long)(allocs[d][3] - allocs[d][2]), dn);
  }
  if (weft_worker_rank == 0)
    printf(
        "golden %s plan %d ranks %d: loss rel err %.3g, worst grad rel err %.3g, norm rel err "
        "%.3g, worst update rel err %.3g; fwd+bwd %.2f ms, adamw %.2f ms\n",
        name, plan, weft_world_size(), lerr, worst_g, nerr, worst_u, 1e3 * (t1 - t0),
        1e3 * (t3 - t2));
  weft_optimizer_destroy(opt);
  WOK(weft_module_destroy(model));
  WOK(weft_mesh_destroy(mesh));
  golden_free(&g);
}

static void case_golden(void) {
  run_golden("tiny_mha", 0);
  run_golden("tiny_gqa", 0);
}

static void case_golden_tp(void) {
  run_golden("tiny_mha", 1);
  run_golden("tiny_gqa", 1);
  run_golden("tiny_mha", 2);
  run_golden("tiny_gqa", 2);
}

/* ---------------------------------------------------------------- hooks */

typedef struct trace {
  char e[512][64];
  int n;
  int grad_missing; /* post-backward saw a parameter without grad */
} trace;

static weft_status hook_trace(weft_module *m, weft_hook_kind kind, const weft_dtensor *t,
                              weft_dtensor **replace, void *ctx) {
  (void)t;
  (void)replace;
  trace *tr = ctx;
  static const char *const tag[] = {"F>", "F<", "B>", "B<"};
  const char *f = weft_module_fqn(m);
  if (tr->n < 512) snprintf(tr->e[tr->n++], 64, "%s%s", tag[kind], f[0] ? f : "(root)");
  if (kind == WEFT_HOOK_POST_BACKWARD)
    for (int i = 0; i < weft_module_num_params(m); i++)
      if (!weft_module_param(m, i)->grad) tr->grad_missing++;
  return WEFT_OK;
}

static weft_status reg_trace(weft_module *m, void *ctx) {
  for (int k = 0; k < WEFT_HOOK_KIND_COUNT; k++)
    WEFT_CHECK(weft_module_register_hook(m, (weft_hook_kind)k, hook_trace, ctx, NULL));
  return WEFT_OK;
}

/* A new DTensor like t with every local element * a + b. */
static weft_status affine_copy(const weft_dtensor *t, float a, float b, weft_dtensor **out) {
  const weft_dtensor_spec *s = weft_dtensor_get_spec(t);
  WEFT_CHECK(weft_dtensor_empty(weft_dtensor_mesh(t), s->dtype, s->ndim, s->shape, s->placements,
                                s->mesh_ndim, out));
  weft_tensor *dst = weft_dtensor_local(*out), *h = NULL;
  int64_t n = 0;
  float *x = host_floats(weft_dtensor_local(t), &n);
  if (!x) return weft_error(WEFT_ERR_INTERNAL, "affine_copy: no host copy of the input");
  weft_status st = weft_tensor_create(WEFT_F32, WEFT_CPU, dst->ndim, dst->shape, &h);
  if (st == WEFT_OK) {
    float *y = h->data;
    for (int64_t i = 0; i < n; i++) y[i] = x[i] * a + b;
    st = weft_tensor_copy(dst, h); /* to the output's device */
  }
  weft_tensor_destroy(h);
  free(x);
  return st;
}

typedef struct affine {
  float a, b;
  int calls;
} affine;

static weft_status hook_affine(weft_module *m, weft_hook_kind kind, const weft_dtensor *t,
                               weft_dtensor **replace, void *ctx) {
  (void)m;
  (void)kind;
  affine *af = ctx;
  af->calls++;
  return affine_copy(t, af->a, af->b, replace);
}

static weft_status hook_fail(weft_module *m, weft_hook_kind kind, const weft_dtensor *t,
                             weft_dtensor **replace, void *ctx) {
  (void)m, (void)kind, (void)t, (void)replace, (void)ctx;
  return weft_error(WEFT_ERR_INVALID, "test hook says no");
}

static weft_status hook_bad_shape(weft_module *m, weft_hook_kind kind, const weft_dtensor *t,
                                  weft_dtensor **replace, void *ctx) {
  (void)m, (void)kind, (void)ctx;
  const weft_dtensor_spec *s = weft_dtensor_get_spec(t);
  int64_t shape[WEFT_MAX_DIMS];
  memcpy(shape, s->shape, sizeof shape);
  shape[0] += 1;
  return weft_dtensor_zeros(weft_dtensor_mesh(t), s->dtype, s->ndim, shape, s->placements,
                            s->mesh_ndim, replace);
}

static float *copy_local(const weft_dtensor *d, int64_t *n) {
  return host_floats(weft_dtensor_local(d), n);
}

static weft_llama_config small_cfg(int64_t layers, int64_t heads, int64_t kv, int64_t vocab) {
  weft_llama_config c = WEFT_LLAMA_CONFIG_INIT;
  c.dim = 16;
  c.n_layers = layers;
  c.n_heads = heads;
  c.n_kv_heads = kv;
  c.ffn_dim = 40;
  c.vocab = vocab;
  c.max_seq_len = 8;
  return c;
}

static void random_ids(weft_tensor **t, int64_t B, int64_t T, int64_t V, uint32_t seed) {
  int64_t shape[2] = {B, T};
  weft_tensor_create(WEFT_I32, WEFT_CPU, 2, shape, t);
  int32_t *p = (*t)->data;
  uint32_t x = seed * 2654435761u + 1;
  for (int64_t i = 0; i < B * T; i++) {
    x = x * 1664525u + 1013904223u;
    p[i] = (int32_t)((x >> 8) % (uint32_t)V);
  }
}

static void case_hooks(void) {
  weft_mesh *mesh = NULL;
  WOK(mesh_world(&mesh));
  /* 1. order: every hook of every module of a 1-layer model */
  weft_llama_config cfg = small_cfg(1, 2, 1, 11);
  weft_module *model = NULL;
  WOK(weft_llama_create(&cfg, mesh, &model));
  WOK(weft_module_init_weights(model, 7));
  trace *tr = calloc(1, sizeof *tr);
  WOK(weft_module_visit(model, reg_trace, tr));
  weft_tensor *tok, *tgt;
  random_ids(&tok, 2, 5, cfg.vocab, 1);
  random_ids(&tgt, 2, 5, cfg.vocab, 2);
  double loss;
  WOK(weft_llama_forward(model, tok, tgt, &loss));
  WOK(weft_llama_backward(model));
  static const char *const want[] = {"F>(root)",
                                     "F>tok_embeddings",
                                     "F<tok_embeddings",
                                     "F>layers",
                                     "F>layers.0",
                                     "F>layers.0.attention_norm",
                                     "F<layers.0.attention_norm",
                                     "F>layers.0.attention",
                                     "F>layers.0.attention.wq",
                                     "F<layers.0.attention.wq",
                                     "F>layers.0.attention.wk",
                                     "F<layers.0.attention.wk",
                                     "F>layers.0.attention.wv",
                                     "F<layers.0.attention.wv",
                                     "F>layers.0.attention.wo",
                                     "F<layers.0.attention.wo",
                                     "F<layers.0.attention",
                                     "F>layers.0.ffn_norm",
                                     "F<layers.0.ffn_norm",
                                     "F>layers.0.feed_forward",
                                     "F>layers.0.feed_forward.w1",
                                     "F<layers.0.feed_forward.w1",
                                     "F>layers.0.feed_forward.w3",
                                     "F<layers.0.feed_forward.w3",
                                     "F>layers.0.feed_forward.w2",
                                     "F<layers.0.feed_forward.w2",
                                     "F<layers.0.feed_forward",
                                     "F<layers.0",
                                     "F<layers",
                                     "F>norm",
                                     "F<norm",
                                     "F>output",
                                     "F<output",
                                     "F>loss",
                                     "F<loss",
                                     "F<(root)",
                                     "B>(root)",
                                     "B>loss",
                                     "B<loss",
                                     "B>output",
                                     "B<output",
                                     "B>norm",
                                     "B<norm",
                                     "B>layers",
                                     "B>layers.0",
                                     "B>layers.0.feed_forward",
                                     "B>layers.0.feed_forward.w2",
                                     "B<layers.0.feed_forward.w2",
                                     "B>layers.0.feed_forward.w1",
                                     "B<layers.0.feed_forward.w1",
                                     "B>layers.0.feed_forward.w3",
                                     "B<layers.0.feed_forward.w3",
                                     "B<layers.0.feed_forward",
                                     "B>layers.0.ffn_norm",
                                     "B<layers.0.ffn_norm",
                                     "B>layers.0.attention",
                                     "B>layers.0.attention.wo",
                                     "B<layers.0.attention.wo",
                                     "B>layers.0.attention.wq",
                                     "B<layers.0.attention.wq",
                                     "B>layers.0.attention.wk",
                                     "B<layers.0.attention.wk",
                                     "B>layers.0.attention.wv",
                                     "B<layers.0.attention.wv",
                                     "B<layers.0.attention",
                                     "B>layers.0.attention_norm",
                                     "B<layers.0.attention_norm",
                                     "B<layers.0",
                                     "B<layers",
                                     "B>tok_embeddings",
                                     "B<tok_embeddings",
                                     "B<(root)"};
  int nw = (int)(sizeof want / sizeof want[0]);
  WCHECK(tr->n == nw, "trace has %d entries, want %d", tr->n, nw);
  for (int i = 0; i < nw && i < tr->n; i++)
    WCHECK(strcmp(tr->e[i], want[i]) == 0, "trace[%d] = %s, want %s", i, tr->e[i], want[i]);
  WCHECK(tr->grad_missing == 0, "%d params without grad at their post-backward", tr->grad_missing);
  free(tr);
  WOK(weft_module_destroy(model));

  /* 2. replacements are honoured, in forward and backward */
  weft_module *lin = NULL;
  WOK(weft_linear_create(mesh, "lin", 4, 3, &lin));
  WOK(weft_module_init_weights(lin, 3));
  weft_placement r = weft_replicate();
  int64_t xs[3] = {2, 5, 4}, ys[3] = {2, 5, 3};
  weft_dtensor *x = NULL, *dy = NULL;
  WOK(weft_dtensor_empty(mesh, WEFT_F32, 3, xs, &r, 1, &x));
  WOK(weft_dtensor_empty(mesh, WEFT_F32, 3, ys, &r, 1, &dy));
  WOK(weft_dtensor_fill_normal(x, 5, weft_rng_key("x"), 0, 1));
  WOK(weft_dtensor_fill_normal(dy, 5, weft_rng_key("dy"), 0, 1));
  const weft_dtensor *y = NULL, *dx = NULL;
  WOK(weft_module_forward(lin, x, &y));
  int64_t ny, ndx, ngw;
  float *y0 = copy_local(y, &ny);
  const weft_dtensor *y_plain = y;
  WOK(weft_module_backward(lin, dy, &dx));
  float *dx0 = copy_local(dx, &ndx);
  weft_param *w = weft_module_param(lin, 0);
  float *gw0 = copy_local(w->grad, &ngw);
  WOK(weft_module_zero_grad(lin, false));
  affine pre = {2, 0, 0}, post = {1, 1, 0}, pre_b = {3, 0, 0}, post_b = {5, 0, 0};
  weft_hook_handle h[4];
  WOK(weft_module_register_hook(lin, WEFT_HOOK_PRE_FORWARD, hook_affine, &pre, &h[0]));
  WOK(weft_module_register_hook(lin, WEFT_HOOK_POST_FORWARD, hook_affine, &post, &h[1]));
  WOK(weft_module_register_hook(lin, WEFT_HOOK_PRE_BACKWARD, hook_affine, &pre_b, &h[2]));
  WOK(weft_module_register_hook(lin, WEFT_HOOK_POST_BACKWARD, hook_affine, &post_b, &h[3]));
  WOK(weft_module_forward(lin, x, &y));
  WCHECK(y != y_plain, "post-forward replacement not returned");
  int64_t n1 = 0;
  float *y1 = copy_local(y, &n1);
  for (int64_t i = 0; y1 && i < ny; i++)
    WCHECK(y1[i] == 2 * y0[i] + 1, "y[%lld] = %g, want 2*%g+1", (long long)i, y1[i], y0[i]);
  free(y1);
  WOK(weft_module_backward(lin, dy, &dx));
  float *dx1 = copy_local(dx, &n1), *gw1 = copy_local(w->grad, &n1);
  WREQUIRE(dx1 && gw1, "host copies of dx and dW");
  for (int64_t i = 0; i < ndx; i++)
    WCHECK(fabsf(dx1[i] - 15 * dx0[i]) <= 1e-5f * (fabsf(15 * dx0[i]) + 1e-3f),
           "dx[%lld] = %g, want 15*%g", (long long)i, dx1[i], dx0[i]);
  for (int64_t i = 0; i < ngw; i++)
    WCHECK(fabsf(gw1[i] - 6 * gw0[i]) <= 1e-5f * (fabsf(6 * gw0[i]) + 1e-3f),
           "dW[%lld] = %g, want 6*%g (input x2 and grad x3)", (long long)i, gw1[i], gw0[i]);
  free(dx1);
  free(gw1);
  WCHECK(pre.calls == 1 && post.calls == 1 && pre_b.calls == 1 && post_b.calls == 1,
         "hook calls %d %d %d %d", pre.calls, post.calls, pre_b.calls, post_b.calls);
  for (int i = 0; i < 4; i++) WOK(weft_hook_remove(h[i]));
  WCHECK(weft_hook_remove(h[0]) == WEFT_ERR_NOT_FOUND, "second remove: %s", weft_last_error());
  WOK(weft_module_forward(lin, x, &y));
  WCHECK(y == y_plain, "after removal the plain output comes back");
  y1 = copy_local(y, &n1);
  WCHECK(y1 && memcmp(y1, y0, (size_t)ny * sizeof(float)) == 0,
         "output after removing hooks differs");
  free(y1);
  /* a hook's error aborts; a wrong-shape replacement is rejected */
  weft_hook_handle hf;
  WOK(weft_module_register_hook(lin, WEFT_HOOK_PRE_FORWARD, hook_fail, NULL, &hf));
  weft_status st = weft_module_forward(lin, x, &y);
  WCHECK(st == WEFT_ERR_INVALID && strstr(weft_last_error(), "test hook says no"), "got %s: %s",
         weft_status_str(st), weft_last_error());
  WOK(weft_hook_remove(hf));
  WOK(weft_module_register_hook(lin, WEFT_HOOK_POST_FORWARD, hook_bad_shape, NULL, &hf));
  st = weft_module_forward(lin, x, &y);
  WCHECK(st == WEFT_ERR_INVALID && strstr(weft_last_error(), "global shape"), "got %s: %s",
         weft_status_str(st), weft_last_error());
  WOK(weft_hook_remove(hf));
  /* backward needs a forward; one backward per forward */
  st = weft_module_backward(lin, dy, &dx);
  WCHECK(st == WEFT_ERR_STATE, "backward after a failed forward: %s", weft_status_str(st));
  WOK(weft_module_forward(lin, x, &y));
  WOK(weft_module_backward(lin, dy, &dx));
  st = weft_module_backward(lin, dy, &dx);
  WCHECK(st == WEFT_ERR_STATE, "second backward: %s", weft_status_str(st));
  free(y0);
  free(dx0);
  free(gw0);
  weft_dtensor_destroy(x);
  weft_dtensor_destroy(dy);
  WOK(weft_module_destroy(lin));
  weft_tensor_destroy(tok);
  weft_tensor_destroy(tgt);
  WOK(weft_mesh_destroy(mesh));
}

/* ----------------------------------------------------------------- init */

/* The reference fill of a parameter on one rank: the whole tensor from the
 * counter RNG keyed by its FQN (normal) or the constant. */
static weft_status reference_fill(const weft_param *p, uint64_t seed, weft_tensor **out) {
  WEFT_CHECK(weft_tensor_create(WEFT_F32, WEFT_CPU, p->spec.ndim, p->spec.shape, out));
  if (p->init.kind == WEFT_INIT_NORMAL)
    return weft_tensor_fill_normal(*out, seed, weft_rng_key(p->fqn), NULL, p->init.mean,
                                   p->init.std);
  return weft_tensor_fill(*out, p->init.value);
}

static void case_init(void) {
  weft_mesh *mesh2 = NULL, *mesh1 = NULL;
  WOK(mesh_world(&mesh2));
  int one = 1;
  const char *names[1] = {"tp"};
  WOK(weft_mesh_create_from_comm(MPI_COMM_SELF, 1, &one, names, &mesh1));
  weft_worker_mesh_on_device(mesh1);
  /* vocab 31: the Shard(0) embedding and output split unevenly (16 / 15) */
  weft_llama_config cfg = small_cfg(2, 4, 2, 31);
  weft_module *m2 = NULL, *m1 = NULL;
  WOK(weft_llama_create(&cfg, mesh2, &m2));
  WOK(weft_llama_create(&cfg, mesh1, &m1));
  WREQUIRE(m1 && m2, "models");
  bool sp = false;
  WOK(weft_module_visit(m2, plan_visit, &sp)); /* Shard(0) / Shard(1) weights */
  WOK(weft_module_init_weights(m2, 42));
  WOK(weft_module_init_weights(m1, 42));
  weft_param *p2[128], *p1[128];
  int n2, n1;
  WOK(weft_module_parameters(m2, p2, 128, &n2));
  WOK(weft_module_parameters(m1, p1, 128, &n1));
  WREQUIRE(n1 == n2 && n1 == 2 + 9 * 2 + 1, "param counts %d %d", n1, n2);
  int sharded = 0;
  for (int i = 0; i < n1; i++) {
    WCHECK(strcmp(p1[i]->fqn, p2[i]->fqn) == 0, "fqn %s vs %s", p1[i]->fqn, p2[i]->fqn);
    if (weft_placement_is_shard(p2[i]->spec.placements[0])) sharded++;
    weft_tensor *full = NULL, *ref = NULL;
    WOK(weft_dtensor_full_tensor(p2[i]->data, &full));
    WOK(reference_fill(p1[i], 42, &ref));
    WCHECK(full && weft_worker_equal_on_host(full, weft_dtensor_local(p1[i]->data)),
           "%s: sharded init differs from the 1-rank init (seed 42)", p1[i]->fqn);
    WCHECK(ref && weft_worker_equal_on_host(ref, weft_dtensor_local(p1[i]->data)),
           "%s: init differs from the RNG keyed by its FQN", p1[i]->fqn);
    weft_tensor_destroy(full);
    weft_tensor_destroy(ref);
  }
  WCHECK(sharded == 7 * 2 + 2, "%d sharded params", sharded);
  /* another seed gives other weights */
  WOK(weft_module_init_weights(m1, 43));
  weft_tensor *ref = NULL;
  WOK(reference_fill(p1[0], 42, &ref));
  WCHECK(!weft_worker_equal_on_host(ref, weft_dtensor_local(p1[0]->data)), "seed 43 == seed 42");
  weft_tensor_destroy(ref);
  /* set_placements on materialised data keeps the global values */
  weft_param *wq;
  WOK(weft_module_find_param(m2, "layers.1.attention.wq.weight", &wq));
  weft_tensor *before = NULL, *after = NULL;
  WOK(weft_dtensor_full_tensor(wq->data, &before));
  weft_placement s1 = weft_shard(1), r = weft_replicate();
  WOK(weft_param_set_placements(wq, &s1, 1));
  WCHECK(weft_placement_equal(weft_dtensor_placements(wq->data)[0], s1), "placement not applied");
  WOK(weft_dtensor_full_tensor(wq->data, &after));
  WCHECK(before && after && weft_worker_equal_on_host(before, after),
         "set_placements changed values");
  WOK(weft_param_set_placements(wq, &r, 1));
  weft_tensor_destroy(after);
  WOK(weft_dtensor_full_tensor(wq->data, &after));
  WCHECK(after && weft_worker_equal_on_host(before, after), "back to R changed values");
  weft_placement pbad = weft_partial(WEFT_OP_SUM);
  WCHECK(weft_param_set_placements(wq, &pbad, 1) == WEFT_ERR_INVALID, "Partial param accepted");
  weft_tensor_destroy(before);
  weft_tensor_destroy(after);
  WOK(weft_module_destroy(m1));
  WOK(weft_module_destroy(m2));
  WOK(weft_mesh_destroy(mesh1));
  WOK(weft_mesh_destroy(mesh2));
}

/* ------------------------------------------------------------- clipping */

/* Gives p a grad filled from the RNG by global index (key: fqn + "#g"), so
 * every placement describes the same global gradient; with `partial`,
 * Partial(sum) pieces (rank r holds (r+1)/S of it, S = sum over ranks). */
static weft_status set_grad(weft_param *p, bool partial) {
  char key[160];
  snprintf(key, sizeof key, "%s#g", p->fqn);
  const weft_dtensor_spec *s = weft_dtensor_get_spec(p->data);
  weft_dtensor_destroy(p->grad);
  p->grad = NULL;
  if (!partial) {
    WEFT_CHECK(weft_dtensor_empty(weft_dtensor_mesh(p->data), WEFT_F32, s->ndim, s->shape,
                                  s->placements, s->mesh_ndim, &p->grad));
    return weft_dtensor_fill_normal(p->grad, 9, weft_rng_key(key), 0, 1);
  }
  weft_tensor *full;
  WEFT_CHECK(weft_tensor_create(WEFT_F32, WEFT_CPU, s->ndim, s->shape, &full));
  WEFT_CHECK(weft_tensor_fill_normal(full, 9, weft_rng_key(key), NULL, 0, 1));
  int n = weft_world_size(), rk = weft_world_rank();
  WEFT_CHECK(weft_scale(full, (double)(rk + 1) / (n * (n + 1) / 2.0)));
  WEFT_CHECK(to_mesh_device(weft_dtensor_mesh(p->data), &full));
  weft_placement pl[WEFT_MESH_MAX_DIMS];
  for (int i = 0; i < s->mesh_ndim; i++) pl[i] = weft_partial(WEFT_OP_SUM);
  return weft_dtensor_from_local(weft_dtensor_mesh(p->data), full, WEFT_LOCAL_TAKE, pl,
                                 s->mesh_ndim, s->shape, &p->grad);
}

static double ref_sumsq(const weft_param *p) {
  char key[160];
  snprintf(key, sizeof key, "%s#g", p->fqn);
  weft_tensor *full;
  weft_tensor_create(WEFT_F32, WEFT_CPU, p->spec.ndim, p->spec.shape, &full);
  weft_tensor_fill_normal(full, 9, weft_rng_key(key), NULL, 0, 1);
  double s = 0;
  const float *x = full->data;
  for (int64_t i = 0; i < weft_tensor_numel(full); i++) s += (double)x[i] * x[i];
  weft_tensor_destroy(full);
  return s;
}

static weft_module *lin_on(weft_mesh *mesh, weft_module *parent, const char *name, int64_t in,
                           int64_t out, weft_placement pl0, weft_placement pl1, int nd) {
  weft_module *l = NULL;
  WOK(weft_linear_create(mesh, name, in, out, &l));
  if (!l) return NULL;
  weft_placement pl[2] = {pl0, pl1};
  WOK(weft_param_set_placements(weft_module_param(l, 0), pl, nd));
  WOK(weft_module_add_child(parent, l));
  return l;
}

static void case_clip(void) {
  weft_mesh *m1 = NULL, *m2 = NULL;
  WOK(mesh_world(&m1));
  int shape[2] = {weft_world_size(), 1};
  const char *names[2] = {"dp", "tp"};
  WOK(weft_mesh_create(2, shape, names, &m2));
  weft_worker_mesh_on_device(m2);
  weft_placement R = weft_replicate(), S0 = weft_shard(0), S1 = weft_shard(1);
  weft_module *a = NULL, *b = NULL;
  WOK(weft_sequential_create(m1, "a", &a));
  WOK(weft_sequential_create(m2, "b", &b));
  WREQUIRE(a && b, "containers");
  lin_on(m1, a, "s0", 6, 5, S0, R, 1);
  lin_on(m1, a, "s1", 5, 7, S1, R, 1);
  lin_on(m1, a, "r", 4, 3, R, R, 1);
  lin_on(m1, a, "uneven", 3, 5, S0, R, 1); /* 5 rows over 2 ranks: 3 + 2 */
  lin_on(m1, a, "partial", 2, 3, R, R, 1); /* its grad is Partial(sum) */
  lin_on(m2, b, "dp_s0", 4, 6, S0, R, 2);  /* sharded on mesh dim 0 of a 2-D mesh */
  lin_on(m2, b, "tp_s1", 3, 4, R, S1, 2);  /* sharded on a size-1 dim */
  WOK(weft_module_materialize(a));
  WOK(weft_module_materialize(b));
  weft_param *ps[16];
  int na = 0, nb = 0;
  WOK(weft_module_parameters(a, ps, 16, &na));
  WOK(weft_module_parameters(b, ps + na, 16 - na, &nb));
  /* note: the Partial grad is split in float, so its sum differs from the
   * full gradient by rounding (~1e-9 relative): tolerance 1e-7 */
  int n = na + nb;
  double want2 = 0;
  for (int i = 0; i < n; i++) {
    WOK(set_grad(ps[i], strstr(ps[i]->fqn, "partial") != NULL));
    want2 += ref_sumsq(ps[i]);
  }
  double want = sqrt(want2), norm = 0;
  /* max_norm above the norm: nothing changes */
  weft_tensor *g0 = NULL, *g1 = NULL;
  WOK(weft_dtensor_full_tensor(ps[0]->grad, &g0));
  WOK(weft_clip_grad_norm_params(ps, n, 10 * want, &norm));
  WCHECK(fabs(norm - want) <= 1e-7 * want, "norm %.15g want %.15g", norm, want);
  WOK(weft_dtensor_full_tensor(ps[0]->grad, &g1));
  WCHECK(g0 && g1 && weft_worker_equal_on_host(g0, g1), "grads changed with coef 1");
  weft_param *pp = ps[na - 1];
  WCHECK(weft_dtensor_spec_equal(weft_dtensor_get_spec(pp->grad), weft_dtensor_get_spec(pp->data)),
         "partial grad not reduced to the data's placements");
  /* clip to half the norm: every full grad scales by max/(norm+1e-6) */
  for (int i = 0; i < n; i++) WOK(set_grad(ps[i], strstr(ps[i]->fqn, "partial") != NULL));
  double maxn = want / 2, coef = maxn / (want + 1e-6);
  WOK(weft_clip_grad_norm_params(ps, n, maxn, &norm));
  WCHECK(fabs(norm - want) <= 1e-7 * want, "norm %.15g want %.15g", norm, want);
  double after2 = 0;
  for (int i = 0; i < n; i++) {
    weft_tensor *full = NULL;
    WOK(weft_dtensor_full_tensor(ps[i]->grad, &full));
    if (!full) continue;
    char key[160];
    snprintf(key, sizeof key, "%s#g", ps[i]->fqn);
    weft_tensor *ref;
    weft_tensor_create(WEFT_F32, WEFT_CPU, full->ndim, full->shape, &ref);
    weft_tensor_fill_normal(ref, 9, weft_rng_key(key), NULL, 0, 1);
    float *x = host_floats(full, NULL);
    const float *y = ref->data;
    for (int64_t k = 0; x && k < weft_tensor_numel(full); k++) {
      double w = coef * y[k];
      WCHECK(fabs(x[k] - w) <= 1e-6 * (fabs(w) + 1e-3), "%s[%lld] = %g want %g", ps[i]->fqn,
             (long long)k, x[k], w);
      after2 += (double)x[k] * x[k];
    }
    free(x);
    weft_tensor_destroy(full);
    weft_tensor_destroy(ref);
  }
  WCHECK(fabs(sqrt(after2) - maxn) <= 1e-5 * maxn, "norm after clipping %g want %g", sqrt(after2),
         maxn);
  /* the module entry point over one tree gives that tree's norm */
  double wa2 = 0;
  for (int i = 0; i < na; i++) {
    WOK(set_grad(ps[i], false));
    wa2 += ref_sumsq(ps[i]);
  }
  WOK(weft_clip_grad_norm(a, 1e9, &norm));
  WCHECK(fabs(norm - sqrt(wa2)) <= 1e-10 * sqrt(wa2), "module norm %.15g want %.15g", norm,
         sqrt(wa2));
  WCHECK(weft_clip_grad_norm(a, 0.0, &norm) == WEFT_ERR_INVALID, "max_norm 0 accepted");
  weft_tensor_destroy(g0);
  weft_tensor_destroy(g1);
  WOK(weft_module_destroy(a));
  WOK(weft_module_destroy(b));
  WOK(weft_mesh_destroy(m2));
  WOK(weft_mesh_destroy(m1));
}

/* Multi-rank placement errors: a head split across ranks, mismatched
 * gate shards, an unsupported linear combination — clear errors on every
 * rank, no hang. */
static void case_tp_errors(void) {
  weft_mesh *mesh = NULL;
  WOK(mesh_world(&mesh));
  weft_llama_config cfg = small_cfg(1, 2, 1, 11); /* 1 kv head cannot split over 2 ranks */
  weft_module *model = NULL;
  WOK(weft_llama_create(&cfg, mesh, &model));
  bool sp = false;
  WOK(weft_module_visit(model, plan_visit, &sp));
  WOK(weft_module_init_weights(model, 1));
  weft_tensor *tok, *tgt;
  random_ids(&tok, 2, 5, cfg.vocab, 1);
  random_ids(&tgt, 2, 5, cfg.vocab, 2);
  weft_status st = weft_llama_forward(model, tok, tgt, NULL);
  WCHECK(st == WEFT_ERR_UNSUPPORTED && strstr(weft_last_error(), "split a head"),
         "kv head split: %s: %s", weft_status_str(st), weft_last_error());
  weft_param *p;
  weft_placement R = weft_replicate(), S0 = weft_shard(0);
  WOK(weft_module_find_param(model, "layers.0.attention.wk.weight", &p));
  WOK(weft_param_set_placements(p, &R, 1));
  WOK(weft_module_find_param(model, "layers.0.attention.wv.weight", &p));
  WOK(weft_param_set_placements(p, &R, 1));
  st = weft_llama_forward(model, tok, tgt, NULL);
  WCHECK(st == WEFT_ERR_UNSUPPORTED && strstr(weft_last_error(), "must all be R"),
         "q sharded, k R: %s: %s", weft_status_str(st), weft_last_error());
  WOK(weft_module_find_param(model, "layers.0.attention.wq.weight", &p));
  WOK(weft_param_set_placements(p, &R, 1));
  WOK(weft_module_find_param(model, "layers.0.attention.wo.weight", &p));
  WOK(weft_param_set_placements(p, &R, 1));
  WOK(weft_module_find_param(model, "layers.0.feed_forward.w3.weight", &p));
  WOK(weft_param_set_placements(p, &R, 1));
  st = weft_llama_forward(model, tok, tgt, NULL);
  WCHECK(st == WEFT_ERR_UNSUPPORTED && strstr(weft_last_error(), "w3(x)"), "gate: %s: %s",
         weft_status_str(st), weft_last_error());
  WOK(weft_param_set_placements(p, &S0, 1));
  WOK(weft_module_find_param(model, "layers.0.feed_forward.w2.weight", &p));
  WOK(weft_param_set_placements(p, &S0, 1)); /* x S(-1) with w S(0): no rule */
  st = weft_llama_forward(model, tok, tgt, NULL);
  WCHECK(st == WEFT_ERR_UNSUPPORTED && strstr(weft_last_error(), "layers.0.feed_forward.w2") &&
             strstr(weft_last_error(), "S(2)") && strstr(weft_last_error(), "S(0)"),
         "w2 S(0): %s: %s", weft_status_str(st), weft_last_error());
  weft_placement S1 = weft_shard(1);
  WOK(weft_param_set_placements(p, &S1, 1));
  double loss = 0;
  WOK(weft_llama_forward(model, tok, tgt, &loss)); /* fixed: runs */
  WOK(weft_llama_backward(model));
  WCHECK(isfinite(loss) && loss > 0, "loss %g", loss);
  weft_tensor_destroy(tok);
  weft_tensor_destroy(tgt);
  WOK(weft_module_destroy(model));
  WOK(weft_mesh_destroy(mesh));
}

static void case_multi(void) {
  case_init();
  case_clip();
  case_tp_errors();
}

/* ------------------------------------------------------------ optimizers */

/* torch.optim formulas in double, one parameter. */
typedef struct ref_opt {
  double p[64], m[64], v[64], vmax[64], buf[64];
} ref_opt;

static void ref_adamw(ref_opt *r, const double *g, int n, int t, const weft_adamw_params *h) {
  for (int i = 0; i < n; i++) {
    double gi = h->maximize ? -g[i] : g[i];
    r->p[i] *= 1.0 - (double)h->lr * h->weight_decay;
    r->m[i] = h->beta1 * r->m[i] + (1.0 - h->beta1) * gi;
    r->v[i] = h->beta2 * r->v[i] + (1.0 - h->beta2) * gi * gi;
    double bc1 = 1.0 - pow(h->beta1, t), bc2 = 1.0 - pow(h->beta2, t);
    double vv = r->v[i];
    if (h->amsgrad) {
      r->vmax[i] = fmax(r->vmax[i], r->v[i]);
      vv = r->vmax[i];
    }
    r->p[i] -= (double)h->lr / bc1 * r->m[i] / (sqrt(vv) / sqrt(bc2) + h->eps);
  }
}

static void ref_sgd(ref_opt *r, const double *g, int n, int t, const weft_sgd_params *h) {
  for (int i = 0; i < n; i++) {
    double d = (h->maximize ? -g[i] : g[i]) + (double)h->weight_decay * r->p[i];
    if (h->momentum != 0) {
      r->buf[i] = t == 1 ? d : h->momentum * r->buf[i] + (1.0 - h->dampening) * d;
      d = h->nesterov ? d + h->momentum * r->buf[i] : r->buf[i];
    }
    r->p[i] -= (double)h->lr * d;
  }
}

/* Runs `steps` steps of an optimizer over a (4, 3) linear and one that
 * never gets a grad, against the reference. */
static void check_opt(weft_mesh *mesh, bool adam, const weft_adamw_params *ha,
                      const weft_sgd_params *hs, const char *label) {
  weft_module *root = NULL, *l1 = NULL, *l2 = NULL;
  WOK(weft_sequential_create(mesh, "root", &root));
  WOK(weft_linear_create(mesh, "a", 3, 4, &l1));
  WOK(weft_linear_create(mesh, "b", 2, 2, &l2));
  WOK(weft_module_add_child(root, l1));
  WOK(weft_module_add_child(root, l2));
  weft_param *p = weft_module_param(l1, 0), *q = weft_module_param(l2, 0);
  p->init.std = 0.5f;
  WOK(weft_module_init_weights(root, 11));
  weft_tensor *q0 = NULL;
  WOK(weft_tensor_clone(weft_dtensor_local(q->data), &q0));
  weft_optimizer *opt = NULL;
  if (adam)
    WOK(weft_adamw_create(root, ha, &opt));
  else
    WOK(weft_sgd_create(root, hs, &opt));
  WREQUIRE(opt, "%s: no optimizer", label);
  ref_opt r;
  memset(&r, 0, sizeof r);
  int n = 12;
  float *pd = copy_local(p->data, NULL);
  WREQUIRE(pd, "%s: no host copy of the parameter", label);
  for (int i = 0; i < n; i++) r.p[i] = pd[i];
  for (int t = 1; t <= 4; t++) {
    char key[32];
    snprintf(key, sizeof key, "g%d", t);
    weft_dtensor_destroy(p->grad);
    p->grad = NULL;
    WOK(weft_dtensor_zeros(mesh, WEFT_F32, 2, p->spec.shape, p->spec.placements, 1, &p->grad));
    WOK(weft_dtensor_fill_normal(p->grad, 3, weft_rng_key(key), 0, 1));
    double g[64];
    float *gf = copy_local(p->grad, NULL);
    for (int i = 0; i < n; i++) g[i] = gf ? gf[i] : NAN;
    free(gf);
    WOK(weft_optimizer_step(opt));
    if (adam)
      ref_adamw(&r, g, n, t, ha);
    else
      ref_sgd(&r, g, n, t, hs);
    free(pd);
    pd = copy_local(p->data, NULL);
    WREQUIRE(pd, "%s: no host copy of the parameter", label);
    for (int i = 0; i < n; i++)
      WCHECK(fabs(pd[i] - r.p[i]) <= 1e-6 + 1e-5 * fabs(r.p[i]),
             "%s step %d: p[%d] = %.9g want %.9g", label, t, i, pd[i], r.p[i]);
  }
  free(pd);
  char name[64];
  weft_dtensor *st = NULL;
  snprintf(name, sizeof name, "state.a.weight.%s", adam ? "exp_avg" : "momentum_buffer");
  bool has = adam || hs->momentum != 0;
  weft_status s = weft_optimizer_state_find(opt, name, &st);
  WCHECK(has ? s == WEFT_OK : s == WEFT_ERR_NOT_FOUND, "%s: state %s: %s", label, name,
         weft_status_str(s));
  if (st) {
    float *sd = copy_local(st, NULL);
    for (int i = 0; sd && i < n; i++) {
      double w = adam ? r.m[i] : r.buf[i];
      WCHECK(fabs(sd[i] - w) <= 1e-6 + 1e-5 * fabs(w), "%s: %s[%d] = %g want %g", label, name, i,
             sd[i], w);
    }
    free(sd);
  }
  if (adam) {
    WOK(weft_optimizer_state_find(opt, "state.a.weight.exp_avg_sq", &st));
    float *sd = st ? copy_local(st, NULL) : NULL;
    WCHECK(sd, "%s: no exp_avg_sq on the host", label);
    for (int i = 0; sd && i < n; i++)
      WCHECK(fabs(sd[i] - r.v[i]) <= 1e-7 + 1e-5 * r.v[i], "%s: exp_avg_sq[%d]", label, i);
    free(sd);
    s = weft_optimizer_state_find(opt, "state.a.weight.max_exp_avg_sq", &st);
    WCHECK(ha->amsgrad ? s == WEFT_OK : s == WEFT_ERR_NOT_FOUND, "%s: max_exp_avg_sq", label);
  }
  int64_t step = -1;
  WOK(weft_optimizer_get_param_step(opt, "a.weight", &step));
  WCHECK(step == 4, "%s: step %lld", label, (long long)step);
  WOK(weft_optimizer_get_param_step(opt, "b.weight", &step));
  WCHECK(step == 0, "%s: a param without grad advanced to step %lld", label, (long long)step);
  WCHECK(weft_worker_equal_on_host(q0, weft_dtensor_local(q->data)),
         "%s: param without grad changed", label);
  WCHECK(weft_optimizer_num_steps(opt) == 4, "%s: num_steps", label);
  weft_tensor_destroy(q0);
  weft_optimizer_destroy(opt);
  WOK(weft_module_destroy(root));
}

static void case_optim(void) {
  weft_mesh *mesh = NULL;
  WOK(mesh_world(&mesh));
  weft_adamw_params a = WEFT_ADAMW_DEFAULT;
  a.lr = 0.01f;
  a.beta2 = 0.95f;
  a.weight_decay = 0.1f;
  check_opt(mesh, true, &a, NULL, "adamw");
  a.amsgrad = true;
  check_opt(mesh, true, &a, NULL, "adamw amsgrad");
  a.amsgrad = false;
  a.maximize = true;
  check_opt(mesh, true, &a, NULL, "adamw maximize");
  weft_sgd_params sg = {.lr = 0.05f, .momentum = 0.9f, .dampening = 0.1f, .weight_decay = 0.01f};
  check_opt(mesh, false, NULL, &sg, "sgd momentum dampening wd");
  weft_sgd_params sn = {
      .lr = 0.05f, .momentum = 0.9f, .dampening = 0.0f, .weight_decay = 0.0f, .nesterov = true};
  check_opt(mesh, false, NULL, &sn, "sgd nesterov");
  weft_sgd_params s0 = {.lr = 0.1f, .momentum = 0.0f, .dampening = 0.0f, .weight_decay = 0.0f};
  check_opt(mesh, false, NULL, &s0, "sgd plain");

  /* schedule applied at each step; the state follows FQNs; spec changes caught */
  weft_module *lin = NULL;
  WOK(weft_linear_create(mesh, "lin", 3, 2, &lin));
  WOK(weft_module_init_weights(lin, 1));
  weft_optimizer *opt = NULL;
  WOK(weft_adamw_create(lin, &a, &opt));
  WCHECK(weft_optimizer_state_count(opt) == 2, "state count %d", weft_optimizer_state_count(opt));
  const char *nm = NULL;
  WOK(weft_optimizer_state_get(opt, 1, &nm, NULL));
  WCHECK(nm && strcmp(nm, "state.weight.exp_avg_sq") == 0, "state name %s", nm ? nm : "?");
  weft_lr_schedule sch = {1e-3f, 1e-4f, 2, 6};
  WOK(weft_optimizer_set_schedule(opt, &sch));
  weft_param *p = weft_module_param(lin, 0);
  WOK(weft_dtensor_zeros(mesh, WEFT_F32, 2, p->spec.shape, p->spec.placements, 1, &p->grad));
  for (int k = 0; k < 8; k++) {
    WOK(weft_optimizer_step(opt));
    float want = weft_lr_schedule_at(&sch, k);
    WCHECK(weft_optimizer_get_lr(opt) == want, "lr after step %d: %g want %g", k,
           (double)weft_optimizer_get_lr(opt), (double)want);
  }
  weft_lr_schedule badsch = {1e-3f, 0, 5, 2};
  WCHECK(weft_optimizer_set_schedule(opt, &badsch) == WEFT_ERR_INVALID, "bad schedule accepted");
  weft_placement s0p = weft_shard(0);
  WOK(weft_param_set_placements(p, &s0p, 1)); /* after creating the optimizer */
  WOK(weft_dtensor_zeros(mesh, WEFT_F32, 2, p->spec.shape, p->spec.placements, 1, &p->grad));
  weft_status st = weft_optimizer_step(opt);
  WCHECK(st == WEFT_ERR_STATE && strstr(weft_last_error(), "after sharding"), "%s: %s",
         weft_status_str(st), weft_last_error());
  weft_optimizer_destroy(opt);
  weft_adamw_params bad = a;
  bad.beta1 = 1.0f;
  opt = NULL;
  WCHECK(weft_adamw_create(lin, &bad, &opt) == WEFT_ERR_INVALID && !opt, "beta1 = 1 accepted");
  weft_sgd_params badn = {
      .lr = 0.1f, .momentum = 0.0f, .dampening = 0.0f, .weight_decay = 0.0f, .nesterov = true};
  WCHECK(weft_sgd_create(lin, &badn, &opt) == WEFT_ERR_INVALID, "nesterov without momentum");
  WOK(weft_module_destroy(lin));
  /* an optimizer needs materialised parameters */
  WOK(weft_linear_create(mesh, "lin", 3, 2, &lin));
  st = weft_adamw_create(lin, &a, &opt);
  WCHECK(st == WEFT_ERR_STATE, "optimizer over deferred params: %s", weft_status_str(st));
  WOK(weft_module_destroy(lin));
  WOK(weft_mesh_destroy(mesh));
}

/* --------------------------------------------------------- steady state */

static void case_steady(void) {
  weft_mesh *mesh = NULL;
  WOK(mesh_world(&mesh));
  weft_llama_config cfg = WEFT_LLAMA_CONFIG_INIT;
  cfg.dim = 64;
  cfg.n_layers = 2;
  cfg.n_heads = 4;
  cfg.n_kv_heads = 2;
  cfg.ffn_dim = 172;
  cfg.vocab = 96;
  cfg.max_seq_len = 16;
  weft_module *model = NULL;
  WOK(weft_llama_create(&cfg, mesh, &model));
  WOK(weft_module_init_weights(model, 5));
  weft_tensor *tok, *tgt;
  random_ids(&tok, 2, 16, cfg.vocab, 3);
  random_ids(&tgt, 2, 16, cfg.vocab, 4);
  weft_adamw_params hp = WEFT_ADAMW_DEFAULT;
  weft_optimizer *opt = NULL;
  WOK(weft_adamw_create(model, &hp, &opt));
  /* the host's accounting and, in device mode, the mesh's device's */
  weft_device devs[2] = {WEFT_CPU, weft_mesh_device(mesh)};
  int ndev = devs[1] == WEFT_CPU ? 1 : 2;
  weft_mem_stats ms[2][4];
  double loss[4] = {0};
  for (int s = 1; s <= 3; s++) {
    double norm;
    WOK(weft_llama_forward(model, tok, tgt, &loss[s]));
    WOK(weft_llama_backward(model));
    WOK(weft_clip_grad_norm(model, 1.0, &norm));
    WOK(weft_optimizer_step(opt));
    WOK(weft_module_zero_grad(model, false));
    for (int d = 0; d < ndev; d++) ms[d][s] = weft_mem_get(devs[d]);
  }
  for (int d = 0; d < ndev; d++) {
    const char *dn = weft_device_name(devs[d]);
    WCHECK(ms[d][3].alloc_count == ms[d][2].alloc_count, "step 3 made %lld %s allocations",
           (long long)(ms[d][3].alloc_count - ms[d][2].alloc_count), dn);
    WCHECK(ms[d][3].current_bytes == ms[d][2].current_bytes, "%s bytes %lld -> %lld", dn,
           (long long)ms[d][2].current_bytes, (long long)ms[d][3].current_bytes);
  }
  /* the accounting of where the model lives is live */
  weft_mem_stats *mm = ms[ndev - 1];
  WCHECK(mm[2].alloc_count > mm[1].alloc_count || mm[1].alloc_count > 0, "accounting is live");
  WCHECK(loss[3] < loss[1], "AdamW on one batch should lower the loss: %g -> %g", loss[1], loss[3]);
  weft_optimizer_destroy(opt);
  weft_tensor_destroy(tok);
  weft_tensor_destroy(tgt);
  WOK(weft_module_destroy(model));
  WOK(weft_mesh_destroy(mesh));
}

/* ------------------------------------------------------------ bad input */

#define WERR(expr, code, substr)                                                                 \
  do {                                                                                           \
    weft_status e_ = (expr);                                                                     \
    WCHECK(e_ == (code) && strstr(weft_last_error(), (substr)), "%s -> %s (want %s): %s", #expr, \
           weft_status_str(e_), weft_status_str(code), weft_last_error());                       \
  } while (0)

static void case_bad(void) {
  weft_mesh *mesh = NULL;
  WOK(mesh_world(&mesh));
  weft_module *model = NULL;
  weft_llama_config cfg = small_cfg(1, 4, 3, 11);
  WERR(weft_llama_create(&cfg, mesh, &model), WEFT_ERR_INVALID, "n_kv_heads");
  WCHECK(!model, "model set on error");
  cfg = small_cfg(1, 3, 3, 11);
  WERR(weft_llama_create(&cfg, mesh, &model), WEFT_ERR_INVALID, "multiple of n_heads");
  cfg = small_cfg(1, 4, 2, 11);
  cfg.dim = 12; /* head dim 3 */
  WERR(weft_llama_create(&cfg, mesh, &model), WEFT_ERR_INVALID, "even");
  cfg = small_cfg(1, 4, 2, 0);
  WERR(weft_llama_create(&cfg, mesh, &model), WEFT_ERR_INVALID, "vocab");
  cfg = small_cfg(1, 4, 2, 11);
  WOK(weft_llama_create(&cfg, mesh, &model));
  WREQUIRE(model, "model");
  weft_tensor *tok, *tgt, *t1 = NULL, *tf = NULL, *tlong, *tmis;
  random_ids(&tok, 2, 5, cfg.vocab, 1);
  random_ids(&tgt, 2, 5, cfg.vocab, 2);
  random_ids(&tlong, 1, 9, cfg.vocab, 3);
  random_ids(&tmis, 2, 4, cfg.vocab, 3);
  /* deferred parameters */
  WERR(weft_llama_forward(model, tok, tgt, NULL), WEFT_ERR_STATE, "tok_embeddings.weight");
  WOK(weft_module_init_weights(model, 1));
  double ref_loss = 0;
  WOK(weft_llama_forward(model, tok, tgt, &ref_loss));
  int64_t s1[1] = {10}, s2[2] = {2, 5};
  WOK(weft_tensor_zeros(WEFT_I32, WEFT_CPU, 1, s1, &t1));
  WOK(weft_tensor_zeros(WEFT_F32, WEFT_CPU, 2, s2, &tf));
  WERR(weft_llama_forward(model, t1, NULL, NULL), WEFT_ERR_INVALID, "(B, T)");
  WERR(weft_llama_forward(model, tf, NULL, NULL), WEFT_ERR_INVALID, "int32");
  WERR(weft_llama_forward(model, tlong, NULL, NULL), WEFT_ERR_INVALID, "max_seq_len");
  WERR(weft_llama_forward(model, tok, tmis, NULL), WEFT_ERR_INVALID, "do not match");
  int32_t *ids = tok->data;
  int32_t keep = ids[7];
  ids[7] = (int32_t)cfg.vocab;
  WERR(weft_llama_forward(model, tok, tgt, NULL), WEFT_ERR_INVALID, "tokens[1, 2] = 11");
  ids[7] = -1;
  WERR(weft_llama_forward(model, tok, tgt, NULL), WEFT_ERR_INVALID, "tokens[1, 2] = -1");
  ids[7] = keep;
  ((int32_t *)tgt->data)[0] = 99;
  WERR(weft_llama_forward(model, tok, tgt, NULL), WEFT_ERR_INVALID, "targets[0, 0] = 99");
  weft_tensor_destroy(tgt);
  random_ids(&tgt, 2, 5, cfg.vocab, 2);
  /* rejected inputs changed nothing: the earlier forward can still be
   * back-propagated, once */
  WOK(weft_llama_backward(model));
  WERR(weft_llama_backward(model), WEFT_ERR_STATE, "forward");
  /* a forward without targets has no loss to back-propagate */
  WOK(weft_llama_forward(model, tok, NULL, NULL));
  WCHECK(weft_llama_logits(model) != NULL, "logits");
  WERR(weft_llama_backward(model), WEFT_ERR_STATE, "targets");
  /* an unsupported placement names the module and the placements */
  weft_param *wq;
  WOK(weft_module_find_param(model, "layers.0.attention.wq.weight", &wq));
  weft_placement S1 = weft_shard(1), R = weft_replicate();
  WOK(weft_param_set_placements(wq, &S1, 1));
  WERR(weft_llama_forward(model, tok, tgt, NULL), WEFT_ERR_UNSUPPORTED,
       "linear 'layers.0.attention.wq', mesh dim 0 (tp): input R with weight S(1)");
  WOK(weft_param_set_placements(wq, &R, 1));
  /* nothing was corrupted: the same loss as before the errors */
  double loss = 0;
  WOK(weft_llama_forward(model, tok, tgt, &loss));
  WCHECK(loss == ref_loss, "loss after errors %.9g, before %.9g", loss, ref_loss);
  WOK(weft_llama_backward(model));
  /* tree misuse */
  weft_module *child = weft_module_child(model, 0), *found = NULL, *lin = NULL;
  WERR(weft_module_destroy(child), WEFT_ERR_BUSY, "destroy the root");
  WOK(weft_linear_create(mesh, "tok_embeddings", 2, 2, &lin));
  WERR(weft_module_add_child(model, lin), WEFT_ERR_INVALID, "containers");
  weft_module *layers = NULL;
  WOK(weft_module_find(model, "layers", &layers));
  WOK(weft_module_find(model, "layers.0.feed_forward.w2", &found));
  WCHECK(found && strcmp(weft_module_fqn(found), "layers.0.feed_forward.w2") == 0, "find");
  WERR(weft_module_find(model, "layers.3", &found), WEFT_ERR_NOT_FOUND, "layers.3");
  weft_param *pp;
  WERR(weft_module_find_param(model, "norm.bias", &pp), WEFT_ERR_NOT_FOUND, "norm.bias");
  WOK(weft_linear_create(mesh, "0", 2, 2, &found));
  WERR(weft_module_add_child(layers, found), WEFT_ERR_INVALID, "already has a child named '0'");
  WOK(weft_module_destroy(found));
  WERR(weft_linear_create(mesh, "a.b", 2, 2, &found), WEFT_ERR_INVALID, "'.'");
  WERR(weft_linear_create(mesh, "x", 0, 2, &found), WEFT_ERR_INVALID, ">= 1");
  /* add_child re-roots FQNs */
  weft_module *seq = NULL;
  WOK(weft_sequential_create(mesh, "blocks", &seq));
  WOK(weft_module_add_child(seq, lin));
  WCHECK(strcmp(weft_module_param(lin, 0)->fqn, "tok_embeddings.weight") == 0, "fqn %s",
         weft_module_param(lin, 0)->fqn);
  weft_module *outer = NULL;
  WOK(weft_sequential_create(mesh, "outer", &outer));
  WOK(weft_module_add_child(outer, seq));
  WCHECK(strcmp(weft_module_param(lin, 0)->fqn, "blocks.tok_embeddings.weight") == 0, "fqn %s",
         weft_module_param(lin, 0)->fqn);
  WOK(weft_module_destroy(outer));
  weft_tensor_destroy(tok);
  weft_tensor_destroy(tgt);
  weft_tensor_destroy(t1);
  weft_tensor_destroy(tf);
  weft_tensor_destroy(tlong);
  weft_tensor_destroy(tmis);
  WOK(weft_module_destroy(model));
  WCHECK(weft_module_destroy(NULL) == WEFT_OK, "destroy(NULL)");
  weft_optimizer_destroy(NULL);
  WOK(weft_mesh_destroy(mesh));
}

/* ------------------------------------ loss override, accumulation, trees */

/* A replacement loss: mean over rows of the sum of each row's logits, so
 * dlogits = dloss / N everywhere. Counts its calls. */
typedef struct sum_loss {
  int fwd, bwd;
} sum_loss;

static weft_status sum_loss_forward(void *ctx, const weft_dtensor *logits,
                                    const weft_tensor *targets, double *loss) {
  sum_loss *c = ctx;
  c->fwd++;
  (void)targets;
  const weft_tensor *l = weft_dtensor_local(logits);
  int64_t n = 0;
  float *z = host_floats(l, &n);
  if (!z) return weft_error(WEFT_ERR_INTERNAL, "sum_loss: no host copy of the logits");
  double s = 0;
  for (int64_t i = 0; i < n; i++) s += z[i];
  free(z);
  *loss = s / (double)(l->shape[0] * l->shape[1]);
  return WEFT_OK;
}

static weft_status sum_loss_backward(void *ctx, const weft_dtensor *logits,
                                     const weft_tensor *targets, double dloss,
                                     weft_dtensor *dlogits) {
  sum_loss *c = ctx;
  c->bwd++;
  (void)targets;
  weft_tensor *d = weft_dtensor_local(dlogits);
  const weft_tensor *l = weft_dtensor_local(logits);
  return weft_tensor_fill(d, dloss / (double)(l->shape[0] * l->shape[1]));
}

static weft_status collect_fqn(weft_module *m, void *ctx) {
  trace *tr = ctx;
  const char *f = weft_module_fqn(m);
  if (tr->n < 512) snprintf(tr->e[tr->n++], 64, "%s", f[0] ? f : "(root)");
  return WEFT_OK;
}

static void case_misc(void) {
  weft_mesh *mesh = NULL;
  WOK(mesh_world(&mesh));
  weft_llama_config cfg = small_cfg(2, 4, 2, 13);
  weft_module *model = NULL;
  WOK(weft_llama_create(&cfg, mesh, &model));
  WREQUIRE(model, "model");
  WOK(weft_module_init_weights(model, 9));
  weft_tensor *tok, *tgt;
  random_ids(&tok, 3, 7, cfg.vocab, 5);
  random_ids(&tgt, 3, 7, cfg.vocab, 6);
  /* named_modules order (pre-order, children in creation order) */
  trace *tr = calloc(1, sizeof *tr);
  WOK(weft_module_visit(model, collect_fqn, tr));
  static const char *const want[] = {"(root)",
                                     "tok_embeddings",
                                     "layers",
                                     "layers.0",
                                     "layers.0.attention_norm",
                                     "layers.0.attention",
                                     "layers.0.attention.wq",
                                     "layers.0.attention.wk",
                                     "layers.0.attention.wv",
                                     "layers.0.attention.wo",
                                     "layers.0.ffn_norm",
                                     "layers.0.feed_forward",
                                     "layers.0.feed_forward.w1",
                                     "layers.0.feed_forward.w2",
                                     "layers.0.feed_forward.w3",
                                     "layers.1"};
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
    WCHECK(strcmp(tr->e[i], want[i]) == 0, "visit[%zu] = %s want %s", i, tr->e[i], want[i]);
  WCHECK(tr->n == 3 + 2 * 12 + 3, "visit count %d", tr->n);
  WCHECK(strcmp(tr->e[tr->n - 1], "loss") == 0 && strcmp(tr->e[tr->n - 2], "output") == 0 &&
             strcmp(tr->e[tr->n - 3], "norm") == 0,
         "last modules %s %s %s", tr->e[tr->n - 3], tr->e[tr->n - 2], tr->e[tr->n - 1]);
  free(tr);
  /* gradient accumulation: a second backward without zero_grad doubles
   * every grad (g + g = 2g exactly) */
  weft_param *ps[64];
  int np;
  WOK(weft_module_parameters(model, ps, 64, &np));
  WOK(weft_llama_forward(model, tok, tgt, NULL));
  WOK(weft_llama_backward(model));
  float *g1[64] = {0};
  int64_t n1[64] = {0};
  for (int i = 0; i < np; i++) g1[i] = copy_local(ps[i]->grad, &n1[i]);
  WOK(weft_llama_forward(model, tok, tgt, NULL));
  WOK(weft_llama_backward(model));
  for (int i = 0; i < np; i++) {
    /* note: kernels that accumulate row by row into the grad (embedding,
     * norms) round differently from g + g: compare to 1e-5 */
    const float *a = g1[i];
    float *b = copy_local(ps[i]->grad, NULL);
    WCHECK(a && b, "%s: no host copy of the grad", ps[i]->fqn);
    for (int64_t k = 0; a && b && k < n1[i]; k++)
      WCHECK(fabsf(b[k] - 2 * a[k]) <= 1e-5f * fabsf(2 * a[k]) + 1e-9f,
             "%s[%lld]: accumulated %g != 2 * %g", ps[i]->fqn, (long long)k, b[k], a[k]);
    free(b);
    free(g1[i]);
  }
  WOK(weft_module_zero_grad(model, true));
  for (int i = 0; i < np; i++) WCHECK(ps[i]->grad == NULL, "%s: grad not dropped", ps[i]->fqn);
  /* requires_grad false: no grad for that parameter */
  weft_param *pn;
  WOK(weft_module_find_param(model, "norm.weight", &pn));
  pn->requires_grad = false;
  /* a replacement loss is used in forward and backward */
  weft_module *loss = NULL;
  WOK(weft_module_find(model, "loss", &loss));
  sum_loss sl = {0, 0};
  weft_loss_impl impl = {sum_loss_forward, sum_loss_backward};
  WOK(weft_loss_set_impl(loss, &impl, &sl));
  double lv = 0;
  WOK(weft_llama_forward(model, tok, tgt, &lv));
  const weft_dtensor *logits = weft_llama_logits(model);
  WREQUIRE(logits, "logits");
  int64_t nl = 0;
  float *ll = copy_local(logits, &nl);
  double want_l = 0;
  for (int64_t i = 0; ll && i < nl; i++) want_l += ll[i];
  free(ll);
  want_l /= 21.0;
  WCHECK(fabs(lv - want_l) <= 1e-12 * (fabs(want_l) + 1), "custom loss %g want %g", lv, want_l);
  WOK(weft_llama_backward(model));
  WCHECK(sl.fwd == 1 && sl.bwd == 1, "custom loss calls %d %d", sl.fwd, sl.bwd);
  WCHECK(pn->grad == NULL, "requires_grad=false param got a grad");
  /* dlogits = 1/N everywhere: every row of output.weight's grad is the
   * same (the mean of the final norm's output rows) */
  weft_param *po;
  WOK(weft_module_find_param(model, "output.weight", &po));
  WREQUIRE(po->grad, "output grad");
  float *go = copy_local(po->grad, NULL);
  WCHECK(go, "no host copy of output.weight's grad");
  for (int64_t v = 1; go && v < cfg.vocab; v++)
    for (int64_t d = 0; d < cfg.dim; d++)
      WCHECK(fabsf(go[v * cfg.dim + d] - go[d]) <= 1e-6f * (fabsf(go[d]) + 1e-6f),
             "output grad row %lld differs", (long long)v);
  free(go);
  WOK(weft_loss_set_impl(loss, NULL, NULL));
  WOK(weft_llama_forward(model, tok, tgt, &lv));
  WCHECK(lv > 1.0 && lv < 2 * log((double)cfg.vocab), "default loss back: %g", lv);
  weft_loss_impl half = {sum_loss_forward, NULL};
  WCHECK(weft_loss_set_impl(loss, &half, NULL) == WEFT_ERR_INVALID, "impl without backward");
  weft_tensor_destroy(tok);
  weft_tensor_destroy(tgt);
  WOK(weft_module_destroy(model));
  WOK(weft_mesh_destroy(mesh));
}

static void case_single(void) {
  case_golden();
  case_hooks();
  case_optim();
  case_steady();
  case_bad();
  case_misc();
}

/* ---------------------------------------------------------------- timing */

/* Not a test: ms per training step (forward, backward, clip, AdamW,
 * zero_grad) on a config: argv[2] = "golden" (tiny_mha sizes) or "tiny"
 * (D=256, L=4, H=8, F=688, V=256, T=256, B=8); argv[3] = steps. */
static void case_timing(void) {
  weft_llama_config cfg = WEFT_LLAMA_CONFIG_INIT;
  int64_t B;
  const char *which = weft_worker_argc > 2 ? weft_worker_argv[2] : "golden";
  int steps = weft_worker_argc > 3 ? atoi(weft_worker_argv[3]) : 10;
  if (strcmp(which, "tiny") == 0) {
    cfg.dim = 256, cfg.n_layers = 4, cfg.n_heads = 8, cfg.n_kv_heads = 8, cfg.ffn_dim = 688;
    cfg.vocab = 256, cfg.max_seq_len = 256, B = 8;
  } else {
    cfg.dim = 64, cfg.n_layers = 2, cfg.n_heads = 4, cfg.n_kv_heads = 4, cfg.ffn_dim = 172;
    cfg.vocab = 96, cfg.max_seq_len = 16, B = 2;
  }
  weft_mesh *mesh = NULL;
  WOK(mesh_world(&mesh));
  weft_module *model = NULL;
  WOK(weft_llama_create(&cfg, mesh, &model));
  WOK(weft_module_init_weights(model, 1));
  weft_tensor *tok, *tgt;
  random_ids(&tok, B, cfg.max_seq_len, cfg.vocab, 1);
  random_ids(&tgt, B, cfg.max_seq_len, cfg.vocab, 2);
  weft_adamw_params hp = WEFT_ADAMW_DEFAULT;
  weft_optimizer *opt = NULL;
  WOK(weft_adamw_create(model, &hp, &opt));
  double tf = 0, tb = 0, to = 0, loss = 0, norm = 0;
  for (int s = 0; s <= steps; s++) {
    double t0 = now_s();
    WOK(weft_llama_forward(model, tok, tgt, &loss));
    double t1 = now_s();
    WOK(weft_llama_backward(model));
    double t2 = now_s();
    WOK(weft_clip_grad_norm(model, 1.0, &norm));
    WOK(weft_optimizer_step(opt));
    WOK(weft_module_zero_grad(model, false));
    double t3 = now_s();
    if (s == 0) continue; /* warm-up: first-step allocations */
    tf += t1 - t0;
    tb += t2 - t1;
    to += t3 - t2;
  }
  if (weft_worker_rank == 0)
    printf(
        "timing %s (B=%lld T=%lld D=%lld L=%lld V=%lld) %d ranks: %.2f ms/step (fwd %.2f, bwd "
        "%.2f, clip+adamw %.2f) over %d steps, last loss %.4f\n",
        which, (long long)B, (long long)cfg.max_seq_len, (long long)cfg.dim,
        (long long)cfg.n_layers, (long long)cfg.vocab, weft_world_size(),
        1e3 * (tf + tb + to) / steps, 1e3 * tf / steps, 1e3 * tb / steps, 1e3 * to / steps, steps,
        loss);
  weft_optimizer_destroy(opt);
  weft_tensor_destroy(tok);
  weft_tensor_destroy(tgt);
  WOK(weft_module_destroy(model));
  WOK(weft_mesh_destroy(mesh));
}

static const weft_worker_case cases[] = {
    {"golden", case_golden}, {"golden_tp", case_golden_tp},
    {"hooks", case_hooks},   {"init", case_init},
    {"clip", case_clip},     {"tp_errors", case_tp_errors},
    {"multi", case_multi},   {"optim", case_optim},
    {"steady", case_steady}, {"bad", case_bad},
    {"misc", case_misc},     {"single", case_single},
    {"timing", case_timing}, {0, 0},
};

int main(int argc, char **argv) { return weft_worker_main(argc, argv, cases); }
