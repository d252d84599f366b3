/* weft-plan's probe: what the links and the cores of this world deliver,
 * measured through weft itself, every rank at once (so that a shared node
 * link and more ranks than cores are part of the numbers).
 *
 * The world is laid out as a mesh (node, local) over a communicator whose
 * ranks are sorted by (weft_node_index, world rank): "local" groups are
 * the ranks of one node (intra-node link), "node" groups one rank per node
 * (inter-node link; every rank of a node uses the link at once, as a
 * collective along a mesh dim does).
 *   latency   all-reduces of one float over the dim (weft_all_reduce,
 *             blocking, with weft's waiting policy), the slowest rank's
 *             time per call (median of 5 trials of 40), divided by the
 *             message steps of a small all-reduce, ceil(log2 n) (MPICH's
 *             recursive doubling); and the same right after a GEMM (16 x
 *             (GEMM + all-reduce) minus 16 GEMMs, median of 5): in a step
 *             a collective follows compute, and with more ranks than cores
 *             its peers may not be running. The model uses the larger.
 *   bandwidth all-gathers (AG) and all-reduces (AR) of 4 MiB per rank, the
 *             slowest rank's time; bus bytes per rank (mesh.h's bus_bytes:
 *             AG payload*(n-1)/n, AR 2*payload*(n-1)/n) / time.
 *   flops     the model's largest GEMM (tokens per rank at dp = world) x
 *             ffn_dim x dim through weft_backend_sgemm, the slowest rank.
 *   mem_bw    weft_backend_residual_forward on 4 Mi floats (12 bytes moved
 *             per element), the slowest rank.
 *   overlap   (t_gemm + t_comm - t_both) / min(t_gemm, t_comm), clipped to
 *             [0, 1], the median of 3 trials, where t_both runs an async all-gather while the same
 *             GEMMs compute, then waits: the share of a collective that
 *             progresses under compute (FSDP's prefetch relies on it).
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "plan.h"

double plan_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double max_over_ranks(double x) {
  MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return x;
}

/* Times `reps` of op on every rank after a barrier; the slowest rank's s. */
typedef weft_status (*probe_fn)(void *ctx);

static int timed(weft_mesh *mesh, probe_fn fn, void *ctx, int reps, double *secs) {
  weft_status st = weft_barrier(mesh, -1, NULL);
  double t0 = plan_now();
  for (int i = 0; i < reps && st == WEFT_OK; i++) st = fn(ctx);
  double t = plan_now() - t0;
  int bad = st != WEFT_OK;
  MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (bad) return -1;
  *secs = max_over_ranks(t);
  return 0;
}

typedef struct coll_ctx {
  weft_mesh *mesh;
  int dim;
  float *send, *recv;
  int64_t count;
  bool reduce;
} coll_ctx;

static weft_status coll(void *p) {
  coll_ctx *c = p;
  if (c->reduce)
    return weft_all_reduce(c->mesh, c->dim, c->send, c->recv, c->count, WEFT_F32, WEFT_OP_SUM,
                           NULL);
  return weft_all_gather(c->mesh, c->dim, c->send, c->recv, c->count, WEFT_F32, NULL);
}

typedef struct gemm_ctx {
  int64_t m, n, k;
  float *a, *b, *c;
} gemm_ctx;

static weft_status gemm(void *p) {
  gemm_ctx *g = p;
  /* c (m, n) = a (m, k) @ b (n, k)^T: a linear layer's forward */
  return weft_backend_sgemm(WEFT_CPU, false, true, g->m, g->n, g->k, 1.0f, g->a, g->k, g->b, g->k,
                            0.0f, g->c, g->n);
}

typedef struct elem_ctx {
  float *out, *a, *b;
  int64_t n;
} elem_ctx;

static weft_status elem(void *p) {
  elem_ctx *e = p;
  return weft_backend_residual_forward(WEFT_CPU, e->out, e->a, e->b, e->n);
}

typedef struct both_ctx {
  coll_ctx *c;
  gemm_ctx *g;
  int greps;
} both_ctx;

static weft_status both(void *p) {
  both_ctx *b = p;
  weft_work *w = NULL;
  weft_status st =
      weft_all_gather(b->c->mesh, b->c->dim, b->c->send, b->c->recv, b->c->count, WEFT_F32, &w);
  for (int i = 0; i < b->greps && st == WEFT_OK; i++) st = gemm(b->g);
  weft_status st2 = weft_work_wait(w);
  return st != WEFT_OK ? st : st2;
}

typedef struct gemm_coll_ctx {
  gemm_ctx *g;
  coll_ctx *c;
} gemm_coll_ctx;

static weft_status gemm_coll(void *p) {
  gemm_coll_ctx *x = p;
  weft_status st = gemm(x->g);
  return st != WEFT_OK ? st : coll(x->c);
}

void plan_fill(float *x, int64_t n, uint32_t seed, float scale) {
  for (int64_t i = 0; i < n; i++) {
    seed = seed * 1664525u + 1013904223u;
    x[i] = ((float)(seed >> 8) / 16777216.0f - 0.5f) * scale;
  }
}

static void model_key(const weft_llama_config *m, int64_t k[6]) {
  k[0] = m->dim;
  k[1] = m->n_heads;
  k[2] = m->n_kv_heads;
  k[3] = m->ffn_dim;
  k[4] = m->vocab;
  k[5] = m->max_seq_len;
}

