/* examples/gpu/gpu_model.h — the reference model (docs/DESIGN.md "The
 * reference models": Llama-style, RMSNorm, interleaved RoPE, causal GQA attention,
 * SwiGLU, untied output, mean cross-entropy) trained on one GPU per rank
 * with the WEFT_CUDA backend's kernels (backend.h), llm.c style:
 *
 *     gpu_model_config c;
 *     gpu_model_config_preset("tiny_mha", &c);
 *     gpu_model *m;
 *     gpu_model_create(&c, mesh, dp_dim, &m);          // mesh may be NULL
 *     gpu_model_load_safetensors(m, "init.safetensors");   // or init_weights
 *     gpu_model_set_batch(m, inputs, targets);         // (B, T) global, host
 *     double loss, norm;
 *     gpu_model_train_step(m, &hp, 1.0, &loss, &norm); // fwd, bwd, clip, AdamW
 *     gpu_model_destroy(m);
 *
 * Layout (as llm.c's train_gpt2.cu): parameters (fp32 master weights), their
 * gradients and the AdamW moments m and v are one device allocation each,
 * every tensor a slice at the same offset in all four (each slice starts on
 * a 64-float boundary; the gaps are zero and stay zero). Activations needed
 * by the backward are saved per layer in one more allocation, so a step
 * allocates nothing.
 *
 * Data parallel: with a mesh, the ranks of mesh dim `dp_dim` each take B/dp
 * consecutive sequences of the global batch; after the backward the flat
 * gradient buffer is all-reduced with WEFT_OP_AVG (so every rank holds the
 * gradient of the global mean loss), and the loss is averaged the same way.
 * Every rank of the dp group must call the step functions in the same order
 * (SPMD), as the collectives require.
 *
 * Kernel calls go through the WEFT_CUDA table of backend.h
 * (weft_backend_<op>(WEFT_CUDA, ...)): the GPU in a -Dcuda=enabled build,
 * the CPU emulator in a -Dcuda=emulated one (tests/cuda/test_emu_train.c).
 *
 * Errors: every function returns a weft_status with weft_last_error() set
 * (WEFT_ERR_INVALID for bad configs or data, WEFT_ERR_UNSUPPORTED /
 * WEFT_ERR_NO_DEVICE from the backend, WEFT_ERR_IO for files, ...).
 */
#ifndef WEFT_EXAMPLES_GPU_MODEL_H
#define WEFT_EXAMPLES_GPU_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "backend.h"
#include "layers.h"
#include "mesh.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Model shape and batch. B is the global batch (sequences per step over all
 * dp ranks); hd = D / H. */
typedef struct gpu_model_config {
  int64_t D;         /* model width */
  int64_t L;         /* layers */
  int64_t H;         /* query heads; D % H == 0, hd even */
  int64_t Hkv;       /* kv heads; H % Hkv == 0 */
  int64_t F;         /* feed-forward width */
  int64_t V;         /* vocabulary */
  int64_t T;         /* sequence length (also the RoPE table length) */
  int64_t B;         /* global batch; B % dp == 0 */
  double rope_theta; /* 10000 */
  float norm_eps;    /* 1e-5 */
} gpu_model_config;

/* Fills *out with a named configuration:
 *   tiny_mha: D=64, L=2, H=4, Hkv=4, F=172, V=96, T=16, B=2 (the golden data)
 *   tiny_gqa: the same with Hkv=2
 *   gpt2s:    D=768, L=12, H=12, Hkv=12, F=2048, V=50304, T=1024, B=8
 * WEFT_ERR_NOT_FOUND for another name (the message lists these). */
weft_status gpu_model_config_preset(const char *name, gpu_model_config *out);

/* Parameter tensors per layer, in file order:
 * attention_norm, wq, wk, wv, wo, ffn_norm, w1, w3, w2. Tensor i of the model
 * is tok_embeddings (i = 0), then layer l's j-th at 1 + 9 l + j, then norm,
 * then output (3 + 9 L tensors). */
#define GPU_MODEL_PER_LAYER 9

typedef struct gpu_model gpu_model;

/* Allocates the model on the current device (weft_device_init(WEFT_CUDA, ...)
 * must have run):
 * parameters (zero), grads, moments, activations for cfg->B / dp sequences,
 * RoPE tables, attention scratch. mesh == NULL: one rank, dp_dim ignored;
 * otherwise dp_dim is a dim of mesh whose size divides cfg->B; the mesh must
 * outlive the model (it is retained). Errors: WEFT_ERR_INVALID for a bad
 * config (names the field), WEFT_ERR_OOM / the backend's status. */
weft_status gpu_model_create(const gpu_model_config *cfg, weft_mesh *mesh, int dp_dim,
                             gpu_model **out);
