// FlashAttention-3-class forward kernel for Hopper (sm_90a): bulk tensor copies (TMA), warpgroup
// products (wgmma) and warp specialisation.
//
// One CTA per (query block, head, batch), 1 + kConsumers warpgroups:
//  - Warpgroup 0 produces: one thread loads the Q tile once and streams K and V tiles through a
//    ring of kStages slots, each slot with "full" barriers (the copy engine's bytes landed) and
//    "empty" barriers (every consumer warp is done reading). It keeps 24 registers.
//  - Each consumer warpgroup owns 64 query rows and takes the freed registers (setmaxnreg). Per
//    key block j (last to first, as the sm80 kernel):
//        issue S_j = Q K_j^T; issue O += P_{j+1} V_{j+1}; wait S_j; softmax(S_j) while the tensor
//        cores run P V; wait P V; rescale O; P_j = S_j in 16 bits
//    so the exponentials of one block overlap the P V product of the previous one
//    (FlashAttention-3's intra-warpgroup pipelining). P stays in registers as the A operand.
// Masks, block ranges and the lazy rescale are the sm80 kernel's (common/mask.h, the threshold
// in sm80/fwd_kernel.h); O is normalised once at the end and stored from the accumulators
// (store_tile). V and O are Traits::kHeadDimV wide (192 / 128: Q and K in three panels, V and
// O in two).
// Block-sparse (Traits::kSparse, a block mask): instead of the range [n_lo, n_hi) the producer
// walks the query tile's list of kept key tiles (cuda/block_tiles.h, descending, within the
// window's range) and passes each K tile's list entry (index, kind, last) to the consumers in a
// shared-memory slot of its stage, written before the stage's "full" arrival; so both sides visit
// the same tiles, absent tiles are never loaded, and the consumers need no global reads to walk.
// Clean tiles get no element check; mask and mixed tiles get hidden_in_tile (tile_kind.h) per
// score, after the modifiers, next to the window mask. A query tile with no kept key is stored as
// the fully-masked rows of the dense kernel (O 0, LSE -inf).
// Bias (Traits::kBias: attn_bias and/or attn_mask, no block mask): the producer copies the bias
// tile of each (query tile, key tile) with the K tile into the stage's bias slot, on the same
// "full" barrier; the consumers read it with ldmatrix (bias_words) while S = Q K^T runs, add it
// after scale / softcap / ALiBi (bias_scores) and free the stage after that. attn_mask comes
// packed into bits before the launch (mask_bits.h), one word per thread, row and key block,
// loaded while S runs (mask_bits_scores). attn_mask alone (Traits::kMaskOnly) runs the window
// kernel with those bits and no bias slot.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "core/params.h"
#include "core/sink.h"
#include "cuda/common/mask.h"
#include "cuda/common/score_tensors.h"
#include "cuda/common/seq_extent.h"
#include "cuda/common/smem_layout.h"
#include "cuda/ptx/cp_async.h"
#include "cuda/ptx/ldmatrix.h"
#include "cuda/ptx/math.h"
#include "cuda/ptx/mbarrier.h"
#include "cuda/ptx/tma.h"
#include "cuda/ptx/warpgroup.h"
#include "cuda/ptx/wgmma.h"
#include "cuda/sm90/bias_layout.h"
#include "cuda/sm90/fwd_traits.h"
#include "cuda/sm90/quad_transpose.h"
#include "cuda/sm90/tile_feed.h"

namespace flashattn::cuda::sm90 {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
// Lazy rescaling (FlashAttention-4): a row adopts a new maximum only when it exceeds the kept one
// by more than this many log2 units, so unnormalised P stays below 2^8 and most blocks skip the
// O rescale. Exact: the final normalisation uses the same kept maximum.
constexpr float kRescaleThreshold = 8.0f;

// Where the ring's barriers live and how a (stage, pass) maps to a parity.
struct Ring {
  uint64_t* q_full;   // [Q slots]
  uint64_t* k_full;   // [stages]
  uint64_t* v_full;   // [stages]
  uint64_t* k_empty;  // [stages]
  uint64_t* v_empty;  // [stages]
  uint64_t* q_empty;  // [Q slots]
};

// Row statistics and accumulators of one consumer thread: rows g and g + 8 of its warp's 16
// (h = 0, 1), in the accumulator order of an m64nN product (per 8-column chunk c: elements
// 4c + 2h + e at column 8c + 2t + e). O is head_dim_v (kHeadDimV) wide.
template <typename Traits>
struct ConsumerState {
  // Traits::kRowSumMma: four more, the P V product's columns of ones (the rows' sums).
  static constexpr int kORegs = Traits::kHeadDimV / 2 + (Traits::kRowSumMma ? 4 : 0);
  static constexpr int kSRegs = Traits::kBlockN / 2;
  float o[kORegs];
  float s[kSRegs];
  uint32_t p[kSRegs / 2];  // P in 16-bit pairs: p[i] = (s[2i], s[2i + 1])
  float row_max[2];
  float row_sum[2];
};

template <typename Traits>
__device__ __forceinline__ void gemm_qk(float (&s)[Traits::kBlockN / 2], uint64_t q_desc, uint64_t k_desc) {
  using Mma = ptx::Wgmma<Traits::kBlockN, typename Traits::Element>;
  ptx::wgmma_fence();
#pragma unroll
  for (int panel = 0; panel < Traits::kPanels; ++panel) {
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {  // four k16 steps of 32 bytes in each 128-byte row
      Mma::template ss<0>(s, ptx::desc_advance(q_desc, panel * Traits::kPanelBytesQ + kk * 32),
                          ptx::desc_advance(k_desc, panel * Traits::kPanelBytesKV + kk * 32),
                          (panel | kk) != 0 ? 1u : 0u);
    }
  }
  ptx::wgmma_commit();
}

template <typename Traits>
__device__ __forceinline__ void gemm_pv(float (&o)[ConsumerState<Traits>::kORegs], const uint32_t (&p)[Traits::kBlockN / 4],
                                        uint64_t v_desc, uint32_t accumulate = 1u) {
  using Mma = ptx::Wgmma<Traits::kHeadDimV + (Traits::kRowSumMma ? 8 : 0), typename Traits::Element>;
  ptx::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < Traits::kBlockN / 16; ++kk) {  // 16 keys = 16 rows of 128 bytes per step
    const uint32_t a[4] = {p[4 * kk], p[4 * kk + 1], p[4 * kk + 2], p[4 * kk + 3]};
    // accumulate = 0: the first step overwrites O (a tile's first P V product, cross-tile form).
    Mma::template rs<1>(o, a, ptx::desc_advance(v_desc, kk * 16 * Traits::kRowBytes), kk == 0 ? accumulate : 1u);
  }
  ptx::wgmma_commit();
}

// The score modifiers of FwdTraits::kMods, in the order of docs/SEMANTICS.md (scale, softcap,
// ALiBi; the mask after them), as the sm80 kernels apply them: the scores leave in log2 units.
struct ScoreMods90 {
  bool softcap;      // softcap > 0
  float scale_log2;  // without softcap
  float softcap_in;  // scale / softcap
  float softcap_out; // softcap * log2(e)
  float alibi_log2;  // ALiBi slope * log2(e); 0 when off
};

// Rows row and row + 8 (h = 0, 1) of this thread; columns key0 + 8c + e (key0 = block start + 2t).
template <typename Traits>
__device__ __forceinline__ void modify_scores(float (&s)[Traits::kBlockN / 2], const ScoreMods90& m,
                                              const WindowMask& mask, int row, int key0) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int diag = mask.diag(row + 8 * h);
#pragma unroll
    for (int c = 0; c < Traits::kBlockN / 8; ++c) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float& x = s[4 * c + 2 * h + e];
        x = m.softcap ? ptx::tanh_approx(x * m.softcap_in) * m.softcap_out : x * m.scale_log2;
        x -= m.alibi_log2 * fabsf(float(diag - (key0 + 8 * c + e)));
      }
    }
  }
}

// Traits::kBias. Why a copy through shared memory: each thread's 64 scores of a 128-key block
// (two rows, 16 pairs each) read straight from global memory are 32 4-byte loads per block whose
// L2 latency the consumer would wait for (or hold 32 registers across the S product to hide it,
// on top of O 64, S 64 and P 32 of 240), and the copy engine moves the tile with no thread's
// instructions: one bulk tensor copy per 64 keys, issued by the producer with the K tile, so
// the tile lands a block ahead, as K does. The slot holds kBlockM rows of 128-byte panels under
// the 128-byte swizzle (chunk c of row r at chunk c ^ (r % 8): the layout of the sm80 kernels'
// bias tile, score_tensors.h bias_smem_offset), so an 8 x 8 ldmatrix of 16-bit elements, one
// 16-byte chunk of 8 rows, hits 8 distinct 16-byte bank groups, and hands lane l the pair of
// row l / 4 at keys 2 (l % 4), +1: exactly the S accumulator's pairs. So a thread's 32 words
// take 8 ldmatrix.x4 per block instead of 32 shared loads. A bias broadcast over the rows is
// copied as one row (box of 1 row), read by every lane (the same address: no conflict). The
// addresses: bias_layout.h.
//
// The bias words of this thread's scores of the key tile in the slot at `slot` (shared address):
// b[2c + h] = the pair (keys 8c + 2t, +1) of row g + 8h, as s[4c + 2h + e] (ConsumerState).
template <typename Traits>
__device__ __forceinline__ void bias_words(uint32_t (&b)[Traits::kBlockN / 4], uint32_t slot, const BiasLane& bl) {
#pragma unroll
  for (int q = 0; q < Traits::kBlockN / 16; ++q) {  // chunks 2q, 2q + 1 of rows g, g + 8
    uint32_t r[4];
    ptx::ldmatrix_x4(r, slot + bias_step_offset(q, bl, Traits::kPanelBytesBias));
#pragma unroll
    for (int m = 0; m < 4; ++m) b[4 * q + m] = r[m];  // m = 2 (c - 2q) + h: word 2c + h
  }
}

