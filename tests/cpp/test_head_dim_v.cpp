// head_dim_v != head_dim (issue 19) on every backend. The CPU backend runs any pair; the CUDA
// backend runs a pair as the same-d problem at D = the smallest built head dim >= both, on
// zero-padded copies of the side narrower than D (docs/SEMANTICS.md, "Head dims on CUDA"),
// except the forward at 192/128 where the Hopper forward takes it: that runs unpadded on its own
// kernels (sm90 FwdTraits kHeadDimV), and its backward pads the out it wrote. ctest runs this
// file under FLASHATTN_CUDA_PATH=auto and =sm90 (scripts/gpu-check.sh); under sm90 every 192/128
// case without dropout or requested splits reaches those kernels, whatever its length.
//   * PairsMatchTheReference: forward and backward (O, LSE, dQ, dK, dV, dsink) against the
//     float64 reference at the pairs models use (192/128) and at pairs that pad either side
//     (128/64: v-side; 64/128: q-side; 80/48: both), with ragged lengths, causal and windows,
//     GQA, varlen with empty sequences, decode and split-KV, score modifiers, dropout, sinks
//     and strided layouts. CUDA cases skip without a GPU.
//   * PaddedCallIsCallerPadding (CUDA): the padded call is bit for bit the call a user makes
//     after zero-padding the narrow side to D, with a softmax scale of the original head dim.
//   * AboveTheCudaLimitIsNotSupported (CUDA): MLA decode (576/512) and any head dim above 256
//     are kNotSupported naming the head dim.
//   * Sm90BackwardRunsUnpaddedAt192_128 (CUDA): on a Hopper GPU the 192/128 backward without
//     softcap, ALiBi or dropout runs on its own kernels, unpadded; with them, padded.
#include <gtest/gtest.h>

#if defined(FLASHATTN_WITH_CUDA)
#include <cuda_runtime.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "test_util.h"