/* Frees everything (synchronizes first). NULL: no-op. */
void gpu_model_destroy(gpu_model *m);

const gpu_model_config *gpu_model_get_config(const gpu_model *m);
/* Sequences this rank processes per step (B / dp). */
int64_t gpu_model_local_batch(const gpu_model *m);
/* Number of parameter tensors (3 + 9 L). */
int gpu_model_num_tensors(const gpu_model *m);
/* Name (as docs/DESIGN.md / the golden files: "layers.0.attention.wq.weight") and
 * element count of tensor i, 0 <= i < num_tensors; NULL / 0 out of range. */
const char *gpu_model_tensor_name(const gpu_model *m, int i);
int64_t gpu_model_tensor_numel(const gpu_model *m, int i);
/* Index of a tensor by name, -1 if none. */
int gpu_model_tensor_index(const gpu_model *m, const char *name);
/* Sum of numel over all tensors (the parameter count). */
int64_t gpu_model_param_count(const gpu_model *m);

/* Initialises the weights on the host with weft's counter RNG and copies
 * them to the device: every matrix (embeddings, linears) normal(0, 0.02)
 * with key weft_rng_key(name) (identical on every rank and mesh), norm
 * weights 1. Resets the AdamW state (moments 0, step 0). */
weft_status gpu_model_init_weights(gpu_model *m, uint64_t seed);
/* Loads every tensor by name from a safetensors file (any float dtype,
 * converted to f32). WEFT_ERR_NOT_FOUND naming a missing tensor,
 * WEFT_ERR_INVALID for a wrong element count. Resets the AdamW state. */
weft_status gpu_model_load_safetensors(gpu_model *m, const char *path);

/* Copies this rank's slice of the global batch to the device: inputs and
 * targets are (B, T) int32 host arrays over the global batch, ids in [0, V)
 * (WEFT_ERR_INVALID naming the first one out of range); the rank at dp
 * coordinate r takes sequences [r B/dp, (r + 1) B/dp). */
weft_status gpu_model_set_batch(gpu_model *m, const int32_t *inputs, const int32_t *targets);

/* Forward pass on the batch: *loss = mean cross-entropy over the global
 * batch (averaged over dp; synchronizes). Saves the activations. */
weft_status gpu_model_forward(gpu_model *m, double *loss);
/* Backward of the last forward: gradients of the global mean loss into the
 * grad buffer (zeroed first, then all-reduced AVG over dp). */
weft_status gpu_model_backward(gpu_model *m);
/* torch.nn.utils.clip_grad_norm_(max_norm) over all tensors: *norm (may be
 * NULL) = the total L2 norm before clipping (sumsq_multi), then every
 * gradient times weft_clip_coef(norm, max_norm) (scale_multi). max_norm <= 0:
 * no clipping, norm still reported. */
weft_status gpu_model_clip_grads(gpu_model *m, double max_norm, double *norm);
/* One AdamW step over every tensor (adamw_multi, one launch);
 * increments the step count first (1 on the first call). hp->amsgrad is
 * not supported (WEFT_ERR_UNSUPPORTED). */
weft_status gpu_model_adamw_step(gpu_model *m, const weft_adamw_params *hp);
/* forward, backward, clip_grads(max_norm), adamw_step; loss and norm may be
 * NULL. */
weft_status gpu_model_train_step(gpu_model *m, const weft_adamw_params *hp, double max_norm,
                                 double *loss, double *norm);

/* Copies tensor i's parameters / gradients to host memory (n = numel
 * floats); synchronizes. */
weft_status gpu_model_read_param(const gpu_model *m, int i, float *host);
weft_status gpu_model_read_grad(const gpu_model *m, int i, float *host);

/* FLOPs of one training step (forward + backward) on `tokens` tokens with
 * sequence length T, the PaLM appendix B / llm.c (gpt2_estimate_mfu)
 * estimate:
 *   6 * P * tokens + 6 * L * T * D * tokens
 * with P = parameters that take part in matmuls (every tensor but the
 * token embedding, whose lookup is no matmul; the untied output layer is
 * counted; norm weights are included, a negligible over-count). The
 * attention term is llm.c's 6 L T D per token, i.e. PaLM's 12 L T D
 * (= 2 * (q k^T + p v) * 3 for fwd + bwd) halved for the causal mask:
 * 6 * L * B * T * T * D per step. Recomputation is not counted (model
 * FLOPs, not hardware FLOPs). */
double gpu_model_step_flops(const gpu_model_config *cfg, int64_t tokens);

#ifdef __cplusplus
}
#endif
#endif /* WEFT_EXAMPLES_GPU_MODEL_H */
