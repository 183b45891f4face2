// Forward (O, LSE) and backward (dQ, dK, dV) of every backend against the fp64 reference, with
// DESIGN.md's criterion. The matrix is sampled: a deterministic list of generated cases covers
// every value of every axis (asserted by CaseList.CoversEveryAxisValue), plus hand-written
// edge cases. Every case runs on every backend; CUDA cases skip without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "test_util.h"

namespace flashattn::test {
namespace {

struct Case {
  std::string name;  // [A-Za-z0-9_]
  ProblemSpec spec;
  bool backward = true;
};

// ---- generated cases ------------------------------------------------------------------------

constexpr int kSeqlens[] = {1, 7, 64, 129, 300};
constexpr int kHeadDims[] = {32, 64, 96, 128, 192, 256};
constexpr int kGroupRatios[] = {1, 2, 8};
constexpr int kNumGenerated = 150;
// Work per case, sum_b(seqlen_q * seqlen_k) * heads * (head_dim + head_dim_v), so that the fp64
// reference and the naive emulation stay cheap on a 2-core CI machine.
constexpr int64_t kMaxWorkForward = 200'000'000;
constexpr int64_t kMaxWorkBackward = 80'000'000;

enum class MaskKind { kNone, kCausal, kWindowLeft, kWindowRight, kWindowBoth, kWindowEmptyRows };
constexpr int kNumMaskKinds = 6;
const char* mask_name(MaskKind m) {
  switch (m) {
    case MaskKind::kNone:
      return "nomask";
    case MaskKind::kCausal:
      return "causal";
    case MaskKind::kWindowLeft:
      return "winL";
    case MaskKind::kWindowRight:
      return "winR";
    case MaskKind::kWindowBoth:
      return "winLR";
    case MaskKind::kWindowEmptyRows:
      return "winEmpty";
  }
  return "?";
}

// mt19937's output is specified by the standard (its distributions are not), so the case list
// is the same with every standard library.
class Gen {
 public:
  explicit Gen(uint32_t seed) : g_(seed) {}
  uint32_t below(uint32_t n) { return static_cast<uint32_t>(g_() % n); }
  uint64_t u64() { return (static_cast<uint64_t>(g_()) << 32) | g_(); }
  // A balanced stream over n values: each block of n draws is a permutation of 0..n-1, so every
  // value appears once per block.
  struct Cycle {
    std::vector<uint32_t> perm;
    size_t pos = 0;
  };
  uint32_t cycle(Cycle& c, uint32_t n) {
    if (c.pos == c.perm.size()) {
      c.perm.resize(n);
      for (uint32_t i = 0; i < n; ++i) c.perm[i] = i;
      for (uint32_t i = n - 1; i > 0; --i) std::swap(c.perm[i], c.perm[below(i + 1)]);
      c.pos = 0;
    }
    return c.perm[c.pos++];
  }

