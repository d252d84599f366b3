/* kernels/layers.h — the CPU backend's fp32 forward/backward kernels of the
 * Llama-style reference model (docs/DESIGN.md "The reference models"), on
 * raw contiguous row-major host pointers.
 *
 * Private to kernels/: not installed and not exported. The CPU table
 * (cpu/backend.c) points at these; everything above kernels/ reaches them,
 * on any device, through backend.h's weft_backend_<name> of the same name,
 * and the kernels suite tests them directly (weft_internal_dep). The
 * contract written here (shapes, formulas, what is overwritten or
 * accumulated) is the one every backend's member of that name keeps. In the
 * steady state nothing here allocates: where a kernel needs scratch it
 * takes a buffer and says how big (weft_attention_scratch_floats).
 *
 * A tour, one transformer block (N = B*T rows; models/llama is the whole
 * model, written on the ops of nn/autograd.h, which reach these through
 * backend.h):
 *
 *     weft_rmsnorm_forward(n1, rstd1, x, w_attn_norm, N, D, 1e-5f);
 *     weft_linear_forward(q, n1, wq, NULL, N, D, H * hd);     // likewise k, v
 *     weft_rope_forward(q, q, cosb, sinb, max_pos, B, T, H, hd, pos0);
 *     weft_rope_forward(k, k, cosb, sinb, max_pos, B, T, Hkv, hd, pos0);
 *     weft_attention_forward(att, lse, q, k, v, B, T, H, Hkv, hd, true, scratch);
 *     ...
 *
 * Conventions:
 * - Shapes are given on every argument ("out is (B,T,C)"), row-major, last
 *   dim fastest; all pointers are contiguous fp32 unless said otherwise.
 *   Token and target ids are int32.
 * - `_forward` sits next to its `_backward`. A backward says of each output
 *   whether it is overwritten (=) or accumulated into (+=); gradients of
 *   parameters accumulate (+=) unless a flag says otherwise, so the caller
 *   zeroes them once per step as torch's zero_grad does.
 * - Arithmetic is fp32; row reductions (RMSNorm's mean of squares, softmax
 *   sums, cross-entropy) accumulate in double. GEMMs go through weft_sgemm.
 * - Every function that can reject its input returns weft_status: sizes must
 *   be >= 0 and pointers of non-empty arrays non-NULL; ids out of range give
 *   WEFT_ERR_INVALID with the offending index, before anything is written.
 * - No function here communicates; any rank may call any of them. The
 *   vocab-sharded pieces (embedding range, loss-parallel cross-entropy) are
 *   the local halves of algorithms whose reductions the caller performs.
 * - Threads: weft_cpu_num_threads() (backend.h; OPENBLAS_NUM_THREADS at
 *   start, OpenBLAS itself then runs on 1 thread). Every kernel but the
 *   GEMMs splits its work in fixed chunks and returns the same bits on any
 *   number of threads; a large weft_sgemm is split into one block of C per
 *   thread, whose bits may depend on the count, as OpenBLAS's own threading
 *   did (kernels/cpu/pool.c says why and how).
 */
#ifndef WEFT_LAYERS_H
#define WEFT_LAYERS_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* -------------------------------------------------------------- embedding */

/* out[n, :] = weight[tokens[n], :]  (torch.nn.Embedding).
 * out is (N, C), tokens is (N) with 0 <= tokens[n] < V, weight is (V, C).
 * Saves nothing (backward needs the tokens). */
weft_status weft_embedding_forward(float *out, const int32_t *tokens, const float *weight,
                                   int64_t N, int64_t V, int64_t C);
/* dweight[tokens[n], :] += dout[n, :] (scatter-add; repeated tokens add up).
 * dweight is (V, C) and accumulates, dout is (N, C), tokens is (N). */
weft_status weft_embedding_backward(float *dweight, const int32_t *tokens, const float *dout,
                                    int64_t N, int64_t V, int64_t C);

