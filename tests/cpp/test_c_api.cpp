// The C ABI: a forward driven from C99 code (c_api_check.c), error reporting, defaults, and a
// forward + backward with every option set, converted from the C++ views, against the reference.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "c_api_check.h"
#include "flashattn/c_api.h"
#include "test_util.h"

namespace flashattn::test {
namespace {

template <typename C, typename Cpp>
void options_to_c(const Cpp& a, C* c) {
  c->softmax_scale = a.softmax_scale;
  c->causal = a.causal;
  c->window_left = a.window_left;
  c->window_right = a.window_right;
  c->softcap = a.softcap;
  c->alibi_slopes = to_c(a.alibi_slopes);
  c->dropout_p = a.dropout_p;
  c->seed = a.seed;
  c->offset = a.offset;
  c->cu_seqlens_q = to_c(a.cu_seqlens_q);
  c->cu_seqlens_k = to_c(a.cu_seqlens_k);
  c->max_seqlen_q = a.max_seqlen_q;
  c->max_seqlen_k = a.max_seqlen_k;
  c->check_cu_seqlens = a.check_cu_seqlens;
  c->num_threads = a.num_threads;
  c->stream = a.stream;
  c->learnable_sink = to_c(a.learnable_sink);
  c->attn_bias = to_c(a.attn_bias);
  c->attn_mask = to_c(a.attn_mask);
  c->block_mask = to_c(a.block_mask);
  c->block_size_q = a.block_size_q;
  c->block_size_k = a.block_size_k;
  c->kv_num_blocks = to_c(a.block_mask_lists.kv_num_blocks);
  c->kv_indices = to_c(a.block_mask_lists.kv_indices);
  c->full_kv_num_blocks = to_c(a.block_mask_lists.full_kv_num_blocks);
  c->full_kv_indices = to_c(a.block_mask_lists.full_kv_indices);
}

flashattn_forward_args c_forward_args(const ForwardArgs& a) {
  flashattn_forward_args c;
  flashattn_forward_args_init(&c);
  options_to_c(a, &c);
  c.q = to_c(a.q), c.k = to_c(a.k), c.v = to_c(a.v), c.out = to_c(a.out), c.lse = to_c(a.lse);
  c.num_splits = a.num_splits;
  return c;
}

flashattn_backward_args c_backward_args(const BackwardArgs& a) {
  flashattn_backward_args c;
  flashattn_backward_args_init(&c);
  options_to_c(a, &c);
  c.q = to_c(a.q), c.k = to_c(a.k), c.v = to_c(a.v), c.out = to_c(a.out), c.dout = to_c(a.dout);
  c.lse = to_c(a.lse), c.dq = to_c(a.dq), c.dk = to_c(a.dk), c.dv = to_c(a.dv);
  c.deterministic = a.deterministic;
  c.dsink = to_c(a.dsink), c.dbias = to_c(a.dbias);
  return c;
}

// float32 buffers for the outputs of one forward + backward.
struct Outputs {
  std::vector<float> out, lse, dq, dk, dv, dbias;
  // Points the outputs of fa and ba (contiguous views whose shapes are set) at these buffers;
  // ba reads fa's out and lse.
  void bind(ForwardArgs* fa, BackwardArgs* ba) {
    const struct {
      std::vector<float>& buffer;
      TensorView& view;
    } outputs[] = {{out, fa->out}, {lse, fa->lse}, {dq, ba->dq},
                   {dk, ba->dk},   {dv, ba->dv},   {dbias, ba->dbias}};
    for (const auto& o : outputs) {
      o.buffer.assign(static_cast<size_t>(o.view.numel()), std::nanf(""));
      o.view.data = o.view.defined() ? o.buffer.data() : nullptr;
    }
    ba->out = fa->out, ba->lse = fa->lse;
  }
};

// fa and ba through the C++ API and, with every output redirected, through the C ABI: the
// results are bitwise equal (one code path runs behind both). Returns the C++ outputs.
Outputs expect_c_abi_matches_cpp(ForwardArgs fa, BackwardArgs ba) {
  Outputs cpp, c;
  cpp.bind(&fa, &ba);
  const Status fs = forward(fa), bs = backward(ba);
  EXPECT_TRUE(fs.ok() && bs.ok()) << fs.message() << " / " << bs.message();
  c.bind(&fa, &ba);
  const flashattn_forward_args cf = c_forward_args(fa);
  EXPECT_EQ(flashattn_forward(&cf), FLASHATTN_OK) << flashattn_last_error();
  const flashattn_backward_args cb = c_backward_args(ba);
  EXPECT_EQ(flashattn_backward(&cb), FLASHATTN_OK) << flashattn_last_error();
  EXPECT_EQ(c.out, cpp.out);
  EXPECT_EQ(c.lse, cpp.lse);
  EXPECT_EQ(c.dq, cpp.dq);
  EXPECT_EQ(c.dk, cpp.dk);
  EXPECT_EQ(c.dv, cpp.dv);
  EXPECT_EQ(c.dbias, cpp.dbias);
  return cpp;
}

TEST(CApi, ForwardFromCMatchesReference) {
  const int B = 2, Sq = 33, Sk = 47, H = 4, Hk = 2, D = 16;
  ProblemSpec s = ProblemSpec::dense(DType::kFloat32, B, Sq, Sk, H, Hk, D, D);
  s.causal = true;
  s.softcap = 3.0f;
  s.q_scale = 2.0;
  s.data_seed = 2024;
  const HostProblem host = make_host_problem(s);
  const std::vector<float> q(host.q.begin(), host.q.end()), k(host.k.begin(), host.k.end()),
      v(host.v.begin(), host.v.end());
  std::vector<float> out(q.size(), -1.0f), lse(static_cast<size_t>(B * H * Sq), -1.0f);
  ASSERT_EQ(fa_c_forward_f32(q.data(), k.data(), v.data(), out.data(), lse.data(), B, Sq, Sk, H, Hk,
                             D, 1, 3.0f),
            FLASHATTN_OK)
      << flashattn_last_error();
  const Results ref = run_reference(host, false);
  EXPECT_TRUE(meets_criterion("out", DType::kFloat32, std::vector<double>(out.begin(), out.end()),
                              ref.out, {}));
  // lse: (batch, heads, seqlen_q) -> the reference's (heads, total_q).
  std::vector<double> l(lse.size());
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < Sq; ++i)
        l[static_cast<size_t>(h * B * Sq + b * Sq + i)] =
            lse[static_cast<size_t>((b * H + h) * Sq + i)];
  EXPECT_TRUE(meets_criterion("lse", DType::kFloat32, l, ref.lse, {}));
}

TEST(CApi, InitSetsDefaults) { EXPECT_EQ(fa_c_defaults_ok(), 1); }

TEST(CApi, ErrorCodeAndLastErrorFromC) {
  char msg[512];
  EXPECT_EQ(fa_c_missing_q(msg, sizeof(msg)), FLASHATTN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(msg).find("q is required"), std::string::npos) << msg;
  EXPECT_EQ(fa_c_null_args(msg, sizeof(msg)), FLASHATTN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(msg).find("null"), std::string::npos) << msg;
  EXPECT_NE(std::string(msg).find("flashattn_backward"), std::string::npos) << msg;
  EXPECT_EQ(flashattn_forward(nullptr), FLASHATTN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flashattn_last_error()).find("flashattn_forward"), std::string::npos);
}

