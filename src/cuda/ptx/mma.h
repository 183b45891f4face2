// Warp-level tensor-core matrix multiply: mma.sync.aligned.m16n8k16 (sm80+).
//
// Fragment layouts (lane = threadIdx.x % 32, g = lane / 4, t = lane % 4), 16-bit A/B, f32 C/D:
//   A 16x16 (4 x b32, two elements each): a0 (g, 2t..2t+1)  a1 (g+8, 2t..)  a2 (g, 2t+8..)  a3 (g+8, 2t+8..)
//   B 16x8  (2 x b32):                    b0 (k=2t..2t+1, n=g)  b1 (k=2t+8.., n=g)
//   C 16x8  (4 x f32):                    c0,c1 (g, 2t..2t+1)   c2,c3 (g+8, 2t..2t+1)
// Two adjacent C tiles (n = 0..15) laid side by side are exactly one A fragment once packed to
// 16-bit pairs, which is how P = softmax(S) feeds P.V without leaving registers.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace flashattn::ptx {

template <typename Element>
struct MmaOperand;

template <>
struct MmaOperand<__half> {
  static constexpr const char* kName = "f16";
};
template <>
struct MmaOperand<__nv_bfloat16> {
  static constexpr const char* kName = "bf16";
};

// d = a * b + c, accumulating into c in place.
template <typename Element>
__device__ __forceinline__ void mma_m16n8k16(float (&c)[4], const uint32_t (&a)[4],
                                             const uint32_t (&b)[2]);

template <>
__device__ __forceinline__ void mma_m16n8k16<__half>(float (&c)[4], const uint32_t (&a)[4],
                                                     const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

template <>
__device__ __forceinline__ void mma_m16n8k16<__nv_bfloat16>(float (&c)[4], const uint32_t (&a)[4],
                                                            const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

}  // namespace flashattn::ptx
