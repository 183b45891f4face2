// Stream-ordered scratch memory for the kernels (split-KV partials, backward accumulators).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "flashattn/types.h"

namespace flashattn::cuda {

// cudaMallocAsync on `stream` from the device's default memory pool. The pool's release
// threshold defaults to 0, which hands the memory back to the driver at every synchronisation,
// so a training loop would map and unmap its workspace on every call. The first allocation on
// a device therefore raises the threshold to kWorkspaceCacheBytes, but only if the application
// left it at 0 (a threshold the application set is never changed). Capturable in CUDA graphs.
// A workspace the application's allocator takes (flashattn::set_workspace_allocator: at least
// its min_bytes, and the stream not being captured) comes from it instead, and workspace_free
// gives it back there.
Status workspace_alloc(void** ptr, size_t bytes, cudaStream_t stream);
Status workspace_free(void* ptr, cudaStream_t stream);

constexpr size_t kWorkspaceCacheBytes = size_t(1) << 30;

// `count` uint32 counters, zero, for the fused split-KV combine (sm80/fwd_kernel.h
// merge_if_last_split), whose kernels leave them zero again: no memset per call and none in a
// captured CUDA graph. Allocated once (cudaMalloc, zeroed on a private stream) and kept for the
// process. No two launches that may run at the same time share counters: launches on one stream
// run in order, so each stream of a device (cudaStreamPerThread: of each host thread) has its
// own buffer (grown on demand; a replaced one is kept, since work already queued may still use
// it), and a launch being captured into a CUDA graph takes counters of its own that nothing else
// ever uses (the graph may be replayed on any stream). Two executable graphs instantiated from
// one captured graph share its counters and must not be replayed at the same time.
// *counters = nullptr (and Ok) when count exceeds kMaxSplitCounters: the caller merges with the
// combine kernel instead.
Status split_counters(size_t count, cudaStream_t stream, uint32_t** counters);

constexpr size_t kMaxSplitCounters = size_t(1) << 20;

}  // namespace flashattn::cuda
