// Host-side facts of a kernel that do not change between launches on a device: its raised
// dynamic shared-memory limit and its occupancy at a given block size and shared memory. Each is
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

}  // namespace flashattn::cuda