TEST(CApi, VersionAndCudaAvailability) {
  EXPECT_STREQ(fa_c_version(), flashattn::version());
  EXPECT_EQ(fa_c_cuda_available(), flashattn::cuda_available() ? 1 : 0);
}

// flashattn_set_workspace_allocator installs the C functions as flashattn::set_workspace_allocator
// would, and NULL functions uninstall.
TEST(CApi, SetWorkspaceAllocator) {
  fa_c_set_allocator(1, 777);
  flashattn::WorkspaceAllocator seen = flashattn::set_workspace_allocator({});
  EXPECT_NE(seen.allocate, nullptr);
  EXPECT_NE(seen.release, nullptr);
  EXPECT_EQ(seen.min_bytes, 777u);
  flashattn::set_workspace_allocator(seen);
  fa_c_set_allocator(0, 0);
  seen = flashattn::set_workspace_allocator({});
  EXPECT_EQ(seen.allocate, nullptr);
}

// Every option crosses the C boundary: varlen, window, softcap, ALiBi (batch, heads), dropout,
// explicit scale, strided views; forward and backward checked against the reference.
TEST(CApi, EveryOptionForwardAndBackward) {
  ProblemSpec s;
  s.dtype = DType::kFloat32, s.varlen = true;
  s.seqlens_q = {17, 0, 40}, s.seqlens_k = {23, 9, 31};
  s.heads = 4, s.heads_k = 2, s.head_dim = 24, s.head_dim_v = 24;
  s.layout = Layout::kPadded;
  s.softmax_scale = 0.3f;
  s.window_left = 9, s.window_right = 4;
  s.softcap = 4.0f;
  s.alibi = Alibi::kBatchHeads;
  s.dropout_p = 0.2f, s.dropout_seed = 0xabcdef0123ull, s.dropout_offset = 0x100000002ull;
  s.num_threads = 2;
  s.deterministic = true;
  s.data_seed = 31337;
  const HostProblem host = make_host_problem(s);
  DeviceProblem dev(Backend::kCpu, s, host);

  const ForwardArgs fa = dev.forward_args();
  flashattn_forward_args cf;
  flashattn_forward_args_init(&cf);
  options_to_c(fa, &cf);
  cf.q = to_c(fa.q), cf.k = to_c(fa.k), cf.v = to_c(fa.v), cf.out = to_c(fa.out),
  cf.lse = to_c(fa.lse);
  cf.num_splits = 1;
  ASSERT_EQ(flashattn_forward(&cf), FLASHATTN_OK) << flashattn_last_error();
  dev.download_forward();

  const BackwardArgs ba = dev.backward_args();
  flashattn_backward_args cb;
  flashattn_backward_args_init(&cb);
  options_to_c(ba, &cb);
  cb.q = to_c(ba.q), cb.k = to_c(ba.k), cb.v = to_c(ba.v), cb.out = to_c(ba.out);
  cb.dout = to_c(ba.dout), cb.lse = to_c(ba.lse);
  cb.dq = to_c(ba.dq), cb.dk = to_c(ba.dk), cb.dv = to_c(ba.dv);
  cb.deterministic = ba.deterministic;
  ASSERT_EQ(flashattn_backward(&cb), FLASHATTN_OK) << flashattn_last_error();
  dev.download_backward();

  const Results ref = run_reference(host, true);
  EXPECT_TRUE(meets_criterion("out", s.dtype, dev.out(), ref.out, {}));
  EXPECT_TRUE(meets_criterion("lse", s.dtype, dev.lse(), ref.lse, {}));
  EXPECT_TRUE(meets_criterion("dq", s.dtype, dev.dq(), ref.dq, {}, grad_magnitude(ref)));
  EXPECT_TRUE(meets_criterion("dk", s.dtype, dev.dk(), ref.dk, {}, grad_magnitude(ref)));
  EXPECT_TRUE(meets_criterion("dv", s.dtype, dev.dv(), ref.dv, {}, grad_magnitude(ref)));
  EXPECT_TRUE(dev.outputs_padding_untouched());
}

