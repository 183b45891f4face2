// The CUDA forward's block-sparse tile classification (src/cuda/common/tile_kind.h), checked on
// the host against the element-level rule of docs/SEMANTICS.md ("Compressed block mask"): for
// random block tables at aligned and unaligned block sizes and ragged lengths, a skipped tile
// holds no visible score, a clean tile only scores visible whatever attn_mask says, a mask tile
// only scores of partial blocks (visible exactly where attn_mask keeps), and with block sizes
// that are multiples of the tile no tile is mixed (the fast path). Together with the kernel's
// per-score rule (hidden_in_tile) every score of every tile gets exactly the CPU backend's
// visibility. The walk's start (first_tile_below) finds the first listed tile below a bound.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "cuda/common/tile_kind.h"

namespace {

using flashattn::cuda::first_tile_below;
using flashattn::cuda::hidden_in_tile;
using flashattn::cuda::tile_blocks;
using flashattn::cuda::tile_kind;
using flashattn::cuda::kTileClean;
using flashattn::cuda::kTileMask;
using flashattn::cuda::kTileMixed;
using flashattn::cuda::kTileSkipped;

struct Geometry {
  int bq, bk, tile_m, tile_n, seqlen_q, seqlen_k;
};

TEST(TileKind, MatchesTheElementRule) {
  const Geometry geometries[] = {
      {128, 128, 128, 64, 1000, 1000},  // FlexAttention's blocks on the d128 tile
      {64, 64, 128, 64, 300, 520},      // blocks smaller than the tile's rows
      {96, 80, 128, 64, 700, 900},      // unaligned both ways
      {1, 64, 16, 128, 1, 1000},        // decode tile
      {7, 5, 64, 32, 150, 77},
      {256, 128, 64, 32, 513, 300},
  };
  std::mt19937 g(18);
  int kinds_seen[3] = {0, 0, 0};
  for (const Geometry& ge : geometries) {
    const int64_t qb = (ge.seqlen_q + ge.bq - 1) / ge.bq, kb = (ge.seqlen_k + ge.bk - 1) / ge.bk;
    for (const double absent : {0.0, 0.5, 1.0}) {
      for (const bool has_mask : {false, true}) {
        std::uniform_real_distribution<double> u(0.0, 1.0);
        std::vector<uint8_t> table(static_cast<size_t>(qb * kb));
        // attn_mask, 0 throughout full blocks: a read there would hide a visible score.
        std::vector<uint8_t> mask(static_cast<size_t>(ge.seqlen_q) * ge.seqlen_k);
        for (uint8_t& x : mask) x = u(g) < 0.5 ? 1 : 0;
        for (uint8_t& s : table) {
          const double x = u(g);
          s = x < absent ? flashattn::kBlockAbsent : x < absent + (1 - absent) / 2 ? flashattn::kBlockPartial
                                                                                  : flashattn::kBlockFull;
        }
        for (int64_t i = 0; i < ge.seqlen_q; ++i) {
          for (int64_t j = 0; j < ge.seqlen_k; ++j) {
            if (table[static_cast<size_t>(i / ge.bq * kb + j / ge.bk)] == flashattn::kBlockFull) {
              mask[static_cast<size_t>(i * ge.seqlen_k + j)] = 0;
            }
          }
        }
        const bool aligned = ge.bq % ge.tile_m == 0 && ge.bk % ge.tile_n == 0;
        for (int64_t m = 0; m * ge.tile_m < ge.seqlen_q; ++m) {
          int64_t r0, r1;
          tile_blocks(m, ge.tile_m, ge.bq, ge.seqlen_q, &r0, &r1);
          for (int64_t n = 0; n * ge.tile_n < ge.seqlen_k; ++n) {
            int64_t c0, c1;
            tile_blocks(n, ge.tile_n, ge.bk, ge.seqlen_k, &c0, &c1);
            const int32_t kind = tile_kind(table.data(), kb, r0, r1, c0, c1, has_mask);
            if (kind >= 0) ++kinds_seen[kind];
            if (aligned) {
              ASSERT_NE(kind, kTileMixed) << "aligned blocks " << ge.bq << "x" << ge.bk;
            }
            // Every score of the tile (clipped to the lengths) against the rule.
            bool any_visible = false;
            for (int64_t i = m * ge.tile_m; i < std::min<int64_t>((m + 1) * ge.tile_m, ge.seqlen_q); ++i) {
              for (int64_t j = n * ge.tile_n; j < std::min<int64_t>((n + 1) * ge.tile_n, ge.seqlen_k); ++j) {
                const uint8_t s = table[static_cast<size_t>(i / ge.bq * kb + j / ge.bk)];
                ASSERT_TRUE(i / ge.bq >= r0 && i / ge.bq <= r1 && j / ge.bk >= c0 && j / ge.bk <= c1);
                // Visible for some attn_mask / for every attn_mask.
                const bool maybe = s != flashattn::kBlockAbsent;
                const bool always = s == flashattn::kBlockFull || (s == flashattn::kBlockPartial && !has_mask);
                any_visible = any_visible || maybe;
                if (kind == kTileClean) {
                  ASSERT_TRUE(always) << "clean tile with a hidden score";
                }
                if (kind == kTileMask) {
                  ASSERT_TRUE(has_mask && s == flashattn::kBlockPartial) << "mask tile outside a partial block";
                }
                // The kernel's decision for a visited tile against the CPU backend's rule
                // (cpu/attention_common.h ScoreMods::apply): absent hides, partial follows
                // attn_mask, full shows; full blocks never read attn_mask.
                const bool keeps = !has_mask || mask[static_cast<size_t>(i * ge.seqlen_k + j)] != 0;
                const bool visible = s == flashattn::kBlockFull || (s == flashattn::kBlockPartial && keeps);
                if (kind != kTileSkipped) {
                  const uint8_t* block_row = table.data() + i / ge.bq * kb;
                  const uint8_t* mask_row = has_mask ? mask.data() + i * ge.seqlen_k : nullptr;
                  ASSERT_EQ(!hidden_in_tile(kind, block_row, static_cast<int>(j), ge.bk, mask_row), visible)
                      << "kind " << kind << " state " << int(s);
                }
              }
            }
            ASSERT_EQ(kind == kTileSkipped, !any_visible) << "a tile is skipped iff nothing in it is kept";
          }
        }
      }
    }
  }
  // The random tables reach every kind (u is drawn once more per table for attn_mask).
  EXPECT_GT(kinds_seen[kTileClean], 0);
  EXPECT_GT(kinds_seen[kTileMask], 0);
  EXPECT_GT(kinds_seen[kTileMixed], 0);
}

// The walk starts at the first entry below n_hi of a descending list, whatever n_hi.
TEST(TileKind, FirstTileBelow) {
  std::mt19937 g(7);
  for (int count = 0; count < 40; ++count) {
    std::vector<int32_t> entries;
    for (int t = 200; static_cast<int>(entries.size()) < count; t -= 1 + static_cast<int>(g() % 5)) {
      entries.push_back(t | (static_cast<int32_t>(g() % 3) << flashattn::cuda::kTileKindShift));
    }
    for (int n_hi = -1; n_hi <= 202; ++n_hi) {
      int want = 0;
      while (want < count && (entries[static_cast<size_t>(want)] & flashattn::cuda::kTileIndexMask) >= n_hi) ++want;
      EXPECT_EQ(first_tile_below(count, n_hi, [&](int e) { return entries[static_cast<size_t>(e)]; }), want)
          << count << " entries, n_hi " << n_hi;
    }
  }
}

}  // namespace
