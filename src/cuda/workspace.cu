#include <algorithm>
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "cuda/common/cuda_check.h"
#include "cuda/common/workspace.h"
#include "core/workspace_allocator.h"

namespace flashattn::cuda {
namespace {

constexpr int kMaxDevices = 64;
std::atomic<bool> g_pool_configured[kMaxDevices];

Status configure_default_pool_once() {
  int device = 0;
  FLASHATTN_CUDA_TRY(cudaGetDevice(&device));
  if (device < 0 || device >= kMaxDevices || g_pool_configured[device].exchange(true)) return Status::Ok();
  cudaMemPool_t pool;
  FLASHATTN_CUDA_TRY(cudaDeviceGetDefaultMemPool(&pool, device));
  uint64_t threshold = 0;  // cuuint64_t in the driver API
  FLASHATTN_CUDA_TRY(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
  if (threshold == 0) {
    threshold = kWorkspaceCacheBytes;
    FLASHATTN_CUDA_TRY(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
  }
  return Status::Ok();
}

// Split-KV counters of one device (split_counters).
struct CounterState {
  std::mutex mutex;
  cudaStream_t zeroing = nullptr;  // a private non-blocking stream for the one-time memsets
  struct Buffer {
    uint32_t* ptr = nullptr;
    size_t capacity = 0;
  };
  // Keyed by stream and, for cudaStreamPerThread (a different stream on every host thread), the
  // calling thread.
  std::map<std::pair<cudaStream_t, std::thread::id>, Buffer> per_stream;
  Buffer capture;          // the current block captured launches take fresh ranges from
  size_t capture_used = 0;
  std::vector<uint32_t*> kept;  // replaced or filled buffers: never freed (queued work or graphs)
};
CounterState g_counters[kMaxDevices];

constexpr size_t kStreamCounters = size_t(1) << 12;   // first buffer of a stream: 16 KB
constexpr size_t kCaptureCounters = size_t(1) << 16;  // capture blocks: 256 KB

// cudaMalloc and a zeroing memset on the private stream, waited for. Run in relaxed capture mode:
// during a capture elsewhere (global mode) the allocation would otherwise be refused; neither
// call touches a capturing stream.
Status alloc_zeroed(CounterState& state, size_t count, uint32_t** ptr) {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  FLASHATTN_CUDA_TRY(cudaThreadExchangeStreamCaptureMode(&mode));
  Status status = Status::Ok();
  if (state.zeroing == nullptr) {
    status = cuda_status(cudaStreamCreateWithFlags(&state.zeroing, cudaStreamNonBlocking),
                         "creating the split-counter stream");
  }
  if (status.ok()) {
    status = cuda_status(cudaMalloc(reinterpret_cast<void**>(ptr), count * sizeof(uint32_t)),
                         "allocating the split-KV counters (cudaMalloc)");
  }
  if (status.ok()) {
    status = cuda_status(cudaMemsetAsync(*ptr, 0, count * sizeof(uint32_t), state.zeroing),
                         "zeroing the split-KV counters");
  }
  if (status.ok()) status = cuda_status(cudaStreamSynchronize(state.zeroing), "zeroing the split-KV counters");
  FLASHATTN_CUDA_TRY(cudaThreadExchangeStreamCaptureMode(&mode));
  return status;
}

}  // namespace

Status split_counters(size_t count, cudaStream_t stream, uint32_t** counters) {
  *counters = nullptr;
  if (count == 0 || count > kMaxSplitCounters) return Status::Ok();
  int device = 0;
  FLASHATTN_CUDA_TRY(cudaGetDevice(&device));
  if (device < 0 || device >= kMaxDevices) return Status::Ok();
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  FLASHATTN_CUDA_TRY(cudaStreamIsCapturing(stream, &capture));
  CounterState& state = g_counters[device];
  std::lock_guard<std::mutex> lock(state.mutex);
  if (capture != cudaStreamCaptureStatusNone) {
    if (state.capture.ptr == nullptr || state.capture_used + count > state.capture.capacity) {
      if (state.capture.ptr != nullptr) state.kept.push_back(state.capture.ptr);
      state.capture = {};
      const size_t capacity = std::max(kCaptureCounters, count);
      if (Status s = alloc_zeroed(state, capacity, &state.capture.ptr); !s.ok()) return s;
      state.capture.capacity = capacity;
      state.capture_used = 0;
    }
    *counters = state.capture.ptr + state.capture_used;
    state.capture_used += count;
    return Status::Ok();
  }
  const std::thread::id thread = stream == cudaStreamPerThread ? std::this_thread::get_id() : std::thread::id();
  CounterState::Buffer& buffer = state.per_stream[{stream, thread}];
  if (buffer.capacity < count) {
    if (buffer.ptr != nullptr) state.kept.push_back(buffer.ptr);
    buffer = {};
    size_t capacity = kStreamCounters;
    while (capacity < count) capacity *= 2;
    if (Status s = alloc_zeroed(state, capacity, &buffer.ptr); !s.ok()) return s;
    buffer.capacity = capacity;
  }
  *counters = buffer.ptr;
  return Status::Ok();
}

Status workspace_alloc(void** ptr, size_t bytes, cudaStream_t stream) {
  *ptr = nullptr;
  if (detail::hook_takes(bytes)) {
    // Not while the stream is captured: the pool's allocation becomes a memory node the graph
    // owns, while the application's block would go back to it when the call returns.
    // A query the runtime refuses (the legacy stream during another thread's global capture)
    // counts as a capture: the pool serves.
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess) {
      capture = cudaStreamCaptureStatusActive;
      (void)cudaGetLastError();  // the refusal is not sticky; clear it so no later check reports it
    }
    if (capture == cudaStreamCaptureStatusNone && (*ptr = detail::hooked_allocate(bytes, stream)) != nullptr) {
      return Status::Ok();
    }
  }
  if (Status s = configure_default_pool_once(); !s.ok()) return s;
  return cuda_status(cudaMallocAsync(ptr, bytes, stream), "allocating the kernel workspace (cudaMallocAsync)");
}

Status workspace_free(void* ptr, cudaStream_t stream) {
  if (detail::hooked_release(ptr, stream)) return Status::Ok();
  return cuda_status(cudaFreeAsync(ptr, stream), "freeing the kernel workspace (cudaFreeAsync)");
}

}  // namespace flashattn::cuda
