// Ring attention (context parallelism) on the CPU, ranks simulated by threads:
//   merge math        (O, LSE) merge vs a direct softmax over the union; commutative exactly,
//                     associative to rounding; -inf parts; extreme magnitudes; NaN propagates
//   schedule          shards; the per-pair window derivation by brute force over all small
//                     intervals; every (query, key) pair covered exactly once by the plans
//                     (which checks each derived local window against the global causal mask);
//                     zig-zag balance per rank and per step; one call per step
//   thread transport  ring exchanges of unequal sizes; a size mismatch fails the ranks involved
//   ring vs one call  ring_forward / ring_backward with R = 1..4 threads against
//                     flashattn::forward / backward on the whole sequence (f32, 1e-5
//                     relative; bf16 looser), causal or not, GQA/MQA, head_dim_v != head_dim,
//                     seqlens divisible by 2R or not, both layouts
//   errors            unsupported options, wrong shard lengths and failures inside the ring
//                     (no rank hangs), devices
//   NCCL              several GPUs of one process against one GPU (skips without 2+ GPUs;
//                     has not run yet)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#if defined(FLASHATTN_WITH_CUDA)
#include <cuda_runtime.h>
#endif

#include "flashattn/flashattn.h"
#include "flashattn/ring.h"
#include "ring/merge.h"
#include "ring/ring_attention.h"
#include "ring/schedule.h"
#include "test_util.h"

namespace flashattn::test {
namespace {

using ring::LocalCall;
using ring::Sharding;
using ring::Span;

constexpr float kInfF = std::numeric_limits<float>::infinity();

// ---- merge math ------------------------------------------------------------------------------

// A partial result over keys `keys` of one row: (O, LSE) computed in double, stored as float.
struct Part {
  std::vector<float> o;
  float lse = -kInfF;
};

Part direct(const std::vector<double>& s, const std::vector<std::vector<double>>& v,
            const std::vector<int>& keys, int dv) {
  Part p;
  p.o.assign(dv, 0.0f);
  if (keys.empty()) return p;
  double mx = -1e300;
  for (int j : keys) mx = std::max(mx, s[j]);
  double sum = 0.0;
  for (int j : keys) sum += std::exp(s[j] - mx);
  const double lse = mx + std::log(sum);
  for (int c = 0; c < dv; ++c) {
    double acc = 0.0;
    for (int j : keys) acc += std::exp(s[j] - lse) * v[j][c];
    p.o[c] = static_cast<float>(acc);
  }
  p.lse = static_cast<float>(lse);
  return p;
}

Part merged(Part a, const Part& b) {
  ring::merge_into(a.o.data(), &a.lse, static_cast<int>(a.o.size()), b.lse,
                   [&](int c) { return b.o[c]; });
  return a;
}

// Whether x matches y to float rounding. A weight exp(LSE_a - LSE) carries the absolute
// rounding of the LSEs (~|LSE| * eps), so O agrees to ~(1 + |LSE|) * eps * max|O|.
bool close(const Part& x, const Part& y) {
  constexpr double kEps = 0x1p-24;
  const double lse_scale = 1.0 + std::abs(double(y.lse));
  if (std::abs(double(x.lse) - y.lse) > 4 * kEps * lse_scale) return false;
  double o_scale = 1.0;
  for (float o : y.o) o_scale = std::max(o_scale, std::abs(double(o)));
  for (size_t c = 0; c < x.o.size(); ++c) {
    if (!(std::abs(double(x.o[c]) - y.o[c]) <= 16 * kEps * lse_scale * o_scale)) return false;
  }
  return true;
}

TEST(RingMerge, MatchesSoftmaxOverTheUnionAndIsAssociative) {
  std::mt19937 rng(7);
  std::normal_distribution<double> normal;
  const int dv = 8;
  for (int trial = 0; trial < 200; ++trial) {
    const int n = 1 + trial % 23;
    const double spread = 1.0 + (trial % 5) * 4.0;  // sharp and flat softmaxes
    std::vector<double> s(n);
    std::vector<std::vector<double>> v(n, std::vector<double>(dv));
    for (int j = 0; j < n; ++j) {
      s[j] = spread * normal(rng);
      for (double& x : v[j]) x = normal(rng);
    }
    // Three disjoint key sets (some may be empty), and the union.
    std::vector<int> sets[3], all(n);
    for (int j = 0; j < n; ++j) {
      sets[rng() % 3].push_back(j);
      all[j] = j;
    }
    const Part a = direct(s, v, sets[0], dv), b = direct(s, v, sets[1], dv),
               c = direct(s, v, sets[2], dv), want = direct(s, v, all, dv);
    const Part left = merged(merged(a, b), c);
    const Part right = merged(a, merged(b, c));
    const Part other = merged(merged(c, a), b);
    EXPECT_TRUE(close(left, want)) << "trial " << trial;
    EXPECT_TRUE(close(right, want)) << "trial " << trial;
    EXPECT_TRUE(close(left, right)) << "trial " << trial;
    EXPECT_TRUE(close(left, other)) << "trial " << trial;
    // Commutative bitwise.
    const Part ab = merged(a, b), ba = merged(b, a);
    EXPECT_EQ(0, std::memcmp(ab.o.data(), ba.o.data(), dv * sizeof(float))) << "trial " << trial;
    EXPECT_EQ(ab.lse, ba.lse) << "trial " << trial;
  }
}

TEST(RingMerge, MinusInfinityPartsWeighZero) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Part empty{{nan, nan, 5.0f}, -kInfF};  // no visible key: its O is not even read
  Part b{{1.0f, -2.0f, 0.5f}, 3.25f};
  for (const Part& m : {merged(empty, b), merged(b, empty)}) {
    EXPECT_EQ(m.lse, b.lse);
    for (int c = 0; c < 3; ++c) EXPECT_EQ(m.o[c], b.o[c]) << c;
  }
  Part other_empty{{7.0f, nan, -1.0f}, -kInfF};
  const Part none = merged(empty, other_empty);
  EXPECT_EQ(none.lse, -kInfF);
  for (float x : none.o) EXPECT_EQ(x, 0.0f);  // 0, never NaN
}

TEST(RingMerge, ExtremeMagnitudesAndNaN) {
  // exp(100) overflows float: the max/log1p form never forms it.
  Part a{{1.0f}, 100.0f}, b{{3.0f}, 100.0f};
  Part m = merged(a, b);
  EXPECT_NEAR(m.lse, 100.0 + std::log(2.0), 1e-5);
  EXPECT_NEAR(m.o[0], 2.0f, 1e-5);
  // At |LSE| = 1e4 a float LSE is only good to ~1e-3 absolute, and so are the weights.
  Part big_a{{1.0f}, 1e4f}, big_b{{3.0f}, 1e4f};
  m = merged(big_a, big_b);
  EXPECT_NEAR(m.lse, 1e4 + std::log(2.0), 1e-3);
  EXPECT_NEAR(m.o[0], 2.0f, 2e-3);
  a = big_a;
  Part tiny{{100.0f}, -1e4f};
  m = merged(a, tiny);  // exp(-2e4) underflows to 0: a alone
  EXPECT_EQ(m.lse, 1e4f);
  EXPECT_EQ(m.o[0], 1.0f);
  // log1p keeps a small second part: lse_b - lse_a = -20 adds exp(-20) ~ 2e-9 relative.
  Part c{{0.0f}, 0.0f}, d{{1.0f}, -20.0f};
  m = merged(c, d);
  EXPECT_NEAR(m.o[0], std::exp(-20.0), 1e-12);
  Part bad{{1.0f}, std::numeric_limits<float>::quiet_NaN()};
  EXPECT_TRUE(std::isnan(merged(bad, b).lse));
  EXPECT_TRUE(std::isnan(merged(b, bad).o[0]));
}

// ---- schedule --------------------------------------------------------------------------------

TEST(RingSchedule, ShardSpans) {
  RingShard s;
  // Zig-zag, N = 10, R = 2: chunks [0,2) [2,5) [5,7) [7,10).
  ASSERT_TRUE(ring_shard(10, 2, 0, /*causal=*/true, RingLayout::kAuto, &s).ok());
  EXPECT_EQ(s.num_spans, 2);
  EXPECT_EQ(s.begin[0], 0);
  EXPECT_EQ(s.end[0], 2);
  EXPECT_EQ(s.begin[1], 7);
  EXPECT_EQ(s.end[1], 10);
  EXPECT_EQ(s.length, 5);
  ASSERT_TRUE(ring_shard(10, 2, 1, true, RingLayout::kAuto, &s).ok());
  EXPECT_EQ(s.begin[0], 2);
  EXPECT_EQ(s.end[0], 5);
  EXPECT_EQ(s.begin[1], 5);
  EXPECT_EQ(s.end[1], 7);
  // Contiguous (non-causal default), N = 10, R = 3: [0,3) [3,6) [6,10).
  ASSERT_TRUE(ring_shard(10, 3, 2, false, RingLayout::kAuto, &s).ok());
  EXPECT_EQ(s.num_spans, 1);
  EXPECT_EQ(s.begin[0], 6);
  EXPECT_EQ(s.end[0], 10);
  // Errors name the value.
  Status st = ring_shard(5, 3, 0, true, RingLayout::kAuto, &s);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("at least the number of chunks (6"), std::string::npos)
      << st.message();
  st = ring_shard(10, 2, 2, true, RingLayout::kAuto, &s);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("rank"), std::string::npos) << st.message();
  EXPECT_EQ(ring_shard(10, 0, 0, true, RingLayout::kAuto, &s).code(), StatusCode::kInvalidArgument);
}

