// One case of the bias / mask / block-mask tests on dense or varlen calls, shared by
// test_block_sparse.cpp (both backends) and test_sparse_cuda.cpp (CUDA): a Spec, its
// inputs built on the host in the reference's layouts (the equivalent dense keep mask and bias)
// and as views on a backend, and the AttentionOptions that hand them to flashattn.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "score_mods_util.h"
#include "test_util.h"

namespace flashattn::test::block_sparse_case {

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
  DType bias_dtype = DType::kFloat32;  // float32 or the case's dtype
  // attn_mask (batch, heads, rows, cols) keep density; < 0 = off.
  double mask_density = -1.0;
  Blocks blocks = Blocks::kNone;
  // Block states drawn with these probabilities (full: the rest). Query block row 0 is absent
  // everywhere when 0 < absent < 1 (rows with no kept block).
  double absent = 0.3, partial = 0.3;
  bool block_batch = false, block_heads = true;  // block tensors per sequence / per head
  bool partial_list = true, full_list = true;    // lists: which pairs are given
  int block_q = 40, block_k = 24;
  float dropout_p = 0.0f;  // dropout (seed 7, offset 3)
  int num_splits = 0;      // CUDA split-KV (0: the heuristic)
  uint32_t seed = 1;
};

inline int max_of(const std::vector<int>& v) { return v.empty() ? 0 : *std::max_element(v.begin(), v.end()); }

// One case on the host (reference layouts) and as views on a backend.
struct Built : ModsCase {
  int batch = 0, max_q = 0, max_k = 0, nqb = 0, nkb = 0, total_q = 0, total_k = 0;
  std::vector<int> states;  // (block batch, block heads, nqb, nkb)
  std::vector<double> mask;  // (batch, heads, max_q, max_k)
  View cuqv, cukv, slopesv, biasv, maskv, blockv, numv, idxv, full_numv, full_idxv;
};

// The lists of one state as (count (bb, bh, nqb), indices (bb, bh, nqb, width)): each row in
// a random order, the entries past the count garbage (never read).
inline void make_lists(const std::vector<int>& states, int bb, int bh, int nqb, int nkb, int state,
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
inline void set_lists(Built* b, Backend be, const std::vector<int>& states, int bb, int bh, int width,
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

inline Built build(const Spec& s, Backend be) {
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
  b.opt.dropout_p = s.dropout_p, b.opt.seed = 7, b.opt.offset = 3;
  b.num_splits = s.num_splits;
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
    b.bias = randn(g, static_cast<size_t>(bs[0] * bs[1] * bs[2] * bs[3]), s.bias_dtype, 2.0);
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
    b.biasv = upload(be, s.bias_dtype, Layout::kPadded, {bs[0], bs[1], bs[2], bs[3]}, b.bias);
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

// Lists (broadcast over the batch, per head) in which key block c is absent for every query
// block, with NaN in the K and V rows of its keys: whatever reads those rows turns NaN.
inline void unlist_key_block(Built* b, Backend be, const Spec& s, int c, uint32_t seed) {
  for (size_t e = static_cast<size_t>(c); e < b->states.size(); e += static_cast<size_t>(b->nkb)) b->states[e] = kAbsent;
  std::mt19937 g(seed);
  set_lists(b, be, b->states, 1, s.heads, b->nkb, g);
  for (int bb = 0; bb < b->batch; ++bb) {
    for (int j = c * s.block_k; j < std::min((c + 1) * s.block_k, b->max_k); ++j) {
      for (int h = 0; h < s.heads_k; ++h) {
        for (View* v : {&b->kv, &b->vv}) {
          for (int64_t x = 0; x < v->shape[3]; ++x) {
            v->arena->set(v->offset + bb * v->strides[0] + j * v->strides[1] + h * v->strides[2] + x, kNaN);
          }
        }
      }
    }
  }
  b->kv.arena->upload();
  b->vv.arena->upload();
}

// Query block r (of block_q rows) keeps no key block in any head (lists regenerated, per-head
// block tensors and one for the batch, as unlist_key_block), and NaN goes into its rows of q and
// dout: a backward that loaded any tile of them would turn dK or dV into NaN.
inline void unlist_query_block(Built* b, Backend be, const Spec& s, int r, uint32_t seed) {
  for (size_t plane = 0; plane < b->states.size() / (static_cast<size_t>(b->nqb) * b->nkb); ++plane) {
    for (int c = 0; c < b->nkb; ++c) b->states[(plane * b->nqb + r) * b->nkb + c] = kAbsent;
  }
  std::mt19937 g(seed);
  set_lists(b, be, b->states, 1, s.heads, b->nkb, g);
  for (View* v : {&b->qv, &b->doutv}) {
    for (int bb = 0; bb < b->batch; ++bb) {
      for (int i = r * s.block_q; i < std::min((r + 1) * s.block_q, b->max_q); ++i) {
        for (int h = 0; h < s.heads; ++h) {
          for (int64_t x = 0; x < v->shape[3]; ++x) {
            v->arena->set(v->offset + bb * v->strides[0] + i * v->strides[1] + h * v->strides[2] + x, kNaN);
          }
        }
      }
    }
    v->arena->upload();
  }
}

// After run_and_check: the dbias elements no sequence reaches (NaN in the bias, past a
// sequence's lengths) are exactly 0.
inline void expect_unreached_dbias_zero(const Built& b, const ModsRefs& refs, const std::string& name) {
  if (!refs.ran || refs.dbias.empty()) return;
  const std::vector<double> ours = b.dbiasv.read();
  for (size_t e = 0; e < ours.size(); ++e) {
    if (std::isnan(b.bias[e])) {
      ASSERT_EQ(ours[e], 0.0) << name << " dbias element " << e;
    }
  }
}

inline void set_options(const Spec& s, const Built& b, AttentionOptions* o) {
  o->causal = s.causal;
  o->window_left = s.window_left;
  o->window_right = s.window_right;
  o->softcap = s.softcap;
  o->num_threads = 2;
  o->dropout_p = s.dropout_p, o->seed = 7, o->offset = 3;
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

inline AttentionOptions options(const Spec& s, const Built& b) {
  AttentionOptions o;
  set_options(s, b, &o);
  return o;
}

inline ForwardArgs forward_args(const Spec& s, const Built& b) { return case_forward_args(b, options(s, b)); }

inline BackwardArgs backward_args(const Spec& s, const Built& b) {
  return case_backward_args(b, options(s, b));
}

}  // namespace flashattn::test::block_sparse_case