/* Vocab-sharded table (tensor-parallel rowwise embedding): this rank holds
 * global rows [v0, v0 + nv) as weight_local (nv, C). A token t in that range
 * gives weight_local[t - v0]; any other token (>= 0) gives a zero row, so the
 * sum of out over the shards is the full lookup (the caller all-reduces or
 * reduce-scatters it). out is (N, C), tokens is (N), tokens[n] >= 0. */
weft_status weft_embedding_range_forward(float *out, const int32_t *tokens,
                                         const float *weight_local, int64_t N, int64_t v0,
                                         int64_t nv, int64_t C);
/* dweight_local[t - v0, :] += dout[n, :] for tokens t in [v0, v0 + nv); other
 * tokens give no gradient here. dweight_local is (nv, C) and accumulates. */
weft_status weft_embedding_range_backward(float *dweight_local, const int32_t *tokens,
                                          const float *dout, int64_t N, int64_t v0, int64_t nv,
                                          int64_t C);

/* ----------------------------------------------------------------- linear */

/* out = inp @ weight^T (+ bias)  (torch.nn.Linear, weight is [out, in]).
 * out is (N, OC), inp is (N, IC), weight is (OC, IC), bias is (OC) or NULL.
 * Saves nothing (backward needs inp and weight). */
weft_status weft_linear_forward(float *out, const float *inp, const float *weight,
                                const float *bias, int64_t N, int64_t IC, int64_t OC);
/* dinp = dout @ weight          dinp is (N, IC)     (NULL: skipped)
 * dweight = dout^T @ inp        dweight is (OC, IC) (NULL: skipped)
 * dbias = sum_n dout[n, :]      dbias is (OC)       (NULL: skipped)
 * dout is (N, OC), inp is (N, IC), weight is (OC, IC).
 * accumulate_dinp: dinp += instead of =. accumulate_dweight: dweight and
 * dbias += instead of = (gradient accumulation over micro-batches). */
weft_status weft_linear_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                                 const float *inp, const float *weight, int64_t N, int64_t IC,
                                 int64_t OC, bool accumulate_dinp, bool accumulate_dweight);

/* ---------------------------------------------------------------- RMSNorm */

/* out[n, i] = inp[n, i] * rstd[n] * weight[i], rstd[n] = 1/sqrt(mean_i
 * inp[n, i]^2 + eps)  (torch.nn.RMSNorm / torchtitan, eps = 1e-5 there).
 * out is (N, C), rstd is (N) and is saved for backward, inp is (N, C),
 * weight is (C). out may alias inp only if backward does not need inp. */
weft_status weft_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight,
                                 int64_t N, int64_t C, float eps);
/* With g = dout * weight and r = rstd[n]:
 *   dinp[n, i] = r * (g_i - inp[n, i] * r^2 * mean_j(g_j * inp[n, j]))
 *   dweight[i] += sum_n dout[n, i] * inp[n, i] * r        (always accumulates)
 * dinp is (N, C) (= or += by accumulate_dinp; the residual stream wants +=),
 * dweight is (C), dout and inp are (N, C), weight is (C), rstd is (N) from
 * forward. dinp must not alias inp or dout. */
weft_status weft_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                                  const float *weight, const float *rstd, int64_t N, int64_t C,
                                  bool accumulate_dinp);

/* ------------------------------------------------------------------- RoPE */

/* Tables for rotary embeddings, interleaved-pair (Meta / torchtitan) form:
 * for position p < max_pos and pair j < hd/2, with theta_j =
 * theta^(-2j/hd), cosb[p, j] = cos(p * theta_j) and sinb[p, j] = sin(p *
 * theta_j), computed in double and rounded. cosb and sinb are (max_pos,
 * hd/2). hd must be even and > 0; theta > 0 (10000 in the reference). */