// The learnable sink and its gradient cross the C boundary, with head_dim_v != head_dim.
TEST(CApi, LearnableSinkAndHeadDimV) {
  ProblemSpec s = ProblemSpec::dense(DType::kFloat32, 2, 19, 33, 6, 2, 24, 16);
  s.causal = true;
  s.sink = Sink::kRandom;
  s.data_seed = 4242;
  const HostProblem host = make_host_problem(s);
  DeviceProblem dev(Backend::kCpu, s, host);

  const ForwardArgs fa = dev.forward_args();
  flashattn_forward_args cf;
  flashattn_forward_args_init(&cf);
  options_to_c(fa, &cf);
  cf.q = to_c(fa.q), cf.k = to_c(fa.k), cf.v = to_c(fa.v), cf.out = to_c(fa.out),
  cf.lse = to_c(fa.lse), cf.learnable_sink = to_c(fa.learnable_sink);
  ASSERT_EQ(flashattn_forward(&cf), FLASHATTN_OK) << flashattn_last_error();
  dev.download_forward();

  const BackwardArgs ba = dev.backward_args();
  flashattn_backward_args cb;
  flashattn_backward_args_init(&cb);
  options_to_c(ba, &cb);
  cb.q = to_c(ba.q), cb.k = to_c(ba.k), cb.v = to_c(ba.v), cb.out = to_c(ba.out);
  cb.dout = to_c(ba.dout), cb.lse = to_c(ba.lse);
  cb.dq = to_c(ba.dq), cb.dk = to_c(ba.dk), cb.dv = to_c(ba.dv);
  cb.learnable_sink = to_c(ba.learnable_sink), cb.dsink = to_c(ba.dsink);
  ASSERT_EQ(flashattn_backward(&cb), FLASHATTN_OK) << flashattn_last_error();
  dev.download_backward();

  const Results ref = run_reference(host, true);
  EXPECT_TRUE(meets_criterion("out", s.dtype, dev.out(), ref.out, {}));
  EXPECT_TRUE(meets_criterion("lse", s.dtype, dev.lse(), ref.lse, {}));
  EXPECT_TRUE(meets_criterion("dq", s.dtype, dev.dq(), ref.dq, {}, grad_magnitude(ref)));
  EXPECT_TRUE(meets_criterion("dv", s.dtype, dev.dv(), ref.dv, {}, grad_magnitude(ref)));
  EXPECT_TRUE(meets_criterion("dsink", s.dtype, dev.dsink(), ref.dsink, {}));
}

