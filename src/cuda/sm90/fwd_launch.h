// Host-side launch of one Hopper forward instantiation. Included only by the generated
// src/cuda/instantiations/sm90fwd_*.cu files.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>

#include "cuda/block_tiles.h"
#include "cuda/common/cta_order.h"
#include "cuda/common/cuda_check.h"
#include "cuda/common/kernel_facts.h"
#include "cuda/common/workspace.h"
#include "cuda/sm90/fwd.h"
#include "cuda/sm90/fwd_kernel.h"
#include "cuda/sm90/tensor_map.h"

namespace flashattn::cuda::sm90 {

template <typename Traits>
Status run_fwd(const ForwardParams& params, cudaStream_t stream) {
  FwdParams kp;
  kp.p = params;
  kp.p.num_splits = 1;
  const bool varlen = params.is_varlen();
  const int map_batch = varlen ? 1 : params.batch;
  const int64_t rows_q = varlen ? params.total_q : params.seqlen_q;
  const int64_t rows_k = varlen ? params.total_k : params.seqlen_k;
  if (Status s = make_operand_map(&kp.q, params.q, params.dtype, Traits::kHeadDim, rows_q, params.heads, map_batch,
                                  params.q_strides, Traits::kBlockM);
      !s.ok()) {
    return Status::NotSupported("q: " + s.message());
  }
  if (Status s = make_operand_map(&kp.k, params.k, params.dtype, Traits::kHeadDim, rows_k, params.heads_k,
                                  map_batch, params.k_strides, Traits::kBlockN);
      !s.ok()) {
    return Status::NotSupported("k: " + s.message());
  }
  if (Status s = make_operand_map(&kp.v, params.v, params.dtype, Traits::kHeadDimV, rows_k, params.heads_k,
                                  map_batch, params.v_strides, Traits::kBlockN);
      !s.ok()) {
    return Status::NotSupported("v: " + s.message());
  }

  const auto kernel = fwd_kernel<Traits>;
  constexpr size_t kSmem = Traits::kSmemBytes;
  if (Status s = raise_dynamic_smem(kernel, kSmem); !s.ok()) return s;
  int sms = 0;
  if (Status s = multiprocessors(&sms); !s.ok()) return s;
  const int m_blocks = (params.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM;
  const long long planes = static_cast<long long>(params.heads) * params.batch;
  if (planes * m_blocks >= (1LL << 31)) {
    return Status::NotSupported("more than 2^31 query tiles for the sm90 forward");
  }
  kp.order = TileOrder{int(planes * m_blocks), m_blocks, int(planes),
                       causal_group_planes(params.is_causal, m_blocks, planes, sms)};
  // Persistent CTAs, one per SM (their shared memory allows no second): each loads its next tile
  // while finishing one (1k-2k without a mask: +5-11% against one CTA per tile). Under a causal
  // or window mask they take tiles from a counter (FwdTraits::kDynamicTiles), zeroed here in
  // stream order; one CTA per tile, the previous choice there, was 0-18% slower (shortest rows
  // the most).
  const int ctas = std::min(kp.order.tiles, sms);
  kp.tile_counter = nullptr;
  if constexpr (Traits::kSparse) {
    // A block mask: the plan of this kernel's tiles (block_tiles.h: per query tile the kept key
    // tiles and their kinds), built on the stream, then the tile counter after it in the same
    // workspace; both freed after the launch in stream order.
    const size_t plan_bytes = (block_tiles_bytes(params, Traits::kBlockM, Traits::kBlockN) + 15) / 16 * 16;
    void* ws = nullptr;
    if (Status st = workspace_alloc(&ws, plan_bytes + 16, stream); !st.ok()) return st;
    Status launched = build_block_tiles(&kp.p, Traits::kBlockM, Traits::kBlockN, ws, stream);
    kp.tile_counter = reinterpret_cast<int*>(static_cast<char*>(ws) + plan_bytes);
    if (launched.ok()) {
      launched = cuda_status(cudaMemsetAsync(kp.tile_counter, 0, sizeof(int), stream), "zeroing the tile counter");
    }
    if (launched.ok()) {
      kernel<<<ctas, Traits::kThreads, kSmem, stream>>>(kp);
      launched = cuda_status(cudaGetLastError(), "launching the sm90 block-sparse forward kernel");
    }
    Status freed = workspace_free(ws, stream);
    return launched.ok() ? freed : launched;
  } else if constexpr (Traits::kDynamicTiles) {
    if (Status st = workspace_alloc(reinterpret_cast<void**>(&kp.tile_counter), sizeof(int), stream); !st.ok()) {
      return st;
    }
    Status launched = cuda_status(cudaMemsetAsync(kp.tile_counter, 0, sizeof(int), stream), "zeroing the tile counter");
    if (launched.ok()) {
      kernel<<<ctas, Traits::kThreads, kSmem, stream>>>(kp);
      launched = cuda_status(cudaGetLastError(), "launching the sm90 forward kernel");
    }
    Status freed = workspace_free(kp.tile_counter, stream);
    return launched.ok() ? freed : launched;
  }
  kernel<<<ctas, Traits::kThreads, kSmem, stream>>>(kp);
  return cuda_status(cudaGetLastError(), "launching the sm90 forward kernel");
}

}  // namespace flashattn::cuda::sm90
