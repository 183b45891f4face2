// FP8 (float8_e4m3) on the CPU backend (issue 21, docs/SEMANTICS.md "FP8" and "FP8 KV cache"):
// the e4m3 codec checked exhaustively against one written here, the FP8 forward against the
// naive FP8 computation of reference/ (tight: bf16 output rounding plus the probabilities whose
// e4m3 rounding a float32 logit may legitimately flip) and against float64 attention on the
// unquantized inputs (loose; RMSE reported next to bfloat16's), descale broadcasting, the FP8
// KV cache (dense, paged, append), every error path, the C ABI, and on CUDA: the FP8 forward (the
// Hopper kernels) against the naive FP8 computation and the CPU backend, what it declines, and the
// e4m3 cache read by 16-bit queries against the CPU backend and the reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#if defined(FLASHATTN_WITH_CUDA)
#include <cuda_runtime.h>
#endif

#include "cpu/convert.h"
#include "flashattn/c_api.h"
#include "flashattn/flashattn.h"
#include "reference/reference.h"
#include "test_util.h"

namespace flashattn::test {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
const Device kCpu{DeviceType::kCPU, 0};

// ---- the test's own e4m3 codec ----------------------------------------------------------------

// Decoded from the definition (sign, exponent bias 7, 3 mantissa bits, subnormals, NaN at
// S.1111.111), with pow instead of bit moves.
double ref_decode(uint8_t c) {
  const int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
  if (e == 15 && m == 7) return kNaN;
  const double mag = e == 0 ? m * std::pow(2.0, -9) : (1.0 + m / 8.0) * std::pow(2.0, e - 7);
  return s ? -mag : mag;
}

// The 127 non-negative finite values in increasing order (code i has value kPositive[i]).
const std::vector<double>& positive_values() {
  static const std::vector<double> v = [] {
    std::vector<double> r;
    for (int c = 0; c < 0x7f; ++c) r.push_back(ref_decode(static_cast<uint8_t>(c)));
    return r;
  }();
  return v;
}

// Nearest code by binary search over the value table: ties to the even code, |x| >= 448
// saturates, NaN gives 0x7f (sign kept).
uint8_t ref_encode(double x) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  if (std::isnan(x)) return sign | 0x7f;
  const double a = std::fabs(x);
  const auto& v = positive_values();
  if (a >= v.back()) return sign | 0x7e;
  const size_t hi = static_cast<size_t>(std::upper_bound(v.begin(), v.end(), a) - v.begin());
  const size_t lo = hi - 1;  // v[lo] <= a < v[hi]
  const double dlo = a - v[lo], dhi = v[hi] - a;
  size_t pick = dlo < dhi ? lo : hi;
  if (dlo == dhi) pick = (lo % 2 == 0) ? lo : hi;
  return static_cast<uint8_t>(sign | pick);
}

TEST(Fp8Codec, DecodesEveryCodeExactly) {
  for (int c = 0; c < 256; ++c) {
    const double want = ref_decode(static_cast<uint8_t>(c));
    const float got = cpu::kE4M3ToFloat[static_cast<size_t>(c)];
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << "code " << c;
    } else {
      EXPECT_EQ(static_cast<double>(got), want) << "code " << c;
      EXPECT_EQ(std::signbit(got), std::signbit(want)) << "code " << c;
      EXPECT_EQ(cpu::e4m3_to_float(static_cast<uint8_t>(c)), got) << "code " << c;
    }
  }
  EXPECT_EQ(cpu::kE4M3ToFloat[0x7e], 448.0f);
  EXPECT_EQ(cpu::kE4M3ToFloat[0x01], 0x1p-9f);
}

TEST(Fp8Codec, RoundTripsEveryFiniteCode) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7f) == 0x7f) continue;
    const float f = cpu::kE4M3ToFloat[static_cast<size_t>(c)];
    EXPECT_EQ(cpu::float_to_e4m3(f), c) << "code " << c;
    EXPECT_EQ(reference::round_e4m3(f), static_cast<double>(f)) << "code " << c;
  }
}

// Every 251st float32 bit pattern (17 million, both signs, all exponents, infinities and NaN):
// the backend's encoder and the reference's round_e4m3 against the binary search above.
TEST(Fp8Codec, EncodesAFloat32SweepLikeTheTestEncoder) {
  int64_t checked = 0;
  for (uint64_t bits = 0; bits <= 0xffffffffull; bits += 251) {
    const uint32_t u = static_cast<uint32_t>(bits);
    float f;
    std::memcpy(&f, &u, sizeof f);
    const uint8_t want = ref_encode(f);
    const uint8_t got = cpu::float_to_e4m3(f);
    if (std::isnan(f)) {
      ASSERT_EQ(got & 0x7f, 0x7f) << "NaN bits " << u;
      ASSERT_TRUE(std::isnan(reference::round_e4m3(f)));
      continue;
    }
    ASSERT_EQ(got, want) << "f = " << f << " (bits " << u << ")";
    ASSERT_EQ(reference::round_e4m3(f), ref_decode(want)) << "f = " << f;
    ++checked;
  }
  EXPECT_GT(checked, 16000000);
}

// float_to_half shares its rounding with float_to_e4m3 (cpu::narrow_magnitude): the same sweep
// against test_util's own float16 encoder.
TEST(Fp8Codec, SharedNarrowingKeepsFloat16Exact) {
  for (uint64_t bits = 0; bits <= 0xffffffffull; bits += 251) {
    const uint32_t u = static_cast<uint32_t>(bits);
    float f;
    std::memcpy(&f, &u, sizeof f);
    if (std::isnan(f)) continue;
    ASSERT_EQ(cpu::float_to_half(f), float_to_half_bits(f)) << "f = " << f;
  }
}

TEST(Fp8Codec, MidpointsTiesAndSaturation) {
  const auto& v = positive_values();
  for (size_t i = 0; i + 1 < v.size(); ++i) {
    const double mid = 0.5 * (v[i] + v[i + 1]);  // exact in float32
    const uint8_t even = static_cast<uint8_t>(i % 2 == 0 ? i : i + 1);
    EXPECT_EQ(cpu::float_to_e4m3(static_cast<float>(mid)), even) << "midpoint " << mid;
    EXPECT_EQ(cpu::float_to_e4m3(static_cast<float>(-mid)), 0x80 | even) << "midpoint " << -mid;
    EXPECT_EQ(cpu::float_to_e4m3(std::nextafter(static_cast<float>(mid), 0.0f)), i);
    EXPECT_EQ(cpu::float_to_e4m3(std::nextafter(static_cast<float>(mid), 1e9f)), i + 1);
  }
  // satfinite: past 448 (also where round-to-nearest would give 480, the NaN code) and inf.
  for (float big : {448.0f, 449.0f, 464.0f, 479.9f, 480.0f, 1e30f,
                    std::numeric_limits<float>::infinity()}) {
    EXPECT_EQ(cpu::float_to_e4m3(big), 0x7e) << big;
    EXPECT_EQ(cpu::float_to_e4m3(-big), 0xfe) << -big;
    EXPECT_EQ(reference::round_e4m3(big), 448.0);
  }
  EXPECT_EQ(cpu::float_to_e4m3(0x1p-10f), 0x00);        // half the smallest subnormal: to even
  EXPECT_EQ(cpu::float_to_e4m3(0x1.8p-10f), 0x01);      // 0.75 of it: up
  EXPECT_EQ(cpu::float_to_e4m3(0x1.8p-9f), 0x02);       // 1.5 subnormals: tie to even 2
  EXPECT_EQ(cpu::float_to_e4m3(0x1.fp-7f), 0x08);       // just below 2^-6: the smallest normal
  EXPECT_EQ(cpu::float_to_e4m3(-0.0f), 0x80);
  EXPECT_EQ(cpu::float_to_e4m3(std::numeric_limits<float>::quiet_NaN()) & 0x7f, 0x7f);
}

// ---- FP8 forward problems -----------------------------------------------------------------------

enum class DescaleMode { kNone, kScalar, kPerHead };

struct Fp8Spec {
  std::string name;
  int batch = 2, seqlen_q = 37, seqlen_k = 83, heads = 4, heads_k = 2, d = 64, dv = 64;
  bool causal = false;
  int window_left = -1, window_right = -1;
  float softcap = 0.0f;
  bool sink = false;
  bool alibi = false;
  std::vector<int> varlen_q, varlen_k;  // per-sequence lengths: a varlen call
  DescaleMode descale = DescaleMode::kPerHead;
  bool outliers = false;  // FlashAttention-3's test: N(0,1) + N(0,100) on 0.1% of entries
  uint32_t seed = 7;
};

struct Fp8Problem {
  reference::Shape shape;
  int64_t sq_dense = 0, sk_dense = 0;
  bool varlen = false;
  // Unquantized inputs and their e4m3 codes, (total, heads, dim); descales (batch, heads_k).
  std::vector<double> q, k, v;
  std::vector<uint8_t> q8, k8, v8;
  std::vector<float> qd, kd, vd;
  std::vector<int32_t> cu_q, cu_k;
  std::vector<float> sink, alibi;
};

std::vector<double> normals(size_t n, std::mt19937& rng, bool outliers) {
  std::normal_distribution<double> g(0.0, 1.0);
  std::bernoulli_distribution rare(0.001);
  std::vector<double> x(n);
  for (double& e : x) e = g(rng) + (outliers && rare(rng) ? 10.0 * g(rng) : 0.0);
  return x;
}

// Codes of x / descale(b, hk), the descale chosen so that each (b, hk)'s largest value maps to
// about 448 * 0.75 (per-tensor scaling when mode is kScalar, 1 when kNone).
void quantize(const Fp8Problem& p, const std::vector<double>& x, const std::vector<int64_t>& cu,
              int heads, int dim, DescaleMode mode, std::vector<uint8_t>* codes,
              std::vector<float>* descale) {
  const auto& s = p.shape;
  const int group = heads / s.heads_k;
  descale->assign(static_cast<size_t>(s.batch * s.heads_k), 1.0f);
  std::vector<double> amax(descale->size(), 0.0);
  double global = 0.0;
  for (int b = 0; b < s.batch; ++b) {
    for (int64_t t = cu[b]; t < cu[b + 1]; ++t) {
      for (int h = 0; h < heads; ++h) {
        for (int c = 0; c < dim; ++c) {
          const double a = std::fabs(x[static_cast<size_t>((t * heads + h) * dim + c)]);
          double& m = amax[static_cast<size_t>(b * s.heads_k + h / group)];
          m = std::max(m, a);
          global = std::max(global, a);
        }
      }
    }
  }
  for (size_t i = 0; i < descale->size(); ++i) {
    if (mode == DescaleMode::kPerHead) (*descale)[i] = static_cast<float>(std::max(amax[i], 1e-3) / 336.0);
    if (mode == DescaleMode::kScalar) (*descale)[i] = static_cast<float>(std::max(global, 1e-3) / 336.0);
  }
  codes->assign(x.size(), 0);
  for (int b = 0; b < s.batch; ++b) {
    for (int64_t t = cu[b]; t < cu[b + 1]; ++t) {
      for (int h = 0; h < heads; ++h) {
        const double f = (*descale)[static_cast<size_t>(b * s.heads_k + h / group)];
        for (int c = 0; c < dim; ++c) {
          const size_t e = static_cast<size_t>((t * heads + h) * dim + c);
          (*codes)[e] = ref_encode(x[e] / f);
        }
      }
    }
  }
}

// The dequantized values code * descale(b, hk), exact in float64.
std::vector<double> dequantize(const Fp8Problem& p, const std::vector<uint8_t>& codes,
                               const std::vector<float>& descale, const std::vector<int64_t>& cu,
                               int heads, int dim) {
  const auto& s = p.shape;
  const int group = heads / s.heads_k;
  std::vector<double> x(codes.size());
  for (int b = 0; b < s.batch; ++b) {
    for (int64_t t = cu[b]; t < cu[b + 1]; ++t) {
      for (int h = 0; h < heads; ++h) {
        for (int c = 0; c < dim; ++c) {
          const size_t e = static_cast<size_t>((t * heads + h) * dim + c);
          x[e] = ref_decode(codes[e]) * descale[static_cast<size_t>(b * s.heads_k + h / group)];
        }
      }
    }
  }
  return x;
}

