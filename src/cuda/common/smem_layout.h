// Shared-memory layouts of 16-bit (row, column) tiles, shared by the tile copies (tile_copy.h),
// the warp products (warp_gemm.h) and the kernels' staging stores. Each layout maps an element
// to a byte offset from the tile's start and advances an address by a compile-time (rows, cols)
// step, so that ldmatrix addresses stay one register per operand plus immediates.
//
// PaddedRows<kStride>: rows kStride elements apart, kStride = row length + 8. Consecutive rows
//   start 16 bytes apart modulo 128, so the eight row addresses of an ldmatrix hit distinct
//   banks. Its cost: a warp's cp.async of two 256-byte rows writes the second row 16 bytes off
//   a 128-byte line, which splits the copy's requests (ncu: 24 L2 sectors per 16 of data).
// SwizzledRows<kRowElems>: unpadded rows (kRowElems a multiple of 64, so rows are whole 128-byte
//   lines), the 16-byte chunk c of row r stored at chunk c ^ (r % 8) of its 128-byte group. The
//   eight rows of an ldmatrix again hit distinct banks, and a row's copy fills whole lines.
#pragma once

#include <cstdint>
#include <type_traits>

// offset(), advance() and swizzle_steps_ok() are host code too (tests/cpp/test_smem_layout.cpp
// checks the swizzle's algebra without a GPU); the pointer helpers are device code.
#if defined(__CUDACC__)
#include "cuda/ptx/ldmatrix.h"  // smem_addr
#define FLASHATTN_LAYOUT_HD __host__ __device__
#else
#define FLASHATTN_LAYOUT_HD
#endif

namespace flashattn::cuda {

template <int kStride_>
struct PaddedRows {
  static constexpr bool kSwizzled = false;
  static constexpr int kStride = kStride_;  // elements from one row start to the next
  static constexpr int kRowBytes = 2 * kStride;

  // Byte offset of element (row, col) from the tile's start.
  FLASHATTN_LAYOUT_HD static constexpr uint32_t offset(int row, int col) {
    return uint32_t(row * kRowBytes + 2 * col);
  }
  // The address of element (row + dr, col + dc) from that of (row, col).
  FLASHATTN_LAYOUT_HD static constexpr uint32_t advance(uint32_t addr, int dr, int dc) {
    return addr + 2u * (dr * kStride + dc);
  }
#if defined(__CUDACC__)
  // Element (row, col) of the tile at `tile`, as a pointer and as a shared-memory address; for
  // smem_at the column may come in two terms, added one after the other as the kernels always
  // formed these addresses (ptxas schedules the same expression the same way).
  template <typename E>
  __device__ __forceinline__ static E* at(E* tile, int row, int col) {
    return tile + row * kStride + col;
  }
  template <typename E>
  __device__ __forceinline__ static uint32_t smem_at(E* tile, int row, int col, int col2 = 0) {
    return ptx::smem_addr(tile + row * kStride + col + col2);
  }
#endif
};

// The pointer helpers of a layout whose offset() is not a row stride (the swizzled ones):
// element (row, col) of the tile at `tile` as a pointer, and as a shared-memory address (the
// column may come in two terms). Layout derives from SwizzledAccess<Layout>.
template <typename Layout>
struct SwizzledAccess {
#if defined(__CUDACC__)
  template <typename E>
  __device__ __forceinline__ static E* at(E* tile, int row, int col) {
    static_assert(sizeof(E) == 2, "16-bit elements");
    using Byte = std::conditional_t<std::is_const_v<E>, const char, char>;
    return reinterpret_cast<E*>(reinterpret_cast<Byte*>(tile) + Layout::offset(row, col));
  }
  template <typename E>
  __device__ __forceinline__ static uint32_t smem_at(E* tile, int row, int col, int col2 = 0) {
    return ptx::smem_addr(tile) + Layout::offset(row, col + col2);
  }
#endif
};

template <int kRowElems>
struct SwizzledRows : SwizzledAccess<SwizzledRows<kRowElems>> {
  static_assert(kRowElems % 64 == 0, "rows are whole 128-byte lines");
  static constexpr bool kSwizzled = true;
  static constexpr int kStride = kRowElems;
  static constexpr int kRowBytes = 2 * kRowElems;

