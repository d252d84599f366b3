/* weft-plan: mesh-topology experiments. For a model, a global batch and a
 * cluster, enumerates every factorisation of the world into
 * dp_replicate x dp_shard x tp and predicts, per rank, memory (parameters,
 * gradients, optimizer state, FSDP's unsharded buffers, activations) and,
 * per step, communication (bytes, calls and time per mesh dim) from the
 * collectives FSDP and TP issue, then a step time; prints them ranked.
 *
 *     weft-plan --model llama70b --nodes 128 --gpus-per-node 8 --batch 1024
 *     mpiexec -n 4 weft-plan --validate          # runs the fitting meshes here
 *
 * --validate runs weft-train's very step (examples/train/, linked
 * in) on every factorisation that fits this world and compares: predicted
 * communication bytes must equal the measured accounting exactly (per mesh
 * dim and collective), predicted memory within 10% of the measured peak.
 *
 * The model of a step (per micro-batch; N = B/dp * T tokens on a rank, t =
 * tp, S = dp_shard, R = dp_replicate, f32 activations, payloads as mesh.h
 * counts them: all-gather output, reduce-scatter input, all-reduce buffer):
 *   TP without sequence parallel (torchtitan's plan, tp.h):
 *     forward  all-reduce N*D: tok_embeddings (rowwise) + 2 per block (wo, w2)
 *     backward all-reduce N*D: 2 per block (the colwise inputs' grads),
 *              all-reduce D for each norm weight grad (2 per block + final)
 *   TP with sequence parallel:
 *     forward  reduce-scatter N*D: embeddings + wo, w2 per block; all-gather
 *              N*D: attention and feed-forward inputs per block + output's input
 *     backward the mirror (every all-gather becomes a reduce-scatter and the
 *              other way round) + the norm weight grads' all-reduces of D
 *   loss parallel: all-reduce (max) of N floats, two all-reduces (sum) of N
 *   (the target's logit, the sum of exponentials);
 *   without it: all-gather of the logits N*V.
 *   FSDP, per group (each block, [norm, output], the root = tok_embeddings):
 *     all-gather of the group's padded flat buffer (param dtype) in forward,
 *     again in backward for groups resharded after forward (not the root),
 *     reduce-scatter of the grads (reduce dtype) once per step, and with
 *     HSDP an all-reduce of the reduced shard over dp_replicate.
 *   grad clipping: one all-reduce of one double per (placement group,
 *     sharded mesh dim) (nn's clip_grad_norm).
 *
 * The memory model (per rank, at the step's peak): fp32 master params,
 * grads and AdamW's two moments over the local shard; FSDP's unsharded
 * buffers of the largest group; and what the op graph holds (models/llama
 * on nn's ops, f32, per local token): every op's output of the forward
 * (kept until the next step), the grads of one block's backward (the
 * graph's pool keys buffers by shape and placement, so each block's
 * backward reuses the previous one's), one pool buffer per distinct
 * weight-grad shape, and TP's redistributed copies (the tp/ hooks' moves
 * of Partial outputs and SP's gathered inputs). No term is fitted to
 * measured bytes: each counts buffers (plan_predict says which); the
 * pool keeps its buffers across steps, so its whole size counts at the
 * peak.
 *
 * The time model (per step, per rank; every input is either the cluster's
 * -- a preset, flags, or what the probe measured: --measure, --calibrate --
 * or derived from the model's shape; nothing is fitted to measured steps):
 *   layout    world ranks fill nodes in order (gpn per node). Ranks are
 *             (rep, shard, tp) row-major, tp innermost ("tp inside"), or
 *             (tp, rep, shard), tp outermost ("tp across", weft-train's
 *             --tp-across-nodes). A dim's groups use the intra-node link
 *             iff each group's ranks all lie on one node (plan_group_nodes),
 *             else the inter-node link; a group with m ranks on each of
 *             its nodes gets m x the probed per-rank inter-node rate (one
 *             ring stream per group leaves a node, and the node's link is
 *             shared by the gpn / m groups on it; the probe measures
 *             gpn streams at once).
 *   comm      probed (--measure, --calibrate with a probe of this world):
 *             each call's time read off the probe's curve for its kind,
 *             payload and the dim's placement (group size, nodes spanned),
 *             measured on that very placement with every group of the dim
 *             at once, so the algorithm MPICH picks and the link sharing
 *             are in it (plan_coll_time). The probe's calls start together
 *             (a barrier before each batch), as a step's blocking calls
 *             across nodes do (mesh's presync). The probe has two curves: calls
 *             back to back, and each call right after ~1 ms of compute. A
 *             link rests between its collectives while the rank computes
 *             or uses the other link kind, and a shaped link (tbf) saves
 *             up a burst while it rests: on 2 emulated nodes x 1 rank at
 *             1 Gbit/s a 256 KiB all-gather took 1.07 ms back to back and
 *             0.23 ms after the gap. A dim's calls are read off the
 *             back-to-back curve moved towards the after-gap one by
 *             (rest per call on its link) / (the probe's gap), at most all
 *             the way; the rest is the compute plus the other link kind's
 *             comm, shared by the link's calls. A blocking call (TP's,
 *             HSDP's all-reduce) of at least WEFT_PRESYNC_BYTES on groups
 *             that span nodes and hold every rank of them adds mesh's
 *             presync barrier: inter-node latency x ceil(log2 n). Else (a
 *             preset cluster, flags) the link model:
 *             per dim and collective kind: bus bytes / bandwidth + calls *
 *             latency * ceil(log2 n). Bus bytes as mesh.h counts them
 *             (all-gather and reduce-scatter payload (n-1)/n, all-reduce
 *             2 payload (n-1)/n); bandwidth per rank with every rank of a
 *             node communicating at once (the node's link is shared), the
 *             all-gather rate for all-gathers and the all-reduce rate for
 *             reductions (MPICH's reduce-scatter + all-gather all-reduce
 *             also pays the reduction); latency per message step of a
 *             small all-reduce (MPICH's recursive doubling: log2 n steps).
 *   compute   with probed kernels (--measure, or --calibrate with a probe of
 *             the same model): per micro-batch L x (one block's forward +
 *             backward) + the head's, timed through the weft CPU kernels at
 *             the factorisation's rank-local shapes with every rank busy,
 *             plus the framework's cost (the whole model's step at tp 1
 *             through nn/ on a 1-rank mesh, minus its kernels: autograd,
 *             DTensor, allocation); then AdamW over the local shard at the
 *             probed AdamW rate and FSDP's copies in and out of its flat
 *             buffers at the probed element-wise rate. Without them:
 *             6 x params x tokens + 12 L D T^2 B (attention) FLOPs at the
 *             cluster's FLOP rate, plus the element-wise traffic of the
 *             norms, residuals, RoPE, SwiGLU, loss, optimizer and FSDP
 *             copies (floats moved per token, x3 for backward) at its
 *             element-wise rate (0: not counted).
 *   overlap   dp_shard's collectives (prefetched all-gathers, async
 *             reduce-scatters) are in flight while the rank waits in TP's
 *             (MPI progresses every outstanding request in any wait). Shared
 *             memory moves data with the CPU inside MPI calls; the network
 *             moves it on its own. So intra-node dp_shard comm hides under
 *             inter-node TP comm (under_tp = min(the two); the CPU is free
 *             while TP waits on the network) and not under compute, and
 *             inter-node dp_shard comm hides under compute up to the
 *             cluster's overlap factor (measured on the network) and not
 *             under intra-node TP waits (the CPU moves TP's data then).
 *             HSDP's all-reduce over dp_replicate is blocking; FSDP posts
 *             the next group's reduce-scatter before it, so intra-node
 *             reduce-scatters hide under inter-node all-reduces:
 *             under_rep = min(dp_shard reduce-scatter time, dp_rep comm).
 *             step = compute + tp comm + fsdp comm -
 *             min(dp_shard comm, under_tp + under_rep) -
 *             overlap * min(inter-node dp_shard comm, compute). Presets
 *             assume 1 (GPUs with copy engines); the probe measures it (an
 *             async all-gather under GEMMs: with MPI's rendezvous nothing
 *             moves until a wait, with eager TCP most does); --overlap
 *             overrides it. TP's collectives are on the critical path.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "plan.h"

const char *const PLAN_DIM_NAMES[3] = {"dp_replicate", "dp_shard", "tp"};

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* torch.chunk: rows of chunk 0 (the largest) of n split k ways. */
static int64_t chunk0(int64_t n, int64_t k) { return cdiv(n, k); }

