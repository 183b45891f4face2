// The index algebra of the Hopper FP8 forward (fwd8_kernel.h): swizzled offsets, the key
// permutation that lets P stay in its thread, the transposers' items (ldmatrix / stmatrix
// offsets and byte permutes). Host-safe: tests/cpp/test_fp8_sm90_layout.cpp runs it against the PTX ISA's
// fragment layouts, written again there, without a GPU.
#pragma once

#include <cstdint>

#include "cuda/sm90/fwd_tile.h"

#if defined(__CUDACC__)
#define FLASHATTN_FWD8_HD __host__ __device__ __forceinline__
#else
#define FLASHATTN_FWD8_HD inline
#endif

namespace flashattn::cuda::sm90 {

// The FP8 forward's tile: 2 consumer warpgroups (block_m 128; 3 at d64), 2 stages, ping-pong;
// 128 keys per K/V tile. Measured on H200 (dev/NOTES.md, "FP8 forward on Hopper"). Why
// multiples of 64 keys: P V runs over the keys as its K dimension, and 8-bit wgmma
// operands are K-major only, so the transposed V tile (Vt) holds one row of block_n key bytes
// per head-dim column, in panels of 128 (or 64) key bytes under the swizzle of that width, the
// layouts the copy engine and the descriptors share; block_n is a multiple of 64.
// Registers per consumer thread: S block_n / 2 + P block_n / 8 (four e4m3 per word) + O
// head_dim / 2: d128 64 + 16 + 64; d256 at 128 keys 64 + 16 + 128 = 208 spilled 48 bytes in the
// main loop under setmaxnreg's 232 (ptxas, CUDA 13), so d256's consumers take 240 and the
// producer warpgroup 24 (fwd8_narrow_producer; the transposers one item per pass; what spills
// then is the TMA thread's, none in the consumers' key loop without a mask, 2 LDL with one).
// Shared memory: Q 128 x d, and per stage K block_n x d, V block_n x d, Vt d x block_n, all
// bytes: d128 16 + 2 x 48 = 112 KB; d256 32 + 2 x 96 = 224 KB.
//
// dev/ experiments (the tile sweep, dev/NOTES.md): -DFLASHATTN_DEV_FP8_HDIM=D with
// -DFLASHATTN_DEV_FP8_{CONSUMERS,BN,STAGES}=... replace head dim D's tile (each defaults to the
// shipped value); -DFLASHATTN_DEV_FP8_REGS240 gives two consumer warpgroups 240 registers and
// the producer warpgroup 24 at every tile (fwd8_narrow_producer; three always get 160 / 32).
// d64 takes three consumer warpgroups (block_m 192, 160 registers each: S 64 + P 16 + O 32), as
// the 16-bit forward does: the tile sweep on the H200 (dev/results/h200-2026-12-02-fp8-tile-
// {base,d64_c3}.json, one session) measured 531 / 463 / 594 / 570 TFLOP/s against 410 / 408 /
// 426 / 452 at 4k / 4k causal / 16k / 16k causal (+13..+39%). The same sweep: d128 with 192
// keys -6.5% at 4k and 16k, +1% / +5% causal (not taken: one tile serves every mask); d256 with
// 128 keys and a 240 / 32 register split hung: it asked setmaxnreg for more registers than the
// launch had (fwd_tile.h setmaxnreg_pool). With 240 / 24, against 64 keys at 232 / 40, one call
// (dev/results/h200-2026-12-03-s18-fp8-tile-{base,d256_bn128_r240}-f71e586.json): 938 / 855 /
// 1003 / 1006 TFLOP/s against 872 / 780 / 932 / 916 at 4k / 4k causal / 16k / 16k causal
// (+7.6 / +9.6 / +7.6 / +9.8%); d128 at 192 keys with 240 / 24 lost again (-7 / -2 / -1 / +2%).
// The default since s19, after the CUDA FP8 cases at d256 (window, causal with a sink,
// outliers, varlen), test_fp8.py, and racecheck / synccheck of the causal and window kernels
// passed on it; the same call timed 940 / 857 / 958 / 931 against our bf16's 794 / 692 / 830 / 778
// (dev/results/h200-2026-12-03-s19-fp8-d256-bn128-7ab6ae5.json).
constexpr FwdTile fwd8_tile_shipped(int head_dim) {
  return head_dim <= 64 ? FwdTile{3, 128, 2, true} : FwdTile{2, 128, 2, true};
}
// Whether two consumer warpgroups take 240 registers and the producer warpgroup 24 (its
// transposers then one item per pass) rather than 232 and 40: where their accumulators (S, P,
// O) pass the 168 that d256's 64-key tile held under 232 without spills (its 128-key tile, 208,
// spilled 48 bytes there): d256 at 128 keys.
constexpr bool fwd8_narrow_producer(const FwdTile& t, int head_dim) {
  return t.consumers == 2 && t.block_n / 2 + t.block_n / 8 + head_dim / 2 > 168;
}
constexpr FwdTile fwd8_tile(int head_dim) {
#if defined(FLASHATTN_DEV_FP8_HDIM)
  if (head_dim == FLASHATTN_DEV_FP8_HDIM) {
    FwdTile t = fwd8_tile_shipped(head_dim);
#if defined(FLASHATTN_DEV_FP8_CONSUMERS)
    t.consumers = FLASHATTN_DEV_FP8_CONSUMERS;
#endif
#if defined(FLASHATTN_DEV_FP8_BN)
    t.block_n = FLASHATTN_DEV_FP8_BN;
#endif
#if defined(FLASHATTN_DEV_FP8_STAGES)
    t.stages = FLASHATTN_DEV_FP8_STAGES;
#endif
    return t;
  }
#endif
  return fwd8_tile_shipped(head_dim);
}

// Tile shapes and byte layout of the FP8 forward at one head dim (host-safe part of Fwd8Traits);
// kTile_ other than the head dim's own only in tests/cpp/test_fp8_sm90_layout.cpp (the tiles the
// sweep may pick).
template <int kHeadDim_, FwdTile kTile_ = fwd8_tile(kHeadDim_)>
struct Fwd8Shape {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kHeadDimV = kHeadDim_;
  static constexpr FwdTile kTile = kTile_;
  static constexpr int kConsumers = kTile.consumers;
  static constexpr int kBlockM = 64 * kConsumers;
  static constexpr int kBlockN = kTile.block_n;
  static constexpr int kStages = kTile.stages;
  static constexpr bool kPingPong = kTile.ping_pong;
  // Q, K and V tiles: rows of kRowBytes e4m3 (one byte per element) in panels of kRowBytes
  // columns. d128 and d256 take the 128-byte swizzle (one or two panels); d64's rows are 64
  // bytes, under the 64-byte swizzle (period 512 bytes = 8 rows, as 1024 = 8 rows at 128).
  static constexpr int kRowBytes = kHeadDim >= 128 ? 128 : kHeadDim;
  static constexpr int kSwizzleBytes = kRowBytes;
  static constexpr int kSwizzlePeriod = 8 * kRowBytes;  // the descriptors' stride offset
  static constexpr int kPanels = kHeadDim / kRowBytes;
  static constexpr int kPanelBytesQ = kBlockM * kRowBytes;
  static constexpr int kPanelBytesKV = kBlockN * kRowBytes;
  static constexpr int kTileBytesQ = kPanels * kPanelBytesQ;
  static constexpr int kTileBytesK = kPanels * kPanelBytesKV;
  static constexpr int kTileBytesV = kTileBytesK;
  // Vt: kHeadDim rows (N of P V) of kBlockN key bytes (K of P V), in panels of kVtRowBytes key
  // bytes (128 when kBlockN allows, else 64), each swizzled at that width; a k32 step of P V
  // stays within one panel.
  static constexpr int kVtRowBytes = kBlockN % 128 == 0 ? 128 : 64;
  static constexpr int kVtSwizzlePeriod = 8 * kVtRowBytes;
  static constexpr int kVtPanels = kBlockN / kVtRowBytes;
  static constexpr int kPanelBytesVt = kHeadDim * kVtRowBytes;
  static constexpr int kTileBytesVt = kVtPanels * kPanelBytesVt;

