// CPU forward pass: FlashAttention tiling with an online softmax.
//
// Work item = (sequence b, head h, block of kBlockQ queries); items run in parallel on the
// thread pool and each writes only its own rows of out and lse. Per item:
//
//   Q^T (d x cols) <- the query block, transposed to float32 (cols = queries padded to W)
//   for each key block of kBlockK keys that the mask window reaches (and, with a block mask in
//   either form (BlockStates), that some kept block touches; the others are skipped before any
//   load):
//     S^T = K . Q^T                  (keys x cols: key rows, vectors along queries)
//     x = transform(S^T)             (scale*log2e, softcap, ALiBi; attn_bias, attn_mask (on
//                                     partial blocks) and the block states per element when
//                                     given (ScoreMods); -inf
//                                     where masked; only blocks that straddle the window
//                                     edge are window-masked)
//     m_new = max(m, colmax(x)); P = exp2(x - m_new); l = l * 2^(m - m_new) + colsum(P)
//     O^T = O^T * 2^(m - m_new) + V^T . (P * dropout)
//   fold the learnable sink into (m, l) (core/sink.h); O = O^T / l, LSE = (m + log2 l) * ln 2
// FP8 (float8_e4m3 q, k, v): m is the reference fp8_p_reference(running max) (core/fp8.h), an
// integer minus 8, and P is rounded to e4m3 after its column sums are taken; O picks up
// v_descale at the end. An FP8 KV cache under 16-bit queries only dequantizes its rows.
// Without softcap/ALiBi the scale is folded into the exponent and, for unmasked blocks, the
// column maximum comes out of the S product's registers; the O^T rescale is folded into the
// P.V product and skipped when no column maximum moved (FlashAttention-4's conditional
// rescaling, at block granularity).
//
// Scratch per worker: O((d + dv + kBlockK) * kBlockQ + kBlockK * (d + dv)) floats; nothing
// grows with the sequence length except the O(batch * heads * seqlen / kBlockQ) item list.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <new>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/fp8.h"
#include "core/params.h"
#include "core/sink.h"
#include "cpu/attention_common.h"
#include "cpu/convert.h"
#include "cpu/gemm.h"
#include "cpu/isa.h"
#include "cpu/kvcache.h"
#include "cpu/simd.h"
#include "cpu/thread_pool.h"

namespace flashattn {
namespace cpu {
namespace {

struct ForwardItem {
  int32_t batch;
  int32_t head;
  int32_t q_block;
};

// Offsets (in floats) of the per-worker scratch regions.
struct ForwardScratch {
  int64_t qt;     // (d, kBlockQ)        Q^T of the block
  int64_t ot;     // (dv, kBlockQ)       unnormalised O^T
  int64_t s;      // (kBlockK, kBlockQ)  scores, then probabilities, of one key block
  int64_t mult;   // (kBlockK, kBlockQ)  dropout multipliers
  int64_t k;      // (kBlockK, d)        K rows in float32 (float16/bfloat16 inputs)
  int64_t v;      // (kBlockK, dv)       V rows in float32
  int64_t row;    // (max(d, dv))        one converted row
  int64_t m;      // (kBlockQ)           running max (log2 domain)
  int64_t l;      // (kBlockQ)           running sum
  int64_t alpha;  // (kBlockQ)           2^(m_old - m_new)
  int64_t mx;     // (kBlockQ)           maximum of the current tile, per query column
  int64_t size;

