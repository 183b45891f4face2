// Global -> shared tile copies with cp.async, shared by the forward and backward kernels.
#pragma once

#include <cstdint>

#include "cuda/common/smem_layout.h"
#include "cuda/ptx/cp_async.h"
#include "cuda/ptx/ldmatrix.h"  // smem_addr

namespace flashattn::cuda {

// Copies rows [0, kRows) of a (rows, kChunksPerRow * 8) 16-bit tile into shared memory (rows
// laid out by Layout, smem_layout.h) with cp.async; rows >= valid_rows are zero-filled, and with kFull
// (every row exists) the copies carry no predicate. Thread tid owns column chunk
// tid % kChunksPerRow of rows tid / kChunksPerRow + p * kRowsPerPass, so one global pointer per
// thread walks down the tile by a fixed byte step: the per-chunk 64-bit offsets of a generic
// c -> (row, chunk) loop would otherwise stay live across the main loop. Threads beyond a whole
// number of rows per pass (head_dim 96 / 192) idle. g_row0 must be a valid row.
template <typename Element, int kRows, int kThreads, int kChunksPerRow, typename Layout, bool kFull = false>
__device__ __forceinline__ void load_rows(Element* smem, const char* g_row0, int64_t row_bytes, int valid_rows,
                                          int tid) {
  constexpr int kRowsPerPass = kThreads / kChunksPerRow;
  constexpr int kPasses = (kRows + kRowsPerPass - 1) / kRowsPerPass;
  static_assert(kRowsPerPass > 0, "a pass covers at least one row");
  // Swizzled rows: a pass of 8k rows keeps the swizzle phase row % 8; one of 8k + 4 rows flips
  // its bit 2, which XORs chunk bit 2 of the address (adding 4 mod 8 is XOR 4).
  static_assert(!Layout::kSwizzled || kRowsPerPass % 4 == 0, "a pass moves row % 8 by 0 or 4");
  const int r0 = tid / kChunksPerRow;
  const int col = (tid % kChunksPerRow) * 8;
  if (kThreads % kChunksPerRow != 0 && r0 >= kRowsPerPass) return;
  const char* g = g_row0 + r0 * row_bytes + col * int(sizeof(Element));
  const int64_t pass_bytes = kRowsPerPass * row_bytes;
  const uint32_t s = Layout::smem_at(smem, r0, col);
#pragma unroll
  for (int p = 0; p < kPasses; ++p) {
    const int r = r0 + p * kRowsPerPass;
    if (kRows % kRowsPerPass != 0 && r >= kRows) break;
    uint32_t dst = s + uint32_t(p * kRowsPerPass * Layout::kRowBytes);
    if constexpr (Layout::kSwizzled) dst ^= uint32_t(((p * kRowsPerPass) & 7) << 4);
    if constexpr (kFull) {
      ptx::cp_async_16(dst, g, true);
    } else {
      const bool valid = r < valid_rows;
      ptx::cp_async_16(dst, valid ? g : g_row0, valid);
    }
    g += pass_bytes;
  }
}

// load_rows for rows that are not evenly spaced (a paged KV cache): the thread's row of pass p
// (row tid / kChunksPerRow + p * kRowsPerPass of the tile) comes from row_src(p), a pointer to
// its first element; rows >= valid_rows are zero-filled (their cp.async reads nothing, from
// `any_row`, a valid address). Same thread -> (row, chunk) map and shared-memory layout as
// load_rows, so the two are interchangeable for one tile. The pass loop is not shared with
// load_rows: written as one loop over a source callback, the plain kernels' SASS changed (d128
// forward +120 instructions, ptxas sm_90), so load_rows keeps its own pointer walk.
template <typename Element, int kRows, int kThreads, int kChunksPerRow, typename Layout, typename RowSrc>
__device__ __forceinline__ void load_rows_gather(Element* smem, const RowSrc& row_src, const char* any_row,
                                                 int valid_rows, int tid) {
  constexpr int kRowsPerPass = kThreads / kChunksPerRow;
  constexpr int kPasses = (kRows + kRowsPerPass - 1) / kRowsPerPass;
  static_assert(kRowsPerPass > 0, "a pass covers at least one row");
  static_assert(!Layout::kSwizzled || kRowsPerPass % 4 == 0, "a pass moves row % 8 by 0 or 4");
  const int r0 = tid / kChunksPerRow;
  const int col = (tid % kChunksPerRow) * 8;
  if (kThreads % kChunksPerRow != 0 && r0 >= kRowsPerPass) return;
  const uint32_t s = Layout::smem_at(smem, r0, col);
#pragma unroll
  for (int p = 0; p < kPasses; ++p) {
    const int r = r0 + p * kRowsPerPass;
    if (kRows % kRowsPerPass != 0 && r >= kRows) break;
    uint32_t dst = s + uint32_t(p * kRowsPerPass * Layout::kRowBytes);
    if constexpr (Layout::kSwizzled) dst ^= uint32_t(((p * kRowsPerPass) & 7) << 4);
    const bool valid = r < valid_rows;
    ptx::cp_async_16(dst, valid ? row_src(p) + col * int(sizeof(Element)) : any_row, valid);
  }
}

}  // namespace flashattn::cuda