/* Latency and bandwidths of one dim of the (node, local) mesh. */
static int probe_dim(weft_mesh *mesh, int dim, double *lat, double *bw, double *rbw) {
  int n = weft_mesh_dim_size(mesh, dim);
  const int64_t count = 1 << 20; /* 4 MiB per rank */
  float *send = malloc(sizeof(float) * (size_t)count);
  float *recv = malloc(sizeof(float) * (size_t)count * (size_t)n);
  int bad = !send || !recv;
  MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  int rc = -1;
  if (bad) goto done;
  plan_fill(send, count, 7u + (uint32_t)weft_world_rank(), 1.0f);
  coll_ctx small = {mesh, dim, send, recv, 1, true};
  double t;
  /* the median of 5 trials of 40 calls (a shared machine's hiccups) */
  double v[5];
  if (timed(mesh, coll, &small, 10, &t)) goto done;
  for (int i = 0; i < 5; i++) {
    if (timed(mesh, coll, &small, 40, &t)) goto done;
    v[i] = t / 40;
  }
  *lat = plan_median(v, 5) / ceil(log2((double)n));
  coll_ctx ag = {mesh, dim, send, recv, count, false};
  if (timed(mesh, coll, &ag, 1, &t) || timed(mesh, coll, &ag, 4, &t)) goto done;
  *bw = 4.0 * (double)count * (n - 1) / (t / 4);
  coll_ctx ar = {mesh, dim, send, recv, count, true};
  if (timed(mesh, coll, &ar, 1, &t) || timed(mesh, coll, &ar, 4, &t)) goto done;
  *rbw = 2.0 * 4.0 * (double)count * (n - 1) / n / (t / 4);
  rc = 0;
done:
  free(send);
  free(recv);
  return rc;
}

/* One collective kind on one dim, `count` floats per rank block. */
typedef struct kind_ctx {
  weft_mesh *mesh;
  int dim, kind;
  float *send, *recv;
  int64_t count;
} kind_ctx;

static weft_status run_kind(void *p) {
  kind_ctx *c = p;
  if (c->kind == WEFT_COLL_ALL_GATHER)
    return weft_all_gather(c->mesh, c->dim, c->send, c->recv, c->count, WEFT_F32, NULL);
  if (c->kind == WEFT_COLL_REDUCE_SCATTER)
    return weft_reduce_scatter(c->mesh, c->dim, c->send, c->recv, c->count, WEFT_F32, WEFT_OP_SUM,
                               NULL);
  return weft_all_reduce(c->mesh, c->dim, c->send, c->recv, c->count, WEFT_F32, WEFT_OP_SUM, NULL);
}

/* A collective after compute: greps GEMMs, then the call. */
typedef struct gap_ctx {
  gemm_ctx *g;
  int greps;
  kind_ctx *c;
} gap_ctx;

static weft_status gemms(void *p) {
  gap_ctx *x = p;
  weft_status st = WEFT_OK;
  for (int i = 0; i < x->greps && st == WEFT_OK; i++) st = gemm(x->g);
  return st;
}

static weft_status gemms_then_call(void *p) {
  gap_ctx *x = p;
  weft_status st = gemms(p);
  return st != WEFT_OK ? st : run_kind(x->c);
}

/* Each kind's time per call on dim d of mesh at PLAN_COLL_SIZES payloads
 * (64 floats per rank up to 1 MiB in all), every group at once, two ways:
 * back to back (secs), and each call right after about PLAN_COLL_GAP s of
 * GEMMs g on every rank (gap_secs: reps x (GEMMs + call) minus reps x
 * GEMMs), as in a step, where compute separates the collectives: a shaped
 * link's token bucket refills in the gap (tbf passes the refilled burst at
 * the veth's speed), and ranks sharing a core leave the GEMMs apart. Each
 * the median of COLL_TRIALS trials of enough calls (with their gaps) for
 * COLL_TRIAL_S seconds (at least 3), the trials of all entries taken in turn, so that a
 * hiccup of the machine spoils one trial of several entries, not an entry. */