weft_status weft_rope_tables(float *cosb, float *sinb, int64_t max_pos, int64_t hd, double theta);
/* Rotates each pair of each head at position p = pos0 + t:
 *   (x[2j], x[2j+1]) -> (x[2j] c - x[2j+1] s, x[2j] s + x[2j+1] c),
 *   c = cosb[p, j], s = sinb[p, j].
 * out and inp are (B, T, NH, hd) (q with NH = H, k with NH = Hkv); out may
 * alias inp (in place). pos0 is the global position of t = 0 (a
 * sequence-parallel shard starts past 0); pos0 + T <= max_pos, the tables'
 * row count. Saves nothing. */
weft_status weft_rope_forward(float *out, const float *inp, const float *cosb, const float *sinb,
                              int64_t max_pos, int64_t B, int64_t T, int64_t NH, int64_t hd,
                              int64_t pos0);
/* The transpose rotation (by -p theta_j):
 *   (d[2j], d[2j+1]) -> (d[2j] c + d[2j+1] s, -d[2j] s + d[2j+1] c).
 * dinp and dout are (B, T, NH, hd); dinp is overwritten and may alias dout. */
weft_status weft_rope_backward(float *dinp, const float *dout, const float *cosb, const float *sinb,
                               int64_t max_pos, int64_t B, int64_t T, int64_t NH, int64_t hd,
                               int64_t pos0);

/* -------------------------------------------------------------- attention */

/* Floats of scratch that weft_attention_forward/_backward need for sequence
 * length T: 2 * min(T, 64) * T (a block of at most 64 query rows times all
 * keys, for probabilities and their gradients). One buffer serves every
 * (batch, head) in turn. */
int64_t weft_attention_scratch_floats(int64_t T);

/* Grouped-query self-attention, softmax(q k^T / sqrt(hd) + mask) v, per
 * batch b and query head h, where h reads kv head h / (H / Hkv) (torch
 * repeat_interleave of k and v over heads). causal: query t attends to
 * keys 0..t (torch's is_causal=True); else to all T keys (no mask).
 * out is (B, T, H, hd), lse is (B, H, T): the log-sum-exp of each score row
 * (in scaled units), saved for backward; q is (B, T, H, hd), k and v are
 * (B, T, Hkv, hd); H % Hkv == 0. scratch holds
 * weft_attention_scratch_floats(T) floats.
 * Memory: no (T, T) matrix is kept; backward recomputes the probabilities
 * from q, k and lse (flash-attention style), so the saved state is out
 * (needed anyway) plus B*H*T floats of lse. Computed with GEMMs over
 * 64-row query blocks (causal: skipping key blocks above the diagonal). */
weft_status weft_attention_forward(float *out, float *lse, const float *q, const float *k,
                                   const float *v, int64_t B, int64_t T, int64_t H, int64_t Hkv,
                                   int64_t hd, bool causal, float *scratch);
/* Gradients of the above. dq is (B, T, H, hd), dk and dv are (B, T, Hkv, hd),
 * all overwritten (a kv head's gradient sums over its query heads).
 * dout is (B, T, H, hd); q, k, v, lse as passed to / returned by forward.
 * With P the recomputed probabilities and dP = dout v^T:
 *   dS = P * (dP - rowsum(P * dP)),  dq = dS k / sqrt(hd),
 *   dk = dS^T q / sqrt(hd),          dv = P^T dout.
 * causal and scratch as for forward (causal must be the forward's). dq,
 * dk, dv must not alias the inputs. */
weft_status weft_attention_backward(float *dq, float *dk, float *dv, const float *dout,
                                    const float *q, const float *k, const float *v,
                                    const float *lse, int64_t B, int64_t T, int64_t H, int64_t Hkv,
                                    int64_t hd, bool causal, float *scratch);

/* ----------------------------------------------------------------- SwiGLU */

/* out = silu(a) * b elementwise, silu(a) = a * sigmoid(a)  (the gate of the
 * Llama feed-forward, a = w1 x, b = w3 x). out, a, b are (n); out may alias
 * a or b if backward does not need them. Saves nothing (backward needs a, b). */