// head_dim_v != head_dim on CUDA through the C ABI: DeepSeek-V3's 192/128 runs (zero-padded to
// 192 inside the backend), MLA decode's 576/512 is FLASHATTN_ERROR_NOT_SUPPORTED naming head_dim.
// Skipped without a GPU.
TEST(CApi, HeadDimVOnCuda) {
  FLASHATTN_SKIP_IF_UNAVAILABLE(Backend::kCuda);
  ProblemSpec s = ProblemSpec::dense(DType::kBFloat16, 2, 77, 129, 4, 2, 192, 128);
  s.causal = true;
  s.sink = Sink::kRandom;
  s.deterministic = true;
  s.data_seed = 4343;
  if (cuda_run_head_dim(s.head_dim, s.head_dim_v) == 0 || cuda_may_not_support(s)) {
    GTEST_SKIP() << "this build has no CUDA kernels for 192/128 in bfloat16";
  }
  const HostProblem host = make_host_problem(s);
  DeviceProblem dev(Backend::kCuda, s, host);

  const ForwardArgs fa = dev.forward_args();
  flashattn_forward_args cf;
  flashattn_forward_args_init(&cf);
  options_to_c(fa, &cf);
  cf.q = to_c(fa.q), cf.k = to_c(fa.k), cf.v = to_c(fa.v), cf.out = to_c(fa.out),
  cf.lse = to_c(fa.lse), cf.learnable_sink = to_c(fa.learnable_sink);
  ASSERT_EQ(flashattn_forward(&cf), FLASHATTN_OK) << flashattn_last_error();
  dev.download_forward();

  const BackwardArgs ba = dev.backward_args();
  flashattn_backward_args cb;
  flashattn_backward_args_init(&cb);
  options_to_c(ba, &cb);
  cb.q = to_c(ba.q), cb.k = to_c(ba.k), cb.v = to_c(ba.v), cb.out = to_c(ba.out);
  cb.dout = to_c(ba.dout), cb.lse = to_c(ba.lse);
  cb.dq = to_c(ba.dq), cb.dk = to_c(ba.dk), cb.dv = to_c(ba.dv);
  cb.learnable_sink = to_c(ba.learnable_sink), cb.dsink = to_c(ba.dsink);
  cb.deterministic = ba.deterministic;
  ASSERT_EQ(flashattn_backward(&cb), FLASHATTN_OK) << flashattn_last_error();
  dev.download_backward();

  const Results ref = run_reference(host, true);
  const Results low = run_naive_lowp(host, s.dtype, true);
  const double g = grad_magnitude(ref);
  EXPECT_TRUE(meets_criterion("out", s.dtype, dev.out(), ref.out, low.out));
  EXPECT_TRUE(meets_criterion("lse", s.dtype, dev.lse(), ref.lse, low.lse));
  EXPECT_TRUE(meets_criterion("dq", s.dtype, dev.dq(), ref.dq, low.dq, g));
  EXPECT_TRUE(meets_criterion("dk", s.dtype, dev.dk(), ref.dk, low.dk, g));
  EXPECT_TRUE(meets_criterion("dv", s.dtype, dev.dv(), ref.dv, low.dv, g));
  EXPECT_TRUE(meets_criterion("dsink", s.dtype, dev.dsink(), ref.dsink, low.dsink));
  EXPECT_TRUE(dev.outputs_padding_untouched());

  ProblemSpec mla = ProblemSpec::dense(DType::kBFloat16, 1, 1, 33, 16, 1, 576, 512);
  mla.data_seed = 4344;
  const HostProblem mla_host = make_host_problem(mla);
  DeviceProblem mla_dev(Backend::kCuda, mla, mla_host);
  const ForwardArgs ma = mla_dev.forward_args();
  flashattn_forward_args cm;
  flashattn_forward_args_init(&cm);
  options_to_c(ma, &cm);
  cm.q = to_c(ma.q), cm.k = to_c(ma.k), cm.v = to_c(ma.v), cm.out = to_c(ma.out), cm.lse = to_c(ma.lse);
  EXPECT_EQ(flashattn_forward(&cm), FLASHATTN_ERROR_NOT_SUPPORTED);
  EXPECT_NE(std::string(flashattn_last_error()).find("head_dim 576"), std::string::npos)
      << flashattn_last_error();
}

