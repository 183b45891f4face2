// The clamps every varlen kernel applies to the cu_seqlens it reads on the device
// (src/cuda/common/seq_extent.h), checked on the host: valid metadata passes unchanged, and any
// int32 values at all give a sequence inside the packed tensor and no longer than max_seqlen.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <random>
#include <vector>

#include "cuda/common/seq_extent.h"

namespace {

using flashattn::cuda::clamp_count;
using flashattn::cuda::clamp_row0;
using flashattn::cuda::clamp_seqlen;
using flashattn::cuda::rows_limit;

TEST(SeqExtent, ValidMetadataPassesUnchanged) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const int batch = 1 + int(rng() % 9);
    std::vector<int32_t> cu(batch + 1, 0);
    int max_len = 0;
    for (int b = 0; b < batch; ++b) {
      const int n = int(rng() % 300);  // empty sequences included
      cu[b + 1] = cu[b] + n;
      max_len = std::max(max_len, n);
    }
    // Spare rows after the last sequence, and a max_seqlen above the longest, are allowed.
    const int32_t total = rows_limit(cu[batch] + int64_t(rng() % 3) * 17);
    const int max_arg = max_len + int(rng() % 2) * 5;
    for (int b = 0; b < batch; ++b) {
      const int32_t row0 = clamp_row0(cu[b], total);
      EXPECT_EQ(row0, cu[b]);
      EXPECT_EQ(clamp_seqlen(row0, cu[b + 1], total, max_arg), cu[b + 1] - cu[b]);
      // A block table's key counts: the same count, whatever k's rows are.
      EXPECT_EQ(clamp_count(cu[b], cu[b + 1], max_arg), cu[b + 1] - cu[b]);
    }
  }
}

TEST(SeqExtent, AnyValuesStayInsideTheRows) {
  std::mt19937 rng(11);
  const int32_t specials[] = {INT32_MIN, INT32_MIN + 1, -1000, -1, 0, 1, 5, 99, 100, 101, 1 << 20, INT32_MAX - 1,
                              INT32_MAX};
  auto draw = [&]() -> int32_t {
    if (rng() % 2) return specials[rng() % (sizeof(specials) / sizeof(specials[0]))];
    return int32_t(rng());
  };
  for (int trial = 0; trial < 100000; ++trial) {
    const int32_t total = trial % 7 == 0 ? 0 : (trial % 13 == 0 ? INT32_MAX : int32_t(rng() % 200));
    const int max_len = trial % 11 == 0 ? 0 : (trial % 17 == 0 ? INT32_MAX : int(rng() % 150));
    const int32_t begin = draw(), end = draw();
    const int32_t row0 = clamp_row0(begin, total);
    const int32_t len = clamp_seqlen(row0, end, total, max_len);
    ASSERT_GE(row0, 0);
    ASSERT_LE(row0, total);
    ASSERT_GE(len, 0);
    ASSERT_LE(len, max_len);
    ASSERT_LE(int64_t(row0) + len, total) << "begin " << begin << " end " << end << " total " << total;
    // Valid values pass: a length never exceeds what end - begin asks for.
    ASSERT_LE(len, std::max<int64_t>(int64_t(end) - row0, 0));
    const int32_t count = clamp_count(begin, end, max_len);
    ASSERT_GE(count, 0);
    ASSERT_LE(count, max_len);
    ASSERT_EQ(count, int32_t(std::min<int64_t>(std::max<int64_t>(int64_t(end) - begin, 0), max_len)));
  }
}

TEST(SeqExtent, RowsBeyondInt32AreLimited) {
  EXPECT_EQ(rows_limit(int64_t(1) << 40), INT32_MAX);
  EXPECT_EQ(rows_limit(INT32_MAX), INT32_MAX);
  EXPECT_EQ(rows_limit(12345), 12345);
  EXPECT_EQ(rows_limit(0), 0);
  // A sequence ending at the last int32 row of a tensor with more rows than that.
  EXPECT_EQ(clamp_seqlen(clamp_row0(INT32_MAX - 10, rows_limit(int64_t(1) << 33)), INT32_MAX,
                         rows_limit(int64_t(1) << 33), 100), 10);
  EXPECT_EQ(clamp_count(INT32_MIN, INT32_MAX, INT32_MAX), INT32_MAX);
}

TEST(SeqExtent, DecreasingOrOutsideValuesGiveEmptyOrShortenedSequences) {
  // cu = [0, 50, 30, 500] over 100 rows, max_seqlen 60: the second sequence (50 -> 30) is
  // empty, the third (30 -> 500) is cut at max_seqlen, a start past the rows is at the end.
  EXPECT_EQ(clamp_seqlen(clamp_row0(50, 100), 30, 100, 60), 0);
  EXPECT_EQ(clamp_seqlen(clamp_row0(30, 100), 500, 100, 60), 60);
  EXPECT_EQ(clamp_seqlen(clamp_row0(30, 100), 500, 100, 90), 70);
  EXPECT_EQ(clamp_row0(150, 100), 100);
  EXPECT_EQ(clamp_seqlen(clamp_row0(150, 100), 160, 100, 60), 0);
  EXPECT_EQ(clamp_row0(-5, 100), 0);
  EXPECT_EQ(clamp_seqlen(clamp_row0(-5, 100), 10, 100, 60), 10);
}

}  // namespace
