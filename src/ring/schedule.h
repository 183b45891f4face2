// Ring attention: how the sequence is sharded over the ranks, and which local calls of
// flashattn::forward / backward each rank makes at each step of the ring.
//
// Pure host code, shared by every transport (threads, NCCL) and mirrored line for line by
// python/flashattn/ring.py: the tested logic is the one that runs everywhere.
//
// Sharding. The global sequence of N tokens (queries and keys are the same tokens: this is
// self-attention, seqlen_q == seqlen_k == N) is cut into C chunks, chunk c covering rows
// [c*N/C, (c+1)*N/C) (integer division: lengths differ by at most 1 when C does not divide N).
//   contiguous: C = R, rank r holds chunk r.
//   zig-zag:    C = 2R, rank r holds chunks r and 2R-1-r, in that order. Under the causal mask
//               chunk c costs about c + 1/2 units (its rows see c whole chunks and half of its
//               own), so every rank does (r + 1/2) + (2R-1-r + 1/2) = 2R units: equal work.
// A rank's local rows are its chunks concatenated in that order.
//
// Ring. At step s (0 <= s < R) rank r holds the K/V shard of rank (r - s) mod R: K/V move one
// rank forward per step (r sends to r+1, receives from r-1) and each rank sees every shard
// once. Forward: per step the rank merges (O_s, LSE_s) of its calls into its running result.
// Backward: per step it adds the dK/dV of its calls to the accumulator that travels with the
// shard, which reaches its owner one step after the last.
//
// Mapping the global causal mask onto a local call (the derivation; docs/RING.md repeats it).
// Global causal with N == N is "key j visible to query i iff j <= i". A call gets query rows
// [qa, qb) and key rows [ka, kb) (global positions) as its own tensors, local positions
// i' = i - qa, j' = j - ka, sq = qb - qa, sk = kb - ka. flashattn's masks are bottom-right
// aligned: with window (left = -1, right = w) row i' sees j' iff j' <= i' + sk - sq + w. So
//   j <= i  <=>  j' <= i' + (qa - ka)  <=>  j' <= i' + sk - sq + w  with
//   w = (qa - ka) - (sk - sq) = (qa - ka) - (kb - ka) + (qb - qa) = qb - kb.
// The last query and the last key fix the window: w = qb - kb. It is expressible only when
// w >= 0 (w = -1 means "unbounded", so negative offsets cannot be written), hence trim first:
//   keys j >= qb are seen by no query of the block:     kb' = min(kb, qb);
//   queries i < ka see no key of the block:              qa' = max(qa, ka);
//   kb' <= ka (equivalently qb <= ka):                   nothing visible, no call;
//   qa' >= kb' - 1 (first query sees the last key):      every pair visible, window (-1, -1);
//   otherwise                                            window (-1, qb - kb') on [qa', qb) x [ka,
//   kb').
// After trimming w = qb - kb' >= 0 always (kb' <= qb), and w == 0 exactly when the block
// straddles the diagonal (kb' == qb): the plain causal call.
//
// Several chunk pairs of a step are coalesced into one call when one window reproduces the
// causal mask of every pair (zig-zag and contiguous layouts always need exactly one call per step;
// windowed plans keep one call per pair);
// this is checked per pair with diagonal offsets, see plan_step.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "flashattn/ring.h"
#include "flashattn/types.h"

namespace flashattn::ring {

// Rows [begin, end).
struct Span {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t length() const { return end - begin; }
  bool empty() const { return end <= begin; }
  friend bool operator==(const Span&, const Span&) = default;
};

// The cut of the global sequence into chunks and their owners.
class Sharding {
 public:
  static constexpr int kMaxChunksPerRank = 2;

  // Fails (kInvalidArgument, naming the value) unless world_size >= 1, seqlen >= 1 and every
  // chunk is non-empty (seqlen >= number of chunks). kAuto is not accepted here: resolve it
  // with resolve_layout first.
  static Status make(int64_t seqlen, int32_t world_size, RingLayout layout, Sharding* out);