/* A parameter's tp-local shape (rank 0, the largest shard). */
typedef struct pshape {
  int64_t rows, cols;
} pshape;

/* tp placement of each parameter in torchtitan's plan: 0 replicate,
 * 1 Shard(0), 2 Shard(1). */
static pshape tp_local(int64_t r, int64_t c, int how, int t) {
  pshape p = {r, c};
  if (how == 1) p.rows = chunk0(r, t);
  if (how == 2) p.cols = chunk0(c, t);
  return p;
}

/* FSDP group sizes: tp-local numel and padded per-rank numel. */
typedef struct group {
  double numel, padded;
} group;

static void add_param(group *g, pshape p, int S) {
  g->numel += (double)p.rows * (double)p.cols;
  g->padded += (double)chunk0(p.rows, S) * (double)p.cols;
}

int64_t plan_presync_bytes(void) {
  if (weft_is_initialized()) return weft_get_settings()->presync_bytes;
  weft_settings s;
  weft_read_settings(&s); /* a bad value leaves mesh's default */
  return s.presync_bytes;
}

void plan_predict(const plan_opts *o, plan_config *k) {
  const weft_llama_config *m = &o->m;
  int t = k->tp, S = k->shard, R = k->rep;
  int dp = S * R;
  int64_t D = m->dim, F = m->ffn_dim, V = m->vocab, T = m->max_seq_len, L = m->n_layers;
  int64_t hd = D / m->n_heads, H = m->n_heads, Hk = m->n_kv_heads;
  memset(k->bytes, 0, sizeof k->bytes);
  memset(k->calls, 0, sizeof k->calls);
  k->valid = true;
  k->why[0] = 0;
  if (t > 1 && (H % t || Hk % t)) {
    k->valid = false;
    snprintf(k->why, sizeof k->why, "heads %lld/%lld not divisible by tp", (long long)H,
             (long long)Hk);
  } else if (o->batch % dp) {
    k->valid = false;
    snprintf(k->why, sizeof k->why, "batch %lld not divisible by dp %d", (long long)o->batch, dp);
  } else if (o->sp && t > 1 && T % t) {
    k->valid = false;
    snprintf(k->why, sizeof k->why, "seq-len not divisible by tp (SP)");
  }
  double N = (double)(o->batch / (dp ? dp : 1)) * (double)T; /* tokens per rank per micro-batch */
  double acc = (double)o->grad_accum;
  /* --- parameters: tp-local shapes and FSDP groups */
  bool fsdp = dp > 1;
  int Sg = fsdp ? S : 1;
  group blk = {0, 0}, last = {0, 0}, root = {0, 0};
  pshape wq = tp_local(H * hd, D, 1, t), wk = tp_local(Hk * hd, D, 1, t),
         wo = tp_local(D, H * hd, 2, t);
  pshape w1 = tp_local(F, D, 1, t), w2 = tp_local(D, F, 2, t), nrm = {D, 1};
  add_param(&blk, nrm, Sg);
  add_param(&blk, wq, Sg);
  add_param(&blk, wk, Sg);
  add_param(&blk, wk, Sg);
  add_param(&blk, wo, Sg);
  add_param(&blk, nrm, Sg);
  add_param(&blk, w1, Sg);
  add_param(&blk, w2, Sg);
  add_param(&blk, w1, Sg);
  add_param(&last, nrm, Sg);
  add_param(&last, tp_local(V, D, 1, t), Sg);
  add_param(&root, tp_local(V, D, 1, t), Sg);
  double local_numel = L * blk.numel + last.numel + root.numel; /* tp-local */
  double shard_numel = fsdp ? (L * blk.padded + last.padded + root.padded) : local_numel;
  /* memory: fp32 master params and grads, AdamW exp_avg + exp_avg_sq */
  double pdt = o->bf16 ? 2 : 4, rdt = 4;
  k->m_params = 4 * shard_numel;
  k->m_grads = 4 * shard_numel;
  k->m_optim = 8 * shard_numel;
  /* FSDP's unsharded buffers at the step's peak (the backward of the
   * largest group): its all-gather buffer and unsharded f32 params, its
   * unsharded grads and reduce-scatter buffer (checked against the
   * allocator's peak with --validate) */
  double gmax = blk.numel > last.numel ? blk.numel : last.numel;
  double gpad = blk.padded > last.padded ? blk.padded : last.padded;
  k->m_unsharded = fsdp ? (gpad * S * pdt + 4 * gmax) + (gpad * S * rdt + 4 * gmax) : 0;
  /* activations: what the op graph (models/llama on nn's ops) holds at
   * the step's peak, per rank, f32, in floats per local token (see the
   * head comment's memory model); s = t for what sequence parallel shards */
  double s = (o->sp && t > 1) ? t : 1;
  double Dd = (double)D, Fd = (double)F, Vd = (double)V, Hd = (double)H, Hkd = (double)Hk;
  /* forward, kept until the next step: per block the two norms' outputs
   * and rstd, the two residual adds, wo's and w2's outputs (Partial under
   * TP, before the moves below), wq/wk/wv's outputs, RoPE'd q and k, the
   * attention's output and log-sum-exp, w1/w3's outputs and SwiGLU's */
  double fwd_block =
      4.0 * Dd / s + 2.0 * Dd + 2.0 / s + 3.0 * (Hd + Hkd) * hd / t + Hd / t + 3.0 * Fd / t;
  /* the head: the embedding's output, the final norm's (and rstd), logits */
  double fwd_head = Dd + Dd / s + 1.0 / s + Vd / t;
  /* TP's moves (the tp/ hooks' redistributed copies, outside the graph's
   * pool): Partial -> Replicate of the embedding's, wo's and w2's outputs,
   * or with SP their reduce-scatters plus the all-gathered inputs of
   * attention, feed-forward and output; without loss parallel the
   * gathered logits; and one grad being moved back in backward */
  double moves = 0;
  if (t > 1) {
    moves = o->sp ? 2.0 * L * Dd + (1.0 + 2.0 * L) * Dd / t + Dd : (1.0 + 2.0 * L) * Dd;
    if (!o->lp) moves += Vd;
    moves += Dd;
  }
  /* backward: the pool's buffers are keyed by shape and placement, and
   * every block's grads have the same keys, so one block's grads stay
   * allocated (each key at its most in flight): SwiGLU's output grad and
   * its two input grads; the attention's output grad, dq, dk, dv and one
   * RoPE'd grad (the other reuses the buffer sdpa's dq or dk left); the
   * residual stream's: the grad in, shared by the residual add, and their
   * sum. Under TP the colwise inputs' grads arrive Partial, a key of its
   * own: two more; under SP the norms' grads are sequence shards (three)
   * beside the Partial ones (two) and the gathered input's (one); these
   * residual counts are read off the pool's keys after a step (weft-train
   * demo, tiny). Without loss parallel: the gathered logits' grad. */
  double resid = t == 1 ? 2.0 * Dd : (o->sp ? 3.0 * Dd + 3.0 * Dd / t : 4.0 * Dd);
  double bwd = 3.0 * Fd / t + (2.0 * Hd + 3.0 * Hkd) * hd / t + resid + (t > 1 && !o->lp ? Vd : 0);
  /* each weight's grad is computed into a pool buffer and added into the
   * parameter's: one buffer per distinct (shape, placement) of wq, wk
   * (= wv), wo, w1 (= w3), w2, output and tok_embeddings (both Shard(0)
   * under TP), with the norm weights' (Partial and Replicate under TP) */
  struct {
    int64_t r, c;
    int how;
  } wkey[6] = {{H * hd, D, 1}, {Hk * hd, D, 1}, {D, H * hd, 2}, {F, D, 1}, {D, F, 2}, {V, D, 1}};
  double wtemp = (t > 1 ? 2.0 : 1.0) * Dd;
  for (int i = 0; i < 6; i++) {
    bool seen = false;
    for (int j = 0; j < i; j++)
      seen = seen || (wkey[j].r == wkey[i].r && wkey[j].c == wkey[i].c &&
                      (t == 1 || wkey[j].how == wkey[i].how));
    if (seen) continue;
    pshape w = tp_local(wkey[i].r, wkey[i].c, wkey[i].how, t);
    wtemp += (double)w.rows * (double)w.cols;
  }
  double act = 4.0 * N * ((double)L * fwd_block + fwd_head + moves + bwd) + 4.0 * wtemp;
  k->m_act = act;
  k->m_total = k->m_params + k->m_grads + k->m_optim + k->m_unsharded + k->m_act;
  k->fits = k->m_total <= o->c.mem;

  /* --- communication per step */
  enum { AG = WEFT_COLL_ALL_GATHER, RS = WEFT_COLL_REDUCE_SCATTER, AR = WEFT_COLL_ALL_REDUCE };
  /* the probed collectives of each dim's placement, if every kind is */
  int size[3], stride[3];
  plan_dim_layout(k, size, stride);
  int spans[3]; /* nodes each dim's groups span */
  for (int d = 0; d < 3; d++) spans[d] = plan_group_nodes(stride[d], size[d], R * S * t, o->c.gpn);
  const plan_coll_fit *fit[3];
  double t_fit[3] = {0, 0, 0}, t_fit_gap[3] = {0, 0, 0}; /* back to back, after a gap */
  double t_fit_rs[3] = {0, 0, 0};                        /* reduce-scatters' share */
  double presync_calls[3] = {0, 0, 0};                   /* calls of at least WEFT_PRESYNC_BYTES */
  double presync_min = (double)plan_presync_bytes();
  for (int d = 0; d < 3; d++)
    fit[d] = size[d] > 1 ? plan_coll_find(&o->c, size[d], spans[d]) : NULL;
#define ADD(dim, kind, n, b)                                                           \
  do {                                                                                 \
    k->calls[dim][kind] += (n);                                                        \
    k->bytes[dim][kind] += (n) * (b);                                                  \
    if (presync_min > 0 && (b) >= presync_min) presync_calls[dim] += (n);              \
    if (fit[dim]) {                                                                    \
      t_fit[dim] += (n)*plan_coll_time(fit[dim], kind, (b), false);                    \
      t_fit_gap[dim] += (n)*plan_coll_time(fit[dim], kind, (b), true);                 \
      if ((kind) == RS) t_fit_rs[dim] += (n)*plan_coll_time(fit[dim], RS, (b), false); \
    }                                                                                  \
  } while (0)
  if (t > 1) {
    double ND = 4 * N * D;
    if (!o->sp) {
      ADD(2, AR, acc * (1 + 2 * L), ND); /* forward */
      ADD(2, AR, acc * (2 * L + 1), ND); /* backward (+ the final norm's input grad) */
    } else {
      ADD(2, RS, acc * (1 + 2 * L), ND);
      ADD(2, AG, acc * (2 * L + 1), ND);
      ADD(2, AG, acc * (1 + 2 * L), ND);
      ADD(2, RS, acc * (2 * L + 1), ND);
    }
    ADD(2, AR, acc * (2 * L + 1), 4.0 * D); /* norm weight grads */
    if (o->lp) {
      ADD(2, AR, 3 * acc, 4 * N); /* max, target logit, sum of exponentials */
    } else {
      ADD(2, AG, acc, 4 * N * V);
    }
  }
  if (fsdp) {
    int sd = 1; /* shard dim row */
    group gs[3] = {blk, last, root};
    double cnt[3] = {(double)L, 1, 1};
    for (int g = 0; g < 3; g++) {
      double ag = gs[g].padded * S * pdt;
      bool is_root = g == 2;
      bool raf = !is_root && o->raf != 0;
      ADD(sd, AG, cnt[g] * acc, ag);                        /* forward */
      if (raf && o->raf < 2) ADD(sd, AG, cnt[g] * acc, ag); /* backward re-gather */
      ADD(sd, RS, cnt[g], gs[g].padded * S * rdt);
      if (R > 1) ADD(0, AR, cnt[g], gs[g].padded * rdt);
    }
  }
  /* clip_grad_norm: one double per (placement group, sharded dim) */
  if (fsdp && t > 1) {
    if (S > 1) ADD(1, AR, 2, 8);
    ADD(2, AR, 1, 8);
  } else if (fsdp) {
    if (S > 1) ADD(1, AR, 1, 8);
  } else if (t > 1) {
    ADD(2, AR, 1, 8);
  }
#undef ADD
  /* --- time (the head comment's "time model") */
  int world = R * S * t;
  double comp_flops =
      6.0 * (double)(L * blk.numel * t + last.numel * t) * (double)o->batch * T * acc +
      12.0 * L * D * (double)T * (double)o->batch * T * acc;
  k->t_gemm = comp_flops / ((double)world * o->c.flops);
  k->probed = false;
  for (int i = 0; i < o->c.nkern; i++)
    if (o->c.kern[i].tp == t && o->c.kern[i].batch_local == o->batch / (dp ? dp : 1)) {
      k->t_gemm = acc * (L * o->c.kern[i].block_s + o->c.kern[i].head_s + o->c.framework);
      k->probed = true;
    }
  /* element-wise work: floats moved per local token per block (forward;
   * backward twice that), the loss and embedding, AdamW + clipping +
   * zero_grad over the local shard, FSDP's copies in and out of its
   * collective buffers */
  double per_block = 10.0 * D / s + 2.0 * (double)(H + Hk) * hd / t + 3.0 * F / t;
  double elem = 4.0 * N * acc * (3.0 * L * per_block + 3.0 * (double)V / t + 2.0 * D) +
                4.0 * 9.0 * shard_numel + 2.0 * (k->bytes[1][AG] + k->bytes[1][RS]);
  if (k->probed) /* the kernels are in t_gemm: AdamW and FSDP's copies remain */
    elem = 4.0 * 2.0 * shard_numel + 2.0 * (k->bytes[1][AG] + k->bytes[1][RS]);
  k->t_elem = o->c.mem_bw > 0 ? elem / o->c.mem_bw : 0;
  if (k->probed && o->c.adamw_rate > 0) k->t_elem += shard_numel / o->c.adamw_rate;
  k->t_compute = k->t_gemm + k->t_elem;
  bool probed_dim[3] = {false, false, false};
  double rs_share[3] = {0, 0, 0}; /* of each dim's comm time */
  for (int d = 0; d < 3; d++) {
    int n = size[d];
    k->t_comm[d] = 0;
    k->intra[d] = spans[d] <= 1;
    if (n <= 1) continue;
    bool all_fit = fit[d] != NULL;
    for (int kind = 0; fit[d] && kind < WEFT_COLL_KIND_COUNT; kind++)
      if (k->calls[d][kind] > 0 && fit[d]->secs[kind][0] < 0) all_fit = false;
    if (all_fit) { /* probed on this very placement, call by call */
      k->t_comm[d] = t_fit[d];
      rs_share[d] = t_fit[d] > 0 ? t_fit_rs[d] / t_fit[d] : 0;
      probed_dim[d] = true;
      continue;
    }
    bool in = k->intra[d];
    double bw = in ? o->c.intra_bw : o->c.inter_bw, lat = in ? o->c.intra_lat : o->c.inter_lat;
    double rbw = in ? o->c.intra_rbw : o->c.inter_rbw;
    if (rbw <= 0) rbw = bw;
    /* a group with m = n / spans ranks on each of its nodes sends one
     * stream per node across (ring order, node-major); the node's link is
     * shared by the gpn / m groups of this dim on it, so each stream gets
     * m x the per-rank rate the probe measured with all gpn ranks sending */
    if (!in) {
      double m = (double)n / spans[d];
      bw *= m;
      rbw *= m;
    }
    double steps = ceil(log2((double)n));
    for (int kind = 0; kind < WEFT_COLL_KIND_COUNT; kind++) {
      double bus = k->bytes[d][kind] * (n - 1) / n * (kind == AR ? 2 : 1);
      double t_kind = bus / (kind == AG ? bw : rbw) + k->calls[d][kind] * lat * steps;
      k->t_comm[d] += t_kind;
      if (kind == RS) rs_share[d] = t_kind;
    }
    rs_share[d] = k->t_comm[d] > 0 ? rs_share[d] / k->t_comm[d] : 0;
  }
  /* Probed dims: a link rests between its collectives while the rank
   * computes or uses the other link kind; the call's time moves from the
   * back-to-back curve towards the after-gap one by the mean rest per call
   * over the probe's gap (linear, at most all the way) */
  double back_to_back[3] = {k->t_comm[0], k->t_comm[1], k->t_comm[2]};
  for (int d = 0; d < 3; d++) {
    if (!probed_dim[d] || fit[d]->gap <= 0) continue;
    double calls = 0, rest = k->t_compute;
    for (int e = 0; e < 3; e++) {
      if (size[e] <= 1) continue;
      for (int kind = 0; k->intra[e] == k->intra[d] && kind < WEFT_COLL_KIND_COUNT; kind++)
        calls += k->calls[e][kind];
      if (k->intra[e] != k->intra[d]) rest += back_to_back[e];
    }
    double w = calls > 0 ? fmin(1, rest / calls / fit[d]->gap) : 0;
    k->t_comm[d] = t_fit[d] + (t_fit_gap[d] - t_fit[d]) * w;
  }
  /* mesh's presync: a blocking call of at least WEFT_PRESYNC_BYTES on a
   * group that spans nodes and holds every rank of them first meets the
   * group in a barrier (mesh/collectives.c); TP's calls and HSDP's
   * all-reduce are blocking, FSDP's all-gathers and reduce-scatters are
   * not. A barrier costs the inter-node latency per message step times
   * ceil(log2 n) (the probe's latency is the median of many small calls,
   * steadier than its curves' smallest point). */
  for (int d = 0; d < 3; d += 2) {
    if (size[d] <= 1 || spans[d] <= 1 || size[d] / spans[d] != o->c.gpn) continue;
    double barrier = o->c.inter_lat * ceil(log2((double)size[d]));
    k->t_comm[d] += presync_calls[d] * barrier;
  }
  /* What hides FSDP's collectives (prefetched all-gathers, async
   * reduce-scatters; HSDP's all-reduce over dp_replicate is blocking,
   * fsdp/comm.c): MPI progresses every outstanding request in any wait,
   * but shared memory moves data with the CPU inside MPI calls, while the
   * network moves it on its own. So dp_shard's intra-node collectives hide
   * under TP's waits on the network (the CPU is free then), and not under
   * compute; dp_shard's inter-node ones hide under compute as far as the
   * probed overlap factor (measured on the network) says, and not under
   * TP's intra-node waits, where the CPU is busy moving TP's own data.
   * (2 nodes x 2 ranks at 1 Gbit/s with eager TCP: dp_shard=2 x tp=2 tp
   * inside was 28% faster than measured when its FSDP hid under both.) */
  double fsdp_t = k->t_comm[0] + k->t_comm[1];
  bool shard = size[1] > 1;
  bool shm_under_net = shard && size[2] > 1 && k->intra[1] && !k->intra[2];
  double under_tp = shm_under_net ? fmin(k->t_comm[1], k->t_comm[2]) : 0;
  /* HSDP finishes a group's reduction (its blocking all-reduce over
   * dp_replicate) after posting the next group's reduce-scatter
   * (fsdp/hooks.c), so intra-node reduce-scatters move during inter-node
   * all-reduce waits */
  double under_rep = shard && size[0] > 1 && k->intra[1] && !k->intra[0]
                         ? fmin(rs_share[1] * k->t_comm[1], k->t_comm[0])
                         : 0;
  double under_waits = fmin(k->t_comm[1], under_tp + under_rep);
  double on_net = shard && !k->intra[1] ? k->t_comm[1] : 0;
  double hidden = under_waits + o->c.overlap * fmin(on_net, k->t_compute);
  k->t_step = k->t_compute + k->t_comm[2] + fsdp_t - hidden;
}