  static_assert(kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256, "FP8 head dims");
  static_assert(kBlockN % 64 == 0 && kBlockN <= 256, "Vt panels of 128- or 64-byte swizzled rows of keys");
  static_assert(kConsumers == 2 || kConsumers == 3, "ping-pong between two or three consumer warpgroups");
  static_assert(kPanelBytesKV % 1024 == 0 && kTileBytesVt % 1024 == 0, "tiles start on the swizzle period");
};

namespace fwd8 {

// Byte offset of (row, byte) in a tile of `row_bytes`-byte rows (128 or 64) under the copy
// engine's swizzle of the same width: the 16-byte chunk bits [4, 4 + log2(row_bytes / 16)) XOR
// address bits [7, ...): at 128 the row mod 8, at 64 the row pair mod 4. Tiles start
// 1024-byte aligned, so the offset's bits are the address's.
FLASHATTN_FWD8_HD constexpr uint32_t swizzled(int row, int byte, int row_bytes) {
  const uint32_t off = uint32_t(row * row_bytes + byte);
  const uint32_t mask = uint32_t(row_bytes / 16 - 1);
  return off ^ (((off >> 7) & mask) << 4);
}

// Within one 32-key group of a k32 step: thread t of a quad holds keys u = 16 hf + 8 j + 2 t + e
// (hf, j, e in {0, 1}) of each of its rows, and packs them at K-position k = 16 hf + 4 t + 2 j + e
// of its A fragment (fwd8_kernel.h, file comment 3.). Vt's row holds key key_of_k(k) at byte k.
FLASHATTN_FWD8_HD constexpr int k_of_key(int u) {
  const int hf = u >> 4, j = (u >> 3) & 1, t = (u >> 1) & 3, e = u & 1;
  return 16 * hf + 4 * t + 2 * j + e;
}
FLASHATTN_FWD8_HD constexpr int key_of_k(int k) {
  const int hf = k >> 4, t = (k >> 2) & 3, j = (k >> 1) & 1, e = k & 1;
  return 16 * hf + 8 * j + 2 * t + e;
}

// P's A-fragment words per k32 step kk: word 4 kk + 2 hf + h holds, in K order, the accumulator
// elements s[index(kk, hf, h, 0 .. 3)] (row half h; chunks 4 kk + 2 hf and the next, e = 0, 1).
FLASHATTN_FWD8_HD constexpr int p_word(int kk, int hf, int h) { return 4 * kk + 2 * hf + h; }
FLASHATTN_FWD8_HD constexpr int p_source(int kk, int hf, int h, int byte) {
  const int c = 4 * kk + 2 * hf + (byte >> 1);
  return 4 * c + 2 * h + (byte & 1);
}

// __byte_perm(x, y, s): byte i of the result is byte nibble_i(s) & 7 of the pair (y:x).
FLASHATTN_FWD8_HD uint32_t byte_perm(uint32_t x, uint32_t y, uint32_t s) {
#if defined(__CUDA_ARCH__)
  return __byte_perm(x, y, s);
#else
  const uint64_t pair = uint64_t(y) << 32 | x;
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) r |= uint32_t((pair >> (8 * ((s >> (4 * i)) & 7))) & 0xff) << (8 * i);
  return r;
#endif
}

// ---- The matrix transposer (fwd8_kernel.h transpose_v) -----------------------------------------
//
// A warp moves one item, 16 keys kb .. kb + 15 (kb a multiple of 16: one half of a 32-key group)
// by 32 head-dim bytes d0 .. d0 + 31, with one ldmatrix.x4.trans, four byte permutes and one
// stmatrix.x4: 512 bytes for 6 instructions and their addresses, where the first transposer's
// 4 x 4 byte units took 32 loads, 32 stores and about 3800 instructions (SASS, d128: 120 per unit).
//
// ldmatrix sees 16-bit elements, i.e. byte pairs of one key. Its four matrices are keys
// kb + 8 (m % 2) + 0 .. 7 by head-dim bytes d0 + 16 (m / 2) + 0 .. 15. With .trans, lane 4g + t
// receives in r[m] the element (column g) of rows 2t and 2t + 1: bytes
// [V(k, dd + 2g), V(k, dd + 2g + 1), V(k + 1, dd + 2g), V(k + 1, dd + 2g + 1)], k = kb + 8 (m % 2)
// + 2t, dd = d0 + 16 (m / 2). Bytes 0 and 2 of r[0] and r[1] are then head-dim column dd + 2g
// at keys kb + 2t, + 1, + 8 + 2t, + 9 + 2t: exactly the K-bytes 4t .. 4t + 3 of half kb / 16 of
// Vt's row under the key permutation (key_of_k(16 hf + 4t + b) = 16 hf + 8 (b / 2) + 2t + b % 2),
// so one byte permute per Vt word finishes the transpose, and the permutation costs nothing.
// stmatrix stores lane 4g + t's r[j] at bytes 4t .. 4t + 3 of row g of matrix j, each row's
// address from a lane: matrix j holds Vt rows d0 + 16 (j / 2) + 2g + p, K-bytes kb .. kb + 15,
// with p = (j % 2) XOR (g >= 4): the upper four rows take the other parity so that the eight
// rows of one matrix have eight distinct residues mod 8, which both swizzles put in distinct
// banks (in plain parity, rows 2g mod 8 repeat: 2-way conflicts).
struct MatrixItem {
  int kb;  // first key (a multiple of 16)
  int d0;  // first head-dim byte (a multiple of 32)
};
FLASHATTN_FWD8_HD constexpr int matrix_items(int head_dim, int block_n) { return (block_n / 16) * (head_dim / 32); }
// Unsigned: the kernel's divisions by powers of two then compile to shifts and masks.
FLASHATTN_FWD8_HD constexpr MatrixItem matrix_item(unsigned item, int block_n) {
  return {int(16 * (item % unsigned(block_n / 16))), int(32 * (item / unsigned(block_n / 16)))};
}

// Lane's ldmatrix row address within the V tile (block_n rows of row_bytes, in panels of
// panel_bytes): matrix lane / 8, row lane % 8, i.e. key kb + 8 (m % 2) + i at head-dim byte
// d0 + 16 (m / 2). Because kb is a multiple of 16 and d0 of 32, the swizzle's row term (key mod
// 8 at 128 bytes, (key / 2) mod 4 at 64) is the lane's alone, and the item's bits (kb's rows,
// d0's panel and even chunk) and the lane's (the row within 16, the chunk's low bit and the
// swizzle term) are disjoint: the offset is one XOR of an item part and a loop-invariant lane
// part (checked against the plain formula by tests/cpp/test_fp8_sm90_layout.cpp).
FLASHATTN_FWD8_HD constexpr uint32_t ldsm_lane_bits(int lane, int row_bytes) {
  const int m = lane / 8, i = lane % 8;
  const int f = row_bytes == 128 ? i : (i / 2) % 4;  // the swizzle's row term
  return uint32_t((8 * (m % 2) + i) * row_bytes + 16 * ((m / 2) ^ f));
}
FLASHATTN_FWD8_HD constexpr uint32_t ldsm_item_bits(const MatrixItem& it, int row_bytes, int panel_bytes) {
  const uint32_t d0 = uint32_t(it.d0), rb = uint32_t(row_bytes);  // unsigned: shifts and masks
  return (d0 / rb) * uint32_t(panel_bytes) + uint32_t(it.kb) * rb + d0 % rb;
}
FLASHATTN_FWD8_HD constexpr uint32_t ldsm_offset(const MatrixItem& it, int lane, int row_bytes, int panel_bytes) {
  return ldsm_item_bits(it, row_bytes, panel_bytes) ^ ldsm_lane_bits(lane, row_bytes);
}

// Lane's stmatrix row address within the Vt tile (panels of rows of vt_row_bytes, 128 or 64): matrix
// lane / 8, row slot lane % 8 (see above), at K-byte kb. The row is d0 plus the lane's 0 .. 15,
// so again an XOR of the item's bits (d0's rows, kb's chunk) and the lane's (its row within 16,
// that row's swizzle term).
FLASHATTN_FWD8_HD constexpr int stsm_lane_row(int lane) {
  const int m = lane / 8, slot = lane % 8;
  return 16 * (m / 2) + 2 * slot + ((m % 2) ^ (slot >= 4 ? 1 : 0));
}
FLASHATTN_FWD8_HD constexpr uint32_t stsm_lane_bits(int lane, int vt_row_bytes) {
  const int row = stsm_lane_row(lane);
  const int f = vt_row_bytes == 128 ? row % 8 : (row / 2) % 4;
  return uint32_t(row * vt_row_bytes + 16 * f);
}
// Vt panels (vt_panel_bytes apart) of vt_row_bytes keys each: the item's keys lie in panel
// kb / vt_row_bytes (16-key items never straddle one).
FLASHATTN_FWD8_HD constexpr uint32_t stsm_item_bits(const MatrixItem& it, int vt_row_bytes, int vt_panel_bytes) {
  const uint32_t kb = uint32_t(it.kb), rb = uint32_t(vt_row_bytes);  // unsigned: shifts and masks
  return (kb / rb) * uint32_t(vt_panel_bytes) + uint32_t(it.d0) * rb + kb % rb;
}
FLASHATTN_FWD8_HD constexpr uint32_t stsm_offset(const MatrixItem& it, int lane, int vt_row_bytes, int vt_panel_bytes) {
  return stsm_item_bits(it, vt_row_bytes, vt_panel_bytes) ^ stsm_lane_bits(lane, vt_row_bytes);
}

// Lane 4g + t's Vt words from its ldmatrix registers: o[j] is head-dim column
// d0 + 16 (j / 2) + 2g + p (p as above) at keys kb + 2t, + 1, + 8, + 9, from r[2 (j / 2)] (keys
// kb + 2t, + 1) and r[2 (j / 2) + 1] (keys kb + 8 + 2t, + 9): bytes 0, 2 (p = 0) or 1, 3 (p = 1)
// of each.
FLASHATTN_FWD8_HD void matrix_vt_words(const uint32_t (&r)[4], uint32_t (&o)[4], int lane) {
  const bool upper = lane / 4 >= 4;
  const uint32_t even = upper ? 0x7531u : 0x6420u;  // the selector of matrices 0 and 2
  const uint32_t odd = upper ? 0x6420u : 0x7531u;
  o[0] = byte_perm(r[0], r[1], even);
  o[1] = byte_perm(r[0], r[1], odd);
  o[2] = byte_perm(r[2], r[3], even);
  o[3] = byte_perm(r[2], r[3], odd);
}

}  // namespace fwd8
}  // namespace flashattn::cuda::sm90

#undef FLASHATTN_FWD8_HD