enum { COLL_TRIALS = 7 };
#define COLL_TRIAL_S 0.05
static int fit_dim(weft_mesh *mesh, int d, gemm_ctx *g, plan_coll_fit *f) {
  int n = weft_mesh_dim_size(mesh, d);
  int64_t blocks[PLAN_COLL_SIZES] = {64, (int64_t)(16 << 10) / n, (int64_t)(64 << 10) / n,
                                     (int64_t)(256 << 10) / n}; /* floats per rank block */
  const int64_t big = blocks[PLAN_COLL_SIZES - 1];
  float *send = malloc(sizeof(float) * (size_t)(big * n));
  float *recv = malloc(sizeof(float) * (size_t)(big * n));
  int bad = !send || !recv;
  MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  int rc = bad ? -1 : 0;
  if (!rc) plan_fill(send, big * n, 23u + (uint32_t)weft_world_rank(), 1.0f);
  const int kinds[3] = {WEFT_COLL_ALL_GATHER, WEFT_COLL_REDUCE_SCATTER, WEFT_COLL_ALL_REDUCE};
  kind_ctx c[3][PLAN_COLL_SIZES];
  int reps[3][PLAN_COLL_SIZES], reps_gap[3][PLAN_COLL_SIZES];
  double v[3][PLAN_COLL_SIZES][COLL_TRIALS], w[3][PLAN_COLL_SIZES][COLL_TRIALS];
  for (int i = 0; i < WEFT_COLL_KIND_COUNT; i++) f->secs[i][0] = f->gap_secs[i][0] = -1;
  /* GEMMs per gap: about PLAN_COLL_GAP s of wall time with every rank busy */
  gap_ctx gx = {g, 16, NULL};
  double tg = 0;
  if (!rc) rc = timed(mesh, gemms, &gx, 1, &tg);
  if (!rc) {
    gx.greps = (int)fmax(1, round(PLAN_COLL_GAP / (tg / 16)));
    f->gap = gx.greps * tg / 16;
  }
  for (int z = 0; z < PLAN_COLL_SIZES; z++) f->bytes[z] = 4.0 * (double)blocks[z] * n;
  /* one warm-up call each, which also sets the calls per trial (the same
   * on every rank: timed gives the slowest rank's time) */
  for (int ki = 0; ki < 3 && !rc; ki++)
    for (int z = 0; z < PLAN_COLL_SIZES && !rc; z++) {
      int kind = kinds[ki];
      /* all-reduce's count is the whole buffer; the others' a rank's block */
      c[ki][z] = (kind_ctx){mesh, d,    kind,
                            send, recv, kind == WEFT_COLL_ALL_REDUCE ? blocks[z] * n : blocks[z]};
      double t = 0;
      rc = timed(mesh, run_kind, &c[ki][z], 1, &t);
      reps[ki][z] = (int)fmin(200, fmax(3, ceil(COLL_TRIAL_S / fmax(t, 1e-6))));
      reps_gap[ki][z] = (int)fmin(200, fmax(3, ceil(COLL_TRIAL_S / (t + f->gap))));
    }
  for (int trial = 0; trial < COLL_TRIALS && !rc; trial++)
    for (int ki = 0; ki < 3 && !rc; ki++)
      for (int z = 0; z < PLAN_COLL_SIZES && !rc; z++) {
        double t = 0, after = 0, only = 0;
        gx.c = &c[ki][z];
        int r = reps[ki][z], rg = reps_gap[ki][z];
        rc = timed(mesh, run_kind, &c[ki][z], r, &t) ||
             timed(mesh, gemms_then_call, &gx, rg, &after) || timed(mesh, gemms, &gx, rg, &only);
        v[ki][z][trial] = t / r;
        w[ki][z][trial] = fmax(0, after - only) / rg;
      }
  for (int ki = 0; ki < 3 && !rc; ki++)
    for (int z = 0; z < PLAN_COLL_SIZES; z++) {
      f->secs[kinds[ki]][z] = plan_median(v[ki][z], COLL_TRIALS);
      f->gap_secs[kinds[ki]][z] = plan_median(w[ki][z], COLL_TRIALS);
    }
  free(send);
  free(recv);
  return rc;
}

int plan_probe_collectives(const plan_opts *o, int world, plan_probe *p) {
  /* the gaps' GEMM: the model's w1 at dp = world, as the link probe's */
  int64_t tokens = o->batch * o->m.max_seq_len / world;
  gemm_ctx g = {tokens < 1 ? 1 : tokens, o->m.ffn_dim, o->m.dim, NULL, NULL, NULL};
  g.a = malloc(sizeof(float) * (size_t)(g.m * g.k));
  g.b = malloc(sizeof(float) * (size_t)(g.n * g.k));
  g.c = malloc(sizeof(float) * (size_t)(g.m * g.n));
  int bad = !g.a || !g.b || !g.c;
  MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (!bad) {
    plan_fill(g.a, g.m * g.k, 29u + (uint32_t)weft_world_rank(), 1.0f);
    plan_fill(g.b, g.n * g.k, 31u, 1.0f);
  }
  plan_opts q = *o;
  q.c.nodes = p->nodes;
  q.c.gpn = p->gpn;
  q.tp_across = true;
  plan_config *v = NULL;
  int n = bad ? 0 : plan_enumerate(&q, world, true, &v), rc = bad ? -1 : 0;
  p->ncoll = 0;
  for (int i = 0; i < n && !rc; i++) {
    int size[3], stride[3];
    plan_dim_layout(&v[i], size, stride);
    for (int d = 0; d < 3 && !rc; d++) {
      if (size[d] < 2) continue;
      int spans = plan_group_nodes(stride[d], size[d], world, p->gpn);
      bool seen = false;
      for (int c = 0; c < p->ncoll; c++)
        seen = seen || (p->coll[c].n == size[d] && p->coll[c].spans == spans);
      if (seen || p->ncoll == PLAN_MAX_COLL) continue;
      /* the factorisation's own mesh, laid out as its run will be */
      const char *names[3] = {"dp_replicate", "dp_shard", "tp"};
      int order_inside[3] = {0, 1, 2}, order_across[3] = {2, 0, 1};
      weft_mesh *mesh = NULL;
      if (weft_mesh_create_ordered(3, size, names, v[i].across ? order_across : order_inside,
                                   &mesh) != WEFT_OK) {
        rc = -1;
        break;
      }
      plan_coll_fit *f = &p->coll[p->ncoll];
      f->n = size[d];
      f->spans = spans;
      rc = fit_dim(mesh, d, &g, f);
      if (!rc) p->ncoll++;
      weft_mesh_destroy(mesh);
    }
  }
  free(v);
  free(g.a);
  free(g.b);
  free(g.c);
  return rc;
}