Fp8Problem make_problem(const Fp8Spec& spec) {
  Fp8Problem p;
  p.varlen = !spec.varlen_q.empty();
  if (p.varlen) {
    auto& s = p.shape;
    s.batch = static_cast<int>(spec.varlen_q.size());
    s.heads = spec.heads, s.heads_k = spec.heads_k, s.head_dim = spec.d, s.head_dim_v = spec.dv;
    s.cu_seqlens_q = {0};
    s.cu_seqlens_k = {0};
    for (int b = 0; b < s.batch; ++b) {
      s.cu_seqlens_q.push_back(s.cu_seqlens_q.back() + spec.varlen_q[static_cast<size_t>(b)]);
      s.cu_seqlens_k.push_back(s.cu_seqlens_k.back() + spec.varlen_k[static_cast<size_t>(b)]);
    }
  } else {
    p.shape = reference::Shape::dense(spec.batch, spec.seqlen_q, spec.seqlen_k, spec.heads,
                                      spec.heads_k, spec.d, spec.dv);
    p.sq_dense = spec.seqlen_q;
    p.sk_dense = spec.seqlen_k;
  }
  const auto& s = p.shape;
  for (int64_t c : s.cu_seqlens_q) p.cu_q.push_back(static_cast<int32_t>(c));
  for (int64_t c : s.cu_seqlens_k) p.cu_k.push_back(static_cast<int32_t>(c));
  std::mt19937 rng(spec.seed);
  p.q = normals(static_cast<size_t>(s.total_q() * s.heads * s.head_dim), rng, spec.outliers);
  p.k = normals(static_cast<size_t>(s.total_k() * s.heads_k * s.head_dim), rng, spec.outliers);
  p.v = normals(static_cast<size_t>(s.total_k() * s.heads_k * s.head_dim_v), rng, spec.outliers);
  quantize(p, p.q, s.cu_seqlens_q, s.heads, s.head_dim, spec.descale, &p.q8, &p.qd);
  quantize(p, p.k, s.cu_seqlens_k, s.heads_k, s.head_dim, spec.descale, &p.k8, &p.kd);
  quantize(p, p.v, s.cu_seqlens_k, s.heads_k, s.head_dim_v, spec.descale, &p.v8, &p.vd);
  std::uniform_real_distribution<float> u(-1.0f, 2.0f);
  if (spec.sink) {
    for (int h = 0; h < s.heads; ++h) p.sink.push_back(u(rng));
  }
  if (spec.alibi) {
    for (int h = 0; h < s.heads; ++h) p.alibi.push_back(0.05f * static_cast<float>(h + 1));
  }
  return p;
}

reference::Options reference_options(const Fp8Spec& spec, const Fp8Problem& p, bool round_p) {
  reference::Options o;
  o.scale = 1.0 / std::sqrt(static_cast<double>(spec.d));
  o.window_left = spec.window_left;
  o.window_right = spec.causal ? 0 : spec.window_right;
  o.softcap = spec.softcap;
  for (int b = 0; b < p.shape.batch; ++b) {
    for (float a : p.alibi) o.alibi.push_back(a);
  }
  for (float x : p.sink) o.sink.push_back(x);
  o.fp8_round_p = round_p;
  return o;
}

struct Output {
  std::vector<double> out, lse;  // (total_q, heads, dv); (heads, total_q)
};

TensorView view_of(void* data, DType dt, std::initializer_list<int64_t> shape) {
  return make_contiguous_view(data, dt, kCpu, shape);
}

// Runs the FP8 forward of `backend` on the problem's codes (every tensor staged in that backend's
// memory). With bf16_inputs, runs the bfloat16 forward on the unquantized inputs instead (the
// baseline the FP8 RMSE is reported next to). *status receives the call's status when given
// (then a failure is the caller's to judge); otherwise it must succeed.
Output run_fp8(const Fp8Spec& spec, Fp8Problem& p, Backend backend, bool bf16_inputs = false,
               bool scalar_stride0 = false, Status* status = nullptr) {
  const auto& s = p.shape;
  const int64_t tq = s.total_q(), tk = s.total_k();
  std::vector<uint16_t> qb, kb, vb;
  for (double x : p.q) qb.push_back(float_to_bf16_bits(static_cast<float>(x)));
  for (double x : p.k) kb.push_back(float_to_bf16_bits(static_cast<float>(x)));
  for (double x : p.v) vb.push_back(float_to_bf16_bits(static_cast<float>(x)));
  std::vector<uint16_t> out(static_cast<size_t>(tq * s.heads * s.head_dim_v));
  std::vector<float> lse(static_cast<size_t>(tq * s.heads));
  const Device dev = device_of(backend);
  const size_t es = bf16_inputs ? 2 : 1;
  // Never empty: a zero-row tensor still gets a valid pointer.
  const auto bytes = [](size_t n) { return std::max<size_t>(n, 16); };
  DeviceBuffer qbuf(backend, bytes(p.q8.size() * es)), kbuf(backend, bytes(p.k8.size() * es)),
      vbuf(backend, bytes(p.v8.size() * es)), obuf(backend, bytes(out.size() * 2)),
      lbuf(backend, bytes(lse.size() * 4)), cuq(backend, bytes(p.cu_q.size() * 4)),
      cuk(backend, bytes(p.cu_k.size() * 4)), qdb(backend, bytes(p.qd.size() * 4)),
      kdb(backend, bytes(p.kd.size() * 4)), vdb(backend, bytes(p.vd.size() * 4)),
      sinkb(backend, bytes(p.sink.size() * 4)), alibib(backend, bytes(p.alibi.size() * 4));
  const auto upload = [](DeviceBuffer& b, const void* src, size_t n) {
    std::vector<unsigned char> staged(b.bytes(), 0);
    if (n > 0) std::memcpy(staged.data(), src, n);
    b.upload(staged.data());
  };
  upload(qbuf, bf16_inputs ? static_cast<const void*>(qb.data()) : p.q8.data(), p.q8.size() * es);
  upload(kbuf, bf16_inputs ? static_cast<const void*>(kb.data()) : p.k8.data(), p.k8.size() * es);
  upload(vbuf, bf16_inputs ? static_cast<const void*>(vb.data()) : p.v8.data(), p.v8.size() * es);
  upload(cuq, p.cu_q.data(), p.cu_q.size() * 4);
  upload(cuk, p.cu_k.data(), p.cu_k.size() * 4);
  upload(qdb, p.qd.data(), p.qd.size() * 4);
  upload(kdb, p.kd.data(), p.kd.size() * 4);
  upload(vdb, p.vd.data(), p.vd.size() * 4);
  upload(sinkb, p.sink.data(), p.sink.size() * 4);
  upload(alibib, p.alibi.data(), p.alibi.size() * 4);
  const auto view = [&](DeviceBuffer& b, DType dt, std::initializer_list<int64_t> shape) {
    return make_contiguous_view(b.data(), dt, dev, shape);
  };
  ForwardArgs a;
  const DType in = bf16_inputs ? DType::kBFloat16 : DType::kFloat8E4M3;
  if (p.varlen) {
    a.q = view(qbuf, in, {tq, s.heads, s.head_dim});
    a.k = view(kbuf, in, {tk, s.heads_k, s.head_dim});
    a.v = view(vbuf, in, {tk, s.heads_k, s.head_dim_v});
    a.out = view(obuf, DType::kBFloat16, {tq, s.heads, s.head_dim_v});
    a.lse = view(lbuf, DType::kFloat32, {s.heads, tq});
    a.cu_seqlens_q = view(cuq, DType::kInt32, {s.batch + 1});
    a.cu_seqlens_k = view(cuk, DType::kInt32, {s.batch + 1});
    // Required on CUDA, where cu_seqlens live on the device and the grid is sized from them
    // (validate.cpp); without them every CUDA varlen case was refused with kInvalidArgument
    // (the CPU reads cu_seqlens itself, so the CPU harness never noticed).
    a.max_seqlen_q = *std::max_element(spec.varlen_q.begin(), spec.varlen_q.end());
    a.max_seqlen_k = *std::max_element(spec.varlen_k.begin(), spec.varlen_k.end());
  } else {
    a.q = view(qbuf, in, {s.batch, p.sq_dense, s.heads, s.head_dim});
    a.k = view(kbuf, in, {s.batch, p.sk_dense, s.heads_k, s.head_dim});
    a.v = view(vbuf, in, {s.batch, p.sk_dense, s.heads_k, s.head_dim_v});
    a.out = view(obuf, DType::kBFloat16, {s.batch, p.sq_dense, s.heads, s.head_dim_v});
    a.lse = view(lbuf, DType::kFloat32, {s.batch, s.heads, p.sq_dense});
  }
  a.causal = spec.causal;
  a.window_left = spec.window_left;
  a.window_right = spec.window_right;
  a.softcap = spec.softcap;
  if (!p.sink.empty()) a.learnable_sink = view(sinkb, DType::kFloat32, {s.heads});
  if (!p.alibi.empty()) a.alibi_slopes = view(alibib, DType::kFloat32, {s.heads});
  if (!bf16_inputs && spec.descale != DescaleMode::kNone) {
    const auto descale = [&](DeviceBuffer& b) {
      TensorView t = view(b, DType::kFloat32, {s.batch, s.heads_k});
      if (scalar_stride0) t.strides[0] = t.strides[1] = 0;
      return t;
    };
    a.q_descale = descale(qdb);
    a.k_descale = descale(kdb);
    a.v_descale = descale(vdb);
  }
  const Status st = forward(a);
  if (status != nullptr) {
    *status = st;
    if (!st.ok()) return {};
  } else {
    EXPECT_TRUE(st.ok()) << st.message();
  }
  obuf.download(out.data());
  lbuf.download(lse.data());
  Output o;
  for (uint16_t x : out) o.out.push_back(bf16_bits_to_float(x));
  // lse to (heads, total_q)
  o.lse.resize(lse.size());
  for (int b = 0; b < s.batch; ++b) {
    for (int64_t t = s.cu_seqlens_q[b]; t < s.cu_seqlens_q[b + 1]; ++t) {
      for (int h = 0; h < s.heads; ++h) {
        const size_t dst = static_cast<size_t>(h * tq + t);
        const size_t src = p.varlen ? dst
                                    : static_cast<size_t>((b * s.heads + h) * p.sq_dense +
                                                          (t - s.cu_seqlens_q[b]));
        o.lse[dst] = lse[src];
      }
    }
  }
  return o;
}

Output run_cpu(const Fp8Spec& spec, Fp8Problem& p, bool bf16_inputs = false, bool scalar_stride0 = false) {
  return run_fp8(spec, p, Backend::kCpu, bf16_inputs, scalar_stride0);
}

Output run_reference(const Fp8Spec& spec, const Fp8Problem& p, const std::vector<double>& q,
                     const std::vector<double>& k, const std::vector<double>& v, bool round_p) {
  const auto& s = p.shape;
  Output o;
  o.out.assign(static_cast<size_t>(s.total_q() * s.heads * s.head_dim_v), 0.0);
  o.lse.assign(static_cast<size_t>(s.total_q() * s.heads), 0.0);
  reference::forward(s, reference_options(spec, p, round_p), q.data(), k.data(), v.data(),
                     o.out.data(), o.lse.data());
  return o;
}