void plan_dim_layout(const plan_config *k, int size[3], int stride[3]) {
  /* world rank order: (rep, shard, tp) row-major, tp innermost; across:
   * (tp, rep, shard), tp outermost */
  size[0] = k->rep;
  size[1] = k->shard;
  size[2] = k->tp;
  stride[0] = k->shard * k->tp;
  stride[1] = k->tp;
  stride[2] = 1;
  if (k->across) {
    stride[0] = k->shard;
    stride[1] = 1;
    stride[2] = k->rep * k->shard;
  }
}

double plan_coll_time(const plan_coll_fit *f, int kind, double payload, bool after_gap) {
  const double *x = f->bytes, *y = f->secs[kind];
  if (after_gap && f->gap > 0 && f->gap_secs[kind][0] >= 0) y = f->gap_secs[kind];
  if (y[0] < 0) return 0;
  if (payload <= x[0]) return y[0];
  int i = 1;
  while (i < PLAN_COLL_SIZES - 1 && payload > x[i]) i++;
  double t = y[i - 1] + (y[i] - y[i - 1]) * (payload - x[i - 1]) / (x[i] - x[i - 1]);
  return t > y[0] ? t : y[0];
}

const plan_coll_fit *plan_coll_find(const cluster *c, int n, int spans) {
  for (int i = 0; i < c->ncoll; i++)
    if (c->coll[i].n == n && c->coll[i].spans == spans) return &c->coll[i];
  return NULL;
}