weft_status weft_swiglu_forward(float *out, const float *a, const float *b, int64_t n);
/* da = dout * b * silu'(a), silu'(a) = s (1 + a (1 - s)), s = sigmoid(a);
 * db = dout * silu(a). da, db, dout, a, b are (n); da and db are
 * overwritten; da may alias a and db may alias b (each input is read before
 * the outputs at the same index are written). */
weft_status weft_swiglu_backward(float *da, float *db, const float *dout, const float *a,
                                 const float *b, int64_t n);

/* --------------------------------------------------------------- residual */

/* out = a + b, all (n); out may alias a or b. */
weft_status weft_residual_forward(float *out, const float *a, const float *b, int64_t n);
/* da += dout and db += dout (the gradient flows to both branches), all (n).
 * Either of da, db may be NULL (skipped). */
weft_status weft_residual_backward(float *da, float *db, const float *dout, int64_t n);

/* --------------------------------------------------------------- LayerNorm
 * (kernels/cpu/norm_act.c; the device's in kernels/cuda/norm_act.cu, as for
 * the functions down to dropout) */

/* torch.nn.functional.layer_norm over the last dim (torch.nn.LayerNorm with
 * normalized_shape = (C,)):
 *   mean[n] = mean_i inp[n, i],  rstd[n] = 1/sqrt(mean_i (inp[n, i] - mean[n])^2 + eps)
 *   out[n, i] = (inp[n, i] - mean[n]) * rstd[n] * weight[i] + bias[i]
 * (the biased variance, as torch; mean and variance accumulate in double,
 * two passes). out and inp are (N, C), mean and rstd are (N) and are saved
 * for backward, weight and bias are (C) and may each be NULL (weight 1,
 * bias 0: elementwise_affine=False or bias=False). C >= 1, eps > 0 (1e-5
 * in torch). out may alias inp only if backward does not need inp. */
weft_status weft_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                                   const float *weight, const float *bias, int64_t N, int64_t C,
                                   float eps);
/* With xhat = (inp[n, i] - mean[n]) * rstd[n], g = dout * weight:
 *   dinp[n, i] = rstd[n] * (g_i - mean_j g_j - xhat_i * mean_j(g_j xhat_j))
 *   dweight[i] += sum_n dout[n, i] * xhat[n, i]                   (accumulates)
 *   dbias[i]   += sum_n dout[n, i]                                (accumulates)
 * dinp is (N, C) (= or += by accumulate_dinp), dweight and dbias are (C);
 * each of the three may be NULL (skipped). dout and inp are (N, C), weight
 * is (C) or NULL (1), mean and rstd are (N) from forward. Row and column
 * sums accumulate in double. dinp must not alias inp or dout. */
weft_status weft_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                                    const float *inp, const float *weight, const float *mean,
                                    const float *rstd, int64_t N, int64_t C, bool accumulate_dinp);

/* ------------------------------------------------------------- activations */

/* The activations (weft_activation, weft_activation_name) are in
 * kernels.h. */
/* out = act(inp) elementwise; out and inp are (n); out may alias inp.
 * An act outside [0, WEFT_ACT_COUNT) is WEFT_ERR_INVALID. Saves nothing
 * (backward needs inp). */
weft_status weft_activation_forward(weft_activation act, float *out, const float *inp, int64_t n);
/* dinp = dout * act'(inp) (+= when accumulate), all (n):
 *   gelu_tanh' = 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2),
 *                t = tanh(sqrt(2/pi) (x + 0.044715 x^3))
 *   gelu_erf'  = 0.5 (1 + erf(x / sqrt(2))) + x exp(-x^2 / 2) / sqrt(2 pi)
 *   relu'      = [x > 0] (0 at x = 0, as torch)
 *   silu'      = s (1 + x (1 - s)), s = sigmoid(x)
 * dinp may alias dout when !accumulate. */
weft_status weft_activation_backward(weft_activation act, float *dinp, const float *dout,
                                     const float *inp, int64_t n, bool accumulate);