// How far the FP8 forward may be from the naive FP8 computation, per output element:
//   * the bfloat16 output: 2^-8 of the value (one bf16 ulp, twice the rounding), and
//   * every probability whose exact value 2^(x - r) lies within 2^-12 (relative) of an e4m3
//     rounding boundary: the backend computes x in float32 and may round it the other way, by
//     one e4m3 ulp (2^-3 relative): up to 2^-3 * p * |v| on each output column; likewise
//     probabilities in e4m3's subnormal range (quantum 2^-9 / L), and a whole row when its
//     maximum logit is within 2^-12 of an integer (ceil may differ: a power-of-two shift, exact
//     but for the subnormals).
// Visibility is recomputed here from the window (the cases below use no bias or mask).
//
// acc_eps > 0 (the CUDA kernels on Hopper): the tensor cores' FP8 products do not accumulate
// in full float32. A wgmma e4m3 step keeps about 14 significant bits of its sum (DeepSeek-V3
// technical report, section 3.3.2, "around 14 bits" on H800), so each k32 step may lose up to
// acc_eps of the magnitude summed so far. That moves a logit by up to
// dx = acc_eps * (d / 32) * scale * log2(e) * sum_c |q_c k_c| (widening the flip window above
// from 2^-12 to ln 2 * dx), moves the row's LSE by up to ln 2 * max dx (added to *lse_extra per
// (head, row), when given), adds acc_eps * (k32 steps of P V) * sum_j P_j |V_j| / L to each
// output, and |out| (2^max dx - 1) for the row sum l, which takes P before its rounding. A
// bound, not an estimate: a layout bug moves the output by O(1) of its values.
std::vector<double> naive_tolerance(const Fp8Spec& spec, const Fp8Problem& p,
                                    const std::vector<double>& q, const std::vector<double>& k,
                                    const std::vector<double>& v, const std::vector<double>& naive,
                                    double acc_eps = 0.0, std::vector<double>* lse_extra = nullptr) {
  const auto& s = p.shape;
  const double log2e = 1.0 / std::log(2.0), scale = 1.0 / std::sqrt(static_cast<double>(spec.d));
  const double delta0 = std::ldexp(1.0, -12);
  const int group = s.heads / s.heads_k, D = s.head_dim, Dv = s.head_dim_v;
  const int right = spec.causal ? 0 : spec.window_right, left = spec.window_left;
  const double qk_steps = std::ceil(D / 32.0);
  std::vector<double> tol(naive.size());
  for (size_t e = 0; e < naive.size(); ++e) tol[e] = std::ldexp(std::fabs(naive[e]), -8) + 1e-6;
  if (lse_extra != nullptr) lse_extra->assign(static_cast<size_t>(s.total_q() * s.heads), 0.0);
  for (int b = 0; b < s.batch; ++b) {
    const int64_t q0 = s.cu_seqlens_q[b], k0 = s.cu_seqlens_k[b];
    const int64_t sq = s.cu_seqlens_q[b + 1] - q0, sk = s.cu_seqlens_k[b + 1] - k0;
    for (int h = 0; h < s.heads; ++h) {
      const int hk = h / group;
      for (int64_t i = 0; i < sq; ++i) {
        std::vector<double> x(static_cast<size_t>(sk), -INFINITY), dx(static_cast<size_t>(sk), 0.0);
        double mx = -INFINITY, dx_max = 0.0;
        for (int64_t j = 0; j < sk; ++j) {
          const int64_t diag = i + sk - sq;
          if ((left >= 0 && j < diag - left) || (right >= 0 && j > diag + right)) continue;
          double dot = 0.0, absdot = 0.0;
          for (int c = 0; c < D; ++c) {
            const double t = q[static_cast<size_t>(((q0 + i) * s.heads + h) * D + c)] *
                             k[static_cast<size_t>(((k0 + j) * s.heads_k + hk) * D + c)];
            dot += t;
            absdot += std::fabs(t);
          }
          dx[static_cast<size_t>(j)] = acc_eps * qk_steps * absdot * scale * log2e;
          dx_max = std::max(dx_max, dx[static_cast<size_t>(j)]);
          double t = dot * scale;
          if (spec.softcap > 0) t = spec.softcap * std::tanh(t / spec.softcap);
          if (!p.alibi.empty()) t -= p.alibi[static_cast<size_t>(h)] * static_cast<double>(std::llabs(diag - j));
          x[static_cast<size_t>(j)] = t * log2e;
          mx = std::max(mx, t * log2e);
        }
        if (mx == -INFINITY) continue;
        if (lse_extra != nullptr) (*lse_extra)[static_cast<size_t>(h * s.total_q() + q0 + i)] = dx_max / log2e;
        const double r = std::ceil(mx) - 8.0;
        const bool r_ambiguous =
            std::fabs(mx - std::round(mx)) < std::max(delta0 * std::max(1.0, std::fabs(mx)), dx_max);
        double L = p.sink.empty() ? 0.0 : std::exp2(p.sink[static_cast<size_t>(h)] * log2e - r);
        for (double xj : x) L += xj == -INFINITY ? 0.0 : std::exp2(xj - r);
        double pv_abs_sum = 0.0;  // sum_j P_j |V_j| per output column, for acc_eps
        std::vector<double> pv_abs(static_cast<size_t>(Dv), 0.0);
        for (int64_t j = 0; j < sk; ++j) {
          const double xj = x[static_cast<size_t>(j)];
          if (xj == -INFINITY) continue;
          const double pv = std::exp2(xj - r);
          if (acc_eps > 0.0) {
            for (int c = 0; c < Dv; ++c) {
              pv_abs[static_cast<size_t>(c)] +=
                  1.0625 * pv * std::fabs(v[static_cast<size_t>(((k0 + j) * s.heads_k + hk) * Dv + c)]);
            }
            pv_abs_sum += pv;
          }
          // The relative change of P a logit error may cause (both windows in the same units).
          const double delta = std::max(delta0, dx[static_cast<size_t>(j)] / log2e);
          double slack = 0.0;
          if (pv < std::ldexp(1.0, -5)) {
            slack = std::ldexp(1.0, -9);  // subnormal (or next to it): one quantum either way
          } else {
            const double m = pv / std::ldexp(1.0, static_cast<int>(std::floor(std::log2(pv))));
            const double frac = m * 8.0 - std::floor(m * 8.0);  // position between two codes
            const double window = delta == delta0 ? 8.0 * delta : 16.0 * delta;
            if (std::fabs(frac - 0.5) < window || r_ambiguous) slack = pv / 8.0;
          }
          if (slack == 0.0) continue;
          for (int c = 0; c < Dv; ++c) {
            const double vj = std::fabs(v[static_cast<size_t>(((k0 + j) * s.heads_k + hk) * Dv + c)]);
            tol[static_cast<size_t>(((q0 + i) * s.heads + h) * Dv + c)] += 1.01 * slack / L * vj;
          }
        }
        if (acc_eps > 0.0 && pv_abs_sum > 0.0) {
          const double pv_steps = std::ceil(static_cast<double>(sk) / 32.0) + 1.0;
          // The row sum l takes P unrounded, so the logits' errors move it continuously (not
          // only through rounding flips): each term by a factor within 2^(+-dx_max), l too, and
          // O / l by up to eps / (1 - eps) of itself. Missing before the first GPU run.
          const double l_eps = std::exp2(dx_max) - 1.0;
          for (int c = 0; c < Dv; ++c) {
            const size_t e = static_cast<size_t>(((q0 + i) * s.heads + h) * Dv + c);
            tol[e] += acc_eps * pv_steps * pv_abs[static_cast<size_t>(c)] / L +
                      std::fabs(naive[e]) * l_eps / (1.0 - l_eps);
          }
        }
      }
    }
  }
  return tol;
}

double rmse(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0.0;
  for (size_t i = 0; i < a.size(); ++i) s += (a[i] - b[i]) * (a[i] - b[i]);
  return std::sqrt(s / static_cast<double>(std::max<size_t>(a.size(), 1)));
}

void PrintTo(const Fp8Spec& s, std::ostream* os) { *os << s.name; }

class Fp8Forward : public testing::TestWithParam<Fp8Spec> {};

TEST_P(Fp8Forward, MatchesNaiveFp8AndFloat64) {
  const Fp8Spec& spec = GetParam();
  Fp8Problem p = make_problem(spec);
  const auto& s = p.shape;
  const std::vector<double> qd = dequantize(p, p.q8, p.qd, s.cu_seqlens_q, s.heads, s.head_dim);
  const std::vector<double> kd = dequantize(p, p.k8, p.kd, s.cu_seqlens_k, s.heads_k, s.head_dim);
  const std::vector<double> vd = dequantize(p, p.v8, p.vd, s.cu_seqlens_k, s.heads_k, s.head_dim_v);
  const Output ours = run_cpu(spec, p);
  const Output naive = run_reference(spec, p, qd, kd, vd, /*round_p=*/true);
  const Output exact = run_reference(spec, p, qd, kd, vd, /*round_p=*/false);

  // Tight: the naive FP8 computation, up to the output rounding and legitimate flips.
  const std::vector<double> tol = naive_tolerance(spec, p, qd, kd, vd, naive.out);
  size_t worst = 0;
  double worst_ratio = 0.0;
  for (size_t e = 0; e < ours.out.size(); ++e) {
    ASSERT_FALSE(std::isnan(ours.out[e])) << "element " << e;
    const double ratio = std::fabs(ours.out[e] - naive.out[e]) / tol[e];
    if (ratio > worst_ratio) worst_ratio = ratio, worst = e;
  }
  EXPECT_LE(worst_ratio, 1.0) << "element " << worst << ": ours " << ours.out[worst] << ", naive "
                              << naive.out[worst] << ", tolerance " << tol[worst];
  // LSE: float32 of the unrounded scores (P's rounding does not enter it).
  for (size_t e = 0; e < ours.lse.size(); ++e) {
    if (std::isinf(exact.lse[e])) {
      ASSERT_EQ(ours.lse[e], exact.lse[e]) << e;  // a row with no visible key
    } else {
      ASSERT_NEAR(ours.lse[e], exact.lse[e], 2e-5 * std::max(1.0, std::fabs(exact.lse[e]))) << e;
    }
  }
  // FlashAttention's criterion against float64 of the same (dequantized) inputs.
  double err = 0.0, naive_err = 0.0, amax = 0.0;
  for (size_t e = 0; e < ours.out.size(); ++e) {
    err = std::max(err, std::fabs(ours.out[e] - exact.out[e]));
    naive_err = std::max(naive_err, std::fabs(naive.out[e] - exact.out[e]));
    amax = std::max(amax, std::fabs(exact.out[e]));
  }
  EXPECT_LE(err, 2.0 * naive_err + std::ldexp(amax, -8) + 1e-6);

  // Loose: float64 on the unquantized inputs; RMSE next to the bfloat16 forward's.
  const Output orig = run_reference(spec, p, p.q, p.k, p.v, false);
  const Output bf16 = run_cpu(spec, p, /*bf16_inputs=*/true);
  const double rms_ref = rmse(orig.out, std::vector<double>(orig.out.size(), 0.0));
  const double e_fp8 = rmse(ours.out, orig.out), e_bf16 = rmse(bf16.out, orig.out);
  std::printf("[fp8 %s] RMSE vs float64 of the unquantized inputs: fp8 %.3e, bf16 %.3e (rms %.3e)\n",
              spec.name.c_str(), e_fp8, e_bf16, rms_ref);
  // Per-(batch, kv head) scaling without FlashAttention-3's block quantization or incoherent
  // processing: about 5% of the output's rms on Gaussian inputs, 10% with outliers (the paper's
  // baseline FP8 figure for the outlier test is 2.4e-2, ours 2.2e-2).
  EXPECT_LT(e_fp8, 0.2 * rms_ref + 1e-6);
  EXPECT_LT(e_bf16, e_fp8 + 1e-6);
}

std::vector<Fp8Spec> forward_cases() {
  std::vector<Fp8Spec> c;
  auto add = [&](Fp8Spec s) { c.push_back(std::move(s)); };
  { Fp8Spec s; s.name = "gqa_plain"; add(s); }
  { Fp8Spec s; s.name = "mha_d128_long"; s.heads = 2; s.heads_k = 2; s.d = s.dv = 128; s.seqlen_q = 70; s.seqlen_k = 300; add(s); }
  { Fp8Spec s; s.name = "causal"; s.causal = true; s.seqlen_q = 83; s.seqlen_k = 83; add(s); }
  { Fp8Spec s; s.name = "causal_sq_gt_sk"; s.causal = true; s.seqlen_q = 90; s.seqlen_k = 40; add(s); }
  { Fp8Spec s; s.name = "window"; s.window_left = 20; s.window_right = 5; s.seqlen_q = 100; s.seqlen_k = 130; add(s); }
  { Fp8Spec s; s.name = "softcap"; s.softcap = 5.0f; add(s); }
  { Fp8Spec s; s.name = "sink"; s.sink = true; s.causal = true; add(s); }
  { Fp8Spec s; s.name = "alibi"; s.alibi = true; add(s); }
  { Fp8Spec s; s.name = "mqa_scalar_descale"; s.heads_k = 1; s.descale = DescaleMode::kScalar; add(s); }
  { Fp8Spec s; s.name = "no_descale"; s.descale = DescaleMode::kNone; add(s); }
  { Fp8Spec s; s.name = "dv_ne_d"; s.d = 96; s.dv = 40; add(s); }
  { Fp8Spec s; s.name = "seqlen_1"; s.seqlen_q = 1; s.seqlen_k = 1; s.causal = true; add(s); }
  { Fp8Spec s; s.name = "varlen"; s.varlen_q = {5, 0, 70, 1}; s.varlen_k = {9, 3, 140, 1}; s.causal = true; add(s); }
  { Fp8Spec s; s.name = "varlen_sink_window"; s.varlen_q = {33, 65}; s.varlen_k = {64, 65}; s.sink = true; s.window_left = 10; add(s); }
  { Fp8Spec s; s.name = "outliers"; s.outliers = true; s.seqlen_k = 256; add(s); }
  return c;
}

