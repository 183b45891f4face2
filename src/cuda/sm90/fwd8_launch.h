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
  if (Status s = make_operand_map(&kp.v, params.v, params.kv_dtype, Traits::kHeadDim, rows_k, params.heads_k,
                                  map_batch, params.v_strides, Traits::kBlockN, kCols, kSwizzle);
      !s.ok()) {
    return Status::NotSupported("v: " + s.message());
  }

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
