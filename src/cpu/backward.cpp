// CPU backward pass: FlashAttention-2 recomputation from the saved LSE, deterministic by
// construction: every accumulation happens in a fixed order inside one work item, and the work
// split depends only on the problem shape, so results are bitwise identical run to run and for
// any thread count.
//
// Pass 0, per (b, h, query block):  Delta_i = sum_c dO[i, c] * O[i, c]  and  lse2_i = lse_i *
//   log2(e) (+inf for a row with no visible key, so that its P is exactly 0). With a learnable
//   sink, P from the sink-inclusive LSE is already right; dsink[h] = -sum_i exp(sink[h] - lse_i)
//   * Delta_i is summed per head after pass 0, in (sequence, row) order (core/sink.h).
// Pass 1, per (b, kv head, chunk of key blocks): vectors along keys. For each key block of the
//   chunk, each query head of the GQA group and each query block the mask window lets see it:
//     S = Q . K^T, P = exp2(x(S) - lse2)                      (queries x keys)
//     dP = dO . V^T; with dropout Pd = P * m, dPd = dP * m     (m = keep / (1 - p))
//     dS = P * (dPd - Delta)  (dbias += dS, then * (1 - tanh^2) with softcap)
//     dV^T += dO^T . Pd,  dK^T += Q^T . dS,  dQ_chunk += dS . K
//   then dK = scale * dK^T^T and dV are written for the key block. (Query blocks that the
//   block mask, in either form, hides from the whole key block are skipped; x(S) includes
//   attn_bias and the masks as in the forward.)
// Pass 2, per (b, h, query block): dQ = scale * sum over chunks (in chunk order) of dQ_chunk.
//
// The chunk count depends on the shape only (enough items to keep a many-core machine busy);
// each chunk owns a float32 dQ partial, so memory is chunks x (heads x query rows x head_dim)
// floats: O(N d), never O(N^2). Scratch per worker is O((d + dv) * kBlock + kBlock^2) floats.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/params.h"
#include "core/sink.h"
#include "cpu/attention_common.h"
#include "cpu/convert.h"
#include "cpu/gemm.h"
#include "cpu/isa.h"
#include "cpu/simd.h"
#include "cpu/thread_pool.h"

namespace flashattn {
namespace cpu {
namespace {

// Pass 1 work item: key blocks [block_begin, block_end) of (sequence b, kv head), chunk
// `chunk` of that sequence.
struct ChunkItem {
  int32_t batch;
  int32_t head_k;
  int32_t chunk;
  int32_t block_begin;
  int32_t block_end;
  double cost;  // visible (query, key) pairs, for scheduling heavy items first
};

// Pass 0 and pass 2 work item: one block of kBlockQ queries of (sequence b, head h).
struct RowItem {
  int32_t batch;
  int32_t head;
  int32_t q_block;
};

// Number of key chunks per (sequence, kv head): enough pass-1 items to keep a many-core machine
// busy even under a causal mask (kTargetItems), chosen from the shape alone so that results do
// not depend on the thread count. Each chunk costs one float32 copy of dQ, bounded by
// kPartialBudgetBytes (a single chunk is always allowed: it is the dQ accumulator itself).
constexpr int64_t kTargetItems = 64;
constexpr int64_t kMaxChunks = 16;
constexpr double kPartialBudgetBytes = 256.0 * 1024.0 * 1024.0;

// Key blocks [*begin, *end) of chunk s when `blocks` blocks are split into `chunks` chunks.
void chunk_blocks(int64_t blocks, int64_t chunks, int64_t s, int64_t* begin, int64_t* end) {
  *begin = s * blocks / chunks;
  *end = (s + 1) * blocks / chunks;
}

// Offsets (in floats) of the per-worker scratch regions.
struct BackwardScratch {
  static constexpr int64_t kTile = kBlockQ * kBlockK;
  int64_t kt;     // (d, kBlockK)      K^T of the key block
  int64_t vt;     // (dv, kBlockK)     V^T
  int64_t dkt;    // (d, kBlockK)      dK^T accumulator
  int64_t dvt;    // (dv, kBlockK)     dV^T accumulator
  int64_t krows;  // (kBlockK, dpad)   K rows, zero-padded to dpad (B operand of dS . K)
  int64_t p;      // tile (queries x keys): P
  int64_t ds;     // tile: dP, then dS
  int64_t pd;     // tile: P * dropout multiplier
  int64_t mult;   // tile: dropout multipliers
  int64_t tanh;   // tile: tanh of the capped scores (softcap)
  int64_t qrows;  // (kBlockQ, d)      Q rows in float32 (float16/bfloat16 inputs)
  int64_t grows;  // (kBlockQ, dv)     dO rows in float32
  int64_t row;    // (max(dpad, dv))   one converted row
  int64_t row2;   // (max(dpad, dv))
  int64_t size;

