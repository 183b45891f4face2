// Which calls the Hopper backward takes (bwd_declines), and its dispatch through dispatch_variant.
#include "cuda/common/build_config.h"
#include "cuda/common/variants.h"
#include "cuda/sm90/bwd.h"
#include "cuda/sm90/bwd_kernel.h"

namespace flashattn::cuda::sm90 {
namespace {

// The head dims the Hopper backward is instantiated for (tools/gen_instantiations.py).
constexpr bool has_bwd_kernel(int head_dim) { return head_dim == 64 || head_dim == 128 || head_dim == 192 || head_dim == 256; }

}  // namespace

std::string bwd_declines(const BackwardParams& p, bool any_runnable) {
  if (!has_bwd_kernel(p.head_dim)) return "head_dim is not 64, 128, 192 or 256";
  if (!head_dim_built(p.head_dim)) return "head_dim not built";
  if (p.head_dim_v != p.head_dim) return "head_dim_v differs from head_dim";
  if (p.softcap > 0.0f || p.alibi != nullptr || p.has_dropout()) return "softcap, ALiBi and dropout run on sm80";
  if (p.has_score_mods()) return "attn_bias, attn_mask and block masks run on sm80";
  const auto broadcast = [&](const Strides3& s, int heads) {
    return s.row == 0 || (heads > 1 && s.head == 0) || (!p.is_varlen() && p.batch > 1 && s.batch == 0);
  };
  if (broadcast(p.q_strides, p.heads) || broadcast(p.k_strides, p.heads_k) || broadcast(p.v_strides, p.heads_k) ||
      broadcast(p.dout_strides, p.heads)) {
    return "a broadcast (stride 0) operand";
  }
  if (!any_runnable && p.head_dim == 64 && p.has_window() && p.seqlen_k < 2048) {
    return "head_dim 64 under a causal or window mask with fewer than 2048 keys runs faster on sm80";
  }
  return {};
}

Status dispatch_bwd(const BackwardParams& p, cudaStream_t stream, bool any_runnable) {
  // The fused kernel (5 products, f32 dQ added by the copy engine by a writer warp) against the
  // deterministic two kernels (7 products), H200 bf16, since the products overlap the exponentials
  // and the dQ staging (dev/results/h200-2026-12-02-ab2-{new-auto,new-sm90}.json, bwd TFLOP/s
  // two-kernel / fused): d128 1k 385 / 414, causal 248 / 243, 4k 360 / 391, 16k 416 / 489; d64
  // 1k 314 / 307, causal (sm80) 192 / 186, 4k 257 / 282, 16k 291 / 327; without a mask from 4k
  // they are within 1%. So the two-kernel form runs only below 2048 keys at d64 or under a mask;
  // FLASHATTN_CUDA_PATH=sm90 (any_runnable: the tests) sends every non-deterministic call to the
  // fused kernel. The two-kernel form is what deterministic=true asks for, so choosing it is allowed.
  BackwardParams q = p;
  if (!any_runnable && p.seqlen_k < 2048 && (p.has_window() || p.head_dim == 64)) q.deterministic = true;
  return dispatch_variant(q, [&]<typename Element, int kHeadDim, MaskMode kMask, ScoreMods kMods>() -> Status {
    if constexpr (has_bwd_kernel(kHeadDim) && kMods == ScoreMods::kNone) {
      return run_bwd<BwdTraits<Element, kHeadDim, kMask>>(q, stream);
    } else {
      return Status::NotSupported("the sm90 backward has no kernel for head_dim " + std::to_string(kHeadDim) +
                                  " with score modifiers " + (kMods == ScoreMods::kNone ? "off" : "on"));
    }
  });
}

}  // namespace flashattn::cuda::sm90