// flashattn's mask for a call of sq queries and sk keys (docs/SEMANTICS.md), written again.
bool call_sees(int64_t i, int64_t j, int64_t sq, int64_t sk, int32_t left, int32_t right) {
  const int64_t diag = i + sk - sq;
  return (left < 0 || j >= diag - left) && (right < 0 || j <= diag + right);
}

// The global mask of a window (-1 = unbounded; causal = (-1, 0)).
bool global_sees(int64_t i, int64_t j, int64_t left, int64_t right) {
  return (left < 0 || j >= i - left) && (right < 0 || j <= i + right);
}

TEST(RingSchedule, BlockWindowReproducesTheGlobalWindowMask) {
  const int64_t n = 10;
  const std::pair<int64_t, int64_t> windows[] = {{-1, 0}, {0, 0}, {2, 0}, {3, -1}, {-1, 2}, {1, 3}, {0, -1},
                                                 {-1, -1}, {12, 0}, {4, 4}};
  for (const auto& [left, right] : windows) {
    for (int64_t qa = 0; qa < n; ++qa)
      for (int64_t qb = qa + 1; qb <= n; ++qb)
        for (int64_t ka = 0; ka < n; ++ka)
          for (int64_t kb = ka + 1; kb <= n; ++kb) {
            LocalCall call;
            const bool any = left == -1 && right == 0 ? ring::causal_block_call({qa, qb}, {ka, kb}, &call)
                                                      : ring::window_block_call({qa, qb}, {ka, kb}, left, right, &call);
            SCOPED_TRACE("window (" + std::to_string(left) + "," + std::to_string(right) + ") q [" +
                         std::to_string(qa) + "," + std::to_string(qb) + ") k [" + std::to_string(ka) + "," +
                         std::to_string(kb) + ")");
            if (any) {
              ASSERT_GE(call.q_rows.begin, qa);
              ASSERT_LE(call.q_rows.end, qb);
              ASSERT_GE(call.k_rows.begin, ka);
              ASSERT_LE(call.k_rows.end, kb);
              ASSERT_FALSE(call.q_rows.empty());
              ASSERT_FALSE(call.k_rows.empty());
              ASSERT_GE(call.window_left, -1);
              ASSERT_GE(call.window_right, -1);
              if (left < 0) {
                ASSERT_EQ(call.window_left, -1);
              }
              if (right < 0) {
                ASSERT_EQ(call.window_right, -1);
              }
            }
            const int64_t sq = call.q_rows.length(), sk = call.k_rows.length();
            for (int64_t i = qa; i < qb; ++i)
              for (int64_t j = ka; j < kb; ++j) {
                const bool inside = any && i >= call.q_rows.begin && i < call.q_rows.end &&
                                    j >= call.k_rows.begin && j < call.k_rows.end;
                const bool got = inside && call_sees(i - call.q_rows.begin, j - call.k_rows.begin, sq,
                                                     sk, call.window_left, call.window_right);
                ASSERT_EQ(got, global_sees(i, j, left, right)) << "i " << i << " j " << j;
              }
          }
  }
}

struct Coverage {
  std::vector<int64_t> visible_per_rank;               // pairs computed, summed over steps
  std::vector<std::vector<int64_t>> visible_per_step;  // [step][rank]
  int max_calls_per_step = 0;
};

// Runs every rank's plans, maps each visible (local query, local key) of each call back to the
// global positions and checks that the union is the global mask with every pair exactly once.
Coverage check_coverage(int64_t n, int32_t world, RingLayout layout, bool causal,
                        bool coalesce = true, int32_t window_left = -1, int32_t window_right = -1) {
  Coverage cov;
  Sharding sh;
  const Status st = Sharding::make(n, world, layout, &sh);
  EXPECT_TRUE(st.ok()) << st.message();
  if (!st.ok()) return cov;
  // Local row -> global position, per rank.
  std::vector<std::vector<int64_t>> global(world);
  for (int32_t r = 0; r < world; ++r) {
    for (int32_t c = 0; c < sh.chunks_per_rank(); ++c) {
      const Span g = sh.global_span(r, c), l = sh.local_span(r, c);
      EXPECT_EQ(l.begin, static_cast<int64_t>(global[r].size()));
      for (int64_t i = g.begin; i < g.end; ++i) global[r].push_back(i);
    }
    EXPECT_EQ(static_cast<int64_t>(global[r].size()), sh.shard_length(r));
  }
  std::vector<int> count(n * n, 0);
  cov.visible_per_rank.assign(world, 0);
  cov.visible_per_step.assign(world, std::vector<int64_t>(world, 0));
  for (int32_t r = 0; r < world; ++r) {
    for (int32_t s = 0; s < world; ++s) {
      const ring::StepPlan plan = ring::plan_step(sh, r, s, causal, coalesce, window_left, window_right);
      EXPECT_EQ(plan.kv_rank, ((r - s) % world + world) % world);
      cov.max_calls_per_step = std::max(cov.max_calls_per_step, int(plan.calls.size()));
      const auto& gk = global[plan.kv_rank];
      for (const LocalCall& c : plan.calls) {
        EXPECT_GE(c.q_rows.begin, 0);
        EXPECT_LE(c.q_rows.end, sh.shard_length(r));
        EXPECT_GE(c.k_rows.begin, 0);
        EXPECT_LE(c.k_rows.end, sh.shard_length(plan.kv_rank));
        EXPECT_FALSE(c.q_rows.empty());
        EXPECT_FALSE(c.k_rows.empty());
        const int64_t sq = c.q_rows.length(), sk = c.k_rows.length();
        for (int64_t i = 0; i < sq; ++i)
          for (int64_t j = 0; j < sk; ++j) {
            if (!call_sees(i, j, sq, sk, c.window_left, c.window_right)) continue;
            ++count[global[r][c.q_rows.begin + i] * n + gk[c.k_rows.begin + j]];
            ++cov.visible_per_rank[r];
            ++cov.visible_per_step[s][r];
          }
      }
    }
  }
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) {
      const int want = global_sees(i, j, window_left, causal ? 0 : window_right) ? 1 : 0;
      EXPECT_EQ(count[i * n + j], want) << "query " << i << " key " << j;
    }
  return cov;
}