int plan_probe_run(const plan_opts *o, plan_probe *p) {
  double t_start = plan_now();
  memset(p, 0, sizeof *p);
  int world = weft_world_size(), rank = weft_world_rank();
  int nodes = weft_node_count(), node = weft_node_index();
  /* ranks per node: equal on every node, or the (node, local) mesh is not
   * a grid */
  int *nodeof = malloc(sizeof(int) * (size_t)world);
  if (!nodeof) return -1;
  MPI_Allgather(&node, 1, MPI_INT, nodeof, 1, MPI_INT, MPI_COMM_WORLD);
  int local = 0, gpn = 0;
  for (int r = 0; r < world; r++) {
    if (nodeof[r] == node && r < rank) local++;
    if (nodeof[r] == 0) gpn++;
  }
  bool even = gpn * nodes == world;
  for (int q = 0; q < nodes && even; q++) {
    int c = 0;
    for (int r = 0; r < world; r++) c += nodeof[r] == q;
    even = c == gpn;
  }
  free(nodeof);
  if (!even) {
    if (rank == 0)
      fprintf(stderr,
              "weft-plan: error: --measure/--probe want the same number of ranks on every node "
              "(%d ranks on %d nodes, %d on node 0)\n",
              world, nodes, gpn);
    return -1;
  }
  p->nodes = nodes;
  p->gpn = gpn;
  MPI_Comm comm;
  MPI_Comm_split(MPI_COMM_WORLD, 0, node * gpn + local, &comm);
  weft_mesh *mesh = NULL;
  int shape[2] = {nodes, gpn};
  const char *names[2] = {"node", "local"};
  weft_status st = weft_mesh_create_from_comm(comm, 2, shape, names, &mesh);
  MPI_Comm_free(&comm);
  if (st != WEFT_OK) {
    if (rank == 0) fprintf(stderr, "weft-plan: error: probe mesh: %s\n", weft_last_error());
    return -1;
  }
  int rc = 0;
  if (gpn > 1) rc = probe_dim(mesh, 1, &p->intra_lat, &p->intra_bw, &p->intra_rbw);
  if (!rc && nodes > 1) rc = probe_dim(mesh, 0, &p->inter_lat, &p->inter_bw, &p->inter_rbw);
  /* compute: the model's w1 GEMM at dp = world */
  const weft_llama_config *m = &o->m;
  int64_t tokens = o->batch * m->max_seq_len / world;
  if (tokens < 1) tokens = 1;
  gemm_ctx g = {tokens, m->ffn_dim, m->dim, NULL, NULL, NULL};
  g.a = malloc(sizeof(float) * (size_t)(g.m * g.k));
  g.b = malloc(sizeof(float) * (size_t)(g.n * g.k));
  g.c = malloc(sizeof(float) * (size_t)(g.m * g.n));
  elem_ctx e = {NULL, NULL, NULL, 1 << 22};
  e.out = malloc(sizeof(float) * (size_t)e.n);
  e.a = malloc(sizeof(float) * (size_t)e.n);
  e.b = malloc(sizeof(float) * (size_t)e.n);
  int bad = !g.a || !g.b || !g.c || !e.out || !e.a || !e.b;
  MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (bad) rc = -1;
  double t = 0;
  if (!rc) {
    plan_fill(g.a, g.m * g.k, 11u + (uint32_t)rank, 1.0f);
    plan_fill(g.b, g.n * g.k, 13u, 1.0f);
    plan_fill(e.a, e.n, 17u, 1.0f);
    plan_fill(e.b, e.n, 19u, 1.0f);
    /* enough GEMMs for ~0.3 s on one rank alone at 20 GFLOP/s */
    double fl = 2.0 * (double)g.m * (double)g.n * (double)g.k;
    int greps = (int)fmin(200, fmax(2, 0.3 * 20e9 / fl / world));
    rc = timed(mesh, gemm, &g, 1, &t) || timed(mesh, gemm, &g, greps, &t);
    if (!rc) p->flops = fl * greps / t;
    p->gemm_m = g.m;
    p->gemm_n = g.n;
    p->gemm_k = g.k;
    /* latency after compute: 16 x (GEMM, one-float all-reduce) minus 16
     * GEMMs, the median of 5 trials, per message step */
    for (int d = 0; d < 2 && !rc; d++) {
      int n = weft_mesh_dim_size(mesh, d);
      if (n < 2) continue;
      coll_ctx c = {mesh, d, e.a, e.out, 1, true};
      gemm_coll_ctx x = {&g, &c};
      double v[5], tg, tgc;
      for (int i = 0; i < 5 && !rc; i++) {
        rc = timed(mesh, gemm, &g, 16, &tg) || timed(mesh, gemm_coll, &x, 16, &tgc);
        v[i] = fmax(0, tgc - tg) / 16 / ceil(log2((double)n));
      }
      *(d ? &p->intra_clat : &p->inter_clat) = plan_median(v, 5);
    }
    if (!rc) rc = timed(mesh, elem, &e, 1, &t) || timed(mesh, elem, &e, 5, &t);
    if (!rc) p->mem_bw = 12.0 * (double)e.n * 5 / t;
    /* overlap: an all-gather on the slowest link under the same GEMMs */
    int dim = nodes > 1 ? 0 : 1;
    if (!rc && weft_mesh_dim_size(mesh, dim) > 1) {
      int n = weft_mesh_dim_size(mesh, dim);
      coll_ctx c = {mesh, dim, e.a, NULL, e.n / 4 / n, false};
      c.recv = e.out;
      double tg, tc, tb, hid[3] = {0, 0, 0};
      both_ctx b = {&c, &g, greps};
      /* the median of 3 trials (a shared machine's hiccups) */
      for (int i = 0; i < 3 && !rc; i++) {
        rc = timed(mesh, gemm, &g, greps, &tg) || timed(mesh, coll, &c, 1, &tc) ||
             timed(mesh, both, &b, 1, &tb);
        if (!rc) hid[i] = fmax(0, fmin(1, (tg + tc - tb) / fmin(tg, tc)));
      }
      p->overlap = plan_median(hid, 3);
    }
  }
  if (!rc) rc = plan_probe_kernels(o, world, p);
  if (!rc) rc = plan_probe_collectives(o, world, p);
  model_key(&o->m, p->kmodel);
  free(g.a);
  free(g.b);
  free(g.c);
  free(e.out);
  free(e.a);
  free(e.b);
  weft_mesh_destroy(mesh);
  if (rc && rank == 0) fprintf(stderr, "weft-plan: error: probe failed: %s\n", weft_last_error());
  p->seconds = max_over_ranks(plan_now() - t_start);
  return rc;
}

