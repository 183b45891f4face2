// Layout of the backward's f32 dQ accumulator (workspace), shared by the main backward kernel
// (its dQ reductions), bwd_convert_dq_kernel and the host test tests/cpp/test_dq_layout.cpp.
//
// Each group of 16 workspace rows (16 * head_dim floats) is stored in MMA fragment order
// instead of row-major: the 16 x 8 tile of columns [8t, 8t + 8) takes 128 consecutive floats,
// in which lane l of a warp owns floats 4l .. 4l + 3 = its m16n8 accumulator fragment (rows
// l/4 and l/4 + 8, columns 2(l%4) and 2(l%4) + 1, in the order c0 c1 c2 c3). The main kernel
// then adds a whole fragment with one 16-byte reduction, a warp covering 512 contiguous bytes
// (on sm90: red.global.add.v4.f32, half the reductions of row-major float2 ones), and the
// convert kernel reads rows r and r + 8 of a tile back as four 16-byte loads.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define FLASHATTN_DQ_HD __host__ __device__
#else
#define FLASHATTN_DQ_HD
#endif

namespace flashattn::cuda {

// Every sequence's first workspace row is a multiple of this (whole 16-row fragment groups;
// 16-byte aligned statistics rows for cp.async).
constexpr int kWsRowAlign = 16;

// Float offset of element (row, col) of a workspace block whose first row is a multiple of 16.
FLASHATTN_DQ_HD constexpr int64_t dq_frag_offset(int64_t row, int col, int head_dim) {
  const int r = int(row % 16), c = col % 8;
  return (row - r) * head_dim + (col - c) * 16 + ((r % 8) * 4 + c / 2) * 4 + (r / 8) * 2 + c % 2;
}

}  // namespace flashattn::cuda

#undef FLASHATTN_DQ_HD