// Traits::kBias: scale or softcap, ALiBi, then the bias (b: bias_words, 0 without attn_bias), in
// log2 units, the order of docs/SEMANTICS.md and of the sm80 kernels (the same expressions:
// x * scale_log2 or tanh, - slope |diag - j|, + float(bias) * log2(e)). Softcap and ALiBi under
// uniform branches, so the plain bias costs a multiply and a fused add per score.
template <typename Traits>
__device__ __forceinline__ void bias_scores(float (&s)[Traits::kBlockN / 2], const ScoreMods90& m,
                                            const WindowMask& mask, int row, int key0,
                                            const uint32_t (&b)[Traits::kBlockN / 4],
                                            bool add_bias = true) {
  if (m.softcap) {
#pragma unroll
    for (int i = 0; i < Traits::kBlockN / 2; ++i) s[i] = ptx::tanh_approx(s[i] * m.softcap_in) * m.softcap_out;
  } else {
#pragma unroll
    for (int i = 0; i < Traits::kBlockN / 2; ++i) s[i] *= m.scale_log2;
  }
  if (m.alibi_log2 != 0.0f) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int diag = mask.diag(row + 8 * h);
#pragma unroll
      for (int c = 0; c < Traits::kBlockN / 8; ++c) {
#pragma unroll
        for (int e = 0; e < 2; ++e) s[4 * c + 2 * h + e] -= m.alibi_log2 * fabsf(float(diag - (key0 + 8 * c + e)));
      }
    }
  }
  if (add_bias)  // false: no attn_bias (b holds nothing)
#pragma unroll
  for (int i = 0; i < Traits::kBlockN / 4; ++i) {
    const float2 x = bias_pair_log2<typename Traits::Element>(b[i]);
    s[2 * i] += x.x;
    s[2 * i + 1] += x.y;
  }
}

// attn_mask packed into bits (FwdParams::mask_bits, mask_bits.h), every mask: word t of a row's
// group of 128 keys holds exactly the keys of quad lane t's pairs, key 8c + 2t + e at bit
// 16e + c, so a thread loads one word per row and block (w[h]: row g + 8h), issued before the
// wait for S, and tests a constant bit per score: -inf where the bit is 0, as hidden_in_tile's
// kTileMask. Until 2026-12-03 a mask without attn_bias whose base and strides were 16-byte
// multiples came instead as a uint8 tile into the bias slot (the copy engine, 16-bit shared
// loads per score pair): the bits ran 7-17% faster at d128 and d64 8 x 2k, within 2% at d64 16k
// (dev/NOTES.md "attn_mask as bits on the Hopper forward").
template <typename Traits>
__device__ __forceinline__ void mask_bits_scores(float (&s)[Traits::kBlockN / 2], const uint32_t (&w)[2]) {
  // A 64-key block is half a group: read_mask_bits shifts its chunks to bits 0..7 of each half.
  static_assert(kMaskBitsGroupKeys % Traits::kBlockN == 0, "a key block is a group of bits or half of one");
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
#pragma unroll
      for (int c = 0; c < Traits::kBlockN / 8; ++c) {
        if (!mask_bits_keep(w[h], c, e)) s[4 * c + 2 * h + e] = -INFINITY;
      }
    }
  }
}

// -inf outside the rows' visible key intervals (only for blocks that straddle a boundary). Up to
// head_dim_v 128 each row's interval becomes one bit per chunk c (column 8c + e) for each element
// e, so a score costs a bit test (R2P, 7 predicates per instruction) and a select instead of two
// compares and a select: 54 fewer instructions per masked 128-key block (SASS). H200 bf16 against
// the compares, same session (dev/results/h200-2026-12-02-ab-s13-*.json): d128 causal +0.2-0.9%
// at 512-16k, unmasked rows (the key bound only) -1.3..0%. d192 and d256 keep the compares: with
// the bits ptxas spilled more in d256's key-block loop (12 local-memory instructions there, 4
// before), and neither was timed.
template <typename Traits>
__device__ __forceinline__ void apply_mask(float (&s)[Traits::kBlockN / 2], const WindowMask& mask, int row, int key0) {
  // Row row + 8h's visible keys [lo, hi), relative to key0.
  const auto interval = [&](int h, int* lo, int* hi) {
    mask.row_range(row + 8 * h, lo, hi);
    *lo -= key0;
    *hi -= key0;
  };
  if constexpr (Traits::kHeadDimV > 128) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      int lo, hi;
      interval(h, &lo, &hi);
#pragma unroll
      for (int c = 0; c < Traits::kBlockN / 8; ++c) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int col = 8 * c + e;  // relative to key0 = the block's first key + 2t
          if (col < lo || col >= hi) s[4 * c + 2 * h + e] = -INFINITY;
        }
      }
    }
  } else {
    constexpr int kChunks = Traits::kBlockN / 8;
    static_assert(kChunks <= 32, "one bit per chunk in a word");
    const auto below = [](int x, int e) {  // chunks c with 8c + e < x, as low bits
      const int k = min(max((x - e + 7) >> 3, 0), kChunks);
      return kChunks == 32 && k == 32 ? ~0u : (1u << k) - 1u;
    };
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      int lo, hi;
      interval(h, &lo, &hi);
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const uint32_t keep = below(hi, e) & ~below(lo, e);
#pragma unroll
        for (int c = 0; c < kChunks; ++c) {
          if (((keep >> c) & 1u) == 0u) s[4 * c + 2 * h + e] = -INFINITY;
        }
      }
    }
  }
}

// Whether key block n_block needs the element mask for a warpgroup's rows [row_begin, row_end):
// under a window mask when it straddles a row's visible interval, without one only when it
// runs past seqlen_k.
template <typename Traits>
__device__ __forceinline__ bool block_needs_mask(const WindowMask& mask, int seqlen_k, int row_begin, int row_end,
                                                 int n_block) {
  constexpr int kBlockN = Traits::kBlockN;
  return Traits::kMask == MaskMode::kWindow || (n_block + 1) * kBlockN > seqlen_k
             ? mask.block_needs_mask(row_begin, max(row_end, row_begin + 1), n_block * kBlockN, (n_block + 1) * kBlockN)
             : false;
}

// Online softmax of one block: updates the kept maxima and row sums, turns s into unnormalised
// P (in place) and returns the factors O must be multiplied by (1 when the maximum was kept).
template <typename Traits>
__device__ __forceinline__ bool softmax_block(ConsumerState<Traits>& st, float scale_log2, float (&correction)[2]) {
  constexpr int kChunks = Traits::kBlockN / 8;
  bool any_rescale = false;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float mx = st.row_max[h];
#pragma unroll
    for (int c = 0; c < kChunks; ++c) mx = fmaxf(mx, fmaxf(st.s[4 * c + 2 * h], st.s[4 * c + 2 * h + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float kept = st.row_max[h];
    // From -inf any finite maximum is adopted ((mx - -inf) = +inf); -inf stays (NaN > x is false).
    const bool adopt = (mx - kept) * scale_log2 > kRescaleThreshold;
    correction[h] = adopt ? ptx::exp2_approx((kept - mx) * scale_log2) : 1.0f;
    st.row_max[h] = adopt ? mx : kept;
    any_rescale |= adopt;
    // A row that has seen no visible key keeps -inf: subtract 0 so exp2(-inf - -inf) is no NaN.
    const float m_scaled = st.row_max[h] == -INFINITY ? 0.0f : st.row_max[h] * scale_log2;
    float sum = 0.0f;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float x = fmaf(st.s[4 * c + 2 * h + e], scale_log2, -m_scaled);
        const float p = ptx::exp2_approx(x);
        st.s[4 * c + 2 * h + e] = p;
        if constexpr (!Traits::kRowSumMma) sum += p;
      }
    }
    // kRowSumMma: the P V product sums the rows (and rescale_o rescales them with O).
    if constexpr (!Traits::kRowSumMma) st.row_sum[h] = st.row_sum[h] * correction[h] + sum;
  }
  return __any_sync(0xffffffffu, any_rescale);
}

template <typename Traits>
__device__ __forceinline__ void rescale_o(ConsumerState<Traits>& st, const float (&correction)[2]) {
#pragma unroll
  for (int c = 0; c < ConsumerState<Traits>::kORegs / 4; ++c) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      st.o[4 * c + 2 * h] *= correction[h];
      st.o[4 * c + 2 * h + 1] *= correction[h];
    }
  }
}

template <typename Traits>
__device__ __forceinline__ void convert_p(ConsumerState<Traits>& st) {
#pragma unroll
  for (int i = 0; i < Traits::kBlockN / 4; ++i) {
    st.p[i] = ptx::pack2<typename Traits::Element>(st.s[2 * i], st.s[2 * i + 1]);
  }
}

// Ping-pong between consumer warpgroups (FlashAttention-3): they take turns issuing their
// products, so one warpgroup's exponentials run while the tensor cores work for the next. Turn c
// belongs to warpgroup c, on named barrier kTurnBarrier0 + c over two warpgroups: the holder
// syncs on its own barrier, issues, then arrives on the next warpgroup's.
constexpr int kTurnBarrier0 = 1;

template <typename Traits>
struct Turns {
  int consumer;
  __device__ __forceinline__ void take() const {
    if constexpr (Traits::kPingPong) ptx::named_barrier_sync(kTurnBarrier0 + consumer, 256);
  }
  __device__ __forceinline__ void pass() const {
    if constexpr (Traits::kPingPong) {
      ptx::named_barrier_arrive(kTurnBarrier0 + (consumer + 1) % Traits::kConsumers, 256);
    }
  }
};

// One arrival per consumer warp frees a slot (the barriers count 4 * kConsumers).
__device__ __forceinline__ void release(uint64_t* bar, int lane) {
  if (lane == 0) ptx::mbarrier_arrive(bar);
}