TEST(RingSchedule, PlansCoverEveryPairExactlyOnce) {
  for (int32_t world = 1; world <= 5; ++world)
    for (RingLayout layout : {RingLayout::kZigZag, RingLayout::kContiguous})
      for (bool causal : {true, false})
        for (int64_t n : {int64_t(2) * world, int64_t(2) * world + 1, int64_t(7) * world + 3,
                          int64_t(24), int64_t(37)}) {
          SCOPED_TRACE("world " + std::to_string(world) + " n " + std::to_string(n) +
                       (layout == RingLayout::kZigZag ? " zig-zag" : " contiguous") +
                       (causal ? " causal" : ""));
          const Coverage cov = check_coverage(n, world, layout, causal);
          // Both layouts need exactly one call per step (never more).
          EXPECT_LE(cov.max_calls_per_step, 1);
          // Uncoalesced, one call per visible chunk pair: exact too.
          const Coverage pairs = check_coverage(n, world, layout, causal, /*coalesce=*/false);
          if (causal && layout == RingLayout::kZigZag && world > 1) {
            EXPECT_EQ(pairs.max_calls_per_step, 3);
          }
        }
}

TEST(RingSchedule, WindowedPlansCoverEveryPairExactlyOnce) {
  const std::pair<int32_t, int32_t> windows[] = {{0, 0}, {3, 0}, {5, 2}, {-1, 4}, {2, -1}, {7, 7}, {40, 0}};
  for (int32_t world = 1; world <= 4; ++world)
    for (RingLayout layout : {RingLayout::kZigZag, RingLayout::kContiguous})
      for (bool causal : {true, false})
        for (const auto& [left, right] : windows)
          for (int64_t n : {int64_t(2) * world + 1, int64_t(7) * world + 3, int64_t(37)}) {
            SCOPED_TRACE("world " + std::to_string(world) + " n " + std::to_string(n) +
                         (layout == RingLayout::kZigZag ? " zig-zag" : " contiguous") + (causal ? " causal" : "") +
                         " window (" + std::to_string(left) + "," + std::to_string(right) + ")");
            check_coverage(n, world, layout, causal, /*coalesce=*/true, left, right);
          }
}

TEST(RingSchedule, SinkCallsCoverEveryRowOnceInStepZero) {
  for (int32_t world = 1; world <= 8; ++world)
    for (bool causal : {false, true})
      for (RingLayout layout : {RingLayout::kContiguous, RingLayout::kZigZag})
        for (bool coalesce : {true, false})
          for (int32_t left : {-1, 0, 3}) {
            ring::Sharding s;
            const int64_t n = 5 * world + 3;
            ASSERT_TRUE(ring::Sharding::make(n, world, layout, &s).ok());
            for (int32_t r = 0; r < world; ++r) {
              const std::vector<ring::LocalCall> calls =
                  ring::plan_step(s, r, 0, causal, coalesce, left, left < 0 ? -1 : 2).calls;
              std::vector<char> carries;
              const Status st = ring::sink_calls(calls, s.shard_length(r), &carries);
              ASSERT_TRUE(st.ok()) << st.message();
              std::vector<int> hits(s.shard_length(r), 0);
              for (size_t i = 0; i < calls.size(); ++i)
                if (carries[i])
                  for (int64_t row = calls[i].q_rows.begin; row < calls[i].q_rows.end; ++row) ++hits[row];
              for (int h : hits) ASSERT_EQ(h, 1) << "world " << world << " rank " << r;
            }
          }
  // Calls that cannot carry it exactly once per row.
  std::vector<char> carries;
  EXPECT_EQ(ring::sink_calls({{{0, 5}, {0, 5}}, {{3, 8}, {0, 8}}}, 8, &carries).code(), StatusCode::kInternal);
  EXPECT_EQ(ring::sink_calls({{{0, 5}, {0, 5}}}, 8, &carries).code(), StatusCode::kInternal);
  EXPECT_TRUE(ring::sink_calls({{{0, 5}, {0, 5}}, {{0, 5}, {5, 8}}, {{5, 8}, {0, 8}}}, 8, &carries).ok());
  EXPECT_EQ(carries, (std::vector<char>{1, 0, 1}));
  // A call inside a longer one (a window's partial chunk pair) is skipped, whatever the order.
  EXPECT_TRUE(ring::sink_calls({{{0, 4}, {0, 4}}, {{4, 6}, {0, 4}}, {{4, 9}, {4, 9}}}, 9, &carries).ok());
  EXPECT_EQ(carries, (std::vector<char>{1, 0, 1}));
}

TEST(RingSchedule, ZigZagBalancesCausalWork) {
  for (int32_t world = 1; world <= 6; ++world) {
    for (int64_t n : {int64_t(6) * world, int64_t(16) * world}) {  // divisible by 2R: exact balance
      SCOPED_TRACE("world " + std::to_string(world) + " n " + std::to_string(n));
      const Coverage cov = check_coverage(n, world, RingLayout::kZigZag, true);
      for (int32_t r = 1; r < world; ++r) {
        EXPECT_EQ(cov.visible_per_rank[r], cov.visible_per_rank[0]) << "rank " << r;
      }
      // Equal at every step too, so no rank waits for another inside the ring.
      for (int32_t s = 0; s < world; ++s)
        for (int32_t r = 1; r < world; ++r)
          EXPECT_EQ(cov.visible_per_step[s][r], cov.visible_per_step[s][0])
              << "step " << s << " rank " << r;
    }
    // Not divisible: chunks differ by one row, so ranks differ by at most a few rows of work.
    const int64_t n = 2 * world * 8 + 5;
    const Coverage cov = check_coverage(n, world, RingLayout::kZigZag, true);
    const auto [lo, hi] =
        std::minmax_element(cov.visible_per_rank.begin(), cov.visible_per_rank.end());
    EXPECT_LE(*hi - *lo, 2 * n) << "world " << world;
  }
  // The contiguous layout is what zig-zag fixes: the last rank does ~2R-1 times the first's.
  const Coverage contiguous = check_coverage(48, 4, RingLayout::kContiguous, true);
  EXPECT_GT(contiguous.visible_per_rank[3], 5 * contiguous.visible_per_rank[0]);
}

// ---- thread transport ------------------------------------------------------------------------

TEST(RingTransport, ThreadRingMovesUnequalBuffersAround) {
  for (int32_t world : {1, 2, 3, 5}) {
    ThreadRingGroup group(world);
    std::vector<Status> status(world);
    std::vector<std::vector<int32_t>> got(world);
    const int rounds = 2 * world + 1;
    const auto size_of = [](int32_t rank) { return 3 + 2 * rank; };  // elements of rank's data
    std::vector<std::thread> threads;
    for (int32_t r = 0; r < world; ++r) {
      threads.emplace_back([&, r] {
        RingTransport* t = group.transport(r);
        // Each round passes the held buffer on; after `rounds` rounds rank r holds the data of
        // rank r - rounds.
        int32_t owner = r;
        std::vector<int32_t> held(size_of(r), r), next;
        for (int k = 0; k < rounds && status[r].ok(); ++k) {
          const int32_t incoming = ((owner - 1) % world + world) % world;
          next.assign(size_of(incoming), -1);
          RingTransfer tr{held.data(), held.size() * 4, next.data(), next.size() * 4};
          status[r] = t->send_recv(&tr, 1, nullptr);
          if (status[r].ok()) status[r] = t->wait(nullptr);
          held.swap(next);
          owner = incoming;
        }
        got[r] = held;
      });
    }
    for (auto& th : threads) th.join();
    for (int32_t r = 0; r < world; ++r) {
      ASSERT_TRUE(status[r].ok()) << status[r].message();
      const int32_t owner = ((r - rounds) % world + world) % world;
      EXPECT_EQ(got[r], std::vector<int32_t>(size_of(owner), owner)) << "rank " << r;
    }
  }
}

