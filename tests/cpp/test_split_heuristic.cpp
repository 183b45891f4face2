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
  for (SplitCost model : {SplitCost::kDecode, SplitCost::kDecodeMerge}) {
    // Batch 64, 8 KV heads (512 CTAs, 1.3 waves unsplit): 3 splits measured best at 4k and 16k keys.
    EXPECT_EQ(choose_num_splits(512, 4096 / 128, kSms, 3, 64, model), 3);
    EXPECT_EQ(choose_num_splits(512, 16384 / 128, kSms, 3, 64, model), 3);
    // Batch 8 (64 CTAs), 64k and 128k keys: one wave of 6 splits.
    EXPECT_EQ(choose_num_splits(64, 65536 / 128, kSms, 3, 64, model), 6);
    EXPECT_EQ(choose_num_splits(64, 131072 / 128, kSms, 3, 64, model), 6);
    // Batch 1 (8 CTAs), 128k keys: as many splits as one wave holds.
    const int s = choose_num_splits(8, 131072 / 128, kSms, 3, 64, model);
    EXPECT_LE(8LL * s, 3LL * kSms);
    EXPECT_GE(8LL * s, 3LL * kSms - 8);
  }
}

TEST(SplitHeuristic, DecodeBatchOneWeighsTheMerge) {
  // Batch 1, 8 KV heads, d128 (split_heuristic.h kDecodeMerge, measured on the H200 in
  // dev/results/h200-2026-12-03-s16-decode-splits-63d3dd6.json): 4k keys (32 blocks of 128) 16
  // splits of two blocks (12.4 us against 13.5 for 32 one-block splits: the merge reads the
  // partials in batches of 8, one L2 round trip each), 16k keys 32 splits (26.5 us against 28.5
  // for the 43 the model without the merge picks).
  EXPECT_EQ(choose_num_splits(8, 4096 / 128, kSms, 3, 64, SplitCost::kDecodeMerge), 16);
  EXPECT_EQ(choose_num_splits(8, 16384 / 128, kSms, 3, 64, SplitCost::kDecodeMerge), 32);
  // Without the merge term (the MLA decode, its own combine kernel): one key block per split.
  EXPECT_EQ(choose_num_splits(8, 4096 / 128, kSms, 3, 64, SplitCost::kDecode), 32);
}

TEST(SplitHeuristic, StaysWithinItsBounds) {
  for (SplitCost model : {SplitCost::kRowTiles, SplitCost::kDecode, SplitCost::kDecodeMerge}) {
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
