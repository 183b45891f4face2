// CPU backward pass: FlashAttention-2 recomputation from the saved LSE, deterministic by
// construction (every output element is produced by one work item in a fixed order, so results
// are bitwise identical run to run and for any thread count).
//
// Pass 0, per (b, h, query block):  Delta_i = sum_c dO[i, c] * O[i, c]  and  lse2_i = lse_i *
//   log2(e) (+inf for a row with no visible key, so that its P is exactly 0).
// Pass 1 and 2 run as one parallel loop (they read the same inputs, write different outputs):
//   dK/dV item (b, kv head, block of kBlockK keys): vectors along keys. For every query head of
//   the GQA group and every query block the mask window lets see the keys:
//     S = Q . K^T, P = exp2(x(S) - lse2)          (queries x keys)
//     dP = dO . V^T; with dropout Pd = P * m, dPd = dP * m   (m = keep * 1/(1-p))
//     dS = P * (dPd - Delta)  (* (1 - tanh^2) with softcap)
//     dV^T += dO^T . Pd,  dK^T += Q^T . dS;  finally dK = scale * dK
//   dQ item (b, head, block of kBlockQ queries): vectors along queries. For every key block:
//     S^T = K . Q^T, P^T, dP^T = V . dO^T, dS^T as above; dQ^T += K^T . dS^T; dQ = scale * dQ
// The dQ pass recomputes S and dP once more (7 matrix products instead of FlashAttention-2's
// 5) in exchange for needing no atomics and no per-thread dQ copies.
//
// Memory: per worker O((d + dv) * kBlock + kBlock^2) floats, plus 2 floats per (head, query row)
// for Delta and lse2.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <exception>
#include <new>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/params.h"
#include "cpu/attention_common.h"
#include "cpu/convert.h"
#include "cpu/gemm.h"
#include "cpu/isa.h"
#include "cpu/simd.h"
#include "cpu/thread_pool.h"

namespace flashattn {
namespace cpu {
namespace {

enum class BackwardPass : int32_t { kDkDv = 0, kDq = 1 };

struct BackwardItem {
  BackwardPass pass;
  int32_t batch;
  int32_t head;   // kv head for kDkDv, query head for kDq (and for the Delta pre-pass)
  int32_t block;  // key block for kDkDv, query block otherwise
};

// Offsets (in floats) of the per-worker scratch regions. kBlockQ == kBlockK, so one tile size.
struct BackwardScratch {
  static_assert(kBlockQ == kBlockK, "the backward shares tile buffers between its two passes");
  static constexpr int64_t kTile = kBlockQ * kBlockK;
  int64_t at;    // (d, kBlock)   dK/dV pass: K^T;  dQ pass: Q^T
  int64_t bt;    // (dv, kBlock)  dK/dV pass: V^T;  dQ pass: dO^T
  int64_t acc1;  // (d, kBlock)   dK/dV pass: dK^T; dQ pass: dQ^T
  int64_t acc2;  // (dv, kBlock)  dK/dV pass: dV^T
  int64_t p;     // tile: P
  int64_t ds;    // tile: dP, then dS
  int64_t pd;    // tile: P * dropout multiplier (dK/dV pass with dropout)
  int64_t mult;  // tile: dropout multipliers
  int64_t tanh;  // tile: tanh of the capped scores (softcap)
  int64_t rows1; // (kBlock, d)   rows of Q (dK/dV pass) or K (dQ pass) in float32
  int64_t rows2; // (kBlock, dv)  rows of dO (dK/dV pass) or V (dQ pass) in float32
  int64_t row;   // (max(d, dv))  one converted row
  int64_t row2;  // (max(d, dv))
  int64_t vec1;  // (kBlock)      lse2 of the query block (dQ pass)
  int64_t vec2;  // (kBlock)      Delta of the query block (dQ pass)
  int64_t size;