TEST(RingTransport, SizeMismatchFailsTheRanksInvolved) {
  ThreadRingGroup group(3);
  std::vector<Status> status(3);
  std::vector<std::thread> threads;
  for (int32_t r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      std::vector<char> send(16), recv(r == 1 ? 8 : 16);  // rank 1 expects fewer bytes
      RingTransfer tr{send.data(), send.size(), recv.data(), recv.size()};
      status[r] = group.transport(r)->send_recv(&tr, 1, nullptr);
      if (status[r].ok()) status[r] = group.transport(r)->wait(nullptr);
    });
  }
  for (auto& th : threads) th.join();
  // Rank 1 finds the mismatch; rank 0, whose send is never taken, is told. Rank 2's own
  // exchange may have completed before (it would fail at its next one).
  for (int32_t r = 0; r < 3; ++r) {
    if (r == 2 && status[r].ok()) continue;
    EXPECT_EQ(status[r].code(), StatusCode::kInternal) << "rank " << r;
    EXPECT_NE(status[r].message().find("has 16 bytes, rank 1 expects 8"), std::string::npos)
        << status[r].message();
  }
}

// ---- ring vs one call ------------------------------------------------------------------------

// A host tensor of float32, or of a 16-bit type stored as raw bits.
struct HostTensor {
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  std::vector<float> f32;
  std::vector<uint16_t> bits;

  HostTensor(DType dt, std::vector<int64_t> shp) : dtype(dt), shape(std::move(shp)) {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    if (dt == DType::kFloat32)
      f32.assign(n, 0.0f);
    else
      bits.assign(n, 0);
  }
  int64_t numel() const {
    return dtype == DType::kFloat32 ? int64_t(f32.size()) : int64_t(bits.size());
  }
  void* data() { return dtype == DType::kFloat32 ? static_cast<void*>(f32.data()) : bits.data(); }
  float get(int64_t i) const {
    if (dtype == DType::kFloat32) return f32[i];
    return dtype == DType::kBFloat16 ? bf16_bits_to_float(bits[i]) : half_bits_to_float(bits[i]);
  }
  void set(int64_t i, float x) {
    if (dtype == DType::kFloat32)
      f32[i] = x;
    else
      bits[i] = dtype == DType::kBFloat16 ? float_to_bf16_bits(x) : float_to_half_bits(x);
  }
  TensorView view() {
    TensorView t;
    t.data = data();
    t.dtype = dtype;
    t.ndim = static_cast<int32_t>(shape.size());
    int64_t stride = 1;
    for (int d = t.ndim - 1; d >= 0; --d) {
      t.shape[d] = shape[d];
      t.strides[d] = stride;
      stride *= shape[d];
    }
    return t;
  }
};

HostTensor random_tensor(DType dt, std::vector<int64_t> shape, std::mt19937& rng) {
  HostTensor t(dt, std::move(shape));
  std::normal_distribution<float> normal;
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, normal(rng));
  return t;
}

// Rows `rows` (global positions, in order) along dimension `dim` of t.
HostTensor gather(const HostTensor& t, int dim, const std::vector<int64_t>& rows) {
  std::vector<int64_t> shape = t.shape;
  shape[dim] = static_cast<int64_t>(rows.size());
  HostTensor out(t.dtype, shape);
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < dim; ++d) outer *= t.shape[d];
  for (size_t d = dim + 1; d < t.shape.size(); ++d) inner *= t.shape[d];
  for (int64_t o = 0; o < outer; ++o)
    for (size_t r = 0; r < rows.size(); ++r)
      for (int64_t e = 0; e < inner; ++e) {
        const int64_t src = (o * t.shape[dim] + rows[r]) * inner + e;
        const int64_t dst = (o * int64_t(rows.size()) + int64_t(r)) * inner + e;
        if (t.dtype == DType::kFloat32)
          out.f32[dst] = t.f32[src];
        else
          out.bits[dst] = t.bits[src];
      }
  return out;
}

// A 4-d tensor stored with one extra head per row, so that its view is not contiguous (the
// ring must honour any strides). The extra head holds NaN and must never be written.
struct PaddedHeads {
  HostTensor storage;
  int64_t heads;

  explicit PaddedHeads(const HostTensor& t)
      : storage(t.dtype, {t.shape[0], t.shape[1], t.shape[2] + 1, t.shape[3]}), heads(t.shape[2]) {
    for (int64_t i = 0; i < storage.numel(); ++i) storage.set(i, std::nanf(""));
    for_each([&](int64_t padded, int64_t plain) { storage.set(padded, t.get(plain)); });
  }
  TensorView view() {
    TensorView v = storage.view();
    v.shape[2] = heads;
    return v;
  }
  HostTensor unpadded() const {
    HostTensor t(storage.dtype, {storage.shape[0], storage.shape[1], heads, storage.shape[3]});
    for_each([&](int64_t padded, int64_t plain) { t.set(plain, storage.get(padded)); });
    return t;
  }
  bool padding_untouched() const {
    const int64_t d = storage.shape[3];
    for (int64_t row = 0; row < storage.shape[0] * storage.shape[1]; ++row)
      for (int64_t c = 0; c < d; ++c)
        if (!std::isnan(storage.get((row * (heads + 1) + heads) * d + c))) return false;
    return true;
  }

 private:
  template <class F>
  void for_each(F f) const {
    const int64_t d = storage.shape[3];
    for (int64_t row = 0; row < storage.shape[0] * storage.shape[1]; ++row)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t c = 0; c < d; ++c)
          f((row * (heads + 1) + h) * d + c, (row * heads + h) * d + c);
  }
};

struct RingCase {
  int32_t world = 2;
  int64_t seqlen = 16;
  bool causal = true;
  int batch = 2, heads = 4, heads_k = 2, head_dim = 16, head_dim_v = 16;
  RingLayout layout = RingLayout::kAuto;
  DType dtype = DType::kFloat32;
  bool pass_global_seqlen = true;  // else 0 (= world * local seqlen)
  bool strided = false;            // every 4-d shard as a non-contiguous view
  bool per_pair_calls = false;     // no coalescing: several calls per step
  bool sink = false;               // a learnable sink (and its gradient)
  float softcap = 0.0f;
  int32_t window_left = -1, window_right = -1;

  std::string describe() const {
    return "R=" + std::to_string(world) + " N=" + std::to_string(seqlen) +
           (causal ? " causal" : " full") + " B=" + std::to_string(batch) +
           " H=" + std::to_string(heads) + "/" + std::to_string(heads_k) +
           " d=" + std::to_string(head_dim) + "/" + std::to_string(head_dim_v) +
           (layout == RingLayout::kContiguous ? " contiguous"
            : layout == RingLayout::kZigZag   ? " zig-zag"
                                              : "") +
           (strided ? " strided" : "") + (per_pair_calls ? " per-pair" : "") + (sink ? " sink" : "") +
           (softcap > 0.0f ? " softcap" : "") +
           (window_left >= 0 || window_right >= 0
                ? " window " + std::to_string(window_left) + "/" + std::to_string(window_right)
                : "") +
           " " +
           dtype_name(dtype);
  }
};

void PrintTo(const RingCase& c, std::ostream* os) { *os << c.describe(); }

