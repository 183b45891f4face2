// How the CUDA forward classifies one of its key tiles under a block mask (cuda/block_tiles.h
// says why), host-device so that tests/cpp/test_tile_kind.cpp proves the classification on the
// host.
#pragma once

#include <cstdint>

#include "core/host_device.h"
#include "core/params.h"

namespace flashattn::cuda {

// What a visited key tile needs besides the window mask; stored in a list entry above
// kTileKindShift, the tile index below it.
enum TileKind : int32_t {
  kTileClean = 0,  // only full blocks (or partial ones without attn_mask): no element check
  kTileMask = 1,   // only partial blocks: attn_mask per element
  kTileMixed = 2,  // anything else: each element's block state, then attn_mask where partial
};
constexpr int kTileKindShift = 24;
constexpr int32_t kTileIndexMask = (1 << kTileKindShift) - 1;
constexpr int32_t kTileSkipped = -1;  // tile_kind: no kept block, the tile is not visited

// The user blocks [*first, *last] that tile t of `tile` positions covers along one axis of
// `len` positions (blocks of `block`); t * tile < len.
// Positions fit in 32 bits (len is a sequence length, an int), so the divisions are unsigned
// 32-bit ones: a 64-bit division by a run-time value is a ~100-instruction subroutine on the GPU,
// and it bound the plan's list kernel (block_tiles.cu; dev/NOTES.md, "the plan's kernels").
FLASHATTN_HOST_DEVICE void tile_blocks(int64_t t, int64_t tile, int64_t block, int64_t len, int64_t* first,
                                       int64_t* last) {
  const uint32_t start = uint32_t(t) * uint32_t(tile), next = start + uint32_t(tile);
  const uint32_t end = next < uint32_t(len) ? next : uint32_t(len);
  *first = start / uint32_t(block);
  *last = (end - 1) / uint32_t(block);
}

// The kind of a tile whose rectangle touches the query blocks [r0, r1] and key blocks [c0, c1]
// of a table of BlockState bytes (row stride k_blocks), or kTileSkipped. has_mask: the call
// has attn_mask (without it a partial block is visible everywhere, as a full one).
FLASHATTN_HOST_DEVICE int32_t tile_kind(const uint8_t* table, int64_t k_blocks, int64_t r0, int64_t r1, int64_t c0,
                                        int64_t c1, bool has_mask) {
  unsigned seen = 0;  // bit s: some block in state s
  for (int64_t r = r0; r <= r1; ++r) {
    for (int64_t c = c0; c <= c1; ++c) seen |= 1u << table[r * k_blocks + c];
  }
  constexpr unsigned kPartial = 1u << kBlockPartial, kFull = 1u << kBlockFull;
  if (!has_mask && (seen & kPartial) != 0) seen = (seen & ~kPartial) | kFull;
  if ((seen & (kPartial | kFull)) == 0) return kTileSkipped;
  return seen == kFull ? kTileClean : seen == kPartial ? kTileMask : kTileMixed;
}

// A read of data no thread writes during the kernel: through the read-only cache on the device.
template <typename T>
FLASHATTN_HOST_DEVICE T read_only(const T* p) {
#if defined(__CUDA_ARCH__)
  return __ldg(p);
#else
  return *p;
#endif
}

// Whether the score of key j is hidden (beyond the window mask) in a tile of `kind`, given its
// query row's block states (block_row: key block c at block_row[c], blocks of block_k keys) and
// attn_mask bytes (mask_row[j]; null: no attn_mask). Each is read only where the kind needs it,
// so clean tiles read nothing and full blocks never read attn_mask.
FLASHATTN_HOST_DEVICE bool hidden_in_tile(int32_t kind, const uint8_t* block_row, int j, int block_k,
                                          const uint8_t* mask_row) {
  const auto drops = [&] { return mask_row != nullptr && read_only(mask_row + j) == 0; };
  if (kind == kTileMask) return drops();
  if (kind == kTileMixed) {
    const uint8_t s = read_only(block_row + j / block_k);
    return s == kBlockAbsent || (s == kBlockPartial && drops());
  }
  return false;
}

// The first of `count` list entries (descending tile index; entry(e) reads entry e) whose tile
// is below n_hi: a binary search, since a causal or split-KV CTA may start deep in the list,
// where skipping entry by entry would cost one dependent load each.
template <typename Entry>
FLASHATTN_HOST_DEVICE int first_tile_below(int count, int n_hi, const Entry& entry) {
  int lo = 0, hi = count;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if ((entry(mid) & kTileIndexMask) >= n_hi) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

}  // namespace flashattn::cuda
