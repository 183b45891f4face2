// Which calls the Hopper forward takes (fwd_declines), and its dispatch through dispatch_variant.
#include <cstdint>

#include "cuda/common/build_config.h"
#include "cuda/common/split_heuristic.h"
#include "cuda/common/cuda_check.h"
#include "cuda/common/kernel_facts.h"
#include "cuda/common/variants.h"
#include "cuda/sm90/fwd.h"
#include "cuda/sm90/fwd_traits.h"
#include "cuda/sm90/tensor_map.h"

namespace flashattn::cuda::sm90 {
namespace {

// The head dims the Hopper forward is instantiated for (tools/gen_instantiations.py): 64, 128,
// 192 and 256 with head_dim_v the same, and 192 with head_dim_v 128 (DeepSeek-V3 prefill,
// SM90_FWD_DV_PAIRS there), built whenever 192 is.
constexpr bool has_kernel(int head_dim) {
  return head_dim == 64 || head_dim == 128 || head_dim == 192 || head_dim == 256;
}
constexpr bool has_kernel(int head_dim, int head_dim_v) {
  return head_dim_v == head_dim ? has_kernel(head_dim) : head_dim == 192 && head_dim_v == 128;
}
// The bias kernel (FwdBiasTraits: attn_bias and/or attn_mask without a block mask): 64 and 128
// (sm90fwdbias_* instantiations).
constexpr bool has_bias_kernel(int head_dim) { return head_dim == 64 || head_dim == 128; }
constexpr bool has_bias_kernel(int head_dim, int head_dim_v) { return head_dim_v == head_dim && has_bias_kernel(head_dim); }
// The mask kernel (FwdMaskTraits: attn_mask alone on the window kernel reading the packed bits):
// 64, 128 and 256 (sm90fwdmask_* instantiations).
constexpr bool has_mask_kernel(int head_dim) { return head_dim == 64 || head_dim == 128 || head_dim == 256; }
constexpr bool has_mask_kernel(int head_dim, int head_dim_v) { return head_dim_v == head_dim && has_mask_kernel(head_dim); }
// Whether a call with attn_mask (no block mask) takes the mask kernel rather than the bias
// kernel: no attn_bias, softcap or ALiBi.
bool takes_mask_kernel(const ForwardParams& p) {
  return p.mask.defined() && !p.bias.defined() && p.softcap <= 0.0f && p.alibi == nullptr;
}
// Whether a call without bias, masks or block masks takes the short-rows kernels
// (FwdShortRowsTraits: d64 and d128 masked or not, d256 masked): the dispatch below, and the tile whose
// CTAs fwd_declines' split heuristic counts. The conditions are by_mask's (variants.h) for the
// instantiations without score modifiers.
bool takes_short_rows(const ForwardParams& p) {
  return fwd_has_short_rows(p.head_dim, p.head_dim_v, p.has_window()) && p.softcap <= 0.0f && p.alibi == nullptr &&
         !p.has_dropout() && p.seqlen_q <= fwd_short_rows_max_seqlen(p.head_dim);
}

// Requested-split-free launches (num_splits 0) that the sm80 launcher would split, since the grid
// of `tile`'s query tiles leaves SMs idle (split_heuristic.h) over `keys` keys: those stay on sm80
// until the sm90 kernels split keys themselves. Empty when the grid is not split.
std::string split_heuristic_declines(const ForwardParams& p, const FwdTile& tile, int keys) {
  int sms = 0;
  if (!multiprocessors(&sms).ok()) return "device query failed";
  const int bm = 64 * tile.consumers, bn = tile.block_n;
  const long long ctas = static_cast<long long>((p.seqlen_q + bm - 1) / bm) * p.heads * p.batch;
  return choose_num_splits(ctas, (keys + bn - 1) / bn, sms, 1) > 1 ? "the split-KV heuristic splits" : "";
}

}  // namespace

std::string fwd_declines(const ForwardParams& p, bool any_runnable) {
  if (!has_kernel(p.head_dim)) return "head_dim is not 64, 128, 192 or 256";
  if (!head_dim_built(p.head_dim)) return "head_dim not built";
  // cuda_backend.cu pads every other head_dim_v != head_dim call to one head dim first.
  if (!has_kernel(p.head_dim, p.head_dim_v)) return "head_dim_v differs from head_dim (other than 192 / 128)";
  if (p.has_dropout()) return "dropout runs on sm80";
  // Even when FLASHATTN_CUDA_PATH=sm90 asks for every call the kernels can run, these calls
  // always go to sm80: the sm90 kernels have no reading of them.
  const bool sparse = p.block_mask.defined() || p.has_block_lists();
  if (p.bias.defined() && sparse) return "attn_bias with a block mask runs on sm80";
  if (!sparse && takes_mask_kernel(p)) {
    // FwdMaskTraits: attn_mask alone at head dims 64, 128 and 256.
    if (!has_mask_kernel(p.head_dim, p.head_dim_v)) {
      return "attn_mask without a block mask at this head dim runs on sm80 (sm90: 64, 128 and 256)";
    }
  } else if ((p.bias.defined() || p.mask.defined()) && !sparse) {
    // FwdBiasTraits (fwd_kernel.h, "Bias"): attn_bias and/or attn_mask at head dims 64 and 128.
    if (!has_bias_kernel(p.head_dim, p.head_dim_v)) {
      return p.bias.defined() ? "attn_bias at this head dim runs on sm80 (sm90: 64 and 128)"
                              : "attn_mask without a block mask at this head dim runs on sm80 (sm90: 64 and 128)";
    }
    if (p.bias.defined()) {  // the copy engine moves the bias tile (fwd_launch.h)
      if (const char* why = bias_map_declines(p.bias)) return why;
    }
  }
  if (broadcast_operand(p, p.q_strides, p.heads) || broadcast_operand(p, p.k_strides, p.heads_k) ||
      broadcast_operand(p, p.v_strides, p.heads_k)) {
    return "a broadcast (stride 0) operand";
  }
  if (p.num_splits > 1) return "split-KV runs on sm80";
  if (any_runnable) return {};
  if (p.seqlen_q <= 16) return "at most 16 query rows: the sm80 decode shape";
  if (p.num_splits == 0) {
    // Not sparse here with a bias or mask: the bias kernel's tile, or the window kernel's.
    const bool bias = (p.bias.defined() || p.mask.defined()) && !takes_mask_kernel(p);
    const FwdTile tile = sparse || bias             ? fwd_sparse_tile(p.head_dim, p.head_dim_v)
                         : p.mask.defined()         ? fwd_mask_tile(p.head_dim)
                         : takes_short_rows(p)      ? fwd_short_rows_tile(p.head_dim, p.has_window())
                                                    : fwd_tile(p.head_dim, p.head_dim_v, p.has_window());
    // (The masked d64 short tile's 64-key blocks (s33) count twice the blocks of the 128-key tile
    // before it: such a call with fewer than ~66 64-row tiles and 65-128 keys now goes to sm80.)
    return split_heuristic_declines(p, tile, p.seqlen_k);
  }
  return {};
}

// dispatch_variant (common/variants.h) turns the options into template arguments, as for the sm80
// kernels; fwd_declines has already left the combinations without an sm90 kernel to those. The
// one head_dim_v != head_dim pair (192 / 128) is the run-time branch inside head dim 192.
// attn_bias and/or attn_mask without a block mask take the bias kernels (FwdBiasTraits, window
// mask only as the sparse ones); attn_mask alone without softcap or ALiBi the mask kernels
// (FwdMaskTraits).
// A block mask (either form, with or without attn_mask) takes the block-sparse kernels
// (FwdSparseTraits), instantiated with the window mask only: with no window it costs one range
// test per key tile.
Status dispatch_fwd(const ForwardParams& p, cudaStream_t stream) {
  const bool sparse = p.block_mask.defined() || p.has_block_lists();
  const bool bias = !sparse && (p.bias.defined() || p.mask.defined());
  const bool mask_only = bias && takes_mask_kernel(p);
  return dispatch_variant(p, [&]<typename Element, int kHeadDim, MaskMode kMask, ScoreMods kMods>() -> Status {
    constexpr bool kMods90 = kMods == ScoreMods::kAny;  // fwd_declines left softcap and ALiBi alone (no dropout)
    // attn_bias and/or attn_mask without a block mask: one kernel per head dim and dtype (window
    // mask, softcap and ALiBi at run time), whatever kMask and kMods say.
    if (bias) {
      if constexpr (has_mask_kernel(kHeadDim)) {
        if (mask_only && p.head_dim_v == kHeadDim) return run_fwd<FwdMaskTraits<Element, kHeadDim>>(p, stream);
      }
      if constexpr (has_bias_kernel(kHeadDim)) {
        if (p.head_dim_v == kHeadDim) return run_fwd<FwdBiasTraits<Element, kHeadDim>>(p, stream);
      }
      return Status::NotSupported("the sm90 bias forward has no kernel for head_dim " + std::to_string(kHeadDim) +
                                  " with head_dim_v " + std::to_string(p.head_dim_v));
    }
    if (sparse) {
      if constexpr (kHeadDim == 192 && (kMods == ScoreMods::kNone || kMods90)) {
        if (p.head_dim_v == 128) {
          return run_fwd<FwdSparseTraits<Element, 192, MaskMode::kWindow, kMods90, 128>>(p, stream);
        }
      }
      if (p.head_dim_v != kHeadDim) {
        return Status::NotSupported("the sm90 block-sparse forward has no kernel for head_dim " +
                                    std::to_string(kHeadDim) + " with head_dim_v " + std::to_string(p.head_dim_v));
      }
      if constexpr (has_kernel(kHeadDim) && (kMods == ScoreMods::kNone || kMods90)) {
        return run_fwd<FwdSparseTraits<Element, kHeadDim, MaskMode::kWindow, kMods90>>(p, stream);
      } else {
        return Status::NotSupported("the sm90 block-sparse forward has no kernel for head_dim " +
                                    std::to_string(kHeadDim));
      }
    }
    if constexpr (kHeadDim == 192 && (kMods == ScoreMods::kNone || kMods90)) {
      if (p.head_dim_v == 128) return run_fwd<FwdTraits<Element, 192, kMask, kMods90, 128>>(p, stream);
    }
    if (p.head_dim_v != kHeadDim) {
      return Status::NotSupported("the sm90 forward has no kernel for head_dim " + std::to_string(kHeadDim) +
                                  " with head_dim_v " + std::to_string(p.head_dim_v));
    }
    if constexpr (fwd_has_short_rows(kHeadDim, kHeadDim, kMask == MaskMode::kWindow) && kMods == ScoreMods::kNone) {
      if (takes_short_rows(p)) return run_fwd<FwdShortRowsTraits<Element, kHeadDim, kMask>>(p, stream);
    }
    if constexpr (has_kernel(kHeadDim) && kMods == ScoreMods::kNone) {
      return run_fwd<FwdTraits<Element, kHeadDim, kMask>>(p, stream);
    } else if constexpr (has_kernel(kHeadDim) && kMods90) {
      return run_fwd<FwdTraits<Element, kHeadDim, kMask, true>>(p, stream);
    } else {
      return Status::NotSupported("the sm90 forward has no kernel for head_dim " + std::to_string(kHeadDim) +
                                  " with score modifiers " + (kMods == ScoreMods::kNone ? "off" : "on"));
    }
  });
}

// The cache kernel (FwdCacheTraits): head dims 64, 128 and 256, head_dim_v the same, 16-bit
// caches (sm90fwdcache{,mods}_* instantiations).
constexpr int kCacheHeadDims = head_dim_bit(64) | head_dim_bit(128) | head_dim_bit(256);

std::string fwd_cache_declines(const ForwardParams& p) {
  if (!p.kv.enabled) return "not a KV-cache call";
  if (!head_dim_in(p.head_dim, kCacheHeadDims) || p.head_dim_v != p.head_dim) {
    return "head_dim is not 64, 128 or 256 with head_dim_v the same";
  }
  if (!head_dim_built(p.head_dim)) return "head_dim not built";
  if (p.kv_dtype != p.dtype) return "a float8_e4m3 cache runs on sm80";
  if (p.has_dropout()) return "dropout runs on sm80";
  if (p.has_score_mods()) return "attn_bias, attn_mask and block masks run on sm80";
  if (p.num_splits > 1) return "split-KV runs on sm80";
  if (p.q_fold != 1) return "folded query rows run on sm80";
  // A dense call's sequences all have seqlen_q rows; a varlen call's longest has max_seqlen_q
  // (under Switch::kDecodeShare its decoding sequences, a chunked-prefill step's, run in a
  // launch of their own on the sm80 decode tiles: cuda_backend.cu run_kvcache).
  if (p.seqlen_q < kFwdCacheMinQueries) {
    return "a decode shape (fewer than 128 query rows in every sequence): the sm80 cache kernels";
  }
  if (broadcast_operand(p, p.q_strides, p.heads)) return "a broadcast (stride 0) q";
  // As fwd_declines; the keys per sequence are not known on the host: the capacity
  // (max_seqlen_k for a varlen call) stands for them, as in the sm80 split choice.
  if (p.num_splits == 0) {
    return split_heuristic_declines(p, fwd_sparse_tile(p.head_dim, p.head_dim_v),
                                    p.is_varlen() ? p.seqlen_k : p.kv.capacity);
  }
  return {};
}

// Whatever kMask says (the window kernel serves calls without a window); kMods picks the plain or
// the modifier kernel (softcap, ALiBi at run time).
Status dispatch_fwd_cache(const ForwardParams& p, cudaStream_t stream) {
  return dispatch_variant<false, kCacheHeadDims>(
      p, [&]<typename Element, int kHeadDim, MaskMode kMask, ScoreMods kMods>() -> Status {
        if constexpr (kMods == ScoreMods::kNone) {
          return run_fwd<FwdCacheTraits<Element, kHeadDim, false>>(p, stream);
        } else if constexpr (kMods == ScoreMods::kAny) {
          return run_fwd<FwdCacheTraits<Element, kHeadDim, true>>(p, stream);
        } else {
          return Status::NotSupported("the sm90 KV-cache forward takes no attn_bias or masks");
        }
      });
}

}  // namespace flashattn::cuda::sm90
