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

Status multiprocessors(int* sms) {
  int device = 0;
  FLASHATTN_CUDA_TRY(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(g_mutex);
  if (const auto it = g_sms.find(device); it != g_sms.end()) {
    *sms = it->second;
    return Status::Ok();
  }
  FLASHATTN_CUDA_TRY(cudaDeviceGetAttribute(sms, cudaDevAttrMultiProcessorCount, device));
  g_sms[device] = *sms;
  return Status::Ok();
}

}  // namespace flashattn::cuda
