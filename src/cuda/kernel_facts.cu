#include "cuda/common/kernel_facts.h"

#include <map>
#include <mutex>
#include <tuple>

#include "cuda/common/cuda_check.h"

namespace flashattn::cuda {
namespace {

std::mutex g_mutex;
std::map<std::pair<const void*, int>, size_t> g_smem_limit;                    // (kernel, device) -> bytes
std::map<std::tuple<const void*, int, int, size_t>, int> g_occupancy;          // (kernel, device, threads, smem)
std::map<int, int> g_sms;                                                      // device -> multiprocessors
std::map<int, int> g_major;                                                    // device -> compute major
std::map<std::tuple<const void*, int, int, size_t, int>, int> g_clusters;      // (..., cluster_z)

}  // namespace

Status raise_dynamic_smem(const void* kernel, size_t bytes) {
  int device = 0;
  FLASHATTN_CUDA_TRY(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(g_mutex);
  size_t& raised = g_smem_limit[{kernel, device}];
  if (raised >= bytes) return Status::Ok();
  FLASHATTN_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
  raised = bytes;
  return Status::Ok();
}

Status blocks_per_sm(const void* kernel, int threads, size_t smem, int* blocks) {
  int device = 0;
  FLASHATTN_CUDA_TRY(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(g_mutex);
  const auto key = std::make_tuple(kernel, device, threads, smem);
  if (const auto it = g_occupancy.find(key); it != g_occupancy.end()) {
    *blocks = it->second;
    return Status::Ok();
  }
  FLASHATTN_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks, kernel, threads, smem));
  g_occupancy[key] = *blocks;
  return Status::Ok();
}

// One device attribute of the current device, read once per device into `cache`.
static Status cached_attribute(std::map<int, int>& cache, cudaDeviceAttr attr, int* value) {
  int device = 0;
  FLASHATTN_CUDA_TRY(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(g_mutex);
  if (const auto it = cache.find(device); it != cache.end()) {
    *value = it->second;
    return Status::Ok();
  }
  FLASHATTN_CUDA_TRY(cudaDeviceGetAttribute(value, attr, device));
  cache[device] = *value;
  return Status::Ok();
}

Status multiprocessors(int* sms) { return cached_attribute(g_sms, cudaDevAttrMultiProcessorCount, sms); }

Status compute_major(int* major) { return cached_attribute(g_major, cudaDevAttrComputeCapabilityMajor, major); }

Status active_clusters(const void* kernel, int threads, size_t smem, int cluster_z, int* clusters) {
  int device = 0;
  FLASHATTN_CUDA_TRY(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(g_mutex);
  const auto key = std::make_tuple(kernel, device, threads, smem, cluster_z);
  if (const auto it = g_clusters.find(key); it != g_clusters.end()) {
    *clusters = it->second;
    return Status::Ok();
  }
  const ClusterLaunchZ launch(dim3(1, 1, unsigned(cluster_z)), threads, smem, cluster_z, nullptr);
  if (cudaOccupancyMaxActiveClusters(clusters, kernel, &launch.config) != cudaSuccess) {
    (void)cudaGetLastError();
    *clusters = 0;
  }
  g_clusters[key] = *clusters;
  return Status::Ok();
}

}  // namespace flashattn::cuda
