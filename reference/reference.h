// Naive float64 attention that materialises S and P, for tests and benchmarks only.
// Written independently of the backends: its own mask code, its own softmax. The only shared
// piece is src/core/philox.h, which *defines* the dropout keep-mask (the contract itself).
//
// Layout: every tensor is a contiguous host float64 array in the varlen layout
//   q   (total_q, heads,   head_dim)      total_q = cu_seqlens_q[batch]
//   k   (total_k, heads_k, head_dim)
//   v   (total_k, heads_k, head_dim_v)
//   out (total_q, heads,   head_dim_v)
//   lse (heads, total_q)                  natural log; -inf for a row with no visible key
// A dense problem is the varlen one with cu_seqlens = {0, s, 2s, ...}.
#pragma once

#include <cstdint>
#include <vector>

namespace flashattn::reference {

struct Shape {
  int batch = 1;
  int heads = 1;
  int heads_k = 1;
  int head_dim = 64;
  int head_dim_v = 64;
  std::vector<int64_t> cu_seqlens_q;  // (batch + 1)
  std::vector<int64_t> cu_seqlens_k;  // (batch + 1)

  int64_t total_q() const { return cu_seqlens_q.back(); }
  int64_t total_k() const { return cu_seqlens_k.back(); }
  // Dense helper: batch sequences of equal lengths.
  static Shape dense(int batch, int seqlen_q, int seqlen_k, int heads, int heads_k, int head_dim,
                     int head_dim_v);
};

struct Options {
  double scale = 0.0;    // must be set (> 0)
  int window_left = -1;  // -1 = unbounded; causal = (-1, 0)
  int window_right = -1;
  double softcap = 0.0;        // 0 = off
  std::vector<double> alibi;   // empty = off, else (batch * heads) slopes, index b * heads + h
  double dropout_p = 0.0;
  uint64_t seed = 0;
  uint64_t offset = 0;
  // Learnable sink: empty = off, else (heads) logits that join each row's softmax denominator
  // with no value row (not scaled, softcapped or biased; never dropped). -inf = no sink.
  std::vector<double> sink;
  // Additive bias (added after softcap, before ALiBi and the mask) and keep mask (0 = hidden),
  // each empty = off, else dense (batch, heads, rows, cols): element
  // ((b * heads + h) * rows + i) * cols + j for query i and key j of sequence b (positions
  // inside the sequence). rows, cols = mods_rows, mods_cols when > 0 (varlen: the longest
  // lengths, as a padded batch holds them), else the sequence's lengths (dense shapes: all
  // sequences of one length). A key whose bias is -inf is hidden like a masked one.
  std::vector<double> bias;
  std::vector<unsigned char> keep;
  int64_t mods_rows = 0;
  int64_t mods_cols = 0;
  // FP8 forward (docs/SEMANTICS.md, "FP8"), the naive computation FP8 results are judged by:
  // q, k, v are the dequantized values (e4m3 code * descale, exact in float64) and each
  // probability is rounded to float8_e4m3 before P.V, as e4m3(2^(x_ij - r_i)) with x in log2
  // units and r_i = ceil(max_j x_ij) - 8 over the row's visible keys; out divides by the
  // unrounded sum (with the sink). The LSE is unaffected. Forward only; no dropout.
  bool fp8_round_p = false;
};

// x rounded to the nearest float8_e4m3 value (ties to even), saturating to +-448; NaN stays.
double round_e4m3(double x);

// out and lse are written in full.
void forward(const Shape& shape, const Options& opt, const double* q, const double* k,
             const double* v, double* out, double* lse);

// Gradients of sum(out * dout) with respect to q, k, v (dk/dv summed over GQA groups) and,
// when dsink is not null (and opt.sink is given), the sink logits (heads), and when dbias is
// not null (and opt.bias is given), the bias, in opt.bias's layout (0 where no pair falls).
// dq, dk, dv (and dsink, dbias) are written in full.
void backward(const Shape& shape, const Options& opt, const double* q, const double* k,
              const double* v, const double* dout, double* dq, double* dk, double* dv,
              double* dsink = nullptr, double* dbias = nullptr);

}  // namespace flashattn::reference
