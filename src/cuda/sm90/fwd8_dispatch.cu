// Which FP8 (float8 e4m3) forward calls the Hopper kernels take (fwd8_declines), and their
// dispatch (issue 21; sm90/fwd8_kernel.h).
#include <string>

#include "cuda/common/build_config.h"
#include "cuda/common/variants.h"
#include "cuda/sm90/fwd.h"
#include "cuda/sm90/fwd8_traits.h"
#include "cuda/sm90/tensor_map.h"

namespace flashattn::cuda::sm90 {
namespace {

// tools/gen_instantiations.py, SM90_FWD8_HEAD_DIMS.
constexpr bool has_fp8_kernel(int head_dim) { return head_dim == 64 || head_dim == 128 || head_dim == 256; }

}  // namespace

std::string fwd8_declines(const ForwardParams& p) {
  if (!has_fp8_kernel(p.head_dim)) {
    return "head_dim " + std::to_string(p.head_dim) + " (the FP8 kernels take 64, 128 and 256)";
  }
  if (p.head_dim_v != p.head_dim) {
    return "head_dim_v " + std::to_string(p.head_dim_v) + " differs from head_dim " + std::to_string(p.head_dim);
  }
  if (!head_dim_built(p.head_dim)) {
    return "head_dim " + std::to_string(p.head_dim) + " was not built into this flashattn (FLASHATTN_CUDA_HEAD_DIMS)";
  }
  if (p.has_dropout()) return "dropout_p > 0";
  if (p.has_score_mods()) return "attn_bias, attn_mask and block masks";
  if (p.num_splits > 1) return "num_splits > 1 (the FP8 kernels do not split keys)";
  if (broadcast_operand(p, p.q_strides, p.heads)) return "q broadcast (stride 0)";
  if (broadcast_operand(p, p.k_strides, p.heads_k)) return "k broadcast (stride 0)";
  if (broadcast_operand(p, p.v_strides, p.heads_k)) return "v broadcast (stride 0)";
  return {};
}

// One head dim's four kernels: {no mask, window} x {plain, softcap / ALiBi}.
template <int kHeadDim>
Status run_head_dim(const ForwardParams& p, cudaStream_t stream) {
  const bool window = p.has_window();
  if (p.softcap > 0.0f || p.alibi != nullptr) {
    return window ? run_fwd8<Fwd8Traits<kHeadDim, MaskMode::kWindow, true>>(p, stream)
                  : run_fwd8<Fwd8Traits<kHeadDim, MaskMode::kNone, true>>(p, stream);
  }
  return window ? run_fwd8<Fwd8Traits<kHeadDim, MaskMode::kWindow>>(p, stream)
                : run_fwd8<Fwd8Traits<kHeadDim, MaskMode::kNone>>(p, stream);
}

// Each head dim only where the build has its instantiations (FLASHATTN_CUDA_HDIM_<d>, as
// build_config.h): fwd8_declines has turned the others away already.
Status dispatch_fwd8(const ForwardParams& p, cudaStream_t stream) {
  switch (p.head_dim) {
#if defined(FLASHATTN_CUDA_HDIM_64)
    case 64: return run_head_dim<64>(p, stream);
#endif
#if defined(FLASHATTN_CUDA_HDIM_128)
    case 128: return run_head_dim<128>(p, stream);
#endif
#if defined(FLASHATTN_CUDA_HDIM_256)
    case 256: return run_head_dim<256>(p, stream);
#endif
    default:
      (void)stream;
      return Status::NotSupported("the sm90 FP8 forward has no kernel for head_dim " + std::to_string(p.head_dim) +
                                  " in this build");
  }
}

}  // namespace flashattn::cuda::sm90