/* ----------------------------------------------------------------- softmax */

/* out[n, :] = softmax(inp[n, :]) over the last dim (torch.softmax(x, -1)):
 * exp(inp - max_row) / sum_row, the sum accumulated in double. out and inp
 * are (N, C), C >= 1; out may alias inp. Saves nothing (backward needs
 * out). */
weft_status weft_softmax_forward(float *out, const float *inp, int64_t N, int64_t C);
/* dinp[n, i] = out[n, i] * (dout[n, i] - sum_j dout[n, j] out[n, j]) (+=
 * when accumulate), the row sum in double. dinp, dout and out (forward's
 * output) are (N, C), C >= 1; dinp may alias dout or out when !accumulate. */
weft_status weft_softmax_backward(float *dinp, const float *dout, const float *out, int64_t N,
                                  int64_t C, bool accumulate);

/* ----------------------------------------------------------------- dropout */

/* Inverted dropout (torch.nn.functional.dropout in training) with the
 * caller's uniforms: out[i] = uniform[i] >= p ? inp[i] * s : 0, s = 1 / (1 -
 * p) rounded once to fp32 (so an element is kept with probability 1 - p
 * when uniform[i] is U[0, 1), e.g. from weft_tensor_fill_uniform). out,
 * inp and uniform are (n); out may alias inp; 0 <= p < 1 (p = 0: out =
 * inp). The backward is the same call with the same uniforms on dout:
 * dinp = mask * dout / (1 - p). */
weft_status weft_dropout_apply(float *out, const float *inp, const float *uniform, float p,
                               int64_t n);

/* ---------------------------------------------------------- cross-entropy */

/* Mean cross-entropy, torch.nn.functional.cross_entropy(logits, targets)
 * with reduction 'mean': loss = (1/N) sum_n (lse[n] - logits[n, targets[n]]),
 * lse[n] = log sum_v exp(logits[n, v]).
 * loss is one double, lse is (N) and is saved for backward (may be NULL if
 * no backward follows), logits is (N, V), targets is (N) in [0, V). */
weft_status weft_cross_entropy_forward(double *loss, float *lse, const float *logits,
                                       const int32_t *targets, int64_t N, int64_t V);
/* dlogits[n, v] = scale * (exp(logits[n, v] - lse[n]) - [v == targets[n]]).
 * scale is dloss/N for the mean loss (1/N when the loss is the output).
 * dlogits and logits are (N, V); dlogits is overwritten and may alias
 * logits (in place, saving a (N, V) buffer); lse, targets are (N). */
weft_status weft_cross_entropy_backward(float *dlogits, const float *logits, const float *lse,
                                        const int32_t *targets, int64_t N, int64_t V, float scale);

/* Loss parallel (vocab-sharded logits, as torch's loss_parallel): this rank
 * holds logits_local (N, nv) = columns [v0, v0 + nv) of the (N, V) logits.
 * The caller combines the pieces across the vocab shards:
 *   1. weft_cross_entropy_local_max       -> all-reduce MAX  -> gmax (N)
 *      weft_cross_entropy_local_target    -> all-reduce SUM  -> gtarget (N)
 *   2. weft_cross_entropy_local_sumexp(gmax) -> all-reduce SUM -> gsum (N)
 *   3. weft_cross_entropy_finish(gmax, gsum, gtarget) -> loss, lse (N)
 *   4. weft_cross_entropy_backward_local(lse) -> dlogits_local, no comm.
 * Each shard must have nv >= 1 for step 1's max to mean anything; a shard
 * with nv = 0 reports -inf, which MAX ignores. */

/* row_max[n] = max_j logits_local[n, j] (-inf if nv == 0).
 * row_max is (N), logits_local is (N, nv). */
weft_status weft_cross_entropy_local_max(float *row_max, const float *logits_local, int64_t N,
                                         int64_t nv);
