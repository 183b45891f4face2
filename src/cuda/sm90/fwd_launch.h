// Host-side launch of one Hopper forward instantiation. Included only by the generated
// src/cuda/instantiations/sm90fwd_*.cu files.
#pragma once

#include <cuda_runtime.h>

#include "cuda/block_tiles.h"
#include "cuda/sm90/fwd.h"
#include "cuda/sm90/fwd_grid.h"
#include "cuda/sm90/fwd_kernel.h"

namespace flashattn::cuda::sm90 {

template <typename Traits>
Status run_fwd(const ForwardParams& params, cudaStream_t stream) {
  FwdParams kp;
  if (Status s = make_fwd_params(params, params.dtype, Traits::kHeadDim, Traits::kHeadDimV, Traits::kBlockM,
                                 Traits::kBlockN, 64, 128, "the sm90 forward", &kp);
      !s.ok()) {
    return s;
  }
  // A block mask (kSparse): the plan of this kernel's tiles (block_tiles.h: per query tile the
  // kept key tiles and their kinds), built on the stream before the tile counter.
  size_t plan_bytes = 0;
  if constexpr (Traits::kSparse) {
    plan_bytes = (block_tiles_bytes(params, Traits::kBlockM, Traits::kBlockN) + 15) / 16 * 16;
  }
  return launch_fwd(
      fwd_kernel<Traits>, kp, Traits::kThreads, Traits::kSmemBytes, Traits::kDynamicTiles, plan_bytes,
      [&](void* workspace) {
        if constexpr (Traits::kSparse) return build_block_tiles(&kp.p, Traits::kBlockM, Traits::kBlockN, workspace, stream);
        return Status::Ok();
      },
      Traits::kSparse ? "the sm90 block-sparse forward kernel" : "the sm90 forward kernel", stream);
}

}  // namespace flashattn::cuda::sm90
