/* examples/plan/plan.h — weft-plan's pieces, shared by its files:
 *   plan.c     flags, the model of a step (predict), the ranked table,
 *              --validate, main
 *   probe.c    --probe / --measure's link and compute probe, its JSON
 *              (--probe-out, --calibrate)
 *   measure.c  --measure: every factorisation run with weft-train's core,
 *              the predicted-vs-measured table, --svg, --json
 *   stats.c    ranks and Spearman's correlation (pure; unit-tested)
 * Nothing here is part of the weft library: this is an example program.
 */
#ifndef WEFT_EXAMPLES_PLAN_H
#define WEFT_EXAMPLES_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "train.h"

/* Probed compute of one factorisation's rank-local shapes (kernels_probe.c):
 * a block's forward + backward and the head's, seconds. */
typedef struct plan_kernel_time {
  int64_t batch_local; /* sequences per rank per micro-batch (batch / dp) */
  int tp;
  double block_s, head_s;
} plan_kernel_time;
#define PLAN_MAX_KERN 16
#define PLAN_MAX_REPEAT 15

/* One placement of a dim's groups -- the group size n and the number of
 * nodes each group spans (1: inside a node) -- and each collective kind's
 * time per call there, measured with every group of the dim running it at
 * once (the node links shared as in a step), at PLAN_COLL_SIZES payloads
 * (mesh.h's payload: all-gather output, reduce-scatter input, all-reduce
 * buffer). A call's time is read off the line through the two nearest
 * sizes (a shaped link's burst makes the curve bend). secs[kind][0] < 0:
 * that kind was not measured. */
#define PLAN_COLL_SIZES 4
typedef struct plan_coll_fit {
  int n, spans;
  double bytes[PLAN_COLL_SIZES];
  double secs[WEFT_COLL_KIND_COUNT][PLAN_COLL_SIZES];
  /* the same, each call right after `gap` seconds of compute on every rank
   * (gap 0: not measured) */
  double gap;
  double gap_secs[WEFT_COLL_KIND_COUNT][PLAN_COLL_SIZES];
} plan_coll_fit;
#define PLAN_MAX_COLL 16
/* The compute the probe puts before each call of the after-gap curve, s. */
#define PLAN_COLL_GAP 1e-3
/* Seconds of one call of `kind` with `payload` bytes on f's placement,
 * back to back (after_gap false) or right after f->gap seconds of compute
 * (true; the back-to-back curve if that was not measured). */
double plan_coll_time(const plan_coll_fit *f, int kind, double payload, bool after_gap);

/* A cluster as the time model sees it. Bandwidths are per rank, in bus
 * bytes per second (nccl-tests' convention, mesh.h's bus_bytes), with every
 * rank of a node communicating at once. */
typedef struct cluster {
  int nodes, gpn;
  double intra_bw, inter_bw;   /* bytes/s per rank (bus bandwidth), all-gather */
  double intra_rbw, inter_rbw; /* the same for reductions (all-reduce, reduce-scatter); 0: bw */
  double intra_lat, inter_lat; /* s per message step */
  double mem;                  /* bytes per device */
  double flops;                /* FLOP/s per device (achievable GEMM rate) */
  double mem_bw;               /* bytes/s per device for element-wise work (0: ignored) */
  double overlap;              /* fraction of FSDP's comm hidden under compute, 0..1 */
  /* probed kernel times (0 entries: the FLOP model), AdamW elements/s */
  int nkern;
  plan_kernel_time kern[PLAN_MAX_KERN];
  double adamw_rate;
  double framework; /* s per micro-batch added to the probed kernel times (autograd, DTensor) */
  /* probed collectives per group placement (0: the link model above) */
  int ncoll;
  plan_coll_fit coll[PLAN_MAX_COLL];
} cluster;

typedef struct plan_opts {
  weft_llama_config m;
  char model_name[32];
  int64_t batch, grad_accum;
  cluster c;
  bool sp, lp, bf16, tp_across, validate, all;
  int raf;
  int top;
  int64_t steps;
  bool steps_given;
  /* --measure, --probe and their files */
  bool measure, probe;
  const char *probe_out, *calibrate, *svg, *json;
  bool has_overlap; /* --overlap given (overrides the probe's) */
  int repeat;       /* --repeat: rounds of --measure runs (1) */
  double overlap_flag;
} plan_opts;

/* One factorisation and its predictions. */
typedef struct plan_config {
  int rep, shard, tp;
  bool across; /* tp outermost in world rank order (tp groups span nodes) */
  bool valid;
  char why[96];
  /* memory per rank, bytes */
  double m_params, m_grads, m_optim, m_unsharded, m_act, m_total;
  bool fits;
  /* comm per step: bytes and calls per (dim: 0 rep, 1 shard, 2 tp; kind) */
  double bytes[3][WEFT_COLL_KIND_COUNT];
  double calls[3][WEFT_COLL_KIND_COUNT];
  bool intra[3]; /* the dim's groups are each inside one node */
  double t_comm[3], t_compute, t_gemm, t_elem, t_step;
  bool probed; /* t_gemm is the probed kernel time, not FLOPs / rate */
} plan_config;

extern const char *const PLAN_DIM_NAMES[3]; /* dp_replicate, dp_shard, tp */

/* The payload from which mesh's presync runs (weft_get_settings() once
 * weft_init ran, else WEFT_PRESYNC_BYTES, else mesh's default 65536). */
int64_t plan_presync_bytes(void);
/* Fills k's predictions from (rep, shard, tp, across) and o. Local, pure. */
void plan_predict(const plan_opts *o, plan_config *k);
/* Every (rep, shard, tp) with rep * shard * tp = world (tp within a node
 * unless o->tp_across), predicted; with both_layouts, each tp > 1 with
 * dp > 1 twice (tp inside nodes, then across). Returns the count; *out is
 * malloc'ed (the caller frees it). */
