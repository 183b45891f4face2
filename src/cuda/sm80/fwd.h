// Declarations shared by the forward dispatch and the generated instantiations.
#pragma once

#include <cuda_runtime.h>

#include "core/params.h"
#include "cuda/common/cuda_check.h"

namespace flashattn::cuda {

// Defined in fwd_launch.h; each traits is instantiated in its own generated .cu file.
template <typename Traits>
Status run_fwd(const ForwardParams& params, cudaStream_t stream);

template <typename Traits>
Status run_fwd_kvcache(const ForwardParams& params, cudaStream_t stream);

// The same with an e4m3 cache (params.kv_dtype) read by 16-bit queries.
template <typename Traits>
Status run_fwd_kvcache_fp8(const ForwardParams& params, cudaStream_t stream);

// Whether the device is compute 9.0+ and `kernel` was compiled for compute 9.0+, so that its
// sm90-only code exists (the combine kernels' grid-dependency wait, which lets them start as a
// programmatic dependent launch of the split kernel; the decode kernels' cluster merge). Every
// kernel of one build has the same PTX target: cached as one answer per device.
Status compute90_code(const void* kernel, bool* yes);

// The most splits a decode row group runs as one thread-block cluster (the portable cluster
// size; 12 and 16 measured slower than 8, fwd_launch.h).
constexpr int kMaxSplitCluster = 8;

// Whether the decode kernel `kernel` (threads, dynamic shared memory `smem`) may run the splits
// of each row group as one cluster of `splits` CTAs (cluster dims (1, 1, splits) over the grid
// (m_blocks, heads, batch * splits): one row group's splits, cluster rank = split) and merge them
// in distributed shared memory (fwd_kernel.h merge_splits_in_cluster): at most kMaxSplitCluster
// splits, the device is compute 9.x, the kernel carries compute 9.0 code (the cluster code
// exists there: compute90_code) and at least one such cluster fits (active_clusters).
Status split_cluster_fits(const void* kernel, int threads, size_t smem, int splits, bool* fits);

// Launches a split-KV combine kernel, combine(params), over grid x block: a programmatic
// dependent launch of the split kernel where compute90_code says it may be (it
// starts while the split grid's last CTAs run and waits for their partials in the kernel),
// else a plain launch. `what` names it in the error.
template <typename Kernel>
Status launch_combine_after_splits(Kernel combine, dim3 grid, dim3 block, const ForwardParams& params,
                                   cudaStream_t stream, const char* what) {
  bool dependent = false;
  if (Status s = compute90_code(reinterpret_cast<const void*>(combine), &dependent); !s.ok()) return s;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.stream = stream;
  config.attrs = attribute;
  config.numAttrs = dependent ? 1 : 0;
  return cuda_status(cudaLaunchKernelEx(&config, combine, params), what);
}

// Picks the instantiation for params (dtype, head dim, mask, score modifiers) and launches it.
Status dispatch_fwd(const ForwardParams& params, cudaStream_t stream);
// The same for forward_kvcache (params.kv.enabled; K and V are the cache), after the append;
// an e4m3 cache (params.kv_dtype) runs the FwdTraits::Fp8Cache kernels, at kFp8CacheHeadDims.
Status dispatch_fwd_kvcache(const ForwardParams& params, cudaStream_t stream);
// The most query tokens per sequence that the decode tiles take well for params' options: as
// many as fold_gqa_tokens folds (GQA, 8-15 tokens), else one decode tile's 16 rows. A varlen
// cache call's sequences of at most this many tokens run in a launch of their own under
// detail::Switch::kDecodeShare (cuda_backend.cu run_kvcache).
int decode_tokens_max(const ForwardParams& params);

}  // namespace flashattn::cuda
