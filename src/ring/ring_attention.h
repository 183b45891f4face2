// Internals of ring_forward / ring_backward (include/flashattn/ring.h): the resolved problem
// of one rank, shared by both passes.
//
// Per rank and step (schedule.h says which calls):
//   forward   O_s, LSE_s = flashattn::forward(q rows, held K/V rows, window of the call)
//             (O, LSE) <- merge((O, LSE), (O_s, LSE_s))                    (merge.h, float32)
//   backward  dQ_s, dK_s, dV_s = flashattn::backward(q, held K/V, out = final O, lse = final
//             LSE, window of the call); dQ += dQ_s locally; dK_s, dV_s are added to the
//             float32 accumulator that travels with the shard back to its owner.
// The backward is exact with the final O and LSE: P = exp(s - LSE) is then the global softmax
// restricted to the held keys, and D = rowsum(dO * O) (computed by flashattn::backward from the
// given out and dout) is the global one, so the per-shard gradients add up to the gradient of
// one call on the whole sequence.
#pragma once

#include <cstdint>

#include "flashattn/ring.h"
#include "ring/schedule.h"

namespace flashattn::ring {

// The validated problem of one rank.
struct RingProblem {
  RingTransport* transport = nullptr;
  int32_t rank = 0;
  int32_t world = 1;
  bool causal = false;
  int32_t window_left = -1;  // the global sliding window (flashattn's, -1 = unbounded)
  int32_t window_right = -1;
  Sharding sharding;

  DType dtype = DType::kFloat32;
  Device device{};
  int64_t batch = 0;
  int64_t heads = 0;
  int64_t heads_k = 0;
  int64_t head_dim = 0;
  int64_t head_dim_v = 0;
  int64_t local_seqlen = 0;  // this rank's shard (queries and keys alike)
  float softmax_scale = 0.0f;
  bool coalesce = true;  // plan_step's
};

// Knobs that are not part of the API, for tests.
struct RingTuning {
  // false: one call per (query chunk, key chunk) pair instead of one coalesced call per step,
  // which exercises the several-calls path of the loops.
  bool coalesce = true;
};

// ring_forward / ring_backward with the knobs above.
Status ring_forward(const RingForwardArgs& args, const RingTuning& tuning);
Status ring_backward(const RingBackwardArgs& args, const RingTuning& tuning);

// Options the ring cannot honour yet: kNotSupported naming the first one set.
Status check_ring_unsupported(const AttentionOptions& options);

// Checks shared by both passes once the local call itself has been validated by flashattn
// (q, k and v given): transport, options, device, sharding and local shard lengths.
Status make_ring_problem(const AttentionOptions& options, const RingOptions& ring,
                         const TensorView& q, const TensorView& k, const TensorView& v,
                         RingProblem* problem);

}  // namespace flashattn::ring
