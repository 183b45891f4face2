// Tile sizes of the sm80-class kernels, one table per kernel family. Each entry says why.
// Rows per warp = block_m / warps; every warp owns whole 16-row MMA tiles of Q (no cross-warp
// reduction in the forward). Registers per thread are the binding constraint: the O accumulator
// takes rows_per_warp * head_dim / 32 floats and S takes rows_per_warp * block_n / 32.
#pragma once

namespace flashattn::cuda {

struct FwdTile {
  int block_m;  // query rows per CTA
  int block_n;  // keys per K/V tile
  int warps;    // warps per CTA
};

constexpr FwdTile fwd_tile(int head_dim) {
  // d <= 64: 32 rows per warp halves shared-memory traffic per MMA (K/V fragments are reused
  //          by two row tiles); O (<= 64 regs) and S (64 regs) fit comfortably.
  if (head_dim <= 64) return {128, 64, 4};
  // d 96/128: same shape; O takes 96/128 registers, S 64, which is the most that fits under
  //           255 without spills (FlashAttention-2 settled on the same 128 x 64 x 4 warps).
  if (head_dim <= 128) return {128, 64, 4};
  // d 192/256: 16 rows per warp over 8 warps; 32 rows would need 192-256 registers for O alone.
  return {128, 64, 8};
}

}  // namespace flashattn::cuda
