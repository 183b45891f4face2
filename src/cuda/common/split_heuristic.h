// How many key/value splits (flash-decoding) a forward launch should use.
#pragma once

#include <algorithm>

namespace flashattn::cuda {

// Splitting the keys multiplies the CTAs by `splits` and divides each CTA's key blocks by it,
// at the price of a float32 partial write per split and a combine pass. It pays only when the
// unsplit grid leaves the GPU partly idle. Model: time ~ waves(ctas * s) * ceil(n_blocks / s),
// plus a small per-split cost for the partials; choose the cheapest s (smallest on ties).
inline int choose_num_splits(long long ctas, int n_blocks, int sms, int ctas_per_sm, int max_splits = 64) {
  const long long slots = static_cast<long long>(sms) * std::max(1, ctas_per_sm);
  if (ctas >= slots || n_blocks <= 1) return 1;
  const int limit = std::min(max_splits, n_blocks);
  int best = 1;
  double best_cost = 0.0;
  for (int s = 1; s <= limit; ++s) {
    const long long waves = (ctas * s + slots - 1) / slots;
    const double cost = double(waves) * double((n_blocks + s - 1) / s) + 0.05 * s;
    if (s == 1 || cost < best_cost) {
      best = s;
      best_cost = cost;
    }
  }
  return best;
}

}  // namespace flashattn::cuda
