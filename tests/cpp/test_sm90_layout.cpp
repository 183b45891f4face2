// Host-side algebra of the Hopper forward (src/cuda/sm90, src/cuda/ptx/smem_desc.h), checked
// without a GPU: the wgmma shared-memory descriptor fields, and the persistent tile order (every
// tile visited exactly once, heaviest query blocks first within a group of planes, and every
// tile taken by exactly one CTA over the alternating rounds).
#include <gtest/gtest.h>

#include <vector>

#include "cuda/ptx/smem_desc.h"
#include "cuda/sm90/tile_order.h"

namespace {

using flashattn::ptx::desc_advance;
using flashattn::ptx::smem_desc;
using flashattn::ptx::SmemSwizzle;
using flashattn::cuda::sm90::TileCoord;
using flashattn::cuda::sm90::TileOrder;

TEST(Sm90Descriptor, FieldsSitWhereThePtxIsaPutsThem) {
  // Start address 0x2400 (bits 0-13, 16-byte units), leading offset 16 (bits 16-29), stride
  // offset 1024 (bits 32-45), 128-byte swizzle (bits 62-63 = 1).
  const uint64_t d = smem_desc(0x2400, 16, 1024, SmemSwizzle::k128B);
  EXPECT_EQ(d & 0x3FFF, 0x2400u >> 4);
  EXPECT_EQ((d >> 16) & 0x3FFF, 1u);
  EXPECT_EQ((d >> 32) & 0x3FFF, 64u);
  EXPECT_EQ((d >> 49) & 0x7, 0u);  // base offset: tiles start on the 1024-byte swizzle period
  EXPECT_EQ(d >> 62, 1u);
  // The MN-major V operand: the leading offset steps one panel of 176 rows of 128 bytes.
  const uint64_t v = smem_desc(0x10000, 176 * 128, 1024, SmemSwizzle::k128B);
  EXPECT_EQ((v >> 16) & 0x3FFF, 176u * 128 / 16);
  // Shared addresses above 16 bits keep their bits 4..17.
  EXPECT_EQ(smem_desc(0x3FFF0, 16, 1024, SmemSwizzle::kNone) & 0x3FFF, 0x3FFFu);
}

TEST(Sm90Descriptor, AdvanceMovesOnlyTheStartAddress) {
  const uint64_t d = smem_desc(0x8000, 16, 1024, SmemSwizzle::k128B);
  for (uint32_t bytes : {32u, 64u, 96u, 2048u, 128u * 176u}) {
    const uint64_t a = desc_advance(d, bytes);
    EXPECT_EQ(a & 0x3FFF, (0x8000u + bytes) >> 4) << bytes;
    EXPECT_EQ(a >> 14, d >> 14) << bytes;  // every other field unchanged
    EXPECT_EQ(a, smem_desc(0x8000 + bytes, 16, 1024, SmemSwizzle::k128B)) << bytes;
  }
}

TEST(Sm90TileOrder, VisitsEveryTileOnceHeaviestFirstInEachGroup) {
  for (int m_blocks : {1, 3, 8, 128}) {
    for (int planes : {1, 2, 7, 32}) {
      for (int group : {1, 2, 3, 33}) {
        const TileOrder order{m_blocks * planes, m_blocks, planes, group};
        std::vector<int> hits(size_t(m_blocks) * planes, 0);
        std::vector<int> last_m(size_t(planes), m_blocks);
        for (int t = 0; t < order.tiles; ++t) {
          const TileCoord c = order.at(t);
          ASSERT_GE(c.m_block, 0);
          ASSERT_LT(c.m_block, m_blocks);
          ASSERT_GE(c.plane, 0);
          ASSERT_LT(c.plane, planes);
          ++hits[size_t(c.plane) * m_blocks + c.m_block];
          // A plane's query blocks come heaviest (last) first.
          ASSERT_LT(c.m_block, last_m[size_t(c.plane)]) << "plane " << c.plane;
          last_m[size_t(c.plane)] = c.m_block;
        }
        for (int h : hits) ASSERT_EQ(h, 1);
      }
    }
  }
}

TEST(Sm90TileOrder, AlternatingRoundsGiveEveryTileToOneCta) {
  for (int tiles : {1, 5, 132, 133, 1000}) {
    for (int ctas : {1, 7, 132}) {
      const TileOrder order{tiles, tiles, 1, 1};
      std::vector<int> hits(size_t(tiles), 0);
      for (int cta = 0; cta < ctas; ++cta) {
        for (int r = 0;; ++r) {
          const int t = order.cta_tile(r, cta, ctas);
          if (t >= tiles) break;
          ++hits[size_t(t)];
        }
      }
      for (int h : hits) ASSERT_EQ(h, 1) << "tiles " << tiles << " ctas " << ctas;
    }
  }
  // Round 1 runs backwards: the CTA that took the first (heaviest) tile takes the round's last.
  const TileOrder order{264, 264, 1, 1};
  EXPECT_EQ(order.cta_tile(0, 0, 132), 0);
  EXPECT_EQ(order.cta_tile(1, 0, 132), 263);
  EXPECT_EQ(order.cta_tile(1, 131, 132), 132);
}

}  // namespace
