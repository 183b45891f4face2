// The index algebra of the Hopper FP8 forward (fwd8_kernel.h): swizzled offsets, the key
// permutation that lets P stay in its thread, the transposers' work split and their 4 x 4 byte
// transpose. Host-safe: tests/cpp/test_fp8_sm90_layout.cpp runs it against the PTX ISA's
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

// The FP8 forward's tile: 2 consumer warpgroups (block_m 128), 2 stages, ping-pong; 128 keys per
// K/V tile (64 at d256). Not swept (no GPU run yet; dev/NOTES.md, "FP8 forward on Hopper"). Why
// 128 or 64 keys: P V runs over the keys as its K dimension, and 8-bit wgmma operands are K-major
// only, so the transposed V tile (Vt) holds one row of block_n key bytes per head-dim column: a
// swizzled row of 128 (or 64) bytes, the layouts the copy engine and the descriptors share.
// Registers per consumer thread: S block_n / 2 + P block_n / 8 (four e4m3 per word) + O
// head_dim / 2: d128 64 + 16 + 64; d256 at 128 keys 64 + 16 + 128 = 208 spilled 48 bytes in the
// main loop under setmaxnreg's 232 (ptxas, CUDA 13), at 64 keys 32 + 8 + 128 = 168 does not.
// Shared memory: Q 128 x d, and per stage K block_n x d, V block_n x d, Vt d x block_n, all
// bytes: d128 16 + 2 x 48 = 112 KB; d256 32 + 2 x 48 = 128 KB.
constexpr FwdTile fwd8_tile(int head_dim) { return head_dim > 128 ? FwdTile{2, 64, 2, true} : FwdTile{2, 128, 2, true}; }

// Tile shapes and byte layout of the FP8 forward at one head dim (host-safe part of Fwd8Traits).
template <int kHeadDim_>
struct Fwd8Shape {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kHeadDimV = kHeadDim_;
  static constexpr FwdTile kTile = fwd8_tile(kHeadDim);
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
  // Vt: kHeadDim rows (N of P V) of kBlockN key bytes (K of P V), swizzled at that width.
  static constexpr int kVtRowBytes = kBlockN;
  static constexpr int kVtSwizzlePeriod = 8 * kVtRowBytes;
  static constexpr int kTileBytesVt = kHeadDim * kVtRowBytes;