// A caller compiled against the first published header (no sink fields) still works: the
// library reads the appended fields only when struct_size covers them.
TEST(CApi, FirstPublishedLayoutIsAccepted) {
  ProblemSpec s = ProblemSpec::dense(DType::kFloat32, 1, 9, 13, 2, 1, 16, 16);
  s.data_seed = 777;
  const HostProblem host = make_host_problem(s);
  DeviceProblem dev(Backend::kCpu, s, host);
  const ForwardArgs fa = dev.forward_args();
  flashattn_forward_args cf;
  flashattn_forward_args_init(&cf);
  options_to_c(fa, &cf);
  cf.q = to_c(fa.q), cf.k = to_c(fa.k), cf.v = to_c(fa.v), cf.out = to_c(fa.out),
  cf.lse = to_c(fa.lse);
  std::memset(&cf.learnable_sink, 0x5a, sizeof(cf.learnable_sink));  // not the caller's memory
  cf.struct_size = offsetof(flashattn_forward_args, learnable_sink);
  ASSERT_EQ(flashattn_forward(&cf), FLASHATTN_OK) << flashattn_last_error();
  dev.download_forward();
  const Results ref = run_reference(host, false);
  EXPECT_TRUE(meets_criterion("out", s.dtype, dev.out(), ref.out, {}));
}

// The C ABI called with an older args layout: struct_size ends where `first_unread` begins, and
// every field from there on holds garbage (never the caller's memory, never read). Runs the
// forward and backward of fa / ba so; returns the forward's output.
std::vector<float> run_older_layout(ForwardArgs fa, BackwardArgs ba, size_t forward_size,
                                    size_t backward_size) {
  Outputs c;
  c.bind(&fa, &ba);
  flashattn_forward_args cf = c_forward_args(fa);
  std::memset(reinterpret_cast<char*>(&cf) + forward_size, 0x5a, sizeof(cf) - forward_size);
  cf.struct_size = forward_size;
  EXPECT_EQ(flashattn_forward(&cf), FLASHATTN_OK) << flashattn_last_error();
  flashattn_backward_args cb = c_backward_args(ba);
  std::memset(reinterpret_cast<char*>(&cb) + backward_size, 0x5a, sizeof(cb) - backward_size);
  cb.struct_size = backward_size;
  EXPECT_EQ(flashattn_backward(&cb), FLASHATTN_OK) << flashattn_last_error();
  return c.out;
}