// The key-block loop's second half (both loops below): this block's softmax while the previous
// block's P V product runs, then, that product done, its V stage freed, O rescaled and the new P
// packed. ptxas schedules the wait for P V as early as it can: right after the first maxima,
// before every exponential (SASS: WARPGROUP.DEPBAR.LE gsb0, 0x0 then 88 MUFU.EX2 at d128), so the
// softmax would never overlap its own P V product. It keeps the wait after a shared-memory store,
// so one lane per warp stores the row sums (which need every exponential) to a slot nobody reads
// (Traits::kPinSoftmax, pin_slot).
template <typename Traits>
__device__ __forceinline__ void softmax_under_pv(ConsumerState<Traits>& st, float scale_log2, uint32_t pin_slot,
                                                 int lane, uint64_t* v_empty) {
  float correction[2];
  const bool rescale = softmax_block<Traits>(st, scale_log2, correction);
  if constexpr (Traits::kPinSoftmax) {
    if (lane == 0) ptx::st_shared_f32(pin_slot, st.row_sum[0] + st.row_sum[1]);
  }
  ptx::wgmma_wait<0>();
  ptx::fence_operand(st.o);
  ptx::fence_operand(st.p);
  release(v_empty, lane);
  if (rescale) rescale_o(st, correction);
  convert_p(st);
}

// Epilogue of one tile: finish the row sums across the quad, normalise, write LSE and O straight
// from the accumulators, 64 contiguous bytes of a row per quad and store. No shared memory: the
// next tile's Q may already be landing in the Q buffer. (s34: the stores deferred under the next
// tile's first Q K^T product measured no faster than two Q slots alone on the H200: dev/NOTES.md,
// "Hopper forward: short sequences".)
template <typename Traits, typename TileWork>
__device__ __forceinline__ void store_tile(const ForwardParams& params, const TileWork& w, ConsumerState<Traits>& st,
                                           int row_in_tile, int t4, float scale_log2) {
  using Element = typename Traits::Element;
  const int64_t lse_base =
      w.batch * params.lse_batch_stride + int64_t(w.head) * params.lse_head_stride + w.row0_q + w.m0;
  char* gO = static_cast<char*>(params.out) +
             sizeof(Element) * (w.batch * params.out_strides.batch + (w.row0_q + w.m0) * params.out_strides.row +
                                int64_t(w.head) * params.out_strides.head);
  const int64_t o_row_bytes = sizeof(Element) * params.out_strides.row;
  const float sink_log2 = params.learnable_sink != nullptr ? params.learnable_sink[w.head] * kLog2e : -INFINITY;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float l;
    if constexpr (Traits::kRowSumMma) {
      l = st.o[Traits::kHeadDimV / 2 + 2 * h];  // the ones columns: the whole row's sum in every lane
    } else {
      l = st.row_sum[h];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
    }
    // The kept maximum in log2 units; __fmul_rn keeps it one rounding, so a sink of -inf leaves
    // the LSE bitwise unchanged. The learnable sink joins the row here (core/sink.h).
    float m_log2 = __fmul_rn(st.row_max[h], scale_log2);
    const float o_factor = fold_sink(sink_log2, &m_log2, &l, [](float x) { return ptx::exp2_approx(x); });
    const bool empty = l == 0.0f;  // no visible key and no sink; a NaN sum stays NaN
    // 1/l as one MUFU.RCP (__fdividef: within 2 ulp of f32, far under O's 16-bit rounding) instead
    // of the IEEE division's refinement and slow-path branch: 128 fewer SASS instructions in the
    // d128 short kernel; d128 +2.6 / +3.8% at 512 / 1k (both passes up; causal 2k +0.7 / -2.4%),
    // d64 causal 512 +1.9% (dev/results/h200-2026-12-04-s33-short-ab1-b50349e.json). l here is 0
    // (empty, not divided), NaN, or >= ~1 (the row maximum's own term, or the visible sink's, is
    // ~1; every term is at most 2^8 by the lazy rescale) and so far below the 2^126 above which
    // __fdividef returns 0, as long as |row_max * scale_log2| < 2^24 (beyond it the maximum's term
    // carries that product's rounding error: raw scores of ~1e10 at d64).
    const float inv = empty ? 0.0f : __fdividef(o_factor, l);
    const int r = row_in_tile + 8 * h;
    // Each quad holds 4 bytes of every 16-byte chunk of its row; transposed across the quad
    // (outside the row test: every lane shuffles), a thread holds whole chunks, so a warp's
    // store writes 64 contiguous bytes of each of its 8 rows instead of 16 (measured: fwd_traits.h,
    // "O stored in whole 16-byte chunks").
    constexpr int kGroups = Traits::kHeadDimV / 32;
    uint4 chunk[kGroups];
#pragma unroll
    for (int q = 0; q < kGroups; ++q) {
      uint32_t x[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int c = 4 * q + j;
        x[j] = ptx::pack2<Element>(st.o[4 * c + 2 * h] * inv, st.o[4 * c + 2 * h + 1] * inv);
      }
      chunk[q] = quad_transpose(x, t4);
    }
    if (r < w.rows_here) {
      if (params.lse != nullptr && t4 == 0) params.lse[lse_base + r] = empty ? -INFINITY : (m_log2 + __log2f(l)) * kLn2;
      char* dst = gO + r * o_row_bytes + 16 * t4;
#pragma unroll
      for (int q = 0; q < kGroups; ++q) *reinterpret_cast<uint4*>(dst + 64 * q) = chunk[q];
    }
  }
}

// One tile of the persistent loop: a query block of one (head, batch), with its sequence's extent
// and the key blocks [n_lo, n_hi) it visits (last to first).
struct TileWork {
  int m_block, head, batch;
  int64_t row0_q, row0_k;
  int seqlen_q, seqlen_k;
  int m0, rows_here;
  int n_lo, n_hi;
  __device__ __forceinline__ bool exists() const { return m0 < seqlen_q; }
  __device__ __forceinline__ bool has_keys() const { return n_hi > n_lo; }
};

template <typename Traits>
__device__ __forceinline__ TileWork tile_work(const ForwardParams& params, const TileOrder& order, int t) {
  TileWork w;
  const TileCoord c = order.at(t);
  w.m_block = c.m_block;
  order.head_batch(c.plane, &w.head, &w.batch);
  if constexpr (Traits::kCache) {
    if (params.cache_tiles != nullptr) {
      // A varlen call's list (cache_tiles.h): "batch" w.batch is pair w.batch of the device's
      // list (one query block per plane); planes past its count are empty tiles, returned
      // without their sequence's extent (no load but the count's).
      const int2* list = reinterpret_cast<const int2*>(params.cache_tiles);
      if (w.batch >= list[0].x) {
        w.m_block = w.batch = 0;
        w.row0_q = w.row0_k = 0;
        w.seqlen_q = w.seqlen_k = w.m0 = w.rows_here = w.n_lo = w.n_hi = 0;
        return w;
      }
      const int2 pair = list[1 + w.batch];
      w.batch = pair.x;
      w.m_block = pair.y;
    }
  }
  const SeqExtent e = Traits::kCache ? cache_seq_extent(params, w.batch) : seq_extent(params, w.batch);
  w.row0_q = e.row0_q;
  w.row0_k = e.row0_k;
  w.seqlen_q = e.seqlen_q;
  w.seqlen_k = e.seqlen_k;
  w.m0 = w.m_block * Traits::kBlockM;
  w.rows_here = min(Traits::kBlockM, w.seqlen_q - w.m0);
  w.n_lo = 0;
  w.n_hi = (w.seqlen_k + Traits::kBlockN - 1) / Traits::kBlockN;
  if constexpr (Traits::kMask == MaskMode::kWindow) {
    if (w.exists()) {
      make_window_mask<true>(w.seqlen_q, w.seqlen_k, params.window_left, params.window_right)
          .block_range(w.m0, w.m0 + w.rows_here, Traits::kBlockN, &w.n_lo, &w.n_hi);
    }
  }
  return w;
}

// The dynamic tile feed (FwdTraits::kDynamicTiles, masked launches): tile_feed.h.
//
// Traits::kSparse: after the feed's slots, its two "has keys" flags (the tile's list has a key
// tile in the window's range; published with the tile, since the consumers cannot tell from the
// tile alone) and per K/V stage the list entry of the K tile in it (tile index, kind << 24,
// kLastEntry on the query tile's last one).
struct SparseSlots {
  int* has_keys;  // [2], with the feed's slots
  int* entry;     // [kStages], with the K stages
};
constexpr int kLastEntry = 1 << 30;

__device__ __forceinline__ void publish_tile(const TileFeed& feed, const SparseSlots& sparse, int k, int tile,
                                             bool has_keys) {
  const int s = k & 1;
  ptx::mbarrier_wait(&feed.empty[s], ((k >> 1) & 1) ^ 1);
  feed.slot[s] = tile;
  sparse.has_keys[s] = has_keys ? 1 : 0;
  ptx::mbarrier_arrive(&feed.full[s]);
}

__device__ __forceinline__ int take_tile(const TileFeed& feed, const SparseSlots& sparse, int k, int lane,
                                         bool* has_keys) {
  const int s = k & 1;
  ptx::mbarrier_wait(&feed.full[s], (k >> 1) & 1);
  const int tile = int(uniform_word(&feed.slot[s], lane));
  *has_keys = uniform_word(&sparse.has_keys[s], lane) != 0;
  if (lane == 0) ptx::mbarrier_arrive(&feed.empty[s]);
  return tile;
}

// The list entry of the K tile in `stage` (uniform, as the tile in take_tile), after its "full"
// barrier.
__device__ __forceinline__ int sparse_entry(const SparseSlots& sparse, int stage, int lane) {
  return int(uniform_word(&sparse.entry[stage], lane));
}

// The copy engine's load of tile w's Q into slot q_pass % kQSlots once the consumers have freed
// it (map_batch: the tensor map's batch coordinate, 0 for varlen's packed rows).
template <typename Traits>
__device__ __forceinline__ void load_q_tile(const FwdParams& kp, const Ring& ring, unsigned char* sQ,
                                            const TileWork& w, int q_pass, int map_batch) {
  constexpr int kQ = Traits::kQSlots;
  const int slot = q_pass % kQ;
  ptx::mbarrier_wait(&ring.q_empty[slot], ((q_pass / kQ) & 1) ^ 1);
  ptx::mbarrier_arrive_expect_tx(&ring.q_full[slot], Traits::kTileBytesQ);
#pragma unroll
  for (int panel = 0; panel < Traits::kPanels; ++panel) {
    ptx::tma_load_4d(sQ + slot * Traits::kTileBytesQ + panel * Traits::kPanelBytesQ, &kp.q, &ring.q_full[slot],
                     64 * panel, int(w.row0_q) + w.m0, w.head, map_batch);
  }
}

