// Additive bias, boolean mask and block-sparse mask (issue 18): values against the float64
// reference given the equivalent dense bias and keep mask, dbias against the reference's
// (summed over the broadcast dimensions) and the reference's dbias against float64 finite
// differences, reproducibility of dbias, and the argument checks, on dense calls (varlen calls
// and the compressed block mask: test_block_sparse.cpp). CUDA runs each case in bfloat16
// (float32 is CPU-only), gradients included, dbias with softcap too (score_mods_util.h
// run_and_check; skipped without a GPU; the CUDA-specific cases are in
// test_sparse_cuda.cpp). BiasSm90: the Hopper forward's bias kernel (sm90/fwd_kernel.h,
// FwdBiasTraits) at head dims 64 and 128 (attn_mask alone: FwdMaskTraits, 256 too), with the sm80
// forward on the same inputs.
#include <gtest/gtest.h>

#if defined(FLASHATTN_WITH_CUDA)
#include <cuda_runtime.h>
#endif

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/workspace_allocator.h"
#include "score_mods_util.h"
#include "test_util.h"

namespace flashattn::test {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

struct ModsSpec {
  std::string name;
  DType dtype = DType::kFloat32;
  int batch = 2, seqlen_q = 70, seqlen_k = 90, heads = 4, heads_k = 2, head_dim = 32,
      head_dim_v = 24;
  bool causal = false;
  int window_left = -1, window_right = -1;
  float softcap = 0.0f;
  bool alibi = false;
  // attn_bias: off, or sizes of its three leading dimensions (1 = broadcast, 0 = full).
  bool bias = true;
  std::array<int, 3> bias_dims = {0, 0, 0};
  DType bias_dtype = DType::kFloat32;
  double bias_neg_inf = 0.0;  // fraction of bias entries that are -inf
  bool dbias = true;
  bool dbias_in_bias_dtype = false;  // dbias in bias_dtype (16-bit) instead of float32
  // attn_mask (batch, 1, seqlen_q, seqlen_k): keep density; < 0 = off.
  double mask_density = -1.0;
  // Its layout: padded (rows of seqlen_k + 8 bytes, base 8 bytes into the buffer: not 16-byte
  // aligned), contiguous, or kPaddedOdd (rows of seqlen_k + 3 bytes: the pack reads bytes); the
  // sm90 kernels pack every layout into bits.
  Layout mask_layout = Layout::kPadded;
  // block_mask (1, heads, ..): density of kept blocks; < 0 = off. Block row 0 keeps nothing
  // when the density is strictly between 0 and 1 and there are several block rows (rows with
  // no kept block).
  double block_density = -1.0;
  int block_q = 16, block_k = 32;
  uint32_t seed = 1;
};

std::vector<ModsSpec> cases() {
  std::vector<ModsSpec> cs;
  ModsSpec s;
  s.name = "full_bias";
  cs.push_back(s);
  s.name = "bias_heads_broadcast_gqa";  // (batch, 1, sq, sk): shared by the kv heads
  s.bias_dims = {0, 1, 0};
  cs.push_back(s);
  s.name = "bias_batch_broadcast";  // (1, heads, sq, sk): T5-style relative position bias
  s.bias_dims = {1, 0, 0};
  cs.push_back(s);
  s.name = "bias_row_broadcast_causal";  // (batch, 1, 1, sk): a key-padding bias
  s.bias_dims = {0, 1, 1};
  s.causal = true;
  s.seqlen_q = 100;  // seqlen_q > seqlen_k: the first rows see no key
  cs.push_back(s);
  s = ModsSpec{};
  s.name = "all_broadcast_mqa";  // (1, 1, 1, sk) with one kv head
  s.bias_dims = {1, 1, 1};
  s.heads_k = 1;
  cs.push_back(s);
  s = ModsSpec{};
  s.name = "bias_neg_inf_softcap_alibi_window";
  s.bias_neg_inf = 0.3;
  s.softcap = 4.0f;
  s.alibi = true;
  s.window_left = 20, s.window_right = 7;
  cs.push_back(s);
  s = ModsSpec{};
  s.name = "mask_and_bias";
  s.mask_density = 0.6;
  cs.push_back(s);
  s = ModsSpec{};
  s.name = "mask_only_rows_fully_masked";
  s.bias = false, s.dbias = false;
  s.mask_density = 0.02;  // many rows keep nothing
  cs.push_back(s);
  for (double density : {0.0, 0.3, 1.0}) {
    s = ModsSpec{};
    s.name = "block_density_" + std::to_string(static_cast<int>(density * 100));
    s.bias = false, s.dbias = false;
    s.block_density = density;
    s.seqlen_q = 150, s.seqlen_k = 200;  // several CPU tiles, ragged
    cs.push_back(s);
  }
  s = ModsSpec{};
  s.name = "block_mask_bias_causal_softcap_gqa";
  s.block_density = 0.5, s.block_q = 40, s.block_k = 24;  // blocks unaligned with CPU tiles
  s.causal = true, s.softcap = 3.0f, s.alibi = true;
  s.seqlen_q = 150, s.seqlen_k = 200;
  s.mask_density = 0.8;
  s.bias_dims = {1, 0, 1};
  cs.push_back(s);
  s = ModsSpec{};
  s.name = "seqlen_1_odd_block";
  s.seqlen_q = 1, s.seqlen_k = 77, s.block_density = 0.5, s.block_q = 1, s.block_k = 7;
  cs.push_back(s);
  uint32_t seed = 1800;
  for (ModsSpec& c : cs) c.seed = seed++;
  return cs;
}

// Everything of one case on the host, in the reference layouts, and as views on a backend.
struct Built : ModsCase {
  std::vector<float> slopes;
  View biasv, maskv, blockv, slopesv;
};

Built build(const ModsSpec& s, Backend be) {
  Built b;
  std::mt19937 g(s.seed);
  const int B = s.batch, Sq = s.seqlen_q, Sk = s.seqlen_k, H = s.heads, Hk = s.heads_k;
  b.shape = reference::Shape::dense(B, Sq, Sk, H, Hk, s.head_dim, s.head_dim_v);
  b.opt.scale = 1.0 / std::sqrt(static_cast<double>(s.head_dim));
  b.opt.window_left = s.window_left;
  b.opt.window_right = s.causal ? 0 : s.window_right;
  b.opt.softcap = s.softcap;
  b.opt.mods_rows = Sq, b.opt.mods_cols = Sk;
  const auto n = [](std::initializer_list<int64_t> d) {
    size_t p = 1;
    for (int64_t x : d) p *= static_cast<size_t>(x);
    return p;
  };
  b.q = randn(g, n({B, Sq, H, s.head_dim}), s.dtype);
  b.k = randn(g, n({B, Sk, Hk, s.head_dim}), s.dtype);
  b.v = randn(g, n({B, Sk, Hk, s.head_dim_v}), s.dtype);
  b.dout = randn(g, n({B, Sq, H, s.head_dim_v}), s.dtype);
  // Strided views (padded strides) for the attention operands.
  b.qv = upload(be, s.dtype, Layout::kPadded, {B, Sq, H, s.head_dim}, b.q);
  b.kv = upload(be, s.dtype, Layout::kPadded, {B, Sk, Hk, s.head_dim}, b.k);
  b.vv = upload(be, s.dtype, Layout::kPadded, {B, Sk, Hk, s.head_dim_v}, b.v);
  b.doutv = upload(be, s.dtype, Layout::kContiguous, {B, Sq, H, s.head_dim_v}, b.dout);
  b.outv = upload(be, s.dtype, Layout::kContiguous, {B, Sq, H, s.head_dim_v}, {});
  b.lsev = upload(be, DType::kFloat32, Layout::kContiguous, {B, H, Sq}, {});
  b.dqv = upload(be, s.dtype, Layout::kContiguous, {B, Sq, H, s.head_dim}, {});
  b.dkv = upload(be, s.dtype, Layout::kContiguous, {B, Sk, Hk, s.head_dim}, {});
  b.dvv = upload(be, s.dtype, Layout::kContiguous, {B, Sk, Hk, s.head_dim_v}, {});

  if (s.alibi) {
    for (int h = 0; h < H; ++h) b.slopes.push_back(0.05f * static_cast<float>(h + 1));
    b.slopesv = upload(be, DType::kFloat32, Layout::kContiguous, {H},
                       std::vector<double>(b.slopes.begin(), b.slopes.end()));
    for (int bb = 0; bb < B; ++bb) {
      for (int h = 0; h < H; ++h) b.opt.alibi.push_back(b.slopes[static_cast<size_t>(h)]);
    }
  }

  const size_t full = n({B, H, Sq, Sk});
  std::vector<unsigned char> keep(full, 1);
  if (s.bias) {
    const int64_t full_dims[3] = {B, H, Sq};
    for (int i = 0; i < 3; ++i) {
      b.bias_shape[static_cast<size_t>(i)] = s.bias_dims[static_cast<size_t>(i)] == 1 ? 1 : full_dims[i];
    }
    b.bias_shape[3] = Sk;
    const auto& bs = b.bias_shape;
    b.bias = randn(g, n({bs[0], bs[1], bs[2], bs[3]}), s.bias_dtype, 2.0);
    std::uniform_real_distribution<double> u(0.0, 1.0);
    for (double& e : b.bias) {
      if (u(g) < s.bias_neg_inf) e = -kInf;
    }
    // The bias is viewed with padded strides; a broadcast dimension could equally be expanded
    // with stride 0 (the Python tests do that).
    b.biasv = upload(be, s.bias_dtype, Layout::kPadded, {bs[0], bs[1], bs[2], bs[3]}, b.bias);
    if (s.dbias) {
      b.dbiasv = upload(be, s.dbias_in_bias_dtype ? s.bias_dtype : DType::kFloat32, Layout::kPaddedOdd,
                        {bs[0], bs[1], bs[2], bs[3]}, {});
    }
    b.opt.bias = expand_to_dense(b.bias, bs, B, H, Sq, Sk);
  }
  if (s.mask_density >= 0.0) {
    std::bernoulli_distribution keep_d(s.mask_density);
    std::vector<double> m(n({B, 1, Sq, Sk}));
    for (double& e : m) e = keep_d(g) ? 1.0 : 0.0;
    b.maskv = upload(be, DType::kUInt8, s.mask_layout, {B, 1, Sq, Sk}, m);
    for (size_t e = 0; e < full; ++e) {
      const size_t j = e % Sk, i = e / Sk % Sq, bb = e / (static_cast<size_t>(Sk) * Sq * H);
      if (m[(bb * Sq + i) * Sk + j] == 0.0) keep[e] = 0;
    }
  }
  if (s.block_density >= 0.0) {
    const int nqb = (Sq + s.block_q - 1) / s.block_q, nkb = (Sk + s.block_k - 1) / s.block_k;
    std::bernoulli_distribution keep_d(s.block_density);
    std::vector<double> m(n({1, H, nqb, nkb}));
    for (size_t e = 0; e < m.size(); ++e) {
      const bool empty_row =
          nqb > 1 && s.block_density > 0.0 && s.block_density < 1.0 && e / nkb % nqb == 0;
      m[e] = !empty_row && keep_d(g) ? 1.0 : 0.0;
    }
    b.blockv = upload(be, DType::kUInt8, Layout::kContiguous, {1, H, nqb, nkb}, m);
    for (size_t e = 0; e < full; ++e) {
      const size_t j = e % Sk, i = e / Sk % Sq, h = e / (static_cast<size_t>(Sk) * Sq) % H;
      if (m[(h * nqb + i / s.block_q) * nkb + j / s.block_k] == 0.0) keep[e] = 0;
    }
  }
  if (s.mask_density >= 0.0 || s.block_density >= 0.0) b.opt.keep = keep;
  return b;
}

void set_options(const ModsSpec& s, const Built& b, AttentionOptions* o) {
  o->causal = s.causal;
  o->window_left = s.window_left;
  o->window_right = s.window_right;
  o->softcap = s.softcap;
  o->num_threads = 2;
  if (b.slopesv.defined()) o->alibi_slopes = b.slopesv.tensor();
  if (b.biasv.defined()) o->attn_bias = b.biasv.tensor();
  if (b.maskv.defined()) o->attn_mask = b.maskv.tensor();
  if (b.blockv.defined()) {
    o->block_mask = b.blockv.tensor();
    o->block_size_q = s.block_q;
    o->block_size_k = s.block_k;
  }
}

AttentionOptions options(const ModsSpec& s, const Built& b) {
  AttentionOptions o;
  set_options(s, b, &o);
  return o;
}

ForwardArgs forward_args(const ModsSpec& s, const Built& b) {
  return case_forward_args(b, options(s, b));
}

BackwardArgs backward_args(const ModsSpec& s, const Built& b) {
  return case_backward_args(b, options(s, b));
}

using Param = std::tuple<Backend, size_t>;
class ScoreMods : public testing::TestWithParam<Param> {};

TEST_P(ScoreMods, MatchesReference) {
  const auto [backend, index] = GetParam();
  FLASHATTN_SKIP_IF_UNAVAILABLE(backend);
  ModsSpec s = cases()[index];
  if (backend == Backend::kCuda && s.dtype == DType::kFloat32) s.dtype = DType::kBFloat16;
  if (backend == Backend::kCuda && cuda_not_built(s.dtype, s.head_dim, s.head_dim_v)) GTEST_SKIP() << "not built";
  Built b = build(s, backend);
  const ModsRefs refs = run_and_check(backend, b, options(s, b), s.dtype, s.name);
  if (refs.ran && s.dbias && s.dtype == DType::kFloat32) {
    EXPECT_GT(max_abs(refs.dbias), 0.0) << s.name;
  }
}

INSTANTIATE_TEST_SUITE_P(All, ScoreMods,
                         testing::Combine(testing::ValuesIn(all_backends()),
                                          testing::Range<size_t>(0, cases().size())),
                         [](const testing::TestParamInfo<Param>& p) {
                           return std::string(backend_name(std::get<0>(p.param))) + "_" +
                                  cases()[std::get<1>(p.param)].name;
                         });

// A 16-bit run with a bias in q's dtype and one in float32 (forward values).
// ---- The Hopper forward with attn_bias / attn_mask (FwdBiasTraits) -----------------------------
// Head dims 64 and 128, the bias in q's dtype with 16-byte aligned strides (padded layout: rows
// of seqlen_k + 8 elements, so seqlen_k a multiple of 8) and/or attn_mask, no block mask: on a
// Hopper GPU the forward runs on the sm90 bias kernel (under FLASHATTN_CUDA_PATH=sm90 every case
// marked sm90; under auto the split heuristic leaves these small grids to sm80). Each case runs
// the forward and the backward from its LSE (on the sm90 bias backward, BwdBiasTraits, where it
// takes the call: a bias in q's dtype with aligned strides and/or attn_mask) against the reference, then again with the forward
// on sm80 (kFwdSm80), and under FLASHATTN_CUDA_PATH=sm90 on a Hopper GPU checks that the first
// forward ran on the sm90 kernels exactly when marked, read attn_mask as packed bits
// (sm90/mask_bits.h) exactly when marked (every mask the sm90 forward takes), and that each
// backward ran on sm90 exactly when marked.
struct Sm90BiasSpec {
  ModsSpec mods;
  bool sm90;              // the sm90 bias kernel takes it (FLASHATTN_CUDA_PATH=sm90)
  bool bits = false;      // ... and packs its attn_mask into bits (detail::sm90_mask_bits_calls)
  bool sm90_bwd = false;  // the sm90 bias backward takes it (detail::sm90_backward_calls)
};

std::vector<Sm90BiasSpec> sm90_bias_cases() {
  std::vector<Sm90BiasSpec> cs;
  const auto base = [](const char* name, int head_dim) {
    ModsSpec s;
    s.name = name;
    s.dtype = s.bias_dtype = DType::kBFloat16;
    s.head_dim = s.head_dim_v = head_dim;
    s.batch = 2, s.seqlen_q = 200, s.seqlen_k = 264, s.heads = 8, s.heads_k = 2;
    s.dbias = false;
    return s;
  };
  ModsSpec s = base("sm90_d128_full_bias_gqa", 128);
  s.dbias = true;  // dbias stored per element by the sm90 bias backward
  cs.push_back({s, true, false, true});
  s = base("sm90_d64_bias_batch_broadcast_causal", 64);
  s.bias_dims = {1, 0, 0}, s.causal = true, s.dbias = true;  // dbias through partials over the batch
  cs.push_back({s, true, false, true});
  s = base("sm90_d128_key_padding_bias_mask_window", 128);
  s.bias_dims = {0, 1, 1}, s.mask_density = 0.6, s.window_left = 50, s.window_right = 20;
  cs.push_back({s, true, true, true});
  s = base("sm90_d64_mask_only_rows_fully_masked", 64);
  s.bias = false, s.mask_density = 0.02;
  cs.push_back({s, true, true, true});
  s = base("sm90_d128_bias_neg_inf_softcap_alibi_window", 128);
  s.bias_neg_inf = 0.3, s.softcap = 4.0f, s.alibi = true, s.window_left = 20, s.window_right = 7;
  cs.push_back({s, true, false, true});
  s = base("sm90_d128_ragged_113x257_on_sm80", 128);  // rows of 265 elements: not 16-byte multiples
  s.seqlen_q = 113, s.seqlen_k = 257;
  cs.push_back({s, false});
  s = base("sm90_d128_fp16_all_broadcast_ragged_q", 128);
  s.dtype = s.bias_dtype = DType::kFloat16, s.bias_dims = {1, 1, 1}, s.seqlen_q = 131, s.seqlen_k = 136;
  cs.push_back({s, true, false, true});
  s = base("sm90_d64_bias_mask_causal_rows_without_keys", 64);
  s.seqlen_q = 100, s.seqlen_k = 72, s.causal = true, s.mask_density = 0.7, s.bias_dims = {0, 0, 1};
  cs.push_back({s, true, true, true});
  // attn_mask alone, both on the sm90 kernel and packed into bits: contiguous over 256 keys
  // (16-byte aligned base and rows: until 2026-12-03 the forward copied such a mask as a uint8
  // tile), and padded (rows of 264 bytes, base 8 bytes off).
  s = base("sm90_d128_mask_only_contiguous_causal_gqa", 128);
  s.bias = false, s.mask_density = 0.5, s.causal = true, s.seqlen_k = 256, s.mask_layout = Layout::kContiguous;
  cs.push_back({s, true, true, true});
  s = base("sm90_d64_mask_only_rows_of_264_bytes", 64);
  s.bias = false, s.seqlen_k = 256, s.mask_density = 0.5;
  cs.push_back({s, true, true, true});
  // A contiguous mask with a bias at d64.
  s = base("sm90_d64_bias_mask_contiguous_mask", 64);
  s.seqlen_k = 256, s.mask_density = 0.6, s.mask_layout = Layout::kContiguous, s.window_left = 40;
  cs.push_back({s, true, true, true});
  // attn_mask packed into bits with a bias at d128 (no mask slot fits there): a contiguous mask
  // over 264 keys (8-byte loads in the pack, a last key block of 8 keys), causal with rows that
  // see no key; rows of 267 bytes (kPaddedOdd: the pack reads bytes) under a window, fp16; the
  // same odd rows at d64 with a bias; softcap + ALiBi.
  s = base("sm90_d128_bias_mask_bits_causal", 128);
  s.mask_density = 0.6, s.mask_layout = Layout::kContiguous, s.causal = true, s.seqlen_q = 300;
  cs.push_back({s, true, true, true});
  s = base("sm90_d128_fp16_bias_mask_bits_odd_rows_window", 128);
  s.dtype = s.bias_dtype = DType::kFloat16, s.bias_dims = {1, 0, 0}, s.mask_density = 0.5;
  s.mask_layout = Layout::kPaddedOdd, s.window_left = 70, s.window_right = 10;
  cs.push_back({s, true, true, true});
  s = base("sm90_d64_bias_mask_bits_odd_rows", 64);
  s.mask_density = 0.4, s.mask_layout = Layout::kPaddedOdd, s.bias_dims = {0, 1, 0};
  cs.push_back({s, true, true, true});
  s = base("sm90_d128_bias_mask_bits_softcap_alibi", 128);
  s.mask_density = 0.7, s.softcap = 4.0f, s.alibi = true, s.seqlen_q = 131;
  cs.push_back({s, true, true, true});
  // attn_mask alone with ALiBi: the bias kernel (the mask kernel has no score modifiers); and
  // alone under a window in fp16 (the mask kernel).
  s = base("sm90_d64_mask_only_alibi_causal", 64);
  s.bias = false, s.mask_density = 0.6, s.alibi = true, s.causal = true;
  cs.push_back({s, true, true, true});
  s = base("sm90_d128_fp16_mask_only_window", 128);
  s.dtype = s.bias_dtype = DType::kFloat16, s.bias = false, s.mask_density = 0.5;
  s.window_left = 70, s.window_right = 10;
  cs.push_back({s, true, true, true});
  // attn_mask alone at d256: the mask kernel on 64-key blocks (half a packed group each), causal,
  // and under a window with keys past a group boundary; its backward stays on sm80 (the sm90 bias
  // backward is d64 / d128).
  s = base("sm90_d256_mask_only_causal", 256);
  s.bias = false, s.mask_density = 0.6, s.causal = true;
  cs.push_back({s, true, true, false});
  s = base("sm90_d256_mask_only_window_contiguous", 256);
  s.bias = false, s.mask_density = 0.5, s.window_left = 70, s.window_right = 10, s.seqlen_k = 256;
  s.mask_layout = Layout::kContiguous;
  cs.push_back({s, true, true, false});
  s = base("sm90_d128_float32_bias_on_sm80", 128);
  s.bias_dtype = DType::kFloat32;
  cs.push_back({s, false});
  uint32_t seed = 18900;
  for (Sm90BiasSpec& c : cs) c.mods.seed = seed++;
  return cs;
}

// A Hopper GPU whose forward FLASHATTN_CUDA_PATH=sm90 sends to the sm90 kernels.
bool sm90_forced_here() {
#if defined(FLASHATTN_WITH_CUDA) && defined(FLASHATTN_TEST_CUDA_SM90)
  int major = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) != cudaSuccess) return false;
  const char* path = std::getenv("FLASHATTN_CUDA_PATH");
  return major == 9 && path != nullptr && std::string(path) == "sm90";