  BackwardScratch(const BackwardParams& prm, int64_t dpad) {
    ScratchLayout lay;
    const int64_t d = prm.head_dim, dv = prm.head_dim_v;
    const bool convert = prm.dtype != DType::kFloat32;
    kt = lay.add(d * kBlockK);
    vt = lay.add(dv * kBlockK);
    dkt = lay.add(d * kBlockK);
    dvt = lay.add(dv * kBlockK);
    krows = lay.add(kBlockK * dpad);
    p = lay.add(kTile);
    ds = lay.add(kTile);
    pd = lay.add(prm.has_dropout() ? kTile : 0);
    mult = lay.add(prm.has_dropout() ? kTile : 0);
    tanh = lay.add(prm.softcap > 0.0f ? kTile : 0);
    qrows = lay.add(convert ? kBlockQ * d : 0);
    grows = lay.add(convert ? kBlockQ * dv : 0);
    row = lay.add(std::max(dpad, dv));
    row2 = lay.add(std::max(dpad, dv));
    size = lay.size();
  }
};

// Where pass 1 adds dS for dbias: element (b, h, i, j) at data + b * batch + slot * head +
// i * row + j, slot = hk when head_is_kv (a head-broadcast bias shared by several pass-1 items)
// else h. Either dbias itself (when no two pass-1 items share an element) or a float32
// workspace that reduce_dbias() sums into dbias in a fixed order. Null data: not requested.
struct DbiasTarget {
  float* data = nullptr;
  int64_t batch = 0, head = 0, row = 0;
  bool head_is_kv = false;
  int64_t slots = 0;  // workspace only: head slots per sequence (heads_k or heads)
  bool workspace = false;
  float* at(int64_t b, int64_t h, int64_t hk) const {
    return data + b * batch + (head_is_kv ? hk : h) * head;
  }
};

struct BackwardContext {
  const BackwardParams* params;
  const BackwardScratch* scratch;
  // (heads, rows): Delta and lse * log2(e) per query row; row = row_base(b) + i.
  float* delta;
  float* lse2;
  int64_t rows;
  // (chunks, heads, rows, dpad): float32 dQ partial sums, one per key chunk.
  float* dq_partial;
  int64_t chunks;
  int64_t dpad;
  // (heads, rows): exp(sink - lse_i) * Delta_i per query row; null unless dsink is requested.
  float* sink_terms = nullptr;
  DbiasTarget dbias;
  const BlockStates* blocks = nullptr;