// max |got - want| / max |want| over a tensor (the relative criterion of these tests).
double rel_error(const HostTensor& got, const HostTensor& want) {
  double err = 0.0, scale = 0.0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    const double g = got.get(i), w = want.get(i);
    if (std::isnan(g)) return kInfF;
    err = std::max(err, std::abs(g - w));
    scale = std::max(scale, std::abs(w));
  }
  return err / std::max(scale, 1e-30);
}

void run_ring_case(const RingCase& c) {
  SCOPED_TRACE(c.describe());
  std::mt19937 rng(static_cast<uint32_t>(c.world * 1000 + c.seqlen));
  const DType dt = c.dtype;
  const int64_t B = c.batch, N = c.seqlen, H = c.heads, Hk = c.heads_k, D = c.head_dim,
                Dv = c.head_dim_v;
  HostTensor q = random_tensor(dt, {B, N, H, D}, rng), k = random_tensor(dt, {B, N, Hk, D}, rng),
             v = random_tensor(dt, {B, N, Hk, Dv}, rng),
             dout = random_tensor(dt, {B, N, H, Dv}, rng);
  // Sink logits of either sign around the rows' LSE scale, so that they matter.
  HostTensor sink = random_tensor(DType::kFloat32, {H}, rng), dsink(DType::kFloat32, {H});
  for (float& x : sink.f32) x = 2.0f * x + 2.0f;

  // One call on the whole sequence.
  HostTensor out(dt, {B, N, H, Dv}), lse(DType::kFloat32, {B, H, N});
  HostTensor dq(dt, {B, N, H, D}), dk(dt, {B, N, Hk, D}), dv(dt, {B, N, Hk, Dv});
  ForwardArgs fa;
  fa.causal = c.causal;
  fa.softcap = c.softcap;
  fa.window_left = c.window_left;
  fa.window_right = c.window_right;
  fa.num_threads = 1;
  if (c.sink) fa.learnable_sink = sink.view();
  fa.q = q.view();
  fa.k = k.view();
  fa.v = v.view();
  fa.out = out.view();
  fa.lse = lse.view();
  ASSERT_TRUE(forward(fa).ok());
  BackwardArgs ba;
  static_cast<AttentionOptions&>(ba) = fa;
  ba.q = fa.q;
  ba.k = fa.k;
  ba.v = fa.v;
  ba.out = fa.out;
  ba.lse = fa.lse;
  ba.dout = dout.view();
  ba.dq = dq.view();
  ba.dk = dk.view();
  ba.dv = dv.view();
  if (c.sink) ba.dsink = dsink.view();
  ASSERT_TRUE(flashattn::backward(ba).ok());

  // The ring: one thread per rank, each with its own shard.
  struct Rank {
    std::vector<int64_t> rows;
    HostTensor q, k, v, dout, out, lse, dq, dk, dv;
    HostTensor dsink{DType::kFloat32, {0}};
    Status fwd, bwd;
    bool padding_ok = true;
  };
  std::vector<Rank> ranks;
  for (int32_t r = 0; r < c.world; ++r) {
    RingShard shard;
    const Status st = ring_shard(N, c.world, r, c.causal, c.layout, &shard);
    ASSERT_TRUE(st.ok()) << st.message();
    std::vector<int64_t> rows;
    for (int i = 0; i < shard.num_spans; ++i)
      for (int64_t p = shard.begin[i]; p < shard.end[i]; ++p) rows.push_back(p);
    ASSERT_EQ(static_cast<int64_t>(rows.size()), shard.length);
    const int64_t L = shard.length;
    ranks.push_back(Rank{rows,
                         gather(q, 1, rows),
                         gather(k, 1, rows),
                         gather(v, 1, rows),
                         gather(dout, 1, rows),
                         HostTensor(dt, {B, L, H, Dv}),
                         HostTensor(DType::kFloat32, {B, H, L}),
                         HostTensor(dt, {B, L, H, D}),
                         HostTensor(dt, {B, L, Hk, D}),
                         HostTensor(dt, {B, L, Hk, Dv}),
                         HostTensor(DType::kFloat32, {H}),
                         {},
                         {},
                         true});
  }
  ThreadRingGroup group(c.world);
  std::vector<std::thread> threads;
  for (int32_t r = 0; r < c.world; ++r) {
    threads.emplace_back([&, r] {
      Rank& me = ranks[r];
      // Strided: the ring reads and writes padded copies, copied back afterwards.
      PaddedHeads pq(me.q), pk(me.k), pv(me.v), pdout(me.dout), pout(me.out), pdq(me.dq),
          pdk(me.dk), pdv(me.dv);
      const auto view = [&](HostTensor& t, PaddedHeads& p) {
        return c.strided ? p.view() : t.view();
      };
      RingForwardArgs rf;
      rf.causal = c.causal;
      rf.softcap = c.softcap;
      rf.window_left = c.window_left;
      rf.window_right = c.window_right;
      rf.num_threads = 1;
      if (c.sink) rf.learnable_sink = sink.view();
      rf.transport = group.transport(r);
      rf.layout = c.layout;
      rf.global_seqlen = c.pass_global_seqlen ? N : 0;
      rf.q = view(me.q, pq);
      rf.k = view(me.k, pk);
      rf.v = view(me.v, pv);
      rf.out = view(me.out, pout);
      rf.lse = me.lse.view();
      ring::RingTuning tuning;
      tuning.coalesce = !c.per_pair_calls;
      me.fwd = ring::ring_forward(rf, tuning);
      if (!me.fwd.ok()) return;
      RingBackwardArgs rb;
      static_cast<AttentionOptions&>(rb) = rf;
      static_cast<RingOptions&>(rb) = rf;
      rb.q = rf.q;
      rb.k = rf.k;
      rb.v = rf.v;
      rb.out = rf.out;
      rb.lse = rf.lse;
      rb.dout = view(me.dout, pdout);
      rb.dq = view(me.dq, pdq);
      rb.dk = view(me.dk, pdk);
      rb.dv = view(me.dv, pdv);
      if (c.sink) rb.dsink = me.dsink.view();
      me.bwd = ring::ring_backward(rb, tuning);
      if (c.strided) {
        me.out = pout.unpadded();
        me.dq = pdq.unpadded();
        me.dk = pdk.unpadded();
        me.dv = pdv.unpadded();
        for (const PaddedHeads* p : {&pout, &pdq, &pdk, &pdv})
          me.padding_ok &= p->padding_untouched();
      }
    });
  }
  for (auto& th : threads) th.join();

  // f32: 1e-5 relative to the largest value. 16-bit types: the ring rounds each step's
  // partial result to the dtype (like the split-KV forward), one call rounds once.
  const double tol = dt == DType::kFloat32 ? 1e-5 : 8 * unit_roundoff(dt);
  for (int32_t r = 0; r < c.world; ++r) {
    Rank& me = ranks[r];
    ASSERT_TRUE(me.fwd.ok()) << "rank " << r << ": " << me.fwd.message();
    ASSERT_TRUE(me.bwd.ok()) << "rank " << r << ": " << me.bwd.message();
    EXPECT_TRUE(me.padding_ok) << "rank " << r << " wrote outside its output views";
    EXPECT_LE(rel_error(me.out, gather(out, 1, me.rows)), tol) << "out, rank " << r;
    EXPECT_LE(rel_error(me.lse, gather(lse, 2, me.rows)), 1e-5) << "lse, rank " << r;
    EXPECT_LE(rel_error(me.dq, gather(dq, 1, me.rows)), tol) << "dq, rank " << r;
    EXPECT_LE(rel_error(me.dk, gather(dk, 1, me.rows)), tol) << "dk, rank " << r;
    EXPECT_LE(rel_error(me.dv, gather(dv, 1, me.rows)), tol) << "dv, rank " << r;
  }
  if (c.sink) {
    // Each rank's dsink is its rows' share: they add up to the one call's.
    HostTensor sum(DType::kFloat32, {H});
    for (const Rank& me : ranks)
      for (int64_t h = 0; h < H; ++h) sum.f32[h] += me.dsink.f32[h];
    EXPECT_LE(rel_error(sum, dsink), dt == DType::kFloat32 ? 1e-5 : 8 * unit_roundoff(dt)) << "dsink";
  }
}

