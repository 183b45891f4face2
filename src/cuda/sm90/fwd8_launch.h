// Host-side launch of one Hopper FP8 forward instantiation (fwd8_kernel.h). Included only by the
// generated src/cuda/instantiations/sm90fwd8_*.cu files.
#pragma once

#include <cuda_runtime.h>

#include "cuda/sm90/fwd.h"
#include "cuda/sm90/fwd8_kernel.h"
#include "cuda/sm90/fwd_grid.h"

namespace flashattn::cuda::sm90 {

// As run_fwd (fwd_launch.h): persistent CTAs, one per SM, a zeroed tile counter under a mask.
// The operand maps copy boxes of kRowBytes e4m3 columns under the swizzle of that width.
template <typename Traits>
Status run_fwd8(const ForwardParams& params, cudaStream_t stream) {
  FwdParams kp;
  if (Status s = make_fwd_params(params, params.kv_dtype, Traits::kHeadDim, Traits::kHeadDim, Traits::kBlockM,
                                 Traits::kBlockN, Traits::kRowBytes, Traits::kSwizzleBytes, "the sm90 FP8 forward", &kp);
      !s.ok()) {
    return s;
  }
  return launch_fwd(
      fwd8_kernel<Traits>, kp, Traits::kThreads, 1, Traits::kSmemBytes, Traits::kDynamicTiles, 0,
      [](void*) { return Status::Ok(); }, "the sm90 FP8 forward kernel", stream);
}

}  // namespace flashattn::cuda::sm90