int plan_group_nodes(int stride, int n, int world, int gpn) {
  if (n <= 1 || gpn <= 0) return 1;
  /* a group is {base + j * stride}; nodes hold gpn consecutive world ranks,
   * so its nodes are counted along its (increasing) ranks */
  int most = 1;
  for (int base = 0; base < world; base++) {
    if ((base / stride) % n) continue; /* each group once, from its first rank */
    int spans = 1;
    for (int j = 1; j < n; j++)
      spans += (base + j * stride) / gpn != (base + (j - 1) * stride) / gpn;
    if (spans > most) most = spans;
  }
  return most;
}

void plan_fmt_bytes(double b, char *buf, size_t cap) {
  const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int i = 0;
  while (b >= 1024 && i < 5) {
    b /= 1024;
    i++;
  }
  snprintf(buf, cap, i ? "%.1f%s" : "%.0f%s", b, u[i]);
}

static int cmp_cfg(const void *a, const void *b) {
  const plan_config *x = a, *y = b;
  if (x->valid != y->valid) return x->valid ? -1 : 1;
  if (x->fits != y->fits) return x->fits ? -1 : 1;
  return x->t_step < y->t_step ? -1 : x->t_step > y->t_step;
}

static bool preset(const char *name, weft_llama_config *c) {
  if (train_model_preset(name, c)) return true;
  weft_llama_config d = WEFT_LLAMA_CONFIG_INIT;
  if (!strcmp(name, "llama8b")) {
    d.dim = 4096;
    d.n_layers = 32;
    d.n_heads = 32;
    d.n_kv_heads = 8;
    d.ffn_dim = 14336;
    d.vocab = 128256;
    d.max_seq_len = 4096;
  } else if (!strcmp(name, "measure")) {
    /* sized for --measure on a few CPU ranks: a step of every factorisation
     * in ~0.1-1 s, FSDP's and TP's traffic of the same order */
    d.dim = 128;
    d.n_layers = 2;
    d.n_heads = 4;
    d.n_kv_heads = 4;
    d.ffn_dim = 352;
    d.vocab = 256;
    d.max_seq_len = 64;
  } else if (!strcmp(name, "llama70b")) {
    d.dim = 8192;
    d.n_layers = 80;
    d.n_heads = 64;
    d.n_kv_heads = 8;
    d.ffn_dim = 28672;
    d.vocab = 128256;
    d.max_seq_len = 4096;
  } else {
    return false;
  }
  *c = d;
  return true;
}

