// Warpgroup matrix products (wgmma, sm_90a): the fence / commit / wait protocol around the
// asynchronous products of wgmma_ops.h, whose shared-memory operands smem_desc.h describes.
//
// Protocol, per warpgroup: wgmma_fence() before the first product that reads registers written
// by ordinary instructions (accumulators, A fragments); the products; wgmma_commit() closes them
// into a group; wgmma_wait<n>() returns when at most n groups are still running. Until then the
// accumulators belong to the tensor cores: fence_operand() pins each access of them on the right
// side of the wait, so the compiler cannot move a read of a register before the wait that
// completes it.
#pragma once

#include <cstdint>

#include "cuda/ptx/smem_desc.h"
#include "cuda/ptx/wgmma_ops.h"

namespace flashattn::ptx {

#if defined(__CUDACC__)
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }

__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }

template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// Keeps the compiler from moving accesses of these registers across an asm barrier such as
// wgmma_wait (see the file comment).
template <int n>
__device__ __forceinline__ void fence_operand(float (&r)[n]) {
#pragma unroll
  for (int i = 0; i < n; ++i) asm volatile("" : "+f"(r[i])::"memory");
}

template <int n>
__device__ __forceinline__ void fence_operand(uint32_t (&r)[n]) {
#pragma unroll
  for (int i = 0; i < n; ++i) asm volatile("" : "+r"(r[i])::"memory");
}

// A shared-memory store of v: ptxas does not move a wgmma wait above an earlier shared-memory
// store, so storing a value computed from some registers keeps their computation before the
// next wait (fence_operand does not: it only orders the compiler's view, not ptxas's schedule).
__device__ __forceinline__ void st_shared_f32(uint32_t addr, float v) {
  asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(addr), "f"(v) : "memory");
}
#endif

}  // namespace flashattn::ptx
