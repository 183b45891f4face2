// The compressed block mask (BlockMaskLists, FlexAttention's layout: per query block the lists
// of partial and full key blocks) and the bias and masks on varlen calls (issue 18): values and
// gradients against the float64 reference given the equivalent dense keep mask and bias, at
// ragged lengths; full blocks do not read attn_mask; the lists give bitwise the dense form's
// results; absent blocks are never read; list values are checked. CUDA runs each case's forward
// in bfloat16 (float32 is CPU-only) and must decline the backward with kNotSupported naming the
// argument.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "score_mods_util.h"
#include "test_util.h"

namespace flashattn::test {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

enum class Blocks { kNone, kDense, kLists };
enum State : int { kAbsent = 0, kPartial = 1, kFull = 2 };

struct Spec {
  std::string name;
  DType dtype = DType::kFloat32;
  bool varlen = false;
  std::vector<int> lens_q = {150, 150}, lens_k = {200, 200};  // dense: all equal
  bool pass_max_seqlen = true;  // varlen: false = 0, read from cu_seqlens (CPU)
  int heads = 4, heads_k = 2, head_dim = 32, head_dim_v = 24;
  bool causal = false;
  int window_left = -1, window_right = -1;
  float softcap = 0.0f;
  bool alibi = false;
  // attn_bias: off, or its three leading dimensions (1 = broadcast, 0 = full); with dbias.
  bool bias = false;
  std::array<int, 3> bias_dims = {0, 0, 0};
  // attn_mask (batch, heads, rows, cols) keep density; < 0 = off.
  double mask_density = -1.0;
  Blocks blocks = Blocks::kNone;
  // Block states drawn with these probabilities (full: the rest). Query block row 0 is absent
  // everywhere when 0 < absent < 1 (rows with no kept block).
  double absent = 0.3, partial = 0.3;
  bool block_batch = false, block_heads = true;  // block tensors per sequence / per head
  bool partial_list = true, full_list = true;    // lists: which pairs are given
  int block_q = 40, block_k = 24;
  uint32_t seed = 1;
};

std::vector<Spec> cases() {
  std::vector<Spec> cs;
  Spec s;
  s.name = "lists_mixed_bias_mask_gqa";
  s.blocks = Blocks::kLists, s.bias = true, s.mask_density = 0.7;
  cs.push_back(s);
  s.name = "lists_density_0";
  s.absent = 1.0, s.bias_dims = {1, 0, 1};
  cs.push_back(s);
  s.name = "lists_density_1_all_full";  // attn_mask is zero in full blocks: never read
  s.absent = 0.0, s.partial = 0.0;
  cs.push_back(s);
  s.name = "lists_all_partial";
  s.absent = 0.0, s.partial = 1.0;
  cs.push_back(s);
  s = Spec{};
  s.name = "lists_causal_window_softcap_alibi";
  s.blocks = Blocks::kLists, s.bias = true, s.bias_dims = {1, 0, 0}, s.mask_density = 0.8;
  s.causal = true, s.window_left = 50, s.softcap = 3.0f, s.alibi = true;
  s.lens_q = {130, 130}, s.lens_k = {170, 170}, s.block_q = 16, s.block_k = 32;
  cs.push_back(s);
  s = Spec{};
  s.name = "lists_partial_only_no_mask";  // partial blocks without attn_mask: fully visible
  s.blocks = Blocks::kLists, s.full_list = false, s.block_batch = true, s.block_heads = false;
  cs.push_back(s);
  s = Spec{};
  s.name = "lists_full_only_mqa";
  s.blocks = Blocks::kLists, s.partial_list = false, s.mask_density = 0.5, s.heads_k = 1;
  s.block_batch = true, s.block_q = 7, s.block_k = 64;
  cs.push_back(s);
  s = Spec{};
  s.name = "varlen_bias_dbias_ragged";  // empty sequences on either side
  s.varlen = true, s.bias = true;
  s.lens_q = {37, 1, 130, 0, 20}, s.lens_k = {53, 77, 200, 10, 0};
  cs.push_back(s);
  s.name = "varlen_bias_batch_broadcast_causal_mask";  // (1, heads, rows, cols): one bias for all
  s.bias_dims = {1, 0, 0}, s.causal = true, s.mask_density = 0.6;
  cs.push_back(s);
  s.name = "varlen_bias_key_padding_gqa";  // (batch, 1, 1, cols), shared by the kv heads
  s.bias_dims = {0, 1, 1}, s.causal = false, s.mask_density = -1.0;
  cs.push_back(s);
  s = Spec{};
  s.name = "varlen_dense_block_mask_window_max_seqlen_0";
  s.varlen = true, s.blocks = Blocks::kDense, s.mask_density = 0.7, s.pass_max_seqlen = false;
  s.window_left = 30, s.window_right = 10, s.block_batch = true;
  s.lens_q = {90, 64, 3}, s.lens_k = {100, 64, 129};
  cs.push_back(s);
  s = Spec{};
  s.name = "varlen_lists_bias_softcap";
  s.varlen = true, s.blocks = Blocks::kLists, s.bias = true, s.bias_dims = {1, 1, 0};
  s.mask_density = 0.6, s.softcap = 2.0f, s.block_batch = true;
  s.lens_q = {90, 200, 1}, s.lens_k = {150, 64, 65};
  cs.push_back(s);
  s.name = "varlen_lists_bf16";
  s.dtype = DType::kBFloat16;
  cs.push_back(s);
  uint32_t seed = 2800;
  for (Spec& c : cs) c.seed = seed++;
  return cs;
}

int max_of(const std::vector<int>& v) { return v.empty() ? 0 : *std::max_element(v.begin(), v.end()); }

// One case on the host (reference layouts) and as views on a backend.
struct Built : ModsCase {
  int batch = 0, max_q = 0, max_k = 0, nqb = 0, nkb = 0, total_q = 0, total_k = 0;
  std::vector<int> states;  // (block batch, block heads, nqb, nkb)
  std::vector<double> mask;  // (batch, heads, max_q, max_k)
  View cuqv, cukv, slopesv, biasv, maskv, blockv, numv, idxv, full_numv, full_idxv;
};

// The lists of one state as (count (bb, bh, nqb), indices (bb, bh, nqb, width)): each row in
// a random order, the entries past the count garbage (never read).
void make_lists(const std::vector<int>& states, int bb, int bh, int nqb, int nkb, int state,
                std::mt19937& g, std::vector<double>* count, std::vector<double>* indices,
                int width) {
  count->assign(static_cast<size_t>(bb) * bh * nqb, 0.0);
  indices->assign(static_cast<size_t>(bb) * bh * nqb * width, 0.0);
  std::uniform_int_distribution<int> garbage(-1000, 1000000);
  for (size_t row = 0; row < count->size(); ++row) {
    std::vector<int> listed;
    for (int c = 0; c < nkb; ++c) {
      if (states[row * nkb + c] == state) listed.push_back(c);
    }
    std::shuffle(listed.begin(), listed.end(), g);
    (*count)[row] = static_cast<double>(listed.size());
    for (int e = 0; e < width; ++e) {
      (*indices)[row * width + e] = e < static_cast<int>(listed.size()) ? listed[e] : garbage(g);
    }
  }
}

// The lists of `states` ((bb, bh, nqb, nkb)) as b's kv_num_blocks / kv_indices (padded strides)
// and full_kv_num_blocks / full_kv_indices (contiguous), the pairs asked for, on backend be.
void set_lists(Built* b, Backend be, const std::vector<int>& states, int bb, int bh, int width,
               std::mt19937& g, bool partial = true, bool full = true) {
  const std::vector<int64_t> count_shape = {bb, bh, b->nqb}, index_shape = {bb, bh, b->nqb, width};
  std::vector<double> count, indices;
  if (partial) {
    make_lists(states, bb, bh, b->nqb, b->nkb, kPartial, g, &count, &indices, width);
    b->numv = upload(be, DType::kInt32, Layout::kPadded, count_shape, count);
    b->idxv = upload(be, DType::kInt32, Layout::kPadded, index_shape, indices);
  }
  if (full) {
    make_lists(states, bb, bh, b->nqb, b->nkb, kFull, g, &count, &indices, width);
    b->full_numv = upload(be, DType::kInt32, Layout::kContiguous, count_shape, count);
    b->full_idxv = upload(be, DType::kInt32, Layout::kContiguous, index_shape, indices);
  }
}

Built build(const Spec& s, Backend be) {
  Built b;
  std::mt19937 g(s.seed);
  const int B = static_cast<int>(s.lens_q.size()), H = s.heads, Hk = s.heads_k;
  b.batch = B, b.max_q = max_of(s.lens_q), b.max_k = max_of(s.lens_k);
  b.shape.batch = B, b.shape.heads = H, b.shape.heads_k = Hk;
  b.shape.head_dim = s.head_dim, b.shape.head_dim_v = s.head_dim_v;
  b.shape.cu_seqlens_q = {0};
  b.shape.cu_seqlens_k = {0};
  for (int i = 0; i < B; ++i) {
    b.shape.cu_seqlens_q.push_back(b.shape.cu_seqlens_q.back() + s.lens_q[static_cast<size_t>(i)]);
    b.shape.cu_seqlens_k.push_back(b.shape.cu_seqlens_k.back() + s.lens_k[static_cast<size_t>(i)]);
  }
  b.total_q = static_cast<int>(b.shape.total_q()), b.total_k = static_cast<int>(b.shape.total_k());
  b.opt.scale = 1.0 / std::sqrt(static_cast<double>(s.head_dim));
  b.opt.window_left = s.window_left;
  b.opt.window_right = s.causal ? 0 : s.window_right;
  b.opt.softcap = s.softcap;
  b.opt.mods_rows = b.max_q, b.opt.mods_cols = b.max_k;

  const int Tq = b.total_q, Tk = b.total_k;
  b.q = randn(g, static_cast<size_t>(Tq) * H * s.head_dim, s.dtype);
  b.k = randn(g, static_cast<size_t>(Tk) * Hk * s.head_dim, s.dtype);
  b.v = randn(g, static_cast<size_t>(Tk) * Hk * s.head_dim_v, s.dtype);
  b.dout = randn(g, static_cast<size_t>(Tq) * H * s.head_dim_v, s.dtype);
  // The varlen layout (total, heads, dim) and the dense one (batch, seqlen, heads, dim) hold the
  // same elements in the same logical order.
  const auto rows = [&](int total, int len, int heads, int dim) {
    return s.varlen ? std::vector<int64_t>{total, heads, dim} : std::vector<int64_t>{B, len, heads, dim};
  };
  b.qv = upload(be, s.dtype, Layout::kPadded, rows(Tq, b.max_q, H, s.head_dim), b.q);
  b.kv = upload(be, s.dtype, Layout::kPadded, rows(Tk, b.max_k, Hk, s.head_dim), b.k);
  b.vv = upload(be, s.dtype, Layout::kPadded, rows(Tk, b.max_k, Hk, s.head_dim_v), b.v);
  b.doutv = upload(be, s.dtype, Layout::kContiguous, rows(Tq, b.max_q, H, s.head_dim_v), b.dout);
  b.outv = upload(be, s.dtype, Layout::kContiguous, rows(Tq, b.max_q, H, s.head_dim_v), {});
  b.dqv = upload(be, s.dtype, Layout::kContiguous, rows(Tq, b.max_q, H, s.head_dim), {});
  b.dkv = upload(be, s.dtype, Layout::kContiguous, rows(Tk, b.max_k, Hk, s.head_dim), {});
  b.dvv = upload(be, s.dtype, Layout::kContiguous, rows(Tk, b.max_k, Hk, s.head_dim_v), {});
  b.lsev = s.varlen ? upload(be, DType::kFloat32, Layout::kContiguous, {H, Tq}, {})
                    : upload(be, DType::kFloat32, Layout::kContiguous, {B, H, b.max_q}, {});
  if (s.varlen) {
    b.cuqv = upload(be, DType::kInt32, Layout::kContiguous, {B + 1},
                    std::vector<double>(b.shape.cu_seqlens_q.begin(), b.shape.cu_seqlens_q.end()));
    b.cukv = upload(be, DType::kInt32, Layout::kContiguous, {B + 1},
                    std::vector<double>(b.shape.cu_seqlens_k.begin(), b.shape.cu_seqlens_k.end()));
  }
  if (s.alibi) {
    std::vector<double> slopes;
    for (int h = 0; h < H; ++h) slopes.push_back(static_cast<float>(0.04 * (h + 1)));
    b.slopesv = upload(be, DType::kFloat32, Layout::kContiguous, {H}, slopes);
    for (int i = 0; i < B; ++i) b.opt.alibi.insert(b.opt.alibi.end(), slopes.begin(), slopes.end());
  }

  // attn_bias over (max_q, max_k), NaN where no sequence has a pair (it must not be read).
  if (s.bias) {
    const int64_t full[3] = {B, H, b.max_q};
    for (int i = 0; i < 3; ++i) b.bias_shape[static_cast<size_t>(i)] = s.bias_dims[static_cast<size_t>(i)] == 1 ? 1 : full[i];
    b.bias_shape[3] = b.max_k;
    const auto& bs = b.bias_shape;
    b.bias = randn(g, static_cast<size_t>(bs[0] * bs[1] * bs[2] * bs[3]), DType::kFloat32, 2.0);
    for (int64_t bb = 0; bb < bs[0]; ++bb) {
      const int lq = bs[0] == 1 ? b.max_q : s.lens_q[static_cast<size_t>(bb)];
      const int lk = bs[0] == 1 ? b.max_k : s.lens_k[static_cast<size_t>(bb)];
      for (int64_t h = 0; h < bs[1]; ++h) {
        for (int64_t i = 0; i < bs[2]; ++i) {
          for (int64_t j = 0; j < bs[3]; ++j) {
            if ((bs[2] > 1 && i >= lq) || j >= lk) b.bias[broadcast_index(bs, bb, h, i, j)] = kNaN;
          }
        }
      }
    }
    b.biasv = upload(be, DType::kFloat32, Layout::kPadded, {bs[0], bs[1], bs[2], bs[3]}, b.bias);
    b.dbiasv = upload(be, DType::kFloat32, Layout::kPaddedOdd, {bs[0], bs[1], bs[2], bs[3]}, {});
    b.opt.bias = expand_to_dense(b.bias, bs, B, H, b.max_q, b.max_k);
  }

  // Block states; with lists, attn_mask is zero inside full blocks (which must not read it).
  const size_t plane = static_cast<size_t>(b.max_q) * b.max_k;
  b.nqb = (b.max_q + s.block_q - 1) / s.block_q;
  b.nkb = (b.max_k + s.block_k - 1) / s.block_k;
  const int bb_n = s.block_batch ? B : 1, bh_n = s.block_heads ? H : 1;
  if (s.blocks != Blocks::kNone) {
    std::uniform_real_distribution<double> u(0.0, 1.0);
    b.states.resize(static_cast<size_t>(bb_n) * bh_n * b.nqb * b.nkb);
    for (size_t e = 0; e < b.states.size(); ++e) {
      const double x = u(g);
      int st = x < s.absent ? kAbsent : x < s.absent + s.partial ? kPartial : kFull;
      if (s.blocks == Blocks::kLists && !s.full_list && st == kFull) st = kPartial;
      if (s.blocks == Blocks::kLists && !s.partial_list && st == kPartial) st = kFull;
      const bool empty_row = s.absent > 0.0 && s.absent < 1.0 && b.nqb > 1 && e / b.nkb % b.nqb == 0;
      b.states[e] = empty_row ? kAbsent : st;
    }
  }
  const auto state_at = [&](int bb, int h, int i, int j) {
    return b.states[((static_cast<size_t>(s.block_batch ? bb : 0) * bh_n + (s.block_heads ? h : 0)) * b.nqb +
                     i / s.block_q) * b.nkb + j / s.block_k];
  };
  if (s.mask_density >= 0.0) {
    std::bernoulli_distribution keep(s.mask_density);
    b.mask.resize(static_cast<size_t>(B) * H * plane);
    for (double& e : b.mask) e = keep(g) ? 1.0 : 0.0;
    if (s.blocks == Blocks::kLists) {
      for_each_dense(B, H, b.max_q, b.max_k, [&](size_t e, int bb, int h, int i, int j) {
        if (state_at(bb, h, i, j) == kFull) b.mask[e] = 0.0;
      });
    }
    b.maskv = upload(be, DType::kUInt8, Layout::kPadded, {B, H, b.max_q, b.max_k}, b.mask);
  }
  if (s.mask_density >= 0.0 || s.blocks != Blocks::kNone) {
    b.opt.keep.assign(static_cast<size_t>(B) * H * plane, 1);
    for_each_dense(B, H, b.max_q, b.max_k, [&](size_t e, int bb, int h, int i, int j) {
      const bool elem = b.mask.empty() || b.mask[e] != 0.0;
      const int st = s.blocks == Blocks::kNone ? kPartial : state_at(bb, h, i, j);  // none: elem
      const bool keep = s.blocks == Blocks::kDense ? st != kAbsent && elem
                                                   : st == kFull || (st == kPartial && elem);
      b.opt.keep[e] = keep ? 1 : 0;
    });
  }
  if (s.blocks == Blocks::kDense) {
    std::vector<double> m(b.states.size());
    for (size_t e = 0; e < m.size(); ++e) m[e] = b.states[e] != kAbsent ? 1.0 : 0.0;
    b.blockv = upload(be, DType::kUInt8, Layout::kContiguous, {bb_n, bh_n, b.nqb, b.nkb}, m);
  } else if (s.blocks == Blocks::kLists) {
    set_lists(&b, be, b.states, bb_n, bh_n, b.nkb + 3, g, s.partial_list, s.full_list);
  }
  return b;
}

void set_options(const Spec& s, const Built& b, AttentionOptions* o) {
  o->causal = s.causal;
  o->window_left = s.window_left;
  o->window_right = s.window_right;
  o->softcap = s.softcap;
  o->num_threads = 2;
  if (s.varlen) {
    o->cu_seqlens_q = b.cuqv.tensor();
    o->cu_seqlens_k = b.cukv.tensor();
    o->max_seqlen_q = s.pass_max_seqlen ? b.max_q : 0;
    o->max_seqlen_k = s.pass_max_seqlen ? b.max_k : 0;
  }
  if (b.slopesv.defined()) o->alibi_slopes = b.slopesv.tensor();
  if (b.biasv.defined()) o->attn_bias = b.biasv.tensor();
  if (b.maskv.defined()) o->attn_mask = b.maskv.tensor();
  if (b.blockv.defined()) o->block_mask = b.blockv.tensor();
  if (b.numv.defined()) o->block_mask_lists.kv_num_blocks = b.numv.tensor();
  if (b.idxv.defined()) o->block_mask_lists.kv_indices = b.idxv.tensor();
  if (b.full_numv.defined()) o->block_mask_lists.full_kv_num_blocks = b.full_numv.tensor();
  if (b.full_idxv.defined()) o->block_mask_lists.full_kv_indices = b.full_idxv.tensor();
  if (s.blocks != Blocks::kNone) {
    o->block_size_q = s.block_q;
    o->block_size_k = s.block_k;
  }
}

AttentionOptions options(const Spec& s, const Built& b) {
  AttentionOptions o;
  set_options(s, b, &o);
  return o;
}

ForwardArgs forward_args(const Spec& s, const Built& b) { return case_forward_args(b, options(s, b)); }

BackwardArgs backward_args(const Spec& s, const Built& b) {
  return case_backward_args(b, options(s, b));
}

// The first of the case's arguments the CUDA backend names when it declines.
const char* first_declined(const Spec& s) {
  if (s.bias) return "attn_bias";
  if (s.mask_density >= 0.0) return "attn_mask";
  return s.blocks == Blocks::kDense ? "block_mask" : "block_mask_lists";
}

using Param = std::tuple<Backend, size_t>;
class BlockSparse : public testing::TestWithParam<Param> {};

TEST_P(BlockSparse, MatchesReference) {
  const auto [backend, index] = GetParam();
  FLASHATTN_SKIP_IF_UNAVAILABLE(backend);
  Spec s = cases()[index];
  if (backend == Backend::kCuda && !s.pass_max_seqlen) GTEST_SKIP() << "CUDA varlen needs max_seqlen";
  if (backend == Backend::kCuda && s.dtype == DType::kFloat32) s.dtype = DType::kBFloat16;
  Built b = build(s, backend);
  const ModsRefs refs = run_and_check(backend, b, options(s, b), s.dtype, s.name, first_declined(s));
  if (s.absent == 1.0 && s.blocks != Blocks::kNone) {
    for (double x : b.outv.read()) ASSERT_EQ(x, 0.0);
  }
  if (!refs.ran) return;
  // dbias elements no sequence reaches (NaN in the bias) get an exact 0.
  if (!refs.dbias.empty()) {
    const std::vector<double> ours = b.dbiasv.read();
    for (size_t e = 0; e < ours.size(); ++e) {
      if (std::isnan(b.bias[e])) {
        ASSERT_EQ(ours[e], 0.0) << s.name << " dbias element " << e;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(All, BlockSparse,
                         testing::Combine(testing::ValuesIn(all_backends()),
                                          testing::Range<size_t>(0, cases().size())),
                         [](const testing::TestParamInfo<Param>& p) {
                           return std::string(backend_name(std::get<0>(p.param))) + "_" +
                                  cases()[std::get<1>(p.param)].name;
                         });

// The dense block mask with attn_mask and the lists that classify each kept block (full where
// attn_mask keeps all of it, else partial) describe one mask: the results are bitwise equal.
TEST(BlockSparseCpu, ListsEqualTheDenseFormBitwise) {
  Spec s;
  s.blocks = Blocks::kDense, s.mask_density = 0.9, s.bias = true, s.causal = true;
  s.block_q = 8, s.block_k = 8, s.seed = 31;
  Built dense = build(s, Backend::kCpu);
  // Make about half the kept blocks all-true in attn_mask.
  std::vector<double> mask = dense.mask;
  const int H = s.heads, Sq = dense.max_q, Sk = dense.max_k;
  for (size_t e = 0; e < mask.size(); ++e) {
    const int j = static_cast<int>(e % Sk), i = static_cast<int>(e / Sk % Sq);
    if ((i / s.block_q + j / s.block_k) % 2 == 0) mask[e] = 1.0;
  }
  dense.maskv.write(mask);
  dense.maskv.arena->upload();
  ASSERT_TRUE(forward(forward_args(s, dense)).ok());
  ASSERT_TRUE(backward(backward_args(s, dense)).ok());
  for (View* v : {&dense.outv, &dense.lsev, &dense.dqv, &dense.dkv, &dense.dvv, &dense.dbiasv}) {
    v->arena->download();
  }

  // The lists: per (h, r) the kept blocks, full where the mask keeps every element of the block
  // for every sequence (the lists broadcast over the batch, like the dense mask here).
  Built lists = build(s, Backend::kCpu);
  lists.maskv.write(mask);
  lists.maskv.arena->upload();
  std::vector<int> states(dense.states.size());
  for (int h = 0; h < H; ++h) {
    for (int r = 0; r < dense.nqb; ++r) {
      for (int c = 0; c < dense.nkb; ++c) {
        const size_t e = (static_cast<size_t>(h) * dense.nqb + r) * dense.nkb + c;
        if (dense.states[e] == kAbsent) {
          states[e] = kAbsent;
          continue;
        }
        bool all = true;
        for (int bb = 0; bb < dense.batch; ++bb) {
          for (int i = r * s.block_q; i < std::min(Sq, (r + 1) * s.block_q); ++i) {
            for (int j = c * s.block_k; j < std::min(Sk, (c + 1) * s.block_k); ++j) {
              all = all && mask[((static_cast<size_t>(bb) * H + h) * Sq + i) * Sk + j] != 0.0;
            }
          }
        }
        states[e] = all ? kFull : kPartial;
      }
    }
  }
  ASSERT_NE(std::count(states.begin(), states.end(), kFull), 0);
  ASSERT_NE(std::count(states.begin(), states.end(), kPartial), 0);
  std::mt19937 g(5);
  set_lists(&lists, Backend::kCpu, states, 1, H, dense.nkb, g);
  lists.blockv = View{};
  ASSERT_TRUE(forward(forward_args(s, lists)).ok());
  ASSERT_TRUE(backward(backward_args(s, lists)).ok());
  const char* names[] = {"out", "lse", "dq", "dk", "dv", "dbias"};
  View* ours[] = {&lists.outv, &lists.lsev, &lists.dqv, &lists.dkv, &lists.dvv, &lists.dbiasv};
  View* theirs[] = {&dense.outv, &dense.lsev, &dense.dqv, &dense.dkv, &dense.dvv, &dense.dbiasv};
  for (int t = 0; t < 6; ++t) {
    ours[t]->arena->download();
    EXPECT_EQ(ours[t]->arena->bytes(), theirs[t]->arena->bytes()) << names[t];
  }
}

// Blocks absent from the lists are skipped entirely: keys only they cover are never loaded, so
// NaN in those K and V rows reaches nothing. Key block 1 (keys 64..127) is listed nowhere.
TEST(BlockSparseCpu, UnlistedBlocksAreNotRead) {
  Spec s;
  s.blocks = Blocks::kLists, s.absent = 0.0, s.partial = 0.5, s.mask_density = 0.8;
  s.lens_q = {80, 80}, s.lens_k = {200, 200}, s.block_q = 16, s.block_k = 64, s.seed = 41;
  {
    // Rebuild the lists without key block 1.
    Built b = build(s, Backend::kCpu);
    for (size_t e = 1; e < b.states.size(); e += static_cast<size_t>(b.nkb)) b.states[e] = kAbsent;
    std::mt19937 g(7);
    set_lists(&b, Backend::kCpu, b.states, 1, s.heads, b.nkb, g);
    for (int bb = 0; bb < b.batch; ++bb) {
      for (int j = 64; j < 128; ++j) {
        for (int h = 0; h < s.heads_k; ++h) {
          for (View* v : {&b.kv, &b.vv}) {
            for (int64_t x = 0; x < v->shape[3]; ++x) {
              v->arena->set(v->offset + bb * v->strides[0] + j * v->strides[1] + h * v->strides[2] + x, kNaN);
            }
          }
        }
      }
    }
    b.kv.arena->upload();
    b.vv.arena->upload();
    ASSERT_TRUE(forward(forward_args(s, b)).ok());
    b.outv.arena->download();
    for (double x : b.outv.read()) ASSERT_TRUE(std::isfinite(x));
    ASSERT_TRUE(backward(backward_args(s, b)).ok());
    b.dqv.arena->download();
    for (double x : b.dqv.read()) ASSERT_TRUE(std::isfinite(x));
  }
}

// The lists' values are checked on the host (CPU tensors), naming the entry.
TEST(BlockSparseCpu, ListErrors) {
  Spec s;
  s.blocks = Blocks::kLists, s.lens_q = {40, 40}, s.lens_k = {50, 50}, s.block_q = 16, s.block_k = 16;
  s.absent = 0.0, s.partial = 0.5, s.seed = 51;  // every block listed: 3 x 4 blocks
  Built b = build(s, Backend::kCpu);
  auto expect = [&](const ForwardArgs& a, const std::string& needle) {
    const Status st = forward(a);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.message();
    EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
  };
  ASSERT_TRUE(forward(forward_args(s, b)).ok());
  const auto with_counts = [&](View& v, const std::vector<double>& values) {
    const std::vector<double> saved = v.read();
    v.write(values);
    v.arena->upload();
    return saved;
  };
  // A count above the width of the index tensor (width = 4 + 3 key blocks).
  std::vector<double> counts = b.full_numv.read();
  std::vector<double> bad = counts;
  bad[0] = 8;
  with_counts(b.full_numv, bad);
  expect(forward_args(s, b), "full_kv_num_blocks[0, 0, 0] = 8 is outside [0, 7]");
  bad[0] = -1;
  with_counts(b.full_numv, bad);
  expect(forward_args(s, b), "full_kv_num_blocks[0, 0, 0] = -1");
  with_counts(b.full_numv, counts);
  // An index past the key blocks, and a block listed twice (once in each list), in a query
  // block whose lists are both non-empty.
  const std::vector<double> num = b.numv.read(), full_num = b.full_numv.read();
  size_t at = 0;
  while (at < num.size() && (num[at] == 0.0 || full_num[at] == 0.0)) ++at;
  ASSERT_LT(at, num.size());
  const std::string hr = std::to_string(at / b.nqb) + ", " + std::to_string(at % b.nqb);
  std::vector<double> idx = b.idxv.read();
  std::vector<double> bad_idx = idx;
  const size_t row = at * static_cast<size_t>(b.nkb + 3);
  bad_idx[row] = 4;
  with_counts(b.idxv, bad_idx);
  expect(forward_args(s, b), "kv_indices[0, " + hr + ", 0] = 4 is outside [0, 4)");
  bad_idx[row] = b.full_idxv.read()[row];
  with_counts(b.idxv, bad_idx);
  expect(forward_args(s, b), "is listed twice for query block " + std::to_string(at % b.nqb) +
                                 " of (batch 0, head " + std::to_string(at / b.nqb) + ")");
  with_counts(b.idxv, idx);
  ASSERT_TRUE(forward(forward_args(s, b)).ok());

  ForwardArgs a = forward_args(s, b);
  a.block_mask_lists.kv_indices = TensorView{};
  expect(a, "kv_num_blocks and kv_indices must be given together; got only kv_num_blocks");
  a = forward_args(s, b);
  a.block_mask_lists.kv_num_blocks.shape[2] = 2;
  expect(a, "kv_num_blocks must have shape (batch|1, heads|1, ceil(seqlen_q / block_size_q)) with");
  a = forward_args(s, b);
  a.block_mask_lists.full_kv_indices.dtype = DType::kFloat32;
  expect(a, "full_kv_indices must have dtype int32");
  a = forward_args(s, b);
  a.block_size_q = 0;
  expect(a, "block_size_q and block_size_k must be >= 1");
  a = forward_args(s, b);
  const std::vector<double> ones(static_cast<size_t>(b.nqb * b.nkb), 1.0);
  View dense = upload(Backend::kCpu, DType::kUInt8, Layout::kContiguous, {1, 1, b.nqb, b.nkb}, ones);
  a.block_mask = dense.tensor();
  expect(a, "block_mask and block_mask_lists (its compressed form) were both given");
}

}  // namespace
}  // namespace flashattn::test