class RingVsOneCall : public testing::TestWithParam<RingCase> {};

TEST_P(RingVsOneCall, ForwardAndBackwardMatch) { run_ring_case(GetParam()); }

std::vector<RingCase> ring_cases() {
  std::vector<RingCase> cases;
  for (int32_t world : {1, 2, 3, 4})
    for (bool causal : {false, true})
      for (bool divisible : {true, false}) {
        RingCase c;
        c.world = world;
        c.causal = causal;
        c.seqlen = divisible ? 8 * world : 8 * world + 3;  // 8R is a multiple of 2R
        c.pass_global_seqlen = !divisible;  // divisible: equal shards, global from the shapes
        cases.push_back(c);
      }
  RingCase c;
  c.world = 3, c.seqlen = 19, c.heads = 3, c.heads_k = 3, c.head_dim = 12, c.head_dim_v = 20;
  cases.push_back(c);  // MHA, head_dim_v != head_dim
  c = RingCase{};
  c.world = 4, c.seqlen = 30, c.heads = 4, c.heads_k = 1, c.batch = 1;
  cases.push_back(c);  // MQA
  c = RingCase{};
  c.world = 3, c.seqlen = 150, c.head_dim = 32, c.head_dim_v = 32, c.batch = 1;
  cases.push_back(c);  // shards longer than the CPU backend's tiles
  c = RingCase{};
  c.world = 3, c.seqlen = 20, c.layout = RingLayout::kContiguous;
  cases.push_back(c);  // causal over contiguous shards (valid, unbalanced)
  c = RingCase{};
  c.world = 2, c.seqlen = 17, c.causal = false, c.layout = RingLayout::kZigZag;
  cases.push_back(c);  // non-causal over zig-zag shards
  c = RingCase{};
  c.world = 2, c.seqlen = 6, c.pass_global_seqlen = false;
  cases.push_back(c);  // odd shards of 3 = 1 + 2 rows: still equal, no global_seqlen needed
  c = RingCase{};
  c.world = 8, c.seqlen = 8 * 16 + 5;
  cases.push_back(c);  // 8 ranks, 16 chunks of 8 or 9 rows
  c = RingCase{};
  c.world = 3, c.seqlen = 25, c.strided = true;
  cases.push_back(c);
  c.causal = false, c.heads_k = 1, c.head_dim_v = 24;
  cases.push_back(c);
  c = RingCase{};
  c.world = 3, c.seqlen = 25, c.per_pair_calls = true;
  cases.push_back(c);  // up to 3 calls per step, overlapping key rows
  c.world = 4, c.seqlen = 37, c.heads_k = 1;
  cases.push_back(c);
  c = RingCase{};
  c.world = 3, c.seqlen = 48, c.dtype = DType::kBFloat16;
  cases.push_back(c);
  c.causal = false, c.dtype = DType::kFloat16;
  cases.push_back(c);
  // Learnable sinks (added once per row, in step 0's calls) and softcap, over both layouts,
  // coalesced and per-pair calls, GQA, 16-bit.
  for (int32_t world : {1, 2, 3, 4})
    for (bool causal : {false, true}) {
      c = RingCase{};
      c.world = world, c.causal = causal, c.seqlen = 8 * world + 3, c.sink = true;
      cases.push_back(c);
    }
  c = RingCase{};
  c.world = 3, c.seqlen = 25, c.per_pair_calls = true, c.sink = true, c.softcap = 5.0f;
  cases.push_back(c);
  c.layout = RingLayout::kContiguous, c.per_pair_calls = false;
  cases.push_back(c);
  c = RingCase{};
  c.world = 4, c.seqlen = 37, c.softcap = 3.0f;
  cases.push_back(c);
  c.causal = false;
  cases.push_back(c);
  c = RingCase{};
  c.world = 3, c.seqlen = 48, c.dtype = DType::kBFloat16, c.sink = true, c.softcap = 8.0f;
  cases.push_back(c);
  // Sliding windows (one call per chunk pair): causal with a left edge shorter than a chunk and
  // longer than a shard, non-causal two-sided, with sinks (gpt-oss's sliding layers).
  for (int32_t world : {1, 2, 3, 4})
    for (int32_t left : {3, 11}) {
      c = RingCase{};
      c.world = world, c.seqlen = 8 * world + 3, c.window_left = left, c.window_right = 0;
      cases.push_back(c);
    }
  c = RingCase{};
  c.world = 3, c.seqlen = 29, c.causal = false, c.window_left = 4, c.window_right = 6;
  cases.push_back(c);
  c.window_left = -1, c.window_right = 2;
  cases.push_back(c);
  c = RingCase{};
  c.world = 4, c.seqlen = 37, c.window_left = 5, c.window_right = 0, c.sink = true;
  cases.push_back(c);
  c.layout = RingLayout::kContiguous, c.per_pair_calls = true, c.dtype = DType::kBFloat16;
  cases.push_back(c);
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Cpu, RingVsOneCall, testing::ValuesIn(ring_cases()),
                         [](const testing::TestParamInfo<RingCase>& p) {
                           std::string s = p.param.describe();
                           for (char& ch : s)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return std::to_string(p.index) + "_" + s;
                         });

// ---- errors ----------------------------------------------------------------------------------

// A small valid single-rank problem whose options each test breaks in one way.
struct SmallProblem {
  HostTensor q{DType::kFloat32, {1, 8, 2, 8}}, k{DType::kFloat32, {1, 8, 2, 8}},
      v{DType::kFloat32, {1, 8, 2, 8}}, out{DType::kFloat32, {1, 8, 2, 8}},
      lse{DType::kFloat32, {1, 2, 8}}, alibi{DType::kFloat32, {2}};
  ThreadRingGroup group{1};

  RingForwardArgs args() {
    RingForwardArgs a;
    a.transport = group.transport(0);
    a.causal = true;
    a.q = q.view();
    a.k = k.view();
    a.v = v.view();
    a.out = out.view();
    a.lse = lse.view();
    return a;
  }
};

TEST(RingErrors, UnsupportedOptionsAreNamed) {
  struct Case {
    const char* name;
    StatusCode code;
    const char* needle;
    void (*breaker)(RingForwardArgs&, SmallProblem&);
  };
  const Case cases[] = {
      {"no_transport", StatusCode::kInvalidArgument, "transport is required",
       [](RingForwardArgs& a, SmallProblem&) { a.transport = nullptr; }},
      {"dropout", StatusCode::kNotSupported, "dropout_p",
       [](RingForwardArgs& a, SmallProblem&) { a.dropout_p = 0.1f; }},
      {"alibi", StatusCode::kNotSupported, "alibi_slopes",
       [](RingForwardArgs& a, SmallProblem& p) { a.alibi_slopes = p.alibi.view(); }},
      {"varlen", StatusCode::kNotSupported, "varlen",
       [](RingForwardArgs& a, SmallProblem& p) {
         a.cu_seqlens_q = p.lse.view();
         a.cu_seqlens_k = p.lse.view();
       }},
      {"global_seqlen_negative", StatusCode::kInvalidArgument, "global_seqlen must be >= 0",
       [](RingForwardArgs& a, SmallProblem&) { a.global_seqlen = -1; }},
      {"global_seqlen_mismatch", StatusCode::kInvalidArgument, "must hold 9 rows",
       [](RingForwardArgs& a, SmallProblem&) { a.global_seqlen = 9; }},
      {"bad_shape", StatusCode::kInvalidArgument, "out",  // flashattn's own checks run first
       [](RingForwardArgs& a, SmallProblem&) { a.out.shape[3] = 4; }},
      {"cuda_tensors", StatusCode::kNotSupported, "host memory only",
       [](RingForwardArgs& a, SmallProblem&) {
         for (TensorView* t : {&a.q, &a.k, &a.v, &a.out, &a.lse})
           t->device = {DeviceType::kCUDA, 0};
       }},
  };
  for (const Case& c : cases) {
    SmallProblem p;
    RingForwardArgs a = p.args();
    c.breaker(a, p);
    const Status s = ring_forward(a);
    EXPECT_EQ(s.code(), c.code) << c.name << ": " << s.message();
    EXPECT_NE(s.message().find(c.needle), std::string::npos) << c.name << ": " << s.message();
  }
  // And the backward runs the same checks.
  SmallProblem p;
  RingBackwardArgs b;
  b.transport = p.group.transport(0);
  b.dropout_p = 0.5f;
  EXPECT_EQ(ring_backward(b).code(), StatusCode::kNotSupported);
  // The valid problem itself runs.
  SmallProblem ok;
  const Status s = ring_forward(ok.args());
  EXPECT_TRUE(s.ok()) << s.message();
}

