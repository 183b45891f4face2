// Sharding and per-step plans of ring attention; the derivations are in schedule.h.
#include "ring/schedule.h"

#include <algorithm>
#include <limits>
#include <string>

namespace flashattn::ring {
namespace {

// Stands for "no upper bound" among diagonal offsets (window_right = -1).
constexpr int64_t kUnbounded = std::numeric_limits<int64_t>::max() / 4;

Span intersect(Span a, Span b) { return {std::max(a.begin, b.begin), std::min(a.end, b.end)}; }

// A block of a call: local query rows `rows` of query chunk a against local key rows `cols`
// of key chunk b. In the call's coordinates (i'' = i - Q.begin, j'' = j - K.begin for the
// call's rows Q and keys K) every mask here has the form "visible iff j'' - i'' <= delta";
// `truth` is the delta of the global causal mask on this block.
struct Block {
  int64_t truth;
  int64_t d_min;  // smallest j'' - i'' in the block
  int64_t d_max;  // largest
  // Two thresholds give the same mask on the block iff they agree once clamped to
  // [d_min - 1, d_max]: below d_min nothing is visible, from d_max on everything is.
  int64_t clamp(int64_t delta) const { return std::clamp(delta, d_min - 1, d_max); }
};

}  // namespace

Status Sharding::make(int64_t seqlen, int32_t world_size, RingLayout layout, Sharding* out) {
  if (world_size < 1) {
    return Status::InvalidArgument("ring world_size must be >= 1, got " +
                                   std::to_string(world_size));
  }
  if (layout != RingLayout::kContiguous && layout != RingLayout::kZigZag) {
    return Status::InvalidArgument("ring layout must be contiguous or zig-zag here, got " +
                                   std::to_string(static_cast<int>(layout)));
  }
  Sharding s;
  s.seqlen_ = seqlen;
  s.world_ = world_size;
  s.layout_ = layout;
  if (seqlen < s.num_chunks()) {
    return Status::InvalidArgument(
        "ring global seqlen must be at least the number of chunks (" +
        std::to_string(s.num_chunks()) + " = " +
        (layout == RingLayout::kZigZag ? "2 * world_size, zig-zag" : "world_size, contiguous") +
        ") so that no shard is empty, got " + std::to_string(seqlen));
  }
  if (seqlen > std::numeric_limits<int32_t>::max()) {
    return Status::InvalidArgument("ring global seqlen must fit in int32, got " +
                                   std::to_string(seqlen));
  }
  *out = s;
  return Status::Ok();
}

Span Sharding::chunk(int32_t c) const {
  const int64_t n = num_chunks();
  return {c * seqlen_ / n, (c + 1) * seqlen_ / n};
}

std::array<int32_t, Sharding::kMaxChunksPerRank> Sharding::chunks_of(int32_t rank) const {
  if (layout_ == RingLayout::kZigZag) return {rank, 2 * world_ - 1 - rank};
  return {rank, -1};
}

Span Sharding::local_span(int32_t rank, int32_t i) const {
  int64_t begin = 0;
  for (int32_t p = 0; p < i; ++p) begin += global_span(rank, p).length();
  return {begin, begin + global_span(rank, i).length()};
}

int64_t Sharding::shard_length(int32_t rank) const {
  int64_t n = 0;
  for (int32_t i = 0; i < chunks_per_rank(); ++i) n += global_span(rank, i).length();
  return n;
}

int64_t Sharding::max_shard_length() const {
  int64_t n = 0;
  for (int32_t r = 0; r < world_; ++r) n = std::max(n, shard_length(r));
  return n;
}

RingLayout resolve_layout(RingLayout layout, bool causal) {
  if (layout != RingLayout::kAuto) return layout;
  return causal ? RingLayout::kZigZag : RingLayout::kContiguous;
}

int32_t kv_source_rank(int32_t rank, int32_t step, int32_t world_size) {
  const int32_t r = (rank - step) % world_size;
  return r < 0 ? r + world_size : r;
}

bool window_block_call(Span q, Span k, int64_t left, int64_t right, LocalCall* call) {
  // Trim keys no query of the block sees and queries that see no key of the block, edge by
  // edge, until nothing changes (schedule.h); each trim only shrinks the spans.
  for (;;) {
    const Span q0 = q, k0 = k;
    if (right >= 0) {
      k.end = std::min(k.end, q.end + right);        // keys past the last query's right edge
      q.begin = std::max(q.begin, k.begin - right);  // queries whose right edge is before the keys
    }
    if (left >= 0) {
      k.begin = std::max(k.begin, q.begin - left);  // keys before the first query's left edge
      q.end = std::min(q.end, k.end + left);        // queries whose left edge is past the keys
    }
    if (q.empty() || k.empty()) return false;
    if (q == q0 && k == k0) break;
  }
  call->q_rows = q;
  call->k_rows = k;
  // An edge that hides no pair of the trimmed block is unbounded (-1); otherwise in the call's
  // own coordinates right = R + qb - kb and left = L + kb - qb, both >= 0 after the trims.
  const bool right_cuts = right >= 0 && (k.end - 1) - q.begin > right;
  const bool left_cuts = left >= 0 && k.begin - (q.end - 1) < -left;
  call->window_right = right_cuts ? static_cast<int32_t>(right + q.end - k.end) : -1;
  call->window_left = left_cuts ? static_cast<int32_t>(left + k.end - q.end) : -1;
  return true;
}

bool causal_block_call(Span q, Span k, LocalCall* call) { return window_block_call(q, k, -1, 0, call); }

StepPlan plan_step(const Sharding& sharding, int32_t rank, int32_t step, bool causal,
                   bool coalesce, int32_t window_left, int32_t window_right) {
  StepPlan plan;
  const int32_t world = sharding.world_size();
  plan.kv_rank = kv_source_rank(rank, step, world);
  const int32_t n_chunks = sharding.chunks_per_rank();
  // The global mask: key j visible to query i iff -left <= j - i <= right (-1: unbounded);
  // causal clamps the right edge to 0, as flashattn does.
  const int64_t left = window_left, right = causal ? 0 : window_right;
  if (left < 0 && right < 0) {
    plan.calls.push_back(
        {{0, sharding.shard_length(rank)}, {0, sharding.shard_length(plan.kv_rank)}, -1, -1});
    return plan;
  }

  // Offsets from local to global positions of each chunk: global = local + offset.
  int64_t q_off[Sharding::kMaxChunksPerRank] = {};
  int64_t k_off[Sharding::kMaxChunksPerRank] = {};
  for (int32_t a = 0; a < n_chunks; ++a) {
    q_off[a] = sharding.global_span(rank, a).begin - sharding.local_span(rank, a).begin;
    k_off[a] =
        sharding.global_span(plan.kv_rank, a).begin - sharding.local_span(plan.kv_rank, a).begin;
  }

  // One call per pair that sees anything, in local coordinates.
  std::vector<LocalCall> pairs;
  for (int32_t a = 0; a < n_chunks; ++a) {
    for (int32_t b = 0; b < n_chunks; ++b) {
      LocalCall c;
      if (!window_block_call(sharding.global_span(rank, a), sharding.global_span(plan.kv_rank, b),
                             left, right, &c)) {
        continue;
      }
      c.q_rows = {c.q_rows.begin - q_off[a], c.q_rows.end - q_off[a]};
      c.k_rows = {c.k_rows.begin - k_off[b], c.k_rows.end - k_off[b]};
      pairs.push_back(c);
    }
  }
  // Coalescing is derived for the causal mask alone (right edges); windows keep one call per
  // pair, each exact by construction.
  if (pairs.size() <= 1 || !coalesce || left >= 0 || right != 0) {
    plan.calls = pairs;
    return plan;
  }

  // Try one call over the hull of the pairs' rows. In its coordinates a block (a, b) has the
  // true offset delta = q_off[a] - k_off[b] + Q.begin - K.begin (j <= i in global positions),
  // and the call's window w gives delta = sk - sq + w (w = -1: unbounded).
  Span hull_q = pairs.front().q_rows, hull_k = pairs.front().k_rows;
  for (const LocalCall& c : pairs) {
    hull_q = {std::min(hull_q.begin, c.q_rows.begin), std::max(hull_q.end, c.q_rows.end)};
    hull_k = {std::min(hull_k.begin, c.k_rows.begin), std::max(hull_k.end, c.k_rows.end)};
  }
  std::vector<Block> blocks;
  for (int32_t a = 0; a < n_chunks; ++a) {
    for (int32_t b = 0; b < n_chunks; ++b) {
      const Span rows = intersect(sharding.local_span(rank, a), hull_q);
      const Span cols = intersect(sharding.local_span(plan.kv_rank, b), hull_k);
      if (rows.empty() || cols.empty()) continue;
      Block blk;
      blk.truth = q_off[a] - k_off[b] + hull_q.begin - hull_k.begin;
      blk.d_min = (cols.begin - hull_k.begin) - (rows.end - 1 - hull_q.begin);
      blk.d_max = (cols.end - 1 - hull_k.begin) - (rows.begin - hull_q.begin);
      blocks.push_back(blk);
    }
  }
  const int64_t base = hull_k.length() - hull_q.length();  // sk - sq of the hull call
  std::vector<int64_t> candidates{kUnbounded};
  for (const Block& blk : blocks) {
    candidates.insert(candidates.end(), {blk.truth, blk.d_min - 1, blk.d_max});
  }
  for (int64_t delta : candidates) {
    const int64_t w = delta == kUnbounded ? -1 : delta - base;
    if (delta != kUnbounded && (w < 0 || w > std::numeric_limits<int32_t>::max())) continue;
    const bool reproduces = std::all_of(blocks.begin(), blocks.end(), [&](const Block& blk) {
      return blk.clamp(delta) == blk.clamp(blk.truth);
    });
    if (reproduces) {
      plan.calls.push_back({hull_q, hull_k, -1, static_cast<int32_t>(w)});
      return plan;
    }
  }
  plan.calls = pairs;  // no single window fits: one call per pair, each exact by construction
  return plan;
}

Status sink_calls(const std::vector<LocalCall>& calls, int64_t local_rows, std::vector<char>* carries) {
  carries->assign(calls.size(), 0);
  // Longest first (then in order), so that a call whose rows lie inside a taken one's is skipped:
  // with windows a chunk's diagonal call covers it and the calls against other chunks only part.
  std::vector<size_t> order(calls.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return calls[a].q_rows.length() > calls[b].q_rows.length();
  });
  std::vector<Span> taken;
  int64_t covered = 0;
  for (const size_t i : order) {
    const Span rows = calls[i].q_rows;
    if (rows.empty()) continue;
    bool inside = false, overlaps = false;
    for (const Span& t : taken) {
      inside = inside || (rows.begin >= t.begin && rows.end <= t.end);
      overlaps = overlaps || !intersect(rows, t).empty();
    }
    if (inside) continue;
    if (overlaps) {
      return Status::Internal("ring: the calls' query rows overlap partly; the learnable sink cannot be added "
                              "exactly once per row");
    }
    taken.push_back(rows);
    covered += rows.length();
    (*carries)[i] = 1;
  }
  if (covered != local_rows) {
    return Status::Internal("ring: the calls of the step that adds the learnable sink cover " + std::to_string(covered) +
                            " of the " + std::to_string(local_rows) + " local rows");
  }
  return Status::Ok();
}

}  // namespace flashattn::ring