/* target_logit[n] = logits_local[n, targets[n] - v0] when targets[n] is in
 * [v0, v0 + nv), else 0 (so the SUM over shards is the target's logit).
 * target_logit is (N), targets is (N) with targets[n] >= 0. */
weft_status weft_cross_entropy_local_target(float *target_logit, const float *logits_local,
                                            const int32_t *targets, int64_t N, int64_t v0,
                                            int64_t nv);
/* sumexp[n] = sum_j exp(logits_local[n, j] - gmax[n]) (accumulated in
 * double). sumexp and gmax are (N), gmax the all-reduced row maximum. */
weft_status weft_cross_entropy_local_sumexp(float *sumexp, const float *logits_local,
                                            const float *gmax, int64_t N, int64_t nv);
/* lse[n] = gmax[n] + log(gsum[n]); loss = (1/N) sum_n (lse[n] - gtarget[n]).
 * All arrays are (N) and global (reduced over the shards); lse is saved for
 * the backward (may be NULL). gsum must be > 0. */
weft_status weft_cross_entropy_finish(double *loss, float *lse, const float *gmax,
                                      const float *gsum, const float *gtarget, int64_t N);
/* The shard's slice of weft_cross_entropy_backward:
 * dlogits_local[n, j] = scale * (exp(logits_local[n, j] - lse[n]) -
 * [v0 + j == targets[n]]). dlogits_local and logits_local are (N, nv)
 * (may alias), lse and targets are (N). */
weft_status weft_cross_entropy_backward_local(float *dlogits_local, const float *logits_local,
                                              const float *lse, const int32_t *targets, int64_t N,
                                              int64_t v0, int64_t nv, float scale);

/* ------------------------------------------------------------- optimizers */

/* weft_adamw_params and WEFT_ADAMW_DEFAULT are in kernels.h. */

/* One AdamW step over a flat array, torch.optim.AdamW (single-tensor path,
 * https://pytorch.org/docs/stable/generated/torch.optim.AdamW.html):
 *   g = maximize ? -grad : grad
 *   param *= 1 - lr * weight_decay
 *   m = beta1 m + (1 - beta1) g;   v = beta2 v + (1 - beta2) g^2
 *   vmax = max(vmax, v)                                 (amsgrad only)
 *   param -= lr / (1 - beta1^step) * m / (sqrt(v or vmax) / sqrt(1 - beta2^step) + eps)
 * param, grad, m, v (and vmax) are (n); m, v, vmax start at zero and are
 * updated in place; step is the 1-based count of this step (torch's
 * state['step'] after its increment). vmax may be NULL unless amsgrad. */
weft_status weft_adamw_step(float *param, const float *grad, float *m, float *v, float *vmax,
                            int64_t n, int64_t step, const weft_adamw_params *hp);

/* weft_sgd_params is in kernels.h. */

/* One SGD step over a flat array, torch.optim.SGD
 * (https://pytorch.org/docs/stable/generated/torch.optim.SGD.html):
 *   d = (maximize ? -grad : grad) + weight_decay * param
 *   if momentum != 0:
 *     buf = (step == 1) ? d : momentum * buf + (1 - dampening) * d
 *     d = nesterov ? d + momentum * buf : buf
 *   param -= lr * d
 * param, grad, buf are (n); buf is the momentum buffer (may be NULL when
 * momentum == 0), initialised from d on step 1 as torch does (no
 * dampening on the first step); step is 1-based. */
weft_status weft_sgd_step(float *param, const float *grad, float *buf, int64_t n, int64_t step,
                          const weft_sgd_params *hp);

/* sum_i x[i]^2 accumulated in double (the per-rank piece of a gradient
 * norm: total_norm = sqrt(sum over all params and ranks)). x is (n). */
double weft_sumsq(const float *x, int64_t n);

/* weft_clip_coef is in kernels.h. */

/* x *= alpha elementwise, x is (n). */
void weft_scale_f32(float *x, int64_t n, float alpha);

#ifdef __cplusplus
}
#endif
#endif /* WEFT_LAYERS_H */
