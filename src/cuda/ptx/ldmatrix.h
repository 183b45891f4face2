// ldmatrix: each of four 8x8 16-bit matrices is read from shared memory (row addresses given by
// lanes 0-7, 8-15, 16-23, 24-31) and distributed so that lane l holds row l/4, columns
// 2*(l%4) and 2*(l%4)+1 of matrix i in register r[i]. `.trans` delivers the transpose.
#pragma once

#include <cstdint>

namespace flashattn::ptx {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// stmatrix, ldmatrix's converse (sm_90): lane l's r[i] (row l/4, 16-bit columns 2*(l%4) and
// 2*(l%4)+1 of matrix i) goes to row l/4 of matrix i, whose address lane 8i + l/4 gives.
// This header is also compiled for sm_80, which has no stmatrix: there it traps.
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, const uint32_t (&r)[4]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n"
               ::"r"(addr), "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
#else
  (void)addr, (void)r;
  __trap();
#endif
}

}  // namespace flashattn::ptx
