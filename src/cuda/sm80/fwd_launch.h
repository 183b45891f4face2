// Host-side launch of one forward kernel instantiation. Included only by the generated
// src/cuda/instantiations/fwd_*.cu files, each of which instantiates run_fwd for one traits.
#pragma once

#include <cuda_runtime.h>

#include "cuda/common/cuda_check.h"
#include "cuda/sm80/fwd_kernel.h"

namespace flashattn::cuda {

template <typename Traits>
Status run_fwd(const ForwardParams& params, cudaStream_t stream) {
  const auto kernel = fwd_kernel<Traits>;
  constexpr size_t kSmem = Traits::kSmemBytes;
  if constexpr (kSmem > 48 * 1024) {
    FLASHATTN_CUDA_TRY(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmem)));
  }
  const dim3 grid((params.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM, params.heads,
                  params.batch);
  kernel<<<grid, Traits::kThreads, kSmem, stream>>>(params);
  return cuda_status(cudaGetLastError(), "launching the sm80 forward kernel");
}

}  // namespace flashattn::cuda
