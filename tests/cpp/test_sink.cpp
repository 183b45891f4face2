// Learnable attention sinks (issue 19), per backend: the properties the correctness matrix
// (test_correctness.cpp, which checks values against the reference) does not state.
//   * A sink of -inf is bitwise the same as no sink (forward and backward), including the CUDA
//     split-KV combine and the GQA decode fold.
//   * dsink is bitwise reproducible run to run (a fixed reduction order, never float atomics).
//   * Argument checks name learnable_sink / dsink.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "test_util.h"

namespace flashattn::test {
namespace {

struct SinkCase {
  std::string name;
  ProblemSpec spec;
};

std::vector<SinkCase> sink_cases() {
  std::vector<SinkCase> cs;
  using D = DType;
  ProblemSpec s = ProblemSpec::dense(D::kFloat16, 2, 129, 64, 4, 2, 64, 64);
  s.causal = true;  // empty rows
  cs.push_back({"causal_gqa_f16", s});
  s = ProblemSpec::dense(D::kBFloat16, 1, 300, 300, 2, 1, 128, 128);
  s.window_left = 30, s.window_right = 5;
  s.softcap = 5.0f, s.alibi = Alibi::kHeads;
  s.dropout_p = 0.2f, s.dropout_seed = 5, s.dropout_offset = 9;
  cs.push_back({"window_mods_dropout_bf16", s});
  s = ProblemSpec::dense(D::kBFloat16, 2, 1, 300, 8, 2, 128, 128);  // CUDA: GQA decode fold
  s.num_splits = 1;
  cs.push_back({"decode_fold_bf16", s});
  s.num_splits = 3;  // CUDA: and the split-KV combine
  cs.push_back({"decode_fold_splits_bf16", s});
  s = ProblemSpec::dense(D::kFloat16, 1, 129, 300, 4, 4, 64, 64);
  s.num_splits = 4;
  cs.push_back({"splits_f16", s});
  s = ProblemSpec{};
  s.dtype = D::kFloat32, s.varlen = true;
  s.seqlens_q = {23, 0, 41}, s.seqlens_k = {41, 9, 23};
  s.heads = 6, s.heads_k = 2, s.head_dim = 40, s.head_dim_v = 24;
  cs.push_back({"varlen_dv_f32", s});
  s = ProblemSpec::dense(D::kBFloat16, 1, 129, 129, 4, 2, 192, 128);  // CUDA: v padded to 192
  s.causal = true;
  cs.push_back({"dv_192_128_causal_bf16", s});
  uint32_t seed = 9100;
  for (SinkCase& c : cs) {
    c.spec.deterministic = true;  // CUDA dQ: atomics would differ run to run with or without a sink
    c.spec.data_seed = seed++;
  }
  return cs;
}

using Param = std::tuple<Backend, size_t>;

class SinkProperties : public testing::TestWithParam<Param> {};

struct RunResult {
  std::vector<double> out, lse;
  std::vector<unsigned char> grads;  // dq, dk, dv and (with a sink) dsink bytes
  std::vector<double> dsink;
};

// Runs forward and backward of spec (inputs from host) on backend; false when skipped.
bool run(Backend backend, const ProblemSpec& spec, const HostProblem& host, RunResult* r,
         std::string* skip) {
  DeviceProblem dev(backend, spec, host);
  Status s = forward(dev.forward_args());
  if (s.ok()) {
    dev.download_forward();
    s = backward(dev.backward_args());
  }
  if (!s.ok()) {
    if (backend == Backend::kCuda && s.code() == StatusCode::kNotSupported &&
        cuda_may_not_support(spec)) {
      *skip = s.message();
      return false;
    }
    ADD_FAILURE() << status_code_name(s.code()) << ": " << s.message() << "\n  " << spec.describe();
    return false;
  }
  dev.download_backward();
  r->out = dev.out();
  r->lse = dev.lse();
  r->grads = dev.grad_bytes();
  r->dsink = dev.dsink();
  return true;
}

bool same_bits(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0);
}

TEST_P(SinkProperties, NegInfSinkIsBitwiseNoSink) {
  const auto [backend, index] = GetParam();
  FLASHATTN_SKIP_IF_UNAVAILABLE(backend);
  const SinkCase c = sink_cases()[index];
  ProblemSpec with = c.spec;
  with.sink = Sink::kNegInf;
  const HostProblem host_without = make_host_problem(c.spec);
  const HostProblem host_with = make_host_problem(with);
  ASSERT_EQ(host_with.q, host_without.q);  // the sink draws from its own stream
  RunResult a, b;
  std::string skip;
  if (!run(backend, c.spec, host_without, &a, &skip) || !run(backend, with, host_with, &b, &skip)) {
    if (!skip.empty()) GTEST_SKIP() << skip;
    return;
  }
  EXPECT_TRUE(same_bits(a.out, b.out)) << "out differs; " << with.describe();
  EXPECT_TRUE(same_bits(a.lse, b.lse)) << "lse differs; " << with.describe();
  // grad_bytes of the run with a sink ends with dsink's arena; compare dq, dk, dv only.
  ASSERT_GE(b.grads.size(), a.grads.size());
  EXPECT_EQ(0, std::memcmp(a.grads.data(), b.grads.data(), a.grads.size()))
      << "gradients differ; " << with.describe();
  for (double g : b.dsink) EXPECT_EQ(g, 0.0) << "a sink of -inf has no gradient";
}

TEST_P(SinkProperties, DsinkIsReproducible) {
  const auto [backend, index] = GetParam();
  FLASHATTN_SKIP_IF_UNAVAILABLE(backend);
  ProblemSpec spec = sink_cases()[index].spec;
  spec.sink = Sink::kRandom;
  const HostProblem host = make_host_problem(spec);
  RunResult a, b;
  std::string skip;
  if (!run(backend, spec, host, &a, &skip) || !run(backend, spec, host, &b, &skip)) {
    if (!skip.empty()) GTEST_SKIP() << skip;
    return;
  }
  ASSERT_EQ(a.dsink.size(), static_cast<size_t>(spec.heads));
  EXPECT_TRUE(same_bits(a.out, b.out));
  EXPECT_TRUE(same_bits(a.dsink, b.dsink)) << "dsink differs run to run; " << spec.describe();
  EXPECT_EQ(a.grads, b.grads) << "gradients differ run to run; " << spec.describe();
}

std::vector<size_t> sink_case_indices() {
  std::vector<size_t> idx(sink_cases().size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
  return idx;
}

INSTANTIATE_TEST_SUITE_P(All, SinkProperties,
                         testing::Combine(testing::ValuesIn(all_backends()),
                                          testing::ValuesIn(sink_case_indices())),
                         [](const testing::TestParamInfo<Param>& param_info) {
                           return std::string(backend_name(std::get<0>(param_info.param))) + "_" +
                                  sink_cases()[std::get<1>(param_info.param)].name;
                         });

// ---- argument checks ----------------------------------------------------------------------

struct Small {
  std::vector<float> x = std::vector<float>(64, 0.5f), out = std::vector<float>(64),
                     lse = std::vector<float>(8), sink = std::vector<float>(2, 1.0f),
                     dsink = std::vector<float>(2), grads = std::vector<float>(3 * 64);
  std::vector<uint16_t> half_sink = std::vector<uint16_t>(2);
  TensorView view(float* p, std::initializer_list<int64_t> shape) {
    return make_contiguous_view(p, DType::kFloat32, Device{}, shape);
  }
  ForwardArgs fwd() {
    ForwardArgs a;
    a.q = a.k = a.v = view(x.data(), {1, 4, 2, 8});
    a.out = view(out.data(), {1, 4, 2, 8});
    a.lse = view(lse.data(), {1, 2, 4});
    a.learnable_sink = view(sink.data(), {2});
    return a;
  }
  BackwardArgs bwd() {
    BackwardArgs a;
    a.q = a.k = a.v = a.dout = view(x.data(), {1, 4, 2, 8});
    a.out = view(out.data(), {1, 4, 2, 8});
    a.lse = view(lse.data(), {1, 2, 4});
    a.dq = view(grads.data(), {1, 4, 2, 8});
    a.dk = view(grads.data() + 64, {1, 4, 2, 8});
    a.dv = view(grads.data() + 128, {1, 4, 2, 8});
    a.learnable_sink = view(sink.data(), {2});
    a.dsink = view(dsink.data(), {2});
    return a;
  }
};

void expect_error(const Status& s, StatusCode code, const std::string& needle) {
  EXPECT_EQ(s.code(), code) << s.message();
  EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
}

TEST(SinkArguments, ValidCallsSucceed) {
  Small t;
  EXPECT_TRUE(forward(t.fwd()).ok());
  EXPECT_TRUE(backward(t.bwd()).ok());
  BackwardArgs b = t.bwd();
  b.dsink = TensorView{};  // the sink without its gradient
  EXPECT_TRUE(backward(b).ok());
}

TEST(SinkArguments, BadSinkIsNamed) {
  Small t;
  ForwardArgs a = t.fwd();
  a.learnable_sink = t.view(t.sink.data(), {1});
  expect_error(forward(a), StatusCode::kInvalidArgument, "learnable_sink must have shape (2)");
  a.learnable_sink = t.view(t.sink.data(), {1, 2});
  expect_error(forward(a), StatusCode::kInvalidArgument, "learnable_sink must have 1 dimensions");
  a.learnable_sink = make_contiguous_view(t.half_sink.data(), DType::kFloat16, Device{}, {2});
  expect_error(forward(a), StatusCode::kInvalidArgument, "learnable_sink must have dtype float32");
  a.learnable_sink = make_contiguous_view(t.sink.data(), DType::kFloat32, Device{DeviceType::kCUDA, 0}, {2});
  expect_error(forward(a), StatusCode::kInvalidArgument, "learnable_sink is on cuda:0");
}

TEST(SinkArguments, BadDsinkIsNamed) {
  Small t;
  BackwardArgs a = t.bwd();
  a.learnable_sink = TensorView{};
  expect_error(backward(a), StatusCode::kInvalidArgument, "dsink (the gradient of learnable_sink) was given without");
  a = t.bwd();
  a.dsink = t.view(t.dsink.data(), {1});
  expect_error(backward(a), StatusCode::kInvalidArgument, "dsink must have shape (2)");
}

}  // namespace
}  // namespace flashattn::test
