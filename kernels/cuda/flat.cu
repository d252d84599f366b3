/* Flat buffers on the device (backend.h's flat_pack, flat_split,
 * flat_accumulate: FSDP's all-gather and reduce-scatter buffers), each one
 * launch over all the pieces.
 *
 * As optim.cu does for tensors, the pieces are cut into chunks of
 * FLAT_CHUNK elements; block c finds its piece by a binary search over the
 * pieces' first chunks in a descriptor table that the host uploads into
 * the shared scratch buffer with a synchronous copy on the compute stream.
 * Empty pieces are left out of the table.
 *
 * Bits: the casts between f32, bf16 and f16 are the CPU's (device_util.cuh:
 * round to nearest even, NaN stays NaN, bf16 <-> f16 through f32), a piece
 * of the flat buffer's dtype is copied bit for bit, and accumulation is
 * dst[j] + scale * float(flat[j]) in fp32 with the product rounded on its
 * own (mul_rn), as kernels/cpu/backend.c's cpu_flat_accumulate: the same
 * bits as the CPU backend.
 */
#include <stdint.h>
#include <stdlib.h>

#include "arg_checks.h"
#include "cuda_compat.h"
#include "cuda_internal.h"
#include "cuda_kernels.h"
#include "device_util.cuh"

#define FLAT_THREADS 256
#define FLAT_CHUNK 4096

namespace {

enum flat_op { FLAT_PACK, FLAT_SPLIT, FLAT_ACCUMULATE };

/* One piece of a launch. */
struct piece_desc {
  void *data; /* the piece's elements (NULL: zeros, pack only) */
  int dtype;  /* weft_dtype of data */
  int pad_;
  int64_t offset; /* in the flat buffer, elements */
  int64_t count;  /* elements of data */
  int64_t total;  /* flat elements this launch covers: count (+ pad for pack) */
  int64_t chunk0; /* its first chunk */
};

__device__ inline const piece_desc *piece_of(const piece_desc *d, int np, int64_t c) {
  return chunk_owner(d, np, c);
}

/* Element j of a piece's data as the flat dtype FT. */
template <class FT>
__device__ inline FT piece_value(const piece_desc &p, int64_t j) {
  switch (p.dtype) {
    case WEFT_F32:
      return convert<FT, float>::from(((const float *)p.data)[j]);
    case WEFT_BF16:
      return convert<FT, bf16_t>::from(((const bf16_t *)p.data)[j]);
    default:
      return convert<FT, f16_t>::from(((const f16_t *)p.data)[j]);
  }
}

/* Element j of a piece's data = x (flat dtype FT) converted. */
template <class FT>
__device__ inline void piece_store(const piece_desc &p, int64_t j, FT x) {
  switch (p.dtype) {
    case WEFT_F32:
      ((float *)p.data)[j] = convert<float, FT>::from(x);
      break;
    case WEFT_BF16:
      ((bf16_t *)p.data)[j] = convert<bf16_t, FT>::from(x);
      break;
    default:
      ((f16_t *)p.data)[j] = convert<f16_t, FT>::from(x);
      break;
  }
}

template <class FT>
__global__ void flat_kernel(FT *flat, const piece_desc *descs, int np, int64_t nchunks, int op,
                            float scale) {
  for (int64_t c = blockIdx.x; c < nchunks; c += gridDim.x) {
    const piece_desc &p = *piece_of(descs, np, c);
    const int64_t e0 = (c - p.chunk0) * FLAT_CHUNK;
    const int64_t e1 = e0 + FLAT_CHUNK < p.total ? e0 + FLAT_CHUNK : p.total;
    FT *f = flat + p.offset;
    for (int64_t j = e0 + threadIdx.x; j < e1; j += FLAT_THREADS) {
      if (op == FLAT_PACK) {
        f[j] = j < p.count && p.data ? piece_value<FT>(p, j) : from_f32<FT>(0.0f);
      } else if (op == FLAT_SPLIT) {
        piece_store<FT>(p, j, f[j]);
      } else {
        float *d = (float *)p.data;
        d[j] = d[j] + mul_rn(scale, as_f32(f[j]));
      }
    }
  }
}

unsigned grid_of(int64_t nchunks) { return (unsigned)(nchunks < 1048576 ? nchunks : 1048576); }

/* Builds and uploads the descriptor table, then launches flat_kernel. */
weft_status flat_run(const char *op, flat_op kind, void *flat, weft_dtype flat_dtype,
                     const weft_flat_piece *pieces, int npieces, float scale) {
  piece_desc *host = (piece_desc *)calloc((size_t)(npieces > 0 ? npieces : 1), sizeof *host);
  if (!host) return weft_error_at(WEFT_ERR_OOM, op, "no host memory for %d pieces", npieces);
  int np = 0;
  int64_t nchunks = 0;
  double bytes_moved = 0, flops = 0; /* the cost model's (backend.h) */
  const double fsz = flat_dtype == WEFT_F32 ? 4.0 : 2.0;
  for (int i = 0; i < npieces; i++) {
    const weft_flat_piece &p = pieces[i];
    const int64_t total = p.count + (kind == FLAT_PACK ? p.pad : 0);
    if (total == 0) continue;
    const double psz = p.dtype == WEFT_F32 ? 4.0 : 2.0;
    if (kind == FLAT_PACK)
      bytes_moved += fsz * (double)total + psz * (double)p.count;
    else if (kind == FLAT_SPLIT)
      bytes_moved += (fsz + psz) * (double)total;
    else /* accumulate into an f32 piece: read the flat and the piece, write the piece */
      bytes_moved += (fsz + 8.0) * (double)total, flops += 2.0 * (double)total;
    piece_desc &d = host[np++];
    d.data = p.data;
    d.dtype = (int)p.dtype;
    d.offset = p.offset;
    d.count = p.count;
    d.total = total;
    d.chunk0 = nchunks;
    nchunks += (total + FLAT_CHUNK - 1) / FLAT_CHUNK;
  }
  weft_status st = WEFT_OK;
  if (np > 0) {
    void *scratch = nullptr;
    const size_t bytes = (size_t)np * sizeof *host;
    st = weft_cuda_scratch_(bytes, &scratch);
    /* synchronous: the host table may go, and kernels queued before that
     * used the scratch buffer have finished */
    if (st == WEFT_OK) st = weft_cuda_memcpy_(scratch, host, bytes, WEFT_COPY_H2D);
    if (st == WEFT_OK) {
      const piece_desc *descs = (const piece_desc *)scratch;
      cudaStream_t s = compute_stream();
      const int ikind = (int)kind;
      WEFT_COST(flops, bytes_moved);
      switch (flat_dtype) {
        case WEFT_F32:
          WEFT_LAUNCH(flat_kernel<float>, grid_of(nchunks), FLAT_THREADS, 0, s, (float *)flat,
                      descs, np, nchunks, ikind, scale);
          break;
        case WEFT_BF16:
          WEFT_LAUNCH(flat_kernel<bf16_t>, grid_of(nchunks), FLAT_THREADS, 0, s, (bf16_t *)flat,
                      descs, np, nchunks, ikind, scale);
          break;
        default:
          WEFT_LAUNCH(flat_kernel<f16_t>, grid_of(nchunks), FLAT_THREADS, 0, s, (f16_t *)flat,
                      descs, np, nchunks, ikind, scale);
          break;
      }
      st = weft_cuda_check_((int)cudaGetLastError(), op);
    }
  }
  free(host);
  return st;
}

}  // namespace

