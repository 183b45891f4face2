// run_naive_lowp (test_util.h): naive attention with every intermediate rounded to the storage
// dtype, the "naive_lowp" of the acceptance criterion. Written separately from
// reference/reference.cpp (its own mask and softmax), so that with exact = true it doubles as an
// independent check of the reference.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <vector>

#include "core/philox.h"
#include "test_util.h"

namespace flashattn::test {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// Position of key j relative to the bottom-right aligned diagonal of query row i.
int64_t rel_pos(int64_t i, int64_t j, int64_t sq, int64_t sk) { return j - (i + sk - sq); }

bool in_window(int64_t rel, int left, int right) {
  if (left >= 0 && rel < -left) return false;
  if (right >= 0 && rel > right) return false;
  return true;
}

}  // namespace

Results run_naive_lowp(const HostProblem& p, DType dtype, bool with_backward, bool exact) {
  const auto R = [&](double x) { return exact ? x : round_to(dtype, x); };
  const reference::Shape& s = p.shape;
  const reference::Options& o = p.opt;
  const int H = s.heads, Hk = s.heads_k, D = s.head_dim, Dv = s.head_dim_v;
  const int group = H / Hk;
  const int64_t Tq = s.total_q();

  Results r;
  r.out.assign(static_cast<size_t>(Tq * H * Dv), 0.0);
  r.lse.assign(static_cast<size_t>(H * Tq), kNegInf);
  if (with_backward) {
    r.dq.assign(p.q.size(), 0.0);
    r.dk.assign(p.k.size(), 0.0);
    r.dv.assign(p.v.size(), 0.0);
    if (!o.sink.empty()) r.dsink.assign(static_cast<size_t>(H), 0.0);
  }
  const bool dropout = o.dropout_p > 0.0;
  const uint32_t threshold = dropout_threshold(static_cast<float>(o.dropout_p));
  const double rescale = dropout ? 1.0 / (1.0 - o.dropout_p) : 1.0;

  // Element pointers in the (total, heads, dim) layout.
  const auto at = [](const std::vector<double>& x, int64_t row, int heads, int head, int dim) {
    return x.data() + (row * heads + head) * dim;
  };

  for (int b = 0; b < s.batch; ++b) {
    const int64_t q0 = s.cu_seqlens_q[b], k0 = s.cu_seqlens_k[b];
    const int64_t sq = s.cu_seqlens_q[b + 1] - q0, sk = s.cu_seqlens_k[b + 1] - k0;
    for (int hk = 0; hk < Hk; ++hk) {
      // Group sums of the per-query-head dK and dV (each already rounded).
      std::vector<double> dk_sum(static_cast<size_t>(sk * D), 0.0);
      std::vector<double> dv_sum(static_cast<size_t>(sk * Dv), 0.0);
      for (int h = hk * group; h < (hk + 1) * group; ++h) {
        const double slope = o.alibi.empty() ? 0.0 : o.alibi[static_cast<size_t>(b) * H + h];
        const auto bh = static_cast<uint32_t>(b * H + h);
        // The learnable sink: one more softmax column (logit as given), no value row.
        const double sink = o.sink.empty() ? kNegInf : o.sink[static_cast<size_t>(h)];
        std::vector<double> Psink(static_cast<size_t>(sq), 0.0);
        std::vector<double> S(static_cast<size_t>(sq * sk), kNegInf);
        std::vector<double> Y(static_cast<size_t>(sq * sk), 0.0);  // tanh, for softcap
        std::vector<double> P(static_cast<size_t>(sq * sk), 0.0);
        std::vector<double> keep(static_cast<size_t>(sq * sk), 1.0);  // keep / (1 - p)
        std::vector<double> Pd(static_cast<size_t>(sq * sk), 0.0);    // after dropout

        // attn_bias and the keep mask (reference::Options): dense (batch, heads, rows, cols).
        const int64_t mrows = o.mods_rows > 0 ? o.mods_rows : sq, mcols = o.mods_cols > 0 ? o.mods_cols : sk;
        const auto mods_at = [&](int64_t i, int64_t j) {
          return static_cast<size_t>(((static_cast<int64_t>(b) * H + h) * mrows + i) * mcols + j);
        };
        for (int64_t i = 0; i < sq; ++i) {
          const double* qi = at(p.q, q0 + i, H, h, D);
          for (int64_t j = 0; j < sk; ++j) {
            const int64_t rel = rel_pos(i, j, sq, sk);
            const size_t ij = static_cast<size_t>(i * sk + j);
            if (dropout) {
              keep[ij] = dropout_keep(o.seed, o.offset, bh, static_cast<uint32_t>(i),
                                      static_cast<uint32_t>(j), threshold)
                             ? rescale
                             : 0.0;
            }
            if (!in_window(rel, o.window_left, o.window_right)) continue;
            if (!o.keep.empty() && o.keep[mods_at(i, j)] == 0) continue;
            const double* kj = at(p.k, k0 + j, Hk, hk, D);
            double acc = 0.0;
            for (int t = 0; t < D; ++t) acc += qi[t] * kj[t];
            double x = R(R(acc) * o.scale);
            if (o.softcap > 0.0) {
              Y[ij] = R(std::tanh(R(x / o.softcap)));
              x = R(o.softcap * Y[ij]);
            }
            if (slope != 0.0) x = R(x - slope * static_cast<double>(std::llabs(rel)));
            if (!o.bias.empty()) x = R(x + o.bias[mods_at(i, j)]);
            S[ij] = x;
          }
          double m = kNegInf;
          for (int64_t j = 0; j < sk; ++j) m = std::max(m, S[static_cast<size_t>(i * sk + j)]);
          m = std::max(m, sink);
          if (m == kNegInf) continue;  // nothing visible: P = 0, out = 0, lse = -inf
          double sum = sink == kNegInf ? 0.0 : std::exp(sink - m);
          for (int64_t j = 0; j < sk; ++j) sum += std::exp(S[static_cast<size_t>(i * sk + j)] - m);
          r.lse[static_cast<size_t>(h * Tq + q0 + i)] = m + std::log(sum);
          if (sink != kNegInf) Psink[static_cast<size_t>(i)] = R(std::exp(sink - m) / sum);
          for (int64_t j = 0; j < sk; ++j) {
            const size_t ij = static_cast<size_t>(i * sk + j);
            P[ij] = R(std::exp(S[ij] - m) / sum);
          }
          // Pd = R(P * keep / (1 - p)); out = R(Pd V).
          double* oi = r.out.data() + ((q0 + i) * H + h) * Dv;
          std::vector<double> acc(static_cast<size_t>(Dv), 0.0);
          for (int64_t j = 0; j < sk; ++j) {
            const size_t ij = static_cast<size_t>(i * sk + j);
            Pd[ij] = dropout ? R(P[ij] * keep[ij]) : P[ij];
            if (Pd[ij] == 0.0) continue;
            const double* vj = at(p.v, k0 + j, Hk, hk, Dv);
            for (int t = 0; t < Dv; ++t) acc[static_cast<size_t>(t)] += Pd[ij] * vj[t];
          }
          for (int t = 0; t < Dv; ++t) oi[t] = R(acc[static_cast<size_t>(t)]);
        }
        if (!with_backward) continue;

        // dS for this head, then the three products.
        std::vector<double> dS(static_cast<size_t>(sq * sk), 0.0);
        for (int64_t i = 0; i < sq; ++i) {
          const double* doi = at(p.dout, q0 + i, H, h, Dv);
          // D = rowsum(dout * out) from the stored (rounded) output, which is an input of the
          // backward; equal to rowsum(P * dP) in exact arithmetic.
          const double* oi = r.out.data() + ((q0 + i) * H + h) * Dv;
          double rowsum = 0.0;
          for (int t = 0; t < Dv; ++t) rowsum += doi[t] * oi[t];
          // The sink's score gradient: P_sink * (0 - D), its dP being 0 (no value row).
          if (!r.dsink.empty()) r.dsink[static_cast<size_t>(h)] += R(Psink[static_cast<size_t>(i)] * -rowsum);
          std::vector<double> dP(static_cast<size_t>(sk), 0.0);
          for (int64_t j = 0; j < sk; ++j) {
            const size_t ij = static_cast<size_t>(i * sk + j);
            const double* vj = at(p.v, k0 + j, Hk, hk, Dv);
            double acc = 0.0;
            for (int t = 0; t < Dv; ++t) acc += doi[t] * vj[t];
            dP[static_cast<size_t>(j)] = dropout ? R(R(acc) * keep[ij]) : R(acc);
          }
          for (int64_t j = 0; j < sk; ++j) {
            const size_t ij = static_cast<size_t>(i * sk + j);
            double g = R(P[ij] * (dP[static_cast<size_t>(j)] - rowsum));
            if (o.softcap > 0.0) g = R(g * (1.0 - Y[ij] * Y[ij]));
            dS[ij] = R(g * o.scale);
          }
        }
        // dQ = R(dS K); dK_h = R(dS^T Q); dV_h = R(Pd^T dout).
        std::vector<double> dk_h(static_cast<size_t>(sk * D), 0.0);
        std::vector<double> dv_h(static_cast<size_t>(sk * Dv), 0.0);
        for (int64_t i = 0; i < sq; ++i) {
          const double* qi = at(p.q, q0 + i, H, h, D);
          const double* doi = at(p.dout, q0 + i, H, h, Dv);
          std::vector<double> acc(static_cast<size_t>(D), 0.0);
          for (int64_t j = 0; j < sk; ++j) {
            const size_t ij = static_cast<size_t>(i * sk + j);
            const double g = dS[ij];
            const double* kj = at(p.k, k0 + j, Hk, hk, D);
            double* dkj = &dk_h[static_cast<size_t>(j * D)];
            if (g != 0.0) {
              for (int t = 0; t < D; ++t) {
                acc[static_cast<size_t>(t)] += g * kj[t];
                dkj[t] += g * qi[t];
              }
            }
            if (Pd[ij] != 0.0) {
              double* dvj = &dv_h[static_cast<size_t>(j * Dv)];
              for (int t = 0; t < Dv; ++t) dvj[t] += Pd[ij] * doi[t];
            }
          }
          double* dqi = r.dq.data() + ((q0 + i) * H + h) * D;
          for (int t = 0; t < D; ++t) dqi[t] = R(acc[static_cast<size_t>(t)]);
        }
        for (size_t e = 0; e < dk_h.size(); ++e) dk_sum[e] += R(dk_h[e]);
        for (size_t e = 0; e < dv_h.size(); ++e) dv_sum[e] += R(dv_h[e]);
      }
      if (!with_backward) continue;
      for (int64_t j = 0; j < sk; ++j) {
        double* dkj = r.dk.data() + ((k0 + j) * Hk + hk) * D;
        double* dvj = r.dv.data() + ((k0 + j) * Hk + hk) * Dv;
        for (int t = 0; t < D; ++t) dkj[t] = R(dk_sum[static_cast<size_t>(j * D + t)]);
        for (int t = 0; t < Dv; ++t) dvj[t] = R(dv_sum[static_cast<size_t>(j * Dv + t)]);
      }
    }
  }
  return r;
}

}  // namespace flashattn::test
