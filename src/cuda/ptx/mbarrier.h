// mbarrier (sm90): shared-memory barriers that count thread arrivals and, for the copy engine,
// transaction bytes. A barrier completes a phase when every expected arrival has happened and
// every expected byte has landed; waiters name the phase by its parity (0, 1, 0, ...).
#pragma once

#include <cstdint>

namespace flashattn::ptx {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// The dynamic shared-memory base rounded up to kAlign bytes (the 128-byte swizzle's 1024-byte
// period). Computed as an offset from `raw`, not through an integer cast of the pointer: the
// compiler then still knows every pointer derived from it is in shared memory and emits
// LDS/STS. After a uintptr_t round trip it emitted generic LD.E/ST.E, which wait on the long
// scoreboard, and a MEMBAR.ALL.CTA ahead of each proxy fence (the sm90 backward, ncu at d128 16k).
template <int kAlign>
__device__ __forceinline__ unsigned char* align_shared(unsigned char* raw) {
  return raw + ((kAlign - (smem_u32(raw) & (kAlign - 1))) & (kAlign - 1));
}

// One thread initialises; `arrivals` arrivals complete each phase.
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(arrivals));
}

// Makes initialised barriers visible to the copy engine (the async proxy); then a CTA barrier.
__device__ __forceinline__ void mbarrier_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// Arrives once and adds `bytes` to the transaction count this phase waits for (the producer's
// arrival before it issues the bulk copies that will deliver those bytes).
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}

// Blocks until the phase of parity `parity` has completed. A fresh barrier is in phase 0, so a
// wait for parity 1 returns at once (the producer's first pass over empty slots).
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "wait_again:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_again;\n"
      "}\n" ::"r"(smem_u32(bar)),
      "r"(parity)
      : "memory");
}

// Whether the phase of parity `parity` has completed, without waiting.
__device__ __forceinline__ bool mbarrier_test(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "mbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n"
      "}\n"
      : "=r"(done)
      : "r"(smem_u32(bar)), "r"(parity)
      : "memory");
  return done != 0;
}

}  // namespace flashattn::ptx