// attn_bias, attn_mask, block_mask and dbias cross the C boundary: the results equal the C++
// API's bitwise. A caller of the 0.2 layout (up to the sink fields) is accepted too.
TEST(CApi, BiasAndMasks) {
  const int64_t B = 1, S = 20, H = 2, D = 8;
  std::vector<float> q(B * S * H * D), bias(H * S * S);
  std::vector<uint8_t> mask(S * S), block(4 * 3);
  for (size_t i = 0; i < q.size(); ++i) q[i] = std::sin(0.37f * static_cast<float>(i));
  for (size_t i = 0; i < bias.size(); ++i) bias[i] = std::cos(0.11f * static_cast<float>(i));
  for (size_t i = 0; i < mask.size(); ++i) mask[i] = (i * 7) % 5 != 0;
  for (size_t i = 0; i < block.size(); ++i) block[i] = i % 4 != 1;
  auto view = [](void* p, DType dt, std::initializer_list<int64_t> shape) {
    return make_contiguous_view(p, dt, Device{}, shape);
  };
  ForwardArgs fa;
  fa.q = fa.k = fa.v = view(q.data(), DType::kFloat32, {B, S, H, D});
  fa.out = view(nullptr, DType::kFloat32, {B, S, H, D});
  fa.lse = view(nullptr, DType::kFloat32, {B, H, S});
  fa.attn_bias = view(bias.data(), DType::kFloat32, {1, H, S, S});
  fa.attn_mask = view(mask.data(), DType::kUInt8, {1, 1, S, S});
  fa.block_mask = view(block.data(), DType::kUInt8, {1, 1, 4, 3});
  fa.block_size_q = 5, fa.block_size_k = 7;
  BackwardArgs ba;
  static_cast<AttentionOptions&>(ba) = fa;
  ba.q = ba.k = ba.v = ba.dout = fa.q;
  ba.dq = ba.dk = ba.dv = fa.out;
  ba.dbias = view(nullptr, DType::kFloat32, {1, H, S, S});
  Outputs cpp = expect_c_abi_matches_cpp(fa, ba);
  EXPECT_NE(cpp.dbias, std::vector<float>(cpp.dbias.size(), 0.0f));

  // The 0.2 layout: the fields past learnable_sink are not read, so the call has no bias or mask.
  ba.dbias = TensorView{};
  EXPECT_NE(run_older_layout(fa, ba, offsetof(flashattn_forward_args, attn_bias),
                             offsetof(flashattn_backward_args, attn_bias)),
            cpp.out);
}

// The compressed block mask on a varlen call crosses the C boundary: the results equal the C++
// API's bitwise. A caller of the 0.3 layout (up to block_size_k / dbias) is accepted, and the
// fields past it are not read.
TEST(CApi, CompressedBlockMaskVarlen) {
  const int64_t total = 30, H = 2, D = 8;  // sequences of 18 and 12 tokens, blocks of 8
  std::vector<float> q(total * H * D), bias(H * 18 * 18);
  std::vector<int32_t> cu = {0, 18, 30};
  std::vector<uint8_t> mask(H * 18 * 18);
  // (1, heads, 3 query blocks) counts and (1, heads, 3, 3) indices: per head, partial and full.
  std::vector<int32_t> num = {1, 1, 2, 0, 1, 1}, idx = {0, 9, 9, 1, 9, 9, 0, 2, 9, 0, 0, 0, 2, 9, 9, 1, 9, 9};
  std::vector<int32_t> full_num = {0, 1, 0, 2, 1, 1}, full_idx = {9, 9, 9, 0, 9, 9, 9, 9, 9,
                                                                  0, 1, 9, 0, 9, 9, 0, 9, 9};
  for (size_t i = 0; i < q.size(); ++i) q[i] = std::sin(0.29f * static_cast<float>(i));
  for (size_t i = 0; i < bias.size(); ++i) bias[i] = std::cos(0.13f * static_cast<float>(i));
  for (size_t i = 0; i < mask.size(); ++i) mask[i] = (i * 5) % 7 != 0;
  auto view = [](void* p, DType dt, std::initializer_list<int64_t> shape) {
    return make_contiguous_view(p, dt, Device{}, shape);
  };
  ForwardArgs fa;
  fa.q = fa.k = fa.v = view(q.data(), DType::kFloat32, {total, H, D});
  fa.out = view(nullptr, DType::kFloat32, {total, H, D});
  fa.lse = view(nullptr, DType::kFloat32, {H, total});
  fa.cu_seqlens_q = fa.cu_seqlens_k = view(cu.data(), DType::kInt32, {3});
  fa.max_seqlen_q = fa.max_seqlen_k = 18;
  fa.attn_bias = view(bias.data(), DType::kFloat32, {1, H, 18, 18});
  fa.attn_mask = view(mask.data(), DType::kUInt8, {1, H, 18, 18});
  fa.block_mask_lists.kv_num_blocks = view(num.data(), DType::kInt32, {1, H, 3});
  fa.block_mask_lists.kv_indices = view(idx.data(), DType::kInt32, {1, H, 3, 3});
  fa.block_mask_lists.full_kv_num_blocks = view(full_num.data(), DType::kInt32, {1, H, 3});
  fa.block_mask_lists.full_kv_indices = view(full_idx.data(), DType::kInt32, {1, H, 3, 3});
  fa.block_size_q = fa.block_size_k = 8;
  BackwardArgs ba;
  static_cast<AttentionOptions&>(ba) = fa;
  ba.q = ba.k = ba.v = ba.dout = fa.q;
  ba.dq = ba.dk = ba.dv = fa.out;
  ba.dbias = view(nullptr, DType::kFloat32, {1, H, 18, 18});
  Outputs cpp = expect_c_abi_matches_cpp(fa, ba);
  EXPECT_NE(cpp.dbias, std::vector<float>(cpp.dbias.size(), 0.0f));

  // The 0.3 layout: the list fields are not read, so with the block sizes cleared the call
  // runs without a block mask.
  fa.block_size_q = fa.block_size_k = ba.block_size_q = ba.block_size_k = 0;
  EXPECT_NE(run_older_layout(fa, ba, offsetof(flashattn_forward_args, kv_num_blocks),
                             offsetof(flashattn_backward_args, kv_num_blocks)),
            cpp.out);
}