INSTANTIATE_TEST_SUITE_P(Cpu, Fp8Forward, testing::ValuesIn(forward_cases()),
                         [](const testing::TestParamInfo<Fp8Spec>& i) { return i.param.name; });

// A descale of strides (0, 0) (an expanded scalar, as FlashAttention-3 callers pass a
// per-tensor factor) is bitwise the same as the materialised (batch, heads_k) tensor.
TEST(Fp8Forward, ExpandedScalarDescaleEqualsMaterialised) {
  Fp8Spec spec;
  spec.descale = DescaleMode::kScalar;
  Fp8Problem p = make_problem(spec);
  const Output full = run_cpu(spec, p, false, /*scalar_stride0=*/false);
  const Output expanded = run_cpu(spec, p, false, /*scalar_stride0=*/true);
  EXPECT_EQ(full.out, expanded.out);
  EXPECT_EQ(full.lse, expanded.lse);
}

// Per-(batch, kv head) factors: scaling one (b, hk)'s q_descale by 2 and its k_descale by 1/2
// changes nothing (the scores see the product); scaling its v_descale by 2 doubles exactly
// that group's output rows and leaves every other one bitwise alone.
TEST(Fp8Forward, DescaleIsPerBatchAndKvHead) {
  Fp8Spec spec;
  Fp8Problem p = make_problem(spec);
  const Output base = run_cpu(spec, p);
  Fp8Problem p2 = p;
  p2.qd[1] *= 2.0f;
  p2.kd[1] *= 0.5f;
  EXPECT_EQ(run_cpu(spec, p2).out, base.out);
  p2.vd[1] *= 2.0f;  // (b 0, hk 1): query heads 2, 3 of sequence 0
  const Output scaled = run_cpu(spec, p2);
  const auto& s = p.shape;
  for (int64_t t = 0; t < s.total_q(); ++t) {
    for (int h = 0; h < s.heads; ++h) {
      const bool hit = t < spec.seqlen_q && h / (s.heads / s.heads_k) == 1;
      for (int c = 0; c < s.head_dim_v; ++c) {
        const size_t e = static_cast<size_t>((t * s.heads + h) * s.head_dim_v + c);
        EXPECT_EQ(scaled.out[e], hit ? 2.0 * base.out[e] : base.out[e]) << t << " " << h << " " << c;
      }
    }
  }
}

// ---- FP8 KV cache ------------------------------------------------------------------------------

struct CacheCase {
  int batch = 2, heads = 4, heads_k = 2, d = 64, seqlen_q = 3, seqlen_new = 2, capacity = 96;
  int page_size = 0;  // 0 = dense
  bool fp8_q = false;  // q and the new k/v in e4m3 too (the FP8 forward against the cache)
};

struct CacheRun {
  std::vector<double> out;           // (batch, seqlen_q, heads, d)
  std::vector<uint8_t> k_cache;      // dense image (batch, capacity, heads_k, d) after the call
  std::vector<uint8_t> v_cache;
};

// Runs forward_kvcache with e4m3 caches filled with random codes, cache_seqlens {20, 61}, and
// new tokens; returns the output and the caches in dense order.
CacheRun run_cache(const CacheCase& cc, std::vector<double>* expect_out) {
  std::mt19937 rng(11);
  std::normal_distribution<double> g(0.0, 1.0);
  const int B = cc.batch, H = cc.heads, Hk = cc.heads_k, D = cc.d, C = cc.capacity;
  std::vector<int32_t> seqlens = {20, 61};
  std::vector<float> kd = {0.01f, 0.02f, 0.015f, 0.005f}, vd = {0.02f, 0.01f, 0.03f, 0.008f};
  std::vector<float> qd = {0.02f, 0.03f, 0.01f, 0.02f};
  // Dense image of the cache codes; paged: pages shuffled.
  std::vector<uint8_t> kc(static_cast<size_t>(B * C * Hk * D)), vc(kc.size());
  for (auto& x : kc) x = ref_encode(g(rng) * 40.0);
  for (auto& x : vc) x = ref_encode(g(rng) * 40.0);
  std::vector<double> q(static_cast<size_t>(B * cc.seqlen_q * H * D));
  std::vector<double> kn(static_cast<size_t>(B * cc.seqlen_new * Hk * D)), vn(kn.size());
  for (auto& x : q) x = g(rng);
  for (auto& x : kn) x = g(rng) * 0.4;
  for (auto& x : vn) x = g(rng) * 0.4;
  // Storage: bf16 (or e4m3 codes for fp8_q) of q and the new tokens.
  const DType in = cc.fp8_q ? DType::kFloat8E4M3 : DType::kBFloat16;
  const size_t es = cc.fp8_q ? 1 : 2;
  auto store = [&](const std::vector<double>& x, const std::vector<float>& descale, int heads,
                   std::vector<unsigned char>* bytes, std::vector<double>* value) {
    bytes->assign(x.size() * es, 0);
    value->assign(x.size(), 0.0);
    for (size_t e = 0; e < x.size(); ++e) {
      const int h = static_cast<int>((e / static_cast<size_t>(D)) % static_cast<size_t>(heads));
      const int b = static_cast<int>(e / (x.size() / static_cast<size_t>(B)));
      const double f = descale[static_cast<size_t>(b * Hk + h / (heads / Hk))];
      if (cc.fp8_q) {
        (*bytes)[e] = ref_encode(x[e] / f);
        (*value)[e] = ref_decode((*bytes)[e]) * f;
      } else {
        const uint16_t bits = float_to_bf16_bits(static_cast<float>(x[e]));
        std::memcpy(bytes->data() + 2 * e, &bits, 2);
        (*value)[e] = bf16_bits_to_float(bits);
      }
    }
  };
  std::vector<unsigned char> qb, knb, vnb;
  std::vector<double> qv, knv, vnv;
  store(q, qd, H, &qb, &qv);
  store(kn, kd, Hk, &knb, &knv);
  store(vn, vd, Hk, &vnb, &vnv);

  // Expected cache after the append: the new tokens' codes (bf16: e4m3(x / descale)).
  std::vector<uint8_t> kc_after = kc, vc_after = vc;
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < cc.seqlen_new; ++t) {
      for (int h = 0; h < Hk; ++h) {
        for (int c = 0; c < D; ++c) {
          const size_t src = static_cast<size_t>(((b * cc.seqlen_new + t) * Hk + h) * D + c);
          const size_t dst = static_cast<size_t>(((b * C + seqlens[static_cast<size_t>(b)] + t) * Hk + h) * D + c);
          const size_t f = static_cast<size_t>(b * Hk + h);
          if (cc.fp8_q) {
            kc_after[dst] = knb[src];
            vc_after[dst] = vnb[src];
          } else {
            kc_after[dst] = ref_encode(static_cast<double>(static_cast<float>(knv[src]) / kd[f]));
            vc_after[dst] = ref_encode(static_cast<double>(static_cast<float>(vnv[src]) / vd[f]));
          }
        }
      }
    }
  }

  // Device layout.
  std::vector<uint8_t> kstore = kc, vstore = vc;
  std::vector<int32_t> table;
  int num_pages = 0;
  std::vector<int> page_of;  // dense page index -> stored page
  if (cc.page_size > 0) {
    const int per_seq = C / cc.page_size;
    num_pages = B * per_seq;
    page_of.resize(static_cast<size_t>(num_pages));
    for (int i = 0; i < num_pages; ++i) page_of[static_cast<size_t>(i)] = i;
    std::shuffle(page_of.begin(), page_of.end(), rng);
    const size_t page_bytes = static_cast<size_t>(cc.page_size * Hk * D);
    for (int i = 0; i < num_pages; ++i) {
      std::memcpy(kstore.data() + page_of[static_cast<size_t>(i)] * page_bytes, kc.data() + i * page_bytes, page_bytes);
      std::memcpy(vstore.data() + page_of[static_cast<size_t>(i)] * page_bytes, vc.data() + i * page_bytes, page_bytes);
    }
    for (int b = 0; b < B; ++b) {
      for (int j = 0; j < per_seq; ++j) table.push_back(page_of[static_cast<size_t>(b * per_seq + j)]);
    }
  }

  std::vector<uint16_t> out(static_cast<size_t>(B * cc.seqlen_q * H * D));
  KVCacheArgs a;
  a.q = view_of(qb.data(), in, {B, cc.seqlen_q, H, D});
  if (cc.page_size > 0) {
    a.k_cache = view_of(kstore.data(), DType::kFloat8E4M3, {num_pages, cc.page_size, Hk, D});
    a.v_cache = view_of(vstore.data(), DType::kFloat8E4M3, {num_pages, cc.page_size, Hk, D});
    a.block_table = view_of(table.data(), DType::kInt32, {B, C / cc.page_size});
  } else {
    a.k_cache = view_of(kstore.data(), DType::kFloat8E4M3, {B, C, Hk, D});
    a.v_cache = view_of(vstore.data(), DType::kFloat8E4M3, {B, C, Hk, D});
  }
  a.k = view_of(knb.data(), in, {B, cc.seqlen_new, Hk, D});
  a.v = view_of(vnb.data(), in, {B, cc.seqlen_new, Hk, D});
  a.cache_seqlens = view_of(seqlens.data(), DType::kInt32, {B});
  a.out = view_of(out.data(), DType::kBFloat16, {B, cc.seqlen_q, H, D});
  a.causal = true;
  a.k_descale = view_of(kd.data(), DType::kFloat32, {B, Hk});
  a.v_descale = view_of(vd.data(), DType::kFloat32, {B, Hk});
  if (cc.fp8_q) a.q_descale = view_of(qd.data(), DType::kFloat32, {B, Hk});
  const Status st = forward_kvcache(a);
  EXPECT_TRUE(st.ok()) << st.message();

  CacheRun r;
  for (uint16_t x : out) r.out.push_back(bf16_bits_to_float(x));
  r.k_cache = kstore, r.v_cache = vstore;
  if (cc.page_size > 0) {
    const size_t page_bytes = static_cast<size_t>(cc.page_size * Hk * D);
    for (int i = 0; i < num_pages; ++i) {
      std::memcpy(r.k_cache.data() + i * page_bytes, kstore.data() + page_of[static_cast<size_t>(i)] * page_bytes, page_bytes);
      std::memcpy(r.v_cache.data() + i * page_bytes, vstore.data() + page_of[static_cast<size_t>(i)] * page_bytes, page_bytes);
    }
  }
  EXPECT_EQ(r.k_cache, kc_after);
  EXPECT_EQ(r.v_cache, vc_after);

  // Expected output: the reference on each sequence's keys (dequantized cache rows).
  if (expect_out != nullptr) {
    expect_out->assign(r.out.size(), 0.0);
    for (int b = 0; b < B; ++b) {
      const int len = seqlens[static_cast<size_t>(b)] + cc.seqlen_new;
      reference::Shape s = reference::Shape::dense(1, cc.seqlen_q, len, H, Hk, D, D);
      std::vector<double> kk(static_cast<size_t>(len * Hk * D)), vv(kk.size());
      for (int j = 0; j < len; ++j) {
        for (int h = 0; h < Hk; ++h) {
          for (int c = 0; c < D; ++c) {
            const size_t src = static_cast<size_t>(((b * C + j) * Hk + h) * D + c);
            const size_t dst = static_cast<size_t>((j * Hk + h) * D + c);
            kk[dst] = ref_decode(kc_after[src]) * kd[static_cast<size_t>(b * Hk + h)];
            vv[dst] = ref_decode(vc_after[src]) * vd[static_cast<size_t>(b * Hk + h)];
          }
        }
      }
      reference::Options o;
      o.scale = 1.0 / std::sqrt(static_cast<double>(D));
      o.window_right = 0;
      o.fp8_round_p = cc.fp8_q;
      std::vector<double> ob(static_cast<size_t>(cc.seqlen_q * H * D)), lb(static_cast<size_t>(cc.seqlen_q * H));
      reference::forward(s, o, qv.data() + static_cast<size_t>(b * cc.seqlen_q * H * D), kk.data(),
                         vv.data(), ob.data(), lb.data());
      std::copy(ob.begin(), ob.end(), expect_out->begin() + static_cast<std::ptrdiff_t>(b * cc.seqlen_q * H * D));
    }
  }
  return r;
}