 private:
  std::mt19937 g_;
};

int64_t work(const ProblemSpec& s) {
  int64_t w = 0;
  for (size_t b = 0; b < s.seqlens_q.size(); ++b) {
    w += static_cast<int64_t>(s.seqlens_q[b]) * s.seqlens_k[b];
  }
  return w * s.heads * (s.head_dim + s.head_dim_v);
}

int smaller_seqlen(int x) {
  int best = 1;
  for (int s : kSeqlens) {
    if (s < x) best = s;
  }
  return x <= 1 ? 1 : best;
}

// Shrinks a case until it fits the work budget: fewer sequences, fewer heads, shorter sequences.
void fit_budget(ProblemSpec& s, bool backward) {
  const int64_t cap = backward ? kMaxWorkBackward : kMaxWorkForward;
  while (work(s) > cap) {
    if (!s.varlen && s.batch() > 1) {
      s.seqlens_q.pop_back();
      s.seqlens_k.pop_back();
    } else if (s.heads_k > 1) {
      s.heads /= s.heads_k;
      s.heads_k = 1;
    } else {
      // Shorten the longest sequence (keeping its zero-length partners).
      int* longest = nullptr;
      for (auto* v : {&s.seqlens_q, &s.seqlens_k}) {
        for (int& x : *v) {
          if (longest == nullptr || x > *longest) longest = &x;
        }
      }
      *longest = smaller_seqlen(*longest);
    }
  }
}

// A length from kSeqlens different from x.
int other_seqlen(int x, Gen& g) {
  int y = x;
  while (y == x) y = kSeqlens[g.below(5)];
  return y;
}

std::string case_name(int index, const ProblemSpec& s, MaskKind mask, bool backward) {
  std::string n = "g" + std::to_string(index) + "_";
  n += s.dtype == DType::kFloat32 ? "f32" : s.dtype == DType::kFloat16 ? "f16" : "bf16";
  if (s.varlen) {
    n += "_varlen" + std::to_string(s.batch());
  } else {
    n += "_b" + std::to_string(s.batch()) + "_q" + std::to_string(s.seqlens_q[0]) + "_k" +
         std::to_string(s.seqlens_k[0]);
  }
  n += "_h" + std::to_string(s.heads) + "x" + std::to_string(s.heads_k) + "_d" +
       std::to_string(s.head_dim);
  n += std::string("_") + mask_name(mask);
  if (s.softcap > 0) n += "_softcap";
  if (s.alibi == Alibi::kHeads) n += "_alibiH";
  if (s.alibi == Alibi::kBatchHeads) n += "_alibiBH";
  if (s.dropout_p > 0) n += "_drop";
  if (s.sink != Sink::kNone) n += std::string("_sink") + sink_name(s.sink);
  n += std::string("_") + layout_name(s.layout);
  n += backward ? "_bwd" : "_fwd";
  return n;
}

std::vector<Case> generated_cases() {
  Gen g(20241129u);
  Gen::Cycle c_dtype, c_batch, c_sq, c_sk, c_ratio, c_hk, c_dim, c_mask, c_softcap, c_alibi,
      c_dropout, c_varlen, c_layout, c_bwd, c_zero;
  constexpr DType kDtypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};
  constexpr Layout kLayouts[] = {Layout::kContiguous, Layout::kPadded, Layout::kPaddedOdd,
                                 Layout::kHeadMajor, Layout::kPacked};
  // Learnable sinks come from a stream of their own, so that the other axes keep their draws.
  Gen g_sink(20261201u);
  Gen::Cycle c_sink;
  constexpr Sink kSinks[] = {Sink::kNone, Sink::kNone, Sink::kRandom, Sink::kLarge};
  std::vector<Case> cases;
  for (int n = 0; n < kNumGenerated; ++n) {
    ProblemSpec s;
    s.dtype = kDtypes[g.cycle(c_dtype, 3)];
    const int batch = 1 + static_cast<int>(g.cycle(c_batch, 3));
    s.varlen = g.cycle(c_varlen, 4) == 0;  // one case in four
    const int ratio = kGroupRatios[g.cycle(c_ratio, 3)];
    s.heads_k = ratio == 8 ? 1 : 1 + static_cast<int>(g.cycle(c_hk, 2));
    s.heads = s.heads_k * ratio;
    s.head_dim = s.head_dim_v = kHeadDims[g.cycle(c_dim, 6)];
    s.layout = kLayouts[g.cycle(c_layout, 5)];
    const bool backward = g.cycle(c_bwd, 3) != 0;  // two in three

    int sq = kSeqlens[g.cycle(c_sq, 5)];
    int sk = kSeqlens[g.cycle(c_sk, 5)];
    if (sq == sk && g.below(3) != 0) sk = other_seqlen(sk, g);  // mostly seqlen_q != seqlen_k
    const auto mask = static_cast<MaskKind>(g.cycle(c_mask, kNumMaskKinds));
    if (mask == MaskKind::kWindowEmptyRows && sq <= sk) {
      std::swap(sq, sk);
      if (sq == sk) sq = 300, sk = 64;
    }
    if (s.varlen) {
      const int nb = std::max(batch, 2);
      s.seqlens_q.clear();
      s.seqlens_k.clear();
      for (int b = 0; b < nb; ++b) {
        s.seqlens_q.push_back(b == 0 ? sq : kSeqlens[g.below(5)]);
        s.seqlens_k.push_back(b == 0 ? sk : kSeqlens[g.below(5)]);
      }
      // Zero-length sequences: on the q side, the k side, or both (never the first sequence,
      // which carries the mask's shape requirements).
      const uint32_t z = g.cycle(c_zero, 3);
      const size_t at = 1 + g.below(static_cast<uint32_t>(nb - 1));
      if (z == 0 || z == 2) s.seqlens_q[at] = 0;
      if (z == 1 || z == 2) s.seqlens_k[at] = 0;
    } else {
      s.seqlens_q.assign(static_cast<size_t>(batch), sq);
      s.seqlens_k.assign(static_cast<size_t>(batch), sk);
    }

    const int w = 1 + static_cast<int>(g.below(static_cast<uint32_t>(std::max(1, sk / 2))));
    switch (mask) {
      case MaskKind::kNone:
        break;
      case MaskKind::kCausal:
        s.causal = true;
        break;
      case MaskKind::kWindowLeft:
        s.window_left = w, s.window_right = 0;
        break;
      case MaskKind::kWindowRight:
        s.window_left = 0, s.window_right = w;
        break;
      case MaskKind::kWindowBoth:
        s.window_left = w;
        s.window_right = static_cast<int>(g.below(static_cast<uint32_t>(std::max(1, sk / 3))));
        break;
      case MaskKind::kWindowEmptyRows:
        // sq > sk: the rows whose diagonal lies left of key 0 by more than window_right see
        // nothing.
        s.window_left = static_cast<int>(g.below(8));
        s.window_right =
            static_cast<int>(g.below(static_cast<uint32_t>(std::max(1, (sq - sk) / 2))));
        break;
    }
    if (g.cycle(c_softcap, 4) == 0) {
      s.softcap = g.below(2) ? 2.0f : 5.0f;
      s.q_scale = 3.0;
    }
    const uint32_t al = g.cycle(c_alibi, 4);  // none, none, (heads), (batch, heads)
    s.alibi = al == 2 ? Alibi::kHeads : al == 3 ? Alibi::kBatchHeads : Alibi::kNone;
    if (g.cycle(c_dropout, 4) == 0) {
      s.dropout_p = g.below(2) ? 0.17f : 0.5f;
      s.dropout_seed = g.u64();
      s.dropout_offset = g.u64();
    }
    if (g.below(5) == 0) s.softmax_scale = 0.09f;
    s.deterministic = g.below(2) == 0;
    s.data_seed = 1000u + static_cast<uint32_t>(n);
    s.sink = kSinks[g_sink.cycle(c_sink, 4)];

    fit_budget(s, backward);
    cases.push_back({case_name(n, s, mask, backward), s, backward});
  }
  return cases;
}

// ---- hand-written edge cases ----------------------------------------------------------------

std::vector<Case> edge_cases() {
  std::vector<Case> cs;
  uint32_t seed = 5000;
  auto add = [&](const std::string& name, ProblemSpec s, bool backward = true) {
    s.data_seed = seed++;
    cs.push_back({"e_" + name, s, backward});
  };
  using D = DType;
  ProblemSpec s;

  // Sequence length 1 on either side.
  add("seqlen1_q1_k1_f16", ProblemSpec::dense(D::kFloat16, 2, 1, 1, 2, 1, 64, 64));
  s = ProblemSpec::dense(D::kBFloat16, 2, 1, 300, 8, 1, 128, 128);
  s.causal = true;
  add("decode_q1_k300_causal_mqa_bf16", s);
  s = ProblemSpec::dense(D::kFloat16, 1, 300, 1, 2, 2, 64, 64);
  s.causal = true;
  add("q300_k1_causal_f16", s);
  add("seqlen1_q1_k1_f32", ProblemSpec::dense(D::kFloat32, 1, 1, 1, 1, 1, 32, 32));

  // Causal in the three shape regimes.
  s = ProblemSpec::dense(D::kFloat16, 2, 64, 129, 4, 2, 64, 64);
  s.causal = true;
  add("causal_sq_lt_sk_f16", s);
  s = ProblemSpec::dense(D::kBFloat16, 2, 129, 64, 4, 2, 96, 96);
  s.causal = true;
  add("causal_sq_gt_sk_bf16", s);
  s = ProblemSpec::dense(D::kFloat32, 1, 129, 129, 2, 1, 128, 128);
  s.causal = true;
  add("causal_sq_eq_sk_f32", s);
  s = ProblemSpec::dense(D::kBFloat16, 1, 129, 129, 2, 2, 192, 192);
  s.causal = true;
  add("causal_sq_eq_sk_bf16", s);

  // Sliding windows.
  s = ProblemSpec::dense(D::kFloat16, 1, 300, 300, 2, 1, 64, 64);
  s.window_left = 17, s.window_right = 0;
  add("window_w_0_f16", s);
  s = ProblemSpec::dense(D::kBFloat16, 1, 129, 300, 2, 1, 64, 64);
  s.window_left = 0, s.window_right = 33;
  add("window_0_w_bf16", s);
  s = ProblemSpec::dense(D::kFloat16, 2, 300, 129, 2, 2, 128, 128);
  s.window_left = 40, s.window_right = 7;
  add("window_w1_w2_f16", s);
  s = ProblemSpec::dense(D::kFloat16, 1, 129, 7, 4, 1, 64, 64);
  s.window_left = 3, s.window_right = 1;  // rows 0..119 see nothing
  add("window_empty_rows_f16", s);
  s = ProblemSpec::dense(D::kFloat32, 1, 64, 64, 1, 1, 32, 32);
  s.window_left = 0, s.window_right = 0;  // the diagonal only
  add("window_0_0_f32", s);
  s = ProblemSpec::dense(D::kBFloat16, 1, 129, 300, 2, 1, 64, 64);
  s.causal = true;
  s.window_left = 20;  // causal + window_left: the local-causal window (20, 0)
  add("causal_with_window_left_bf16", s);
  // Windows wider than the sequences (INT32_MAX): equivalent to unbounded; arithmetic on them
  // must not overflow (d + right, d - left) in any backend.
  s = ProblemSpec::dense(D::kBFloat16, 1, 129, 129, 2, 1, 64, 64);
  s.window_left = -1, s.window_right = 2147483647;
  add("window_right_int32_max_bf16", s);
  s = ProblemSpec::dense(D::kFloat16, 1, 140, 70, 2, 2, 64, 64);
  s.window_left = 2147483647, s.window_right = -1;
  add("window_left_int32_max_f16", s);

  // Softcap, ALiBi, dropout.
  s = ProblemSpec::dense(D::kFloat16, 2, 129, 129, 4, 2, 64, 64);
  s.causal = true;
  s.softcap = 5.0f;
  s.q_scale = 3.0;
  add("softcap_causal_f16", s);
  s = ProblemSpec::dense(D::kBFloat16, 2, 64, 300, 4, 4, 64, 64);
  s.alibi = Alibi::kHeads;
  add("alibi_heads_bf16", s);
  s = ProblemSpec::dense(D::kFloat16, 3, 129, 64, 4, 1, 32, 32);
  s.alibi = Alibi::kBatchHeads;
  s.causal = true;
  add("alibi_batch_heads_causal_f16", s);
  s = ProblemSpec::dense(D::kFloat16, 2, 129, 300, 8, 2, 64, 64);
  s.causal = true;
  s.dropout_p = 0.2f, s.dropout_seed = 42, s.dropout_offset = 0x500000007ull;
  add("dropout_causal_gqa_f16", s);
  s = ProblemSpec::dense(D::kFloat32, 1, 64, 129, 2, 1, 64, 64);
  s.dropout_p = 0.4f, s.dropout_seed = 7, s.dropout_offset = 3;
  add("dropout_f32", s);
  s = ProblemSpec::dense(D::kBFloat16, 1, 64, 64, 2, 1, 128, 128);
  s.softmax_scale = 0.5f;
  add("explicit_scale_bf16", s);

  // Varlen with empty sequences on the q side, the k side, and everywhere.
  s = ProblemSpec{};
  s.dtype = D::kFloat16, s.varlen = true;
  s.seqlens_q = {7, 0, 64}, s.seqlens_k = {64, 7, 129};
  s.heads = 4, s.heads_k = 2, s.head_dim = s.head_dim_v = 64;
  s.causal = true;
  add("varlen_zero_q_f16", s);
  s.dtype = D::kBFloat16;
  s.seqlens_q = {7, 64, 1}, s.seqlens_k = {0, 129, 7};  // rows of sequence 0 see no key
  add("varlen_zero_k_bf16", s);
  s.dtype = D::kFloat32;
  s.seqlens_q = {0, 0}, s.seqlens_k = {0, 0};
  add("varlen_all_empty_f32", s);
  s.dtype = D::kFloat16;
  s.seqlens_q = {129, 300, 1}, s.seqlens_k = {129, 300, 1};
  s.causal = false;
  s.dropout_p = 0.3f, s.dropout_seed = 1234, s.dropout_offset = 99;
  s.alibi = Alibi::kBatchHeads;
  add("varlen_dropout_alibi_f16", s);

  // head_dim_v != head_dim (CUDA: padded to one head dim; float32 skips there) and off-list
  // head dims.
  add("dv_lt_d_f32", ProblemSpec::dense(D::kFloat32, 2, 64, 129, 4, 2, 64, 32));
  s = ProblemSpec::dense(D::kFloat16, 1, 129, 64, 4, 1, 32, 128);
  s.causal = true;
  add("dv_gt_d_f16", s);
  add("head_dim_80_bf16", ProblemSpec::dense(D::kBFloat16, 1, 64, 129, 2, 1, 80, 80));
  add("head_dim_512_f32", ProblemSpec::dense(D::kFloat32, 1, 7, 64, 1, 1, 512, 512));

  // Non-contiguous views.
  s = ProblemSpec::dense(D::kFloat16, 2, 129, 129, 4, 2, 64, 64);
  s.layout = Layout::kPacked;
  add("packed_qkv_gqa_f16", s);
  s = ProblemSpec::dense(D::kBFloat16, 2, 64, 300, 2, 1, 128, 128);
  s.layout = Layout::kPacked;
  s.causal = true;
  add("packed_kv_bf16", s);
  s = ProblemSpec::dense(D::kFloat16, 3, 129, 64, 8, 8, 32, 32);
  s.layout = Layout::kHeadMajor;
  add("head_major_f16", s);
  s = ProblemSpec::dense(D::kFloat32, 2, 64, 129, 2, 1, 96, 96);
  s.layout = Layout::kPaddedOdd;
  add("padded_odd_f32", s);

  // Everything at once.
  s = ProblemSpec{};
  s.dtype = D::kBFloat16, s.varlen = true;
  s.seqlens_q = {129, 0, 64, 7}, s.seqlens_k = {300, 64, 0, 7};
  s.heads = 8, s.heads_k = 2, s.head_dim = s.head_dim_v = 64;
  s.causal = true, s.softcap = 2.0f, s.q_scale = 3.0, s.alibi = Alibi::kBatchHeads;
  s.dropout_p = 0.1f, s.dropout_seed = 0xdeadbeefcafeull, s.dropout_offset = 17;
  s.layout = Layout::kPadded;
  s.deterministic = true;
  add("all_features_varlen_bf16", s);

  // Big head dim, full length.
  add("d256_q300_k300_f16", ProblemSpec::dense(D::kFloat16, 1, 300, 300, 1, 1, 256, 256));

  // Learnable sinks (issue 19) with every feature they compose with.
  s = ProblemSpec::dense(D::kFloat16, 2, 129, 64, 4, 2, 64, 64);
  s.causal = true;  // rows 0..64 see no key: O = 0, LSE = sink
  s.sink = Sink::kRandom;
  add("sink_causal_empty_rows_f16", s);
  s = ProblemSpec::dense(D::kBFloat16, 1, 64, 129, 2, 1, 128, 128);
  s.sink = Sink::kHuge;  // exp(sink - score) overflows float32
  add("sink_huge_bf16", s);
  s = ProblemSpec::dense(D::kFloat32, 2, 64, 129, 6, 2, 64, 64);
  s.sink = Sink::kRandom;  // head 1 has sink -inf
  s.deterministic = true;
  add("sink_gqa_f32", s);
  s = ProblemSpec::dense(D::kBFloat16, 1, 300, 300, 2, 2, 64, 64);
  s.window_left = 40, s.window_right = 0;
  s.softcap = 5.0f, s.q_scale = 3.0;
  s.sink = Sink::kLarge;
  add("sink_window_softcap_bf16", s);
  s = ProblemSpec::dense(D::kFloat16, 2, 129, 129, 4, 2, 32, 32);
  s.alibi = Alibi::kBatchHeads, s.causal = true;
  s.dropout_p = 0.25f, s.dropout_seed = 99, s.dropout_offset = 5;
  s.sink = Sink::kRandom;
  add("sink_alibi_dropout_causal_f16", s);
  s = ProblemSpec{};
  s.dtype = D::kBFloat16, s.varlen = true;
  s.seqlens_q = {129, 0, 64, 7}, s.seqlens_k = {300, 64, 0, 7};
  s.heads = 8, s.heads_k = 2, s.head_dim = s.head_dim_v = 64;
  s.causal = true, s.softcap = 2.0f, s.q_scale = 3.0, s.alibi = Alibi::kHeads;
  s.dropout_p = 0.1f, s.dropout_seed = 0xfeedull, s.dropout_offset = 3;
  s.layout = Layout::kPadded;
  s.sink = Sink::kRandom;
  s.deterministic = true;
  add("sink_all_features_varlen_bf16", s);
  // CUDA: the GQA decode fold (query heads folded into rows) with and without split-KV, and
  // split-KV on row tiles, where the combine kernel adds the sink.
  s = ProblemSpec::dense(D::kBFloat16, 2, 1, 300, 8, 2, 128, 128);
  s.sink = Sink::kRandom;
  s.num_splits = 1;
  add("sink_decode_gqa_bf16", s);
  s.num_splits = 3;
  add("sink_decode_gqa_splits_bf16", s);
  s = ProblemSpec::dense(D::kFloat16, 1, 129, 300, 4, 4, 64, 64);
  s.sink = Sink::kLarge, s.causal = true;
  s.num_splits = 4;
  add("sink_splits_causal_f16", s);
  s = ProblemSpec::dense(D::kFloat16, 1, 7, 300, 4, 1, 96, 96);
  s.sink = Sink::kHuge;
  s.num_splits = 2;
  add("sink_huge_splits_f16", s, false);

  // head_dim_v != head_dim at the pairs models use (CUDA: padded to one head dim, except
  // 576/512, above its 256 limit, which skips there; more in test_head_dim_v.cpp).
  s = ProblemSpec::dense(D::kBFloat16, 1, 129, 300, 4, 2, 192, 128);
  s.causal = true;
  add("dv_192_128_causal_bf16", s);
  s = ProblemSpec::dense(D::kBFloat16, 2, 1, 129, 16, 1, 576, 512);  // MLA decode
  s.sink = Sink::kRandom;
  add("dv_576_512_decode_bf16", s);
  s = ProblemSpec::dense(D::kFloat16, 2, 64, 7, 4, 4, 64, 32);
  s.window_left = 3, s.window_right = 2, s.sink = Sink::kLarge;
  add("dv_64_32_window_sink_f16", s);
  s = ProblemSpec{};
  s.dtype = D::kFloat32, s.varlen = true;
  s.seqlens_q = {23, 0, 41}, s.seqlens_k = {41, 9, 23};
  s.heads = 6, s.heads_k = 2, s.head_dim = 40, s.head_dim_v = 24;
  s.softcap = 5.0f, s.dropout_p = 0.2f, s.dropout_seed = 3, s.dropout_offset = 4;
  s.layout = Layout::kPaddedOdd;
  add("dv_40_24_varlen_f32", s);
  return cs;
}

const std::vector<Case>& all_cases() {
  static const std::vector<Case> cases = [] {
    std::vector<Case> c = generated_cases();
    std::vector<Case> e = edge_cases();
    c.insert(c.end(), e.begin(), e.end());
    return c;
  }();
  return cases;
}

// ---- the parametrised test ------------------------------------------------------------------

using Param = std::tuple<Backend, size_t>;  // backend, index into all_cases()

class Correctness : public testing::TestWithParam<Param> {};

TEST_P(Correctness, MatchesReference) {
  const auto [backend, index] = GetParam();
  const Case& c = all_cases()[index];
  FLASHATTN_SKIP_IF_UNAVAILABLE(backend);
  const CaseOutcome oc = check_problem(backend, c.spec, c.backward);
  if (oc.skipped) GTEST_SKIP() << oc.skip_reason;
}

std::vector<size_t> case_indices() {
  std::vector<size_t> idx(all_cases().size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
  return idx;
}

INSTANTIATE_TEST_SUITE_P(All, Correctness,
                         testing::Combine(testing::ValuesIn(all_backends()),
                                          testing::ValuesIn(case_indices())),
                         [](const testing::TestParamInfo<Param>& param_info) {
                           return std::string(backend_name(std::get<0>(param_info.param))) + "_" +
                                  all_cases()[std::get<1>(param_info.param)].name;
                         });

// ---- the case list itself -------------------------------------------------------------------

TEST(CaseList, CoversEveryAxisValue) {
  std::map<std::string, std::set<std::string>> seen;
  for (const Case& c : all_cases()) {
    const ProblemSpec& s = c.spec;
    seen["dtype"].insert(dtype_name(s.dtype));
    seen["batch"].insert(std::to_string(s.batch()));
    for (int x : s.seqlens_q) seen["seqlen_q"].insert(std::to_string(x));
    for (int x : s.seqlens_k) seen["seqlen_k"].insert(std::to_string(x));
    seen["ratio"].insert(std::to_string(s.heads / s.heads_k));
    seen["head_dim"].insert(std::to_string(s.head_dim));
    seen["layout"].insert(layout_name(s.layout));
    seen["softcap"].insert(s.softcap > 0 ? "on" : "off");
    seen["alibi"].insert(std::to_string(static_cast<int>(s.alibi)));
    seen["dropout"].insert(s.dropout_p > 0 ? "on" : "off");
    seen["varlen"].insert(s.varlen ? "on" : "off");
    seen["backward"].insert(c.backward ? "on" : "off");
    seen["dv_ne_d"].insert(s.head_dim != s.head_dim_v ? "yes" : "no");
    seen["sink"].insert(sink_name(s.sink));
    bool sq_lt = false, sq_gt = false, sq_eq = false, empty_q = false, empty_k = false;
    for (size_t b = 0; b < s.seqlens_q.size(); ++b) {
      sq_lt |= s.seqlens_q[b] < s.seqlens_k[b];
      sq_gt |= s.seqlens_q[b] > s.seqlens_k[b];
      sq_eq |= s.seqlens_q[b] == s.seqlens_k[b];
      empty_q |= s.varlen && s.seqlens_q[b] == 0;
      empty_k |= s.varlen && s.seqlens_k[b] == 0;
    }
    if (empty_q) seen["varlen_empty"].insert("q");
    if (empty_k) seen["varlen_empty"].insert("k");
    std::string mask = "none";
    if (s.causal) mask = "causal";
    if (!s.causal && s.window_left >= 0 && s.window_right == 0) mask = "w_0";
    if (!s.causal && s.window_left == 0 && s.window_right > 0) mask = "0_w";
    if (!s.causal && s.window_left > 0 && s.window_right > 0) mask = "w1_w2";
    seen["mask"].insert(mask);
    if (s.causal) {
      if (sq_lt) seen["causal_shape"].insert("sq<sk");
      if (sq_gt) seen["causal_shape"].insert("sq>sk");
      if (sq_eq) seen["causal_shape"].insert("sq==sk");
    }
    // A window (or causal) that leaves some rows without keys: sq > sk + window_right.
    const int right = s.causal ? 0 : s.window_right;
    for (size_t b = 0; b < s.seqlens_q.size() && right >= 0; ++b) {
      if (s.seqlens_q[b] > s.seqlens_k[b] + right) seen["empty_rows"].insert("yes");
    }
  }
  const std::map<std::string, size_t> expected = {
      {"dtype", 3},        {"batch", 3},        {"seqlen_q", 5},  {"seqlen_k", 6},  // k: + 0
                                                                                    // (varlen)
      {"ratio", 3},        {"head_dim", 6},     {"layout", 5},    {"softcap", 2},  {"alibi", 3},
      {"dropout", 2},      {"varlen", 2},       {"backward", 2},  {"dv_ne_d", 2},  {"sink", 4},    {"mask", 5},
      {"causal_shape", 3}, {"varlen_empty", 2}, {"empty_rows", 1}};
  for (const auto& [axis, count] : expected) {
    std::string values;
    for (const auto& v : seen[axis]) values += v + " ";
    EXPECT_GE(seen[axis].size(), count) << "axis " << axis << " covers only: " << values;
  }
  for (int d : kHeadDims)
    EXPECT_TRUE(seen["head_dim"].count(std::to_string(d))) << "head_dim " << d;
  for (int x : kSeqlens) {
    EXPECT_TRUE(seen["seqlen_q"].count(std::to_string(x))) << "seqlen_q " << x;
    EXPECT_TRUE(seen["seqlen_k"].count(std::to_string(x))) << "seqlen_k " << x;
  }
}

TEST(CaseList, NamesAreUniqueAndSeedsDiffer) {
  std::set<std::string> names;
  std::set<uint32_t> seeds;
  for (const Case& c : all_cases()) {
    EXPECT_TRUE(names.insert(c.name).second) << "duplicate case name " << c.name;
    EXPECT_TRUE(seeds.insert(c.spec.data_seed).second) << "duplicate data seed in " << c.name;
  }
}

}  // namespace
}  // namespace flashattn::test
