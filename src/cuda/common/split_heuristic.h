// How many key/value splits (flash-decoding) a forward launch should use.
#pragma once

#include <algorithm>

namespace flashattn::cuda {

// Which cost model choose_num_splits applies.
enum class SplitCost {
  // The row-split forward (fwd_tile): splitting pays only when the unsplit grid leaves the GPU
  // partly idle, since the float32 partials of many rows cost real traffic. Cost
  // waves(ctas * s) * ceil(n_blocks / s) + 0.05 s.
  kRowTiles,
  // The decode shape (fwd_decode_tile, at most 16 rows): bound by reading K and V, with partials
  // of a few rows only, so a full grid may split too, to even out its last wave. Cost
  // waves(ctas * s) * (ceil(n_blocks / s) + 2), the 2 standing for a CTA's fixed work (Q load,
  // merge, partial store) in key-block times. Against measured optima (H200, d128 bf16, 8 KV
  // heads, dev/results/h200-2026-11-29-decode-splits.json): batch 64 with 4k and 16k keys -> 3
  // splits (the grid-filling rule chose 1: 4.18 -> 4.35 and 4.27 -> 4.61 TB/s), batch 8 with
  // 64k-128k keys -> 6 (within 3% of the best measured).
  kDecode,
  // kDecode plus 0.15 key-block times per split for the merge of the split-KV decode forward
  // (sm80/fwd_launch.h: the last CTA of a row group, or the combine kernel, reads every split's
  // partial in batches of 8, one dependent L2 round trip per batch). Without it batch 1 took one
  // key block per split; measured (H200, d128 bf16, 32 query heads over 8 KV heads, one token,
  // dev/results/h200-2026-12-03-s16-decode-splits-63d3dd6.json, eager / graph us): 1 x 4k 32
  // splits 13.5 / 13.2, 16 splits 12.4 / 12.3, 8 splits 13.1 / 13.0; 1 x 16k 43 splits (the old
  // choice) 28.5 / 28.7, 32 splits 26.5 / 26.6, 16 splits 27.9 / 27.8. With the term: 16 and 32.
  // Batch 8 and 64 keep their choices (6 and 3).
  kDecodeMerge,
};

// Model: time ~ waves(ctas * s) * per-CTA work, per the cost above; choose the cheapest s
// (smallest on ties), at most max_splits and n_blocks.
inline int choose_num_splits(long long ctas, int n_blocks, int sms, int ctas_per_sm, int max_splits = 64,
                             SplitCost model = SplitCost::kRowTiles) {
  const long long slots = static_cast<long long>(sms) * std::max(1, ctas_per_sm);
  if (n_blocks <= 1 || slots <= 0) return 1;
  if (model == SplitCost::kRowTiles && ctas >= slots) return 1;
  const int limit = std::min(max_splits, n_blocks);
  int best = 1;
  double best_cost = 0.0;
  for (int s = 1; s <= limit; ++s) {
    const long long waves = (ctas * s + slots - 1) / slots;
    const double blocks = double((n_blocks + s - 1) / s);
    const double cost = model == SplitCost::kRowTiles ? double(waves) * blocks + 0.05 * s
                        : model == SplitCost::kDecode ? double(waves) * (blocks + 2.0)
                                                      : double(waves) * (blocks + 2.0) + 0.15 * s;
    if (s == 1 || cost < best_cost) {
      best = s;
      best_cost = cost;
    }
  }
  return best;
}

}  // namespace flashattn::cuda
