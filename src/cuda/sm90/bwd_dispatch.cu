// Which calls the Hopper backward takes (bwd_declines), and its dispatch through dispatch_variant.
#include "cuda/common/build_config.h"
#include "cuda/common/variants.h"
#include "cuda/sm90/bwd.h"
#include "cuda/sm90/bwd_kernel.h"
#include "cuda/sm90/tensor_map.h"

namespace flashattn::cuda::sm90 {
namespace {

// The head dims the Hopper backward is instantiated for (tools/gen_instantiations.py).
constexpr bool has_bwd_kernel(int head_dim) { return head_dim == 64 || head_dim == 128 || head_dim == 192 || head_dim == 256; }
// head_dim_v != head_dim: 192 / 128 (DeepSeek-V3 prefill; BwdDvTraits, SM90_BWD_DV_PAIRS there),
// built whenever 192 is; without softcap, ALiBi or a block mask (cuda_backend.cu pads those calls,
// and every other pair, to one head dim first).
constexpr bool has_bwd_dv_kernel(int head_dim, int head_dim_v) { return head_dim == 192 && head_dim_v == 128; }
// Softcap and ALiBi (BwdModsTraits): d64 with either mask mode, d128 without a window. The split
// roles of d192/d256 leave the role that computes dS without S; at d128 with a window and under a
// block mask (BwdSparseTraits) the kernels as written spilled (ptxas sm_90a: 4-8 bytes at d128
// window, 8-44 under a block mask), so those calls stay on sm80 until they are reworked.
constexpr bool has_mods_kernel(int head_dim, bool window) { return head_dim == 64 || (head_dim == 128 && !window); }
// attn_bias and/or attn_mask without a block mask (BwdBiasTraits, the window mask serving calls
// without one too, softcap and ALiBi at run time): 64 and 128 (sm90bwdbias_* instantiations).
constexpr bool has_bias_kernel(int head_dim) { return head_dim == 64 || head_dim == 128; }

}  // namespace

std::string bwd_declines(const BackwardParams& p) {
  if (!has_bwd_kernel(p.head_dim)) return "head_dim is not 64, 128, 192 or 256";
  if (!head_dim_built(p.head_dim)) return "head_dim not built";
  if (p.head_dim_v != p.head_dim) {
    if (!has_bwd_dv_kernel(p.head_dim, p.head_dim_v)) return "head_dim_v differs from head_dim (other than 192 / 128)";
    if (p.block_mask.defined() || p.has_block_lists()) return "a block mask at head_dim_v != head_dim";
    if (p.softcap > 0.0f || p.alibi != nullptr) return "softcap and ALiBi at head_dim_v != head_dim";
  }
  if (p.has_dropout()) return "dropout runs on sm80";
  const bool sparse = p.block_mask.defined() || p.has_block_lists();
  if ((p.bias.defined() || p.mask.defined()) && !sparse) {
    // BwdBiasTraits: the fused kernel copies the bias tile (16-bit, the call's dtype; 16-byte
    // aligned base and strides, 0 where it broadcasts) as the forward's bias kernel does, and
    // reads attn_mask packed into bits (mask_bits.h, any strides).
    if (!has_bias_kernel(p.head_dim)) {
      return p.bias.defined() ? "attn_bias at this head dim runs on sm80 (sm90: 64 and 128)"
                              : "attn_mask without a block mask at this head dim runs on sm80 (sm90: 64 and 128)";
    }
    if (p.bias.defined()) {
      if (const char* why = bias_map_declines(p.bias)) return why;
    }
    if (p.deterministic) return "the deterministic backward with attn_bias or attn_mask runs on sm80";
    // dbias needs P (dP - D) without softcap's factor, which the fused kernel's dS carries: the
    // sm80 kernels apply it after dbias (sm80/bwd_kernel.h bwd_kernel<Traits, true>).
    if (p.dbias.defined() && p.softcap > 0.0f) return "dbias with softcap runs on sm80";
  } else if (p.bias.defined()) {
    return "attn_bias with a block mask runs on sm80";
  } else if (p.softcap > 0.0f || p.alibi != nullptr) {
    if (p.has_score_mods()) return "softcap and ALiBi with a block mask run on sm80";
    if (!has_mods_kernel(p.head_dim, p.has_window())) {
      return "softcap and ALiBi at head_dim 192 and 256, and at 128 with a causal or window mask, run on sm80";
    }
  }
  if (broadcast_operand(p, p.q_strides, p.heads) || broadcast_operand(p, p.k_strides, p.heads_k) ||
      broadcast_operand(p, p.v_strides, p.heads_k) || broadcast_operand(p, p.dout_strides, p.heads)) {
    return "a broadcast (stride 0) operand";
  }
  return {};
}

Status dispatch_bwd(const BackwardParams& p, cudaStream_t stream) {
  // The fused kernel (5 products, f32 dQ added by the copy engine by a writer warp) against the
  // deterministic two kernels (7 products), H200 bf16 (dev/results/h200-2026-12-02-ab2-new-auto.json
  // against -ab2-new-sm90.json, and -ab3-* with masks applied per block): the fused kernel is
  // ahead or within 1-3% everywhere. Until d64 split dQ's columns between the consumers it lost
  // at d64 without a mask below 2048 keys, where the two kernels ran; since, it leads there too
  // (1k: 337 against 305 TFLOP/s, dev/results/h200-2026-12-02-bwd-d64-*-sm90.json). Under a mask
  // it is 1.10-1.15x the sm80 backward at d64 from 1k. The two-kernel form runs when
  // deterministic=true asks for it.
  // A block mask (either form, with or without attn_mask) takes the block-sparse kernels
  // (BwdSparseTraits), instantiated with the window mask only: with no window it costs one range
  // test per tile. Its choice between the fused kernel and the two-kernel form is the dense one's
  // (not yet timed under a block mask).
  const bool sparse = p.block_mask.defined() || p.has_block_lists();
  // kAny here is softcap and/or ALiBi: bwd_declines left dropout to sm80.
  return dispatch_variant(p, [&]<typename Element, int kHeadDim, MaskMode kMask, ScoreMods kMods>() -> Status {
    constexpr bool kMods90 = kMods == ScoreMods::kAny && has_mods_kernel(kHeadDim, kMask == MaskMode::kWindow);
    if (p.head_dim_v != kHeadDim) {  // 192 / 128 only (bwd_declines)
      if constexpr (kHeadDim == 192 && kMods == ScoreMods::kNone) {
        if (!sparse && p.head_dim_v == 128) return run_bwd<BwdDvTraits<Element, 192, kMask, 128>>(p, stream);
      }
      return Status::NotSupported("the sm90 backward has no kernel for head_dim " + std::to_string(kHeadDim) +
                                  " with head_dim_v " + std::to_string(p.head_dim_v));
    }
    if (!sparse && (p.bias.defined() || p.mask.defined())) {  // (bwd_declines: head dim 64 or 128)
      if constexpr (has_bias_kernel(kHeadDim)) {
        return run_bwd<BwdBiasTraits<Element, kHeadDim, MaskMode::kWindow>>(p, stream);
      } else {
        return Status::NotSupported("the sm90 bias backward has no kernel for head_dim " + std::to_string(kHeadDim));
      }
    }
    if (sparse) {
      if constexpr (has_bwd_kernel(kHeadDim) && kMods == ScoreMods::kNone) {
        return run_bwd<BwdSparseTraits<Element, kHeadDim, MaskMode::kWindow>>(p, stream);
      } else {
        return Status::NotSupported("the sm90 block-sparse backward has no kernel for head_dim " +
                                    std::to_string(kHeadDim));
      }
    }
    if constexpr (has_bwd_kernel(kHeadDim) && kMods == ScoreMods::kNone) {
      return run_bwd<BwdTraits<Element, kHeadDim, kMask>>(p, stream);
    } else if constexpr (kMods90) {
      return run_bwd<BwdModsTraits<Element, kHeadDim, kMask>>(p, stream);
    } else {
      return Status::NotSupported("the sm90 backward has no kernel for head_dim " + std::to_string(kHeadDim) +
                                  " with score modifiers " + (kMods == ScoreMods::kNone ? "off" : "on"));
    }
  });
}

}  // namespace flashattn::cuda::sm90
