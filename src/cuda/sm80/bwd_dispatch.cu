// The one place where the backward's run-time options become template arguments.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>

#include "cuda/common/build_config.h"
#include "cuda/sm80/bwd.h"
#include "cuda/sm80/bwd_common.h"

namespace flashattn::cuda {
namespace {

template <typename Element, int kHeadDim>
Status dispatch_mask(const BackwardParams& p, cudaStream_t stream) {
  const bool windowed = p.has_window();
  const bool mods = p.softcap > 0.0f || p.alibi != nullptr || p.has_dropout();
  if (windowed) {
    if (mods) return run_bwd<BwdTraits<Element, kHeadDim, MaskMode::kWindow, ScoreMods::kAny>>(p, stream);
    return run_bwd<BwdTraits<Element, kHeadDim, MaskMode::kWindow, ScoreMods::kNone>>(p, stream);
  }
  if (mods) return run_bwd<BwdTraits<Element, kHeadDim, MaskMode::kNone, ScoreMods::kAny>>(p, stream);
  return run_bwd<BwdTraits<Element, kHeadDim, MaskMode::kNone, ScoreMods::kNone>>(p, stream);
}

template <typename Element>
Status dispatch_head_dim(const BackwardParams& p, cudaStream_t stream) {
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

}  // namespace

Status dispatch_bwd(const BackwardParams& p, cudaStream_t stream) {
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
