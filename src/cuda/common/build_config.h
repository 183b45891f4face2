// What this build instantiated. CMake defines FLASHATTN_CUDA_HDIM_<d> and
// FLASHATTN_CUDA_DTYPE_{FP16,BF16} for the selected head dims and element types
// (FLASHATTN_CUDA_HEAD_DIMS / FLASHATTN_CUDA_DTYPES); the dispatch consults these, so a
// trimmed build reports "not built" instead of failing to link.
#pragma once

#include "flashattn/types.h"

namespace flashattn::cuda {

constexpr int kAllHeadDims[] = {32, 64, 96, 128, 192, 256};

constexpr bool head_dim_built(int d) {
  switch (d) {
#ifdef FLASHATTN_CUDA_HDIM_32
    case 32: return true;
#endif
#ifdef FLASHATTN_CUDA_HDIM_64
    case 64: return true;
#endif
#ifdef FLASHATTN_CUDA_HDIM_96
    case 96: return true;
#endif
#ifdef FLASHATTN_CUDA_HDIM_128
    case 128: return true;
#endif
#ifdef FLASHATTN_CUDA_HDIM_192
    case 192: return true;
#endif
#ifdef FLASHATTN_CUDA_HDIM_256
    case 256: return true;
#endif
    default: return false;
  }
}

constexpr bool dtype_built(DType t) {
#ifdef FLASHATTN_CUDA_DTYPE_FP16
  if (t == DType::kFloat16) return true;
#endif
#ifdef FLASHATTN_CUDA_DTYPE_BF16
  if (t == DType::kBFloat16) return true;
#endif
  return false;
}

}  // namespace flashattn::cuda
