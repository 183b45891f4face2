// Stream-ordered scratch memory for the kernels (split-KV partials, backward accumulators).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "flashattn/types.h"

namespace flashattn::cuda {

// cudaMallocAsync on `stream` from the device's default memory pool. The pool's release
// threshold defaults to 0, which hands the memory back to the driver at every synchronisation,
// so a training loop would map and unmap its workspace on every call. The first allocation on
// a device therefore raises the threshold to kWorkspaceCacheBytes, but only if the application
// left it at 0 (a threshold the application set is never changed). Capturable in CUDA graphs.
Status workspace_alloc(void** ptr, size_t bytes, cudaStream_t stream);
Status workspace_free(void* ptr, cudaStream_t stream);

constexpr size_t kWorkspaceCacheBytes = size_t(1) << 30;

}  // namespace flashattn::cuda
