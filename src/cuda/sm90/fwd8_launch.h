// Host-side launch of one Hopper FP8 forward instantiation (fwd8_kernel.h). Included only by the
// generated src/cuda/instantiations/sm90fwd8_*.cu files.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>

#include "cuda/common/cta_order.h"
#include "cuda/common/cuda_check.h"
#include "cuda/common/kernel_facts.h"
#include "cuda/common/workspace.h"
#include "cuda/sm90/fwd.h"
#include "cuda/sm90/fwd8_kernel.h"
#include "cuda/sm90/tensor_map.h"

namespace flashattn::cuda::sm90 {

#if defined(FLASHATTN_DEV_FP8_VT_TMA)
// Dev A/B only (fwd8_kernel.h kFwd8VtByTma): V^T per (batch, kv head) as kHeadDim rows of
// keys_pad bytes (seqlen_k rounded up to 32, zeros after it), each 32-key group in Vt's
// K-permuted order (byte k holds key key_of_k(k): fwd8_layout.h), so one TMA box of
// kBlockN x kHeadDim is the transposers' Vt tile. Thread per destination position: coalesced
// stores, strided loads.
template <int kHeadDim>
__global__ void fwd8_dev_transpose_v(const uint8_t* v, Strides3 s, int seqlen_k, int keys_pad, uint8_t* vt) {
  const int pos = blockIdx.x * blockDim.x + threadIdx.x;
  if (pos >= keys_pad) return;
  const int hk = blockIdx.y, b = blockIdx.z;
  const int key = 32 * (pos / 32) + fwd8::key_of_k(pos % 32);
  const uint8_t* src = v + b * s.batch + int64_t(key) * s.row + hk * s.head;
  uint8_t* dst = vt + (int64_t(b) * gridDim.y + hk) * kHeadDim * keys_pad + pos;
  for (int d = 0; d < kHeadDim; ++d) dst[int64_t(d) * keys_pad] = key < seqlen_k ? src[d] : uint8_t(0);
}
#endif

// As run_fwd (fwd_launch.h): persistent CTAs, one per SM, a zeroed tile counter under a mask.
// The operand maps copy boxes of kRowBytes e4m3 columns under the swizzle of that width.
template <typename Traits>
Status run_fwd8(const ForwardParams& params, cudaStream_t stream) {
  FwdParams kp;
  kp.p = params;
  kp.p.num_splits = 1;
  const bool varlen = params.is_varlen();
  const int map_batch = varlen ? 1 : params.batch;
  const int64_t rows_q = varlen ? params.total_q : params.seqlen_q;
  const int64_t rows_k = varlen ? params.total_k : params.seqlen_k;
  constexpr int kCols = Traits::kRowBytes;
  constexpr int kSwizzle = Traits::kSwizzleBytes;
  if (Status s = make_operand_map(&kp.q, params.q, params.dtype, Traits::kHeadDim, rows_q, params.heads, map_batch,
                                  params.q_strides, Traits::kBlockM, kCols, kSwizzle);
      !s.ok()) {
    return Status::NotSupported("q: " + s.message());
  }
  if (Status s = make_operand_map(&kp.k, params.k, params.kv_dtype, Traits::kHeadDim, rows_k, params.heads_k,
                                  map_batch, params.k_strides, Traits::kBlockN, kCols, kSwizzle);
      !s.ok()) {
    return Status::NotSupported("k: " + s.message());
  }
#if defined(FLASHATTN_DEV_FP8_VT_TMA)
  // kp.v maps the transposed copy: "head dim" = keys_pad bytes, "rows" = the kHeadDim Vt rows.
  // Dense only: a varlen sequence's 32-key groups would start off the packed rows' grid.
  if (varlen) return Status::NotSupported("FLASHATTN_DEV_FP8_VT_TMA: dense calls only");
  const int keys_pad = (params.seqlen_k + 31) / 32 * 32;
  uint8_t* vt_copy = nullptr;
  if (Status st = workspace_alloc(reinterpret_cast<void**>(&vt_copy),
                                  size_t(params.batch) * params.heads_k * Traits::kHeadDim * keys_pad, stream);
      !st.ok()) {
    return st;
  }
  {
    const dim3 grid((keys_pad + 127) / 128, params.heads_k, params.batch);
    fwd8_dev_transpose_v<Traits::kHeadDim>
        <<<grid, 128, 0, stream>>>(static_cast<const uint8_t*>(params.v), params.v_strides, params.seqlen_k, keys_pad, vt_copy);
  }
  const Strides3 vt_strides{int64_t(params.heads_k) * Traits::kHeadDim * keys_pad, keys_pad,
                            int64_t(Traits::kHeadDim) * keys_pad};
  if (Status s = make_operand_map(&kp.v, vt_copy, params.kv_dtype, keys_pad, Traits::kHeadDim, params.heads_k,
                                  params.batch, vt_strides, Traits::kHeadDim, Traits::kBlockN, Traits::kVtRowBytes);
      !s.ok()) {
    (void)workspace_free(vt_copy, stream);
    return Status::NotSupported("v (transposed copy): " + s.message());
  }
  // Freed after the kernel on the same stream, whatever the launch below returns.
  struct FreeAfter {
    uint8_t* p;
    cudaStream_t s;
    ~FreeAfter() { (void)workspace_free(p, s); }
  } free_after{vt_copy, stream};
#else
  if (Status s = make_operand_map(&kp.v, params.v, params.kv_dtype, Traits::kHeadDim, rows_k, params.heads_k,
                                  map_batch, params.v_strides, Traits::kBlockN, kCols, kSwizzle);
      !s.ok()) {
    return Status::NotSupported("v: " + s.message());
  }
#endif

  const auto kernel = fwd8_kernel<Traits>;
  constexpr size_t kSmem = Traits::kSmemBytes;
  if (Status s = raise_dynamic_smem(kernel, kSmem); !s.ok()) return s;
  int sms = 0;
  if (Status s = multiprocessors(&sms); !s.ok()) return s;
  const int m_blocks = (params.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM;
  const long long planes = static_cast<long long>(params.heads) * params.batch;
  if (planes * m_blocks >= (1LL << 31)) {
    return Status::NotSupported("more than 2^31 query tiles for the sm90 FP8 forward");
  }
  kp.order = TileOrder{int(planes * m_blocks), m_blocks, int(planes),
                       causal_group_planes(params.is_causal, m_blocks, planes, sms)};
  const int ctas = std::min(kp.order.tiles, sms);
  kp.tile_counter = nullptr;
  if constexpr (Traits::kDynamicTiles) {
    if (Status st = workspace_alloc(reinterpret_cast<void**>(&kp.tile_counter), sizeof(int), stream); !st.ok()) {
      return st;
    }
    Status launched = cuda_status(cudaMemsetAsync(kp.tile_counter, 0, sizeof(int), stream), "zeroing the tile counter");
    if (launched.ok()) {
      kernel<<<ctas, Traits::kThreads, kSmem, stream>>>(kp);
      launched = cuda_status(cudaGetLastError(), "launching the sm90 FP8 forward kernel");
    }
    Status freed = workspace_free(kp.tile_counter, stream);
    return launched.ok() ? freed : launched;
  }
  kernel<<<ctas, Traits::kThreads, kSmem, stream>>>(kp);
  return cuda_status(cudaGetLastError(), "launching the sm90 FP8 forward kernel");
}

}  // namespace flashattn::cuda::sm90
