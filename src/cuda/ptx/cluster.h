// Thread-block clusters (sm90): a CTA's rank in its cluster, the cluster-wide barrier, and reads
// of another CTA's shared memory (distributed shared memory). Only code compiled for sm_90 or
// newer may call these; the kernels that do guard them with __CUDA_ARCH__.
#pragma once

#include <cstdint>

namespace flashattn::ptx {

// This CTA's rank in its cluster (x fastest, then y, then z) and the cluster's CTA count (1 for
// a launch without clusters).
__device__ __forceinline__ uint32_t cluster_ctarank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
__device__ __forceinline__ uint32_t cluster_nctarank() {
  uint32_t n;
  asm volatile("mov.u32 %0, %%cluster_nctarank;\n" : "=r"(n));
  return n;
}

// Every thread of every CTA of the cluster arrives, then waits for all the others: what a thread
// wrote before its arrival (shared memory included) is visible to every thread after its wait
// (arrive.release, wait.acquire). Exited threads count as arrived.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}

// The shared::cluster address of the location at shared::cta address `local` in CTA `rank`'s
// shared memory (every CTA of the kernel lays its shared memory out alike).
__device__ __forceinline__ uint32_t cluster_map(uint32_t local, uint32_t rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(local), "r"(rank));
  return remote;
}

__device__ __forceinline__ float ld_cluster_f32(uint32_t addr) {
  float x;
  asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(x) : "r"(addr) : "memory");
  return x;
}

__device__ __forceinline__ float2 ld_cluster_v2f32(uint32_t addr) {
  float2 x;
  asm volatile("ld.shared::cluster.v2.f32 {%0, %1}, [%2];\n" : "=f"(x.x), "=f"(x.y) : "r"(addr) : "memory");
  return x;
}

__device__ __forceinline__ float4 ld_cluster_v4f32(uint32_t addr) {
  float4 x;
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(x.x), "=f"(x.y), "=f"(x.z), "=f"(x.w)
               : "r"(addr)
               : "memory");
  return x;
}

}  // namespace flashattn::ptx