// A valid small forward to mutate.
struct Small {
  std::vector<float> x = std::vector<float>(64, 0.5f), out = std::vector<float>(64);
  flashattn_forward_args a;
  Small() {
    flashattn_forward_args_init(&a);
    for (flashattn_tensor* t : {&a.q, &a.k, &a.v, &a.out}) {
      *t = to_c(make_contiguous_view(t == &a.out ? out.data() : x.data(), DType::kFloat32, Device{},
                                     {1, 4, 2, 8}));
    }
  }
};

TEST(CApi, ValidSmallCallSucceeds) {
  Small s;
  EXPECT_EQ(flashattn_forward(&s.a), FLASHATTN_OK) << flashattn_last_error();
}

TEST(CApi, StructSizeIsChecked) {
  Small s;
  s.a.struct_size = sizeof(s.a) - 8;
  EXPECT_EQ(flashattn_forward(&s.a), FLASHATTN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flashattn_last_error()).find("struct_size"), std::string::npos)
      << flashattn_last_error();
  s.a.struct_size = 0;  // never initialised
  EXPECT_EQ(flashattn_forward(&s.a), FLASHATTN_ERROR_INVALID_ARGUMENT);
}

TEST(CApi, BadEnumCodesAndRanksAreRejected) {
  {
    Small s;
    s.a.k.dtype = 9;
    EXPECT_EQ(flashattn_forward(&s.a), FLASHATTN_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(flashattn_last_error()).find("k.dtype"), std::string::npos)
        << flashattn_last_error();
  }
  {
    Small s;
    s.a.v.device_type = 7;
    EXPECT_EQ(flashattn_forward(&s.a), FLASHATTN_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(flashattn_last_error()).find("v.device_type"), std::string::npos)
        << flashattn_last_error();
  }
  {
    Small s;
    s.a.q.ndim = 5;
    EXPECT_EQ(flashattn_forward(&s.a), FLASHATTN_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(flashattn_last_error()).find("q.ndim"), std::string::npos)
        << flashattn_last_error();
  }
  {
    Small s;
    s.a.alibi_slopes.ndim = -1;
    EXPECT_EQ(flashattn_forward(&s.a), FLASHATTN_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(flashattn_last_error()).find("alibi_slopes.ndim"), std::string::npos)
        << flashattn_last_error();
  }
  {
    Small s;
    for (flashattn_tensor* t : {&s.a.q, &s.a.k, &s.a.v, &s.a.out})
      t->dtype = FLASHATTN_DTYPE_FLOAT8_E4M3;
    EXPECT_EQ(flashattn_forward(&s.a), FLASHATTN_ERROR_NOT_SUPPORTED);
    EXPECT_NE(std::string(flashattn_last_error()).find("float8"), std::string::npos)
        << flashattn_last_error();
  }
}

TEST(CApi, LastErrorIsPerThreadAndSurvivesSuccess) {
  Small bad;
  bad.a.dropout_p = 2.0f;
  ASSERT_EQ(flashattn_forward(&bad.a), FLASHATTN_ERROR_INVALID_ARGUMENT);
  const std::string mine = flashattn_last_error();
  EXPECT_NE(mine.find("dropout_p"), std::string::npos) << mine;
  std::string other_before, other_after;
  std::thread t([&] {
    other_before = flashattn_last_error();
    Small b2;
    b2.a.softcap = -1.0f;
    (void)flashattn_forward(&b2.a);
    other_after = flashattn_last_error();
  });
  t.join();
  EXPECT_EQ(other_before, "");
  EXPECT_NE(other_after.find("softcap"), std::string::npos) << other_after;
  EXPECT_EQ(std::string(flashattn_last_error()), mine);
  Small good;
  ASSERT_EQ(flashattn_forward(&good.a), FLASHATTN_OK);
  EXPECT_EQ(std::string(flashattn_last_error()), mine);  // documented: success does not clear it
}