TEST(Fp8KVCache, Bf16QueriesDenseAppendQuantizesAndAttends) {
  CacheCase cc;
  std::vector<double> expect;
  const CacheRun r = run_cache(cc, &expect);
  for (size_t e = 0; e < r.out.size(); ++e) {
    // bfloat16 q, float32 dequantized K/V: the bf16 path's error (output rounding + float32).
    ASSERT_NEAR(r.out[e], expect[e], std::ldexp(std::fabs(expect[e]), -7) + 2e-3) << e;
  }
}

TEST(Fp8KVCache, PagedEqualsDenseBitwise) {
  for (bool fp8_q : {false, true}) {
    for (int page : {1, 16, 32}) {
      CacheCase dense, paged;
      dense.fp8_q = paged.fp8_q = fp8_q;
      paged.page_size = page;
      const CacheRun a = run_cache(dense, nullptr);
      const CacheRun b = run_cache(paged, nullptr);
      EXPECT_EQ(a.out, b.out) << "page size " << page << " fp8_q " << fp8_q;
    }
  }
}

TEST(Fp8KVCache, Fp8QueriesCopyNewTokensAndRoundP) {
  CacheCase cc;
  cc.fp8_q = true;
  std::vector<double> expect;
  const CacheRun r = run_cache(cc, &expect);
  double amax = 0.0;
  for (double x : expect) amax = std::max(amax, std::fabs(x));
  for (size_t e = 0; e < r.out.size(); ++e) {
    // The naive FP8 computation (P rounded); a flipped probability may cost 2^-3 of its weight.
    ASSERT_NEAR(r.out[e], expect[e], std::ldexp(std::fabs(expect[e]), -8) + 0.02 * amax) << e;
  }
}

// ---- errors -------------------------------------------------------------------------------------

struct ErrorFixture {
  std::vector<uint8_t> q8 = std::vector<uint8_t>(2 * 5 * 4 * 16, 0x38);  // 1.0
  std::vector<uint8_t> k8 = std::vector<uint8_t>(2 * 7 * 2 * 16, 0x30);
  std::vector<uint8_t> v8 = std::vector<uint8_t>(2 * 7 * 2 * 16, 0x38);
  std::vector<uint16_t> out = std::vector<uint16_t>(2 * 5 * 4 * 16);
  std::vector<uint16_t> bf = std::vector<uint16_t>(2 * 7 * 2 * 16, 0x3f80);
  std::vector<float> desc = std::vector<float>(2 * 2, 0.5f);
  std::vector<float> bias = std::vector<float>(2 * 4 * 5 * 7, 0.0f);
  ForwardArgs args() {
    ForwardArgs a;
    a.q = view_of(q8.data(), DType::kFloat8E4M3, {2, 5, 4, 16});
    a.k = view_of(k8.data(), DType::kFloat8E4M3, {2, 7, 2, 16});
    a.v = view_of(v8.data(), DType::kFloat8E4M3, {2, 7, 2, 16});
    a.out = view_of(out.data(), DType::kBFloat16, {2, 5, 4, 16});
    return a;
  }
};

void expect_error(const Status& s, StatusCode code, const std::string& needle) {
  EXPECT_EQ(s.code(), code) << s.message();
  EXPECT_NE(s.message().find(needle), std::string::npos) << "message: " << s.message();
}

TEST(Fp8Errors, Forward) {
  ErrorFixture f;
  ASSERT_TRUE(forward(f.args()).ok());
  {
    ForwardArgs a = f.args();  // k in bf16 under an e4m3 q
    a.k = view_of(f.bf.data(), DType::kBFloat16, {2, 7, 2, 16});
    expect_error(forward(a), StatusCode::kInvalidArgument, "k must have dtype float8_e4m3");
  }
  {
    ForwardArgs a = f.args();  // out must be bfloat16
    a.out.dtype = DType::kFloat16;
    expect_error(forward(a), StatusCode::kNotSupported, "out must have dtype bfloat16");
    a.out.dtype = DType::kFloat8E4M3;
    expect_error(forward(a), StatusCode::kNotSupported, "out must have dtype bfloat16");
  }
  {
    ForwardArgs a = f.args();
    a.q_descale = view_of(f.desc.data(), DType::kFloat32, {2, 4});  // heads, not heads_k
    expect_error(forward(a), StatusCode::kInvalidArgument, "q_descale must have shape (2, 2)");
    a.q_descale = view_of(f.desc.data(), DType::kFloat32, {4});
    expect_error(forward(a), StatusCode::kInvalidArgument, "q_descale must have shape");
    a.q_descale = view_of(f.desc.data(), DType::kFloat16, {2, 2});
    expect_error(forward(a), StatusCode::kInvalidArgument, "q_descale must have dtype float32");
    a.q_descale = view_of(f.desc.data(), DType::kFloat32, {2, 2});
    a.q_descale.device = Device{DeviceType::kCUDA, 0};
    expect_error(forward(a), StatusCode::kInvalidArgument, "q_descale is on cuda:0");
    a.q_descale = view_of(f.desc.data(), DType::kFloat32, {2, 2});
    a.q_descale.strides[1] = -1;
    expect_error(forward(a), StatusCode::kInvalidArgument, "q_descale has a negative stride");
    a.q_descale = view_of(nullptr, DType::kFloat32, {2, 2});
    expect_error(forward(a), StatusCode::kInvalidArgument, "q_descale has a null data pointer");
  }
  for (float bad : {0.0f, -1.0f, std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::quiet_NaN()}) {
    ForwardArgs a = f.args();
    std::vector<float> d = f.desc;
    d[3] = bad;
    a.v_descale = view_of(d.data(), DType::kFloat32, {2, 2});
    expect_error(forward(a), StatusCode::kInvalidArgument, "v_descale[1, 1]");
  }
  {
    ForwardArgs a = f.args();  // descale on a non-FP8 call
    a.q = view_of(f.bf.data(), DType::kBFloat16, {2, 5, 4, 16});
    a.k = view_of(f.bf.data(), DType::kBFloat16, {2, 7, 2, 16});
    a.v = view_of(f.bf.data(), DType::kBFloat16, {2, 7, 2, 16});
    a.k_descale = view_of(f.desc.data(), DType::kFloat32, {2, 2});
    expect_error(forward(a), StatusCode::kInvalidArgument,
                 "k_descale was given but k has dtype bfloat16");
  }
  {
    ForwardArgs a = f.args();
    a.dropout_p = 0.1f;
    expect_error(forward(a), StatusCode::kNotSupported, "dropout_p");
  }
  {
    ForwardArgs a = f.args();  // a bias in q's dtype is no option for e4m3
    a.attn_bias = view_of(f.q8.data(), DType::kFloat8E4M3, {2, 4, 5, 7});
    expect_error(forward(a), StatusCode::kInvalidArgument, "attn_bias must have dtype float32 with float8_e4m3 q");
    a.attn_bias = view_of(f.bias.data(), DType::kFloat32, {2, 4, 5, 7});
    EXPECT_TRUE(forward(a).ok());  // a float32 bias composes
  }
}

TEST(Fp8Errors, BackwardIsNotSupported) {
  ErrorFixture f;
  std::vector<float> lse(2 * 4 * 5);
  std::vector<uint8_t> dq(f.q8.size()), dk(f.k8.size()), dv(f.v8.size());
  BackwardArgs b;
  b.q = view_of(f.q8.data(), DType::kFloat8E4M3, {2, 5, 4, 16});
  b.k = view_of(f.k8.data(), DType::kFloat8E4M3, {2, 7, 2, 16});
  b.v = view_of(f.v8.data(), DType::kFloat8E4M3, {2, 7, 2, 16});
  b.out = b.dout = view_of(f.out.data(), DType::kBFloat16, {2, 5, 4, 16});
  b.lse = view_of(lse.data(), DType::kFloat32, {2, 4, 5});
  b.dq = view_of(dq.data(), DType::kFloat8E4M3, {2, 5, 4, 16});
  b.dk = view_of(dk.data(), DType::kFloat8E4M3, {2, 7, 2, 16});
  b.dv = view_of(dv.data(), DType::kFloat8E4M3, {2, 7, 2, 16});
  expect_error(backward(b), StatusCode::kNotSupported, "backward is not supported for float8_e4m3");
}

TEST(Fp8Errors, KVCache) {
  std::vector<uint16_t> q(2 * 1 * 4 * 16, 0x3f80), kn(2 * 1 * 2 * 16, 0x3f80), out(q.size());
  std::vector<uint8_t> kc(2 * 8 * 2 * 16, 0x38), vc(kc.size(), 0x38), q8(q.size(), 0x38);
  std::vector<uint16_t> vbf(kc.size());
  std::vector<int32_t> lens = {2, 3};
  std::vector<float> desc(4, 0.5f);
  std::vector<uint16_t> rot(8 * 4, 0x3f80);
  auto args = [&] {
    KVCacheArgs a;
    a.q = view_of(q.data(), DType::kBFloat16, {2, 1, 4, 16});
    a.k_cache = view_of(kc.data(), DType::kFloat8E4M3, {2, 8, 2, 16});
    a.v_cache = view_of(vc.data(), DType::kFloat8E4M3, {2, 8, 2, 16});
    a.out = view_of(out.data(), DType::kBFloat16, {2, 1, 4, 16});
    a.cache_seqlens = view_of(lens.data(), DType::kInt32, {2});
    return a;
  };
  ASSERT_TRUE(forward_kvcache(args()).ok());
  {
    KVCacheArgs a = args();
    a.v_cache = view_of(vbf.data(), DType::kBFloat16, {2, 8, 2, 16});
    expect_error(forward_kvcache(a), StatusCode::kInvalidArgument, "v_cache must have dtype float8_e4m3");
  }
  {
    KVCacheArgs a = args();  // q_descale under a bf16 q
    a.q_descale = view_of(desc.data(), DType::kFloat32, {2, 2});
    expect_error(forward_kvcache(a), StatusCode::kInvalidArgument, "q_descale was given but q has dtype bfloat16");
  }
  {
    KVCacheArgs a = args();  // new tokens in the cache's dtype under a bf16 q
    a.k = view_of(kc.data(), DType::kFloat8E4M3, {2, 1, 2, 16});
    a.v = view_of(vc.data(), DType::kFloat8E4M3, {2, 1, 2, 16});
    expect_error(forward_kvcache(a), StatusCode::kInvalidArgument, "k must have dtype bfloat16");
  }
  {
    KVCacheArgs a = args();
    a.k_descale = view_of(desc.data(), DType::kFloat32, {1, 2});
    expect_error(forward_kvcache(a), StatusCode::kInvalidArgument, "k_descale must have shape (2, 2)");
  }
  {
    KVCacheArgs a = args();  // rotary with an all-FP8 call
    a.q = view_of(q8.data(), DType::kFloat8E4M3, {2, 1, 4, 16});
    a.k = view_of(kc.data(), DType::kFloat8E4M3, {2, 1, 2, 16});
    a.v = view_of(vc.data(), DType::kFloat8E4M3, {2, 1, 2, 16});
    a.rotary_cos = view_of(rot.data(), DType::kFloat8E4M3, {8, 4});
    a.rotary_sin = view_of(rot.data(), DType::kFloat8E4M3, {8, 4});
    expect_error(forward_kvcache(a), StatusCode::kNotSupported, "rotary_cos/rotary_sin are not supported with float8_e4m3");
    a.rotary_cos = a.rotary_sin = TensorView{};
    a.out.dtype = DType::kFloat16;
    expect_error(forward_kvcache(a), StatusCode::kNotSupported, "out must have dtype bfloat16");
  }
  {
    KVCacheArgs a = args();  // a 16-bit cache takes no descale
    std::vector<uint16_t> kb(kc.size()), vb(kc.size());
    a.k_cache = view_of(kb.data(), DType::kBFloat16, {2, 8, 2, 16});
    a.v_cache = view_of(vb.data(), DType::kBFloat16, {2, 8, 2, 16});
    a.v_descale = view_of(desc.data(), DType::kFloat32, {2, 2});
    expect_error(forward_kvcache(a), StatusCode::kInvalidArgument, "v_descale was given but v has dtype bfloat16");
  }
}