  int64_t row_base(int64_t b) const {
    return params->is_varlen() ? params->cu_seqlens_q[b] : b * params->seqlen_q;
  }
  float* partial(int64_t chunk, int64_t h, int64_t row) const {
    return dq_partial + ((chunk * params->heads + h) * rows + row) * dpad;
  }
  // Chunks of sequence b (at most `chunks`, at most one per key block).
  int64_t chunks_of(const Sequence& seq) const {
    return std::min(chunks, ceil_div(seq.len_k, kBlockK));
  }
};

// Pass 0 for one (b, h, query block).
void delta_item(const BackwardContext& ctx, const RowItem& item, float* ws) {
  const BackwardParams& p = *ctx.params;
  const BackwardScratch& sc = *ctx.scratch;
  const int64_t b = item.batch, h = item.head;
  const Sequence seq = sequence_of(p, b);
  const int64_t i0 = static_cast<int64_t>(item.q_block) * kBlockQ;
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
  if (ctx.sink_terms != nullptr) {
    float* term = ctx.sink_terms + h * ctx.rows + ctx.row_base(b) + i0;
    for (int64_t ir = 0; ir < nq; ++ir) term[ir] = sink_grad_term(p.learnable_sink[h], lse[ir], delta[ir]);
  }
}

// dsink[h] = -(sum of head h's sink terms over every sequence and row, in that order).
void sink_grad(const BackwardContext& ctx) {
  const BackwardParams& p = *ctx.params;
  for (int64_t h = 0; h < p.heads; ++h) {
    double sum = 0.0;
    for (int64_t b = 0; b < p.batch; ++b) {
      const float* term = ctx.sink_terms + h * ctx.rows + ctx.row_base(b);
      const int64_t len_q = sequence_of(p, b).len_q;
      for (int64_t i = 0; i < len_q; ++i) sum += term[i];
    }
    p.dsink[h] = static_cast<float>(-sum);
  }
}

// Pass 2 for one (b, h, query block): dQ = scale * (sum of the chunk partials, in chunk order).
void dq_item(const BackwardContext& ctx, const RowItem& item, float* ws) {
  const BackwardParams& p = *ctx.params;
  const BackwardScratch& sc = *ctx.scratch;
  const int64_t b = item.batch, h = item.head;
  const int64_t d = p.head_dim;
  const Sequence seq = sequence_of(p, b);
  const Visibility vis(p, seq);
  const int64_t i0 = static_cast<int64_t>(item.q_block) * kBlockQ;
  const int64_t nq = std::min(kBlockQ, seq.len_q - i0);
  const int64_t blocks = ceil_div(seq.len_k, kBlockK);
  const int64_t chunks = ctx.chunks_of(seq);
  float* sum = ws + sc.row;
  for (int64_t ir = 0; ir < nq; ++ir) {
    const int64_t i = i0 + ir;
    std::fill(sum, sum + d, 0.0f);
    for (int64_t s = 0; s < chunks; ++s) {
      int64_t kb0 = 0, kb1 = 0;
      chunk_blocks(blocks, chunks, s, &kb0, &kb1);
      const int64_t j_end = std::min(kb1 * kBlockK, seq.len_k);
      // Rows outside the chunk's reach were never written (nor zeroed) by it.
      if (i < vis.first_query(kb0 * kBlockK) || i > vis.last_query(j_end - 1)) continue;
      const float* part = ctx.partial(s, h, ctx.row_base(b) + i);
      for (int64_t c = 0; c < d; ++c) sum[c] += part[c];
    }
    store_row(p.dtype, sum, p.scale, d,
              element_ptr(p.dq, p.dtype, p.dq_strides, b, seq.q_row0, i, h));
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

// ds[c] *= 1 - t[c]^2 over n elements (softcap's derivative, after dbias took dS).
inline void softcap_grad(float* ds, const float* t, int64_t n) {
  for (int64_t c = 0; c < n; ++c) ds[c] *= 1.0f - t[c] * t[c];
}

// x = exp2(x * k - l) over n (multiple of W) elements.
template <int W>
FLASHATTN_CPU_INLINE void exp2_minus(float* x, const VecF<W>& k, const VecF<W>& l, int64_t n) {
  for (int64_t c = 0; c < n; c += W) {
    VecF<W> v;
    vload<W>(v, x + c);
    v = v * k - l;
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
                                           int64_t width, const float* acc, int64_t ld, float scale,
                                           float* row) {
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t c = 0; c < width; ++c) row[c] = acc[c * ld + r];
    store_row(dt, row, scale, width, element_ptr(base, dt, st, b, row0, i0 + r, hh));
  }
}

// Pass 1: dK and dV of the chunk's key blocks, and the chunk's dQ partial.
template <class Isa>
FLASHATTN_CPU_INLINE void chunk_item(const BackwardContext& ctx, const ChunkItem& item, float* ws) {
  constexpr int W = Isa::kWidth;
  using V = VecF<W>;
  const BackwardParams& p = *ctx.params;
  const BackwardScratch& sc = *ctx.scratch;
  const int64_t b = item.batch, hk = item.head_k;
  const int64_t group = p.heads / p.heads_k;
  const int64_t d = p.head_dim, dv = p.head_dim_v, dpad = ctx.dpad;
  const Sequence seq = sequence_of(p, b);
  const Visibility vis(p, seq);
  const int64_t row_base = ctx.row_base(b);

  float* kt = ws + sc.kt;        // (d, kc)
  float* vt = ws + sc.vt;        // (dv, kc)
  float* dkt = ws + sc.dkt;      // (d, kc)
  float* dvt = ws + sc.dvt;      // (dv, kc)
  float* krows = ws + sc.krows;  // (nk, dpad)
  float* prob = ws + sc.p;       // (nq, kc)
  float* ds = ws + sc.ds;        // (nq, kc)
  float* pd = p.has_dropout() ? ws + sc.pd : prob;
  float* mult = ws + sc.mult;
  float* tanh_vals = p.softcap > 0.0f ? ws + sc.tanh : nullptr;
  float* row = ws + sc.row;

  // Zero the rows of this chunk's dQ partial that its keys can reach.
  {
    const int64_t j_begin = static_cast<int64_t>(item.block_begin) * kBlockK;
    const int64_t j_end = std::min(static_cast<int64_t>(item.block_end) * kBlockK, seq.len_k);
    const int64_t q_lo = vis.first_query(j_begin), q_hi = vis.last_query(j_end - 1);
    for (int64_t g = 0; g < group && q_lo <= q_hi; ++g) {
      float* part = ctx.partial(item.chunk, hk * group + g, row_base + q_lo);
      std::fill(part, part + (q_hi - q_lo + 1) * dpad, 0.0f);
    }
  }

  for (int64_t kb = item.block_begin; kb < item.block_end; ++kb) {
    const int64_t j0 = kb * kBlockK;
    const int64_t nk = std::min(kBlockK, seq.len_k - j0);
    const int64_t kc = round_up(nk, W);  // key columns
    rows_transposed(p.dtype, p.k, p.k_strides, b, seq.k_row0, j0, nk, hk, d, row, kt, kc);
    rows_transposed(p.dtype, p.v, p.v_strides, b, seq.k_row0, j0, nk, hk, dv, row, vt, kc);
    for (int64_t r = 0; r < nk; ++r) {
      load_row(p.dtype, element_ptr(p.k, p.dtype, p.k_strides, b, seq.k_row0, j0 + r, hk), d,
               krows + r * dpad);
      std::fill(krows + r * dpad + d, krows + (r + 1) * dpad, 0.0f);
    }
    std::fill(dkt, dkt + d * kc, 0.0f);
    std::fill(dvt, dvt + dv * kc, 0.0f);

    const int64_t i_first = vis.first_query(j0);
    const int64_t i_last = vis.last_query(j0 + nk - 1);
    for (int64_t g = 0; g < group; ++g) {
      const int64_t h = hk * group + g;
      const ScoreTransform tf(p, b, h);
      const ScoreMods mods(p, *ctx.blocks, b, h);
      float* dbias = ctx.dbias.data != nullptr ? ctx.dbias.at(b, h, hk) : nullptr;
      const uint32_t batch_head = static_cast<uint32_t>(b * p.heads + h);
      const float* lse2 = ctx.lse2 + h * ctx.rows + row_base;
      const float* delta = ctx.delta + h * ctx.rows + row_base;
      float* dq_rows = ctx.partial(item.chunk, h, row_base);  // (len_q, dpad)
      for (int64_t i0 = i_first; i0 <= i_last; i0 += kBlockQ) {
        const int64_t nq = std::min(kBlockQ, i_last + 1 - i0);
        // A tile the block mask hides entirely is skipped: no loads, no math.
        if (mods.on && !mods.keeps_any(i0, i0 + nq, j0, j0 + nk)) continue;
        int64_t qld = 0, gld = 0;
        const float* qp = rows_as_float(p.dtype, p.q, p.q_strides, b, seq.q_row0, i0, nq, h, d,
                                        ws + sc.qrows, &qld);
        const float* gp = rows_as_float(p.dtype, p.dout, p.dout_strides, b, seq.q_row0, i0, nq, h,
                                        dv, ws + sc.grows, &gld);

        // P = exp2(x(Q . K^T) - lse2), queries as rows.
        gemm<Isa, GemmMode::kStore>(nq, kc, d, qp, qld, 1, kt, kc, prob, kc);
        const bool masked = !vis.all_visible(i0, i0 + nq, j0, j0 + nk) || kc != nk;
        for (int64_t ir = 0; ir < nq; ++ir) {
          const int64_t i = i0 + ir;
          float* x = prob + ir * kc;
          transform_scores<W>(tf, x, tanh_vals != nullptr ? tanh_vals + ir * kc : nullptr, kc,
                              i + vis.diag - j0, -1.0f);
          if (mods.on) mods.apply(x, nk, i, 0, j0, 1);
          if (masked) {
            mask_outside(x, kc, vis.first_key(i) - j0, std::min(vis.last_key(i), j0 + nk - 1) - j0);
          }
          V l, k;
          vsplat<W>(l, lse2[i]);
          vsplat<W>(k, tf.exp_scale);
          exp2_minus<W>(x, k, l, kc);
        }

        // dP = dO . V^T, dropout, dS.
        gemm<Isa, GemmMode::kStore>(nq, kc, dv, gp, gld, 1, vt, kc, ds, kc);
        if (p.has_dropout()) {
          dropout_query_rows(p, batch_head, i0, nq, j0, nk, mult, kc);
          multiply<W>(prob, mult, pd, nq * kc);
          multiply<W>(ds, mult, ds, nq * kc);
        }
        // dbias takes dS = P * (dP - Delta) before softcap's factor (the bias is added after
        // softcap), rows in order, so a row-broadcast bias sums deterministically.
        for (int64_t ir = 0; ir < nq; ++ir) {
          V dl;
          vsplat<W>(dl, delta[i0 + ir]);
          float* ds_row = ds + ir * kc;
          const float* t_row = tanh_vals != nullptr ? tanh_vals + ir * kc : nullptr;
          softmax_grad<W>(prob + ir * kc, ds_row, dbias != nullptr ? nullptr : t_row, dl, kc);
          if (dbias != nullptr) {
            float* out = dbias + (i0 + ir) * ctx.dbias.row + j0;
            for (int64_t c = 0; c < nk; ++c) out[c] += ds_row[c];
            if (t_row != nullptr) softcap_grad(ds_row, t_row, kc);
          }
        }

        // dV^T += dO^T . Pd,  dK^T += Q^T . dS,  dQ_chunk += dS . K.
        gemm<Isa, GemmMode::kAccumulate>(dv, kc, nq, gp, 1, gld, pd, kc, dvt, kc);
        gemm<Isa, GemmMode::kAccumulate>(d, kc, nq, qp, 1, qld, ds, kc, dkt, kc);
        gemm<Isa, GemmMode::kAccumulate>(nq, dpad, nk, ds, kc, 1, krows, dpad, dq_rows + i0 * dpad,
                                         dpad);
      }
    }
    store_transposed(p.dtype, p.dk, p.dk_strides, b, seq.k_row0, j0, nk, hk, d, dkt, kc, p.scale,
                     row);
    store_transposed(p.dtype, p.dv, p.dv_strides, b, seq.k_row0, j0, nk, hk, dv, dvt, kc, 1.0f,
                     row);
  }
}

using ChunkItemFn = void (*)(const BackwardContext&, const ChunkItem&, float*);

void chunk_item_generic(const BackwardContext& ctx, const ChunkItem& item, float* ws) {
  chunk_item<GenericIsa>(ctx, item, ws);
}
#if FLASHATTN_CPU_X86
FLASHATTN_TARGET_AVX2 void chunk_item_avx2(const BackwardContext& ctx, const ChunkItem& item,
                                           float* ws) {
  chunk_item<Avx2Isa>(ctx, item, ws);
}
FLASHATTN_TARGET_AVX512 void chunk_item_avx512(const BackwardContext& ctx, const ChunkItem& item,
                                               float* ws) {
  chunk_item<Avx512Isa>(ctx, item, ws);
}
#endif

ChunkItemFn select_chunk_item() {
#if FLASHATTN_CPU_X86
  switch (cpu_isa()) {
    case CpuIsa::kAvx512:
      return chunk_item_avx512;
    case CpuIsa::kAvx2:
      return chunk_item_avx2;
    case CpuIsa::kGeneric:
      break;
  }
#endif
  return chunk_item_generic;
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

// Pass 1's dbias target, zeroed (see DbiasTarget). Pass-1 items own (b, kv head, key columns),
// so dbias itself is the target unless its batch dimension is broadcast over several sequences
// or its head dimension over several kv heads, or it is 16-bit; then *workspace becomes a zeroed float32
// (batch, slots, rows, seqlen_k) array, slots = heads_k or heads, rows = dbias's (1 or seqlen_q):
// O(batch * heads * seqlen_q * seqlen_k) floats at most, summed afterwards by reduce_dbias().
DbiasTarget dbias_target(const BackwardParams& p, std::vector<float>* workspace) {
  DbiasTarget t;
  const Broadcast4& d = p.dbias;
  if (!d.defined()) return t;
  const int64_t cols = p.seqlen_k;
  const bool shared_batch = d.size[0] == 1 && p.batch > 1;
  const bool shared_head = d.size[1] == 1 && p.heads_k > 1;
  // A 16-bit dbias takes the float32 workspace too: reduce_dbias rounds each sum once.
  if (!shared_batch && !shared_head && d.dtype == DType::kFloat32) {
    t.data = static_cast<float*>(d.data);
    t.batch = d.batch;
    t.head = d.head;
    t.row = d.row;
    for (int64_t b = 0; b < d.size[0]; ++b) {
      for (int64_t h = 0; h < d.size[1]; ++h) {
        for (int64_t r = 0; r < d.size[2]; ++r) {
          float* row = t.data + b * d.batch + h * d.head + r * d.row;
          std::fill(row, row + cols, 0.0f);
        }
      }
    }
    return t;
  }
  const int64_t slots = d.size[1] == 1 ? p.heads_k : p.heads;
  const int64_t rows = d.size[2];
  workspace->assign(static_cast<size_t>(p.batch * slots * rows * cols), 0.0f);
  t.data = workspace->data();
  t.row = rows == 1 ? 0 : cols;
  t.head = rows * cols;
  t.batch = slots * rows * cols;
  t.head_is_kv = d.size[1] == 1;
  t.slots = slots;
  t.workspace = true;
  return t;
}

// dbias[bb, hh, r, j] = sum over the workspace entries that broadcast onto it, sequences then
// slots in increasing order, in dbias's dtype.
void reduce_dbias(const BackwardParams& p, const DbiasTarget& t) {
  const Broadcast4& d = p.dbias;
  const int64_t cols = p.seqlen_k;
  const int64_t per_dbias_head = d.size[1] == 1 ? t.slots : 1;
  std::vector<double> sum(static_cast<size_t>(cols));
  std::vector<float> row(static_cast<size_t>(cols));
  for (int64_t bb = 0; bb < d.size[0]; ++bb) {
    const int64_t b_lo = d.size[0] == 1 ? 0 : bb, b_hi = d.size[0] == 1 ? p.batch : bb + 1;
    for (int64_t hh = 0; hh < d.size[1]; ++hh) {
      const int64_t s_lo = hh * per_dbias_head, s_hi = s_lo + per_dbias_head;
      for (int64_t r = 0; r < d.size[2]; ++r) {
        std::fill(sum.begin(), sum.end(), 0.0);
        for (int64_t b = b_lo; b < b_hi; ++b) {
          for (int64_t s = s_lo; s < s_hi; ++s) {
            const float* src = t.data + b * t.batch + s * t.head + r * t.row;
            for (int64_t j = 0; j < cols; ++j) sum[static_cast<size_t>(j)] += src[j];
          }
        }
        for (int64_t j = 0; j < cols; ++j) row[static_cast<size_t>(j)] = static_cast<float>(sum[static_cast<size_t>(j)]);
        // (Through float32 first: a 16-bit dbias gets the bits of the float32 one cast.)
        store_row(d.dtype, row.data(), 1.0f, cols,
                  static_cast<char*>(d.data) + (bb * d.batch + hh * d.head + r * d.row) * dtype_size(d.dtype));
      }
    }
  }
}

Status run_backward(const BackwardParams& p) {
  clear_unused_rows(p);
  const int64_t rows = p.is_varlen() ? p.total_q : static_cast<int64_t>(p.batch) * p.seqlen_q;
  const int64_t dpad = round_up(p.head_dim, kMaxWidth);

  // Chunks per (sequence, kv head), from the shape only.
  int64_t max_blocks = 0;
  for (int64_t b = 0; b < p.batch; ++b) {
    max_blocks = std::max(max_blocks, ceil_div(sequence_of(p, b).len_k, kBlockK));
  }
  const int64_t pairs = std::max<int64_t>(1, static_cast<int64_t>(p.batch) * p.heads_k);
  int64_t chunks = std::clamp<int64_t>(ceil_div(kTargetItems, pairs), 1,
                                       std::max<int64_t>(1, std::min(kMaxChunks, max_blocks)));
  const double partial_bytes = 4.0 * static_cast<double>(p.heads) * rows * dpad;
  while (chunks > 1 && chunks * partial_bytes > kPartialBudgetBytes) --chunks;

  // Items. Pass 1 heaviest first (visible pairs); passes 0 and 2 in (b, h, block) order.
  std::vector<ChunkItem> chunk_items;
  std::vector<RowItem> row_items;
  for (int64_t b = 0; b < p.batch; ++b) {
    const Sequence seq = sequence_of(p, b);
    const Visibility vis(p, seq);
    const int64_t blocks = ceil_div(seq.len_k, kBlockK);
    const int64_t n_chunks = std::min(chunks, blocks);
    for (int64_t s = 0; s < n_chunks; ++s) {
      int64_t kb0 = 0, kb1 = 0;
      chunk_blocks(blocks, n_chunks, s, &kb0, &kb1);
      double cost = 0.0;
      for (int64_t j = kb0 * kBlockK; j < std::min(kb1 * kBlockK, seq.len_k); ++j) {
        cost +=
            static_cast<double>(std::max<int64_t>(0, vis.last_query(j) - vis.first_query(j) + 1));
      }
      for (int64_t hk = 0; hk < p.heads_k; ++hk) {
        chunk_items.push_back({static_cast<int32_t>(b), static_cast<int32_t>(hk),
                               static_cast<int32_t>(s), static_cast<int32_t>(kb0),
                               static_cast<int32_t>(kb1), cost});
      }
    }
    const int64_t q_blocks = ceil_div(seq.len_q, kBlockQ);
    for (int64_t h = 0; h < p.heads; ++h) {
      for (int64_t qb = 0; qb < q_blocks; ++qb) {
        row_items.push_back(
            {static_cast<int32_t>(b), static_cast<int32_t>(h), static_cast<int32_t>(qb)});
      }
    }
  }
  std::stable_sort(chunk_items.begin(), chunk_items.end(),
                   [](const ChunkItem& x, const ChunkItem& y) { return x.cost > y.cost; });
  if (p.dsink != nullptr && row_items.empty()) std::fill(p.dsink, p.dsink + p.heads, 0.0f);
  std::vector<float> dbias_workspace;
  const DbiasTarget dbias = dbias_target(p, &dbias_workspace);
  if (dbias.workspace && chunk_items.empty()) reduce_dbias(p, dbias);  // zeros
  if (chunk_items.empty() && row_items.empty()) return Status::Ok();

  const BackwardScratch scratch(p, dpad);
  const BlockStates blocks(p);
  const int threads = resolve_num_threads(p.num_threads);
  const int64_t max_items = std::max(chunk_items.size(), row_items.size());
  ScratchBuffer buffer(scratch.size, parallel_workers(max_items, threads));
  // Written before read (each chunk zeroes the partial rows it reaches), so left uninitialised.
  const int64_t per_row_arrays = p.dsink != nullptr ? 3 : 2;  // Delta, lse2[, sink terms]
  const auto per_row = std::make_unique_for_overwrite<float[]>(
      static_cast<size_t>(per_row_arrays * p.heads * rows));
  const auto partials =
      std::make_unique_for_overwrite<float[]>(static_cast<size_t>(chunks * p.heads * rows * dpad));
  const BackwardContext ctx{&p,
                            &scratch,
                            per_row.get(),
                            per_row.get() + p.heads * rows,
                            rows,
                            partials.get(),
                            chunks,
                            dpad,
                            p.dsink != nullptr ? per_row.get() + 2 * p.heads * rows : nullptr,
                            dbias,
                            &blocks};

  auto delta_body = [&](int64_t i, int worker) {
    delta_item(ctx, row_items[static_cast<size_t>(i)], buffer.worker(worker));
  };
  parallel_for(static_cast<int64_t>(row_items.size()), threads, ItemFunction(delta_body));
  if (p.dsink != nullptr) sink_grad(ctx);

  const ChunkItemFn fn = select_chunk_item();
  auto chunk_body = [&](int64_t i, int worker) {
    fn(ctx, chunk_items[static_cast<size_t>(i)], buffer.worker(worker));
  };
  parallel_for(static_cast<int64_t>(chunk_items.size()), threads, ItemFunction(chunk_body));

  auto dq_body = [&](int64_t i, int worker) {
    dq_item(ctx, row_items[static_cast<size_t>(i)], buffer.worker(worker));
  };
  parallel_for(static_cast<int64_t>(row_items.size()), threads, ItemFunction(dq_body));
  if (dbias.workspace && !chunk_items.empty()) reduce_dbias(p, dbias);
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
