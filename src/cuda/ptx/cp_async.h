// cp.async (sm80+): asynchronous 16-byte global -> shared copies, grouped by commit/wait.
#pragma once

#include <cstdint>

namespace flashattn::ptx {

// Copies 16 bytes when `valid`, otherwise writes 16 zero bytes (src-size 0): out-of-range rows
// of a tile become zeros, never garbage that could turn into NaN.
__device__ __forceinline__ void cp_async_16(uint32_t smem_addr, const void* gmem, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr), "l"(gmem),
               "r"(src_bytes));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

// Waits until at most `kPending` committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// Arrives on the mbarrier at `bar` once every cp.async this thread issued before it has
// landed, without waiting here. .noinc: the arrival is one of the barrier's expected arrivals (the
// barrier is initialised with one per copying thread), not an extra pending one it adds and
// completes itself.
__device__ __forceinline__ void cp_async_mbarrier_arrive_noinc(uint64_t* bar) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(bar));
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(addr) : "memory");
}

}  // namespace flashattn::ptx
