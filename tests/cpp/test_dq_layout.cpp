// The backward's dQ accumulator layout (src/cuda/common/dq_layout.h), checked on the host: the
// fragment order is a bijection of every workspace block, the main kernel's reductions (each
// lane's m16n8 accumulator fragment, for the warp grid and column passes of every head dim's
// tile in tile_size.h) land on the element they hold, and bwd_convert_dq_kernel's reads (rows r
// and r + 8 of a 16 x 8 tile as four 16-byte loads) find each element where it was added.
#include <gtest/gtest.h>

#include <vector>

#include "cuda/common/dq_layout.h"
#include "cuda/common/tile_size.h"

namespace {

using flashattn::cuda::bwd_tile;
using flashattn::cuda::BwdTile;
using flashattn::cuda::dq_frag_offset;

constexpr int kHeadDims[] = {32, 64, 96, 128, 192, 256};

TEST(DqLayout, FragmentOrderIsABijectionOfEachBlock) {
  for (int d : kHeadDims) {
    const int block_m = bwd_tile(d).block_m;
    std::vector<int> hits(size_t(block_m) * d, 0);
    for (int r = 0; r < block_m; ++r) {
      for (int c = 0; c < d; ++c) {
        const int64_t off = dq_frag_offset(r, c, d);
        ASSERT_GE(off, 0);
        ASSERT_LT(off, int64_t(block_m) * d);
        // Each 16-row group keeps its own 16 * d floats, as row-major rows would.
        EXPECT_EQ(off / (16 * d), r / 16) << "d " << d << " row " << r << " col " << c;
        ++hits[size_t(off)];
      }
    }
    for (size_t i = 0; i < hits.size(); ++i) ASSERT_EQ(hits[i], 1) << "d " << d << " offset " << i;
  }
}

// The main kernel (bwd_kernel.h): warp w of the dQ grid owns rows dq_row0 + [0, kDqRows) and
// columns pass * pass_cols + dq_col0 + [0, kDqCols); lane l adds its fragment c0..c3 of tile
// (mt, dt) with one 16-byte reduction at dq_lane + dq_frag_offset(mt * 16, pass * pass_cols +
// dt * 8), where dq_lane = dq_frag_offset(dq_row0, dq_col0) + 4 l.
TEST(DqLayout, KernelReductionsLandOnTheirElements) {
  for (int d : kHeadDims) {
    const BwdTile t = bwd_tile(d);
    const int warps_m = t.dq_warps_m, warps_d = t.warps / t.dq_warps_m;
    const int pass_cols = d / t.dq_chunks;
    const int rows = t.block_m / warps_m, cols = pass_cols / warps_d;
    ASSERT_EQ(rows % 16, 0);
    ASSERT_EQ(cols % 8, 0);
    std::vector<int> hits(size_t(t.block_m) * d, 0);
    for (int w = 0; w < t.warps; ++w) {
      const int row0 = (w % warps_m) * rows, col0 = (w / warps_m) * cols;
      for (int lane = 0; lane < 32; ++lane) {
        const int64_t lane_base = dq_frag_offset(row0, col0, d) + 4 * lane;
        for (int pass = 0; pass < t.dq_chunks; ++pass) {
          for (int mt = 0; mt < rows / 16; ++mt) {
            for (int dt = 0; dt < cols / 8; ++dt) {
              const int64_t dst = lane_base + dq_frag_offset(mt * 16, pass * pass_cols + dt * 8, d);
              EXPECT_EQ(dst % 4, 0) << "16-byte aligned";
              for (int e = 0; e < 4; ++e) {
                const int row = row0 + mt * 16 + lane / 4 + 8 * (e / 2);
                const int col = pass * pass_cols + col0 + dt * 8 + 2 * (lane % 4) + e % 2;
                ASSERT_EQ(dst + e, dq_frag_offset(row, col, d))
                    << "d " << d << " warp " << w << " lane " << lane << " pass " << pass << " e " << e;
                ++hits[size_t(dst + e)];
              }
            }
          }
        }
      }
    }
    for (size_t i = 0; i < hits.size(); ++i) ASSERT_EQ(hits[i], 1) << "d " << d << " offset " << i;
  }
}

// bwd_convert_dq_kernel: for rows r (r % 16 < 8) and column chunk col, float4 q at
// dq_frag_offset(r, col) + 4 q holds (r, col + 2q), (r, col + 2q + 1), (r + 8, col + 2q),
// (r + 8, col + 2q + 1).
TEST(DqLayout, ConvertReadsFindEachElement) {
  for (int d : kHeadDims) {
    for (int r = 0; r < 64; ++r) {
      if (r % 16 >= 8) continue;
      for (int col = 0; col < d; col += 8) {
        const int64_t src = dq_frag_offset(r, col, d);
        EXPECT_EQ(src % 4, 0) << "16-byte aligned";
        for (int q = 0; q < 4; ++q) {
          EXPECT_EQ(src + 4 * q + 0, dq_frag_offset(r, col + 2 * q, d));
          EXPECT_EQ(src + 4 * q + 1, dq_frag_offset(r, col + 2 * q + 1, d));
          EXPECT_EQ(src + 4 * q + 2, dq_frag_offset(r + 8, col + 2 * q, d));
          EXPECT_EQ(src + 4 * q + 3, dq_frag_offset(r + 8, col + 2 * q + 1, d));
        }
      }
    }
  }
}

}  // namespace