  explicit BackwardScratch(const BackwardParams& prm) {
    ScratchLayout lay;
    const int64_t d = prm.head_dim, dv = prm.head_dim_v;
    const bool convert = prm.dtype != DType::kFloat32;
    at = lay.add(d * kBlockK);
    bt = lay.add(dv * kBlockK);
    acc1 = lay.add(d * kBlockK);
    acc2 = lay.add(dv * kBlockK);
    p = lay.add(kTile);
    ds = lay.add(kTile);
    pd = lay.add(prm.has_dropout() ? kTile : 0);
    mult = lay.add(prm.has_dropout() ? kTile : 0);
    tanh = lay.add(prm.softcap > 0.0f ? kTile : 0);
    rows1 = lay.add(convert ? kBlockQ * d : 0);
    rows2 = lay.add(convert ? kBlockQ * dv : 0);
    row = lay.add(std::max(d, dv));
    row2 = lay.add(std::max(d, dv));
    vec1 = lay.add(kBlockQ);
    vec2 = lay.add(kBlockQ);
    size = lay.size();
  }
};

struct BackwardContext {
  const BackwardParams* params;
  const BackwardScratch* scratch;
  const BackwardItem* items;
  // (heads, rows): Delta and lse * log2(e) per query row; row = row_base(b) + i.
  float* delta;
  float* lse2;
  int64_t rows;

