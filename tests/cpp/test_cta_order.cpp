// Start order of causal CTAs (src/cuda/common/cta_order.h), checked on the host: the grouped
// order is a bijection of the grid for every group size, group 1 is the plain order, each group
// starts with the heaviest block of each of its planes, a smaller group starts first, and the
// group size follows the heaviest-CTA rule; and the multiply-shift divisors (fast_div.h) that the
// Hopper forward's tile order divides with give the hardware's quotients.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "cuda/common/cta_order.h"
#include "cuda/common/fast_div.h"

namespace {

using flashattn::cuda::causal_group_planes;
using flashattn::cuda::CtaSlot;
using flashattn::cuda::FastDiv;
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

namespace {

// n / d and n % d by FastDiv against the hardware's, for n < 2^31.
void expect_fast_div_exact(uint32_t d, uint32_t n) {
  const FastDiv f(d);
  ASSERT_EQ(f.div(n), n / d) << "n " << n << " d " << d;
  ASSERT_EQ(f.mod(n), n % d) << "n " << n << " d " << d;
}

TEST(FastDiv, QuotientsAreExactBelowTwoToThe31) {
  std::mt19937 rng(20261204);
  std::uniform_int_distribution<uint32_t> any_n(0, (1u << 31) - 1);
  std::vector<uint32_t> divisors;
  for (uint32_t d = 1; d <= 2048; ++d) divisors.push_back(d);
  for (int s = 11; s <= 31; ++s) {  // powers of two and their neighbours, up to 2^31
    for (int64_t delta : {-1, 0, 1}) {
      const int64_t d = (int64_t(1) << s) + delta;
      if (d >= 1 && d <= (int64_t(1) << 31)) divisors.push_back(uint32_t(d));
    }
  }
  for (int i = 0; i < 2000; ++i) divisors.push_back(1 + any_n(rng));
  for (uint32_t d : divisors) {
    // Around multiples of d (where a quotient steps), the ends of the range, and random values.
    const uint64_t top = (uint64_t(1) << 31) - 1;
    const uint64_t last = top / d;  // the last multiple of d below 2^31 is last * d
    for (uint64_t k : {uint64_t(0), uint64_t(1), uint64_t(2), last == 0 ? 0 : last - 1, last}) {
      for (int64_t delta : {-1, 0, 1}) {
        const int64_t n = int64_t(k * d) + delta;
        if (n >= 0 && n <= int64_t(top)) expect_fast_div_exact(d, uint32_t(n));
      }
    }
    expect_fast_div_exact(d, uint32_t(top));
    for (int i = 0; i < 200; ++i) expect_fast_div_exact(d, any_n(rng));
  }
  // Every n below 2^16 for the small divisors the tile orders use most.
  for (uint32_t d : {1u, 2u, 3u, 5u, 7u, 16u, 24u, 48u, 96u, 128u, 132u}) {
    for (uint32_t n = 0; n < (1u << 16); ++n) expect_fast_div_exact(d, n);
  }
}

TEST(FastDiv, GroupedOrderMatchesThePlainDivisions) {
  for (unsigned blocks : {1u, 3u, 16u, 128u}) {
    for (unsigned planes : {1u, 5u, 16u, 33u}) {
      for (unsigned group = 1; group <= planes + 1; ++group) {
        const unsigned first = planes % group;
        const FastDiv by_first(first == 0 ? 1 : first), by_group_blocks(group * blocks), by_group(group);
        for (unsigned linear = 0; linear < blocks * planes; ++linear) {
          const CtaSlot plain = grouped_cta_slot(linear, blocks, planes, group);
          const CtaSlot fast = grouped_cta_slot(linear, blocks, first, group, by_first, by_group_blocks, by_group);
          ASSERT_EQ(fast.block, plain.block) << blocks << " " << planes << " " << group << " " << linear;
          ASSERT_EQ(fast.plane, plain.plane) << blocks << " " << planes << " " << group << " " << linear;
        }
      }
    }
  }
}

}  // namespace
