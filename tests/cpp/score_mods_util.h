// Helpers shared by the bias / mask / block-sparse tests (test_bias.cpp, test_block_sparse.cpp):
// random inputs, uploads, moving a broadcast operand between its own shape and the reference's
// dense (batch, heads, rows, cols) layout, and one case run on a backend and checked against
// the float64 reference.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "test_util.h"

namespace flashattn::test {

inline std::vector<double> randn(std::mt19937& g, size_t n, DType dt, double scale = 1.0) {
  std::normal_distribution<double> nd(0.0, scale);
  std::vector<double> x(n);
  for (double& e : x) e = round_to(dt, nd(g));
  return x;
}

// A fresh view of `shape` holding `values` (logical order; none = uninitialised: NaN), uploaded.
inline View upload(Backend be, DType dt, Layout layout, const std::vector<int64_t>& shape,
                   const std::vector<double>& values) {
  View v = alloc_view(be, dt, layout, shape);
  if (!values.empty()) v.write(values);
  v.arena->upload();
  return v;
}

// Our LSE (batch, heads, seqlen_q) in the reference layout (heads, total_q).
inline std::vector<double> lse_ref_layout(const std::vector<double>& lse, int B, int H, int Sq) {
  std::vector<double> r(lse.size());
  for (int bb = 0; bb < B; ++bb) {
    for (int h = 0; h < H; ++h) {
      for (int i = 0; i < Sq; ++i) {
        r[(static_cast<size_t>(h) * B + bb) * Sq + i] = lse[(static_cast<size_t>(bb) * H + h) * Sq + i];
      }
    }
  }
  return r;
}

// Index of dense element (b, h, i, j) in an operand of shape bs = (B|1, H|1, rows|1, cols).
inline size_t broadcast_index(const std::array<int64_t, 4>& bs, int64_t b, int64_t h, int64_t i,
                              int64_t j) {
  return static_cast<size_t>(
      (((bs[0] == 1 ? 0 : b) * bs[1] + (bs[1] == 1 ? 0 : h)) * bs[2] + (bs[2] == 1 ? 0 : i)) * bs[3] + j);
}

// f(dense index, b, h, i, j) for every element of a dense (B, H, rows, cols) array, in order.
template <class F>
void for_each_dense(int B, int H, int rows, int cols, F&& f) {
  size_t e = 0;
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < H; ++h) {
      for (int i = 0; i < rows; ++i) {
        for (int j = 0; j < cols; ++j) f(e++, b, h, i, j);
      }
    }
  }
}

// An operand of shape bs broadcast to dense (B, H, rows, cols).
inline std::vector<double> expand_to_dense(const std::vector<double>& x, const std::array<int64_t, 4>& bs,
                                           int B, int H, int rows, int cols) {
  std::vector<double> r(static_cast<size_t>(B) * H * rows * cols);
  for_each_dense(B, H, rows, cols,
                 [&](size_t e, int b, int h, int i, int j) { r[e] = x[broadcast_index(bs, b, h, i, j)]; });
  return r;
}

// The reference's dense dbias (B, H, rows, cols) summed onto the bias's shape bs.
inline std::vector<double> reduce_to(const std::vector<double>& dense, const std::array<int64_t, 4>& bs,
                                     int B, int H, int rows, int cols) {
  std::vector<double> r(static_cast<size_t>(bs[0] * bs[1] * bs[2] * bs[3]), 0.0);
  for_each_dense(B, H, rows, cols,
                 [&](size_t e, int b, int h, int i, int j) { r[broadcast_index(bs, b, h, i, j)] += dense[e]; });
  return r;
}

// One case of these tests: the host data the reference reads and the views flashattn reads and
// writes. opt.mods_rows / mods_cols are the bias and mask planes' (padded) lengths.
struct ModsCase {
  reference::Shape shape;
  reference::Options opt;
  std::vector<double> q, k, v, dout;
  std::array<int64_t, 4> bias_shape{};  // attn_bias's (and dbias's) shape
  std::vector<double> bias;             // bias_shape, row-major
  View qv, kv, vv, outv, lsev, doutv, dqv, dkv, dvv, dbiasv;
  int num_splits = 0;  // ForwardArgs::num_splits (CUDA split-KV; 0 = the heuristic)
  bool deterministic = false;  // BackwardArgs::deterministic
};

inline ForwardArgs case_forward_args(const ModsCase& c, const AttentionOptions& o) {
  ForwardArgs a;
  static_cast<AttentionOptions&>(a) = o;
  a.q = c.qv.tensor(), a.k = c.kv.tensor(), a.v = c.vv.tensor();
  a.out = c.outv.tensor(), a.lse = c.lsev.tensor();
  a.num_splits = c.num_splits;
  return a;
}

inline BackwardArgs case_backward_args(const ModsCase& c, const AttentionOptions& o) {
  BackwardArgs a;
  static_cast<AttentionOptions&>(a) = o;
  a.q = c.qv.tensor(), a.k = c.kv.tensor(), a.v = c.vv.tensor();
  a.out = c.outv.tensor(), a.lse = c.lsev.tensor(), a.dout = c.doutv.tensor();
  a.dq = c.dqv.tensor(), a.dk = c.dkv.tensor(), a.dv = c.dvv.tensor();
  if (c.dbiasv.defined()) a.dbias = c.dbiasv.tensor();
  a.deterministic = c.deterministic;
  return a;
}

// The reference's dbias summed onto bias_shape (empty when the case asks for no dbias).
struct ModsRefs {
  bool ran = false;  // false: the forward failed, or the backend declined the backward (CUDA)
  std::vector<double> dbias;
};