namespace flashattn::test {
namespace {

struct Case {
  std::string name;  // [A-Za-z0-9_]
  ProblemSpec spec;
};

// Work per case, sum_b(seqlen_q * seqlen_k) * heads * (head_dim + head_dim_v), stays under
// 60M so that the float64 reference and the naive emulation stay cheap on a 2-core CI machine.
std::vector<Case> cases() {
  std::vector<Case> cs;
  uint32_t seed = 19000;
  auto add = [&](const std::string& name, ProblemSpec s) {
    s.data_seed = seed++;
    cs.push_back({name, s});
  };
  using D = DType;
  ProblemSpec s;

  // DeepSeek-V3 prefill: q/k 192, v 128 (CUDA: v, out, dout, dv padded to 192).
  s = ProblemSpec::dense(D::kBFloat16, 1, 300, 129, 4, 2, 192, 128);
  s.causal = true;  // seqlen_q > seqlen_k: the first rows see no key
  add("192_128_causal_gqa_bf16", s);
  add("192_128_f16", ProblemSpec::dense(D::kFloat16, 2, 129, 129, 2, 2, 192, 128));
  add("192_128_q1_k1_f16", ProblemSpec::dense(D::kFloat16, 2, 1, 1, 2, 1, 192, 128));
  s = ProblemSpec{};
  s.dtype = D::kBFloat16, s.varlen = true;
  s.seqlens_q = {129, 0, 64, 7}, s.seqlens_k = {300, 64, 0, 7};
  s.heads = 4, s.heads_k = 2, s.head_dim = 192, s.head_dim_v = 128;
  s.causal = true, s.deterministic = true;
  s.layout = Layout::kPadded;
  add("192_128_varlen_bf16", s);
  s = ProblemSpec::dense(D::kBFloat16, 2, 1, 300, 16, 2, 192, 128);  // CUDA: the GQA decode fold
  s.sink = Sink::kRandom, s.num_splits = 1;
  add("192_128_decode_gqa_bf16", s);
  s.num_splits = 3;  // and the split-KV combine
  add("192_128_decode_splits_bf16", s);
  s = ProblemSpec::dense(D::kFloat16, 1, 129, 300, 2, 2, 192, 128);
  s.causal = true, s.num_splits = 4, s.sink = Sink::kLarge;
  add("192_128_splits_causal_f16", s);
  s = ProblemSpec::dense(D::kBFloat16, 1, 129, 129, 2, 1, 192, 128);
  s.window_left = 40, s.window_right = 7;
  s.softcap = 5.0f, s.q_scale = 3.0, s.alibi = Alibi::kBatchHeads;
  s.dropout_p = 0.2f, s.dropout_seed = 19, s.dropout_offset = 0x500000003ull;
  s.sink = Sink::kRandom;
  add("192_128_mods_dropout_sink_bf16", s);
  s = ProblemSpec::dense(D::kFloat16, 2, 64, 129, 4, 4, 192, 128);
  s.layout = Layout::kHeadMajor;
  add("192_128_head_major_f16", s);
  // The Hopper 192/128 kernels' other variants: a window (the dynamic tile feed) with GQA and
  // ragged lengths; softcap and ALiBi without dropout (FwdTraits kMods); a varlen batch with an
  // empty sequence and a sink, no mask (fixed rounds).
  s = ProblemSpec::dense(D::kBFloat16, 1, 180, 257, 4, 2, 192, 128);
  s.window_left = 100, s.window_right = 0;
  add("192_128_window_gqa_bf16", s);
  s = ProblemSpec::dense(D::kFloat16, 1, 129, 257, 2, 1, 192, 128);
  s.softcap = 5.0f, s.alibi = Alibi::kHeads, s.causal = true;
  add("192_128_softcap_alibi_causal_f16", s);
  s = ProblemSpec{};
  s.dtype = D::kFloat16, s.varlen = true;
  s.seqlens_q = {150, 0, 130, 3}, s.seqlens_k = {129, 40, 150, 1};
  s.heads = 4, s.heads_k = 1, s.head_dim = 192, s.head_dim_v = 128;
  s.sink = Sink::kRandom;
  add("192_128_varlen_sink_mqa_f16", s);

  // head_dim_v < head_dim at a size the Hopper forward has (CUDA: run at 128, so the sm90
  // kernels may take the padded call).
  s = ProblemSpec::dense(D::kBFloat16, 1, 257, 300, 4, 1, 128, 64);
  s.causal = true;
  add("128_64_causal_mqa_bf16", s);
  s = ProblemSpec::dense(D::kFloat16, 2, 129, 64, 6, 2, 128, 64);
  s.window_left = 20, s.window_right = 10, s.sink = Sink::kRandom, s.deterministic = true;
  add("128_64_window_sink_f16", s);
  s = ProblemSpec{};
  s.dtype = D::kBFloat16, s.varlen = true;
  s.seqlens_q = {7, 0, 65}, s.seqlens_k = {64, 9, 130};
  s.heads = 4, s.heads_k = 1, s.head_dim = 128, s.head_dim_v = 64;
  s.causal = true, s.window_left = 20;
  add("128_64_varlen_bf16", s);
  add("256_128_bf16", ProblemSpec::dense(D::kBFloat16, 1, 129, 129, 2, 1, 256, 128));

  // head_dim_v > head_dim (CUDA: q, k, dq, dk padded).
  s = ProblemSpec::dense(D::kFloat16, 2, 129, 64, 4, 2, 64, 128);
  s.causal = true;
  add("64_128_causal_f16", s);
  s = ProblemSpec{};
  s.dtype = D::kBFloat16, s.varlen = true;
  s.seqlens_q = {129, 1, 0}, s.seqlens_k = {129, 300, 7};
  s.heads = 2, s.heads_k = 1, s.head_dim = 64, s.head_dim_v = 128;
  s.deterministic = true;
  add("64_128_varlen_bf16", s);
  add("32_256_f16", ProblemSpec::dense(D::kFloat16, 1, 64, 129, 2, 2, 32, 256));

  // Neither head dim built (CUDA: both sides padded, so strides need not be multiples of 8).
  s = ProblemSpec::dense(D::kFloat16, 2, 70, 129, 4, 2, 80, 48);
  s.causal = true, s.layout = Layout::kPaddedOdd;
  add("80_48_padded_odd_f16", s);
  s = ProblemSpec::dense(D::kBFloat16, 1, 129, 200, 2, 2, 160, 128);
  s.sink = Sink::kHuge;
  add("160_128_sink_bf16", s);
  return cs;
}

using Param = std::tuple<Backend, size_t>;

class HeadDimV : public testing::TestWithParam<Param> {};

TEST_P(HeadDimV, PairsMatchTheReference) {
  const auto [backend, index] = GetParam();
  FLASHATTN_SKIP_IF_UNAVAILABLE(backend);
  const CaseOutcome oc = check_problem(backend, cases()[index].spec, /*with_backward=*/true);
  if (oc.skipped) GTEST_SKIP() << oc.skip_reason;
}

std::vector<size_t> case_indices() {
  std::vector<size_t> idx(cases().size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
  return idx;
}

INSTANTIATE_TEST_SUITE_P(All, HeadDimV,
                         testing::Combine(testing::ValuesIn(all_backends()),
                                          testing::ValuesIn(case_indices())),
                         [](const testing::TestParamInfo<Param>& param_info) {
                           return std::string(backend_name(std::get<0>(param_info.param))) + "_" +
                                  cases()[std::get<1>(param_info.param)].name;
                         });

TEST(HeadDimVCases, NamesAreUniqueAndEveryCaseDiffers) {
  std::vector<std::string> names;
  for (const Case& c : cases()) {
    EXPECT_NE(c.spec.head_dim, c.spec.head_dim_v) << c.name;
    for (const std::string& n : names) EXPECT_NE(n, c.name);
    names.push_back(c.name);
  }
}

// ---- the padded call is the caller's zero padding, bit for bit (CUDA) -------------------------

// Rows of width `from` -> rows of width `to`: truncated, or extended with zeros.
std::vector<double> resize_rows(const std::vector<double>& x, int from, int to) {
  const size_t rows = x.size() / static_cast<size_t>(from);
  std::vector<double> y(rows * static_cast<size_t>(to), 0.0);
  const int w = from < to ? from : to;
  for (size_t r = 0; r < rows; ++r) {
    for (int c = 0; c < w; ++c) y[r * to + c] = x[r * from + c];
  }
  return y;
}

testing::AssertionResult same_bits(const char* what, const std::vector<double>& a,
                                   const std::vector<double>& b) {
  if (a.size() != b.size()) {
    return testing::AssertionFailure() << what << ": " << a.size() << " vs " << b.size() << " elements";
  }
  size_t differ = 0, first = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(double)) != 0 && differ++ == 0) first = i;
  }
  if (differ == 0) return testing::AssertionSuccess();
  return testing::AssertionFailure() << what << ": " << differ << " of " << a.size()
                                     << " elements differ, first at " << first << " (" << a[first]
                                     << " vs " << b[first] << ")";
}

