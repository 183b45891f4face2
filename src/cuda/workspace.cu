#include <atomic>
#include <cstdint>

#include "cuda/common/cuda_check.h"
#include "cuda/common/workspace.h"

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

}  // namespace

Status workspace_alloc(void** ptr, size_t bytes, cudaStream_t stream) {
  if (Status s = configure_default_pool_once(); !s.ok()) return s;
  return cuda_status(cudaMallocAsync(ptr, bytes, stream), "allocating the kernel workspace (cudaMallocAsync)");
}

Status workspace_free(void* ptr, cudaStream_t stream) {
  return cuda_status(cudaFreeAsync(ptr, stream), "freeing the kernel workspace (cudaFreeAsync)");
}

}  // namespace flashattn::cuda
