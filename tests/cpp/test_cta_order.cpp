// Start order of causal CTAs (src/cuda/common/cta_order.h), checked on the host: the grouped
// order is a bijection of the grid for every group size, group 1 is the plain order, each group
// starts with the heaviest block of each of its planes, a smaller group starts first, and the
// group size follows the heaviest-CTA rule.
#include <gtest/gtest.h>

#include <vector>

#include "cuda/common/cta_order.h"

namespace {

using flashattn::cuda::causal_group_planes;
using flashattn::cuda::CtaSlot;
using flashattn::cuda::grouped_cta_slot;

TEST(CtaOrder, GroupedOrderIsABijectionOfTheGrid) {
  for (int blocks : {1, 2, 7, 32, 128}) {
    for (int planes : {1, 2, 5, 16, 33}) {
      for (int group = 1; group <= planes + 1; ++group) {
        std::vector<int> hits(size_t(blocks) * planes, 0);
        for (long long linear = 0; linear < 1LL * blocks * planes; ++linear) {
          const CtaSlot s = grouped_cta_slot(linear, blocks, planes, group);
          ASSERT_GE(s.block, 0);
          ASSERT_LT(s.block, blocks);
          ASSERT_LT(s.plane, unsigned(planes));
          ++hits[size_t(s.plane * blocks + s.block)];
        }
        for (size_t i = 0; i < hits.size(); ++i) {
          ASSERT_EQ(hits[i], 1) << "blocks " << blocks << " planes " << planes << " group " << group << " slot " << i;
        }
      }
    }
  }
}

TEST(CtaOrder, GroupOneIsThePlainOrder) {
  const int blocks = 9, planes = 6;
  for (long long linear = 0; linear < blocks * planes; ++linear) {
    const CtaSlot s = grouped_cta_slot(linear, blocks, planes, 1);
    EXPECT_EQ(s.block, linear % blocks);
    EXPECT_EQ(s.plane, unsigned(linear / blocks));
  }
}

// CTAs start in linear order: in every group, block b of each plane of the group starts before
// block b + 1 of any of them; the one smaller group (7 % 3 = 1 plane) comes first, so the last
// group is a whole one.
TEST(CtaOrder, EachGroupStartsBlockByBlock) {
  const int blocks = 5, planes = 7, group = 3;
  const int sizes[] = {1, 3, 3};
  long long linear = 0;
  int g0 = 0;
  for (int size : sizes) {
    for (int b = 0; b < blocks; ++b) {
      for (int p = 0; p < size; ++p, ++linear) {
        const CtaSlot s = grouped_cta_slot(linear, blocks, planes, group);
        EXPECT_EQ(s.block, b) << "linear " << linear;
        EXPECT_EQ(s.plane, unsigned(g0 + p)) << "linear " << linear;
      }
    }
    g0 += size;
  }
  EXPECT_EQ(linear, blocks * planes);
}

TEST(CtaOrder, GroupSizeCarriesTheHeaviestCta) {
  // Not causal, one block, one plane: plain order.
  EXPECT_EQ(causal_group_planes(false, 128, 16, 132), 1);
  EXPECT_EQ(causal_group_planes(true, 1, 16, 132), 1);
  EXPECT_EQ(causal_group_planes(true, 128, 1, 132), 1);
  // G >= 2 * slots / blocks, capped by the planes: 264 / 128 -> 3; 264 / 32 -> 9; 264 / 64 -> 5.
  EXPECT_EQ(causal_group_planes(true, 128, 16, 132), 3);
  EXPECT_EQ(causal_group_planes(true, 32, 64, 132), 9);
  EXPECT_EQ(causal_group_planes(true, 64, 64, 132), 5);
  EXPECT_EQ(causal_group_planes(true, 32, 4, 132), 4);
  // Enough blocks per plane: a plane alone carries its heaviest CTA.
  EXPECT_EQ(causal_group_planes(true, 512, 16, 132), 1);
  // The rule itself: a group's work per slot, G * blocks * blocks / 2 / slots, is at least the
  // heaviest CTA's `blocks` steps (G * blocks >= 2 * slots), and G - 1 planes' would not be.
  for (int blocks : {8, 33, 100, 256}) {
    const int slots = 132;
    const int g = causal_group_planes(true, blocks, 1 << 20, slots);
    EXPECT_GE(1LL * g * blocks, 2LL * slots) << blocks;
    if (g > 1) {
      EXPECT_LT(1LL * (g - 1) * blocks, 2LL * slots) << blocks;
    }
  }
}

}  // namespace
