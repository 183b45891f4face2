// Naive float64 attention: materialises S and P for one (batch, head) at a time.
//
// Written from docs/SEMANTICS.md (DESIGN.md), not from any backend. The order of operations on a
// score is: scale, softcap, additive bias, ALiBi bias, mask (window, keep mask, -inf bias),
// softmax, dropout. The backward pass differentiates
// sum(out * dout) through exactly that chain. A learnable sink is one more softmax column with
// its logit as given and no value row.
#include "reference/reference.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <vector>

#include "core/philox.h"

namespace flashattn::reference {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// One sequence of one (batch, head): the lengths and the mask/bias parameters.
struct Problem {
  int64_t seqlen_q = 0;
  int64_t seqlen_k = 0;
  int window_left = -1;
  int window_right = -1;
  double slope = 0.0;  // ALiBi slope; 0 = off
  double sink = kNegInf;  // learnable sink logit; -inf = off (an empty softmax column)
  // Element (i, j) at [i * mods_row + j] of this (batch, head)'s plane; null = off.
  const double* bias = nullptr;
  const unsigned char* keep = nullptr;  // null = keep all
  int64_t mods_row = 0;
  int64_t mods_plane = 0;  // elements of one (batch, head) plane of bias / keep
};

// Query row i sees key column j iff it lies inside the window around the bottom-right aligned
// diagonal d = i + seqlen_k - seqlen_q; -1 means unbounded on that side.
bool visible(const Problem& p, int64_t i, int64_t j) {
  const int64_t diag = i + p.seqlen_k - p.seqlen_q;
  const bool left_ok = p.window_left < 0 || j >= diag - p.window_left;
  const bool right_ok = p.window_right < 0 || j <= diag + p.window_right;
  return left_ok && right_ok;
}

double alibi_bias(const Problem& p, int64_t i, int64_t j) {
  return -p.slope * static_cast<double>(std::llabs(i + p.seqlen_k - p.seqlen_q - j));
}

double dot(const double* a, const double* b, int n) {
  double s = 0.0;
  for (int t = 0; t < n; ++t) s += a[t] * b[t];
  return s;
}

// Everything the forward computes for one (batch, head), kept for the backward.
struct HeadState {
  std::vector<double> tanh_s;  // (seqlen_q, seqlen_k) tanh(s_raw / softcap) when softcap > 0
  std::vector<double> p;       // (seqlen_q, seqlen_k) softmax probabilities (before dropout)
  std::vector<double> pd;      // (seqlen_q, seqlen_k) p * keep / (1 - dropout_p)
  std::vector<double> lse;     // (seqlen_q)
  std::vector<double> p_sink;  // (seqlen_q) the sink's softmax probability
};

// Per-sequence access to the varlen layout for one (batch b, head h).
struct HeadView {
  const double* q = nullptr;  // row i: q + i * q_row
  const double* k = nullptr;  // row j: k + j * k_row
  const double* v = nullptr;  // row j: v + j * v_row
  int64_t q_row = 0, k_row = 0, v_row = 0;
};

// The FP8 forward's weights of one row (Options::fp8_round_p): pd[j] = e4m3(2^(x_j - r)) / L
// for the visible keys, with x_j = s[j] * log2(e), r = ceil(max visible x) - 8 and L the sum of
// the unrounded 2^(x_j - r) plus the sink's 2^(sink * log2(e) - r).
void fp8_probabilities(const Problem& pr, const std::vector<double>& s,
                       const std::vector<char>& vis, double* pd) {
  const double log2e = 1.0 / std::log(2.0);
  double mx = kNegInf;
  for (size_t j = 0; j < s.size(); ++j) {
    if (vis[j]) mx = std::max(mx, s[j] * log2e);
  }
  if (mx == kNegInf) return;  // only the sink: every weight stays 0
  const double r = std::ceil(mx) - 8.0;
  double sum = pr.sink == kNegInf ? 0.0 : std::exp2(pr.sink * log2e - r);
  for (size_t j = 0; j < s.size(); ++j) {
    if (vis[j]) sum += std::exp2(s[j] * log2e - r);
  }
  for (size_t j = 0; j < s.size(); ++j) {
    if (vis[j]) pd[j] = round_e4m3(std::exp2(s[j] * log2e - r)) / sum;
  }
}

void forward_head(const Shape& shape, const Options& opt, const Problem& pr, const HeadView& hv,
                  uint32_t batch_head, HeadState* st) {
  const int64_t sq = pr.seqlen_q;
  const int64_t sk = pr.seqlen_k;
  const int d = shape.head_dim;
  st->tanh_s.assign(static_cast<size_t>(sq * sk), 0.0);
  st->p.assign(static_cast<size_t>(sq * sk), 0.0);
  st->pd.assign(static_cast<size_t>(sq * sk), 0.0);
  st->lse.assign(static_cast<size_t>(sq), kNegInf);
  st->p_sink.assign(static_cast<size_t>(sq), 0.0);

  const bool dropout = opt.dropout_p > 0.0;
  const uint32_t threshold = dropout_threshold(static_cast<float>(opt.dropout_p));
  const double rescale = dropout ? 1.0 / (1.0 - opt.dropout_p) : 1.0;

  std::vector<double> s(static_cast<size_t>(sk));
  std::vector<char> vis(static_cast<size_t>(sk));
  for (int64_t i = 0; i < sq; ++i) {
    const double* qi = hv.q + i * hv.q_row;
    double row_max = kNegInf;
    for (int64_t j = 0; j < sk; ++j) {
      double x = opt.scale * dot(qi, hv.k + j * hv.k_row, d);
      if (opt.softcap > 0.0) {
        const double t = std::tanh(x / opt.softcap);
        st->tanh_s[i * sk + j] = t;
        x = opt.softcap * t;
      }
      if (pr.bias != nullptr) x += pr.bias[i * pr.mods_row + j];
      if (pr.slope != 0.0) x += alibi_bias(pr, i, j);
      vis[j] = visible(pr, i, j) && (pr.keep == nullptr || pr.keep[i * pr.mods_row + j] != 0) &&
                       x != kNegInf
                   ? 1
                   : 0;
      s[j] = x;
      if (vis[j]) row_max = std::max(row_max, x);
    }
    // The sink is one more softmax column (its logit taken as is), with no value row.
    row_max = std::max(row_max, pr.sink);
    if (row_max == kNegInf) continue;  // no visible key: P = 0, out = 0, lse = -inf
    double sum = pr.sink == kNegInf ? 0.0 : std::exp(pr.sink - row_max);
    for (int64_t j = 0; j < sk; ++j) {
      if (vis[j]) sum += std::exp(s[j] - row_max);
    }
    st->lse[i] = row_max + std::log(sum);
    if (pr.sink != kNegInf) st->p_sink[i] = std::exp(pr.sink - row_max) / sum;
    if (opt.fp8_round_p) {
      fp8_probabilities(pr, s, vis, st->pd.data() + i * sk);
      for (int64_t j = 0; j < sk; ++j) {
        if (vis[j]) st->p[i * sk + j] = std::exp(s[j] - row_max) / sum;
      }
      continue;
    }
    for (int64_t j = 0; j < sk; ++j) {
      if (!vis[j]) continue;
      const double pij = std::exp(s[j] - row_max) / sum;
      st->p[i * sk + j] = pij;
      bool keep = true;
      if (dropout) {
        keep = dropout_keep(opt.seed, opt.offset, batch_head, static_cast<uint32_t>(i),
                            static_cast<uint32_t>(j), threshold);
      }
      st->pd[i * sk + j] = keep ? pij * rescale : 0.0;
    }
  }
}

Problem problem_for(const Shape& shape, const Options& opt, int b, int h) {
  Problem pr;
  pr.seqlen_q = shape.cu_seqlens_q[b + 1] - shape.cu_seqlens_q[b];
  pr.seqlen_k = shape.cu_seqlens_k[b + 1] - shape.cu_seqlens_k[b];
  pr.window_left = opt.window_left;
  pr.window_right = opt.window_right;
  if (!opt.alibi.empty()) pr.slope = opt.alibi[static_cast<size_t>(b) * shape.heads + h];
  if (!opt.sink.empty()) pr.sink = opt.sink[static_cast<size_t>(h)];
  const int64_t rows = opt.mods_rows > 0 ? opt.mods_rows : pr.seqlen_q;
  pr.mods_row = opt.mods_cols > 0 ? opt.mods_cols : pr.seqlen_k;
  pr.mods_plane = rows * pr.mods_row;
  const size_t plane = static_cast<size_t>((static_cast<int64_t>(b) * shape.heads + h) * pr.mods_plane);
  if (!opt.bias.empty()) pr.bias = opt.bias.data() + plane;
  if (!opt.keep.empty()) pr.keep = opt.keep.data() + plane;
  return pr;
}

HeadView head_view(const Shape& shape, int b, int h, const double* q, const double* k,
                   const double* v) {
  const int group = shape.heads / shape.heads_k;
  const int hk = h / group;
  HeadView hv;
  hv.q_row = static_cast<int64_t>(shape.heads) * shape.head_dim;
  hv.k_row = static_cast<int64_t>(shape.heads_k) * shape.head_dim;
  hv.v_row = static_cast<int64_t>(shape.heads_k) * shape.head_dim_v;
  hv.q = q + shape.cu_seqlens_q[b] * hv.q_row + static_cast<int64_t>(h) * shape.head_dim;
  hv.k = k + shape.cu_seqlens_k[b] * hv.k_row + static_cast<int64_t>(hk) * shape.head_dim;
  hv.v = v + shape.cu_seqlens_k[b] * hv.v_row + static_cast<int64_t>(hk) * shape.head_dim_v;
  return hv;
}

}  // namespace