TEST(RingErrors, ARankWithAWrongShardStopsEveryRank) {
  const int32_t world = 3;
  ThreadRingGroup group(world);
  std::vector<Status> status(world);
  std::vector<std::thread> threads;
  std::vector<SmallProblem> problems(world);
  for (int32_t r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      SmallProblem& p = problems[r];
      RingForwardArgs a = p.args();
      a.transport = group.transport(r);
      if (r == 1) {  // claims a global sequence its shard does not fit
        a.global_seqlen = 30;
      }
      status[r] = ring_forward(a);
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(status[1].code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status[1].message().find("rank 1 must hold 10 rows"), std::string::npos)
      << status[1].message();
  for (int32_t r : {0, 2}) {
    EXPECT_EQ(status[r].code(), StatusCode::kInvalidArgument) << "rank " << r;
    EXPECT_NE(status[r].message().find("ring rank 1 stopped"), std::string::npos)
        << status[r].message();
  }
}

TEST(RingErrors, InconsistentShardsFailEveryRank) {
  // N = 19 over 2 ranks, zig-zag: shards of 9 and 10 rows. Without global_seqlen each rank
  // infers N = 2 * its own length (18 and 20), a state no rank can detect alone: the exchange
  // finds it (the thread transport compares sizes; NCCL cannot, see docs/RING.md).
  RingShard s0, s1;
  ASSERT_TRUE(ring_shard(19, 2, 0, true, RingLayout::kAuto, &s0).ok());
  ASSERT_TRUE(ring_shard(19, 2, 1, true, RingLayout::kAuto, &s1).ok());
  ASSERT_EQ(s0.length, 9);
  ASSERT_EQ(s1.length, 10);
  std::vector<HostTensor> q, out;
  for (int64_t len : {s0.length, s1.length}) {
    q.emplace_back(DType::kFloat32, std::vector<int64_t>{1, len, 1, 8});
    out.emplace_back(DType::kFloat32, std::vector<int64_t>{1, len, 1, 8});
  }
  ThreadRingGroup group(2);
  std::vector<Status> status(2);
  std::vector<std::thread> threads;
  for (int32_t r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      RingForwardArgs a;
      a.transport = group.transport(r);
      a.causal = true;
      a.q = a.k = a.v = q[r].view();
      a.out = out[r].view();
      status[r] = ring_forward(a);
    });
  }
  for (auto& th : threads) th.join();
  for (int32_t r = 0; r < 2; ++r) {
    EXPECT_EQ(status[r].code(), StatusCode::kInternal) << "rank " << r;
    EXPECT_NE(status[r].message().find("bytes, rank"), std::string::npos) << status[r].message();
  }
}

// Fails one rank's n-th send_recv or wait (after its send was posted), like a kernel error
// in the middle of the ring would.
class FaultyTransport final : public RingTransport {
 public:
  FaultyTransport(RingTransport* inner, bool in_wait, int fail_at)
      : inner_(inner), in_wait_(in_wait), fail_at_(fail_at) {}
  int32_t rank() const override { return inner_->rank(); }
  int32_t world_size() const override { return inner_->world_size(); }
  Status check_device(const Device& d) const override { return inner_->check_device(d); }
  Status send_recv(const RingTransfer* t, int32_t n, void* stream) override {
    if (!in_wait_ && calls_++ == fail_at_) return Status::Internal("injected send_recv failure");
    return inner_->send_recv(t, n, stream);
  }
  Status wait(void* stream) override {
    if (in_wait_ && calls_++ == fail_at_) return Status::Internal("injected wait failure");
    return inner_->wait(stream);
  }
  void abort(const Status& why) override { inner_->abort(why); }

 private:
  RingTransport* inner_;
  bool in_wait_;
  int fail_at_;
  int calls_ = 0;
};

TEST(RingErrors, AFailureInsideTheRingStopsEveryRank) {
  const int32_t world = 3;
  const int64_t n = 24;
  for (bool backward_pass : {false, true})
    for (bool in_wait : {false, true})
      for (int fail_at : {0, 1}) {
        SCOPED_TRACE(std::string(backward_pass ? "backward" : "forward") +
                     (in_wait ? " wait " : " send_recv ") + std::to_string(fail_at));
        ThreadRingGroup group(world);
        FaultyTransport faulty(group.transport(1), in_wait, fail_at);
        std::vector<Status> status(world);
        std::vector<std::thread> threads;
        for (int32_t r = 0; r < world; ++r) {
          threads.emplace_back([&, r] {
            std::mt19937 rng(r);
            const int64_t l = n / world;
            HostTensor q = random_tensor(DType::kFloat32, {1, l, 2, 8}, rng);
            HostTensor out(DType::kFloat32, {1, l, 2, 8}), lse(DType::kFloat32, {1, 2, l});
            HostTensor dq(DType::kFloat32, {1, l, 2, 8}), dk = dq, dv = dq;
            RingTransport* t = r == 1 ? &faulty : group.transport(r);
            if (!backward_pass) {
              RingForwardArgs a;
              a.transport = t;
              a.causal = true;
              a.num_threads = 1;
              a.q = a.k = a.v = q.view();
              a.out = out.view();
              status[r] = ring_forward(a);
              return;
            }
            RingBackwardArgs b;
            b.transport = t;
            b.causal = true;
            b.num_threads = 1;
            b.q = b.k = b.v = b.out = b.dout = q.view();
            b.lse = lse.view();
            b.dq = dq.view();
            b.dk = dk.view();
            b.dv = dv.view();
            status[r] = ring_backward(b);
          });
        }
        for (auto& th : threads) th.join();
        // Rank 1 fails, and rank 0, whose send rank 1 never takes. Rank 2 received everything
        // it needs when rank 1 failed in the wait of the forward's last exchange.
        const bool rank2_may_finish = !backward_pass && in_wait && fail_at == world - 2;
        for (int32_t r = 0; r < world; ++r) {
          if (r == 2 && rank2_may_finish && status[r].ok()) continue;
          EXPECT_EQ(status[r].code(), StatusCode::kInternal) << "rank " << r;
          EXPECT_NE(status[r].message().find("injected"), std::string::npos)
              << "rank " << r << ": " << status[r].message();
        }
      }
}

TEST(RingErrors, NcclTransportAvailability) {
  std::unique_ptr<RingTransport> t;
  if (!ring_nccl_built()) {
    const Status s = make_nccl_ring_transport(nullptr, 0, &t);
    EXPECT_EQ(s.code(), StatusCode::kNotSupported);
    EXPECT_NE(s.message().find("no NCCL"), std::string::npos) << s.message();
  } else {
    EXPECT_EQ(make_nccl_ring_transport(nullptr, 0, &t).code(), StatusCode::kInvalidArgument);
  }
}

