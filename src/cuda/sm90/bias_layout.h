// Where the Hopper bias forward (fwd_kernel.h, FwdBiasTraits) finds a thread's bias words in a
// stage's bias slot: the copy engine writes the tile in panels of 64 keys (128-byte rows) under
// the 128-byte swizzle (16-byte chunk c of row r at chunk c ^ (r % 8)), and each consumer lane
// gives ldmatrix.x4 one row address per step. Host-device, so that tests/cpp/test_sm90_layout.cpp
// plays the copy and the ldmatrix steps out on the host and checks every word against the S
// accumulator's layout.
#pragma once

#include <cstdint>

#include "core/host_device.h"

namespace flashattn::cuda::sm90 {

// This lane's row address for ldmatrix: row l % 8 of matrix m = l / 8, where matrix m of step q
// holds rows 8 (m % 2) .. + 7 of the warp's 16 and chunk 2q + m / 2 (keys 16q + 8 (m / 2) ..
// + 7). row_off is the row's byte offset in a panel; chunk_xor = (m / 2) ^ (row % 8), so the
// swizzled chunk of step q is (2 (q % 4)) ^ chunk_xor. A bias broadcast over the rows is one
// row (row 0) in the slot: every lane gives row 0 (the same address per chunk: no conflict).
struct BiasLane {
  uint32_t row_off;
  uint32_t chunk_xor;
};

FLASHATTN_HOST_DEVICE BiasLane bias_lane(int warp_row0, int lane, bool row_broadcast) {
  const int r = row_broadcast ? 0 : warp_row0 + 8 * ((lane / 8) % 2) + lane % 8;
  return BiasLane{uint32_t(r * 128), uint32_t((lane / 16) ^ (r % 8))};
}

// Byte offset in the slot of this lane's row address for step q (chunks 2q and 2q + 1 of rows g
// and g + 8; panels of panel_bytes). Lane l then holds in register m of the step the word at
// row l / 4 of matrix m, bytes 4 (l % 4) .. + 3 of its chunk: the pair (keys 8c + 2t, +1) of
// row g + 8h with c = 2q + m / 2, h = m % 2, i.e. the thread's bias word 2c + h = 4q + m, as
// S holds s[4c + 2h + e] (fwd_kernel.h ConsumerState).
FLASHATTN_HOST_DEVICE uint32_t bias_step_offset(int q, const BiasLane& bl, int panel_bytes) {
  return uint32_t((q / 4) * panel_bytes) + bl.row_off + ((uint32_t(2 * (q % 4)) ^ bl.chunk_xor) << 4);
}

// The backward's bias slot (bwd_kernel.h, BwdBiasTraits): the copy engine writes the bias tile of
// (64 query rows, 128 keys) as the forward's, in two 64-key panels of `panel_bytes`, and a dK/dV
// consumer needs it transposed: its S^T accumulator holds (key kr + 8h, queries 8c + 2t, +1) in
// pair 2c + h, kr = 64 consumer + 16 warp + g. ldmatrix.trans of the 8 x 8 matrix (query rows
// 8c .. + 7, keys of chunk 2 warp + h) gives lane (g, t) exactly that pair. Step j (of 4) reads
// matrices m = 0..3 as (c, h) = (2j + m / 2, m % 2), i.e. pairs 4j + m; lane l gives the row
// address of row l % 8 of matrix l / 8. The rows' swizzle (r % 8 = l % 8) does not change with j,
// so step j is the lane's offset plus j x bias_t_step (16 rows); a row-broadcast bias (one row)
// reads row 0 at every step (one address per matrix: broadcast, no conflict).
FLASHATTN_HOST_DEVICE uint32_t bias_t_lane_offset(int consumer, int warp, int lane, bool row_broadcast,
                                                  int panel_bytes) {
  const int m = lane / 8;
  const int r = row_broadcast ? 0 : 8 * (m / 2) + lane % 8;
  const int chunk = 2 * warp + m % 2;
  return uint32_t(consumer * panel_bytes + r * 128 + ((chunk ^ (r % 8)) << 4));
}
FLASHATTN_HOST_DEVICE uint32_t bias_t_step(bool row_broadcast) { return row_broadcast ? 0u : 16u * 128u; }

}  // namespace flashattn::cuda::sm90
