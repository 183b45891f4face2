// The Hopper backward (bwd_kernel.h): which calls it takes, and its dispatch.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "core/params.h"

namespace flashattn::cuda::sm90 {

// Why the sm90 backward does not take p (empty when it does): head dims other than 64, 128, 192,
// 256, head_dim_v != head_dim other than 192 / 128 (cuda_backend.cu pads such calls first), at
// 192 / 128 softcap, ALiBi or a block mask (padded to 192 too: the d192 kernels then take what
// they can), dropout, softcap and ALiBi at head dims 192 and 256, attn_bias with attn_mask or a
// block mask, at head dims 192 / 256, in float32, unaligned or in deterministic mode, attn_mask
// without a block mask, broadcast (stride 0) operands, a head dim or dtype this build lacks. Since the fused kernel
// applies masks once per block (2026-12-02) no call it can run is left to sm80 for speed, so,
// unlike the forward's, the answer does not depend on FLASHATTN_CUDA_PATH.
std::string bwd_declines(const BackwardParams& p);

// Runs p, which bwd_declines accepted, on the sm90 kernels: the two-kernel form (bitwise
// reproducible) when p.deterministic, otherwise the fused kernel with an f32 dQ accumulator that
// the copy engine adds into (bwd_kernel.h). NotSupported (nothing launched) when the copy engine
// cannot describe an operand.
Status dispatch_bwd(const BackwardParams& p, cudaStream_t stream);

// Defined in bwd_launch.h; each traits is instantiated in its own generated .cu file.
template <typename Traits>
Status run_bwd(const BackwardParams& params, cudaStream_t stream);

}  // namespace flashattn::cuda::sm90