// The loads of one tile's key blocks [n_lo, n_hi), last to first, K one block ahead of V (the
// order the consumers use them in: S_j is issued with P_{j+1} V_{j+1}), with the tile's Q first
// (kQFirst) or after the first K; `it` counts K/V tiles across the CTA's tiles (the ring's slots).
template <bool kQFirst, typename LoadK, typename LoadV, typename LoadQ>
__device__ __forceinline__ void load_tile_blocks(const TileWork& w, int& it, LoadK&& load_k, LoadV&& load_v,
                                                 LoadQ&& load_q) {
  if constexpr (kQFirst) load_q();
  load_k(w.n_hi - 1, it);
  if constexpr (!kQFirst) load_q();
#pragma unroll 1
  for (int n_block = w.n_hi - 2; n_block >= w.n_lo; --n_block, ++it) {
    load_k(n_block, it + 1);
    load_v(n_block + 1, it);
  }
  load_v(w.n_lo, it);
  ++it;
}

// Traits::kCache (FwdCacheTraits): the producer warpgroup of the cache kernel. K and V live in a
// KV cache whose rows the copy engine cannot find by itself (a block table maps each page_size
// rows of a sequence to a page of the pool; a dense cache has a leftpad and cache_batch_idx per
// sequence), so all 128 threads of warpgroup 0 copy them with cp.async into the stages the copy
// engine would fill, each 16-byte chunk where its 128-byte swizzle puts it (SwizzledPanels: the
// layout the consumers' descriptors read). Eight lanes take the eight chunks of one 128-byte
// panel row, so each cp.async of a warp moves four whole rows of 128 bytes (whole 32-byte
// sectors; a row per lane would fetch every sector twice from L2); the sixteen 8-lane groups of
// the warpgroup take rows g, g + 16, ... of the tile, all their panels. Each row is found in the
// cache once (kv.row_offset: a block-table word, the page clamped into the pool) by one lane of
// its warp (lane 4q + j: row 16q + 4w + j of warp w) and passed to its group by shuffle. Keys
// past the sequence's end are zero-filled (src-size 0): a cache row outside [first, end) may
// hold anything, NaN included, and P V would turn 0 x NaN into NaN. Each thread then arrives on
// the stage's full barrier once its own copies have landed (cp.async.mbarrier.arrive.noinc; the
// barriers expect 128 arrivals, FwdTraits kKvArrivals), so no thread waits for its copies and the
// ring runs as with the copy engine. Q still comes by the copy engine, issued by thread 0. The
// tiles are the consumers' fixed rounds (TileOrder::cta_tile; the tile feed under
// FLASHATTN_DEV_SM90_CACHE_FEED), loaded in the other kernels' order (K one block ahead of V).
template <typename Traits>
__device__ __forceinline__ void cache_producer(const FwdParams& kp, const Ring& ring, const TileFeed& feed,
                                               unsigned char* sQ, unsigned char* sK, unsigned char* sV) {
  using Element = typename Traits::Element;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kStages = Traits::kStages;
  constexpr int kRowsPerGroup = kBlockN / 16;  // rows of a tile per 8-lane group
  using Layout = SwizzledPanels<Traits::kHeadDim, kBlockN>;
  static_assert(Layout::kPanelBytes == Traits::kPanelBytesKV && Traits::kVStageBytes == Traits::kTileBytesV &&
                    Traits::kPanelsV == Traits::kPanels,
                "the copies' layout is the ring's");
  static_assert(kBlockN % 16 == 0 && kBlockN / 4 <= 32, "a warp's rows of a tile have a lane each to look them up");
  const ForwardParams& params = kp.p;
  const KVCacheParams& kv = params.kv;
  const TileOrder order = kp.order;
  const int group = params.heads / params.heads_k;
  const int tid = threadIdx.x;
  const int lane = tid % 32;
  const int chunk = cache_copy_chunk(tid);  // fwd_tile.h: the copies' plan
  const int lookup_row = cache_lookup_row(lane, tid / 32);
  static_assert(cache_copy_row(0, 1) - cache_copy_row(0, 0) == 16, "a thread's rows 16 apart: one swizzle phase");
  const uint32_t dst_chunk = Layout::offset(cache_copy_row(tid, 0), 8 * chunk);
  const int map_batch_varlen = params.is_varlen();
  if (tid == 0) ptx::tma_prefetch_map(&kp.q);
  int it = 0;      // K/V tiles issued so far, across tiles: slot it % kStages, pass it / kStages
  int q_pass = 0;  // Q tiles issued so far (by thread 0)
#pragma unroll 1
  for (int k = 0;; ++k) {
    int t;
    if constexpr (Traits::kDynamicTiles) {
      // FLASHATTN_DEV_SM90_CACHE_FEED (fwd_traits.h): thread 0 takes the next tile from the
      // counter and publishes it as the other producers do; every producer warp then reads it
      // from the feed like a consumer warp (the feed's empty barriers count them).
      if (tid == 0) {
        publish_tile(feed, k, k == 0 ? int(blockIdx.x)
                                     : int(__reduce_max_sync(1u, unsigned(atomicAdd(kp.tile_counter, 1)))) +
                                           int(gridDim.x));
      }
      t = take_tile(feed, k, lane);
    } else {
      t = order.cta_tile(k, blockIdx.x, gridDim.x);
    }
    if (t >= order.tiles) break;
    const TileWork w = tile_work<Traits>(params, order, t);
    if (!w.exists() || !w.has_keys()) continue;
    const int64_t head_k = w.head / group;
    // Key block n_block of `cache` (strides in elements: batch = the page stride when paged) into
    // `stage` of a ring whose stages are `stage_bytes` apart.
    const auto copy_tile = [&](unsigned char* ring_base, int stage_bytes, const void* cache, const Strides3& strides,
                               int n_block, int index, uint64_t* full, uint64_t* empty) {
      const int stage = index % kStages;
      // The row's lookup (a block-table word: a dependent L2 or HBM load) goes out before the
      // wait for the stage: it needs nothing of the ring, so its latency hides under the wait
      // instead of following it on the way to the copies (s41, not yet measured).
      const int key0 = n_block * kBlockN;
      int64_t found = 0;
      if (lane < kBlockN / 4 && key0 + lookup_row < w.seqlen_k) {
        found = kv.row_offset(strides, w.batch, w.row0_k + key0 + lookup_row) + head_k * strides.head;
      }
      ptx::mbarrier_wait(&empty[stage], ((index / kStages) & 1) ^ 1);
      const Element* base = static_cast<const Element*>(cache);
      // This thread's rows are 16 apart, so they share the swizzle's row phase (row % 8) and its
      // chunk's place in every row: one address plus constant steps of 16 rows and one panel
      // (spelled out, ptxas kept all sixteen addresses live across the tile loop and spilled).
      const uint32_t dst = ptx::smem_u32(ring_base + stage * stage_bytes) + dst_chunk;
#pragma unroll
      for (int q = 0; q < kRowsPerGroup; ++q) {
        const int64_t offset = __shfl_sync(0xffffffffu, found, cache_lookup_lane(tid, q));
        const bool valid = key0 + cache_copy_row(tid, q) < w.seqlen_k;
        const Element* src = base + (valid ? offset : 0) + 8 * chunk;
#pragma unroll
        for (int panel = 0; panel < Traits::kPanels; ++panel) {
          ptx::cp_async_16(dst + uint32_t(q * 16 * 128 + panel * Layout::kPanelBytes), src + 64 * panel, valid);
        }
      }
#if defined(FLASHATTN_DEV_SM90_CACHE_FENCE)
      // dev/ fallback (dev/NOTES.md "The sm90 cache kernel"): the writer-side proxy fence of
      // generic shared-memory writes read by the async proxy (wgmma), after this thread's copies
      // have landed, then a plain arrival (the barrier's count is the same 128).
      ptx::cp_async_commit();
      ptx::cp_async_wait<0>();
      ptx::fence_proxy_async_smem();
      ptx::mbarrier_arrive(&full[stage]);
#else
      ptx::cp_async_mbarrier_arrive_noinc(&full[stage]);
#endif
    };
    const auto load_k = [&](int n_block, int index) {
      copy_tile(sK, Traits::kTileBytesK, params.k, params.k_strides, n_block, index, ring.k_full, ring.k_empty);
    };
    const auto load_v = [&](int n_block, int index) {
      copy_tile(sV, Traits::kTileBytesV, params.v, params.v_strides, n_block, index, ring.v_full, ring.v_empty);
    };
    const auto load_q = [&] {
      if (tid == 0) load_q_tile<Traits>(kp, ring, sQ, w, q_pass, map_batch_varlen ? 0 : w.batch);
      ++q_pass;
    };
    load_tile_blocks<false>(w, it, load_k, load_v, load_q);
  }
  // The last tile's copies may still be in flight (their arrivals pending): the CTA lives on
  // while the consumers wait for them, but the PTX ISA does not say that a thread may exit with
  // cp.async outstanding, so each thread waits for its own before it leaves (once per CTA).
  ptx::cp_async_commit();
  ptx::cp_async_wait<0>();
}

