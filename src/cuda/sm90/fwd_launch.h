// Host-side launch of one Hopper forward instantiation. Included only by the generated
// src/cuda/instantiations/sm90fwd_*.cu files.
#pragma once

#include <cuda_runtime.h>

#include <cstdlib>
#include <string>

#include "core/switches.h"
#include "cuda/block_tiles.h"
#include "cuda/sm90/cache_tiles.h"
#include "cuda/sm90/fwd.h"
#include "cuda/sm90/fwd_grid.h"
#include "cuda/sm90/fwd_kernel.h"

namespace flashattn::cuda::sm90 {

template <typename Traits>
Status run_fwd(const ForwardParams& params, cudaStream_t stream) {
  FwdParams kp;
  if (Status s = make_fwd_params(params, params.dtype, Traits::kHeadDim, Traits::kHeadDimV, Traits::kBlockM,
                                 Traits::kBlockN, 64, 128, "the sm90 forward", &kp, /*kv_maps=*/!Traits::kCache);
      !s.ok()) {
    return s;
  }
  // kBias with an attn_bias: its map (make_bias_map), boxes of 64 keys x kBlockM rows, read by
  // fwd_kernel.h bias_words.
  if constexpr (Traits::kBias) {
    if (params.bias.defined()) {
      if (Status s = make_bias_map(&kp.bias, params.bias, params.seqlen_q, params.seqlen_k, Traits::kBlockM); !s.ok()) {
        return s;
      }
    }
  }
  kp.mask_bits = MaskBits{};
  // A block mask (kSparse): the plan of this kernel's tiles (block_tiles.h: per query tile the
  // kept key tiles and their kinds), built on the stream before the tile counter.
  // kMaskBits (the bias and mask kernels), attn_mask: its bits (mask_bits.h), packed the same way
  // in the workspace before the tile counter (both take the dynamic feed, so have a workspace).
  size_t plan_bytes = 0;
  if constexpr (Traits::kSparse) {
    plan_bytes = (block_tiles_bytes(params, Traits::kBlockM, Traits::kBlockN) + 15) / 16 * 16;
  }
  // kCache, a varlen call (its share of a split call too: params.cache_rows_min > 0): its tiles
  // listed on the device (cache_tiles.h), one query block of one listed sequence per plane, so
  // that the grid does not walk max_seqlen_q / block_m blocks of every sequence, nearly all
  // empty where most sequences are short.
  [[maybe_unused]] int64_t cache_cap = 0;
  if constexpr (Traits::kCache) {
    if (params.is_varlen()) {
      cache_cap = cache_tile_cap(params.total_q, params.batch, Traits::kBlockM, params.cache_rows_min);
      if (cache_cap * params.heads >= (int64_t(1) << 31)) {
        return Status::NotSupported("more than 2^31 query tiles for the sm90 KV-cache forward kernel");
      }
      const int planes = int(cache_cap * params.heads);
      kp.order = TileOrder(planes, 1, planes, 1, params.heads);
      plan_bytes = (cache_tiles_bytes(cache_cap) + 15) / 16 * 16;
    }
  }
  [[maybe_unused]] bool pack_mask = false;
  if constexpr (Traits::kMaskOnly) {  // its consumers read the bits unconditionally (fwd_kernel.h mask_packed)
    if (!params.mask.defined()) return Status::Internal("the sm90 mask forward kernel needs an attn_mask");
  }
  if constexpr (Traits::kMaskBits) {
    static_assert(Traits::kDynamicTiles && kMaskBitsGroupKeys % Traits::kBlockN == 0,
                  "the packed mask lives in the feed's workspace, a group of bits (or half of one) per key block");
    pack_mask = params.mask.defined();
    if (pack_mask) {
      plan_bytes = (mask_bits_bytes(params) + 15) / 16 * 16;
      if (plan_bytes / sizeof(uint32_t) > size_t(kMaskBitsMaxWords)) {
        return Status::NotSupported("attn_mask: more than 2^32 words of packed bits for the sm90 forward");
      }
    }
  }
#if defined(FLASHATTN_DEV_FWD_TRACE)
  // dev/fwd_trace.py: stamps start at 0 (a tile's unreached stamps stay 0) for every launch.
  {
    void* stamps = nullptr;
    cudaError_t e = cudaGetSymbolAddress(&stamps, g_fwd_trace);
    if (e == cudaSuccess) e = cudaMemsetAsync(stamps, 0, sizeof(g_fwd_trace), stream);
    if (e != cudaSuccess) return Status::Internal(std::string("zeroing the forward trace: ") + cudaGetErrorString(e));
  }
#endif
  const Status launched = launch_fwd(
      fwd_kernel<Traits>, kp, Traits::kThreads, Traits::kCtasPerSm, Traits::kSmemBytes, Traits::kDynamicTiles, plan_bytes,
      [&](void* workspace) {
        if constexpr (Traits::kSparse) return build_block_tiles(&kp.p, Traits::kBlockM, Traits::kBlockN, workspace, stream);
        if constexpr (Traits::kCache) {
          if (cache_cap > 0) {
            kp.p.cache_tiles = static_cast<const int32_t*>(workspace);
            return build_cache_tiles(kp.p, Traits::kBlockM, cache_cap, workspace, stream);
          }
        }
        if constexpr (Traits::kMaskBits) {
          if (pack_mask) return build_mask_bits(params, workspace, stream, &kp.mask_bits);
        }
        return Status::Ok();
      },
      Traits::kSparse ? "the sm90 block-sparse forward kernel"
      : Traits::kCache    ? "the sm90 KV-cache forward kernel"
      : Traits::kBias     ? "the sm90 bias forward kernel"
      : Traits::kMaskOnly ? "the sm90 mask forward kernel"
                          : "the sm90 forward kernel",
      stream);
#if defined(FLASHATTN_DEV_FWD_TRACE)
  // dev/fwd_trace.py: the stamps of this launch printed by a kernel of their own, on request.
  if (launched.ok() && std::getenv("FLASHATTN_DEV_FWD_TRACE_PRINT") != nullptr) {
    fwd_trace_print_kernel<Traits::kConsumers><<<kFwdTraceCtas, 32, 0, stream>>>();
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) {
      return Status::Internal(std::string("fwd_trace_print_kernel: ") + cudaGetErrorString(e));
    }
  }
#endif
  if constexpr (Traits::kMaskBits) {
    if (launched.ok() && pack_mask) detail::count_sm90_mask_bits();
  }
  if constexpr (Traits::kMaskOnly) {
    if (launched.ok()) detail::count_sm90_mask_kernel();
  }
  return launched;
}

}  // namespace flashattn::cuda::sm90
