// Consumer of an installed flashattn: one small CPU forward, checked against a direct
// computation. Exit status 0 on success.
#include <flashattn/c_api.h>
#include <flashattn/flashattn.h>

#include <cmath>
#include <cstdio>
#include <vector>

int main() {
  // batch 1, seqlen_q 2, seqlen_k 3, one head, head_dim 2; float32, contiguous.
  constexpr int kSq = 2, kSk = 3, kD = 2;
  std::vector<float> q = {0.5f, -1.0f, 1.5f, 0.25f};
  std::vector<float> k = {1.0f, 0.0f, -0.5f, 2.0f, 0.75f, -1.25f};
  std::vector<float> v = {1.0f, 2.0f, -3.0f, 0.5f, 0.0f, 4.0f};
  std::vector<float> out(kSq * kD, -1.0f), lse(kSq, 0.0f);

  using flashattn::DType;
  const flashattn::Device cpu{};
  flashattn::ForwardArgs a;
  a.q = flashattn::make_contiguous_view(q.data(), DType::kFloat32, cpu, {1, kSq, 1, kD});
  a.k = flashattn::make_contiguous_view(k.data(), DType::kFloat32, cpu, {1, kSk, 1, kD});
  a.v = flashattn::make_contiguous_view(v.data(), DType::kFloat32, cpu, {1, kSk, 1, kD});
  a.out = flashattn::make_contiguous_view(out.data(), DType::kFloat32, cpu, {1, kSq, 1, kD});
  a.lse = flashattn::make_contiguous_view(lse.data(), DType::kFloat32, cpu, {1, 1, kSq});
  a.num_threads = 1;
  if (const flashattn::Status s = flashattn::forward(a); !s.ok()) {
    std::fprintf(stderr, "flashattn::forward failed: %s\n", s.message().c_str());
    return 1;
  }

  const double scale = 1.0 / std::sqrt(static_cast<double>(kD));
  double max_err = 0.0;
  bool ok = true;  // also false on NaN, which std::fmax would hide
  auto check = [&](double ours, double expected) {
    const double err = std::fabs(ours - expected);
    if (!(err < 1e-5)) ok = false;
    max_err = std::fmax(max_err, err);
  };
  for (int i = 0; i < kSq; ++i) {
    double s[kSk], m = -1e300, sum = 0.0;
    for (int j = 0; j < kSk; ++j) {
      s[j] = scale * (q[i * kD] * k[j * kD] + q[i * kD + 1] * k[j * kD + 1]);
      m = s[j] > m ? s[j] : m;
    }
    for (int j = 0; j < kSk; ++j) sum += std::exp(s[j] - m);
    for (int t = 0; t < kD; ++t) {
      double o = 0.0;
      for (int j = 0; j < kSk; ++j) o += std::exp(s[j] - m) / sum * v[j * kD + t];
      check(out[i * kD + t], o);
    }
    check(lse[i], m + std::log(sum));
  }
  std::printf("flashattn %s (C ABI reports %s): max error %.3g\n", flashattn::version(),
              flashattn_version(), max_err);
  return ok ? 0 : 1;
}