// Persistent: one CTA per SM. Each CTA walks its tiles of TileOrder, in fixed rounds
// (TileOrder::cta_tile) without a mask or from the tile feed with one (FwdTraits::kDynamicTiles).
// The producer and the consumers walk the same tiles and count the K/V ring's slots across them,
// so the producer loads the next tile's Q and first K/V tiles while the consumers finish this one.
#if defined(FLASHATTN_DEV_FWD_TRACE)
// dev/ probe (dev/fwd_trace.py): thread 0 of each consumer warpgroup of the plain key-block loop
// (not the cross-tile one) stamps clock64 per tile: tile begun (its work fetched under the
// previous tile's last P V), Q landed, the first S done, its P ready, then S done and P ready
// for each of the next kFwdTraceBlocks blocks, the last P V done and O stored, into g_fwd_trace (zeroed by run_fwd before each launch); run_fwd launches
// fwd_trace_print_kernel after the forward when FLASHATTN_DEV_FWD_TRACE_PRINT is set. Not a
// shipped configuration: a build with the macro holds ~8 MB of static device memory per kernel
// file.
constexpr int kFwdTraceCtas = 264, kFwdTraceWgs = 3, kFwdTraceTiles = 64, kFwdTraceBlocks = 7;
constexpr int kFwdTraceStamps = 4 + 2 * kFwdTraceBlocks + 2;
static __device__ long long g_fwd_trace[kFwdTraceCtas][kFwdTraceWgs][kFwdTraceTiles][kFwdTraceStamps];
static __device__ int g_fwd_trace_tile[kFwdTraceCtas][kFwdTraceWgs][kFwdTraceTiles][2];  // tile, key blocks
static __device__ int g_fwd_trace_cta[kFwdTraceCtas][kFwdTraceWgs][2];  // SM, tiles stamped
// Prints the stamps the last forward of this kernel file left (thread w: consumer w of CTA
// blockIdx.x), relative to each tile's first, -1 where not reached (a block past
// kFwdTraceBlocks, or past the tile's last), then forgets them. A kernel of its own: a printf in
// the forward kernel made ptxas serialise its wgmma products (C7510).
template <int kConsumers>
__global__ void fwd_trace_print_kernel() {
  const int cta = blockIdx.x, wg = threadIdx.x;
  if (wg >= kConsumers) return;
  int* info = g_fwd_trace_cta[cta][wg];
  const int tiles = min(info[1], kFwdTraceTiles);
  for (int k = 0; k < tiles; ++k) {
    const long long* c = g_fwd_trace[cta][wg][k];
    const long long t0 = c[0];
    if (t0 == 0) continue;  // a tile that did not exist
    const auto rel = [&](int i) { return c[i] == 0 ? -1LL : c[i] - t0; };
    printf("fwd_trace sm %d cta %d wg %d k %d tile %d nb %d t0 %lld q %lld s0 %lld p0 %lld"
           " b %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld pv %lld st %lld\n",
           info[0], cta, wg, k, g_fwd_trace_tile[cta][wg][k][0], g_fwd_trace_tile[cta][wg][k][1], t0, rel(1), rel(2),
           rel(3), rel(4), rel(5), rel(6), rel(7), rel(8), rel(9), rel(10), rel(11), rel(12), rel(13), rel(14), rel(15),
           rel(16), rel(17), rel(18), rel(19));
  }
  info[1] = 0;
}
#define FLASHATTN_FWD_TRACE(k, i)                                                                          \
  if (trace_thread && blockIdx.x < kFwdTraceCtas && (k) < kFwdTraceTiles && (i) < kFwdTraceStamps) \
    g_fwd_trace[blockIdx.x][consumer][k][i] = clock64();
#else
#define FLASHATTN_FWD_TRACE(k, i)
#endif

