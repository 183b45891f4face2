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

// Whether the split-KV combine may start as a programmatic dependent launch of the split kernel
// (fwd_launch.h): the device is compute 9.0+ and `combine` was compiled for compute 9.0+ (its
// grid-dependency wait exists). Cached per device.
Status combine_waits_for_partials(const void* combine, bool* dependent);

// The most splits a decode row group runs as one thread-block cluster (the portable cluster
// size; 12 and 16 measured slower than 8, fwd_launch.h).
constexpr int kMaxSplitCluster = 8;

// The launch configuration of a split-KV decode grid whose splits of each row group form one
// thread-block cluster: cluster dims (1, 1, splits) over grid (m_blocks, heads, batch * splits),
// so a cluster is one row group's splits and a CTA's cluster rank is its split
// (fwd_kernel.h merge_splits_in_cluster). Not copyable: config points at the attribute.
struct SplitClusterLaunch {
  cudaLaunchAttribute attribute[1] = {};
  cudaLaunchConfig_t config = {};

  SplitClusterLaunch(dim3 grid, int threads, size_t smem, int splits, cudaStream_t stream) {
    attribute[0].id = cudaLaunchAttributeClusterDimension;
    attribute[0].val.clusterDim.x = 1;
    attribute[0].val.clusterDim.y = 1;
    attribute[0].val.clusterDim.z = unsigned(splits);
    config.gridDim = grid;
    config.blockDim = dim3(unsigned(threads));
    config.dynamicSmemBytes = smem;
    config.stream = stream;
    config.attrs = attribute;
    config.numAttrs = 1;
  }
  SplitClusterLaunch(const SplitClusterLaunch&) = delete;
  SplitClusterLaunch& operator=(const SplitClusterLaunch&) = delete;
};

// Whether the decode kernel `kernel` (threads, dynamic shared memory `smem`) may run the splits
// of each row group as one cluster of `splits` CTAs and merge them in distributed shared memory
// (fwd_kernel.h merge_splits_in_cluster): the device is compute 9.x, the kernel was compiled for
// compute 9.0 (the cluster code exists there) and at least one such cluster fits on the device.
// At most kMaxSplitCluster splits. Cached per (device, kernel, smem, splits).
Status split_cluster_fits(const void* kernel, int threads, size_t smem, int splits, bool* fits);

// Launches a split-KV combine kernel, combine(params), over grid x block: a programmatic
// dependent launch of the split kernel where combine_waits_for_partials says it may be (it
// starts while the split grid's last CTAs run and waits for their partials in the kernel),
// else a plain launch. `what` names it in the error.
template <typename Kernel>
Status launch_combine_after_splits(Kernel combine, dim3 grid, dim3 block, const ForwardParams& params,
                                   cudaStream_t stream, const char* what) {
  bool dependent = false;
  if (Status s = combine_waits_for_partials(reinterpret_cast<const void*>(combine), &dependent); !s.ok()) return s;
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

}  // namespace flashattn::cuda