struct RunResult {
  std::vector<double> out, lse, dq, dk, dv, dsink;
};

// Forward and backward of spec on CUDA; false (with *skip set when the build cannot run it).
bool run_cuda(const ProblemSpec& spec, const HostProblem& host, RunResult* r, std::string* skip) {
  DeviceProblem dev(Backend::kCuda, spec, host);
  Status s = forward(dev.forward_args());
  if (s.ok()) {
    dev.download_forward();
    s = backward(dev.backward_args());
  }
  if (!s.ok()) {
    if (s.code() == StatusCode::kNotSupported && cuda_may_not_support(spec)) {
      *skip = s.message();
    } else {
      ADD_FAILURE() << status_code_name(s.code()) << ": " << s.message() << "\n  " << spec.describe();
    }
    return false;
  }
  dev.download_backward();
  *r = RunResult{dev.out(), dev.lse(), dev.dq(), dev.dk(), dev.dv(), dev.dsink()};
  return true;
}

// One per padded side and path: v-side (192/128 causal GQA with a sink; 128/64 long enough that
// the sm90 forward takes it in the default mode; the decode fold with split-KV), q-side
// (64/128 varlen), both (80/48). Deterministic, so that dQ is reproducible. The 192/128 cases
// request key splits, which keep their forward on the padded sm80 path in every mode: without
// them FLASHATTN_CUDA_PATH=sm90 runs 192/128 on its own kernels, unpadded, with 128-key blocks
// against the padded d192 kernel's 112 (the same values, not the same bits; the reference
// cases above check it).
std::vector<Case> bitwise_cases() {
  std::vector<Case> cs;
  uint32_t seed = 19500;
  auto add = [&](const std::string& name, ProblemSpec s) {
    s.data_seed = seed++;
    s.deterministic = true;
    cs.push_back({name, s});
  };
  using D = DType;
  ProblemSpec s = ProblemSpec::dense(D::kBFloat16, 1, 300, 129, 4, 2, 192, 128);
  s.causal = true, s.sink = Sink::kRandom, s.num_splits = 2;
  add("192_128_causal_sink_splits", s);
  s = ProblemSpec::dense(D::kBFloat16, 2, 1024, 1537, 16, 4, 128, 64);
  s.causal = true;
  add("128_64_long_causal", s);
  s = ProblemSpec::dense(D::kFloat16, 2, 1, 300, 16, 2, 192, 128);
  s.num_splits = 3, s.sink = Sink::kLarge;
  add("192_128_decode_splits", s);
  s = ProblemSpec{};
  s.dtype = D::kFloat16, s.varlen = true;
  s.seqlens_q = {129, 1, 0}, s.seqlens_k = {129, 300, 7};
  s.heads = 4, s.heads_k = 2, s.head_dim = 64, s.head_dim_v = 128;
  s.window_left = 30, s.window_right = 5;
  add("64_128_varlen_window", s);
  s = ProblemSpec::dense(D::kBFloat16, 2, 70, 129, 4, 2, 80, 48);
  s.dropout_p = 0.25f, s.dropout_seed = 3, s.dropout_offset = 8;
  add("80_48_dropout", s);
  return cs;
}

