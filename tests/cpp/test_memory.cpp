// O(N) memory: a CPU forward at N = 32768 must not materialise the N x N score matrix (4 GiB in
// float32). Measured as the growth of the peak resident set size (getrusage ru_maxrss) across
// the call, in a process of its own (ctest label "memory").
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "flashattn/flashattn.h"

namespace {

int64_t peak_rss_bytes() {
  rusage u{};
  EXPECT_EQ(getrusage(RUSAGE_SELF, &u), 0);
  return static_cast<int64_t>(u.ru_maxrss) * 1024;  // Linux reports KiB
}

TEST(Memory, CpuForwardAtSeqlen32kIsLinearInMemory) {
  constexpr int64_t N = 32768, D = 64;
  constexpr int64_t kLimit = 256ll << 20;  // far below N * N * 4 = 4 GiB
  using flashattn::DType;
  // Inputs and outputs are allocated and touched before the baseline is taken.
  std::vector<float> q(N * D), k(N * D), v(N * D), out(N * D, 0.0f), lse(N, 0.0f);
  std::mt19937 gen(3);
  std::normal_distribution<float> n(0.0f, 1.0f);
  for (auto* x : {&q, &k, &v}) {
    for (float& e : *x) e = n(gen);
  }
  const flashattn::Device cpu{};
  flashattn::ForwardArgs a;
  a.q = flashattn::make_contiguous_view(q.data(), DType::kFloat32, cpu, {1, N, 1, D});
  a.k = flashattn::make_contiguous_view(k.data(), DType::kFloat32, cpu, {1, N, 1, D});
  a.v = flashattn::make_contiguous_view(v.data(), DType::kFloat32, cpu, {1, N, 1, D});
  a.out = flashattn::make_contiguous_view(out.data(), DType::kFloat32, cpu, {1, N, 1, D});
  a.lse = flashattn::make_contiguous_view(lse.data(), DType::kFloat32, cpu, {1, 1, N});

  const int64_t before = peak_rss_bytes();
  const flashattn::Status s = flashattn::forward(a);
  const int64_t after = peak_rss_bytes();
  ASSERT_TRUE(s.ok()) << s.message();
  const int64_t growth = after - before;
  RecordProperty("peak_rss_growth_bytes", std::to_string(growth));
  EXPECT_LT(growth, kLimit) << "peak RSS grew by " << (growth >> 20) << " MiB during the forward";

  // The result must also be right: a few rows against a direct fp64 computation.
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  for (int64_t i : {int64_t{0}, N / 3, N - 1}) {
    std::vector<double> p(N);
    double m = -INFINITY, sum = 0.0;
    for (int64_t j = 0; j < N; ++j) {
      double dot = 0.0;
      for (int64_t t = 0; t < D; ++t) dot += static_cast<double>(q[i * D + t]) * k[j * D + t];
      p[j] = scale * dot;
      m = std::max(m, p[j]);
    }
    for (int64_t j = 0; j < N; ++j) sum += p[j] = std::exp(p[j] - m);
    EXPECT_NEAR(lse[i], m + std::log(sum), 1e-4) << "row " << i;
    for (int64_t t = 0; t < D; ++t) {
      double o = 0.0;
      for (int64_t j = 0; j < N; ++j) o += p[j] / sum * v[j * D + t];
      EXPECT_NEAR(out[i * D + t], o, 1e-4) << "row " << i << " col " << t;
    }
  }
}

}  // namespace
