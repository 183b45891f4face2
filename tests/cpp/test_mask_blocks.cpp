// Block-level mask queries (src/cuda/common/mask.h), checked on the host against
// block_needs_mask: the query blocks that need no mask for a fixed key range, which the Hopper
// backward's dK/dV kernels test per step instead of block_needs_mask.
#include <gtest/gtest.h>

#include <random>

#include "cuda/common/mask.h"

namespace {

using flashattn::cuda::WindowMask;

// Every query block, every key range of width 64 (the dK/dV consumers' rows) and 128, over
// causal, sliding-window, one-sided and unbounded masks, with seqlen_q above, equal to and below
// seqlen_k and sequences that end inside a block.
TEST(MaskBlocks, UnmaskedRowBlocksAreExactlyTheBlocksWithoutAMask) {
  std::mt19937 rng(20261202);
  const int sides[] = {-1, 0, 1, 5, 63, 64, 65, 200, 1000};
  int cases = 0, clean = 0, masked = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const int seqlen_q = 1 + int(rng() % 700);
    const int seqlen_k = 1 + int(rng() % 700);
    const WindowMask mask{seqlen_q, seqlen_k, sides[rng() % 9], sides[rng() % 9]};
    for (int block_m : {64, 128}) {
      for (int width : {64, 128}) {
        for (int c0 = 0; c0 < seqlen_k; c0 += width) {
          int lo = 0, hi = 0;
          mask.unmasked_row_blocks(c0, c0 + width, block_m, &lo, &hi);
          for (int m = 0; m * block_m < seqlen_q; ++m) {
            const int r0 = m * block_m;
            const int r1 = r0 + block_m < seqlen_q ? r0 + block_m : seqlen_q;
            const bool needs = mask.block_needs_mask(r0, r1, c0, c0 + width);
            ASSERT_EQ(!needs, lo <= m && m < hi)
                << "seqlen_q " << seqlen_q << " seqlen_k " << seqlen_k << " left " << mask.left << " right "
                << mask.right << " block_m " << block_m << " keys [" << c0 << ", " << c0 + width << ") block " << m
                << " interval [" << lo << ", " << hi << ")";
            ++cases;
            (needs ? masked : clean) += 1;
          }
        }
      }
    }
  }
  // The draw covers both answers well (not a test that passes on an empty set).
  EXPECT_GT(clean, cases / 10);
  EXPECT_GT(masked, cases / 10);
}

}  // namespace
