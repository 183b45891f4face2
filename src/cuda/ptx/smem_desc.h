// Shared-memory matrix descriptors of the warpgroup products (wgmma, sm_90a). Host-side too:
// tests/cpp/test_sm90_layout.cpp checks the encoding.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define FLASHATTN_PTX_HD __host__ __device__
#else
#define FLASHATTN_PTX_HD
#endif

namespace flashattn::ptx {

// Layouts a descriptor can describe (bits 62-63). Every tile here uses 128-byte swizzled rows,
// the layout the copy engine writes with CU_TENSOR_MAP_SWIZZLE_128B: within each 1024-byte group
// of eight 128-byte rows, 16-byte chunk c of row r sits at chunk c ^ r.
enum class SmemSwizzle : uint64_t { kNone = 0, k128B = 1, k64B = 2, k32B = 3 };

// Matrix descriptor (PTX ISA, "Matrix Descriptor Format"): start address, leading- and
// stride-dimension byte offsets, each in 16-byte units (14 bits), and the swizzle mode.
//  - K-major operand (K contiguous; Q and K here): rows of 128 bytes hold 64 K-elements; the
//    stride offset steps 8 rows (1024 bytes); the leading offset is unused within a 128-byte
//    row, which one k16 step never leaves (set to 1 by convention).
//  - MN-major operand (N contiguous; V here): the leading offset steps from one 64-column panel
//    to the next along N; the stride offset steps 8 K-rows (1024 bytes).
FLASHATTN_PTX_HD constexpr uint64_t smem_desc(uint32_t smem_addr, uint32_t leading_bytes, uint32_t stride_bytes,
                                              SmemSwizzle swizzle) {
  return uint64_t((smem_addr & 0x3FFFF) >> 4) | (uint64_t((leading_bytes >> 4) & 0x3FFF) << 16) |
         (uint64_t((stride_bytes >> 4) & 0x3FFF) << 32) | (uint64_t(swizzle) << 62);
}

// The descriptor of the same layout `bytes` further on (a k-step inside a swizzled row, or the
// next panel): only the start-address field moves. Tiles start 1024-byte aligned, and steps
// inside a row stay below 128 bytes, so the field never carries into its neighbour.
FLASHATTN_PTX_HD constexpr uint64_t desc_advance(uint64_t desc, uint32_t bytes) { return desc + (bytes >> 4); }

}  // namespace flashattn::ptx

#undef FLASHATTN_PTX_HD
