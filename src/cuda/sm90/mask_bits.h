// attn_mask as bits for the Hopper forward's bias and mask kernels (fwd_kernel.h, FwdBiasTraits
// and FwdMaskTraits) and the bias backward: every mask (a uint8 tile in the bias slot, the other
// form measured, ran 7-17% slower), a pass before the kernel packs it into the launch's
// workspace, one bit per key, in the order the consumers read it, and each consumer thread loads
// one 32-bit word per row and key block instead of 32 bytes one by one.
//
// Layout: per row of the mask (batch|1, head|1, row|1: broadcast dimensions stay broadcast),
// ceil(seqlen_k / 128) groups of 128 keys (a key block of the bias kernel), each 4 words (16
// bytes). Key 8c + r of a group (chunk c = 0..15, r = 0..7) is bit 16 (r % 2) + c of word r / 2:
// word t holds exactly the keys of the S accumulator's pairs of quad lane t (keys 8c + 2t + e,
// fwd_kernel.h ConsumerState), with the bits of e = 0 in the low half and of e = 1 in the high
// half, bit c of each half for chunk c (the order of apply_mask's interval bits). A set bit keeps
// the key (a nonzero byte); keys past seqlen_k are 0.
// The backward reads the words of 64 query rows of one group per step, copied by its producer
// (bwd_kernel.h): there the pack writes them group-major (MaskBitsOrder::kGroupMajor: per (batch,
// head), group n's rows contiguous, 16 bytes each, rows padded with zero words to a multiple of
// kMaskBitsRowBlock), so that a step's words are one 1 KB bulk copy. The forward keeps row-major
// (a row's groups contiguous), its consumers loading one word per row and key block.
// Why this order and not key k at bit k % 32 of word k / 32: a lane then needs one word per row
// (a quad reads 16 contiguous bytes), 2 registers live across the S product instead of 8, and
// no shift by 2t; the pack (a warp ballot per byte position) costs the same either way.
// Host-device, so that tests/cpp/test_sm90_layout.cpp plays the pack and the consumers' bit tests
// out on the host. The kernel indexes the words in 32 bits: the launcher declines a mask of more
// than kMaskBitsMaxWords words (NotSupported: sm80 under the default path).
#pragma once

#include <cstdint>

#include "core/host_device.h"
#include "core/params.h"

