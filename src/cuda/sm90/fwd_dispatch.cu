// The one place where the Hopper forward's run-time options become template arguments.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/common/build_config.h"
#include "cuda/common/split_heuristic.h"
#include "cuda/common/cuda_check.h"
#include "cuda/sm90/fwd.h"
#include "cuda/sm90/fwd_traits.h"

namespace flashattn::cuda::sm90 {
namespace {

template <typename Element, int kHeadDim>
Status by_mask(const ForwardParams& p, cudaStream_t stream) {
  if (p.has_window()) return run_fwd<FwdTraits<Element, kHeadDim, MaskMode::kWindow>>(p, stream);
  return run_fwd<FwdTraits<Element, kHeadDim, MaskMode::kNone>>(p, stream);
}

template <typename Element>
Status by_head_dim(const ForwardParams& p, cudaStream_t stream) {
  switch (p.head_dim) {
#ifdef FLASHATTN_CUDA_HDIM_64
    case 64: return by_mask<Element, 64>(p, stream);
#endif
#ifdef FLASHATTN_CUDA_HDIM_128
    case 128: return by_mask<Element, 128>(p, stream);
#endif
#ifdef FLASHATTN_CUDA_HDIM_256
    case 256: return by_mask<Element, 256>(p, stream);
#endif
    default: return Status::NotSupported("the sm90 forward has no kernel for head_dim " + std::to_string(p.head_dim));
  }
}


}  // namespace

std::string fwd_declines(const ForwardParams& p, bool any_runnable) {
  if (p.head_dim != 64 && p.head_dim != 128 && p.head_dim != 256) return "head_dim is not 64, 128 or 256";
  if (!head_dim_built(p.head_dim)) return "head_dim not built";
  if (p.head_dim_v != p.head_dim) return "head_dim_v differs from head_dim";
  if (p.softcap > 0.0f || p.alibi != nullptr || p.has_dropout()) return "softcap, ALiBi and dropout run on sm80";
  // A broadcast operand (stride 0 over a dimension of extent > 1) has no tensor map.
  const auto broadcast = [&](const Strides3& s, int heads) {
    return s.row == 0 || (heads > 1 && s.head == 0) || (!p.is_varlen() && p.batch > 1 && s.batch == 0);
  };
  if (broadcast(p.q_strides, p.heads) || broadcast(p.k_strides, p.heads_k) || broadcast(p.v_strides, p.heads_k)) {
    return "a broadcast (stride 0) operand";
  }
  if (p.num_splits > 1) return "split-KV runs on sm80";
  if (any_runnable) return {};
  if (p.seqlen_q <= 16) return "at most 16 query rows: the sm80 decode shape";
  if (p.num_splits == 0) {
    // The sm80 launcher would split a grid that leaves SMs idle (split_heuristic.h); keep those
    // launches there until the sm90 kernel splits keys itself.
    int device = 0, sms = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
      return "device query failed";
    }
    const FwdTile tile = fwd_tile(p.head_dim, p.has_window());
    const int bm = 64 * tile.consumers, bn = tile.block_n;
    const long long ctas = static_cast<long long>((p.seqlen_q + bm - 1) / bm) * p.heads * p.batch;
    if (choose_num_splits(ctas, (p.seqlen_k + bn - 1) / bn, sms, 1) > 1) return "the split-KV heuristic splits";
  }
  return {};
}

Status dispatch_fwd(const ForwardParams& p, cudaStream_t stream) {
  switch (p.dtype) {
#ifdef FLASHATTN_CUDA_DTYPE_FP16
    case DType::kFloat16: return by_head_dim<__half>(p, stream);
#endif
#ifdef FLASHATTN_CUDA_DTYPE_BF16
    case DType::kBFloat16: return by_head_dim<__nv_bfloat16>(p, stream);
#endif
    default: return Status::NotSupported("the sm90 forward has no kernel for this dtype");
  }
}

}  // namespace flashattn::cuda::sm90