  int64_t row_base(int64_t b) const {
    return params->is_varlen() ? params->cu_seqlens_q[b] : b * params->seqlen_q;
  }
};

// Pass 0 for one (b, h, query block).
void delta_item(const BackwardContext& ctx, const BackwardItem& item, float* ws) {
  const BackwardParams& p = *ctx.params;
  const BackwardScratch& sc = *ctx.scratch;
  const int64_t b = item.batch, h = item.head;
  const Sequence seq = sequence_of(p, b);
  const int64_t i0 = static_cast<int64_t>(item.block) * kBlockQ;
  const int64_t nq = std::min(kBlockQ, seq.len_q - i0);
  const int64_t dv = p.head_dim_v;
  float* o = ws + sc.row;
  float* g = ws + sc.row2;
  const float* lse = p.lse + b * p.lse_batch_stride + h * p.lse_head_stride + seq.q_row0 + i0;
  float* delta = ctx.delta + h * ctx.rows + ctx.row_base(b) + i0;
  float* lse2 = ctx.lse2 + h * ctx.rows + ctx.row_base(b) + i0;
  for (int64_t ir = 0; ir < nq; ++ir) {
    load_row(p.dtype, element_ptr(p.out, p.dtype, p.out_strides, b, seq.q_row0, i0 + ir, h), dv, o);
    load_row(p.dtype, element_ptr(p.dout, p.dtype, p.dout_strides, b, seq.q_row0, i0 + ir, h), dv,
             g);
    float sum = 0.0f;
    for (int64_t c = 0; c < dv; ++c) sum += o[c] * g[c];
    delta[ir] = sum;
    lse2[ir] = lse[ir] == kNegInf ? kPosInf : lse[ir] * kLog2e;
  }
}

// dS = P * (dP - Delta) [* (1 - t^2)] over n (multiple of W) elements; dP is overwritten.
template <int W>
FLASHATTN_CPU_INLINE void softmax_grad(const float* __restrict prob, float* __restrict dp,
                                       const float* __restrict tanh_vals, const VecF<W>& delta,
                                       int64_t n) {
  for (int64_t c = 0; c < n; c += W) {
    VecF<W> pv, g;
    vload<W>(pv, prob + c);
    vload<W>(g, dp + c);
    g = pv * (g - delta);
    if (tanh_vals != nullptr) {
      VecF<W> t;
      vload<W>(t, tanh_vals + c);
      g *= 1.0f - t * t;
    }
    vstore<W>(dp + c, g);
  }
}

// x = exp2(x - l) over n (multiple of W) elements.
template <int W>
FLASHATTN_CPU_INLINE void exp2_minus(float* x, const VecF<W>& l, int64_t n) {
  for (int64_t c = 0; c < n; c += W) {
    VecF<W> v;
    vload<W>(v, x + c);
    v -= l;
    vexp2_inplace<W>(v);
    vstore<W>(x + c, v);
  }
}

// out = a * m over n (multiple of W) elements (out may be a).
template <int W>
FLASHATTN_CPU_INLINE void multiply(const float* a, const float* m, float* out, int64_t n) {
  for (int64_t c = 0; c < n; c += W) {
    VecF<W> x, y;
    vload<W>(x, a + c);
    vload<W>(y, m + c);
    x *= y;
    vstore<W>(out + c, x);
  }
}

// Writes rows [i0, i0 + n) of a gradient from its transpose acc (width x ld), times scale.
FLASHATTN_CPU_INLINE void store_transposed(DType dt, void* base, const Strides3& st, int64_t b,
                                           int64_t row0, int64_t i0, int64_t n, int64_t hh,
                                           int64_t width, const float* acc, int64_t ld,
                                           float scale, float* row) {
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t c = 0; c < width; ++c) row[c] = acc[c * ld + r];
    store_row(dt, row, scale, width, element_ptr(base, dt, st, b, row0, i0 + r, hh));
  }
}

// Pass 1: dK and dV of one key block of one kv head.
template <class Isa>
FLASHATTN_CPU_INLINE void dkdv_item(const BackwardContext& ctx, const BackwardItem& item,
                                    float* ws) {
  constexpr int W = Isa::kWidth;
  using V = VecF<W>;
  const BackwardParams& p = *ctx.params;
  const BackwardScratch& sc = *ctx.scratch;
  const int64_t b = item.batch, hk = item.head;
  const int64_t group = p.heads / p.heads_k;
  const int64_t d = p.head_dim, dv = p.head_dim_v;
  const Sequence seq = sequence_of(p, b);
  const Visibility vis(p, seq);
  const int64_t j0 = static_cast<int64_t>(item.block) * kBlockK;
  const int64_t nk = std::min(kBlockK, seq.len_k - j0);
  const int64_t kc = round_up(nk, W);  // key columns

  float* kt = ws + sc.at;     // (d, kc)
  float* vt = ws + sc.bt;     // (dv, kc)
  float* dkt = ws + sc.acc1;  // (d, kc)
  float* dvt = ws + sc.acc2;  // (dv, kc)
  float* prob = ws + sc.p;    // (nq, kc)
  float* ds = ws + sc.ds;     // (nq, kc)
  float* pd = p.has_dropout() ? ws + sc.pd : prob;
  float* mult = ws + sc.mult;
  float* tanh_vals = p.softcap > 0.0f ? ws + sc.tanh : nullptr;
  float* row = ws + sc.row;

  rows_transposed(p.dtype, p.k, p.k_strides, b, seq.k_row0, j0, nk, hk, d, row, kt, kc);
  rows_transposed(p.dtype, p.v, p.v_strides, b, seq.k_row0, j0, nk, hk, dv, row, vt, kc);
  std::fill(dkt, dkt + d * kc, 0.0f);
  std::fill(dvt, dvt + dv * kc, 0.0f);

  const int64_t i_first = vis.first_query(j0);
  const int64_t i_last = vis.last_query(j0 + nk - 1);
  for (int64_t g = 0; g < group; ++g) {
    const int64_t h = hk * group + g;
    const ScoreTransform tf(p, b, h);
    const uint32_t batch_head = static_cast<uint32_t>(b * p.heads + h);
    const float* lse2 = ctx.lse2 + h * ctx.rows + ctx.row_base(b);
    const float* delta = ctx.delta + h * ctx.rows + ctx.row_base(b);
    for (int64_t i0 = i_first; i0 <= i_last; i0 += kBlockQ) {
      const int64_t nq = std::min(kBlockQ, i_last + 1 - i0);
      int64_t qld = 0, dold = 0;
      const float* qp =
          rows_as_float(p.dtype, p.q, p.q_strides, b, seq.q_row0, i0, nq, h, d, ws + sc.rows1, &qld);
      const float* dop = rows_as_float(p.dtype, p.dout, p.dout_strides, b, seq.q_row0, i0, nq, h,
                                       dv, ws + sc.rows2, &dold);

      // P = exp2(x(Q . K^T) - lse2), queries as rows.
      gemm<Isa, false>(nq, kc, d, qp, qld, 1, kt, kc, prob, kc);
      const bool masked = !vis.all_visible(i0, i0 + nq, j0, j0 + nk) || kc != nk;
      for (int64_t ir = 0; ir < nq; ++ir) {
        const int64_t i = i0 + ir;
        float* x = prob + ir * kc;
        transform_scores<W>(tf, x, tanh_vals != nullptr ? tanh_vals + ir * kc : nullptr, kc,
                            i + vis.diag - j0, -1.0f);
        if (masked) {
          mask_outside(x, kc, vis.first_key(i) - j0, std::min(vis.last_key(i), j0 + nk - 1) - j0);
        }
        V l;
        vsplat<W>(l, lse2[i]);
        exp2_minus<W>(x, l, kc);
      }

      // dP = dO . V^T, dropout, dS.
      gemm<Isa, false>(nq, kc, dv, dop, dold, 1, vt, kc, ds, kc);
      if (p.has_dropout()) {
        dropout_query_rows(p, batch_head, i0, nq, j0, nk, mult, kc);
        multiply<W>(prob, mult, pd, nq * kc);
        multiply<W>(ds, mult, ds, nq * kc);
      }
      for (int64_t ir = 0; ir < nq; ++ir) {
        V dl;
        vsplat<W>(dl, delta[i0 + ir]);
        softmax_grad<W>(prob + ir * kc, ds + ir * kc,
                        tanh_vals != nullptr ? tanh_vals + ir * kc : nullptr, dl, kc);
      }

      // dV^T += dO^T . Pd, dK^T += Q^T . dS.
      gemm<Isa, true>(dv, kc, nq, dop, 1, dold, pd, kc, dvt, kc);
      gemm<Isa, true>(d, kc, nq, qp, 1, qld, ds, kc, dkt, kc);
    }
  }
  store_transposed(p.dtype, p.dk, p.dk_strides, b, seq.k_row0, j0, nk, hk, d, dkt, kc, p.scale,
                   row);
  store_transposed(p.dtype, p.dv, p.dv_strides, b, seq.k_row0, j0, nk, hk, dv, dvt, kc, 1.0f, row);
}

// Pass 2: dQ of one query block of one head.
template <class Isa>
FLASHATTN_CPU_INLINE void dq_item(const BackwardContext& ctx, const BackwardItem& item,
                                  float* ws) {
  constexpr int W = Isa::kWidth;
  using V = VecF<W>;
  const BackwardParams& p = *ctx.params;
  const BackwardScratch& sc = *ctx.scratch;
  const int64_t b = item.batch, h = item.head;
  const int64_t hk = h / (p.heads / p.heads_k);
  const int64_t d = p.head_dim, dv = p.head_dim_v;
  const Sequence seq = sequence_of(p, b);
  const Visibility vis(p, seq);
  const ScoreTransform tf(p, b, h);
  const int64_t i0 = static_cast<int64_t>(item.block) * kBlockQ;
  const int64_t nq = std::min(kBlockQ, seq.len_q - i0);
  const int64_t cols = round_up(nq, W);  // query columns
  const uint32_t batch_head = static_cast<uint32_t>(b * p.heads + h);

  float* qt = ws + sc.at;     // (d, cols)
  float* dot = ws + sc.bt;    // (dv, cols)
  float* dqt = ws + sc.acc1;  // (d, cols)
  float* pt = ws + sc.p;      // (nk, cols)
  float* dst = ws + sc.ds;    // (nk, cols)
  float* mult = ws + sc.mult;
  float* tanh_vals = p.softcap > 0.0f ? ws + sc.tanh : nullptr;
  float* row = ws + sc.row;
  float* lse2 = ws + sc.vec1;   // (cols)
  float* delta = ws + sc.vec2;  // (cols)

  rows_transposed(p.dtype, p.q, p.q_strides, b, seq.q_row0, i0, nq, h, d, row, qt, cols);
  rows_transposed(p.dtype, p.dout, p.dout_strides, b, seq.q_row0, i0, nq, h, dv, row, dot, cols);
  std::fill(dqt, dqt + d * cols, 0.0f);
  {
    const int64_t base = h * ctx.rows + ctx.row_base(b) + i0;
    std::copy(ctx.lse2 + base, ctx.lse2 + base + nq, lse2);
    std::copy(ctx.delta + base, ctx.delta + base + nq, delta);
    std::fill(lse2 + nq, lse2 + cols, kPosInf);  // padding columns: P = 0
    std::fill(delta + nq, delta + cols, 0.0f);
  }

  const int64_t j_first = vis.first_key(i0);
  const int64_t j_last = vis.last_key(i0 + nq - 1);
  for (int64_t kb = j_first / kBlockK; j_first <= j_last && kb <= j_last / kBlockK; ++kb) {
    const int64_t j0 = kb * kBlockK;
    const int64_t nk = std::min(kBlockK, seq.len_k - j0);
    int64_t kld = 0, vld = 0;
    const float* kp =
        rows_as_float(p.dtype, p.k, p.k_strides, b, seq.k_row0, j0, nk, hk, d, ws + sc.rows1, &kld);
    const float* vp =
        rows_as_float(p.dtype, p.v, p.v_strides, b, seq.k_row0, j0, nk, hk, dv, ws + sc.rows2, &vld);

    // P^T = exp2(x(K . Q^T) - lse2), keys as rows.
    gemm<Isa, false>(nk, cols, d, kp, kld, 1, qt, cols, pt, cols);
    const bool masked = !vis.all_visible(i0, i0 + nq, j0, j0 + nk);
    for (int64_t jr = 0; jr < nk; ++jr) {
      const int64_t j = j0 + jr;
      float* x = pt + jr * cols;
      transform_scores<W>(tf, x, tanh_vals != nullptr ? tanh_vals + jr * cols : nullptr, cols,
                          i0 + vis.diag - j, 1.0f);
      if (masked) mask_outside(x, cols, vis.first_query(j) - i0, vis.last_query(j) - i0);
      for (int64_t c = 0; c < cols; c += W) {
        V v, l;
        vload<W>(v, x + c);
        vload<W>(l, lse2 + c);
        v -= l;
        vexp2_inplace<W>(v);
        vstore<W>(x + c, v);
      }
    }

    // dP^T = V . dO^T, dropout, dS^T.
    gemm<Isa, false>(nk, cols, dv, vp, vld, 1, dot, cols, dst, cols);
    if (p.has_dropout()) {
      dropout_key_rows(p, batch_head, i0, nq, j0, nk, mult, cols);
      multiply<W>(dst, mult, dst, nk * cols);
    }
    for (int64_t jr = 0; jr < nk; ++jr) {
      for (int64_t c = 0; c < cols; c += W) {
        V pv, g, dl;
        vload<W>(pv, pt + jr * cols + c);
        vload<W>(g, dst + jr * cols + c);
        vload<W>(dl, delta + c);
        g = pv * (g - dl);
        if (tanh_vals != nullptr) {
          V t;
          vload<W>(t, tanh_vals + jr * cols + c);
          g *= 1.0f - t * t;
        }
        vstore<W>(dst + jr * cols + c, g);
      }
    }

    // dQ^T += K^T . dS^T.
    gemm<Isa, true>(d, cols, nk, kp, 1, kld, dst, cols, dqt, cols);
  }
  store_transposed(p.dtype, p.dq, p.dq_strides, b, seq.q_row0, i0, nq, h, d, dqt, cols, p.scale,
                   row);
}

template <class Isa>
FLASHATTN_CPU_INLINE void backward_item(const BackwardContext& ctx, int64_t index, float* ws) {
  const BackwardItem& item = ctx.items[index];
  if (item.pass == BackwardPass::kDkDv) {
    dkdv_item<Isa>(ctx, item, ws);
  } else {
    dq_item<Isa>(ctx, item, ws);
  }
}

using BackwardItemFn = void (*)(const BackwardContext&, int64_t, float*);

void backward_item_generic(const BackwardContext& ctx, int64_t index, float* ws) {
  backward_item<GenericIsa>(ctx, index, ws);
}
#if FLASHATTN_CPU_X86
FLASHATTN_TARGET_AVX2 void backward_item_avx2(const BackwardContext& ctx, int64_t index,
                                              float* ws) {
  backward_item<Avx2Isa>(ctx, index, ws);
}
FLASHATTN_TARGET_AVX512 void backward_item_avx512(const BackwardContext& ctx, int64_t index,
                                                  float* ws) {
  backward_item<Avx512Isa>(ctx, index, ws);
}
#endif

BackwardItemFn select_backward_item() {
#if FLASHATTN_CPU_X86
  switch (cpu_isa()) {
    case CpuIsa::kAvx512: return backward_item_avx512;
    case CpuIsa::kAvx2: return backward_item_avx2;
    case CpuIsa::kGeneric: break;
  }
#endif
  return backward_item_generic;
}

// Varlen rows past cu_seqlens[batch] belong to no sequence: their gradients are 0.
void clear_unused_rows(const BackwardParams& p) {
  if (!p.is_varlen()) return;
  for (int64_t r = p.cu_seqlens_q[p.batch]; r < p.total_q; ++r) {
    for (int64_t h = 0; h < p.heads; ++h) {
      zero_row(p.dtype, p.head_dim, element_ptr(p.dq, p.dtype, p.dq_strides, 0, 0, r, h));
    }
  }
  for (int64_t r = p.cu_seqlens_k[p.batch]; r < p.total_k; ++r) {
    for (int64_t h = 0; h < p.heads_k; ++h) {
      zero_row(p.dtype, p.head_dim, element_ptr(p.dk, p.dtype, p.dk_strides, 0, 0, r, h));
      zero_row(p.dtype, p.head_dim_v, element_ptr(p.dv, p.dtype, p.dv_strides, 0, 0, r, h));
    }
  }
}

Status run_backward(const BackwardParams& p) {
  clear_unused_rows(p);
  // dQ items (also the Delta pre-pass items) and dK/dV items, heaviest first under a
  // causal-like mask: late query blocks see the most keys, early key blocks the most queries.
  std::vector<BackwardItem> q_items, items;
  for (int64_t b = 0; b < p.batch; ++b) {
    const Sequence seq = sequence_of(p, b);
    const int64_t q_blocks = ceil_div(seq.len_q, kBlockQ);
    const int64_t k_blocks = ceil_div(seq.len_k, kBlockK);
    for (int64_t h = 0; h < p.heads; ++h) {
      for (int64_t qb = q_blocks - 1; qb >= 0; --qb) {
        q_items.push_back({BackwardPass::kDq, static_cast<int32_t>(b), static_cast<int32_t>(h),
                           static_cast<int32_t>(qb)});
      }
    }
    for (int64_t hk = 0; hk < p.heads_k; ++hk) {
      for (int64_t kb = 0; kb < k_blocks; ++kb) {
        items.push_back({BackwardPass::kDkDv, static_cast<int32_t>(b), static_cast<int32_t>(hk),
                         static_cast<int32_t>(kb)});
      }
    }
  }
  items.insert(items.end(), q_items.begin(), q_items.end());
  if (items.empty()) return Status::Ok();

  const BackwardScratch scratch(p);
  const int threads = resolve_num_threads(p.num_threads);
  const int64_t count = static_cast<int64_t>(items.size());
  const int workers = parallel_workers(count, threads);
  ScratchBuffer buffer(scratch.size, workers);
  const int64_t rows = p.is_varlen() ? p.total_q : static_cast<int64_t>(p.batch) * p.seqlen_q;
  std::vector<float> per_row(static_cast<size_t>(2 * p.heads * rows));
  BackwardContext ctx{&p, &scratch, items.data(), per_row.data(), per_row.data() + p.heads * rows,
                      rows};

  auto delta_body = [&](int64_t i, int worker) {
    delta_item(ctx, q_items[static_cast<size_t>(i)], buffer.worker(worker));
  };
  parallel_for(static_cast<int64_t>(q_items.size()), threads, ItemFunction(delta_body));

  const BackwardItemFn fn = select_backward_item();
  auto body = [&](int64_t i, int worker) { fn(ctx, i, buffer.worker(worker)); };
  parallel_for(count, threads, ItemFunction(body));
  return Status::Ok();
}

}  // namespace
}  // namespace cpu

Status cpu_backward(const BackwardParams& params) {
  try {
    return cpu::run_backward(params);
  } catch (const std::bad_alloc&) {
    return Status::Internal("cpu backward: out of memory while allocating scratch buffers");
  } catch (const std::exception& e) {
    return Status::Internal(std::string("cpu backward: ") + e.what());
  }
}

}  // namespace flashattn