  FLASHATTN_LAYOUT_HD static constexpr uint32_t offset(int row, int col) {
    return uint32_t(row * kRowBytes + (((col >> 3) ^ (row & 7)) << 4) + ((col & 7) << 1));
  }
  // Valid when the tile starts on a 128-byte boundary, dr % 8 == 0 (row % 8 is kept), dc % 8 ==
  // 0, and the low three bits of the chunk index col / 8 and of dc / 8 are disjoint and sum
  // below 8 (no carry): the low bits then move by XOR, the rest by addition. Every use below
  // satisfies it (see the static_asserts of the traits that pick this layout).
  FLASHATTN_LAYOUT_HD static constexpr uint32_t advance(uint32_t addr, int dr, int dc) {
    const int chunks = dc >> 3;
    return (addr ^ uint32_t((chunks & 7) << 4)) + uint32_t(dr * kRowBytes + ((chunks & ~7) << 4));
  }
};

// Rows of kRowElems 16-bit elements kept as kRowElems / 64 panels of kRows rows x 128 bytes:
// the layout the copy engine writes for boxes of 64 columns x kRows rows under the 128-byte
// swizzle (ptx/tma.h, sm90/tensor_map.h), one box per panel, each panel on a 1024-byte
// boundary. Within a 128-byte line the chunks are swizzled as in SwizzledRows (chunk c of row r
// at c ^ (r % 8)), so advance() follows the same rule; a 64-column step moves to the next panel
// (kPanelBytes on) instead of the next line. The MLA decode's K tiles when they come by TMA
// (mla_traits.h, kTma).
template <int kRowElems, int kRows>
struct SwizzledPanels : SwizzledAccess<SwizzledPanels<kRowElems, kRows>> {
  static_assert(kRowElems % 64 == 0 && kRows % 8 == 0, "whole 64-column panels of whole 8-row swizzle periods");
  static constexpr bool kSwizzled = true;
  static constexpr int kStride = 64;  // elements between rows of a panel (8 rows on: the same swizzle)
  static constexpr int kPanelBytes = kRows * 128;

  FLASHATTN_LAYOUT_HD static constexpr uint32_t offset(int row, int col) {
    return uint32_t((col >> 6) * kPanelBytes + row * 128 + ((((col >> 3) & 7) ^ (row & 7)) << 4) + ((col & 7) << 1));
  }
  // Valid under SwizzledRows::advance's conditions (dr % 8 == 0, dc % 8 == 0, no carry in the
  // low three chunk bits), with dc >= 0.
  FLASHATTN_LAYOUT_HD static constexpr uint32_t advance(uint32_t addr, int dr, int dc) {
    const int chunks = dc >> 3;
    return (addr ^ uint32_t((chunks & 7) << 4)) + uint32_t(dr * 128 + (chunks >> 3) * kPanelBytes);
  }
};

// True when advancing from column chunk c0 (+ the lane's ldmatrix chunk, bit 0) by every even
// chunk step below span_chunks is carry-free in the low three bits (the three parts use
// disjoint bits), for the column chunks c0 = w * step_chunks of warps w < warps: the condition
// SwizzledRows::advance needs.
constexpr bool swizzle_steps_ok(int step_chunks, int warps, int span_chunks) {
  for (int w = 0; w < warps; ++w) {
    const int c0 = (w * step_chunks) & 7;
    if (c0 & 1) return false;
    for (int d = 0; d < span_chunks; d += 2) {
      const int lo = d & 7;
      if ((c0 & lo) != 0) return false;
    }
  }
  return true;
}

}  // namespace flashattn::cuda

#undef FLASHATTN_LAYOUT_HD
