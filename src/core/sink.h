// The learnable attention sink (docs/SEMANTICS.md, "Learnable sink"): one logit per query head
// that joins every row's softmax denominator with no value row. Backends run the usual online
// softmax over the keys and fold the sink into the finished row statistics, once per row, with
// fold_sink below; the split-KV combine adds it instead, to the merged LSE. The backward needs
// nothing else: P = exp(s - LSE) with the sink-inclusive LSE is already right, and
//   dsink[h] = -sum over the rows (b, i) of head h of exp(sink[h] - LSE[b, h, i]) * D[b, h, i],
// D = rowsum(dO * O) (sink_grad_term).
#pragma once

#include <cmath>

#include "core/host_device.h"

namespace flashattn {

// Folds a sink into the statistics of one finished row, in log2 units: m is the row's maximum
// logit (any value the terms of l are relative to; -inf when the row saw no visible key) and
// l = sum over the row's keys of 2^(x_j - m). With sink_log2 = sink * log2(e), afterwards
//   m' = max(m, sink_log2),   l' = l * 2^(m - m') + 2^(sink_log2 - m'),
// and the return value is 2^(m - m'), the factor the row's unnormalised O accumulator (relative
// to m) needs: O = acc * factor / l', LSE = (m' + log2 l') * ln 2. Taking the larger of the two
// as the reference keeps every exponent <= 0, so a sink far above the scores neither overflows
// nor loses the keys' share. A sink of -inf changes nothing (factor 1, m and l untouched), so
// it is bitwise the same as no sink; a row without visible keys gets O = 0, LSE = sink.
// `exp2` is the backend's base-2 exponential (std::exp2 on the host, ex2.approx on the GPU).
template <typename Exp2>
FLASHATTN_HOST_DEVICE float fold_sink(float sink_log2, float* m, float* l, Exp2 exp2) {
  if (!(sink_log2 > *m)) {  // the kept maximum stays (also a sink of -inf)
    if (sink_log2 != -INFINITY) *l += exp2(sink_log2 - *m);
    return 1.0f;
  }
  const float factor = *m == -INFINITY ? 0.0f : exp2(*m - sink_log2);
  *l = *l * factor + 1.0f;
  *m = sink_log2;
  return factor;
}

// The sink's share of row i, times D_i: P_sink,i * D_i with P_sink,i = exp(sink - LSE_i). A row
// whose LSE is -inf (only possible with a sink of -inf) contributes 0. dsink is minus the sum.
FLASHATTN_HOST_DEVICE float sink_grad_term(float sink, float lse, float delta) {
  if (sink == -INFINITY || lse == -INFINITY) return 0.0f;
  return expf(sink - lse) * delta;
}

}  // namespace flashattn
