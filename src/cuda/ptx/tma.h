// Bulk tensor copies (TMA, sm90): one thread asks the copy engine for a whole tile described by
// a tensor map (built on the host, sm90/tensor_map.h); the bytes land in shared memory in the
// map's swizzle and complete on an mbarrier's transaction count.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "cuda/ptx/mbarrier.h"

namespace flashattn::ptx {

// Loads the box at coordinates (c0 innermost .. c3) of a rank-4 tensor map into `smem`.
__device__ __forceinline__ void tma_load_4d(void* smem, const CUtensorMap* map, uint64_t* bar, int c0, int c1,
                                            int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6}], "
      "[%2];\n" ::"r"(smem_u32(smem)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}

// Copies `bytes` contiguous bytes (a multiple of 16; both addresses 16-byte aligned) from global
// to shared memory with the copy engine, completing on `bar`'s transaction count (no tensor map:
// the backward's per-row statistics).
__device__ __forceinline__ void bulk_load(void* smem, const void* gmem, uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
          smem_u32(smem)),
      "l"(reinterpret_cast<uint64_t>(gmem)), "r"(bytes), "r"(smem_u32(bar))
      : "memory");
}

// Adds `bytes` contiguous f32 values (a multiple of 16 bytes; both addresses 16-byte aligned)
// from shared memory into global memory element-wise, atomically per element (the copy engine
// reduces in L2). Completes in the issuing thread's bulk group (bulk_commit_group).
__device__ __forceinline__ void bulk_reduce_add_f32(float* gmem, const float* smem, uint32_t bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(
                   reinterpret_cast<uint64_t>(gmem)),
               "r"(smem_u32(smem)), "r"(bytes)
               : "memory");
}

// Closes the issuing thread's bulk operations so far into one group.
__device__ __forceinline__ void bulk_commit_group() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }

// Waits until at most kPending of this thread's bulk groups have not finished reading their
// shared-memory sources (the buffers may then be written again).
template <int kPending>
__device__ __forceinline__ void bulk_wait_group_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
}

// Waits until at most kPending of this thread's bulk groups are incomplete (writes done).
template <int kPending>
__device__ __forceinline__ void bulk_wait_group() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// Orders this thread's global-memory accesses of the async proxy (the copy engine's) with those
// of the generic proxy (ordinary loads, stores, atomics), both ways.
__device__ __forceinline__ void fence_proxy_async_global() { asm volatile("fence.proxy.async.global;\n" ::: "memory"); }

// atomicAdd of 1 with acquire-release semantics at GPU scope: what this thread wrote (and, after
// fence_proxy_async_global, had the copy engine write) before it is visible to the thread that
// reads the count it leaves, and what the threads before it released is visible here. Returns
// the count before.
__device__ __forceinline__ int atomic_inc_acq_rel_gpu(int* p) {
  int old;
  asm volatile("atom.add.acq_rel.gpu.global.s32 %0, [%1], 1;\n" : "=r"(old) : "l"(p) : "memory");
  return old;
}

// A load with acquire semantics at GPU scope: what the threads whose releases it reads wrote
// before them is visible after it.
__device__ __forceinline__ int load_acquire_gpu(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Brings a tensor map (a __grid_constant__ kernel parameter) into the descriptor cache early.
__device__ __forceinline__ void tma_prefetch_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

}  // namespace flashattn::ptx