  static_assert(kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256, "FP8 head dims");
  static_assert(kBlockN == 128 || kBlockN == 64, "Vt rows are one 128- or 64-byte swizzled row of keys");
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

// A transposer's unit: head-dim bytes col .. col + 3 of Vt word w (K-bytes 4w .. 4w + 3) of each
// of those four rows. Lanes take 8 consecutive column groups by 4 consecutive words: the 32 loads
// of a warp read 8 distinct 16-byte chunks of 4 key rows 2 apart, which the 128-byte swizzle
// spreads over all 32 banks (the stores: transpose_unit_words).
struct TransposeUnit {
  int col;   // first head-dim byte (a multiple of 4)
  int w;     // Vt word in the row
  int key0;  // its four keys: key0, key0 + 1, key0 + 8, key0 + 9 (key_of_k of 4w .. 4w + 3)
};
FLASHATTN_FWD8_HD constexpr TransposeUnit transpose_unit(int unit, int head_dim) {
  const int col_blocks = head_dim / 32;  // 8 column groups of 4 bytes per block
  const int hi = unit >> 5;
  const int cg = (hi % col_blocks) * 8 + (unit & 7);
  const int w = (hi / col_blocks) * 4 + ((unit >> 3) & 3);
  return {4 * cg, w, 32 * (w >> 3) + key_of_k(4 * (w & 7))};
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

// 4 x 4 byte transpose: byte i of r[j] is column i of key j; byte j of d[i] is column i of key j.
FLASHATTN_FWD8_HD void transpose4x4(const uint32_t (&r)[4], uint32_t (&d)[4]) {
  const uint32_t t0 = byte_perm(r[0], r[1], 0x5140);  // r0.0 r1.0 r0.1 r1.1
  const uint32_t t1 = byte_perm(r[0], r[1], 0x7362);  // r0.2 r1.2 r0.3 r1.3
  const uint32_t t2 = byte_perm(r[2], r[3], 0x5140);
  const uint32_t t3 = byte_perm(r[2], r[3], 0x7362);
  d[0] = byte_perm(t0, t2, 0x5410);
  d[1] = byte_perm(t0, t2, 0x7632);
  d[2] = byte_perm(t1, t3, 0x5410);
  d[3] = byte_perm(t1, t3, 0x7632);
}

// One unit of the transpose: src a V tile (block_n key rows of row_bytes, in panels of
// panel_bytes), dst a Vt tile (head-dim rows of vt_row_bytes key bytes). Generic over the
// memory (shared in the kernel, host vectors in the test).
// One unit of the transpose: src a V tile (block_n key rows of row_bytes, in panels of
// panel_bytes), dst a Vt tile (head-dim rows of vt_row_bytes key bytes), both byte offsets in
// `mem`, which loads and stores 32-bit words (ld/st.shared in the kernel, a byte vector in the
// test).
template <typename Mem>
FLASHATTN_FWD8_HD void transpose_unit_words(const Mem& mem, uint32_t src, uint32_t dst, const TransposeUnit& u,
                                            int row_bytes, int panel_bytes, int vt_row_bytes) {
  const uint32_t s = src + uint32_t((u.col / row_bytes) * panel_bytes);
  const int cb = u.col % row_bytes;
  const uint32_t r[4] = {mem.load(s + swizzled(u.key0, cb, row_bytes)), mem.load(s + swizzled(u.key0 + 1, cb, row_bytes)),
                         mem.load(s + swizzled(u.key0 + 8, cb, row_bytes)),
                         mem.load(s + swizzled(u.key0 + 9, cb, row_bytes))};
  uint32_t d[4];
  transpose4x4(r, d);
  // The four rows col .. col + 3 in an order rotated by (col / 8) mod 4: a warp's 32 stores of
  // one instruction then reach Vt rows of all eight residues mod 8 (4 words each), which the
  // 128-byte swizzle puts in distinct banks; in plain order they hit two residues (4-way
  // conflicts). The selects cost the transposers ALU slots they have to spare.
  const int rot = (u.col >> 3) & 3;
  for (int j = 0; j < 4; ++j) {
    const int i = (j + rot) & 3;
    const uint32_t x = i == 0 ? d[0] : i == 1 ? d[1] : i == 2 ? d[2] : d[3];
    mem.store(dst + swizzled(u.col + i, 4 * u.w, vt_row_bytes), x);
  }
}

// ---- The matrix transposer (the default; fwd8_kernel.h transpose_v) -----------------------------
//
// A warp moves one item, 16 keys kb .. kb + 15 (kb a multiple of 16: one half of a 32-key group)
// by 32 head-dim bytes d0 .. d0 + 31, with one ldmatrix.x4.trans, four byte permutes and one
// stmatrix.x4: 512 bytes for 6 instructions and their addresses, where the word units above
// take 32 loads, 32 stores and about 3800 instructions (SASS, d128: 120 per unit).
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

// Lane's stmatrix row address within the Vt tile (rows of vt_row_bytes, 128 or 64): matrix
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
FLASHATTN_FWD8_HD constexpr uint32_t stsm_item_bits(const MatrixItem& it, int vt_row_bytes) {
  return uint32_t(it.d0 * vt_row_bytes + it.kb);  // kb < block_n = vt_row_bytes
}
FLASHATTN_FWD8_HD constexpr uint32_t stsm_offset(const MatrixItem& it, int lane, int vt_row_bytes) {
  return stsm_item_bits(it, vt_row_bytes) ^ stsm_lane_bits(lane, vt_row_bytes);
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