// ---- C ABI ---------------------------------------------------------------------------------------

TEST(Fp8CApi, DescalesReachTheLibraryAndOldLayoutsIgnoreThem) {
  Fp8Spec spec;
  Fp8Problem p = make_problem(spec);
  const Output want = run_cpu(spec, p);
  const auto& s = p.shape;
  std::vector<uint16_t> out(want.out.size());
  flashattn_forward_args c;
  flashattn_forward_args_init(&c);
  c.q = to_c(view_of(p.q8.data(), DType::kFloat8E4M3, {s.batch, p.sq_dense, s.heads, s.head_dim}));
  c.k = to_c(view_of(p.k8.data(), DType::kFloat8E4M3, {s.batch, p.sk_dense, s.heads_k, s.head_dim}));
  c.v = to_c(view_of(p.v8.data(), DType::kFloat8E4M3, {s.batch, p.sk_dense, s.heads_k, s.head_dim_v}));
  c.out = to_c(view_of(out.data(), DType::kBFloat16, {s.batch, p.sq_dense, s.heads, s.head_dim_v}));
  c.q_descale = to_c(view_of(p.qd.data(), DType::kFloat32, {s.batch, s.heads_k}));
  c.k_descale = to_c(view_of(p.kd.data(), DType::kFloat32, {s.batch, s.heads_k}));
  c.v_descale = to_c(view_of(p.vd.data(), DType::kFloat32, {s.batch, s.heads_k}));
  ASSERT_EQ(flashattn_forward(&c), FLASHATTN_OK) << flashattn_last_error();
  for (size_t e = 0; e < out.size(); ++e) ASSERT_EQ(bf16_bits_to_float(out[e]), want.out[e]) << e;

  // A 0.4-layout caller has no descale fields: the factors are 1 (not read).
  c.struct_size = offsetof(flashattn_forward_args, q_descale);
  c.q_descale.ndim = 99;  // garbage past the caller's struct is never looked at
  ASSERT_EQ(flashattn_forward(&c), FLASHATTN_OK) << flashattn_last_error();
  bool differs = false;
  for (size_t e = 0; e < out.size(); ++e) differs |= bf16_bits_to_float(out[e]) != want.out[e];
  EXPECT_TRUE(differs);

  flashattn_kvcache_args kv;
  flashattn_kvcache_args_init(&kv);
  EXPECT_EQ(kv.struct_size, sizeof(flashattn_kvcache_args));
  EXPECT_EQ(kv.q_descale.ndim, 0);
}

// ---- CUDA ----------------------------------------------------------------------------------------

// The FP8 forward on CUDA: the sm90 kernels (src/cuda/sm90/fwd8_kernel.h) on a Hopper GPU,
// NotSupported naming the reason anywhere else.
int cuda_major() {
#if defined(FLASHATTN_WITH_CUDA)
  int major = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) != cudaSuccess) return 0;
  return major;
#else
  return 0;
#endif
}

// Whether the CUDA FP8 forward runs here: a Hopper GPU, not restricted to the sm80 kernels
// (FLASHATTN_CUDA_PATH=sm80; scripts/gpu-check.sh runs the tests under each path). Where it does
// not, the reason a call is declined.
bool fp8_cuda_runs() {
  const char* path = std::getenv("FLASHATTN_CUDA_PATH");
  return cuda_major() == 9 && !(path != nullptr && std::string(path) == "sm80");
}
std::string fp8_cuda_decline_reason() { return cuda_major() == 9 ? "FLASHATTN_CUDA_PATH=sm80" : "Hopper"; }

// The relative precision of one k32 step of the tensor cores' FP8 accumulation, for
// naive_tolerance: about 14 significant bits, taken as 2^-12 (twice the truncation of the 14th).
constexpr double kWgmmaFp8StepEps = 1.0 / 4096.0;

// Against the naive FP8 computation with the CPU test's criterion, widened only by the
// tensor cores' accumulation (naive_tolerance, acc_eps), and against the CPU backend's output
// (each is within its tolerance of the naive one, so they are within the sum). `tested`: the
// backend under test (CUDA; the CPU backend checks this harness without a GPU).
void check_fp8_cuda_case(const Fp8Spec& spec, Backend tested = Backend::kCuda) {
  SCOPED_TRACE(spec.name);
  Fp8Problem p = make_problem(spec);
  Status st;
  const Output gpu = run_fp8(spec, p, tested, false, false, &st);
  if (tested == Backend::kCuda && !fp8_cuda_runs()) {
    expect_error(st, StatusCode::kNotSupported, fp8_cuda_decline_reason());
    return;
  }
  if (tested == Backend::kCuda && cuda_run_head_dim(spec.d, spec.d) != spec.d) {
    expect_error(st, StatusCode::kNotSupported, "head_dim " + std::to_string(spec.d) + " was not built");
    return;
  }
  ASSERT_TRUE(st.ok()) << st.message();
  const auto& s = p.shape;
  const std::vector<double> qd = dequantize(p, p.q8, p.qd, s.cu_seqlens_q, s.heads, s.head_dim);
  const std::vector<double> kd = dequantize(p, p.k8, p.kd, s.cu_seqlens_k, s.heads_k, s.head_dim);
  const std::vector<double> vd = dequantize(p, p.v8, p.vd, s.cu_seqlens_k, s.heads_k, s.head_dim_v);
  const Output naive = run_reference(spec, p, qd, kd, vd, /*round_p=*/true);
  const Output exact = run_reference(spec, p, qd, kd, vd, /*round_p=*/false);
  const Output cpu = run_cpu(spec, p);
  std::vector<double> lse_extra;
  const std::vector<double> tol = naive_tolerance(spec, p, qd, kd, vd, naive.out, kWgmmaFp8StepEps, &lse_extra);
  const std::vector<double> cpu_tol = naive_tolerance(spec, p, qd, kd, vd, naive.out);
  size_t worst = 0, worst_cpu = 0;
  double worst_ratio = 0.0, worst_cpu_ratio = 0.0;
  for (size_t e = 0; e < gpu.out.size(); ++e) {
    ASSERT_FALSE(std::isnan(gpu.out[e])) << "element " << e;
    const double ratio = std::fabs(gpu.out[e] - naive.out[e]) / tol[e];
    if (ratio > worst_ratio) worst_ratio = ratio, worst = e;
    const double cpu_ratio = std::fabs(gpu.out[e] - cpu.out[e]) / (tol[e] + cpu_tol[e]);
    if (cpu_ratio > worst_cpu_ratio) worst_cpu_ratio = cpu_ratio, worst_cpu = e;
  }
  EXPECT_LE(worst_ratio, 1.0) << "element " << worst << ": tested " << gpu.out[worst] << ", naive "
                              << naive.out[worst] << ", tolerance " << tol[worst];
  EXPECT_LE(worst_cpu_ratio, 1.0) << "element " << worst_cpu << ": tested " << gpu.out[worst_cpu] << ", cpu "
                                  << cpu.out[worst_cpu];
  // The LSE: the worst element against its bound, reported whole (the first GPU run's output
  // showed which cases failed but not by how much).
  size_t worst_lse = 0;
  double worst_lse_ratio = 0.0;
  for (size_t e = 0; e < gpu.lse.size(); ++e) {
    if (std::isinf(exact.lse[e])) {
      ASSERT_EQ(gpu.lse[e], exact.lse[e]) << e;
    } else {
      const double bound = 2e-5 * std::max(1.0, std::fabs(exact.lse[e])) + lse_extra[e];
      const double ratio = std::fabs(gpu.lse[e] - exact.lse[e]) / bound;
      if (ratio > worst_lse_ratio) worst_lse_ratio = ratio, worst_lse = e;
    }
  }
  EXPECT_LE(worst_lse_ratio, 1.0) << "LSE element " << worst_lse << ": tested " << gpu.lse[worst_lse] << ", exact "
                                  << exact.lse[worst_lse] << ", extra bound " << lse_extra[worst_lse];
  double err = 0.0, naive_err = 0.0, amax = 0.0;
  for (size_t e = 0; e < gpu.out.size(); ++e) {
    err = std::max(err, std::fabs(gpu.out[e] - exact.out[e]));
    naive_err = std::max(naive_err, std::fabs(naive.out[e] - exact.out[e]));
    amax = std::max(amax, std::fabs(exact.out[e]));
  }
  const double err_bound = 2.0 * naive_err + std::ldexp(amax, -8) + 1e-6;
  EXPECT_LE(err, err_bound) << "max error against float64 of the codes: " << err << ", naive FP8 " << naive_err;
  // Every check's margin in one line (1 = at the bound), also for the cases that pass.
  std::printf("[fp8 %s %s] worst/bound: naive %.3f (element %zu), cpu %.3f, lse %.3f, max error %.3f\n",
              tested == Backend::kCuda ? "cuda" : "harness", spec.name.c_str(), worst_ratio, worst, worst_cpu_ratio,
              worst_lse_ratio, err / err_bound);
  if (tested == Backend::kCuda) {
    const Output orig = run_reference(spec, p, p.q, p.k, p.v, false);
    std::printf("[fp8 cuda %s] RMSE vs float64 of the unquantized inputs: cuda %.3e, cpu %.3e\n", spec.name.c_str(),
                rmse(gpu.out, orig.out), rmse(cpu.out, orig.out));
  }
}

class Fp8CudaForward : public testing::TestWithParam<Fp8Spec> {};

TEST_P(Fp8CudaForward, MatchesNaiveFp8AndCpu) {
  if (!backend_available(Backend::kCuda)) GTEST_SKIP() << "no CUDA device";
  check_fp8_cuda_case(GetParam());
}