  explicit ForwardScratch(const ForwardParams& p) {
    ScratchLayout lay;
    const int64_t d = p.head_dim, dv = p.head_dim_v;
    qt = lay.add(d * kBlockQ);
    ot = lay.add(dv * kBlockQ);
    s = lay.add(kBlockK * kBlockQ);
    mult = lay.add(p.has_dropout() ? kBlockK * kBlockQ : 0);
    // Paged caches are always gathered into the buffers (a key block may span pages).
    const bool convert = p.kv_dtype != DType::kFloat32 || p.kv.paged();
    k = lay.add(convert ? kBlockK * d : 0);
    v = lay.add(convert ? kBlockK * dv : 0);
    row = lay.add(std::max(d, dv));
    m = lay.add(kBlockQ);
    l = lay.add(kBlockQ);
    alpha = lay.add(kBlockQ);
    mx = lay.add(kBlockQ);
    size = lay.size();
  }
};

// Sequence b of a forward or forward_kvcache call. With a KV cache, keys are the cache rows
// [kv.first(b), kv.end(b)) and k_row0 is the first of them (an absolute cache row). A varlen
// call with a block table: its query rows, and keys at the rows [0, its key count) of its pages.
inline Sequence forward_sequence(const ForwardParams& p, int64_t b) {
  if (!p.kv.enabled) return sequence_of(p, b);
  Sequence s;
  if (p.is_varlen()) {
    s = sequence_of(p, b);
    s.k_row0 = 0;
    s.len_k = p.kv.clamp_rows(s.len_k);
    return s;
  }
  s.len_q = p.seqlen_q;
  s.k_row0 = p.kv.first(static_cast<int>(b));
  s.len_k = p.kv.end(static_cast<int>(b)) - s.k_row0;
  return s;
}

// Key or value rows [j0, j0 + n) of sequence b, head hh, as float32 (see rows_as_float). A
// dense cache reads through its cache row (cache_batch_idx); a paged cache resolves each row's
// page (row -> block_table[b][row / page_size], row % page_size) and is always converted.
FLASHATTN_CPU_INLINE const float* kv_rows_as_float(const ForwardParams& p, const void* base,
                                                   const Strides3& st, int64_t b,
                                                   const Sequence& seq, int64_t j0, int64_t n,
                                                   int64_t hh, int64_t width, float* buf,
                                                   int64_t* ld) {
  if (!p.kv.paged()) {
    const int64_t cb = p.kv.enabled ? p.kv.cache_batch(static_cast<int>(b)) : b;
    return rows_as_float(p.kv_dtype, base, st, cb, seq.k_row0, j0, n, hh, width, buf, ld);
  }
  const int64_t es = dtype_size(p.kv_dtype);
  for (int64_t r = 0; r < n; ++r) {
    const int64_t off = p.kv.row_offset(st, static_cast<int>(b), seq.k_row0 + j0 + r) + hh * st.head;
    load_row(p.kv_dtype, static_cast<const char*>(base) + off * es, width, buf + r * width);
  }
  *ld = width;
  return buf;
}

struct ForwardContext {
  const ForwardParams* params;
  const ForwardScratch* scratch;
  const BlockStates* blocks;
};

template <class Isa>
FLASHATTN_CPU_INLINE void forward_item(const ForwardContext& ctx, const ForwardItem& item,
                                       float* ws) {
  constexpr int W = Isa::kWidth;
  using V = VecF<W>;
  const ForwardParams& p = *ctx.params;
  const ForwardScratch& sc = *ctx.scratch;
  const int64_t b = item.batch, h = item.head;
  const int64_t hk = h / (p.heads / p.heads_k);
  const int64_t d = p.head_dim, dv = p.head_dim_v;
  const Sequence seq = forward_sequence(p, b);
  const Visibility vis(p, seq);
  const ScoreTransform tf(p, b, h);
  const bool fp8 = p.rounds_p_to_fp8();
  const float v_descale = p.v_descale.at(b, hk);
  const ScoreMods mods(p, *ctx.blocks, b, h);
  const int64_t i0 = static_cast<int64_t>(item.q_block) * kBlockQ;
  const int64_t nq = std::min(kBlockQ, seq.len_q - i0);
  const int64_t cols = round_up(nq, W);

  float* qt = ws + sc.qt;        // (d, cols)
  float* ot = ws + sc.ot;        // (dv, cols)
  float* st = ws + sc.s;         // (nk, cols)
  float* mult = ws + sc.mult;    // (nk, cols)
  float* row = ws + sc.row;      // (max(d, dv))
  float* m = ws + sc.m;          // (cols)
  float* l = ws + sc.l;          // (cols)
  float* alpha = ws + sc.alpha;  // (cols)
  float* mx = ws + sc.mx;        // (cols)

  rows_transposed(p.dtype, p.q, p.q_strides, b, seq.q_row0, i0, nq, h, d, row, qt, cols);
  std::fill(ot, ot + dv * cols, 0.0f);
  std::fill(m, m + cols, kNegInf);
  std::fill(l, l + cols, 0.0f);

  const int64_t j_first = vis.first_key(i0);
  const int64_t j_last = vis.last_key(i0 + nq - 1);
  const uint32_t batch_head = static_cast<uint32_t>(b * p.heads + h);
  for (int64_t kb = j_first / kBlockK; j_first <= j_last && kb <= j_last / kBlockK; ++kb) {
    const int64_t j0 = kb * kBlockK;
    const int64_t nk = std::min(kBlockK, seq.len_k - j0);
    // A tile the block mask hides entirely is skipped: no loads, no math.
    if (mods.on && !mods.keeps_any(i0, i0 + nq, j0, j0 + nk)) continue;
    int64_t kld = 0, vld = 0;
    const float* kp = kv_rows_as_float(p, p.k, p.k_strides, b, seq, j0, nk, hk, d, ws + sc.k, &kld);
    const float* vp = kv_rows_as_float(p, p.v, p.v_strides, b, seq, j0, nk, hk, dv, ws + sc.v, &vld);

    // S^T = K . Q^T: raw dot products (logits after transform_scores unless tf.plain), and
    // the maximum of each query column. Without masking or transform the maximum comes out of
    // the matrix product's registers.
    const bool masked = !vis.all_visible(i0, i0 + nq, j0, j0 + nk);
    std::fill(mx, mx + cols, kNegInf);
    if (tf.plain && !masked) {
      gemm<Isa, GemmMode::kStoreColMax>(nk, cols, d, kp, kld, 1, qt, cols, st, cols, mx);
    } else {
      gemm<Isa, GemmMode::kStore>(nk, cols, d, kp, kld, 1, qt, cols, st, cols);
      for (int64_t jr = 0; jr < nk; ++jr) {
        float* x = st + jr * cols;
        transform_scores<W>(tf, x, nullptr, cols, i0 + vis.diag - (j0 + jr), 1.0f);
        if (mods.on) mods.apply(x, nq, i0, 1, j0 + jr, 0);
        if (masked) {
          const int64_t j = j0 + jr;
          mask_outside(x, cols, vis.first_query(j) - i0, vis.last_query(j) - i0);
        }
      }
      for (int64_t c = 0; c < cols; c += W) {
        V cm;
        vload<W>(cm, mx + c);
        for (int64_t jr = 0; jr < nk; ++jr) {
          V x;
          vload<W>(x, st + jr * cols + c);
          vmax_inplace<W>(cm, x);
        }
        vstore<W>(mx + c, cm);
      }
    }

    // Online softmax, one vector of query columns at a time: m_new = max(m, tile max),
    // P = exp2(s * exp_scale - m_new), l = l * 2^(m - m_new) + colsum(P); the tile then holds
    // P times the dropout multipliers (l sums P before dropout, as the LSE requires).
    const bool dropout = p.has_dropout();
    if (dropout) dropout_key_rows(p, batch_head, i0, nq, j0, nk, mult, cols);
    bool rescale = false;
    V exp_scale, max_scale;
    vsplat<W>(exp_scale, tf.exp_scale);
    vsplat<W>(max_scale, tf.exp_scale);
    if (fp8) {
      // The tile's candidate references; m (the running one) only ever steps by integers.
      for (int64_t c = 0; c < cols; ++c) mx[c] = fp8_p_reference(mx[c] * tf.exp_scale);
      vsplat<W>(max_scale, 1.0f);
    }
    for (int64_t c = 0; c < cols; c += W) {
      V m_old, m_new, a, use;
      vload<W>(m_new, mx + c);
      m_new *= max_scale;
      vload<W>(m_old, m + c);
      vmax_inplace<W>(m_new, m_old);
      // A column that has seen only masked keys keeps m = -inf; subtracting 0 instead keeps
      // exp2(-inf - m) = 0 and avoids -inf - -inf.
      use = m_new == kNegInf ? V{} : m_new;
      a = m_old - use;
      vexp2_inplace<W>(a);
      rescale |= vany_ne<W>(a, 1.0f);
      vstore<W>(m + c, m_new);
      vstore<W>(alpha + c, a);
      V sum{};
      for (int64_t jr = 0; jr < nk; ++jr) {
        V x;
        vload<W>(x, st + jr * cols + c);
        x = x * exp_scale - use;
        vexp2_inplace<W>(x);
        sum += x;
        if (dropout) {
          V f;
          vload<W>(f, mult + jr * cols + c);
          x *= f;
        }
        vstore<W>(st + jr * cols + c, x);
      }
      V lv;
      vload<W>(lv, l + c);
      lv = lv * a + sum;
      vstore<W>(l + c, lv);
    }
    // FP8: P.V takes the probabilities rounded to e4m3 (l above summed them unrounded).
    if (fp8) {
      for (int64_t e = 0; e < nk * cols; ++e) st[e] = round_to_e4m3(st[e]);
    }

    // O^T = O^T * alpha + V^T . P^T (the rescale is skipped when no column maximum moved).
    if (rescale) {
      gemm<Isa, GemmMode::kScaleAccumulate>(dv, cols, nk, vp, 1, vld, st, cols, ot, cols, alpha);
    } else {
      gemm<Isa, GemmMode::kAccumulate>(dv, cols, nk, vp, 1, vld, st, cols, ot, cols);
    }
  }

  // Normalise, write O and LSE. A learnable sink is folded into (m, l) first (core/sink.h).
  // A query with no visible key has l = 0: O = 0, LSE = -inf (with a sink: O = 0, LSE = sink).
  // A NaN or +inf score (non-finite inputs) has made l NaN: O and LSE become NaN.
  const bool sink = p.learnable_sink != nullptr;
  const float sink_log2 = sink ? p.learnable_sink[h] * kLog2e : kNegInf;
  for (int64_t ir = 0; ir < nq; ++ir) {
    const float factor =
        sink ? fold_sink(sink_log2, &m[ir], &l[ir], [](float x) { return std::exp2(x); }) : 1.0f;
    const float inv = l[ir] == 0.0f ? 0.0f : factor * v_descale / l[ir];
    for (int64_t c = 0; c < dv; ++c) row[c] = ot[c * cols + ir];
    store_row(p.out_dtype, row, inv, dv,
              element_ptr(p.out, p.out_dtype, p.out_strides, b, seq.q_row0, i0 + ir, h));
  }
  if (p.lse != nullptr) {
    float* lse = p.lse + b * p.lse_batch_stride + h * p.lse_head_stride + seq.q_row0 + i0;
    for (int64_t ir = 0; ir < nq; ++ir) {
      lse[ir] = l[ir] == 0.0f ? kNegInf : (m[ir] + std::log2(l[ir])) * kLn2;
    }
  }
}

using ForwardItemFn = void (*)(const ForwardContext&, const ForwardItem&, float*);

void forward_item_generic(const ForwardContext& ctx, const ForwardItem& item, float* ws) {
  forward_item<GenericIsa>(ctx, item, ws);
}
#if FLASHATTN_CPU_X86
FLASHATTN_TARGET_AVX2 void forward_item_avx2(const ForwardContext& ctx, const ForwardItem& item,
                                             float* ws) {
  forward_item<Avx2Isa>(ctx, item, ws);
}
FLASHATTN_TARGET_AVX512 void forward_item_avx512(const ForwardContext& ctx, const ForwardItem& item,
                                                 float* ws) {
  forward_item<Avx512Isa>(ctx, item, ws);
}
#endif

ForwardItemFn select_forward_item() {
#if FLASHATTN_CPU_X86
  switch (cpu_isa()) {
    case CpuIsa::kAvx512:
      return forward_item_avx512;
    case CpuIsa::kAvx2:
      return forward_item_avx2;
    case CpuIsa::kGeneric:
      break;
  }
#endif
  return forward_item_generic;
}

// Varlen rows past cu_seqlens_q[batch] belong to no sequence: O = 0, LSE = -inf.
void clear_unused_rows(const ForwardParams& p) {
  if (!p.is_varlen()) return;
  const int64_t used = p.cu_seqlens_q[p.batch];
  for (int64_t r = used; r < p.total_q; ++r) {
    for (int64_t h = 0; h < p.heads; ++h) {
      zero_row(p.out_dtype, p.head_dim_v, element_ptr(p.out, p.out_dtype, p.out_strides, 0, 0, r, h));
      if (p.lse != nullptr) p.lse[h * p.lse_head_stride + r] = kNegInf;
    }
  }
}

Status run_forward(const ForwardParams& p) {
  // Items: heaviest first under a causal-like mask (later query blocks see more keys).
  std::vector<ForwardItem> items;
  for (int64_t b = 0; b < p.batch; ++b) {
    const Sequence seq = forward_sequence(p, b);
    const int64_t blocks = ceil_div(seq.len_q, kBlockQ);
    for (int64_t h = 0; h < p.heads; ++h) {
      for (int64_t qb = blocks - 1; qb >= 0; --qb) {
        items.push_back(
            {static_cast<int32_t>(b), static_cast<int32_t>(h), static_cast<int32_t>(qb)});
      }
    }
  }
  clear_unused_rows(p);
  if (items.empty()) return Status::Ok();

  const ForwardScratch scratch(p);
  const int threads = resolve_num_threads(p.num_threads);
  const int64_t count = static_cast<int64_t>(items.size());
  const int workers = parallel_workers(count, threads);
  ScratchBuffer buffer(scratch.size, workers);
  const BlockStates blocks(p);
  const ForwardContext ctx{&p, &scratch, &blocks};
  const ForwardItemFn fn = select_forward_item();
  auto body = [&](int64_t i, int worker) {
    fn(ctx, items[static_cast<size_t>(i)], buffer.worker(worker));
  };
  parallel_for(count, threads, ItemFunction(body));
  return Status::Ok();
}

}  // namespace
}  // namespace cpu

Status cpu_forward_kvcache(const ForwardParams& params) {
  try {
    std::vector<unsigned char> q_rot;
    ForwardParams attend;
    cpu::kvcache_prepare(params, &q_rot, &attend);
    return cpu::run_forward(attend);
  } catch (const std::bad_alloc&) {
    return Status::Internal("cpu forward_kvcache: out of memory while allocating scratch buffers");
  } catch (const std::exception& e) {
    return Status::Internal(std::string("cpu forward_kvcache: ") + e.what());
  }
}

Status cpu_forward(const ForwardParams& params) {
  try {
    return cpu::run_forward(params);
  } catch (const std::bad_alloc&) {
    return Status::Internal("cpu forward: out of memory while allocating scratch buffers");
  } catch (const std::exception& e) {
    return Status::Internal(std::string("cpu forward: ") + e.what());
  }
}

}  // namespace flashattn
