// Number of split-KV splits (src/cuda/common/split_heuristic.h), checked on the host: the
// row-tile model never splits a grid that fills the GPU, the decode model evens out the last
// wave of one, and both pick the splits measured fastest for the decode suite's shapes on H200
// (dev/results/h200-2026-11-29-decode-splits.json: 132 SMs, 3 decode CTAs per SM at d128).
#include <gtest/gtest.h>

#include "cuda/common/split_heuristic.h"

namespace {

using flashattn::cuda::choose_num_splits;
using flashattn::cuda::SplitCost;

constexpr int kSms = 132;

TEST(SplitHeuristic, RowTilesNeverSplitAFullGrid) {
  for (long long ctas : {264LL, 300LL, 2048LL}) {
    EXPECT_EQ(choose_num_splits(ctas, 64, kSms, 2), 1) << ctas;
  }
  // A small grid with long rows of key blocks splits until it fills the GPU.
  const int s = choose_num_splits(16, 256, kSms, 2);
  EXPECT_GT(s, 1);
  EXPECT_LE(16LL * s, 2LL * kSms);
}

TEST(SplitHeuristic, DecodeMatchesTheMeasuredOptima) {
  // Batch 64, 8 KV heads (512 CTAs, 1.3 waves unsplit): 3 splits measured best at 4k and 16k keys.
  EXPECT_EQ(choose_num_splits(512, 4096 / 128, kSms, 3, 64, SplitCost::kDecode), 3);
  EXPECT_EQ(choose_num_splits(512, 16384 / 128, kSms, 3, 64, SplitCost::kDecode), 3);
  // Batch 8 (64 CTAs), 64k and 128k keys: one wave of 6 splits.
  EXPECT_EQ(choose_num_splits(64, 65536 / 128, kSms, 3, 64, SplitCost::kDecode), 6);
  EXPECT_EQ(choose_num_splits(64, 131072 / 128, kSms, 3, 64, SplitCost::kDecode), 6);
  // Batch 1 (8 CTAs), 128k keys: as many splits as one wave holds.
  const int s = choose_num_splits(8, 131072 / 128, kSms, 3, 64, SplitCost::kDecode);
  EXPECT_LE(8LL * s, 3LL * kSms);
  EXPECT_GE(8LL * s, 3LL * kSms - 8);
}

TEST(SplitHeuristic, DecodeBatchOneTakesOneKeyBlockPerSplit) {
  // Batch 1, 8 KV heads, 4k keys (32 blocks of 128): 32 splits, 256 CTAs in one wave, each one
  // key block. Each such CTA copies Q, K and V in its prologue (FwdTraits::kSplitKeys), so the
  // whole cache is requested at once and the step waits for one DRAM round trip plus the
  // transfer; 16 splits of two blocks would wait for three round trips (K and V of the second
  // block follow the first's), and the fused combine leaves the merge cost nearly independent of
  // the split count (dev/NOTES.md "Decode latency").
  EXPECT_EQ(choose_num_splits(8, 4096 / 128, kSms, 3, 64, SplitCost::kDecode), 32);
}

TEST(SplitHeuristic, StaysWithinItsBounds) {
  for (SplitCost model : {SplitCost::kRowTiles, SplitCost::kDecode}) {
    for (long long ctas : {1LL, 7LL, 64LL, 500LL, 5000LL}) {
      for (int n_blocks : {0, 1, 2, 9, 1000}) {
        for (int max_splits : {1, 8, 64}) {
          const int s = choose_num_splits(ctas, n_blocks, kSms, 3, max_splits, model);
          EXPECT_GE(s, 1);
          EXPECT_LE(s, std::max(1, std::min(max_splits, n_blocks)));
        }
      }
    }
  }
  EXPECT_EQ(choose_num_splits(8, 1, kSms, 3, 64, SplitCost::kDecode), 1);
  EXPECT_EQ(choose_num_splits(8, 100, 0, 3, 64, SplitCost::kDecode), 1);  // no SM count: no split
}

}  // namespace