static void print_link(const char *kind, bool has, const char *why_not, double lat, double clat,
                       double bw, double rbw) {
  if (!has) {
    printf("  %s-node: none (%s)\n", kind, why_not);
    return;
  }
  printf(
      "  %s-node: latency %.1f us back to back, %.1f us after compute; bandwidth %.1f MB/s "
      "(all-gather) %.1f MB/s (all-reduce) per rank\n",
      kind, lat * 1e6, clat * 1e6, bw / 1e6, rbw / 1e6);
}

void plan_probe_print(const plan_probe *p) {
  printf("probe: %d node%s x %d rank%s per node (%.1f s)\n", p->nodes, p->nodes == 1 ? "" : "s",
         p->gpn, p->gpn == 1 ? "" : "s", p->seconds);
  print_link("intra", p->gpn > 1, "one rank per node", p->intra_lat, p->intra_clat, p->intra_bw,
             p->intra_rbw);
  print_link("inter", p->nodes > 1, "one node", p->inter_lat, p->inter_clat, p->inter_bw,
             p->inter_rbw);
  printf(
      "  compute: %.2f GFLOP/s per rank (GEMM %lld x %lld x %lld), element-wise %.2f GB/s "
      "per rank, comm/compute overlap %.2f\n",
      p->flops / 1e9, (long long)p->gemm_m, (long long)p->gemm_n, (long long)p->gemm_k,
      p->mem_bw / 1e9, p->overlap);
  printf(
      "  whole model (tp 1) forward + backward %.1f ms = its kernels + %.1f ms; AdamW %.1f M "
      "elements/s per rank\n  one block's forward + backward, the head's:",
      1e3 * p->model_step_s, 1e3 * p->framework, p->adamw_rate / 1e6);
  for (int i = 0; i < p->nkern; i++)
    printf("%s batch %lld tp %d: %.1f + %.1f ms", i ? "," : "", (long long)p->kern[i].batch_local,
           p->kern[i].tp, 1e3 * p->kern[i].block_s, 1e3 * p->kern[i].head_s);
  printf("\n");
  for (int i = 0; i < p->ncoll; i++) {
    const plan_coll_fit *f = &p->coll[i];
    printf("  collectives, groups of %d ranks %s:", f->n,
           f->spans > 1 ? "across nodes" : "inside a node");
    if (f->spans > 1) printf(" (%d nodes each)", f->spans);
    printf("\n   ");
    for (int z = 0; z < PLAN_COLL_SIZES; z++) printf(" %8.0f B", f->bytes[z]);
    printf("  (payload; ms per call below)\n");
    for (int kind = 0; kind < WEFT_COLL_KIND_COUNT; kind++) {
      if (f->secs[kind][0] < 0) continue;
      printf("   ");
      for (int z = 0; z < PLAN_COLL_SIZES; z++) printf(" %8.3f  ", 1e3 * f->secs[kind][z]);
      printf(" %s\n", weft_coll_kind_name((weft_coll_kind)kind));
      if (f->gap <= 0) continue;
      printf("   ");
      for (int z = 0; z < PLAN_COLL_SIZES; z++) printf(" %8.3f  ", 1e3 * f->gap_secs[kind][z]);
      printf(" %s after %.2f ms of compute\n", weft_coll_kind_name((weft_coll_kind)kind),
             1e3 * f->gap);
    }
  }
  fflush(stdout);
}

/* Reads PLAN_COLL_SIZES seconds >= 0 into out; an absent array gives
 * out[0] = -1 (not measured). False if present but malformed. */
