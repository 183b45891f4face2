// Tests of the fp64 reference itself: hand-computed masks and closed forms, an independent second
// implementation (naive_lowp with exact = true), and finite-difference checks of its backward.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/philox.h"
#include "reference/reference.h"
#include "test_util.h"

namespace flashattn::test {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// With q = 0 every visible key has the same score, so P is uniform over the visible keys; with
// v_j = e_j (one-hot, head_dim_v = seqlen_k) the output row i *is* row i of P.
struct Probe {
  std::vector<double> out, lse;
};
Probe probe(int sq, int sk, const reference::Options& opt_in, int batch = 1) {
  const reference::Shape s = reference::Shape::dense(batch, sq, sk, 1, 1, 4, sk);
  reference::Options opt = opt_in;
  if (opt.scale == 0.0) opt.scale = 0.5;
  std::vector<double> q(static_cast<size_t>(s.total_q() * 4), 0.0);
  std::vector<double> k(static_cast<size_t>(s.total_k() * 4), 0.0);
  for (size_t i = 0; i < k.size(); ++i) k[i] = std::sin(static_cast<double>(i) + 1.0);
  std::vector<double> v(static_cast<size_t>(s.total_k() * sk), 0.0);
  for (int64_t r = 0; r < s.total_k(); ++r) v[static_cast<size_t>(r * sk + r % sk)] = 1.0;
  Probe p;
  p.out.resize(static_cast<size_t>(s.total_q() * sk));
  p.lse.resize(static_cast<size_t>(s.total_q()));
  reference::forward(s, opt, q.data(), k.data(), v.data(), p.out.data(), p.lse.data());
  return p;
}

// `pattern` lists the rows, '|'-separated, '1' = visible.
void expect_mask(int sq, int sk, int left, int right, const std::string& pattern) {
  SCOPED_TRACE("sq=" + std::to_string(sq) + " sk=" + std::to_string(sk) + " window=(" +
               std::to_string(left) + "," + std::to_string(right) + ") expected " + pattern);
  reference::Options opt;
  opt.window_left = left;
  opt.window_right = right;
  const Probe p = probe(sq, sk, opt);
  ASSERT_EQ(pattern.size(), static_cast<size_t>(sq * (sk + 1) - 1));
  for (int i = 0; i < sq; ++i) {
    int count = 0;
    for (int j = 0; j < sk; ++j) count += pattern[static_cast<size_t>(i * (sk + 1) + j)] == '1';
    for (int j = 0; j < sk; ++j) {
      const bool vis = pattern[static_cast<size_t>(i * (sk + 1) + j)] == '1';
      EXPECT_NEAR(p.out[static_cast<size_t>(i * sk + j)], vis ? 1.0 / count : 0.0, 1e-14)
          << "row " << i << " col " << j;
    }
    if (count == 0) {
      EXPECT_EQ(p.lse[static_cast<size_t>(i)], -kInf) << "row " << i;
    } else {
      EXPECT_NEAR(p.lse[static_cast<size_t>(i)], std::log(count), 1e-14) << "row " << i;
    }
  }
}

TEST(ReferenceMask, HandWrittenPatterns) {
  // No mask.
  expect_mask(2, 3, -1, -1, "111|111");
  // Causal, bottom-right aligned: query i sees j <= i + sk - sq.
  expect_mask(3, 5, -1, 0, "11100|11110|11111");
  expect_mask(5, 3, -1, 0, "000|000|100|110|111");
  expect_mask(3, 3, -1, 0, "100|110|111");
  // Sliding windows around the diagonal.
  expect_mask(4, 4, 1, 0, "1000|1100|0110|0011");
  expect_mask(4, 4, 0, 1, "1100|0110|0011|0001");
  expect_mask(3, 6, 1, 1, "001110|000111|000011");
  expect_mask(4, 2, 0, 0, "00|00|10|01");
  expect_mask(3, 5, 0, -1, "00111|00011|00001");
}

TEST(ReferenceForward, SingleKeyReturnsV) {
  // One key: P = 1 whatever the score, so out = v and lse = the score itself.
  const reference::Shape s = reference::Shape::dense(2, 3, 1, 2, 1, 5, 3);
  reference::Options opt;
  opt.scale = 0.7;
  opt.softcap = 2.0;
  opt.alibi = {0.1, 0.2, 0.3, 0.4};
  std::mt19937 gen(11);
  std::normal_distribution<double> n(0.0, 1.0);
  std::vector<double> q(static_cast<size_t>(s.total_q() * 2 * 5)),
      k(static_cast<size_t>(s.total_k() * 5)), v(static_cast<size_t>(s.total_k() * 3));
  for (auto* x : {&q, &k, &v})
    for (double& e : *x) e = n(gen);
  std::vector<double> out(static_cast<size_t>(s.total_q() * 2 * 3)),
      lse(static_cast<size_t>(2 * s.total_q()));
  reference::forward(s, opt, q.data(), k.data(), v.data(), out.data(), lse.data());
  for (int b = 0; b < 2; ++b) {
    for (int i = 0; i < 3; ++i) {
      for (int h = 0; h < 2; ++h) {
        const int64_t row = b * 3 + i;
        double dot = 0.0;
        for (int t = 0; t < 5; ++t)
          dot += q[static_cast<size_t>((row * 2 + h) * 5 + t)] * k[static_cast<size_t>(b * 5 + t)];
        const double rel = std::fabs(static_cast<double>(i + 1 - 3 - 0));
        const double score =
            2.0 * std::tanh(0.7 * dot / 2.0) - opt.alibi[static_cast<size_t>(b * 2 + h)] * rel;
        EXPECT_NEAR(lse[static_cast<size_t>(h * 6 + row)], score, 1e-12);
        for (int t = 0; t < 3; ++t) {
          EXPECT_NEAR(out[static_cast<size_t>((row * 2 + h) * 3 + t)],
                      v[static_cast<size_t>(b * 3 + t)], 1e-14);
        }
      }
    }
  }
}

TEST(ReferenceForward, AlibiClosedForm) {
  // q = 0: the score is the ALiBi bias alone, P_ij = exp(-slope |rel|) / sum.
  reference::Options opt;
  opt.alibi = {0.3};
  const int sq = 4, sk = 7;
  const Probe p = probe(sq, sk, opt);
  for (int i = 0; i < sq; ++i) {
    double sum = 0.0;
    for (int j = 0; j < sk; ++j) sum += std::exp(-0.3 * std::fabs(i + sk - sq - j));
    for (int j = 0; j < sk; ++j) {
      EXPECT_NEAR(p.out[static_cast<size_t>(i * sk + j)],
                  std::exp(-0.3 * std::fabs(i + sk - sq - j)) / sum, 1e-14);
    }
    EXPECT_NEAR(p.lse[static_cast<size_t>(i)], std::log(sum), 1e-13);
  }
}

TEST(ReferenceForward, SoftcapClosedForm) {
  // head_dim 1: s_j = scale * q * k_j, capped: c * tanh(s_j / c).
  const reference::Shape s = reference::Shape::dense(1, 1, 5, 1, 1, 1, 5);
  reference::Options opt;
  opt.scale = 1.5;
  opt.softcap = 0.8;
  const std::vector<double> q = {2.0}, k = {-1.0, 0.5, 1.0, 3.0, -0.2};
  std::vector<double> v(25, 0.0);
  for (int j = 0; j < 5; ++j) v[static_cast<size_t>(j * 5 + j)] = 1.0;
  std::vector<double> out(5), lse(1);
  reference::forward(s, opt, q.data(), k.data(), v.data(), out.data(), lse.data());
  double sum = 0.0;
  std::vector<double> e(5);
  for (int j = 0; j < 5; ++j)
    sum += e[static_cast<size_t>(j)] =
        std::exp(0.8 * std::tanh(1.5 * 2.0 * k[static_cast<size_t>(j)] / 0.8));
  for (int j = 0; j < 5; ++j)
    EXPECT_NEAR(out[static_cast<size_t>(j)], e[static_cast<size_t>(j)] / sum, 1e-14);
  EXPECT_NEAR(lse[0], std::log(sum), 1e-14);
}

TEST(ReferenceForward, DropoutUsesPhiloxMask) {
  reference::Options opt;
  opt.dropout_p = 0.25;
  opt.seed = 0x1234567890ull;
  opt.offset = 77;
  const int sq = 9, sk = 13, batch = 2;
  const Probe p = probe(sq, sk, opt, batch);
  const uint32_t threshold = dropout_threshold(0.25f);
  int kept = 0;
  for (int b = 0; b < batch; ++b) {
    for (int i = 0; i < sq; ++i) {
      for (int j = 0; j < sk; ++j) {
        const bool keep =
            dropout_keep(opt.seed, opt.offset, static_cast<uint32_t>(b), static_cast<uint32_t>(i),
                         static_cast<uint32_t>(j), threshold);
        kept += keep;
        EXPECT_NEAR(p.out[static_cast<size_t>((b * sq + i) * sk + j)],
                    keep ? 1.0 / (0.75 * sk) : 0.0, 1e-14);
      }
      // The LSE is that of the softmax before dropout.
      EXPECT_NEAR(p.lse[static_cast<size_t>(b * sq + i)], std::log(sk), 1e-14);
    }
  }
  EXPECT_GT(kept, 0);
  EXPECT_LT(kept, batch * sq * sk);
}

TEST(ReferenceForward, GqaHeadReadsItsGroupsKvHead) {
  // heads 4 over heads_k 2: head h must equal a 1-head problem on kv head h / 2.
  const int sq = 5, sk = 6, d = 3, dv = 2;
  const reference::Shape s = reference::Shape::dense(1, sq, sk, 4, 2, d, dv);
  reference::Options opt;
  opt.scale = 0.9;
  opt.window_left = 2;
  std::mt19937 gen(5);
  std::normal_distribution<double> n(0.0, 1.0);
  std::vector<double> q(static_cast<size_t>(sq * 4 * d)), k(static_cast<size_t>(sk * 2 * d)),
      v(static_cast<size_t>(sk * 2 * dv));
  for (auto* x : {&q, &k, &v})
    for (double& e : *x) e = n(gen);
  std::vector<double> out(static_cast<size_t>(sq * 4 * dv)), lse(static_cast<size_t>(4 * sq));
  reference::forward(s, opt, q.data(), k.data(), v.data(), out.data(), lse.data());
  const reference::Shape s1 = reference::Shape::dense(1, sq, sk, 1, 1, d, dv);
  for (int h = 0; h < 4; ++h) {
    std::vector<double> q1, k1, v1;
    for (int i = 0; i < sq; ++i)
      for (int t = 0; t < d; ++t) q1.push_back(q[static_cast<size_t>((i * 4 + h) * d + t)]);
    for (int j = 0; j < sk; ++j) {
      for (int t = 0; t < d; ++t) k1.push_back(k[static_cast<size_t>((j * 2 + h / 2) * d + t)]);
      for (int t = 0; t < dv; ++t) v1.push_back(v[static_cast<size_t>((j * 2 + h / 2) * dv + t)]);
    }
    std::vector<double> o1(static_cast<size_t>(sq * dv)), l1(static_cast<size_t>(sq));
    reference::forward(s1, opt, q1.data(), k1.data(), v1.data(), o1.data(), l1.data());
    for (int i = 0; i < sq; ++i) {
      EXPECT_DOUBLE_EQ(lse[static_cast<size_t>(h * sq + i)], l1[static_cast<size_t>(i)]);
      for (int t = 0; t < dv; ++t)
        EXPECT_DOUBLE_EQ(out[static_cast<size_t>((i * 4 + h) * dv + t)],
                         o1[static_cast<size_t>(i * dv + t)]);
    }
  }
}

// ---- the reference vs an independent second implementation --------------------------------

struct CrossCase {
  const char* name;
  ProblemSpec spec;
};

std::vector<CrossCase> cross_cases() {
  std::vector<CrossCase> cs;
  auto add = [&](const char* name, ProblemSpec s) { cs.push_back({name, s}); };
  ProblemSpec s = ProblemSpec::dense(DType::kFloat32, 2, 9, 13, 4, 2, 8, 8);
  add("plain", s);
  s.causal = true;
  add("causal_sq_lt_sk", s);
  s = ProblemSpec::dense(DType::kFloat32, 1, 13, 6, 4, 1, 8, 5);
  s.causal = true;
  s.softcap = 1.5;
  s.q_scale = 3.0;
  add("causal_sq_gt_sk_softcap_dv", s);
  s = ProblemSpec::dense(DType::kFloat32, 2, 11, 11, 2, 2, 6, 6);
  s.window_left = 3;
  s.window_right = 1;
  s.alibi = Alibi::kBatchHeads;
  add("window_alibi", s);
  s = ProblemSpec::dense(DType::kFloat32, 2, 7, 12, 8, 1, 4, 4);
  s.dropout_p = 0.3f;
  s.dropout_seed = 99;
  s.dropout_offset = 5;
  s.alibi = Alibi::kHeads;
  add("dropout_mqa_alibi", s);
  s = ProblemSpec{};
  s.dtype = DType::kFloat32;
  s.varlen = true;
  s.seqlens_q = {5, 0, 7, 3};
  s.seqlens_k = {8, 4, 0, 3};
  s.heads = 2;
  s.heads_k = 1;
  s.head_dim = 6;
  s.head_dim_v = 6;
  s.window_left = 2;
  s.window_right = 0;
  s.dropout_p = 0.2f;
  s.dropout_seed = 3;
  add("varlen_empty_seqs", s);
  // Learnable sinks: beside the scores (one head -inf), above them, with every modifier.
  s = ProblemSpec::dense(DType::kFloat32, 2, 9, 13, 4, 2, 8, 6);
  s.sink = Sink::kRandom;
  s.causal = true;
  add("sink_causal_dv", s);
  s = ProblemSpec::dense(DType::kFloat32, 1, 13, 6, 2, 1, 8, 8);
  s.sink = Sink::kLarge;
  s.causal = true;  // rows 0..6 see only the sink
  s.softcap = 1.5;
  s.q_scale = 3.0;
  add("sink_large_empty_rows_softcap", s);
  s = ProblemSpec::dense(DType::kFloat32, 2, 7, 12, 4, 1, 4, 4);
  s.sink = Sink::kRandom;
  s.dropout_p = 0.3f;
  s.dropout_seed = 17;
  s.alibi = Alibi::kBatchHeads;
  s.window_left = 4;
  s.window_right = 2;
  add("sink_dropout_alibi_window", s);
  return cs;
}

TEST(ReferenceCrossCheck, IndependentImplementationAgrees) {
  for (const CrossCase& c : cross_cases()) {
    SCOPED_TRACE(std::string(c.name) + ": " + c.spec.describe());
    const HostProblem p = make_host_problem(c.spec);
    const Results ref = run_reference(p, true);
    const Results alt = run_naive_lowp(p, DType::kFloat32, true, /*exact=*/true);
    const struct {
      const char* what;
      const std::vector<double>& a;
      const std::vector<double>& b;
    } pairs[] = {{"out", ref.out, alt.out},
                 {"lse", ref.lse, alt.lse},
                 {"dq", ref.dq, alt.dq},
                 {"dk", ref.dk, alt.dk},
                 {"dv", ref.dv, alt.dv},
                 {"dsink", ref.dsink, alt.dsink}};
    EXPECT_EQ(ref.dsink.size(), c.spec.sink == Sink::kNone ? 0u : size_t(c.spec.heads));
    for (const auto& pr : pairs) {
      ASSERT_EQ(pr.a.size(), pr.b.size()) << pr.what;
      const ErrorStats st = error_stats(pr.b, pr.a);
      EXPECT_EQ(st.nan_count, 0) << pr.what;
      EXPECT_LE(st.max_abs, 1e-11) << pr.what << " mean " << st.mean_abs;
    }
  }
}

TEST(ReferenceCrossCheck, LowPrecisionEmulationIsCloseButNotExact) {
  // The naive_lowp emulation must differ from the reference by a dtype-sized amount: not zero
  // (then the criterion would degenerate to atol) and not wildly off.
  ProblemSpec s = ProblemSpec::dense(DType::kBFloat16, 1, 33, 40, 2, 1, 16, 16);
  const HostProblem p = make_host_problem(s);
  const Results ref = run_reference(p, true);
  for (DType dt : {DType::kFloat16, DType::kBFloat16}) {
    const Results low = run_naive_lowp(p, dt, true);
    const double u = unit_roundoff(dt);
    const struct {
      const char* what;
      const std::vector<double>& lo;
      const std::vector<double>& ref;
    } pairs[] = {{"out", low.out, ref.out},
                 {"dq", low.dq, ref.dq},
                 {"dk", low.dk, ref.dk},
                 {"dv", low.dv, ref.dv}};
    for (const auto& pr : pairs) {
      const ErrorStats st = error_stats(pr.lo, pr.ref);
      double mx = 0.0;
      for (double x : pr.ref) mx = std::max(mx, std::fabs(x));
      EXPECT_GT(st.max_abs, 0.0) << pr.what << " " << dtype_name(dt);
      EXPECT_LT(st.max_abs, 64.0 * u * (mx + 1.0)) << pr.what << " " << dtype_name(dt);
    }
  }
}

// ---- finite differences ---------------------------------------------------------------------

// L(q, k, v) = sum(out * dout) in fp64.
double loss(const HostProblem& p, const std::vector<double>& q, const std::vector<double>& k,
            const std::vector<double>& v) {
  std::vector<double> out(p.dout.size()),
      lse(static_cast<size_t>(p.shape.heads * p.shape.total_q()));
  reference::forward(p.shape, p.opt, q.data(), k.data(), v.data(), out.data(), lse.data());
  double l = 0.0;
  for (size_t i = 0; i < out.size(); ++i) l += out[i] * p.dout[i];
  return l;
}

TEST(ReferenceGradient, MatchesCentralDifferences) {
  for (const CrossCase& c : cross_cases()) {
    SCOPED_TRACE(std::string(c.name) + ": " + c.spec.describe());
    const HostProblem p = make_host_problem(c.spec);
    const Results g = run_reference(p, true);
    std::vector<double> q = p.q, k = p.k, v = p.v;
    const double h = 1e-6;
    struct Target {
      const char* name;
      std::vector<double>* x;
      const std::vector<double>* grad;
    } targets[] = {{"dq", &q, &g.dq}, {"dk", &k, &g.dk}, {"dv", &v, &g.dv}};
    for (const Target& t : targets) {
      double gmax = 0.0;
      for (double x : *t.grad) gmax = std::max(gmax, std::fabs(x));
      ASSERT_GT(gmax, 0.0) << t.name << " is identically zero: the check would be vacuous";
      for (size_t e = 0; e < t.x->size(); ++e) {
        const double x0 = (*t.x)[e];
        (*t.x)[e] = x0 + h;
        const double lp = loss(p, q, k, v);
        (*t.x)[e] = x0 - h;
        const double lm = loss(p, q, k, v);
        (*t.x)[e] = x0;
        const double fd = (lp - lm) / (2.0 * h);
        ASSERT_NEAR(fd, (*t.grad)[e], 1e-7 * (1.0 + gmax)) << t.name << "[" << e << "]";
      }
    }
  }
}

// dsink[h] against central differences of L in the sink logits (the formula of
// docs/SEMANTICS.md, -sum_i P_sink,i * D_i, checked from its definition).
TEST(ReferenceGradient, SinkMatchesCentralDifferences) {
  for (const CrossCase& c : cross_cases()) {
    if (c.spec.sink == Sink::kNone) continue;
    SCOPED_TRACE(std::string(c.name) + ": " + c.spec.describe());
    HostProblem p = make_host_problem(c.spec);
    const Results g = run_reference(p, true);
    double gmax = 0.0;
    for (double x : g.dsink) gmax = std::max(gmax, std::fabs(x));
    ASSERT_GT(gmax, 0.0) << "dsink is identically zero: the check would be vacuous";
    const double h = 1e-6;
    for (size_t e = 0; e < p.opt.sink.size(); ++e) {
      const double x0 = p.opt.sink[e];
      if (x0 == -kInf) {
        EXPECT_EQ(g.dsink[e], 0.0) << "a sink of -inf has no gradient";
        continue;
      }
      p.opt.sink[e] = x0 + h;
      const double lp = loss(p, p.q, p.k, p.v);
      p.opt.sink[e] = x0 - h;
      const double lm = loss(p, p.q, p.k, p.v);
      p.opt.sink[e] = x0;
      EXPECT_NEAR((lp - lm) / (2.0 * h), g.dsink[e], 1e-7 * (1.0 + gmax)) << "dsink[" << e << "]";
    }
  }
}

// One visible key j and a sink: P_j = 1 / (1 + exp(sink - s_j)), out = P_j v_j; a row without a
// visible key sees only the sink: out = 0, LSE = sink, and its gradients are 0.
TEST(ReferenceForward, SinkClosedForm) {
  const reference::Shape s = reference::Shape::dense(1, 2, 1, 1, 1, 2, 3);
  reference::Options opt;
  opt.scale = 0.5;
  opt.window_left = -1, opt.window_right = 0;  // causal: row 0 sees nothing, row 1 sees key 0
  opt.sink = {0.75};
  const std::vector<double> q = {1.0, 2.0, -1.0, 0.5}, k = {0.3, -0.2}, v = {1.0, 2.0, 3.0};
  const std::vector<double> dout = {1.0, -1.0, 0.5, 2.0, 1.0, -3.0};
  std::vector<double> out(6), lse(2), dq(4), dk(2), dv(3), dsink(1);
  reference::forward(s, opt, q.data(), k.data(), v.data(), out.data(), lse.data());
  const double s1 = 0.5 * (-1.0 * 0.3 + 0.5 * -0.2);
  const double p1 = 1.0 / (1.0 + std::exp(0.75 - s1));
  EXPECT_EQ(lse[0], 0.75);
  EXPECT_NEAR(lse[1], std::log(std::exp(s1) + std::exp(0.75)), 1e-15);
  for (int t = 0; t < 3; ++t) {
    EXPECT_EQ(out[static_cast<size_t>(t)], 0.0);
    EXPECT_NEAR(out[static_cast<size_t>(3 + t)], p1 * v[static_cast<size_t>(t)], 1e-15);
  }
  reference::backward(s, opt, q.data(), k.data(), v.data(), dout.data(), dq.data(), dk.data(),
                      dv.data(), dsink.data());
  EXPECT_EQ(dq[0], 0.0);
  EXPECT_EQ(dq[1], 0.0);
  // D_1 = dout_1 . out_1 = p1 (v . dout_1); dsink = -(1 - p1) D_1 (row 0: D = 0).
  const double d1 = p1 * (2.0 * 1.0 + 1.0 * 2.0 - 3.0 * 3.0);
  EXPECT_NEAR(dsink[0], -(1.0 - p1) * d1, 1e-15);
}

TEST(ReferenceGradient, EmptyRowsHaveZeroGradientsAndNoNaN) {
  ProblemSpec s = ProblemSpec::dense(DType::kFloat32, 1, 6, 3, 1, 1, 4, 4);
  s.causal = true;  // rows 0..2 see nothing
  const HostProblem p = make_host_problem(s);
  const Results r = run_reference(p, true);
  for (int i = 0; i < 6; ++i) {
    if (i < 3) {
      EXPECT_EQ(r.lse[static_cast<size_t>(i)], -kInf);
    } else {
      EXPECT_TRUE(std::isfinite(r.lse[static_cast<size_t>(i)]));
    }
    for (int t = 0; t < 4; ++t) {
      if (i < 3) {
        EXPECT_EQ(r.out[static_cast<size_t>(i * 4 + t)], 0.0);
        EXPECT_EQ(r.dq[static_cast<size_t>(i * 4 + t)], 0.0);
      }
    }
  }
  for (const auto* x : {&r.out, &r.dq, &r.dk, &r.dv}) {
    for (double e : *x) EXPECT_FALSE(std::isnan(e));
  }
}

// ---- the test utilities themselves ---------------------------------------------------------

TEST(TestUtil, HalfAndBfloat16Rounding) {
  EXPECT_EQ(float_to_half_bits(1.0f), 0x3C00u);
  EXPECT_EQ(float_to_half_bits(-2.0f), 0xC000u);
  EXPECT_EQ(float_to_half_bits(65504.0f), 0x7BFFu);  // largest half
  EXPECT_EQ(float_to_half_bits(65519.0f), 0x7BFFu);  // below the midpoint to 2^16
  EXPECT_EQ(float_to_half_bits(65520.0f), 0x7C00u);  // the midpoint rounds to inf (even)
  EXPECT_EQ(float_to_half_bits(std::ldexp(1.0f, -24)), 0x0001u);         // smallest subnormal
  EXPECT_EQ(float_to_half_bits(std::ldexp(1.0f, -25)), 0x0000u);         // tie to even: 0
  EXPECT_EQ(float_to_half_bits(std::ldexp(3.0f, -25)), 0x0002u);         // tie to even: 2
  EXPECT_EQ(float_to_half_bits(1.0f + std::ldexp(1.0f, -11)), 0x3C00u);  // tie to even
  EXPECT_EQ(float_to_half_bits(1.0f + std::ldexp(3.0f, -11)), 0x3C02u);  // tie to even
  EXPECT_EQ(half_bits_to_float(0x3555u), 0.333251953125f);
  EXPECT_EQ(half_bits_to_float(0x0200u), std::ldexp(1.0f, -15));  // subnormal
  EXPECT_TRUE(std::isnan(half_bits_to_float(float_to_half_bits(std::nanf("")))));
  EXPECT_EQ(float_to_bf16_bits(1.0f), 0x3F80u);
  EXPECT_EQ(float_to_bf16_bits(1.0f + std::ldexp(1.0f, -8)), 0x3F80u);  // tie to even
  EXPECT_EQ(float_to_bf16_bits(1.0f + std::ldexp(3.0f, -8)), 0x3F82u);  // tie to even
  EXPECT_EQ(bf16_bits_to_float(0xC040u), -3.0f);
  EXPECT_TRUE(std::isnan(bf16_bits_to_float(float_to_bf16_bits(std::nanf("")))));
  // Every half round-trips exactly.
  for (uint32_t h = 0; h < 0x7C00u; ++h) {
    ASSERT_EQ(float_to_half_bits(half_bits_to_float(static_cast<uint16_t>(h))), h);
  }
  EXPECT_EQ(round_to(DType::kBFloat16, 1.00390625), 1.0);
  EXPECT_EQ(round_to(DType::kFloat16, 0.1), 0.0999755859375);
}

TEST(TestUtil, StridedViewsAndGuardedPadding) {
  // A padded (b, s, h, d) view is not contiguous, and its padding is watched.
  View v = alloc_view(Backend::kCpu, DType::kFloat32, Layout::kPadded, {2, 3, 4, 5});
  EXPECT_EQ(v.strides[3], 1);
  EXPECT_EQ(v.strides[2], 5 + 8);
  EXPECT_EQ(v.strides[1], 4 * 13 + 8);
  EXPECT_EQ(v.strides[0], 3 * 60 + 8);
  std::vector<double> x(static_cast<size_t>(v.numel()));
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<double>(i);
  v.write(x);
  EXPECT_EQ(v.read(), x);
  v.arena->upload();
  EXPECT_TRUE(v.arena->padding_untouched("v"));
  // Write one padding element behind the arena's back: detected.
  float* base = static_cast<float*>(v.arena->device_data());
  base[v.offset + 5] = 1.0f;  // between head 0 and head 1 of row 0
  v.arena->download();
  EXPECT_FALSE(v.arena->padding_untouched("v"));

  // Head-major: memory order (b, h, s, d).
  View hm = alloc_view(Backend::kCpu, DType::kFloat16, Layout::kHeadMajor, {2, 3, 4, 5});
  EXPECT_EQ(hm.strides[1], 5);
  EXPECT_EQ(hm.strides[2], 15);
  EXPECT_EQ(hm.strides[0], 60);
  // Packed: q, k, v are slices of one (b, s, h + 2 hk, d) buffer.
  std::vector<View> qkv = alloc_packed(Backend::kCpu, DType::kBFloat16, {2, 3}, {4, 2, 2}, 8);
  EXPECT_EQ(qkv[0].arena, qkv[2].arena);
  EXPECT_EQ(qkv[1].offset, 4 * 8);
  EXPECT_EQ(qkv[2].offset, 6 * 8);
  EXPECT_EQ(qkv[2].strides[1], 8 * 8);
  EXPECT_EQ(qkv[2].tensor().shape[2], 2);
}

TEST(TestUtil, CriterionRejectsNaNAndMismatchedInfinities) {
  const std::vector<double> ref = {1.0, -kInf, 0.5};
  EXPECT_TRUE(meets_criterion("x", DType::kFloat32, {1.0, -kInf, 0.5}, ref, {}));
  EXPECT_FALSE(meets_criterion("x", DType::kFloat32, {1.0, -kInf, std::nan("")}, ref, {}));
  EXPECT_FALSE(meets_criterion("x", DType::kFloat32, {1.0, -1e30, 0.5}, ref, {}));
  EXPECT_FALSE(meets_criterion("x", DType::kFloat32, {1.001, -kInf, 0.5}, ref, {}));
  // Low precision: twice the naive error plus atol (2 * 2^-11 * (1 + 0.3) for float16).
  const std::vector<double> lowp = {1.001, -kInf, 0.5};
  EXPECT_TRUE(meets_criterion("x", DType::kFloat16, {1.0025, -kInf, 0.5}, ref, lowp));
  EXPECT_FALSE(meets_criterion("x", DType::kFloat16, {1.0035, -kInf, 0.5}, ref, lowp));
}

}  // namespace
}  // namespace flashattn::test