double round_e4m3(double x) {
  if (std::isnan(x)) return x;
  const double a = std::fabs(x);
  if (a >= 448.0) return std::copysign(448.0, x);  // saturate, infinities included
  // a = f * 2^e with f in [0.5, 1): a normal e4m3 1.mmm * 2^(e - 1) has quantum 2^(e - 4);
  // below 2^-6 the quantum is the subnormals' 2^-9.
  int e = 0;
  std::frexp(a, &e);
  const double quantum = std::ldexp(1.0, std::max(e - 1, -6) - 3);
  return std::copysign(std::nearbyint(a / quantum) * quantum, x);
}

Shape Shape::dense(int batch, int seqlen_q, int seqlen_k, int heads, int heads_k, int head_dim,
                   int head_dim_v) {
  Shape s;
  s.batch = batch;
  s.heads = heads;
  s.heads_k = heads_k;
  s.head_dim = head_dim;
  s.head_dim_v = head_dim_v;
  s.cu_seqlens_q.resize(static_cast<size_t>(batch) + 1);
  s.cu_seqlens_k.resize(static_cast<size_t>(batch) + 1);
  for (int b = 0; b <= batch; ++b) {
    s.cu_seqlens_q[b] = static_cast<int64_t>(b) * seqlen_q;
    s.cu_seqlens_k[b] = static_cast<int64_t>(b) * seqlen_k;
  }
  return s;
}