  int64_t seqlen() const { return seqlen_; }
  int32_t world_size() const { return world_; }
  RingLayout layout() const { return layout_; }
  int32_t num_chunks() const { return layout_ == RingLayout::kZigZag ? 2 * world_ : world_; }
  int32_t chunks_per_rank() const { return layout_ == RingLayout::kZigZag ? 2 : 1; }

  // Global rows of chunk c.
  Span chunk(int32_t c) const;
  // Chunk ids held by `rank`, in local order (chunks_per_rank() of them).
  std::array<int32_t, kMaxChunksPerRank> chunks_of(int32_t rank) const;
  // Global rows of the i-th chunk of `rank` (i < chunks_per_rank()).
  Span global_span(int32_t rank, int32_t i) const { return chunk(chunks_of(rank)[i]); }
  // Local rows of the same chunk inside the rank's shard.
  Span local_span(int32_t rank, int32_t i) const;
  // Rows held by `rank`, and the largest shard (sizes the receive buffers).
  int64_t shard_length(int32_t rank) const;
  int64_t max_shard_length() const;

 private:
  int64_t seqlen_ = 0;
  int32_t world_ = 1;
  RingLayout layout_ = RingLayout::kContiguous;
};

// kAuto -> zig-zag when causal, contiguous otherwise; other values unchanged.
RingLayout resolve_layout(RingLayout layout, bool causal);

// Rank whose K/V shard `rank` holds at `step`: (rank - step) mod world.
int32_t kv_source_rank(int32_t rank, int32_t step, int32_t world_size);

// One call of flashattn::forward / backward: local query rows of the rank's own shard against
// local key rows of the held K/V shard, with the window in the call's own coordinates
// (bottom-right aligned, -1 = unbounded; window_left is always -1 here).
struct LocalCall {
  Span q_rows;
  Span k_rows;
  int32_t window_left = -1;
  int32_t window_right = -1;
  friend bool operator==(const LocalCall&, const LocalCall&) = default;
};

// The global causal mask (j <= i) of query rows q and key rows k (global positions) as one
// call over sub-ranges of them: returns false when no pair is visible. Otherwise *call gets the
// trimmed rows (global positions) and the window; see the derivation above.
bool causal_block_call(Span q, Span k, LocalCall* call);

// The same for a sliding window: key j visible to query i iff -left <= j - i <= right (-1 =
// unbounded on that side; the causal mask is left = -1, right = 0). Trimmed edge by edge until
// stable: keys j >= qb + right and queries i < ka - right (right edge), keys j < qa - left and
// queries i >= kb + left (left edge) see nothing. In the call's coordinates the edges are then
// right' = right + qb - kb and left' = left + kb - qb (both >= 0 after the trims), or -1 where
// the edge hides no pair of the trimmed block.
bool window_block_call(Span q, Span k, int64_t left, int64_t right, LocalCall* call);

// The calls of one step of one rank: at most one per (query chunk, key chunk) pair, usually
// (always, for the contiguous and zig-zag layouts) a single coalesced call; none when every
// pair is masked. coalesce = false keeps one call per pair (tests use it to exercise the
// several-calls path of the ring loop).
struct StepPlan {
  int32_t kv_rank = 0;  // whose K/V shard is held
  std::vector<LocalCall> calls;
};

// window_left / window_right: a sliding window of the global sequence as flashattn takes it
// (-1 = unbounded; with causal the right edge is 0); windowed plans keep one call per pair.
StepPlan plan_step(const Sharding& sharding, int32_t rank, int32_t step, bool causal,
                   bool coalesce = true, int32_t window_left = -1, int32_t window_right = -1);

// Which calls of a step carry the learnable sink (a key with no value row that must join each
// row's softmax once; the merge then treats it as any other key): the longest calls first, each
// taken unless its query rows lie inside a taken call's, so that every one of the rank's
// local_rows rows gets it exactly once. Used with
// step 0's calls, which hold the rank's own shard: every local row sees at least its own key
// there. Fails (kInternal) when the calls' query rows overlap only partly or miss a row, which
// no plan does. (*carries)[i] != 0 for the calls that carry it.
Status sink_calls(const std::vector<LocalCall>& calls, int64_t local_rows, std::vector<char>* carries);

}  // namespace flashattn::ring
