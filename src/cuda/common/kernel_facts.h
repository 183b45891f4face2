// Host-side facts of a kernel that do not change between launches on a device: its raised
// dynamic shared-memory limit and its occupancy (CTAs per SM, or clusters) at a given block size
// and shared memory. Each is
// a CUDA runtime call of a microsecond or more of host time; decode and short training calls,
// whose latency is the host's, made them at every launch. Now each (kernel, device, value) is
// asked once per process and then read from a table under a mutex. A cudaDeviceReset would drop
// the raised limits with the context while the table keeps them: the library does not support
// resetting a device it has run on (nothing in it or its tests resets one).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "flashattn/types.h"

namespace flashattn::cuda {

// cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) on the
// current device, unless this process already raised that kernel's limit to `bytes` or more there.
Status raise_dynamic_smem(const void* kernel, size_t bytes);

template <typename Kernel>
Status raise_dynamic_smem(Kernel* kernel, size_t bytes) {
  return raise_dynamic_smem(reinterpret_cast<const void*>(kernel), bytes);
}

// cudaOccupancyMaxActiveBlocksPerMultiprocessor on the current device, cached per
// (kernel, device, threads, dynamic shared memory). Call after raise_dynamic_smem.
Status blocks_per_sm(const void* kernel, int threads, size_t smem, int* blocks);

template <typename Kernel>
Status blocks_per_sm(Kernel* kernel, int threads, size_t smem, int* blocks) {
  return blocks_per_sm(reinterpret_cast<const void*>(kernel), threads, smem, blocks);
}

// The current device's multiprocessor count (cached per device).
Status multiprocessors(int* sms);

// The current device's compute capability major (cached per device).
Status compute_major(int* major);

// A launch configuration whose CTAs form thread-block clusters of `cluster_z` along z (cluster
// dims (1, 1, cluster_z); gridDim.z a multiple of it). Not copyable: config points at the attribute.
struct ClusterLaunchZ {
  cudaLaunchAttribute attribute[1] = {};
  cudaLaunchConfig_t config = {};

  ClusterLaunchZ(dim3 grid, int threads, size_t smem, int cluster_z, cudaStream_t stream) {
    attribute[0].id = cudaLaunchAttributeClusterDimension;
    attribute[0].val.clusterDim.x = 1;
    attribute[0].val.clusterDim.y = 1;
    attribute[0].val.clusterDim.z = unsigned(cluster_z);
    config.gridDim = grid;
    config.blockDim = dim3(unsigned(threads));
    config.dynamicSmemBytes = smem;
    config.stream = stream;
    config.attrs = attribute;
    config.numAttrs = 1;
  }
  ClusterLaunchZ(const ClusterLaunchZ&) = delete;
  ClusterLaunchZ& operator=(const ClusterLaunchZ&) = delete;
};

// cudaOccupancyMaxActiveClusters of ClusterLaunchZ clusters of `cluster_z` CTAs on the current
// device, cached per (kernel, device, threads, dynamic shared memory, cluster_z). Call after
// raise_dynamic_smem. A query the device refuses counts 0 clusters and leaves no error behind
// for a later launch check.
Status active_clusters(const void* kernel, int threads, size_t smem, int cluster_z, int* clusters);

}  // namespace flashattn::cuda