template <typename Traits>
__global__ void __launch_bounds__(Traits::kThreads, Traits::kCtasPerSm) fwd_kernel(const __grid_constant__ FwdParams kp) {
  using Element = typename Traits::Element;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kStages = Traits::kStages;
  const ForwardParams& params = kp.p;

  extern __shared__ unsigned char smem_raw[];
  // The 128-byte swizzle repeats every 1024 bytes and is applied to absolute addresses.
  unsigned char* smem = ptx::align_shared<1024>(smem_raw);
  unsigned char* sQ = smem;                                // kPanels x (kBlockM rows)
  unsigned char* sK = sQ + Traits::kQSlots * Traits::kTileBytesQ;  // kStages x kPanels x (kBlockN rows)
  unsigned char* sV = sK + kStages * Traits::kTileBytesK;  // kStages x kPanelsV x (kBlockN rows)
  constexpr int kVStage = Traits::kVStageBytes;  // kOnesPerStage: each stage's V, then its ones panel
  // kRowSumMma: the panel of ones after V (Traits::kOnesBytes, else 0).
  [[maybe_unused]] unsigned char* sOnes = sV + kStages * kVStage;
  // kBias: kStages bias slots after V (Traits::kTileBytesBias is 0 for the other kernels).
  [[maybe_unused]] unsigned char* sBias = sOnes + Traits::kOnesBytes;
  uint64_t* bars = reinterpret_cast<uint64_t*>(sBias + kStages * Traits::kTileBytesBias);
  constexpr int kQ = Traits::kQSlots;
  const Ring ring{bars, bars + kQ, bars + kQ + kStages, bars + kQ + 2 * kStages, bars + kQ + 3 * kStages,
                  bars + kQ + 4 * kStages};
  // Only with kDynamicTiles (kBarriers counts them).
  const TileFeed feed{reinterpret_cast<int*>(bars + 2 * kQ + 4 + 4 * kStages), bars + 2 * kQ + 4 * kStages,
                      bars + 2 * kQ + 2 + 4 * kStages};
  // Only with kSparse (kBarriers counts them).
  [[maybe_unused]] const SparseSlots sparse{reinterpret_cast<int*>(bars + 2 * kQ + 5 + 4 * kStages),
                                            reinterpret_cast<int*>(bars + 2 * kQ + 5 + 4 * kStages) + 2};

  const int warpgroup = threadIdx.x / 128;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const TileOrder order = kp.order;
  const int group = params.heads / params.heads_k;
  const int map_batch_varlen = params.is_varlen();

  if (threadIdx.x == 0) {
    for (int s = 0; s < kQ; ++s) {
      ptx::mbarrier_init(&ring.q_full[s], 1);
      ptx::mbarrier_init(&ring.q_empty[s], 4 * Traits::kConsumers);
    }
    for (int s = 0; s < kStages; ++s) {
      ptx::mbarrier_init(&ring.k_full[s], Traits::kKvArrivals);
      ptx::mbarrier_init(&ring.v_full[s], Traits::kKvArrivals);
      ptx::mbarrier_init(&ring.k_empty[s], 4 * Traits::kConsumers);
      ptx::mbarrier_init(&ring.v_empty[s], 4 * Traits::kConsumers);
    }
    if constexpr (Traits::kDynamicTiles) {
      for (int s = 0; s < 2; ++s) {
        ptx::mbarrier_init(&feed.full[s], 1);
        // kCache: the producer's four warps read the feed too (cache_producer).
        ptx::mbarrier_init(&feed.empty[s], 4 * Traits::kConsumers + (Traits::kCache ? 4 : 0));
      }
    }
    ptx::mbarrier_init_fence();
  }
  if constexpr (Traits::kRowSumMma) {
    // The ones panels (every element 1, so the swizzle does not matter), for the products' async proxy.
    const uint32_t one = ptx::pack2<Element>(1.0f, 1.0f);
    if constexpr (Traits::kOnesPerStage) {
      constexpr int kChunks = Traits::kPanelBytesKV / 16;
      for (int i = threadIdx.x; i < kStages * kChunks; i += Traits::kThreads) {
        reinterpret_cast<uint4*>(sV + (i / kChunks) * kVStage + Traits::kTileBytesV)[i % kChunks] =
            make_uint4(one, one, one, one);
      }
    } else {
      for (int i = threadIdx.x; i < Traits::kOnesBytes / 16; i += Traits::kThreads) {
        reinterpret_cast<uint4*>(sOnes)[i] = make_uint4(one, one, one, one);
      }
    }
    ptx::fence_proxy_async_smem();
  }
  __syncthreads();

  if (warpgroup == 0) {
    ptx::warpgroup_reg_dealloc<Traits::kProducerRegs>();
    if constexpr (Traits::kCache) {
      cache_producer<Traits>(kp, ring, feed, sQ, sK, sV);
      return;
    }
    if (warp != 0 || lane != 0) return;
    ptx::tma_prefetch_map(&kp.q);
    ptx::tma_prefetch_map(&kp.k);
    ptx::tma_prefetch_map(&kp.v);
    if constexpr (Traits::kBias) {
      if (params.bias.defined()) ptx::tma_prefetch_map(&kp.bias);
    }
    int it = 0;      // K/V tiles issued so far, across tiles: slot it % kStages, pass it / kStages
    int q_pass = 0;  // Q tiles issued so far
    for (int k = 0;; ++k) {  // the CTA's k-th tile
      int t;
      if constexpr (Traits::kDynamicTiles) {
        // Uniform register (redux.sync over the one producer lane), as in take_tile.
        t = k == 0 ? int(blockIdx.x)
                   : int(__reduce_max_sync(1u, unsigned(atomicAdd(kp.tile_counter, 1)))) + int(gridDim.x);
        // kSparse publishes below, with whether the tile's list has a key tile.
        if constexpr (!Traits::kSparse) publish_tile(feed, k, t);
      } else {
        t = order.cta_tile(k, blockIdx.x, gridDim.x);
      }
      if (t >= order.tiles) {
        if constexpr (Traits::kSparse) publish_tile(feed, sparse, k, t, false);
        break;
      }
      const TileWork w = tile_work<Traits>(params, order, t);
      // kSparse: the query tile's list (block_tiles.h) from its first entry below n_hi (the
      // sequence's or the window's end; the list is built over the longest sequence), walked
      // while the entries stay at or above n_lo. The common case (first entry below n_hi) takes
      // one read instead of the binary search.
      [[maybe_unused]] const int32_t* entry_ptr = nullptr;
      [[maybe_unused]] const int32_t* entry_end = nullptr;
      [[maybe_unused]] int32_t entry = 0;
      if constexpr (Traits::kSparse) {
        bool any = false;
        if (w.exists() && w.has_keys()) {
          const BlockTilePlan& plan = params.block_tiles;
          const int32_t* list = plan.lists + (plan.plane(w.batch, w.head, params.heads) * plan.m_tiles + w.m_block) *
                                                 int64_t(plan.n_tiles + 1);
          const int count = __ldg(list);
          entry_ptr = list + 1;
          entry_end = entry_ptr + count;
          if (count > 0 && (__ldg(entry_ptr) & kTileIndexMask) >= w.n_hi) {
            const int32_t* entries = entry_ptr;
            entry_ptr = entries + first_tile_below(count, w.n_hi, [&](int e) { return __ldg(entries + e); });
          }
          if (entry_ptr != entry_end) {
            entry = __ldg(entry_ptr++);
            any = (entry & kTileIndexMask) >= w.n_lo;
          }
        }
        publish_tile(feed, sparse, k, t, any);
        if (!any) continue;
      }
      if (!w.exists() || !w.has_keys()) continue;
      // Tensor-map coordinates: dense operands are (dim, position, head, batch); varlen ones are
      // one batch entry of packed tokens.
      const int map_batch = map_batch_varlen ? 0 : w.batch;
      const int head_k = w.head / group;
      const auto load_k = [&](int n_block, int index, int list_entry = 0) {
        const int stage = index % kStages;
        ptx::mbarrier_wait(&ring.k_empty[stage], ((index / kStages) & 1) ^ 1);
        // Released to the consumers by the arrival below; read by them before they free the stage.
        if constexpr (Traits::kSparse) sparse.entry[stage] = list_entry;
        if constexpr (Traits::kBias) {
          // The bias tile of (this query tile, key tile n_block) on the K tile's barrier. Rows and
          // keys are positions in the sequence (varlen too); a broadcast dimension has extent 1.
          // Recomputed from the parameters (constant memory) per tile: the producer's 24 registers
          // spilled with one more value live across its loop.
          const int bias_bytes = !params.bias.defined() ? 0
                                 : params.bias.row == 0 ? Traits::kBiasPanels * Traits::kRowBytes
                                                        : Traits::kTileBytesBias;
          ptx::mbarrier_arrive_expect_tx(&ring.k_full[stage], Traits::kTileBytesK + bias_bytes);
          if (bias_bytes != 0) {
            const ForwardParams& pb = params;
#pragma unroll
            for (int panel = 0; panel < Traits::kBiasPanels; ++panel) {
              ptx::tma_load_4d(sBias + stage * Traits::kTileBytesBias + panel * Traits::kPanelBytesBias, &kp.bias,
                               &ring.k_full[stage], n_block * kBlockN + 64 * panel, pb.bias.row == 0 ? 0 : w.m0,
                               pb.bias.head == 0 ? 0 : w.head, pb.bias.batch == 0 ? 0 : w.batch);
            }
          }
        } else {
          ptx::mbarrier_arrive_expect_tx(&ring.k_full[stage], Traits::kTileBytesK);
        }
#pragma unroll
        for (int panel = 0; panel < Traits::kPanels; ++panel) {
          ptx::tma_load_4d(sK + stage * Traits::kTileBytesK + panel * Traits::kPanelBytesKV, &kp.k,
                           &ring.k_full[stage], 64 * panel, int(w.row0_k) + n_block * kBlockN, head_k, map_batch);
        }
      };
      const auto load_v = [&](int n_block, int index) {
        const int stage = index % kStages;
        ptx::mbarrier_wait(&ring.v_empty[stage], ((index / kStages) & 1) ^ 1);
        ptx::mbarrier_arrive_expect_tx(&ring.v_full[stage], Traits::kTileBytesV);
#pragma unroll
        for (int panel = 0; panel < Traits::kPanelsV; ++panel) {
          ptx::tma_load_4d(sV + stage * kVStage + panel * Traits::kPanelBytesKV, &kp.v,
                           &ring.v_full[stage], 64 * panel, int(w.row0_k) + n_block * kBlockN, head_k, map_batch);
        }
      };
      const auto load_q = [&] {
        load_q_tile<Traits>(kp, ring, sQ, w, q_pass, map_batch);
        ++q_pass;
      };
      // K runs one block ahead of V, as the consumers use them (S_j is issued with P_{j+1} V_{j+1}):
      // K_j waits only for S_{j+2} to free its slot, not for the later P V product, so the next
      // K lands a whole block earlier (H200 bf16 against K_j and V_j issued together: d128 +2-4%
      // from 1k to 2k, +1% at 16k; d64 and d256 within 1% but d256 1k -2.6%; dev/results/
      // h200-2026-12-01-ab-sm90d-*.json). With one Q slot the first K goes before Q: in the
      // persistent loop the Q buffer frees only after this CTA's previous tile has issued its last
      // S. Its load is hidden behind that tile's last P V and epilogue: two Q slots (d64, masked
      // d128) or an L2 prefetch of the next Q moved the forward by -1..+2% at 512-16k (H200 bf16,
      // dev/results/h200-2026-12-02-ab-qslot-*.json; K first then). With two slots and no
      // cross-tile pipeline the Q goes first (kQFirst below). The loop is not unrolled: unrolled, the producer's 24
      // registers spilled with the tile feed.
      if constexpr (Traits::kSparse) {
        // The same order over the listed tiles; each K tile's entry carries kLastEntry when no
        // listed tile at or above n_lo follows (the next entry is read one tile ahead).
        const auto next_entry = [&](int32_t* e) {
          if (entry_ptr == entry_end) return false;
          *e = __ldg(entry_ptr++);
          return (*e & kTileIndexMask) >= w.n_lo;
        };
        int32_t next = 0;
        bool more = next_entry(&next);
        load_k(entry & kTileIndexMask, it, more ? entry : entry | kLastEntry);
        load_q();
#pragma unroll 1
        while (more) {
          const int32_t cur = next;
          more = next_entry(&next);
          load_k(cur & kTileIndexMask, it + 1, more ? cur : cur | kLastEntry);
          load_v(entry & kTileIndexMask, it);
          entry = cur;
          ++it;
        }
        load_v(entry & kTileIndexMask, it);
        ++it;
      } else {
        // With two Q slots and no cross-tile pipeline (the short-rows kernels of masked d64 and of
        // d128; unmasked d64's run the cross-tile pipeline and keep K first) the
        // slot this Q takes freed a whole tile ago: the Q goes first, not after the first K's wait
        // for its stage. H200 bf16, four passes in rotated order against K first, same processes
        // as cuDNN (dev/results/h200-2026-12-04-s34-qfirst-ab-365d30f.json): d128 512 +4.4% (4 of 4
        // passes), d64 causal 1k +1.6% (fwd_traits.h kQSlots: the traced Q wait).
        load_tile_blocks<kQ == 2 && !Traits::kCrossTile>(w, it, load_k, load_v, load_q);
      }
    }
    return;
  }

  ptx::warpgroup_reg_alloc<Traits::kConsumerRegs>();
  const int consumer = warpgroup - 1;
#if defined(FLASHATTN_DEV_FWD_TRACE)
  const bool trace_thread = threadIdx.x % 128 == 0;
  int trace_tiles = 0;
#endif
  const int g = lane / 4;
  const int t4 = lane % 4;
  // Traits::kPinSoftmax: one float per consumer warp after the barriers, stored, never read.
  [[maybe_unused]] const uint32_t pin_slot = ptx::smem_u32(bars + Traits::kBarriers) + 4 * (warp - 4);
  const int wg_row0 = consumer * 64;                      // this warpgroup's first row of the tile
  const int row_in_tile = wg_row0 + (warp % 4) * 16 + g;  // this thread's rows: +0 and +8
  // With modifiers the scores are already in log2 units after modify_scores.
  const float scale_log2 = Traits::kMods ? 1.0f : params.scale_log2;  // kBias has kMods
  // Descriptors: Q and K are K-major (their rows hold head-dim elements), V MN-major (the head
  // dim, P V's N = kHeadDimV, is contiguous; the leading offset steps one 64-column panel).
  const uint64_t q_desc = ptx::smem_desc(ptx::smem_u32(sQ + wg_row0 * Traits::kRowBytes), 16, 1024,
                                         ptx::SmemSwizzle::k128B);
  const uint64_t k_desc0 = ptx::smem_desc(ptx::smem_u32(sK), 16, 1024, ptx::SmemSwizzle::k128B);
  // kRowSumMma at d64 (one V panel): the leading offset steps from stage 0's V to the shared ones
  // panel, whose eight first columns are the product's N = 64..71; each later stage's offset is
  // that much shorter. kOnesPerStage: the panel stride, the ones after each stage's V panels.
  constexpr bool kSharedOnes = Traits::kRowSumMma && !Traits::kOnesPerStage;
  const uint64_t v_desc0 = ptx::smem_desc(ptx::smem_u32(sV), kSharedOnes ? uint32_t(sOnes - sV) : Traits::kPanelBytesKV,
                                          1024, ptx::SmemSwizzle::k128B);
  const auto k_desc = [&](int stage) { return ptx::desc_advance(k_desc0, stage * Traits::kTileBytesK); };
  const auto v_desc = [&](int stage) {
    const uint64_t d = ptx::desc_advance(v_desc0, stage * kVStage);
    return kSharedOnes ? d - (uint64_t(stage * (kVStage >> 4)) << 16) : d;
  };
  const Turns<Traits> turns{consumer};
  // kBias: this lane's ldmatrix row in the bias slots, whether the call has a bias, and whether
  // it has an attn_mask (packed into bits: mask_bits_scores).
  [[maybe_unused]] BiasLane bias_lane_ = {};
  // kMaskOnly: the launcher always packs the mask.
  [[maybe_unused]] bool has_bias = false, mask_packed = Traits::kMaskOnly;
  if constexpr (Traits::kBias) {
    has_bias = params.bias.defined();
    mask_packed = kp.mask_bits.words != nullptr;
    bias_lane_ = bias_lane(wg_row0 + (warp % 4) * 16, lane, params.bias.row == 0);
  }
  // kBias: the bias words of the key tile in `stage` (zeros without attn_bias), read while S runs.
  const auto read_bias = [&](uint32_t (&b)[kBlockN / 4], int stage) {
    if (has_bias) {
      bias_words<Traits>(b, ptx::smem_u32(sBias + stage * Traits::kTileBytesBias), bias_lane_);
    } else {
#pragma unroll
      for (int i = 0; i < kBlockN / 4; ++i) b[i] = 0u;
    }
  };
  // The last warpgroup hands the first turn to warpgroup 0.
  if (consumer == Traits::kConsumers - 1) turns.pass();

  int it = 0;      // K/V tiles consumed so far, across tiles (the producer's count)
  int q_pass = 0;  // Q tiles consumed so far
  const auto tile_mods = [&](const TileWork& w) {
    ScoreMods90 mods{};
    if constexpr (Traits::kMods) {
      mods.softcap = params.softcap > 0.0f;
      mods.scale_log2 = params.scale_log2;
      mods.softcap_in = mods.softcap ? params.scale / params.softcap : 0.0f;
      mods.softcap_out = mods.softcap ? params.softcap * kLog2e : 0.0f;
      mods.alibi_log2 =
          params.alibi != nullptr ? params.alibi[w.batch * params.alibi_batch_stride + w.head] * kLog2e : 0.0f;
    }
    return mods;
  };

  if constexpr (Traits::kCrossTile) {
    // The key blocks of all this CTA's tiles form one pipeline: a block's Q K^T product is issued
    // with the P V product of the block before it, also when that block ended the previous tile.
    // So the next tile's first scores and softmax run under the previous tile's last P V product,
    // and the previous tile's O (still in st.o) is stored after that. The Q buffers alternate
    // between tiles: the next Q lands while this one is still read. Every wait in the loop is
    // unconditional (a wait under a branch makes ptxas serialise the products).
    ConsumerState<Traits> st;
    st.row_max[0] = st.row_max[1] = -INFINITY;
    st.row_sum[0] = st.row_sum[1] = 0.0f;
    bool pending = false;    // st.p holds a block's P whose P V product is not issued yet
    uint32_t o_fresh = 1u;   // st.o holds no part of the pending block's tile: its P V overwrites it
    int pv_stage = 0;
    uint32_t pv_parity = 0;
    TileWork acc{};  // the tile the pending P belongs to (whose O st.o holds)
    float acc_max[2] = {-INFINITY, -INFINITY}, acc_sum[2] = {0.0f, 0.0f};
    // acc's epilogue with its own row statistics (st.row_max / row_sum may be the next tile's).
    const auto store_acc = [&] {
      const float mx[2] = {st.row_max[0], st.row_max[1]}, sm[2] = {st.row_sum[0], st.row_sum[1]};
      st.row_max[0] = acc_max[0], st.row_max[1] = acc_max[1];
      st.row_sum[0] = acc_sum[0], st.row_sum[1] = acc_sum[1];
      store_tile<Traits>(params, acc, st, row_in_tile, t4, scale_log2);
      st.row_max[0] = mx[0], st.row_max[1] = mx[1];
      st.row_sum[0] = sm[0], st.row_sum[1] = sm[1];
    };
    // The pending block's P V product on its own, then its tile's epilogue.
    const auto flush = [&] {
      ptx::mbarrier_wait(&ring.v_full[pv_stage], pv_parity);
      turns.take();
      gemm_pv<Traits>(st.o, st.p, v_desc(pv_stage), o_fresh ^ 1u);
      turns.pass();
      ptx::wgmma_wait<0>();
      ptx::fence_operand(st.o);
      release(&ring.v_empty[pv_stage], lane);
      store_tile<Traits>(params, acc, st, row_in_tile, t4, scale_log2);  // st's statistics are acc's
      pending = false;
    };
    for (int k = 0;; ++k) {
      const int tile = Traits::kDynamicTiles ? take_tile(feed, k, lane) : order.cta_tile(k, blockIdx.x, gridDim.x);
      if (tile >= order.tiles) break;
      const TileWork w = tile_work<Traits>(params, order, tile);
      if (!w.exists()) continue;
      if (!w.has_keys()) {  // no visible key (the producer loads nothing): O = 0, LSE = -inf
        if (pending) flush();
#pragma unroll
        for (int i = 0; i < ConsumerState<Traits>::kORegs; ++i) st.o[i] = 0.0f;
        st.row_max[0] = st.row_max[1] = -INFINITY;
        st.row_sum[0] = st.row_sum[1] = 0.0f;
        store_tile<Traits>(params, w, st, row_in_tile, t4, scale_log2);
        continue;
      }
      const WindowMask mask = make_window_mask<Traits::kMask == MaskMode::kWindow>(
          w.seqlen_q, w.seqlen_k, params.window_left, params.window_right);
      const ScoreMods90 mods = tile_mods(w);
      const int row_begin = w.m0 + wg_row0;
      const int row_end = min(w.m0 + w.rows_here, row_begin + 64);
      const int row = w.m0 + row_in_tile;
      const int slot = q_pass % 2;
      const uint64_t q_desc_slot = ptx::desc_advance(q_desc, slot * Traits::kTileBytesQ);
      // Scores of block n_block of this tile, with the modifiers and the mask; the K slot freed.
      const auto scores = [&](int n_block, int stage) {
        ptx::fence_operand(st.s);
        release(&ring.k_empty[stage], lane);
        // Every Q K^T product of this tile has completed: the producer may load a later Q here.
        if (n_block == w.n_lo) release(&ring.q_empty[slot], lane);
        if constexpr (Traits::kMods) modify_scores<Traits>(st.s, mods, mask, row, n_block * kBlockN + 2 * t4);
        if (block_needs_mask<Traits>(mask, w.seqlen_k, row_begin, row_end, n_block)) {
          apply_mask<Traits>(st.s, mask, row, n_block * kBlockN + 2 * t4);
        }
      };
      ptx::mbarrier_wait(&ring.q_full[slot], (q_pass / 2) & 1);
      int n_block = w.n_hi - 1;
      // The tile's first block, peeled (so the key-block loop below has no branch): its scores
      // start this tile's statistics, and its Q K^T goes with the previous tile's last P V.
      {
        const int stage = it % kStages;
        const uint32_t parity = (it / kStages) & 1;
        float correction[2];
        ptx::mbarrier_wait(&ring.k_full[stage], parity);
        if (!pending) {  // the pipeline is empty: the scores alone
          turns.take();
          gemm_qk<Traits>(st.s, q_desc_slot, k_desc(stage));
          turns.pass();
          ptx::wgmma_wait<0>();
          scores(n_block, stage);
          st.row_max[0] = st.row_max[1] = -INFINITY;
          st.row_sum[0] = st.row_sum[1] = 0.0f;
          softmax_block<Traits>(st, scale_log2, correction);
          convert_p(st);
        } else {
          ptx::mbarrier_wait(&ring.v_full[pv_stage], pv_parity);
          turns.take();
          gemm_qk<Traits>(st.s, q_desc_slot, k_desc(stage));
          gemm_pv<Traits>(st.o, st.p, v_desc(pv_stage), o_fresh ^ 1u);
          turns.pass();
          ptx::wgmma_wait<1>();  // S is done; the previous tile's last P V is still running
          scores(n_block, stage);
          acc_max[0] = st.row_max[0], acc_max[1] = st.row_max[1];
          acc_sum[0] = st.row_sum[0], acc_sum[1] = st.row_sum[1];
          st.row_max[0] = st.row_max[1] = -INFINITY;
          st.row_sum[0] = st.row_sum[1] = 0.0f;
          softmax_block<Traits>(st, scale_log2, correction);
          if constexpr (Traits::kPinSoftmax) {  // as in softmax_under_pv
            if (lane == 0) ptx::st_shared_f32(pin_slot, st.row_sum[0] + st.row_sum[1]);
          }
          ptx::wgmma_wait<0>();
          ptx::fence_operand(st.o);
          ptx::fence_operand(st.p);
          release(&ring.v_empty[pv_stage], lane);
          convert_p(st);
          store_acc();  // the previous tile's O is complete
        }
        pending = true;
        o_fresh = 1u;
        pv_stage = stage;
        pv_parity = parity;
        ++it;
        --n_block;
      }
      for (; n_block >= w.n_lo; --n_block) {
        const int stage = it % kStages;
        const uint32_t parity = (it / kStages) & 1;
        ptx::mbarrier_wait(&ring.k_full[stage], parity);
        ptx::mbarrier_wait(&ring.v_full[pv_stage], pv_parity);
        turns.take();
        gemm_qk<Traits>(st.s, q_desc_slot, k_desc(stage));
        gemm_pv<Traits>(st.o, st.p, v_desc(pv_stage), o_fresh ^ 1u);
        turns.pass();
        ptx::wgmma_wait<1>();  // S is done; P V is still running
        scores(n_block, stage);
        softmax_under_pv<Traits>(st, scale_log2, pin_slot, lane, &ring.v_empty[pv_stage]);
        o_fresh = 0u;
        pv_stage = stage;
        pv_parity = parity;
        ++it;
      }
      ++q_pass;
      acc = w;
    }
    if (pending) flush();
  } else {
  // The CTA's k-th tile and its work (coordinates, extent, key-block range; the feed's wait).
  // kTakeAhead: taken under the previous tile's last P V product rather than after its epilogue,
  // where nothing else of the warpgroup's runs. With the hardware's divisions this fetch took
  // ~1000 cycles per tile (dev/fwd_trace.py, s32) and moving it under the product alone changed
  // nothing measurable; with the divisors of TileOrder (fast_div.h) it adds +0.5-1.5% at the
  // masked d64 and d128 512-1k rows to theirs (dev/results/h200-2026-12-04-s32-fastdiv-ab-a207ccf.json).
  // Only the kernels measured so: carried across the tile, the next tile's work cost the bias,
  // modifier and mask kernels spills in their key-block loops (ptxas: bias d128 window 0 -> 232
  // bytes, modifiers d256 44 -> 256), so they take it at the top of the loop, as before.
  constexpr bool kTakeAhead = !Traits::kBias && !Traits::kMods && !Traits::kMaskOnly && !Traits::kSparse;
  struct NextTile {
    int tile;
    bool listed;  // kSparse: the tile's list has a key tile in range
    TileWork w;
  };
  const auto next_tile = [&](int k) {
    NextTile n{};
    if constexpr (Traits::kSparse) {
      n.tile = take_tile(feed, sparse, k, lane, &n.listed);
    } else {
      n.tile = Traits::kDynamicTiles ? take_tile(feed, k, lane) : order.cta_tile(k, blockIdx.x, gridDim.x);
    }
    if (n.tile < order.tiles) n.w = tile_work<Traits>(params, order, n.tile);
    return n;
  };
  NextTile cur{};
  if constexpr (kTakeAhead) cur = next_tile(0);
  for (int k = 0;; ++k) {
    if constexpr (!kTakeAhead) cur = next_tile(k);
    if (cur.tile >= order.tiles) break;
    [[maybe_unused]] const int tile = cur.tile;  // the trace's record
    [[maybe_unused]] const bool listed = cur.listed;
    const TileWork w = cur.w;
    bool ahead = false;  // kTakeAhead: cur already holds tile k + 1
    if (!w.exists()) {
      if constexpr (kTakeAhead) cur = next_tile(k + 1);
      continue;
    }
#if defined(FLASHATTN_DEV_FWD_TRACE)
    if (trace_thread && blockIdx.x < kFwdTraceCtas && k < kFwdTraceTiles) {
      g_fwd_trace_tile[blockIdx.x][consumer][k][0] = tile;
      g_fwd_trace_tile[blockIdx.x][consumer][k][1] = w.has_keys() ? w.n_hi - w.n_lo : 0;
    }
    trace_tiles = k + 1;
    FLASHATTN_FWD_TRACE(k, 0)
#endif
    const WindowMask mask = make_window_mask<Traits::kMask == MaskMode::kWindow>(
        w.seqlen_q, w.seqlen_k, params.window_left, params.window_right);
    const ScoreMods90 mods = tile_mods(w);

    ConsumerState<Traits> st;
#pragma unroll
    for (int i = 0; i < ConsumerState<Traits>::kORegs; ++i) st.o[i] = 0.0f;
    st.row_max[0] = st.row_max[1] = -INFINITY;
    st.row_sum[0] = st.row_sum[1] = 0.0f;

    if (Traits::kSparse ? listed : w.has_keys()) {
      const int row_begin = w.m0 + wg_row0;
      const int row_end = min(w.m0 + w.rows_here, row_begin + 64);
      const auto needs_mask = [&](int n_block) {
        return block_needs_mask<Traits>(mask, w.seqlen_k, row_begin, row_end, n_block);
      };
      const int row = w.m0 + row_in_tile;
      // kMaskBits, attn_mask packed into bits: the index of word t4 of row g's (h = 0) and row g + 8's
      // (h = 1) first group (rows past the sequence read its last row: their scores are never
      // stored). 32-bit (the launcher checks the words fit): a 64-bit pointer held across the
      // tile spilled a register of the key-block loop.
      [[maybe_unused]] uint32_t bits_at[2] = {0u, 0u};
      if constexpr (Traits::kMaskBits) {
        if (mask_packed) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            bits_at[h] = uint32_t(mask_bits_row_word(kp.mask_bits, w.batch, w.head, min(row + 8 * h, w.seqlen_q - 1), t4));
          }
        }
      }
      // The two words of key block n (rows g, g + 8), loaded while S runs, as the bias words.
      [[maybe_unused]] const auto read_mask_bits = [&](uint32_t (&mask_w)[2], int n) {
        if (mask_packed) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {  // key block n's group, and its half of it at 64 keys
            const uint32_t word = __ldg(kp.mask_bits.words +
                                        (bits_at[h] + uint32_t(mask_bits_block_group(n, kBlockN) * kMaskBitsGroupWords)));
            mask_w[h] = mask_bits_block_word(word, n, kBlockN);
          }
        }
      };
      // Key block n's scores once S is done: the bias or the score modifiers, the stage's
      // release (with a bias, once its words are in the scores), the causal / window mask, then
      // attn_mask (kMaskBits) and the block mask's element mask (kSparse, by the tile's kind).
      [[maybe_unused]] const auto finish_scores = [&](int n, int k_stage, int tile_kind, uint32_t (&bias_w)[kBlockN / 4],
                                                      const uint32_t (&mask_w)[2]) {
        if constexpr (Traits::kBias) {
          bias_scores<Traits>(st.s, mods, mask, row, n * kBlockN + 2 * t4, bias_w, has_bias);
          release(&ring.k_empty[k_stage], lane);
        } else {
          release(&ring.k_empty[k_stage], lane);
          if constexpr (Traits::kMods) modify_scores<Traits>(st.s, mods, mask, row, n * kBlockN + 2 * t4);
        }
        if (needs_mask(n)) apply_mask<Traits>(st.s, mask, row, n * kBlockN + 2 * t4);
        if constexpr (Traits::kMaskBits) {
          if (mask_packed) mask_bits_scores<Traits>(st.s, mask_w);
        }
        if constexpr (Traits::kSparse) {
          if (tile_kind != kTileClean) {
            hide_blocked_scores<kBlockN>(st.s, params, tile_kind, w.batch, w.head, row, n * kBlockN + 2 * t4, w.seqlen_q, w.seqlen_k);
          }
        }
      };
      // Q's slot (Traits::kQSlots).
      const int q_slot = q_pass % Traits::kQSlots;
      const uint64_t q_desc_slot = ptx::desc_advance(q_desc, q_slot * Traits::kTileBytesQ);
      ptx::mbarrier_wait(&ring.q_full[q_slot], (q_pass / Traits::kQSlots) & 1);
      FLASHATTN_FWD_TRACE(k, 1)

      // The first (last-keyed) block: S, softmax, no P V yet.
      int stage = it % kStages;
      uint32_t parity = (it / kStages) & 1;
      ptx::mbarrier_wait(&ring.k_full[stage], parity);
      int n_first = w.n_hi - 1;
      [[maybe_unused]] int kind = kTileClean;
      [[maybe_unused]] bool last = false;
      turns.take();
      gemm_qk<Traits>(st.s, q_desc_slot, k_desc(stage));
      turns.pass();
      // kSparse: the tile, its kind and whether it is the last, from the producer's entry (read
      // while S runs; the stage is freed only below).
      if constexpr (Traits::kSparse) {
        const int e = sparse_entry(sparse, stage, lane);
        n_first = e & kTileIndexMask;
        kind = (e & ~kLastEntry) >> kTileKindShift;
        last = (e & kLastEntry) != 0;
      }
      [[maybe_unused]] uint32_t bias_w[kBlockN / 4];
      [[maybe_unused]] uint32_t mask_w[2];
      if constexpr (Traits::kBias) read_bias(bias_w, stage);
      if constexpr (Traits::kMaskBits) read_mask_bits(mask_w, n_first);
      ptx::wgmma_wait<0>();
      ptx::fence_operand(st.s);
      FLASHATTN_FWD_TRACE(k, 2)
      finish_scores(n_first, stage, kind, bias_w, mask_w);
      {
        float correction[2];
        softmax_block<Traits>(st, scale_log2, correction);  // O is still 0: nothing to rescale
      }
      convert_p(st);
      FLASHATTN_FWD_TRACE(k, 3)
#if defined(FLASHATTN_DEV_FWD_TRACE)
      int trace_block = 0;
#endif

      for (int n_block = w.n_hi - 2; Traits::kSparse ? !last : n_block >= w.n_lo; --n_block) {
        const int prev_stage = stage;
        const uint32_t prev_parity = parity;
        ++it;
        stage = it % kStages;
        parity = (it / kStages) & 1;
        // The packed mask's words first: they wait for no barrier, and issued after the products
        // (as the bias words are) ptxas placed them after the wait for S (SASS), exposing their
        // latency; from here they are in flight while the products are issued and run.
        [[maybe_unused]] uint32_t mask_w[2];
        if constexpr (Traits::kMaskBits) read_mask_bits(mask_w, n_block);
        ptx::mbarrier_wait(&ring.k_full[stage], parity);
        ptx::mbarrier_wait(&ring.v_full[prev_stage], prev_parity);
        turns.take();
        gemm_qk<Traits>(st.s, q_desc_slot, k_desc(stage));
        gemm_pv<Traits>(st.o, st.p, v_desc(prev_stage));
        turns.pass();
        if constexpr (Traits::kSparse) {  // as for the first block, while the products run
          const int e = sparse_entry(sparse, stage, lane);
          n_block = e & kTileIndexMask;
          kind = (e & ~kLastEntry) >> kTileKindShift;
          last = (e & kLastEntry) != 0;
        }
        [[maybe_unused]] uint32_t bias_w[kBlockN / 4];
        if constexpr (Traits::kBias) read_bias(bias_w, stage);
        ptx::wgmma_wait<1>();  // S_j is done; P V is still running
        ptx::fence_operand(st.s);
#if defined(FLASHATTN_DEV_FWD_TRACE)
        ++trace_block;
        if (trace_block <= kFwdTraceBlocks) FLASHATTN_FWD_TRACE(k, 2 + 2 * trace_block)
#endif
        finish_scores(n_block, stage, kind, bias_w, mask_w);
        softmax_under_pv<Traits>(st, scale_log2, pin_slot, lane, &ring.v_empty[prev_stage]);
#if defined(FLASHATTN_DEV_FWD_TRACE)
        if (trace_block <= kFwdTraceBlocks) FLASHATTN_FWD_TRACE(k, 3 + 2 * trace_block)
#endif
      }
      // Every Q K^T product of this tile has completed: the producer may load a later Q here.
      release(&ring.q_empty[q_slot], lane);
      ++q_pass;
      ptx::mbarrier_wait(&ring.v_full[stage], parity);
      turns.take();
      gemm_pv<Traits>(st.o, st.p, v_desc(stage));
      turns.pass();
      if constexpr (kTakeAhead) {
        cur = next_tile(k + 1);
        ahead = true;
      }
      ptx::wgmma_wait<0>();
      ptx::fence_operand(st.o);
      release(&ring.v_empty[stage], lane);
      ++it;
      FLASHATTN_FWD_TRACE(k, kFwdTraceStamps - 2)
    }
    store_tile<Traits>(params, w, st, row_in_tile, t4, scale_log2);
    FLASHATTN_FWD_TRACE(k, kFwdTraceStamps - 1)
    if (kTakeAhead && !ahead) cur = next_tile(k + 1);
  }
#if defined(FLASHATTN_DEV_FWD_TRACE)
  if (trace_thread && blockIdx.x < kFwdTraceCtas) {
    unsigned smid;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    g_fwd_trace_cta[blockIdx.x][consumer][0] = int(smid);
    g_fwd_trace_cta[blockIdx.x][consumer][1] = trace_tiles;
  }
#endif
  }
  // Warpgroup 0 takes the turn the last one passed at the end, so no arrival is left over.
  if (consumer == 0) turns.take();
}

#undef FLASHATTN_FWD_TRACE

}  // namespace flashattn::cuda::sm90