// ---- NCCL, several GPUs (not run yet: no multi-GPU machine so far) ---------------------------

#if defined(FLASHATTN_WITH_CUDA)
// One process, one thread per GPU, over NCCL: the ring against one call on GPU 0, bf16,
// forward and backward. Skips, saying why, without NCCL in the build or with fewer than 2 GPUs.
TEST(RingNccl, MatchesOneGpuCall) {
  if (!ring_nccl_built()) GTEST_SKIP() << "this build has no NCCL transport";
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices < 2) {
    GTEST_SKIP() << "needs 2 or more GPUs, found " << devices;
  }
  const int32_t world = std::min(devices, 8);
  std::vector<int32_t> ids(world);
  for (int32_t r = 0; r < world; ++r) ids[r] = r;
  const DType dt = DType::kBFloat16;
  const int64_t B = 1, N = 2 * world * 256 + 5, H = 8, Hk = 2, D = 128;
  for (bool causal : {true, false}) {
    SCOPED_TRACE(std::string(causal ? "causal" : "full") + ", " + std::to_string(world) + " GPUs");
    std::mt19937 rng(5);
    HostTensor q = random_tensor(dt, {B, N, H, D}, rng), k = random_tensor(dt, {B, N, Hk, D}, rng),
               v = random_tensor(dt, {B, N, Hk, D}, rng),
               dout = random_tensor(dt, {B, N, H, D}, rng);
    HostTensor out(dt, {B, N, H, D}), lse(DType::kFloat32, {B, H, N}), dq(dt, {B, N, H, D}),
        dk(dt, {B, N, Hk, D}), dv(dt, {B, N, Hk, D});

    // One call on GPU 0.
    {
      ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
      std::vector<HostTensor*> host = {&q, &k, &v, &dout, &out, &lse, &dq, &dk, &dv};
      std::vector<std::unique_ptr<DeviceBuffer>> dev;
      std::vector<TensorView> views;
      for (HostTensor* t : host) {
        dev.push_back(std::make_unique<DeviceBuffer>(
            Backend::kCuda, static_cast<size_t>(t->numel()) * dtype_size(t->dtype)));
        dev.back()->upload(t->data());
        TensorView view = t->view();
        view.data = dev.back()->data();
        view.device = {DeviceType::kCUDA, 0};
        views.push_back(view);
      }
      ForwardArgs fa;
      fa.causal = causal;
      fa.q = views[0], fa.k = views[1], fa.v = views[2], fa.out = views[4], fa.lse = views[5];
      const Status fs = forward(fa);
      if (fs.code() == StatusCode::kNotSupported) GTEST_SKIP() << fs.message();
      ASSERT_TRUE(fs.ok()) << fs.message();
      BackwardArgs ba;
      static_cast<AttentionOptions&>(ba) = fa;
      ba.q = fa.q, ba.k = fa.k, ba.v = fa.v, ba.out = fa.out, ba.lse = fa.lse;
      ba.dout = views[3], ba.dq = views[6], ba.dk = views[7], ba.dv = views[8];
      ASSERT_TRUE(flashattn::backward(ba).ok());
      for (size_t i = 4; i < host.size(); ++i) dev[i]->download(host[i]->data());
    }

    std::vector<std::unique_ptr<RingTransport>> transports;
    const Status made = make_nccl_ring_group(ids.data(), world, &transports);
    ASSERT_TRUE(made.ok()) << made.message();
    struct Rank {
      std::vector<int64_t> rows;
      HostTensor out{DType::kBFloat16, {}}, lse{DType::kFloat32, {}}, dq{DType::kBFloat16, {}},
          dk{DType::kBFloat16, {}}, dv{DType::kBFloat16, {}};
      Status status;
    };
    std::vector<Rank> ranks(world);
    std::vector<std::thread> threads;
    for (int32_t r = 0; r < world; ++r) {
      threads.emplace_back([&, r] {
        Rank& me = ranks[r];
        RingShard shard;
        me.status = ring_shard(N, world, r, causal, RingLayout::kAuto, &shard);
        if (!me.status.ok()) return;
        for (int i = 0; i < shard.num_spans; ++i)
          for (int64_t p = shard.begin[i]; p < shard.end[i]; ++p) me.rows.push_back(p);
        const int64_t L = shard.length;
        HostTensor lq = gather(q, 1, me.rows), lk = gather(k, 1, me.rows),
                   lv = gather(v, 1, me.rows), ldout = gather(dout, 1, me.rows);
        me.out = HostTensor(dt, {B, L, H, D});
        me.lse = HostTensor(DType::kFloat32, {B, H, L});
        me.dq = HostTensor(dt, {B, L, H, D});
        me.dk = HostTensor(dt, {B, L, Hk, D});
        me.dv = HostTensor(dt, {B, L, Hk, D});
        if (cudaSetDevice(r) != cudaSuccess) {
          me.status = Status::CudaError("cudaSetDevice");
          return;
        }
        std::vector<HostTensor*> host = {&lq,     &lk,    &lv,    &ldout, &me.out,
                                         &me.lse, &me.dq, &me.dk, &me.dv};
        std::vector<std::unique_ptr<DeviceBuffer>> dev;
        std::vector<TensorView> views;
        for (HostTensor* t : host) {
          dev.push_back(std::make_unique<DeviceBuffer>(
              Backend::kCuda, static_cast<size_t>(t->numel()) * dtype_size(t->dtype)));
          dev.back()->upload(t->data());
          TensorView view = t->view();
          view.data = dev.back()->data();
          view.device = {DeviceType::kCUDA, r};
          views.push_back(view);
        }
        RingForwardArgs rf;
        rf.causal = causal;
        rf.transport = transports[r].get();
        rf.global_seqlen = N;
        rf.q = views[0], rf.k = views[1], rf.v = views[2], rf.out = views[4], rf.lse = views[5];
        me.status = ring_forward(rf);
        if (!me.status.ok()) return;
        RingBackwardArgs rb;
        static_cast<AttentionOptions&>(rb) = rf;
        static_cast<RingOptions&>(rb) = rf;
        rb.q = rf.q, rb.k = rf.k, rb.v = rf.v, rb.out = rf.out, rb.lse = rf.lse;
        rb.dout = views[3], rb.dq = views[6], rb.dk = views[7], rb.dv = views[8];
        me.status = ring_backward(rb);
        if (!me.status.ok()) return;
        if (cudaDeviceSynchronize() != cudaSuccess) {
          me.status = Status::CudaError("cudaDeviceSynchronize after the ring");
          return;
        }
        for (size_t i = 4; i < host.size(); ++i) dev[i]->download(host[i]->data());
      });
    }
    for (auto& th : threads) th.join();
    transports.clear();
    const double tol = 8 * unit_roundoff(dt);
    for (int32_t r = 0; r < world; ++r) {
      Rank& me = ranks[r];
      ASSERT_TRUE(me.status.ok()) << "rank " << r << ": " << me.status.message();
      EXPECT_LE(rel_error(me.out, gather(out, 1, me.rows)), tol) << "out, rank " << r;
      EXPECT_LE(rel_error(me.lse, gather(lse, 2, me.rows)), 1e-4) << "lse, rank " << r;
      EXPECT_LE(rel_error(me.dq, gather(dq, 1, me.rows)), tol) << "dq, rank " << r;
      EXPECT_LE(rel_error(me.dk, gather(dk, 1, me.rows)), tol) << "dk, rank " << r;
      EXPECT_LE(rel_error(me.dv, gather(dv, 1, me.rows)), tol) << "dv, rank " << r;
    }
  }
}
#endif  // FLASHATTN_WITH_CUDA

}  // namespace
}  // namespace flashattn::test