TEST(HeadDimVCuda, PaddedCallIsCallerPadding) {
  FLASHATTN_SKIP_IF_UNAVAILABLE(Backend::kCuda);
  int ran = 0;
  std::string skipped;
  for (const Case& c : bitwise_cases()) {
    SCOPED_TRACE(c.name);
    const ProblemSpec& spec = c.spec;
    const int run_dim = cuda_run_head_dim(spec.head_dim, spec.head_dim_v);
    if (run_dim == 0) {
      skipped = "no built head dim >= " + std::to_string(std::max(spec.head_dim, spec.head_dim_v));
      continue;
    }
    // The same problem as the caller would pad it: every operand at run_dim, the extra columns
    // zero, and the scale of the original head dim (the library's default, rounded the same way).
    ProblemSpec padded = spec;
    padded.head_dim = padded.head_dim_v = run_dim;
    padded.softmax_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(spec.head_dim)));
    const HostProblem host = make_host_problem(spec);
    HostProblem host_padded = host;
    host_padded.shape.head_dim = host_padded.shape.head_dim_v = run_dim;
    host_padded.q = resize_rows(host.q, spec.head_dim, run_dim);
    host_padded.k = resize_rows(host.k, spec.head_dim, run_dim);
    host_padded.v = resize_rows(host.v, spec.head_dim_v, run_dim);
    host_padded.dout = resize_rows(host.dout, spec.head_dim_v, run_dim);
    host_padded.opt.scale = padded.softmax_scale;

    RunResult a, b;
    if (!run_cuda(spec, host, &a, &skipped) || !run_cuda(padded, host_padded, &b, &skipped)) continue;
    ++ran;
    EXPECT_TRUE(same_bits("out", a.out, resize_rows(b.out, run_dim, spec.head_dim_v)));
    EXPECT_TRUE(same_bits("lse", a.lse, b.lse));
    EXPECT_TRUE(same_bits("dq", a.dq, resize_rows(b.dq, run_dim, spec.head_dim)));
    EXPECT_TRUE(same_bits("dk", a.dk, resize_rows(b.dk, run_dim, spec.head_dim)));
    EXPECT_TRUE(same_bits("dv", a.dv, resize_rows(b.dv, run_dim, spec.head_dim_v)));
    EXPECT_TRUE(same_bits("dsink", a.dsink, b.dsink));
    // The caller-padded run's own extra output columns are zero (P times zero V columns).
    int64_t nonzero = 0;
    for (size_t r = 0; r < b.out.size() / static_cast<size_t>(run_dim); ++r) {
      for (int col = spec.head_dim_v; col < run_dim; ++col) nonzero += b.out[r * run_dim + col] != 0.0;
    }
    EXPECT_EQ(nonzero, 0) << "out columns past head_dim_v in the caller-padded run";
  }
  if (ran == 0) GTEST_SKIP() << skipped;
}