static bool cluster_preset(const char *name, cluster *c) {
  if (!strcmp(name, "h100-nvlink-ib")) {
    /* NVLink 4: ~450 GB/s bus bandwidth per GPU; one 400 Gb/s IB NIC per
     * GPU: ~50 GB/s; 80 GB HBM; ~400 TFLOP/s achievable bf16 (of 989) */
    *c = (cluster){.nodes = 16,
                   .gpn = 8,
                   .intra_bw = 450e9,
                   .inter_bw = 50e9,
                   .intra_lat = 3e-6,
                   .inter_lat = 10e-6,
                   .mem = 80e9,
                   .flops = 400e12,
                   .overlap = 1};
  } else if (!strcmp(name, "cpu-local")) {
    /* this kind of machine: ranks share memory, ~5 GB/s through MPICH
     * shared memory, ~1 us; 8 GiB per rank; ~50 GFLOP/s per rank */
    *c = (cluster){.nodes = 1,
                   .gpn = 4,
                   .intra_bw = 5e9,
                   .inter_bw = 5e9,
                   .intra_lat = 1e-6,
                   .inter_lat = 1e-6,
                   .mem = 8.0 * (1 << 30),
                   .flops = 50e9,
                   .overlap = 1};
  } else {
    return false;
  }
  return true;
}

static void help(void) {
  printf(
      "usage: weft-plan [flags]            (mpiexec -n N weft-plan --validate)\n"
      "Predicts per-rank memory and per-step communication and time for every\n"
      "factorisation of the world into dp_replicate x dp_shard x tp, ranked.\n"
      "model\n"
      "  --model NAME       demo (default), tiny, small, measure (D=128 L=2 F=352 V=256\n"
      "                     T=64, for --measure), llama8b, llama70b\n"
      "  --dim --layers --heads --kv-heads --ffn-dim --vocab --seq-len   override the preset\n"
      "  --batch B          global batch in sequences (default 8)\n"
      "  --grad-accum K     micro-batches per step (1)\n"
      "  --sequence-parallel, --no-loss-parallel, --dtype fp32|bf16 (bf16 FSDP all-gathers)\n"
      "  --reshard-after-forward=true|false   FSDP for blocks and [norm, output] (true)\n"
      "cluster (a preset, then flags override it)\n"
      "  --cluster NAME     h100-nvlink-ib (16 x 8, default) or cpu-local (1 x 4)\n"
      "  --nodes N --gpus-per-node G\n"
      "  --intra-bw GB/s --inter-bw GB/s --intra-lat us --inter-lat us\n"
      "  --mem GiB          per-device memory\n"
      "  --tflops X         achievable per-device FLOP rate\n"
      "  --tp-across-nodes  also consider tp groups that span nodes\n"
      "output\n"
      "  --top N            print the best N (default 30; 0 = all)\n"
      "  --validate         run weft-train's step on every factorisation of this\n"
      "                     world (mpiexec -n) and compare predicted and measured\n"
      "                     comm bytes (exact) and memory (within 10%%)\n"
      "  --steps N          steps per run (--validate 3, --measure 4; the first is warm-up)\n"
      "measure (mpiexec -n N weft-plan --measure; nodes from the host names)\n"
      "  --measure          probe the links and the compute, predict every factorisation\n"
      "                     of this world (tp > 1 with dp > 1 in both layouts: tp inside\n"
      "                     nodes, tp across), run each with weft-train's step and report\n"
      "                     predicted vs measured step time, ranks, Spearman, comm bytes\n"
      "  --probe            only the probe: print it and exit\n"
      "  --probe-out FILE   write the probe as JSON (with --probe or --measure)\n"
      "  --calibrate FILE   predict for the probed cluster without running (a JSON\n"
      "                     from --probe-out; --nodes/--gpus-per-node override its shape)\n"
      "  --overlap X        fraction of FSDP comm hidden under compute, 0..1 (overrides\n"
      "                     the preset's or the probe's)\n"
      "  --repeat N         --measure: N rounds over every factorisation in turn, the\n"
      "                     median of the runs' median step times (1; at most 15)\n"
      "  --svg FILE         --measure: scatter of predicted vs measured step time\n"
      "  --json FILE        --measure: the numbers as JSON\n"
      "  --help\n");
}

