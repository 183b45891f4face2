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

}  // namespace fwd8
}  // namespace flashattn::cuda::sm90

#undef FLASHATTN_FWD8_HD
