// Merging two partial attention results computed over disjoint key sets, host and device.
//
// A partial result of one query row over a key set K_a is (O_a, LSE_a) with
//   LSE_a = log sum_{j in K_a} exp(s_j),   O_a = sum_{j in K_a} exp(s_j - LSE_a) v_j.
// Over the union K_a + K_b (disjoint):
//   LSE = log(exp(LSE_a) + exp(LSE_b)) = hi + log1p(exp(lo - hi)),  hi/lo = max/min(LSE_a, LSE_b)
//   O   = exp(LSE_a - LSE) O_a + exp(LSE_b - LSE) O_b.
// Written with hi and lo the exponent never overflows (lo - hi <= 0) and log1p keeps the
// precision when one part dominates. The operation is commutative exactly and associative up to
// rounding, which is what lets the ring merge the steps in any order (docs/RING.md).
//
// -inf (a part with no visible key) weighs exactly 0, whatever its O holds; when both parts are
// -inf the result is O = 0, LSE = -inf, never NaN. A NaN LSE propagates (it is never hidden).
// This is the pairwise form of the split-KV combine of the CUDA forward
// (src/cuda/sm80/fwd_kernel.h, fwd_combine_kernel), which merges all splits at once.
#pragma once

#include <cmath>

#include "core/host_device.h"

namespace flashattn::ring {

// Weights of the two parts in the merged output, and the merged LSE.
struct MergeWeights {
  float a = 0.0f;  // exp(LSE_a - LSE)
  float b = 0.0f;  // exp(LSE_b - LSE)
  float lse = 0.0f;
};

FLASHATTN_HOST_DEVICE MergeWeights merge_weights(float lse_a, float lse_b) {
  MergeWeights w;
  if (lse_a != lse_a || lse_b != lse_b) {  // NaN in, NaN out
    w.a = w.b = w.lse = lse_a != lse_a ? lse_a : lse_b;
    return w;
  }
  const float hi = lse_a > lse_b ? lse_a : lse_b;
  const float lo = lse_a > lse_b ? lse_b : lse_a;
  if (hi == -INFINITY) {  // neither part sees a key
    w.lse = -INFINITY;
    return w;
  }
  // lo - hi is in [-inf, 0]: exp never overflows; exp(-inf) = 0 gives LSE = hi exactly.
  w.lse = hi + log1pf(expf(lo - hi));
  w.a = lse_a == -INFINITY ? 0.0f : expf(lse_a - w.lse);
  w.b = lse_b == -INFINITY ? 0.0f : expf(lse_b - w.lse);
  return w;
}

// One element of the merged output. A part of weight 0 contributes exactly 0, even if its
// value is not finite (the O of a part with no visible key need not have been written).
FLASHATTN_HOST_DEVICE float merge_value(const MergeWeights& w, float o_a, float o_b) {
  const float from_a = w.a == 0.0f ? 0.0f : w.a * o_a;
  const float from_b = w.b == 0.0f ? 0.0f : w.b * o_b;
  return from_a + from_b;
}

// Merges part b into the running result a in place: (o_a[0..n), *lse_a) <- merge(a, b).
// LoadB converts an element of b to float (b may be stored in a 16-bit type).
template <typename LoadB>
FLASHATTN_HOST_DEVICE void merge_into(float* o_a, float* lse_a, int n, float lse_b, LoadB load_b) {
  const MergeWeights w = merge_weights(*lse_a, lse_b);
  for (int c = 0; c < n; ++c) o_a[c] = merge_value(w, o_a[c], load_b(c));
  *lse_a = w.lse;
}

}  // namespace flashattn::ring
