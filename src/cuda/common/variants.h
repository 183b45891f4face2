// The compile-time variants of every kernel family, and the one place (dispatch_variant) where
// run-time options become those template arguments.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>

#include "core/params.h"

namespace flashattn::cuda {

// Which masking a kernel instantiation is compiled for.
enum class MaskMode {
  kNone,    // only the seqlen_k boundary
  kWindow,  // causal or sliding window, around the bottom-right diagonal
};

// Score modifiers beyond scale + mask. kNone keeps the inner loop lean; kAny handles softcap,
// ALiBi and dropout with uniform run-time branches; kBiasMask (the sm80 forward and backward,
// with the window mask, which costs nothing when there is none) adds attn_bias, attn_mask and
// block masks (sm80/fwd_kernel.h, sm80/bwd_kernel.h, cuda/block_tiles.h) to kAny. A variant of its own so that the
// other instantiations keep their code, and one instantiation per head dim and dtype: the
// calls that carry tensors of scores are rare enough that an unused window or softcap branch
// does not matter next to the bias and mask reads.
enum class ScoreMods { kNone, kAny, kBiasMask };

// Sets of head dims as bit masks (bit d / 32: 32, 64, 96, 128, 192, 256 are bits 1-4, 6, 8), for
// families built at some head dims only (tools/gen_instantiations.py FAMILY_HEAD_DIMS).
constexpr int head_dim_bit(int d) { return 1 << (d / 32); }
constexpr int kAnyHeadDim = ~0;  // every head dim (the families built at all of them)
// The e4m3 KV cache read by 16-bit queries (FwdTraits::Fp8Cache, the fwdkv8 instantiations):
// head dims 64, 128 and 256 (tools/gen_instantiations.py FAMILY_HEAD_DIMS lists the same).
constexpr int kFp8CacheHeadDims = head_dim_bit(64) | head_dim_bit(128) | head_dim_bit(256);
constexpr bool head_dim_in(int d, int set) { return d > 0 && d <= 256 && d % 32 == 0 && (set & head_dim_bit(d)) != 0; }

namespace variants_detail {

template <bool kBiasMask, typename Element, int kHeadDim, typename Launch>
Status by_mask(const QKVParams& p, Launch& launch) {
  if constexpr (kBiasMask) {
    if (p.has_score_mods()) {
      return launch.template operator()<Element, kHeadDim, MaskMode::kWindow, ScoreMods::kBiasMask>();
    }
  }
  const bool mods = p.softcap > 0.0f || p.alibi != nullptr || p.has_dropout();
  if (p.has_window()) {
    if (mods) return launch.template operator()<Element, kHeadDim, MaskMode::kWindow, ScoreMods::kAny>();
    return launch.template operator()<Element, kHeadDim, MaskMode::kWindow, ScoreMods::kNone>();
  }
  if (mods) return launch.template operator()<Element, kHeadDim, MaskMode::kNone, ScoreMods::kAny>();
  return launch.template operator()<Element, kHeadDim, MaskMode::kNone, ScoreMods::kNone>();
}

template <bool kBiasMask, int kHeadDims, typename Element, typename Launch>
Status by_head_dim(const QKVParams& p, Launch& launch) {
  switch (p.head_dim) {
#ifdef FLASHATTN_CUDA_HDIM_32
    case 32:
      if constexpr (head_dim_in(32, kHeadDims)) return by_mask<kBiasMask, Element, 32>(p, launch);
      break;
#endif
#ifdef FLASHATTN_CUDA_HDIM_64
    case 64:
      if constexpr (head_dim_in(64, kHeadDims)) return by_mask<kBiasMask, Element, 64>(p, launch);
      break;
#endif
#ifdef FLASHATTN_CUDA_HDIM_96
    case 96:
      if constexpr (head_dim_in(96, kHeadDims)) return by_mask<kBiasMask, Element, 96>(p, launch);
      break;
#endif
#ifdef FLASHATTN_CUDA_HDIM_128
    case 128:
      if constexpr (head_dim_in(128, kHeadDims)) return by_mask<kBiasMask, Element, 128>(p, launch);
      break;
#endif
#ifdef FLASHATTN_CUDA_HDIM_192
    case 192:
      if constexpr (head_dim_in(192, kHeadDims)) return by_mask<kBiasMask, Element, 192>(p, launch);
      break;
#endif
#ifdef FLASHATTN_CUDA_HDIM_256
    case 256:
      if constexpr (head_dim_in(256, kHeadDims)) return by_mask<kBiasMask, Element, 256>(p, launch);
      break;
#endif
    default:
      break;
  }
  return Status::NotSupported("head_dim " + std::to_string(p.head_dim) +
                              " was not built into this flashattn (FLASHATTN_CUDA_HEAD_DIMS)" +
                              (kHeadDims == kAnyHeadDim ? "" : " for this kernel family"));
}

}  // namespace variants_detail

// Calls launch.template operator()<Element, kHeadDim, kMask, kMods>() for p's dtype, head dim,
// mask and score modifiers, among the instantiations this build contains (CMake defines
// FLASHATTN_CUDA_HDIM_<d> and FLASHATTN_CUDA_DTYPE_<T>; see build_config.h). kBiasMask: the
// caller has ScoreMods::kBiasMask instantiations (the sm80 forward and backward), which take
// every call with attn_bias, attn_mask or a block mask; other callers never see those (their
// backends decline them first). kHeadDims: the head dims the caller's family has (others:
// kNotSupported).
template <bool kBiasMask = false, int kHeadDims = kAnyHeadDim, typename Launch>
Status dispatch_variant(const QKVParams& p, Launch&& launch) {
  switch (p.dtype) {
#ifdef FLASHATTN_CUDA_DTYPE_FP16
    case DType::kFloat16: return variants_detail::by_head_dim<kBiasMask, kHeadDims, __half>(p, launch);
#endif
#ifdef FLASHATTN_CUDA_DTYPE_BF16
    case DType::kBFloat16: return variants_detail::by_head_dim<kBiasMask, kHeadDims, __nv_bfloat16>(p, launch);
#endif
    default:
      return Status::NotSupported(std::string("q has dtype ") + dtype_name(p.dtype) +
                                  ", which this flashattn CUDA build does not include "
                                  "(FLASHATTN_CUDA_DTYPES)");
  }
}

}  // namespace flashattn::cuda