// ---- the Hopper backward at 192/128 --------------------------------------------------------------

// On a Hopper GPU with the sm90 kernels (FLASHATTN_CUDA_PATH auto or sm90) a 192/128 backward
// without softcap, ALiBi, dropout or a block mask runs on the sm90 backward's 192/128 kernels,
// unpadded (cuda_backend.cu native_head_dim_v_backward, which detail::native_head_dim_v_backward_calls
// counts); with them it is padded to 192. Elsewhere no backward runs unpadded. The values of the
// same cases: PairsMatchTheReference; the bits against the padded d192 call: PaddedCallIsCallerPadding.
TEST(HeadDimVCuda, Sm90BackwardRunsUnpaddedAt192_128) {
  FLASHATTN_SKIP_IF_UNAVAILABLE(Backend::kCuda);
  bool hopper = false;
#if defined(FLASHATTN_WITH_CUDA) && defined(FLASHATTN_TEST_CUDA_SM90)
  int major = 0;
  const char* path = std::getenv("FLASHATTN_CUDA_PATH");
  hopper = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) == cudaSuccess && major == 9 &&
           !(path != nullptr && std::string(path) == "sm80") && !detail::switch_on(detail::Switch::kBwdSm80);
#endif
  int ran = 0;
  std::string skipped;
  for (const Case& c : cases()) {
    const ProblemSpec& spec = c.spec;
    if (spec.head_dim != 192 || spec.head_dim_v != 128) continue;
    SCOPED_TRACE(c.name);
    // The kernels of that shape are the d192 build's: without it the call runs padded to the next
    // built head dim (cuda_run_head_dim).
    const bool native = hopper && cuda_run_head_dim(192, 128) == 192 && spec.softcap == 0.0f &&
                        spec.alibi == Alibi::kNone && spec.dropout_p == 0.0f;
    const unsigned long long before = detail::native_head_dim_v_backward_calls();
    RunResult r;
    if (!run_cuda(spec, make_host_problem(spec), &r, &skipped)) continue;
    ++ran;
    EXPECT_EQ(detail::native_head_dim_v_backward_calls() - before, native ? 1u : 0u);
  }
  if (ran == 0) GTEST_SKIP() << skipped;
}

// ---- limits -----------------------------------------------------------------------------------

// Both head dims are bounded by 256 on CUDA; the message names the one that is too large. The
// CPU backend runs these (test_correctness.cpp: dv_576_512_decode_bf16).
TEST(HeadDimVCuda, AboveTheCudaLimitIsNotSupported) {
  FLASHATTN_SKIP_IF_UNAVAILABLE(Backend::kCuda);
  if (cuda_may_not_support(ProblemSpec::dense(DType::kBFloat16, 1, 4, 33, 2, 1, 64, 64))) {
    GTEST_SKIP() << "bfloat16 was not built (its dtype check would answer first)";
  }
  const struct {
    int d, dv;
    const char* needle;
  } limits[] = {{576, 512, "head_dim 576 is not supported by the CUDA backend"},
                {128, 512, "head_dim_v 512 is not supported by the CUDA backend"},
                {320, 64, "head_dim 320 is not supported by the CUDA backend"}};
  for (const auto& l : limits) {
    SCOPED_TRACE(std::to_string(l.d) + "/" + std::to_string(l.dv));
    ProblemSpec spec = ProblemSpec::dense(DType::kBFloat16, 1, 4, 33, 2, 1, l.d, l.dv);
    spec.data_seed = static_cast<uint32_t>(l.d + l.dv);
    const HostProblem host = make_host_problem(spec);
    DeviceProblem dev(Backend::kCuda, spec, host);
    for (const Status& s : {forward(dev.forward_args()), backward(dev.backward_args())}) {
      EXPECT_EQ(s.code(), StatusCode::kNotSupported) << s.message();
      EXPECT_NE(s.message().find(l.needle), std::string::npos) << s.message();
    }
  }
}

}  // namespace
}  // namespace flashattn::test