extern "C" {

weft_status weft_cuda_flat_pack(void *flat, weft_dtype flat_dtype, const weft_flat_piece *pieces,
                                int npieces) {
  const char *op = weft_op_name_(__func__);
  WEFT_CHECK(weft_cuda_require_init_(__func__));
  WEFT_CHECK_FLAT_(op, flat, flat_dtype, pieces, npieces, true, false);
  return flat_run(op, FLAT_PACK, flat, flat_dtype, pieces, npieces, 0.0f);
}

weft_status weft_cuda_flat_split(const void *flat, weft_dtype flat_dtype,
                                 const weft_flat_piece *pieces, int npieces) {
  const char *op = weft_op_name_(__func__);
  WEFT_CHECK(weft_cuda_require_init_(__func__));
  WEFT_CHECK_FLAT_(op, flat, flat_dtype, pieces, npieces, false, false);
  return flat_run(op, FLAT_SPLIT, (void *)flat, flat_dtype, pieces, npieces, 0.0f);
}

weft_status weft_cuda_flat_accumulate(const void *flat, weft_dtype flat_dtype,
                                      const weft_flat_piece *pieces, int npieces, float scale) {
  const char *op = weft_op_name_(__func__);
  WEFT_CHECK(weft_cuda_require_init_(__func__));
  WEFT_CHECK_FLAT_(op, flat, flat_dtype, pieces, npieces, false, true);
  return flat_run(op, FLAT_ACCUMULATE, (void *)flat, flat_dtype, pieces, npieces, scale);
}

}  // extern "C"