// A varlen call on paged K/V (the 0.7 field block_table) through the C ABI: the same bits as the
// packed call of the C++ API (the CPU backend gathers the pages and runs the same arithmetic).
// A caller of the 0.6 layout (block_table not in its struct, garbage there) is accepted too.
TEST(CApi, PagedVarlen) {
  const int64_t H = 2, HK = 1, D = 8, P = 4;  // two sequences: 3 queries / 6 keys, 2 / 9
  const std::vector<int32_t> cu_q{0, 3, 5}, cu_k{0, 6, 15};
  const std::vector<int32_t> table{3, 0, -1, 1, 4, 2};  // (2, 3): pages of each sequence
  std::mt19937 g(17);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> q(5 * H * D), kp(5 * P * HK * D, NAN), vp(kp.size(), NAN), k(15 * HK * D), v(k.size());
  for (auto* x : {&q, &k, &v}) {
    for (float& e : *x) e = u(g);
  }
  for (int b = 0; b < 2; ++b) {
    for (int t = 0; t < cu_k[b + 1] - cu_k[b]; ++t) {
      const int64_t page = table[b * 3 + t / P];
      for (int64_t c = 0; c < HK * D; ++c) {
        kp[(page * P + t % P) * HK * D + c] = k[(cu_k[b] + t) * HK * D + c];
        vp[(page * P + t % P) * HK * D + c] = v[(cu_k[b] + t) * HK * D + c];
      }
    }
  }
  const auto view = [](const void* p, DType dt, std::initializer_list<int64_t> shape) {
    return make_contiguous_view(const_cast<void*>(p), dt, Device{}, shape);
  };
  std::vector<float> out_packed(5 * H * D), lse_packed(H * 5), out_paged(out_packed.size()), lse_paged(lse_packed.size());
  ForwardArgs fa;
  fa.q = view(q.data(), DType::kFloat32, {5, H, D});
  fa.k = view(k.data(), DType::kFloat32, {15, HK, D});
  fa.v = view(v.data(), DType::kFloat32, {15, HK, D});
  fa.cu_seqlens_q = view(cu_q.data(), DType::kInt32, {3});
  fa.cu_seqlens_k = view(cu_k.data(), DType::kInt32, {3});
  fa.causal = true;
  fa.out = view(out_packed.data(), DType::kFloat32, {5, H, D});
  fa.lse = view(lse_packed.data(), DType::kFloat32, {H, 5});
  ASSERT_TRUE(forward(fa).ok());

  ForwardArgs pa = fa;
  pa.k = view(kp.data(), DType::kFloat32, {5, P, HK, D});
  pa.v = view(vp.data(), DType::kFloat32, {5, P, HK, D});
  pa.out = view(out_paged.data(), DType::kFloat32, {5, H, D});
  pa.lse = view(lse_paged.data(), DType::kFloat32, {H, 5});
  flashattn_forward_args cf = c_forward_args(pa);
  cf.block_table = to_c(view(table.data(), DType::kInt32, {2, 3}));
  ASSERT_EQ(flashattn_forward(&cf), FLASHATTN_OK) << flashattn_last_error();
  EXPECT_EQ(0, std::memcmp(out_paged.data(), out_packed.data(), out_paged.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(lse_paged.data(), lse_packed.data(), lse_paged.size() * sizeof(float)));

  // The 0.6 layout: block_table is not the caller's; the packed call runs.
  flashattn_forward_args old = c_forward_args(fa);
  std::memset(&old.block_table, 0x5a, sizeof(old.block_table));
  old.struct_size = offsetof(flashattn_forward_args, block_table);
  std::vector<float> out_old(out_packed.size());
  old.out = to_c(view(out_old.data(), DType::kFloat32, {5, H, D}));
  ASSERT_EQ(flashattn_forward(&old), FLASHATTN_OK) << flashattn_last_error();
  EXPECT_EQ(out_old, out_packed);
}

}  // namespace
}  // namespace flashattn::test
