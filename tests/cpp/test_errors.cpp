// Invalid arguments: each call must return the exact StatusCode with a message that names the
// offending argument, and must not crash. Every case mutates one thing of a valid call (the
// baselines are checked to succeed, so a case cannot pass by accident).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "flashattn/flashattn.h"
#include "test_util.h"

namespace flashattn::test {
namespace {

// Small valid CPU float32 problems: dense (batch 2, seqlen_q 5, seqlen_k 7, heads 4/2, d 8) and
// varlen (3 sequences). The buffers outlive every call.
constexpr int B = 2, Sq = 5, Sk = 7, H = 4, Hk = 2, D = 8;

struct Buffers {
  std::vector<float> q = std::vector<float>(B * Sq * H * D, 0.5f);
  std::vector<float> k = std::vector<float>(B * Sk * Hk * D, 0.25f);
  std::vector<float> v = std::vector<float>(B * Sk * Hk * D, -0.75f);
  std::vector<float> out = std::vector<float>(B * Sq * H * D);
  std::vector<float> dout = std::vector<float>(B * Sq * H * D, 1.0f);
  std::vector<float> lse = std::vector<float>(B * H * Sq);
  std::vector<float> dq = std::vector<float>(B * Sq * H * D);
  std::vector<float> dk = std::vector<float>(B * Sk * Hk * D);
  std::vector<float> dv = std::vector<float>(B * Sk * Hk * D);
  std::vector<float> alibi = std::vector<float>(B * H, 0.125f);
  std::vector<uint8_t> block_mask = std::vector<uint8_t>(1, 1);  // (1, 1, 1, 1): everything kept
  // Varlen: sequences of (q, k) lengths (4, 6), (0, 3), (6, 5) -> total_q 10, total_k 14.
  std::vector<int32_t> cu_q = {0, 4, 4, 10};
  std::vector<int32_t> cu_k = {0, 6, 9, 14};
};

Buffers& buffers() {
  static Buffers b;
  return b;
}

TensorView view(void* data, std::initializer_list<int64_t> shape, DType dt = DType::kFloat32) {
  return make_contiguous_view(data, dt, Device{}, shape);
}

ForwardArgs dense_forward() {
  Buffers& b = buffers();
  ForwardArgs a;
  a.q = view(b.q.data(), {B, Sq, H, D});
  a.k = view(b.k.data(), {B, Sk, Hk, D});
  a.v = view(b.v.data(), {B, Sk, Hk, D});
  a.out = view(b.out.data(), {B, Sq, H, D});
  a.lse = view(b.lse.data(), {B, H, Sq});
  return a;
}

ForwardArgs varlen_forward() {
  Buffers& b = buffers();
  ForwardArgs a;
  a.q = view(b.q.data(), {10, H, D});
  a.k = view(b.k.data(), {14, Hk, D});
  a.v = view(b.v.data(), {14, Hk, D});
  a.out = view(b.out.data(), {10, H, D});
  a.lse = view(b.lse.data(), {H, 10});
  a.cu_seqlens_q = view(b.cu_q.data(), {4}, DType::kInt32);
  a.cu_seqlens_k = view(b.cu_k.data(), {4}, DType::kInt32);
  a.check_cu_seqlens = true;
  return a;
}

BackwardArgs dense_backward() {
  Buffers& b = buffers();
  BackwardArgs a;
  a.q = view(b.q.data(), {B, Sq, H, D});
  a.k = view(b.k.data(), {B, Sk, Hk, D});
  a.v = view(b.v.data(), {B, Sk, Hk, D});
  a.out = view(b.out.data(), {B, Sq, H, D});
  a.dout = view(b.dout.data(), {B, Sq, H, D});
  a.lse = view(b.lse.data(), {B, H, Sq});
  a.dq = view(b.dq.data(), {B, Sq, H, D});
  a.dk = view(b.dk.data(), {B, Sk, Hk, D});
  a.dv = view(b.dv.data(), {B, Sk, Hk, D});
  return a;
}

const Device kCuda0{DeviceType::kCUDA, 0};
const float kNaN = std::numeric_limits<float>::quiet_NaN();

struct ErrorCase {
  std::string name;
  // Exactly one of the two is set: a forward or a backward call.
  std::function<void(ForwardArgs&)> fwd;
  std::function<void(BackwardArgs&)> bwd;
  bool varlen = false;  // mutate varlen_forward() instead of dense_forward()
  StatusCode code;
  std::string needle;  // must appear in the message; starts with the argument's name
};

std::vector<ErrorCase> error_cases() {
  using S = StatusCode;
  const S kInv = S::kInvalidArgument;
  std::vector<ErrorCase> cs;
  auto f = [&](std::string name, S code, std::string needle, std::function<void(ForwardArgs&)> m) {
    cs.push_back({std::move(name), std::move(m), nullptr, false, code, std::move(needle)});
  };
  auto fv = [&](std::string name, S code, std::string needle, std::function<void(ForwardArgs&)> m) {
    cs.push_back({std::move(name), std::move(m), nullptr, true, code, std::move(needle)});
  };
  auto bw = [&](std::string name, S code, std::string needle,
                std::function<void(BackwardArgs&)> m) {
    cs.push_back({std::move(name), nullptr, std::move(m), false, code, std::move(needle)});
  };

  // Tensors: presence, rank, dtype, shape, strides, pointers, devices.
  f("missing_q", kInv, "q is required", [](ForwardArgs& a) { a.q = TensorView{}; });
  f("missing_out", kInv, "out is required", [](ForwardArgs& a) { a.out = TensorView{}; });
  f("q_wrong_rank", kInv, "q must have 4 dimensions", [](ForwardArgs& a) { a.q.ndim = 3; });
  f("k_dtype_mismatch", kInv, "k must have dtype float32",
    [](ForwardArgs& a) { a.k.dtype = DType::kFloat16; });
  f("v_dtype_mismatch", kInv, "v must have dtype float32",
    [](ForwardArgs& a) { a.v.dtype = DType::kBFloat16; });
  f("k_head_dim_mismatch", kInv, "k must have head_dim 8",
    [](ForwardArgs& a) { a.k.shape[3] = 4; });
  f("heads_not_divisible_by_heads_k", kInv, "heads_k (3",
    [](ForwardArgs& a) { a.k.shape[2] = 3, a.v.shape[2] = 3; });
  f("k_batch_mismatch", kInv, "k must have batch 2", [](ForwardArgs& a) { a.k.shape[0] = 1; });
  f("v_seqlen_mismatch", kInv, "v must have shape (2, 7, 2, 8)",
    [](ForwardArgs& a) { a.v.shape[1] = 6; });
  f("out_wrong_shape", kInv, "out must have shape (2, 5, 4, 8)",
    [](ForwardArgs& a) { a.out.shape[1] = 4; });
  f("out_dtype_mismatch", kInv, "out must have dtype float32",
    [](ForwardArgs& a) { a.out.dtype = DType::kFloat16; });
  f("lse_wrong_dtype", kInv, "lse must have dtype float32",
    [](ForwardArgs& a) { a.lse.dtype = DType::kFloat16; });
  f("lse_wrong_shape", kInv, "lse must have shape (2, 4, 5)",
    [](ForwardArgs& a) { a.lse.shape[2] = 6; });
  f("q_non_unit_last_stride", kInv, "q must be contiguous in its last dimension",
    [](ForwardArgs& a) { a.q.strides[3] = 2; });
  f("q_negative_stride", kInv, "q has a negative stride",
    [](ForwardArgs& a) { a.q.strides[1] = -32; });
  f("k_negative_size", kInv, "k has a negative size", [](ForwardArgs& a) { a.k.shape[1] = -7; });
  f("v_null_data", kInv, "v has a null data pointer", [](ForwardArgs& a) { a.v.data = nullptr; });
  f("out_null_data", kInv, "out has a null data pointer",
    [](ForwardArgs& a) { a.out.data = nullptr; });
  f("k_on_other_device", kInv, "k is on cuda:0", [](ForwardArgs& a) { a.k.device = kCuda0; });
  f("out_on_other_device", kInv, "out is on cuda:0", [](ForwardArgs& a) { a.out.device = kCuda0; });
  f("q_negative_cuda_index", kInv, "the device index must be >= 0", [](ForwardArgs& a) {
    for (TensorView* t : {&a.q, &a.k, &a.v, &a.out, &a.lse})
      t->device = Device{DeviceType::kCUDA, -1};
  });
  // FP8 q, k, v write bfloat16 (test_fp8.cpp holds the other FP8 errors).
  f("float8_out_dtype", S::kNotSupported, "out must have dtype bfloat16 with float8_e4m3 q",
    [](ForwardArgs& a) {
      for (TensorView* t : {&a.q, &a.k, &a.v, &a.out}) t->dtype = DType::kFloat8E4M3;
    });
  f("int32_dtype", S::kNotSupported, "q has dtype int32", [](ForwardArgs& a) {
    for (TensorView* t : {&a.q, &a.k, &a.v, &a.out}) t->dtype = DType::kInt32;
  });
  f("head_dim_too_large", S::kNotSupported, "q has head_dim 1100", [](ForwardArgs& a) {
    for (TensorView* t : {&a.q, &a.k, &a.v, &a.out}) t->shape[3] = 1100;
  });
  // Outputs written element by element: an expanded (stride 0) view would make elements share
  // memory, so the call's result would be whichever write came last.
  f("out_stride_zero", kInv, "out is written by the call and must not have stride 0 in dimension 1",
    [](ForwardArgs& a) { a.out.strides[1] = 0; });
  f("lse_stride_zero", kInv, "lse is written by the call and must not have stride 0 in dimension 1",
    [](ForwardArgs& a) { a.lse.strides[1] = 0; });

  // Options.
  f("negative_window_left", kInv, "window_left and window_right must be >= -1",
    [](ForwardArgs& a) { a.window_left = -2; });
  f("negative_window_right", kInv, "window_right must be >= -1",
    [](ForwardArgs& a) { a.window_right = -5; });
  f("dropout_p_one", kInv, "dropout_p must be in [0, 1)",
    [](ForwardArgs& a) { a.dropout_p = 1.0f; });
  f("dropout_p_negative", kInv, "dropout_p must be in [0, 1)",
    [](ForwardArgs& a) { a.dropout_p = -0.1f; });
  f("dropout_p_nan", kInv, "dropout_p must be in [0, 1)",
    [](ForwardArgs& a) { a.dropout_p = kNaN; });
  f("negative_softcap", kInv, "softcap must be >= 0", [](ForwardArgs& a) { a.softcap = -1.0f; });
  f("infinite_softcap", kInv, "softcap must be >= 0",
    [](ForwardArgs& a) { a.softcap = std::numeric_limits<float>::infinity(); });
  f("nan_softmax_scale", kInv, "softmax_scale must be finite",
    [](ForwardArgs& a) { a.softmax_scale = kNaN; });
  f("inf_softmax_scale", kInv, "softmax_scale must be finite",
    [](ForwardArgs& a) { a.softmax_scale = std::numeric_limits<float>::infinity(); });
  f("num_threads_negative", kInv, "num_threads must be >= 0",
    [](ForwardArgs& a) { a.num_threads = -1; });
  f("num_splits_negative", kInv, "num_splits must be >= 0",
    [](ForwardArgs& a) { a.num_splits = -3; });
  f("alibi_wrong_shape", kInv, "alibi_slopes must have shape (4)",
    [](ForwardArgs& a) { a.alibi_slopes = view(buffers().alibi.data(), {H + 1}); });
  f("alibi_wrong_batch", kInv, "alibi_slopes must have shape (2, 4)", [](ForwardArgs& a) {
    a.alibi_slopes = view(buffers().alibi.data(), {1, H});
  });
  f("alibi_rank3", kInv, "alibi_slopes must have shape (heads) or (batch, heads)",
    [](ForwardArgs& a) {
      a.alibi_slopes = view(buffers().alibi.data(), {1, 2, H});
    });
  f("alibi_wrong_dtype", kInv, "alibi_slopes must have dtype float32",
    [](ForwardArgs& a) { a.alibi_slopes = view(buffers().alibi.data(), {H}, DType::kFloat16); });
  f("alibi_on_other_device", kInv, "alibi_slopes is on cuda:0", [](ForwardArgs& a) {
    a.alibi_slopes = view(buffers().alibi.data(), {H});
    a.alibi_slopes.device = kCuda0;
  });

  // Varlen.
  fv("cu_seqlens_only_q", kInv,
     "cu_seqlens_q and cu_seqlens_k must be given together; got only cu_seqlens_q",
     [](ForwardArgs& a) { a.cu_seqlens_k = TensorView{}; });
  fv("cu_seqlens_only_k", kInv, "got only cu_seqlens_k",
     [](ForwardArgs& a) { a.cu_seqlens_q = TensorView{}; });
  fv("cu_seqlens_wrong_dtype", kInv, "cu_seqlens_q must have dtype int32",
     [](ForwardArgs& a) { a.cu_seqlens_q.dtype = DType::kFloat32; });
  fv("cu_seqlens_wrong_rank", kInv, "cu_seqlens_k must have 1 dimensions", [](ForwardArgs& a) {
    a.cu_seqlens_k = view(buffers().cu_k.data(), {2, 2}, DType::kInt32);
  });
  fv("cu_seqlens_length_mismatch", kInv, "cu_seqlens_k must have 4 entries",
     [](ForwardArgs& a) { a.cu_seqlens_k.shape[0] = 3; });
  fv("cu_seqlens_non_monotone", kInv, "cu_seqlens_k must be non-decreasing", [](ForwardArgs& a) {
    static std::vector<int32_t> bad = {0, 6, 3, 14};
    a.cu_seqlens_k.data = bad.data();
  });
  fv("cu_seqlens_first_not_zero", kInv, "cu_seqlens_q[0] must be 0", [](ForwardArgs& a) {
    static std::vector<int32_t> bad = {1, 4, 4, 10};
    a.cu_seqlens_q.data = bad.data();
  });
  fv("cu_seqlens_exceeds_rows", kInv, "cu_seqlens_q[batch] = 11 exceeds the 10 rows of q",
     [](ForwardArgs& a) {
       static std::vector<int32_t> bad = {0, 4, 4, 11};
       a.cu_seqlens_q.data = bad.data();
     });
  fv("cu_seqlens_null_data", kInv, "cu_seqlens_q has a null data pointer",
     [](ForwardArgs& a) { a.cu_seqlens_q.data = nullptr; });
  fv("max_seqlen_q_too_small", kInv,
     "max_seqlen_q is 3 but cu_seqlens_q holds a sequence of length 6",
     [](ForwardArgs& a) { a.max_seqlen_q = 3; });
  fv("max_seqlen_negative", kInv, "max_seqlen_q and max_seqlen_k must be >= 0",
     [](ForwardArgs& a) { a.max_seqlen_k = -1; });
  fv("varlen_q_rank4", kInv, "q must have 3 dimensions", [](ForwardArgs& a) {
    a.q = view(buffers().q.data(), {1, 10, H, D});
  });
  fv("varlen_lse_dense_shape", kInv, "lse must have 2 dimensions", [](ForwardArgs& a) {
    a.lse = view(buffers().lse.data(), {3, H, 6});
  });

  // Backward.
  bw("bwd_missing_lse", kInv, "lse is required", [](BackwardArgs& a) { a.lse = TensorView{}; });
  bw("bwd_missing_dout", kInv, "dout is required", [](BackwardArgs& a) { a.dout = TensorView{}; });
  bw("bwd_missing_dq", kInv, "dq is required", [](BackwardArgs& a) { a.dq = TensorView{}; });
  bw("bwd_dk_wrong_shape", kInv, "dk must have shape (2, 7, 2, 8)",
     [](BackwardArgs& a) { a.dk.shape[2] = H; });
  bw("bwd_dv_wrong_shape", kInv, "dv must have shape (2, 7, 2, 8)",
     [](BackwardArgs& a) { a.dv.shape[1] = 5; });
  bw("bwd_dq_dtype_mismatch", kInv, "dq must have dtype float32",
     [](BackwardArgs& a) { a.dq.dtype = DType::kBFloat16; });
  bw("bwd_out_wrong_shape", kInv, "out must have shape (2, 5, 4, 8)",
     [](BackwardArgs& a) { a.out.shape[3] = 4; });
  bw("bwd_lse_wrong_dtype", kInv, "lse must have dtype float32",
     [](BackwardArgs& a) { a.lse.dtype = DType::kInt32; });
  bw("bwd_dv_on_other_device", kInv, "dv is on cuda:0",
     [](BackwardArgs& a) { a.dv.device = kCuda0; });
  bw("bwd_dout_non_unit_stride", kInv, "dout must be contiguous in its last dimension",
     [](BackwardArgs& a) { a.dout.strides[3] = 3; });
  bw("bwd_dropout_p_one", kInv, "dropout_p must be in [0, 1)",
     [](BackwardArgs& a) { a.dropout_p = 1.0f; });
  bw("bwd_dk_stride_zero", kInv, "dk is written by the call and must not have stride 0 in dimension 0",
     [](BackwardArgs& a) { a.dk.strides[0] = 0; });
  bw("bwd_dq_stride_zero", kInv, "dq is written by the call and must not have stride 0 in dimension 2",
     [](BackwardArgs& a) { a.dq.strides[2] = 0; });

  // A block size near 2^31: seqlen + block_size - 1 overflowed int32, so the expected block
  // mask had 0 (or -1) blocks and an empty mask passed, to be read out of bounds.
  f("block_mask_empty_with_int32_max_block_size", kInv, "block_mask must be broadcastable to (2, 4, 1, 1)",
    [](ForwardArgs& a) {
      a.block_mask = view(buffers().block_mask.data(), {1, 1, 0, 0}, DType::kUInt8);
      a.block_size_q = a.block_size_k = std::numeric_limits<int32_t>::max();
    });

#if !defined(FLASHATTN_WITH_CUDA)
  f("cuda_tensors_without_cuda_backend", S::kNotSupported, "no CUDA backend", [](ForwardArgs& a) {
    for (TensorView* t : {&a.q, &a.k, &a.v, &a.out, &a.lse}) t->device = kCuda0;
  });
#endif
  return cs;
}

class Errors : public testing::TestWithParam<ErrorCase> {};

TEST_P(Errors, ReturnsCodeAndNamesTheArgument) {
  const ErrorCase& c = GetParam();
  Status s;
  if (c.fwd) {
    ForwardArgs a = c.varlen ? varlen_forward() : dense_forward();
    c.fwd(a);
    s = forward(a);
  } else {
    BackwardArgs a = dense_backward();
    c.bwd(a);
    s = backward(a);
  }
  EXPECT_EQ(s.code(), c.code) << "got " << status_code_name(s.code()) << ": " << s.message();
  EXPECT_NE(s.message().find(c.needle), std::string::npos)
      << "message \"" << s.message() << "\" does not contain \"" << c.needle << "\"";
}

INSTANTIATE_TEST_SUITE_P(Invalid, Errors, testing::ValuesIn(error_cases()),
                         [](const testing::TestParamInfo<ErrorCase>& param_info) {
                           return param_info.param.name;
                         });

// The unmutated calls succeed, so each case above fails because of its one change.
TEST(ErrorBaselines, ValidCallsSucceed) {
  ForwardArgs f = dense_forward();
  Status s = forward(f);
  ASSERT_TRUE(s.ok()) << s.message();
  f.alibi_slopes = view(buffers().alibi.data(), {B, H});
  s = forward(f);
  ASSERT_TRUE(s.ok()) << s.message();
  f.alibi_slopes = view(buffers().alibi.data(), {H});
  s = forward(f);
  ASSERT_TRUE(s.ok()) << s.message();
  s = forward(varlen_forward());
  ASSERT_TRUE(s.ok()) << s.message();
  ForwardArgs v = varlen_forward();
  v.max_seqlen_q = 6, v.max_seqlen_k = 6;
  s = forward(v);
  ASSERT_TRUE(s.ok()) << s.message();
  s = backward(dense_backward());
  ASSERT_TRUE(s.ok()) << s.message();
  for (float x : buffers().dq) ASSERT_FALSE(std::isnan(x));
}

// A block as long as the sequences or longer, up to 2^31 - 1, is one block: a (1, 1, 1, 1)
// block mask that keeps it gives the call without a block mask, bit for bit.
TEST(ErrorBaselines, BlockSizeUpToInt32MaxIsOneBlock) {
  ForwardArgs f = dense_forward();
  ASSERT_TRUE(forward(f).ok());
  const std::vector<float> plain = buffers().out;
  for (int32_t bs : {Sk, 1 << 30, std::numeric_limits<int32_t>::max() - 3, std::numeric_limits<int32_t>::max()}) {
    std::fill(buffers().out.begin(), buffers().out.end(), kNaN);
    f.block_mask = view(buffers().block_mask.data(), {1, 1, 1, 1}, DType::kUInt8);
    f.block_size_q = f.block_size_k = bs;
    const Status s = forward(f);
    ASSERT_TRUE(s.ok()) << "block size " << bs << ": " << s.message();
    EXPECT_EQ(buffers().out, plain) << "block size " << bs;
  }
}

TEST(ErrorBaselines, AtLeastFifteenDistinctInvalidCalls) { EXPECT_GE(error_cases().size(), 15u); }

}  // namespace
}  // namespace flashattn::test