#else
  return false;
#endif
}

class BiasSm90 : public testing::TestWithParam<size_t> {};

TEST_P(BiasSm90, MatchesReferenceAndSm80) {
  FLASHATTN_SKIP_IF_UNAVAILABLE(Backend::kCuda);
  const Sm90BiasSpec c = sm90_bias_cases()[GetParam()];
  const ModsSpec& s = c.mods;
  if (cuda_not_built(s.dtype, s.head_dim, s.head_dim_v)) GTEST_SKIP() << "not built";
  for (bool sm80 : {false, true}) {
    ScopedSwitch path(detail::Switch::kFwdSm80, sm80);
    Built b = build(s, Backend::kCuda);
    const unsigned long long before = detail::sm90_forward_calls(), bits_before = detail::sm90_mask_bits_calls();
    const unsigned long long mask_kernel_before = detail::sm90_mask_kernel_calls();
    const unsigned long long bwd_before = detail::sm90_backward_calls();
    const ModsRefs refs = run_and_check(Backend::kCuda, b, options(s, b), s.dtype, s.name + (sm80 ? " (sm80)" : ""));
    EXPECT_TRUE(refs.ran) << s.name;
    const unsigned long long ran = detail::sm90_forward_calls() - before;
    const unsigned long long bwd_ran = detail::sm90_backward_calls() - bwd_before;
    const unsigned long long bits = detail::sm90_mask_bits_calls() - bits_before;
    EXPECT_LE(bits, ran) << s.name << ": the mask bits count only sm90 forwards";
    if (sm80) {
      EXPECT_EQ(ran, 0u) << s.name << ": kFwdSm80 did not keep the forward on sm80";
    } else if (sm90_forced_here()) {
      EXPECT_EQ(ran, c.sm90 ? 1u : 0u) << s.name << ": the forward " << (c.sm90 ? "did not run" : "ran") << " on sm90";
      EXPECT_EQ(bits, c.bits ? 1u : 0u) << s.name << ": the mask " << (c.bits ? "was not" : "was") << " packed into bits";
      // attn_mask alone, without softcap or ALiBi: the mask kernel (FwdMaskTraits); the rest the bias kernel.
      const bool alone = c.sm90 && !s.bias && s.mask_density >= 0.0 && s.softcap == 0.0f && !s.alibi;
      EXPECT_EQ(detail::sm90_mask_kernel_calls() - mask_kernel_before, alone ? 1u : 0u)
          << s.name << ": the forward " << (alone ? "did not run" : "ran") << " on the mask kernel";
      EXPECT_EQ(bwd_ran, c.sm90_bwd ? 1u : 0u)
          << s.name << ": the backward " << (c.sm90_bwd ? "did not run" : "ran") << " on sm90";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(All, BiasSm90, testing::Range<size_t>(0, sm90_bias_cases().size()),
                         [](const testing::TestParamInfo<size_t>& p) { return sm90_bias_cases()[p.param].mods.name; });

TEST(ScoreModsCpu, Bf16BiasDtypes) {
  for (DType bias_dtype : {DType::kBFloat16, DType::kFloat32}) {
    ModsSpec s;
    s.name = std::string("bf16_bias_") + dtype_name(bias_dtype);
    s.dtype = DType::kBFloat16, s.bias_dtype = bias_dtype, s.dbias = true;
    s.bias_dims = {1, 0, 0}, s.block_density = 0.6, s.seed = 77;
    Built b = build(s, Backend::kCpu);
    ASSERT_TRUE(forward(forward_args(s, b)).ok());
    b.outv.arena->download();
    b.lsev.arena->download();
    std::vector<double> out(b.outv.numel()), lse(static_cast<size_t>(s.heads) * s.batch * s.seqlen_q);
    reference::forward(b.shape, b.opt, b.q.data(), b.k.data(), b.v.data(), out.data(), lse.data());
    EXPECT_TRUE(meets_criterion("out", s.dtype, b.outv.read(), out, out)) << s.name;
    EXPECT_TRUE(meets_criterion("lse", DType::kFloat32,
                                lse_ref_layout(b.lsev.read(), s.batch, s.heads, s.seqlen_q), lse, {}))
        << s.name;
    // The backward runs and fills dbias with finite values.
    const Status bs = backward(backward_args(s, b));
    ASSERT_TRUE(bs.ok()) << bs.message();
    b.dbiasv.arena->download();
    for (double x : b.dbiasv.read()) ASSERT_TRUE(std::isfinite(x));
  }
}

// dbias in the bias's 16-bit dtype is the float32 dbias of the same call rounded to nearest even,
// bit for bit: per element (the sm90 bias kernel stores it rounded), through partials (a bias
// shared over the batch; a 16-bit (B, H, ..) dbias on the CPU and sm80), and summed over the
// rows (key padding), with and without a causal mask (elements no step writes must be 0).
using Dbias16Param = std::tuple<Backend, int>;
class Dbias16 : public testing::TestWithParam<Dbias16Param> {};

TEST_P(Dbias16, IsTheFloat32GradientRounded) {
  const auto [backend, shape] = GetParam();
  FLASHATTN_SKIP_IF_UNAVAILABLE(backend);
  for (const DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    ModsSpec s;
    s.name = std::string("dbias16_") + dtype_name(dtype) + "_" + std::to_string(shape);
    s.dtype = s.bias_dtype = dtype;
    s.head_dim = s.head_dim_v = 64;
    s.batch = 2, s.seqlen_q = 200, s.seqlen_k = 264, s.heads = 4, s.heads_k = 2;
    s.bias_dims = shape == 0 ? std::array<int, 3>{0, 0, 0} : shape == 1 ? std::array<int, 3>{1, 0, 0}
                                                                          : std::array<int, 3>{0, 0, 1};
    s.causal = shape != 2;
    if (backend == Backend::kCuda && cuda_not_built(s.dtype, s.head_dim, s.head_dim_v)) GTEST_SKIP() << "not built";
    std::vector<double> got[2];
    for (int narrow = 0; narrow < 2; ++narrow) {
      s.dbias_in_bias_dtype = narrow == 1;
      Built b = build(s, backend);  // the same seed: the same inputs
      ASSERT_TRUE(forward(forward_args(s, b)).ok()) << s.name;
      const Status bs = backward(backward_args(s, b));
      ASSERT_TRUE(bs.ok()) << s.name << ": " << bs.message();
      b.dbiasv.arena->download();
      EXPECT_TRUE(b.dbiasv.arena->padding_untouched("dbias")) << s.name;
      got[narrow] = b.dbiasv.read();
    }
    ASSERT_EQ(got[0].size(), got[1].size());
    ASSERT_GT(max_abs(got[0]), 0.0) << s.name;
    for (size_t e = 0; e < got[0].size(); ++e) {
      ASSERT_EQ(got[1][e], round_to(dtype, got[0][e])) << s.name << " element " << e << " (float32 " << got[0][e] << ")";
    }
  }
}

std::string dbias16_name(const testing::TestParamInfo<Dbias16Param>& p) {
  static const char* const kShapes[] = {"per_element_causal", "batch_broadcast_causal", "row_sums"};
  return std::string(backend_name(std::get<0>(p.param))) + "_" + kShapes[std::get<1>(p.param)];
}

INSTANTIATE_TEST_SUITE_P(All, Dbias16, testing::Combine(testing::ValuesIn(all_backends()), testing::Range(0, 3)),
                         dbias16_name);

// set_workspace_allocator swaps the allocator in and out and hands the previous one back; one
// without release counts as none.
TEST(WorkspaceAllocator, InstallsAndReturnsThePrevious) {
  WorkspaceAllocator mine;
  mine.allocate = [](size_t, void*, void*) -> void* { return nullptr; };
  mine.release = [](void*, void*, void*) {};
  mine.min_bytes = 12345;
  const WorkspaceAllocator before = set_workspace_allocator(mine);
  EXPECT_EQ(before.allocate, nullptr);
  WorkspaceAllocator half = mine;
  half.release = nullptr;
  const WorkspaceAllocator was = set_workspace_allocator(half);
  EXPECT_EQ(was.allocate, mine.allocate);
  EXPECT_EQ(was.min_bytes, 12345u);
  EXPECT_EQ(set_workspace_allocator(before).allocate, nullptr);  // `half` installed nothing
}

// The bookkeeping behind it, on the host: only workspaces of min_bytes or more are offered; a
// block that is not 256-byte aligned goes straight back and the pool serves; a block handed out is
// released once, through its allocator, and then forgotten; other pointers are the pool's.
TEST(WorkspaceAllocator, OffersBigAlignedBlocksAndReleasesEachOnce) {
  struct Fake {
    uintptr_t next = 0;
    std::vector<uintptr_t> released;
  } fake;
  WorkspaceAllocator mine;
  mine.allocate = [](size_t, void*, void* c) -> void* { return reinterpret_cast<void*>(static_cast<Fake*>(c)->next); };
  mine.release = [](void* p, void*, void* c) { static_cast<Fake*>(c)->released.push_back(reinterpret_cast<uintptr_t>(p)); };
  mine.context = &fake;
  mine.min_bytes = 100;
  const WorkspaceAllocator saved = set_workspace_allocator(mine);
  EXPECT_FALSE(detail::hook_takes(99));
  EXPECT_TRUE(detail::hook_takes(100));
  fake.next = 0x1010;  // 16-byte aligned only
  EXPECT_EQ(detail::hooked_allocate(100, nullptr), nullptr);
  EXPECT_EQ(fake.released, std::vector<uintptr_t>{0x1010});
  fake.next = 0x2000;
  EXPECT_EQ(detail::hooked_allocate(99, nullptr), nullptr) << "below min_bytes";
  void* block = detail::hooked_allocate(100, nullptr);
  EXPECT_EQ(block, reinterpret_cast<void*>(0x2000));
  set_workspace_allocator(saved);  // replaced: the block still goes back to `mine`
  EXPECT_FALSE(detail::hook_takes(100));
  EXPECT_FALSE(detail::hooked_release(reinterpret_cast<void*>(0x3000), nullptr));
  EXPECT_TRUE(detail::hooked_release(block, nullptr));
  EXPECT_FALSE(detail::hooked_release(block, nullptr)) << "released twice";
  EXPECT_EQ(fake.released, (std::vector<uintptr_t>{0x1010, 0x2000}));
}

#if defined(FLASHATTN_WITH_CUDA)
// The CUDA backward with an application's allocator: the same gradients, bit for bit, as with
// the pool, every workspace of at least min_bytes taken from it and each given back exactly once
// on the stream it was taken for; with min_bytes above every workspace it is never asked.
struct CountingAllocator {
  int allocations = 0, releases = 0, bad_releases = 0;
  size_t largest = 0;
  std::vector<std::pair<void*, void*>> out;  // (block, stream)
  static void* allocate(size_t bytes, void* stream, void* self) {
    auto* c = static_cast<CountingAllocator*>(self);
    void* ptr = nullptr;
    if (cudaMalloc(&ptr, bytes) != cudaSuccess) return nullptr;
    ++c->allocations, c->largest = std::max(c->largest, bytes);
    c->out.emplace_back(ptr, stream);
    return ptr;
  }
  static void release(void* ptr, void* stream, void* self) {
    auto* c = static_cast<CountingAllocator*>(self);
    ++c->releases;
    const auto it = std::find(c->out.begin(), c->out.end(), std::make_pair(ptr, stream));
    if (it == c->out.end()) {
      ++c->bad_releases;
      return;
    }
    c->out.erase(it);
    // Not stream-ordered itself: waits for the work queued so far, then frees.
    if (cudaStreamSynchronize(static_cast<cudaStream_t>(stream)) != cudaSuccess || cudaFree(ptr) != cudaSuccess) {
      ++c->bad_releases;
    }
  }
};

// The allocator tests' call: bf16 at d64, causal, a bias shared over a batch of 3, so dbias goes
// through float32 partials in the workspace.
ModsSpec workspace_case(const char* name) {
  ModsSpec s;
  s.name = name;
  s.dtype = s.bias_dtype = DType::kBFloat16;
  s.head_dim = s.head_dim_v = 64;
  s.batch = 3, s.seqlen_q = 200, s.seqlen_k = 264, s.heads = 4, s.heads_k = 2;
  s.bias_dims = {1, 0, 0}, s.causal = true;
  return s;
}

TEST(WorkspaceAllocator, CudaBackwardTakesItsWorkspacesFromIt) {
  FLASHATTN_SKIP_IF_UNAVAILABLE(Backend::kCuda);
  const ModsSpec s = workspace_case("workspace_allocator");
  if (cuda_not_built(s.dtype, s.head_dim, s.head_dim_v)) GTEST_SKIP() << "not built";
  const auto run = [&](std::vector<std::vector<double>>* grads) {
    Built b = build(s, Backend::kCuda);  // the same seed: the same inputs
    ASSERT_TRUE(forward(forward_args(s, b)).ok());
    const Status st = backward(backward_args(s, b));
    ASSERT_TRUE(st.ok()) << st.message();
    for (View* v : {&b.dqv, &b.dkv, &b.dvv, &b.dbiasv}) {
      v->arena->download();
      grads->push_back(v->read());
    }
  };
  std::vector<std::vector<double>> pool, hooked, above;
  run(&pool);
  CountingAllocator counter;
  WorkspaceAllocator a;
  a.allocate = &CountingAllocator::allocate, a.release = &CountingAllocator::release, a.context = &counter;
  a.min_bytes = 1;
  const WorkspaceAllocator saved = set_workspace_allocator(a);
  run(&hooked);
  const int taken = counter.allocations;
  a.min_bytes = counter.largest + 1;
  set_workspace_allocator(a);
  run(&above);
  set_workspace_allocator(saved);
  EXPECT_GE(taken, 1);
  EXPECT_GE(counter.largest, size_t(s.batch) * s.heads * s.seqlen_q * s.seqlen_k * 4);  // the partials
  EXPECT_EQ(counter.allocations, taken) << "min_bytes above every workspace still allocated";
  EXPECT_EQ(counter.releases, counter.allocations);
  EXPECT_EQ(counter.bad_releases, 0);
  EXPECT_TRUE(counter.out.empty());
  ASSERT_EQ(pool.size(), hooked.size());
  for (size_t t = 0; t < pool.size(); ++t) {
    EXPECT_EQ(pool[t], hooked[t]) << "gradient " << t;
    EXPECT_EQ(pool[t], above[t]) << "gradient " << t;
  }
  EXPECT_GT(max_abs(pool[3]), 0.0);
}

// While the call's stream is captured into a CUDA graph the pool serves every workspace (a
// memory node of the graph), not the application's allocator: the captured backward asks it
// nothing, and the graph's launch gives the eager call's dk, dv and dbias.
TEST(WorkspaceAllocator, NotAskedUnderGraphCapture) {
  FLASHATTN_SKIP_IF_UNAVAILABLE(Backend::kCuda);
  const ModsSpec s = workspace_case("workspace_allocator_capture");
  if (cuda_not_built(s.dtype, s.head_dim, s.head_dim_v)) GTEST_SKIP() << "not built";
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  CountingAllocator counter;
  WorkspaceAllocator a;
  a.allocate = &CountingAllocator::allocate, a.release = &CountingAllocator::release, a.context = &counter;
  a.min_bytes = 1;
  std::vector<std::vector<double>> grads[2];  // eager, graph
  for (int graph = 0; graph < 2; ++graph) {
    Built b = build(s, Backend::kCuda);  // the same seed: the same inputs
    ASSERT_TRUE(forward(forward_args(s, b)).ok());
    BackwardArgs args = backward_args(s, b);
    args.stream = stream;
    if (graph == 0) {
      ASSERT_TRUE(backward(args).ok());
    } else {
      const WorkspaceAllocator saved = set_workspace_allocator(a);
      cudaGraph_t g = nullptr;
      cudaGraphExec_t exec = nullptr;
      ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
      const Status st = backward(args);
      ASSERT_EQ(cudaStreamEndCapture(stream, &g), cudaSuccess);
      set_workspace_allocator(saved);
      ASSERT_TRUE(st.ok()) << st.message();
      EXPECT_EQ(counter.allocations, 0) << "the allocator was asked during the capture";
      ASSERT_EQ(cudaGraphInstantiate(&exec, g, 0), cudaSuccess);
      ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
      (void)cudaGraphExecDestroy(exec);
      (void)cudaGraphDestroy(g);
    }
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    for (View* v : {&b.dkv, &b.dvv, &b.dbiasv}) {
      v->arena->download();
      grads[graph].push_back(v->read());
    }
  }
  (void)cudaStreamDestroy(stream);
  for (size_t t = 0; t < grads[0].size(); ++t) EXPECT_EQ(grads[0][t], grads[1][t]) << "gradient " << t;
}
#endif

// Block density 0: every row sees nothing. out 0, LSE -inf, zero gradients, no NaN.
TEST(ScoreModsCpu, NoKeptBlockIsTheFullyMaskedRule) {
  ModsSpec s;
  s.block_density = 0.0, s.bias = true, s.dbias = true;
  Built b = build(s, Backend::kCpu);
  ASSERT_TRUE(forward(forward_args(s, b)).ok());
  b.outv.arena->download();
  b.lsev.arena->download();
  for (double x : b.outv.read()) ASSERT_EQ(x, 0.0);
  for (double x : b.lsev.read()) ASSERT_EQ(x, -kInf);
  ASSERT_TRUE(backward(backward_args(s, b)).ok());
  for (View* v : {&b.dqv, &b.dkv, &b.dvv, &b.dbiasv}) {
    v->arena->download();
    for (double x : v->read()) ASSERT_EQ(x, 0.0);
  }
}

// Absent blocks are skipped entirely: keys that only absent blocks cover are never loaded, so
// NaN in their K and V rows reaches nothing (an element mask multiplies P = 0 by NaN inside
// the tiles it processes). Key block 1 (keys 64..127, one CPU tile) is absent for every query.
TEST(ScoreModsCpu, AbsentBlocksAreNotRead) {
  ModsSpec s;
  s.bias = false, s.dbias = false;
  s.seqlen_q = 80, s.seqlen_k = 200, s.block_q = 16, s.block_k = 64, s.block_density = 1.0;
  Built b = build(s, Backend::kCpu);
  const int nqb = 5, nkb = 4;
  std::vector<double> blocks(static_cast<size_t>(s.heads) * nqb * nkb, 1.0);
  for (size_t e = 1; e < blocks.size(); e += nkb) blocks[e] = 0.0;
  b.blockv.write(blocks);
  b.blockv.arena->upload();
  for (int bb = 0; bb < s.batch; ++bb) {
    for (int j = 64; j < 128; ++j) {
      for (int h = 0; h < s.heads_k; ++h) {
        for (int c = 0; c < s.head_dim; ++c) {
          b.kv.arena->set(b.kv.offset + bb * b.kv.strides[0] + j * b.kv.strides[1] + h * b.kv.strides[2] + c,
                          std::numeric_limits<double>::quiet_NaN());
        }
        for (int c = 0; c < s.head_dim_v; ++c) {
          b.vv.arena->set(b.vv.offset + bb * b.vv.strides[0] + j * b.vv.strides[1] + h * b.vv.strides[2] + c,
                          std::numeric_limits<double>::quiet_NaN());
        }
      }
    }
  }
  b.kv.arena->upload();
  b.vv.arena->upload();
  ASSERT_TRUE(forward(forward_args(s, b)).ok());
  b.outv.arena->download();
  b.lsev.arena->download();
  // The reference with keys 64..127 hidden (finite values there).
  std::vector<unsigned char> keep(static_cast<size_t>(s.batch) * s.heads * s.seqlen_q * s.seqlen_k, 1);
  for (size_t e = 0; e < keep.size(); ++e) {
    const size_t j = e % s.seqlen_k;
    if (j >= 64 && j < 128) keep[e] = 0;
  }
  b.opt.keep = keep;
  std::vector<double> out(b.outv.numel()), lse(static_cast<size_t>(s.heads) * s.batch * s.seqlen_q);
  reference::forward(b.shape, b.opt, b.q.data(), b.k.data(), b.v.data(), out.data(), lse.data());
  EXPECT_TRUE(meets_criterion("out", s.dtype, b.outv.read(), out, {}));
  ASSERT_TRUE(backward(backward_args(s, b)).ok());
  b.dqv.arena->download();
  b.dvv.arena->download();
  for (double x : b.dqv.read()) ASSERT_TRUE(std::isfinite(x));
  const std::vector<double> dv = b.dvv.read();
  for (size_t e = 0; e < dv.size(); ++e) {
    const size_t j = e / (static_cast<size_t>(s.heads_k) * s.head_dim_v) % s.seqlen_k;
    if (j >= 64 && j < 128) {
      ASSERT_EQ(dv[e], 0.0);
    } else {
      ASSERT_TRUE(std::isfinite(dv[e]));
    }
  }
}

// dbias is summed in a fixed order: bitwise identical for any thread count, also when several
// work items share its elements (batch and head broadcast).
TEST(ScoreModsCpu, DbiasIsReproducible) {
  ModsSpec s;
  s.bias_dims = {1, 1, 0}, s.causal = true, s.seqlen_q = 200, s.seqlen_k = 260, s.seed = 5;
  Built b = build(s, Backend::kCpu);
  ASSERT_TRUE(forward(forward_args(s, b)).ok());
  std::vector<unsigned char> first;
  for (int threads : {1, 2, 5}) {
    BackwardArgs a = backward_args(s, b);
    a.num_threads = threads;
    ASSERT_TRUE(backward(a).ok());
    b.dbiasv.arena->download();
    if (first.empty()) first = b.dbiasv.arena->bytes();
    EXPECT_EQ(b.dbiasv.arena->bytes(), first) << threads << " threads";
  }
}

// The reference's dbias against central finite differences of its own forward (float64):
// checks the derivation dBias = P * (dP - D) (bias after softcap; with dropout, ALiBi, a window).
TEST(ScoreModsReference, DbiasMatchesFiniteDifferences) {
  reference::Shape shape = reference::Shape::dense(1, 5, 7, 2, 1, 8, 6);
  reference::Options opt;
  opt.scale = 0.4, opt.softcap = 2.5, opt.window_left = 4, opt.window_right = 1;
  opt.alibi = {0.1, 0.3};
  opt.dropout_p = 0.2, opt.seed = 3, opt.offset = 1;
  std::mt19937 g(11);
  std::normal_distribution<double> nd(0.0, 1.0);
  auto fill = [&](size_t n) {
    std::vector<double> x(n);
    for (double& e : x) e = nd(g);
    return x;
  };
  const auto q = fill(5 * 2 * 8), k = fill(7 * 1 * 8), v = fill(7 * 1 * 6), dout = fill(5 * 2 * 6);
  opt.bias = fill(2 * 5 * 7);
  opt.bias[3] = -kInf;  // a hidden score: zero gradient
  std::vector<double> dq(q.size()), dk(k.size()), dv(v.size()), dbias(opt.bias.size());
  reference::backward(shape, opt, q.data(), k.data(), v.data(), dout.data(), dq.data(), dk.data(),
                      dv.data(), nullptr, dbias.data());
  auto loss = [&](const reference::Options& o) {
    std::vector<double> out(dout.size()), lse(10);
    reference::forward(shape, o, q.data(), k.data(), v.data(), out.data(), lse.data());
    double l = 0.0;
    for (size_t i = 0; i < out.size(); ++i) l += out[i] * dout[i];
    return l;
  };
  const double h = 1e-6;
  double worst = 0.0;
  for (size_t e = 0; e < opt.bias.size(); ++e) {
    if (std::isinf(opt.bias[e])) {
      EXPECT_EQ(dbias[e], 0.0);
      continue;
    }
    reference::Options plus = opt, minus = opt;
    plus.bias[e] += h;
    minus.bias[e] -= h;
    worst = std::max(worst, std::abs((loss(plus) - loss(minus)) / (2 * h) - dbias[e]));
  }
  EXPECT_LT(worst, 1e-7);
  EXPECT_GT(max_abs(dbias), 1e-3);  // not trivially zero
}

// Argument checks name the argument.
TEST(ScoreModsCpu, Errors) {
  ModsSpec s;
  s.mask_density = 0.5, s.block_density = 0.5;
  Built b = build(s, Backend::kCpu);
  auto expect = [&](const ForwardArgs& a, StatusCode code, const char* needle) {
    const Status st = forward(a);
    EXPECT_EQ(st.code(), code) << st.message();
    EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
  };
  ForwardArgs a = forward_args(s, b);
  a.attn_bias.shape[2] = 3;  // neither seqlen_q nor 1
  expect(a, StatusCode::kInvalidArgument, "attn_bias must be broadcastable");
  a = forward_args(s, b);
  a.attn_bias.dtype = DType::kFloat16;
  expect(a, StatusCode::kInvalidArgument, "attn_bias must have dtype float32 or q's dtype");
  a = forward_args(s, b);
  a.attn_bias.ndim = 3;
  expect(a, StatusCode::kInvalidArgument, "attn_bias must have 4 dimensions");
  a = forward_args(s, b);
  a.attn_mask.dtype = DType::kFloat32;
  expect(a, StatusCode::kInvalidArgument, "attn_mask must have dtype uint8");
  a = forward_args(s, b);
  a.block_size_q = 0;
  expect(a, StatusCode::kInvalidArgument, "block_size_q and block_size_k must be >= 1");
  a = forward_args(s, b);
  a.block_size_k = 64;  // now the mask has the wrong number of key blocks
  expect(a, StatusCode::kInvalidArgument, "block_mask must be broadcastable");
  a = forward_args(s, b);
  a.block_mask = TensorView{};
  expect(a, StatusCode::kInvalidArgument, "without block_mask");
  a = forward_args(s, b);
  a.attn_mask.device = Device{DeviceType::kCUDA, 0};
  expect(a, StatusCode::kInvalidArgument, "attn_mask is on");

  BackwardArgs g = backward_args(s, b);
  g.attn_bias = TensorView{};
  EXPECT_NE(backward(g).message().find("dbias (the gradient of attn_bias) was given without attn_bias"),
            std::string::npos);
  g = backward_args(s, b);
  g.dbias.strides[1] = 0;
  EXPECT_NE(backward(g).message().find("dbias is an output and must not have stride 0"),
            std::string::npos)
      << backward(g).message();
  g = backward_args(s, b);
  g.dbias.shape[1] = 1;
  EXPECT_NE(backward(g).message().find("dbias must have shape"), std::string::npos) << backward(g).message();
  g = backward_args(s, b);  // a float32 bias: a float32 dbias only
  g.dbias.dtype = DType::kBFloat16;
  EXPECT_NE(backward(g).message().find("dbias must have dtype float32, got bfloat16"), std::string::npos)
      << backward(g).message();

  // Varlen: the bias is laid out over the longest sequences (max_seqlen_q, max_seqlen_k), not
  // over the packed rows; the message says so.
  const std::vector<double> cu = {0, 3, 7};
  View cuq = upload(Backend::kCpu, DType::kInt32, Layout::kContiguous, {3}, cu);
  View q3 = upload(Backend::kCpu, DType::kFloat32, Layout::kContiguous, {7, 2, 8}, std::vector<double>(112, 0.5));
  View o3 = upload(Backend::kCpu, DType::kFloat32, Layout::kContiguous, {7, 2, 8}, {});
  View packed_rows = upload(Backend::kCpu, DType::kFloat32, Layout::kContiguous, {2, 2, 7, 7},
                            std::vector<double>(196, 0.0));
  View by_longest = upload(Backend::kCpu, DType::kFloat32, Layout::kContiguous, {2, 2, 4, 4},
                           std::vector<double>(64, 0.0));
  ForwardArgs vl;
  vl.q = vl.k = vl.v = q3.tensor();
  vl.out = o3.tensor();
  vl.cu_seqlens_q = vl.cu_seqlens_k = cuq.tensor();
  vl.attn_bias = packed_rows.tensor();
  const Status st = forward(vl);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.message();
  EXPECT_NE(st.message().find("(batch|1, heads|1, max_seqlen_q|1, max_seqlen_k)"), std::string::npos)
      << st.message();
  vl.attn_bias = by_longest.tensor();
  EXPECT_TRUE(forward(vl).ok());
}

}  // namespace
}  // namespace flashattn::test
