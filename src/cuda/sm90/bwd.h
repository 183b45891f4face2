// The Hopper backward (bwd_kernel.h): which calls it takes, and its dispatch.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "core/params.h"

namespace flashattn::cuda::sm90 {

// Why the sm90 backward does not take p (empty when it does): head dims other than 64, 128, 256,
// head_dim_v != head_dim (cuda_backend.cu pads such calls first), softcap, ALiBi and dropout,
// broadcast (stride 0) operands, a head dim or dtype this build lacks. Unless any_runnable
// (FLASHATTN_CUDA_PATH=sm90), also the calls the sm80 backward was timed faster on: head dim 64
// under a causal or window mask with fewer than 2048 keys (H200, 2026-12-02: sm80 192 TFLOP/s
// against 186 at 1k; from 4k the fused sm90 kernel is 1.10-1.12x sm80;
// dev/results/h200-2026-12-02-ab2-new-sm90.json).
std::string bwd_declines(const BackwardParams& p, bool any_runnable);

// Runs p, which bwd_declines accepted, on the sm90 kernels: the two-kernel form (bitwise
// reproducible) when p.deterministic, and, unless any_runnable, wherever the fused kernel was
// timed slower; otherwise the fused kernel with an f32 dQ accumulator that the copy engine adds
// into (bwd_kernel.h). NotSupported (nothing launched) when the copy engine cannot describe an
// operand.
Status dispatch_bwd(const BackwardParams& p, cudaStream_t stream, bool any_runnable);

// Defined in bwd_launch.h; each traits is instantiated in its own generated .cu file.
template <typename Traits>
Status run_bwd(const BackwardParams& params, cudaStream_t stream);

}  // namespace flashattn::cuda::sm90
