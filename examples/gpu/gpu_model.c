/* examples/gpu/gpu_model.c — the reference model on the CUDA backend (see
 * gpu_model.h): the Llama block of kernels/layers.h call for call, on
 * device pointers: the forward saves what the backward reads,
 * the backward mirrors it. */
#include "gpu_model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "kernels.h"
#include "safetensors.h"

enum { P_ANORM, P_WQ, P_WK, P_WV, P_WO, P_FNORM, P_W1, P_W3, P_W2 };
static const char *layer_param[GPU_MODEL_PER_LAYER] = {
    "attention_norm.weight",  "attention.wq.weight",    "attention.wk.weight",
    "attention.wv.weight",    "attention.wo.weight",    "ffn_norm.weight",
    "feed_forward.w1.weight", "feed_forward.w3.weight", "feed_forward.w2.weight"};

#define ALIGN_FLOATS 64 /* every slice starts on 256 bytes */

/* The device the model lives on; every kernel goes through its table
 * (backend.h): the GPU, or the emulated one in -Dcuda=emulated builds. */
static const weft_device DEV = WEFT_CUDA;

struct gpu_model {
  gpu_model_config c;
  int64_t Bl, N, hd, qd, kd; /* local batch, N = Bl T rows, head dim, q/kv widths */
  weft_mesh *mesh;
  int dp_dim, dp, dp_rank;
  int np;
  char (*name)[64];
  int64_t *numel, *offset; /* per tensor, offset in floats into the flat buffers */
  int64_t flat;            /* floats per flat buffer (with alignment gaps) */
  /* device: one allocation each */
  float *params, *grads, *mom, *vel;
  float **p, **g, **pm, **pv; /* host arrays of device pointers, np each */
  int64_t step;
  /* device activations, one allocation (acts); N = Bl T */
  float *acts;
  int32_t *tok; /* inp (N), tgt (N) */
  int32_t *inp, *tgt;
  float *x; /* (L + 1, N, D): residual stream entering each layer, then final */
  float *n1, *rstd1, *q, *k, *v, *att, *lse, *h, *n2, *rstd2, *a, *b, *gg; /* per layer */
  float *nf, *rstdf, *logits, *lsece; /* logits (N, V) become dlogits in the backward */
  float *cosb, *sinb;
  void *scratch;
  float *dx, *dbig, *dq, *dk, *dv, *da, *db, *dn;
};

static int pidx(const gpu_model *m, int64_t l, int which) {
  return (int)(1 + l * GPU_MODEL_PER_LAYER + which);
}
#define P_TOK 0
#define P_NORM(m) ((m)->np - 2)
#define P_OUT(m) ((m)->np - 1)

static int64_t round_up(int64_t n) { return (n + ALIGN_FLOATS - 1) / ALIGN_FLOATS * ALIGN_FLOATS; }

/* ------------------------------------------------------------------ config */

weft_status gpu_model_config_preset(const char *name, gpu_model_config *out) {
  gpu_model_config c = {.D = 64,
                        .L = 2,
                        .H = 4,
                        .Hkv = 4,
                        .F = 172,
                        .V = 96,
                        .T = 16,
                        .B = 2,
                        .rope_theta = 10000.0,
                        .norm_eps = 1e-5f};
  if (name && strcmp(name, "tiny_mha") == 0) {
  } else if (name && strcmp(name, "tiny_gqa") == 0) {
    c.Hkv = 2;
  } else if (name && strcmp(name, "gpt2s") == 0) {
    c = (gpu_model_config){.D = 768,
                           .L = 12,
                           .H = 12,
                           .Hkv = 12,
                           .F = 2048,
                           .V = 50304,
                           .T = 1024,
                           .B = 8,
                           .rope_theta = 10000.0,
                           .norm_eps = 1e-5f};
  } else {
    return weft_error(WEFT_ERR_NOT_FOUND, "unknown model config '%s' (tiny_mha, tiny_gqa, gpt2s)",
                      name ? name : "(null)");
  }
  *out = c;
  return WEFT_OK;
}

