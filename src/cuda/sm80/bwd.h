// Declarations shared by the backward dispatch and the generated instantiations.
#pragma once

#include <cuda_runtime.h>

#include "core/params.h"

namespace flashattn::cuda {

// Defined in bwd_launch.h; each traits is instantiated in its own generated .cu file.
template <typename Traits>
Status run_bwd(const BackwardParams& params, cudaStream_t stream);

// Picks the instantiation for params and runs the whole backward (preprocess, main kernel,
// dQ conversion, GQA reduction) on `stream`, allocating its workspace stream-ordered.
Status dispatch_bwd(const BackwardParams& params, cudaStream_t stream);

}  // namespace flashattn::cuda