namespace flashattn::cuda::sm90 {

constexpr int kMaskBitsGroupKeys = 128;  // keys per group: the bias kernel's key block
constexpr int kMaskBitsGroupWords = 4;   // words per group: one per lane of a quad
constexpr int64_t kMaskBitsMaxWords = int64_t(1) << 32;
constexpr int kMaskBitsRowBlock = 64;    // kGroupMajor: rows padded to the backward's query block

enum class MaskBitsOrder { kRowMajor, kGroupMajor };

// The packed mask of one launch (FwdParams::mask_bits). words == nullptr: not packed.
struct MaskBits {
  const uint32_t* words = nullptr;
  int64_t batch = 0, head = 0, row = 0;  // strides in words; 0 where the mask broadcasts
  int64_t group = kMaskBitsGroupWords;   // words from a row's group to its next
};

// Where key `key` (0..127) of a group sits: word key % 8 / 2, bit 16 (key % 2) + key / 8.
FLASHATTN_HOST_DEVICE constexpr int mask_bits_word(int key) { return key % 8 / 2; }
FLASHATTN_HOST_DEVICE constexpr int mask_bits_bit(int key) { return 16 * (key % 2) + key / 8; }

// The consumer's test: whether the score of pair chunk c, element e (key 8c + 2t + e of the
// block, t the lane in its quad) is kept, from word t of its row's group.
FLASHATTN_HOST_DEVICE constexpr bool mask_bits_keep(uint32_t word, int c, int e) {
  return ((word >> (16 * e + c)) & 1u) != 0u;
}

// A forward key block of block_n keys (128, or 64: d256's mask kernel) is group
// n * block_n / 128 of its row; a 64-key block is half a group, its 8 chunks bits 8 (n % 2) .. +7
// of each 16-bit half, which mask_bits_block_word shifts to bits 0..7, so mask_bits_keep(word, c,
// e) tests key 8c + 2t + e of the block for c < block_n / 8 either way.
FLASHATTN_HOST_DEVICE constexpr int mask_bits_block_group(int n, int block_n) { return n / (kMaskBitsGroupKeys / block_n); }
FLASHATTN_HOST_DEVICE constexpr uint32_t mask_bits_block_word(uint32_t group_word, int n, int block_n) {
  return block_n == kMaskBitsGroupKeys ? group_word : group_word >> (8 * (n % (kMaskBitsGroupKeys / block_n)));
}

// The backward's read (bwd_kernel.h, the dK/dV kernel's transposed scores): its thread (g =
// lane / 4, t = lane % 4) holds keys 8c' + g of the group (c' = 8 consumer + 2 warp + h) for
// query rows 8c + 2t + e (c = 0..7, e = 0, 1) of the step's 64. Key 8c' + g is bit c' of 16-bit
// half g of its row's 16 bytes (half g % 2 of word g / 2): one halfword per row holds every key
// the thread needs. With a step's 64 rows of 16 bytes in shared memory (row r at 16 r), two
// ldmatrix.x4.trans of 8 x 8 16-bit matrices (matrix c = rows 8c .. 8c + 7, each row one 16-byte
// row) give lane l, in register c, halfword g of rows 8c + 2t (low half) and 8c + 2t + 1 (high):
// lane l addresses row l of matrices 0-3 (read 0) and row 32 + l (read 1), at 16 l and 512 + 16
// l bytes (every lane row 0 when the mask broadcasts over the rows).
FLASHATTN_HOST_DEVICE constexpr uint32_t mask_bits_t_lane_offset(int lane, bool row_broadcast) {
  return row_broadcast ? 0u : uint32_t(16 * lane);
}
FLASHATTN_HOST_DEVICE constexpr uint32_t mask_bits_t_read_step(bool row_broadcast) { return row_broadcast ? 0u : 512u; }

// The thread's keep bits from those eight registers: score (key 8c' + g, c' = hbit0 + h; row 8c
// + 2t + e) at bit 4c + 2h + e (its index in the S^T accumulator), hbit0 = 8 consumer + 2 warp.
FLASHATTN_HOST_DEVICE uint32_t mask_bits_fold_t(const uint32_t (&pairs)[8], int hbit0) {
  uint32_t keep = 0u;
  for (int c = 0; c < 8; ++c) {
    const uint32_t x = pairs[c] >> hbit0;
    keep |= ((x & 1u) | ((x >> 15) & 2u) | ((x << 1) & 4u) | ((x >> 14) & 8u)) << (4 * c);
  }
  return keep;
}

// The pack (mask_bits.cu): lane l of a warp reads bytes 8l .. 8l + 7 of 256 keys of a row, i.e.
// chunk l % 16 of group l / 16 of the pair, and the warp ballots byte position r (r = 0..7):
// ballot r has bit l set when lane l's byte r is nonzero. Word t of group `half` (0, 1) is then
// the low or high 16 bits of ballot 2t (e = 0, bit c) and of ballot 2t + 1 (e = 1, bit 16 + c).
FLASHATTN_HOST_DEVICE constexpr uint32_t mask_bits_word_of_ballots(uint32_t even, uint32_t odd, int half) {
  return half == 0 ? (even & 0xffffu) | (odd << 16) : (even >> 16) | (odd & 0xffff0000u);
}

// The packed mask's extents for a mask over (batch, heads, seqlen_q, seqlen_k) (core/params.h
// Broadcast4: stride 0 where it broadcasts): groups per row, rows per head, heads per batch
// entry, batch entries, and the rows stored per head (rows, or kGroupMajor's padded count).
struct MaskBitsShape {
  int64_t groups, rows, heads, batch, rows_stored;
  MaskBitsOrder order;
  FLASHATTN_HOST_DEVICE int64_t words() const { return batch * heads * rows_stored * groups * kMaskBitsGroupWords; }
};

FLASHATTN_HOST_DEVICE MaskBitsShape mask_bits_shape(const Broadcast4& m, int seqlen_q, int seqlen_k,
                                                    MaskBitsOrder order = MaskBitsOrder::kRowMajor) {
  const int64_t rows = m.row == 0 ? 1 : seqlen_q;
  const int64_t stored = order == MaskBitsOrder::kGroupMajor && rows > 1
                             ? (rows + kMaskBitsRowBlock - 1) / kMaskBitsRowBlock * kMaskBitsRowBlock
                             : rows;
  return MaskBitsShape{(int64_t(seqlen_k) + kMaskBitsGroupKeys - 1) / kMaskBitsGroupKeys, rows,
                       m.head == 0 ? 1 : m.size[1], m.batch == 0 ? 1 : m.size[0], stored, order};
}

// Strides in words of the packed mask (0 where the mask broadcasts). kRowMajor: rows of `groups`
// groups, then heads, then batch entries; kGroupMajor: groups of `rows_stored` rows of 4 words,
// then heads, then batch entries.
FLASHATTN_HOST_DEVICE MaskBits mask_bits_strides(const Broadcast4& m, const MaskBitsShape& s, const uint32_t* words) {
  MaskBits b;
  b.words = words;
  const bool group_major = s.order == MaskBitsOrder::kGroupMajor;
  const int64_t row = group_major ? kMaskBitsGroupWords : s.groups * kMaskBitsGroupWords;
  const int64_t plane = s.rows_stored * s.groups * kMaskBitsGroupWords;
  b.row = m.row == 0 ? 0 : row;
  b.group = group_major ? s.rows_stored * kMaskBitsGroupWords : kMaskBitsGroupWords;
  b.head = m.head == 0 ? 0 : plane;
  b.batch = m.batch == 0 ? 0 : plane * s.heads;
  return b;
}

// Index of word t of the first group of (sequence b, head h, row i) (i inside the sequence; the
// kernel clamps rows past it to its last row); group n's word is n m.group further.
FLASHATTN_HOST_DEVICE int64_t mask_bits_row_word(const MaskBits& m, int64_t b, int64_t h, int64_t i, int t) {
  return b * m.batch + h * m.head + i * m.row + t;
}

// The pack itself (mask_bits.cu) is declared in fwd.h (mask_bits_bytes, build_mask_bits): this
// header stays free of the CUDA runtime for the host tests.

}  // namespace flashattn::cuda::sm90