static weft_status check_config(const gpu_model_config *c, int dp) {
#define POS(f)                                                                                     \
  do {                                                                                             \
    if (c->f < 1)                                                                                  \
      return weft_error(WEFT_ERR_INVALID, "config: " #f " = %lld, must be >= 1", (long long)c->f); \
  } while (0)
  POS(D);
  POS(L);
  POS(H);
  POS(Hkv);
  POS(F);
  POS(V);
  POS(T);
  POS(B);
#undef POS
  if (c->D % c->H || (c->D / c->H) % 2)
    return weft_error(WEFT_ERR_INVALID, "config: D = %lld must be H = %lld times an even head dim",
                      (long long)c->D, (long long)c->H);
  if (c->H % c->Hkv)
    return weft_error(WEFT_ERR_INVALID, "config: H = %lld not a multiple of Hkv = %lld",
                      (long long)c->H, (long long)c->Hkv);
  if (c->V > INT32_MAX)
    return weft_error(WEFT_ERR_INVALID, "config: V = %lld does not fit int32 ids", (long long)c->V);
  if (!(c->rope_theta > 0) || !(c->norm_eps > 0))
    return weft_error(WEFT_ERR_INVALID, "config: rope_theta %g and norm_eps %g must be > 0",
                      c->rope_theta, (double)c->norm_eps);
  if (c->B % dp)
    return weft_error(WEFT_ERR_INVALID, "config: batch B = %lld not divisible by dp = %d",
                      (long long)c->B, dp);
  return WEFT_OK;
}

/* ---------------------------------------------------------------- create */

static weft_status dev_alloc(size_t floats, void **out) {
  return weft_alloc(DEV, (floats ? floats : 1) * sizeof(float), out);
}

weft_status gpu_model_create(const gpu_model_config *cfg, weft_mesh *mesh, int dp_dim,
                             gpu_model **out) {
  if (!cfg || !out) return weft_error(WEFT_ERR_INVALID, "cfg and out must not be NULL");
  *out = NULL;
  int dp = 1, dp_rank = 0;
  if (mesh) {
    dp = weft_mesh_dim_size(mesh, dp_dim);
    if (dp < 1)
      return weft_error(WEFT_ERR_INVALID, "dp_dim %d is not a dim of the mesh (%d dims)", dp_dim,
                        weft_mesh_ndim(mesh));
    dp_rank = weft_mesh_coord(mesh, dp_dim);
  }
  WEFT_CHECK(check_config(cfg, dp));
  gpu_model *m = calloc(1, sizeof *m);
  if (!m) return weft_error(WEFT_ERR_OOM, "gpu_model header");
  weft_status st = WEFT_OK;
  m->c = *cfg;
  const gpu_model_config *c = &m->c;
  m->mesh = mesh;
  m->dp_dim = dp_dim;
  m->dp = dp;
  m->dp_rank = dp_rank;
  if (mesh) weft_mesh_retain(mesh);
  m->Bl = c->B / dp;
  m->N = m->Bl * c->T;
  m->hd = c->D / c->H;
  m->qd = c->H * m->hd;
  m->kd = c->Hkv * m->hd;
  const int64_t D = c->D, F = c->F, V = c->V, L = c->L, qd = m->qd, kd = m->kd, N = m->N, T = c->T,
                hd = m->hd;

  m->np = (int)(3 + GPU_MODEL_PER_LAYER * L);
  m->name = calloc((size_t)m->np, sizeof *m->name);
  m->numel = calloc((size_t)m->np, sizeof *m->numel);
  m->offset = calloc((size_t)m->np, sizeof *m->offset);
  m->p = calloc((size_t)m->np, sizeof *m->p);
  m->g = calloc((size_t)m->np, sizeof *m->g);
  m->pm = calloc((size_t)m->np, sizeof *m->pm);
  m->pv = calloc((size_t)m->np, sizeof *m->pv);
  if (!m->name || !m->numel || !m->offset || !m->p || !m->g || !m->pm || !m->pv) {
    st = weft_error(WEFT_ERR_OOM, "gpu_model tables for %d tensors", m->np);
    goto fail;
  }
  const int64_t per[GPU_MODEL_PER_LAYER] = {D, qd * D, kd * D, kd * D, D * qd,
                                            D, F * D,  F * D,  D * F};
  snprintf(m->name[P_TOK], 64, "tok_embeddings.weight");
  m->numel[P_TOK] = V * D;
  for (int64_t l = 0; l < L; l++)
    for (int w = 0; w < GPU_MODEL_PER_LAYER; w++) {
      snprintf(m->name[pidx(m, l, w)], 64, "layers.%lld.%s", (long long)l, layer_param[w]);
      m->numel[pidx(m, l, w)] = per[w];
    }
  snprintf(m->name[P_NORM(m)], 64, "norm.weight");
  m->numel[P_NORM(m)] = D;
  snprintf(m->name[P_OUT(m)], 64, "output.weight");
  m->numel[P_OUT(m)] = V * D;
  m->flat = 0;
  for (int i = 0; i < m->np; i++) {
    m->offset[i] = m->flat;
    m->flat += round_up(m->numel[i]);
  }
  WEFT_CHECK_GOTO(dev_alloc((size_t)m->flat, (void **)&m->params), st, fail);
  WEFT_CHECK_GOTO(dev_alloc((size_t)m->flat, (void **)&m->grads), st, fail);
  WEFT_CHECK_GOTO(dev_alloc((size_t)m->flat, (void **)&m->mom), st, fail);
  WEFT_CHECK_GOTO(dev_alloc((size_t)m->flat, (void **)&m->vel), st, fail);
  for (int i = 0; i < m->np; i++) {
    m->p[i] = m->params + m->offset[i];
    m->g[i] = m->grads + m->offset[i];
    m->pm[i] = m->mom + m->offset[i];
    m->pv[i] = m->vel + m->offset[i];
  }
  WEFT_CHECK_GOTO(weft_memset(DEV, m->params, 0, (size_t)m->flat * sizeof(float)), st, fail);
  WEFT_CHECK_GOTO(weft_memset(DEV, m->grads, 0, (size_t)m->flat * sizeof(float)), st, fail);
  WEFT_CHECK_GOTO(weft_memset(DEV, m->mom, 0, (size_t)m->flat * sizeof(float)), st, fail);
  WEFT_CHECK_GOTO(weft_memset(DEV, m->vel, 0, (size_t)m->flat * sizeof(float)), st, fail);

  /* activations: carve one allocation, each piece on a 64-float boundary */
  const int64_t lseN = m->Bl * c->H * T;
  const int64_t big = N * (F > qd ? F : qd);
  struct piece {
    float **dst;
    int64_t n;
  } pieces[] = {
      {&m->x, (L + 1) * N * D}, {&m->n1, L * N * D}, {&m->rstd1, L * N},     {&m->q, L * N * qd},
      {&m->k, L * N * kd},      {&m->v, L * N * kd}, {&m->att, L * N * qd},  {&m->lse, L * lseN},
      {&m->h, L * N * D},       {&m->n2, L * N * D}, {&m->rstd2, L * N},     {&m->a, L * N * F},
      {&m->b, L * N * F},       {&m->gg, L * N * F}, {&m->nf, N * D},        {&m->rstdf, N},
      {&m->logits, N * V},      {&m->lsece, N},      {&m->cosb, T * hd / 2}, {&m->sinb, T * hd / 2},
      {&m->dx, N * D},          {&m->dbig, big},     {&m->dq, N * qd},       {&m->dk, N * kd},
      {&m->dv, N * kd},         {&m->da, N * F},     {&m->db, N * F},        {&m->dn, N * D},
  };
  const size_t npieces = sizeof pieces / sizeof pieces[0];
  int64_t total = 0;
  for (size_t i = 0; i < npieces; i++) total += round_up(pieces[i].n);
  WEFT_CHECK_GOTO(dev_alloc((size_t)total, (void **)&m->acts), st, fail);
  int64_t off = 0;
  for (size_t i = 0; i < npieces; i++) {
    *pieces[i].dst = m->acts + off;
    off += round_up(pieces[i].n);
  }
  WEFT_CHECK_GOTO(weft_alloc(DEV, (size_t)(2 * N) * sizeof(int32_t), (void **)&m->tok), st, fail);
  m->inp = m->tok;
  m->tgt = m->tok + N;
  size_t sb = weft_backend_attention_scratch_bytes(DEV, m->Bl, T, c->H, c->Hkv, hd);
  WEFT_CHECK_GOTO(weft_alloc(DEV, sb ? sb : 1, &m->scratch), st, fail);
  WEFT_CHECK_GOTO(weft_backend_rope_tables(DEV, m->cosb, m->sinb, T, hd, c->rope_theta), st, fail);
  WEFT_CHECK_GOTO(weft_device_synchronize(DEV), st, fail);
  *out = m;
  return WEFT_OK;
fail:
  gpu_model_destroy(m);
  return st;
}

void gpu_model_destroy(gpu_model *m) {
  if (!m) return;
  (void)weft_device_synchronize(DEV);
  weft_free(m->params);
  weft_free(m->grads);
  weft_free(m->mom);
  weft_free(m->vel);
  weft_free(m->acts);
  weft_free(m->tok);
  weft_free(m->scratch);
  free(m->name);
  free(m->numel);
  free(m->offset);
  free(m->p);
  free(m->g);
  free(m->pm);
  free(m->pv);
  if (m->mesh) weft_mesh_release(m->mesh);
  free(m);
}

const gpu_model_config *gpu_model_get_config(const gpu_model *m) { return &m->c; }
int64_t gpu_model_local_batch(const gpu_model *m) { return m->Bl; }
int gpu_model_num_tensors(const gpu_model *m) { return m->np; }
const char *gpu_model_tensor_name(const gpu_model *m, int i) {
  return i >= 0 && i < m->np ? m->name[i] : NULL;
}
int64_t gpu_model_tensor_numel(const gpu_model *m, int i) {
  return i >= 0 && i < m->np ? m->numel[i] : 0;
}
int gpu_model_tensor_index(const gpu_model *m, const char *name) {
  for (int i = 0; name && i < m->np; i++)
    if (strcmp(m->name[i], name) == 0) return i;
  return -1;
}
int64_t gpu_model_param_count(const gpu_model *m) {
  int64_t n = 0;
  for (int i = 0; i < m->np; i++) n += m->numel[i];
  return n;
}

/* ----------------------------------------------------------------- weights */

static weft_status reset_optimizer(gpu_model *m) {
  m->step = 0;
  WEFT_CHECK(weft_memset(DEV, m->mom, 0, (size_t)m->flat * sizeof(float)));
  WEFT_CHECK(weft_memset(DEV, m->vel, 0, (size_t)m->flat * sizeof(float)));
  return WEFT_OK;
}

static bool is_norm(const char *name) { return strstr(name, "norm.weight") != NULL; }

weft_status gpu_model_init_weights(gpu_model *m, uint64_t seed) {
  int64_t maxn = 0;
  for (int i = 0; i < m->np; i++) maxn = m->numel[i] > maxn ? m->numel[i] : maxn;
  float *host = malloc((size_t)maxn * sizeof *host);
  if (!host) return weft_error(WEFT_ERR_OOM, "host buffer of %lld floats", (long long)maxn);
  weft_status st = WEFT_OK;
  for (int i = 0; i < m->np; i++) {
    if (is_norm(m->name[i])) {
      for (int64_t e = 0; e < m->numel[i]; e++) host[e] = 1.0f;
    } else {
      weft_tensor view;
      int64_t n = m->numel[i];
      WEFT_CHECK_GOTO(weft_tensor_view_init(&view, host, WEFT_F32, WEFT_CPU, 1, &n, NULL), st, out);
      WEFT_CHECK_GOTO(
          weft_tensor_fill_normal(&view, seed, weft_rng_key(m->name[i]), NULL, 0.0f, 0.02f), st,
          out);
    }
    WEFT_CHECK_GOTO(
        weft_memcpy(DEV, m->p[i], host, (size_t)m->numel[i] * sizeof(float), WEFT_COPY_H2D), st,
        out);
  }
  WEFT_CHECK_GOTO(reset_optimizer(m), st, out);
out:
  free(host);
  return st;
}

weft_status gpu_model_load_safetensors(gpu_model *m, const char *path) {
  weft_safetensors *f;
  WEFT_CHECK(weft_safetensors_open(path, &f));
  weft_status st = WEFT_OK;
  float *host = NULL;
  for (int i = 0; i < m->np; i++) {
    weft_safetensors_info info;
    WEFT_CHECK_GOTO(weft_safetensors_find(f, m->name[i], &info), st, out);
    if (info.numel != m->numel[i]) {
      st = weft_error(WEFT_ERR_INVALID, "%s: %s has %lld elements, the model %lld", path,
                      m->name[i], (long long)info.numel, (long long)m->numel[i]);
      goto out;
    }
    float *nh = realloc(host, (size_t)m->numel[i] * sizeof *host);
    if (!nh) {
      st = weft_error(WEFT_ERR_OOM, "host buffer for %s", m->name[i]);
      goto out;
    }
    host = nh;
    WEFT_CHECK_GOTO(weft_safetensors_read(f, m->name[i], WEFT_F32, host, m->numel[i]), st, out);
    WEFT_CHECK_GOTO(
        weft_memcpy(DEV, m->p[i], host, (size_t)m->numel[i] * sizeof(float), WEFT_COPY_H2D), st,
        out);
  }
  WEFT_CHECK_GOTO(reset_optimizer(m), st, out);
out:
  free(host);
  weft_safetensors_close(f);
  return st;
}

weft_status gpu_model_set_batch(gpu_model *m, const int32_t *inputs, const int32_t *targets) {
  if (!inputs || !targets)
    return weft_error(WEFT_ERR_INVALID, "inputs and targets must not be NULL");
  const int64_t n = m->c.B * m->c.T;
  for (int64_t i = 0; i < n; i++) {
    if (inputs[i] < 0 || inputs[i] >= m->c.V)
      return weft_error(WEFT_ERR_INVALID, "input token %lld = %d outside [0, %lld)", (long long)i,
                        inputs[i], (long long)m->c.V);
    if (targets[i] < 0 || targets[i] >= m->c.V)
      return weft_error(WEFT_ERR_INVALID, "target %lld = %d outside [0, %lld)", (long long)i,
                        targets[i], (long long)m->c.V);
  }
  const int64_t first = (int64_t)m->dp_rank * m->N;
  WEFT_CHECK(
      weft_memcpy(DEV, m->inp, inputs + first, (size_t)m->N * sizeof(int32_t), WEFT_COPY_H2D));
  WEFT_CHECK(
      weft_memcpy(DEV, m->tgt, targets + first, (size_t)m->N * sizeof(int32_t), WEFT_COPY_H2D));
  return WEFT_OK;
}

weft_status gpu_model_read_param(const gpu_model *m, int i, float *host) {
  if (i < 0 || i >= m->np) return weft_error(WEFT_ERR_INVALID, "tensor %d of %d", i, m->np);
  return weft_memcpy(DEV, host, m->p[i], (size_t)m->numel[i] * sizeof(float), WEFT_COPY_D2H);
}
weft_status gpu_model_read_grad(const gpu_model *m, int i, float *host) {
  if (i < 0 || i >= m->np) return weft_error(WEFT_ERR_INVALID, "tensor %d of %d", i, m->np);
  return weft_memcpy(DEV, host, m->g[i], (size_t)m->numel[i] * sizeof(float), WEFT_COPY_D2H);
}

/* --------------------------------------------------------- data parallel */

/* The flat gradient buffer, all-reduced AVG in place on the device (mesh.h
 * "Device buffers": NCCL, or MPI with host staging when ranks share a GPU;
 * ordered after the backward's kernels on the compute stream, and the
 * kernels queued after it see the result). */
static weft_status dp_all_reduce_grads(gpu_model *m) {
  WEFT_CHECK(weft_all_reduce(m->mesh, m->dp_dim, m->grads, m->grads, m->flat, WEFT_F32, WEFT_OP_AVG,
                             NULL));
  return WEFT_OK;
}

/* ------------------------------------------------------- forward/backward */

weft_status gpu_model_forward(gpu_model *m, double *loss) {
  const gpu_model_config *c = &m->c;
  const int64_t B = m->Bl, T = c->T, D = c->D, F = c->F, V = c->V, H = c->H, Hkv = c->Hkv,
                hd = m->hd, qd = m->qd, kd = m->kd, N = m->N;
  const float eps = c->norm_eps;
  WEFT_CHECK(weft_backend_embedding_forward(DEV, m->x, m->inp, m->p[P_TOK], N, V, D));
  for (int64_t l = 0; l < c->L; l++) {
    float *x = m->x + l * N * D, *xo = x + N * D, *n1 = m->n1 + l * N * D, *q = m->q + l * N * qd,
          *k = m->k + l * N * kd, *v = m->v + l * N * kd, *att = m->att + l * N * qd,
          *h = m->h + l * N * D, *n2 = m->n2 + l * N * D, *a = m->a + l * N * F,
          *b = m->b + l * N * F, *g = m->gg + l * N * F;
    float *const *P = m->p + pidx(m, l, 0);
    /* h = x + wo(attn(rope(q), rope(k), v)), q, k, v = wq/wk/wv(rmsnorm(x)) */
    WEFT_CHECK(weft_backend_rmsnorm_forward(DEV, n1, m->rstd1 + l * N, x, P[P_ANORM], N, D, eps));
    WEFT_CHECK(weft_backend_linear_forward(DEV, q, n1, P[P_WQ], NULL, N, D, qd));
    WEFT_CHECK(weft_backend_linear_forward(DEV, k, n1, P[P_WK], NULL, N, D, kd));
    WEFT_CHECK(weft_backend_linear_forward(DEV, v, n1, P[P_WV], NULL, N, D, kd));
    WEFT_CHECK(weft_backend_rope_forward(DEV, q, q, m->cosb, m->sinb, T, B, T, H, hd, 0));
    WEFT_CHECK(weft_backend_rope_forward(DEV, k, k, m->cosb, m->sinb, T, B, T, Hkv, hd, 0));
    WEFT_CHECK(weft_backend_attention_forward(DEV, att, m->lse + l * B * H * T, q, k, v, B, T, H,
                                              Hkv, hd, true, m->scratch));
    WEFT_CHECK(weft_backend_linear_forward(DEV, h, att, P[P_WO], NULL, N, qd, D));
    WEFT_CHECK(weft_backend_residual_forward(DEV, h, h, x, N * D));
    /* out = h + w2(silu(w1 n) * w3 n), n = rmsnorm(h) */
    WEFT_CHECK(weft_backend_rmsnorm_forward(DEV, n2, m->rstd2 + l * N, h, P[P_FNORM], N, D, eps));
    WEFT_CHECK(weft_backend_linear_forward(DEV, a, n2, P[P_W1], NULL, N, D, F));
    WEFT_CHECK(weft_backend_linear_forward(DEV, b, n2, P[P_W3], NULL, N, D, F));
    WEFT_CHECK(weft_backend_swiglu_forward(DEV, g, a, b, N * F));
    WEFT_CHECK(weft_backend_linear_forward(DEV, xo, g, P[P_W2], NULL, N, F, D));
    WEFT_CHECK(weft_backend_residual_forward(DEV, xo, xo, h, N * D));
  }
  WEFT_CHECK(weft_backend_rmsnorm_forward(DEV, m->nf, m->rstdf, m->x + c->L * N * D,
                                          m->p[P_NORM(m)], N, D, eps));
  WEFT_CHECK(weft_backend_linear_forward(DEV, m->logits, m->nf, m->p[P_OUT(m)], NULL, N, D, V));
  double l = 0;
  WEFT_CHECK(weft_backend_cross_entropy_forward(DEV, &l, m->lsece, m->logits, m->tgt, N, V));
  /* every rank has B/dp sequences: the mean of the rank means is the global mean */
  if (m->dp > 1)
    WEFT_CHECK(weft_all_reduce(m->mesh, m->dp_dim, &l, &l, 1, WEFT_F64, WEFT_OP_AVG, NULL));
  if (loss) *loss = l;
  return WEFT_OK;
}

weft_status gpu_model_backward(gpu_model *m) {
  const gpu_model_config *c = &m->c;
  const int64_t B = m->Bl, T = c->T, D = c->D, F = c->F, V = c->V, H = c->H, Hkv = c->Hkv,
                hd = m->hd, qd = m->qd, kd = m->kd, N = m->N;
  WEFT_CHECK(weft_memset(DEV, m->grads, 0, (size_t)m->flat * sizeof(float)));
  /* d(mean over the local N rows); the dp AVG below turns it into the global mean */
  float *dlog = m->logits, *dx = m->dx; /* in place: logits are not needed after this */
  WEFT_CHECK(weft_backend_cross_entropy_backward(DEV, dlog, m->logits, m->lsece, m->tgt, N, V,
                                                 1.0f / (float)N));
  WEFT_CHECK(weft_backend_linear_backward(DEV, m->dn, m->g[P_OUT(m)], NULL, dlog, m->nf,
                                          m->p[P_OUT(m)], N, D, V, false, true));
  WEFT_CHECK(weft_backend_rmsnorm_backward(DEV, dx, m->g[P_NORM(m)], m->dn, m->x + c->L * N * D,
                                           m->p[P_NORM(m)], m->rstdf, N, D, false));
  for (int64_t l = c->L - 1; l >= 0; l--) {
    float *x = m->x + l * N * D, *n1 = m->n1 + l * N * D, *q = m->q + l * N * qd,
          *k = m->k + l * N * kd, *v = m->v + l * N * kd, *att = m->att + l * N * qd,
          *h = m->h + l * N * D, *n2 = m->n2 + l * N * D, *a = m->a + l * N * F,
          *b = m->b + l * N * F, *g = m->gg + l * N * F;
    float *const *P = m->p + pidx(m, l, 0);
    float *const *G = m->g + pidx(m, l, 0);
    /* feed-forward branch; dx carries d(out) = d(h) through the residual */
    float *dg = m->dbig;
    WEFT_CHECK(
        weft_backend_linear_backward(DEV, dg, G[P_W2], NULL, dx, g, P[P_W2], N, F, D, false, true));
    WEFT_CHECK(weft_backend_swiglu_backward(DEV, m->da, m->db, dg, a, b, N * F));
    WEFT_CHECK(weft_backend_linear_backward(DEV, m->dn, G[P_W1], NULL, m->da, n2, P[P_W1], N, D, F,
                                            false, true));
    WEFT_CHECK(weft_backend_linear_backward(DEV, m->dn, G[P_W3], NULL, m->db, n2, P[P_W3], N, D, F,
                                            true, true));
    WEFT_CHECK(weft_backend_rmsnorm_backward(DEV, dx, G[P_FNORM], m->dn, h, P[P_FNORM],
                                             m->rstd2 + l * N, N, D, true));
    /* attention branch; dx now d(h) = d(x) through the residual */
    float *datt = m->dbig;
    WEFT_CHECK(weft_backend_linear_backward(DEV, datt, G[P_WO], NULL, dx, att, P[P_WO], N, qd, D,
                                            false, true));
    WEFT_CHECK(weft_backend_attention_backward(DEV, m->dq, m->dk, m->dv, datt, q, k, v,
                                               m->lse + l * B * H * T, att, B, T, H, Hkv, hd, true,
                                               m->scratch));
    WEFT_CHECK(weft_backend_rope_backward(DEV, m->dq, m->dq, m->cosb, m->sinb, T, B, T, H, hd, 0));
    WEFT_CHECK(
        weft_backend_rope_backward(DEV, m->dk, m->dk, m->cosb, m->sinb, T, B, T, Hkv, hd, 0));
    WEFT_CHECK(weft_backend_linear_backward(DEV, m->dn, G[P_WQ], NULL, m->dq, n1, P[P_WQ], N, D, qd,
                                            false, true));
    WEFT_CHECK(weft_backend_linear_backward(DEV, m->dn, G[P_WK], NULL, m->dk, n1, P[P_WK], N, D, kd,
                                            true, true));
    WEFT_CHECK(weft_backend_linear_backward(DEV, m->dn, G[P_WV], NULL, m->dv, n1, P[P_WV], N, D, kd,
                                            true, true));
    WEFT_CHECK(weft_backend_rmsnorm_backward(DEV, dx, G[P_ANORM], m->dn, x, P[P_ANORM],
                                             m->rstd1 + l * N, N, D, true));
  }
  WEFT_CHECK(weft_backend_embedding_backward(DEV, m->g[P_TOK], m->inp, dx, N, V, D));
  if (m->dp > 1) WEFT_CHECK(dp_all_reduce_grads(m));
  return WEFT_OK;
}

/* --------------------------------------------------------------- optimizer */

weft_status gpu_model_clip_grads(gpu_model *m, double max_norm, double *norm) {
  /* after the dp all-reduce every rank holds the full gradient: no reduction */
  double *per = malloc((size_t)m->np * sizeof *per);
  if (!per) return weft_error(WEFT_ERR_OOM, "%d sums of squares", m->np);
  weft_status st = weft_backend_sumsq_multi(DEV, (const float *const *)m->g, m->numel, m->np, per);
  double sumsq = 0;
  for (int i = 0; i < m->np && !st; i++) sumsq += per[i];
  free(per);
  WEFT_CHECK(st);
  const double total = sqrt(sumsq);
  if (norm) *norm = total;
  if (max_norm > 0) {
    const double coef = weft_clip_coef(total, max_norm);
    if (coef < 1.0) WEFT_CHECK(weft_backend_scale_multi(DEV, m->g, m->numel, m->np, (float)coef));
  }
  return WEFT_OK;
}

weft_status gpu_model_adamw_step(gpu_model *m, const weft_adamw_params *hp) {
  if (!hp) return weft_error(WEFT_ERR_INVALID, "hp must not be NULL");
  if (hp->amsgrad) return weft_error(WEFT_ERR_UNSUPPORTED, "gpu_model keeps no vmax: amsgrad off");
  m->step++;
  WEFT_CHECK(weft_backend_adamw_multi(DEV, m->p, (const float *const *)m->g, m->pm, m->pv, NULL,
                                      m->numel, m->np, m->step, hp));
  return WEFT_OK;
}

weft_status gpu_model_train_step(gpu_model *m, const weft_adamw_params *hp, double max_norm,
                                 double *loss, double *norm) {
  WEFT_CHECK(gpu_model_forward(m, loss));
  WEFT_CHECK(gpu_model_backward(m));
  WEFT_CHECK(gpu_model_clip_grads(m, max_norm, norm));
  WEFT_CHECK(gpu_model_adamw_step(m, hp));
  return WEFT_OK;
}

double gpu_model_step_flops(const gpu_model_config *c, int64_t tokens) {
  const double hd = (double)(c->D / c->H);
  const double per_layer = 2.0 * (double)c->D +
                           (double)c->D * hd * (double)(2 * c->H + 2 * c->Hkv) +
                           3.0 * (double)c->D * (double)c->F;
  const double P = (double)c->L * per_layer + (double)c->D + (double)c->V * (double)c->D;
  return 6.0 * P * (double)tokens +
         6.0 * (double)c->L * (double)c->T * (double)c->D * (double)tokens;
}