// Per head dim the kernels have (64, 128, 256): GQA, causal and windows (the dynamic tile
// feed), ragged varlen lengths (1, 17, 130, 1000: one, partial and many key blocks), softcap
// and ALiBi (the kMods kernels),
// per-(batch, kv head) descales with distinct values (DescaleMode::kPerHead), an expanded
// scalar descale, none, a learnable sink, outliers, several query tiles per head (d128; d256 a
// window, a sink and outliers too).
std::vector<Fp8Spec> cuda_forward_cases() {
  std::vector<Fp8Spec> c;
  for (int d : {128, 64, 256}) {
    const std::string dn = "d" + std::to_string(d) + "_";
    const auto add = [&](Fp8Spec s) {
      s.name = dn + s.name;
      s.d = s.dv = d;
      c.push_back(std::move(s));
    };
    { Fp8Spec s; s.name = "gqa"; s.heads = 8; s.heads_k = 2; s.seqlen_q = 300; s.seqlen_k = 300; add(s); }
    { Fp8Spec s; s.name = "causal"; s.causal = true; s.seqlen_q = 333; s.seqlen_k = 333; add(s); }
    { Fp8Spec s; s.name = "varlen_ragged_causal"; s.varlen_q = {1, 17, 130, 1000}; s.varlen_k = {1, 17, 130, 1000}; s.causal = true; add(s); }
    { Fp8Spec s; s.name = "softcap"; s.softcap = 5.0f; s.seqlen_q = 200; s.seqlen_k = 300; add(s); }
    if (d == 256) {
      // d256's tile has 128 keys, 240 consumer registers and one transposer item per pass
      // (fwd8_narrow_producer): its window kernel, the sink fold and outliers as well.
      { Fp8Spec s; s.name = "window"; s.window_left = 64; s.window_right = 16; s.seqlen_q = 400; s.seqlen_k = 400; add(s); }
      { Fp8Spec s; s.name = "sink_causal"; s.sink = true; s.causal = true; s.seqlen_q = 150; s.seqlen_k = 150; add(s); }
      { Fp8Spec s; s.name = "outliers"; s.outliers = true; s.seqlen_k = 512; add(s); }
    }
    if (d != 128) continue;
    { Fp8Spec s; s.name = "alibi_causal"; s.alibi = true; s.causal = true; s.seqlen_q = 250; s.seqlen_k = 250; add(s); }
    { Fp8Spec s; s.name = "softcap_alibi_window"; s.softcap = 8.0f; s.alibi = true; s.window_left = 50; s.window_right = 10; s.seqlen_q = 300; s.seqlen_k = 300; add(s); }
    { Fp8Spec s; s.name = "causal_sq_lt_sk"; s.causal = true; s.seqlen_q = 100; s.seqlen_k = 700; add(s); }
    { Fp8Spec s; s.name = "causal_sq_gt_sk"; s.causal = true; s.seqlen_q = 200; s.seqlen_k = 90; add(s); }
    { Fp8Spec s; s.name = "window"; s.window_left = 64; s.window_right = 16; s.seqlen_q = 400; s.seqlen_k = 400; add(s); }
    { Fp8Spec s; s.name = "varlen_ragged"; s.varlen_q = {1, 17, 130, 1000}; s.varlen_k = {1000, 130, 17, 1}; add(s); }
    { Fp8Spec s; s.name = "varlen_window_sink"; s.varlen_q = {130, 17}; s.varlen_k = {260, 17}; s.window_left = 40; s.window_right = 0; s.sink = true; add(s); }
    { Fp8Spec s; s.name = "mqa_scalar_descale"; s.heads_k = 1; s.descale = DescaleMode::kScalar; s.seqlen_q = 130; s.seqlen_k = 257; add(s); }
    { Fp8Spec s; s.name = "no_descale"; s.descale = DescaleMode::kNone; add(s); }
    { Fp8Spec s; s.name = "sink_causal"; s.sink = true; s.causal = true; s.seqlen_q = 150; s.seqlen_k = 150; add(s); }
    { Fp8Spec s; s.name = "outliers"; s.outliers = true; s.seqlen_k = 512; add(s); }
    { Fp8Spec s; s.name = "seqlen_1"; s.seqlen_q = 1; s.seqlen_k = 1; add(s); }
  }
  return c;
}

INSTANTIATE_TEST_SUITE_P(Cuda, Fp8CudaForward, testing::ValuesIn(cuda_forward_cases()),
                         [](const testing::TestParamInfo<Fp8Spec>& i) { return i.param.name; });

// The CUDA cases and their criterion hold for the CPU backend in CUDA's place, so that the
// harness is known to hold before a GPU runs it.
TEST(Fp8CudaForwardHarness, HoldsForTheCpuBackend) {
  for (const Fp8Spec& spec : cuda_forward_cases()) check_fp8_cuda_case(spec, Backend::kCpu);
}

// What the CUDA FP8 forward declines: kNotSupported naming the dtype and the reason, nothing
// launched. On a GPU other than Hopper (or under FLASHATTN_CUDA_PATH=sm80) every e4m3 q is
// declined, naming that.
TEST(Fp8Cuda, DeclinesWhatTheKernelsDoNotTake) {
  if (!backend_available(Backend::kCuda)) GTEST_SKIP() << "no CUDA device";
  const bool runs = fp8_cuda_runs();
  const auto declined = [&](const Fp8Spec& spec, const std::string& reason) {
    SCOPED_TRACE(spec.name);
    Fp8Problem p = make_problem(spec);
    Status st;
    run_fp8(spec, p, Backend::kCuda, false, false, &st);
    expect_error(st, StatusCode::kNotSupported, "q has dtype float8_e4m3");
    expect_error(st, StatusCode::kNotSupported, runs ? reason : fp8_cuda_decline_reason());
  };
  { Fp8Spec s; s.name = "head_dim_96"; s.d = s.dv = 96; declined(s, "head_dim 96"); }
  { Fp8Spec s; s.name = "dv_ne_d"; s.d = 128; s.dv = 64; declined(s, "head_dim_v 64"); }

  // forward_kvcache with an e4m3 q (the all-e4m3 mode of "FP8 KV cache") has no CUDA kernel.
  DeviceBuffer q(Backend::kCuda, 2 * 4 * 128), k(Backend::kCuda, 2 * 64 * 2 * 128),
      v(Backend::kCuda, 2 * 64 * 2 * 128), out(Backend::kCuda, 2 * 2 * 4 * 128);
  const Device dev{DeviceType::kCUDA, 0};
  KVCacheArgs c;
  c.q = make_contiguous_view(q.data(), DType::kFloat8E4M3, dev, {2, 1, 4, 128});
  c.k_cache = make_contiguous_view(k.data(), DType::kFloat8E4M3, dev, {2, 64, 2, 128});
  c.v_cache = make_contiguous_view(v.data(), DType::kFloat8E4M3, dev, {2, 64, 2, 128});
  c.out = make_contiguous_view(out.data(), DType::kBFloat16, dev, {2, 1, 4, 128});
  expect_error(forward_kvcache(c), StatusCode::kNotSupported, "q has dtype float8_e4m3");
}

// The e4m3 cache read by 16-bit queries on CUDA (FwdTraits::Fp8Cache): the same call on the CPU
// backend and on CUDA, from the same inputs. The appended rows must be bitwise the CPU's
// (e4m3(x / descale) after rotary, RNE, saturating); the output is held to the reference on the
// dequantized cache (code * descale, exact in float64) with FlashAttention's criterion against
// the naive computation in q's dtype.
struct CudaCacheCase {
  DType dtype = DType::kBFloat16;
  int heads = 8, heads_k = 2, d = 128, seqlen_q = 1, seqlen_new = 0;
  std::vector<int> seqlens = {5, 37, 300, 777};  // ragged: per sequence, rows already cached
  int capacity = 1024;  // a multiple of every page size below
  int page_size = 0;    // 0 = dense
  int rotary_dim = 0;
  bool rotary_interleaved = true;
  bool causal = false;
  int num_splits = 0;
  uint32_t seed = 5;
  std::string name() const {
    return std::string(dtype_name(dtype)) + " d" + std::to_string(d) + " h" + std::to_string(heads) + "/" +
           std::to_string(heads_k) + " sq" + std::to_string(seqlen_q) + " new" + std::to_string(seqlen_new) +
           " page" + std::to_string(page_size) + " rotary" + std::to_string(rotary_dim) +
           (causal ? " causal" : "") + " splits" + std::to_string(num_splits);
  }
};

// One backend's tensors of a CudaCacheCase, filled identically on every backend.
struct CacheTensors {
  Arena q, kn, vn, cos, sin, kc, vc, seqlens, table, kd, vd, out, lse;
  int rows0, rows1;  // the cache's first two dimensions: (batch, capacity) or (pages, page_size)
  std::vector<int32_t> page_of;  // logical page (b * max_blocks + j) -> stored page

  CacheTensors(Backend be, const CudaCacheCase& cc)
      : q(be, cc.dtype, int64_t(cc.seqlens.size()) * cc.seqlen_q * cc.heads * cc.d),
        kn(be, cc.dtype, std::max<int64_t>(1, int64_t(cc.seqlens.size()) * cc.seqlen_new * cc.heads_k * cc.d)),
        vn(be, cc.dtype, std::max<int64_t>(1, int64_t(cc.seqlens.size()) * cc.seqlen_new * cc.heads_k * cc.d)),
        cos(be, cc.dtype, std::max<int64_t>(1, int64_t(cc.capacity) * cc.rotary_dim / 2)),
        sin(be, cc.dtype, std::max<int64_t>(1, int64_t(cc.capacity) * cc.rotary_dim / 2)),
        kc(be, DType::kUInt8, int64_t(cc.seqlens.size()) * cc.capacity * cc.heads_k * cc.d),
        vc(be, DType::kUInt8, int64_t(cc.seqlens.size()) * cc.capacity * cc.heads_k * cc.d),
        seqlens(be, DType::kInt32, int64_t(cc.seqlens.size())),
        table(be, DType::kInt32, std::max<int64_t>(1, cc.page_size > 0 ? int64_t(cc.seqlens.size()) * (cc.capacity / cc.page_size) : 1)),
        kd(be, DType::kFloat32, int64_t(cc.seqlens.size()) * cc.heads_k),
        vd(be, DType::kFloat32, int64_t(cc.seqlens.size()) * cc.heads_k),
        out(be, cc.dtype, int64_t(cc.seqlens.size()) * cc.seqlen_q * cc.heads * cc.d),
        lse(be, DType::kFloat32, int64_t(cc.seqlens.size()) * cc.heads * cc.seqlen_q) {
    const int B = static_cast<int>(cc.seqlens.size());
    std::mt19937 rng(cc.seed);
    std::normal_distribution<double> g(0.0, 1.0);
    std::uniform_real_distribution<double> u(0.004, 0.03);
    for (int64_t i = 0; i < q.numel(); ++i) q.set(i, g(rng));
    for (int64_t i = 0; i < kn.numel(); ++i) kn.set(i, g(rng) * 3.0);
    for (int64_t i = 0; i < vn.numel(); ++i) vn.set(i, g(rng) * 3.0);
    const int half = cc.rotary_dim / 2;
    for (int64_t r = 0; r < (half > 0 ? cc.capacity : 0); ++r) {
      for (int i = 0; i < half; ++i) {
        const double angle = double(r) * std::pow(10000.0, -2.0 * i / cc.rotary_dim);
        cos.set(r * half + i, std::cos(angle));
        sin.set(r * half + i, std::sin(angle));
      }
    }
    if (half == 0) cos.set(0, 0.0), sin.set(0, 0.0);
    if (kn.numel() == 1 && cc.seqlen_new == 0) kn.set(0, 0.0), vn.set(0, 0.0);
    for (int64_t i = 0; i < kd.numel(); ++i) kd.set(i, u(rng)), vd.set(i, u(rng));
    // Cache codes of N(0, 40) (finite: ref_encode saturates), in dense order first.
    std::vector<uint8_t> kdense(static_cast<size_t>(kc.numel())), vdense(kdense.size());
    for (auto& x : kdense) x = ref_encode(g(rng) * 40.0);
    for (auto& x : vdense) x = ref_encode(g(rng) * 40.0);
    for (int b = 0; b < B; ++b) seqlens.set(b, cc.seqlens[static_cast<size_t>(b)]);
    if (cc.page_size > 0) {
      const int per_seq = cc.capacity / cc.page_size, pages = B * per_seq;
      page_of.resize(static_cast<size_t>(pages));
      for (int i = 0; i < pages; ++i) page_of[static_cast<size_t>(i)] = i;
      std::mt19937 shuffle_rng(cc.seed + 1);
      std::shuffle(page_of.begin(), page_of.end(), shuffle_rng);
      for (int i = 0; i < pages; ++i) table.set(i, page_of[static_cast<size_t>(i)]);
      rows0 = pages, rows1 = cc.page_size;
    } else {
      table.set(0, 0);
      rows0 = B, rows1 = cc.capacity;
    }
    const int64_t row_elems = int64_t(cc.heads_k) * cc.d;
    for (int b = 0; b < B; ++b) {
      for (int64_t r = 0; r < cc.capacity; ++r) {
        const int64_t at = stored_row(cc, b, r) * row_elems, from = (int64_t(b) * cc.capacity + r) * row_elems;
        for (int64_t e = 0; e < row_elems; ++e) {
          kc.set(at + e, kdense[static_cast<size_t>(from + e)]);
          vc.set(at + e, vdense[static_cast<size_t>(from + e)]);
        }
      }
    }
    for (int64_t i = 0; i < out.numel(); ++i) out.set(i, 0.0);
    for (int64_t i = 0; i < lse.numel(); ++i) lse.set(i, 0.0);
    for (Arena* a : {&q, &kn, &vn, &cos, &sin, &kc, &vc, &seqlens, &table, &kd, &vd, &out, &lse}) a->upload();
  }