static int bad(const char *fmt, const char *a) {
  fprintf(stderr, "weft-plan: error: ");
  fprintf(stderr, fmt, a);
  fprintf(stderr, "\n");
  return 2;
}

static int parse(int argc, char **argv, plan_opts *o) {
  memset(o, 0, sizeof *o);
  preset("demo", &o->m);
  snprintf(o->model_name, sizeof o->model_name, "demo");
  cluster_preset("h100-nvlink-ib", &o->c);
  o->batch = 8;
  o->grad_accum = 1;
  o->lp = true;
  o->raf = 1;
  o->top = 30;
  o->steps = 3;
  int64_t ov[7] = {-1, -1, -1, -1, -1, -1, -1};
  static const char *const ovn[7] = {"--dim",     "--layers", "--heads",  "--kv-heads",
                                     "--ffn-dim", "--vocab",  "--seq-len"};
  const char *mp = NULL, *cp = NULL;
  double cov[8];
  bool has[8] = {0};
  static const char *const covn[8] = {"--nodes",     "--gpus-per-node", "--intra-bw", "--inter-bw",
                                      "--intra-lat", "--inter-lat",     "--mem",      "--tflops"};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      help();
      return 1;
    }
    if (!strcmp(a, "--sequence-parallel")) {
      o->sp = true;
      continue;
    }
    if (!strcmp(a, "--no-loss-parallel")) {
      o->lp = false;
      continue;
    }
    if (!strcmp(a, "--tp-across-nodes")) {
      o->tp_across = true;
      continue;
    }
    if (!strcmp(a, "--validate")) {
      o->validate = true;
      continue;
    }
    if (!strcmp(a, "--measure")) {
      o->measure = true;
      continue;
    }
    if (!strcmp(a, "--probe")) {
      o->probe = true;
      continue;
    }
    if (!strcmp(a, "--reshard-after-forward=false")) {
      o->raf = 0;
      continue;
    }
    if (!strcmp(a, "--reshard-after-forward") || !strcmp(a, "--reshard-after-forward=true")) {
      o->raf = 1;
      continue;
    }
    if (i + 1 >= argc || strncmp(a, "--", 2))
      return bad("unknown flag or missing value: '%s' (see --help)", a);
    const char *v = argv[++i];
    char *end = NULL;
    double x = strtod(v, &end);
    bool num = end && !*end && *v;
    bool done = false;
    for (int k = 0; k < 7; k++)
      if (!strcmp(a, ovn[k])) {
        if (!num || x < 1 || x != floor(x)) return bad("want an integer >= 1 after %s", a);
        ov[k] = (int64_t)x;
        done = true;
      }
    for (int k = 0; k < 8; k++)
      if (!strcmp(a, covn[k])) {
        if (!num || x <= 0) return bad("want a number > 0 after %s", a);
        cov[k] = x;
        has[k] = true;
        done = true;
      }
    if (done) continue;
    if (!strcmp(a, "--model")) {
      mp = v;
      continue;
    }
    const char **files[4] = {&o->probe_out, &o->calibrate, &o->svg, &o->json};
    static const char *const filen[4] = {"--probe-out", "--calibrate", "--svg", "--json"};
    for (int k = 0; k < 4; k++)
      if (!strcmp(a, filen[k])) {
        if (!*v) return bad("%s wants a file name", a);
        *files[k] = v;
        done = true;
      }
    if (done) continue;
    if (!strcmp(a, "--repeat")) {
      if (!num || x < 1 || x > PLAN_MAX_REPEAT || x != floor(x))
        return bad("want an integer in [1, 15] after %s", a);
      o->repeat = (int)x;
      continue;
    }
    if (!strcmp(a, "--overlap")) {
      if (!num || x < 0 || x > 1) return bad("want a number in [0, 1] after %s", a);
      o->has_overlap = true;
      o->overlap_flag = x;
      continue;
    }
    if (!strcmp(a, "--cluster")) {
      cp = v;
      continue;
    }
    if (!strcmp(a, "--dtype")) {
      if (!strcmp(v, "bf16"))
        o->bf16 = true;
      else if (!strcmp(v, "fp32"))
        o->bf16 = false;
      else
        return bad("--dtype: want fp32 or bf16, not '%s'", v);
      continue;
    }
    if (!strcmp(a, "--batch") || !strcmp(a, "--grad-accum") || !strcmp(a, "--top") ||
        !strcmp(a, "--steps")) {
      if (!num || x < 0 || x != floor(x)) return bad("want an integer after %s", a);
      if (!strcmp(a, "--batch"))
        o->batch = (int64_t)x;
      else if (!strcmp(a, "--grad-accum"))
        o->grad_accum = (int64_t)x;
      else if (!strcmp(a, "--top"))
        o->top = (int)x;
      else {
        o->steps = (int64_t)x;
        o->steps_given = true;
      }
      if (o->steps < 1 || o->batch < 1 || o->grad_accum < 1) return bad("%s must be >= 1", a);
      continue;
    }
    return bad("unknown flag '%s' (see --help)", a);
  }
  if (mp) {
    if (!preset(mp, &o->m))
      return bad("--model: unknown preset '%s' (demo, tiny, small, measure, llama8b, llama70b)",
                 mp);
    snprintf(o->model_name, sizeof o->model_name, "%s", mp);
  }
  if (cp && !cluster_preset(cp, &o->c))
    return bad("--cluster: unknown preset '%s' (h100-nvlink-ib, cpu-local)", cp);
  if (o->calibrate && (o->measure || o->probe || o->validate))
    return bad(
        "%s: --calibrate predicts without running; it does not go with --measure, "
        "--probe or --validate",
        o->calibrate);
  if (o->repeat && !o->measure) return bad("%s wants --measure", "--repeat");
  if ((o->svg || o->json) && !o->measure)
    return bad("%s wants --measure", o->svg ? "--svg" : "--json");
  if (o->probe_out && !o->probe && !o->measure)
    return bad("%s wants --probe or --measure", "--probe-out");
  int64_t *f[7] = {&o->m.dim,     &o->m.n_layers, &o->m.n_heads,    &o->m.n_kv_heads,
                   &o->m.ffn_dim, &o->m.vocab,    &o->m.max_seq_len};
  for (int k = 0; k < 7; k++)
    if (ov[k] > 0) {
      *f[k] = ov[k];
      snprintf(o->model_name, sizeof o->model_name, "custom");
    }
  if (ov[2] > 0 && ov[3] < 0) o->m.n_kv_heads = o->m.n_heads;
  if (weft_llama_config_validate(&o->m) != WEFT_OK) return bad("model: %s", weft_last_error());
  if (o->calibrate) {
    plan_probe pr;
    char err[512];
    if (plan_probe_load(o->calibrate, &pr, err, sizeof err)) return bad("%s", err);
    plan_probe_apply(&pr, &o->m, &o->c);
  }
  if (has[0]) o->c.nodes = (int)cov[0];
  if (has[1]) o->c.gpn = (int)cov[1];
  if (has[2]) o->c.intra_bw = cov[2] * 1e9;
  if (has[3]) o->c.inter_bw = cov[3] * 1e9;
  if (has[4]) o->c.intra_lat = cov[4] * 1e-6;
  if (has[5]) o->c.inter_lat = cov[5] * 1e-6;
  if (has[6]) o->c.mem = cov[6] * (double)(1 << 30);
  if (has[7]) o->c.flops = cov[7] * 1e12;
  if (o->has_overlap) o->c.overlap = o->overlap_flag;
  if (o->calibrate && o->c.nodes > 1 && !(o->c.inter_bw > 0))
    return bad(
        "--calibrate: '%s' has no inter-node link (probed on one node); give --inter-bw "
        "and --inter-lat or probe on several nodes",
        o->calibrate);
  if (o->calibrate && o->c.gpn > 1 && !(o->c.intra_bw > 0))
    return bad(
        "--calibrate: '%s' has no intra-node link (probed with one rank per node); give "
        "--intra-bw and --intra-lat",
        o->calibrate);
  if (!o->steps_given) o->steps = o->measure ? 4 : 3;
  if (o->measure && o->steps < 2)
    return bad("%s", "--measure wants --steps >= 2 (the first is warm-up)");
  return 0;
}