int plan_enumerate(const plan_opts *o, int world, bool both_layouts, plan_config **out);
/* "dp_shard=2 x tp=2 (tp inside)" */
void plan_config_name(const plan_config *k, char *buf, size_t cap);
/* weft-train's options for running k as o describes (--validate, --measure) */
void plan_train_opts(const plan_opts *o, const plan_config *k, train_opts *t);
/* Sums a run's per-(dim, kind) accounting into (rep, shard, tp) rows. */
void plan_measured_rows(const train_result *r, double bytes[3][WEFT_COLL_KIND_COUNT],
                        double calls[3][WEFT_COLL_KIND_COUNT], double secs[3]);
void plan_fmt_bytes(double b, char *buf, size_t cap);
/* The most nodes one group of a dim (size n, world-rank stride `stride`)
 * spans when nodes hold gpn consecutive world ranks; 1: inside a node. */
int plan_group_nodes(int stride, int n, int world, int gpn);

/* ------------------------------------------------------------- probe.c */

/* What the probe measured (the same on every rank after it returns). */
typedef struct plan_probe {
  int nodes, gpn;                /* weft_node_count, ranks per node */
  double intra_lat, inter_lat;   /* s per message step, back-to-back all-reduces (0: no link) */
  double intra_clat, inter_clat; /* the same for an all-reduce right after a GEMM */
  double intra_bw, inter_bw;     /* bus bytes/s per rank, all-gather, every rank at once */
  double intra_rbw, inter_rbw;   /* the same for all-reduce */
  double flops;                  /* GEMM FLOP/s per rank, every rank at once */
  double mem_bw;                 /* element-wise bytes/s per rank, every rank at once */
  double overlap;                /* fraction of a collective hidden under a GEMM */
  int nkern;                     /* kernel times per (batch / dp, tp) of this world */
  plan_kernel_time kern[PLAN_MAX_KERN];
  double adamw_rate;   /* AdamW elements per second per rank, every rank at once */
  int64_t kmodel[6];   /* the kernels' model: dim, heads, kv heads, ffn, vocab, seq */
  double model_step_s; /* the whole model's forward + backward at tp 1, one rank's mesh */
  double framework;    /* model_step_s - the kernels' time at those shapes (s, >= 0) */
  int64_t gemm_m, gemm_n, gemm_k; /* the GEMM timed */
  int ncoll;                      /* collectives per group placement of this world */
  plan_coll_fit coll[PLAN_MAX_COLL];
  double seconds; /* the probe's wall time */
} plan_probe;

/* Measures the links and the compute rate of this world. Collective over
 * MPI_COMM_WORLD (weft_init has run); every rank gets the same numbers.
 * Takes a few seconds. Returns 0, or non-zero on every rank with rank 0
 * having printed the reason (ranks per node differ between nodes). */
int plan_probe_run(const plan_opts *o, plan_probe *p);
void plan_probe_print(const plan_probe *p);
/* kernels_probe.c: fills p->kern for every (batch / dp, tp) of this world
 * and p->adamw_rate. Collective over MPI_COMM_WORLD; -1 on every rank on
 * failure. */
int plan_probe_kernels(const plan_opts *o, int world, plan_probe *p);
/* probe.c: fills p->coll: for every group placement that a dim of a
 * factorisation of this world has (both layouts), all-gather,
 * reduce-scatter and all-reduce at two payloads on that factorisation's
 * mesh, every group at once. Collective over MPI_COMM_WORLD; -1 on every
 * rank on failure. */
int plan_probe_collectives(const plan_opts *o, int world, plan_probe *p);
/* probe.c: monotonic seconds; n pseudo-random floats in [-scale/2, scale/2)
 * from seed (the probes' inputs, never zeros). Local. */
double plan_now(void);
void plan_fill(float *x, int64_t n, uint32_t seed, float scale);
/* plan.c: the size of each dim (rep, shard, tp) of k and its stride in
 * world ranks (tp innermost, or outermost when k->across). */
void plan_dim_layout(const plan_config *k, int size[3], int stride[3]);
/* The fit for groups of n ranks spanning `spans` nodes, or NULL. */
const plan_coll_fit *plan_coll_find(const cluster *c, int n, int spans);
/* p as a JSON object (the caller owns it; NULL when out of memory). */
typedef struct cJSON cJSON;
cJSON *plan_probe_to_json(const plan_probe *p);
/* Prints j to path and deletes j (NULL j: fails). 0 or -1. Local. */
int plan_json_write(const char *path, cJSON *j);
/* --probe-out: writes p as JSON; 0 or -1 with err filled. Local. */
int plan_probe_save(const char *path, const plan_probe *p, char *err, size_t cap);
/* --calibrate: reads a file plan_probe_save wrote; 0 or -1 with err filled
 * (missing file, not JSON, a missing or non-positive field, named). */
int plan_probe_load(const char *path, plan_probe *p, char *err, size_t cap);
/* The cluster the probe describes (nodes, gpn, links, flops, overlap; the
 * kernel times only when m is the model they were probed for). */
void plan_probe_apply(const plan_probe *p, const weft_llama_config *m, cluster *c);

/* ----------------------------------------------------------- measure.c */

/* --measure: probe, predict, run every factorisation, report. Collective
 * over the world. Returns the exit code (0 ok). */
int plan_measure(const plan_opts *o);

/* stats.c: plan_ranks, plan_spearman */
#include "stats.h"

#endif
