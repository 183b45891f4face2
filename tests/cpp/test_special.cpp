// Targeted properties, each on every backend unless it is about the CPU: rows without visible
// keys, sequence length 1, bitwise determinism, the dropout mask and its statistics, mask
// patterns written out by hand, varlen vs per-sequence, thread counts, and the CPU float32
// backward against finite differences.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/philox.h"
#include "test_util.h"

namespace flashattn::test {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// The dtypes exercised per backend by the targeted tests: the CUDA backend has no float32.
std::vector<DType> dtypes_for(Backend b) {
  if (b == Backend::kCpu) return {DType::kFloat32, DType::kBFloat16};
  return {DType::kFloat16, DType::kBFloat16};
}

// Runs forward (+ backward) of a DeviceProblem, turning the CUDA "not supported" answers for
// out-of-domain problems into a skip. Returns false when the caller must stop.
bool run(Backend backend, const ProblemSpec& spec, DeviceProblem& dev, bool backward,
         std::string* skip) {
  Status s = forward(dev.forward_args());
  if (s.ok() && backward) s = flashattn::backward(dev.backward_args());
  if (s.ok()) {
    dev.download_forward();
    if (backward) dev.download_backward();
    return true;
  }
  if (backend == Backend::kCuda && s.code() == StatusCode::kNotSupported &&
      cuda_may_not_support(spec)) {
    *skip = s.message();
  } else {
    ADD_FAILURE() << status_code_name(s.code()) << ": " << s.message()
                  << "\n  case: " << spec.describe();
  }
  return false;
}

class Special : public testing::TestWithParam<Backend> {};

// ---- rows that see no key -------------------------------------------------------------------

TEST_P(Special, FullyMaskedRowsGiveZeroOutputMinusInfLseZeroGradients) {
  const Backend backend = GetParam();
  FLASHATTN_SKIP_IF_UNAVAILABLE(backend);
  for (DType dt : dtypes_for(backend)) {
    std::vector<ProblemSpec> specs;
    ProblemSpec s = ProblemSpec::dense(dt, 2, 129, 64, 4, 2, 64, 64);
    s.causal = true;  // rows 0..64 see nothing
    specs.push_back(s);
    s = ProblemSpec::dense(dt, 1, 129, 7, 2, 1, 64, 64);
    s.window_left = 2, s.window_right = 0;  // rows 0..121 see nothing
    s.dropout_p = 0.25f, s.dropout_seed = 9;
    specs.push_back(s);
    s = ProblemSpec{};
    s.dtype = dt, s.varlen = true;
    s.seqlens_q = {64, 7}, s.seqlens_k = {0, 64};  // all rows of sequence 0 see nothing
    s.heads = 2, s.heads_k = 1, s.head_dim = s.head_dim_v = 64;
    s.alibi = Alibi::kHeads;
    specs.push_back(s);

    for (ProblemSpec& spec : specs) {
      spec.data_seed += 17u * static_cast<uint32_t>(dt);
      SCOPED_TRACE(spec.describe());
      const HostProblem host = make_host_problem(spec);
      DeviceProblem dev(backend, spec, host);
      std::string skip;
      if (!run(backend, spec, dev, true, &skip)) {
        if (!skip.empty()) continue;
        return;
      }
      const Results ref = run_reference(host, true);
      const std::vector<double> out = dev.out(), lse = dev.lse(), dq = dev.dq(), dk = dev.dk(),
                                dv = dev.dv();
      const int H = spec.heads, Dv = spec.head_dim_v, D = spec.head_dim;
      const int64_t Tq = host.shape.total_q();
      int64_t empty_rows = 0;
      for (int h = 0; h < H; ++h) {
        for (int64_t r = 0; r < Tq; ++r) {
          if (ref.lse[static_cast<size_t>(h * Tq + r)] != -kInf) continue;
          ++empty_rows;
          ASSERT_EQ(lse[static_cast<size_t>(h * Tq + r)], -kInf)
              << "lse, head " << h << " row " << r;
          for (int t = 0; t < Dv; ++t) {
            ASSERT_EQ(out[static_cast<size_t>((r * H + h) * Dv + t)], 0.0)
                << "out, head " << h << " row " << r;
          }
          for (int t = 0; t < D; ++t) {
            ASSERT_EQ(dq[static_cast<size_t>((r * H + h) * D + t)], 0.0)
                << "dq, head " << h << " row " << r;
          }
        }
      }
      EXPECT_GT(empty_rows, 0) << "the case has no empty row: the test would be vacuous";
      for (const auto* x : {&out, &dq, &dk, &dv}) {
        for (double e : *x) ASSERT_FALSE(std::isnan(e));
      }
      for (double e : lse) ASSERT_FALSE(std::isnan(e));
      // And the visible rows are right.
      Results low;
      if (dt != DType::kFloat32) low = run_naive_lowp(host, dt, true);
      EXPECT_TRUE(meets_criterion("out", dt, out, ref.out, low.out));
      EXPECT_TRUE(meets_criterion("lse", dt, lse, ref.lse, low.lse));
      EXPECT_TRUE(meets_criterion("dq", dt, dq, ref.dq, low.dq, grad_magnitude(ref)));
      EXPECT_TRUE(meets_criterion("dk", dt, dk, ref.dk, low.dk, grad_magnitude(ref)));
      EXPECT_TRUE(meets_criterion("dv", dt, dv, ref.dv, low.dv, grad_magnitude(ref)));
    }
  }
}

// ---- sequence length 1 ----------------------------------------------------------------------

TEST_P(Special, SeqlenOne) {
  const Backend backend = GetParam();
  FLASHATTN_SKIP_IF_UNAVAILABLE(backend);
  for (DType dt : dtypes_for(backend)) {
    ProblemSpec s = ProblemSpec::dense(dt, 3, 1, 1, 4, 2, 64, 64);
    s.data_seed = 77 + static_cast<uint32_t>(dt);
    SCOPED_TRACE(s.describe());
    const HostProblem host = make_host_problem(s);
    DeviceProblem dev(backend, s, host);
    std::string skip;
    if (!run(backend, s, dev, true, &skip)) {
      if (!skip.empty()) continue;
      return;
    }
    // One key: P = 1, so out = v (per GQA group), dV = sum of dout over the group, dQ = dK = 0.
    const std::vector<double> out = dev.out(), dq = dev.dq(), dk = dev.dk(), dv = dev.dv();
    const double tol = 2.0 * unit_roundoff(dt);
    for (int b = 0; b < 3; ++b) {
      for (int h = 0; h < 4; ++h) {
        for (int t = 0; t < 64; ++t) {
          const double v = host.v[static_cast<size_t>((b * 2 + h / 2) * 64 + t)];
          ASSERT_NEAR(out[static_cast<size_t>((b * 4 + h) * 64 + t)], v, tol * std::fabs(v) + 1e-7);
          ASSERT_NEAR(dq[static_cast<size_t>((b * 4 + h) * 64 + t)], 0.0, 1e-3);
        }
      }
      for (int hk = 0; hk < 2; ++hk) {
        for (int t = 0; t < 64; ++t) {
          const double want = host.dout[static_cast<size_t>((b * 4 + 2 * hk) * 64 + t)] +
                              host.dout[static_cast<size_t>((b * 4 + 2 * hk + 1) * 64 + t)];
          ASSERT_NEAR(dv[static_cast<size_t>((b * 2 + hk) * 64 + t)], want,
                      4 * tol * (std::fabs(want) + 1.0));
          ASSERT_NEAR(dk[static_cast<size_t>((b * 2 + hk) * 64 + t)], 0.0, 1e-3);
        }
      }
    }
  }
}

// ---- determinism ----------------------------------------------------------------------------

TEST_P(Special, DeterministicBackwardIsBitwiseReproducible) {
  const Backend backend = GetParam();
  FLASHATTN_SKIP_IF_UNAVAILABLE(backend);
  for (DType dt : dtypes_for(backend)) {
    // Long key side and an 8-way GQA group: many partial sums into each dK/dV row.
    ProblemSpec s = ProblemSpec::dense(dt, 2, 300, 129, 8, 1, 64, 64);
    s.causal = true;
    s.dropout_p = 0.1f, s.dropout_seed = 5;
    s.deterministic = true;
    s.data_seed = 31 + static_cast<uint32_t>(dt);
    SCOPED_TRACE(s.describe());
    const HostProblem host = make_host_problem(s);
    DeviceProblem dev(backend, s, host);
    std::string skip;
    if (!run(backend, s, dev, true, &skip)) {
      if (!skip.empty()) continue;
      return;
    }
    const std::vector<unsigned char> first = dev.grad_bytes();
    for (int rep = 0; rep < 3; ++rep) {
      ASSERT_TRUE(flashattn::backward(dev.backward_args()).ok());
      dev.download_backward();
      ASSERT_TRUE(dev.grad_bytes() == first) << "run " << rep + 2 << " differs from run 1";
    }
  }
}

// ---- dropout --------------------------------------------------------------------------------

// q = 0 makes P uniform (1 / seqlen_k); v_j = e_j makes out row i equal to row i of the dropped
// and rescaled P. So the output spells out the keep mask the backend used.
TEST_P(Special, DropoutMaskIsPhiloxAndKeepsOneMinusP) {
  const Backend backend = GetParam();
  FLASHATTN_SKIP_IF_UNAVAILABLE(backend);
  const DType dt = dtypes_for(backend).back();
  for (float p : {0.15f, 0.6f}) {
    const int batch = 2, heads = 4, sq = 257, sk = 128;
    ProblemSpec s = ProblemSpec::dense(dt, batch, sq, sk, heads, 2, sk, sk);
    s.dropout_p = p;
    s.dropout_seed = 0x0123456789abcdefull;
    s.dropout_offset = 0xfedcba9876543210ull;
    SCOPED_TRACE(s.describe());
    HostProblem host = make_host_problem(s);
    std::fill(host.q.begin(), host.q.end(), 0.0);
    std::fill(host.v.begin(), host.v.end(), 0.0);
    for (int64_t r = 0; r < host.shape.total_k() * 2; ++r)
      host.v[static_cast<size_t>(r * sk + (r / 2) % sk)] = 1.0;
    DeviceProblem dev(backend, s, host);
    std::string skip;
    if (!run(backend, s, dev, false, &skip)) {
      if (!skip.empty()) GTEST_SKIP() << skip;
      return;
    }
    const std::vector<double> out = dev.out();
    const uint32_t threshold = dropout_threshold(p);
    const double kept_value = 1.0 / ((1.0 - p) * sk);
    int64_t kept = 0, mismatches = 0;
    for (int b = 0; b < batch; ++b) {
      for (int i = 0; i < sq; ++i) {
        for (int h = 0; h < heads; ++h) {
          for (int j = 0; j < sk; ++j) {
            const double o = out[static_cast<size_t>(((b * sq + i) * heads + h) * sk + j)];
            const bool want =
                dropout_keep(s.dropout_seed, s.dropout_offset, static_cast<uint32_t>(b * heads + h),
                             static_cast<uint32_t>(i), static_cast<uint32_t>(j), threshold);
            const bool got = o != 0.0;
            kept += got;
            if (got != want) {
              if (mismatches++ < 5)
                ADD_FAILURE() << "keep mismatch at b " << b << " h " << h << " i " << i << " j "
                              << j;
            }
            if (got) {
              ASSERT_NEAR(o, kept_value, 8 * unit_roundoff(dt) * kept_value) << "kept value";
            }
          }
        }
      }
    }
    EXPECT_EQ(mismatches, 0);
    const double n = static_cast<double>(batch) * heads * sq * sk;
    const double frac = static_cast<double>(kept) / n;
    const double sigma = std::sqrt(p * (1.0 - p) / n);
    EXPECT_NEAR(frac, 1.0 - p, 8 * sigma) << "keep fraction over " << n << " draws";
  }
}

// ---- masks written out by hand --------------------------------------------------------------

struct MaskPattern {
  int sq, sk, left, right;
  bool causal;
  const char* rows;  // '|'-separated, '1' = visible
};

TEST_P(Special, MaskPatternsMatchHandWrittenExpectations) {
  const Backend backend = GetParam();
  FLASHATTN_SKIP_IF_UNAVAILABLE(backend);
  const MaskPattern patterns[] = {
      {3, 5, -1, -1, true, "11100|11110|11111"},   {5, 3, -1, -1, true, "000|000|100|110|111"},
      {4, 4, 1, 0, false, "1000|1100|0110|0011"},  {4, 4, 0, 1, false, "1100|0110|0011|0001"},
      {3, 6, 1, 1, false, "001110|000111|000011"}, {4, 2, 0, 0, false, "00|00|10|01"},
      {3, 5, 1, -1, true, "01100|00110|00011"},  // causal + window_left 1
  };
  const DType dt = dtypes_for(backend).back();
  const int d = 32;  // v_j = e_j needs head_dim_v >= seqlen_k
  for (const MaskPattern& m : patterns) {
    ProblemSpec s = ProblemSpec::dense(dt, 1, m.sq, m.sk, 1, 1, d, d);
    s.causal = m.causal;
    s.window_left = m.left;
    s.window_right = m.causal ? -1 : m.right;
    SCOPED_TRACE(s.describe() + " expected " + m.rows);
    HostProblem host = make_host_problem(s);
    std::fill(host.q.begin(), host.q.end(), 0.0);
    std::fill(host.v.begin(), host.v.end(), 0.0);
    for (int j = 0; j < m.sk; ++j) host.v[static_cast<size_t>(j * d + j)] = 1.0;
    DeviceProblem dev(backend, s, host);
    std::string skip;
    if (!run(backend, s, dev, false, &skip)) {
      if (!skip.empty()) GTEST_SKIP() << skip;
      return;
    }
    const std::vector<double> out = dev.out(), lse = dev.lse();
    const std::string rows = m.rows;
    for (int i = 0; i < m.sq; ++i) {
      int count = 0;
      for (int j = 0; j < m.sk; ++j) count += rows[static_cast<size_t>(i * (m.sk + 1) + j)] == '1';
      for (int j = 0; j < d; ++j) {
        const bool vis = j < m.sk && rows[static_cast<size_t>(i * (m.sk + 1) + j)] == '1';
        EXPECT_NEAR(out[static_cast<size_t>(i * d + j)], vis ? 1.0 / count : 0.0, 1e-3)
            << "row " << i << " col " << j;
      }
      if (count == 0) {
        EXPECT_EQ(lse[static_cast<size_t>(i)], -kInf) << "row " << i;
      } else {
        EXPECT_NEAR(lse[static_cast<size_t>(i)], std::log(count), 1e-5) << "row " << i;
      }
    }
  }
}

// ---- varlen vs per-sequence -----------------------------------------------------------------

TEST_P(Special, VarlenMatchesPerSequenceDense) {
  const Backend backend = GetParam();
  FLASHATTN_SKIP_IF_UNAVAILABLE(backend);
  const DType dt = dtypes_for(backend).back();
  ProblemSpec v;
  v.dtype = dt, v.varlen = true;
  v.seqlens_q = {129, 7, 64}, v.seqlens_k = {64, 300, 64};
  v.heads = 4, v.heads_k = 2, v.head_dim = v.head_dim_v = 64;
  v.causal = true;
  v.data_seed = 404;
  const HostProblem vh = make_host_problem(v);
  DeviceProblem vd(backend, v, vh);
  std::string skip;
  if (!run(backend, v, vd, true, &skip)) {
    if (!skip.empty()) GTEST_SKIP() << skip;
    return;
  }
  const std::vector<double> vout = vd.out(), vlse = vd.lse(), vdq = vd.dq(), vdk = vd.dk(),
                            vdv = vd.dv();
  const int H = 4, Hk = 2, D = 64;
  for (int b = 0; b < 3; ++b) {
    SCOPED_TRACE("sequence " + std::to_string(b));
    ProblemSpec s = ProblemSpec::dense(dt, 1, v.seqlens_q[static_cast<size_t>(b)],
                                       v.seqlens_k[static_cast<size_t>(b)], H, Hk, D, D);
    s.causal = true;
    HostProblem sh = make_host_problem(s);
    const int64_t q0 = vh.shape.cu_seqlens_q[static_cast<size_t>(b)],
                  k0 = vh.shape.cu_seqlens_k[static_cast<size_t>(b)];
    const int64_t sq = s.seqlens_q[0], sk = s.seqlens_k[0];
    auto slice = [](const std::vector<double>& x, int64_t row0, int64_t rows, int64_t width) {
      return std::vector<double>(x.begin() + row0 * width, x.begin() + (row0 + rows) * width);
    };
    sh.q = slice(vh.q, q0, sq, H * D);
    sh.dout = slice(vh.dout, q0, sq, H * D);
    sh.k = slice(vh.k, k0, sk, Hk * D);
    sh.v = slice(vh.v, k0, sk, Hk * D);
    DeviceProblem sd(backend, s, sh);
    ASSERT_TRUE(run(backend, s, sd, true, &skip)) << skip;
    // Same arithmetic on the same rows: agreement to within a couple of roundings.
    const double tol = 4.0 * unit_roundoff(dt);
    auto close = [&](const char* what, const std::vector<double>& dense,
                     const std::vector<double>& var) {
      double mx = 0.0;
      for (double x : dense) mx = std::max(mx, std::fabs(x));
      const ErrorStats st = error_stats(var, dense);
      EXPECT_LE(st.max_abs, tol * (mx + 1.0)) << what << " mean " << st.mean_abs;
    };
    close("out", sd.out(), slice(vout, q0, sq, H * D));
    close("dq", sd.dq(), slice(vdq, q0, sq, H * D));
    close("dk", sd.dk(), slice(vdk, k0, sk, Hk * D));
    close("dv", sd.dv(), slice(vdv, k0, sk, Hk * D));
    std::vector<double> l;
    for (int h = 0; h < H; ++h)
      for (int64_t i = 0; i < sq; ++i)
        l.push_back(vlse[static_cast<size_t>(h * vh.shape.total_q() + q0 + i)]);
    close("lse", sd.lse(), l);
  }
}

// ---- split-KV vs unsplit --------------------------------------------------------------------

// Runs s with each number of splits (0 = the heuristic's choice) against the reference, and the
// split results against the first (unsplit) one. Returns false when the caller must stop (a
// failure was recorded, or *skip says why the backend does not support it).
bool check_split_kv(Backend backend, ProblemSpec s, std::initializer_list<int> splits_list, std::string* skip) {
  const DType dt = s.dtype;
  std::vector<std::vector<double>> outs, lses;
  for (int splits : splits_list) {
    s.num_splits = splits;
    SCOPED_TRACE(s.describe());
    const HostProblem host = make_host_problem(s);
    DeviceProblem dev(backend, s, host);
    if (!run(backend, s, dev, false, skip)) return false;
    const Results ref = run_reference(host, false);
    const Results low = run_naive_lowp(host, dt, false);
    EXPECT_TRUE(meets_criterion("out", dt, dev.out(), ref.out, low.out));
    EXPECT_TRUE(meets_criterion("lse", dt, dev.lse(), ref.lse, low.lse));
    outs.push_back(dev.out());
    lses.push_back(dev.lse());
  }
  // The split results agree with the unsplit one to within a couple of roundings.
  const double tol = 4.0 * unit_roundoff(dt) * (max_abs(outs[0]) + 1.0);
  for (size_t i = 1; i < outs.size(); ++i) {
    EXPECT_LE(error_stats(outs[i], outs[0]).max_abs, tol) << "out, run " << i;
    EXPECT_LE(error_stats(lses[i], lses[0]).max_abs, 1e-4 * (max_abs(lses[0]) + 1.0)) << "lse, run " << i;
  }
  return true;
}

TEST_P(Special, SplitKvMatchesUnsplit) {
  const Backend backend = GetParam();
  FLASHATTN_SKIP_IF_UNAVAILABLE(backend);
  const DType dt = dtypes_for(backend).back();
  for (const auto& [sq, causal] : {std::pair{1, false}, std::pair{7, true}, std::pair{64, false}}) {
    ProblemSpec s = ProblemSpec::dense(dt, 2, sq, 300, 8, 2, 64, 64);
    s.causal = causal;
    s.data_seed = 6100u + static_cast<uint32_t>(sq);
    std::string skip;
    if (!check_split_kv(backend, s, {1, 3, 0}, &skip)) {
      if (!skip.empty()) GTEST_SKIP() << skip;
      return;
    }
  }
}

// More than 32 splits (the combine kernel reads the splits' LSEs 32 at a time), at head dims whose
// combine reads 3, 4 and 6 columns per lane; one query token over 4500 keys (the decode shape).
TEST_P(Special, SplitKvManySplits) {
  const Backend backend = GetParam();
  FLASHATTN_SKIP_IF_UNAVAILABLE(backend);
  const DType dt = dtypes_for(backend).back();
  for (int d : {96, 128, 192}) {
    ProblemSpec s = ProblemSpec::dense(dt, 2, 1, 4500, 8, 2, d, d);
    s.data_seed = 6200u + static_cast<uint32_t>(d);
    std::string skip;
    if (!check_split_kv(backend, s, {1, 36, 0}, &skip)) {
      if (!skip.empty()) GTEST_SKIP() << skip;
      return;
    }
  }
}

// The decode kernels (at most 16 query rows after the GQA fold) merge their split-KV partials
// themselves: on a Hopper GPU at small grids within a thread-block cluster of a row group's
// splits (at most 8; sm80/fwd_kernel.h merge_splits_in_cluster), elsewhere in the last split CTA
// of each row group (merge_if_last_split; the kSplitCombineCounter switch keeps it on Hopper
// too); the kSplitCombineKernel switch (core/switches.h) merges them with the combine kernel
// instead. All add the splits in split order: the same bits, at one query (GQA folded, with a
// sink), at 7 causal rows without GQA (not folded: with 16 / 4 heads the token fold would put
// them on two row tiles, where no cluster runs), varlen with one query (the token fold), with 3,
// 8 (the largest cluster), 16, 36 (beyond one warp's 32 lanes) and the heuristic's splits; a
// second call gives the same bits again (the counters were left at zero).
TEST_P(Special, FusedSplitCombineMatchesTheCombineKernelBitwise) {
  const Backend backend = GetParam();
  FLASHATTN_SKIP_IF_UNAVAILABLE(backend);
  if (backend != Backend::kCuda) GTEST_SKIP() << "the split-KV combine is a CUDA path";
  struct Case {
    int seqlen_q, heads_k, head_dim;
    bool causal, varlen;
    Sink sink;
  };
  for (const Case& c : {Case{1, 4, 128, false, false, Sink::kRandom}, Case{7, 16, 64, true, false, Sink::kNone},
                        Case{1, 4, 96, false, true, Sink::kLarge}}) {
    for (int splits : {3, 8, 16, 36, 0}) {
      ProblemSpec s =
          ProblemSpec::dense(DType::kBFloat16, 2, c.seqlen_q, 4600, 16, c.heads_k, c.head_dim, c.head_dim);
      s.causal = c.causal;
      s.sink = c.sink;
      s.num_splits = splits;
      if (c.varlen) {
        s.varlen = true;
        s.seqlens_k = {4600, 77};
      }
      s.data_seed = 6300u + static_cast<uint32_t>(c.head_dim + splits);
      SCOPED_TRACE(s.describe());
      const HostProblem host = make_host_problem(s);
      std::vector<std::vector<double>> outs, lses;
      for (int call = 0; call < 4; ++call) {
        // Calls 0 and 1 as the launcher chooses, call 2 through the combine kernel, call 3 through
        // the counters.
        bool ran = false;
        std::string skip;
        DeviceProblem dev(backend, s, host);
        const unsigned long long clusters = detail::split_cluster_launches();
        {
          ScopedSwitch combine_kernel(detail::Switch::kSplitCombineKernel, call == 2);
          ScopedSwitch counter(detail::Switch::kSplitCombineCounter, call == 3);
          ran = run(backend, s, dev, false, &skip);
        }
        const unsigned long long ran_clusters = detail::split_cluster_launches() - clusters;
        if (call >= 2) {
          EXPECT_EQ(ran_clusters, 0u) << "call " << call << ": the switch did not keep clusters off";
        }
        if (ran && call == 0 && (splits == 3 || splits == 8)) {
          // Row groups, one row tile each: batch x heads_k (one query token folded into the rows
          // of its KV head, dense or varlen; the 7-row case has no GQA, so heads_k = heads).
          const long long groups = 2LL * c.heads_k;
          const bool expected = split_clusters_expected(groups * splits);
          EXPECT_EQ(ran_clusters, expected ? 1u : 0u) << "the cluster merge " << (expected ? "did not run" : "ran");
        }
        if (!ran) {
          if (!skip.empty()) GTEST_SKIP() << skip;
          return;
        }
        outs.push_back(dev.out());
        lses.push_back(dev.lse());
      }
      const auto same_bits = [](const std::vector<double>& a, const std::vector<double>& b) {
        return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
      };
      EXPECT_TRUE(same_bits(outs[0], outs[2])) << "out: default merge != combine kernel";
      EXPECT_TRUE(same_bits(lses[0], lses[2])) << "lse: default merge != combine kernel";
      EXPECT_TRUE(same_bits(outs[0], outs[3])) << "out: default merge != counter merge";
      EXPECT_TRUE(same_bits(lses[0], lses[3])) << "lse: default merge != counter merge";
      EXPECT_TRUE(same_bits(outs[0], outs[1])) << "out: second call differs";
      EXPECT_TRUE(same_bits(lses[0], lses[1])) << "lse: second call differs";
      const Results ref = run_reference(host, false);
      const Results low = run_naive_lowp(host, s.dtype, false);
      EXPECT_TRUE(meets_criterion("out", s.dtype, outs[0], ref.out, low.out));
      EXPECT_TRUE(meets_criterion("lse", s.dtype, lses[0], ref.lse, low.lse));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, Special, testing::ValuesIn(all_backends()),
                         [](const testing::TestParamInfo<Backend>& param_info) {
                           return std::string(backend_name(param_info.param));
                         });

// ---- CPU only -------------------------------------------------------------------------------

TEST(Cpu, ThreadCountsGiveCorrectResults) {
  for (int threads : {1, 3, 7}) {
    ProblemSpec s = ProblemSpec::dense(DType::kFloat32, 2, 129, 300, 4, 2, 64, 64);
    s.causal = true;
    s.num_threads = threads;
    s.data_seed = 900 + static_cast<uint32_t>(threads);
    SCOPED_TRACE("num_threads " + std::to_string(threads));
    EXPECT_FALSE(check_problem(Backend::kCpu, s, true).skipped);
  }
}

TEST(Cpu, Float32BackwardMatchesFiniteDifferencesOfTheForward) {
  // Tiny problem with every score transform; L = sum(out * dout) evaluated in double from the
  // float32 output of the CPU forward.
  ProblemSpec s = ProblemSpec::dense(DType::kFloat32, 1, 3, 5, 2, 1, 4, 3);
  s.causal = true;
  s.softcap = 1.5f;
  s.alibi = Alibi::kHeads;
  s.dropout_p = 0.2f, s.dropout_seed = 12;
  s.data_seed = 4242;
  HostProblem host = make_host_problem(s);
  DeviceProblem dev(Backend::kCpu, s, host);
  ASSERT_TRUE(forward(dev.forward_args()).ok());
  ASSERT_TRUE(flashattn::backward(dev.backward_args()).ok());
  dev.download_backward();
  const std::vector<double> dq = dev.dq(), dk = dev.dk(), dv = dev.dv();

  auto loss = [&](const HostProblem& hp) {
    DeviceProblem d(Backend::kCpu, s, hp);
    const Status st = forward(d.forward_args());
    EXPECT_TRUE(st.ok()) << st.message();
    d.download_forward();
    const std::vector<double> out = d.out();
    double l = 0.0;
    for (size_t i = 0; i < out.size(); ++i) l += out[i] * hp.dout[i];
    return l;
  };
  const double h = 1e-2;  // float32 forward: a large step keeps rounding noise ~1e-5
  struct Target {
    const char* name;
    std::vector<double> HostProblem::*x;
    const std::vector<double>* grad;
  } targets[] = {
      {"dq", &HostProblem::q, &dq}, {"dk", &HostProblem::k, &dk}, {"dv", &HostProblem::v, &dv}};
  for (const Target& t : targets) {
    double gmax = 0.0;
    for (double g : *t.grad) gmax = std::max(gmax, std::fabs(g));
    ASSERT_GT(gmax, 0.0) << t.name;
    for (size_t e = 0; e < (host.*t.x).size(); ++e) {
      HostProblem plus = host, minus = host;
      // Steps that are exact in float32, so the forward sees exactly x +- h.
      (plus.*t.x)[e] = static_cast<float>((host.*t.x)[e] + h);
      (minus.*t.x)[e] = static_cast<float>((host.*t.x)[e] - h);
      const double fd = (loss(plus) - loss(minus)) / ((plus.*t.x)[e] - (minus.*t.x)[e]);
      EXPECT_NEAR(fd, (*t.grad)[e], 5e-3 * (gmax + 1.0)) << t.name << "[" << e << "]";
    }
  }
}

// ---- the Philox keep-mask itself ------------------------------------------------------------

TEST(Philox, KeepFractionAndIndependence) {
  for (float p : {0.1f, 0.5f, 0.9f}) {
    const uint32_t threshold = dropout_threshold(p);
    const int rows = 512, cols = 2048;
    int64_t kept = 0, kept_col[4] = {0, 0, 0, 0}, same_other_seed = 0, same_other_offset = 0;
    for (int i = 0; i < rows; ++i) {
      for (int j = 0; j < cols; ++j) {
        const bool k =
            dropout_keep(1, 2, 3, static_cast<uint32_t>(i), static_cast<uint32_t>(j), threshold);
        kept += k;
        kept_col[j % 4] += k;
        same_other_seed += k == dropout_keep(2, 2, 3, static_cast<uint32_t>(i),
                                             static_cast<uint32_t>(j), threshold);
        // Only the high word of the offset differs: it is folded into the key.
        same_other_offset += k == dropout_keep(1, 2 + (1ull << 32), 3, static_cast<uint32_t>(i),
                                               static_cast<uint32_t>(j), threshold);
      }
    }
    const double n = static_cast<double>(rows) * cols;
    const double sigma = std::sqrt(p * (1.0 - p) / n);
    EXPECT_NEAR(kept / n, 1.0 - p, 6 * sigma) << "p " << p;
    for (int c = 0; c < 4; ++c)
      EXPECT_NEAR(kept_col[c] / (n / 4), 1.0 - p, 12 * sigma) << "p " << p << " col%4 " << c;
    // Independent masks agree with probability p^2 + (1-p)^2.
    const double agree = p * p + (1 - p) * (1 - p);
    EXPECT_NEAR(same_other_seed / n, agree, 0.01) << "p " << p;
    EXPECT_NEAR(same_other_offset / n, agree, 0.01) << "p " << p;
  }
  EXPECT_TRUE(dropout_keep(1, 2, 3, 4, 5, dropout_threshold(0.0f)));
}

// ---- CUDA only -------------------------------------------------------------------------------

// The backward with one Q/dO step buffer: the variant for GPUs whose shared memory cannot hold
// two (A100 at head dim >= 64). The kBwdSingleBuffer switch forces it on this GPU; every
// head dim of the build, plain, causal, with window + softcap + ALiBi + dropout, and
// deterministic, against the float64 reference. (The switch is put back at the end.)
TEST(Cuda, SingleStepBufferBackwardMatchesReference) {
  if (!backend_available(Backend::kCuda)) GTEST_SKIP() << "no usable CUDA GPU";
  ScopedSwitch single_buffer(detail::Switch::kBwdSingleBuffer, true);
  int ran = 0;
  std::string last_skip;
  for (int d : {32, 64, 96, 128, 192, 256}) {
    for (int variant = 0; variant < 4; ++variant) {
      ProblemSpec s = ProblemSpec::dense(DType::kBFloat16, 2, 150, 170, 4, 2, d, d);
      s.causal = variant == 1 || variant == 3;
      if (variant == 2) {
        s.window_left = 40;
        s.window_right = 8;
        s.softcap = 20.0f;
        s.alibi = Alibi::kHeads;
        s.dropout_p = 0.15f;
        s.dropout_seed = 99;
      }
      s.deterministic = variant == 3;
      s.data_seed = 7000u + static_cast<uint32_t>(d * 4 + variant);
      SCOPED_TRACE(s.describe());
      const CaseOutcome o = check_problem(Backend::kCuda, s, /*with_backward=*/true);
      if (o.skipped) {
        last_skip = o.skip_reason;  // a head dim this build trims away
      } else {
        ++ran;
      }
    }
  }
  if (ran == 0) GTEST_SKIP() << last_skip;
}

}  // namespace
}  // namespace flashattn::test