  // The stored row (first index into (rows0 * rows1)) of sequence b's cache row r.
  int64_t stored_row(const CudaCacheCase& cc, int b, int64_t r) const {
    if (cc.page_size == 0) return int64_t(b) * cc.capacity + r;
    const int per_seq = cc.capacity / cc.page_size;
    return int64_t(page_of[static_cast<size_t>(b * per_seq + r / cc.page_size)]) * cc.page_size + r % cc.page_size;
  }

  Status run(Backend be, const CudaCacheCase& cc) {
    const Device dev = device_of(be);
    const int64_t B = int64_t(cc.seqlens.size()), hk = cc.heads_k, d = cc.d;
    KVCacheArgs a;
    a.q = make_contiguous_view(q.device_data(), cc.dtype, dev, {B, cc.seqlen_q, cc.heads, d});
    a.k_cache = make_contiguous_view(kc.device_data(), DType::kFloat8E4M3, dev, {rows0, rows1, hk, d});
    a.v_cache = make_contiguous_view(vc.device_data(), DType::kFloat8E4M3, dev, {rows0, rows1, hk, d});
    if (cc.seqlen_new > 0) {
      a.k = make_contiguous_view(kn.device_data(), cc.dtype, dev, {B, cc.seqlen_new, hk, d});
      a.v = make_contiguous_view(vn.device_data(), cc.dtype, dev, {B, cc.seqlen_new, hk, d});
    }
    if (cc.rotary_dim > 0) {
      a.rotary_cos = make_contiguous_view(cos.device_data(), cc.dtype, dev, {cc.capacity, cc.rotary_dim / 2});
      a.rotary_sin = make_contiguous_view(sin.device_data(), cc.dtype, dev, {cc.capacity, cc.rotary_dim / 2});
      a.rotary_interleaved = cc.rotary_interleaved;
    }
    a.cache_seqlens = make_contiguous_view(seqlens.device_data(), DType::kInt32, dev, {B});
    if (cc.page_size > 0) {
      a.block_table = make_contiguous_view(table.device_data(), DType::kInt32, dev, {B, cc.capacity / cc.page_size});
    }
    a.k_descale = make_contiguous_view(kd.device_data(), DType::kFloat32, dev, {B, hk});
    a.v_descale = make_contiguous_view(vd.device_data(), DType::kFloat32, dev, {B, hk});
    a.out = make_contiguous_view(out.device_data(), cc.dtype, dev, {B, cc.seqlen_q, cc.heads, d});
    a.lse = make_contiguous_view(lse.device_data(), DType::kFloat32, dev, {B, cc.heads, cc.seqlen_q});
    a.causal = cc.causal;
    a.num_splits = cc.num_splits;
    const Status st = forward_kvcache(a);
    if (st.ok()) {
      for (Arena* x : {&kc, &vc, &out, &lse}) x->download();
    }
    return st;
  }
};

// `tested`: the backend under test (CUDA; the CPU backend checks this harness without a GPU).
void check_cuda_cache_case(const CudaCacheCase& cc, Backend tested = Backend::kCuda) {
  SCOPED_TRACE(cc.name());
  CacheTensors cpu(Backend::kCpu, cc), gpu(tested, cc);
  const Status sc = cpu.run(Backend::kCpu, cc);
  ASSERT_TRUE(sc.ok()) << sc.message();
  const Status sg = gpu.run(tested, cc);
  ASSERT_TRUE(sg.ok()) << sg.message();
  // The append: bitwise the CPU's (and everything else untouched).
  ASSERT_EQ(gpu.kc.bytes(), cpu.kc.bytes()) << "k_cache after the append";
  ASSERT_EQ(gpu.vc.bytes(), cpu.vc.bytes()) << "v_cache after the append";

  // Reference: q rotated (as the backend stores it: in q's dtype) against the dequantized rows
  // [0, seqlen + seqlen_new) of each sequence.
  const int B = static_cast<int>(cc.seqlens.size()), H = cc.heads, Hk = cc.heads_k, D = cc.d, sq = cc.seqlen_q;
  const int half = cc.rotary_dim / 2;
  HostProblem hp;
  hp.shape.batch = B;
  hp.shape.heads = H;
  hp.shape.heads_k = Hk;
  hp.shape.head_dim = D;
  hp.shape.head_dim_v = D;
  hp.shape.cu_seqlens_q = {0};
  hp.shape.cu_seqlens_k = {0};
  for (int b = 0; b < B; ++b) {
    const int len = cc.seqlens[static_cast<size_t>(b)] + cc.seqlen_new;
    hp.shape.cu_seqlens_q.push_back(hp.shape.cu_seqlens_q.back() + sq);
    hp.shape.cu_seqlens_k.push_back(hp.shape.cu_seqlens_k.back() + len);
    for (int t = 0; t < sq; ++t) {
      const int64_t pos = cc.seqlens[static_cast<size_t>(b)] + (cc.causal ? t : 0);
      for (int h = 0; h < H; ++h) {
        const int64_t qo = ((int64_t(b) * sq + t) * H + h) * D;
        std::vector<double> row(static_cast<size_t>(D));
        for (int c = 0; c < D; ++c) row[static_cast<size_t>(c)] = cpu.q.get(qo + c);
        for (int i = 0; i < half; ++i) {
          const int ia = cc.rotary_interleaved ? 2 * i : i, ib = cc.rotary_interleaved ? 2 * i + 1 : i + half;
          const double co = cpu.cos.get(pos * half + i), si = cpu.sin.get(pos * half + i);
          const double x = row[static_cast<size_t>(ia)], y = row[static_cast<size_t>(ib)];
          row[static_cast<size_t>(ia)] = round_to(cc.dtype, x * co - y * si);
          row[static_cast<size_t>(ib)] = round_to(cc.dtype, x * si + y * co);
        }
        hp.q.insert(hp.q.end(), row.begin(), row.end());
      }
    }
    for (int64_t r = 0; r < len; ++r) {
      const int64_t at = cpu.stored_row(cc, b, r) * Hk * D;
      for (int h = 0; h < Hk; ++h) {
        const double kf = cpu.kd.get(b * Hk + h), vf = cpu.vd.get(b * Hk + h);
        for (int c = 0; c < D; ++c) {
          hp.k.push_back(ref_decode(cpu.kc.bytes()[static_cast<size_t>(at + h * D + c)]) * kf);
          hp.v.push_back(ref_decode(cpu.vc.bytes()[static_cast<size_t>(at + h * D + c)]) * vf);
        }
      }
    }
  }
  hp.opt.scale = 1.0 / std::sqrt(static_cast<double>(D));
  hp.opt.window_right = cc.causal ? 0 : -1;
  const Results ref = run_reference(hp, false);
  const Results lowp = run_naive_lowp(hp, cc.dtype, false);
  std::vector<double> out_gpu, out_cpu, lse_gpu(static_cast<size_t>(gpu.lse.numel()));
  for (int64_t i = 0; i < gpu.out.numel(); ++i) out_gpu.push_back(gpu.out.get(i)), out_cpu.push_back(cpu.out.get(i));
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < H; ++h) {
      for (int t = 0; t < sq; ++t) {
        lse_gpu[static_cast<size_t>(h) * B * sq + b * sq + t] = gpu.lse.get((int64_t(b) * H + h) * sq + t);
      }
    }
  }
  EXPECT_TRUE(meets_criterion("out (cuda)", cc.dtype, out_gpu, ref.out, lowp.out));
  EXPECT_TRUE(meets_criterion("lse (cuda)", cc.dtype, lse_gpu, ref.lse, lowp.lse));
  EXPECT_TRUE(meets_criterion("out (cpu, same inputs)", cc.dtype, out_cpu, ref.out, lowp.out));
}

// The head dims the CUDA backend runs an e4m3 cache at (cuda/common/variants.h kFp8CacheHeadDims).
bool cuda_fp8_cache_head_dim(int d) { return d == 64 || d == 128 || d == 256; }

class Fp8CudaCache : public testing::TestWithParam<CudaCacheCase> {};

TEST_P(Fp8CudaCache, MatchesCpuAppendAndReference) {
  if (!backend_available(Backend::kCuda)) GTEST_SKIP() << "no CUDA device";
  const int d = GetParam().d;
  if (cuda_run_head_dim(d, d) != d) GTEST_SKIP() << "head_dim " << d << " not built (FLASHATTN_CUDA_HEAD_DIMS)";
  // A dtype the build trimmed is kNotSupported for its own reason, which these cases do not expect
  // (H200, 2026-12-02, a bf16-only build: the float16 cases 30 and 31 failed; the rest of the
  // output was cut).
  if (!cuda_dtype_built(GetParam().dtype)) GTEST_SKIP() << "dtype not built (FLASHATTN_CUDA_DTYPES)";
  if (!cuda_fp8_cache_head_dim(d)) {
    // Built only where it has run on a GPU (cuda/common/variants.h kFp8CacheHeadDims): the other
    // head dims are a clear kNotSupported, not a fallback.
    CacheTensors gpu(Backend::kCuda, GetParam());
    expect_error(gpu.run(Backend::kCuda, GetParam()), StatusCode::kNotSupported, "head_dim " + std::to_string(d));
    return;
  }
  check_cuda_cache_case(GetParam());
}

std::vector<CudaCacheCase> cuda_cache_cases() {
  std::vector<CudaCacheCase> v;
  for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
    for (int d : {64, 128, 256}) {
      for (int page : {0, 1, 16, 256}) {
        CudaCacheCase c;  // decode: one token, GQA 4, ragged lengths, folded group rows
        c.dtype = dt, c.d = d, c.page_size = page;
        v.push_back(c);
        c.seqlen_new = 1, c.rotary_dim = d / 2, c.causal = true;  // append with rotary
        v.push_back(c);
      }
      CudaCacheCase c;  // speculative: 4 tokens appended and attended, causal, non-interleaved rotary
      c.dtype = dt, c.d = d, c.seqlen_q = 4, c.seqlen_new = 4, c.causal = true, c.rotary_dim = d;
      c.rotary_interleaved = false, c.page_size = 16;
      v.push_back(c);
      c.seqlen_q = c.seqlen_new = 40, c.page_size = 0;  // more rows than the decode tile
      v.push_back(c);
    }
  }
  // Split-KV forced (and off): MHA unsplit, MQA in 3 splits, GQA 8 in 16 splits over pages.
  const struct {
    int splits, heads, heads_k, page;
  } split_cases[] = {{1, 8, 8, 0}, {3, 8, 1, 0}, {16, 16, 2, 16}};
  for (const auto& sc : split_cases) {
    CudaCacheCase c;
    c.num_splits = sc.splits, c.heads = sc.heads, c.heads_k = sc.heads_k, c.page_size = sc.page;
    c.seqlen_new = 2, c.rotary_dim = 64, c.causal = true;
    v.push_back(c);
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(Cases, Fp8CudaCache, testing::ValuesIn(cuda_cache_cases()));

// The harness above (inputs, paging, rotary of q, reference, criterion) with the CPU backend in
// CUDA's place, so that it is known to hold before a GPU runs it.
TEST(Fp8CudaCacheHarness, HoldsForTheCpuBackend) {
  for (const CudaCacheCase& c : cuda_cache_cases()) {
    if (c.dtype == DType::kBFloat16 && (c.page_size == 16 || c.seqlen_q > 1 || c.num_splits > 0)) {
      check_cuda_cache_case(c, Backend::kCpu);
    }
  }
}

// An e4m3 cache at a head dim without Fp8Cache kernels: kNotSupported naming head_dim.
TEST(Fp8Cuda, CacheHeadDimWithoutKernelsIsNotSupported) {
  if (!backend_available(Backend::kCuda)) GTEST_SKIP() << "no CUDA device";
  CudaCacheCase cc;
  cc.d = 96;
  cc.capacity = 64;
  cc.seqlens = {3, 9};
  CacheTensors gpu(Backend::kCuda, cc);
  expect_error(gpu.run(Backend::kCuda, cc), StatusCode::kNotSupported, "head_dim 96");
}

}  // namespace
}  // namespace flashattn::test