// Whether the CUDA build may decline a case of this dtype and these head dims: a trimmed build
// (FLASHATTN_CUDA_DTYPES / FLASHATTN_CUDA_HEAD_DIMS) without them. The operands have padded,
// 16-byte aligned strides.
inline bool cuda_not_built(DType dtype, int head_dim, int head_dim_v) {
  ProblemSpec p;
  p.dtype = dtype, p.head_dim = head_dim, p.head_dim_v = head_dim_v, p.layout = Layout::kPadded;
  return cuda_may_not_support(p);
}

// The naive low-precision forward (and backward) of case c (test_util.h run_naive_lowp, with
// its bias and keep mask): the naive_lowp of the criterion for a backend that rounds P before
// P.V (CUDA).
inline Results naive_lowp_forward(const ModsCase& c, DType dtype, bool with_backward = false) {
  HostProblem h;
  h.shape = c.shape;
  h.opt = c.opt;
  h.q = c.q, h.k = c.k, h.v = c.v, h.dout = c.dout;
  return run_naive_lowp(h, dtype, with_backward);
}

// Runs forward and backward of case c with options o on `backend`; the outputs must meet the
// criterion against the float64 reference. CPU: out and lse, and for float32 runs dq, dk, dv
// and dbias: float32 1e-4 relative; a 16-bit CPU run reads inputs exact in its dtype and
// computes in float32, so only the final stores round, and passing the reference as naive_lowp
// leaves the bound 2 u (max|ref| + 0.3). CUDA (16-bit only): out, lse, dq, dk and dv against the
// naive low-precision attention with the same bias and mask (P rounds to the dtype before P.V);
// dbias, which has no naive counterpart, within the dtype's atol 2 u (M + 0.3), M = max|dbias|
// (the reference passed as naive_lowp): CUDA's dS is float32 from exact inputs, its error comes
// from the 16-bit out in D = rowsum(dO * out). dbias with softcap included (the sm80 backward
// applies softcap's factor to dS after dbias took it; until s39 it declined the call).
inline ModsRefs run_and_check(Backend backend, ModsCase& c, const AttentionOptions& o, DType dtype,
                              const std::string& name) {
  ModsRefs refs;
  const Status fs = forward(case_forward_args(c, o));
  EXPECT_TRUE(fs.ok()) << fs.message();
  if (!fs.ok()) return refs;
  c.outv.arena->download();
  c.lsev.arena->download();
  EXPECT_TRUE(c.outv.arena->padding_untouched("out"));

  const int B = c.shape.batch, H = c.shape.heads;
  std::vector<double> out(c.outv.numel()), lse(static_cast<size_t>(H) * c.shape.total_q());
  reference::forward(c.shape, c.opt, c.q.data(), c.k.data(), c.v.data(), out.data(), lse.data());
  // Dense lse (batch, heads, seqlen_q) -> the reference's (heads, total_q); varlen is already so.
  const std::vector<double> lse_ours =
      c.lsev.ndim == 2 ? c.lsev.read()
                       : lse_ref_layout(c.lsev.read(), B, H, static_cast<int>(c.lsev.shape[2]));
  const bool cuda = backend == Backend::kCuda;
  Results low;
  if (cuda) {
    low = naive_lowp_forward(c, dtype, true);
    EXPECT_TRUE(meets_criterion("out", dtype, c.outv.read(), out, low.out)) << name;
    EXPECT_TRUE(meets_criterion("lse", dtype, lse_ours, lse, low.lse)) << name;
  } else {
    const std::vector<double> lowp = dtype == DType::kFloat32 ? std::vector<double>{} : out;
    EXPECT_TRUE(meets_criterion("out", dtype, c.outv.read(), out, lowp)) << name;
    EXPECT_TRUE(meets_criterion("lse", DType::kFloat32, lse_ours, lse, {})) << name;
  }

  const Status bs = backward(case_backward_args(c, o));
  EXPECT_TRUE(bs.ok()) << bs.message();
  if (!bs.ok()) return refs;
  for (View* v : {&c.dqv, &c.dkv, &c.dvv, &c.dbiasv}) {
    if (v->defined()) v->arena->download();
  }
  refs.ran = true;
  std::vector<double> dq(c.q.size()), dk(c.k.size()), dv(c.v.size());
  std::vector<double> dbias_dense(c.dbiasv.defined() ? c.opt.bias.size() : 0);
  reference::backward(c.shape, c.opt, c.q.data(), c.k.data(), c.v.data(), c.dout.data(), dq.data(),
                      dk.data(), dv.data(), nullptr, dbias_dense.empty() ? nullptr : dbias_dense.data());
  if (!cuda && dtype != DType::kFloat32) return refs;  // CPU gradients: float32 cases
  const double mag = std::max({max_abs(dq), max_abs(dk), max_abs(dv)});
  EXPECT_TRUE(meets_criterion("dq", dtype, c.dqv.read(), dq, low.dq, mag)) << name;
  EXPECT_TRUE(meets_criterion("dk", dtype, c.dkv.read(), dk, low.dk, mag)) << name;
  EXPECT_TRUE(meets_criterion("dv", dtype, c.dvv.read(), dv, low.dv, mag)) << name;
  if (c.dbiasv.defined()) {
    refs.dbias = reduce_to(dbias_dense, c.bias_shape, B, H, static_cast<int>(c.opt.mods_rows),
                           static_cast<int>(c.opt.mods_cols));
    EXPECT_TRUE(meets_criterion("dbias", cuda ? dtype : DType::kFloat32, c.dbiasv.read(), refs.dbias,
                                cuda ? refs.dbias : std::vector<double>{}, max_abs(refs.dbias)))
        << name;
    EXPECT_TRUE(c.dbiasv.arena->padding_untouched("dbias"));
  }
  return refs;
}

}  // namespace flashattn::test
