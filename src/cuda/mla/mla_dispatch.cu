// The MLA decode's host checks and its dtype dispatch (mla.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>

#include "cuda/common/build_config.h"
#include "cuda/mla/mla.h"
#include "cuda/mla/mla_kernel.h"

namespace flashattn::cuda::mla {

std::string declines(const ForwardParams& p) {
  const std::string why = " is not supported by the CUDA MLA decode (head_dim 576, head_dim_v 512; the cpu "
                          "backend implements it)";
  if (p.kv_dtype == DType::kFloat8E4M3) return "k_cache/v_cache of dtype float8_e4m3" + why;
  if (p.softcap > 0.0f) return "softcap" + why;
  if (p.alibi != nullptr) return "alibi_slopes" + why;
  if (p.has_window() && !p.is_causal) return "window_size (a sliding window)" + why;
  if (p.has_dropout()) return "dropout_p" + why;
  if (p.has_score_mods()) return "attn_bias/attn_mask/block_mask" + why;
  if (p.is_varlen()) return "a varlen call with block_table (cu_seqlens_q)" + why;
  if (p.seqlen_q > kMaxSeqlenQ) {
    return "seqlen_q " + std::to_string(p.seqlen_q) + " (more than " + std::to_string(kMaxSeqlenQ) +
           " query tokens)" + why;
  }
  // Rotary on a latent cache: the new keys' rotated columns [0, rotary_dim) are V's columns too,
  // so the cache would hold neither the caller's V nor its rotated K (docs/SEMANTICS.md).
  if (p.kv.rotary_dim > 0 && v_aliases_k(p)) {
    return "rotary_cos/rotary_sin with v_cache a view of k_cache (the shared latent cache)" + why;
  }
  return "";
}

Status dispatch_decode(const ForwardParams& p, cudaStream_t stream) {
#if defined(FLASHATTN_CUDA_HDIM_576) && defined(FLASHATTN_CUDA_DTYPE_BF16)
  if (p.dtype == DType::kBFloat16) return run_decode<__nv_bfloat16>(p, stream);
#endif
#if defined(FLASHATTN_CUDA_HDIM_576) && defined(FLASHATTN_CUDA_DTYPE_FP16)
  if (p.dtype == DType::kFloat16) return run_decode<__half>(p, stream);
#endif
  (void)stream;
  return Status::NotSupported(std::string("head_dim 576 (MLA decode) with dtype ") + dtype_name(p.dtype) +
                              " was not built into this flashattn (FLASHATTN_CUDA_HEAD_DIMS, FLASHATTN_CUDA_DTYPES)");
}

}  // namespace flashattn::cuda::mla
