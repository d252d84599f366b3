/* The WEFT_CUDA backend table (backend.h): the runtime's members
 * (runtime.cu: devices, the caching allocator, copies, streams and events)
 * and the device kernels (cuda_kernels.h). Every member is filled. Built by
 * nvcc as "cuda", or against the CPU emulator (-DWEFT_CUDA_EMU, meson
 * -Dcuda=emulated) as "cuda (emulated)"; kernels/backend.c installs it as
 * the WEFT_CUDA table at first use. */
#include <string.h>

#include "backend_internal.h"
#include "cuda_compat.h"
#include "cuda_internal.h"
#include "cuda_kernels.h"

namespace {

/* C++17 has no designated initializers: the table is filled here, once. */
weft_backend make_table() {
  weft_backend b;
  memset(&b, 0, sizeof b);
  b.size = sizeof b;
  b.version = WEFT_BACKEND_VERSION;
  b.device = WEFT_CUDA;
#ifdef WEFT_CUDA_EMU
  b.name = "cuda (emulated)";
#else
  b.name = "cuda";
#endif
  /* device set-up */
  b.device_count = weft_cuda_device_count_;
  b.init = weft_cuda_init_;
  b.shutdown = weft_cuda_shutdown_;
  b.current_device = weft_cuda_current_device_;
  b.synchronize = weft_cuda_synchronize_;
  /* memory */
  b.alloc = weft_cuda_alloc_;
  b.free = weft_cuda_free_;
  b.owns = weft_cuda_owns_;
  b.contains = weft_cuda_contains_;
  b.memset = weft_cuda_memset_;
  b.memcpy = weft_cuda_memcpy_;
  b.memcpy_async = weft_cuda_memcpy_async_;
  b.host_alloc_pinned = weft_cuda_host_alloc_pinned_;
  b.host_free_pinned = weft_cuda_host_free_pinned_;
  b.device_model = weft_cuda_device_model_;
  b.takes_dtype = weft_builtin_takes_dtype_; /* tensor.cu's add, mul, scale; the _dt members */
  b.activation_forward_dt = weft_cuda_activation_forward_dt;
  b.activation_backward_dt = weft_cuda_activation_backward_dt;
  b.swiglu_forward_dt = weft_cuda_swiglu_forward_dt;
  b.swiglu_backward_dt = weft_cuda_swiglu_backward_dt;
  b.dropout_apply_dt = weft_cuda_dropout_apply_dt;
  b.layernorm_forward_dt = weft_cuda_layernorm_forward_dt;
  b.layernorm_backward_dt = weft_cuda_layernorm_backward_dt;
  b.softmax_forward_dt = weft_cuda_softmax_forward_dt;
  b.softmax_backward_dt = weft_cuda_softmax_backward_dt;
  b.rmsnorm_forward_dt = weft_cuda_rmsnorm_forward_dt;
  b.rmsnorm_backward_dt = weft_cuda_rmsnorm_backward_dt;
  b.cross_entropy_forward_dt = weft_cuda_cross_entropy_forward_dt;
  b.cross_entropy_backward_dt = weft_cuda_cross_entropy_backward_dt;
  b.cross_entropy_local_max_dt = weft_cuda_cross_entropy_local_max_dt;
  b.cross_entropy_local_target_dt = weft_cuda_cross_entropy_local_target_dt;
  b.cross_entropy_local_sumexp_dt = weft_cuda_cross_entropy_local_sumexp_dt;
  b.cross_entropy_backward_local_dt = weft_cuda_cross_entropy_backward_local_dt;
  b.embedding_range_forward_dt = weft_cuda_embedding_range_forward_dt;
  b.embedding_range_backward_dt = weft_cuda_embedding_range_backward_dt;
  b.rope_forward_dt = weft_cuda_rope_forward_dt;
  b.rope_backward_dt = weft_cuda_rope_backward_dt;
  b.gemm_dt = weft_cuda_gemm_dt;
  b.attention_forward_dt = weft_cuda_attention_forward_dt;
  b.attention_backward_dt = weft_cuda_attention_backward_dt;
  b.copy = weft_cuda_copy;
  b.fill = weft_cuda_fill;
  b.fill_random = weft_cuda_fill_random;
  /* streams and events */
  b.event_record = weft_cuda_event_record_;
  b.stream_wait_event = weft_cuda_stream_wait_event_;
  b.event_synchronize = weft_cuda_event_synchronize_;
  b.event_query = weft_cuda_event_query_;
  b.event_elapsed_ms = weft_cuda_event_elapsed_ms_;
  b.event_destroy = weft_cuda_event_destroy_;
  b.record_stream = weft_cuda_record_stream_;
  b.stream_handle = weft_cuda_stream_handle_;
  /* options */
  b.set_matmul_precision = weft_cuda_set_matmul_precision_;
  b.matmul_precision = weft_cuda_matmul_precision_;
  b.cache_stats = weft_cuda_get_cache_stats_;
  b.empty_cache = weft_cuda_empty_cache_;
  /* dense tensor operations */
  b.gemm = weft_cuda_gemm;
  b.add = weft_cuda_add;
  b.mul = weft_cuda_mul;
  b.scale = weft_cuda_scale;
  b.div_scalar = weft_cuda_div_scalar;
  b.axpy = weft_cuda_axpy;
  b.reduce = weft_cuda_reduce;
  b.reduce_all = weft_cuda_reduce_all;
  /* raw GEMMs */
  b.sgemm = weft_cuda_sgemm;
  b.sgemm_strided_batched = weft_cuda_sgemm_strided_batched;
  b.gemm_bf16 = weft_cuda_gemm_bf16;
  /* layer kernels */
  b.embedding_forward = weft_cuda_embedding_forward;
  b.embedding_backward = weft_cuda_embedding_backward;
  b.embedding_range_forward = weft_cuda_embedding_range_forward;
  b.embedding_range_backward = weft_cuda_embedding_range_backward;
  b.linear_forward = weft_cuda_linear_forward;
  b.linear_backward = weft_cuda_linear_backward;
  b.rmsnorm_forward = weft_cuda_rmsnorm_forward;
  b.rmsnorm_backward = weft_cuda_rmsnorm_backward;
  b.rope_tables = weft_cuda_rope_tables;
  b.rope_forward = weft_cuda_rope_forward;
  b.rope_backward = weft_cuda_rope_backward;
  b.attention_scratch_bytes = weft_cuda_attention_scratch_bytes;
  b.attention_forward = weft_cuda_attention_forward;
  b.attention_backward = weft_cuda_attention_backward;
  b.swiglu_forward = weft_cuda_swiglu_forward;
  b.swiglu_backward = weft_cuda_swiglu_backward;
  b.residual_forward = weft_cuda_residual_forward;
  b.residual_backward = weft_cuda_residual_backward;
  b.cross_entropy_forward = weft_cuda_cross_entropy_forward;
  b.cross_entropy_backward = weft_cuda_cross_entropy_backward;
  b.cross_entropy_local_max = weft_cuda_cross_entropy_local_max;
  b.cross_entropy_local_target = weft_cuda_cross_entropy_local_target;
  b.cross_entropy_local_sumexp = weft_cuda_cross_entropy_local_sumexp;
  b.cross_entropy_finish = weft_cuda_cross_entropy_finish;
  b.cross_entropy_backward_local = weft_cuda_cross_entropy_backward_local;
  /* multi-tensor optimizer steps */
  b.adamw_multi = weft_cuda_adamw_multi;
  b.sgd_multi = weft_cuda_sgd_multi;
  b.sumsq_multi = weft_cuda_sumsq_multi;
  b.scale_multi = weft_cuda_scale_multi;
  /* flat buffers */
  b.flat_pack = weft_cuda_flat_pack;
  b.flat_split = weft_cuda_flat_split;
  b.flat_accumulate = weft_cuda_flat_accumulate;
  /* version 2: LayerNorm, activations, softmax, dropout */
  b.layernorm_forward = weft_cuda_layernorm_forward;
  b.layernorm_backward = weft_cuda_layernorm_backward;
  b.activation_forward = weft_cuda_activation_forward;
  b.activation_backward = weft_cuda_activation_backward;
  b.softmax_forward = weft_cuda_softmax_forward;
  b.softmax_backward = weft_cuda_softmax_backward;
  b.dropout_apply = weft_cuda_dropout_apply;
  return b;
}

}  // namespace

extern "C" const weft_backend *weft_cuda_backend_(void) {
  static const weft_backend table = make_table(); /* thread-safe once (C++11) */
  return &table;
}