static bool secs_array(const cJSON *a, double out[PLAN_COLL_SIZES]) {
  out[0] = -1;
  if (!a) return true;
  if (cJSON_GetArraySize(a) != PLAN_COLL_SIZES) return false;
  for (int z = 0; z < PLAN_COLL_SIZES; z++) {
    const cJSON *x = cJSON_GetArrayItem(a, z);
    if (!cJSON_IsNumber(x) || x->valuedouble < 0) return false;
    out[z] = x->valuedouble;
  }
  return true;
}

/* The fields of the JSON file, in order. */
typedef struct field {
  const char *name;
  size_t off;
  bool positive; /* must be > 0 (else >= 0) */
} field;

#define F(name, pos) \
  { #name, offsetof(plan_probe, name), pos }
static const field FIELDS[] = {F(intra_lat, false),  F(inter_lat, false), F(intra_bw, false),
                               F(inter_bw, false),   F(intra_rbw, false), F(inter_rbw, false),
                               F(flops, true),       F(mem_bw, false),    F(overlap, false),
                               F(seconds, false),    F(framework, false), F(model_step_s, false),
                               F(intra_clat, false), F(inter_clat, false)};
#undef F
#define NFIELDS (sizeof FIELDS / sizeof FIELDS[0])

cJSON *plan_probe_to_json(const plan_probe *p) {
  cJSON *j = cJSON_CreateObject();
  bool ok = j != NULL;
  ok = ok && cJSON_AddStringToObject(j, "format", "weft-plan probe 1");
  ok = ok && cJSON_AddNumberToObject(j, "nodes", p->nodes);
  ok = ok && cJSON_AddNumberToObject(j, "ranks_per_node", p->gpn);
  for (size_t i = 0; ok && i < NFIELDS; i++)
    ok = cJSON_AddNumberToObject(j, FIELDS[i].name,
                                 *(const double *)((const char *)p + FIELDS[i].off)) != NULL;
  ok = ok && cJSON_AddNumberToObject(j, "gemm_m", (double)p->gemm_m);
  ok = ok && cJSON_AddNumberToObject(j, "gemm_n", (double)p->gemm_n);
  ok = ok && cJSON_AddNumberToObject(j, "gemm_k", (double)p->gemm_k);
  ok = ok && cJSON_AddNumberToObject(j, "adamw_rate", p->adamw_rate);
  cJSON *km = ok ? cJSON_AddArrayToObject(j, "kernel_model") : NULL;
  ok = km != NULL;
  for (int i = 0; ok && i < 6; i++)
    ok = cJSON_AddItemToArray(km, cJSON_CreateNumber((double)p->kmodel[i]));
  cJSON *ka = ok ? cJSON_AddArrayToObject(j, "kernels") : NULL;
  ok = ka != NULL;
  for (int i = 0; ok && i < p->nkern; i++) {
    cJSON *e = cJSON_CreateObject();
    ok = e && cJSON_AddItemToArray(ka, e);
    ok = ok && cJSON_AddNumberToObject(e, "batch_local", (double)p->kern[i].batch_local);
    ok = ok && cJSON_AddNumberToObject(e, "tp", p->kern[i].tp);
    ok = ok && cJSON_AddNumberToObject(e, "block_s", p->kern[i].block_s);
    ok = ok && cJSON_AddNumberToObject(e, "head_s", p->kern[i].head_s);
  }
  cJSON *ca = ok ? cJSON_AddArrayToObject(j, "collectives") : NULL;
  ok = ca != NULL;
  for (int i = 0; ok && i < p->ncoll; i++) {
    cJSON *e = cJSON_CreateObject();
    ok = e && cJSON_AddItemToArray(ca, e);
    ok = ok && cJSON_AddNumberToObject(e, "n", p->coll[i].n);
    ok = ok && cJSON_AddNumberToObject(e, "spans", p->coll[i].spans);
    cJSON *bj = ok ? cJSON_CreateDoubleArray(p->coll[i].bytes, PLAN_COLL_SIZES) : NULL;
    ok = bj && cJSON_AddItemToObject(e, "payload_bytes", bj);
    for (int kind = 0; ok && kind < WEFT_COLL_KIND_COUNT; kind++) {
      if (p->coll[i].secs[kind][0] < 0) continue;
      cJSON *kj = cJSON_CreateDoubleArray(p->coll[i].secs[kind], PLAN_COLL_SIZES);
      ok = kj && cJSON_AddItemToObject(e, weft_coll_kind_name((weft_coll_kind)kind), kj);
      if (!ok || p->coll[i].gap <= 0) continue;
      char key[64];
      snprintf(key, sizeof key, "%s_after_gap", weft_coll_kind_name((weft_coll_kind)kind));
      kj = cJSON_CreateDoubleArray(p->coll[i].gap_secs[kind], PLAN_COLL_SIZES);
      ok = kj && cJSON_AddItemToObject(e, key, kj);
    }
    if (ok && p->coll[i].gap > 0) ok = cJSON_AddNumberToObject(e, "gap_s", p->coll[i].gap) != NULL;
  }
  if (ok) return j;
  cJSON_Delete(j);
  return NULL;
}

int plan_json_write(const char *path, cJSON *j) {
  char *txt = j ? cJSON_Print(j) : NULL;
  cJSON_Delete(j);
  FILE *f = txt ? fopen(path, "w") : NULL;
  bool ok = f && fprintf(f, "%s\n", txt) >= 0;
  if (f && fclose(f)) ok = false;
  cJSON_free(txt);
  return ok ? 0 : -1;
}

int plan_probe_save(const char *path, const plan_probe *p, char *err, size_t cap) {
  if (!plan_json_write(path, plan_probe_to_json(p))) return 0;
  snprintf(err, cap, "--probe-out: cannot write '%s'", path);
  return -1;
}

int plan_probe_load(const char *path, plan_probe *p, char *err, size_t cap) {
  memset(p, 0, sizeof *p);
  FILE *f = fopen(path, "rb");
  if (!f) {
    snprintf(err, cap, "--calibrate: cannot open '%s'", path);
    return -1;
  }
  char *buf = NULL;
  long n = -1;
  if (fseek(f, 0, SEEK_END) == 0) n = ftell(f);
  if (n >= 0 && n < (1 << 20) && fseek(f, 0, SEEK_SET) == 0) {
    buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) == (size_t)n)
      buf[n] = 0;
    else {
      free(buf);
      buf = NULL;
    }
  }
  fclose(f);
  if (!buf) {
    snprintf(err, cap, "--calibrate: cannot read '%s' (not a file under 1 MiB?)", path);
    return -1;
  }
  cJSON *j = cJSON_Parse(buf);
  free(buf);
  int rc = 0;
  const cJSON *fmt = j ? cJSON_GetObjectItemCaseSensitive(j, "format") : NULL;
  if (!j || !cJSON_IsObject(j)) {
    snprintf(err, cap, "--calibrate: '%s' is not JSON (write it with --probe-out)", path);
    rc = -1;
  } else if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, "weft-plan probe 1")) {
    snprintf(err, cap,
             "--calibrate: '%s' is not a weft-plan probe (no \"format\": \"weft-plan "
             "probe 1\")",
             path);
    rc = -1;
  }
  const char *ints[2] = {"nodes", "ranks_per_node"};
  int *iv[2] = {&p->nodes, &p->gpn};
  for (int i = 0; !rc && i < 2; i++) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(j, ints[i]);
    if (!cJSON_IsNumber(x) || x->valuedouble < 1 || x->valuedouble != floor(x->valuedouble)) {
      snprintf(err, cap, "--calibrate: '%s': \"%s\" is missing or not an integer >= 1", path,
               ints[i]);
      rc = -1;
    } else {
      *iv[i] = (int)x->valuedouble;
    }
  }
  for (size_t i = 0; !rc && i < NFIELDS; i++) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(j, FIELDS[i].name);
    bool ok = cJSON_IsNumber(x) && isfinite(x->valuedouble) &&
              (FIELDS[i].positive ? x->valuedouble > 0 : x->valuedouble >= 0);
    if (!ok) {
      snprintf(err, cap, "--calibrate: '%s': \"%s\" is missing or not a number %s 0", path,
               FIELDS[i].name, FIELDS[i].positive ? ">" : ">=");
      rc = -1;
    } else {
      *(double *)((char *)p + FIELDS[i].off) = x->valuedouble;
    }
  }
  /* optional: AdamW's rate and the kernel times (for the model probed) */
  const cJSON *ar = j ? cJSON_GetObjectItemCaseSensitive(j, "adamw_rate") : NULL;
  if (!rc && ar && !(cJSON_IsNumber(ar) && ar->valuedouble >= 0)) {
    snprintf(err, cap, "--calibrate: '%s': \"adamw_rate\" is not a number >= 0", path);
    rc = -1;
  } else if (!rc && ar) {
    p->adamw_rate = ar->valuedouble;
  }
  const cJSON *ka = j ? cJSON_GetObjectItemCaseSensitive(j, "kernels") : NULL, *e;
  if (!rc && ka && !cJSON_IsArray(ka)) {
    snprintf(err, cap, "--calibrate: '%s': \"kernels\" is not an array", path);
    rc = -1;
  }
  const cJSON *kl = rc ? NULL : ka;
  cJSON_ArrayForEach(e, kl) {
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(e, "batch_local"),
                *t = cJSON_GetObjectItemCaseSensitive(e, "tp"),
                *bs = cJSON_GetObjectItemCaseSensitive(e, "block_s"),
                *hs = cJSON_GetObjectItemCaseSensitive(e, "head_s");
    if (!cJSON_IsNumber(b) || !cJSON_IsNumber(t) || !cJSON_IsNumber(bs) || !cJSON_IsNumber(hs) ||
        b->valuedouble < 1 || t->valuedouble < 1 || !(bs->valuedouble > 0) ||
        !(hs->valuedouble > 0) || p->nkern == PLAN_MAX_KERN) {
      snprintf(err, cap,
               "--calibrate: '%s': \"kernels\" entry %d wants batch_local, tp >= 1 and "
               "block_s, head_s > 0 (at most %d entries)",
               path, p->nkern, PLAN_MAX_KERN);
      rc = -1;
      break;
    }
    p->kern[p->nkern++] = (plan_kernel_time){(int64_t)b->valuedouble, (int)t->valuedouble,
                                             bs->valuedouble, hs->valuedouble};
  }
  const cJSON *km = !rc && ka ? cJSON_GetObjectItemCaseSensitive(j, "kernel_model") : NULL;
  if (!rc && ka && (!cJSON_IsArray(km) || cJSON_GetArraySize(km) != 6)) {
    snprintf(err, cap, "--calibrate: '%s': \"kernels\" without a 6-entry \"kernel_model\"", path);
    rc = -1;
  }
  for (int i = 0; !rc && km && i < 6; i++) {
    const cJSON *x = cJSON_GetArrayItem(km, i);
    p->kmodel[i] = cJSON_IsNumber(x) ? (int64_t)x->valuedouble : -1;
  }
  /* collectives per placement (optional: the link model without them) */
  const cJSON *ca = j ? cJSON_GetObjectItemCaseSensitive(j, "collectives") : NULL;
  for (int i = 0; !rc && ca && i < cJSON_GetArraySize(ca) && p->ncoll < PLAN_MAX_COLL; i++) {
    const cJSON *e = cJSON_GetArrayItem(ca, i);
    const cJSON *nj = cJSON_GetObjectItemCaseSensitive(e, "n");
    const cJSON *sj = cJSON_GetObjectItemCaseSensitive(e, "spans");
    if (!cJSON_IsNumber(nj) || !cJSON_IsNumber(sj) || nj->valuedouble < 2 || sj->valuedouble < 1) {
      snprintf(err, cap, "--calibrate: '%s': collectives[%d] needs n >= 2 and spans >= 1", path, i);
      rc = -1;
      break;
    }
    plan_coll_fit *f = &p->coll[p->ncoll];
    f->n = (int)nj->valuedouble;
    f->spans = (int)sj->valuedouble;
    const cJSON *bj = cJSON_GetObjectItemCaseSensitive(e, "payload_bytes");
    bool good = cJSON_GetArraySize(bj) == PLAN_COLL_SIZES;
    for (int z = 0; good && z < PLAN_COLL_SIZES; z++) {
      const cJSON *x = cJSON_GetArrayItem(bj, z);
      good = cJSON_IsNumber(x) && x->valuedouble > (z ? f->bytes[z - 1] : 0);
      if (good) f->bytes[z] = x->valuedouble;
    }
    /* the after-gap curves are optional (an older probe: back to back) */
    const cJSON *gj = cJSON_GetObjectItemCaseSensitive(e, "gap_s");
    f->gap = cJSON_IsNumber(gj) && gj->valuedouble > 0 ? gj->valuedouble : 0;
    for (int kind = 0; good && kind < WEFT_COLL_KIND_COUNT; kind++) {
      const char *name = weft_coll_kind_name((weft_coll_kind)kind);
      char key[64];
      snprintf(key, sizeof key, "%s_after_gap", name);
      good = secs_array(cJSON_GetObjectItemCaseSensitive(e, name), f->secs[kind]) &&
             secs_array(f->gap > 0 ? cJSON_GetObjectItemCaseSensitive(e, key) : NULL,
                        f->gap_secs[kind]);
      if (good && f->secs[kind][0] >= 0 && f->gap > 0 && f->gap_secs[kind][0] < 0)
        good = false; /* gap_s without this kind's curve */
    }
    if (!good) {
      snprintf(err, cap,
               "--calibrate: '%s': collectives[%d] needs %d increasing payload_bytes and %d "
               "seconds >= 0 per kind (and per kind measured, KIND_after_gap after gap_s)",
               path, i, PLAN_COLL_SIZES, PLAN_COLL_SIZES);
      rc = -1;
      break;
    }
    if (!rc) p->ncoll++;
  }
  /* the links the cluster has must have been measured */
  if (!rc && p->gpn > 1 && !(p->intra_bw > 0 && p->intra_rbw > 0)) {
    snprintf(err, cap, "--calibrate: '%s': %d ranks per node but no intra-node bandwidth", path,
             p->gpn);
    rc = -1;
  }
  if (!rc && p->nodes > 1 && !(p->inter_bw > 0 && p->inter_rbw > 0)) {
    snprintf(err, cap, "--calibrate: '%s': %d nodes but no inter-node bandwidth", path, p->nodes);
    rc = -1;
  }
  cJSON_Delete(j);
  return rc;
}

void plan_probe_apply(const plan_probe *p, const weft_llama_config *m, cluster *c) {
  int64_t key[6];
  model_key(m, key);
  c->nodes = p->nodes;
  c->gpn = p->gpn;
  c->intra_bw = p->intra_bw;
  c->intra_rbw = p->intra_rbw;
  c->inter_bw = p->inter_bw;
  c->inter_rbw = p->inter_rbw;
  /* a collective in a step follows compute: the larger latency */
  c->intra_lat = fmax(p->intra_lat, p->intra_clat);
  c->inter_lat = fmax(p->inter_lat, p->inter_clat);
  c->flops = p->flops;
  c->mem_bw = p->mem_bw;
  c->overlap = p->overlap;
  c->nkern = memcmp(key, p->kmodel, sizeof key) ? 0 : p->nkern;
  memcpy(c->kern, p->kern, sizeof c->kern);
  c->adamw_rate = p->adamw_rate;
  c->framework = c->nkern ? p->framework : 0;
  c->ncoll = p->ncoll;
  memcpy(c->coll, p->coll, sizeof c->coll);
}
