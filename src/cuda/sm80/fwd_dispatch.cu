// The one place where the forward's run-time options become template arguments.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/common/build_config.h"
#include "cuda/sm80/fwd.h"
#include "cuda/sm80/fwd_kernel.h"

namespace flashattn::cuda {
namespace {

template <typename Element, int kHeadDim>
Status dispatch_mask(const ForwardParams& p, cudaStream_t stream) {
  const bool windowed = p.has_window();
  const bool mods = p.softcap > 0.0f || p.alibi != nullptr || p.has_dropout();
  if (windowed) {
    if (mods) return run_fwd<FwdTraits<Element, kHeadDim, MaskMode::kWindow, ScoreMods::kAny>>(p, stream);
    return run_fwd<FwdTraits<Element, kHeadDim, MaskMode::kWindow, ScoreMods::kNone>>(p, stream);
  }
  if (mods) return run_fwd<FwdTraits<Element, kHeadDim, MaskMode::kNone, ScoreMods::kAny>>(p, stream);
  return run_fwd<FwdTraits<Element, kHeadDim, MaskMode::kNone, ScoreMods::kNone>>(p, stream);
}

template <typename Element>
Status dispatch_head_dim(const ForwardParams& p, cudaStream_t stream) {
  switch (p.head_dim) {
#ifdef FLASHATTN_CUDA_HDIM_32
    case 32: return dispatch_mask<Element, 32>(p, stream);
#endif
#ifdef FLASHATTN_CUDA_HDIM_64
    case 64: return dispatch_mask<Element, 64>(p, stream);
#endif
#ifdef FLASHATTN_CUDA_HDIM_96
    case 96: return dispatch_mask<Element, 96>(p, stream);
#endif
#ifdef FLASHATTN_CUDA_HDIM_128
    case 128: return dispatch_mask<Element, 128>(p, stream);
#endif
#ifdef FLASHATTN_CUDA_HDIM_192
    case 192: return dispatch_mask<Element, 192>(p, stream);
#endif
#ifdef FLASHATTN_CUDA_HDIM_256
    case 256: return dispatch_mask<Element, 256>(p, stream);
#endif
    default:
      return Status::NotSupported("head_dim " + std::to_string(p.head_dim) +
                                  " was not built into this flashattn (FLASHATTN_CUDA_HEAD_DIMS)");
  }
}

// Decode with grouped KV heads: a single query token per sequence would fill one row of a
// 128-row tile. Folding the `heads / heads_k` query heads that share a KV head into the query
// sequence (q viewed as (batch, group, heads_k, d)) gives each CTA `group` useful rows and reads
// each KV head once instead of once per query head. Exact only when every folded row sees the
// same keys with the same scores: no left window, no ALiBi (per-head slopes), no dropout (the
// mask is indexed by head and row); LSE must have a unit head stride to keep unit row stride.
ForwardParams fold_gqa_decode(const ForwardParams& p) {
  const bool foldable = p.seqlen_q == 1 && p.heads > p.heads_k && !p.is_varlen() && p.alibi == nullptr &&
                        !p.has_dropout() && p.window_left < 0 && (p.lse == nullptr || p.lse_head_stride == 1);
  if (!foldable) return p;
  const int group = p.heads / p.heads_k;
  ForwardParams f = p;
  f.seqlen_q = group;
  f.heads = p.heads_k;
  f.total_q = int64_t(p.batch) * group;
  f.q_strides = Strides3{p.q_strides.batch, p.q_strides.head, p.q_strides.head * group};
  f.out_strides = Strides3{p.out_strides.batch, p.out_strides.head, p.out_strides.head * group};
  f.lse_head_stride = p.lse_head_stride * group;
  // With one query, a right window (causal included) hides no key: seqlen_k - 1 + right >= the
  // last key. Drop it, since the folded rows would otherwise be masked differently.
  f.window_left = f.window_right = -1;
  f.is_causal = false;
  return f;
}

}  // namespace

Status dispatch_fwd(const ForwardParams& params, cudaStream_t stream) {
  const ForwardParams p = fold_gqa_decode(params);
  switch (p.dtype) {
#ifdef FLASHATTN_CUDA_DTYPE_FP16
    case DType::kFloat16: return dispatch_head_dim<__half>(p, stream);
#endif
#ifdef FLASHATTN_CUDA_DTYPE_BF16
    case DType::kBFloat16: return dispatch_head_dim<__nv_bfloat16>(p, stream);
#endif
    default:
      return Status::NotSupported(std::string("q has dtype ") + dtype_name(p.dtype) +
                                  ", which this flashattn CUDA build does not include "
                                  "(FLASHATTN_CUDA_DTYPES)");
  }
}

}  // namespace flashattn::cuda
