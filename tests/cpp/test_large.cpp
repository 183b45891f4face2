// CUDA at sizes the correctness matrix cannot afford (skipped, and reported as skipped, without
// a GPU):
//   - K/V tensors of more than 2^31 elements, which only work with 64-bit offsets;
//   - a 100k-token causal sequence, forward and backward.
// The float64 check covers a few rows (each row of O, LSE and dQ depends on its own query
// only), chosen at the start, middle and end where wrong offsets would show. Inputs come from a
// counter-based hash, so they are the same on every run and cheap to make.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "flashattn/flashattn.h"
#include "test_util.h"

namespace flashattn::test {
namespace {

// splitmix64 of the element index -> a bf16 value in [-1, 1).
uint16_t hashed_bf16(uint64_t index, uint64_t salt) {
  uint64_t z = index * 0x9E3779B97F4A7C15ull + salt;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  const float u = static_cast<float>(z >> 40) * (1.0f / 16777216.0f);  // [0, 1)
  return float_to_bf16_bits(2.0f * u - 1.0f);
}

std::vector<uint16_t> hashed_tensor(size_t numel, uint64_t salt) {
  std::vector<uint16_t> v(numel);
  for (size_t i = 0; i < numel; ++i) v[i] = hashed_bf16(i, salt);
  return v;
}

double val(const std::vector<uint16_t>& t, size_t i) { return bf16_bits_to_float(t[i]); }

// Float64 forward of one query row of one head against keys [0, visible) in the dense layout
// (1, seqlen, heads, d): fills out_row (d values) and returns the LSE.
struct RowResult {
  std::vector<double> out;
  std::vector<double> p;  // normalised probabilities over the visible keys
  double lse = 0.0;
  double out_l1 = 0.0;    // max over columns of sum_j p_j |v_jc|: scale of the rounding error
};

RowResult reference_row(const std::vector<uint16_t>& q, const std::vector<uint16_t>& k,
                        const std::vector<uint16_t>& v, int64_t row, int head, int head_k, int heads,
                        int heads_k, int d, int64_t visible, double scale) {
  RowResult r;
  std::vector<double> s(visible);
  double mx = -INFINITY;
  const size_t q_off = (static_cast<size_t>(row) * heads + head) * d;
  for (int64_t j = 0; j < visible; ++j) {
    const size_t k_off = (static_cast<size_t>(j) * heads_k + head_k) * d;
    double acc = 0.0;
    for (int c = 0; c < d; ++c) acc += val(q, q_off + c) * val(k, k_off + c);
    s[j] = acc * scale;
    mx = std::max(mx, s[j]);
  }
  double sum = 0.0;
  for (int64_t j = 0; j < visible; ++j) sum += (s[j] = std::exp(s[j] - mx));
  r.lse = mx + std::log(sum);
  r.p.resize(visible);
  r.out.assign(d, 0.0);
  std::vector<double> l1(d, 0.0);
  for (int64_t j = 0; j < visible; ++j) {
    r.p[j] = s[j] / sum;
    const size_t v_off = (static_cast<size_t>(j) * heads_k + head_k) * d;
    for (int c = 0; c < d; ++c) {
      r.out[c] += r.p[j] * val(v, v_off + c);
      l1[c] += r.p[j] * std::fabs(val(v, v_off + c));
    }
  }
  r.out_l1 = *std::max_element(l1.begin(), l1.end());
  return r;
}

// bf16 rounds P before P.V (and dS before dS.K): each term is off by at most 2^-8 relative,
// so 2^-6 of the L1 scale leaves a 4x margin for the f32 accumulation and the stored output.
constexpr double kBf16TermError = 1.0 / 64.0;

TEST(LargeCuda, KeysAndValuesOver2Pow31ElementsUse64BitOffsets) {
  FLASHATTN_SKIP_IF_UNAVAILABLE(Backend::kCuda);
  const int heads = 16, d = 128, seqlen_q = 64;
  const int64_t seqlen_k = (int64_t(1) << 20) + 4096;  // K and V: 2^31 + 2^23 elements each
  const size_t kv_numel = static_cast<size_t>(seqlen_k) * heads * d;
  ASSERT_GT(kv_numel, size_t(1) << 31);
  const auto q = hashed_tensor(static_cast<size_t>(seqlen_q) * heads * d, 1);
  const auto k = hashed_tensor(kv_numel, 2);
  const auto v = hashed_tensor(kv_numel, 3);

  DeviceBuffer dq(Backend::kCuda, q.size() * 2), dk(Backend::kCuda, kv_numel * 2),
      dv(Backend::kCuda, kv_numel * 2), dout(Backend::kCuda, q.size() * 2),
      dlse(Backend::kCuda, sizeof(float) * heads * seqlen_q);
  dq.upload(q.data());
  dk.upload(k.data());
  dv.upload(v.data());
  const Device dev = device_of(Backend::kCuda);
  ForwardArgs a;
  a.q = make_contiguous_view(dq.data(), DType::kBFloat16, dev, {1, seqlen_q, heads, d});
  a.k = make_contiguous_view(dk.data(), DType::kBFloat16, dev, {1, seqlen_k, heads, d});
  a.v = make_contiguous_view(dv.data(), DType::kBFloat16, dev, {1, seqlen_k, heads, d});
  a.out = make_contiguous_view(dout.data(), DType::kBFloat16, dev, {1, seqlen_q, heads, d});
  a.lse = make_contiguous_view(dlse.data(), DType::kFloat32, dev, {1, heads, seqlen_q});
  const Status st = forward(a);
  ASSERT_TRUE(st.ok()) << st.message();
  std::vector<uint16_t> out(q.size());
  std::vector<float> lse(static_cast<size_t>(heads) * seqlen_q);
  dout.download(out.data());
  dlse.download(lse.data());

  const double scale = 1.0 / std::sqrt(double(d));
  for (int head : {0, heads - 1}) {
    for (int64_t row : {int64_t(0), int64_t(seqlen_q - 1)}) {
      const RowResult ref = reference_row(q, k, v, row, head, head, heads, heads, d, seqlen_k, scale);
      const double tol = kBf16TermError * ref.out_l1 + 1e-5;
      for (int c = 0; c < d; ++c) {
        const double got = bf16_bits_to_float(out[(static_cast<size_t>(row) * heads + head) * d + c]);
        ASSERT_NEAR(got, ref.out[c], tol) << "head " << head << " row " << row << " column " << c;
      }
      EXPECT_NEAR(lse[static_cast<size_t>(head) * seqlen_q + row], ref.lse, 1e-3 * std::fabs(ref.lse))
          << "head " << head << " row " << row;
    }
  }
}

TEST(LargeCuda, CausalSequenceOf100kTokensForwardAndDq) {
  FLASHATTN_SKIP_IF_UNAVAILABLE(Backend::kCuda);
  const int heads = 2, heads_k = 1, d = 64;
  const int64_t n = 100003;  // not a multiple of any tile
  const size_t q_numel = static_cast<size_t>(n) * heads * d;
  const size_t k_numel = static_cast<size_t>(n) * heads_k * d;
  const auto q = hashed_tensor(q_numel, 11);
  const auto k = hashed_tensor(k_numel, 12);
  const auto v = hashed_tensor(k_numel, 13);
  const auto g = hashed_tensor(q_numel, 14);  // dout

  const Backend be = Backend::kCuda;
  DeviceBuffer bq(be, q_numel * 2), bk(be, k_numel * 2), bv(be, k_numel * 2), bo(be, q_numel * 2),
      bg(be, q_numel * 2), bl(be, sizeof(float) * heads * n), bdq(be, q_numel * 2), bdk(be, k_numel * 2),
      bdv(be, k_numel * 2);
  bq.upload(q.data());
  bk.upload(k.data());
  bv.upload(v.data());
  bg.upload(g.data());
  const Device dev = device_of(be);
  const DType bf = DType::kBFloat16;
  ForwardArgs f;
  f.q = make_contiguous_view(bq.data(), bf, dev, {1, n, heads, d});
  f.k = make_contiguous_view(bk.data(), bf, dev, {1, n, heads_k, d});
  f.v = make_contiguous_view(bv.data(), bf, dev, {1, n, heads_k, d});
  f.out = make_contiguous_view(bo.data(), bf, dev, {1, n, heads, d});
  f.lse = make_contiguous_view(bl.data(), DType::kFloat32, dev, {1, heads, n});
  f.causal = true;
  Status st = forward(f);
  ASSERT_TRUE(st.ok()) << st.message();
  BackwardArgs b;
  static_cast<AttentionOptions&>(b) = static_cast<const AttentionOptions&>(f);
  b.q = f.q, b.k = f.k, b.v = f.v, b.out = f.out, b.lse = f.lse;
  b.dout = make_contiguous_view(bg.data(), bf, dev, {1, n, heads, d});
  b.dq = make_contiguous_view(bdq.data(), bf, dev, {1, n, heads, d});
  b.dk = make_contiguous_view(bdk.data(), bf, dev, {1, n, heads_k, d});
  b.dv = make_contiguous_view(bdv.data(), bf, dev, {1, n, heads_k, d});
  st = backward(b);
  ASSERT_TRUE(st.ok()) << st.message();

  std::vector<uint16_t> out(q_numel), dq(q_numel);
  std::vector<float> lse(static_cast<size_t>(heads) * n);
  bo.download(out.data());
  bl.download(lse.data());
  bdq.download(dq.data());
  for (uint16_t x : dq) ASSERT_FALSE(std::isnan(bf16_bits_to_float(x))) << "NaN in dq";

  const double scale = 1.0 / std::sqrt(double(d));
  const int head = heads - 1;
  for (int64_t row : {int64_t(0), int64_t(50000), n - 1}) {
    const int64_t visible = row + 1;  // causal, seqlen_q == seqlen_k
    const RowResult ref = reference_row(q, k, v, row, head, 0, heads, heads_k, d, visible, scale);
    const size_t off = (static_cast<size_t>(row) * heads + head) * d;
    const double tol = kBf16TermError * ref.out_l1 + 1e-5;
    for (int c = 0; c < d; ++c) {
      ASSERT_NEAR(bf16_bits_to_float(out[off + c]), ref.out[c], tol) << "row " << row << " column " << c;
    }
    EXPECT_NEAR(lse[static_cast<size_t>(head) * n + row], ref.lse, 1e-3 * std::max(1.0, std::fabs(ref.lse)));

    // dQ_i = scale * sum_j P_ij (dP_ij - D_i) k_j with dP_ij = dO_i . v_j and D_i = dO_i . O_i.
    double d_i = 0.0;
    for (int c = 0; c < d; ++c) d_i += val(g, off + c) * ref.out[c];
    std::vector<double> dq_ref(d, 0.0), dq_l1(d, 0.0);
    for (int64_t j = 0; j < visible; ++j) {
      const size_t kv = static_cast<size_t>(j) * heads_k * d;
      double dp = 0.0;
      for (int c = 0; c < d; ++c) dp += val(g, off + c) * val(v, kv + c);
      const double ds = ref.p[j] * (dp - d_i);
      for (int c = 0; c < d; ++c) {
        dq_ref[c] += scale * ds * val(k, kv + c);
        dq_l1[c] += scale * std::fabs(ds * val(k, kv + c));
      }
    }
    const double dq_tol = kBf16TermError * *std::max_element(dq_l1.begin(), dq_l1.end()) + 1e-5;
    for (int c = 0; c < d; ++c) {
      ASSERT_NEAR(bf16_bits_to_float(dq[off + c]), dq_ref[c], dq_tol) << "dq row " << row << " column " << c;
    }
  }
}

}  // namespace
}  // namespace flashattn::test