int plan_enumerate(const plan_opts *o, int world, bool both_layouts, plan_config **out) {
  int cap = 64, n = 0;
  plan_config *v = malloc(sizeof *v * (size_t)cap);
  for (int t = 1; v && t <= world; t++) {
    if (world % t) continue;
    if (!o->tp_across && t > o->c.gpn) continue;
    if (!o->tp_across && o->c.gpn % t) continue;
    int dp = world / t;
    for (int r = 1; v && r <= dp; r++) {
      if (dp % r) continue;
      for (int lay = 0; lay < (both_layouts && t > 1 && dp > 1 ? 2 : 1); lay++) {
        if (n == cap) {
          plan_config *w = realloc(v, sizeof *v * (size_t)(cap *= 2));
          if (!w) free(v);
          v = w;
          if (!v) break;
        }
        memset(&v[n], 0, sizeof v[n]);
        v[n].rep = r;
        v[n].shard = dp / r;
        v[n].tp = t;
        v[n].across = lay == 1;
        plan_predict(o, &v[n]);
        n++;
      }
    }
  }
  *out = v;
  return v ? n : -1;
}

void plan_config_name(const plan_config *k, char *buf, size_t cap) {
  int len = 0, sz[3] = {k->rep, k->shard, k->tp};
  buf[0] = 0;
  for (int d = 0; d < 3; d++)
    if (sz[d] > 1 && len < (int)cap)
      len += snprintf(buf + len, cap - (size_t)len, "%s%s=%d", len ? " x " : "", PLAN_DIM_NAMES[d],
                      sz[d]);
  if (!len)
    snprintf(buf, cap, "single rank");
  else if (k->tp > 1 && k->rep * k->shard > 1 && len < (int)cap)
    snprintf(buf + len, cap - (size_t)len, " (tp %s)", k->across ? "across" : "inside");
}

static void print_table(const plan_opts *o, plan_config *v, int n, int world) {
  qsort(v, (size_t)n, sizeof *v, cmp_cfg);
  printf(
      "weft-plan: model %s (D=%lld L=%lld H=%lld Hkv=%lld F=%lld V=%lld T=%lld), batch %lld x %lld "
      "accum,\n"
      "  %d ranks = %d nodes x %d, intra %.3g GB/s, inter %.3g GB/s, %.0f GiB and %.3g TFLOP/s per "
      "device%s%s\n",
      o->model_name, (long long)o->m.dim, (long long)o->m.n_layers, (long long)o->m.n_heads,
      (long long)o->m.n_kv_heads, (long long)o->m.ffn_dim, (long long)o->m.vocab,
      (long long)o->m.max_seq_len, (long long)o->batch, (long long)o->grad_accum, world, o->c.nodes,
      o->c.gpn, o->c.intra_bw / 1e9, o->c.inter_bw / 1e9, o->c.mem / (1 << 30), o->c.flops / 1e12,
      o->sp ? ", SP" : "", o->bf16 ? ", bf16 all-gathers" : "");
  printf("%4s %6s %6s %4s | %9s %9s %9s %9s %9s %9s %4s | %10s %10s %10s | %8s %8s %8s %9s\n",
         "rank", "dp_rep", "dp_shd", "tp", "params", "grads", "optim", "unshard", "activ", "total",
         "fit", "dp_rep B", "dp_shd B", "tp B", "dp_rep s", "dp_shd s", "tp s", "step s");
  int shown = 0;
  for (int i = 0; i < n; i++) {
    plan_config *k = &v[i];
    if (o->top && shown >= o->top) break;
    shown++;
    if (!k->valid) {
      printf("%4d %6d %6d %4d | invalid: %s\n", i + 1, k->rep, k->shard, k->tp, k->why);
      continue;
    }
    char b[9][16];
    plan_fmt_bytes(k->m_params, b[0], 16);
    plan_fmt_bytes(k->m_grads, b[1], 16);
    plan_fmt_bytes(k->m_optim, b[2], 16);
    plan_fmt_bytes(k->m_unsharded, b[3], 16);
    plan_fmt_bytes(k->m_act, b[4], 16);
    plan_fmt_bytes(k->m_total, b[5], 16);
    double db[3] = {0, 0, 0};
    for (int d = 0; d < 3; d++)
      for (int kk = 0; kk < WEFT_COLL_KIND_COUNT; kk++) db[d] += k->bytes[d][kk];
    for (int d = 0; d < 3; d++) plan_fmt_bytes(db[d], b[6 + d], 16);
    printf(
        "%4d %6d %6d %4d | %9s %9s %9s %9s %9s %9s %4s | %10s %10s %10s | %8.4f %8.4f %8.4f "
        "%9.4f%s\n",
        i + 1, k->rep, k->shard, k->tp, b[0], b[1], b[2], b[3], b[4], b[5], k->fits ? "yes" : "NO",
        b[6], b[7], b[8], k->t_comm[0], k->t_comm[1], k->t_comm[2], k->t_step,
        k->across ? "  tp across nodes" : "");
  }
  if (shown < n) printf("(%d more; --top 0 prints all)\n", n - shown);
}

void plan_train_opts(const plan_opts *o, const plan_config *k, train_opts *t) {
  train_opts_default(t);
  t->model = o->m;
  snprintf(t->model_name, sizeof t->model_name, "%s", o->model_name);
  t->steps = o->steps;
  /* what train_parse_args derives (min_lr -1 means lr / 10) */
  t->min_lr = t->lr / 10;
  if (t->warmup > t->steps) t->warmup = t->steps;
  t->batch = o->batch;
  t->grad_accum = o->grad_accum;
  t->val_every = 0;
  t->val_batches = 0;
  t->quiet = true;
  t->sequence_parallel = o->sp;
  t->loss_parallel = o->lp;
  t->bf16 = o->bf16 && k->rep * k->shard > 1;
  t->reshard_after_forward = o->raf ? WEFT_FSDP_RESHARD_DEFAULT : 0;
  t->mesh.given = true;
  t->mesh.dp_replicate = k->rep > 1 ? k->rep : 0;
  t->mesh.dp_shard = k->shard > 1 || k->rep > 1 ? k->shard : 0;
  t->mesh.tp = k->tp > 1 ? k->tp : 0;
  if (!t->mesh.dp_replicate && !t->mesh.dp_shard && !t->mesh.tp) t->mesh.dp_shard = 1;
  t->mesh.tp_across_nodes = k->across;
  t->silent = true;
}

