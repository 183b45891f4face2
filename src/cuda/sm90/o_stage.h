// Where the Hopper forward's stmatrix epilogue (FwdTraits::kOTma, a dev/ A/B; fwd_kernel.h,
// store_tile) puts a consumer's O: 64 rows in 64-column panels of 128-byte rows, each row's eight
// 16-byte chunks XOR-swizzled by row % 8, as a 128-byte-swizzle tensor map expects them for the
// copy engine's store. Host-device, so that tests/cpp/test_sm90_layout.cpp plays stmatrix's and
// the accumulators' layouts against it on the host.
#pragma once

#include <cstdint>

#include "core/host_device.h"

namespace flashattn::cuda::sm90 {

// Byte offset in the staging panels of row `row` (0..63), 16-byte chunk `chunk` (columns 8 chunk ..
// 8 chunk + 7) of a consumer's O.
FLASHATTN_HOST_DEVICE uint32_t o_stage_offset(int row, int chunk) {
  return uint32_t(chunk / 8) * (64 * 128) + uint32_t(row) * 128 + uint32_t(((chunk % 8) ^ (row % 8)) * 16);
}

// The address lane `lane` of warp `warp` (0..3 within the consumer) gives stmatrix.x4 for the
// 16 x 16 block of chunks (c, c + 1): matrix lane / 8, its row lane % 8; matrices 0 / 1 are rows
// +0 / +8 of chunk c, 2 / 3 the same rows of chunk c + 1 (the registers' order in store_tile).
FLASHATTN_HOST_DEVICE uint32_t o_stage_lane_offset(int warp, int lane, int c) {
  const int m = lane / 8;
  return o_stage_offset(16 * warp + 8 * (m % 2) + lane % 8, c + m / 2);
}

}  // namespace flashattn::cuda::sm90