void forward(const Shape& shape, const Options& opt, const double* q, const double* k,
             const double* v, double* out, double* lse) {
  const int dv = shape.head_dim_v;
  const int64_t total_q = shape.total_q();
  const int64_t out_row = static_cast<int64_t>(shape.heads) * dv;
  HeadState st;
  for (int b = 0; b < shape.batch; ++b) {
    for (int h = 0; h < shape.heads; ++h) {
      const Problem pr = problem_for(shape, opt, b, h);
      const HeadView hv = head_view(shape, b, h, q, k, v);
      forward_head(shape, opt, pr, hv, static_cast<uint32_t>(b * shape.heads + h), &st);
      const int64_t q0 = shape.cu_seqlens_q[b];
      for (int64_t i = 0; i < pr.seqlen_q; ++i) {
        double* oi = out + (q0 + i) * out_row + static_cast<int64_t>(h) * dv;
        std::fill(oi, oi + dv, 0.0);
        for (int64_t j = 0; j < pr.seqlen_k; ++j) {
          const double w = st.pd[i * pr.seqlen_k + j];
          if (w == 0.0) continue;
          const double* vj = hv.v + j * hv.v_row;
          for (int t = 0; t < dv; ++t) oi[t] += w * vj[t];
        }
        lse[static_cast<int64_t>(h) * total_q + q0 + i] = st.lse[i];
      }
    }
  }
}