void plan_measured_rows(const train_result *r, double bytes[3][WEFT_COLL_KIND_COUNT],
                        double calls[3][WEFT_COLL_KIND_COUNT], double secs[3]) {
  memset(bytes, 0, sizeof(double) * 3 * WEFT_COLL_KIND_COUNT);
  memset(calls, 0, sizeof(double) * 3 * WEFT_COLL_KIND_COUNT);
  for (int d = 0; d < 3; d++) secs[d] = 0;
  for (int d = 0; d < r->ndim; d++) {
    int row = !strcmp(r->dim_names[d], "tp") ? 2 : !strcmp(r->dim_names[d], "dp_replicate") ? 0 : 1;
    for (int kk = 0; kk < WEFT_COLL_KIND_COUNT; kk++) {
      bytes[row][kk] += (double)r->comm_kind_bytes[d][kk];
      calls[row][kk] += (double)r->comm_kind_calls[d][kk];
      secs[row] += r->comm_kind_seconds[d][kk];
    }
  }
}

/* --validate: run each factorisation of this world with weft-train's core. */
static int validate(const plan_opts *o, int world) {
  plan_config *v = NULL;
  plan_opts q = *o;
  q.tp_across = true;
  q.c.gpn = world;
  int n = plan_enumerate(&q, world, false, &v);
  int rank = weft_world_rank(), failed = 0, ran = 0;
  if (n < 0) return 1; /* out of memory: alike on every rank */
  if (rank == 0)
    printf(
        "weft-plan --validate on %d ranks, model %s, batch %lld: predicted vs measured (last of "
        "%lld steps)\n",
        world, o->model_name, (long long)o->batch, (long long)o->steps);
  for (int i = 0; i < n; i++) {
    plan_config *k = &v[i];
    if (!k->valid) {
      if (rank == 0) printf("  %d x %d x %d: skipped (%s)\n", k->rep, k->shard, k->tp, k->why);
      continue;
    }
    train_opts t;
    plan_train_opts(o, k, &t);
    train_result r;
    int rc = train_run(&t, &r);
    if (rc) {
      failed++;
      if (rank == 0) printf("  %d x %d x %d: the training run failed\n", k->rep, k->shard, k->tp);
      continue;
    }
    ran++;
    double meas[3][WEFT_COLL_KIND_COUNT], mcalls[3][WEFT_COLL_KIND_COUNT], secs[3];
    plan_measured_rows(&r, meas, mcalls, secs);
    bool comm_ok = true;
    char line[1024];
    int len = 0;
    for (int d = 0; d < 3; d++)
      for (int kk = 0; kk < WEFT_COLL_KIND_COUNT; kk++) {
        if (meas[d][kk] == 0 && k->bytes[d][kk] == 0 && mcalls[d][kk] == 0 && k->calls[d][kk] == 0)
          continue;
        bool ok = meas[d][kk] == k->bytes[d][kk] && mcalls[d][kk] == k->calls[d][kk];
        comm_ok = comm_ok && ok;
        len += snprintf(
            line + len, sizeof line - (size_t)len,
            "    %-12s %-15s predicted %12.0f B %4.0f calls, measured %12.0f B %4.0f calls %s\n",
            PLAN_DIM_NAMES[d], weft_coll_kind_name((weft_coll_kind)kk), k->bytes[d][kk],
            k->calls[d][kk], meas[d][kk], mcalls[d][kk], ok ? "ok" : "MISMATCH");
        if (len >= (int)sizeof line - 200) len = (int)sizeof line - 200;
      }
    /* memory: the max over ranks of each rank's peak */
    int64_t mm[6] = {r.peak_bytes,
                     r.param_bytes,
                     r.grad_bytes,
                     r.optim_bytes,
                     r.unsharded_param_peak + r.unsharded_grad_peak,
                     r.other_peak};
    MPI_Allreduce(MPI_IN_PLACE, mm, 6, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
    double ratio = k->m_total / (double)mm[0];
    bool mem_ok = fabs(ratio - 1) <= 0.10;
    if (!comm_ok || !mem_ok) failed++;
    if (rank == 0) {
      char pb[4][16];
      plan_fmt_bytes(k->m_total, pb[0], 16);
      plan_fmt_bytes((double)mm[0], pb[1], 16);
      plan_fmt_bytes(k->m_params + k->m_grads + k->m_optim, pb[2], 16);
      plan_fmt_bytes((double)(mm[1] + mm[2] + mm[3]), pb[3], 16);
      char ub[4][16];
      plan_fmt_bytes(k->m_unsharded, ub[0], 16);
      plan_fmt_bytes((double)mm[4], ub[1], 16);
      plan_fmt_bytes(k->m_act, ub[2], 16);
      plan_fmt_bytes((double)mm[5], ub[3], 16);
      printf(
          "  dp_replicate=%d dp_shard=%d tp=%d: comm %s, memory %s (predicted peak %s, measured "
          "%s, ratio %.3f)\n"
          "    memory: params+grads+optim predicted %s measured %s; unsharded %s vs %s; "
          "activations etc. %s vs %s\n%s",
          k->rep, k->shard, k->tp, comm_ok ? "exact" : "MISMATCH",
          mem_ok ? "within 10%" : "OFF BY > 10%", pb[0], pb[1], ratio, pb[2],
          r.param_bytes ? pb[3] : "n/a (no FSDP)", ub[0], r.param_bytes ? ub[1] : "n/a", ub[2],
          r.param_bytes ? ub[3] : "n/a", line);
    }
  }
  free(v);
  if (rank == 0) printf("validate: %d runs, %d failed\n", ran, failed);
  return failed ? 1 : 0;
}

int main(int argc, char **argv) {
  plan_opts o;
  int p = parse(argc, argv, &o);
  if (p) return p == 1 ? 0 : p;
  if (o.validate || o.measure || o.probe) {
    if (weft_init(&argc, &argv) != WEFT_OK) {
      fprintf(stderr, "weft-plan: error: %s\n", weft_last_error());
      return 1;
    }
    int rc = 0;
    if (o.validate) rc = validate(&o, weft_world_size());
    if (!rc && o.measure) {
      rc = plan_measure(&o);
    } else if (!rc && o.probe) {
      plan_probe pr;
      rc = plan_probe_run(&o, &pr) ? 1 : 0;
      if (!rc && weft_world_rank() == 0) {
        plan_probe_print(&pr);
        char err[512];
        if (o.probe_out && plan_probe_save(o.probe_out, &pr, err, sizeof err)) {
          fprintf(stderr, "weft-plan: error: %s\n", err);
          rc = 1;
        }
      }
      MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
    }
    weft_finalize();
    return rc;
  }
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  int world = o.c.nodes * o.c.gpn;
  plan_config *v = NULL;
  int n = plan_enumerate(&o, world, o.calibrate != NULL, &v);
  if (n < 0) {
    fprintf(stderr, "weft-plan: error: out of memory\n");
    return 1;
  }
  print_table(&o, v, n, world);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  printf("%d factorisations of %d ranks in %.3f ms\n", n, world,
         1e3 * ((double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec)));
  free(v);
  return 0;
}