void backward(const Shape& shape, const Options& opt, const double* q, const double* k,
              const double* v, const double* dout, double* dq, double* dk, double* dv,
              double* dsink, double* dbias) {
  const int d = shape.head_dim;
  const int d_v = shape.head_dim_v;
  if (dsink != nullptr) std::fill(dsink, dsink + shape.heads, 0.0);
  if (dbias != nullptr) std::fill(dbias, dbias + opt.bias.size(), 0.0);
  std::fill(dq, dq + shape.total_q() * shape.heads * d, 0.0);
  std::fill(dk, dk + shape.total_k() * shape.heads_k * d, 0.0);
  std::fill(dv, dv + shape.total_k() * shape.heads_k * d_v, 0.0);

  const bool dropout = opt.dropout_p > 0.0;
  const double rescale = dropout ? 1.0 / (1.0 - opt.dropout_p) : 1.0;
  const int group = shape.heads / shape.heads_k;
  HeadState st;
  std::vector<double> dp;
  for (int b = 0; b < shape.batch; ++b) {
    for (int h = 0; h < shape.heads; ++h) {
      const Problem pr = problem_for(shape, opt, b, h);
      const HeadView hv = head_view(shape, b, h, q, k, v);
      forward_head(shape, opt, pr, hv, static_cast<uint32_t>(b * shape.heads + h), &st);
      const int64_t sq = pr.seqlen_q;
      const int64_t sk = pr.seqlen_k;
      const int hk = h / group;
      const int64_t q_row = static_cast<int64_t>(shape.heads) * d;
      const int64_t k_row = static_cast<int64_t>(shape.heads_k) * d;
      const int64_t v_row = static_cast<int64_t>(shape.heads_k) * d_v;
      const int64_t q0 = shape.cu_seqlens_q[b];
      const int64_t k0 = shape.cu_seqlens_k[b];
      const double* do_b =
          dout + q0 * static_cast<int64_t>(shape.heads) * d_v + static_cast<int64_t>(h) * d_v;
      const int64_t do_row = static_cast<int64_t>(shape.heads) * d_v;
      double* dq_b = dq + q0 * q_row + static_cast<int64_t>(h) * d;
      double* dk_b = dk + k0 * k_row + static_cast<int64_t>(hk) * d;
      double* dv_b = dv + k0 * v_row + static_cast<int64_t>(hk) * d_v;

      dp.assign(static_cast<size_t>(sk), 0.0);
      for (int64_t i = 0; i < sq; ++i) {
        const double* doi = do_b + i * do_row;
        const double* pi = &st.p[static_cast<size_t>(i * sk)];
        const double* pdi = &st.pd[static_cast<size_t>(i * sk)];
        // out = Pd V  =>  dV += Pd^T dout,  dPd = dout V^T.
        for (int64_t j = 0; j < sk; ++j) {
          if (pdi[j] != 0.0) {
            double* dvj = dv_b + j * v_row;
            for (int t = 0; t < d_v; ++t) dvj[t] += pdi[j] * doi[t];
          }
        }
        // Pd = P * keep * rescale  =>  dP = dPd * keep * rescale (0 where dropped or masked).
        double row_dot = 0.0;  // sum_j P_ij dP_ij
        for (int64_t j = 0; j < sk; ++j) {
          dp[j] = 0.0;
          if (pdi[j] == 0.0) continue;  // masked, dropped, or underflowed to exactly 0
          dp[j] = dot(doi, hv.v + j * hv.v_row, d_v) * rescale;
          row_dot += pi[j] * dp[j];
        }
        // The sink column has no value row (dP = 0), so its logit gets -P_sink * row_dot.
        if (dsink != nullptr) dsink[h] -= st.p_sink[static_cast<size_t>(i)] * row_dot;
        // Softmax: dS_ij = P_ij (dP_ij - sum_l P_il dP_il); the ALiBi bias is additive (no
        // factor); softcap multiplies by 1 - tanh^2; the scale multiplies by softmax_scale.
        const double* qi = hv.q + i * hv.q_row;
        double* dqi = dq_b + i * q_row;
        for (int64_t j = 0; j < sk; ++j) {
          if (pi[j] == 0.0) continue;
          double ds = pi[j] * (dp[j] - row_dot);
          // The bias is added after softcap: its gradient is dS itself.
          if (dbias != nullptr) {
            dbias[(static_cast<int64_t>(b) * shape.heads + h) * pr.mods_plane + i * pr.mods_row + j] = ds;
          }
          if (opt.softcap > 0.0) {
            const double t = st.tanh_s[i * sk + j];
            ds *= 1.0 - t * t;
          }
          ds *= opt.scale;
          const double* kj = hv.k + j * hv.k_row;
          double* dkj = dk_b + j * k_row;
          for (int t = 0; t < d; ++t) {
            dqi[t] += ds * kj[t];
            dkj[t] += ds * qi[t];
          }
        }
      }
    }
  }
}

}  // namespace flashattn::reference
